/* harness.c - fork-per-test runner with timeouts; see harness.h. */
#include "tests/harness.h"

#include "cmd/blas_boot.h"

#include "rendezvous/store_server.h"
#include "runtime/launch/agent_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SKIP_CODE 77

static int failures;
static char tmpdir[PATH_MAX];

void dt_test_fail_at(const char *file, int line, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fflush(stderr);
    fprintf(stdout, "    FAIL %s:%d: %s\n", file, line, buf);
    fflush(stdout);
    failures++;
}

void dt_test_stop(void)
{
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}

void dt_test_skip(const char *why)
{
    fprintf(stdout, "    SKIP: %s\n", why);
    fflush(stdout);
    _exit(SKIP_CODE);
}

static char self_dir[PATH_MAX];

const char *dt_test_dtrain_bin(void)
{
    static char path[PATH_MAX + 16];
    const char *env = getenv("DTRAIN_BIN");
    if (env && *env)
        return env;
    if (!path[0])
        snprintf(path, sizeof path, "%s/../dtrain", self_dir); /* build/tests/.. = build */
    return path;
}

const char *dt_test_self_dir(void) { return self_dir; }

const char *dt_test_tmpdir(void)
{
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/dtrain-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            _exit(1);
        }
    }
    return tmpdir;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double dt_test_now(void) { return now_s(); }

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

char *dt_test_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (size_t n; buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += n;
        if (cap - len < 4096) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

pid_t dt_test_spawn(const char *cmd, const char *outpath)
{
    pid_t pid = fork();
    if (pid < 0) {
        dt_test_fail_at(__FILE__, __LINE__, "fork: %s", strerror(errno));
        dt_test_stop();
    }
    if (pid == 0) {
        int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        size_t n = strlen(cmd) + 8;
        char *full = malloc(n);
        if (!full)
            _exit(126);
        snprintf(full, n, "exec %s", cmd);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}

int dt_test_wait_exit(pid_t pid, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 && errno != EINTR)
            return -1;
        if (now_s() > deadline) {
            kill(pid, SIGCONT);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        sleep_ms(10);
    }
}

int dt_test_count_text(const char *path, const char *needle)
{
    char *s = dt_test_slurp(path);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(s);
    return n;
}

bool dt_test_wait_text(const char *path, const char *needle, int times, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    while (dt_test_count_text(path, needle) < times) {
        if (now_s() > deadline)
            return false;
        sleep_ms(20);
    }
    return true;
}

void dt_test_group_init(dt_test_group *g)
{
    static int ids;
    memset(g, 0, sizeof *g);
    g->id = ids++;
}

void dt_test_group_spawn(dt_test_group *g, int k, const char *cmd, const char *outpath)
{
    if (k < 0 || k >= DT_TEST_GROUP_MAX) {
        dt_test_fail_at(__FILE__, __LINE__, "process %d: a group holds %d", k, DT_TEST_GROUP_MAX);
        dt_test_stop();
    }
    if (g->out[k] != outpath)
        snprintf(g->out[k], sizeof g->out[k], "%s", outpath);
    g->pid[k] = dt_test_spawn(cmd, g->out[k]);
    g->done[k] = false;
    if (k >= g->n)
        g->n = k + 1;
}

void dt_test_group_wait(dt_test_group *g, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (int k = 0; k < g->n; k++) {
        if (g->done[k])
            continue;
        double left = deadline - now_s();
        g->code[k] = dt_test_wait_exit(g->pid[k], left > 0.1 ? left : 0.1);
        g->done[k] = true;
    }
}

void dt_test_group_kill(dt_test_group *g)
{
    for (int k = 0; k < g->n; k++)
        if (!g->done[k] && g->pid[k] > 0) {
            kill(g->pid[k], SIGCONT);
            kill(g->pid[k], SIGKILL);
            waitpid(g->pid[k], NULL, 0);
            g->done[k] = true;
        }
    dt_test_store_stop(g->store);
    g->store = 0;
}

void dt_test_group_dump(const dt_test_group *g)
{
    for (int k = 0; k < g->n; k++) {
        char *o = dt_test_slurp(g->out[k]);
        fprintf(stderr, "---- process %d (%s) ----\n%s\n", k, g->out[k], o ? o : "(none)");
        free(o);
    }
}

int dt_test_read_port(const char *path, const char *needle, double timeout_s)
{
    int port = 0;
    if (dt_test_wait_text(path, needle, 1, timeout_s)) {
        char *s = dt_test_slurp(path);
        const char *p = s ? strstr(s, needle) : NULL;
        port = p ? atoi(p + strlen(needle)) : 0;
        free(s);
    }
    if (port <= 0) {
        dt_test_fail_at(__FILE__, __LINE__, "%s does not say \"%s<port>\" within %.0f s", path,
                        needle, timeout_s);
        dt_test_stop();
    }
    return port;
}

pid_t dt_test_store_start(int *port)
{
    int pfd[2];
    if (pipe(pfd) != 0) {
        dt_test_fail_at(__FILE__, __LINE__, "pipe: %s", strerror(errno));
        dt_test_stop();
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dt_store_server_opts so;
        dt_store_server_opts_default(&so);
        so.host = "127.0.0.1";
        so.port = 0;
        dt_store_server *srv = NULL;
        dt_err err = {0};
        int p = -1;
        if (dt_store_server_start(&srv, &so, &err) != 0)
            fprintf(stderr, "store server: %s\n", err.msg);
        else
            p = dt_store_server_port(srv);
        if (write(pfd[1], &p, sizeof p) != (ssize_t)sizeof p || p < 0)
            _exit(1);
        close(pfd[1]);
        for (;;)
            pause(); /* until dt_test_store_stop's SIGKILL */
    }
    close(pfd[1]);
    int p = -1;
    ssize_t n = pid > 0 ? read(pfd[0], &p, sizeof p) : -1;
    close(pfd[0]);
    if (n != (ssize_t)sizeof p || p <= 0) {
        if (pid > 0)
            dt_test_store_stop(pid);
        dt_test_fail_at(__FILE__, __LINE__, "could not start a store server process");
        dt_test_stop();
    }
    *port = p;
    return pid;
}

void dt_test_store_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

bool dt_test_pid_gone(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

double dt_test_timeout_scale(void)
{
    const char *s = getenv("DT_TEST_TIMEOUT_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}

int dt_test_run(const char *cmd, char **output, int timeout_s)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    close(pfd[1]);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    double deadline = now_s() + timeout_s * dt_test_timeout_scale();
    int timed_out = 0;
    for (;;) {
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {pfd[0], POLLIN, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        if (len + 4096 + 1 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t n = read(pfd[0], buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(pfd[0]);
    if (timed_out)
        kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    buf[len] = '\0';
    if (output)
        *output = buf;
    else
        free(buf);
    if (timed_out)
        return -1;
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}

/* ---- running one test --------------------------------------------------------------------
 * Each test runs in a forked child, in its own process group, with its stdout and stderr in a
 * file that is shown only when the test fails (or with -v / DT_TEST_VERBOSE=1). The runner is
 * the subreaper of everything a test starts: whatever a test left behind, in any process group or
 * session, is still its descendant, and is killed when the test ends, passes or not, and when it
 * runs out of time (a test whose own wait equals its time limit would otherwise leave the
 * processes it waits for running). */

static bool verbose;

/* SIGKILLs every descendant of this process (the test's whole tree: its process group, other
 * groups, daemons re-parented to us) until none is left, reaping them; bounded to ~10 s. */
static void kill_tree(void)
{
    for (int pass = 0; pass < 1000; pass++) {
        pid_t *d = NULL;
        int n = dt_proc_descendants(getpid(), &d);
        for (int i = 0; i < n; i++) {
            kill(d[i], SIGCONT);
            kill(d[i], SIGKILL);
        }
        free(d);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (n <= 0)
            return;
        sleep_ms(10);
    }
    fprintf(stdout, "    (processes of the test survived SIGKILL for 10 s)\n");
}

/* The captured output (fd, read from the start), malloc'd; "" when empty. */
static char *read_capture(int fd)
{
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0)
        size = 0;
    char *buf = malloc((size_t)size + 1);
    if (!buf)
        return NULL;
    size_t len = 0;
    while (len < (size_t)size) {
        ssize_t r = pread(fd, buf + len, (size_t)size - len, (off_t)len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    return buf;
}

/* Prints the last max_lines lines of text, indented, saying how much came before. */
static void print_tail(const char *text, int max_lines)
{
    size_t len = strlen(text);
    if (len == 0) {
        fprintf(stdout, "    (no output)\n");
        return;
    }
    const char *start = text + len;
    int lines = 0;
    if (start > text && start[-1] == '\n')
        start--;
    while (start > text && lines < max_lines) {
        start--;
        if (*start == '\n')
            lines++;
    }
    if (*start == '\n')
        start++;
    if (start > text) {
        int before = 0;
        for (const char *p = text; p < start; p++)
            before += *p == '\n';
        fprintf(stdout, "    ... (%d earlier lines not shown; run the binary with -v)\n", before);
    }
    for (const char *p = start; *p;) {
        const char *nl = strchr(p, '\n');
        size_t k = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(stdout, "    | %.*s\n", (int)k, p);
        p += k + (nl ? 1 : 0);
    }
}

/* Runs t; returns 0 (passed), SKIP_CODE or 1. *why gets a skip's reason or what ended a test
 * that failed outside its checks; *out (malloc'd, NULL with -v) what it wrote. */
/* Commands the running test asked for at its end (dt_test_at_end): a file the runner names per
 * test, appended to by the test, run by the runner after the test's processes are gone. */
static char at_end_path[PATH_MAX];

void dt_test_at_end(const char *cmd)
{
    FILE *f = at_end_path[0] ? fopen(at_end_path, "ae") : NULL;
    if (!f) {
        fprintf(stderr, "    (dt_test_at_end: no place to note \"%s\")\n", cmd);
        return;
    }
    fprintf(f, "%s\n", cmd);
    fclose(f);
}

static void run_at_end(void)
{
    FILE *f = fopen(at_end_path, "re");
    if (f) {
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            if (line[0] && system(line) != 0)
                fprintf(stdout, "    (at the end: \"%s\" failed)\n", line);
        }
        fclose(f);
    }
    unlink(at_end_path);
}

static int run_one(const dt_test *t, char *why, size_t why_cap, char **out)
{
    *out = NULL;
    double limit = (t->timeout_s > 0 ? t->timeout_s : 30) * dt_test_timeout_scale();
    char cap_path[PATH_MAX];
    const char *base = getenv("TMPDIR");
    snprintf(cap_path, sizeof cap_path, "%s/dtrain-test-out-XXXXXX", base && *base ? base : "/tmp");
    int cfd = mkostemp(cap_path, O_APPEND | O_CLOEXEC);
    if (cfd < 0) {
        perror("mkostemp");
        return 1;
    }
    unlink(cap_path); /* the open descriptor is all we need */
    snprintf(at_end_path, sizeof at_end_path, "%s/dtrain-test-end-%d", base && *base ? base : "/tmp",
             (int)getpid());
    unlink(at_end_path);
    why[0] = '\0';
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        close(cfd);
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        if (!verbose) {
            dup2(cfd, STDOUT_FILENO);
            dup2(cfd, STDERR_FILENO);
        }
        close(cfd);
        failures = 0;
        tmpdir[0] = '\0';
        t->fn();
        fflush(stdout);
        fflush(stderr);
        if (failures == 0 && tmpdir[0]) {
            char cmd[PATH_MAX + 32];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
            if (system(cmd) != 0)
                fprintf(stderr, "    (could not remove %s)\n", tmpdir);
        }
        _exit(failures ? 1 : 0);
    }
    setpgid(pid, pid);
    double deadline = now_s() + limit;
    int status = 0, rc = -1;
    bool timed_out = false;
    for (;;) {
        int st;
        pid_t r = waitpid(-1, &st, WNOHANG); /* also reaps what the test orphaned */
        if (r == pid) {
            status = st;
            break;
        }
        if (r < 0 && errno != EINTR && errno != ECHILD) {
            perror("waitpid");
            rc = 1;
            break;
        }
        if (r > 0)
            continue;
        if (now_s() > deadline) {
            timed_out = true;
            break;
        }
        sleep_ms(5);
    }
    kill(-pid, SIGKILL);
    kill_tree(); /* the test's whole tree: helpers it left behind, other groups, daemons */
    run_at_end();
    *out = verbose ? NULL : read_capture(cfd);
    close(cfd);
    if (timed_out) {
        snprintf(why, why_cap, "timed out after %.0f s (every process it started was killed); "
                               "what it wrote last:", limit);
        return 1;
    }
    if (rc >= 0)
        return rc;
    if (WIFSIGNALED(status)) {
        snprintf(why, why_cap, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
        return 1;
    }
    if (WEXITSTATUS(status) == SKIP_CODE) {
        const char *sk = *out ? strstr(*out, "    SKIP: ") : NULL;
        if (sk) {
            sk += strlen("    SKIP: ");
            snprintf(why, why_cap, "%.*s", (int)strcspn(sk, "\n"), sk);
        }
        return SKIP_CODE;
    }
    return WEXITSTATUS(status) ? 1 : 0;
}

static int selected(const char *name, int argc, char **argv)
{
    int any = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        any = 1;
        if (strstr(name, argv[i]))
            return 1;
    }
    return !any;
}

int dt_test_main(const char *suite, const dt_test *tests, int n, int argc, char **argv)
{
    /* The OpenBLAS kernel (cmd/blas_boot.h), as dtrain's own subcommands: this binary may be
     * started as its probe helper, and re-executes itself once with the kernel dtrain chose
     * when OpenBLAS picked one far below the CPU. */
    int blas_rc = dt_blas_boot(argc, argv, true);
    if (blas_rc >= 0)
        return blas_rc;
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(self_dir, sizeof self_dir, "%s", exe);
    } else {
        snprintf(self_dir, sizeof self_dir, "build/tests");
    }
    const char *v = getenv("DT_TEST_VERBOSE");
    verbose = v && *v && strcmp(v, "0");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-l")) {
            for (int j = 0; j < n; j++)
                printf("%s\n", tests[j].name);
            return 0;
        }
        if (!strcmp(argv[i], "-v"))
            verbose = true;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Committed backend memory reads as NaN in every test (and in the dtrain processes tests
     * start): a strategy that reads what it did not write fails here, not silently on a GPU. */
    setenv("DTRAIN_CPU_MEM_POISON", "1", 0);
    /* What a test orphans is re-parented here, not to init: kill_tree finds all of it. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        perror("prctl(PR_SET_CHILD_SUBREAPER)");
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n; i++) {
        if (!selected(tests[i].name, argc, argv))
            continue;
        double t0 = now_s();
        char why[256];
        char *out = NULL;
        int rc = run_one(&tests[i], why, sizeof why, &out);
        double dt = now_s() - t0;
        if (rc == 0) {
            passed++;
            printf("  ok   %-44s %6.2fs\n", tests[i].name, dt);
        } else if (rc == SKIP_CODE) {
            skipped++;
            printf("  skip %-44s %s\n", tests[i].name, why);
        } else {
            failed++;
            printf("  FAIL %-44s %6.2fs\n", tests[i].name, dt);
            if (why[0])
                printf("    FAIL: %s\n", why);
            if (out)
                print_tail(out, why[0] ? 40 : 200);
        }
        free(out);
        fflush(stdout);
    }
    printf("%s: %d passed, %d failed, %d skipped\n", suite, passed, failed, skipped);
    return failed ? 1 : 0;
}

int dt_test_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -EIO;
}
