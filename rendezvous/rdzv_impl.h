/* rdzv_impl.h - what the rendezvous backends share; internal to rendezvous/rdzv*.c. Everyone
 * else uses rendezvous/rdzv.h.
 *
 * rdzv.c owns the public dt_rdzv_* functions and the static backend; when opts->backend is
 * "c10d" it forwards every call to the dt_rdzv_c10d_* functions of rdzv_c10d.c. The helpers
 * below (store hosting and connecting, failure records, ids) are written once, in rdzv.c.
 */
#ifndef DT_RDZV_IMPL_H
#define DT_RDZV_IMPL_H

#include <cJSON.h>
#include <stdbool.h>

#include "rendezvous/rdzv.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"

/* ---- helpers (rdzv.c) ------------------------------------------------------------------- */

/* Whether host names an address of this machine (binding to it works: an interface address,
 * localhost, 127.0.0.1, the host's own name). */
bool dt_rdzv_is_local_host(const char *host);

/* An id nobody else has: 12 hex digits from the clock, the pid and the host. */
void dt_rdzv_make_id(char *out, size_t cap);

/* Starts a store server on bind_host:port (0 = any). -EADDRINUSE (err untouched) when something
 * already listens there; other failures fill err. On success *out is running (caller owns it). */
int dt_rdzv_host_store(dt_store_server **out, const char *bind_host, int port, dt_err *err);

/* Connects to host:port, retrying until o->join_timeout and polling o->interrupted (-EINTR).
 * Calls on the connection time out after about o->heartbeat_timeout (1..30 s), so that a store
 * that is gone is noticed. On success *out owns the connection. */
int dt_rdzv_connect_store(dt_store **out, const dt_rdzv_opts *o, const char *host, int port,
                          dt_err *err);

/* Appends the n failures as JSON lines to key (one request). */
int dt_rdzv_append_failures(dt_store *s, const char *key, const dt_rdzv_failure *f, int n,
                            dt_err *err);

/* Reads the JSON lines under key into *out (malloc'd, sorted by time; caller frees). -ENOENT
 * when the key is absent. */
int dt_rdzv_read_failures(dt_store *s, const char *key, dt_rdzv_failure **out, int *n,
                          dt_err *err);

/* Stable sort by time (equal times keep the order they were recorded in). */
void dt_rdzv_sort_failures(dt_rdzv_failure *f, int n);

/* This node's failures of the current round (copies of what the agent reported), which
 * dt_rdzv_failures returns when the store cannot tell the job's. Zeroed = empty. */
typedef struct dt_rdzv_fail_list {
    dt_rdzv_failure *v;
    int n;
} dt_rdzv_fail_list;

/* Appends n failures (nothing when n <= 0). */
int dt_rdzv_fail_list_add(dt_rdzv_fail_list *l, const dt_rdzv_failure *f, int n, dt_err *err);
/* *out = a copy sorted by time (malloc'd; NULL and 0 when empty). */
int dt_rdzv_fail_list_copy(const dt_rdzv_fail_list *l, dt_rdzv_failure **out, int *n,
                           dt_err *err);
/* Empties l (freeing its copies). */
void dt_rdzv_fail_list_clear(dt_rdzv_fail_list *l);

/* String and number members of a JSON object ("" and def when absent or of another type). */
void dt_rdzv_json_str(const cJSON *o, const char *k, char *out, size_t cap);
double dt_rdzv_json_num(const cJSON *o, const char *k, double def);

/* ---- the c10d backend (rdzv_c10d.c): same contracts as the dt_rdzv_* functions ---------- */

typedef struct dt_rdzv_c10d dt_rdzv_c10d;

int dt_rdzv_c10d_open(dt_rdzv_c10d **out, const dt_rdzv_opts *opts, dt_err *err);
int dt_rdzv_c10d_next(dt_rdzv_c10d *c, dt_rdzv_round *round, dt_rdzv_status *status,
                      dt_err *err);
int dt_rdzv_c10d_poll(dt_rdzv_c10d *c, dt_rdzv_status *status, dt_err *err);
int dt_rdzv_c10d_succeeded(dt_rdzv_c10d *c, dt_err *err);
int dt_rdzv_c10d_failed(dt_rdzv_c10d *c, const dt_rdzv_failure *f, int n, dt_err *err);
int dt_rdzv_c10d_abort(dt_rdzv_c10d *c, int sig, dt_err *err);
int dt_rdzv_c10d_abort_config(dt_rdzv_c10d *c, const dt_rdzv_failure *f, int n, const char *why,
                              dt_err *err);
int dt_rdzv_c10d_failures(dt_rdzv_c10d *c, dt_rdzv_failure **out, int *n, dt_err *err);
void dt_rdzv_c10d_kill(dt_rdzv_c10d *c);
void dt_rdzv_c10d_close(dt_rdzv_c10d *c);

/* ---- the lost set of a c10d round's end record (rdzv_c10d.c) ------------------------------ */

/* A set of group ranks, as ranges. The end record of a round lists the group ranks declared
 * lost in it as "-" (none) or ascending, disjoint ranges "3-40,57" (a rack that goes down is one
 * range), with no limit on how many. */
typedef struct dt_rdzv_ranks {
    int (*r)[2];     /* n ranges [lo, hi], lo <= hi, ascending and disjoint (owned) */
    int n;           /* number of ranges */
    long long count; /* ranks in the set */
} dt_rdzv_ranks;

/* Encodes ranks[0..n) (any order; duplicates allowed; each >= 0) as "-" (n == 0) or ascending
 * ranges "a-b,c" with adjacent ranks merged. Returns a malloc'd string (caller frees), or NULL
 * when out of memory or a rank is negative. */
char *dt_rdzv_ranks_encode(const int *ranks, int n);

/* Decodes s[0..len) (no NUL needed) into *out, which the caller frees with dt_rdzv_ranks_free
 * (also after a failure). Strict: "-", or items "g" or "lo-hi" (decimal, 0..INT_MAX, lo <= hi)
 * separated by single commas, each item above the previous one; anything else (empty, spaces,
 * signs, overflow, a trailing comma, descending or overlapping items) is -EBADMSG with err
 * saying what and where. -ENOMEM when out of memory. Memory is bounded by len, not by the
 * ranks' values. */
int dt_rdzv_ranks_decode(const char *s, size_t len, dt_rdzv_ranks *out, dt_err *err);

/* Whether g is in the set (binary search). */
bool dt_rdzv_ranks_has(const dt_rdzv_ranks *set, int g);

/* Frees the ranges and empties the set; accepts NULL. */
void dt_rdzv_ranks_free(dt_rdzv_ranks *set);

#endif
