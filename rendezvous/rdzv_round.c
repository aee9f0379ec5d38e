/* rdzv_round.c - see rdzv_round.h: the round logic the elastic backends share. */
#include "rendezvous/rdzv_round.h"

#include <stdio.h>
#include <string.h>

#include "common/util.h"

void dt_rdzv_round_end_status(dt_rdzv_state state, int node, int sig, const char *why,
                              dt_rdzv_status *st)
{
    memset(st, 0, sizeof *st);
    st->state = state;
    st->node = node;
    st->signal = sig > 0 ? sig : 0;
    st->setup_error = state == DT_RDZV_ABORTED && sig < 0;
    dt_strlcpy(st->why, why, sizeof st->why);
}

bool dt_rdzv_round_ends_job(const dt_rdzv_status *end, int attempt, int max_restarts)
{
    return end->state == DT_RDZV_SUCCEEDED || end->state == DT_RDZV_ABORTED ||
           (end->state == DT_RDZV_FAILED && attempt >= max_restarts);
}

void dt_rdzv_round_final_status(int code, const char *kind, int node, int sig, const char *why,
                                dt_rdzv_status *st)
{
    memset(st, 0, sizeof *st);
    st->state = code == 0                ? DT_RDZV_SUCCEEDED
                : !strcmp(kind, "fail") ? DT_RDZV_FAILED
                                         : DT_RDZV_ABORTED;
    st->node = node;
    st->signal = sig > 0 ? sig : 0;
    st->setup_error = !strcmp(kind, "config");
    dt_strlcpy(st->why, why, sizeof st->why);
}

void dt_rdzv_round_declared_lost(dt_rdzv_status *ended, const char *end_why)
{
    snprintf(ended->why, sizeof ended->why,
             "this node was declared lost by the others (%.150s); it rejoins the job as a new "
             "node",
             end_why);
}

void dt_rdzv_round_failure_why(const dt_rdzv_failure *f, int n, int g, char *why, size_t cap)
{
    if (n > 0 && f[0].rank >= 0)
        snprintf(why, cap, "rank %d on node %d (%s) failed", f[0].rank, f[0].node, f[0].host);
    else if (n > 0)
        snprintf(why, cap, "node %d (%s) was lost", f[0].node, f[0].host);
    else
        snprintf(why, cap, "node %d failed", g);
}

void dt_rdzv_round_failed_here(dt_rdzv_status *ended, int g, const char *why)
{
    if (ended->state != DT_RDZV_RUNNING)
        return;
    ended->state = DT_RDZV_FAILED;
    ended->node = g;
    dt_strlcpy(ended->why, why, sizeof ended->why);
}

void dt_rdzv_round_abort_here(dt_rdzv_status *ended, int node, int sig, const char *why)
{
    if (ended->state == DT_RDZV_RUNNING || ended->state == DT_RDZV_FAILED ||
        ended->state == DT_RDZV_REGROUP)
        dt_rdzv_round_end_status(DT_RDZV_ABORTED, node, sig, why, ended);
}
