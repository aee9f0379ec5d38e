/* plan.c - the planner of `dtrain plan` (see plan.h): the layouts, the probes that measure a
 * rank's model on the cpu backend, the predicted memory and step time, the ranking. The
 * command line, the table and --check are in plan_cmd.c and plan_check.c. */
#include "cmd/plan.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/comm/comm.h"
#include "runtime/train/data/data.h"
#include "runtime/train/models/model.h"
#include "runtime/train/parallel/pp_schedule.h"

#define MIB (1024.0 * 1024.0)

void dt_plan_rates_default(dt_plan_rates *r)
{
    memset(r, 0, sizeof *r);
    /* bench allreduce on this class of host: shared memory ~2 GB/s bus bandwidth for a few
     * MiB, ~30 us a call; loopback TCP ~1 GB/s, ~100 us */
    r->shm_bw = 2e9;
    r->shm_lat = 30e-6;
    r->net_bw = 1e9;
    r->net_lat = 100e-6;
    r->optim_s = 2e-9; /* AdamW's pass over a parameter, its grad and two moments (cpu) */
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->cpus = n > 0 ? (int)n : 1;
}

/* ---- GEMM rates ---------------------------------------------------------------------------- */

/* The best single-thread sgemm rate of M x N x K over about 30 ms of calls. */
static double sgemm_rate(int M, int N, int K)
{
    float *a = calloc((size_t)M * K, sizeof(float)), *b = calloc((size_t)K * N, sizeof(float));
    float *c = calloc((size_t)M * N, sizeof(float));
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)M * K; i++)
            a[i] = (float)(i % 7) * 0.01f;
        for (size_t i = 0; i < (size_t)K * N; i++)
            b[i] = (float)(i % 5) * 0.01f;
        double t_start = dt_now_s();
        int calls = 0;
        do {
            double t0 = dt_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N,
                        0.0f, c, N);
            double t = dt_now_s() - t0;
            if (calls++ > 0 && t > 0 && 2.0 * M * N * K / t > best)
                best = 2.0 * M * N * K / t;
        } while (calls < 3 || dt_now_s() - t_start < 0.03);
    }
    free(a);
    free(b);
    free(c);
    return best;
}

typedef struct rate_cache {
    int M[64], N[64], K[64];
    double r[64];
    int n;
} rate_cache;

static double gemm_rate(rate_cache *rc, const dt_plan_rates *given, int M, int N, int K)
{
    if (given->gemm_flops > 0)
        return given->gemm_flops;
    M = DT_MAX(1, DT_MIN(M, 4096));
    N = DT_MAX(1, DT_MIN(N, 4096));
    K = DT_MAX(1, DT_MIN(K, 4096));
    for (int i = 0; i < rc->n; i++)
        if (rc->M[i] == M && rc->N[i] == N && rc->K[i] == K)
            return rc->r[i];
    double r = sgemm_rate(M, N, K);
    if (r <= 0)
        r = 1e9;
    if (rc->n < 64) {
        rc->M[rc->n] = M;
        rc->N[rc->n] = N;
        rc->K[rc->n] = K;
        rc->r[rc->n++] = r;
    }
    return r;
}

/* ---- probes: one rank's model built on the cpu backend ------------------------------------- */

typedef struct probe {
    int T, P, first, count; /* P 1: no pipeline */
    bool sp, last;
    dt_recompute_kind rc;
    int status;             /* 0 built; else the error, why says it */
    char why[200];
    double params, grads, other;     /* bytes */
    double acts_a, acts_b;           /* activations: acts_a + acts_b x samples */
    double slot_a, slot_b;           /* each further slot: slot_a + slot_b x samples */
    double flops;                    /* forward + backward FLOPs a sample */
    double blk;                      /* bytes of the largest block */
    double pp_in, pp_out;            /* elements a sample received / sent between stages */
} probe;

/* A tensor group of T ranks in this process: threads that each join it (the model's create
 * needs the group's communicator, and never communicates). */
typedef struct tp_group {
    int T;
    dt_comm *c[64];
} tp_group;

typedef struct prober {
    const dt_job *job;
    dt_sample_shape shape;
    dt_backend *be;
    probe *v;
    int n, cap;
    tp_group groups[8];
    int ngroups;
    dt_store_server *srv;
    char run_id[64];
} prober;

typedef struct join_arg {
    prober *pr;
    int T, rank;
    dt_comm **out;
    int rc;
    dt_err err;
} join_arg;

static void *join_main(void *p)
{
    join_arg *a = p;
    dt_store *st = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    so.connect_timeout_ms = 10000;
    so.timeout_ms = 30000;
    a->rc = dt_store_connect(&st, "127.0.0.1", dt_store_server_port(a->pr->srv), &so, &a->err);
    if (a->rc == 0) {
        dt_comm_opts o;
        dt_comm_opts_default(&o);
        o.rank = o.local_rank = a->rank;
        o.world_size = o.local_world_size = a->T;
        o.run_id = a->pr->run_id;
        o.timeout_ms = 30000;
        o.local_addr = "127.0.0.1";
        o.number = 100 + (uint64_t)a->T; /* several ranks of it in this process */
        a->rc = dt_comm_init(a->out, st, &o, &a->err);
    }
    dt_store_free(st);
    return NULL;
}

/* Rank 0 of a tensor group of T ranks, opened on first use. */
static dt_comm *tp_comm(prober *pr, int T, dt_err *err)
{
    for (int i = 0; i < pr->ngroups; i++)
        if (pr->groups[i].T == T)
            return pr->groups[i].c[0];
    if (pr->ngroups == (int)DT_ARRAY_LEN(pr->groups) || T > 64) {
        dt_err_set(err, -EINVAL, "too many tensor degrees to probe");
        return NULL;
    }
    if (!pr->srv) {
        dt_store_server_opts so;
        dt_store_server_opts_default(&so);
        so.host = "127.0.0.1";
        so.port = 0;
        if (dt_store_server_start(&pr->srv, &so, err))
            return NULL;
    }
    tp_group *g = &pr->groups[pr->ngroups];
    memset(g, 0, sizeof *g);
    g->T = T;
    join_arg args[64];
    pthread_t th[64];
    int started = 0;
    for (int r = 0; r < T; r++) {
        args[r] = (join_arg){.pr = pr, .T = T, .rank = r, .out = &g->c[r]};
        if (pthread_create(&th[r], NULL, join_main, &args[r]))
            break;
        started++;
    }
    int bad = started < T ? -EAGAIN : 0;
    for (int r = 0; r < started; r++) {
        pthread_join(th[r], NULL);
        if (args[r].rc && !bad) {
            bad = args[r].rc;
            *err = args[r].err;
        }
    }
    if (bad) {
        for (int r = 0; r < T; r++)
            dt_comm_free(g->c[r]);
        if (bad == -EAGAIN)
            dt_err_set(err, -EAGAIN, "could not start the probe's tensor-group threads");
        return NULL;
    }
    pr->ngroups++;
    return g->c[0];
}

static void mem_now(dt_backend *be, double *cur)
{
    dt_mem_stats st;
    dt_mem_read(be, &st);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        cur[c] = (double)st.cur[c];
}

/* Builds k's model at micro-batches of B samples; what it charged into d[], and its facts. */
static int build(prober *pr, probe *k, int B, double *d, size_t *slot_bytes, dt_err *err)
{
    dt_job j = *pr->job;
    j.recompute = k->rc;
    dt_model_config cfg;
    int rc = dt_model_config_from_job(&cfg, &j, &pr->shape, err);
    if (rc)
        return rc;
    cfg.max_batch = B;
    cfg.tp_size = k->T > 1 ? k->T : 0;
    cfg.tp_rank = 0;
    cfg.sequence_parallel = k->sp;
    if (k->P > 1) {
        cfg.pp_size = k->P;
        cfg.pp_rank = k->first == 0 ? 0 : k->last ? k->P - 1 : 1;
        cfg.pp_first = k->first;
        cfg.pp_count = k->count;
        cfg.pp_slots = 1;
    }
    dt_comm *comm = NULL;
    if (k->T > 1 && !(comm = tp_comm(pr, k->T, err)))
        return err->code ? err->code : -EINVAL;
    double before[DT_MEM_CAT_COUNT], after[DT_MEM_CAT_COUNT];
    mem_now(pr->be, before);
    dt_model *m = NULL;
    if ((rc = dt_model_create(&m, &cfg, pr->be, comm, err)))
        return rc;
    mem_now(pr->be, after);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        d[c] = after[c] - before[c];
    *slot_bytes = m->pp_slot_bytes;
    k->flops = m->flops_per_sample;
    k->blk = 0;
    for (int b = 0; b < m->num_blocks; b++)
        k->blk = fmax(k->blk, 4.0 * (double)m->blocks[b].numel);
    k->pp_in = (double)m->pp_in_numel;
    k->pp_out = (double)m->pp_out_numel;
    if (k->P > 1 && !m->stage) {
        dt_err_set(err, -EINVAL, "the model has no pipeline stages");
        rc = -EINVAL;
    }
    dt_model_free(m);
    return rc;
}

/* The probe of (T, sp, P, first, count, rc), built on first use. NULL only without memory. */
static probe *get_probe(prober *pr, int T, bool sp, int P, int first, int count, bool last,
                        dt_recompute_kind rc)
{
    for (int i = 0; i < pr->n; i++) {
        probe *k = &pr->v[i];
        if (k->T == T && k->sp == sp && (k->P > 1) == (P > 1) && k->first == first &&
            k->count == count && k->last == last && k->rc == rc)
            return k;
    }
    if (pr->n == pr->cap) {
        int cap = pr->cap ? 2 * pr->cap : 32;
        probe *v = realloc(pr->v, sizeof *v * (size_t)cap);
        if (!v)
            return NULL;
        pr->v = v;
        pr->cap = cap;
    }
    probe *k = &pr->v[pr->n++];
    memset(k, 0, sizeof *k);
    *k = (probe){.T = T, .P = P, .first = first, .count = count, .sp = sp, .last = last,
                 .rc = rc};
    double d1[DT_MEM_CAT_COUNT], d2[DT_MEM_CAT_COUNT];
    size_t s1 = 0, s2 = 0;
    dt_err err = {0};
    if ((k->status = build(pr, k, 1, d1, &s1, &err)) ||
        (k->status = build(pr, k, 2, d2, &s2, &err))) {
        dt_strlcpy(k->why, err.msg, sizeof k->why);
        return k;
    }
    k->params = d1[DT_MEM_PARAMS];
    k->grads = d1[DT_MEM_GRADS];
    k->other = d1[DT_MEM_OTHER] + d1[DT_MEM_OPTIM] + d1[DT_MEM_COMM];
    k->acts_b = d2[DT_MEM_ACTS] - d1[DT_MEM_ACTS];
    k->acts_a = d1[DT_MEM_ACTS] - k->acts_b;
    k->slot_b = (double)s2 - (double)s1;
    k->slot_a = (double)s1 - k->slot_b;
    return k;
}

static void prober_close(prober *pr)
{
    for (int i = 0; i < pr->ngroups; i++)
        for (int r = 0; r < pr->groups[i].T; r++)
            dt_comm_free(pr->groups[i].c[r]);
    if (pr->srv)
        dt_store_server_stop(pr->srv);
    dt_backend_close(pr->be);
    free(pr->v);
}

/* ---- prediction ---------------------------------------------------------------------------- */

typedef struct planner {
    const dt_job *job;
    const dt_plan_req *req;
    dt_plan_rates rates;
    rate_cache rc;
    prober pr;
    double optim_k; /* optimiser bytes a parameter byte: adamw 2, sgd with momentum 1, else 0 */
    bool transformer;
    double eff;        /* the model's FLOP/s over the GEMM rate of its shape (calibrate) */
    double model_rate; /* the model's FLOP/s measured at train.batch_size */
    dt_plan *plan;
} planner;

/* The GEMM rate of a transformer's typical product at mb samples a micro-batch under tensor
 * degree T (rows mb x seq, the MLP's 4C/T outputs, C inputs), or of a 256^3 product. */
static double shape_rate(planner *pl, double mb, int T)
{
    const double seq = pl->job->seq_len > 0 ? pl->job->seq_len : 1, C = pl->job->n_embd;
    return pl->transformer ? gemm_rate(&pl->rc, &pl->rates, (int)(mb * seq), (int)(4 * C / T),
                                       (int)C)
                           : gemm_rate(&pl->rc, &pl->rates, 256, 256, 256);
}

/* What share of the GEMM rate the whole model gets (its softmax, norms, attention and
 * element-wise work besides the GEMMs): one process's forward and backward of
 * train.batch_size samples of the job's own data, timed (the best of 3 after a warm-up),
 * against the GEMM rate of its shape. */
static int calibrate(planner *pl, dt_data *data, dt_err *err)
{
    dt_job j = *pl->job;
    j.recompute = DT_RECOMP_NONE;
    dt_model_config cfg;
    int rc = dt_model_config_from_job(&cfg, &j, &data->shape, err);
    if (rc)
        return rc;
    const int B = DT_MAX(1, DT_MIN(j.batch_size, 64));
    cfg.max_batch = B;
    dt_model *m = NULL;
    dt_batch_buf buf = {0};
    int64_t idx[64];
    int64_t size = dt_dataset_size(data->train);
    for (int i = 0; i < B; i++)
        idx[i] = size > 0 ? i % size : 0;
    if ((rc = dt_model_create(&m, &cfg, pl->pr.be, NULL, err)) ||
        (rc = dt_batch_buf_init(&buf, &data->shape, B, err)) ||
        (rc = dt_dataset_fill(data->train, idx, B, &buf, err)))
        goto out;
    double best = HUGE_VAL;
    for (int it = 0; it < 4; it++) {
        float loss = 0;
        double t0 = dt_now_s();
        if ((rc = m->ops->forward(m, &buf.batch, true, &loss, err)) ||
            (rc = m->ops->backward(m, 1.0f, NULL, NULL, err)))
            goto out;
        double t = dt_now_s() - t0;
        if (it > 0)
            best = fmin(best, t);
    }
    pl->model_rate = m->flops_per_sample * B / best;
    pl->eff = pl->model_rate / shape_rate(pl, B, 1);
out:
    dt_batch_buf_free(&buf);
    dt_model_free(m);
    return rc;
}

static void note_excluded(dt_plan *p, const char *why)
{
    p->excluded++;
    for (int i = 0; i < p->n_excluded_why; i++)
        if (!strcmp(p->excluded_why[i], why))
            return;
    if (p->n_excluded_why < (int)DT_ARRAY_LEN(p->excluded_why))
        dt_strlcpy(p->excluded_why[p->n_excluded_why++], why, sizeof p->excluded_why[0]);
}

/* A ring all-reduce of bytes over n ranks on a link. */
static double allreduce_s(double bytes, int n, double bw, double lat)
{
    if (n <= 1 || bytes <= 0)
        return 0;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

static const char *cat_label(int c)
{
    static const char *const names[DT_MEM_CAT_COUNT] = {
        "other", "parameters", "gradients", "optimiser state", "activations", "comm buffers"};
    return c >= 0 && c < DT_MEM_CAT_COUNT ? names[c] : "other";
}

/* Predicts l (its degrees, batch and schedule set) in place. Returns 0, or 1 when it cannot be
 * built (a probe's error: noted as excluded). */
static int predict(planner *pl, dt_plan_layout *l)
{
    const dt_job *job = pl->job;
    const int P = l->pipeline, T = l->tensor, D = l->data, M = l->micro_batches;
    dt_job j = *job;
    j.pipeline = P;
    if (job->pipeline != P)
        j.n_stage_blocks = 0;
    int blocks[DT_MAX_STAGES];
    dt_err err = {0};
    if (P > DT_MAX_STAGES || dt_job_stage_blocks(&j, blocks, &err) < 0) {
        note_excluded(pl->plan, err.msg[0] ? err.msg : "too many pipeline stages");
        return 1;
    }
    const double mb = (double)l->batch_size / M;
    const double seq = job->seq_len > 0 ? job->seq_len : 1, C = job->n_embd;
    const int G = pl->req->nproc;
    const bool multi = pl->req->nnodes > 1;
    /* the data-parallel group spans T x D consecutive ranks of a stage; the pipeline's
     * neighbours are T x D ranks apart */
    const bool dp_net = multi && T * D > G, pp_net = multi && T * D >= G;
    const double ranks_per_cpu = (double)G / DT_MAX(1, pl->rates.cpus);
    const double share = ranks_per_cpu > 1 ? 1.0 / ranks_per_cpu : 1.0;
    double tf[DT_MAX_STAGES], tb[DT_MAX_STAGES];
    double worst_peak = -1, worst_params = 0, comp_max = 0, tp_s_max = 0, pp_s_max = 0;
    int first = 0;
    dt_pp_action *list = NULL;
    int cap = dt_pp_schedule_cap(M);
    if (P > 1 && !(list = calloc((size_t)cap, sizeof *list)))
        return 1;
    for (int s = 0; s < P; s++) {
        probe *k = get_probe(&pl->pr, T, l->sequence_parallel, P, first, blocks[s], s == P - 1,
                             l->recompute);
        first += blocks[s];
        if (!k || k->status) {
            note_excluded(pl->plan, k ? k->why : "out of memory");
            free(list);
            return 1;
        }
        int slots = 1;
        if (P > 1) {
            int nl = 0;
            if (dt_pp_schedule_build(l->schedule, P, M, s, list, cap, &nl, &err) == 0)
                slots = dt_pp_max_in_flight(list, nl);
        }
        double mem[DT_MEM_CAT_COUNT] = {0};
        const double psi = k->params, g = k->grads;
        mem[DT_MEM_ACTS] = k->acts_a + k->acts_b * mb + (slots - 1) * (k->slot_a + k->slot_b * mb);
        mem[DT_MEM_OTHER] = k->other;
        /* the pipeline's receive buffers: one more than the slots */
        mem[DT_MEM_COMM] = k->pp_in * mb * 4.0 * (P > 1 ? slots + 1 : 0);
        if (l->zero == 0 || D == 1) {
            mem[DT_MEM_PARAMS] = psi;
            mem[DT_MEM_GRADS] = g;
            mem[DT_MEM_OPTIM] = pl->optim_k * psi;
        } else if (l->zero < 3) {
            mem[DT_MEM_PARAMS] = psi;
            mem[DT_MEM_GRADS] = g + g / D;
            mem[DT_MEM_OPTIM] = pl->optim_k * psi / D;
            /* the first step moves the shards to the rebuilt buckets through one window of
             * checkpoint.io_buffer_mb (at most the parameters' size) */
            mem[DT_MEM_OTHER] += DT_MIN((double)pl->job->ckpt_io_buffer_mb * 1048576.0, psi);
        } else {
            mem[DT_MEM_PARAMS] = psi / D + 2 * k->blk;
            mem[DT_MEM_GRADS] = g / D + k->blk;
            mem[DT_MEM_OPTIM] = pl->optim_k * psi / D;
            mem[DT_MEM_COMM] += 2 * k->blk;
        }
        double peak = 0;
        for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
            peak += mem[c];
        if (peak > worst_peak) {
            worst_peak = peak;
            memcpy(l->mem, mem, sizeof mem);
            worst_params = psi;
        }

        /* time of one micro-batch on this stage */
        double rate = share * (pl->rates.gemm_flops > 0 ? pl->rates.gemm_flops
                                                        : pl->eff * shape_rate(pl, mb, T));
        double fwd = k->flops * mb / 3.0 / rate, bwd = 2.0 * fwd;
        if (l->recompute == DT_RECOMP_BLOCK)
            bwd += fwd;
        else if (l->recompute == DT_RECOMP_SELECTIVE)
            bwd += 0.05 * fwd;
        double tp_s = 0;
        if (T > 1 && pl->transformer)
            tp_s = (4.0 * blocks[s] + 2) *
                   allreduce_s(mb * seq * C * 4.0, T, pl->rates.shm_bw, pl->rates.shm_lat);
        double bw = pp_net ? pl->rates.net_bw : pl->rates.shm_bw;
        double lat = pp_net ? pl->rates.net_lat : pl->rates.shm_lat;
        double pp_s = (k->pp_in + k->pp_out) * mb * 4.0 / bw + (k->pp_in > 0) * lat +
                      (k->pp_out > 0) * lat;
        tf[s] = fwd + tp_s / 2 + pp_s / 2;
        tb[s] = bwd + tp_s / 2 + pp_s / 2;
        if (fwd + bwd > comp_max) {
            comp_max = fwd + bwd;
            tp_s_max = tp_s;
            pp_s_max = pp_s;
        }
    }
    free(list);
    double makespan = tf[0] + tb[0];
    if (P > 1 && dt_pp_simulate_stages(l->schedule, P, M, tf, tb, &makespan, NULL, &err))
        makespan = M * (tf[0] + tb[0]) * 2; /* cannot happen for a legal P, M */
    const double accum = l->grad_accum;
    double dp = 0;
    if (D > 1) {
        double bw = dp_net ? pl->rates.net_bw : pl->rates.shm_bw;
        double lat = dp_net ? pl->rates.net_lat : pl->rates.shm_lat;
        double buckets = ceil(worst_params / (job->bucket_cap_mb > 0 ? job->bucket_cap_mb * MIB
                                                                     : 25 * MIB));
        dp = allreduce_s(worst_params, D, bw, 0) + buckets * 2.0 * (D - 1) * lat;
        if (l->zero == 3)
            dp *= 1.5; /* all-gathers in forward and backward, a reduce-scatter */
    }
    const double overlap = P > 1 ? 0 : comp_max * 2.0 / 3.0; /* the last backward */
    const double dp_exposed = fmax(0.1 * dp, dp - overlap);
    const double owned = worst_params / 4.0 / (l->zero > 0 ? D : 1);
    l->compute_s = accum * M * comp_max;
    l->comm_s = accum * M * (tp_s_max + pp_s_max) + dp_exposed;
    l->step_s = accum * makespan + dp_exposed + owned * pl->rates.optim_s;
    l->bubble_s = fmax(0, accum * (makespan - M * (comp_max + tp_s_max + pp_s_max)));
    l->peak_bytes = worst_peak;
    l->fits = pl->req->device_memory <= 0 || worst_peak <= pl->req->device_memory;
    if (!l->fits) {
        int big = DT_MEM_PARAMS;
        for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
            if (l->mem[c] > l->mem[big])
                big = c;
        snprintf(l->why, sizeof l->why, "%.2f GiB > budget %.2f GiB (the most: %s %.2f GiB)",
                 worst_peak / (MIB * 1024), pl->req->device_memory / (MIB * 1024),
                 cat_label(big), l->mem[big] / (MIB * 1024));
    }
    return 0;
}

/* ---- enumeration --------------------------------------------------------------------------- */

static int add_layout(dt_plan *p, int *cap, const dt_plan_layout *l)
{
    if (p->n == *cap) {
        int c = *cap ? 2 * *cap : 256;
        dt_plan_layout *v = realloc(p->v, sizeof *v * (size_t)c);
        if (!v)
            return -ENOMEM;
        p->v = v;
        *cap = c;
    }
    p->v[p->n++] = *l;
    return 0;
}

static int cmp_layout(const void *a, const void *b)
{
    const dt_plan_layout *x = a, *y = b;
    if (x->fits != y->fits)
        return x->fits ? -1 : 1;
    double kx = x->fits ? x->step_s : x->peak_bytes, ky = y->fits ? y->step_s : y->peak_bytes;
    if (kx != ky)
        return kx < ky ? -1 : 1;
    /* ties: the less memory, then the simpler layout */
    if (x->peak_bytes != y->peak_bytes)
        return x->peak_bytes < y->peak_bytes ? -1 : 1;
    int sx = x->tensor * 100 + x->pipeline * 10 + x->zero, sy = y->tensor * 100 + y->pipeline * 10 + y->zero;
    return (sx > sy) - (sx < sy);
}

static bool has_tensor_parallel(const dt_job *job)
{
    return job->model_type == DT_MODEL_GPT || job->model_type == DT_MODEL_BERT ||
           job->model_type == DT_MODEL_LLAMA;
}

int dt_plan_make(dt_plan *plan, const dt_job *job, const dt_plan_req *req,
                 const dt_plan_rates *rates, dt_err *err)
{
    memset(plan, 0, sizeof *plan);
    if (req->nnodes < 1 || req->nproc < 1)
        return dt_err_set(err, -EINVAL, "--nnodes and --nproc-per-node must be at least 1 "
                                        "(given %d and %d)",
                          req->nnodes, req->nproc);
    planner *pl = calloc(1, sizeof *pl);
    if (!pl)
        return dt_err_set(err, -ENOMEM, "out of memory");
    pl->job = job;
    pl->req = req;
    pl->plan = plan;
    if (rates)
        pl->rates = *rates;
    else
        dt_plan_rates_default(&pl->rates);
    pl->optim_k = job->optimizer == DT_OPTIM_ADAMW ? 2 : job->momentum > 0 ? 1 : 0;
    pl->transformer = has_tensor_parallel(job) && job->n_embd > 0;
    pl->pr.job = job;
    snprintf(pl->pr.run_id, sizeof pl->pr.run_id, "plan-%d", (int)getpid());
    const int W = req->nnodes * req->nproc;
    plan->world = W;
    int rc = 0, cap = 0;
    dt_data *data = NULL;
    snprintf(plan->model, sizeof plan->model, "%s", job->preset != DT_PRESET_NONE
                                                         ? dt_preset_name(job->preset)
                                                         : dt_model_name(job->model_type));
    if ((rc = dt_data_open(&data, job, err)))
        goto out;
    pl->pr.shape = data->shape;
    dt_backend_opts bo;
    dt_backend_opts_default(&bo);
    bo.threads = 1; /* a worker's rate: one BLAS thread (train.threads = 1) */
    if ((rc = dt_backend_open(&pl->pr.be, DT_BACKEND_CPU, &bo, err)))
        goto out;
    openblas_set_num_threads(1);
    if (pl->rates.gemm_flops <= 0 && (rc = calibrate(pl, data, err)))
        goto out;

    /* the global batch the layouts keep */
    int64_t B = req->global_batch > 0 ? req->global_batch : job->global_batch;
    if (B <= 0) {
        int own_d = W / DT_MAX(1, job->tensor * job->pipeline);
        B = (int64_t)job->batch_size * job->grad_accum * DT_MAX(1, own_d);
    }
    plan->global_batch = B;
    const int blocks = dt_job_pipeline_blocks(job);
    const int heads = job->n_head;
    char why[200];
    for (int T = 1; T <= W; T++) {
        if (W % T)
            continue;
        if (T > 1 && !has_tensor_parallel(job)) {
            snprintf(why, sizeof why, "tensor %d: model %s has no tensor-parallel form", T,
                     dt_model_name(job->model_type));
            note_excluded(plan, why);
            continue;
        }
        if (T > req->nproc) {
            snprintf(why, sizeof why, "tensor %d: more than the %d ranks of a node "
                     "(--nproc-per-node)", T, req->nproc);
            note_excluded(plan, why);
            continue;
        }
        if (T > 1 && heads > 0 && heads % T) {
            snprintf(why, sizeof why, "tensor %d: does not divide the model's %d heads "
                     "(model.n_head)", T, heads);
            note_excluded(plan, why);
            continue;
        }
        for (int P = 1; P <= W / T; P++) {
            if ((W / T) % P)
                continue;
            if (P > 1 && P > blocks) {
                snprintf(why, sizeof why, "pipeline %d: more than the model's %d %s", P,
                         blocks, blocks ? "blocks" : "pipeline blocks (it has no pipeline form)");
                note_excluded(plan, why);
                continue;
            }
            const int D = W / (T * P);
            if (B % D) {
                snprintf(why, sizeof why, "data %d (tensor %d x pipeline %d): does not divide "
                         "the global batch %lld", D, T, P, (long long)B);
                note_excluded(plan, why);
                continue;
            }
            const int64_t n = B / D;
            for (int sp = 0; sp <= (T > 1); sp++) {
                if (sp && job->seq_len % T)
                    continue;
                for (int z = 0; z <= (D > 1 ? 3 : 0); z++)
                    for (int r = 0; r <= 2; r++) {
                        if (r == DT_RECOMP_SELECTIVE && !pl->transformer)
                            continue; /* gpt, bert and llama only */
                        if (r == DT_RECOMP_BLOCK && job->model_type == DT_MODEL_MLP)
                            continue; /* an mlp keeps only each layer's input already */
                        for (int64_t a = 1; a <= n; a++) {
                            if (n % a || n / a > 1 << 20)
                                continue;
                            const int b = (int)(n / a);
                            for (int M = 1; M <= (P > 1 ? b : 1); M++) {
                                if (b % M)
                                    continue;
                                for (int sch = 0; sch <= (P > 1); sch++) {
                                    dt_plan_layout l = {
                                        .data = D, .tensor = T, .pipeline = P, .zero = z,
                                        .recompute = (dt_recompute_kind)r,
                                        .sequence_parallel = sp, .micro_batches = M,
                                        .schedule = P > 1 ? (dt_pp_schedule_kind)sch
                                                          : job->pp_schedule,
                                        .batch_size = b, .grad_accum = (int)a};
                                    if (predict(pl, &l))
                                        continue;
                                    if ((rc = add_layout(plan, &cap, &l)))
                                        goto out;
                                }
                            }
                        }
                    }
            }
        }
    }
    qsort(plan->v, (size_t)plan->n, sizeof *plan->v, cmp_layout);
    for (int i = 0; i < plan->n; i++)
        plan->n_fit += plan->v[i].fits;
    plan->chosen = plan->n_fit > 0 ? 0 : -1;
    plan->rates = pl->rates;
    if (pl->rates.gemm_flops <= 0) /* measured: say the model's own rate */
        plan->rates.gemm_flops = pl->model_rate;
    if (plan->n == 0 && !rc)
        rc = dt_err_set(err, -EINVAL, "no layout of %s can run on %d x %d ranks with a "
                        "global batch of %lld: %s", plan->model, req->nnodes, req->nproc,
                        (long long)B, plan->n_excluded_why ? plan->excluded_why[0] : "none");
out:
    dt_data_free(data);
    prober_close(&pl->pr);
    free(pl);
    if (rc)
        dt_plan_free(plan);
    return rc;
}

void dt_plan_free(dt_plan *plan)
{
    if (!plan)
        return;
    free(plan->v);
    plan->v = NULL;
    plan->n = plan->n_fit = 0;
}

int dt_plan_overrides(const dt_plan_layout *l, char (*av)[DT_PLAN_OV_LEN])
{
    int n = 0;
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.tensor=%d", l->tensor);
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.pipeline=%d", l->pipeline);
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.zero=%d", l->zero);
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.sequence_parallel=%s",
             l->sequence_parallel ? "true" : "false");
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.micro_batches=%d", l->micro_batches);
    snprintf(av[n++], DT_PLAN_OV_LEN, "parallel.schedule=%s", dt_pp_schedule_name(l->schedule));
    snprintf(av[n++], DT_PLAN_OV_LEN, "train.recompute=%s", dt_recompute_name(l->recompute));
    snprintf(av[n++], DT_PLAN_OV_LEN, "train.batch_size=%d", l->batch_size);
    snprintf(av[n++], DT_PLAN_OV_LEN, "train.grad_accum=%d", l->grad_accum);
    snprintf(av[n++], DT_PLAN_OV_LEN, "train.global_batch=0");
    return n;
}

int dt_plan_parse_bytes(const char *s, double *bytes)
{
    int64_t v = 0;
    if (dt_parse_bytes(s, &v) || v <= 0) /* job.device_memory's syntax; a budget of 0 is none */
        return -EINVAL;
    *bytes = (double)v;
    return 0;
}

/* ---- names ---- */

void dt_plan_layout_name(const dt_plan_layout *l, char *buf, size_t cap)
{
    char pp[48] = "";
    if (l->pipeline > 1)
        snprintf(pp, sizeof pp, " M%d %s", l->micro_batches, dt_pp_schedule_name(l->schedule));
    snprintf(buf, cap, "D%d T%d P%d%s z%d %s%s b%dx%d", l->data, l->tensor, l->pipeline,
             l->sequence_parallel ? "sp" : "", l->zero, dt_recompute_name(l->recompute), pp,
             l->batch_size, l->grad_accum);
}

/* ---- parallel.layout = auto ---------------------------------------------------------------- */

double dt_plan_job_budget(const dt_job *job)
{
    return job->device_memory > 0 ? (double)job->device_memory : 0;
}

/* Plans job for nnodes x nproc ranks (global batch gb; 0: the job's) and sets the chosen
 * layout's keys in it, logging the choice. choice (cap bytes; may be NULL) gets the keys set,
 * space-separated; *gb_out (may be NULL) the plan's global batch. */
static int plan_and_set(dt_job *job, int nnodes, int nproc, int64_t gb, char *choice, size_t cap,
                        int64_t *gb_out, dt_err *err)
{
    dt_plan_req req = {.nnodes = nnodes, .nproc = nproc, .device_memory = dt_plan_job_budget(job),
                       .global_batch = gb};
    dt_plan plan;
    int rc = dt_plan_make(&plan, job, &req, NULL, err);
    if (rc)
        return rc;
    char name[96], second[96] = "none";
    if (plan.chosen < 0) {
        dt_plan_layout_name(&plan.v[0], name, sizeof name);
        rc = dt_err_set(err, -EINVAL, "parallel.layout = auto: no layout of %s on %d x %d ranks "
                        "fits the budget; the nearest: %s: %s", plan.model, nnodes, req.nproc,
                        name, plan.v[0].why);
        dt_plan_free(&plan);
        return rc;
    }
    const dt_plan_layout *l = &plan.v[plan.chosen];
    dt_plan_layout_name(l, name, sizeof name);
    if (plan.n_fit > 1)
        dt_plan_layout_name(&plan.v[1], second, sizeof second);
    char av[DT_PLAN_OV_MAX][DT_PLAN_OV_LEN];
    int n = dt_plan_overrides(l, av);
    size_t len = 0;
    if (choice && cap)
        choice[0] = '\0';
    for (int i = 0; i < n && !rc; i++) {
        rc = dt_job_set(job, av[i], err);
        if (choice && len < cap)
            len += (size_t)snprintf(choice + len, cap - len, "%s%s", i ? " " : "", av[i]);
    }
    if (!rc && choice && len >= cap)
        rc = dt_err_set(err, -ENAMETOOLONG, "parallel.layout = auto: the chosen keys are too long");
    if (!rc)
        DT_INFO("parallel.layout = auto: %s on %d x %d ranks, global batch %lld: chose %s "
                    "(predicted peak %.2f MiB a rank, step %.1f ms) of %d layouts that fit; "
                    "runner-up %s (step %.1f ms)",
                    plan.model, nnodes, req.nproc, (long long)plan.global_batch, name,
                    l->peak_bytes / MIB, l->step_s * 1e3, plan.n_fit, second,
                    plan.n_fit > 1 ? plan.v[1].step_s * 1e3 : 0.0);
    if (gb_out)
        *gb_out = plan.global_batch;
    dt_plan_free(&plan);
    return rc;
}

bool dt_plan_auto_elastic(const dt_job *job)
{
    int n = 0;
    return job->layout == DT_LAYOUT_AUTO && dt_parse_int(job->launch.nnodes, &n) != 0 &&
           strchr(job->launch.nnodes, ':') && job->launch.nproc_per_node.kind == DT_NPROC_NUMBER;
}

int dt_plan_apply_auto(dt_job *job, dt_err *err)
{
    if (job->layout != DT_LAYOUT_AUTO || dt_plan_auto_elastic(job))
        return 0;
    int nnodes = 0;
    if (dt_parse_int(job->launch.nnodes, &nnodes) || nnodes < 1 ||
        job->launch.nproc_per_node.kind != DT_NPROC_NUMBER)
        return dt_err_set(err, -EINVAL, "parallel.layout = auto plans for a fixed world or "
                          "an elastic MIN:MAX: give --nnodes N (or MIN:MAX) and "
                          "--nproc-per-node G as a number (given %s and %s), or set the "
                          "[parallel] keys and parallel.layout = explicit",
                          job->launch.nnodes,
                          job->launch.nproc_per_node.kind == DT_NPROC_NUMBER ? "a number"
                          : dt_nproc_name(job->launch.nproc_per_node.kind));
    return plan_and_set(job, nnodes, job->launch.nproc_per_node.n, 0, NULL, 0, NULL, err);
}

/* Whether "key=value" t sets one of the keys dt_plan_overrides sets. */
static bool layout_key(const char *t)
{
    static const char *const keys[] = {
        "parallel.tensor=",   "parallel.pipeline=", "parallel.zero=",
        "parallel.sequence_parallel=", "parallel.micro_batches=", "parallel.schedule=",
        "train.recompute=",   "train.batch_size=",  "train.grad_accum=",
        "train.global_batch=",
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(keys); i++)
        if (!strncmp(t, keys[i], strlen(keys[i])))
            return true;
    return false;
}

/* Writes job to path through a temporary file renamed over it (a worker that reads it meanwhile
 * sees the old job or the new one, whole). */
static int write_job(const dt_job *job, const char *path, dt_err *err)
{
    char tmp[DT_PATH_MAX + 16];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.new", path) >= sizeof tmp)
        return dt_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dt_err_errno(err, errno, "cannot write the resolved job to %s", tmp);
    dt_job_print(job, f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        int e = errno ? errno : EIO;
        unlink(tmp);
        return dt_err_errno(err, e, "cannot write the resolved job to %s", path);
    }
    return 0;
}

int dt_plan_auto_round(dt_plan_auto *a, int nnodes, int nproc, const char *given, char *choice,
                       size_t cap, int *tensor, int *pipeline, dt_err *err)
{
    dt_job *job = malloc(sizeof *job);
    dt_config_errors *errs = calloc(1, sizeof *errs);
    int rc = 0;
    if (!job || !errs) {
        free(job);
        free(errs);
        return dt_err_set(err, -ENOMEM, "out of memory");
    }
    *job = *a->job; /* the job as loaded: every plan starts from it */
    if (given) {
        char buf[1024], *save = NULL;
        if (!dt_strlcpy(buf, given, sizeof buf))
            rc = dt_err_set(err, -E2BIG, "parallel.layout = auto: the layout of group rank 0 "
                            "is too long");
        for (char *t = strtok_r(buf, " ", &save); t && !rc; t = strtok_r(NULL, " ", &save))
            if (!strncmp(t, "plan.global_batch=", 18))
                a->global_batch = strtoll(t + 18, NULL, 10); /* for this node's next plans */
            else if (!layout_key(t))
                rc = dt_err_set(err, -EINVAL, "parallel.layout = auto: group rank 0's layout "
                                "(read from the round's store) sets %.64s, which is no key a "
                                "plan sets", t);
            else
                rc = dt_job_set(job, t, err);
        if (!rc && dt_job_validate(job, errs) != 0)
            rc = dt_err_set(err, -EINVAL, "parallel.layout = auto: group rank 0's layout (read "
                            "from the round's store) is not valid for this job: %s",
                            errs->count ? errs->lines[0] : "?");
        if (!rc && choice && !dt_strlcpy(choice, given, cap))
            rc = dt_err_set(err, -ENAMETOOLONG, "parallel.layout = auto: the layout is too long");
        if (!rc)
            DT_INFO("parallel.layout = auto: %d x %d ranks: the layout group rank 0 planned: %s",
                    nnodes, nproc, given);
    } else {
        char keys[900];
        int64_t gb = 0;
        rc = plan_and_set(job, nnodes, nproc, a->global_batch, keys, sizeof keys, &gb, err);
        if (!rc && a->global_batch == 0)
            a->global_batch = gb; /* the first plan's global batch, kept by the next ones */
        /* the global batch goes along, for the nodes' next plans (one may be rank 0 then) */
        if (!rc && choice &&
            (size_t)snprintf(choice, cap, "plan.global_batch=%lld %s", (long long)gb, keys) >= cap)
            rc = dt_err_set(err, -ENAMETOOLONG, "parallel.layout = auto: the layout is too long");
    }
    if (!rc)
        rc = write_job(job, a->path, err);
    if (!rc) {
        *tensor = job->tensor;
        *pipeline = job->pipeline;
    }
    free(job);
    free(errs);
    return rc;
}

/* Ranks of v (1-based; ties their mean) into r. */
static void ranks_of(const double *v, int n, double *r)
{
    for (int i = 0; i < n; i++) {
        int less = 0, same = 0;
        for (int j = 0; j < n; j++) {
            less += v[j] < v[i];
            same += v[j] == v[i];
        }
        r[i] = less + (same + 1) / 2.0;
    }
}

double dt_plan_spearman(const double *x, const double *y, int n)
{
    if (n < 2)
        return 0;
    double *rx = calloc((size_t)n, sizeof *rx), *ry = calloc((size_t)n, sizeof *ry);
    double res = 0;
    if (rx && ry) {
        ranks_of(x, n, rx);
        ranks_of(y, n, ry);
        double mx = 0, my = 0;
        for (int i = 0; i < n; i++) {
            mx += rx[i] / n;
            my += ry[i] / n;
        }
        double sxy = 0, sxx = 0, syy = 0;
        for (int i = 0; i < n; i++) {
            sxy += (rx[i] - mx) * (ry[i] - my);
            sxx += (rx[i] - mx) * (rx[i] - mx);
            syy += (ry[i] - my) * (ry[i] - my);
        }
        res = sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
    }
    free(rx);
    free(ry);
    return res;
}
