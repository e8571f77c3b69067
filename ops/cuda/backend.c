/* CUDA backend: per device a stream, a cuBLAS handle bound to it and two events; memory from
 * cudaMalloc (the caching allocator above keeps it); transfers through pinned staging
 * buffers. Compiled only when the build found CUDA; with no usable GPU the device count is 0
 * and nothing else here runs.
 *
 * Ordering (dt__backend in common/dt.h): kernels and device copies are queued on the
 * device's stream and the host does not wait for them; to_host waits for what was queued
 * before it. Several logical devices of one physical GPU are several streams on it. */
#include "dt.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <string.h>

/* Transfers between host memory and a GPU go through two pinned buffers of this size per
 * device, so a chunk is copied by the host while the previous one crosses the bus (pinned
 * transfers run at 55 GB/s on the GPU machine, pageable ones at 7-9: BASELINE.md). */
#define DT__PINNED_BYTES ((size_t)4 << 20)

int dt__cuda_device_count(void)
{
    /* Without a driver cudaGetDeviceCount fails (and leaves the count untouched); any error
     * means no usable GPU. */
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

void dt__cuda_enable_peers(int n, const int ordinals[])
{
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            int can = 0;
            if (a == b || cudaDeviceCanAccessPeer(&can, ordinals[a], ordinals[b]) != cudaSuccess ||
                !can || cudaSetDevice(ordinals[a]) != cudaSuccess)
                continue;
            /* Already enabled (a second dt_init in this process) is not an error. */
            if (cudaDeviceEnablePeerAccess(ordinals[b], 0) != cudaSuccess)
                (void)cudaGetLastError();
        }
}

bool dt__cuda_can_access(int a, int b)
{
    int can = 0;
    return a == b || (cudaDeviceCanAccessPeer(&can, a, b) == cudaSuccess && can);
}

static dt_status check(cudaError_t e, const dt__device *d, const char *what, size_t bytes)
{
    if (e == cudaSuccess)
        return DT_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    return dt__fail(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_DEVICE,
                    "CUDA:%d (GPU %d): %s of %zu bytes failed: %s", d->local_index, d->ordinal,
                    what, bytes, cudaGetErrorString(e));
}

static cudaStream_t stream_of(const dt__device *d)
{
    return (cudaStream_t)d->kx.stream;
}

static dt_status cuda_enter(dt__device *d)
{
    return check(cudaSetDevice(d->ordinal), d, "cudaSetDevice", 0);
}

static void cuda_close(dt__device *d)
{
    if (cudaSetDevice(d->ordinal) != cudaSuccess)
        return;
    if (d->kx.stream)
        cudaStreamSynchronize(stream_of(d));
    if (d->kx.blas)
        cublasDestroy((cublasHandle_t)d->kx.blas);
    for (int i = 0; i < 2; i++) {
        if (d->pinned[i])
            cudaFreeHost(d->pinned[i]);
        if (d->pinned_ev[i])
            cudaEventDestroy((cudaEvent_t)d->pinned_ev[i]);
    }
    if (d->ev_ready)
        cudaEventDestroy((cudaEvent_t)d->ev_ready);
    if (d->ev_done)
        cudaEventDestroy((cudaEvent_t)d->ev_done);
    if (d->kx.stream)
        cudaStreamDestroy(stream_of(d));
    d->kx.stream = d->kx.blas = d->ev_ready = d->ev_done = NULL;
}

static dt_status cuda_open(dt__device *d)
{
    DT_TRY(cuda_enter(d));
    cudaStream_t st;
    DT_TRY(check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), d, "cudaStreamCreate", 0));
    d->kx.stream = st;
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++) {
        dt_status s = check(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), d,
                            "cudaEventCreate", 0);
        if (s != DT_OK) {
            if (i)
                cudaEventDestroy(ev[0]);
            cuda_close(d);
            return s;
        }
    }
    d->ev_ready = ev[0];
    d->ev_done = ev[1];
    cublasHandle_t h;
    cublasStatus_t b = cublasCreate(&h);
    if (b == CUBLAS_STATUS_SUCCESS) {
        d->kx.blas = h;
        b = cublasSetStream(h, st);
    }
    if (b == CUBLAS_STATUS_SUCCESS)
        /* Exact FP32 unless TF32 was allowed; the kernels pick the compute type per call. */
        b = cublasSetMathMode(h, d->kx.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (b != CUBLAS_STATUS_SUCCESS) {
        cuda_close(d);
        return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): cuBLAS setup failed: %s", d->local_index,
                        d->ordinal, cublasGetStatusString(b));
    }
    return DT_OK;
}

static dt_status cuda_alloc(dt__device *d, size_t bytes, void **out)
{
    DT_TRY(cuda_enter(d));
    return check(cudaMalloc(out, bytes ? bytes : 1), d, "cudaMalloc", bytes);
}

static void cuda_free(dt__device *d, void *p)
{
    if (cudaSetDevice(d->ordinal) == cudaSuccess)
        cudaFree(p);
}

/* The pinned staging buffers and their events, made on first use. */
static dt_status staging(dt__device *d)
{
    for (int i = 0; i < 2; i++) {
        if (!d->pinned[i])
            DT_TRY(check(cudaHostAlloc(&d->pinned[i], DT__PINNED_BYTES, cudaHostAllocDefault), d,
                         "cudaHostAlloc (staging)", DT__PINNED_BYTES));
        if (!d->pinned_ev[i]) {
            cudaEvent_t e;
            DT_TRY(check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), d, "cudaEventCreate",
                         0));
            d->pinned_ev[i] = e;
        }
    }
    return DT_OK;
}

static dt_status cuda_to_device(dt__device *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return DT_OK;
    DT_TRY(cuda_enter(d));
    DT_TRY(staging(d));
    cudaStream_t st = stream_of(d);
    /* Chunk c goes through buffer c % 2: the host fills it once the copy that last used it
     * has left (its event), while the other buffer's copy runs. */
    for (size_t off = 0, c = 0; off < bytes; off += DT__PINNED_BYTES, c++) {
        size_t n = bytes - off < DT__PINNED_BYTES ? bytes - off : DT__PINNED_BYTES;
        int b = (int)(c % 2);
        cudaEvent_t ev = (cudaEvent_t)d->pinned_ev[b];
        DT_TRY(check(cudaEventSynchronize(ev), d, "host-to-device copy", bytes));
        memcpy(d->pinned[b], (const char *)src + off, n);
        DT_TRY(
            check(cudaMemcpyAsync((char *)dst + off, d->pinned[b], n, cudaMemcpyHostToDevice, st),
                  d, "host-to-device copy", bytes));
        DT_TRY(check(cudaEventRecord(ev, st), d, "host-to-device copy", bytes));
    }
    return DT_OK;
}

static dt_status cuda_to_host(dt__device *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return DT_OK;
    DT_TRY(cuda_enter(d));
    DT_TRY(staging(d));
    cudaStream_t st = stream_of(d);
    size_t chunks = (bytes + DT__PINNED_BYTES - 1) / DT__PINNED_BYTES;
    /* Queue chunk c + 1 before the host takes chunk c out of its buffer. */
    for (size_t c = 0; c <= chunks; c++) {
        if (c < chunks) {
            size_t off = c * DT__PINNED_BYTES;
            size_t n = bytes - off < DT__PINNED_BYTES ? bytes - off : DT__PINNED_BYTES;
            int b = (int)(c % 2);
            DT_TRY(check(cudaMemcpyAsync(d->pinned[b], (const char *)src + off, n,
                                         cudaMemcpyDeviceToHost, st),
                         d, "device-to-host copy", bytes));
            DT_TRY(check(cudaEventRecord((cudaEvent_t)d->pinned_ev[b], st), d,
                         "device-to-host copy", bytes));
        }
        if (c > 0) {
            size_t off = (c - 1) * DT__PINNED_BYTES;
            size_t n = bytes - off < DT__PINNED_BYTES ? bytes - off : DT__PINNED_BYTES;
            int b = (int)((c - 1) % 2);
            /* Also reports a failure of any kernel queued before the copy. */
            DT_TRY(check(cudaEventSynchronize((cudaEvent_t)d->pinned_ev[b]), d,
                         "device-to-host copy", bytes));
            memcpy((char *)dst + off, d->pinned[b], n);
        }
    }
    return DT_OK;
}

static dt_status cuda_copy(dt__device *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return DT_OK;
    DT_TRY(cuda_enter(d));
    /* cudaMemcpyDefault: unified addressing finds each pointer's GPU (a peer copy when the
     * source is on another GPU). */
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(d)), d,
                 "device copy", bytes);
}

static dt_status cuda_sync(dt__device *d)
{
    DT_TRY(cuda_enter(d));
    return check(cudaStreamSynchronize(stream_of(d)), d, "queued work (cudaStreamSynchronize)", 0);
}

const dt__backend dt__cuda_backend = {
    .name = "cuda",
    .host_accessible = false,
    .open = cuda_open,
    .close = cuda_close,
    .enter = cuda_enter,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .kernels = dt__cuda_kernels,
    .device_collectives = true,
};
