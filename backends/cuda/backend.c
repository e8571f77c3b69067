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
#include <stdio.h>
#include <string.h>

/* Transfers between host memory and a GPU go through two pinned buffers of this size per
 * device, so a chunk is copied by the host while the previous one crosses the bus (pinned
 * transfers run at 55 GB/s on the GPU machine, pageable ones at 7-9: BASELINE.md). */
#define DT__PINNED_BYTES ((size_t)4 << 20)
/* Device scratch for the kernels of one device (partial results of multi-block reductions). */
#define DT__KERNEL_SCRATCH ((size_t)1 << 20)

int dt__cuda_device_count(void)
{
    /* Without a driver cudaGetDeviceCount fails (and leaves the count untouched); any error
     * means no usable GPU. */
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

bool dt__cuda_identity(int ordinal, unsigned char id[16])
{
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    static const unsigned char none[16];
    memcpy(id, p.uuid.bytes, 16);
    if (memcmp(id, none, 16) == 0) { /* no UUID: the PCI address tells it apart */
        memset(id, 0, 16);
        snprintf((char *)id, 16, "pci%04x%02x%02x", (unsigned)p.pciDomainID & 0xffff,
                 (unsigned)p.pciBusID & 0xff, (unsigned)p.pciDeviceID & 0xff);
    }
    return true;
}

dt_status dt__cuda_enable_peers(int n, const int ordinals[])
{
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            int can = 0;
            if (a == b || ordinals[a] == ordinals[b])
                continue;
            cudaError_t e = cudaDeviceCanAccessPeer(&can, ordinals[a], ordinals[b]);
            if (e == cudaSuccess && !can)
                continue; /* no peer access: such GPUs exchange through NCCL */
            if (e == cudaSuccess)
                e = cudaSetDevice(ordinals[a]);
            if (e == cudaSuccess)
                e = cudaDeviceEnablePeerAccess(ordinals[b], 0);
            /* already enabled (a second dt_init in this process) is not an error */
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                e = cudaSuccess;
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return dt__fail(DT_ERR_DEVICE,
                                "dt_init: enabling access from GPU %d to GPU %d failed: %s",
                                ordinals[a], ordinals[b], cudaGetErrorString(e));
            }
        }
    return DT_OK;
}

/* Errors after which the GPU's context is unusable: every later call fails the same way. */
static bool sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorECCUncorrectable:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
        return true;
    default:
        return false;
    }
}

/* A sticky error poisons every logical device of the GPU: mark them all dead (the message is
 * the current failure's). */
static void poisoned(const dt__device *d, cudaError_t e)
{
    if (!sticky(e))
        return;
    for (int i = 0; i < d->num_siblings; i++)
        if (d->siblings[i].ordinal == d->ordinal)
            dt__device_kill(&d->siblings[i]);
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
    dt_status s = dt__fail(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_DEVICE,
                           "CUDA:%d (GPU %d): %s of %zu bytes failed: %s", d->local_index,
                           d->ordinal, what, bytes, cudaGetErrorString(e));
    poisoned(d, e);
    return s;
}

static cudaStream_t stream_of(const dt__device *d)
{
    return (cudaStream_t)d->kx.stream;
}

static dt_status cuda_enter(dt__device *d)
{
    DT_TRY(dt__device_alive(d));
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
    if (d->kx.scratch)
        cudaFree(d->kx.scratch);
    d->kx.scratch = NULL;
    for (int i = 0; i < 2; i++) {
        if (d->pinned[i])
            cudaFreeHost(d->pinned[i]);
        if (d->pinned_ev[i])
            cudaEventDestroy((cudaEvent_t)d->pinned_ev[i]);
    }
    if (d->side)
        cudaStreamSynchronize((cudaStream_t)d->side);
    void *events[] = {d->ev_ready, d->ev_done, d->ev_in, d->ev_out};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        if (events[i])
            cudaEventDestroy((cudaEvent_t)events[i]);
    if (d->kx.stream)
        cudaStreamDestroy(stream_of(d));
    if (d->side)
        cudaStreamDestroy((cudaStream_t)d->side);
    d->kx.stream = d->kx.blas = d->ev_ready = d->ev_done = d->ev_in = d->ev_out = d->side = NULL;
}

/* Whether f32 gemms may use TF32 (dt__kctx.tf32 of the devices, the same on each): what the
 * printer names as their arithmetic. */
static bool tf32_allowed;

static dt_status cuda_open(dt__device *d)
{
    DT_TRY(cuda_enter(d));
    cudaStream_t st;
    DT_TRY(check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), d, "cudaStreamCreate", 0));
    d->kx.stream = st;
    /* the side stream of device collectives, at the GPU's highest priority (as PyTorch's NCCL
     * streams): communication is not queued behind compute that does not feed it */
    int lo = 0, hi = 0;
    cudaStream_t side;
    dt_status s = check(cudaDeviceGetStreamPriorityRange(&lo, &hi), d, "stream priorities", 0);
    if (s == DT_OK)
        s = check(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, hi), d,
                  "cudaStreamCreate", 0);
    if (s != DT_OK) {
        cuda_close(d);
        return s;
    }
    d->side = side;
    void **events[] = {&d->ev_ready, &d->ev_done, &d->ev_in, &d->ev_out};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++) {
        cudaEvent_t ev;
        s = check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), d, "cudaEventCreate", 0);
        if (s != DT_OK) {
            cuda_close(d);
            return s;
        }
        *events[i] = ev;
    }
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->ordinal) == cudaSuccess)
        d->kx.sms = sms;
    /* the kernels' scratch (multi-block reductions' partial results), on the compute stream */
    s = check(cudaMalloc(&d->kx.scratch, DT__KERNEL_SCRATCH), d, "cudaMalloc (kernel scratch)",
              DT__KERNEL_SCRATCH);
    if (s != DT_OK) {
        cuda_close(d);
        return s;
    }
    d->kx.scratch_bytes = DT__KERNEL_SCRATCH;
    cublasHandle_t h;
    cublasStatus_t b = cublasCreate(&h);
    if (b == CUBLAS_STATUS_SUCCESS) {
        d->kx.blas = h;
        b = cublasSetStream(h, st);
    }
    tf32_allowed = d->kx.tf32;
    if (b == CUBLAS_STATUS_SUCCESS)
        /* Exact FP32 unless TF32 was allowed; the kernels pick the compute type per call. A
         * 16-bit GEMM's split-K partial sums stay in its FP32 compute type (cuBLAS may
         * otherwise reduce them in 16 bits): rounded once, as the CPU's. */
        b = cublasSetMathMode(h, (d->kx.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
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
    /* a collective the copy waited for may have been aborted (the watchdog) */
    return dt__device_alive(d);
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
    DT_TRY(check(cudaStreamSynchronize(stream_of(d)), d, "queued work (cudaStreamSynchronize)", 0));
    /* a collective that failed while the stream waited for it (the watchdog's abort) */
    return dt__device_alive(d);
}

/* A kernel that fails to launch: when the GPU's context is gone (a sticky error of earlier
 * work), every logical device of it is dead. */
static dt_status cuda_launch(dt__device *d, dt__kernel_fn fn, const dt__kargs *k,
                             const void *const in[], void *out)
{
    dt_status s = fn(&d->kx, k, in, out);
    if (s != DT_OK)
        poisoned(d, cudaStreamQuery(stream_of(d)));
    return s;
}

/* ---- device collectives: the side stream ---------------------------------------------------- */

static dt_status cuda_side_after(dt__device *side, dt__device *member)
{
    DT_TRY(cuda_enter(side));
    DT_TRY(check(cudaEventRecord((cudaEvent_t)member->ev_in, stream_of(member)), member,
                 "cudaEventRecord", 0));
    return check(cudaStreamWaitEvent((cudaStream_t)side->side, (cudaEvent_t)member->ev_in, 0), side,
                 "cudaStreamWaitEvent (side after compute)", 0);
}

static dt_status cuda_after_side(dt__device *member, dt__device *side)
{
    DT_TRY(check(cudaSetDevice(member->ordinal), member, "cudaSetDevice", 0));
    DT_TRY(check(cudaEventRecord((cudaEvent_t)side->ev_out, (cudaStream_t)side->side), side,
                 "cudaEventRecord", 0));
    return check(cudaStreamWaitEvent(stream_of(member), (cudaEvent_t)side->ev_out, 0), member,
                 "cudaStreamWaitEvent (compute after side)", 0);
}

static dt_status cuda_side_copy(dt__device *side, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return DT_OK;
    DT_TRY(cuda_enter(side));
    return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)side->side),
                 side, "device copy (side stream)", bytes);
}

static dt_status cuda_side_combine(dt__device *side, const dt__combine *c)
{
    DT_TRY(cuda_enter(side));
    dt__kctx x = side->kx;
    x.stream = side->side;
    dt_status s = dt__cuda_combine(&x, c);
    if (s != DT_OK)
        poisoned(side, cudaStreamQuery((cudaStream_t)side->side));
    return s;
}

static const dt__dev_ops cuda_dev_ops = {
    .side_after = cuda_side_after,
    .after_side = cuda_after_side,
    .side_copy = cuda_side_copy,
    .side_combine = cuda_side_combine,
};

/* f32 uses TF32 tensor cores only when the user allowed it (dt_init_options.allow_tf32, one
 * setting for every device of the runtime, seen as the devices open); integer gemms are exact
 * loops. */
static const char *cuda_gemm_math(dt_dtype dtype)
{
    switch (dtype) {
    case DT_DTYPE_F32:
        return tf32_allowed ? "TF32 tensor cores (cuBLAS)" : "FP32 (cuBLAS sgemm)";
    case DT_DTYPE_F64:
        return "FP64 (cuBLAS dgemm)";
    case DT_DTYPE_BF16:
    case DT_DTYPE_F16:
        return "FP32 accumulation (cuBLAS GemmEx), rounded once";
    default:
        return "exact integer loops";
    }
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
    .launch = cuda_launch,
    .kernels = dt__cuda_kernels,
    .fused_reduce = true,
    .device_collectives = true,
    .dev = &cuda_dev_ops,
    .gemm_math = cuda_gemm_math,
};
