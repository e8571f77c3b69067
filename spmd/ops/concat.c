/* concat: join operands along `axis`. The result takes the first operand's layout (partial
 * terms summed). Each operand, as it lies, sends every device the part of its shard of the
 * result that it holds (a block exchange, or a local copy when nothing crosses devices): no
 * axis is gathered. */
#include "../engine.h"

#include <stdlib.h>
#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x0 = in[0];
    int axis = n->attrs.axis;
    if (axis < 0 || axis >= x0->rank)
        return dt__fail(DT_ERR_ARG, "concat: axis %d is outside a tensor of rank %d", axis,
                        x0->rank);
    *out = *x0;
    out->has_layout = false;
    out->shape[axis] = 0;
    for (int t = 0; t < n->nin; t++) {
        const dt__val *x = in[t];
        bool ok = x->rank == x0->rank && x->dtype == x0->dtype;
        for (int i = 0; ok && i < x->rank; i++)
            ok = i == axis || x->shape[i] == x0->shape[i];
        if (!ok) {
            char s0[DT__SHAPE_STR_MAX], st[DT__SHAPE_STR_MAX];
            return dt__fail(
                x->dtype != x0->dtype ? DT_ERR_DTYPE : DT_ERR_SHAPE,
                "concat: operand %d is %s%s, operand 0 is %s%s (axis %d may differ)", t,
                dt_dtype_name(x->dtype), dt__shape_str(st, sizeof st, x->rank, x->shape),
                dt_dtype_name(x0->dtype), dt__shape_str(s0, sizeof s0, x0->rank, x0->shape), axis);
        }
        out->shape[axis] += x->shape[axis];
    }
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int axis = n->attrs.axis, r = in[0].rank;
    dt_layout yl = in[0].layout;
    yl.partial = 0;
    int64_t shape[DT_MAX_RANK];
    memcpy(shape, in[0].shape, sizeof shape);
    shape[axis] = 0;
    for (int t = 0; t < n->nin; t++)
        shape[axis] += in[t].shape[axis];
    dt__dist y;
    DT_TRY(dt__slot_new(p, &yl, in[0].dtype, r, shape, &y));
    int64_t shift[DT_MAX_RANK] = {0};
    for (int t = 0; t < n->nin; t++) {
        /* operand t fills [at, at + its extent) of the joined axis: result index g is its
         * index g - at; its terms are summed first */
        dt__dist x;
        DT_TRY(dt__resolve_partial(p, "concat", &in[t], &x));
        DT_TRY(dt__emit_exchange_into(p, "concat", &x, shift, &y));
        shift[axis] -= in[t].shape[axis];
    }
    return dt__finish(p, "concat", &y, want, out);
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    int axis = n->attrs.axis;
    int64_t at = 0;
    for (int t = 0; t < n->nin; t++) {
        int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
        memcpy(size, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
        begin[axis] = at;
        size[axis] = x[t]->shape[axis];
        at += x[t]->shape[axis];
        DT_TRY(dt__tape_keep(a, dt_slice(dy, begin, size, NULL, &dx[t]), &dx[t]));
    }
    return DT_OK;
}

const dt__op_def dt__op_concat = {.name = "concat",
                                  .min_inputs = 1,
                                  .max_inputs = DT__MAX_INPUTS,
                                  .infer = infer,
                                  .expand = expand,
                                  .vjp = vjp};

dt_status dt_concat(int n, const dt_tensor *const xs[], int axis, const dt_op_options *opts,
                    dt_tensor **out)
{
    DT__SERIAL();
    if (out)
        *out = NULL;
    const dt__agreement ag = {.what = "concat"};
    if (n < 1 || n > DT__MAX_INPUTS || !xs) /* the mesh is unknown: agree with every client */
        return dt__mesh_agree(
            NULL, dt__fail(DT_ERR_ARG, "concat: %d operands, expected 1 to %d", n, DT__MAX_INPUTS),
            &ag);
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis;
    if (xs[0] && axis < 0) {
        a.axis = axis + xs[0]->rank;
        if (a.axis < 0) /* named as given; the other clients fail with this one */
            return dt__mesh_agree(xs[0]->mesh,
                                  dt__fail(DT_ERR_ARG,
                                           "concat: axis %d is outside a tensor of rank %d", axis,
                                           xs[0]->rank),
                                  &ag);
    }
    return dt__call(DT__OP_CONCAT, &a, n, xs, opts, out);
}
