/* ddp.c - the DistributedDataParallel reducer; see ddp.h.
 *
 * Buckets are built once, from the tensor table, walking it backwards (backward finishes the
 * last layers first): the first bucket is closed at first_bucket_mb, the others at
 * bucket_cap_mb, always on a tensor boundary. Each bucket counts the gradient elements reported
 * final in its range; when the count reaches its size it is ready, and ready buckets are launched
 * strictly in bucket order. Small control-plane collectives (consistency check, metrics
 * averages) go through a scratch buffer of backend memory, so they work on any backend.
 */
#include "runtime/train/parallel/dpsync/ddp.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/obs/trace.h"
#include "runtime/train/parallel/dpsync/lowbit.h"

#define MIB (1024.0 * 1024.0)
#define MSG_BYTES 256 /* per-rank consistency message */
#define DT_DDP_MAX_RANKS_SUM 64 /* dt_ddp_sum_double: ranks gathered on the stack */

typedef struct bucket {
    size_t lo, hi;        /* [lo, hi) of the flat gradient buffer, in elements */
    size_t ready;         /* elements reported final in this backward */
    bool launched;
    bool reduced;         /* lowbit: its shard was reduced and its all-gather launched */
    bool released;        /* release: its memory was given back in this backward */
    dt_comm_work *work;   /* in flight, owned until waited */
    uint64_t trace_t0;    /* train.trace: when its collective was launched (0: not traced) */
    size_t chunk;         /* shard: elements per rank, ceil((hi - lo) / world) */
    size_t at;            /* shard: where this rank's chunk starts in the shard layout */
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
    size_t cmem_bytes;    /* its size, charged to the backend's cmem_cat */
    dt_mem_cat cmem_cat;  /* DT_MEM_GRADS when it holds the gradients, else DT_MEM_COMM */
    float *own_grads;     /* the model's gradient buffer while m->grads points at cmem (its
                             memory given back meanwhile) */
    float *scratch;       /* (scratch_n) backend memory for small collectives, owned */
    size_t scratch_n;
    int rc;               /* first error met in the hook */
    dt_err err;
    /* The ready order of the first synchronised backward, for the bucket rebuild. */
    bool rebuilt;         /* the rebuild happened (or was declined); no more recording */
    size_t *rec;          /* (rec_cap) pairs (offset, numel) in report order */
    int rec_n, rec_cap;   /* pairs recorded; rec_n > rec_cap means overflowed */
    /* Sharding (ddp.h, "Sharding"). */
    int rank;
    dt_optim_range *ranges; /* (nb) this rank's range of each bucket, owned */
    size_t shard_n;       /* elements of the shard layout */
    float *sg;            /* (shard_n) backend memory: the averaged shard, owned */
    uint16_t *sg16;       /* (shard_n) compress: the 16-bit shard received, owned */
    size_t pending_split; /* shard: the rebuild's split, waiting for dt_ddp_relayout (0: none) */
    /* Giving gradient memory back (opts.release, ddp.h "Sharding"). */
    size_t granule;       /* dt_mem_granule of m->grads; 0: nothing is given back */
    size_t granule_p;     /* dt_mem_granule of comp (compress); 0: its memory stays */
    unsigned char *fresh; /* (num_blocks) block b's gradients are to be committed and zeroed
                             at its next BEFORE_BACKWARD: the buffer was given back (or holds
                             the last step's) since its last backward window */
    size_t res_g, res_p;  /* bytes of m->grads and of comp resident, as the allocator's
                             statistics count them (every release and commit is measured) */
    dt_lowbit *q;         /* opts.lowbit: the low-bit all-reduce, owned */
    bool q_on;            /* the buckets of this sync go through it (dt_ddp_set_lowbit) */
    size_t q_bytes;       /* its host memory, charged to DT_MEM_COMM */
    bool counting;        /* this sync's first collective was issued: sent0 holds the count */
    uint64_t sent0;       /* the communicator's sent_bytes before it */
    dt_ddp_stats st;
};

void dt_ddp_opts_default(dt_ddp_opts *o)
{
    o->bucket_cap_mb = 25;
    o->first_bucket_mb = 1;
    o->compress = DT_FLOAT32;
    o->broadcast_buffers = true;
    o->check_consistency = true;
    o->shard = false;
    o->release = false;
    o->lowbit = 0;
    o->lowbit_warmup = 0;
    o->lowbit_stochastic = false;
    o->lowbit_seed = 0;
}

int dt_ddp_opts_from_job(dt_ddp_opts *o, const dt_job *job, dt_err *err)
{
    dt_ddp_opts_default(o);
    o->bucket_cap_mb = job->bucket_cap_mb;
    o->first_bucket_mb = job->first_bucket_mb;
    o->broadcast_buffers = job->broadcast_buffers;
    o->check_consistency = job->check_consistency;
    o->lowbit_warmup = job->compress_warmup_steps;
    o->lowbit_stochastic = job->compress_stochastic;
    o->lowbit_seed = (uint64_t)job->seed;
    if (job->compress == DT_COMPRESS_NONE || job->compress == DT_COMPRESS_INT8 ||
        job->compress == DT_COMPRESS_1BIT)
        o->compress = DT_FLOAT32;
    else if (job->compress == DT_COMPRESS_BF16)
        o->compress = DT_BFLOAT16;
    else if (job->compress == DT_COMPRESS_FP16)
        o->compress = DT_FLOAT16;
    else
        return dt_err_set(err, -EINVAL, "ddp.compress = %d: use none, bf16, fp16, int8 or 1bit",
                          (int)job->compress);
    o->lowbit = job->compress == DT_COMPRESS_INT8   ? DT_LOWBIT_INT8
                : job->compress == DT_COMPRESS_1BIT ? DT_LOWBIT_1BIT
                                                    : 0;
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
    if (d->o.shard) { /* the shards move only when the caller says so: dt_ddp_relayout */
        d->pending_split = (size_t)split;
        return 0;
    }
    int before = d->nb;
    if ((rc = build_buckets(d, (size_t)split, err)))
        return rc;
    d->st.rebuilt = true;
    DT_DEBUG("DDP: buckets rebuilt from the ready order: %d buckets (%d before), the last one "
             "[0, %llu)", d->nb, before, (unsigned long long)split);
    return 0;
}

/* The timeline (trace.h): bucket i's collective from its launch to done_ns, when the
 * communicator saw it complete (dt_comm_wait_done), on the "ddp buckets" lanes (buckets in
 * flight together overlap). */
static void trace_bucket(dt_ddp *d, int i, const char *what, uint64_t done_ns)
{
    bucket *b = &d->b[i];
    if (!b->trace_t0)
        return;
    size_t n = d->o.shard ? b->chunk * (size_t)d->world : b->hi - b->lo;
    size_t bytes = n * (d->comp && strcmp(what, "all-gather") ? sizeof(uint16_t) : sizeof(float));
    dt_trace_end_async_at(b->trace_t0, done_ns, "ddp buckets", DT_TRACE_COMM, what, "bucket", i,
                          "bytes", (int64_t)bytes);
    b->trace_t0 = 0;
}

static int take_back(dt_ddp *d, void *base, size_t a, size_t e, size_t *res);

static uint64_t sent_now(const dt_ddp *d)
{
    dt_comm_stats cs;
    dt_comm_stats_get(d->c, &cs);
    return cs.sent_bytes;
}

/* comm_bytes: the count starts before a sync's first collective (dt_ddp_stats). */
static void start_count(dt_ddp *d)
{
    if (!d->counting) {
        d->sent0 = sent_now(d);
        d->counting = true;
    }
}

static void launch(dt_ddp *d, int i)
{
    bucket *b = &d->b[i];
    size_t n = b->hi - b->lo;
    b->launched = true;
    if (d->rc)
        return;
    start_count(d);
    b->trace_t0 = dt_trace_begin();
    int rc;
    if (d->q_on) {
        /* this bucket's chunks go out; the one before it, whose chunks have had a bucket's
         * backward to arrive, is reduced and all-gathered */
        b->trace_t0 = 0;
        if ((rc = dt_lowbit_send(d->q, i, d->m->grads, &d->err)) == 0 && i > 0 &&
            !d->b[i - 1].reduced) {
            d->b[i - 1].reduced = true;
            rc = dt_lowbit_reduce(d->q, i - 1, &d->err);
        }
    } else if (d->o.shard && d->comp) {
        dt_backend *be = d->m->be;
        /* release: the bucket's payloads went back with the last step's */
        if (d->o.release &&
            take_back(d, d->comp, b->lo * sizeof *d->comp, b->hi * sizeof *d->comp, &d->res_p)) {
            b->trace_t0 = 0;
            return;
        }
        be->to_half(be, d->comp + b->lo, d->m->grads + b->lo, n, 1.0f / (float)d->world,
                    d->o.compress == DT_BFLOAT16);
        rc = dt_comm_reduce_scatter(d->c, d->comp + b->lo, d->sg16 + b->at, b->chunk,
                                    d->o.compress, DT_SUM, &b->work, &d->err);
    } else if (d->o.shard) {
        rc = dt_comm_reduce_scatter(d->c, d->m->grads + b->lo, d->sg + b->at, b->chunk,
                                    DT_FLOAT32, DT_AVG, &b->work, &d->err);
    } else if (d->comp) {
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
        b->trace_t0 = 0;
    }
}

/* ---- giving gradient memory back (opts.release) ------------------------------------------- */

/* What the buffers hold, as the allocator's statistics count it: the 16-bit payloads' resident
 * bytes go to st.payload_bytes (with the 16-bit shard), m->grads' to st.grads_resident, and
 * their sum to the peak since the last dt_ddp_release_grads. Resident bytes only grow at a
 * commit, so seeing them after each commit sees the peak. */
static void note_resident(dt_ddp *d)
{
    d->st.grads_resident = d->res_g;
    d->st.payload_bytes = d->res_p + (d->sg16 ? d->shard_n * sizeof *d->sg16 : 0);
    if (d->res_g + d->res_p > d->st.grads_resident_peak)
        d->st.grads_resident_peak = d->res_g + d->res_p;
}

/* The allocator's resident bytes now (all categories: what one release or commit changes). */
static size_t total_now(dt_backend *be)
{
    dt_mem_stats s;
    dt_mem_read(be, &s);
    return s.total;
}

/* Gives back the granules (g bytes, counted from addresses that are multiples of g) lying
 * wholly inside bytes [a, e) of the allocation base of `size` bytes (m->grads or comp) through
 * the backend, with up: [a, e rounded up to the granule) (what lies above e must be dead too);
 * *res goes down by what the allocator says went back (nothing where g is 0). The range's data
 * must be dead: nothing reads it before the next commit, which gives undefined contents. */
static void give_back(dt_ddp *d, void *base, size_t size, size_t g, size_t a, size_t e, bool up,
                      size_t *res)
{
    dt_backend *be = d->m->be;
    if (g && up) {
        uintptr_t end = ((uintptr_t)base + e + g - 1) / g * g;
        e = DT_MIN(size, (size_t)(end - (uintptr_t)base));
    }
    if (!g || e <= a || !be->mem_release)
        return;
    size_t before = total_now(be);
    be->mem_release(be, base, a, e - a);
    size_t after = total_now(be), n = before > after ? before - after : 0;
    *res -= DT_MIN(n, *res);
}

/* Makes bytes [a, e) of the allocation base usable again (what was given back comes back with
 * undefined contents; the rest keeps its own); *res goes up by what the allocator took back.
 * An error is kept for dt_ddp_finish. */
static int take_back(dt_ddp *d, void *base, size_t a, size_t e, size_t *res)
{
    dt_backend *be = d->m->be;
    if (!d->granule || e <= a || !be->mem_commit)
        return 0;
    size_t before = total_now(be);
    dt_err err = {0};
    int rc = be->mem_commit(be, base, a, e - a, &err);
    size_t after = total_now(be);
    *res += after > before ? after - before : 0;
    if (rc && !d->rc) {
        d->rc = rc;
        d->err = err;
        dt_err_prefix(&d->err, "ZeRO-2: committing gradient memory: ");
    }
    note_resident(d);
    return rc;
}

/* Gives back elements [lo, hi) of m->grads, and of the 16-bit payloads when compressing (up:
 * and the rest of the granule holding element hi, dead as well). */
static void release_range(dt_ddp *d, size_t lo, size_t hi, bool up)
{
    size_t n = d->m->num_params;
    give_back(d, d->m->grads, n * sizeof(float), d->granule, lo * sizeof(float),
              hi * sizeof(float), up, &d->res_g);
    if (d->comp)
        give_back(d, d->comp, n * sizeof *d->comp, d->granule_p, lo * sizeof *d->comp,
                  hi * sizeof *d->comp, up, &d->res_p);
    note_resident(d);
}

/* Everything goes back (nothing is in flight): every block's gradients are committed and zeroed
 * again at its next backward window. Without blocks (a model that emits no block events) the
 * buffer is never given back (granule 0) and is zeroed here instead, as a whole. */
static void release_all(dt_ddp *d)
{
    dt_model *m = d->m;
    release_range(d, 0, m->num_params, false);
    if (m->num_blocks > 0)
        memset(d->fresh, 1, (size_t)m->num_blocks);
    else
        m->be->memset_zero(m->be, m->grads, m->num_params * sizeof(float));
}

/* The model's block hook (model.h): before a block's first backward window since its memory
 * went back, its gradient range is committed and zeroed, exactly that range (the blocks around
 * it may hold live gradients in the granules it shares with them). Its later windows of the
 * same step (gpt's tied embedding, the micro-steps of an accumulation) accumulate into it as it
 * is: nothing gives back a block's granules before its gradients are final. */
static void block_hook(void *ctx, int k, dt_block_event ev)
{
    dt_ddp *d = ctx;
    dt_model *m = d->m;
    if (ev != DT_BLOCK_BEFORE_BACKWARD || k < 0 || k >= m->num_blocks || !d->fresh[k])
        return;
    const dt_block *b = &m->blocks[k];
    if (take_back(d, m->grads, b->offset * sizeof(float), (b->offset + b->numel) * sizeof(float),
                  &d->res_g) == 0)
        m->be->memset_zero(m->be, m->grads + b->offset, b->numel * sizeof(float));
    d->fresh[k] = 0;
}

/* Elements bucket i's padded reduce-scatter reads past its end, in the bucket above. */
static size_t overhang(const dt_ddp *d, int i)
{
    const bucket *b = &d->b[i];
    return b->chunk * (size_t)d->world - (b->hi - b->lo);
}

/* Waits for bucket i (launched) and, with release, gives its memory back. Buckets are settled in
 * bucket order, so every bucket above (0 .. i - 1) is settled already and its data dead: the
 * granule that bucket i shares with the one above goes back with bucket i (so does what bucket
 * i's padded read reached there); the elements of bucket i that the bucket below (i + 1,
 * possibly in flight) reaches stay until it is settled, or until dt_ddp_finish gives
 * everything back. An error is kept for dt_ddp_finish. */
static void settle(dt_ddp *d, int i)
{
    bucket *b = &d->b[i];
    if (b->work) {
        dt_err e = {0};
        uint64_t done = 0;
        int rc = dt_comm_wait_done(d->c, b->work, &done, &e);
        b->work = NULL;
        if (!rc)
            trace_bucket(d, i, d->o.shard ? "reduce-scatter" : "all-reduce", done);
        if (rc && !d->rc) {
            d->rc = rc;
            d->err = e;
        }
    }
    if (d->o.release && !b->released && !d->rc) {
        size_t below = i + 1 < d->nb ? overhang(d, i + 1) : 0;
        DT_DEBUG("ZeRO-2: bucket %d [%zu, %zu) reduced: %zu bytes of gradients resident before "
                 "it is given back", i, b->lo, b->hi, d->res_g + d->res_p);
        release_range(d, DT_MIN(b->lo + below, b->hi), b->hi + overhang(d, i), true);
        b->released = true;
    }
}

void dt_ddp_release_grads(dt_ddp *d)
{
    if (!d->o.release)
        return;
    release_all(d);
    d->st.grads_resident_peak = 0; /* a new accumulation */
    note_resident(d);
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
        /* release: the bucket two before the one just launched is (nearly always) reduced by
         * now; wait for it and give its pages back, so about two buckets are held in flight */
        if (d->o.release && d->next >= 3)
            settle(d, d->next - 3);
    }
}

/* Bucket i's shard is reduced: widen it (compress) and zero the padding past this rank's
 * range, which holds sums of the bucket above (see "Sharding"). */
static void finish_shard(dt_ddp *d, int i)
{
    dt_backend *be = d->m->be;
    const bucket *b = &d->b[i];
    const dt_optim_range *r = &d->ranges[i];
    if (d->comp)
        be->from_half(be, d->sg + b->at, d->sg16 + b->at, b->chunk, 1.0f,
                      d->o.compress == DT_BFLOAT16);
    if (r->n < b->chunk)
        be->memset_zero(be, d->sg + b->at + r->n, (b->chunk - r->n) * sizeof(float));
}

/* dt_ddp_finish's low-bit part: every bucket reduced (in bucket order), then received into
 * m->grads. Returns rc, or the first error. */
static int lowbit_finish(dt_ddp *d, int rc, dt_err *err)
{
    for (int i = 0; i < d->nb && !rc; i++)
        if (!d->b[i].reduced) {
            d->b[i].reduced = true;
            rc = dt_lowbit_reduce(d->q, i, err);
        }
    for (int i = 0; i < d->nb && !rc; i++)
        rc = dt_lowbit_recv(d->q, i, d->m->grads, err);
    if (!rc)
        d->st.lowbit_syncs++;
    return rc;
}

void dt_ddp_set_lowbit(dt_ddp *d, bool on, int64_t step)
{
    d->q_on = d->q && on;
    if (d->q)
        dt_lowbit_set_step(d->q, (uint64_t)step);
}

struct dt_lowbit *dt_ddp_lowbit(dt_ddp *d) { return d->q; }

/* The low-bit all-reduce over the buckets (static under it: see dt_ddp_create). */
static int plan_lowbit(dt_ddp *d, dt_err *err)
{
    size_t *lo = calloc((size_t)d->nb + 1, sizeof *lo), *hi = calloc((size_t)d->nb + 1, sizeof *hi);
    int rc = lo && hi ? 0 : dt_err_set(err, -ENOMEM, "DDP: out of memory");
    for (int i = 0; !rc && i < d->nb; i++)
        lo[i] = d->b[i].lo, hi[i] = d->b[i].hi;
    if (!rc)
        rc = dt_lowbit_plan(d->q, lo, hi, d->nb, err);
    free(lo);
    free(hi);
    if (!rc) {
        d->q_bytes = dt_lowbit_bytes(d->q);
        dt_mem_external(d->m->be, DT_MEM_COMM, d->q_bytes, true);
    }
    return rc;
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
    if (d->q_on) /* the low-bit stages left: reduce what is not, then decompress every bucket */
        rc = lowbit_finish(d, rc, err);
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        b->reduced = false;
        if (b->work) {
            dt_err e = {0};
            uint64_t done = 0;
            int wrc = dt_comm_wait_done(d->c, b->work, &done, &e);
            b->work = NULL;
            if (!wrc)
                trace_bucket(d, i, d->o.shard ? "reduce-scatter" : "all-reduce", done);
            if (wrc && !rc) {
                rc = wrc;
                if (err)
                    *err = e;
            }
        }
        b->trace_t0 = 0;
        if (!rc && d->o.shard)
            finish_shard(d, i);
        else if (!rc && d->comp)
            d->m->be->from_half(d->m->be, d->m->grads + b->lo, d->comp + b->lo, b->hi - b->lo,
                                1.0f, d->o.compress == DT_BFLOAT16);
        b->ready = 0;
        b->launched = false;
        b->released = false;
    }
    if (!rc && d->o.release)
        release_all(d); /* the shards hold what is needed: the buffers are dead until the next
                           backward */
    if (!rc) { /* every bucket waited for: what they sent is counted */
        start_count(d); /* (a model without parameters launched nothing) */
        d->st.comm_bytes = sent_now(d) - d->sent0;
        d->st.comm_bytes_total += d->st.comm_bytes;
    }
    d->counting = false;
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

/* ---- sharding ------------------------------------------------------------------------------ */

void dt_ddp_shard_ranges(const dt_ddp *d, const dt_optim_range **ranges, int *n, size_t *numel)
{
    *ranges = d->ranges;
    *n = d->ranges ? d->nb : 0;
    *numel = d->shard_n;
}

float *dt_ddp_shard_grads(dt_ddp *d) { return d->sg; }

int dt_ddp_gather_params(dt_ddp *d, dt_err *err)
{
    float *p = d->m->params;
    int rc = 0;
    /* from the end of the buffer: a chunk's padding reads and writes the bucket above, which
     * every rank holds alike once its own gather is done (collectives run in issue order) */
    for (int i = 0; i < d->nb && !rc; i++) {
        bucket *b = &d->b[i];
        b->trace_t0 = dt_trace_begin();
        rc = dt_comm_allgather(d->c, p + b->lo + (size_t)d->rank * b->chunk, p + b->lo, b->chunk,
                               DT_FLOAT32, &b->work, err);
        if (rc)
            b->work = NULL;
    }
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (b->work) {
            dt_err e = {0};
            uint64_t done = 0;
            int wrc = dt_comm_wait_done(d->c, b->work, &done, &e);
            b->work = NULL;
            if (!wrc)
                trace_bucket(d, i, "all-gather", done);
            if (wrc && !rc) {
                rc = wrc;
                if (err)
                    *err = e;
            }
        }
    }
    return rc;
}

void dt_ddp_slice_shard(dt_ddp *d, const float *full, float *shard)
{
    dt_backend *be = d->m->be;
    be->memset_zero(be, shard, d->shard_n * sizeof(float));
    for (int i = 0; i < d->nb; i++) {
        const dt_optim_range *r = &d->ranges[i];
        if (r->n)
            be->memcpy_d2d(be, shard + r->at, full + r->off, r->n * sizeof(float));
    }
}

int dt_ddp_sum_double(dt_ddp *d, double v, double *sum, dt_err *err)
{
    if (d->world == 1) {
        *sum = v;
        return 0;
    }
    double all[DT_DDP_MAX_RANKS_SUM];
    double *vals = d->world <= DT_DDP_MAX_RANKS_SUM ? all : malloc(sizeof(double) * (size_t)d->world);
    if (!vals)
        return dt_err_set(err, -ENOMEM, "out of memory");
    /* the bytes of each rank's double, gathered bit for bit and added in rank order */
    int rc = ensure_scratch(d, 2 + 2 * (size_t)d->world, err); /* floats: (1 + world) doubles */
    if (!rc)
        rc = small_allgather(d, &v, vals, sizeof v, err);
    if (!rc) {
        double s = 0;
        for (int r = 0; r < d->world; r++)
            s += vals[r];
        *sum = s;
    }
    if (vals != all)
        free(vals);
    return rc;
}

static int build_shards(dt_ddp *d, dt_err *err);

bool dt_ddp_relayout_pending(const dt_ddp *d) { return d->pending_split > 0; }

int dt_ddp_relayout(dt_ddp *d, dt_err *err)
{
    dt_backend *be = d->m->be;
    int before = d->nb, rc;
    size_t split = d->pending_split;
    d->pending_split = 0;
    if (!split)
        return 0;
    if ((rc = build_buckets(d, split, err)) || (rc = build_shards(d, err)))
        return rc;
    be->free(be, d->sg);
    d->sg = NULL;
    if (d->sg16)
        be->free(be, d->sg16);
    d->sg16 = NULL;
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_GRADS); /* the shard is the stage's gradients */
    if (!(rc = be->alloc(be, (void **)&d->sg, d->shard_n * sizeof(float), err)) &&
        d->o.compress != DT_FLOAT32) {
        dt_mem_tag(be, DT_MEM_COMM);
        rc = be->alloc(be, (void **)&d->sg16, d->shard_n * sizeof *d->sg16, err);
    }
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "ZeRO: the gradient shard: ");
    if (!d->o.release)
        d->st.payload_bytes = (d->comp ? d->m->num_params * sizeof *d->comp : 0) +
                              (d->sg16 ? d->shard_n * sizeof *d->sg16 : 0);
    else
        note_resident(d);
    d->st.rebuilt = true;
    DT_DEBUG("ZeRO: buckets rebuilt from the ready order: %d buckets (%d before), the last one "
             "[0, %zu); this rank's shard now %zu elements", d->nb, before, split, d->shard_n);
    return 0;
}

/* The shard layout: bucket 0 (the end of the buffer) cut to a multiple of the world size so that
 * no padded read leaves the buffer (what it leaves goes to the bucket below, or to a new last
 * bucket), then each bucket's chunk and this rank's range. */
static int build_shards(dt_ddp *d, dt_err *err)
{
    const size_t N = (size_t)d->world;
    if (d->m->num_params < N)
        return dt_err_set(err, -EINVAL, "ZeRO: %zu parameters cannot be sharded over %d ranks",
                          d->m->num_params, d->world);
    if (d->nb > 0) {
        bucket *b0 = &d->b[0];
        size_t n0 = b0->hi - b0->lo, rem = n0 % N;
        if (rem && n0 > rem) {
            if (d->nb > 1) {
                d->b[1].hi += rem;
            } else {
                d->b[1] = (bucket){.lo = b0->lo, .hi = b0->lo + rem};
                d->nb = 2;
            }
            b0->lo += rem;
        } else if (rem) { /* smaller than N: it joins the bucket below (there is one: n >= N) */
            d->b[1].hi = b0->hi;
            memmove(d->b, d->b + 1, sizeof *d->b * (size_t)(d->nb - 1));
            d->nb--;
        }
    }
    free(d->ranges);
    if (!(d->ranges = calloc((size_t)d->nb + 1, sizeof *d->ranges)))
        return dt_err_set(err, -ENOMEM, "ZeRO: out of memory");
    size_t at = 0;
    d->st.largest_bucket = 0;
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        size_t n = b->hi - b->lo, c = (n + N - 1) / N, mine = (size_t)d->rank * c;
        b->chunk = c;
        b->at = at;
        d->ranges[i] = (dt_optim_range){.off = b->lo + DT_MIN(mine, n),
                                        .n = mine < n ? DT_MIN(c, n - mine) : 0,
                                        .at = at};
        at += c;
        d->st.largest_bucket = DT_MAX(d->st.largest_bucket, n);
    }
    d->st.num_buckets = d->nb;
    d->shard_n = at;
    d->st.shard_numel = at;
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

/* Moves what the buckets all-reduce (the gradients, or the 16-bit payloads) into communicator
 * memory, where the transport reads the peers' copies directly. Host memory only: the nccl
 * backend has none (-ENOTSUP), and device gradients stay where they are. When the gradients
 * move (fp32), the model's own buffer is given back (mem_release) until dt_ddp_free returns
 * them there, and the communicator memory is charged as gradients: one copy, as PyTorch's
 * gradient_as_bucket_view, not two. */
static int use_comm_memory(dt_ddp *d, dt_err *err)
{
    dt_model *m = d->m;
    if (d->world == 1 || !m->num_params || !m->be->host_memory)
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
    if (d->o.compress != DT_FLOAT32) {
        d->cmem_cat = DT_MEM_COMM;
        d->comp = d->cmem;
    } else {
        d->cmem_cat = DT_MEM_GRADS;
        memcpy(d->cmem, m->grads, bytes);
        d->own_grads = dt_model_lend_grads(m, d->cmem);
        m->be->mem_release(m->be, d->own_grads, 0, bytes);
    }
    dt_mem_external(m->be, d->cmem_cat, bytes, true);
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
    d->rank = dt_comm_rank(c);
    d->o.release = d->o.release && d->o.shard;
    if (d->o.bucket_cap_mb <= 0 || d->o.first_bucket_mb <= 0) {
        rc = dt_err_set(err, -EINVAL, "DDP: bucket sizes must be positive (bucket_cap_mb %g, "
                        "first_bucket_mb %g)", d->o.bucket_cap_mb, d->o.first_bucket_mb);
        goto fail;
    }
    if (d->o.lowbit && (d->o.shard || !m->be->host_memory)) {
        rc = dt_err_set(err, -EINVAL, "ddp.compress = %s: %s", d->o.lowbit == DT_LOWBIT_INT8 ?
                        "int8" : "1bit", d->o.shard ? "not with parallel.zero 1 or 2 (the "
                        "low-bit all-reduce is DDP's; use parallel.zero = 0, or ddp.compress = "
                        "bf16 with ZeRO)" : "runs on job.device = cpu only (its quantisers are "
                        "the CPU reference; use ddp.compress = bf16 on cuda)");
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
    if (d->o.lowbit) {
        if ((rc = dt_lowbit_create(&d->q, (dt_lowbit_kind)d->o.lowbit, c, m->num_params, err)) ||
            (rc = plan_lowbit(d, err)))
            goto fail;
        if (d->o.lowbit_stochastic &&
            (rc = dt_lowbit_set_stochastic(d->q, d->o.lowbit_seed, err)))
            goto fail;
        d->q_on = true;
        /* The quantisation's blocks are counted from the buckets' chunks, so the buckets fix
         * the bits: a rebuild after the first backward would give a resumed job (static buckets
         * in its first step) other bits than one that ran through. The buckets stay static. */
        d->rebuilt = true;
    }
    if (d->o.shard) {
        if ((rc = build_shards(d, err)))
            goto fail;
        dt_mem_cat old = dt_mem_tag(m->be, DT_MEM_GRADS); /* the shard is the stage's grads */
        if (!(rc = m->be->alloc(m->be, (void **)&d->sg, d->shard_n * sizeof(float), err)) &&
            d->o.compress != DT_FLOAT32) {
            dt_mem_tag(m->be, DT_MEM_COMM);
            rc = m->be->alloc(m->be, (void **)&d->sg16, d->shard_n * sizeof *d->sg16, err);
        }
        dt_mem_tag(m->be, old);
        if (rc) {
            dt_err_prefix(err, "ZeRO: the gradient shard: ");
            goto fail;
        }
    }
    d->rec_cap = 2 * m->num_tensors + 16;
    if (!(d->rec = calloc((size_t)d->rec_cap * 2, sizeof *d->rec))) {
        rc = dt_err_set(err, -ENOMEM, "DDP: out of memory");
        goto fail;
    }
    /* sharding reduce-scatters through the staging slices: communicator memory buys nothing */
    if (!d->o.shard && (rc = use_comm_memory(d, err)))
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
    if (d->o.shard && !d->o.release)
        d->st.payload_bytes = (d->comp ? m->num_params * sizeof *d->comp : 0) +
                              (d->sg16 ? d->shard_n * sizeof *d->sg16 : 0);
    if (d->o.release) {
        /* the block hook commits and zeroes a block's gradients before its backward writes
         * them; without blocks (no events) nothing is given back (release_all) */
        d->granule = m->num_blocks > 0 ? dt_mem_granule(m->be, m->grads) : 0;
        d->granule_p = d->granule && d->comp ? dt_mem_granule(m->be, d->comp) : 0;
        d->res_g = m->num_params * sizeof(float); /* alloc charged them whole */
        d->res_p = d->comp ? m->num_params * sizeof *d->comp : 0;
        if (m->num_blocks > 0 && !(d->fresh = calloc((size_t)m->num_blocks, 1))) {
            rc = dt_err_set(err, -ENOMEM, "ZeRO: out of memory");
            goto fail;
        }
        if (m->num_blocks > 0)
            dt_model_set_block_hook(m, block_hook, d);
        release_all(d);
        d->st.grads_resident_peak = 0;
        note_resident(d);
        DT_DEBUG("ZeRO-2: gradient memory given back in granules of %zu bytes, 16-bit payloads "
                 "in granules of %zu (0: none)", d->granule, d->granule_p);
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
    dt_lowbit_free(d->q);
    if (d->q_bytes)
        dt_mem_external(d->m->be, DT_MEM_COMM, d->q_bytes, false);
    if (d->own_grads) {
        size_t bytes = d->m->num_params * sizeof(float);
        dt_err err = {0};
        if (d->m->be->mem_commit(d->m->be, d->own_grads, 0, bytes, &err) == 0)
            memcpy(d->own_grads, d->m->grads, bytes);
        else /* the gradients are lost with the communicator memory: the caller rebuilds */
            DT_WARN("DDP: taking the model's gradient buffer back: %s", err.msg);
        dt_model_lend_grads(d->m, NULL);
    }
    if (d->cmem) {
        dt_mem_external(d->m->be, d->cmem_cat, d->cmem_bytes, false);
        dt_comm_mem_free(d->c, d->cmem);
    }
    else if (d->comp)
        d->m->be->free(d->m->be, d->comp);
    if (d->sg)
        d->m->be->free(d->m->be, d->sg);
    if (d->sg16)
        d->m->be->free(d->m->be, d->sg16);
    if (d->m->block_hook == block_hook && d->m->block_hook_ctx == d)
        dt_model_set_block_hook(d->m, NULL, NULL);
    free(d->fresh);
    free(d->ranges);
    free(d->rec);
    free(d->b);
    free(d);
}
