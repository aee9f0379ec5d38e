/* agent_job.c - see agent_job.h. */
#include "runtime/launch/agent_job.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

/* ---- the rendezvous options ------------------------------------------------------------- */

int dt_agent_apply_rdzv_conf(dt_launch *L, dt_err *err)
{
    static dt_job scratch; /* large; the agent runs once per process */
    char buf[DT_STR_MID], *save = NULL;
    if (!L->rdzv_conf[0])
        return 0;
    dt_job_defaults(&scratch);
    scratch.launch = *L;
    dt_strlcpy(buf, L->rdzv_conf, sizeof buf);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char assign[DT_STR_MID + 16];
        tok = dt_trim(tok);
        if (!*tok)
            continue;
        if (!strchr(tok, '='))
            return dt_err_set(err, -EINVAL, "--rdzv-conf: \"%s\" is not key=value", tok);
        snprintf(assign, sizeof assign, "rendezvous.%s", tok);
        if (dt_job_set(&scratch, assign, err))
            return dt_err_prefix(err, "--rdzv-conf: ");
    }
    *L = scratch.launch;
    return 0;
}

void dt_agent_rdzv_opts(const dt_launch *L, int nproc, bool (*interrupted)(void *arg), void *arg,
                        dt_rdzv_opts *o)
{
    memset(o, 0, sizeof *o);
    dt_strlcpy(o->backend, dt_rdzv_backend_name(L->rdzv_backend), sizeof o->backend);
    dt_strlcpy(o->nnodes, L->nnodes, sizeof o->nnodes);
    o->node_rank = L->node_rank < 0 ? 0 : L->node_rank;
    dt_strlcpy(o->endpoint_host, L->master_addr[0] ? L->master_addr : "127.0.0.1",
               sizeof o->endpoint_host);
    o->endpoint_port = L->master_port;
    dt_strlcpy(o->endpoints, L->rdzv_endpoint, sizeof o->endpoints);
    dt_strlcpy(o->cacert, L->rdzv_cacert, sizeof o->cacert);
    dt_strlcpy(o->cert, L->rdzv_cert, sizeof o->cert);
    dt_strlcpy(o->key, L->rdzv_key, sizeof o->key);
    dt_strlcpy(o->user, L->rdzv_user, sizeof o->user);
    dt_strlcpy(o->password_file, L->rdzv_password_file, sizeof o->password_file);
    if (L->rdzv_endpoint[0])
        dt_rdzv_parse_endpoint(L->rdzv_endpoint, o->endpoint_host, sizeof o->endpoint_host,
                               &o->endpoint_port, NULL);
    int n = 0;
    if (L->standalone || (dt_parse_int(L->nnodes, &n) == 0 && n == 1 && !L->rdzv_endpoint[0])) {
        /* One node: nobody needs to find the store, so it takes any free local port. */
        dt_strlcpy(o->backend, "static", sizeof o->backend);
        dt_strlcpy(o->nnodes, "1", sizeof o->nnodes);
        o->node_rank = 0;
        dt_strlcpy(o->endpoint_host, "127.0.0.1", sizeof o->endpoint_host);
        o->endpoint_port = 0;
    }
    dt_strlcpy(o->run_id, L->rdzv_id, sizeof o->run_id);
    dt_strlcpy(o->local_addr, L->local_addr, sizeof o->local_addr);
    o->local_world_size = nproc;
    o->max_restarts = L->max_restarts;
    o->join_timeout = L->join_timeout;
    o->close_timeout = L->close_timeout;
    o->heartbeat_interval = L->heartbeat_interval;
    o->heartbeat_timeout = L->heartbeat_timeout;
    o->last_call_timeout = L->last_call_timeout;
    o->read_timeout = L->read_timeout;
    o->is_host = L->is_host;
    o->interrupted = interrupted;
    o->arg = arg;
}

bool dt_agent_standalone_conflict(const char *nnodes)
{
    const char *colon = strchr(nnodes, ':');
    int max = 0;
    if (!*nnodes)
        return false;
    if (colon ? dt_parse_int(colon + 1, &max) : dt_parse_int(nnodes, &max))
        return false; /* not a number: the rendezvous says what is wrong with it */
    return max > 1;
}

/* ---- where the logs go ------------------------------------------------------------------ */

int dt_agent_log_root(const dt_launch *L, const char *output_dir, char *out, size_t cap,
                      bool *made_tmp, dt_err *err)
{
    if (L->log_dir[0]) {
        dt_strlcpy(out, L->log_dir, cap);
        return 0;
    }
    if (output_dir && *output_dir) { /* the resolved job's (DTRAIN_OUTPUT_DIR included) */
        int n = snprintf(out, cap, "%s/logs", output_dir);
        if (n < 0 || (size_t)n >= cap)
            return dt_err_set(err, -ENAMETOOLONG, "output_dir too long: %s", output_dir);
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(out, cap, "%s/dtrain-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(out))
        return dt_err_errno(err, errno, "cannot create a log directory under %s (set --log-dir)",
                            tmp && *tmp ? tmp : "/tmp");
    *made_tmp = true;
    return 0;
}

bool dt_agent_writes_files(const dt_launch *L)
{
    return (L->redirects[0] && strcmp(L->redirects, "0")) || (L->tee[0] && strcmp(L->tee, "0")) ||
           L->local_ranks_filter[0];
}

/* ---- the global batch of a round -------------------------------------------------------- */

void dt_agent_log_global_batch(const char *job_path, int world, int before)
{
    dt_job *j = malloc(sizeof *j);
    dt_config_errors errs;
    dt_err err = {0};
    memset(&errs, 0, sizeof errs);
    if (!j || dt_job_load(j, job_path, NULL, 0, &errs, &err) != 0) {
        free(j);
        return; /* the workers say what is wrong with it */
    }
    int64_t per_rank = (int64_t)j->batch_size * (j->strategy == DT_STRATEGY_DP ? j->dp_replicas : 1);
    /* the data-parallel ranks share the batch (D = world / (T x P); the world itself without
     * tensor or pipeline parallelism) */
    int64_t w = world, tp = (int64_t)j->tensor * j->pipeline;
    if (tp > 1 && w % tp) { /* the agent refuses this round next: no step to speak of */
        free(j);
        return;
    }
    if (tp > 1)
        w /= tp;
    char was[64] = "";
    const char *dpr = tp > 1 ? "data-parallel " : "";
    if (before > 0) /* the world before held T x P (it ran), so this divides */
        snprintf(was, sizeof was, " (was %lld %sranks)", (long long)(tp > 1 ? before / tp : before),
                 dpr);
    if (j->global_batch > 0 && j->global_batch < w) {
        DT_WARN("global batch: train.global_batch = %lld is smaller than the %lld %sranks of "
                "this round%s: the workers will stop; raise it to at least %lld or run fewer "
                "ranks",
                (long long)j->global_batch, (long long)w, dpr, was, (long long)w);
    } else if (j->global_batch > 0) {
        int64_t micro = (j->global_batch + w * per_rank - 1) / (w * per_rank);
        DT_INFO("global batch: %lld samples per step over %lld %sranks%s, kept by "
                "train.global_batch: %lld micro-step%s of up to %lld samples per rank",
                (long long)j->global_batch, (long long)w, dpr, was, (long long)micro,
                micro == 1 ? "" : "s", (long long)per_rank);
    } else {
        DT_INFO("global batch: %s%lld samples per step over %lld %sranks%s (batch %lld x accum %d "
                "x %lld %sranks); set train.global_batch to keep it fixed when the world changes",
                before > 0 ? "now " : "", (long long)(per_rank * j->grad_accum * w),
                (long long)w, dpr, was, (long long)per_rank, j->grad_accum, (long long)w, dpr);
    }
    free(j);
}

/* ---- the worlds a layout can use ----------------------------------------------------------- */

bool dt_agent_world_usable(int world, int tensor, int pipeline, int64_t global_batch)
{
    int64_t tp = (int64_t)(tensor > 1 ? tensor : 1) * (pipeline > 1 ? pipeline : 1);
    if (world < 1 || world % tp)
        return false;
    return global_batch <= 0 || global_batch >= world / tp;
}

void dt_agent_warn_worlds(const char *nnodes, int nproc, int tensor, int pipeline,
                          int64_t global_batch)
{
    int lo = 0, hi = 0, n = 0;
    char tail, list[200] = "";
    size_t len = 0;
    if (sscanf(nnodes, "%d:%d%c", &lo, &hi, &tail) != 2 || lo < 1 || hi < lo || nproc < 1)
        return;
    for (int k = lo; k <= hi && len < sizeof list - 16; k++) {
        int world = k * nproc;
        if (dt_agent_world_usable(world, tensor, pipeline, global_batch))
            continue;
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", n ? ", " : "", world);
        n++;
        if (len >= sizeof list - 16 && k < hi)
            snprintf(list + len, sizeof list - len, ", ...");
    }
    if (n == 0)
        return;
    int T = tensor > 1 ? tensor : 1, P = pipeline > 1 ? pipeline : 1;
    char gb[96] = "";
    if (global_batch > 0)
        snprintf(gb, sizeof gb, " and train.global_batch = %lld (one sample per data-parallel rank)",
                 (long long)global_batch);
    DT_WARN("--nnodes=%s x --nproc-per-node=%d: the job's layout (parallel.tensor x "
            "parallel.pipeline = %d x %d%s) cannot use world size%s %s; a round that gathers "
            "such a node count runs on the largest world it can use, and the other nodes wait "
            "as spares until a later round can use them",
            nnodes, nproc, T, P, gb, n == 1 ? "" : "s", list);
}
