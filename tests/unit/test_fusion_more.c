/* Elementwise fusion of values also read after their chain (spmd/fuse.c): a chain's value that
 * a later step outside it reads (bias + GELU's pre-activation, which a softmax or a gather of
 * it reads after; a reduced chain's value a later step reads) joins the chain and is written
 * out by the fused step, in its one pass. Each function runs eagerly, traced with fusion and
 * traced with DTENSOR_FUSION=0, and every result must be bitwise the same, over f32, f64 and
 * bf16, meshes of 1, 4 and 8 devices, even and uneven shards; the fused program must show the
 * value written out ("-> x") inside the chain and no step of its own. A collective reading
 * such a value (the all-gather of the pre-activation) must wait for the fused step that writes
 * it (spmd/overlap.c). */
#include <criterion/criterion.h>

#include "dt.h"
#include "fusion_fixture.h"

#include <stdlib.h>
#include <string.h>

enum { R = 5, C = 12 };

/* A function of x [R, C] and b [C] with two results. */
typedef dt_status (*fn2)(dt_tensor *x, dt_tensor *b, dt_tensor *out[2]);

/* t = x + b: gelu_tanh(t) and softmax(t) (read after the chain). */
static dt_status gelu_softmax(dt_tensor *x, dt_tensor *b, dt_tensor *out[2])
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_ADD, x, b, NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_GELU_TANH, t, NULL, &out[0]);
    if (s == DT_OK)
        s = dt_softmax(t, -1, NULL, &out[1]);
    dt_tensor_free(t);
    return s;
}

/* t = x + b: gelu_tanh(t) and t gathered whole (an all-gather reading t after the chain). */
static dt_status gelu_gather(dt_tensor *x, dt_tensor *b, dt_tensor *out[2])
{
    dt_tensor *t = NULL;
    dt_layout rep;
    dt_status s = dt_layout_replicated(mesh, 2, &rep);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, x, b, NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_GELU_TANH, t, NULL, &out[0]);
    if (s == DT_OK)
        s = dt_relayout(t, &rep, NULL, &out[1]);
    dt_tensor_free(t);
    return s;
}

/* g = (x * b)^2 summed over the rows, and softmax(g) (read after the reduction). */
static dt_status sum_softmax(dt_tensor *x, dt_tensor *b, dt_tensor *out[2])
{
    dt_tensor *t = NULL, *g = NULL;
    dt_status s = dt_binary(DT_BINARY_MUL, x, b, NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, t, NULL, &g);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, g, 1, (int[]){0}, 0, NULL, &out[0]);
    if (s == DT_OK)
        s = dt_softmax(g, -1, NULL, &out[1]);
    dt_tensor_free(t);
    dt_tensor_free(g);
    return s;
}

/* x or b (values on a grid of 1/64, exact in every float dtype) in dtype dt and layout l. */
static dt_tensor *input(dt_dtype dt, const char *l, int rank, const int64_t *shape, unsigned seed)
{
    int64_t n = rank == 2 ? shape[0] * shape[1] : shape[0];
    double *h = malloc(sizeof *h * (size_t)n);
    for (int64_t k = 0; k < n; k++) {
        seed = seed * 1103515245u + 12345u;
        h[k] = ((int)((seed >> 16) & 255) - 128) / 64.0;
    }
    dt_layout lay = L(l);
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(
        dt_tensor_from_host(&lay, DT_DTYPE_F64, rank, shape, h, sizeof *h * (size_t)n, &t64), DT_OK,
        "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, dt, NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    free(h);
    return t;
}

/* fn traced on x in layout lx and b in lb (fused unless DTENSOR_FUSION=0), its text in *text. */
static dt_function *trace(fn2 fn, dt_dtype dt, const char *lx, const char *lb, bool fuse,
                          char **text)
{
    if (fuse)
        unsetenv("DTENSOR_FUSION");
    else
        setenv("DTENSOR_FUSION", "0", 1);
    dt_layout ax = L(lx), ab = L(lb);
    dt_function *f = NULL;
    dt_tensor *x = NULL, *b = NULL, *y[2] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &ax, dt, 2, (int64_t[]){R, C}, &x), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_function_input(f, &ab, dt, 1, (int64_t[]){C}, &b), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(fn(x, b, y), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_end(f, 2, y), DT_OK, "%s", dt_last_error());
    unsetenv("DTENSOR_FUSION");
    dt_tensor *all[] = {x, b, y[0], y[1]};
    for (int i = 0; i < 4; i++)
        dt_tensor_free(all[i]);
    *text = program_text(f);
    return f;
}

/* fn eagerly, fused and unfused: bitwise the same results; the fused program writes a value out
 * inside a chain that contains `shows` and has no step printing `gone`. */
static void check(fn2 fn, const char *name, const char *lx, const char *lb, const char *shows,
                  const char *gone)
{
    static const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        dt_dtype dt = dts[k];
        dt_tensor *x = input(dt, lx, 2, (int64_t[]){R, C}, 3),
                  *b = input(dt, lb, 1, (int64_t[]){C}, 11);
        dt_tensor *res[3][2] = {{0}};
        cr_assert_eq(fn(x, b, res[0]), DT_OK, "%s", dt_last_error());
        char *text[2];
        for (int v = 0; v < 2; v++) {
            dt_function *f = trace(fn, dt, lx, lb, v == 0, &text[v]);
            cr_assert_eq(dt_function_run(f, 2, (const dt_tensor *const[]){x, b}, 2, res[1 + v]),
                         DT_OK, "%s", dt_last_error());
            dt_function_free(f);
        }
        const char *at = strstr(text[0], shows), *line = at, *store = NULL;
        while (line && line > text[0] && line[-1] != '\n')
            line--;
        const char *end = at ? strchr(at, '\n') : NULL;
        if (line)
            store = strstr(line, " -> x");
        cr_expect(line && store && store < end && strstr(text[0], gone) == NULL,
                  "%s %s %s: no chain with \"%s\" writing a value out, or a step \"%s\":\n%s", name,
                  lx, dt_dtype_name(dt), shows, gone, text[0]);
        cr_expect(strstr(text[1], "fused") == NULL, "DTENSOR_FUSION=0 fused:\n%s", text[1]);
        for (int o = 0; o < 2; o++) {
            size_t bytes[3];
            void *h[3];
            for (int v = 0; v < 3; v++)
                h[v] = read_all(res[v][o], &bytes[v]);
            cr_assert(bytes[1] == bytes[0] && bytes[2] == bytes[0]);
            cr_expect(memcmp(h[1], h[0], bytes[0]) == 0,
                      "%s %s %s result %d: fused differs from eager:\n%s", name, lx,
                      dt_dtype_name(dt), o, text[0]);
            cr_expect(memcmp(h[2], h[0], bytes[0]) == 0,
                      "%s %s %s result %d: unfused differs from eager", name, lx, dt_dtype_name(dt),
                      o);
            for (int v = 0; v < 3; v++) {
                free(h[v]);
                dt_tensor_free(res[v][o]);
            }
        }
        free(text[0]);
        free(text[1]);
        dt_tensor_free(x);
        dt_tensor_free(b);
    }
}

static void check_all(const char *lx, const char *lb)
{
    check(gelu_softmax, "gelu_softmax", lx, lb, "gelu_tanh(", "binary add");
    check(gelu_gather, "gelu_gather", lx, lb, "gelu_tanh(", "binary add");
    check(sum_softmax, "sum_softmax", lx, lb, "sum(", "unary square");
}

Test(fusion_more, one_device)
{
    start(1, "x=1");
    check_all("unsharded,unsharded", "unsharded");
    stop();
}

Test(fusion_more, four_devices)
{
    start(4, "x=4");
    check_all("x,unsharded", "unsharded");
    check_all("unsharded,x", "x");
    stop();
}

Test(fusion_more, eight_devices_uneven)
{
    start(8, "x=2,y=4");
    check_all("y,x", "x"); /* 5 rows over 4 devices */
    check_all("x,y", "y");
    stop();
}
