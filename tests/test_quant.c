/* test_quant.c - blockwise int8 quantisation (runtime/train/parallel/dpsync/quant.h): sizes,
 * the error bound of round-to-nearest, stochastic rounding's unbiasedness, zero blocks. */
#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "common/util.h"
#include "runtime/train/parallel/dpsync/quant.h"
#include "tests/harness.h"

static void test_sizes(void)
{
    DT_CHECK_INT(dt_quant_blocks(0), 0);
    DT_CHECK_INT(dt_quant_blocks(1), 1);
    DT_CHECK_INT(dt_quant_blocks(256), 1);
    DT_CHECK_INT(dt_quant_blocks(257), 2);
    DT_CHECK_INT(dt_quant_bytes(1000), 1000 + 4 * 4);
    /* the wire ratio against fp32 on a large vector: (256 + 4) / 1024 */
    size_t n = 1 << 20;
    double ratio = (double)dt_quant_bytes(n) / (double)(n * sizeof(float));
    DT_CHECK_MSG(fabs(ratio - 260.0 / 1024.0) < 1e-9 && ratio <= 0.27, "ratio %g", ratio);
}

static void test_nearest(void)
{
    size_t n = 1000; /* three whole blocks and a short one */
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), sc[4];
    int8_t *q = malloc(n);
    dt_rng r;
    dt_rng_seed(&r, 7);
    dt_rng_fill_normal(&r, x, n, 0, 1);
    for (size_t i = 512; i < 768; i++)
        x[i] = 0; /* a block of zeros */
    x[3] = 50; /* an outlier widens only its own block */
    dt_quant_int8(x, n, 0.5f, q, sc, NULL);
    DT_CHECK(sc[2] == 0);
    DT_CHECK(fabsf(sc[0] - 25.0f / 127) < 1e-6f);
    dt_dequant_int8(q, sc, n, y, 0);
    for (size_t i = 0; i < n; i++) {
        float s = sc[i / DT_QUANT_BLOCK];
        DT_CHECK_MSG(fabsf(y[i] - 0.5f * x[i]) <= s * 0.5f * 1.0001f + 1e-7f,
                     "element %zu: %g for %g (scale %g)", i, y[i], 0.5f * x[i], s);
        DT_CHECK(q[i] >= -127 && q[i] <= 127);
    }
    DT_CHECK_INT(q[3], 127);
    /* an inf in a block (fp16's overflow): q 0 there, the block NaN when dequantised, the others
     * untouched */
    float keep = x[300];
    x[300] = INFINITY;
    dt_quant_int8(x, n, 1.0f, q, sc, NULL);
    DT_CHECK(isinf(sc[1]) && q[256] == 0 && q[511] == 0);
    dt_dequant_int8(q, sc, n, y, 0);
    DT_CHECK(isnan(y[300]) && isnan(y[256]) && isfinite(y[0]));
    x[300] = keep;
    dt_quant_int8(x, n, 0.5f, q, sc, NULL);
    dt_dequant_int8(q, sc, n, y, 0);
    /* acc adds */
    dt_dequant_int8(q, sc, n, y, 1);
    DT_CHECK(fabsf(y[3] - 50.0f) < 1e-4f);
    free(x);
    free(y);
    free(q);
}

static void test_stochastic(void)
{
    /* one block holding 127 (sets the scale to 1) and a value 0.3 between two levels: the mean
     * of the quantised value over many draws approaches 0.3, not round-to-nearest's 0 */
    float x[2] = {127.0f, 0.3f}, sc[1], sum = 0;
    int8_t q[2];
    dt_rng r;
    dt_rng_seed(&r, 11);
    int draws = 20000;
    for (int k = 0; k < draws; k++) {
        dt_quant_int8(x, 2, 1.0f, q, sc, &r);
        DT_CHECK(q[1] == 0 || q[1] == 1);
        sum += q[1] * sc[0];
    }
    float mean = sum / (float)draws; /* std of the mean: sqrt(0.21 / 20000) = 0.0032 */
    DT_CHECK_MSG(fabsf(mean - 0.3f) < 0.02f, "mean %g", mean);
    dt_quant_int8(x, 2, 1.0f, q, sc, NULL);
    DT_CHECK_INT(q[1], 0);
}

/* Sign quantisation: signs, the block scale mean|x|, the residual x - dequantised, and that the
 * scale is the best one for the signs (a 1% larger or smaller one has a larger squared error). */
static void test_sign(void)
{
    size_t n = 600; /* 9 whole blocks of 64 and a short one; 19 sign words, the last part-used */
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *e = malloc(n * sizeof *e);
    float sc[10];
    uint32_t bits[19];
    dt_rng r;
    dt_rng_seed(&r, 5);
    dt_rng_fill_normal(&r, x, n, 0, 1);
    x[7] = 0; /* zero counts as + */
    dt_quant_sign(x, n, bits, sc, e);
    DT_CHECK((bits[18] >> (600 - 576)) == 0); /* the unused bits cleared */
    DT_CHECK_INT(dt_quant_sign_blocks(n), 10);
    for (int b = 0; b < 10; b++) {
        size_t lo = (size_t)b * DT_QUANT_SIGN_BLOCK;
        size_t hi = lo + DT_QUANT_SIGN_BLOCK < n ? lo + DT_QUANT_SIGN_BLOCK : n;
        double sum = 0;
        for (size_t i = lo; i < hi; i++)
            sum += fabsf(x[i]);
        DT_CHECK_MSG(fabs(sc[b] - sum / (double)(hi - lo)) < 1e-6, "block %d scale %g", b, sc[b]);
        double err[3] = {0};
        const double f[3] = {1.0, 1.01, 0.99};
        for (size_t i = lo; i < hi; i++)
            for (int k = 0; k < 3; k++) {
                double v = (x[i] < 0 ? -1 : 1) * sc[b] * f[k] - x[i];
                err[k] += v * v;
            }
        DT_CHECK(err[0] < err[1] && err[0] < err[2]);
    }
    dt_dequant_sign(bits, sc, n, y, 0);
    for (size_t i = 0; i < n; i++) {
        float s = sc[i / DT_QUANT_SIGN_BLOCK];
        DT_CHECK_MSG(y[i] == (x[i] < 0 ? -s : s), "element %zu: %g for %g", i, y[i], x[i]);
        DT_CHECK(e[i] == x[i] - y[i]);
    }
    /* acc adds; the residual may be computed in place */
    dt_dequant_sign(bits, sc, n, y, 1);
    DT_CHECK(y[1] == 2 * (x[1] < 0 ? -sc[0] : sc[0]));
    float x0 = x[0];
    dt_quant_sign(x, n, bits, sc, x);
    DT_CHECK(x[0] == e[0] && e[0] == x0 - (x0 < 0 ? -sc[0] : sc[0]));
    free(x);
    free(y);
    free(e);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"quant_sizes", test_sizes, 0},
        {"quant_nearest", test_nearest, 0},
        {"quant_stochastic", test_stochastic, 0},
        {"quant_sign", test_sign, 0},
    };
    return dt_test_main("test_quant", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
