/* dt_sparse_softmax_cross_entropy_with_logits (spmd/ops/sparse_xent.c) against a host reference
 * in double written from the definition (log sum exp minus the label's logit; the gradient
 * (softmax - onehot) w of sum(loss w)): f32, f64, bf16, f16, logits of rank 1 to 3, on meshes
 * of 1, 2, 4 and 8 devices with the rows, the classes or both sharded (50 classes: uneven on 4
 * and 8 devices), eager and traced; labels outside the classes (NaN rows); bad operands; and the
 * CPU kernel's passes split over 2 to 4 threads, byte for byte those of one thread. */
#include "../../backends/cpu/pool.h"
#include "../ref.h"
#include "dt.h"
#include "fusion_fixture.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static dt_mesh *setup(int devices, const char *spec)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "%s", dt_last_error());
    return m;
}

static void teardown(dt_mesh *m)
{
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* Logits in [-6, 6) from a fixed sequence, multiples of 1/16 (exact in bf16 and f16). */
static double logit_at(int64_t i, int salt)
{
    return (double)(((i * 53 + salt * 29) % 192) - 96) / 16.0;
}

static dt_tensor *labels_of(const dt_layout *l, int rank, const int64_t shape[], const int32_t *y,
                            int64_t n)
{
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(l, DT_DTYPE_I32, rank, shape, y, (size_t)n * 4, &t), DT_OK,
                 "%s", dt_last_error());
    return t;
}

/* The case's logits and weights as the dtype stores them (rounded), so the reference sees the
 * values the op sees. */
static double stored(dt_dtype dt, double v)
{
    return dt == DT_DTYPE_F64    ? v
           : dt == DT_DTYPE_F32  ? (double)(float)v
           : dt == DT_DTYPE_BF16 ? (double)dt_bf16_to_f32(dt_f64_to_bf16(v))
                                 : (double)dt_f16_to_f32(dt_f64_to_f16(v));
}

/* One case on mesh m: logits of `rank` (the last axis C classes) laid out as `spec`, the labels
 * and the weights w as its leading axes; the loss eager, and the gradient of sum(loss w) by the
 * library's autodiff in a traced function. */
static void check(const dt_mesh *m, const char *spec, dt_dtype dt, int rank, const int64_t shape[])
{
    int64_t C = shape[rank - 1], rows = 1;
    for (int i = 0; i + 1 < rank; i++)
        rows *= shape[i];
    int64_t n = rows * C;
    double *x = malloc(sizeof(double) * (size_t)(2 * n + 3 * rows)), *w = x + n, *loss = w + rows,
           *got = loss + rows, *dx = got + rows;
    double *gdx = malloc(sizeof(double) * (size_t)n);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)rows);
    cr_assert(x && gdx && y);
    for (int64_t i = 0; i < n; i++)
        x[i] = stored(dt, logit_at(i, rank));
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (int32_t)((r * 7 + 3) % C);
        w[r] = stored(dt, 0.25 + (double)(r % 5) / 4);
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++)
            mx = fmax(mx, x[r * C + j]);
        for (int64_t j = 0; j < C; j++)
            s += exp(x[r * C + j] - mx);
        double lse = mx + log(s);
        loss[r] = lse - x[r * C + y[r]];
        for (int64_t j = 0; j < C; j++)
            dx[r * C + j] = (exp(x[r * C + j] - lse) - (j == y[r])) * w[r];
    }
    dt_layout l, lr;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    lr = l;
    lr.rank = rank - 1;
    lr.axes[rank - 1] = DT_UNSHARDED;
    dt_tensor *tx = from_doubles(&l, dt, rank, shape, x, n),
              *tw = from_doubles(&lr, dt, rank - 1, shape, w, rows),
              *ty = labels_of(&lr, rank - 1, shape, y, rows), *tl = NULL;
    double tol = dt == DT_DTYPE_F64 ? 1e-12 : dt == DT_DTYPE_F32 ? 2e-5 : 2e-2;
    cr_assert_eq(dt_sparse_softmax_cross_entropy_with_logits(ty, tx, NULL, &tl), DT_OK, "%s",
                 dt_last_error());
    cr_expect_eq(dt_tensor_dtype(tl), dt);
    cr_expect(dt_layout_equal(dt_tensor_layout(tl), &lr), "%s: the loss not in the rows' layout",
              spec);
    to_doubles(tl, got, rows);
    double fw = ref_worst(got, loss, rows);
    cr_expect(fw <= tol, "%s %s rank %d C %lld: loss off by %g (tolerance %g)", dt_dtype_name(dt),
              spec, rank, (long long)C, fw, tol);
    /* the gradient of sum(loss w) */
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[3], *o = NULL, *res[2] = {0}, *a = NULL, *pr = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, DT_DTYPE_I32, rank - 1, shape, &in[0]), DT_OK);
    cr_assert_eq(dt_function_input(f, &l, dt, rank, shape, &in[1]), DT_OK);
    cr_assert_eq(dt_function_input(f, &lr, dt, rank - 1, shape, &in[2]), DT_OK);
    cr_assert_eq(dt_sparse_softmax_cross_entropy_with_logits(in[0], in[1], NULL, &a), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, in[2], NULL, &pr), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, pr, 0, NULL, 0, NULL, &o), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 1, (int[]){1}, &g), DT_OK, "%s", dt_last_error());
    const dt_tensor *args[3] = {ty, tx, tw};
    cr_assert_eq(dt_function_run(g, 3, args, 2, res), DT_OK, "%s", dt_last_error());
    cr_expect(dt_layout_equal(dt_tensor_layout(res[1]), &l), "%s: d logits not in their layout",
              spec);
    to_doubles(res[1], gdx, n);
    double gw = ref_worst(gdx, dx, n);
    cr_expect(gw <= tol, "%s %s rank %d C %lld: d logits off by %g (tolerance %g)",
              dt_dtype_name(dt), spec, rank, (long long)C, gw, tol);
    for (int i = 0; i < 3; i++)
        dt_tensor_free(in[i]);
    for (int i = 0; i < 2; i++)
        dt_tensor_free(res[i]);
    dt_tensor_free(a);
    dt_tensor_free(pr);
    dt_tensor_free(o);
    dt_function_free(f);
    dt_function_free(g);
    dt_tensor_free(tx);
    dt_tensor_free(tw);
    dt_tensor_free(ty);
    dt_tensor_free(tl);
    free(x);
    free(gdx);
    free(y);
}

Test(sparse_xent, one_device_every_dtype_and_rank)
{
    dt_mesh *m = setup(1, "x=1");
    const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};
    for (int i = 0; i < 4; i++) {
        check(m, "unsharded", dts[i], 1, (int64_t[]){50});
        check(m, "unsharded,unsharded", dts[i], 2, (int64_t[]){6, 50});
        check(m, "unsharded,unsharded,unsharded", dts[i], 3, (int64_t[]){2, 3, 50});
    }
    /* rows longer than the kernel's blocks of 256, a new maximum in a later block */
    check(m, "unsharded,unsharded", DT_DTYPE_F32, 2, (int64_t[]){3, 1000});
    check(m, "unsharded,unsharded", DT_DTYPE_F64, 2, (int64_t[]){3, 1000});
    teardown(m);
}

/* Classes sharded (50: even on 2, uneven on 4 and 8), rows sharded, both on 2-D meshes. */
Test(sparse_xent, meshes_of_2_4_8_devices)
{
    const int sizes[] = {2, 4, 8};
    for (int s = 0; s < 3; s++) {
        char spec[16];
        snprintf(spec, sizeof spec, "x=%d", sizes[s]);
        dt_mesh *m = setup(sizes[s], spec);
        check(m, "unsharded,x", DT_DTYPE_F32, 2, (int64_t[]){8, 50});
        check(m, "unsharded,x", DT_DTYPE_F64, 2, (int64_t[]){8, 50});
        check(m, "x,unsharded", DT_DTYPE_F64, 2, (int64_t[]){8, 50});
        check(m, "x,unsharded", DT_DTYPE_F64, 2, (int64_t[]){6, 50});
        check(m, "x", DT_DTYPE_F64, 1, (int64_t[]){50});
        check(m, "unsharded,unsharded,x", DT_DTYPE_BF16, 3, (int64_t[]){2, 3, 50});
        teardown(m);
    }
    dt_mesh *m = setup(8, "b=2,v=4");
    check(m, "b,v", DT_DTYPE_F32, 2, (int64_t[]){8, 50});
    check(m, "b,unsharded,v", DT_DTYPE_F64, 3, (int64_t[]){4, 3, 50});
    check(m, "v,b", DT_DTYPE_F64, 2, (int64_t[]){8, 50});
    check(m, "b,v,unsharded", DT_DTYPE_F16, 3, (int64_t[]){2, 4, 50});
    teardown(m);
}

/* A label outside [0, C): its row's loss is NaN (no shard owns it), the others as usual. */
Test(sparse_xent, labels_outside_the_classes)
{
    dt_mesh *m = setup(2, "x=2");
    dt_layout l, lr;
    cr_assert_eq(dt_layout_parse(m, "unsharded,x", &l), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "unsharded", &lr), DT_OK);
    double x[12] = {0};
    dt_tensor *tx = from_doubles(&l, DT_DTYPE_F32, 2, (int64_t[]){3, 4}, x, 12);
    dt_tensor *ty = labels_of(&lr, 1, (int64_t[]){3}, (int32_t[]){1, 4, -1}, 3), *t = NULL;
    cr_assert_eq(dt_sparse_softmax_cross_entropy_with_logits(ty, tx, NULL, &t), DT_OK, "%s",
                 dt_last_error());
    double got[3];
    to_doubles(t, got, 3);
    cr_expect(fabs(got[0] - log(4.0)) < 1e-6, "row 0: %g", got[0]);
    cr_expect(isnan(got[1]) && isnan(got[2]), "rows 1, 2: %g %g", got[1], got[2]);
    dt_tensor_free(t);
    dt_tensor_free(tx);
    dt_tensor_free(ty);
    teardown(m);
}

static void expect_fail(const dt_tensor *labels, const dt_tensor *logits, dt_status want,
                        const char *words)
{
    dt_tensor *t = (dt_tensor *)1;
    dt_status s = dt_sparse_softmax_cross_entropy_with_logits(labels, logits, NULL, &t);
    cr_expect_eq(s, want, "status %d, expected %d: %s", s, want, dt_last_error());
    cr_expect_null(t, "the out-parameter set on failure");
    cr_expect(strstr(dt_last_error(), words), "\"%s\" lacks \"%s\"", dt_last_error(), words);
}

Test(sparse_xent, bad_operands)
{
    dt_mesh *m = setup(1, "x=1");
    dt_layout r1, r2;
    cr_assert_eq(dt_layout_parse(m, "unsharded", &r1), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "unsharded,unsharded", &r2), DT_OK);
    double z[20] = {0};
    dt_tensor *x = from_doubles(&r2, DT_DTYPE_F32, 2, (int64_t[]){3, 5}, z, 15);
    dt_tensor *y4 = labels_of(&r1, 1, (int64_t[]){4}, (int32_t[]){0, 0, 0, 0}, 4);
    dt_tensor *yf = from_doubles(&r1, DT_DTYPE_F32, 1, (int64_t[]){3}, z, 3);
    dt_tensor *y2 = labels_of(&r2, 2, (int64_t[]){3, 5}, (int32_t[15]){0}, 15);
    dt_tensor *xi = labels_of(&r2, 2, (int64_t[]){3, 5}, (int32_t[15]){0}, 15);
    dt_tensor *y3 = labels_of(&r1, 1, (int64_t[]){3}, (int32_t[]){0, 1, 2}, 3);
    dt_layout r0;
    cr_assert_eq(dt_layout_parse(m, "", &r0), DT_OK, "%s", dt_last_error());
    dt_tensor *x0 = from_doubles(&r0, DT_DTYPE_F32, 0, NULL, z, 1);
    expect_fail(y4, x, DT_ERR_SHAPE, "labels [4] do not match logits [3,5]");
    expect_fail(y2, x, DT_ERR_SHAPE, "labels [3,5] do not match logits [3,5]");
    expect_fail(yf, x, DT_ERR_DTYPE, "labels [3] are f32, expected i32 or i64");
    expect_fail(y3, xi, DT_ERR_DTYPE, "logits [3,5] are i32");
    expect_fail(y3, x0, DT_ERR_SHAPE, "logits [] have rank 0");
    dt_tensor *ts[] = {x, y4, yf, y2, xi, y3, x0};
    for (int i = 0; i < 7; i++)
        dt_tensor_free(ts[i]);
    teardown(m);
}

/* The kernel's two passes over the logits (STATS, GRAD) on 2, 3 and 4 threads against one
 * thread: every output byte identical (rows in a fixed order, each row as alone). */
Test(sparse_xent, passes_split_over_threads)
{
    int64_t rows = 67, C = 1031, n = rows * C;
    const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F64};
    for (int d = 0; d < 3; d++) {
        dt_dtype dt = dts[d];
        size_t es = dt_dtype_size(dt), as = dt == DT_DTYPE_F64 ? 8 : 4;
        unsigned char *x = malloc((size_t)n * es), *st = malloc((size_t)rows * 4 * as);
        unsigned char *mm = malloc((size_t)rows * as), *c = malloc((size_t)rows * 3 * as);
        unsigned char *dy = malloc((size_t)rows * es), *ref = malloc((size_t)n * es),
                      *got = malloc((size_t)n * es);
        int32_t *y = malloc((size_t)rows * 4);
        cr_assert(x && st && mm && c && dy && ref && got && y);
        for (int64_t i = 0; i < n; i++) {
            double v = logit_at(i, 3) + (double)(i % 7) / 64;
            if (dt == DT_DTYPE_F32)
                ((float *)x)[i] = (float)v;
            else if (dt == DT_DTYPE_F64)
                ((double *)x)[i] = v;
            else
                ((uint16_t *)x)[i] = dt_f64_to_bf16(v);
        }
        for (int64_t r = 0; r < rows; r++) {
            y[r] = (int32_t)((r * 13) % C);
            if (dt == DT_DTYPE_F32)
                ((float *)dy)[r] = 0.5f;
            else if (dt == DT_DTYPE_F64)
                ((double *)dy)[r] = 0.5;
            else
                ((uint16_t *)dy)[r] = dt_f64_to_bf16(0.5);
        }
        dt__kargs k;
        memset(&k, 0, sizeof k);
        k.nidx = rows;
        k.inner = C;
        k.from = DT_DTYPE_I32;
        dt__kctx one = {.type = "CPU", .cores = 1};
        dt__kernel_fn fn = dt__cpu_kernels[DT__K_XENT][dt];
        cr_assert(fn);
        for (int threads = 2; threads <= 4; threads++) {
            dt__cpu_pool *pool = NULL;
            cr_assert_eq(dt__cpu_pool_open(threads, false, false, &pool), DT_OK);
            dt__kctx many = {.type = "CPU", .cores = threads, .pool = pool};
            cr_assert_geq(dt__cpu_parts(&many, n, rows), 2);
            /* STATS */
            k.mode = DT__XENT_STATS;
            const void *sin[2] = {x, y};
            cr_assert_eq(fn(&one, &k, sin, ref), DT_OK);
            cr_assert_eq(fn(&many, &k, sin, got), DT_OK);
            cr_expect_eq(memcmp(ref, got, (size_t)rows * 4 * as), 0, "%s stats on %d threads",
                         dt_dtype_name(dt), threads);
            memcpy(st, ref, (size_t)rows * 4 * as);
            k.mode = DT__XENT_MAX;
            const void *min[1] = {st};
            cr_assert_eq(fn(&one, &k, min, mm), DT_OK);
            k.mode = DT__XENT_COMBINE;
            const void *cin[2] = {st, mm};
            cr_assert_eq(fn(&one, &k, cin, c), DT_OK);
            /* GRAD */
            k.mode = DT__XENT_GRAD;
            const void *gin[5] = {x, y, mm, c, dy};
            cr_assert_eq(fn(&one, &k, gin, ref), DT_OK);
            cr_assert_eq(fn(&many, &k, gin, got), DT_OK);
            cr_expect_eq(memcmp(ref, got, (size_t)n * es), 0, "%s d logits on %d threads",
                         dt_dtype_name(dt), threads);
            dt__cpu_pool_close(pool);
        }
        free(x);
        free(st);
        free(mm);
        free(c);
        free(dy);
        free(ref);
        free(got);
        free(y);
    }
}

/* ---- a tied embedding's gradient: a gather's and a dense gradient of one table --------------- */

enum { TV = 37, TD = 6, TB = 12 };

/* loss = sum(gather(t1, ids) h) + sum(einsum("bd,vd->bv", h, t2) w): gradients of t1 (the
 * gather's: a segment sum of h) and t2 (dense, w^T h); tied: t1 and t2 the same input. */
static dt_function *head_gradient(const dt_layout *lt, const dt_layout *li, const dt_layout *lb,
                                  bool tied)
{
    dt_function *f = NULL, *g = NULL;
    dt_tensor *t1, *t2 = NULL, *ids, *h, *w, *e, *p, *s1, *z, *q, *s2, *o;
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    cr_assert_eq(dt_function_input(f, lt, DT_DTYPE_F32, 2, (int64_t[]){TV, TD}, &t1), DT_OK);
    if (!tied)
        cr_assert_eq(dt_function_input(f, lt, DT_DTYPE_F32, 2, (int64_t[]){TV, TD}, &t2), DT_OK);
    cr_assert_eq(dt_function_input(f, li, DT_DTYPE_I32, 1, (int64_t[]){TB}, &ids), DT_OK);
    cr_assert_eq(dt_function_input(f, lb, DT_DTYPE_F32, 2, (int64_t[]){TB, TD}, &h), DT_OK);
    cr_assert_eq(dt_function_input(f, lb, DT_DTYPE_F32, 2, (int64_t[]){TB, TV}, &w), DT_OK);
    cr_assert_eq(dt_gather(t1, ids, NULL, &e), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, e, h, NULL, &p), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, p, 0, NULL, 0, NULL, &s1), DT_OK);
    const dt_tensor *ops[2] = {h, tied ? t1 : t2};
    cr_assert_eq(dt_einsum("bd,vd->bv", 2, ops, NULL, &z), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, z, w, NULL, &q), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, q, 0, NULL, 0, NULL, &s2), DT_OK);
    cr_assert_eq(dt_binary(DT_BINARY_ADD, s1, s2, NULL, &o), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, tied ? 1 : 2, (int[]){0, 1}, &g), DT_OK, "%s",
                 dt_last_error());
    dt_tensor *ts[] = {t1, t2, ids, h, w, e, p, s1, z, q, s2, o};
    for (int i = 0; i < 12; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(f);
    return g;
}

/* On mesh m with the table, the ids and the batch operands laid out as given: the tied
 * gradient against a double reference (segment sum of h plus w^T h) and, where the ids are not
 * split (no partial sums to all-reduce), bitwise against the separate gradients added; there
 * the dense gradient is dead after the gather's is added into it, and the program adds it in
 * place (into the result's buffer, no copy). */
static void check_tied(const dt_mesh *m, const char *st, const char *si, const char *sb,
                       bool bitwise)
{
    dt_layout lt, li, lb;
    cr_assert_eq(dt_layout_parse(m, st, &lt), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_layout_parse(m, si, &li), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_layout_parse(m, sb, &lb), DT_OK, "%s", dt_last_error());
    double t[TV * TD], h[TB * TD], w[TB * TV], ref[TV * TD] = {0}, got[TV * TD], old[TV * TD];
    int32_t ids[TB];
    for (int i = 0; i < TV * TD; i++)
        t[i] = logit_at(i, 1) / 4;
    for (int i = 0; i < TB * TD; i++)
        h[i] = logit_at(i, 2) / 3;
    for (int i = 0; i < TB * TV; i++)
        w[i] = logit_at(i, 3) / 5;
    for (int b = 0; b < TB; b++) /* rows 0, 12, 23, 24, 35 twice, one id outside */
        ids[b] = b == 7 ? TV + 3 : (int32_t)((b * 6) % 36 + (b % 2 ? 5 : 0)) % TV;
    for (int b = 0; b < TB; b++)
        for (int v = 0; v < TV; v++)
            for (int d = 0; d < TD; d++) {
                double x = (float)h[b * TD + d], y = (float)w[b * TV + v];
                ref[v * TD + d] += x * y;
            }
    for (int b = 0; b < TB; b++)
        if (ids[b] >= 0 && ids[b] < TV)
            for (int d = 0; d < TD; d++)
                ref[ids[b] * TD + d] += (float)h[b * TD + d];
    dt_tensor *tt = from_doubles(&lt, DT_DTYPE_F32, 2, (int64_t[]){TV, TD}, t, TV * TD);
    dt_tensor *ti = labels_of(&li, 1, (int64_t[]){TB}, ids, TB);
    dt_tensor *th = from_doubles(&lb, DT_DTYPE_F32, 2, (int64_t[]){TB, TD}, h, TB * TD);
    dt_tensor *tw = from_doubles(&lb, DT_DTYPE_F32, 2, (int64_t[]){TB, TV}, w, TB * TV);
    dt_function *tied = head_gradient(&lt, &li, &lb, true),
                *apart = head_gradient(&lt, &li, &lb, false);
    char *text = program_text(tied);
    cr_expect(!bitwise || strstr(text, ", in place") != NULL,
              "%s / %s / %s: the segment sum into the dense gradient not in place:\n%s", st, si, sb,
              text);
    free(text);
    dt_tensor *r1[2] = {0}, *r2[3] = {0}, *sum = NULL;
    cr_assert_eq(dt_function_run(tied, 4, (const dt_tensor *[]){tt, ti, th, tw}, 2, r1), DT_OK,
                 "%s", dt_last_error());
    cr_assert_eq(dt_function_run(apart, 5, (const dt_tensor *[]){tt, tt, ti, th, tw}, 3, r2), DT_OK,
                 "%s", dt_last_error());
    cr_expect(dt_layout_equal(dt_tensor_layout(r1[1]), &lt), "%s: not in the table's layout", st);
    to_doubles(r1[1], got, TV * TD);
    double e = ref_worst(got, ref, TV * TD);
    cr_expect(e <= 2e-6, "%s / %s / %s: tied gradient off by %g", st, si, sb, e);
    if (bitwise) {
        cr_assert_eq(dt_binary(DT_BINARY_ADD, r2[2], r2[1], NULL, &sum), DT_OK, "%s",
                     dt_last_error());
        to_doubles(sum, old, TV * TD);
        int same = 0;
        for (int i = 0; i < TV * TD; i++)
            same += memcmp(&got[i], &old[i], sizeof got[i]) == 0;
        cr_expect_eq(same, TV * TD, "%s / %s / %s: %d of %d elements bitwise as the sum", st, si,
                     sb, same, TV * TD);
    }
    for (int i = 0; i < 2; i++)
        dt_tensor_free(r1[i]);
    for (int i = 0; i < 3; i++)
        dt_tensor_free(r2[i]);
    dt_tensor *ts[] = {sum, tt, ti, th, tw};
    for (int i = 0; i < 5; i++)
        dt_tensor_free(ts[i]);
    dt_function_free(tied);
    dt_function_free(apart);
}

Test(sparse_xent, tied_embedding_gradient)
{
    dt_mesh *m = setup(1, "x=1");
    check_tied(m, "unsharded,unsharded", "unsharded", "unsharded,unsharded", true);
    teardown(m);
    m = setup(4, "x=4");
    /* the vocabulary split (37 rows: uneven), ids replicated */
    check_tied(m, "x,unsharded", "unsharded", "unsharded,unsharded", true);
    /* the batch split: each device's sums pending over x, all-reduced */
    check_tied(m, "unsharded,unsharded", "x", "x,unsharded", false);
    check_tied(m, "x,unsharded", "x", "x,unsharded", false);
    teardown(m);
    m = setup(4, "b=2,v=2");
    check_tied(m, "v,unsharded", "b", "b,unsharded", false);
    check_tied(m, "v,unsharded", "unsharded", "unsharded,unsharded", true);
    teardown(m);
}
