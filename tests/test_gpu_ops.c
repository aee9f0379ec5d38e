/* test_gpu_ops.c - every op of the CUDA backend against the CPU reference on the same inputs,
 * the device arena, the VMM-backed allocations behind mem_release / mem_commit (gpu_vmm,
 * gpu_vmm_off), profiling, and the NCCL comm backend.
 *
 * Each test opens both backends, uploads the same random tensors to each, runs the op on both
 * and compares: relative L2 error ||gpu - cpu|| / ||cpu|| <= tol and max |gpu - cpu| <=
 * 10 tol max |cpu|. Backward ops start from random gradients (they accumulate) and the
 * comparison is on what the op added. Tolerances per precision (GEMM-bound ops; everything else
 * is fp32 in every mode):
 *
 *     fp32  2e-5   (summation order only: cuBLAS/cuDNN vs OpenBLAS/im2col)
 *     fp16  4e-3   (operands rounded to 11 significant bits)
 *     bf16  2e-2   (operands rounded to 8 significant bits)
 *
 * Without a usable GPU (no libdtrain_cuda.so, no driver, no device) every GPU test is skipped
 * with the reason, found once by running this binary as a helper (`--probe-gpu`) so that the
 * test runner itself never initialises CUDA; with DTRAIN_REQUIRE_GPU=1 (make test-gpu) they
 * fail instead. gpu_library_symbols needs no GPU: it checks that libdtrain_cuda.so loads with
 * every symbol resolved and exports the backend and NCCL entry points. gpu_build_probe needs
 * none either: the Makefile's cuDNN/NCCL probe skips the CUDA backend with the reason (instead
 * of failing the build) when nvcc is there but either library is not.
 *
 * gpu_model_*: whole models (GPT, BERT, Llama, MLP, ResNet) built on both backends from one seed:
 * the loss and every tensor's gradient, CPU against CUDA, before and after moving the parameters
 * off their initialisation. */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "runtime/comm/comm_impl.h"
#include "runtime/train/models/model.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

static char gpu_skip[1024]; /* why the GPU tests skip; empty when a GPU is usable */
static int gpu_count;

/* ---- the probe (runs in a helper process) ------------------------------------------------ */

static int probe_main(void)
{
    dt_err e = {0};
    dt_backend *be = NULL;
    if (dt_backend_open(&be, DT_BACKEND_CUDA, NULL, &e) != 0) {
        printf("NOGPU %s\n", e.msg);
        return 0;
    }
    dt_backend_close(be);
    int n = 1;
    for (int d = 1; d < 64; d++) { /* count devices through the backend itself */
        dt_backend_opts o;
        dt_backend_opts_default(&o);
        o.device_index = d;
        if (dt_backend_open(&be, DT_BACKEND_CUDA, &o, &e) != 0)
            break;
        dt_backend_close(be);
        n++;
    }
    printf("GPUS %d\n", n);
    return 0;
}

static void probe(void)
{
    char self[PATH_MAX], cmd[PATH_MAX + 32], *out = NULL;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(gpu_skip, sizeof gpu_skip, "cannot find the test binary to probe the GPU");
        return;
    }
    self[n] = '\0';
    snprintf(cmd, sizeof cmd, "'%s' --probe-gpu", self);
    int rc = dt_test_run(cmd, &out, 120);
    const char *line = out ? strstr(out, "GPUS ") : NULL;
    const char *no = out ? strstr(out, "NOGPU ") : NULL;
    if (rc == 0 && line) {
        gpu_count = atoi(line + 5);
    } else if (rc == 0 && no) {
        snprintf(gpu_skip, sizeof gpu_skip, "no usable GPU: %s", no + 6);
        char *nl = strchr(gpu_skip, '\n');
        if (nl)
            *nl = '\0';
    } else {
        snprintf(gpu_skip, sizeof gpu_skip, "GPU probe failed (exit %d): %.300s", rc,
                 out ? out : "");
    }
    free(out);
}

static void require_gpu(void)
{
    if (!gpu_skip[0])
        return;
    const char *req = dt_env("DTRAIN_REQUIRE_GPU");
    if (req && !strcmp(req, "1")) {
        DT_CHECK_MSG(0, "DTRAIN_REQUIRE_GPU=1 but %s", gpu_skip);
        dt_test_stop();
    }
    DT_SKIP(gpu_skip);
}

/* ---- helpers ----------------------------------------------------------------------------- */

typedef struct ctx {
    dt_backend *cpu, *gpu;
    dt_rng rng;
    dt_precision prec;
} ctx;

static const char *prec_name(dt_precision p)
{
    return p == DT_PREC_BF16 ? "bf16" : p == DT_PREC_FP16 ? "fp16" : "fp32";
}

static double gemm_tol(dt_precision p)
{
    return p == DT_PREC_BF16 ? 2e-2 : p == DT_PREC_FP16 ? 4e-3 : 2e-5;
}

#define TOL32 2e-5

static void ctx_open(ctx *c, dt_precision prec)
{
    require_gpu();
    dt_err e = {0};
    dt_backend_opts o;
    dt_backend_opts_default(&o);
    o.precision = prec;
    DT_REQUIRE_OK(dt_backend_open(&c->gpu, DT_BACKEND_CUDA, &o, &e), &e);
    dt_backend_opts_default(&o);
    DT_REQUIRE_OK(dt_cpu_backend_create(&c->cpu, &o, &e), &e);
    dt_rng_seed(&c->rng, 20240520);
    c->prec = prec;
}

static void ctx_close(ctx *c)
{
    dt_backend_close(c->gpu);
    dt_backend_close(c->cpu);
}

/* A tensor held three times: host (h), CPU backend (c), CUDA backend (g). */
typedef struct tp {
    size_t n;
    float *h, *c, *g;
} tp;

static void *dalloc(dt_backend *be, size_t bytes)
{
    void *p = NULL;
    dt_err e = {0};
    DT_REQUIRE_OK(be->alloc(be, &p, bytes ? bytes : 4, &e), &e);
    return p;
}

/* std > 0: normal(0, std); std == 0: zeros. Same values on both backends. */
static tp tp_new(ctx *x, size_t n, float std)
{
    tp t = {n, calloc(n ? n : 1, sizeof(float)), NULL, NULL};
    DT_REQUIRE(t.h);
    if (std > 0)
        dt_rng_fill_normal(&x->rng, t.h, n, 0.0f, std);
    t.c = dalloc(x->cpu, n * sizeof(float));
    t.g = dalloc(x->gpu, n * sizeof(float));
    x->cpu->memcpy_h2d(x->cpu, t.c, t.h, n * sizeof(float));
    x->gpu->memcpy_h2d(x->gpu, t.g, t.h, n * sizeof(float));
    return t;
}

static void tp_upload(ctx *x, tp *t)
{
    x->cpu->memcpy_h2d(x->cpu, t->c, t->h, t->n * sizeof(float));
    x->gpu->memcpy_h2d(x->gpu, t->g, t->h, t->n * sizeof(float));
}

static void tp_free(ctx *x, tp *t)
{
    x->cpu->free(x->cpu, t->c);
    x->gpu->free(x->gpu, t->g);
    free(t->h);
}

/* Integer tensor (tokens, targets) in [lo, hi). */
typedef struct ti {
    size_t n;
    int32_t *h, *c, *g;
} ti;

static ti ti_new(ctx *x, size_t n, int lo, int hi)
{
    ti t = {n, calloc(n ? n : 1, sizeof(int32_t)), NULL, NULL};
    DT_REQUIRE(t.h);
    for (size_t i = 0; i < n; i++)
        t.h[i] = lo + (int32_t)dt_rng_below(&x->rng, (uint64_t)(hi - lo));
    t.c = dalloc(x->cpu, n * sizeof(int32_t));
    t.g = dalloc(x->gpu, n * sizeof(int32_t));
    x->cpu->memcpy_h2d(x->cpu, t.c, t.h, n * sizeof(int32_t));
    x->gpu->memcpy_h2d(x->gpu, t.g, t.h, n * sizeof(int32_t));
    return t;
}

static void ti_upload(ctx *x, ti *t)
{
    x->cpu->memcpy_h2d(x->cpu, t->c, t->h, t->n * sizeof(int32_t));
    x->gpu->memcpy_h2d(x->gpu, t->g, t->h, t->n * sizeof(int32_t));
}

/* Compares the GPU's tensor with the CPU's; base (may be NULL) is subtracted from both first
 * (what an accumulating op added). Elements for which mask(i) is false are skipped (mask may be
 * NULL). */
static void compare(ctx *x, const char *what, const tp *t, const float *base, double tol,
                    bool (*mask)(size_t i, void *arg), void *arg)
{
    float *rc = malloc(t->n * sizeof(float) + 4), *rg = malloc(t->n * sizeof(float) + 4);
    DT_REQUIRE(rc && rg);
    x->cpu->memcpy_d2h(x->cpu, rc, t->c, t->n * sizeof(float));
    x->gpu->memcpy_d2h(x->gpu, rg, t->g, t->n * sizeof(float));
    double num = 0, den = 0, maxd = 0, maxr = 0;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (mask && !mask(i, arg))
            continue;
        double r = rc[i], g = rg[i];
        if (base) {
            r -= base[i];
            g -= base[i];
        }
        if (isfinite(r) != isfinite(g)) {
            bad++;
            worst = i;
            continue;
        }
        double d = fabs(g - r);
        num += d * d;
        den += r * r;
        if (d > maxd) {
            maxd = d;
            worst = i;
        }
        if (fabs(r) > maxr)
            maxr = fabs(r);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    double relmax = maxr > 0 ? maxd / maxr : maxd;
    DT_CHECK_MSG(bad == 0 && rel <= tol && relmax <= 10 * tol,
                 "%s [%s]: rel L2 error %.3g, max error %.3g of max |ref| %.3g (worst at %zu: "
                 "cpu %.8g gpu %.8g), %zu non-finite mismatches; tol %.3g",
                 what, prec_name(x->prec), rel, relmax, maxr, worst, (double)rc[worst],
                 (double)rg[worst], bad, tol);
    free(rc);
    free(rg);
}

static void check(ctx *x, const char *what, const tp *t, double tol)
{
    compare(x, what, t, NULL, tol, NULL, NULL);
}

static void check_added(ctx *x, const char *what, const tp *t, const float *base, double tol)
{
    compare(x, what, t, base, tol, NULL, NULL);
}

static float *copy_host(const tp *t)
{
    float *c = malloc(t->n * sizeof(float) + 4);
    memcpy(c, t->h, t->n * sizeof(float));
    return c;
}

/* ---- library (no GPU needed) ------------------------------------------------------------- */

static void *cuda_lib(void)
{
    char path[PATH_MAX + 32];
    if (dt_cuda_lib_path(path, sizeof path) != 0 || access(path, R_OK) != 0)
        return NULL;
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void test_library_symbols(void)
{
    char path[PATH_MAX + 32];
    if (dt_cuda_lib_path(path, sizeof path) != 0 || access(path, R_OK) != 0)
        DT_SKIP("libdtrain_cuda.so not built (no nvcc, or CUDA=0)");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        DT_CHECK_MSG(0, "dlopen %s: %s", path, dlerror());
        dt_test_stop();
    }
    DT_CHECK(dlsym(h, DT_CUDA_BACKEND_CREATE_SYMBOL) != NULL);
    DT_CHECK(dlsym(h, DT_NCCL_GET_ID_SYMBOL) != NULL);
    DT_CHECK(dlsym(h, DT_NCCL_CREATE_SYMBOL) != NULL);
    /* Internals stay hidden (the common/ copies inside the library must not interpose). */
    DT_CHECK(dlsym(h, "dt_err_set") == NULL);
    DT_CHECK(dlsym(h, "dt_cuda_matmul_fwd") == NULL);
    /* Without a GPU, creating the backend fails with a message saying why, never a crash. */
    if (gpu_skip[0]) {
        dt_cuda_backend_create_fn create =
            (dt_cuda_backend_create_fn)(uintptr_t)dlsym(h, DT_CUDA_BACKEND_CREATE_SYMBOL);
        dt_backend *be = NULL;
        dt_err e = {0};
        DT_REQUIRE(create);
        DT_CHECK(create(&be, NULL, &e) < 0);
        DT_CHECK_CONTAINS(e.msg, "CUDA");
        DT_CHECK(be == NULL);
    }
}

/* ---- memory, profiling ------------------------------------------------------------------- */

static void test_memory(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *g = x.gpu;
    size_t n = (1u << 20) + 3;
    float *a = dalloc(g, n * sizeof(float)), *b = dalloc(g, n * sizeof(float));
    float *h = malloc(n * sizeof(float));
    g->memcpy_d2h(g, h, a, n * sizeof(float));
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += h[i] != 0.0f;
    DT_CHECK_INT(nonzero, 0); /* alloc returns zeroed memory */
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i;
    g->memcpy_h2d(g, a, h, n * sizeof(float));
    g->memcpy_d2d(g, b, a, n * sizeof(float));
    memset(h, 0, n * sizeof(float));
    g->memcpy_d2h(g, h, b, n * sizeof(float));
    DT_CHECK(h[0] == 0.0f && h[12345] == 12345.0f && h[n - 1] == (float)(n - 1));
    g->memset_zero(g, b, 16 * sizeof(float));
    g->memcpy_d2h(g, h, b, 32 * sizeof(float));
    DT_CHECK(h[15] == 0.0f && h[16] == 16.0f);
    size_t peak = g->peak_bytes(g);
    DT_CHECK(peak >= 2 * n * sizeof(float));
    /* A freed block is reused: the peak does not grow (a and b are VMM allocations of 2 MiB
     * granules where the device has them, given back on free and taken again). */
    g->free(g, b);
    float *c = dalloc(g, n * sizeof(float));
    DT_CHECK_INT(g->peak_bytes(g), peak);
    g->free(g, c);
    /* Arena blocks (below the 2 MiB granule): best fit returns the same block, and blocks
     * coalesce: two neighbours freed make room for one of twice the size. */
    float *s0 = dalloc(g, 1 << 18);
    DT_CHECK_INT(dt_mem_granule(g, s0), 0);
    g->free(g, s0);
    size_t peak1 = g->peak_bytes(g);
    float *s0b = dalloc(g, 1 << 18);
    DT_CHECK(s0b == s0);
    DT_CHECK_INT(g->peak_bytes(g), peak1);
    g->free(g, s0b);
    float *s1 = dalloc(g, 1 << 19), *s2 = dalloc(g, 1 << 19);
    g->free(g, s1);
    g->free(g, s2);
    size_t peak2 = g->peak_bytes(g);
    float *s3 = dalloc(g, 1 << 20);
    DT_CHECK_INT(dt_mem_granule(g, s3), 0);
    DT_CHECK(s3 == s1 || s3 == s2);
    DT_CHECK_INT(g->peak_bytes(g), peak2);
    g->free(g, s3);
    g->free(g, NULL);
    /* An impossible allocation fails with a message, and the backend stays usable. */
    void *huge = NULL;
    dt_err e = {0};
    DT_CHECK(g->alloc(g, &huge, (size_t)1 << 50, &e) == -ENOMEM);
    DT_CHECK_CONTAINS(e.msg, "out of memory");
    g->memcpy_d2h(g, h, a, 4 * sizeof(float));
    DT_CHECK(h[3] == 3.0f);
    free(h);
    ctx_close(&x);
}

/* Reads bytes at p into h and checks that they are all `want` (a float value). */
static void check_all(dt_backend *g, float *h, const float *p, size_t n, float want,
                      const char *what)
{
    g->memcpy_d2h(g, h, p, n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != want;
    DT_CHECK_MSG(bad == 0, "%s: %zu of %zu floats are not %g (first: %g)", what, bad, n,
                 (double)want, (double)h[0]);
}

/* VMM-backed allocations (a granule, 2 MiB, and more): aligned, zeroed, granule reported,
 * mem_release / mem_commit exact in the statistics (granule by granule, twice counts once),
 * committed memory writable, a release right behind queued device work (deferred until the
 * stream is past it), free after release, and the statistics back at the baseline. */
static void test_vmm(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *g = x.gpu;
    dt_mem_cat old = dt_mem_tag(g, DT_MEM_PARAMS);
    void *small = dalloc(g, 4096);
    DT_CHECK_INT(dt_mem_granule(g, small), 0);
    float *probe = dalloc(g, 8u << 20);
    size_t G = dt_mem_granule(g, probe);
    g->free(g, probe);
    if (G == 0) {
        g->free(g, small);
        ctx_close(&x);
        DT_SKIP("the CUDA backend does not use virtual memory management on this device (see "
                "its DT_INFO line; DTRAIN_CUDA_VMM=0?)");
    }
    DT_CHECK((G & (G - 1)) == 0);
    dt_mem_stats s0, s;
    dt_mem_read(g, &s0);
    size_t peak0 = g->peak_bytes(g);
    const size_t P = DT_MEM_PARAMS;

    /* 3.5 granules: 4 mapped, the padding charged too */
    size_t bytes = 3 * G + G / 2, n = bytes / sizeof(float), gf = G / sizeof(float);
    float *big = dalloc(g, bytes), *h = malloc(bytes);
    DT_REQUIRE(h);
    DT_CHECK((uintptr_t)big % G == 0);
    DT_CHECK_INT(dt_mem_granule(g, big), G);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 4 * G);
    DT_CHECK_INT(s.total - s0.total, 4 * G);
    DT_CHECK(g->peak_bytes(g) >= peak0 + 4 * G);
    check_all(g, h, big, n, 0.0f, "fresh allocation");
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 1000003);
    g->memcpy_h2d(g, big, h, bytes);

    /* release the middle granule [G, 2G): exactly one granule less, twice counts once */
    g->mem_release(g, big, G, G);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 3 * G);
    DT_CHECK_INT(s.total - s0.total, 3 * G);
    g->mem_release(g, big, G, G);
    g->mem_release(g, big, G - 4096, G + 8192); /* the same granule, nothing more */
    g->mem_release(g, big, G / 2, G);           /* no whole granule inside */
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 3 * G);
    /* the neighbours keep their contents */
    g->memcpy_d2h(g, h, big, G);
    DT_CHECK(h[0] == 0.0f && h[gf - 1] == (float)((gf - 1) % 1000003));
    g->memcpy_d2h(g, h, big + 2 * gf, G);
    DT_CHECK(h[0] == (float)((2 * gf) % 1000003) && h[gf - 1] == (float)((3 * gf - 1) % 1000003));

    /* commit a few bytes inside it: the whole granule comes back, once */
    dt_err e = {0};
    DT_REQUIRE_OK(g->mem_commit(g, big, G + 40, 100, &e), &e);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 4 * G);
    DT_REQUIRE_OK(g->mem_commit(g, big, G, G, &e), &e);
    DT_REQUIRE_OK(g->mem_commit(g, big, 0, bytes, &e), &e); /* nothing released: no change */
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 4 * G);
    DT_CHECK_INT(s.total - s0.total, 4 * G);
    /* committed memory is writable: zero it, copy a pattern in and out again */
    g->memset_zero(g, big + gf, G);
    check_all(g, h, big + gf, gf, 0.0f, "committed granule after memset_zero");
    for (size_t i = 0; i < gf; i++)
        h[i] = 7.0f + (float)(i % 97);
    g->memcpy_h2d(g, big + gf, h, G);
    g->memcpy_d2d(g, big + 3 * gf, big + gf, G / 2);
    g->memcpy_d2h(g, h, big + 3 * gf, G / 2);
    DT_CHECK(h[0] == 7.0f && h[gf / 2 - 1] == 7.0f + (float)((gf / 2 - 1) % 97));

    /* the last granule: a range reaching the allocation's end covers its padding */
    g->mem_release(g, big, 3 * G, bytes - 3 * G);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 3 * G);
    DT_REQUIRE_OK(g->mem_commit(g, big, 3 * G, bytes - 3 * G, &e), &e);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P] - s0.cur[P], 4 * G);

    /* deferred release: device work on the granules is still queued when they are released */
    for (int round = 0; round < 4; round++) {
        g->memset_zero(g, big, bytes);
        g->memcpy_d2d(g, big + 2 * gf, big, G);
        g->memcpy_d2d(g, big + gf, big + 2 * gf, G);
        g->mem_release(g, big, 0, 2 * G);
        dt_mem_read(g, &s);
        DT_CHECK_INT(s.cur[P] - s0.cur[P], 2 * G);
        if (round % 2) { /* commit at once: cancels the release still pending */
            DT_REQUIRE_OK(g->mem_commit(g, big, 0, 2 * G, &e), &e);
        } else {
            g->synchronize(g);
            DT_REQUIRE_OK(g->mem_commit(g, big, 0, 2 * G, &e), &e);
        }
        dt_mem_read(g, &s);
        DT_CHECK_INT(s.cur[P] - s0.cur[P], 4 * G);
        g->memset_zero(g, big, 2 * G);
        check_all(g, h, big, 3 * gf, 0.0f, "after release behind queued work and commit");
    }

    /* free after release; the statistics are back at the baseline */
    g->mem_release(g, big, G, 2 * G);
    g->free(g, big);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P], s0.cur[P]);
    DT_CHECK_INT(s.total, s0.total);
    /* and again with the release still pending at free */
    big = dalloc(g, bytes);
    g->memset_zero(g, big, bytes);
    g->mem_release(g, big, 0, bytes);
    g->free(g, big);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.cur[P], s0.cur[P]);
    DT_CHECK_INT(s.total, s0.total);
    /* the backend is healthy: a read-back is not the failure fill (NaN) */
    g->memcpy_d2h(g, h, small, 16);
    DT_CHECK(h[0] == 0.0f && h[3] == 0.0f);
    g->free(g, small);
    dt_mem_tag(g, old);
    free(h);
    ctx_close(&x);
}

/* DTRAIN_CUDA_VMM=0: every allocation comes from the arena; release gives nothing back. */
static void test_vmm_off(void)
{
    setenv("DTRAIN_CUDA_VMM", "0", 1); /* this test's own process (the harness forks) */
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *g = x.gpu;
    size_t bytes = 8u << 20;
    float *big = dalloc(g, bytes);
    DT_CHECK_INT(dt_mem_granule(g, big), 0);
    dt_mem_stats s0, s;
    dt_mem_read(g, &s0);
    g->mem_release(g, big, 0, bytes);
    dt_mem_read(g, &s);
    DT_CHECK_INT(s.total, s0.total);
    dt_err e = {0};
    DT_CHECK_INT(g->mem_commit(g, big, 0, bytes, &e), 0);
    g->free(g, big);
    ctx_close(&x);
    unsetenv("DTRAIN_CUDA_VMM");
}

static void test_profile(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *g = x.gpu;
    DT_REQUIRE(g->profile_enable && g->profile_read);
    int N = 64, C = 96, OC = 128;
    tp in = tp_new(&x, (size_t)N * C, 1), w = tp_new(&x, (size_t)OC * C, 1),
       out = tp_new(&x, (size_t)N * OC, 0);
    g->profile_enable(g, true);
    g->matmul_fwd(g, out.g, in.g, w.g, NULL, N, C, OC);
    g->gelu_fwd(g, out.g, out.g, out.n);
    dt_op_stat st[64];
    int k = g->profile_read(g, st, 64);
    DT_REQUIRE(k > 0 && k <= 64);
    int found = 0;
    for (int i = 0; i < k; i++) {
        if (!strcmp(st[i].name, "matmul_fwd")) {
            found++;
            DT_CHECK_INT(st[i].calls, 1);
            DT_CHECK(st[i].gemm);
            DT_CHECK(st[i].seconds > 0);
            DT_CHECK_NEAR(st[i].flops, 2.0 * N * C * OC, 1);
        }
        if (!strcmp(st[i].name, "gelu_fwd")) {
            found++;
            DT_CHECK_INT(st[i].calls, 1);
            DT_CHECK(!st[i].gemm);
        }
    }
    DT_CHECK_INT(found, 2);
    g->profile_enable(g, false);
    ctx_close(&x);
}

/* ---- GEMM-bound -------------------------------------------------------------------------- */

static void matmul_case(ctx *x, int N, int C, int OC, bool bias, bool misalign)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    double tol = gemm_tol(x->prec);
    /* misalign: weight and bias start 1 float into their buffers (parameter slices are only
     * 4-byte aligned), which cuBLASLt must handle or fall back from. */
    int off = misalign ? 1 : 0;
    tp in = tp_new(x, (size_t)N * C, 1), w = tp_new(x, (size_t)OC * C + off, 0.5f),
       b = tp_new(x, (size_t)OC + off, 1), out = tp_new(x, (size_t)N * OC, 0);
    c->matmul_fwd(c, out.c, in.c, w.c + off, bias ? b.c + off : NULL, N, C, OC);
    g->matmul_fwd(g, out.g, in.g, w.g + off, bias ? b.g + off : NULL, N, C, OC);
    check(x, "matmul_fwd out", &out, tol);

    tp dout = tp_new(x, (size_t)N * OC, 1), dinp = tp_new(x, (size_t)N * C, 1),
       dw = tp_new(x, (size_t)OC * C + off, 1), db = tp_new(x, (size_t)OC + off, 1);
    float *dinp0 = copy_host(&dinp), *dw0 = copy_host(&dw), *db0 = copy_host(&db);
    c->matmul_bwd(c, dinp.c, dw.c + off, bias ? db.c + off : NULL, dout.c, in.c, w.c + off, N, C,
                  OC);
    g->matmul_bwd(g, dinp.g, dw.g + off, bias ? db.g + off : NULL, dout.g, in.g, w.g + off, N, C,
                  OC);
    check_added(x, "matmul_bwd dinp", &dinp, dinp0, tol);
    check_added(x, "matmul_bwd dw", &dw, dw0, tol);
    if (bias)
        check_added(x, "matmul_bwd dbias", &db, db0, TOL32);
    /* dinp NULL: only the weight gradient (as for the first layer). */
    tp_upload(x, &dw);
    c->matmul_bwd(c, NULL, dw.c + off, NULL, dout.c, in.c, w.c + off, N, C, OC);
    g->matmul_bwd(g, NULL, dw.g + off, NULL, dout.g, in.g, w.g + off, N, C, OC);
    check_added(x, "matmul_bwd dw (dinp NULL)", &dw, dw0, tol);
    free(dinp0);
    free(dw0);
    free(db0);
    tp_free(x, &in);
    tp_free(x, &w);
    tp_free(x, &b);
    tp_free(x, &out);
    tp_free(x, &dout);
    tp_free(x, &dinp);
    tp_free(x, &dw);
    tp_free(x, &db);
}

static void matmul_all(dt_precision p)
{
    ctx x;
    ctx_open(&x, p);
    matmul_case(&x, 128, 256, 768, true, false); /* GPT-like, aligned */
    matmul_case(&x, 37, 53, 29, true, true);     /* odd sizes, misaligned slices */
    matmul_case(&x, 64, 64, 10, false, false);   /* classifier head, no bias */
    ctx_close(&x);
}

static void test_matmul_fp32(void) { matmul_all(DT_PREC_FP32); }
static void test_matmul_bf16(void) { matmul_all(DT_PREC_BF16); }
static void test_matmul_fp16(void) { matmul_all(DT_PREC_FP16); }
static void test_matmul_bf16_fast(void)
{
    setenv("DTRAIN_CUDA_GEMM", "fast", 1);
    matmul_all(DT_PREC_BF16);
}

/* The CUDA backend's saved probabilities (B,NH,T,T) on its cuBLAS path, against those the CPU's
 * saved log-sum-exp (B,NH,T) implies: p[t][s] = exp(q_t.k_s / sqrt(hs) - lse_t) for s <= t,
 * computed in double from the inputs. The two backends save different things (attention_sizes);
 * this ties them to one another. */
static void check_probs(ctx *x, const float *qkv, const float *lse_dev, const float *att_dev,
                        int B, int T, int C, int NH, double tol)
{
    const int hs = C / NH;
    size_t nl = (size_t)B * NH * T, np = nl * T;
    float *lse = malloc(nl * sizeof(float)), *att = malloc(np * sizeof(float));
    DT_REQUIRE(lse && att);
    x->cpu->memcpy_d2h(x->cpu, lse, lse_dev, nl * sizeof(float));
    x->gpu->memcpy_d2h(x->gpu, att, att_dev, np * sizeof(float));
    double num = 0, den = 0, maxd = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                const float *l = lse + ((size_t)b * NH + h) * T + t;
                const float *g = att + (((size_t)b * NH + h) * T + t) * T;
                for (int s2 = 0; s2 <= t; s2++) {
                    const float *k = qkv + ((size_t)b * T + s2) * 3 * C + C + (size_t)h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++)
                        dot += (double)q[i] * k[i];
                    double r = exp(dot / sqrt((double)hs) - *l), d = fabs(g[s2] - r);
                    num += d * d;
                    den += r * r;
                    maxd = d > maxd ? d : maxd;
                }
            }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    DT_CHECK_MSG(rel <= tol && maxd <= 10 * tol,
                 "attention_fwd att [%s]: the cuda probabilities differ from exp(s - lse) of the "
                 "cpu's lse by rel L2 %.3g, max %.3g; tol %.3g",
                 prec_name(x->prec), rel, maxd, tol);
    free(lse);
    free(att);
}

static void attention_case(ctx *x, int B, int T, int C, int NH)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    double tol = gemm_tol(x->prec);
    /* each backend says what its att and datt hold; one buffer size serves both */
    size_t natt_c = 0, natt_g = 0, ndatt_c = 0, ndatt_g = 0;
    c->attention_sizes(c, B, T, C, NH, &natt_c, &ndatt_c);
    g->attention_sizes(g, B, T, C, NH, &natt_g, &ndatt_g);
    DT_CHECK_INT(natt_c, (size_t)B * NH * T);
    DT_CHECK_INT(ndatt_c, 0);
    tp qkv = tp_new(x, (size_t)B * T * 3 * C, 1), out = tp_new(x, (size_t)B * T * C, 0),
       att = tp_new(x, natt_c > natt_g ? natt_c : natt_g, 0);
    c->attention_fwd(c, out.c, att.c, qkv.c, B, T, C, NH);
    g->attention_fwd(g, out.g, att.g, qkv.g, B, T, C, NH);
    check(x, "attention_fwd out", &out, tol);
    /* In bf16/fp16 convert mode the CUDA backend keeps att in 16 bits (kernels/cuda/gemm.cu):
     * its bytes are comparable only in fp32 or with DTRAIN_CUDA_GEMM=fast; with flash it holds
     * the lse and a 16-bit output (natt_g is then not the probabilities' size). */
    const char *mode = dt_env("DTRAIN_CUDA_GEMM");
    if (natt_g == (size_t)B * NH * T * T &&
        (x->prec == DT_PREC_FP32 || (mode && !strcmp(mode, "fast"))))
        check_probs(x, qkv.h, att.c, att.g, B, T, C, NH, tol);

    size_t ndatt = ndatt_c > ndatt_g ? ndatt_c : ndatt_g;
    tp dout = tp_new(x, (size_t)B * T * C, 1), dqkv = tp_new(x, qkv.n, 1),
       datt = tp_new(x, ndatt, 0);
    float *dqkv0 = copy_host(&dqkv);
    /* Both backward passes read their own backend's saved att (as in training). */
    c->attention_bwd(c, dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, C, NH);
    g->attention_bwd(g, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    check_added(x, "attention_bwd dqkv", &dqkv, dqkv0, 2 * tol);
    free(dqkv0);
    tp_free(x, &qkv);
    tp_free(x, &out);
    tp_free(x, &att);
    tp_free(x, &dout);
    tp_free(x, &dqkv);
    tp_free(x, &datt);
}

static void attention_all(dt_precision p)
{
    ctx x;
    ctx_open(&x, p);
    attention_case(&x, 2, 64, 64, 4);
    attention_case(&x, 3, 37, 48, 3); /* odd T, hs = 16 */
    attention_case(&x, 1, 1, 8, 2);   /* one position */
    ctx_close(&x);
}

/* Head size 64 and T >= 64: the shapes the flash kernels take (with DTRAIN_CUDA_ATTN=flash),
 * including partial tiles; without it they exercise the cuBLAS path on GPT-2's head size. */
static void attention_hs64(dt_precision p)
{
    ctx x;
    ctx_open(&x, p);
    attention_case(&x, 2, 128, 128, 2);
    attention_case(&x, 1, 100, 64, 1);
    attention_case(&x, 1, 257, 192, 3);
    ctx_close(&x);
}

static void test_attention_fp32(void) { attention_all(DT_PREC_FP32); }
static void test_attention_hs64_fp32(void) { attention_hs64(DT_PREC_FP32); }
static void test_attention_hs64_bf16(void) { attention_hs64(DT_PREC_BF16); }
static void test_attention_flash_bf16(void)
{
    setenv("DTRAIN_CUDA_ATTN", "flash", 1);
    attention_hs64(DT_PREC_BF16);
}
static void test_attention_flash_fp16(void)
{
    setenv("DTRAIN_CUDA_ATTN", "flash", 1);
    attention_hs64(DT_PREC_FP16);
}
static void test_attention_bf16(void) { attention_all(DT_PREC_BF16); }
static void test_attention_fp16(void) { attention_all(DT_PREC_FP16); }
static void test_attention_bf16_fast(void)
{
    setenv("DTRAIN_CUDA_GEMM", "fast", 1);
    attention_all(DT_PREC_BF16);
}

/* attention_pad (BERT's bidirectional attention with a key padding mask): samples padded from
 * pad_from[b] (T: none, 0: every key masked), or the NULL mask. */
static void attention_pad_case(ctx *x, int B, int T, int C, int NH, const int *pad_from,
                               bool no_mask)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    double tol = gemm_tol(x->prec);
    tp qkv = tp_new(x, (size_t)B * T * 3 * C, 1), out = tp_new(x, (size_t)B * T * C, 0),
       att = tp_new(x, (size_t)B * NH * T * T, 0);
    ti mask = ti_new(x, (size_t)B * T, 0, 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            mask.h[b * T + t] = no_mask || t < pad_from[b];
    ti_upload(x, &mask);
    c->attention_pad_fwd(c, out.c, att.c, qkv.c, no_mask ? NULL : mask.c, B, T, C, NH);
    g->attention_pad_fwd(g, out.g, att.g, qkv.g, no_mask ? NULL : mask.g, B, T, C, NH);
    check(x, "attention_pad_fwd out", &out, tol);
    const char *mode = dt_env("DTRAIN_CUDA_GEMM");
    if (x->prec == DT_PREC_FP32 || (mode && !strcmp(mode, "fast")))
        check(x, "attention_pad_fwd att", &att, tol);
    tp dout = tp_new(x, (size_t)B * T * C, 1), dqkv = tp_new(x, qkv.n, 1),
       datt = tp_new(x, att.n, 0);
    float *dqkv0 = copy_host(&dqkv);
    c->attention_pad_bwd(c, dqkv.c, datt.c, dout.c, qkv.c, att.c, B, T, C, NH);
    g->attention_pad_bwd(g, dqkv.g, datt.g, dout.g, qkv.g, att.g, B, T, C, NH);
    check_added(x, "attention_pad_bwd dqkv", &dqkv, dqkv0, 2 * tol);
    free(dqkv0);
    x->cpu->free(x->cpu, mask.c);
    x->gpu->free(x->gpu, mask.g);
    free(mask.h);
    tp_free(x, &qkv);
    tp_free(x, &out);
    tp_free(x, &att);
    tp_free(x, &dout);
    tp_free(x, &dqkv);
    tp_free(x, &datt);
}

static void attention_pad_all(dt_precision p)
{
    ctx x;
    ctx_open(&x, p);
    const int pads[3] = {128, 100, 0}, odd[2] = {37, 5};
    attention_pad_case(&x, 3, 128, 64, 4, pads, false);
    attention_pad_case(&x, 2, 37, 48, 3, odd, false); /* odd T, hs = 16 */
    attention_pad_case(&x, 2, 37, 48, 3, odd, true);  /* no mask */
    ctx_close(&x);
}

static void test_attention_pad_fp32(void) { attention_pad_all(DT_PREC_FP32); }
static void test_attention_pad_bf16(void) { attention_pad_all(DT_PREC_BF16); }

static void conv_case(ctx *x, int N, int C, int H, int W, int K, int R, int stride, int pad,
                      bool bias)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    /* 16-bit modes run convolutions in TF32 (cuda_internal.h). */
    double tol = x->prec == DT_PREC_FP32 ? 5e-5 : 4e-3;
    dt_conv2d_shape s;
    dt_conv2d_shape_init(&s, N, C, H, W, K, R, R, stride, pad);
    tp in = tp_new(x, (size_t)N * C * H * W, 1), w = tp_new(x, (size_t)K * C * R * R, 0.3f),
       b = tp_new(x, (size_t)K, 1), out = tp_new(x, (size_t)N * K * s.P * s.Q, 0);
    c->conv2d_fwd(c, out.c, in.c, w.c, bias ? b.c : NULL, &s);
    g->conv2d_fwd(g, out.g, in.g, w.g, bias ? b.g : NULL, &s);
    check(x, "conv2d_fwd out", &out, tol);
    tp dout = tp_new(x, out.n, 1), dinp = tp_new(x, in.n, 1), dw = tp_new(x, w.n, 1),
       db = tp_new(x, b.n, 1);
    float *dinp0 = copy_host(&dinp), *dw0 = copy_host(&dw), *db0 = copy_host(&db);
    c->conv2d_bwd(c, dinp.c, dw.c, bias ? db.c : NULL, dout.c, in.c, w.c, &s);
    g->conv2d_bwd(g, dinp.g, dw.g, bias ? db.g : NULL, dout.g, in.g, w.g, &s);
    check_added(x, "conv2d_bwd dinp", &dinp, dinp0, tol);
    check_added(x, "conv2d_bwd dw", &dw, dw0, tol);
    if (bias)
        check_added(x, "conv2d_bwd dbias", &db, db0, TOL32);
    free(dinp0);
    free(dw0);
    free(db0);
    tp_free(x, &in);
    tp_free(x, &w);
    tp_free(x, &b);
    tp_free(x, &out);
    tp_free(x, &dout);
    tp_free(x, &dinp);
    tp_free(x, &dw);
    tp_free(x, &db);
}

static void conv_all(dt_precision p)
{
    ctx x;
    ctx_open(&x, p);
    conv_case(&x, 4, 3, 16, 16, 8, 3, 1, 1, true);   /* ResNet stem */
    conv_case(&x, 2, 16, 15, 15, 32, 3, 2, 1, false); /* strided 3x3, odd size */
    conv_case(&x, 2, 16, 8, 8, 32, 1, 2, 0, false);   /* 1x1 shortcut */
    conv_case(&x, 2, 8, 8, 8, 8, 3, 1, 1, false);     /* same shape again: algorithm cache */
    ctx_close(&x);
}

static void test_conv_fp32(void) { conv_all(DT_PREC_FP32); }
static void test_conv_bf16(void) { conv_all(DT_PREC_BF16); }

/* ---- element-wise and normalisation ------------------------------------------------------ */

static void test_bias_layernorm(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int N = 70, C = 200;
    tp out = tp_new(&x, (size_t)N * C, 1), b = tp_new(&x, (size_t)C, 1);
    c->bias_add(c, out.c, b.c, N, C);
    g->bias_add(g, out.g, b.g, N, C);
    check(&x, "bias_add", &out, TOL32);
    tp db = tp_new(&x, (size_t)C, 1);
    float *db0 = copy_host(&db);
    c->bias_bwd(c, db.c, out.c, N, C);
    g->bias_bwd(g, db.g, out.g, N, C);
    check_added(&x, "bias_bwd", &db, db0, TOL32);

    tp in = tp_new(&x, (size_t)N * C, 2), w = tp_new(&x, (size_t)C, 1), bb = tp_new(&x, C, 1),
       mean = tp_new(&x, (size_t)N, 0), rstd = tp_new(&x, (size_t)N, 0);
    for (size_t i = 0; i < in.n; i++)
        in.h[i] += 3.0f; /* an offset, as real activations have */
    tp_upload(&x, &in);
    c->layernorm_fwd(c, out.c, mean.c, rstd.c, in.c, w.c, bb.c, N, C, 1e-5f);
    g->layernorm_fwd(g, out.g, mean.g, rstd.g, in.g, w.g, bb.g, N, C, 1e-5f);
    check(&x, "layernorm_fwd out", &out, TOL32);
    check(&x, "layernorm_fwd mean", &mean, TOL32);
    check(&x, "layernorm_fwd rstd", &rstd, TOL32);
    tp dout = tp_new(&x, out.n, 1), dinp = tp_new(&x, in.n, 1), dw = tp_new(&x, (size_t)C, 1),
       dbb = tp_new(&x, (size_t)C, 1);
    float *dinp0 = copy_host(&dinp), *dw0 = copy_host(&dw), *dbb0 = copy_host(&dbb);
    c->layernorm_bwd(c, dinp.c, dw.c, dbb.c, dout.c, in.c, w.c, mean.c, rstd.c, N, C);
    g->layernorm_bwd(g, dinp.g, dw.g, dbb.g, dout.g, in.g, w.g, mean.g, rstd.g, N, C);
    check_added(&x, "layernorm_bwd dinp", &dinp, dinp0, 1e-4);
    check_added(&x, "layernorm_bwd dw", &dw, dw0, TOL32);
    check_added(&x, "layernorm_bwd db", &dbb, dbb0, TOL32);
    free(db0);
    free(dinp0);
    free(dw0);
    free(dbb0);
    ctx_close(&x);
}

/* The decoder ops (llama): RMSNorm, SwiGLU, rotary embeddings with grouped-query heads, at a
 * width that is not a multiple of 32 and with kv heads shared by 3 query heads. */
static void test_decoder_ops(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int N = 70, C = 200;
    tp in = tp_new(&x, (size_t)N * C, 2), w = tp_new(&x, (size_t)C, 1),
       out = tp_new(&x, (size_t)N * C, 0), rstd = tp_new(&x, (size_t)N, 0);
    c->rmsnorm_fwd(c, out.c, rstd.c, in.c, w.c, N, C, 1e-5f);
    g->rmsnorm_fwd(g, out.g, rstd.g, in.g, w.g, N, C, 1e-5f);
    check(&x, "rmsnorm_fwd out", &out, TOL32);
    check(&x, "rmsnorm_fwd rstd", &rstd, TOL32);
    tp dout = tp_new(&x, out.n, 1), dinp = tp_new(&x, in.n, 1), dw = tp_new(&x, (size_t)C, 1);
    float *dinp0 = copy_host(&dinp), *dw0 = copy_host(&dw);
    c->rmsnorm_bwd(c, dinp.c, dw.c, dout.c, in.c, w.c, rstd.c, N, C);
    g->rmsnorm_bwd(g, dinp.g, dw.g, dout.g, in.g, w.g, rstd.g, N, C);
    check_added(&x, "rmsnorm_bwd dinp", &dinp, dinp0, 1e-4);
    check_added(&x, "rmsnorm_bwd dw", &dw, dw0, TOL32);
    free(dinp0);
    free(dw0);

    const int F = 173;
    tp gu = tp_new(&x, (size_t)N * 2 * F, 2), so = tp_new(&x, (size_t)N * F, 0),
       dso = tp_new(&x, (size_t)N * F, 1), dgu = tp_new(&x, (size_t)N * 2 * F, 1);
    c->swiglu_fwd(c, so.c, gu.c, N, F);
    g->swiglu_fwd(g, so.g, gu.g, N, F);
    check(&x, "swiglu_fwd", &so, 1e-5); /* the CPU's exp is a polynomial approximation */
    float *dgu0 = copy_host(&dgu);
    c->swiglu_bwd(c, dgu.c, dso.c, gu.c, N, F);
    g->swiglu_bwd(g, dgu.g, dso.g, gu.g, N, F);
    check_added(&x, "swiglu_bwd", &dgu, dgu0, 1e-5);
    free(dgu0);

    const int B = 3, T = 37, NH = 6, NKV = 2, hs = 16;
    const size_t nin = (size_t)B * T * (NH + 2 * NKV) * hs, nat = (size_t)B * T * 3 * NH * hs;
    tp qkv = tp_new(&x, nin, 1), att = tp_new(&x, nat, 0), datt = tp_new(&x, nat, 1),
       dqkv = tp_new(&x, nin, 1);
    c->rope_qkv_fwd(c, att.c, qkv.c, B, T, NH, NKV, hs, 10000.0f);
    g->rope_qkv_fwd(g, att.g, qkv.g, B, T, NH, NKV, hs, 10000.0f);
    check(&x, "rope_qkv_fwd", &att, TOL32);
    float *dqkv0 = copy_host(&dqkv);
    c->rope_qkv_bwd(c, dqkv.c, datt.c, B, T, NH, NKV, hs, 10000.0f);
    g->rope_qkv_bwd(g, dqkv.g, datt.g, B, T, NH, NKV, hs, 10000.0f);
    check_added(&x, "rope_qkv_bwd", &dqkv, dqkv0, TOL32);
    free(dqkv0);
    tp *all[] = {&in, &w, &out, &rstd, &dout, &dinp, &dw, &gu, &so, &dso, &dgu, &qkv, &att,
                 &datt, &dqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tp_free(&x, all[i]);
    ctx_close(&x);
}

static void test_elementwise(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    size_t n = 100003;
    tp in = tp_new(&x, n, 2), out = tp_new(&x, n, 0), dout = tp_new(&x, n, 1),
       dinp = tp_new(&x, n, 1), other = tp_new(&x, n, 1);
    float *dinp0 = copy_host(&dinp);
    c->gelu_fwd(c, out.c, in.c, n);
    g->gelu_fwd(g, out.g, in.g, n);
    check(&x, "gelu_fwd", &out, 1e-4); /* the CPU's tanh is a polynomial approximation */
    c->gelu_bwd(c, dinp.c, in.c, dout.c, n);
    g->gelu_bwd(g, dinp.g, in.g, dout.g, n);
    check_added(&x, "gelu_bwd", &dinp, dinp0, 1e-4);

    tp_upload(&x, &dinp);
    c->gelu_erf_fwd(c, out.c, in.c, n);
    g->gelu_erf_fwd(g, out.g, in.g, n);
    check(&x, "gelu_erf_fwd", &out, 1e-5); /* the CPU's erfc is a polynomial fit */
    c->gelu_erf_bwd(c, dinp.c, in.c, dout.c, n);
    g->gelu_erf_bwd(g, dinp.g, in.g, dout.g, n);
    check_added(&x, "gelu_erf_bwd", &dinp, dinp0, 1e-5);
    tp_upload(&x, &dinp);
    c->tanh_fwd(c, out.c, in.c, n);
    g->tanh_fwd(g, out.g, in.g, n);
    check(&x, "tanh_fwd", &out, 1e-6);
    c->tanh_bwd(c, dinp.c, out.c, dout.c, n);
    g->tanh_bwd(g, dinp.g, out.g, dout.g, n);
    check_added(&x, "tanh_bwd", &dinp, dinp0, 1e-6);

    tp_upload(&x, &dinp);
    c->relu_fwd(c, out.c, in.c, n);
    g->relu_fwd(g, out.g, in.g, n);
    check(&x, "relu_fwd", &out, 0);
    c->relu_bwd(c, dinp.c, out.c, dout.c, n);
    g->relu_bwd(g, dinp.g, out.g, dout.g, n);
    check_added(&x, "relu_bwd", &dinp, dinp0, 0);
    c->relu_fwd(c, in.c, in.c, n); /* in place */
    g->relu_fwd(g, in.g, in.g, n);
    check(&x, "relu_fwd in place", &in, 0);

    c->residual_fwd(c, out.c, in.c, other.c, n);
    g->residual_fwd(g, out.g, in.g, other.g, n);
    check(&x, "residual_fwd", &out, 0);
    c->accumulate(c, out.c, other.c, n);
    g->accumulate(g, out.g, other.g, n);
    check(&x, "accumulate", &out, 0);
    c->scale(c, out.c, n, 0.37f);
    g->scale(g, out.g, n, 0.37f);
    check(&x, "scale", &out, 0);
    free(dinp0);
    ctx_close(&x);
}

static void test_embedding(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int V = 50, B = 4, T = 9, C = 24, maxT = 16;
    ti tok = ti_new(&x, (size_t)B * T, 0, V); /* 36 tokens of 50: repeats, so the scatter adds */
    tp wte = tp_new(&x, (size_t)V * C, 1), wpe = tp_new(&x, (size_t)maxT * C, 1),
       out = tp_new(&x, (size_t)B * T * C, 0);
    for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
        c->embedding_fwd(c, out.c, tok.c, wte.c, with_wpe ? wpe.c : NULL, B, T, C);
        g->embedding_fwd(g, out.g, tok.g, wte.g, with_wpe ? wpe.g : NULL, B, T, C);
        check(&x, with_wpe ? "embedding_fwd" : "embedding_fwd (no wpe)", &out, 0);
    }
    tp dout = tp_new(&x, out.n, 1), dwte = tp_new(&x, wte.n, 1), dwpe = tp_new(&x, wpe.n, 1);
    float *dwte0 = copy_host(&dwte), *dwpe0 = copy_host(&dwpe);
    c->embedding_bwd(c, dwte.c, dwpe.c, dout.c, tok.c, B, T, C);
    g->embedding_bwd(g, dwte.g, dwpe.g, dout.g, tok.g, B, T, C);
    check_added(&x, "embedding_bwd dwte", &dwte, dwte0, TOL32);
    check_added(&x, "embedding_bwd dwpe", &dwpe, dwpe0, TOL32);
    free(dwte0);
    free(dwpe0);
    ctx_close(&x);
}

/* Vocabulary-parallel embedding: slice k of R (rows [k*Vl, (k+1)*Vl), the last one padded). */
static void test_embedding_vp(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    const int V = 50, B = 4, T = 9, C = 24, maxT = 16, R = 3, Vl = 17; /* 50 -> 51 */
    ti tok = ti_new(&x, (size_t)B * T, 0, V);
    tp wpe = tp_new(&x, (size_t)maxT * C, 1), out = tp_new(&x, (size_t)B * T * C, 0);
    for (int k = 0; k < R; k++) {
        tp wte = tp_new(&x, (size_t)Vl * C, 1);
        c->embedding_vp_fwd(c, out.c, tok.c, wte.c, k == 0 ? wpe.c : NULL, B, T, C, k * Vl, Vl);
        g->embedding_vp_fwd(g, out.g, tok.g, wte.g, k == 0 ? wpe.g : NULL, B, T, C, k * Vl, Vl);
        check(&x, "embedding_vp_fwd", &out, 0);
        tp dout = tp_new(&x, out.n, 1), dwte = tp_new(&x, wte.n, 1), dwpe = tp_new(&x, wpe.n, 1);
        float *dwte0 = copy_host(&dwte), *dwpe0 = copy_host(&dwpe);
        c->embedding_vp_bwd(c, dwte.c, dwpe.c, dout.c, tok.c, B, T, C, k * Vl, Vl);
        g->embedding_vp_bwd(g, dwte.g, dwpe.g, dout.g, tok.g, B, T, C, k * Vl, Vl);
        check_added(&x, "embedding_vp_bwd dwte", &dwte, dwte0, TOL32);
        check_added(&x, "embedding_vp_bwd dwpe", &dwpe, dwpe0, TOL32);
        free(dwte0);
        free(dwpe0);
        tp_free(&x, &wte);
        tp_free(&x, &dout);
        tp_free(&x, &dwte);
        tp_free(&x, &dwpe);
    }
    tp_free(&x, &wpe);
    tp_free(&x, &out);
    ctx_close(&x);
}

/* The three vocabulary-parallel cross-entropy stages on one slice of Vl columns of which nv are
 * real (the rest garbage), the all-reduces standing in by giving both backends the CPU's
 * statistics between the stages. */
static void xent_vp_case(ctx *x, int N, int Vl, int nv, int v0, bool alias)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    tp logits = tp_new(x, (size_t)N * Vl, 3), maxes = tp_new(x, (size_t)N, 0),
       sums = tp_new(x, 2 * (size_t)N, 0), losses = tp_new(x, (size_t)N, 0),
       dl = tp_new(x, (size_t)N * Vl, 0);
    for (int i = 0; i < N; i++)
        for (int j = nv; j < Vl; j++)
            logits.h[(size_t)i * Vl + j] = 1e4f; /* padding: never read as a logit */
    tp_upload(x, &logits);
    ti tgt = ti_new(x, (size_t)N, v0 > 0 ? v0 - 3 : 0, v0 + nv + 3); /* in and out of the slice */
    tgt.h[0] = -1;
    ti_upload(x, &tgt);
    c->xent_vp_max(c, maxes.c, logits.c, N, Vl, nv);
    g->xent_vp_max(g, maxes.g, logits.g, N, Vl, nv);
    check(x, "xent_vp_max", &maxes, 0);
    /* the "all-reduced" maxima: this slice's, raised a little on some rows */
    c->memcpy_d2h(c, maxes.h, maxes.c, (size_t)N * sizeof(float));
    for (int i = 0; i < N; i += 2)
        maxes.h[i] += 0.5f;
    tp_upload(x, &maxes);
    c->xent_vp_sums(c, sums.c, logits.c, maxes.c, tgt.c, N, Vl, nv, v0);
    g->xent_vp_sums(g, sums.g, logits.g, maxes.g, tgt.g, N, Vl, nv, v0);
    check(x, "xent_vp_sums", &sums, TOL32);
    c->memcpy_d2h(c, sums.h, sums.c, 2 * (size_t)N * sizeof(float));
    for (int i = 0; i < N; i++)
        sums.h[i] += 1.0f; /* the other slices' share */
    tp_upload(x, &sums);
    float dloss = 1.0f / N;
    float *dlc = alias ? logits.c : dl.c, *dlg = alias ? logits.g : dl.g;
    c->xent_vp_finish(c, losses.c, dlc, logits.c, maxes.c, sums.c, tgt.c, N, Vl, nv, v0, dloss);
    g->xent_vp_finish(g, losses.g, dlg, logits.g, maxes.g, sums.g, tgt.g, N, Vl, nv, v0, dloss);
    check(x, "xent_vp_finish losses", &losses, TOL32);
    check(x, alias ? "xent_vp_finish dlogits (in place)" : "xent_vp_finish dlogits",
          alias ? &logits : &dl, 1e-4);
    tp_free(x, &logits);
    tp_free(x, &maxes);
    tp_free(x, &sums);
    tp_free(x, &losses);
    tp_free(x, &dl);
}

static void test_xent_vp(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    xent_vp_case(&x, 33, 10, 10, 0, false);
    xent_vp_case(&x, 64, 256, 250, 256, true);       /* padded last slice */
    xent_vp_case(&x, 4, 25129, 25128, 25129, false); /* GPT-2's vocabulary over 2 ranks */
    ctx_close(&x);
}

static void xent_case(ctx *x, int N, int V, bool ignore_some, bool alias)
{
    dt_backend *c = x->cpu, *g = x->gpu;
    tp logits = tp_new(x, (size_t)N * V, 3), losses = tp_new(x, (size_t)N, 0),
       dl = tp_new(x, (size_t)N * V, 0);
    ti tgt = ti_new(x, (size_t)N, 0, V);
    if (ignore_some) {
        for (int i = 0; i < N; i += 3)
            tgt.h[i] = i % 2 ? V : -1; /* both ignored */
        ti_upload(x, &tgt);
    }
    int vc = -7, vg = -7;
    float dloss = 1.0f / N;
    float *dlc = alias ? logits.c : dl.c, *dlg = alias ? logits.g : dl.g;
    c->xent_fwd_bwd(c, losses.c, dlc, logits.c, tgt.c, N, V, dloss, &vc);
    g->xent_fwd_bwd(g, losses.g, dlg, logits.g, tgt.g, N, V, dloss, &vg);
    DT_CHECK_INT(vg, vc);
    check(x, "xent losses", &losses, TOL32);
    check(x, alias ? "xent dlogits (in place)" : "xent dlogits", alias ? &logits : &dl, 1e-4);
    /* Without gradient and count. */
    tp_upload(x, &logits);
    c->xent_fwd_bwd(c, losses.c, NULL, logits.c, tgt.c, N, V, dloss, NULL);
    g->xent_fwd_bwd(g, losses.g, NULL, logits.g, tgt.g, N, V, dloss, NULL);
    check(x, "xent losses (no grad)", &losses, TOL32);
    tp_free(x, &logits);
    tp_free(x, &losses);
    tp_free(x, &dl);
}

static void test_xent(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    xent_case(&x, 33, 10, true, false);
    xent_case(&x, 64, 256, false, true);
    xent_case(&x, 4, 50257, true, false); /* GPT-2 vocabulary: 1024-thread rows */
    ctx_close(&x);
}

static void test_batchnorm(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int N = 8, C = 16, HW = 49;
    double count = (double)N * HW;
    tp in = tp_new(&x, (size_t)N * C * HW, 2), out = tp_new(&x, in.n, 0);
    for (size_t i = 0; i < in.n; i++)
        in.h[i] += 1.5f;
    tp_upload(&x, &in);
    tp sum = tp_new(&x, C, 0), sumsq = tp_new(&x, C, 0), mean = tp_new(&x, C, 0),
       rstd = tp_new(&x, C, 0), rm = tp_new(&x, C, 0.1f), rv = tp_new(&x, C, 0),
       w = tp_new(&x, C, 1), b = tp_new(&x, C, 1);
    for (int i = 0; i < C; i++)
        rv.h[i] = 1.0f;
    tp_upload(&x, &rv);
    c->bn_stats(c, sum.c, sumsq.c, in.c, N, C, HW);
    g->bn_stats(g, sum.g, sumsq.g, in.g, N, C, HW);
    check(&x, "bn_stats sum", &sum, 1e-5);
    check(&x, "bn_stats sumsq", &sumsq, 1e-5);
    c->bn_fwd_apply(c, out.c, mean.c, rstd.c, rm.c, rv.c, in.c, w.c, b.c, sum.c, sumsq.c, count,
                    N, C, HW, 0.1f, 1e-5f);
    g->bn_fwd_apply(g, out.g, mean.g, rstd.g, rm.g, rv.g, in.g, w.g, b.g, sum.g, sumsq.g, count,
                    N, C, HW, 0.1f, 1e-5f);
    check(&x, "bn_fwd_apply out", &out, 1e-4);
    check(&x, "bn_fwd_apply mean", &mean, 1e-5);
    check(&x, "bn_fwd_apply rstd", &rstd, 1e-4);
    check(&x, "bn_fwd_apply running_mean", &rm, 1e-5);
    check(&x, "bn_fwd_apply running_var", &rv, 1e-5);
    c->bn_fwd_eval(c, out.c, in.c, rm.c, rv.c, w.c, b.c, N, C, HW, 1e-5f);
    g->bn_fwd_eval(g, out.g, in.g, rm.g, rv.g, w.g, b.g, N, C, HW, 1e-5f);
    check(&x, "bn_fwd_eval", &out, 1e-5);

    tp dout = tp_new(&x, in.n, 1), dinp = tp_new(&x, in.n, 1), dw = tp_new(&x, C, 1),
       db = tp_new(&x, C, 1), sdy = tp_new(&x, C, 0), sdyx = tp_new(&x, C, 0);
    float *dinp0 = copy_host(&dinp), *dw0 = copy_host(&dw), *db0 = copy_host(&db);
    c->bn_bwd_reduce(c, dw.c, db.c, sdy.c, sdyx.c, dout.c, in.c, mean.c, rstd.c, N, C, HW);
    g->bn_bwd_reduce(g, dw.g, db.g, sdy.g, sdyx.g, dout.g, in.g, mean.g, rstd.g, N, C, HW);
    check_added(&x, "bn_bwd_reduce dw", &dw, dw0, 1e-4);
    check_added(&x, "bn_bwd_reduce db", &db, db0, 1e-5);
    check(&x, "bn_bwd_reduce sum_dy", &sdy, 1e-5);
    check(&x, "bn_bwd_reduce sum_dy_xhat", &sdyx, 1e-4);
    c->bn_bwd_apply(c, dinp.c, dout.c, in.c, w.c, mean.c, rstd.c, sdy.c, sdyx.c, count, N, C, HW);
    g->bn_bwd_apply(g, dinp.g, dout.g, in.g, w.g, mean.g, rstd.g, sdy.g, sdyx.g, count, N, C, HW);
    check_added(&x, "bn_bwd_apply dinp", &dinp, dinp0, 1e-4);
    free(dinp0);
    free(dw0);
    free(db0);
    ctx_close(&x);
}

/* BatchNorm when |mean| >> std (mean 1e3, std 1), where E[x^2] - mean^2 in float loses the
 * variance: the GPU's statistics (sum, centred sumsq), rstd, running_var (momentum 1: the batch's
 * unbiased variance) and output match the CPU reference, which is exact there (test_kernels). */
static void test_batchnorm_offset(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int N = 16, C = 4, HW = 1024;
    double count = (double)N * HW;
    tp in = tp_new(&x, (size_t)N * C * HW, 1), out = tp_new(&x, in.n, 0);
    for (size_t i = 0; i < in.n; i++)
        in.h[i] += 1000.0f;
    tp_upload(&x, &in);
    tp sum = tp_new(&x, C, 0), sumsq = tp_new(&x, C, 0), mean = tp_new(&x, C, 0),
       rstd = tp_new(&x, C, 0), rm = tp_new(&x, C, 0), rv = tp_new(&x, C, 0);
    c->bn_stats(c, sum.c, sumsq.c, in.c, N, C, HW);
    g->bn_stats(g, sum.g, sumsq.g, in.g, N, C, HW);
    check(&x, "bn_stats sum (mean 1e3)", &sum, 1e-6);
    check(&x, "bn_stats centred sumsq (mean 1e3)", &sumsq, 1e-5);
    c->bn_fwd_apply(c, out.c, mean.c, rstd.c, rm.c, rv.c, in.c, NULL, NULL, sum.c, sumsq.c, count,
                    N, C, HW, 1.0f, 1e-5f);
    g->bn_fwd_apply(g, out.g, mean.g, rstd.g, rm.g, rv.g, in.g, NULL, NULL, sum.g, sumsq.g, count,
                    N, C, HW, 1.0f, 1e-5f);
    check(&x, "bn_fwd_apply rstd (mean 1e3)", &rstd, 1e-5);
    check(&x, "bn_fwd_apply running_var (mean 1e3)", &rv, 1e-5);
    check(&x, "bn_fwd_apply out (mean 1e3)", &out, 2e-4);
    ctx_close(&x);
}

/* The Makefile's probe for cuDNN and NCCL (needs no GPU): with nvcc but neither library (a fake
 * CUDA_HOME holding only bin/nvcc, the system directories pointed away), `make` reports both as
 * not found, says the CUDA backend is skipped and why, and plans no CUDA link instead of failing;
 * with the toolkit of this machine (when it has one with both) it reports them found. */
static void test_build_probe(void)
{
    char root[PATH_MAX];
    if (!realpath(dt_test_dtrain_bin(), root))
        DT_SKIP("build/dtrain not found (the source tree is located from it)");
    for (int up = 0; up < 2; up++) { /* ROOT/build/dtrain -> ROOT */
        char *slash = strrchr(root, '/');
        if (!slash)
            DT_SKIP("cannot locate the source tree from build/dtrain's path");
        *slash = '\0';
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/Makefile", root);
    if (access(path, R_OK) != 0)
        DT_SKIP("no Makefile next to build/ (DTRAIN_BIN points elsewhere)");
    const char *nvcc = access("/usr/local/cuda/bin/nvcc", X_OK) == 0 ? "/usr/local/cuda/bin/nvcc"
                                                                        : "/bin/true";
    const char *tmp = dt_test_tmpdir();
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/cuda/bin %s/cuda/include %s/cuda/lib64 && "
                              "ln -sf %s %s/cuda/bin/nvcc",
             tmp, tmp, tmp, nvcc, tmp);
    char *out = NULL;
    DT_REQUIRE(dt_test_run(cmd, &out, 30) == 0);
    free(out);
    out = NULL;
    /* features only (no compilation), then a dry run of the whole build */
    snprintf(cmd, sizeof cmd,
             "cd %s && make --no-print-directory CUDA_HOME=%s/cuda CUDA_SYS_INC=%s/none "
             "CUDA_SYS_LIB=%s/none CUDNN_HOME= NCCL_HOME= features && "
             "make --no-print-directory -n CUDA_HOME=%s/cuda CUDA_SYS_INC=%s/none "
             "CUDA_SYS_LIB=%s/none CUDNN_HOME= NCCL_HOME= build/libdtrain.a 2>&1 | "
             "grep -c -- -lcudnn",
             root, tmp, tmp, tmp, tmp, tmp, tmp);
    int rc = dt_test_run(cmd, &out, 120);
    DT_CHECK_MSG(rc == 1, "rc %d (grep -c found a CUDA link, or make failed): %s", rc, out);
    DT_CHECK_CONTAINS(out, "dtrain: cuDNN: no: cudnn.h not found under");
    DT_CHECK_CONTAINS(out, "dtrain: NCCL: no: nccl.h not found under");
    DT_CHECK_CONTAINS(out, "dtrain: CUDA backend: skipped: cuDNN not found (");
    DT_CHECK_CONTAINS(out, "install libcudnn9-dev-cuda-12 or set CUDNN_HOME");
    DT_CHECK_CONTAINS(out, "install libnccl-dev or set NCCL_HOME");
    free(out);
    out = NULL;
    /* cuDNN given through CUDNN_HOME (a copy of the header and the library name): only NCCL is
     * missing now */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/cudnn/include %s/cudnn/lib && touch %s/cudnn/include/cudnn.h "
             "%s/cudnn/lib/libcudnn.so && cd %s && make --no-print-directory CUDA_HOME=%s/cuda "
             "CUDA_SYS_INC=%s/none CUDA_SYS_LIB=%s/none CUDNN_HOME=%s/cudnn NCCL_HOME= features",
             tmp, tmp, tmp, tmp, root, tmp, tmp, tmp, tmp);
    rc = dt_test_run(cmd, &out, 60);
    DT_CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "dtrain: cuDNN: yes (");
    DT_CHECK_CONTAINS(out, "dtrain: CUDA backend: skipped: NCCL not found (nccl.h not found");
    free(out);
    out = NULL;
    /* this machine's toolkit, when it has both */
    if (access("/usr/local/cuda/include/cudnn.h", R_OK) == 0 &&
        access("/usr/local/cuda/include/nccl.h", R_OK) == 0 &&
        access("/usr/local/cuda/lib64/libcudnn.so", R_OK) == 0 &&
        access("/usr/local/cuda/lib64/libnccl.so", R_OK) == 0) {
        snprintf(cmd, sizeof cmd,
                 "cd %s && make --no-print-directory CUDA_HOME=/usr/local/cuda features", root);
        rc = dt_test_run(cmd, &out, 60);
        DT_CHECK_MSG(rc == 0, "rc %d: %s", rc, out);
        DT_CHECK_CONTAINS(out, "dtrain: cuDNN: yes (/usr/local/cuda/include/cudnn.h");
        DT_CHECK_CONTAINS(out, "dtrain: NCCL: yes (/usr/local/cuda/include/nccl.h");
        DT_CHECK_CONTAINS(out, "dtrain: CUDA backend: yes (/usr/local/cuda/bin/nvcc)");
        free(out);
    }
}

static void test_pooling(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    int N = 3, C = 5, H = 11, W = 9, k = 3, stride = 2, pad = 1;
    int P = (H + 2 * pad - k) / stride + 1, Q = (W + 2 * pad - k) / stride + 1;
    tp in = tp_new(&x, (size_t)N * C * H * W, 1), out = tp_new(&x, (size_t)N * C * P * Q, 0);
    ti idx = ti_new(&x, out.n, 0, 1);
    c->maxpool_fwd(c, out.c, idx.c, in.c, N, C, H, W, k, stride, pad);
    g->maxpool_fwd(g, out.g, idx.g, in.g, N, C, H, W, k, stride, pad);
    check(&x, "maxpool_fwd", &out, 0);
    int32_t *ic = malloc(idx.n * 4), *ig = malloc(idx.n * 4);
    c->memcpy_d2h(c, ic, idx.c, idx.n * 4);
    g->memcpy_d2h(g, ig, idx.g, idx.n * 4);
    DT_CHECK(memcmp(ic, ig, idx.n * 4) == 0);
    tp dout = tp_new(&x, out.n, 1), dinp = tp_new(&x, in.n, 1);
    float *dinp0 = copy_host(&dinp);
    c->maxpool_bwd(c, dinp.c, dout.c, idx.c, N, C, H, W, P, Q);
    g->maxpool_bwd(g, dinp.g, dout.g, idx.g, N, C, H, W, P, Q);
    check_added(&x, "maxpool_bwd", &dinp, dinp0, TOL32);

    int HW = 64;
    tp ain = tp_new(&x, (size_t)N * C * HW, 1), aout = tp_new(&x, (size_t)N * C, 0),
       adinp = tp_new(&x, ain.n, 1), adout = tp_new(&x, aout.n, 1);
    float *adinp0 = copy_host(&adinp);
    c->avgpool_fwd(c, aout.c, ain.c, N, C, HW);
    g->avgpool_fwd(g, aout.g, ain.g, N, C, HW);
    check(&x, "avgpool_fwd", &aout, TOL32);
    c->avgpool_bwd(c, adinp.c, adout.c, N, C, HW);
    g->avgpool_bwd(g, adinp.g, adout.g, N, C, HW);
    check_added(&x, "avgpool_bwd", &adinp, adinp0, TOL32);
    free(ic);
    free(ig);
    free(dinp0);
    free(adinp0);
    ctx_close(&x);
}

/* ---- optimisers and reductions ----------------------------------------------------------- */

static void test_optimizers(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    size_t n = 10007;
    tp p = tp_new(&x, n, 1), grad = tp_new(&x, n, 1), m = tp_new(&x, n, 0), v = tp_new(&x, n, 0);
    for (int64_t t = 1; t <= 3; t++) {
        c->adamw_update(c, p.c, grad.c, m.c, v.c, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        g->adamw_update(g, p.g, grad.g, m.g, v.g, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    check(&x, "adamw params", &p, 1e-6);
    check(&x, "adamw m", &m, 1e-6);
    check(&x, "adamw v", &v, 1e-6);
    /* SGD: plain, momentum, Nesterov. */
    struct {
        float mom;
        bool nest;
    } cases[3] = {{0.0f, false}, {0.9f, false}, {0.9f, true}};
    for (int k = 0; k < 3; k++) {
        tp_upload(&x, &p);
        tp buf = tp_new(&x, n, 0);
        for (int s = 0; s < 3; s++) {
            float *bc = cases[k].mom != 0 ? buf.c : NULL, *bg = cases[k].mom != 0 ? buf.g : NULL;
            c->sgd_update(c, p.c, grad.c, bc, n, 0.1f, cases[k].mom, cases[k].nest, 5e-4f, s == 0);
            g->sgd_update(g, p.g, grad.g, bg, n, 0.1f, cases[k].mom, cases[k].nest, 5e-4f, s == 0);
        }
        check(&x, "sgd params", &p, 1e-6);
        tp_free(&x, &buf);
    }
    ctx_close(&x);
}

static void test_reductions(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    size_t n = 1000003;
    tp a = tp_new(&x, n, 1);
    double sc = c->sumsq(c, a.c, n), sg = g->sumsq(g, a.g, n);
    DT_CHECK_NEAR(sg, sc, 1e-9 * sc);
    DT_CHECK(g->sumsq(g, a.g, 0) == 0.0);
    DT_CHECK_INT(g->count_nonfinite(g, a.g, n), 0);
    a.h[5] = NAN;
    a.h[n / 2] = INFINITY;
    a.h[n - 1] = -INFINITY;
    tp_upload(&x, &a);
    DT_CHECK_INT(g->count_nonfinite(g, a.g, n), 3);
    DT_CHECK_INT(g->count_nonfinite(g, a.g, n), c->count_nonfinite(c, a.c, n));
    DT_CHECK_INT(g->count_nonfinite(g, a.g + 6, 10), 0);
    DT_CHECK(!isfinite(g->sumsq(g, a.g, n)));
    ctx_close(&x);
}

/* DDP's 16-bit payloads: the CUDA conversions give the CPU's bits (NaN: a NaN), both ways, with
 * the scale, over normal, subnormal, overflowing and special values. */
static void test_half_payloads(void)
{
    ctx x;
    ctx_open(&x, DT_PREC_FP32);
    dt_backend *c = x.cpu, *g = x.gpu;
    size_t n = 100003;
    tp a = tp_new(&x, n, 1);
    for (size_t i = 0; i < n; i += 7)
        a.h[i] *= (i % 3 == 0) ? 1e5f : (i % 3 == 1) ? 1e-6f : 3e-8f; /* fp16 overflow, subnormals */
    a.h[1] = NAN;
    a.h[2] = INFINITY;
    a.h[3] = -0.0f;
    tp_upload(&x, &a);
    uint16_t *hc = dalloc(c, n * 2), *hg = dalloc(g, n * 2);
    uint16_t *bc = malloc(n * 2), *bg = malloc(n * 2);
    float *wc = malloc(n * 4), *wg = malloc(n * 4);
    float *fc = dalloc(c, n * 4), *fg = dalloc(g, n * 4);
    for (int bf = 0; bf < 2; bf++) {
        const char *name = bf ? "bf16" : "fp16";
        c->to_half(c, hc, a.c, n, 0.5f, bf);
        g->to_half(g, hg, a.g, n, 0.5f, bf);
        c->memcpy_d2h(c, bc, hc, n * 2);
        g->memcpy_d2h(g, bg, hg, n * 2);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++) {
            bool nan_c = (bc[i] & 0x7fff) > (bf ? 0x7f80 : 0x7c00);
            bool nan_g = (bg[i] & 0x7fff) > (bf ? 0x7f80 : 0x7c00);
            if (nan_c != nan_g || (!nan_c && bc[i] != bg[i]))
                first = bad++ ? first : i;
        }
        DT_CHECK_MSG(bad == 0, "to_half %s: %zu of %zu differ, first at %zu: %g -> cpu %#x gpu %#x",
                     name, bad, n, first, (double)a.h[first], bc[first], bg[first]);
        c->from_half(c, fc, hc, n, 2.0f, bf);
        g->from_half(g, fg, hg, n, 2.0f, bf);
        c->memcpy_d2h(c, wc, fc, n * 4);
        g->memcpy_d2h(g, wg, fg, n * 4);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!(wc[i] == wg[i] || (isnan(wc[i]) && isnan(wg[i]))))
                first = bad++ ? first : i;
        DT_CHECK_MSG(bad == 0, "from_half %s: %zu of %zu differ, first at %zu: cpu %g gpu %g",
                     name, bad, n, first, (double)wc[first], (double)wg[first]);
    }
    c->free(c, hc);
    g->free(g, hg);
    c->free(c, fc);
    g->free(g, fg);
    free(bc);
    free(bg);
    free(wc);
    free(wg);
    tp_free(&x, &a);
    ctx_close(&x);
}

/* ---- whole models: forward loss and every gradient, CPU against CUDA -------------------- */

/* Builds cfg on both backends (same seed: same parameters), runs forward and backward on the
 * same batch twice (the second time after moving the parameters off their initialisation, where
 * GELU and softmax are not linear), and compares the loss and every tensor's gradient. */
static void model_case(dt_model_config *cfg, int B, dt_precision prec, double loss_tol,
                       double grad_tol)
{
    ctx x;
    ctx_open(&x, prec);
    dt_err e = {0};
    dt_model *mc = NULL, *mg = NULL;
    DT_REQUIRE_OK(dt_model_create(&mc, cfg, x.cpu, NULL, &e), &e);
    DT_REQUIRE_OK(dt_model_create(&mg, cfg, x.gpu, NULL, &e), &e);
    DT_REQUIRE(mc->num_params == mg->num_params && mc->num_tensors == mg->num_tensors);
    size_t n = mc->num_params;
    float *pc = malloc(n * sizeof(float)), *pg = malloc(n * sizeof(float));
    float *gc = malloc(n * sizeof(float)), *gg = malloc(n * sizeof(float));
    x.cpu->memcpy_d2h(x.cpu, pc, mc->params, n * sizeof(float));
    x.gpu->memcpy_d2h(x.gpu, pg, mg->params, n * sizeof(float));
    DT_CHECK(memcmp(pc, pg, n * sizeof(float)) == 0); /* initialised identically */
    dt_test_batch hb;
    dt_test_batch_make(&hb, cfg, B, 11);
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            dt_rng r;
            dt_rng_seed(&r, 5);
            for (size_t i = 0; i < n; i++)
                pc[i] += 0.05f * dt_rng_normal(&r);
            x.cpu->memcpy_h2d(x.cpu, mc->params, pc, n * sizeof(float));
            x.gpu->memcpy_h2d(x.gpu, mg->params, pc, n * sizeof(float));
        }
        float lc = NAN, lg = NAN;
        x.cpu->memset_zero(x.cpu, mc->grads, n * sizeof(float));
        x.gpu->memset_zero(x.gpu, mg->grads, n * sizeof(float));
        DT_REQUIRE_OK(mc->ops->forward(mc, &hb.b, true, &lc, &e), &e);
        DT_REQUIRE_OK(mg->ops->forward(mg, &hb.b, true, &lg, &e), &e);
        DT_CHECK_MSG(fabs(lg - lc) <= loss_tol * fabs(lc),
                     "%s [%s] round %d: loss gpu %.7g cpu %.7g (rel tol %.1e)",
                     dt_model_arch_name(cfg->arch), prec_name(prec), round, lg, lc, loss_tol);
        DT_REQUIRE_OK(mc->ops->backward(mc, 1.0f, NULL, NULL, &e), &e);
        DT_REQUIRE_OK(mg->ops->backward(mg, 1.0f, NULL, NULL, &e), &e);
        x.cpu->memcpy_d2h(x.cpu, gc, mc->grads, n * sizeof(float));
        x.gpu->memcpy_d2h(x.gpu, gg, mg->grads, n * sizeof(float));
        for (int t = 0; t < mc->num_tensors; t++) {
            const dt_tensor_info *tn = &mc->tensors[t];
            double num = 0, den = 0;
            for (size_t i = tn->offset; i < tn->offset + tn->numel; i++) {
                double d = (double)gg[i] - gc[i];
                num += d * d;
                den += (double)gc[i] * gc[i];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            DT_CHECK_MSG(rel <= grad_tol && isfinite(rel),
                         "%s [%s] round %d: gradient of %s: rel L2 error %.3g (tol %.1e)",
                         dt_model_arch_name(cfg->arch), prec_name(prec), round, tn->name, rel,
                         grad_tol);
        }
    }
    dt_test_batch_free(&hb);
    free(pc);
    free(pg);
    free(gc);
    free(gg);
    dt_model_free(mc);
    dt_model_free(mg);
    ctx_close(&x);
}

static dt_model_config model_gpt(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_GPT;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 128;
    c.shape.vocab_size = 301;
    c.max_batch = 4;
    c.seed = 42;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 128; /* head size 64: the flash kernels apply */
    c.block_size = 128;
    return c;
}

static void test_model_gpt_fp32(void)
{
    dt_model_config c = model_gpt();
    model_case(&c, 4, DT_PREC_FP32, 1e-5, 2e-4);
}

/* bert with the NSP head, padding and token types (fixtures' bert batches). */
static void test_model_bert_fp32(void)
{
    dt_model_config c = model_gpt();
    c.arch = DT_ARCH_BERT;
    c.nsp = true;
    model_case(&c, 4, DT_PREC_FP32, 1e-5, 2e-4);
}

static void test_model_bert_bf16(void)
{
    dt_model_config c = model_gpt();
    c.arch = DT_ARCH_BERT;
    c.nsp = true;
    model_case(&c, 4, DT_PREC_BF16, 1e-2, 6e-2);
}

static void test_model_gpt_bf16(void)
{
    dt_model_config c = model_gpt();
    model_case(&c, 4, DT_PREC_BF16, 1e-2, 6e-2);
}

static void test_model_gpt_bf16_flash(void)
{
    setenv("DTRAIN_CUDA_ATTN", "flash", 1);
    dt_model_config c = model_gpt();
    model_case(&c, 4, DT_PREC_BF16, 1e-2, 6e-2);
}

/* llama: grouped-query attention (2 query heads per kv head), head size 64, a SwiGLU width that
 * is not a multiple of 32 */
static void test_model_llama_fp32(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_LLAMA;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 128;
    c.shape.vocab_size = 301;
    c.max_batch = 4;
    c.seed = 45;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.n_embd = 256;
    c.ffn_hidden = 344;
    c.block_size = 128;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    model_case(&c, 4, DT_PREC_FP32, 1e-5, 2e-4);
}

static void test_model_mlp_fp32(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_MLP;
    c.shape.kind = DT_SAMPLE_VECTOR;
    c.shape.input_dim = 70;
    c.shape.n_classes = 10;
    c.max_batch = 32;
    c.seed = 43;
    c.n_hidden = 2;
    c.hidden[0] = 96;
    c.hidden[1] = 64;
    model_case(&c, 32, DT_PREC_FP32, 1e-5, 1e-4);
}

static dt_model_config model_resnet(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_RESNET;
    c.shape.kind = DT_SAMPLE_IMAGE;
    c.shape.channels = 3;
    c.shape.height = 16;
    c.shape.width = 16;
    c.shape.input_dim = 3 * 16 * 16;
    c.shape.n_classes = 10;
    c.max_batch = 8;
    c.seed = 44;
    c.depth = 8;
    c.width = 8;
    c.bn_momentum = 0.1f;
    c.bn_eps = 1e-5f;
    return c;
}

static void test_model_resnet_fp32(void)
{
    dt_model_config c = model_resnet();
    model_case(&c, 8, DT_PREC_FP32, 1e-5, 5e-4);
}

/* torchvision's ResNet-50 form (7x7 stem, max-pool, Bottlenecks) at width 8 */
static void test_model_resnet50_fp32(void)
{
    dt_model_config c = model_resnet();
    c.imagenet = true;
    c.depth = 50;
    c.width = 8;
    c.shape.height = c.shape.width = 64;
    c.shape.input_dim = 3 * 64 * 64;
    model_case(&c, 8, DT_PREC_FP32, 1e-4, 2e-3);
}

static void test_model_resnet_bf16(void)
{
    dt_model_config c = model_resnet(); /* convolutions in TF32 */
    model_case(&c, 8, DT_PREC_BF16, 1e-2, 5e-2);
}

/* ---- NCCL -------------------------------------------------------------------------------- */

typedef struct nccl_fns {
    dt_nccl_get_unique_id_fn get_id;
    dt_nccl_comm_create_fn create;
} nccl_fns;

static void nccl_load(nccl_fns *f)
{
    void *h = cuda_lib();
    DT_REQUIRE(h);
    f->get_id = (dt_nccl_get_unique_id_fn)(uintptr_t)dlsym(h, DT_NCCL_GET_ID_SYMBOL);
    f->create = (dt_nccl_comm_create_fn)(uintptr_t)dlsym(h, DT_NCCL_CREATE_SYMBOL);
    DT_REQUIRE(f->get_id && f->create);
}

typedef struct rank_job {
    nccl_fns *f;
    const unsigned char *id;
    int rank, world;
    int failures;
    char msg[DT_ERR_MSG_MAX + 256];
} rank_job;

#define RJ_CHECK(j, cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond) && !(j)->failures++)                                                           \
            snprintf((j)->msg, sizeof (j)->msg, __VA_ARGS__);                                      \
    } while (0)

/* One rank (one GPU, one thread): every collective, checked against its closed form. */
static void *rank_main(void *arg)
{
    rank_job *j = arg;
    dt_err e = {0};
    dt_backend *be = NULL;
    dt_backend_opts o;
    dt_backend_opts_default(&o);
    o.device_index = j->rank;
    if (dt_backend_open(&be, DT_BACKEND_CUDA, &o, &e) != 0) {
        RJ_CHECK(j, 0, "rank %d: backend: %s", j->rank, e.msg);
        return NULL;
    }
    dt_comm_opts co;
    memset(&co, 0, sizeof co);
    co.backend = DT_COMM_NCCL;
    co.rank = j->rank;
    co.world_size = j->world;
    co.local_rank = j->rank;
    co.local_world_size = j->world;
    co.device_index = j->rank;
    co.timeout_ms = 60000;
    const dt_comm_backend_ops *ops = NULL;
    void *self = NULL;
    if (j->f->create(&co, j->id, &ops, &self, &e) != 0) {
        RJ_CHECK(j, 0, "rank %d: create: %s", j->rank, e.msg);
        dt_backend_close(be);
        return NULL;
    }
    int W = j->world, r = j->rank;
    size_t n = 1000;
    float *buf = NULL, *big = NULL, *h = malloc(n * W * sizeof(float));
    be->alloc(be, (void **)&buf, n * sizeof(float), &e);
    be->alloc(be, (void **)&big, n * W * sizeof(float), &e);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(r + 1) + (float)i;
    be->memcpy_h2d(be, buf, h, n * sizeof(float));
    /* sum: sum_r (r+1+i) = W(W+1)/2 + W i; produced on the compute stream just before. */
    dt_comm_work *wk = NULL;
    RJ_CHECK(j, ops->allreduce(self, buf, n, DT_FLOAT32, DT_SUM, &wk, &e) == 0, "allreduce: %s",
             e.msg);
    RJ_CHECK(j, ops->wait(self, wk, &e) == 0, "wait: %s", e.msg);
    be->memcpy_d2h(be, h, buf, n * sizeof(float));
    RJ_CHECK(j, h[0] == W * (W + 1) / 2.0f && h[n - 1] == W * (W + 1) / 2.0f + W * (n - 1.0f),
             "rank %d: allreduce sum gave %g, %g", r, h[0], h[n - 1]);
    /* avg of the sums: unchanged. */
    RJ_CHECK(j, ops->allreduce(self, buf, n, DT_FLOAT32, DT_AVG, NULL, &e) == 0, "avg: %s", e.msg);
    be->memcpy_d2h(be, h, buf, n * sizeof(float));
    RJ_CHECK(j, h[1] == W * (W + 1) / 2.0f + W, "rank %d: allreduce avg gave %g", r, h[1]);
    /* reduce the sums (still W(W+1)/2 + W i on every rank) to the last rank: W times them. */
    RJ_CHECK(j, ops->reduce != NULL, "nccl backend without reduce");
    if (ops->reduce) {
        RJ_CHECK(j, ops->reduce(self, buf, n, DT_FLOAT32, DT_SUM, W - 1, NULL, &e) == 0,
                 "reduce: %s", e.msg);
        be->memcpy_d2h(be, h, buf, n * sizeof(float));
        RJ_CHECK(j, r != W - 1 || h[1] == W * (W * (W + 1) / 2.0f + W),
                 "rank %d: reduce to root gave %g", r, h[1]);
    }
    /* broadcast from the last rank. */
    for (size_t i = 0; i < n; i++)
        h[i] = (float)r;
    be->memcpy_h2d(be, buf, h, n * sizeof(float));
    RJ_CHECK(j, ops->broadcast(self, buf, n, DT_FLOAT32, W - 1, NULL, &e) == 0, "bcast: %s",
             e.msg);
    be->memcpy_d2h(be, h, buf, n * sizeof(float));
    RJ_CHECK(j, h[0] == W - 1 && h[n - 1] == W - 1, "rank %d: broadcast gave %g", r, h[0]);
    /* allgather: recv = rank-major concatenation. */
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(100 * r) + (float)i;
    be->memcpy_h2d(be, buf, h, n * sizeof(float));
    RJ_CHECK(j, ops->allgather(self, buf, big, n, DT_FLOAT32, NULL, &e) == 0, "allgather: %s",
             e.msg);
    be->memcpy_d2h(be, h, big, n * W * sizeof(float));
    for (int q = 0; q < W; q++)
        RJ_CHECK(j, h[(size_t)q * n + 7] == 100.0f * q + 7, "rank %d: allgather block %d: %g", r,
                 q, h[(size_t)q * n + 7]);
    /* reduce_scatter of the gathered blocks: rank r gets W * block r. */
    RJ_CHECK(j, ops->reduce_scatter(self, big, buf, n, DT_FLOAT32, DT_SUM, NULL, &e) == 0,
             "reduce_scatter: %s", e.msg);
    be->memcpy_d2h(be, h, buf, n * sizeof(float));
    RJ_CHECK(j, h[7] == W * (100.0f * r + 7), "rank %d: reduce_scatter gave %g", r, h[7]);
    RJ_CHECK(j, ops->barrier(self, &e) == 0, "barrier: %s", e.msg);
    ops->destroy(self);
    be->free(be, buf);
    be->free(be, big);
    free(h);
    dt_backend_close(be);
    return NULL;
}

static void test_nccl_collectives(void)
{
    require_gpu();
    nccl_fns f;
    nccl_load(&f);
    unsigned char id[DT_NCCL_ID_BYTES];
    dt_err e = {0};
    DT_REQUIRE_OK(f.get_id(id, &e), &e);
    /* One thread per GPU, one communicator each: the single-process (DP) layout; with one GPU
     * this is a world of one. */
    int W = gpu_count < 8 ? gpu_count : 8;
    rank_job jobs[8];
    pthread_t th[8];
    for (int r = 0; r < W; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].f = &f;
        jobs[r].id = id;
        jobs[r].rank = r;
        jobs[r].world = W;
        DT_REQUIRE(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        DT_CHECK_MSG(jobs[r].failures == 0, "rank %d of %d: %s", r, W, jobs[r].msg);
    }
    printf("    nccl collectives checked on %d GPU(s)\n", W);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* A peer that never joins: creation must fail with -ETIMEDOUT within the timeout, not hang. */
static void test_nccl_timeout(void)
{
    require_gpu();
    nccl_fns f;
    nccl_load(&f);
    unsigned char id[DT_NCCL_ID_BYTES];
    dt_err e = {0};
    DT_REQUIRE_OK(f.get_id(id, &e), &e);
    dt_comm_opts co;
    memset(&co, 0, sizeof co);
    co.backend = DT_COMM_NCCL;
    co.rank = 0;
    co.world_size = 2;
    co.local_world_size = 2;
    co.timeout_ms = 3000;
    const dt_comm_backend_ops *ops = NULL;
    void *self = NULL;
    double t0 = mono();
    int rc = f.create(&co, id, &ops, &self, &e);
    double dt = mono() - t0;
    DT_CHECK_MSG(rc == -ETIMEDOUT, "create returned %d (%s)", rc, e.msg);
    DT_CHECK_CONTAINS(e.msg, "rank 0");
    DT_CHECK_MSG(dt >= 2.5 && dt < 30, "gave up after %.1f s (timeout 3 s)", dt);
    if (rc == 0)
        ops->destroy(self);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--probe-gpu"))
        return probe_main();
    static const dt_test tests[] = {
        {"gpu_library_symbols", test_library_symbols, 60},
        {"gpu_build_probe", test_build_probe, 120},
        {"gpu_memory", test_memory, 60},
        {"gpu_vmm", test_vmm, 60},
        {"gpu_vmm_off", test_vmm_off, 60},
        {"gpu_profile", test_profile, 60},
        {"gpu_matmul_fp32", test_matmul_fp32, 120},
        {"gpu_matmul_bf16", test_matmul_bf16, 120},
        {"gpu_matmul_fp16", test_matmul_fp16, 120},
        {"gpu_matmul_bf16_fast", test_matmul_bf16_fast, 120},
        {"gpu_attention_fp32", test_attention_fp32, 120},
        {"gpu_attention_bf16", test_attention_bf16, 120},
        {"gpu_attention_pad_fp32", test_attention_pad_fp32, 120},
        {"gpu_attention_pad_bf16", test_attention_pad_bf16, 120},
        {"gpu_attention_fp16", test_attention_fp16, 120},
        {"gpu_attention_bf16_fast", test_attention_bf16_fast, 120},
        {"gpu_attention_hs64_fp32", test_attention_hs64_fp32, 120},
        {"gpu_attention_hs64_bf16", test_attention_hs64_bf16, 120},
        {"gpu_attention_flash_bf16", test_attention_flash_bf16, 120},
        {"gpu_attention_flash_fp16", test_attention_flash_fp16, 120},
        {"gpu_conv2d_fp32", test_conv_fp32, 120},
        {"gpu_conv2d_bf16", test_conv_bf16, 120},
        {"gpu_bias_layernorm", test_bias_layernorm, 60},
        {"gpu_decoder_ops", test_decoder_ops, 60},
        {"gpu_elementwise", test_elementwise, 60},
        {"gpu_embedding", test_embedding, 60},
        {"gpu_xent", test_xent, 60},
        {"gpu_embedding_vp", test_embedding_vp, 60},
        {"gpu_xent_vp", test_xent_vp, 60},
        {"gpu_batchnorm", test_batchnorm, 60},
        {"gpu_batchnorm_offset", test_batchnorm_offset, 60},
        {"gpu_pooling", test_pooling, 60},
        {"gpu_optimizers", test_optimizers, 60},
        {"gpu_reductions", test_reductions, 60},
        {"gpu_half_payloads", test_half_payloads, 60},
        {"gpu_model_gpt_fp32", test_model_gpt_fp32, 180},
        {"gpu_model_bert_fp32", test_model_bert_fp32, 180},
        {"gpu_model_bert_bf16", test_model_bert_bf16, 180},
        {"gpu_model_gpt_bf16", test_model_gpt_bf16, 180},
        {"gpu_model_gpt_bf16_flash", test_model_gpt_bf16_flash, 180},
        {"gpu_model_llama_fp32", test_model_llama_fp32, 180},
        {"gpu_model_mlp_fp32", test_model_mlp_fp32, 120},
        {"gpu_model_resnet_fp32", test_model_resnet_fp32, 180},
        {"gpu_model_resnet_bf16", test_model_resnet_bf16, 180},
        {"gpu_model_resnet50_fp32", test_model_resnet50_fp32, 180},
        {"gpu_nccl_collectives", test_nccl_collectives, 180},
        {"gpu_nccl_timeout", test_nccl_timeout, 120},
    };
    bool listing = false;
    for (int i = 1; i < argc; i++)
        listing |= !strcmp(argv[i], "-l");
    if (!listing)
        probe();
    return dt_test_main("test_gpu_ops", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
