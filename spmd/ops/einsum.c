/* einsum (tf.einsum) of one or two operands: "bsh,hd->bsd", "bhqd,bhkd->bhqk", "ij->ji".
 *
 * Labels fall into classes: batch (in both operands and the output), contracted (in both, not
 * the output), free of a (a and the output), free of b, and summed-only (one operand, not the
 * output: summed away first). Every contraction is then one batched GEMM:
 *
 *   a [B..., M..., K...] x b [B..., K..., N...] -> c [B..., M..., N...]  -> output order
 *
 * where each group is several tensor axes read as one (a device's shard of a row-major tensor
 * whose axes are in group order is a batch of (prod M) x (prod K) matrices, whatever the
 * sharding, so no reshape and no layout restriction arises).
 *
 * The expansion assigns a mesh axis (or none) to every label, all distinct, from what the
 * operands and the request use (matmul's rule generalised): each operand is relayouted to its
 * labels' axes, summed-only labels are reduced locally (a sharded one leaves pending terms of a
 * sum over its mesh axis), the GEMM of the local shards gives c partial over the mesh axes of
 * the contracted and summed labels, and c is moved to the request: all-reduce, reduce-scatter
 * into a sharded request, nothing for a partial one. The cheapest assignment by the
 * alpha-beta model (the operands' and the result's relayouts, dt__relayout_cost, plus the
 * GEMM's multiplies) wins. Then the cheapest arrangement of the local GEMM: which operand is
 * the left one, the order of each group, and GEMM transpose flags instead of transposes where
 * an operand's axes already lie as [B, K, M] or [B, N, K]; a transpose step (local) only where
 * no arrangement fits. One operand: the summed labels are reduced, then the rest transposed. */
#include "../engine.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

#define MAX_LABELS (2 * DT_MAX_RANK)

/* A parsed canonical equation. */
typedef struct eqn {
    int n;                      /* operands */
    int rank[2], orank;         /* labels per operand and of the output */
    int lab[2][DT_MAX_RANK];    /* label ids per operand axis */
    int out[DT_MAX_RANK];       /* label ids per output axis */
    int nl;                     /* distinct labels */
    char letter[MAX_LABELS];    /* label id -> letter */
    bool in[3][MAX_LABELS];     /* label in a, in b, in the output */
    int64_t extent[MAX_LABELS]; /* filled by `extents` */
} eqn;

static int label_id(eqn *e, char c)
{
    for (int l = 0; l < e->nl; l++)
        if (e->letter[l] == c)
            return l;
    if (e->nl == MAX_LABELS)
        return -1;
    e->letter[e->nl] = c;
    return e->nl++;
}

/* Parse "ab,bc->ac" (canonical: letters, an explicit output, no spaces or ellipses). */
static dt_status parse(const char *eq, eqn *e)
{
    memset(e, 0, sizeof *e);
    const char *arrow = strstr(eq, "->");
    if (!arrow)
        return dt__fail(DT_ERR_ARG, "einsum: \"%s\" has no output (->)", eq);
    int *cur = e->lab[0], *count = &e->rank[0];
    for (const char *c = eq;; c++) {
        if (c == arrow) {
            cur = e->out;
            count = &e->orank;
            c++;
            continue;
        }
        if (!*c)
            break;
        if (*c == ',' && c < arrow && e->n == 0) {
            e->n = 1;
            cur = e->lab[1];
            count = &e->rank[1];
            continue;
        }
        if (!isalpha((unsigned char)*c))
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": '%c' is not a label (letters a-z, A-Z)",
                            eq, *c);
        if (*count == DT_MAX_RANK)
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": more than %d labels on one side", eq,
                            DT_MAX_RANK);
        int l = label_id(e, *c);
        if (l < 0)
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": more than %d labels", eq, MAX_LABELS);
        cur[(*count)++] = l;
    }
    e->n++;
    for (int q = 0; q < e->n; q++)
        for (int i = 0; i < e->rank[q]; i++) {
            int l = e->lab[q][i];
            if (e->in[q][l])
                return dt__fail(DT_ERR_UNSUPPORTED,
                                "einsum: \"%s\": label '%c' repeats in operand %d (diagonals are "
                                "not supported)",
                                eq, e->letter[l], q);
            e->in[q][l] = true;
        }
    for (int i = 0; i < e->orank; i++) {
        int l = e->out[i];
        if (e->in[2][l])
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": label '%c' repeats in the output", eq,
                            e->letter[l]);
        if (!e->in[0][l] && !e->in[1][l])
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": output label '%c' is in no operand", eq,
                            e->letter[l]);
        e->in[2][l] = true;
    }
    return DT_OK;
}

/* Extents per label from the operands' shapes; DT_ERR_SHAPE when a label's extents differ. */
static dt_status extents(eqn *e, const char *eq, const int64_t *const shapes[])
{
    for (int l = 0; l < e->nl; l++)
        e->extent[l] = -1;
    for (int q = 0; q < e->n; q++)
        for (int i = 0; i < e->rank[q]; i++) {
            int l = e->lab[q][i];
            if (e->extent[l] >= 0 && e->extent[l] != shapes[q][i])
                return dt__fail(DT_ERR_SHAPE,
                                "einsum: \"%s\": label '%c' has extent %lld in one place and %lld "
                                "in another",
                                eq, e->letter[l], (long long)e->extent[l], (long long)shapes[q][i]);
            e->extent[l] = shapes[q][i];
        }
    return DT_OK;
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const char *eq = n->attrs.equation;
    eqn e;
    DT_TRY(parse(eq, &e));
    if (e.n != n->nin)
        return dt__fail(DT_ERR_ARG, "einsum: \"%s\" names %d operands, %d given", eq, e.n, n->nin);
    const int64_t *shapes[2];
    for (int q = 0; q < e.n; q++) {
        if (e.rank[q] != in[q]->rank) {
            char s[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_SHAPE, "einsum: \"%s\": operand %d is %s, of rank %d, not %d",
                            eq, q, dt__shape_str(s, sizeof s, in[q]->rank, in[q]->shape),
                            in[q]->rank, e.rank[q]);
        }
        shapes[q] = in[q]->shape;
        DT_TRY(dt__dtype_check("einsum", in[q]->dtype, DT__NUMERIC));
    }
    if (e.n == 2 && in[0]->dtype != in[1]->dtype)
        return dt__fail(DT_ERR_DTYPE, "einsum: a is %s, b is %s (cast one first)",
                        dt_dtype_name(in[0]->dtype), dt_dtype_name(in[1]->dtype));
    DT_TRY(extents(&e, eq, shapes));
    out->dtype = in[0]->dtype;
    out->rank = e.orank;
    for (int i = 0; i < e.orank; i++)
        out->shape[i] = e.extent[e.out[i]];
    return DT_OK;
}

/* ---- distributed values with their labels ------------------------------------------------ */

typedef struct ldist {
    dt__dist d;
    int lab[DT_MAX_RANK];
} ldist;

typedef struct reduce_ctx {
    const dt__dist *x, *y;
    unsigned mask;
} reduce_ctx;

static void reduce_args(void *ctx, int d, dt__kargs *k)
{
    reduce_ctx *c = ctx;
    dt__kargs_out(k, c->y, d); /* keepdims: the summed axes of extent 1 */
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    k->op = DT_REDUCE_SUM;
    k->mask = c->mask;
    k->a = 1.0;
}

/* Sum away the axes of x whose labels are not in `keep`; a sharded one leaves pending terms
 * over its mesh axis. */
static dt_status sum_labels(dt__program *p, const ldist *x, const bool keep[], ldist *out)
{
    unsigned mask = 0;
    for (int i = 0; i < x->d.rank; i++)
        if (!keep[x->lab[i]])
            mask |= 1u << i;
    if (!mask) {
        *out = *x;
        return DT_OK;
    }
    dt_layout yl = x->d.layout;
    int64_t yshape[DT_MAX_RANK];
    for (int i = 0; i < x->d.rank; i++) {
        yshape[i] = mask & (1u << i) ? 1 : x->d.shape[i];
        if ((mask & (1u << i)) && yl.axes[i] != DT_UNSHARDED) {
            yl.partial |= 1u << yl.axes[i];
            yl.axes[i] = DT_UNSHARDED;
        }
    }
    yl.partial_op = DT_REDUCE_SUM;
    dt__dist y;
    DT_TRY(dt__slot_new(p, &yl, x->d.dtype, x->d.rank, yshape, &y));
    reduce_ctx c = {.x = &x->d, .y = &y, .mask = mask};
    DT_TRY(dt__emit_kernel(p, "einsum", DT__K_REDUCE, y.dtype, 1, &x->d.slot, y.slot, yl.mesh,
                           reduce_args, &c));
    /* the extent-1 axes dropped: the same slot, new metadata */
    ldist z = {.d = y};
    z.d.rank = 0;
    for (int i = 0; i < x->d.rank; i++) {
        if (mask & (1u << i))
            continue;
        z.d.shape[z.d.rank] = y.shape[i];
        z.d.layout.axes[z.d.rank] = y.layout.axes[i];
        z.lab[z.d.rank++] = x->lab[i];
    }
    z.d.layout.rank = z.d.rank;
    for (int i = z.d.rank; i < DT_MAX_RANK; i++) {
        z.d.shape[i] = 0;
        z.d.layout.axes[i] = DT_UNSHARDED;
    }
    *out = z;
    return DT_OK;
}

typedef struct transpose_ctx {
    const dt__dist *x, *y;
    const int *perm;
} transpose_ctx;

static void transpose_args(void *ctx, int d, dt__kargs *k)
{
    transpose_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    for (int i = 0; i < c->x->rank; i++)
        k->perm[i] = c->perm[i];
}

/* x with its axes in the order of the labels `order` (a permutation of x's labels); the layout
 * (partial terms too) moves with the axes: a local transpose, or nothing when already so. */
static dt_status arrange(dt__program *p, const ldist *x, const int order[], ldist *out)
{
    int perm[DT_MAX_RANK];
    bool same = true;
    for (int i = 0; i < x->d.rank; i++) {
        for (int j = 0; j < x->d.rank; j++)
            if (x->lab[j] == order[i])
                perm[i] = j;
        same = same && perm[i] == i;
    }
    if (same) {
        *out = *x;
        return DT_OK;
    }
    dt_layout yl = x->d.layout;
    int64_t yshape[DT_MAX_RANK];
    for (int i = 0; i < x->d.rank; i++) {
        yl.axes[i] = x->d.layout.axes[perm[i]];
        yshape[i] = x->d.shape[perm[i]];
        out->lab[i] = order[i];
    }
    DT_TRY(dt__slot_new(p, &yl, x->d.dtype, x->d.rank, yshape, &out->d));
    transpose_ctx c = {.x = &x->d, .y = &out->d, .perm = perm};
    return dt__emit_kernel(p, "einsum", DT__K_TRANSPOSE, x->d.dtype, 1, &x->d.slot, out->d.slot,
                           yl.mesh, transpose_args, &c);
}

/* ---- one operand: sum, then transpose ---------------------------------------------------- */

static dt_status expand_one(dt__program *p, const eqn *e, const dt__dist *a, const dt_layout *want,
                            dt__dist *out)
{
    ldist x = {.d = *a}, y, z;
    if (x.d.layout.partial && x.d.layout.partial_op != DT_REDUCE_SUM)
        DT_TRY(dt__resolve_partial(p, "einsum", &x.d, &x.d));
    memcpy(x.lab, e->lab[0], sizeof x.lab);
    DT_TRY(sum_labels(p, &x, e->in[2], &y));
    DT_TRY(arrange(p, &y, e->out, &z));
    return dt__finish(p, "einsum", &z.d, want, out);
}

/* ---- two operands: the label assignment ---------------------------------------------------- */

typedef struct esearch {
    const eqn *e;
    const dt__dist *a, *b;
    const dt_layout *want;
    int64_t oshape[DT_MAX_RANK];
} esearch;

typedef struct elayouts {
    dt_layout a, b, y, final; /* y: the product in output order, partial */
} elayouts;

static void layouts_of(const esearch *S, const int ax[], elayouts *L)
{
    const eqn *e = S->e;
    const dt_mesh *m = S->a->layout.mesh;
    L->a = dt__layout_none(m, e->rank[0]);
    L->b = dt__layout_none(m, e->rank[1]);
    L->y = dt__layout_none(m, e->orank);
    for (int i = 0; i < e->rank[0]; i++)
        L->a.axes[i] = ax[e->lab[0][i]];
    for (int i = 0; i < e->rank[1]; i++)
        L->b.axes[i] = ax[e->lab[1][i]];
    for (int i = 0; i < e->orank; i++)
        L->y.axes[i] = ax[e->out[i]];
    for (int l = 0; l < e->nl; l++) /* contracted and summed labels: pending sums */
        if (!e->in[2][l] && ax[l] != DT_UNSHARDED)
            L->y.partial |= 1u << ax[l];
    L->final = dt__search_final(S->want, &L->y);
}

static double cost(void *ctx, const int ax[])
{
    const esearch *S = ctx;
    const eqn *e = S->e;
    elayouts L;
    layouts_of(S, ax, &L);
    const dt_mesh *m = S->a->layout.mesh;
    /* the GEMM on the busiest device: the first shard of every label in both operands or
     * the output */
    double mults = 1;
    for (int l = 0; l < e->nl; l++) {
        bool counted = (e->in[0][l] && e->in[1][l]) || e->in[2][l];
        if (counted)
            mults *=
                (double)dt_shard_size(e->extent[l], ax[l] == DT_UNSHARDED ? 1 : m->sizes[ax[l]], 0);
    }
    const dt__dist *a = S->a, *b = S->b;
    return dt__relayout_cost(&a->layout, &L.a, a->dtype, a->rank, a->shape) +
           dt__relayout_cost(&b->layout, &L.b, b->dtype, b->rank, b->shape) +
           dt__relayout_cost(&L.y, &L.final, a->dtype, e->orank, S->oshape) + DT__GAMMA * mults;
}

/* ---- two operands: the arrangement of the local GEMM ------------------------------------- */

/* Labels of `from` (in its order) that belong to class `cls` of e: 'B' batch, 'K' contracted,
 * 'M' free of a, 'N' free of b. */
static int group(const eqn *e, const int from[], int nfrom, char cls, int out[])
{
    int n = 0;
    for (int i = 0; i < nfrom; i++) {
        int l = from[i];
        bool ia = e->in[0][l], ib = e->in[1][l], io = e->in[2][l];
        bool take = cls == 'B'   ? ia && ib && io
                    : cls == 'K' ? ia && ib && !io
                    : cls == 'M' ? ia && !ib && io
                                 : !ia && ib && io;
        if (take)
            out[n++] = l;
    }
    return n;
}

/* dst = g1 g2 g3 (label sequences); returns the length. */
static int concat3(int dst[], const int g1[], int n1, const int g2[], int n2, const int g3[],
                   int n3)
{
    memcpy(dst, g1, sizeof(int) * (size_t)n1);
    memcpy(dst + n1, g2, sizeof(int) * (size_t)n2);
    memcpy(dst + n1 + n2, g3, sizeof(int) * (size_t)n3);
    return n1 + n2 + n3;
}

static bool same_seq(const int x[], const int y[], int n)
{
    return memcmp(x, y, sizeof(int) * (size_t)n) == 0;
}

/* One arrangement: the left GEMM operand (a, or b when swapped) as [Bo, Ro, Ko] or [Bo, Ko, Ro]
 * (transposed), the right one as [Bo, Ko, Co] or [Bo, Co, Ko], the product [Bo, Ro, Co]. */
typedef struct arrangement {
    bool swap, tl, tr;
    int nb, nr, nc, nk;
    int bo[MAX_LABELS], ro[MAX_LABELS], co[MAX_LABELS], ko[MAX_LABELS];
    int lorder[DT_MAX_RANK], rorder[DT_MAX_RANK], corder[DT_MAX_RANK];
    double cost;
} arrangement;

/* Operand x lies as `form` (its GEMM form, t false) or `form_t` (transposed, t true): no
 * transpose needed. Otherwise it is transposed into `form` (false). */
static bool fits(const ldist *x, const int form[], const int form_t[], bool *t, int order[])
{
    int n = x->d.rank;
    *t = same_seq(form_t, x->lab, n) && !same_seq(form, x->lab, n);
    memcpy(order, *t ? form_t : form, sizeof(int) * (size_t)n);
    return *t || same_seq(form, x->lab, n);
}

static double local_bytes(const dt__dist *x)
{
    return (double)dt__max_local_elems(&x->layout, x->rank, x->shape) *
           (double)dt_dtype_size(x->dtype);
}

/* The cheapest arrangement (local transposes priced by the bytes they copy; the first found on
 * ties: a on the left, the groups in a's order). */
static void arrange_gemm(const eqn *e, const ldist *a, const ldist *b, const dt__dist *yref,
                         arrangement *best)
{
    int bsrc[3][MAX_LABELS], ksrc[2][MAX_LABELS], msrc[2][MAX_LABELS], nsrc[2][MAX_LABELS];
    int nb = group(e, a->lab, a->d.rank, 'B', bsrc[0]);
    group(e, b->lab, b->d.rank, 'B', bsrc[1]);
    group(e, e->out, e->orank, 'B', bsrc[2]);
    int nk = group(e, a->lab, a->d.rank, 'K', ksrc[0]);
    group(e, b->lab, b->d.rank, 'K', ksrc[1]);
    int nm = group(e, a->lab, a->d.rank, 'M', msrc[0]);
    group(e, e->out, e->orank, 'M', msrc[1]);
    int nn = group(e, b->lab, b->d.rank, 'N', nsrc[0]);
    group(e, e->out, e->orank, 'N', nsrc[1]);
    best->cost = INFINITY;
    for (int swap = 0; swap < 2; swap++)
        for (int bi = 0; bi < 3; bi++)
            for (int ki = 0; ki < 2; ki++)
                for (int mi = 0; mi < 2; mi++)
                    for (int ni = 0; ni < 2; ni++) {
                        arrangement g = {.swap = swap, .nb = nb, .nk = nk};
                        memcpy(g.bo, bsrc[bi], sizeof g.bo);
                        memcpy(g.ko, ksrc[ki], sizeof g.ko);
                        g.nr = swap ? nn : nm;
                        g.nc = swap ? nm : nn;
                        memcpy(g.ro, swap ? nsrc[ni] : msrc[mi], sizeof g.ro);
                        memcpy(g.co, swap ? msrc[mi] : nsrc[ni], sizeof g.co);
                        const ldist *L = swap ? b : a, *R = swap ? a : b;
                        int f[DT_MAX_RANK], ft[DT_MAX_RANK];
                        g.cost = 0;
                        concat3(f, g.bo, g.nb, g.ro, g.nr, g.ko, g.nk);  /* [Bo, Ro, Ko] */
                        concat3(ft, g.bo, g.nb, g.ko, g.nk, g.ro, g.nr); /* [Bo, Ko, Ro] */
                        if (!fits(L, f, ft, &g.tl, g.lorder))
                            g.cost += local_bytes(&L->d);
                        concat3(f, g.bo, g.nb, g.ko, g.nk, g.co, g.nc);  /* [Bo, Ko, Co] */
                        concat3(ft, g.bo, g.nb, g.co, g.nc, g.ko, g.nk); /* [Bo, Co, Ko] */
                        if (!fits(R, f, ft, &g.tr, g.rorder))
                            g.cost += local_bytes(&R->d);
                        int n = concat3(g.corder, g.bo, g.nb, g.ro, g.nr, g.co, g.nc);
                        if (!same_seq(g.corder, e->out, n))
                            g.cost += local_bytes(yref);
                        if (g.cost < best->cost)
                            *best = g;
                    }
}

typedef struct gemm_ctx {
    const dt__dist *l, *r, *c;
    int nb, nr, nk;
    bool tl, tr;
} gemm_ctx;

static int64_t prod(const int64_t x[], int from, int n)
{
    int64_t p = 1;
    for (int i = from; i < from + n; i++)
        p *= x[i];
    return p;
}

static void gemm_args(void *ctx, int d, dt__kargs *k)
{
    gemm_ctx *g = ctx;
    int64_t ll[DT_MAX_RANK], cl[DT_MAX_RANK];
    dt__local_shape(g->l, d, ll, NULL);
    dt__kargs_out(k, g->c, d);
    memcpy(cl, k->shape, sizeof cl);
    /* l_local: (B, R, K) or (B, K, R); r_local: (B, K, C) or (B, C, K); c_local: (B, R, C),
     * each group flattened (row-major) */
    k->batch = prod(cl, 0, g->nb);
    k->m = prod(cl, g->nb, g->nr);
    k->n = prod(cl, g->nb + g->nr, g->c->rank - g->nb - g->nr);
    k->k = prod(ll, g->tl ? g->nb : g->nb + g->nr, g->nk);
    k->ta = g->tl;
    k->tb = g->tr;
    k->a_batch_stride = k->m * k->k;
    k->b_batch_stride = k->k * k->n;
}

static dt_status expand_two(dt__program *p, const eqn *e, const dt__dist in[],
                            const dt_layout *want, dt__dist *out)
{
    esearch S = {.e = e, .a = &in[0], .b = &in[1], .want = want};
    for (int i = 0; i < e->orank; i++)
        S.oshape[i] = e->extent[e->out[i]];
    dt__assign A = {.n = e->nl};
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < e->rank[q]; i++)
            dt__assign_add(&A, e->lab[q][i], in[q].layout.axes[i]);
    for (int i = 0; want && i < e->orank; i++)
        dt__assign_add(&A, e->out[i], want->axes[i]);
    for (int l = 0; l < e->nl; l++)
        dt__assign_add(&A, l, DT_UNSHARDED);
    int best[DT__ASSIGN_MAX];
    if (!dt__assign_best(&A, cost, &S, best)) {
        char la[DT_STRING_MAX], lb[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT, "einsum: no expansion for a \"%s\", b \"%s\"",
                        dt__layout_str(&in[0].layout, la, sizeof la),
                        dt__layout_str(&in[1].layout, lb, sizeof lb));
    }
    elayouts L;
    layouts_of(&S, best, &L);
    ldist a = {0}, b = {0}, ra, rb;
    DT_TRY(dt__relayout_emit(p, "einsum", &in[0], &L.a, &a.d));
    DT_TRY(dt__relayout_emit(p, "einsum", &in[1], &L.b, &b.d));
    memcpy(a.lab, e->lab[0], sizeof a.lab);
    memcpy(b.lab, e->lab[1], sizeof b.lab);
    /* summed-only labels: a label of a alone is kept when it is in b or the output */
    bool keep_a[MAX_LABELS], keep_b[MAX_LABELS];
    for (int l = 0; l < e->nl; l++) {
        keep_a[l] = e->in[1][l] || e->in[2][l];
        keep_b[l] = e->in[0][l] || e->in[2][l];
    }
    DT_TRY(sum_labels(p, &a, keep_a, &ra));
    DT_TRY(sum_labels(p, &b, keep_b, &rb));
    /* the product in output order, for pricing the final transpose */
    dt__dist yref = {.dtype = in[0].dtype, .rank = e->orank, .layout = L.y};
    memcpy(yref.shape, S.oshape, sizeof yref.shape);
    arrangement g;
    arrange_gemm(e, &ra, &rb, &yref, &g);
    ldist lo, ro, c, y;
    DT_TRY(arrange(p, g.swap ? &rb : &ra, g.lorder, &lo));
    DT_TRY(arrange(p, g.swap ? &ra : &rb, g.rorder, &ro));
    /* c_local: (Bo, Ro, Co) local shards; pending sums over the contracted and summed labels'
     * mesh axes (and the operands' partial terms from summed labels) */
    dt_layout cl = dt__layout_none(L.y.mesh, e->orank);
    int64_t cshape[DT_MAX_RANK];
    for (int i = 0; i < e->orank; i++) {
        c.lab[i] = g.corder[i];
        cl.axes[i] = best[g.corder[i]];
        cshape[i] = e->extent[g.corder[i]];
    }
    cl.partial = L.y.partial;
    DT_TRY(dt__slot_new(p, &cl, in[0].dtype, e->orank, cshape, &c.d));
    gemm_ctx gc = {.l = &lo.d,
                   .r = &ro.d,
                   .c = &c.d,
                   .nb = g.nb,
                   .nr = g.nr,
                   .nk = g.nk,
                   .tl = g.tl,
                   .tr = g.tr};
    int ins[2] = {lo.d.slot, ro.d.slot};
    DT_TRY(dt__emit_kernel(p, "einsum", DT__K_GEMM, in[0].dtype, 2, ins, c.d.slot, cl.mesh,
                           gemm_args, &gc));
    DT_TRY(arrange(p, &c, e->out, &y));
    return dt__relayout_emit(p, "einsum", &y.d, &L.final, out);
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    eqn e;
    DT_TRY(parse(n->attrs.equation, &e));
    const int64_t *shapes[2] = {in[0].shape, n->nin > 1 ? in[1].shape : NULL};
    DT_TRY(extents(&e, n->attrs.equation, shapes));
    if (e.n == 1)
        return expand_one(p, &e, &in[0], want, out);
    return expand_two(p, &e, in, want, out);
}

/* Operand q's gradient: the einsum of dy with the other operand giving q's labels that are in
 * the output or the other operand, then broadcast back along q's summed-only labels. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    char lab[2][DT_MAX_RANK + 1] = {{0}}, out[DT_MAX_RANK + 1] = {0};
    const char *eq = n->attrs.equation, *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
    int nin = n->nin;
    if (!arrow || (nin == 2 && !comma))
        return dt__fail(DT_ERR_ARG, "gradient: einsum equation \"%s\"", eq);
    const char *end0 = nin == 2 ? comma : arrow;
    snprintf(lab[0], sizeof lab[0], "%.*s", (int)(end0 - eq), eq);
    if (nin == 2)
        snprintf(lab[1], sizeof lab[1], "%.*s", (int)(arrow - comma - 1), comma + 1);
    snprintf(out, sizeof out, "%s", arrow + 2);
    for (int q = 0; q < nin; q++) {
        if (!dt_dtype_is_floating(x[q]->dtype))
            continue;
        char kept[DT_MAX_RANK + 1] = {0}, eq2[64];
        int nk = 0, gone[DT_MAX_RANK], ngone = 0;
        for (int i = 0; lab[q][i]; i++) {
            char c = lab[q][i];
            if (strchr(out, c) || (nin == 2 && strchr(lab[1 - q], c)))
                kept[nk++] = c;
            else
                gone[ngone++] = i;
        }
        dt_tensor *g;
        if (nin == 2) {
            snprintf(eq2, sizeof eq2, "%s,%s->%s", out, lab[1 - q], kept);
            const dt_tensor *ops[2] = {dy, x[1 - q]};
            DT_TRY(dt__tape_keep(a, dt_einsum(eq2, 2, ops, NULL, &g), &g));
        } else {
            snprintf(eq2, sizeof eq2, "%s->%s", out, kept);
            const dt_tensor *ops[1] = {dy};
            DT_TRY(dt__tape_keep(a, dt_einsum(eq2, 1, ops, NULL, &g), &g));
        }
        if (ngone) { /* summed-only labels: every element of x along them got the same dy */
            for (int i = 0; i < ngone; i++)
                DT_TRY(dt__tape_keep(a, dt_expand_dims(g, gone[i], NULL, &g), &g));
            DT_TRY(dt__tape_broadcast_to(a, g, x[q], &g));
        }
        dx[q] = g;
    }
    return DT_OK;
}

const dt__op_def dt__op_einsum = {.name = "einsum",
                                  .min_inputs = 1,
                                  .max_inputs = 2,
                                  .infer = infer,
                                  .expand = expand,
                                  .vjp = vjp};

/* ---- the public call: the equation made canonical ----------------------------------------- */

/* "...ij,...jk" style input: explicit labels, ellipses expanded into fresh letters (aligned
 * right, as numpy broadcasts; the extents must then be equal), an implicit output made
 * explicit (ellipsis labels, then the labels used once, alphabetically), spaces removed. */
static dt_status canonical(const char *eq, int n, const dt_tensor *const xs[], char *buf,
                           size_t size)
{
    char parts[3][64];
    int np = 0, len = 0, commas = 0;
    bool arrow = false;
    memset(parts, 0, sizeof parts);
    for (const char *c = eq; *c; c++) {
        if (isspace((unsigned char)*c))
            continue;
        if (c[0] == '-' && c[1] == '>') {
            if (arrow)
                return dt__fail(DT_ERR_ARG, "einsum: \"%s\" has two outputs (->)", eq);
            arrow = true;
            np = 2;
            len = 0;
            c++;
            continue;
        }
        if (*c == ',' && !arrow) {
            if (++commas > 1)
                return dt__fail(DT_ERR_ARG, "einsum: \"%s\" names more than 2 operands", eq);
            np = 1;
            len = 0;
            continue;
        }
        if (len >= 60)
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\" is too long", eq);
        parts[np][len++] = *c;
    }
    int nin = commas + 1;
    if (nin != n)
        return dt__fail(DT_ERR_ARG, "einsum: \"%s\" names %d operand%s, %d given", eq, nin,
                        nin == 1 ? "" : "s", n);
    /* fresh letters for ellipses: ones used nowhere */
    bool used[128] = {false};
    for (const char *c = eq; *c; c++)
        used[(unsigned char)*c & 127] = true;
    char fresh[DT_MAX_RANK + 1];
    int nf = 0;
    for (int c = 'A'; nf < DT_MAX_RANK && c <= 'z'; c++)
        if (isalpha(c) && !used[c])
            fresh[nf++] = (char)c;
    int ell = 0; /* labels an ellipsis stands for (the most over the operands) */
    for (int q = 0; q < n; q++) {
        char *dots = strstr(parts[q], "...");
        if (!dots)
            continue;
        int explicit_labels = (int)strlen(parts[q]) - 3;
        int k = xs[q]->rank - explicit_labels;
        if (k < 0 || strstr(dots + 3, "..."))
            return dt__fail(DT_ERR_ARG, "einsum: \"%s\": operand %d of rank %d and its labels", eq,
                            q, xs[q]->rank);
        ell = k > ell ? k : ell;
    }
    if (ell > nf)
        return dt__fail(DT_ERR_ARG, "einsum: \"%s\": no letters left for the ellipsis", eq);
    char out[3][64];
    for (int q = 0; q < 3; q++) {
        if (q == 2 && !arrow)
            continue;
        char *dots = strstr(parts[q], "...");
        if (!dots) {
            snprintf(out[q], sizeof out[q], "%s", parts[q]);
            continue;
        }
        int k = q < n ? xs[q]->rank - ((int)strlen(parts[q]) - 3) : ell;
        snprintf(out[q], sizeof out[q], "%.*s%.*s%s", (int)(dots - parts[q]), parts[q], k,
                 fresh + ell - k, dots + 3);
    }
    if (!arrow) { /* implicit output: ellipsis labels, then the labels used once, sorted */
        int m = 0;
        for (int i = 0; i < ell; i++)
            out[2][m++] = fresh[i];
        for (int c = 'A'; c <= 'z'; c++) {
            if (!isalpha(c))
                continue;
            int count = 0;
            for (int q = 0; q < n; q++)
                for (const char *s = out[q]; *s; s++)
                    count += *s == c;
            bool is_fresh = memchr(fresh, c, (size_t)ell) != NULL;
            if (count == 1 && !is_fresh && m < 63)
                out[2][m++] = (char)c;
        }
        out[2][m] = '\0';
    }
    int w = n == 2 ? snprintf(buf, size, "%s,%s->%s", out[0], out[1], out[2])
                   : snprintf(buf, size, "%s->%s", out[0], out[2]);
    if (w < 0 || (size_t)w >= size)
        return dt__fail(DT_ERR_ARG, "einsum: \"%s\" has too many labels", eq);
    return DT_OK;
}

dt_status dt_einsum(const char *equation, int n, const dt_tensor *const xs[],
                    const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!equation || n < 1 || n > 2 || !xs)
        return dt__call_fail(DT__OP_EINSUM, xs && n > 0 && n <= 2 ? n : 0, xs, opts,
                             dt__fail(DT_ERR_ARG, "einsum: %s, %d operands (1 or 2)",
                                      equation ? "an equation" : "equation NULL", n));
    for (int q = 0; q < n; q++)
        if (!xs[q])
            return dt__call_fail(DT__OP_EINSUM, n, xs, opts,
                                 dt__fail(DT_ERR_ARG, "einsum: operand %d is NULL", q));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    dt_status s = canonical(equation, n, xs, a.equation, sizeof a.equation);
    if (s != DT_OK) /* every client passes the same equation: all fail alike */
        return dt__call_fail(DT__OP_EINSUM, n, xs, opts, s);
    return dt__call(DT__OP_EINSUM, &a, n, xs, opts, out);
}
