/* test_common.c - common/: errors, logging, parsing, spelling suggestions, RNG, files. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cpuset.h"
#include "common/env.h"
#include "common/err.h"
#include "common/log.h"
#include "common/nvml.h"
#include "common/rng.h"
#include "common/util.h"
#include "tests/harness.h"

static void test_err(void)
{
    dt_err e = {0};
    DT_CHECK_INT(dt_err_set(&e, EINVAL, "bad %s", "thing"), -EINVAL);
    DT_CHECK_STR(e.msg, "bad thing");
    DT_CHECK_INT(dt_err_prefix(&e, "loading %s: ", "x.ini"), -EINVAL);
    DT_CHECK_STR(e.msg, "loading x.ini: bad thing");
    DT_CHECK_INT(dt_err_errno(&e, ENOENT, "open %s", "f"), -ENOENT);
    DT_CHECK_STR(e.msg, "open f: No such file or directory");
    DT_CHECK_INT(dt_err_set(NULL, -EIO, "ignored"), -EIO);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    dt_err_set(&e, -EIO, "%s", big);
    dt_err_prefix(&e, "head: ");
    DT_CHECK(strncmp(e.msg, "head: xxx", 9) == 0);
    DT_CHECK(strlen(e.msg) == sizeof e.msg - 1);
}

static void test_parsing(void)
{
    int64_t v;
    int i;
    double d;
    bool b;
    DT_CHECK(dt_parse_i64("42", &v) == 0 && v == 42);
    DT_CHECK(dt_parse_i64("0x10", &v) == 0 && v == 16);
    /* decimal, whatever the leading zeros (never octal); hex only with 0x */
    DT_CHECK(dt_parse_i64("010", &v) == 0 && v == 10);
    DT_CHECK(dt_parse_i64("08", &v) == 0 && v == 8);
    DT_CHECK(dt_parse_i64("-010", &v) == 0 && v == -10);
    DT_CHECK(dt_parse_i64("+007", &v) == 0 && v == 7);
    DT_CHECK(dt_parse_i64("0", &v) == 0 && v == 0);
    DT_CHECK(dt_parse_i64("-0x1F", &v) == 0 && v == -31);
    DT_CHECK(dt_parse_i64("0x", &v) == -EINVAL);
    DT_CHECK(dt_parse_i64("0b11", &v) == -EINVAL);
    DT_CHECK(dt_parse_int("0009", &i) == 0 && i == 9);
    DT_CHECK(dt_parse_i64("4x", &v) == -EINVAL);
    DT_CHECK(dt_parse_i64("", &v) == -EINVAL);
    DT_CHECK(dt_parse_i64("99999999999999999999", &v) == -ERANGE);
    DT_CHECK(dt_parse_int("3000000000", &i) == -ERANGE);
    DT_CHECK(dt_parse_double("1e-3", &d) == 0 && d == 1e-3);
    DT_CHECK(dt_parse_double("nan", &d) == -EINVAL);
    DT_CHECK(dt_parse_bool("Yes", &b) == 0 && b);
    DT_CHECK(dt_parse_bool("off", &b) == 0 && !b);
    DT_CHECK(dt_parse_bool("2", &b) == -EINVAL);
    DT_CHECK(dt_parse_duration("500ms", &d) == 0 && d == 0.5);
    DT_CHECK(dt_parse_duration("2m", &d) == 0 && d == 120);
    DT_CHECK(dt_parse_duration("1h", &d) == 0 && d == 3600);
    DT_CHECK(dt_parse_duration("-1", &d) == -EINVAL);
    DT_CHECK(dt_parse_duration("3 days", &d) == -EINVAL);
    char s[] = "  padded \t\n";
    DT_CHECK_STR(dt_trim(s), "padded");
}

static void test_nearest(void)
{
    static const char *const c[] = {"nproc-per-node", "nnodes", "node-rank", "max-restarts"};
    DT_CHECK_STR(dt_nearest("nproc_per_nod", c, 4), "nproc-per-node");
    DT_CHECK_STR(dt_nearest("nnode", c, 4), "nnodes");
    DT_CHECK_STR(dt_nearest("max_restart", c, 4), "max-restarts");
    DT_CHECK(dt_nearest("completely-different", c, 4) == NULL);
    DT_CHECK_INT(dt_edit_distance("gtp", "gpt"), 1); /* a swap is one edit */
    DT_CHECK_INT(dt_edit_distance("abc", "abc"), 0);
    DT_CHECK_INT(dt_edit_distance("A_B", "a-b"), 0);
}

static void test_rng_deterministic(void)
{
    dt_rng a, b;
    dt_rng_seed(&a, 1337);
    dt_rng_seed(&b, 1337);
    for (int k = 0; k < 1000; k++)
        DT_REQUIRE(dt_rng_u64(&a) == dt_rng_u64(&b));
    /* Known first value: a change of algorithm would silently change every run. */
    dt_rng_seed(&a, 0);
    uint64_t first = dt_rng_u64(&a);
    dt_rng_seed(&a, 0);
    DT_CHECK(dt_rng_u64(&a) == first);
    dt_rng_seed2(&a, 1, 0);
    dt_rng_seed2(&b, 1, 1);
    DT_CHECK(dt_rng_u64(&a) != dt_rng_u64(&b));
    /* Moments of the normal and uniform generators. */
    double sum = 0, sq = 0;
    int n = 200000;
    for (int k = 0; k < n; k++) {
        double x = dt_rng_normal(&a);
        sum += x;
        sq += x * x;
    }
    DT_CHECK_NEAR(sum / n, 0.0, 0.01);
    DT_CHECK_NEAR(sq / n, 1.0, 0.02);
    uint64_t counts[7] = {0};
    for (int k = 0; k < 70000; k++)
        counts[dt_rng_below(&a, 7)]++;
    for (int k = 0; k < 7; k++)
        DT_CHECK_NEAR((double)counts[k], 10000, 500);
    uint64_t perm[100];
    dt_rng_permutation(&a, perm, 100);
    int seen[100] = {0};
    for (int k = 0; k < 100; k++)
        seen[perm[k]]++;
    for (int k = 0; k < 100; k++)
        DT_CHECK_INT(seen[k], 1);
}

static void test_log_format(void)
{
    /* Every line: one write, host:pid prefix, rank when set, file:line on warnings. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "DTRAIN_LOG=debug %s bench --help >/dev/null; DTRAIN_LOG=bogus %s --version",
             dt_test_dtrain_bin(), dt_test_dtrain_bin());
    char *out = NULL;
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 0);
    free(out);
    int fds[2];
    DT_REQUIRE(pipe(fds) == 0);
    int saved = dup(2);
    dup2(fds[1], 2);
    dt_log_init();
    dt_log_level = DT_LOG_INFO;
    dt_log_set_rank(3);
    DT_WARN("disk %s", "full");
    DT_DEBUG("not shown");
    dt_log_set_rank(-1);
    dt_log_set_role("agent");
    DT_INFO("hello");
    dup2(saved, 2);
    close(fds[1]);
    char buf[4096] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    DT_REQUIRE(n > 0);
    char expect[256];
    snprintf(expect, sizeof expect, ":%d r3] WARN test_common.c:", (int)getpid());
    DT_CHECK_CONTAINS(buf, expect);
    DT_CHECK_CONTAINS(buf, ": disk full\n");
    DT_CHECK(strstr(buf, "not shown") == NULL);
    snprintf(expect, sizeof expect, ":%d agent] INFO: hello\n", (int)getpid());
    DT_CHECK_CONTAINS(buf, expect);
    DT_CHECK_INT(dt_log_parse_level("WARNING"), DT_LOG_WARN);
    DT_CHECK_INT(dt_log_parse_level("loud"), -1);
}

static void test_files(void)
{
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/a/b/c", dt_test_tmpdir());
    dt_err e = {0};
    DT_REQUIRE_OK(dt_mkdir_p(dir, &e), &e);
    DT_REQUIRE_OK(dt_mkdir_p(dir, &e), &e); /* exists: fine */
    snprintf(file, sizeof file, "%s/f.txt", dir);
    FILE *f = fopen(file, "w");
    DT_REQUIRE(f);
    fputs("content", f);
    fclose(f);
    char *data;
    size_t len;
    DT_REQUIRE_OK(dt_read_file(file, &data, &len, &e), &e);
    DT_CHECK_INT(len, 7);
    DT_CHECK_STR(data, "content");
    free(data);
    DT_CHECK(dt_mkdir_p(file, &e) != 0); /* a file in the way */
    DT_CHECK(dt_read_file("/nonexistent/x", &data, &len, &e) == -ENOENT);
    DT_CHECK_CONTAINS(e.msg, "/nonexistent/x");
    snprintf(dir, sizeof dir, "%s/a", dt_test_tmpdir());
    DT_REQUIRE_OK(dt_rm_rf(dir, &e), &e);
    DT_CHECK(access(dir, F_OK) != 0);
    DT_REQUIRE_OK(dt_rm_rf(dir, &e), &e); /* missing: fine */
}

static void test_env_table(void)
{
    for (size_t i = 0; i < dt_env_vars_count; i++) {
        DT_CHECK(strncmp(dt_env_vars[i].name, "DTRAIN_", 7) == 0);
        DT_CHECK(dt_env_vars[i].help && dt_env_vars[i].help[0]);
        for (size_t j = 0; j < i; j++)
            DT_CHECK(strcmp(dt_env_vars[i].name, dt_env_vars[j].name) != 0);
    }
    setenv("DTRAIN_ATTEMPT", "", 1);
    DT_CHECK_STR(dt_env("DTRAIN_ATTEMPT"), "0"); /* empty = default */
    setenv("DTRAIN_ATTEMPT", "4", 1);
    DT_CHECK_STR(dt_env("DTRAIN_ATTEMPT"), "4");
    DT_CHECK(dt_env("DTRAIN_NOT_IN_TABLE") == NULL);
}

static void test_cpuset(void)
{
    /* CPUs that no machine here has: sysfs knows nothing of them, so the CPU number orders. */
    cpu_set_t base, share[3], all;
    CPU_ZERO(&base);
    CPU_ZERO(&all);
    for (int c = 500; c < 508; c++)
        CPU_SET(c, &base);
    dt_err err = {0};
    const char *want[3] = {"500-501", "502-504", "505-507"};
    for (int i = 0; i < 3; i++) {
        DT_REQUIRE_OK(dt_cpuset_share(&base, i, 3, &share[i], &err), &err);
        char list[64];
        dt_cpuset_format(&share[i], list, sizeof list);
        DT_CHECK_STR(list, want[i]);
        cpu_set_t both;
        CPU_AND(&both, &all, &share[i]);
        DT_CHECK_INT(CPU_COUNT(&both), 0); /* disjoint */
        CPU_OR(&all, &all, &share[i]);
    }
    DT_CHECK(CPU_EQUAL(&all, &base));
    DT_CHECK_INT(dt_cpuset_share(&base, 0, 9, &share[0], &err), -ERANGE);
    DT_CHECK_INT(dt_cpuset_share(&base, 3, 3, &share[0], &err), -ERANGE);
    char list[64];
    CPU_ZERO(&base);
    dt_cpuset_format(&base, list, sizeof list);
    DT_CHECK_STR(list, "");
    CPU_SET(0, &base);
    CPU_SET(2, &base);
    CPU_SET(3, &base);
    CPU_SET(5, &base);
    dt_cpuset_format(&base, list, sizeof list);
    DT_CHECK_STR(list, "0,2-3,5");
    char tiny[4];
    dt_cpuset_format(&base, tiny, sizeof tiny); /* truncated, still a string */
    DT_CHECK(strlen(tiny) < sizeof tiny);
    /* The real machine: shares of the CPUs this test may use cover them, and binding to one
     * share shows in the affinity. */
    cpu_set_t cur, mine, now;
    DT_REQUIRE_OK(dt_cpuset_current(&cur, &err), &err);
    DT_REQUIRE_OK(dt_cpuset_share(&cur, 0, 1, &mine, &err), &err);
    DT_CHECK(CPU_EQUAL(&cur, &mine));
    if (CPU_COUNT(&cur) >= 2) {
        DT_REQUIRE_OK(dt_cpuset_share(&cur, 1, 2, &mine, &err), &err);
        DT_REQUIRE_OK(dt_cpuset_bind(&mine, &err), &err);
        DT_REQUIRE_OK(dt_cpuset_current(&now, &err), &err);
        DT_CHECK(CPU_EQUAL(&now, &mine));
    }
}

static void check_list(const cpu_set_t *set, const char *want)
{
    char list[256];
    dt_cpuset_format(set, list, sizeof list);
    DT_CHECK_STR(list, want);
}

/* GPU workers: the CPUs sysfs lists as local to each GPU, shared out among the GPUs of a node. */
static void test_cpuset_gpu(void)
{
    dt_err err = {0};
    cpu_set_t set, near[4], out;
    DT_REQUIRE_OK(dt_cpuset_parse("0-3,8,10-11\n", &set, &err), &err);
    check_list(&set, "0-3,8,10-11");
    DT_REQUIRE_OK(dt_cpuset_parse("", &set, &err), &err);
    DT_CHECK_INT(CPU_COUNT(&set), 0);
    DT_CHECK_INT(dt_cpuset_parse("3-1", &set, &err), -EINVAL);
    DT_CHECK_INT(dt_cpuset_parse("1,,2", &set, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "offset 2");
    DT_CHECK_INT(dt_cpuset_parse("0-x", &set, &err), -EINVAL);
    DT_CHECK_INT(dt_cpuset_parse("99999", &set, &err), -EINVAL);

    /* a fake sysfs with one GPU at 0000:3b:00.0 and one with no NUMA information */
    char sys[256], dir[700], path[800];
    snprintf(sys, sizeof sys, "%s/sysfs", dt_test_tmpdir());
    snprintf(dir, sizeof dir, "mkdir -p '%s/bus/pci/devices/0000:3b:00.0' "
                              "'%s/bus/pci/devices/0000:86:00.0'", sys, sys);
    DT_REQUIRE(system(dir) == 0);
    snprintf(path, sizeof path, "%s/bus/pci/devices/0000:3b:00.0/local_cpulist", sys);
    DT_REQUIRE(dt_test_write_file(path, "500-503,508-511\n") == 0);
    snprintf(path, sizeof path, "%s/bus/pci/devices/0000:86:00.0/local_cpulist", sys);
    DT_REQUIRE(dt_test_write_file(path, "\n") == 0);
    DT_REQUIRE_OK(dt_cpuset_pci_local(sys, "0000:3B:00.0", &set, &err), &err);
    check_list(&set, "500-503,508-511");
    DT_REQUIRE_OK(dt_cpuset_pci_local(sys, "00000000:3b:00.0", &set, &err), &err); /* NVML's */
    check_list(&set, "500-503,508-511");
    DT_CHECK_INT(dt_cpuset_pci_local(sys, "0000:3c:00.0", &set, &err), -ENOENT);
    DT_CHECK_CONTAINS(err.msg, "0000:3c:00.0/local_cpulist");
    DT_CHECK_INT(dt_cpuset_pci_local(sys, "0000:86:00.0", &set, &err), -ENODATA);
    DT_CHECK_INT(dt_cpuset_pci_local(sys, "3b:00", &set, &err), -EINVAL);
    DT_CHECK_INT(dt_cpuset_pci_local(sys, "0000:3b:00.0x", &set, &err), -EINVAL);

    /* Two nodes (500-507, 508-515) with two GPUs each: disjoint halves of each node. */
    cpu_set_t base;
    DT_REQUIRE_OK(dt_cpuset_parse("500-515", &base, &err), &err);
    DT_REQUIRE_OK(dt_cpuset_parse("500-507", &near[0], &err), &err);
    near[1] = near[0];
    DT_REQUIRE_OK(dt_cpuset_parse("508-515", &near[2], &err), &err);
    near[3] = near[2];
    const char *want[4] = {"500-503", "504-507", "508-511", "512-515"};
    for (int k = 0; k < 4; k++) {
        DT_REQUIRE_OK(dt_cpuset_near_share(&base, near, 4, k, &out, &err), &err);
        check_list(&out, want[k]);
    }
    /* GPUs 0 and 2 on one node, 1 and 3 on the other: worker order within each node */
    cpu_set_t mixed[4] = {near[0], near[2], near[0], near[2]};
    DT_REQUIRE_OK(dt_cpuset_near_share(&base, mixed, 4, 2, &out, &err), &err);
    check_list(&out, "504-507");
    DT_REQUIRE_OK(dt_cpuset_near_share(&base, mixed, 4, 1, &out, &err), &err);
    check_list(&out, "508-511");
    /* a cgroup that leaves 2 CPUs of the first node: its 2 GPUs' workers get one each; with 4
     * workers on it, they share both */
    DT_REQUIRE_OK(dt_cpuset_parse("506-507,508-515", &base, &err), &err);
    DT_REQUIRE_OK(dt_cpuset_near_share(&base, near, 4, 1, &out, &err), &err);
    check_list(&out, "507");
    cpu_set_t one[4] = {near[0], near[0], near[0], near[0]};
    DT_REQUIRE_OK(dt_cpuset_near_share(&base, one, 4, 3, &out, &err), &err);
    check_list(&out, "506-507");
    /* a cgroup without the first node at all: its workers are not bound there */
    DT_REQUIRE_OK(dt_cpuset_parse("508-515", &base, &err), &err);
    DT_CHECK_INT(dt_cpuset_near_share(&base, near, 4, 0, &out, &err), -ENOENT);
    DT_REQUIRE_OK(dt_cpuset_near_share(&base, near, 4, 3, &out, &err), &err);
    check_list(&out, "512-515");
}

/* common/nvml against a stand-in library: the mean of the samples taken inside the interval,
 * every nvmlInit matched by a shutdown, and the errors a machine without the GPU gets. */
static void test_gpu_busy(void)
{
    char lib[PATH_MAX + 32];
    snprintf(lib, sizeof lib, "%s/libfake_nvml.so", dt_test_self_dir());
    DT_CHECK_MSG(access(lib, R_OK) == 0, "%s missing: make builds it with the tests", lib);
    DT_REQUIRE(access(lib, R_OK) == 0);
    setenv("DTRAIN_NVML_LIB", lib, 1);
    setenv("FAKE_NVML_SAMPLES", "100:90 200:95", 1);
    DT_CHECK_INT(dt_nvml_device_count(), 1);
    dt_gpu_busy b;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_gpu_busy_begin(&b, "0000:3b:00.0", &err), &err);
    DT_CHECK(b.since == 200);
    double pct = 0;
    /* nothing new: the interval was shorter than a sampling period */
    DT_CHECK_INT(dt_gpu_busy_end(&b, &pct, &err), -ENODATA);
    DT_CHECK(pct == -1);
    DT_REQUIRE_OK(dt_gpu_busy_begin(&b, "0000:3b:00.0", &err), &err);
    setenv("FAKE_NVML_SAMPLES", "100:90 200:95 300:40 400:60 500:80", 1);
    DT_REQUIRE_OK(dt_gpu_busy_end(&b, &pct, &err), &err);
    DT_CHECK_NEAR(pct, 60, 1e-9);
    int (*inits)(void) = NULL;
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    DT_REQUIRE(h);
    *(void **)&inits = dlsym(h, "fake_nvml_inits");
    DT_REQUIRE(inits);
    DT_CHECK_INT(inits(), 0);
    DT_CHECK_INT(dt_gpu_busy_begin(&b, "0000:af:00.0", &err), -ENOENT);
    DT_CHECK_CONTAINS(err.msg, "0000:af:00.0");
    DT_CHECK_CONTAINS(err.msg, "Not Found");
    DT_CHECK_INT(inits(), 0);
    DT_CHECK_INT(dt_gpu_busy_end(&b, &pct, &err), -EINVAL);
    dlclose(h);
}

/* Without the library (a machine with no driver) every call says so and nothing fails hard;
 * in a process of its own, since the library is loaded once per process. */
static void test_gpu_busy_no_driver(void)
{
    setenv("DTRAIN_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    DT_CHECK_INT(dt_nvml_device_count(), 0);
    dt_gpu_busy b;
    dt_err err = {0};
    DT_CHECK_INT(dt_gpu_busy_begin(&b, "0000:3b:00.0", &err), -ENOENT);
    DT_CHECK_CONTAINS(err.msg, "NVML not available");
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"common_err", test_err, 0},
        {"common_gpu_busy", test_gpu_busy, 0},
        {"common_gpu_busy_no_driver", test_gpu_busy_no_driver, 0},
        {"common_parsing", test_parsing, 0},
        {"common_nearest", test_nearest, 0},
        {"common_rng_deterministic", test_rng_deterministic, 0},
        {"common_log_format", test_log_format, 0},
        {"common_files", test_files, 0},
        {"common_env_table", test_env_table, 0},
        {"common_cpuset", test_cpuset, 0},
        {"common_cpuset_gpu", test_cpuset_gpu, 0},
    };
    return dt_test_main("test_common", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
