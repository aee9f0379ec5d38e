/* env.c - the DTRAIN_* table. Add new variables here, nowhere else. */
#include "common/env.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

const dt_env_var dt_env_vars[] = {
    {"DTRAIN_LOG", "info", "log level: debug, info, warn, error, off"},
    {"DTRAIN_STORE_ADDR", NULL, "host of the dtrain store (set by the agent for its workers)"},
    {"DTRAIN_STORE_PORT", NULL, "port of the dtrain store (set by the agent for its workers)"},
    {"DTRAIN_STORE_BIND", NULL, "address the rendezvous store of a job listens on (default: the address the job names, --master-addr or the host of --rdzv-endpoint; 0.0.0.0 = every interface)"},
    {"DTRAIN_STORE_TOKEN", NULL, "shared secret clients present to the store; the server requires it when set"},
    {"DTRAIN_RUN_ID", NULL, "run id (the rendezvous id); namespaces store keys and shared memory"},
    {"DTRAIN_ATTEMPT", "0", "restart attempt of the workers (same as TORCHELASTIC_RESTART_COUNT)"},
    {"DTRAIN_ROUND", "0", "rendezvous round of the workers: new on every restart and every membership change of an elastic job (namespace per-round state with it)"},
    {"DTRAIN_ERROR_FILE", NULL, "where a worker writes its JSON error record on a fatal error"},
    {"DTRAIN_CUDA_LIB", NULL, "path of libdtrain_cuda.so (default: next to the dtrain binary, else <prefix>/lib/dtrain beside an installed one)"},
    {"DTRAIN_NVML_LIB", NULL, "path of NVIDIA's management library, read for GPU counts and utilisation (default: libnvidia-ml.so.1)"},
    {"DTRAIN_CUDA_GEMM", "convert", "bf16/fp16 GEMMs on cuda: convert (operands rounded into a 16-bit scratch, native 16-bit GEMM) or fast (cuBLAS down-converts fp32 operands itself)"},
    {"DTRAIN_CUDA_ATTN", "cublas", "attention on cuda: cublas (batched GEMMs, probabilities kept) or flash (fused kernels, bf16/fp16 and head size 64 only; probabilities recomputed in backward)"},
    {"DTRAIN_CUDA_VMM", "1", "0: every cuda allocation comes from the arena (mem_release gives nothing back, ZeRO-2/3 keep everything resident); 1: allocations of a granule (2 MiB) and more use the driver's virtual memory management, when it has it"},
    {"DTRAIN_CPU_MEM_GRANULE", NULL, "cpu backend: the unit in which mem_release gives memory back (ZeRO-2/3), a power of two from the page size to 1 GiB (default: the page); 2097152 runs the strategies as on cuda's 2 MiB granules"},
    {"DTRAIN_CPU_MEM_POOL", "1", "cpu backend: 0 gives memory that mem_release releases back to the kernel at once; by default a page pool keeps it for the next mem_commit of the same category (ZeRO-3's windows, ZeRO-2's buckets: no page faults or zeroing each time), given back at a commit that does not need it all, at any allocation and before a budget would refuse"},
    {"DTRAIN_CPU_MEM_POISON", "0", "cpu backend: 1 makes mem_commit fill committed memory with 0xFF bytes (a NaN in every float), so that a strategy reading memory it has not written shows up; by default it holds whatever the pages held (the backend contract promises no contents, and cuda does not fill). The test binaries set 1"},
    {"DTRAIN_BLAS_PROBE", "auto", "the OpenBLAS kernel: when OPENBLAS_CORETYPE is unset and OpenBLAS picked a kernel far below what the CPU runs (Prescott on AVX-512), dtrain tries better ones in helper processes (results checked against double precision, timed), uses the first that passes and is 1.1x faster for its workers, benches and tests, warns about the others, and caches the verdict; auto, off (never) or force (probe even when OpenBLAS's choice looks right, ignoring the cache). A set OPENBLAS_CORETYPE (or any OPENBLAS_* variable) is never changed"},
    {"DTRAIN_BLAS_CACHE", NULL, "directory of the OpenBLAS kernel verdicts (one small file per CPU and library; default $XDG_CACHE_HOME/dtrain, ~/.cache/dtrain or /tmp/dtrain-UID), or off"},
    {"DTRAIN_BLAS_AS_IF", NULL, "testing the OpenBLAS kernel choice: act as if OpenBLAS had picked this kernel (e.g. Prescott, as on CPUs it does not recognise): the plan, the probe (OpenBLAS's own choice timed with it forced) and the cache (its own entries) go as they would there"},
    {"DTRAIN_BLAS_CHOICE", NULL, "set by dtrain beside OPENBLAS_CORETYPE when it chose the kernel: the kernel, its GFLOP/s and why, for the logs (informational)"},
    {"DTRAIN_CPU_ATTN_ISA", "auto", "cpu backend: instruction set of the attention micro-kernels: auto (the best this CPU runs), v4 (AVX-512), v3 (AVX2+FMA) or base (the build's baseline); to compare or test them"},
    {"DTRAIN_CUDA_TF32", "0", "1: precision fp32 on cuda may use TF32 tensor cores (GEMMs and convolutions)"},
    {"DTRAIN_REQUIRE_GPU", "0", "1: GPU tests fail instead of skipping when no GPU is usable (make test-gpu sets it)"},
    {"DTRAIN_LOCAL_ADDR", NULL, "address other nodes use to reach this node's workers"},
    {"DTRAIN_PYTHON", NULL, "the interpreter `dtrain SCRIPT.py` runs (below --python; default: python3 from PATH)"},
    {"DTRAIN_OUTPUT_DIR", NULL, "the launcher's job.output_dir: above the job file, below section.key=value overrides and flags"},
    {"DTRAIN_AGENT_PID", NULL, "pid of the worker's agent (set by the agent; the worker exits if its parent is another)"},
    {"DTRAIN_COMM_TRANSPORT", "auto", "cpu collectives: auto (shared memory on a host, TCP ring between hosts), shm, or tcp (TCP ring even on one host)"},
    {"DTRAIN_SYSFS", "/sys", "where sysfs is mounted: job.cpu_bind = auto reads there which CPUs are near each GPU"},
    {"DTRAIN_COMM_HOST_ID", NULL, "cpu collectives: host identity that groups ranks onto shared memory (default: host name + boot id + the device of /dev/shm)"},
    {"DTRAIN_COMM_SHM_SLOT_KB", "512", "cpu collectives: shared-memory staging per rank and pipeline step, in KiB (8 steps in flight)"},
    {"DTRAIN_COMM_SHM_MEM_MB", "-1", "cpu collectives: most communicator memory (DDP's gradients) a rank puts in /dev/shm, in MiB (-1 = no limit, 0 = none); beyond it, or when /dev/shm is full, the ranks of the host fall back to staged copies"},
    {"DTRAIN_COMM_SPIN_US", "50", "cpu collectives: microseconds a rank spins waiting for a peer before it sleeps"},
    {"DTRAIN_COMM_TCP_SEGMENT_KB", "256", "cpu collectives: TCP ring pipeline segment, in KiB"},
    {"DTRAIN_FLIGHT_FD", NULL, "descriptor of the worker's flight records, a mapping its agent made and reads (set by the agent)"},
    {"DTRAIN_FAULT", NULL, "test hook, for tests and benches only: rank:R,step:S,kind:K[,secs:N][,group:G] makes global rank R inject a fault at step S: kind skip-collective (does not issue its first collective of the step), p2p-size (posts its first point-to-point receive for half the count) or stall-data (sleeps secs, default 3600, in its data phase)"},
};
const size_t dt_env_vars_count = sizeof dt_env_vars / sizeof dt_env_vars[0];

const char *dt_env(const char *name)
{
    for (size_t i = 0; i < dt_env_vars_count; i++) {
        if (strcmp(dt_env_vars[i].name, name) != 0)
            continue;
        const char *v = getenv(name);
        return (v && *v) ? v : dt_env_vars[i].def;
    }
    DT_DEBUG("dt_env: %s is not in the DTRAIN_* table (common/env.c)", name);
    return NULL;
}
