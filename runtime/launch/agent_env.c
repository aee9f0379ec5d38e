/* agent_env.c - see agent_env.h. */
#include "runtime/launch/agent_env.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/nvml.h"
#include "common/util.h"

/* ---- environment builder ---------------------------------------------------------------- */

static int envb_grow(dt_envb *b, dt_err *err)
{
    if (b->n + 2 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 64;
    char **v = realloc(b->v, cap * sizeof *v);
    if (!v)
        return dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
    b->v = v;
    b->cap = cap;
    return 0;
}

int dt_envb_init(dt_envb *b, char *const *base, dt_err *err)
{
    memset(b, 0, sizeof *b);
    if (envb_grow(b, err))
        return err ? err->code : -ENOMEM;
    b->v[0] = NULL;
    for (size_t i = 0; base && base[i]; i++) {
        if (envb_grow(b, err))
            goto fail;
        if (!(b->v[b->n] = strdup(base[i]))) {
            dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
            goto fail;
        }
        b->v[++b->n] = NULL;
    }
    return 0;
fail:
    dt_envb_free(b);
    return -ENOMEM;
}

static ssize_t envb_find(const dt_envb *b, const char *name)
{
    size_t k = strlen(name);
    for (size_t i = 0; i < b->n; i++)
        if (!strncmp(b->v[i], name, k) && b->v[i][k] == '=')
            return (ssize_t)i;
    return -1;
}

int dt_envb_set(dt_envb *b, const char *name, const char *value, dt_err *err)
{
    size_t len = strlen(name) + strlen(value) + 2;
    char *s = malloc(len);
    if (!s)
        return dt_err_set(err, -ENOMEM, "out of memory building a worker's environment");
    snprintf(s, len, "%s=%s", name, value);
    ssize_t i = envb_find(b, name);
    if (i >= 0) {
        free(b->v[i]);
        b->v[i] = s;
        return 0;
    }
    if (envb_grow(b, err)) {
        free(s);
        return -ENOMEM;
    }
    b->v[b->n++] = s;
    b->v[b->n] = NULL;
    return 0;
}

int dt_envb_setf(dt_envb *b, dt_err *err, const char *name, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return dt_envb_set(b, name, buf, err);
}

const char *dt_envb_get(const dt_envb *b, const char *name)
{
    ssize_t i = envb_find(b, name);
    return i < 0 ? NULL : strchr(b->v[i], '=') + 1;
}

void dt_envb_free(dt_envb *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->n; i++)
        free(b->v[i]);
    free(b->v);
    memset(b, 0, sizeof *b);
}

int dt_agent_env_build(dt_envb *b, char *const *base, const dt_worker_env *w, dt_err *err)
{
    int rc = dt_envb_init(b, base, err);
    if (rc)
        return rc;
    const char *run_id = w->run_id ? w->run_id : "none";
    const char *ef = w->error_file ? w->error_file : "";
    /* torchrun's names, in the order its docs list them. */
    if ((rc = dt_envb_setf(b, err, "RANK", "%d", w->rank)) ||
        (rc = dt_envb_setf(b, err, "LOCAL_RANK", "%d", w->local_rank)) ||
        (rc = dt_envb_setf(b, err, "WORLD_SIZE", "%d", w->world_size)) ||
        (rc = dt_envb_setf(b, err, "LOCAL_WORLD_SIZE", "%d", w->local_world_size)) ||
        (rc = dt_envb_setf(b, err, "GROUP_RANK", "%d", w->group_rank)) ||
        (rc = dt_envb_setf(b, err, "GROUP_WORLD_SIZE", "%d", w->group_world_size)) ||
        (rc = dt_envb_setf(b, err, "ROLE_RANK", "%d", w->rank)) ||
        (rc = dt_envb_setf(b, err, "ROLE_WORLD_SIZE", "%d", w->world_size)) ||
        (rc = dt_envb_set(b, "ROLE_NAME", w->role && w->role[0] ? w->role : "default", err)) ||
        (rc = dt_envb_set(b, "MASTER_ADDR", w->master_addr ? w->master_addr : "127.0.0.1", err)) ||
        (rc = dt_envb_setf(b, err, "MASTER_PORT", "%d", w->master_port)) ||
        (rc = dt_envb_setf(b, err, "TORCHELASTIC_RESTART_COUNT", "%d", w->restart_count)) ||
        (rc = dt_envb_setf(b, err, "TORCHELASTIC_MAX_RESTARTS", "%d", w->max_restarts)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_RUN_ID", run_id, err)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_USE_AGENT_STORE", "False", err)) ||
        (rc = dt_envb_set(b, "TORCHELASTIC_ERROR_FILE", ef, err)))
        goto fail;
    if (w->omp_one && (rc = dt_envb_set(b, "OMP_NUM_THREADS", "1", err)))
        goto fail;
    /* As torchrun's local agent: a PyTorch NCCL collective that fails or hangs ends the process
     * (the agent then restarts the job) instead of blocking forever. */
    if (!dt_envb_get(b, "TORCH_NCCL_ASYNC_ERROR_HANDLING") &&
        (rc = dt_envb_set(b, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", err)))
        goto fail;
    /* dtrain's own (common/env.c). */
    if (w->store_addr && *w->store_addr) {
        if ((rc = dt_envb_set(b, "DTRAIN_STORE_ADDR", w->store_addr, err)) ||
            (rc = dt_envb_setf(b, err, "DTRAIN_STORE_PORT", "%d", w->store_port)))
            goto fail;
    }
    if ((rc = dt_envb_set(b, "DTRAIN_RUN_ID", run_id, err)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_ATTEMPT", "%d", w->restart_count)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_ROUND", "%d", w->round)) ||
        (rc = dt_envb_set(b, "DTRAIN_ERROR_FILE", ef, err)) ||
        (rc = dt_envb_set(b, "DTRAIN_LOCAL_ADDR", w->local_addr ? w->local_addr : "127.0.0.1", err)) ||
        (rc = dt_envb_setf(b, err, "DTRAIN_AGENT_PID", "%d", w->agent_pid)))
        goto fail;
    return 0;
fail:
    dt_envb_free(b);
    return rc;
}

/* ---- devices ---------------------------------------------------------------------------- */

/* Entries of dir whose name passes ok(). */
static int count_dir(const char *dir, bool (*ok)(const char *))
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (ok(e->d_name))
            n++;
    closedir(d);
    return n;
}

static bool is_nvidia_dev(const char *name)
{
    if (strncmp(name, "nvidia", 6) || !name[6])
        return false;
    for (const char *p = name + 6; *p; p++)
        if (!isdigit((unsigned char)*p))
            return false;
    return true;
}

static bool is_pci_dir(const char *name) { return name[0] != '.'; }

int dt_agent_visible_gpus(const char *vis, int physical)
{
    char buf[1024], *save = NULL;
    int n = 0;
    dt_strlcpy(buf, vis, sizeof buf);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = dt_trim(tok);
        int idx;
        if (!strncmp(tok, "GPU-", 4) || !strncmp(tok, "MIG-", 4))
            n++;
        else if (dt_parse_int(tok, &idx) == 0 && idx >= 0 && idx < physical)
            n++;
        else
            break;
    }
    return n < physical ? n : physical;
}

int dt_agent_count_gpus(char *how, size_t cap)
{
    const char *src = "/dev/nvidia*";
    int n = count_dir("/dev", is_nvidia_dev);
    if (n == 0) {
        src = "/proc/driver/nvidia/gpus";
        n = count_dir("/proc/driver/nvidia/gpus", is_pci_dir);
    }
    if (n == 0) {
        src = "NVML";
        n = dt_nvml_device_count();
    }
    if (n == 0)
        src = "no NVIDIA driver found";
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (n > 0 && vis) {
        n = dt_agent_visible_gpus(vis, n);
        if (how)
            snprintf(how, cap, "%s, CUDA_VISIBLE_DEVICES=%s", src, vis);
    } else if (how) {
        snprintf(how, cap, "%s", src);
    }
    return n;
}

int dt_agent_count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dt_agent_resolve_nproc(const char *spec, int *nproc, char *why, size_t cap, dt_err *err)
{
    char how[256] = "";
    int n;
    if (!strcmp(spec, "gpu") || !strcmp(spec, "auto")) {
        n = dt_agent_count_gpus(how, sizeof how);
        if (n > 0) {
            *nproc = n;
            if (why)
                snprintf(why, cap, "%d GPU%s (%s)", n, n == 1 ? "" : "s", how);
            return 0;
        }
        if (!strcmp(spec, "gpu"))
            return dt_err_set(err, -ENODEV,
                              "--nproc-per-node=gpu: no GPU visible (%s); use a number, cpu or auto",
                              how);
    }
    if (!strcmp(spec, "cpu") || !strcmp(spec, "auto")) {
        *nproc = dt_agent_count_cpus();
        if (why)
            snprintf(why, cap, "%d CPU%s%s", *nproc, *nproc == 1 ? "" : "s",
                     !strcmp(spec, "auto") ? " (no GPU found)" : "");
        return 0;
    }
    if (dt_parse_int(spec, &n) || n < 1 || n > 4096)
        return dt_err_set(err, -EINVAL,
                          "--nproc-per-node: \"%s\" must be a number from 1 to 4096, auto, cpu or gpu",
                          spec);
    *nproc = n;
    if (why)
        snprintf(why, cap, "%d", n);
    return 0;
}
