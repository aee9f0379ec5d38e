/* agent_report.h - what the agent leaves for people and tools: events.jsonl and the root-cause
 * table printed when a job fails.
 *
 * events.jsonl has one JSON object per line, appended with one write each:
 *   {"time": 1700000000.123, "node": 0, "event": "start", "rank": 3, ...}
 * Events: agent_start, rendezvous, start, stopped, continued, exit, signal, failure, regroup,
 * restart, hang, flight_dump, straggler, straggler_recovered, end (one function each, below). Events
 * emitted before the file can be opened (the run id is known only after the first rendezvous)
 * are kept and written when it opens.
 */
#ifndef DT_AGENT_REPORT_H
#define DT_AGENT_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rendezvous/rdzv.h"

typedef struct dt_events {
    int fd;                 /* -1 until opened */
    int node;               /* group rank written into every event */
    struct cJSON *pending;  /* events emitted before the file was opened (owned) */
} dt_events;

void dt_events_init(dt_events *ev, int node);
/* The name of an agent's events file in the run directory, unique per agent when several share
 * a --log-dir: "events.jsonl" for node 0 of a static job and for the group rank 0 of an elastic
 * job's round 0 (one agent each); "events_node<K>.jsonl" for node K > 0 of a static job (node
 * ranks are unique); "events_node<K>_<host>_<pid>.jsonl" for any other agent of an elastic job,
 * whose group rank is given anew every round (K: its rank in its first round). */
void dt_events_filename(char *out, size_t cap, int group_rank, bool elastic, int round,
                        const char *host, int pid);
/* Opens path for appending (creating it) and writes the pending events. */
int dt_events_open(dt_events *ev, const char *path, dt_err *err);
void dt_events_close(dt_events *ev);

/* ---- the events, one function each ------------------------------------------------------
 * Each writes one line with "time", "node", "event" and then the fields named here, in this
 * order. Times are wall-clock seconds, durations rounded to the millisecond. */

/* "agent_start": pid, host, nproc, program. */
void dt_report_agent_start(dt_events *ev, int pid, const char *host, int nproc,
                           const char *program);
/* "rendezvous" (a round began): round, attempt, group_rank, group_world_size, rank_base,
 * local_world_size, world_size, master_addr, master_port, run_id, duration_s (took_s: how long
 * the rendezvous took). */
void dt_report_round_start(dt_events *ev, const dt_rdzv_round *r, double took_s);
/* "start" (a worker was started): rank, local_rank, pid, attempt. */
void dt_report_worker_start(dt_events *ev, int rank, int local_rank, int pid, int attempt);
/* "stopped" (stop_sig > 0: the worker was stopped by that signal; rank, pid, signal) or
 * "continued" (stop_sig 0: rank, pid). */
void dt_report_worker_paused(dt_events *ev, int rank, int pid, int stop_sig);
/* "exit" (a worker was reaped): rank, local_rank, pid, attempt, exit_code (-n when killed by
 * signal n), signal (only then), state ("succeeded", "failed", "preempted", "stopped"),
 * duration_s. status is the wait status. */
void dt_report_worker_exit(dt_events *ev, int rank, int local_rank, int pid, int attempt,
                           int status, const char *state, double duration_s);
/* "signal" (the agent received one): signal (its name), action ("forwarded", "stop", "kill",
 * "ignored (already stopping)"). */
void dt_report_signal(dt_events *ev, int sig, const char *action);
/* "failure" (this node's workers failed): failures (f[0..n), as dt_report_failure_json: their
 * times, hosts, ranks, exit codes, messages), attempt. */
void dt_report_failures(dt_events *ev, const dt_rdzv_failure *f, int n, int attempt);
/* "regroup" (an elastic job's membership changed): why, attempt. */
void dt_report_regroup(dt_events *ev, const char *why, int attempt);
/* "layout" (parallel.layout = auto on an elastic job: the layout of a round whose world is
 * new): world, nodes, planned (true: this node planned it; false: it applied group rank 0's),
 * keys (the plan's keys, "plan.global_batch=8 parallel.tensor=1 ..."), attempt. */
void dt_report_layout(dt_events *ev, int world, int nodes, bool planned, const char *keys,
                      int attempt);
/* "restart": attempt (the one that starts next). */
void dt_report_restart(dt_events *ev, int attempt);
/* "end" (the agent's last event): result, exit_code, attempt, agent_max_rss_kb (this process's
 * peak RSS, when getrusage tells it), console_lines_dropped. */
void dt_report_end(dt_events *ev, const char *result, int exit_code, int attempt,
                   uint64_t console_lines_dropped);

/* "hang" (a hang verdict, runtime/launch/agent_flight.c; "flight_dump" for a requested dump
 * that found none): fields (taken over) as dt_verdict's event (flight_verdict.h), plus dump. */
void dt_report_hang(dt_events *ev, const char *event, struct cJSON *fields);
/* "straggler" (recovered false) or "straggler_recovered": rank, node, ratio (its compute time
 * per step over the median rank's), first_step, last_step (the window), compute_ms and
 * median_ms (per step). */
void dt_report_straggler(dt_events *ev, bool recovered, int rank, int node, double ratio,
                         int64_t first_step, int64_t last_step, double compute_ms,
                         double median_ms);

/* The exit_code of a failure record that names a hang verdict's culprit: a rank that did not
 * exit by itself (stopped, stuck or gone quiet) but that the verdict found the cause. */
#define DT_REPORT_HANG_CULPRIT (-1)

/* "SIGSEGV" for 11; "SIG42" when unnamed. Returns buf. */
const char *dt_report_signame(int sig, char *buf, size_t cap);

/* One phrase for a wait status: "exited with code 3", "killed by SIGSEGV (Segmentation fault)". */
void dt_report_describe_status(int exit_code, int sig, char *buf, size_t cap);

/* The root-cause table: failures f[0..n) with f[0] the root cause; headline is the first line
 * after the rule. Returns a malloc'd string (caller frees), or NULL without memory. */
char *dt_report_table(const dt_rdzv_failure *f, int n, const char *headline, const char *footer);

/* The table of a job that ends failed on this node: headline (NULL: one made from f[0], or "the
 * job failed" when n is 0), each with why it ends rather than restarts (fatal: the exit code of
 * a failure a restart would repeat, DT_EXIT_OOM out of device memory or DT_EXIT_CONFIG a
 * configuration error; 0: --max-restarts=max_restarts spent at attempt), and a footer naming
 * run_dir. Returns a malloc'd string (caller frees), or NULL without memory. */
char *dt_report_job_failed(const dt_rdzv_failure *f, int n, const char *headline, int fatal,
                           int attempt, int max_restarts, const char *run_dir);

#endif
