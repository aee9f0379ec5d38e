/* rdzv_etcd_client.c - see rdzv_etcd_client.h: etcd's v3 JSON gateway over libcurl. */
#include "rendezvous/rdzv_etcd_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

#define MAX_MEMBERS 16

struct dt_etcd {
    CURL *curl;
    char list[1024];
    char url[MAX_MEMBERS][300]; /* "http://host:port" */
    char name[MAX_MEMBERS][300]; /* "host:port" as given */
    int n, cur;
    double budget_s;
    dt_etcd_tls tls;
    char token[512]; /* auth token ("" = none) */
    bool unreachable; /* the last call found no member that could serve it */
    bool stale_token; /* the member said the token is no longer valid */
    bool (*interrupted)(void *);
    void *arg;
};

static int authenticate(dt_etcd *e, dt_err *err);

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- base64 -------------------------------------------------------------------------------- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const char *s, size_t len)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1), *p = out;
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)u[i] << 16 | (i + 1 < len ? (unsigned)u[i + 1] << 8 : 0) |
                     (i + 2 < len ? u[i + 2] : 0);
        *p++ = b64[v >> 18 & 63];
        *p++ = b64[v >> 12 & 63];
        *p++ = i + 1 < len ? b64[v >> 6 & 63] : '=';
        *p++ = i + 2 < len ? b64[v & 63] : '=';
    }
    *p = '\0';
    return out;
}

static char *b64_decode(const char *s)
{
    size_t len = strlen(s);
    char *out = malloc(len / 4 * 3 + 4), *p = out;
    unsigned v = 0;
    int bits = 0;
    if (!out)
        return NULL;
    for (const char *q = s; *q && *q != '='; q++) {
        const char *f = strchr(b64, *q);
        if (!f)
            continue;
        v = v << 6 | (unsigned)(f - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            *p++ = (char)(v >> bits & 0xff);
        }
    }
    *p = '\0';
    return out;
}

/* "prefix" -> the range_end that covers every key with it (the prefix with its last byte + 1). */
static char *prefix_end(const char *key)
{
    size_t len = strlen(key);
    char *end = malloc(len + 1);
    if (!end)
        return NULL;
    memcpy(end, key, len + 1);
    while (len > 0) {
        if ((unsigned char)end[len - 1] < 0xff) {
            end[len - 1]++;
            end[len] = '\0';
            return end;
        }
        len--;
    }
    end[0] = '\0'; /* every key: "\0" */
    return end;
}

static void add_b64(cJSON *o, const char *name, const char *s)
{
    char *v = b64_encode(s, strlen(s));
    cJSON_AddStringToObject(o, name, v ? v : "");
    free(v);
}

static void add_i64(cJSON *o, const char *name, int64_t x)
{
    char v[32];
    snprintf(v, sizeof v, "%" PRId64, x);
    cJSON_AddStringToObject(o, name, v);
}

int64_t dt_etcd_json_i64(const cJSON *o, const char *k, int64_t def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v))
        return (int64_t)v->valuedouble;
    return def;
}

/* ---- transport ----------------------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
    /* watch: stop once an event arrived */
    bool watch, created, event, connected;
} buf;

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg)
{
    buf *b = arg;
    size_t len = size * nmemb;
    if (b->n + len + 1 > b->cap) {
        size_t cap = DT_MAX(b->cap * 2, b->n + len + 1024);
        if (cap > (64u << 20))
            return 0; /* an answer this large is not the gateway's */
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = '\0';
    if (b->watch) {
        if (strstr(b->p, "\"created\":true"))
            b->created = true;
        if (strstr(b->p, "\"events\""))
            b->event = true;
        if (b->event)
            return 0; /* got what we waited for: end the transfer */
    }
    return len;
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    dt_etcd *e = arg;
    return e->interrupted && e->interrupted(e->arg) ? 1 : 0;
}

/* One HTTP POST to member m. Returns 0 with *b filled and *http the status; -EAGAIN for a
 * transport failure (why filled); -EINTR. */
static int post(dt_etcd *e, int m, const char *path, const char *body, buf *b, long *http,
                double timeout_s, char *why, size_t cap)
{
    char url[512];
    struct curl_slist *h = NULL;
    snprintf(url, sizeof url, "%s%s", e->url[m], path);
    curl_easy_reset(e->curl);
    curl_easy_setopt(e->curl, CURLOPT_URL, url);
    curl_easy_setopt(e->curl, CURLOPT_POST, 1L);
    curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    h = curl_slist_append(h, "Content-Type: application/json");
    if (e->token[0]) {
        char a[600];
        snprintf(a, sizeof a, "Authorization: %s", e->token);
        h = curl_slist_append(h, a);
    }
    curl_easy_setopt(e->curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
    long ms = (long)(timeout_s * 1000);
    if (ms < 50)
        ms = 50;
    curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, DT_MIN(ms, 2000L));
    curl_easy_setopt(e->curl, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(e->curl, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e->curl, CURLOPT_XFERINFODATA, e);
    curl_easy_setopt(e->curl, CURLOPT_NOPROGRESS, 0L);
    if (e->tls.cacert[0])
        curl_easy_setopt(e->curl, CURLOPT_CAINFO, e->tls.cacert);
    if (e->tls.cert[0])
        curl_easy_setopt(e->curl, CURLOPT_SSLCERT, e->tls.cert);
    if (e->tls.key[0])
        curl_easy_setopt(e->curl, CURLOPT_SSLKEY, e->tls.key);
    CURLcode rc = curl_easy_perform(e->curl);
    curl_slist_free_all(h);
    if (b->watch) {
        curl_off_t up = 0;
        curl_easy_getinfo(e->curl, CURLINFO_SIZE_UPLOAD_T, &up);
        b->connected = up > 0; /* the request reached the member */
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK)
        return -EINTR;
    if (b->watch && (rc == CURLE_WRITE_ERROR || rc == CURLE_OPERATION_TIMEDOUT) &&
        (b->event || b->created || (rc == CURLE_OPERATION_TIMEDOUT && b->connected)))
        /* the watch ended as meant: an event, or its time with none; also when a member that
         * took the connection was too busy to confirm the watch in time (the caller reads the
         * state again, with failover, before it waits any more) */
        return 0;
    bool https = !strncmp(e->url[m], "https://", 8);
    if (rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_PEER_FAILED_VERIFICATION ||
        rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CIPHER || rc == CURLE_SSL_CACERT_BADFILE ||
        rc == CURLE_SSL_ENGINE_NOTFOUND || rc == CURLE_SSL_ISSUER_ERROR ||
        rc == CURLE_SSL_CRL_BADFILE || rc == CURLE_SSL_PINNEDPUBKEYNOTMATCH) {
        /* a member that answers but that TLS cannot agree with: no other member will differ */
        snprintf(why, cap, "TLS with etcd member %s failed: %s (check rendezvous.cacert, cert "
                 "and key, and that the member's certificate names this address)",
                 e->name[m], curl_easy_strerror(rc));
        return -EPERM;
    }
    if (rc != CURLE_OK) {
        snprintf(why, cap, "%s%s", rc == CURLE_OPERATION_TIMEDOUT ? "no answer in time"
                                   : rc == CURLE_COULDNT_CONNECT ? "connection refused"
                                                                 : curl_easy_strerror(rc),
                 https && (rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
                           rc == CURLE_GOT_NOTHING)
                     ? "; over TLS this is also how a member refuses a connection without the "
                       "client certificate it requires (rendezvous.cert and key)"
                     : "");
        return -EAGAIN;
    }
    curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, http);
    return 0;
}

int dt_etcd_open(dt_etcd **out, const char *endpoints, double budget_s, const dt_etcd_tls *tls,
                 dt_err *err)
{
    pthread_once(&curl_once, curl_init_once);
    *out = NULL;
    dt_etcd *e = calloc(1, sizeof *e);
    if (!e)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (tls)
        e->tls = *tls;
    e->budget_s = budget_s > 0.2 ? budget_s : 0.2;
    dt_strlcpy(e->list, endpoints, sizeof e->list);
    char list[1024], *save = NULL;
    dt_strlcpy(list, endpoints, sizeof list);
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        t = dt_trim(t);
        if (!*t)
            continue;
        if (e->n == MAX_MEMBERS) {
            free(e);
            return dt_err_set(err, -EINVAL, "--rdzv-endpoint: more than %d etcd members",
                              MAX_MEMBERS);
        }
        bool scheme = !strncmp(t, "http://", 7) || !strncmp(t, "https://", 8);
        const char *hp = scheme ? strstr(t, "//") + 2 : t;
        if (!strchr(hp, ':') || hp[strlen(hp) - 1] == ':') {
            free(e);
            return dt_err_set(err, -EINVAL,
                              "--rdzv-endpoint: etcd member \"%s\" has no port (HOST:PORT, e.g. "
                              "node0:2379)",
                              t);
        }
        snprintf(e->url[e->n], sizeof e->url[0], "%s%s",
                 scheme ? "" : (e->tls.cacert[0] || e->tls.cert[0] ? "https://" : "http://"), t);
        dt_strlcpy(e->name[e->n], hp, sizeof e->name[0]);
        e->n++;
    }
    if (e->n == 0) {
        free(e);
        return dt_err_set(err, -EINVAL,
                          "--rdzv-endpoint: the etcd backend needs the members, "
                          "HOST:PORT[,HOST:PORT...]");
    }
    if (!(e->curl = curl_easy_init())) {
        free(e);
        return dt_err_set(err, -ENOMEM, "libcurl: cannot make a handle");
    }
    if (e->tls.user[0]) {
        int rc = authenticate(e, err);
        if (rc) {
            dt_etcd_free(e);
            return rc;
        }
    }
    *out = e;
    return 0;
}

/* A token for the user (/v3/auth/authenticate), sent on every call from now on. */
static int authenticate(dt_etcd *e, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *r = NULL;
    cJSON_AddStringToObject(b, "name", e->tls.user);
    cJSON_AddStringToObject(b, "password", e->tls.password);
    e->token[0] = '\0';
    int rc = dt_etcd_call(e, "/v3/auth/authenticate", b, &r, err);
    cJSON_Delete(b);
    const cJSON *t = r ? cJSON_GetObjectItemCaseSensitive(r, "token") : NULL;
    if (!rc && !cJSON_IsString(t))
        rc = dt_err_set(err, -EACCES, "etcd at %s: authentication as \"%s\" gave no token (is "
                        "authentication enabled there?)",
                        e->list, e->tls.user);
    if (!rc)
        dt_strlcpy(e->token, t->valuestring, sizeof e->token);
    else if (rc == -EIO || rc == -EACCES)
        dt_err_prefix(err, "authenticating as \"%s\": ", e->tls.user);
    cJSON_Delete(r);
    return rc;
}

void dt_etcd_free(dt_etcd *e)
{
    if (!e)
        return;
    if (e->curl)
        curl_easy_cleanup(e->curl);
    free(e);
}

bool dt_etcd_unreachable(const dt_etcd *e)
{
    return e->unreachable;
}

const char *dt_etcd_endpoints(const dt_etcd *e)
{
    return e->list;
}

int dt_etcd_count(const dt_etcd *e)
{
    return e->n;
}

const char *dt_etcd_member(const dt_etcd *e, int m)
{
    return e->name[m];
}

void dt_etcd_set_interrupt(dt_etcd *e, bool (*fn)(void *), void *arg)
{
    e->interrupted = fn;
    e->arg = arg;
}

/* An answer from member m: 0 with *resp, or an error. *retry: the member cannot serve now (no
 * leader, cut off from the quorum), try another. */
static int judge(dt_etcd *e, int m, long http, buf *b, cJSON **resp, bool *retry, char *why,
                 size_t cap, dt_err *err)
{
    cJSON *o = b->p ? cJSON_Parse(b->p) : NULL;
    *retry = false;
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return dt_err_set(err, -EPROTO,
                          "rendezvous endpoint %s answered (HTTP %ld) but is not an etcd v3 "
                          "server: check --rdzv-endpoint (the etcd members' client URLs, e.g. "
                          "host:2379)",
                          e->name[m], http);
    }
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(o, "message");
    if (!cJSON_IsString(msg))
        msg = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (http == 200 && !cJSON_GetObjectItemCaseSensitive(o, "error")) {
        if (!cJSON_GetObjectItemCaseSensitive(o, "header") &&
            !cJSON_GetObjectItemCaseSensitive(o, "result")) {
            cJSON_Delete(o);
            return dt_err_set(err, -EPROTO,
                              "rendezvous endpoint %s answered but not as etcd's v3 gateway "
                              "does (no header): check --rdzv-endpoint",
                              e->name[m]);
        }
        *resp = o;
        return 0;
    }
    const char *s = cJSON_IsString(msg) ? msg->valuestring : "";
    if (http == 404 && !s[0]) {
        cJSON_Delete(o);
        return dt_err_set(err, -EPROTO,
                          "rendezvous endpoint %s answered 404: not an etcd v3 gateway (etcd "
                          ">= 3.4 serves /v3/)",
                          e->name[m]);
    }
    if (strstr(s, "timed out") || strstr(s, "no leader") || strstr(s, "leader changed") ||
        strstr(s, "not capable") || strstr(s, "unavailable") || http == 503) {
        snprintf(why, cap, "%s", s[0] ? s : "unavailable");
        *retry = true;
        cJSON_Delete(o);
        return -EAGAIN;
    }
    if (strstr(s, "user name is empty") || (strstr(s, "invalid auth token") && !e->tls.user[0])) {
        dt_err_set(err, -EACCES,
                   "etcd at %s requires authentication: give --rdzv-conf "
                   "user=NAME,password_file=FILE",
                   e->name[m]);
        cJSON_Delete(o);
        return -EACCES;
    }
    if (strstr(s, "invalid auth token")) { /* expired: the caller authenticates again */
        e->stale_token = true;
        dt_err_set(err, -EACCES, "etcd at %s: %s", e->name[m], s);
        cJSON_Delete(o);
        return -EACCES;
    }
    int code = (int)dt_etcd_json_i64(o, "code", 0);
    int rc = strstr(s, "lease not found") ? -ENOENT
             : code == 16 || code == 7   ? -EACCES
                                         : -EIO;
    dt_err_set(err, rc, "etcd at %s: %s (HTTP %ld)", e->name[m], s[0] ? s : "error", http);
    cJSON_Delete(o);
    return rc;
}

static int call(dt_etcd *e, const char *path, const cJSON *body, cJSON **resp, bool watch,
                int watch_ms, bool *event, dt_err *err)
{
    bool again = false;
retry:;
    char *text = cJSON_PrintUnformatted(body);
    char why[MAX_MEMBERS][400];
    memset(why, 0, sizeof why);
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory");
    double deadline = dt_now_s() + e->budget_s + (watch ? watch_ms / 1000.0 : 0);
    double try_s = DT_MAX(e->budget_s / 2, 0.5);
    int rc = -EAGAIN;
    for (int tries = 0;; tries++) {
        int m = e->cur;
        double left = deadline - dt_now_s();
        if (tries > 0 && left <= 0)
            break;
        buf b = {.watch = watch};
        long http = 0;
        double t = watch ? watch_ms / 1000.0 : DT_MIN(try_s, DT_MAX(left, 0.2));
        double t0 = dt_now_s();
        rc = post(e, m, path, text, &b, &http, t, why[m], sizeof why[m]);
        double took = dt_now_s() - t0;
        /* A try that overran its own timeout by far means this process was stopped meanwhile
         * (SIGSTOP, a paused VM): the budget is for the cluster's answer, not for our sleep, so
         * the other members still get their tries (else a request in flight at a freeze gives
         * up on the whole cluster at once after the thaw). */
        if (took > t + 1.0)
            deadline += took - t;
        if (rc == 0 && watch) {
            if (event)
                *event = b.event;
            free(b.p);
            break;
        }
        bool retry = false;
        if (rc == -EPERM) {
            free(b.p);
            free(text);
            return dt_err_set(err, -EACCES, "%s", why[m]);
        }
        if (rc == 0)
            rc = judge(e, m, http, &b, resp, &retry, why[m], sizeof why[m], err);
        free(b.p);
        if (rc != -EAGAIN)
            break;
        e->cur = (e->cur + 1) % e->n;
        if (e->interrupted && e->interrupted(e->arg)) {
            rc = -EINTR;
            break;
        }
        if (e->cur == 0 || e->n == 1)
            dt_sleep_ms(100); /* a whole round failed: do not spin */
        if (dt_now_s() >= deadline)
            break;
    }
    free(text);
    e->unreachable = rc == -EAGAIN;
    if (rc == -EACCES && e->stale_token && !again && e->tls.user[0] && strcmp(path, "/v3/auth/authenticate")) {
        e->stale_token = false;
        again = true;
        if ((rc = authenticate(e, err)) == 0)
            goto retry;
        return rc;
    }
    if (rc == -EINTR)
        return dt_err_set(err, -EINTR, "interrupted");
    if (rc == -EAGAIN) {
        char all[2000] = "";
        for (int i = 0; i < e->n; i++) {
            size_t l = strlen(all);
            snprintf(all + l, sizeof all - l, "%s%.200s (%.300s)", i ? ", " : "", e->name[i],
                     why[i][0] ? why[i] : "not tried");
        }
        return dt_err_set(err, -ETIMEDOUT,
                          "the etcd cluster of the rendezvous has lost quorum or is unreachable: "
                          "no member served the request within %.1f s: %s",
                          e->budget_s, all);
    }
    return rc;
}

int dt_etcd_call(dt_etcd *e, const char *path, const cJSON *body, cJSON **resp, dt_err *err)
{
    *resp = NULL;
    return call(e, path, body, resp, false, 0, NULL, err);
}

int dt_etcd_call_one(dt_etcd *e, int member, const char *path, const cJSON *body, cJSON **resp,
                     double timeout_s, dt_err *err)
{
    char why[400] = "";
    char *text = cJSON_PrintUnformatted(body);
    buf b = {0};
    long http = 0;
    bool retry = false;
    *resp = NULL;
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int rc = post(e, member, path, text, &b, &http, timeout_s, why, sizeof why);
    free(text);
    if (rc == -EPERM)
        return dt_err_set(err, -EACCES, "%s", why);
    if (rc == 0)
        rc = judge(e, member, http, &b, resp, &retry, why, sizeof why, err);
    free(b.p);
    if (rc == -EAGAIN)
        return dt_err_set(err, -ETIMEDOUT, "etcd member %s: %s", e->name[member], why);
    return rc;
}

/* ---- key-value ----------------------------------------------------------------------------- */

static cJSON *range_body(const char *key, bool prefix, bool keys_only, bool count_only)
{
    cJSON *b = cJSON_CreateObject();
    add_b64(b, "key", key);
    if (prefix) {
        char *end = prefix_end(key);
        add_b64(b, "range_end", end ? end : "");
        free(end);
    }
    if (keys_only)
        cJSON_AddTrueToObject(b, "keys_only");
    if (count_only)
        cJSON_AddTrueToObject(b, "count_only");
    return b;
}

static int decode_kvs(const cJSON *r, dt_etcd_kv **kvs, int *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(r, "kvs");
    int cnt = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    *kvs = NULL;
    *n = 0;
    if (!cnt)
        return 0;
    dt_etcd_kv *v = calloc((size_t)cnt, sizeof *v);
    if (!v)
        return -ENOMEM;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a)
    {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(x, "key");
        const cJSON *val = cJSON_GetObjectItemCaseSensitive(x, "value");
        v[i].key = b64_decode(cJSON_IsString(k) ? k->valuestring : "");
        v[i].value = b64_decode(cJSON_IsString(val) ? val->valuestring : "");
        v[i].create_rev = dt_etcd_json_i64(x, "create_revision", 0);
        v[i].mod_rev = dt_etcd_json_i64(x, "mod_revision", 0);
        v[i].lease = dt_etcd_json_i64(x, "lease", 0);
        if (!v[i].key || !v[i].value) {
            dt_etcd_kvs_free(v, i + 1);
            return -ENOMEM;
        }
        i++;
    }
    *kvs = v;
    *n = i;
    return 0;
}

void dt_etcd_kvs_free(dt_etcd_kv *kvs, int n)
{
    for (int i = 0; kvs && i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

int dt_etcd_range(dt_etcd *e, const char *key, bool prefix, bool keys_only, bool count_only,
                  dt_etcd_kv **kvs, int *n, int64_t *count, int64_t *rev, dt_err *err)
{
    cJSON *b = range_body(key, prefix, keys_only, count_only), *r = NULL;
    int rc = dt_etcd_call(e, "/v3/kv/range", b, &r, err);
    cJSON_Delete(b);
    if (kvs)
        *kvs = NULL;
    if (n)
        *n = 0;
    if (rc)
        return rc;
    if (count)
        *count = dt_etcd_json_i64(r, "count", 0);
    if (rev)
        *rev = dt_etcd_json_i64(cJSON_GetObjectItemCaseSensitive(r, "header"), "revision", 0);
    if (kvs && decode_kvs(r, kvs, n))
        rc = dt_err_set(err, -ENOMEM, "out of memory");
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_get(dt_etcd *e, const char *key, char **val, int64_t *mod_rev, dt_err *err)
{
    dt_etcd_kv *kv = NULL;
    int n = 0;
    *val = NULL;
    int rc = dt_etcd_range(e, key, false, false, false, &kv, &n, NULL, NULL, err);
    if (rc)
        return rc;
    if (n == 0)
        return -ENOENT;
    *val = kv[0].value;
    kv[0].value = NULL;
    if (mod_rev)
        *mod_rev = kv[0].mod_rev;
    dt_etcd_kvs_free(kv, n);
    return 0;
}

cJSON *dt_etcd_op_put(const char *key, const char *val, int64_t lease)
{
    cJSON *op = cJSON_CreateObject(), *p = cJSON_AddObjectToObject(op, "request_put");
    add_b64(p, "key", key);
    add_b64(p, "value", val);
    if (lease)
        add_i64(p, "lease", lease);
    return op;
}

cJSON *dt_etcd_op_range(const char *key)
{
    cJSON *op = cJSON_CreateObject();
    cJSON_AddItemToObject(op, "request_range", range_body(key, false, false, false));
    return op;
}

cJSON *dt_etcd_op_count(const char *prefix)
{
    cJSON *op = cJSON_CreateObject();
    cJSON_AddItemToObject(op, "request_range", range_body(prefix, true, true, true));
    return op;
}

int dt_etcd_txn_range(const cJSON *resp, int i, char **val, int64_t *count)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(resp, "responses");
    const cJSON *rr = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(rs, i),
                                                       "response_range");
    if (val)
        *val = NULL;
    if (count)
        *count = 0;
    if (!rr)
        return -EPROTO;
    if (count)
        *count = dt_etcd_json_i64(rr, "count", 0);
    if (val) {
        dt_etcd_kv *kv = NULL;
        int n = 0;
        if (decode_kvs(rr, &kv, &n))
            return -ENOMEM;
        if (n > 0) {
            *val = kv[0].value;
            kv[0].value = NULL;
        }
        dt_etcd_kvs_free(kv, n);
    }
    return 0;
}

cJSON *dt_etcd_cmp(const char *key, const char *target, const char *result, int64_t num)
{
    cJSON *c = cJSON_CreateObject();
    add_b64(c, "key", key);
    cJSON_AddStringToObject(c, "target", target);
    cJSON_AddStringToObject(c, "result", result);
    if (!strcmp(target, "CREATE"))
        add_i64(c, "create_revision", num);
    else if (!strcmp(target, "MOD"))
        add_i64(c, "mod_revision", num);
    else if (!strcmp(target, "VERSION"))
        add_i64(c, "version", num);
    return c;
}

int dt_etcd_txn(dt_etcd *e, cJSON *compare, cJSON *success, cJSON *failure, bool *ok,
                cJSON **resp, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *r = NULL;
    cJSON_AddItemToObject(b, "compare", compare ? compare : cJSON_CreateArray());
    cJSON_AddItemToObject(b, "success", success ? success : cJSON_CreateArray());
    cJSON_AddItemToObject(b, "failure", failure ? failure : cJSON_CreateArray());
    int rc = dt_etcd_call(e, "/v3/kv/txn", b, &r, err);
    cJSON_Delete(b);
    if (ok)
        *ok = rc == 0 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "succeeded"));
    if (resp)
        *resp = r;
    else
        cJSON_Delete(r);
    return rc;
}

int dt_etcd_put(dt_etcd *e, const char *key, const char *val, int64_t lease, dt_err *err)
{
    cJSON *op = dt_etcd_op_put(key, val, lease), *r = NULL;
    cJSON *p = cJSON_DetachItemFromObject(op, "request_put");
    cJSON_Delete(op);
    int rc = dt_etcd_call(e, "/v3/kv/put", p, &r, err);
    cJSON_Delete(p);
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_delete(dt_etcd *e, const char *key, bool prefix, dt_err *err)
{
    cJSON *b = range_body(key, prefix, false, false), *r = NULL;
    int rc = dt_etcd_call(e, "/v3/kv/deleterange", b, &r, err);
    cJSON_Delete(b);
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_create(dt_etcd *e, const char *key, const char *val, int64_t lease, bool *won,
                   char **cur, dt_err *err)
{
    cJSON *cmp = cJSON_CreateArray(), *succ = cJSON_CreateArray(), *fail = cJSON_CreateArray();
    cJSON *r = NULL;
    bool ok = false;
    cJSON_AddItemToArray(cmp, dt_etcd_cmp(key, "CREATE", "EQUAL", 0));
    cJSON_AddItemToArray(succ, dt_etcd_op_put(key, val, lease));
    cJSON_AddItemToArray(fail, dt_etcd_op_range(key));
    if (won)
        *won = false;
    if (cur)
        *cur = NULL;
    int rc = dt_etcd_txn(e, cmp, succ, fail, &ok, &r, err);
    if (rc)
        return rc;
    if (won)
        *won = ok;
    if (cur && ok) {
        *cur = strdup(val);
    } else if (cur) {
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "responses");
        const cJSON *rr = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(rs, 0),
                                                           "response_range");
        dt_etcd_kv *kv = NULL;
        int n = 0;
        if (rr && decode_kvs(rr, &kv, &n) == 0 && n > 0) {
            *cur = kv[0].value;
            kv[0].value = NULL;
        }
        dt_etcd_kvs_free(kv, n);
        if (!*cur) /* created then deleted (a lease expired) in between: nothing there */
            *cur = strdup("");
    }
    cJSON_Delete(r);
    return 0;
}

/* ---- leases and watches -------------------------------------------------------------------- */

int dt_etcd_lease_grant(dt_etcd *e, int64_t ttl_s, int64_t *id, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *r = NULL;
    add_i64(b, "TTL", ttl_s);
    int rc = dt_etcd_call(e, "/v3/lease/grant", b, &r, err);
    cJSON_Delete(b);
    if (!rc) {
        *id = dt_etcd_json_i64(r, "ID", 0);
        if (!*id)
            rc = dt_err_set(err, -EPROTO, "etcd granted no lease (%s)", e->list);
    }
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_lease_keepalive(dt_etcd *e, int64_t id, int64_t *ttl, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *r = NULL;
    add_i64(b, "ID", id);
    int rc = dt_etcd_call(e, "/v3/lease/keepalive", b, &r, err);
    cJSON_Delete(b);
    if (!rc) {
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "result");
        *ttl = dt_etcd_json_i64(res ? res : r, "TTL", 0);
    }
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_lease_revoke(dt_etcd *e, int64_t id, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *r = NULL;
    add_i64(b, "ID", id);
    int rc = dt_etcd_call(e, "/v3/lease/revoke", b, &r, err);
    cJSON_Delete(b);
    cJSON_Delete(r);
    return rc;
}

int dt_etcd_watch(dt_etcd *e, const char *key, bool prefix, int64_t start_rev, int timeout_ms,
                  bool *changed, dt_err *err)
{
    cJSON *b = cJSON_CreateObject(), *cr = cJSON_AddObjectToObject(b, "create_request");
    add_b64(cr, "key", key);
    if (prefix) {
        char *end = prefix_end(key);
        add_b64(cr, "range_end", end ? end : "");
        free(end);
    }
    if (start_rev > 0)
        add_i64(cr, "start_revision", start_rev);
    *changed = false;
    int rc = call(e, "/v3/watch", b, NULL, true, timeout_ms, changed, err);
    cJSON_Delete(b);
    return rc;
}
