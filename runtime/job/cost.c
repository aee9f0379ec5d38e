/* cost.c - see cost.h. */
#include "runtime/job/cost.h"

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int dt_cost_blocks(const dt_cost_model *m)
{
    switch (m->family) {
    case DT_COST_GPT:
    case DT_COST_BERT:
    case DT_COST_LLAMA:
        return m->n_layer > 0 ? m->n_layer : 0;
    case DT_COST_MLP:
        return m->n_hidden > 0 ? m->n_hidden + 1 : 0;
    case DT_COST_RESNET:
        if (m->imagenet) {
            static const int tv[][2] = {{18, 8}, {26, 8}, {34, 16}, {50, 16}, {101, 33},
                                        {152, 50}};
            for (size_t i = 0; i < sizeof tv / sizeof tv[0]; i++)
                if (tv[i][0] == m->depth)
                    return tv[i][1];
            return 0;
        }
        return m->depth >= 8 && (m->depth - 2) % 6 == 0 ? (m->depth - 2) / 2 : 0;
    case DT_COST_OTHER:
        break;
    }
    return 0;
}

const char *dt_cost_blocks_what(const dt_cost_model *m)
{
    return m->family == DT_COST_GPT     ? "transformer blocks (model.n_layer)"
           : m->family == DT_COST_BERT  ? "encoder layers (model.n_layer)"
           : m->family == DT_COST_LLAMA ? "decoder layers (model.n_layer)"
           : m->family == DT_COST_RESNET ? "residual blocks (model.depth, model.preset)"
                                        : "Linear layers (model.hidden's widths + 1)";
}

int dt_cost_block_flops(const dt_cost_model *m, double *block, double *first, double *last)
{
    *block = 1;
    *first = *last = 0;
    const bool llama = m->family == DT_COST_LLAMA;
    if ((m->family != DT_COST_GPT && m->family != DT_COST_BERT && !llama) || m->n_embd <= 0)
        return 0; /* mlp: its widths come from the data; every Linear layer counts alike */
    const double C = m->n_embd, T = m->seq_len, V = m->vocab_size;
    const double kv = llama && m->n_head > 0 && m->n_kv_head > 0
                          ? (double)m->n_kv_head / m->n_head
                          : 1;
    *block = llama ? 2 * (C * C * (2 + 2 * kv) + 3 * C * m->intermediate_size) + 4 * T * C
                   : 24 * C * C + 4 * T * C;
    *first = 0;         /* the embedding: a look-up */
    *last = 2 * C * V;  /* ln_f is O(C); the head's (C,V) GEMM */
    if (m->family == DT_COST_BERT) /* the transform and the decoder (4 specials) */
        *last = 2 * C * C + 2 * C * (V + 4);
    return 1;
}

/* Two dynamic programmes over (stage s, first block i) for the stages s..P-1 holding blocks
 * i..L-1: MAXC their best maximum, then SQ their least sum of squares within the overall best
 * maximum. (A head that weighs 28 blocks so leaves the last stage one block and spreads the rest,
 * rather than piling them on stage 0.) */
int dt_cost_balance(int L, int P, double b, double first, double last, int *blocks)
{
    const size_t w = (size_t)L + 1;
    double *maxc = malloc(sizeof(double) * (size_t)(P + 1) * w);
    double *sq = malloc(sizeof(double) * (size_t)(P + 1) * w);
    if (!maxc || !sq) {
        free(maxc);
        free(sq);
        return -ENOMEM;
    }
#define MAXC(s, i) maxc[(size_t)(s) * w + (size_t)(i)]
#define SQ(s, i) sq[(size_t)(s) * w + (size_t)(i)]
#define COST(s, n) ((n) * b + ((s) == 0 ? first : 0) + ((s) == P - 1 ? last : 0))
#define MOST(s, i) (L - (i) - (P - 1 - (s))) /* blocks stage s may take from i */
    for (int i = 0; i <= L; i++)
        MAXC(P, i) = SQ(P, i) = i == L ? 0 : HUGE_VAL;
    for (int s = P - 1; s >= 0; s--)
        for (int i = 0; i <= L; i++) {
            double v = HUGE_VAL;
            for (int n = 1; n <= MOST(s, i); n++)
                v = fmin(v, fmax(COST(s, n), MAXC(s + 1, i + n)));
            MAXC(s, i) = v;
        }
    const double opt = MAXC(0, 0) * (1 + 1e-12); /* rounding: sums of the same terms */
    for (int s = P - 1; s >= 0; s--)
        for (int i = 0; i <= L; i++) {
            double v = HUGE_VAL;
            for (int n = 1; n <= MOST(s, i) && COST(s, n) <= opt; n++)
                v = fmin(v, COST(s, n) * COST(s, n) + SQ(s + 1, i + n));
            SQ(s, i) = v;
        }
    for (int s = 0, i = 0; s < P; s++) {
        const double target = SQ(s, i) * (1 + 1e-12);
        int n = MOST(s, i);
        while (n > 1 && (COST(s, n) > opt || COST(s, n) * COST(s, n) + SQ(s + 1, i + n) > target))
            n--;
        blocks[s] = n;
        i += n;
    }
#undef MOST
#undef COST
#undef SQ
#undef MAXC
    free(maxc);
    free(sq);
    return 0;
}

int dt_cost_stage_blocks(const dt_cost_model *m, int P, const int *given, int n_given,
                         int *blocks, dt_err *err)
{
    int total = dt_cost_blocks(m);
    if (P > 1 && total == 0)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d: pipeline parallelism is not supported for "
                          "this model (%s); use parallel.pipeline = 1",
                          P, m->name ? m->name : "");
    if (total > 0 && P > total)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d is more than the model's %d %s: every stage "
                          "needs a block; use at most %d",
                          P, total, dt_cost_blocks_what(m), total);
    if (n_given > 0) {
        int sum = 0;
        for (int i = 0; i < n_given; i++)
            sum += given[i];
        if (n_given != P || (total > 0 && sum != total))
            return dt_err_set(err, -EINVAL,
                              "parallel.stages: %d stages of %d blocks in all, but "
                              "parallel.pipeline = %d and the model has %d",
                              n_given, sum, P, total);
        memcpy(blocks, given, sizeof blocks[0] * (size_t)P);
        return P;
    }
    double b, first, last;
    dt_cost_block_flops(m, &b, &first, &last);
    if (total < 1) { /* no blocks (a model not configured): nothing to balance */
        for (int i = 0; i < P; i++)
            blocks[i] = 0;
        return P;
    }
    if (dt_cost_balance(total, P, b, first, last, blocks))
        return dt_err_set(err, -ENOMEM, "out of memory balancing %d blocks over %d stages",
                          total, P);
    return P;
}
