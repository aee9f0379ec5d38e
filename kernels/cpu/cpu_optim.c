/* cpu_optim.c - optimiser updates and whole-buffer reductions of the CPU backend.
 *
 * SGD and AdamW follow PyTorch's update order exactly (torch.optim.SGD with dampening 0, and
 * torch.optim.AdamW's single-tensor path), so that a run can be checked step by step against
 * PyTorch. Bias corrections are computed in double once per call.
 */
#include <math.h>

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

DT_CPU_CLONES
static void adamw_loop(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                       float b2, float eps, float decay, float step_size, float sqrt_bc2)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float pi = p[i] * decay;                     /* decoupled decay: p *= 1 - lr*wd */
        float mi = m[i] + (1.0f - b1) * (gi - m[i]); /* m.lerp_(g, 1-b1) */
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step_size * (mi / (sqrtf(vi) / sqrt_bc2 + eps));
    }
}

void dt_cpu_adamw_update(dt_backend *be, float *params, const float *grads, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int64_t t)
{
    DT_CPU_PROF_BEGIN(be);
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float sqrt_bc2 = (float)sqrt(bc2);
    float decay = 1.0f - lr * weight_decay;
    adamw_loop(params, grads, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
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
