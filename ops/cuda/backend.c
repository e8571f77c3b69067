/* CUDA backend: device buffers from cudaMalloc, copies through the runtime API. Compiled only
 * when the build found CUDA; with no usable GPU the device count is 0 and nothing else runs. */
#include "dt.h"

#include <cuda_runtime.h>

int dt__cuda_device_count(void)
{
    /* Without a driver cudaGetDeviceCount fails (and leaves the count untouched); any error
     * means no usable GPU. */
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

static dt_status cuda_check(cudaError_t e, dt__device *d, const char *what, size_t bytes)
{
    if (e == cudaSuccess)
        return DT_OK;
    return dt__fail(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_DEVICE,
                    "CUDA:%d: %s of %zu bytes failed: %s", d->ordinal, what, bytes,
                    cudaGetErrorString(e));
}

static dt_status cuda_alloc(dt__device *d, size_t bytes, void **out)
{
    DT_TRY(cuda_check(cudaSetDevice(d->ordinal), d, "cudaSetDevice", 0));
    return cuda_check(cudaMalloc(out, bytes ? bytes : 1), d, "cudaMalloc", bytes);
}

static void cuda_free(dt__device *d, void *p)
{
    cudaSetDevice(d->ordinal);
    cudaFree(p);
}

static dt_status cuda_memcpy(dt__device *d, void *dst, const void *src, size_t bytes,
                             enum cudaMemcpyKind kind)
{
    if (!bytes)
        return DT_OK;
    DT_TRY(cuda_check(cudaSetDevice(d->ordinal), d, "cudaSetDevice", 0));
    return cuda_check(cudaMemcpy(dst, src, bytes, kind), d, "cudaMemcpy", bytes);
}

static dt_status cuda_to_device(dt__device *d, void *dst, const void *src, size_t bytes)
{
    return cuda_memcpy(d, dst, src, bytes, cudaMemcpyHostToDevice);
}

static dt_status cuda_to_host(dt__device *d, void *dst, const void *src, size_t bytes)
{
    return cuda_memcpy(d, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static dt_status cuda_copy(dt__device *d, void *dst, const void *src, size_t bytes)
{
    return cuda_memcpy(d, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

const dt__backend dt__cuda_backend = {
    .name = "cuda",
    .host_accessible = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
};
