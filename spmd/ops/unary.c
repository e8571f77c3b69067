/* Elementwise unary: pending partial terms are summed first (f(a + b) != f(a) + f(b)); then
 * each device maps its shard; the result keeps the operand's sharding unless another layout
 * is requested, and then the cheaper side is moved (operand before, or result after). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    if ((unsigned)n->attrs.op >= DT_UNARY_COUNT)
        return dt__fail(DT_ERR_ARG, "unary: operator %d is outside 0..%d", n->attrs.op,
                        DT_UNARY_COUNT - 1);
    /* logical_not is the one unary op of bool; every other takes the numeric dtypes */
    DT_TRY(dt__dtype_check(dt_unary_op_name((dt_unary_op)n->attrs.op), in[0]->dtype,
                           n->attrs.op == DT_UNARY_LOGICAL_NOT ? DT__BOOL : DT__NUMERIC));
    out->dtype = in[0]->dtype;
    out->rank = in[0]->rank;
    memcpy(out->shape, in[0]->shape, sizeof out->shape);
    return DT_OK;
}

typedef struct unary_ctx {
    const dt__dist *x;
    int op;
} unary_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    unary_ctx *c = ctx;
    dt__kargs_out(k, c->x, d);
    k->op = c->op;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    dt__dist x = in[0], y;
    /* Where to compute: the operand's (non-partial) layout, or the requested one. */
    dt_layout here = x.layout;
    here.partial = 0;
    if (want) {
        dt_layout there = *want;
        there.partial = 0;
        double move_in = dt__relayout_cost(&x.layout, &there, x.dtype, x.rank, x.shape) +
                         dt__relayout_cost(&there, want, x.dtype, x.rank, x.shape);
        double move_out = dt__relayout_cost(&x.layout, &here, x.dtype, x.rank, x.shape) +
                          dt__relayout_cost(&here, want, x.dtype, x.rank, x.shape);
        if (move_in < move_out)
            here = there;
    }
    DT_TRY(dt__relayout_emit(p, "unary", &x, &here, &x));
    DT_TRY(dt__slot_new(p, &x.layout, x.dtype, x.rank, x.shape, &y));
    unary_ctx c = {.x = &x, .op = n->attrs.op};
    DT_TRY(dt__emit_kernel(p, "unary", DT__K_UNARY, x.dtype, 1, &x.slot, y.slot, x.layout.mesh,
                           args, &c));
    return dt__finish(p, "unary", &y, want, out);
}

const dt__op_def dt__op_unary = {.name = "unary",
                                 .min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer,
                                 .expand = expand,
                                 .pull = dt__pull_same};

dt_status dt_unary(dt_unary_op op, const dt_tensor *x, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = (int)op;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_UNARY, &a, 1, in, opts, out);
}
