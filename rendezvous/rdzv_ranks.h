/* rdzv_ranks.h - sets of group ranks (rdzv_ranks.c): the c10d backend lists the nodes declared
 * lost in a round's end record this way, however many they are. */
#ifndef DT_RDZV_RANKS_H
#define DT_RDZV_RANKS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* A set of group ranks, as ranges. The end record of a round lists the group ranks declared
 * lost in it as "-" (none) or ascending, disjoint ranges "3-40,57" (a rack that goes down is one
 * range), with no limit on how many. */
typedef struct dt_rdzv_ranks {
    int (*r)[2];     /* n ranges [lo, hi], lo <= hi, ascending and disjoint (owned) */
    int n;           /* number of ranges */
    long long count; /* ranks in the set */
} dt_rdzv_ranks;

/* Encodes ranks[0..n) (any order; duplicates allowed; each >= 0) as "-" (n == 0) or ascending
 * ranges "a-b,c" with adjacent ranks merged. Returns a malloc'd string (caller frees), or NULL
 * when out of memory or a rank is negative. */
char *dt_rdzv_ranks_encode(const int *ranks, int n);

/* Decodes s[0..len) (no NUL needed) into *out, which the caller frees with dt_rdzv_ranks_free
 * (also after a failure). Strict: "-", or items "g" or "lo-hi" (decimal, 0..INT_MAX, lo <= hi)
 * separated by single commas, each item above the previous one; anything else (empty, spaces,
 * signs, overflow, a trailing comma, descending or overlapping items) is -EBADMSG with err
 * saying what and where. -ENOMEM when out of memory. Memory is bounded by len, not by the
 * ranks' values. */
int dt_rdzv_ranks_decode(const char *s, size_t len, dt_rdzv_ranks *out, dt_err *err);

/* Whether g is in the set (binary search). */
bool dt_rdzv_ranks_has(const dt_rdzv_ranks *set, int g);

/* Frees the ranges and empties the set; accepts NULL. */
void dt_rdzv_ranks_free(dt_rdzv_ranks *set);

#endif
