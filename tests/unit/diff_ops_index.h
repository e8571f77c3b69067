/* The differential suite (tests/unit/diff_core.h): shape and index ops (gather,
 * unsorted_segment_sum, one_hot, einsum, stack, split, pad, tile, broadcast_to, expand_dims,
 * squeeze). Included by diff_core.h, after the helpers, references and options it uses. */
#ifndef DT_TEST_DIFF_OPS_INDEX_H
#define DT_TEST_DIFF_OPS_INDEX_H

/* ---- shape and index ops: gather, unsorted_segment_sum, one_hot, einsum, stack, split, pad,
 * tile, broadcast_to, expand_dims, squeeze ------------------------------------------------ */

/* Every n-th of a list in the MPI run (all when thorough); each index at least once over the
 * list's first stride. */
static bool pick_every(const diff_opts *o, int i, int every)
{
    return o->thorough || i % every == 0;
}

/* The MPI run takes each dtype in one of the even and uneven shapes (the one-client run both). */
static bool once(const diff_opts *o, int d, int s)
{
    return o->thorough || d % 2 == s;
}

/* Ids for gather and segment sums: mostly in [0, V), with -1, V and V + 3 among them (rows of
 * zeros, nothing added), repeats included. */
static void fill_ids(dt_dtype dt, void *buf, int64_t n, int64_t V, int salt)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (i * 5 + salt) % (V + 3);
        put(dt, buf, i, k == V + 2 ? -1.0 : k == V + 1 ? (double)(V + 3) : (double)k);
    }
}

static void diff_gather(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lt[MAX_LAYOUTS], li[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const int64_t tshapes[2][2] = {{8, 6}, {7, 5}}; /* [V, d]: even, uneven */
    const int64_t ishape[2] = {3, 4};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d], it = d % 2 ? DT_DTYPE_I64 : DT_DTYPE_I32;
            if (!once(o, d, s))
                continue;
            const int64_t *ts = tshapes[s];
            int64_t V = ts[0], D = ts[1], ni = ishape[0] * ishape[1];
            double ht[64], hi[16], ref[96];
            fill_host(dt, ht, V * D, 13);
            fill_ids(it, hi, ni, V, s + d);
            for (int64_t i = 0; i < ni; i++) {
                int64_t id = (int64_t)get(it, hi, i);
                for (int64_t c = 0; c < D; c++)
                    ref[i * D + c] = id >= 0 && id < V ? get(dt, ht, id * D + c) : 0.0;
            }
            int nt = layouts_for(m, 2, dt, lt), ni2 = all_layouts(m, 2, true, li);
            double tol = 0; /* copies, and sums of exact partial terms */
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < nt; i++) {
                dt_tensor *t = make_tensor(&lt[i], dt, 2, ts, ht);
                for (int j = 0; j < ni2; j++) {
                    if (!pick_dt(o, dt, i, j, nt > ni2 ? nt : ni2) || !pick_every(o, i + j, 2))
                        continue;
                    dt_tensor *ids = make_tensor(&li[j], it, 2, ishape, hi), *y = NULL;
                    bool one = t && ids && dt_gather(t, ids, NULL, &y) == DT_OK &&
                               dt_tensor_rank(y) == 3 && matches(y, dt, ref, ni * D, tol);
                    if (!one && ok) {
                        char a[64], b[64];
                        layout_text(&lt[i], a, sizeof a);
                        layout_text(&li[j], b, sizeof b);
                        snprintf(bad, sizeof bad, " (first failure table \"%s\" ids \"%s\": %s)", a,
                                 b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(ids);
                    dt_tensor_free(y);
                }
                dt_tensor_free(t);
            }
            /* every requested layout of y, from the vocabulary-sharded table and replicated ids
             */
            if (!narrow(dt) || o->thorough) {
                int ny = layouts_for(m, 3, dt, ly);
                dt_layout vt, ri;
                dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 2, &vt);
                dt_layout_replicated(m, 2, &ri);
                dt_tensor *t = make_tensor(&vt, dt, 2, ts, ht);
                dt_tensor *ids = make_tensor(&ri, it, 2, ishape, hi);
                for (int k = 0; k < ny; k++) {
                    if (!pick_every(o, k + d, 5))
                        continue;
                    dt_op_options op = {.layout = &ly[k]};
                    dt_tensor *y = NULL;
                    bool one = t && ids && dt_gather(t, ids, &op, &y) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(y), &ly[k]) &&
                               matches(y, dt, ref, ni * D, tol);
                    if (!one && ok) {
                        char a[64];
                        layout_text(&ly[k], a, sizeof a);
                        snprintf(bad, sizeof bad, " (first failure requested \"%s\": %s)", a,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(t);
                dt_tensor_free(ids);
            }
            DIFF_REPORT(ok,
                        "gather %s[%lld,%lld] by %s ids (out of range among them): layouts of "
                        "table, ids and result%s",
                        dt_dtype_name(dt), (long long)V, (long long)D, dt_dtype_name(it), bad);
        }
    /* a rank-3 table and rank-1 ids, f64 */
    {
        dt_layout l3[MAX_LAYOUTS], l1[MAX_LAYOUTS];
        const int64_t ts[3] = {5, 2, 3}, is[1] = {7};
        double ht[30], hi[7], ref[42];
        fill_host(DT_DTYPE_F64, ht, 30, 2);
        fill_ids(DT_DTYPE_I64, hi, 7, 5, 1);
        for (int64_t i = 0; i < 7; i++) {
            int64_t id = (int64_t)get(DT_DTYPE_I64, hi, i);
            for (int64_t c = 0; c < 6; c++)
                ref[i * 6 + c] = id >= 0 && id < 5 ? ht[id * 6 + c] : 0.0;
        }
        int n3 = all_layouts(m, 3, true, l3), n1 = all_layouts(m, 1, false, l1);
        bool ok = true;
        for (int i = 0; i < n3; i++) {
            if (!pick_every(o, i, 4))
                continue;
            dt_tensor *t = make_tensor(&l3[i], DT_DTYPE_F64, 3, ts, ht);
            dt_tensor *ids = make_tensor(&l1[i % n1], DT_DTYPE_I64, 1, is, hi), *y = NULL;
            ok = ok && t && ids && dt_gather(t, ids, NULL, &y) == DT_OK &&
                 matches(y, DT_DTYPE_F64, ref, 42, 0);
            dt_tensor_free(t);
            dt_tensor_free(ids);
            dt_tensor_free(y);
        }
        DIFF_REPORT(ok, "gather f64[5,2,3] by i64[7]: %d table layouts (%s)", n3,
                    ok ? "ok" : dt_last_error());
    }
}

static void diff_segment_sum(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lx[MAX_LAYOUTS], li[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const int64_t xshape[3] = {3, 4, 5}, ishape[2] = {3, 4};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d], it = (d + s) % 2 ? DT_DTYPE_I64 : DT_DTYPE_I32;
            if (!once(o, d, s))
                continue;
            int64_t N = s ? 7 : 8, D = 5, nr = 12;
            double hx[64], hi[16], ref[64];
            fill_host(dt, hx, nr * D, 14);
            fill_ids(it, hi, nr, N, 2 * s + d);
            for (int64_t k = 0; k < N * D; k++)
                ref[k] = 0;
            for (int64_t r = 0; r < nr; r++) {
                int64_t id = (int64_t)get(it, hi, r);
                for (int64_t c = 0; id >= 0 && id < N && c < D; c++)
                    ref[id * D + c] += get(dt, hx, r * D + c);
            }
            if (is_bool(dt)) { /* sums of bool: refused, naming the dtype */
                dt_layout l, l2;
                dt_layout_replicated(m, 3, &l);
                dt_layout_replicated(m, 2, &l2);
                dt_tensor *x = make_tensor(&l, dt, 3, xshape, hx);
                dt_tensor *ids = make_tensor(&l2, it, 2, ishape, hi), *y = NULL;
                bool ok = x && ids &&
                          dt_unsorted_segment_sum(x, ids, N, NULL, &y) == DT_ERR_DTYPE && !y &&
                          strstr(dt_last_error(), "bool");
                DIFF_REPORT(ok, "unsorted_segment_sum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                dt_tensor_free(x);
                dt_tensor_free(ids);
                continue;
            }
            int n3 = layouts_for(m, 3, dt, lx), n2 = all_layouts(m, 2, true, li);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n3; i++) {
                if (!pick_every(o, i, 2))
                    continue;
                dt_tensor *x = make_tensor(&lx[i], dt, 3, xshape, hx);
                for (int j = 0; j < n2; j++) {
                    if (!pick_dt(o, dt, i, j, n3 > n2 ? n3 : n2) || !pick_every(o, i + j, 3))
                        continue;
                    dt_tensor *ids = make_tensor(&li[j], it, 2, ishape, hi), *y = NULL;
                    bool one = x && ids && dt_unsorted_segment_sum(x, ids, N, NULL, &y) == DT_OK &&
                               matches(y, dt, ref, N * D, sum_tol(dt));
                    if (!one && ok) {
                        char a[64], b[64];
                        layout_text(&lx[i], a, sizeof a);
                        layout_text(&li[j], b, sizeof b);
                        snprintf(bad, sizeof bad, " (first failure data \"%s\" ids \"%s\": %s)", a,
                                 b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(ids);
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            /* every requested layout of y (the segments axis split: the table's gradient), from
             * batch-sharded data and ids */
            int ny = layouts_for(m, 2, dt, ly);
            dt_layout bx, bi;
            dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 3, &bx);
            dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 2, &bi);
            dt_tensor *x = make_tensor(&bx, dt, 3, xshape, hx);
            dt_tensor *ids = make_tensor(&bi, it, 2, ishape, hi);
            for (int k = 0; k < ny; k++) {
                if (!pick_every(o, k + d, 4) || (narrow(dt) && k % 3))
                    continue;
                dt_op_options op = {.layout = &ly[k]};
                dt_tensor *y = NULL;
                bool one = x && ids && dt_unsorted_segment_sum(x, ids, N, &op, &y) == DT_OK &&
                           dt_layout_equal(dt_tensor_layout(y), &ly[k]) &&
                           matches(y, dt, ref, N * D, sum_tol(dt));
                if (!one && ok) {
                    char a[64];
                    layout_text(&ly[k], a, sizeof a);
                    snprintf(bad, sizeof bad, " (first failure requested \"%s\": %s)", a,
                             dt_last_error());
                }
                ok = ok && one;
                dt_tensor_free(y);
            }
            dt_tensor_free(x);
            dt_tensor_free(ids);
            DIFF_REPORT(ok,
                        "unsorted_segment_sum %s[3,4,5] by %s ids into %lld segments: layouts "
                        "of data, ids and result%s",
                        dt_dtype_name(dt), dt_dtype_name(it), (long long)N, bad);
        }
}

static void diff_one_hot(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lx[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const dt_dtype idx_types[4] = {DT_DTYPE_I32, DT_DTYPE_I64, DT_DTYPE_U8, DT_DTYPE_I8};
    const int64_t xshape[2] = {5, 3};
    int nx = all_layouts(m, 2, true, lx);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d], it = idx_types[d % 4];
        int64_t depth = d % 2 ? 7 : 4;
        double hx[15], ref[128];
        for (int64_t i = 0; i < 15; i++) /* -1 .. depth + 1 (u8: 255 for -1) */
            put(it, hx, i, (double)((i * 3 + d) % (depth + 3) - 1));
        /* off_value -1 where the dtype holds it (u8 does not: one_hot refuses it) */
        double on = is_bool(dt)  ? 1
                    : is_int(dt) ? 3
                                 : 2.5,
               off = is_bool(dt)         ? 0
                     : dt == DT_DTYPE_U8 ? 7
                                         : -1;
        bool ok = true;
        char bad[256] = "";
        for (int axis = -1; axis < 3; axis++) {
            int ax = axis < 0 ? 2 : axis;
            int64_t ys[3];
            for (int i = 0, j = 0; i < 3; i++)
                ys[i] = i == ax ? depth : xshape[j++];
            for (int64_t a0 = 0; a0 < ys[0]; a0++)
                for (int64_t a1 = 0; a1 < ys[1]; a1++)
                    for (int64_t a2 = 0; a2 < ys[2]; a2++) {
                        int64_t yi[3] = {a0, a1, a2}, xi[2], pos = yi[ax];
                        for (int i = 0, j = 0; i < 3; i++)
                            if (i != ax)
                                xi[j++] = yi[i];
                        double v = get(it, hx, xi[0] * 3 + xi[1]);
                        ref[(a0 * ys[1] + a1) * ys[2] + a2] = v == (double)pos ? on : off;
                    }
            int ny = layouts_for(m, 3, dt, ly);
            for (int i = 0; i < nx; i++) {
                if (is_bool(dt) && lx[i].partial)
                    continue;
                dt_tensor *x = make_tensor(&lx[i], it, 2, xshape, hx);
                for (int k = -1; k < ny; k++) {
                    if (k >= 0 && !pick_dt(o, dt, i, k, ny))
                        continue;
                    if (!o->thorough && (i + k + axis + d) % 8)
                        continue;
                    dt_op_options op = {.layout = k >= 0 ? &ly[k] : NULL};
                    dt_tensor *y = NULL;
                    bool one = x && dt_one_hot(x, depth, on, off, axis, dt, &op, &y) == DT_OK &&
                               (k < 0 || dt_layout_equal(dt_tensor_layout(y), &ly[k])) &&
                               matches(y, dt, ref, 15 * depth, 0);
                    if (!one && ok) {
                        char a[64], b[64] = "free";
                        layout_text(&lx[i], a, sizeof a);
                        if (k >= 0)
                            layout_text(&ly[k], b, sizeof b);
                        snprintf(bad, sizeof bad,
                                 " (first failure axis %d indices \"%s\" result \"%s\": %s)", axis,
                                 a, b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
        }
        DIFF_REPORT(ok,
                    "one_hot %s indices [5,3] depth %lld into %s, axes -1..2: layouts of "
                    "indices and result%s",
                    dt_dtype_name(it), (long long)depth, dt_dtype_name(dt), bad);
    }
}

/* Extents of einsum labels: even or uneven by turns. */
static bool einsum_uneven;

static int64_t einsum_extent(char c)
{
    static const int64_t even[3] = {4, 2, 6}, uneven[3] = {5, 3, 7};
    return (einsum_uneven ? uneven : even)[(unsigned char)c % 3];
}

/* einsum reference: the sum over every label's index of the operands' product, in double. */
static void ref_einsum(const char *eq, int n, const double *const xs[], double *out, int64_t *nout)
{
    char lab[3][DT_MAX_RANK + 1] = {{0}};
    const char *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
    snprintf(lab[0], sizeof lab[0], "%.*s", (int)((n == 2 ? comma : arrow) - eq), eq);
    if (n == 2)
        snprintf(lab[1], sizeof lab[1], "%.*s", (int)(arrow - comma - 1), comma + 1);
    snprintf(lab[2], sizeof lab[2], "%s", arrow + 2);
    char all[3 * DT_MAX_RANK + 1] = {0};
    int nl = 0;
    for (int q = 0; q < 3; q++)
        for (const char *c = lab[q]; *c; c++)
            if (!strchr(all, *c))
                all[nl++] = *c;
    int64_t ext[3 * DT_MAX_RANK], idx[3 * DT_MAX_RANK] = {0};
    for (int l = 0; l < nl; l++)
        ext[l] = einsum_extent(all[l]);
    *nout = 1;
    for (const char *c = lab[2]; *c; c++)
        *nout *= einsum_extent(*c);
    for (int64_t i = 0; i < *nout; i++)
        out[i] = 0;
    for (;;) {
        double v = 1;
        int64_t at[3] = {0, 0, 0};
        for (int q = 0; q < 3; q++)
            for (const char *c = lab[q]; *c; c++) {
                int l = (int)(strchr(all, *c) - all);
                at[q] = at[q] * ext[l] + idx[l];
            }
        for (int q = 0; q < n; q++)
            v *= xs[q][at[q]];
        out[at[2]] += v;
        int l = nl - 1;
        while (l >= 0 && ++idx[l] == ext[l])
            idx[l--] = 0;
        if (l < 0)
            break;
    }
}
typedef struct einsum_case {
    const char *eq;  /* as passed */
    const char *ref; /* explicit, for the reference */
} einsum_case;

static void diff_einsum(const dt_mesh *m, const diff_opts *o)
{
    static const einsum_case cases[] = {
        {"bsh,hd->bsd", "bsh,hd->bsd"},
        {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk"},
        {"ij,jk->ik", "ij,jk->ik"},
        {"ij->ji", "ij->ji"},
        {"bij,bjk->bik", "bij,bjk->bik"},
        {"i,i->", "i,i->"},
        {"ij,j->i", "ij,j->i"},
        {"ijk->kj", "ijk->kj"},
        {"ab,cb->ca", "ab,cb->ca"},
        {"ik,kj", "ik,kj->ij"},
        {" ...ij, ...jk -> ...ik", "zij,zjk->zik"},
        {"ij,k->i", "ij,k->i"},
        {"i,j->ij", "i,j->ij"},
        {"bqhd,bkhd->bhqk", "bqhd,bkhd->bhqk"},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    dt_layout la[MAX_LAYOUTS], lb[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    for (int cs = 0; cs < ncases; cs++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            bool wide = dt == DT_DTYPE_F64;
            if (!wide && !is_bool(dt) && cs != 0 && cs != 2 && cs != 3)
                continue; /* every dtype on bsh,hd->bsd, ij,jk->ik and ij->ji; f64 on all */
            if (is_bool(dt) && cs != 2)
                continue;
            einsum_uneven = (cs + d) % 2;
            const char *eq = cases[cs].ref, *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
            int n = comma ? 2 : 1, rank[2] = {0, 0}, orank = (int)strlen(arrow + 2);
            int64_t shapes[2][DT_MAX_RANK], ne[2] = {1, 1};
            const char *starts[2] = {eq, comma ? comma + 1 : NULL};
            for (int q = 0; q < n; q++)
                for (const char *c = starts[q]; *c != ',' && *c != '-'; c++) {
                    shapes[q][rank[q]] = einsum_extent(*c);
                    ne[q] *= shapes[q][rank[q]++];
                }
            void *hx[2] = {malloc((size_t)ne[0] * 8 + 8), malloc((size_t)ne[1] * 8 + 8)};
            double *rx[2] = {malloc(sizeof(double) * (size_t)ne[0] + 8),
                             malloc(sizeof(double) * (size_t)ne[1] + 8)};
            double *ref = malloc(sizeof(double) * 4096);
            int64_t nout;
            for (int q = 0; q < n; q++) {
                fill_host(dt, hx[q], ne[q], 15 + q);
                for (int64_t k = 0; k < ne[q]; k++)
                    rx[q][k] = get(dt, hx[q], k);
            }
            ref_einsum(eq, n, (const double *const *)rx, ref, &nout);
            bool ok = true;
            char bad[320] = "";
            if (is_bool(dt)) { /* refused, naming the dtype */
                dt_layout_replicated(m, 2, &la[0]);
                dt_tensor *a = make_tensor(&la[0], dt, 2, shapes[0], hx[0]);
                dt_tensor *b = make_tensor(&la[0], dt, 2, shapes[1], hx[1]), *y = NULL;
                const dt_tensor *xs[2] = {a, b};
                ok = a && b && dt_einsum(cases[cs].eq, 2, xs, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), "bool");
                DIFF_REPORT(ok, "einsum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                dt_tensor_free(a);
                dt_tensor_free(b);
            } else {
                int na = all_layouts(m, rank[0], true, la);
                int nb = n == 2 ? all_layouts(m, rank[1], true, lb) : 1;
                int ny = all_layouts(m, orank, true, ly);
                int every = o->thorough ? (narrow(dt) || is_int(dt) ? 3 : 1) : 6;
                /* pairs: every layout of a with some of b, every layout of b with some of a,
                 * then every requested layout of the result from a fixed pair */
                int total = na + (n == 2 ? nb : 0) + ny;
                for (int t = 0; t < total; t++) {
                    if (t % every != (cs + d) % every)
                        continue;
                    int i, j, k = -1;
                    if (t < na) {
                        i = t;
                        j = (t * 5 + 1) % nb;
                    } else if (t < na + (n == 2 ? nb : 0)) {
                        j = t - na;
                        i = (j * 3 + 2) % na;
                    } else {
                        k = t - na - (n == 2 ? nb : 0);
                        i = na > 1 ? 1 : 0;
                        j = nb - 1;
                    }
                    dt_tensor *a = make_tensor(&la[i], dt, rank[0], shapes[0], hx[0]);
                    dt_tensor *b =
                        n == 2 ? make_tensor(&lb[j], dt, rank[1], shapes[1], hx[1]) : NULL;
                    dt_tensor *y = NULL;
                    const dt_tensor *xs[2] = {a, b};
                    dt_op_options op = {.layout = k >= 0 ? &ly[k] : NULL};
                    bool one = a && (n == 1 || b) &&
                               dt_einsum(cases[cs].eq, n, xs, &op, &y) == DT_OK &&
                               dt_tensor_rank(y) == orank &&
                               (k < 0 || dt_layout_equal(dt_tensor_layout(y), &ly[k])) &&
                               matches(y, dt, ref, nout, sum_tol(dt));
                    if (!one && ok) {
                        char x1[64], x2[64] = "-", x3[64] = "free";
                        layout_text(&la[i], x1, sizeof x1);
                        if (n == 2)
                            layout_text(&lb[j], x2, sizeof x2);
                        if (k >= 0)
                            layout_text(&ly[k], x3, sizeof x3);
                        snprintf(bad, sizeof bad,
                                 " (first failure a \"%s\" b \"%s\" result \"%s\": %s)", x1, x2, x3,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(a);
                    dt_tensor_free(b);
                    dt_tensor_free(y);
                }
                DIFF_REPORT(ok, "einsum \"%s\" %s %s: layouts of the operands and the result%s",
                            cases[cs].eq, dt_dtype_name(dt), einsum_uneven ? "uneven" : "even",
                            bad);
            }
            free(hx[0]);
            free(hx[1]);
            free(rx[0]);
            free(rx[1]);
            free(ref);
        }
    /* equations refused on every client, naming the problem */
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    const int64_t sq[2] = {3, 3}, sr[2] = {3, 4};
    double h[12] = {0};
    dt_tensor *a = make_tensor(&l, DT_DTYPE_F32, 2, sq, h),
              *b = make_tensor(&l, DT_DTYPE_F32, 2, sr, h);
    dt_tensor *y = NULL;
    const dt_tensor *xs[2] = {a, b};
    bool ok = a && b;
    ok = ok && dt_einsum("ii->i", 1, xs, NULL, &y) == DT_ERR_UNSUPPORTED && !y &&
         strstr(dt_last_error(), "'i' repeats");
    ok = ok && dt_einsum("ij,ij->i", 2, xs, NULL, &y) == DT_ERR_SHAPE && !y &&
         strstr(dt_last_error(), "label 'j'");
    ok = ok && dt_einsum("ij,jk->iz", 2, xs, NULL, &y) == DT_ERR_ARG && !y &&
         strstr(dt_last_error(), "'z' is in no operand");
    ok = ok && dt_einsum("ij->ij", 2, xs, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_einsum("i1,1k->ik", 2, xs, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_einsum("ijk,jk->i", 2, xs, NULL, &y) == DT_ERR_SHAPE && !y;
    DIFF_REPORT(ok, "einsum: bad equations fail clearly (%s)", dt_last_error());
    dt_tensor_free(a);
    dt_tensor_free(b);
}

/* stack, split, pad, tile, broadcast_to, expand_dims and squeeze on every layout of a [5, 6]
 * tensor (uneven on 2- and 4-device axes; partial sums included), every dtype. */
static void diff_shape_more(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l3[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 6};
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        double hx[30], hy[30], hz[30], ref[256];
        fill_host(dt, hx, 30, 16);
        fill_host(dt, hy, 30, 17);
        fill_host(dt, hz, 30, 18);
        const double *hs[3] = {hx, hy, hz};
        int n = layouts_for(m, 2, dt, ls), n3 = layouts_for(m, 3, dt, l3);
        bool ok_st = true, ok_sp = true, ok_pad = true, ok_tile = true, ok_bc = true, ok_ed = true,
             ok_sq = true;
        char bad[320] = "";
        double cval = is_bool(dt) ? 1 : is_int(dt) ? 3 : 1.5;
        for (int i = 0; i < n; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i + d, 6))
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, hx), *y = NULL;
            dt_op_options req = {.layout = &ls[(i * 7 + 3) % n]};
            /* stack of three tensors in three layouts, on each axis (and a requested layout) */
            dt_tensor *x1 = make_tensor(&ls[(i * 5 + 1) % n], dt, 2, sh, hy);
            dt_tensor *x2 = make_tensor(&ls[(i * 3 + 2) % n], dt, 2, sh, hz);
            const dt_tensor *xs[3] = {x, x1, x2};
            for (int axis = -1; axis < 3; axis++) {
                int ax = axis < 0 ? 2 : axis;
                int64_t ys[3];
                for (int q = 0, j = 0; q < 3; q++)
                    ys[q] = q == ax ? 3 : sh[j++];
                for (int64_t a0 = 0; a0 < ys[0]; a0++)
                    for (int64_t a1 = 0; a1 < ys[1]; a1++)
                        for (int64_t a2 = 0; a2 < ys[2]; a2++) {
                            int64_t yi[3] = {a0, a1, a2}, xi[2];
                            for (int q = 0, j = 0; q < 3; q++)
                                if (q != ax)
                                    xi[j++] = yi[q];
                            ref[(a0 * ys[1] + a1) * ys[2] + a2] =
                                get(dt, hs[yi[ax]], xi[0] * 6 + xi[1]);
                        }
                dt_op_options r3 = {.layout = &l3[(i + axis + 1) % n3]};
                bool one = x && x1 && x2 &&
                           dt_stack(3, xs, axis, axis == 1 ? &r3 : NULL, &y) == DT_OK &&
                           (axis != 1 || dt_layout_equal(dt_tensor_layout(y), r3.layout)) &&
                           matches(y, dt, ref, 90, 0);
                if (!one && ok_st)
                    snprintf(bad, sizeof bad, " (stack axis %d: %s)", axis, dt_last_error());
                ok_st = ok_st && one;
                dt_tensor_free(y);
                y = NULL;
            }
            dt_tensor_free(x1);
            dt_tensor_free(x2);
            /* split: axis 0 into 2 and 3 rows, axis 1 into 3 equal pieces */
            dt_tensor *parts[3] = {NULL, NULL, NULL};
            const int64_t sizes[2] = {2, 3};
            bool one = x && dt_split(x, 2, sizes, 0, NULL, parts) == DT_OK;
            for (int q = 0; one && q < 2; q++) {
                for (int64_t k = 0; k < sizes[q] * 6; k++)
                    ref[k] = get(dt, hx, (q ? 2 * 6 : 0) + k);
                one = matches(parts[q], dt, ref, sizes[q] * 6, 0);
            }
            for (int q = 0; q < 3; q++) {
                dt_tensor_free(parts[q]);
                parts[q] = NULL;
            }
            one = one && dt_split(x, 3, NULL, -1, &req, parts) == DT_OK;
            for (int q = 0; one && q < 3; q++) {
                for (int64_t r = 0; r < 5; r++)
                    for (int64_t c = 0; c < 2; c++)
                        ref[r * 2 + c] = get(dt, hx, r * 6 + q * 2 + c);
                one = matches(parts[q], dt, ref, 10, 0) &&
                      dt_layout_equal(dt_tensor_layout(parts[q]), req.layout);
            }
            for (int q = 0; q < 3; q++)
                dt_tensor_free(parts[q]);
            if (!one && ok_sp)
                snprintf(bad, sizeof bad, " (split: %s)", dt_last_error());
            ok_sp = ok_sp && one;
            /* pad: 1 row before, 2 after, 3 columns after */
            const int64_t before[2] = {1, 0}, after[2] = {2, 3};
            for (int64_t r = 0; r < 8; r++)
                for (int64_t c = 0; c < 9; c++)
                    ref[r * 9 + c] = r >= 1 && r < 6 && c < 6 ? get(dt, hx, (r - 1) * 6 + c) : cval;
            for (int rq = 0; rq < 2; rq++) {
                one = x && dt_pad(x, before, after, cval, rq ? &req : NULL, &y) == DT_OK &&
                      (!rq || dt_layout_equal(dt_tensor_layout(y), req.layout)) &&
                      matches(y, dt, ref, 72, 0);
                if (!one && ok_pad)
                    snprintf(bad, sizeof bad, " (pad: %s)", dt_last_error());
                ok_pad = ok_pad && one;
                dt_tensor_free(y);
                y = NULL;
            }
            /* tile */
            const int64_t mults[3][2] = {{2, 3}, {1, 2}, {3, 1}};
            for (int t = 0; t < 3; t++) {
                int64_t R = 5 * mults[t][0], C = 6 * mults[t][1];
                for (int64_t r = 0; r < R; r++)
                    for (int64_t c = 0; c < C; c++)
                        ref[r * C + c] = get(dt, hx, (r % 5) * 6 + c % 6);
                one = x && dt_tile(x, mults[t], t == 2 ? &req : NULL, &y) == DT_OK &&
                      matches(y, dt, ref, R * C, 0);
                if (!one && ok_tile)
                    snprintf(bad, sizeof bad, " (tile %lldx%lld: %s)", (long long)mults[t][0],
                             (long long)mults[t][1], dt_last_error());
                ok_tile = ok_tile && one;
                dt_tensor_free(y);
                y = NULL;
            }
            /* expand_dims: the old axes keep their sharding, nothing moves */
            for (int axis = -1; axis < 3; axis++) {
                int ax = axis < 0 ? 2 : axis;
                one = x && dt_expand_dims(x, axis, NULL, &y) == DT_OK && dt_tensor_rank(y) == 3 &&
                      dt_tensor_shape(y)[ax] == 1;
                for (int q = 0, j = 0; one && q < 3; q++)
                    if (q != ax)
                        one = dt_tensor_layout(y)->axes[q] == ls[i].axes[j++];
                for (int64_t k = 0; one && k < 30; k++)
                    ref[k] = get(dt, hx, k);
                one = one && matches(y, dt, ref, 30, 0);
                if (!one && ok_ed)
                    snprintf(bad, sizeof bad, " (expand_dims %d: %s)", axis, dt_last_error());
                ok_ed = ok_ed && one;
                dt_tensor_free(y);
                y = NULL;
            }
            dt_tensor_free(x);
        }
        /* broadcast_to: [5, 1] -> [4, 5, 6] and [6] -> [5, 6], every layout of the operand */
        dt_layout l1[MAX_LAYOUTS];
        int n1 = layouts_for(m, 1, dt, l1);
        const int64_t s51[2] = {5, 1}, s6[1] = {6}, to3[3] = {4, 5, 6};
        for (int64_t k = 0; k < 120; k++)
            ref[k] = get(dt, hx, (k / 6) % 5);
        for (int i = 0; i < n; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i, 3))
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, s51, hx), *y = NULL;
            dt_op_options r3 = {.layout = &l3[(i * 5 + 2) % n3]};
            bool one = x && dt_broadcast_to(x, 3, to3, i % 2 ? &r3 : NULL, &y) == DT_OK &&
                       (i % 2 == 0 || dt_layout_equal(dt_tensor_layout(y), r3.layout)) &&
                       matches(y, dt, ref, 120, 0);
            if (!one && ok_bc)
                snprintf(bad, sizeof bad, " (broadcast_to [5,1]: %s)", dt_last_error());
            ok_bc = ok_bc && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
        }
        for (int64_t k = 0; k < 30; k++)
            ref[k] = get(dt, hy, k % 6);
        for (int i = 0; i < n1; i++) {
            if (!pick_every(o, i + d, 3))
                continue;
            dt_tensor *x = make_tensor(&l1[i], dt, 1, s6, hy), *y = NULL;
            bool one =
                x && dt_broadcast_to(x, 2, sh, NULL, &y) == DT_OK && matches(y, dt, ref, 30, 0);
            if (!one && ok_bc)
                snprintf(bad, sizeof bad, " (broadcast_to [6]: %s)", dt_last_error());
            ok_bc = ok_bc && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
        }
        /* squeeze [5, 1, 6] (its middle axis sharded in some layouts) by axis and all */
        const int64_t s516[3] = {5, 1, 6};
        for (int64_t k = 0; k < 30; k++)
            ref[k] = get(dt, hx, k);
        for (int i = 0; i < n3; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i, 3))
                continue;
            dt_tensor *x = make_tensor(&l3[i], dt, 3, s516, hx), *y = NULL, *z = NULL;
            const int ax1[1] = {-2};
            bool one = x && dt_squeeze(x, 1, ax1, NULL, &y) == DT_OK && dt_tensor_rank(y) == 2 &&
                       matches(y, dt, ref, 30, 0) && dt_squeeze(x, 0, NULL, NULL, &z) == DT_OK &&
                       dt_tensor_rank(z) == 2 && matches(z, dt, ref, 30, 0);
            if (one && l3[i].axes[1] == DT_UNSHARDED) /* metadata only: the others stay */
                one = dt_tensor_layout(y)->axes[0] == l3[i].axes[0] &&
                      dt_tensor_layout(y)->axes[1] == l3[i].axes[2];
            if (!one && ok_sq)
                snprintf(bad, sizeof bad, " (squeeze: %s)", dt_last_error());
            ok_sq = ok_sq && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
            dt_tensor_free(z);
        }
        const char *dn = dt_dtype_name(dt);
        DIFF_REPORT(ok_st, "stack %s of 3 [5,6] on axes -1..2: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_sp, "split %s [5,6] into [2,3] rows and 3 column pieces: %d layouts%s", dn,
                    n, bad);
        DIFF_REPORT(ok_pad, "pad %s [5,6] by (1,2),(0,3): %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_tile, "tile %s [5,6] by 2x3, 1x2, 3x1: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_bc, "broadcast_to %s [5,1] -> [4,5,6], [6] -> [5,6]: all layouts%s", dn,
                    bad);
        DIFF_REPORT(ok_ed, "expand_dims %s [5,6] on axes -1..2 (metadata only): %d layouts%s", dn,
                    n, bad);
        DIFF_REPORT(ok_sq, "squeeze %s [5,1,6]: %d layouts%s", dn, n3, bad);
    }
    /* refused clearly */
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    double h[30] = {0};
    dt_tensor *x = make_tensor(&l, DT_DTYPE_F32, 2, sh, h), *y = NULL, *parts[4] = {0};
    bool ok = x;
    ok = ok && dt_split(x, 4, NULL, 0, NULL, parts) == DT_ERR_SHAPE && !parts[0];
    ok = ok && dt_squeeze(x, 1, (const int[]){0}, NULL, &y) == DT_ERR_SHAPE && !y &&
         strstr(dt_last_error(), "extent 5");
    ok = ok &&
         dt_pad(x, (const int64_t[]){-1, 0}, (const int64_t[]){0, 0}, 0, NULL, &y) == DT_ERR_ARG &&
         !y;
    ok = ok && dt_tile(x, (const int64_t[]){-1, 2}, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_broadcast_to(x, 2, (const int64_t[]){4, 6}, NULL, &y) == DT_ERR_SHAPE && !y;
    ok = ok && dt_expand_dims(x, 4, NULL, &y) == DT_ERR_ARG && !y;
    double hi[6] = {0};
    dt_tensor *fi = make_tensor(&l, DT_DTYPE_F32, 2, (const int64_t[]){2, 3}, hi);
    ok = ok && fi && dt_gather(x, fi, NULL, &y) == DT_ERR_DTYPE && !y &&
         strstr(dt_last_error(), "expected i32 or i64");
    ok = ok && fi && dt_one_hot(fi, 3, 1, 0, -1, DT_DTYPE_F32, NULL, &y) == DT_ERR_DTYPE && !y;
    DIFF_REPORT(ok, "shape ops: bad arguments fail clearly (%s)", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(fi);
}

#endif /* DT_TEST_DIFF_OPS_INDEX_H */
