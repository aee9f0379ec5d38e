/* dp.c - DataParallel: one process, K replicas on K threads; see dp.h.
 *
 * Threads: replica 0 runs on the caller's thread (the master), replicas 1..K-1 on their own
 * threads, which sleep on a condition variable between passes. A pass is published as a new
 * generation number; each replica thread runs its job and counts itself done.
 *
 * Memory across replicas (transport "master"): when every replica is a CPU backend, their
 * buffers are all host memory and the master copies and accumulates them directly; otherwise (one
 * GPU per replica) every copy goes through a host staging buffer and a staging buffer on the
 * master's device, which is what the master pays in memory for being the master.
 *
 * Transport "collectives": each replica thread owns rank k of a communicator of the K replicas.
 * The communicators are created by the replica threads themselves, at once (creation is
 * collective), through a store server this process runs on 127.0.0.1 for the bootstrap only,
 * under a run id of its own. A pass is then broadcast (parameters, buffers) -> forward ->
 * backward -> reduce (gradients) on every replica, so no phase is serial on the master.
 */
#include "runtime/train/parallel/dp.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/cpuset.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/comm/comm.h"
#include "runtime/train/obs/trace.h"
#include "runtime/train/parallel/strategy.h"

typedef struct replica {
    struct dt_dp *dp;
    int k;
    dt_backend *be;      /* owned */
    dt_model *m;         /* owned */
    pthread_t thread;
    bool started;
    bool bind;           /* run on cpus (opts.cpu_bind) */
    cpu_set_t cpus;
    /* the job of the current pass */
    dt_batch batch;
    bool active;         /* has a non-empty chunk */
    bool training;
    float scale;         /* dloss_scale * B_k / B */
    float loss;
    int64_t correct;
    int rc;
    dt_err err;
    dt_comm *comm;       /* collectives: rank k of the replicas' communicator, owned */
    double t_bcast, t_compute, t_reduce; /* collectives: this pass's phases */
} replica;

enum { JOB_PASS, JOB_COMM_INIT };

struct dt_dp {
    int K;
    replica *r;          /* (K) */
    bool host_mem;       /* every replica's memory is host memory */
    bool coll;           /* transport collectives: replica k talks through r[k].comm */
    int job;             /* what the next parallel() runs: JOB_PASS or JOB_COMM_INIT */
    /* the bootstrap of the communicators (JOB_COMM_INIT) */
    dt_comm_kind comm_backend;
    int timeout_ms, store_port;
    char token[33], run_id[64];
    float *host_stage;   /* (num_params or num_buffers) host staging, when !host_mem and !coll */
    float *dev_stage;    /* (num_params) on the master's backend, when !host_mem and !coll */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int pending;
    bool stop;
    dt_dp_stats st;
};

/* ---- a replica's pass ---------------------------------------------------------------------- */

/* JOB_COMM_INIT: rank k of the replicas' communicator, through the private store. */
static void comm_init(replica *r)
{
    dt_dp *d = r->dp;
    dt_store *st = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    so.token = d->token;
    so.timeout_ms = d->timeout_ms;
    if ((r->rc = dt_store_connect(&st, "127.0.0.1", d->store_port, &so, &r->err)) == 0) {
        dt_comm_opts co;
        dt_comm_opts_default(&co);
        co.backend = d->comm_backend;
        co.rank = co.local_rank = r->k;
        co.world_size = co.local_world_size = d->K;
        co.run_id = d->run_id;
        co.number = 1; /* one communicator under this run id, made by K threads of one process */
        co.timeout_ms = d->timeout_ms;
        co.local_addr = "127.0.0.1";
        co.device_index = r->k;
        r->rc = dt_comm_init(&r->comm, st, &co, &r->err);
    }
    dt_store_free(st);
}

/* Collectives: the master's parameters and buffers into this replica, by broadcast. */
static int receive_params(replica *r)
{
    dt_model *m = r->m;
    int rc = dt_comm_broadcast(r->comm, m->params, m->num_params, DT_FLOAT32, 0, NULL, &r->err);
    if (!rc && m->num_buffers)
        rc = dt_comm_broadcast(r->comm, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, &r->err);
    return rc;
}

static void run_job(replica *r)
{
    dt_dp *d = r->dp;
    dt_model *m = r->m;
    r->rc = 0;
    r->loss = 0;
    r->correct = 0;
    if (d->job == JOB_COMM_INIT) {
        comm_init(r);
        return;
    }
    /* With collectives every replica takes part in every broadcast and reduce, even one whose
     * chunk is empty or whose forward failed, so that none is left waiting for it. */
    double t0 = dt_now_s();
    uint64_t ts = dt_trace_begin(); /* train.trace: replica 0 on the caller's track */
    if (ts && r->k > 0) {
        char name[32];
        snprintf(name, sizeof name, "replica %d", r->k);
        dt_trace_thread_name(name);
    }
    if (d->coll && (r->rc = receive_params(r)) != 0)
        return;
    dt_trace_end(d->coll ? ts : 0, DT_TRACE_COMM, "broadcast params");
    double t1 = dt_now_s();
    if (r->training && r->k > 0 && (r->active || d->coll)) /* the master accumulates; the others
                                                              start from zero */
        r->be->memset_zero(r->be, m->grads, m->num_params * sizeof(float));
    ts = dt_trace_begin();
    if (r->active && (r->rc = m->ops->forward(m, &r->batch, r->training, &r->loss, &r->err)) == 0) {
        dt_trace_end_arg(ts, DT_TRACE_FORWARD, "forward", "replica", r->k);
        r->correct = m->last_correct;
        ts = dt_trace_begin();
        if (r->training)
            r->rc = m->ops->backward(m, r->scale, NULL, NULL, &r->err);
        dt_trace_end_arg(r->training ? ts : 0, DT_TRACE_BACKWARD, "backward", "replica", r->k);
    }
    if (!d->coll) {
        r->be->synchronize(r->be);
        return;
    }
    double t2 = dt_now_s();
    if (r->training) {
        dt_err e = {0};
        ts = dt_trace_begin();
        int rc = dt_comm_reduce(r->comm, m->grads, m->num_params, DT_FLOAT32, DT_SUM, 0, NULL, &e);
        dt_trace_end(rc ? 0 : ts, DT_TRACE_COMM, "reduce grads");
        if (rc && !r->rc) {
            r->rc = rc;
            r->err = e;
        }
    }
    r->t_bcast = t1 - t0;
    r->t_compute = t2 - t1;
    r->t_reduce = dt_now_s() - t2;
}

static void *replica_thread(void *arg)
{
    replica *r = arg;
    dt_dp *d = r->dp;
    uint64_t seen = 0;
    dt_err e = {0};
    if (r->bind && dt_cpuset_bind(&r->cpus, &e))
        DT_DEBUG("DP replica %d: %s", r->k, e.msg);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->gen == seen)
            pthread_cond_wait(&d->go, &d->mu);
        if (d->stop)
            break;
        seen = d->gen;
        pthread_mutex_unlock(&d->mu);
        run_job(r);
        pthread_mutex_lock(&d->mu);
        if (--d->pending == 0)
            pthread_cond_signal(&d->done);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- the phases of a step ------------------------------------------------------------------- */

/* The master's parameters and buffers to every other replica, one after the other. */
static void replicate(dt_dp *d)
{
    const dt_model *m0 = d->r[0].m;
    dt_backend *be0 = d->r[0].be;
    size_t pb = m0->num_params * sizeof(float), bb = m0->num_buffers * sizeof(float);
    if (!d->host_mem) {
        be0->memcpy_d2h(be0, d->host_stage, m0->params, pb);
    }
    for (int k = 1; k < d->K; k++) {
        replica *r = &d->r[k];
        r->be->memcpy_h2d(r->be, r->m->params, d->host_mem ? m0->params : d->host_stage, pb);
    }
    if (bb) {
        if (!d->host_mem)
            be0->memcpy_d2h(be0, d->host_stage, m0->buffers, bb);
        for (int k = 1; k < d->K; k++) {
            replica *r = &d->r[k];
            r->be->memcpy_h2d(r->be, r->m->buffers, d->host_mem ? m0->buffers : d->host_stage,
                              bb);
        }
    }
    for (int k = 1; k < d->K; k++)
        d->r[k].be->synchronize(d->r[k].be);
}

/* Chunk k of B samples (torch.chunk: ceil(B/K) each, the last ones smaller or empty). */
static void scatter(dt_dp *d, const dt_batch *b, bool training, float dloss_scale)
{
    int chunk = (b->B + d->K - 1) / d->K;
    for (int k = 0; k < d->K; k++) {
        replica *r = &d->r[k];
        int first = DT_MIN(k * chunk, b->B), n = DT_MIN(chunk, b->B - first);
        r->active = n > 0;
        r->training = training;
        r->scale = b->B > 0 ? dloss_scale * (float)n / (float)b->B : 0;
        const dt_sample_shape *sh = &r->m->cfg.shape;
        size_t per = sh->kind == DT_SAMPLE_IMAGE
                         ? (size_t)sh->channels * (size_t)sh->height * (size_t)sh->width
                         : (size_t)sh->input_dim;
        r->batch = dt_batch_slice(b, first, n, per);
    }
}

/* Runs every replica's job: 1..K-1 on their threads, 0 here; returns when all are done. */
static void parallel(dt_dp *d, int job)
{
    pthread_mutex_lock(&d->mu);
    d->job = job;
    d->pending = d->K - 1;
    d->gen++;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    run_job(&d->r[0]);
    pthread_mutex_lock(&d->mu);
    while (d->pending > 0)
        pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

/* The replicas' gradients summed into the master's, one replica after the other. */
static void reduce(dt_dp *d)
{
    replica *r0 = &d->r[0];
    size_t n = r0->m->num_params;
    for (int k = 1; k < d->K; k++) {
        replica *r = &d->r[k];
        if (!r->active)
            continue;
        if (d->host_mem) {
            r0->be->accumulate(r0->be, r0->m->grads, r->m->grads, n);
        } else {
            r->be->memcpy_d2h(r->be, d->host_stage, r->m->grads, n * sizeof(float));
            r0->be->memcpy_h2d(r0->be, d->dev_stage, d->host_stage, n * sizeof(float));
            r0->be->accumulate(r0->be, r0->m->grads, d->dev_stage, n);
        }
    }
    r0->be->synchronize(r0->be);
}

static int first_error(dt_dp *d, dt_err *err)
{
    for (int k = 0; k < d->K; k++)
        if (d->r[k].rc) {
            if (err)
                *err = d->r[k].err;
            dt_err_prefix(err, "DP replica %d: ", k);
            return d->r[k].rc;
        }
    return 0;
}

int dt_dp_forward_backward(dt_dp *d, const dt_batch *batch, float dloss_scale, float *loss,
                           dt_err *err)
{
    if (batch->B > d->r[0].m->cfg.max_batch * d->K)
        return dt_err_set(err, -EINVAL, "DP: batch of %d samples, room for %d", batch->B,
                          d->r[0].m->cfg.max_batch * d->K);
    double t0 = dt_now_s();
    uint64_t ts = d->coll ? 0 : dt_trace_begin();
    if (!d->coll)
        replicate(d);
    dt_trace_end(ts, DT_TRACE_COMM, "replicate params");
    double t1 = dt_now_s();
    scatter(d, batch, true, dloss_scale);
    parallel(d, JOB_PASS);
    double t2 = dt_now_s();
    int rc = first_error(d, err);
    if (rc)
        return rc;
    ts = d->coll ? 0 : dt_trace_begin();
    if (!d->coll)
        reduce(d);
    dt_trace_end(ts, DT_TRACE_COMM, "reduce grads");
    double t3 = dt_now_s();
    float l = 0;
    for (int k = 0; k < d->K; k++)
        if (d->r[k].active)
            l += d->r[k].loss * (float)d->r[k].batch.B / (float)batch->B;
    *loss = l;
    if (d->coll) {
        d->st.replicate_s += d->r[0].t_bcast;
        d->st.compute_s += d->r[0].t_compute;
        d->st.reduce_s += d->r[0].t_reduce;
    } else {
        d->st.replicate_s += t1 - t0;
        d->st.compute_s += t2 - t1;
        d->st.reduce_s += t3 - t2;
    }
    d->st.steps++;
    return 0;
}

int dt_dp_forward_eval(dt_dp *d, const dt_batch *batch, float *loss, int64_t *correct,
                       dt_err *err)
{
    if (batch->B > d->r[0].m->cfg.max_batch * d->K)
        return dt_err_set(err, -EINVAL, "DP: batch of %d samples, room for %d", batch->B,
                          d->r[0].m->cfg.max_batch * d->K);
    if (!d->coll)
        replicate(d);
    scatter(d, batch, false, 1.0f);
    parallel(d, JOB_PASS);
    int rc = first_error(d, err);
    if (rc)
        return rc;
    float l = 0;
    int64_t c = 0;
    for (int k = 0; k < d->K; k++)
        if (d->r[k].active) {
            l += d->r[k].loss * (float)d->r[k].batch.B / (float)batch->B;
            c += d->r[k].correct;
        }
    *loss = l;
    if (correct)
        *correct = c;
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

void dt_dp_opts_from_job(dt_dp_opts *o, const dt_job *job, const dt_backend_opts *bo)
{
    memset(o, 0, sizeof *o);
    o->replicas = job->dp_replicas;
    o->device = dt_strategy_device(job->device);
    o->backend = *bo;
    o->cpu_bind = job->cpu_bind == DT_CPU_BIND_AUTO;
    o->transport = job->dp_transport;
    o->timeout_ms = (int)DT_MIN(job->comm_timeout * 1000.0, 2e9);
}

static void free_comms(dt_dp *d)
{
    for (int k = 0; k < d->K; k++) {
        dt_comm_free(d->r[k].comm);
        d->r[k].comm = NULL;
    }
}

/* Transport collectives: the replica threads create their communicator together, bootstrapped
 * through a store server of this process that lives only as long as that takes. */
static int start_collectives(dt_dp *d, dt_comm_kind backend, int timeout_ms, dt_err *err)
{
    static _Atomic unsigned instances;
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return dt_err_set(err, -EIO, "DP: getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(d->token + 2 * i, 3, "%02x", rnd[i]);
    snprintf(d->run_id, sizeof d->run_id, "dp-%d-%u", (int)getpid(),
             atomic_fetch_add(&instances, 1) + 1);
    d->comm_backend = backend;
    d->timeout_ms = timeout_ms > 0 ? timeout_ms : 300000;
    dt_store_server *srv = NULL;
    dt_store_server_opts so;
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    so.token = d->token;
    so.quiet = true;
    int rc = dt_store_server_start(&srv, &so, err);
    if (rc)
        return dt_err_prefix(err, "DP: the store for the replicas' communicator: ");
    d->store_port = dt_store_server_port(srv);
    parallel(d, JOB_COMM_INIT);
    dt_store_server_stop(srv);
    if ((rc = first_error(d, err)) != 0) {
        free_comms(d);
        return rc;
    }
    d->coll = true;
    return 0;
}

int dt_dp_create(dt_dp **out, const dt_model_config *cfg, const dt_dp_opts *o, dt_err *err)
{
    if (o->replicas < 1 || o->replicas > 1024)
        return dt_err_set(err, -EINVAL, "DP: %d replicas (1..1024)", o->replicas);
    dt_dp_transport_kind tr = o->transport;
    if (tr != DT_DP_TRANSPORT_AUTO && tr != DT_DP_TRANSPORT_MASTER &&
        tr != DT_DP_TRANSPORT_COLLECTIVES)
        return dt_err_set(err, -EINVAL, "DP: transport %d: use auto, master or collectives",
                          (int)tr);
    int rc = 0;
    dt_dp *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "DP: out of memory");
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->go, NULL);
    pthread_cond_init(&d->done, NULL);
    d->K = o->replicas;
    d->r = calloc((size_t)d->K, sizeof *d->r);
    if (!d->r) {
        rc = dt_err_set(err, -ENOMEM, "DP: out of memory");
        goto fail;
    }
    dt_model_config rc_cfg = *cfg;
    rc_cfg.max_batch = DT_MAX(1, (cfg->max_batch + d->K - 1) / d->K);
    rc_cfg.sync_bn = false;
    d->host_mem = true;
    for (int k = 0; k < d->K; k++) {
        replica *r = &d->r[k];
        r->dp = d;
        r->k = k;
        dt_backend_opts bo = o->backend;
        bo.device_index = k;
        if ((rc = dt_backend_open(&r->be, o->device, &bo, err)) != 0) {
            if (rc == -ENOENT) /* no CUDA library: the device is absent (strategy.h) */
                rc = -ENODEV;
            dt_err_prefix(err, "DP replica %d: ", k);
            goto fail;
        }
        if (!r->be->host_memory)
            d->host_mem = false;
        if ((rc = dt_model_create(&r->m, &rc_cfg, r->be, NULL, err)) != 0) {
            dt_err_prefix(err, "DP replica %d: ", k);
            goto fail;
        }
    }
    bool want_coll =
        d->K > 1 && (tr == DT_DP_TRANSPORT_COLLECTIVES || (tr == DT_DP_TRANSPORT_AUTO && !d->host_mem));
    dt_model *m0 = d->r[0].m;
    cpu_set_t base;
    dt_err be = {0};
    if (o->cpu_bind && (d->K > 1 || !d->host_mem) && !dt_cpuset_current(&base, &be)) {
        for (int k = 0; k < d->K; k++)
            d->r[k].bind = !dt_backend_bind_set(d->r[k].be, &base, k, d->K, &d->r[k].cpus, &be);
        char list[256];
        dt_cpuset_format(&d->r[0].cpus, list, sizeof list);
        if (d->r[0].bind && !dt_cpuset_bind(&d->r[0].cpus, &be))
            DT_DEBUG("DP: replica k runs on share k of %d of this process's CPUs%s (replica 0: "
                     "%s)", d->K, d->host_mem ? "" : " near GPU k", list);
        else
            DT_DEBUG("DP: replicas not bound to CPUs (%s)", be.msg);
    }
    for (int k = 1; k < d->K; k++) {
        if ((rc = pthread_create(&d->r[k].thread, NULL, replica_thread, &d->r[k])) != 0) {
            rc = dt_err_set(err, -rc, "DP: cannot start replica thread %d", k);
            goto fail;
        }
        d->r[k].started = true;
    }
    if (want_coll) {
        dt_comm_kind backend = d->host_mem ? DT_COMM_CPU : DT_COMM_NCCL;
        dt_err ce = {0};
        if ((rc = start_collectives(d, backend, o->timeout_ms, &ce)) != 0) {
            if (tr != DT_DP_TRANSPORT_AUTO) {
                *err = ce;
                goto fail;
            }
            DT_WARN("DP: no %s communicator between the %d replicas (%s); the master copies "
                    "parameters and gradients through host memory instead (transport master)",
                    dt_comm_kind_name(backend), d->K, ce.msg);
            rc = 0;
        }
    }
    if (!d->host_mem && !d->coll) {
        size_t n = DT_MAX(m0->num_params, m0->num_buffers);
        d->host_stage = malloc(n * sizeof(float) + 4);
        if (!d->host_stage) {
            rc = dt_err_set(err, -ENOMEM, "DP: out of memory");
            goto fail;
        }
        if ((rc = d->r[0].be->alloc(d->r[0].be, (void **)&d->dev_stage,
                                    m0->num_params * sizeof(float), err)) != 0)
            goto fail;
    }
    d->st.replicas = d->K;
    d->st.collectives = d->coll;
    DT_DEBUG("DP: %d replicas of %s on %s, %zu parameters each, %s", d->K,
             dt_model_arch_name(cfg->arch),
             d->r[0].be->name, m0->num_params,
             d->coll ? "broadcast and reduce through a communicator of the replicas"
                     : "copies and sums by the master");
    *out = d;
    return 0;
fail:
    dt_dp_free(d);
    return rc;
}

void dt_dp_free(dt_dp *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    for (int k = 0; d->r && k < d->K; k++) {
        replica *r = &d->r[k];
        if (r->started)
            pthread_join(r->thread, NULL);
    }
    if (d->r)
        free_comms(d);
    if (d->dev_stage)
        d->r[0].be->free(d->r[0].be, d->dev_stage);
    for (int k = 0; d->r && k < d->K; k++) {
        dt_model_free(d->r[k].m);
        dt_backend_close(d->r[k].be);
    }
    free(d->host_stage);
    free(d->r);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->go);
    pthread_cond_destroy(&d->done);
    free(d);
}

dt_model *dt_dp_master(dt_dp *d) { return d->r[0].m; }

dt_backend *dt_dp_backend(dt_dp *d, int k) { return d->r[k].be; }

int dt_dp_replicas(const dt_dp *d) { return d->K; }

void dt_dp_get_stats(const dt_dp *d, dt_dp_stats *s) { *s = d->st; }
