/* Elementwise fusion of traced functions (spmd/fuse.c): each chain run three ways, eager (every
 * op its own program, never fused), traced with fusion and traced with DTENSOR_FUSION=0, must
 * give bitwise the same global tensor, over dtypes, broadcasting, meshes of 1, 4 and 8 devices
 * and uneven shards; the traced program must show the fused chain. Chains of exact f64 and
 * integer arithmetic are also checked against values computed here. The gradient of a fused
 * chain is checked the same way (fused against unfused, bitwise). */
#include <criterion/criterion.h>

#include "../../train/train.h"
#include "dt.h"
#include "fusion_fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXIN 4

/* A chain: builds its result from in[] inside or outside a function. */
typedef dt_status (*chain_fn)(dt_tensor *const in[], dt_tensor **out);

typedef struct chain {
    const char *name;
    chain_fn build;
    int nin;
    dt_dtype dtype[MAXIN];
    int rank[MAXIN];
    int64_t shape[MAXIN][DT_MAX_RANK];
    const char *layout[MAXIN];
} chain;

/* A scalar constant of the given dtype, replicated on `mesh` (a fill inside a function). */
static dt_status constant(dt_dtype dtype, double v, dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(mesh, 0, &l));
    dt_op_options o = {.layout = &l};
    return dt_fill(dtype, 0, NULL, v, &o, out);
}

/* Input i: values in [-2, 2) on a grid of 1/64 (exact in every float dtype), integers in
 * [-20, 20), in the chain's dtype and layout. */
static dt_tensor *input(const chain *c, int i)
{
    int64_t n = dt__num_elements(c->rank[i], c->shape[i]);
    double *h = malloc((size_t)n * sizeof *h);
    unsigned seed = 777u + 31u * (unsigned)i;
    bool integer = c->dtype[i] == DT_DTYPE_I32 || c->dtype[i] == DT_DTYPE_I64;
    for (int64_t k = 0; k < n; k++) {
        seed = seed * 1103515245u + 12345u;
        int u = (int)((seed >> 16) & 255);
        h[k] = integer ? (double)(u % 40 - 20) : (u - 128) / 64.0;
    }
    dt_layout l = L(c->layout[i]);
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, c->rank[i], c->shape[i], h,
                                     (size_t)n * sizeof *h, &t64),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, c->dtype[i], NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    free(h);
    return t;
}

/* The chain traced (fused unless DTENSOR_FUSION=0), its program text in *text. */
static dt_function *trace(const chain *c, bool fuse, char **text)
{
    if (fuse)
        unsetenv("DTENSOR_FUSION");
    else
        setenv("DTENSOR_FUSION", "0", 1);
    dt_function *f = NULL;
    dt_tensor *in[MAXIN] = {0}, *y = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    for (int i = 0; i < c->nin; i++) {
        dt_layout l = L(c->layout[i]);
        cr_assert_eq(dt_function_input(f, &l, c->dtype[i], c->rank[i], c->shape[i], &in[i]), DT_OK,
                     "%s", dt_last_error());
    }
    cr_assert_eq(c->build(in, &y), DT_OK, "%s: %s", c->name, dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &y), DT_OK, "%s: %s", c->name, dt_last_error());
    unsetenv("DTENSOR_FUSION");
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(y);
    *text = program_text(f);
    return f;
}

static void *run_traced(const dt_function *f, const chain *c, dt_tensor *const in[], size_t *bytes)
{
    dt_tensor *r = NULL;
    cr_assert_eq(dt_function_run(f, c->nin, (const dt_tensor *const *)in, 1, &r), DT_OK, "%s: %s",
                 c->name, dt_last_error());
    void *h = read_all(r, bytes);
    dt_tensor_free(r);
    return h;
}

/* Runs c eagerly, fused and unfused; asserts the three bitwise equal, the fused program has
 * at least `fused_kernels` kernels in one fused step and the unfused none. Returns the result
 * (free it). */
static void *check_chain(const chain *c, int fused_kernels, char **fused_text)
{
    dt_tensor *in[MAXIN] = {0}, *e = NULL;
    for (int i = 0; i < c->nin; i++)
        in[i] = input(c, i);
    cr_assert_eq(c->build(in, &e), DT_OK, "%s: %s", c->name, dt_last_error());
    size_t be, bf, bu;
    void *he = read_all(e, &be);
    dt_tensor_free(e);

    char *tf, *tu;
    dt_function *ff = trace(c, true, &tf), *fu = trace(c, false, &tu);
    void *hf = run_traced(ff, c, in, &bf), *hu = run_traced(fu, c, in, &bu);
    cr_expect(strstr(tu, "fused") == NULL, "%s: DTENSOR_FUSION=0 fused:\n%s", c->name, tu);
    int most = 0;
    for (const char *at = tf; (at = strstr(at, "kernel     fused ")) != NULL; at++) {
        const char *k = strstr(at, " kernels: ");
        int n = 0;
        while (k && k > at && k[-1] >= '0' && k[-1] <= '9')
            k--;
        if (k)
            n = atoi(k);
        most = n > most ? n : most;
    }
    cr_expect(most >= fused_kernels, "%s: largest fused step %d kernels, expected >= %d:\n%s",
              c->name, most, fused_kernels, tf);
    cr_assert_eq(bf, be);
    cr_assert_eq(bu, be);
    cr_expect(memcmp(hf, he, be) == 0, "%s: fused differs from eager:\n%s", c->name, tf);
    cr_expect(memcmp(hu, he, be) == 0, "%s: unfused traced differs from eager", c->name);
    dt_function_free(ff);
    dt_function_free(fu);
    free(hf);
    free(hu);
    free(tu);
    if (fused_text)
        *fused_text = tf;
    else
        free(tf);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(in[i]);
    return he;
}

/* ---- chains ---------------------------------------------------------------------------------- */

/* gelu(x + b): the MLP's bias and activation */
static dt_status bias_gelu(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_ADD, in[0], in[1], NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_GELU, t, NULL, out);
    dt_tensor_free(t);
    return s;
}

/* (x + y) * 0.5 + tanh(x): a residual add, a scale by a constant, another branch */
static dt_status residual_scale(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *a = NULL, *h = NULL, *m = NULL, *t = NULL;
    dt_status s = dt_binary(DT_BINARY_ADD, in[0], in[1], NULL, &a);
    if (s == DT_OK)
        s = constant(dt_tensor_dtype(in[0]), 0.5, &h);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, a, h, NULL, &m);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_TANH, in[0], NULL, &t);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, m, t, NULL, out);
    dt_tensor_free(a);
    dt_tensor_free(h);
    dt_tensor_free(m);
    dt_tensor_free(t);
    return s;
}

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

static const dt_dtype floats[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};

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

/* The kernels a chain of n - 1 ops and its reduction make one step of: n where the backend's
 * FUSED entry takes reductions (`fused_reduce`: the CPU, emulated and real GPUs), else the
 * reduction stays its own kernel. */
static int reduce_kernels(int n)
{
    const dt__backend *be = dt__backend_of(FUSION_DEVICE);
    return be && be->fused_reduce ? n : 1;
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

/* Adam's update written out on w, g, m, v: m' = m * 0.9 + g * 0.1, v' = |v| * 0.99 + g^2 * 0.01,
 * w' = w + m' / (sqrt(v') + 1e-3) * -0.25; out[0..2] = w', m', v'. With `extra`, out[3] =
 * sum(m'), a reader outside the chain after it (m' is still stored by w's fused step). */
static dt_status moments(dt_tensor *const in[], bool extra, dt_tensor *out[])
{
    dt_dtype dt = dt_tensor_dtype(in[0]);
    dt_tensor *t[16] = {0};
    dt_status s = constant(dt, 0.9, &t[0]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[2], t[0], NULL, &t[1]);
    if (s == DT_OK)
        s = constant(dt, 0.1, &t[2]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[1], t[2], NULL, &t[3]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[1], t[3], NULL, &out[1]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_ABS, in[3], NULL, &t[4]);
    if (s == DT_OK)
        s = constant(dt, 0.99, &t[5]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[4], t[5], NULL, &t[6]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, in[1], NULL, &t[7]);
    if (s == DT_OK)
        s = constant(dt, 0.01, &t[8]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[7], t[8], NULL, &t[9]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[6], t[9], NULL, &out[2]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQRT, out[2], NULL, &t[10]);
    if (s == DT_OK)
        s = constant(dt, 1e-3, &t[11]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[10], t[11], NULL, &t[12]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_DIV, out[1], t[12], NULL, &t[13]);
    if (s == DT_OK)
        s = constant(dt, -0.25, &t[14]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[13], t[14], NULL, &t[15]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, in[0], t[15], NULL, &out[0]);
    if (s == DT_OK && extra)
        s = dt_reduce(DT_REDUCE_SUM, out[1], 0, NULL, 0, NULL, &out[3]);
    for (int i = 0; i < 16; i++)
        dt_tensor_free(t[i]);
    return s;
}

/* moments() on [5, 6, 20] tensors in layout `l`: traced with fusion, traced with
 * DTENSOR_FUSION=0 and eager give bitwise the same results; fused, the chain is one kernel
 * step writing m' and v' beside w' (with `extra`, then the sum of m' read from where the
 * fused step stored it), the unfused program has no fused step. */
static void check_moments(dt_dtype dt, const char *l, bool extra)
{
    int nout = extra ? 4 : 3;
    chain c = {"moments",        NULL,         4,
               {dt, dt, dt, dt}, {3, 3, 3, 3}, {{5, 6, 20}, {5, 6, 20}, {5, 6, 20}, {5, 6, 20}},
               {l, l, l, l}};
    dt_tensor *in[4], *res[3][4] = {{0}};
    for (int i = 0; i < 4; i++)
        in[i] = input(&c, i);
    cr_assert_eq(moments(in, extra, res[0]), DT_OK, "%s", dt_last_error());
    char *text[2] = {0};
    for (int k = 0; k < 2; k++) {
        bool fuse = k == 0;
        if (!fuse)
            setenv("DTENSOR_FUSION", "0", 1);
        dt_function *f = NULL;
        dt_tensor *x[4] = {0}, *y[4] = {0};
        cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
        dt_layout lx = L(l);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(dt_function_input(f, &lx, dt, 3, c.shape[i], &x[i]), DT_OK, "%s",
                         dt_last_error());
        cr_assert_eq(moments(x, extra, y), DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_function_end(f, nout, y), DT_OK, "%s", dt_last_error());
        unsetenv("DTENSOR_FUSION");
        for (int i = 0; i < 4; i++) {
            dt_tensor_free(x[i]);
            dt_tensor_free(y[i]);
        }
        text[k] = program_text(f);
        cr_assert_eq(dt_function_run(f, 4, (const dt_tensor *const *)in, nout, res[1 + k]), DT_OK,
                     "%s", dt_last_error());
        dt_function_free(f);
    }
    int steps = 0;
    for (const char *at = text[0]; (at = strstr(at, "kernel     ")) != NULL; at++)
        steps++;
    cr_expect_eq(steps, extra ? 2 : 1, "%s %s%s: %d kernel steps, expected %d:\n%s",
                 dt_dtype_name(dt), l, extra ? " (extra)" : "", steps, extra ? 2 : 1, text[0]);
    cr_expect(strstr(text[0], extra ? " -> x4; " : " -> x4; t") != NULL, "%s %s:\n%s",
              dt_dtype_name(dt), l, text[0]);
    cr_expect(strstr(text[1], "fused") == NULL, "DTENSOR_FUSION=0 fused:\n%s", text[1]);
    for (int o = 0; o < nout; o++) {
        size_t b[3];
        void *h[3];
        for (int k = 0; k < 3; k++)
            h[k] = read_all(res[k][o], &b[k]);
        cr_assert(b[1] == b[0] && b[2] == b[0]);
        cr_expect(memcmp(h[1], h[0], b[0]) == 0, "%s %s: result %d fused differs from eager:\n%s",
                  dt_dtype_name(dt), l, o, text[0]);
        cr_expect(memcmp(h[2], h[0], b[0]) == 0, "%s %s: result %d unfused differs from eager",
                  dt_dtype_name(dt), l, o);
        for (int k = 0; k < 3; k++) {
            free(h[k]);
            dt_tensor_free(res[k][o]);
        }
    }
    for (int i = 0; i < 4; i++)
        dt_tensor_free(in[i]);
    free(text[0]);
    free(text[1]);
}

Test(fusion, stored_results)
{
    start(8, "x=2,y=4");
    const char *layouts[] = {"unsharded,unsharded,unsharded", "y,x,unsharded",
                             "unsharded,unsharded,x"};
    for (size_t d = 0; d < sizeof floats / sizeof *floats; d++)
        for (int l = 0; l < 3; l++)
            for (int e = 0; e < 2; e++)
                check_moments(floats[d], layouts[l], e);
    stop();
}

/* ---- reductions: a stored chain, the order of the sums ------------------------------------ */

/* out[0] = square(x - y) (y a row), out[1] = its sum over the last axis: the chain's value is a
 * program output, so the fused step stores it beside the reduction. */
static dt_status stored_sum(dt_tensor *const in[], dt_tensor *out[])
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_SUB, in[0], in[1], NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, t, NULL, &out[0]);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, out[0], 1, (int[]){2}, true, NULL, &out[1]);
    dt_tensor_free(t);
    return s;
}

Test(fusion, stored_reduction)
{
    start(4, "x=2,y=2");
    const char *lx[] = {"unsharded,unsharded,unsharded", "x,y,unsharded", "x,unsharded,y"};
    const char *ly[] = {"unsharded", "unsharded", "y"};
    for (size_t d = 0; d < sizeof floats / sizeof *floats; d++)
        for (int l = 0; l < 3; l++) {
            dt_dtype dt = floats[d];
            chain c = {"stored_sum", NULL, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {lx[l], ly[l]}};
            dt_tensor *in[2] = {input(&c, 0), input(&c, 1)}, *res[3][2] = {{0}};
            cr_assert_eq(stored_sum(in, res[0]), DT_OK, "%s", dt_last_error());
            char *text[2] = {0};
            for (int k = 0; k < 2; k++) {
                if (k)
                    setenv("DTENSOR_FUSION", "0", 1);
                dt_function *f = NULL;
                dt_tensor *x[2] = {0}, *y[2] = {0};
                cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
                for (int i = 0; i < 2; i++) {
                    dt_layout li = L(c.layout[i]);
                    cr_assert_eq(dt_function_input(f, &li, dt, c.rank[i], c.shape[i], &x[i]), DT_OK,
                                 "%s", dt_last_error());
                }
                cr_assert_eq(stored_sum(x, y), DT_OK, "%s", dt_last_error());
                cr_assert_eq(dt_function_end(f, 2, y), DT_OK, "%s", dt_last_error());
                unsetenv("DTENSOR_FUSION");
                for (int i = 0; i < 2; i++) {
                    dt_tensor_free(x[i]);
                    dt_tensor_free(y[i]);
                }
                text[k] = program_text(f);
                cr_assert_eq(dt_function_run(f, 2, (const dt_tensor *const *)in, 2, res[1 + k]),
                             DT_OK, "%s", dt_last_error());
                dt_function_free(f);
            }
            if (reduce_kernels(2) == 2)
                cr_expect(strstr(text[0], "3 kernels: t1 = square(sub(x0, x1[1,1,") != NULL &&
                              strstr(text[0], " -> x2; sum(t1) -> [") != NULL,
                          "%s %s:\n%s", dt_dtype_name(dt), lx[l], text[0]);
            for (int o = 0; o < 2; o++) {
                size_t b[3];
                void *h[3];
                for (int k = 0; k < 3; k++)
                    h[k] = read_all(res[k][o], &b[k]);
                cr_assert(b[1] == b[0] && b[2] == b[0]);
                cr_expect(memcmp(h[1], h[0], b[0]) == 0 && memcmp(h[2], h[0], b[0]) == 0,
                          "%s %s: result %d differs from eager:\n%s", dt_dtype_name(dt), lx[l], o,
                          text[0]);
                for (int k = 0; k < 3; k++) {
                    free(h[k]);
                    dt_tensor_free(res[k][o]);
                }
            }
            dt_tensor_free(in[0]);
            dt_tensor_free(in[1]);
            free(text[0]);
            free(text[1]);
        }
    stop();
}

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

/* Meshes of GPUs fuse: emulated ones (DTENSOR_EMULATE_CUDA) with the CPU's kernel table, real
 * ones with the CUDA backend's fused kernel. Either way eager, fused and unfused agree
 * bitwise. */
Test(fusion, gpus)
{
    /* two logical devices on one GPU, real or emulated */
    setenv("DTENSOR_EMULATE_CUDA", "1", 1);
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = 2};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    unsetenv("DTENSOR_EMULATE_CUDA");
    if (dt_num_local_devices(DT_DEVICE_CUDA) < 2) {
        cr_expect_eq(dt_finalize(), DT_OK);
        cr_skip_test("fewer than 2 GPUs (emulated or real) in this build");
    }
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CUDA, &mesh), DT_OK, "%s",
                 dt_last_error());
    bool emulated = strstr(dt__backend_of(DT_DEVICE_CUDA)->name, "emulated") != NULL;
    const dt_dtype types[] = {DT_DTYPE_F32, DT_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        dt_dtype dt = types[t];
        chain cs[] = {{"bias_gelu",
                       bias_gelu,
                       2,
                       {dt, dt},
                       {3, 1},
                       {{5, 6, 20}, {20}},
                       {"x,unsharded,unsharded", "unsharded"}},
                      {"residual_scale",
                       residual_scale,
                       2,
                       {dt, dt},
                       {3, 3},
                       {{5, 6, 20}, {5, 6, 20}},
                       {"x,unsharded,unsharded", "x,unsharded,unsharded"}}};
        for (int c = 0; c < 2; c++) {
            char *text = NULL;
            free(check_chain(&cs[c], 2, &text));
            cr_expect(strstr(text, "fused") != NULL, "%s (%s GPUs):\n%s", cs[c].name,
                      emulated ? "emulated" : "real", text);
            free(text);
        }
        check_moments(dt, "x,unsharded,unsharded", false);
    }
    stop();
}

/* The optimizers with slots trace their update per variable (train/optimizer.c), which fusion
 * runs as one kernel writing the new value and the new slots: three steps on an unevenly
 * sharded f64 variable, fused and with DTENSOR_FUSION=0, each bitwise equal to the update
 * computed here in the same order (Adam(W); SGD with momentum, plain and Nesterov; RMSprop
 * with and without momentum). */
static void optimizer_steps(dt_optimizer_kind kind, double momentum, bool nesterov, bool fuse)
{
    enum { R = 5, C = 7, N = R * C, STEPS = 3 };
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-7, wd = 0.05, rho = 0.9;
    double w[N], m[N] = {0}, v[N] = {0}, g[STEPS][N];
    for (int i = 0; i < N; i++) {
        w[i] = 0.25 * (i % 9) - 1;
        for (int t = 0; t < STEPS; t++)
            g[t][i] = 0.125 * ((i * (t + 3)) % 11) - 0.6;
    }
    dt_layout l = L("x,y");
    dt_tensor *init = NULL;
    dt_variable *var = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){R, C}, w, sizeof w, &init),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_variable_create(init, &var), DT_OK, "%s", dt_last_error());
    dt_tensor_free(init);
    dt_optimizer_config oc = {.kind = kind,
                              .learning_rate = lr,
                              .weight_decay = kind == DT_OPTIMIZER_ADAMW ? wd : 0,
                              .momentum = momentum,
                              .nesterov = nesterov,
                              .epsilon = eps,
                              .rho = rho};
    dt_optimizer *o = NULL;
    cr_assert_eq(dt_optimizer_create(&oc, &o), DT_OK, "%s", dt_last_error());
    char what[64];
    snprintf(what, sizeof what, "%s momentum %g%s%s",
             kind == DT_OPTIMIZER_SGD       ? "sgd"
             : kind == DT_OPTIMIZER_RMSPROP ? "rmsprop"
             : kind == DT_OPTIMIZER_ADAMW   ? "adamw"
                                            : "adam",
             momentum, nesterov ? " nesterov" : "", fuse ? "" : " (unfused)");
    if (!fuse)
        setenv("DTENSOR_FUSION", "0", 1);
    for (int t = 0; t < STEPS; t++) {
        dt_tensor *gt = NULL;
        cr_assert_eq(
            dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){R, C}, g[t], sizeof g[t], &gt),
            DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_optimizer_apply(o, 1, &var, (const dt_tensor *const *)&gt), DT_OK, "%s",
                     dt_last_error());
        dt_tensor_free(gt);
        if (t == 0) { /* the traced update: one step, writing the slots beside the value */
            int ns =
                kind == DT_OPTIMIZER_SGD || (kind == DT_OPTIMIZER_RMSPROP && !momentum) ? 1 : 2;
            char *text = program_text(o->slots[0].update);
            int steps = 0;
            for (const char *at = text; (at = strstr(at, "kernel     ")) != NULL; at++)
                steps++;
            cr_expect(fuse ? steps == 1 : steps > 1 && !strstr(text, "fused"),
                      "%s: %d kernel steps:\n%s", what, steps, text);
            cr_expect(!fuse || (strstr(text, " -> x") &&
                                (ns == 1 || strstr(text, " -> x6; ") || strstr(text, " -> x5; "))),
                      "%s:\n%s", what, text);
            free(text);
        }
        double lr_t = lr * sqrt(1.0 - pow(b2, t + 1)) / (1.0 - pow(b1, t + 1));
        for (int i = 0; i < N; i++) {
            double gi = g[t][i];
            if (kind == DT_OPTIMIZER_SGD) {
                m[i] = m[i] * momentum + gi * -lr;
                double u = nesterov ? m[i] * momentum + gi * -lr : m[i];
                w[i] = w[i] * 1.0 + u * 1.0;
            } else if (kind == DT_OPTIMIZER_RMSPROP) {
                m[i] = m[i] * rho + (gi * gi) * (1.0 - rho);
                double d = gi / sqrt(m[i] + eps);
                if (momentum > 0) {
                    v[i] = v[i] * momentum + d * lr;
                    w[i] = w[i] * 1.0 + v[i] * -1.0;
                } else {
                    w[i] = w[i] * 1.0 + d * -lr;
                }
            } else {
                double x = kind == DT_OPTIMIZER_ADAMW ? w[i] * (1.0 - lr * wd) : w[i];
                m[i] = m[i] * b1 + gi * (1.0 - b1);
                v[i] = v[i] * b2 + (gi * gi) * (1.0 - b2);
                double u = m[i] / (sqrt(v[i]) + eps);
                w[i] = x + u * -lr_t;
            }
        }
    }
    unsetenv("DTENSOR_FUSION");
    double got[N];
    cr_assert_eq(dt_tensor_read(dt_variable_value(var), got, sizeof got), DT_OK, "%s",
                 dt_last_error());
    for (int i = 0; i < N; i++)
        cr_expect(memcmp(&got[i], &w[i], sizeof got[i]) == 0, "%s element %d: %.17g, want %.17g",
                  what, i, got[i], w[i]);
    dt_optimizer_free(o);
    dt_variable_free(var);
}

Test(fusion, optimizers)
{
    start(4, "x=2,y=2");
    for (int f = 0; f < 2; f++) {
        optimizer_steps(DT_OPTIMIZER_ADAM, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_ADAMW, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_SGD, 0.9, false, f);
        optimizer_steps(DT_OPTIMIZER_SGD, 0.9, true, f);
        optimizer_steps(DT_OPTIMIZER_RMSPROP, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_RMSPROP, 0.5, false, f);
    }
    stop();
}
