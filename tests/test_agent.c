/* test_agent.c - the launcher on one node, driven as a user drives it: the real build/dtrain with
 * shell (and python3) workers that succeed, fail, crash, hang, ignore SIGTERM, print partial lines
 * and megabytes; restarts, the budget, the root-cause table, redirects and tee, signals, orphans.
 * Plus unit tests of the pieces (output splitting, redirect specs, environment, worker guard).
 *
 * Every wait is bounded. Nothing asserts on speed: a stop that must not wait for a long grace
 * period is given a grace far longer than the test's own timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/job/workenv.h"
#include "runtime/launch/agent_env.h"
#include "runtime/launch/agent_output.h"
#include "runtime/launch/agent_report.h"
#include "runtime/job/worker_guard.h"
#include "tests/harness.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* Runs a shell command built from fmt, with a timeout; returns the exit code, output in *out. */
static int runf(char **out, int timeout_s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int runf(char **out, int timeout_s, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return dt_test_run(cmd, out, timeout_s);
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    size_t k = strlen(needle);
    for (const char *p = hay; (p = strstr(p, needle)); p += k)
        n++;
    return n;
}

static bool wait_for_file(const char *path, double timeout_s)
{
    double deadline = dt_test_now() + timeout_s;
    while (access(path, F_OK) != 0) {
        if (dt_test_now() > deadline)
            return false;
        dt_sleep_ms(10);
    }
    return true;
}

static int read_pid(const char *path)
{
    char *s = dt_test_slurp(path);
    int pid = s ? atoi(s) : 0;
    free(s);
    return pid;
}

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

/* ---- unit tests ------------------------------------------------------------------------- */

static void test_redirect_specs(void)
{
    DT_CHECK_INT(dt_out_mode_for("0", 0), 0);
    DT_CHECK_INT(dt_out_mode_for("3", 5), 3);
    DT_CHECK_INT(dt_out_mode_for("0:3,1:1", 0), 3);
    DT_CHECK_INT(dt_out_mode_for("0:3,1:1", 1), 1);
    DT_CHECK_INT(dt_out_mode_for("0:3,1:1", 2), 0);
    DT_CHECK_INT(dt_out_mode_for("", 0), 0);
    DT_CHECK(dt_out_rank_shown("", 7));
    DT_CHECK(dt_out_rank_shown("0,2", 2));
    DT_CHECK(!dt_out_rank_shown("0,2", 1));
}

static void test_env_build(void)
{
    char *base[] = {"PATH=/bin", "RANK=99", "KEEP=yes", NULL};
    dt_envb b;
    dt_worker_env w = {.rank = 5, .local_rank = 1, .world_size = 8, .local_world_size = 4,
                       .group_rank = 1, .group_world_size = 2, .attempt = 3,
                       .max_restarts = 7, .run_id = "job1", .master_addr = "10.0.0.1",
                       .master_port = 1234, .store_addr = "10.0.0.1", .store_port = 29500,
                       .error_file = "/x/error.json", .local_addr = "10.0.0.2",
                       .omp_num_threads = 1, .agent_pid = 42};
    DT_REQUIRE(dt_envb_init(&b, base, NULL) == 0);
    DT_REQUIRE(dt_workenv_export(&w, &b, NULL) == 0);
    DT_CHECK_STR(dt_envb_get(&b, "RANK"), "5");
    DT_CHECK_STR(dt_envb_get(&b, "KEEP"), "yes");
    DT_CHECK_STR(dt_envb_get(&b, "LOCAL_RANK"), "1");
    DT_CHECK_STR(dt_envb_get(&b, "WORLD_SIZE"), "8");
    DT_CHECK_STR(dt_envb_get(&b, "LOCAL_WORLD_SIZE"), "4");
    DT_CHECK_STR(dt_envb_get(&b, "GROUP_RANK"), "1");
    DT_CHECK_STR(dt_envb_get(&b, "GROUP_WORLD_SIZE"), "2");
    DT_CHECK_STR(dt_envb_get(&b, "ROLE_RANK"), "5");
    DT_CHECK_STR(dt_envb_get(&b, "ROLE_WORLD_SIZE"), "8");
    DT_CHECK_STR(dt_envb_get(&b, "ROLE_NAME"), "default");
    DT_CHECK_STR(dt_envb_get(&b, "MASTER_ADDR"), "10.0.0.1");
    DT_CHECK_STR(dt_envb_get(&b, "MASTER_PORT"), "1234");
    DT_CHECK_STR(dt_envb_get(&b, "TORCHELASTIC_RESTART_COUNT"), "3");
    DT_CHECK_STR(dt_envb_get(&b, "TORCHELASTIC_MAX_RESTARTS"), "7");
    DT_CHECK_STR(dt_envb_get(&b, "TORCHELASTIC_RUN_ID"), "job1");
    DT_CHECK_STR(dt_envb_get(&b, "TORCHELASTIC_USE_AGENT_STORE"), "False");
    DT_CHECK_STR(dt_envb_get(&b, "TORCHELASTIC_ERROR_FILE"), "/x/error.json");
    DT_CHECK_STR(dt_envb_get(&b, "OMP_NUM_THREADS"), "1");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_STORE_ADDR"), "10.0.0.1");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_STORE_PORT"), "29500");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_RUN_ID"), "job1");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_ATTEMPT"), "3");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_ERROR_FILE"), "/x/error.json");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_LOCAL_ADDR"), "10.0.0.2");
    DT_CHECK_STR(dt_envb_get(&b, "DTRAIN_AGENT_PID"), "42");
    DT_CHECK_STR(dt_envb_get(&b, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1"); /* as torchrun */
    int n = 0;
    for (size_t i = 0; i < b.n; i++)
        n += !strncmp(b.v[i], "RANK=", 5);
    DT_CHECK_INT(n, 1);
    DT_CHECK(b.v[b.n] == NULL);
    dt_envb_free(&b);
    /* The user's own value wins. */
    char *mine[] = {"PATH=/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0", NULL};
    DT_REQUIRE(dt_envb_init(&b, mine, NULL) == 0);
    DT_REQUIRE(dt_workenv_export(&w, &b, NULL) == 0);
    DT_CHECK_STR(dt_envb_get(&b, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
    dt_envb_free(&b);
}

/* The contract's two halves agree: what dt_workenv_export writes, dt_workenv_read reads back as
 * the same struct, field for field (the test runs in its own process: setenv is harmless). */
static void test_workenv_round_trip(void)
{
    dt_worker_env w = {.rank = 6, .local_rank = 2, .world_size = 12, .local_world_size = 4,
                       .group_rank = 1, .group_world_size = 3, .role = "trainer",
                       .master_addr = "10.1.2.3", .master_port = 4321, .store_addr = "10.1.2.4",
                       .store_port = 29501, .run_id = "rt-job", .attempt = 2, .max_restarts = 5,
                       .round = 4, .error_file = "/logs/rt-job/attempt_2/6/error.json",
                       .local_addr = "10.1.2.5", .agent_pid = 4242, .omp_num_threads = 1,
                       .flight_fd = 9};
    dt_envb b;
    DT_REQUIRE(dt_envb_init(&b, NULL, NULL) == 0);
    DT_REQUIRE(dt_workenv_export(&w, &b, NULL) == 0);
    clearenv();
    for (size_t i = 0; i < b.n; i++)
        DT_REQUIRE(putenv(b.v[i]) == 0); /* b's strings outlive the read */
    dt_worker_env r;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_workenv_read(&r, &e), &e);
    DT_CHECK_INT(r.rank, 6);
    DT_CHECK_INT(r.group_world_size, 3);
    DT_CHECK_STR(r.role, "trainer");
    DT_CHECK_STR(r.error_file, w.error_file);
    DT_CHECK_INT(r.agent_pid, 4242);
    DT_CHECK_INT(r.round, 4);
    DT_CHECK(memcmp(&r, &w, sizeof r) == 0); /* every field, including those added later */
    /* A worker started by hand: a single process, with torchrun's fallbacks. */
    clearenv();
    setenv("TORCHELASTIC_RUN_ID", "torch-id", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
    setenv("TORCHELASTIC_ERROR_FILE", "/tmp/e.json", 1);
    setenv("OMP_NUM_THREADS", "4,2", 1); /* OpenMP's nested syntax is not an error */
    DT_REQUIRE_OK(dt_workenv_read(&r, &e), &e);
    DT_CHECK_INT(r.world_size, 1);
    DT_CHECK_INT(r.group_world_size, 1);
    DT_CHECK_STR(r.run_id, "torch-id");
    DT_CHECK_INT(r.attempt, 3);
    DT_CHECK_INT(r.round, 3);
    DT_CHECK_STR(r.error_file, "/tmp/e.json");
    DT_CHECK_STR(r.role, "default");
    DT_CHECK_INT(r.omp_num_threads, 4);
    DT_CHECK_INT(r.agent_pid, 0);
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "2", 1);
    DT_CHECK(dt_workenv_read(&r, &e) == -EINVAL);
    DT_CHECK_CONTAINS(e.msg, "RANK=2 is not below WORLD_SIZE=2");
    setenv("RANK", "0", 1);
    setenv("MASTER_PORT", "x", 1);
    DT_CHECK(dt_workenv_read(&r, &e) == -EINVAL);
    DT_CHECK_CONTAINS(e.msg, "MASTER_PORT");
    clearenv(); /* environ pointed into b */
    dt_envb_free(&b);
}

/* Events files do not collide in a shared --log-dir: one name per agent. */
static void test_events_filename(void)
{
    char n[256];
    dt_events_filename(n, sizeof n, 0, false, 3, "h", 7);
    DT_CHECK_STR(n, "events.jsonl");
    dt_events_filename(n, sizeof n, 2, false, 0, "h", 7);
    DT_CHECK_STR(n, "events_node2.jsonl");
    dt_events_filename(n, sizeof n, 0, true, 0, "h", 7);
    DT_CHECK_STR(n, "events.jsonl");
    /* Elastic: rank 0 of a later round, or rank k, is not unique across the job's life. */
    dt_events_filename(n, sizeof n, 0, true, 2, "gpu3", 4242);
    DT_CHECK_STR(n, "events_node0_gpu3_4242.jsonl");
    dt_events_filename(n, sizeof n, 1, true, 0, "gpu4", 99);
    DT_CHECK_STR(n, "events_node1_gpu4_99.jsonl");
}

static void test_nproc_resolution(void)
{
    int n = 0;
    dt_err e;
    const dt_nproc three = {DT_NPROC_NUMBER, 3}, cpu = {DT_NPROC_CPU, 0},
                   autom = {DT_NPROC_AUTO, 0}, gpu = {DT_NPROC_GPU, 0}, zero = {DT_NPROC_NUMBER, 0};
    DT_REQUIRE(dt_agent_resolve_nproc(&three, &n, NULL, 0, &e) == 0);
    DT_CHECK_INT(n, 3);
    DT_REQUIRE(dt_agent_resolve_nproc(&cpu, &n, NULL, 0, &e) == 0);
    DT_CHECK_INT(n, dt_agent_count_cpus());
    int gpus = dt_agent_count_gpus(NULL, 0);
    DT_REQUIRE(dt_agent_resolve_nproc(&autom, &n, NULL, 0, &e) == 0);
    DT_CHECK_INT(n, gpus > 0 ? gpus : dt_agent_count_cpus());
    if (gpus == 0)
        DT_CHECK(dt_agent_resolve_nproc(&gpu, &n, NULL, 0, &e) == -ENODEV);
    DT_CHECK_INT(dt_agent_visible_gpus("0,1", 8), 2);
    DT_CHECK_INT(dt_agent_visible_gpus("3, 1 ,7", 8), 3);
    DT_CHECK_INT(dt_agent_visible_gpus("0,9,1", 8), 1);   /* cut at the invalid 9 */
    DT_CHECK_INT(dt_agent_visible_gpus("-1", 8), 0);
    DT_CHECK_INT(dt_agent_visible_gpus("", 8), 0);
    DT_CHECK_INT(dt_agent_visible_gpus("GPU-8f2a,GPU-11aa", 8), 2);
    DT_CHECK_INT(dt_agent_visible_gpus("0,1,2,3", 2), 2);  /* indexes past the count end it */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    DT_CHECK_INT(dt_agent_count_gpus(NULL, 0), 0);
    DT_CHECK(dt_agent_resolve_nproc(&zero, &n, NULL, 0, &e) == -EINVAL);
    DT_CHECK_CONTAINS(e.msg, "--nproc-per-node: 0 must be a number from 1 to 4096");
}

/* Lines through a pipe into dt_out_pump, with the agent's stdout pointed at a file. */
static void test_output_lines(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/console", TMP);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    DT_REQUIRE(fd >= 0);
    fflush(stdout);
    int saved = dup(1);
    dup2(fd, 1);
    close(fd);
    dt_out_stream s;
    dt_out_plan plan = {.console = true, .file = false};
    int child = -1;
    DT_REQUIRE(dt_out_prepare(&s, &plan, 1, 7, NULL, &child, NULL) == 0);
    DT_REQUIRE(s.fd >= 0 && child >= 0);
    const char *chunks[] = {"ab", "c\nde", "f\n\ng", "h"};
    for (size_t i = 0; i < 4; i++) {
        DT_REQUIRE(write(child, chunks[i], strlen(chunks[i])) == (ssize_t)strlen(chunks[i]));
        DT_CHECK_INT(dt_out_pump(&s), 1);
    }
    /* A line longer than the cap comes out in pieces of the cap. */
    size_t big = DT_OUT_LINE_MAX * 2 + 10;
    char *x = malloc(big);
    memset(x, 'x', big);
    size_t off = 0;
    while (off < big) {
        ssize_t w = write(child, x + off, big - off > 4096 ? 4096 : big - off);
        DT_REQUIRE(w > 0);
        off += (size_t)w;
        DT_CHECK_INT(dt_out_pump(&s), 1);
    }
    free(x);
    close(child);
    while (dt_out_pump(&s) == 1)
        ;
    dt_out_finish(&s);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    char *text = dt_test_slurp(path);
    DT_REQUIRE(text != NULL);
    DT_CHECK(!strncmp(text, "[7]:abc\n[7]:def\n[7]:\n", 21));
    DT_CHECK_CONTAINS(text, "[7]:gh");
    int lines = count_of(text, "\n");
    int xs = 0;
    size_t longest = 0;
    for (char *p = text, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        size_t len = (size_t)(nl - p);
        if (len > longest)
            longest = len;
    }
    for (char *p = text; *p; p++)
        xs += *p == 'x';
    DT_CHECK_INT(xs, (int)big);
    DT_CHECK(longest <= DT_OUT_LINE_MAX + 4);
    DT_CHECK(lines >= 6);
    free(text);
}

static void test_worker_guard(void)
{
    dt_err e;
    unsetenv("DTRAIN_AGENT_PID");
    DT_CHECK(dt_worker_guard_init(&e) == 0);
    DT_CHECK(dt_worker_guard_agent_alive());
    char buf[32];
    snprintf(buf, sizeof buf, "%d", (int)getppid());
    setenv("DTRAIN_AGENT_PID", buf, 1);
    DT_CHECK(dt_worker_guard_init(&e) == 0);
    DT_CHECK(dt_worker_guard_agent_alive());
    snprintf(buf, sizeof buf, "%d", (int)getpid()); /* not our parent */
    setenv("DTRAIN_AGENT_PID", buf, 1);
    DT_CHECK(dt_worker_guard_init(&e) == -ESRCH);
    DT_CHECK(!dt_worker_guard_agent_alive());
}

static void test_report_table(void)
{
    dt_rdzv_failure f[2];
    memset(f, 0, sizeof f);
    f[0].time = 1700000000.5;
    strcpy(f[0].host, "nodeA");
    f[0].rank = 3;
    f[0].local_rank = 1;
    f[0].pid = 77;
    f[0].signal = SIGSEGV;
    strcpy(f[0].message, "line one\nline two");
    f[1] = f[0];
    f[1].rank = 4;
    f[1].signal = 0;
    f[1].exit_code = 1;
    strcpy(f[1].message, "exited with code 1");
    char *t = dt_report_table(f, 2, "HEAD", "FOOT");
    DT_REQUIRE(t != NULL);
    DT_CHECK_CONTAINS(t, "HEAD");
    DT_CHECK_CONTAINS(t, "rank       : 3 (local_rank 1)");
    DT_CHECK_CONTAINS(t, "exit code  : -11 (SIGSEGV)");
    DT_CHECK_CONTAINS(t, "message    : line one\n               line two\n");
    DT_CHECK_CONTAINS(t, "[1] rank 4 (local_rank 1) on nodeA (node 0)");
    DT_CHECK_CONTAINS(t, "exited with code 1\n");
    DT_CHECK_CONTAINS(t, "FOOT");
    free(t);
    char *j = dt_rdzv_failure_to_json(&f[0]);
    dt_rdzv_failure back;
    DT_REQUIRE(dt_rdzv_failure_from_json(j, strlen(j), &back) == 0);
    DT_CHECK_STR(back.message, f[0].message);
    DT_CHECK_INT(back.signal, SIGSEGV);
    DT_CHECK_INT(back.rank, 3);
    free(j);
}

/* ---- single-node integration ------------------------------------------------------------ */

static const char env_script[] =
    "for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK \\\n"
    "  ROLE_WORLD_SIZE ROLE_NAME MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT \\\n"
    "  TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE \\\n"
    "  TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS DTRAIN_STORE_ADDR DTRAIN_STORE_PORT DTRAIN_RUN_ID \\\n"
    "  DTRAIN_ATTEMPT DTRAIN_ERROR_FILE DTRAIN_LOCAL_ADDR DTRAIN_AGENT_PID; do\n"
    "  eval \"echo $v=\\${$v-UNSET}\"\n"
    "done\n";

static void test_env_sh(void)
{
    char script[4096], *out = NULL;
    snprintf(script, sizeof script, "%s/env.sh", TMP);
    write_file(script, env_script);
    int rc = runf(&out, 30,
                  "unset OMP_NUM_THREADS; %s --nproc-per-node 2 --max-restarts 3 --rdzv-id envjob "
                  "--log-dir %s/logs -- sh %s",
                  BIN, TMP, script);
    DT_CHECK_INT(rc, 0);
    for (int r = 0; r < 2; r++) {
        char want[512];
#define WANT(fmt, ...)                                                                             \
    do {                                                                                           \
        snprintf(want, sizeof want, "[%d]:" fmt "\n", r, __VA_ARGS__);                             \
        DT_CHECK_CONTAINS(out, want);                                                              \
    } while (0)
        WANT("RANK=%d", r);
        WANT("LOCAL_RANK=%d", r);
        WANT("WORLD_SIZE=%d", 2);
        WANT("LOCAL_WORLD_SIZE=%d", 2);
        WANT("GROUP_RANK=%d", 0);
        WANT("GROUP_WORLD_SIZE=%d", 1);
        WANT("ROLE_RANK=%d", r);
        WANT("ROLE_WORLD_SIZE=%d", 2);
        WANT("ROLE_NAME=%s", "default");
        WANT("MASTER_ADDR=%s", "127.0.0.1");
        WANT("TORCHELASTIC_RESTART_COUNT=%d", 0);
        WANT("TORCHELASTIC_MAX_RESTARTS=%d", 3);
        WANT("TORCHELASTIC_RUN_ID=%s", "envjob");
        WANT("TORCHELASTIC_USE_AGENT_STORE=%s", "False");
        WANT("TORCHELASTIC_ERROR_FILE=%s/logs/envjob/attempt_0/%d/error.json", TMP, r);
        WANT("DTRAIN_ERROR_FILE=%s/logs/envjob/attempt_0/%d/error.json", TMP, r);
        WANT("OMP_NUM_THREADS=%d", 1);
        WANT("DTRAIN_RUN_ID=%s", "envjob");
        WANT("DTRAIN_ATTEMPT=%d", 0);
        WANT("DTRAIN_LOCAL_ADDR=%s", "127.0.0.1");
        WANT("DTRAIN_STORE_ADDR=%s", "127.0.0.1");
#undef WANT
        char key[64];
        snprintf(key, sizeof key, "[%d]:MASTER_PORT=", r);
        const char *p = strstr(out, key);
        DT_REQUIRE(p != NULL);
        int port = atoi(p + strlen(key));
        DT_CHECK(port > 0 && port < 65536);
        snprintf(key, sizeof key, "[%d]:DTRAIN_STORE_PORT=", r);
        p = strstr(out, key);
        DT_CHECK(p && atoi(p + strlen(key)) > 0 && atoi(p + strlen(key)) != port);
        snprintf(key, sizeof key, "[%d]:DTRAIN_AGENT_PID=", r);
        p = strstr(out, key);
        DT_CHECK(p && atoi(p + strlen(key)) > 1);
    }
    DT_CHECK_CONTAINS(out, "OMP_NUM_THREADS=1 for each");
    free(out);

    /* OMP_NUM_THREADS set by the user is left alone; one worker gets none. */
    rc = runf(&out, 30, "OMP_NUM_THREADS=4 %s --nproc-per-node 2 -- sh %s", BIN, script);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[1]:OMP_NUM_THREADS=4\n");
    free(out);
    rc = runf(&out, 30, "unset OMP_NUM_THREADS; %s -- sh %s", BIN, script);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[0]:OMP_NUM_THREADS=UNSET\n");
    DT_CHECK(!strstr(out, "[1]:"));
    free(out);
}

static const char env_py[] =
    "import json, os, sys\n"
    "e = os.environ\n"
    "r, lr, ws = int(e['RANK']), int(e['LOCAL_RANK']), int(e['WORLD_SIZE'])\n"
    "bad = []\n"
    "def want(c, what):\n"
    "    if not c: bad.append(what)\n"
    "want(r == lr and ws == 3 and e['LOCAL_WORLD_SIZE'] == '3', 'ranks')\n"
    "want(e['GROUP_RANK'] == '0' and e['GROUP_WORLD_SIZE'] == '1', 'group')\n"
    "want(e['ROLE_RANK'] == e['RANK'] and e['ROLE_WORLD_SIZE'] == '3', 'role')\n"
    "want(e['ROLE_NAME'] == 'default', 'role name')\n"
    "want(0 < int(e['MASTER_PORT']) < 65536 and e['MASTER_ADDR'], 'master')\n"
    "want(e['TORCHELASTIC_RESTART_COUNT'] == e['DTRAIN_ATTEMPT'] == '1', 'attempt')\n"
    "want(e['TORCHELASTIC_MAX_RESTARTS'] == '1', 'max restarts')\n"
    "want(e['TORCHELASTIC_RUN_ID'] == e['DTRAIN_RUN_ID'] != 'none', 'run id')\n"
    "want(e['TORCHELASTIC_USE_AGENT_STORE'] == 'False', 'agent store')\n"
    "want(e['TORCHELASTIC_ERROR_FILE'] == e['DTRAIN_ERROR_FILE'], 'error file')\n"
    "want(e['TORCHELASTIC_ERROR_FILE'].endswith('/attempt_1/%d/error.json' % r), 'error path')\n"
    "want(e['OMP_NUM_THREADS'] == '1', 'omp')\n"
    "want(int(e['DTRAIN_AGENT_PID']) == os.getppid(), 'agent pid')\n"
    "want(e['DTRAIN_STORE_ADDR'] == '127.0.0.1' and 0 < int(e['DTRAIN_STORE_PORT']) < 65536, 'store')\n"
    "want(e['DTRAIN_STORE_PORT'] != e['MASTER_PORT'], 'ports')\n"
    "want(e['DTRAIN_LOCAL_ADDR'] == '127.0.0.1', 'local addr')\n"
    "if e['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
    "    if r == 2:\n"
    "        with open(e['TORCHELASTIC_ERROR_FILE'], 'w') as f:\n"
    "            json.dump({'message': {'message': 'ValueError: planned failure', 'extraInfo':\n"
    "                       {'py_callstack': 'Traceback', 'timestamp': '1'}}}, f)\n"
    "        sys.exit(1)\n"
    "    import time; time.sleep(30)\n"
    "print('PYOK' if not bad else 'PYBAD ' + ','.join(bad), r, flush=True)\n";

static void test_env_python(void)
{
    char script[4096], *out = NULL;
    if (runf(NULL, 20, "python3 -c 'import json'") != 0)
        DT_SKIP("python3 is not available");
    snprintf(script, sizeof script, "%s/env.py", TMP);
    write_file(script, env_py);
    int rc = runf(&out, 60,
                  "unset OMP_NUM_THREADS; %s --nproc-per-node 3 --max-restarts 1 --stop-grace 5 "
                  "--log-dir %s/logs %s",
                  BIN, TMP, script);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[0]:PYOK 0");
    DT_CHECK_CONTAINS(out, "[1]:PYOK 1");
    DT_CHECK_CONTAINS(out, "[2]:PYOK 2");
    DT_CHECK(!strstr(out, "PYBAD"));
    DT_CHECK_CONTAINS(out, "restarting every worker");
    if (rc != 0 || strstr(out, "PYBAD"))
        fprintf(stderr, "%s\n", out);
    free(out);
}

static void test_exit1_table(void)
{
    char *out = NULL;
    int rc = runf(&out, 30, "%s --nproc-per-node 2 --log-dir %s -- sh -c 'exit $((RANK + 1))'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "Root cause (first failure):");
    DT_CHECK_CONTAINS(out, "dtrain: the job failed: rank ");
    DT_CHECK_CONTAINS(out, "--max-restarts=0 spent");
    DT_CHECK_CONTAINS(out, "  exit code  : ");
    DT_CHECK_CONTAINS(out, "  host       : ");
    free(out);
}

static void test_segfault(void)
{
    char *out = NULL;
    int rc = runf(&out, 30, "%s --log-dir %s -- sh -c 'kill -SEGV $$'", BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "exit code  : -11 (SIGSEGV)");
    DT_CHECK_CONTAINS(out, "killed by SIGSEGV");
    free(out);
}

static void test_error_file_message(void)
{
    char *out = NULL;
    int rc = runf(&out, 30,
                  "%s --nproc-per-node 2 --log-dir %s -- sh -c '"
                  "if [ $RANK = 1 ]; then printf \"{\\\"message\\\": {\\\"message\\\": "
                  "\\\"RuntimeError: boom at step 7\\\", \\\"extraInfo\\\": {\\\"timestamp\\\": "
                  "\\\"1\\\"}}}\" > $TORCHELASTIC_ERROR_FILE; exit 9; fi; exec sleep 30'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "message    : RuntimeError: boom at step 7");
    DT_CHECK_CONTAINS(out, "rank       : 1 (local_rank 1)");
    DT_CHECK_CONTAINS(out, "error.json");
    free(out);
}

/* One worker fails; the other hangs (sleep) and must be stopped by SIGTERM. */
static void test_hang_is_stopped(void)
{
    char *out = NULL;
    double t0 = dt_test_now();
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 2 --stop-grace 100 --log-dir %s -- sh -c "
                  "'if [ $RANK = 0 ]; then sleep 0.2; exit 2; fi; exec sleep 100'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK(dt_test_now() - t0 < 50); /* far below the 100 s grace: SIGTERM ended it */
    DT_CHECK(!strstr(out, "SIGKILL"));
    free(out);
}

/* A worker that ignores SIGTERM is SIGKILLed after --stop-grace. */
static void test_ignore_sigterm(void)
{
    char *out = NULL;
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 2 --stop-grace 0.3 --log-dir %s -- sh -c "
                  "'if [ $RANK = 0 ]; then sleep 0.3; exit 2; fi; trap \"\" TERM; sleep 100'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "sending SIGKILL");
    free(out);
}

static void test_partial_lines(void)
{
    char *out = NULL;
    int rc = runf(&out, 30,
                  "%s --nproc-per-node 2 -- sh -c 'printf par; sleep 0.2; printf \"tial\\n\"; "
                  "printf no-newline-$RANK'",
                  BIN);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[0]:partial\n");
    DT_CHECK_CONTAINS(out, "[1]:partial\n");
    DT_CHECK_CONTAINS(out, "[0]:no-newline-0\n");
    DT_CHECK_CONTAINS(out, "[1]:no-newline-1\n");
    free(out);
}

/* stdout and stderr on one pipe (`2>&1`): a worker line the reader took only part of is
 * finished before a line of the agent's own goes out; before, the agent's line could land in
 * the middle of it (test lines_not_interleaved saw one such line in a loaded full-suite run).
 * Lines queued while the pipe was full leave in one write larger than PIPE_BUF, which the pipe
 * may take only part of, cutting a line. */
static void test_console_shared_pipe(void)
{
    int p[2];
    DT_REQUIRE(pipe(p) == 0);
    if (fcntl(p[1], F_SETPIPE_SZ, 16 * 4096) < 0)
        DT_SKIP("cannot size a pipe (F_SETPIPE_SZ)");
    fflush(stdout);
    fflush(stderr);
    int saved1 = dup(1), saved2 = dup(2);
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[1]);
    DT_REQUIRE(dt_out_console_open(NULL) == 0);
    dt_out_stream s;
    dt_out_plan plan = {.console = true, .file = false};
    int child = -1;
    DT_REQUIRE(dt_out_prepare(&s, &plan, 1, 3, NULL, &child, NULL) == 0);
    /* 2000 lines of 40 bytes (80 KB): the console pipe takes 64 KB, the agent queues the rest */
    enum { LINES = 2000 };
    if (fcntl(child, F_SETPIPE_SZ, LINES * 40) < 0)
        DT_SKIP("cannot size a pipe (F_SETPIPE_SZ)");
    char *text = malloc(LINES * 36 + 1);
    for (int i = 0; i < LINES; i++)
        snprintf(text + i * 36, 37, "line-%04d-abcdefghijklmnopqrstuvwxy\n", i);
    DT_REQUIRE(write(child, text, LINES * 36) == LINES * 36);
    free(text);
    close(child);
    while (dt_out_pump(&s) == 1)
        ;
    dt_out_finish(&s);
    char *got = malloc(1 << 20);
    size_t have = 0;
    /* The reader frees a page; the queue goes out in one write the pipe takes 4096 bytes of,
     * ending inside a line; the reader frees another page; the agent's own line has room. */
    for (int k = 0; k < 2; k++) {
        ssize_t r = read(p[0], got + have, 5000);
        DT_REQUIRE(r > 0);
        have += (size_t)r;
        if (k == 0)
            dt_out_console_tick();
    }
    dt_out_console_write(2, "AGENT-LINE\n", 11);
    ssize_t r;
    int fl = fcntl(p[0], F_GETFL);
    fcntl(p[0], F_SETFL, fl | O_NONBLOCK);
    for (int spins = 0; spins < 5000; spins++) {
        dt_out_console_tick();
        r = read(p[0], got + have, (1 << 20) - 1 - have);
        if (r > 0)
            have += (size_t)r;
        else if (!dt_out_console_pending(1) && !dt_out_console_pending(2))
            break;
        else
            dt_sleep_ms(1);
    }
    dt_out_console_close(1.0);
    dup2(saved1, 1);
    dup2(saved2, 2);
    close(saved1);
    close(saved2);
    got[have] = '\0';
    int good = 0, bad = 0, agent = 0;
    for (char *q = got, *nl; (nl = strchr(q, '\n')); q = nl + 1) {
        *nl = '\0';
        int i;
        char tail[64];
        if (!strcmp(q, "AGENT-LINE"))
            agent++;
        else if (sscanf(q, "[3]:line-%d-%63s", &i, tail) == 2 &&
                 !strcmp(tail, "abcdefghijklmnopqrstuvwxy"))
            good++;
        else if (bad++ < 3)
            fprintf(stderr, "    a cut line: \"%s\"\n", q);
    }
    DT_CHECK_INT(bad, 0);
    DT_CHECK_INT(good, LINES);
    DT_CHECK_INT(agent, 1);
    free(got);
    close(p[0]);
}

/* Lines of several busy workers never mix, and every line arrives. */
static void test_lines_not_interleaved(void)
{
    char *out = NULL;
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 3 -- sh -c 'i=0; while [ $i -lt 2000 ]; do "
                  "echo \"rank-$RANK-line-$i-abcdefghijklmnopqrstuvwxyz\"; i=$((i+1)); done'",
                  BIN);
    DT_CHECK_INT(rc, 0);
    int good = 0, bad = 0;
    for (char *p = out, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        *nl = '\0';
        int r1, r2, i;
        char tail[64];
        if (p[0] != '[')
            continue; /* the agent's own log lines */
        if (sscanf(p, "[%d]:rank-%d-line-%d-%63s", &r1, &r2, &i, tail) == 4 && r1 == r2 &&
            !strcmp(tail, "abcdefghijklmnopqrstuvwxyz"))
            good++;
        else
            bad++;
    }
    DT_CHECK_INT(bad, 0);
    DT_CHECK_INT(good, 6000);
    free(out);
}

/* Megabytes without a newline: cut into bounded lines, nothing lost, the agent stays small. */
static void test_megabytes_no_newline(void)
{
    char *out = NULL, ev[4096];
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 2 --rdzv-id mb --log-dir %s -- sh -c "
                  "'head -c 8000000 /dev/zero | tr \"\\0\" x'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 0);
    size_t xs = 0, longest = 0;
    for (char *p = out, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
        size_t len = (size_t)(nl - p);
        if (len > longest)
            longest = len;
        if (!strncmp(p, "[0]:x", 5) || !strncmp(p, "[1]:x", 5))
            xs += len - 4;
    }
    DT_CHECK_INT((long long)xs, 16000000LL);
    DT_CHECK(longest <= DT_OUT_LINE_MAX + 8);
    free(out);
    snprintf(ev, sizeof ev, "%s/mb/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    const char *m = strstr(events, "\"agent_max_rss_kb\":");
    DT_REQUIRE(m != NULL);
    long rss = atol(m + strlen("\"agent_max_rss_kb\":"));
    DT_CHECK_MSG(rss < 64 * 1024, "agent max RSS %ld kB", rss);
    free(events);
}

static void test_restart_then_success(void)
{
    char *out = NULL, ev[4096];
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 2 --max-restarts 3 --stop-grace 5 --rdzv-id rs --log-dir %s "
                  "-- sh -c 'echo attempt=$TORCHELASTIC_RESTART_COUNT; "
                  "[ $TORCHELASTIC_RESTART_COUNT -ge 2 ] || [ $RANK = 0 ] || exit 5; sleep 0.1'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[1]:attempt=2\n");
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    free(out);
    snprintf(ev, sizeof ev, "%s/rs/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    DT_CHECK_INT(count_of(events, "\"event\":\"rendezvous\""), 3);
    DT_CHECK_INT(count_of(events, "\"event\":\"restart\""), 2);
    DT_CHECK_INT(count_of(events, "\"event\":\"start\""), 6);
    DT_CHECK_INT(count_of(events, "\"event\":\"failure\""), 2);
    DT_CHECK_CONTAINS(events, "\"event\":\"end\",\"result\":\"succeeded\",\"exit_code\":0");
    /* Per-attempt directories with the workers' error file location. */
    snprintf(ev, sizeof ev, "%s/rs/attempt_2/1", TMP);
    DT_CHECK(access(ev, F_OK) == 0);
    free(events);
}

static void test_budget_exhausted(void)
{
    char *out = NULL, ev[4096];
    int rc = runf(&out, 60,
                  "%s --nproc-per-node 2 --max-restarts 2 --rdzv-id be --log-dir %s -- sh -c "
                  "'exit 4'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "(attempt 2; --max-restarts=2 spent)");
    DT_CHECK_CONTAINS(out, "exit code  : 4");
    DT_CHECK_INT(count_of(out, "Root cause"), 1);
    free(out);
    snprintf(ev, sizeof ev, "%s/be/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    DT_CHECK_INT(count_of(events, "\"event\":\"start\""), 6);
    DT_CHECK_CONTAINS(events, "\"result\":\"failed\",\"exit_code\":1");
    free(events);
}

static void test_redirects_and_tee(void)
{
    char *out = NULL, path[4096];
    const char *cmd = "sh -c 'echo out-$RANK; echo err-$RANK >&2'";
    int rc = runf(&out, 30, "%s --nproc-per-node 2 --redirects 3 --rdzv-id rd --log-dir %s/a -- %s",
                  BIN, TMP, cmd);
    DT_CHECK_INT(rc, 0);
    DT_CHECK(!strstr(out, "out-0") && !strstr(out, "err-1"));
    free(out);
    snprintf(path, sizeof path, "%s/a/rd/attempt_0/1/stdout.log", TMP);
    char *f = dt_test_slurp(path);
    DT_CHECK(f && !strcmp(f, "out-1\n"));
    free(f);
    snprintf(path, sizeof path, "%s/a/rd/attempt_0/0/stderr.log", TMP);
    f = dt_test_slurp(path);
    DT_CHECK(f && !strcmp(f, "err-0\n"));
    free(f);

    /* tee stdout: on the console and in the file; stderr only on the console. */
    rc = runf(&out, 30, "%s --nproc-per-node 2 --tee 1 --rdzv-id te --log-dir %s/b -- %s", BIN,
              TMP, cmd);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[0]:out-0\n");
    DT_CHECK_CONTAINS(out, "[1]:err-1\n");
    free(out);
    snprintf(path, sizeof path, "%s/b/te/attempt_0/0/stdout.log", TMP);
    f = dt_test_slurp(path);
    DT_CHECK(f && !strcmp(f, "out-0\n"));
    free(f);
    snprintf(path, sizeof path, "%s/b/te/attempt_0/0/stderr.log", TMP);
    DT_CHECK(access(path, F_OK) != 0);

    /* Per local rank: rank 0 both streams to files, rank 1 on the console. */
    rc = runf(&out, 30, "%s --nproc-per-node 2 -r 0:3 --rdzv-id pr --log-dir %s/c -- %s", BIN, TMP,
              cmd);
    DT_CHECK_INT(rc, 0);
    DT_CHECK(!strstr(out, "out-0"));
    DT_CHECK_CONTAINS(out, "[1]:out-1\n");
    free(out);
}

static void test_local_ranks_filter(void)
{
    char *out = NULL;
    int rc = runf(&out, 30,
                  "%s --nproc-per-node 3 --local-ranks-filter 1 -- sh -c 'echo hi-$RANK; echo e-$RANK >&2'",
                  BIN);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[1]:hi-1\n");
    DT_CHECK_CONTAINS(out, "[1]:e-1\n");
    DT_CHECK(!strstr(out, "hi-0") && !strstr(out, "hi-2"));
    free(out);
}

/* --redirects without --log-dir: the files go to a temporary directory the user is told about,
 * and it is kept. */
static void test_redirects_tmp_dir_named(void)
{
    char *out = NULL, path[8192];
    int rc = runf(&out, 30, "TMPDIR=%s %s --redirects 3 -- sh -c 'echo out-$RANK'", TMP, BIN);
    DT_CHECK_INT(rc, 0);
    const char *m = out ? strstr(out, "worker output files and events.jsonl go to ") : NULL;
    DT_REQUIRE(m != NULL);
    m += strlen("worker output files and events.jsonl go to ");
    const char *nl = strchr(m, '\n');
    DT_REQUIRE(nl != NULL);
    snprintf(path, sizeof path, "%.*s/attempt_0/0/stdout.log", (int)(nl - m), m);
    DT_CHECK(!strncmp(m, TMP, strlen(TMP)));
    char *f = dt_test_slurp(path);
    DT_CHECK_MSG(f && !strcmp(f, "out-0\n"), "%s", path);
    free(f);
    DT_CHECK_CONTAINS(out, "worker output files kept in ");
    free(out);
}

/* --local-ranks-filter hides a rank from the console, not from the record: its output goes to
 * its files, and the failure table points there. */
static void test_filtered_rank_to_files(void)
{
    char *out = NULL, path[4096];
    int rc = runf(&out, 30,
                  "%s --nproc-per-node 2 --local-ranks-filter 0 --rdzv-id lf --log-dir %s -- "
                  "sh -c 'echo out-$RANK; echo err-$RANK >&2; [ $RANK = 1 ] && exit 3; exit 0'",
                  BIN, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK(!strstr(out, "out-1"));
    DT_CHECK_CONTAINS(out, "[0]:out-0\n");
    snprintf(path, sizeof path, "its output is in %s/lf/attempt_0/1/stdout.log", TMP);
    DT_CHECK_CONTAINS(out, path);
    free(out);
    snprintf(path, sizeof path, "%s/lf/attempt_0/1/stdout.log", TMP);
    char *f = dt_test_slurp(path);
    DT_CHECK(f && !strcmp(f, "out-1\n"));
    free(f);
    snprintf(path, sizeof path, "%s/lf/attempt_0/1/stderr.log", TMP);
    f = dt_test_slurp(path);
    DT_CHECK(f && !strcmp(f, "err-1\n"));
    free(f);
}

/* --standalone is one node: with --nnodes 2 it is a usage error, not a silent one-node job. */
static void test_standalone_nnodes(void)
{
    char *out = NULL;
    int rc = runf(&out, 30, "%s --standalone --nnodes 2 -- sh -c 'echo ran'", BIN);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "--standalone runs a job on this one node");
    DT_CHECK(!strstr(out, "ran"));
    free(out);
    rc = runf(&out, 30, "%s --standalone --nnodes 1 -- sh -c 'echo ran'", BIN);
    DT_CHECK_INT(rc, 0);
    free(out);
}

static void test_bad_command(void)
{
    char *out = NULL;
    int rc = runf(&out, 30, "%s -- /nonexistent/program", BIN);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "cannot run \"/nonexistent/program\"");
    free(out);
    rc = runf(&out, 30, "%s -- no-such-program-dtrain", BIN);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "not found in PATH");
    free(out);
}

static void test_nproc_cpu(void)
{
    char *out = NULL, want[64];
    int rc = runf(&out, 30, "%s --nproc-per-node cpu -- sh -c 'echo n=$LOCAL_WORLD_SIZE'", BIN);
    DT_CHECK_INT(rc, 0);
    snprintf(want, sizeof want, "[0]:n=%d\n", dt_agent_count_cpus());
    DT_CHECK_CONTAINS(out, want);
    free(out);
    if (dt_agent_count_gpus(NULL, 0) == 0) {
        rc = runf(&out, 30, "%s --nproc-per-node gpu -- true", BIN);
        DT_CHECK_INT(rc, 2);
        DT_CHECK_CONTAINS(out, "no GPU");
        free(out);
    }
}

/* Starts `sh -c cmd` with stdout and stderr on a pipe; returns its pid, *rfd the read end. */
static pid_t spawn_piped(const char *cmd, int *rfd)
{
    int p[2];
    DT_REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = fork();
    DT_REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

/* A console nobody reads (a pager left open, a stopped `| tee`): the agent must not freeze. The
 * worker prints megabytes and exits 3; the agent reports the failure and exits, dropping the
 * lines the console did not take (counted in events.jsonl). */
static void test_console_nobody_reads(void)
{
    char cmd[8192], ev[4096];
    int rfd;
    snprintf(cmd, sizeof cmd,
             "exec %s --rdzv-id cs --log-dir %s -- sh -c 'yes line-of-output | head -n 300000; "
             "exit 3'",
             BIN, TMP);
    pid_t agent = spawn_piped(cmd, &rfd);
    int code = dt_test_wait_exit(agent, 45);
    close(rfd);
    DT_CHECK_INT(code, 1);
    snprintf(ev, sizeof ev, "%s/cs/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    DT_CHECK_CONTAINS(events, "\"event\":\"exit\",\"rank\":0");
    DT_CHECK_CONTAINS(events, "\"exit_code\":3");
    const char *m = strstr(events, "\"console_lines_dropped\":");
    DT_REQUIRE(m != NULL);
    DT_CHECK(atol(m + strlen("\"console_lines_dropped\":")) > 0);
    free(events);
}

/* A reader that stops for a while and then reads again: the job goes on meanwhile, and once the
 * console drains the agent says how many lines it dropped. */
static void test_console_stall_then_resume(void)
{
    char cmd[8192];
    int rfd;
    snprintf(cmd, sizeof cmd,
             "exec %s --log-dir %s -- sh -c 'yes line-of-output | head -n 300000; sleep 6; "
             "echo last-line'",
             BIN, TMP);
    pid_t agent = spawn_piped(cmd, &rfd);
    dt_sleep_ms(4000); /* longer than DT_OUT_CONSOLE_STALL_S */
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    DT_REQUIRE(out != NULL);
    double deadline = dt_test_now() + 40;
    for (;;) {
        if (len + 4097 > cap)
            DT_REQUIRE((out = realloc(out, cap *= 2)) != NULL);
        struct pollfd pf = {rfd, POLLIN, 0};
        if (poll(&pf, 1, 1000) <= 0) {
            if (dt_test_now() > deadline)
                break;
            continue;
        }
        ssize_t n = read(rfd, out + len, cap - len - 1);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    out[len] = '\0';
    close(rfd);
    DT_CHECK_INT(dt_test_wait_exit(agent, 20), 0);
    DT_CHECK_CONTAINS(out, "dropped: the console did not keep up");
    DT_CHECK_CONTAINS(out, "[0]:last-line\n");
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    free(out);
}

/* ---- signals and orphans ---------------------------------------------------------------- */

/* Workers that write their pid (and a grandchild's) and wait; the agent is SIGKILLed: every one
 * of them must be gone soon after, grandchildren included. */
static void test_sigkill_agent_no_orphans(void)
{
    char cmd[8192], outp[4096], path[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    snprintf(cmd, sizeof cmd,
             "%s --nproc-per-node 2 --log-dir %s -- sh -c 'sleep 300 & echo $! > %s/gc.$RANK; "
             "echo $$ > %s/w.$RANK; wait'",
             BIN, TMP, TMP, TMP);
    pid_t agent = dt_test_spawn(cmd, outp);
    int pids[4] = {0};
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/gc.%d", TMP, r);
        DT_REQUIRE(wait_for_file(path, 20));
        snprintf(path, sizeof path, "%s/w.%d", TMP, r);
        DT_REQUIRE(wait_for_file(path, 20));
    }
    dt_sleep_ms(50);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/w.%d", TMP, r);
        pids[2 * r] = read_pid(path);
        snprintf(path, sizeof path, "%s/gc.%d", TMP, r);
        pids[2 * r + 1] = read_pid(path);
    }
    for (int i = 0; i < 4; i++)
        DT_REQUIRE(pids[i] > 1 && !dt_test_pid_gone(pids[i]));
    kill(agent, SIGKILL);
    DT_CHECK_INT(dt_test_wait_exit(agent, 10), 128 + SIGKILL);
    double deadline = dt_test_now() + 10;
    bool all = false;
    while (!all && dt_test_now() < deadline) {
        all = true;
        for (int i = 0; i < 4; i++)
            all = all && dt_test_pid_gone(pids[i]);
        if (!all)
            dt_sleep_ms(20);
    }
    for (int i = 0; i < 4; i++) {
        DT_CHECK_MSG(dt_test_pid_gone(pids[i]), "pid %d (%s of rank %d) outlived the agent", pids[i],
                     i % 2 ? "grandchild" : "worker", i / 2);
        if (!dt_test_pid_gone(pids[i]))
            kill(pids[i], SIGKILL);
    }
}

/* ---- daemons the workers start ------------------------------------------------------------
 * A worker that double-forks (`setsid sh -c 'sleep 300 &'`: the middle process leads a new
 * session and exits) leaves a process outside its process group, re-parented to the agent. The
 * README promises that nothing the workers started outlives the job. */

/* Starts an agent with one worker that starts such a daemon (ignoring SIGTERM when
 * ignore_term), writes its pid to <TMP>/daemon, then runs `then`; returns the agent's pid and
 * the daemon's in *daemon. */
static pid_t start_daemonising_agent(const char *extra, bool ignore_term, const char *then,
                                     const char *outp, int *daemon)
{
    char cmd[20000], path[1024];
    if (access("/usr/bin/setsid", X_OK) != 0 && access("/bin/setsid", X_OK) != 0)
        DT_SKIP("setsid(1) is not installed (util-linux)");
    snprintf(path, sizeof path, "%s/daemon", TMP);
    snprintf(cmd, sizeof cmd,
             "%s --nproc-per-node 1 --log-dir %s %s -- sh -c 'setsid sh -c \"%s sleep 300 & echo "
             "\\$! > %s.tmp; mv %s.tmp %s\" </dev/null >/dev/null 2>&1; %s'",
             BIN, TMP, extra, ignore_term ? "trap \\\"\\\" TERM;" : "", path, path, path, then);
    pid_t agent = dt_test_spawn(cmd, outp);
    if (!wait_for_file(path, 20)) {
        kill(agent, SIGKILL);
        dt_test_wait_exit(agent, 10);
        char *o = dt_test_slurp(outp);
        DT_CHECK_MSG(false, "the worker did not start its daemon; agent output:\n%s", o ? o : "");
        free(o);
        dt_test_stop();
    }
    *daemon = read_pid(path);
    DT_REQUIRE(*daemon > 1);
    return agent;
}

/* Waits up to timeout_s for pid to be gone; kills it when it is not (so that a failed test
 * leaves nothing behind) and fails the test naming when. */
static void check_daemon_gone(int pid, double timeout_s, const char *when)
{
    double deadline = dt_test_now() + timeout_s;
    while (!dt_test_pid_gone(pid) && dt_test_now() < deadline)
        dt_sleep_ms(20);
    DT_CHECK_MSG(dt_test_pid_gone(pid), "the daemon (pid %d) a worker started outlived %s", pid,
                 when);
    if (!dt_test_pid_gone(pid))
        kill(pid, SIGKILL);
}

/* The job ends normally: the daemon is stopped with it, with SIGKILL after --stop-grace when it
 * ignores SIGTERM. */
static void test_daemon_gone_after_job(void)
{
    char outp[4096];
    int daemon = 0;
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_daemonising_agent("--stop-grace 1", true, "exit 0", outp, &daemon);
    int code = dt_test_wait_exit(agent, 30);
    check_daemon_gone(daemon, 2, "the end of the job");
    DT_CHECK_INT(code, 0);
    char *out = dt_test_slurp(outp);
    DT_CHECK_CONTAINS(out, "outside their process groups (daemons)");
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    free(out);
}

/* SIGTERM to the agent: the stop reaches the daemon too. */
static void test_daemon_gone_after_sigterm(void)
{
    char outp[4096];
    int daemon = 0;
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_daemonising_agent("--stop-grace 20", false, "exec sleep 300", outp,
                                          &daemon);
    DT_REQUIRE(!dt_test_pid_gone(daemon));
    kill(agent, SIGTERM);
    int code = dt_test_wait_exit(agent, 30);
    check_daemon_gone(daemon, 2, "a SIGTERM of the agent");
    DT_CHECK_INT(code, 128 + SIGTERM);
}

/* SIGKILL of the agent: the agent can do nothing; the guardian kills the workers' cgroup. Only
 * where the agent could make one (a writable cgroup v2): elsewhere the README says the daemon
 * survives, and the test is skipped with the agent's reason. */
static void test_daemon_gone_after_sigkill(void)
{
    char outp[4096];
    int daemon = 0;
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    setenv("DTRAIN_LOG", "debug", 1);
    pid_t agent = start_daemonising_agent("", false, "exec sleep 300", outp, &daemon);
    DT_REQUIRE(!dt_test_pid_gone(daemon));
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    const char *no = strstr(out, "no cgroup for the workers (");
    const char *cg = strstr(out, "the workers' cgroup: ");
    char path[4096] = "", why[512] = "";
    if (cg)
        sscanf(cg + strlen("the workers' cgroup: "), "%4095s", path);
    else if (no)
        snprintf(why, sizeof why, "%.*s", (int)strcspn(no, "\n"), no);
    free(out);
    kill(agent, SIGKILL);
    DT_CHECK_INT(dt_test_wait_exit(agent, 10), 128 + SIGKILL);
    if (!path[0]) {
        kill(daemon, SIGKILL);
        DT_REQUIRE(no != NULL); /* the agent says which cgroup, or why none */
        DT_SKIP(why[0] ? why : "the agent made no cgroup");
    }
    check_daemon_gone(daemon, 10, "a SIGKILL of the agent (in a cgroup)");
    double deadline = dt_test_now() + 10;
    while (access(path, F_OK) == 0 && dt_test_now() < deadline)
        dt_sleep_ms(20);
    DT_CHECK_MSG(access(path, F_OK) != 0, "the guardian left the cgroup %s behind", path);
}

/* Starts an agent (through the program `via` when not NULL, e.g. a wrapper that ignores
 * signals) whose workers trap signals and mark themselves ready; returns its pid. */
static pid_t start_trapping_agent_via(const char *via, const char *trap, const char *extra,
                                      const char *outp)
{
    char cmd[8192], path[4096];
    snprintf(cmd, sizeof cmd,
             "%s %s --nproc-per-node 2 %s --log-dir %s -- sh -c '%s; touch %s/ready.$RANK; "
             "while :; do sleep 0.05; done'",
             via ? via : "", BIN, extra, TMP, trap, TMP);
    pid_t agent = dt_test_spawn(cmd, outp);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        if (!wait_for_file(path, 20)) {
            kill(agent, SIGKILL);
            DT_REQUIRE(!"workers did not start");
        }
    }
    return agent;
}

static pid_t start_trapping_agent(const char *trap, const char *extra, const char *outp)
{
    return start_trapping_agent_via(NULL, trap, extra, outp);
}

/* A wrapper script that ignores the given signals, then execs its arguments (as a script's
 * `dtrain ... &` or nohup leaves them). */
static const char *ignoring_wrapper(const char *sigs)
{
    static char path[4096];
    char text[256];
    snprintf(path, sizeof path, "%s/ignore-%s.sh", TMP, sigs);
    for (char *c = path + strlen(TMP); *c; c++)
        if (*c == ' ')
            *c = '-';
    snprintf(text, sizeof text, "#!/bin/sh\ntrap \"\" %s\nexec \"$@\"\n", sigs);
    write_file(path, text);
    DT_REQUIRE(chmod(path, 0755) == 0);
    return path;
}

static void test_ctrl_c_once(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_trapping_agent("trap \"echo got-int-$RANK; exit 7\" INT", "--stop-grace 60", outp);
    kill(agent, SIGINT);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 128 + SIGINT);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "[0]:got-int-0\n");
    DT_CHECK_CONTAINS(out, "[1]:got-int-1\n");
    DT_CHECK_CONTAINS(out, "SIGINT received");
    DT_CHECK(!strstr(out, "Root cause"));
    free(out);
}

static void test_ctrl_c_twice(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    /* The workers ignore INT and TERM; the grace is longer than this test may run. */
    pid_t agent = start_trapping_agent("trap \"\" INT TERM", "--stop-grace 1000", outp);
    kill(agent, SIGINT);
    dt_sleep_ms(200);
    DT_CHECK_INT(waitpid(agent, NULL, WNOHANG), 0); /* still waiting for the grace period */
    kill(agent, SIGINT);
    DT_CHECK_INT(dt_test_wait_exit(agent, 20), 128 + SIGINT);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "killing the workers now");
    free(out);
}

static void test_sigterm_forwarded(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_trapping_agent("trap \"echo got-term-$RANK; exit 0\" TERM", "--stop-grace 60", outp);
    kill(agent, SIGTERM);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 128 + SIGTERM);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "[0]:got-term-0\n");
    DT_CHECK_CONTAINS(out, "[1]:got-term-1\n");
    free(out);
}

/* SIGUSR1 (a scheduler's early warning) reaches the workers and does not stop the job. */
static void test_sigusr1_forwarded(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_trapping_agent("trap \"echo got-usr1-$RANK; exit 0\" USR1", "", outp);
    kill(agent, SIGUSR1);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 0);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "[0]:got-usr1-0\n");
    DT_CHECK_CONTAINS(out, "[1]:got-usr1-1\n");
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    free(out);
}

/* SIGHUP and SIGQUIT stop the job through the workers (128+n); SIGUSR2 is forwarded only. */
static void test_hup_quit_usr2_forwarded(void)
{
    static const struct { int sig; const char *name; int code; } cases[] = {
        {SIGHUP, "HUP", 128 + SIGHUP}, {SIGQUIT, "QUIT", 128 + SIGQUIT}, {SIGUSR2, "USR2", 0}};
    /* The agent as started from a terminal, even when this suite runs under nohup (an agent that
     * inherits SIGHUP ignored keeps ignoring it: test_nohup_keeps_hup_ignored). */
    signal(SIGHUP, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        char outp[4096], trap[256], want[64], path[4096];
        snprintf(outp, sizeof outp, "%s/agent-%s.out", TMP, cases[i].name);
        snprintf(trap, sizeof trap, "trap \"echo got-%s-$RANK; exit 0\" %s", cases[i].name,
                 cases[i].name);
        for (int r = 0; r < 2; r++) {
            snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
            unlink(path);
        }
        pid_t agent = start_trapping_agent(trap, "--stop-grace 60", outp);
        kill(agent, cases[i].sig);
        DT_CHECK_INT(dt_test_wait_exit(agent, 30), cases[i].code);
        char *out = dt_test_slurp(outp);
        DT_REQUIRE(out != NULL);
        for (int r = 0; r < 2; r++) {
            snprintf(want, sizeof want, "[%d]:got-%s-%d\n", r, cases[i].name, r);
            DT_CHECK_CONTAINS(out, want);
        }
        DT_CHECK(!strstr(out, "sending SIGKILL"));
        free(out);
    }
}

/* An agent started with SIGINT and SIGQUIT ignored (`dtrain ... &` in a script, or over ssh by
 * dtrain-ssh.sh): its workers still get the default dispositions, so a forwarded SIGINT reaches
 * their trap instead of waiting for SIGKILL after the grace. */
static void test_int_ignored_at_start(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_trapping_agent_via(ignoring_wrapper("INT QUIT"),
                                           "trap \"echo got-int-$RANK; exit 7\" INT",
                                           "--stop-grace 1000", outp);
    kill(agent, SIGINT);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 128 + SIGINT);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "[0]:got-int-0\n");
    DT_CHECK_CONTAINS(out, "[1]:got-int-1\n");
    free(out);
}

/* Under nohup (SIGHUP ignored at start) a hangup does not stop the job: the agent ignores it and
 * so do the workers; a later SIGTERM ends it as usual. */
static void test_nohup_keeps_hup_ignored(void)
{
    char outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    pid_t agent = start_trapping_agent_via(ignoring_wrapper("HUP"),
                                           "trap \"echo got-term-$RANK; exit 0\" TERM",
                                           "--stop-grace 60", outp);
    kill(agent, SIGHUP);
    dt_sleep_ms(200);
    kill(agent, SIGTERM);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 128 + SIGTERM);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK(!strstr(out, "SIGHUP"));
    DT_CHECK_CONTAINS(out, "[0]:got-term-0\n");
    free(out);
}

/* Workers read /dev/null, not the agent's stdin (a worker reading a terminal from its own
 * process group would be stopped by SIGTTIN and the agent would wait forever). */
static void test_worker_stdin_devnull(void)
{
    char *out = NULL;
    int rc = runf(&out, 30,
                  "echo from-the-agents-stdin | %s -- sh -c 'read x; echo \"got[$x]\"; "
                  "readlink /proc/$$/fd/0'",
                  BIN);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "[0]:got[]\n");
    DT_CHECK_CONTAINS(out, "[0]:/dev/null\n");
    free(out);
}

/* A worker stopped by a signal is reported; a stop then continues it so that SIGTERM acts at
 * once (not after the 1000 s grace). */
static void test_worker_stopped_warned(void)
{
    char cmd[8192], outp[4096];
    snprintf(outp, sizeof outp, "%s/agent.out", TMP);
    snprintf(cmd, sizeof cmd,
             "%s --stop-grace 1000 --log-dir %s -- sh -c 'kill -STOP $$; exec sleep 100'", BIN,
             TMP);
    pid_t agent = dt_test_spawn(cmd, outp);
    bool seen = dt_test_wait_text(outp, "was stopped by SIGSTOP", 1, 20);
    DT_CHECK(seen);
    kill(agent, SIGTERM);
    DT_CHECK_INT(dt_test_wait_exit(agent, 30), 128 + SIGTERM);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "kill -CONT");
    DT_CHECK(!strstr(out, "sending SIGKILL"));
    free(out);
}

/* A model over job.device_memory at zero = 0 fails within seconds with the out-of-memory message
 * (the request, the holdings, the layout, what to change), the workers exit 3 and no restart is
 * spent though --max-restarts=2 allows two: exactly one attempt; the agent names the root cause
 * (out of device memory, not a configuration error) and exits 3. */
static void test_oom_not_restarted(void)
{
    char job[4096], ev[4096], *out = NULL;
    snprintf(job, sizeof job, "%s/oom.ini", TMP);
    FILE *f = fopen(job, "w");
    DT_REQUIRE(f != NULL);
    fprintf(f, "[model]\ntype = gpt\npreset = gpt-tiny\n[data]\ntype = synthetic\n"
               "[train]\nsteps = 5\n[job]\ndevice = cpu\ndevice_memory = 256Ki\n");
    fclose(f);
    double t0 = dt_now_s();
    int rc = runf(&out, 90,
                  "%s --nproc-per-node 2 --max-restarts 2 --rdzv-id oom --log-dir %s %s "
                  "job.output_dir=%s/oom-out",
                  BIN, TMP, job, TMP);
    double took = dt_now_s() - t0;
    DT_CHECK_INT(rc, 3);
    DT_CHECK_MSG(took < 20, "took %.1f s", took);
    DT_CHECK_CONTAINS(out, "not restarting: the workers report out of device memory (exit 3)");
    DT_CHECK_CONTAINS(out, "(attempt 0; not restarted: out of device memory, the layout does not "
                           "fit)");
    DT_CHECK(!strstr(out, "configuration error"));
    DT_CHECK_CONTAINS(out, "cpu backend: out of device memory: asked for ");
    DT_CHECK_CONTAINS(out, "of params, holding ");
    DT_CHECK_CONTAINS(out, "of the 0.25 MiB budget (job.device_memory = 262144)");
    DT_CHECK_CONTAINS(out, "peak so far");
    DT_CHECK_CONTAINS(out, "Layout: D=2 T=1 P=1 zero=0 recompute=none micro_batches=1");
    DT_CHECK_CONTAINS(out, "To fit: parallel.zero=3");
    DT_CHECK_CONTAINS(out, "exit code  : 3");
    DT_CHECK(!strstr(out, "restarting every worker"));
    DT_CHECK(!strstr(out, "spent)"));
    free(out);
    snprintf(ev, sizeof ev, "%s/oom/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    DT_CHECK_INT(count_of(events, "\"event\":\"start\""), 2); /* two workers, one attempt */
    DT_CHECK(!strstr(events, "\"event\":\"restart\""));
    DT_CHECK_CONTAINS(events, "\"result\":\"failed\"");
    DT_CHECK_CONTAINS(events, "\"exit_code\":3");
    free(events);
}

/* After a forwarded SIGUSR1 (or SIGTERM) workers that exit 75 ("checkpoint saved") are a planned
 * stop: exit 75, no failure table, no restart spent. */
/* The built-in worker's configuration error (exit 2: here a checkpoint.resume path that does
 * not exist) is not restarted: every attempt would fail the same way. A command's exit 2 is
 * just a failure (restarted as torchrun does). */
static void test_config_error_not_restarted(void)
{
    char job[4096], ev[4096], *out = NULL;
    snprintf(job, sizeof job, "%s/cfgerr.ini", TMP);
    FILE *f = fopen(job, "w");
    DT_REQUIRE(f != NULL);
    fprintf(f, "[model]\ntype = mlp\n[data]\ntype = synthetic\n[train]\nsteps = 5\n");
    fclose(f);
    int rc = runf(&out, 90,
                  "%s --nproc-per-node 2 --max-restarts 2 --rdzv-id ce --log-dir %s %s "
                  "job.output_dir=%s/ce-out checkpoint.resume=%s/nonexistent/step_5",
                  BIN, TMP, job, TMP, TMP);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "not restarting: the workers report a configuration error");
    DT_CHECK_CONTAINS(out, "nonexistent/step_5: cannot read the checkpoint directory");
    DT_CHECK(!strstr(out, "restarting every worker"));
    /* the table's headline: nothing was spent */
    DT_CHECK_CONTAINS(out, "(attempt 0; not restarted: a configuration error)");
    DT_CHECK(!strstr(out, "spent)"));
    free(out);
    snprintf(ev, sizeof ev, "%s/ce/events.jsonl", TMP);
    char *events = dt_test_slurp(ev);
    DT_REQUIRE(events != NULL);
    DT_CHECK_INT(count_of(events, "\"event\":\"start\""), 2);
    DT_CHECK_CONTAINS(events, "\"result\":\"failed\",\"exit_code\":2");
    free(events);

    rc = runf(&out, 60, "%s --nproc-per-node 1 --max-restarts 1 -- sh -c 'exit 2'", BIN);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "restarting every worker");
    free(out);
}

static void test_preempted_exit_75(void)
{
    static const struct { int sig; const char *name; } cases[] = {{SIGUSR1, "USR1"},
                                                                  {SIGTERM, "TERM"}};
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        char outp[4096], trap[256], path[4096];
        snprintf(outp, sizeof outp, "%s/agent-%s.out", TMP, cases[i].name);
        snprintf(trap, sizeof trap, "trap \"echo saving-$RANK; exit 75\" %s", cases[i].name);
        for (int r = 0; r < 2; r++) {
            snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
            unlink(path);
        }
        pid_t agent = start_trapping_agent(trap, "--max-restarts 3 --stop-grace 60", outp);
        kill(agent, cases[i].sig);
        DT_CHECK_INT(dt_test_wait_exit(agent, 30), 75);
        char *out = dt_test_slurp(outp);
        DT_REQUIRE(out != NULL);
        DT_CHECK_CONTAINS(out, "[1]:saving-1\n");
        DT_CHECK_CONTAINS(out, "preempted: workers saved their checkpoints");
        DT_CHECK(!strstr(out, "Root cause") && !strstr(out, "the job failed"));
        DT_CHECK(!strstr(out, "restarting every worker"));
        free(out);
    }
}

/* The benchmark's own path (start, crash, restart) works end to end; its numbers are not
 * checked here. */
static void test_bench_launch_smoke(void)
{
    char *out = NULL;
    int rc = runf(&out, 60, "%s bench launch --nproc 1,3 --repeat 1", BIN);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "restart after crash (ms)");
    DT_CHECK(!strstr(out, "failed"));
    free(out);
}

static const dt_test tests[] = {
    {"redirect_specs", test_redirect_specs, 0},
    {"env_build", test_env_build, 0},
    {"events_filename", test_events_filename, 0},
    {"nproc_resolution", test_nproc_resolution, 0},
    {"output_lines", test_output_lines, 0},
    {"workenv_round_trip", test_workenv_round_trip, 0},
    {"worker_guard", test_worker_guard, 0},
    {"report_table", test_report_table, 0},
    {"env_sh", test_env_sh, 30},
    {"env_python", test_env_python, 60},
    {"exit1_table", test_exit1_table, 0},
    {"segfault", test_segfault, 0},
    {"error_file_message", test_error_file_message, 0},
    {"hang_is_stopped", test_hang_is_stopped, 60},
    {"ignore_sigterm", test_ignore_sigterm, 60},
    {"partial_lines", test_partial_lines, 0},
    {"lines_not_interleaved", test_lines_not_interleaved, 60},
    {"megabytes_no_newline", test_megabytes_no_newline, 60},
    {"restart_then_success", test_restart_then_success, 60},
    {"budget_exhausted", test_budget_exhausted, 60},
    {"redirects_and_tee", test_redirects_and_tee, 0},
    {"local_ranks_filter", test_local_ranks_filter, 0},
    {"redirects_tmp_dir_named", test_redirects_tmp_dir_named, 30},
    {"filtered_rank_to_files", test_filtered_rank_to_files, 30},
    {"standalone_nnodes", test_standalone_nnodes, 30},
    {"bad_command", test_bad_command, 0},
    {"nproc_cpu", test_nproc_cpu, 0},
    {"console_nobody_reads", test_console_nobody_reads, 60},
    {"console_stall_then_resume", test_console_stall_then_resume, 60},
    {"console_shared_pipe", test_console_shared_pipe, 30},
    {"sigkill_agent_no_orphans", test_sigkill_agent_no_orphans, 60},
    {"daemon_gone_after_job", test_daemon_gone_after_job, 60},
    {"daemon_gone_after_sigterm", test_daemon_gone_after_sigterm, 60},
    {"daemon_gone_after_sigkill", test_daemon_gone_after_sigkill, 60},
    {"ctrl_c_once", test_ctrl_c_once, 60},
    {"ctrl_c_twice", test_ctrl_c_twice, 60},
    {"sigterm_forwarded", test_sigterm_forwarded, 60},
    {"sigusr1_forwarded", test_sigusr1_forwarded, 60},
    {"hup_quit_usr2_forwarded", test_hup_quit_usr2_forwarded, 90},
    {"int_ignored_at_start", test_int_ignored_at_start, 60},
    {"nohup_keeps_hup_ignored", test_nohup_keeps_hup_ignored, 60},
    {"worker_stdin_devnull", test_worker_stdin_devnull, 30},
    {"worker_stopped_warned", test_worker_stopped_warned, 60},
    {"preempted_exit_75", test_preempted_exit_75, 90},
    {"config_error_not_restarted", test_config_error_not_restarted, 120},
    {"oom_not_restarted", test_oom_not_restarted, 120},
    {"bench_launch_smoke", test_bench_launch_smoke, 60},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_agent", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
