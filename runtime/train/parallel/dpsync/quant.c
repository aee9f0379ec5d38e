/* quant.c - blockwise int8 and sign quantisation; see quant.h. Plain C: the reference a GPU kernel is
 * to be checked against. */
#include "runtime/train/parallel/dpsync/quant.h"

#include <math.h>
#include <stdbool.h>

size_t dt_quant_blocks(size_t n) { return (n + DT_QUANT_BLOCK - 1) / DT_QUANT_BLOCK; }

size_t dt_quant_bytes(size_t n) { return n + dt_quant_blocks(n) * sizeof(float); }

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
        float inv = s > 0 ? 1.0f / s : 0.0f;
        for (size_t i = lo; i < hi; i++) {
            float v = x[i] * mul * inv;
            float r = rng ? floorf(v + dt_rng_uniform(rng)) : nearbyintf(v);
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r; /* inv rounding may reach 128 */
            q[i] = (int8_t)r;
        }
    }
}

void dt_dequant_int8(const int8_t *q, const float *scale, size_t n, float *y, int acc)
{
    for (size_t i = 0; i < n; i++) {
        float v = (float)q[i] * scale[i / DT_QUANT_BLOCK];
        y[i] = acc ? y[i] + v : v;
    }
}

void dt_quant_sign(const float *x, size_t n, uint32_t *bits, float *scale, float *resid)
{
    for (size_t w = 0; w < (n + 31) / 32; w++)
        bits[w] = 0;
    for (size_t lo = 0, b = 0; lo < n; lo += DT_QUANT_BLOCK, b++) {
        size_t hi = lo + DT_QUANT_BLOCK < n ? lo + DT_QUANT_BLOCK : n;
        double sum = 0; /* in double: the mean of 256 values does not depend on their order */
        for (size_t i = lo; i < hi; i++)
            sum += fabsf(x[i]);
        float s = (float)(sum / (double)(hi - lo));
        scale[b] = s;
        for (size_t i = lo; i < hi; i++) {
            bool pos = !(x[i] < 0);
            if (pos)
                bits[i / 32] |= 1u << (i % 32);
            if (resid)
                resid[i] = x[i] - (pos ? s : -s);
        }
    }
}

void dt_dequant_sign(const uint32_t *bits, const float *scale, size_t n, float *y, int acc)
{
    for (size_t i = 0; i < n; i++) {
        float s = scale[i / DT_QUANT_BLOCK];
        float v = bits[i / 32] >> (i % 32) & 1u ? s : -s;
        y[i] = acc ? y[i] + v : v;
    }
}
