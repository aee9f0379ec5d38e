/* agent.c - the per-node agent: rendezvous, workers, supervision, restarts. See agent.h.
 *
 * One thread does everything, driven by one epoll set:
 *   - a signalfd for SIGCHLD and for the signals the agent acts on (INT TERM HUP QUIT USR1 USR2).
 *     They are blocked first thing, before the store server's thread exists, so that thread
 *     inherits the mask and no signal is ever delivered anywhere but to the signalfd;
 *   - the read ends of the workers' stdout and stderr pipes.
 * A worker's exit wakes the agent at once (no sleep loop). The only timed wake-ups are the
 * rendezvous polls of a multi-node job (every --monitor-interval) and the deadlines of a stop.
 *
 * A round: join (rdzv) -> start nproc workers (fork+exec, one process group each) -> monitor ->
 * stop -> decide. Decide: every node succeeded -> exit 0; a worker failed here or anywhere ->
 * restart while the job-wide budget lasts, else print the root-cause table and exit 1; this
 * agent got SIGINT/SIGTERM/SIGHUP/SIGQUIT -> forward it, stop, exit 128+n (and tell the other
 * nodes, which end too). SIGUSR1/SIGUSR2 are forwarded and the job goes on.
 *
 * Stopping: the signal goes to every worker's process group; the agent then waits for each group
 * to empty (it is the subreaper of the workers' orphaned children, so their exits reach it as
 * SIGCHLD too) and sends SIGKILL to what is left after --stop-grace seconds, or at once on a
 * second Ctrl-C.
 *
 * The agent never calls exit(): dt_agent_run returns the exit code and cmd/ exits with it.
 */
#include "runtime/launch/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv.h"
#include "runtime/launch/agent_env.h"
#include "runtime/launch/agent_flight.h"
#include "runtime/launch/agent_job.h"
#include "runtime/launch/agent_loop.h"
#include "runtime/launch/agent_output.h"
#include "runtime/launch/agent_proc.h"
#include "runtime/launch/agent_report.h"
#include "runtime/job/config.h"
#include "runtime/job/errfile.h"
#include "runtime/job/workenv.h"

extern char **environ;

/* snprintf for paths and messages: false (and a cut string) when it did not fit. Through
 * vsnprintf so that the compiler's truncation guesses stay quiet where we check. */
static bool fmt(char *dst, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static bool fmt(char *dst, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(dst, cap, f, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* ---- workers ---------------------------------------------------------------------------- */

static void record_start_failure(agent *a, worker *w, const char *msg)
{
    w->state = W_FAILED;
    w->status = 127 << 8; /* as a shell reports a command it could not run */
    w->t_start = w->t_end = dt_wall_s();
    dt_strlcpy(w->message, msg, sizeof w->message);
    a->n_failed++;
    DT_ERROR("rank %d could not be started: %s", w->rank, msg);
}

static int start_worker(agent *a, worker *w, const char *attempt_dir, dt_err *err)
{
    int rc, cfd[2] = {-1, -1};
    dt_envb env = {0};
    if (!fmt(w->dir, sizeof w->dir, "%s/%d", attempt_dir, w->rank))
        return dt_err_set(err, -ENAMETOOLONG, "log directory path too long: %s (use a shorter --log-dir)", w->dir);
    if ((rc = dt_mkdir_p(w->dir, err)))
        return rc;
    snprintf(w->error_file, sizeof w->error_file, "%s/error.json", w->dir);
    unlink(w->error_file); /* a relaunch with the same run id must not see an old record */

    int redir = dt_out_mode_for(a->L.redirects, w->local_rank);
    int tee = dt_out_mode_for(a->L.tee, w->local_rank);
    bool shown = dt_out_rank_shown(a->L.local_ranks_filter, w->local_rank);
    for (int k = 0; k < 2; k++) {
        int bit = k + 1;
        /* A rank the filter hides writes to its files: its crash must leave a trace. */
        dt_out_plan plan = {.file = ((redir | tee) & bit) != 0 || !shown,
                            .console = shown && (!(redir & bit) || (tee & bit))};
        char path[DT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/%s.log", w->dir, k == 0 ? "stdout" : "stderr");
        if ((rc = dt_out_prepare(&w->out[k], &plan, k + 1, w->rank, path, &cfd[k], err)))
            goto fail;
    }

    /* The contract (runtime/job/workenv.h): one struct, one writer. */
    static dt_worker_env we; /* ~2.6 KB; the agent has one thread that starts workers */
    memset(&we, 0, sizeof we);
    we.rank = w->rank;
    we.local_rank = w->local_rank;
    we.world_size = a->rd.world_size;
    we.local_world_size = a->nproc;
    we.group_rank = a->rd.group_rank;
    we.group_world_size = a->rd.group_world_size;
    we.attempt = a->rd.attempt;
    we.max_restarts = a->rd.max_restarts;
    we.round = a->rd.round;
    we.master_port = a->rd.master_port;
    we.store_port = a->rd.store_port;
    we.agent_pid = (int)getpid();
    we.omp_num_threads = a->omp_one ? 1 : 0;
    we.flight_fd = dt_agent_flight_fd(a->fl, w->local_rank);
    if (!dt_strlcpy(we.run_id, a->rd.run_id, sizeof we.run_id) ||
        !dt_strlcpy(we.role, a->L.role, sizeof we.role) ||
        !dt_strlcpy(we.master_addr, a->rd.master_addr, sizeof we.master_addr) ||
        !dt_strlcpy(we.store_addr, a->rd.store_addr, sizeof we.store_addr) ||
        !dt_strlcpy(we.local_addr, a->rd.local_addr, sizeof we.local_addr) ||
        !dt_strlcpy(we.error_file, w->error_file, sizeof we.error_file)) {
        rc = dt_err_set(err, -ENAMETOOLONG, "rank %d: a value of the worker's environment is "
                        "too long (run id, role, address or %s)", w->rank, w->error_file);
        goto fail;
    }
    if ((rc = dt_envb_init(&env, environ, err)) || (rc = dt_workenv_export(&we, &env, err)) ||
        (rc = dt_agent_env_defaults(&env, a->spec->worker_env, err)))
        goto fail;
    dt_proc_spec ps = {.path = a->prog, .argv = a->spec->argv, .envp = env.v, .fd_out = cfd[0],
                       .fd_err = cfd[1], .keep_hup_ignored = a->hup_ignored, .cgroup = a->cg, .fd_keep = we.flight_fd};
    dt_err e = {0};
    pid_t pid;
    w->t_start = dt_wall_s();
    rc = dt_proc_spawn(&ps, &pid, &e);
    close(cfd[0]);
    close(cfd[1]);
    cfd[0] = cfd[1] = -1;
    dt_envb_free(&env);
    if (rc) {
        /* Not an agent error: the worker failed to start, which the restart policy handles. */
        dt_out_finish(&w->out[0]);
        dt_out_finish(&w->out[1]);
        record_start_failure(a, w, e.msg);
        return 0;
    }
    w->pid = pid;
    w->running = w->group = true;
    w->state = W_RUNNING;
    a->n_running++;
    a->n_groups++;
    dt_guard_add(a->guard, pid);
    for (int k = 0; k < 2; k++) {
        if (w->out[k].fd < 0 || a->out_paused)
            continue;
        struct epoll_event ee = {.events = EPOLLIN, .data.ptr = &w->out[k]};
        if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, w->out[k].fd, &ee) != 0)
            DT_WARN("epoll_ctl: %s; rank %d's output is lost", strerror(errno), w->rank);
    }
    dt_report_worker_start(&a->ev, w->rank, w->local_rank, (int)pid, a->rd.attempt);
    return 0;
fail:
    for (int k = 0; k < 2; k++) {
        if (cfd[k] >= 0)
            close(cfd[k]);
        dt_out_finish(&w->out[k]);
    }
    dt_envb_free(&env);
    return rc;
}

static int start_workers(agent *a, dt_err *err)
{
    int rc;
    char attempt_dir[DT_PATH_MAX + 340];
    a->n_running = a->n_groups = a->n_failed = a->n_succeeded = a->n_preempted = 0;
    a->preempt_sig = 0;
    a->stopping = false;
    dt_agent_flight_round(&a->fl, &a->spec->flight, &a->rd, a->nproc, a->run_dir, &a->ev, a->rz);
    if (a->rd.round == a->rd.attempt)
        snprintf(attempt_dir, sizeof attempt_dir, "%s/attempt_%d", a->run_dir, a->rd.attempt);
    else /* an elastic job's membership changed: same attempt, new round */
        snprintf(attempt_dir, sizeof attempt_dir, "%s/attempt_%d_round_%d", a->run_dir,
                 a->rd.attempt, a->rd.round);
    for (int i = 0; i < a->nproc; i++) {
        worker *w = &a->w[i];
        memset(w, 0, sizeof *w);
        w->local_rank = i;
        w->rank = a->rd.rank_base + i;
        w->out[0].fd = w->out[1].fd = -1;
        w->out[0].file_fd = w->out[1].file_fd = -1;
    }
    for (int i = 0; i < a->nproc; i++) {
        if ((rc = start_worker(a, &a->w[i], attempt_dir, err)))
            return rc;
        if (a->n_failed)
            break; /* one could not start: the others would fail the same way */
    }
    return 0;
}

/* Sends sig to the agent's descendants outside every worker's process group (a daemon a worker
 * started: it left the group with setsid, and was re-parented to the agent, the subreaper) and
 * returns how many there were; sig 0 only counts. The guardian is not one of them. */
static int signal_strays(agent *a, int sig)
{
    pid_t *d = NULL;
    int n = dt_proc_descendants(getpid(), &d), strays = 0;
    for (int i = 0; i < n; i++) {
        if (d[i] == dt_guard_pid(a->guard))
            continue;
        pid_t pg = getpgid(d[i]);
        bool in_group = false;
        for (int k = 0; k < a->nproc && !in_group; k++)
            in_group = a->w[k].group && a->w[k].pid == pg;
        if (in_group)
            continue; /* the group's signal reaches it */
        strays++;
        if (sig)
            kill(d[i], sig);
    }
    free(d);
    return strays;
}

/* Sends sig to every worker group and to the processes the workers started outside them, waits
 * up to --stop-grace for all of them to end, then SIGKILL. */
static void stop_workers(agent *a, int sig)
{
    a->stopping = true;
    dt_agent_reap(a);
    int strays = signal_strays(a, 0);
    if (a->n_groups == 0 && strays == 0)
        return;
    char name[32];
    dt_report_signame(sig, name, sizeof name);
    if (strays)
        DT_INFO("%d process%s the workers started outside their process groups (daemons) still "
                "run: sending %s",
                strays, strays == 1 ? "" : "es", name);
    dt_agent_signal_groups(a, sig);
    signal_strays(a, sig);
    if (sig != SIGKILL) {
        dt_agent_signal_groups(a, SIGCONT); /* a stopped worker acts on sig only once continued */
        signal_strays(a, SIGCONT);
    }
    double deadline = dt_now_s() + a->L.stop_grace, hard = 0;
    bool killed = false;
    while (a->n_groups > 0 || strays > 0) {
        double now = dt_now_s();
        if (!killed && (a->kill_now || now >= deadline)) {
            if (!a->kill_now)
                DT_WARN("%d worker process group%s and %d other process%s still running %.3g s "
                        "after %s: sending SIGKILL",
                        a->n_groups, a->n_groups == 1 ? "" : "s", strays,
                        strays == 1 ? "" : "es", a->L.stop_grace, name);
            killed = true;
            hard = now + 10;
        }
        if (killed) { /* again on every pass: a stray may have forked meanwhile */
            dt_agent_signal_groups(a, SIGKILL);
            signal_strays(a, SIGKILL);
        }
        if (killed && now >= hard) {
            DT_ERROR("%d worker process group%s and %d other process%s survived SIGKILL for 10 s "
                     "(stuck in the kernel?); giving up on them",
                     a->n_groups, a->n_groups == 1 ? "" : "s", strays, strays == 1 ? "" : "es");
            break;
        }
        double until = killed ? hard : deadline;
        int ms = (int)((until - now) * 1000) + 1;
        dt_agent_pump(a, ms < 1 ? 1 : ms > 100 ? 100 : ms); /* 100 ms: re-check groups we get no SIGCHLD for */
        dt_agent_reap(a);
        strays = signal_strays(a, 0);
    }
}

/* Closes the streams of the round (printing what is left in the pipes). */
static void finish_outputs(agent *a)
{
    for (int i = 0; i < a->nproc; i++)
        for (int k = 0; k < 2; k++)
            dt_out_finish(&a->w[i].out[k]);
}

/* This node's failures of the round, in the order they happened. */
static int local_failures(agent *a, dt_rdzv_failure **out)
{
    int n = 0;
    dt_rdzv_failure *f = calloc((size_t)a->nproc, sizeof *f);
    if (!f)
        return -ENOMEM;
    for (int i = 0; i < a->nproc; i++) {
        worker *w = &a->w[i];
        if (w->state != W_FAILED)
            continue;
        dt_rdzv_failure *x = &f[n++];
        x->time = w->t_end;
        dt_strlcpy(x->host, dt_hostname(), sizeof x->host);
        x->node = a->rd.group_rank;
        x->rank = w->rank;
        x->local_rank = w->local_rank;
        x->pid = (int)w->pid;
        x->signal = WIFSIGNALED(w->status) ? WTERMSIG(w->status) : 0;
        x->exit_code = WIFEXITED(w->status) ? WEXITSTATUS(w->status) : 0;
        char msg[sizeof x->message];
        if (dt_errfile_read(w->error_file, msg, sizeof msg, NULL, NULL) == 0 && msg[0]) {
            dt_strlcpy(x->message, msg, sizeof x->message);
            dt_strlcpy(x->error_file, w->error_file, sizeof x->error_file);
        } else if (w->message[0]) {
            dt_strlcpy(x->message, w->message, sizeof x->message);
        } else {
            dt_report_describe_status(x->exit_code, x->signal, x->message, sizeof x->message);
            size_t k = strlen(x->message);
            int redir = dt_out_mode_for(a->L.redirects, w->local_rank);
            if (!dt_out_rank_shown(a->L.local_ranks_filter, w->local_rank) || redir == 3)
                snprintf(x->message + k, sizeof x->message - k,
                         " (no error file; its output is in %s/stdout.log and stderr.log)", w->dir);
            else
                snprintf(x->message + k, sizeof x->message - k, " (no error file; %s)",
                         a->spec->builtin_worker
                             ? "see its output above"
                             : "a PyTorch script writes one with @record, see "
                               "https://pytorch.org/docs/stable/elastic/errors.html");
        }
    }
    /* Insertion sort by exit time: at most nproc entries. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && f[j - 1].time > f[j].time; j--) {
            dt_rdzv_failure t = f[j];
            f[j] = f[j - 1];
            f[j - 1] = t;
        }
    *out = f;
    return n;
}

/* ---- the round -------------------------------------------------------------------------- */

static enum outcome monitor(agent *a, dt_rdzv_status *st)
{
    bool reported = false, remote = a->rd.group_world_size > 1 || a->rd.elastic;
    double next_poll = dt_now_s() + a->L.monitor_interval;
    memset(st, 0, sizeof *st);
    for (;;) {
        if (a->first_signal)
            return OUT_SIGNAL;
        if (a->n_failed)
            return OUT_FAILED;
        if (a->n_preempted && a->n_preempted + a->n_succeeded == a->nproc)
            return OUT_PREEMPTED;
        if (!reported && a->n_succeeded == a->nproc) {
            dt_err e = {0};
            if (dt_rdzv_succeeded(a->rz, &e)) {
                if (a->first_signal) /* interrupted by the signal, as the poll below */
                    return OUT_SIGNAL;
                DT_ERROR("cannot report success to the rendezvous: %s", e.msg);
                return OUT_LOST;
            }
            reported = true;
            next_poll = 0;
            if (remote)
                DT_INFO("all %d workers of this node succeeded; waiting for the other nodes", a->nproc);
        }
        if (remote || reported) {
            double now = dt_now_s();
            if (now >= next_poll) {
                dt_err e = {0};
                if (dt_rdzv_poll(a->rz, st, &e)) {
                    /* a signal that arrived during the poll interrupts it (etcd's requests
                     * check it): that is the signal's stop, not a lost rendezvous */
                    if (a->first_signal)
                        return OUT_SIGNAL;
                    DT_ERROR("lost the rendezvous: %s", e.msg);
                    fmt(st->why, sizeof st->why, "%s", e.msg);
                    return OUT_LOST;
                }
                switch (st->state) {
                case DT_RDZV_SUCCEEDED:
                    return OUT_SUCCEEDED;
                case DT_RDZV_FAILED:
                    return OUT_REMOTE_FAILED;
                case DT_RDZV_ABORTED:
                    return OUT_ABORTED;
                case DT_RDZV_REGROUP:
                    return OUT_REGROUP;
                case DT_RDZV_RUNNING:
                    break;
                }
                next_poll = now + a->L.monitor_interval;
            }
        }
        int ms = -1;
        if (remote) {
            ms = (int)((next_poll - dt_now_s()) * 1000) + 1;
            if (ms < 0)
                ms = 0;
        }
        if (dt_agent_flight_tick(a->fl, &ms)) /* node 0's hang verdict failed the round */
            return OUT_FAILED;
        dt_agent_pump(a, ms);
    }
}

/* An elastic job's global batch, said when the world of a round is new (agent_job.h). */
static void log_global_batch(agent *a)
{
    const dt_rdzv_round *r = &a->rd;
    if (!r->elastic || !a->spec->builtin_worker || r->world_size == a->batch_world ||
        !a->spec->argv[1] || !a->spec->argv[2])
        return;
    int before = a->batch_world;
    a->batch_world = r->world_size;
    dt_agent_log_global_batch(a->spec->argv[2], r->world_size, before);
}

static void round_banner(agent *a, double took_s)
{
    const dt_rdzv_round *r = &a->rd;
    char round_note[32] = "";
    if (r->elastic)
        snprintf(round_note, sizeof round_note, " (round %d)", r->round);
    if (r->group_world_size > 1 || r->elastic)
        DT_INFO("attempt %d%s: node %d of %d, ranks %d-%d of %d; MASTER_ADDR=%s MASTER_PORT=%d; "
                "run id %s",
                r->attempt, round_note, r->group_rank, r->group_world_size, r->rank_base,
                r->rank_base + a->nproc - 1, r->world_size, r->master_addr, r->master_port,
                r->run_id);
    else
        DT_INFO("attempt %d: starting %d worker%s (ranks 0-%d); run id %s", r->attempt, a->nproc,
                a->nproc == 1 ? "" : "s", a->nproc - 1, r->run_id);
    dt_report_round_start(&a->ev, r, took_s);
}

/* Creates <log_root>/<run id> and opens events.jsonl there (after the first rendezvous, which
 * tells the run id). */
static int open_run_dir(agent *a, dt_err *err)
{
    int rc;
    char path[sizeof a->run_dir + 64];
    if (a->run_dir[0])
        return 0;
    snprintf(a->run_dir, sizeof a->run_dir, "%s/%s", a->log_root, a->rd.run_id);
    if ((rc = dt_mkdir_p(a->run_dir, err)))
        return rc;
    a->ev.node = a->rd.group_rank;
    char name[256];
    dt_events_filename(name, sizeof name, a->rd.group_rank, a->rd.elastic, a->rd.round,
                       dt_hostname(), (int)getpid());
    if (!fmt(path, sizeof path, "%s/%s", a->run_dir, name))
        return dt_err_set(err, -ENAMETOOLONG, "events file path too long: %s", path);
    if ((rc = dt_events_open(&a->ev, path, err)))
        return rc;
    if (!a->log_tmp)
        DT_INFO("logs and events.jsonl: %s", a->run_dir);
    else if (dt_agent_writes_files(&a->L)) /* else the user would never learn where the files went */
        DT_INFO("worker output files and events.jsonl go to %s", a->run_dir);
    return 0;
}

/* The root-cause table of a job that ends failed, on the console. */
static void print_table(agent *a, const dt_rdzv_failure *f, int n, const char *headline,
                        int fatal)
{
    char *t = dt_report_job_failed(f, n, headline, fatal, a->rd.attempt, a->rd.max_restarts,
                                   a->run_dir);
    if (t) {
        dt_out_console_write(STDERR_FILENO, t, strlen(t));
        free(t);
    }
}

static void emit_end(agent *a, const char *result, int code)
{
    dt_report_end(&a->ev, result, code, a->rd.attempt, dt_out_console_dropped());
}

/* Whether every worker of the round exited 0 or 75 (the built-in worker's "checkpoint saved"),
 * at least one of them 75: the job was preempted, not failed. */
static bool all_preempted(const agent *a)
{
    int n75 = 0;
    for (int i = 0; i < a->nproc; i++) {
        const worker *w = &a->w[i];
        if (!w->pid || w->running || !WIFEXITED(w->status))
            return false;
        if (WEXITSTATUS(w->status) == DT_EXIT_PREEMPTED)
            n75++;
        else if (WEXITSTATUS(w->status) != 0)
            return false;
    }
    return n75 > 0;
}

static int preempted(agent *a, int sig)
{
    char name[32];
    DT_WARN("preempted: workers saved their checkpoints (after %s); run the same command again to "
            "resume (exit code %d)", sig ? dt_report_signame(sig, name, sizeof name)
                                         : "a stop signal sent to a worker", DT_EXIT_PREEMPTED);
    emit_end(a, "preempted", DT_EXIT_PREEMPTED);
    return DT_EXIT_PREEMPTED;
}

/* The exit code when another node ended the job: the same 128+n as the agent that was
 * signalled (the job as a whole was stopped by signal n), or 1 when it ended for another reason
 * (its rendezvous failed). */
static int abort_code(const dt_rdzv_status *st)
{
    return st->setup_error ? DT_EXIT_CONFIG : st->signal > 0 ? 128 + st->signal : 1;
}

/* The job ended as aborted (st): the end event, and this agent's exit code. */
static int end_aborted(agent *a, const dt_rdzv_status *st)
{
    emit_end(a, st->setup_error ? "setup_error" : "aborted", abort_code(st));
    return abort_code(st);
}

/* A failure a restart would only repeat, as the exit code the job ends with: DT_EXIT_OOM when
 * any built-in worker ran out of device memory (exit 3: the layout does not fit), DT_EXIT_CONFIG
 * when every failed one reports a configuration error (exit 2: a bad job file,
 * checkpoint.resume path or checkpoint directory), else 0 (a failure to restart). */
static int unrepeatable(const agent *a)
{
    int n = 0;
    bool all = true;
    if (!a->spec->builtin_worker)
        return 0;
    for (int i = 0; i < a->nproc; i++) {
        const worker *w = &a->w[i];
        int code = w->state == W_FAILED && WIFEXITED(w->status) ? WEXITSTATUS(w->status) : -1;
        if (code == DT_EXIT_OOM)
            return DT_EXIT_OOM;
        n += w->state == W_FAILED;
        all = all && (w->state != W_FAILED || code == DT_EXIT_CONFIG);
    }
    return n > 0 && all ? DT_EXIT_CONFIG : 0;
}

/* What an unrepeatable failure (its exit code) is, in words. */
static const char *unrepeatable_what(int fatal)
{
    return fatal == DT_EXIT_OOM ? "out of device memory" : "a configuration error";
}

/* The world this round gathered against parallel.tensor x parallel.pipeline (job-file mode):
 * where the world is only known now (MIN:MAX nodes, nproc auto/cpu/gpu) the job's load could
 * not check it. Every node of the round sees the same world and refuses it alike; the job ends
 * as a configuration error (no restart can change the world a round gathered into one that
 * fits, and an elastic job that can hold T x P again re-derives D = world / (T x P) at the next
 * start). Returns 0, or the agent's exit code. */
static int check_world_layout(agent *a)
{
    int T = a->tensor > 0 ? a->tensor : 1;
    int P = a->pipeline > 0 ? a->pipeline : 1;
    dt_err e = {0};
    if (dt_parallel_check_world(a->rd.world_size, T, P, &e) == 0)
        return 0;
    char why[DT_ERR_MSG_MAX + 128];
    fmt(why, sizeof why, "%s %d node%s: %s; no worker was started",
        a->rd.elastic ? "this round gathered" : "the job has", a->rd.group_world_size,
        a->rd.group_world_size == 1 ? "" : "s", e.msg);
    DT_ERROR("%s", why);
    dt_err fe = {0};
    if (dt_rdzv_abort_config(a->rz, NULL, 0, why, &fe))
        DT_DEBUG("cannot record the configuration error in the rendezvous: %s", fe.msg);
    emit_end(a, "setup_error", DT_EXIT_CONFIG);
    return DT_EXIT_CONFIG;
}

/* Whether the job's layout rules out some worlds (job-file mode: parallel.tensor x
 * parallel.pipeline above 1, or train.global_batch): then an elastic round takes only the
 * nodes whose world it can use, and the others wait as spares. */
static bool layout_constrains(const agent *a)
{
    return a->spec->builtin_worker && !a->spec->layout &&
           (a->spec->tensor > 1 || a->spec->pipeline > 1 || a->spec->global_batch > 0);
}

/* The rendezvous's opts.world_usable (arg: the agent). */
static bool world_usable(void *arg, int world)
{
    const agent *a = arg;
    return dt_agent_world_usable(world, a->tensor, a->pipeline, a->spec->global_batch);
}

/* Whether this node's round has ended (the rendezvous says so; a poll that fails says not). */
static bool round_over(void *arg)
{
    agent *a = arg;
    dt_rdzv_status st;
    dt_err e = {0};
    return dt_rdzv_poll(a->rz, &st, &e) == 0 && st.state != DT_RDZV_RUNNING;
}

/* parallel.layout = auto on an elastic job: a round whose world is new gets its layout
 * (planned by group rank 0, shared with the others: agent_layout.h) before any worker starts;
 * the workers resume from the checkpoint at it. A layout that cannot be had ends the job as a
 * configuration error, as check_world_layout does. Returns 0, or the agent's exit code. */
static int plan_layout(agent *a)
{
    if (!a->spec->layout || a->rd.world_size == a->layout_world)
        return 0;
    dt_err e = {0};
    char keys[1024] = "";
    int rc = dt_agent_layout_round(a->spec->layout, a->spec->layout_arg, &a->rd, a->nproc,
                                   a->L.join_timeout, round_over, a, &a->tensor, &a->pipeline,
                                   keys, sizeof keys, &e);
    a->layout_pending = rc == -ECANCELED;
    if (rc == -ECANCELED) /* run_workers starts none and goes on to the next round */
        return 0;
    if (rc == 0) {
        if (a->layout_world)
            DT_INFO("parallel.layout = auto: the world changed from %d to %d ranks: the workers "
                    "resume from the latest checkpoint at the new layout (tensor %d x pipeline "
                    "%d)",
                    a->layout_world, a->rd.world_size, a->tensor, a->pipeline);
        dt_report_layout(&a->ev, a->rd.world_size, a->rd.group_world_size,
                         a->rd.group_rank == 0, keys, a->rd.attempt);
        a->layout_world = a->rd.world_size;
        return 0;
    }
    char why[DT_ERR_MSG_MAX + 128];
    fmt(why, sizeof why, "this round gathered %d node%s (%d ranks): %s; no worker was started",
        a->rd.group_world_size, a->rd.group_world_size == 1 ? "" : "s", a->rd.world_size, e.msg);
    DT_ERROR("%s", why);
    dt_err fe = {0};
    if (rc == -EINVAL) {
        if (dt_rdzv_abort_config(a->rz, NULL, 0, why, &fe))
            DT_DEBUG("cannot record the configuration error in the rendezvous: %s", fe.msg);
        emit_end(a, "setup_error", DT_EXIT_CONFIG);
        return DT_EXIT_CONFIG;
    }
    dt_rdzv_abort(a->rz, SIGTERM, &fe);
    emit_end(a, "agent_error", 1);
    return 1;
}

/* This node's files failed the launcher's check (spec->setup_error): the round gathered only
 * to end the job for every node as a configuration error, which names this node. Returns the
 * agent's exit code. */
static int end_setup_error(agent *a)
{
    char why[DT_ERR_MSG_MAX];
    fmt(why, sizeof why, "node %d (%s): %s; nothing was started", a->rd.group_rank,
        dt_hostname(), a->spec->setup_error);
    DT_ERROR("ending the job on every node: %s", why);
    dt_err fe = {0};
    if (dt_rdzv_abort_config(a->rz, NULL, 0, why, &fe))
        DT_WARN("cannot tell the other nodes about the configuration error: %s", fe.msg);
    emit_end(a, "setup_error", DT_EXIT_CONFIG);
    return DT_EXIT_CONFIG;
}

/* ---- the rounds: join, start and monitor, stop, decide ----------------------------------- */

/* What a phase of a round returns when the job goes on; any other value is the agent's exit
 * code (the job ended here). */
#define GOES_ON (-1)

/* The failures of the attempt before the rendezvous under way: when the restart cannot gather
 * every node, what made it necessary is the story, and the table shows them. */
typedef struct restart_cause {
    dt_rdzv_failure *f; /* owned; NULL when none */
    int n, attempt;
} restart_cause;

/* Join: the next round's rendezvous, into a->rd and *st. Returns GOES_ON when the round
 * gathered, else the exit code (a signal, a spare sent home, a job another node ended, nodes
 * whose settings disagree, a rendezvous that failed). Frees *cause either way. */
static int join_round(agent *a, restart_cause *cause, dt_rdzv_status *st)
{
    dt_err e = {0};
    int rc = dt_rdzv_next(a->rz, &a->rd, st, &e), code = GOES_ON;
    if (rc == -EINTR) {
        dt_err ae = {0};
        dt_rdzv_abort(a->rz, a->first_signal, &ae);
        emit_end(a, "signal", 128 + a->first_signal);
        code = 128 + a->first_signal;
    } else if (rc == -ECANCELED && st->state == DT_RDZV_SUCCEEDED) { /* an elastic job's spare */
        DT_INFO("%s", e.msg);
        emit_end(a, "succeeded", 0);
        code = 0;
    } else if (rc == -ECANCELED) {
        DT_ERROR("%s", e.msg);
        code = end_aborted(a, st);
    } else if (rc == -EINVAL) { /* the nodes' settings disagree: a restart cannot help */
        DT_ERROR("%s", e.msg);
        emit_end(a, "setup_error", DT_EXIT_CONFIG);
        code = DT_EXIT_CONFIG;
    } else if (rc) {
        DT_ERROR("rendezvous failed: %s", e.msg);
        if (cause->n > 0) {
            char head[256];
            fmt(head, sizeof head,
                "dtrain: the job failed: the restart after attempt %d could not gather every "
                "node (see above); what ended attempt %d:",
                cause->attempt, cause->attempt);
            print_table(a, cause->f, cause->n, head, 0);
        }
        emit_end(a, "rendezvous_failed", 1);
        code = 1;
    }
    free(cause->f);
    cause->f = NULL;
    cause->n = 0;
    return code;
}

/* A round gathered (t_join: when its rendezvous began): the run directory and events.jsonl
 * (first round), the banner and the "rendezvous" event, the world against the job's layout.
 * Returns GOES_ON or the exit code. */
static int begin_round(agent *a, bool first, double t_join)
{
    if (first) {
        dt_err e = {0};
        if (open_run_dir(a, &e))
            DT_WARN("%s; continuing without events.jsonl", e.msg);
    }
    round_banner(a, dt_now_s() - t_join);
    if (a->spec->setup_error)
        return end_setup_error(a);
    int rc = plan_layout(a);
    if (!rc && !a->layout_pending)
        rc = check_world_layout(a);
    if (!rc && !a->layout_pending)
        log_global_batch(a);
    return rc ? rc : GOES_ON;
}

/* Start and monitor: this node's workers run until the round ends, here or on any node; *out
 * says how and *st what the rendezvous said. Returns GOES_ON, or the exit code when the workers
 * could not be started. */
static int run_workers(agent *a, dt_rdzv_status *st, enum outcome *out)
{
    dt_err e = {0};
    if ((a->rd.group_world_size > 1 || a->rd.elastic) && dt_rdzv_poll(a->rz, st, &e) == 0 &&
        st->state != DT_RDZV_RUNNING) {
        /* The round ended before it started here (this agent joined late, or its auto layout
         * never came: a->layout_pending, which round_over saw ended): no workers. */
        a->layout_pending = false;
        *out = st->state == DT_RDZV_ABORTED   ? OUT_ABORTED
               : st->state == DT_RDZV_REGROUP ? OUT_REGROUP
                                              : OUT_REMOTE_FAILED;
        return GOES_ON;
    }
    if (a->layout_pending) { /* not reached: a poll keeps the end that round_over saw */
        a->layout_pending = false;
        fmt(st->why, sizeof st->why, "the round's layout never came");
        *out = OUT_LOST;
        return GOES_ON;
    }
    if (start_workers(a, &e)) {
        DT_ERROR("cannot start the workers: %s", e.msg);
        stop_workers(a, SIGKILL);
        finish_outputs(a);
        dt_err ae = {0};
        dt_rdzv_abort(a->rz, SIGTERM, &ae);
        emit_end(a, "agent_error", 1);
        return 1;
    }
    *out = monitor(a, st);
    return GOES_ON;
}

/* This node's workers failed: their failures go to the rendezvous (as a configuration error,
 * which ends the job on every node, or as a failure) and to events.jsonl. Returns the exit code
 * of a failure a restart would repeat (unrepeatable()), else 0; *out becomes OUT_REGROUP when an
 * elastic round had ended first for a membership change (which then decides, and the failure
 * spends no restart). */
static int record_failure(agent *a, dt_rdzv_status *st, enum outcome *out)
{
    dt_rdzv_failure *lf = NULL;
    int nlf = local_failures(a, &lf);
    dt_err fe = {0};
    int fatal = unrepeatable(a);
    bool config = fatal != 0;
    if (config) {
        /* A restart would repeat it, on whatever node: the job ends everywhere (as a setup
         * error), and the other nodes are told which node to look at. */
        char why[256];
        fmt(why, sizeof why,
            "node %d (%s:%d) reports %s (exit %d) in its workers: not restarting; see that "
            "node's log",
            a->rd.group_rank, dt_hostname(), (int)getpid(), unrepeatable_what(fatal), fatal);
        if (dt_rdzv_abort_config(a->rz, lf, nlf, why, &fe))
            DT_WARN("cannot record the configuration error in the rendezvous: %s", fe.msg);
    } else if (nlf > 0 && dt_rdzv_failed(a->rz, lf, nlf, &fe)) {
        DT_WARN("cannot record the failure in the rendezvous: %s", fe.msg);
    }
    dt_report_failures(&a->ev, lf, nlf, a->rd.attempt);
    free(lf);
    if (!config && a->rd.elastic && dt_rdzv_poll(a->rz, st, &fe) == 0 &&
        st->state == DT_RDZV_REGROUP)
        *out = OUT_REGROUP;
    return fatal;
}

/* Stop: this node's workers are stopped as the outcome asks; the outcomes that end the job end
 * it here. Returns GOES_ON after a failure or a regroup (decide() goes on), else the exit code.
 * *fatal: the exit code of this node's failed workers' unrepeatable failure, else 0. */
static int stop_round(agent *a, enum outcome *out, dt_rdzv_status *st, int *fatal)
{
    char name[32];
    dt_err ae = {0};
    dt_agent_flight_stopping(a->fl, *out == OUT_FAILED && a->n_failed > 0);
    switch (*out) {
    case OUT_SUCCEEDED:
        stop_workers(a, SIGTERM); /* leftovers of the workers' process groups only */
        finish_outputs(a);
        DT_INFO("all workers succeeded%s", a->rd.group_world_size > 1 ? " on every node" : "");
        emit_end(a, "succeeded", 0);
        return 0;
    case OUT_FAILED:
        *fatal = record_failure(a, st, out);
        DT_WARN("stopping the other workers%s", a->rd.group_world_size > 1 ? " on every node" : "");
        stop_workers(a, SIGTERM);
        break;
    case OUT_REMOTE_FAILED:
    case OUT_REGROUP:
        DT_WARN("%s: stopping the workers of this node", st->why[0] ? st->why : "the round ended");
        stop_workers(a, SIGTERM);
        break;
    case OUT_SIGNAL:
        if (dt_rdzv_abort(a->rz, a->first_signal, &ae))
            DT_DEBUG("abort: %s", ae.msg);
        stop_workers(a, a->first_signal);
        finish_outputs(a);
        if (a->first_signal == SIGTERM && all_preempted(a))
            return preempted(a, a->first_signal);
        DT_WARN("stopped by %s", dt_report_signame(a->first_signal, name, sizeof name));
        emit_end(a, "signal", 128 + a->first_signal);
        return 128 + a->first_signal;
    case OUT_PREEMPTED: {
        /* No signal here: the workers were signalled themselves, or stopped with those of a
         * node that was (Slurm signals the nodes one at a time), whose abort names the signal;
         * else this node's abort tells the others (a signal to one worker preempts the job). */
        int sig = a->preempt_sig;
        dt_rdzv_status ab = {0};
        bool multi = a->rd.group_world_size > 1 || a->rd.elastic;
        for (double until = dt_now_s() + 2 + 2 * a->L.monitor_interval;
             !sig && multi && dt_rdzv_poll(a->rz, &ab, &ae) == 0 &&
             ab.state == DT_RDZV_RUNNING && dt_now_s() < until;)
            dt_sleep_ms(50);
        if (!sig && ab.state == DT_RDZV_ABORTED)
            sig = ab.signal;
        else if (a->rd.group_world_size > 1 && dt_rdzv_abort(a->rz, sig ? sig : SIGTERM, &ae))
            DT_DEBUG("abort: %s", ae.msg);
        stop_workers(a, SIGTERM); /* leftovers of the workers' process groups only */
        finish_outputs(a);
        return preempted(a, sig);
    }
    case OUT_ABORTED:
        if (st->setup_error) { /* the error is the news; stopping is routine */
            DT_ERROR("%s", st->why);
            DT_WARN("stopping the workers of this node");
        } else {
            DT_WARN("%s: stopping the workers of this node", st->why);
        }
        stop_workers(a, SIGTERM);
        finish_outputs(a);
        if ((st->signal == SIGTERM || st->signal == SIGUSR1 || st->signal == SIGUSR2) &&
            all_preempted(a))
            return preempted(a, st->signal);
        return end_aborted(a, st);
    case OUT_LOST:
        /* Cut off, or the store's host is gone: the others give this node up after
         * heartbeat_timeout, and its workers, likely blocked in a collective whose peers went
         * silent, get at most half of it: the node never trains on alone. */
        DT_ERROR("this node is out of the job (it cannot reach the rendezvous: this host may be "
                 "cut off from the network, and the other nodes then go on without it): "
                 "stopping its workers");
        a->L.stop_grace = DT_MIN(a->L.stop_grace, DT_MAX(a->L.heartbeat_timeout / 2, 0.5));
        stop_workers(a, SIGTERM);
        finish_outputs(a);
        emit_end(a, "lost_rendezvous", 1);
        return 1;
    }
    finish_outputs(a);
    return GOES_ON;
}

/* Decide, the workers stopped after a failure or a regroup: a signal that came meanwhile, or
 * another node's end of the job, ends it here; a regroup joins the next round; a failure
 * restarts the job while the budget lasts (*cause keeps its failures for the next join), else
 * ends it with the root-cause table. Returns GOES_ON or the exit code. */
static int decide(agent *a, enum outcome out, const dt_rdzv_status *st, int fatal,
                  restart_cause *cause)
{
    bool config = fatal != 0;
    if (a->first_signal) { /* a signal arrived while the workers were stopping */
        dt_err ae = {0};
        dt_rdzv_abort(a->rz, a->first_signal, &ae);
        emit_end(a, "signal", 128 + a->first_signal);
        return 128 + a->first_signal;
    }
    if (!config && (a->rd.group_world_size > 1 || a->rd.elastic)) {
        /* Another node may have ended the job meanwhile (its workers report a configuration
         * error): that wins over the next attempt. */
        dt_err pe = {0};
        dt_rdzv_status ab;
        if (dt_rdzv_poll(a->rz, &ab, &pe) == 0 && ab.state == DT_RDZV_ABORTED) {
            if (ab.setup_error)
                DT_ERROR("%s", ab.why);
            else
                DT_WARN("%s", ab.why);
            return end_aborted(a, &ab);
        }
    }
    if (out == OUT_REGROUP) {
        DT_INFO("the job's nodes change: joining the next round (restart count unchanged)");
        dt_report_regroup(&a->ev, st->why, a->rd.attempt);
        return GOES_ON;
    }
    bool final = a->rd.attempt >= a->rd.max_restarts;
    if (!final && config)
        DT_WARN("not restarting: the workers report %s (exit %d), which a restart would "
                "repeat%s",
                unrepeatable_what(fatal), fatal,
                a->rd.group_world_size > 1 || a->rd.elastic ? "; the job ends on every node" : "");
    dt_err fe = {0};
    if (final || config) {
        dt_rdzv_failure *all = NULL;
        int n = 0;
        if (dt_rdzv_failures(a->rz, &all, &n, &fe))
            DT_WARN("cannot read the job's failures: %s", fe.msg);
        print_table(a, all, n, NULL, fatal);
        free(all);
        emit_end(a, "failed", config ? fatal : 1);
        return config ? fatal : 1;
    }
    cause->attempt = a->rd.attempt;
    if (dt_rdzv_failures(a->rz, &cause->f, &cause->n, &fe))
        cause->n = 0;
    DT_WARN("restarting every worker%s (restart %d of --max-restarts=%d)",
            a->rd.group_world_size > 1 ? " on every node" : "", a->rd.attempt + 1,
            a->rd.max_restarts);
    dt_report_restart(&a->ev, a->rd.attempt + 1);
    return GOES_ON;
}

/* Runs rounds until the job ends; returns the exit code. A round: join -> begin -> start and
 * monitor the workers -> stop -> decide (see the comment at the top). */
static int run_rounds(agent *a)
{
    restart_cause cause = {0};
    for (bool first = true;; first = false) {
        dt_rdzv_status st;
        enum outcome out = OUT_SUCCEEDED;
        int fatal = 0;
        double t_join = dt_now_s();
        int code = join_round(a, &cause, &st);
        if (code == GOES_ON)
            code = begin_round(a, first, t_join);
        if (code == GOES_ON)
            code = run_workers(a, &st, &out);
        if (code == GOES_ON)
            code = stop_round(a, &out, &st, &fatal);
        if (code == GOES_ON)
            code = decide(a, out, &st, fatal, &cause);
        if (code != GOES_ON) {
            free(cause.f);
            return code;
        }
    }
}

int dt_agent_run(const dt_agent_spec *spec, dt_err *err)
{
    int code = 1, rc;
    char why[512];
    dt_err e = {0};
    agent *a = calloc(1, sizeof *a);
    if (!a)
        return dt_err_set(err, -ENOMEM, "out of memory");
    a->spec = spec;
    a->builtin_worker = spec->builtin_worker;
    a->L = spec->launch;
    a->sfd = a->epfd = -1;
    a->tensor = spec->tensor;
    a->pipeline = spec->pipeline;
    dt_events_init(&a->ev, a->L.node_rank > 0 ? a->L.node_rank : 0);

    if (!spec->argv || !spec->argv[0]) {
        fprintf(stderr, "dtrain: no command to run\n");
        code = DT_EXIT_CONFIG;
        goto out;
    }
    if (dt_agent_apply_rdzv_conf(&a->L, &e)) {
        fprintf(stderr, "dtrain: %s\n", e.msg);
        code = DT_EXIT_CONFIG;
        goto out;
    }
    if (a->L.standalone && dt_agent_standalone_conflict(a->L.nnodes)) {
        fprintf(stderr,
                "dtrain: --standalone runs a job on this one node, but --nnodes=%s asks for more: "
                "drop --standalone and give every node --master-addr/--master-port (or "
                "--rdzv-endpoint), or drop --nnodes\n",
                a->L.nnodes);
        code = DT_EXIT_CONFIG;
        goto out;
    }
    if (dt_agent_resolve_nproc(&a->L.nproc_per_node, &a->nproc, why, sizeof why, &e)) {
        fprintf(stderr, "dtrain: %s\n", e.msg);
        code = DT_EXIT_CONFIG;
        goto out;
    }
    if (dt_proc_resolve(spec->argv[0], NULL, a->prog, sizeof a->prog, &e)) {
        fprintf(stderr, "dtrain: %s\n", e.msg);
        code = DT_EXIT_CONFIG;
        goto out;
    }
    if (!(a->w = calloc((size_t)a->nproc, sizeof *a->w))) {
        code = dt_err_set(err, -ENOMEM, "out of memory for %d workers", a->nproc);
        goto out;
    }
    /* Order matters: signals blocked before any thread exists; the guardian forked before the
     * store's thread; then the rendezvous (which may start that thread). */
    if ((rc = dt_out_console_open(err))) {
        code = rc;
        goto out;
    }
    dt_out_console_take_logs();
    if ((rc = dt_agent_signals_init(a, err))) {
        code = rc;
        goto out;
    }
    char cgwhy[512];
    if (dt_cgroup_open(&a->cg, cgwhy, sizeof cgwhy) == 0)
        DT_DEBUG("the workers' cgroup: %s", dt_cgroup_path(a->cg));
    else
        DT_DEBUG("no cgroup for the workers (%s): a daemon a worker starts outlives a SIGKILL of "
                 "the agent",
                 cgwhy);
    if ((rc = dt_guard_start(&a->guard, dt_cgroup_path(a->cg), err)) ||
        (rc = dt_proc_become_subreaper(err)) || (rc = dt_agent_log_root(&a->L, a->spec->builtin_worker ? a->spec->output_dir : NULL,
                                 a->log_root, sizeof a->log_root, &a->log_tmp, err))) {
        code = rc;
        goto out;
    }
    if (a->L.nproc_per_node.kind != DT_NPROC_NUMBER) /* a count the agent made: say which */
        DT_INFO("--nproc-per-node=%s: %s", dt_nproc_name(a->L.nproc_per_node.kind), why);
    a->omp_one = a->nproc > 1 && !getenv("OMP_NUM_THREADS");
    if (a->omp_one)
        DT_INFO("setting OMP_NUM_THREADS=1 for each of the %d workers to avoid oversubscribing "
                "the CPUs; set it yourself to tune",
                a->nproc);
    dt_report_agent_start(&a->ev, (int)getpid(), dt_hostname(), a->nproc, a->prog);

    dt_rdzv_opts ro;
    dt_agent_rdzv_opts(&a->L, a->nproc, dt_agent_rdzv_interrupted, a, &ro);
    ro.job = spec->job_shared;
    ro.ending = spec->setup_error != NULL; /* it comes only to end the job: see end_setup_error */
    if (layout_constrains(a)) {
        ro.world_usable = world_usable;
        dt_agent_warn_worlds(a->L.nnodes, a->nproc, spec->tensor, spec->pipeline,
                             spec->global_batch);
    }
    rc = dt_rdzv_open(&a->rz, &ro, &e);
    if (rc == -EINTR) {
        code = 128 + a->first_signal;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "dtrain: %s\n", e.msg);
        code = rc == -EINVAL || rc == -ENOTSUP ? DT_EXIT_CONFIG : DT_EXIT_FAILED;
        goto out;
    }
    code = run_rounds(a);

out:
    a->closing = true;
    dt_agent_flight_free(a->fl);
    dt_rdzv_close(a->rz);
    dt_events_close(&a->ev);
    if (a->log_tmp && !a->run_dir[0])
        rmdir(a->log_root); /* ended before the first round: nothing was written */
    else if (a->log_tmp && code == 0 && !dt_agent_writes_files(&a->L))
        dt_rm_rf(a->log_root, NULL);
    else if (a->log_tmp && code != 0)
        DT_INFO("logs kept in %s", a->run_dir);
    else if (a->log_tmp)
        DT_INFO("worker output files kept in %s", a->run_dir);
    if (a->guard) {
        /* Every path out has stopped the workers; what is left is what escaped them. */
        dt_agent_reap(a);
        if (signal_strays(a, SIGKILL))
            DT_DEBUG("killed processes the workers left behind");
        dt_cgroup_close(a->cg);
        a->cg = NULL;
        dt_agent_reap(a);
        dt_guard_stop(a->guard);
    }
    dt_cgroup_close(a->cg);
    dt_out_console_drain_logs();
    dt_log_set_sink(NULL);
    dt_out_console_close(5.0);
    dt_agent_signals_restore(a);
    free(a->w);
    free(a);
    return code;
}
