/* CUDA devices of one client: random numbers bitwise as on the CPU, transfers through the
 * pinned staging buffers, the caching allocator, the GEMM math the printer names, copies
 * between CPU and GPU meshes. Every test is skipped, and says so, without a GPU. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void start(int cpu, int logical, int tf32)
{
    if (ref_cuda_devices(0, 1) == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    dt_init_options o = {.cpu_devices = cpu, .cuda_logical_devices = logical, .allow_tf32 = tf32};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
}

static dt_mesh *mesh_of(dt_device_type type, int n)
{
    int ids[8];
    for (int i = 0; i < n; i++)
        ids[i] = i;
    const char *names[1] = {"x"};
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_on_devices(1, names, (int[]){n}, type, n, ids, &m), DT_OK, "%s",
                 dt_last_error());
    return m;
}

static void *read_all(const dt_tensor *t, size_t bytes)
{
    void *buf = malloc(bytes);
    cr_assert_eq(dt_tensor_read(t, buf, bytes), DT_OK, "%s", dt_last_error());
    return buf;
}

/* One Philox source and one conversion: the same (seed, key, index) gives the same bits on a
 * GPU as on the CPU, for uniform and normal, f32 and f64, sharded over logical GPUs. */
Test(cuda, random_bitwise_as_on_the_cpu)
{
    start(1, 2, 0);
    dt_mesh *cpu = mesh_of(DT_DEVICE_CPU, 1), *gpu = mesh_of(DT_DEVICE_CUDA, 2);
    dt_layout lc, lg;
    cr_assert_eq(dt_layout_parse(cpu, "unsharded,unsharded", &lc), DT_OK);
    cr_assert_eq(dt_layout_parse(gpu, "x,unsharded", &lg), DT_OK);
    const int64_t shape[2] = {333, 77};
    for (int f64 = 0; f64 < 2; f64++)
        for (int normal = 0; normal < 2; normal++) {
            dt_dtype dt = f64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
            dt_tensor *a = NULL, *b = NULL;
            dt_op_options oc = {.layout = &lc}, og = {.layout = &lg};
            dt_status sa = normal ? dt_random_normal(dt, 2, shape, 5, 9, 1, 2, &oc, &a)
                                  : dt_random_uniform(dt, 2, shape, 5, 9, -1, 3, &oc, &a);
            dt_status sb = normal ? dt_random_normal(dt, 2, shape, 5, 9, 1, 2, &og, &b)
                                  : dt_random_uniform(dt, 2, shape, 5, 9, -1, 3, &og, &b);
            cr_assert(sa == DT_OK && sb == DT_OK, "%s", dt_last_error());
            size_t bytes = (size_t)(shape[0] * shape[1]) * dt_dtype_size(dt);
            void *x = read_all(a, bytes), *y = read_all(b, bytes);
            cr_expect(memcmp(x, y, bytes) == 0, "%s %s differs between CPU and GPU",
                      normal ? "normal" : "uniform", dt_dtype_name(dt));
            free(x);
            free(y);
            dt_tensor_free(a);
            dt_tensor_free(b);
        }
    dt_mesh_free(cpu);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* 48 MiB in and out through the pinned staging (several chunks, the last one partial). */
Test(cuda, large_transfers_round_trip)
{
    start(1, 1, 0);
    dt_mesh *gpu = mesh_of(DT_DEVICE_CUDA, 1);
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(gpu, 1, &l), DT_OK);
    int64_t n = ((int64_t)48 << 20) / 8 + 123;
    double *host = malloc((size_t)n * 8), *back = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++)
        host[i] = (double)i * 0.5 - 7;
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 1, &n, host, (size_t)n * 8, &t), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_tensor_read(t, back, (size_t)n * 8), DT_OK, "%s", dt_last_error());
    cr_expect(memcmp(host, back, (size_t)n * 8) == 0);
    dt_tensor_free(t);
    free(host);
    free(back);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* Steady-state ops take no memory from cudaMalloc; release hands the cache back. */
Test(cuda, caching_allocator_on_the_gpu)
{
    start(1, 2, 0);
    dt_mesh *gpu = mesh_of(DT_DEVICE_CUDA, 2);
    dt_layout a_l, b_l;
    cr_assert_eq(dt_layout_parse(gpu, "unsharded,x", &a_l), DT_OK);
    cr_assert_eq(dt_layout_parse(gpu, "x,unsharded", &b_l), DT_OK);
    const int64_t shape[2] = {256, 256};
    dt_op_options oa = {.layout = &a_l}, ob = {.layout = &b_l};
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 1, -1, 1, &oa, &a), DT_OK);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 2, -1, 1, &ob, &b), DT_OK);
    cr_assert_eq(dt_matmul(a, b, NULL, &c), DT_OK, "%s", dt_last_error());
    dt_tensor_free(c);
    dt_memory_stats s0, s1;
    cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CUDA, 0, &s0), DT_OK);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(dt_matmul(a, b, NULL, &c), DT_OK, "%s", dt_last_error());
        dt_tensor_free(c);
    }
    cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CUDA, 0, &s1), DT_OK);
    cr_expect_eq(s1.system_allocs, s0.system_allocs);
    cr_expect_eq(s1.in_use, 2 * 256 * 128 * sizeof(float));
    cr_assert_eq(dt_device_release_cache(DT_DEVICE_CUDA, -1), DT_OK);
    cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CUDA, 0, &s1), DT_OK);
    cr_expect_eq(s1.cached, 0);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* The program printer names the math of a GEMM: exact FP32 unless TF32 was allowed (emulated
 * devices run the CPU's gemm and say so). */
static void gemm_math(int tf32, const char *want)
{
    start(1, 1, tf32);
    if (ref_cuda_emulated())
        want = "OpenBLAS";
    dt_mesh *gpu = mesh_of(DT_DEVICE_CUDA, 1);
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(gpu, 2, &l), DT_OK);
    const int64_t shape[2] = {64, 64};
    dt_op_options o = {.layout = &l};
    dt_tensor *a = NULL, *c = NULL;
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 1, -1, 1, &o, &a), DT_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    dt_op_options show = {.program = f};
    cr_assert_eq(dt_matmul(a, a, &show, &c), DT_OK, "%s", dt_last_error());
    fclose(f);
    cr_expect(strstr(text, want), "no \"%s\" in:\n%s", want, text);
    free(text);
    dt_tensor_free(a);
    dt_tensor_free(c);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

Test(cuda, gemm_is_exact_fp32_by_default)
{
    gemm_math(0, "FP32 (cuBLAS sgemm)");
}

Test(cuda, gemm_uses_tf32_when_allowed)
{
    gemm_math(1, "TF32 tensor cores");
}

/* Between device types the meshes need the same axes and devices per client. */
Test(cuda, copy_between_cpu_and_gpu_meshes_of_other_shapes_is_refused)
{
    start(2, 1, 0);
    dt_mesh *cpu = mesh_of(DT_DEVICE_CPU, 2), *gpu = mesh_of(DT_DEVICE_CUDA, 1);
    dt_layout lc, lg;
    cr_assert_eq(dt_layout_replicated(cpu, 1, &lc), DT_OK);
    cr_assert_eq(dt_layout_replicated(gpu, 1, &lg), DT_OK);
    int64_t n = 4;
    float host[4] = {1, 2, 3, 4};
    dt_tensor *t = NULL, *u = NULL;
    cr_assert_eq(dt_tensor_from_host(&lc, DT_DTYPE_F32, 1, &n, host, sizeof host, &t), DT_OK);
    cr_expect_eq(dt_copy_to_mesh(t, &lg, NULL, &u), DT_ERR_MESH);
    cr_expect(strstr(dt_last_error(), "same axes"), "%s", dt_last_error());
    cr_expect_null(u);
    dt_tensor_free(t);
    dt_mesh_free(cpu);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* Checkpoints of GPU tensors: saved from 2 logical GPUs (through host copies of each block),
 * restored onto the GPUs in another layout and onto a CPU device, bitwise. */
Test(cuda, checkpoint_round_trip_between_gpu_and_cpu)
{
    start(1, 2, 0);
    dt_mesh *cpu = mesh_of(DT_DEVICE_CPU, 1), *gpu = mesh_of(DT_DEVICE_CUDA, 2);
    dt_layout lg, lg2, lc;
    cr_assert_eq(dt_layout_parse(gpu, "x,unsharded", &lg), DT_OK);
    cr_assert_eq(dt_layout_parse(gpu, "unsharded,x", &lg2), DT_OK);
    cr_assert_eq(dt_layout_replicated(cpu, 2, &lc), DT_OK);
    const int64_t shape[2] = {37, 11};
    double host[37 * 11];
    for (int i = 0; i < 37 * 11; i++)
        host[i] = i * 0.37 - 20;
    dt_tensor *t = NULL, *a = NULL, *b = NULL;
    dt_variable *v = NULL;
    dt_checkpoint *ck = NULL;
    char path[64];
    snprintf(path, sizeof path, "/tmp/dtensor-cuda-ckpt-%d.h5", (int)getpid());
    cr_assert_eq(dt_tensor_from_host(&lg, DT_DTYPE_F64, 2, shape, host, sizeof host, &t), DT_OK);
    cr_assert_eq(dt_variable_create(t, &v), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_checkpoint_create(&ck), DT_OK);
    cr_assert_eq(dt_checkpoint_add_variable(ck, "w", v), DT_OK);
    cr_assert_eq(dt_checkpoint_write(ck, path), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_checkpoint_read_tensor(path, "variables/w", &lg2, &a), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_checkpoint_read_tensor(path, "variables/w", &lc, &b), DT_OK, "%s",
                 dt_last_error());
    void *x = read_all(a, sizeof host), *y = read_all(b, sizeof host);
    cr_expect(memcmp(x, host, sizeof host) == 0, "GPU restore differs");
    cr_expect(memcmp(y, host, sizeof host) == 0, "CPU restore differs");
    cr_expect_eq(dt_checkpoint_read(ck, path), DT_OK, "%s", dt_last_error());
    free(x);
    free(y);
    unlink(path);
    dt_checkpoint_free(ck);
    dt_variable_free(v);
    dt_tensor_free(t);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_mesh_free(cpu);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}
