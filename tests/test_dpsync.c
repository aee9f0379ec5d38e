/* test_dpsync.c - the data-parallel sync's checkpoint views (dpsync.h): what each rank owns
 * against what a save gathers, for every flavour and under every layout that holds one.
 *
 * Every run is N forked ranks driving the real trainer on a job from configs/ (the layout and
 * the sync are the registry's choice, as in a run), a few steps, then on every rank: the sync's
 * gather_state, its local buffers k = 0 (parameters) .. num_states (optimiser state), and the
 * pieces it owns of each (dt_dpsync_owned), into shared memory. The parent checks, per
 * data-parallel group (the ranks with the same tensor and pipeline coordinates):
 *   - every piece lies inside the local layout [0, num_params) and holds, bit for bit, what the
 *     gathered local buffer holds there (what a sharded checkpoint would write is what today's
 *     whole-tensor checkpoint writes);
 *   - a sharded flavour's pieces over the group's ranks cover every element exactly once; a
 *     replicated flavour's pieces cover every element once on every rank;
 *   - every rank of the group gathered the same local buffers;
 *   - owned with too small a room is -ENOSPC and says how many pieces it needs;
 *   - the flavour the registry chose, its label, and its figures (zero_stage, the reducer's
 *     statistics where it has a reducer) are what the job asked for.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define MAX_RANKS 4
#define MAX_PER 12288  /* local parameters per rank (checked) */
#define MAX_PIECES 256 /* owned pieces per buffer (checked) */
#define MAX_BUF 3      /* parameters + two optimiser states (AdamW) */

#define fmt dt_test_fmt

typedef struct rank_out {
    int status;
    char msg[1200];
    char strategy[16], sync[16], label[16];
    bool replicated, sharded;
    int dp, D, tp, pp;         /* grid coordinates */
    int group_rank, group_size; /* the sync's */
    int zero_stage;            /* dt_strategy_get_mem's */
    int stats_rc;              /* dt_strategy_sync_stats' */
    int small_rc, small_n;     /* owned(0) with room for no piece */
    size_t num_params;
    int nbuf;
    float local[MAX_BUF][MAX_PER];
    int npieces[MAX_BUF];
    size_t off[MAX_BUF][MAX_PIECES], n[MAX_BUF][MAX_PIECES];
    float owned[MAX_BUF][MAX_PER]; /* the pieces' data, one after the other */
} rank_out;

typedef struct drun {
    const char *config;
    const char *ov[24];
    int nov;
    int N, steps;
    char name[64];
    char dir[PATH_MAX];
    int port;
    rank_out *out;
} drun;

static void add(drun *r, const char *ov) { r->ov[r->nov++] = ov; }

static drun base(const char *config, int N, const char *name)
{
    drun r;
    memset(&r, 0, sizeof r);
    r.config = config;
    r.N = N;
    r.steps = 3;
    snprintf(r.name, sizeof r.name, "%s", name);
    add(&r, "job.device=cpu");
    add(&r, "train.threads=1");
    add(&r, "job.cpu_bind=none");
    add(&r, "checkpoint.resume=never");
    add(&r, "checkpoint.every=0");
    add(&r, "checkpoint.async=false");
    add(&r, "ddp.timeout=20");
    add(&r, "train.warmup_steps=1");
    add(&r, fmt("elastic.nproc_per_node=%d", N)); /* the world the loader checks T x P against */
    return r;
}

/* mlp.ini at 64*13+13 + 13*7+7 + 7*10+10 = 1023 parameters: 2 and 4 do not divide it. */
static drun tiny_mlp(int N, int zero)
{
    drun r = base("mlp.ini", N, fmt("mlp-z%d-n%d", zero, N));
    add(&r, "model.hidden=13,7");
    add(&r, "train.batch_size=4");
    add(&r, fmt("parallel.zero=%d", zero));
    return r;
}

static drun tiny_gpt(int N, int zero, const char *name)
{
    drun r = base("quickstart.ini", N, name);
    add(&r, "model.n_layer=2");
    add(&r, "model.n_head=2");
    add(&r, "model.n_embd=16");
    add(&r, "model.block_size=16");
    add(&r, "data.seq_len=16");
    add(&r, "train.batch_size=4");
    add(&r, fmt("parallel.zero=%d", zero));
    return r;
}

static int record(dt_trainer *t, rank_out *o, dt_err *err)
{
    dt_strategy *s = t->s;
    dt_dpsync *y = s->sync;
    if (!y)
        return dt_err_set(err, -EINVAL, "the %s layout holds no data-parallel sync",
                          s->ops->name);
    dt_strlcpy(o->strategy, s->ops->name, sizeof o->strategy);
    dt_strlcpy(o->sync, y->ops->name, sizeof o->sync);
    dt_strlcpy(o->label, y->label, sizeof o->label);
    o->replicated = y->ops->replicated;
    o->sharded = y->sharded;
    o->dp = t->grid.dp;
    o->D = t->grid.D;
    o->tp = t->grid.tp;
    o->pp = t->grid.pp;
    o->group_rank = y->rank;
    o->group_size = y->size;
    dt_strategy_mem mem;
    dt_strategy_get_mem(s, &mem);
    o->zero_stage = mem.zero_stage;
    dt_ddp_stats st;
    o->stats_rc = dt_strategy_sync_stats(s, &st);
    o->num_params = y->model->num_params;
    o->nbuf = 1 + y->optim->num_states;
    if (o->num_params > MAX_PER || o->nbuf > MAX_BUF)
        return dt_err_set(err, -E2BIG, "%zu parameters, %d buffers: raise MAX_PER, MAX_BUF",
                          o->num_params, o->nbuf);
    int rc = dt_dpsync_gather_state(y, err);
    if (rc)
        return rc;
    dt_dpsync_piece none[1];
    o->small_rc = dt_dpsync_owned(y, 0, none, 0, &o->small_n);
    dt_backend *be = y->be;
    for (int k = 0; k < o->nbuf; k++) {
        be->memcpy_d2h(be, o->local[k], dt_dpsync_local(y, k), o->num_params * sizeof(float));
        dt_dpsync_piece p[MAX_PIECES];
        int n = 0;
        if ((rc = dt_dpsync_owned(y, k, p, MAX_PIECES, &n)))
            return dt_err_set(err, rc, "owned(%d): %d pieces, room for %d", k, n, MAX_PIECES);
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            if (p[i].off + p[i].n > o->num_params || at + p[i].n > MAX_PER)
                return dt_err_set(err, -ERANGE, "owned(%d) piece %d: [%zu, %zu) of %zu", k, i,
                                  p[i].off, p[i].off + p[i].n, o->num_params);
            o->off[k][i] = p[i].off;
            o->n[k][i] = p[i].n;
            be->memcpy_d2h(be, o->owned[k] + at, p[i].data, p[i].n * sizeof(float));
            at += p[i].n;
        }
        o->npieces[k] = n;
    }
    return 0;
}

static void rank_body(drun *r, int rank)
{
    static dt_job job;
    static dt_trainer t;
    rank_out *o = &r->out[rank];
    dt_err err = {0};
    if (dt_test_trainer_start(&t, &job, r->config, r->ov, r->nov, r->dir, r->name, rank, r->N,
                              r->port, o->msg, sizeof o->msg) != 0) {
        o->status = 2;
        _exit(2);
    }
    for (int k = 0; k < r->steps; k++)
        if (dt_trainer_step(&t, &err) != 0)
            goto fail;
    if (record(&t, o, &err) != 0)
        goto fail;
    dt_trainer_close(&t);
    _exit(0);
fail:
    dt_strlcpy(o->msg, err.msg, sizeof o->msg);
    o->status = 2;
    _exit(2);
}

static void run_rank(int rank, int n, void *arg)
{
    (void)n;
    rank_body(arg, rank);
}

/* Runs r and checks its views; sync and label: what the registry must have chosen. */
static void check(drun *r, const char *sync, const char *label, int zero_stage)
{
    int status[MAX_RANKS];
    DT_REQUIRE(r->N <= MAX_RANKS);
    r->out = dt_test_shared_map(sizeof(rank_out) * (size_t)r->N);
    dt_strlcpy(r->dir, dt_test_tmpdir(), sizeof r->dir);
    dt_test_run_ranks(r->name, r->N, &r->port, run_rank, r, 150, status);
    if (!dt_test_ranks_ok(r->name, status, r->N, r->out[0].msg, sizeof(rank_out)))
        goto out;
    int *cover = malloc(sizeof(int) * MAX_PER);
    for (int a = 0; a < r->N; a++) {
        const rank_out *o = &r->out[a];
        DT_CHECK_STR(o->sync, sync);
        DT_CHECK_STR(o->label, label);
        DT_CHECK_INT(o->zero_stage, zero_stage);
        DT_CHECK_INT(o->sharded, !o->replicated);
        DT_CHECK_INT(o->group_size, o->D);
        DT_CHECK_INT(o->group_rank, o->dp);
        /* a reducer's statistics where there is one (ddp, zero-1/2) */
        DT_CHECK_INT(o->stats_rc, zero_stage == 3 || !strcmp(sync, "none") ? -ENOTSUP : 0);
        DT_CHECK_MSG(o->small_rc == -ENOSPC && o->small_n == o->npieces[0] && o->small_n > 0,
                     "%s rank %d: owned with no room: %d, %d pieces (%d owned)", r->name, a,
                     o->small_rc, o->small_n, o->npieces[0]);
    }
    /* per data-parallel group: the ranks that hold the same part of the model */
    for (int lead = 0; lead < r->N; lead++) {
        const rank_out *l = &r->out[lead];
        if (l->dp != 0)
            continue;
        for (int k = 0; k < l->nbuf; k++) {
            memset(cover, 0, sizeof(int) * MAX_PER);
            int members = 0;
            for (int a = 0; a < r->N; a++) {
                const rank_out *o = &r->out[a];
                if (o->tp != l->tp || o->pp != l->pp)
                    continue;
                members++;
                /* ZeRO gathers on the group's rank 0 only (the writer of a whole-tensor
                 * checkpoint) what it shards: zero-1/2 the optimiser state, zero-3 everything;
                 * the others hold nothing whole of it */
                bool whole_here = zero_stage == 0 || (k == 0 && zero_stage < 3);
                DT_CHECK_INT(o->num_params, l->num_params);
                DT_CHECK_MSG(!whole_here || !memcmp(o->local[k], l->local[k],
                                                    l->num_params * sizeof(float)),
                             "%s: buffer %d gathered differently on rank %d and rank %d",
                             r->name, k, a, lead);
                size_t at = 0;
                int *mine = calloc(MAX_PER, sizeof(int));
                for (int i = 0; i < o->npieces[k]; i++) {
                    size_t off = o->off[k][i], n = o->n[k][i];
                    DT_CHECK_MSG(!memcmp(o->owned[k] + at, l->local[k] + off,
                                         n * sizeof(float)),
                                 "%s rank %d buffer %d: piece [%zu, %zu) is not what the save "
                                 "gathers there", r->name, a, k, off, off + n);
                    for (size_t e = off; e < off + n; e++) {
                        cover[e]++;
                        mine[e]++;
                    }
                    at += n;
                }
                if (o->replicated)
                    for (size_t e = 0; e < o->num_params; e++)
                        DT_CHECK_MSG(mine[e] == 1, "%s rank %d buffer %d: element %zu owned "
                                     "%d times by a replica", r->name, a, k, e, mine[e]);
                free(mine);
            }
            DT_CHECK_INT(members, l->D);
            for (size_t e = 0; e < l->num_params && !l->replicated; e++)
                DT_CHECK_MSG(cover[e] == 1, "%s (tp %d, pp %d) buffer %d: element %zu of %zu "
                             "owned by %d ranks", r->name, l->tp, l->pp, k, e, l->num_params,
                             cover[e]);
        }
    }
    free(cover);
    printf("    %-18s %s: %s (%s), %d buffers, %d pieces on rank 0\n", r->name, r->out[0].strategy,
           r->out[0].sync, r->out[0].label[0] ? r->out[0].label : "-", r->out[0].nbuf,
           r->out[0].npieces[0]);
out:
    dt_test_shared_unmap(r->out, sizeof(rank_out) * (size_t)r->N);
    r->out = NULL;
}

static void test_whole_model(void)
{
    drun one = tiny_mlp(1, 0), ddp = tiny_mlp(2, 0);
    check(&one, "none", "", 0);
    check(&ddp, "ddp", "DDP", 0);
    drun z1 = tiny_mlp(3, 1), z2 = tiny_gpt(2, 2, "gpt-z2-n2"), z3 = tiny_mlp(3, 3);
    check(&z1, "zero-1", "ZeRO-1", 1);
    check(&z2, "zero-2", "ZeRO-2", 2);
    check(&z3, "zero-3", "ZeRO-3", 3);
    drun g3 = tiny_gpt(2, 3, "gpt-z3-n2"), o3 = tiny_mlp(1, 3);
    check(&g3, "zero-3", "ZeRO-3", 3);
    check(&o3, "zero-3", "ZeRO-3", 3); /* stage 3 over one rank: it owns everything */
}

/* Under tensor and pipeline parallelism: a sync per data-parallel group, over the rank's
 * slices or stage. */
static void test_split_models(void)
{
    drun tp1 = tiny_gpt(4, 1, "gpt-d2t2-z1");
    add(&tp1, "parallel.tensor=2");
    check(&tp1, "zero-1", "ZeRO-1", 1);
    drun tpd = tiny_gpt(4, 0, "gpt-d2t2-ddp");
    add(&tpd, "parallel.tensor=2");
    check(&tpd, "ddp", "DDP", 0);
    drun pp3 = tiny_gpt(4, 3, "gpt-d2p2-z3");
    add(&pp3, "parallel.pipeline=2");
    add(&pp3, "parallel.micro_batches=2");
    check(&pp3, "zero-3", "ZeRO-3", 3);
    drun pp2 = tiny_gpt(4, 2, "gpt-d2p2-z2");
    add(&pp2, "parallel.pipeline=2");
    add(&pp2, "parallel.micro_batches=2");
    check(&pp2, "zero-2", "ZeRO-2", 2);
    drun t1 = tiny_gpt(2, 3, "gpt-t2-z3-d1"); /* D = 1: nothing to shard over */
    add(&t1, "parallel.tensor=2");
    check(&t1, "none", "", 0);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"whole_model_none_ddp_zero123", test_whole_model, 240},
        {"tensor_and_pipeline_groups", test_split_models, 240},
    };
    return dt_test_main("test_dpsync", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
