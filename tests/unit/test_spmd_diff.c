/* Differential test of every op under every layout, on meshes of local CPU devices in one
 * process: 1, 2, 4, 2x2, 3x2, 2x2x2 (diff_core.h has the suite). A mesh takes 20-30 s under the
 * sanitizers on an idle 2-core machine and up to 120 s on a loaded one: each test may run 300 s
 * (a hang still fails it). */
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

Test(spmd_diff, mesh_1, .timeout = 300)
{
    run_on("x=1", 1);
}

Test(spmd_diff, mesh_2, .timeout = 300)
{
    run_on("x=2", 2);
}

Test(spmd_diff, mesh_4, .timeout = 300)
{
    run_on("x=4", 4);
}

Test(spmd_diff, mesh_2x2, .timeout = 300)
{
    run_on("x=2,y=2", 4);
}

Test(spmd_diff, mesh_3x2, .timeout = 300)
{
    run_on("x=3,y=2", 6);
}

Test(spmd_diff, mesh_2x2x2, .timeout = 300)
{
    run_on("x=2,y=2,z=2", 8);
}
