/* ddp.c - the DistributedDataParallel reducer; see ddp.h.
 *
 * Buckets are built once, from the tensor table, walking it backwards (backward finishes the
 * last layers first): the first bucket is closed at first_bucket_mb, the others at
 * bucket_cap_mb, always on a tensor boundary. Each bucket counts the gradient elements reported
 * final in its range; when the count reaches its size it is ready, and ready buckets are launched
 * strictly in bucket order. Small control-plane collectives (consistency check, metrics
 * averages) go through a scratch buffer of backend memory, so they work on any backend.
 */
#include "runtime/train/ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

#define MIB (1024.0 * 1024.0)
#define MSG_BYTES 256 /* per-rank consistency message */

typedef struct bucket {
    size_t lo, hi;        /* [lo, hi) of the flat gradient buffer, in elements */
    size_t ready;         /* elements reported final in this backward */
    bool launched;
    dt_comm_work *work;   /* in flight, owned until waited */
} bucket;

struct dt_ddp {
    dt_model *m;          /* borrowed */
    dt_comm *c;           /* borrowed */
    dt_ddp_opts o;
    int world;
    bucket *b;            /* (nb) from the end of the buffer to its start */
    int nb;
    int next;             /* next bucket to launch */
    uint16_t *comp;       /* (num_params) 16-bit payloads when compressing (backend memory, or
                             communicator memory), owned */
    void *cmem;           /* communicator memory holding comp or the gradients, or NULL */
    size_t cmem_bytes;    /* its size, charged to the backend's DT_MEM_COMM */
    float *own_grads;     /* the model's gradient buffer while m->grads points at cmem */
    float *scratch;       /* (scratch_n) backend memory for small collectives, owned */
    size_t scratch_n;
    int rc;               /* first error met in the hook */
    dt_err err;
    /* The ready order of the first synchronised backward, for the bucket rebuild. */
    bool rebuilt;         /* the rebuild happened (or was declined); no more recording */
    size_t *rec;          /* (rec_cap) pairs (offset, numel) in report order */
    int rec_n, rec_cap;   /* pairs recorded; rec_n > rec_cap means overflowed */
    dt_ddp_stats st;
};

void dt_ddp_opts_default(dt_ddp_opts *o)
{
    o->bucket_cap_mb = 25;
    o->first_bucket_mb = 1;
    o->compress = DT_FLOAT32;
    o->broadcast_buffers = true;
    o->check_consistency = true;
}

int dt_ddp_opts_from_job(dt_ddp_opts *o, const dt_job *job, dt_err *err)
{
    dt_ddp_opts_default(o);
    o->bucket_cap_mb = job->bucket_cap_mb;
    o->first_bucket_mb = job->first_bucket_mb;
    o->broadcast_buffers = job->broadcast_buffers;
    o->check_consistency = job->check_consistency;
    if (job->compress == DT_COMPRESS_NONE)
        o->compress = DT_FLOAT32;
    else if (job->compress == DT_COMPRESS_BF16)
        o->compress = DT_BFLOAT16;
    else if (job->compress == DT_COMPRESS_FP16)
        o->compress = DT_FLOAT16;
    else
        return dt_err_set(err, -EINVAL, "ddp.compress = %d: use none, bf16 or fp16",
                          (int)job->compress);
    return 0;
}

/* ---- small collectives through backend memory ---------------------------------------------- */

/* host (bytes) -> every rank's host from rank 0, or allgathered (recv bytes*world): raw bytes,
 * moved as DT_UINT8, through the scratch (whose capacity is counted in floats). */
static int small_broadcast(dt_ddp *d, void *host, size_t bytes, dt_err *err)
{
    dt_backend *be = d->m->be;
    be->memcpy_h2d(be, d->scratch, host, bytes);
    int rc = dt_comm_broadcast(d->c, d->scratch, bytes, DT_UINT8, 0, NULL, err);
    if (rc == 0)
        be->memcpy_d2h(be, host, d->scratch, bytes);
    return rc;
}

static int small_allgather(dt_ddp *d, const void *send, void *recv, size_t bytes, dt_err *err)
{
    dt_backend *be = d->m->be;
    char *out = (char *)d->scratch + bytes;
    be->memcpy_h2d(be, d->scratch, send, bytes);
    int rc = dt_comm_allgather(d->c, d->scratch, out, bytes, DT_UINT8, NULL, err);
    if (rc == 0)
        be->memcpy_d2h(be, recv, out, bytes * (size_t)d->world);
    return rc;
}

static int ensure_scratch(dt_ddp *d, size_t n, dt_err *err)
{
    if (n <= d->scratch_n)
        return 0;
    dt_backend *be = d->m->be;
    be->free(be, d->scratch);
    d->scratch = NULL;
    d->scratch_n = 0;
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_COMM);
    int rc = be->alloc(be, (void **)&d->scratch, n * sizeof(float), err);
    dt_mem_tag(be, old);
    if (rc == 0)
        d->scratch_n = n;
    return rc;
}

/* ---- the consistency check ---------------------------------------------------------------- */

typedef struct tensor_rec {
    char name[DT_TENSOR_NAME_MAX];
    int32_t ndim;
    int32_t buffer; /* 0: parameter, 1: buffer */
    int64_t shape[DT_TENSOR_MAX_DIMS];
    uint64_t numel;
} tensor_rec;

static void shape_str(const tensor_rec *r, char *buf, size_t cap)
{
    size_t k = (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < r->ndim && i < DT_TENSOR_MAX_DIMS && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? "," : "", (long long)r->shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, ")");
}

static void fill_rec(tensor_rec *r, const dt_tensor_info *t, int buffer)
{
    memset(r, 0, sizeof *r);
    dt_strlcpy(r->name, t->name, sizeof r->name);
    r->ndim = t->ndim;
    r->buffer = buffer;
    for (int i = 0; i < t->ndim && i < DT_TENSOR_MAX_DIMS; i++)
        r->shape[i] = t->shape[i];
    r->numel = t->numel;
}

static int check_consistency(dt_ddp *d, dt_err *err)
{
    const dt_model *m = d->m;
    const int rank = dt_comm_rank(d->c);
    int64_t hdr[4] = {(int64_t)m->num_params, m->num_tensors, (int64_t)m->num_buffers,
                      m->num_buffer_tensors};
    int64_t h0[4];
    memcpy(h0, hdr, sizeof h0);
    int rc;
    tensor_rec *recs = NULL;
    char *msgs = NULL, mine[MSG_BYTES];
    if ((rc = ensure_scratch(d, 16, err)) || (rc = small_broadcast(d, h0, sizeof h0, err)))
        goto out;
    int64_t n0 = h0[1] + h0[3];
    if (n0 < 0 || n0 > 100000000) {
        rc = dt_err_set(err, -EPROTO, "model check: rank 0 announced %lld tensors", (long long)n0);
        goto out;
    }
    size_t rec_bytes = (size_t)n0 * sizeof(tensor_rec);
    recs = calloc((size_t)n0 + 1, sizeof *recs);
    msgs = calloc((size_t)d->world, MSG_BYTES);
    if (!recs || !msgs) {
        rc = dt_err_set(err, -ENOMEM, "model check: out of memory");
        goto out;
    }
    if (rank == 0) {
        for (int i = 0; i < m->num_tensors; i++)
            fill_rec(&recs[i], &m->tensors[i], 0);
        for (int i = 0; i < m->num_buffer_tensors; i++)
            fill_rec(&recs[m->num_tensors + i], &m->buffer_tensors[i], 1);
    }
    size_t need = DT_MAX(rec_bytes, (size_t)MSG_BYTES * (size_t)(d->world + 1));
    if ((rc = ensure_scratch(d, need / sizeof(float) + 16, err)) ||
        (rec_bytes && (rc = small_broadcast(d, recs, rec_bytes, err))))
        goto out;

    /* What differs here from rank 0, in one line (empty when nothing does). */
    memset(mine, 0, sizeof mine);
    if (h0[1] != m->num_tensors || h0[3] != m->num_buffer_tensors || h0[0] != (int64_t)m->num_params ||
        h0[2] != (int64_t)m->num_buffers) {
        char line[512];
        snprintf(line, sizeof line,
                 "rank %d built %zu parameters in %d tensors (%zu buffer values in %d), rank 0 "
                 "%lld in %lld (%lld in %lld)",
                 rank, m->num_params, m->num_tensors, m->num_buffers, m->num_buffer_tensors,
                 (long long)h0[0], (long long)h0[1], (long long)h0[2], (long long)h0[3]);
        dt_strlcpy(mine, line, sizeof mine);
    }
    int total = m->num_tensors + m->num_buffer_tensors;
    for (int i = 0; i < total && i < n0 && !mine[0]; i++) {
        tensor_rec r;
        fill_rec(&r, i < m->num_tensors ? &m->tensors[i] : &m->buffer_tensors[i - m->num_tensors],
                 i >= m->num_tensors);
        const tensor_rec *z = &recs[i];
        if (strcmp(r.name, z->name) || r.ndim != z->ndim || r.numel != z->numel ||
            memcmp(r.shape, z->shape, sizeof r.shape) || r.buffer != z->buffer) {
            char a[64], b[64];
            shape_str(z, a, sizeof a);
            shape_str(&r, b, sizeof b);
            char line[512];
            snprintf(line, sizeof line, "%s %d is %.80s %s on rank 0 but %.80s %s on rank %d",
                     r.buffer ? "buffer" : "tensor", i, z->name, a, r.name, b, rank);
            dt_strlcpy(mine, line, sizeof mine);
        }
    }
    if ((rc = small_allgather(d, mine, msgs, MSG_BYTES, err)))
        goto out;
    int differ = 0;
    const char *first = NULL;
    for (int r = 0; r < d->world; r++) {
        char *msg = msgs + (size_t)r * MSG_BYTES;
        msg[MSG_BYTES - 1] = '\0';
        if (msg[0]) {
            differ++;
            if (!first)
                first = msg;
        }
    }
    if (differ)
        rc = dt_err_set(err, -EPROTO,
                        "DDP: the model differs across ranks: %s%s (every rank must build the "
                        "same model from the same job file)",
                        first, differ > 1 ? " (and on other ranks)" : "");
out:
    free(recs);
    free(msgs);
    return rc;
}

/* ---- buckets ------------------------------------------------------------------------------- */

/* The buckets: walking the tensors from the end of the buffer, a bucket is closed before a tensor
 * that would take it over its cap, and at offset `split` (0: nowhere) whatever its size. */
static int build_buckets(dt_ddp *d, size_t split, dt_err *err)
{
    const dt_model *m = d->m;
    size_t first_cap = (size_t)DT_MAX(1.0, d->o.first_bucket_mb * MIB / 4);
    size_t cap = (size_t)DT_MAX(1.0, d->o.bucket_cap_mb * MIB / 4);
    bucket *b = calloc((size_t)m->num_tensors + 2, sizeof *b);
    if (!b)
        return dt_err_set(err, -ENOMEM, "DDP: out of memory");
    free(d->b);
    d->b = b;
    d->nb = 0;
    d->st.largest_bucket = 0;
    if (m->num_params == 0)
        return 0;
    size_t hi = m->num_params, lo = hi;
    for (int i = m->num_tensors - 1; i >= 0; i--) {
        size_t off = DT_MIN(m->tensors[i].offset, lo);
        size_t limit = d->nb == 0 ? first_cap : cap;
        /* close before this tensor when it would overflow the bucket, or when it lies below
         * the split point and the bucket holds what lies above */
        if (lo < hi && (hi - off > limit || (split > 0 && lo == split))) {
            d->b[d->nb++] = (bucket){.lo = lo, .hi = hi};
            hi = lo;
        }
        lo = off;
    }
    d->b[d->nb++] = (bucket){.lo = 0, .hi = hi};
    for (int i = 0; i < d->nb; i++)
        d->st.largest_bucket = DT_MAX(d->st.largest_bucket, d->b[i].hi - d->b[i].lo);
    d->st.num_buckets = d->nb;
    return 0;
}

/* Bucket rebuild (PyTorch DDP does the same after its first iteration): the static buckets
 * follow the buffer, but backward may report gradients in another grouping. GPT's tied token
 * embedding sits at the start of the buffer and is final only after the embedding backward, so
 * the static last bucket holds it together with the first blocks, whose gradients were final long
 * before, and all of it is reduced after backward instead of during it. After the first
 * synchronised backward the buckets are rebuilt with the range the model reported last in a
 * bucket of its own, so that what is left to reduce when backward ends is as small as it can be.
 * Buckets stay contiguous slices, so this applies when the reports came in decreasing, adjacent
 * ranges covering the buffer (every model of the zoo); otherwise the static buckets stay. Rank
 * 0's split point is broadcast, so every rank launches the same buckets in the same order. */
static int rebuild(dt_ddp *d, dt_err *err)
{
    const dt_model *m = d->m;
    uint64_t split = 0; /* the top of the range reported last; 0 = keep the static buckets */
    int rc = 0;
    d->rebuilt = true;
    if (dt_comm_rank(d->c) == 0 && d->rec_n > 1 && d->rec_n <= d->rec_cap) {
        bool ok = true;
        size_t hi = m->num_params;
        for (int k = 0; k < d->rec_n && ok; k++) {
            size_t lo = d->rec[2 * k], n = d->rec[2 * k + 1];
            ok = lo + n == hi && n > 0;
            hi = lo;
        }
        if (ok && hi == 0)
            split = d->rec[2 * (d->rec_n - 1)] + d->rec[2 * (d->rec_n - 1) + 1];
    }
    free(d->rec);
    d->rec = NULL;
    if (d->world > 1) {
        if ((rc = small_broadcast(d, &split, sizeof split, err)))
            return rc;
    }
    if (split == 0 || split >= m->num_params)
        return 0;
    int before = d->nb;
    if ((rc = build_buckets(d, (size_t)split, err)))
        return rc;
    d->st.rebuilt = true;
    DT_DEBUG("DDP: buckets rebuilt from the ready order: %d buckets (%d before), the last one "
             "[0, %llu)", d->nb, before, (unsigned long long)split);
    return 0;
}

static void launch(dt_ddp *d, int i)
{
    bucket *b = &d->b[i];
    size_t n = b->hi - b->lo;
    b->launched = true;
    if (d->rc)
        return;
    int rc;
    if (d->comp) {
        dt_backend *be = d->m->be;
        be->to_half(be, d->comp + b->lo, d->m->grads + b->lo, n, 1.0f / (float)d->world,
                    d->o.compress == DT_BFLOAT16);
        rc = dt_comm_allreduce(d->c, d->comp + b->lo, n, d->o.compress, DT_SUM, &b->work, &d->err);
    } else {
        rc = dt_comm_allreduce(d->c, d->m->grads + b->lo, n, DT_FLOAT32, DT_AVG, &b->work,
                               &d->err);
    }
    if (rc) {
        d->rc = rc;
        b->work = NULL;
    }
}

void dt_ddp_grad_ready(void *ctx, size_t offset, size_t numel)
{
    dt_ddp *d = ctx;
    size_t end = offset + numel;
    if (!d->rebuilt && d->rec) {
        if (d->rec_n < d->rec_cap) {
            d->rec[2 * d->rec_n] = offset;
            d->rec[2 * d->rec_n + 1] = numel;
        }
        d->rec_n++;
    }
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        size_t lo = DT_MAX(b->lo, offset), hi = DT_MIN(b->hi, end);
        if (lo >= hi)
            continue;
        b->ready += hi - lo;
        if ((b->ready > b->hi - b->lo || b->launched) && !d->rc)
            d->rc = dt_err_set(&d->err, -EINVAL,
                               "DDP: gradients [%zu, %zu) were reported final twice in one "
                               "backward (a model bug, or a second backward before "
                               "dt_ddp_finish)",
                               lo, hi);
    }
    while (d->next < d->nb && d->b[d->next].ready >= d->b[d->next].hi - d->b[d->next].lo) {
        launch(d, d->next++);
        d->st.launched_early++;
    }
}

int dt_ddp_finish(dt_ddp *d, dt_err *err)
{
    double t0 = dt_now_s();
    while (d->next < d->nb) {
        launch(d, d->next++);
        d->st.launched_late++;
    }
    int rc = d->rc;
    if (rc && err)
        *err = d->err;
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (b->work) {
            dt_err e = {0};
            int wrc = dt_comm_wait(d->c, b->work, &e);
            b->work = NULL;
            if (wrc && !rc) {
                rc = wrc;
                if (err)
                    *err = e;
            }
        }
        if (!rc && d->comp)
            d->m->be->from_half(d->m->be, d->m->grads + b->lo, d->comp + b->lo, b->hi - b->lo,
                                1.0f, d->o.compress == DT_BFLOAT16);
        b->ready = 0;
        b->launched = false;
    }
    d->next = 0;
    d->rc = 0;
    d->st.bucket_syncs += (uint64_t)d->nb;
    if (!rc && !d->rebuilt && d->rec)
        rc = rebuild(d, err);
    if (!rc && d->o.broadcast_buffers && d->m->num_buffers > 0)
        rc = dt_comm_broadcast(d->c, d->m->buffers, d->m->num_buffers, DT_FLOAT32, 0, NULL, err);
    d->st.wait_s += dt_now_s() - t0;
    if (!rc)
        d->st.syncs++;
    return rc;
}

int dt_ddp_average(dt_ddp *d, double *v, int n, dt_err *err)
{
    if (n <= 0 || d->world == 1)
        return 0;
    int rc = 0;
    dt_backend *be = d->m->be;
    /* the scratch holds at least 64 floats: 32 doubles a piece */
    for (int k = 0; k < n && !rc; k += 32) {
        int m = DT_MIN(32, n - k);
        be->memcpy_h2d(be, d->scratch, v + k, (size_t)m * sizeof(double));
        rc = dt_comm_allreduce(d->c, d->scratch, (size_t)m, DT_FLOAT64, DT_AVG, NULL, err);
        if (!rc)
            be->memcpy_d2h(be, v + k, d->scratch, (size_t)m * sizeof(double));
    }
    return rc;
}

void dt_ddp_get_stats(const dt_ddp *d, dt_ddp_stats *s) { *s = d->st; }

/* ---- lifecycle ------------------------------------------------------------------------------ */

/* Moves what the buckets all-reduce (the gradients, or the 16-bit payloads) into communicator
 * memory, where the transport reads the peers' copies directly. Host memory only: the nccl
 * backend has none (-ENOTSUP), and device gradients stay where they are. */
static int use_comm_memory(dt_ddp *d, dt_err *err)
{
    dt_model *m = d->m;
    if (d->world == 1 || !m->num_params || strcmp(m->be->name, "cpu") != 0)
        return 0;
    size_t bytes = m->num_params * (d->o.compress != DT_FLOAT32 ? sizeof *d->comp : sizeof(float));
    int rc = dt_comm_mem_alloc(d->c, bytes, &d->cmem, err);
    if (rc == -ENOTSUP)
        return 0;
    if (rc) {
        dt_err_prefix(err, "DDP: ");
        return rc;
    }
    d->st.comm_memory = true;
    d->cmem_bytes = bytes;
    dt_mem_external(m->be, DT_MEM_COMM, bytes, true);
    if (d->o.compress != DT_FLOAT32) {
        d->comp = d->cmem;
    } else {
        memcpy(d->cmem, m->grads, bytes);
        d->own_grads = m->grads;
        m->grads = d->cmem;
    }
    return 0;
}

int dt_ddp_create(dt_ddp **out, dt_model *m, dt_comm *c, const dt_ddp_opts *opts, dt_err *err)
{
    dt_ddp_opts def;
    if (!opts) {
        dt_ddp_opts_default(&def);
        opts = &def;
    }
    int rc = 0;
    dt_ddp *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "DDP: out of memory");
    d->m = m;
    d->c = c;
    d->o = *opts;
    d->world = dt_comm_world_size(c);
    if (d->o.bucket_cap_mb <= 0 || d->o.first_bucket_mb <= 0) {
        rc = dt_err_set(err, -EINVAL, "DDP: bucket sizes must be positive (bucket_cap_mb %g, "
                        "first_bucket_mb %g)", d->o.bucket_cap_mb, d->o.first_bucket_mb);
        goto fail;
    }
    if ((rc = ensure_scratch(d, 64, err)))
        goto fail;
    if (d->world > 1) {
        if (d->o.check_consistency && (rc = check_consistency(d, err)))
            goto fail;
        if ((rc = dt_comm_broadcast(c, m->params, m->num_params, DT_FLOAT32, 0, NULL, err))) {
            dt_err_prefix(err, "DDP: broadcasting rank 0's parameters: ");
            goto fail;
        }
        if (m->num_buffers &&
            (rc = dt_comm_broadcast(c, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, err))) {
            dt_err_prefix(err, "DDP: broadcasting rank 0's buffers: ");
            goto fail;
        }
    }
    if ((rc = build_buckets(d, 0, err)))
        goto fail;
    d->rec_cap = 2 * m->num_tensors + 16;
    if (!(d->rec = calloc((size_t)d->rec_cap * 2, sizeof *d->rec))) {
        rc = dt_err_set(err, -ENOMEM, "DDP: out of memory");
        goto fail;
    }
    if ((rc = use_comm_memory(d, err)))
        goto fail;
    if (d->o.compress != DT_FLOAT32 && m->num_params && !d->comp) {
        dt_mem_cat old = dt_mem_tag(m->be, DT_MEM_COMM);
        rc = m->be->alloc(m->be, (void **)&d->comp, m->num_params * sizeof *d->comp, err);
        dt_mem_tag(m->be, old);
        if (rc) {
            dt_err_prefix(err, "DDP: the compressed gradients: ");
            goto fail;
        }
    }
    DT_DEBUG("DDP: %d ranks, %zu parameters in %d buckets (first %.2f MiB, cap %.1f MiB)%s%s",
             d->world, m->num_params, d->nb, d->o.first_bucket_mb, d->o.bucket_cap_mb,
             d->comp ? ", compressed to " : "", d->comp ? dt_dtype_name(d->o.compress) : "");
    *out = d;
    return 0;
fail:
    dt_ddp_free(d);
    return rc;
}

void dt_ddp_free(dt_ddp *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nb; i++)
        if (d->b && d->b[i].work)
            dt_comm_wait(d->c, d->b[i].work, NULL);
    if (d->scratch)
        d->m->be->free(d->m->be, d->scratch);
    if (d->own_grads) {
        memcpy(d->own_grads, d->m->grads, d->m->num_params * sizeof(float));
        d->m->grads = d->own_grads;
    }
    if (d->cmem) {
        dt_mem_external(d->m->be, DT_MEM_COMM, d->cmem_bytes, false);
        dt_comm_mem_free(d->c, d->cmem);
    }
    else if (d->comp)
        d->m->be->free(d->m->be, d->comp);
    free(d->rec);
    free(d->b);
    free(d);
}
