/* What the tests of a traced function's program passes share (test_fusion.c,
 * test_fusion_stored.c and their chain harness fusion_chain.h, test_fusion_more.c, test_cse.c;
 * test_sparse_xent.c takes the printed program only): one mesh, made by start() after dt_init
 * and freed by stop() with dt_finalize (DTENSOR_FUSION unset again), layouts parsed on it, a
 * function's printed program and a tensor read whole. The devices are CPU devices unless the
 * including file defines FUSION_DEVICE and its own fusion_init first
 * (tests/cuda/test_cuda_fusion.c does, through test_fusion.c and test_fusion_stored.c). */
#ifndef DT_TEST_FUSION_FIXTURE_H
#define DT_TEST_FUSION_FIXTURE_H

#include "dt.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FUSION_DEVICE
#define FUSION_DEVICE DT_DEVICE_CPU
static inline void fusion_init(int devices)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
}
#endif

static dt_mesh *mesh __attribute__((unused)); /* not every test uses it */

static inline void start(int devices, const char *spec)
{
    fusion_init(devices);
    cr_assert_eq(dt_mesh_create_from_string(spec, FUSION_DEVICE, &mesh), DT_OK, "%s",
                 dt_last_error());
}

static inline void stop(void)
{
    dt_mesh_free(mesh);
    mesh = NULL;
    unsetenv("DTENSOR_FUSION");
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

static inline dt_layout L(const char *text)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(mesh, text, &l), DT_OK, "%s: %s", text, dt_last_error());
    return l;
}

/* f's printed program (freed by the caller). */
static inline char *program_text(const dt_function *f)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert_eq(dt_function_print(f, out), DT_OK, "%s", dt_last_error());
    fclose(out);
    return text;
}

/* t's global value on the host (freed by the caller), its size in *bytes. */
static inline void *read_all(const dt_tensor *t, size_t *bytes)
{
    *bytes = (size_t)dt_tensor_num_elements(t) * dt_dtype_size(dt_tensor_dtype(t));
    void *h = malloc(*bytes ? *bytes : 1);
    cr_assert_eq(dt_tensor_read(t, h, *bytes), DT_OK, "%s", dt_last_error());
    return h;
}

#endif
