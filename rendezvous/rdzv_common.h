/* rdzv_common.h - what the rendezvous backends share (rdzv_common.c): endpoints and addresses,
 * failure records (JSON lines in the store, this node's own list), ids, and hosting or reaching
 * the store. Every backend (rdzv_static.c, rdzv_c10d.c, and the ones to come) uses these and
 * none calls another backend. rdzv.h includes this header because its first block (endpoints,
 * ports, failure JSON) serves the agent and the tests too; the rest is for backends only.
 */
#ifndef DT_RDZV_COMMON_H
#define DT_RDZV_COMMON_H

#include <cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rendezvous/rdzv_types.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"

/* ---- for everyone (the agent, the tests, the backends) ------------------------------------ */

/* Encodes / decodes one failure as a single-line JSON object (no newline). */
char *dt_rdzv_failure_to_json(const dt_rdzv_failure *f);
int dt_rdzv_failure_from_json(const char *text, size_t len, dt_rdzv_failure *f);

/* A TCP port that was free on all interfaces a moment ago (bind to port 0, read it, close). */
int dt_rdzv_free_port(int *port, dt_err *err);

/* The address this host uses to reach host:port (a UDP connect, no packet sent), e.g. the
 * interface toward node 0. Falls back to the host name. Never fails. */
void dt_rdzv_route_addr(const char *host, int port, char *out, size_t cap);

/* Splits "HOST[:PORT]" ("[v6]:port" too). *port is left unchanged when there is none. */
int dt_rdzv_parse_endpoint(const char *ep, char *host, size_t cap, int *port, dt_err *err);

/* ---- for the backends ---------------------------------------------------------------------- */

/* Whether host names an address of this machine (binding to it works: an interface address,
 * localhost, 127.0.0.1, the host's own name). */
bool dt_rdzv_is_local_host(const char *host);

/* An id nobody else has: 12 hex digits from the clock, the pid and the host. */
void dt_rdzv_make_id(char *out, size_t cap);

/* Where the store of a job whose endpoint (--master-addr, --rdzv-endpoint host) is host
 * listens (bind) and the address this host's agent reaches it by (conn), each cap bytes: the
 * address the job names, not every interface. DTRAIN_STORE_BIND when set (0.0.0.0 or :: = every
 * interface); else an IP address as it is; a name as it resolves here (the first of its
 * addresses that is this host's). Every interface, and a line that says why, when the name
 * resolves here only to a loopback address though it is not localhost (the 127.0.1.1 line many
 * distributions give the host's own name: the other nodes reach it by another address), or to
 * no address of this host (c10d is_host behind a forwarded address). */
void dt_rdzv_store_bind(const char *host, char *bind, char *conn, size_t cap);

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

/* Whether id may be a run id: 1-200 of [A-Za-z0-9._-], and no ".." (it names a directory
 * under the log dir). 0, or -EINVAL with why (cap bytes) saying what is wrong. */
int dt_rdzv_check_run_id(const char *id, char *why, size_t cap);

/* 16 hex digits (and a NUL) of a 64-bit FNV-1a hash of text: the job's digest. */
void dt_rdzv_job_digest(const char *text, char out[17]);

/* The job's settings as agreed once per job instance (the conf record: JSON {run_id,
 * max_restarts, min, max, job, digest}). */
typedef struct dt_rdzv_conf {
    char run_id[DT_RDZV_STR];
    int min, max, max_restarts;
    char *job;                     /* the first node's dt_rdzv_opts.job ("" = none; owned) */
    char digest[17];               /* dt_rdzv_job_digest(job) */
    bool ending;                   /* the first node came only to end the job (opts.ending) */
} dt_rdzv_conf;

/* The first agent's proposal (run id o->run_id, or a fresh one for "" / "none"; its restart
 * budget, MIN and MAX nodes, o->job and its digest); malloc'd, NULL when out of memory. The
 * backend stores it unless a record is there already. */
char *dt_rdzv_conf_propose(const dt_rdzv_opts *o, int min, int max);

/* Reads a stored conf record into *c, checking everything in it as the command line's values
 * are checked (nothing read from the network is trusted): run_id as dt_rdzv_check_run_id,
 * 1 <= min <= max <= 1000000, 0 <= max_restarts <= 1000000, the job's text printable lines
 * whose digest matches. -EINVAL (not JSON, or naming the key that is wrong), with where (the source:
 * "the store at H:P, key K") and fix (what to do: delete the key, another --rdzv-id) in err.
 * On success c->job is owned by c (dt_rdzv_conf_free). */
int dt_rdzv_conf_parse(const char *cur, const char *where, const char *fix, dt_rdzv_conf *c,
                       dt_err *err);
void dt_rdzv_conf_free(dt_rdzv_conf *c);

/* Compares this node's job (mine, dt_rdzv_opts.job) with the job's (c->job): 0 when they are
 * the same; else -EINVAL with err naming the keys that differ and both values (this node's and
 * the job's), the run id and where the job's record is, and what to do; keys (kcap bytes; may
 * be NULL) gets the differing keys' names, comma-separated, for another node's log. */
/* Whether the job's layout can use a world of `world` ranks (o->world_usable; none: any). */
bool dt_rdzv_world_usable(const dt_rdzv_opts *o, int world);

/* How many of n ordered joiners round R takes: the most, at least min, whose world (the sum of
 * their nproc: the int at nproc, then every `stride` bytes) the job can use
 * (dt_rdzv_world_usable); the others wait as spares, which an INFO line says. None: all n (the
 * agent refuses the round, naming the layout). */
int dt_rdzv_usable_prefix(const dt_rdzv_opts *o, int min, int R, const int *nproc, size_t stride,
                          int n);

int dt_rdzv_conf_check_job(const dt_rdzv_conf *c, const char *mine, const char *where,
                           char *keys, size_t kcap, dt_err *err);

/* Elastic backends: parses and checks the stored record (dt_rdzv_conf_parse), refuses a node
 * whose job differs (dt_rdzv_conf_check_job), and adopts the job's MIN, MAX, budget and run id,
 * warning where this node's flags differ. */
int dt_rdzv_conf_adopt(const char *cur, const char *where, const char *fix,
                       const dt_rdzv_opts *o, int *min, int *max, int *max_restarts,
                       char *run_id, size_t cap, dt_err *err);

/* Store calls on text values (keys and values without NULs). */

/* snprintf for keys ("r%d/hb/%d"): a key too long for buf is cut, which the store then reports
 * as a missing key rather than touching another one. */
void dt_rdzv_keyf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Gets key, waiting up to ms (0 = not at all: -ENOENT when absent). *out is NUL-terminated
 * (malloc'd, caller frees; NULL on failure). */
int dt_rdzv_get_str(dt_store *s, const char *key, char **out, int ms, dt_err *err);

/* Sets key to the string v. */
int dt_rdzv_set_str(dt_store *s, const char *key, const char *v, dt_err *err);

/* Compare-and-set from absent. *won (may be NULL): this call wrote desired. *cur (may be NULL):
 * the value now (malloc'd, NUL-terminated). */
int dt_rdzv_cas_new(dt_store *s, const char *key, const char *desired, bool *won, char **cur,
                    dt_err *err);

#endif
