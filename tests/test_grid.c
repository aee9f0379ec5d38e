/* test_grid.c - the data x tensor x pipeline grid (runtime/train/parallel/grid.h): every rank's
 * coordinates and dt_grid_rank_of for many layouts, checked against Megatron-LM's order
 * (tp fastest, then dp, then pp) computed independently here, and layouts that do not fit the
 * world, with their message. Then the groups (dt_groups_open) on 1, 4 and 8 forked ranks over
 * the cpu backend and a real store on an ephemeral port: every group's members, in order
 * (dt_comm_global_rank), against the grid, and an all-reduce of the global ranks over each
 * group, which must give their sum. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/grid.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* Every rank of world W with T, P: coordinates in range, rank_of the inverse, the order of
 * Megatron-LM's default (built here by enumeration, not by the formula under test), and the
 * groups' shapes: a tensor group is T consecutive ranks; every (tp, pp) has D data-parallel
 * ranks; every (dp, tp) has P stages. */
static void check_layout(int W, int T, int P)
{
    int D = W / (T * P);
    /* enumeration: pp outermost, then dp, then tp */
    int expect_dp[512], expect_tp[512], expect_pp[512], r = 0;
    DT_REQUIRE(W <= 512);
    for (int pp = 0; pp < P; pp++)
        for (int dp = 0; dp < D; dp++)
            for (int tp = 0; tp < T; tp++, r++) {
                expect_dp[r] = dp;
                expect_tp[r] = tp;
                expect_pp[r] = pp;
            }
    DT_REQUIRE(r == W);
    int seen[512];
    memset(seen, 0, sizeof seen);
    for (int rank = 0; rank < W; rank++) {
        dt_grid g;
        dt_err err = {0};
        DT_REQUIRE_OK(dt_grid_init(&g, rank, W, T, P, &err), &err);
        DT_CHECK_INT(g.rank, rank);
        DT_CHECK_INT(g.world, W);
        DT_CHECK_INT(g.D, D);
        DT_CHECK_INT(g.T, T);
        DT_CHECK_INT(g.P, P);
        DT_CHECK_INT(g.D * g.T * g.P, W);
        DT_CHECK_MSG(g.dp == expect_dp[rank] && g.tp == expect_tp[rank] &&
                         g.pp == expect_pp[rank],
                     "W=%d T=%d P=%d rank %d: (dp %d, tp %d, pp %d), expected (%d, %d, %d)", W, T,
                     P, rank, g.dp, g.tp, g.pp, expect_dp[rank], expect_tp[rank],
                     expect_pp[rank]);
        DT_CHECK_INT(dt_grid_rank_of(&g, g.dp, g.tp, g.pp), rank);
        /* a tensor group is T consecutive ranks starting at a multiple of T */
        DT_CHECK_INT(dt_grid_rank_of(&g, g.dp, 0, g.pp), rank - rank % T);
        /* the coordinates other ranks have, seen from this one */
        for (int k = 0; k < W; k++)
            DT_CHECK_INT(dt_grid_rank_of(&g, expect_dp[k], expect_tp[k], expect_pp[k]), k);
        /* out of range */
        DT_CHECK_INT(dt_grid_rank_of(&g, D, 0, 0), -1);
        DT_CHECK_INT(dt_grid_rank_of(&g, 0, T, 0), -1);
        DT_CHECK_INT(dt_grid_rank_of(&g, 0, 0, P), -1);
        DT_CHECK_INT(dt_grid_rank_of(&g, -1, 0, 0), -1);
        seen[dt_grid_rank_of(&g, g.dp, g.tp, g.pp)]++;
    }
    for (int k = 0; k < W; k++)
        DT_CHECK_INT(seen[k], 1);
}

static void test_layouts(void)
{
    /* Megatron-LM's documented example: 16 ranks, T = 2, P = 4 -> D = 2; tensor groups
     * [0,1] [2,3] ..., pipeline groups [0,4,8,12] [1,5,9,13] ..., data groups [0,2] [1,3] ... */
    dt_grid g;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_grid_init(&g, 13, 16, 2, 4, &err), &err);
    DT_CHECK(g.D == 2 && g.dp == 0 && g.tp == 1 && g.pp == 3);
    DT_CHECK_INT(dt_grid_rank_of(&g, 0, 1, 0), 1);
    DT_CHECK_INT(dt_grid_rank_of(&g, 0, 1, 1), 5);
    DT_CHECK_INT(dt_grid_rank_of(&g, 0, 1, 2), 9);
    DT_CHECK_INT(dt_grid_rank_of(&g, 1, 1, 3), 15);
    DT_CHECK_INT(dt_grid_rank_of(&g, 1, 0, 0), 2);
    /* 8 ranks, T = 2, P = 2: rank 6 is (dp 1, tp 0, pp 1) */
    DT_REQUIRE_OK(dt_grid_init(&g, 6, 8, 2, 2, &err), &err);
    DT_CHECK(g.D == 2 && g.dp == 1 && g.tp == 0 && g.pp == 1);
    static const int layouts[][3] = {
        {1, 1, 1},  {2, 1, 1},  {2, 2, 1},  {2, 1, 2},  {4, 2, 2},  {4, 4, 1},  {4, 1, 4},
        {6, 2, 1},  {6, 3, 1},  {6, 1, 3},  {6, 2, 3},  {8, 2, 2},  {8, 2, 4},  {8, 8, 1},
        {12, 2, 3}, {12, 3, 2}, {16, 2, 4}, {24, 4, 3}, {32, 4, 2}, {64, 8, 4}, {60, 5, 3},
        {7, 7, 1},  {7, 1, 7},  {36, 3, 3}, {512, 8, 8},
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        check_layout(layouts[i][0], layouts[i][1], layouts[i][2]);
}

/* T = P = 1 is plain data parallelism: dp = rank, D = world (what keeps DDP bit-identical). */
static void test_data_parallel_only(void)
{
    for (int W = 1; W <= 9; W++)
        for (int rank = 0; rank < W; rank++) {
            dt_grid g;
            dt_err err = {0};
            DT_REQUIRE_OK(dt_grid_init(&g, rank, W, 1, 1, &err), &err);
            DT_CHECK(g.dp == rank && g.D == W && g.tp == 0 && g.pp == 0 && g.T == 1 && g.P == 1);
        }
}

static void test_invalid_layouts(void)
{
    dt_grid g;
    memset(&g, 0x5a, sizeof g);
    dt_grid before = g;
    dt_err err = {0};
    /* T x P does not divide the world: the message names both keys and the valid sizes */
    DT_CHECK_INT(dt_grid_init(&g, 0, 6, 2, 2, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "world size 6 is not divisible by parallel.tensor x "
                               "parallel.pipeline = 2 x 2 = 4");
    DT_CHECK_CONTAINS(err.msg, "run a multiple of 4 ranks (4, 8, 12, ...)");
    DT_CHECK(memcmp(&g, &before, sizeof g) == 0); /* untouched on failure */
    DT_CHECK_INT(dt_grid_init(&g, 0, 3, 2, 1, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "world size 3 is not divisible by parallel.tensor x "
                               "parallel.pipeline = 2 x 1 = 2");
    DT_CHECK_CONTAINS(err.msg, "(2, 4, 6, ...)");
    DT_CHECK_INT(dt_grid_init(&g, 0, 4, 1, 8, &err), -EINVAL); /* more stages than ranks */
    DT_CHECK_CONTAINS(err.msg, "multiple of 8 ranks (8, 16, 24, ...)");
    /* degrees and ranks out of range */
    DT_CHECK_INT(dt_grid_init(&g, 0, 4, 0, 1, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "parallel.tensor = 0");
    DT_CHECK_INT(dt_grid_init(&g, 0, 4, 1, -1, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "parallel.pipeline = -1");
    DT_CHECK_INT(dt_grid_init(&g, 4, 4, 2, 1, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "rank 4 is outside the world of 4 ranks");
    DT_CHECK_INT(dt_grid_init(&g, -1, 4, 2, 1, &err), -EINVAL);
    DT_CHECK_INT(dt_grid_init(&g, 0, 0, 1, 1, &err), -EINVAL);
    DT_CHECK(memcmp(&g, &before, sizeof g) == 0);
    /* the launcher's and the agent's check is the same function, the same words */
    dt_err e2 = {0};
    DT_CHECK_INT(dt_parallel_check_world(6, 2, 2, &e2), -EINVAL);
    DT_CHECK_INT(dt_grid_init(&g, 0, 6, 2, 2, &err), -EINVAL);
    DT_CHECK_STR(e2.msg, err.msg);
    DT_CHECK_INT(dt_parallel_check_world(8, 2, 2, &e2), 0);
}

/* ---- the groups, on forked ranks ------------------------------------------------------------- */

typedef struct layout {
    int W, T, P;
} layout;

/* One group of this rank against the members it must have, in order (members[0..n)), and an
 * all-reduce of the global ranks over it, which must give their sum. */
static void check_group(dt_comm *c, const char *what, const int *members, int n, int me,
                        const dt_grid *g)
{
    if (n == 1) {
        RCHECK(c == NULL, "rank %d: the %s group of one must be NULL", g->rank, what);
        return;
    }
    RCHECK(c != NULL, "rank %d (W %d T %d P %d): no %s group (expected %d ranks)", g->rank,
           g->world, g->T, g->P, what, n);
    if (!c)
        return;
    RCHECK(dt_comm_world_size(c) == n, "rank %d: %s group of %d ranks, expected %d", g->rank,
           what, dt_comm_world_size(c), n);
    RCHECK(dt_comm_rank(c) == me, "rank %d: rank %d in its %s group, expected %d", g->rank,
           dt_comm_rank(c), what, me);
    int sum = 0;
    for (int k = 0; k < n && k < dt_comm_world_size(c); k++) {
        RCHECK(dt_comm_global_rank(c, k) == members[k],
               "rank %d: member %d of the %s group is global rank %d, expected %d", g->rank, k,
               what, dt_comm_global_rank(c, k), members[k]);
        sum += members[k];
    }
    float v[2] = {(float)g->rank, 1.0f};
    dt_err err = {0};
    int rc = dt_comm_allreduce(c, v, 2, DT_FLOAT32, DT_SUM, NULL, &err);
    RCHECK(rc == 0, "rank %d: all-reduce over the %s group: %s", g->rank, what, err.msg);
    RCHECK(v[0] == (float)sum && v[1] == (float)n,
           "rank %d: all-reduce of the global ranks over the %s group gave %g over %g ranks, "
           "expected %d over %d", g->rank, what, (double)v[0], (double)v[1], sum, n);
}

static void groups_rank(dt_test_rank *x, void *arg)
{
    const layout *L = arg;
    const int rank = x->rank;
    dt_err err = {0};
    dt_store *store = x->store;
    dt_comm *world = x->c;
    dt_groups gs;
    dt_grid g;
    if (dt_grid_init(&g, rank, L->W, L->T, L->P, &err) != 0 ||
        dt_groups_open(&gs, world, store, &g, &err) != 0) {
        fprintf(stderr, "    rank %d: groups: %s\n", rank, err.msg);
        _exit(4);
    }
    RCHECK(gs.world == world && gs.grid.rank == rank && gs.grid.D == g.D, "rank %d: groups",
           rank);
    int m[512];
    for (int k = 0; k < g.T; k++)
        m[k] = dt_grid_rank_of(&g, g.dp, k, g.pp);
    check_group(gs.tp, "tensor", m, g.T, g.tp, &g);
    for (int k = 0; k < g.D; k++)
        m[k] = dt_grid_rank_of(&g, k, g.tp, g.pp);
    check_group(gs.dp, "data", m, g.D, g.dp, &g);
    /* with T = P = 1 the data group is the world, borrowed */
    if (g.T * g.P == 1 && g.D > 1)
        RCHECK(gs.dp == world, "rank %d: T = P = 1, but the data group is not the world", rank);
    for (int k = 0; k < g.P; k++)
        m[k] = dt_grid_rank_of(&g, g.dp, g.tp, k);
    check_group(gs.pp, "pipeline", m, g.P, g.pp, &g);
    bool ends = g.P > 1 && (g.pp == 0 || g.pp == g.P - 1);
    if (ends) {
        m[0] = dt_grid_rank_of(&g, g.dp, g.tp, 0);
        m[1] = dt_grid_rank_of(&g, g.dp, g.tp, g.P - 1);
        check_group(gs.embed, "embedding", m, 2, g.pp == 0 ? 0 : 1, &g);
    } else {
        RCHECK(gs.embed == NULL, "rank %d (pp %d of %d): an embedding group off the first and "
               "the last stage", rank, g.pp, g.P);
    }
    /* the world still works after the splits, and the groups close without touching it */
    float one = 1.0f;
    RCHECK(dt_comm_allreduce(world, &one, 1, DT_FLOAT32, DT_SUM, NULL, &err) == 0 &&
               one == (float)L->W,
           "rank %d: world all-reduce after the splits: %s", rank, err.msg);
    dt_groups_close(&gs);
    RCHECK(gs.tp == NULL && gs.pp == NULL && gs.embed == NULL, "rank %d: close", rank);
    dt_groups_close(&gs); /* twice: a closed struct */
}

/* Runs groups_rank on W forked ranks against a fresh store; every rank must exit 0. */
static void run_groups(int W, int T, int P)
{
    static int counter;
    layout L = {.W = W, .T = T, .P = P};
    dt_test_world w = {.n = W, .timeout_ms = 30000};
    snprintf(w.run_id, sizeof w.run_id, "grid-%d-%d", (int)getpid(), ++counter);
    int status[DT_TEST_MAX_RANKS];
    dt_test_world_run(&w, groups_rank, &L, 90 * dt_test_timeout_scale(), status);
    for (int r = 0; r < W; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "W %d T %d P %d: rank %d ended with status %d", W, T, P, r, status[r]);
}

static void test_groups_4(void)
{
    static const int layouts[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        run_groups(4, layouts[i][0], layouts[i][1]);
}

static void test_groups_8(void)
{
    static const int layouts[][2] = {{2, 2}, {2, 4}, {4, 2}, {2, 1}, {1, 2}, {1, 1}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        run_groups(8, layouts[i][0], layouts[i][1]);
}

/* One rank: no group at all (the data group of one is NULL too). */
static void test_groups_1(void)
{
    run_groups(1, 1, 1);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"grid_layouts", test_layouts, 0},
        {"grid_data_parallel_only", test_data_parallel_only, 0},
        {"grid_invalid_layouts", test_invalid_layouts, 0},
        {"groups_1", test_groups_1, 60},
        {"groups_4", test_groups_4, 180},
        {"groups_8", test_groups_8, 300},
    };
    return dt_test_main("test_grid", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
