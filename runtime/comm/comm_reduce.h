/* comm_reduce.h - element kernels of the CPU collectives: float32 <-> bfloat16 / float16
 * conversion, n-way reductions and streaming copies. Used by the cpu backend (comm_cpu.c), its
 * transports (comm_shm.c, comm_tcp.c), `dtrain bench allreduce` (cmd/bench/bench_allreduce.c) and
 * tests/test_comm.c; nothing in runtime/train/ calls it (DDP converts through the backend's
 * ops).
 *
 * float32, bfloat16 and float16 reductions accumulate in float32, whatever the payload type,
 * and round once when they store: an n-way sum of bf16 or fp16 payloads is rounded once, not n-1
 * times. float64 reductions accumulate in double (sums of counts stay exact to 2^53).
 * Conversions round to nearest even, keep infinities and signed zeros, and turn NaN into a
 * quiet NaN. Integer reductions (int32, int64, uint8) are exact in the payload's own type: sums
 * wrap modulo 2^bits, as two's complement hardware (and NCCL) does; no value goes through a
 * float, so int64 values beyond 2^53 survive.
 */
#ifndef DT_COMM_REDUCE_H
#define DT_COMM_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/half.h" /* the scalar conversions */
#include "runtime/comm/dtype.h"

/* dst (n, dtype dt) = scale * src (n, dtype st), for floating dt and st (float64 only to and
 * from itself, scaled in double); for any dtype when dt == st and scale == 1 (a copy). dst and
 * src may be the same pointer only when dt == st. */
void dt_dtype_convert(void *dst, dt_dtype dt, const void *src, dt_dtype st, size_t n, float scale);

/* dst (n) = op over srcs[0], srcs[1], ..., srcs[k-1], all of dtype t, element by element:
 *   DT_SUM, DT_AVG: scale * (srcs[0] + ... + srcs[k-1]), summed in that order (floating types
 *     in float32, float64 in double; integer types exactly, wrapping; scale must be 1 for integer types: an
 *     average is the caller's division);
 *   DT_MAX, DT_MIN: the largest / smallest (scale is ignored; a NaN in any source gives NaN).
 * dst2 (may be NULL) receives the same values. dst may be one of srcs (the reduction is computed
 * in blocks, each read completely before it is written). k >= 1. stream: write dst with
 * non-temporal stores (see dt_copy). */
void dt_reduce(void *dst, void *dst2, const void *const *srcs, int k, size_t n, dt_dtype t,
               dt_redop op, float scale, bool stream);

/* x (n) /= d, in double: the float64 average (DT_AVG's float scale 1/world would be inexact
 * for a world that is not a power of two, so the cpu backend sums and then divides). */
void dt_f64_divide(double *x, size_t n, double d);

/* memcpy, or with stream = true a copy with non-temporal stores: for large results nobody reads
 * soon, it skips reading the destination lines first and leaves the cache to the data that is
 * read (a third less memory traffic). Call dt_stream_fence before another thread or process may
 * read what was streamed. */
void dt_copy(void *dst, const void *src, size_t n, bool stream);
void dt_stream_fence(void);

#endif
