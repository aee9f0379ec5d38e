/* store.h - the dtrain store: a TCP key-value server on libuv and its blocking client.
 *
 * Every rendezvous, every process-group bootstrap (NCCL unique id, CPU-backend addresses) and
 * every failure signal between nodes goes through this store. The wire protocol is specified in
 * rendezvous/protocol.h; this header is the contract the rest of dtrain codes against.
 *
 * Values are arbitrary bytes. Keys are NUL-free strings. All calls are blocking, bounded by a
 * timeout, and thread-safe (one request in flight per handle; calls from several threads on one
 * handle are serialised). Errors: -ETIMEDOUT (deadline passed), -ENOENT (key absent where the
 * call does not wait), -ECONNREFUSED/-ECONNRESET (server unreachable after retries), -EPROTO
 * (protocol or version mismatch), -EACCES (token refused), -E2BIG (a server limit), -EINVAL.
 */
#ifndef DT_STORE_H
#define DT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* ------------------------------------------------------------------------------------------ */
/* Client                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct dt_store dt_store;

typedef struct dt_store_opts {
    int connect_timeout_ms; /* deadline for connecting, retried with exponential backoff (30000) */
    int timeout_ms;         /* default deadline of each call that does not take one (30000) */
    const char *token;      /* shared token; NULL = DTRAIN_STORE_TOKEN if set, else none */
} dt_store_opts;

/* Fills o with the defaults above. */
void dt_store_opts_default(dt_store_opts *o);

/* Connects to host:port (retrying until connect_timeout_ms), performs the handshake and, when a
 * token is set, authenticates. opts may be NULL for defaults. On success *out owns the
 * connection; free it with dt_store_free. A dropped connection is re-established transparently
 * on the next call (within that call's deadline). */
int dt_store_connect(dt_store **out, const char *host, int port, const dt_store_opts *opts,
                     dt_err *err);

/* A view of `base` in which every key is prefix + key (prefixes nest). Shares base's connection:
 * base must outlive the view. Free with dt_store_free (which then only frees the view). */
int dt_store_prefixed(dt_store **out, dt_store *base, const char *prefix, dt_err *err);

/* Accepts NULL. */
void dt_store_free(dt_store *s);

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len, dt_err *err);

/* Waits server-side until `key` exists (up to timeout_ms; <0 = the handle's default; 0 = do not
 * wait, -ENOENT if absent), then returns its value in *val: malloc'd, with one extra NUL byte
 * after *len bytes so that text values can be used as strings. Caller frees. */
int dt_store_get(dt_store *s, const char *key, void **val, size_t *len, int timeout_ms,
                 dt_err *err);

/* Atomically adds delta to the int64 stored (as decimal text) under key, creating it at 0;
 * *result (may be NULL) gets the new value. Wakes waiters. */
int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result, dt_err *err);

/* Compare-and-set with the semantics of torch's TCPStore.compare_set:
 *   key absent,  expected_len == 0:  the key is created with desired; *current = desired.
 *   key absent,  expected_len >  0:  nothing is set; *current = expected (torch echoes the
 *                                    expected value back; the key stays absent).
 *   key present, value == expected:  the value becomes desired; *current = desired.
 *   key present, value != expected:  nothing changes; *current = the value.
 * (A present empty value equals an empty expected.) *current (malloc'd, NUL-terminated after
 * *current_len bytes; may be NULL to ignore) is the value after the operation, except in the
 * absent case above. So "*current == desired" means "desired is there now" (this call or an
 * earlier one put it; retries are safe) unless expected == desired; use dt_store_cas_swapped to
 * know whether this very call swapped. */
int dt_store_cas(dt_store *s, const char *key, const void *expected, size_t expected_len,
                 const void *desired, size_t desired_len, void **current, size_t *current_len,
                 dt_err *err);

/* dt_store_cas that also says whether this call swapped: *swapped (may be NULL) = 1 when it
 * created or replaced the value, 0 when it did not: then either the key holds a value other
 * than expected (*current = that value), or the key is absent and expected was non-empty
 * (*current = expected; so *swapped == 0 with *current == expected means "absent"). Unlike dt_store_cas, it is never
 * resent once the whole request went out on a connection that then failed (a resent CAS that
 * had been applied would report 0): that is -ECONNRESET, "may or may not have been applied".
 * (Added after the first release.) */
int dt_store_cas_swapped(dt_store *s, const char *key, const void *expected, size_t expected_len,
                         const void *desired, size_t desired_len, int *swapped, void **current,
                         size_t *current_len, dt_err *err);

/* *all_exist = 1 when every key exists now (does not wait). */
int dt_store_check(dt_store *s, const char *const *keys, size_t n, int *all_exist, dt_err *err);

/* Waits until every key exists; -ETIMEDOUT after timeout_ms (<0 = default). */
int dt_store_wait(dt_store *s, const char *const *keys, size_t n, int timeout_ms, dt_err *err);

/* *deleted (may be NULL) = 1 when the key existed. */
int dt_store_delete(dt_store *s, const char *key, int *deleted, dt_err *err);

/* Number of keys in the whole store (not only under a view's prefix). */
int dt_store_num_keys(dt_store *s, int64_t *n, dt_err *err);

/* Appends bytes to the value under key (creating it). Wakes waiters. */
int dt_store_append(dt_store *s, const char *key, const void *val, size_t len, dt_err *err);

/* Gets n keys in one round trip, waiting for all of them like dt_store_get. vals[i] are
 * malloc'd (NUL-terminated after lens[i] bytes); caller frees each. On failure none is set. */
int dt_store_multi_get(dt_store *s, const char *const *keys, size_t n, void **vals, size_t *lens,
                       int timeout_ms, dt_err *err);

/* Sets n keys in one round trip, atomically with respect to other requests. */
int dt_store_multi_set(dt_store *s, const char *const *keys, const void *const *vals,
                       const size_t *lens, size_t n, dt_err *err);

/* Round trip with no effect; *rtt_us (may be NULL) gets the measured time. */
int dt_store_ping(dt_store *s, int64_t *rtt_us, dt_err *err);

/* ------------------------------------------------------------------------------------------ */
/* Server                                                                                     */
/* ------------------------------------------------------------------------------------------ */

typedef struct dt_store_server dt_store_server;

/* What max_total_bytes charges per stored key on top of its key and value bytes: the server's
 * bookkeeping (table entry, allocator headers, hash slot). Without it a million empty values
 * would count as a few MiB while taking ~110 MB. */
#define DT_STORE_KEY_OVERHEAD 112

typedef struct dt_store_server_opts {
    const char *host;            /* bind address ("0.0.0.0") */
    int port;                    /* 0 = any free port */
    const char *token;           /* NULL = none (then DTRAIN_STORE_TOKEN is not consulted) */
    size_t max_key_size;         /* bytes per key (4096) */
    size_t max_value_size;       /* bytes per value (64 MiB) */
    size_t max_keys_per_request; /* keys in one multi-get/set/check/wait (65536) */
    size_t max_total_bytes;      /* keys + values stored, plus DT_STORE_KEY_OVERHEAD bytes
                                    per key (1 GiB) */
    size_t max_connections;      /* open client connections (65536) */
    size_t max_pending_output;   /* reply bytes buffered per client (65 MiB). Once more is
                                    queued, the server stops reading that client's requests
                                    until its replies drain (so a connection holds at most
                                    about twice this); a single reply larger than this is
                                    answered with -E2BIG instead. Must be at least
                                    max_value_size + 64 KiB (checked at start). */
    /* Added after the first release; 0 in any of them means the default. */
    int write_stall_ms;          /* a client with over max_pending_output bytes of replies
                                    waiting that takes none of them for this long does not
                                    read: it is disconnected (10000) */
    int handshake_timeout_ms;    /* a connection that has not completed the handshake (and
                                    AUTH, with a token) this long after it was accepted is
                                    closed, so silent sockets cannot hold connection slots
                                    (10000) */
    size_t max_input_buffered;   /* bytes of partly received large requests (frames over
                                    64 KiB, each held in a buffer of its size) the server
                                    holds for all connections together (1 GiB). A connection
                                    whose frame would take the total over this is not read
                                    until other frames complete and free budget (first come,
                                    first served; no error); a frame larger than this alone is
                                    answered with -E2BIG and its connection closed. Smaller
                                    requests (up to 64 KiB buffered per connection) never
                                    wait for it. (Added later; 0 = default.) */
    int input_stall_ms;          /* a connection holding part of max_input_buffered for an
                                    incomplete frame that delivers no byte for this long while
                                    other connections wait for budget is disconnected (a
                                    stalled or half-dead client must not hold the budget
                                    forever); a sender whose bytes keep arriving, or one
                                    nobody waits behind, is never cut (10000; added later,
                                    0 = default) */
    bool quiet;                  /* announce "listening on" at debug level instead of info
                                    (a store private to one process; added later) */
} dt_store_server_opts;

void dt_store_server_opts_default(dt_store_server_opts *o);

/* Binds, listens and starts the event-loop thread. On success *out is running and
 * dt_store_server_port tells the bound port. */
int dt_store_server_start(dt_store_server **out, const dt_store_server_opts *opts, dt_err *err);

int dt_store_server_port(const dt_store_server *s);

/* A snapshot of the server's internal state, for tests and monitoring (added after the first
 * release). */
typedef struct dt_store_server_stats {
    int64_t connections;    /* open client connections */
    int64_t keys;           /* keys present (what NUM_KEYS answers) */
    int64_t entries;        /* key-table entries: present keys + placeholders of awaited keys */
    int64_t waiters;        /* parked requests (GET, WAIT, MULTI_GET on missing keys) */
    int64_t wait_timers;    /* parked requests whose timeout timer is armed */
    int64_t bytes;          /* bytes charged against max_total_bytes */
    int64_t input_buffered; /* bytes of input buffers held by connections */
    int64_t output_pending; /* reply bytes not yet taken by the kernel */
    int64_t throttled;      /* connections not read until their replies drain */
    /* Added later: the input budget (dt_store_server_opts.max_input_buffered). */
    int64_t input_charged;      /* bytes charged against max_input_buffered now */
    int64_t input_charged_peak; /* the most ever charged at once (never over the limit) */
    int64_t input_paused;       /* connections not read until budget frees for their frame */
    int64_t input_stall_cuts;   /* connections cut by input_stall_ms since start (added later) */
} dt_store_server_stats;

/* Fills *out, computed on the server's loop thread (this call waits for it, up to 5 s).
 * Thread-safe, but not concurrently with (or after) dt_store_server_stop. Returns 0, or
 * -EINVAL (NULL argument) / -ETIMEDOUT (the loop did not answer). */
int dt_store_server_get_stats(dt_store_server *s, dt_store_server_stats *out);

/* Stops the loop, closes every connection, joins the thread and frees. Accepts NULL. */
void dt_store_server_stop(dt_store_server *s);

#endif
