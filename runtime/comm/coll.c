/* coll.c - descriptions of the cpu backend's collectives: printing and comparing; see coll.h. */
#include "runtime/comm/coll.h"

#include <stdio.h>

static const char *kind_name(int k)
{
    switch (k) {
    case DT_COLL_ALLREDUCE: return "allreduce";
    case DT_COLL_BROADCAST: return "broadcast";
    case DT_COLL_ALLGATHER: return "allgather";
    case DT_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case DT_COLL_BARRIER: return "barrier";
    case DT_COLL_MEM_ALLOC: return "mem_alloc";
    default: return "unknown-collective";
    }
}

const char *dt_coll_describe(const dt_coll_desc *d, char *buf, size_t cap)
{
    const char *dt = dt_dtype_valid(d->dtype) ? dt_dtype_name((dt_dtype)d->dtype) : "?";
    switch (d->kind) {
    case DT_COLL_BARRIER:
        snprintf(buf, cap, "barrier #%llu", (unsigned long long)d->seq);
        break;
    case DT_COLL_MEM_ALLOC:
        snprintf(buf, cap, "mem_alloc #%llu (%llu bytes)", (unsigned long long)d->seq,
                 (unsigned long long)d->count);
        break;
    case DT_COLL_BROADCAST:
        snprintf(buf, cap, "broadcast #%llu (%s x %llu from rank %d)", (unsigned long long)d->seq,
                 dt, (unsigned long long)d->count, d->root);
        break;
    case DT_COLL_ALLGATHER:
        snprintf(buf, cap, "allgather #%llu (%s x %llu per rank)", (unsigned long long)d->seq, dt,
                 (unsigned long long)d->count);
        break;
    default:
        snprintf(buf, cap, "%s #%llu (%s x %llu%s, %s)", kind_name(d->kind),
                 (unsigned long long)d->seq, dt, (unsigned long long)d->count,
                 d->kind == DT_COLL_REDUCE_SCATTER ? " per rank" : "",
                 dt_redop_valid(d->redop) ? dt_redop_name((dt_redop)d->redop) : "?");
    }
    return buf;
}

int dt_coll_same(const dt_coll_desc *a, const dt_coll_desc *b)
{
    return a->seq == b->seq && a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
           a->root == b->root && a->redop == b->redop;
}
