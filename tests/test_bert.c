/* test_bert.c - the bert model (runtime/train/models/bert.c) against its definition.
 *
 * - bert_reference*: a float64 implementation of Hugging Face's BertForPreTraining written here
 *   from the definition (embeddings summed and LayerNormed; post-LN encoder layers with
 *   bidirectional attention over the keys the attention mask keeps and the erf GELU; the MLM
 *   head with the decoder tied to the word embeddings; the pooler and the next-sentence head;
 *   LayerNorm eps 1e-12; loss = mean MLM cross-entropy over the targets >= 0 + mean NSP
 *   cross-entropy), reading the parameters by their Hugging Face names. On tiny shapes, with the
 *   parameters moved off their initialisation (so GELU, tanh and softmax are not linear), the
 *   model's float32 loss must equal the reference's within 1e-5 relative, and every tensor's
 *   float32 gradient the reference's gradient within 1e-5 relative (L2 over the tensor), the
 *   reference gradient taken by central finite differences of the float64 loss over every
 *   parameter (h = 1e-5: truncation and rounding both far below 1e-8). The key biases, whose
 *   gradient the definition makes zero (softmax ignores a shift of a row), are held to 1e-5 of
 *   the whole gradient's norm instead. With and without the NSP head, with padding, token types
 *   and no mask at all.
 * - bert_padding: padded positions change nothing at the real ones (the padded tokens' ids are
 *   changed: the logits at every real position stay bit-identical).
 * - bert_table: the tensor table under Hugging Face's names, shapes, the blocks.
 * - bert_configs: configs/bert-mlm.ini and configs/bert-tp2-pp2.ini (on its 8 workers) run as
 *   shipped, briefly, with a falling loss; the latter's checkpoint holds whole tensors under
 *   Hugging Face's names.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "runtime/train/models/bert.h"
#include "runtime/train/models/model.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define REQUIRE_MSG(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dt_test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                      \
            dt_test_stop();                                                                        \
        }                                                                                          \
    } while (0)

static dt_backend *be_new(void)
{
    dt_backend *be = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, e), e);
    return be;
}

static dt_model_config bert_cfg(bool nsp)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_BERT;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 8;
    c.shape.vocab_size = 19;
    c.max_batch = 3;
    c.seed = 5;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.block_size = 10;
    c.nsp = nsp;
    return c;
}

static float *host_copy(dt_backend *be, const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 4);
    be->memcpy_d2h(be, h, d, n * sizeof(float));
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* the float64 reference */

typedef struct ref {
    const dt_model *m; /* the tensor table (names, offsets, shapes) */
    double *p;         /* (num_params) the parameters in double */
    const dt_batch *b;
    int L, NH, C, V, T, B;
    bool nsp;
} ref;

/* The parameter called name, of (d0) or (d0, d1) elements (the test fails on a mismatch). */
static const double *W(const ref *r, const char *name, int64_t d0, int64_t d1)
{
    int i = dt_model_find_tensor(r->m, name);
    REQUIRE_MSG(i >= 0, "no tensor %s", name);
    const dt_tensor_info *t = &r->m->tensors[i];
    REQUIRE_MSG(t->shape[0] == d0 && (d1 == 0 ? t->ndim == 1 : t->shape[1] == d1),
                   "tensor %s has the wrong shape", name);
    return r->p + t->offset;
}

static const double *WL(const ref *r, int l, const char *name, int64_t d0, int64_t d1)
{
    char nm[DT_TENSOR_NAME_MAX];
    snprintf(nm, sizeof nm, "bert.encoder.layer.%d.%s", l, name);
    return W(r, nm, d0, d1);
}

/* y (N,O) = x (N,I) @ w^T (w (O,I)) + b (O). */
static void linear(double *y, const double *x, const double *w, const double *b, int N, int I,
                   int O)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < I; i++)
                s += x[(size_t)n * I + i] * w[(size_t)o * I + i];
            y[(size_t)n * O + o] = s;
        }
}

static void layernorm(double *y, const double *x, const double *w, const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *r = x + (size_t)n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += r[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (r[c] - m) * (r[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-12);
        for (int c = 0; c < C; c++)
            y[(size_t)n * C + c] = (r[c] - m) * s * w[c] + b[c];
    }
}

static double gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* -log softmax(logits (K))[target] */
static double xent(const double *z, int K, int target)
{
    double m = z[0], s = 0;
    for (int k = 1; k < K; k++)
        m = z[k] > m ? z[k] : m;
    for (int k = 0; k < K; k++)
        s += exp(z[k] - m);
    return log(s) + m - z[target];
}

static double ref_loss(const ref *r)
{
    const int B = r->B, T = r->T, C = r->C, V = r->V, NH = r->NH, hs = C / NH, N = B * T;
    const dt_batch *b = r->b;
    double *h = calloc((size_t)N * C, sizeof(double)), *x = calloc((size_t)N * C, sizeof(double));
    double *q = calloc((size_t)N * C, sizeof(double)), *k = calloc((size_t)N * C, sizeof(double));
    double *v = calloc((size_t)N * C, sizeof(double)), *ctx = calloc((size_t)N * C, sizeof(double));
    double *f = calloc((size_t)N * 4 * C, sizeof(double)), *p = calloc((size_t)T, sizeof(double));
    double *lg = calloc((size_t)V, sizeof(double));
    const double *word = W(r, "bert.embeddings.word_embeddings.weight", V, C);
    const double *pos = W(r, "bert.embeddings.position_embeddings.weight", r->m->cfg.block_size, C);
    const double *typ = W(r, "bert.embeddings.token_type_embeddings.weight", 2, C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            x[(size_t)n * C + c] = word[(size_t)b->tokens[n] * C + c] + pos[(size_t)(n % T) * C + c] +
                                   typ[(size_t)(b->types ? b->types[n] : 0) * C + c];
    layernorm(h, x, W(r, "bert.embeddings.LayerNorm.weight", C, 0),
              W(r, "bert.embeddings.LayerNorm.bias", C, 0), N, C);
    for (int l = 0; l < r->L; l++) {
        linear(q, h, WL(r, l, "attention.self.query.weight", C, C),
               WL(r, l, "attention.self.query.bias", C, 0), N, C, C);
        linear(k, h, WL(r, l, "attention.self.key.weight", C, C),
               WL(r, l, "attention.self.key.bias", C, 0), N, C, C);
        linear(v, h, WL(r, l, "attention.self.value.weight", C, C),
               WL(r, l, "attention.self.value.bias", C, 0), N, C, C);
        for (int bb = 0; bb < B; bb++)
            for (int hd = 0; hd < NH; hd++)
                for (int t = 0; t < T; t++) {
                    double m = -INFINITY, sum = 0;
                    for (int s = 0; s < T; s++) {
                        double dot = 0;
                        for (int i = 0; i < hs; i++)
                            dot += q[((size_t)bb * T + t) * C + hd * hs + i] *
                                   k[((size_t)bb * T + s) * C + hd * hs + i];
                        p[s] = dot / sqrt((double)hs);
                        if ((!b->mask || b->mask[bb * T + s]) && p[s] > m)
                            m = p[s];
                    }
                    for (int s = 0; s < T; s++) {
                        p[s] = !b->mask || b->mask[bb * T + s] ? exp(p[s] - m) : 0.0;
                        sum += p[s];
                    }
                    for (int i = 0; i < hs; i++) {
                        double o = 0;
                        for (int s = 0; s < T; s++)
                            o += p[s] / sum * v[((size_t)bb * T + s) * C + hd * hs + i];
                        ctx[((size_t)bb * T + t) * C + hd * hs + i] = o;
                    }
                }
        linear(x, ctx, WL(r, l, "attention.output.dense.weight", C, C),
               WL(r, l, "attention.output.dense.bias", C, 0), N, C, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            x[i] += h[i];
        layernorm(h, x, WL(r, l, "attention.output.LayerNorm.weight", C, 0),
                  WL(r, l, "attention.output.LayerNorm.bias", C, 0), N, C);
        linear(f, h, WL(r, l, "intermediate.dense.weight", 4 * C, C),
               WL(r, l, "intermediate.dense.bias", 4 * C, 0), N, C, 4 * C);
        for (size_t i = 0; i < (size_t)N * 4 * C; i++)
            f[i] = gelu(f[i]);
        linear(x, f, WL(r, l, "output.dense.weight", C, 4 * C), WL(r, l, "output.dense.bias", C, 0),
               N, 4 * C, C);
        for (size_t i = 0; i < (size_t)N * C; i++)
            x[i] += h[i];
        layernorm(h, x, WL(r, l, "output.LayerNorm.weight", C, 0),
                  WL(r, l, "output.LayerNorm.bias", C, 0), N, C);
    }
    /* the MLM head */
    linear(x, h, W(r, "cls.predictions.transform.dense.weight", C, C),
           W(r, "cls.predictions.transform.dense.bias", C, 0), N, C, C);
    for (size_t i = 0; i < (size_t)N * C; i++)
        x[i] = gelu(x[i]);
    layernorm(q, x, W(r, "cls.predictions.transform.LayerNorm.weight", C, 0),
              W(r, "cls.predictions.transform.LayerNorm.bias", C, 0), N, C);
    const double *dbias = W(r, "cls.predictions.bias", V, 0);
    double mlm = 0;
    int masked = 0;
    for (int n = 0; n < N; n++) {
        if (b->targets[n] < 0)
            continue;
        linear(lg, q + (size_t)n * C, word, dbias, 1, C, V);
        mlm += xent(lg, V, b->targets[n]);
        masked++;
    }
    double loss = masked ? mlm / masked : 0.0;
    if (r->nsp) { /* the pooler on each sample's first token, then seq_relationship */
        double nspl = 0, pooled[64], z[2];
        DT_REQUIRE(C <= 64);
        for (int bb = 0; bb < B; bb++) {
            linear(pooled, h + (size_t)bb * T * C, W(r, "bert.pooler.dense.weight", C, C),
                   W(r, "bert.pooler.dense.bias", C, 0), 1, C, C);
            for (int c = 0; c < C; c++)
                pooled[c] = tanh(pooled[c]);
            linear(z, pooled, W(r, "cls.seq_relationship.weight", 2, C),
                   W(r, "cls.seq_relationship.bias", 2, 0), 1, C, 2);
            nspl += xent(z, 2, b->labels[bb]);
        }
        loss += nspl / B;
    }
    free(h); free(x); free(q); free(k); free(v); free(ctx); free(f); free(p); free(lg);
    return loss;
}

/* The model (float32, cpu) against the reference: loss and every gradient, see the header. */
static void check_reference(const dt_model_config *cfg, int B, bool no_mask, bool no_types)
{
    dt_backend *be = be_new();
    dt_model *m = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_model_create(&m, cfg, be, NULL, e), e);
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 31);
    if (no_mask)
        hb.b.mask = NULL;
    if (no_types)
        hb.b.types = NULL;
    const size_t n = m->num_params;
    float *p = host_copy(be, m->params, n);
    dt_rng r;
    dt_rng_seed(&r, 17);
    for (size_t i = 0; i < n; i++)
        p[i] += 0.3f * dt_rng_normal(&r);
    be->memcpy_h2d(be, m->params, p, n * sizeof(float));
    be->memset_zero(be, m->grads, n * sizeof(float));
    float loss = NAN;
    DT_REQUIRE_OK(m->ops->forward(m, &hb.b, true, &loss, e), e);
    DT_REQUIRE_OK(m->ops->backward(m, 1.0f, NULL, NULL, e), e);
    float *g = host_copy(be, m->grads, n);

    ref rf = {m, malloc(n * sizeof(double)), &hb.b, cfg->n_layer, cfg->n_head, cfg->n_embd,
              cfg->shape.vocab_size, hb.b.T, B, cfg->nsp};
    for (size_t i = 0; i < n; i++)
        rf.p[i] = p[i];
    double want = ref_loss(&rf);
    DT_CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want),
                 "bert%s: loss %.9g, float64 reference %.12g (rel %.2g)", cfg->nsp ? " +nsp" : "",
                 loss, want, fabs(loss - want) / fabs(want));
    double *gr = malloc(n * sizeof(double));
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double x0 = rf.p[i];
        rf.p[i] = x0 + h;
        double lp = ref_loss(&rf);
        rf.p[i] = x0 - h;
        double lm = ref_loss(&rf);
        rf.p[i] = x0;
        gr[i] = (lp - lm) / (2 * h);
    }
    /* The key biases' gradient is zero by the definition (q.b_k shifts a whole row of scores,
     * which the softmax cancels): their error is measured against the whole gradient's norm,
     * every other tensor's against its own. */
    double all = 0;
    for (size_t i = 0; i < n; i++)
        all += gr[i] * gr[i];
    all = sqrt(all);
    double worst = 0;
    const char *worst_name = "";
    for (int t = 0; t < m->num_tensors; t++) {
        const dt_tensor_info *ti = &m->tensors[t];
        double num = 0, den = 0;
        for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
            num += (g[i] - gr[i]) * (g[i] - gr[i]);
            den += gr[i] * gr[i];
        }
        const bool zero = strstr(ti->name, "attention.self.key.bias") != NULL;
        double rel = sqrt(num) / (zero ? all : sqrt(den));
        DT_CHECK_MSG((zero ? sqrt(den) <= 1e-8 * all : den > 0) && rel <= 1e-5,
                     "bert%s%s%s: gradient of %s: rel L2 error %.3g against the float64 reference "
                     "(|ref| %.3g of %.3g)",
                     cfg->nsp ? " +nsp" : "", no_mask ? " no mask" : "", no_types ? " no types" : "",
                     ti->name, rel, sqrt(den), all);
        if (rel > worst) {
            worst = rel;
            worst_name = ti->name;
        }
    }
    printf("bert%s: loss rel error %.2g, worst gradient rel error %.2g (%s)\n",
                cfg->nsp ? " +nsp" : "", fabs(loss - want) / fabs(want), worst, worst_name);
    free(gr);
    free(rf.p);
    free(g);
    free(p);
    dt_test_batch_free(&hb);
    dt_model_free(m);
    be->close(be);
}

static void test_bert_reference(void)
{
    dt_model_config c = bert_cfg(false);
    check_reference(&c, 3, false, false);
}

static void test_bert_reference_nsp(void)
{
    dt_model_config c = bert_cfg(true);
    check_reference(&c, 3, false, false);
    c.n_head = 4; /* head size 2, another shape; no mask, no token types */
    check_reference(&c, 2, true, true);
}

/* ------------------------------------------------------------------------------------------ */
/* padding, the table */

static void test_bert_padding(void)
{
    dt_backend *be = be_new();
    dt_model_config c = bert_cfg(true);
    dt_model *m = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, e), e);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 3, 41);
    const int T = hb.b.T, V = c.shape.vocab_size, N = 3 * T;
    float loss;
    DT_REQUIRE_OK(m->ops->forward(m, &hb.b, false, &loss, e), e);
    float *ref0 = host_copy(be, dt_bert_logits(m), (size_t)N * V);
    int padded = 0;
    for (int i = 0; i < N; i++)
        if (!hb.mask[i]) {
            hb.tokens[i] = (hb.tokens[i] + 7) % V;
            padded++;
        }
    DT_REQUIRE(padded > 0);
    float got_loss;
    DT_REQUIRE_OK(m->ops->forward(m, &hb.b, false, &got_loss, e), e);
    float *got = host_copy(be, dt_bert_logits(m), (size_t)N * V);
    int changed = 0, pad_changed = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < V; j++) {
            bool diff = memcmp(&got[(size_t)i * V + j], &ref0[(size_t)i * V + j], sizeof(float));
            changed += hb.mask[i] && diff;
            pad_changed += !hb.mask[i] && diff;
        }
    DT_CHECK_MSG(changed == 0, "changing %d padded tokens changed %d logits at real positions",
                 padded, changed);
    DT_CHECK_MSG(pad_changed > 0, "changing padded tokens changed nothing at all (is the mask "
                                  "read?)");
    DT_CHECK(memcmp(&loss, &got_loss, sizeof loss) == 0);
    free(ref0);
    free(got);
    dt_test_batch_free(&hb);
    dt_model_free(m);
    be->close(be);
}

static void test_bert_table(void)
{
    dt_backend *be = be_new();
    dt_model_config c = bert_cfg(true);
    dt_model *m = NULL;
    dt_err err = {0}, *e = &err;
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, e), e);
    const int C = c.n_embd, V = c.shape.vocab_size, L = c.n_layer;
    struct {
        const char *name;
        int64_t d0, d1;
    } want[] = {
        {"bert.embeddings.word_embeddings.weight", V, C},
        {"bert.embeddings.position_embeddings.weight", c.block_size, C},
        {"bert.embeddings.token_type_embeddings.weight", 2, C},
        {"bert.embeddings.LayerNorm.weight", C, 0},
        {"bert.embeddings.LayerNorm.bias", C, 0},
        {"bert.encoder.layer.0.attention.self.query.weight", C, C},
        {"bert.encoder.layer.0.attention.self.key.weight", C, C},
        {"bert.encoder.layer.0.attention.self.value.weight", C, C},
        {"bert.encoder.layer.0.attention.self.query.bias", C, 0},
        {"bert.encoder.layer.0.attention.self.key.bias", C, 0},
        {"bert.encoder.layer.0.attention.self.value.bias", C, 0},
        {"bert.encoder.layer.0.attention.output.dense.weight", C, C},
        {"bert.encoder.layer.0.attention.output.dense.bias", C, 0},
        {"bert.encoder.layer.0.attention.output.LayerNorm.weight", C, 0},
        {"bert.encoder.layer.0.attention.output.LayerNorm.bias", C, 0},
        {"bert.encoder.layer.0.intermediate.dense.weight", 4 * C, C},
        {"bert.encoder.layer.0.intermediate.dense.bias", 4 * C, 0},
        {"bert.encoder.layer.0.output.dense.weight", C, 4 * C},
        {"bert.encoder.layer.0.output.dense.bias", C, 0},
        {"bert.encoder.layer.0.output.LayerNorm.weight", C, 0},
        {"bert.encoder.layer.0.output.LayerNorm.bias", C, 0},
    };
    const int per_layer = 16;
    DT_CHECK_INT(m->num_tensors, 5 + per_layer * L + 9);
    for (size_t i = 0; i < DT_ARRAY_LEN(want); i++) {
        const dt_tensor_info *t = &m->tensors[i];
        DT_CHECK_STR(t->name, want[i].name);
        DT_CHECK_INT(t->shape[0], want[i].d0);
        DT_CHECK_INT(t->ndim, want[i].d1 ? 2 : 1);
        if (want[i].d1)
            DT_CHECK_INT(t->shape[1], want[i].d1);
    }
    const char *head[] = {"cls.predictions.transform.dense.weight",
                          "cls.predictions.transform.dense.bias",
                          "cls.predictions.transform.LayerNorm.weight",
                          "cls.predictions.transform.LayerNorm.bias",
                          "bert.pooler.dense.weight",
                          "bert.pooler.dense.bias",
                          "cls.seq_relationship.weight",
                          "cls.seq_relationship.bias",
                          "cls.predictions.bias"};
    for (int i = 0; i < 9; i++)
        DT_CHECK_STR(m->tensors[5 + per_layer * L + i].name, head[i]);
    DT_CHECK_INT(m->tensors[m->num_tensors - 1].shape[0], V);
    size_t off = 0;
    for (int t = 0; t < m->num_tensors; t++) {
        DT_CHECK_INT(m->tensors[t].offset, off);
        off += m->tensors[t].numel;
        bool vec = m->tensors[t].ndim == 1;
        DT_CHECK_MSG(m->tensors[t].no_decay == vec, "%s: no_decay %d", m->tensors[t].name,
                     m->tensors[t].no_decay);
    }
    DT_CHECK_INT(off, m->num_params);
    const char *blocks[] = {"embed", "layer.0", "layer.1", "cls"};
    DT_CHECK_INT(m->num_blocks, 4);
    for (int b = 0; b < 4 && b < m->num_blocks; b++) {
        DT_CHECK_STR(m->blocks[b].name, blocks[b]);
        DT_CHECK_INT(m->blocks[b].windows, b == 0 ? 2 : 1);
    }
    dt_model_free(m);
    be->close(be);
}

/* bert-base with the uncased vocabulary (30522) and 512 positions has BertForPreTraining's
 * 110,106,428 parameters (BertModel's 109,482,240, the MLM transform and decoder bias, the NSP
 * head); without model.nsp the pooler and seq_relationship go. (bert-large, by the same
 * formula: 336,226,108.) */
static void test_bert_base_count(void)
{
    dt_backend *be = be_new();
    dt_model_config c = bert_cfg(true);
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.block_size = 512;
    c.shape.vocab_size = 30522;
    c.max_batch = 1;
    for (int nsp = 1; nsp >= 0; nsp--) {
        c.nsp = nsp;
        dt_model *m = NULL;
        dt_err err = {0}, *e = &err;
        DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, e), e);
        DT_CHECK_INT(m->num_params, nsp ? 110106428 : 110106428 - (768 * 768 + 768) - (2 * 768 + 2));
        dt_model_free(m);
    }
    be->close(be);
}

/* ------------------------------------------------------------------------------------------ */
/* the shipped job files, briefly */

/* The loss of metrics.jsonl's first and last train records. */
static void first_last_loss(const char *dir, double *first, double *last)
{
    char *text = dt_test_slurp(dt_test_fmt("%s/metrics.jsonl", dir));
    *first = *last = NAN;
    for (char *p = text; p && (p = strstr(p, "\"type\":\"train\"")); p++) {
        char *l = strstr(p, "\"loss\":");
        if (!l)
            break;
        *last = strtod(l + 7, NULL);
        if (isnan(*first))
            *first = *last;
    }
    free(text);
}

/* configs/bert-mlm.ini (60 steps instead of 300) and configs/bert-tp2-pp2.ini on its 8 cpu
 * workers (20 steps): both run as shipped with a falling loss; the second's checkpoint (saved by
 * T = 2 x P = 2 x D = 2 ranks, each holding slices of a stage) lists whole tensors under Hugging
 * Face's names. */
static void test_bert_configs(void)
{
    const char *repo = dt_test_repo_dir("configs"), *tmp = dt_test_tmpdir();
    struct {
        const char *config, *more, *needle;
    } runs[2] = {
        {"bert-mlm.ini", "train.steps=60 train.eval_every=30 checkpoint.every=0",
         "masked-LM samples (0.15 masked, sentence pairs, vocabulary 256 + 4)"},
        {"bert-tp2-pp2.ini", "train.steps=20 train.eval_every=20 checkpoint.every=20",
         "layout: data 2 x tensor 2 x pipeline 2"},
    };
    for (int k = 0; k < 2; k++) {
        const char *dir = dt_test_fmt("%s/run%d", tmp, k);
        char *out = NULL;
        int rc = dt_test_run(dt_test_fmt("cd '%s' && %s --standalone --max-restarts=0 configs/%s "
                                         "job.device=cpu %s job.output_dir=%s 2>&1",
                                         repo, dt_test_dtrain_bin(), runs[k].config,
                                         runs[k].more, dir),
                             &out, 240);
        DT_CHECK_MSG(rc == 0, "%s: exit %d: %.3000s", runs[k].config, rc, out ? out : "");
        if (out)
            DT_CHECK_CONTAINS(out, runs[k].needle);
        free(out);
        double first, last;
        first_last_loss(dir, &first, &last);
        printf("    %s: loss %.4f -> %.4f\n", runs[k].config, first, last);
        DT_CHECK_MSG(first > 5.5 && last < first - 0.5, "%s: loss %g -> %g", runs[k].config,
                     first, last);
    }
    char *show = NULL;
    int rc = dt_test_run(dt_test_fmt("%s ckpt show %s/run1/checkpoints/step_20 2>&1",
                                     dt_test_dtrain_bin(), tmp),
                         &show, 60);
    DT_CHECK_INT(rc, 0);
    if (show) {
        DT_CHECK_CONTAINS(show, "bert.embeddings.word_embeddings.weight  F32  [260, 128]");
        DT_CHECK_CONTAINS(show, "bert.encoder.layer.3.intermediate.dense.weight  F32  [512, 128]");
        DT_CHECK_CONTAINS(show, "bert.encoder.layer.3.output.dense.weight  F32  [128, 512]");
        DT_CHECK_CONTAINS(show, "cls.predictions.bias  F32  [260]");
        DT_CHECK_CONTAINS(show, "cls.seq_relationship.weight  F32  [2, 128]");
        DT_CHECK_CONTAINS(show, "bert.pooler.dense.weight  F32  [128, 128]");
    }
    free(show);
}

static const dt_test tests[] = {
    {"bert_reference", test_bert_reference, 120},
    {"bert_reference_nsp", test_bert_reference_nsp, 120},
    {"bert_padding", test_bert_padding, 0},
    {"bert_table", test_bert_table, 0},
    {"bert_base_count", test_bert_base_count, 60},
    {"bert_configs", test_bert_configs, 300},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_bert", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
