/* The differential suite (tests/unit/diff_core.h): elementwise ops, promotion, casts, where,
 * reductions, shape ops, dtype errors, copy_to_mesh. Included by diff_core.h, after the helpers,
 * references and options it uses. */
#ifndef DT_TEST_DIFF_OPS_ELEMENTWISE_H
#define DT_TEST_DIFF_OPS_ELEMENTWISE_H

static void diff_elementwise(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 6}, {5, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1];
            void *ha = malloc((size_t)ne * 8), *hb = malloc((size_t)ne * 8);
            fill_host(dt, ha, ne, 6);
            fill_host(dt, hb, ne, 8);
            double *ref = malloc(sizeof(double) * (size_t)ne);
            int n = layouts_for(m, 2, dt, ls), n1 = layouts_for(m, 1, dt, l1), nu = 0;
            /* unary: every op the dtype takes, every layout */
            bool ok_u = true;
            for (int i = 0; i < n; i++) {
                if (narrow(dt) && i % 2)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, ha);
                for (int op = 0; op < DT_UNARY_COUNT; op++) {
                    if (!takes_unary(dt, op))
                        continue;
                    nu += i == 0;
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_unary(op, dt, get(dt, ha, k));
                    dt_tensor *y = NULL;
                    ok_u = ok_u && x && dt_unary((dt_unary_op)op, x, NULL, &y) == DT_OK &&
                           matches(y, dt, ref, ne, unary_tol(dt, op));
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok_u, "unary (%d ops) %s %s: %d layouts", nu, dt_dtype_name(dt),
                        s ? "uneven" : "even", n);
            /* binary: every op the dtype takes on pairs of layouts (a subset for the ops past
             * max) */
            bool ok_b = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                dt_tensor *a = make_tensor(&ls[i], dt, 2, sh, ha);
                for (int j = 0; j < n; j++) {
                    if (!pick_dt(o, dt, i, j, n))
                        continue;
                    dt_tensor *b = make_tensor(&ls[j], dt, 2, sh, hb);
                    for (int op = 0; op < DT_BINARY_COUNT; op++) {
                        if ((op > DT_BINARY_MAX && (i + j + op) % 4) || !takes_binary(dt, op))
                            continue;
                        for (int64_t k = 0; k < ne; k++)
                            ref[k] = ref_binary(op, dt, get(dt, ha, k), get(dt, hb, k));
                        dt_tensor *c = NULL;
                        bool one = a && b && dt_binary((dt_binary_op)op, a, b, NULL, &c) == DT_OK &&
                                   matches(c, binary_result(dt, op), ref, ne, ew_tol(dt));
                        if (!one && ok_b) {
                            char x[64], y[64];
                            layout_text(&ls[i], x, sizeof x);
                            layout_text(&ls[j], y, sizeof y);
                            snprintf(bad, sizeof bad, " (first failure %s \"%s\" \"%s\": %s)",
                                     dt_binary_op_name((dt_binary_op)op), x, y, dt_last_error());
                        }
                        ok_b = ok_b && one;
                        dt_tensor_free(c);
                    }
                    dt_tensor_free(b);
                }
                /* broadcasting: a (M, N) with b of shape (N) */
                int bop = is_bool(dt) ? DT_BINARY_LOGICAL_XOR : DT_BINARY_SUB;
                for (int j = 0; j < n1; j++) {
                    int64_t sb1[1] = {sh[1]};
                    dt_tensor *b = make_tensor(&l1[j], dt, 1, sb1, hb), *c = NULL;
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_binary(bop, dt, get(dt, ha, k), get(dt, hb, k % sh[1]));
                    bool one = a && b && dt_binary((dt_binary_op)bop, a, b, NULL, &c) == DT_OK &&
                               matches(c, dt, ref, ne, ew_tol(dt));
                    if (!one && ok_b)
                        snprintf(bad, sizeof bad, " (broadcast failure: %s)", dt_last_error());
                    ok_b = ok_b && one;
                    dt_tensor_free(b);
                    dt_tensor_free(c);
                }
                dt_tensor_free(a);
            }
            DIFF_REPORT(ok_b, "binary %s %s: pairs of %d layouts, broadcasting%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", n, bad);
            free(ha);
            free(hb);
            free(ref);
        }
}

/* Operands of two dtypes: both converted to dt_dtype_promote's, as PyTorch promotes; a
 * comparison of the two gives bool. */
static void diff_promotion(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    const dt_dtype pairs[][2] = {{DT_DTYPE_F32, DT_DTYPE_F64},  {DT_DTYPE_I32, DT_DTYPE_F32},
                                 {DT_DTYPE_BF16, DT_DTYPE_F16}, {DT_DTYPE_U8, DT_DTYPE_I8},
                                 {DT_DTYPE_BOOL, DT_DTYPE_I64}, {DT_DTYPE_I64, DT_DTYPE_BF16}};
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 3}, sb1[1] = {3};
    int n = all_layouts(m, 2, false, ls), n1 = all_layouts(m, 1, false, l1);
    double ha[15], hb[15], ref[15];
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        dt_dtype ta = pairs[p][0], tb = pairs[p][1], t = dt_dtype_promote(ta, tb);
        fill_host(ta, ha, 15, 3);
        fill_host(tb, hb, 15, 4);
        bool ok = true;
        char bad[256] = "";
        for (int i = 0; i < n; i++) {
            dt_tensor *a = make_tensor(&ls[i], ta, 2, sh, ha);
            for (int j = 0; j < n1; j++) {
                dt_tensor *b = make_tensor(&l1[j], tb, 1, sb1, hb), *c = NULL, *e = NULL;
                for (int64_t k = 0; k < 15; k++)
                    ref[k] = ref_binary(DT_BINARY_MUL, t, get(ta, ha, k), get(tb, hb, k % 3));
                bool one = a && b && dt_binary(DT_BINARY_MUL, a, b, NULL, &c) == DT_OK &&
                           dt_tensor_dtype(c) == t && matches(c, t, ref, 15, 0);
                for (int64_t k = 0; k < 15; k++)
                    ref[k] = get(ta, ha, k) < get(tb, hb, k % 3);
                one = one && dt_binary(DT_BINARY_LT, a, b, NULL, &e) == DT_OK &&
                      dt_tensor_dtype(e) == DT_DTYPE_BOOL && matches(e, DT_DTYPE_BOOL, ref, 15, 0);
                if (!one && ok)
                    snprintf(bad, sizeof bad, " (first failure at layouts %d, %d: %s)", i, j,
                             dt_last_error());
                ok = ok && one;
                dt_tensor_free(b);
                dt_tensor_free(c);
                dt_tensor_free(e);
            }
            dt_tensor_free(a);
        }
        DIFF_REPORT(ok, "promotion %s * %s -> %s (and <): %d x %d layouts%s", dt_dtype_name(ta),
                    dt_dtype_name(tb), dt_dtype_name(t), n, n1, bad);
    }
}

/* The conversion of one value as the tests define it, independently of the library's
 * kernels: to bool x != 0; from floats to integers toward zero (the values are small); else
 * the value rounded or wrapped once by ref_as. */
static double ref_cast(dt_dtype from, dt_dtype to, double v)
{
    if (to == DT_DTYPE_BOOL)
        return v != 0;
    if (dt_dtype_is_floating(from) && !dt_dtype_is_floating(to))
        return trunc(v);
    return v;
}

/* cast: every pair of dtypes on every layout (a subset of layouts for the narrow pairs);
 * even and uneven; the result keeps the layout, or takes a requested one. */
static void diff_cast(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 6}, {5, 3}};
    for (int s = 0; s < 2; s++)
        for (int f = 0; f < NUM_DTYPES; f++) {
            dt_dtype from = dtypes[f];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1];
            double hx[30], ref[30];
            /* thirds as well as halves: float to integer conversions truncate */
            for (int64_t k = 0; k < ne; k++)
                put(from, hx, k,
                    is_bool(from)  ? (double)(k % 3 != 0)
                    : is_int(from) ? 2 * value_at(k, 5)
                                   : value_at(k, 5) * 1.25);
            int n = layouts_for(m, 2, from, ls);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                if ((narrow(from) || s || !o->thorough) && i % 3)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], from, 2, sh, hx);
                for (int t = 0; t < NUM_DTYPES; t++) {
                    dt_dtype to = dtypes[t];
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_cast(from, to, get(from, hx, k));
                    dt_op_options req = {.layout = &ls[(i + t) % n]};
                    if (req.layout->partial)
                        req.layout = &ls[0];
                    dt_tensor *y = NULL, *z = NULL;
                    bool one = x && dt_cast(x, to, NULL, &y) == DT_OK && dt_tensor_dtype(y) == to &&
                               matches(y, to, ref, ne, 0) && dt_cast(x, to, &req, &z) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(z), req.layout) &&
                               matches(z, to, ref, ne, 0);
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure to %s from \"%s\": %s)",
                                 dt_dtype_name(to), lx, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                    dt_tensor_free(z);
                }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "cast %s to every dtype %s: %d layouts%s", dt_dtype_name(from),
                        s ? "uneven" : "even", n, bad);
        }
}

/* where(cond, x, y): cond of every layout, x and y of layouts by pairs, with cond and y
 * broadcast, every dtype for x and y. */
static void diff_where(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], lb[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 6}, sh1[1] = {6};
    double hc[30], hx[30], hy[30], ref[30];
    fill_host(DT_DTYPE_BOOL, hc, 30, 7);
    int nb = all_layouts(m, 2, false, lb), n1 = all_layouts(m, 1, false, l1);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        fill_host(dt, hx, 30, 1);
        fill_host(dt, hy, 30, 2);
        int n = layouts_for(m, 2, dt, ls);
        bool ok = true;
        char bad[256] = "";
        for (int i = 0; i < nb; i++) {
            if (!o->thorough && i % 2)
                continue;
            dt_tensor *c = make_tensor(&lb[i], DT_DTYPE_BOOL, 2, sh, hc);
            for (int j = 0; j < n; j++) {
                if (!pick_dt(o, dt, i, j, n > nb ? n : nb))
                    continue;
                dt_tensor *x = make_tensor(&ls[j], dt, 2, sh, hx);
                dt_tensor *y1 = make_tensor(&l1[(i + j) % n1], dt, 1, sh1, hy), *r = NULL;
                for (int64_t k = 0; k < 30; k++)
                    ref[k] = get(DT_DTYPE_BOOL, hc, k) ? get(dt, hx, k) : get(dt, hy, k % 6);
                bool one = c && x && y1 && dt_where(c, x, y1, NULL, &r) == DT_OK &&
                           matches(r, dt, ref, 30, 0);
                if (!one && ok) {
                    char lc[64], lx[64];
                    layout_text(&lb[i], lc, sizeof lc);
                    layout_text(&ls[j], lx, sizeof lx);
                    snprintf(bad, sizeof bad, " (first failure cond \"%s\" x \"%s\": %s)", lc, lx,
                             dt_last_error());
                }
                ok = ok && one;
                dt_tensor_free(x);
                dt_tensor_free(y1);
                dt_tensor_free(r);
            }
            dt_tensor_free(c);
        }
        DIFF_REPORT(ok, "where %s: cond %d layouts, x %d layouts, y broadcast%s", dt_dtype_name(dt),
                    nb, n, bad);
    }
}

static void diff_reduce(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 3}};
    const int ops[5] = {DT_REDUCE_SUM, DT_REDUCE_MEAN, DT_REDUCE_MAX, DT_REDUCE_MIN,
                        DT_REDUCE_PROD};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            void *hx = malloc((size_t)ne * 8);
            fill_host(dt, hx, ne, 9);
            double ref[128];
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                if (narrow(dt) && i % 3)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                for (unsigned mask = 1; mask < 8; mask++)
                    for (int q = 0; q < 5; q++) {
                        if ((mask + (unsigned)q + (unsigned)i) % 2 && mask != 7)
                            continue;
                        int axes[3], na = 0;
                        for (int a = 0; a < 3; a++)
                            if (mask & (1u << a))
                                axes[na++] = a;
                        /* reference: keepdims layout of the output */
                        int64_t os[3], cnt = 1;
                        for (int a = 0; a < 3; a++) {
                            os[a] = (mask & (1u << a)) ? 1 : sh[a];
                            cnt *= (mask & (1u << a)) ? sh[a] : 1;
                        }
                        int64_t no = os[0] * os[1] * os[2];
                        /* products of integers wrap: their reference is a wrapping product */
                        uint64_t wrapped[128];
                        for (int64_t k = 0; k < no; k++) {
                            ref[k] = ops[q] == DT_REDUCE_MAX    ? -INFINITY
                                     : ops[q] == DT_REDUCE_MIN  ? INFINITY
                                     : ops[q] == DT_REDUCE_PROD ? 1
                                                                : 0;
                            wrapped[k] = 1;
                        }
                        for (int64_t i0 = 0; i0 < sh[0]; i0++)
                            for (int64_t i1 = 0; i1 < sh[1]; i1++)
                                for (int64_t i2 = 0; i2 < sh[2]; i2++) {
                                    int64_t ii[3] = {i0, i1, i2}, k = 0;
                                    for (int a = 0; a < 3; a++)
                                        k = k * os[a] + ((mask & (1u << a)) ? 0 : ii[a]);
                                    double v = get(dt, hx, (i0 * sh[1] + i1) * sh[2] + i2);
                                    if (ops[q] == DT_REDUCE_MAX)
                                        ref[k] = fmax(ref[k], v);
                                    else if (ops[q] == DT_REDUCE_MIN)
                                        ref[k] = fmin(ref[k], v);
                                    else if (ops[q] == DT_REDUCE_PROD)
                                        ref[k] *= v;
                                    else
                                        ref[k] += v;
                                    wrapped[k] *= (uint64_t)(int64_t)v;
                                }
                        for (int64_t k = 0; ops[q] == DT_REDUCE_PROD && is_int(dt) && k < no; k++)
                            ref[k] = dt == DT_DTYPE_I32  ? (double)(int32_t)wrapped[k]
                                     : dt == DT_DTYPE_U8 ? (double)(uint8_t)wrapped[k]
                                     : dt == DT_DTYPE_I8 ? (double)(int8_t)wrapped[k]
                                                         : (double)(int64_t)wrapped[k];
                        if (ops[q] == DT_REDUCE_MEAN)
                            for (int64_t k = 0; k < no; k++)
                                ref[k] /= (double)cnt;
                        for (int keep = 0; keep < 2; keep++) {
                            dt_tensor *y = NULL;
                            bool refused =
                                (ops[q] == DT_REDUCE_MEAN && !dt_dtype_is_floating(dt)) ||
                                ((ops[q] == DT_REDUCE_SUM || ops[q] == DT_REDUCE_PROD) &&
                                 is_bool(dt));
                            if (refused) {
                                /* means of integers, sums and products of bool, said clearly */
                                bool one = x &&
                                           dt_reduce((dt_reduce_op)ops[q], x, na, axes, keep, NULL,
                                                     &y) == DT_ERR_DTYPE &&
                                           !y && strstr(dt_last_error(), dt_dtype_name(dt));
                                if (!one && ok)
                                    snprintf(bad, sizeof bad, " (%s of %s: %s)",
                                             dt_reduce_op_name((dt_reduce_op)ops[q]),
                                             dt_dtype_name(dt), dt_last_error());
                                ok = ok && one;
                                continue;
                            }
                            bool one = x &&
                                       dt_reduce((dt_reduce_op)ops[q], x, na, axes, keep, NULL,
                                                 &y) == DT_OK &&
                                       dt_tensor_rank(y) == (keep ? 3 : 3 - na) &&
                                       matches(y, dt, ref, no, sum_tol(dt));
                            if (!one && ok) {
                                char lx[64];
                                layout_text(&ls[i], lx, sizeof lx);
                                snprintf(bad, sizeof bad,
                                         " (first failure %s mask %u keepdims %d \"%s\": %s)",
                                         dt_reduce_op_name((dt_reduce_op)ops[q]), mask, keep, lx,
                                         dt_last_error());
                            }
                            ok = ok && one;
                            dt_tensor_free(y);
                        }
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(
                ok, "reduce sum/mean/max/min %s %s: %d layouts%s%s", dt_dtype_name(dt),
                s ? "uneven" : "even", n,
                !dt_dtype_is_floating(dt) ? " (refused: DT_ERR_DTYPE naming the dtype)" : "", bad);
            free(hx);
        }
}

static void diff_shape_ops(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        const int64_t sh[2] = {5, 6};
        double hx[30], hy[30]; /* storage for 30 elements of any dtype */
        double ref[64];
        fill_host(dt, hx, 30, 10);
        fill_host(dt, hy, 30, 11);
        int n = layouts_for(m, 2, dt, ls);
        bool ok_t = true, ok_s = true, ok_c = true, ok_r = true;
        char bad[256] = "";
        for (int i = 0; i < n; i++) {
            if (narrow(dt) && i % 2)
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, hx), *y = NULL;
            /* transpose */
            const int perm[2] = {1, 0};
            for (int64_t r = 0; r < 6; r++)
                for (int64_t c = 0; c < 5; c++)
                    ref[r * 5 + c] = get(dt, hx, c * 6 + r);
            ok_t =
                ok_t && x && dt_transpose(x, perm, NULL, &y) == DT_OK && matches(y, dt, ref, 30, 0);
            dt_tensor_free(y);
            y = NULL;
            /* slice rows 1..4, columns 2..5 */
            const int64_t begin[2] = {1, 2}, size[2] = {3, 3};
            for (int64_t r = 0; r < 3; r++)
                for (int64_t c = 0; c < 3; c++)
                    ref[r * 3 + c] = get(dt, hx, (r + 1) * 6 + c + 2);
            ok_s = ok_s && x && dt_slice(x, begin, size, NULL, &y) == DT_OK &&
                   matches(y, dt, ref, 9, 0);
            dt_tensor_free(y);
            y = NULL;
            /* concat with itself and another layout's tensor, on both axes */
            for (int axis = 0; axis < 2; axis++) {
                dt_tensor *z = make_tensor(&ls[(i * 5 + axis) % n], dt, 2, sh, hy);
                const dt_tensor *xs[2] = {x, z};
                for (int64_t r = 0; r < (axis ? 5 : 10); r++)
                    for (int64_t c = 0; c < (axis ? 12 : 6); c++) {
                        int64_t w = axis ? 12 : 6;
                        bool first = axis ? c < 6 : r < 5;
                        ref[r * w + c] =
                            first ? get(dt, hx, r * 6 + c)
                                  : get(dt, hy, (axis ? r : r - 5) * 6 + (axis ? c - 6 : c));
                    }
                bool one = x && z && dt_concat(2, xs, axis, NULL, &y) == DT_OK &&
                           matches(y, dt, ref, 60, 0);
                if (!one && ok_c) {
                    char lx[64];
                    layout_text(&ls[i], lx, sizeof lx);
                    snprintf(bad, sizeof bad, " (concat failure axis %d \"%s\": %s)", axis, lx,
                             dt_last_error());
                }
                ok_c = ok_c && one;
                dt_tensor_free(y);
                dt_tensor_free(z);
                y = NULL;
            }
            /* reshape [5,6] -> [5,2,3] (expressible whenever axis 1 is unsharded or 2 | shards) */
            const int64_t rs[3] = {5, 2, 3};
            for (int64_t k = 0; k < 30; k++)
                ref[k] = get(dt, hx, k);
            dt_status st = x ? dt_reshape(x, 3, rs, NULL, &y) : DT_ERR_ARG;
            bool expressible = ls[i].axes[1] == DT_UNSHARDED || 2 % m->sizes[ls[i].axes[1]] == 0;
            ok_r = ok_r && (expressible ? st == DT_OK && matches(y, dt, ref, 30, 0)
                                        : st == DT_ERR_LAYOUT && strstr(dt_last_error(), "axis 1"));
            dt_tensor_free(y);
            dt_tensor_free(x);
        }
        const char *dn = dt_dtype_name(dt);
        DIFF_REPORT(ok_t, "transpose %s uneven: %d layouts", dn, n);
        DIFF_REPORT(ok_s, "slice %s uneven: %d layouts", dn, n);
        DIFF_REPORT(ok_c, "concat %s uneven: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_r, "reshape %s: %d layouts (local, or DT_ERR_LAYOUT where inexpressible)",
                    dn, n);
    }
}

/* Dtypes an op does not take: DT_ERR_DTYPE naming the dtype, nothing made. */
static void diff_dtype_errors(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    const int64_t sh[2] = {3, 3};
    double hb[9], hf[9];
    fill_host(DT_DTYPE_BOOL, hb, 9, 1);
    fill_host(DT_DTYPE_F32, hf, 9, 1);
    dt_tensor *b = make_tensor(&l, DT_DTYPE_BOOL, 2, sh, hb);
    dt_tensor *f = make_tensor(&l, DT_DTYPE_F32, 2, sh, hf), *r = NULL;
    bool ok = b && f;
    ok = ok && dt_matmul(b, b, NULL, &r) == DT_ERR_DTYPE && !r && strstr(dt_last_error(), "bool");
    ok = ok && dt_binary(DT_BINARY_ADD, b, b, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "bool");
    ok = ok && dt_binary(DT_BINARY_LOGICAL_AND, f, b, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "f32");
    ok = ok && dt_unary(DT_UNARY_EXP, b, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_unary(DT_UNARY_LOGICAL_NOT, f, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_where(f, f, f, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "condition is f32");
    ok = ok && dt_matmul(f, b, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_cast(f, (dt_dtype)DT_DTYPE_COUNT, NULL, &r) == DT_ERR_DTYPE && !r;
    /* a bool beside a number is promoted, not refused */
    ok = ok && dt_binary(DT_BINARY_ADD, f, b, NULL, &r) == DT_OK &&
         dt_tensor_dtype(r) == DT_DTYPE_F32;
    DIFF_REPORT(ok, "dtypes an op does not take: DT_ERR_DTYPE naming them (%s)", dt_last_error());
    dt_tensor_free(r);
    dt_tensor_free(b);
    dt_tensor_free(f);
}

/* copy_to_mesh: every layout (partial included) on m to layouts of another mesh over the same
 * devices (another shape where one exists), even and uneven, every dtype. */
static void diff_copy_to_mesh(const dt_mesh *m, const diff_opts *o)
{
    int size = 1;
    for (int a = 0; a < dt_mesh_num_axes(m); a++)
        size *= m->sizes[a];
    char spec[32];
    if (size % 2 == 0 && size > 2)
        snprintf(spec, sizeof spec, "p=%d,q=2", size / 2);
    else
        snprintf(spec, sizeof spec, "p=%d", size);
    dt_mesh *m2 = NULL;
    bool ok_mesh = dt_mesh_create_from_string(spec, dt_mesh_device_type(m), &m2) == DT_OK;
    DIFF_REPORT(ok_mesh, "copy_to_mesh: a second mesh %s", spec);
    if (!ok_mesh)
        return;
    dt_layout ls[MAX_LAYOUTS], lt[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 12}, {5, 7}};
    int n = all_layouts(m, 2, true, ls), n2 = all_layouts(m2, 2, true, lt);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        int s = d % 2;
        char bad[256] = "";
        bool ok = move_pairs(ls, n, lt, n2, true, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "copy_to_mesh %s %s to %s: layouts %d x %d%s", dt_dtype_name(dt),
                    s ? "uneven" : "even", spec, n, n2, bad);
    }
    dt_mesh_free(m2);
    /* to a mesh of the other device type with the same axes over as many devices (CPU <->
     * CUDA), and back, when this client has those devices */
    dt_device_type other = dt_mesh_device_type(m) == DT_DEVICE_CPU ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    if (dt_num_global_devices(other) != size)
        return;
    const char *names[DT_MAX_MESH_AXES];
    for (int a = 0; a < dt_mesh_num_axes(m); a++)
        names[a] = dt_mesh_axis_name(m, a);
    dt_mesh *mo = NULL;
    ok_mesh = dt_mesh_create(dt_mesh_num_axes(m), names, m->sizes, other, &mo) == DT_OK;
    DIFF_REPORT(ok_mesh, "copy_to_mesh: a %s mesh of the same axes", dt_device_type_name(other));
    if (!ok_mesh)
        return;
    int no = all_layouts(mo, 2, true, lt);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        int s = d % 2;
        char bad[256] = "";
        bool ok = move_pairs(ls, n, lt, no, true, dt, shapes[s], o, bad, sizeof bad) &&
                  move_pairs(lt, no, ls, n, true, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "copy_to_mesh %s %s between %s and %s meshes: layouts %d x %d%s",
                    dt_dtype_name(dt), s ? "uneven" : "even",
                    dt_device_type_name(dt_mesh_device_type(m)), dt_device_type_name(other), n, no,
                    bad);
    }
    dt_mesh_free(mo);
}

#endif /* DT_TEST_DIFF_OPS_ELEMENTWISE_H */
