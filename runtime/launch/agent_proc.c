/* agent_proc.c - see agent_proc.h. */
#include "runtime/launch/agent_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

/* ---- exec ------------------------------------------------------------------------------- */

static bool is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int dt_proc_resolve(const char *prog, const char *path_env, char *out, size_t cap, dt_err *err)
{
    if (!prog || !*prog)
        return dt_err_set(err, -EINVAL, "empty command: give the program to run after --");
    if (strchr(prog, '/')) {
        if (!is_executable(prog)) {
            int e = access(prog, F_OK) == 0 ? EACCES : ENOENT;
            return dt_err_set(err, -e, "cannot run \"%s\": %s", prog,
                              e == EACCES ? "not an executable file (check its mode with ls -l)"
                                          : "no such file");
        }
        if (!dt_strlcpy(out, prog, cap))
            return dt_err_set(err, -ENAMETOOLONG, "cannot run \"%s\": path too long", prog);
        return 0;
    }
    const char *path = path_env ? path_env : getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        char cand[4096];
        int n = len ? snprintf(cand, sizeof cand, "%.*s/%s", (int)len, p, prog)
                    : snprintf(cand, sizeof cand, "./%s", prog);
        if (n > 0 && (size_t)n < sizeof cand && is_executable(cand)) {
            if (!dt_strlcpy(out, cand, cap))
                return dt_err_set(err, -ENAMETOOLONG, "cannot run \"%s\": path too long", cand);
            return 0;
        }
        if (!colon)
            break;
        p = colon + 1;
    }
    return dt_err_set(err, -ENOENT, "cannot run \"%s\": not found in PATH (%s)", prog, path);
}

int dt_proc_spawn(const dt_proc_spec *s, pid_t *out, dt_err *err)
{
    int ep[2];
    if (pipe2(ep, O_CLOEXEC) != 0)
        return dt_err_errno(err, errno, "cannot start %s: pipe", s->path);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(ep[0]);
        close(ep[1]);
        return dt_err_errno(err, e, "cannot start %s: fork", s->path);
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only until exec (the agent may have threads). */
        close(ep[0]);
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the agent died before prctl took effect */
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Dispositions: caught ones reset themselves at exec, ignored ones do not. An agent
         * started with & from a script has INT and QUIT ignored; its workers must not, or a
         * forwarded Ctrl-C does nothing and the stop waits for the SIGKILL after the grace. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        static const int reset[] = {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2};
        for (size_t i = 0; i < DT_ARRAY_LEN(reset); i++)
            sigaction(reset[i], &dfl, NULL);
        if (!s->keep_hup_ignored)
            sigaction(SIGHUP, &dfl, NULL);
        /* stdin is /dev/null: a worker in its own process group that read the terminal would
         * be stopped by SIGTTIN, and the agent would wait for it forever. */
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0 && in != STDIN_FILENO) {
            dup2(in, STDIN_FILENO);
            close(in);
        }
        if (s->fd_out >= 0 && s->fd_out != STDOUT_FILENO)
            dup2(s->fd_out, STDOUT_FILENO);
        if (s->fd_err >= 0 && s->fd_err != STDERR_FILENO)
            dup2(s->fd_err, STDERR_FILENO);
        execve(s->path, s->argv, s->envp);
        int e = errno;
        ssize_t w = write(ep[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(ep[1]);
    /* Also from the parent, so that the group exists before we ever signal it. EACCES means the
     * child already exec'd (and did it itself). */
    if (setpgid(pid, pid) != 0 && errno != EACCES && errno != ESRCH)
        DT_DEBUG("setpgid(%d): %s", (int)pid, strerror(errno));
    int e = 0;
    ssize_t n;
    do
        n = read(ep[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(ep[0]);
    if (n == (ssize_t)sizeof e) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        return dt_err_errno(err, e, "cannot execute %s", s->path);
    }
    *out = pid;
    return 0;
}

int dt_proc_kill_group(pid_t pgid, int sig)
{
    if (pgid <= 1)
        return -ESRCH;
    if (kill(-pgid, sig) == 0)
        return 0;
    return errno == EPERM ? 0 : -errno;
}

bool dt_proc_group_alive(pid_t pgid)
{
    if (pgid <= 1)
        return false;
    return kill(-pgid, 0) == 0 || errno == EPERM;
}

int dt_proc_become_subreaper(dt_err *err)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return dt_err_errno(err, errno, "prctl(PR_SET_CHILD_SUBREAPER)");
    return 0;
}

/* ---- guardian --------------------------------------------------------------------------- */

struct dt_guard {
    pid_t pid;
    int wfd;     /* write end; the only copy outside the guardian's read end (close-on-exec) */
    bool reaped;
};

/* The guardian's whole life. Messages are int32: +pgid to watch, -pgid to forget. */
static void __attribute__((noreturn)) guard_main(int rfd)
{
    setpgid(0, 0); /* out of the agent's group: a terminal's Ctrl-C or kill -PGID misses it */
    prctl(PR_SET_NAME, "dtrain-guard");
    static const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP,
                                  SIGTTIN, SIGTTOU};
    for (size_t i = 0; i < DT_ARRAY_LEN(ignored); i++)
        signal(ignored[i], SIG_IGN);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
        dup2(devnull, STDIN_FILENO);
        dup2(devnull, STDOUT_FILENO);
        close(devnull);
    }
    size_t n = 0, cap = 64;
    pid_t *groups = malloc(cap * sizeof *groups);
    int32_t buf[256];
    size_t have = 0; /* bytes in buf */
    for (;;) {
        ssize_t r = read(rfd, (char *)buf + have, sizeof buf - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        size_t whole = have / sizeof(int32_t);
        for (size_t i = 0; i < whole; i++) {
            int32_t v = buf[i];
            if (v > 0) {
                if (n == cap) {
                    pid_t *g = groups ? realloc(groups, 2 * cap * sizeof *g) : NULL;
                    if (g) {
                        groups = g;
                        cap *= 2;
                    }
                }
                if (groups && n < cap)
                    groups[n++] = v;
            } else if (v < 0) {
                for (size_t k = 0; k < n; k++)
                    if (groups[k] == -v) {
                        groups[k] = groups[--n];
                        break;
                    }
            }
        }
        memmove(buf, (char *)buf + whole * sizeof(int32_t), have - whole * sizeof(int32_t));
        have -= whole * sizeof(int32_t);
    }
    /* The agent is gone (or closed the pipe at its end): nothing of its workers may survive. */
    for (size_t k = 0; k < n; k++)
        kill(-groups[k], SIGKILL);
    _exit(0);
}

int dt_guard_start(dt_guard **out, dt_err *err)
{
    *out = NULL;
    dt_guard *g = calloc(1, sizeof *g);
    int p[2];
    if (!g)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(g);
        return dt_err_errno(err, errno, "cannot create the guardian's pipe");
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        free(g);
        return dt_err_errno(err, e, "cannot fork the guardian");
    }
    if (pid == 0) {
        close(p[1]);
        guard_main(p[0]);
    }
    close(p[0]);
    g->pid = pid;
    g->wfd = p[1];
    *out = g;
    return 0;
}

static void guard_send(dt_guard *g, int32_t v)
{
    if (!g || g->wfd < 0)
        return;
    int rc = dt_write_all(g->wfd, &v, sizeof v);
    if (rc)
        DT_WARN("cannot reach the guardian process: %s; workers may outlive a killed agent",
                strerror(-rc));
}

void dt_guard_add(dt_guard *g, pid_t pgid) { guard_send(g, (int32_t)pgid); }
void dt_guard_remove(dt_guard *g, pid_t pgid) { guard_send(g, -(int32_t)pgid); }
pid_t dt_guard_pid(const dt_guard *g) { return g && !g->reaped ? g->pid : 0; }

void dt_guard_reaped(dt_guard *g)
{
    if (g)
        g->reaped = true;
}

void dt_guard_stop(dt_guard *g)
{
    if (!g)
        return;
    if (g->wfd >= 0)
        close(g->wfd);
    if (!g->reaped)
        while (waitpid(g->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    free(g);
}
