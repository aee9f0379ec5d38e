// core.cu - what every file of the CUDA backend reports to: the instance's failure state
// (dt_cuda_note) and its memory statistics (dt_cuda_mem_charge), below the arena (backend.cu),
// the virtual-memory allocator (vmm.cu) and the kernels (gemm.cu, ops.cu), so that none of them
// calls back into another.
#include <stdio.h>

#include "kernels/cuda/cuda_internal.h"

bool dt_cuda_note(dt_cuda *cu, bool ok, const char *what, const char *detail, const char *file,
                  int line)
{
    if (ok)
        return true;
    if (!cu->failed) {
        cu->failed = true;
        snprintf(cu->fail_msg, sizeof cu->fail_msg, "%s failed: %s (%s:%d)", what,
                 detail ? detail : "?", file, line);
        dt_log_write(DT_LOG_ERROR, file, line,
                     "CUDA backend on device %d: %s: %s. The device state is unusable from here "
                     "on; read-backs now return NaN so the worker stops (rerun with "
                     "CUDA_LAUNCH_BLOCKING=1 to locate an asynchronous fault)",
                     cu->device, what, detail ? detail : "?");
    }
    return false;
}

void dt_cuda_mem_charge(dt_cuda *cu, dt_mem_cat cat, size_t bytes, bool add)
{
    dt_cu_mem *m = &cu->mem;
    if (add) {
        dt_mem_stats_add(&m->stats, cat, bytes);
        m->in_use += bytes;
        if (m->in_use > m->peak)
            m->peak = m->in_use;
    } else {
        dt_mem_stats_sub(&m->stats, cat, bytes);
        m->in_use -= bytes < m->in_use ? bytes : m->in_use;
    }
}
