/* cpu_pool.c - the CPU backend's page pool: physical memory that mem_release keeps for the next
 * mem_commit instead of giving it to the kernel and faulting fresh zeroed pages in again (see
 * cpu.h, "the page pool").
 *
 * The pool is one memfd, cut into units of the backend's granule. A committed granule of a
 * pooled allocation is a MAP_SHARED|MAP_FIXED mapping of one unit of the memfd at the granule's
 * address; released, the address gets an inaccessible private mapping again and the unit goes
 * to the cache of the category it was charged to, still resident in the memfd. A commit maps
 * cached units first (MAP_POPULATE: page tables only, no fault, no zeroing), then units whose
 * pages were given back (holes, punched with fallocate), then new units at the file's end.
 * Cached units are punched (given back to the kernel) when a commit of their category leaves
 * some unused, when anything is allocated, when a budget would refuse, and at close. The pool
 * itself keeps only lists of unit runs; the mappings and the statistics are cpu_backend.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "kernels/cpu/cpu.h"

bool dt_cpu_pool_wanted(void)
{
    const char *e = dt_env("DTRAIN_CPU_MEM_POOL");
    return !(e && !strcmp(e, "0"));
}

void dt_cpu_pool_open(dt_cpu_pool *p, size_t unit)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    p->unit = unit;
    if (!dt_cpu_pool_wanted())
        return;
    p->fd = memfd_create("dtrain-cpu-pool", MFD_CLOEXEC);
    if (p->fd < 0)
        DT_DEBUG("cpu backend: no page pool (memfd_create: %s): released memory is given back",
                 strerror(errno));
}

static void runs_free(dt_cpu_runs *r)
{
    free(r->v);
    memset(r, 0, sizeof *r);
}

void dt_cpu_pool_close(dt_cpu_pool *p)
{
    if (p->fd >= 0)
        close(p->fd);
    runs_free(&p->holes);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        runs_free(&p->cache[c]);
    p->fd = -1;
}

/* Appends [at, at + n) to r, merged with its last run where they touch. */
static int runs_push(dt_cpu_runs *r, size_t at, size_t n)
{
    if (r->n && r->v[r->n - 1].at + r->v[r->n - 1].n == at) {
        r->v[r->n - 1].n += n;
        r->units += n;
        return 0;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        dt_cpu_run *v = realloc(r->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (dt_cpu_run){at, n};
    r->units += n;
    return 0;
}

/* Takes at most `want` units from the end of r (the most recently added: reused in the order
 * they were released, so that a window's units map in few pieces): false when r is empty. */
static bool runs_take(dt_cpu_runs *r, size_t want, dt_cpu_run *got)
{
    if (!r->n)
        return false;
    dt_cpu_run *last = &r->v[r->n - 1];
    size_t n = last->n < want ? last->n : want;
    *got = (dt_cpu_run){last->at, n};
    last->at += n;
    last->n -= n;
    r->units -= n;
    if (!last->n)
        r->n--;
    return true;
}

/* Gives the pages of [at, at + n) back to the kernel; the units become holes. */
static void punch(dt_cpu_pool *p, size_t at, size_t n)
{
    if (fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(at * p->unit),
                  (off_t)(n * p->unit)) != 0)
        DT_WARN("cpu backend: giving back %zu bytes of the page pool failed: %s", n * p->unit,
                strerror(errno));
    if (runs_push(&p->holes, at, n) != 0)
        DT_WARN("cpu backend: out of memory for the page pool's lists: %zu bytes of the pool "
                "are lost until the backend closes", n * p->unit);
}

int dt_cpu_pool_take(dt_cpu_pool *p, dt_mem_cat cat, size_t want, dt_cpu_run *got, bool *cached,
                     dt_err *err)
{
    *cached = runs_take(&p->cache[cat], want, got);
    if (*cached || runs_take(&p->holes, want, got))
        return 0;
    size_t at = p->units;
    if (ftruncate(p->fd, (off_t)((at + want) * p->unit)) != 0)
        return dt_err_set(err, -ENOMEM, "cpu backend: cannot grow the page pool to %zu bytes: %s",
                          (at + want) * p->unit, strerror(errno));
    p->units = at + want;
    *got = (dt_cpu_run){at, want};
    return 0;
}

int dt_cpu_pool_cache(dt_cpu_pool *p, dt_mem_cat cat, size_t at, size_t n)
{
    int rc = runs_push(&p->cache[cat], at, n);
    if (rc)
        punch(p, at, n);
    return rc;
}

void dt_cpu_pool_give_back(dt_cpu_pool *p, size_t at, size_t n) { punch(p, at, n); }

size_t dt_cpu_pool_evict(dt_cpu_pool *p, dt_mem_cat cat)
{
    dt_cpu_runs *r = &p->cache[cat];
    size_t units = r->units;
    for (size_t i = 0; i < r->n; i++)
        punch(p, r->v[i].at, r->v[i].n);
    r->n = 0;
    r->units = 0;
    return units * p->unit;
}
