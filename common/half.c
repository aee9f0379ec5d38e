/* half.c - the array conversions of half.h, with an F16C path chosen at run time. */
#include "common/half.h"

#include <stdatomic.h>
#include <stdbool.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DT_HAVE_F16C_PATH 1

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

static bool have_f16c(void)
{
    static _Atomic int have = -1; /* every thread that races here computes the same answer */
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h;
}
#endif

void dt_f32_to_f16_n(uint16_t *d, const float *s, size_t n)
{
#ifdef DT_HAVE_F16C_PATH
    if (have_f16c()) {
        f32_to_f16_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_f32_to_f16(s[i]);
}

void dt_f16_to_f32_n(float *d, const uint16_t *s, size_t n)
{
#ifdef DT_HAVE_F16C_PATH
    if (have_f16c()) {
        f16_to_f32_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = dt_f16_to_f32(s[i]);
}
