/* NCCL on a real GPU, one client: meshes of one GPU asked to use it (algorithm nccl), where
 * every communicator has one rank (the logical devices of the GPU combine on it first), the
 * path every device collective across clients takes. Each result is checked exactly against
 * the same program on a CPU mesh of one device (integer-valued f64: exact sums). Skipped
 * without a GPU, and on GPUs emulated on the host (NCCL needs a real one: their device
 * collectives run in tests/mpi/device_order.c and device_fault.c). */
#include "../../collectives/collectives.h"
#include "../ref.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void start(int logical)
{
    if (ref_cuda_devices(0, 1) == 0 || ref_cuda_emulated())
        cr_skip_test(
            "no real GPU (a build without CUDA, no GPU here, or GPUs emulated on the host)");
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = logical};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
}

static dt_mesh *mesh_of(dt_device_type type, int n)
{
    int ids[8];
    for (int i = 0; i < n; i++)
        ids[i] = i;
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_on_devices(1, (const char *[]){"x"}, (int[]){n}, type, n, ids, &m),
                 DT_OK, "%s", dt_last_error());
    return m;
}

/* 2 (A B) with the contracting axis over the mesh: a GEMM of about a millisecond writes the
 * partial products the all-reduce reads (a producer that runs long before the collective),
 * and an add reads its result at once (a consumer right behind it). */
static void product(dt_mesh *m, int64_t n, int64_t k, double *out)
{
    dt_layout la, lb;
    cr_assert_eq(dt_layout_parse(m, "unsharded,x", &la), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &lb), DT_OK);
    double *a = malloc(sizeof(double) * (size_t)(n * k)),
           *b = malloc(sizeof(double) * (size_t)(k * n));
    cr_assert(a && b);
    for (int64_t i = 0; i < n * k; i++)
        a[i] = (double)((i * 7 + i / k) % 3 - 1);
    for (int64_t i = 0; i < k * n; i++)
        b[i] = (double)((i * 5 + i / n) % 3 - 1);
    dt_tensor *ta = NULL, *tb = NULL, *tc = NULL, *td = NULL;
    size_t bytes = sizeof(double) * (size_t)(n * k);
    cr_assert_eq(dt_tensor_from_host(&la, DT_DTYPE_F64, 2, (int64_t[]){n, k}, a, bytes, &ta),
                 DT_OK);
    cr_assert_eq(dt_tensor_from_host(&lb, DT_DTYPE_F64, 2, (int64_t[]){k, n}, b, bytes, &tb),
                 DT_OK);
    cr_assert_eq(dt_matmul(ta, tb, NULL, &tc), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_ADD, tc, tc, NULL, &td), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(td, out, sizeof(double) * (size_t)(n * n)), DT_OK, "%s",
                 dt_last_error());
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(tc);
    dt_tensor_free(td);
    free(a);
    free(b);
}

static void world_size_one(int logical)
{
    start(logical);
    const int64_t n = 2048, k = 8192;
    dt_mesh *cpu = mesh_of(DT_DEVICE_CPU, 1), *gpu = mesh_of(DT_DEVICE_CUDA, logical);
    cr_assert_eq(dt_mesh_set_collective_algorithm(gpu, DT_ALGORITHM_NCCL), DT_OK, "%s",
                 dt_last_error());
    double *want = malloc(sizeof(double) * (size_t)(n * n)),
           *got = malloc(sizeof(double) * (size_t)(n * n));
    product(cpu, n, k, want);
    dt_ledger_clear();
    product(gpu, n, k, got);
    cr_expect(memcmp(want, got, sizeof(double) * (size_t)(n * n)) == 0,
              "2 A B through NCCL on %d logical GPUs of one GPU differs from the CPU's", logical);
    if (logical > 1) { /* the all-reduce ran through NCCL */
        bool nccl = false;
        for (int64_t i = 0; i < dt_ledger_size(); i++) {
            dt_ledger_entry e;
            dt_ledger_entry_get(i, &e);
            nccl = nccl || strcmp(e.backend, "nccl") == 0;
        }
        cr_expect(nccl, "no collective went through NCCL");
    }
    free(want);
    free(got);
    dt_mesh_free(cpu);
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

Test(cuda_nccl, world_size_one_after_a_long_producer_on_one_device, .timeout = 120)
{
    world_size_one(1);
}

Test(cuda_nccl, world_size_one_after_a_long_producer_on_two_logical_gpus, .timeout = 120)
{
    world_size_one(2);
}

/* bf16 1, 2^-9, 2^-9, 2^-9 on four logical GPUs: the sum in f32 rounded once is 1 + 2^-7, any
 * pairwise rounding gives 1. */
Test(cuda_nccl, bf16_sums_round_once, .timeout = 60)
{
    start(4);
    dt_mesh *gpu = mesh_of(DT_DEVICE_CUDA, 4);
    cr_assert_eq(dt_mesh_set_collective_algorithm(gpu, DT_ALGORITHM_NCCL), DT_OK);
    dt__device *const *devs = dt__mesh_local_devices(gpu);
    void *buf[4];
    for (int i = 0; i < 4; i++) {
        uint16_t v = dt_f32_to_bf16(i == 0 ? 1.0f : 0x1p-9f);
        cr_assert_eq(dt__device_alloc(devs[i], sizeof v, &buf[i]), DT_OK);
        cr_assert_eq(devs[i]->backend->to_device(devs[i], buf[i], &v, sizeof v), DT_OK);
    }
    dt__coll c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_BF16,
                  .op = DT_REDUCE_SUM,
                  .axes = 1u,
                  .send = (const void *const *)buf,
                  .recv = buf,
                  .count = 1};
    cr_assert_eq(dt__collective(gpu, &c), DT_OK, "%s", dt_last_error());
    float want = dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 3 * 0x1p-9f));
    for (int i = 0; i < 4; i++) {
        uint16_t v;
        cr_assert_eq(devs[i]->backend->to_host(devs[i], &v, buf[i], sizeof v), DT_OK);
        cr_expect_eq(dt_bf16_to_f32(v), want, "device %d: %g", i, (double)dt_bf16_to_f32(v));
        dt__device_free(devs[i], buf[i], sizeof v);
    }
    dt_mesh_free(gpu);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}
