/* Reductions (sum, mean, max, min, prod) over any axes. Each device reduces its shard (an empty
 * shard gives the identity: 0, -inf, +inf, 1), which leaves the result partial over the mesh axes
 * that split the reduced axes; the partial is then resolved by all-reduce, or reduce-scatter
 * into a requested sharded layout, or kept when the request is partial. Mean scales locally
 * by 1 / (global count) before the sum. A partial-sum operand stays partial through sum and
 * mean. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    int op = n->attrs.op;
    if (op < 0 || op >= DT_REDUCE_COUNT)
        return dt__fail(DT_ERR_ARG, "reduce: operator %d is not sum, mean, max, min or prod", op);
    /* mean is floating only (Python's reduce_mean of integers truncates in its own layer);
     * sums and products of bool are refused as arithmetic on bool (cast first); max and min of
     * bool are any and all */
    bool arith = op == DT_REDUCE_SUM || op == DT_REDUCE_PROD;
    DT_TRY(dt__dtype_check(op == DT_REDUCE_MEAN   ? "reduce mean"
                           : op == DT_REDUCE_SUM  ? "reduce sum"
                           : op == DT_REDUCE_PROD ? "reduce prod"
                                                  : "reduce",
                           x->dtype,
                           op == DT_REDUCE_MEAN ? DT__FLOATING
                           : arith              ? DT__NUMERIC
                                                : DT__ANY));
    if (n->attrs.mask >> x->rank) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_ARG, "reduce: axes mask 0x%x names axes beyond %s of rank %d",
                        n->attrs.mask, dt__shape_str(sb, sizeof sb, x->rank, x->shape), x->rank);
    }
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        bool red = n->attrs.mask & (1u << i);
        if (red && !n->attrs.keepdims)
            continue;
        out->shape[out->rank++] = red ? 1 : x->shape[i];
    }
    return DT_OK;
}

typedef struct reduce_ctx {
    const dt__dist *x, *y;
    int op;
    unsigned mask;
    double scale;
} reduce_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    reduce_ctx *c = ctx;
    dt__kargs_out(k, c->y, d); /* keepdims shape: reduced axes of extent 1 */
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    k->op = c->op == DT_REDUCE_MEAN ? DT_REDUCE_SUM : c->op;
    k->mask = c->mask;
    k->a = c->scale;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    dt__dist x = in[0];
    int op = n->attrs.op;
    unsigned mask = n->attrs.mask;
    bool linear = op == DT_REDUCE_SUM || op == DT_REDUCE_MEAN;
    if (x.layout.partial && !(linear && x.layout.partial_op == DT_REDUCE_SUM))
        DT_TRY(dt__resolve_partial(p, "reduce", &x, &x));
    /* y (keepdims): non-reduced axes keep their mesh axes; the reduced ones' mesh axes (and
     * any partial axes of x) become partial */
    dt_layout yl = dt__layout_none(x.layout.mesh, x.rank);
    unsigned partial = x.layout.partial;
    double count = 1;
    int64_t yshape[DT_MAX_RANK];
    for (int i = 0; i < x.rank; i++) {
        if (mask & (1u << i)) {
            yshape[i] = 1;
            count *= (double)x.shape[i];
            if (x.layout.axes[i] != DT_UNSHARDED)
                partial |= 1u << x.layout.axes[i];
        } else {
            yshape[i] = x.shape[i];
            yl.axes[i] = x.layout.axes[i];
        }
    }
    yl.partial = partial;
    yl.partial_op = linear ? DT_REDUCE_SUM : (dt_reduce_op)op;
    dt__dist y;
    DT_TRY(dt__slot_new(p, &yl, x.dtype, x.rank, yshape, &y));
    reduce_ctx c = {.x = &x,
                    .y = &y,
                    .op = op,
                    .mask = mask,
                    .scale = op == DT_REDUCE_MEAN ? 1.0 / count : 1.0};
    DT_TRY(
        dt__emit_kernel(p, "reduce", DT__K_REDUCE, x.dtype, 1, &x.slot, y.slot, yl.mesh, args, &c));
    if (!n->attrs.keepdims) {
        /* Dropping extent-1 axes moves no data: same slot, new metadata. */
        dt__dist z = y;
        z.rank = 0;
        z.layout.rank = 0;
        for (int i = 0; i < x.rank; i++) {
            if (mask & (1u << i))
                continue;
            z.shape[z.rank] = yshape[i];
            z.layout.axes[z.rank++] = yl.axes[i];
        }
        z.layout.rank = z.rank;
        for (int i = z.rank; i < DT_MAX_RANK; i++) {
            z.shape[i] = 0;
            z.layout.axes[i] = DT_UNSHARDED;
        }
        y = z;
    }
    return dt__finish(p, "reduce", &y, want, out);
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    const dt_tensor *X = x[0];
    int64_t kshape[DT_MAX_RANK]; /* x's shape with the reduced axes of extent 1 */
    int axes[DT_MAX_RANK], nax = 0;
    double count = 1;
    for (int i = 0; i < X->rank; i++) {
        bool red = n->attrs.mask & (1u << i);
        kshape[i] = red ? 1 : X->shape[i];
        if (red) {
            axes[nax++] = i;
            count *= (double)X->shape[i];
        }
    }
    dt_tensor *dk = dy, *yk = y, *t, *c;
    if (!n->attrs.keepdims) {
        DT_TRY(dt__tape_reshape(a, dy, X->rank, kshape, &dk));
        DT_TRY(dt__tape_reshape(a, y, X->rank, kshape, &yk));
    }
    switch ((dt_reduce_op)n->attrs.op) {
    case DT_REDUCE_SUM:
        return dt__tape_broadcast_to(a, dk, X, &dx[0]);
    case DT_REDUCE_MEAN:
        DT_TRY(dt__tape_scalar(a, X, 1.0 / count, &c));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dk, c, &t));
        return dt__tape_broadcast_to(a, t, X, &dx[0]);
    case DT_REDUCE_MAX:
    case DT_REDUCE_MIN: /* shared equally among the elements equal to the extremum */
        DT_TRY(dt__tape_binary(a, DT_BINARY_EQ, x[0], yk, &t));
        DT_TRY(dt__tape_cast(a, t, X->dtype, &t));
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &c));
        DT_TRY(dt__tape_binary(a, DT_BINARY_DIV, dk, c, &c));
        return dt__tape_binary(a, DT_BINARY_MUL, t, c, &dx[0]);
    case DT_REDUCE_PROD: {
        /* d prod / d x_i is the product of the row's other elements: y / x_i in a row without
         * a zero; in a row with one zero, the product of its nonzero elements at the zero and 0
         * elsewhere; with two zeros or more, 0 (exact where TensorFlow's exclusive cumulative
         * products are, and without dividing by zero) */
        dt_tensor *zero, *one, *isz, *nz, *xnz, *pnz, *at0, *else0;
        DT_TRY(dt__tape_scalar(a, X, 0.0, &zero));
        DT_TRY(dt__tape_scalar(a, X, 1.0, &one));
        DT_TRY(dt__tape_binary(a, DT_BINARY_EQ, x[0], zero, &isz));
        DT_TRY(dt__tape_cast(a, isz, X->dtype, &t));
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &nz)); /* zeros per row */
        DT_TRY(dt__tape_where(a, isz, one, x[0], &xnz));
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_PROD, xnz, nax, axes, &pnz));
        DT_TRY(dt__tape_binary(a, DT_BINARY_EQ, nz, one, &c));
        DT_TRY(dt__tape_where(a, c, pnz, zero, &at0));
        DT_TRY(dt__tape_binary(a, DT_BINARY_DIV, yk, xnz, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_EQ, nz, zero, &c));
        DT_TRY(dt__tape_where(a, c, t, zero, &else0));
        DT_TRY(dt__tape_where(a, isz, at0, else0, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, t, dk, &dx[0]);
    }
    default:
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: reduce %s has no gradient rule",
                        dt_reduce_op_name((dt_reduce_op)n->attrs.op));
    }
}

const dt__op_def dt__op_reduce = {.name = "reduce",
                                  .min_inputs = 1,
                                  .max_inputs = 1,
                                  .infer = infer,
                                  .expand = expand,
                                  .vjp = vjp};

dt_status dt_reduce(dt_reduce_op op, const dt_tensor *x, int num_axes, const int axes[],
                    int keepdims, const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x)
        return dt__fail(DT_ERR_ARG, "reduce: operand is NULL");
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = (int)op;
    a.keepdims = keepdims ? 1 : 0;
    if (num_axes < 0 || (num_axes && !axes))
        return dt__fail(DT_ERR_ARG, "reduce: %d axes%s", num_axes, axes ? "" : " (axes NULL)");
    if (num_axes == 0)
        a.mask = x->rank ? (1u << x->rank) - 1 : 0;
    for (int i = 0; i < num_axes; i++) {
        int ax = axes[i] < 0 ? axes[i] + x->rank : axes[i];
        if (ax < 0 || ax >= x->rank)
            return dt__fail(DT_ERR_ARG, "reduce: axis %d is outside a tensor of rank %d", axes[i],
                            x->rank);
        if (a.mask & (1u << ax))
            return dt__fail(DT_ERR_ARG, "reduce: axis %d named twice", axes[i]);
        a.mask |= 1u << ax;
    }
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_REDUCE, &a, 1, in, opts, out);
}
