/* rdzv_etcd_client.h - a small client of etcd's v3 JSON gateway (HTTP/1.1 via libcurl) for the
 * etcd rendezvous backend (rdzv_etcd.c): key-value, transactions, leases and watches.
 *
 * Endpoints. A client holds the cluster's members ("HOST:PORT,HOST:PORT,..." or with an
 * http:// or https:// scheme) and sends each call to the member that answered last; on a
 * connection error, a timeout, or an answer that says the member cannot serve it now (no leader,
 * request timed out: a member cut off from the quorum) it tries the next, round after round,
 * until the call's budget (open's budget_s) is spent. Then the call fails with -ETIMEDOUT and an
 * error that names every member and what each said. A member that answers but is not etcd
 * (not the v3 gateway's JSON) fails the call at once with -EPROTO naming it.
 *
 * Keys and values are text here (base64 on the wire). Revisions are int64. One client is for one
 * thread; each thread makes its own.
 */
#ifndef DT_RDZV_ETCD_CLIENT_H
#define DT_RDZV_ETCD_CLIENT_H

#include <cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef struct dt_etcd dt_etcd;

/* TLS and authentication, passed through to libcurl ("" = not used). */
typedef struct dt_etcd_tls {
    char cacert[512]; /* CURLOPT_CAINFO */
    char cert[512];   /* CURLOPT_SSLCERT (client certificate) */
    char key[512];    /* CURLOPT_SSLKEY */
    char user[128];   /* etcd user: a token from /v3/auth/authenticate on every call */
    char password[128];
} dt_etcd_tls;

typedef struct dt_etcd_kv {
    char *key;   /* malloc'd, NUL-terminated */
    char *value; /* malloc'd, NUL-terminated ("" for keys_only) */
    int64_t create_rev, mod_rev, lease;
} dt_etcd_kv;

/* Opens a client of the members listed in endpoints. budget_s: how long one call may try
 * (across members) before it fails. tls may be NULL. */
int dt_etcd_open(dt_etcd **out, const char *endpoints, double budget_s, const dt_etcd_tls *tls,
                 dt_err *err);
void dt_etcd_free(dt_etcd *e);
/* "host:port,host:port" as given (for messages). */
const char *dt_etcd_endpoints(const dt_etcd *e);
/* Whether the last call failed because no member could serve it (quorum lost, all down): then
 * what is left to say (the end of a job) is not worth another call's budget. */
bool dt_etcd_unreachable(const dt_etcd *e);
/* How many members the client knows. */
int dt_etcd_count(const dt_etcd *e);
/* Polled between tries (and during watches): when it returns true the call gives up, -EINTR. */
void dt_etcd_set_interrupt(dt_etcd *e, bool (*fn)(void *), void *arg);

/* One call of the gateway: POST path with body (not consumed); *resp = the answer (caller
 * deletes). Fails over as described above. */
int dt_etcd_call(dt_etcd *e, const char *path, const cJSON *body, cJSON **resp, dt_err *err);
/* The same to one member only (index < dt_etcd_count), one try, timeout_s. */
int dt_etcd_call_one(dt_etcd *e, int member, const char *path, const cJSON *body, cJSON **resp,
                     double timeout_s, dt_err *err);
const char *dt_etcd_member(const dt_etcd *e, int member);

/* Range: key alone, or every key with the prefix key (prefix = true). *kvs malloc'd (free with
 * dt_etcd_kvs_free), *n its length; count_only: only *count. *rev (may be NULL): the store's
 * revision of the answer. */
int dt_etcd_range(dt_etcd *e, const char *key, bool prefix, bool keys_only, bool count_only,
                  dt_etcd_kv **kvs, int *n, int64_t *count, int64_t *rev, dt_err *err);
void dt_etcd_kvs_free(dt_etcd_kv *kvs, int n);
/* Gets one key: *val malloc'd; -ENOENT when absent. mod_rev may be NULL. */
int dt_etcd_get(dt_etcd *e, const char *key, char **val, int64_t *mod_rev, dt_err *err);
int dt_etcd_put(dt_etcd *e, const char *key, const char *val, int64_t lease, dt_err *err);
int dt_etcd_delete(dt_etcd *e, const char *key, bool prefix, dt_err *err);
/* Creates key = val (lease 0 = none) if it does not exist (compare create_revision == 0).
 * *won: this call created it; *cur (may be NULL): the value now (malloc'd). */
int dt_etcd_create(dt_etcd *e, const char *key, const char *val, int64_t lease, bool *won,
                   char **cur, dt_err *err);

/* Builders for /v3/kv/txn. */
cJSON *dt_etcd_cmp(const char *key, const char *target, const char *result, int64_t num);
cJSON *dt_etcd_op_put(const char *key, const char *val, int64_t lease);
cJSON *dt_etcd_op_range(const char *key);
/* A count-only range of every key with the prefix key. */
cJSON *dt_etcd_op_count(const char *prefix);
/* From the answer of a txn: the value of the i-th op's range (malloc'd; NULL when absent) and
 * its count. */
int dt_etcd_txn_range(const cJSON *resp, int i, char **val, int64_t *count);
/* Runs a transaction (compare, success, failure are arrays, consumed). *ok: it succeeded. */
int dt_etcd_txn(dt_etcd *e, cJSON *compare, cJSON *success, cJSON *failure, bool *ok,
                cJSON **resp, dt_err *err);

int dt_etcd_lease_grant(dt_etcd *e, int64_t ttl_s, int64_t *id, dt_err *err);
/* *ttl: what is left of it (0 = it had expired: its keys are gone). */
int dt_etcd_lease_keepalive(dt_etcd *e, int64_t id, int64_t *ttl, dt_err *err);
int dt_etcd_lease_revoke(dt_etcd *e, int64_t id, dt_err *err);

/* Watches key (or the prefix key) from revision start_rev until an event arrives (*changed =
 * true) or timeout_ms passes (*changed = false). */
int dt_etcd_watch(dt_etcd *e, const char *key, bool prefix, int64_t start_rev, int timeout_ms,
                  bool *changed, dt_err *err);

/* int64 members of the gateway's JSON (strings there). def when absent. */
int64_t dt_etcd_json_i64(const cJSON *o, const char *k, int64_t def);

#endif
