/* softmax, log_softmax and logsumexp (tf.nn.softmax, tf.nn.log_softmax,
 * tf.math.reduce_logsumexp), numerically stable: with m the maximum over the reduced axes
 * (shifted to 0 where not finite, as TensorFlow) and s = sum exp(x - m), the results are
 * exp(x - m) / s, x - m - log s and m + log s.
 *
 * Expansion, on x's layout without partial axes (or the request's, when moving x there is the
 * cheaper side); P are the mesh axes that shard a reduced axis:
 *   softmax max (local)         x [.., n, ..]   -> m [.., 1, ..]  partial MAX over P
 *   all-reduce MAX over P       m                                  (nothing when P is empty)
 *   softmax sum of exp (local)  x, m            -> s [.., 1, ..]  partial SUM over P
 *   all-reduce SUM over P       s
 *   softmax / log_softmax       x, m, s         -> y [.., n, ..]  in x's layout
 *   or logsumexp                m, s            -> [.., 1, ..]    (axes dropped unless keepdims)
 * So a sharded axis costs one all-reduce MAX and one all-reduce SUM of the [rows, 1] statistics
 * and no gather of x. s is f32 for the 16-bit floats (their results round once). A partial x is
 * summed first (softmax is not linear). Three passes over x: the max, the sum, the result. */
#include "../engine.h"

#include <math.h>
#include <string.h>

static const char *op_name(int op)
{
    return op == DT__SOFTMAX_SOFTMAX       ? "softmax"
           : op == DT__SOFTMAX_LOG_SOFTMAX ? "log_softmax"
                                           : "logsumexp";
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    int op = n->attrs.op;
    if (op != DT__SOFTMAX_SOFTMAX && op != DT__SOFTMAX_LOG_SOFTMAX && op != DT__SOFTMAX_LSE)
        return dt__fail(DT_ERR_ARG, "softmax: operator %d is not softmax, log_softmax or logsumexp",
                        op);
    const char *name = op_name(op);
    DT_TRY(dt__axis_error(name, &n->attrs, x->rank));
    DT_TRY(dt__dtype_check(name, x->dtype, DT__FLOATING));
    unsigned mask = n->attrs.mask;
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        bool red = op == DT__SOFTMAX_LSE && (mask & (1u << i));
        if (red && !n->attrs.keepdims)
            continue;
        out->shape[out->rank++] = red ? 1 : x->shape[i];
    }
    return DT_OK;
}

dt_layout dt__rowwise_layout(const dt__dist *x, const dt_layout *want)
{
    dt_layout here = x->layout;
    here.partial = 0;
    here.partial_op = DT_REDUCE_SUM;
    if (!want)
        return here;
    dt_layout there = *want;
    there.partial = 0;
    there.partial_op = DT_REDUCE_SUM;
    double move_in = dt__relayout_cost(&x->layout, &there, x->dtype, x->rank, x->shape) +
                     dt__relayout_cost(&there, want, x->dtype, x->rank, x->shape);
    double move_out = dt__relayout_cost(&x->layout, &here, x->dtype, x->rank, x->shape) +
                      dt__relayout_cost(&here, want, x->dtype, x->rank, x->shape);
    return move_in < move_out ? there : here;
}

void dt__rowwise_reduced(const dt__dist *x, unsigned mask, int64_t extent, dt_reduce_op op,
                         dt_layout *l, int64_t shape[])
{
    *l = x->layout;
    l->partial = 0;
    l->partial_op = op;
    for (int i = 0; i < DT_MAX_RANK; i++) {
        shape[i] = i < x->rank ? x->shape[i] : 0;
        if (i >= x->rank || !(mask & (1u << i)))
            continue;
        shape[i] = extent;
        if (l->axes[i] != DT_UNSHARDED)
            l->partial |= 1u << l->axes[i];
        l->axes[i] = DT_UNSHARDED;
    }
}

typedef struct softmax_ctx {
    const dt__dist *x, *y; /* the operand read (in_shape[0]) and the slot written */
    unsigned mask;
    unsigned mode;
} softmax_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    softmax_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    k->mask = c->mask;
    k->mode = c->mode;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int op = n->attrs.op;
    const char *name = op_name(op);
    bool lse = op == DT__SOFTMAX_LSE;
    dt__dist x = in[0], m, s, y;
    /* logsumexp's result has another shape: it computes where x lies */
    dt_layout here = dt__rowwise_layout(&x, lse ? NULL : want);
    DT_TRY(dt__relayout_emit(p, name, &x, &here, &x));
    unsigned mask = n->attrs.mask;
    dt_layout kl;
    int64_t ks[DT_MAX_RANK];
    dt__rowwise_reduced(&x, mask, 1, DT_REDUCE_MAX, &kl, ks);
    const dt_mesh *mesh = x.layout.mesh;
    /* m: the local maxima, then the maximum over the shards */
    DT_TRY(dt__slot_new(p, &kl, x.dtype, x.rank, ks, &m));
    softmax_ctx c = {.x = &x, .y = &m, .mask = mask, .mode = DT__SOFTMAX_MAX};
    DT_TRY(dt__emit_kernel(p, name, DT__K_SOFTMAX, x.dtype, 1, &x.slot, m.slot, mesh, args, &c));
    DT_TRY(dt__resolve_partial(p, name, &m, &m));
    /* s: the local sums of exp(x - m), then their sum over the shards */
    kl.partial_op = DT_REDUCE_SUM;
    DT_TRY(dt__slot_new(p, &kl, dt__acc_dtype(x.dtype), x.rank, ks, &s));
    c = (softmax_ctx){.x = &x, .y = &s, .mask = mask, .mode = DT__SOFTMAX_SUMEXP};
    int ins[3] = {x.slot, m.slot, -1};
    DT_TRY(dt__emit_kernel(p, name, DT__K_SOFTMAX, x.dtype, 2, ins, s.slot, mesh, args, &c));
    DT_TRY(dt__resolve_partial(p, name, &s, &s));
    if (!lse) {
        DT_TRY(dt__slot_new(p, &x.layout, x.dtype, x.rank, x.shape, &y));
        c = (softmax_ctx){.x = &x, .y = &y, .mask = mask, .mode = (unsigned)op};
        ins[2] = s.slot;
        DT_TRY(dt__emit_kernel(p, name, DT__K_SOFTMAX, x.dtype, 3, ins, y.slot, mesh, args, &c));
        return dt__finish(p, name, &y, want, out);
    }
    DT_TRY(dt__slot_new(p, &m.layout, x.dtype, x.rank, ks, &y));
    c = (softmax_ctx){.x = &m, .y = &y, .mask = mask, .mode = DT__SOFTMAX_LSE};
    ins[0] = m.slot;
    ins[1] = s.slot;
    DT_TRY(dt__emit_kernel(p, name, DT__K_SOFTMAX, x.dtype, 2, ins, y.slot, mesh, args, &c));
    if (!n->attrs.keepdims) {
        /* dropping extent-1 axes moves no data: the same slot, new metadata */
        dt__dist z = y;
        z.rank = 0;
        for (int i = 0; i < x.rank; i++) {
            if (mask & (1u << i))
                continue;
            z.shape[z.rank] = ks[i];
            z.layout.axes[z.rank++] = y.layout.axes[i];
        }
        z.layout.rank = z.rank;
        for (int i = z.rank; i < DT_MAX_RANK; i++) {
            z.shape[i] = 0;
            z.layout.axes[i] = DT_UNSHARDED;
        }
        y = z;
    }
    return dt__finish(p, name, &y, want, out);
}

/* Operand layout for a wanted result: softmax keeps the shape, so the request itself;
 * logsumexp with keepdims, the request with the reduced axes unsharded. */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    if (n->attrs.op == DT__SOFTMAX_LSE && !n->attrs.keepdims)
        return false;
    if (want->rank != in[0]->rank)
        return false;
    *in_want = *want;
    in_want->partial = 0;
    in_want->partial_op = DT_REDUCE_SUM;
    return true;
}

/* The reduced axes of a mask, and a tensor's shape with them of extent 1. */
static int axes_of(unsigned mask, const dt_tensor *x, int axes[], int64_t kshape[])
{
    int n = 0;
    for (int i = 0; i < x->rank; i++) {
        kshape[i] = (mask & (1u << i)) ? 1 : x->shape[i];
        if (mask & (1u << i))
            axes[n++] = i;
    }
    return n;
}

/* softmax: y (dy - sum(dy y)); log_softmax: dy - exp(y) sum(dy); logsumexp: dy exp(x - y),
 * sums over the reduced axes kept as extent 1 (and dy, y reshaped so when keepdims was off). */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    int axes[DT_MAX_RANK];
    int64_t kshape[DT_MAX_RANK];
    int nax = axes_of(n->attrs.mask, x[0], axes, kshape);
    dt_tensor *t, *u;
    switch (n->attrs.op) {
    case DT__SOFTMAX_SOFTMAX:
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, y, &t));
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, dy, t, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, y, t, &dx[0]);
    case DT__SOFTMAX_LOG_SOFTMAX:
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_SUM, dy, nax, axes, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_EXP, y, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, u, t, &t));
        return dt__tape_binary(a, DT_BINARY_SUB, dy, t, &dx[0]);
    default: {
        dt_tensor *dk = dy, *yk = y;
        if (!n->attrs.keepdims) {
            DT_TRY(dt__tape_reshape(a, dy, x[0]->rank, kshape, &dk));
            DT_TRY(dt__tape_reshape(a, y, x[0]->rank, kshape, &yk));
        }
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, x[0], yk, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_EXP, t, &t));
        return dt__tape_binary(a, DT_BINARY_MUL, t, dk, &dx[0]);
    }
    }
}

/* The printer's words for the softmax kernel's modes (common/kernels.h). */
static const char *describe(dt__kernel kernel, unsigned mode)
{
    static const char *const words[] = {"sum of exp", "exp / sum", "x - max - log sum",
                                        "max + log sum", "max"};
    unsigned m = DT__MODE_KIND(mode);
    return kernel != DT__K_SOFTMAX ? NULL : m < 5 ? words[m] : "?";
}

const dt__op_def dt__op_softmax = {.name = "softmax",
                                   .min_inputs = 1,
                                   .max_inputs = 1,
                                   .infer = infer,
                                   .expand = expand,
                                   .pull = pull,
                                   .vjp = vjp,
                                   .describe = describe};

static dt_status call(int op, const dt_tensor *x, int num_axes, const int axes[], int keepdims,
                      const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.keepdims = keepdims ? 1 : 0;
    dt__axes_attrs(x ? x->rank : 0, num_axes, axes, &a);
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_SOFTMAX, &a, 1, in, opts, out);
}

dt_status dt_softmax(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out)
{
    return call(DT__SOFTMAX_SOFTMAX, x, 1, &axis, 0, opts, out);
}

dt_status dt_log_softmax(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out)
{
    return call(DT__SOFTMAX_LOG_SOFTMAX, x, 1, &axis, 0, opts, out);
}

dt_status dt_logsumexp(const dt_tensor *x, int num_axes, const int axes[], int keepdims,
                       const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (num_axes < 0 || (num_axes && !axes))
        return dt__call_fail(
            DT__OP_SOFTMAX, 1, &x, opts,
            dt__fail(DT_ERR_ARG, "logsumexp: %d axes%s", num_axes, axes ? "" : " (axes NULL)"));
    return call(DT__SOFTMAX_LSE, x, num_axes, axes, keepdims, opts, out);
}

/* ---- axes of the row-wise ops ------------------------------------------------------------- */

void dt__axes_attrs(int rank, int num_axes, const int axes[], dt__attrs *a)
{
    a->mask = num_axes == 0 && rank ? (1u << rank) - 1 : 0;
    for (int i = 0; i < num_axes; i++) {
        int ax = axes[i] < 0 ? axes[i] + rank : axes[i];
        int bad = ax < 0 || ax >= rank ? 1 : (a->mask & (1u << ax)) ? 2 : 0;
        if (bad) {
            a->mask = 0;
            a->axis = axes[i];
            a->begin[0] = bad;
            return;
        }
        a->mask |= 1u << ax;
        a->axis = ax;
    }
}

dt_status dt__axis_error(const char *name, const dt__attrs *a, int rank)
{
    if (a->begin[0] == 1)
        return dt__fail(DT_ERR_ARG, "%s: axis %d is outside a tensor of rank %d", name, a->axis,
                        rank);
    if (a->begin[0] == 2)
        return dt__fail(DT_ERR_ARG, "%s: axis %d named twice", name, a->axis);
    if (a->mask >> rank)
        return dt__fail(DT_ERR_ARG, "%s: axes mask 0x%x names axes beyond rank %d", name, a->mask,
                        rank);
    return DT_OK;
}
