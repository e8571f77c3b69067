/* dt_sparse_categorical_crossentropy (Keras's loss of probabilities; spmd/ops/sparse_xent.c in
 * its mode of probabilities) against a host reference in double written from Keras's formula
 * as TensorFlow's backend computes it: the cross-entropy of the logits log c, c = clip(p, eps,
 * 1 - eps), i.e. log(sum c) - log c[label], and its gradient by the chain rule through the clip
 * (d p_j = (c_j / sum c - [j == label]) / c_j where eps <= p_j <= 1 - eps, else 0); the bounds
 * as the compute type holds them. f32, f64, bf16; probabilities below eps, at 0 and 1, labels
 * on clipped classes; meshes of 1, 2, 4 and 8 devices with the rows, the classes or both
 * sharded (50 classes: uneven on 4 and 8), the loss eager and the gradient of sum(loss w)
 * traced; labels outside the classes; a bad epsilon. */
#include "../ref.h"
#include "fusion_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double eps = 1e-7; /* Keras's backend epsilon */

/* v as dtype dt stores it. */
static double stored(dt_dtype dt, double v)
{
    return dt == DT_DTYPE_F64   ? v
           : dt == DT_DTYPE_F32 ? (double)(float)v
                                : (double)dt_bf16_to_f32(dt_f64_to_bf16(v));
}

/* Row r's probabilities: a fixed positive sequence normalised, except row 0 (one class at 1,
 * the rest 0: both bounds clip), every third row's class (r + 1) % C at 1e-9 (below eps: its
 * label there when r % 6 == 0) and class 0 at 0. */
static void probabilities(dt_dtype dt, int64_t rows, int64_t C, double *p, int32_t *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double *row = p + r * C, s = 0;
        for (int64_t j = 0; j < C; j++)
            s += row[j] = (double)((r * 31 + j * 17) % 23 + 1);
        for (int64_t j = 0; j < C; j++)
            row[j] /= s;
        y[r] = (int32_t)((r * 7 + 3) % C);
        if (r == 0) {
            for (int64_t j = 0; j < C; j++)
                row[j] = j == 2 ? 1 : 0;
        } else if (r % 3 == 0) {
            row[(r + 1) % C] = 1e-9;
            row[0] = 0;
            if (r % 6 == 0)
                y[r] = (int32_t)((r + 1) % C);
        }
        for (int64_t j = 0; j < C; j++)
            row[j] = stored(dt, row[j]);
    }
}

/* One case on the mesh: probabilities [rows, C] laid out as `spec`, the loss eager and the
 * gradient of sum(loss w) in a traced function, against the reference. */
static void check(const char *spec, dt_dtype dt, int64_t rows, int64_t C)
{
    int64_t n = rows * C, shape[2] = {rows, C};
    double *p = malloc(sizeof(double) * (size_t)(3 * n + 3 * rows));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)rows);
    cr_assert(p && y);
    double *dx = p + n, *got = dx + n, *w = got + n, *loss = w + rows, *gl = loss + rows;
    probabilities(dt, rows, C, p, y);
    /* the clip's bounds in the compute type (f32 for bf16) */
    double lo = dt == DT_DTYPE_F64 ? eps : (float)eps,
           hi = dt == DT_DTYPE_F64 ? 1 - eps : (float)(1 - eps);
    for (int64_t r = 0; r < rows; r++) {
        const double *row = p + r * C;
        double s = 0;
        w[r] = stored(dt, 0.5 + (double)(r % 3) / 4);
        for (int64_t j = 0; j < C; j++)
            s += fmin(fmax(row[j], lo), hi);
        double ct = fmin(fmax(row[y[r]], lo), hi);
        loss[r] = log(s) - log(ct);
        for (int64_t j = 0; j < C; j++) {
            double c = fmin(fmax(row[j], lo), hi);
            bool in = row[j] >= lo && row[j] <= hi;
            dx[r * C + j] = in ? (c / s - (j == y[r])) / c * w[r] : 0;
        }
    }
    dt_layout l = L(spec), lr = l;
    lr.rank = 1;
    dt_tensor *tp = from_doubles(&l, dt, 2, shape, p, n),
              *tw = from_doubles(&lr, dt, 1, shape, w, rows);
    dt_tensor *ty = NULL, *tl = NULL;
    cr_assert_eq(dt_tensor_from_host(&lr, DT_DTYPE_I32, 1, shape, y, (size_t)rows * 4, &ty), DT_OK,
                 "%s", dt_last_error());
    double tol = dt == DT_DTYPE_F64 ? 1e-12 : dt == DT_DTYPE_F32 ? 1e-5 : 2e-2;
    cr_assert_eq(dt_sparse_categorical_crossentropy(ty, tp, eps, NULL, &tl), DT_OK, "%s",
                 dt_last_error());
    cr_expect(dt_layout_equal(dt_tensor_layout(tl), &lr), "%s: the loss not in the rows' layout",
              spec);
    to_doubles(tl, gl, rows);
    double fw = ref_worst(gl, loss, rows);
    cr_expect(fw <= tol, "%s %s [%lld, %lld]: loss off by %g (tolerance %g)", dt_dtype_name(dt),
              spec, (long long)rows, (long long)C, fw, tol);
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[3], *a = NULL, *pr = NULL, *o = NULL, *res[2] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, DT_DTYPE_I32, 1, shape, &in[0]), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, dt, 2, shape, &in[1]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, dt, 1, shape, &in[2]), DT_OK);
    cr_assert_eq(dt_sparse_categorical_crossentropy(in[0], in[1], eps, NULL, &a), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, in[2], NULL, &pr), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, pr, 0, NULL, 0, NULL, &o), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){1}, &g), DT_OK, "%s", dt_last_error());
    const dt_tensor *args[3] = {ty, tp, tw};
    cr_assert_eq(dt_function_run(g, 3, args, 2, res), DT_OK, "%s", dt_last_error());
    cr_expect(dt_layout_equal(dt_tensor_layout(res[1]), &l), "%s: d p not in p's layout", spec);
    to_doubles(res[1], got, n);
    double gw = ref_worst(got, dx, n);
    cr_expect(gw <= tol, "%s %s [%lld, %lld]: d p off by %g (tolerance %g)", dt_dtype_name(dt),
              spec, (long long)rows, (long long)C, gw, tol);
    for (int64_t i = 0; i < n; i++) /* the clip's zeros exactly */
        if (dx[i] == 0)
            cr_expect(got[i] == 0, "%s %s: d p[%lld] = %g where the clip is active",
                      dt_dtype_name(dt), spec, (long long)i, got[i]);
    dt_tensor *ts[] = {in[0], in[1], in[2], a, pr, o, res[0], res[1], tp, tw, ty, tl};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(f);
    dt_function_free(g);
    free(p);
    free(y);
}

Test(sparse_cce, one_device)
{
    start(1, "x=1");
    const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16};
    for (int i = 0; i < 3; i++)
        check("unsharded,unsharded", dts[i], 7, 50);
    check("unsharded,unsharded", DT_DTYPE_F32, 4, 1000); /* rows past the kernel's blocks */
    stop();
}

/* Classes sharded (50: even on 2, uneven on 4 and 8), rows sharded, both on a 2-D mesh. */
Test(sparse_cce, meshes_of_2_4_8_devices)
{
    const int sizes[] = {2, 4, 8};
    for (int s = 0; s < 3; s++) {
        char spec[16];
        snprintf(spec, sizeof spec, "x=%d", sizes[s]);
        start(sizes[s], spec);
        check("unsharded,x", DT_DTYPE_F32, 8, 50);
        check("unsharded,x", DT_DTYPE_F64, 7, 50);
        check("x,unsharded", DT_DTYPE_F64, 6, 50);
        stop();
    }
    start(8, "b=2,v=4");
    check("b,v", DT_DTYPE_F32, 8, 50);
    check("v,b", DT_DTYPE_F64, 8, 50);
    stop();
}

/* A label outside [0, C): its row's loss is NaN, the others as usual. */
Test(sparse_cce, labels_outside_the_classes)
{
    start(2, "x=2");
    dt_layout l = L("unsharded,x"), lr = L("unsharded");
    double p[12] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    dt_tensor *tp = from_doubles(&l, DT_DTYPE_F32, 2, (int64_t[]){3, 4}, p, 12), *ty = NULL,
              *t = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&lr, DT_DTYPE_I32, 1, (int64_t[]){3}, (int32_t[]){1, 4, -1}, 12, &ty),
        DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_sparse_categorical_crossentropy(ty, tp, eps, NULL, &t), DT_OK, "%s",
                 dt_last_error());
    double got[3];
    to_doubles(t, got, 3);
    cr_expect(fabs(got[0] - log(4.0)) < 1e-6, "row 0: %g", got[0]);
    cr_expect(isnan(got[1]) && isnan(got[2]), "rows 1, 2: %g %g", got[1], got[2]);
    dt_tensor_free(t);
    dt_tensor_free(tp);
    dt_tensor_free(ty);
    stop();
}

static void expect_fail(const dt_tensor *labels, const dt_tensor *p, double epsilon, dt_status want,
                        const char *words)
{
    dt_tensor *t = (dt_tensor *)1;
    dt_status s = dt_sparse_categorical_crossentropy(labels, p, epsilon, NULL, &t);
    cr_expect_eq(s, want, "status %d, expected %d: %s", s, want, dt_last_error());
    cr_expect_null(t, "the out-parameter set on failure");
    cr_expect(strstr(dt_last_error(), words), "\"%s\" lacks \"%s\"", dt_last_error(), words);
}

Test(sparse_cce, bad_operands)
{
    start(1, "x=1");
    dt_layout r1 = L("unsharded"), r2 = L("unsharded,unsharded");
    double z[15] = {0};
    dt_tensor *p = from_doubles(&r2, DT_DTYPE_F32, 2, (int64_t[]){3, 5}, z, 15), *y3 = NULL,
              *y4 = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&r1, DT_DTYPE_I32, 1, (int64_t[]){3}, (int32_t[3]){0}, 12, &y3), DT_OK);
    cr_assert_eq(
        dt_tensor_from_host(&r1, DT_DTYPE_I32, 1, (int64_t[]){4}, (int32_t[4]){0}, 16, &y4), DT_OK);
    expect_fail(y3, p, 0.5, DT_ERR_ARG,
                "sparse_categorical_crossentropy: epsilon 0.5 is outside (0, 0.5)");
    expect_fail(y3, p, 0, DT_ERR_ARG, "epsilon 0 is outside (0, 0.5)");
    expect_fail(y3, p, NAN, DT_ERR_ARG, "epsilon nan is outside (0, 0.5)");
    expect_fail(y4, p, eps, DT_ERR_SHAPE, "labels [4] do not match probabilities [3,5]");
    dt_tensor_free(p);
    dt_tensor_free(y3);
    dt_tensor_free(y4);
    stop();
}
