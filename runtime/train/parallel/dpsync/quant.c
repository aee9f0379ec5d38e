/* quant.c - blockwise int8 and sign quantisation; see quant.h. Plain C: the reference a GPU kernel is
 * to be checked against. */
#include "runtime/train/parallel/dpsync/quant.h"

#include <math.h>
#include <stdbool.h>

size_t dt_quant_blocks(size_t n) { return (n + DT_QUANT_BLOCK - 1) / DT_QUANT_BLOCK; }

size_t dt_quant_bytes(size_t n) { return n + dt_quant_blocks(n) * sizeof(float); }

size_t dt_quant_sign_blocks(size_t n)
{
    return (n + DT_QUANT_SIGN_BLOCK - 1) / DT_QUANT_SIGN_BLOCK;
}

/* Round to nearest, ties to even, of |v| < 2^22 in float arithmetic alone (adding and taking
 * away 1.5 x 2^23 leaves no fraction bits): what nearbyintf does in the default rounding mode,
 * without its library call, so the loops below vectorise. (The build has no -ffast-math, which
 * would fold it away.) */
static inline float round_even(float v)
{
    const float magic = 12582912.0f; /* 1.5 x 2^23 */
    return (v + magic) - magic;
}

void dt_quant_int8(const float *x, size_t n, float mul, int8_t *q, float *scale, dt_rng *rng)
{
    for (size_t lo = 0, b = 0; lo < n; lo += DT_QUANT_BLOCK, b++) {
        size_t hi = lo + DT_QUANT_BLOCK < n ? lo + DT_QUANT_BLOCK : n;
        float amax = 0;
        for (size_t i = lo; i < hi; i++) {
            float a = fabsf(x[i] * mul);
            amax = a > amax ? a : amax;
        }
        float s = amax / 127.0f;
        scale[b] = s;
        /* an inf or NaN in the block (fp16's overflowing step): every q 0 and the scale inf or
         * NaN, so the block dequantises to NaN and the step's norm says so */
        float inv = s > 0 && isfinite(s) ? 1.0f / s : 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float v = x[i] * mul * inv;
            float r = rng ? floorf(v + dt_rng_uniform(rng)) : round_even(v);
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r; /* inv rounding may reach 128 */
            q[i] = (int8_t)r;
        }
    }
}

void dt_dequant_int8(const int8_t *q, const float *scale, size_t n, float *y, int acc)
{
    for (size_t lo = 0, b = 0; lo < n; lo += DT_QUANT_BLOCK, b++) {
        size_t hi = lo + DT_QUANT_BLOCK < n ? lo + DT_QUANT_BLOCK : n;
        float s = scale[b];
        if (acc)
            for (size_t i = lo; i < hi; i++)
                y[i] += (float)q[i] * s;
        else
            for (size_t i = lo; i < hi; i++)
                y[i] = (float)q[i] * s;
    }
}

/* Blocks hold whole words (DT_QUANT_SIGN_BLOCK is a multiple of 32), so the loops go block by
 * block and, inside a block, word by word. */
void dt_quant_sign(const float *x, size_t n, uint32_t *bits, float *scale, float *resid)
{
    for (size_t lo = 0, b = 0; lo < n; lo += DT_QUANT_SIGN_BLOCK, b++) {
        size_t hi = lo + DT_QUANT_SIGN_BLOCK < n ? lo + DT_QUANT_SIGN_BLOCK : n;
        /* the mean |x| in 8 float lanes, added in a fixed order: the same bits on every rank */
        float lane[8] = {0};
        size_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int k = 0; k < 8; k++)
                lane[k] += fabsf(x[i + k]);
        for (; i < hi; i++)
            lane[0] += fabsf(x[i]);
        float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                    ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        float s = sum / (float)(hi - lo);
        scale[b] = s;
        for (size_t w0 = lo; w0 < hi; w0 += 32) {
            size_t w1 = w0 + 32 < hi ? w0 + 32 : hi;
            uint32_t w = 0;
            for (size_t k = w0; k < w1; k++)
                w |= (uint32_t)!(x[k] < 0) << (k - w0);
            if (resid) /* after the signs: resid may be x */
                for (size_t k = w0; k < w1; k++)
                    resid[k] = x[k] - (x[k] < 0 ? -s : s);
            bits[w0 / 32] = w;
        }
    }
}

void dt_dequant_sign(const uint32_t *bits, const float *scale, size_t n, float *y, int acc)
{
    for (size_t w0 = 0; w0 < n; w0 += 32) {
        size_t w1 = w0 + 32 < n ? w0 + 32 : n;
        uint32_t w = bits[w0 / 32];
        float s = scale[w0 / DT_QUANT_SIGN_BLOCK];
        for (size_t i = w0; i < w1; i++) {
            float v = (float)((int)((w >> (i - w0)) & 1u) * 2 - 1) * s;
            y[i] = acc ? y[i] + v : v;
        }
    }
}
