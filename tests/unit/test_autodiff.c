/* Gradients of every differentiable op (and the losses): each case's loss is
 * L = sum(op(inputs) * W) with fixed random weights W; dt_function_gradient's result is
 * checked against central finite differences of L on replicated layouts (the computation of
 * one device), and the same gradient under sharded layouts on a 2x2 mesh (uneven shards
 * included) against the replicated one. f64 throughout. */
#include <criterion/criterion.h>

#include "dt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_mesh *mesh, *mesh2;

static void start(void)
{
    dt_init_options o = {.cpu_devices = 4};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_mesh_create_from_string("x=2,y=2", DT_DEVICE_CPU, &mesh), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_mesh_create_from_string("z=4", DT_DEVICE_CPU, &mesh2), DT_OK, "%s",
                 dt_last_error());
}

static void stop(void)
{
    dt_mesh_free(mesh);
    dt_mesh_free(mesh2);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

TestSuite(autodiff, .init = start, .fini = stop, .timeout = 60);

#define MAXIN 3

typedef dt_status (*build_fn)(dt_tensor *const in[], dt_tensor **out);

typedef struct gcase {
    const char *name;
    int nin;
    int rank[MAXIN];
    int64_t shape[MAXIN][4];
    const char *sharded[MAXIN]; /* layouts on x=2,y=2 */
    int domain;                 /* 0: |v| in [0.2, 1] with random sign; 1: [0.5, 1.5] */
    build_fn build;
} gcase;

/* Trace L = sum(build(inputs) * W) on the given layouts; its gradient w.r.t. every input. */
static dt_function *grad_of(const gcase *c, const dt_layout *ls)
{
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[MAXIN] = {0}, *y = NULL, *w = NULL, *p = NULL, *l = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    for (int i = 0; i < c->nin; i++)
        cr_assert_eq(dt_function_input(f, &ls[i], DT_DTYPE_F64, c->rank[i], c->shape[i], &in[i]),
                     DT_OK, "%s", dt_last_error());
    cr_assert_eq(c->build(in, &y), DT_OK, "%s: %s", c->name, dt_last_error());
    dt_layout rl;
    cr_assert_eq(dt_layout_replicated(dt_tensor_mesh(y), dt_tensor_rank(y), &rl), DT_OK);
    dt_op_options o = {.layout = &rl};
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F64, dt_tensor_rank(y), dt_tensor_shape(y), 7, 99, -1,
                                   1, &o, &w),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, y, w, NULL, &p), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &l), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &l), DT_OK, "%s: %s", c->name, dt_last_error());
    int wrt[MAXIN] = {0, 1, 2};
    cr_assert_eq(dt_function_gradient(f, 0, c->nin, wrt, &g), DT_OK, "%s: %s", c->name,
                 dt_last_error());
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(y);
    dt_tensor_free(w);
    dt_tensor_free(p);
    dt_tensor_free(l);
    dt_function_free(f);
    return g;
}

/* Run g on host inputs; loss into *L, gradients (when grads non-NULL) into grads[i]. */
static void run(const gcase *c, dt_function *g, const dt_layout *ls, double *const host[],
                double *L, double *const grads[])
{
    const dt_tensor *in[MAXIN];
    dt_tensor *tin[MAXIN], *res[1 + MAXIN] = {0};
    for (int i = 0; i < c->nin; i++) {
        size_t n = (size_t)dt__num_elements(c->rank[i], c->shape[i]);
        cr_assert_eq(dt_tensor_from_host(&ls[i], DT_DTYPE_F64, c->rank[i], c->shape[i], host[i],
                                         n * sizeof(double), &tin[i]),
                     DT_OK, "%s", dt_last_error());
        in[i] = tin[i];
    }
    cr_assert_eq(dt_function_run(g, c->nin, in, 1 + c->nin, res), DT_OK, "%s: %s", c->name,
                 dt_last_error());
    cr_assert_eq(dt_tensor_read(res[0], L, sizeof *L), DT_OK, "%s", dt_last_error());
    for (int i = 0; i < c->nin; i++) {
        cr_assert(dt_layout_equal(dt_tensor_layout(res[1 + i]), &ls[i]),
                  "%s: gradient %d not in its input's layout", c->name, i);
        size_t n = (size_t)dt__num_elements(c->rank[i], c->shape[i]);
        if (grads)
            cr_assert_eq(dt_tensor_read(res[1 + i], grads[i], n * sizeof(double)), DT_OK, "%s",
                         dt_last_error());
    }
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(tin[i]);
    for (int i = 0; i < 1 + c->nin; i++)
        dt_tensor_free(res[i]);
}

static void check_case(const gcase *c)
{
    dt_layout rep[MAXIN], shd[MAXIN];
    double *host[MAXIN], *gr[MAXIN], *gs[MAXIN];
    unsigned seed = 12345;
    for (int i = 0; i < c->nin; i++) {
        cr_assert_eq(dt_layout_replicated(mesh, c->rank[i], &rep[i]), DT_OK);
        cr_assert_eq(dt_layout_parse(mesh, c->sharded[i], &shd[i]), DT_OK, "%s: %s", c->name,
                     dt_last_error());
        size_t n = (size_t)dt__num_elements(c->rank[i], c->shape[i]);
        host[i] = malloc(n * sizeof(double));
        gr[i] = malloc(n * sizeof(double));
        gs[i] = malloc(n * sizeof(double));
        for (size_t k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            double u = (double)((seed >> 8) & 0xffff) / 65536.0;
            seed = seed * 1103515245u + 12345u;
            double sign = (seed >> 20) & 1 ? 1.0 : -1.0;
            host[i][k] = c->domain ? 0.5 + u : sign * (0.2 + 0.8 * u);
        }
    }
    dt_function *g = grad_of(c, rep);
    double L;
    run(c, g, rep, host, &L, gr);
    /* finite differences on the replicated run */
    const double h = 1e-6;
    for (int i = 0; i < c->nin; i++) {
        int64_t n = dt__num_elements(c->rank[i], c->shape[i]);
        for (int64_t k = 0; k < n; k++) {
            double keep = host[i][k], lp, lm;
            host[i][k] = keep + h;
            run(c, g, rep, host, &lp, NULL);
            host[i][k] = keep - h;
            run(c, g, rep, host, &lm, NULL);
            host[i][k] = keep;
            double fd = (lp - lm) / (2 * h);
            cr_expect(fabs(fd - gr[i][k]) <= 1e-6 * (1 + fabs(fd)),
                      "%s: input %d element %lld: gradient %.10g, finite difference %.10g", c->name,
                      i, (long long)k, gr[i][k], fd);
        }
    }
    dt_function_free(g);
    /* sharded layouts against the replicated gradient */
    g = grad_of(c, shd);
    double Ls;
    run(c, g, shd, host, &Ls, gs);
    cr_expect(fabs(Ls - L) <= 1e-12 * (1 + fabs(L)), "%s: sharded loss %.15g, replicated %.15g",
              c->name, Ls, L);
    for (int i = 0; i < c->nin; i++) {
        int64_t n = dt__num_elements(c->rank[i], c->shape[i]);
        for (int64_t k = 0; k < n; k++)
            cr_expect(fabs(gs[i][k] - gr[i][k]) <= 1e-11 * (1 + fabs(gr[i][k])),
                      "%s: input %d element %lld: sharded gradient %.15g, replicated %.15g",
                      c->name, i, (long long)k, gs[i][k], gr[i][k]);
    }
    dt_function_free(g);
    for (int i = 0; i < c->nin; i++) {
        free(host[i]);
        free(gr[i]);
        free(gs[i]);
    }
}

/* ---- builders ------------------------------------------------------------------------------ */

#define MM(NAME, TA, TB)                                          \
    static dt_status NAME(dt_tensor *const in[], dt_tensor **out) \
    {                                                             \
        dt_op_options o = {.transpose_a = TA, .transpose_b = TB}; \
        return dt_matmul(in[0], in[1], &o, out);                  \
    }
MM(mm_nn, 0, 0)
MM(mm_tn, 1, 0)
MM(mm_nt, 0, 1)
MM(mm_tt, 1, 1)

static dt_unary_op cur_unary;
static dt_binary_op cur_binary;
static dt_reduce_op cur_reduce;
static int cur_axis, cur_keep;
static dt_loss cur_loss;

static dt_status b_unary(dt_tensor *const in[], dt_tensor **out)
{
    return dt_unary(cur_unary, in[0], NULL, out);
}

static dt_status b_binary(dt_tensor *const in[], dt_tensor **out)
{
    return dt_binary(cur_binary, in[0], in[1], NULL, out);
}

static dt_status b_reduce(dt_tensor *const in[], dt_tensor **out)
{
    return dt_reduce(cur_reduce, in[0], 1, &cur_axis, cur_keep, NULL, out);
}

static dt_status b_transpose(dt_tensor *const in[], dt_tensor **out)
{
    return dt_transpose(in[0], (int[]){2, 0, 1}, NULL, out);
}

static dt_status b_reshape(dt_tensor *const in[], dt_tensor **out)
{
    return dt_reshape(in[0], 3, (int64_t[]){4, 2, 3}, NULL, out);
}

static dt_status b_slice(dt_tensor *const in[], dt_tensor **out)
{
    return dt_slice(in[0], (int64_t[]){1, 2}, (int64_t[]){3, 3}, NULL, out);
}

static dt_status b_concat(dt_tensor *const in[], dt_tensor **out)
{
    const dt_tensor *xs[2] = {in[0], in[1]};
    return dt_concat(2, xs, 1, NULL, out);
}

static dt_status b_relayout(dt_tensor *const in[], dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_parse(mesh, "y,x", &l));
    return dt_relayout(in[0], &l, NULL, out);
}

/* A relayout the gradient recomputes (the square's rule reads it again). */
static dt_status b_relayout_recompute(dt_tensor *const in[], dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(mesh, 2, &l));
    dt_tensor *t;
    DT_TRY(dt_relayout(in[0], &l, &(dt_op_options){.recompute = 1}, &t));
    dt_status s = dt_unary(DT_UNARY_SQUARE, t, NULL, out);
    dt_tensor_free(t);
    return s;
}

static dt_status b_copy_to_mesh(dt_tensor *const in[], dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_parse(mesh2, "z,unsharded", &l));
    dt_tensor *t;
    DT_TRY(dt_copy_to_mesh(in[0], &l, NULL, &t));
    dt_status s = dt_unary(DT_UNARY_SQUARE, t, NULL, out); /* a nonlinear use on mesh2 */
    dt_tensor_free(t);
    return s;
}

static dt_status b_loss(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *y = in[1], *t = NULL;
    dt_status s = DT_OK;
    if (cur_loss != DT_LOSS_MEAN_SQUARED_ERROR) {
        /* labels in [0, 1]: sigmoid of the second input (softmax CE takes any distribution) */
        s = dt_unary(DT_UNARY_SIGMOID, in[1], NULL, &t);
        y = t;
    }
    if (s == DT_OK)
        s = dt_loss_per_example(cur_loss, y, in[0], out);
    dt_tensor_free(t);
    return s;
}

/* ---- cases ---------------------------------------------------------------------------------- */

#define R2(a, b) \
    {            \
        a, b     \
    }
#define R3(a, b, c) \
    {               \
        a, b, c     \
    }

Test(autodiff, matmul)
{
    gcase cs[] = {
        {"matmul", 2, {2, 2}, {R2(5, 6), R2(6, 3)}, {"x,y", "y,unsharded"}, 0, mm_nn},
        {"matmul_ta", 2, {2, 2}, {R2(6, 5), R2(6, 3)}, {"x,y", "x,y"}, 0, mm_tn},
        {"matmul_tb", 2, {2, 2}, {R2(5, 6), R2(3, 6)}, {"unsharded,x", "y,x"}, 0, mm_nt},
        {"matmul_tt", 2, {2, 2}, {R2(6, 5), R2(3, 6)}, {"x,y", "unsharded,x"}, 0, mm_tt},
        {"matmul_batch_shared_b",
         2,
         {3, 2},
         {R3(2, 5, 6), R2(6, 3)},
         {"x,y,unsharded", "unsharded,y"},
         0,
         mm_nn},
        {"matmul_batch_shared_b_ta",
         2,
         {3, 2},
         {R3(2, 6, 5), R2(6, 3)},
         {"x,y,unsharded", "y,unsharded"},
         0,
         mm_tn},
        {"matmul_batch_shared_b_tb",
         2,
         {3, 2},
         {R3(3, 5, 6), R2(3, 6)},
         {"x,unsharded,y", "unsharded,y"},
         0,
         mm_nt},
        {"matmul_batch_shared_b_tt",
         2,
         {4, 2},
         {{2, 3, 6, 5}, R2(3, 6)},
         {"x,unsharded,y,unsharded", "unsharded,x"},
         0,
         mm_tt},
        {"matmul_batch",
         2,
         {3, 3},
         {R3(2, 5, 6), R3(2, 6, 3)},
         {"x,unsharded,y", "x,y,unsharded"},
         0,
         mm_nn},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        check_case(&cs[i]);
}

Test(autodiff, unary)
{
    for (int op = 0; op < DT_UNARY_COUNT; op++) {
        if (op == DT_UNARY_LOGICAL_NOT) /* of bool: nothing to differentiate */
            continue;
        cur_unary = (dt_unary_op)op;
        int positive = op == DT_UNARY_LOG || op == DT_UNARY_SQRT || op == DT_UNARY_RSQRT;
        gcase c = {dt_unary_op_name(cur_unary), 1, {2}, {R2(5, 3)}, {"x,y"}, positive, b_unary};
        check_case(&c);
    }
}

Test(autodiff, binary)
{
    const dt_binary_op ops[] = {DT_BINARY_ADD, DT_BINARY_SUB,      DT_BINARY_MUL,
                                DT_BINARY_DIV, DT_BINARY_MAX,      DT_BINARY_MIN,
                                DT_BINARY_POW, DT_BINARY_FLOORDIV, DT_BINARY_FLOORMOD};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        cur_binary = ops[i];
        /* floordiv and floormod jump where a / b is an integer: the positive domain keeps
         * the finite differences away from a jump */
        int positive = ops[i] == DT_BINARY_POW || ops[i] == DT_BINARY_DIV ||
                       ops[i] == DT_BINARY_FLOORDIV || ops[i] == DT_BINARY_FLOORMOD;
        gcase same = {dt_binary_op_name(ops[i]),
                      2,
                      {2, 2},
                      {R2(5, 6), R2(5, 6)},
                      {"x,y", "y,x"},
                      positive,
                      b_binary};
        check_case(&same);
        gcase bcast = {dt_binary_op_name(ops[i]),
                       2,
                       {2, 1},
                       {R2(5, 6), {6}},
                       {"x,y", "y"},
                       positive,
                       b_binary};
        check_case(&bcast);
        gcase col = {dt_binary_op_name(ops[i]),      2,        {2, 2},  {R2(5, 1), R2(5, 6)},
                     {"x,unsharded", "unsharded,y"}, positive, b_binary};
        check_case(&col);
    }
}

Test(autodiff, reduce)
{
    const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_MEAN, DT_REDUCE_MAX, DT_REDUCE_MIN,
                                DT_REDUCE_PROD};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        for (int axis = 0; axis < 2; axis++) {
            cur_reduce = ops[i];
            cur_axis = axis;
            cur_keep = axis;
            gcase c = {dt_reduce_op_name(ops[i]), 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_reduce};
            check_case(&c);
        }
}

/* reduce_prod at zeros, where y / x is not the product of the others: rows with no zero, one
 * zero (the product of the others at it, 0 elsewhere) and two zeros (0 everywhere), the rows
 * sharded over x and the reduced axis over y (uneven); the gradient of sum(prod(x, axis 1)). */
Test(autodiff, reduce_prod_at_zeros)
{
    const double x[3][3] = {{1, 2, 4}, {0, 2, 3}, {0, 0, 5}};
    const double want[3][3] = {{8, 4, 2}, {6, 0, 0}, {0, 0, 0}};
    dt_layout l;
    cr_assert_eq(dt_layout_parse(mesh, "x,y", &l), DT_OK);
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in = NULL, *p = NULL, *s = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, DT_DTYPE_F64, 2, (int64_t[]){3, 3}, &in), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_PROD, in, 1, (int[]){1}, 0, NULL, &p), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &s), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &s), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){0}, &g), DT_OK, "%s", dt_last_error());
    dt_tensor *tx = NULL, *res[2] = {0};
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){3, 3}, x, sizeof x, &tx),
                 DT_OK);
    cr_assert_eq(dt_function_run(g, 1, (const dt_tensor *const[]){tx}, 2, res), DT_OK, "%s",
                 dt_last_error());
    double got[3][3], loss;
    cr_assert_eq(dt_tensor_read(res[0], &loss, sizeof loss), DT_OK);
    cr_assert_eq(dt_tensor_read(res[1], got, sizeof got), DT_OK);
    cr_expect_eq(loss, 8.0, "sum of row products %g", loss);
    cr_expect(memcmp(got, want, sizeof got) == 0, "gradient [[%g %g %g] [%g %g %g] [%g %g %g]]",
              got[0][0], got[0][1], got[0][2], got[1][0], got[1][1], got[1][2], got[2][0],
              got[2][1], got[2][2]);
    dt_tensor_free(tx);
    dt_tensor_free(res[0]);
    dt_tensor_free(res[1]);
    dt_tensor_free(in);
    dt_tensor_free(p);
    dt_tensor_free(s);
    dt_function_free(f);
    dt_function_free(g);
}

Test(autodiff, shape_ops)
{
    gcase cs[] = {
        {"transpose", 1, {3}, {R3(3, 4, 5)}, {"x,unsharded,y"}, 0, b_transpose},
        {"reshape", 1, {2}, {R2(4, 6)}, {"x,unsharded"}, 0, b_reshape},
        {"slice", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_slice},
        {"concat", 2, {2, 2}, {R2(5, 6), R2(5, 2)}, {"x,y", "unsharded,y"}, 0, b_concat},
        {"relayout", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_relayout},
        {"relayout_recompute", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_relayout_recompute},
        {"copy_to_mesh", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_copy_to_mesh},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        check_case(&cs[i]);
}

Test(autodiff, losses)
{
    for (int l = 0; l < DT_LOSS_COUNT; l++) {
        cur_loss = (dt_loss)l;
        gcase c = {dt_loss_name(cur_loss), 2, {2, 2}, {R2(6, 4), R2(6, 4)},
                   {"x,y", "x,unsharded"}, 0, b_loss};
        check_case(&c);
    }
}

/* ---- row-wise ops -------------------------------------------------------------------------- */

static int cur_flags;

static dt_status b_softmax(dt_tensor *const in[], dt_tensor **out)
{
    return dt_softmax(in[0], cur_axis, NULL, out);
}

static dt_status b_log_softmax(dt_tensor *const in[], dt_tensor **out)
{
    return dt_log_softmax(in[0], cur_axis, NULL, out);
}

static dt_status b_logsumexp(dt_tensor *const in[], dt_tensor **out)
{
    return cur_axis < 0 ? dt_logsumexp(in[0], 0, NULL, cur_keep, NULL, out)
                        : dt_logsumexp(in[0], 1, &cur_axis, cur_keep, NULL, out);
}

/* cur_flags: 1 gamma, 2 beta, 4 rms */
static dt_status b_norm(dt_tensor *const in[], dt_tensor **out)
{
    const dt_tensor *g = (cur_flags & 1) ? in[1] : NULL;
    const dt_tensor *b = (cur_flags & 2) ? in[(cur_flags & 1) ? 2 : 1] : NULL;
    return (cur_flags & 4) ? dt_rms_norm(in[0], g, 1e-3, NULL, out)
                           : dt_layer_norm(in[0], g, b, 1e-3, NULL, out);
}

static dt_status b_cumsum(dt_tensor *const in[], dt_tensor **out)
{
    return dt_cumsum(in[0], cur_axis, cur_flags & 1, cur_flags & 2, NULL, out);
}

/* x times its row's argmax (as f64): the index is a constant, so the gradient is that index. */
static dt_status b_argmax_use(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *i = NULL, *f = NULL, *r = NULL;
    dt_status s = dt_argmax(in[0], 1, DT_DTYPE_I64, NULL, &i);
    if (s == DT_OK)
        s = dt_cast(i, DT_DTYPE_F64, NULL, &f);
    if (s == DT_OK)
        s = dt_reshape(f, 2, (int64_t[]){dt_tensor_shape(f)[0], 1}, NULL, &r);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[0], r, NULL, out);
    dt_tensor_free(i);
    dt_tensor_free(f);
    dt_tensor_free(r);
    return s;
}

Test(autodiff, softmax)
{
    for (int axis = -1; axis < 2; axis++) {
        cur_axis = axis;
        gcase a = {"softmax", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_softmax};
        check_case(&a);
        gcase b = {"log_softmax", 1, {2}, {R2(5, 6)}, {"y,x"}, 0, b_log_softmax};
        check_case(&b);
    }
    /* logsumexp over one axis, kept or dropped, and over every axis */
    for (int axis = -1; axis < 2; axis++)
        for (int keep = 0; keep < 2; keep++) {
            cur_axis = axis;
            cur_keep = keep;
            gcase c = {"logsumexp", 1, {3}, {R3(3, 5, 4)}, {"x,y,unsharded"}, 0, b_logsumexp};
            check_case(&c);
        }
}

Test(autodiff, norm)
{
    /* layer_norm with gamma and beta, gamma only, neither; rms_norm with and without gamma:
     * the last axis sharded (uneven), and x batch-sharded with gamma and beta replicated (their
     * gradients come out partial over x and are all-reduced) */
    const int variants[] = {3, 1, 0, 5, 4};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        cur_flags = variants[v];
        int np = !!(cur_flags & 1) + !!(cur_flags & 2);
        const char *name = cur_flags & 4 ? "rms_norm" : "layer_norm";
        gcase a = {name, 1 + np, {2, 1, 1}, {R2(5, 6), {6}, {6}}, {"x,y", "y", "unsharded"},
                   0,    b_norm};
        check_case(&a);
        gcase b = {name,
                   1 + np,
                   {3, 1, 1},
                   {R3(4, 3, 5), {5}, {5}},
                   {"x,y,unsharded", "unsharded", "unsharded"},
                   0,
                   b_norm};
        check_case(&b);
    }
}

Test(autodiff, cumsum)
{
    for (int axis = 0; axis < 2; axis++)
        for (int flags = 0; flags < 4; flags++) {
            cur_axis = axis;
            cur_flags = flags;
            gcase c = {"cumsum", 1, {2}, {R2(5, 7)}, {"x,y"}, 0, b_cumsum};
            check_case(&c);
        }
}

Test(autodiff, argmax)
{
    gcase c = {"argmax (a constant)", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_argmax_use};
    check_case(&c);
}

/* ---- shape and index ops -------------------------------------------------------------------- */

static bool replicated(const dt_tensor *t)
{
    const dt_layout *l = dt_tensor_layout(t);
    for (int i = 0; i < l->rank; i++)
        if (l->axes[i] != DT_UNSHARDED)
            return false;
    return true;
}

static const char *cur_ids_layout; /* ids' layout in the sharded runs */
static int64_t cur_ids_mod;        /* ids are (5 k mod cur_ids_mod) - 1: repeats, -1, too large */

/* Integer ids of `shape` made inside the function (integers are no function inputs here),
 * replicated when `like` is, else in cur_ids_layout. */
static dt_status make_ids(const dt_tensor *like, int rank, const int64_t shape[], dt_tensor **out)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    dt_layout l1, l0, lo;
    DT_TRY(dt_layout_replicated(mesh, 1, &l1));
    DT_TRY(dt_layout_replicated(mesh, 0, &l0));
    if (replicated(like))
        DT_TRY(dt_layout_replicated(mesh, rank, &lo));
    else
        DT_TRY(dt_layout_parse(mesh, cur_ids_layout, &lo));
    dt_op_options o1 = {.layout = &l1}, o0 = {.layout = &l0};
    dt_tensor *r = NULL, *m = NULL, *one = NULL, *t = NULL, *u = NULL, *v = NULL;
    dt_status s = dt_arange(DT_DTYPE_I32, n, 0, 5, &o1, &r);
    if (s == DT_OK)
        s = dt_fill(DT_DTYPE_I32, 0, NULL, (double)cur_ids_mod, &o0, &m);
    if (s == DT_OK)
        s = dt_fill(DT_DTYPE_I32, 0, NULL, 1, &o0, &one);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_FLOORMOD, r, m, NULL, &t);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_SUB, t, one, NULL, &u);
    if (s == DT_OK)
        s = dt_reshape(u, rank, shape, NULL, &v);
    if (s == DT_OK)
        s = dt_relayout(v, &lo, NULL, out);
    dt_tensor_free(r);
    dt_tensor_free(m);
    dt_tensor_free(one);
    dt_tensor_free(t);
    dt_tensor_free(u);
    dt_tensor_free(v);
    return s;
}

static int cur_ids_rank;
static int64_t cur_ids_shape[4];

static dt_status b_gather(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *ids;
    DT_TRY(make_ids(in[0], cur_ids_rank, cur_ids_shape, &ids));
    dt_status s = dt_gather(in[0], ids, NULL, out);
    dt_tensor_free(ids);
    return s;
}

static dt_status b_segment_sum(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *ids;
    DT_TRY(make_ids(in[0], cur_ids_rank, cur_ids_shape, &ids));
    dt_status s = dt_unsorted_segment_sum(in[0], ids, 7, NULL, out);
    dt_tensor_free(ids);
    return s;
}

static const char *cur_equation;

static dt_status b_einsum(dt_tensor *const in[], dt_tensor **out)
{
    const dt_tensor *xs[2] = {in[0], in[1]};
    return dt_einsum(cur_equation, strchr(cur_equation, ',') ? 2 : 1, xs, NULL, out);
}

static dt_status b_stack(dt_tensor *const in[], dt_tensor **out)
{
    const dt_tensor *xs[3] = {in[0], in[1], in[2]};
    return dt_stack(3, xs, 1, NULL, out);
}

static dt_status b_split(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *parts[2] = {NULL, NULL}, *sq = NULL;
    DT_TRY(dt_split(in[0], 2, (const int64_t[]){2, 3}, 0, NULL, parts));
    dt_status s = dt_unary(DT_UNARY_SQUARE, parts[0], NULL, &sq);
    const dt_tensor *xs[2] = {parts[1], sq};
    if (s == DT_OK)
        s = dt_concat(2, xs, 0, NULL, out);
    dt_tensor_free(parts[0]);
    dt_tensor_free(parts[1]);
    dt_tensor_free(sq);
    return s;
}

static dt_status b_pad(dt_tensor *const in[], dt_tensor **out)
{
    return dt_pad(in[0], (const int64_t[]){1, 0}, (const int64_t[]){2, 3}, 0.5, NULL, out);
}

static dt_status b_tile(dt_tensor *const in[], dt_tensor **out)
{
    return dt_tile(in[0], (const int64_t[]){2, 3}, NULL, out);
}

static dt_status b_broadcast_to(dt_tensor *const in[], dt_tensor **out)
{
    if (dt_tensor_rank(in[0]) == 1)
        return dt_broadcast_to(in[0], 2, (const int64_t[]){5, 6}, NULL, out);
    return dt_broadcast_to(in[0], 3, (const int64_t[]){4, 5, 6}, NULL, out);
}

static dt_status b_expand_dims(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *t;
    DT_TRY(dt_expand_dims(in[0], 1, NULL, &t));
    dt_status s = dt_unary(DT_UNARY_SQUARE, t, NULL, out); /* a nonlinear use after it */
    dt_tensor_free(t);
    return s;
}

static dt_status b_squeeze(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *t;
    DT_TRY(dt_squeeze(in[0], 1, (const int[]){1}, NULL, &t));
    dt_status s = dt_unary(DT_UNARY_SQUARE, t, NULL, out);
    dt_tensor_free(t);
    return s;
}

Test(autodiff, gather_and_segment_sum)
{
    /* ids (5 k mod 8) - 1: -1 and 6 fall outside a table of 6 rows (no gradient there) */
    cur_ids_mod = 8;
    cur_ids_rank = 2;
    cur_ids_shape[0] = 2;
    cur_ids_shape[1] = 5;
    const char *ids_layouts[] = {"unsharded,unsharded", "y,unsharded", "x,y"};
    const char *table_layouts[] = {"x,unsharded", "x,y", "unsharded,y"};
    for (int k = 0; k < 3; k++) {
        cur_ids_layout = ids_layouts[k];
        gcase c = {"gather", 1, {2}, {R2(6, 4)}, {table_layouts[k]}, 0, b_gather};
        check_case(&c);
    }
    /* the segment sum of data rows [2, 5, 3] into 7 segments, the ids' batch sharded */
    cur_ids_mod = 9; /* -1 and 7 outside */
    const char *data_layouts[] = {"y,unsharded,unsharded", "x,y,unsharded", "unsharded,x,y"};
    for (int k = 0; k < 3; k++) {
        cur_ids_layout = ids_layouts[k];
        gcase c = {"unsorted_segment_sum", 1, {3},          {R3(2, 5, 3)},
                   {data_layouts[k]},      0, b_segment_sum};
        check_case(&c);
    }
}

Test(autodiff, einsum)
{
    gcase cs[] = {
        {"bsh,hd->bsd",
         2,
         {3, 2},
         {R3(2, 3, 4), R2(4, 5)},
         {"x,unsharded,y", "y,unsharded"},
         0,
         b_einsum},
        {"bhqd,bhkd->bhqk",
         2,
         {4, 4},
         {{2, 2, 3, 4}, {2, 2, 5, 4}},
         {"x,y,unsharded,unsharded", "x,unsharded,unsharded,y"},
         0,
         b_einsum},
        {"ij,jk->ik", 2, {2, 2}, {R2(5, 6), R2(6, 3)}, {"x,y", "y,unsharded"}, 0, b_einsum},
        {"ij->ji", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_einsum},
        {"i,i->", 2, {1, 1}, {{7}, {7}}, {"x", "y"}, 0, b_einsum},
        {"ij,j->i", 2, {2, 1}, {R2(5, 6), {6}}, {"unsharded,x", "y"}, 0, b_einsum},
        {"ij,k->i", 2, {2, 1}, {R2(5, 6), {3}}, {"x,y", "x"}, 0, b_einsum},
        {"ijk->kj", 1, {3}, {R3(3, 4, 5)}, {"x,unsharded,y"}, 0, b_einsum},
        {"ab,cb->ca", 2, {2, 2}, {R2(5, 6), R2(3, 6)}, {"y,x", "x,y"}, 0, b_einsum},
        {"...ij,...jk->...ik",
         2,
         {3, 3},
         {R3(2, 3, 4), R3(2, 4, 5)},
         {"x,y,unsharded", "unsharded,y,x"},
         0,
         b_einsum},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        cur_equation = cs[i].name;
        check_case(&cs[i]);
    }
}

Test(autodiff, shape_ops_more)
{
    gcase cs[] = {
        {"stack",
         3,
         {2, 2, 2},
         {R2(5, 6), R2(5, 6), R2(5, 6)},
         {"x,y", "y,x", "unsharded,y"},
         0,
         b_stack},
        {"split", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_split},
        {"pad", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_pad},
        {"tile", 1, {2}, {R2(3, 4)}, {"x,y"}, 0, b_tile},
        {"broadcast_to", 1, {2}, {R2(5, 1)}, {"x,unsharded"}, 0, b_broadcast_to},
        {"broadcast_to_rank1", 1, {1}, {{6}}, {"y"}, 0, b_broadcast_to},
        {"expand_dims", 1, {2}, {R2(5, 6)}, {"x,y"}, 0, b_expand_dims},
        {"squeeze", 1, {3}, {R3(5, 1, 6)}, {"x,y,unsharded"}, 0, b_squeeze},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        check_case(&cs[i]);
}

Test(autodiff, errors)
{
    dt_function *f = NULL, *g = (dt_function *)1;
    dt_tensor *x = NULL, *y = NULL;
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(mesh, 1, &l), DT_OK);
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, DT_DTYPE_F64, 1, (int64_t[]){4}, &x), DT_OK);
    cr_assert_eq(dt_unary(DT_UNARY_EXP, x, NULL, &y), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &y), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_function_gradient(f, 1, 1, (int[]){0}, &g), DT_ERR_ARG);
    cr_expect_null(g);
    cr_expect(strstr(dt_last_error(), "loss output 1") != NULL, "%s", dt_last_error());
    cr_expect_eq(dt_function_gradient(f, 0, 1, (int[]){3}, &g), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "wrt[0] = 3") != NULL, "%s", dt_last_error());
    cr_expect_eq(dt_function_gradient(NULL, 0, 1, (int[]){0}, &g), DT_ERR_STATE);
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_function_free(f);
}

/* ---- what the gradient program holds ------------------------------------------------------- */

/* The printed program of f's gradient w.r.t. its input 0 (freed by the caller). */
static char *gradient_text(dt_function *f)
{
    dt_function *g = NULL;
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){0}, &g), DT_OK, "%s", dt_last_error());
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert_eq(dt_function_print(g, out), DT_OK);
    fclose(out);
    dt_function_free(g);
    return text;
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* L = sum(square(relayout(x)) @ c) with x [8,6] sharded on x,y and c [6,6] replicated; the
 * relayout to replicated marked recompute or not. */
static char *program_of(bool recompute)
{
    dt_layout lx, rep;
    cr_assert_eq(dt_layout_parse(mesh, "x,y", &lx), DT_OK);
    cr_assert_eq(dt_layout_replicated(mesh, 2, &rep), DT_OK);
    dt_function *f = NULL;
    dt_tensor *x, *c, *r, *sq, *p, *l;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lx, DT_DTYPE_F64, 2, (int64_t[]){8, 6}, &x), DT_OK);
    cr_assert_eq(dt_function_input(f, &rep, DT_DTYPE_F64, 2, (int64_t[]){6, 6}, &c), DT_OK);
    cr_assert_eq(dt_relayout(x, &rep, &(dt_op_options){.recompute = recompute}, &r), DT_OK);
    cr_assert_eq(dt_unary(DT_UNARY_SQUARE, r, NULL, &sq), DT_OK);
    cr_assert_eq(dt_matmul(sq, c, NULL, &p), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &l), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &l), DT_OK, "%s", dt_last_error());
    char *text = gradient_text(f);
    dt_tensor *ts[] = {x, c, r, sq, p, l};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(f);
    return text;
}

/* A result marked recompute is gathered again in the backward pass instead of kept; nothing is
 * computed that no output needs (the gradient of c, an input not differentiated). */
Test(autodiff, gradient_program)
{
    char *kept = program_of(false), *again = program_of(true);
    /* one all-gather per mesh axis, in the forward pass, and again in the backward one */
    cr_expect_eq(count(kept, "all_gather"), 2, "%s", kept);
    cr_expect_eq(count(again, "all_gather"), 4, "%s", again);
    /* forward x^2 @ c and the gradient's dL/d(x^2) @ c^T: no dL/dc = (x^2)^T @ dL */
    cr_expect_eq(count(kept, " gemm f64"), 2, "%s", kept);
    cr_expect_eq(count(again, " gemm f64"), 2, "%s", again);
    free(kept);
    free(again);
}

/* The gradient of a sum over sharded axes is broadcast sharded as the summed value: L =
 * sum(square(x)) with x [8,6] on x,y puts no whole [8,6] (nor half of one) on any device. */
Test(autodiff, sum_gradient_stays_sharded)
{
    dt_layout lx;
    cr_assert_eq(dt_layout_parse(mesh, "x,y", &lx), DT_OK);
    dt_function *f = NULL;
    dt_tensor *x, *sq, *l;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lx, DT_DTYPE_F64, 2, (int64_t[]){8, 6}, &x), DT_OK);
    cr_assert_eq(dt_unary(DT_UNARY_SQUARE, x, NULL, &sq), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, sq, 0, NULL, 0, NULL, &l), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &l), DT_OK, "%s", dt_last_error());
    char *text = gradient_text(f);
    cr_expect_eq(count(text, "local [8,6]") + count(text, "local [4,6]") +
                     count(text, "local [8,3]"),
                 0, "%s", text);
    cr_expect_gt(count(text, "local [4,3]"), 0, "%s", text);
    free(text);
    dt_tensor_free(x);
    dt_tensor_free(sq);
    dt_tensor_free(l);
    dt_function_free(f);
}

/* A tied embedding under the fully sharded layout: table T [8,4] (rows on x), a bias b [4]
 * and a head-shaped bias hb [2,1] (on x), ids [4,3] batch-sharded on x:
 * logits = einsum(reshape(reshape(gather(T, ids) + b, [4,3,2,2]) + hb, [4,3,4]), T). */
static dt_status b_tied(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *ids = NULL, *e = NULL, *h = NULL, *h4 = NULL, *hh = NULL, *h2 = NULL;
    DT_TRY(make_ids(in[0], cur_ids_rank, cur_ids_shape, &ids));
    dt_status s = dt_gather(in[0], ids, NULL, &e);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, e, in[1], NULL, &h);
    if (s == DT_OK)
        s = dt_reshape(h, 4, (int64_t[]){4, 3, 2, 2}, NULL, &h4);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, h4, in[2], NULL, &hh);
    if (s == DT_OK)
        s = dt_reshape(hh, 3, (int64_t[]){4, 3, 4}, NULL, &h2);
    if (s == DT_OK)
        s = dt_einsum("btd,vd->btv", 2, (const dt_tensor *[]){h2, in[0]}, NULL, out);
    dt_tensor *ts[] = {ids, e, h, h4, hh, h2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        dt_tensor_free(ts[i]);
    return s;
}

/* Every parameter row-sharded over the batch axis (fully sharded): the gradients equal the
 * replicated ones and finite differences, and each comes out of its reduction in its shards
 * (a reduce-scatter, or rows added locally): the only all-reduces left are the loss's
 * scalars, none of the table [8,4] (the gather's gradient added into the output projection's)
 * or of the biases (summed over the batch, then reshaped to their shape). */
Test(autodiff, fully_sharded_gradients_reduce_scattered)
{
    cur_ids_mod = 9; /* -1 and 8 fall outside the table */
    cur_ids_rank = 2;
    cur_ids_shape[0] = 4;
    cur_ids_shape[1] = 3;
    cur_ids_layout = "x,unsharded";
    gcase c = {
        "tied", 3,     {2, 1, 2}, {R2(8, 4), {4}, R2(2, 1)}, {"x,unsharded", "x", "x,unsharded"},
        0,      b_tied};
    check_case(&c);
    dt_layout shd[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(dt_layout_parse(mesh, c.sharded[i], &shd[i]), DT_OK);
    dt_function *g = grad_of(&c, shd);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    cr_assert_eq(dt_function_print(g, out), DT_OK);
    fclose(out);
    int reduces = 0, scalars = 0;
    for (const char *q = strstr(text, "all_reduce"); q; q = strstr(q + 1, "all_reduce")) {
        const char *eol = strchr(q, '\n');
        reduces++;
        const char *loc = strstr(q, "local []");
        scalars += loc && (!eol || loc < eol);
    }
    cr_expect_eq(reduces, scalars, "%s", text);
    cr_expect_gt(count(text, "reduce_scatter"), 0, "%s", text);
    free(text);
    dt_function_free(g);
}
