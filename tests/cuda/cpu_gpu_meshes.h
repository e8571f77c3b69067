/* What the GPU-against-CPU kernel tests (test_cuda_attention.c, test_cuda_xent.c) share: a
 * runtime of one CPU device and two logical GPUs over the GPUs there are (the test skipped, and
 * said so, without one), with the meshes x=1 on the CPU and x=1, x=2 on the GPUs made before
 * each test and freed after. */
#ifndef DT_TEST_CPU_GPU_MESHES_H
#define DT_TEST_CPU_GPU_MESHES_H

#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>

static dt_mesh *cpu, *gpu1, *gpu2;

static dt_mesh *mesh_of(dt_device_type type, int n)
{
    const char *names[1] = {"x"};
    int ids[2] = {0, 1};
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_on_devices(1, names, (int[]){n}, type, n, ids, &m), DT_OK, "%s",
                 dt_last_error());
    return m;
}

static void start(void)
{
    int gpus = ref_cuda_devices(0, 1);
    if (gpus == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = (2 + gpus - 1) / gpus};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    cpu = mesh_of(DT_DEVICE_CPU, 1);
    gpu1 = mesh_of(DT_DEVICE_CUDA, 1);
    gpu2 = mesh_of(DT_DEVICE_CUDA, 2);
}

static void stop(void)
{
    dt_mesh_free(cpu);
    dt_mesh_free(gpu1);
    dt_mesh_free(gpu2);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

#endif
