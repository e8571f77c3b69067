/* dt_attention on GPU meshes (the CUDA kernel, backends/cuda/attention.cu) against the same op on
 * a CPU mesh (the CPU kernel of the same table entry, itself tested against a double reference
 * in tests/unit/test_attention.c): forward and gradient (by the library's autodiff of
 * sum(attention(q, k, v) w)), causal or not, default and given scale, feature axes E of 1, 16,
 * 64 and 128, sequences T of 1, 33, 64 and 100 (within one tile, across tiles, not a multiple of
 * the 32-row tiles), f32, f64 and bf16, on one GPU and on two logical GPUs with the batch or the
 * heads split. Tolerances (the sums run in another order than the CPU's BLAS, exp is CUDA's):
 * |gpu - cpu| <= tol max(1, |cpu|) with tol 1e-4 for f32, 1e-11 for f64 and 1.6e-2 (4 ulp) for
 * bf16. A feature axis wider than the kernel's 128 is refused with DT_ERR_UNSUPPORTED naming it,
 * and the forward pass holds nothing beyond its result on the GPU (memory grows with T, not
 * T^2). Skipped, and said so, without a GPU. */
#include "cpu_gpu_meshes.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 3 };

/* Values in [-1, 1) on a grid of 1/64 (exact in bf16) from a seeded generator. */
static void fill(double *x, int64_t n, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (double)((int)((seed >> 16) & 127) - 64) / 64.0;
    }
}

static dt_tensor *tensor(const dt_mesh *m, const char *spec, dt_dtype dt, const int64_t shape[],
                         const double *x, int64_t n)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&l, DT_DTYPE_F64, 4, shape, x, sizeof(double) * (size_t)n, &t64), DT_OK,
        "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, dt, NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    return t;
}

/* t's values as doubles into h (n of them). */
static void read_f64(const dt_tensor *t, double *h, int64_t n)
{
    dt_tensor *t64 = NULL;
    cr_assert_eq(dt_cast(t, DT_DTYPE_F64, NULL, &t64), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(t64, h, sizeof(double) * (size_t)n), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
}

/* On mesh m, q, k, v and w in layout spec: out[0] = attention(q, k, v), out[1..3] = the
 * gradients of sum(attention(q, k, v) w) with respect to q, k and v. */
static void attend(const dt_mesh *m, const char *spec, dt_dtype dt, const int64_t shape[],
                   double *const x[4], bool causal, double scale, double *out[4])
{
    int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
    dt_tensor *t[4];
    for (int i = 0; i < 4; i++)
        t[i] = tensor(m, spec, dt, shape, x[i], n);
    dt_tensor *y = NULL;
    cr_assert_eq(dt_attention(t[0], t[1], t[2], causal, scale, NULL, &y), DT_OK, "%s",
                 dt_last_error());
    read_f64(y, out[0], n);
    dt_tensor_free(y);
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[4], *a = NULL, *p = NULL, *s = NULL, *res[4] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(dt_function_input(f, &l, dt, 4, shape, &in[i]), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_attention(in[0], in[1], in[2], causal, scale, NULL, &a), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, in[3], NULL, &p), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &s), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &s), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 3, (int[]){0, 1, 2}, &g), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_run(g, 4, (const dt_tensor *const *)t, 4, res), DT_OK, "%s",
                 dt_last_error());
    for (int i = 1; i < 4; i++)
        read_f64(res[i], out[i], n);
    for (int i = 0; i < 4; i++) {
        dt_tensor_free(in[i]);
        dt_tensor_free(res[i]);
        dt_tensor_free(t[i]);
    }
    dt_tensor_free(a);
    dt_tensor_free(p);
    dt_tensor_free(s);
    dt_function_free(f);
    dt_function_free(g);
}

/* One case: the GPU mesh m in layout spec against the CPU mesh, unsharded. */
static void check(const dt_mesh *m, const char *spec, dt_dtype dt, int64_t T, int64_t E,
                  bool causal, double scale)
{
    int64_t shape[4] = {B, H, T, E}, n = B * H * T * E;
    double *buf = malloc(sizeof(double) * (size_t)n * 12);
    cr_assert(buf);
    double *x[4], *want[4], *got[4];
    for (int i = 0; i < 4; i++) {
        x[i] = buf + i * n;
        want[i] = buf + (4 + i) * n;
        got[i] = buf + (8 + i) * n;
        fill(x[i], n, 17u * (unsigned)(i + 1) + (unsigned)(T * 131 + E));
    }
    attend(cpu, "unsharded,unsharded,unsharded,unsharded", dt, shape, x, causal, scale, want);
    attend(m, spec, dt, shape, x, causal, scale, got);
    double tol = dt == DT_DTYPE_F64 ? 1e-11 : dt == DT_DTYPE_F32 ? 1e-4 : 1.6e-2;
    for (int i = 0; i < 4; i++) {
        double worst = 0;
        for (int64_t j = 0; j < n; j++) {
            double d = fabs(got[i][j] - want[i][j]) / fmax(1.0, fabs(want[i][j]));
            worst = isnan(d) ? INFINITY : fmax(worst, d);
        }
        static const char *const what[4] = {"y", "dq", "dk", "dv"};
        cr_expect(worst <= tol,
                  "%s %s T %lld E %lld causal %d scale %g: %s off the CPU's by %g (tolerance %g)",
                  dt_dtype_name(dt), spec, (long long)T, (long long)E, causal, scale, what[i],
                  worst, tol);
    }
    free(buf);
}

static const char *const whole = "unsharded,unsharded,unsharded,unsharded";

Test(cuda_attention, one_gpu_f32, .timeout = 300)
{
    start();
    const int64_t ts[] = {1, 33, 64, 100}, es[] = {16, 64, 128};
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < 3; e++)
            for (int causal = 0; causal < 2; causal++)
                check(gpu1, whole, DT_DTYPE_F32, ts[t], es[e], causal, 0);
    /* one feature: the gradient's statistics in the kernel scratch */
    check(gpu1, whole, DT_DTYPE_F32, 33, 1, true, 0);
    check(gpu1, whole, DT_DTYPE_F32, 100, 40, false, 0);
    stop();
}

Test(cuda_attention, one_gpu_f64, .timeout = 300)
{
    start();
    const int64_t ts[] = {1, 33, 100}, es[] = {16, 64, 128};
    for (int t = 0; t < 3; t++)
        for (int e = 0; e < 3; e++)
            for (int causal = 0; causal < 2; causal++)
                check(gpu1, whole, DT_DTYPE_F64, ts[t], es[e], causal, 0.3);
    stop();
}

/* bf16 is cast to f32 for the kernel by the op (as on the CPU): one rounding of each result */
Test(cuda_attention, one_gpu_bf16, .timeout = 300)
{
    start();
    for (int causal = 0; causal < 2; causal++)
        check(gpu1, whole, DT_DTYPE_BF16, 100, 64, causal, 0);
    stop();
}

/* batch or heads split over two logical GPUs: each computes its slices, no collective */
Test(cuda_attention, two_gpus_sharded, .timeout = 300)
{
    start();
    const char *specs[] = {"x,unsharded,unsharded,unsharded", "unsharded,x,unsharded,unsharded"};
    for (int i = 0; i < 2; i++)
        for (int causal = 0; causal < 2; causal++)
            check(gpu2, specs[i], DT_DTYPE_F32, 70, 64, causal, 0);
    check(gpu2, specs[1], DT_DTYPE_BF16, 33, 64, true, 0);
    stop();
}

/* E = 160: refused by the GPU kernel, naming the extent (the emulated GPU runs the CPU's kernel,
 * which takes any E). */
Test(cuda_attention, wide_feature_axis_refused)
{
    start();
    if (ref_cuda_emulated()) {
        stop();
        cr_skip_test("an emulated GPU runs the CPU's kernel, which takes any feature axis");
    }
    int64_t shape[4] = {1, 1, 8, 160}, n = 8 * 160;
    double *x = malloc(sizeof(double) * (size_t)n);
    cr_assert(x);
    fill(x, n, 3);
    dt_tensor *q = tensor(gpu1, whole, DT_DTYPE_F32, shape, x, n), *y = NULL;
    dt_status s = dt_attention(q, q, q, 1, 0, NULL, &y);
    cr_expect_eq(s, DT_ERR_UNSUPPORTED, "status %d: %s", (int)s, dt_last_error());
    cr_expect(strstr(dt_last_error(), "160") != NULL, "%s", dt_last_error());
    cr_expect(y == NULL);
    dt_tensor_free(y);
    dt_tensor_free(q);
    free(x);
    stop();
}

/* T = 4096, E = 64: the scores of the slice would take 64 MiB in f32; the forward pass adds its
 * result (1 MiB) and nothing else to the GPU's memory. */
Test(cuda_attention, memory_grows_with_t)
{
    start();
    int64_t T = 4096, shape[4] = {1, 1, T, 64}, n = T * 64;
    double *x = malloc(sizeof(double) * (size_t)n);
    cr_assert(x);
    fill(x, n, 5);
    dt_tensor *q = tensor(gpu1, whole, DT_DTYPE_F32, shape, x, n), *y = NULL;
    size_t before = 0, peak = 0;
    cr_assert_eq(dt_device_memory(DT_DEVICE_CUDA, 0, &before, NULL), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_device_memory_reset_peak(DT_DEVICE_CUDA, 0), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_attention(q, q, q, 1, 0, NULL, &y), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_device_memory(DT_DEVICE_CUDA, 0, NULL, &peak), DT_OK, "%s", dt_last_error());
    size_t out = (size_t)n * sizeof(float);
    cr_expect(peak - before <= out, "attention held %zu bytes above its operands, its result %zu",
              peak - before, out);
    dt_tensor_free(q);
    dt_tensor_free(y);
    free(x);
    stop();
}
