/* expand_dims (tf.expand_dims): an axis of extent 1 inserted at `axis`. Metadata only: every
 * device's shard is the same bytes with one more extent-1 axis, the new axis unsharded, partial
 * terms kept; nothing moves (a sharded request for the new axis is then a local slice). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    int axis = n->attrs.axis;
    if (x->rank + 1 > DT_MAX_RANK) {
        char sx[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE, "expand_dims: %s has rank %d, at most %d",
                        dt__shape_str(sx, sizeof sx, x->rank, x->shape), x->rank, DT_MAX_RANK - 1);
    }
    if (axis < 0 || axis > x->rank)
        return dt__fail(DT_ERR_ARG, "expand_dims: axis %d is outside %d..%d for rank %d", axis,
                        -x->rank - 1, x->rank, x->rank);
    out->dtype = x->dtype;
    out->rank = x->rank + 1;
    for (int i = 0, j = 0; i < out->rank; i++)
        out->shape[i] = i == axis ? 1 : x->shape[j++];
    return DT_OK;
}

/* The result without a step (stack.c adds each operand's axis so too). */
dt__dist dt__dist_with_axis(const dt__dist *x, int axis)
{
    dt__dist y = *x;
    y.rank = x->rank + 1;
    y.layout.rank = y.rank;
    for (int i = 0, j = 0; i < y.rank; i++) {
        bool new_axis = i == axis;
        y.shape[i] = new_axis ? 1 : x->shape[j];
        y.layout.axes[i] = new_axis ? DT_UNSHARDED : x->layout.axes[j];
        j += !new_axis;
    }
    return y;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    dt__dist y = dt__dist_with_axis(&in[0], n->attrs.axis);
    return dt__finish(p, "expand_dims", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    *in_want = *want;
    in_want->rank = in[0]->rank;
    for (int q = 0, j = 0; q < want->rank; q++)
        if (q != n->attrs.axis)
            in_want->axes[j++] = want->axes[q];
    in_want->axes[in[0]->rank] = DT_UNSHARDED;
    return true;
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int axis = n->attrs.axis;
    return dt__tape_keep(a, dt_squeeze(dy, 1, &axis, NULL, &dx[0]), &dx[0]);
}

const dt__op_def dt__op_expand_dims = {.name = "expand_dims",
                                       .min_inputs = 1,
                                       .max_inputs = 1,
                                       .infer = infer,
                                       .expand = expand,
                                       .pull = pull,
                                       .vjp = vjp};

dt_status dt_expand_dims(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis;
    if (x && axis < 0 && axis + x->rank + 1 >= 0) /* -1: the new last axis */
        a.axis = axis + x->rank + 1;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_EXPAND_DIMS, &a, 1, in, opts, out);
}
