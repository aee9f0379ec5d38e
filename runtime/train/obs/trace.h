/* trace.h - a timeline of what each rank did, written as a Chrome trace that Perfetto opens.
 *
 * With train.trace set (off by default; see dt_job_trace_steps in runtime/job/config.h for its
 * values: off, on, N, A-B, A-) every rank records spans (forward, backward, data, gradient
 * sync and each DDP bucket's all-reduce, the optimiser step, checkpoint saves, evaluation, and
 * whatever a strategy adds: send, recv, forward of micro-batch k) for the optimiser steps in the
 * range, and at the end of the run writes
 *
 *     <output_dir>/trace/rank<N>.json   this rank's spans
 *     <output_dir>/trace/trace.json     every rank's (rank 0 merges the files it can read)
 *
 * in the Trace Event Format: "X" (complete) events with ts and dur in microseconds, pid = the
 * global rank, tid = a track, "cat" = the span's category (dt_trace_cat); "M" events name each
 * process "rank N" and each track. https://ui.perfetto.dev and chrome://tracing open both files.
 *
 * Tracks. A span recorded with dt_trace_end* goes to the track of the thread that records it
 * ("main" for the thread that opened the trace; dt_trace_thread_name names others), where
 * spans nest (a step holds its forward, which ends before the backward starts). An operation in
 * flight while the thread goes on (a bucket's all-reduce from its launch to the wait that sees
 * it done) overlaps other spans: dt_trace_end_async puts it on a named group of tracks
 * ("allreduce", "allreduce #2", ...), each span on the first lane free at its start, so no two
 * spans of one track ever overlap and every viewer draws them.
 *
 * Clock. Spans are taken on CLOCK_MONOTONIC (nanoseconds; never stepped by NTP) and written as
 * microseconds since the Unix epoch: CLOCK_MONOTONIC + (CLOCK_REALTIME - CLOCK_MONOTONIC read
 * once when the trace opens). On one host every rank's offset is the same (both clocks are
 * system-wide; NTP slews both alike), so the ranks' timelines line up exactly; across hosts they
 * line up as well as the hosts' real-time clocks agree (NTP: about a millisecond).
 *
 * Cost. Off (never opened) or outside the step range, dt_trace_begin is one load and one branch
 * and returns 0, and every dt_trace_end* given 0 returns at its first branch: nothing is
 * allocated, locked or written. While recording, a span is two clock reads and an append under
 * a mutex (any thread may record: the reducer's, a comm thread, DP's replica threads).
 *
 * Memory. At most max_events spans are kept per rank (DT_TRACE_MAX_EVENTS, about 64 bytes
 * each); the first one past the cap is warned about once, the rest are counted ("dropped" in the
 * file's otherData and in dt_trace_dropped). Narrow the step range rather than raise the cap.
 *
 * Names and argument keys are kept by pointer: pass string literals (or strings that outlive
 * the trace). The one trace is per process: dt_trace_open once, dt_trace_close at the end
 * (dt_trainer_run does both, and writes the files); code that adds spans never checks whether
 * tracing is on: it calls
 *
 *     uint64_t ts = dt_trace_begin();                       // a span on this thread's track
 *     rc = m->ops->forward(m, batch, true, &loss, err);
 *     dt_trace_end_arg(ts, DT_TRACE_FORWARD, "forward", "mb", k);
 *
 *     w->t0 = dt_trace_begin();                             // an operation in flight:
 *     dt_comm_send(c, buf, n, DT_FLOAT32, peer, &w->work, err);      // issued here ...
 *     ...
 *     dt_comm_wait(c, w->work, err);                        // ... seen done here
 *     dt_trace_end_async(w->t0, "p2p", DT_TRACE_COMM, "send", "mb", k, "bytes", n * 4);
 *
 * A span ends where the code learns it is over: a collective's "end" is the wait that returned
 * (the comm layer does not say when it finished before that), so it is an upper bound.
 */
#ifndef DT_TRACE_H
#define DT_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Spans kept per rank unless dt_trace_opts.max_events says otherwise. */
#define DT_TRACE_MAX_EVENTS 100000

/* What a span is: its "cat" in the file, and its colour in scripts/trace-png.py. */
typedef enum dt_trace_cat {
    DT_TRACE_STEP = 0,  /* one optimiser step: the parent of the spans below */
    DT_TRACE_DATA,      /* drawing and filling a batch */
    DT_TRACE_FORWARD,   /* a forward pass (of a micro-step, a micro-batch, a stage) */
    DT_TRACE_BACKWARD,  /* a backward pass */
    DT_TRACE_COMM,      /* communication: gradient sync, all-reduce, all-gather, send, recv */
    DT_TRACE_OPTIM,     /* clipping and the optimiser step */
    DT_TRACE_CKPT,      /* saving a checkpoint */
    DT_TRACE_EVAL,      /* evaluation */
    DT_TRACE_OTHER,
    DT_TRACE_NCAT
} dt_trace_cat;

/* The category's name in the file ("step", "data", "forward", "backward", "comm", "optim",
 * "ckpt", "eval", "other"). */
const char *dt_trace_cat_name(dt_trace_cat c);

typedef struct dt_trace_opts {
    const char *dir;    /* where rank<rank>.json goes (created; <output_dir>/trace) */
    int rank;           /* global rank: the pid of every event */
    int world_size;
    int64_t first_step; /* optimiser steps recorded, 1-based, inclusive (dt_trace_step) */
    int64_t last_step;  /* INT64_MAX: to the end */
    size_t max_events;  /* spans kept; 0 = DT_TRACE_MAX_EVENTS */
} dt_trace_opts;

/* Opens this process's trace (copies o). Nothing is recorded before the first dt_trace_step in
 * range. -EBUSY when one is already open, -EINVAL for a bad range, or the error of creating
 * o->dir. */
int dt_trace_open(const dt_trace_opts *o, dt_err *err);

/* True between dt_trace_open and dt_trace_close. */
bool dt_trace_enabled(void);

/* The optimiser step about to run (1-based: the step the logs call step 1): recording is on
 * from here while step is in [first_step, last_step], until the next call. What follows the step
 * (its evaluation, its checkpoint) belongs to it. Does nothing when the trace is not open. */
void dt_trace_step(int64_t step);

/* ---- recording ------------------------------------------------------------------------------ */

/* The start of a span: now (CLOCK_MONOTONIC ns), or 0 when nothing is being recorded. Pass it
 * to one of the dt_trace_end* below, which record [t0, now] (and do nothing for 0). */
uint64_t dt_trace_begin(void);

/* A span [t0, now] on the calling thread's track. */
void dt_trace_end(uint64_t t0, dt_trace_cat cat, const char *name);

/* ... with one integer argument, e.g. ("mb", 3) or ("bytes", n). */
void dt_trace_end_arg(uint64_t t0, dt_trace_cat cat, const char *name, const char *key,
                      int64_t value);

/* A span [t0, now] that may overlap others (issued, then completed while the thread went on),
 * on the lanes of the track group `track` (a literal, e.g. "allreduce"); up to two arguments
 * (key NULL: none). */
void dt_trace_end_async(uint64_t t0, const char *track, dt_trace_cat cat, const char *name,
                        const char *key, int64_t value, const char *key2, int64_t value2);
/* ... ending at t1 (>= t0, on the same clock) instead of now: an operation whose completion time
 * is known, e.g. a collective's from dt_comm_wait_done. */
void dt_trace_end_async_at(uint64_t t0, uint64_t t1, const char *track, dt_trace_cat cat,
                           const char *name, const char *key, int64_t value, const char *key2,
                           int64_t value2);

/* Any span, with both ends given (t0 from dt_trace_begin, t1 >= t0 from dt_trace_now). */
typedef struct dt_trace_span {
    uint64_t t0, t1;      /* CLOCK_MONOTONIC ns; t0 = 0: nothing is recorded */
    dt_trace_cat cat;
    const char *name;     /* a literal */
    const char *track;    /* NULL: the calling thread's track; else a group of lanes (async) */
    const char *key[2];   /* argument names (literals), NULL = none */
    int64_t value[2];
} dt_trace_span;
void dt_trace_add(const dt_trace_span *s);

/* CLOCK_MONOTONIC in ns (the clock of spans). */
uint64_t dt_trace_now(void);

/* Names the calling thread's track (copied; "main" for the thread that opened the trace,
 * "thread <k>" until named). Nothing when the trace is not open. */
void dt_trace_thread_name(const char *name);

/* Spans kept and spans dropped past the cap so far (0 when not open). */
size_t dt_trace_count(void);
size_t dt_trace_dropped(void);

/* ---- output --------------------------------------------------------------------------------- */

/* Writes <dir>/rank<rank>.json (to a temporary name, then renamed) with every span kept so far;
 * path (may be NULL) gets its path. -EINVAL when the trace is not open, or the I/O error. */
int dt_trace_write(char *path, size_t cap, dt_err *err);

/* Merges dir/rank0.json .. rank<world_size-1>.json, as dt_trace_write writes them, into out
 * (every rank a process of its own in one file). *found gets the ranks whose file was read; a
 * missing file is skipped (another host's, where dir is not shared), an unreadable or foreign
 * one is an error. -ENOENT when none was found. */
int dt_trace_merge(const char *dir, int world_size, const char *out, int *found, dt_err *err);

/* Frees the spans; recording stops. Accepts a trace never opened. */
void dt_trace_close(void);

#endif
