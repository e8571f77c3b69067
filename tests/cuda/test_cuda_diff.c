/* The differential test of every op under every layout (tests/unit/diff_core.h) on meshes of
 * logical GPUs of one client: 1, 2, 4, 2x2 and 2x2x2 devices, even and uneven shapes, every
 * dtype, against the same independent host loops as the CPU backend, with copies between the
 * GPU mesh and a CPU mesh of the same axes. Tolerances (issue "CUDA devices that compute"):
 * bitwise for fill, arange, random, relayout, copies and integer results; 1e-6 relative for
 * floating elementwise results (CUDA's exp, log, tanh... differ from glibc's in the last bit);
 * 1e-5 for reductions and matmul. Skipped, and said so, without a GPU. */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>

#define DIFF_REPORT(ok, ...) cr_expect((ok), __VA_ARGS__)
#include "../ref.h"
#include "../unit/diff_core.h"

/* A mesh of `size` CUDA devices: enough logical devices per GPU for it, the first `size`. */
static void run_on(int num_axes, const char *const names[], const int sizes[])
{
    int size = 1;
    for (int a = 0; a < num_axes; a++)
        size *= sizes[a];
    int gpus = ref_cuda_devices(0, 1);
    if (gpus == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    dt_init_options o = {.cpu_devices = size, .cuda_logical_devices = (size + gpus - 1) / gpus};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    int ids[8];
    for (int i = 0; i < size; i++)
        ids[i] = i;
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_on_devices(num_axes, names, sizes, DT_DEVICE_CUDA, size, ids, &m),
                 DT_OK, "%s", dt_last_error());
    diff_float_tol = 1e-6;
    diff_opts opts = {.thorough = true};
    diff_all(m, &opts);
    dt_mesh_free(m);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

static const char *const xyz[] = {"x", "y", "z"};

Test(cuda_diff, mesh_1, .timeout = 300)
{
    run_on(1, xyz, (int[]){1});
}

Test(cuda_diff, mesh_2, .timeout = 300)
{
    run_on(1, xyz, (int[]){2});
}

Test(cuda_diff, mesh_4, .timeout = 300)
{
    run_on(1, xyz, (int[]){4});
}

Test(cuda_diff, mesh_2x2, .timeout = 300)
{
    run_on(2, xyz, (int[]){2, 2});
}

Test(cuda_diff, mesh_2x2x2, .timeout = 300)
{
    run_on(3, xyz, (int[]){2, 2, 2});
}
