/* nvml.c - a stand-in for libnvidia-ml.so.1, for tests of common/nvml.c on machines without a
 * driver (DTRAIN_NVML_LIB=build/tests/libfake_nvml.so). It knows one GPU, at bus id
 * 0000:3b:00.0, whose utilisation samples are FAKE_NVML_SAMPLES: "timestamp:percent ..." (us),
 * and it counts nvmlInit_v2 against nvmlShutdown (fake_nvml_inits). Built with -fPIC -shared.
 */
#include <stdlib.h>
#include <string.h>

typedef struct sample {
    unsigned long long ts;
    union {
        unsigned int ui;
        unsigned long long ull;
    } v;
} sample;

static int inits;
static int dev;

int fake_nvml_inits(void) { return inits; }

int nvmlInit_v2(void)
{
    inits++;
    return 0;
}

int nvmlShutdown(void)
{
    inits--;
    return inits < 0 ? 1 : 0;
}

int nvmlDeviceGetCount_v2(unsigned *n)
{
    *n = 1;
    return 0;
}

const char *nvmlErrorString(int rc) { return rc == 6 ? "Not Found" : "Unknown Error"; }

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **out)
{
    if (inits <= 0)
        return 1; /* uninitialized */
    if (strcmp(bus, "0000:3b:00.0") != 0)
        return 6;
    *out = &dev;
    return 0;
}

int nvmlDeviceGetSamples(void *d, int type, unsigned long long since, int *vtype, unsigned *count,
                         sample *out)
{
    if (inits <= 0 || d != &dev || type != 1)
        return 2; /* invalid argument */
    const char *spec = getenv("FAKE_NVML_SAMPLES");
    unsigned n = 0, cap = *count;
    *vtype = 1; /* unsigned int */
    for (const char *p = spec ? spec : ""; *p;) {
        char *end;
        unsigned long long ts = strtoull(p, &end, 10);
        if (end == p || *end != ':')
            break;
        unsigned v = (unsigned)strtoul(end + 1, &end, 10);
        if (ts > since) {
            if (out && n < cap) {
                out[n].ts = ts;
                out[n].v.ull = 0;
                out[n].v.ui = v;
            }
            n++;
        }
        p = end;
        while (*p == ' ')
            p++;
    }
    if (out && n > cap)
        n = cap;
    *count = n;
    return n ? 0 : 6; /* NVML_ERROR_NOT_FOUND: no sample newer than since */
}
