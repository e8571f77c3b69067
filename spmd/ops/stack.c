/* stack (tf.stack): n tensors of one shape and dtype joined along a new axis `axis` (expand_dims
 * of each, then concat). The result lies as requested (without partial axes), or as the first
 * operand does with the new axis unsharded. Each operand, as it lies (partial terms summed
 * first), sends every device the part of its slice of the result that it holds: a block
 * exchange, or a local copy when nothing crosses devices; no axis is gathered. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x0 = in[0];
    int axis = n->attrs.axis;
    if (x0->rank + 1 > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE, "stack: operands of rank %d, at most %d", x0->rank,
                        DT_MAX_RANK - 1);
    if (axis < 0 || axis > x0->rank)
        return dt__fail(DT_ERR_ARG, "stack: axis %d is outside %d..%d for operands of rank %d",
                        axis, -x0->rank - 1, x0->rank, x0->rank);
    for (int t = 1; t < n->nin; t++) {
        const dt__val *x = in[t];
        bool ok = x->rank == x0->rank && x->dtype == x0->dtype;
        for (int i = 0; ok && i < x->rank; i++)
            ok = x->shape[i] == x0->shape[i];
        if (!ok) {
            char s0[DT__SHAPE_STR_MAX], st[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "stack: operand %d is %s%s, operand 0 is %s%s", t,
                dt_dtype_name(x->dtype), dt__shape_str(st, sizeof st, x->rank, x->shape),
                dt_dtype_name(x0->dtype), dt__shape_str(s0, sizeof s0, x0->rank, x0->shape));
        }
    }
    out->dtype = x0->dtype;
    out->rank = x0->rank + 1;
    for (int i = 0, j = 0; i < out->rank; i++)
        out->shape[i] = i == axis ? n->nin : x0->shape[j++];
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int axis = n->attrs.axis;
    dt__dist first = dt__dist_with_axis(&in[0], axis), y;
    dt_layout yl = want ? *want : first.layout;
    yl.partial = 0;
    int64_t shape[DT_MAX_RANK];
    memcpy(shape, first.shape, sizeof shape);
    shape[axis] = n->nin;
    DT_TRY(dt__slot_new(p, &yl, first.dtype, first.rank, shape, &y));
    for (int t = 0; t < n->nin; t++) {
        /* operand t fills index t of the new axis: result index g is its index g - t */
        dt__dist x;
        DT_TRY(dt__resolve_partial(p, "stack", &in[t], &x));
        x = dt__dist_with_axis(&x, axis);
        int64_t shift[DT_MAX_RANK] = {0};
        shift[axis] = -t;
        DT_TRY(dt__emit_exchange_into(p, "stack", &x, shift, &y));
    }
    return dt__finish(p, "stack", &y, want, out);
}

/* Operand t's gradient is dy's slice t along the new axis, that axis removed. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int axis = n->attrs.axis;
    for (int t = 0; t < n->nin; t++) {
        int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
        memcpy(size, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
        begin[axis] = t;
        size[axis] = 1;
        dt_tensor *s;
        DT_TRY(dt__tape_keep(a, dt_slice(dy, begin, size, NULL, &s), &s));
        DT_TRY(dt__tape_keep(a, dt_squeeze(s, 1, &axis, NULL, &dx[t]), &dx[t]));
    }
    return DT_OK;
}

const dt__op_def dt__op_stack = {.name = "stack",
                                 .min_inputs = 1,
                                 .max_inputs = DT__MAX_INPUTS,
                                 .infer = infer,
                                 .expand = expand,
                                 .vjp = vjp};

dt_status dt_stack(int n, const dt_tensor *const xs[], int axis, const dt_op_options *opts,
                   dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (n < 1 || n > DT__MAX_INPUTS || !xs)
        return dt__call_fail(
            DT__OP_STACK, 0, NULL, opts,
            dt__fail(DT_ERR_ARG, "stack: %d operands, expected 1 to %d", n, DT__MAX_INPUTS));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis;
    if (xs[0] && axis < 0 && axis + xs[0]->rank + 1 >= 0) /* -1: the new last axis */
        a.axis = axis + xs[0]->rank + 1;
    return dt__call(DT__OP_STACK, &a, n, xs, opts, out);
}
