/* quant.h - blockwise int8 and sign (1-bit) quantisation of gradients, the building blocks of
 * ddp.compress = int8 and 1bit (issue 31).
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
 *
 * Sign (1-bit) quantisation, for ddp.compress = 1bit: blocks of DT_QUANT_SIGN_BLOCK = 64, each
 * element its sign as one bit (bit i % 32 of word i / 32; set: +s, clear: -s; 0 counts as +)
 * and the block's scale s = mean |x| over the block, the scale that minimises the block's
 * squared error for those signs. (8 + 4) / 256 = 0.047 of fp32's bytes. Why 64, not 256: the
 * magnitude is all a block says of its elements, and with AdamW a finer one trains better (the
 * quickstart GPT's val loss at 300 steps: +8.1% against fp32 with 64, +9.5% with 256, where
 * 256 would send 0.035); 32 would cost 0.0625, over the 0.05 aimed at. The error is large (up
 * to max|x| + s per element), so it is meant to be used with error feedback (lowbit.h).
 *
 * These are wired into DDP's reducer by lowbit.h (the int8 and 1bit all-reduce).
 */
#ifndef DT_QUANT_H
#define DT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"

#define DT_QUANT_BLOCK 256
#define DT_QUANT_SIGN_BLOCK 64

/* Blocks of n elements: ceil(n / DT_QUANT_BLOCK). */
size_t dt_quant_blocks(size_t n);

/* Bytes of n elements quantised: n int8 plus one float scale per block. */
size_t dt_quant_bytes(size_t n);

/* q (n) and scale (dt_quant_blocks(n)) = x (n) quantised; rng NULL: round to nearest, else
 * stochastic rounding drawing from rng. mul multiplies x first (1 / world for an average). A
 * block holding inf or NaN gets q = 0 and a scale of inf or NaN: it dequantises to NaN. */
void dt_quant_int8(const float *x, size_t n, float mul, int8_t *q, float *scale, dt_rng *rng);

/* y (n) = q * scale (acc 0), or y += q * scale (acc 1). */
void dt_dequant_int8(const int8_t *q, const float *scale, size_t n, float *y, int acc);

/* Sign blocks of n elements: ceil(n / DT_QUANT_SIGN_BLOCK). */
size_t dt_quant_sign_blocks(size_t n);

/* bits (ceil(n / 32) words; the unused bits of the last one cleared) and scale
 * (dt_quant_sign_blocks(n)) = the signs and block scales of x (n). resid (n, may be NULL, may be x
 * itself): x minus what dt_dequant_sign gives back, the error left for error feedback. */
void dt_quant_sign(const float *x, size_t n, uint32_t *bits, float *scale, float *resid);

/* y (n) = +-scale by bits (acc 0), or y += that (acc 1). */
void dt_dequant_sign(const uint32_t *bits, const float *scale, size_t n, float *y, int acc);

#endif
