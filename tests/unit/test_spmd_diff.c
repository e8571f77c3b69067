/* Differential test of every op under every layout, on meshes of local CPU devices in one
 * process: 1, 2, 4, 2x2, 3x2, 2x2x2 (diff_core.h has the suite). */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>

#define DIFF_REPORT(ok, ...) cr_expect((ok), __VA_ARGS__)
#include "diff_core.h"

static void run_on(const char *mesh_text, int devices)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(mesh_text, DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    diff_opts opts = {.thorough = true};
    diff_all(m, &opts);
    dt_mesh_free(m);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

Test(spmd_diff, mesh_1, .timeout = 120)
{
    run_on("x=1", 1);
}

Test(spmd_diff, mesh_2, .timeout = 120)
{
    run_on("x=2", 2);
}

Test(spmd_diff, mesh_4, .timeout = 120)
{
    run_on("x=4", 4);
}

Test(spmd_diff, mesh_2x2, .timeout = 120)
{
    run_on("x=2,y=2", 4);
}

Test(spmd_diff, mesh_3x2, .timeout = 120)
{
    run_on("x=3,y=2", 6);
}

Test(spmd_diff, mesh_2x2x2, .timeout = 120)
{
    run_on("x=2,y=2,z=2", 8);
}
