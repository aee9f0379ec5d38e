/* sampler.c - the distributed sampler and the global batch (see sampler.h). */
#include "runtime/train/data/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/util.h"

/* ---- the sampler ---------------------------------------------------------------------------- */

int dt_sampler_init(dt_sampler *s, int64_t n, int rank, int world_size, int batch_size,
                    uint64_t seed, bool shuffle, bool drop_last, dt_err *err)
{
    memset(s, 0, sizeof *s);
    if (n <= 0 || world_size < 1 || rank < 0 || rank >= world_size || batch_size < 1)
        return dt_err_set(err, -EINVAL, "sampler: bad arguments (n=%lld rank=%d world=%d B=%d)",
                          (long long)n, rank, world_size, batch_size);
    int64_t global = (int64_t)world_size * batch_size;
    if (drop_last && n < global)
        return dt_err_set(err, -EINVAL,
                          "the training set has %lld samples, fewer than one step needs (%d rank%s "
                          "x batch_size %d = %lld) with data.drop_last = true; lower "
                          "train.batch_size, or set data.drop_last = false to repeat samples",
                          (long long)n, world_size, world_size == 1 ? "" : "s", batch_size,
                          (long long)global);
    s->n = n;
    s->rank = rank;
    s->world_size = world_size;
    s->batch_size = batch_size;
    s->seed = seed;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->perm_epoch = -1;
    return 0;
}

void dt_sampler_free(dt_sampler *s)
{
    if (!s)
        return;
    free(s->perm);
    s->perm = NULL;
    s->perm_epoch = -1;
}

int64_t dt_sampler_steps_per_epoch(const dt_sampler *s)
{
    int64_t g = s->gb.global > 0 ? s->gb.global : (int64_t)s->world_size * s->batch_size;
    return s->drop_last ? s->n / g : (s->n + g - 1) / g;
}

void dt_sampler_set_state(dt_sampler *s, int64_t epoch, int64_t pos)
{
    s->epoch = epoch < 0 ? 0 : epoch;
    s->pos = pos < 0 ? 0 : pos;
}

/* Starts the next epoch when a step of g positions does not fit the current one (see data.h),
 * and makes the permutation of the (new) epoch. */
static int sampler_begin(dt_sampler *s, int64_t g, dt_err *err)
{
    if (s->drop_last ? s->pos + g > s->n : s->pos >= s->n) {
        s->epoch++;
        s->pos = 0;
    }
    if (s->shuffle && s->perm_epoch != s->epoch) {
        if (!s->perm && !(s->perm = malloc(sizeof(uint64_t) * (size_t)s->n)))
            return dt_err_set(err, -ENOMEM, "out of memory for the order of %lld samples",
                              (long long)s->n);
        dt_rng r;
        dt_rng_seed2(&r, s->seed, (uint64_t)s->epoch);
        dt_rng_permutation(&r, s->perm, (size_t)s->n);
        s->perm_epoch = s->epoch;
    }
    return 0;
}

int dt_sampler_next(dt_sampler *s, int64_t *idx, dt_err *err)
{
    int64_t g = (int64_t)s->world_size * s->batch_size;
    int rc = sampler_begin(s, g, err);
    if (rc)
        return rc;
    for (int j = 0; j < s->batch_size; j++) {
        int64_t p = (s->pos + (int64_t)j * s->world_size + s->rank) % s->n; /* wrap = padding */
        idx[j] = s->shuffle ? (int64_t)s->perm[p] : p;
    }
    s->pos += g;
    return 0;
}

int dt_sampler_set_global(dt_sampler *s, const dt_gbatch *g, dt_err *err)
{
    if (g->global < 1 || g->world != s->world_size || g->cap != s->batch_size)
        return dt_err_set(err, -EINVAL, "sampler: a global batch of %lld over %d ranks of %d "
                                        "does not fit a sampler of %d ranks of %d",
                          (long long)g->global, g->world, g->cap, s->world_size, s->batch_size);
    if (s->drop_last && s->n < g->global)
        return dt_err_set(err, -EINVAL,
                          "the training set has %lld samples, fewer than one step needs "
                          "(train.global_batch = %lld) with data.drop_last = true; lower "
                          "train.global_batch, or set data.drop_last = false to repeat samples",
                          (long long)s->n, (long long)g->global);
    s->gb = *g;
    return 0;
}

int dt_sampler_next_step(dt_sampler *s, int64_t *idx, dt_err *err)
{
    const dt_gbatch *g = &s->gb;
    if (g->global < 1)
        return dt_err_set(err, -EINVAL, "sampler: not in global-batch mode");
    int rc = sampler_begin(s, g->global, err);
    if (rc)
        return rc;
    int64_t k = 0;
    for (int m = 0; m < g->micro_steps; m++) {
        /* micro-step m: positions [base, base + g_m), interleaved over the ranks */
        int64_t base = s->pos + dt_gbatch_micro_offset(g, m);
        int cnt = dt_gbatch_rank_count(g, m, s->rank);
        for (int j = 0; j < cnt; j++) {
            int64_t p = (base + (int64_t)j * s->world_size + s->rank) % s->n; /* wrap = padding */
            idx[k++] = s->shuffle ? (int64_t)s->perm[p] : p;
        }
    }
    s->pos += g->global;
    return 0;
}

/* ---- the global batch ------------------------------------------------------------------------ */

int dt_gbatch_init(dt_gbatch *g, int64_t global, int world, int cap, dt_err *err)
{
    memset(g, 0, sizeof *g);
    if (world < 1 || cap < 1 || global < 1)
        return dt_err_set(err, -EINVAL, "global batch: bad arguments (G=%lld world=%d B=%d)",
                          (long long)global, world, cap);
    if (global < world)
        return dt_err_set(err, -EINVAL,
                          "train.global_batch = %lld is smaller than the %d data-parallel ranks "
                          "of this run: every rank needs at least one sample per step; raise "
                          "train.global_batch to at least %d, or run on at most %lld ranks",
                          (long long)global, world, world, (long long)global);
    int64_t per = (int64_t)world * cap;
    int64_t m = (global + per - 1) / per;
    if (m > 1000000)
        return dt_err_set(err, -EINVAL,
                          "train.global_batch = %lld needs %lld micro-steps of %d ranks x "
                          "batch_size %d: raise train.batch_size",
                          (long long)global, (long long)m, world, cap);
    g->global = global;
    g->world = world;
    g->cap = cap;
    g->micro_steps = (int)m;
    return 0;
}

/* Whether the micro-steps split G evenly (every one of them then has at least W samples: always
 * unless batch_size is 1 and W does not divide G), or are full but the last. */
static bool gbatch_even(const dt_gbatch *g)
{
    return g->global / g->micro_steps >= g->world;
}

int64_t dt_gbatch_micro_size(const dt_gbatch *g, int m)
{
    if (gbatch_even(g))
        return g->global / g->micro_steps + (m < g->global % g->micro_steps ? 1 : 0);
    int64_t full = (int64_t)g->world * g->cap;
    return m < g->micro_steps - 1 ? full : g->global - full * (g->micro_steps - 1);
}

int64_t dt_gbatch_micro_offset(const dt_gbatch *g, int m)
{
    if (gbatch_even(g)) {
        int64_t q = g->global / g->micro_steps, r = g->global % g->micro_steps;
        return (int64_t)m * q + DT_MIN((int64_t)m, r);
    }
    return (int64_t)m * g->world * g->cap;
}

int dt_gbatch_rank_count(const dt_gbatch *g, int m, int rank)
{
    int64_t gm = dt_gbatch_micro_size(g, m);
    return (int)(gm / g->world + (rank < gm % g->world ? 1 : 0));
}

int dt_gbatch_rank_micro_steps(const dt_gbatch *g, int rank)
{
    int n = 0;
    while (n < g->micro_steps && dt_gbatch_rank_count(g, n, rank) > 0)
        n++;
    return n;
}

int64_t dt_gbatch_rank_samples(const dt_gbatch *g, int rank)
{
    int64_t n = 0;
    for (int m = 0; m < g->micro_steps; m++)
        n += dt_gbatch_rank_count(g, m, rank);
    return n;
}

void dt_eval_indices(int64_t n, int rank, int world_size, int batch_size, int64_t k, int64_t *idx)
{
    int64_t g = (int64_t)world_size * batch_size;
    for (int j = 0; j < batch_size; j++)
        idx[j] = (k * g + (int64_t)j * world_size + rank) % n;
}
