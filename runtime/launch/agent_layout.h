/* agent_layout.h - parallel.layout = auto on an elastic job: the layout of every round whose
 * world is new, planned once for the whole round and shared. The planner itself lives in cmd/
 * (the launcher runs no model): the agent calls it through a hook, on group rank 0 only, and
 * hands the chosen keys to the other nodes of the round through the round's store, so that
 * every node trains the same layout even where their measured rates would rank the layouts
 * differently.
 */
#ifndef DT_AGENT_LAYOUT_H
#define DT_AGENT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "rendezvous/rdzv_types.h"

/* The planner's hook (cmd/plan.h's dt_plan_auto_round): the layout of a round of nnodes x nproc
 * ranks; given NULL: plan it, else apply given (group rank 0's keys). Writes the resolved job
 * the workers load, *tensor and *pipeline, and choice (cap bytes) the keys. 0, or -EINVAL
 * (nothing fits, a bad given; err says why) or another error. */
typedef int (*dt_agent_layout_fn)(void *arg, int nnodes, int nproc, const char *given,
                                  char *choice, size_t cap, int *tensor, int *pipeline,
                                  dt_err *err);

/* The layout of round rd (nproc workers on this node): group rank 0 plans with fn and publishes
 * the keys in the round's store (under a key named by the run id, the round and its
 * MASTER_PORT, new every round); the others wait for them (up to timeout_s, asking over(arg)
 * about every 200 ms whether the round has ended meanwhile: rank 0 lost) and apply them with
 * fn. A round of one node plans alone. group rank 0's failure is published too ("!" and why),
 * so that every node ends with it. Returns 0 with *tensor, *pipeline and choice (cap bytes: the
 * keys, as fn gives them) set; -EINVAL: the layout
 * cannot be had (a configuration error: err says why); -ECANCELED: the round ended first (no
 * layout); another error (the store, -ETIMEDOUT). */
int dt_agent_layout_round(dt_agent_layout_fn fn, void *arg, const dt_rdzv_round *rd, int nproc,
                          double timeout_s, bool (*over)(void *arg), void *over_arg,
                          int *tensor, int *pipeline, char *choice, size_t cap, dt_err *err);

#endif
