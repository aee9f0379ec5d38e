/* blas_boot.h - the OpenBLAS kernel dtrain's processes run with.
 *
 * OpenBLAS picks its GEMM kernel when the library is loaded, so the choice has to be made
 * before a process starts: through OPENBLAS_CORETYPE in its environment. At start-up
 * (dt_blas_boot, first thing in main() of dtrain and of every test binary), and for the
 * workers the agent starts (dt_blas_choose, cmd/dtrain.c), when OPENBLAS_CORETYPE is not set:
 *
 *   1. the plan (kernels/cpu/cpu_blas.h): this CPU's features (common/cpuid.h) against the
 *      kernel OpenBLAS chose; when it chose one far below what the CPU runs, a few candidates;
 *   2. the cache: the verdict for this machine, keyed by the CPU (brand, family/model/stepping,
 *      features) and the library (OpenBLAS's configuration string, the path, size and mtime of
 *      the shared object), in $DTRAIN_BLAS_CACHE or $XDG_CACHE_HOME/dtrain, ~/.cache/dtrain,
 *      /tmp/dtrain-<uid> (the first that works);
 *   3. else the probe: each candidate in a short-lived helper process (this program re-run as
 *      `PROGRAM --dtrain-blas-probe` with OPENBLAS_CORETYPE=CANDIDATE) runs the check
 *      (GEMMs of the backend's forms and edge shapes against double precision, and a timing);
 *      a candidate that crashes, hangs, is refused by OpenBLAS, computes wrong results or is
 *      not 1.1x faster than OpenBLAS's own choice (timed by a helper too, and again before a
 *      candidate wins; rates are per CPU-second of the helper's thread, so a loaded machine's
 *      waiting does not count) is not used, with a warning that says which and why; of those
 *      that pass, the fastest is chosen (a better-ranked one within 3% of it preferred); the
 *      verdict is cached.
 *
 * A chosen kernel goes into OPENBLAS_CORETYPE (and what was found into DTRAIN_BLAS_CHOICE, for
 * the logs) of the workers (the agent adds them to built-in workers' environment: agent.h's
 * worker_env) or of the process itself, which then re-executes itself once (dt_blas_boot with
 * apply). An OPENBLAS_CORETYPE that is set - by the user, the machine, or a dtrain parent - is
 * always respected: nothing here changes or unsets it, nor any other OPENBLAS_* variable.
 * DTRAIN_BLAS_PROBE=off skips all of it; =force probes even when OpenBLAS's choice looks right
 * (and ignores the cache), to check the machinery; DTRAIN_BLAS_AS_IF=Prescott plays the issue's
 * machine on one where OpenBLAS chose well (tests/test_blas.c). Cost: nothing but CPUID and a
 * table lookup when there is nothing to do (this machine: OpenBLAS already runs SkylakeX); a
 * cache read when there is; a probe once per machine and library: up to five helpers of about
 * 0.05 s of CPU each (docs/cpu-kernels.md).
 */
#ifndef DT_CMD_BLAS_BOOT_H
#define DT_CMD_BLAS_BOOT_H

#include <stdbool.h>
#include <stddef.h>

/* argv[1] of the probe helper. */
#define DT_BLAS_PROBE_ARG "--dtrain-blas-probe"

typedef struct dt_blas_choice {
    char coretype[32];     /* the kernel to put in OPENBLAS_CORETYPE; "" = none (keep what runs) */
    char note[512];        /* what was found, one sentence */
    double gflops;         /* measured rate of the kernel that will run (0: not measured) */
    double gflops_default; /* measured rate of OpenBLAS's own choice (0: not measured) */
    bool cached;           /* the verdict came from the cache */
    int probes;            /* helper processes run now */
    double probe_seconds;  /* time the probing took (0: none) */
} dt_blas_choice;

/* First thing in main(). argv[1] == DT_BLAS_PROBE_ARG: this process is a probe helper; it runs
 * the check, prints its result on stdout and the caller returns the value (an exit code).
 * Otherwise returns -1 (go on) after, when apply is true and dtrain chose a kernel, setting
 * OPENBLAS_CORETYPE and DTRAIN_BLAS_CHOICE and re-executing the program with argv (it does not
 * return then; if the exec fails it warns, unsets the two and goes on with OpenBLAS's kernel). */
int dt_blas_boot(int argc, char **argv, bool apply);

/* The decision for this machine (steps 1-3 above), without touching the environment. */
void dt_blas_choose(dt_blas_choice *c);

/* DTRAIN_BLAS_CHOICE's value for a choice with a kernel: "NAME GFLOPS NOTE". */
void dt_blas_choice_value(const dt_blas_choice *c, char *buf, size_t cap);

/* "OpenBLAS 0.3.21 kernel SkylakeX (OpenBLAS's own choice: ...)": which kernel this process
 * runs and how it came to run it; with measure, plus the rate of a 512^3 sgemm on one thread
 * (a few milliseconds). */
void dt_blas_describe(char *buf, size_t cap, bool measure);

/* One probe: exe (NULL: this program) run as the helper with OPENBLAS_CORETYPE=coretype (NULL:
 * unset, OpenBLAS's own choice) and DTRAIN_BLAS_PROBE=off, killed after timeout_s. */
typedef struct dt_blas_probe_out {
    bool ran;          /* the helper printed its result line */
    char core[32];     /* the kernel it ran */
    double gflops, max_err, seconds; /* its check (seconds: the whole helper, start to exit) */
    bool ok;           /* its check passed */
    char why[256];     /* when it did not run: crashed (signal), exit status, timeout, output */
} dt_blas_probe_out;
void dt_blas_probe(const char *exe, const char *coretype, double timeout_s,
                   dt_blas_probe_out *out);

#endif
