/* What the tests of a traced function's program passes share (test_fusion.c,
 * test_fusion_stored.c and their chain harness fusion_chain.h, test_fusion_more.c, test_cse.c;
 * test_sparse_xent.c and test_sparse_cce.c take the printed program and the float tensors):
 * one mesh, made by start() after dt_init
 * and freed by stop() with dt_finalize (DTENSOR_FUSION unset again), layouts parsed on it, a
 * function's printed program, a tensor read whole, and float tensors to and from doubles. The
 * devices are CPU devices unless the including file defines FUSION_DEVICE and its own fusion_init
 * first (tests/cuda/test_cuda_fusion.c does, through test_fusion.c and test_fusion_stored.c). */
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

/* A tensor of dtype dt (f64, f32, bf16 or f16) holding x[0..n) rounded once. */
static inline dt_tensor *from_doubles(const dt_layout *l, dt_dtype dt, int rank,
                                      const int64_t shape[], const double *x, int64_t n)
{
    size_t es = dt_dtype_size(dt);
    void *h = malloc((size_t)n * es + 1);
    cr_assert(h);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DT_DTYPE_F64)
            ((double *)h)[i] = x[i];
        else if (dt == DT_DTYPE_F32)
            ((float *)h)[i] = (float)x[i];
        else if (dt == DT_DTYPE_BF16)
            ((uint16_t *)h)[i] = dt_f64_to_bf16(x[i]);
        else
            ((uint16_t *)h)[i] = dt_f64_to_f16(x[i]);
    }
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(l, dt, rank, shape, h, (size_t)n * es, &t), DT_OK, "%s",
                 dt_last_error());
    free(h);
    return t;
}

/* t's first n elements (f64, f32, bf16 or f16) as doubles. */
static inline void to_doubles(const dt_tensor *t, double *out, int64_t n)
{
    size_t bytes;
    void *h = read_all(t, &bytes);
    dt_dtype dt = dt_tensor_dtype(t);
    for (int64_t i = 0; i < n; i++)
        out[i] = dt == DT_DTYPE_F64    ? ((double *)h)[i]
                 : dt == DT_DTYPE_F32  ? ((float *)h)[i]
                 : dt == DT_DTYPE_BF16 ? dt_bf16_to_f32(((uint16_t *)h)[i])
                                       : dt_f16_to_f32(((uint16_t *)h)[i]);
    free(h);
}

#endif
