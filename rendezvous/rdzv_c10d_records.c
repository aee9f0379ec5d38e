/* rdzv_c10d_records.c - see rdzv_c10d_records.h: the c10d backend's records in the store. */
#include "rendezvous/rdzv_c10d_records.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/rdzv_round.h"

static const char *const end_names[] = {"none", "success", "fail", "regroup", "abort"};

/* "<kind> <node> <sig> <expect> <lost>|<why>"; lost: the group ranks declared lost, "-" or
 * "3-40,57" (dt_rdzv_ranks_encode: every one, however many). Returns a malloc'd record, or NULL
 * when out of memory. */
char *dt_rdzv_c10d_end_encode(dt_rdzv_c10d_end_kind kind, int node, int sig, int expect,
                              const int *lost, int nl, const char *why)
{
    char *l = dt_rdzv_ranks_encode(lost, nl);
    if (!l)
        return NULL;
    int len = snprintf(NULL, 0, "%s %d %d %d %s|%s", end_names[kind], node, sig, expect, l, why);
    char *v = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (v)
        snprintf(v, (size_t)len + 1, "%s %d %d %d %s|%s", end_names[kind], node, sig, expect, l,
                 why);
    free(l);
    return v;
}

void dt_rdzv_c10d_end_free(dt_rdzv_c10d_end *e)
{
    dt_rdzv_ranks_free(&e->lost);
}

/* Decodes an end record (strictly: a damaged one is -EBADMSG with err saying what). e needs
 * dt_rdzv_c10d_end_free, also after a failure. */
int dt_rdzv_c10d_end_decode(const char *v, dt_rdzv_c10d_end *e, dt_err *err)
{
    memset(e, 0, sizeof *e);
    e->expect = -1;
    const char *bar = strchr(v, '|'), *p = v;
    size_t kl = strcspn(v, " |");
    for (int i = DT_C10D_END_SUCCESS; i <= DT_C10D_END_ABORT; i++)
        if (strlen(end_names[i]) == kl && !strncmp(v, end_names[i], kl))
            e->kind = (dt_rdzv_c10d_end_kind)i;
    if (!bar || e->kind == DT_C10D_END_NONE)
        goto bad;
    p += kl;
    int *fields[3] = {&e->node, &e->sig, &e->expect};
    for (int i = 0; i < 3; i++) {
        if (*p != ' ' || !(p[1] == '-' || (p[1] >= '0' && p[1] <= '9')))
            goto bad;
        char *q;
        errno = 0;
        long x = strtol(p + 1, &q, 10);
        if (q == p + 1 || errno || x < INT_MIN || x > INT_MAX)
            goto bad;
        *fields[i] = (int)x;
        p = q;
    }
    if (*p != ' ' || p + 1 > bar)
        goto bad;
    p++;
    int rc = dt_rdzv_ranks_decode(p, (size_t)(bar - p), &e->lost, err);
    if (rc) {
        if (err)
            dt_err_prefix(err, "a round's end record lists the lost nodes wrongly (\"%.120s\"): ",
                          v);
        return rc;
    }
    dt_strlcpy(e->why, bar + 1, sizeof e->why);
    return 0;
bad:
    return dt_err_set(err, -EBADMSG,
                      "a round's end record is damaged: \"%.160s\" (expected \"<kind> <node> "
                      "<signal> <expect> <lost>|<why>\")",
                      v);
}

void dt_rdzv_c10d_end_status(const dt_rdzv_c10d_end *e, dt_rdzv_status *st)
{
    dt_rdzv_round_end_status(e->kind == DT_C10D_END_SUCCESS ? DT_RDZV_SUCCEEDED
                             : e->kind == DT_C10D_END_FAIL  ? DT_RDZV_FAILED
                             : e->kind == DT_C10D_END_ABORT ? DT_RDZV_ABORTED
                                                            : DT_RDZV_REGROUP,
                             e->node, e->sig, e->why, st);
}

/* final: "<code> <kind> <node> <sig>|<why>" -> a status: SUCCEEDED (code 0), ABORTED (by a
 * signal, a rendezvous that could not form, or a configuration error: setup_error), FAILED (the
 * budget is spent). */
void dt_rdzv_c10d_final_status(const char *v, dt_rdzv_status *st)
{
    int code = 1, node = -1, sig = 0;
    char kind[16] = "";
    sscanf(v, "%d %15s %d %d", &code, kind, &node, &sig);
    const char *bar = strchr(v, '|');
    dt_rdzv_round_final_status(code, kind, node, sig, bar ? bar + 1 : v, st);
}

int dt_rdzv_c10d_closed_decode(const char *v, dt_rdzv_c10d_closed *ci)
{
    memset(ci, 0, sizeof *ci);
    cJSON *o = cJSON_Parse(v);
    if (!o)
        return -EBADMSG;
    ci->cancelled = dt_rdzv_json_num(o, "final", 0) != 0;
    ci->n = (int)dt_rdzv_json_num(o, "n", 0);
    ci->attempt = (int)dt_rdzv_json_num(o, "attempt", 0);
    ci->world = (int)dt_rdzv_json_num(o, "world", 0);
    ci->master_port = (int)dt_rdzv_json_num(o, "master_port", 0);
    dt_rdzv_json_str(o, "tag", ci->tag, sizeof ci->tag);
    dt_rdzv_json_str(o, "master_addr", ci->master_addr, sizeof ci->master_addr);
    cJSON_Delete(o);
    return ci->cancelled || (ci->n > 0 && ci->tag[0]) ? 0 : -EBADMSG;
}
