/* test_harness.c - the test runner itself (tests/harness.c, tests/run.sh): output captured and
 * shown only for a failing test, a timed-out test's whole process tree killed and the tail of its
 * output printed, skip reasons shown, and run.sh's one line per binary and TOTAL line.
 *
 * The runner is tested on "victim" tests that fail on purpose: the binary runs itself with
 * DT_HARNESS_VICTIMS=1, which swaps its table for theirs.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/harness.h"

static char self[4096];

/* ---- victims -------------------------------------------------------------------------------- */

static void victim_passes_noisily(void)
{
    printf("noise-of-a-passing-test\n");
    fprintf(stderr, "more-noise-on-stderr\n");
}

static void victim_fails(void)
{
    printf("context-before-the-failure\n");
    DT_CHECK_INT(1 + 1, 3);
}

static void victim_skips(void) { DT_SKIP("no frobnicator on this machine"); }

/* Its own wait is longer than its time limit (as test_slurm's was as long): a grandchild in another
 * process group, and a daemon in another session, run when the runner's limit strikes. */
static void victim_times_out(void)
{
    const char *dir = getenv("DT_HARNESS_DIR");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "sleep 300 & echo $! > %s/grandchild; setsid sh -c 'sleep 300 & echo $! > %s/daemon' "
             "</dev/null >/dev/null 2>&1; wait",
             dir, dir);
    printf("last-words-of-the-victim\n");
    fflush(stdout);
    dt_test_run(cmd, NULL, 20); /* longer than the runner's limit for this test, 2 s */
}

static const dt_test victims[] = {
    {"victim_passes_noisily", victim_passes_noisily, 0},
    {"victim_fails", victim_fails, 0},
    {"victim_skips", victim_skips, 0},
    {"victim_times_out", victim_times_out, 2},
};

/* ---- tests ---------------------------------------------------------------------------------- */

static int read_pid_file(const char *path)
{
    char *s = dt_test_slurp(path);
    int pid = s ? atoi(s) : 0;
    free(s);
    return pid;
}

static void test_output_only_on_failure(void)
{
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd, "DT_TEST_TIMEOUT_SCALE=1 DT_HARNESS_VICTIMS=1 DT_HARNESS_DIR=%s %s "
             "passes fails skips 2>&1", dt_test_tmpdir(), self);
    int rc = dt_test_run(cmd, &out, 30);
    DT_CHECK_INT(rc, 1);
    DT_REQUIRE(out != NULL);
    DT_CHECK(!strstr(out, "noise-of-a-passing-test"));
    DT_CHECK(!strstr(out, "more-noise-on-stderr"));
    DT_CHECK_CONTAINS(out, "  ok   victim_passes_noisily");
    DT_CHECK_CONTAINS(out, "  FAIL victim_fails");
    DT_CHECK_CONTAINS(out, "    | context-before-the-failure");
    DT_CHECK_CONTAINS(out, "1 + 1 == 3: 2 != 3");
    DT_CHECK_CONTAINS(out, "no frobnicator on this machine");
    DT_CHECK_CONTAINS(out, "test_harness: 1 passed, 1 failed, 1 skipped\n");
    free(out);
    /* -v shows everything as it happens. */
    snprintf(cmd, sizeof cmd, "DT_HARNESS_VICTIMS=1 %s -v passes 2>&1", self);
    DT_CHECK_INT(dt_test_run(cmd, &out, 30), 0);
    DT_CHECK_CONTAINS(out, "noise-of-a-passing-test");
    free(out);
}

static void test_timeout_kills_tree(void)
{
    char cmd[8192], path[4096], *out = NULL;
    const char *dir = dt_test_tmpdir();
    snprintf(cmd, sizeof cmd, "DT_TEST_TIMEOUT_SCALE=1 DT_HARNESS_VICTIMS=1 DT_HARNESS_DIR=%s %s "
             "times_out 2>&1", dir, self);
    int rc = dt_test_run(cmd, &out, 30);
    DT_CHECK_INT(rc, 1);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "FAIL: timed out after 2 s");
    DT_CHECK_CONTAINS(out, "    | last-words-of-the-victim");
    const char *names[] = {"grandchild", "daemon"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        int pid = read_pid_file(path);
        DT_CHECK_MSG(pid > 1, "the victim did not write %s", path);
        if (pid <= 1)
            continue;
        /* The runner killed it before it returned: no waiting here. */
        DT_CHECK_MSG(dt_test_pid_gone(pid), "the %s (pid %d) of a timed-out test is alive",
                     names[i], pid);
        if (!dt_test_pid_gone(pid))
            kill(pid, SIGKILL);
    }
    free(out);
}

/* run.sh: a green binary is one line; a failing one shows its failures; TOTAL keeps its format. */
static void test_run_sh(void)
{
    char dir[4096], cmd[16384], *out = NULL;
    snprintf(dir, sizeof dir, "%s/build", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p %s/tests", dir);
    DT_REQUIRE(dt_test_run(cmd, NULL, 10) == 0);
    /* Two stand-in binaries: the victims run as a passing and as a failing binary. */
    char pass[4200], fail[4200];
    snprintf(pass, sizeof pass, "%s/tests/test_green", dir);
    snprintf(fail, sizeof fail, "%s/tests/test_red", dir);
    char text[8192];
    snprintf(text, sizeof text, "#!/bin/sh\nDT_HARNESS_SUITE=test_green DT_HARNESS_VICTIMS=1 exec %s passes skips\n", self);
    DT_REQUIRE(dt_test_write_file(pass, text) == 0 && chmod(pass, 0755) == 0);
    snprintf(text, sizeof text, "#!/bin/sh\nDT_HARNESS_SUITE=test_red DT_HARNESS_VICTIMS=1 exec %s passes fails\n", self);
    DT_REQUIRE(dt_test_write_file(fail, text) == 0 && chmod(fail, 0755) == 0);
    char root[4096];
    snprintf(root, sizeof root, "%s/../..", dt_test_self_dir());
    snprintf(cmd, sizeof cmd, "sh %s/tests/run.sh %s 2>&1", root, dir);
    DT_CHECK_INT(dt_test_run(cmd, &out, 60), 1);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "test_green: 1 passed, 0 failed, 1 skipped");
    DT_CHECK_CONTAINS(out, "no frobnicator on this machine");
    DT_CHECK_CONTAINS(out, "test_red: 1 passed, 1 failed, 0 skipped");
    DT_CHECK_CONTAINS(out, "  FAIL victim_fails");
    DT_CHECK_CONTAINS(out, "1 + 1 == 3: 2 != 3");
    DT_CHECK(!strstr(out, "noise-of-a-passing-test"));
    DT_CHECK_CONTAINS(out, "\nTOTAL: 2 passed, 1 failed, 1 skipped\n");
    DT_CHECK(!strstr(out, "  ok   victim_passes_noisily")); /* one line per green binary */
    free(out);
}

static const dt_test tests[] = {
    {"output_only_on_failure", test_output_only_on_failure, 60},
    {"timeout_kills_tree", test_timeout_kills_tree, 60},
    {"run_sh", test_run_sh, 90},
};

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0)
        self[n] = '\0';
    const char *suite = getenv("DT_HARNESS_SUITE"); /* run.sh matches it to the file name */
    if (getenv("DT_HARNESS_VICTIMS"))
        return dt_test_main(suite ? suite : "test_harness", victims, (int)DT_ARRAY_LEN(victims), argc, argv);
    return dt_test_main("test_harness", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
