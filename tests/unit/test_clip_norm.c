/* global_clipnorm's global norm (dt_optimizer_last_global_norm): the order of its sums. A
 * gradient of rank 2 or more whose last axis is whole on every device has each row along that
 * axis summed first, in order, then the rows' sums in order (the rows split over a device's
 * threads); one running value over every element would drop each small square once the total
 * is large. On one device the norm is bitwise the square root of that order's sum computed
 * here, for data where the single running value differs (one large element first, then rows
 * of small ones), in f32, f64 and bf16 (summed in f32). On meshes of 4 and 8 devices, sharded
 * unevenly along the rows or along the last axis (then one running value a shard), the norm
 * against a double reference. */
#include "tensor_util.h"

#include "convert.h"

#include <math.h>

enum { R = 37, C = 129, N = R * C };

/* The gradient: element 0 large, the others small; `big` and `small` per dtype so that each
 * small square is under half the large square's ulp but a row's sum of them is not. */
static void make_grad(dt_dtype dt, double g[N])
{
    double big = dt == DT_DTYPE_F64 ? 1e9 : 1000, small = dt == DT_DTYPE_F64 ? 1 : 0.02;
    for (int i = 0; i < N; i++)
        g[i] = i ? small * (1 + (i % 7) / 8.0) : big;
}

/* The norm in the rows-first order, and (*single) with one running value, in the compute
 * type (f64 for f64, else f32). */
static double norm_rows_first(dt_dtype dt, const double g[N], double *single)
{
    if (dt == DT_DTYPE_F64) {
        double total = 0, one = 0;
        for (int r = 0; r < R; r++) {
            double row = 0;
            for (int c = 0; c < C; c++) {
                row += g[r * C + c] * g[r * C + c];
                one += g[r * C + c] * g[r * C + c];
            }
            total += row;
        }
        *single = sqrt(one);
        return sqrt(total);
    }
    float total = 0, one = 0;
    for (int r = 0; r < R; r++) {
        float row = 0;
        for (int c = 0; c < C; c++) {
            float x = (float)g[r * C + c];
            if (dt == DT_DTYPE_BF16)
                x = dt__bf16_to_f32(dt__f32_to_bf16(x));
            row += x * x;
            one += x * x;
        }
        total += row;
    }
    *single = sqrtf(one);
    return sqrtf(total);
}

/* The global norm of one apply of SGD with global_clipnorm to a variable of g's values in
 * layout `text` on m. */
static double global_norm(const dt_mesh *m, const char *text, dt_dtype dt, const double g[N])
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, text, &l), DT_OK, "%s", dt_last_error());
    static const double zeros[N]; /* zero bytes: 0 in every dtype */
    unsigned char host[N * 8];
    size_t esz = dt_dtype_size(dt);
    for (int i = 0; i < N; i++) {
        if (dt == DT_DTYPE_F64)
            memcpy(host + i * esz, &g[i], esz);
        else if (dt == DT_DTYPE_F32)
            memcpy(host + i * esz, &(float){(float)g[i]}, esz);
        else
            memcpy(host + i * esz, &(uint16_t){dt__f32_to_bf16((float)g[i])}, esz);
    }
    int64_t shape[2] = {R, C};
    dt_tensor *w = NULL, *grad = NULL;
    dt_variable *var = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, dt, 2, shape, zeros, (size_t)N * esz, &w), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_variable_create(w, &var), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_from_host(&l, dt, 2, shape, host, (size_t)N * esz, &grad), DT_OK, "%s",
                 dt_last_error());
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .global_clipnorm = 1};
    dt_optimizer *o = NULL;
    cr_assert_eq(dt_optimizer_create(&oc, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_optimizer_apply(o, 1, &var, (const dt_tensor *const *)&grad), DT_OK, "%s",
                 dt_last_error());
    const dt_tensor *norm = dt_optimizer_last_global_norm(o);
    double got;
    if (dt == DT_DTYPE_F64) {
        cr_assert_eq(dt_tensor_read(norm, &got, sizeof got), DT_OK, "%s", dt_last_error());
    } else {
        float f;
        cr_assert_eq(dt_tensor_read(norm, &f, sizeof f), DT_OK, "%s", dt_last_error());
        got = f;
    }
    dt_optimizer_free(o);
    dt_variable_free(var);
    dt_tensor_free(w);
    dt_tensor_free(grad);
    return got;
}

static dt_mesh *line(int devices)
{
    dt_mesh *m = NULL;
    cr_assert_eq(
        dt_mesh_create_local(1, (const char *const[]){"x"}, (int[]){devices}, DT_DEVICE_CPU, 0, &m),
        DT_OK, "%s", dt_last_error());
    return m;
}

static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16};

Test(clip_norm, rows_first_bitwise_on_one_device)
{
    cr_assert_eq(dt_init(&(dt_init_options){.cpu_devices = 8}), DT_OK, "%s", dt_last_error());
    dt_mesh *m = line(1);
    for (int d = 0; d < 3; d++) {
        double g[N], single;
        make_grad(dtypes[d], g);
        double want = norm_rows_first(dtypes[d], g, &single);
        cr_assert_neq(want, single, "%s: the data does not tell the orders apart",
                      dt_dtype_name(dtypes[d]));
        for (int k = 0; k < 2; k++) {
            const char *text = k ? "x,unsharded" : "unsharded,unsharded";
            double got = global_norm(m, text, dtypes[d], g);
            cr_expect(memcmp(&got, &want, sizeof got) == 0,
                      "%s %s: norm %.17g, want %.17g (one running value: %.17g)",
                      dt_dtype_name(dtypes[d]), text, got, want, single);
        }
    }
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

Test(clip_norm, sharded_against_double)
{
    cr_assert_eq(dt_init(&(dt_init_options){.cpu_devices = 8}), DT_OK, "%s", dt_last_error());
    static const int sizes[] = {4, 8};
    for (int s = 0; s < 2; s++) {
        dt_mesh *m = line(sizes[s]);
        for (int d = 0; d < 3; d++) {
            double g[N], exact = 0;
            make_grad(dtypes[d], g);
            for (int i = 0; i < N; i++) {
                double x = dtypes[d] == DT_DTYPE_BF16
                               ? (double)dt__bf16_to_f32(dt__f32_to_bf16((float)g[i]))
                           : dtypes[d] == DT_DTYPE_F32 ? (double)(float)g[i]
                                                       : g[i];
                exact += x * x;
            }
            exact = sqrt(exact);
            /* rows sharded (rows first on each shard), or the last axis (one running value a
             * shard: the tolerance is that order's) */
            for (int k = 0; k < 2; k++) {
                const char *text = k ? "unsharded,x" : "x,unsharded";
                double got = global_norm(m, text, dtypes[d], g);
                double tol = dtypes[d] == DT_DTYPE_F64 ? 1e-14 : k ? 1e-5 : 1e-6;
                cr_expect(fabs(got - exact) <= tol * exact,
                          "%d devices, %s %s: norm %.17g, want %.17g", sizes[s],
                          dt_dtype_name(dtypes[d]), text, got, exact);
            }
        }
        dt_mesh_free(m);
    }
    cr_assert_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}
