// backend.cu - the CUDA backend of kernels/backend.h, built as libdtrain_cuda.so.
//
// The dtrain binary links no CUDA library: it dlopen()s this object when device = cuda (or auto)
// and calls dt_cuda_backend_create. This skeleton checks the driver and the device and reports
// clearly what is missing; the kernels land with the GPU issue.
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "kernels/backend.h"
}

extern "C" __attribute__((visibility("default"))) int dt_cuda_backend_create(
    dt_backend **out, const dt_backend_opts *opts, dt_err *err)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess)
        return dt_err_set(err, -ENODEV, "CUDA: no usable driver or device: %s",
                          cudaGetErrorString(rc));
    if (n == 0)
        return dt_err_set(err, -ENODEV, "CUDA: no GPU found");
    (void)out;
    (void)opts;
    return dt_err_set(err, -ENOSYS,
                      "CUDA: %d GPU(s) found, but the CUDA kernels are not in this build yet "
                      "(use device = cpu)",
                      n);
}
