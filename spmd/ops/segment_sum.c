/* unsorted_segment_sum (tf.math.unsorted_segment_sum): rows of data added into segments.
 *
 *   data [i..., d...] (numeric), segment_ids [i...] (i32 or i64), num_segments N
 *     ->  y [N, d...],  y[s, :] = sum of data[i..., :] over the i with segment_ids[i...] == s
 *   Ids outside [0, N) contribute nothing (never a write out of bounds).
 *
 * The gradient of gather (the table's gradient: dy's rows added at the ids). With N split over
 * mesh axis v (the table's layout requested), each device adds only the rows its shard of N
 * owns, from its local data rows: no communication for v. A sharded ids axis (the batch)
 * leaves each device a sum over its own rows, pending terms of a sum over that mesh axis: y is
 * partial over it, then all-reduced, reduce-scattered into a requested sharding of N or d, or
 * kept when the request is partial. The ids are relayouted to lie as data's leading axes do; a
 * sharded d axis of data carries to y. A partial-sum data stays partial (linear); partial ids
 * are summed first.
 *
 * The expansion assigns a mesh axis (or none) to N, to each ids axis and to each d axis, all
 * distinct; the cheapest by the alpha-beta model wins (e.g. ids and N on the same mesh axis:
 * data gathered over it, or a local sum of every segment then a reduce-scatter).
 *
 * With a third operand `base` of the result's shape and dtype (dt__segment_sum_into: the
 * autodiff's accumulation of a gather's gradient into another gradient of the same table), the
 * result is base with the segment sums added at the rows the ids select: each row's sum is
 * formed from 0 in index order, then added to base's row once, so the result is bitwise
 * base + unsorted_segment_sum(...) (an unselected row is base's own, where the addition would
 * have turned a -0 into +0). base is laid out as the sum is computed (partial over the mesh axes
 * splitting the ids: its first member keeps base, the others zeros, and the all-reduce then sums
 * base and the devices' sums in its order); no [N, d...] tensor of zeros is made and added. When
 * base is a temporary dead after the step (the tied embedding's dense gradient), the program runs
 * the step in place (spmd/program.c): the kernel's base is its output's own buffer, and the
 * selected rows are added where they lie, with no copy of base. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0], *ids = in[1];
    char sx[DT__SHAPE_STR_MAX], si[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    dt__shape_str(si, sizeof si, ids->rank, ids->shape);
    DT_TRY(dt__dtype_check("unsorted_segment_sum", x->dtype, DT__NUMERIC));
    if (ids->dtype != DT_DTYPE_I32 && ids->dtype != DT_DTYPE_I64)
        return dt__fail(DT_ERR_DTYPE,
                        "unsorted_segment_sum: segment ids %s are %s, expected i32 "
                        "or i64",
                        si, dt_dtype_name(ids->dtype));
    bool prefix = ids->rank <= x->rank;
    for (int i = 0; prefix && i < ids->rank; i++)
        prefix = ids->shape[i] == x->shape[i];
    if (!prefix)
        return dt__fail(DT_ERR_SHAPE,
                        "unsorted_segment_sum: segment ids %s are not a prefix of data %s", si, sx);
    int64_t N = n->attrs.depth;
    if (N < 0)
        return dt__fail(DT_ERR_ARG, "unsorted_segment_sum: num_segments %lld is negative",
                        (long long)N);
    out->dtype = x->dtype;
    out->rank = 1 + x->rank - ids->rank;
    out->shape[0] = N;
    for (int i = ids->rank; i < x->rank; i++)
        out->shape[1 + i - ids->rank] = x->shape[i];
    if (n->nin == 3) {
        const dt__val *b = in[2];
        bool same = b->dtype == out->dtype && b->rank == out->rank;
        for (int i = 0; same && i < out->rank; i++)
            same = b->shape[i] == out->shape[i];
        if (!same) {
            char sb[DT__SHAPE_STR_MAX], so[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "unsorted_segment_sum: base %s%s, the sum %s%s",
                dt_dtype_name(b->dtype), dt__shape_str(sb, sizeof sb, b->rank, b->shape),
                dt_dtype_name(out->dtype), dt__shape_str(so, sizeof so, out->rank, out->shape));
        }
    }
    return DT_OK;
}

/* Slots: 0 = N, 1..r = the ids' axes, r+1..r+k = data's trailing axes. */
typedef struct ssearch {
    const dt__dist *x, *ids, *base; /* base: NULL, or the sum's starting value */
    const dt_layout *want;
    int r, k;
    int64_t yshape[DT_MAX_RANK];
} ssearch;

typedef struct slayouts {
    dt_layout x, ids, y, final;
} slayouts;

static void layouts_of(const ssearch *S, const int ax[], slayouts *L)
{
    const dt_mesh *m = S->x->layout.mesh;
    unsigned used = 0, rows = 0;
    for (int s = 0; s < 1 + S->r + S->k; s++)
        if (ax[s] != DT_UNSHARDED)
            used |= 1u << ax[s];
    for (int i = 0; i < S->r; i++)
        if (ax[1 + i] != DT_UNSHARDED)
            rows |= 1u << ax[1 + i];
    unsigned keep = S->x->layout.partial_op == DT_REDUCE_SUM ? S->x->layout.partial & ~used : 0;
    L->x = dt__layout_none(m, S->r + S->k);
    L->x.partial = keep;
    L->ids = dt__layout_none(m, S->r);
    for (int i = 0; i < S->r; i++)
        L->x.axes[i] = L->ids.axes[i] = ax[1 + i];
    L->y = dt__layout_none(m, 1 + S->k);
    L->y.axes[0] = ax[0];
    for (int j = 0; j < S->k; j++)
        L->x.axes[S->r + j] = L->y.axes[1 + j] = ax[1 + S->r + j];
    L->y.partial = keep | rows; /* each device summed only its own rows */
    L->final = dt__search_final(S->want, &L->y);
}

static double cost(void *ctx, const int ax[])
{
    const ssearch *S = ctx;
    slayouts L;
    layouts_of(S, ax, &L);
    const dt__dist *x = S->x, *ids = S->ids;
    double es = (double)dt_dtype_size(x->dtype);
    double adds = (double)dt__max_local_elems(&L.x, x->rank, x->shape) * es * DT__BETA_LOCAL +
                  (double)dt__max_local_elems(&L.y, 1 + S->k, S->yshape) * es * DT__BETA_LOCAL;
    double base =
        S->base ? dt__relayout_cost(&S->base->layout, &L.y, x->dtype, 1 + S->k, S->yshape) : 0;
    return base + dt__relayout_cost(&x->layout, &L.x, x->dtype, x->rank, x->shape) +
           dt__relayout_cost(&ids->layout, &L.ids, ids->dtype, ids->rank, ids->shape) +
           dt__relayout_cost(&L.y, &L.final, x->dtype, 1 + S->k, S->yshape) + adds;
}

typedef struct segment_ctx {
    const dt__dist *x, *ids, *y;
    bool into; /* a base operand follows */
} segment_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    segment_ctx *c = ctx;
    int64_t xl[DT_MAX_RANK], il[DT_MAX_RANK], yl[DT_MAX_RANK], yo[DT_MAX_RANK];
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, xl, NULL);
    dt__local_shape(c->ids, d, il, NULL);
    dt__local_shape(c->y, d, yl, yo);
    /* x_local: (nidx, inner); ids_local: nidx; y_local: (rows of [lo, lo + rows), inner) */
    k->from = c->ids->dtype;
    k->nidx = dt__num_elements(c->ids->rank, il);
    k->inner = dt__num_elements(c->x->rank - c->ids->rank, xl + c->ids->rank);
    k->lo = yo[0];
    k->rows = yl[0];
    k->mode = c->into ? DT__SEGMENT_INTO : 0u;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    ssearch S = {.x = &in[0],
                 .ids = &in[1],
                 .base = n->nin == 3 ? &in[2] : NULL,
                 .want = want,
                 .r = in[1].rank};
    S.k = in[0].rank - S.r;
    S.yshape[0] = n->attrs.depth;
    for (int j = 0; j < S.k; j++)
        S.yshape[1 + j] = in[0].shape[S.r + j];
    dt__assign A = {.n = 1 + S.r + S.k};
    if (want)
        dt__assign_add(&A, 0, want->axes[0]);
    for (int i = 0; i < S.r; i++) {
        dt__assign_add(&A, 1 + i, in[0].layout.axes[i]);
        dt__assign_add(&A, 1 + i, in[1].layout.axes[i]);
    }
    for (int j = 0; j < S.k; j++) {
        dt__assign_add(&A, 1 + S.r + j, in[0].layout.axes[S.r + j]);
        if (want)
            dt__assign_add(&A, 1 + S.r + j, want->axes[1 + j]);
    }
    for (int s = 0; s < A.n; s++)
        dt__assign_add(&A, s, DT_UNSHARDED);
    int best[DT__ASSIGN_MAX];
    if (!dt__assign_best(&A, cost, &S, best)) {
        char lx[DT_STRING_MAX], li[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT,
                        "unsorted_segment_sum: no expansion for data \"%s\", segment ids \"%s\"",
                        dt__layout_str(&in[0].layout, lx, sizeof lx),
                        dt__layout_str(&in[1].layout, li, sizeof li));
    }
    slayouts L;
    layouts_of(&S, best, &L);
    dt__dist x, ids, y, base;
    DT_TRY(dt__relayout_emit(p, "unsorted_segment_sum", &in[0], &L.x, &x));
    DT_TRY(dt__relayout_emit(p, "unsorted_segment_sum", &in[1], &L.ids, &ids));
    int ins[3] = {x.slot, ids.slot, -1};
    if (S.base) { /* base_local: y's shard (partial as y: base on each group's first member) */
        DT_TRY(dt__relayout_emit(p, "unsorted_segment_sum", S.base, &L.y, &base));
        ins[2] = base.slot;
    }
    /* y_local: (N shard, d_local...), partial over the mesh axes splitting the ids */
    DT_TRY(dt__slot_new(p, &L.y, x.dtype, 1 + S.k, S.yshape, &y));
    segment_ctx c = {.x = &x, .ids = &ids, .y = &y, .into = S.base != NULL};
    DT_TRY(dt__emit_kernel(p, "unsorted_segment_sum", DT__K_SEGMENT_SUM, x.dtype, n->nin, ins,
                           y.slot, L.y.mesh, args, &c));
    return dt__relayout_emit(p, "unsorted_segment_sum", &y, &L.final, out);
}

/* A base is wanted as the sum is: the other gradient of the table (a tied embedding's
 * output projection) then comes out of its own expansion in the table's layout (reduce-
 * scattered into row shards, say), not whole, and the rows are added to it there. */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    return i == 2 && dt__pull_same(n, in, want, i, in_want);
}

/* Each data row's gradient is dy's row of its segment (zeros for an id outside the segments);
 * a base's is dy. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    if (n->nin == 3)
        dx[2] = dy;
    return dt__tape_keep(a, dt_gather(dy, x[1], NULL, &dx[0]), &dx[0]);
}

const dt__op_def dt__op_segment_sum = {.name = "unsorted_segment_sum",
                                       .min_inputs = 2,
                                       .max_inputs = 3,
                                       .infer = infer,
                                       .expand = expand,
                                       .pull = pull,
                                       .vjp = vjp};

dt_status dt_unsorted_segment_sum(const dt_tensor *data, const dt_tensor *segment_ids,
                                  int64_t num_segments, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.depth = num_segments;
    const dt_tensor *in[2] = {data, segment_ids};
    return dt__call(DT__OP_SEGMENT_SUM, &a, 2, in, opts, out);
}

dt_status dt__segment_sum_into(const dt_tensor *data, const dt_tensor *segment_ids,
                               int64_t num_segments, const dt_tensor *base, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.depth = num_segments;
    const dt_tensor *in[3] = {data, segment_ids, base};
    return dt__call(DT__OP_SEGMENT_SUM, &a, 3, in, NULL, out);
}
