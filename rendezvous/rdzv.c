/* rdzv.c - see rdzv.h. Shared helpers, and the single-node rendezvous used until the store is
 * available (no store: one node has nobody to agree with). */
#include "rendezvous/rdzv.h"

#include <arpa/inet.h>
#include <cJSON.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"

struct dt_rdzv {
    dt_rdzv_opts o;
    int nnodes;
    int round;              /* current round, -1 before the first */
    bool done;              /* this node reported success in the current round */
    dt_rdzv_status ended;   /* how the current round ended (RUNNING = not yet) */
    dt_rdzv_failure *fails; /* failures of the current round */
    int n_fails;
    char run_id[DT_RDZV_STR];
};

/* ---- helpers ---------------------------------------------------------------------------- */

int dt_rdzv_parse_endpoint(const char *ep, char *host, size_t cap, int *port, dt_err *err)
{
    const char *colon;
    if (ep[0] == '[') {
        const char *close = strchr(ep, ']');
        if (!close)
            return dt_err_set(err, -EINVAL, "endpoint \"%s\": missing ']'", ep);
        snprintf(host, cap, "%.*s", (int)(close - ep - 1), ep + 1);
        colon = close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = strrchr(ep, ':');
        snprintf(host, cap, "%.*s", colon ? (int)(colon - ep) : (int)strlen(ep), ep);
    }
    if (colon) {
        int p;
        if (dt_parse_int(colon + 1, &p) || p < 0 || p > 65535)
            return dt_err_set(err, -EINVAL, "endpoint \"%s\": port must be 0-65535", ep);
        *port = p;
    }
    if (!host[0])
        return dt_err_set(err, -EINVAL, "endpoint \"%s\": no host", ep);
    return 0;
}

char *dt_rdzv_failure_to_json(const dt_rdzv_failure *f)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddNumberToObject(o, "time", f->time);
    cJSON_AddStringToObject(o, "host", f->host);
    cJSON_AddNumberToObject(o, "node", f->node);
    cJSON_AddNumberToObject(o, "rank", f->rank);
    cJSON_AddNumberToObject(o, "local_rank", f->local_rank);
    cJSON_AddNumberToObject(o, "pid", f->pid);
    cJSON_AddNumberToObject(o, "exit_code", f->exit_code);
    cJSON_AddNumberToObject(o, "signal", f->signal);
    cJSON_AddStringToObject(o, "message", f->message);
    cJSON_AddStringToObject(o, "error_file", f->error_file);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void json_str(const cJSON *o, const char *k, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    dt_strlcpy(out, cJSON_IsString(v) ? v->valuestring : "", cap);
}

static double json_num(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

int dt_rdzv_failure_from_json(const char *text, size_t len, dt_rdzv_failure *f)
{
    memset(f, 0, sizeof *f);
    cJSON *o = cJSON_ParseWithLength(text, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return -EBADMSG;
    }
    f->time = json_num(o, "time", 0);
    json_str(o, "host", f->host, sizeof f->host);
    f->node = (int)json_num(o, "node", -1);
    f->rank = (int)json_num(o, "rank", -1);
    f->local_rank = (int)json_num(o, "local_rank", -1);
    f->pid = (int)json_num(o, "pid", 0);
    f->exit_code = (int)json_num(o, "exit_code", 0);
    f->signal = (int)json_num(o, "signal", 0);
    json_str(o, "message", f->message, sizeof f->message);
    json_str(o, "error_file", f->error_file, sizeof f->error_file);
    cJSON_Delete(o);
    return 0;
}

/* A run id nobody else has: 12 hex digits from the clock, the pid and the host. */
static void make_run_id(char *out, size_t cap)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = dt_hostname(); *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    dt_rng r;
    dt_rng_seed2(&r, dt_now_ns() ^ (uint64_t)(dt_wall_s() * 1e9), h ^ ((uint64_t)getpid() << 20));
    snprintf(out, cap, "%012llx", (unsigned long long)(dt_rng_u64(&r) & 0xffffffffffffull));
}

static int cmp_failure(const void *a, const void *b)
{
    const dt_rdzv_failure *x = a, *y = b;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    return 0;
}

/* ---- network ---------------------------------------------------------------------------- */

int dt_rdzv_free_port(int *port, dt_err *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot pick a free port: socket");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return dt_err_errno(err, e, "cannot pick a free port");
    }
    close(fd);
    *port = ntohs(a.sin_port);
    return 0;
}

void dt_rdzv_route_addr(const char *host, int port, char *out, size_t cap)
{
    struct addrinfo hints, *res = NULL;
    char ps[16];
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    snprintf(ps, sizeof ps, "%d", port > 0 ? port : 9);
    if (host && *host && getaddrinfo(host, ps, &hints, &res) == 0 && res) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in me;
        socklen_t len = sizeof me;
        if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&me, &len) == 0 &&
            inet_ntop(AF_INET, &me.sin_addr, out, (socklen_t)cap)) {
            close(fd);
            freeaddrinfo(res);
            return;
        }
        if (fd >= 0)
            close(fd);
    }
    if (res)
        freeaddrinfo(res);
    dt_strlcpy(out, dt_hostname(), cap);
}

/* ---- the rendezvous --------------------------------------------------------------------- */

int dt_rdzv_open(dt_rdzv **out, const dt_rdzv_opts *opts, dt_err *err)
{
    *out = NULL;
    int nnodes = 0;
    if (strcmp(opts->backend, "static") && strcmp(opts->backend, "c10d"))
        return dt_err_set(err, -EINVAL, "unknown rendezvous backend \"%s\" (static or c10d)",
                          opts->backend);
    if (dt_parse_int(opts->nnodes, &nnodes) || nnodes < 1)
        return dt_err_set(err, -ENOTSUP,
                          "--nnodes=%s: an elastic MIN:MAX job needs the c10d rendezvous, which is "
                          "not available yet; give a fixed number of nodes",
                          opts->nnodes);
    if (nnodes > 1)
        return dt_err_set(err, -ENOTSUP,
                          "--nnodes=%d: multi-node jobs need the rendezvous store, which is not in "
                          "this build yet",
                          nnodes);
    dt_rdzv *r = calloc(1, sizeof *r);
    if (!r)
        return dt_err_set(err, -ENOMEM, "out of memory");
    r->o = *opts;
    r->nnodes = nnodes;
    r->round = -1;
    if (!opts->run_id[0] || !strcmp(opts->run_id, "none"))
        make_run_id(r->run_id, sizeof r->run_id);
    else
        dt_strlcpy(r->run_id, opts->run_id, sizeof r->run_id);
    *out = r;
    return 0;
}

int dt_rdzv_next(dt_rdzv *r, dt_rdzv_round *rd, dt_rdzv_status *st, dt_err *err)
{
    int rc;
    memset(rd, 0, sizeof *rd);
    if (st)
        memset(st, 0, sizeof *st);
    if (r->o.interrupted && r->o.interrupted(r->o.arg))
        return dt_err_set(err, -EINTR, "interrupted while joining the rendezvous");
    r->round++;
    r->done = false;
    memset(&r->ended, 0, sizeof r->ended);
    free(r->fails);
    r->fails = NULL;
    r->n_fails = 0;
    rd->round = r->round;
    rd->attempt = r->round;
    rd->max_restarts = r->o.max_restarts;
    rd->group_rank = 0;
    rd->group_world_size = 1;
    rd->rank_base = 0;
    rd->local_world_size = r->o.local_world_size;
    rd->world_size = r->o.local_world_size;
    dt_strlcpy(rd->run_id, r->run_id, sizeof rd->run_id);
    dt_strlcpy(rd->local_addr, r->o.local_addr[0] ? r->o.local_addr : "127.0.0.1",
               sizeof rd->local_addr);
    dt_strlcpy(rd->master_addr, rd->local_addr, sizeof rd->master_addr);
    if ((rc = dt_rdzv_free_port(&rd->master_port, err)))
        return rc;
    return 0;
}

int dt_rdzv_poll(dt_rdzv *r, dt_rdzv_status *st, dt_err *err)
{
    (void)err;
    *st = r->ended;
    if (st->state == DT_RDZV_RUNNING && r->done) {
        st->state = DT_RDZV_SUCCEEDED;
        st->node = 0;
        snprintf(st->why, sizeof st->why, "every worker succeeded");
    }
    return 0;
}

int dt_rdzv_succeeded(dt_rdzv *r, dt_err *err)
{
    (void)err;
    r->done = true;
    return 0;
}

int dt_rdzv_failed(dt_rdzv *r, const dt_rdzv_failure *f, int n, dt_err *err)
{
    dt_rdzv_failure *grown = realloc(r->fails, sizeof *grown * (size_t)(r->n_fails + n));
    if (!grown && r->n_fails + n > 0)
        return dt_err_set(err, -ENOMEM, "out of memory");
    r->fails = grown;
    memcpy(r->fails + r->n_fails, f, sizeof *f * (size_t)n);
    r->n_fails += n;
    if (r->ended.state == DT_RDZV_RUNNING) {
        r->ended.state = DT_RDZV_FAILED;
        r->ended.node = 0;
        snprintf(r->ended.why, sizeof r->ended.why, "a worker failed");
    }
    return 0;
}

int dt_rdzv_abort(dt_rdzv *r, int sig, dt_err *err)
{
    (void)err;
    r->ended.state = DT_RDZV_ABORTED;
    r->ended.signal = sig;
    r->ended.node = 0;
    return 0;
}

int dt_rdzv_failures(dt_rdzv *r, dt_rdzv_failure **out, int *n, dt_err *err)
{
    *out = NULL;
    *n = 0;
    if (r->n_fails == 0)
        return 0;
    dt_rdzv_failure *copy = malloc(sizeof *copy * (size_t)r->n_fails);
    if (!copy)
        return dt_err_set(err, -ENOMEM, "out of memory");
    memcpy(copy, r->fails, sizeof *copy * (size_t)r->n_fails);
    /* Stable: equal times keep the order they were recorded in. */
    for (int i = 1; i < r->n_fails; i++)
        for (int j = i; j > 0 && cmp_failure(&copy[j - 1], &copy[j]) > 0; j--) {
            dt_rdzv_failure t = copy[j];
            copy[j] = copy[j - 1];
            copy[j - 1] = t;
        }
    *out = copy;
    *n = r->n_fails;
    return 0;
}

void dt_rdzv_close(dt_rdzv *r)
{
    if (!r)
        return;
    free(r->fails);
    free(r);
}
