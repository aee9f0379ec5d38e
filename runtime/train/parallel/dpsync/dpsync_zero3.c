/* dpsync_zero3.c - ZeRO stage 3 (FSDP full-shard) as a data-parallel sync (dpsync.h's zero-3),
 * on any backend (cpu, cuda).
 *
 * What it is (parallel.zero = 3, device = cpu or cuda): ZeRO-1/2 (dpsync_zero12.c) with the
 * parameters sharded too, per block of the model (model.h: buckets = blocks, each cut into N
 * chunks of ceil(n/N), the last padded; rank r keeps chunk r of every block in its persistent
 * shard). The model's block hook gathers a block into the flat parameter buffer at BEFORE_FORWARD /
 * BEFORE_BACKWARD (through a padded staging buffer, prefetched one window ahead once the window
 * order was seen in the first step; the block's range committed (mem_commit) before the copy
 * into it) and gives its granules back (mem_release) at AFTER; a block's gradient range is
 * committed and zeroed at its first backward window of a step, reduce-scattered at its last
 * AFTER_BACKWARD of the last micro-step and given back (earlier micro-steps of an accumulation
 * keep the whole gradient buffer, as stage 2). Nothing relies on released memory reading as
 * zero (the strict contract of backend_ops.h); where the backend's granule is 0 nothing is
 * given back and the figures show the flat buffers resident. The
 * optimiser steps the shard in place (a tensor table of the shard layout). Per rank: 4Ψ/N +
 * about two blocks of parameters, 4Ψ/N + about one block of gradients, 8Ψ/N of AdamW state.
 * Bit for bit DDP's on one host (the same reductions, the same element-wise update); the norm
 * as stages 1-2. Checkpoint state through full-size staging (local(k), the parameters
 * included): a save gathers them, a load is sliced at start. Every micro-step communicates, so
 * train.global_batch (unequal micro-steps across ranks) is refused, and every rank must run
 * as many eval forwards (the trainer does). stats is -ENOTSUP for it (no reducer); mem
 * reports its allocator figures.
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
 *     staging (strategy.h's dt_staging: backend memory, resident from open to start
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
 * A layout holds it over its data-parallel group: the world (a whole model), the tensor layout's
 * (its model is then the rank's slices), a pipeline stage's. A pipeline's micro-batches
 * interleave their passes (no forward_begin/end), so it learns no window order there and every
 * gather is waited for at its window (no prefetch); its tied embedding's block is held (hold)
 * until finish had it summed over the embedding group.
 */
#include "runtime/train/parallel/dpsync/dpsync_zero3.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/ckpt/xxh64.h"
#include "runtime/train/parallel/staging.h"

typedef struct z3_block {
    size_t lo, n;   /* the block's range of the flat buffers */
    size_t c;       /* chunk: ceil(n / N) */
    size_t at;      /* where this rank's chunk starts in the shard layout */
    size_t off, mn; /* this rank's part: [off, off + mn) of the flat buffer (mn may be < c) */
} z3_block;

typedef struct z3_impl {
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
    int *st_src;               /* (nst) the model's tensor each entry is a part of; -1: padding */
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
    bool *held;                /* (nb) blocks whose gradients wait for finish (hold)
                                  (a tied tensor's, summed elsewhere first), or NULL */
    bool *due;                 /* (nb) held blocks final in this backward, not scattered yet */
    int pf_block;              /* block being prefetched into stg, -1 none */
    bool pf_ready;             /* stg holds pf_block (gathered synchronously or waited) */
    dt_comm_work *pf_work;
    bool last;                 /* this micro-step is the accumulation's last */
    int rc;                    /* first error in a hook, with err */
    dt_err err;
    dt_dpsync *s;            /* borrowed: its be, model and optim (the hook's way back) */
    dt_comm *c;                /* the group the shards are over (the world, or a data-parallel
                                  group), borrowed */
    float *dscratch;           /* (4 * world + 16) doubles' room for small collectives */
    /* checkpoint staging (strategy.h): buf[0] whole parameters, buf[1 + i] optimiser state i,
     * in the local model's layout; backend memory charged as "other", resident from open to
     * start and from a gather_state to the next step, given back (mem_release) in between */
    dt_staging ck;
    size_t gp, gg;             /* the granules of the flat parameter and gradient buffers
                                  (dt_mem_granule; 0: they cannot give memory back) */
    uint64_t g_sync, g_pref, forwards; /* gathers waited for at once, served by a prefetch;
                                          forward passes */
    size_t pk_params, pk_grads; /* the most parameter / gradient bytes resident (allocator's
                                   categories) seen right after each window took its pages */
} z3_impl;

static dt_backend *be_of(dt_dpsync *s) { return s->be; }

/* ---- memory helpers ----------------------------------------------------------------------- */

/* Gives back block k's range of the flat buffer base (granule g, 0: nothing): the granules
 * wholly inside it and, at each end, the granule it shares with its neighbours when none of the
 * blocks overlapping that granule is in use (live[j]: their contents must stay). The range's
 * contents are gone (undefined after the next commit). */
static void release_block(dt_dpsync *s, z3_impl *z, float *base, size_t g, const bool *live,
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
static void grad_begin(dt_dpsync *s, z3_impl *z, int k)
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
static void grad_end(dt_dpsync *s, z3_impl *z, int k)
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

static void pf_drop(dt_dpsync *s, z3_impl *z)
{
    if (z->pf_work) {
        dt_comm_wait(z->c, z->pf_work, NULL);
        z->pf_work = NULL;
    }
    z->pf_block = -1;
    z->pf_ready = false;
}

static void issue_gather(dt_dpsync *s, z3_impl *z, int k, bool async, const char *why)
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
static void bring_in(dt_dpsync *s, z3_impl *z, int k, const char *why)
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

static void release_params(dt_dpsync *s, z3_impl *z, int k)
{
    if (!z->valid[k])
        return;
    z->valid[k] = false;
    release_block(s, z, s->model->params, z->gp, z->valid, k);
}

/* ---- gradients ---------------------------------------------------------------------------- */

static void wait_send(dt_dpsync *s, z3_impl *z, int i)
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

static void scatter_grads(dt_dpsync *s, z3_impl *z, int k)
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
    dt_dpsync *s = z->s;
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
static void drop_all(dt_dpsync *s, z3_impl *z)
{
    pf_drop(s, z);
    for (int k = 0; k < z->nb; k++)
        release_params(s, z, k);
}

/* ---- small collectives -------------------------------------------------------------------- */

/* One double per rank, gathered bit for bit, summed in rank order. */
static int sum_double(dt_dpsync *s, z3_impl *z, double v, double *sum, dt_err *err)
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
static int check_model(dt_dpsync *s, z3_impl *z, dt_err *err)
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

static int build_layout(dt_dpsync *s, z3_impl *z, dt_err *err)
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
        !(z->st_src = calloc((size_t)(m->num_tensors + 2 * z->nb), sizeof *z->st_src)) ||
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
            z->st_src[z->nst] = t;
            dt_tensor_info *o = &z->st[z->nst++];
            *o = *ti;
            o->ndim = 1;
            o->shape[0] = (int64_t)(hi - lo);
            o->offset = at + (lo - b->off);
            o->numel = hi - lo;
            got += hi - lo;
        }
        if (got < c) {
            z->st_src[z->nst] = -1;
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
static void slice(dt_dpsync *s, z3_impl *z, const float *full, float *shard)
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
static int unslice(dt_dpsync *s, z3_impl *z, const float *shard, float *full, dt_err *err)
{
    dt_backend *be = be_of(s);
    for (int k = 0; k < z->nb; k++) {
        int rc = dt_comm_allgather(z->c, shard + z->b[k].at, z->stg, z->b[k].c, DT_FLOAT32,
                                   NULL, err);
        if (rc)
            return rc;
        if (full) /* NULL: the rank takes part in the gathers and keeps nothing */
            be->memcpy_d2d(be, full + z->b[k].lo, z->stg, z->b[k].n * sizeof(float));
    }
    return 0;
}

/* ---- the ops ------------------------------------------------------------------------------ */

static int balloc(dt_backend *be, void **p, size_t bytes, dt_mem_cat cat, dt_err *err)
{
    dt_mem_cat old = dt_mem_tag(be, cat);
    int rc = be->alloc(be, p, bytes ? bytes : 4, err);
    dt_mem_tag(be, old);
    return rc;
}

/* The layout, the shard buffers, y->optim over the shard, the staging holding the initial
 * parameters, the block hook set. Collective over the group. */
static int z3_open(dt_dpsync *s, const dt_dpsync_ctx *ctx, dt_err *err)
{
    z3_impl *z = calloc(1, sizeof *z);
    if (!z)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = z;
    snprintf(s->label, sizeof s->label, "ZeRO-3");
    s->sharded = true;
    z->s = s;
    z->c = s->dp;
    z->pf_block = -1;
    z->N = s->size;
    z->rank = s->rank;
    z->o = *ctx->ddp;
    dt_model *m = s->model;
    dt_backend *be = s->be;
    int rc;
    z->gp = dt_mem_granule(be, m->params);
    z->gg = dt_mem_granule(be, m->grads);
    if (m->num_params < (size_t)z->N)
        return dt_err_set(err, -EINVAL, "ZeRO-3: %zu parameters cannot be sharded over %d ranks",
                          m->num_params, z->N);
    if ((rc = balloc(be, (void **)&z->dscratch, sizeof(double) * (2 * (size_t)z->N + 4),
                     DT_MEM_COMM, err)) ||
        (rc = check_model(s, z, err)) || (rc = build_layout(s, z, err)))
        return rc;
    bool half = z->o.compress != DT_FLOAT32;
    size_t esz = half ? sizeof(uint16_t) : sizeof(float);
    if ((rc = balloc(be, (void **)&z->ps, z->shard_n * sizeof(float), DT_MEM_PARAMS, err)) ||
        (rc = balloc(be, (void **)&z->stg, z->max_pad * sizeof(float), DT_MEM_PARAMS, err)) ||
        (rc = balloc(be, (void **)&z->sg, z->shard_n * sizeof(float), DT_MEM_GRADS, err)) ||
        (half && (rc = balloc(be, (void **)&z->sg16, z->shard_n * sizeof(uint16_t), DT_MEM_COMM,
                              err))) ||
        (rc = balloc(be, &z->send[0], z->max_pad * esz, DT_MEM_COMM, err)) ||
        (rc = balloc(be, &z->send[1], z->max_pad * esz, DT_MEM_COMM, err)))
        return dt_err_prefix(err, "ZeRO-3: ");
    dt_optim_range all = {0, z->shard_n, 0};
    if ((rc = dt_optim_create_ranges(&s->optim, ctx->optim, be, z->st, z->nst, z->shard_n, &all,
                                     1, z->shard_n, err)))
        return rc;
    /* checkpoint staging (zeroed: the optimiser state when nothing is loaded); the model's
     * initial parameters wait there for start (a resume overwrites them), and the flat buffers
     * give their memory back */
    if ((rc = dt_staging_alloc(&z->ck, be, 1 + s->optim->num_states, m->num_params, err)))
        return dt_err_prefix(err, "ZeRO-3: ");
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
    if (ctx->announce)
        DT_INFO("ZeRO stage 3: %zu parameters in %d blocks, this rank's shard %zu (%.1f%%); "
                "gathered per block (largest padded block %zu); the flat buffers give memory "
                "back in granules of %zu bytes (parameters) and %zu (gradients)",
                m->num_params, z->nb, z->shard_n,
                100.0 * (double)z->shard_n / (double)m->num_params, z->max_pad, z->gp, z->gg);
    return 0;
}

/* Waits for what is in flight, frees, clears the block hook, then the optimiser. */
static void z3_close(dt_dpsync *s)
{
    z3_impl *z = s->impl;
    if (z) {
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
        dt_staging_free(&z->ck, be);
        free(z->b);
        free(z->st);
        free(z->st_src);
        free(z->fseq);
        free(z->bseq);
        free(z->valid);
        free(z->gz);
        free(z->bw_seen);
        free(z->held);
        free(z->due);
        if (s->model->block_hook == hook && s->model->block_hook_ctx == z)
            dt_model_set_block_hook(s->model, NULL, NULL);
        free(z);
    }
    dt_optim_free(s->optim);
}

/* The staging of buffer k, usable (committed, contents undefined, where a save's gather left it
 * out: ranks other than group rank 0); NULL when it cannot be (the reason logged). */
static float *z3_local(dt_dpsync *s, int k)
{
    z3_impl *z = s->impl;
    dt_err err = {0};
    if (dt_staging_commit(&z->ck, s->be, &err)) {
        DT_ERROR("ZeRO-3: %s", err.msg);
        return NULL;
    }
    return z->ck.buf[k];
}

/* Group rank 0's parameters (its initialisation, or what every rank loaded) and buffers; this
 * rank's shard of them and of the optimiser state. */
static int z3_start(dt_dpsync *s, dt_err *err)
{
    z3_impl *z = s->impl;
    dt_model *m = s->model;
    int rc;
    drop_all(s, z);
    if ((rc = dt_comm_broadcast(z->c, z->ck.buf[0], m->num_params, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO-3: broadcasting rank 0's parameters: ");
    if (m->num_buffers &&
        (rc = dt_comm_broadcast(z->c, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO-3: broadcasting rank 0's buffers: ");
    slice(s, z, z->ck.buf[0], z->ps);
    for (int i = 0; i < s->optim->num_states; i++)
        slice(s, z, z->ck.buf[1 + i], s->optim->states[i].buf);
    dt_staging_release(&z->ck, s->be);
    return 0;
}

/* Every block's gradient range given back; each is committed and zeroed again at its first
 * backward window. */
static void z3_zero_grads(dt_dpsync *s)
{
    z3_impl *z = s->impl;
    memset(z->gz, 0, sizeof *z->gz * (size_t)z->nb);
    if (z->gg)
        s->be->mem_release(s->be, s->model->grads, 0, s->model->num_params * sizeof(float));
}

/* A pass begins (forward): the windows count from the start again. */
static void z3_forward_begin(dt_dpsync *s, bool training)
{
    z3_impl *z = s->impl;
    z->forwards++;
    z->in_bwd = false;
    z->pos = 0;
    z->training = training;
}

/* The forward's windows recorded (its first); the first error of its hooks. Evaluation gives
 * every block back and clears the error; training keeps the blocks for its backward (a
 * failure gives them back: no backward follows). */
static int z3_forward_end(dt_dpsync *s, int rc, dt_err *err)
{
    z3_impl *z = s->impl;
    pass_end(z, false, rc);
    if (!z->training) {
        drop_all(s, z);
        if (!rc && z->rc) {
            rc = z->rc;
            *err = z->err;
            z->rc = 0;
        }
        return rc;
    }
    if (!rc && z->rc)
        rc = z->rc, *err = z->err;
    if (rc)
        drop_all(s, z);
    return rc;
}

/* last: this backward's blocks are reduce-scattered as their gradients become final. */
static void z3_backward_begin(dt_dpsync *s, bool last)
{
    z3_impl *z = s->impl;
    z->last = last;
    if (last)
        memset(z->bw_seen, 0, sizeof *z->bw_seen * (size_t)z->nb);
}

static int z3_backward_end(dt_dpsync *s, int rc, dt_err *err)
{
    z3_impl *z = s->impl;
    pass_end(z, true, rc);
    z->in_bwd = false;
    drop_all(s, z);
    if (!rc && z->rc)
        rc = z->rc, *err = z->err;
    return rc;
}

static void z3_drop(dt_dpsync *s) { drop_all(s, s->impl); }

/* The gradients of the block holding that tensor wait, after the final backward, until finish
 * has had them summed elsewhere. */
static int z3_hold(dt_dpsync *s, int tensor, dt_err *err)
{
    z3_impl *z = s->impl;
    const dt_model *m = s->model;
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

/* The held blocks (summed by the layout first) reduce-scattered, then every reduce-scatter
 * waited for and the shard finished (16-bit payloads converted, padding zeroed); buffers from
 * group rank 0 when ddp.broadcast_buffers. */
static int z3_finish(dt_dpsync *s, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                     dt_err *err)
{
    z3_impl *z = s->impl;
    dt_backend *be = s->be;
    int rc = sum ? sum(ctx, err) : 0;
    if (rc)
        return rc;
    for (int k = z->nb - 1; k >= 0 && z->held; k--) /* the same order on every rank */
        if (z->due[k]) {
            z->due[k] = false;
            scatter_grads(s, z, k);
        }
    double t0 = dt_now_s();
    wait_send(s, z, 0);
    wait_send(s, z, 1);
    *wait_s = dt_now_s() - t0;
    rc = z->rc;
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

/* Mean over the group, as DDP's (float64 all-reduce, averaged by the collective). */
static int z3_average(dt_dpsync *s, double *v, int n, dt_err *err)
{
    z3_impl *z = s->impl;
    dt_backend *be = s->be;
    for (int k = 0; k < n; k += 2) {
        int m = DT_MIN(2, n - k);
        be->memcpy_h2d(be, z->dscratch, v + k, (size_t)m * sizeof(double));
        int rc = dt_comm_allreduce(z->c, z->dscratch, (size_t)m, DT_FLOAT64, DT_AVG, NULL, err);
        if (rc)
            return rc;
        be->memcpy_d2h(be, v + k, z->dscratch, (size_t)m * sizeof(double));
    }
    return 0;
}

static void z3_scale(dt_dpsync *s, float f)
{
    z3_impl *z = s->impl;
    s->be->scale(s->be, z->sg, z->shard_n, f);
}

/* The shard's sum of squares: the whole shard as one sum (counted NULL), or one sum per part of
 * it that is a counted tensor (the shard's own tensor table, each entry a part of one of the
 * model's tensors; the padding, zero, is left out), summed over the ranks in rank order. */
static int z3_sumsq(dt_dpsync *s, const unsigned char *counted, double *sum, dt_err *err)
{
    z3_impl *z = s->impl;
    double mine = 0;
    if (!counted) {
        mine = s->be->sumsq(s->be, z->sg, z->shard_n);
    } else {
        for (int t = 0; t < z->nst; t++) {
            const dt_tensor_info *ti = &z->st[t];
            if (z->st_src[t] >= 0 && counted[z->st_src[t]] && ti->numel)
                mine += s->be->sumsq(s->be, z->sg + ti->offset, ti->numel);
        }
    }
    return sum_double(s, z, mine, sum, err);
}

/* The optimiser's update of the shard (local: the next forward gathers it). */
static int z3_step(dt_dpsync *s, double lr, dt_err *err)
{
    (void)err;
    z3_impl *z = s->impl;
    dt_staging_release(&z->ck, s->be); /* the trainer fenced the last save's copy */
    drop_all(s, z);
    dt_optim_step(s->optim, z->ps, z->sg, lr);
    return 0;
}

/* The whole parameters and state in the staging of group rank 0 only (the one whose tensors a
 * whole-tensor checkpoint writes; see dpsync.h): the others take part in the gathers through
 * the block staging and hold nothing whole. */
static int z3_gather_state(dt_dpsync *s, dt_err *err)
{
    z3_impl *z = s->impl;
    bool root = s->rank == 0;
    int rc = root ? dt_staging_commit(&z->ck, s->be, err) : 0; /* every element written below */
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: ");
    pf_drop(s, z); /* stg carries the gathers below */
    rc = unslice(s, z, z->ps, root ? z->ck.buf[0] : NULL, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO-3: gathering the parameters: ");
    for (int i = 0; i < s->optim->num_states; i++)
        if ((rc = unslice(s, z, s->optim->states[i].buf, root ? z->ck.buf[1 + i] : NULL, err)))
            return dt_err_prefix(err, "ZeRO-3: gathering %s: ", s->optim->states[i].name);
    return 0;
}

/* This rank's chunk of every block, in the shard (ps for the parameters, the optimiser's
 * state buffers for the rest). */
static int z3_owned(dt_dpsync *s, int k, dt_dpsync_piece *out, int cap, int *n)
{
    z3_impl *z = s->impl;
    const float *base = k == 0 ? z->ps : s->optim->states[k - 1].buf;
    int c = 0;
    for (int b = 0; b < z->nb; b++) {
        if (!z->b[b].mn)
            continue;
        if (c < cap)
            out[c] = (dt_dpsync_piece){z->b[b].off, z->b[b].mn, base + z->b[b].at};
        c++;
    }
    *n = c;
    return c > cap ? -ENOSPC : 0;
}

/* From the allocator's categories. */
static void z3_mem(dt_dpsync *s, dt_dpsync_mem *out)
{
    const z3_impl *z = s->impl;
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

const dt_dpsync_ops dt_dpsync_zero3_ops = {
    .name = "zero-3",
    .zero_stage = 3,
    .needs_group = true,
    .open = z3_open,
    .start = z3_start,
    .zero_grads = z3_zero_grads,
    .forward_begin = z3_forward_begin,
    .forward_end = z3_forward_end,
    .backward_begin = z3_backward_begin,
    .backward_end = z3_backward_end,
    .drop = z3_drop,
    .hold = z3_hold,
    .finish = z3_finish,
    .average = z3_average,
    .scale = z3_scale,
    .sumsq = z3_sumsq,
    .step = z3_step,
    .local = z3_local,
    .gather_state = z3_gather_state,
    .owned = z3_owned,
    .mem = z3_mem,
    .close = z3_close,
};
