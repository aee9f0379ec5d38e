/* comm_shm.c - collectives between the ranks of one host through POSIX shared memory.
 *
 * Layout of a segment (n local ranks, K = 8 slices per rank):
 *
 *   header | n rank control blocks | n x K staging slices of slice_bytes
 *
 * Rank r owns its K slices; only r writes them, every local rank reads them. A collective is cut
 * into steps of at most one slice of payload; step s uses slice s % K. Each rank publishes three
 * monotonic step counters in its control block:
 *
 *   posted  >= s: r's step-s data is in its slice (with its description of the collective)
 *   reduced >= s: r finished the reduction it owns in step s
 *   done    >= s: r finished reading its peers' slices of step s
 *
 * All-reduce of one step (a segment of m elements in n chunks, chunk j owned by local rank j):
 *   1. post:   once every peer is done with step s-K (it has read our slice), copy the chunks we
 *              do not own into our slice; publish posted = s;
 *   2. reduce: once every peer posted s (and runs the same collective, checked here), our chunk =
 *              ours + every peer's copy (summed in float32, rounded once), written to our buffer
 *              and to our slice; publish reduced = s;
 *   3. finish: once every peer reduced s, copy the other chunks' results from their owners'
 *              slices; publish done = s.
 * Per rank that moves the buffer through memory about once each way, and every chunk is summed
 * by exactly one rank, so every rank ends with bit-identical results. Broadcast, all-gather and
 * reduce-scatter are the same steps without phase 3. Reductions add the ranks' values in rank
 * order (0, 1, ..., n-1) whichever rank sums an element, so an element's result does not depend
 * on how the collective was cut into chunks: an all-reduce and a reduce-scatter (ZeRO's) of the
 * same data give the same bits.
 *
 * The steps are pipelined, not lock-step: a rank does whatever phase of whatever step is ready
 * (posting up to K steps ahead) and blocks only when nothing is. Ranks share CPUs with compute
 * threads and other processes; in lock-step every step would cost a scheduling round trip
 * whenever a peer is off its CPU, while here a rank that gets its CPU back finds many steps ready.
 *
 * Waiting: a few tens of microseconds of spinning (a 4 KiB all-reduce must take well under
 * 50 us), a few sched_yield()s, then sleeping on a futex in the peer's control block (a peer
 * wakes sleepers when it publishes), waking every 50 ms to check the deadline, whether the peer
 * process still exists (pidfd) and whether any rank reported a failure. Counters are
 * sequentially consistent atomics: a waiter registers in `sleepers` before it reads `epoch`, a
 * publisher bumps `epoch` before it reads `sleepers`, so a wake-up is never lost.
 *
 * Large results (1 MiB and up) are written to the caller's buffer with streaming stores, which
 * skip reading the destination first: a third less memory traffic where memory bandwidth is the
 * limit.
 *
 * Communicator memory (dt_shm_mem_alloc) skips the staging slices: every rank's memory is a
 * shared-memory object that every local rank maps, so an all-reduce on it (same offset on every
 * rank) posts nothing, sums its chunk straight from the peers' memory into its own (in place),
 * and copies the other chunks from their owners' memory. Per rank that is about 2.5 passes over
 * the buffer instead of 4. A rank's memory is read by its peers until they finish, so such an
 * all-reduce returns only once every peer is done with the collective (the staged path needs no
 * such wait: peers read the slices, not the caller's buffer). The summation order is the staged
 * path's, so both give the same bits.
 */
#include "runtime/comm/comm_shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/comm_reduce.h"

#define SHM_MAGIC 0x316d68736e727464ull /* "dtrnshm1" */
#define SHM_VERSION 2u
#define SLICES 8
#define DEFAULT_SLICE (512u << 10)
#define DEFAULT_SPIN_US 50
#define BACKGROUND_SPIN_NS 2000
#define SLEEP_SLICE_MS 50
#define ALIGN_ELEMS 16               /* chunk boundaries on 64-byte lines for float32 */
#define STREAM_MIN_BYTES (1u << 20)  /* results this large are written with streaming stores */
#define REGION_HDR 4096u             /* communicator memory: a header page, then the data */
#define ZC_NONE UINT64_MAX           /* rank_ctl.zc of a staged collective */

typedef struct rank_ctl {
    _Atomic uint64_t posted, reduced, done;
    _Atomic uint32_t epoch;    /* futex word: bumped on every publish */
    _Atomic uint32_t sleepers; /* peers sleeping on epoch */
    _Atomic int32_t pid;
    int32_t pad;
    dt_coll_desc desc[SLICES]; /* the collective of the last step posted in each slice */
    uint64_t zc[SLICES];       /* its byte offset in communicator memory, or ZC_NONE (staged) */
    char abort_msg[400];       /* why this rank failed (valid once abort_rank names it) */
} __attribute__((aligned(128))) rank_ctl;

typedef struct shm_hdr {
    _Atomic uint64_t magic;    /* set last by the creator */
    uint32_t version;
    int32_t local_size;
    uint64_t slot_bytes;
    uint64_t total_bytes;
    _Atomic int32_t creator_pid; /* set first by the creator (dt_shm_clean reads it) */
    _Atomic int32_t attached;
    _Atomic int32_t abort_rank;  /* local index of the first rank that failed, -1 = none */
    int32_t pad;
    rank_ctl ctl[];
} shm_hdr;

/* Communicator memory: this rank's and every peer's mapping of one allocation. */
typedef struct shm_region {
    char **peer;             /* (n) data of each local rank, mapped here; peer[me] is ours */
    size_t bytes, map_bytes; /* data bytes; mapping bytes (header page included) */
    struct shm_region *next;
} shm_region;

struct dt_shm {
    shm_hdr *h;
    size_t map_bytes;
    char *data;      /* first slot */
    char name[200];
    bool creator;
    int me, n;
    int *globals;    /* (n) global ranks */
    int *pidfds;     /* (n) -1 when unavailable or self */
    size_t slot;
    uint64_t spin_ns;
    uint64_t step;   /* last step number used */
    bool failed;
    shm_region *regions; /* communicator memory */
    long long mem_max;   /* bytes of it this rank may hold (<0 = no limit) */
    size_t mem_used;
    unsigned nregions;   /* allocations made so far (names the next one) */
    _Atomic uint64_t sent; /* payload bytes of this rank that peers read (dt_shm_sent) */
};

/* ---- small helpers --------------------------------------------------------------------- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

static void run_tag(char *buf, size_t cap, const char *run_id)
{
    char clean[33];
    size_t k = 0;
    for (const char *p = run_id; *p && k < sizeof clean - 1; p++) {
        char c = *p;
        clean[k++] = ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_')
                         ? c
                         : '_';
    }
    clean[k] = '\0';
    snprintf(buf, cap, "dtrain.%u.%s.%08x.", (unsigned)getuid(), clean, fnv1a(run_id));
}

void dt_shm_name(char *buf, size_t cap, const char *run_id, int attempt, uint64_t gen,
                 int host_index)
{
    char tag[80];
    run_tag(tag, sizeof tag, run_id ? run_id : "none");
    snprintf(buf, cap, "/%sa%d.g%llu.h%d", tag, attempt, (unsigned long long)gen, host_index);
}

static bool pid_alive(int pid)
{
    if (pid <= 0)
        return false;
    return kill(pid, 0) == 0 || errno == EPERM;
}

int dt_shm_clean(const char *run_id)
{
    char tag[80];
    run_tag(tag, sizeof tag, run_id ? run_id : "none");
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, tag, strlen(tag)) != 0)
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY, 0);
        if (fd < 0)
            continue;
        shm_hdr h;
        struct stat st;
        bool stale = false;
        memset(&h, 0, sizeof h);
        if (fstat(fd, &st) == 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h) {
            int pid = atomic_load(&h.creator_pid);
            if (pid > 0)
                stale = !pid_alive(pid);
            else /* creator died before it wrote its pid */
                stale = time(NULL) - st.st_mtime > 60;
        }
        close(fd);
        if (stale && shm_unlink(name) == 0) {
            removed++;
            DT_INFO("comm: removed stale shared-memory segment %s (its creator no longer runs)",
                    name);
        }
    }
    closedir(d);
    return removed;
}

static inline char *slot_ptr(dt_shm *s, int r, uint64_t step)
{
    return s->data + ((size_t)r * SLICES + (size_t)(step % SLICES)) * s->slot;
}

/* ---- failure ----------------------------------------------------------------------------- */

void dt_shm_abort(dt_shm *s, const char *msg)
{
    if (!s)
        return;
    s->failed = true;
    rank_ctl *me = &s->h->ctl[s->me];
    int32_t expect = -1;
    /* Only the first failure is told: it is the root cause; later ones are its echoes. */
    if (atomic_load(&s->h->abort_rank) == -1) {
        dt_strlcpy(me->abort_msg, msg, sizeof me->abort_msg);
        atomic_compare_exchange_strong(&s->h->abort_rank, &expect, s->me);
    }
    for (int j = 0; j < s->n; j++) {
        atomic_fetch_add(&s->h->ctl[j].epoch, 1);
        futex_wake(&s->h->ctl[j].epoch);
    }
}

/* Formats "<collective>: <message>" into err, tells the peers (unless the failure came from
 * them), and returns code. */
static int fail(dt_shm *s, const dt_coll_ctx *ctx, dt_err *err, int code, bool tell,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int fail(dt_shm *s, const dt_coll_ctx *ctx, dt_err *err, int code, bool tell,
                const char *fmt, ...)
{
    char what[160], msg[DT_ERR_MSG_MAX - 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_coll_describe(&ctx->desc, what, sizeof what);
    dt_err_set(err, code, "%s: %s", what, msg);
    if (tell) {
        char told[DT_ERR_MSG_MAX];
        snprintf(told, sizeof told, "%s", err ? err->msg : msg);
        dt_shm_abort(s, told);
    }
    s->failed = true;
    return code;
}

static int peer_aborted(dt_shm *s, const dt_coll_ctx *ctx, dt_err *err)
{
    int a = atomic_load(&s->h->abort_rank);
    if (a < 0 || a == s->me)
        return 0;
    return fail(s, ctx, err, -ECONNABORTED, false, "rank %d failed: %.600s", s->globals[a],
                s->h->ctl[a].abort_msg);
}

static bool peer_dead(dt_shm *s, int j)
{
    if (s->pidfds[j] >= 0) {
        struct pollfd p = {s->pidfds[j], POLLIN, 0};
        return poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
    }
    return !pid_alive(atomic_load(&s->h->ctl[j].pid));
}

/* ---- waiting ----------------------------------------------------------------------------- */

enum { W_POSTED, W_REDUCED, W_DONE };

static _Atomic uint64_t *counter(dt_shm *s, int j, int which)
{
    rank_ctl *c = &s->h->ctl[j];
    return which == W_POSTED ? &c->posted : which == W_REDUCED ? &c->reduced : &c->done;
}

static const char *const wait_what[] = {
    "stage its data for this step",
    "finish its share of the reduction",
    "finish reading the staging buffers of the previous step",
};

static int wait_ge(dt_shm *s, int j, int which, uint64_t target, const dt_coll_ctx *ctx,
                   dt_err *err)
{
    _Atomic uint64_t *ctr = counter(s, j, which);
    if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
        return 0;
    uint64_t t0 = dt_now_ns();
    /* In the background (DDP buckets during backward) the CPU is better spent on the caller's
     * computation than on spinning: spin a little only, then yield and sleep; once the caller
     * blocks on the result (DDP's finish), nothing else wants this CPU. */
    bool quiet = ctx->background && !(ctx->waiters && atomic_load_explicit(ctx->waiters,
                                                                           memory_order_relaxed) > 0);
    uint64_t spin = quiet ? DT_MIN(s->spin_ns, (uint64_t)BACKGROUND_SPIN_NS) : s->spin_ns;
    while (dt_now_ns() - t0 < spin) {
        for (int i = 0; i < 32; i++)
            cpu_relax();
        if (atomic_load_explicit(ctr, memory_order_acquire) >= target)
            return 0;
        if (atomic_load_explicit(&s->h->abort_rank, memory_order_relaxed) >= 0)
            break;
    }
    rank_ctl *c = &s->h->ctl[j];
    for (int yields = 0;; yields++) {
        /* Progress first: a peer that posted and then failed still posted. */
        if (atomic_load(ctr) >= target)
            return 0;
        int rc = peer_aborted(s, ctx, err);
        if (rc)
            return rc;
        uint64_t now = dt_now_ns();
        if (now >= ctx->deadline_ns)
            return fail(s, ctx, err, -ETIMEDOUT, true,
                        "timed out after %.1f s waiting for rank %d (pid %d, same host) to %s; "
                        "that rank is stalled or dead, or it issued fewer collectives than this "
                        "one (every rank must run the same steps); ddp.timeout sets the limit",
                        ctx->timeout_ms / 1000.0, s->globals[j], (int)atomic_load(&c->pid),
                        wait_what[which]);
        if (peer_dead(s, j))
            return fail(s, ctx, err, -ECONNRESET, true,
                        "rank %d (pid %d, same host) exited while this rank waited for it to %s",
                        s->globals[j], (int)atomic_load(&c->pid), wait_what[which]);
        if (yields < 4) { /* let a peer on this very core run before going to sleep */
            sched_yield();
            if (atomic_load(ctr) >= target)
                return 0;
            continue;
        }
        atomic_fetch_add(&c->sleepers, 1);
        uint32_t e = atomic_load(&c->epoch);
        if (atomic_load(ctr) >= target) {
            atomic_fetch_sub(&c->sleepers, 1);
            return 0;
        }
        uint64_t left_ms = (ctx->deadline_ns - now) / 1000000u + 1;
        futex_wait(&c->epoch, e, (int)DT_MIN(left_ms, (uint64_t)SLEEP_SLICE_MS));
        atomic_fetch_sub(&c->sleepers, 1);
        if (atomic_load(ctr) >= target)
            return 0;
    }
}

static void publish(dt_shm *s, int which, uint64_t step)
{
    rank_ctl *c = &s->h->ctl[s->me];
    atomic_store(counter(s, s->me, which), step);
    atomic_fetch_add(&c->epoch, 1);
    if (atomic_load(&c->sleepers) > 0)
        futex_wake(&c->epoch);
}

/* The first peer whose counter is below target, or -1 when none is. */
static int behind(dt_shm *s, int which, uint64_t target)
{
    for (int j = 0; j < s->n; j++)
        if (j != s->me && atomic_load_explicit(counter(s, j, which), memory_order_acquire) < target)
            return j;
    return -1;
}

/* Chunk j of a segment of m elements: [lo, hi). */
static void chunk(size_t m, int n, int j, size_t *lo, size_t *hi)
{
    size_t c = (m + (size_t)n - 1) / (size_t)n;
    c = (c + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    *lo = DT_MIN((size_t)j * c, m);
    *hi = DT_MIN(*lo + c, m);
}

/* One collective as steps: what each phase does with step i (0-based within the collective). */
typedef struct shm_op {
    int kind;               /* dt_coll_kind */
    dt_dtype t;
    dt_redop op;            /* reductions */
    size_t es;              /* element size (1 for byte-wise collectives) */
    size_t count;           /* elements (per rank for allgather, reduce_scatter; bytes for
                               broadcast and allgather) */
    size_t per_step;        /* elements per step */
    char *buf;              /* allreduce, broadcast */
    const char *send;       /* allgather, reduce_scatter */
    char *recv;
    int root;               /* broadcast: local index */
    float scale;
    bool stream;
    const shm_region *zc; /* allreduce on communicator memory: no staging */
    size_t zoff;          /* byte offset of buf in it */
} shm_op;

/* The bytes this rank sends, as a message-passing transport would (dt_shm_sent): what its peers
 * read of its data. Counted where the data is offered, per step, from the chunks the step really
 * cuts (so the figure carries the chunking's rounding): an all-reduce's chunk j goes to its owner
 * j (post), the chunk this rank owns goes back reduced to every peer (reduce); a broadcast's root
 * and an all-gather's every rank offer the step to n - 1 peers; a reduce-scatter sends block j to
 * rank j. Per rank that is the ring's 2 (n-1)/n of an all-reduce and (n-1)/n of the others. */
static void count_sent(dt_shm *s, size_t bytes)
{
    atomic_fetch_add_explicit(&s->sent, bytes, memory_order_relaxed);
}

static void phase_post(dt_shm *s, const shm_op *o, uint64_t i, char *mine)
{
    size_t off = (size_t)i * o->per_step, m = DT_MIN(o->per_step, o->count - off), lo, hi;
    switch (o->kind) {
    case DT_COLL_ALLREDUCE:
        for (int j = 0; j < s->n; j++) {
            if (j == s->me)
                continue;
            chunk(m, s->n, j, &lo, &hi);
            if (!o->zc) /* communicator memory: the owner reads it where it is */
                memcpy(mine + lo * o->es, o->buf + (off + lo) * o->es, (hi - lo) * o->es);
            count_sent(s, (hi - lo) * o->es);
        }
        break;
    case DT_COLL_BROADCAST:
        if (s->me == o->root) {
            memcpy(mine, o->buf + off, m);
            count_sent(s, m * (size_t)(s->n - 1));
        }
        break;
    case DT_COLL_ALLGATHER:
        memcpy(mine, o->send + off, m);
        count_sent(s, m * (size_t)(s->n - 1));
        break;
    case DT_COLL_REDUCE_SCATTER:
        for (int j = 0; j < s->n; j++)
            if (j != s->me)
                memcpy(mine + (size_t)j * o->per_step * o->es,
                       o->send + ((size_t)j * o->count + off) * o->es, m * o->es);
        count_sent(s, m * o->es * (size_t)(s->n - 1));
        break;
    }
}

static void phase_reduce(dt_shm *s, const shm_op *o, uint64_t step, uint64_t i, char *mine)
{
    size_t off = (size_t)i * o->per_step, m = DT_MIN(o->per_step, o->count - off), lo, hi;
    const void *srcs[DT_SHM_MAX_LOCAL];
    switch (o->kind) {
    case DT_COLL_ALLREDUCE:
        /* summed in rank order, whoever owns the chunk: the same bits as a reduce-scatter */
        chunk(m, s->n, s->me, &lo, &hi);
        for (int j = 0; j < s->n; j++)
            srcs[j] = j == s->me ? o->buf + (off + lo) * o->es
                      : o->zc    ? o->zc->peer[j] + o->zoff + (off + lo) * o->es
                                 : slot_ptr(s, j, step) + lo * o->es;
        if (hi > lo)
            dt_reduce(o->buf + (off + lo) * o->es, o->zc ? NULL : mine + lo * o->es, srcs, s->n,
                      hi - lo, o->t, o->op, o->scale, o->stream);
        count_sent(s, (hi - lo) * o->es * (size_t)(s->n - 1)); /* read back by every peer */
        if (o->zc && o->stream)
            dt_stream_fence(); /* the peers read this chunk once we publish */
        break;
    case DT_COLL_BROADCAST:
        if (s->me != o->root)
            memcpy(o->buf + off, slot_ptr(s, o->root, step), m);
        break;
    case DT_COLL_ALLGATHER:
        for (int j = 0; j < s->n; j++)
            if (j != s->me)
                memcpy(o->recv + (size_t)j * o->count + off, slot_ptr(s, j, step), m);
        break;
    case DT_COLL_REDUCE_SCATTER:
        for (int j = 0; j < s->n; j++) /* rank order, as the all-reduce */
            srcs[j] = j == s->me ? o->send + ((size_t)s->me * o->count + off) * o->es
                                 : slot_ptr(s, j, step) + (size_t)s->me * o->per_step * o->es;
        if (m)
            dt_reduce(o->recv + off * o->es, NULL, srcs, s->n, m, o->t, o->op, o->scale, false);
        break;
    }
}

static void phase_finish(dt_shm *s, const shm_op *o, uint64_t step, uint64_t i)
{
    size_t off = (size_t)i * o->per_step, m = DT_MIN(o->per_step, o->count - off), lo, hi;
    for (int j = 0; j < s->n; j++) {
        if (j == s->me)
            continue;
        chunk(m, s->n, j, &lo, &hi);
        dt_copy(o->buf + (off + lo) * o->es,
                o->zc ? o->zc->peer[j] + o->zoff + (off + lo) * o->es
                      : slot_ptr(s, j, step) + lo * o->es,
                (hi - lo) * o->es, o->stream);
    }
}

static void zc_describe(uint64_t zc, char *buf, size_t cap)
{
    if (zc == ZC_NONE)
        snprintf(buf, cap, "a buffer of its own");
    else
        snprintf(buf, cap, "communicator memory at offset %llu", (unsigned long long)zc);
}

static int check_desc(dt_shm *s, uint64_t step, const dt_coll_ctx *ctx, dt_err *err)
{
    const uint64_t zc = s->h->ctl[s->me].zc[step % SLICES];
    for (int j = 0; j < s->n; j++) {
        if (j == s->me)
            continue;
        const dt_coll_desc *theirs = &s->h->ctl[j].desc[step % SLICES];
        const uint64_t tzc = s->h->ctl[j].zc[step % SLICES];
        if (dt_coll_same(theirs, &ctx->desc) && tzc != zc) {
            char a[64], b[64];
            zc_describe(zc, a, sizeof a);
            zc_describe(tzc, b, sizeof b);
            return fail(s, ctx, err, -EPROTO, true,
                        "rank %d runs it on %s, this rank on %s (every rank must all-reduce the "
                        "same range of its dt_comm_mem_alloc memory, or none)",
                        s->globals[j], b, a);
        }
        if (!dt_coll_same(theirs, &ctx->desc)) {
            char a[160];
            dt_coll_describe(theirs, a, sizeof a);
            return fail(s, ctx, err, -EPROTO, true,
                        "collective mismatch: rank %d issued %s at the same point (ranks must "
                        "issue the same collectives, with the same sizes, in the same order)",
                        s->globals[j], a);
        }
    }
    return 0;
}

/* Runs the steps of o (at least one, so that even an empty collective is checked against the
 * peers), each phase as soon as it is ready, blocking only when no phase of any step is. */
static int run_op(dt_shm *s, const shm_op *o, const dt_coll_ctx *ctx, dt_err *err)
{
    if (s->failed)
        return fail(s, ctx, err, -EPIPE, false, "shared-memory group failed earlier");
    const uint64_t nsteps = o->count ? (o->count + o->per_step - 1) / o->per_step : 1;
    const uint64_t first = s->step + 1, end = s->step + nsteps;
    const bool three = o->kind == DT_COLL_ALLREDUCE;
    uint64_t p = first, r = first, c = first; /* next step to post, reduce, finish */
    int rc = 0;
    while ((three ? c : r) <= end) {
        bool progress = false;
        while (p <= end && (p <= SLICES || behind(s, W_DONE, p - SLICES) < 0)) {
            phase_post(s, o, p - first, slot_ptr(s, s->me, p));
            s->h->ctl[s->me].desc[p % SLICES] = ctx->desc;
            s->h->ctl[s->me].zc[p % SLICES] = o->zc ? o->zoff : ZC_NONE;
            publish(s, W_POSTED, p);
            p++;
            progress = true;
        }
        while (r < p && behind(s, W_POSTED, r) < 0) {
            if ((rc = check_desc(s, r, ctx, err)) != 0)
                return rc;
            phase_reduce(s, o, r, r - first, slot_ptr(s, s->me, r));
            publish(s, W_REDUCED, r);
            if (!three)
                publish(s, W_DONE, r);
            r++;
            progress = true;
        }
        while (three && c < r && behind(s, W_REDUCED, c) < 0) {
            phase_finish(s, o, c, c - first);
            publish(s, W_DONE, c);
            c++;
            progress = true;
        }
        if (progress)
            continue;
        /* Nothing was ready: wait for the peer that holds up the oldest pending phase. A peer
         * may have moved since the phases were tried, so a phase found ready now means another
         * round, never a wait further down: that wait could be for something this very rank
         * must do first (waiting on the peer's `done` of step p - SLICES while our reduction of
         * an earlier step, which the peer needs to get there, has just become possible). */
        int j;
        if (three && c < r) {
            if ((j = behind(s, W_REDUCED, c)) >= 0)
                rc = wait_ge(s, j, W_REDUCED, c, ctx, err);
        } else if (r < p) {
            if ((j = behind(s, W_POSTED, r)) >= 0)
                rc = wait_ge(s, j, W_POSTED, r, ctx, err);
        } else if (p <= end && (j = behind(s, W_DONE, p - SLICES)) >= 0) {
            rc = wait_ge(s, j, W_DONE, p - SLICES, ctx, err);
        }
        if (rc)
            return rc;
    }
    s->step = end;
    if (o->stream)
        dt_stream_fence();
    /* Communicator memory: the peers read ours until they are done with the last step. */
    for (int j; o->zc && (j = behind(s, W_DONE, end)) >= 0;)
        if ((rc = wait_ge(s, j, W_DONE, end, ctx, err)) != 0)
            return rc;
    return 0;
}

/* ---- collectives ------------------------------------------------------------------------- */

int dt_shm_allreduce(dt_shm *s, void *buf, size_t count, dt_dtype t, dt_redop op,
                     float scale, const dt_coll_ctx *ctx, dt_err *err)
{
    size_t es = dt_dtype_size(t);
    shm_op o = {.kind = DT_COLL_ALLREDUCE, .t = t, .op = op, .es = es, .count = count,
                .per_step = s->slot / es, .buf = buf, .scale = scale,
                .stream = count * es >= STREAM_MIN_BYTES};
    for (const shm_region *g = s->regions; g && count; g = g->next) {
        const char *lo = g->peer[s->me], *p = buf;
        if (p >= lo && p < lo + g->bytes && count * es <= (size_t)(lo + g->bytes - p)) {
            o.zc = g;
            o.zoff = (size_t)(p - lo);
            break;
        }
    }
    return run_op(s, &o, ctx, err);
}

int dt_shm_broadcast(dt_shm *s, void *buf, size_t bytes, int root, const dt_coll_ctx *ctx,
                     dt_err *err)
{
    shm_op o = {.kind = DT_COLL_BROADCAST, .es = 1, .count = bytes, .per_step = s->slot,
                .buf = buf, .root = root};
    return run_op(s, &o, ctx, err);
}

int dt_shm_allgather(dt_shm *s, const void *send, void *recv, size_t bytes,
                     const dt_coll_ctx *ctx, dt_err *err)
{
    char *own = (char *)recv + (size_t)s->me * bytes;
    if (own != (const char *)send)
        memmove(own, send, bytes);
    shm_op o = {.kind = DT_COLL_ALLGATHER, .es = 1, .count = bytes, .per_step = s->slot,
                .send = own, .recv = recv};
    return run_op(s, &o, ctx, err);
}

int dt_shm_reduce_scatter(dt_shm *s, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, float scale, const dt_coll_ctx *ctx, dt_err *err)
{
    size_t es = dt_dtype_size(t);
    shm_op o = {.kind = DT_COLL_REDUCE_SCATTER, .t = t, .op = op, .es = es, .count = count,
                .per_step = s->slot / ((size_t)s->n * es), .send = send, .recv = recv,
                .scale = scale};
    return run_op(s, &o, ctx, err);
}

uint64_t dt_shm_sent(const dt_shm *s)
{
    return s ? atomic_load_explicit(&((dt_shm *)(uintptr_t)s)->sent, memory_order_relaxed) : 0;
}

int dt_shm_barrier(dt_shm *s, const dt_coll_ctx *ctx, dt_err *err)
{
    shm_op o = {.kind = DT_COLL_BARRIER, .es = 1, .count = 0, .per_step = 1};
    return run_op(s, &o, ctx, err);
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static int open_pidfd(int pid)
{
#ifdef SYS_pidfd_open
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0)
        dt_set_cloexec(fd);
    return fd;
#else
    (void)pid;
    return -1;
#endif
}

int dt_shm_open(dt_shm **out, const dt_shm_opts *o, bool create, dt_err *err)
{
    int rc = 0, fd = -1;
    if (o->local_size < 2 || o->local_size > DT_SHM_MAX_LOCAL || o->local_rank < 0 ||
        o->local_rank >= o->local_size)
        return dt_err_set(err, -EINVAL, "shared memory: %d local ranks (2..%d), index %d",
                          o->local_size, DT_SHM_MAX_LOCAL, o->local_rank);
    dt_shm *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "shared memory: out of memory");
    s->me = o->local_rank;
    s->n = o->local_size;
    s->slot = o->slot_bytes ? o->slot_bytes : DEFAULT_SLICE;
    s->slot = DT_MAX((size_t)16384, (s->slot + 4095) / 4096 * 4096);
    s->spin_ns = (uint64_t)(o->spin_us >= 0 ? o->spin_us : DEFAULT_SPIN_US) * 1000u;
    s->mem_max = o->mem_max_bytes;
    dt_strlcpy(s->name, o->name, sizeof s->name);
    s->globals = calloc((size_t)s->n, sizeof *s->globals);
    s->pidfds = calloc((size_t)s->n, sizeof *s->pidfds);
    if (!s->globals || !s->pidfds) {
        rc = dt_err_set(err, -ENOMEM, "shared memory: out of memory");
        goto fail;
    }
    for (int j = 0; j < s->n; j++) {
        s->globals[j] = o->global_ranks[j];
        s->pidfds[j] = -1;
    }
    size_t hdr = sizeof(shm_hdr) + (size_t)s->n * sizeof(rank_ctl);
    hdr = (hdr + 4095) / 4096 * 4096;
    size_t total = hdr + (size_t)s->n * SLICES * s->slot;

    if (create) {
        for (int tries = 0;; tries++) {
            fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
            if (fd >= 0 || errno != EEXIST || tries > 0)
                break;
            /* A segment of this very name: a dead earlier group of the same run id, unless its
             * creator still runs. */
            int old = shm_open(s->name, O_RDONLY, 0);
            shm_hdr oh;
            memset(&oh, 0, sizeof oh);
            if (old >= 0) {
                if (pread(old, &oh, sizeof oh, 0) != (ssize_t)sizeof oh)
                    memset(&oh, 0, sizeof oh);
                close(old);
            }
            int pid = atomic_load(&oh.creator_pid);
            if (pid_alive(pid)) {
                rc = dt_err_set(err, -EEXIST,
                                "shared memory: %s is in use by process %d: another job with "
                                "the same run id runs on this host (give each job its own "
                                "rendezvous.id)",
                                s->name, pid);
                goto fail;
            }
            shm_unlink(s->name);
        }
        if (fd < 0) {
            rc = dt_err_errno(err, errno, "shared memory: cannot create %s", s->name);
            goto fail;
        }
        s->creator = true; /* from here on, a failure unlinks the name */
        if (ftruncate(fd, (off_t)total) != 0) {
            rc = dt_err_errno(err, errno, "shared memory: cannot size %s to %zu bytes (is /dev/shm "
                              "large enough?)", s->name, total);
            goto fail;
        }
    } else {
        fd = shm_open(s->name, O_RDWR, 0);
        if (fd < 0) {
            rc = dt_err_errno(err, errno, "shared memory: cannot open %s created by local rank 0",
                              s->name);
            goto fail;
        }
        struct stat st;
        if (fstat(fd, &st) != 0 || (size_t)st.st_size != total) {
            rc = dt_err_set(err, -EPROTO,
                            "shared memory: %s has %lld bytes, expected %zu (ranks disagree on "
                            "DTRAIN_COMM_SHM_SLOT_KB or the number of local ranks)",
                            s->name, (long long)st.st_size, total);
            goto fail;
        }
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        rc = dt_err_errno(err, errno, "shared memory: cannot map %s (%zu bytes)", s->name, total);
        goto fail;
    }
    close(fd);
    fd = -1;
    s->h = p;
    s->map_bytes = total;
    s->data = (char *)p + hdr;
    if (create) {
        atomic_store(&s->h->creator_pid, (int32_t)getpid());
        s->h->version = SHM_VERSION;
        s->h->local_size = s->n;
        s->h->slot_bytes = s->slot;
        s->h->total_bytes = total;
        atomic_store(&s->h->abort_rank, -1);
        atomic_store(&s->h->magic, SHM_MAGIC);
    } else if (atomic_load(&s->h->magic) != SHM_MAGIC || s->h->version != SHM_VERSION ||
               s->h->local_size != s->n || s->h->slot_bytes != s->slot) {
        rc = dt_err_set(err, -EPROTO,
                        "shared memory: %s is not a dtrain segment of this group (version %u, %d "
                        "ranks, %llu-byte slots; expected %u, %d, %zu)",
                        s->name, s->h->version, s->h->local_size,
                        (unsigned long long)s->h->slot_bytes, SHM_VERSION, s->n, s->slot);
        goto fail;
    }
    atomic_store(&s->h->ctl[s->me].pid, (int32_t)getpid());
    if (atomic_fetch_add(&s->h->attached, 1) + 1 == s->n) {
        shm_unlink(s->name); /* everyone is in: the name is no longer needed */
        DT_DEBUG("comm: every local rank attached to %s; unlinked", s->name);
    }
    *out = s;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (s->creator)
        shm_unlink(s->name);
    dt_shm_close(s);
    return rc;
}

int dt_shm_ready(dt_shm *s, uint64_t deadline_ns, dt_err *err)
{
    for (int sleep_us = 50; atomic_load(&s->h->attached) < s->n;) {
        if (dt_now_ns() >= deadline_ns)
            return dt_err_set(err, -ETIMEDOUT,
                              "shared memory: only %d of %d local ranks attached to %s in time "
                              "(a local rank died or is stuck during start-up)",
                              (int)atomic_load(&s->h->attached), s->n, s->name);
        usleep((useconds_t)sleep_us);
        sleep_us = DT_MIN(sleep_us * 2, 5000);
    }
    for (int j = 0; j < s->n; j++)
        if (j != s->me && s->pidfds[j] < 0)
            s->pidfds[j] = open_pidfd(atomic_load(&s->h->ctl[j].pid));
    return 0;
}

/* ---- communicator memory ------------------------------------------------------------------ */

static void region_name(char *buf, size_t cap, const dt_shm *s, unsigned idx, int j)
{
    snprintf(buf, cap, "%s.m%u.r%d", s->name, idx, j);
}

/* Unlinks the names of every local rank's object of allocation idx (ENOENT is fine). */
static void unlink_region(const dt_shm *s, unsigned idx)
{
    for (int j = 0; j < s->n; j++) {
        char name[300];
        region_name(name, sizeof name, s, idx, j);
        shm_unlink(name);
    }
}

static void region_free(dt_shm *s, shm_region *g)
{
    if (!g)
        return;
    for (int j = 0; g->peer && j < s->n; j++)
        if (g->peer[j])
            munmap(g->peer[j] - REGION_HDR, g->map_bytes);
    free(g->peer);
    free(g);
}

/* Maps local rank j's object of region idx (create: ours, new) into g->peer[j]. */
static int region_map(dt_shm *s, shm_region *g, unsigned idx, int j, bool create, dt_err *err)
{
    char name[300];
    region_name(name, sizeof name, s, idx, j);
    int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
    if (fd < 0 && create && errno == EEXIST) { /* left by a dead process of an earlier group */
        shm_unlink(name);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot %s shared memory %s", create ? "create" : "open",
                            name);
    int rc = 0;
    struct stat st;
    int e;
    if (create && ftruncate(fd, (off_t)g->map_bytes) != 0)
        rc = dt_err_errno(err, errno, "cannot size %s to %zu bytes (is /dev/shm large enough?)",
                          name, g->map_bytes);
    /* Reserve the pages now: a tmpfs that runs full later (docker's 64 MiB /dev/shm) would
     * kill the process with SIGBUS on first touch instead of failing here. */
    else if (create && (e = posix_fallocate(fd, 0, (off_t)g->map_bytes)) != 0)
        rc = dt_err_set(err, e == ENOSPC || e == ENOMEM || e == EFBIG ? -ENOSPC : -e,
                        "/dev/shm has no room for %zu bytes (%s)", g->map_bytes, strerror(e));
    else if (!create && (fstat(fd, &st) != 0 || (size_t)st.st_size != g->map_bytes))
        rc = dt_err_set(err, -EPROTO, "%s has %lld bytes, expected %zu", name,
                        (long long)st.st_size, g->map_bytes);
    void *p = rc ? MAP_FAILED
                 : mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                        0);
    if (!rc && p == MAP_FAILED)
        rc = dt_err_errno(err, errno, "cannot map %s (%zu bytes)", name, g->map_bytes);
    close(fd);
    if (rc) {
        if (create)
            shm_unlink(name);
        return rc;
    }
    if (create) { /* the header dt_shm_clean reads: who to ask whether it is stale */
        shm_hdr *h = p;
        atomic_store(&h->creator_pid, (int32_t)getpid());
        h->version = SHM_VERSION;
        h->total_bytes = g->map_bytes;
        atomic_store(&h->magic, SHM_MAGIC);
    }
    g->peer[j] = (char *)p + REGION_HDR;
    return 0;
}

int dt_shm_mem_alloc(dt_shm *s, size_t bytes, void **out, const dt_coll_ctx *ctx, dt_err *err)
{
    *out = NULL;
    if (s->failed)
        return fail(s, ctx, err, -EPIPE, false, "shared-memory group failed earlier");
    unsigned idx = s->nregions++;
    shm_op barrier = {.kind = DT_COLL_BARRIER, .es = 1, .count = 0, .per_step = 1};
    char own[300];
    region_name(own, sizeof own, s, idx, s->me);
    int rc = 0;
    dt_err e = {0};
    shm_region *g = calloc(1, sizeof *g);
    if (!g || !(g->peer = calloc((size_t)s->n, sizeof *g->peer))) {
        free(g);
        return fail(s, ctx, err, -ENOMEM, true, "out of memory");
    }
    g->bytes = bytes;
    g->map_bytes = REGION_HDR + (DT_MAX(bytes, (size_t)1) + 4095) / 4096 * 4096;
    /* Everyone creates its object, then maps everyone else's, then the names are unlinked (the
     * mappings keep the memory; a crash in between leaves names for dt_shm_clean). The
     * collectives check that every rank asks for the same size (ctx->desc). A rank without
     * room votes no, and then nobody keeps communicator memory. */
    if (s->mem_max >= 0 && (long long)(s->mem_used + g->map_bytes) > s->mem_max)
        rc = dt_err_set(&e, -ENOSPC, "%zu bytes would exceed DTRAIN_COMM_SHM_MEM_MB=%lld",
                        g->map_bytes, s->mem_max >> 20);
    else
        rc = region_map(s, g, idx, s->me, true, &e);
    if (rc && rc != -ENOSPC)
        goto fail;
    int32_t vote[2] = {rc ? 1 : 0, rc ? s->me + 1 : 0}; /* no-votes, who + 1 */
    shm_op agree = {.kind = DT_COLL_ALLREDUCE, .t = DT_INT32, .op = DT_SUM, .es = sizeof *vote,
                    .count = 2, .per_step = s->slot / sizeof *vote, .buf = (char *)vote,
                    .scale = 1.0f};
    if ((rc = run_op(s, &agree, ctx, err)) != 0)
        goto out;
    if (vote[0] > 0) {
        unlink_region(s, idx); /* every object that will ever be created is: none stays */
        if (e.msg[0]) {
            rc = dt_err_set(err, -ENOSPC, "communicator memory on rank %d: %s",
                            s->globals[s->me], e.msg);
            DT_WARN("comm: %s", err->msg);
        }
        else if (vote[0] == 1)
            rc = dt_err_set(err, -ENOSPC, "communicator memory: rank %d has no room for it (see "
                            "its log)", s->globals[vote[1] - 1]);
        else
            rc = dt_err_set(err, -ENOSPC, "communicator memory: %d local ranks have no room for "
                            "it", vote[0]);
        goto out;
    }
    for (int j = 0; j < s->n; j++)
        if (j != s->me && (rc = region_map(s, g, idx, j, false, &e)) != 0)
            goto fail;
    if ((rc = run_op(s, &barrier, ctx, err)) != 0)
        goto out;
    unlink_region(s, idx); /* all of them: none is linked once any rank returns */
    g->next = s->regions;
    s->regions = g;
    s->mem_used += g->map_bytes;
    *out = g->peer[s->me];
    return 0;
fail:
    rc = fail(s, ctx, err, rc, true, "communicator memory: %s", e.msg);
out:
    shm_unlink(own);
    region_free(s, g);
    return rc;
}

bool dt_shm_mem_free(dt_shm *s, void *p)
{
    if (!s || !p)
        return false;
    for (shm_region **pg = &s->regions; *pg; pg = &(*pg)->next) {
        if ((*pg)->peer[s->me] == p) {
            shm_region *g = *pg;
            *pg = g->next;
            s->mem_used -= g->map_bytes;
            region_free(s, g);
            return true;
        }
    }
    return false;
}

void dt_shm_close(dt_shm *s)
{
    if (!s)
        return;
    while (s->regions) {
        shm_region *g = s->regions;
        s->regions = g->next;
        region_free(s, g);
    }
    if (s->h) {
        /* The group never formed completely: the name is still linked. */
        if (s->creator && atomic_load(&s->h->attached) < s->n)
            shm_unlink(s->name);
        munmap(s->h, s->map_bytes);
    }
    if (s->pidfds)
        for (int j = 0; j < s->n; j++)
            if (s->pidfds[j] >= 0)
                close(s->pidfds[j]);
    free(s->pidfds);
    free(s->globals);
    free(s);
}
