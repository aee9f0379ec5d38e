/* bench_kernels.c - `dtrain bench kernels`: GFLOP/s of every GEMM-bound op of a backend beside
 * the plain cblas_sgemm rate of this machine, measured in the same run.
 *
 * Each op runs on shapes taken from the model zoo (gpt-tiny, a GPT-2 124M layer, CIFAR ResNet
 * stages) until --min-time has passed; GFLOP/s is the FLOPs its GEMMs execute divided by the
 * wall time of the WHOLE op (softmax, im2col and bias included), so "vs sgemm" is what the op
 * delivers against what the BLAS does on a large square product. "gemm%" is the share of the
 * op's time spent inside its GEMM calls (from the backend's profiler). Causal attention only
 * computes the blocks on or below the diagonal; the FLOPs counted are those executed.
 *
 * Times are the FASTEST call of the repetitions, timed with the backend's profiler off (the
 * FLOPs and gemm% come from separate profiled calls), and the sgemm reference the best of its
 * runs before and after the ops, on one thread in the calling thread's CPU time (bench_now): on a
 * shared machine the mean wall time measures the neighbours' load, which comes and goes within
 * one run, while the best call is what the kernel does. The first line
 * names the OpenBLAS kernel and how it was chosen (cmd/blas_boot.h); --blas-kernels adds the
 * sgemm rate of every kernel of the library this CPU runs, each forced in a helper process
 * (OpenBLAS's default, dtrain's choice and each OPENBLAS_CORETYPE), checked against double
 * precision, timed on one thread's CPU time.
 *
 * It ends with whole training steps (forward, backward, AdamW) of zoo models under the profiler:
 * the share of step wall time spent inside GEMM calls (the target for gpt-tiny is at
 * least 70%) and the non-GEMM ops that cost the most.
 */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd/blas_boot.h"
#include "cmd/cmd.h"
#include "common/cpuid.h"
#include "common/env.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_blas.h"
#include "runtime/train/models/model.h"

/* The clock of the op and reference timings: with one thread the GEMMs and the ops run in the
 * calling thread, and its CPU time leaves out the time it waited for a CPU on a shared machine
 * (a neighbour's load comes and goes within one run and would move the ratios); with more
 * threads OpenBLAS's own threads do the work, and wall time it is. */
static bool clock_cpu;
static double bench_now(void)
{
    if (!clock_cpu)
        return dt_now_s();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct bench_opts {
    const char *device;
    int threads;
    double min_time;
    bool quick;
    bool blas_kernels; /* --blas-kernels */
} bench_opts;

/* ------------------------------------------------------------------------------------------ */

/* The best rate of one M x N x K sgemm call over min_time seconds of calls. */
static double sgemm_rate(int M, int N, int K, double min_time)
{
    float *a = calloc((size_t)M * K, sizeof(float)), *b = calloc((size_t)K * N, sizeof(float));
    float *c = calloc((size_t)M * N, sizeof(float));
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0;
    }
    for (size_t i = 0; i < (size_t)M * K; i++)
        a[i] = (float)(i % 7) * 0.01f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        b[i] = (float)(i % 5) * 0.01f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    double best = 0, t_start = bench_now();
    do {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c,
                    N);
        double t = bench_now() - t0;
        if (t > 0 && 2.0 * M * N * K / t > best)
            best = 2.0 * M * N * K / t;
    } while (bench_now() - t_start < min_time);
    free(a);
    free(b);
    free(c);
    return best / 1e9;
}

/* One op on one shape: a closure over backend buffers. */
typedef struct op_case {
    const char *op;    /* matmul_fwd ... */
    char shape[64];
    void (*run)(dt_backend *be, struct op_case *c);
    int a[8];           /* shape parameters */
    dt_conv2d_shape cs; /* conv */
    float *buf[8];      /* backend buffers */
} op_case;

static void run_matmul_fwd(dt_backend *be, op_case *c)
{
    be->matmul_fwd(be, c->buf[2], c->buf[0], c->buf[1], c->buf[3], c->a[0], c->a[1], c->a[2]);
}

static void run_matmul_bwd(dt_backend *be, op_case *c)
{
    be->matmul_bwd(be, c->buf[4], c->buf[5], c->buf[6], c->buf[2], c->buf[0], c->buf[1], c->a[0],
                   c->a[1], c->a[2]);
}

static void run_attn_fwd(dt_backend *be, op_case *c)
{
    be->attention_fwd(be, c->buf[1], c->buf[2], c->buf[0], c->a[0], c->a[1], c->a[2], c->a[3]);
}

static void run_attn_bwd(dt_backend *be, op_case *c)
{
    be->attention_bwd(be, c->buf[3], c->buf[4], c->buf[1], c->buf[0], c->buf[2], c->a[0], c->a[1],
                      c->a[2], c->a[3]);
}

static void run_conv_fwd(dt_backend *be, op_case *c)
{
    be->conv2d_fwd(be, c->buf[2], c->buf[0], c->buf[1], NULL, &c->cs);
}

static void run_conv_bwd(dt_backend *be, op_case *c)
{
    be->conv2d_bwd(be, c->buf[3], c->buf[4], NULL, c->buf[2], c->buf[0], c->buf[1], &c->cs);
}

static int alloc_filled(dt_backend *be, float **p, size_t n, dt_rng *r, dt_err *err)
{
    int rc = be->alloc(be, (void **)p, n * sizeof(float), err);
    if (rc)
        return rc;
    float *h = malloc(n * sizeof(float));
    if (!h)
        return dt_err_set(err, -ENOMEM, "bench: out of host memory");
    for (size_t i = 0; i < n; i++)
        h[i] = dt_rng_uniform(r) * 2.0f - 1.0f;
    be->memcpy_h2d(be, *p, h, n * sizeof(float));
    free(h);
    return 0;
}

static void free_case(dt_backend *be, op_case *c)
{
    for (int i = 0; i < 8; i++) {
        be->free(be, c->buf[i]);
        c->buf[i] = NULL;
    }
}

/* Allocates the buffers of a case. */
static int setup_case(dt_backend *be, op_case *c, dt_err *err)
{
    dt_rng r;
    dt_rng_seed(&r, 1);
    size_t n[8] = {0};
    if (!strncmp(c->op, "matmul", 6)) {
        size_t N = c->a[0], C = c->a[1], OC = c->a[2];
        size_t sizes[7] = {N * C, OC * C, N * OC, OC, N * C, OC * C, OC};
        memcpy(n, sizes, sizeof sizes);
    } else if (!strncmp(c->op, "attention", 9)) {
        size_t B = c->a[0], T = c->a[1], C = c->a[2], att = 0, datt = 0;
        be->attention_sizes(be, c->a[0], c->a[1], c->a[2], c->a[3], &att, &datt);
        size_t sizes[5] = {B * T * 3 * C, B * T * C, att, B * T * 3 * C, datt};
        memcpy(n, sizes, sizeof sizes);
    } else {
        const dt_conv2d_shape *s = &c->cs;
        size_t in = (size_t)s->N * s->C * s->H * s->W, w = (size_t)s->K * s->C * s->R * s->S;
        size_t out = (size_t)s->N * s->K * s->P * s->Q;
        size_t sizes[5] = {in, w, out, in, w};
        memcpy(n, sizes, sizeof sizes);
    }
    for (int i = 0; i < 8; i++)
        if (n[i]) {
            int rc = alloc_filled(be, &c->buf[i], n[i], &r, err);
            if (rc) {
                free_case(be, c);
                return rc;
            }
        }
    if (!strcmp(c->op, "attention_bwd")) /* bwd needs real probabilities */
        be->attention_fwd(be, c->buf[1], c->buf[2], c->buf[0], c->a[0], c->a[1], c->a[2],
                          c->a[3]);
    return 0;
}

static void add_matmul(op_case *cs, int *n, const char *what, int N, int C, int OC)
{
    for (int bwd = 0; bwd < 2; bwd++) {
        op_case *c = &cs[(*n)++];
        memset(c, 0, sizeof *c);
        c->op = bwd ? "matmul_bwd" : "matmul_fwd";
        c->run = bwd ? run_matmul_bwd : run_matmul_fwd;
        c->a[0] = N;
        c->a[1] = C;
        c->a[2] = OC;
        snprintf(c->shape, sizeof c->shape, "%s N=%d C=%d OC=%d", what, N, C, OC);
    }
}

static void add_attention(op_case *cs, int *n, const char *what, int B, int T, int C, int NH)
{
    for (int bwd = 0; bwd < 2; bwd++) {
        op_case *c = &cs[(*n)++];
        memset(c, 0, sizeof *c);
        c->op = bwd ? "attention_bwd" : "attention_fwd";
        c->run = bwd ? run_attn_bwd : run_attn_fwd;
        c->a[0] = B;
        c->a[1] = T;
        c->a[2] = C;
        c->a[3] = NH;
        snprintf(c->shape, sizeof c->shape, "%s B=%d T=%d C=%d NH=%d", what, B, T, C, NH);
    }
}

static void add_conv(op_case *cs, int *n, const char *what, int N, int C, int H, int K, int R,
                     int stride)
{
    for (int bwd = 0; bwd < 2; bwd++) {
        op_case *c = &cs[(*n)++];
        memset(c, 0, sizeof *c);
        c->op = bwd ? "conv2d_bwd" : "conv2d_fwd";
        c->run = bwd ? run_conv_bwd : run_conv_fwd;
        dt_conv2d_shape_init(&c->cs, N, C, H, H, K, R, R, stride, R / 2);
        snprintf(c->shape, sizeof c->shape, "%s N=%d %dx%dx%d K=%d %dx%d/%d", what, N, C, H, H,
                 K, R, R, stride);
    }
}

/* Runs a case until min_time has passed; fills seconds of its fastest call, executed GFLOP per
 * call and the share of its time in GEMM, from the profiler. */
static void time_case(dt_backend *be, op_case *c, double min_time, double *sec, double *gflop,
                      double *gemm_share)
{
    c->run(be, c); /* warm-up: scratch, caches */
    be->synchronize(be);
    int reps = 0;
    double t0 = bench_now(), best = 0;
    do {
        double t1 = bench_now();
        c->run(be, c);
        be->synchronize(be);
        double t = bench_now() - t1;
        best = reps == 0 || t < best ? t : best;
        reps++;
    } while (bench_now() - t0 < min_time);
    /* the FLOPs and the GEMM share from a few calls under the profiler, apart from the timed
     * ones: its clock reads (per tile in the attention) would slow the op by up to 10% */
    if (be->profile_enable)
        be->profile_enable(be, true);
    reps = 0;
    t0 = bench_now();
    do {
        c->run(be, c);
        be->synchronize(be);
        reps++;
    } while (reps < 3 || (reps < 100 && bench_now() - t0 < min_time / 5));
    double flops = 0, gemm_s = 0, all_s = 0;
    if (be->profile_read) {
        dt_op_stat st[128];
        int ns = be->profile_read(be, st, 128);
        for (int i = 0; i < ns && i < 128; i++) {
            flops += st[i].flops;
            all_s += st[i].seconds;
            if (st[i].gemm)
                gemm_s += st[i].seconds;
        }
        be->profile_enable(be, false);
    }
    *sec = best;
    *gflop = flops / reps / 1e9;
    *gemm_share = all_s > 0 ? gemm_s / all_s : 0;
}

/* --blas-kernels: sgemm of every kernel of the library this CPU runs, each in a helper. */
static void blas_kernels_table(void)
{
    static const char *const names[] = {"Prescott", "Core2", "Penryn", "Nehalem", "Sandybridge",
                                        "Haswell", "Zen", "SkylakeX", "Cooperlake",
                                        "SapphireRapids"};
    dt_cpuid id;
    dt_cpuid_read(&id);
    dt_blas_choice ch;
    dt_blas_choose(&ch);
    printf("\nOpenBLAS kernels (each in a helper process: 512^3 sgemm on one thread, checked "
           "against double precision):\n");
    printf("%-32s %-16s %9s %8s %9s %8s\n", "run as", "kernel", "GFLOP/s", "vs best", "max err",
           "probe s");
    struct {
        char label[40];
        dt_blas_probe_out r;
    } rows[16];
    int n = 0;
    double best = 0;
    /* OpenBLAS's own choice (with DTRAIN_BLAS_AS_IF, the kernel it plays), and dtrain's: the
     * one it chose now, or the one it started this process with (DTRAIN_BLAS_CHOICE) */
    const char *as_if = dt_env("DTRAIN_BLAS_AS_IF"), *set = getenv("OPENBLAS_CORETYPE");
    const char *chosen = ch.coretype[0] ? ch.coretype
                         : set && dt_env("DTRAIN_BLAS_CHOICE") ? set : NULL;
    dt_blas_probe(NULL, as_if, 30.0, &rows[n].r);
    snprintf(rows[n++].label, sizeof rows[0].label, "%s", as_if ? "default (as if: AS_IF)"
                                                                : "default (OpenBLAS's own)");
    if (chosen) {
        dt_blas_probe(NULL, chosen, 30.0, &rows[n].r);
        snprintf(rows[n++].label, sizeof rows[0].label, "chosen by dtrain");
    }
    for (size_t i = 0; i < DT_ARRAY_LEN(names); i++) {
        const dt_blas_kernel *k = dt_blas_kernel_find(names[i]);
        if (!k || (k->needs & ~id.features) || !dt_blas_has_kernel(k, NULL))
            continue;
        dt_blas_probe(NULL, k->name, 30.0, &rows[n].r);
        snprintf(rows[n++].label, sizeof rows[0].label, "OPENBLAS_CORETYPE=%s", k->name);
    }
    for (int i = 0; i < n; i++)
        if (rows[i].r.ran && rows[i].r.ok && rows[i].r.gflops > best)
            best = rows[i].r.gflops;
    for (int i = 0; i < n; i++) {
        const dt_blas_probe_out *r = &rows[i].r;
        if (!r->ran)
            printf("%-32s %s\n", rows[i].label, r->why);
        else
            printf("%-32s %-16s %9.1f %7.2fx %9.2g %8.2f%s\n", rows[i].label, r->core,
                   r->gflops, best > 0 ? r->gflops / best : 0.0, r->max_err, r->seconds,
                   r->ok ? "" : "  WRONG RESULTS");
    }
    printf("dtrain's choice: %s\n", chosen ? chosen : "none (OpenBLAS's own)");
    printf("  %s\n", chosen && !ch.coretype[0] ? dt_env("DTRAIN_BLAS_CHOICE") : ch.note);
}

/* ------------------------------------------------------------------------------------------ */
/* whole training steps */

typedef struct step_case {
    const char *what;
    dt_model_config cfg;
    int B;
} step_case;

static int cmp_stat(const void *a, const void *b)
{
    const dt_op_stat *x = a, *y = b;
    return (x->seconds < y->seconds) - (x->seconds > y->seconds);
}

static int run_step_case(dt_backend *be, const step_case *sc, double min_time)
{
    dt_err err = {0};
    dt_model *m = NULL;
    if (dt_model_create(&m, &sc->cfg, be, NULL, &err) != 0) {
        fprintf(stderr, "dtrain bench kernels: %s: %s\n", sc->what, err.msg);
        return 1;
    }
    const dt_sample_shape *sh = &sc->cfg.shape;
    dt_batch b = {.B = sc->B};
    dt_rng r;
    dt_rng_seed(&r, 3);
    size_t ntok = (size_t)sc->B * (sh->kind == DT_SAMPLE_TOKENS ? sh->seq_len : 1);
    int32_t *tok = malloc(ntok * sizeof(int32_t)), *tgt = malloc(ntok * sizeof(int32_t));
    size_t nx = sh->kind == DT_SAMPLE_TOKENS ? 0 : (size_t)sc->B * sh->input_dim;
    float *x = malloc((nx ? nx : 1) * sizeof(float));
    float *mom = NULL, *var = NULL;
    int rc = 1;
    if (!tok || !tgt || !x)
        goto out;
    for (size_t i = 0; i < ntok; i++) {
        int lim = sh->kind == DT_SAMPLE_TOKENS ? sh->vocab_size : sh->n_classes;
        tok[i] = (int32_t)dt_rng_below(&r, (uint64_t)lim);
        tgt[i] = (int32_t)dt_rng_below(&r, (uint64_t)lim);
    }
    for (size_t i = 0; i < nx; i++)
        x[i] = dt_rng_uniform(&r);
    if (sh->kind == DT_SAMPLE_TOKENS) {
        b.T = sh->seq_len;
        b.tokens = tok;
    } else {
        b.x = x;
    }
    b.targets = tgt;
    if (be->alloc(be, (void **)&mom, m->num_params * sizeof(float), &err) ||
        be->alloc(be, (void **)&var, m->num_params * sizeof(float), &err)) {
        fprintf(stderr, "dtrain bench kernels: %s: %s\n", sc->what, err.msg);
        goto out;
    }
    int steps = 0;
    double t0 = 0, elapsed = 0;
    float loss = 0;
    for (int warm = 1; warm >= 0; warm--) {
        if (!warm) {
            be->profile_enable(be, true);
            t0 = dt_now_s();
        }
        do {
            be->memset_zero(be, m->grads, m->num_params * sizeof(float));
            if (m->ops->forward(m, &b, true, &loss, &err) ||
                m->ops->backward(m, 1.0f, NULL, NULL, &err)) {
                fprintf(stderr, "dtrain bench kernels: %s: %s\n", sc->what, err.msg);
                goto out;
            }
            be->adamw_update(be, m->params, m->grads, mom, var, m->num_params, 1e-4f, 0.9f,
                             0.95f, 1e-8f, 0.0f, steps + 1);
            be->synchronize(be);
            if (!warm)
                steps++;
            elapsed = dt_now_s() - t0;
        } while (!warm && elapsed < min_time);
    }
    dt_op_stat st[128];
    int ns = be->profile_read(be, st, 128);
    if (ns > 128)
        ns = 128;
    be->profile_enable(be, false);
    double gemm = 0, flops = 0;
    for (int i = 0; i < ns; i++) {
        if (st[i].gemm)
            gemm += st[i].seconds;
        flops += st[i].flops;
    }
    double step_s = elapsed / steps;
    printf("%-34s %9.1f %10.0f %9.1f %7.0f%%   ", sc->what, step_s * 1e3, sc->B / step_s,
           flops / elapsed / 1e9, 100.0 * gemm / elapsed);
    qsort(st, (size_t)ns, sizeof st[0], cmp_stat);
    int shown = 0;
    for (int i = 0; i < ns && shown < 3; i++)
        if (!st[i].gemm && st[i].seconds > 0) {
            printf("%s%s %.0f%%", shown ? ", " : "", st[i].name, 100.0 * st[i].seconds / elapsed);
            shown++;
        }
    printf("\n");
    fflush(stdout);
    rc = 0;
out:
    be->free(be, mom);
    be->free(be, var);
    dt_model_free(m);
    free(tok);
    free(tgt);
    free(x);
    return rc;
}

static step_case gpt_step(const char *what, int L, int NH, int C, int T, int V, int B)
{
    step_case s;
    memset(&s, 0, sizeof s);
    s.what = what;
    s.cfg.arch = DT_ARCH_GPT;
    s.cfg.n_layer = L;
    s.cfg.n_head = NH;
    s.cfg.n_embd = C;
    s.cfg.block_size = T;
    s.cfg.shape.kind = DT_SAMPLE_TOKENS;
    s.cfg.shape.seq_len = T;
    s.cfg.shape.vocab_size = V;
    s.cfg.max_batch = B;
    s.cfg.seed = 1;
    s.B = B;
    return s;
}

static int run_steps(dt_backend *be, const bench_opts *o)
{
    step_case cases[4];
    int n = 0;
    if (o->quick) {
        cases[n++] = gpt_step("gpt L2 C64 T32 B4", 2, 2, 64, 32, 256, 4);
    } else {
        cases[n++] = gpt_step("gpt-tiny T64 B8 (quickstart)", 4, 4, 128, 64, 256, 8);
        cases[n++] = gpt_step("gpt-tiny T128 B8", 4, 4, 128, 128, 256, 8);
        step_case rn;
        memset(&rn, 0, sizeof rn);
        rn.what = "resnet-20 w16 CIFAR B32";
        rn.cfg.arch = DT_ARCH_RESNET;
        rn.cfg.depth = 20;
        rn.cfg.width = 16;
        rn.cfg.shape = (dt_sample_shape){.kind = DT_SAMPLE_IMAGE, .channels = 3, .height = 32,
                                         .width = 32, .input_dim = 3072, .n_classes = 10};
        rn.cfg.max_batch = rn.B = 32;
        rn.cfg.bn_momentum = 0.1f;
        rn.cfg.bn_eps = 1e-5f;
        cases[n++] = rn;
        step_case mlp;
        memset(&mlp, 0, sizeof mlp);
        mlp.what = "mlp 784-512-256-10 B128";
        mlp.cfg.arch = DT_ARCH_MLP;
        mlp.cfg.n_hidden = 2;
        mlp.cfg.hidden[0] = 512;
        mlp.cfg.hidden[1] = 256;
        mlp.cfg.shape = (dt_sample_shape){.kind = DT_SAMPLE_VECTOR, .input_dim = 784,
                                          .n_classes = 10};
        mlp.cfg.max_batch = mlp.B = 128;
        cases[n++] = mlp;
    }
    printf("\ntraining step (forward, backward, AdamW), profiled:\n");
    printf("%-34s %9s %10s %9s %8s   %s\n", "model", "ms/step", "samples/s", "GFLOP/s", "GEMM",
           "largest non-GEMM ops (share of step)");
    for (int i = 0; i < n; i++)
        if (run_step_case(be, &cases[i], o->min_time * 2))
            return 1;
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench kernels [--device cpu|cuda] [--threads N] [--min-time S] "
            "[--quick]\n"
            "                            [--blas-kernels]\n\n"
            "GFLOP/s of the GEMM-bound ops (matmul, attention, conv2d; forward and backward) on\n"
            "shapes from the model zoo, beside the plain cblas_sgemm rate of this machine, then\n"
            "the share of GEMM time in whole training steps of zoo models.\n\n"
            "  --device D     backend to measure (default cpu)\n"
            "  --threads N    BLAS threads (default 1, as one worker uses)\n"
            "  --min-time S   seconds per measurement (default 0.5)\n"
            "  --quick        small shapes only, short measurements (for tests)\n"
            "  --blas-kernels also the sgemm rate of every OpenBLAS kernel this CPU runs, each\n"
            "                 forced in a helper process (OPENBLAS_CORETYPE), and dtrain's\n"
            "                 choice\n");
}

int dt_bench_kernels(int argc, char **argv)
{
    bench_opts o = {.device = "cpu", .threads = 1, .min_time = 0.5, .quick = false};
    static const struct option longopts[] = {
        {"device", required_argument, NULL, 'd'}, {"threads", required_argument, NULL, 't'},
        {"min-time", required_argument, NULL, 'm'}, {"quick", no_argument, NULL, 'q'},
        {"blas-kernels", no_argument, NULL, 'b'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'd':
            o.device = optarg;
            break;
        case 't':
            if (dt_parse_int(optarg, &o.threads) != 0 || o.threads < 1) {
                fprintf(stderr, "dtrain bench kernels: --threads wants a positive integer\n");
                return 2;
            }
            break;
        case 'm':
            if (dt_parse_double(optarg, &o.min_time) != 0 || o.min_time <= 0) {
                fprintf(stderr, "dtrain bench kernels: --min-time wants seconds > 0\n");
                return 2;
            }
            break;
        case 'q':
            o.quick = true;
            break;
        case 'b':
            o.blas_kernels = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dtrain bench kernels: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (o.quick && o.min_time == 0.5)
        o.min_time = 0.05;

    dt_backend_opts bo;
    dt_backend_opts_default(&bo);
    bo.threads = o.threads;
    dt_backend *be = NULL;
    dt_err err = {0};
    dt_backend_kind kind;
    if (dt_backend_kind_parse(o.device, &kind, &err) != 0 ||
        dt_backend_open(&be, kind, &bo, &err) != 0) {
        fprintf(stderr, "dtrain bench kernels: %s\n", err.msg);
        return 1;
    }

    /* the reference: plain sgemm on a large square product, same thread count */
    openblas_set_num_threads(o.threads);
    clock_cpu = o.threads == 1;
    int sq = o.quick ? 256 : 1024;
    double peak = sgemm_rate(sq, sq, sq, o.min_time);
    char blas[1200];
    dt_blas_describe(blas, sizeof blas, false);
    printf("dtrain bench kernels: device %s, %d thread%s\n", be->name, o.threads,
           o.threads == 1 ? "" : "s");
    printf("BLAS: %s\n", blas);
    printf("plain cblas_sgemm %dx%dx%d on the %s kernel: %.1f GFLOP/s (the reference for \"vs "
           "sgemm\")\n\n",
           sq, sq, sq, dt_blas_corename(), peak);

    op_case cases[32];
    int n = 0;
    if (o.quick) {
        add_matmul(cases, &n, "small", 256, 64, 192);
        add_attention(cases, &n, "small", 2, 64, 64, 2);
        add_conv(cases, &n, "small", 4, 8, 16, 8, 3, 1);
    } else {
        add_matmul(cases, &n, "gpt-tiny qkv", 1024, 128, 384);
        add_matmul(cases, &n, "gpt-tiny fc", 1024, 128, 512);
        add_matmul(cases, &n, "gpt-tiny proj", 1024, 512, 128);
        add_matmul(cases, &n, "gpt2 fc", 1024, 768, 3072);
        add_attention(cases, &n, "gpt-tiny", 8, 128, 128, 4);
        add_attention(cases, &n, "gpt2", 1, 1024, 768, 12);
        add_conv(cases, &n, "resnet s1", 32, 16, 32, 16, 3, 1);
        add_conv(cases, &n, "resnet s2", 32, 32, 16, 32, 3, 1);
        add_conv(cases, &n, "resnet s3", 32, 64, 8, 64, 3, 1);
    }

    printf("%-14s %-36s %10s %9s %9s %6s\n", "op", "shape", "ms/call", "GFLOP/s", "vs sgemm",
           "gemm%");
    int rc = 0;
    for (int i = 0; i < n; i++) {
        op_case *c = &cases[i];
        if (setup_case(be, c, &err) != 0) {
            fprintf(stderr, "dtrain bench kernels: %s: %s\n", c->op, err.msg);
            rc = 1;
            break;
        }
        double sec, gflop, share;
        time_case(be, c, o.min_time, &sec, &gflop, &share);
        double rate = gflop / sec;
        printf("%-14s %-36s %10.3f %9.1f %8.2fx %5.0f%%\n", c->op, c->shape, sec * 1e3, rate,
               peak > 0 ? rate / peak : 0.0, share * 100);
        fflush(stdout);
        free_case(be, c);
    }
    double again = sgemm_rate(sq, sq, sq, o.min_time);
    if (!rc)
        printf("(plain cblas_sgemm again after the ops: %.1f GFLOP/s%s)\n", again,
               again > peak * 1.1 ? "; the machine was busier at the start: ratios are low" : "");
    if (!rc && o.blas_kernels)
        blas_kernels_table();
    if (!rc && be->profile_enable && be->profile_read)
        rc = run_steps(be, &o);
    be->close(be);
    return rc;
}
