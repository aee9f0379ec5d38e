/* test_memory.c - memory accounting by category (kernels/backend_ops.h, dt_mem_stats): what the
 * CPU backend's allocator charges to each category, its peaks, mem_release / mem_commit, and
 * the categories the model zoo and the optimiser tag their allocations with. */
#include <cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "kernels/backend.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"
#include "tests/harness.h"

static dt_backend *cpu(void)
{
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    return be;
}

#define CHECK_OK(expr, errp) DT_CHECK_MSG((expr) == 0, "%s", (errp)->msg)

static size_t sum_cur(const dt_mem_stats *s)
{
    size_t t = 0;
    for (int i = 0; i < DT_MEM_CAT_COUNT; i++)
        t += s->cur[i];
    return t;
}

static void test_names(void)
{
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_PARAMS), "params");
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_GRADS), "grads");
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_OPTIM), "optim");
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_ACTS), "activations");
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_COMM), "comm");
    DT_CHECK_STR(dt_mem_cat_name(DT_MEM_OTHER), "other");
    DT_CHECK_STR(dt_mem_cat_name((dt_mem_cat)99), "unknown");
}

/* Categories add up to the total, each keeps its own peak, the total's peak is the largest sum
 * at one time (not the sum of the peaks), free gives back to the category charged at alloc. */
static void test_categories_and_peaks(void)
{
    dt_backend *be = cpu();
    dt_err err = {0};
    dt_mem_stats s;
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.total, 0);
    DT_CHECK_INT(s.total_peak, 0);

    void *other = NULL, *p = NULL, *g = NULL, *a1 = NULL, *a2 = NULL;
    DT_REQUIRE_OK(be->alloc(be, &other, 100, &err), &err); /* untagged: other */
    DT_CHECK_INT(dt_mem_tag(be, DT_MEM_PARAMS), DT_MEM_OTHER);
    DT_REQUIRE_OK(be->alloc(be, &p, 1000, &err), &err);
    DT_CHECK_INT(dt_mem_tag(be, DT_MEM_GRADS), DT_MEM_PARAMS);
    DT_REQUIRE_OK(be->alloc(be, &g, 1000, &err), &err);
    dt_mem_tag(be, DT_MEM_ACTS);
    DT_REQUIRE_OK(be->alloc(be, &a1, 300000, &err), &err); /* page-aligned size class */
    dt_mem_tag(be, DT_MEM_OTHER);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_OTHER], 100);
    DT_CHECK_INT(s.cur[DT_MEM_PARAMS], 1000);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 1000);
    DT_CHECK_INT(s.cur[DT_MEM_ACTS], 300000);
    DT_CHECK_INT(s.cur[DT_MEM_OPTIM], 0);
    DT_CHECK_INT(s.cur[DT_MEM_COMM], 0);
    DT_CHECK_INT(s.total, 302100);
    DT_CHECK_INT(sum_cur(&s), s.total);
    DT_CHECK_INT(s.total_peak, 302100);
    DT_CHECK_INT(be->peak_bytes(be), 302100);

    /* the current category does not matter at free: a1 goes back to activations */
    dt_mem_tag(be, DT_MEM_COMM);
    be->free(be, a1);
    DT_REQUIRE_OK(be->alloc(be, &a2, 5000, &err), &err); /* comm */
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_ACTS], 0);
    DT_CHECK_INT(s.peak[DT_MEM_ACTS], 300000);
    DT_CHECK_INT(s.cur[DT_MEM_COMM], 5000);
    DT_CHECK_INT(s.total, 7100);
    DT_CHECK_INT(sum_cur(&s), s.total);
    DT_CHECK_INT(s.total_peak, 302100); /* the peak stays */
    /* peaks at different times: the total's peak is less than the sum of the peaks */
    size_t sum_peaks = 0;
    for (int i = 0; i < DT_MEM_CAT_COUNT; i++)
        sum_peaks += s.peak[i];
    DT_CHECK_INT(sum_peaks, 307100);
    DT_CHECK(s.total_peak < sum_peaks);

    /* external memory (communicator memory) is counted, and given back */
    dt_mem_external(be, DT_MEM_COMM, 1 << 20, true);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_COMM], 5000 + (1 << 20));
    DT_CHECK_INT(s.total_peak, 302100 > 7100 + (1 << 20) ? 302100 : 7100 + (1 << 20));
    dt_mem_external(be, DT_MEM_COMM, 1 << 20, false);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_COMM], 5000);

    be->free(be, other);
    be->free(be, p);
    be->free(be, g);
    be->free(be, a2);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.total, 0);
    for (int i = 0; i < DT_MEM_CAT_COUNT; i++)
        DT_CHECK_INT(s.cur[i], 0);
    dt_backend_close(be);
}

/* job.device_memory on the cpu backend: allocations that fit the budget succeed, the one that
 * would take the total (every category) beyond it is refused with -ENOMEM and a message naming
 * the request, the budget and the holdings by category, and nothing is charged for it; a freed
 * allocation makes room again; mem_commit is held to the same budget. */
static void test_budget(void)
{
    dt_backend_opts o;
    dt_backend_opts_default(&o);
    o.mem_limit = 4u << 20;
    dt_backend *be = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, &o, &err), &err);
    void *a = NULL, *b = NULL, *c = NULL;
    dt_mem_tag(be, DT_MEM_PARAMS);
    DT_REQUIRE_OK(be->alloc(be, &a, 2u << 20, &err), &err);
    dt_mem_tag(be, DT_MEM_OPTIM);
    DT_REQUIRE_OK(be->alloc(be, &b, (2u << 20) - 4096, &err), &err);
    dt_mem_tag(be, DT_MEM_GRADS);
    DT_CHECK(be->alloc(be, &c, 8192, &err) == -ENOMEM && c == NULL);
    DT_CHECK_MSG(strstr(err.msg, "out of device memory: asked for 8192 bytes (0.01 MiB) of grads") &&
                     strstr(err.msg, "of the 4.00 MiB budget (job.device_memory = 4194304)") &&
                     strstr(err.msg, "params 2.00 MiB") && strstr(err.msg, "optim 2.00 MiB") &&
                     strstr(err.msg, "peak so far 4.00 MiB"),
                 "%s", err.msg);
    dt_mem_stats st;
    dt_mem_read(be, &st);
    DT_CHECK(st.total == (4u << 20) - 4096 && st.cur[DT_MEM_GRADS] == 0);
    CHECK_OK(be->alloc(be, &c, 4096, &err), &err); /* exactly the budget */
    be->free(be, c);
    be->free(be, b);
    CHECK_OK(be->alloc(be, &c, 2u << 20, &err), &err); /* room again */
    /* commit: a released range is taken back only within the budget */
    size_t g = dt_mem_granule(be, a);
    if (g && g <= (1u << 20)) {
        be->mem_release(be, a, 0, 2u << 20);
        dt_mem_read(be, &st);
        DT_CHECK(st.total == 2u << 20);
        void *d = NULL;
        CHECK_OK(be->alloc(be, &d, 1u << 20, &err), &err);
        DT_CHECK(be->mem_commit(be, a, 0, 2u << 20, &err) == -ENOMEM);
        DT_CHECK(strstr(err.msg, "of params") != NULL);
        dt_mem_read(be, &st);
        DT_CHECK_MSG(st.total <= 4u << 20, "%zu", st.total);
        be->free(be, d);
        CHECK_OK(be->mem_commit(be, a, 0, 2u << 20, &err), &err);
    }
    be->free(be, a);
    be->free(be, c);
    dt_backend_close(be);
    /* no budget (0): the same requests are all granted */
    o.mem_limit = 0;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, &o, &err), &err);
    CHECK_OK(be->alloc(be, &a, 8u << 20, &err), &err);
    be->free(be, a);
    dt_backend_close(be);
}

/* Resident set of this process in pages (statm), for "really released". */
static long rss_pages(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = -1;
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &rss) != 2)
            rss = -1;
        fclose(f);
    }
    return rss;
}

/* Whether reading the byte at p kills a forked child with SIGSEGV (a released granule). */
static bool read_faults(const volatile unsigned char *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        _exit(p[0] == 0x5a ? 3 : 4);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return false;
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

/* The backend's granule (the page, or DTRAIN_CPU_MEM_GRANULE), asked of a probe allocation. */
static size_t granule_of(dt_backend *be)
{
    dt_err err = {0};
    void *p = NULL;
    if (be->alloc(be, &p, 1, &err) != 0)
        return 0;
    size_t g = dt_mem_granule(be, p);
    be->free(be, p);
    return g;
}

/* mem_release gives whole granules back (pages; counted once however often) and makes them
 * untouchable, mem_commit takes them back (filled with 0xFF, not zero: the contract promises no
 * contents); free of a partly released allocation gives back only what is still resident. Run
 * in granules, so it holds under DTRAIN_CPU_MEM_GRANULE as well ("pages" below are granules). */
static void test_release_commit(void)
{
    dt_backend *be = cpu();
    dt_err err = {0};
    const size_t ps = granule_of(be);
    DT_REQUIRE(ps >= (size_t)sysconf(_SC_PAGESIZE) && (ps & (ps - 1)) == 0);
    const size_t bytes = 64 * ps + 100;
    float *x = NULL;
    dt_mem_tag(be, DT_MEM_GRADS);
    DT_REQUIRE_OK(be->alloc(be, (void **)&x, bytes, &err), &err);
    DT_CHECK((uintptr_t)x % ps == 0); /* large allocations start on a page */
    memset(x, 1, bytes);              /* resident */
    dt_mem_stats s;
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes);

    /* pages 8..39 (32 pages), given as a range with ragged ends: only whole pages inside count */
    be->mem_release(be, x, 8 * ps - 10, 32 * ps + 20);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes - 32 * ps);
    DT_CHECK_INT(s.total, bytes - 32 * ps);
    DT_CHECK_INT(s.peak[DT_MEM_GRADS], bytes);
    /* released pages cannot be touched (as cuda's unmapped granules); their neighbours can */
    DT_CHECK(read_faults((unsigned char *)x + 9 * ps));
    DT_CHECK(read_faults((unsigned char *)x + 8 * ps));
    DT_CHECK(!read_faults((unsigned char *)x + 8 * ps - 1) && ((unsigned char *)x)[7 * ps] == 1);
    DT_CHECK(((unsigned char *)x)[40 * ps] == 1);

    /* releasing again, and an overlapping range, counts only the new pages (40..47) */
    be->mem_release(be, x, 8 * ps, 40 * ps);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes - 40 * ps);
    /* a range inside one page releases nothing */
    be->mem_release(be, x, 50 * ps + 1, ps - 2);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes - 40 * ps);

    /* commit a range touching pages 10..11 (ragged): both come back */
    DT_REQUIRE_OK(be->mem_commit(be, x, 10 * ps + 5, ps, &err), &err);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes - 38 * ps);
    /* usable again, every byte 0xFF (a NaN in every float), page 9 and 12 still released */
    DT_CHECK(((unsigned char *)x)[10 * ps] == 0xFF && ((unsigned char *)x)[12 * ps - 1] == 0xFF);
    DT_CHECK(x[10 * ps / sizeof(float)] != x[10 * ps / sizeof(float)]);
    DT_CHECK(read_faults((unsigned char *)x + 12 * ps) && read_faults((unsigned char *)x + 10 * ps - 1));
    memset((char *)x + 10 * ps, 2, 2 * ps);
    /* pages that were not released keep their contents through a commit */
    DT_REQUIRE_OK(be->mem_commit(be, x, 0, 11 * ps, &err), &err);
    DT_CHECK(((unsigned char *)x)[7 * ps] == 1 && ((unsigned char *)x)[10 * ps] == 2);
    DT_CHECK(((unsigned char *)x)[8 * ps] == 0xFF); /* 8, 9 came back */
    be->mem_release(be, x, 8 * ps, 2 * ps);
    /* committing resident pages counts nothing */
    DT_REQUIRE_OK(be->mem_commit(be, x, 0, 4 * ps, &err), &err);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], bytes - 38 * ps);
    DT_CHECK_INT(s.peak[DT_MEM_GRADS], bytes);

    /* the statistics' peaks start again from what is resident; peak_bytes (the run's) stays */
    size_t run_peak = be->peak_bytes(be);
    dt_mem_reset_peak(be);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.peak[DT_MEM_GRADS], bytes - 38 * ps);
    DT_CHECK_INT(s.total_peak, s.total);
    DT_REQUIRE_OK(be->mem_commit(be, x, 12 * ps, ps, &err), &err); /* page 12 comes back */
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.peak[DT_MEM_GRADS], bytes - 37 * ps);
    DT_CHECK_INT(be->peak_bytes(be), run_peak);

    /* free gives back what is resident; nothing is left */
    be->free(be, x);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 0);
    DT_CHECK_INT(s.total, 0);

    /* the memory really goes back: 8 MiB released, the resident set drops by most of it
     * (other pages of the process may come and go meanwhile: stdio, sanitizer shadow) */
    char *big = NULL;
    const size_t npages = (8u << 20) / ps;
    DT_REQUIRE_OK(be->alloc(be, (void **)&big, npages * ps, &err), &err);
    memset(big, 3, npages * ps);
    rss_pages(); /* stdio's buffers, once */
    long before = rss_pages();
    be->mem_release(be, big, 0, npages * ps);
    long after = rss_pages();
    if (before > 0 && after > 0)
        DT_CHECK_MSG(before - after >= (long)npages * 3 / 4, "rss %ld -> %ld pages (%zu released)",
                     before, after, npages);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 0);
    be->free(be, big);

    /* a small (heap, 64-byte aligned) allocation: only the pages wholly inside */
    char *y = NULL;
    DT_REQUIRE_OK(be->alloc(be, (void **)&y, 3 * ps, &err), &err);
    be->mem_release(be, y, 0, 3 * ps);
    dt_mem_read(be, &s);
    size_t inner = ((uintptr_t)y % ps == 0 ? 3 : 2) * ps;
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 3 * ps - inner);
    DT_REQUIRE_OK(be->mem_commit(be, y, 0, 3 * ps, &err), &err);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 3 * ps);
    be->free(be, y);
    dt_backend_close(be);
}

static dt_model_config gpt_cfg(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_GPT;
    c.shape.kind = DT_SAMPLE_TOKENS;
    c.shape.seq_len = 10;
    c.shape.vocab_size = 23;
    c.max_batch = 2;
    c.seed = 42;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.block_size = 12;
    return c;
}

static dt_model_config resnet_cfg(void)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_RESNET;
    c.shape.kind = DT_SAMPLE_IMAGE;
    c.shape.channels = 3;
    c.shape.height = 8;
    c.shape.width = 8;
    c.shape.input_dim = 3 * 8 * 8;
    c.shape.n_classes = 4;
    c.max_batch = 4;
    c.seed = 44;
    c.depth = 8;
    c.width = 4;
    c.bn_momentum = 0.1f;
    c.bn_eps = 1e-5f;
    return c;
}

/* A model's parameters are 4 x num_params bytes, its gradients the same, its buffers other,
 * the rest activations; AdamW's state is 8 x num_params, SGD with momentum's 4 x. */
static void check_model(const dt_model_config *cfg)
{
    dt_backend *be = cpu();
    dt_err err = {0};
    dt_model *m = NULL;
    DT_REQUIRE_OK(dt_model_create(&m, cfg, be, NULL, &err), &err);
    dt_mem_stats s;
    dt_mem_read(be, &s);
    DT_CHECK_MSG(s.cur[DT_MEM_PARAMS] == 4 * m->num_params, "%s: params %zu bytes for %zu",
                 dt_model_arch_name(cfg->arch), s.cur[DT_MEM_PARAMS], m->num_params);
    DT_CHECK_INT(s.cur[DT_MEM_GRADS], 4 * m->num_params);
    DT_CHECK_INT(s.cur[DT_MEM_OTHER], 4 * m->num_buffers);
    DT_CHECK(s.cur[DT_MEM_ACTS] > 0);
    DT_CHECK_INT(s.cur[DT_MEM_OPTIM], 0);
    DT_CHECK_INT(s.cur[DT_MEM_COMM], 0);
    DT_CHECK_INT(dt_mem_tag(be, DT_MEM_OTHER), DT_MEM_OTHER); /* create restored it */

    dt_optim_config oc = {.kind = DT_OPTIM_ADAMW, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    dt_optim *o = NULL;
    DT_REQUIRE_OK(dt_optim_create(&o, &oc, be, m->tensors, m->num_tensors, m->num_params, &err),
                  &err);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_OPTIM], 8 * m->num_params);
    dt_optim_free(o);
    oc = (dt_optim_config){.kind = DT_OPTIM_SGD, .momentum = 0.9};
    DT_REQUIRE_OK(dt_optim_create(&o, &oc, be, m->tensors, m->num_tensors, m->num_params, &err),
                  &err);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_OPTIM], 4 * m->num_params);
    DT_CHECK_INT(s.peak[DT_MEM_OPTIM], 8 * m->num_params);
    DT_CHECK_INT(sum_cur(&s), s.total);
    dt_optim_free(o);
    dt_model_free(m);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.total, 0);
    dt_backend_close(be);
}

static void test_gpt_tags(void)
{
    dt_model_config c = gpt_cfg();
    check_model(&c);
}

static void test_resnet_tags(void)
{
    dt_model_config c = resnet_cfg();
    check_model(&c);
}

/* The same contract without the page pool (DTRAIN_CPU_MEM_POOL=0: released pages go to the
 * kernel and come back as fresh ones). */
static void test_release_commit_no_pool(void)
{
    setenv("DTRAIN_CPU_MEM_POOL", "0", 1);
    test_release_commit();
    unsetenv("DTRAIN_CPU_MEM_POOL");
}

/* The page pool: a released granule that had been committed keeps its pages for the next commit
 * of its category (seen without the poison fill: the next range reads what the last one held,
 * and the resident set does not grow), charged to nothing in between; what a commit leaves of
 * the cache, and the whole cache at any allocation, goes back to the kernel (fresh pages read
 * as zero). */
static void test_pool_recycles(void)
{
    setenv("DTRAIN_CPU_MEM_POISON", "0", 1);
    dt_backend *be = cpu();
    unsetenv("DTRAIN_CPU_MEM_POISON");
    dt_err err = {0};
    const size_t g = granule_of(be), n = g < (512u << 10) ? (2u << 20) / g : 4; /* >= 2 MiB */
    unsigned char *x = NULL;
    dt_mem_tag(be, DT_MEM_PARAMS);
    DT_REQUIRE_OK(be->alloc(be, (void **)&x, 4 * n * g, &err), &err);
    memset(x, 1, 4 * n * g);
    dt_mem_stats s;
    be->mem_release(be, x, 0, 4 * n * g); /* its own pages: to the kernel */
    DT_REQUIRE_OK(be->mem_commit(be, x, 0, n * g, &err), &err); /* window A: new pool pages */
    DT_CHECK(x[0] == 0 && x[n * g - 1] == 0);
    memset(x, 0x5a, n * g);
    rss_pages();
    long before = rss_pages();
    be->mem_release(be, x, 0, n * g);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_PARAMS], 0); /* the cache is charged to nothing */
    DT_CHECK(read_faults(x));
    DT_REQUIRE_OK(be->mem_commit(be, x, n * g, n * g, &err), &err); /* window B: A's pages */
    long after = rss_pages();
    DT_CHECK_MSG(x[n * g] == 0x5a && x[2 * n * g - 1] == 0x5a, "window B reads %#x, not A's 0x5a",
                 x[n * g]);
    if (before > 0 && after > 0)
        DT_CHECK_MSG(after - before < (long)(n * g / (size_t)sysconf(_SC_PAGESIZE)) / 4,
                     "rss %ld -> %ld pages: B took new pages", before,
                     after);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_PARAMS], n * g);
    /* B released, a commit of half as much: the other half of the cache goes back */
    be->mem_release(be, x, n * g, n * g);
    DT_REQUIRE_OK(be->mem_commit(be, x, 2 * n * g, n / 2 * g, &err), &err);
    DT_CHECK(x[2 * n * g] == 0x5a);
    DT_REQUIRE_OK(be->mem_commit(be, x, 3 * n * g, n / 2 * g, &err), &err);
    DT_CHECK_MSG(x[3 * n * g] == 0, "the cache's leftover was not given back");
    /* an allocation empties the cache */
    be->mem_release(be, x, 2 * n * g, 2 * n * g);
    void *y = NULL;
    DT_REQUIRE_OK(be->alloc(be, &y, 64, &err), &err);
    DT_REQUIRE_OK(be->mem_commit(be, x, 0, n * g, &err), &err);
    DT_CHECK(x[0] == 0 && x[n * g - 1] == 0);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.cur[DT_MEM_PARAMS], n * g + 64);
    be->free(be, y);
    be->free(be, x);
    dt_mem_read(be, &s);
    DT_CHECK_INT(s.total, 0);
    /* freed, the addresses are plain memory again (malloc may hand them out) */
    DT_REQUIRE_OK(be->alloc(be, (void **)&x, 4 * n * g, &err), &err);
    memset(x, 7, 4 * n * g);
    be->free(be, x);
    dt_backend_close(be);
}

/* ---- the dtrain binary: the first step and save steps against the steady state ------------- */

#define B_STEPS 7                   /* saves after steps 3 and 6: records 4 and 7 hold them */
#define B_IO (1u << 20)             /* checkpoint.io_buffer_mb = 1 */
#define B_SLACK (64u << 10)         /* a save's few bytes of collective scratch (its outcome) */

static const char *const cat_keys[] = {"params", "grads", "optim", "activations", "comm", "other"};

/* Rank 0's per-record peaks from metrics.jsonl at path: total[i] and by category cat[i][c] for
 * record i (step i + 1, job.log_every = 1: each record's own step). Returns the records read. */
static int read_peaks(const char *path, double *total, double (*cat)[6], int max)
{
    char *text = dt_test_slurp(path);
    int n = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line && n < max;
         line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cJSON *ty = cJSON_GetObjectItem(o, "type"), *mp = cJSON_GetObjectItem(o, "mem_peak_bytes");
        if (o && cJSON_IsString(ty) && !strcmp(ty->valuestring, "train") && mp) {
            total[n] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "peak_mem_bytes"));
            for (int c = 0; c < 6; c++)
                cat[n][c] = cJSON_GetNumberValue(cJSON_GetObjectItem(mp, cat_keys[c]));
            n++;
        }
        cJSON_Delete(o);
    }
    free(text);
    return n;
}

/* A GPT of 3.2 M parameters on 2 ranks at parallel.zero = zero, saving after steps 3 and 6
 * (checkpoint.sharded as given, in the background), io_buffer 1 MiB: rank 0's peak on the first
 * step and on the records that hold a save is at most the steady state's (steps 2 and 3: no
 * first step, no save yet) plus the one I/O buffer, in total and in every category (only
 * "other", where the buffer is charged, may grow, by the buffer). */
static void check_bounded(int zero, bool sharded)
{
    char dir[512], job[600], path[600], *out = NULL;
    snprintf(dir, sizeof dir, "%s/bounded-z%d-%d", dt_test_tmpdir(), zero, sharded);
    snprintf(job, sizeof job, "%s.ini", dir);
    DT_REQUIRE(dt_test_write_file(job,
                                  "[job]\ndevice = cpu\ncpu_bind = none\nlog_every = 1\n"
                                  "[model]\ntype = gpt\npreset = gpt-tiny\nn_embd = 256\n"
                                  "n_layer = 4\nn_head = 4\nblock_size = 32\n"
                                  "[data]\ntype = synthetic\nseq_len = 32\n"
                                  "[train]\nbatch_size = 2\noptimizer = adamw\n"
                                  "[checkpoint]\nevery = 3\nio_buffer_mb = 1\n") == 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s --standalone --nproc-per-node=2 --max-restarts=0 %s parallel.zero=%d "
             "checkpoint.sharded=%s train.steps=%d job.output_dir=%s 2>&1",
             dt_test_dtrain_bin(), job, zero, sharded ? "true" : "false", B_STEPS, dir);
    int rc = dt_test_run(cmd, &out, 240);
    DT_CHECK_MSG(rc == 0, "zero=%d sharded=%d exited %d: %.3000s", zero, sharded, rc,
                 out ? out : "");
    DT_CHECK_CONTAINS(out ? out : "", "saved");
    free(out);
    double total[B_STEPS], cat[B_STEPS][6];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    DT_REQUIRE(read_peaks(path, total, cat, B_STEPS) == B_STEPS);
    double steady = DT_MAX(total[1], total[2]), scat[6];
    for (int c = 0; c < 6; c++)
        scat[c] = DT_MAX(cat[1][c], cat[2][c]);
    for (int i = 0; i < B_STEPS; i++) {
        DT_CHECK_MSG(total[i] <= steady + B_IO + B_SLACK,
                     "zero=%d sharded=%d step %d: peak %.0f bytes, steady state %.0f + the "
                     "%u-byte I/O buffer", zero, sharded, i + 1, total[i], steady, B_IO);
        for (int c = 0; c < 6; c++)
            DT_CHECK_MSG(cat[i][c] <= scat[c] + (c == 5 ? B_IO + B_SLACK : 0),
                         "zero=%d sharded=%d step %d: %s peak %.0f bytes, steady state %.0f",
                         zero, sharded, i + 1, cat_keys[c], cat[i][c], scat[c]);
    }
    printf("    zero=%d %s: steady %.3f MiB, first step %.3f, save steps %.3f and %.3f\n", zero,
           sharded ? "sharded" : "whole", steady / 1048576, total[0] / 1048576,
           total[3] / 1048576, total[6] / 1048576);
}

static void test_bounded_steps_ddp_whole(void) { check_bounded(0, false); }

/* checkpoint.host_copy = true: the save copies what it writes to host memory, and that copy is
 * counted: DDP's whole save (rank 0 writes the parameters and the AdamW state, 12 bytes a
 * parameter) shows in the record after it as "other" of at least the parameters' and the
 * optimiser state's bytes, and in peak_mem_bytes. */
static void test_host_copy_counted(void)
{
    char dir[512], job[600], path[600], cmd[2048], *out = NULL;
    snprintf(dir, sizeof dir, "%s/hostcopy", dt_test_tmpdir());
    snprintf(job, sizeof job, "%s.ini", dir);
    DT_REQUIRE(dt_test_write_file(job,
                                  "[job]\ndevice = cpu\ncpu_bind = none\nlog_every = 1\n"
                                  "[model]\ntype = gpt\npreset = gpt-tiny\nn_embd = 256\n"
                                  "n_layer = 4\nn_head = 4\nblock_size = 32\n"
                                  "[data]\ntype = synthetic\nseq_len = 32\n"
                                  "[train]\nbatch_size = 2\noptimizer = adamw\n"
                                  "[checkpoint]\nevery = 3\nhost_copy = true\n") == 0);
    snprintf(cmd, sizeof cmd,
             "%s --standalone --nproc-per-node=2 --max-restarts=0 %s train.steps=4 "
             "job.output_dir=%s 2>&1", dt_test_dtrain_bin(), job, dir);
    int rc = dt_test_run(cmd, &out, 240);
    DT_CHECK_MSG(rc == 0, "exited %d: %.3000s", rc, out ? out : "");
    free(out);
    double total[4], cat[4][6];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    DT_REQUIRE(read_peaks(path, total, cat, 4) == 4);
    double copy = cat[1][0] + cat[1][2]; /* params + optim of the steady state */
    printf("    host copy: steady %.3f MiB, the save's record %.3f MiB (other %.3f, the copy "
           ">= %.3f)\n", total[1] / 1048576, total[3] / 1048576, cat[3][5] / 1048576,
           copy / 1048576);
    DT_CHECK_MSG(cat[3][5] >= copy, "other %.0f bytes at the save, the copy is %.0f", cat[3][5],
                 copy);
    DT_CHECK(total[3] >= DT_MAX(total[1], total[2]) + copy);
}
static void test_bounded_steps_sharded(void)
{
    for (int zero = 0; zero <= 3; zero++)
        check_bounded(zero, true);
}

/* ---- honest figures: the accounted peak against the measured resident set ------------------ */

/* Rank 0's run: the largest run_peak_mem_bytes (the process's accounted peak, set-up included)
 * and the last max_rss_bytes (getrusage's peak RSS) of a GPT of width n_embd, 4 steps with a
 * save after step 2, on nproc ranks at parallel.zero = zero. */
static void run_rss(int nproc, int zero, int n_embd, double *peak, double *rss)
{
    char dir[512], job[600], path[600], cmd[2048], *out = NULL;
    snprintf(dir, sizeof dir, "%s/rss-%d-%d-%d", dt_test_tmpdir(), nproc, zero, n_embd);
    snprintf(job, sizeof job, "%s.ini", dir);
    DT_REQUIRE(dt_test_write_file(job,
                                  "[job]\ndevice = cpu\ncpu_bind = none\nlog_every = 1\n"
                                  "[model]\ntype = gpt\npreset = gpt-tiny\nn_layer = 4\n"
                                  "n_head = 4\nblock_size = 32\n"
                                  "[data]\ntype = synthetic\nseq_len = 32\n"
                                  "[train]\nbatch_size = 2\nsteps = 4\noptimizer = adamw\n"
                                  "[checkpoint]\nevery = 2\n") == 0);
    snprintf(cmd, sizeof cmd,
             "%s --standalone --nproc-per-node=%d --max-restarts=0 %s parallel.zero=%d "
             "model.n_embd=%d job.output_dir=%s 2>&1",
             dt_test_dtrain_bin(), nproc, job, zero, n_embd, dir);
    int rc = dt_test_run(cmd, &out, 240);
    DT_CHECK_MSG(rc == 0, "exited %d: %.3000s", rc, out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *text = dt_test_slurp(path);
    DT_REQUIRE(text != NULL);
    *peak = *rss = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        cJSON *p = cJSON_GetObjectItem(o, "run_peak_mem_bytes");
        cJSON *r = cJSON_GetObjectItem(o, "max_rss_bytes");
        if (p && r) {
            *peak = DT_MAX(*peak, cJSON_GetNumberValue(p));
            *rss = cJSON_GetNumberValue(r);
        }
        cJSON_Delete(o);
    }
    free(text);
    DT_REQUIRE(*peak > 0 && *rss > 0);
}

/* What the allocator accounts is what the process holds: between a GPT of width 128 (about
 * 1 M parameters) and one of width 512 (13 M) the peak RSS grows as the accounted peak does,
 * set-up and a save included, within 10% of the growth + 8 MiB (the allocator's slack, page
 * rounding, the BLAS library's buffers for larger shapes; code and libraries are the same in
 * both and cancel). One rank at stage 0, two at stages 1 and 3. Two DDP ranks on one host are
 * left out: each maps its peer's gradient segment to reduce from it (4 x params more RSS that
 * is the peer's memory), which the accounting rightly does not charge. */
static void test_rss_matches_accounting(void)
{
#if defined(__SANITIZE_ADDRESS__)
    /* ASan's shadow memory, redzones and quarantine grow the resident set with every
     * allocation (+245 MiB of RSS against +189 accounted at 1 rank): not this test's to judge */
    DT_SKIP("built with AddressSanitizer: its shadow memory and quarantine are in the RSS");
#endif
    static const int cases[][2] = {{1, 0}, {2, 1}, {2, 3}}; /* nproc, zero */
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        double p0, r0, p1, r1;
        run_rss(cases[i][0], cases[i][1], 128, &p0, &r0);
        run_rss(cases[i][0], cases[i][1], 512, &p1, &r1);
        double dp = p1 - p0, dr = r1 - r0, allow = 0.10 * dp + 8.0 * 1048576;
        printf("    %d rank(s) zero=%d: accounted peak %.1f -> %.1f MiB (+%.1f), peak RSS %.1f -> "
               "%.1f MiB (+%.1f)\n", cases[i][0], cases[i][1], p0 / 1048576, p1 / 1048576,
               dp / 1048576, r0 / 1048576, r1 / 1048576, dr / 1048576);
        DT_CHECK_MSG(fabs(dr - dp) <= allow,
                     "%d rank(s) zero=%d: RSS grew %.1f MiB, the accounted peak %.1f MiB "
                     "(allowance %.1f MiB)", cases[i][0], cases[i][1], dr / 1048576, dp / 1048576,
                     allow / 1048576);
    }
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"names", test_names, 0},
        {"categories_and_peaks", test_categories_and_peaks, 0},
        {"release_commit", test_release_commit, 0},
        {"release_commit_no_pool", test_release_commit_no_pool, 0},
        {"pool_recycles", test_pool_recycles, 0},
        {"budget", test_budget, 0},
        {"gpt_tags", test_gpt_tags, 0},
        {"resnet_tags", test_resnet_tags, 0},
        {"bounded_steps_ddp_whole", test_bounded_steps_ddp_whole, 120},
        {"host_copy_counted", test_host_copy_counted, 120},
        {"bounded_steps_sharded", test_bounded_steps_sharded, 400},
        {"rss_matches_accounting", test_rss_matches_accounting, 400},
    };
    return dt_test_main("test_memory", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
