/* flightrec.h - the flight records a worker keeps and its agent reads: the shared layout, its
 * writer and its reader.
 *
 * What it is for. When a job hangs, the rank that causes it is often the one that cannot say so:
 * stopped, stuck in a system call, spinning in compute, or dead. So every built-in worker keeps
 * its last N collective and point-to-point calls (a ring) and its position in the trainer
 * (step, micro-step, phase and since when) in memory that its agent maps too: the agent reads it
 * without the worker's help, whatever the worker is doing. runtime/train/obs/flight.c writes it
 * (the position, and every call through the comm layer's observer); runtime/launch/agent_flight.c
 * reads it. This header is the contract between the two, at the level both may include
 * (runtime/job/: the launcher never includes comm/ or train/).
 *
 * The mapping. The agent creates it for each worker before the fork (a memfd of
 * dt_flightrec_bytes(capacity), passed to the worker as an inherited descriptor named by
 * DTRAIN_FLIGHT_FD), so it exists from the worker's first instruction to well after its death
 * (the agent keeps its own mapping) and leaves nothing behind in /dev/shm or on disk when either
 * process is killed. A worker started without an agent makes an anonymous one (nobody reads it).
 *
 *   [dt_flightrec_hdr: header, names, groups, position, step windows, the agent's straggler
 *    list][capacity x dt_flightrec_rec: the ring]
 *
 * Writes are lock-free for the reader: every record, the position and every window carry a
 * sequence counter (a seqlock): the writer makes it odd, writes, makes it even; the reader copies,
 * and keeps the copy only when the counter was even and unchanged across the copy, so a torn
 * read (the writer stopped or preempted mid-write) is detected and retried, or reported as
 * "torn" when it stays so (a writer SIGSTOPped mid-record). Writers of one record exclude each
 * other with a compare-and-swap on its counter (a record may be completed by another thread than
 * the one that issued it); they never wait for the reader. A record's slot is (id - 1) mod
 * capacity: once 'capacity' newer calls were issued, the slot holds a newer record, and a late
 * completion of the old one (its id no longer there) is dropped.
 *
 * Clocks: times are CLOCK_MONOTONIC nanoseconds (dt_now_ns), which the agent and its workers
 * share (one host); the agent converts them to wall-clock seconds for its reports.
 *
 * Names: the writer fills the op and dtype name tables (it knows the comm layer's enums), so the
 * reader prints what the record says without a copy of those enums.
 */
#ifndef DT_FLIGHTREC_H
#define DT_FLIGHTREC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DT_FLIGHTREC_MAGIC 0x3152434c54474c46ull /* "FLGTLCR1" */
#define DT_FLIGHTREC_VERSION 1
#define DT_FLIGHTREC_DEFAULT 2000 /* records per worker (train.flight_records) */
#define DT_FLIGHTREC_MAX 1000000
#define DT_FLIGHTREC_GROUPS 16    /* communicators a worker may register */
#define DT_FLIGHTREC_MEMBERS 64   /* global ranks kept per group (a world keeps none: identity) */
#define DT_FLIGHTREC_NAMES 16     /* op and dtype names */
#define DT_FLIGHTREC_WINDOWS 8    /* straggler windows kept */
#define DT_FLIGHTREC_STRAGGLERS 8 /* ranks the agent may name to rank 0's metrics */

/* A call's state. */
typedef enum dt_flightrec_state {
    DT_FLIGHTREC_EMPTY = 0,
    DT_FLIGHTREC_QUEUED,  /* issued: the backend accepted it (an asynchronous call, not waited) */
    DT_FLIGHTREC_STARTED, /* its caller waits on it (dt_comm_wait, or a blocking call) */
    DT_FLIGHTREC_DONE,    /* completed (t_end: when the backend finished it) */
    DT_FLIGHTREC_FAILED,  /* failed (err: the negative errno) */
} dt_flightrec_state;

/* "queued", "started", "done", "failed" ("empty" for 0, "?" otherwise). */
const char *dt_flightrec_state_name(int s);

/* The trainer's phase. */
typedef enum dt_flightrec_phase {
    DT_PHASE_NONE = 0,   /* no mark yet */
    DT_PHASE_INIT,       /* set-up: data, model, communicators, resume */
    DT_PHASE_DATA,       /* drawing and filling a batch */
    DT_PHASE_FORWARD,
    DT_PHASE_BACKWARD,
    DT_PHASE_GRAD_SYNC,  /* the gradient sync and the loss average after the micro-steps */
    DT_PHASE_OPTIM,      /* clipping and the optimiser step */
    DT_PHASE_EVAL,
    DT_PHASE_CKPT,
    DT_PHASE_END,        /* after the last step: final evaluation, save, the last barrier */
    DT_PHASE_COUNT
} dt_flightrec_phase;

/* "none", "init", "data", "forward", "backward", "gradient sync", "optimiser", "evaluation",
 * "checkpoint", "end" ("?" otherwise). */
const char *dt_flightrec_phase_name(int p);

/* One call. 72 bytes. */
typedef struct dt_flightrec_rec {
    _Atomic uint32_t ver; /* seqlock: odd while being written */
    uint8_t state;        /* dt_flightrec_state */
    uint8_t op;           /* index into op_names (the comm layer's dt_comm_op) */
    uint8_t dtype;        /* index into dtype_names */
    uint8_t group;        /* index into groups */
    uint64_t id;          /* 1, 2, ... in issue order over every group; 0 = never written */
    uint64_t seq;         /* collectives: the call's number in its group (1, 2, ...: the number
                             errors name, "allreduce #k"); point-to-point: the number of the send
                             to (or receive from) that peer in the group, which the k-th receive
                             (send) on the other side matches */
    uint64_t count;       /* elements of dtype (allgather/reduce_scatter: each rank's part) */
    int32_t peer;         /* point-to-point: the peer's global rank; broadcast/reduce: the root's
                             global rank; else -1 */
    int32_t step;         /* the trainer's step (1-based) when issued; 0 = before the first */
    uint8_t phase;        /* the trainer's phase when issued */
    uint8_t micro;        /* its micro-step (capped at 255) */
    uint16_t pad;
    int32_t err;          /* DT_FLIGHTREC_FAILED: the negative errno */
    uint64_t t_issue, t_start, t_end; /* CLOCK_MONOTONIC ns; 0 = not yet */
} dt_flightrec_rec;

/* A communicator the worker used. Written once, before any record names it, then published by
 * the release increment of hdr.ngroups. */
typedef struct dt_flightrec_group {
    char label[16];       /* "world", "data", "tensor", "pipeline", "embedding", ... */
    uint64_t uid;         /* the same on every member, different between communicators */
    int32_t size, rank;   /* the group's size, this worker's rank in it */
    int32_t nmembers;     /* members[] kept (min(size, DT_FLIGHTREC_MEMBERS); 0 for a world) */
    int32_t members[DT_FLIGHTREC_MEMBERS]; /* global rank of each group rank */
} dt_flightrec_group;

/* Where the trainer is. One writer (the trainer's thread). */
typedef struct dt_flightrec_pos {
    _Atomic uint32_t ver; /* seqlock */
    int32_t phase;        /* dt_flightrec_phase */
    int64_t step;         /* the step running (1-based), or the last one done between steps */
    int32_t micro;        /* micro-step of the step, -1 outside */
    int32_t pad;
    uint64_t phase_since; /* ns: when this phase began */
    uint64_t first_step;  /* ns: when the first step of this process began (0 = none yet) */
    uint64_t last_step_end; /* ns: when the last step finished (0 = none yet) */
    int64_t steps_done;   /* steps this process finished */
} dt_flightrec_pos;

/* One straggler window: K steps' compute and wait time. */
typedef struct dt_flightrec_window {
    _Atomic uint32_t ver; /* seqlock */
    int32_t steps;        /* steps in it (K) */
    int64_t index;        /* the window: steps index*K+1 .. (index+1)*K */
    uint64_t compute_ns;  /* its steps' wall time minus the waits */
    uint64_t wait_ns;     /* time the trainer's thread was blocked in the comm layer */
    uint64_t median_ns;   /* the median step's compute time (robust to a step the OS
                             preempted: what straggler scores compare) */
} dt_flightrec_window;

typedef struct dt_flightrec_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t capacity;        /* records in the ring */
    uint32_t hdr_bytes;       /* where the ring begins */
    uint32_t rec_bytes;       /* sizeof(dt_flightrec_rec) */
    /* the agent's, before the fork */
    int32_t rank, local_rank;
    /* the worker's, when it attaches */
    _Atomic int32_t pid;      /* 0 until a worker attached */
    int32_t world_size;
    uint64_t t_attach;        /* ns */
    char op_names[DT_FLIGHTREC_NAMES][16];
    char dtype_names[DT_FLIGHTREC_NAMES][12];
    _Atomic uint32_t ngroups;
    uint32_t pad0;
    dt_flightrec_group groups[DT_FLIGHTREC_GROUPS];
    _Atomic uint64_t next_id; /* records issued so far (the last id) */
    _Atomic uint32_t err_set; /* 1 once error[] holds the first failed call's message */
    char error[480];
    dt_flightrec_pos pos;
    _Atomic uint64_t nwindows; /* windows written so far; window w is in slot w % WINDOWS */
    dt_flightrec_window windows[DT_FLIGHTREC_WINDOWS];
    /* written by the agent (node 0's, into global rank 0's mapping), read by the worker */
    _Atomic uint32_t strag_ver; /* seqlock */
    int32_t nstragglers;
    int32_t stragglers[DT_FLIGHTREC_STRAGGLERS];
} dt_flightrec_hdr;

/* A mapping, as either side holds it. */
typedef struct dt_flightrec {
    dt_flightrec_hdr *hdr;
    dt_flightrec_rec *recs; /* capacity of them */
    size_t bytes;
    int fd;                 /* the memfd (agent), or -1 */
} dt_flightrec;

/* Bytes of a mapping of capacity records. */
size_t dt_flightrec_bytes(uint32_t capacity);

/* ---- the agent: create, then read ----------------------------------------------------------- */

/* Creates a mapping of capacity records for global rank `rank` (local_rank): a memfd, sized,
 * mapped and initialised; fr->fd is close-on-exec (the spawn clears it in the child only). */
int dt_flightrec_create(dt_flightrec *fr, uint32_t capacity, int rank, int local_rank,
                        dt_err *err);

/* Unmaps and closes. Accepts a zeroed or closed one. */
void dt_flightrec_close(dt_flightrec *fr);

/* A consistent copy of a mapping. */
typedef struct dt_flightrec_snap {
    int pid;                  /* 0: no worker ever attached */
    int rank, local_rank, world_size;
    uint64_t t_attach;
    char op_names[DT_FLIGHTREC_NAMES][16];
    char dtype_names[DT_FLIGHTREC_NAMES][12];
    int ngroups;
    dt_flightrec_group groups[DT_FLIGHTREC_GROUPS];
    dt_flightrec_pos pos;     /* ver: 0 when torn */
    bool pos_torn;
    char error[480];          /* "" when no call failed */
    int nwindows;             /* windows[] valid, oldest first */
    dt_flightrec_window windows[DT_FLIGHTREC_WINDOWS];
    uint64_t issued;          /* records ever issued */
    size_t n;                 /* records copied, in id order */
    size_t torn;              /* records left out: being written (a writer stopped mid-record) */
    dt_flightrec_rec *recs;   /* n of them (malloc'd; dt_flightrec_snap_free) */
} dt_flightrec_snap;

/* Copies fr (a few retries per torn piece); the records only when `records` (else n = 0: the
 * position and windows, cheap enough for every tick of the agent). Returns 0 or -ENOMEM /
 * -EPROTO (not a mapping of this version). */
int dt_flightrec_snapshot(const dt_flightrec *fr, dt_flightrec_snap *out, bool records,
                          dt_err *err);
void dt_flightrec_snap_free(dt_flightrec_snap *s);

/* The agent tells rank 0's worker which ranks are stragglers now (n <= STRAGGLERS). */
void dt_flightrec_set_stragglers(dt_flightrec *fr, const int *ranks, int n);

/* ---- the worker: attach, then write ------------------------------------------------------- */

/* Maps the descriptor the agent passed (its mapping's size is read from it); or, fd < 0, makes
 * an anonymous mapping of capacity records nobody else reads. Then the worker's part of the
 * header (pid, world size). */
int dt_flightrec_attach(dt_flightrec *fr, int fd, uint32_t capacity, int world_size,
                        dt_err *err);

/* Names op index i / dtype index i (at attach, before any record). */
void dt_flightrec_name_op(dt_flightrec *fr, int i, const char *name);
void dt_flightrec_name_dtype(dt_flightrec *fr, int i, const char *name);

/* Registers a group: returns its index, or -1 when the table is full (its calls are then not
 * recorded). Not thread-safe: the caller serialises registrations. */
int dt_flightrec_add_group(dt_flightrec *fr, const dt_flightrec_group *g);

/* Writes a new record (id = the next one; r->id, r->ver ignored) and returns its id. */
uint64_t dt_flightrec_issue(dt_flightrec *fr, const dt_flightrec_rec *r);

/* Updates record id's state: t_start (state STARTED), t_end and err (DONE/FAILED); times of 0
 * are left as they are. Nothing when the slot holds another record by now. */
void dt_flightrec_update(dt_flightrec *fr, uint64_t id, int state, uint64_t t, int err);

/* Keeps the first failed call's message (later ones are dropped). */
void dt_flightrec_set_error(dt_flightrec *fr, const char *msg);

/* Replaces the position with *p (its ver ignored). One writer. */
void dt_flightrec_set_pos(dt_flightrec *fr, const dt_flightrec_pos *p);

/* Appends a straggler window. */
void dt_flightrec_add_window(dt_flightrec *fr, const dt_flightrec_window *w);

/* The stragglers the agent named (up to cap); returns how many. */
int dt_flightrec_get_stragglers(const dt_flightrec *fr, int *ranks, int cap);

#endif
