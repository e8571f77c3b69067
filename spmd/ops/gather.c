/* gather: rows of a table by integer ids (tf.gather along axis 0, tf.nn.embedding_lookup).
 *
 *   table [V, d...] (any dtype), ids [i...] (i32 or i64)  ->  y [i..., d...]
 *   y[i..., :] = table[ids[i...], :], and zeros where an id is outside [0, V): ids are data, so
 *   a bad id is never an error on some client and never a read out of bounds.
 *
 * Vocabulary-parallel lookup (Megatron-LM's embedding): with V split over mesh axis v, each
 * device looks up the ids its rows own and writes zeros for the rest, so the local results are
 * pending terms of a sum over v: y is partial over v. It is then all-reduced over v (one
 * all-reduce of the local y), reduce-scattered when the request shards an axis of y on v, or
 * kept when the request is partial. The ids must be replicated over v (they are relayouted
 * when they are not); their other sharding (the batch) carries to y's leading axes, and a
 * sharded d axis of the table to y's trailing ones. A partial-sum table stays partial (the
 * lookup is linear in the table); partial ids are summed first.
 *
 * The expansion assigns a mesh axis (or none) to V, to each ids axis and to each d axis, all
 * distinct, from what the operands and the request use; the cheapest by the alpha-beta model
 * (moving the table and the ids, the lookup, moving y to the request) wins. */
#include "../engine.h"

#include <math.h>
#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)n;
    const dt__val *t = in[0], *ids = in[1];
    char st[DT__SHAPE_STR_MAX], si[DT__SHAPE_STR_MAX];
    dt__shape_str(st, sizeof st, t->rank, t->shape);
    dt__shape_str(si, sizeof si, ids->rank, ids->shape);
    if (ids->dtype != DT_DTYPE_I32 && ids->dtype != DT_DTYPE_I64)
        return dt__fail(DT_ERR_DTYPE, "gather: ids %s are %s, expected i32 or i64", si,
                        dt_dtype_name(ids->dtype));
    if (t->rank < 1)
        return dt__fail(DT_ERR_SHAPE, "gather: the table is a scalar %s, it needs rank >= 1", st);
    if (ids->rank + t->rank - 1 > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE,
                        "gather: table %s and ids %s give a result of rank %d, more than %d", st,
                        si, ids->rank + t->rank - 1, DT_MAX_RANK);
    out->dtype = t->dtype;
    out->rank = ids->rank + t->rank - 1;
    for (int i = 0; i < ids->rank; i++)
        out->shape[i] = ids->shape[i];
    for (int i = 1; i < t->rank; i++)
        out->shape[ids->rank + i - 1] = t->shape[i];
    return DT_OK;
}

/* Slots: 0 = V, 1..r = the ids' axes, r+1..r+k = the table's trailing axes. */
typedef struct gsearch {
    const dt__dist *t, *ids;
    const dt_layout *want;
    int r, k;
    int yrank;
    int64_t yshape[DT_MAX_RANK];
} gsearch;

typedef struct glayouts {
    dt_layout t, ids, y, final;
} glayouts;

static void layouts_of(const gsearch *S, const int ax[], glayouts *L)
{
    const dt_mesh *m = S->t->layout.mesh;
    unsigned used = 0;
    for (int s = 0; s < 1 + S->r + S->k; s++)
        if (ax[s] != DT_UNSHARDED)
            used |= 1u << ax[s];
    /* a partial-sum table stays partial on the mesh axes no slot takes */
    unsigned keep = S->t->layout.partial_op == DT_REDUCE_SUM ? S->t->layout.partial & ~used : 0;
    L->t = dt__layout_none(m, 1 + S->k);
    L->t.axes[0] = ax[0];
    L->t.partial = keep;
    L->ids = dt__layout_none(m, S->r);
    L->y = dt__layout_none(m, S->yrank);
    for (int i = 0; i < S->r; i++)
        L->ids.axes[i] = L->y.axes[i] = ax[1 + i];
    for (int j = 0; j < S->k; j++)
        L->t.axes[1 + j] = L->y.axes[S->r + j] = ax[1 + S->r + j];
    L->y.partial = keep | (ax[0] != DT_UNSHARDED ? 1u << ax[0] : 0u);
    L->final = dt__search_final(S->want, &L->y);
}

static double cost(void *ctx, const int ax[])
{
    const gsearch *S = ctx;
    glayouts L;
    layouts_of(S, ax, &L);
    const dt__dist *t = S->t, *ids = S->ids;
    double lookup = (double)dt__max_local_elems(&L.y, S->yrank, S->yshape) *
                    (double)dt_dtype_size(t->dtype) * DT__BETA_LOCAL;
    return dt__relayout_cost(&t->layout, &L.t, t->dtype, t->rank, t->shape) +
           dt__relayout_cost(&ids->layout, &L.ids, ids->dtype, ids->rank, ids->shape) +
           dt__relayout_cost(&L.y, &L.final, t->dtype, S->yrank, S->yshape) + lookup;
}

typedef struct gather_ctx {
    const dt__dist *t, *ids, *y;
} gather_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    gather_ctx *c = ctx;
    int64_t tl[DT_MAX_RANK], to[DT_MAX_RANK], il[DT_MAX_RANK];
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->t, d, tl, to);
    dt__local_shape(c->ids, d, il, NULL);
    /* table_local: (rows of [lo, lo + rows), inner); ids_local: nidx; y_local: (nidx, inner) */
    k->from = c->ids->dtype;
    k->lo = to[0];
    k->rows = tl[0];
    k->inner = dt__num_elements(c->t->rank - 1, tl + 1);
    k->nidx = dt__num_elements(c->ids->rank, il);
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)n;
    gsearch S = {.t = &in[0], .ids = &in[1], .want = want, .r = in[1].rank, .k = in[0].rank - 1};
    S.yrank = S.r + S.k;
    for (int i = 0; i < S.r; i++)
        S.yshape[i] = in[1].shape[i];
    for (int j = 0; j < S.k; j++)
        S.yshape[S.r + j] = in[0].shape[1 + j];
    dt__assign A = {.n = 1 + S.r + S.k};
    /* candidates: what the operands and the request use, then none; V also on a mesh axis the
     * request leaves partial (the lookup's partial sum is then what is asked) */
    dt__assign_add(&A, 0, in[0].layout.axes[0]);
    for (int a = 0; want && a < want->mesh->num_axes; a++)
        if (want->partial & (1u << a))
            dt__assign_add(&A, 0, a);
    for (int i = 0; i < S.r; i++) {
        dt__assign_add(&A, 1 + i, in[1].layout.axes[i]);
        if (want)
            dt__assign_add(&A, 1 + i, want->axes[i]);
    }
    for (int j = 0; j < S.k; j++) {
        dt__assign_add(&A, 1 + S.r + j, in[0].layout.axes[1 + j]);
        if (want)
            dt__assign_add(&A, 1 + S.r + j, want->axes[S.r + j]);
    }
    for (int s = 0; s < A.n; s++)
        dt__assign_add(&A, s, DT_UNSHARDED);
    int best[DT__ASSIGN_MAX];
    if (!dt__assign_best(&A, cost, &S, best)) {
        char lt[DT_STRING_MAX], li[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT, "gather: no expansion for table \"%s\", ids \"%s\"",
                        dt__layout_str(&in[0].layout, lt, sizeof lt),
                        dt__layout_str(&in[1].layout, li, sizeof li));
    }
    glayouts L;
    layouts_of(&S, best, &L);
    dt__dist t, ids, y;
    DT_TRY(dt__relayout_emit(p, "gather", &in[0], &L.t, &t));
    DT_TRY(dt__relayout_emit(p, "gather", &in[1], &L.ids, &ids));
    /* y_local: (ids_local..., d_local...), partial over V's mesh axis when V is sharded */
    DT_TRY(dt__slot_new(p, &L.y, t.dtype, S.yrank, S.yshape, &y));
    gather_ctx c = {.t = &t, .ids = &ids, .y = &y};
    int ins[2] = {t.slot, ids.slot};
    DT_TRY(dt__emit_kernel(p, "gather", DT__K_GATHER, t.dtype, 2, ins, y.slot, L.y.mesh, args, &c));
    return dt__relayout_emit(p, "gather", &y, &L.final, out);
}

/* The ids follow the request's leading axes (the table is usually a variable: no pull). */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    if (i != 1)
        return false;
    *in_want = dt__layout_none(want->mesh, in[1]->rank);
    unsigned v = in[0]->has_layout && in[0]->layout.axes[0] != DT_UNSHARDED
                     ? 1u << in[0]->layout.axes[0]
                     : 0u;
    for (int q = 0; q < in[1]->rank; q++)
        if (want->axes[q] == DT_UNSHARDED || !(v & (1u << want->axes[q])))
            in_want->axes[q] = want->axes[q];
    return true;
}

/* The table's gradient: dy's rows added at the ids (requested in the table's layout by the
 * pass's final relayout, so with V split each device adds only the rows its shard owns); the
 * ids are integers: nothing flows. Noted by the pass: where another gradient of the table
 * meets it (a tied embedding's output projection), dy's rows are added into that one. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return dt__tape_segment_sum(a, dy, x[1], x[0]->shape[0], &dx[0]);
}

const dt__op_def dt__op_gather = {.name = "gather",
                                  .min_inputs = 2,
                                  .max_inputs = 2,
                                  .infer = infer,
                                  .expand = expand,
                                  .pull = pull,
                                  .vjp = vjp};

dt_status dt_gather(const dt_tensor *table, const dt_tensor *ids, const dt_op_options *opts,
                    dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    const dt_tensor *in[2] = {table, ids};
    return dt__call(DT__OP_GATHER, &a, 2, in, opts, out);
}
