/* What the tests of the program passes (test_overlap.c, test_bucket.c) share: a runtime of two
 * CPU devices with the mesh x=2 made before each test and freed after, and temporary slots of
 * N float32 elements per device on it. */
#ifndef DT_TEST_PROGRAM_FIXTURE_H
#define DT_TEST_PROGRAM_FIXTURE_H

#include <criterion/criterion.h>

#include "../../spmd/engine.h"

enum { N = 4 };

static dt_mesh *mesh;

static void start(void)
{
    dt_init_options o = {.cpu_devices = 2};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CPU, &mesh), DT_OK, "%s",
                 dt_last_error());
}

static void stop(void)
{
    dt_mesh_free(mesh);
    dt_finalize();
}

static int slot(dt__program *p)
{
    int s;
    int64_t elems[2] = {N, N};
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, elems, &s), DT_OK, "%s",
                 dt_last_error());
    return s;
}

#endif
