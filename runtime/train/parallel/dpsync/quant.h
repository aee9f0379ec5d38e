/* quant.h - blockwise int8 quantisation of gradients, the building block of ddp.compress = int8
 * (issue 31; not wired into the reducer yet).
 *
 * A vector of n floats is cut into blocks of DT_QUANT_BLOCK elements (the last one may be
 * shorter); each block carries one float32 scale s = max|x| / 127 and its elements as int8
 * q = round(x / s), so x ~ q * s. Why 256: the scale costs 4 bytes per 256, so the payload is
 * (256 + 4) / (4 * 256) = 0.254 of fp32's bytes (under the 0.27); a smaller block
 * tracks the gradient's local range better but costs more (64: 0.266, 32: 0.281), and 256 is
 * also a whole number of CUDA warps and cache lines. A block of zeros has scale 0 and all q 0.
 *
 * Rounding: to nearest (|x - q s| <= s / 2) or stochastic (q = floor(x / s + u), u uniform in
 * [0, 1) drawn from the caller's dt_rng: unbiased, E[q s] = x, |x - q s| < s).
 */
#ifndef DT_QUANT_H
#define DT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"

#define DT_QUANT_BLOCK 256

/* Blocks of n elements: ceil(n / DT_QUANT_BLOCK). */
size_t dt_quant_blocks(size_t n);

/* Bytes of n elements quantised: n int8 plus one float scale per block. */
size_t dt_quant_bytes(size_t n);

/* q (n) and scale (dt_quant_blocks(n)) = x (n) quantised; rng NULL: round to nearest, else
 * stochastic rounding drawing from rng. mul multiplies x first (1 / world for an average). */
void dt_quant_int8(const float *x, size_t n, float mul, int8_t *q, float *scale, dt_rng *rng);

/* y (n) = q * scale (acc 0), or y += q * scale (acc 1). */
void dt_dequant_int8(const int8_t *q, const float *scale, size_t n, float *y, int acc);

#endif
