/* agent_loop.h - the agent's state (one struct for the whole node: its workers, the round, the
 * epoll set) and its event loop: the signals it acts on (a signalfd), reaping the workers, and
 * pumping their output and the console. agent.c runs the rounds over these; nothing outside
 * runtime/launch/agent*.c includes this header.
 *
 * One thread does everything, driven by one epoll set (see agent.c): the signalfd for SIGCHLD
 * and the signals the agent acts on, and the read ends of the workers' stdout and stderr pipes.
 */
#ifndef DT_AGENT_LOOP_H
#define DT_AGENT_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

#include "common/err.h"
#include "rendezvous/rdzv.h"
#include "runtime/job/config.h"
#include "runtime/launch/agent_flight.h"
#include "runtime/launch/agent_output.h"
#include "runtime/launch/agent_proc.h"
#include "runtime/launch/agent_report.h"

enum wstate { W_NONE, W_RUNNING, W_SUCCEEDED, W_FAILED, W_STOPPED, W_PREEMPTED };

/* Exit codes (runtime/job/workenv.h): DT_EXIT_PREEMPTED, the built-in worker's "checkpoint
 * saved, run me again" after a stop signal; DT_EXIT_CONFIG, a configuration error. */

/* How a round ended, as the monitor saw it. */
enum outcome { OUT_SUCCEEDED, OUT_FAILED, OUT_REMOTE_FAILED, OUT_REGROUP, OUT_SIGNAL, OUT_ABORTED,
               OUT_LOST, OUT_PREEMPTED };

typedef struct worker {
    int local_rank, rank;
    pid_t pid;              /* leader pid == pgid; 0 when not started */
    bool running;           /* the leader has not been reaped */
    bool group;             /* its process group may still have members (the guardian knows it) */
    enum wstate state;
    int status;             /* wait status of the leader */
    double t_start, t_end;  /* wall clock */
    char dir[DT_PATH_MAX];  /* <log dir>/<run id>/attempt_<k>/<rank> */
    char error_file[DT_PATH_MAX + 16];
    char message[512];      /* why it could not be started, if so */
    dt_out_stream out[2];   /* stdout, stderr */
} worker;

typedef struct agent {
    const struct dt_agent_spec *spec; /* agent.h (borrowed) */
    bool builtin_worker;        /* spec->builtin_worker */
    dt_launch L;                /* copy of the launcher settings */
    int nproc;                  /* workers on this node */
    char prog[DT_PATH_MAX];     /* the program every worker execs (resolved once) */
    int sfd, epfd;              /* the signalfd, the epoll set */
    sigset_t oldmask;
    struct sigaction oldpipe;
    bool signals_set, hup_ignored; /* hup_ignored: SIGHUP ignored at start (nohup) stays so */
    dt_guard *guard;
    dt_cgroup *cg;              /* the workers' cgroup v2, or NULL where none can be made */
    dt_rdzv *rz;
    dt_rdzv_round rd;           /* the current round */
    worker *w;                  /* nproc of them */
    int n_running;              /* leaders not yet reaped */
    int n_groups;               /* process groups not yet empty */
    int n_failed, n_succeeded;  /* of the current round, before any stop began */
    int n_preempted;            /* of the current round: exited 75 (built-in: saved, stopped) */
    int preempt_sig;            /* SIGUSR1/SIGUSR2 forwarded in this round, else 0 */
    bool stopping;              /* a stop is under way: exits are no longer failures */
    int first_signal;           /* the first INT/TERM/HUP/QUIT received (its 128+n is the code) */
    bool kill_now;              /* a second Ctrl-C: SIGKILL without waiting */
    bool omp_one;               /* give workers OMP_NUM_THREADS=1 */
    char log_root[DT_PATH_MAX]; /* --log-dir, or the default */
    bool log_tmp;               /* log_root is a temporary directory this agent made */
    char run_dir[DT_PATH_MAX + 300]; /* <log_root>/<run id> */
    dt_events ev;
    bool closing;
    bool out_paused;            /* the console is behind: workers' pipes are out of the epoll set */
    bool con_watched[3];        /* console fd 1 / 2 is in the epoll set for EPOLLOUT */
    int batch_world;            /* the world size of the last global batch said (0 = none) */
    int tensor, pipeline;       /* the layout's T and P (spec's, or the last auto plan's) */
    int layout_world;           /* the world of the last auto plan (0 = none) */
    bool layout_pending;        /* this round ended before its auto layout came: no workers */
    dt_agent_flight *fl;        /* flight records, hang verdicts, stragglers (agent_flight.h) */
} agent;

/* Blocks the handled signals (SIGHUP left alone when ignored at start: nohup), ignores SIGPIPE,
 * and makes the signalfd and the epoll set. Call it before any thread exists. */
int dt_agent_signals_init(agent *a, dt_err *err);
/* Closes the signalfd and the epoll set and restores the signal mask. */
void dt_agent_signals_restore(agent *a);
/* Reaps every child that exited (workers, the guardian, adopted orphans) and updates the
 * workers' states and the round's counts. */
void dt_agent_reap(agent *a);
/* Sends sig to every worker process group that may still have members. */
void dt_agent_signal_groups(agent *a, int sig);
/* Waits up to timeout_ms (-1 = no limit) for a signal, worker output or a writable console, and
 * handles what came. */
void dt_agent_pump(agent *a, int timeout_ms);
/* The rendezvous's interrupt check (dt_rdzv_opts.interrupted; arg is the agent): handles
 * pending signals, feeds the console; true once a stop signal came. */
bool dt_agent_rdzv_interrupted(void *arg);

#endif
