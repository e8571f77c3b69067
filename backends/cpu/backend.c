/* CPU backend: device buffers are 64-byte aligned host memory. */
#include "dt.h"
#include "pool.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

static dt_status cpu_alloc(dt__device *d, size_t bytes, void **out)
{
    /* Round up: aligned_alloc wants a multiple of the alignment; 0 bytes still gets a unique
     * pointer so empty shards need no special case. */
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return dt__fail(DT_ERR_NOMEM, "CPU:%d: cannot allocate %zu bytes", d->local_index, bytes);
    *out = p;
    return DT_OK;
}

static void cpu_free(dt__device *d, void *p)
{
    (void)d;
    free(p);
}

static dt_status cpu_copy(dt__device *d, void *dst, const void *src, size_t bytes)
{
    (void)d;
    if (bytes)
        memcpy(dst, src, bytes);
    return DT_OK;
}

/* The kernel threads of a device owning `cores` cores: DTENSOR_CPU_KERNEL_THREADS, else the
 * cores; false for a malformed value. */
static bool kernel_threads(int cores, int *out)
{
    *out = cores > 1 ? cores : 1;
    const char *env = getenv("DTENSOR_CPU_KERNEL_THREADS");
    if (!env || !*env)
        return true;
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || v < 1 || v > 256)
        return false;
    *out = (int)v;
    return true;
}

/* Whether the kernel threads split gemms: unless the user's OPENBLAS_NUM_THREADS (which
 * OpenBLAS read when it loaded) keeps OpenBLAS's own threads, more than one; with 1, OpenBLAS
 * runs one thread a call as the split needs. */
static bool gemm_on_pool(bool *user)
{
    const char *env = getenv("OPENBLAS_NUM_THREADS");
    *user = env && *env;
    return !*user || openblas_get_num_threads() == 1;
}

/* The device's kernel threads; a pool only for more than one (devices with a core each run
 * kernels on their worker alone). */
static dt_status cpu_open(dt__device *d)
{
    int threads;
    bool user;
    if (!kernel_threads(d->kx.cores, &threads))
        return dt__fail(DT_ERR_ARG,
                        "dt_init: DTENSOR_CPU_KERNEL_THREADS is '%s', expected 1 to 256",
                        getenv("DTENSOR_CPU_KERNEL_THREADS"));
    if (threads < 2)
        return DT_OK;
    return dt__cpu_pool_open(threads, threads <= d->kx.cores, gemm_on_pool(&user), &d->kx.pool);
}

static void cpu_close(dt__device *d)
{
    dt__cpu_pool_close(d->kx.pool);
    d->kx.pool = NULL;
}

/* OpenBLAS's threads a call (openblas_set_num_threads is process-wide, so every device of the
 * process gets the same): one when the devices' kernel threads split gemms (OpenBLAS's own
 * threads would only compete with them for the cores), else the cores of a device; a user's
 * OPENBLAS_NUM_THREADS keeps control. */
int dt__cpu_blas_threads(int cores_per_device, bool *user, bool *split)
{
    int threads;
    *split = gemm_on_pool(user) && kernel_threads(cores_per_device, &threads) && threads > 1;
    if (!*user)
        openblas_set_num_threads(*split ? 1 : cores_per_device > 1 ? cores_per_device : 1);
    return openblas_get_num_threads();
}

/* Integer gemms are exact loops; the 16-bit floats are widened to f32 for sgemm. */
const char *dt__cpu_gemm_math(dt_dtype dtype)
{
    switch (dtype) {
    case DT_DTYPE_F32:
        return "FP32 (OpenBLAS sgemm)";
    case DT_DTYPE_F64:
        return "FP64 (OpenBLAS dgemm)";
    case DT_DTYPE_BF16:
    case DT_DTYPE_F16:
        return "FP32 accumulation (OpenBLAS sgemm on widened copies), rounded once";
    default:
        return "exact integer loops";
    }
}

const dt__backend dt__cpu_backend = {
    .name = "cpu",
    .host_accessible = true,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .kernels = dt__cpu_kernels,
    .fused_reduce = true,
    .gemm_math = dt__cpu_gemm_math,
};
