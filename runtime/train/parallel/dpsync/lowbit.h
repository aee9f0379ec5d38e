/* lowbit.h - the low-bit all-reduce of a DDP bucket: ddp.compress = int8 | 1bit (issue 31).
 *
 * ZeRO++'s quantised gradients (qgZ), for one bucket [lo, hi) of n elements over N ranks:
 *   1. send:   the bucket is cut into N chunks of c = ceil(n / N) elements (rounded up to 32, so
 *              a chunk's payload keeps 4-byte alignment; the last chunks are padded); each rank
 *              compresses all N chunks of its own gradient and sends chunk j to rank j (one
 *              point-to-point batch: the all-to-all that a quantised reduce-scatter is);
 *   2. reduce: rank r decompresses the N copies of its chunk r (its own included, so every
 *              rank's contribution went through the same compression), sums them in float32 in
 *              rank order and divides by N: the averaged shard; compresses that again, and
 *              all-gathers the compressed shards (uint8);
 *   3. recv:   every rank decompresses all N shards into its gradient buffer. Every rank,
 *              the shard's owner included, applies the same decompressed bytes, so the
 *              replicas stay bit-identical.
 * A rank sends (N-1) chunk payloads in 1 and (N-1) in 2: 2 (N-1)/N of the compressed bucket,
 * the ring all-reduce's share of fp32's bytes times the compression ratio.
 *
 * Payloads (blocks counted from a chunk's start, each with a float32 scale; quant.h):
 *   int8  blocks of 256, round to nearest, scale = max|x| / 127: (256 + 4) / 1024 = 0.254 of
 *         fp32's bytes.
 *         No state: each step's error is its own (|error| <= scale / 2 per element, twice:
 *         once per rank's chunk, once for the reduced shard).
 *   1bit  blocks of 64, the sign of each element and scale = mean|x| of its block (for given
 *         signs the scale that minimises the squared error): (8 + 4) / 256 = 0.047 of fp32's
 *         bytes (quant.h says why 64).
 *         With error feedback (1-bit SGD, 1-bit Adam's compressed all-reduce): each rank keeps
 *         what the compression left out of its gradient (the worker residual, one float per
 *         parameter) and adds it to the next step's gradient before compressing; the owner of
 *         a shard keeps what the second compression left out of the averaged shard (the
 *         server residual, one float per element of the rank's chunks) likewise. The sum of
 *         what is applied over steps then follows the sum of the true gradients.
 *
 * Memory: host memory (the CPU reference of quant.h; a device backend is refused by the
 * reducer), per bucket 2 N payloads (the chunks sent, reused for the all-gather, and the chunks
 * received) and, for 1bit, the residuals.
 *
 * Calls for one bucket go send, reduce, recv, in that order, and the buckets in the same order
 * on every rank (the reducer's bucket order); the point-to-point batches and the all-gathers
 * take part in the communicator's order as every rank issues them alike.
 */
#ifndef DT_LOWBIT_H
#define DT_LOWBIT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/comm/comm.h"

typedef enum dt_lowbit_kind {
    DT_LOWBIT_INT8 = 1,
    DT_LOWBIT_1BIT = 2,
} dt_lowbit_kind;

typedef struct dt_lowbit dt_lowbit;

/* A low-bit all-reduce over c (borrowed, outlives it) for a gradient buffer of num_params
 * floats. -ENOMEM. */
int dt_lowbit_create(dt_lowbit **out, dt_lowbit_kind kind, dt_comm *c, size_t num_params,
                     dt_err *err);

/* Waits for anything in flight and frees. Accepts NULL. */
void dt_lowbit_free(dt_lowbit *q);

/* The buckets [lo[i], hi[i]) for i < nb (the reducer's, in launch order), once, before the
 * first send: the chunks, the payload buffers and (1bit) the server residual, zeroed. The
 * quantisation's blocks follow the chunks, so the buckets fix the bits (the reducer keeps them
 * static). -ENOMEM; -EBUSY when planned already. */
int dt_lowbit_plan(dt_lowbit *q, const size_t *lo, const size_t *hi, int nb, dt_err *err);

/* int8: stochastic rounding from now on (quant.h), each chunk's draws from a dt_rng seeded by
 * (seed, the step of dt_lowbit_set_step, bucket, chunk, this rank, which of the two
 * quantisations), so they are the same on a resumed job as on one that ran through. -EINVAL for
 * 1bit. */
int dt_lowbit_set_stochastic(dt_lowbit *q, uint64_t seed, dt_err *err);

/* The step of the syncs that follow (the optimiser's update count). */
void dt_lowbit_set_step(dt_lowbit *q, uint64_t step);

/* Step 1 of bucket i over g (the whole gradient buffer, num_params). 1bit: the worker residual
 * of the bucket is updated. */
int dt_lowbit_send(dt_lowbit *q, int i, const float *g, dt_err *err);

/* Step 2 of bucket i (after its send): waits for the chunks, reduces, launches the all-gather. */
int dt_lowbit_reduce(dt_lowbit *q, int i, dt_err *err);

/* Step 3 of bucket i (after its reduce): waits for the all-gather; g[lo, hi) = the averaged
 * gradient as every rank decompresses it. */
int dt_lowbit_recv(dt_lowbit *q, int i, float *g, dt_err *err);

/* Bytes of host memory held (payloads and residuals), for the memory figures. */
size_t dt_lowbit_bytes(const dt_lowbit *q);

/* 1bit: the worker residual (num_params floats, this rank's; the buffer itself), NULL for int8;
 * and the server residual copied into out (num_params floats, the gradient buffer's layout:
 * element k holds k's server residual where this rank owns k's chunk, else 0; nothing for
 * int8). What error feedback still holds, for the tests (they are not checkpointed: see
 * docs/parallelism.md). */
float *dt_lowbit_worker_residual(dt_lowbit *q);
void dt_lowbit_server_get(const dt_lowbit *q, float *out);

#endif
