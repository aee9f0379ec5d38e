/* agent_loop.c - see agent_loop.h: the agent's signals, reaping and output pumping. */
#include "runtime/launch/agent_loop.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/job/workenv.h"

/* epoll tags of the console fds (data.ptr): &console_tag[1], &console_tag[2]. */
static char console_tag[3];

static const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

int dt_agent_signals_init(agent *a, dt_err *err)
{
    sigset_t set;
    sigemptyset(&set);
    /* Under nohup SIGHUP is ignored and must stay so: a hangup is not a stop. It is left out of
     * the set, since Linux queues a blocked signal even when it is ignored. The other signals
     * are acted on even when ignored at start (an agent started with & from a script has INT
     * and QUIT ignored, and `kill -INT` must still stop the job). */
    struct sigaction hup;
    a->hup_ignored = sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler == SIG_IGN;
    if (a->hup_ignored)
        DT_DEBUG("SIGHUP is ignored (nohup): a hangup will not stop the job");
    for (size_t i = 0; i < DT_ARRAY_LEN(handled_signals); i++)
        if (!(handled_signals[i] == SIGHUP && a->hup_ignored))
            sigaddset(&set, handled_signals[i]);
    if (sigprocmask(SIG_BLOCK, &set, &a->oldmask) != 0)
        return dt_err_errno(err, errno, "sigprocmask");
    a->signals_set = true;
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &a->oldpipe); /* a closed console must not kill the agent */
    a->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (a->sfd < 0)
        return dt_err_errno(err, errno, "signalfd");
    a->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (a->epfd < 0)
        return dt_err_errno(err, errno, "epoll_create1");
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, a->sfd, &e) != 0)
        return dt_err_errno(err, errno, "epoll_ctl");
    return 0;
}

void dt_agent_signals_restore(agent *a)
{
    if (a->sfd >= 0)
        close(a->sfd);
    if (a->epfd >= 0)
        close(a->epfd);
    if (a->signals_set) {
        sigprocmask(SIG_SETMASK, &a->oldmask, NULL);
        sigaction(SIGPIPE, &a->oldpipe, NULL);
    }
}

static worker *find_worker(agent *a, pid_t pid)
{
    for (int i = 0; i < a->nproc; i++)
        if (a->w[i].pid == pid)
            return &a->w[i];
    return NULL;
}

/* Forgets process groups that have emptied. */
static void refresh_groups(agent *a)
{
    for (int i = 0; i < a->nproc; i++) {
        worker *w = &a->w[i];
        if (w->group && !w->running && !dt_proc_group_alive(w->pid)) {
            w->group = false;
            a->n_groups--;
            dt_guard_remove(a->guard, w->pid);
        }
    }
}

void dt_agent_reap(agent *a)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | WUNTRACED | WCONTINUED);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            break;
        if (pid == dt_guard_pid(a->guard)) {
            dt_guard_reaped(a->guard);
            if (!a->closing)
                DT_WARN("the guardian process (pid %d) exited; workers may outlive a killed agent",
                        (int)pid);
            continue;
        }
        worker *w = find_worker(a, pid);
        if (!w || !w->running)
            continue; /* an orphaned grandchild we adopted as subreaper */
        if (WIFSTOPPED(st) || WIFCONTINUED(st)) {
            char sn[32];
            if (WIFSTOPPED(st))
                DT_WARN("rank %d (local_rank %d, pid %d) was stopped by %s: the job waits until "
                        "it is continued (kill -CONT %d)",
                        w->rank, w->local_rank, (int)w->pid,
                        dt_report_signame(WSTOPSIG(st), sn, sizeof sn), (int)w->pid);
            else
                DT_INFO("rank %d (pid %d) continued", w->rank, (int)w->pid);
            dt_report_worker_paused(&a->ev, w->rank, (int)w->pid, WIFSTOPPED(st) ? WSTOPSIG(st) : 0);
            continue;
        }
        w->running = false;
        w->status = st;
        w->t_end = dt_wall_s();
        a->n_running--;
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (a->stopping) {
            w->state = ok ? W_SUCCEEDED : W_STOPPED;
        } else if (ok) {
            w->state = W_SUCCEEDED;
            a->n_succeeded++;
        } else if ((a->preempt_sig || a->builtin_worker || a->rd.group_world_size > 1) &&
                   WIFEXITED(st) &&
                   WEXITSTATUS(st) == DT_EXIT_PREEMPTED) { /* a planned stop (failures.md) */
            w->state = W_PREEMPTED; /* saved its checkpoint after USR1/USR2 or its own signal */
            a->n_preempted++;
        } else {
            w->state = W_FAILED;
            a->n_failed++;
        }
        dt_report_worker_exit(&a->ev, w->rank, w->local_rank, (int)w->pid, a->rd.attempt, st,
                              w->state == W_SUCCEEDED   ? "succeeded"
                              : w->state == W_FAILED    ? "failed"
                              : w->state == W_PREEMPTED ? "preempted"
                                                        : "stopped",
                              w->t_end - w->t_start);
        if (w->state == W_FAILED) {
            char what[128];
            dt_report_describe_status(WIFEXITED(st) ? WEXITSTATUS(st) : 0,
                                      WIFSIGNALED(st) ? WTERMSIG(st) : 0, what, sizeof what);
            DT_WARN("rank %d (local_rank %d, pid %d) %s", w->rank, w->local_rank, (int)w->pid, what);
        }
    }
    refresh_groups(a);
}

void dt_agent_signal_groups(agent *a, int sig)
{
    for (int i = 0; i < a->nproc; i++)
        if (a->w[i].group)
            dt_proc_kill_group(a->w[i].pid, sig);
}

static void handle_signal(agent *a, int sig)
{
    char name[32];
    if (sig == SIGCHLD) {
        dt_agent_reap(a);
        return;
    }
    dt_report_signame(sig, name, sizeof name);
    const char *action;
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        DT_INFO("%s received: forwarded to the workers", name);
        a->preempt_sig = sig; /* workers exiting 75 now saved a checkpoint: not a failure */
        dt_agent_flight_signal(a->fl, sig); /* SIGUSR1: a dump and a verdict first */
        dt_agent_signal_groups(a, sig);
        action = "forwarded";
    } else if (!a->first_signal) {
        a->first_signal = sig;
        DT_WARN("%s received: stopping the workers%s", name,
                sig == SIGINT ? " (Ctrl-C again kills them at once)" : "");
        action = "stop";
    } else if (sig == SIGINT) {
        if (!a->kill_now)
            DT_WARN("%s received again: killing the workers now", name);
        a->kill_now = true;
        action = "kill";
    } else {
        action = "ignored (already stopping)";
    }
    dt_report_signal(&a->ev, sig, action);
}

static void drain_signals(agent *a)
{
    struct signalfd_siginfo si;
    for (;;) {
        ssize_t n = read(a->sfd, &si, sizeof si);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof si)
            break;
        handle_signal(a, (int)si.ssi_signo);
    }
}

/* Puts the workers' output pipes in or out of the epoll set. */
static void watch_outputs(agent *a, bool on)
{
    for (int i = 0; i < a->nproc; i++)
        for (int k = 0; k < 2; k++) {
            dt_out_stream *s = &a->w[i].out[k];
            if (s->fd < 0)
                continue;
            struct epoll_event ee = {.events = EPOLLIN, .data.ptr = s};
            if (epoll_ctl(a->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, s->fd, &ee) != 0 &&
                errno != EEXIST && errno != ENOENT)
                DT_WARN("epoll_ctl: %s; rank %d's output may stall", strerror(errno), a->w[i].rank);
        }
}

/* Keeps the epoll set in step with the console (see agent_output.h): EPOLLOUT on a console fd
 * with bytes waiting; the workers' pipes left unread while the console is behind. Returns the
 * longest the next wait may last in ms (-1: no limit). */
static int sync_console(agent *a)
{
    dt_out_console_drain_logs();
    int ms = dt_out_console_tick();
    if (ms < 0 || ms > 200)
        ms = 200; /* other threads' log lines wait at most this long (dt_out_console_drain_logs) */
    for (int fd = 1; fd <= 2; fd++) {
        bool want = dt_out_console_pending(fd);
        if (want == a->con_watched[fd])
            continue;
        struct epoll_event ee = {.events = EPOLLOUT, .data.ptr = &console_tag[fd]};
        if (epoll_ctl(a->epfd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ee) == 0 || !want)
            a->con_watched[fd] = want;
        else
            ms = ms < 0 || ms > 50 ? 50 : ms; /* cannot watch it: look again soon */
    }
    bool pause = dt_out_console_throttled();
    if (pause != a->out_paused) {
        watch_outputs(a, !pause);
        a->out_paused = pause;
    }
    return ms;
}

/* Waits up to timeout_ms (-1 = no limit) for anything and handles it. */
void dt_agent_pump(agent *a, int timeout_ms)
{
    struct epoll_event evs[64];
    int cms = sync_console(a);
    if (cms >= 0 && (timeout_ms < 0 || cms < timeout_ms))
        timeout_ms = cms;
    int n = epoll_wait(a->epfd, evs, (int)DT_ARRAY_LEN(evs), timeout_ms);
    if (n < 0) {
        if (errno != EINTR)
            DT_WARN("epoll_wait: %s", strerror(errno));
        return;
    }
    for (int i = 0; i < n; i++) {
        void *p = evs[i].data.ptr;
        if (!p) {
            drain_signals(a);
            continue;
        }
        if (p == &console_tag[1] || p == &console_tag[2])
            continue; /* writable: sync_console writes */
        if (!a->out_paused && dt_out_console_throttled()) {
            watch_outputs(a, false);
            a->out_paused = true;
        }
        if (a->out_paused)
            continue; /* the console is behind: the workers wait (level-triggered: not lost) */
        dt_out_stream *s = p;
        if (s->fd >= 0)
            dt_out_pump(s); /* at end of file it closes the fd, which leaves the epoll set */
    }
    sync_console(a);
}

bool dt_agent_rdzv_interrupted(void *arg)
{
    agent *a = arg;
    drain_signals(a);
    dt_out_console_tick(); /* what the last round left for the console goes out meanwhile */
    return a->first_signal != 0;
}
