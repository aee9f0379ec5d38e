/* half.h - float32 <-> bfloat16 / float16 conversions, scalar and inline so that loops over them
 * vectorise (the CPU collectives, the CPU backend's 16-bit payload ops). They round to nearest
 * even, keep infinities and signed zeros, and turn NaN into a quiet NaN.
 *
 * The float16 conversions are the branch-free IEEE algorithms of Marat Dukhan's FP16 library
 * (MIT): they rely on float arithmetic rounding to nearest even, which dtrain never changes.
 */
#ifndef DT_HALF_H
#define DT_HALF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t dt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float dt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float dt_bf16_to_f32(uint16_t h) { return dt_bits_f32((uint32_t)h << 16); }

static inline uint16_t dt_f32_to_bf16(float f)
{
    uint32_t u = dt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN after truncation */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float dt_f16_to_f32(uint16_t h)
{
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = dt_bits_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = dt_bits_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? dt_f32_bits(denormalized) : dt_f32_bits(normalized));
    return dt_bits_f32(result);
}

static inline uint16_t dt_f32_to_f16(float f)
{
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = dt_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = dt_bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = dt_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* Arrays: d (n) = converted s (n), bit for bit what the scalar functions give (a NaN's payload
 * aside: a NaN stays a NaN), eight at a time on x86-64 CPUs with F16C (float16) or AVX2
 * (bfloat16): the scalar forms do not vectorise and cost up to several ns each. */
void dt_f32_to_f16_n(uint16_t *d, const float *s, size_t n);
void dt_f16_to_f32_n(float *d, const uint16_t *s, size_t n);
/* The same for bfloat16, with AVX2 where the CPU has it. */
void dt_f32_to_bf16_n(uint16_t *d, const float *s, size_t n);
void dt_bf16_to_f32_n(float *d, const uint16_t *s, size_t n);

#endif
