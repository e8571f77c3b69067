/* dt_sparse_softmax_cross_entropy_with_logits on GPU meshes (the CUDA kernel,
 * backends/cuda/xent.cu) against the same op on a CPU mesh (the CPU kernel, itself tested against
 * a double reference in tests/unit/test_sparse_xent.c): the loss and its gradient (by the
 * library's autodiff of sum(loss w)), f32, f64 and bf16, rows of 50 and 700 classes, on one GPU
 * and on two logical GPUs with the rows or the classes split; and a tied embedding's gradient
 * (a gather's segment sum added into the dense gradient of the same table: the segment_sum
 * kernel's mode with a base); and Keras's loss of probabilities
 * (dt_sparse_categorical_crossentropy, the kernel's mode PROBS: probabilities on a grid of 1/128
 * with zeros and a one that the clip moves, whose gradient is 0 there). Tolerances (sums in another
 * order than the CPU's 8 chains, exp is CUDA's): |gpu - cpu| <= tol max(1, |cpu|) with tol 1e-5 for
 * f32, 1e-12 for f64 and 1.6e-2 for bf16. Skipped, and said so, without a GPU. */
#include "cpu_gpu_meshes.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Values in [-4, 4) on a grid of 1/16 (exact in bf16) from a seeded generator. */
static void fill(double *x, int64_t n, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (double)((int)((seed >> 16) & 127) - 64) / 16.0;
    }
}

static dt_tensor *tensor(const dt_mesh *m, const char *spec, dt_dtype dt, int rank,
                         const int64_t shape[], const double *x, int64_t n)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&l, DT_DTYPE_F64, rank, shape, x, sizeof(double) * (size_t)n, &t64),
        DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, dt, NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    return t;
}

static dt_tensor *ints(const dt_mesh *m, const char *spec, int rank, const int64_t shape[],
                       const int32_t *y, int64_t n)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_I32, rank, shape, y, 4 * (size_t)n, &t), DT_OK,
                 "%s", dt_last_error());
    return t;
}

static void read_f64(const dt_tensor *t, double *h, int64_t n)
{
    dt_tensor *t64 = NULL;
    cr_assert_eq(dt_cast(t, DT_DTYPE_F64, NULL, &t64), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(t64, h, sizeof(double) * (size_t)n), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
}

/* The loss of labels y and x: logits, or probabilities (Keras's, epsilon 1e-7). */
static dt_status loss_of(bool probs, const dt_tensor *y, const dt_tensor *x, dt_tensor **out)
{
    return probs ? dt_sparse_categorical_crossentropy(y, x, 1e-7, NULL, out)
                 : dt_sparse_softmax_cross_entropy_with_logits(y, x, NULL, out);
}

/* On mesh m, logits (or probabilities) [R, C] as spec, labels and w as its rows: out[0] the
 * loss [R], out[1] the gradient of sum(loss w) [R, C]. */
static void xent(const dt_mesh *m, const char *spec, const char *rows, dt_dtype dt, bool probs,
                 int64_t R, int64_t C, const double *x, const int32_t *y, const double *w,
                 double *loss, double *dx)
{
    int64_t shape[2] = {R, C};
    dt_tensor *tx = tensor(m, spec, dt, 2, shape, x, R * C),
              *tw = tensor(m, rows, dt, 1, shape, w, R), *ty = ints(m, rows, 1, shape, y, R),
              *tl = NULL;
    cr_assert_eq(loss_of(probs, ty, tx, &tl), DT_OK, "%s", dt_last_error());
    read_f64(tl, loss, R);
    dt_layout l, lr;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK);
    cr_assert_eq(dt_layout_parse(m, rows, &lr), DT_OK);
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[3], *a = NULL, *p = NULL, *s = NULL, *res[2] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, DT_DTYPE_I32, 1, shape, &in[0]), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, dt, 2, shape, &in[1]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, dt, 1, shape, &in[2]), DT_OK);
    cr_assert_eq(loss_of(probs, in[0], in[1], &a), DT_OK);
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, in[2], NULL, &p), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &s), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &s), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){1}, &g), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_run(g, 3, (const dt_tensor *[]){ty, tx, tw}, 2, res), DT_OK, "%s",
                 dt_last_error());
    read_f64(res[1], dx, R * C);
    dt_tensor *ts[] = {tx, tw, ty, tl, in[0], in[1], in[2], a, p, s, res[0], res[1]};
    for (int i = 0; i < 12; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(f);
    dt_function_free(g);
}

static void check(const dt_mesh *m, const char *spec, const char *rows, dt_dtype dt, bool probs,
                  int64_t R, int64_t C)
{
    int64_t n = R * C;
    double *x = malloc(sizeof(double) * (size_t)(4 * n + 4 * R));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)R);
    cr_assert(x && y);
    double *dx = x + n, *gdx = dx + n, *w = gdx + n, *loss = w + R, *gl = loss + R;
    fill(x, n, 7);
    fill(w, R, 3);
    for (int64_t r = 0; r < R; r++)
        y[r] = (int32_t)((r * 31 + 5) % C);
    if (probs) { /* [0, 1) on a grid of 1/128 (0 below the clip), one 1 above it */
        for (int64_t i = 0; i < n; i++)
            x[i] = (x[i] + 4) / 8;
        x[1] = 1;
    }
    xent(cpu, "unsharded,unsharded", "unsharded", dt, probs, R, C, x, y, w, loss, dx);
    xent(m, spec, rows, dt, probs, R, C, x, y, w, gl, gdx);
    double tol = dt == DT_DTYPE_F64 ? 1e-12 : dt == DT_DTYPE_F32 ? 1e-5 : 1.6e-2;
    double e1 = ref_worst(gl, loss, R), e2 = ref_worst(gdx, dx, n);
    cr_expect(e1 <= tol && e2 <= tol, "%s %s%s [%lld, %lld]: loss off by %g, d x by %g (%g)",
              dt_dtype_name(dt), spec, probs ? " probabilities" : "", (long long)R, (long long)C,
              e1, e2, tol);
    free(x);
    free(y);
}

Test(cuda_xent, against_the_cpu, .init = start, .fini = stop, .timeout = 300)
{
    const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16};
    for (int d = 0; d < 3; d++)
        for (int probs = 0; probs < 2; probs++) {
            check(gpu1, "unsharded,unsharded", "unsharded", dts[d], probs, 6, 50);
            check(gpu1, "unsharded,unsharded", "unsharded", dts[d], probs, 5, 700);
            check(gpu2, "unsharded,x", "unsharded", dts[d], probs, 6, 50);
            check(gpu2, "x,unsharded", "x", dts[d], probs, 6, 700);
        }
}

/* loss = sum(gather(t, ids) h) + sum(einsum("bd,vd->bv", h, t) w): the gradient of t. */
static void tied(const dt_mesh *m, const char *st, const double *t, const int32_t *ids,
                 const double *h, const double *w, double *out)
{
    enum { V = 37, D = 6, B = 12 };
    dt_layout lt, lr, lb;
    cr_assert_eq(dt_layout_parse(m, st, &lt), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "unsharded", &lr), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "unsharded,unsharded", &lb), DT_OK);
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[4], *e, *p, *s1, *z, *q, *s2, *o, *res[2] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lt, DT_DTYPE_F32, 2, (int64_t[]){V, D}, &in[0]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, DT_DTYPE_I32, 1, (int64_t[]){B}, &in[1]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lb, DT_DTYPE_F32, 2, (int64_t[]){B, D}, &in[2]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lb, DT_DTYPE_F32, 2, (int64_t[]){B, V}, &in[3]), DT_OK);
    cr_assert_eq(dt_gather(in[0], in[1], NULL, &e), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, e, in[2], NULL, &p), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &s1), DT_OK);
    cr_assert_eq(dt_einsum("bd,vd->bv", 2, (const dt_tensor *[]){in[2], in[0]}, NULL, &z), DT_OK);
    cr_assert_eq(dt_binary(DT_BINARY_MUL, z, in[3], NULL, &q), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, q, 0, NULL, 0, NULL, &s2), DT_OK);
    cr_assert_eq(dt_binary(DT_BINARY_ADD, s1, s2, NULL, &o), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){0}, &g), DT_OK, "%s", dt_last_error());
    dt_tensor *tt = tensor(m, st, DT_DTYPE_F32, 2, (int64_t[]){V, D}, t, V * D),
              *ti = ints(m, "unsharded", 1, (int64_t[]){B}, ids, B),
              *th = tensor(m, "unsharded,unsharded", DT_DTYPE_F32, 2, (int64_t[]){B, D}, h, B * D),
              *tw = tensor(m, "unsharded,unsharded", DT_DTYPE_F32, 2, (int64_t[]){B, V}, w, B * V);
    cr_assert_eq(dt_function_run(g, 4, (const dt_tensor *[]){tt, ti, th, tw}, 2, res), DT_OK, "%s",
                 dt_last_error());
    read_f64(res[1], out, V * D);
    dt_tensor *ts[] = {in[0], in[1], in[2],  in[3],  e,  p,  s1, z, q,
                       s2,    o,     res[0], res[1], tt, ti, th, tw};
    for (int i = 0; i < 17; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(f);
    dt_function_free(g);
}

Test(cuda_xent, tied_embedding_gradient, .init = start, .fini = stop, .timeout = 300)
{
    double t[37 * 6], h[12 * 6], w[12 * 37], want[37 * 6], got[37 * 6];
    int32_t ids[12] = {0, 11, 12, 23, 24, 35, 0, 40, 12, 23, 24, 35};
    fill(t, 37 * 6, 1);
    fill(h, 12 * 6, 2);
    fill(w, 12 * 37, 3);
    tied(cpu, "unsharded,unsharded", t, ids, h, w, want);
    tied(gpu1, "unsharded,unsharded", t, ids, h, w, got);
    double e = ref_worst(got, want, 37 * 6);
    cr_expect(e <= 1e-5, "one GPU: off by %g", e);
    tied(gpu2, "x,unsharded", t, ids, h, w, got);
    e = ref_worst(got, want, 37 * 6);
    cr_expect(e <= 1e-5, "two GPUs, the rows split: off by %g", e);
}
