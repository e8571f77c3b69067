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

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    dt_tensor *t, *u, *z;
    switch ((dt_unary_op)n->attrs.op) {
    case DT_UNARY_NEG:
        return dt__tape_unary(a, DT_UNARY_NEG, dy, &dx[0]);
    case DT_UNARY_ABS: /* sign(x) = (x > 0) - (x < 0), comparisons in x's dtype */
        DT_TRY(dt__tape_scalar(a, x[0], 0.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_GT, x[0], z, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_LT, x[0], z, &u));
        DT_TRY(dt__tape_cast(a, t, x[0]->dtype, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, t, u, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_EXP:
        return dt__tape_binary(a, DT_BINARY_MUL, dy, y, &dx[0]);
    case DT_UNARY_LOG:
        return dt__tape_binary(a, DT_BINARY_DIV, dy, x[0], &dx[0]);
    case DT_UNARY_SQRT: /* dy / (2 y) */
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, y, y, &t));
        return dt__tape_binary(a, DT_BINARY_DIV, dy, t, &dx[0]);
    case DT_UNARY_RELU: /* dy * (x > 0) */
        DT_TRY(dt__tape_scalar(a, x[0], 0.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_GT, x[0], z, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_TANH: /* dy (1 - y^2) */
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, y, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, z, t, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SIGMOID: /* dy y (1 - y) */
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, z, y, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, y, t, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SQUARE: /* dy 2x */
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, x[0], x[0], &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SIN:
        DT_TRY(dt__tape_unary(a, DT_UNARY_COS, x[0], &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_COS:
        DT_TRY(dt__tape_unary(a, DT_UNARY_SIN, x[0], &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_NEG, t, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_ERF: /* dy 2 / sqrt(pi) exp(-x^2) */
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, x[0], &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_NEG, t, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_EXP, t, &t));
        DT_TRY(dt__tape_scalar(a, x[0], 1.12837916709551257390, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, z, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_GELU: /* dy (Phi(x) + x phi(x)), Phi = gelu(x) / x written with erf */
        DT_TRY(dt__tape_scalar(a, x[0], 0.70710678118654752440, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, x[0], z, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_ERF, t, &t));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(dt__tape_scalar(a, x[0], 0.5, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, z, &t)); /* Phi(x) */
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, x[0], &u));
        DT_TRY(dt__tape_scalar(a, x[0], -0.5, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, z, &u));
        DT_TRY(dt__tape_unary(a, DT_UNARY_EXP, u, &u));
        DT_TRY(dt__tape_scalar(a, x[0], 0.39894228040143267794, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, z, &u)); /* phi(x) */
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, x[0], &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, u, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_GELU_TANH: {
        /* th = tanh(c (x + k x^3)): dy (0.5 (1 + th) + 0.5 x (1 - th^2) c (1 + 3 k x^2)) */
        const double c = 0.79788456080286535588, k = 0.044715;
        dt_tensor *x2, *th, *v;
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, x[0], &x2));
        DT_TRY(dt__tape_scalar(a, x[0], k, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, x2, z, &t));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, x[0], &t));
        DT_TRY(dt__tape_scalar(a, x[0], c, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, z, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_TANH, t, &th));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, th, z, &u));
        DT_TRY(dt__tape_scalar(a, x[0], 0.5, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, z, &u)); /* 0.5 (1 + th) */
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, th, &v));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, z, v, &v)); /* 1 - th^2 */
        DT_TRY(dt__tape_scalar(a, x[0], 3 * k, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, x2, z, &t));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, v, t, &v));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, v, x[0], &v));
        DT_TRY(dt__tape_scalar(a, x[0], 0.5 * c, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, v, z, &v));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, u, v, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    }
    case DT_UNARY_SILU: /* s = sigmoid(x): dy s (1 + x (1 - s)) */
        DT_TRY(dt__tape_unary(a, DT_UNARY_SIGMOID, x[0], &t));
        DT_TRY(dt__tape_scalar(a, x[0], 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, z, t, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, x[0], &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, u, z, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, u, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_RSQRT: /* -dy y^3 / 2 */
        DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, y, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, y, &t));
        DT_TRY(dt__tape_scalar(a, x[0], -0.5, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, z, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, dy, t, &dx[0]);
    default: /* logical_not: bool, nothing flows */
        return DT_OK;
    }
}

const dt__op_def dt__op_unary = {.name = "unary",
                                 .min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer,
                                 .expand = expand,
                                 .pull = dt__pull_same,
                                 .vjp = vjp};

dt_status dt_unary(dt_unary_op op, const dt_tensor *x, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = (int)op;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_UNARY, &a, 1, in, opts, out);
}
