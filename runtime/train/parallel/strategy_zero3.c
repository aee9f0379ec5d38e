/* strategy_zero3.c - ZeRO stage 3 (FSDP full-shard) on any backend (cpu, cuda); see
 * strategy_zero.h ("Stage 3") and strategy_zero3.h.
 *
 * Layout: buckets = the model's blocks (model.h). Block k = [lo, lo + n) is cut into N chunks of
 * c = ceil(n / N) elements; rank r owns [lo + r*c, min(lo + (r+1)*c, lo + n)). The rank's chunks
 * of every block, packed in block order (at_k = sum of the earlier c_j), are its shard layout:
 *   ps  (shard_n) the rank's parameters, persistent;
 *   sg  (shard_n) the rank's averaged gradients after sync_grads;
 *   the optimiser's state (shard_n each), over a tensor table of the shard layout (the parts of
 *   the model's tensors this rank owns, and the padding as tensors of their own), so it updates
 *   ps in place with each tensor's no_decay as a whole optimiser would.
 * The model's flat parameter buffer holds a block only inside a window (model.h's block hook):
 * BEFORE gathers the block's chunks into `stg` (N*c, the padded block, always resident),
 * commits the block's range of the flat buffer and copies the n elements there; AFTER gives
 * the range back, unless the next window is the same block's (gpt's head: the last forward
 * window and the first backward one). The order of windows is recorded on the first forward and
 * the first backward; from then on, at each BEFORE the next window's block is gathered into stg
 * asynchronously (one prefetch in flight), and waited for at its BEFORE. So about two blocks of
 * parameters are resident: the one computed and the one prefetched.
 * Gradients: at a block's first BEFORE_BACKWARD of a step its range of the flat gradient buffer
 * is committed and zeroed (memset_zero of exactly [lo, lo + n)); later windows and micro-steps
 * accumulate there. At its last AFTER_BACKWARD of the last micro-step (its gradients final) the
 * range is copied into one of two padded send buffers (16-bit with ddp.compress, pre-divided by
 * N), given back, and the send buffer reduce-scattered (averaged) into sg asynchronously; a send
 * buffer is waited for before it is reused, the rest in sync_grads. With train.grad_accum = k the
 * earlier micro-steps accumulate into the flat gradient buffer as DDP's no_sync does (a block's
 * range stays committed from its first backward window to its scatter), so during an
 * accumulation the whole gradient buffer is resident, as at stage 2.
 *
 * Memory given back (backend_ops.h, "mem_release / mem_commit / mem_granule"). The unit is the
 * backend's granule g = dt_mem_granule(be, base) (cpu: the page, or DTRAIN_CPU_MEM_GRANULE; cuda:
 * 2 MiB with virtual memory, or 0). The strict contract is kept: a released granule is never
 * touched until committed again, a commit's contents are undefined, and nothing here relies on
 * memory reading as zero. So:
 *   - every write into the flat buffers is preceded by a commit of its range (bring_in before
 *     the copy from stg; grad_begin before a backward accumulates);
 *   - zeros are written (be->memset_zero) exactly where zeros are needed: a block's gradient
 *     range at its first backward window of a step, the padding of send buffers and shards;
 *   - a release covers the block's range rounded out to whole granules where the neighbouring
 *     blocks sharing an edge granule are not in use (parameters: not gathered; gradients: not
 *     accumulating), so edge granules go back too once both sides are done with them;
 *   - the host never touches backend memory: the initial parameters go to the checkpoint
 *     staging (strategy.h's dt_strategy_staging: backend memory, resident from open to start
 *     and from a gather_state to the next step, given back between) by be->memcpy_d2d, and
 *     every collective runs on backend memory (stg, ps, sg, the staging, the send buffers,
 *     dscratch); a gather_state commits the staging before it writes every element of it.
 * With g = 0 (an allocation that cannot give memory back) nothing is released and commits are
 * no-ops: the flat buffers stay resident and the figures (allocator's categories) say so.
 *
 * Ordering on cuda. Compute ops (copies, memsets, kernels) run in issue order on the backend's
 * stream. A collective runs on the comm stream after an event recorded on the compute stream,
 * so it sees every compute op issued before it (the copy out of stg into the flat buffer, the
 * optimiser's update of ps, the copy into a send buffer), and dt_comm_wait blocks the host until
 * it completed, so compute issued after a wait sees its result (stg after a gather, sg after a
 * reduce-scatter). Hence the prefetch: the gather of block k+1 into stg is issued at block k's
 * BEFORE, after the copy stg -> flat of block k was issued (the event orders the gather after
 * that copy: the gather does not overwrite stg under it), and its destination stg is a
 * persistent allocation, resident from open to free: nothing needs committing before it is
 * issued. The flat range of block k+1 is committed (synchronously, on the host) only at its
 * BEFORE, after the gather was waited for and before the copy into it is issued. A release is
 * ordered by the backend after the device work already issued (the contract), so a block's
 * kernels and its copy to a send buffer finish before its granules go; a commit maps memory
 * before it returns, so the memset or copy issued after it finds it there. An edge granule is
 * released by one block's AFTER and committed by the next block's BEFORE right away, so a
 * backend that defers a release until the device is done must let a commit of the same granule
 * wait for (or cancel) it, never unmap what the commit just mapped.
 * A window that follows a failure (a collective's error is kept and returned after the pass:
 * a hook cannot stop the model) still commits its ranges, so it computes on undefined contents
 * instead of touching released memory.
 *
 * The file has two parts: dt_zero3 (strategy_zero.h), the above over a group c of N ranks for a
 * strategy's s->model, and the zero strategy at stage 3, that piece over the world. The tensor
 * strategy holds one over its data-parallel group (its model is then the rank's slices), the
 * pipeline strategy over its stage's data-parallel group.
 */
#include "runtime/train/parallel/strategy_zero3.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/parallel/ddp.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"
#include "runtime/train/ckpt/xxh64.h"

typedef struct z3_block {
    size_t lo, n;   /* the block's range of the flat buffers */
    size_t c;       /* chunk: ceil(n / N) */
    size_t at;      /* where this rank's chunk starts in the shard layout */
    size_t off, mn; /* this rank's part: [off, off + mn) of the flat buffer (mn may be < c) */
} z3_block;

typedef struct z3_impl {
    const dt_job *job;         /* borrowed */
    dt_ddp_opts o;             /* the [ddp] keys (compress, broadcast_buffers, ...) */
    int N, rank;
    z3_block *b;               /* (nb) */
    int nb;
    size_t shard_n, max_pad;   /* shard layout elements; the largest N*c */
    float *ps;                 /* (shard_n) parameters, owned (DT_MEM_PARAMS) */
    float *sg;                 /* (shard_n) averaged gradients, owned (DT_MEM_GRADS) */
    uint16_t *sg16;            /* (shard_n) compress: the 16-bit shard received, owned */
    float *stg;                /* (max_pad) gather staging, owned (DT_MEM_PARAMS) */
    void *send[2];             /* (max_pad) gradient send buffers (float or 16-bit), owned */
    dt_comm_work *send_work[2];
    int send_block[2];         /* the block each send buffer carries (for messages) */
    int send_next;
    dt_tensor_info *st;        /* (nst) the shard layout's tensor table, owned */
    int nst;
    /* the window order, recorded on the first forward and backward */
    int *fseq, nf, *bseq, nbw; /* (seq_cap) each */
    int seq_cap;               /* the windows of a pass (sum of blocks' windows) + 4 */
    bool frec, brec;           /* recorded */
    bool fbad, bbad;           /* a pass had more windows than seq_cap: never recorded */
    bool in_bwd, training;     /* the pass running */
    int pos;                   /* windows of this pass seen */
    bool *valid;               /* (nb) the flat buffer holds block k's parameters */
    bool *gz;                  /* (nb) block k's range of the flat gradient buffer is committed
                                  and holds this step's sum (zeroed at its first backward
                                  window since zero_grads or its scatter) */
    int *bw_seen;              /* (nb) backward windows of block k in this backward */
    bool *held;                /* (nb) blocks whose gradients wait for dt_zero3_scatter_held
                                  (a tied tensor's, summed elsewhere first), or NULL */
    bool *due;                 /* (nb) held blocks final in this backward, not scattered yet */
    int pf_block;              /* block being prefetched into stg, -1 none */
    bool pf_ready;             /* stg holds pf_block (gathered synchronously or waited) */
    dt_comm_work *pf_work;
    bool last;                 /* this micro-step is the accumulation's last */
    int rc;                    /* first error in a hook, with err */
    dt_err err;
    dt_strategy *s;            /* borrowed: its be, model and optim (the hook's way back) */
    dt_comm *c;                /* the group the shards are over (the world, or a data-parallel
                                  group), borrowed */
    float *dscratch;           /* (4 * world + 16) doubles' room for small collectives */
    /* checkpoint staging (strategy.h): buf[0] whole parameters, buf[1 + i] optimiser state i,
     * in the local model's layout; backend memory charged as "other", resident from open to
     * start and from a gather_state to the next step, given back (mem_release) in between */
    dt_strategy_staging ck;
    size_t gp, gg;             /* the granules of the flat parameter and gradient buffers
                                  (dt_mem_granule; 0: they cannot give memory back) */
    uint64_t g_sync, g_pref, forwards; /* gathers waited for at once, served by a prefetch;
                                          forward passes */
    size_t pk_params, pk_grads; /* the most parameter / gradient bytes resident (allocator's
                                   categories) seen right after each window took its pages */
} z3_impl;

struct dt_zero3 {
    z3_impl z;
};

static dt_backend *be_of(dt_strategy *s) { return s->be; }

/* ---- memory helpers ----------------------------------------------------------------------- */

/* Gives back block k's range of the flat buffer base (granule g, 0: nothing): the granules
 * wholly inside it and, at each end, the granule it shares with its neighbours when none of the
 * blocks overlapping that granule is in use (live[j]: their contents must stay). The range's
 * contents are gone (undefined after the next commit). */
static void release_block(dt_strategy *s, z3_impl *z, float *base, size_t g, const bool *live,
                          int k)
{
    const z3_block *b = &z->b[k];
    if (!g || !b->n)
        return;
    const uintptr_t a = (uintptr_t)base;
    const size_t all = s->model->num_params * sizeof(float);
    size_t lo = b->lo * sizeof(float), hi = (b->lo + b->n) * sizeof(float);
    uintptr_t glo = (a + lo) / g * g, ghi = (a + hi + g - 1) / g * g;
    size_t elo = glo < a ? 0 : glo - a, ehi = DT_MIN((size_t)(ghi - a), all);
    for (int j = 0; j < z->nb && (elo < lo || ehi > hi); j++) {
        if (j == k || !live[j] || !z->b[j].n)
            continue;
        size_t jlo = z->b[j].lo * sizeof(float), jhi = (z->b[j].lo + z->b[j].n) * sizeof(float);
        if (jlo < lo && jhi > elo)
            elo = lo;
        if (jhi > hi && jlo < ehi)
            ehi = hi;
    }
    be_of(s)->mem_release(be_of(s), base, elo, ehi - elo);
}

/* Commits flat[lo, lo + n) (granule g; 0: always resident), also after an earlier failure (a
 * window runs to its end whatever happened, and must not touch a released granule); 0 or the
 * commit's error, kept in z->rc unless one was there first. */
static int commit(dt_backend *be, z3_impl *z, float *flat, size_t g, size_t lo, size_t n)
{
    if (!n || !g)
        return 0;
    dt_err e = {0};
    int rc = be->mem_commit(be, flat, lo * sizeof(float), n * sizeof(float), &e);
    if (rc && !z->rc) {
        z->rc = rc;
        z->err = e;
        dt_err_prefix(&z->err, "ZeRO-3: ");
    }
    return rc;
}

/* Block k's gradient range ready to accumulate into: committed and zeroed at the block's first
 * backward window since zero_grads or its scatter (a commit's contents are undefined), kept
 * as it is afterwards (later windows and micro-steps add to it). */
static void grad_begin(dt_strategy *s, z3_impl *z, int k)
{
    if (z->gz[k])
        return;
    dt_backend *be = be_of(s);
    if (commit(be, z, s->model->grads, z->gg, z->b[k].lo, z->b[k].n))
        return;
    be->memset_zero(be, s->model->grads + z->b[k].lo, z->b[k].n * sizeof(float));
    z->gz[k] = true;
}

/* Block k's gradient range given back (its sum has been copied out, or a new step begins). */
static void grad_end(dt_strategy *s, z3_impl *z, int k)
{
    z->gz[k] = false;
    release_block(s, z, s->model->grads, z->gg, z->gz, k);
}

static void fail_at(z3_impl *z, int rc, const dt_err *e, const char *what, const char *block)
{
    if (z->rc)
        return;
    z->rc = rc;
    z->err = *e;
    dt_err_prefix(&z->err, "ZeRO-3: %s %s: ", what, block);
}

/* ---- parameter gathers -------------------------------------------------------------------- */

static void pf_drop(dt_strategy *s, z3_impl *z)
{
    if (z->pf_work) {
        dt_comm_wait(z->c, z->pf_work, NULL);
        z->pf_work = NULL;
    }
    z->pf_block = -1;
    z->pf_ready = false;
}

static void issue_gather(dt_strategy *s, z3_impl *z, int k, bool async, const char *why)
{
    const z3_block *b = &z->b[k];
    dt_err e = {0};
    int rc = dt_comm_allgather(z->c, z->ps + b->at, z->stg, b->c, DT_FLOAT32,
                               async ? &z->pf_work : NULL, &e);
    if (rc) {
        z->pf_work = NULL;
        fail_at(z, rc, &e, why, s->model->blocks[k].name);
        return;
    }
    z->pf_block = k;
    z->pf_ready = !async;
    if (!async)
        z->g_sync++;
}

/* The flat buffer gets block k's parameters (from the prefetch, or gathered now). */
static void bring_in(dt_strategy *s, z3_impl *z, int k, const char *why)
{
    dt_backend *be = be_of(s);
    if (z->valid[k])
        return;
    if (z->rc) {
        /* an earlier failure: no more collectives; the window still runs (the pass returns
         * the error after it) on a committed range of undefined contents */
    } else if (z->pf_block != k) {
        pf_drop(s, z); /* a guess that missed (a pass unlike the recorded one) */
        issue_gather(s, z, k, false, why);
    } else if (!z->pf_ready) {
        z->g_pref++;
        dt_err e = {0};
        int rc = dt_comm_wait(z->c, z->pf_work, &e);
        z->pf_work = NULL;
        if (rc)
            fail_at(z, rc, &e, why, s->model->blocks[k].name);
        z->pf_ready = true;
    }
    /* the range is committed only now: the gather wrote into stg (resident), and the copy
     * below is the first write into the flat buffer. Should the commit fail, the window
     * touches released memory (a fault): nothing in a hook can stop the model's pass. */
    if (commit(be, z, s->model->params, z->gp, z->b[k].lo, z->b[k].n))
        return;
    if (!z->rc) {
        be->memcpy_d2d(be, s->model->params + z->b[k].lo, z->stg, z->b[k].n * sizeof(float));
        z->pf_block = -1;
        z->pf_ready = false;
    } else {
        pf_drop(s, z);
    }
    z->valid[k] = true; /* given back at AFTER or by drop_all */
}

/* The block of the window after the current one (pos), or -1. */
static int next_window(const z3_impl *z)
{
    if (!z->in_bwd) {
        if (!z->frec)
            return -1;
        if (z->pos < z->nf)
            return z->fseq[z->pos];
        return z->training && z->brec && z->nbw ? z->bseq[0] : -1;
    }
    return z->brec && z->pos < z->nbw ? z->bseq[z->pos] : -1;
}

static void release_params(dt_strategy *s, z3_impl *z, int k)
{
    if (!z->valid[k])
        return;
    z->valid[k] = false;
    release_block(s, z, s->model->params, z->gp, z->valid, k);
}

/* ---- gradients ---------------------------------------------------------------------------- */

static void wait_send(dt_strategy *s, z3_impl *z, int i)
{
    if (!z->send_work[i])
        return;
    dt_err e = {0};
    int rc = dt_comm_wait(z->c, z->send_work[i], &e);
    z->send_work[i] = NULL;
    if (rc)
        fail_at(z, rc, &e, "reduce-scattering the gradients of",
                s->model->blocks[z->send_block[i]].name);
}

static void scatter_grads(dt_strategy *s, z3_impl *z, int k)
{
    dt_backend *be = be_of(s);
    const z3_block *b = &z->b[k];
    int i = z->send_next;
    z->send_next ^= 1;
    wait_send(s, z, i);
    if (z->rc)
        return;
    size_t pad = (size_t)z->N * b->c;
    float *g = s->model->grads + b->lo;
    z->send_block[i] = k;
    dt_err e = {0};
    int rc;
    if (z->sg16) {
        uint16_t *h = z->send[i];
        be->to_half(be, h, g, b->n, 1.0f / (float)z->N, z->o.compress == DT_BFLOAT16);
        if (pad > b->n)
            be->memset_zero(be, h + b->n, (pad - b->n) * sizeof *h);
        rc = dt_comm_reduce_scatter(z->c, h, z->sg16 + b->at, b->c, z->o.compress, DT_SUM,
                                    &z->send_work[i], &e);
    } else {
        float *f = z->send[i];
        be->memcpy_d2d(be, f, g, b->n * sizeof(float));
        if (pad > b->n)
            be->memset_zero(be, f + b->n, (pad - b->n) * sizeof *f);
        rc = dt_comm_reduce_scatter(z->c, f, z->sg + b->at, b->c, DT_FLOAT32, DT_AVG,
                                    &z->send_work[i], &e);
    }
    if (rc) {
        z->send_work[i] = NULL;
        fail_at(z, rc, &e, "reduce-scattering the gradients of", s->model->blocks[k].name);
    }
    grad_end(s, z, k);
}

/* ---- the block hook ----------------------------------------------------------------------- */

static void hook(void *ctx, int k, dt_block_event ev)
{
    z3_impl *z = ctx;
    dt_strategy *s = z->s;
    if (k < 0 || k >= z->nb)
        return;
    bool before = ev == DT_BLOCK_BEFORE_FORWARD || ev == DT_BLOCK_BEFORE_BACKWARD;
    bool bwd = ev == DT_BLOCK_BEFORE_BACKWARD || ev == DT_BLOCK_AFTER_BACKWARD;
    if (before) {
        if (bwd != z->in_bwd) { /* the backward's first window */
            z->in_bwd = bwd;
            z->pos = 0;
        }
        if (bwd && !z->brec) {
            if (z->nbw < z->seq_cap)
                z->bseq[z->nbw++] = k;
            else
                z->bbad = true;
        }
        if (!bwd && !z->frec) {
            if (z->nf < z->seq_cap)
                z->fseq[z->nf++] = k;
            else
                z->fbad = true;
        }
        /* consistency: the recorded order holds, else no more guessing */
        int *seq = bwd ? z->bseq : z->fseq;
        int len = bwd ? z->nbw : z->nf;
        if ((bwd ? z->brec : z->frec) && (z->pos >= len || seq[z->pos] != k))
            pf_drop(s, z);
        z->pos++;
        bring_in(s, z, k, bwd ? "gathering (before its backward) the parameters of"
                          : "gathering (before its forward) the parameters of");
        if (bwd)
            grad_begin(s, z, k);
        int nx = next_window(z);
        if (nx >= 0 && nx != k && !z->valid[nx] && z->pf_block < 0 && !z->rc)
            issue_gather(s, z, nx, true, "prefetching the parameters of");
        /* resident bytes only grow at a window's start (commits): the peaks are seen here */
        dt_mem_stats ms;
        dt_mem_read(be_of(s), &ms);
        z->pk_params = DT_MAX(z->pk_params, ms.cur[DT_MEM_PARAMS]);
        z->pk_grads = DT_MAX(z->pk_grads, ms.cur[DT_MEM_GRADS]);
        return;
    }
    int nx = next_window(z);
    if (nx != k)
        release_params(s, z, k);
    if (ev == DT_BLOCK_AFTER_BACKWARD && ++z->bw_seen[k] == s->model->blocks[k].windows &&
        z->last) {
        if (z->held && z->held[k])
            z->due[k] = true;
        else
            scatter_grads(s, z, k);
    }
}

/* A pass begins (forward): the windows count from the start again. */
static void pass_begin(z3_impl *z, bool training)
{
    z->forwards++;
    z->in_bwd = false;
    z->pos = 0;
    z->training = training;
}

/* A pass ended: when it was the first of its kind and went through (rc 0), its windows are the
 * order the next passes prefetch by; a failed one is recorded again next time. */
static void pass_end(z3_impl *z, bool bwd, int rc)
{
    if (bwd && !z->brec) {
        z->brec = !rc && !z->rc && z->nbw > 0 && !z->bbad;
        if (!z->brec)
            z->nbw = 0;
    } else if (!bwd && !z->frec) {
        z->frec = !rc && !z->rc && z->nf > 0 && !z->fbad;
        if (!z->frec)
            z->nf = 0;
    }
}

/* Every block's flat parameters given back, any prefetch waited for. */
static void drop_all(dt_strategy *s, z3_impl *z)
{
    pf_drop(s, z);
    for (int k = 0; k < z->nb; k++)
        release_params(s, z, k);
}

/* ---- small collectives -------------------------------------------------------------------- */

/* One double per rank, gathered bit for bit, summed in rank order. */
static int sum_double(dt_strategy *s, z3_impl *z, double v, double *sum, dt_err *err)
{
    dt_backend *be = be_of(s);
    char *out = (char *)z->dscratch + sizeof v;
    be->memcpy_h2d(be, z->dscratch, &v, sizeof v);
    int rc = dt_comm_allgather(z->c, z->dscratch, out, sizeof v, DT_UINT8, NULL, err);
    if (rc)
        return rc;
    double all[64];
    double acc = 0;
    for (int r = 0; r < z->N; r += 64) {
        int m = DT_MIN(64, z->N - r);
        be->memcpy_d2h(be, all, out + (size_t)r * sizeof v, (size_t)m * sizeof v);
        for (int q = 0; q < m; q++)
            acc += all[q];
    }
    *sum = acc;
    return 0;
}

/* Every rank built the same model: the digest of its tensor table and blocks, compared. */
static int check_model(dt_strategy *s, z3_impl *z, dt_err *err)
{
    const dt_model *m = s->model;
    uint64_t h = dt_xxh64(&m->num_params, sizeof m->num_params, (uint64_t)m->num_tensors);
    for (int i = 0; i < m->num_tensors; i++) {
        h = dt_xxh64(m->tensors[i].name, strlen(m->tensors[i].name), h);
        h = dt_xxh64(&m->tensors[i].numel, sizeof m->tensors[i].numel, h);
    }
    for (int k = 0; k < m->num_blocks; k++)
        h = dt_xxh64(&m->blocks[k].numel, sizeof m->blocks[k].numel, h);
    dt_backend *be = be_of(s);
    char *out = (char *)z->dscratch + sizeof h;
    be->memcpy_h2d(be, z->dscratch, &h, sizeof h);
    int rc = dt_comm_allgather(z->c, z->dscratch, out, sizeof h, DT_UINT8, NULL, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: comparing the model across ranks: ");
    for (int r = 0; r < z->N; r++) {
        uint64_t o;
        be->memcpy_d2h(be, &o, out + (size_t)r * sizeof o, sizeof o);
        if (o != h)
            return dt_err_set(err, -EPROTO,
                              "ZeRO-3: rank %d built another model than rank %d (%zu "
                              "parameters in %d tensors here): every rank must build the same "
                              "model from the same job file",
                              r, z->rank, m->num_params, m->num_tensors);
    }
    return 0;
}

/* ---- layout ------------------------------------------------------------------------------- */

static int build_layout(dt_strategy *s, z3_impl *z, dt_err *err)
{
    const dt_model *m = s->model;
    const size_t N = (size_t)z->N;
    if (m->num_blocks < 1)
        return dt_err_set(err, -EINVAL, "ZeRO-3: the model has no blocks to gather");
    z->nb = m->num_blocks;
    z->seq_cap = 4;
    for (int k = 0; k < z->nb; k++)
        z->seq_cap += DT_MAX(1, m->blocks[k].windows);
    if (!(z->b = calloc((size_t)z->nb, sizeof *z->b)) ||
        !(z->st = calloc((size_t)(m->num_tensors + 2 * z->nb), sizeof *z->st)) ||
        !(z->fseq = calloc((size_t)z->seq_cap, sizeof *z->fseq)) ||
        !(z->bseq = calloc((size_t)z->seq_cap, sizeof *z->bseq)) ||
        !(z->valid = calloc((size_t)z->nb, sizeof *z->valid)) ||
        !(z->gz = calloc((size_t)z->nb, sizeof *z->gz)) ||
        !(z->bw_seen = calloc((size_t)z->nb, sizeof *z->bw_seen)))
        return dt_err_set(err, -ENOMEM, "ZeRO-3: out of memory");
    size_t at = 0;
    for (int k = 0; k < z->nb; k++) {
        const dt_block *mb = &m->blocks[k];
        z3_block *b = &z->b[k];
        size_t c = (mb->numel + N - 1) / N, mine = (size_t)z->rank * c;
        *b = (z3_block){.lo = mb->offset, .n = mb->numel, .c = c, .at = at,
                        .off = mb->offset + DT_MIN(mine, mb->numel),
                        .mn = mine < mb->numel ? DT_MIN(c, mb->numel - mine) : 0};
        /* the shard's tensor table: this rank's part of each tensor of the block, then the
         * padding */
        size_t got = 0;
        for (int t = mb->first_tensor; t <= mb->last_tensor; t++) {
            const dt_tensor_info *ti = &m->tensors[t];
            size_t lo = DT_MAX(ti->offset, b->off), hi = DT_MIN(ti->offset + ti->numel,
                                                                b->off + b->mn);
            if (lo >= hi)
                continue;
            dt_tensor_info *o = &z->st[z->nst++];
            *o = *ti;
            o->ndim = 1;
            o->shape[0] = (int64_t)(hi - lo);
            o->offset = at + (lo - b->off);
            o->numel = hi - lo;
            got += hi - lo;
        }
        if (got < c) {
            dt_tensor_info *o = &z->st[z->nst++];
            memset(o, 0, sizeof *o);
            snprintf(o->name, sizeof o->name, "%s.padding", mb->name);
            o->ndim = 1;
            o->shape[0] = (int64_t)(c - got);
            o->offset = at + got;
            o->numel = c - got;
            o->no_decay = true;
        }
        at += c;
        z->max_pad = DT_MAX(z->max_pad, N * c);
    }
    z->shard_n = at;
    return 0;
}

/* shard (shard layout) = this rank's parts of full (num_params, the checkpoint staging);
 * padding zero. */
static void slice(dt_strategy *s, z3_impl *z, const float *full, float *shard)
{
    dt_backend *be = be_of(s);
    be->memset_zero(be, shard, z->shard_n * sizeof(float));
    for (int k = 0; k < z->nb; k++)
        if (z->b[k].mn)
            be->memcpy_d2d(be, shard + z->b[k].at, full + z->b[k].off,
                           z->b[k].mn * sizeof(float));
}

/* full (num_params) = every rank's shard put in place: block by block, all-gathered into stg
 * (its padded N*c) and the n elements copied out (full has no room for a block's padding).
 * stg holds no prefetch then (the caller dropped it). */
static int unslice(dt_strategy *s, z3_impl *z, const float *shard, float *full, dt_err *err)
{
    dt_backend *be = be_of(s);
    for (int k = 0; k < z->nb; k++) {
        int rc = dt_comm_allgather(z->c, shard + z->b[k].at, z->stg, z->b[k].c, DT_FLOAT32,
                                   NULL, err);
        if (rc)
            return rc;
        be->memcpy_d2d(be, full + z->b[k].lo, z->stg, z->b[k].n * sizeof(float));
    }
    return 0;
}

/* ---- the ops ------------------------------------------------------------------------------ */

static int z3_rank_batch(const dt_job *job) { return job->batch_size; }

static int balloc(dt_backend *be, void **p, size_t bytes, dt_mem_cat cat, dt_err *err)
{
    dt_mem_cat old = dt_mem_tag(be, cat);
    int rc = be->alloc(be, p, bytes ? bytes : 4, err);
    dt_mem_tag(be, old);
    return rc;
}

/* ---- the piece (dt_zero3, strategy_zero.h) ------------------------------------------------ */

int dt_zero3_open(dt_zero3 **out, dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *c,
                  dt_err *err)
{
    *out = NULL;
    dt_zero3 *zz = calloc(1, sizeof *zz);
    if (!zz)
        return dt_err_set(err, -ENOMEM, "out of memory");
    z3_impl *z = &zz->z;
    z->s = s;
    z->c = c;
    z->job = ctx->job;
    z->pf_block = -1;
    z->N = dt_comm_world_size(c);
    z->rank = dt_comm_rank(c);
    dt_model *m = s->model;
    dt_backend *be = s->be;
    int rc;
    z->gp = dt_mem_granule(be, m->params);
    z->gg = dt_mem_granule(be, m->grads);
    if ((rc = dt_ddp_opts_from_job(&z->o, ctx->job, err)))
        goto fail;
    if (m->num_params < (size_t)z->N) {
        rc = dt_err_set(err, -EINVAL, "ZeRO-3: %zu parameters cannot be sharded over %d ranks",
                        m->num_params, z->N);
        goto fail;
    }
    if ((rc = balloc(be, (void **)&z->dscratch, sizeof(double) * (2 * (size_t)z->N + 4),
                     DT_MEM_COMM, err)) ||
        (rc = check_model(s, z, err)) || (rc = build_layout(s, z, err)))
        goto fail;
    bool half = z->o.compress != DT_FLOAT32;
    size_t esz = half ? sizeof(uint16_t) : sizeof(float);
    if ((rc = balloc(be, (void **)&z->ps, z->shard_n * sizeof(float), DT_MEM_PARAMS, err)) ||
        (rc = balloc(be, (void **)&z->stg, z->max_pad * sizeof(float), DT_MEM_PARAMS, err)) ||
        (rc = balloc(be, (void **)&z->sg, z->shard_n * sizeof(float), DT_MEM_GRADS, err)) ||
        (half && (rc = balloc(be, (void **)&z->sg16, z->shard_n * sizeof(uint16_t), DT_MEM_COMM,
                              err))) ||
        (rc = balloc(be, &z->send[0], z->max_pad * esz, DT_MEM_COMM, err)) ||
        (rc = balloc(be, &z->send[1], z->max_pad * esz, DT_MEM_COMM, err))) {
        dt_err_prefix(err, "ZeRO-3: ");
        goto fail;
    }
    dt_optim_range all = {0, z->shard_n, 0};
    if ((rc = dt_optim_create_ranges(&s->optim, ctx->optim, be, z->st, z->nst, z->shard_n, &all,
                                     1, z->shard_n, err)))
        goto fail;
    /* checkpoint staging (zeroed: the optimiser state when nothing is loaded); the model's
     * initial parameters wait there for start (a resume overwrites them), and the flat buffers
     * give their memory back */
    if ((rc = dt_strategy_staging_alloc(&z->ck, be, 1 + s->optim->num_states, m->num_params,
                                        err))) {
        dt_err_prefix(err, "ZeRO-3: ");
        goto fail;
    }
    be->memcpy_d2d(be, z->ck.buf[0], m->params, m->num_params * sizeof(float));
    /* from here on a block's ranges are committed before they are written (bring_in,
     * grad_begin); nothing is resident that no block uses */
    if (z->gp)
        be->mem_release(be, m->params, 0, m->num_params * sizeof(float));
    if (z->gg)
        be->mem_release(be, m->grads, 0, m->num_params * sizeof(float));
    if ((!z->gp || !z->gg) && z->rank == 0)
        DT_WARN("ZeRO-3: the %s backend cannot give the model's flat %s buffer back (granule "
                "0): it stays resident, whole, beside the shard, so stage 3 saves less memory "
                "here than its formula says (the memory figures show what is resident)",
                be->name, !z->gp && !z->gg ? "parameter and gradient" : !z->gp ? "parameter"
                                                                              : "gradient");
    dt_model_set_block_hook(m, hook, z);
    *out = zz;
    return 0;
fail:
    dt_zero3_free(zz);
    return rc;
}

void dt_zero3_free(dt_zero3 *zz)
{
    if (!zz)
        return;
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    pf_drop(s, z);
    for (int i = 0; i < 2; i++)
        if (z->send_work[i])
            dt_comm_wait(z->c, z->send_work[i], NULL);
    dt_backend *be = s->be;
    be->free(be, z->ps);
    be->free(be, z->sg);
    be->free(be, z->sg16);
    be->free(be, z->stg);
    be->free(be, z->send[0]);
    be->free(be, z->send[1]);
    be->free(be, z->dscratch);
    dt_strategy_staging_free(&z->ck, be);
    free(z->b);
    free(z->st);
    free(z->fseq);
    free(z->bseq);
    free(z->valid);
    free(z->gz);
    free(z->bw_seen);
    free(z->held);
    free(z->due);
    if (s->model)
        dt_model_set_block_hook(s->model, NULL, NULL);
    free(zz);
}

float *dt_zero3_local(dt_zero3 *zz, int k)
{
    return zz->z.ck.buf[k];
}

int dt_zero3_start(dt_zero3 *zz, dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_model *m = s->model;
    int rc;
    drop_all(s, z);
    /* rank 0's parameters and buffers (its initialisation, or what every rank loaded) */
    if ((rc = dt_comm_broadcast(z->c, z->ck.buf[0], m->num_params, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO-3: broadcasting rank 0's parameters: ");
    if (m->num_buffers &&
        (rc = dt_comm_broadcast(z->c, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO-3: broadcasting rank 0's buffers: ");
    slice(s, z, z->ck.buf[0], z->ps);
    for (int i = 0; i < s->optim->num_states; i++)
        slice(s, z, z->ck.buf[1 + i], s->optim->states[i].buf);
    dt_strategy_staging_release(&z->ck, s->be);
    return 0;
}

/* Every block's gradient range given back; each is committed and zeroed again at its first
 * backward window. */
void dt_zero3_zero_grads(dt_zero3 *zz)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    memset(z->gz, 0, sizeof *z->gz * (size_t)z->nb);
    if (z->gg)
        s->be->mem_release(s->be, s->model->grads, 0, s->model->num_params * sizeof(float));
}

int dt_zero3_micro_step(dt_zero3 *zz, const dt_batch *batch, float dloss, bool last,
                        float *loss, dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_model *m = s->model;
    z->last = last;
    pass_begin(z, true);
    uint64_t ts = dt_trace_begin();
    int rc = m->ops->forward(m, batch, true, loss, err);
    dt_trace_end(ts, DT_TRACE_FORWARD, "forward");
    pass_end(z, false, rc);
    if (!rc && z->rc)
        rc = z->rc, *err = z->err;
    if (rc) {
        drop_all(s, z);
        return rc;
    }
    memset(z->bw_seen, 0, sizeof *z->bw_seen * (size_t)z->nb);
    dt_flight_phase(DT_PHASE_BACKWARD);
    ts = dt_trace_begin();
    rc = m->ops->backward(m, dloss, NULL, NULL, err);
    dt_trace_end(ts, DT_TRACE_BACKWARD, "backward");
    pass_end(z, true, rc);
    z->in_bwd = false;
    drop_all(s, z);
    if (!rc && z->rc)
        rc = z->rc, *err = z->err;
    return rc;
}

int dt_zero3_sync_grads(dt_zero3 *zz, double *wait_s, dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_backend *be = s->be;
    double t0 = dt_now_s();
    wait_send(s, z, 0);
    wait_send(s, z, 1);
    *wait_s = dt_now_s() - t0;
    int rc = z->rc;
    if (rc) {
        *err = z->err;
        z->rc = 0;
        return rc;
    }
    for (int k = 0; k < z->nb; k++) {
        const z3_block *b = &z->b[k];
        if (z->sg16)
            be->from_half(be, z->sg + b->at, z->sg16 + b->at, b->c, 1.0f,
                          z->o.compress == DT_BFLOAT16);
        if (b->mn < b->c)
            be->memset_zero(be, z->sg + b->at + b->mn, (b->c - b->mn) * sizeof(float));
    }
    if (z->o.broadcast_buffers && s->model->num_buffers &&
        (rc = dt_comm_broadcast(z->c, s->model->buffers, s->model->num_buffers, DT_FLOAT32, 0,
                                NULL, err)))
        return dt_err_prefix(err, "ZeRO-3: broadcasting rank 0's buffers: ");
    return 0;
}

/* The shard's sum of squares: the whole shard (tp_rank < 0: as one sumsq, the zero strategy's
 * norm), or the parts of it that are counted tensors (the shard's own tensor table: its entries
 * keep the model's tp_parts; the padding is zero), summed over the ranks in rank order. */
static int shard_sumsq(z3_impl *z, int tp_rank, const int *skip, int nskip, double *sum,
                       dt_err *err)
{
    dt_strategy *s = z->s;
    double mine = 0;
    if (tp_rank < 0) {
        mine = s->be->sumsq(s->be, z->sg, z->shard_n);
    } else {
        const dt_model *m = s->model;
        for (int t = 0; t < z->nst; t++) {
            const dt_tensor_info *ti = &z->st[t];
            bool counted = ti->tp_parts > 0 || tp_rank == 0;
            int mt = nskip > 0 ? dt_model_find_tensor(m, ti->name) : -1; /* padding: -1 */
            for (int i = 0; counted && mt >= 0 && i < nskip; i++)
                counted = skip[i] != mt;
            if (counted && ti->numel)
                mine += s->be->sumsq(s->be, z->sg + ti->offset, ti->numel);
        }
    }
    return sum_double(s, z, mine, sum, err);
}

int dt_zero3_clip_split(dt_zero3 *zz, double unscale, int tp_rank, const int *skip, int nskip,
                        dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                        dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_backend *be = s->be;
    if (unscale != 1.0)
        be->scale(be, z->sg, z->shard_n, (float)unscale);
    double sum = 0;
    int rc = shard_sumsq(z, tp_rank, skip, nskip, &sum, err);
    if (!rc && ngroups > 0)
        be->memcpy_h2d(be, scratch, &sum, sizeof sum);
    for (int k = 0; k < ngroups && !rc; k++)
        if (groups[k])
            rc = dt_comm_allreduce(groups[k], scratch, 1, DT_FLOAT64, DT_SUM, NULL, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: the global gradient norm: ");
    if (ngroups > 0)
        be->memcpy_d2h(be, &sum, scratch, sizeof sum);
    *norm = sqrt(sum);
    double clip = s->optim->cfg.grad_clip;
    if (clip > 0 && isfinite(*norm) && *norm > clip)
        be->scale(be, z->sg, z->shard_n, (float)(clip / (*norm + 1e-6)));
    return 0;
}

int dt_zero3_step(dt_zero3 *zz, double lr)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_strategy_staging_release(&z->ck, s->be); /* the trainer fenced the last save's copy */
    drop_all(s, z);
    dt_optim_step(s->optim, z->ps, z->sg, lr);
    return 0;
}

int dt_zero3_eval(dt_zero3 *zz, const dt_batch *batch, float *loss, int64_t *correct,
                  dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    dt_model *m = s->model;
    pass_begin(z, false);
    int rc = m->ops->forward(m, batch, false, loss, err);
    pass_end(z, false, rc);
    drop_all(s, z);
    if (!rc && z->rc) {
        rc = z->rc;
        *err = z->err;
        z->rc = 0;
    }
    if (!rc)
        *correct = m->last_correct;
    return rc;
}

int dt_zero3_gather_state(dt_zero3 *zz, dt_err *err)
{
    z3_impl *z = &zz->z;
    dt_strategy *s = z->s;
    int rc = dt_strategy_staging_commit(&z->ck, s->be, err); /* every element written below */
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: ");
    pf_drop(s, z); /* stg carries the gathers below */
    rc = unslice(s, z, z->ps, z->ck.buf[0], err);
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: gathering the parameters: ");
    for (int i = 0; i < s->optim->num_states; i++)
        if ((rc = unslice(s, z, s->optim->states[i].buf, z->ck.buf[1 + i], err)))
            return dt_err_prefix(err, "ZeRO-3: gathering %s: ", s->optim->states[i].name);
    return 0;
}

int dt_zero3_hold_tensor(dt_zero3 *zz, int tensor, dt_err *err)
{
    z3_impl *z = &zz->z;
    const dt_model *m = z->s->model;
    if (!z->held && (!(z->held = calloc((size_t)z->nb, sizeof *z->held)) ||
                     !(z->due = calloc((size_t)z->nb, sizeof *z->due))))
        return dt_err_set(err, -ENOMEM, "out of memory");
    for (int k = 0; k < z->nb; k++)
        if (m->blocks[k].first_tensor <= tensor && tensor <= m->blocks[k].last_tensor) {
            z->held[k] = true;
            return 0;
        }
    return dt_err_set(err, -EINVAL, "ZeRO-3: tensor %d is in no block of the model", tensor);
}

void dt_zero3_backward_begins(dt_zero3 *zz, bool last)
{
    z3_impl *z = &zz->z;
    z->last = last;
    if (last)
        memset(z->bw_seen, 0, sizeof *z->bw_seen * (size_t)z->nb);
}

void dt_zero3_scatter_held(dt_zero3 *zz)
{
    z3_impl *z = &zz->z;
    for (int k = z->nb - 1; k >= 0 && z->held; k--) /* the same order on every rank */
        if (z->due[k]) {
            z->due[k] = false;
            scatter_grads(z->s, z, k);
        }
}

void dt_zero3_drop(dt_zero3 *zz) { drop_all(zz->z.s, &zz->z); }

/* ---- the zero strategy at stage 3: the piece over the world --------------------------------- */

static int z3_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (rc)
        return rc;
    const char *backend; /* cpu: the backend is */
    if ((rc = dt_strategy_comm_backend(s, ctx, &backend, err)))
        return rc;
    if ((rc = dt_strategy_world_comm(&s->comm, ctx, backend, err)))
        return dt_err_prefix(err, "ZeRO-3: ");
    if ((rc = dt_model_create(&s->model, ctx->model, s->be, s->comm, err)))
        return rc;
    dt_zero3 *zz = NULL;
    if ((rc = dt_zero3_open(&zz, s, ctx, s->comm, err)))
        return rc;
    s->impl = zz;
    const z3_impl *z = &zz->z;
    const dt_model *m = s->model;
    snprintf(s->summary, sizeof s->summary, "ZeRO-3 over %d ranks", z->N);
    if (z->rank == 0)
        DT_INFO("ZeRO stage 3: %zu parameters in %d blocks, this rank's shard %zu (%.1f%%); "
                "gathered per block (largest padded block %zu); the flat buffers give memory "
                "back in granules of %zu bytes (parameters) and %zu (gradients)",
                m->num_params, z->nb, z->shard_n,
                100.0 * (double)z->shard_n / (double)m->num_params, z->max_pad, z->gp, z->gg);
    return 0;
}

static int z3_start(dt_strategy *s, dt_err *err) { return dt_zero3_start(s->impl, err); }

static void z3_zero_grads(dt_strategy *s) { dt_zero3_zero_grads(s->impl); }

static int z3_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                         float *loss, dt_err *err)
{
    return dt_zero3_micro_step(s->impl, batch, dloss, last, loss, err);
}

static int z3_sync_grads(dt_strategy *s, dt_err *err)
{
    return dt_zero3_sync_grads(s->impl, &s->comm_time_s, err);
}

/* Mean over the ranks, as DDP's (float64 all-reduce, averaged by the collective). */
static int z3_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    z3_impl *z = &((dt_zero3 *)s->impl)->z;
    dt_backend *be = s->be;
    for (int k = 0; k < n; k += 2) {
        int m = DT_MIN(2, n - k);
        be->memcpy_h2d(be, z->dscratch, v + k, (size_t)m * sizeof(double));
        int rc = dt_comm_allreduce(s->comm, z->dscratch, (size_t)m, DT_FLOAT64, DT_AVG, NULL,
                                   err);
        if (rc)
            return rc;
        be->memcpy_d2h(be, v + k, z->dscratch, (size_t)m * sizeof(double));
    }
    return 0;
}

/* The norm over the whole shard, summed over the ranks (no other group). */
static int z3_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    return dt_zero3_clip_split(s->impl, unscale, -1, NULL, 0, NULL, 0, NULL, norm, err);
}

static int z3_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    (void)err;
    return dt_zero3_step(s->impl, lr);
}

static int z3_eval_step(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                        dt_err *err)
{
    return dt_zero3_eval(s->impl, batch, loss, correct, err);
}

static int z3_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    z3_impl *z = &((dt_zero3 *)s->impl)->z;
    return dt_strategy_state_bufs(s, z->ck.buf[0], z->ck.buf + 1, bufs, cap, n, err);
}

static int z3_gather_state(dt_strategy *s, dt_err *err)
{
    return dt_zero3_gather_state(s->impl, err);
}

static void z3_close(dt_strategy *s)
{
    dt_zero3_free(s->impl);
    s->impl = NULL;
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_optim_free(s->optim);
    dt_model_free(s->model);
    dt_backend_close(s->be);
}

/* ---- figures ------------------------------------------------------------------------------ */

void dt_strategy_zero3_mem(dt_strategy *s, dt_strategy_mem *out)
{
    const z3_impl *z = &((const dt_zero3 *)s->impl)->z;
    dt_mem_stats ms;
    dt_mem_read(s->be, &ms);
    out->zero_stage = 3;
    out->params = ms.cur[DT_MEM_PARAMS];
    out->params_peak = DT_MAX(z->pk_params, out->params);
    out->grads = ms.cur[DT_MEM_GRADS];
    out->grads_peak = DT_MAX(z->pk_grads, out->grads);
    out->optim = (size_t)s->optim->num_states * s->optim->state_numel * sizeof(float);
    out->comm = ms.cur[DT_MEM_COMM];
    out->gathers_sync = z->g_sync;
    out->gathers_prefetched = z->g_pref;
    out->windows = (uint64_t)(z->nf + z->nbw);
    out->forwards = z->forwards;
    /* the staging held now: between a save and the next update (always where the backend's
     * granule is 0: nothing is given back there) */
    size_t ck = (size_t)z->ck.n * z->ck.numel * sizeof(float);
    out->ckpt_staging = z->ck.resident || !dt_mem_granule(s->be, z->ck.buf[0]) ? ck : 0;
}

const dt_strategy_ops dt_strategy_zero3_ops = {
    .name = "zero",
    .rank_batch = z3_rank_batch,
    .open = z3_open,
    .start = z3_start,
    .zero_grads = z3_zero_grads,
    .micro_step = z3_micro_step,
    .sync_grads = z3_sync_grads,
    .average = z3_average,
    .clip = z3_clip,
    .optim_step = z3_optim_step,
    .eval_step = z3_eval_step,
    .state = z3_state,
    .gather_state = z3_gather_state,
    .replica_backend = dt_strategy_backend_one,
    .close = z3_close,
};
