/* rdzv_round.h - the round logic the elastic backends (rdzv_c10d.c, rdzv_etcd.c) share, apart
 * from the transport (rdzv_round.c): what a round's end and the job's end mean as a status, when
 * an end ends the job, and the local status a node keeps when it fails or ends the job. Their
 * records differ (c10d's text in the store, etcd's JSON), so each backend decodes its own and
 * hands the decoded fields here. Nothing here does I/O.
 */
#ifndef DT_RDZV_ROUND_H
#define DT_RDZV_ROUND_H

#include <stdbool.h>
#include <stddef.h>

#include "rendezvous/rdzv_types.h"

/* A round's end as a status: *st = {state, node, signal (sig > 0, else 0), setup_error (an
 * ABORTED end with sig < 0: a configuration error), why}. */
void dt_rdzv_round_end_status(dt_rdzv_state state, int node, int sig, const char *why,
                              dt_rdzv_status *st);

/* Whether a round that ended as *end (dt_rdzv_round_end_status) ends the job: a success, an
 * abort, or a failure once the restart budget is spent (attempt >= max_restarts). */
bool dt_rdzv_round_ends_job(const dt_rdzv_status *end, int attempt, int max_restarts);

/* The job's final record (code, kind, node, sig, why) as a status: SUCCEEDED (code 0), FAILED
 * (kind "fail": the budget is spent), else ABORTED (by a signal, a rendezvous that could not
 * form, or a configuration error, kind "config": setup_error). */
void dt_rdzv_round_final_status(int code, const char *kind, int node, int sig, const char *why,
                                dt_rdzv_status *st);

/* This node's round ended with this node among the lost (frozen or cut off for too long: the
 * others went on): ended->why says so, with the end's own why (end_why) in brackets. */
void dt_rdzv_round_declared_lost(dt_rdzv_status *ended, const char *end_why);

/* The why of a failure report (f[0..n), from node g): "rank R on node N (HOST) failed", "node N
 * (HOST) was lost" (f[0].rank < 0), or "node G failed" (n == 0). */
void dt_rdzv_round_failure_why(const dt_rdzv_failure *f, int n, int g, char *why, size_t cap);

/* A failure this node reports outside a round (or with the backend unreachable): *ended becomes
 * FAILED by node g with why, unless it has ended already. */
void dt_rdzv_round_failed_here(dt_rdzv_status *ended, int g, const char *why);

/* This node ends the job (a signal: sig > 0; a configuration error: sig < 0): *ended becomes
 * that ABORTED end (node: this node's group rank, -1 outside a round) unless the round had
 * already ended for good (SUCCEEDED, ABORTED). */
void dt_rdzv_round_abort_here(dt_rdzv_status *ended, int node, int sig, const char *why);

#endif
