/* pp_schedule.h - pipeline schedules as data: for stage s of P and M micro-batches, the ordered
 * list of what that stage does in one step (forward of micro-batch k, backward of k, and the
 * sends and receives of activations and their gradients between adjacent stages), for GPipe and
 * 1F1B (PipeDream-Flush, Megatron-LM's default). (Which blocks each stage holds is the job's:
 * dt_job_stage_blocks in runtime/job/config.h.)
 *
 * Pure functions, no communication: strategy_pipeline.c executes a list, tests check its
 * counts, order and memory bound, and dt_pp_simulate replays every stage's list with unit-time
 * operations to measure the bubble that (P-1)/(M+P-1) predicts.
 *
 * The lists follow Megatron-LM's batched point-to-point order (forward_backward_pipelining_
 * without_interleaving with batch_p2p_comm): consecutive communication actions of a list form
 * one batch (dt_comm_p2p: its sends and receives progress together; dt_pp_batch_end: at most
 * one receive a batch), and every batch of stage s
 * is matched by the batches of s-1 and s+1 in an order that cannot deadlock even when a
 * backend runs each rank's batches one after the other (NCCL's stream, a comm thread):
 *
 *   GPipe: for k < M: RECV_ACT k, FWD k, SEND_ACT k;  for k < M: RECV_GRAD k, BWD k, SEND_GRAD k
 *          every stage holds the activations of all M micro-batches before the first backward.
 *   1F1B:  W = min(P-s-1, M) warm-up forwards (RECV_ACT, FWD, SEND_ACT), then R = M-W steady
 *          rounds FWD k | SEND_ACT k + RECV_GRAD j | BWD j | SEND_GRAD j + RECV_ACT k+1 (with
 *          k = W+i, j = i; the receive for the first steady forward is posted after the
 *          warm-up), then W cool-down backwards (RECV_GRAD, BWD, SEND_GRAD): stage s holds at
 *          most min(P-s, M) micro-batches' activations.
 * Stage 0 has no RECV_ACT/SEND_GRAD, the last stage no SEND_ACT/RECV_GRAD.
 * dt_pp_post_early then moves receives one compute earlier (what strategy_pipeline.c posts);
 * dt_pp_simulate replays the lists as built (communication is free there, so it is the same).
 *
 * What it may include: common/. Used by strategy_pipeline.c, cmd/bench/bench_pipeline.c, tests.
 */
#ifndef DT_PP_SCHEDULE_H
#define DT_PP_SCHEDULE_H

#include <stdbool.h>

#include "common/err.h"
#include "runtime/job/config.h" /* dt_pp_schedule_kind */

typedef enum dt_pp_op {
    DT_PP_FWD = 0,       /* forward of micro-batch mb (its loss on the last stage) */
    DT_PP_BWD = 1,       /* backward of mb */
    DT_PP_SEND_ACT = 2,  /* mb's output activation to stage s+1 */
    DT_PP_RECV_ACT = 3,  /* mb's input activation from stage s-1 */
    DT_PP_SEND_GRAD = 4, /* mb's input gradient to stage s-1 */
    DT_PP_RECV_GRAD = 5, /* mb's output gradient from stage s+1 */
} dt_pp_op;

typedef struct dt_pp_action {
    dt_pp_op op;
    int mb; /* micro-batch, 0..M-1 */
} dt_pp_action;

/* Whether op is a send or a receive (a part of a p2p batch) rather than compute. */
static inline bool dt_pp_op_is_comm(dt_pp_op op) { return op >= DT_PP_SEND_ACT; }

/* The p2p batch that starts at communication action list[first]: it holds [first, end), and end
 * is returned. Consecutive communication actions form one batch, except that a receive never
 * joins a batch that already holds one: each input (an activation, a gradient) comes in a batch
 * of its own or with the sends just before it, so waiting for micro-batch k's input never waits
 * for k+1's too (dt_pp_post_early puts the two side by side). The strategy posts by it and the
 * tests' replay proves the order deadlock-free by it. */
int dt_pp_batch_end(const dt_pp_action *list, int n, int first);

/* "FWD", "BWD", "SEND_ACT", ... (static). */
const char *dt_pp_op_name(dt_pp_op op);

/* Upper bound of a stage's list length for M micro-batches (6 M). */
int dt_pp_schedule_cap(int M);

/* Fills out[0..*n) (cap entries, at least dt_pp_schedule_cap(M)) with stage's list. -EINVAL
 * with a message for P < 1, M < 1, stage outside [0, P), or too small a cap. */
int dt_pp_schedule_build(dt_pp_schedule_kind kind, int P, int M, int stage, dt_pp_action *out,
                         int cap, int *n, dt_err *err);

/* The most micro-batches whose forward has run and whose backward has not, over the list: the
 * activation slots the stage needs (1F1B: min(P - stage, M); GPipe: M). */
int dt_pp_max_in_flight(const dt_pp_action *list, int n);

/* What compute action list[i] (FWD or BWD) must wait for, as the index of the last send or
 * receive before it in the list that has to be complete (-1: none), for an executor that posts
 * each p2p batch without waiting and keeps slots activation slots (micro-batch k in slot
 * k % slots) and two input-gradient buffers (micro-batch j's in buffer j % 2):
 *   FWD k: the receive of k's input; a send of micro-batch k' != k from the same slot (the
 *          forward overwrites the slot's output);
 *   BWD j: the receive of j's output gradient; a send of the input gradient of j' != j with
 *          j' % 2 == j % 2 (the backward overwrites that buffer).
 * Everything posted before that action is then waited for too (batches complete in order).
 * Sends the compute does not touch stay in flight: stage 0's forwards and the last stage's
 * backwards of GPipe run back to back. */
int dt_pp_wait_before(const dt_pp_action *list, int i, int slots);

/* Reorders list[0..n) (a stage's list from dt_pp_schedule_build, or its forward half) in
 * place so that each receive is posted one compute earlier: the input activation of
 * micro-batch k >= 1 just before the forward of k-1 and the output gradient of
 * j >= 1 just before the backward of j-1 where no forward lies between the two (GPipe's
 * backwards, 1F1B's cool-down). Sends, computes and the order of each kind of receive stay as
 * they were, so p2p matching is unchanged; a receive joins the batch of sends before the
 * compute it now precedes. Why this and no more cannot deadlock: see pp_schedule.c. */
void dt_pp_post_early(dt_pp_action *list, int n);

/* The most input activations received or being received whose backward has not run, over the
 * list: the receive buffers a stage > 0 needs (the model borrows its input until the
 * backward). With dt_pp_post_early one more than dt_pp_max_in_flight (at most M). */
int dt_pp_recv_buffers(const dt_pp_action *list, int n);

/* Replays every stage's list of kind with forward time tf and backward time tb per micro-batch
 * (communication free and instant; a FWD of stage s > 0 waits for the same micro-batch's FWD on
 * s-1, a BWD of s < P-1 for its BWD on s+1). *makespan = when the last stage finishes; idle[s]
 * (P entries, may be NULL) = the fraction of the makespan stage s computes nothing. -EINVAL as
 * dt_pp_schedule_build, -EDEADLK when the lists cannot all run to the end (a broken schedule). */
int dt_pp_simulate(dt_pp_schedule_kind kind, int P, int M, double tf, double tb,
                   double *makespan, double *idle, dt_err *err);

/* The same with each stage's own times: tf[s], tb[s] (P entries) per micro-batch on stage s,
 * e.g. measured ones, so that stages of unequal cost show the bubble they make. */
int dt_pp_simulate_stages(dt_pp_schedule_kind kind, int P, int M, const double *tf,
                          const double *tb, double *makespan, double *idle, dt_err *err);

/* The bubble the formula predicts: (P-1)/(M+P-1). */
double dt_pp_bubble_formula(int P, int M);

#endif
