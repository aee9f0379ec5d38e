/* backend.c - opening a backend by name; the CUDA one is loaded from libdtrain_cuda.so. The op
 * table's helpers (options, shapes, BatchNorm merge) are in backend_ops.c. */
#include "kernels/backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "common/util.h"

int dt_cuda_lib_path(char *buf, size_t cap)
{
    const char *env = dt_env("DTRAIN_CUDA_LIB");
    if (env)
        return dt_strlcpy(buf, env, cap) ? 0 : -ENAMETOOLONG;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -ENOENT;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    /* Where the library is, by layout: next to the binary (build/dtrain), one up for the test
     * binaries (build/tests/), and <prefix>/lib/dtrain for an installed <prefix>/bin/dtrain
     * (`make install`). The first that exists wins; when none does, the one this layout would
     * use is named, as an absolute path without "..", so the message says where to put it. */
    const char *base = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
    static const char *const rel[] = {".", "..", "../lib/dtrain"};
    int pick = !strcmp(base, "bin") ? 2 : !strcmp(base, "tests") ? 1 : 0;
    for (int i = 0; i < 3; i++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s/%s/libdtrain_cuda.so", exe, rel[i]);
        if (access(cand, R_OK) == 0) {
            pick = i;
            break;
        }
    }
    char real[PATH_MAX];
    if (!realpath(exe, real))
        dt_strlcpy(real, exe, sizeof real);
    if (pick > 0) { /* one directory up, without ".." */
        char *up = strrchr(real, '/');
        if (up && up != real)
            *up = '\0';
        else if (up)
            up[1] = '\0';
    }
    char out[PATH_MAX + 64];
    snprintf(out, sizeof out, "%s%s/libdtrain_cuda.so", strcmp(real, "/") ? real : "",
             pick == 2 ? "/lib/dtrain" : "");
    return dt_strlcpy(buf, out, cap) ? 0 : -ENAMETOOLONG;
}

static int open_cuda(dt_backend **out, const dt_backend_opts *opts, dt_err *err)
{
    char path[PATH_MAX];
    if (dt_cuda_lib_path(path, sizeof path) != 0)
        return dt_err_set(err, -ENOENT, "CUDA backend: cannot locate libdtrain_cuda.so "
                                        "(set DTRAIN_CUDA_LIB)");
    if (access(path, R_OK) != 0)
        return dt_err_set(err, -ENOENT,
                          "CUDA backend: %s not found: this dtrain was built without nvcc "
                          "(install the CUDA toolkit and rebuild, or use device = cpu)",
                          path);
    /* The handle is kept for the life of the process: kernels may run until exit. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return dt_err_set(err, -ENOENT, "CUDA backend: cannot load %s: %s", path, dlerror());
    dt_cuda_backend_create_fn create =
        (dt_cuda_backend_create_fn)(uintptr_t)dlsym(h, DT_CUDA_BACKEND_CREATE_SYMBOL);
    if (!create)
        return dt_err_set(err, -ENOENT, "CUDA backend: %s has no %s (rebuild it)", path,
                          DT_CUDA_BACKEND_CREATE_SYMBOL);
    return create(out, opts, err);
}

static const char *const kind_names[] = {"auto", "cpu", "cuda"};

const char *dt_backend_kind_name(dt_backend_kind kind)
{
    return (unsigned)kind < DT_ARRAY_LEN(kind_names) ? kind_names[kind] : "?";
}

int dt_backend_kind_parse(const char *name, dt_backend_kind *out, dt_err *err)
{
    for (size_t k = 0; k < DT_ARRAY_LEN(kind_names); k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (dt_backend_kind)k;
            return 0;
        }
    return dt_err_set(err, -EINVAL, "unknown device \"%s\" (use cpu, cuda or auto)", name);
}

int dt_backend_open(dt_backend **out, dt_backend_kind kind, const dt_backend_opts *opts,
                    dt_err *err)
{
    dt_backend_opts def;
    if (!opts) {
        dt_backend_opts_default(&def);
        opts = &def;
    }
    if (kind == DT_BACKEND_CPU)
        return dt_cpu_backend_create(out, opts, err);
    if (kind == DT_BACKEND_CUDA)
        return open_cuda(out, opts, err);
    if (kind == DT_BACKEND_AUTO) {
        dt_err why = {0};
        if (open_cuda(out, opts, &why) == 0)
            return 0;
        static atomic_bool said; /* once per process, not once per DP replica */
        if (!atomic_exchange(&said, true))
            DT_INFO("device = auto: using the CPU (%s)", why.msg);
        return dt_cpu_backend_create(out, opts, err);
    }
    return dt_err_set(err, -EINVAL, "unknown device kind %d (use cpu, cuda or auto)", (int)kind);
}

void dt_backend_close(dt_backend *be)
{
    if (be && be->close)
        be->close(be);
}

int dt_backend_bind_set(const dt_backend *be, const cpu_set_t *base, int k, int n,
                        cpu_set_t *out, dt_err *err)
{
    if (!be->device_pci_bus_id)
        return dt_cpuset_share(base, k, n, out, err);
    cpu_set_t *near = calloc((size_t)n, sizeof *near);
    char bus[64];
    int rc = near ? 0 : dt_err_set(err, -ENOMEM, "out of memory");
    for (int d = 0; d < n && !rc; d++) {
        if ((rc = be->device_pci_bus_id((dt_backend *)be, d, bus, sizeof bus)))
            dt_err_set(err, rc, "no PCI address for GPU %d", d);
        else
            rc = dt_cpuset_pci_local(dt_env("DTRAIN_SYSFS"), bus, &near[d], err);
    }
    if (!rc)
        rc = dt_cpuset_near_share(base, near, n, k, out, err);
    free(near);
    return rc;
}
