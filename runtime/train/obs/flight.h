/* flight.h - the trainer's side of the flight records: where the trainer is (step, micro-step,
 * phase, since when), every collective and point-to-point call of the comm layer, and each
 * step's compute and wait time, written into the mapping the agent reads
 * (runtime/job/flightrec.h); and the faults DTRAIN_FAULT injects for the tests of the hang
 * verdict.
 *
 * One per process (the trainer's): dt_flight_open installs the comm layer's observer
 * (dt_comm_set_observer, runtime/comm/comm.h), so open it before the first communicator. The
 * trainer marks its phases from a few points (worker.c: the step, data, the gradient sync, the
 * optimiser, evaluation, checkpoints; the strategies: backward, and a pipeline's forward of
 * each micro-batch); every call of the comm layer is recorded by the observer with the phase and
 * step it was issued in. A mark is a few stores and two counter increments: cheap enough for
 * every micro-batch. Before dt_flight_open (or after a failed one) every call here does nothing.
 *
 * Compute and wait (straggler scores, docs/failures.md): a step's wait is the time the
 * trainer's thread was blocked in the comm layer (dt_comm_wait, blocking calls); its compute is
 * the rest of the step's wall time. Every `straggler_window` steps the sums of that window go
 * to the mapping, where the agent picks them up.
 *
 * The trace (train.trace): each phase is a span on the "phases" track, and each wait of the
 * trainer's thread a span ("wait allreduce", with the call's seq) on its own track, so the
 * timeline shows the same phases and waits as a hang verdict.
 *
 * Faults (a test hook, used only by tests and benches): DTRAIN_FAULT=rank:R,step:S,kind:K[,...]
 *   kind:skip-collective  global rank R does not issue its first collective of step S (or, with
 *                         group:NAME, its first on that group): a data-dependent branch
 *   kind:p2p-size         rank R posts its first point-to-point receive of step S (or later)
 *                         for half its count: sender and receiver disagree on the size
 *   kind:stall-data       rank R sleeps in its data phase of step S for secs:N seconds (default
 *                         3600; a signal ends the sleep)
 * A malformed value is an error of dt_flight_open (the worker does not start).
 */
#ifndef DT_TRAIN_FLIGHT_H
#define DT_TRAIN_FLIGHT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/job/flightrec.h"

typedef struct dt_flight_opts {
    int rank, world_size;
    int fd;               /* the agent's mapping (DTRAIN_FLIGHT_FD), or -1: an anonymous one */
    uint32_t records;     /* ring size when the worker makes its own (train.flight_records) */
    int straggler_window; /* steps per compute/wait window (train.straggler_window); 0 = none */
    double straggler_ratio; /* train.straggler_ratio (its agent scores when >= 1) */
} dt_flight_opts;

/* Maps the records, installs the comm observer and reads DTRAIN_FAULT. The phase is "init". */
int dt_flight_open(const dt_flight_opts *o, dt_err *err);

/* Removes the observer and unmaps (tests; a worker keeps it to its exit). */
void dt_flight_close(void);

/* The phase, from now. */
void dt_flight_phase(dt_flightrec_phase p);

/* Step `step` (1-based) begins, in the data phase. */
void dt_flight_step_begin(int64_t step);

/* Micro-step `micro` of the step begins, in the data phase. */
void dt_flight_micro(int micro);

/* The step ends: its compute and wait time are added to the window. */
void dt_flight_step_end(void);

/* Whether an agent reads these records (the worker got DTRAIN_FLIGHT_FD). */
bool dt_flight_has_agent(void);

/* Whether the agents score stragglers for this job: an agent reads the records, the world has
 * more than one rank and train.straggler_ratio is at least 1 (metrics.jsonl then has a
 * "stragglers" field). */
bool dt_flight_scoring(void);

/* The ranks the agent says are stragglers now (node 0's agent writes them into rank 0's
 * mapping); returns how many (up to cap). */
int dt_flight_stragglers(int *ranks, int cap);

#endif
