/* bench_allreduce.c - `dtrain bench allreduce`: an nccl-tests-style table of all-reduce time,
 * algorithm bandwidth and bus bandwidth from 4 KiB to 256 MiB, with this machine's memcpy
 * bandwidth measured in the same run as the reference line.
 *
 *   dtrain bench allreduce --nproc 2                 forks 2 ranks with its own store
 *   dtrain --nproc-per-node=2 -- dtrain bench allreduce    ranks from the launcher
 *
 * algbw = bytes / time; busbw = algbw * 2(n-1)/n, the traffic every rank's links must carry in
 * a bandwidth-optimal all-reduce, comparable across rank counts (nccl-tests' definition). The
 * memcpy line is one thread copying a 64 MiB buffer (best of several), the natural ceiling of a
 * shared-memory transport: a 2-rank all-reduce moves each byte through memory about as often as
 * one memcpy does.
 *
 * The buffer is communicator memory (dt_comm_mem_alloc), as DDP's gradients are: on one host the
 * all-reduce then reads the peers' memory directly. --buffer plain measures a malloc'ed buffer,
 * which the shared-memory transport stages through its own slices.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/env.h"
#include "common/half.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/comm/comm.h"

typedef struct bench_opts {
    int nproc;
    size_t min_bytes, max_bytes;
    dt_dtype dtype;
    dt_redop op;
    bool async;            /* issue with a work handle and wait, instead of blocking calls */
    double seconds;        /* target time per size */
    int warmup;
    const char *transport; /* DTRAIN_COMM_TRANSPORT for the ranks */
    bool plain;            /* a malloc'ed buffer instead of communicator memory */
    double link_bps;       /* --link: the rate of a link between hosts (bit/s; 0 = not given) */
    /* child mode (set by the parent when it forks ranks) */
    int child_rank;
    char store_host[256];
    int store_port;
    char run_id[64];
} bench_opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench allreduce [--nproc N] [--min SIZE] [--max SIZE] [--dtype "
            "float32|bf16|fp16|float64|int32|int64|uint8]\n"
            "                              [--op sum|avg|max|min] [--transport auto|shm|tcp] [--async] "
            "[--seconds S]\n"
            "                              [--buffer comm|plain] [--link RATE]\n\n"
            "  --nproc N      ranks to fork on this host (default 2); under the launcher "
            "(RANK, WORLD_SIZE and\n"
            "                 DTRAIN_STORE_* set) the ranks are the launcher's workers instead\n"
            "  --min, --max   sizes in bytes, K/M/G suffixes (default 4K .. 256M, doubling)\n"
            "  --transport    DTRAIN_COMM_TRANSPORT for the ranks (tcp: the TCP ring even on "
            "one host)\n"
            "  --async        issue each all-reduce with a work handle and wait (the DDP path)\n"
            "  --seconds S    measuring time per size (default 0.2)\n"
            "  --buffer B     comm: communicator memory, as DDP's gradients (default); plain: a "
            "malloc'ed buffer\n"
            "  --link RATE    the rate of each host's link (e.g. 1gbit, 10gbit): the summary gives "
            "64 MiB busbw\n"
            "                 as a share of it (target >= 0.9 across hosts)\n");
}

/* "1gbit", "10Gbit", "100mbit", "2.5g": bit/s; -1 when it is not a rate. */
static double parse_rate(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0)
        return -1;
    double m = 1;
    switch (*end == '\0' ? 0 : end[0] | 0x20) {
    case 0: break;
    case 'k': m = 1e3; end++; break;
    case 'm': m = 1e6; end++; break;
    case 'g': m = 1e9; end++; break;
    case 't': m = 1e12; end++; break;
    default: return -1;
    }
    if (*end && strcasecmp(end, "bit") && strcasecmp(end, "bit/s") && strcasecmp(end, "bps"))
        return -1;
    return v * m;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -EINVAL;
    double mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = 1024, end++;
    else if (*end == 'm' || *end == 'M')
        mult = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        mult = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end)
        return -EINVAL;
    *out = (size_t)(v * mult);
    return 0;
}

static void human(char *buf, size_t cap, size_t bytes)
{
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, cap, "%zuM", bytes >> 20);
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, cap, "%zuK", bytes >> 10);
    else
        snprintf(buf, cap, "%zu", bytes);
}

/* One thread, 64 MiB, best of several: GB/s (1e9 bytes per second) of bytes copied. */
static double memcpy_bandwidth(void)
{
    const size_t n = 64u << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int i = 0; i < 8; i++) {
        double t0 = dt_now_s();
        memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        double t = dt_now_s() - t0;
        best = t < best ? t : best;
    }
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return (double)n / best / 1e9;
}

/* The test value of element i on rank r: a small integer, exact in every dtype (uint8: 0..16). */
static int value(int rank, size_t i) { return (int)((i * 7 + (size_t)rank * 13) % 17) - 8; }

static void fill(void *buf, dt_dtype t, size_t n, int rank)
{
    for (size_t i = 0; i < n; i++) {
        int v = value(rank, i);
        switch (t) {
        case DT_FLOAT32: ((float *)buf)[i] = (float)v; break;
        case DT_BFLOAT16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
        case DT_FLOAT16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
        case DT_INT32: ((int32_t *)buf)[i] = v; break;
        case DT_INT64: ((int64_t *)buf)[i] = v; break;
        case DT_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(v + 8); break;
        case DT_FLOAT64: ((double *)buf)[i] = v; break;
        }
    }
}

static double element(const void *buf, dt_dtype t, size_t i)
{
    switch (t) {
    case DT_FLOAT32: return ((const float *)buf)[i];
    case DT_BFLOAT16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_FLOAT16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_INT32: return ((const int32_t *)buf)[i];
    case DT_INT64: return (double)((const int64_t *)buf)[i];
    case DT_UINT8: return ((const uint8_t *)buf)[i];
    case DT_FLOAT64: return ((const double *)buf)[i];
    }
    return NAN;
}

/* Elements of the reduction of fill()'s data over world ranks that are wrong (integers exactly;
 * uint8 sums modulo 256; floats within 1%). */
static size_t count_wrong(const void *buf, dt_dtype t, size_t n, int world, dt_redop op)
{
    size_t bad = 0;
    const int off = t == DT_UINT8 ? 8 : 0;
    for (size_t i = 0; i < n; i++) {
        double want = op == DT_SUM || op == DT_AVG ? 0 : value(0, i) + off;
        for (int r = 0; r < world; r++) {
            double v = value(r, i) + off;
            want = op == DT_MAX ? fmax(want, v) : op == DT_MIN ? fmin(want, v) : want + v;
        }
        if (op == DT_AVG)
            want /= world;
        if (t == DT_UINT8)
            want = fmod(want, 256.0);
        double got = element(buf, t, i);
        if (dt_dtype_is_float(t) ? fabs(got - want) > fabs(want) * 1e-2 + 1e-6 : got != want)
            bad++;
    }
    return bad;
}

/* us_out, busbw_out: from the mean iteration time; med_us_out: median time and its busbw. */
static int one_size(dt_comm *c, const bench_opts *o, size_t bytes, char *buf, double memcpy_bw,
                    double *us_out, double *busbw_out, double *med_us_out)
{
    const int rank = dt_comm_rank(c), world = dt_comm_world_size(c);
    const size_t es = dt_dtype_size(o->dtype), count = bytes / es;
    const dt_redop timed_op = dt_dtype_is_float(o->dtype) ? DT_AVG : DT_SUM;
    dt_err err = {0};
    int rc;
    /* Correctness first (on fresh data), then warm-up. */
    fill(buf, o->dtype, count, rank);
    if ((rc = dt_comm_allreduce(c, buf, count, o->dtype, o->op, NULL, &err)) != 0)
        goto fail;
    int64_t wrong = (int64_t)count_wrong(buf, o->dtype, count, world, o->op);
    if ((rc = dt_comm_allreduce(c, &wrong, 1, DT_INT64, DT_SUM, NULL, &err)) != 0)
        goto fail;
    /* Estimate an iteration count from the warm-up; rank 0's choice is everyone's. */
    double t0 = dt_now_s();
    for (int i = 0; i < o->warmup; i++)
        if ((rc = dt_comm_allreduce(c, buf, count, o->dtype, timed_op, NULL, &err)) != 0)
            goto fail;
    double per_it = (dt_now_s() - t0) / o->warmup + 1e-9;
    int32_t iters = (int32_t)DT_MAX(3.0, DT_MIN(10000.0, o->seconds / per_it));
    if ((rc = dt_comm_broadcast(c, &iters, 1, DT_INT32, 0, NULL, &err)) != 0)
        goto fail;
    if ((rc = dt_comm_barrier(c, &err)) != 0)
        goto fail;
    /* Timed: AVG (floats) keeps the (already identical) values bounded; it costs what SUM costs
     * (integers: SUM, whose wrapping is harmless). Each
     * iteration is timed too: on a shared machine the median shows what the transport does when
     * the ranks have their CPUs, the mean what this run got. */
    int n_it = (int)iters;
    double *each = malloc(sizeof *each * (size_t)n_it);
    if (!each) {
        rc = dt_err_set(&err, -ENOMEM, "out of memory");
        goto fail;
    }
    t0 = dt_now_s();
    for (int i = 0; i < n_it; i++) {
        double ti = dt_now_s();
        if (o->async) {
            dt_comm_work *w = NULL;
            if ((rc = dt_comm_allreduce(c, buf, count, o->dtype, timed_op, &w, &err)) != 0 ||
                (rc = dt_comm_wait(c, w, &err)) != 0)
                break;
        } else if ((rc = dt_comm_allreduce(c, buf, count, o->dtype, timed_op, NULL, &err)) != 0) {
            break;
        }
        each[i] = dt_now_s() - ti;
    }
    if (rc) {
        free(each);
        goto fail;
    }
    float t[2] = {(float)((dt_now_s() - t0) / n_it), 0};
    qsort(each, (size_t)n_it, sizeof *each, dt_cmp_double);
    t[1] = (float)each[n_it / 2];
    free(each);
    /* The slowest rank's time is the collective's time. */
    float ts[2 * 64];
    float tmax = t[0], tmed = t[1];
    if (world <= 64) {
        if ((rc = dt_comm_allgather(c, t, ts, 2, DT_FLOAT32, NULL, &err)) != 0)
            goto fail;
        for (int r = 0; r < world; r++) {
            tmax = DT_MAX(tmax, ts[2 * r]);
            tmed = DT_MAX(tmed, ts[2 * r + 1]);
        }
    }
    double algbw = (double)bytes / tmax / 1e9;
    double busbw = algbw * 2.0 * (world - 1) / world;
    double busbw_med = (double)bytes / tmed / 1e9 * 2.0 * (world - 1) / world;
    if (rank == 0) {
        char hs[32];
        human(hs, sizeof hs, bytes);
        printf("%10s %10zu %9s %10.1f %10.1f %11.2f %11.2f %11.2f %7.0f %7.2f\n", hs, count,
               dt_dtype_name(o->dtype), tmax * 1e6, tmed * 1e6, algbw, busbw, busbw_med,
               (double)wrong, memcpy_bw > 0 ? busbw / memcpy_bw : 0);
        fflush(stdout);
    }
    med_us_out[0] = tmed * 1e6;
    med_us_out[1] = busbw_med;
    *us_out = tmax * 1e6;
    *busbw_out = busbw;
    return wrong > 0 ? -EIO : 0;
fail:
    fprintf(stderr, "dtrain bench allreduce: rank %d: %s\n", rank, err.msg);
    return rc;
}

static int run_rank(const bench_opts *o, int rank, int world, int local_rank, int local_world,
                    const char *store_host, int store_port, const char *run_id, int attempt)
{
    dt_err err = {0};
    dt_store *store = NULL;
    dt_comm *c = NULL;
    char *buf = NULL;
    int rc = 0;
    if (o->transport)
        setenv("DTRAIN_COMM_TRANSPORT", o->transport, 1);
    if (world > 1) {
        dt_store_opts so;
        dt_store_opts_default(&so);
        if ((rc = dt_store_connect(&store, store_host, store_port, &so, &err)) != 0)
            goto out;
    }
    dt_comm_opts co;
    dt_comm_opts_default(&co);
    co.rank = rank;
    co.world_size = world;
    co.local_rank = local_rank;
    co.local_world_size = local_world;
    co.run_id = run_id;
    co.attempt = attempt;
    co.timeout_ms = 120000;
    if ((rc = dt_comm_init(&c, store, &co, &err)) != 0)
        goto out;
    if (o->plain) {
        buf = malloc(o->max_bytes + 64);
        if (!buf) {
            rc = dt_err_set(&err, -ENOMEM, "cannot allocate %zu bytes", o->max_bytes);
            goto out;
        }
        memset(buf, 0, o->max_bytes);
    } else if ((rc = dt_comm_mem_alloc(c, o->max_bytes + 64, (void **)&buf, &err)) != 0) {
        goto out;
    }
    /* The reference, measured while the other ranks wait at the barrier. */
    double bw = 0;
    if ((rc = dt_comm_barrier(c, &err)) != 0)
        goto out;
    if (rank == 0)
        bw = memcpy_bandwidth();
    if ((rc = dt_comm_barrier(c, &err)) != 0)
        goto out;
    if (rank == 0) {
        printf("# dtrain bench allreduce: %d ranks, %s, %s, %s calls, transport %s, %s\n", world,
               dt_dtype_name(o->dtype), dt_redop_name(o->op),
               o->async ? "async (handle + wait)" : "blocking", dt_env("DTRAIN_COMM_TRANSPORT"),
               o->plain ? "plain buffer" : "communicator memory");
        printf("# memcpy bandwidth (this machine, this run, one thread, 64 MiB): %.2f GB/s\n", bw);
        printf("# busbw = algbw * 2(n-1)/n from the mean time (nccl-tests); busbw(med) from the "
               "median iteration; ratio = busbw / memcpy bandwidth\n#\n");
        printf("%10s %10s %9s %10s %10s %11s %11s %11s %7s %7s\n", "size", "count", "type",
               "mean(us)", "median(us)", "algbw(GB/s)", "busbw(GB/s)", "busbw(med)", "#wrong",
               "ratio");
    }
    double us_4k = -1, busbw_64m = -1, med_4k = -1, med_64m = -1;
    size_t es = dt_dtype_size(o->dtype);
    for (size_t b = o->min_bytes; b <= o->max_bytes; b *= 2) {
        size_t bytes = DT_MAX(es, b / es * es);
        double us = 0, busbw = 0, med[2] = {0, 0};
        if ((rc = one_size(c, o, bytes, buf, bw, &us, &busbw, med)) != 0 && rc != -EIO)
            goto out;
        if (bytes == 4096) {
            us_4k = us;
            med_4k = med[0];
        }
        if (bytes == 64u << 20) {
            busbw_64m = busbw;
            med_64m = med[1];
        }
        if (b == 0)
            break;
    }
    if (rank == 0) {
        printf("#\n");
        if (us_4k >= 0)
            printf("# 4 KiB all-reduce: mean %.1f us, median %.1f us (target < 50 us): %s\n",
                   us_4k, med_4k, us_4k < 50 ? "met" : med_4k < 50 ? "met by the median" : "missed");
        if (busbw_64m >= 0 && bw > 0)
            printf("# 64 MiB busbw: %.2f GB/s = %.2f x memcpy, median %.2f GB/s = %.2f x (target "
                   ">= 0.5): %s\n",
                   busbw_64m, busbw_64m / bw, med_64m, med_64m / bw,
                   busbw_64m / bw >= 0.5   ? "met"
                   : med_64m / bw >= 0.5 ? "met by the median"
                                         : "missed");
        if (busbw_64m >= 0 && o->link_bps > 0) {
            double link = o->link_bps / 8e9; /* GB/s */
            printf("# 64 MiB busbw / link rate (%.3g Gbit/s = %.4g GB/s): %.3f, median %.3f "
                   "(target >= 0.9): %s\n",
                   o->link_bps / 1e9, link, busbw_64m / link, med_64m / link,
                   busbw_64m / link >= 0.9   ? "met"
                   : med_64m / link >= 0.9 ? "met by the median"
                                           : "missed");
        }
        fflush(stdout);
    }
out:
    if (rc && rc != -EIO)
        fprintf(stderr, "dtrain bench allreduce: rank %d: %s\n", rank, err.msg);
    if (o->plain)
        free(buf);
    else
        dt_comm_mem_free(c, buf);
    dt_comm_free(c);
    dt_store_free(store);
    return rc ? 1 : 0;
}

/* Forks (and execs) o->nproc ranks of this very command against an in-process store. */
static int run_local(const bench_opts *o, int argc, char **argv)
{
    dt_store_server *srv = NULL;
    char port[16], run_id[64], world[16];
    if (dt_bench_store_start("allreduce", &srv, port, sizeof port))
        return 1;
    snprintf(run_id, sizeof run_id, "bench-allreduce-%d", (int)getpid());
    snprintf(world, sizeof world, "%d", o->nproc);
    char **av = calloc((size_t)argc + 16, sizeof *av);
    if (!av) {
        dt_store_server_stop(srv);
        return 1;
    }
    int k = 0;
    av[k++] = (char *)dt_cmd_self_path();
    av[k++] = "bench";
    for (int i = 0; i < argc; i++)
        av[k++] = argv[i];
    av[k++] = "--child-rank";
    const int rank_slot = k++;
    av[k++] = "--child-world";
    av[k++] = world;
    av[k++] = "--child-store";
    av[k++] = port;
    av[k++] = "--child-run-id";
    av[k++] = run_id;
    av[k] = NULL;
    int status[256];
    int failed = dt_bench_run_ranks(av, rank_slot, -1, NULL, o->nproc, status);
    free(av);
    dt_store_server_stop(srv);
    return failed;
}

int dt_bench_allreduce(int argc, char **argv)
{
    bench_opts o = {.nproc = 2,
                    .min_bytes = 4096,
                    .max_bytes = 256u << 20,
                    .dtype = DT_FLOAT32,
                    .op = DT_SUM,
                    .seconds = 0.2,
                    .warmup = 3,
                    .child_rank = -1};
    int child_world = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool take = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--async")) {
            o.async = true;
            take = false;
        } else if (!v) {
            fprintf(stderr, "dtrain bench allreduce: %s needs a value\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--nproc") || !strcmp(a, "--nproc-per-node")) {
            if (dt_parse_int(v, &o.nproc) || o.nproc < 1 || o.nproc > 256) {
                fprintf(stderr, "dtrain bench allreduce: --nproc %s: use 1..256\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
            size_t s;
            if (parse_size(v, &s) || s == 0) {
                fprintf(stderr, "dtrain bench allreduce: %s %s: not a size (e.g. 4K, 64M)\n", a, v);
                return 2;
            }
            *(a[3] == 'i' ? &o.min_bytes : &o.max_bytes) = s;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "float32") || !strcmp(v, "fp32"))
                o.dtype = DT_FLOAT32;
            else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16"))
                o.dtype = DT_BFLOAT16;
            else if (!strcmp(v, "fp16") || !strcmp(v, "float16"))
                o.dtype = DT_FLOAT16;
            else if (!strcmp(v, "float64") || !strcmp(v, "fp64"))
                o.dtype = DT_FLOAT64;
            else if (!strcmp(v, "int32") || !strcmp(v, "int64") || !strcmp(v, "uint8"))
                o.dtype = v[0] == 'u' ? DT_UINT8 : v[3] == '3' ? DT_INT32 : DT_INT64;
            else {
                fprintf(stderr, "dtrain bench allreduce: --dtype %s: use float32, bf16, fp16, "
                                "float64, int32, int64 or uint8\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--op")) {
            int k = 0;
            while (k < DT_REDOP_COUNT && strcmp(v, dt_redop_name((dt_redop)k)))
                k++;
            if (k == DT_REDOP_COUNT) {
                fprintf(stderr, "dtrain bench allreduce: --op %s: use sum, avg, max or min\n", v);
                return 2;
            }
            o.op = (dt_redop)k;
        } else if (!strcmp(a, "--transport")) {
            if (strcmp(v, "auto") && strcmp(v, "shm") && strcmp(v, "tcp")) {
                fprintf(stderr, "dtrain bench allreduce: --transport %s: use auto, shm or tcp\n", v);
                return 2;
            }
            o.transport = v;
        } else if (!strcmp(a, "--buffer")) {
            if (strcmp(v, "comm") && strcmp(v, "plain")) {
                fprintf(stderr, "dtrain bench allreduce: --buffer %s: use comm or plain\n", v);
                return 2;
            }
            o.plain = !strcmp(v, "plain");
        } else if (!strcmp(a, "--link")) {
            if ((o.link_bps = parse_rate(v)) <= 0) {
                fprintf(stderr, "dtrain bench allreduce: --link %s: give a rate such as 1gbit or "
                                "10gbit\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seconds")) {
            if (dt_parse_double(v, &o.seconds) || o.seconds <= 0) {
                fprintf(stderr, "dtrain bench allreduce: --seconds %s: a positive number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--child-rank")) {
            dt_parse_int(v, &o.child_rank);
        } else if (!strcmp(a, "--child-world")) {
            dt_parse_int(v, &child_world);
        } else if (!strcmp(a, "--child-store")) {
            dt_strlcpy(o.store_host, "127.0.0.1", sizeof o.store_host);
            dt_parse_int(v, &o.store_port);
        } else if (!strcmp(a, "--child-run-id")) {
            dt_strlcpy(o.run_id, v, sizeof o.run_id);
        } else {
            fprintf(stderr, "dtrain bench allreduce: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (take)
            i++;
    }
    if (o.op == DT_AVG && !dt_dtype_is_float(o.dtype)) {
        fprintf(stderr, "dtrain bench allreduce: --op avg is for floating types; %s takes sum, "
                        "max or min\n", dt_dtype_name(o.dtype));
        return 2;
    }
    if (o.min_bytes > o.max_bytes) {
        fprintf(stderr, "dtrain bench allreduce: --min is larger than --max\n");
        return 2;
    }
    dt_log_init();
    if (o.child_rank >= 0) {
        dt_log_set_rank(o.child_rank);
        return run_rank(&o, o.child_rank, child_world, o.child_rank, child_world, o.store_host,
                        o.store_port, o.run_id, 0);
    }
    /* Under the launcher: the ranks are its workers. */
    const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
    const char *shost = dt_env("DTRAIN_STORE_ADDR"), *sport = dt_env("DTRAIN_STORE_PORT");
    if (rank && world && shost && sport) {
        int r = 0, w = 1, lr = 0, lw = 1, p = 0, att = 0;
        dt_parse_int(rank, &r);
        dt_parse_int(world, &w);
        if (getenv("LOCAL_RANK"))
            dt_parse_int(getenv("LOCAL_RANK"), &lr);
        if (getenv("LOCAL_WORLD_SIZE"))
            dt_parse_int(getenv("LOCAL_WORLD_SIZE"), &lw);
        dt_parse_int(sport, &p);
        dt_parse_int(dt_env("DTRAIN_ATTEMPT"), &att);
        dt_log_set_rank(r);
        return run_rank(&o, r, w, lr, lw, shost, p, dt_env("DTRAIN_RUN_ID"), att);
    }
    return run_local(&o, argc, argv) ? 1 : 0;
}
