// backend.cu - the CUDA backend of kernels/backend_ops.h, built as libdtrain_cuda.so.
//
// The dtrain binary links no CUDA library: it dlopen()s this object when device = cuda (or auto)
// and calls dt_cuda_backend_create. This file holds the instance lifecycle, device memory, copies,
// profiling and the op table; the kernels live in gemm.cu and ops.cu (see cuda_internal.h).
//
// Memory: two allocators per instance, both charging one set of statistics (cu->mem, through core.cu's dt_cuda_mem_charge),
// so peak_bytes and mem_stats are the whole device footprint of the instance, not only what alloc
// returned.
//   - Allocations of at least the driver's VMM granule (cuMemGetAllocationGranularity, minimum:
//     2 MiB on current GPUs) are virtual ranges backed granule by granule (vmm.cu), rounded up to
//     whole granules: mem_granule reports the granule, mem_release unmaps the granules once the
//     compute stream has finished the work issued before it (a deferred-release queue of events,
//     never a device synchronisation), mem_commit maps new ones. A released granule stops
//     counting in the statistics at the mem_release call (the caller's view), although the
//     device may hold it until the stream gets there.
//   - Everything smaller, and the backend's own cuBLASLt workspace, attention and conversion
//     scratch and cuDNN workspace, comes from the arena: device memory from the driver in chunks
//     of at least 64 MiB (cudaMalloc is slow and synchronising, and a training step allocates
//     nothing after start-up), blocks carved best-fit, 256-byte aligned, coalesced on free. Arena
//     blocks cannot be given back in part: mem_granule 0, mem_release does nothing.
// Without virtual memory management (a driver without the entry points, a device without the
// attribute, or DTRAIN_CUDA_VMM=0) the arena serves everything, as before.
//
// Streams: one non-blocking compute stream per instance; every op, copy and memset runs on it in
// issue order, so no op needs host synchronisation except the read-backs (memcpy_d2h, sumsq,
// count_nonfinite, xent's valid_count) and synchronize.
//
// Left out on purpose: CUDA graphs (the op table is called op by op from C), multi-stream
// compute, unified memory.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <map>
#include <new>
#include <vector>

#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "common/env.h"
}

#define DT_CU_EXPORT extern "C" __attribute__((visibility("default")))

static const size_t ARENA_ALIGN = 256;
static const size_t ARENA_CHUNK_MIN = (size_t)64 << 20;
static const size_t ARENA_CHUNK_ROUND = (size_t)2 << 20;
static const size_t LT_WORKSPACE = (size_t)32 << 20; // cuBLASLt on Hopper wants 32 MiB

static const struct {
    const char *name;
    bool gemm;
} op_info[DT_CU_OP_COUNT] = {
    /* DT_CU_OP_MEMCPY */ {"memcpy", false},
    /* DT_CU_OP_MEMSET */ {"memset_zero", false},
    /* DT_CU_OP_MATMUL_FWD */ {"matmul_fwd", true},
    /* DT_CU_OP_MATMUL_BWD */ {"matmul_bwd", true},
    /* DT_CU_OP_ATTN_FWD */ {"attention_fwd", true},
    /* DT_CU_OP_ATTN_BWD */ {"attention_bwd", true},
    /* DT_CU_OP_CONV_FWD */ {"conv2d_fwd", true},
    /* DT_CU_OP_CONV_BWD */ {"conv2d_bwd", true},
    /* DT_CU_OP_BIAS_ADD */ {"bias_add", false},
    /* DT_CU_OP_BIAS_BWD */ {"bias_bwd", false},
    /* DT_CU_OP_LAYERNORM_FWD */ {"layernorm_fwd", false},
    /* DT_CU_OP_LAYERNORM_BWD */ {"layernorm_bwd", false},
    /* DT_CU_OP_GELU_FWD */ {"gelu_fwd", false},
    /* DT_CU_OP_GELU_BWD */ {"gelu_bwd", false},
    /* DT_CU_OP_RELU_FWD */ {"relu_fwd", false},
    /* DT_CU_OP_RELU_BWD */ {"relu_bwd", false},
    /* DT_CU_OP_RESIDUAL */ {"residual_fwd", false},
    /* DT_CU_OP_ACCUMULATE */ {"accumulate", false},
    /* DT_CU_OP_SCALE */ {"scale", false},
    /* DT_CU_OP_EMBEDDING_FWD */ {"embedding_fwd", false},
    /* DT_CU_OP_EMBEDDING_BWD */ {"embedding_bwd", false},
    /* DT_CU_OP_XENT */ {"xent_fwd_bwd", false},
    /* DT_CU_OP_BN_STATS */ {"bn_stats", false},
    /* DT_CU_OP_BN_FWD_APPLY */ {"bn_fwd_apply", false},
    /* DT_CU_OP_BN_FWD_EVAL */ {"bn_fwd_eval", false},
    /* DT_CU_OP_BN_BWD_REDUCE */ {"bn_bwd_reduce", false},
    /* DT_CU_OP_BN_BWD_APPLY */ {"bn_bwd_apply", false},
    /* DT_CU_OP_MAXPOOL_FWD */ {"maxpool_fwd", false},
    /* DT_CU_OP_MAXPOOL_BWD */ {"maxpool_bwd", false},
    /* DT_CU_OP_AVGPOOL_FWD */ {"avgpool_fwd", false},
    /* DT_CU_OP_AVGPOOL_BWD */ {"avgpool_bwd", false},
    /* DT_CU_OP_SGD */ {"sgd_update", false},
    /* DT_CU_OP_ADAMW */ {"adamw_update", false},
    /* DT_CU_OP_SUMSQ */ {"sumsq", false},
    /* DT_CU_OP_NONFINITE */ {"count_nonfinite", false},
    /* DT_CU_OP_TO_HALF */ {"to_half", false},
    /* DT_CU_OP_FROM_HALF */ {"from_half", false},
    /* DT_CU_OP_EMBEDDING_VP_FWD */ {"embedding_vp_fwd", false},
    /* DT_CU_OP_EMBEDDING_VP_BWD */ {"embedding_vp_bwd", false},
    /* DT_CU_OP_XENT_VP */ {"xent_vp", false},
    /* DT_CU_OP_ATTN_PAD_FWD */ {"attention_pad_fwd", true},
    /* DT_CU_OP_ATTN_PAD_BWD */ {"attention_pad_bwd", true},
    /* DT_CU_OP_GELU_ERF_FWD */ {"gelu_erf_fwd", false},
    /* DT_CU_OP_GELU_ERF_BWD */ {"gelu_erf_bwd", false},
    /* DT_CU_OP_TANH_FWD */ {"tanh_fwd", false},
    /* DT_CU_OP_TANH_BWD */ {"tanh_bwd", false},
    /* DT_CU_OP_RMSNORM_FWD */ {"rmsnorm_fwd", false},
    /* DT_CU_OP_RMSNORM_BWD */ {"rmsnorm_bwd", false},
    /* DT_CU_OP_SWIGLU_FWD */ {"swiglu_fwd", false},
    /* DT_CU_OP_SWIGLU_BWD */ {"swiglu_bwd", false},
    /* DT_CU_OP_ROPE_QKV_FWD */ {"rope_qkv_fwd", false},
    /* DT_CU_OP_ROPE_QKV_BWD */ {"rope_qkv_bwd", false},
};

// =============================================================================================
// errors
// =============================================================================================

// =============================================================================================
// device selection and profiling
// =============================================================================================

dt_cuda *dt_cuda_enter(dt_backend *be)
{
    dt_cuda *cu = dt_cuda_of(be);
    int cur = -1;
    // cudaGetDevice reads the runtime's thread-local state: cheap, and right even when other
    // code (the NCCL backend, a second instance) switched devices on this thread.
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cu->device)
        DT_CU_CHECK(cu, cudaSetDevice(cu->device));
    return cu;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt_cuda_prof_begin(dt_cuda *cu)
{
    DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    return mono_s();
}

void dt_cuda_prof_end(dt_cuda *cu, int op, double t0, double flops)
{
    DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    dt_op_stat *s = &cu->stats[op];
    s->calls++;
    s->seconds += mono_s() - t0;
    s->flops += flops;
}

static void cu_profile_enable(dt_backend *be, bool on)
{
    dt_cuda *cu = dt_cuda_enter(be);
    DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    if (on) {
        for (int i = 0; i < DT_CU_OP_COUNT; i++) {
            memset(&cu->stats[i], 0, sizeof cu->stats[i]);
            cu->stats[i].name = op_info[i].name;
            cu->stats[i].gemm = op_info[i].gemm;
        }
    }
    cu->prof_on = on;
}

static int cu_profile_read(dt_backend *be, dt_op_stat *out, int max)
{
    dt_cuda *cu = dt_cuda_of(be);
    for (int i = 0; i < DT_CU_OP_COUNT && i < max; i++)
        out[i] = cu->stats[i];
    return DT_CU_OP_COUNT;
}

// =============================================================================================
// the arena
// =============================================================================================

struct dt_cu_block {
    size_t size;
    bool used;
    dt_mem_cat cat; // what a used block is charged to
};

struct dt_cu_chunk {
    char *base;
    size_t size;
    std::map<size_t, dt_cu_block> blocks; // by offset; adjacent, covering [0, size)
};

struct dt_cu_arena {
    std::vector<dt_cu_chunk> chunks;
    size_t reserved = 0; // the arena's chunks (its blocks are charged to cu->mem: core.cu)
    dt_mem_cat cur_cat = DT_MEM_OTHER; // what cu_alloc charges now
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Best fit over every free block; NULL when nothing fits.
static void *arena_carve(dt_cuda *cu, size_t bytes, dt_mem_cat cat)
{
    dt_cu_arena *a = cu->arena;
    dt_cu_chunk *best_c = NULL;
    size_t best_off = 0, best_size = (size_t)-1;
    for (auto &c : a->chunks) {
        for (auto &kv : c.blocks) {
            if (!kv.second.used && kv.second.size >= bytes && kv.second.size < best_size) {
                best_c = &c;
                best_off = kv.first;
                best_size = kv.second.size;
            }
        }
    }
    if (!best_c)
        return NULL;
    dt_cu_block &b = best_c->blocks[best_off];
    if (b.size - bytes >= ARENA_ALIGN) {
        best_c->blocks[best_off + bytes] = dt_cu_block{b.size - bytes, false, DT_MEM_OTHER};
        b.size = bytes;
    }
    b.used = true;
    b.cat = cat;
    dt_cuda_mem_charge(cu, cat, b.size, true);
    return best_c->base + best_off;
}

static int arena_alloc(dt_cuda *cu, void **out, size_t bytes, dt_mem_cat cat, dt_err *err)
{
    dt_cu_arena *a = cu->arena;
    bool retried = false;
    bytes = round_up(bytes ? bytes : 1, ARENA_ALIGN);
    int brc = dt_mem_admit(&cu->mem.stats, cu->mem_limit, cu->mem.peak, "cuda", cat, bytes, err);
    if (brc)
        return brc;
    void *p = arena_carve(cu, bytes, cat);
    if (!p) {
        size_t chunk = round_up(bytes, ARENA_CHUNK_ROUND);
        if (chunk < ARENA_CHUNK_MIN)
            chunk = ARENA_CHUNK_MIN;
        void *base = NULL;
        cudaError_t rc = cudaMalloc(&base, chunk);
        if (rc != cudaSuccess && chunk > bytes) {
            (void)cudaGetLastError(); // out of memory is not sticky: retry with the exact size
            chunk = round_up(bytes, ARENA_ALIGN);
            rc = cudaMalloc(&base, chunk);
        }
        if (rc == cudaErrorMemoryAllocation && !retried && dt_cuda_vmm_pending(cu)) {
            // Granules released but not yet unmapped: wait for them and try once more.
            (void)cudaGetLastError();
            retried = true;
            dt_cuda_vmm_poll(cu, true);
            rc = cudaMalloc(&base, chunk);
        }
        if (rc != cudaSuccess) {
            (void)cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            return dt_err_set(err, -ENOMEM,
                              "CUDA: out of memory on device %d allocating %.1f MiB (arena: %.1f "
                              "MiB in use, %.1f MiB reserved; device: %.1f of %.1f MiB free): %s. "
                              "Reduce train.batch_size or the model size",
                              cu->device, bytes / 1048576.0, cu->mem.in_use / 1048576.0,
                              a->reserved / 1048576.0, fr / 1048576.0, tot / 1048576.0,
                              cudaGetErrorString(rc));
        }
        dt_cu_chunk c;
        c.base = (char *)base;
        c.size = chunk;
        c.blocks[0] = dt_cu_block{chunk, false, DT_MEM_OTHER};
        a->chunks.push_back(c);
        a->reserved += chunk;
        p = arena_carve(cu, bytes, cat);
    }
    *out = p;
    return 0;
}

static void arena_release(dt_cuda *cu, void *p)
{
    dt_cu_arena *a = cu->arena;
    for (auto &c : a->chunks) {
        if ((char *)p < c.base || (char *)p >= c.base + c.size)
            continue;
        auto it = c.blocks.find((size_t)((char *)p - c.base));
        if (it == c.blocks.end() || !it->second.used) {
            DT_ERROR("CUDA arena: free of %p, which was not allocated (double free?)", p);
            return;
        }
        it->second.used = false;
        dt_cuda_mem_charge(cu, it->second.cat, it->second.size, false);
        auto next = std::next(it);
        if (next != c.blocks.end() && !next->second.used) {
            it->second.size += next->second.size;
            c.blocks.erase(next);
        }
        if (it != c.blocks.begin()) {
            auto prev = std::prev(it);
            if (!prev->second.used) {
                prev->second.size += it->second.size;
                c.blocks.erase(it);
            }
        }
        return;
    }
    DT_ERROR("CUDA arena: free of %p, which is not arena memory", p);
}

void *dt_cuda_scratch(dt_cuda *cu, int slot, size_t bytes)
{
    if (cu->scr[slot] && cu->scr_bytes[slot] >= bytes)
        return cu->scr[slot];
    if (cu->scr[slot]) {
        // Kernels queued on the stream may still read the old buffer; the arena may hand the
        // memory out again at once, which is safe because every user is on this same stream.
        arena_release(cu, cu->scr[slot]);
        cu->scr[slot] = NULL;
        cu->scr_bytes[slot] = 0;
    }
    size_t want = round_up(bytes + bytes / 8, ARENA_ALIGN); // some headroom against regrowth
    dt_err err = {};
    void *p = NULL;
    if (arena_alloc(cu, &p, want, DT_MEM_OTHER, &err) != 0) {
        dt_cuda_note(cu, false, "scratch allocation", err.msg, __FILE__, __LINE__);
        return NULL;
    }
    cu->scr[slot] = p;
    cu->scr_bytes[slot] = want;
    return p;
}

// =============================================================================================
// memory ops
// =============================================================================================

static int cu_alloc(dt_backend *be, void **p, size_t bytes, dt_err *err)
{
    dt_cuda *cu = dt_cuda_enter(be);
    if (cu->failed)
        return dt_err_set(err, -EIO, "CUDA backend unusable after an earlier error: %s",
                          cu->fail_msg);
    if (dt_cuda_vmm_wants(cu, bytes))
        return dt_cuda_vmm_alloc(cu, p, bytes, cu->arena->cur_cat, err);
    dt_cuda_vmm_poll(cu, false);
    int rc = arena_alloc(cu, p, bytes, cu->arena->cur_cat, err);
    if (rc != 0)
        return rc;
    DT_CU_CHECK(cu, cudaMemsetAsync(*p, 0, bytes, cu->stream));
    return 0;
}

static void cu_free(dt_backend *be, void *p)
{
    if (!p)
        return;
    dt_cuda *cu = dt_cuda_enter(be);
    // Other streams (the NCCL comm stream) may still read it: wait for the whole device. That
    // completes every pending release too, which dt_cuda_vmm_free then gives back.
    DT_CU_CHECK(cu, cudaDeviceSynchronize());
    if (!dt_cuda_vmm_free(cu, p))
        arena_release(cu, p);
}

static void cu_memcpy_h2d(dt_backend *be, void *dst, const void *src, size_t bytes)
{
    DT_CU_BEGIN(be);
    // From pageable memory the copy is staged before cudaMemcpyAsync returns, so the caller may
    // reuse src at once.
    DT_CU_CHECK(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu->stream));
    DT_CU_END(DT_CU_OP_MEMCPY, 0);
}

static void cu_memcpy_d2h(dt_backend *be, void *dst, const void *src, size_t bytes)
{
    DT_CU_BEGIN(be);
    if (!cu->failed) {
        DT_CU_CHECK(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream));
        DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    }
    if (cu->failed)
        memset(dst, 0xff, bytes); // NaN as float, -1 as int: see cuda_internal.h
    DT_CU_END(DT_CU_OP_MEMCPY, 0);
}

static void cu_memcpy_d2d(dt_backend *be, void *dst, const void *src, size_t bytes)
{
    DT_CU_BEGIN(be);
    DT_CU_CHECK(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu->stream));
    DT_CU_END(DT_CU_OP_MEMCPY, 0);
}

static void cu_memset_zero(dt_backend *be, void *p, size_t bytes)
{
    DT_CU_BEGIN(be);
    DT_CU_CHECK(cu, cudaMemsetAsync(p, 0, bytes, cu->stream));
    DT_CU_END(DT_CU_OP_MEMSET, 0);
}

static void cu_synchronize(dt_backend *be)
{
    dt_cuda *cu = dt_cuda_enter(be);
    DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
    dt_cuda_vmm_poll(cu, false); // every pending release is complete now
}

static size_t cu_peak_bytes(dt_backend *be) { return dt_cuda_of(be)->mem.peak; }

static dt_mem_cat cu_mem_category(dt_backend *be, dt_mem_cat cat)
{
    dt_cu_arena *a = dt_cuda_of(be)->arena;
    dt_mem_cat old = a->cur_cat;
    a->cur_cat = cat;
    return old;
}

// Pending releases are already uncharged (vmm.cu): looking at the queue here changes no figure,
// it only gives the device back what the stream has finished with.
static void cu_mem_stats(dt_backend *be, dt_mem_stats *out)
{
    dt_cuda *cu = dt_cuda_enter(be);
    dt_cuda_vmm_poll(cu, false);
    *out = cu->mem.stats;
}

// The statistics' peaks start again from what is in use now; the arena's peak (peak_bytes) stays.
static void cu_mem_reset_peak(dt_backend *be)
{
    dt_mem_stats *m = &dt_cuda_of(be)->mem.stats;
    memcpy(m->peak, m->cur, sizeof m->peak);
    m->total_peak = m->total;
}

// Outside alloc (no user on CUDA today: NCCL has no communicator memory); counted in the
// statistics only, so in_use and peak_bytes (arena and VMM memory) do not include it.
static void cu_mem_external(dt_backend *be, dt_mem_cat cat, size_t bytes, bool add)
{
    dt_cu_mem *m = &dt_cuda_of(be)->mem;
    if (add)
        dt_mem_stats_add(&m->stats, cat, bytes);
    else
        dt_mem_stats_sub(&m->stats, cat, bytes);
}

// VMM allocations give granules back and take them again (vmm.cu); arena blocks cannot (granule
// 0: release does nothing and leaves the statistics as they are, commit has nothing to take
// back). After a failure the device is not touched: release does nothing, commit fails.
static void cu_mem_release(dt_backend *be, void *base, size_t offset, size_t bytes)
{
    dt_cuda *cu = dt_cuda_enter(be);
    if (!cu->failed && base)
        dt_cuda_vmm_release(cu, base, offset, bytes);
}

static int cu_mem_commit(dt_backend *be, void *base, size_t offset, size_t bytes, dt_err *err)
{
    dt_cuda *cu = dt_cuda_enter(be);
    if (!base || !dt_cuda_vmm_granule(cu, base))
        return 0;
    if (cu->failed)
        return dt_err_set(err, -EIO, "CUDA backend unusable after an earlier error: %s",
                          cu->fail_msg);
    return dt_cuda_vmm_commit(cu, base, offset, bytes, err);
}

static size_t cu_mem_granule(dt_backend *be, const void *base)
{
    return dt_cuda_vmm_granule(dt_cuda_of(be), base);
}

// A device attribute: no context is created on `device`, and no error is left sticky.
static int cu_device_pci_bus_id(dt_backend *be, int device, char *buf, size_t cap)
{
    (void)be;
    if (!buf || cap < 13)
        return -EINVAL;
    cudaError_t crc = cudaDeviceGetPCIBusId(buf, cap < 64 ? (int)cap : 64, device);
    if (crc != cudaSuccess) {
        (void)cudaGetLastError();
        buf[0] = '\0';
        return crc == cudaErrorInvalidDevice ? -ENODEV : -EIO;
    }
    return 0;
}

// =============================================================================================
// the compute-stream registry
// =============================================================================================

#define MAX_DEVICES 64
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static dt_cuda *reg_by_device[MAX_DEVICES];

bool dt_cuda_record_on_compute_stream(int device, cudaEvent_t ev)
{
    if (device < 0 || device >= MAX_DEVICES)
        return false;
    pthread_mutex_lock(&reg_mu);
    dt_cuda *cu = reg_by_device[device];
    bool ok = cu && cudaEventRecord(ev, cu->stream) == cudaSuccess;
    pthread_mutex_unlock(&reg_mu);
    return ok;
}

static void reg_set(dt_cuda *cu)
{
    if (cu->device >= MAX_DEVICES)
        return;
    pthread_mutex_lock(&reg_mu);
    reg_by_device[cu->device] = cu;
    pthread_mutex_unlock(&reg_mu);
}

static void reg_clear(dt_cuda *cu)
{
    if (cu->device >= MAX_DEVICES)
        return;
    pthread_mutex_lock(&reg_mu);
    if (reg_by_device[cu->device] == cu)
        reg_by_device[cu->device] = NULL;
    pthread_mutex_unlock(&reg_mu);
}

// =============================================================================================
// lifecycle
// =============================================================================================

static void cu_destroy(dt_cuda *cu)
{
    if (!cu)
        return;
    reg_clear(cu);
    if (cu->stream)
        cudaStreamSynchronize(cu->stream);
    dt_cuda_vmm_close(cu); // before the stream goes: it may wait for events recorded there
    if (cu->cudnn)
        cudnnDestroy(cu->cudnn);
    if (cu->lt)
        cublasLtDestroy(cu->lt);
    if (cu->cublas)
        cublasDestroy(cu->cublas);
    if (cu->host_pinned)
        cudaFreeHost(cu->host_pinned);
    if (cu->arena) {
        for (auto &c : cu->arena->chunks)
            cudaFree(c.base);
        delete cu->arena;
    }
    if (cu->stream)
        cudaStreamDestroy(cu->stream);
    delete cu;
}

static void cu_close(dt_backend *be)
{
    if (!be)
        return;
    dt_cuda *cu = dt_cuda_of(be);
    if (cu) {
        cudaSetDevice(cu->device);
        cu_destroy(cu);
    }
    free(be);
}

static int driver_error(dt_err *err, cudaError_t rc)
{
    switch (rc) {
    case cudaErrorNoDevice: {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return dt_err_set(err, -ENODEV, "CUDA: no GPU found%s%s%s (use device = cpu)",
                          vis ? " (CUDA_VISIBLE_DEVICES=\"" : "", vis ? vis : "",
                          vis ? "\")" : "");
    }
    case cudaErrorInsufficientDriver: {
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!drv)
            return dt_err_set(err, -ENODEV,
                              "CUDA: no NVIDIA driver on this machine (libcuda.so.1 not found): "
                              "install the driver, or use device = cpu");
        dlclose(drv);
        return dt_err_set(err, -ENODEV,
                          "CUDA: the NVIDIA driver is missing or older than this build's CUDA "
                          "runtime needs (%s): install or update the driver, or use device = cpu",
                          cudaGetErrorString(rc));
    }
    default:
        return dt_err_set(err, -ENODEV, "CUDA: no usable driver or device: %s (use device = cpu)",
                          cudaGetErrorString(rc));
    }
}

// Fails with a message naming the library call when `ok` is false.
#define CREATE_CHECK(ok, ...)                                                                      \
    do {                                                                                           \
        if (!(ok)) {                                                                               \
            rc = dt_err_set(err, -EIO, __VA_ARGS__);                                               \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static void fill_ops(dt_backend *be)
{
    be->close = cu_close;
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->memcpy_h2d = cu_memcpy_h2d;
    be->memcpy_d2h = cu_memcpy_d2h;
    be->memcpy_d2d = cu_memcpy_d2d;
    be->memset_zero = cu_memset_zero;
    be->synchronize = cu_synchronize;
    be->device_pci_bus_id = cu_device_pci_bus_id;
    be->peak_bytes = cu_peak_bytes;
    be->mem_category = cu_mem_category;
    be->mem_stats = cu_mem_stats;
    be->mem_external = cu_mem_external;
    be->mem_release = cu_mem_release;
    be->mem_granule = cu_mem_granule;
    be->mem_commit = cu_mem_commit;
    be->mem_reset_peak = cu_mem_reset_peak;
    be->profile_enable = cu_profile_enable;
    be->profile_read = cu_profile_read;
    be->matmul_fwd = dt_cuda_matmul_fwd;
    be->matmul_bwd = dt_cuda_matmul_bwd;
    be->attention_sizes = dt_cuda_attention_sizes;
    be->attention_fwd = dt_cuda_attention_fwd;
    be->attention_bwd = dt_cuda_attention_bwd;
    be->attention_pad_fwd = dt_cuda_attention_pad_fwd;
    be->attention_pad_bwd = dt_cuda_attention_pad_bwd;
    be->conv2d_fwd = dt_cuda_conv2d_fwd;
    be->conv2d_bwd = dt_cuda_conv2d_bwd;
    be->bias_add = dt_cuda_bias_add;
    be->bias_bwd = dt_cuda_bias_bwd;
    be->layernorm_fwd = dt_cuda_layernorm_fwd;
    be->layernorm_bwd = dt_cuda_layernorm_bwd;
    be->gelu_fwd = dt_cuda_gelu_fwd;
    be->gelu_bwd = dt_cuda_gelu_bwd;
    be->gelu_erf_fwd = dt_cuda_gelu_erf_fwd;
    be->gelu_erf_bwd = dt_cuda_gelu_erf_bwd;
    be->tanh_fwd = dt_cuda_tanh_fwd;
    be->tanh_bwd = dt_cuda_tanh_bwd;
    be->relu_fwd = dt_cuda_relu_fwd;
    be->relu_bwd = dt_cuda_relu_bwd;
    be->residual_fwd = dt_cuda_residual_fwd;
    be->accumulate = dt_cuda_accumulate;
    be->scale = dt_cuda_scale;
    be->embedding_fwd = dt_cuda_embedding_fwd;
    be->embedding_bwd = dt_cuda_embedding_bwd;
    be->xent_fwd_bwd = dt_cuda_xent_fwd_bwd;
    be->embedding_vp_fwd = dt_cuda_embedding_vp_fwd;
    be->embedding_vp_bwd = dt_cuda_embedding_vp_bwd;
    be->xent_vp_max = dt_cuda_xent_vp_max;
    be->xent_vp_sums = dt_cuda_xent_vp_sums;
    be->xent_vp_finish = dt_cuda_xent_vp_finish;
    be->rmsnorm_fwd = dt_cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = dt_cuda_rmsnorm_bwd;
    be->swiglu_fwd = dt_cuda_swiglu_fwd;
    be->swiglu_bwd = dt_cuda_swiglu_bwd;
    be->rope_qkv_fwd = dt_cuda_rope_qkv_fwd;
    be->rope_qkv_bwd = dt_cuda_rope_qkv_bwd;
    be->bn_stats = dt_cuda_bn_stats;
    be->bn_fwd_apply = dt_cuda_bn_fwd_apply;
    be->bn_fwd_eval = dt_cuda_bn_fwd_eval;
    be->bn_bwd_reduce = dt_cuda_bn_bwd_reduce;
    be->bn_bwd_apply = dt_cuda_bn_bwd_apply;
    be->maxpool_fwd = dt_cuda_maxpool_fwd;
    be->maxpool_bwd = dt_cuda_maxpool_bwd;
    be->avgpool_fwd = dt_cuda_avgpool_fwd;
    be->avgpool_bwd = dt_cuda_avgpool_bwd;
    be->sgd_update = dt_cuda_sgd_update;
    be->adamw_update = dt_cuda_adamw_update;
    be->sumsq = dt_cuda_sumsq;
    be->count_nonfinite = dt_cuda_count_nonfinite;
    be->to_half = dt_cuda_op_to_half;
    be->from_half = dt_cuda_op_from_half;
}

DT_CU_EXPORT int dt_cuda_backend_create(dt_backend **out, const dt_backend_opts *opts,
                                        dt_err *err)
{
    dt_backend_opts def; // kernels/backend_ops.c is compiled into this library too
    if (!opts) {
        dt_backend_opts_default(&def);
        opts = &def;
    }
    int n = 0, rc = 0;
    cudaError_t crc = cudaGetDeviceCount(&n);
    if (crc != cudaSuccess) {
        (void)cudaGetLastError();
        return driver_error(err, crc);
    }
    if (n == 0)
        return driver_error(err, cudaErrorNoDevice);
    if (opts->device_index < 0 || opts->device_index >= n)
        return dt_err_set(err, -ENODEV,
                          "CUDA: device %d requested (LOCAL_RANK) but only %d GPU(s) are visible "
                          "(CUDA_VISIBLE_DEVICES=\"%s\"): run at most %d workers per node",
                          opts->device_index, n,
                          getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "",
                          n);

    dt_backend *be = (dt_backend *)calloc(1, sizeof *be);
    dt_cuda *cu = new (std::nothrow) dt_cuda();
    cudaDeviceProp prop;
    const char *mode = dt_env("DTRAIN_CUDA_GEMM");
    const char *tf32 = dt_env("DTRAIN_CUDA_TF32");
    const char *attn = dt_env("DTRAIN_CUDA_ATTN");
    CREATE_CHECK(be && cu, "CUDA backend: out of host memory");
    cu->device = opts->device_index;
    cu->precision = opts->precision;
    cu->tf32 = tf32 && !strcmp(tf32, "1");
    cu->gemm_convert = !(mode && !strcmp(mode, "fast"));
    cu->attn_flash = attn && !strcmp(attn, "flash");
    if (attn && strcmp(attn, "flash") && strcmp(attn, "cublas"))
        DT_WARN("DTRAIN_CUDA_ATTN=%s is not cublas or flash; using cublas", attn);
    if (mode && strcmp(mode, "fast") && strcmp(mode, "convert"))
        DT_WARN("DTRAIN_CUDA_GEMM=%s is not convert or fast; using convert", mode);
    cu->arena = new (std::nothrow) dt_cu_arena();
    CREATE_CHECK(cu->arena, "CUDA backend: out of host memory");

    crc = cudaSetDevice(cu->device);
    CREATE_CHECK(crc == cudaSuccess, "CUDA: cannot use device %d: %s", cu->device,
                 cudaGetErrorString(crc));
    crc = cudaGetDeviceProperties(&prop, cu->device);
    CREATE_CHECK(crc == cudaSuccess, "CUDA: cannot query device %d: %s", cu->device,
                 cudaGetErrorString(crc));
    cu->sm_count = prop.multiProcessorCount;
    cu->cc_major = prop.major;
    cu->cc_minor = prop.minor;
    cu->total_mem = prop.totalGlobalMem;
    cu->mem_limit = opts->mem_limit && opts->mem_limit < cu->total_mem ? opts->mem_limit
                                                                       : cu->total_mem;
    snprintf(cu->gpu_name, sizeof cu->gpu_name, "%s", prop.name);
    CREATE_CHECK(prop.major >= 8,
                 "CUDA: device %d (%s) has compute capability %d.%d; this build needs 8.0 or "
                 "newer (A100, H100, RTX 30xx and later)",
                 cu->device, prop.name, prop.major, prop.minor);

    crc = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking);
    CREATE_CHECK(crc == cudaSuccess, "CUDA: creating a stream on device %d: %s", cu->device,
                 cudaGetErrorString(crc));
    dt_cuda_vmm_init(cu); // never fails: without it the arena serves everything
    {
        cublasStatus_t bs = cublasCreate(&cu->cublas);
        CREATE_CHECK(bs == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasCreate: %s",
                     cublasGetStatusString(bs));
        bs = cublasLtCreate(&cu->lt);
        CREATE_CHECK(bs == CUBLAS_STATUS_SUCCESS, "cuBLASLt: cublasLtCreate: %s",
                     cublasGetStatusString(bs));
        cudnnStatus_t ds = cudnnCreate(&cu->cudnn);
        CREATE_CHECK(ds == CUDNN_STATUS_SUCCESS,
                     "cuDNN: cudnnCreate: %s (is libcudnn 9 installed next to CUDA?)",
                     cudnnGetErrorString(ds));
        ds = cudnnSetStream(cu->cudnn, cu->stream);
        CREATE_CHECK(ds == CUDNN_STATUS_SUCCESS, "cuDNN: cudnnSetStream: %s",
                     cudnnGetErrorString(ds));
        rc = arena_alloc(cu, &cu->lt_ws, LT_WORKSPACE, DT_MEM_OTHER, err);
        if (rc != 0)
            goto fail;
        cu->lt_ws_bytes = LT_WORKSPACE;
        bs = cublasSetStream(cu->cublas, cu->stream);
        CREATE_CHECK(bs == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasSetStream: %s",
                     cublasGetStatusString(bs));
        // cuBLAS and cuBLASLt share the workspace: both run on the one compute stream, in order.
        bs = cublasSetWorkspace(cu->cublas, cu->lt_ws, cu->lt_ws_bytes);
        CREATE_CHECK(bs == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasSetWorkspace: %s",
                     cublasGetStatusString(bs));
    }
    crc = cudaMallocHost(&cu->host_pinned, 64);
    CREATE_CHECK(crc == cudaSuccess, "CUDA: cudaMallocHost: %s", cudaGetErrorString(crc));

    be->name = "cuda";
    be->kind = DT_BACKEND_CUDA;
    be->host_memory = false;
    be->impl = cu;
    be->precision = cu->precision;
    fill_ops(be);
    for (int i = 0; i < DT_CU_OP_COUNT; i++) {
        cu->stats[i].name = op_info[i].name;
        cu->stats[i].gemm = op_info[i].gemm;
    }
    reg_set(cu);
    DT_DEBUG("CUDA backend on device %d: %s, sm_%d%d, %d SMs, %.1f GiB, precision %s%s%s",
             cu->device, cu->gpu_name, cu->cc_major, cu->cc_minor, cu->sm_count,
             cu->total_mem / 1073741824.0,
             cu->precision == DT_PREC_BF16   ? "bf16"
             : cu->precision == DT_PREC_FP16 ? "fp16"
                                             : "fp32",
             cu->precision == DT_PREC_FP32 ? (cu->tf32 ? " (tf32 allowed)" : "") : "",
             cu->precision != DT_PREC_FP32 ? (cu->gemm_convert ? " (gemm convert)" : " (gemm fast)")
                                           : "");
    *out = be;
    return 0;

fail:
    cu_destroy(cu);
    free(be);
    return rc;
}
