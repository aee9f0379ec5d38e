/* agent_env.c - see agent_env.h. */
#include "runtime/launch/agent_env.h"

#include <ctype.h>
#include <stdbool.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/nvml.h"
#include "common/util.h"

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

int dt_agent_resolve_nproc(const dt_nproc *spec, int *nproc, char *why, size_t cap, dt_err *err)
{
    char how[256] = "";
    int n;
    bool automatic = spec->kind == DT_NPROC_AUTO;
    if (spec->kind == DT_NPROC_GPU || automatic) {
        n = dt_agent_count_gpus(how, sizeof how);
        if (n > 0) {
            *nproc = n;
            if (why)
                snprintf(why, cap, "%d GPU%s (%s)", n, n == 1 ? "" : "s", how);
            return 0;
        }
        if (!automatic)
            return dt_err_set(err, -ENODEV,
                              "--nproc-per-node=gpu: no GPU visible (%s); use a number, cpu or auto",
                              how);
    }
    if (spec->kind == DT_NPROC_CPU || automatic) {
        *nproc = dt_agent_count_cpus();
        if (why)
            snprintf(why, cap, "%d CPU%s%s", *nproc, *nproc == 1 ? "" : "s",
                     automatic ? " (no GPU found)" : "");
        return 0;
    }
    if (spec->kind != DT_NPROC_NUMBER || spec->n < 1 || spec->n > DT_NPROC_MAX)
        return dt_err_set(err, -EINVAL,
                          "--nproc-per-node: %d must be a number from 1 to %d, auto, cpu or gpu",
                          spec->n, DT_NPROC_MAX);
    *nproc = spec->n;
    if (why)
        snprintf(why, cap, "%d", spec->n);
    return 0;
}

/* ---- the environment's defaults ------------------------------------------------------------ */

int dt_agent_env_defaults(dt_envb *env, char *const *extra, dt_err *err)
{
    for (; extra && *extra; extra++) {
        const char *eq = strchr(*extra, '=');
        char name[128];
        if (!eq || eq == *extra || (size_t)(eq - *extra) >= sizeof name)
            return dt_err_set(err, -EINVAL, "worker environment: \"%s\" is not NAME=value",
                              *extra);
        memcpy(name, *extra, (size_t)(eq - *extra));
        name[eq - *extra] = '\0';
        int rc;
        if (!dt_envb_get(env, name) && (rc = dt_envb_set(env, name, eq + 1, err)))
            return rc;
    }
    return 0;
}
