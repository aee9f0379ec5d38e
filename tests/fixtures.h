/* fixtures.h - test data shared by the test binaries (linked into every one of them). */
#ifndef DT_TEST_FIXTURES_H
#define DT_TEST_FIXTURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/worker.h"

/* A random batch for a model config, in host memory (owned by the struct): token ids and
 * targets below the vocabulary with target 1 ignored (-1), or inputs in [-1, 1) with labels.
 * bert: masked-LM targets at max(1, T/4) random positions of each sample (the same count in
 * every sample, as dtrain's masking makes them, so that any split of the batch weighs samples
 * alike), -1 elsewhere; token types 0 then 1 from the middle; the last sample's last T/4
 * positions padding (mask 0, never a target) when B > 1; next-sentence labels. */
typedef struct dt_test_batch {
    dt_batch b;
    int32_t *tokens, *targets;
    float *x;
    int32_t *types, *mask, *labels; /* bert */
} dt_test_batch;

void dt_test_batch_make(dt_test_batch *hb, const dt_model_config *c, int B, uint64_t seed);
void dt_test_batch_free(dt_test_batch *hb);

/* ---- paths and strings ---------------------------------------------------------------------- */

/* A formatted string that lives until 64 more have been made (no fixed-size buffers to cut). */
const char *dt_test_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* The source tree: the parent of build/ where the dtrain binary lives, when probe (a path
 * relative to the tree, such as "configs") exists there; else the working directory. Found
 * once per process: a later call's probe is not looked at. */
const char *dt_test_repo_dir(const char *probe);

/* Whether rank q of a run on N ranks with the overrides ov ("key=value", the last of a key
 * counts; parallel.tensor, parallel.pipeline and parallel.zero read, 1, 1 and 0 if absent)
 * holds the whole model after a gather: at ZeRO-3 only each data-parallel group's rank 0 does
 * (dpsync.h; rank = (pp * D + dp) * T + tp). */
bool dt_test_gathers_whole(const char *const *ov, int nov, int N, int q);

/* ---- forked ranks ----------------------------------------------------------------------------- */

/* n bytes of zeroed memory shared with the ranks forked after it (MAP_SHARED); fails the test
 * when it cannot be mapped. Release with dt_test_shared_unmap(p, n). */
void *dt_test_shared_map(size_t n);
void dt_test_shared_unmap(void *p, size_t n);

/* In a rank process: set by a failed RCHECK; the rank then exits 1. */
extern int dt_test_rank_failed;

/* A check inside a rank process: prints one line on stderr (one write, so ranks never
 * interleave) and marks the rank failed; the parent checks the exit status. */
void dt_test_rank_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define RCHECK(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            dt_test_rank_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                             \
    } while (0)

/* The body of rank `rank` of n: it may _exit itself; when it returns, the rank exits 1 if an
 * RCHECK failed in it, else 0. */
typedef void (*dt_test_rank_fn)(int rank, int n, void *arg);

#define DT_TEST_MAX_RANKS 16

/* Starts a store server on an ephemeral port (*port, set before any rank starts), forks n
 * (<= DT_TEST_MAX_RANKS) ranks running fn(rank, n, arg) and waits for them; status[r] gets
 * each exit status as waitpid reports it. Ranks still running after limit_s seconds are killed
 * and the test fails with "<what>: rank R still running after S s". Stops the server. */
void dt_test_run_ranks(const char *what, int n, int *port, dt_test_rank_fn fn, void *arg,
                       double limit_s, int *status);

/* Whether each of n ranks exited 0 (status[r] as dt_test_run_ranks gives it); for each that did
 * not, the test fails with "<what>: rank R: status S: <its message>", the message of rank r at
 * msg + r * stride (a field of an array of per-rank records in shared memory). */
bool dt_test_ranks_ok(const char *what, const int *status, int n, const char *msg, size_t stride);

/* In a rank process: sets DTRAIN_COMM_TRANSPORT to transport (NULL: "auto") and
 * DTRAIN_COMM_HOST_ID to this rank's entry of hosts (host ids of the ranks, comma separated),
 * or unsets it when hosts is NULL or "" or has no entry for the rank. */
void dt_test_rank_env(const char *transport, const char *hosts, int rank);

/* In a rank process: connects to the store on 127.0.0.1:port and opens the world communicator
 * of n ranks for run_id (attempt), as local rank `rank` of n on 127.0.0.1. timeout_ms bounds the
 * communicator (0: 20 s) and the store's requests (at least 20 s). On failure returns the
 * negative errno with err set, and the store (if it connected) is left in *store for the caller
 * to free; *comm is NULL. */
int dt_test_world_open(int port, const char *run_id, int attempt, int rank, int n,
                       int timeout_ms, dt_store **store, dt_comm **comm, dt_err *err);

/* A world of forked ranks on this host, each with its store connection and world communicator
 * (dt_test_world_run). */
typedef struct dt_test_world {
    int n;
    const char *transport; /* DTRAIN_COMM_TRANSPORT (NULL = auto) */
    const char *hosts;     /* host id of each rank, comma separated (NULL or "" = all on this host) */
    int timeout_ms;        /* the communicator's (0 = 20 s) */
    int attempt;
    /* more environment for a rank, set before it connects (NULL = none); env_arg is its own */
    void (*rank_env)(const struct dt_test_world *w, int rank, const void *env_arg);
    const void *env_arg;
    char run_id[96];       /* "test-<pid>-<k>" from dt_test_world_run when left empty */
    int port;              /* the store's, set by dt_test_world_run */
} dt_test_world;

/* What a rank of a world has. The body may free c (and set it NULL); the rest is freed after. */
typedef struct dt_test_rank {
    dt_comm *c;
    dt_store *store;
    int rank, n;
    const dt_test_world *w;
} dt_test_rank;

typedef void (*dt_test_world_fn)(dt_test_rank *x, void *arg);

/* Runs fn on w->n forked ranks as dt_test_run_ranks does (status[r] each exit status): each rank
 * sets its environment (dt_test_rank_env, then w->rank_env), opens its store connection and the
 * world communicator (dt_test_world_open; exit 2 when the store, 3 when the communicator fails,
 * with a line on stderr), runs fn, and frees both. */
void dt_test_world_run(dt_test_world *w, dt_test_world_fn fn, void *arg, double limit_s,
                       int *status);

/* ---- the trainer on forked ranks -------------------------------------------------------------- */

/* In a rank process: loads the source tree's configs/<config> with the overrides ov[0..nov)
 * (nov < 64) and then job.output_dir=<dir>/<name> into *job, and starts the trainer *t on it as
 * rank `rank` of n (local ranks alike) against the store on 127.0.0.1:port, run id
 * "<name>-<the parent's pid>". Returns 0; else the negative errno with what went wrong in
 * msg[0..cap) ("job: <error> <first config error>" for the job, the trainer's error else). */
int dt_test_trainer_start(dt_trainer *t, dt_job *job, const char *config, const char *const *ov,
                          int nov, const char *dir, const char *name, int rank, int n, int port,
                          char *msg, size_t cap);

#endif
