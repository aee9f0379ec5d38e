/* store_server.h - the dtrain store server: a TCP key-value server on libuv, run on a thread of
 * its own (rendezvous/store_server.c). The wire protocol is rendezvous/protocol.h; clients use
 * rendezvous/store.h.
 */
#ifndef DT_STORE_SERVER_H
#define DT_STORE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

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
    size_t max_connections;      /* open client connections (65536); never more than the
                                    open-file limit (RLIMIT_NOFILE, raised toward this first)
                                    allows, less a reserve for the rest of the process */
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
                                    (3000) */
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
    size_t max_unauthenticated;  /* connections that have not completed the handshake and
                                    AUTH at once (half of max_connections, at least 64 or
                                    max_connections when that is less); a new one beyond
                                    this closes the oldest of them, so that a flood of
                                    connections that never authenticate cannot lock out a
                                    client that holds the token (added later; 0 = default) */
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
