/* cpu_backend.c - the CPU backend: lifecycle, memory, profiling and the op table (see cpu.h).
 *
 * Memory is host memory, 64-byte aligned (page-aligned from 64 KiB, so that mem_release can
 * give most of a big buffer back; granule-aligned from the granule up when DTRAIN_CPU_MEM_GRANULE
 * makes it coarser than a page), with a header just before the user pointer that remembers the
 * size, the category it was charged to and which of its granules mem_release gave back, so that
 * the statistics by category (dt_mem_stats) count resident bytes exactly. mem_release keeps the
 * contract as strictly as cuda's unmapped memory: a released granule is PROT_NONE (a touch is a
 * SIGSEGV) until mem_commit makes it read-write again (filled with 0xFF bytes under
 * DTRAIN_CPU_MEM_POISON=1, as every test runs); so a strategy that runs here cannot lean on what
 * a GPU does not give. Its pages go to the page pool (cpu_pool.c)
 * when they came from it, else back to the kernel; a commit maps pool pages (those the category
 * released last, else new ones), so a granule committed once is pool memory from then on. Every
 * op is synchronous, so synchronize is a no-op and profiling needs no barriers.
 *
 * Threads: OpenBLAS keeps ONE thread count for the whole process (openblas_set_num_threads), so
 * opts->threads is applied when an instance is created and the last instance created wins. Data
 * parallel replicas in one process each drive their own instance from their own thread with
 * threads = 1; OpenBLAS then runs each GEMM in the calling thread, and concurrent calls from
 * different threads are safe. The non-GEMM loops are single-threaded.
 */
#include <cblas.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/env.h"
#include "common/log.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_backend.h"

/* OpenBLAS's pthreads build has it; another BLAS (or its OpenMP build) may not. */
#pragma weak openblas_setaffinity

#define ALLOC_ALIGN 64
#define ALLOC_HEADER 64            /* bytes before the user pointer, holding a cpu_hdr */
#define ALLOC_PAGE_FROM (64 << 10) /* allocations this large start on a page */

typedef struct cpu_hdr {
    size_t bytes;    /* as asked */
    size_t lead;     /* user pointer - what posix_memalign returned */
    size_t released; /* bytes of the granules marked in rel */
    uint8_t *rel;    /* bitmap of the granules mem_release gave back (granule k: the k-th from
                        the one holding the user pointer), or NULL; owned */
    uint32_t *unit;  /* the page pool's unit mapped at granule k (NO_UNIT: the allocation's own
                        pages, or released), or NULL while no granule was committed; owned */
    dt_mem_cat cat;  /* charged to */
} cpu_hdr;
_Static_assert(sizeof(cpu_hdr) <= ALLOC_HEADER, "cpu_hdr fits the header");

static size_t page_size(void)
{
    static size_t ps;
    if (!ps) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (size_t)v : 4096;
    }
    return ps;
}

/* The unit of mem_release: the page, or DTRAIN_CPU_MEM_GRANULE bytes (a power-of-two multiple of
 * the page, to run the strategies as they run on cuda's 2 MiB granules); read once. */
static size_t granule_size(void)
{
    static size_t g;
    if (!g) {
        size_t v = page_size();
        const char *e = dt_env("DTRAIN_CPU_MEM_GRANULE");
        if (e && *e) {
            char *end;
            unsigned long long x = strtoull(e, &end, 10);
            if (*end || x < v || (x & (x - 1)) || x > ((size_t)1 << 30))
                DT_WARN("cpu backend: DTRAIN_CPU_MEM_GRANULE=%s is not a power of two from the page "
                        "size (%zu) to 1 GiB: using the page", e, v);
            else
                v = (size_t)x;
        }
        g = v;
    }
    return g;
}

static cpu_hdr *hdr_of(void *p) { return (cpu_hdr *)((char *)p - ALLOC_HEADER); }

#define NO_UNIT UINT32_MAX

static const struct {
    const char *name;
    bool gemm;
} op_info[DT_CPU_OP_COUNT] = {
    [DT_CPU_OP_MEMCPY] = {"memcpy", false},
    [DT_CPU_OP_MEMSET] = {"memset_zero", false},
    [DT_CPU_OP_MATMUL_FWD] = {"matmul_fwd", true},
    [DT_CPU_OP_MATMUL_BWD] = {"matmul_bwd", true},
    [DT_CPU_OP_MATMUL_BIAS] = {"matmul_bias", false},
    [DT_CPU_OP_ATTN_FWD] = {"attention_fwd", true},
    [DT_CPU_OP_ATTN_BWD] = {"attention_bwd", true},
    [DT_CPU_OP_ATTN_SOFTMAX_FWD] = {"attention_softmax_fwd", false},
    [DT_CPU_OP_ATTN_SOFTMAX_BWD] = {"attention_softmax_bwd", false},
    [DT_CPU_OP_CONV_FWD] = {"conv2d_fwd", true},
    [DT_CPU_OP_CONV_BWD] = {"conv2d_bwd", true},
    [DT_CPU_OP_CONV_IM2COL] = {"conv2d_im2col", false},
    [DT_CPU_OP_BIAS_ADD] = {"bias_add", false},
    [DT_CPU_OP_BIAS_BWD] = {"bias_bwd", false},
    [DT_CPU_OP_LAYERNORM_FWD] = {"layernorm_fwd", false},
    [DT_CPU_OP_LAYERNORM_BWD] = {"layernorm_bwd", false},
    [DT_CPU_OP_GELU_FWD] = {"gelu_fwd", false},
    [DT_CPU_OP_GELU_BWD] = {"gelu_bwd", false},
    [DT_CPU_OP_RELU_FWD] = {"relu_fwd", false},
    [DT_CPU_OP_RELU_BWD] = {"relu_bwd", false},
    [DT_CPU_OP_RESIDUAL] = {"residual_fwd", false},
    [DT_CPU_OP_ACCUMULATE] = {"accumulate", false},
    [DT_CPU_OP_SCALE] = {"scale", false},
    [DT_CPU_OP_EMBEDDING_FWD] = {"embedding_fwd", false},
    [DT_CPU_OP_EMBEDDING_BWD] = {"embedding_bwd", false},
    [DT_CPU_OP_XENT] = {"xent_fwd_bwd", false},
    [DT_CPU_OP_BN_STATS] = {"bn_stats", false},
    [DT_CPU_OP_BN_FWD_APPLY] = {"bn_fwd_apply", false},
    [DT_CPU_OP_BN_FWD_EVAL] = {"bn_fwd_eval", false},
    [DT_CPU_OP_BN_BWD_REDUCE] = {"bn_bwd_reduce", false},
    [DT_CPU_OP_BN_BWD_APPLY] = {"bn_bwd_apply", false},
    [DT_CPU_OP_MAXPOOL_FWD] = {"maxpool_fwd", false},
    [DT_CPU_OP_MAXPOOL_BWD] = {"maxpool_bwd", false},
    [DT_CPU_OP_AVGPOOL_FWD] = {"avgpool_fwd", false},
    [DT_CPU_OP_AVGPOOL_BWD] = {"avgpool_bwd", false},
    [DT_CPU_OP_SGD] = {"sgd_update", false},
    [DT_CPU_OP_ADAMW] = {"adamw_update", false},
    [DT_CPU_OP_SUMSQ] = {"sumsq", false},
    [DT_CPU_OP_NONFINITE] = {"count_nonfinite", false},
    [DT_CPU_OP_TO_HALF] = {"to_half", false},
    [DT_CPU_OP_FROM_HALF] = {"from_half", false},
    [DT_CPU_OP_EMBEDDING_VP_FWD] = {"embedding_vp_fwd", false},
    [DT_CPU_OP_EMBEDDING_VP_BWD] = {"embedding_vp_bwd", false},
    [DT_CPU_OP_XENT_VP] = {"xent_vp", false},
    [DT_CPU_OP_ATTN_PAD_FWD] = {"attention_pad_fwd", true},
    [DT_CPU_OP_ATTN_PAD_BWD] = {"attention_pad_bwd", true},
    [DT_CPU_OP_GELU_ERF_FWD] = {"gelu_erf_fwd", false},
    [DT_CPU_OP_GELU_ERF_BWD] = {"gelu_erf_bwd", false},
    [DT_CPU_OP_TANH_FWD] = {"tanh_fwd", false},
    [DT_CPU_OP_TANH_BWD] = {"tanh_bwd", false},
    [DT_CPU_OP_RMSNORM_FWD] = {"rmsnorm_fwd", false},
    [DT_CPU_OP_RMSNORM_BWD] = {"rmsnorm_bwd", false},
    [DT_CPU_OP_SWIGLU_FWD] = {"swiglu_fwd", false},
    [DT_CPU_OP_SWIGLU_BWD] = {"swiglu_bwd", false},
    [DT_CPU_OP_ROPE_QKV_FWD] = {"rope_qkv_fwd", false},
    [DT_CPU_OP_ROPE_QKV_BWD] = {"rope_qkv_bwd", false},
};

/* ------------------------------------------------------------------------------------------ */
/* profiling */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt_cpu_prof_now(const dt_cpu *c) { return c->prof_on ? mono_s() : 0.0; }

void dt_cpu_prof_time(dt_cpu *c, int op, double t0, double flops)
{
    if (!c->prof_on)
        return;
    c->stats[op].seconds += mono_s() - t0;
    c->stats[op].flops += flops;
}

void dt_cpu_prof_add(dt_cpu *c, int op, double t0, double flops)
{
    if (!c->prof_on)
        return;
    dt_cpu_prof_time(c, op, t0, flops);
    c->stats[op].calls++;
}

static void cpu_profile_enable(dt_backend *be, bool on)
{
    dt_cpu *c = dt_cpu_of(be);
    if (on) {
        for (int i = 0; i < DT_CPU_OP_COUNT; i++) {
            c->stats[i] = (dt_op_stat){.name = op_info[i].name, .gemm = op_info[i].gemm};
        }
    }
    c->prof_on = on;
}

static int cpu_profile_read(dt_backend *be, dt_op_stat *out, int max)
{
    dt_cpu *c = dt_cpu_of(be);
    for (int i = 0; i < DT_CPU_OP_COUNT && i < max; i++) {
        out[i] = c->stats[i];
        out[i].name = op_info[i].name;
        out[i].gemm = op_info[i].gemm;
    }
    return DT_CPU_OP_COUNT;
}

/* ------------------------------------------------------------------------------------------ */
/* lifecycle and memory */

static void cpu_close(dt_backend *be)
{
    if (!be)
        return;
    dt_cpu *c = dt_cpu_of(be);
    if (c) {
        if (c->cur_bytes)
            DT_DEBUG("cpu backend closed with %zu bytes still allocated", c->cur_bytes);
        for (int k = 0; k < DT_MEM_CAT_COUNT; k++)
            dt_cpu_pool_evict(&c->pool, (dt_mem_cat)k);
        dt_cpu_pool_close(&c->pool);
        free(c->scratch);
        free(c);
    }
    free(be);
}

static void charge(dt_cpu *c, dt_mem_cat cat, size_t bytes)
{
    dt_mem_stats_add(&c->mem, cat, bytes);
    c->cur_bytes = c->mem.total;
    if (c->mem.total_peak > c->peak_bytes) /* the statistics' peak may have been reset */
        c->peak_bytes = c->mem.total_peak;
}

static void uncharge(dt_cpu *c, dt_mem_cat cat, size_t bytes)
{
    dt_mem_stats_sub(&c->mem, cat, bytes);
    c->cur_bytes = c->mem.total;
}

/* The page pool's cached units go back to the kernel (they are charged to nothing: see
 * cpu_mem_release), all of them or cat's only. */
static void evict(dt_cpu *c, int cat)
{
    for (int k = 0; k < DT_MEM_CAT_COUNT; k++)
        if (cat < 0 || k == cat)
            dt_cpu_pool_evict(&c->pool, (dt_mem_cat)k);
}

static int cpu_alloc(dt_backend *be, void **p, size_t bytes, dt_err *err)
{
    dt_cpu *c = dt_cpu_of(be);
    void *raw = NULL;
    evict(c, -1); /* what the process holds is what is charged when anything is allocated */
    int rc = dt_mem_admit(&c->mem, c->mem_limit, c->peak_bytes, "cpu", c->mem_cat, bytes, err);
    if (rc) {
        *p = NULL;
        return rc;
    }
    size_t lead = bytes >= ALLOC_PAGE_FROM ? page_size() : ALLOC_HEADER;
    if (granule_size() > page_size() && bytes >= granule_size())
        lead = granule_size(); /* starts on a granule, as cuda's virtual-memory allocations */
    if (bytes > SIZE_MAX - lead ||
        posix_memalign(&raw, lead == ALLOC_HEADER ? ALLOC_ALIGN : lead, lead + bytes) != 0) {
        *p = NULL;
        return dt_err_set(err, -ENOMEM,
                          "cpu backend: cannot allocate %zu bytes (%.1f MiB; %.1f MiB in use): "
                          "use a smaller batch or model",
                          bytes, (double)bytes / 1048576.0, (double)c->cur_bytes / 1048576.0);
    }
    char *user = (char *)raw + lead;
    memset(user, 0, bytes);
    *hdr_of(user) = (cpu_hdr){.bytes = bytes, .lead = lead, .cat = c->mem_cat};
    charge(c, c->mem_cat, bytes);
    *p = user;
    return 0;
}

static dt_mem_cat cpu_mem_category(dt_backend *be, dt_mem_cat cat)
{
    dt_cpu *c = dt_cpu_of(be);
    dt_mem_cat old = c->mem_cat;
    c->mem_cat = cat;
    return old;
}

static void cpu_mem_stats(dt_backend *be, dt_mem_stats *out) { *out = dt_cpu_of(be)->mem; }

static void cpu_mem_external(dt_backend *be, dt_mem_cat cat, size_t bytes, bool add)
{
    if (add)
        charge(dt_cpu_of(be), cat, bytes);
    else
        uncharge(dt_cpu_of(be), cat, bytes);
}

/* The granules of the allocation base (numbered from the one holding base) that lie wholly
 * inside [offset, offset + bytes) (inner) or touch it (!inner): [*k0, *k1). */
static void granule_span(const void *base, const cpu_hdr *h, size_t offset, size_t bytes,
                         bool inner, size_t *k0, size_t *k1)
{
    const size_t g = granule_size();
    uintptr_t first = (uintptr_t)base / g * g;
    size_t end = offset + bytes < h->bytes ? offset + bytes : h->bytes;
    uintptr_t lo = (uintptr_t)base + (offset < end ? offset : end), hi = (uintptr_t)base + end;
    if (inner) {
        lo = (lo + g - 1) / g * g;
        hi = hi / g * g;
    } else {
        lo = lo / g * g;
        hi = (hi + g - 1) / g * g;
    }
    *k0 = (lo - first) / g;
    *k1 = hi > lo ? (hi - first) / g : *k0;
}

static bool is_released(const cpu_hdr *h, size_t k) { return h->rel[k / 8] & (1u << (k % 8)); }

static void mark(cpu_hdr *h, size_t k, size_t j, bool released)
{
    for (; k < j; k++) {
        if (released)
            h->rel[k / 8] |= (uint8_t)(1u << (k % 8));
        else
            h->rel[k / 8] &= (uint8_t) ~(1u << (k % 8));
    }
}

/* The next run [*k, *j) of granules whose released bit is `released`, from *k up to k1; false
 * when there is none. */
static bool next_run(const cpu_hdr *h, size_t k1, bool released, size_t *k, size_t *j)
{
    while (*k < k1 && is_released(h, *k) != released)
        ++*k;
    for (*j = *k; *j < k1 && is_released(h, *j) == released;)
        ++*j;
    return *k < k1;
}

/* The address of granule 0 of the allocation base (the one holding base), and how many granules
 * the allocation touches. */
static char *granule0(const void *base)
{
    return (char *)((uintptr_t)base / granule_size() * granule_size());
}

static size_t granule_count(const void *base, const cpu_hdr *h)
{
    const size_t g = granule_size();
    return ((uintptr_t)base % g + h->bytes + g - 1) / g;
}

/* Granules [a, b) of h mapped from the page pool get an inaccessible private mapping again and
 * their units go to the cache of h's category, resident. false when the mapping cannot be
 * replaced (then they stay mapped, resident and counted). */
static bool unmap_units(dt_cpu *c, cpu_hdr *h, char *first, size_t a, size_t b)
{
    const size_t g = granule_size();
    if (mmap(first + a * g, (b - a) * g, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
        DT_WARN("cpu backend: giving back %zu bytes at %p failed: %s", (b - a) * g,
                (void *)(first + a * g), strerror(errno));
        return false;
    }
    for (size_t k = a; k < b; k++) {
        dt_cpu_pool_cache(&c->pool, h->cat, h->unit[k], 1);
        h->unit[k] = NO_UNIT;
    }
    return true;
}

static bool pooled(const cpu_hdr *h, size_t k) { return h->unit && h->unit[k] != NO_UNIT; }

/* Released granules cannot be touched (PROT_NONE), as cuda's unmapped granules cannot, and stop
 * counting. The allocation's own pages go back to the kernel (madvise: they read as zero when
 * mapped again); granules mapped from the page pool keep their pages for the next commit, in
 * the pool's cache, charged to nothing: the cache is given back when a commit of the category
 * leaves some of it unused, when anything is allocated and before a budget would refuse, so the
 * process holds at most the granules released since that category's last commit beyond what
 * the statistics count. A failure leaves the memory mapped and resident, counted, with a warning.
 */
static void cpu_mem_release(dt_backend *be, void *base, size_t offset, size_t bytes)
{
    if (!base || !bytes)
        return;
    dt_cpu *c = dt_cpu_of(be);
    cpu_hdr *h = hdr_of(base);
    const size_t g = granule_size();
    size_t k0, k1;
    granule_span(base, h, offset, bytes, true, &k0, &k1);
    if (k1 <= k0)
        return;
    if (!h->rel && !(h->rel = calloc((granule_count(base, h) + 7) / 8, 1)))
        return; /* without the bitmap nothing is released, and nothing is counted */
    char *first = granule0(base);
    for (size_t k = k0, j; next_run(h, k1, false, &k, &j); k = j) {
        for (size_t a = k, b; a < j; a = b) { /* runs of own pages, and of pooled ones */
            const bool pool = pooled(h, a);
            for (b = a + 1; b < j && pooled(h, b) == pool;)
                b++;
            char *p = first + a * g;
            size_t n = (b - a) * g;
            if (pool ? !unmap_units(c, h, first, a, b)
                     : madvise(p, n, MADV_DONTNEED) != 0 || mprotect(p, n, PROT_NONE) != 0) {
                if (!pool)
                    DT_WARN("cpu backend: giving back %zu bytes at %p failed: %s", n, (void *)p,
                            strerror(errno));
                continue;
            }
            mark(h, a, b, true);
            h->released += n;
            uncharge(c, h->cat, n);
        }
    }
}

static size_t cached_bytes(const dt_cpu *c)
{
    size_t units = 0;
    for (int k = 0; k < DT_MEM_CAT_COUNT; k++)
        units += c->pool.cache[k].units;
    return units * c->pool.unit;
}

/* Maps units of the page pool at granules [k, j) of h: the category's cached units first (no
 * fault, no zeroing), then holes or new units. On failure what was mapped goes back. */
static int map_units(dt_cpu *c, cpu_hdr *h, char *first, size_t k, size_t j, dt_err *err)
{
    const size_t g = granule_size();
    for (size_t a = k; a < j;) {
        dt_cpu_run u;
        bool cached;
        int rc = dt_cpu_pool_take(&c->pool, h->cat, j - a, &u, &cached, err);
        if (!rc && mmap(first + a * g, u.n * g, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_FIXED | MAP_POPULATE, c->pool.fd,
                        (off_t)(u.at * g)) == MAP_FAILED) {
            rc = dt_err_set(err, -ENOMEM, "cpu backend: cannot commit %zu bytes (%.1f MiB in use): "
                            "%s", u.n * g, (double)c->cur_bytes / 1048576.0, strerror(errno));
            dt_cpu_pool_give_back(&c->pool, u.at, u.n);
        }
        if (rc) {
            unmap_units(c, h, first, k, a);
            return rc;
        }
        for (size_t q = 0; q < u.n; q++)
            h->unit[a + q] = (uint32_t)(u.at + q);
        a += u.n;
    }
    return 0;
}

/* Committed granules are usable again: their contents are whatever the pool's pages held, or
 * zero (the contract promises none); with DTRAIN_CPU_MEM_POISON=1 (the tests set it) every byte
 * is 0xFF, a NaN in every float, so that whoever reads before writing is seen. */
static int cpu_mem_commit(dt_backend *be, void *base, size_t offset, size_t bytes, dt_err *err)
{
    if (!base || !bytes)
        return 0;
    dt_cpu *c = dt_cpu_of(be);
    cpu_hdr *h = hdr_of(base);
    if (!h->rel || !h->released)
        return 0;
    const size_t g = granule_size();
    size_t k0, k1;
    granule_span(base, h, offset, bytes, false, &k0, &k1);
    char *first = granule0(base);
    if (c->pool.fd >= 0 && !h->unit) {
        size_t n = granule_count(base, h);
        if ((h->unit = malloc(n * sizeof *h->unit)))
            for (size_t k = 0; k < n; k++)
                h->unit[k] = NO_UNIT;
    }
    int rc = 0;
    for (size_t k = k0, j; !rc && next_run(h, k1, true, &k, &j); k = j) {
        char *p = first + k * g;
        size_t n = (j - k) * g;
        if (c->mem_limit && c->mem.total + cached_bytes(c) + n > c->mem_limit)
            evict(c, -1); /* the cache is real memory: it goes before the budget refuses */
        if ((rc = dt_mem_admit(&c->mem, c->mem_limit, c->peak_bytes, "cpu", h->cat, n, err)))
            break;
        if (h->unit)
            rc = map_units(c, h, first, k, j, err);
        else if (mprotect(p, n, PROT_READ | PROT_WRITE) != 0)
            rc = dt_err_set(err, -ENOMEM, "cpu backend: cannot commit %zu bytes (%.1f MiB in "
                            "use): %s", n, (double)c->cur_bytes / 1048576.0, strerror(errno));
        if (rc)
            break;
        if (c->poison)
            memset(p, 0xFF, n);
        mark(h, k, j, false);
        h->released -= n;
        charge(c, h->cat, n);
    }
    evict(c, h->cat); /* what this commit did not need of the category's cache */
    return rc;
}

static void cpu_free(dt_backend *be, void *p)
{
    if (!p)
        return;
    dt_cpu *c = dt_cpu_of(be);
    cpu_hdr h = *hdr_of(p);
    uncharge(c, h.cat, h.bytes - h.released);
    const size_t g = granule_size();
    char *first = granule0(p);
    if (h.unit) { /* pooled granules: pages back to the kernel, the addresses plain memory again */
        const size_t n = granule_count(p, &h);
        for (size_t a = 0, b; a < n; a = b) {
            for (b = a + 1; b < n && pooled(&h, a) == pooled(&h, b) &&
                            (!pooled(&h, a) || h.unit[b] == h.unit[b - 1] + 1);)
                b++;
            if (!pooled(&h, a))
                continue;
            if (mmap(first + a * g, (b - a) * g, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
                DT_WARN("cpu backend: remapping %zu bytes at %p failed: %s", (b - a) * g,
                        (void *)(first + a * g), strerror(errno));
            dt_cpu_pool_give_back(&c->pool, h.unit[a], b - a);
        }
        free(h.unit);
    }
    if (h.rel && h.released) { /* malloc may hand these pages out again: make them usable */
        for (size_t k = 0, j; next_run(&h, granule_count(p, &h), true, &k, &j); k = j)
            if (mprotect(first + k * g, (j - k) * g, PROT_READ | PROT_WRITE) != 0)
                DT_WARN("cpu backend: mprotect of %zu bytes at %p failed: %s", (j - k) * g,
                        (void *)(first + k * g), strerror(errno));
    }
    free(h.rel);
    free((char *)p - h.lead);
}

static size_t cpu_mem_granule(dt_backend *be, const void *base)
{
    (void)be;
    (void)base;
    return granule_size();
}

static void cpu_memcpy(dt_backend *be, void *dst, const void *src, size_t bytes)
{
    DT_CPU_PROF_BEGIN(be);
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    DT_CPU_PROF_END(be, DT_CPU_OP_MEMCPY, 0);
}

static void cpu_memset_zero(dt_backend *be, void *p, size_t bytes)
{
    DT_CPU_PROF_BEGIN(be);
    if (bytes)
        memset(p, 0, bytes);
    DT_CPU_PROF_END(be, DT_CPU_OP_MEMSET, 0);
}

static void cpu_synchronize(dt_backend *be) { (void)be; }

static size_t cpu_peak_bytes(dt_backend *be) { return dt_cpu_of(be)->peak_bytes; }

static void cpu_mem_reset_peak(dt_backend *be)
{
    dt_mem_stats *m = &dt_cpu_of(be)->mem;
    memcpy(m->peak, m->cur, sizeof m->peak);
    m->total_peak = m->total;
}

bool dt_cpu_scratch_reserve(dt_cpu *c, size_t n)
{
    if (n <= c->scratch_cap)
        return true;
    float *p = NULL;
    if (posix_memalign((void **)&p, ALLOC_ALIGN, n * sizeof(float)) != 0)
        return false;
    free(c->scratch);
    c->scratch = p;
    c->scratch_cap = n;
    return true;
}

int dt_cpu_backend_create(dt_backend **out, const dt_backend_opts *opts, dt_err *err)
{
    dt_backend_opts def;
    if (!opts) {
        dt_backend_opts_default(&def);
        opts = &def;
    }
    *out = NULL;
    dt_backend *be = calloc(1, sizeof *be);
    dt_cpu *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return dt_err_set(err, -ENOMEM, "cpu backend: out of memory creating the backend");
    }
    c->threads = opts->threads > 0 ? opts->threads : 1;
    c->mem_limit = opts->mem_limit;
    dt_cpu_pool_open(&c->pool, granule_size());
    const char *poison = dt_env("DTRAIN_CPU_MEM_POISON");
    c->poison = poison && strcmp(poison, "0") != 0;
    openblas_set_num_threads(c->threads);
    if (opts->precision != DT_PREC_FP32)
        DT_INFO("cpu backend: computes in float32 (the %s precision setting applies to cuda)",
                opts->precision == DT_PREC_BF16 ? "bf16" : "fp16");
    for (int i = 0; i < DT_CPU_OP_COUNT; i++)
        c->stats[i] = (dt_op_stat){.name = op_info[i].name, .gemm = op_info[i].gemm};

    be->name = "cpu";
    be->kind = DT_BACKEND_CPU;
    be->host_memory = true;
    be->impl = c;
    be->precision = DT_PREC_FP32;
    be->close = cpu_close;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->memcpy_h2d = cpu_memcpy;
    be->memcpy_d2h = cpu_memcpy;
    be->memcpy_d2d = cpu_memcpy;
    be->memset_zero = cpu_memset_zero;
    be->synchronize = cpu_synchronize;
    be->peak_bytes = cpu_peak_bytes;
    be->mem_category = cpu_mem_category;
    be->mem_stats = cpu_mem_stats;
    be->mem_external = cpu_mem_external;
    be->mem_release = cpu_mem_release;
    be->mem_granule = cpu_mem_granule;
    be->mem_commit = cpu_mem_commit;
    be->mem_reset_peak = cpu_mem_reset_peak;
    be->profile_enable = cpu_profile_enable;
    be->profile_read = cpu_profile_read;

    be->matmul_fwd = dt_cpu_matmul_fwd;
    be->matmul_bwd = dt_cpu_matmul_bwd;
    be->attention_sizes = dt_cpu_attention_sizes;
    be->attention_fwd = dt_cpu_attention_fwd;
    be->attention_bwd = dt_cpu_attention_bwd;
    be->attention_pad_fwd = dt_cpu_attention_pad_fwd;
    be->attention_pad_bwd = dt_cpu_attention_pad_bwd;
    be->conv2d_fwd = dt_cpu_conv2d_fwd;
    be->conv2d_bwd = dt_cpu_conv2d_bwd;

    be->bias_add = dt_cpu_bias_add;
    be->bias_bwd = dt_cpu_bias_bwd;
    be->layernorm_fwd = dt_cpu_layernorm_fwd;
    be->layernorm_bwd = dt_cpu_layernorm_bwd;
    be->gelu_fwd = dt_cpu_gelu_fwd;
    be->gelu_bwd = dt_cpu_gelu_bwd;
    be->gelu_erf_fwd = dt_cpu_gelu_erf_fwd;
    be->gelu_erf_bwd = dt_cpu_gelu_erf_bwd;
    be->tanh_fwd = dt_cpu_tanh_fwd;
    be->tanh_bwd = dt_cpu_tanh_bwd;
    be->relu_fwd = dt_cpu_relu_fwd;
    be->relu_bwd = dt_cpu_relu_bwd;
    be->residual_fwd = dt_cpu_residual_fwd;
    be->accumulate = dt_cpu_accumulate;
    be->scale = dt_cpu_scale;
    be->embedding_fwd = dt_cpu_embedding_fwd;
    be->embedding_bwd = dt_cpu_embedding_bwd;
    be->xent_fwd_bwd = dt_cpu_xent_fwd_bwd;
    be->embedding_vp_fwd = dt_cpu_embedding_vp_fwd;
    be->embedding_vp_bwd = dt_cpu_embedding_vp_bwd;
    be->xent_vp_max = dt_cpu_xent_vp_max;
    be->xent_vp_sums = dt_cpu_xent_vp_sums;
    be->xent_vp_finish = dt_cpu_xent_vp_finish;
    be->rmsnorm_fwd = dt_cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = dt_cpu_rmsnorm_bwd;
    be->swiglu_fwd = dt_cpu_swiglu_fwd;
    be->swiglu_bwd = dt_cpu_swiglu_bwd;
    be->rope_qkv_fwd = dt_cpu_rope_qkv_fwd;
    be->rope_qkv_bwd = dt_cpu_rope_qkv_bwd;
    be->bn_stats = dt_cpu_bn_stats;
    be->bn_fwd_apply = dt_cpu_bn_fwd_apply;
    be->bn_fwd_eval = dt_cpu_bn_fwd_eval;
    be->bn_bwd_reduce = dt_cpu_bn_bwd_reduce;
    be->bn_bwd_apply = dt_cpu_bn_bwd_apply;
    be->maxpool_fwd = dt_cpu_maxpool_fwd;
    be->maxpool_bwd = dt_cpu_maxpool_bwd;
    be->avgpool_fwd = dt_cpu_avgpool_fwd;
    be->avgpool_bwd = dt_cpu_avgpool_bwd;

    be->sgd_update = dt_cpu_sgd_update;
    be->adamw_update = dt_cpu_adamw_update;
    be->sumsq = dt_cpu_sumsq;
    be->count_nonfinite = dt_cpu_count_nonfinite;
    be->to_half = dt_cpu_to_half;
    be->from_half = dt_cpu_from_half;

    *out = be;
    return 0;
}

int dt_cpu_backend_bind_blas_threads(void)
{
    cpu_set_t set;
    int n = 0;
    if (!openblas_setaffinity || sched_getaffinity(0, sizeof set, &set) != 0)
        return 0;
    for (int i = 0; i < openblas_get_num_threads(); i++)
        n += openblas_setaffinity(i, sizeof set, &set) == 0;
    return n;
}
