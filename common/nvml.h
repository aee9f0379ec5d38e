/* nvml.h - what dtrain reads from NVML, NVIDIA's management library (libnvidia-ml.so.1, part of
 * the driver), opened with dlopen: no CUDA context, no link-time dependency, so the launcher and
 * the benchmarks can ask without touching a GPU. DTRAIN_NVML_LIB names another library (tests).
 * Everything here fails soft: without a driver the answers are "none" or an error saying why.
 */
#ifndef DT_NVML_H
#define DT_NVML_H

#include "common/err.h"

/* GPUs the driver sees (0 when NVML is unusable). */
int dt_nvml_device_count(void);

/* GPU utilisation over an interval, as nvidia-smi's "GPU-Util": the percentage of time one or
 * more kernels ran, from the samples the driver takes (about every 1/6 s) between begin and end. */
typedef struct dt_gpu_busy {
    void *dev;                 /* nvmlDevice_t */
    unsigned long long since;  /* newest sample timestamp at begin (us) */
} dt_gpu_busy;

/* Starts an interval on the GPU at pci_bus_id ("0000:3b:00.0", as cudaDeviceGetPCIBusId gives
 * it). -ENOENT when NVML or the GPU is not there, with the reason. */
int dt_gpu_busy_begin(dt_gpu_busy *b, const char *pci_bus_id, dt_err *err);

/* *percent = the mean of the samples taken since begin. -ENODATA when the driver took none (an
 * interval shorter than its sampling period). */
int dt_gpu_busy_end(dt_gpu_busy *b, double *percent, dt_err *err);

#endif
