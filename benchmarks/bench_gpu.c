/* GPU benchmarks of one client, each beside its baseline measured in the same run (issue "CUDA
 * devices that compute"): prints CSV on stdout,
 *   case,param,dtensor,baseline,ratio,unit
 * where ratio = dtensor / baseline for rates (higher is better) and for eager dispatch the
 * microseconds per op (baseline: none, the target is <= 5 us).
 *   matmul_1gpu      dt_matmul on a 1-device CUDA mesh vs one direct cuBLAS call, n = 4096,
 *                    8192, f64, f32 and f32 with TF32 (TFLOP/s)
 *   matmul_sharded   rows-sharded A[x,U] @ B and contracting-sharded A[U,x] @ B[x,U] (with its
 *                    all-reduce) over 2 and 4 logical GPUs vs one cuBLAS call on the whole
 *                    f32 problem (TFLOP/s)
 *   eager_add        add of two 4x4 f32 tensors on a 1-GPU mesh (us per op, queued then waited)
 *   allreduce_2gpu   all-reduce of 256 MiB f32 between 2 logical GPUs, bus bandwidth
 *                    2(g-1)/g x bytes / time vs a 256 MiB device-to-device cudaMemcpy (GB/s:
 *                    bytes copied per second): the device copies and the combine kernel
 *                    (target >= 0.45, the ceiling being 0.5); "nccl": the same through NCCL
 *                    (one rank: the two logical GPUs combine on their GPU first)
 *   philox_fill      uniform f32 fill of 256 MiB vs the same copy (GB/s written; target
 *                    >= 0.8)
 *   reduce_full      the sum of 256 MiB f32 to one value (a loss, a norm: every block of the
 *                    GPU on it, two passes) vs the same copy (GB/s read)
 * Usage: bench_gpu [reps] (default 10). Run by benchmarks/gpu.sh. */
#include "bench.h"
#include "dtensor.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int reps = 10;

static void row(const char *name, const char *param, double mine, double base, const char *unit)
{
    printf("%s,%s,%.4g,%.4g,%.4f,%s\n", name, param, mine, base, base > 0 ? mine / base : 0, unit);
    fflush(stdout);
}

static void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static void start(int logical, int tf32)
{
    dt_init_options o = {.cuda_logical_devices = logical, .allow_tf32 = tf32 ? 1 : 2};
    BENCH_CHECK(dt_init(&o));
    if (dt_num_local_devices(DT_DEVICE_CUDA) == 0) {
        fprintf(stderr, "bench_gpu: no CUDA device\n");
        exit(1);
    }
}

static dt_mesh *gpu_mesh(int n)
{
    int ids[8];
    for (int i = 0; i < n; i++)
        ids[i] = i;
    const char *names[1] = {"x"};
    dt_mesh *m = NULL;
    BENCH_CHECK(dt_mesh_create_on_devices(1, names, (int[]){n}, DT_DEVICE_CUDA, n, ids, &m));
    return m;
}

/* count values uniform in [-1, 1) of dtype dt (f32 or f64) into device memory: the baseline
 * multiplies the same distribution as dtensor's random operands (a GPU's clock under load
 * depends on the data: zeros draw less power than random values). */
static void upload_uniform(void *dev, size_t count, dt_dtype dt, uint64_t seed)
{
    size_t es = dt_dtype_size(dt);
    void *host = malloc(count * es);
    if (!host) {
        fprintf(stderr, "bench_gpu: out of host memory\n");
        exit(1);
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; i++) {
        x ^= x << 13; /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        double u = (double)(x >> 11) * 0x1p-53 * 2 - 1;
        if (dt == DT_DTYPE_F64)
            ((double *)host)[i] = u;
        else
            ((float *)host)[i] = (float)u;
    }
    cuda_ok(cudaMemcpy(dev, host, count * es, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(host);
}

/* Seconds per call of one direct cuBLAS gemm of n x n (TF32 when asked), median-free mean. */
static double cublas_seconds(int n, dt_dtype dt, bool tf32)
{
    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
    size_t es = dt_dtype_size(dt), bytes = (size_t)n * (size_t)n * es;
    void *a, *b, *c;
    cuda_ok(cudaMalloc(&a, bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&b, bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&c, bytes), "cudaMalloc");
    upload_uniform(a, (size_t)n * (size_t)n, dt, 1);
    upload_uniform(b, (size_t)n * (size_t)n, dt, 2);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(1);
    }
    const double one = 1, zero = 0;
    const float onef = 1, zerof = 0;
    double t0 = 0;
    for (int r = -1; r < reps; r++) {
        if (r == 0) {
            cudaDeviceSynchronize();
            t0 = bench_now();
        }
        if (dt == DT_DTYPE_F64)
            cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
        else
            cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &onef, a, CUDA_R_32F, n, b,
                         CUDA_R_32F, n, &zerof, c, CUDA_R_32F, n,
                         tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    }
    cuda_ok(cudaDeviceSynchronize(), "cuBLAS baseline");
    double t = (bench_now() - t0) / reps;
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return t;
}

/* Seconds per dt_matmul of a (la) @ b (lb), n x n, waited on at the end. */
static double dt_matmul_seconds(dt_mesh *m, int n, dt_dtype dt, const char *la, const char *lb)
{
    dt_layout l1, l2;
    BENCH_CHECK(dt_layout_parse(m, la, &l1));
    BENCH_CHECK(dt_layout_parse(m, lb, &l2));
    const int64_t shape[2] = {n, n};
    dt_op_options o1 = {.layout = &l1}, o2 = {.layout = &l2};
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    BENCH_CHECK(dt_random_uniform(dt, 2, shape, 1, 1, -1, 1, &o1, &a));
    BENCH_CHECK(dt_random_uniform(dt, 2, shape, 1, 2, -1, 1, &o2, &b));
    double t0 = 0;
    for (int r = -1; r < reps; r++) {
        if (r == 0) {
            BENCH_CHECK(dt_tensor_wait(a));
            t0 = bench_now();
        }
        dt_tensor_free(c);
        BENCH_CHECK(dt_matmul(a, b, NULL, &c));
    }
    BENCH_CHECK(dt_tensor_wait(c));
    double t = (bench_now() - t0) / reps;
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
    return t;
}

static void matmul_1gpu(bool tf32)
{
    start(1, tf32);
    dt_mesh *m = gpu_mesh(1);
    for (int n = 4096; n <= 8192; n *= 2)
        for (int d = 0; d < 2; d++) {
            dt_dtype dt = d ? DT_DTYPE_F32 : DT_DTYPE_F64;
            if (tf32 && dt != DT_DTYPE_F32)
                continue;
            double flop = 2.0 * n * (double)n * n;
            double mine = dt_matmul_seconds(m, n, dt, "unsharded,unsharded", "unsharded,unsharded");
            double base = cublas_seconds(n, dt, tf32);
            char param[32];
            snprintf(param, sizeof param, "%s n=%d", tf32 ? "tf32" : dt_dtype_name(dt), n);
            row("matmul_1gpu", param, flop / mine * 1e-12, flop / base * 1e-12, "TFLOP/s");
        }
    dt_mesh_free(m);
    BENCH_CHECK(dt_finalize());
}

static void matmul_sharded(void)
{
    start(4, false);
    const int n = 8192;
    double flop = 2.0 * n * (double)n * n, base = cublas_seconds(n, DT_DTYPE_F32, false);
    for (int g = 2; g <= 4; g += 2) {
        dt_mesh *m = gpu_mesh(g);
        char param[48];
        double rows = dt_matmul_seconds(m, n, DT_DTYPE_F32, "x,unsharded", "unsharded,unsharded");
        snprintf(param, sizeof param, "rows %d gpus n=%d", g, n);
        row("matmul_sharded", param, flop / rows * 1e-12, flop / base * 1e-12, "TFLOP/s");
        double contr = dt_matmul_seconds(m, n, DT_DTYPE_F32, "unsharded,x", "x,unsharded");
        snprintf(param, sizeof param, "contracting %d gpus n=%d", g, n);
        row("matmul_sharded", param, flop / contr * 1e-12, flop / base * 1e-12, "TFLOP/s");
        dt_mesh_free(m);
    }
    BENCH_CHECK(dt_finalize());
}

static void eager_add(void)
{
    start(1, false);
    dt_mesh *m = gpu_mesh(1);
    dt_layout l;
    BENCH_CHECK(dt_layout_replicated(m, 2, &l));
    dt_op_options o = {.layout = &l};
    const int64_t shape[2] = {4, 4};
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    BENCH_CHECK(dt_ones(DT_DTYPE_F32, 2, shape, &o, &a));
    BENCH_CHECK(dt_ones(DT_DTYPE_F32, 2, shape, &o, &b));
    const int ops = 20000;
    double t0 = 0;
    for (int r = -100; r < ops; r++) {
        if (r == 0) {
            BENCH_CHECK(dt_tensor_wait(c));
            t0 = bench_now();
        }
        dt_tensor_free(c);
        BENCH_CHECK(dt_binary(DT_BINARY_ADD, a, b, NULL, &c));
    }
    BENCH_CHECK(dt_tensor_wait(c));
    row("eager_add", "4x4 f32 1 gpu", (bench_now() - t0) / ops * 1e6, 0, "us/op");
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
    dt_mesh_free(m);
    BENCH_CHECK(dt_finalize());
}

/* Bytes per second of one 256 MiB device-to-device cudaMemcpy on GPU 0 (bytes copied). */
static double copy_rate(size_t bytes)
{
    cuda_ok(cudaSetDevice(0), "cudaSetDevice");
    void *a, *b;
    cuda_ok(cudaMalloc(&a, bytes), "cudaMalloc");
    cuda_ok(cudaMalloc(&b, bytes), "cudaMalloc");
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double t0 = bench_now();
    for (int r = 0; r < reps; r++)
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cuda_ok(cudaDeviceSynchronize(), "copy baseline");
    double t = (bench_now() - t0) / reps;
    cudaFree(a);
    cudaFree(b);
    return (double)bytes / t;
}

/* The Philox fill and a full sum of `bytes` of f32 on one GPU, against the copy rate. */
static void fill_and_reduce(size_t bytes, double base)
{
    int64_t n = (int64_t)(bytes / 4);
    dt_layout r;
    dt_mesh *one = gpu_mesh(1);
    BENCH_CHECK(dt_layout_replicated(one, 1, &r));
    dt_op_options ro = {.layout = &r};
    dt_tensor *u = NULL, *s = NULL;
    double t0 = 0;
    for (int it = -1; it < reps; it++) {
        if (it == 0) {
            BENCH_CHECK(dt_tensor_wait(u));
            t0 = bench_now();
        }
        dt_tensor_free(u);
        BENCH_CHECK(dt_random_uniform(DT_DTYPE_F32, 1, &n, 3, (uint64_t)it + 1, 0, 1, &ro, &u));
    }
    BENCH_CHECK(dt_tensor_wait(u));
    double t = (bench_now() - t0) / reps;
    row("philox_fill", "256 MiB f32", (double)bytes / t * 1e-9, base * 1e-9, "GB/s");
    dt_layout scalar;
    BENCH_CHECK(dt_layout_replicated(one, 0, &scalar));
    dt_op_options so = {.layout = &scalar};
    for (int it = -1; it < reps; it++) {
        if (it == 0) {
            BENCH_CHECK(dt_tensor_wait(s));
            t0 = bench_now();
        }
        dt_tensor_free(s);
        BENCH_CHECK(dt_reduce(DT_REDUCE_SUM, u, 0, NULL, 0, &so, &s));
    }
    BENCH_CHECK(dt_tensor_wait(s));
    t = (bench_now() - t0) / reps;
    row("reduce_full", "256 MiB f32 sum", (double)bytes / t * 1e-9, base * 1e-9, "GB/s");
    dt_tensor_free(u);
    dt_tensor_free(s);
    dt_mesh_free(one);
}

static void allreduce_and_fill(void)
{
    start(2, false);
    const size_t bytes = (size_t)256 << 20;
    double base = copy_rate(bytes);
    for (int nccl = 0; nccl < 2; nccl++) {
        dt_mesh *m = gpu_mesh(2);
        if (nccl)
            BENCH_CHECK(dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_NCCL));
        dt_layout l;
        BENCH_CHECK(dt_layout_parse(m, "unsharded;partial_sum=x", &l));
        int64_t n = (int64_t)(bytes / 4);
        dt_op_options o = {.layout = &l};
        dt_tensor *x = NULL, *y = NULL;
        BENCH_CHECK(dt_ones(DT_DTYPE_F32, 1, &n, &o, &x));
        dt_layout r;
        BENCH_CHECK(dt_layout_replicated(m, 1, &r));
        double t0 = 0;
        for (int it = -1; it < reps; it++) {
            if (it == 0) {
                BENCH_CHECK(dt_tensor_wait(x));
                t0 = bench_now();
            }
            dt_tensor_free(y);
            BENCH_CHECK(dt_relayout(x, &r, NULL, &y)); /* partial -> replicated: an all-reduce */
        }
        BENCH_CHECK(dt_tensor_wait(y));
        double t = (bench_now() - t0) / reps, g = 2;
        row("allreduce_2gpu", nccl ? "256 MiB f32 nccl" : "256 MiB f32",
            2 * (g - 1) / g * (double)bytes / t * 1e-9, base * 1e-9, "GB/s");
        dt_tensor_free(x);
        dt_tensor_free(y);
        dt_mesh_free(m);
    }
    fill_and_reduce(bytes, base);
    BENCH_CHECK(dt_finalize());
}

int main(int argc, char **argv)
{
    if (argc > 1)
        reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : reps;
    printf("case,param,dtensor,baseline,ratio,unit\n");
    matmul_1gpu(false);
    matmul_1gpu(true);
    matmul_sharded();
    eager_add();
    allreduce_and_fill();
    return 0;
}
