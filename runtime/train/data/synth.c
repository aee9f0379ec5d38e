/* synth.c - synthetic teachers and their samples (see synth.h). */
#include "runtime/train/data/synth.h"

#include <math.h>
#include <stdlib.h>

#include "common/util.h"

#define SYN_SAMPLE_SALT 0x5a4d504c45535eedull /* stream of the samples */
#define SYN_TEACHER_SALT 0x7eac4e5ull         /* stream of the teacher */
#define SYN_VEC_HIDDEN 32
#define SYN_IMG_GRID 4    /* prototypes are smooth: bilinear from a 4x4 grid */
#define SYN_IMG_SHIFT 4   /* samples are prototypes shifted by up to this many pixels */
#define SYN_IMG_NOISE 2.0f

static void syn_vec_logits(const dt_synth *s, const float *x, float *logits)
{
    float h[SYN_VEC_HIDDEN];
    for (int j = 0; j < SYN_VEC_HIDDEN; j++) {
        const float *w = s->w1 + (size_t)j * (size_t)s->dim;
        double a = s->b1[j];
        for (int i = 0; i < s->dim; i++)
            a += (double)w[i] * x[i];
        h[j] = tanhf((float)a);
    }
    for (int k = 0; k < s->classes; k++) {
        double a = s->bias2[k];
        for (int j = 0; j < SYN_VEC_HIDDEN; j++)
            a += (double)s->w2[k * SYN_VEC_HIDDEN + j] * h[j];
        logits[k] = (float)a;
    }
}

int dt_synth_vec_label(const dt_synth *s, const float *x, float *logits)
{
    syn_vec_logits(s, x, logits);
    int best = 0;
    for (int k = 1; k < s->classes; k++)
        if (logits[k] > logits[best])
            best = k;
    return best;
}

/* A random two-layer teacher, its output biases set so that the classes are about equally
 * frequent (an argmax over random projections favours a few classes otherwise). */
int dt_synth_vec_init(dt_synth *s, dt_err *err)
{
    size_t D = (size_t)s->dim, K = (size_t)s->classes;
    s->w1 = malloc(sizeof(float) * SYN_VEC_HIDDEN * D);
    s->b1 = malloc(sizeof(float) * SYN_VEC_HIDDEN);
    s->w2 = malloc(sizeof(float) * K * SYN_VEC_HIDDEN);
    s->bias2 = calloc(K, sizeof(float));
    float *x = malloc(sizeof(float) * D), *lg = malloc(sizeof(float) * K);
    double *mean = calloc(K, sizeof(double));
    int rc = 0;
    if (!s->w1 || !s->b1 || !s->w2 || !s->bias2 || !x || !lg || !mean) {
        rc = dt_err_set(err, -ENOMEM, "out of memory for the synthetic teacher (%d features)",
                        s->dim);
        goto out;
    }
    dt_rng r;
    dt_rng_seed2(&r, s->seed, SYN_TEACHER_SALT);
    dt_rng_fill_normal(&r, s->w1, SYN_VEC_HIDDEN * D, 0.0f, 1.5f / sqrtf((float)D));
    dt_rng_fill_normal(&r, s->b1, SYN_VEC_HIDDEN, 0.0f, 0.1f);
    dt_rng_fill_normal(&r, s->w2, K * SYN_VEC_HIDDEN, 0.0f, 1.0f);
    enum { PROBE = 2048 };
    for (int i = 0; i < PROBE; i++) {
        dt_rng_fill_normal(&r, x, D, 0.0f, 1.0f);
        syn_vec_logits(s, x, lg);
        for (size_t k = 0; k < K; k++)
            mean[k] += lg[k] / PROBE;
    }
    for (size_t k = 0; k < K; k++)
        s->bias2[k] = (float)-mean[k];
out:
    free(x);
    free(lg);
    free(mean);
    return rc;
}

int dt_synth_img_init(dt_synth *s, dt_err *err)
{
    size_t plane = (size_t)s->H * (size_t)s->W, per = (size_t)s->C * plane;
    s->proto = malloc(sizeof(float) * per * (size_t)s->classes);
    if (!s->proto)
        return dt_err_set(err, -ENOMEM, "out of memory for the synthetic prototypes");
    dt_rng r;
    dt_rng_seed2(&r, s->seed, SYN_TEACHER_SALT);
    float grid[SYN_IMG_GRID * SYN_IMG_GRID];
    for (int k = 0; k < s->classes; k++)
        for (int c = 0; c < s->C; c++) {
            dt_rng_fill_normal(&r, grid, DT_ARRAY_LEN(grid), 0.0f, 1.0f);
            float *out = s->proto + (size_t)k * per + (size_t)c * plane;
            for (int h = 0; h < s->H; h++)
                for (int w = 0; w < s->W; w++) {
                    /* bilinear, periodic, so that shifted prototypes stay smooth */
                    float gy = (float)h * SYN_IMG_GRID / (float)s->H;
                    float gx = (float)w * SYN_IMG_GRID / (float)s->W;
                    int y0 = (int)gy, x0 = (int)gx;
                    float fy = gy - (float)y0, fx = gx - (float)x0;
                    int y1 = (y0 + 1) % SYN_IMG_GRID, x1 = (x0 + 1) % SYN_IMG_GRID;
                    out[h * s->W + w] = (1 - fy) * ((1 - fx) * grid[y0 * SYN_IMG_GRID + x0] +
                                                    fx * grid[y0 * SYN_IMG_GRID + x1]) +
                                        fy * ((1 - fx) * grid[y1 * SYN_IMG_GRID + x0] +
                                              fx * grid[y1 * SYN_IMG_GRID + x1]);
                }
        }
    return 0;
}

void dt_synth_sample_rng(const dt_synth *s, int64_t idx, dt_rng *r)
{
    dt_rng_seed2(r, s->seed ^ SYN_SAMPLE_SALT, (uint64_t)idx);
}

/* Synthetic token sequences: t0, t1 uniform; then each next token is one of four successors of
 * the two before it (a hash), with probabilities 0.6, 0.2, 0.1, 0.1. The best possible loss is
 * the entropy of that choice, about 1.09 nats, against ln(V) for a model that learnt nothing. */
static uint32_t syn_successor(const dt_synth *s, uint32_t a, uint32_t b, int j)
{
    uint64_t x = (((uint64_t)a * (uint64_t)s->vocab + b) << 2 | (uint64_t)j) ^ s->seed;
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)(x % (uint64_t)s->vocab);
}

void dt_synth_tokens(const dt_synth *s, int64_t idx, int32_t *seq /* (T+1) */)
{
    dt_rng r;
    dt_synth_sample_rng(s, idx, &r);
    seq[0] = (int32_t)dt_rng_below(&r, (uint64_t)s->vocab);
    seq[1] = (int32_t)dt_rng_below(&r, (uint64_t)s->vocab);
    for (int t = 2; t <= s->T; t++) {
        float u = dt_rng_uniform(&r);
        int j = u < 0.6f ? 0 : u < 0.8f ? 1 : u < 0.9f ? 2 : 3;
        seq[t] = (int32_t)syn_successor(s, (uint32_t)seq[t - 2], (uint32_t)seq[t - 1], j);
    }
}

void dt_synth_free(dt_synth *s)
{
    free(s->w1);
    free(s->b1);
    free(s->w2);
    free(s->bias2);
    free(s->proto);
    s->w1 = s->b1 = s->w2 = s->bias2 = s->proto = NULL;
}

int dt_synth_example(const dt_synth *y, bool image, int64_t idx, float *x, int32_t *label,
                     dt_err *err)
{
    const size_t plane = (size_t)y->H * (size_t)y->W;
    dt_rng r;
    dt_synth_sample_rng(y, idx, &r);
    if (!image) {
        float logits[64], *lg = logits;
        if (y->classes > 64 && !(lg = malloc(sizeof(float) * (size_t)y->classes)))
            return dt_err_set(err, -ENOMEM, "out of memory generating a synthetic sample");
        dt_rng_fill_normal(&r, x, (size_t)y->dim, 0.0f, 1.0f);
        *label = dt_synth_vec_label(y, x, lg);
        if (lg != logits)
            free(lg);
        return 0;
    }
    /* image: a prototype, shifted circularly, plus noise */
    int k = (int)dt_rng_below(&r, (uint64_t)y->classes);
    int dy = (int)dt_rng_below(&r, 2 * SYN_IMG_SHIFT + 1) - SYN_IMG_SHIFT;
    int dx = (int)dt_rng_below(&r, 2 * SYN_IMG_SHIFT + 1) - SYN_IMG_SHIFT;
    const float *proto = y->proto + (size_t)k * (size_t)y->C * plane;
    for (int c = 0; c < y->C; c++)
        for (int h = 0; h < y->H; h++)
            for (int w = 0; w < y->W; w++) {
                int sh = ((h + dy) % y->H + y->H) % y->H, sw = ((w + dx) % y->W + y->W) % y->W;
                x[(size_t)c * plane + (size_t)h * y->W + w] =
                    proto[(size_t)c * plane + (size_t)sh * y->W + sw] +
                    SYN_IMG_NOISE * dt_rng_normal(&r);
            }
    *label = k;
    return 0;
}
