/* concat: join operands along `axis`. The result takes the first operand's layout (partial
 * terms summed); each operand is relayouted to it with the joined axis unsharded, then each
 * device copies the part of every operand that falls in its shard of the result. */
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
                DT_ERR_SHAPE, "concat: operand %d is %s%s, operand 0 is %s%s (axis %d may differ)",
                t, dt_dtype_name(x->dtype), dt__shape_str(st, sizeof st, x->rank, x->shape),
                dt_dtype_name(x0->dtype), dt__shape_str(s0, sizeof s0, x0->rank, x0->shape), axis);
        }
        out->shape[axis] += x->shape[axis];
    }
    return DT_OK;
}

typedef struct concat_ctx {
    const dt__dist *x, *y;
    int axis;
    int64_t at; /* where x starts on the joined axis */
} concat_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    concat_ctx *c = ctx;
    int r = c->x->rank, ax = c->axis;
    int64_t xl[DT_MAX_RANK], yl[DT_MAX_RANK], yo[DT_MAX_RANK];
    dt__local_shape(c->x, d, xl, NULL);
    dt__local_shape(c->y, d, yl, yo);
    k->rank = r;
    memcpy(k->shape, yl, sizeof k->shape);
    int64_t lo = yo[ax] > c->at ? yo[ax] : c->at;
    int64_t hi =
        yo[ax] + yl[ax] < c->at + c->x->shape[ax] ? yo[ax] + yl[ax] : c->at + c->x->shape[ax];
    if (hi <= lo)
        return;
    k->nblocks = 1;
    k->blocks = calloc(1, sizeof *k->blocks);
    if (!k->blocks)
        return;
    dt__block *b = k->blocks;
    b->rank = r;
    memcpy(b->src_shape, xl, sizeof b->src_shape);
    memcpy(b->dst_shape, yl, sizeof b->dst_shape);
    memcpy(b->extent, yl, sizeof b->extent);
    b->extent[ax] = hi - lo;
    b->src_off[ax] = lo - c->at;
    b->dst_off[ax] = lo - yo[ax];
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int axis = n->attrs.axis, r = in[0].rank;
    dt_layout yl = in[0].layout;
    yl.partial = 0;
    dt_layout xl = yl;
    xl.axes[axis] = DT_UNSHARDED;
    int64_t shape[DT_MAX_RANK];
    memcpy(shape, in[0].shape, sizeof shape);
    shape[axis] = 0;
    for (int t = 0; t < n->nin; t++)
        shape[axis] += in[t].shape[axis];
    dt__dist y;
    DT_TRY(dt__slot_new(p, &yl, in[0].dtype, r, shape, &y));
    int64_t at = 0;
    for (int t = 0; t < n->nin; t++) {
        dt__dist x;
        DT_TRY(dt__relayout_emit(p, "concat", &in[t], &xl, &x));
        concat_ctx c = {.x = &x, .y = &y, .axis = axis, .at = at};
        DT_TRY(dt__emit_kernel(p, "concat", DT__K_COPY_BLOCKS, x.dtype, 1, &x.slot, y.slot, yl.mesh,
                               args, &c));
        at += in[t].shape[axis];
    }
    return dt__finish(p, "concat", &y, want, out);
}

const dt__op_def dt__op_concat = {.name = "concat",
                                  .min_inputs = 1,
                                  .max_inputs = DT__MAX_INPUTS,
                                  .infer = infer,
                                  .expand = expand};

dt_status dt_concat(int n, const dt_tensor *const xs[], int axis, const dt_op_options *opts,
                    dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (n < 1 || n > DT__MAX_INPUTS || !xs || !xs[0])
        return dt__fail(DT_ERR_ARG, "concat: %d operands, expected 1 to %d (non-NULL)", n,
                        DT__MAX_INPUTS);
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.axis = axis < 0 ? axis + xs[0]->rank : axis;
    return dt__call(DT__OP_CONCAT, &a, n, xs, opts, out);
}
