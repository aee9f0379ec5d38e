/* agent_flight.h - the agent's side of the flight records: the mappings its workers write
 * (runtime/job/flightrec.h), the triggers of a hang verdict, the gathering of every node's
 * records through the store, node 0's verdict (runtime/launch/flight_verdict.h), the step
 * watchdog and the straggler scores.
 *
 * Triggers (docs/failures.md): a worker of this node fails in the comm layer (a collective that
 * timed out, a mismatch, a peer that is gone); the step watchdog (train.step_timeout: none of
 * this node's ranks finished a step for that long); SIGUSR1 to this agent; `dtrain debug dump
 * RUN_DIR` (a file flight/request in the run directory). A trigger is a dump number n in the
 * store, under a prefix of the round's own ("dtrain-flight/<run id>/r<round>-<master port>/"):
 * every agent, polling it every DT_AGENT_FLIGHT_TICK_S, snapshots its workers' records with
 * their process state from /proc (state letter, wait channel), writes
 * <run dir>/flight/rank_<N>.json and publishes a summary (the last records of each group) as
 * sum/<n>/<node>. Node 0's agent waits up to DT_AGENT_FLIGHT_ANSWER_S for every node's summary
 * (a node that does not answer is lost), makes the verdict, logs it (lines beginning
 * "hang verdict:"), writes flight/verdict.txt and flight/verdict.json (the verdict's whole
 * input, which `dtrain debug analyze` reads) and the "hang" event, and publishes it (every
 * agent writes its flight/verdict.txt). After a failure or the watchdog (not after a request),
 * node 0 records the culprits as the round's failures (dt_rdzv_failed, at the time the hang
 * began, so the root-cause table names them first) and the round fails: stop, restart while
 * the budget lasts. Only the first failure trigger of a round makes a dump (the others answer
 * it); the agent whose worker failed waits for the verdict before it tells the rendezvous, so
 * no worker is stopped before its records and process state were taken.
 *
 * Stragglers: every worker writes its compute and wait time per window of train.straggler_window
 * steps; each agent publishes the windows all its ranks completed, and node 0 scores every rank
 * against the median (the lower median for an even count: with two ranks, the faster one),
 * from the second window of a round on (the first holds start-up).
 *
 * Best effort: a mapping or a store call that fails is a warning, never a failed job. Not
 * thread-safe: the agent's thread calls everything.
 */
#ifndef DT_AGENT_FLIGHT_H
#define DT_AGENT_FLIGHT_H

#include <stdbool.h>

#include "rendezvous/rdzv.h"
#include "runtime/launch/agent_report.h"

#define DT_AGENT_FLIGHT_TICK_S 0.2   /* how often an agent looks for triggers */
#define DT_AGENT_FLIGHT_ANSWER_S 2.0 /* how long node 0 waits for the other nodes' records */
#define DT_AGENT_FLIGHT_VERDICT_S 5.0 /* how long an agent whose worker failed waits for it */
#define DT_AGENT_FLIGHT_STRAGGLER_MS 1.0 /* a straggler's median step also takes at least this
                                           much more compute than the median rank's: below it,
                                           steps of tenths of a millisecond, scheduling noise
                                           is all there is to see */
#define DT_AGENT_FLIGHT_ACK_S 0.6     /* ... when node 0's agent has not taken the dump up by then:
                                         no longer (it is gone or stuck) */

typedef struct dt_agent_flight_opts {
    int records;            /* train.flight_records; 0 = no flight records (a command's workers) */
    double step_timeout;    /* train.step_timeout (0 = off) */
    double straggler_ratio; /* train.straggler_ratio (0 = no scores) */
    int straggler_window;   /* train.straggler_window */
} dt_agent_flight_opts;

typedef struct dt_agent_flight dt_agent_flight;

/* A round begins (before its workers start): *fl is made on the first call (stays NULL when
 * o->records is 0: every call below accepts NULL and does nothing), the last round's mappings are
 * closed and nproc new ones made, the store reached at the round's address, and this node
 * published (host, pid, first rank, workers). run_dir: <log dir>/<run id>; ev, rz: the agent's,
 * borrowed. */
void dt_agent_flight_round(dt_agent_flight **fl, const dt_agent_flight_opts *o,
                           const dt_rdzv_round *rd, int nproc, const char *run_dir,
                           dt_events *ev, dt_rdzv *rz);

/* The descriptor worker local_rank inherits (dt_proc_spec.fd_keep, DTRAIN_FLIGHT_FD), 0 = none. */
int dt_agent_flight_fd(const dt_agent_flight *fl, int local_rank);

/* The monitor's tick, called every time round its loop: looks for triggers and requests, runs
 * the watchdog and the straggler scores when due; *ms (the monitor's next wait, -1 = none) is
 * cut to the next tick. Returns true (once) when this node's verdict failed the round (node 0,
 * after the watchdog or another node's trigger): the monitor ends the round as failed. */
bool dt_agent_flight_tick(dt_agent_flight *fl, int *ms);

/* A signal the agent got: SIGUSR1 asks for a dump and a verdict (made before the agent
 * forwards it: this node's records are taken at once, and node 0 waits for the others' up to
 * DT_AGENT_FLIGHT_ANSWER_S); any other signal does nothing here. */
void dt_agent_flight_signal(dt_agent_flight *fl, int sig);

/* The round is ending, before this node's workers are stopped: with local_failed (this node's
 * workers failed) a comm failure among them triggers a dump and this returns once the verdict
 * is out (or after DT_AGENT_FLIGHT_VERDICT_S); otherwise a dump another node asked for is
 * answered first, so the records and process states are taken before the stop. */
void dt_agent_flight_stopping(dt_agent_flight *fl, bool local_failed);

/* Closes the mappings and the store connection. Accepts NULL. */
void dt_agent_flight_free(dt_agent_flight *fl);

#endif
