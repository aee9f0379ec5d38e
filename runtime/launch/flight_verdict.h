/* flight_verdict.h - the hang verdict: from every rank's flight records (as the agents collect
 * them, or as `dtrain debug analyze` reads them back from <run dir>/flight/), which rank is the
 * culprit, on which node, doing what, and where the ranks first disagree.
 *
 * The input is one JSON object (what node 0's agent writes to flight/verdict.json):
 *
 *   {"time": T, "dump": n, "world_size": W,
 *    "trigger": {"kind": "timeout"|"failure"|"watchdog"|"request", "node": k, "reason": "..."},
 *    "nodes": [{"node": k, "host": "...", "pid": p, "rank_base": b, "nproc": m,
 *               "answered": true|false}, ...],
 *    "ranks": [<a rank's records, as flight/rank_<N>.json holds them>, ...]}
 *
 * a rank's object: rank, node, host, pid, time (of the snapshot), alive, state (the process
 * state letter from /proc: R S D T t Z; "" when gone), wchan, exit (how it ended, when it did),
 * error (its first failed call's message), position {step, micro, phase, phase_since,
 * first_step, last_step_end, steps_done}, groups [{index, label, uid, size, rank, members}],
 * records [{id, group, seq, op, dtype, count, peer, state, step, phase, micro, t_issue, t_start,
 * t_end, err}] (times: wall-clock seconds, null when not yet). The verdict reads the last
 * DT_VERDICT_RECENT records of each group of each rank (dt_verdict_trim), so the agents' live
 * verdict and a later analysis of the full files agree.
 *
 * The analysis, in order:
 *   1. each collective group: the first sequence number k (among those every member still holds)
 *      at which the members disagree: some entered #k with another op, dtype or count than the
 *      others (a mismatch; when one side's calls from #k are the others' from #k+1, it skipped
 *      #k), or some never entered #k while others did (they wait in it);
 *   2. each pair of point-to-point ranks: the first send/receive pair whose count or dtype
 *      differ, or a send (receive) pending whose receive (send) was never posted;
 *   3. the first disagreement found (a mismatch before a missing rank; the earliest issued
 *      first) names the culprits: a rank that never entered is described by what it does
 *      instead (its phase, since when, its process state and wait channel, a collective it waits
 *      in on another group), a stopped process (state T), a process that is gone, or a node
 *      whose agent did not answer (node lost);
 *   4. no disagreement: ranks missing (a lost node), else the ranks no collective waits for
 *      (with a watchdog's trigger: those that stay longest in their phase), else "no hang".
 */
#ifndef DT_FLIGHT_VERDICT_H
#define DT_FLIGHT_VERDICT_H

#include <stdbool.h>

#include "common/err.h"

#define DT_VERDICT_RECENT 64    /* records per group and rank the verdict reads */
#define DT_VERDICT_MIN_WAIT_S 1.0 /* a call pending for less at the dump is no evidence: the
                                     ranks' records are taken at slightly different times (a
                                     dump of a job that runs) */
#define DT_VERDICT_CULPRITS 32

struct cJSON;

typedef struct dt_verdict_culprit {
    int rank;          /* global rank; -1: a node whose ranks are not known */
    int node;
    char host[64];
    int pid;
    double since;      /* wall-clock s: when its part began (for the root-cause table's order) */
    char what[480];    /* one sentence: what it did */
} dt_verdict_culprit;

typedef struct dt_verdict {
    char cause[24];      /* "stopped", "never_entered", "gone", "node_lost", "mismatch",
                            "skipped", "p2p_mismatch", "stalled", "none" */
    char summary[1024];  /* the verdict in one line */
    char *text;          /* every line, each ending in '\n', summary first (malloc'd) */
    int n;               /* culprits */
    dt_verdict_culprit c[DT_VERDICT_CULPRITS];
    struct cJSON *event; /* fields of the "hang" event (owned): trigger, reason, cause, verdict,
                            culprit_ranks, culprit_nodes, group, seq, op, lines */
} dt_verdict;

/* Makes the verdict of `in` (the object above; borrowed). Returns 0, or -EINVAL when in is not
 * such an object, or -ENOMEM. */
int dt_verdict_make(const struct cJSON *in, dt_verdict *v, dt_err *err);

/* Accepts a zeroed or freed one. */
void dt_verdict_free(dt_verdict *v);

/* A copy of a rank's object with only the last DT_VERDICT_RECENT records of each group (what
 * the agents send each other, and what the verdict reads). NULL without memory. */
struct cJSON *dt_verdict_trim(const struct cJSON *rank);

#endif
