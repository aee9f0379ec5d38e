// vmm.cu - large allocations of the CUDA backend on the driver's virtual memory management, so
// that mem_release can give granules back to the device and mem_commit can take them again
// (kernels/backend_ops.h: "mem_release / mem_commit / mem_granule").
//
// An allocation of at least one granule (cuMemGetAllocationGranularity, minimum: 2 MiB on
// current GPUs) reserves a granule-aligned virtual range rounded up to whole granules
// (cuMemAddressReserve) and backs every granule with its own physical chunk of pinned device
// memory (cuMemCreate, cuMemMap, cuMemSetAccess read-write for this device). Smaller allocations,
// the backend's scratch and workspaces stay in the arena (backend.cu), which reports granule 0.
//
// A granule is in one of three states:
//   MAPPED    backed and charged to the allocation's category;
//   PENDING   released by the caller but possibly still used by work already issued on the
//             compute stream: still backed, no longer charged, waiting for its release event;
//   UNMAPPED  no physical memory; the virtual range stays reserved.
// mem_release records an event on the compute stream and queues (event, granules); the granules
// are unmapped and their chunks released once the event has completed, found without blocking
// (cudaEventQuery) at the next release, commit, alloc, free, synchronize or mem_stats. No release
// synchronises the host with the device: ZeRO-3 gives every block's parameters back after its
// forward, and a synchronisation there would end the overlap of compute and communication. The
// strategies wait for their collectives on the host before they release, so the compute stream
// is the one whose work can still be in flight. A commit of a PENDING granule cancels its release
// (the memory never left; its contents are undefined anyway), and a granule released, committed
// and released again waits for its newest event only (entries carry a sequence number).
//
// Statistics (the caller's view): a granule stops being charged at the mem_release call, not when
// it is unmapped later, so dt_mem_read right after a release shows it gone, as on the cpu; the
// device may hold the PENDING granules a little longer (at most what the stream has not finished).
// in_use and peak_bytes follow the same figures. Under memory pressure (cuMemCreate out of
// memory, in alloc or commit, or the arena's cudaMalloc) the backend waits for every pending
// release (cudaEventSynchronize), unmaps them, and tries once more before it reports -ENOMEM.
//
// The driver API is reached without linking libcuda (CI machines have no driver): the entry
// points come from cudart at run time (cudaGetDriverEntryPointByVersion, which picks the symbol
// version of the ABI asked for), and <cudaTypedefs.h> only gives their types. When one is missing,
// the device lacks CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, or DTRAIN_CUDA_VMM=0,
// everything comes from the arena as before (granule 0, release gives nothing back).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include <deque>
#include <map>
#include <new>
#include <vector>

#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "common/env.h"
}

enum { G_UNMAPPED = 0, G_MAPPED = 1, G_PENDING = 2 };

struct dt_cu_vmm_alloc {
    CUdeviceptr base;
    size_t size;                                  // reserved bytes: n granules
    size_t user_bytes;                            // what alloc was asked for (<= size)
    size_t n;                                     // granules
    dt_mem_cat cat;                               // what its MAPPED granules are charged to
    std::vector<CUmemGenericAllocationHandle> h;  // per granule; valid unless UNMAPPED
    std::vector<uint8_t> state;                   // G_*
    std::vector<uint64_t> seq;                    // PENDING: the release entry it waits for
};

// One mem_release call whose granules are still mapped: [g0, g1) of a, those of them still
// PENDING with seq == this seq are unmapped once ev has completed.
struct dt_cu_vmm_pending {
    cudaEvent_t ev;
    uint64_t seq;
    dt_cu_vmm_alloc *a;
    size_t g0, g1;
};

struct dt_cu_vmm {
    size_t gran; // bytes per granule, a power of two
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    PFN_cuGetErrorString_v6000 GetErrorString;
    PFN_cuMemAddressReserve_v10020 AddressReserve;
    PFN_cuMemAddressFree_v10020 AddressFree;
    PFN_cuMemCreate_v10020 Create;
    PFN_cuMemRelease_v10020 Release;
    PFN_cuMemMap_v10020 Map;
    PFN_cuMemUnmap_v10020 Unmap;
    PFN_cuMemSetAccess_v10020 SetAccess;
    std::map<CUdeviceptr, dt_cu_vmm_alloc *> allocs; // by base
    std::deque<dt_cu_vmm_pending> pending;             // in release (= stream) order
    std::vector<cudaEvent_t> spare;                    // completed events, for reuse
    uint64_t next_seq = 0;
    size_t pending_bytes = 0; // bytes of PENDING granules (for messages)
};

// ---- driver entry points ---------------------------------------------------------------------

// The driver ABI the entry points are asked for: every symbol used here has had one version since
// CUDA 10.2 / 6.0, so any driver able to run this runtime provides them.
#define VMM_ABI 12000

static void *entry_point(const char *name)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t rc = cudaGetDriverEntryPointByVersion(name, &fn, VMM_ABI, cudaEnableDefault, &st);
#else
    cudaError_t rc = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &st);
#endif
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return st == cudaDriverEntryPointSuccess ? fn : NULL;
}

static const char *drv_str(const dt_cu_vmm *v, CUresult r)
{
    const char *s = NULL;
    if (v && v->GetErrorString && v->GetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "unknown driver error";
}

void dt_cuda_vmm_init(dt_cuda *cu)
{
    const char *knob = dt_env("DTRAIN_CUDA_VMM");
    if (knob && !strcmp(knob, "0")) {
        DT_DEBUG("CUDA backend on device %d: DTRAIN_CUDA_VMM=0: every allocation comes from the "
                 "arena (mem_release gives nothing back)",
                 cu->device);
        return;
    }
    if (knob && strcmp(knob, "1"))
        DT_WARN("DTRAIN_CUDA_VMM=%s is not 0 or 1; using 1", knob);

    dt_cu_vmm *v = new (std::nothrow) dt_cu_vmm();
    if (!v) {
        DT_INFO("CUDA backend on device %d: out of host memory setting up virtual memory "
                "management; every allocation comes from the arena",
                cu->device);
        return;
    }
    PFN_cuDeviceGet_v2000 DeviceGet = NULL;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute = NULL;
    PFN_cuMemGetAllocationGranularity_v10020 GetGranularity = NULL;
    const char *missing = NULL;
    CUdevice dev = 0;
    CUresult r = CUDA_SUCCESS;
    int supported = 0;
    size_t g = 0;
#define VMM_RESOLVE(var, sym)                                                                      \
    do {                                                                                           \
        var = (decltype(var))entry_point(sym);                                                     \
        if (!var && !missing)                                                                      \
            missing = sym;                                                                         \
    } while (0)
    VMM_RESOLVE(v->GetErrorString, "cuGetErrorString");
    VMM_RESOLVE(DeviceGet, "cuDeviceGet");
    VMM_RESOLVE(DeviceGetAttribute, "cuDeviceGetAttribute");
    VMM_RESOLVE(GetGranularity, "cuMemGetAllocationGranularity");
    VMM_RESOLVE(v->AddressReserve, "cuMemAddressReserve");
    VMM_RESOLVE(v->AddressFree, "cuMemAddressFree");
    VMM_RESOLVE(v->Create, "cuMemCreate");
    VMM_RESOLVE(v->Release, "cuMemRelease");
    VMM_RESOLVE(v->Map, "cuMemMap");
    VMM_RESOLVE(v->Unmap, "cuMemUnmap");
    VMM_RESOLVE(v->SetAccess, "cuMemSetAccess");
#undef VMM_RESOLVE
    if (missing) {
        DT_INFO("CUDA backend on device %d: the driver offers no %s: every allocation comes from "
                "the arena (mem_release gives nothing back)",
                cu->device, missing);
        goto off;
    }
    r = DeviceGet(&dev, cu->device);
    if (r == CUDA_SUCCESS)
        r = DeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               dev);
    if (r != CUDA_SUCCESS || !supported) {
        DT_INFO("CUDA backend on device %d: %s%s: every allocation comes from the arena "
                "(mem_release gives nothing back)",
                cu->device,
                r != CUDA_SUCCESS ? "cannot ask the driver about virtual memory management: "
                                  : "the device has no virtual memory management",
                r != CUDA_SUCCESS ? drv_str(v, r) : "");
        goto off;
    }
    memset(&v->prop, 0, sizeof v->prop);
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = (int)dev;
    memset(&v->access, 0, sizeof v->access);
    v->access.location = v->prop.location;
    v->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = GetGranularity(&g, &v->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g == 0 || (g & (g - 1)) != 0) {
        DT_INFO("CUDA backend on device %d: no usable allocation granularity (%zu bytes%s%s): "
                "every allocation comes from the arena (mem_release gives nothing back)",
                cu->device, g, r != CUDA_SUCCESS ? ": " : "",
                r != CUDA_SUCCESS ? drv_str(v, r) : "");
        goto off;
    }
    v->gran = g;
    cu->vmm = v;
    DT_DEBUG("CUDA backend on device %d: allocations from %zu KiB up use virtual memory "
             "management (granule %zu KiB)",
             cu->device, g >> 10, g >> 10);
    return;
off:
    delete v;
}

// ---- granules --------------------------------------------------------------------------------

static CUdeviceptr gaddr(const dt_cu_vmm *v, const dt_cu_vmm_alloc *a, size_t g)
{
    return a->base + (CUdeviceptr)(g * v->gran);
}

// Backs granule g (UNMAPPED) with a new chunk, read-write for this device. On failure nothing is
// left mapped or held; the driver's result is returned.
static CUresult map_one(dt_cu_vmm *v, dt_cu_vmm_alloc *a, size_t g)
{
    CUmemGenericAllocationHandle h = 0;
    CUresult r = v->Create(&h, v->gran, &v->prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = v->Map(gaddr(v, a, g), v->gran, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        (void)v->Release(h);
        return r;
    }
    r = v->SetAccess(gaddr(v, a, g), v->gran, &v->access, 1);
    if (r != CUDA_SUCCESS) {
        (void)v->Unmap(gaddr(v, a, g), v->gran);
        (void)v->Release(h);
        return r;
    }
    a->h[g] = h;
    a->state[g] = G_MAPPED;
    return CUDA_SUCCESS;
}

// Unmaps granule g (MAPPED or PENDING) and releases its chunk; the caller has uncharged it (or
// never charged it: PENDING). The state becomes UNMAPPED even when the driver refuses, which marks
// the backend failed (the range can no longer be trusted).
static void unmap_one(dt_cuda *cu, dt_cu_vmm_alloc *a, size_t g)
{
    dt_cu_vmm *v = cu->vmm;
    CUresult r = v->Unmap(gaddr(v, a, g), v->gran);
    if (r != CUDA_SUCCESS)
        dt_cuda_note(cu, false, "cuMemUnmap", drv_str(v, r), __FILE__, __LINE__);
    r = v->Release(a->h[g]);
    if (r != CUDA_SUCCESS)
        dt_cuda_note(cu, false, "cuMemRelease", drv_str(v, r), __FILE__, __LINE__);
    if (a->state[g] == G_PENDING)
        v->pending_bytes -= v->gran;
    a->h[g] = 0;
    a->state[g] = G_UNMAPPED;
}

// Unmaps the granules of entry e that still wait for it.
static void finish_entry(dt_cuda *cu, const dt_cu_vmm_pending &e)
{
    for (size_t g = e.g0; g < e.g1; g++)
        if (e.a->state[g] == G_PENDING && e.a->seq[g] == e.seq)
            unmap_one(cu, e.a, g);
}

void dt_cuda_vmm_poll(dt_cuda *cu, bool wait)
{
    dt_cu_vmm *v = cu->vmm;
    if (!v)
        return;
    while (!v->pending.empty()) {
        dt_cu_vmm_pending e = v->pending.front();
        cudaError_t rc = wait ? cudaEventSynchronize(e.ev) : cudaEventQuery(e.ev);
        if (rc == cudaErrorNotReady) {
            (void)cudaGetLastError(); // "not ready" is no error: leave nothing for DT_CU_LAUNCHED
            return;                   // the later entries were recorded later on the same stream
        }
        bool ok = rc == cudaSuccess;
        if (!ok) {
            // The context is broken (a fault in earlier work): nothing runs on the stream any
            // more, so the granules can go; the error is recorded for the worker.
            (void)cudaGetLastError();
            dt_cuda_note(cu, false, wait ? "cudaEventSynchronize (pending mem_release)"
                                         : "cudaEventQuery (pending mem_release)",
                         cudaGetErrorString(rc), __FILE__, __LINE__);
        }
        finish_entry(cu, e);
        v->pending.pop_front();
        if (ok) {
            try {
                v->spare.push_back(e.ev);
            } catch (const std::bad_alloc &) {
                (void)cudaEventDestroy(e.ev);
            }
        } else {
            (void)cudaEventDestroy(e.ev);
        }
    }
}

// ---- the backend's entries -------------------------------------------------------------------

static dt_cu_vmm_alloc *find(dt_cu_vmm *v, const void *base)
{
    if (!v || !base)
        return NULL;
    auto it = v->allocs.find((CUdeviceptr)(uintptr_t)base);
    return it == v->allocs.end() ? NULL : it->second;
}

bool dt_cuda_vmm_wants(const dt_cuda *cu, size_t bytes)
{
    return cu->vmm && bytes >= cu->vmm->gran;
}

size_t dt_cuda_vmm_granule(const dt_cuda *cu, const void *base)
{
    return find(cu->vmm, base) ? cu->vmm->gran : 0;
}

bool dt_cuda_vmm_pending(const dt_cuda *cu) { return cu->vmm && !cu->vmm->pending.empty(); }

// Backs every UNMAPPED granule of [g0, g1) and takes back every PENDING one, charging each to
// a's category. When the device is out of memory and releases are pending, waits for them, gives
// them back and tries once more. On failure the granules done so far stay mapped and charged
// (a consistent state) and err says how far it got.
static int back_range(dt_cuda *cu, dt_cu_vmm_alloc *a, size_t g0, size_t g1, const char *what,
                      dt_err *err)
{
    dt_cu_vmm *v = cu->vmm;
    bool retried = false;
    for (size_t g = g0; g < g1; g++) {
        if (a->state[g] == G_MAPPED)
            continue;
        if (a->state[g] == G_PENDING) { // cancel the release: the memory never left
            a->state[g] = G_MAPPED;
            v->pending_bytes -= v->gran;
            dt_cuda_mem_charge(cu, a->cat, v->gran, true);
            continue;
        }
        int brc = dt_mem_admit(&cu->mem.stats, cu->mem_limit, cu->mem.peak, "cuda", a->cat,
                               v->gran, err);
        if (brc)
            return brc;
        CUresult r = map_one(v, a, g);
        if (r == CUDA_ERROR_OUT_OF_MEMORY && !retried && !v->pending.empty()) {
            retried = true;
            dt_cuda_vmm_poll(cu, true);
            r = map_one(v, a, g);
        }
        if (r != CUDA_SUCCESS) {
            size_t fr = 0, tot = 0;
            if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
                (void)cudaGetLastError();
            size_t todo = 0;
            for (size_t k = g; k < g1; k++)
                todo += a->state[k] != G_MAPPED;
            return dt_err_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO,
                              "CUDA: %s on device %d %s %.1f MiB (%zu granules of %zu KiB still "
                              "to back, %zu MiB of releases pending; device: %.1f of %.1f MiB "
                              "free): %s%s",
                              r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "cuMemCreate/Map",
                              cu->device, what, (double)(g1 - g0) * (double)v->gran / 1048576.0,
                              todo, v->gran >> 10, v->pending_bytes >> 20, fr / 1048576.0,
                              tot / 1048576.0, drv_str(v, r),
                              r == CUDA_ERROR_OUT_OF_MEMORY
                                  ? ". Reduce train.batch_size or the model size"
                                  : "");
        }
        dt_cuda_mem_charge(cu, a->cat, v->gran, true);
    }
    return 0;
}

// Gives back everything a holds (after the caller made sure the device is done with it): its
// MAPPED granules are uncharged, every backed granule unmapped, the range freed.
static void destroy_alloc(dt_cuda *cu, dt_cu_vmm_alloc *a, bool uncharge)
{
    dt_cu_vmm *v = cu->vmm;
    for (size_t g = 0; g < a->n; g++) {
        if (a->state[g] == G_UNMAPPED)
            continue;
        if (a->state[g] == G_MAPPED && uncharge)
            dt_cuda_mem_charge(cu, a->cat, v->gran, false);
        unmap_one(cu, a, g);
    }
    CUresult r = v->AddressFree(a->base, a->size);
    if (r != CUDA_SUCCESS)
        dt_cuda_note(cu, false, "cuMemAddressFree", drv_str(v, r), __FILE__, __LINE__);
    delete a;
}

int dt_cuda_vmm_alloc(dt_cuda *cu, void **out, size_t bytes, dt_mem_cat cat, dt_err *err)
{
    dt_cu_vmm *v = cu->vmm;
    const size_t G = v->gran;
    dt_cuda_vmm_poll(cu, false);
    size_t size = (bytes + G - 1) / G * G;
    if (size < bytes || size > cu->total_mem)
        return dt_err_set(err, -ENOMEM,
                          "CUDA: out of memory on device %d allocating %.1f MiB: more than the "
                          "device's %.1f MiB. Reduce train.batch_size or the model size",
                          cu->device, bytes / 1048576.0, cu->total_mem / 1048576.0);
    dt_cu_vmm_alloc *a = new (std::nothrow) dt_cu_vmm_alloc();
    if (!a)
        return dt_err_set(err, -ENOMEM, "CUDA backend: out of host memory");
    a->size = size;
    a->user_bytes = bytes;
    a->n = size / G;
    a->cat = cat;
    try {
        a->h.assign(a->n, 0);
        a->state.assign(a->n, G_UNMAPPED);
        a->seq.assign(a->n, 0);
    } catch (const std::bad_alloc &) {
        delete a;
        return dt_err_set(err, -ENOMEM, "CUDA backend: out of host memory");
    }
    CUresult r = v->AddressReserve(&a->base, size, G, 0, 0);
    if (r != CUDA_SUCCESS) {
        delete a;
        return dt_err_set(err, r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO,
                          "CUDA: %s on device %d reserving %.1f MiB of address space: %s",
                          r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "cuMemAddressReserve",
                          cu->device, size / 1048576.0, drv_str(v, r));
    }
    int rc = back_range(cu, a, 0, a->n, "allocating", err);
    if (rc == 0) {
        try {
            v->allocs[a->base] = a;
        } catch (const std::bad_alloc &) {
            rc = dt_err_set(err, -ENOMEM, "CUDA backend: out of host memory");
        }
    }
    if (rc != 0) {
        destroy_alloc(cu, a, true);
        return rc;
    }
    *out = (void *)(uintptr_t)a->base;
    // alloc's contract: zeroed (the granule padding too, so a later commit of it is all that is
    // undefined)
    DT_CU_CHECK(cu, cudaMemsetAsync(*out, 0, size, cu->stream));
    return 0;
}

bool dt_cuda_vmm_free(dt_cuda *cu, void *p)
{
    dt_cu_vmm *v = cu->vmm;
    dt_cu_vmm_alloc *a = find(v, p);
    if (!a)
        return false;
    // The caller synchronised the device, so every pending release is complete: give them all
    // back (a's among them, so that no entry outlives a).
    dt_cuda_vmm_poll(cu, true);
    v->allocs.erase(a->base);
    destroy_alloc(cu, a, true);
    return true;
}

// The granules of a lying wholly inside (inner) or touching (!inner) [off, off + bytes): [*g0,
// *g1). The allocation's end is its last granule's end: a range reaching the end of what alloc
// was asked for covers the padding of the last granule too.
static void span(const dt_cu_vmm *v, const dt_cu_vmm_alloc *a, size_t off, size_t bytes,
                 bool inner, size_t *g0, size_t *g1)
{
    const size_t G = v->gran, ub = a->user_bytes;
    if (off > ub)
        off = ub;
    size_t end = bytes > ub - off ? ub : off + bytes;
    if (end == ub)
        end = a->size;
    if (inner) {
        *g0 = (off + G - 1) / G;
        *g1 = end / G;
    } else {
        *g0 = off / G;
        *g1 = (end + G - 1) / G;
    }
    if (*g1 < *g0)
        *g1 = *g0;
}

void dt_cuda_vmm_release(dt_cuda *cu, void *base, size_t off, size_t bytes)
{
    dt_cu_vmm *v = cu->vmm;
    dt_cu_vmm_alloc *a = find(v, base);
    if (!a || !bytes)
        return;
    size_t g0, g1, n = 0;
    span(v, a, off, bytes, true, &g0, &g1);
    for (size_t g = g0; g < g1; g++)
        n += a->state[g] == G_MAPPED;
    if (n == 0) {
        dt_cuda_vmm_poll(cu, false);
        return;
    }
    // The event marks the end of the work issued so far, which may still use the granules.
    cudaEvent_t ev = NULL;
    if (!v->spare.empty()) {
        ev = v->spare.back();
        v->spare.pop_back();
    } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        ev = NULL;
    }
    if (ev && cudaEventRecord(ev, cu->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaEventDestroy(ev);
        ev = NULL;
    }
    uint64_t seq = ++v->next_seq;
    for (size_t g = g0; g < g1; g++) {
        if (a->state[g] != G_MAPPED)
            continue;
        a->state[g] = G_PENDING;
        a->seq[g] = seq;
        v->pending_bytes += v->gran;
        dt_cuda_mem_charge(cu, a->cat, v->gran, false);
    }
    bool queued = false;
    if (ev) {
        try {
            v->pending.push_back(dt_cu_vmm_pending{ev, seq, a, g0, g1});
            queued = true;
        } catch (const std::bad_alloc &) {
            (void)cudaEventDestroy(ev);
        }
    }
    if (!queued) {
        // No event to wait for: wait for the stream here instead (rare: out of host memory or
        // events), then unmap at once.
        DT_CU_CHECK(cu, cudaStreamSynchronize(cu->stream));
        finish_entry(cu, dt_cu_vmm_pending{NULL, seq, a, g0, g1});
    }
    dt_cuda_vmm_poll(cu, false);
}

int dt_cuda_vmm_commit(dt_cuda *cu, void *base, size_t off, size_t bytes, dt_err *err)
{
    dt_cu_vmm *v = cu->vmm;
    dt_cu_vmm_alloc *a = find(v, base);
    if (!a || !bytes)
        return 0;
    size_t g0, g1;
    span(v, a, off, bytes, false, &g0, &g1);
    // Pending releases in the range are cancelled first (no new memory needed), then the rest of
    // the queue is looked at.
    int rc = back_range(cu, a, g0, g1, "committing", err);
    dt_cuda_vmm_poll(cu, false);
    return rc;
}

void dt_cuda_vmm_close(dt_cuda *cu)
{
    dt_cu_vmm *v = cu->vmm;
    if (!v)
        return;
    // The caller synchronised the compute stream; another stream (NCCL's) may still read an
    // allocation, and cuMemUnmap does not wait for the device the way cudaFree does.
    if (!v->allocs.empty() && cudaDeviceSynchronize() != cudaSuccess)
        (void)cudaGetLastError();
    dt_cuda_vmm_poll(cu, true);
    for (auto &kv : v->allocs)
        destroy_alloc(cu, kv.second, false);
    v->allocs.clear();
    for (cudaEvent_t ev : v->spare)
        (void)cudaEventDestroy(ev);
    delete v;
    cu->vmm = NULL;
}
