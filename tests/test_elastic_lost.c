/* test_elastic_lost.c - the set of lost nodes in a c10d round's end record (dt_rdzv_ranks_*):
 * any number of ranks survives the round trip (0, 1, 33, 1,000, 100,000, scattered and in
 * ranges, in any order, with repeats), the encoding is compact and readable ("1-35,38"), and
 * every malformed list is an error with a message, never a crash or a shorter set. The
 * rendezvous itself with 35 of 40 nodes lost at once is test_elastic's api_many_lost_at_once. */
#include <errno.h>
#include <limits.h>

#include "common/rng.h"
#include "common/util.h"
#include "rendezvous/rdzv_ranks.h"
#include "tests/harness.h"

/* Encodes ranks, decodes the result, and checks the set is exactly the distinct ranks. */
static char *round_trip(const int *ranks, int n, int universe)
{
    char *s = dt_rdzv_ranks_encode(ranks, n);
    DT_REQUIRE(s != NULL);
    dt_rdzv_ranks set;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_ranks_decode(s, strlen(s), &set, &e), &e);
    bool *in = calloc((size_t)universe, 1);
    DT_REQUIRE(in != NULL);
    long long distinct = 0;
    for (int i = 0; i < n; i++) {
        DT_REQUIRE(ranks[i] >= 0 && ranks[i] < universe);
        if (!in[ranks[i]])
            distinct++;
        in[ranks[i]] = true;
    }
    DT_CHECK_INT(set.count, distinct);
    int wrong = 0;
    for (int g = 0; g < universe; g++)
        wrong += dt_rdzv_ranks_has(&set, g) != in[g];
    DT_CHECK_INT(wrong, 0);
    DT_CHECK(!dt_rdzv_ranks_has(&set, -1));
    DT_CHECK(!dt_rdzv_ranks_has(&set, universe));
    for (int i = 1; i < set.n; i++) /* canonical: ascending, and adjacent ranks merged */
        DT_CHECK(set.r[i][0] > set.r[i - 1][1] + 1);
    dt_rdzv_ranks_free(&set);
    free(in);
    return s;
}

static void test_round_trip_sizes(void)
{
    char *s = round_trip(NULL, 0, 4);
    DT_CHECK_STR(s, "-");
    free(s);
    int one[] = {7};
    s = round_trip(one, 1, 10);
    DT_CHECK_STR(s, "7");
    free(s);
    int zero[] = {0};
    s = round_trip(zero, 1, 1);
    DT_CHECK_STR(s, "0");
    free(s);
    /* 33 (one more than the old limit): a rack, 1..33, listed in the order found */
    int rack[33];
    for (int i = 0; i < 33; i++)
        rack[i] = 33 - i;
    s = round_trip(rack, 33, 64);
    DT_CHECK_STR(s, "1-33");
    free(s);
    /* 33 scattered (every other rank): no range to merge */
    int odd[33];
    for (int i = 0; i < 33; i++)
        odd[i] = 2 * i + 1;
    s = round_trip(odd, 33, 80);
    DT_CHECK(strncmp(s, "1,3,5,", 6) == 0);
    DT_CHECK(strlen(s) > 32 * 2);
    free(s);
    /* 1,000 from 4,096, random order, with repeats, mixed runs and single ranks */
    dt_rng rng;
    dt_rng_seed(&rng, 1234);
    int many[1000];
    for (int i = 0; i < 1000; i++)
        many[i] = i < 400 ? 1000 + i : (int)(dt_rng_u64(&rng) % 4096);
    for (int i = 999; i > 0; i--) {
        int j = (int)(dt_rng_u64(&rng) % (uint64_t)(i + 1)), t = many[i];
        many[i] = many[j];
        many[j] = t;
    }
    s = round_trip(many, 1000, 4096);
    DT_CHECK(strstr(s, "1000-1399") != NULL || strstr(s, "-1399") != NULL);
    free(s);
    /* 100,000 consecutive: one range */
    int *big = malloc(sizeof *big * 100000);
    DT_REQUIRE(big != NULL);
    for (int i = 0; i < 100000; i++)
        big[i] = i + 5;
    s = round_trip(big, 100000, 100010);
    DT_CHECK_STR(s, "5-100004");
    free(s);
    free(big);
    /* the largest rank there is */
    int top[] = {INT_MAX, INT_MAX - 1, 0};
    s = dt_rdzv_ranks_encode(top, 3);
    DT_CHECK_STR(s, "0,2147483646-2147483647");
    dt_rdzv_ranks set;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_ranks_decode(s, strlen(s), &set, &e), &e);
    DT_CHECK_INT(set.count, 3);
    DT_CHECK(dt_rdzv_ranks_has(&set, INT_MAX) && !dt_rdzv_ranks_has(&set, INT_MAX - 2));
    dt_rdzv_ranks_free(&set);
    free(s);
    /* a negative rank is refused, not written */
    int neg[] = {3, -1};
    DT_CHECK(dt_rdzv_ranks_encode(neg, 2) == NULL);
}

static void test_decode_accepts(void)
{
    static const struct {
        const char *s;
        long long count;
    } ok[] = {{"-", 0}, {"0", 1}, {"3-40,57", 39}, {"1,2,3", 3}, {"5-5", 1}, {"0-2147483647", 2147483648LL}};
    for (size_t i = 0; i < DT_ARRAY_LEN(ok); i++) {
        dt_rdzv_ranks set;
        dt_err e = {0};
        int rc = dt_rdzv_ranks_decode(ok[i].s, strlen(ok[i].s), &set, &e);
        DT_CHECK_MSG(rc == 0, "\"%s\": %s", ok[i].s, e.msg);
        DT_CHECK_INT(set.count, ok[i].count);
        dt_rdzv_ranks_free(&set);
    }
    /* decodes exactly len bytes: what follows (the end record's "|why") is not read */
    dt_rdzv_ranks set;
    dt_err e = {0};
    const char *rec = "3-4,9|node 3 was lost";
    DT_REQUIRE_OK(dt_rdzv_ranks_decode(rec, 5, &set, &e), &e);
    DT_CHECK_INT(set.count, 3);
    DT_CHECK(dt_rdzv_ranks_has(&set, 9) && !dt_rdzv_ranks_has(&set, 5));
    dt_rdzv_ranks_free(&set);
    dt_rdzv_ranks_free(NULL);
}

static void test_decode_malformed(void)
{
    static const char *bad[] = {
        "",          "--",        "-1",        "1-",        "-5",       ",",        "1,",
        ",1",        "1,,2",      "1 2",       " 1",        "1 ",       "+1",       "0x10",
        "a",         "1a",        "3-1",       "1,1",       "5,3",      "1-5,4",    "1-5,5-9",
        "2147483648", "1-2147483648", "99999999999999999999", "1-2-3", "1;2",   "1|2",
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++) {
        dt_rdzv_ranks set;
        dt_err e = {0};
        int rc = dt_rdzv_ranks_decode(bad[i], strlen(bad[i]), &set, &e);
        DT_CHECK_MSG(rc == -EBADMSG, "\"%s\" decoded (rc %d)", bad[i], rc);
        DT_CHECK_MSG(e.msg[0] != '\0', "\"%s\": no message", bad[i]);
        DT_CHECK_MSG(strstr(e.msg, "ranks") != NULL, "\"%s\": %s", bad[i], e.msg);
        dt_rdzv_ranks_free(&set);
        DT_CHECK(set.n == 0 && set.r == NULL);
    }
    /* a long damaged list: the message quotes a bounded part of it */
    size_t n = 200000;
    char *big = malloc(n + 1);
    DT_REQUIRE(big != NULL);
    for (size_t i = 0; i < n; i++)
        big[i] = (i % 2) ? ',' : '7';
    big[n] = '\0'; /* "7,7,7,...": not ascending */
    dt_rdzv_ranks set;
    dt_err e = {0};
    DT_CHECK_INT(dt_rdzv_ranks_decode(big, n, &set, &e), -EBADMSG);
    DT_CHECK_CONTAINS(e.msg, "ascending");
    dt_rdzv_ranks_free(&set);
    free(big);
    /* NULL err is fine */
    DT_CHECK_INT(dt_rdzv_ranks_decode("x", 1, &set, NULL), -EBADMSG);
    dt_rdzv_ranks_free(&set);
}

static const dt_test tests[] = {
    {"round_trip_sizes", test_round_trip_sizes, 30},
    {"decode_accepts", test_decode_accepts, 30},
    {"decode_malformed", test_decode_malformed, 30},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_elastic_lost", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
