/* The differential suite (tests/unit/diff_core.h): creation (fill, arange, random), relayout,
 * matmul (plain, chunked, batched). Included by diff_core.h, after the helpers, references and
 * options it uses. */
#ifndef DT_TEST_DIFF_OPS_BASIC_H
#define DT_TEST_DIFF_OPS_BASIC_H

static void diff_creation(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{6, 12}, {5, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            bool fl = dt_dtype_is_floating(dt), wide = dt == DT_DTYPE_F64;
            int n = layouts_for(m, 2, dt, ls);
            int64_t ne = shapes[s][0] * shapes[s][1];
            double *ref = malloc(sizeof(double) * (size_t)ne);
            bool ok_fill = true, ok_u = true, ok_n = true, ok_ar = true, have_normal = false;
            void *normal_bits = malloc((size_t)ne * 8);
            /* a negative fill where the dtype holds it (u8 does not: dt_fill refuses it) */
            double value = is_bool(dt) ? 1.0 : dt == DT_DTYPE_U8 ? 3.0 : is_int(dt) ? -3.0 : 2.5;
            double step = is_int(dt) ? -2.0 : -0.5;
            for (int li = 0; li < n; li++) {
                dt_op_options op = {.layout = &ls[li]};
                dt_tensor *t = NULL;
                for (int64_t i = 0; i < ne; i++)
                    ref[i] = value;
                ok_fill = ok_fill && dt_fill(dt, 2, shapes[s], value, &op, &t) == DT_OK &&
                          matches(t, dt, ref, ne, 0);
                dt_tensor_free(t);
                t = NULL;
                if (ls[li].axes[1] == DT_UNSHARDED) {
                    dt_layout l1 = ls[li];
                    l1.rank = 1;
                    dt_op_options o1 = {.layout = &l1};
                    for (int64_t i = 0; i < shapes[s][0]; i++)
                        ref[i] = 3.0 + step * (double)i;
                    dt_status st = dt_arange(dt, shapes[s][0], 3.0, step, &o1, &t);
                    ok_ar = ok_ar &&
                            (is_bool(dt) ? st == DT_ERR_DTYPE && !t
                                         : st == DT_OK && matches(t, dt, ref, shapes[s][0], 0));
                    dt_tensor_free(t);
                    t = NULL;
                }
                if (!fl) { /* random numbers are floating point only, said clearly */
                    dt_status su = dt_random_uniform(dt, 2, shapes[s], 42, 7, -1.0, 2.0, &op, &t);
                    ok_u = ok_u && su == DT_ERR_DTYPE && !t &&
                           strstr(dt_last_error(), dt_dtype_name(dt)) &&
                           strstr(dt_last_error(), "f32, f64, bf16 or f16");
                    dt_status sn = dt_random_normal(dt, 2, shapes[s], 43, 9, 0.5, 2.0, &op, &t);
                    ok_n = ok_n && sn == DT_ERR_DTYPE && !t &&
                           strstr(dt_last_error(), dt_dtype_name(dt));
                    continue;
                }
                if (ls[li].partial)
                    continue; /* random terms are not partial sums of anything */
                /* f32, bf16, f16: the f32 stream (the 16-bit ones rounded from it) */
                for (int64_t i = 0; i < ne; i++) {
                    double v = -1.0 + 3.0 * ref_random(false, wide, 42, 7, (uint64_t)i);
                    ref[i] = wide ? v : (double)(float)v;
                }
                ok_u = ok_u &&
                       dt_random_uniform(dt, 2, shapes[s], 42, 7, -1.0, 2.0, &op, &t) == DT_OK &&
                       matches(t, dt, ref, ne, 0);
                dt_tensor_free(t);
                t = NULL;
                /* Box-Muller's log and cos are the library's own (the same bits on CPU and
                 * GPU), so against libm's within a few ulps, and bitwise the same tensor in
                 * every layout */
                for (int64_t i = 0; i < ne; i++) {
                    double v = 0.5 + 2.0 * ref_random(true, wide, 43, 9, (uint64_t)i);
                    ref[i] = wide ? v : (double)(float)v;
                }
                ok_n = ok_n &&
                       dt_random_normal(dt, 2, shapes[s], 43, 9, 0.5, 2.0, &op, &t) == DT_OK &&
                       matches(t, dt, ref, ne, wide ? 1e-14 : 0) &&
                       same_bits(t, dt, ne, normal_bits, &have_normal);
                dt_tensor_free(t);
            }
            DIFF_REPORT(ok_fill, "fill %s %s: %d layouts", dt_dtype_name(dt), s ? "uneven" : "even",
                        n);
            DIFF_REPORT(ok_u, "random_uniform %s %s: %s", dt_dtype_name(dt), s ? "uneven" : "even",
                        !fl ? "DT_ERR_DTYPE naming the dtype"
                            : "bitwise the Random123 stream in every layout");
            DIFF_REPORT(ok_n, "random_normal %s %s: %s", dt_dtype_name(dt), s ? "uneven" : "even",
                        !fl ? "DT_ERR_DTYPE naming the dtype"
                            : "the Random123 stream with libm's Box-Muller within 1e-14, "
                              "bitwise the same in every layout");
            DIFF_REPORT(ok_ar, "arange %s %s%s", dt_dtype_name(dt), s ? "uneven" : "even",
                        is_bool(dt) ? ": DT_ERR_DTYPE" : "");
            free(ref);
            free(normal_bits);
        }
}

/* Move a tensor from each layout of `from` to layouts of `to` (pairs by pick_dt) with
 * dt_relayout, or dt_copy_to_mesh when `copy`; every result must lie as asked and hold the
 * same global values. */
static bool move_pairs(const dt_layout from[], int nf, const dt_layout to[], int nt, bool copy,
                       dt_dtype dt, const int64_t shape[2], const diff_opts *o, char *bad,
                       size_t bl)
{
    int64_t ne = shape[0] * shape[1];
    double *ref = malloc(sizeof(double) * (size_t)ne);
    void *host = malloc((size_t)ne * 8);
    fill_host(dt, host, ne, copy ? 12 : 1);
    for (int64_t i = 0; i < ne; i++)
        ref[i] = get(dt, host, i);
    int most = nf > nt ? nf : nt;
    bool ok = true;
    for (int i = 0; i < nf; i++) {
        if (is_bool(dt) && from[i].partial)
            continue;
        dt_tensor *x = make_tensor(&from[i], dt, 2, shape, host);
        for (int j = 0; j < nt; j++) {
            if (!pick_dt(o, dt, i, j, most) || (is_int(dt) && !pick(&(diff_opts){0}, i, j, most)) ||
                (is_bool(dt) && to[j].partial))
                continue;
            dt_tensor *y = NULL;
            dt_status st = !x     ? DT_ERR_ARG
                           : copy ? dt_copy_to_mesh(x, &to[j], NULL, &y)
                                  : dt_relayout(x, &to[j], NULL, &y);
            bool one = st == DT_OK && dt_layout_equal(dt_tensor_layout(y), &to[j]) &&
                       matches(y, dt, ref, ne, 0);
            if (!one && ok) {
                char a[64], b[64];
                layout_text(&from[i], a, sizeof a);
                layout_text(&to[j], b, sizeof b);
                snprintf(bad, bl, " (first failure \"%s\" -> \"%s\": %s)", a, b, dt_last_error());
            }
            ok = ok && one;
            dt_tensor_free(y);
        }
        dt_tensor_free(x);
    }
    free(ref);
    free(host);
    return ok;
}

static void diff_relayout(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 12}, {5, 7}};
    int n = all_layouts(m, 2, true, ls);
    /* even and uneven by turns */
    for (int q = 0; q < NUM_DTYPES; q++) {
        int s = q % 2;
        dt_dtype dt = dtypes[q];
        char bad[256] = "";
        bool ok = move_pairs(ls, n, ls, n, false, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "relayout %s %s: %s of %d layouts%s", dt_dtype_name(dt),
                    s ? "uneven" : "even",
                    o->thorough && !is_int(dt) && !narrow(dt) ? "every pair" : "pairs", n, bad);
    }
}

static void ref_matmul(const double *a, const double *b, double *c, int64_t M, int64_t K, int64_t N,
                       bool ta, bool tb)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t q = 0; q < K; q++)
                s += (ta ? a[q * M + i] : a[i * K + q]) * (tb ? b[j * K + q] : b[q * N + j]);
            c[i * N + j] = s;
        }
}

/* Host operands of op(A)[M, K] @ op(B)[K, N] in dtype dt (filled from seeds sa and sb) and
 * their product computed in double from the values as stored. */
typedef struct mm_host {
    void *a, *b;
    double *c;
} mm_host;

static mm_host mm_host_make(dt_dtype dt, int64_t M, int64_t K, int64_t N, bool ta, bool tb, int sa,
                            int sb)
{
    mm_host h = {malloc((size_t)(M * K) * 8 + 8), malloc((size_t)(K * N) * 8 + 8),
                 malloc(sizeof(double) * (size_t)(M * N) + 8)};
    double *ra = malloc(sizeof(double) * (size_t)(M * K) + 8),
           *rb = malloc(sizeof(double) * (size_t)(K * N) + 8);
    fill_host(dt, h.a, M * K, sa);
    fill_host(dt, h.b, K * N, sb);
    for (int64_t i = 0; i < M * K; i++)
        ra[i] = get(dt, h.a, i);
    for (int64_t i = 0; i < K * N; i++)
        rb[i] = get(dt, h.b, i);
    ref_matmul(ra, rb, h.c, M, K, N, ta, tb);
    free(ra);
    free(rb);
    return h;
}

static void mm_host_free(mm_host *h)
{
    free(h->a);
    free(h->b);
    free(h->c);
}

static void diff_matmul(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    /* {M, K, N}: even and uneven */
    const int64_t dims[2][3] = {{4, 12, 6}, {5, 7, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            if (is_bool(dt))
                continue; /* refused: diff_dtype_errors */
            if ((is_int(dt) || narrow(dt)) && d % 2 != s)
                continue; /* integer and 16-bit gemm: one of even and uneven each */
            int64_t M = dims[s][0], K = dims[s][1], N = dims[s][2];
            for (int tr = 0; tr < 2; tr++) {
                bool ta = tr == 1, tb = tr == 1;
                int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {tb ? N : K, tb ? K : N};
                mm_host h = mm_host_make(dt, M, K, N, ta, tb, 2, 3);
                void *ha = h.a, *hb = h.b;
                const double *rc = h.c;
                int n = all_layouts(m, 2, true, ls);
                bool ok = true;
                char bad[256] = "";
                dt_op_options op = {.transpose_a = ta, .transpose_b = tb};
                for (int i = 0; i < n; i++) {
                    dt_tensor *a = make_tensor(&ls[i], dt, 2, sa, ha);
                    for (int j = 0; j < n; j++) {
                        if (!pick_dt(o, dt, i, j, n) || (tr && (i + j) % 3))
                            continue;
                        dt_tensor *b = make_tensor(&ls[j], dt, 2, sb, hb), *c = NULL;
                        bool one = a && b && dt_matmul(a, b, &op, &c) == DT_OK &&
                                   matches(c, dt, rc, M * N, sum_tol(dt));
                        if (!one && ok) {
                            char x[64], y[64];
                            layout_text(&ls[i], x, sizeof x);
                            layout_text(&ls[j], y, sizeof y);
                            snprintf(bad, sizeof bad, " (first failure a \"%s\" b \"%s\": %s)", x,
                                     y, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(b);
                        dt_tensor_free(c);
                    }
                    dt_tensor_free(a);
                }
                /* every requested output layout, from a fixed pair of operands */
                dt_tensor *a = make_tensor(&ls[n > 1 ? 1 : 0], dt, 2, sa, ha);
                dt_tensor *b = make_tensor(&ls[n - 1], dt, 2, sb, hb);
                for (int k = 0; k < n; k++) {
                    dt_op_options oo = op;
                    oo.layout = &ls[k];
                    dt_tensor *c = NULL;
                    bool one = a && b && dt_matmul(a, b, &oo, &c) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(c), &ls[k]) &&
                               matches(c, dt, rc, M * N, sum_tol(dt));
                    if (!one && ok) {
                        char x[64];
                        layout_text(&ls[k], x, sizeof x);
                        snprintf(bad, sizeof bad, " (first failure: requested \"%s\": %s)", x,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(c);
                }
                dt_tensor_free(a);
                dt_tensor_free(b);
                DIFF_REPORT(ok, "matmul %s %s%s: layouts of a, b and the result%s",
                            dt_dtype_name(dt), s ? "uneven" : "even", ta ? " transposed" : "", bad);
                mm_host_free(&h);
            }
        }
}

/* Contracting axis and the result's rows on one mesh axis: the expansion reduce-scatters the
 * partial product into rows in chunks (spmd/ops/matmul.c), each a gemm of a block of op(A)'s
 * rows into a temporary and a reduce-scatter into rows of the output. For each mesh axis of
 * more than one device (columns on the next axis, when there is one): even rows, uneven ones
 * (M mod P of 1 and P - 1), fewer rows than devices (empty blocks), A transposed, and the
 * gemm kernels of every kind (BLAS f32 and f64, widened bf16, integer loops); K is large
 * enough that the reduce-scatter is the plan taken. Against a host GEMM in double. */
static void diff_matmul_chunked(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    int na = dt_mesh_num_axes(m);
    const dt_dtype dts[4] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_I32};
    for (int ax = 0; ax < na; ax++) {
        int P = m->sizes[ax], nx = na > 1 ? (ax + 1) % na : -1;
        if (P < 2)
            continue;
        /* {M, K, N, transposed a} */
        const int64_t dims[5][4] = {{8 * P, 1536, 256, 0},
                                    {8 * P + 1, 1536, 200, 1},
                                    {8 * P + P - 1, 1500, 250, 0},
                                    {P - 1, 3000, 64, 0},
                                    {3 * P + 1, 2048, 128, 1}};
        bool ok = true;
        char bad[512] = "";
        for (int q = 0; q < 5; q++) {
            int64_t M = dims[q][0], K = dims[q][1], N = dims[q][2];
            bool ta = dims[q][3] != 0;
            dt_dtype dt = dts[q % 4];
            if (q == 4)
                dt = DT_DTYPE_F32;
            /* a: [M, K] (stored [K, M] when transposed), k on ax; b: [K, N], k on ax and n on
             * the next axis; c: rows on ax */
            dt_layout la = {.mesh = m, .rank = 2, .partial_op = DT_REDUCE_SUM}, lb = la, lc = la;
            for (int i = 0; i < DT_MAX_RANK; i++)
                la.axes[i] = lb.axes[i] = lc.axes[i] = DT_UNSHARDED;
            la.axes[ta ? 0 : 1] = ax;
            lb.axes[0] = ax;
            lc.axes[0] = ax;
            if (nx >= 0)
                lb.axes[1] = lc.axes[1] = nx;
            int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {K, N};
            mm_host h = mm_host_make(dt, M, K, N, ta, false, 6, 7);
            dt_tensor *a = make_tensor(&la, dt, 2, sa, h.a), *b = make_tensor(&lb, dt, 2, sb, h.b);
            dt_tensor *c = NULL;
            char *text = NULL;
            size_t len = 0;
            FILE *mem = open_memstream(&text, &len);
            dt_op_options op = {.transpose_a = ta, .layout = &lc, .program = mem};
            bool one = a && b && mem && dt_matmul(a, b, &op, &c) == DT_OK;
            if (mem)
                fclose(mem);
            /* the chunks are in the program (one row cannot be chunked) */
            bool chunked = M < 2 || (text && strstr(text, "chunk 1 of"));
            one = one && dt_layout_equal(dt_tensor_layout(c), &lc) &&
                  matches(c, dt, h.c, M * N, sum_tol(dt));
            if ((!one || !chunked) && ok)
                snprintf(bad, sizeof bad,
                         " (first failure: axis %d, %s [%lld,%lld]%s @ [%lld,%lld]%s: %s)", ax,
                         dt_dtype_name(dt), (long long)M, (long long)K, ta ? "^T" : "",
                         (long long)K, (long long)N, one ? ", not chunked" : "",
                         one && text ? text : dt_last_error());
            ok = ok && one && chunked;
            free(text);
            dt_tensor_free(a);
            dt_tensor_free(b);
            dt_tensor_free(c);
            mm_host_free(&h);
        }
        DIFF_REPORT(ok,
                    "matmul reduce-scattered into rows on mesh axis %d (chunked): even, "
                    "uneven, empty blocks, transposed a%s",
                    ax, bad);
    }
}

static void diff_batch_matmul(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l3[MAX_LAYOUTS], l2[MAX_LAYOUTS];
    const int64_t B = 3, M = 5, K = 4, N = 3;
    dt_dtype dt = DT_DTYPE_F64;
    int64_t sa[3] = {B, M, K}, sb[3] = {B, K, N}, sb2[2] = {K, N};
    double ha[60], hb[36], hc[45];
    fill_host(dt, ha, B * M * K, 4);
    fill_host(dt, hb, B * K * N, 5);
    int n3 = all_layouts(m, 3, false, l3), n2 = all_layouts(m, 2, false, l2);
    bool ok = true;
    for (int shared = 0; shared < 2; shared++) {
        for (int b = 0; b < B; b++)
            ref_matmul(ha + b * M * K, hb + (shared ? 0 : b * K * N), hc + b * M * N, M, K, N,
                       false, false);
        for (int i = 0; i < n3; i++) {
            dt_tensor *a = make_tensor(&l3[i], dt, 3, sa, ha);
            int nb = shared ? n2 : n3;
            for (int j = 0; j < nb; j += 3) {
                dt_tensor *bt = shared ? make_tensor(&l2[j], dt, 2, sb2, hb)
                                       : make_tensor(&l3[j], dt, 3, sb, hb);
                dt_tensor *c = NULL;
                ok = ok && a && bt && dt_matmul(a, bt, NULL, &c) == DT_OK &&
                     matches(c, dt, hc, B * M * N, 1e-5);
                dt_tensor_free(bt);
                dt_tensor_free(c);
            }
            dt_tensor_free(a);
        }
    }
    DIFF_REPORT(ok, "batch matmul f64 (batched and shared b), uneven: %d layouts of a", n3);
}

#endif /* DT_TEST_DIFF_OPS_BASIC_H */
