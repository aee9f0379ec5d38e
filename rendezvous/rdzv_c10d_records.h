/* rdzv_c10d_records.h - the records the c10d backend keeps in the store, as text and decoded
 * (rdzv_c10d_records.c): a round's end ("r<R>/end"), the job's final state ("final") and a
 * round's "closed" record. The round logic (rdzv_c10d.c) and the heartbeat thread that declares
 * nodes lost (rdzv_c10d_hb.c) both write and read them. Decoding is strict: a damaged record is
 * an error that says what it holds, never a guess.
 */
#ifndef DT_RDZV_C10D_RECORDS_H
#define DT_RDZV_C10D_RECORDS_H

#include <stdbool.h>

#include "common/err.h"
#include "rendezvous/rdzv_ranks.h"
#include "rendezvous/rdzv_types.h"

/* How a round ended (the <kind> of its end record). */
typedef enum dt_rdzv_c10d_end_kind {
    DT_C10D_END_NONE = 0,
    DT_C10D_END_SUCCESS,
    DT_C10D_END_FAIL,
    DT_C10D_END_REGROUP,
    DT_C10D_END_ABORT,
} dt_rdzv_c10d_end_kind;

/* A round's end, decoded. */
typedef struct dt_rdzv_c10d_end {
    dt_rdzv_c10d_end_kind kind;
    int node;      /* group rank that ended it (-1: a node outside the round) */
    int sig;       /* abort: the signal */
    int expect;    /* nodes of the round that go on to the next (-1 unknown) */
    dt_rdzv_ranks lost; /* group ranks declared lost (regroup; owned: dt_rdzv_c10d_end_free) */
    char why[256];
} dt_rdzv_c10d_end;

/* A round's "closed" record, decoded. */
typedef struct dt_rdzv_c10d_closed {
    bool cancelled; /* {"final":1}: the round never formed */
    int n, attempt, world, master_port;
    char tag[64];
    char master_addr[DT_RDZV_STR];
} dt_rdzv_c10d_closed;

/* "<kind> <node> <sig> <expect> <lost>|<why>"; lost: the group ranks declared lost, "-" or
 * "3-40,57" (dt_rdzv_ranks_encode: every one, however many). Returns a malloc'd record, or NULL
 * when out of memory. */
char *dt_rdzv_c10d_end_encode(dt_rdzv_c10d_end_kind kind, int node, int sig, int expect,
                              const int *lost, int nl, const char *why);

/* Decodes an end record (strictly: a damaged one is -EBADMSG with err saying what). e needs
 * dt_rdzv_c10d_end_free, also after a failure. */
int dt_rdzv_c10d_end_decode(const char *v, dt_rdzv_c10d_end *e, dt_err *err);

/* Frees what a decoded end record owns (its lost set). */
void dt_rdzv_c10d_end_free(dt_rdzv_c10d_end *e);

/* The round state an end record means (SUCCEEDED, FAILED, ABORTED, REGROUP). */
void dt_rdzv_c10d_end_status(const dt_rdzv_c10d_end *e, dt_rdzv_status *st);

/* final: "<code> <kind> <node> <sig>|<why>" -> a status: SUCCEEDED (code 0), ABORTED (by a
 * signal, a rendezvous that could not form, or a configuration error: setup_error), FAILED (the
 * budget is spent). */
void dt_rdzv_c10d_final_status(const char *v, dt_rdzv_status *st);

/* Decodes a round's "closed" record (JSON). -EBADMSG when it is damaged. */
int dt_rdzv_c10d_closed_decode(const char *v, dt_rdzv_c10d_closed *ci);

#endif
