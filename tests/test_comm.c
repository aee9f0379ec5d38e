/* test_comm.c - the collectives: conversions and reductions, every collective with every dtype
 * and odd sizes on 1 to 4 ranks over each transport (shared memory, TCP ring, hierarchical),
 * asynchronous work, dead and stalled peers, mismatched collectives, and shared-memory cleanup.
 *
 * Ranks are forked processes that bootstrap through a real store server on 127.0.0.1 with an
 * ephemeral port. Hosts are simulated with DTRAIN_COMM_HOST_ID, so the hierarchical paths run on
 * one machine. Every value a test reduces is a small integer, so sums are exact in every dtype
 * and results can be compared bit for bit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/comm_reduce.h"
#include "runtime/comm/comm_shm.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* A group of forked ranks                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct group {
    int n;
    const char *transport;  /* DTRAIN_COMM_TRANSPORT */
    const char *hosts;      /* host id of each rank, comma separated ("" = all on this host) */
    int timeout_ms;
    int attempt;
    int slot_kb;            /* DTRAIN_COMM_SHM_SLOT_KB (0 = default) */
    int segment_kb;         /* DTRAIN_COMM_TCP_SEGMENT_KB (0 = default) */
    int last_mem_mb;        /* DTRAIN_COMM_SHM_MEM_MB + 1 of the last rank (0 = unset) */
    char run_id[96];
    int port;               /* store */
} group;

typedef void (*rank_fn)(dt_comm *c, int rank, int n, void *arg);

/* A rank's environment beyond the transport and host (dt_test_world.rank_env; env_arg: g). */
static void group_env(const dt_test_world *w, int rank, const void *env_arg)
{
    const group *g = env_arg;
    char v[16];
    snprintf(v, sizeof v, "%d", g->slot_kb);
    if (g->slot_kb)
        setenv("DTRAIN_COMM_SHM_SLOT_KB", v, 1);
    snprintf(v, sizeof v, "%d", g->segment_kb);
    if (g->segment_kb)
        setenv("DTRAIN_COMM_TCP_SEGMENT_KB", v, 1);
    snprintf(v, sizeof v, "%d", g->last_mem_mb - 1);
    if (g->last_mem_mb && rank == g->n - 1)
        setenv("DTRAIN_COMM_SHM_MEM_MB", v, 1);
    else
        unsetenv("DTRAIN_COMM_SHM_MEM_MB");
}

typedef struct group_run {
    rank_fn fn;
    void *arg;
} group_run;

/* The body of a rank process. */
static void group_rank(dt_test_rank *x, void *arg)
{
    const group_run *gr = arg;
    gr->fn(x->c, x->rank, x->n, gr->arg);
}

static void new_run_id(group *g, const char *what)
{
    static int counter;
    snprintf(g->run_id, sizeof g->run_id, "test-%d-%s-%d", (int)getpid(), what, ++counter);
}

/* Runs fn on g->n forked ranks against a fresh store server; status[r] gets each exit status
 * (as waitpid reports it). Kills everything after limit_s. */
static void run_group_status(group *g, rank_fn fn, void *arg, int limit_s, int *status)
{
    if (!g->run_id[0])
        new_run_id(g, "g");
    dt_test_world w = {.n = g->n, .transport = g->transport, .hosts = g->hosts,
                       .timeout_ms = g->timeout_ms, .attempt = g->attempt, .rank_env = group_env,
                       .env_arg = g};
    dt_strlcpy(w.run_id, g->run_id, sizeof w.run_id);
    group_run gr = {.fn = fn, .arg = arg};
    dt_test_world_run(&w, group_rank, &gr, limit_s, status);
    g->port = w.port;
}

/* Runs fn on every rank and requires that every rank exits 0. */
static void run_group(group *g, rank_fn fn, void *arg, int limit_s)
{
    int status[16];
    run_group_status(g, fn, arg, limit_s, status);
    for (int r = 0; r < g->n; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "rank %d of %d (%s, hosts \"%s\") ended with status %d", r, g->n,
                     g->transport ? g->transport : "auto", g->hosts ? g->hosts : "", status[r]);
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A small integer, exact in bf16 and fp16, that depends on the rank and the index. */
static float val(int rank, size_t i) { return (float)((int)((i * 7 + (size_t)rank * 13) % 17) - 8); }

static void fill(void *buf, dt_dtype t, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) {
        float v = val(rank, i);
        if (t == DT_FLOAT32)
            ((float *)buf)[i] = v;
        else if (t == DT_BFLOAT16)
            ((uint16_t *)buf)[i] = dt_f32_to_bf16(v);
        else
            ((uint16_t *)buf)[i] = dt_f32_to_f16(v);
    }
}

static float get(const void *buf, dt_dtype t, size_t i)
{
    if (t == DT_FLOAT32)
        return ((const float *)buf)[i];
    if (t == DT_BFLOAT16)
        return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    return dt_f16_to_f32(((const uint16_t *)buf)[i]);
}

/* The value of x rounded to dtype t. */
static float round_to(float x, dt_dtype t)
{
    if (t == DT_BFLOAT16)
        return dt_bf16_to_f32(dt_f32_to_bf16(x));
    if (t == DT_FLOAT16)
        return dt_f16_to_f32(dt_f32_to_f16(x));
    return x;
}

static const size_t sizes[] = {0, 1, 7, 16, 1000, 4097, 100003, 1300001};
static const dt_dtype dtypes[] = {DT_FLOAT32, DT_BFLOAT16, DT_FLOAT16};

/* ------------------------------------------------------------------------------------------ */
/* Conversions and reductions                                                                 */
/* ------------------------------------------------------------------------------------------ */

static void test_fp16_exhaustive(void)
{
    /* Every half value converts to float and back to itself (NaNs stay NaNs). */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_f16(f);
        bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? !(f != f) || (back & 0x7c00) != 0x7c00 || !(back & 0x3ff) : back != h)
            bad++;
    }
    DT_CHECK_INT(bad, 0);
    /* Known values, including the subnormal range, rounding ties to even, and overflow. */
    DT_CHECK_INT(dt_f32_to_f16(1.0f), 0x3c00);
    DT_CHECK_INT(dt_f32_to_f16(-2.0f), 0xc000);
    DT_CHECK_INT(dt_f32_to_f16(65504.0f), 0x7bff);
    DT_CHECK_INT(dt_f32_to_f16(65520.0f), 0x7c00);    /* rounds up to infinity */
    DT_CHECK_INT(dt_f32_to_f16(65519.0f), 0x7bff);
    DT_CHECK_INT(dt_f32_to_f16(5.9604645e-8f), 0x0001); /* smallest subnormal */
    DT_CHECK_INT(dt_f32_to_f16(2.9802322e-8f), 0x0000); /* half of it: tie to even (0) */
    DT_CHECK_INT(dt_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie: down to even */
    DT_CHECK_INT(dt_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie: up to even */
    DT_CHECK_INT(dt_f32_to_f16(-0.0f), 0x8000);
    DT_CHECK_NEAR(dt_f16_to_f32(0x3555), 0.333251953125, 0);

    /* The array forms (F16C where the CPU has it) give the scalar forms' bits: every half, and
     * every 4099th float32 bit pattern (all exponents, both signs, NaNs and infinities), in a
     * length that leaves a tail. */
    enum { NF = 1048577 };
    uint16_t *hs = malloc(65536 * sizeof *hs), *h2 = malloc(NF * sizeof *h2);
    float *fs = malloc(NF * sizeof *fs), *f2 = malloc(65536 * sizeof *f2);
    DT_REQUIRE(hs && h2 && fs && f2);
    for (uint32_t h = 0; h < 65536; h++)
        hs[h] = (uint16_t)h;
    dt_f16_to_f32_n(f2, hs, 65536);
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float want = dt_f16_to_f32((uint16_t)h);
        if (!(want != want ? f2[h] != f2[h] : dt_f32_bits(f2[h]) == dt_f32_bits(want)))
            bad++;
    }
    DT_CHECK_MSG(bad == 0, "dt_f16_to_f32_n: %d of 65536 halves differ from dt_f16_to_f32", bad);
    for (uint32_t i = 0; i < NF; i++)
        fs[i] = dt_bits_f32((uint32_t)((uint64_t)i * 4099u * 997u));
    dt_f32_to_f16_n(h2, fs, NF);
    bad = 0;
    for (uint32_t i = 0; i < NF; i++) {
        uint16_t want = dt_f32_to_f16(fs[i]);
        bool nan = fs[i] != fs[i];
        if (nan ? (h2[i] & 0x7c00) != 0x7c00 || !(h2[i] & 0x3ff) : h2[i] != want)
            bad++;
    }
    DT_CHECK_MSG(bad == 0, "dt_f32_to_f16_n: %d of %d floats differ from dt_f32_to_f16", bad, NF);
    /* bfloat16 likewise */
    dt_f32_to_bf16_n(h2, fs, NF);
    bad = 0;
    for (uint32_t i = 0; i < NF; i++) {
        uint16_t want = dt_f32_to_bf16(fs[i]);
        bool nan = fs[i] != fs[i];
        if (nan ? (h2[i] & 0x7f80) != 0x7f80 || !(h2[i] & 0x7f) : h2[i] != want)
            bad++;
    }
    DT_CHECK_MSG(bad == 0, "dt_f32_to_bf16_n: %d of %d floats differ from dt_f32_to_bf16", bad,
                 NF);
    dt_bf16_to_f32_n(f2, hs, 65536);
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (dt_f32_bits(f2[h]) != dt_f32_bits(dt_bf16_to_f32((uint16_t)h)))
            bad++;
    DT_CHECK_MSG(bad == 0, "dt_bf16_to_f32_n: %d of 65536 differ from dt_bf16_to_f32", bad);
    free(hs);
    free(h2);
    free(fs);
    free(f2);
}

static void test_bf16_rounding(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_bf16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_bf16(f);
        bool nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        if (nan ? (back & 0x7f80) != 0x7f80 || !(back & 0x7f) : back != h)
            bad++;
    }
    DT_CHECK_INT(bad, 0);
    DT_CHECK_INT(dt_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties to even (1). */
    DT_CHECK_INT(dt_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
    DT_CHECK_INT(dt_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    DT_CHECK_INT(dt_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536), 0x3f81);
    /* Random floats: the rounded value is the nearest representable one. */
    uint32_t x = 12345;
    for (int i = 0; i < 100000; i++) {
        x = x * 1664525u + 1013904223u;
        float f;
        uint32_t u = (x & 0x3fffffffu) | 0x3c000000u; /* moderate exponents */
        memcpy(&f, &u, 4);
        float r = dt_bf16_to_f32(dt_f32_to_bf16(f));
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        float flo, fhi;
        memcpy(&flo, &lo, 4);
        memcpy(&fhi, &hi, 4);
        double dlo = fabs((double)f - flo), dhi = fabs((double)fhi - f);
        if (!((r == flo && dlo <= dhi) || (r == fhi && dhi <= dlo)))
            bad++;
    }
    DT_CHECK_INT(bad, 0);
}

static void test_reduce_kernels(void)
{
    enum { N = 10007 };
    for (size_t d = 0; d < DT_ARRAY_LEN(dtypes); d++) {
        dt_dtype t = dtypes[d];
        size_t es = dt_dtype_size(t);
        for (int k = 1; k <= 5; k++) {
            char *src[5], *out = malloc(N * es), *out2 = malloc(N * es);
            const void *srcs[5];
            for (int j = 0; j < k; j++) {
                src[j] = malloc(N * es);
                fill(src[j], t, N, j);
                srcs[j] = src[j];
            }
            float scale = k == 3 ? 0.5f : 1.0f;
            dt_reduce(out, out2, srcs, k, N, t, DT_SUM, scale, k % 2 == 0);
            int bad = 0;
            for (size_t i = 0; i < N; i++) {
                float want = 0;
                for (int j = 0; j < k; j++)
                    want += val(j, i);
                want = round_to(want * scale, t);
                if (get(out, t, i) != want || get(out2, t, i) != want)
                    bad++;
            }
            DT_CHECK_MSG(bad == 0, "%s, %d sources: %d wrong", dt_dtype_name(t), k, bad);
            /* In place into the first source. */
            dt_reduce(src[0], NULL, srcs, k, N, t, DT_SUM, 1.0f, k % 2 == 1);
            dt_stream_fence();
            bad = 0;
            for (size_t i = 0; i < N; i++) {
                float want = 0;
                for (int j = 0; j < k; j++)
                    want += val(j, i);
                if (get(src[0], t, i) != round_to(want, t))
                    bad++;
            }
            DT_CHECK_MSG(bad == 0, "%s, %d sources in place: %d wrong", dt_dtype_name(t), k, bad);
            for (int j = 0; j < k; j++)
                free(src[j]);
            free(out);
            free(out2);
        }
    }
    /* Conversion with scale, both ways. */
    float f[5] = {1, -2, 3.5f, 1e-3f, 100};
    uint16_t h[5];
    float back[5];
    dt_dtype_convert(h, DT_BFLOAT16, f, DT_FLOAT32, 5, 0.5f);
    dt_dtype_convert(back, DT_FLOAT32, h, DT_BFLOAT16, 5, 2.0f);
    for (int i = 0; i < 5; i++)
        DT_CHECK_NEAR(back[i], f[i], fabs(f[i]) / 128);
    DT_CHECK_INT(dt_dtype_size(DT_FLOAT32), 4);
    DT_CHECK_INT(dt_dtype_size(DT_BFLOAT16), 2);
    DT_CHECK_STR(dt_dtype_name(DT_FLOAT16), "float16");
}

/* ------------------------------------------------------------------------------------------ */
/* Integer and byte types                                                                     */
/* ------------------------------------------------------------------------------------------ */

static const dt_dtype itypes[] = {DT_INT32, DT_INT64, DT_UINT8};

/* The value v stored in type t, read back (int32 sign-extended, uint8 zero-extended). */
static int64_t itrunc(dt_dtype t, uint64_t v)
{
    if (t == DT_INT32)
        return (int64_t)(int32_t)(uint32_t)v;
    if (t == DT_UINT8)
        return (int64_t)(uint8_t)v;
    return (int64_t)v;
}

/* Rank- and index-dependent values beyond float precision: int64 around +-(2^53 + 1) (a float32
 * or float64 path loses the low bits), int32 near +-2^31 (sums of two ranks wrap), uint8 near
 * 255 (sums wrap). */
static int64_t ival(dt_dtype t, int rank, size_t i)
{
    int neg = (int)((i + (size_t)rank) & 1);
    uint64_t mag;
    if (t == DT_INT64)
        mag = (1ull << 53) + 1 + (uint64_t)rank * 1000003u + (uint64_t)i;
    else if (t == DT_INT32)
        mag = 0x7ffffff0u - (uint64_t)rank * 3u - (uint64_t)(i % 5);
    else
        return itrunc(t, 200u + (uint64_t)rank * 31u + (uint64_t)i);
    return itrunc(t, neg ? (uint64_t)0 - mag : mag);
}

static int64_t iget(const void *buf, dt_dtype t, size_t i)
{
    if (t == DT_INT32)
        return ((const int32_t *)buf)[i];
    if (t == DT_INT64)
        return ((const int64_t *)buf)[i];
    return ((const uint8_t *)buf)[i];
}

static void ifill(void *buf, dt_dtype t, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) {
        int64_t v = ival(t, rank, i);
        if (t == DT_INT32)
            ((int32_t *)buf)[i] = (int32_t)v;
        else if (t == DT_INT64)
            ((int64_t *)buf)[i] = v;
        else
            ((uint8_t *)buf)[i] = (uint8_t)v;
    }
}

/* The exact reduction over ranks 0..n-1 of element i (sums wrap in t). */
static int64_t iwant(dt_dtype t, dt_redop op, int n, size_t i)
{
    uint64_t sum = 0;
    int64_t best = ival(t, 0, i);
    for (int r = 0; r < n; r++) {
        int64_t v = ival(t, r, i);
        sum += (uint64_t)v;
        if (op == DT_MAX ? v > best : v < best)
            best = v;
    }
    return op == DT_SUM ? itrunc(t, sum) : best;
}

static void test_int_kernels(void)
{
    enum { N = 5003 };
    const dt_redop ops[] = {DT_SUM, DT_MAX, DT_MIN};
    DT_CHECK_INT(dt_dtype_size(DT_INT32), 4);
    DT_CHECK_INT(dt_dtype_size(DT_INT64), 8);
    DT_CHECK_INT(dt_dtype_size(DT_UINT8), 1);
    DT_CHECK_STR(dt_dtype_name(DT_INT64), "int64");
    DT_CHECK_STR(dt_dtype_name(DT_UINT8), "uint8");
    DT_CHECK(!dt_dtype_is_float(DT_INT32) && dt_dtype_is_float(DT_BFLOAT16));
    DT_CHECK(!dt_dtype_valid(DT_DTYPE_COUNT) && !dt_dtype_valid(-1));
    for (size_t d = 0; d < DT_ARRAY_LEN(itypes); d++) {
        dt_dtype t = itypes[d];
        size_t es = dt_dtype_size(t);
        for (size_t o = 0; o < DT_ARRAY_LEN(ops); o++) {
            for (int k = 1; k <= 4; k++) {
                char *src[4], *out = malloc(N * es), *out2 = malloc(N * es);
                const void *srcs[4];
                for (int j = 0; j < k; j++) {
                    src[j] = malloc(N * es);
                    ifill(src[j], t, N, j);
                    srcs[j] = src[j];
                }
                dt_reduce(out, out2, srcs, k, N, t, ops[o], 1.0f, k % 2 == 0);
                /* in place into the first source, as the transports do */
                dt_reduce(src[0], NULL, srcs, k, N, t, ops[o], 1.0f, false);
                dt_stream_fence();
                int bad = 0;
                for (size_t i = 0; i < N; i++) {
                    int64_t want = iwant(t, ops[o], k, i);
                    bad += iget(out, t, i) != want || iget(out2, t, i) != want ||
                           iget(src[0], t, i) != want;
                }
                DT_CHECK_MSG(bad == 0, "%s %s, %d sources: %d wrong", dt_redop_name(ops[o]),
                             dt_dtype_name(t), k, bad);
                for (int j = 0; j < k; j++)
                    free(src[j]);
                free(out);
                free(out2);
            }
        }
    }
    /* 2^53 + 1 survives a sum: a float64 accumulator would give 2^54. */
    int64_t a[1] = {(1ll << 53) + 1}, b[1] = {(1ll << 53) + 1}, r[1];
    const void *ab[2] = {a, b};
    dt_reduce(r, NULL, ab, 2, 1, DT_INT64, DT_SUM, 1.0f, false);
    DT_CHECK(r[0] == (1ll << 54) + 2);
    /* Floating max and min: the largest / smallest value, rounded to the type once. */
    float x[3] = {1.5f, -2, 7}, y[3] = {-1, 3, 7.25f}, mx[3], mn[3];
    const void *xy[2] = {x, y};
    dt_reduce(mx, NULL, xy, 2, 3, DT_FLOAT32, DT_MAX, 0.5f, false);
    dt_reduce(mn, NULL, xy, 2, 3, DT_FLOAT32, DT_MIN, 0.5f, false);
    DT_CHECK(mx[0] == 1.5f && mx[1] == 3 && mx[2] == 7.25f);
    DT_CHECK(mn[0] == -1 && mn[1] == -2 && mn[2] == 7);
    uint16_t hx[3], hy[3], hm[3];
    dt_dtype_convert(hx, DT_BFLOAT16, x, DT_FLOAT32, 3, 1.0f);
    dt_dtype_convert(hy, DT_BFLOAT16, y, DT_FLOAT32, 3, 1.0f);
    const void *hxy[2] = {hx, hy};
    dt_reduce(hm, NULL, hxy, 2, 3, DT_BFLOAT16, DT_MAX, 1.0f, false);
    DT_CHECK(dt_bf16_to_f32(hm[1]) == 3 && dt_bf16_to_f32(hm[2]) == 7.25f);
}

/* Every collective on every integer type, checked exactly; avg is refused. */
static void int_collectives(dt_comm *c, int rank, int n, void *argp)
{
    (void)argp;
    static const size_t isizes[] = {1, 7, 4097, 100003};
    const dt_redop ops[] = {DT_SUM, DT_MAX, DT_MIN};
    dt_err err = {0};
    for (size_t d = 0; d < DT_ARRAY_LEN(itypes); d++) {
        dt_dtype t = itypes[d];
        size_t es = dt_dtype_size(t);
        for (size_t s = 0; s < DT_ARRAY_LEN(isizes); s++) {
            size_t count = isizes[s];
            char *buf = malloc((size_t)n * count * es), *recv = malloc((size_t)n * count * es);
            for (size_t o = 0; o < DT_ARRAY_LEN(ops); o++) {
                ifill(buf, t, count, rank);
                int rc = dt_comm_allreduce(c, buf, count, t, ops[o], NULL, &err);
                RCHECK(rc == 0, "allreduce %s: %s", dt_dtype_name(t), err.msg);
                size_t bad = 0;
                for (size_t i = 0; i < count && !rc; i++)
                    bad += iget(buf, t, i) != iwant(t, ops[o], n, i);
                RCHECK(bad == 0, "allreduce %s %s x %zu on %d ranks: %zu wrong (first %lld, "
                       "want %lld)", dt_redop_name(ops[o]), dt_dtype_name(t), count, n, bad,
                       (long long)iget(buf, t, 0), (long long)iwant(t, ops[o], n, 0));
            }
            /* broadcast */
            int root = (int)((s + d) % (size_t)n);
            ifill(buf, t, count, rank);
            int rc = dt_comm_broadcast(c, buf, count, t, root, NULL, &err);
            RCHECK(rc == 0, "broadcast %s: %s", dt_dtype_name(t), err.msg);
            size_t bad = 0;
            for (size_t i = 0; i < count && !rc; i++)
                bad += iget(buf, t, i) != ival(t, root, i);
            RCHECK(bad == 0, "broadcast %s x %zu from %d: %zu wrong", dt_dtype_name(t), count,
                   root, bad);
            /* allgather */
            ifill(buf, t, count, rank);
            rc = dt_comm_allgather(c, buf, recv, count, t, NULL, &err);
            RCHECK(rc == 0, "allgather %s: %s", dt_dtype_name(t), err.msg);
            bad = 0;
            for (int r = 0; r < n && !rc; r++)
                for (size_t i = 0; i < count; i++)
                    bad += iget(recv + (size_t)r * count * es, t, i) != ival(t, r, i);
            RCHECK(bad == 0, "allgather %s x %zu: %zu wrong", dt_dtype_name(t), count, bad);
            /* reduce-scatter, sum and max */
            for (int o = 0; o < 2; o++) {
                ifill(buf, t, (size_t)n * count, rank);
                rc = dt_comm_reduce_scatter(c, buf, recv, count, t, ops[o], NULL, &err);
                RCHECK(rc == 0, "reduce_scatter %s: %s", dt_dtype_name(t), err.msg);
                bad = 0;
                for (size_t i = 0; i < count && !rc; i++)
                    bad += iget(recv, t, i) != iwant(t, ops[o], n, (size_t)rank * count + i);
                RCHECK(bad == 0, "reduce_scatter %s %s x %zu: %zu wrong", dt_redop_name(ops[o]),
                       dt_dtype_name(t), count, bad);
            }
            free(buf);
            free(recv);
        }
        /* avg on integers is refused by every backend, before any communication */
        int64_t v[2] = {1, 2};
        int rc = dt_comm_allreduce(c, v, 1, t, DT_AVG, NULL, &err);
        RCHECK(rc == -EINVAL && strstr(err.msg, "avg of") && strstr(err.msg, dt_dtype_name(t)),
               "avg of %s: %d %s", dt_dtype_name(t), rc, err.msg);
        rc = dt_comm_reduce_scatter(c, v, v + 1, 1, t, DT_AVG, NULL, &err);
        RCHECK(rc == -EINVAL, "reduce_scatter avg of %s: %d %s", dt_dtype_name(t), rc, err.msg);
    }
    /* int64 in communicator memory: on one host the all-reduce reads the peers' memory. */
    size_t count = 30011;
    void *mem = NULL;
    int rc = dt_comm_mem_alloc(c, count * sizeof(int64_t), &mem, &err);
    RCHECK(rc == 0, "mem_alloc: %s", err.msg);
    if (!rc) {
        for (size_t o = 0; o < DT_ARRAY_LEN(ops); o++) {
            ifill(mem, DT_INT64, count, rank);
            rc = dt_comm_allreduce(c, mem, count, DT_INT64, ops[o], NULL, &err);
            RCHECK(rc == 0, "allreduce in communicator memory: %s", err.msg);
            size_t bad = 0;
            for (size_t i = 0; i < count && !rc; i++)
                bad += iget(mem, DT_INT64, i) != iwant(DT_INT64, ops[o], n, i);
            RCHECK(bad == 0, "allreduce %s int64 in communicator memory: %zu wrong",
                   dt_redop_name(ops[o]), bad);
        }
        dt_comm_mem_free(c, mem);
    }
    /* float max and min across ranks */
    float f[3] = {(float)rank, -(float)rank, 0.5f * (float)rank};
    RCHECK(dt_comm_allreduce(c, f, 3, DT_FLOAT32, DT_MAX, NULL, &err) == 0, "%s", err.msg);
    RCHECK(f[0] == (float)(n - 1) && f[1] == 0 && f[2] == 0.5f * (float)(n - 1), "float max");
    RCHECK(dt_comm_barrier(c, &err) == 0, "barrier: %s", err.msg);
}

static void test_int_one_rank(void)
{
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    dt_comm *c = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    int_collectives(c, 0, 1, NULL);
    DT_CHECK(!dt_test_rank_failed);
    dt_comm_free(c);
}

static void test_int_shm(void)
{
    for (int n = 2; n <= 3; n++) {
        /* 16 KiB slices for 3 ranks: the larger sizes wrap the slices many times */
        group g = {.n = n, .transport = "auto", .slot_kb = n == 3 ? 16 : 0};
        run_group(&g, int_collectives, NULL, 90);
    }
}

static void test_int_tcp(void)
{
    for (int n = 2; n <= 3; n++) {
        /* 4 KiB segments for 3 ranks: 512 int64 per reduction unit */
        group g = {.n = n, .transport = "tcp", .segment_kb = n == 3 ? 4 : 0};
        run_group(&g, int_collectives, NULL, 90);
    }
    /* two hosts of two ranks: shared memory on each, the ring between them */
    group h = {.n = 4, .hosts = "A,B,A,B"};
    run_group(&h, int_collectives, NULL, 90);
}

/* ---- float64 ---------------------------------------------------------------------------- */

/* Element i of rank r: 2^24 + 1 + i + r, none of them a float32 (2^24 + 1 is the first integer
 * float32 cannot hold), plus a fraction, so that a float32 sum or a float32 1/world scale is
 * visibly wrong while double sums of these stay exact. */
static double dval(int rank, size_t i) { return 16777217.0 + (double)(i % 1000) + rank + 0.25 * (rank % 3); }

static double dsum(int n, size_t i)
{
    double s = 0;
    for (int r = 0; r < n; r++)
        s += dval(r, i);
    return s;
}

static void test_f64_kernels(void)
{
    enum { N = 5003 };
    DT_CHECK_INT(dt_dtype_size(DT_FLOAT64), 8);
    DT_CHECK_STR(dt_dtype_name(DT_FLOAT64), "float64");
    DT_CHECK(dt_dtype_is_float(DT_FLOAT64) && dt_dtype_valid(DT_FLOAT64));
    for (int k = 1; k <= 4; k++) {
        double *src[4], *out = malloc(N * 8), *out2 = malloc(N * 8), *mx = malloc(N * 8);
        const void *srcs[4];
        for (int j = 0; j < k; j++) {
            src[j] = malloc(N * 8);
            for (size_t i = 0; i < N; i++)
                src[j][i] = dval(j, i) * (j % 2 ? -1 : 1);
            srcs[j] = src[j];
        }
        dt_reduce(out, out2, srcs, k, N, DT_FLOAT64, DT_SUM, 1.0f, k % 2 == 0);
        dt_reduce(mx, NULL, srcs, k, N, DT_FLOAT64, DT_MAX, 1.0f, false);
        dt_stream_fence();
        int bad = 0;
        for (size_t i = 0; i < N; i++) {
            double want = 0, best = src[0][i];
            for (int j = 0; j < k; j++) {
                want += src[j][i];
                best = src[j][i] > best ? src[j][i] : best;
            }
            bad += out[i] != want || out2[i] != want || mx[i] != best;
        }
        DT_CHECK_MSG(bad == 0, "float64, %d sources: %d wrong", k, bad);
        for (int j = 0; j < k; j++)
            free(src[j]);
        free(out);
        free(out2);
        free(mx);
    }
    /* the case that motivated float64: float32 rounds 2^24 + 1 away, double keeps it */
    double a[1] = {16777216.0}, b[1] = {1.0}, r[1];
    const void *ab[2] = {a, b};
    dt_reduce(r, NULL, ab, 2, 1, DT_FLOAT64, DT_SUM, 1.0f, false);
    DT_CHECK(r[0] == 16777217.0 && (double)(float)r[0] != r[0]);
    double x[2] = {3.0, 5.0};
    dt_dtype_convert(x, DT_FLOAT64, x, DT_FLOAT64, 2, 0.5f);
    DT_CHECK(x[0] == 1.5 && x[1] == 2.5);
}

/* Every collective on float64; sums and averages checked exactly (== against double). */
static void f64_collectives(dt_comm *c, int rank, int n, void *argp)
{
    (void)argp;
    static const size_t fsizes[] = {1, 7, 4097, 100003};
    dt_err err = {0};
    for (size_t s = 0; s < DT_ARRAY_LEN(fsizes); s++) {
        size_t count = fsizes[s], bad = 0;
        double *buf = malloc((size_t)n * count * 8), *recv = malloc((size_t)n * count * 8);
        const dt_redop ops[] = {DT_SUM, DT_AVG, DT_MAX};
        for (size_t o = 0; o < DT_ARRAY_LEN(ops); o++) {
            for (size_t i = 0; i < count; i++)
                buf[i] = dval(rank, i);
            int rc = dt_comm_allreduce(c, buf, count, DT_FLOAT64, ops[o], NULL, &err);
            RCHECK(rc == 0, "allreduce float64: %s", err.msg);
            bad = 0;
            for (size_t i = 0; i < count && !rc; i++) {
                double want = ops[o] == DT_SUM   ? dsum(n, i)
                              : ops[o] == DT_AVG ? dsum(n, i) / n
                                                 : dval(n - 1, i);
                bad += buf[i] != want;
            }
            RCHECK(bad == 0, "allreduce %s float64 x %zu on %d ranks: %zu wrong (first %.17g, "
                   "want %.17g)", dt_redop_name(ops[o]), count, n, bad, buf[0],
                   ops[o] == DT_SUM ? dsum(n, 0) : ops[o] == DT_AVG ? dsum(n, 0) / n : dval(n - 1, 0));
        }
        int root = (int)(s % (size_t)n);
        for (size_t i = 0; i < count; i++)
            buf[i] = dval(rank, i);
        int rc = dt_comm_broadcast(c, buf, count, DT_FLOAT64, root, NULL, &err);
        RCHECK(rc == 0, "broadcast float64: %s", err.msg);
        bad = 0;
        for (size_t i = 0; i < count && !rc; i++)
            bad += buf[i] != dval(root, i);
        RCHECK(bad == 0, "broadcast float64 x %zu: %zu wrong", count, bad);
        for (size_t i = 0; i < count; i++)
            buf[i] = dval(rank, i);
        rc = dt_comm_allgather(c, buf, recv, count, DT_FLOAT64, NULL, &err);
        RCHECK(rc == 0, "allgather float64: %s", err.msg);
        bad = 0;
        for (int r = 0; r < n && !rc; r++)
            for (size_t i = 0; i < count; i++)
                bad += recv[(size_t)r * count + i] != dval(r, i);
        RCHECK(bad == 0, "allgather float64 x %zu: %zu wrong", count, bad);
        for (int o = 0; o < 2; o++) {
            for (size_t i = 0; i < (size_t)n * count; i++)
                buf[i] = dval(rank, i);
            rc = dt_comm_reduce_scatter(c, buf, recv, count, DT_FLOAT64, o ? DT_AVG : DT_SUM,
                                        NULL, &err);
            RCHECK(rc == 0, "reduce_scatter float64: %s", err.msg);
            bad = 0;
            for (size_t i = 0; i < count && !rc; i++) {
                double sum = dsum(n, (size_t)rank * count + i);
                bad += recv[i] != (o ? sum / n : sum);
            }
            RCHECK(bad == 0, "reduce_scatter %s float64 x %zu: %zu wrong", o ? "avg" : "sum",
                   count, bad);
        }
        free(buf);
        free(recv);
    }
    RCHECK(dt_comm_barrier(c, &err) == 0, "barrier: %s", err.msg);
}

static void test_f64_collectives(void)
{
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    dt_comm *c = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    f64_collectives(c, 0, 1, NULL);
    DT_CHECK(!dt_test_rank_failed);
    dt_comm_free(c);
    for (int n = 2; n <= 3; n++) {
        group g = {.n = n, .transport = "auto", .slot_kb = n == 3 ? 16 : 0};
        run_group(&g, f64_collectives, NULL, 90);
    }
    group t = {.n = 3, .transport = "tcp", .segment_kb = 4};
    run_group(&t, f64_collectives, NULL, 90);
    group h = {.n = 4, .hosts = "A,B,A,B"};
    run_group(&h, f64_collectives, NULL, 90);
}

/* ------------------------------------------------------------------------------------------ */
/* Every collective                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct coll_arg {
    int size_max_index; /* how many of sizes[] to run */
    bool only_f32;
} coll_arg;

/* All-reduces `count` values of rank-dependent data in buf (NULL: a malloc'ed buffer) and
 * checks the result against the exact sum. */
static void check_allreduce_in(dt_comm *c, int rank, int n, dt_dtype t, size_t count, dt_redop op,
                               void *in)
{
    size_t es = dt_dtype_size(t);
    char *buf = in ? in : malloc(count * es + 1);
    fill(buf, t, count, rank);
    dt_err err = {0};
    int rc = dt_comm_allreduce(c, buf, count, t, op, NULL, &err);
    RCHECK(rc == 0, "allreduce %s x %zu: %s", dt_dtype_name(t), count, err.msg);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        float sum = 0;
        for (int r = 0; r < n; r++)
            sum += val(r, i);
        float want = op == DT_AVG ? round_to(sum * (1.0f / (float)n), t) : round_to(sum, t);
        float got = get(buf, t, i);
        /* avg: the division may round differently where the sum is reduced in stages */
        float tol = op == DT_AVG ? fabsf(want) * (t == DT_FLOAT32 ? 1e-6f : 1e-2f) : 0;
        if (!(fabsf(got - want) <= tol)) {
            if (!bad)
                first = i;
            bad++;
        }
    }
    RCHECK(bad == 0, "allreduce %s %s x %zu on %d ranks: %zu wrong, first at %zu: %g", 
           op == DT_AVG ? "avg" : "sum", dt_dtype_name(t), count, n, bad, first,
           (double)get(buf, t, first));
    if (!in)
        free(buf);
}

static void check_allreduce(dt_comm *c, int rank, int n, dt_dtype t, size_t count, dt_redop op)
{
    check_allreduce_in(c, rank, n, t, count, op, NULL);
}

static void check_broadcast(dt_comm *c, int rank, int n, dt_dtype t, size_t count, int root)
{
    size_t es = dt_dtype_size(t);
    char *buf = malloc(count * es + 1);
    fill(buf, t, count, rank);
    dt_err err = {0};
    int rc = dt_comm_broadcast(c, buf, count, t, root, NULL, &err);
    RCHECK(rc == 0, "broadcast: %s", err.msg);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++)
        if (get(buf, t, i) != val(root, i))
            bad++;
    RCHECK(bad == 0, "broadcast %s x %zu from %d on %d ranks: %zu wrong", dt_dtype_name(t), count,
           root, n, bad);
    free(buf);
}

/* Sums rank-dependent data to root: root holds the exact sum (the others' buffers are left
 * unspecified); a root outside the group is refused. */
static void check_reduce(dt_comm *c, int rank, int n, dt_dtype t, size_t count, int root)
{
    size_t es = dt_dtype_size(t);
    char *buf = malloc(count * es + 1);
    fill(buf, t, count, rank);
    dt_err err = {0};
    int rc = dt_comm_reduce(c, buf, count, t, DT_SUM, root, NULL, &err);
    RCHECK(rc == 0, "reduce: %s", err.msg);
    size_t bad = 0;
    for (size_t i = 0; i < count && rc == 0 && rank == root; i++) {
        float sum = 0;
        for (int r = 0; r < n; r++)
            sum += val(r, i);
        if (get(buf, t, i) != round_to(sum, t))
            bad++;
    }
    RCHECK(bad == 0, "reduce %s x %zu to %d on %d ranks: %zu wrong", dt_dtype_name(t), count,
           root, n, bad);
    rc = dt_comm_reduce(c, buf, count, t, DT_SUM, n, NULL, &err);
    RCHECK(rc == -EINVAL && strstr(err.msg, "root"), "reduce to rank %d of %d: %d %s", n, n, rc,
           err.msg);
    free(buf);
}

static void check_allgather(dt_comm *c, int rank, int n, dt_dtype t, size_t count)
{
    size_t es = dt_dtype_size(t);
    char *send = malloc(count * es + 1), *recv = malloc((size_t)n * count * es + 1);
    fill(send, t, count, rank);
    memset(recv, 0x55, (size_t)n * count * es);
    dt_err err = {0};
    int rc = dt_comm_allgather(c, send, recv, count, t, NULL, &err);
    RCHECK(rc == 0, "allgather: %s", err.msg);
    size_t bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            if (get(recv + (size_t)r * count * es, t, i) != val(r, i))
                bad++;
    RCHECK(bad == 0, "allgather %s x %zu on %d ranks: %zu wrong", dt_dtype_name(t), count, n, bad);
    free(send);
    free(recv);
}

static void check_reduce_scatter(dt_comm *c, int rank, int n, dt_dtype t, size_t count,
                                 dt_redop op)
{
    size_t es = dt_dtype_size(t);
    char *send = malloc((size_t)n * count * es + 1), *recv = malloc(count * es + 1);
    fill(send, t, (size_t)n * count, rank);
    dt_err err = {0};
    int rc = dt_comm_reduce_scatter(c, send, recv, count, t, op, NULL, &err);
    RCHECK(rc == 0, "reduce_scatter: %s", err.msg);
    size_t bad = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        size_t gi = (size_t)rank * count + i;
        float sum = 0;
        for (int r = 0; r < n; r++)
            sum += val(r, gi);
        float want = op == DT_AVG ? round_to(sum / (float)n, t) : round_to(sum, t);
        float tol = op == DT_AVG ? fabsf(want) * (t == DT_FLOAT32 ? 1e-6f : 1e-2f) : 0;
        if (!(fabsf(get(recv, t, i) - want) <= tol))
            bad++;
    }
    RCHECK(bad == 0, "reduce_scatter %s x %zu on %d ranks: %zu wrong", dt_dtype_name(t), count, n,
           bad);
    free(send);
    free(recv);
}

static void all_collectives(dt_comm *c, int rank, int n, void *argp)
{
    const coll_arg *a = argp;
    RCHECK(dt_comm_rank(c) == rank && dt_comm_world_size(c) == n, "rank/world");
    for (size_t d = 0; d < DT_ARRAY_LEN(dtypes); d++) {
        if (a->only_f32 && d > 0)
            break;
        for (int s = 0; s < a->size_max_index; s++) {
            size_t count = sizes[s];
            check_allreduce(c, rank, n, dtypes[d], count, DT_SUM);
            check_allreduce(c, rank, n, dtypes[d], count, DT_AVG);
            check_broadcast(c, rank, n, dtypes[d], count, (int)((s + d) % (size_t)n));
            check_reduce(c, rank, n, dtypes[d], count, (int)((s + d + 1) % (size_t)n));
            check_allgather(c, rank, n, dtypes[d], count / 2 + 1);
            check_reduce_scatter(c, rank, n, dtypes[d], count / 3 + 1, s % 2 ? DT_AVG : DT_SUM);
        }
    }
    dt_err err = {0};
    RCHECK(dt_comm_barrier(c, &err) == 0, "barrier: %s", err.msg);
}

static void test_one_rank(void)
{
    /* One rank needs no store and does no communication, but every call works. */
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    dt_comm *c = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    coll_arg a = {DT_ARRAY_LEN(sizes), false};
    all_collectives(c, 0, 1, &a);
    DT_CHECK(!dt_test_rank_failed);
    dt_comm_free(c);
    dt_comm_free(NULL);
}

static void test_shm_all(void)
{
    for (int n = 2; n <= 4; n++) {
        /* 16 KiB slices for 3 ranks: every size above 4096 runs through more steps than there
         * are slices, so the pipeline wraps around many times. */
        group g = {.n = n, .transport = "auto", .slot_kb = n == 3 ? 16 : 0};
        coll_arg a = {DT_ARRAY_LEN(sizes) - (n > 2), n > 3};
        run_group(&g, all_collectives, &a, 90);
    }
}

static void test_tcp_all(void)
{
    for (int n = 2; n <= 4; n++) {
        /* 4 KiB segments for 3 ranks: the reduction staging wraps many times per step. */
        group g = {.n = n, .transport = "tcp", .segment_kb = n == 3 ? 4 : 0};
        coll_arg a = {DT_ARRAY_LEN(sizes) - (n > 2), n > 3};
        run_group(&g, all_collectives, &a, 90);
    }
}

static void test_hierarchical(void)
{
    /* Two "hosts" with two ranks each: shared memory on each, a ring between them. The ranks of
     * a host are not contiguous, so the allgather permutation is exercised. */
    group g = {.n = 4, .hosts = "A,B,A,B"};
    coll_arg a = {DT_ARRAY_LEN(sizes) - 1, false};
    run_group(&g, all_collectives, &a, 90);
    /* One rank per host: the ring alone. */
    group g2 = {.n = 3, .hosts = "A,B,C"};
    coll_arg a2 = {DT_ARRAY_LEN(sizes) - 1, true};
    run_group(&g2, all_collectives, &a2, 90);
    /* Unequal hosts: every rank joins the ring. */
    group g3 = {.n = 3, .hosts = "A,A,B"};
    run_group(&g3, all_collectives, &a2, 90);
}

/* ------------------------------------------------------------------------------------------ */
/* Asynchronous work                                                                          */
/* ------------------------------------------------------------------------------------------ */

static void async_body(dt_comm *c, int rank, int n, void *arg)
{
    (void)arg;
    enum { K = 12, N = 30011 };
    float *bufs[K];
    dt_comm_work *w[K];
    dt_err err = {0};
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(N * sizeof(float));
        for (size_t i = 0; i < N; i++)
            bufs[k][i] = val(rank, i + (size_t)k);
        int rc = k % 3 == 2 ? dt_comm_broadcast(c, bufs[k], N, DT_FLOAT32, k % n, &w[k], &err)
                            : dt_comm_allreduce(c, bufs[k], N, DT_FLOAT32, DT_SUM, &w[k], &err);
        RCHECK(rc == 0 && w[k] != NULL, "issue %d: %s", k, err.msg);
    }
    /* A blocking collective issued behind the queue runs after it, in order. */
    float one = 1;
    RCHECK(dt_comm_allreduce(c, &one, 1, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s", err.msg);
    RCHECK(one == (float)n, "blocking after async: %g", (double)one);
    for (int k = K - 1; k >= 0; k--) { /* waited in reverse order */
        RCHECK(dt_comm_wait(c, w[k], &err) == 0, "wait %d: %s", k, err.msg);
        size_t bad = 0;
        for (size_t i = 0; i < N; i++) {
            float want = 0;
            if (k % 3 == 2)
                want = val(k % n, i + (size_t)k);
            else
                for (int r = 0; r < n; r++)
                    want += val(r, i + (size_t)k);
            if (bufs[k][i] != want)
                bad++;
        }
        RCHECK(bad == 0, "async %d: %zu wrong", k, bad);
        free(bufs[k]);
    }
    RCHECK(dt_comm_wait(c, NULL, &err) == 0, "waiting for NULL");
    /* Waited in issue order: the waiter runs queued work itself when the comm thread has not
     * taken it yet; the results and the order are the same either way. */
    for (int round = 0; round < 20; round++) {
        float v[4][64];
        dt_comm_work *q[4];
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < 64; i++)
                v[k][i] = (float)(rank + k + i);
            RCHECK(dt_comm_allreduce(c, v[k], 64, DT_FLOAT32, DT_SUM, &q[k], &err) == 0, "%s",
                   err.msg);
        }
        for (int k = 0; k < 4; k++) {
            RCHECK(dt_comm_wait(c, q[k], &err) == 0, "in-order wait %d: %s", k, err.msg);
            for (int i = 0; i < 64; i++)
                RCHECK(v[k][i] == (float)(n * (k + i) + n * (n - 1) / 2), "in-order %d[%d]: %g",
                       k, i, (double)v[k][i]);
        }
    }
    /* Work issued and never waited for is released by dt_comm_free. */
    float x[4] = {1, 2, 3, 4};
    dt_comm_work *leak = NULL;
    RCHECK(dt_comm_allreduce(c, x, 4, DT_FLOAT32, DT_SUM, &leak, &err) == 0, "%s", err.msg);
}

static void test_async(void)
{
    group g = {.n = 3};
    run_group(&g, async_body, NULL, 60);
    group g2 = {.n = 2, .transport = "tcp"};
    run_group(&g2, async_body, NULL, 60);
}

/* ------------------------------------------------------------------------------------------ */
/* Failures                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct fail_arg {
    int mode;            /* see below */
    const char *expect;  /* substring of the survivor's error */
    int expect_rc;
    int max_ms;          /* the error must come within this */
} fail_arg;

enum { F_DIE, F_STALL, F_COUNT, F_OP, F_DTYPE, F_DIE_MIDWAY };

static void fail_body(dt_comm *c, int rank, int n, void *argp)
{
    const fail_arg *a = argp;
    dt_err err = {0};
    enum { N = 600000 }; /* several shared-memory steps */
    float *buf = calloc(N, sizeof(float));
    /* One good collective first, so the failure is #2. */
    RCHECK(dt_comm_allreduce(c, buf, 16, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s", err.msg);
    if (rank == n - 1) {
        switch (a->mode) {
        case F_DIE:
            _exit(0);
        case F_STALL:
            dt_sleep_ms(3000); /* past the survivors' 1.5 s timeout */
            _exit(0);
        case F_DIE_MIDWAY:
            /* Exit while the others are inside a large all-reduce with us. */
            dt_sleep_ms(200);
            _exit(0);
        case F_COUNT:
            dt_comm_allreduce(c, buf, 200, DT_FLOAT32, DT_SUM, NULL, &err);
            break;
        case F_OP:
            dt_comm_broadcast(c, buf, 100, DT_FLOAT32, 0, NULL, &err);
            break;
        case F_DTYPE:
            dt_comm_allreduce(c, buf, 100, DT_BFLOAT16, DT_SUM, NULL, &err);
            break;
        }
        free(buf);
        return; /* the mismatching rank fails too; what it says is checked in the others */
    }
    uint64_t t0 = dt_now_ns();
    int rc = dt_comm_allreduce(c, buf, a->mode == F_DIE_MIDWAY ? N : 100, DT_FLOAT32, DT_SUM, NULL,
                               &err);
    double ms = (double)(dt_now_ns() - t0) / 1e6;
    RCHECK(rc != 0, "the collective succeeded");
    if (a->expect_rc)
        RCHECK(rc == a->expect_rc, "rc %d, expected %d: %s", rc, a->expect_rc, err.msg);
    RCHECK(strstr(err.msg, "allreduce #2") != NULL, "error does not name the op: %s", err.msg);
    RCHECK(strstr(err.msg, a->expect) != NULL, "error lacks \"%s\": %s", a->expect, err.msg);
    RCHECK(ms < a->max_ms, "took %.0f ms (limit %d): %s", ms, a->max_ms, err.msg);
    /* After a failure the communicator refuses further work at once, with the first error. */
    dt_err err2 = {0};
    t0 = dt_now_ns();
    rc = dt_comm_allreduce(c, buf, 16, DT_FLOAT32, DT_SUM, NULL, &err2);
    RCHECK(rc != 0 && strstr(err2.msg, "failed earlier"), "after failure: %d %s", rc, err2.msg);
    RCHECK(dt_now_ns() - t0 < 1000000000ull, "refusal was slow");
    free(buf);
    (void)n;
}

static void run_fail(const char *transport, const char *hosts, int n, int mode, const char *expect,
                     int expect_rc, int timeout_ms, int max_ms)
{
    group g = {.n = n, .transport = transport, .hosts = hosts, .timeout_ms = timeout_ms};
    fail_arg a = {mode, expect, expect_rc, max_ms};
    int status[16];
    run_group_status(&g, fail_body, &a, 60, status);
    for (int r = 0; r < n - 1; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "survivor rank %d (%s, mode %d) failed its checks (status %d)", r,
                     transport ? transport : "auto", mode, status[r]);
}

static void test_dead_peer(void)
{
    /* A peer that exits is noticed long before the (30 s) timeout. */
    run_fail("auto", NULL, 2, F_DIE, "rank 1", -ECONNRESET, 30000, 5000);
    run_fail("tcp", NULL, 2, F_DIE, "rank 1", -ECONNRESET, 30000, 5000);
    run_fail("auto", NULL, 3, F_DIE_MIDWAY, "rank 2", 0, 30000, 5000);
    run_fail("tcp", NULL, 3, F_DIE_MIDWAY, "rank", 0, 30000, 5000);
    run_fail("auto", "A,B,A,B", 4, F_DIE_MIDWAY, "rank", 0, 30000, 5000);
}

static void test_stalled_peer(void)
{
    /* A peer that lives but never joins: -ETIMEDOUT after the timeout, naming it. */
    run_fail("auto", NULL, 2, F_STALL, "rank 1", -ETIMEDOUT, 1500, 6000);
    run_fail("tcp", NULL, 2, F_STALL, "rank 1", -ETIMEDOUT, 1500, 6000);
}

static void test_mismatch(void)
{
    run_fail("auto", NULL, 2, F_COUNT, "mismatch", -EPROTO, 20000, 5000);
    run_fail("auto", NULL, 3, F_OP, "broadcast #2", 0, 20000, 5000);
    run_fail("auto", NULL, 2, F_DTYPE, "bfloat16", -EPROTO, 20000, 5000);
    run_fail("tcp", NULL, 2, F_COUNT, "mismatch", -EPROTO, 20000, 5000);
    run_fail("tcp", NULL, 2, F_OP, "broadcast #2", -EPROTO, 20000, 5000);
    run_fail("tcp", NULL, 3, F_DTYPE, "", 0, 20000, 5000);
}

/* ------------------------------------------------------------------------------------------ */
/* Shared-memory hygiene                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int count_segments(const char *run_id)
{
    char name[256];
    dt_shm_name(name, sizeof name, run_id, 0, 0, 0);
    /* "/dtrain.<uid>.<run>.<hash>.a0.g0.h0": the prefix up to the attempt */
    char *a = strstr(name, ".a0.");
    a[1] = '\0';
    DIR *d = opendir("/dev/shm");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, name + 1, strlen(name + 1)))
            n++;
    closedir(d);
    return n;
}

static void nothing(dt_comm *c, int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    float x = (float)rank;
    dt_err err = {0};
    RCHECK(dt_comm_allreduce(c, &x, 1, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s", err.msg);
    if (arg)
        RCHECK(count_segments(((const char *)arg)) == 0, "segment still linked while in use");
}

static void test_shm_cleanup(void)
{
    if (access("/dev/shm", W_OK) != 0)
        DT_SKIP("no writable /dev/shm");
    group g = {.n = 3};
    new_run_id(&g, "clean");
    /* While the group runs, the segment is already unlinked (every rank attached). */
    run_group(&g, nothing, g.run_id, 30);
    DT_CHECK_INT(count_segments(g.run_id), 0);

    /* A segment left by a crashed earlier attempt (its creator is gone) is removed by the next
     * attempt of the same run. */
    char stale[256];
    dt_shm_name(stale, sizeof stale, g.run_id, 0, 7, 0);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    int fd = shm_open(stale, O_CREAT | O_RDWR, 0600);
    DT_REQUIRE(fd >= 0);
    /* Just enough of a header: the creator pid sits at byte 32 (after magic, version, size,
     * slot and total). */
    char hdr[4096];
    memset(hdr, 0, sizeof hdr);
    int32_t pid = (int32_t)dead;
    memcpy(hdr + 32, &pid, 4);
    DT_REQUIRE(write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr);
    close(fd);
    /* One that belongs to a live process is kept. */
    char live[256];
    dt_shm_name(live, sizeof live, g.run_id, 0, 8, 0);
    fd = shm_open(live, O_CREAT | O_RDWR, 0600);
    DT_REQUIRE(fd >= 0);
    pid = (int32_t)getpid();
    memcpy(hdr + 32, &pid, 4);
    DT_REQUIRE(write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr);
    close(fd);
    DT_CHECK_INT(count_segments(g.run_id), 2);
    g.attempt = 1;
    g.n = 2;
    run_group(&g, nothing, NULL, 30);
    DT_CHECK(access("/dev/shm/", F_OK) == 0);
    char path[300];
    snprintf(path, sizeof path, "/dev/shm%s", stale);
    DT_CHECK_MSG(access(path, F_OK) != 0, "stale segment %s survived", stale);
    snprintf(path, sizeof path, "/dev/shm%s", live);
    DT_CHECK_MSG(access(path, F_OK) == 0, "live segment %s was removed", live);
    shm_unlink(live);
}

/* ------------------------------------------------------------------------------------------ */
/* Communicator memory                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct mem_arg {
    const char *run_id; /* when set: no shared-memory name may stay linked while in use */
    int mode;           /* 0 = correctness; M_PLAIN, M_SIZE: a rank deviates */
} mem_arg;

enum { M_PLAIN = 1, M_SIZE = 2, M_FALLBACK = 3 };

static void mem_body(dt_comm *c, int rank, int n, void *argp)
{
    const mem_arg *a = argp;
    dt_err err = {0};
    enum { N = 1300001, OFF = 7 };
    const size_t bytes = (N + 64) * sizeof(float);
    float *m = NULL;
    int rc = dt_comm_mem_alloc(c, bytes, (void **)&m, &err);
    RCHECK(rc == 0 && m != NULL, "mem_alloc: %s", err.msg);
    if (rc)
        return;
    RCHECK(((uintptr_t)m & 63) == 0, "communicator memory %p is not 64-byte aligned", (void *)m);
    size_t nonzero = 0;
    for (size_t i = 0; i < N + 64; i++)
        nonzero += m[i] != 0;
    RCHECK(nonzero == 0, "communicator memory is not zero-filled: %zu values", nonzero);
    if (a && a->run_id)
        RCHECK(count_segments(a->run_id) == 0, "a shared-memory name is still linked in use");
    if (a && a->mode == M_FALLBACK) {
        /* The last rank may not hold this much: nobody got shared memory, so a plain buffer
         * and this one run the same (staged) way; a mix would fail as a mismatch. */
        float plain[64] = {0}, *p = rank % 2 ? plain : m;
        for (int i = 0; i < 64; i++)
            p[i] = (float)(rank + i);
        RCHECK(dt_comm_allreduce(c, p, 64, DT_FLOAT32, DT_SUM, NULL, &err) == 0,
               "plain and fallback memory together: %s", err.msg);
        RCHECK(p[5] == (float)(n * 5 + n * (n - 1) / 2), "fallback: %g", (double)p[5]);
    }

    /* Every size and type, at an odd offset, against the exact result; and the same bits as
     * the staged path on a plain buffer. */
    char *plain = malloc(bytes);
    for (size_t d = 0; d < 2; d++) {
        for (size_t k = 0; k < DT_ARRAY_LEN(sizes); k++) {
            dt_dtype t = dtypes[d];
            size_t es = dt_dtype_size(t), count = sizes[k];
            if (count * es > (N - OFF) * sizeof(float))
                continue;
            for (int op = DT_SUM; op <= DT_AVG; op++) {
                char *zc = (char *)(m + OFF);
                check_allreduce_in(c, rank, n, t, count, (dt_redop)op, zc);
                check_allreduce_in(c, rank, n, t, count, (dt_redop)op, plain);
                RCHECK(memcmp(zc, plain, count * es) == 0,
                       "%s %s x %zu: communicator memory and a plain buffer differ",
                       op == DT_AVG ? "avg" : "sum", dt_dtype_name(t), count);
            }
        }
    }
    free(plain);

    /* DDP's pattern: the ranges of one buffer all-reduced as buckets in flight together, and
     * the buffer written again as soon as the last wait returns. A rank whose peers still read
     * its memory after its wait returned would hand them the next round's values. */
    for (int round = 0; round < 40; round++) {
        enum { B = 4 };
        dt_comm_work *w[B];
        for (size_t i = 0; i < N; i++)
            m[i] = val(rank, i + (size_t)round);
        for (int b = 0; b < B; b++) {
            size_t lo = (size_t)b * N / B, hi = (size_t)(b + 1) * N / B;
            RCHECK(dt_comm_allreduce(c, m + lo, hi - lo, DT_FLOAT32, DT_SUM, &w[b], &err) == 0,
                   "bucket %d: %s", b, err.msg);
        }
        for (int b = B - 1; b >= 0; b--)
            RCHECK(dt_comm_wait(c, w[b], &err) == 0, "wait %d: %s", b, err.msg);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < N; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want += val(r, i + (size_t)round);
            if (m[i] != want && !bad++)
                first = i;
        }
        RCHECK(bad == 0, "round %d: %zu wrong, first at %zu", round, bad, first);
        if (bad)
            break;
    }
    dt_comm_mem_free(c, m);
    dt_comm_mem_free(c, NULL);
    /* A second allocation after the first is gone. */
    rc = dt_comm_mem_alloc(c, 4096, (void **)&m, &err);
    RCHECK(rc == 0, "second mem_alloc: %s", err.msg);
    if (!rc) {
        m[0] = (float)rank;
        RCHECK(dt_comm_allreduce(c, m, 1, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s", err.msg);
        RCHECK(m[0] == (float)(n * (n - 1) / 2), "second allocation: %g", (double)m[0]);
    }
}

static void mem_mismatch_body(dt_comm *c, int rank, int n, void *argp)
{
    const mem_arg *a = argp;
    dt_err err = {0};
    const bool odd = rank == n - 1;
    float *m = NULL, plain[100] = {0};
    int rc = dt_comm_mem_alloc(c, a->mode == M_SIZE && odd ? 8192 : 4096, (void **)&m, &err);
    if (a->mode == M_SIZE) {
        if (!odd) {
            RCHECK(rc == -EPROTO, "rc %d: %s", rc, err.msg);
            RCHECK(strstr(err.msg, "mem_alloc #1 (4096 bytes)") != NULL, "%s", err.msg);
            RCHECK(strstr(err.msg, "8192 bytes") != NULL, "%s", err.msg);
        }
        return;
    }
    RCHECK(rc == 0, "mem_alloc: %s", err.msg);
    rc = dt_comm_allreduce(c, odd ? plain : m, 100, DT_FLOAT32, DT_SUM, NULL, &err);
    if (!odd) {
        RCHECK(rc == -EPROTO, "rc %d: %s", rc, err.msg);
        RCHECK(strstr(err.msg, "allreduce #2") != NULL, "%s", err.msg);
        RCHECK(strstr(err.msg, "a buffer of its own") != NULL, "%s", err.msg);
        RCHECK(strstr(err.msg, "communicator memory at offset 0") != NULL, "%s", err.msg);
    }
}

static void test_comm_mem(void)
{
    /* Shared memory (2 and 3 ranks; 16 KiB slices so that a collective has many steps), the TCP
     * ring (plain memory), and two hosts of two ranks (shared memory on each, a ring between). */
    group g = {.n = 2};
    new_run_id(&g, "mem");
    mem_arg a = {g.run_id, 0};
    run_group(&g, mem_body, &a, 120);
    DT_CHECK_INT(count_segments(g.run_id), 0);
    group g3 = {.n = 3, .slot_kb = 16};
    run_group(&g3, mem_body, NULL, 120);
    group gt = {.n = 2, .transport = "tcp"};
    run_group(&gt, mem_body, NULL, 120);
    group gh = {.n = 4, .hosts = "A,B,A,B"};
    run_group(&gh, mem_body, NULL, 120);
    /* The last rank allows itself 1 MiB of /dev/shm: every rank falls back to plain memory. */
    group gf = {.n = 3, .last_mem_mb = 1 + 1};
    new_run_id(&gf, "memfb");
    mem_arg af = {gf.run_id, M_FALLBACK};
    run_group(&gf, mem_body, &af, 120);
    DT_CHECK_INT(count_segments(gf.run_id), 0);
    /* One rank: plain memory. */
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.run_id = "mem-one";
    dt_comm *c = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    float *m = NULL;
    DT_REQUIRE_OK(dt_comm_mem_alloc(c, 400, (void **)&m, &err), &err);
    m[99] = 3;
    DT_REQUIRE_OK(dt_comm_allreduce(c, m, 100, DT_FLOAT32, DT_AVG, NULL, &err), &err);
    DT_CHECK(m[99] == 3);
    dt_comm_mem_free(c, m);
    dt_comm_free(c);
}

static void test_comm_mem_mismatch(void)
{
    int status[16];
    mem_arg a = {NULL, M_PLAIN};
    group g = {.n = 2, .timeout_ms = 20000};
    run_group_status(&g, mem_mismatch_body, &a, 60, status);
    DT_CHECK_MSG(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0,
                 "rank 0 (comm memory vs plain buffer) failed its checks (status %d)", status[0]);
    a.mode = M_SIZE;
    group g3 = {.n = 3, .timeout_ms = 20000};
    run_group_status(&g3, mem_mismatch_body, &a, 60, status);
    for (int r = 0; r < 2; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "rank %d (mem_alloc sizes differ) failed its checks (status %d)", r,
                     status[r]);
}

/* Back-to-back all-reduces of many steps each, with slices so small that the posting rank runs
 * into the end of its slices all the time: once a rank waited for its peer to finish a step that
 * the peer could only finish after this rank's own next reduction, and both slept until the
 * timeout (seen about once in four `bench allreduce` runs on communicator memory). */
static void pipeline_body(dt_comm *c, int rank, int n, void *arg)
{
    (void)arg;
    enum { N = 1200000, ROUNDS = 600 };
    dt_err err = {0};
    float *m = NULL, *plain = malloc(N * sizeof(float));
    RCHECK(dt_comm_mem_alloc(c, N * sizeof(float), (void **)&m, &err) == 0, "%s", err.msg);
    for (int round = 0; round < ROUNDS && m && plain && !dt_test_rank_failed; round++) {
        float *buf = round % 2 ? m : plain;
        size_t count = N - (size_t)(round % 7) * 1000;
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)((size_t)rank + i % 5);
        RCHECK(dt_comm_allreduce(c, buf, count, DT_FLOAT32, DT_SUM, NULL, &err) == 0,
               "round %d: %s", round, err.msg);
        RCHECK(buf[count - 1] == (float)(n * (int)((count - 1) % 5) + n * (n - 1) / 2),
               "round %d: %g", round, (double)buf[count - 1]);
    }
    dt_comm_mem_free(c, m);
    free(plain);
}

static void test_pipeline_no_deadlock(void)
{
    /* 128 KiB slices: 32768 floats per step, about 37 steps per collective, 8 in flight. A
     * deadlock ends in the (10 s) collective timeout; before the fix it came within 600 rounds
     * in every run of this test. */
    group g = {.n = 2, .slot_kb = 128, .timeout_ms = 10000};
    run_group(&g, pipeline_body, NULL, 120);
    group g3 = {.n = 3, .slot_kb = 4, .timeout_ms = 10000};
    run_group(&g3, pipeline_body, NULL, 120);
}

static void test_bootstrap_missing_rank(void)
{
    /* Rank 1 never starts (it exits before comm init): rank 0 gives up within the timeout and
     * leaves no segment behind. */
    dt_store_server_opts so;
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    dt_store_server *srv = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_store_server_start(&srv, &so, &err), &err);
    group g = {.n = 2, .timeout_ms = 1500};
    new_run_id(&g, "partial");
    g.port = dt_store_server_port(srv);
    dt_store *store = NULL;
    dt_test_rank_env(g.transport, g.hosts, 0);
    group_env(NULL, 0, &g);
    dt_comm *c = NULL;
    uint64_t t0 = dt_now_ns();
    int rc = dt_test_world_open(g.port, g.run_id, g.attempt, 0, g.n, g.timeout_ms, &store, &c,
                                &err);
    DT_REQUIRE(store != NULL);
    double s = (double)(dt_now_ns() - t0) / 1e9;
    DT_CHECK(rc != 0);
    DT_CHECK_MSG(s < 6, "bootstrap took %.1f s with a 1.5 s timeout", s);
    DT_CHECK_CONTAINS(err.msg, "2 ranks");
    DT_CHECK_INT(count_segments(g.run_id), 0);
    dt_store_free(store);
    dt_store_server_stop(srv);
}

static void test_nccl_unavailable(void)
{
    setenv("DTRAIN_CUDA_LIB", "/nonexistent/libdtrain_cuda.so", 1);
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.backend = DT_COMM_NCCL;
    dt_comm *c = NULL;
    dt_err err = {0};
    DT_CHECK(dt_comm_init(&c, NULL, &o, &err) != 0);
    DT_CHECK_CONTAINS(err.msg, "nccl");
    DT_CHECK_CONTAINS(err.msg, "ddp.backend = cpu");
    o.backend = (dt_comm_kind)7; /* no such backend */
    DT_CHECK(dt_comm_init(&c, NULL, &o, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "unknown backend");
    o.backend = DT_COMM_CPU;
    o.world_size = 2;
    DT_CHECK(dt_comm_init(&c, NULL, &o, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "store");
}

/* Rank 0 that cannot make the NCCL id publishes an empty one: the other ranks fail at once with
 * a message that points at rank 0, instead of waiting out their timeout. */
static void test_nccl_rank0_failed(void)
{
    char lib[PATH_MAX];
    if (dt_cuda_lib_path(lib, sizeof lib) != 0 || access(lib, R_OK) != 0)
        DT_SKIP("no libdtrain_cuda.so in this build (no nvcc)");
    dt_store_server *srv = NULL;
    dt_store_server_opts so;
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    so.quiet = true;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_store_server_start(&srv, &so, &err), &err);
    dt_store *st = NULL;
    DT_REQUIRE_OK(dt_store_connect(&st, "127.0.0.1", dt_store_server_port(srv), NULL, &err), &err);
    DT_REQUIRE_OK(dt_store_set(st, "comm/t-empty/0/7/nccl_id", "", 0, &err), &err);
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.backend = DT_COMM_NCCL;
    o.rank = 1;
    o.world_size = 2;
    o.run_id = "t-empty";
    o.number = 7;
    o.timeout_ms = 20000;
    dt_comm *c = NULL;
    double t0 = dt_now_s();
    int rc = dt_comm_init(&c, st, &o, &err);
    double took = dt_now_s() - t0;
    if (rc != 0 && strstr(err.msg, "cannot load")) {
        dt_store_free(st);
        dt_store_server_stop(srv);
        DT_SKIP("libdtrain_cuda.so does not load here");
    }
    DT_CHECK_MSG(rc == -EIO, "rc %d: %s", rc, err.msg);
    DT_CHECK_CONTAINS(err.msg, "rank 0 could not create the NCCL id");
    DT_CHECK_MSG(took < 5, "took %.1f s (timeout 20 s)", took);
    dt_comm_free(c);
    dt_store_free(st);
    dt_store_server_stop(srv);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"fp16_exhaustive", test_fp16_exhaustive, 0},
        {"bf16_rounding", test_bf16_rounding, 0},
        {"reduce_kernels", test_reduce_kernels, 0},
        {"int_kernels", test_int_kernels, 0},
        {"f64_kernels", test_f64_kernels, 0},
        {"f64_collectives", test_f64_collectives, 150},
        {"one_rank", test_one_rank, 0},
        {"int_one_rank", test_int_one_rank, 0},
        {"int_shm", test_int_shm, 120},
        {"int_tcp", test_int_tcp, 150},
        {"shm_all_collectives", test_shm_all, 120},
        {"tcp_all_collectives", test_tcp_all, 120},
        {"hierarchical", test_hierarchical, 120},
        {"async", test_async, 60},
        {"dead_peer", test_dead_peer, 90},
        {"stalled_peer", test_stalled_peer, 60},
        {"mismatch", test_mismatch, 90},
        {"shm_cleanup", test_shm_cleanup, 60},
        {"comm_mem", test_comm_mem, 300},
        {"comm_mem_mismatch", test_comm_mem_mismatch, 90},
        {"pipeline_no_deadlock", test_pipeline_no_deadlock, 150},
        {"bootstrap_missing_rank", test_bootstrap_missing_rank, 30},
        {"nccl_unavailable", test_nccl_unavailable, 0},
        {"nccl_rank0_failed", test_nccl_rank0_failed, 30},
    };
    return dt_test_main("test_comm", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
