/* rdzv_ranks.c - see rdzv_ranks.h: sets of group ranks as ranges, and their text form. */
#include "rendezvous/rdzv_ranks.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

char *dt_rdzv_ranks_encode(const int *ranks, int n)
{
    if (n < 0 || (n > 0 && !ranks))
        return NULL;
    if (n == 0)
        return strdup("-");
    int *s = malloc(sizeof *s * (size_t)n);
    /* a range is at most "2147483647-2147483647," (22): n ranges at most */
    size_t cap = (size_t)n * 23 + 1, k = 0;
    char *out = malloc(cap);
    if (!s || !out)
        goto fail;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0)
            goto fail;
        s[i] = ranks[i];
    }
    qsort(s, (size_t)n, sizeof *s, cmp_int);
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && s[j + 1] - s[j] <= 1) /* both >= 0: no overflow */
            j++;
        k += (size_t)(s[i] == s[j] ? snprintf(out + k, cap - k, "%s%d", i ? "," : "", s[i])
                                   : snprintf(out + k, cap - k, "%s%d-%d", i ? "," : "", s[i],
                                              s[j]));
        i = j + 1;
    }
    free(s);
    return out;
fail:
    free(s);
    free(out);
    return NULL;
}

/* One decimal 0..INT_MAX at *p (digits only); advances *p. */
static bool parse_rank(const char **p, const char *end, int *out)
{
    long long v = 0;
    const char *q = *p;
    if (q == end || *q < '0' || *q > '9')
        return false;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v > INT_MAX)
            return false;
    }
    *p = q;
    *out = (int)v;
    return true;
}

int dt_rdzv_ranks_decode(const char *s, size_t len, dt_rdzv_ranks *out, dt_err *err)
{
    memset(out, 0, sizeof *out);
    if (len == 1 && s[0] == '-')
        return 0;
    const char *p = s, *end = s + len;
    int cap = 0, shown = len > 80 ? 80 : (int)len;
    const char *more = len > 80 ? "..." : "";
    long long prev_hi = -1;
    if (len == 0)
        return dt_err_set(err, -EBADMSG, "an empty list of ranks (the empty set is \"-\")");
    for (;;) {
        int lo, hi;
        size_t at = (size_t)(p - s);
        if (!parse_rank(&p, end, &lo))
            goto bad;
        hi = lo;
        if (p < end && *p == '-') {
            p++;
            at = (size_t)(p - s);
            if (!parse_rank(&p, end, &hi))
                goto bad;
            if (hi < lo)
                return dt_err_set(err, -EBADMSG,
                                  "the range %d-%d runs backwards in the list of ranks \"%.*s%s\"",
                                  lo, hi, shown, s, more);
        }
        if (lo <= prev_hi)
            return dt_err_set(err, -EBADMSG,
                              "rank %d is not above the ranks before it in the list of ranks "
                              "\"%.*s%s\" (it must be ascending, without repeats)",
                              lo, shown, s, more);
        if (out->n == cap) {
            cap = cap ? 2 * cap : 8;
            void *r = realloc(out->r, sizeof *out->r * (size_t)cap);
            if (!r)
                return dt_err_set(err, -ENOMEM, "out of memory");
            out->r = r;
        }
        out->r[out->n][0] = lo;
        out->r[out->n][1] = hi;
        out->n++;
        out->count += (long long)hi - lo + 1;
        prev_hi = hi;
        if (p == end)
            return 0;
        at = (size_t)(p - s);
        if (*p != ',' || ++p == end)
            goto bad;
        continue;
    bad:
        return dt_err_set(err, -EBADMSG,
                          "a malformed list of ranks at offset %zu of \"%.*s%s\" (expected "
                          "\"-\" or ascending items \"g\" or \"lo-hi\" separated by commas)",
                          at, shown, s, more);
    }
}

bool dt_rdzv_ranks_has(const dt_rdzv_ranks *set, int g)
{
    int a = 0, b = set ? set->n : 0;
    while (a < b) {
        int m = a + (b - a) / 2;
        if (g < set->r[m][0])
            b = m;
        else if (g > set->r[m][1])
            a = m + 1;
        else
            return true;
    }
    return false;
}

void dt_rdzv_ranks_free(dt_rdzv_ranks *set)
{
    if (!set)
        return;
    free(set->r);
    memset(set, 0, sizeof *set);
}
