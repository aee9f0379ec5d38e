/* comm_reduce.h - element kernels of the CPU collectives: float32 <-> bfloat16 / float16
 * conversion and n-way reductions, internal to runtime/comm*.c and runtime/train/ddp.c.
 *
 * Reductions always accumulate in float32, whatever the payload type, and round once when they
 * store: an n-way sum of bf16 or fp16 payloads is rounded once, not n-1 times. Conversions round
 * to nearest even, keep infinities and signed zeros, and turn NaN into a quiet NaN.
 */
#ifndef DT_COMM_REDUCE_H
#define DT_COMM_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/half.h" /* the scalar conversions */
#include "runtime/comm/comm.h"


/* dst (n, dtype dt) = scale * src (n, dtype st). dst and src may be the same pointer only when
 * dt == st. */
void dt_dtype_convert(void *dst, dt_dtype dt, const void *src, dt_dtype st, size_t n, float scale);

/* dst (n) = scale * (srcs[0] + srcs[1] + ... + srcs[k-1]), all of dtype t, summed in float32 in
 * that order; dst2 (may be NULL) receives the same values. dst may be one of srcs (the sum is
 * computed in blocks, each read completely before it is written). k >= 1. stream: write dst
 * with non-temporal stores (see dt_copy). */
void dt_reduce_sum(void *dst, void *dst2, const void *const *srcs, int k, size_t n, dt_dtype t,
                   float scale, bool stream);

/* memcpy, or with stream = true a copy with non-temporal stores: for large results nobody reads
 * soon, it skips reading the destination lines first and leaves the cache to the data that is
 * read (a third less memory traffic). Call dt_stream_fence before another thread or process may
 * read what was streamed. */
void dt_copy(void *dst, const void *src, size_t n, bool stream);
void dt_stream_fence(void);

#endif
