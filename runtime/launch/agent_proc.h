/* agent_proc.h - worker processes for the agent: fork+exec into a process group, parent-death,
 * and the guardian that kills worker groups when the agent itself is killed.
 *
 * What the agent needs from the OS, in one place:
 *   - every worker is the leader of its own process group, so one kill(-pgid) reaches the worker
 *     and everything it started (a shell's children, a Python script's data loaders);
 *   - a worker never outlives the agent: PR_SET_PDEATHSIG(SIGKILL) in the child before exec, and
 *     a getppid() check right after it (the agent may have died between fork and prctl);
 *   - the worker's grandchildren are covered by the guardian: a small process forked from the
 *     agent before any thread exists, holding the read end of a pipe whose write end only the
 *     agent holds. When the agent dies for any reason (SIGKILL included) the pipe reaches end of
 *     file and the guardian SIGKILLs every worker process group it was told about, then exits.
 *   - exec failures are reported back to the agent through a close-on-exec pipe (errno), never
 *     silently turned into an exit code;
 *   - what a worker started outside its process group (a daemon: fork, setsid, fork again) is
 *     still a descendant of the agent, which is their subreaper: when the double fork's middle
 *     process exits, the daemon is re-parented to the agent, not to init. dt_proc_descendants
 *     walks /proc for them, and every stop of the workers signals them too;
 *   - for the one case the agent cannot act in, its own SIGKILL, the workers run in a cgroup v2
 *     of their own when one can be created under the agent's (dt_cgroup_open): a daemon cannot
 *     leave it, and the guardian kills the whole cgroup (cgroup.kill) when the agent dies.
 *     Without a writable cgroup v2 a daemon survives a SIGKILLed agent (the worker groups do
 *     not); PR_SET_PDEATHSIG cannot help there, since a forked child does not inherit it and a
 *     daemon re-parented to the agent never set it.
 *
 * Linux only (prctl). Not thread-safe: call from the agent's main thread, which must also be the
 * thread that forks, because PR_SET_PDEATHSIG fires when the forking THREAD exits.
 */
#ifndef DT_AGENT_PROC_H
#define DT_AGENT_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"

typedef struct dt_cgroup dt_cgroup;

typedef struct dt_proc_spec {
    const char *path;   /* program to exec (absolute or relative path, as dt_proc_resolve gives) */
    char *const *argv;  /* NULL-terminated; borrowed */
    char *const *envp;  /* NULL-terminated full environment; borrowed */
    int fd_out;         /* becomes the child's stdout; -1 = inherit the agent's */
    int fd_err;         /* becomes the child's stderr; -1 = inherit the agent's */
    int fd_keep;        /* > 2: a close-on-exec descriptor the child keeps across its exec (the
                           flight records' memfd); 0 = none */
    bool keep_hup_ignored; /* leave SIGHUP ignored when it is (the agent runs under nohup) */
    const struct dt_cgroup *cgroup; /* the workers' cgroup, which the child joins before exec;
                                       NULL = none; borrowed */
} dt_proc_spec;

/* Finds prog the way execvp would, using path_env (a PATH value; NULL = the agent's PATH) when
 * prog has no '/'. Writes the path to run into out. Returns 0, or -ENOENT / -EACCES with err
 * naming the program and what to check. */
int dt_proc_resolve(const char *prog, const char *path_env, char *out, size_t cap, dt_err *err);

/* Forks and execs spec into a new process group (pgid == pid). In the child: own process group,
 * PR_SET_PDEATHSIG(SIGKILL), exit if the agent is already gone, signal mask cleared, SIGPIPE,
 * SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2 and (unless keep_hup_ignored) SIGHUP back to their
 * defaults (an agent started with & has INT and QUIT ignored; its workers must not inherit that),
 * stdin from /dev/null (a worker is not in the terminal's foreground group: reading it would
 * stop the worker with SIGTTIN), fd_out/fd_err dup'ed onto 1/2, exec. Returns 0 with *pid set once the exec
 * succeeded, or a negative errno with err set when fork or exec failed (then no child is left
 * running: a child whose exec failed has exited and been reaped). */
int dt_proc_spawn(const dt_proc_spec *spec, pid_t *pid, dt_err *err);

/* Sends sig to every process of group pgid. Returns 0, or -ESRCH when the group is empty. */
int dt_proc_kill_group(pid_t pgid, int sig);

/* Whether any process is left in group pgid (zombies count until reaped). */
bool dt_proc_group_alive(pid_t pgid);

/* Makes this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER), so the
 * agent receives SIGCHLD for a worker's grandchildren once their parent exited. */
int dt_proc_become_subreaper(dt_err *err);

/* Every living descendant of root (children, their children, ...; zombies left out), read from
 * /proc. *out (malloc'd, the caller frees; NULL when none) gets their pids. Returns how many, or
 * a negative errno (then *out is NULL). A process that forks while the walk runs may be missed:
 * callers walk again until the answer is empty. */
int dt_proc_descendants(pid_t root, pid_t **out);

/* ---- the workers' cgroup ------------------------------------------------------------------ */

/* Creates a cgroup v2 for the workers below this process's own one (<mount><own>/dtrain-<pid>).
 * Returns 0 with *out owning it, or a negative errno with why (cap bytes) saying why there is
 * none: no cgroup v2 mounted, not writable (a container, no delegation), ... (not an error: the
 * agent goes on without one). */
int dt_cgroup_open(dt_cgroup **out, char *why, size_t cap);

/* The cgroup's directory, or "" for NULL. */
const char *dt_cgroup_path(const dt_cgroup *cg);

/* SIGKILLs every process of the cgroup at path (cgroup.kill, else one by one from cgroup.procs
 * until it is empty), waits up to timeout_s for it to empty and removes it. Async-signal-safe
 * enough for the guardian (no malloc). Returns 0, or -EBUSY when processes were left. */
int dt_cgroup_kill_path(const char *path, double timeout_s);

/* Kills what is left in the cgroup (dt_cgroup_kill_path), removes it and frees. Accepts NULL. */
void dt_cgroup_close(dt_cgroup *cg);

/* ---- guardian ---------------------------------------------------------------------------- */

typedef struct dt_guard dt_guard;

/* Forks the guardian. Call before starting any thread. On success *out owns it. cgroup (may be
 * NULL or "") is the workers' cgroup directory (dt_cgroup_path), which the guardian kills and
 * removes when the agent dies. */
int dt_guard_start(dt_guard **out, const char *cgroup, dt_err *err);

/* Tells the guardian about a worker process group to kill if the agent dies / that it may forget
 * (the group is empty). Best effort: failures are logged, not returned. Accept NULL. */
void dt_guard_add(dt_guard *g, pid_t pgid);
void dt_guard_remove(dt_guard *g, pid_t pgid);

/* The guardian's pid (so the agent's reaper recognises it), or 0. */
pid_t dt_guard_pid(const dt_guard *g);

/* Marks the guardian as reaped by the agent's own waitpid loop. */
void dt_guard_reaped(dt_guard *g);

/* Closes the pipe (the guardian kills what it still knows about, normally nothing, and exits),
 * reaps it and frees. Accepts NULL. */
void dt_guard_stop(dt_guard *g);

#endif
