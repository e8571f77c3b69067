/* The SPMD engine's contracts: Philox known answers, the DTensor guide's multiply counts and
 * collectives, traced functions with backward propagation, variables, memory accounting, and
 * clear errors. */
#include <criterion/criterion.h>

#include "dt.h"
#include "philox.h"

#include <Random123/philox.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_mesh *mesh;

static void start(int devices, const char *spec)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &mesh), DT_OK, "%s",
                 dt_last_error());
}

static void stop(void)
{
    dt_mesh_free(mesh);
    mesh = NULL;
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

static dt_layout L(const char *text)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(mesh, text, &l), DT_OK, "%s", dt_last_error());
    return l;
}

static dt_tensor *T(const char *layout, int rank, const int64_t shape[], const float *v)
{
    dt_layout l = L(layout);
    dt_tensor *t = NULL;
    size_t n = (size_t)dt__num_elements(rank, shape);
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, rank, shape, v, n * sizeof(float), &t),
                 DT_OK, "%s", dt_last_error());
    return t;
}

Test(philox, known_answers)
{
    /* Random123 known answers (BASELINE.md) */
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    uint32_t out[4];
    dt__philox_rounds(c0, k0, out);
    cr_expect(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
              out[3] == 0x9b00dbd8u);
    const uint32_t c1[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                   k1[2] = {0xa4093822u, 0x299f31d0u};
    dt__philox_rounds(c1, k1, out);
    cr_expect(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u &&
              out[3] == 0x24126ea1u);
    /* and against the Random123 header on a spread of counters and keys */
    uint32_t x = 12345;
    for (int i = 0; i < 1000; i++) {
        uint32_t c[4], k[2];
        for (int j = 0; j < 4; j++)
            c[j] = x = x * 1664525u + 1013904223u;
        k[0] = x = x * 1664525u + 1013904223u;
        k[1] = x = x * 1664525u + 1013904223u;
        philox4x32_ctr_t rc = {{c[0], c[1], c[2], c[3]}};
        philox4x32_key_t rk = {{k[0], k[1]}};
        philox4x32_ctr_t r = philox4x32(rc, rk);
        dt__philox_rounds(c, k, out);
        cr_assert(memcmp(out, r.v, sizeof out) == 0, "counter %d differs", i);
    }
}

/* The shared conversions (common/philox.h) compute Box-Muller's logarithm and cosine from
 * correctly rounded operations only, so the CPU and CUDA kernels agree bitwise; against
 * glibc's log and cos on the same Philox words they must agree to a few ulps. */
Test(philox, normal_conversion_against_libm)
{
    double worst = 0;
    for (uint64_t e = 0; e < 200000; e++) {
        for (int f64 = 0; f64 < 2; f64++) {
            uint32_t w[4];
            double a, b;
            if (f64) {
                dt__philox_block(7, 3, e, w);
                a = dt__u53(w[0], w[1]);
                b = dt__u53(w[2], w[3]);
            } else {
                dt__philox_block(7, 3, e / 2, w);
                a = dt__u24(w[2 * (e % 2)]);
                b = dt__u24(w[2 * (e % 2) + 1]);
            }
            double want = sqrt(-2.0 * log(1.0 - a)) * cos(2.0 * M_PI * b);
            double got = dt__random_value(true, f64, 7, 3, e);
            double err = fabs(got - want) / fmax(fabs(want), 1.0);
            worst = err > worst ? err : worst;
        }
    }
    cr_expect(worst < 1e-14, "worst relative difference from libm %.3g", worst);
    /* extremes: u = 0 gives log(1) = 0; the smallest 1 - u is 2^-53 */
    cr_expect_eq(dt__log01(1.0), 0.0);
    cr_expect(fabs(dt__log01(0x1p-53) - log(0x1p-53)) < 1e-14 * 37);
    cr_expect(fabs(dt__cos2pi01(0.25)) < 1e-16 && dt__cos2pi01(0.5) == -1.0 &&
              dt__cos2pi01(0.0) == 1.0);
}

/* The guide's example: 2x3 @ 3x2 on a 3x2 mesh, traced so the program can be inspected. */
static void guide_case(const char *la, const char *lb, double mults, int colls, const char *must,
                       const char *must_not)
{
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {6, 5, 4, 3, 2, 1};
    const int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
    dt_layout lay = L(la), lby = L(lb);
    dt_function *f;
    dt_tensor *xa, *xb, *xc;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lay, DT_DTYPE_F32, 2, sa, &xa), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_function_input(f, &lby, DT_DTYPE_F32, 2, sb, &xb), DT_OK);
    cr_assert_eq(dt_matmul(xa, xb, NULL, &xc), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &xc), DT_OK, "%s", dt_last_error());
    double m, bytes;
    int c;
    cr_assert_eq(dt_function_cost(f, &m, &c, &bytes), DT_OK);
    cr_expect_eq(m, mults, "%s @ %s: %.0f multiplies, expected %.0f", la, lb, m, mults);
    cr_expect_eq(c, colls, "%s @ %s: %d collectives, expected %d", la, lb, c, colls);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    cr_assert_eq(dt_function_print(f, mem), DT_OK);
    fclose(mem);
    char want[64];
    snprintf(want, sizeof want, "total: %.0f multiplies on 6 devices", mults);
    cr_expect(strstr(text, want), "program lacks \"%s\":\n%s", want, text);
    if (must)
        cr_expect(strstr(text, must), "program lacks \"%s\":\n%s", must, text);
    if (must_not)
        cr_expect(!strstr(text, must_not), "program has \"%s\":\n%s", must_not, text);
    free(text);
    /* run it twice on real operands */
    dt_tensor *ta = T(la, 2, sa, a), *tb = T(lb, 2, sb, b);
    const dt_tensor *ins[2] = {ta, tb};
    for (int r = 0; r < 2; r++) {
        dt_tensor *res;
        cr_assert_eq(dt_function_run(f, 2, ins, 1, &res), DT_OK, "%s", dt_last_error());
        float got[4];
        cr_assert_eq(dt_tensor_read(res, got, sizeof got), DT_OK);
        cr_expect(got[0] == 20 && got[1] == 14 && got[2] == 56 && got[3] == 41);
        dt_tensor_free(res);
    }
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(xa);
    dt_tensor_free(xb);
    dt_tensor_free(xc);
    dt_function_free(f);
}

Test(program, guide_multiply_counts)
{
    start(6, "x=3,y=2");
    guide_case("unsharded,unsharded", "unsharded,unsharded", 72, 0, "12 multiplies per device",
               "all_reduce");
    guide_case("unsharded,x", "x,unsharded", 24, 1, "all_reduce sum over {x}", "all_gather");
    guide_case("y,x", "x,unsharded", 12, 1, "all_reduce sum over {x}", "all_gather");
    stop();
}

Test(program, eager_print_and_partial_result)
{
    start(6, "x=3,y=2");
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {6, 5, 4, 3, 2, 1};
    const int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
    dt_tensor *ta = T("unsharded,x", 2, sa, a), *tb = T("x,unsharded", 2, sb, b), *c;
    /* a partial result requested through the public API: no collective at all */
    dt_layout lp = L("unsharded,unsharded;partial_sum=x");
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_op_options o = {.layout = &lp, .program = mem};
    cr_assert_eq(dt_matmul(ta, tb, &o, &c), DT_OK, "%s", dt_last_error());
    fclose(mem);
    cr_expect(strstr(text, "0 collectives"), "%s", text);
    cr_expect(dt_layout_equal(dt_tensor_layout(c), &lp));
    float got[4];
    cr_assert_eq(dt_tensor_read(c, got, sizeof got), DT_OK);
    cr_expect(got[0] == 20 && got[1] == 14 && got[2] == 56 && got[3] == 41);
    free(text);
    /* requested sharded on x: reduce-scatter instead of all-reduce */
    dt_tensor *c2;
    dt_layout ls = L("unsharded,unsharded");
    ls.axes[0] = 0; /* rows on x */
    text = NULL;
    mem = open_memstream(&text, &len);
    o = (dt_op_options){.layout = &ls, .program = mem};
    cr_assert_eq(dt_matmul(ta, tb, &o, &c2), DT_OK, "%s", dt_last_error());
    fclose(mem);
    cr_expect(strstr(text, "reduce_scatter sum over {x}") && !strstr(text, "all_reduce"), "%s",
              text);
    cr_assert_eq(dt_tensor_read(c2, got, sizeof got), DT_OK);
    cr_expect(got[0] == 20 && got[1] == 14 && got[2] == 56 && got[3] == 41);
    free(text);
    dt_tensor_free(c);
    dt_tensor_free(c2);
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    stop();
}

/* A partial sum whose rows sit on a mesh axis of size 1 (whole on every device) reduce-scatters
 * into rows sharded on the partial axis, as an unsharded one does, instead of an all-reduce and
 * a slice: the fully sharded preset's position-embedding gradient, its sequence axis on the
 * size-1 "model" axis. Even (2 rows) and uneven (3 rows over 2), against a loop by hand. */
Test(program, size_one_axis_takes_a_reduce_scatter)
{
    start(2, "x=2,y=1");
    for (int64_t rows = 2; rows <= 3; rows++) {
        const float a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[6] = {6, 5, 4, 3, 2, 1};
        const int64_t sa[2] = {rows, 3}, sb[2] = {3, 2};
        dt_tensor *ta = T("y,x", 2, sa, a), *tb = T("x,unsharded", 2, sb, b), *p, *c;
        dt_layout lp = L("y,unsharded;partial_sum=x"), lr = L("x,unsharded");
        cr_assert_eq(dt_matmul(ta, tb, &(dt_op_options){.layout = &lp}, &p), DT_OK, "%s",
                     dt_last_error());
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        cr_assert_eq(dt_relayout(p, &lr, &(dt_op_options){.program = mem}, &c), DT_OK, "%s",
                     dt_last_error());
        fclose(mem);
        cr_expect(strstr(text, "reduce_scatter sum over {x}") && !strstr(text, "all_reduce"), "%s",
                  text);
        cr_expect(dt_layout_equal(dt_tensor_layout(c), &lr));
        float got[6];
        cr_assert_eq(dt_tensor_read(c, got, sizeof(float) * 2 * (size_t)rows), DT_OK);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < 2; j++) {
                float want = 0;
                for (int k = 0; k < 3; k++)
                    want += a[i * 3 + k] * b[k * 2 + j];
                cr_expect_eq(got[i * 2 + j], want, "rows %d: [%d,%d] = %g, not %g", (int)rows, i, j,
                             got[i * 2 + j], want);
            }
        free(text);
        dt_tensor_free(c);
        dt_tensor_free(p);
        dt_tensor_free(ta);
        dt_tensor_free(tb);
    }
    stop();
}

Test(function, backward_propagation_fuses_reduce_scatter)
{
    start(4, "x=4");
    /* large enough that the reduce-scatter, chunked into 4 collectives (spmd/ops/matmul.c),
     * beats an all-to-all of A and an all-gather of B in the cost model */
    enum { n = 256 };
    const int64_t sa[2] = {n, n};
    static float a[n * n], b[n * n], got[n * n];
    for (int i = 0; i < n * n; i++) {
        a[i] = (float)(i % 5);
        b[i] = (float)(i % 3);
    }
    dt_layout la = L("unsharded,x"), lb = L("x,unsharded"), lr = L("x,unsharded");
    dt_function *f;
    dt_tensor *xa, *xb, *xc, *xd, *xe;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &la, DT_DTYPE_F32, 2, sa, &xa), DT_OK);
    cr_assert_eq(dt_function_input(f, &lb, DT_DTYPE_F32, 2, sa, &xb), DT_OK);
    cr_assert_eq(dt_matmul(xa, xb, NULL, &xc), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_unary(DT_UNARY_RELU, xc, NULL, &xd), DT_OK);
    cr_assert_eq(dt_relayout(xd, &lr, NULL, &xe), DT_OK, "%s", dt_last_error());
    /* a concrete tensor cannot be captured */
    dt_tensor *conc = T("x,unsharded", 2, sa, a), *bad = NULL;
    cr_expect_eq(dt_binary(DT_BINARY_ADD, xe, conc, NULL, &bad), DT_ERR_ARG);
    cr_assert_eq(dt_function_end(f, 1, &xe), DT_OK, "%s", dt_last_error());
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_function_print(f, mem);
    fclose(mem);
    cr_expect(strstr(text, "reduce_scatter") && !strstr(text, "all_reduce") &&
                  !strstr(text, "all_gather"),
              "the relayout's request should reach the matmul:\n%s", text);
    free(text);
    dt_tensor *ta = T("unsharded,x", 2, sa, a), *tb = T("x,unsharded", 2, sa, b), *res;
    const dt_tensor *ins[2] = {ta, tb};
    cr_assert_eq(dt_function_run(f, 2, ins, 1, &res), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(res, got, sizeof got), DT_OK);
    int bad_at = -1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float s = 0; /* integers below 2^24: exact in any order */
            for (int k = 0; k < n; k++)
                s += a[i * n + k] * b[k * n + j];
            if (bad_at < 0 && got[i * n + j] != (s > 0 ? s : 0))
                bad_at = i * n + j;
        }
    cr_expect_eq(bad_at, -1, "first wrong element %d", bad_at);
    cr_expect(dt_layout_equal(dt_tensor_layout(res), &lr));
    /* a wrongly laid out input is refused before anything runs */
    dt_tensor *wrong = T("x,unsharded", 2, sa, a), *r2 = NULL;
    const dt_tensor *ins2[2] = {wrong, tb};
    cr_expect_eq(dt_function_run(f, 2, ins2, 1, &r2), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "\"unsharded,x\""), "%s", dt_last_error());
    dt_tensor_free(wrong);
    dt_tensor_free(res);
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(conc);
    dt_tensor_free(xa);
    dt_tensor_free(xb);
    dt_tensor_free(xc);
    dt_tensor_free(xd);
    dt_tensor_free(xe);
    dt_function_free(f);
    stop();
}

/* A tensor returned while a function is traced has no values: every call that would read
 * them fails with DT_ERR_STATE and says so, instead of handing back zeros. */
static void expect_symbolic_error(dt_status s, const char *fn)
{
    cr_expect_eq(s, DT_ERR_STATE, "%s on a symbolic tensor returned %s", fn, dt_status_name(s));
    cr_expect(strstr(dt_last_error(), fn) && strstr(dt_last_error(), "symbolic") &&
                  strstr(dt_last_error(), "run the function"),
              "%s: %s", fn, dt_last_error());
}

Test(function, symbolic_tensors_have_no_values)
{
    start(2, "x=2");
    const int64_t s[2] = {4, 2};
    dt_layout l = L("x,unsharded");
    dt_function *f;
    dt_tensor *xa, *xb;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, DT_DTYPE_F32, 2, s, &xa), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_unary(DT_UNARY_NEG, xa, NULL, &xb), DT_OK, "%s", dt_last_error());
    for (int end = 0; end < 2; end++) { /* while recording, and after the trace has ended */
        float got[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        int64_t ls[2] = {-1, -1};
        dt_variable *v = NULL;
        expect_symbolic_error(dt_tensor_read(xb, got, sizeof got), "dt_tensor_read");
        expect_symbolic_error(dt_tensor_unpack(xb, 0, got, sizeof got), "dt_tensor_unpack");
        expect_symbolic_error(dt_tensor_local_shape(xb, 0, ls), "dt_tensor_local_shape");
        expect_symbolic_error(dt_variable_create(xa, &v), "dt_variable_create");
        cr_expect_null(v);
        cr_expect_eq(got[0], 1.0f, "nothing was written");
        /* metadata is known */
        cr_expect(dt_tensor_is_symbolic(xa) && dt_tensor_is_symbolic(xb));
        cr_expect_eq(dt_tensor_rank(xb), 2);
        cr_expect_eq(dt_tensor_num_elements(xb), 8);
        if (!end)
            cr_assert_eq(dt_function_end(f, 1, &xb), DT_OK, "%s", dt_last_error());
    }
    /* a symbolic tensor cannot feed a run, nor a variable */
    dt_tensor *res = NULL, *conc = NULL;
    const dt_tensor *ins[1] = {xa};
    cr_expect_eq(dt_function_run(f, 1, ins, 1, &res), DT_ERR_STATE);
    cr_expect(strstr(dt_last_error(), "symbolic"), "%s", dt_last_error());
    cr_assert_eq(dt_zeros(DT_DTYPE_F32, 2, s, &(dt_op_options){.layout = &l}, &conc), DT_OK);
    cr_expect(!dt_tensor_is_symbolic(conc) && !dt_tensor_is_symbolic(NULL));
    dt_variable *v;
    cr_assert_eq(dt_variable_create(conc, &v), DT_OK, "%s", dt_last_error());
    expect_symbolic_error(dt_variable_assign(v, xb), "dt_variable_assign");
    dt_variable_free(v);
    dt_tensor_free(conc);
    dt_tensor_free(xa);
    dt_tensor_free(xb);
    dt_function_free(f);
    stop();
}

/* The eager program cache holds nothing of a destroyed mesh: a mesh made later (perhaps at the
 * same address) gets programs built for it, and dt_finalize frees the rest. */
Test(program, cache_follows_meshes)
{
    start(2, "x=2");
    const int64_t s[1] = {6};
    dt_layout l = L("x");
    dt_tensor *t;
    int before = dt__program_cache_count();
    cr_assert_eq(dt_ones(DT_DTYPE_F32, 1, s, &(dt_op_options){.layout = &l}, &t), DT_OK);
    dt_tensor_free(t);
    int with_x = dt__program_cache_count();
    cr_expect_eq(with_x, before + 1);
    for (int round = 0; round < 3; round++) {
        dt_mesh *other;
        cr_assert_eq(dt_mesh_create_from_string("y=2", DT_DEVICE_CPU, &other), DT_OK);
        dt_layout lo;
        cr_assert_eq(dt_layout_parse(other, "y", &lo), DT_OK);
        cr_assert_eq(dt_fill(DT_DTYPE_F32, 1, s, 2.0 + round, &(dt_op_options){.layout = &lo}, &t),
                     DT_OK, "%s", dt_last_error());
        float got[6];
        cr_assert_eq(dt_tensor_read(t, got, sizeof got), DT_OK, "%s", dt_last_error());
        cr_expect_eq(got[5], 2.0f + (float)round);
        cr_expect_eq(dt__program_cache_count(), with_x + 1);
        dt_tensor_free(t);
        dt_mesh_free(other);
        cr_expect_eq(dt__program_cache_count(), with_x, "round %d: a freed mesh's program stays",
                     round);
    }
    stop();
    cr_expect_eq(dt__program_cache_count(), 0, "dt_finalize leaves cached programs");
}

Test(variable, fixed_layout)
{
    start(2, "x=2");
    const int64_t s[2] = {4, 3};
    float ones[12], twos[12];
    for (int i = 0; i < 12; i++) {
        ones[i] = 1;
        twos[i] = 2;
    }
    dt_tensor *init = T("x,unsharded", 2, s, ones), *rep = T("unsharded,unsharded", 2, s, twos);
    dt_variable *v;
    cr_assert_eq(dt_variable_create(init, &v), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_variable_assign(v, rep), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"x,unsharded\"") &&
                  strstr(dt_last_error(), "\"unsharded,unsharded\""),
              "%s", dt_last_error());
    cr_expect_eq(dt_variable_assign_add(v, rep), DT_ERR_LAYOUT);
    dt_layout lv = L("x,unsharded");
    dt_tensor *moved;
    cr_assert_eq(dt_relayout(rep, &lv, NULL, &moved), DT_OK);
    cr_assert_eq(dt_variable_assign_add(v, moved), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_variable_assign_add(v, moved), DT_OK);
    cr_assert_eq(dt_variable_assign_sub(v, init), DT_OK);
    float got[12];
    cr_assert_eq(dt_tensor_read(dt_variable_value(v), got, sizeof got), DT_OK);
    for (int i = 0; i < 12; i++)
        cr_expect_eq(got[i], 4.0f); /* 1 + 2 + 2 - 1 */
    cr_expect(dt_layout_equal(dt_variable_layout(v), &lv));
    cr_assert_eq(dt_variable_assign(v, init), DT_OK);
    cr_assert_eq(dt_tensor_read(dt_variable_value(v), got, sizeof got), DT_OK);
    cr_expect_eq(got[5], 1.0f);
    const int64_t s2[2] = {3, 4};
    dt_tensor *other = T("x,unsharded", 2, s2, ones);
    cr_expect_eq(dt_variable_assign(v, other), DT_ERR_SHAPE);
    cr_expect(strstr(dt_last_error(), "[4,3]") && strstr(dt_last_error(), "[3,4]"));
    dt_variable_free(v);
    dt_tensor_free(init);
    dt_tensor_free(rep);
    dt_tensor_free(moved);
    dt_tensor_free(other);
    stop();
}

/* Inside one client, all-to-all and the all-gather of an inner axis move each block straight
 * from the operand's shard to the result's (one step, no packing on either side); the values
 * are the host array's, uneven shards included, and each device allocates only its result. */
Test(relayout, in_client_exchanges_move_shards_in_place)
{
    start(4, "x=4");
    static const char *const pairs[][2] = {{"x,unsharded", "unsharded,x"},
                                           {"unsharded,x", "x,unsharded"},
                                           {"unsharded,x", "unsharded,unsharded"}};
    const int64_t shape[2] = {7, 5}; /* 7 rows over 4: 2, 2, 2, 1; 5 columns: 2, 1, 1, 1 */
    float host[35], got[35];
    for (int i = 0; i < 35; i++)
        host[i] = (float)i;
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        dt_tensor *t = T(pairs[k][0], 2, shape, host), *r = NULL;
        dt_layout to = L(pairs[k][1]);
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        size_t peak[4], before_bytes[4];
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &before_bytes[i], NULL), DT_OK);
            atomic_store(&dt__rt.devices[DT_DEVICE_CPU][i].bytes_peak, before_bytes[i]);
        }
        cr_assert_eq(dt_relayout(t, &to, &(dt_op_options){.program = mem}, &r), DT_OK, "%s",
                     dt_last_error());
        fclose(mem);
        cr_expect(strstr(text, ": 1 step") && strstr(text, "no packing") && !strstr(text, "kernel"),
                  "%s -> %s:\n%s", pairs[k][0], pairs[k][1], text);
        free(text);
        for (int i = 0; i < 4; i++) {
            int64_t local[2];
            cr_assert_eq(dt_tensor_local_shape(r, i, local), DT_OK);
            cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, NULL, &peak[i]), DT_OK);
            cr_expect_leq(peak[i] - before_bytes[i], (size_t)(local[0] * local[1]) * sizeof(float),
                          "%s -> %s: device %d allocated %zu bytes beyond its result", pairs[k][0],
                          pairs[k][1], i, peak[i] - before_bytes[i]);
        }
        cr_assert_eq(dt_tensor_read(r, got, sizeof got), DT_OK);
        cr_expect_arr_eq(got, host, sizeof host, "%s -> %s", pairs[k][0], pairs[k][1]);
        dt_tensor_free(t);
        dt_tensor_free(r);
    }
    stop();
}

/* No device allocates a full global tensor for sharded ops that do not need one: for each op,
 * the device's peak minus what it held before stays below the size of the global tensor. */
static size_t held[8];

static void before(void)
{
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &held[i], NULL), DT_OK);
        /* the peak since dt_init would count earlier ops: restart it here */
        atomic_store(&dt__rt.devices[DT_DEVICE_CPU][i].bytes_peak, held[i]);
    }
}

static void after(const char *what, size_t global)
{
    for (int i = 0; i < 4; i++) {
        size_t peak;
        cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, NULL, &peak), DT_OK);
        cr_expect_lt(peak - held[i], global,
                     "%s: device %d allocated up to %zu bytes, the global "
                     "tensor has %zu",
                     what, i, peak - held[i], global);
    }
}

Test(memory, sharded_ops_stay_sharded)
{
    start(4, "x=4");
    const int64_t n = 512;
    const int64_t sa[2] = {n, n};
    size_t global = (size_t)(n * n) * sizeof(float);
    dt_layout rows = L("x,unsharded"), cols = L("unsharded,x"), rep = L("unsharded,unsharded");
    dt_op_options orow = {.layout = &rows}, orep = {.layout = &rep};
    dt_tensor *a, *b, *w, *r;
    before();
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 1, 0, 1, &orow, &a), DT_OK);
    after("random", global);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 2, 0, 1, &orow, &b), DT_OK);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 3, 0, 1, &orep, &w), DT_OK);
    before();
    cr_assert_eq(dt_relayout(b, &cols, NULL, &r), DT_OK); /* all-to-all */
    after("relayout x,unsharded -> unsharded,x", global);
    dt_tensor_free(r);
    before();
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, b, NULL, &r), DT_OK);
    after("mul", global);
    dt_tensor_free(r);
    before();
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, a, 0, NULL, 0, NULL, &r), DT_OK);
    after("sum", global);
    dt_tensor_free(r);
    before();
    cr_assert_eq(dt_matmul(a, w, NULL, &r), DT_OK, "%s", dt_last_error()); /* rows stay on x */
    after("matmul", global);
    cr_expect(dt_layout_equal(dt_tensor_layout(r), &rows));
    dt_tensor_free(r);
    before();
    cr_assert_eq(dt_unary(DT_UNARY_EXP, b, &(dt_op_options){.layout = &cols}, &r), DT_OK);
    after("exp into another layout", global);
    dt_tensor_free(r);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(w);
    stop();
}

/* Redistributions move blocks, never a whole tensor: copy_to_mesh to another mesh over the
 * same devices, and slice and concat along a sharded axis, keep every device's peak below the
 * size of the global tensor (a gather of the axis or a replicated copy would reach it). */
Test(memory, redistribution_stays_sharded)
{
    start(4, "x=4");
    const int64_t n = 512;
    const int64_t sa[2] = {n, n};
    size_t global = (size_t)(n * n) * sizeof(float);
    dt_layout rows = L("x,unsharded"), cols = L("unsharded,x");
    dt_op_options orow = {.layout = &rows};
    dt_tensor *a, *b, *r;
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 1, 0, 1, &orow, &a), DT_OK);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 2, 0, 1, &orow, &b), DT_OK);
    float *ha = malloc(global), *hb = malloc(global), *got = malloc(2 * global);
    cr_assert_eq(dt_tensor_read(a, ha, global), DT_OK);
    cr_assert_eq(dt_tensor_read(b, hb, global), DT_OK);

    dt_mesh *other, *line;
    cr_assert_eq(dt_mesh_create_from_string("p=2,q=2", DT_DEVICE_CPU, &other), DT_OK);
    cr_assert_eq(dt_mesh_create_from_string("z=4", DT_DEVICE_CPU, &line), DT_OK);
    const char *targets[3] = {"q,p", "p,q", "unsharded,z"};
    for (int k = 0; k < 3; k++) {
        dt_layout lt;
        cr_assert_eq(dt_layout_parse(k < 2 ? other : line, targets[k], &lt), DT_OK);
        before();
        cr_assert_eq(dt_copy_to_mesh(a, &lt, NULL, &r), DT_OK, "%s", dt_last_error());
        after(targets[k], global);
        cr_assert_eq(dt_tensor_read(r, got, global), DT_OK);
        cr_expect(memcmp(got, ha, global) == 0, "copy_to_mesh to \"%s\" changed values",
                  targets[k]);
        dt_tensor_free(r);
    }
    /* the cut axis is the sharded one */
    const int64_t begin[2] = {3, 0}, size[2] = {n - 5, n};
    before();
    cr_assert_eq(dt_slice(a, begin, size, NULL, &r), DT_OK, "%s", dt_last_error());
    after("slice of rows sharded on x", global);
    cr_expect(dt_layout_equal(dt_tensor_layout(r), &rows));
    cr_assert_eq(dt_tensor_read(r, got, (size_t)((n - 5) * n) * sizeof(float)), DT_OK);
    cr_expect(memcmp(got, ha + 3 * n, (size_t)((n - 5) * n) * sizeof(float)) == 0);
    dt_tensor_free(r);
    /* joined along the sharded axis, operands in two layouts */
    dt_tensor *bc;
    cr_assert_eq(dt_relayout(b, &cols, NULL, &bc), DT_OK);
    const dt_tensor *xs[2] = {a, bc};
    before();
    cr_assert_eq(dt_concat(2, xs, 0, NULL, &r), DT_OK, "%s", dt_last_error());
    after("concat along rows sharded on x", 2 * global);
    cr_expect(dt_layout_equal(dt_tensor_layout(r), &rows));
    cr_assert_eq(dt_tensor_read(r, got, 2 * global), DT_OK);
    cr_expect(memcmp(got, ha, global) == 0 && memcmp(got + n * n, hb, global) == 0);
    dt_tensor_free(r);
    free(ha);
    free(hb);
    free(got);
    dt_tensor_free(bc);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_mesh_free(other);
    dt_mesh_free(line);
    stop();
}

Test(errors, clear_messages)
{
    start(2, "x=2");
    const int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    float v[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *a = T("x,unsharded", 2, s23, v), *b = T("unsharded,unsharded", 2, s23, v);
    dt_tensor *c = (dt_tensor *)1;
    cr_expect_eq(dt_matmul(a, b, NULL, &c), DT_ERR_SHAPE);
    cr_expect_null(c);
    cr_expect(strstr(dt_last_error(), "[2,3]") && strstr(dt_last_error(), "3 and 2"), "%s",
              dt_last_error());
    dt_layout l64 = L("x,unsharded");
    double dv[6] = {0};
    dt_tensor *d64;
    cr_assert_eq(dt_tensor_from_host(&l64, DT_DTYPE_F64, 2, s32, dv, sizeof dv, &d64), DT_OK);
    cr_expect_eq(dt_matmul(a, d64, NULL, &c), DT_ERR_DTYPE);
    cr_expect(strstr(dt_last_error(), "f32") && strstr(dt_last_error(), "f64"));
    /* concat of two dtypes: a dtype error naming both, not a shape error */
    dt_tensor *d23;
    cr_assert_eq(dt_tensor_from_host(&l64, DT_DTYPE_F64, 2, s23, dv, sizeof dv, &d23), DT_OK);
    cr_expect_eq(dt_concat(2, (const dt_tensor *[]){a, d23}, 0, NULL, &c), DT_ERR_DTYPE);
    cr_expect(strstr(dt_last_error(), "f32[2,3]") && strstr(dt_last_error(), "f64[2,3]"), "%s",
              dt_last_error());
    dt_tensor_free(d23);
    /* a layout on another mesh */
    dt_mesh *other;
    cr_assert_eq(dt_mesh_create_from_string("y=2", DT_DEVICE_CPU, &other), DT_OK);
    dt_layout lo;
    dt_layout_parse(other, "y,unsharded", &lo);
    dt_op_options oo = {.layout = &lo};
    cr_expect_eq(dt_unary(DT_UNARY_NEG, a, &oo, &c), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "y=2") && strstr(dt_last_error(), "x=2"), "%s",
              dt_last_error());
    /* ...but copy_to_mesh goes there */
    cr_assert_eq(dt_copy_to_mesh(a, &lo, NULL, &c), DT_OK, "%s", dt_last_error());
    float got[6];
    cr_assert_eq(dt_tensor_read(c, got, sizeof got), DT_OK);
    cr_expect(got[0] == 1 && got[5] == 6);
    dt_tensor_free(c);
    /* an axis that does not exist */
    int ax = 2;
    cr_expect_eq(dt_reduce(DT_REDUCE_SUM, a, 1, &ax, 0, NULL, &c), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "axis 2") && strstr(dt_last_error(), "rank 2"));
    /* an inexpressible reshape: [2,3] sharded on rows over x=2 ... to [3,2] */
    dt_tensor *r = T("unsharded,x", 2, s23, v);
    cr_expect_eq(dt_reshape(r, 2, s32, NULL, &c), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "mesh axis \"x\"") && strstr(dt_last_error(), "[3,2]"), "%s",
              dt_last_error());
    /* creation without a layout names what is missing */
    cr_expect_eq(dt_ones(DT_DTYPE_F32, 2, s23, NULL, &c), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "opts->layout"));
    /* random numbers are floating point only */
    dt_layout lr = L("x,unsharded");
    dt_op_options orr = {.layout = &lr};
    cr_expect_eq(dt_random_uniform(DT_DTYPE_I32, 2, s23, 1, 1, 0, 1, &orr, &c), DT_ERR_DTYPE);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(r);
    dt_tensor_free(d64);
    dt_mesh_free(other);
    stop();
}

/* Integer arithmetic wraps modulo 2^32 (numpy's semantics) instead of overflowing, on every
 * path: elementwise kernels, local and cross-device sums (a contracting-sharded matmul's
 * all-reduce), INT32_MIN / -1. Expected values: modular arithmetic done here in uint32_t. */
static int32_t wrap32(uint32_t v)
{
    int32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

Test(ops, integer_arithmetic_wraps)
{
    start(2, "x=2");
    const int32_t big[4] = {INT32_MAX, INT32_MIN, INT32_MAX, -7};
    const int32_t minus_one[4] = {1, -1, INT32_MAX, 2};
    const int64_t shape[2] = {2, 2};
    dt_layout rows = L("x,unsharded"), cols = L("unsharded,x");
    dt_tensor *a = NULL, *b = NULL, *out = NULL;
    cr_assert_eq(dt_tensor_from_host(&rows, DT_DTYPE_I32, 2, shape, big, sizeof big, &a), DT_OK);
    cr_assert_eq(
        dt_tensor_from_host(&rows, DT_DTYPE_I32, 2, shape, minus_one, sizeof minus_one, &b), DT_OK);
    int32_t got[4];
    const struct {
        dt_binary_op op;
        int32_t want[4];
    } cases[] = {
        {DT_BINARY_ADD,
         {wrap32((uint32_t)INT32_MAX + 1u), wrap32((uint32_t)INT32_MIN + (uint32_t)-1),
          wrap32((uint32_t)INT32_MAX * 2u), -5}},
        {DT_BINARY_MUL,
         {INT32_MAX, wrap32((uint32_t)INT32_MIN * (uint32_t)-1),
          wrap32((uint32_t)INT32_MAX * (uint32_t)INT32_MAX), -14}},
        {DT_BINARY_DIV, {INT32_MAX, INT32_MIN /* INT32_MIN / -1 wraps */, 1, -3}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(dt_binary(cases[i].op, a, b, NULL, &out), DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_tensor_read(out, got, sizeof got), DT_OK);
        for (int k = 0; k < 4; k++)
            cr_expect_eq(got[k], cases[i].want[k], "%s element %d: %d, expected %d",
                         dt_binary_op_name(cases[i].op), k, got[k], cases[i].want[k]);
        dt_tensor_free(out);
    }
    cr_assert_eq(dt_unary(DT_UNARY_NEG, a, NULL, &out), DT_OK);
    cr_assert_eq(dt_tensor_read(out, got, sizeof got), DT_OK);
    cr_expect_eq(got[1], INT32_MIN, "-INT32_MIN wraps to itself");
    dt_tensor_free(out);
    /* sum over rows sharded on x: a local sum, then an all-reduce of partial sums */
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, a, 0, NULL, 0, NULL, &out), DT_OK, "%s", dt_last_error());
    int32_t total;
    cr_assert_eq(dt_tensor_read(out, &total, sizeof total), DT_OK);
    uint32_t want = 0;
    for (int k = 0; k < 4; k++)
        want += (uint32_t)big[k];
    cr_expect_eq(total, wrap32(want), "sum %d, expected %d", total, wrap32(want));
    dt_tensor_free(out);
    /* matmul contracting over x: partial products all-reduced across the two devices */
    dt_tensor *ac = NULL;
    cr_assert_eq(dt_tensor_from_host(&cols, DT_DTYPE_I32, 2, shape, big, sizeof big, &ac), DT_OK);
    cr_assert_eq(dt_matmul(ac, b, NULL, &out), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(out, got, sizeof got), DT_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            uint32_t s = 0;
            for (int q = 0; q < 2; q++)
                s += (uint32_t)big[i * 2 + q] * (uint32_t)minus_one[q * 2 + j];
            cr_expect_eq(got[i * 2 + j], wrap32(s), "c[%d][%d] = %d, expected %d", i, j,
                         got[i * 2 + j], wrap32(s));
        }
    dt_tensor_free(out);
    dt_tensor_free(ac);
    dt_tensor_free(a);
    dt_tensor_free(b);
    stop();
}

/* max and min let a NaN win, as numpy's max, min, maximum and minimum do (a NaN was skipped:
 * max([0, NaN, 2, 3]) was 3, an all-NaN row -inf), on one device and across devices (the
 * partial maxima combined by an all-reduce), in f32 and f64; argmax and argmin name the first
 * NaN, so both agree. Expected values: numpy's rule applied by hand. */
Test(ops, max_and_min_let_nan_win)
{
    start(4, "x=4");
    const float nan = NAN;
    /* [4, 8]: a NaN in the first shard, every NaN, none, a NaN in the last shard */
    const float v[32] = {0, nan, 2, 3,  4, 5, 6, 7, nan, nan, nan, nan, nan, nan, nan, nan,
                         5, 1,   9, -3, 8, 2, 7, 0, 1,   2,   3,   4,   5,   6,   7,   nan};
    const int64_t shape[2] = {4, 8};
    const bool want_nan[4] = {true, true, false, true};
    const float want_max[4] = {0, 0, 9, 0}, want_min[4] = {0, 0, -3, 0};
    const int64_t want_argmax[4] = {1, 0, 2, 7}, want_argmin[4] = {1, 0, 3, 7};
    const char *layouts[3] = {"unsharded,x", "unsharded,unsharded", "x,unsharded"};
    for (int li = 0; li < 3; li++)
        for (int f64 = 0; f64 < 2; f64++) {
            dt_tensor *x32 = T(layouts[li], 2, shape, v), *x = x32;
            if (f64)
                cr_assert_eq(dt_cast(x32, DT_DTYPE_F64, NULL, &x), DT_OK);
            for (int op = 0; op < 2; op++) {
                dt_reduce_op rop = op ? DT_REDUCE_MIN : DT_REDUCE_MAX;
                dt_tensor *r = NULL, *r32 = NULL, *a = NULL;
                cr_assert_eq(dt_reduce(rop, x, 1, (int[]){1}, 0, NULL, &r), DT_OK, "%s",
                             dt_last_error());
                cr_assert_eq(dt_cast(r, DT_DTYPE_F32, NULL, &r32), DT_OK);
                float got[4];
                cr_assert_eq(dt_tensor_read(r32, got, sizeof got), DT_OK);
                cr_assert_eq((op ? dt_argmin : dt_argmax)(x, 1, DT_DTYPE_I64, NULL, &a), DT_OK,
                             "%s", dt_last_error());
                int64_t at[4];
                cr_assert_eq(dt_tensor_read(a, at, sizeof at), DT_OK);
                for (int i = 0; i < 4; i++) {
                    float want = op ? want_min[i] : want_max[i];
                    cr_expect(want_nan[i] ? isnan(got[i]) : got[i] == want,
                              "%s %s of row %d over \"%s\": %g, expected %s", f64 ? "f64" : "f32",
                              dt_reduce_op_name(rop), i, layouts[li], got[i],
                              want_nan[i] ? "nan" : "a number");
                    cr_expect_eq(at[i], op ? want_argmin[i] : want_argmax[i],
                                 "arg%s of row %d over \"%s\": %lld", op ? "min" : "max", i,
                                 layouts[li], (long long)at[i]);
                }
                /* every axis at once: one NaN anywhere makes the result NaN */
                dt_tensor_free(r);
                dt_tensor_free(r32);
                cr_assert_eq(dt_reduce(rop, x, 0, NULL, 0, NULL, &r), DT_OK);
                cr_assert_eq(dt_cast(r, DT_DTYPE_F32, NULL, &r32), DT_OK);
                cr_assert_eq(dt_tensor_read(r32, got, sizeof got[0]), DT_OK);
                cr_expect(isnan(got[0]), "%s of everything: %g", dt_reduce_op_name(rop), got[0]);
                dt_tensor_free(r);
                dt_tensor_free(r32);
                dt_tensor_free(a);
            }
            if (x != x32)
                dt_tensor_free(x);
            dt_tensor_free(x32);
        }
    /* maximum and minimum: NaN whichever operand holds it */
    const int64_t s4[1] = {4};
    dt_tensor *a = T("x", 1, s4, (float[]){nan, 1, nan, 2}),
              *b = T("x", 1, s4, (float[]){1, nan, nan, 3});
    for (int op = 0; op < 2; op++) {
        dt_tensor *r = NULL;
        cr_assert_eq(dt_binary(op ? DT_BINARY_MIN : DT_BINARY_MAX, a, b, NULL, &r), DT_OK);
        float got[4];
        cr_assert_eq(dt_tensor_read(r, got, sizeof got), DT_OK);
        cr_expect(isnan(got[0]) && isnan(got[1]) && isnan(got[2]) && got[3] == (op ? 2 : 3),
                  "%s: %g %g %g %g", op ? "minimum" : "maximum", got[0], got[1], got[2], got[3]);
        dt_tensor_free(r);
    }
    dt_tensor_free(a);
    dt_tensor_free(b);
    stop();
}
