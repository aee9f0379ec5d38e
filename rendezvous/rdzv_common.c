/* rdzv_common.c - see rdzv_common.h: the helpers every rendezvous backend uses. */
#include "rendezvous/rdzv_common.h"

#include <arpa/inet.h>
#include <cJSON.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"

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

void dt_rdzv_json_str(const cJSON *o, const char *k, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    dt_strlcpy(out, cJSON_IsString(v) ? v->valuestring : "", cap);
}

double dt_rdzv_json_num(const cJSON *o, const char *k, double def)
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
    f->time = dt_rdzv_json_num(o, "time", 0);
    dt_rdzv_json_str(o, "host", f->host, sizeof f->host);
    f->node = (int)dt_rdzv_json_num(o, "node", -1);
    f->rank = (int)dt_rdzv_json_num(o, "rank", -1);
    f->local_rank = (int)dt_rdzv_json_num(o, "local_rank", -1);
    f->pid = (int)dt_rdzv_json_num(o, "pid", 0);
    f->exit_code = (int)dt_rdzv_json_num(o, "exit_code", 0);
    f->signal = (int)dt_rdzv_json_num(o, "signal", 0);
    dt_rdzv_json_str(o, "message", f->message, sizeof f->message);
    dt_rdzv_json_str(o, "error_file", f->error_file, sizeof f->error_file);
    cJSON_Delete(o);
    return 0;
}

void dt_rdzv_make_id(char *out, size_t cap)
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


void dt_rdzv_sort_failures(dt_rdzv_failure *f, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && cmp_failure(&f[j - 1], &f[j]) > 0; j--) {
            dt_rdzv_failure t = f[j];
            f[j] = f[j - 1];
            f[j - 1] = t;
        }
}

int dt_rdzv_fail_list_add(dt_rdzv_fail_list *l, const dt_rdzv_failure *f, int n, dt_err *err)
{
    if (n <= 0)
        return 0;
    dt_rdzv_failure *grown = realloc(l->v, sizeof *grown * (size_t)(l->n + n));
    if (!grown)
        return dt_err_set(err, -ENOMEM, "out of memory");
    l->v = grown;
    memcpy(l->v + l->n, f, sizeof *f * (size_t)n);
    l->n += n;
    return 0;
}

int dt_rdzv_fail_list_copy(const dt_rdzv_fail_list *l, dt_rdzv_failure **out, int *n,
                           dt_err *err)
{
    *out = NULL;
    *n = 0;
    if (l->n == 0)
        return 0;
    dt_rdzv_failure *copy = malloc(sizeof *copy * (size_t)l->n);
    if (!copy)
        return dt_err_set(err, -ENOMEM, "out of memory");
    memcpy(copy, l->v, sizeof *copy * (size_t)l->n);
    dt_rdzv_sort_failures(copy, l->n);
    *out = copy;
    *n = l->n;
    return 0;
}

void dt_rdzv_fail_list_clear(dt_rdzv_fail_list *l)
{
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int dt_rdzv_append_failures(dt_store *s, const char *key, const dt_rdzv_failure *f, int n,
                            dt_err *err)
{
    size_t cap = 0, len = 0;
    char *lines = NULL;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char *j = dt_rdzv_failure_to_json(&f[i]);
        if (!j)
            continue;
        size_t k = strlen(j);
        if (len + k + 2 > cap) {
            cap = 2 * (len + k + 2);
            char *g = realloc(lines, cap);
            if (!g) {
                free(j);
                break;
            }
            lines = g;
        }
        memcpy(lines + len, j, k);
        len += k;
        lines[len++] = '\n';
        free(j);
    }
    if (len)
        rc = dt_store_append(s, key, lines, len, err);
    free(lines);
    return rc;
}

int dt_rdzv_read_failures(dt_store *s, const char *key, dt_rdzv_failure **out, int *n, dt_err *err)
{
    void *v = NULL;
    size_t len = 0;
    int rc = dt_store_get(s, key, &v, &len, 0, err);
    if (rc)
        return rc;
    int cap = 0, k = 0;
    dt_rdzv_failure *f = NULL;
    char *p = v, *end = (char *)v + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            dt_rdzv_failure *g = realloc(f, sizeof *g * (size_t)cap);
            if (!g)
                break;
            f = g;
        }
        if (l && dt_rdzv_failure_from_json(p, l, &f[k]) == 0)
            k++;
        p += l + 1;
    }
    free(v);
    dt_rdzv_sort_failures(f, k);
    *out = f;
    *n = k;
    return 0;
}

/* bind(2) of fd to ai's address (named so beside the functions' own bind argument). */
static int bind_fd(int fd, const struct addrinfo *ai)
{
    return bind(fd, ai->ai_addr, ai->ai_addrlen);
}

bool dt_rdzv_is_local_host(const char *host)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, "0", &hints, &res) != 0)
        return false;
    bool local = false;
    for (struct addrinfo *ai = res; ai && !local; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        local = !bind_fd(fd, ai);
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

/* The cause in one of dt_store_connect's messages, without its own attempt count (which covers
 * one try of about a second, not the whole wait): the text after "last error: " up to the
 * closing parenthesis, else the whole message. */
static void connect_cause(const char *msg, char *out, size_t cap)
{
    const char *p = strstr(msg, "last error: ");
    if (!p) {
        dt_strlcpy(out, msg, cap);
        return;
    }
    p += strlen("last error: ");
    const char *end = strstr(p, "); is it running");
    snprintf(out, cap, "%.*s", end ? (int)(end - p) : (int)strlen(p), p);
}

/* Whether host resolves; when not, why in out. */
static bool host_resolves(const char *host, char *out, size_t cap)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g == 0) {
        freeaddrinfo(res);
        return true;
    }
    snprintf(out, cap, "cannot resolve \"%s\": %s", host,
             g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    return false;
}

int dt_rdzv_connect_store(dt_store **out, const dt_rdzv_opts *o, const char *host, int port,
                          dt_err *err)
{
    double t0 = dt_now_s(), deadline = t0 + o->join_timeout, next_line = t0 + 5;
    int attempts = 0;
    bool told = false;
    char cause[DT_ERR_MSG_MAX / 2] = "";
    dt_store_opts so;
    dt_store_opts_default(&so);
    /* Calls fail over to "the store is gone" after about a heartbeat timeout, or read_timeout
     * when that is shorter. */
    double t = o->heartbeat_timeout;
    if (o->read_timeout > 0 && o->read_timeout < t)
        t = o->read_timeout;
    so.timeout_ms = (int)(1000 * (t < 1 ? 1 : t > 30 ? 30 : t));
    for (;;) {
        double left = deadline - dt_now_s();
        attempts++;
        if (!host_resolves(host, cause, sizeof cause)) {
            /* Said at once: a typo in --master-addr should not look like a slow first node. */
            if (!told)
                DT_WARN("the rendezvous store's host %s (check --master-addr or "
                        "--rdzv-endpoint); retrying until join_timeout (%g s)",
                        cause, o->join_timeout);
            told = true;
            for (double until = dt_now_s() + DT_MIN(1.0, DT_MAX(left, 0.0));
                 dt_now_s() < until && !(o->interrupted && o->interrupted(o->arg));)
                dt_sleep_ms(50);
        } else {
            so.connect_timeout_ms = left > 1 ? 1000 : (int)(left * 1000) + 1;
            dt_err e = {0};
            int rc = dt_store_connect(out, host, port, &so, &e);
            if (rc == 0) {
                if (told)
                    DT_INFO("reached the rendezvous store at %s:%d after %.1f s", host, port,
                            dt_now_s() - t0);
                return 0;
            }
            if (rc == -EPROTO || rc == -EACCES)
                return dt_err_set(err, rc, "%s", e.msg);
            connect_cause(e.msg, cause, sizeof cause);
        }
        if (o->interrupted && o->interrupted(o->arg))
            return dt_err_set(err, -EINTR, "interrupted while connecting to the store");
        double now = dt_now_s();
        if (now >= deadline)
            return dt_err_set(err, -ETIMEDOUT,
                              "cannot reach the rendezvous store at %s:%d: %d attempt%s over "
                              "%.1f s (join_timeout %g s); last error: %s",
                              host, port, attempts, attempts == 1 ? "" : "s", now - t0,
                              o->join_timeout, cause);
        if (now >= next_line) {
            DT_INFO("still waiting for the rendezvous store at %s:%d (%.0f s of join_timeout "
                    "%g s): %s",
                    host, port, now - t0, o->join_timeout, cause);
            next_line = now + 5;
        }
    }
}

static bool is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    return a->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

void dt_rdzv_store_bind(const char *host, char *bind, char *conn, size_t cap)
{
    const char *env = dt_env("DTRAIN_STORE_BIND");
    struct in6_addr a6;
    bool numeric = inet_pton(AF_INET, host, &a6) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
    bind[0] = '\0';
    if (env && *env) {
        dt_strlcpy(bind, env, cap);
    } else if (numeric) {
        dt_strlcpy(bind, host, cap);
    } else {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        bool loop_only = true;
        if (getaddrinfo(host, "0", &hints, &res) == 0) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
                bool mine = fd >= 0 && !bind_fd(fd, ai);
                if (fd >= 0)
                    close(fd);
                if (mine && !bind[0] &&
                    getnameinfo(ai->ai_addr, ai->ai_addrlen, bind, (socklen_t)cap, NULL, 0,
                                NI_NUMERICHOST) != 0)
                    bind[0] = '\0';
                loop_only = loop_only && is_loopback(ai->ai_addr);
            }
            freeaddrinfo(res);
        }
        if (bind[0] && loop_only && strcmp(host, "localhost")) {
            DT_INFO("%s resolves here to the loopback address %s only, which the other nodes "
                    "cannot reach: the rendezvous store listens on every interface "
                    "(DTRAIN_STORE_BIND=ADDR chooses one)",
                    host, bind);
            bind[0] = '\0';
        } else if (!bind[0]) {
            DT_INFO("%s is no address of this host: the rendezvous store listens on every "
                    "interface (DTRAIN_STORE_BIND=ADDR chooses one)",
                    host);
        }
        if (!bind[0])
            dt_strlcpy(bind, "0.0.0.0", cap);
    }
    dt_strlcpy(conn, !strcmp(bind, "0.0.0.0") ? "127.0.0.1" : !strcmp(bind, "::") ? "::1" : bind,
               cap);
}

int dt_rdzv_host_store(dt_store_server **out, const char *bind_host, int port, dt_err *err)
{
    dt_store_server_opts so;
    dt_store_server_opts_default(&so);
    so.host = bind_host;
    so.port = port;
    so.token = dt_env("DTRAIN_STORE_TOKEN");
    dt_err e = {0};
    int rc = dt_store_server_start(out, &so, &e);
    if (rc == -EADDRINUSE)
        return rc;
    if (rc)
        return dt_err_set(err, rc, "%s", e.msg);
    return 0;
}

void dt_rdzv_keyf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

int dt_rdzv_get_str(dt_store *s, const char *key, char **out, int ms, dt_err *err)
{
    void *v = NULL;
    size_t len = 0;
    int rc = dt_store_get(s, key, &v, &len, ms, err);
    *out = rc == 0 ? v : NULL;
    return rc;
}

int dt_rdzv_set_str(dt_store *s, const char *key, const char *v, dt_err *err)
{
    return dt_store_set(s, key, v, strlen(v), err);
}

int dt_rdzv_cas_new(dt_store *s, const char *key, const char *desired, bool *won, char **cur,
                    dt_err *err)
{
    void *v = NULL;
    size_t len = 0;
    int rc = dt_store_cas(s, key, NULL, 0, desired, strlen(desired), &v, &len, err);
    if (rc) {
        if (cur)
            *cur = NULL;
        return rc;
    }
    if (won)
        *won = v && len == strlen(desired) && !memcmp(v, desired, len);
    char *t = v ? strndup(v, len) : strdup("");
    free(v);
    if (cur)
        *cur = t;
    else
        free(t);
    return 0;
}

/* ---- the job's settings (conf) --------------------------------------------------------- */

int dt_rdzv_check_run_id(const char *id, char *why, size_t cap)
{
    size_t n = strlen(id);
    const char *bad = NULL;
    for (const char *p = id; *p && !bad; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            bad = p;
    if (n == 0 || n > 200)
        snprintf(why, cap, "must be 1 to 200 characters long (it has %zu)", n);
    else if (bad && ((unsigned char)*bad < 0x20 || *bad == 0x7f))
        snprintf(why, cap, "holds a control character (byte 0x%02x)", (unsigned char)*bad);
    else if (bad)
        snprintf(why, cap, "holds '%c': a run id is letters, digits, '.', '_' and '-'", *bad);
    else if (strstr(id, ".."))
        snprintf(why, cap, "holds \"..\" (it names a directory under the log dir)");
    else
        return 0;
    return -EINVAL;
}

void dt_rdzv_job_digest(const char *text, char out[17])
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = text ? text : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* A value as it may be shown on a terminal: control characters as '?', cut to cap. */
static void printable(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    for (; in && *in && k + 1 < cap; in++, k++)
        out[k] = (unsigned char)*in < 0x20 || *in == 0x7f ? '?' : *in;
    out[k] = '\0';
}

char *dt_rdzv_conf_propose(const dt_rdzv_opts *o, int min, int max)
{
    char run_id[DT_RDZV_STR], digest[17];
    if (o->run_id[0] && strcmp(o->run_id, "none"))
        dt_strlcpy(run_id, o->run_id, sizeof run_id);
    else
        dt_rdzv_make_id(run_id, sizeof run_id);
    dt_rdzv_job_digest(o->job, digest);
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "run_id", run_id);
    cJSON_AddNumberToObject(j, "max_restarts", o->max_restarts);
    cJSON_AddNumberToObject(j, "min", min);
    cJSON_AddNumberToObject(j, "max", max);
    cJSON_AddStringToObject(j, "job", o->job ? o->job : "");
    cJSON_AddStringToObject(j, "digest", digest);
    if (o->ending)
        cJSON_AddBoolToObject(j, "ending", true);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

void dt_rdzv_conf_free(dt_rdzv_conf *c)
{
    if (c) {
        free(c->job);
        c->job = NULL;
    }
}

/* An integer member lo..hi of o into *v; else -EINVAL naming it. */
static int conf_int(const cJSON *o, const char *k, int lo, int hi, int *v, const char *where,
                    const char *fix, dt_err *err)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x))
        return dt_err_set(err, -EINVAL, "the job's settings in %s: \"%s\" is %s, not a number; %s",
                          where, k, x ? "of another type" : "missing", fix);
    double d = x->valuedouble;
    if (d != (double)(long long)d || d < lo || d > hi)
        return dt_err_set(err, -EINVAL,
                          "the job's settings in %s: \"%s\" = %.17g must be a whole number from "
                          "%d to %d; %s",
                          where, k, d, lo, hi, fix);
    *v = (int)d;
    return 0;
}

/* Whether the job's text is what dt_job_shared_text writes: lines "key=value" (key of
 * [a-z0-9_.]), no control characters but the newlines. */
static bool job_text_ok(const char *t)
{
    for (const char *p = t; *p;) {
        const char *nl = strchr(p, '\n'), *eq = strchr(p, '=');
        if (!nl || !eq || eq > nl || eq == p)
            return false;
        for (const char *q = p; q < eq; q++)
            if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_' || *q == '.'))
                return false;
        for (const char *q = eq + 1; q < nl; q++)
            if ((unsigned char)*q < 0x20 || *q == 0x7f)
                return false;
        p = nl + 1;
    }
    return true;
}

int dt_rdzv_conf_parse(const char *cur, const char *where, const char *fix, dt_rdzv_conf *c,
                       dt_err *err)
{
    char why[160], shown[80];
    int rc = 0;
    memset(c, 0, sizeof *c);
    cJSON *j = cur ? cJSON_Parse(cur) : NULL;
    if (!j || !cJSON_IsObject(j)) {
        printable(cur, shown, 41);
        cJSON_Delete(j);
        return dt_err_set(err, -EINVAL,
                          "the job's settings in %s are not a JSON object (\"%s\"%s): not "
                          "written by dtrain, or damaged; %s",
                          where, shown, cur && strlen(cur) > 40 ? "..." : "", fix);
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "run_id");
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(j, "job");
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(j, "digest");
    if (!cJSON_IsString(id)) {
        rc = dt_err_set(err, -EINVAL, "the job's settings in %s: \"run_id\" is %s, not a string; "
                        "%s", where, id ? "of another type" : "missing", fix);
        goto out;
    }
    if (dt_rdzv_check_run_id(id->valuestring, why, sizeof why)) {
        printable(id->valuestring, shown, sizeof shown);
        rc = dt_err_set(err, -EINVAL, "the job's settings in %s: \"run_id\" = \"%s\" %s; %s",
                        where, shown, why, fix);
        goto out;
    }
    dt_strlcpy(c->run_id, id->valuestring, sizeof c->run_id);
    if ((rc = conf_int(j, "min", 1, 1000000, &c->min, where, fix, err)) ||
        (rc = conf_int(j, "max", 1, 1000000, &c->max, where, fix, err)) ||
        (rc = conf_int(j, "max_restarts", 0, 1000000, &c->max_restarts, where, fix, err)))
        goto out;
    if (c->min > c->max) {
        rc = dt_err_set(err, -EINVAL, "the job's settings in %s: \"min\" = %d is more than "
                        "\"max\" = %d; %s", where, c->min, c->max, fix);
        goto out;
    }
    if (job && (!cJSON_IsString(job) || strlen(job->valuestring) > 256 * 1024 ||
                !job_text_ok(job->valuestring))) {
        rc = dt_err_set(err, -EINVAL, "the job's settings in %s: \"job\" is not the settings' "
                        "text dtrain writes (key=value lines); %s", where, fix);
        goto out;
    }
    c->job = strdup(job ? job->valuestring : "");
    if (!c->job) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    dt_rdzv_job_digest(c->job, c->digest);
    c->ending = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ending"));
    if (job && (!cJSON_IsString(dg) || strcmp(dg->valuestring, c->digest))) {
        rc = dt_err_set(err, -EINVAL, "the job's settings in %s: \"digest\" does not match its "
                        "\"job\" (the record is damaged); %s", where, fix);
        goto out;
    }
out:
    cJSON_Delete(j);
    if (rc)
        dt_rdzv_conf_free(c);
    return rc;
}

/* The value of key k (n bytes) in lines "k=v\n" of text: a pointer to v and its length in *len,
 * or NULL. */
static const char *job_value(const char *text, const char *k, size_t n, size_t *len)
{
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l > n && p[n] == '=' && !strncmp(p, k, n)) {
            *len = l - n - 1;
            return p + n + 1;
        }
        p = nl ? nl + 1 : NULL;
    }
    return NULL;
}

bool dt_rdzv_world_usable(const dt_rdzv_opts *o, int world)
{
    return !o->world_usable || o->world_usable(o->arg, world);
}

int dt_rdzv_usable_prefix(const dt_rdzv_opts *o, int min, int R, const int *nproc, size_t stride,
                          int n)
{
#define NPROC(i) (*(const int *)((const char *)nproc + (size_t)(i) * stride))
    int world = 0;
    for (int i = 0; i < n; i++)
        world += NPROC(i);
    for (int m = n; m >= min && m >= 1; m--) {
        if (dt_rdzv_world_usable(o, world)) {
            if (m < n)
                DT_INFO("round %d: %d nodes joined; the job's layout runs on %d of them (world "
                        "%d), and %d wait%s as a spare%s",
                        R, n, m, world, n - m, n - m == 1 ? "s" : "", n - m == 1 ? "" : " each");
            return m;
        }
        world -= NPROC(m - 1);
    }
    return n;
#undef NPROC
}

int dt_rdzv_conf_check_job(const dt_rdzv_conf *c, const char *mine, const char *where,
                           char *keys, size_t kcap, dt_err *err)
{
    size_t klen = 0;
    if (keys && kcap)
        keys[0] = '\0';
    if (c->ending) /* the first node came only to end the job: there is none to join */
        return 0;
    const char *theirs = c->job ? c->job : "";
    mine = mine ? mine : "";
    if (!strcmp(theirs, mine))
        return 0;
    if ((!*theirs || !*mine) && keys)
        snprintf(keys, kcap, "%s", *mine ? "a job file, not a command" : "a command, not a job file");
    if (!*theirs || !*mine)
        return dt_err_set(err, -EINVAL,
                          "this node cannot join the job with rendezvous id \"%s\": the job was "
                          "started %s, this node %s (recorded in %s); start every node the same "
                          "way, or give this one another --rdzv-id to start a job of its own",
                          c->run_id, *theirs ? "with a job file" : "with a command (after --)",
                          *mine ? "with a job file" : "with a command (after --)", where);
    char list[DT_ERR_MSG_MAX / 2] = "";
    size_t len = 0;
    int n = 0;
    /* every key of this node's job that the job has with another value, or not at all; then
     * the job's keys this node does not have (another version of dtrain) */
    for (int pass = 0; pass < 2; pass++) {
        const char *a = pass ? theirs : mine, *b = pass ? mine : theirs;
        for (const char *p = a; *p;) {
            const char *nl = strchr(p, '\n'), *eq = strchr(p, '=');
            if (!nl)
                nl = p + strlen(p);
            if (eq && eq < nl) {
                size_t kn = (size_t)(eq - p), vl = 0;
                const char *v = eq + 1, *w = job_value(b, p, kn, &vl);
                size_t al = (size_t)(nl - v);
                bool differ = pass ? !w : !w || vl != al || memcmp(v, w, al);
                if (differ) {
                    n++;
                    if (keys && klen + kn + 3 < kcap)
                        klen += (size_t)snprintf(keys + klen, kcap - klen, "%s%.*s",
                                                 klen ? ", " : "", (int)kn, p);
                    if (n <= 6 && len < sizeof list - 1) {
                        const char *vm = pass ? NULL : v, *vj = pass ? v : w;
                        size_t lm = pass ? 0 : al, lj = pass ? al : vl;
                        len += (size_t)snprintf(
                            list + len, sizeof list - len, "%s%.*s = %s%.*s%s here, %s%.*s%s in "
                            "the job",
                            n > 1 ? "; " : "", (int)kn, p, vm ? "\"" : "", (int)DT_MIN(lm, 60u),
                            vm ? vm : "(not set)", vm ? "\"" : "", vj ? "\"" : "",
                            (int)DT_MIN(lj, 60u), vj ? vj : "(not set)", vj ? "\"" : "");
                    } else if (len < sizeof list - 1) {
                        len += (size_t)snprintf(list + len, sizeof list - len, "%s%.*s",
                                                n == 7 ? "; and also " : ", ", (int)kn, p);
                    }
                    len = DT_MIN(len, sizeof list - 1);
                }
            }
            p = *nl ? nl + 1 : nl;
        }
    }
    return dt_err_set(err, -EINVAL,
                      "this node's job differs from the one that runs with rendezvous id \"%s\" "
                      "(the first node's, recorded in %s): %d key%s differ%s: %s. Start this "
                      "node with the same job file and overrides (dtrain --print-config JOB "
                      "shows the resolved job), or give it another --rdzv-id to start a job of "
                      "its own; nothing was started here",
                      c->run_id, where, n, n == 1 ? "" : "s", n == 1 ? "s" : "", list);
}

int dt_rdzv_conf_adopt(const char *cur, const char *where, const char *fix,
                       const dt_rdzv_opts *o, int *min, int *max, int *max_restarts,
                       char *run_id, size_t cap, dt_err *err)
{
    dt_rdzv_conf c;
    int rc = dt_rdzv_conf_parse(cur, where, fix, &c, err);
    if (rc)
        return rc;
    if (!o->ending && (rc = dt_rdzv_conf_check_job(&c, o->job, where, NULL, 0, err))) {
        dt_rdzv_conf_free(&c);
        return rc;
    }
    if (c.min != *min || c.max != *max)
        DT_WARN("--nnodes=%s here, but the job was started with --nnodes=%d:%d: using the job's",
                o->nnodes, c.min, c.max);
    if (c.max_restarts != o->max_restarts)
        DT_WARN("--max-restarts=%d here, but the job was started with %d: the job's budget is %d",
                o->max_restarts, c.max_restarts, c.max_restarts);
    DT_DEBUG("the job's settings (digest %s) agree with this node's", c.digest);
    *min = c.min;
    *max = c.max;
    *max_restarts = c.max_restarts;
    dt_strlcpy(run_id, c.run_id, cap);
    dt_rdzv_conf_free(&c);
    return 0;
}
