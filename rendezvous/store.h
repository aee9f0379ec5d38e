/* store.h - the dtrain store's blocking client (rendezvous/store.c). The server is
 * rendezvous/store_server.h.
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

#endif
