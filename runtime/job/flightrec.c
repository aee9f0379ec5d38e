/* flightrec.c - the flight records' shared mapping: see flightrec.h.
 *
 * The seqlock, as both sides run it (C11 atomics; the data between the two counter writes is
 * copied with plain memcpy, fenced):
 *   writer: v = ver (even); CAS ver v -> v+1 (acquire; spin while odd: another writer of this
 *           record); write the fields; store ver v+2 (release).
 *   reader: v0 = ver (acquire); odd: torn, retry; copy; fence (acquire); v1 = ver; v0 == v1:
 *           the copy is whole.
 * Racing plain accesses of the fields are formally a data race in C11; as in the Linux kernel's
 * seqlocks the counter makes every copy that is kept whole, and the fields are plain integers.
 */
#include "runtime/job/flightrec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

static const char *const state_names[] = {"empty", "queued", "started", "done", "failed"};
static const char *const phase_names[] = {"none",       "init",       "data",
                                          "forward",    "backward",   "gradient sync",
                                          "optimiser",  "evaluation", "checkpoint",
                                          "end"};

const char *dt_flightrec_state_name(int s)
{
    return s >= 0 && s < (int)DT_ARRAY_LEN(state_names) ? state_names[s] : "?";
}

const char *dt_flightrec_phase_name(int p)
{
    return p >= 0 && p < (int)DT_ARRAY_LEN(phase_names) ? phase_names[p] : "?";
}

static size_t hdr_bytes(void)
{
    return (sizeof(dt_flightrec_hdr) + 63) & ~(size_t)63;
}

size_t dt_flightrec_bytes(uint32_t capacity)
{
    size_t b = hdr_bytes() + (size_t)capacity * sizeof(dt_flightrec_rec);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (b + page - 1) / page * page;
}

/* ---- seqlock ------------------------------------------------------------------------------ */

static uint32_t write_lock(_Atomic uint32_t *ver)
{
    for (;;) {
        uint32_t v = atomic_load_explicit(ver, memory_order_relaxed);
        if (!(v & 1) && atomic_compare_exchange_weak_explicit(ver, &v, v + 1, memory_order_acquire,
                                                              memory_order_relaxed))
            return v;
    }
}

static void write_unlock(_Atomic uint32_t *ver, uint32_t v)
{
    atomic_store_explicit(ver, v + 2, memory_order_release);
}

/* Copies n bytes at src (guarded by *ver) into dst; true when the copy is whole. */
static bool read_copy(const _Atomic uint32_t *ver, void *dst, const void *src, size_t n)
{
    for (int tries = 0; tries < 64; tries++) {
        uint32_t v0 = atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)ver,
                                           memory_order_acquire);
        if (v0 & 1)
            continue;
        memcpy(dst, src, n);
        atomic_thread_fence(memory_order_acquire);
        uint32_t v1 = atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)ver,
                                           memory_order_relaxed);
        if (v0 == v1)
            return true;
    }
    return false;
}

/* ---- the agent ------------------------------------------------------------------------------ */

static int map_fd(dt_flightrec *fr, int fd, size_t bytes, dt_err *err)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return dt_err_errno(err, errno, "flight records: mmap of %zu bytes", bytes);
    fr->hdr = p;
    fr->recs = (dt_flightrec_rec *)((char *)p + hdr_bytes());
    fr->bytes = bytes;
    return 0;
}

int dt_flightrec_create(dt_flightrec *fr, uint32_t capacity, int rank, int local_rank,
                        dt_err *err)
{
    memset(fr, 0, sizeof *fr);
    fr->fd = -1;
    if (capacity < 1 || capacity > DT_FLIGHTREC_MAX)
        return dt_err_set(err, -EINVAL, "flight records: %u records (1 to %d)", capacity,
                          DT_FLIGHTREC_MAX);
    size_t bytes = dt_flightrec_bytes(capacity);
    int fd = memfd_create("dtrain-flight", MFD_CLOEXEC);
    if (fd < 0)
        return dt_err_errno(err, errno, "flight records: memfd_create");
    int rc;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        rc = dt_err_errno(err, errno, "flight records: sizing the memfd to %zu bytes", bytes);
        close(fd);
        return rc;
    }
    if ((rc = map_fd(fr, fd, bytes, err))) {
        close(fd);
        return rc;
    }
    fr->fd = fd;
    dt_flightrec_hdr *h = fr->hdr; /* a new memfd reads as zeroes */
    h->version = DT_FLIGHTREC_VERSION;
    h->capacity = capacity;
    h->hdr_bytes = (uint32_t)hdr_bytes();
    h->rec_bytes = (uint32_t)sizeof(dt_flightrec_rec);
    h->rank = rank;
    h->local_rank = local_rank;
    atomic_thread_fence(memory_order_release);
    h->magic = DT_FLIGHTREC_MAGIC;
    return 0;
}

void dt_flightrec_close(dt_flightrec *fr)
{
    if (!fr)
        return;
    if (fr->hdr)
        munmap(fr->hdr, fr->bytes);
    if (fr->fd > 0)
        close(fr->fd);
    memset(fr, 0, sizeof *fr);
    fr->fd = -1;
}

static int rec_cmp(const void *a, const void *b)
{
    uint64_t x = ((const dt_flightrec_rec *)a)->id, y = ((const dt_flightrec_rec *)b)->id;
    return x < y ? -1 : x > y;
}

int dt_flightrec_snapshot(const dt_flightrec *fr, dt_flightrec_snap *s, bool records,
                          dt_err *err)
{
    memset(s, 0, sizeof *s);
    const dt_flightrec_hdr *h = fr->hdr;
    if (!h || h->magic != DT_FLIGHTREC_MAGIC || h->version != DT_FLIGHTREC_VERSION ||
        h->rec_bytes != sizeof(dt_flightrec_rec))
        return dt_err_set(err, -EPROTO, "flight records: not a mapping of version %d",
                          DT_FLIGHTREC_VERSION);
    s->pid = atomic_load_explicit((_Atomic int32_t *)(uintptr_t)&h->pid, memory_order_acquire);
    s->rank = h->rank;
    s->local_rank = h->local_rank;
    s->world_size = h->world_size;
    s->t_attach = h->t_attach;
    memcpy(s->op_names, h->op_names, sizeof s->op_names);
    memcpy(s->dtype_names, h->dtype_names, sizeof s->dtype_names);
    for (int i = 0; i < DT_FLIGHTREC_NAMES; i++) {
        s->op_names[i][sizeof s->op_names[i] - 1] = '\0';
        s->dtype_names[i][sizeof s->dtype_names[i] - 1] = '\0';
    }
    uint32_t ng = atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)&h->ngroups,
                                       memory_order_acquire);
    s->ngroups = ng > DT_FLIGHTREC_GROUPS ? DT_FLIGHTREC_GROUPS : (int)ng;
    memcpy(s->groups, h->groups, sizeof s->groups[0] * (size_t)s->ngroups);
    for (int i = 0; i < s->ngroups; i++)
        s->groups[i].label[sizeof s->groups[i].label - 1] = '\0';
    s->pos_torn = !read_copy(&h->pos.ver, &s->pos, &h->pos, sizeof s->pos);
    if (atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)&h->err_set, memory_order_acquire)) {
        memcpy(s->error, h->error, sizeof s->error);
        s->error[sizeof s->error - 1] = '\0';
    }
    uint64_t nw = atomic_load_explicit((_Atomic uint64_t *)(uintptr_t)&h->nwindows,
                                       memory_order_acquire);
    uint64_t w0 = nw > DT_FLIGHTREC_WINDOWS ? nw - DT_FLIGHTREC_WINDOWS : 0;
    for (uint64_t w = w0; w < nw; w++) {
        dt_flightrec_window c;
        const dt_flightrec_window *src = &h->windows[w % DT_FLIGHTREC_WINDOWS];
        if (read_copy(&src->ver, &c, src, sizeof c))
            s->windows[s->nwindows++] = c;
    }
    uint64_t issued = atomic_load_explicit((_Atomic uint64_t *)(uintptr_t)&h->next_id,
                                           memory_order_acquire);
    s->issued = issued;
    uint32_t cap = h->capacity;
    size_t n = !records ? 0 : issued < cap ? (size_t)issued : cap;
    if (n && !(s->recs = malloc(n * sizeof *s->recs)))
        return dt_err_set(err, -ENOMEM, "flight records: out of memory");
    for (size_t i = 0; i < n; i++) {
        const dt_flightrec_rec *src = &fr->recs[i];
        dt_flightrec_rec c;
        if (!read_copy(&src->ver, &c, src, sizeof c)) {
            s->torn++;
            continue;
        }
        if (c.id == 0)
            continue; /* a slot whose id was taken but not yet written */
        s->recs[s->n++] = c;
    }
    if (s->n > 1)
        qsort(s->recs, s->n, sizeof *s->recs, rec_cmp);
    return 0;
}

void dt_flightrec_snap_free(dt_flightrec_snap *s)
{
    if (!s)
        return;
    free(s->recs);
    s->recs = NULL;
    s->n = 0;
}

void dt_flightrec_set_stragglers(dt_flightrec *fr, const int *ranks, int n)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return;
    if (n > DT_FLIGHTREC_STRAGGLERS)
        n = DT_FLIGHTREC_STRAGGLERS;
    uint32_t v = write_lock(&h->strag_ver);
    h->nstragglers = n;
    for (int i = 0; i < n; i++)
        h->stragglers[i] = ranks[i];
    write_unlock(&h->strag_ver, v);
}

/* ---- the worker ----------------------------------------------------------------------------- */

int dt_flightrec_attach(dt_flightrec *fr, int fd, uint32_t capacity, int world_size,
                        dt_err *err)
{
    memset(fr, 0, sizeof *fr);
    fr->fd = -1;
    int rc;
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return dt_err_errno(err, errno, "flight records: DTRAIN_FLIGHT_FD=%d", fd);
        if ((size_t)st.st_size < hdr_bytes())
            return dt_err_set(err, -EPROTO, "flight records: DTRAIN_FLIGHT_FD=%d holds %lld "
                              "bytes, not a mapping", fd, (long long)st.st_size);
        if ((rc = map_fd(fr, fd, (size_t)st.st_size, err)))
            return rc;
        close(fd); /* the mapping stays; nothing a worker starts inherits the descriptor */
        dt_flightrec_hdr *h = fr->hdr;
        if (h->magic != DT_FLIGHTREC_MAGIC || h->version != DT_FLIGHTREC_VERSION ||
            h->rec_bytes != sizeof(dt_flightrec_rec) ||
            dt_flightrec_bytes(h->capacity) > fr->bytes) {
            dt_flightrec_close(fr);
            return dt_err_set(err, -EPROTO, "flight records: the agent's mapping is of another "
                              "version (is the agent another dtrain?)");
        }
    } else {
        if (capacity < 1 || capacity > DT_FLIGHTREC_MAX)
            capacity = DT_FLIGHTREC_DEFAULT;
        size_t bytes = dt_flightrec_bytes(capacity);
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return dt_err_errno(err, errno, "flight records: mmap of %zu bytes", bytes);
        fr->hdr = p;
        fr->recs = (dt_flightrec_rec *)((char *)p + hdr_bytes());
        fr->bytes = bytes;
        fr->hdr->magic = DT_FLIGHTREC_MAGIC;
        fr->hdr->version = DT_FLIGHTREC_VERSION;
        fr->hdr->capacity = capacity;
        fr->hdr->hdr_bytes = (uint32_t)hdr_bytes();
        fr->hdr->rec_bytes = (uint32_t)sizeof(dt_flightrec_rec);
    }
    fr->hdr->world_size = world_size;
    fr->hdr->t_attach = dt_now_ns();
    atomic_store_explicit(&fr->hdr->pid, (int32_t)getpid(), memory_order_release);
    return 0;
}

void dt_flightrec_name_op(dt_flightrec *fr, int i, const char *name)
{
    if (fr->hdr && i >= 0 && i < DT_FLIGHTREC_NAMES)
        dt_strlcpy(fr->hdr->op_names[i], name, sizeof fr->hdr->op_names[i]);
}

void dt_flightrec_name_dtype(dt_flightrec *fr, int i, const char *name)
{
    if (fr->hdr && i >= 0 && i < DT_FLIGHTREC_NAMES)
        dt_strlcpy(fr->hdr->dtype_names[i], name, sizeof fr->hdr->dtype_names[i]);
}

int dt_flightrec_add_group(dt_flightrec *fr, const dt_flightrec_group *g)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return -1;
    uint32_t n = atomic_load_explicit(&h->ngroups, memory_order_relaxed);
    if (n >= DT_FLIGHTREC_GROUPS)
        return -1;
    h->groups[n] = *g;
    atomic_store_explicit(&h->ngroups, n + 1, memory_order_release);
    return (int)n;
}

uint64_t dt_flightrec_issue(dt_flightrec *fr, const dt_flightrec_rec *r)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return 0;
    /* the id is taken first and published (next_id) at once: a reader that sees next_id = k
     * finds record k, or its slot being written (torn), never an older record mistaken for it */
    uint64_t id = atomic_fetch_add_explicit(&h->next_id, 1, memory_order_acq_rel) + 1;
    dt_flightrec_rec *slot = &fr->recs[(id - 1) % h->capacity];
    uint32_t v = write_lock(&slot->ver);
    uint32_t keep = v;
    memcpy((char *)slot + sizeof slot->ver, (const char *)r + sizeof r->ver,
           sizeof *slot - sizeof slot->ver);
    slot->id = id;
    write_unlock(&slot->ver, keep);
    return id;
}

void dt_flightrec_update(dt_flightrec *fr, uint64_t id, int state, uint64_t t, int err)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h || id == 0)
        return;
    dt_flightrec_rec *slot = &fr->recs[(id - 1) % h->capacity];
    uint32_t v = write_lock(&slot->ver);
    if (slot->id == id) {
        /* a state never goes back (a wait that started after the call finished on the comm
         * thread is still reported done) */
        if (state > slot->state)
            slot->state = (uint8_t)state;
        if (state == DT_FLIGHTREC_STARTED && t && !slot->t_start)
            slot->t_start = t;
        if ((state == DT_FLIGHTREC_DONE || state == DT_FLIGHTREC_FAILED) && t)
            slot->t_end = t;
        if (state == DT_FLIGHTREC_FAILED)
            slot->err = err;
    }
    write_unlock(&slot->ver, v);
}

void dt_flightrec_set_error(dt_flightrec *fr, const char *msg)
{
    dt_flightrec_hdr *h = fr->hdr;
    uint32_t zero = 0;
    if (!h || !msg || !atomic_compare_exchange_strong(&h->err_set, &zero, 2))
        return;
    dt_strlcpy(h->error, msg, sizeof h->error);
    atomic_store_explicit(&h->err_set, 1, memory_order_release);
}

void dt_flightrec_set_pos(dt_flightrec *fr, const dt_flightrec_pos *p)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return;
    uint32_t v = write_lock(&h->pos.ver);
    memcpy((char *)&h->pos + sizeof h->pos.ver, (const char *)p + sizeof p->ver,
           sizeof *p - sizeof p->ver);
    write_unlock(&h->pos.ver, v);
}

void dt_flightrec_add_window(dt_flightrec *fr, const dt_flightrec_window *w)
{
    dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return;
    uint64_t n = atomic_load_explicit(&h->nwindows, memory_order_relaxed);
    dt_flightrec_window *slot = &h->windows[n % DT_FLIGHTREC_WINDOWS];
    uint32_t v = write_lock(&slot->ver);
    memcpy((char *)slot + sizeof slot->ver, (const char *)w + sizeof w->ver,
           sizeof *w - sizeof w->ver);
    write_unlock(&slot->ver, v);
    atomic_store_explicit(&h->nwindows, n + 1, memory_order_release);
}

int dt_flightrec_get_stragglers(const dt_flightrec *fr, int *ranks, int cap)
{
    const dt_flightrec_hdr *h = fr->hdr;
    if (!h)
        return 0;
    struct {
        int32_t n;
        int32_t r[DT_FLIGHTREC_STRAGGLERS];
    } c;
    /* nstragglers and stragglers[] are adjacent: one copy under the counter */
    if (!read_copy(&h->strag_ver, &c, &h->nstragglers, sizeof c))
        return 0;
    int n = c.n < 0 ? 0 : c.n > DT_FLIGHTREC_STRAGGLERS ? DT_FLIGHTREC_STRAGGLERS : c.n;
    if (n > cap)
        n = cap;
    for (int i = 0; i < n; i++)
        ranks[i] = c.r[i];
    return n;
}
