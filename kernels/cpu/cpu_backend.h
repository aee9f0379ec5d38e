/* cpu_backend.h - the CPU backend's public entry points (kernels/cpu).
 *
 * kernels/backend.h includes this file, so users get these through it; the CPU backend's
 * internals are in cpu.h. Includes only kernels/backend_ops.h (the op table), never backend.h.
 */
#ifndef DT_KERNELS_CPU_BACKEND_H
#define DT_KERNELS_CPU_BACKEND_H

#include "common/err.h"
#include "kernels/backend_ops.h"

/* Creates the CPU backend directly; the contract of dt_cuda_backend_create_fn (opts may be
 * NULL: dt_backend_opts_default). */
int dt_cpu_backend_create(dt_backend **out, const dt_backend_opts *opts, dt_err *err);

/* CPU backend: binds the BLAS library's own threads (started when a backend set the thread
 * count, or at load) to the CPUs the calling thread may use now: call it after narrowing the
 * caller's affinity (job.cpu_bind). Returns how many threads it bound; 0 when the library has
 * no way to (then they run where the scheduler puts them). */
int dt_cpu_backend_bind_blas_threads(void);

#endif
