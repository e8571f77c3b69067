/* Repeated kernel steps of a traced gradient computed once (spmd/cse.c). The gradient of
 * mean(sparse_xent(labels, layer_norm(x) * gamma)) recomputes in its backward half the
 * cross-entropy's row statistics and the layer norm's mean and variance; traced as usual each
 * is one step, with DTENSOR_FUSION=0 (no program optimisation) twice, and the two programs give
 * bitwise the same gradients over f32, f64 and bf16, meshes of 1, 4 and 8 devices, rows and
 * classes sharded, even and uneven shards. The normalized x (as large as x) is still computed
 * twice: only small results are kept from the forward half. The logits' gradient alone is
 * checked against (softmax - onehot) / rows computed here in double. */
#include <criterion/criterion.h>

#include "dt.h"
#include "fusion_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* x [R, C] in layout lx (values on a grid of 1/64, exact in every float dtype), labels [R] in
 * [0, C) laid out as x's rows. */
static dt_tensor *make_x(const char *lx, dt_dtype dt, int64_t R, int64_t C)
{
    double *h = malloc(sizeof *h * (size_t)(R * C));
    unsigned seed = 7;
    for (int64_t k = 0; k < R * C; k++) {
        seed = seed * 1103515245u + 12345u;
        h[k] = ((int)((seed >> 16) & 255) - 128) / 64.0;
    }
    dt_layout l = L(lx);
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){R, C}, h,
                                     sizeof *h * (size_t)(R * C), &t64),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, dt, NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    free(h);
    return t;
}

static dt_tensor *make_labels(const char *ll, int64_t R, int64_t C, int32_t *h)
{
    for (int64_t r = 0; r < R; r++)
        h[r] = (int32_t)((r * 5 + 3) % C);
    dt_layout l = L(ll);
    dt_tensor *t = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&l, DT_DTYPE_I32, 1, (int64_t[]){R}, h, sizeof *h * (size_t)R, &t),
        DT_OK, "%s", dt_last_error());
    return t;
}

/* The gradient function of mean(xent(labels, norm ? layer_norm(x) * gamma : x)) with respect
 * to x (and gamma), traced with or without DTENSOR_FUSION=0; its program text in *text. */
static dt_function *grad_fn(const char *lx, const char *ll, dt_dtype dt, int64_t R, int64_t C,
                            bool norm, bool optimise, char **text)
{
    if (optimise)
        unsetenv("DTENSOR_FUSION");
    else
        setenv("DTENSOR_FUSION", "0", 1);
    dt_layout ax = L(lx), al = L(ll), ag = L("unsharded");
    dt_function *f = NULL, *g = NULL;
    dt_tensor *x = NULL, *lab = NULL, *gamma = NULL, *h = NULL, *e = NULL, *loss = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &ax, dt, 2, (int64_t[]){R, C}, &x), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_function_input(f, &al, DT_DTYPE_I32, 1, (int64_t[]){R}, &lab), DT_OK, "%s",
                 dt_last_error());
    if (norm) {
        cr_assert_eq(dt_function_input(f, &ag, dt, 1, (int64_t[]){C}, &gamma), DT_OK, "%s",
                     dt_last_error());
        cr_assert_eq(dt_layer_norm(x, gamma, NULL, 1e-5, NULL, &h), DT_OK, "%s", dt_last_error());
    }
    cr_assert_eq(dt_sparse_softmax_cross_entropy_with_logits(lab, norm ? h : x, NULL, &e), DT_OK,
                 "%s", dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_MEAN, e, 0, NULL, 0, NULL, &loss), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &loss), DT_OK, "%s", dt_last_error());
    int wrt[2] = {0, 2};
    cr_assert_eq(dt_function_gradient(f, 0, norm ? 2 : 1, wrt, &g), DT_OK, "%s", dt_last_error());
    unsetenv("DTENSOR_FUSION");
    dt_tensor *all[] = {x, lab, gamma, h, e, loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dt_tensor_free(all[i]);
    dt_function_free(f);
    *text = program_text(g);
    return g;
}

/* Optimised against DTENSOR_FUSION=0: one statistics pass instead of two, bitwise results.
 * With the class axis sharded the variance reads the mean after its all-reduce, which the
 * backward half repeats: the repeated all-reduce goes too, and the variance runs once (it ran
 * twice while collectives were not deduplicated). Over uneven class shards (`uneven`) the
 * statistics are all-reduced in place in a padded copy, which is not deduplicated: the
 * variance runs twice there. */
static void check(const char *lx, const char *ll, int64_t R, int64_t C, bool uneven)
{
    bool cls_sharded = strstr(lx, ",unsharded") == NULL;
    static const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16};
    for (size_t t = 0; t < sizeof dts / sizeof *dts; t++) {
        dt_dtype dt = dts[t];
        int32_t *hl = malloc(sizeof *hl * (size_t)R);
        dt_tensor *in[3] = {make_x(lx, dt, R, C), make_labels(ll, R, C, hl), NULL};
        dt_tensor *g64 = NULL;
        dt_layout ag = L("unsharded");
        double *hg = malloc(sizeof *hg * (size_t)C);
        for (int64_t c = 0; c < C; c++)
            hg[c] = 0.5 + (double)(c % 5) / 8;
        cr_assert_eq(dt_tensor_from_host(&ag, DT_DTYPE_F64, 1, (int64_t[]){C}, hg,
                                         sizeof *hg * (size_t)C, &g64),
                     DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_cast(g64, dt, NULL, &in[2]), DT_OK, "%s", dt_last_error());
        char *to, *tu;
        dt_function *go = grad_fn(lx, ll, dt, R, C, true, true, &to);
        dt_function *gu = grad_fn(lx, ll, dt, R, C, true, false, &tu);
        const char *what[] = {"xent max, sum of exp, target", "norm mean", "norm variance"};
        for (int w = 0; w < 3; w++) {
            cr_expect_eq(count(tu, what[w]), 2, "%s unoptimised: \"%s\" not twice:\n%s",
                         dt_dtype_name(dt), what[w], tu);
            int once = w == 2 && cls_sharded && uneven ? 2 : 1;
            cr_expect_eq(count(to, what[w]), once, "%s: \"%s\" not %d times:\n%s",
                         dt_dtype_name(dt), what[w], once, to);
        }
        /* the class axis sharded evenly: the statistics' repeated all-reduces go */
        int ao = count(to, "all_reduce"), au = count(tu, "all_reduce");
        cr_expect(cls_sharded && !uneven ? ao < au : ao <= au,
                  "%s: %d all-reduces, unoptimised %d:\n%s", dt_dtype_name(dt), ao, au, to);
        cr_expect_eq(count(to, "norm layer_norm"), count(tu, "norm layer_norm"),
                     "%s: the normalized x (a large result) is not recomputed:\n%s",
                     dt_dtype_name(dt), to);
        dt_tensor *ro[3] = {0}, *ru[3] = {0}; /* the loss, then the gradients */
        cr_assert_eq(dt_function_run(go, 3, (const dt_tensor *const *)in, 3, ro), DT_OK, "%s",
                     dt_last_error());
        cr_assert_eq(dt_function_run(gu, 3, (const dt_tensor *const *)in, 3, ru), DT_OK, "%s",
                     dt_last_error());
        for (int o = 0; o < 3; o++) {
            size_t bo, bu;
            void *ho = read_all(ro[o], &bo), *hu = read_all(ru[o], &bu);
            cr_assert_eq(bo, bu);
            cr_expect(memcmp(ho, hu, bo) == 0, "%s %s result %d: differs from unoptimised:\n%s", lx,
                      dt_dtype_name(dt), o, to);
            free(ho);
            free(hu);
            dt_tensor_free(ro[o]);
            dt_tensor_free(ru[o]);
        }
        dt_function_free(go);
        dt_function_free(gu);
        free(to);
        free(tu);
        for (int i = 0; i < 3; i++)
            dt_tensor_free(in[i]);
        dt_tensor_free(g64);
        free(hg);
        free(hl);
    }
}

Test(cse, one_device)
{
    start(1, "x=1");
    check("unsharded,unsharded", "unsharded", 6, 11, false);
    stop();
}

Test(cse, four_devices)
{
    start(4, "x=4");
    check("x,unsharded", "x", 8, 11, false);
    check("unsharded,x", "unsharded", 6, 12, false);
    stop();
}

Test(cse, eight_devices_uneven)
{
    start(8, "x=2,y=4");
    check("x,y", "x", 5, 13, true);
    check("y,unsharded", "y", 10, 7, false);
    stop();
}

/* The logits' gradient, f64, against (softmax(x) - onehot(label)) / R in double. */
Test(cse, xent_gradient_reference)
{
    start(4, "x=4");
    const int64_t R = 7, C = 9;
    int32_t hl[7];
    dt_tensor *in[2] = {make_x("unsharded,x", DT_DTYPE_F64, R, C),
                        make_labels("unsharded", R, C, hl)};
    char *text;
    dt_function *g = grad_fn("unsharded,x", "unsharded", DT_DTYPE_F64, R, C, false, true, &text);
    cr_expect_eq(count(text, "xent max, sum of exp, target"), 1, "%s", text);
    dt_tensor *r[2] = {0}; /* the loss, the logits' gradient */
    cr_assert_eq(dt_function_run(g, 2, (const dt_tensor *const *)in, 2, r), DT_OK, "%s",
                 dt_last_error());
    size_t bytes;
    double *got = read_all(r[1], &bytes), *x = read_all(in[0], &bytes);
    for (int64_t i = 0; i < R; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++)
            m = fmax(m, x[i * C + c]);
        for (int64_t c = 0; c < C; c++)
            s += exp(x[i * C + c] - m);
        for (int64_t c = 0; c < C; c++) {
            double want = (exp(x[i * C + c] - m) / s - (c == hl[i])) / (double)R;
            cr_expect(fabs(got[i * C + c] - want) <= 1e-13,
                      "row %lld class %lld: %.17g, want %.17g", (long long)i, (long long)c,
                      got[i * C + c], want);
        }
    }
    free(got);
    free(x);
    free(text);
    dt_tensor_free(r[0]);
    dt_tensor_free(r[1]);
    dt_function_free(g);
    dt_tensor_free(in[0]);
    dt_tensor_free(in[1]);
    stop();
}
