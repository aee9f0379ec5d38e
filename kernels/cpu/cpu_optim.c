/* cpu_optim.c - optimiser updates and whole-buffer reductions of the CPU backend.
 *
 * SGD and AdamW follow PyTorch's update order exactly (torch.optim.SGD with dampening 0, and
 * torch.optim.AdamW's single-tensor path), so that a run can be checked step by step against
 * PyTorch. Bias corrections are computed in double once per call.
 */
#include <math.h>

#include "common/half.h"
#include "kernels/cpu/cpu.h"

DT_CPU_OPTIMIZE

DT_CPU_CLONES
static void sgd_loop(float *p, const float *g, float *buf, size_t n, float lr, float mom,
                     bool nesterov, float wd, bool first)
{
    for (size_t i = 0; i < n; i++) {
        float d = g[i] + wd * p[i];
        if (mom != 0.0f) {
            float b = first ? d : mom * buf[i] + d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] -= lr * d;
    }
}

void dt_cpu_sgd_update(dt_backend *be, float *params, const float *grads, float *momentum_buf,
                       size_t n, float lr, float momentum, bool nesterov, float weight_decay,
                       bool first_step)
{
    DT_CPU_PROF_BEGIN(be);
    sgd_loop(params, grads, momentum_buf, n, lr, momentum, nesterov, weight_decay, first_step);
    DT_CPU_PROF_END(be, DT_CPU_OP_SGD, 0);
}

/* AdamW, one element at a time: the reference, and the tail of the vector path. Written without
 * fused multiply-adds so that both paths round identically. (GCC does not vectorise this loop:
 * sqrtf keeps its errno branch even under the file's -fno-math-errno pragma.) */
/* The update with its coefficients formed on the host (dt_cpu_adamw_update): a = 1 - b1,
 * b2, c = 1 - b2, decay = 1 - lr*wd, step_size = lr / (1 - b1^t), sqrt_bc2 = sqrt(1 - b2^t). */
static void adamw_scalar(float *p, const float *g, float *m, float *v, size_t i0, size_t n,
                         float a, float b2, float c, float eps, float decay, float step_size,
                         float sqrt_bc2)
{
    for (size_t i = i0; i < n; i++) {
        float gi = g[i];
        float pi = p[i] * decay;           /* decoupled decay: p *= 1 - lr*wd */
        float mi = m[i] + a * (gi - m[i]); /* m.lerp_(g, 1-b1) */
        float vi = v[i] * b2 + c * gi * gi; /* v.mul_(b2).addcmul_(g, g, 1-b2) */
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / sqrt_bc2 + eps));
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_ADAMW_AVX 1
/* The same arithmetic eight lanes at a time (AVX: no FMA, the same correctly rounded sqrt and
 * division), so its results are bit-identical to adamw_scalar's. Returns elements done. */
__attribute__((target("avx"))) static size_t adamw_avx(float *p, const float *g, float *m,
                                                       float *v, size_t n, float a, float b2,
                                                       float c, float eps, float decay,
                                                       float step_size, float sqrt_bc2)
{
    const __m256 vdecay = _mm256_set1_ps(decay), va = _mm256_set1_ps(a);
    const __m256 vb2 = _mm256_set1_ps(b2), vc = _mm256_set1_ps(c);
    const __m256 vstep = _mm256_set1_ps(step_size), vbc = _mm256_set1_ps(sqrt_bc2);
    const __m256 veps = _mm256_set1_ps(eps);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i), mi = _mm256_loadu_ps(m + i);
        __m256 vi = _mm256_loadu_ps(v + i), pi = _mm256_loadu_ps(p + i);
        pi = _mm256_mul_ps(pi, vdecay);
        mi = _mm256_add_ps(mi, _mm256_mul_ps(va, _mm256_sub_ps(gi, mi)));
        vi = _mm256_add_ps(_mm256_mul_ps(vi, vb2), _mm256_mul_ps(_mm256_mul_ps(vc, gi), gi));
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc), veps);
        pi = _mm256_sub_ps(pi, _mm256_mul_ps(vstep, _mm256_div_ps(mi, den)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
    }
    return i;
}
#endif

void dt_cpu_adamw_update(dt_backend *be, float *params, const float *grads, float *m, float *v,
                         size_t n, double lr, double beta1, double beta2, double eps,
                         double weight_decay, int64_t t)
{
    DT_CPU_PROF_BEGIN(be);
    /* in double, rounded once: torch.optim.AdamW's Python-float arithmetic */
    double bc1 = 1.0 - pow(beta1, (double)t);
    double bc2 = 1.0 - pow(beta2, (double)t);
    float a = (float)(1.0 - beta1), b2 = (float)beta2, c = (float)(1.0 - beta2);
    float step_size = (float)(lr / bc1);
    float sqrt_bc2 = (float)sqrt(bc2);
    float decay = (float)(1.0 - lr * weight_decay);
    size_t done = 0;
#ifdef HAVE_ADAMW_AVX
    if (__builtin_cpu_supports("avx"))
        done = adamw_avx(params, grads, m, v, n, a, b2, c, (float)eps, decay, step_size,
                         sqrt_bc2);
#endif
    adamw_scalar(params, grads, m, v, done, n, a, b2, c, (float)eps, decay, step_size, sqrt_bc2);
    DT_CPU_PROF_END(be, DT_CPU_OP_ADAMW, 0);
}

DT_CPU_CLONES
static double sumsq_loop(const float *x, size_t n)
{
    double acc[4] = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            acc[j] += (double)x[i + j] * x[i + j];
    double s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

double dt_cpu_sumsq(dt_backend *be, const float *x, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    double s = sumsq_loop(x, n);
    DT_CPU_PROF_END(be, DT_CPU_OP_SUMSQ, 0);
    return s;
}

size_t dt_cpu_count_nonfinite(dt_backend *be, const float *x, size_t n)
{
    DT_CPU_PROF_BEGIN(be);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(x[i]);
    DT_CPU_PROF_END(be, DT_CPU_OP_NONFINITE, 0);
    return bad;
}

void dt_cpu_to_half(dt_backend *be, uint16_t *half, const float *x, size_t n, float scale,
                    bool bf16)
{
    DT_CPU_PROF_BEGIN(be);
    void (*convert)(uint16_t *, const float *, size_t) = bf16 ? dt_f32_to_bf16_n : dt_f32_to_f16_n;
    if (scale == 1.0f) {
        convert(half, x, n);
    } else {
        float tmp[1024];
        for (size_t off = 0; off < n; off += 1024) {
            size_t m = n - off < 1024 ? n - off : 1024;
            for (size_t i = 0; i < m; i++)
                tmp[i] = x[off + i] * scale;
            convert(half + off, tmp, m);
        }
    }
    DT_CPU_PROF_END(be, DT_CPU_OP_TO_HALF, 0);
}

void dt_cpu_from_half(dt_backend *be, float *x, const uint16_t *half, size_t n, float scale,
                      bool bf16)
{
    DT_CPU_PROF_BEGIN(be);
    (bf16 ? dt_bf16_to_f32_n : dt_f16_to_f32_n)(x, half, n);
    if (scale != 1.0f)
        for (size_t i = 0; i < n; i++)
            x[i] *= scale;
    DT_CPU_PROF_END(be, DT_CPU_OP_FROM_HALF, 0);
}
