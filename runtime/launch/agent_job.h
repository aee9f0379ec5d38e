/* agent_job.h - what the agent reads from its settings and the job: the rendezvous options the
 * launcher settings give (--rdzv-conf applied onto them; one node: a static store on any free
 * local port), --standalone against --nnodes, and the built-in worker's global batch said for
 * the world of a round. The agent's own state (workers, rounds) stays in agent.c.
 */
#ifndef DT_AGENT_JOB_H
#define DT_AGENT_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "rendezvous/rdzv.h"
#include "runtime/job/config.h"

/* Applies --rdzv-conf "k=v,..." (L->rdzv_conf) onto the typed settings *L, each as the job key
 * rendezvous.k. A job file had it applied when it was loaded; a command line (no job file) had
 * not. Applying twice changes nothing. -EINVAL with err ("--rdzv-conf: ...") on a bad entry, *L
 * then unchanged. */
int dt_agent_apply_rdzv_conf(dt_launch *L, dt_err *err);

/* The rendezvous options of settings L for nproc workers on this node; interrupted(arg) is
 * polled while the rendezvous waits. A one-node job (--standalone, or --nnodes=1 without
 * --rdzv-endpoint) gets the static backend on 127.0.0.1 and any free port. */
void dt_agent_rdzv_opts(const dt_launch *L, int nproc, bool (*interrupted)(void *arg), void *arg,
                        dt_rdzv_opts *o);

/* Whether --nnodes (N or MIN:MAX) allows more than one node, which --standalone cannot give.
 * False for what is not a number (the rendezvous says what is wrong with it). */
bool dt_agent_standalone_conflict(const char *nnodes);

/* Where the run directories go (the log root): --log-dir (L->log_dir) when given, else
 * <output_dir>/logs for a job file (output_dir: the resolved job's; NULL or "" for a command),
 * else a new temporary directory under $TMPDIR or /tmp, made here (*made_tmp set; the caller
 * removes it). Writes out (cap bytes). -ENAMETOOLONG or the mkdtemp error with err. */
int dt_agent_log_root(const dt_launch *L, const char *output_dir, char *out, size_t cap,
                      bool *made_tmp, dt_err *err);

/* Whether worker output goes to files: --redirects, --tee, or ranks that --local-ranks-filter
 * hides (their output goes to their files, so that a crash leaves a trace). */
bool dt_agent_writes_files(const dt_launch *L);

/* An elastic job's samples per optimiser step, said (logged) when its world size is new (the
 * first round and every membership change), so that a change is no surprise: the built-in
 * worker's step is batch_size x grad_accum x world unless train.global_batch keeps it fixed (the
 * worker derives its micro-steps from it; the line says how many). Read from job_path, the
 * resolved job the workers load; world: this round's world size; before: the last one said (0:
 * none). Says nothing when the job cannot be loaded (the workers say what is wrong with it) or
 * when the world does not hold parallel.tensor x parallel.pipeline (the round is refused). */
void dt_agent_log_global_batch(const char *job_path, int world, int before);

/* Whether a world of `world` ranks can run a job of parallel.tensor x parallel.pipeline =
 * tensor x pipeline (values below 1 count as 1): their product divides it, and global_batch
 * (train.global_batch; 0 = none) has a sample for each of its world / (tensor x pipeline)
 * data-parallel ranks. */
bool dt_agent_world_usable(int world, int tensor, int pipeline, int64_t global_batch);

/* Warns, at start, when an elastic --nnodes MIN:MAX (nnodes) x nproc workers a node includes
 * worlds the layout cannot use (dt_agent_world_usable), naming them: a round of such a node
 * count runs on the largest world it can use, the other nodes wait as spares. Says nothing for
 * a fixed node count (the job's load checks it) or when every world is usable. */
void dt_agent_warn_worlds(const char *nnodes, int nproc, int tensor, int pipeline,
                          int64_t global_batch);

#endif
