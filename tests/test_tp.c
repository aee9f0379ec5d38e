/* test_tp.c - gpt's tensor parallelism (runtime/train/models/gpt.c, model.h's tp_* fields) on
 * the CPU backend.
 *
 * - dt_tensor_tp_copy and dt_tensor_whole_numel on hand-built tables: a replicated tensor, rows
 *   split in 1 and 3 parts (c_fc, c_attn's q|k|v), columns (c_proj), and a padded vocabulary:
 *   every rank's slice holds exactly the elements the contract names, a round trip over all
 *   ranks rebuilds the whole tensor, padding is zeroed on slicing and never written on gathering.
 * - TP = 2 and 4 against TP = 1, on a gpt whose vocabulary (65) needs padding at both: TP forked
 *   ranks with a "cpu" communicator among them (store server on an ephemeral port) each build
 *   the model with tp_size = TP; the parent builds TP = 1. Gathered with dt_tensor_tp_copy, the
 *   initial parameters are bit-identical to TP = 1; the forward loss is within 1e-5 relative;
 *   every gradient (gathered whole) is within 1e-5 of TP = 1's, relative to the tensor's largest
 *   magnitude; the replicated tensors' parameters and gradients are bit-identical on every rank
 *   (they are not all-reduced: gpt.c's header says why); the padding rows of wte stay zero; all
 *   that for recompute none, block and selective; then three SGD steps on both, losses and
 *   final parameters compared again; and on every rank, a model under a block hook that
 *   NaN-poisons each block's parameters and gradients outside its windows trains bit-identically
 *   to one without (the windows cover every use under tensor parallelism, for ZeRO-3).
 * - llama (8 query heads on 4 key/value heads, SwiGLU, untied head): the same comparison at
 *   TP = 2 (recompute none, block, selective) and TP = 4 (none, selective), and with sequence
 *   parallelism at TP = 2 (none, block) and TP = 4 (selective), its activation saving exact.
 * - Sequence parallelism (cfg.sequence_parallel): the same comparison at TP = 2 (recompute none,
 *   block, selective) and TP = 4 (none, block): loss and every gathered gradient within 1e-5 of
 *   TP = 1, the replicated tensors' gradients (the LayerNorms', all-reduced inside backward)
 *   the same bits on every rank; in every mode a second backward accumulated on the first
 *   doubles the gradients (the LayerNorms' all-reduce sums that pass only); rank 0's activation
 *   bytes beside the same rank without it equal the expected saving (sp_expected_saving). The
 *   dtrain binary with parallel.sequence_parallel at T = 2 and at P = 2 x T = 2 (the strategies
 *   pass the flag; the stages exchange the shards) gives the same losses and gradient norms as
 *   without, with less activation memory; the job file refuses it without T > 1 or with a
 *   sequence T does not divide.
 * - The tensor table under TP: same names and order as TP = 1, whole_shape = TP = 1's shape,
 *   local shapes the documented slices, the same blocks; activations and FLOPs shrink.
 * - bert_*: the same for bert (bert.c: q, k, v and intermediate column-parallel, the dense layers
 *   after them row-parallel, word embeddings and decoder bias vocabulary-parallel with padding),
 *   with the NSP head, padding and token types, under TP = 2 and 4 and sequence parallelism.
 * - Bad configurations: tp_size > 1 on an mlp, n_head not divisible, no communicator, a
 *   communicator of the wrong size, tp_rank out of range.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm.h"
#include "runtime/train/models/model.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* A command line: the fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt_cmd dt_test_fmt

/* ------------------------------------------------------------------------------------------ */
/* dt_tensor_tp_copy on hand-built tensors */

static dt_tensor_info tensor2(int64_t w0, int64_t w1, int tp, int dim, int parts, int64_t pad_to)
{
    dt_tensor_info t;
    memset(&t, 0, sizeof t);
    strcpy(t.name, "t");
    t.ndim = w1 > 0 ? 2 : 1;
    t.whole_shape[0] = w0;
    t.whole_shape[1] = w1;
    t.shape[0] = w0;
    t.shape[1] = w1;
    t.tp_dim = dim;
    t.tp_parts = parts;
    if (parts > 0)
        t.shape[dim] = (pad_to > 0 ? pad_to : t.whole_shape[dim]) / tp;
    t.numel = (size_t)t.shape[0] * (size_t)(t.ndim == 2 ? t.shape[1] : 1);
    return t;
}

/* Slices whole (w0,w1) for every rank, checks each element of each slice against the rule of
 * model.h, gathers them back into a NaN-filled buffer and checks it equals whole. */
static void check_round_trip(const dt_tensor_info *t, int tp)
{
    const int64_t w0 = t->whole_shape[0], w1 = t->ndim == 2 ? t->whole_shape[1] : 1;
    const size_t wn = dt_tensor_whole_numel(t);
    DT_CHECK_INT(wn, (size_t)(w0 * w1));
    float *whole = malloc(wn * sizeof(float)), *back = malloc(wn * sizeof(float));
    float *local = malloc((t->numel + 1) * sizeof(float));
    DT_REQUIRE(whole && back && local);
    for (size_t i = 0; i < wn; i++) {
        whole[i] = (float)(i + 1);
        back[i] = NAN;
    }
    const int d = t->tp_dim;
    const int64_t parts = t->tp_parts > 0 ? t->tp_parts : 1;
    const int64_t chunk = t->tp_parts > 0 ? t->shape[d] / parts : t->shape[d];
    const int64_t part = t->whole_shape[d] / parts;
    const int64_t l1 = t->ndim == 2 ? t->shape[1] : 1;
    for (int r = 0; r < (t->tp_parts > 0 ? tp : 1); r++) {
        local[t->numel] = -7.0f; /* guard */
        for (size_t i = 0; i < t->numel; i++)
            local[i] = -1.0f;
        dt_tensor_tp_copy(t, r, whole, local, false);
        DT_CHECK(local[t->numel] == -7.0f);
        for (int64_t i = 0; i < t->shape[0]; i++)
            for (int64_t j = 0; j < l1; j++) {
                /* the whole index along d of local index (i or j) */
                int64_t li = d == 0 ? i : j;
                int64_t p = li / chunk, k = li % chunk;
                int64_t wi = t->tp_parts > 0 ? p * part + r * chunk + k : li;
                bool pad = t->tp_parts > 0 && r * chunk + k >= part;
                float want = pad ? 0.0f
                                 : whole[(d == 0 ? wi * w1 + j : i * w1 + wi)];
                float got = local[i * l1 + j];
                DT_CHECK_MSG(got == want, "rank %d local (%lld,%lld): %g, want %g", r,
                             (long long)i, (long long)j, got, want);
            }
        dt_tensor_tp_copy(t, r, back, local, true);
    }
    for (size_t i = 0; i < wn; i++)
        DT_CHECK_MSG(back[i] == whole[i], "whole element %zu: %g after the round trip, want %g", i,
                     back[i], whole[i]);
    free(whole);
    free(back);
    free(local);
}

static void test_tp_copy(void)
{
    /* replicated: a plain copy */
    dt_tensor_info rep = tensor2(5, 3, 2, 0, 0, 0);
    DT_CHECK_INT(rep.numel, 15);
    check_round_trip(&rep, 2);
    for (int tp = 2; tp <= 4; tp += 2) {
        dt_tensor_info rows = tensor2(8, 3, tp, 0, 1, 0); /* c_fc (4C,C) */
        check_round_trip(&rows, tp);
        dt_tensor_info qkv = tensor2(12, 2, tp, 0, 3, 0); /* c_attn (3C,C), C = 4 */
        DT_CHECK_INT(qkv.shape[0], 12 / tp);
        check_round_trip(&qkv, tp);
        dt_tensor_info qkvb = tensor2(12, 0, tp, 0, 3, 0); /* c_attn.bias (3C) */
        check_round_trip(&qkvb, tp);
        dt_tensor_info cols = tensor2(3, 8, tp, 1, 1, 0); /* c_proj (C,4C) */
        check_round_trip(&cols, tp);
        dt_tensor_info vocab = tensor2(5, 3, tp, 0, 1, tp == 2 ? 6 : 8); /* wte, V = 5 */
        DT_CHECK_INT(dt_tensor_whole_numel(&vocab), 15);
        check_round_trip(&vocab, tp);
    }
    /* c_attn at TP = 2 by hand: C = 2, rank 1 holds whole rows 1, 3, 5 (q, k, v of head 1) */
    dt_tensor_info q = tensor2(6, 0, 2, 0, 3, 0);
    float whole[6] = {10, 11, 12, 13, 14, 15}, local[3] = {0};
    dt_tensor_tp_copy(&q, 1, whole, local, false);
    DT_CHECK(local[0] == 11 && local[1] == 13 && local[2] == 15);
    /* padding at TP = 4, V = 5 padded to 8: rank 2 holds row 4 and a padding row, rank 3 only
     * padding; gathering rank 3 leaves whole untouched */
    dt_tensor_info v = tensor2(5, 0, 4, 0, 1, 8);
    float w5[5] = {1, 2, 3, 4, 5}, l2[2] = {9, 9}, l3[2] = {9, 9};
    dt_tensor_tp_copy(&v, 2, w5, l2, false);
    dt_tensor_tp_copy(&v, 3, w5, l3, false);
    DT_CHECK(l2[0] == 5 && l2[1] == 0 && l3[0] == 0 && l3[1] == 0);
    l3[0] = l3[1] = 42;
    dt_tensor_tp_copy(&v, 3, w5, l3, true);
    DT_CHECK(w5[0] == 1 && w5[1] == 2 && w5[2] == 3 && w5[3] == 4 && w5[4] == 5);
}

/* ------------------------------------------------------------------------------------------ */
/* TP ranks against one process */

#define STEPS 3
/* SGD's rate: gpt's c_proj scaling keeps 0.5 stable; llama (no such scaling) takes 0.05 */
#define LR (is_llama() ? 0.05f : 0.5f)

/* The model under test: "gpt", or "bert" (with its NSP head; fixtures' bert batches have
 * padding, token types and masked-LM targets). Set by the test before anything forks. */
static const char *tp_model = "gpt";
static bool is_bert(void) { return !strcmp(tp_model, "bert"); }
/* "llama": 8 query heads on 4 key/value heads (T = 2 and 4 divide both), SwiGLU width 96 */
static bool is_llama(void) { return !strcmp(tp_model, "llama"); }

static dt_model_config tp_cfg(int tp, int rank, dt_recompute rc, bool sp)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = is_bert() ? DT_ARCH_BERT : is_llama() ? DT_ARCH_LLAMA : DT_ARCH_GPT;
    c.nsp = is_bert();
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 16;
    c.shape.vocab_size = 65; /* padded to 66 at TP = 2, 68 at TP = 4 */
    c.max_batch = 4;
    c.seed = 1234;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.block_size = 16;
    c.recompute = rc;
    c.tp_size = tp;
    c.tp_rank = rank;
    c.sequence_parallel = sp;
    if (is_llama()) {
        c.n_head = 8;
        c.n_kv_head = 4;
        c.ffn_hidden = 96;
        c.rope_theta = 10000.0f;
        c.norm_eps = 1e-5f;
    }
    return c;
}

/* What rank 0 (and the parent, for TP = 1) reports, in a MAP_SHARED page run. */
typedef struct tp_result {
    float loss0, eval_loss0;   /* first training forward; an evaluation forward before it */
    float loss[STEPS];         /* training forwards after 1..STEPS SGD steps */
    size_t n;                  /* whole parameters */
    int ok;                    /* the rank finished */
    double act_bytes, flops;
    double act_bytes_nosp;     /* sequence parallelism: the same rank's model without it */
    double accum_err;          /* a second backward accumulated on the first: its gradients
                                * against twice the first's (max error / max magnitude) */
    /* then params0 (n), grads0 (n), params_final (n) */
} tp_result;

static float *res_params0(tp_result *r) { return (float *)(r + 1); }
static float *res_grads0(tp_result *r) { return res_params0(r) + r->n; }
static float *res_final(tp_result *r) { return res_grads0(r) + r->n; }

static tp_result *res_map(size_t n)
{
    tp_result *r = dt_test_shared_map(sizeof(tp_result) + 3 * n * sizeof(float));
    r->n = n;
    return r;
}

static void res_unmap(tp_result *r)
{
    dt_test_shared_unmap(r, sizeof(tp_result) + 3 * r->n * sizeof(float));
}

/* Gathers m's buffer src (params or grads) whole into out (TP = 1's layout), through comm's
 * all-gather and dt_tensor_tp_copy; checks that every replicated tensor is the same bits on
 * every rank and that wte's padding rows are zero. Collective. */
static int gather_whole(dt_model *m, dt_comm *comm, const float *src, float *out,
                        const char *what)
{
    const int tp = m->cfg.tp_size, rank = m->cfg.tp_rank;
    dt_err err = {0};
    size_t woff = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        dt_tensor_info *t = &m->tensors[i];
        float *all = malloc((size_t)tp * t->numel * sizeof(float));
        if (!all)
            return -ENOMEM;
        if (dt_comm_allgather(comm, src + t->offset, all, t->numel, DT_FLOAT32, NULL, &err)) {
            dt_test_rank_fail(__FILE__, __LINE__, "all-gather", "%s: %s", t->name, err.msg);
            free(all);
            return -EIO;
        }
        for (int r = 0; r < tp; r++) {
            const float *lr = all + (size_t)r * t->numel;
            if (t->tp_parts == 0)
                RCHECK(!memcmp(lr, all, t->numel * sizeof(float)),
                       "%s of replicated %s: rank %d differs from rank 0 (rank %d)", what,
                       t->name, r, rank);
            else if (t->tp_dim == 0 && t->shape[0] * tp > t->whole_shape[0])
                /* the vocabulary (gpt's wte; bert's word embeddings and decoder bias): rows
                 * past V on rank r are padding */
                for (int64_t row = 0; row < t->shape[0]; row++)
                    if (r * t->shape[0] + row >= t->whole_shape[0])
                        for (int64_t c = 0; c < (t->ndim == 2 ? t->shape[1] : 1); c++)
                            RCHECK(lr[row * (t->ndim == 2 ? t->shape[1] : 1) + c] == 0.0f,
                                   "%s: %s padding row %lld of rank %d is %g", what, t->name,
                                   (long long)row, r,
                                   lr[row * (t->ndim == 2 ? t->shape[1] : 1) + c]);
            dt_tensor_tp_copy(t, r, out + woff, (float *)lr, true);
        }
        woff += dt_tensor_whole_numel(t);
        free(all);
    }
    return 0;
}

typedef struct tp_job {
    int tp, port;
    dt_recompute rc;
    bool sp;
    char run_id[64];
    tp_result *res;
} tp_job;

/* Trains one model (TP ranks or TP = 1) on the fixed batch: initial gather, one forward and
 * backward, STEPS SGD steps. comm NULL for TP = 1. */
static void train_and_report(dt_model *m, dt_comm *comm, tp_result *res, bool report)
{
    dt_backend *be = m->be;
    dt_err err = {0};
    dt_model_config c = m->cfg;
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, c.max_batch, 77);
    const size_t n = res->n;
    float *host = malloc(m->num_params * sizeof(float));
    float *whole = malloc(n * sizeof(float)), *once = malloc(n * sizeof(float));
    RCHECK(host && whole && once, "out of memory");
    if (!host || !whole || !once)
        goto out;
#define GATHER(buf, dst, what)                                                                     \
    do {                                                                                           \
        be->memcpy_d2h(be, host, (buf), m->num_params * sizeof(float));                           \
        if (comm) {                                                                                \
            if (gather_whole(m, comm, host, whole, what))                                          \
                goto out;                                                                          \
        } else {                                                                                   \
            memcpy(whole, host, n * sizeof(float));                                                \
        }                                                                                          \
        if (report)                                                                                \
            memcpy((dst), whole, n * sizeof(float));                                               \
    } while (0)

    GATHER(m->params, res_params0(res), "initial parameters");
    float loss = 0;
    RCHECK(m->ops->forward(m, &hb.b, false, &loss, &err) == 0, "eval forward: %s", err.msg);
    if (report)
        res->eval_loss0 = loss;
    be->memset_zero(be, m->grads, m->num_params * sizeof(float));
    RCHECK(m->ops->forward(m, &hb.b, true, &loss, &err) == 0, "forward: %s", err.msg);
    RCHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == 0, "backward: %s", err.msg);
    if (report)
        res->loss0 = loss;
    GATHER(m->grads, res_grads0(res), "gradients");
    {
        /* a second backward of the same batch accumulates onto the first: the gradients must
         * double (under sequence parallelism the LayerNorms' all-reduce must sum this pass
         * only, not what the buffer held) */
        memcpy(once, whole, n * sizeof(float));
        RCHECK(m->ops->forward(m, &hb.b, true, &loss, &err) == 0, "forward: %s", err.msg);
        RCHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == 0, "backward: %s", err.msg);
        be->memcpy_d2h(be, host, m->grads, m->num_params * sizeof(float)); /* whole: the sum */
        if (comm && gather_whole(m, comm, host, whole, "accumulated gradients"))
            goto out;
        if (!comm)
            memcpy(whole, host, n * sizeof(float));
        double num = 0, den = 1e-30;
        for (size_t i = 0; i < n; i++) {
            num = DT_MAX(num, fabs((double)whole[i] - 2.0 * (double)once[i]));
            den = DT_MAX(den, fabs(2.0 * (double)once[i]));
        }
        if (report)
            res->accum_err = num / den;
    }
    for (int s = 0; s < STEPS; s++) {
        be->sgd_update(be, m->params, m->grads, NULL, m->num_params, LR, 0.0f, false, 0.0f,
                       true);
        be->memset_zero(be, m->grads, m->num_params * sizeof(float));
        RCHECK(m->ops->forward(m, &hb.b, true, &loss, &err) == 0, "forward: %s", err.msg);
        RCHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == 0, "backward: %s", err.msg);
        if (report)
            res->loss[s] = loss;
    }
    GATHER(m->params, res_final(res), "trained parameters");
#undef GATHER
    if (report) {
        res->act_bytes = (double)dt_model_activation_bytes(m);
        res->flops = m->flops_per_sample;
        res->ok = 1;
    }
out:
    free(host);
    free(whole);
    free(once);
    dt_test_batch_free(&hb);
}

/* m's table (tensor parallel, rank tp_rank) against TP = 1's: same names, order and blocks,
 * whole_shape = TP = 1's shape, local shapes the slices gpt.c's header names. */
static void check_table(const dt_model *m)
{
    const int tp = m->cfg.tp_size;
    dt_model_config c1 = m->cfg;
    c1.tp_size = c1.tp_rank = 0;
    c1.sequence_parallel = false;
    dt_model *m1 = NULL;
    dt_err err = {0};
    if (dt_model_create(&m1, &c1, m->be, NULL, &err)) {
        dt_test_rank_fail(__FILE__, __LINE__, "TP = 1 model", "%s", err.msg);
        return;
    }
    RCHECK(m->num_tensors == m1->num_tensors, "%d tensors, TP = 1 has %d", m->num_tensors,
           m1->num_tensors);
    for (int i = 0; i < m->num_tensors && i < m1->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i], *w = &m1->tensors[i];
        RCHECK(!strcmp(t->name, w->name), "tensor %d: %s, TP = 1 has %s", i, t->name, w->name);
        RCHECK(t->ndim == w->ndim, "%s: %d dims", t->name, t->ndim);
        for (int d = 0; d < t->ndim; d++)
            RCHECK(t->whole_shape[d] == w->shape[d], "%s: whole_shape[%d] = %lld, want %lld",
                   t->name, d, (long long)t->whole_shape[d], (long long)w->shape[d]);
        RCHECK(dt_tensor_whole_numel(t) == w->numel, "%s: whole numel", t->name);
        bool qkv = strstr(t->name, "c_attn") != NULL, fc = strstr(t->name, "c_fc") != NULL;
        bool projw = strstr(t->name, "c_proj.weight") != NULL;
        bool wte = !strcmp(t->name, "wte.weight");
        if (is_bert()) { /* bert.c's header: q, k, v and intermediate by rows, the two dense
                          * layers after them by columns, the vocabulary */
            qkv = false;
            fc = strstr(t->name, "attention.self.") || strstr(t->name, "intermediate.dense");
            projw = strstr(t->name, "output.dense.weight") != NULL;
            wte = strstr(t->name, "word_embeddings") || !strcmp(t->name, "cls.predictions.bias");
        }
        if (is_llama()) { /* llama.c's header: q, k, v, gate and up by rows, o_proj and
                           * down_proj by columns, the embedding and lm_head the vocabulary */
            qkv = false;
            fc = strstr(t->name, "q_proj") || strstr(t->name, "k_proj") ||
                 strstr(t->name, "v_proj") || strstr(t->name, "gate_proj") ||
                 strstr(t->name, "up_proj");
            projw = strstr(t->name, "o_proj") || strstr(t->name, "down_proj");
            wte = !strcmp(t->name, "model.embed_tokens.weight") ||
                  !strcmp(t->name, "lm_head.weight");
        }
        int want_parts = qkv ? 3 : (fc || projw || wte) ? 1 : 0;
        int want_dim = projw ? 1 : 0;
        RCHECK(t->tp_parts == want_parts && (want_parts == 0 || t->tp_dim == want_dim),
               "%s: tp_dim %d tp_parts %d, want %d %d", t->name, t->tp_dim, t->tp_parts, want_dim,
               want_parts);
        for (int d = 0; d < t->ndim; d++) {
            int64_t want = w->shape[d];
            if (want_parts && d == want_dim)
                want = wte ? (w->shape[0] + tp - 1) / tp : w->shape[d] / tp;
            RCHECK(t->shape[d] == want, "%s: shape[%d] = %lld, want %lld", t->name, d,
                   (long long)t->shape[d], (long long)want);
        }
    }
    RCHECK(m->num_blocks == m1->num_blocks, "%d blocks, TP = 1 has %d", m->num_blocks,
           m1->num_blocks);
    for (int b = 0; b < m->num_blocks && b < m1->num_blocks; b++)
        RCHECK(!strcmp(m->blocks[b].name, m1->blocks[b].name) &&
                   m->blocks[b].first_tensor == m1->blocks[b].first_tensor &&
                   m->blocks[b].last_tensor == m1->blocks[b].last_tensor &&
                   m->blocks[b].windows == m1->blocks[b].windows,
               "block %d: %s", b, m->blocks[b].name);
    dt_model_free(m1);
}

/* A block hook that keeps every block's parameters and gradients on the host and NaN-poisons
 * them in the model outside the block's windows (model.h's contract, as ZeRO-3 uses it). */
typedef struct poison {
    dt_model *m;
    float *p, *g, *nan; /* host (num_params) */
    int open, bad, events;
} poison;

static void on_block(void *ctx, int b, dt_block_event ev)
{
    poison *h = ctx;
    dt_backend *be = h->m->be;
    const dt_block *k = &h->m->blocks[b];
    const size_t off = k->offset, bytes = k->numel * sizeof(float);
    h->events++;
    if (ev == DT_BLOCK_BEFORE_FORWARD || ev == DT_BLOCK_BEFORE_BACKWARD) {
        h->bad += h->open != -1;
        h->open = b;
        be->memcpy_h2d(be, h->m->params + off, h->p + off, bytes);
        be->memcpy_h2d(be, h->m->grads + off, h->g + off, bytes);
    } else {
        h->bad += h->open != b;
        h->open = -1;
        be->memcpy_d2h(be, h->g + off, h->m->grads + off, bytes);
        be->memcpy_h2d(be, h->m->params + off, h->nan + off, bytes);
        be->memcpy_h2d(be, h->m->grads + off, h->nan + off, bytes);
    }
}

/* A second model with the poisoning hook trains one step from m's parameters: its loss and
 * gradients must be m's bit for bit, so the windows cover every use of the parameters under
 * tensor parallelism too (the all-reduces read only activations). Collective. */
static void check_hooked(dt_model *m, dt_comm *comm)
{
    dt_backend *be = m->be;
    dt_err err = {0};
    dt_model *m2 = NULL;
    if (dt_model_create(&m2, &m->cfg, be, comm, &err)) {
        dt_test_rank_fail(__FILE__, __LINE__, "second model", "%s", err.msg);
        return;
    }
    const size_t n = m->num_params, bytes = n * sizeof(float);
    poison h = {.m = m2, .open = -1};
    h.p = malloc(bytes);
    h.g = calloc(n, sizeof(float));
    h.nan = malloc(bytes);
    float *gm = malloc(bytes);
    if (!h.p || !h.g || !h.nan || !gm)
        goto out;
    for (size_t i = 0; i < n; i++)
        h.nan[i] = NAN;
    be->memcpy_d2h(be, h.p, m->params, bytes);
    be->memcpy_h2d(be, m2->params, h.nan, bytes);
    be->memcpy_h2d(be, m2->grads, h.nan, bytes);
    dt_model_set_block_hook(m2, on_block, &h);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &m->cfg, m->cfg.max_batch, 78);
    float l1 = 0, l2 = 0;
    be->memset_zero(be, m->grads, bytes);
    RCHECK(m->ops->forward(m, &hb.b, true, &l1, &err) == 0, "forward: %s", err.msg);
    RCHECK(m->ops->backward(m, 1.0f, NULL, NULL, &err) == 0, "backward: %s", err.msg);
    RCHECK(m2->ops->forward(m2, &hb.b, true, &l2, &err) == 0, "forward: %s", err.msg);
    RCHECK(m2->ops->backward(m2, 1.0f, NULL, NULL, &err) == 0, "backward: %s", err.msg);
    RCHECK(!memcmp(&l1, &l2, sizeof l1), "hooked loss %.9g, unhooked %.9g", l2, l1);
    be->memcpy_d2h(be, gm, m->grads, bytes);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += memcmp(&gm[i], &h.g[i], sizeof(float)) != 0;
    RCHECK(diff == 0, "%zu of %zu gradients differ with the poisoning block hook", diff, n);
    /* windows per pass (gpt: embed twice, every other block once); 2 passes, 2 events each */
    int windows = 0;
    for (int b = 0; b < m->num_blocks; b++)
        windows += m->blocks[b].windows;
    RCHECK(h.bad == 0 && h.open == -1 && h.events == 2 * 2 * windows,
           "block events: %d out of order, %d events, block %d left open", h.bad, h.events,
           h.open);
    dt_test_batch_free(&hb);
out:
    free(h.p);
    free(h.g);
    free(h.nan);
    free(gm);
    dt_model_free(m2);
}

static void tp_rank_main(const tp_job *j, int rank)
{
    dt_err err = {0};
    dt_store *store = NULL;
    dt_comm *comm = NULL;
    dt_backend *be = NULL;
    dt_model *m = NULL;
    if (dt_test_world_open(j->port, j->run_id, 0, rank, j->tp, 30000, &store, &comm, &err)) {
        fprintf(stderr, "    rank %d: %s: %s\n", rank, store ? "comm" : "store", err.msg);
        _exit(store ? 3 : 2);
    }
    dt_model_config c = tp_cfg(j->tp, rank, j->rc, j->sp);
    if (dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err) ||
        dt_model_create(&m, &c, be, comm, &err)) {
        fprintf(stderr, "    rank %d: model: %s\n", rank, err.msg);
        _exit(4);
    }
    check_table(m);
    if (j->sp && rank == 0) { /* the activations of the same rank without sequence parallelism */
        dt_model *m0 = NULL;
        c.sequence_parallel = false;
        RCHECK(dt_model_create(&m0, &c, be, comm, &err) == 0, "model without SP: %s", err.msg);
        j->res->act_bytes_nosp = m0 ? (double)dt_model_activation_bytes(m0) : 0;
        dt_model_free(m0);
    }
    train_and_report(m, comm, j->res, rank == 0);
    check_hooked(m, comm);
    dt_model_free(m);
    dt_backend_close(be);
    dt_comm_free(comm);
    dt_store_free(store);
    _exit(dt_test_rank_failed ? 1 : 0);
}

/* max |a - b| over the tensor / max |b| (plus a floor for an all-zero tensor). */
static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        num = DT_MAX(num, fabs((double)a[i] - (double)b[i]));
        den = DT_MAX(den, fabs((double)b[i]));
    }
    return num / den;
}

/* The activation bytes sequence parallelism should save on one rank of tp, from gpt.c's
 * buffers at this test's shape: every (B,T,C)- and (B,T)-sized buffer of the residual stream
 * and the LayerNorms keeps 1/tp of its rows (per kept layer ln_1's and ln_2's outputs and
 * statistics and res2; res3 for every layer; the embeddings' output, ln_f's output and
 * statistics; the backward's dres), minus the scratch it adds: the gathered (B,T,C) operand,
 * a (B,T/tp,C) reduce-scattered gradient and 4C LayerNorm gradients. */
static double sp_expected_saving(const dt_model_config *c, int tp)
{
    const double NR = (double)c->max_batch * c->shape.seq_len, C = c->n_embd, NC = NR * C;
    const double L = c->n_layer, Lk = c->recompute == DT_RECOMPUTE_BLOCK ? 1 : L;
    if (c->arch == DT_ARCH_LLAMA) { /* llama.c: the RMSNorms keep 1/rms only, (B,T) each */
        const double split = Lk * (3 * NC + 2 * NR) + L * NC /* res3 */ + NC /* encoded */ +
                             NC + NR /* model.norm */ + NC /* dres */;
        return 4.0 * (split * (1.0 - 1.0 / tp) - (NC + NC / tp + 2 * C));
    }
    const double split = Lk * (3 * NC + 4 * NR) + L * NC /* res3 */ + NC /* encoded */ +
                         NC + 2 * NR /* ln_f */ + NC /* dres */;
    const double added = NC + NC / tp + 4 * C;
    return 4.0 * (split * (1.0 - 1.0 / tp) - added);
}

/* The same from bert.c's buffers: per kept layer r1, h1, r2 and the two LayerNorms' statistics,
 * every layer's output, the embeddings' sum, output and statistics, the backward's dres and dA
 * (the heads run on all rows either way); added: the gathered operand, a reduce-scattered
 * gradient and (4 + 2)C LayerNorm and token-type gradients. */
static double bert_sp_expected_saving(const dt_model_config *c, int tp)
{
    const double NR = (double)c->max_batch * c->shape.seq_len, C = c->n_embd, NC = NR * C;
    const double L = c->n_layer, Lk = c->recompute == DT_RECOMPUTE_BLOCK ? 1 : L;
    const double split = Lk * (3 * NC + 4 * NR) + L * NC + 2 * NC + 2 * NR + 2 * NC;
    const double added = NC + NC / tp + 6 * C;
    return 4.0 * (split * (1.0 - 1.0 / tp) - added);
}

typedef struct tp_run {
    const tp_job *j;
    const dt_model_config *c1; /* the reference's (TP = 1) */
    tp_result *ref;
    size_t n;                  /* its parameters */
} tp_run;

/* Rank r < T of the TP job, or (r == T) the TP = 1 reference, concurrently. */
static void tp_run_rank(int rank, int n, void *arg)
{
    const tp_run *tr = arg;
    if (rank < tr->j->tp)
        tp_rank_main(tr->j, rank);
    dt_backend *be = NULL;
    dt_model *m = NULL;
    dt_err err = {0};
    if (dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err) ||
        dt_model_create(&m, tr->c1, be, NULL, &err)) {
        fprintf(stderr, "    reference: %s\n", err.msg);
        _exit(4);
    }
    RCHECK(m->num_params == tr->n, "TP = 1 has %zu parameters, want %zu", m->num_params, tr->n);
    train_and_report(m, NULL, tr->ref, true);
    dt_model_free(m);
    dt_backend_close(be);
}

static void run_tp(int tp, dt_recompute rc, bool sp)
{
    /* the reference is TP = 1, in a child of its own like the ranks (nothing in this process
     * starts a BLAS thread before the forks); its size: embeddings, 12C^2 + 13C per layer, ln_f */
    dt_model_config c1 = tp_cfg(1, 0, rc, false);
    size_t n = (size_t)(65 * 64 + 16 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
    if (is_bert()) /* + token types, the embedding LayerNorm, the decoder bias; the heads */
        n += (size_t)(2 * 64 + 2 * 64 + 65 - 2 * 64 + (64 * 64 + 3 * 64) +
                      (64 * 64 + 64 + 2 * 64 + 2));
    if (is_llama()) /* the embedding and head; per layer 2C + q, o (C^2 each), k, v (C^2 / 2
                     * each: half the heads), 3 x 96C; model.norm */
        n = (size_t)(2 * 65 * 64 + 2 * (2 * 64 + 3 * 64 * 64 + 3 * 96 * 64) + 64);
    tp_result *ref = res_map(n), *got = res_map(n);
    tp_job j = {.tp = tp, .rc = rc, .sp = sp, .res = got};
    snprintf(j.run_id, sizeof j.run_id, "tp-%d-%d-%d-%d", (int)getpid(), tp, (int)rc, (int)sp);
    tp_run tr = {.j = &j, .c1 = &c1, .ref = ref, .n = n};
    int status[DT_TEST_MAX_RANKS];
    dt_test_run_ranks(j.run_id, tp + 1, &j.port, tp_run_rank, &tr, 60.0 * dt_test_timeout_scale(),
                      status);
    for (int r = 0; r <= tp; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "%s %d of TP = %d ended with %d", r < tp ? "rank" : "reference", r, tp,
                     status[r]);
    DT_REQUIRE(ref->ok && got->ok);

    /* initial parameters: bit-identical */
    DT_CHECK_MSG(!memcmp(res_params0(ref), res_params0(got), n * sizeof(float)),
                 "TP = %d: initial parameters differ from TP = 1", tp);
    /* losses */
    DT_CHECK_MSG(fabs(got->loss0 - ref->loss0) <= 1e-5 * fabs(ref->loss0),
                 "TP = %d loss %.9g vs %.9g", tp, got->loss0, ref->loss0);
    DT_CHECK_MSG(fabs(got->eval_loss0 - ref->eval_loss0) <= 1e-5 * fabs(ref->eval_loss0),
                 "TP = %d eval loss %.9g vs %.9g", tp, got->eval_loss0, ref->eval_loss0);
    DT_CHECK(got->loss0 == got->eval_loss0);
    for (int s = 0; s < STEPS; s++)
        DT_CHECK_MSG(fabs(got->loss[s] - ref->loss[s]) <= 1e-5 * fabs(ref->loss[s]),
                     "TP = %d step %d loss %.9g vs %.9g", tp, s + 1, got->loss[s], ref->loss[s]);
    DT_CHECK(ref->loss[STEPS - 1] < ref->loss0); /* the steps did something */
    /* every gradient, and the trained parameters, per tensor, in TP = 1's table order */
    {
        dt_backend *be = NULL;
        dt_model *m = NULL;
        dt_err err = {0};
        DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
        DT_REQUIRE_OK(dt_model_create(&m, &c1, be, NULL, &err), &err);
        double worst_g = 0, worst_p = 0;
        /* bert's key biases have a zero gradient by the definition (a shift of a row of scores,
         * which softmax ignores): what they hold is rounding, held to 1e-5 of the largest
         * gradient and parameter of the model instead of their own */
        double gmax = 1e-30, pmax = 1e-30;
        for (size_t i = 0; i < n; i++) {
            gmax = DT_MAX(gmax, fabs((double)res_grads0(ref)[i]));
            pmax = DT_MAX(pmax, fabs((double)res_final(ref)[i]));
        }
        for (int i = 0; i < m->num_tensors; i++) {
            const dt_tensor_info *t = &m->tensors[i];
            double eg = rel_err(res_grads0(got) + t->offset, res_grads0(ref) + t->offset, t->numel);
            double ep = rel_err(res_final(got) + t->offset, res_final(ref) + t->offset, t->numel);
            if (strstr(t->name, "attention.self.key.bias")) {
                double tg = 0, tpm = 0;
                for (size_t k = t->offset; k < t->offset + t->numel; k++) {
                    tg = DT_MAX(tg, fabs((double)res_grads0(ref)[k]));
                    tpm = DT_MAX(tpm, fabs((double)res_final(ref)[k]));
                }
                eg *= DT_MAX(tg, 1e-30) / gmax;
                ep *= DT_MAX(tpm, 1e-30) / pmax;
            }
            DT_CHECK_MSG(eg <= 1e-5, "TP = %d%s recompute %d: gradient of %s off by %.3g", tp,
                         sp ? " SP" : "", (int)rc, t->name, eg);
            DT_CHECK_MSG(ep <= 1e-5, "TP = %d%s recompute %d: trained %s off by %.3g", tp,
                         sp ? " SP" : "", (int)rc, t->name, ep);
            worst_g = DT_MAX(worst_g, eg);
            worst_p = DT_MAX(worst_p, ep);
        }
        printf("    %s TP = %d%s, recompute %d: loss %.7f (TP = 1 %.7f), worst gradient %.2g, "
               "worst trained parameter %.2g\n",
               tp_model, tp, sp ? " + sequence parallel" : "", (int)rc, got->loss0, ref->loss0,
               worst_g, worst_p);
        dt_model_free(m);
        dt_backend_close(be);
    }
    /* gradient accumulation: a second backward adds exactly one more pass */
    DT_CHECK_MSG(ref->accum_err <= 1e-6 && got->accum_err <= 1e-6,
                 "TP = %d%s: accumulated gradients off twice the first by %.3g (TP = 1 %.3g)", tp,
                 sp ? " SP" : "", got->accum_err, ref->accum_err);
    /* this rank's share of the activations and the FLOPs */
    DT_CHECK(got->act_bytes < ref->act_bytes);
    if (sp) {
        dt_model_config c = tp_cfg(tp, 0, rc, true);
        double want = is_bert() ? bert_sp_expected_saving(&c, tp) : sp_expected_saving(&c, tp);
        double saved = got->act_bytes_nosp - got->act_bytes;
        printf("    TP = %d, recompute %d: activations per rank %.0f bytes, %.0f with sequence "
               "parallelism (saved %.0f, expected %.0f); TP = 1 %.0f\n",
               tp, (int)rc, got->act_bytes_nosp, got->act_bytes, saved, want, ref->act_bytes);
        DT_CHECK_MSG(saved == want, "TP = %d SP: saved %.0f activation bytes, expected %.0f", tp,
                     saved, want);
    }
    DT_CHECK(got->flops < ref->flops && got->flops > ref->flops / tp);
    res_unmap(ref);
    res_unmap(got);
}

/* ------------------------------------------------------------------------------------------ */
/* configurations dt_model_create refuses */

static void expect_refused(const dt_model_config *c, dt_comm *comm, const char *needle)
{
    dt_backend *be = NULL;
    dt_model *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    DT_CHECK_INT(dt_model_create(&m, c, be, comm, &err), -EINVAL);
    DT_CHECK(m == NULL);
    DT_CHECK_CONTAINS(err.msg, needle);
    dt_backend_close(be);
}

static void test_bad_config(void)
{
    dt_comm_opts o;
    dt_comm_opts_default(&o); /* rank 0 of 1 */
    dt_comm *one = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_comm_init(&one, NULL, &o, &err), &err);

    dt_model_config c = tp_cfg(2, 0, DT_RECOMPUTE_NONE, false);
    expect_refused(&c, NULL, "needs the tensor group's communicator");
    expect_refused(&c, one, "the communicator given is rank 0 of 1");
    c.tp_rank = 1;
    expect_refused(&c, one, "the communicator given is rank 0 of 1");
    c.tp_rank = 2;
    expect_refused(&c, one, "tp_rank must be in 0..tp_size-1");
    c = tp_cfg(-1, 0, DT_RECOMPUTE_NONE, false);
    expect_refused(&c, one, "tp_size >= 0");
    c = tp_cfg(3, 0, DT_RECOMPUTE_NONE, false); /* 4 heads */
    expect_refused(&c, one, "must divide model.n_head (4)");
    /* sequence parallelism without tensor parallelism */
    c = tp_cfg(1, 0, DT_RECOMPUTE_NONE, true);
    expect_refused(&c, NULL, "sequence parallelism needs tensor parallelism");
    c = tp_cfg(0, 0, DT_RECOMPUTE_NONE, true);
    expect_refused(&c, NULL, "sequence parallelism needs tensor parallelism");

    dt_model_config mlp;
    memset(&mlp, 0, sizeof mlp);
    mlp.arch = DT_ARCH_MLP;
    mlp.shape.kind = DT_SAMPLE_VECTOR;
    mlp.shape.input_dim = 4;
    mlp.shape.n_classes = 3;
    mlp.max_batch = 2;
    mlp.n_hidden = 1;
    mlp.hidden[0] = 8;
    mlp.tp_size = 2;
    expect_refused(&mlp, one, "model mlp has no tensor-parallel form");

    /* tp_size 1 (and 0) is no tensor parallelism: any comm, or none, is fine */
    c = tp_cfg(1, 0, DT_RECOMPUTE_NONE, false);
    dt_backend *be = NULL;
    dt_model *m = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, &err), &err);
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        DT_CHECK(t->tp_parts == 0 && dt_tensor_whole_numel(t) == t->numel);
        for (int d = 0; d < t->ndim; d++)
            DT_CHECK(t->whole_shape[d] == t->shape[d]);
    }
    dt_model_free(m);
    dt_backend_close(be);
    dt_comm_free(one);
}

/* ------------------------------------------------------------------------------------------ */
/* the dtrain binary with parallel.sequence_parallel, through the strategies */

#define E2E_STEPS 6

/* The values of "key": in the "train" records of metrics.jsonl text, in order, into v[0..max). */
static int metric_values(const char *text, const char *key, double *v, int max)
{
    int n = 0;
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    for (const char *p = text; p && (p = strstr(p, "{\"type\":\"train\"")) && n < max; p++) {
        const char *end = strchr(p, '\n'), *k = strstr(p, pat);
        if (k && (!end || k < end))
            v[n++] = strtod(k + strlen(pat), NULL);
    }
    return n;
}

/* `dtrain` on nproc workers with the given layout, with and without sequence parallelism:
 * both exit 0, and every step's loss and gradient norm agree within 1e-5 relative; rank 0's
 * peak activation memory (metrics.jsonl's mem_peak_bytes.activations) is smaller with it. */
static void e2e_compare(int nproc, const char *layout)
{
    double loss[2][E2E_STEPS], gn[2][E2E_STEPS], act[2][E2E_STEPS];
    for (int sp = 0; sp < 2; sp++) {
        char *out = NULL;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/e2e-%d-%d", dt_test_tmpdir(), nproc, sp);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "%s --standalone --nproc-per-node=%d --max-restarts=0 %s/../../configs/"
                 "quickstart.ini %s parallel.sequence_parallel=%s job.device=cpu "
                 "job.cpu_bind=none model.n_layer=2 model.n_head=4 model.n_embd=16 "
                 "model.block_size=16 data.seq_len=16 train.batch_size=4 train.steps=%d "
                 "job.log_every=1 job.output_dir=%s 2>&1",
                 dt_test_dtrain_bin(), nproc, dt_test_self_dir(), layout, sp ? "true" : "false",
                 E2E_STEPS, dir);
        int rc = dt_test_run(cmd, &out, 120);
        DT_CHECK_MSG(rc == 0, "%s (sequence parallel %d) exited %d: %.3000s", layout, sp, rc,
                     out ? out : "");
        free(out);
        char *m = dt_test_slurp(strcat(dir, "/metrics.jsonl"));
        DT_REQUIRE(m != NULL);
        DT_CHECK_INT(metric_values(m, "loss", loss[sp], E2E_STEPS), E2E_STEPS);
        DT_CHECK_INT(metric_values(m, "grad_norm", gn[sp], E2E_STEPS), E2E_STEPS);
        DT_CHECK_INT(metric_values(m, "activations", act[sp], E2E_STEPS), E2E_STEPS);
        free(m);
    }
    for (int i = 0; i < E2E_STEPS; i++) {
        DT_CHECK_MSG(fabs(loss[1][i] - loss[0][i]) <= 1e-5 * fabs(loss[0][i]),
                     "%s step %d: loss %.9g with sequence parallelism, %.9g without", layout,
                     i + 1, loss[1][i], loss[0][i]);
        DT_CHECK_MSG(fabs(gn[1][i] - gn[0][i]) <= 1e-5 * fabs(gn[0][i]),
                     "%s step %d: gradient norm %.9g with sequence parallelism, %.9g without",
                     layout, i + 1, gn[1][i], gn[0][i]);
    }
    DT_CHECK(loss[0][E2E_STEPS - 1] < loss[0][0]);
    DT_CHECK_MSG(act[1][0] < act[0][0], "%s: rank 0's activations %.0f bytes with sequence "
                                        "parallelism, %.0f without",
                 layout, act[1][0], act[0][0]);
    printf("    %s: losses %.7f .. %.7f both ways; rank 0's activations %.0f -> %.0f bytes\n",
           layout, loss[1][0], loss[1][E2E_STEPS - 1], act[0][0], act[1][0]);
}

static void test_sp_dtrain_tensor(void) { e2e_compare(2, "parallel.tensor=2"); }
static void test_sp_dtrain_pipeline(void)
{
    e2e_compare(4, "parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2");
}

/* The job file's checks: sequence parallelism needs T > 1 and a sequence T divides. */
static void test_sp_config(void)
{
    char *out = NULL;
    int rc = dt_test_run(fmt_cmd("%s --print-config %s/../../configs/quickstart.ini "
                                 "parallel.sequence_parallel=true 2>&1",
                                 dt_test_dtrain_bin(), dt_test_self_dir()),
                         &out, 30);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out ? out : "", "set parallel.tensor > 1 (gpt, bert, llama), or "
                                      "parallel.sequence_parallel = false");
    free(out);
    out = NULL;
    rc = dt_test_run(fmt_cmd("%s --print-config --nproc-per-node=2 %s/../../configs/quickstart.ini "
                             "parallel.tensor=2 model.n_head=4 data.seq_len=15 "
                             "parallel.sequence_parallel=true 2>&1",
                             dt_test_dtrain_bin(), dt_test_self_dir()),
                     &out, 30);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out ? out : "", "set data.seq_len to a multiple of 2");
    free(out);
    out = NULL;
    rc = dt_test_run(fmt_cmd("%s --print-config --nproc-per-node=2 %s/../../configs/quickstart.ini "
                             "parallel.tensor=2 model.n_head=4 data.seq_len=16 "
                             "parallel.sequence_parallel=true 2>&1",
                             dt_test_dtrain_bin(), dt_test_self_dir()),
                     &out, 30);
    DT_CHECK_MSG(rc == 0, "--print-config exited %d: %s", rc, out ? out : "");
    DT_CHECK_CONTAINS(out ? out : "", "sequence_parallel = true");
    free(out);
}

static void test_tp2_none(void) { run_tp(2, DT_RECOMPUTE_NONE, false); }
static void test_tp2_block(void) { run_tp(2, DT_RECOMPUTE_BLOCK, false); }
static void test_tp2_selective(void) { run_tp(2, DT_RECOMPUTE_SELECTIVE, false); }
static void test_tp4_none(void) { run_tp(4, DT_RECOMPUTE_NONE, false); }
static void test_tp4_block(void) { run_tp(4, DT_RECOMPUTE_BLOCK, false); }
static void test_tp4_selective(void) { run_tp(4, DT_RECOMPUTE_SELECTIVE, false); }
static void test_sp2_none(void) { run_tp(2, DT_RECOMPUTE_NONE, true); }
static void test_sp2_block(void) { run_tp(2, DT_RECOMPUTE_BLOCK, true); }
static void test_sp2_selective(void) { run_tp(2, DT_RECOMPUTE_SELECTIVE, true); }
static void test_sp4_none(void) { run_tp(4, DT_RECOMPUTE_NONE, true); }
static void test_sp4_block(void) { run_tp(4, DT_RECOMPUTE_BLOCK, true); }

/* bert (bert.c): the same comparisons, its HF-named slices and vocabulary padding included */
static void bert_tp(int tp, dt_recompute rc, bool sp)
{
    tp_model = "bert";
    run_tp(tp, rc, sp);
}
static void test_bert_tp2_none(void) { bert_tp(2, DT_RECOMPUTE_NONE, false); }
static void test_bert_tp2_block(void) { bert_tp(2, DT_RECOMPUTE_BLOCK, false); }
static void test_bert_tp2_selective(void) { bert_tp(2, DT_RECOMPUTE_SELECTIVE, false); }
static void test_bert_tp4_none(void) { bert_tp(4, DT_RECOMPUTE_NONE, false); }
static void test_bert_sp2_none(void) { bert_tp(2, DT_RECOMPUTE_NONE, true); }
static void test_bert_sp2_block(void) { bert_tp(2, DT_RECOMPUTE_BLOCK, true); }
static void test_bert_sp4_selective(void) { bert_tp(4, DT_RECOMPUTE_SELECTIVE, true); }

/* llama (llama.c): grouped-query attention split by kv heads, SwiGLU, the untied
 * vocabulary-parallel head */
static void llama_tp(int tp, dt_recompute rc, bool sp)
{
    tp_model = "llama";
    run_tp(tp, rc, sp);
}
static void test_llama_tp2(void)
{
    for (int rc = 0; rc < 3; rc++)
        llama_tp(2, (dt_recompute)rc, false);
}
static void test_llama_tp4(void)
{
    llama_tp(4, DT_RECOMPUTE_NONE, false);
    llama_tp(4, DT_RECOMPUTE_SELECTIVE, false);
}
static void test_llama_sp(void)
{
    llama_tp(2, DT_RECOMPUTE_NONE, true);
    llama_tp(2, DT_RECOMPUTE_BLOCK, true);
    llama_tp(4, DT_RECOMPUTE_SELECTIVE, true);
}

static const dt_test tests[] = {
    {"tp_copy", test_tp_copy, 0},
    {"bad_config", test_bad_config, 0},
    {"tp2_none", test_tp2_none, 90},
    {"tp2_block", test_tp2_block, 90},
    {"tp2_selective", test_tp2_selective, 90},
    {"tp4_none", test_tp4_none, 120},
    {"tp4_block", test_tp4_block, 120},
    {"tp4_selective", test_tp4_selective, 120},
    {"sp2_none", test_sp2_none, 90},
    {"sp2_block", test_sp2_block, 90},
    {"sp2_selective", test_sp2_selective, 90},
    {"sp4_none", test_sp4_none, 120},
    {"sp4_block", test_sp4_block, 120},
    {"bert_tp2_none", test_bert_tp2_none, 90},
    {"bert_tp2_block", test_bert_tp2_block, 90},
    {"bert_tp2_selective", test_bert_tp2_selective, 90},
    {"bert_tp4_none", test_bert_tp4_none, 120},
    {"bert_sp2_none", test_bert_sp2_none, 90},
    {"bert_sp2_block", test_bert_sp2_block, 90},
    {"bert_sp4_selective", test_bert_sp4_selective, 120},
    {"llama_tp2_none_block_selective", test_llama_tp2, 180},
    {"llama_tp4_none_selective", test_llama_tp4, 180},
    {"llama_sp2_sp4", test_llama_sp, 240},
    {"sp_config", test_sp_config, 60},
    {"sp_dtrain_tensor", test_sp_dtrain_tensor, 300},
    {"sp_dtrain_pipeline", test_sp_dtrain_pipeline, 300},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_tp", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
