/* The differential suite (tests/unit/diff_core.h): row-wise ops (softmax, log_softmax, logsumexp,
 * layer_norm, rms_norm, argmax, argmin, cumsum). Included by diff_core.h, after the helpers,
 * references and options it uses. */
#ifndef DT_TEST_DIFF_OPS_ROWWISE_H
#define DT_TEST_DIFF_OPS_ROWWISE_H

/* ---- row-wise ops: softmax, log_softmax, logsumexp, layer_norm, rms_norm, argmax, argmin,
 * cumsum (spmd/ops/softmax.c, norm.c, arg_reduce.c, cumsum.c) --------------------------------- */

/* Layouts the row-wise sections run: every one when thorough (every third for the 16-bit
 * floats and the 8-bit integers); otherwise about five spread over the list (the first is
 * replicated, later ones shard the axes and, for most dtypes, hold partial sums). */
static bool row_pick(const diff_opts *o, dt_dtype dt, int i, int n)
{
    if (o->thorough)
        return !narrow(dt) || i % 3 == 0;
    int stride = n > 5 ? n / 5 : 1;
    return i % stride == 0 && (!narrow(dt) || (i / stride) % 2 == 0);
}

/* Tolerance of the floating row-wise results against double references: the kernels compute
 * in f32 (f64 for f64) and round once, so a 16-bit result may be one unit in the last place
 * away (2^-8 relative for bf16, 2^-11 for f16). */
static double row_tol(dt_dtype dt)
{
    return dt == DT_DTYPE_BF16  ? 1e-2
           : dt == DT_DTYPE_F16 ? 2e-3
           : dt == DT_DTYPE_F32 ? 1e-5
                                : 1e-12;
}

/* Rank-3 index helpers: element (i0, i1, i2) of shape sh, and its row (the index of the
 * keepdims result) when the axes of `mask` are reduced. */
static int64_t at3(const int64_t sh[3], int64_t i0, int64_t i1, int64_t i2)
{
    return (i0 * sh[1] + i1) * sh[2] + i2;
}

static int64_t row3(const int64_t sh[3], unsigned mask, const int64_t ii[3])
{
    int64_t k = 0;
    for (int a = 0; a < 3; a++)
        k = k * ((mask & (1u << a)) ? 1 : sh[a]) + ((mask & (1u << a)) ? 0 : ii[a]);
    return k;
}

/* softmax and log_softmax along `axis`, logsumexp over `mask`, of x (rank 3) in double:
 * sm and lsm of x's size, lse of the keepdims size. */
static void ref_softmax(const double *x, const int64_t sh[3], unsigned mask, double *sm,
                        double *lsm, double *lse)
{
    int64_t ne = sh[0] * sh[1] * sh[2], nr = 1;
    for (int a = 0; a < 3; a++)
        nr *= (mask & (1u << a)) ? 1 : sh[a];
    double *mx = malloc(sizeof(double) * (size_t)nr), *s = malloc(sizeof(double) * (size_t)nr);
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        s[r] = 0;
    }
    for (int pass = 0; pass < 3; pass++)
        for (int64_t e = 0; e < ne; e++) {
            int64_t ii[3] = {e / (sh[1] * sh[2]), e / sh[2] % sh[1], e % sh[2]};
            int64_t r = row3(sh, mask, ii);
            if (pass == 0)
                mx[r] = fmax(mx[r], x[e]);
            else if (pass == 1)
                s[r] += exp(x[e] - mx[r]);
            else if (sm) {
                sm[e] = exp(x[e] - mx[r]) / s[r];
                lsm[e] = x[e] - mx[r] - log(s[r]);
            }
        }
    for (int64_t r = 0; lse && r < nr; r++)
        lse[r] = mx[r] + log(s[r]);
    free(mx);
    free(s);
}

static void diff_softmax(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[64], xv[64], sm[64], lsm[64], lse[64];
            fill_host(dt, hx, ne, 13);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            if (!dt_dtype_is_floating(dt)) {
                /* softmax is floating point only, said clearly */
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_softmax(x, -1, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), dt_dtype_name(dt)) &&
                     dt_log_softmax(x, 0, NULL, &y) == DT_ERR_DTYPE && !y &&
                     dt_logsumexp(x, 0, NULL, 0, NULL, &y) == DT_ERR_DTYPE && !y;
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "softmax, log_softmax, logsumexp of %s: DT_ERR_DTYPE (%s)",
                                dt_dtype_name(dt), dt_last_error());
                continue;
            }
            double tol = row_tol(dt);
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int axis = 0; axis < 3; axis++) {
                    if (!o->thorough && (i + axis) % 2)
                        continue;
                    ref_softmax(xv, sh, 1u << axis, sm, lsm, NULL);
                    dt_tensor *y = NULL, *z = NULL;
                    bool one =
                        x && dt_softmax(x, axis - 3 * (axis % 2), NULL, &y) == DT_OK &&
                        dt_layout_equal(dt_tensor_layout(y), &kept) &&
                        matches(y, dt, sm, ne, tol) && dt_log_softmax(x, axis, NULL, &z) == DT_OK &&
                        dt_layout_equal(dt_tensor_layout(z), &kept) && matches(z, dt, lsm, ne, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure axis %d \"%s\": %s)", axis, lx,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                    dt_tensor_free(z);
                }
                for (unsigned mask = 1; mask < 8; mask++) {
                    if ((mask + (unsigned)i) % (o->thorough ? 2 : 5) && mask != 5)
                        continue;
                    int axes[3], na = 0;
                    for (int a = 0; a < 3; a++)
                        if (mask & (1u << a))
                            axes[na++] = a;
                    ref_softmax(xv, sh, mask, NULL, NULL, lse);
                    int64_t nr = 1;
                    for (int a = 0; a < 3; a++)
                        nr *= (mask & (1u << a)) ? 1 : sh[a];
                    int keep = (int)(mask + (unsigned)i) % 2;
                    dt_tensor *y = NULL;
                    bool one =
                        x && dt_logsumexp(x, mask == 7 ? 0 : na, axes, keep, NULL, &y) == DT_OK &&
                        dt_tensor_rank(y) == (keep ? 3 : 3 - na) && matches(y, dt, lse, nr, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure logsumexp mask %u \"%s\": %s)",
                                 mask, lx, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            /* requested result layouts, from a sharded x */
            ref_softmax(xv, sh, 2, sm, lsm, NULL);
            dt_tensor *x = make_tensor(&ls[n - 1], dt, 3, sh, hx);
            for (int j = 0; j < n; j += o->thorough ? 1 : 7) {
                dt_op_options req = {.layout = &ls[j]};
                dt_tensor *y = NULL;
                bool one = x && dt_softmax(x, 1, &req, &y) == DT_OK &&
                           dt_layout_equal(dt_tensor_layout(y), &ls[j]) &&
                           matches(y, dt, sm, ne, tol);
                if (!one && ok)
                    snprintf(bad, sizeof bad, " (requested layout %d: %s)", j, dt_last_error());
                ok = ok && one;
                dt_tensor_free(y);
            }
            dt_tensor_free(x);
            DIFF_REPORT(ok, "softmax, log_softmax, logsumexp %s %s: %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* layer_norm (gamma and beta, gamma only, neither) and rms_norm (with and without gamma) of x
 * [rows.., last] in double; gamma and beta NULL for none. */
static void ref_norm(bool layer, const double *x, int64_t rows, int64_t n, const double *gamma,
                     const double *beta, double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n;
        double mu = 0, v = 0;
        for (int64_t j = 0; layer && j < n; j++)
            mu += xr[j] / (double)n;
        for (int64_t j = 0; j < n; j++)
            v += (xr[j] - mu) * (xr[j] - mu) / (double)n;
        for (int64_t j = 0; j < n; j++)
            y[r * n + j] =
                (xr[j] - mu) / sqrt(v + eps) * (gamma ? gamma[j] : 1) + (beta ? beta[j] : 0);
    }
}

static void diff_norm(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{2, 3, 8}, {3, 2, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2], last = sh[2];
            double hx[64], hg[8], hb[8], xv[64], gv[8], bv[8], ref[64];
            fill_host(dt, hx, ne, 14);
            fill_host(dt, hg, last, 15);
            fill_host(dt, hb, last, 16);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            for (int64_t k = 0; k < last; k++) {
                gv[k] = get(dt, hg, k);
                bv[k] = get(dt, hb, k);
            }
            int n = layouts_for(m, 3, dt, ls), n1 = layouts_for(m, 1, dt, l1);
            bool ok = true;
            char bad[256] = "";
            if (!dt_dtype_is_floating(dt)) {
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_layer_norm(x, NULL, NULL, 1e-5, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), dt_dtype_name(dt)) &&
                     dt_rms_norm(x, NULL, 1e-5, NULL, &y) == DT_ERR_DTYPE && !y;
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "layer_norm, rms_norm of %s: DT_ERR_DTYPE (%s)",
                                dt_dtype_name(dt), dt_last_error());
                continue;
            }
            double tol = row_tol(dt) * (dt == DT_DTYPE_F64 ? 1 : 2), eps = 0.25;
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_tensor *g = make_tensor(&l1[(i * 5 + 1) % n1], dt, 1, &last, hg);
                dt_tensor *b = make_tensor(&l1[(i * 3 + 2) % n1], dt, 1, &last, hb);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int v = 0; v < 5; v++) {
                    if (!o->thorough && (i + v) % 2)
                        continue;
                    bool layer = v < 3;
                    const dt_tensor *tg = v == 2 || v == 4 ? NULL : g, *tb = v == 0 ? b : NULL;
                    ref_norm(layer, xv, sh[0] * sh[1], last, tg ? gv : NULL, tb ? bv : NULL, eps,
                             ref);
                    dt_tensor *y = NULL;
                    dt_status st = layer ? dt_layer_norm(x, tg, tb, eps, NULL, &y)
                                         : dt_rms_norm(x, tg, eps, NULL, &y);
                    bool one = x && g && b && st == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(y), &kept) &&
                               matches(y, dt, ref, ne, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure variant %d \"%s\": %s)", v, lx,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
                dt_tensor_free(g);
                dt_tensor_free(b);
            }
            DIFF_REPORT(ok, "layer_norm, rms_norm %s %s: %d runs over %d layouts of x%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* numpy's argmax / argmin along `axis` of a rank-3 x: the first extremum, the first NaN. */
static void ref_argext(bool is_max, const double *x, const int64_t sh[3], int axis, double *out)
{
    int64_t ii[3], k = 0;
    for (ii[0] = 0; ii[0] < (axis == 0 ? 1 : sh[0]); ii[0]++)
        for (ii[1] = 0; ii[1] < (axis == 1 ? 1 : sh[1]); ii[1]++)
            for (ii[2] = 0; ii[2] < (axis == 2 ? 1 : sh[2]); ii[2]++) {
                int64_t best = 0, jj[3] = {ii[0], ii[1], ii[2]};
                double bv = x[at3(sh, jj[0], jj[1], jj[2])];
                for (int64_t j = 1; j < sh[axis] && !isnan(bv); j++) {
                    jj[axis] = j;
                    double v = x[at3(sh, jj[0], jj[1], jj[2])];
                    if (isnan(v) || (is_max ? v > bv : v < bv)) {
                        bv = v;
                        best = j;
                    }
                }
                out[k++] = (double)best;
            }
}

static void diff_argmax(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[128], xv[128], ref[64];
            fill_host(dt, hx, ne, 17); /* repeated values: ties */
            if (dt_dtype_is_floating(dt))
                for (int64_t k = 5; k < ne; k += 11) /* NaNs in some rows, two in a few */
                    put(dt, hx, k, NAN);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            int runs = 0;
            for (int i = 0; i < n; i++) {
                /* NaN terms do not sum to NaN rows as one NaN value: floats skip partial x */
                if (!row_pick(o, dt, i, n) || (dt_dtype_is_floating(dt) && ls[i].partial))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                for (int axis = 0; axis < 3; axis++)
                    for (int q = 0; q < 2; q++) {
                        if ((i + axis + q) % 2 && !(o->thorough && !narrow(dt)))
                            continue;
                        bool is_max = (i + axis + q) % 2 == 0;
                        dt_dtype to = q ? DT_DTYPE_I32 : DT_DTYPE_I64;
                        ref_argext(is_max, xv, sh, axis, ref);
                        int64_t nr = ne / sh[axis];
                        dt_tensor *y = NULL;
                        dt_status st = x ? (is_max ? dt_argmax : dt_argmin)(x, axis, to, NULL, &y)
                                         : DT_ERR_ARG;
                        bool one = st == DT_OK && dt_tensor_dtype(y) == to &&
                                   dt_tensor_rank(y) == 2 && matches(y, to, ref, nr, 0);
                        /* the result keeps x's other axes' sharding */
                        const dt_layout *yl = y ? dt_tensor_layout(y) : NULL;
                        for (int a = 0, b = 0; one && a < 3; a++)
                            if (a != axis)
                                one = yl->axes[b++] == ls[i].axes[a];
                        runs++;
                        if (!one && ok) {
                            char lx[64];
                            layout_text(&ls[i], lx, sizeof lx);
                            snprintf(bad, sizeof bad, " (first failure %s axis %d \"%s\": %s)",
                                     is_max ? "argmax" : "argmin", axis, lx, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(y);
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "argmax, argmin %s %s (ties%s): %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even",
                        dt_dtype_is_floating(dt) ? ", NaN" : "", runs, n, bad);
        }
}

/* tf.math.cumsum along `axis` of a rank-3 x (flags: 1 exclusive, 2 reverse), in double. */
static void ref_cumsum(const double *x, const int64_t sh[3], int axis, int flags, double *y)
{
    int64_t ii[3];
    for (ii[0] = 0; ii[0] < (axis == 0 ? 1 : sh[0]); ii[0]++)
        for (ii[1] = 0; ii[1] < (axis == 1 ? 1 : sh[1]); ii[1]++)
            for (ii[2] = 0; ii[2] < (axis == 2 ? 1 : sh[2]); ii[2]++) {
                double acc = 0;
                int64_t jj[3] = {ii[0], ii[1], ii[2]};
                for (int64_t q = 0; q < sh[axis]; q++) {
                    jj[axis] = flags & 2 ? sh[axis] - 1 - q : q;
                    int64_t e = at3(sh, jj[0], jj[1], jj[2]);
                    if (flags & 1) {
                        y[e] = acc;
                        acc += x[e];
                    } else {
                        acc += x[e];
                        y[e] = acc;
                    }
                }
            }
}

static void diff_cumsum(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[128], xv[128], ref[128];
            fill_host(dt, hx, ne, 18);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            if (is_bool(dt)) {
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_cumsum(x, 0, 0, 0, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), "bool");
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "cumsum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                continue;
            }
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int axis = 0; axis < 3; axis++)
                    for (int flags = 0; flags < 4; flags++) {
                        if ((i + axis + flags) % (o->thorough && !narrow(dt) ? 2 : 4))
                            continue;
                        ref_cumsum(xv, sh, axis, flags, ref);
                        dt_tensor *y = NULL;
                        bool one = x &&
                                   dt_cumsum(x, axis, flags & 1, flags & 2, NULL, &y) == DT_OK &&
                                   dt_layout_equal(dt_tensor_layout(y), &kept) &&
                                   matches(y, dt, ref, ne, 0);
                        runs++;
                        if (!one && ok) {
                            char lx[64];
                            layout_text(&ls[i], lx, sizeof lx);
                            snprintf(bad, sizeof bad,
                                     " (first failure axis %d flags %d \"%s\": %s)", axis, flags,
                                     lx, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(y);
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "cumsum %s %s (exclusive, reverse): %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* Bad arguments of the row-wise ops: DT_ERR_* naming the values, nothing made. */
static void diff_rowwise_errors(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l2, l1;
    dt_layout_replicated(m, 2, &l2);
    dt_layout_replicated(m, 1, &l1);
    const int64_t sh[2] = {3, 4}, s3[1] = {3};
    double hf[12];
    fill_host(DT_DTYPE_F32, hf, 12, 1);
    dt_tensor *x = make_tensor(&l2, DT_DTYPE_F32, 2, sh, hf);
    dt_tensor *g3 = make_tensor(&l1, DT_DTYPE_F32, 1, s3, hf);
    dt_tensor *g4d = make_tensor(&l1, DT_DTYPE_F64, 1, sh + 1, hf), *r = NULL;
    bool ok = x && g3 && g4d;
    ok = ok && dt_softmax(x, 2, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "axis 2") && strstr(dt_last_error(), "rank 2");
    ok = ok && dt_logsumexp(x, 2, (const int[]){1, -1}, 0, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "twice");
    ok = ok && dt_argmax(x, -3, DT_DTYPE_I64, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "axis -3");
    ok = ok && dt_argmax(x, 0, DT_DTYPE_F32, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "index dtype f32");
    ok = ok && dt_cumsum(x, 5, 0, 0, NULL, &r) == DT_ERR_ARG && !r;
    ok = ok && dt_layer_norm(x, g3, NULL, 1e-5, NULL, &r) == DT_ERR_SHAPE && !r &&
         strstr(dt_last_error(), "gamma is [3]");
    ok = ok && dt_layer_norm(x, NULL, g4d, 1e-5, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "beta is f64");
    ok = ok && dt_rms_norm(x, NULL, -1.0, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "epsilon");
    ok = ok && dt_softmax(NULL, 0, NULL, &r) == DT_ERR_ARG && !r;
    DIFF_REPORT(ok, "row-wise ops' bad arguments: DT_ERR_* naming them (%s)", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(g3);
    dt_tensor_free(g4d);
}

#endif /* DT_TEST_DIFF_OPS_ROWWISE_H */
