/* lowbit.c - the low-bit all-reduce of a DDP bucket (int8, 1bit with error feedback); see
 * lowbit.h. Plain C over host memory: the quantisers of quant.h and the communicator's
 * point-to-point batches and all-gathers.
 *
 * A chunk's payload: its block scales (float32, one per block of the chunk's c elements: int8's
 * DT_QUANT_BLOCK, 1bit's DT_QUANT_SIGN_BLOCK; the padding's as 0) then its values (int8: c
 * bytes; 1bit: c / 8 bytes of sign words). A padded element is 0 in int8 and a cleared sign bit in 1bit, and is never decompressed: each
 * step reads only the chunk's valid elements (the bucket's, up to hi).
 */
#include "runtime/train/parallel/dpsync/lowbit.h"

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"
#include "runtime/train/parallel/dpsync/quant.h"

#define CHUNK_ALIGN 32 /* elements: whole sign words, 4-byte aligned int8 payloads */

typedef struct lb_bucket {
    size_t lo, hi;
    size_t c;             /* elements per chunk */
    size_t pb;            /* bytes of one chunk's payload */
    size_t at;            /* offset of its payloads in tx and rx (N * pb each) */
    size_t sat;           /* 1bit: offset of this rank's chunk in the server residual */
    dt_comm_work *work;   /* the point-to-point batch (after send) or the all-gather (after
                             reduce), until waited */
} lb_bucket;

struct dt_lowbit {
    dt_lowbit_kind kind;
    dt_comm *c;           /* borrowed */
    int me, N;
    size_t num_params;
    lb_bucket *b;         /* (nb) */
    int nb;
    unsigned char *tx;    /* the chunks sent, then the all-gathered shards (sum of N * pb) */
    unsigned char *rx;    /* the chunks received (slot me unused) */
    size_t pay_bytes;     /* of tx (= of rx) */
    float *acc;           /* (max c) a chunk in float32: the sum, or 1bit's gradient + residual */
    size_t acc_n;
    float *resid;         /* 1bit: (num_params) the worker residual */
    float *sresid;        /* 1bit: (sres_n) the server residual of this rank's chunks */
    size_t sres_n;
    bool stochastic;      /* int8: stochastic rounding */
    uint64_t seed, step;  /* what its draws are a function of (with bucket, chunk, rank) */
};

static size_t payload_bytes(dt_lowbit_kind kind, size_t c)
{
    size_t scales = (kind == DT_LOWBIT_INT8 ? dt_quant_blocks(c) : dt_quant_sign_blocks(c)) *
                    sizeof(float);
    return scales + (kind == DT_LOWBIT_INT8 ? c : c / 8);
}

/* Elements of chunk j of b that lie in the bucket. */
static size_t valid(const lb_bucket *b, int j)
{
    size_t start = b->lo + (size_t)j * b->c;
    return start >= b->hi ? 0 : DT_MIN(b->c, b->hi - start);
}

/* Compresses x (n valid of the chunk's c) into payload p; 1bit: resid (n, may alias x) = the
 * error left. Stochastic rounding draws from a stream of (seed, step, i, j, rank, stage). */
static void compress(const dt_lowbit *q, const lb_bucket *b, int i, int j, int stage,
                     const float *x, size_t n, unsigned char *p, float *resid)
{
    size_t nbk = q->kind == DT_LOWBIT_INT8 ? dt_quant_blocks(b->c) : dt_quant_sign_blocks(b->c);
    float *scale = (float *)p;
    memset(p, 0, b->pb);
    dt_rng r;
    if (q->stochastic) {
        uint64_t where = (((uint64_t)i * 65537u + (uint64_t)j) * 65537u + (uint64_t)q->me) * 2u +
                         (uint64_t)stage;
        dt_rng_seed2(&r, q->seed ^ (q->step * 0x9e3779b97f4a7c15ull), where);
    }
    if (q->kind == DT_LOWBIT_INT8)
        dt_quant_int8(x, n, 1.0f, (int8_t *)(p + nbk * sizeof(float)), scale,
                      q->stochastic ? &r : NULL);
    else
        dt_quant_sign(x, n, (uint32_t *)(p + nbk * sizeof(float)), scale, resid);
}

static void decompress(const dt_lowbit *q, const lb_bucket *b, const unsigned char *p, size_t n,
                       float *y, int acc)
{
    size_t nbk = q->kind == DT_LOWBIT_INT8 ? dt_quant_blocks(b->c) : dt_quant_sign_blocks(b->c);
    const float *scale = (const float *)p;
    if (q->kind == DT_LOWBIT_INT8)
        dt_dequant_int8((const int8_t *)(p + nbk * sizeof(float)), scale, n, y, acc);
    else
        dt_dequant_sign((const uint32_t *)(p + nbk * sizeof(float)), scale, n, y, acc);
}

int dt_lowbit_create(dt_lowbit **out, dt_lowbit_kind kind, dt_comm *c, size_t num_params,
                     dt_err *err)
{
    *out = NULL;
    dt_lowbit *q = calloc(1, sizeof *q);
    if (!q)
        return dt_err_set(err, -ENOMEM, "ddp.compress: out of memory");
    q->kind = kind;
    q->c = c;
    q->me = dt_comm_rank(c);
    q->N = dt_comm_world_size(c);
    q->num_params = num_params;
    if (kind == DT_LOWBIT_1BIT && num_params &&
        !(q->resid = calloc(num_params, sizeof *q->resid))) {
        free(q);
        return dt_err_set(err, -ENOMEM, "ddp.compress = 1bit: the residual of %zu parameters",
                          num_params);
    }
    *out = q;
    return 0;
}

static void wait_all(dt_lowbit *q)
{
    for (int i = 0; i < q->nb; i++)
        if (q->b[i].work) {
            dt_comm_wait(q->c, q->b[i].work, NULL);
            q->b[i].work = NULL;
        }
}

void dt_lowbit_free(dt_lowbit *q)
{
    if (!q)
        return;
    wait_all(q);
    free(q->b);
    free(q->tx);
    free(q->rx);
    free(q->acc);
    free(q->resid);
    free(q->sresid);
    free(q);
}

int dt_lowbit_set_stochastic(dt_lowbit *q, uint64_t seed, dt_err *err)
{
    if (q->kind != DT_LOWBIT_INT8)
        return dt_err_set(err, -EINVAL, "ddp.compress_stochastic is for ddp.compress = int8 "
                          "(1bit sends signs: nothing to round)");
    q->stochastic = true;
    q->seed = seed;
    return 0;
}

void dt_lowbit_set_step(dt_lowbit *q, uint64_t step) { q->step = step; }

int dt_lowbit_plan(dt_lowbit *q, const size_t *lo, const size_t *hi, int nb, dt_err *err)
{
    if (q->b)
        return dt_err_set(err, -EBUSY, "ddp.compress: the buckets are planned already");
    lb_bucket *b = calloc((size_t)nb + 1, sizeof *b);
    if (!b)
        return dt_err_set(err, -ENOMEM, "ddp.compress: out of memory");
    size_t at = 0, sat = 0, maxc = 0;
    for (int i = 0; i < nb; i++) {
        size_t n = hi[i] - lo[i], c = (n + (size_t)q->N - 1) / (size_t)q->N;
        c = (c + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
        b[i] = (lb_bucket){.lo = lo[i], .hi = hi[i], .c = c, .pb = payload_bytes(q->kind, c),
                           .at = at, .sat = sat};
        at += (size_t)q->N * b[i].pb;
        sat += c;
        maxc = DT_MAX(maxc, c);
    }
    q->b = b; /* owned by q from here: dt_lowbit_free frees what follows too */
    q->nb = nb;
    q->tx = malloc(at + 64);
    q->rx = malloc(at + 64);
    q->acc = malloc((maxc + 1) * sizeof *q->acc);
    if (q->kind == DT_LOWBIT_1BIT)
        q->sresid = calloc(sat + 1, sizeof *q->sresid);
    if (!q->tx || !q->rx || !q->acc || (q->kind == DT_LOWBIT_1BIT && !q->sresid))
        return dt_err_set(err, -ENOMEM, "ddp.compress: %zu bytes of payloads", 2 * at);
    q->pay_bytes = at;
    q->acc_n = maxc;
    q->sres_n = q->sresid ? sat : 0;
    return 0;
}

int dt_lowbit_send(dt_lowbit *q, int i, const float *g, dt_err *err)
{
    lb_bucket *b = &q->b[i];
    dt_p2p_op ops[2 * 64];
    dt_p2p_op *o = q->N <= 64 ? ops : malloc(sizeof *o * 2 * (size_t)q->N);
    if (!o)
        return dt_err_set(err, -ENOMEM, "ddp.compress: out of memory");
    int n = 0;
    for (int j = 0; j < q->N; j++) {
        size_t v = valid(b, j), start = b->lo + (size_t)j * b->c;
        unsigned char *p = q->tx + b->at + (size_t)j * b->pb;
        if (q->kind == DT_LOWBIT_1BIT && v) {
            /* error feedback: compress gradient + residual; the residual becomes the error */
            float *e = q->resid + start;
            for (size_t k = 0; k < v; k++)
                e[k] += g[start + k];
            compress(q, b, i, j, 0, e, v, p, e);
        } else {
            compress(q, b, i, j, 0, g + start, v, p, NULL);
        }
        if (j == q->me)
            continue;
        o[n++] = (dt_p2p_op){DT_P2P_SEND, p, b->pb, DT_UINT8, j};
        o[n++] = (dt_p2p_op){DT_P2P_RECV, q->rx + b->at + (size_t)j * b->pb, b->pb, DT_UINT8, j};
    }
    int rc = n ? dt_comm_p2p(q->c, o, n, &b->work, err) : 0; /* one rank: nothing to send */
    if (o != ops)
        free(o);
    if (rc) {
        b->work = NULL;
        return dt_err_prefix(err, "ddp.compress: the chunks of bucket %d: ", i);
    }
    return 0;
}

int dt_lowbit_reduce(dt_lowbit *q, int i, dt_err *err)
{
    lb_bucket *b = &q->b[i];
    int rc = b->work ? dt_comm_wait(q->c, b->work, err) : 0;
    b->work = NULL;
    if (rc)
        return rc;
    /* the N copies of this rank's chunk, in rank order, in float32; then the average */
    size_t v = valid(b, q->me);
    for (int j = 0; j < q->N; j++) {
        const unsigned char *p = j == q->me ? q->tx + b->at + (size_t)j * b->pb
                                            : q->rx + b->at + (size_t)j * b->pb;
        decompress(q, b, p, v, q->acc, j > 0);
    }
    float inv = 1.0f / (float)q->N;
    for (size_t k = 0; k < v; k++)
        q->acc[k] *= inv;
    /* the shard compressed again, in place in the all-gather's buffer (the chunks sent from
     * there are delivered: the batch is done) */
    unsigned char *mine = q->tx + b->at + (size_t)q->me * b->pb;
    if (q->kind == DT_LOWBIT_1BIT) {
        float *e = q->sresid + b->sat;
        for (size_t k = 0; k < v; k++)
            e[k] += q->acc[k];
        compress(q, b, i, q->me, 1, e, v, mine, e);
    } else {
        compress(q, b, i, q->me, 1, q->acc, v, mine, NULL);
    }
    rc = dt_comm_allgather(q->c, mine, q->tx + b->at, b->pb, DT_UINT8, &b->work, err);
    if (rc) {
        b->work = NULL;
        return dt_err_prefix(err, "ddp.compress: the shards of bucket %d: ", i);
    }
    return 0;
}

int dt_lowbit_recv(dt_lowbit *q, int i, float *g, dt_err *err)
{
    lb_bucket *b = &q->b[i];
    int rc = dt_comm_wait(q->c, b->work, err);
    b->work = NULL;
    if (rc)
        return rc;
    for (int j = 0; j < q->N; j++) {
        size_t v = valid(b, j);
        if (v)
            decompress(q, b, q->tx + b->at + (size_t)j * b->pb, v, g + b->lo + (size_t)j * b->c,
                       0);
    }
    return 0;
}

size_t dt_lowbit_bytes(const dt_lowbit *q)
{
    return 2 * q->pay_bytes + q->acc_n * sizeof(float) +
           (q->resid ? q->num_params * sizeof(float) : 0) + q->sres_n * sizeof(float);
}

float *dt_lowbit_worker_residual(dt_lowbit *q) { return q->resid; }

void dt_lowbit_server_get(const dt_lowbit *q, float *out)
{
    if (!q->resid)
        return;
    memset(out, 0, q->num_params * sizeof *out);
    for (int i = 0; q->sresid && i < q->nb; i++) {
        const lb_bucket *b = &q->b[i];
        size_t v = valid(b, q->me);
        memcpy(out + b->lo + (size_t)q->me * b->c, q->sresid + b->sat, v * sizeof *out);
    }
}
