/* agent_report.h - what the agent leaves for people and tools: events.jsonl and the root-cause
 * table printed when a job fails.
 *
 * events.jsonl has one JSON object per line, appended with one write each:
 *   {"time": 1700000000.123, "node": 0, "event": "start", "rank": 3, ...}
 * Events: agent_start, rendezvous, start, exit, failure, restart, signal, stop, end. Events
 * emitted before the file can be opened (the run id is known only after the first rendezvous)
 * are kept and written when it opens.
 */
#ifndef DT_AGENT_REPORT_H
#define DT_AGENT_REPORT_H

#include <cJSON.h>
#include <stddef.h>

#include "common/err.h"
#include "rendezvous/rdzv.h"

typedef struct dt_events {
    int fd;          /* -1 until opened */
    int node;        /* group rank written into every event */
    cJSON *pending;  /* events emitted before the file was opened (owned) */
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
/* Emits one event. fields (may be NULL) is taken over: its members are added after "time",
 * "node" and "event". */
void dt_events_emit(dt_events *ev, const char *event, cJSON *fields);
void dt_events_close(dt_events *ev);

/* "SIGSEGV" for 11; "SIG42" when unnamed. Returns buf. */
const char *dt_report_signame(int sig, char *buf, size_t cap);

/* One phrase for a wait status: "exited with code 3", "killed by SIGSEGV (Segmentation fault)". */
void dt_report_describe_status(int exit_code, int sig, char *buf, size_t cap);

/* The root-cause table: failures f[0..n) with f[0] the root cause; headline is the first line
 * after the rule. Returns a malloc'd string (caller frees), or NULL without memory. */
char *dt_report_table(const dt_rdzv_failure *f, int n, const char *headline, const char *footer);

/* JSON object of one failure (for events). */
cJSON *dt_report_failure_json(const dt_rdzv_failure *f);

#endif
