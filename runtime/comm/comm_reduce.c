/* comm_reduce.c - dtype conversion and n-way reductions for the CPU collectives; see
 * comm_reduce.h.
 *
 * Floating types work in blocks of BLOCK float32 values held in a stack buffer (16 KiB, in L1):
 * load (converting) the first source into the block, add (or max, min) each further source,
 * scale, store (converting) to the destinations. Integer types work the same way in blocks of
 * their own type (sums in the unsigned type of the same width, which wraps without undefined
 * behaviour); float64 in blocks of doubles. Each pass is a simple loop over restrict pointers that the
 * compiler vectorises, so the kernels run at memory speed for every dtype and any number of
 * sources, and a destination may alias a source.
 * The scalar conversions are common/half.h's.
 */
#include "runtime/comm/comm_reduce.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "common/util.h"

#define BLOCK 4096

#if defined(__GNUC__) && !defined(__clang__)
#define DT_VECTORIZE __attribute__((optimize("O3")))
#else
#define DT_VECTORIZE
#endif

/* ---- block kernels ------------------------------------------------------------------------- */

DT_VECTORIZE static void load_block(float *restrict acc, const void *src, dt_dtype t, size_t n)
{
    if (t == DT_FLOAT32) {
        memcpy(acc, src, n * 4);
    } else if (t == DT_BFLOAT16) {
        const uint16_t *restrict s = src;
        for (size_t i = 0; i < n; i++)
            acc[i] = dt_bits_f32((uint32_t)s[i] << 16);
    } else {
        dt_f16_to_f32_n(acc, src, n);
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
            acc[i] += dt_bits_f32((uint32_t)s[i] << 16);
    } else {
        float wide[BLOCK];
        dt_f16_to_f32_n(wide, src, n);
        for (size_t i = 0; i < n; i++)
            acc[i] += wide[i];
    }
}

/* acc = max(acc, src) (is_max) or min(acc, src), element by element; a NaN on either side
 * stays NaN. */
DT_VECTORIZE static void minmax_block(float *restrict acc, const void *src, dt_dtype t, size_t n,
                                      bool is_max)
{
    float wide[BLOCK];
    const float *s = wide;
    if (t == DT_FLOAT32)
        s = src;
    else if (t == DT_BFLOAT16)
        for (size_t i = 0; i < n; i++)
            wide[i] = dt_bits_f32((uint32_t)((const uint16_t *)src)[i] << 16);
    else
        dt_f16_to_f32_n(wide, src, n);
    for (size_t i = 0; i < n; i++) {
        float a = acc[i], b = s[i];
        acc[i] = a != a || b != b ? a + b : is_max ? (b > a ? b : a) : (b < a ? b : a);
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
        dt_f32_to_bf16_n(dst, acc, n);
    } else {
        dt_f32_to_f16_n(dst, acc, n);
    }
}

/* Copies n bytes with non-temporal (streaming) stores where the CPU has them: the destination
 * lines are not read first and do not displace the cache, which saves a third of the memory
 * traffic of a large copy into a buffer nobody reads soon (an all-reduce's result). The caller
 * fences (dt_stream_fence) before anyone else may read dst. */
#if defined(__x86_64__)
#include <emmintrin.h>
static void copy_stream(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n);
}

void dt_stream_fence(void) { _mm_sfence(); }
#else
static void copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void dt_stream_fence(void) { atomic_thread_fence(memory_order_seq_cst); }
#endif

void dt_copy(void *dst, const void *src, size_t n, bool stream)
{
    if (stream)
        copy_stream(dst, src, n);
    else
        memcpy(dst, src, n);
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
    if (dt == DT_FLOAT64 && st == DT_FLOAT64) {
        const double *s = src;
        double *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = s[i] * (double)scale;
        return;
    }
    assert(dt != DT_FLOAT64 && st != DT_FLOAT64 && "float64 converts only to itself");
    assert(dt_dtype_is_float(dt) && dt_dtype_is_float(st) && "integer types convert only to themselves");
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = DT_MIN((size_t)BLOCK, n - off);
        load_block(acc, (const char *)src + off * ses, st, m);
        if (scale != 1.0f)
            scale_block(acc, m, scale);
        store_block((char *)dst + off * des, dt, acc, m);
    }
}

/* The integer reductions, one per type: T the element type, U the unsigned type of its width
 * (sums wrap in U), IBLOCK elements per block. */
#define IBLOCK 2048
#define DT_INT_REDUCE(name, T, U)                                                                 \
    DT_VECTORIZE static void name(void *dst, void *dst2, const void *const *srcs, int k,         \
                                  size_t n, dt_redop op, bool stream)                            \
    {                                                                                             \
        U acc[IBLOCK];                                                                            \
        for (size_t off = 0; off < n; off += IBLOCK) {                                            \
            size_t m = DT_MIN((size_t)IBLOCK, n - off);                                           \
            memcpy(acc, (const T *)srcs[0] + off, m * sizeof(T));                                 \
            for (int j = 1; j < k; j++) {                                                         \
                const T *restrict s = (const T *)srcs[j] + off;                                   \
                if (op == DT_MAX) {                                                               \
                    for (size_t i = 0; i < m; i++)                                                \
                        acc[i] = s[i] > (T)acc[i] ? (U)s[i] : acc[i];                             \
                } else if (op == DT_MIN) {                                                        \
                    for (size_t i = 0; i < m; i++)                                                \
                        acc[i] = s[i] < (T)acc[i] ? (U)s[i] : acc[i];                             \
                } else {                                                                          \
                    for (size_t i = 0; i < m; i++)                                                \
                        acc[i] += (U)s[i];                                                        \
                }                                                                                 \
            }                                                                                     \
            dt_copy((T *)dst + off, acc, m * sizeof(T), stream);                                  \
            if (dst2)                                                                             \
                memcpy((T *)dst2 + off, acc, m * sizeof(T));                                      \
        }                                                                                         \
    }
DT_INT_REDUCE(reduce_i32, int32_t, uint32_t)
DT_INT_REDUCE(reduce_i64, int64_t, uint64_t)
DT_INT_REDUCE(reduce_u8, uint8_t, uint8_t)

/* float64: accumulates in double, in source order, like the float32 path; NaN as minmax_block. */
DT_VECTORIZE static void reduce_f64(void *dst, void *dst2, const void *const *srcs, int k,
                                    size_t n, dt_redop op, double scale, bool stream)
{
    double acc[IBLOCK];
    for (size_t off = 0; off < n; off += IBLOCK) {
        size_t m = DT_MIN((size_t)IBLOCK, n - off);
        memcpy(acc, (const double *)srcs[0] + off, m * sizeof(double));
        for (int j = 1; j < k; j++) {
            const double *restrict s = (const double *)srcs[j] + off;
            if (op == DT_MAX || op == DT_MIN) {
                for (size_t i = 0; i < m; i++) {
                    double a = acc[i], b = s[i];
                    acc[i] = a != a || b != b ? a + b
                             : op == DT_MAX   ? (b > a ? b : a)
                                              : (b < a ? b : a);
                }
            } else {
                for (size_t i = 0; i < m; i++)
                    acc[i] += s[i];
            }
        }
        if (scale != 1.0 && op != DT_MAX && op != DT_MIN)
            for (size_t i = 0; i < m; i++)
                acc[i] *= scale;
        dt_copy((double *)dst + off, acc, m * sizeof(double), stream);
        if (dst2)
            memcpy((double *)dst2 + off, acc, m * sizeof(double));
    }
}

void dt_f64_divide(double *x, size_t n, double d)
{
    for (size_t i = 0; i < n; i++)
        x[i] /= d;
}

void dt_reduce(void *dst, void *dst2, const void *const *srcs, int k, size_t n, dt_dtype t,
               dt_redop op, float scale, bool stream)
{
    switch (t) {
    case DT_INT32: reduce_i32(dst, dst2, srcs, k, n, op, stream); return;
    case DT_INT64: reduce_i64(dst, dst2, srcs, k, n, op, stream); return;
    case DT_UINT8: reduce_u8(dst, dst2, srcs, k, n, op, stream); return;
    case DT_FLOAT64: reduce_f64(dst, dst2, srcs, k, n, op, (double)scale, stream); return;
    default: break;
    }
    const bool minmax = op == DT_MAX || op == DT_MIN;
    size_t es = dt_dtype_size(t);
    float acc[BLOCK];
    uint16_t half[BLOCK];
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = DT_MIN((size_t)BLOCK, n - off);
        size_t b = off * es;
        load_block(acc, (const char *)srcs[0] + b, t, m);
        for (int j = 1; j < k; j++) {
            if (minmax)
                minmax_block(acc, (const char *)srcs[j] + b, t, m, op == DT_MAX);
            else
                add_block(acc, (const char *)srcs[j] + b, t, m);
        }
        if (scale != 1.0f && !minmax)
            scale_block(acc, m, scale);
        const void *out = acc;
        if (t != DT_FLOAT32) {
            store_block(half, t, acc, m);
            out = half;
        }
        dt_copy((char *)dst + b, out, m * es, stream);
        if (dst2)
            memcpy((char *)dst2 + b, out, m * es);
    }
}
