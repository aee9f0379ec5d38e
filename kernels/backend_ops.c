/* backend_ops.c - the helpers around the op table (see backend_ops.h): default options, conv
 * shapes, the BatchNorm statistics merge. Plain C with no dependencies, so libdtrain_cuda.so
 * compiles it too (Makefile CU_CSRC). */
#include "kernels/backend_ops.h"

#include <stdio.h>
#include <string.h>

void dt_backend_opts_default(dt_backend_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->precision = DT_PREC_FP32;
}

void dt_conv2d_shape_init(dt_conv2d_shape *s, int N, int C, int H, int W, int K, int R, int S,
                          int stride, int pad)
{
    s->N = N;
    s->C = C;
    s->H = H;
    s->W = W;
    s->K = K;
    s->R = R;
    s->S = S;
    s->stride = stride;
    s->pad = pad;
    s->P = (H + 2 * pad - R) / stride + 1;
    s->Q = (W + 2 * pad - S) / stride + 1;
}

double dt_bn_stats_combine(const float *parts, int R, int C, float *sum, float *sumsq)
{
    const size_t stride = 2 * (size_t)C + 1;
    double n = 0.0;
    for (int r = 0; r < R; r++)
        n += (double)parts[r * stride + 2 * (size_t)C];
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int r = 0; r < R; r++)
            s += (double)parts[r * stride + c];
        const double mean = n > 0.0 ? s / n : 0.0;
        /* M2 = sum_r M2_r + sum_r n_r (mean_r - mean)^2 */
        double m2 = 0.0;
        for (int r = 0; r < R; r++) {
            const float *p = parts + r * stride;
            const double nr = (double)p[2 * (size_t)C];
            if (nr <= 0.0)
                continue;
            const double d = (double)p[c] / nr - mean;
            m2 += (double)p[C + c] + nr * d * d;
        }
        sum[c] = (float)s;
        sumsq[c] = (float)m2;
    }
    return n;
}

const char *dt_mem_cat_name(dt_mem_cat c)
{
    switch (c) {
    case DT_MEM_OTHER: return "other";
    case DT_MEM_PARAMS: return "params";
    case DT_MEM_GRADS: return "grads";
    case DT_MEM_OPTIM: return "optim";
    case DT_MEM_ACTS: return "activations";
    case DT_MEM_COMM: return "comm";
    }
    return "unknown";
}

static int cat_index(dt_mem_cat c)
{
    return (int)c >= 0 && (int)c < DT_MEM_CAT_COUNT ? (int)c : (int)DT_MEM_OTHER;
}

void dt_mem_stats_add(dt_mem_stats *s, dt_mem_cat c, size_t bytes)
{
    int i = cat_index(c);
    s->cur[i] += bytes;
    if (s->cur[i] > s->peak[i])
        s->peak[i] = s->cur[i];
    s->total += bytes;
    if (s->total > s->total_peak)
        s->total_peak = s->total;
}

void dt_mem_stats_sub(dt_mem_stats *s, dt_mem_cat c, size_t bytes)
{
    int i = cat_index(c);
    size_t b = bytes < s->cur[i] ? bytes : s->cur[i];
    s->cur[i] -= b;
    s->total -= b < s->total ? b : s->total;
}

int dt_mem_admit(const dt_mem_stats *s, size_t limit, size_t peak, const char *who, dt_mem_cat c,
                 size_t bytes, dt_err *err)
{
    if (!limit || (bytes <= limit && s->total <= limit - bytes))
        return 0;
    char held[512];
    size_t n = 0;
    held[0] = '\0';
    for (int i = 0; i < DT_MEM_CAT_COUNT && n < sizeof held; i++) {
        if (!s->cur[i])
            continue;
        int w = snprintf(held + n, sizeof held - n, "%s%s %.2f MiB", n ? ", " : "",
                         dt_mem_cat_name((dt_mem_cat)i), (double)s->cur[i] / 1048576.0);
        n += w > 0 ? (size_t)w : 0;
    }
    if (!n)
        snprintf(held, sizeof held, "nothing");
    return dt_err_set(err, -ENOMEM,
                      "%s backend: " DT_MEM_OOM_TEXT ": asked for %zu bytes (%.2f MiB) of %s, "
                      "holding %.2f MiB of the %.2f MiB budget (job.device_memory = %zu) [%s]; "
                      "peak so far %.2f MiB",
                      who, bytes, (double)bytes / 1048576.0, dt_mem_cat_name(c),
                      (double)s->total / 1048576.0, (double)limit / 1048576.0, limit, held,
                      (double)peak / 1048576.0);
}

dt_mem_cat dt_mem_tag(dt_backend *be, dt_mem_cat cat)
{
    return be && be->mem_category ? be->mem_category(be, cat) : DT_MEM_OTHER;
}

void dt_mem_read(dt_backend *be, dt_mem_stats *out)
{
    memset(out, 0, sizeof *out);
    if (be && be->mem_stats)
        be->mem_stats(be, out);
}

void dt_mem_external(dt_backend *be, dt_mem_cat cat, size_t bytes, bool add)
{
    if (be && be->mem_external)
        be->mem_external(be, cat, bytes, add);
}

size_t dt_mem_granule(dt_backend *be, const void *base)
{
    return be && be->mem_granule && base ? be->mem_granule(be, base) : 0;
}

void dt_mem_reset_peak(dt_backend *be)
{
    if (be && be->mem_reset_peak)
        be->mem_reset_peak(be);
}
