/* Elementwise fusion on GPU meshes: the fusion tests (tests/unit/test_fusion.c and
 * test_fusion_stored.c) with their meshes of 1, 4 and 8 logical GPUs. Each chain runs eagerly (the
 * CUDA backend's kernels one by one), traced and fused (its FUSED kernel,
 * backends/cuda/elementwise.cu) and traced unfused, and the three must agree bitwise; the
 * gradient's fused chains likewise. Skipped, and said so, without a GPU. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>

#define FUSION_DEVICE DT_DEVICE_CUDA

/* `devices` logical GPUs over the GPUs there are (and one CPU device): the tests' meshes take
 * every CUDA device. */
static void fusion_init(int devices)
{
    int gpus = ref_cuda_devices(0, 1);
    if (gpus == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    if (devices % gpus)
        cr_skip_test("%d GPUs do not make %d logical GPUs evenly", gpus, devices);
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = devices / gpus};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
}

#include "../unit/test_fusion.c"
#include "../unit/test_fusion_stored.c"
