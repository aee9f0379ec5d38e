/* bench_launch.c - `dtrain bench launch`: how long the launcher takes to get N workers running,
 * and to get N workers of the next attempt running after one of them crashed.
 *
 * For each N the benchmark starts a real agent (`dtrain --standalone --nproc-per-node N
 * --max-restarts 1 -- WORKER`), whose trivial workers announce themselves on a FIFO the
 * benchmark reads ("attempt rank pid"). Start time: from just before the agent is forked until
 * the N-th worker of attempt 0 announced itself. Restart time: from the SIGKILL the benchmark
 * sends to one worker of attempt 0 until the N-th worker of attempt 1 announced itself (the
 * agent notices the death, stops the N-1 others with SIGTERM, re-rendezvous, starts N new ones).
 * Workers of attempt 1 exit 0 at once, so the agent ends with 0.
 *
 * WORKER is `sh` (a shell that writes one line) or `dtrain` (the dtrain binary itself, in a
 * hidden child mode, as job-file workers are: it pays dtrain's own start-up, OpenBLAS included).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/util.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench launch [--nproc N[,N...]] [--repeat R] [--worker sh|dtrain]\n"
            "\n"
            "Time from start until every worker runs, and from a worker's crash until every\n"
            "worker of the next attempt runs, for trivial workers on this node.\n"
            "\n"
            "  --nproc LIST     workers per run (default 1,2,4,8,16)\n"
            "  --repeat R       runs per size; the median is reported (default 5)\n"
            "  --worker W       sh (a shell script) or dtrain (the dtrain binary) (default sh)\n");
}

/* The hidden worker mode: announce, then wait to be killed (attempt 0) or exit 0. */
static int child_main(const char *fifo)
{
    const char *a = getenv("DTRAIN_ATTEMPT"), *r = getenv("RANK");
    char line[96];
    int n = snprintf(line, sizeof line, "%s %s %d\n", a ? a : "?", r ? r : "?", (int)getpid());
    int fd = open(fifo, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || dt_write_all(fd, line, (size_t)n) != 0)
        return 1;
    close(fd);
    if (a && !strcmp(a, "0"))
        for (;;)
            pause();
    return 0;
}

typedef struct run_result {
    double start_s, restart_s;
} run_result;

/* Reads announcements until `want` lines of `attempt` arrived (or timeout). Returns 0 and, for
 * attempt 0, the pid of the highest rank in *victim. */
static int collect(int fd, char *buf, size_t *have, size_t cap, int attempt, int want,
                   double timeout_s, pid_t *victim)
{
    int got = 0, best_rank = -1;
    double deadline = dt_now_s() + timeout_s;
    for (;;) {
        char *nl;
        while ((nl = memchr(buf, '\n', *have))) {
            *nl = '\0';
            int a = -1, r = -1, pid = 0;
            if (sscanf(buf, "%d %d %d", &a, &r, &pid) == 3 && a == attempt) {
                got++;
                if (victim && r > best_rank) {
                    best_rank = r;
                    *victim = pid;
                }
            }
            size_t used = (size_t)(nl - buf) + 1;
            memmove(buf, nl + 1, *have - used);
            *have -= used;
        }
        if (got >= want)
            return 0;
        int ms = (int)((deadline - dt_now_s()) * 1000);
        if (ms <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR)
            return -errno;
        if (rc > 0) {
            ssize_t k = read(fd, buf + *have, cap - *have);
            if (k > 0)
                *have += (size_t)k;
        }
    }
}

static int one_run(int nproc, const char *worker, const char *dir, run_result *res)
{
    char fifo[1024], logp[1024], np[16], cmd[2048];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(logp, sizeof logp, "%s/agent.log", dir);
    snprintf(np, sizeof np, "%d", nproc);
    unlink(fifo);
    if (mkfifo(fifo, 0600) != 0) {
        perror("mkfifo");
        return -1;
    }
    /* Our own write end keeps the FIFO from reporting end of file between workers. */
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    int wfd = open(fifo, O_WRONLY | O_CLOEXEC);
    if (rfd < 0 || wfd < 0) {
        perror("open fifo");
        return -1;
    }
    const char *self = dt_cmd_self_path();
    if (!strcmp(worker, "dtrain"))
        snprintf(cmd, sizeof cmd, "%s", self);
    else
        snprintf(cmd, sizeof cmd,
                 "echo \"$DTRAIN_ATTEMPT $RANK $$\" > %s; [ \"$DTRAIN_ATTEMPT\" = 0 ] && exec sleep 1000; "
                 "exit 0",
                 fifo);
    double t0 = dt_now_s();
    pid_t agent = fork();
    if (agent < 0) {
        perror("fork");
        return -1;
    }
    if (agent == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setenv("DTRAIN_LOG", "warn", 1);
        if (!strcmp(worker, "dtrain"))
            execl(self, self, "--standalone", "--nproc-per-node", np, "--max-restarts", "1",
                  "--stop-grace", "5", "--log-dir", dir, "--", self, "bench", "launch", "--child",
                  fifo, (char *)NULL);
        else
            execl(self, self, "--standalone", "--nproc-per-node", np, "--max-restarts", "1",
                  "--stop-grace", "5", "--log-dir", dir, "--", "/bin/sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char buf[65536];
    size_t have = 0;
    pid_t victim = 0;
    int rc = collect(rfd, buf, &have, sizeof buf, 0, nproc, 60, &victim);
    double t1 = dt_now_s();
    if (rc == 0 && victim > 0) {
        res->start_s = t1 - t0;
        double tc = dt_now_s();
        kill(victim, SIGKILL);
        rc = collect(rfd, buf, &have, sizeof buf, 1, nproc, 60, NULL);
        res->restart_s = dt_now_s() - tc;
    }
    int st = 0;
    if (rc != 0)
        kill(agent, SIGKILL);
    while (waitpid(agent, &st, 0) < 0 && errno == EINTR)
        ;
    close(rfd);
    close(wfd);
    unlink(fifo);
    if (rc != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "dtrain bench launch: run with %d workers failed (%s); agent log: %s\n",
                nproc, rc ? strerror(-rc) : "agent exit status", logp);
        return -1;
    }
    return 0;
}

int dt_bench_launch(int argc, char **argv)
{
    char sizes[256] = "1,2,4,8,16";
    int repeat = 5;
    const char *worker = "sh";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--child") && v) {
            return child_main(v);
        } else if (!strcmp(a, "--nproc") && v) {
            dt_strlcpy(sizes, v, sizeof sizes);
            i++;
        } else if (!strcmp(a, "--repeat") && v && dt_parse_int(v, &repeat) == 0 && repeat > 0) {
            i++;
        } else if (!strcmp(a, "--worker") && v && (!strcmp(v, "sh") || !strcmp(v, "dtrain"))) {
            worker = v;
            i++;
        } else {
            fprintf(stderr, "dtrain bench launch: bad argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    const char *tmp = getenv("TMPDIR");
    char dirbuf[1024];
    snprintf(dirbuf, sizeof dirbuf, "%s/dtrain-bench-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dirbuf)) {
        perror("mkdtemp");
        return 1;
    }
    printf("dtrain bench launch: %s workers, %d runs per size (median, min-max)\n", worker, repeat);
    printf("%6s  %24s  %24s\n", "nproc", "start: all running (ms)", "restart after crash (ms)");
    int code = 0;
    char list[256], *save = NULL;
    dt_strlcpy(list, sizes, sizeof list);
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int n;
        if (dt_parse_int(tok, &n) || n < 1 || n > 4096) {
            fprintf(stderr, "dtrain bench launch: bad --nproc value \"%s\"\n", tok);
            code = 2;
            break;
        }
        double *st = calloc((size_t)repeat, sizeof *st), *rs = calloc((size_t)repeat, sizeof *rs);
        int ok = 0;
        for (int k = 0; k < repeat; k++) {
            run_result r;
            if (one_run(n, worker, dirbuf, &r) == 0) {
                st[ok] = r.start_s * 1e3;
                rs[ok] = r.restart_s * 1e3;
                ok++;
            }
        }
        if (ok == 0) {
            printf("%6d  %24s  %24s\n", n, "failed", "failed");
            code = 1;
        } else {
            qsort(st, (size_t)ok, sizeof *st, dt_cmp_double);
            qsort(rs, (size_t)ok, sizeof *rs, dt_cmp_double);
            char a[64], b[64];
            snprintf(a, sizeof a, "%.1f (%.1f-%.1f)", st[ok / 2], st[0], st[ok - 1]);
            snprintf(b, sizeof b, "%.1f (%.1f-%.1f)", rs[ok / 2], rs[0], rs[ok - 1]);
            printf("%6d  %24s  %24s\n", n, a, b);
        }
        fflush(stdout);
        free(st);
        free(rs);
    }
    dt_rm_rf(dirbuf, NULL);
    return code;
}
