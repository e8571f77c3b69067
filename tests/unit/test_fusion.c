/* Elementwise fusion of traced functions (spmd/fuse.c), chains of one result: each chain run
 * three ways, eager (every op its own program, never fused), traced with fusion and traced with
 * DTENSOR_FUSION=0, must give bitwise the same global tensor, over dtypes, broadcasting, meshes
 * of 1, 4 and 8 devices and uneven shards; the traced program must show the fused chain. Chains
 * of exact f64 and integer arithmetic are also checked against values computed here, and the
 * order of a fused reduction's sums against a sequential fold. The gradient of a fused chain is
 * checked the same way (fused against unfused, bitwise). Chains writing several results, the
 * optimizers' updates and GPU meshes: test_fusion_stored.c; the harness: fusion_chain.h. */
#include <criterion/criterion.h>

#include "dt.h"
#include "fusion_chain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- chains ---------------------------------------------------------------------------------- */

/* (x - mean) * rsqrt(var + 1e-5) * gamma + beta over the last axis: a layer norm written out,
 * its elementwise prologue and epilogue around the two reductions */
static dt_status norm_written_out(dt_tensor *const in[], dt_tensor **out)
{
    int ax = -1;
    dt_tensor *mu = NULL, *d = NULL, *sq = NULL, *var = NULL, *eps = NULL, *ve = NULL, *r = NULL,
              *n = NULL, *g = NULL;
    dt_status s = dt_reduce(DT_REDUCE_MEAN, in[0], 1, &ax, 1, NULL, &mu);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_SUB, in[0], mu, NULL, &d);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, d, NULL, &sq);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_MEAN, sq, 1, &ax, 1, NULL, &var);
    if (s == DT_OK)
        s = constant(dt_tensor_dtype(in[0]), 1e-5, &eps);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, var, eps, NULL, &ve);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_RSQRT, ve, NULL, &r);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, d, r, NULL, &n);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, n, in[1], NULL, &g);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, g, in[2], NULL, out);
    dt_tensor *all[] = {mu, d, sq, var, eps, ve, r, n, g};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_free(all[i]);
    return s;
}

/* cast(cast(x, bf16) * 3 (bf16), f32) + x: a scale in 16 bits between casts */
static dt_status cast_scale(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *h = NULL, *c = NULL, *m = NULL, *b = NULL;
    dt_status s = dt_cast(in[0], DT_DTYPE_BF16, NULL, &h);
    if (s == DT_OK)
        s = constant(DT_DTYPE_BF16, 3, &c);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, h, c, NULL, &m);
    if (s == DT_OK)
        s = dt_cast(m, dt_tensor_dtype(in[0]), NULL, &b);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, b, in[0], NULL, out);
    dt_tensor_free(h);
    dt_tensor_free(c);
    dt_tensor_free(m);
    dt_tensor_free(b);
    return s;
}

/* where(x > y, x * y, x - y) + 7: a comparison, both branches and a constant */
static dt_status where_chain(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *g = NULL, *p = NULL, *d = NULL, *w = NULL, *k = NULL;
    dt_status s = dt_binary(DT_BINARY_GT, in[0], in[1], NULL, &g);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[0], in[1], NULL, &p);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_SUB, in[0], in[1], NULL, &d);
    if (s == DT_OK)
        s = dt_where(g, p, d, NULL, &w);
    if (s == DT_OK)
        s = constant(dt_tensor_dtype(in[0]), 7, &k);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, w, k, NULL, out);
    dt_tensor_free(g);
    dt_tensor_free(p);
    dt_tensor_free(d);
    dt_tensor_free(w);
    dt_tensor_free(k);
    return s;
}

/* reshape(x * x, [5, 6, 20, 1]) + 1: a reshape (a view of the same buffer) inside the chain */
static dt_status reshape_between(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *m = NULL, *r = NULL, *k = NULL;
    dt_status s = dt_binary(DT_BINARY_MUL, in[0], in[0], NULL, &m);
    if (s == DT_OK)
        s = dt_reshape(m, 4, (int64_t[]){5, 6, 20, 1}, NULL, &r);
    if (s == DT_OK)
        s = constant(dt_tensor_dtype(in[0]), 1, &k);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, r, k, NULL, out);
    dt_tensor_free(m);
    dt_tensor_free(r);
    dt_tensor_free(k);
    return s;
}

/* ---- chains ending in a reduction ------------------------------------------------------------ */

/* op over `axes` of f(x, y): f is square(x - y) (sub), x * y (mul) or x + y (add) */
static dt_status reduced(int f, dt_reduce_op op, int naxes, const int *axes, dt_tensor *const in[],
                         dt_tensor **out)
{
    dt_tensor *t = NULL, *u = NULL;
    dt_binary_op b = f == 0 ? DT_BINARY_SUB : f == 1 ? DT_BINARY_MUL : DT_BINARY_ADD;
    dt_status s = dt_binary(b, in[0], in[1], NULL, &t);
    if (s == DT_OK && f == 0)
        s = dt_unary(DT_UNARY_SQUARE, t, NULL, &u);
    if (s == DT_OK)
        s = dt_reduce(op, u ? u : t, naxes, axes, false, NULL, out);
    dt_tensor_free(t);
    dt_tensor_free(u);
    return s;
}

/* the clip's sum(square(x)) over every axis */
static dt_status sum_square_all(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status s = dt_unary(DT_UNARY_SQUARE, in[0], NULL, &t);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, t, 3, (int[]){0, 1, 2}, false, NULL, out);
    dt_tensor_free(t);
    return s;
}

/* a norm's variance: mean over the last axis of square(x - y), y a row */
static dt_status mean_last(dt_tensor *const in[], dt_tensor **out)
{
    return reduced(0, DT_REDUCE_MEAN, 1, (int[]){2}, in, out);
}

/* a bias's or gamma's gradient: sum over the leading axes of x * y */
static dt_status sum_leading(dt_tensor *const in[], dt_tensor **out)
{
    return reduced(1, DT_REDUCE_SUM, 2, (int[]){0, 1}, in, out);
}

/* max over the leading axis, min over the first and last (not a run of axes) of x + y */
static dt_status max_first(dt_tensor *const in[], dt_tensor **out)
{
    return reduced(2, DT_REDUCE_MAX, 1, (int[]){0}, in, out);
}

static dt_status min_outer(dt_tensor *const in[], dt_tensor **out)
{
    return reduced(2, DT_REDUCE_MIN, 2, (int[]){0, 2}, in, out);
}

/* The reductions in every float dtype: x3 a layout of [5, 6, 20], x1 of [20], xr another of
 * [5, 6, 20]. */
static void reduce_chains(const char *x3, const char *x1, const char *xr)
{
    for (size_t t = 0; t < sizeof floats / sizeof *floats; t++) {
        dt_dtype dt = floats[t];
        chain all = {"sum_square_all", sum_square_all, 1, {dt}, {3}, {{5, 6, 20}}, {x3}};
        free(check_chain(&all, reduce_kernels(2), NULL));
        chain ml = {"mean_last", mean_last, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {x3, x1}};
        free(check_chain(&ml, reduce_kernels(3), NULL));
        chain sl = {"sum_leading", sum_leading, 2, {dt, dt}, {3, 3}, {{5, 6, 20}, {5, 6, 20}},
                    {x3, xr}};
        free(check_chain(&sl, reduce_kernels(2), NULL));
        chain mf = {"max_first", max_first, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {x3, x1}};
        free(check_chain(&mf, reduce_kernels(2), NULL));
        chain mo = {"min_outer", min_outer, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {x3, x1}};
        free(check_chain(&mo, reduce_kernels(2), NULL));
    }
}

/* The float chains in every float dtype on the mesh started, in the layouts given: x3 for
 * [5, 6, 20] tensors, x1 for [20] vectors (broadcast along the last axis), xr for the other
 * rank-3 operand of a residual. */
static void float_chains(const char *x3, const char *x1, const char *xr)
{
    for (size_t t = 0; t < sizeof floats / sizeof *floats; t++) {
        dt_dtype dt = floats[t];
        chain bg = {"bias_gelu", bias_gelu, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {x3, x1}};
        free(check_chain(&bg, 2, NULL));
        chain rs = {"residual_scale", residual_scale,           2,       {dt, dt},
                    {3, 3},           {{5, 6, 20}, {5, 6, 20}}, {x3, xr}};
        free(check_chain(&rs, 3, NULL));
        chain nw = {"norm_written_out", norm_written_out,         3,           {dt, dt, dt},
                    {3, 1, 1},          {{5, 6, 20}, {20}, {20}}, {x3, x1, x1}};
        free(check_chain(&nw, 3, NULL));
        if (dt == DT_DTYPE_F32 || dt == DT_DTYPE_F64) {
            chain cs = {"cast_scale", cast_scale, 1, {dt}, {3}, {{5, 6, 20}}, {x3}};
            free(check_chain(&cs, 5, NULL));
        }
        chain wc = {"where_chain", where_chain, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {x3, x1}};
        free(check_chain(&wc, 6, NULL));
    }
}

/* reshape_between in every float dtype, x3 a layout of [5, 6, 20] with its last two axes whole */
static void reshape_chain(const char *x3)
{
    for (size_t t = 0; t < sizeof floats / sizeof *floats; t++) {
        chain rb = {"reshape_between", reshape_between, 1, {floats[t]}, {3}, {{5, 6, 20}}, {x3}};
        free(check_chain(&rb, 2, NULL));
    }
}

/* where_chain on integers, against values computed here */
static void integer_chain(const char *x3, const char *x1)
{
    const dt_dtype ints[] = {DT_DTYPE_I32, DT_DTYPE_I64};
    for (int t = 0; t < 2; t++) {
        chain wc = {"where_chain", where_chain,        2,       {ints[t], ints[t]},
                    {3, 1},        {{5, 6, 20}, {20}}, {x3, x1}};
        void *got = check_chain(&wc, 6, NULL);
        /* the inputs again, on the host (input() draws them the same way) */
        dt_tensor *a = input(&wc, 0), *b = input(&wc, 1);
        size_t na, nb;
        void *ha = read_all(a, &na), *hb = read_all(b, &nb);
        for (int64_t k = 0; k < 5 * 6 * 20; k++) {
            int64_t x = t ? ((int64_t *)ha)[k] : ((int32_t *)ha)[k];
            int64_t y = t ? ((int64_t *)hb)[k % 20] : ((int32_t *)hb)[k % 20];
            int64_t want = (x > y ? x * y : x - y) + 7;
            int64_t v = t ? ((int64_t *)got)[k] : ((int32_t *)got)[k];
            cr_expect_eq(v, want, "%s %s element %lld: %lld, expected %lld", wc.name,
                         dt_dtype_name(ints[t]), (long long)k, (long long)v, (long long)want);
        }
        dt_tensor_free(a);
        dt_tensor_free(b);
        free(ha);
        free(hb);
        free(got);
    }
}

/* residual_scale in f64 on inputs on a 1/64 grid: (x + y) * 0.5 is exact, checked here */
static void exact_chain(const char *x3, const char *xr)
{
    chain ex = {"residual_scale_exact",   residual_scale, 2, {DT_DTYPE_F64, DT_DTYPE_F64}, {3, 3},
                {{5, 6, 20}, {5, 6, 20}}, {x3, xr}};
    double *got = check_chain(&ex, 3, NULL);
    dt_tensor *a = input(&ex, 0), *b = input(&ex, 1);
    size_t na, nb;
    double *ha = read_all(a, &na), *hb = read_all(b, &nb);
    for (int k = 0; k < 5 * 6 * 20; k++) {
        double want = (ha[k] + hb[k]) * 0.5 + tanh(ha[k]);
        cr_expect(fabs(got[k] - want) <= 1e-15 * (1 + fabs(want)), "element %d: %.17g, want %.17g",
                  k, got[k], want);
    }
    dt_tensor_free(a);
    dt_tensor_free(b);
    free(ha);
    free(hb);
    free(got);
}

Test(fusion, one_device)
{
    start(1, "x=1");
    float_chains("unsharded,unsharded,unsharded", "unsharded", "unsharded,unsharded,unsharded");
    reduce_chains("unsharded,unsharded,unsharded", "unsharded", "unsharded,unsharded,unsharded");
    integer_chain("unsharded,unsharded,unsharded", "unsharded");
    reshape_chain("unsharded,unsharded,unsharded");
    exact_chain("unsharded,unsharded,unsharded", "unsharded,unsharded,unsharded");
    stop();
}

/* 5 rows over x=2 and 20 columns over y=2 (even), 6 over y (even); the residual operand in
 * another layout (its relayout comes between the chain's ops) */
Test(fusion, four_devices)
{
    start(4, "x=2,y=2");
    float_chains("x,unsharded,y", "y", "unsharded,y,unsharded");
    reduce_chains("x,unsharded,y", "y", "unsharded,y,unsharded");
    integer_chain("x,unsharded,y", "unsharded");
    reshape_chain("x,unsharded,unsharded");
    exact_chain("x,y,unsharded", "x,y,unsharded");
    stop();
}

/* uneven everywhere: 5 rows over 4, 6 over 4 and 20 columns over 8 devices */
Test(fusion, eight_devices_uneven)
{
    start(8, "x=2,y=4");
    float_chains("y,x,unsharded", "unsharded", "y,x,unsharded");
    float_chains("unsharded,unsharded,x", "x", "unsharded,y,x");
    reduce_chains("y,x,unsharded", "unsharded", "y,x,unsharded");
    reduce_chains("unsharded,unsharded,x", "x", "unsharded,y,x");
    integer_chain("y,unsharded,x", "x");
    reshape_chain("y,unsharded,unsharded");
    exact_chain("y,x,unsharded", "unsharded,unsharded,y");
    stop();
}

/* 5 rows over 8 devices: three hold none, and a reduction's outputs there are its identity */
Test(fusion, empty_shards)
{
    start(8, "x=8");
    float_chains("x,unsharded,unsharded", "unsharded", "x,unsharded,unsharded");
    reduce_chains("x,unsharded,unsharded", "unsharded", "x,unsharded,unsharded");
    stop();
}

/* The printed program names the fused chain: bias then GELU, the bias read broadcast. */
Test(fusion, printed_chain)
{
    start(1, "x=1");
    chain bg = {"bias_gelu",
                bias_gelu,
                2,
                {DT_DTYPE_F32, DT_DTYPE_F32},
                {3, 1},
                {{5, 6, 20}, {20}},
                {"unsharded,unsharded,unsharded", "unsharded"}};
    char *text = NULL;
    free(check_chain(&bg, 2, &text));
    cr_expect(strstr(text, "fused f32 local [5,6,20], 2 kernels: gelu(add(x0, x1[1,1,20]))") !=
                  NULL,
              "%s", text);
    free(text);
    stop();
}

/* The gradient of sum(w * gelu(x + b)) with respect to x and b: its program fuses the
 * backward chain too, and gives bitwise the gradient of the unfused program. */
static dt_function *gelu_grad(const char *lx, const char *lb, dt_dtype dt, bool fuse, char **text)
{
    if (fuse)
        unsetenv("DTENSOR_FUSION");
    else
        setenv("DTENSOR_FUSION", "0", 1);
    int64_t sx[3] = {5, 6, 20}, sb[1] = {20};
    dt_layout ax = L(lx), ab = L(lb), rep;
    dt_function *f = NULL, *g = NULL;
    dt_tensor *x = NULL, *b = NULL, *y = NULL, *w = NULL, *p = NULL, *l = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &ax, dt, 3, sx, &x), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &ab, dt, 1, sb, &b), DT_OK, "%s", dt_last_error());
    cr_assert_eq(bias_gelu((dt_tensor *[]){x, b}, &y), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_layout_replicated(mesh, 3, &rep), DT_OK);
    dt_op_options o = {.layout = &rep};
    cr_assert_eq(dt_random_uniform(dt, 3, sx, 7, 99, -1, 1, &o, &w), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, y, w, NULL, &p), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &l), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &l), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 2, (int[]){0, 1}, &g), DT_OK, "%s", dt_last_error());
    unsetenv("DTENSOR_FUSION");
    dt_tensor *all[] = {x, b, y, w, p, l};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_free(all[i]);
    dt_function_free(f);
    *text = program_text(g);
    return g;
}

static void check_gradient(const char *lx, const char *lb)
{
    for (int t = 0; t < 2; t++) {
        dt_dtype dt = t ? DT_DTYPE_F64 : DT_DTYPE_F32;
        chain c = {"gelu_grad", NULL, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {lx, lb}};
        dt_tensor *in[2] = {input(&c, 0), input(&c, 1)};
        char *tf, *tu;
        dt_function *gf = gelu_grad(lx, lb, dt, true, &tf), *gu = gelu_grad(lx, lb, dt, false, &tu);
        cr_expect(strstr(tf, "fused") != NULL, "no fused step in the gradient:\n%s", tf);
        cr_expect(strstr(tu, "fused") == NULL, "%s", tu);
        dt_tensor *rf[3] = {0}, *ru[3] = {0};
        cr_assert_eq(dt_function_run(gf, 2, (const dt_tensor *const *)in, 3, rf), DT_OK, "%s",
                     dt_last_error());
        cr_assert_eq(dt_function_run(gu, 2, (const dt_tensor *const *)in, 3, ru), DT_OK, "%s",
                     dt_last_error());
        for (int o = 0; o < 3; o++) {
            size_t bf, bu;
            void *hf = read_all(rf[o], &bf), *hu = read_all(ru[o], &bu);
            cr_assert_eq(bf, bu);
            cr_expect(memcmp(hf, hu, bf) == 0, "%s output %d: fused differs from unfused:\n%s",
                      dt_dtype_name(dt), o, tf);
            free(hf);
            free(hu);
            dt_tensor_free(rf[o]);
            dt_tensor_free(ru[o]);
        }
        dt_function_free(gf);
        dt_function_free(gu);
        free(tf);
        free(tu);
        dt_tensor_free(in[0]);
        dt_tensor_free(in[1]);
    }
}

Test(fusion, gradient)
{
    start(8, "x=2,y=4");
    check_gradient("unsharded,unsharded,unsharded", "unsharded");
    check_gradient("y,unsharded,x", "x");
    check_gradient("x,y,unsharded", "unsharded");
    stop();
}

/* ---- chains with several results ------------------------------------------------------- */
/* The order of the sums, against a sequential fold computed here: x * y (y ones) summed over
 * the leading axes, over the last and over all, in f32, with values 1e8, 1, -1e8, 1 in turn, so
 * that any other order (pairwise, reversed, a partial sum a thread) gives another result. One
 * device with every core: the reductions split over its threads. A real GPU folds rows shared
 * by threads in trees of its own order (backends/cuda/common.cuh): there the fused and unfused
 * sums must be bitwise the eager REDUCE kernel's instead. */
static dt_status sum_axes(dt_tensor *const in[], int naxes, const int *axes, dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_MUL, in[0], in[1], NULL, &t);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, t, naxes, axes, true, NULL, out);
    dt_tensor_free(t);
    return s;
}
static dt_status sum_lead(dt_tensor *const in[], dt_tensor **out)
{
    return sum_axes(in, 2, (int[]){0, 1}, out);
}
static dt_status sum_last(dt_tensor *const in[], dt_tensor **out)
{
    return sum_axes(in, 1, (int[]){2}, out);
}
static dt_status sum_every(dt_tensor *const in[], dt_tensor **out)
{
    return sum_axes(in, 3, (int[]){0, 1, 2}, out);
}

Test(fusion, reduction_order)
{
    start(1, "x=1");
    enum { A = 16, B = 32, N = 70 };
    static const float turn[4] = {1e8f, 1, -1e8f, 1};
    float *x = malloc(sizeof(float) * A * B * N), ones[N], lead[N] = {0}, last[A * B] = {0},
          all = 0;
    for (int i = 0; i < A * B; i++)
        for (int j = 0; j < N; j++)
            x[i * N + j] = turn[(i + j * 3) % 4];
    for (int j = 0; j < N; j++)
        ones[j] = 1;
    for (int i = 0; i < A * B; i++)
        for (int j = 0; j < N; j++) {
            lead[j] += x[i * N + j];
            last[i] += x[i * N + j];
            all += x[i * N + j];
        }
    dt_layout l3 = L("unsharded,unsharded,unsharded"), l1 = L("unsharded");
    dt_tensor *in[2] = {0};
    cr_assert_eq(dt_tensor_from_host(&l3, DT_DTYPE_F32, 3, (int64_t[]){A, B, N}, x,
                                     sizeof(float) * A * B * N, &in[0]),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(
        dt_tensor_from_host(&l1, DT_DTYPE_F32, 1, (int64_t[]){N}, ones, sizeof ones, &in[1]), DT_OK,
        "%s", dt_last_error());
    const chain_fn fns[3] = {sum_lead, sum_last, sum_every};
    const float *seq[3] = {lead, last, &all};
    const int count[3] = {N, A * B, 1};
    bool gpu = strcmp(dt__backend_of(FUSION_DEVICE)->name, "cuda") == 0;
    for (int v = 0; v < 3; v++) {
        dt_tensor *e = NULL;
        cr_assert_eq(fns[v](in, &e), DT_OK, "%s", dt_last_error());
        size_t be;
        float *he = read_all(e, &be);
        cr_assert_eq(be, sizeof(float) * (size_t)count[v]);
        const float *want = gpu ? he : seq[v];
        if (!gpu)
            cr_expect(memcmp(he, seq[v], be) == 0, "reduction %d: eager %g, sequential %g", v,
                      (double)he[0], (double)seq[v][0]);
        chain c = {"sum_order",
                   fns[v],
                   2,
                   {DT_DTYPE_F32, DT_DTYPE_F32},
                   {3, 1},
                   {{A, B, N}, {N}},
                   {"unsharded,unsharded,unsharded", "unsharded"}};
        for (int k = 0; k < 2; k++) {
            char *text;
            dt_function *f = trace(&c, k == 0, &text);
            size_t bt;
            float *ht = run_traced(f, &c, in, &bt);
            cr_expect(memcmp(ht, want, be) == 0, "reduction %d, %s: %g, %s %g:\n%s", v,
                      k ? "unfused" : "fused", (double)ht[0], gpu ? "eager" : "sequential",
                      (double)want[0], text);
            free(ht);
            free(text);
            dt_function_free(f);
        }
        free(he);
        dt_tensor_free(e);
    }
    dt_tensor_free(in[0]);
    dt_tensor_free(in[1]);
    free(x);
    stop();
}
