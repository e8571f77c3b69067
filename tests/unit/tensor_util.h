/* What the tensor tests (test_tensor*.c) share: a mesh of CPU devices with dt_init before and
 * dt_finalize after, messages, and the devices' memory in use. */
#ifndef DT_TEST_TENSOR_UTIL_H
#define DT_TEST_TENSOR_UTIL_H

#include "dt.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static const char *const axis_names[] = {"x", "y", "z"};

static inline dt_mesh *setup(int num_axes, const int sizes[])
{
    int devices = 1;
    char spec[64] = "";
    for (int a = 0; a < num_axes; a++) {
        devices *= sizes[a];
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s=%d", a ? "," : "",
                 axis_names[a], sizes[a]);
    }
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "dt_init: %s", dt_last_error());
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "mesh %s: %s", spec,
                 dt_last_error());
    return m;
}

static inline void teardown(dt_mesh *m)
{
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK, "dt_finalize: %s", dt_last_error());
}

#define EXPECT_MSG(needle)                                                                       \
    cr_expect(strstr(dt_last_error(), (needle)), "message \"%s\" lacks \"%s\"", dt_last_error(), \
              (needle))

static inline size_t device_bytes(int i)
{
    size_t cur = 0;
    cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &cur, NULL), DT_OK, "%s", dt_last_error());
    return cur;
}

static inline void expect_no_memory(const dt_mesh *m, const char *what)
{
    for (int i = 0; i < dt_mesh_num_local_devices(m); i++)
        cr_expect_eq(device_bytes(i), 0, "%s: device %d still holds %zu bytes", what, i,
                     device_bytes(i));
}

#endif
