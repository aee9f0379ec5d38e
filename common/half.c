/* half.c - the array conversions of half.h, with F16C and AVX2 paths chosen at run time. */
#include "common/half.h"

#include <stdatomic.h>
#include <stdbool.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DT_HAVE_SIMD_PATH 1

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(uint16_t *d, const float *s,
                                                               size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        d[i] = dt_f32_to_f16(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *d, const uint16_t *s,
                                                               size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = dt_f16_to_f32(s[i]);
}

/* bfloat16: round to nearest even by adding 0x7fff + the kept lsb, NaNs quieted (| 0x40), as
 * dt_f32_to_bf16; packed to 16 bits (the values fit, so packus does not saturate). */
__attribute__((target("avx2"))) static void f32_to_bf16_avx2(uint16_t *d, const float *s,
                                                            size_t n)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_castps_si256(_mm256_loadu_ps(s + i));
        __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(p));
    }
    for (; i < n; i++)
        d[i] = dt_f32_to_bf16(s[i]);
}

__attribute__((target("avx2"))) static void bf16_to_f32_avx2(float *d, const uint16_t *s,
                                                            size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++)
        d[i] = dt_bf16_to_f32(s[i]);
}

enum { HAVE_F16C = 1, HAVE_AVX2 = 2 };

/* What this CPU has, once (every thread that races here computes the same answer). */
static int have(void)
{
    static _Atomic int cached = -1;
    int h = atomic_load_explicit(&cached, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c") ? HAVE_F16C : 0) |
            (__builtin_cpu_supports("avx2") ? HAVE_AVX2 : 0);
        atomic_store_explicit(&cached, h, memory_order_relaxed);
    }
    return h;
}
#endif

void dt_f32_to_f16_n(uint16_t *d, const float *s, size_t n)
{
#ifdef DT_HAVE_SIMD_PATH
    if (have() & HAVE_F16C) {
        f32_to_f16_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_f32_to_f16(s[i]);
}

void dt_f16_to_f32_n(float *d, const uint16_t *s, size_t n)
{
#ifdef DT_HAVE_SIMD_PATH
    if (have() & HAVE_F16C) {
        f16_to_f32_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_f16_to_f32(s[i]);
}

void dt_f32_to_bf16_n(uint16_t *d, const float *s, size_t n)
{
#ifdef DT_HAVE_SIMD_PATH
    if (have() & HAVE_AVX2) {
        f32_to_bf16_avx2(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_f32_to_bf16(s[i]);
}

void dt_bf16_to_f32_n(float *d, const uint16_t *s, size_t n)
{
#ifdef DT_HAVE_SIMD_PATH
    if (have() & HAVE_AVX2) {
        bf16_to_f32_avx2(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_bf16_to_f32(s[i]);
}
