/* harness.h - the test runner every unit-test binary uses.
 *
 * A test binary is a table of tests. dt_test_main runs each one in its own forked process (and
 * process group) with a timeout, so a crash or a hang fails that test only and can never stall
 * CI. It ends with one summary line:
 *
 *     test_store: 12 passed, 0 failed, 1 skipped
 *
 * and exits non-zero when anything failed. Arguments: test names (or substrings) to run only
 * those; -l lists them. DT_TEST_TIMEOUT_SCALE (e.g. 4 under sanitizers) multiplies timeouts.
 *
 * Inside a test: DT_CHECK* record a failure and carry on; DT_REQUIRE* stop the test;
 * DT_SKIP("why") ends it as skipped (shown in the summary with the reason).
 */
#ifndef DT_TEST_HARNESS_H
#define DT_TEST_HARNESS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef struct dt_test {
    const char *name;
    void (*fn)(void);
    int timeout_s; /* 0 = 30 s */
} dt_test;

int dt_test_main(const char *suite, const dt_test *tests, int n, int argc, char **argv);

void dt_test_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dt_test_skip(const char *why) __attribute__((noreturn));
void dt_test_stop(void) __attribute__((noreturn));
/* Path of build/dtrain (DTRAIN_BIN, else derived from the test binary's location). */
const char *dt_test_dtrain_bin(void);
/* The directory of the running test binary (build/tests), where the test stand-ins are. */
const char *dt_test_self_dir(void);
/* A fresh temporary directory for this test (removed when the test ends if it passed). */
const char *dt_test_tmpdir(void);
/* Has the runner run the shell command cmd when this test has ended and every process it started
 * is gone (killed with it, daemons and watchers too), passed, failed or timed out: for what lives
 * outside the process tree, such as namespaces (tests/cluster.c). Output goes where the test's
 * went; a failure is noted, not counted. */
void dt_test_at_end(const char *cmd);
/* Writes text to path (created or truncated); 0, or -errno. */
int dt_test_write_file(const char *path, const char *text);

#define DT_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            dt_test_fail_at(__FILE__, __LINE__, "check failed: %s", #cond);                       \
    } while (0)

#define DT_CHECK_MSG(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond))                                                                               \
            dt_test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                      \
    } while (0)

#define DT_CHECK_INT(a, b)                                                                         \
    do {                                                                                           \
        long long dt_a_ = (long long)(a), dt_b_ = (long long)(b);                                  \
        if (dt_a_ != dt_b_)                                                                        \
            dt_test_fail_at(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, dt_a_, dt_b_);  \
    } while (0)

#define DT_CHECK_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *dt_a_ = (a), *dt_b_ = (b);                                                     \
        if (!dt_a_ || !dt_b_ || strcmp(dt_a_, dt_b_) != 0)                                         \
            dt_test_fail_at(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,              \
                            dt_a_ ? dt_a_ : "(null)", dt_b_ ? dt_b_ : "(null)");                   \
    } while (0)

#define DT_CHECK_CONTAINS(hay, needle)                                                             \
    do {                                                                                           \
        const char *dt_h_ = (hay), *dt_n_ = (needle);                                              \
        if (!dt_h_ || !strstr(dt_h_, dt_n_))                                                       \
            dt_test_fail_at(__FILE__, __LINE__, "%s does not contain \"%s\": \"%.400s\"", #hay,    \
                            dt_n_, dt_h_ ? dt_h_ : "(null)");                                      \
    } while (0)

#define DT_CHECK_NEAR(a, b, tol)                                                                   \
    do {                                                                                           \
        double dt_a_ = (double)(a), dt_b_ = (double)(b), dt_t_ = (double)(tol);                    \
        if (!(fabs(dt_a_ - dt_b_) <= dt_t_))                                                       \
            dt_test_fail_at(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %.3g)", #a, #b, dt_a_, \
                            dt_b_, dt_t_);                                                         \
    } while (0)

#define DT_REQUIRE(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dt_test_fail_at(__FILE__, __LINE__, "requirement failed: %s", #cond);                 \
            dt_test_stop();                                                                        \
        }                                                                                          \
    } while (0)

#define DT_REQUIRE_OK(expr, errp)                                                                  \
    do {                                                                                           \
        int dt_rc_ = (expr);                                                                       \
        if (dt_rc_ != 0) {                                                                         \
            dt_test_fail_at(__FILE__, __LINE__, "%s returned %d: %s", #expr, dt_rc_,               \
                            (errp)->msg);                                                          \
            dt_test_stop();                                                                        \
        }                                                                                          \
    } while (0)

#define DT_SKIP(why) dt_test_skip(why)

/* ---- for tests that run processes and read their output files ---- */

/* CLOCK_MONOTONIC in seconds. */
double dt_test_now(void);
/* DT_TEST_TIMEOUT_SCALE (sanitizers, a loaded machine; 1 when unset): every test's time limit is
 * multiplied by it, and so should the waits inside a test be. */
double dt_test_timeout_scale(void);
/* The whole file as a malloc'd string, or NULL when it cannot be read. */
char *dt_test_slurp(const char *path);
/* Starts `sh -c "exec CMD"` in the background with stdout and stderr to outpath (truncated);
 * returns its pid. The caller waits for it (dt_test_wait_exit). */
pid_t dt_test_spawn(const char *cmd, const char *outpath);
/* Exit code (128+N for signal N) of pid, or -1 after timeout_s, when it is continued and
 * SIGKILLed (and reaped). */
int dt_test_wait_exit(pid_t pid, double timeout_s);
/* Occurrences of needle in the file (0 when it cannot be read). */
int dt_test_count_text(const char *path, const char *needle);
/* Waits until the file holds needle at least `times` times; false after timeout_s. */
bool dt_test_wait_text(const char *path, const char *needle, int times, double timeout_s);
/* True when the process does not exist or is a zombie nobody reaped yet. */
bool dt_test_pid_gone(pid_t pid);

/* Runs a store server (rendezvous/store.h) on 127.0.0.1, port 0, in a forked child process and
 * returns its pid; *port gets the port. Tests that fork rank processes use it rather than an
 * in-process server: a child forked while the server's thread holds a lock (ASan's allocator,
 * for one) would deadlock. Stop it with dt_test_store_stop. */
pid_t dt_test_store_start(int *port);
void dt_test_store_stop(pid_t pid);

/* ---- a group of background processes (launcher agents) and the store they meet at ----
 * What a test leaves running when it fails is killed with the test's process group. */

#define DT_TEST_GROUP_MAX 8
typedef struct dt_test_group {
    int id;                             /* numbers the groups of a test binary (file names) */
    int n;                              /* processes started: 0 .. n-1 */
    pid_t pid[DT_TEST_GROUP_MAX];
    char out[DT_TEST_GROUP_MAX][1024];  /* each one's stdout and stderr */
    bool done[DT_TEST_GROUP_MAX];       /* waited for: code[k] is its exit code */
    int code[DT_TEST_GROUP_MAX];
    pid_t store;                        /* a store process the test started, or 0 */
    int port;
} dt_test_group;

/* Empties g and gives it the next id. */
void dt_test_group_init(dt_test_group *g);
/* Starts process k (dt_test_spawn) writing to outpath, which g->out[k] keeps; n covers k. */
void dt_test_group_spawn(dt_test_group *g, int k, const char *cmd, const char *outpath);
/* Waits for every process not waited for yet, all within timeout_s (dt_test_wait_exit). */
void dt_test_group_wait(dt_test_group *g, double timeout_s);
/* Kills what still runs (continued first, in case the test stopped it) and the store, and reaps
 * them. */
void dt_test_group_kill(dt_test_group *g);
/* Every process's output on stderr (after a failed check). */
void dt_test_group_dump(const dt_test_group *g);
/* Waits until the file says "<needle><port>" and returns the port (fails the test after
 * timeout_s): the port an agent or store that bound port 0 prints. */
int dt_test_read_port(const char *path, const char *needle, double timeout_s);

/* Runs a shell command, captures stdout+stderr (malloc'd, caller frees) and returns the exit
 * status as the shell reports it (128+n for signal n), or -1 when it could not start or ran
 * longer than timeout_s (then it is killed). */
int dt_test_run(const char *cmd, char **output, int timeout_s);

#endif
