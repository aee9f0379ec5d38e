/* comm_reduce.c - dtype conversion and n-way sums for the CPU collectives; see comm_reduce.h.
 *
 * Everything works in blocks of BLOCK float32 values held in a stack buffer (16 KiB, in L1):
 * load (converting) the first source into the block, add each further source, scale, store
 * (converting) to the destinations. Each pass is a simple loop over restrict pointers that the
 * compiler vectorises, so the kernels run at memory speed for every dtype and any number of
 * sources, and a destination may alias a source.
 *
 * The float16 conversions are the branch-free IEEE algorithms of Marat Dukhan's FP16 library
 * (MIT): they rely on float arithmetic rounding to nearest even, which dtrain never changes.
 */
#include "runtime/comm_reduce.h"

#include <math.h>
#include <string.h>

#include "common/util.h"

#define BLOCK 4096

#if defined(__GNUC__) && !defined(__clang__)
#define DT_VECTORIZE __attribute__((optimize("O3")))
#else
#define DT_VECTORIZE
#endif

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- scalar conversions -------------------------------------------------------------------- */

float dt_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dt_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN after truncation */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

float dt_f16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = u2f((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = u2f((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? f2u(denormalized) : f2u(normalized));
    return u2f(result);
}

uint16_t dt_f32_to_f16(float f)
{
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f2u(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f2u(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* ---- block kernels ------------------------------------------------------------------------- */

DT_VECTORIZE static void load_block(float *restrict acc, const void *src, dt_dtype t, size_t n)
{
    if (t == DT_FLOAT32) {
        memcpy(acc, src, n * 4);
    } else if (t == DT_BFLOAT16) {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] = u2f((uint32_t)s[i] << 16);
    } else {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] = dt_f16_to_f32(s[i]);
    }
}

DT_VECTORIZE static void add_block(float *restrict acc, const void *src, dt_dtype t, size_t n)
{
    if (t == DT_FLOAT32) {
        const float *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] += s[i];
    } else if (t == DT_BFLOAT16) {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] += u2f((uint32_t)s[i] << 16);
    } else {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] += dt_f16_to_f32(s[i]);
    }
}

DT_VECTORIZE static void scale_block(float *restrict acc, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        acc[i] *= s;
}

DT_VECTORIZE static void store_block(void *dst, dt_dtype t, const float *restrict acc, size_t n)
{
    if (t == DT_FLOAT32) {
        memcpy(dst, acc, n * 4);
    } else if (t == DT_BFLOAT16) {
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = dt_f32_to_bf16(acc[i]);
    } else {
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = dt_f32_to_f16(acc[i]);
    }
}

/* float32 + float32 with no scale: the hot case of every 2-rank all-reduce. Two forms, so that
 * every pointer is restrict (in place: a += b; out of place: d = a + b) and the loop vectorises
 * without run-time alias checks. d2 may be NULL. */
DT_VECTORIZE static void sum2_inplace_f32(float *restrict a, const float *restrict b,
                                          float *restrict d2, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
    if (d2)
        memcpy(d2, a, n * 4);
}

DT_VECTORIZE static void sum2_f32(float *restrict d, float *restrict d2, const float *restrict a,
                                  const float *restrict b, size_t n)
{
    if (d2) {
        for (size_t i = 0; i < n; i++) {
            float v = a[i] + b[i];
            d[i] = v;
            d2[i] = v;
        }
    } else {
        for (size_t i = 0; i < n; i++)
            d[i] = a[i] + b[i];
    }
}

void dt_dtype_convert(void *dst, dt_dtype dt, const void *src, dt_dtype st, size_t n, float scale)
{
    float acc[BLOCK];
    size_t des = dt_dtype_size(dt), ses = dt_dtype_size(st);
    if (dt == st && scale == 1.0f) {
        if (dst != src)
            memmove(dst, src, n * des);
        return;
    }
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = DT_MIN((size_t)BLOCK, n - off);
        load_block(acc, (const char *)src + off * ses, st, m);
        if (scale != 1.0f)
            scale_block(acc, m, scale);
        store_block((char *)dst + off * des, dt, acc, m);
    }
}

void dt_reduce_sum(void *dst, void *dst2, const void *const *srcs, int k, size_t n, dt_dtype t,
                   float scale)
{
    size_t es = dt_dtype_size(t);
    float acc[BLOCK];
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = DT_MIN((size_t)BLOCK, n - off);
        size_t b = off * es;
        if (t == DT_FLOAT32 && k == 2 && scale == 1.0f) {
            /* a + b straight into the destinations: no block round trip. */
            float *d = (float *)((char *)dst + b), *d2 = dst2 ? (float *)((char *)dst2 + b) : NULL;
            const float *s0 = (const float *)((const char *)srcs[0] + b);
            const float *s1 = (const float *)((const char *)srcs[1] + b);
            if (dst == srcs[0])
                sum2_inplace_f32(d, s1, d2, m);
            else if (dst == srcs[1]) /* float addition commutes exactly */
                sum2_inplace_f32(d, s0, d2, m);
            else
                sum2_f32(d, d2, s0, s1, m);
            continue;
        }
        load_block(acc, (const char *)srcs[0] + b, t, m);
        for (int j = 1; j < k; j++)
            add_block(acc, (const char *)srcs[j] + b, t, m);
        if (scale != 1.0f)
            scale_block(acc, m, scale);
        store_block((char *)dst + b, t, acc, m);
        if (dst2)
            store_block((char *)dst2 + b, t, acc, m);
    }
}
