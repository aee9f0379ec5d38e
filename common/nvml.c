/* nvml.c - NVML through dlopen; see nvml.h.
 *
 * The few declarations needed are restated here from nvml.h (the driver's API, stable since
 * NVML 5): return codes are ints (0 = success), handles are opaque pointers, and a sample is a
 * 64-bit timestamp in microseconds followed by an 8-byte value whose type the call reports.
 */
#include "common/nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"

#define NVML_ERROR_NOT_FOUND 6
#define NVML_GPU_UTILIZATION_SAMPLES 1

typedef union nvml_value {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    int si;
    unsigned short us;
} nvml_value;

typedef struct nvml_sample {
    unsigned long long ts;
    nvml_value v;
} nvml_sample;

static struct {
    pthread_once_t once;
    void *lib;
    char why[256];
    int (*init)(void);
    int (*shutdown)(void);
    int (*count)(unsigned *);
    int (*by_bus)(const char *, void **);
    int (*samples)(void *, int, unsigned long long, int *, unsigned *, nvml_sample *);
    const char *(*str)(int);
} nv = {.once = PTHREAD_ONCE_INIT};

/* Kept loaded for the life of the process, like the CUDA backend. */
static void load(void)
{
    const char *path = dt_env("DTRAIN_NVML_LIB");
    if (!path || !*path)
        path = "libnvidia-ml.so.1";
    nv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!nv.lib) {
        snprintf(nv.why, sizeof nv.why, "NVML not available (%s: %s): no NVIDIA driver here?",
                 path, dlerror());
        return;
    }
    nv.init = (int (*)(void))dlsym(nv.lib, "nvmlInit_v2");
    nv.shutdown = (int (*)(void))dlsym(nv.lib, "nvmlShutdown");
    nv.count = (int (*)(unsigned *))dlsym(nv.lib, "nvmlDeviceGetCount_v2");
    nv.by_bus = (int (*)(const char *, void **))dlsym(nv.lib, "nvmlDeviceGetHandleByPciBusId_v2");
    nv.samples = (int (*)(void *, int, unsigned long long, int *, unsigned *,
                          nvml_sample *))dlsym(nv.lib, "nvmlDeviceGetSamples");
    nv.str = (const char *(*)(int))dlsym(nv.lib, "nvmlErrorString");
    if (!nv.init || !nv.shutdown || !nv.count || !nv.by_bus || !nv.samples) {
        snprintf(nv.why, sizeof nv.why, "%s lacks the NVML calls dtrain uses (a driver older "
                 "than NVML 5?)", path);
        dlclose(nv.lib);
        nv.lib = NULL;
    }
}

static bool usable(dt_err *err)
{
    pthread_once(&nv.once, load);
    if (!nv.lib)
        dt_err_set(err, -ENOENT, "%s", nv.why);
    return nv.lib != NULL;
}

static int nv_err(dt_err *err, int rc, const char *what)
{
    const char *s = nv.str ? nv.str(rc) : NULL;
    return dt_err_set(err, rc == NVML_ERROR_NOT_FOUND ? -ENOENT : -EIO, "NVML %s: %s (%d)", what,
                      s ? s : "error", rc);
}

int dt_nvml_device_count(void)
{
    unsigned n = 0;
    if (!usable(NULL) || nv.init() != 0)
        return 0;
    if (nv.count(&n) != 0)
        n = 0;
    nv.shutdown();
    return (int)n;
}

static double value_of(int type, const nvml_value *v)
{
    switch (type) {
    case 0: return v->d;
    case 1: return v->ui;
    case 2: return (double)v->ul;
    case 3: return (double)v->ull;
    case 4: return (double)v->sll;
    case 5: return v->si;
    case 6: return v->us;
    default: return -1;
    }
}

/* The GPU-utilisation samples newer than `since`: their sum and count, and the newest stamp. */
static int read_samples(void *dev, unsigned long long since, double *sum, unsigned *n,
                        unsigned long long *newest, dt_err *err)
{
    *sum = 0;
    *n = 0;
    *newest = since;
    int type = 0;
    unsigned count = 0;
    int rc = nv.samples(dev, NVML_GPU_UTILIZATION_SAMPLES, since, &type, &count, NULL);
    if (rc == NVML_ERROR_NOT_FOUND || (rc == 0 && count == 0))
        return 0;
    if (rc != 0)
        return nv_err(err, rc, "nvmlDeviceGetSamples");
    nvml_sample *s = calloc(count, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "NVML: out of memory");
    rc = nv.samples(dev, NVML_GPU_UTILIZATION_SAMPLES, since, &type, &count, s);
    if (rc == NVML_ERROR_NOT_FOUND)
        count = 0;
    else if (rc != 0) {
        free(s);
        return nv_err(err, rc, "nvmlDeviceGetSamples");
    }
    for (unsigned i = 0; i < count; i++) {
        double v = value_of(type, &s[i].v);
        if (s[i].ts <= since || v < 0)
            continue;
        *sum += v;
        (*n)++;
        if (s[i].ts > *newest)
            *newest = s[i].ts;
    }
    free(s);
    return 0;
}

int dt_gpu_busy_begin(dt_gpu_busy *b, const char *pci_bus_id, dt_err *err)
{
    memset(b, 0, sizeof *b);
    if (!usable(err))
        return -ENOENT;
    int rc = nv.init();
    if (rc != 0)
        return nv_err(err, rc, "nvmlInit");
    if ((rc = nv.by_bus(pci_bus_id, &b->dev)) != 0) {
        rc = nv_err(err, rc, "no GPU at that PCI bus id");
        dt_err_prefix(err, "%s: ", pci_bus_id);
        nv.shutdown();
        b->dev = NULL;
        return rc;
    }
    double sum;
    unsigned n;
    if ((rc = read_samples(b->dev, 0, &sum, &n, &b->since, err)) != 0) {
        nv.shutdown();
        b->dev = NULL;
    }
    return rc;
}

int dt_gpu_busy_end(dt_gpu_busy *b, double *percent, dt_err *err)
{
    *percent = -1;
    if (!b->dev)
        return dt_err_set(err, -EINVAL, "GPU utilisation: no interval was begun");
    double sum;
    unsigned n;
    unsigned long long newest;
    int rc = read_samples(b->dev, b->since, &sum, &n, &newest, err);
    nv.shutdown();
    b->dev = NULL;
    if (rc)
        return rc;
    if (n == 0)
        return dt_err_set(err, -ENODATA, "GPU utilisation: the driver took no sample in the "
                                         "interval (shorter than its sampling period)");
    *percent = sum / n;
    return 0;
}
