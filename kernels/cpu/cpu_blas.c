/* cpu_blas.c - see cpu_blas.h. */
#include "kernels/cpu/cpu_blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/cpuid.h"
#include "common/util.h"

#define SSE_ (DT_CPUF_SSE2 | DT_CPUF_SSE3)
#define SSE4_ (SSE_ | DT_CPUF_SSSE3 | DT_CPUF_SSE41 | DT_CPUF_SSE42)
#define AVX_ (SSE4_ | DT_CPUF_AVX)
#define AVX2_ (AVX_ | DT_CPUF_AVX2 | DT_CPUF_FMA)
#define AVX512_                                                                                    \
    (AVX2_ | DT_CPUF_AVX512F | DT_CPUF_AVX512DQ | DT_CPUF_AVX512CD | DT_CPUF_AVX512BW |            \
     DT_CPUF_AVX512VL)

/* OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH kernels (driver/others/dynamic.c), worst to best
 * within each level; the order is the rank. */
static const dt_blas_kernel kernels[] = {
    {"Katmai", "gotoblas_KATMAI", 0, 0, false},
    {"Coppermine", "gotoblas_COPPERMINE", 0, 0, false},
    {"Northwood", "gotoblas_NORTHWOOD", 0, DT_CPUF_SSE2, false},
    {"Banias", "gotoblas_BANIAS", 0, DT_CPUF_SSE2, false},
    {"Athlon", "gotoblas_ATHLON", 0, 0, false},
    {"Opteron", "gotoblas_OPTERON", 0, DT_CPUF_SSE2, false},
    {"Opteron_SSE3", "gotoblas_OPTERON_SSE3", 0, SSE_, false},
    {"Atom", "gotoblas_ATOM", 0, SSE_ | DT_CPUF_SSSE3, false},
    {"Nano", "gotoblas_NANO", 0, SSE_ | DT_CPUF_SSSE3, false},
    {"Bobcat", "gotoblas_BOBCAT", 0, SSE_ | DT_CPUF_SSSE3, false},
    {"Barcelona", "gotoblas_BARCELONA", 0, SSE_, false},
    {"Prescott", "gotoblas_PRESCOTT", 0, SSE_, false},
    {"Core2", "gotoblas_CORE2", 0, SSE_ | DT_CPUF_SSSE3, false},
    {"Penryn", "gotoblas_PENRYN", 0, SSE_ | DT_CPUF_SSSE3 | DT_CPUF_SSE41, false},
    {"Dunnington", "gotoblas_DUNNINGTON", 0, SSE_ | DT_CPUF_SSSE3 | DT_CPUF_SSE41, false},
    {"Nehalem", "gotoblas_NEHALEM", 1, SSE4_, true},
    {"Bulldozer", "gotoblas_BULLDOZER", 2, AVX_, false},
    {"Piledriver", "gotoblas_PILEDRIVER", 2, AVX_ | DT_CPUF_FMA, false},
    {"Steamroller", "gotoblas_STEAMROLLER", 2, AVX_ | DT_CPUF_FMA, false},
    {"Sandybridge", "gotoblas_SANDYBRIDGE", 2, AVX_, true},
    {"Excavator", "gotoblas_EXCAVATOR", 3, AVX2_, false},
    {"Zen", "gotoblas_ZEN", 3, AVX2_, false},
    {"Haswell", "gotoblas_HASWELL", 3, AVX2_, true},
    {"SkylakeX", "gotoblas_SKYLAKEX", 4, AVX512_, true},
    {"Cooperlake", "gotoblas_COOPERLAKE", 4, AVX512_ | DT_CPUF_AVX512BF16, true},
    {"SapphireRapids", "gotoblas_SAPPHIRERAPIDS", 4,
     AVX512_ | DT_CPUF_AVX512BF16 | DT_CPUF_AVX512FP16 | DT_CPUF_AMX_TILE | DT_CPUF_AMX_BF16,
     true},
};

const dt_blas_kernel *dt_blas_kernel_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < DT_ARRAY_LEN(kernels); i++)
        if (!strcasecmp(kernels[i].name, name))
            return &kernels[i];
    return NULL;
}

const char *dt_blas_level_name(int level)
{
    static const char *const names[DT_BLAS_LEVELS] = {"SSE2/SSE3", "SSE4.2", "AVX", "AVX2+FMA",
                                                      "AVX-512"};
    return level >= 0 && level < DT_BLAS_LEVELS ? names[level] : "?";
}

void dt_blas_plan_make(dt_blas_plan *p, uint32_t features, const char *chosen, dt_blas_has_fn has,
                       void *ctx, bool force)
{
    memset(p, 0, sizeof *p);
    p->chosen = dt_blas_kernel_find(chosen);
    for (size_t i = DT_ARRAY_LEN(kernels); i-- > 0;) {
        const dt_blas_kernel *k = &kernels[i];
        if (k->propose && (k->needs & ~features) == 0 && (!has || has(k, ctx))) {
            p->best = k;
            break;
        }
    }
    if (!p->chosen) {
        snprintf(p->why, sizeof p->why,
                 "OpenBLAS chose %s, a kernel this build of dtrain does not know: left alone",
                 chosen && *chosen ? chosen : "(none)");
        return;
    }
    if (!p->best) {
        snprintf(p->why, sizeof p->why,
                 "OpenBLAS chose %s; no kernel dtrain may choose runs on this CPU (or is in the "
                 "library): left alone",
                 p->chosen->name);
        return;
    }
    const int gap = p->best->level - p->chosen->level;
    if (gap < 2 && !force) {
        snprintf(p->why, sizeof p->why,
                 "OpenBLAS chose %s (%s); the best this CPU runs is %s (%s): %s", p->chosen->name,
                 dt_blas_level_name(p->chosen->level), p->best->name,
                 dt_blas_level_name(p->best->level),
                 gap <= 0 ? "nothing to do" : "one level apart, OpenBLAS's choice is kept");
        return;
    }
    const int min_level = force ? p->chosen->level : p->chosen->level + 2;
    for (size_t i = DT_ARRAY_LEN(kernels); i-- > 0 && p->n < (int)DT_ARRAY_LEN(p->cand);) {
        const dt_blas_kernel *k = &kernels[i];
        if (k != p->chosen && k->propose && k->level >= min_level &&
            (k->needs & ~features) == 0 && (!has || has(k, ctx)))
            p->cand[p->n++] = k;
    }
    int off = snprintf(p->why, sizeof p->why, "OpenBLAS chose %s (%s) on a CPU that runs %s (%s)",
                       p->chosen->name, dt_blas_level_name(p->chosen->level), p->best->name,
                       dt_blas_level_name(p->best->level));
    if (force && gap < 2)
        off += snprintf(p->why + off, sizeof p->why - (size_t)DT_MIN(off, (int)sizeof p->why),
                        "; DTRAIN_BLAS_PROBE=force");
    if (p->n == 0) {
        snprintf(p->why + DT_MIN(off, (int)sizeof p->why - 1),
                 sizeof p->why - (size_t)DT_MIN(off, (int)sizeof p->why - 1),
                 ": no other kernel to try");
        return;
    }
    for (int i = 0; i < p->n && off < (int)sizeof p->why; i++)
        off += snprintf(p->why + off, sizeof p->why - (size_t)off, "%s%s",
                        i == 0 ? ": trying " : ", ", p->cand[i]->name);
}

/* ---- the running library ------------------------------------------------------------------ */

const char *dt_blas_corename(void)
{
    const char *s = openblas_get_corename();
    return s ? s : "";
}

const char *dt_blas_config(void)
{
    const char *s = openblas_get_config();
    return s ? s : "";
}

bool dt_blas_has_kernel(const dt_blas_kernel *k, void *ctx)
{
    (void)ctx;
    return dlsym(RTLD_DEFAULT, k->sym) != NULL;
}

const char *dt_blas_library_path(void)
{
    static char path[1024];
    Dl_info info;
    if (!path[0] && dladdr((void *)cblas_sgemm, &info) && info.dli_fname)
        dt_strlcpy(path, info.dli_fname, sizeof path);
    return path;
}

/* ---- the check ---------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU time of the calling thread: on one BLAS thread the sgemm runs in it, and time the thread
 * spent waiting for a CPU on a loaded machine does not count against the kernel. */
static double thread_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill(float *x, size_t n, uint32_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 1664525u + 1013904223u;
        x[i] = (float)((double)(*state >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    }
}

/* Worst normalised error of one C = alpha op(A) op(B) + beta C, row-major, against double. */
static double check_one(bool ta, bool tb, int M, int N, int K, float beta, uint32_t *seed)
{
    const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
    const size_t nc = (size_t)M * ldc;
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    float *c = malloc(nc * sizeof(float)), *c0 = malloc(nc * sizeof(float));
    double worst = INFINITY;
    if (!a || !b || !c || !c0)
        goto out;
    fill(a, na, seed);
    fill(b, nb, seed);
    fill(c0, nc, seed);
    memcpy(c, c0, nc * sizeof(float));
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, 1.0f, a, lda, b, ldb, beta, c, ldc);
    worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = beta * (double)c0[(size_t)i * ldc + j], mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double x = ta ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k];
                double y = tb ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j];
                ref += x * y;
                mag += fabs(x * y);
            }
            double e = fabs((double)c[(size_t)i * ldc + j] - ref) / (mag > 0 ? mag : 1.0);
            if (!(e <= worst)) /* NaN counts as the worst */
                worst = isnan(e) ? INFINITY : e;
        }
out:
    free(a);
    free(b);
    free(c);
    free(c0);
    return worst;
}

double dt_blas_sgemm_rate(int M, int N, int K, double min_time)
{
    float *a = calloc((size_t)M * K, sizeof(float)), *b = calloc((size_t)N * K, sizeof(float));
    float *c = calloc((size_t)M * N, sizeof(float));
    double best = 0;
    if (!a || !b || !c)
        goto out;
    uint32_t seed = 7;
    fill(a, (size_t)M * K, &seed);
    fill(b, (size_t)N * K, &seed);
    const int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    double t_start = thread_s();
    for (int rep = 0; rep < 1000 && (rep < 4 || thread_s() - t_start < min_time); rep++) {
        double t0 = thread_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c,
                    N);
        double t = thread_s() - t0;
        if (rep > 0 && t > 0 && 2.0 * M * N * K / t > best) /* rep 0 warms the caches */
            best = 2.0 * M * N * K / t;
    }
    openblas_set_num_threads(threads);
out:
    free(a);
    free(b);
    free(c);
    return best / 1e9;
}

void dt_blas_check_run(dt_blas_check *out, double min_time)
{
    static const struct {
        int M, N, K;
    } shapes[] = {{67, 45, 33}, {1, 100, 257}, {130, 66, 65}, {33, 128, 64}};
    memset(out, 0, sizeof *out);
    double t0 = now_s();
    dt_strlcpy(out->corename, dt_blas_corename(), sizeof out->corename);
    const int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    uint32_t seed = 12345;
    for (size_t s = 0; s < DT_ARRAY_LEN(shapes); s++)
        for (int form = 0; form < 3; form++) /* A B, A B^T (matmul fwd), A^T B (its dW) */
            for (int beta = 0; beta < 2; beta++) {
                double e = check_one(form == 2, form == 1, shapes[s].M, shapes[s].N, shapes[s].K,
                                     (float)beta, &seed);
                if (!(e <= out->max_err))
                    out->max_err = e;
            }
    openblas_set_num_threads(threads);
    out->ok = out->max_err <= DT_BLAS_ERR_MAX;
    out->gflops = dt_blas_sgemm_rate(512, 512, 512, min_time);
    out->seconds = now_s() - t0;
}
