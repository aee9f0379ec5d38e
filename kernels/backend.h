/* backend.h - opening a backend by name; what every user of the kernels includes.
 *
 * The op table models are written against (struct dt_backend), its conventions and the types
 * around it live in kernels/backend_ops.h, which this header includes, as it includes the CPU
 * backend's entry points (kernels/cpu/cpu_backend.h): users include this file only. This module
 * is the registry: it knows the implementations (kernels/cpu directly, kernels/cuda through
 * dlopen of libdtrain_cuda.so); the implementations include backend_ops.h, never this file.
 */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H

#include <stddef.h>

#include "common/cpuset.h"
#include "common/err.h"
#include "kernels/backend_ops.h"
#include "kernels/cpu/cpu_backend.h"

/* Opens a backend of kind: DT_BACKEND_CPU, DT_BACKEND_CUDA (loads libdtrain_cuda.so:
 * DTRAIN_CUDA_LIB, else next to the running binary; a missing library, driver or GPU is a clear
 * error saying which) or DT_BACKEND_AUTO (cuda when it loads and sees a GPU, else cpu with a
 * notice). opts may be NULL. */
int dt_backend_open(dt_backend **out, dt_backend_kind kind, const dt_backend_opts *opts,
                    dt_err *err);

/* "auto", "cpu", "cuda"; "?" for a value that is none of them. */
const char *dt_backend_kind_name(dt_backend_kind kind);

/* The kind called name (one of dt_backend_kind_name's): 0, or -EINVAL with a message listing the
 * names. */
int dt_backend_kind_parse(const char *name, dt_backend_kind *out, dt_err *err);

/* Accepts NULL. */
void dt_backend_close(dt_backend *be);

/* Where libdtrain_cuda.so (the CUDA backend and the NCCL comm backend) is: DTRAIN_CUDA_LIB, else
 * next to the running binary (or one folder up, for the test binaries in build/tests). 0, or
 * -ENOENT / -ENAMETOOLONG; the file may still be missing. */
int dt_cuda_lib_path(char *buf, size_t cap);

/* The CPUs, within base, for local slot k of n (a node's worker k, or DP replica k), which
 * runs on device k of be's kind (job.cpu_bind = auto): on the CPU, share k of n of base
 * (dt_cpuset_share); on a GPU backend (device_pci_bus_id), its share of the CPUs near GPU k
 * (dt_cpuset_near_share over devices 0..n-1, sysfs at DTRAIN_SYSFS). Fails, out untouched,
 * when there is no such share (fewer CPUs than slots, no NUMA information, a cgroup without
 * the GPU's node). */
int dt_backend_bind_set(const dt_backend *be, const cpu_set_t *base, int k, int n,
                        cpu_set_t *out, dt_err *err);

#endif
