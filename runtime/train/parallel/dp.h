/* dp.h - DataParallel (strategy = dp): one process drives K model replicas.
 *
 * Faithful to torch.nn.DataParallel, so that its costs are real and measurable next to DDP:
 *   - replica 0 is the master: the optimiser (run by the caller on dt_dp_master) updates its
 *     parameters only, and its optimiser state lives on its backend alone;
 *   - every forward first replicates the master's parameters and buffers to the other replicas
 *     (serially, from the master: torch's replicate/broadcast from device 0);
 *   - the batch is scattered along the sample dimension in K chunks (torch.chunk sizes: ceil);
 *   - forward and backward run in parallel, one thread per replica, each replica on its own
 *     backend instance (its own device on CUDA);
 *   - the replicas' gradients are then summed into the master's, one replica after the other,
 *     on the master (torch's reduce-add to device 0), weighted so that the result is the
 *     gradient of the mean loss over the whole batch.
 * So the master holds more memory than the others (optimiser state, reduction staging), and the
 * reduction is a serial phase that grows with K while the other replicas idle: the two
 * well-known reasons DDP is faster.
 *
 * Transport (opts.transport): how parameters go out and gradients come back.
 *   - "master": the master copies, one replica after the other, as described above. Between
 *     CPU replicas these are plain memory copies and sums; between GPUs each goes through a host
 *     staging buffer (device -> host -> device), which is what DP does without a GPU-to-GPU
 *     library.
 *   - "collectives": a communicator of the K replicas, created in this process (replica k is its
 *     rank k; bootstrapped through a private store on 127.0.0.1): every replica thread receives
 *     the parameters by a broadcast from rank 0 and sends its gradients by a reduce to rank 0,
 *     as torch DataParallel does on GPUs (broadcast_coalesced, reduce_add_coalesced over NCCL).
 *     The backend is nccl for cuda replicas and cpu (shared memory) for cpu ones. The optimiser
 *     still runs on the master alone.
 *   - "auto" (NULL): collectives between GPUs, falling back to master with a warning when the
 *     communicator cannot be created (no NCCL); master between CPU replicas.
 *
 * BatchNorm: each replica normalises its chunk with its own statistics, and the buffers (running
 * statistics) of replica 0 are the ones kept, as in torch DataParallel (and as in DDP without
 * SyncBatchNorm, whose broadcast_buffers makes rank 0's the ones kept).
 */
#ifndef DT_DP_H
#define DT_DP_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"

typedef struct dt_dp dt_dp;

typedef struct dt_dp_opts {
    int replicas;            /* K >= 1 */
    dt_backend_kind device;  /* cpu, cuda or auto (dt_backend_open; 0: auto); replica k uses
                                device index k */
    dt_backend_opts backend; /* per replica (threads: BLAS threads of each replica) */
    bool cpu_bind;           /* replica k's thread runs on share k of the caller's CPUs, or on
                                cuda its share of the CPUs near GPU k (dt_backend_bind_set); the
                                caller's thread, which runs replica 0, is bound to share 0 */
    dt_dp_transport_kind transport; /* auto (0), master or collectives (config.h); see above */
    int timeout_ms;          /* collectives: per collective and for the bootstrap (0: 300000) */
} dt_dp_opts;

/* The options of job (dp_replicas, device, cpu_bind, dp_transport, ddp.timeout), with replicas
 * on backend bo each. */
void dt_dp_opts_from_job(dt_dp_opts *o, const dt_job *job, const dt_backend_opts *bo);

/* What one step cost, and where; cumulated since creation. */
typedef struct dt_dp_stats {
    int replicas;
    bool collectives;        /* the transport is a communicator of the replicas */
    double replicate_s;      /* copying the master's parameters and buffers out (collectives:
                                the master's broadcast) */
    double compute_s;        /* the parallel forward + backward (wall time; collectives: the
                                master's) */
    double reduce_s;         /* summing the replicas' gradients into the master (collectives:
                                the master's reduce, waiting for the slowest replica included) */
    uint64_t steps;          /* forward-backward passes */
} dt_dp_stats;

/* Creates K replicas of the model cfg (cfg->max_batch is the largest batch given to
 * dt_dp_forward_backward; each replica gets room for its chunk) and their threads. Replica k's
 * parameters are replica 0's from the first forward on, whatever cfg->seed. */
int dt_dp_create(dt_dp **out, const dt_model_config *cfg, const dt_dp_opts *opts, dt_err *err);

/* Joins the threads, frees the replicas and their backends. Accepts NULL. */
void dt_dp_free(dt_dp *d);

/* The master replica's model and backend: the optimiser updates these, checkpoints save them. */
dt_model *dt_dp_master(dt_dp *d);

/* Replica k's backend (peak memory per replica). */
dt_backend *dt_dp_backend(dt_dp *d, int k);
int dt_dp_replicas(const dt_dp *d);

/* One training micro-step on batch (B samples, B <= cfg->max_batch): replicate, scatter,
 * parallel forward + backward with dloss_scale, reduce. The master's gradients ACCUMULATE (+=)
 * the gradient of dloss_scale * (mean loss over the whole batch), like a single model's
 * backward; the caller zeroes them at the start of an accumulation. *loss = that mean loss. */
int dt_dp_forward_backward(dt_dp *d, const dt_batch *batch, float dloss_scale, float *loss,
                           dt_err *err);

/* Evaluation forward (no backward): replicate, scatter, parallel forward; *loss = the mean loss,
 * *correct = the sum of the replicas' last_correct. */
int dt_dp_forward_eval(dt_dp *d, const dt_batch *batch, float *loss, int64_t *correct,
                       dt_err *err);

void dt_dp_get_stats(const dt_dp *d, dt_dp_stats *s);

#endif
