/* test_blas.c - the OpenBLAS kernel dtrain runs with (kernels/cpu/cpu_blas.h, cmd/blas_boot.h).
 *
 * - plan_table: the decision as a pure function of CPU features, OpenBLAS's choice and the
 *   library's kernels, over a table of cases (this machine: nothing to do; issue 30's: Prescott
 *   on AVX-512 -> Cooperlake/SkylakeX; one level apart, unknown names, an OS without AVX-512
 *   state, a library without the kernels, force);
 * - cpuid_matches_proc: the features read with CPUID against /proc/cpuinfo's flags;
 * - check_here, probe_here: the check in this process and in a helper, on this machine as it is;
 * - force_here: DTRAIN_BLAS_PROBE=force runs the probe here and returns a sane verdict (cached);
 * - as_if_prescott: the issue's machine played with DTRAIN_BLAS_AS_IF=Prescott: a kernel at
 *   least 1.1x faster is chosen after real probes, then comes from the cache without probing;
 * - bad_candidates: helpers that crash, hang, compute wrong results, are refused by OpenBLAS or
 *   are slow (this binary run as a fake helper, DT_TEST_BLAS_FAKE) are not used, with warnings
 *   that say why, and the first good one is;
 * - coretype_untouched, agent_env_defaults, dtrain_*: a set OPENBLAS_CORETYPE (and
 *   OPENBLAS_L2_SIZE) is never changed or unset, in-process, by `dtrain bench`, by
 *   `dtrain worker` and by the agent's workers; the agent gives built-in workers dtrain's choice
 *   and user commands nothing; a binary started directly re-executes itself once with it. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cmd/blas_boot.h"
#include "common/cpuid.h"
#include "common/log.h"
#include "kernels/cpu/cpu_blas.h"
#include "runtime/launch/agent_env.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define fmt dt_test_fmt

/* ---- the plan ----------------------------------------------------------------------------- */

#define F_SSE (DT_CPUF_SSE2 | DT_CPUF_SSE3 | DT_CPUF_SSSE3 | DT_CPUF_SSE41 | DT_CPUF_SSE42)
#define F_AVX2 (F_SSE | DT_CPUF_AVX | DT_CPUF_FMA | DT_CPUF_AVX2)
#define F_AVX512                                                                                   \
    (F_AVX2 | DT_CPUF_AVX512F | DT_CPUF_AVX512DQ | DT_CPUF_AVX512CD | DT_CPUF_AVX512BW |           \
     DT_CPUF_AVX512VL | DT_CPUF_AVX512VNNI)
#define F_SPR                                                                                      \
    (F_AVX512 | DT_CPUF_AVX512BF16 | DT_CPUF_AVX512FP16 | DT_CPUF_AMX_TILE | DT_CPUF_AMX_BF16)

/* The library: names separated by spaces ("" = every kernel). */
static bool has_list(const dt_blas_kernel *k, void *ctx)
{
    const char *list = ctx;
    if (!*list)
        return true;
    char want[40];
    snprintf(want, sizeof want, " %s ", k->name);
    char padded[512];
    snprintf(padded, sizeof padded, " %s ", list);
    return strstr(padded, want) != NULL;
}

/* This machine's library: Debian's 0.3.21, everything up to Cooperlake. */
#define DEBIAN_0321                                                                                \
    "Katmai Coppermine Northwood Banias Athlon Opteron Opteron_SSE3 Atom Nano Bobcat Barcelona "   \
    "Prescott Core2 Penryn Dunnington Nehalem Bulldozer Piledriver Steamroller Sandybridge "       \
    "Excavator Zen Haswell SkylakeX Cooperlake"

static void test_plan_table(void)
{
    static const struct {
        const char *what;
        uint32_t features;
        const char *chosen, *library;
        bool force;
        const char *cand; /* expected candidates, best first, space-separated ("" = none) */
    } cases[] = {
        {"this machine: SkylakeX on AVX-512+bf16+fp16+AMX", F_SPR, "SkylakeX", DEBIAN_0321,
         false, ""},
        {"issue 30: Prescott on AVX-512 with bf16", F_AVX512 | DT_CPUF_AVX512BF16, "Prescott",
         DEBIAN_0321, false, "Cooperlake SkylakeX Haswell"},
        {"issue 30 on this machine's CPU", F_SPR, "Prescott", DEBIAN_0321, false,
         "Cooperlake SkylakeX Haswell"},
        {"a newer library has SapphireRapids", F_SPR, "Prescott", "", false,
         "SapphireRapids Cooperlake SkylakeX"},
        {"names in any case", F_AVX512 | DT_CPUF_AVX512BF16, "PRESCOTT", DEBIAN_0321, false,
         "Cooperlake SkylakeX Haswell"},
        {"Prescott on AVX-512 without bf16", F_AVX512, "Prescott", DEBIAN_0321, false,
         "SkylakeX Haswell Sandybridge"},
        {"Nehalem on AVX-512: three levels", F_AVX512, "Nehalem", DEBIAN_0321, false,
         "SkylakeX Haswell"},
        {"Sandybridge on AVX-512: two levels", F_AVX512, "Sandybridge", DEBIAN_0321, false,
         "SkylakeX"},
        {"Haswell on AVX-512: one level, kept", F_AVX512, "Haswell", DEBIAN_0321, false, ""},
        {"Zen on an AVX2 CPU", F_AVX2, "Zen", DEBIAN_0321, false, ""},
        {"Prescott on AVX2", F_AVX2, "Prescott", DEBIAN_0321, false, "Haswell Sandybridge"},
        {"Haswell on AVX2", F_AVX2, "Haswell", DEBIAN_0321, false, ""},
        {"AVX-512 bits but no OS state: an AVX2 CPU to us", F_AVX2, "Prescott", DEBIAN_0321,
         false, "Haswell Sandybridge"},
        {"an SSE3-only CPU", DT_CPUF_SSE2 | DT_CPUF_SSE3, "Prescott", DEBIAN_0321, false, ""},
        {"a library without the AVX-512 kernels", F_AVX512, "Prescott",
         "Prescott Nehalem Sandybridge Haswell", false, "Haswell Sandybridge"},
        {"a library with nothing better", F_AVX512, "Prescott", "Prescott Core2", false, ""},
        {"an unknown kernel name", F_AVX512, "Frobnicator", DEBIAN_0321, false, ""},
        {"no name at all", F_AVX512, "", DEBIAN_0321, false, ""},
        {"force on this machine: the same level", F_SPR, "SkylakeX", DEBIAN_0321, true,
         "Cooperlake"},
        {"force with Haswell on AVX-512", F_AVX512, "Haswell", DEBIAN_0321, true, "SkylakeX"},
        {"force on an AVX2 CPU that runs Haswell", F_AVX2, "Haswell", DEBIAN_0321, true, ""},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        dt_blas_plan p;
        dt_blas_plan_make(&p, cases[i].features, cases[i].chosen, has_list,
                          (void *)cases[i].library, cases[i].force);
        char got[256] = "";
        for (int k = 0; k < p.n; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "",
                     p.cand[k]->name);
        DT_CHECK_MSG(!strcmp(got, cases[i].cand), "%s: candidates \"%s\", want \"%s\" (%s)",
                     cases[i].what, got, cases[i].cand, p.why);
        DT_CHECK_MSG(p.why[0] != '\0', "%s: no reason given", cases[i].what);
    }
    /* the sentence says what it found */
    dt_blas_plan p;
    dt_blas_plan_make(&p, F_AVX512 | DT_CPUF_AVX512BF16, "Prescott", has_list,
                      (void *)DEBIAN_0321, false);
    DT_CHECK_CONTAINS(p.why, "Prescott (SSE2/SSE3)");
    DT_CHECK_CONTAINS(p.why, "AVX-512");
    DT_CHECK_CONTAINS(p.why, "trying Cooperlake, SkylakeX, Haswell");
    dt_blas_plan_make(&p, F_AVX512, "Haswell", has_list, (void *)DEBIAN_0321, false);
    DT_CHECK_CONTAINS(p.why, "one level apart");
}

/* ---- this machine ------------------------------------------------------------------------- */

static void test_cpuid_matches_proc(void)
{
    char *info = dt_test_slurp("/proc/cpuinfo");
    if (!info)
        DT_SKIP("no /proc/cpuinfo");
    char *flags = strstr(info, "\nflags");
    if (!flags)
        DT_SKIP("/proc/cpuinfo has no flags line (not x86)");
    char *end = strchr(flags + 1, '\n');
    if (end)
        *end = '\0';
    char line[8192];
    snprintf(line, sizeof line, " %s ", strchr(flags, ':') ? strchr(flags, ':') + 1 : flags);
    for (char *c = line; *c; c++)
        if (*c == '\t')
            *c = ' ';
    dt_cpuid id;
    dt_cpuid_read(&id);
    DT_CHECK(id.vendor[0] != '\0');
    DT_CHECK((id.features & ~id.reported) == 0); /* what the OS enables is what the CPU has */
    for (int b = 0; b < 18; b++) {
        char name[32];
        dt_cpuid_names(1u << b, name, sizeof name);
        if (!name[0])
            continue;
        char want[40];
        snprintf(want, sizeof want, " %s ", !strcmp(name, "sse3") ? "pni" : name); /* Linux's */
        /* Linux lists a flag only when the kernel enables it, so it matches `features` */
        bool in_proc = strstr(line, want) != NULL, ours = (id.features & (1u << b)) != 0;
        DT_CHECK_MSG(in_proc == ours, "%s: /proc/cpuinfo %s, cpuid %s", name,
                     in_proc ? "has it" : "has not", ours ? "has it" : "has not");
    }
    char all[512];
    printf("    %s, family %d model %d stepping %d: %s\n", id.brand, id.family, id.model,
           id.stepping, dt_cpuid_names(id.features, all, sizeof all));
    free(info);
}

static void test_check_here(void)
{
    dt_blas_check c;
    dt_blas_check_run(&c, 0.02);
    DT_CHECK_STR(c.corename, dt_blas_corename());
    DT_CHECK(c.ok);
    DT_CHECK_MSG(c.max_err < 1e-5, "max error %g", c.max_err);
    DT_CHECK(c.gflops > 0.1);
    printf("    %s: normalised error %.2g, sgemm %.1f GFLOP/s, %.3f s\n", c.corename, c.max_err,
           c.gflops, c.seconds);
}

static void test_probe_here(void)
{
    dt_blas_probe_out r;
    dt_blas_probe(NULL, NULL, 30, &r); /* this binary, OpenBLAS's own choice */
    DT_CHECK_MSG(r.ran, "%s", r.why);
    DT_REQUIRE(r.ran);
    if (!getenv("OPENBLAS_CORETYPE")) /* else this binary runs what it was given, or chose */
        DT_CHECK_STR(r.core, dt_blas_corename());
    DT_CHECK(r.ok && r.gflops > 0.1);
    dt_cpuid id;
    dt_cpuid_read(&id);
    const dt_blas_kernel *k = dt_blas_kernel_find("Prescott");
    if ((k->needs & ~id.features) == 0 && dt_blas_has_kernel(k, NULL)) {
        dt_blas_probe(NULL, "Prescott", 30, &r); /* a forced one runs what it was asked */
        DT_CHECK_MSG(r.ran, "%s", r.why);
        DT_REQUIRE(r.ran);
        DT_CHECK(!strcasecmp(r.core, "Prescott"));
        DT_CHECK(r.ok);
    }
    printf("    helper: %s %.1f GFLOP/s in %.2f s\n", r.core, r.gflops, r.seconds);
}

/* The tests' verdicts go to their own cache, never the machine's. */
static void private_cache(void)
{
    setenv("DTRAIN_BLAS_CACHE", fmt("%s/cache", dt_test_tmpdir()), 1);
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("DTRAIN_BLAS_CHOICE");
    unsetenv("DTRAIN_BLAS_AS_IF");
    unsetenv("DTRAIN_BLAS_PROBE");
}

static int count_files(const char *dir)
{
    char *out = NULL;
    int rc = dt_test_run(fmt("ls '%s' | grep -c '^blas-'", dir), &out, 10);
    int n = rc == 0 && out ? atoi(out) : 0;
    free(out);
    return n;
}

static void test_force_here(void)
{
    private_cache();
    setenv("DTRAIN_BLAS_PROBE", "force", 1);
    dt_blas_choice c;
    dt_blas_choose(&c);
    printf("    %s\n", c.note);
    dt_cpuid id;
    dt_cpuid_read(&id);
    dt_blas_plan p;
    dt_blas_plan_make(&p, id.features, dt_blas_corename(), dt_blas_has_kernel, NULL, true);
    if (p.n == 0) {
        DT_CHECK_INT(c.probes, 0);
        DT_SKIP("no other kernel to try on this CPU");
    }
    DT_CHECK(!c.cached);
    DT_CHECK(c.probes >= 2); /* OpenBLAS's own choice and at least one candidate */
    DT_CHECK(c.gflops_default > 0.1);
    DT_CHECK_CONTAINS(c.note, "DTRAIN_BLAS_PROBE=force");
    if (c.coretype[0]) { /* chosen: it passed and is faster */
        DT_CHECK(dt_blas_kernel_find(c.coretype) != NULL);
        DT_CHECK(c.gflops >= 1.1 * c.gflops_default);
    } else {
        DT_CHECK_CONTAINS(c.note, "none passed");
    }
    DT_CHECK_INT(count_files(fmt("%s/cache", dt_test_tmpdir())), 1);
    DT_CHECK(getenv("OPENBLAS_CORETYPE") == NULL); /* dt_blas_choose never sets it */
}

static void test_as_if_prescott(void)
{
    private_cache();
    dt_cpuid id;
    dt_cpuid_read(&id);
    const dt_blas_kernel *sk = dt_blas_kernel_find("SkylakeX");
    const dt_blas_kernel *pr = dt_blas_kernel_find("Prescott");
    if ((sk->needs & ~id.features) || !dt_blas_has_kernel(sk, NULL) ||
        !dt_blas_has_kernel(pr, NULL))
        DT_SKIP("needs an AVX-512 CPU and an OpenBLAS with the SkylakeX and Prescott kernels");
    setenv("DTRAIN_BLAS_AS_IF", "Prescott", 1);
    dt_blas_choice c;
    double t0 = dt_test_now();
    dt_blas_choose(&c);
    double dt = dt_test_now() - t0;
    printf("    %s\n    chose %s in %.2f s\n", c.note, c.coretype, dt);
    DT_REQUIRE(c.coretype[0]);
    const dt_blas_kernel *k = dt_blas_kernel_find(c.coretype);
    DT_REQUIRE(k);
    DT_CHECK_INT(k->level, 4);
    DT_CHECK(c.gflops >= 1.1 * c.gflops_default);
    DT_CHECK(c.probes >= 2 && !c.cached);
    DT_CHECK_CONTAINS(c.note, "OpenBLAS chose Prescott");
    /* the verdict is cached: no helper the second time */
    dt_blas_choice again;
    dt_blas_choose(&again);
    DT_CHECK(again.cached);
    DT_CHECK_INT(again.probes, 0);
    DT_CHECK_STR(again.coretype, c.coretype);
    /* and DTRAIN_BLAS_CACHE=off probes every time */
    setenv("DTRAIN_BLAS_CACHE", "off", 1);
    dt_blas_choose(&again);
    DT_CHECK(!again.cached && again.probes >= 2);
}

/* ---- bad candidates ----------------------------------------------------------------------- */

/* The fake helper: DT_TEST_BLAS_FAKE="Name=mode,..." for the kernel in OPENBLAS_CORETYPE;
 * modes crash, hang, wrong, slow, refuse, silent; others (and unlisted kernels) run the real
 * probe. Returns -1 when this is no fake. */
static int fake_helper(int argc, char **argv)
{
    const char *spec = getenv("DT_TEST_BLAS_FAKE"), *core = getenv("OPENBLAS_CORETYPE");
    if (argc < 2 || strcmp(argv[1], DT_BLAS_PROBE_ARG) || !spec || !core)
        return -1;
    char want[48];
    snprintf(want, sizeof want, "%s=", core);
    const char *m = strstr(spec, want);
    if (!m)
        return -1;
    m += strlen(want);
    if (!strncmp(m, "crash", 5)) {
        signal(SIGSEGV, SIG_DFL); /* past a sanitizer's handler: a crash, as a bad kernel's */
        raise(SIGSEGV);
    }
    if (!strncmp(m, "hang", 4))
        sleep(60);
    if (!strncmp(m, "wrong", 5))
        printf("dtrain-blas-probe core=%s gflops=500 err=0.5 ok=0\n", core);
    else if (!strncmp(m, "slow", 4))
        printf("dtrain-blas-probe core=%s gflops=0.5 err=1e-7 ok=1\n", core);
    else if (!strncmp(m, "refuse", 6))
        printf("dtrain-blas-probe core=Prescott gflops=500 err=1e-7 ok=1\n");
    else if (!strncmp(m, "silent", 6))
        return 3;
    else
        return -1;
    return 0;
}

static char warnings[8192];
static void sink(const char *line, size_t len)
{
    size_t n = strlen(warnings);
    if (n + len + 1 < sizeof warnings)
        memcpy(warnings + n, line, len + 1);
    fwrite(line, 1, len, stderr);
}

static void test_bad_candidates(void)
{
    private_cache();
    dt_cpuid id;
    dt_cpuid_read(&id);
    const dt_blas_kernel *sk = dt_blas_kernel_find("SkylakeX");
    if ((sk->needs & ~id.features) || !dt_blas_has_kernel(sk, NULL) ||
        !dt_blas_has_kernel(dt_blas_kernel_find("Cooperlake"), NULL) ||
        (dt_blas_kernel_find("Cooperlake")->needs & ~id.features))
        DT_SKIP("needs a CPU and an OpenBLAS that run Cooperlake");
    setenv("DTRAIN_BLAS_AS_IF", "Prescott", 1);
    dt_log_set_sink(sink);
    /* the first two are broken, the third (Haswell, real) is good: it is chosen */
    setenv("DT_TEST_BLAS_FAKE", "Cooperlake=crash,SkylakeX=wrong", 1);
    warnings[0] = '\0';
    dt_blas_choice c;
    dt_blas_choose(&c);
    DT_CHECK_STR(c.coretype, "Haswell");
    DT_CHECK_CONTAINS(warnings, "the Cooperlake kernel is not used: its probe crashed");
    DT_CHECK_CONTAINS(warnings, "the SkylakeX kernel is not used: it computes wrong results");
    /* refused, slow, exits without a result: none is chosen, each one says why */
    setenv("DTRAIN_BLAS_CACHE", "off", 1);
    setenv("DT_TEST_BLAS_FAKE", "Cooperlake=refuse,SkylakeX=slow,Haswell=silent", 1);
    warnings[0] = '\0';
    dt_blas_choose(&c);
    DT_CHECK_STR(c.coretype, "");
    DT_CHECK_CONTAINS(c.note, "none passed, Prescott kept");
    DT_CHECK_CONTAINS(warnings, "OpenBLAS did not take OPENBLAS_CORETYPE=Cooperlake");
    DT_CHECK_CONTAINS(warnings, "the SkylakeX kernel is not used: it is not faster");
    DT_CHECK_CONTAINS(warnings, "the Haswell kernel is not used: its probe exited with status 3");
    dt_log_set_sink(NULL);
    /* a helper that hangs is killed at the deadline */
    setenv("DT_TEST_BLAS_FAKE", "Haswell=hang", 1);
    dt_blas_probe_out r;
    double t0 = dt_test_now();
    dt_blas_probe(NULL, "Haswell", 1.0, &r);
    DT_CHECK(!r.ran);
    DT_CHECK_CONTAINS(r.why, "hung");
    DT_CHECK(dt_test_now() - t0 < 10);
    dt_blas_probe("/nonexistent/dtrain", NULL, 5.0, &r);
    DT_CHECK(!r.ran);
    DT_CHECK_CONTAINS(r.why, "status 127");
}

/* ---- the environment is the user's -------------------------------------------------------- */

static void test_coretype_untouched(void)
{
    private_cache();
    setenv("DTRAIN_BLAS_AS_IF", "Prescott", 1); /* there would be something to do */
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    setenv("OPENBLAS_L2_SIZE", "1048576", 1);
    dt_blas_choice c;
    dt_blas_choose(&c);
    DT_CHECK_STR(c.coretype, "");
    DT_CHECK_INT(c.probes, 0);
    DT_CHECK_CONTAINS(c.note, "OPENBLAS_CORETYPE=Haswell is set: left alone");
    char *argv[] = {"test_blas", NULL};
    DT_CHECK_INT(dt_blas_boot(1, argv, true), -1); /* no re-exec, nothing set */
    DT_CHECK_STR(getenv("OPENBLAS_CORETYPE"), "Haswell");
    DT_CHECK_STR(getenv("OPENBLAS_L2_SIZE"), "1048576");
    DT_CHECK(getenv("DTRAIN_BLAS_CHOICE") == NULL);
    setenv("OPENBLAS_CORETYPE", "", 1); /* set but empty is set too */
    dt_blas_choose(&c);
    DT_CHECK_STR(c.coretype, "");
    DT_CHECK_STR(getenv("OPENBLAS_CORETYPE"), "");
    DT_CHECK_INT(dt_blas_boot(1, argv, true), -1);
    DT_CHECK_STR(getenv("OPENBLAS_CORETYPE"), "");
    char d[1400];
    setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    dt_blas_describe(d, sizeof d, false);
    DT_CHECK_CONTAINS(d, "OPENBLAS_CORETYPE=Haswell from the environment, left alone");
    DT_CHECK_CONTAINS(d, "OPENBLAS_L2_SIZE=1048576");
}

static void test_agent_env_defaults(void)
{
    dt_envb env;
    dt_err err = {0};
    char *base[] = {"PATH=/bin", "OPENBLAS_CORETYPE=Haswell", NULL};
    DT_REQUIRE_OK(dt_envb_init(&env, base, &err), &err);
    char *extra[] = {"OPENBLAS_CORETYPE=SkylakeX", "DTRAIN_BLAS_CHOICE=SkylakeX 150 why", NULL};
    DT_REQUIRE_OK(dt_agent_env_defaults(&env, extra, &err), &err);
    DT_CHECK_STR(dt_envb_get(&env, "OPENBLAS_CORETYPE"), "Haswell"); /* the user's stays */
    DT_CHECK_STR(dt_envb_get(&env, "DTRAIN_BLAS_CHOICE"), "SkylakeX 150 why");
    DT_CHECK_STR(dt_envb_get(&env, "PATH"), "/bin");
    dt_envb_free(&env);
    char *none[] = {"PATH=/bin", NULL};
    DT_REQUIRE_OK(dt_envb_init(&env, none, &err), &err);
    DT_REQUIRE_OK(dt_agent_env_defaults(&env, extra, &err), &err);
    DT_CHECK_STR(dt_envb_get(&env, "OPENBLAS_CORETYPE"), "SkylakeX");
    DT_REQUIRE_OK(dt_agent_env_defaults(&env, NULL, &err), &err);
    char *bad[] = {"NOEQUALS", NULL};
    DT_CHECK_INT(dt_agent_env_defaults(&env, bad, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "NOEQUALS");
    dt_envb_free(&env);
}

/* The dtrain binary, in the test's directory, with a private cache and env (a shell prefix). */
static int dtrain(const char *env, const char *args, char **out, int timeout_s)
{
    const char *cmd = fmt("cd '%s' && env -u OPENBLAS_CORETYPE -u DTRAIN_BLAS_AS_IF "
                          "-u DTRAIN_BLAS_PROBE -u DTRAIN_BLAS_CHOICE DTRAIN_BLAS_CACHE='%s/cache' "
                          "%s '%s' %s",
                          dt_test_tmpdir(), dt_test_tmpdir(), env, dt_test_dtrain_bin(), args);
    return dt_test_run(cmd, out, timeout_s);
}

/* dtrain() that must succeed; its output (caller frees), shown when it does not. */
static char *dtrain_ok(const char *env, const char *args, int timeout_s)
{
    char *out = NULL;
    int rc = dtrain(env, args, &out, timeout_s);
    DT_CHECK_MSG(rc == 0, "%s dtrain %s: exit %d, output:\n%s", env, args, rc, out ? out : "");
    if (rc != 0)
        dt_test_stop();
    return out;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void need_issue_cpu(void)
{
    dt_cpuid id;
    dt_cpuid_read(&id);
    const dt_blas_kernel *sk = dt_blas_kernel_find("SkylakeX");
    if ((sk->needs & ~id.features) || !dt_blas_has_kernel(sk, NULL))
        DT_SKIP("needs an AVX-512 CPU and an OpenBLAS with the SkylakeX kernel");
}

static void test_dtrain_bench_names_kernel(void)
{
    char *out = dtrain_ok("", "bench kernels --quick", 120);
    DT_CHECK_CONTAINS(out, "BLAS: OpenBLAS");
    DT_CHECK(strstr(out, " (OpenBLAS's own choice: ") || strstr(out, " set by dtrain, "));
    DT_CHECK_CONTAINS(out, "GFLOP/s (the reference");
    free(out);
    /* a set OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) as it was given */
    out = dtrain_ok("OPENBLAS_CORETYPE=Prescott OPENBLAS_L2_SIZE=1048576 "
                    "DTRAIN_BLAS_AS_IF=Prescott",
                    "bench kernels --quick", 120);
    DT_CHECK_CONTAINS(out, "kernel Prescott (OPENBLAS_CORETYPE=Prescott from the environment, "
                           "left alone); OPENBLAS_L2_SIZE=1048576");
    free(out);
}

static void test_dtrain_worker_reexec(void)
{
    need_issue_cpu();
    const char *job = fmt("%s/configs/quickstart.ini train.steps=1 job.output_dir=out",
                          dt_test_repo_dir("configs"));
    /* started directly: it chooses, re-executes itself once with the kernel, and says so */
    char *out = dtrain_ok("DTRAIN_LOG=debug DTRAIN_BLAS_AS_IF=Prescott OPENBLAS_L2_SIZE=1048576",
                          fmt("worker %s", job), 180);
    DT_CHECK_CONTAINS(out, "set by dtrain");
    DT_CHECK_CONTAINS(out, "OpenBLAS chose Prescott");
    DT_CHECK_CONTAINS(out, "; OPENBLAS_L2_SIZE=1048576");
    DT_CHECK_INT(count(out, "BLAS: "), 1); /* logged once: the process re-executed once */
    free(out);
    /* the user's kernel is what runs */
    out = dtrain_ok("DTRAIN_LOG=debug DTRAIN_BLAS_AS_IF=Prescott OPENBLAS_CORETYPE=Haswell",
                    fmt("worker %s", job), 180);
    DT_CHECK_CONTAINS(out, "kernel Haswell (OPENBLAS_CORETYPE=Haswell from the environment");
    free(out);
}

static void test_dtrain_agent_workers(void)
{
    need_issue_cpu();
    const char *job = fmt("--nproc-per-node=2 %s/configs/quickstart.ini train.steps=1 "
                          "job.output_dir=out",
                          dt_test_repo_dir("configs"));
    char *out = dtrain_ok("DTRAIN_LOG=debug DTRAIN_BLAS_AS_IF=Prescott", job, 180);
    DT_CHECK_CONTAINS(out, "[0]:");
    int set = count(out, " set by dtrain, ");
    DT_CHECK_MSG(set == 2, "%d of 2 workers say dtrain set their kernel:\n%s", set, out);
    free(out);
    out = dtrain_ok("DTRAIN_LOG=debug DTRAIN_BLAS_AS_IF=Prescott OPENBLAS_CORETYPE=Haswell "
                    "OPENBLAS_L2_SIZE=1048576",
                    job, 180);
    int kept = count(out, "kernel Haswell (OPENBLAS_CORETYPE=Haswell from the environment, "
                          "left alone); OPENBLAS_L2_SIZE=1048576");
    DT_CHECK_MSG(kept == 2, "%d of 2 workers kept the user's kernel:\n%s", kept, out);
    free(out);
    /* a user's command gets nothing from dtrain */
    out = dtrain_ok("DTRAIN_BLAS_AS_IF=Prescott",
                    "--nproc-per-node=1 -- sh -c 'echo CORETYPE=${OPENBLAS_CORETYPE-unset}'", 60);
    DT_CHECK_CONTAINS(out, "CORETYPE=unset");
    free(out);
}

int main(int argc, char **argv)
{
    int fake = fake_helper(argc, argv);
    if (fake >= 0)
        return fake;
    static const dt_test tests[] = {
        {"plan_table", test_plan_table, 0},
        {"cpuid_matches_proc", test_cpuid_matches_proc, 0},
        {"check_here", test_check_here, 30},
        {"probe_here", test_probe_here, 60},
        {"force_here", test_force_here, 120},
        {"as_if_prescott", test_as_if_prescott, 120},
        {"bad_candidates", test_bad_candidates, 120},
        {"coretype_untouched", test_coretype_untouched, 0},
        {"agent_env_defaults", test_agent_env_defaults, 0},
        {"dtrain_bench_names_kernel", test_dtrain_bench_names_kernel, 240},
        {"dtrain_worker_reexec", test_dtrain_worker_reexec, 360},
        {"dtrain_agent_workers", test_dtrain_agent_workers, 360},
    };
    return dt_test_main("test_blas", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
