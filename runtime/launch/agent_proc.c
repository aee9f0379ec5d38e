/* agent_proc.c - see agent_proc.h. */
#include "runtime/launch/agent_proc.h"

#include <dirent.h>
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
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

struct dt_cgroup {
    char path[4096];
    int procs_fd; /* cgroup.procs, write-only, close-on-exec */
};

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
        if (s->cgroup && s->cgroup->procs_fd >= 0) { /* "0": the writer itself; what it starts
                                                         inherits the cgroup */
            ssize_t cw = write(s->cgroup->procs_fd, "0", 1);
            (void)cw; /* best effort: a worker outside it is still covered while the agent lives */
        }
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
        if (s->fd_keep > 2)
            fcntl(s->fd_keep, F_SETFD, 0); /* this child's copy only */
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

/* ---- descendants ------------------------------------------------------------------------ */

typedef struct pinfo {
    pid_t pid, ppid;
    bool mark;
} pinfo;

/* The parent and state of /proc/<pid>/stat: "pid (comm) S ppid ...", where comm may hold ") ". */
static bool read_stat(pid_t pid, pid_t *ppid, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n;
    do
        n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    int pp;
    if (!rp || sscanf(rp + 1, " %c %d", state, &pp) != 2)
        return false;
    *ppid = pp;
    return true;
}

int dt_proc_descendants(pid_t root, pid_t **out)
{
    *out = NULL;
    DIR *d = opendir("/proc");
    if (!d)
        return -errno;
    size_t n = 0, cap = 256;
    pinfo *p = malloc(cap * sizeof *p);
    struct dirent *e;
    while (p && (e = readdir(d))) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        char st;
        pid_t pp;
        if (*end || v <= 0 || !read_stat((pid_t)v, &pp, &st) || st == 'Z' || st == 'X')
            continue;
        if (n == cap) {
            pinfo *q = realloc(p, 2 * cap * sizeof *p);
            if (!q) {
                free(p);
                p = NULL;
                break;
            }
            p = q;
            cap *= 2;
        }
        p[n++] = (pinfo){.pid = (pid_t)v, .ppid = pp, .mark = false};
    }
    closedir(d);
    if (!p)
        return -ENOMEM;
    /* Mark root's children, then their children, until a pass adds nothing (passes = depth). */
    size_t found = 0;
    for (bool more = true; more;) {
        more = false;
        for (size_t i = 0; i < n; i++) {
            if (p[i].mark)
                continue;
            bool hit = p[i].ppid == root;
            for (size_t j = 0; !hit && j < n; j++)
                hit = p[j].mark && p[j].pid == p[i].ppid;
            if (hit) {
                p[i].mark = more = true;
                found++;
            }
        }
    }
    pid_t *r = found ? malloc(found * sizeof *r) : NULL;
    if (found && !r) {
        free(p);
        return -ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i].mark)
            r[k++] = p[i].pid;
    free(p);
    *out = r;
    return (int)k;
}

/* ---- the workers' cgroup ---------------------------------------------------------------- */

/* The cgroup v2 mount point and the root of the hierarchy it shows (mountinfo fields 5, 4). */
static bool cgroup2_mount(char *mnt, size_t mcap, char *root, size_t rcap)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    char line[4096];
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f)) {
        const char *sep = strstr(line, " - ");
        if (!sep || strncmp(sep + 3, "cgroup2 ", 8))
            continue;
        char r[2048], m[2048];
        if (sscanf(line, "%*s %*s %*s %2047s %2047s", r, m) == 2)
            ok = dt_strlcpy(mnt, m, mcap) && dt_strlcpy(root, r, rcap);
    }
    fclose(f);
    return ok;
}

/* This process's cgroup v2 path ("0::/path" in /proc/self/cgroup). */
static bool own_cgroup(char *out, size_t cap)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return false;
    char line[4096];
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = '\0';
            ok = dt_strlcpy(out, line + 3, cap);
        }
    fclose(f);
    return ok;
}

int dt_cgroup_open(dt_cgroup **out, char *why, size_t cap)
{
    char mnt[2048], root[2048], own[2048];
    *out = NULL;
    if (!cgroup2_mount(mnt, sizeof mnt, root, sizeof root)) {
        snprintf(why, cap, "no cgroup v2 mounted");
        return -ENOENT;
    }
    if (!own_cgroup(own, sizeof own)) {
        snprintf(why, cap, "this process has no cgroup v2 path in /proc/self/cgroup");
        return -ENOENT;
    }
    /* A bind mount shows a subtree: own is then relative to the mount's root. */
    const char *rel = own;
    size_t rl = strlen(root);
    if (strcmp(root, "/") && !strncmp(own, root, rl) && (own[rl] == '/' || !own[rl]))
        rel = own + rl;
    if (!strcmp(rel, "/"))
        rel = "";
    dt_cgroup *cg = calloc(1, sizeof *cg);
    if (!cg) {
        snprintf(why, cap, "out of memory");
        return -ENOMEM;
    }
    cg->procs_fd = -1;
    int n = snprintf(cg->path, sizeof cg->path, "%s%s/dtrain-%d", mnt, rel, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof cg->path) {
        snprintf(why, cap, "cgroup path too long");
        free(cg);
        return -ENAMETOOLONG;
    }
    if (mkdir(cg->path, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        snprintf(why, cap, "cannot create %s: %s", cg->path, strerror(e));
        free(cg);
        return -e;
    }
    char procs[sizeof cg->path + 16];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", cg->path);
    cg->procs_fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (cg->procs_fd < 0) {
        int e = errno;
        snprintf(why, cap, "cannot open %s: %s", procs, strerror(e));
        rmdir(cg->path);
        free(cg);
        return -e;
    }
    *out = cg;
    return 0;
}

const char *dt_cgroup_path(const dt_cgroup *cg) { return cg ? cg->path : ""; }

/* Sends SIGKILL to every pid cgroup.procs lists; returns how many it listed (-1: unreadable,
 * the cgroup is gone). No malloc: the guardian calls it. */
static int kill_listed(const char *procs)
{
    int fd = open(procs, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[4096];
    int n = 0;
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, buf + have, sizeof buf - 1 - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        have += (size_t)r;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = '\0';
            int pid = atoi(line);
            if (pid > 1) {
                kill(pid, SIGKILL);
                n++;
            }
            line = nl + 1;
        }
        have = strlen(line);
        memmove(buf, line, have);
    }
    close(fd);
    return n;
}

int dt_cgroup_kill_path(const char *path, double timeout_s)
{
    if (!path || !*path)
        return 0;
    char kill_file[4096 + 16], procs[4096 + 16];
    snprintf(kill_file, sizeof kill_file, "%s/cgroup.kill", path);
    snprintf(procs, sizeof procs, "%s/cgroup.procs", path);
    int fd = open(kill_file, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { /* Linux 5.14+: the kernel kills them all, forks in flight included */
        ssize_t w = write(fd, "1", 1);
        (void)w;
        close(fd);
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int left = kill_listed(procs); /* older kernels; finds nothing once cgroup.kill worked */
        if (left < 0)
            return 0; /* removed already */
        if (left == 0 && (rmdir(path) == 0 || errno == ENOENT))
            return 0;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > timeout_s)
            return -EBUSY;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void dt_cgroup_close(dt_cgroup *cg)
{
    if (!cg)
        return;
    if (cg->procs_fd >= 0)
        close(cg->procs_fd);
    if (dt_cgroup_kill_path(cg->path, 5.0))
        DT_WARN("processes of the workers' cgroup %s survived SIGKILL for 5 s; it is left behind",
                cg->path);
    free(cg);
}

/* ---- guardian --------------------------------------------------------------------------- */

struct dt_guard {
    pid_t pid;
    int wfd;     /* write end; the only copy outside the guardian's read end (close-on-exec) */
    bool reaped;
};

/* The guardian's whole life. Messages are int32: +pgid to watch, -pgid to forget. */
static void __attribute__((noreturn)) guard_main(int rfd, const char *cgroup)
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
    /* And what left the groups (daemons): everything in the workers' cgroup. */
    dt_cgroup_kill_path(cgroup, 10.0);
    _exit(0);
}

int dt_guard_start(dt_guard **out, const char *cgroup, dt_err *err)
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
        guard_main(p[0], cgroup);
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
