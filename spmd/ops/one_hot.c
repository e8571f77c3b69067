/* one_hot (tf.one_hot): indices [i...] (i32, i64, u8 or i8) -> y with a depth axis inserted at
 * `axis`: on_value where the index equals the position along it, off_value elsewhere (an
 * index outside [0, depth) gives a row of off_value), in any dtype.
 *
 * Each device writes its own shard of y from its shard of the indices, comparing them with the
 * global positions of its slice of the depth axis: a depth axis requested sharded needs no
 * communication. The indices' sharding carries to y's other axes. The expansion assigns a mesh
 * axis (or none) to every axis of y, the depth axis and the indices' axes from what the
 * indices and the request use; moving the indices (small) is priced against moving y by the
 * alpha-beta model. Partial indices are summed first. No collective otherwise. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    const dt__attrs *a = &n->attrs;
    char sx[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    if (x->dtype != DT_DTYPE_I32 && x->dtype != DT_DTYPE_I64 && x->dtype != DT_DTYPE_U8 &&
        x->dtype != DT_DTYPE_I8)
        return dt__fail(DT_ERR_DTYPE, "one_hot: indices %s are %s, expected i32, i64, u8 or i8", sx,
                        dt_dtype_name(x->dtype));
    DT_TRY(dt__dtype_check("one_hot", a->dtype, DT__ANY));
    if (x->rank + 1 > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE, "one_hot: indices %s have rank %d, at most %d", sx, x->rank,
                        DT_MAX_RANK - 1);
    if (a->axis < 0 || a->axis > x->rank)
        return dt__fail(DT_ERR_ARG, "one_hot: axis %d is outside 0..%d for indices %s", a->axis,
                        x->rank, sx);
    if (a->depth < 0)
        return dt__fail(DT_ERR_ARG, "one_hot: depth %lld is negative", (long long)a->depth);
    DT_TRY(dt__value_check("one_hot: on_value", a->a, a->dtype));
    DT_TRY(dt__value_check("one_hot: off_value", a->b, a->dtype));
    out->dtype = a->dtype;
    out->rank = x->rank + 1;
    for (int i = 0, j = 0; i < out->rank; i++)
        out->shape[i] = i == a->axis ? a->depth : x->shape[j++];
    return DT_OK;
}

/* Slots: the axes of y (the depth axis at `axis`). */
typedef struct osearch {
    const dt__dist *x;
    const dt_layout *want;
    int axis;
    dt_dtype dtype;
    int yrank;
    int64_t yshape[DT_MAX_RANK];
} osearch;

static void layouts_of(const osearch *S, const int ax[], dt_layout *xl, dt_layout *yl,
                       dt_layout *fl)
{
    const dt_mesh *m = S->x->layout.mesh;
    *xl = dt__layout_none(m, S->x->rank);
    *yl = dt__layout_none(m, S->yrank);
    for (int i = 0, j = 0; i < S->yrank; i++) {
        yl->axes[i] = ax[i];
        if (i != S->axis)
            xl->axes[j++] = ax[i];
    }
    if (S->want) {
        *fl = *S->want;
    } else {
        *fl = *yl;
    }
}

static double cost(void *ctx, const int ax[])
{
    const osearch *S = ctx;
    dt_layout xl, yl, fl;
    layouts_of(S, ax, &xl, &yl, &fl);
    double write = (double)dt__max_local_elems(&yl, S->yrank, S->yshape) *
                   (double)dt_dtype_size(S->dtype) * DT__BETA_LOCAL;
    return dt__relayout_cost(&S->x->layout, &xl, S->x->dtype, S->x->rank, S->x->shape) +
           dt__relayout_cost(&yl, &fl, S->dtype, S->yrank, S->yshape) + write;
}

typedef struct one_hot_ctx {
    const dt__dist *x, *y;
    int axis;
    double on, off;
} one_hot_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    one_hot_ctx *c = ctx;
    int64_t xl[DT_MAX_RANK], yl[DT_MAX_RANK], yo[DT_MAX_RANK];
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, xl, NULL);
    dt__local_shape(c->y, d, yl, yo);
    /* x_local: (outer, inner) around `axis`; y_local: (outer, depth slice [lo, lo + rows),
     * inner) */
    k->from = c->x->dtype;
    k->nidx = dt__num_elements(c->x->rank, xl);
    k->inner = dt__num_elements(c->x->rank - c->axis, xl + c->axis);
    k->lo = yo[c->axis];
    k->rows = yl[c->axis];
    k->a = c->on;
    k->b = c->off;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__attrs *a = &n->attrs;
    osearch S = {.x = &in[0], .want = want, .axis = a->axis, .dtype = a->dtype};
    S.yrank = in[0].rank + 1;
    for (int i = 0, j = 0; i < S.yrank; i++)
        S.yshape[i] = i == a->axis ? a->depth : in[0].shape[j++];
    dt__assign A = {.n = S.yrank};
    for (int i = 0, j = 0; i < S.yrank; i++) {
        if (i != a->axis)
            dt__assign_add(&A, i, in[0].layout.axes[j++]);
        if (want)
            dt__assign_add(&A, i, want->axes[i]);
        dt__assign_add(&A, i, DT_UNSHARDED);
    }
    int best[DT__ASSIGN_MAX];
    if (!dt__assign_best(&A, cost, &S, best))
        return dt__fail(DT_ERR_LAYOUT, "one_hot: no expansion");
    dt_layout xl, yl, fl;
    layouts_of(&S, best, &xl, &yl, &fl);
    dt__dist x, y;
    DT_TRY(dt__relayout_emit(p, "one_hot", &in[0], &xl, &x));
    DT_TRY(dt__slot_new(p, &yl, a->dtype, S.yrank, S.yshape, &y));
    one_hot_ctx c = {.x = &x, .y = &y, .axis = a->axis, .on = a->a, .off = a->b};
    DT_TRY(dt__emit_kernel(p, "one_hot", DT__K_ONE_HOT, a->dtype, 1, &x.slot, y.slot, yl.mesh, args,
                           &c));
    return dt__finish(p, "one_hot", &y, want, out);
}

const dt__op_def dt__op_one_hot = {
    .name = "one_hot", .min_inputs = 1, .max_inputs = 1, .infer = infer, .expand = expand};

dt_status dt_one_hot(const dt_tensor *indices, int64_t depth, double on_value, double off_value,
                     int axis, dt_dtype dtype, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.depth = depth;
    a.a = on_value;
    a.b = off_value;
    a.dtype = dtype;
    a.axis = axis;
    if (indices && axis < 0 && axis + indices->rank + 1 >= 0) /* -1: the new last axis */
        a.axis = axis + indices->rank + 1;
    const dt_tensor *in[1] = {indices};
    return dt__call(DT__OP_ONE_HOT, &a, 1, in, opts, out);
}
