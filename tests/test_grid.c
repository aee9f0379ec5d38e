/* test_grid.c - the data x tensor x pipeline grid (runtime/train/grid.h): every rank's
 * coordinates and dt_grid_rank_of for many layouts, checked against Megatron-LM's order
 * (tp fastest, then dp, then pp) computed independently here, and layouts that do not fit the
 * world, with their message. */
#include <stdio.h>
#include <string.h>

#include "runtime/job/config.h"
#include "runtime/train/grid.h"
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

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"grid_layouts", test_layouts, 0},
        {"grid_data_parallel_only", test_data_parallel_only, 0},
        {"grid_invalid_layouts", test_invalid_layouts, 0},
    };
    return dt_test_main("test_grid", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
