/* cpu_blas.h - which OpenBLAS kernel runs the CPU backend's GEMMs, and a check of one.
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's 0.3.21) holds one GEMM kernel per CPU generation and picks
 * one when it is loaded, from the CPUID family/model numbers it knows; on a model newer than
 * its table it falls back to Prescott (SSE3), which on an AVX-512 Xeon runs sgemm at about a
 * fifth of the SkylakeX kernel's rate (issue 30: 31.6 against 153 GFLOP/s on one core).
 * OPENBLAS_CORETYPE=NAME, read when the library loads, forces a kernel. This module knows the
 * x86-64 kernels, what each executes and how they rank (the plan: which ones to try, a pure
 * function of the CPU's features and OpenBLAS's choice), and checks the kernel this process
 * runs (the check: GEMMs against a double-precision reference, and a timing). Choosing means
 * loading OpenBLAS anew, so the probing itself runs in helper processes: cmd/blas_boot.h.
 */
#ifndef DT_KERNELS_CPU_BLAS_H
#define DT_KERNELS_CPU_BLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Instruction-set levels of the kernels, for "far below": 0 SSE2/SSE3, 1 SSE4.2, 2 AVX,
 * 3 AVX2+FMA, 4 AVX-512. */
#define DT_BLAS_LEVELS 5

typedef struct dt_blas_kernel {
    const char *name;  /* OpenBLAS's spelling (openblas_get_corename; OPENBLAS_CORETYPE takes it
                          in any case): "SkylakeX" */
    const char *sym;   /* its parameter table in a DYNAMIC_ARCH library: "gotoblas_SKYLAKEX" */
    int level;         /* 0..DT_BLAS_LEVELS-1 */
    uint32_t needs;    /* DT_CPUF_* (common/cpuid.h) its code executes */
    bool propose;      /* dtrain may choose it: the Intel line (Nehalem .. SapphireRapids), which
                          every x86-64 CPU with the features runs; the AMD-specific kernels
                          (Bulldozer's FMA4, Zen) are left to OpenBLAS's own detection */
} dt_blas_kernel;

/* The kernel named name (case-insensitive), or NULL. */
const dt_blas_kernel *dt_blas_kernel_find(const char *name);
/* "AVX-512", "AVX2+FMA", ... */
const char *dt_blas_level_name(int level);

/* What to probe. */
typedef struct dt_blas_plan {
    const dt_blas_kernel *chosen; /* OpenBLAS's choice, NULL when its name is unknown here */
    const dt_blas_kernel *best;   /* the best kernel the features allow and the library has */
    int n;                        /* candidates, best first; 0 = nothing to do */
    const dt_blas_kernel *cand[3];
    char why[256];                /* one sentence for the log */
} dt_blas_plan;

/* Does the library hold kernel k? (ctx: the caller's) */
typedef bool (*dt_blas_has_fn)(const dt_blas_kernel *k, void *ctx);

/* The decision, a pure function: features (DT_CPUF_*), the name of the kernel OpenBLAS chose,
 * has (NULL: every kernel is there). Candidates are the proposable kernels the features allow
 * and the library has, other than the chosen one, best first (at most 3): when the best of
 * them is two or more levels above OpenBLAS's choice ("far below": Prescott or Nehalem on an
 * AVX2 or AVX-512 CPU, Sandybridge on AVX-512), those at least two levels above it; with force
 * (DTRAIN_BLAS_PROBE=force), those at its level or above, even when its choice looks right.
 * One level apart (Haswell on an AVX-512 CPU, which OpenBLAS picks on purpose on some CPUs)
 * and unknown names (a kernel newer than this table) are left alone. */
void dt_blas_plan_make(dt_blas_plan *p, uint32_t features, const char *chosen, dt_blas_has_fn has,
                       void *ctx, bool force);

/* The running library: openblas_get_corename(), openblas_get_config() (static strings), and
 * whether it holds k (a DYNAMIC_ARCH build exports each kernel's gotoblas_<NAME> table). */
const char *dt_blas_corename(void);
const char *dt_blas_config(void);
bool dt_blas_has_kernel(const dt_blas_kernel *k, void *ctx);
/* The path of the shared object cblas_sgemm comes from ("" when unknown). */
const char *dt_blas_library_path(void);

/* Largest normalised error a passing kernel may show: |c - ref| / (sum_k |a_ik b_kj| +
 * |beta c0_ij|), float32 accumulation over up to 257 terms (a wrong kernel is off by O(1)). */
#define DT_BLAS_ERR_MAX 5e-5

typedef struct dt_blas_check {
    char corename[32]; /* the kernel that ran */
    double max_err;    /* worst normalised error over the shapes */
    double gflops;     /* best single-thread rate of a 512^3 sgemm (A @ B^T, matmul's form) */
    double seconds;    /* the check's own wall time */
    bool ok;           /* max_err <= DT_BLAS_ERR_MAX (and finite) */
} dt_blas_check;

/* Runs the check on this process's kernel, on one BLAS thread (the count is restored after):
 * C = alpha op(A) op(B) + beta C in the three forms the cpu backend uses (A B, A B^T, A^T B),
 * beta 0 and 1, on shapes with edge tiles (1, 33, 45, 65, 66, 67, 130, 257 rows or columns,
 * leading dimensions padded), against double precision; then dt_blas_sgemm_rate(512^3). */
void dt_blas_check_run(dt_blas_check *out, double min_time);

/* The best single-thread rate of an M x N x K sgemm (A @ B^T) over min_time seconds of this
 * thread's CPU time (at least 4 runs, the first not counted): waiting for a CPU on a loaded
 * machine does not count, a hardware-thread sibling's load does. */
double dt_blas_sgemm_rate(int M, int N, int K, double min_time);

#endif
