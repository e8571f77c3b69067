/* layer_norm and rms_norm over the last axis (as Keras' LayerNormalization(axis=-1) and the
 * RMSNorm of transformer models):
 *   layer_norm: (x - mean) / sqrt(var + epsilon) * gamma + beta  (biased variance, two passes)
 *   rms_norm:   x / sqrt(mean(x^2) + epsilon) * gamma
 * gamma and beta, of shape [last], are optional (attrs.mask: DT__NORM_GAMMA, DT__NORM_BETA, in
 * that order after x).
 *
 * Expansion, on x's layout without partial axes (or the request's when moving x there costs
 * less); `a` is the mesh axis that shards x's last axis, if any:
 *   norm mean (local)        x              -> mu [.., 1]  partial SUM over a
 *   all-reduce SUM over a    mu                             (nothing when the axis is whole)
 *   norm variance (local)    x, mu          -> v [.., 1]   partial SUM over a
 *   all-reduce SUM over a    v
 *   norm layer_norm (local)  x, mu, v, gamma, beta -> y    in x's layout
 * rms_norm: mean square (local), one all-reduce SUM over a, rms_norm (local). The statistics are
 * f32 for the 16-bit floats (f64 for f64) and each local sum accumulates in double. gamma and
 * beta are moved to the sharding of x's last axis (a local slice when they are replicated);
 * partial terms are summed first (the normalization is not linear). The variance is taken
 * around the mean (a second pass), not as E[x^2] - mean^2, which cancels badly. */
#include "../engine.h"

#include <math.h>
#include <string.h>

static const char *op_name(int op)
{
    return op == DT__NORM_RMS ? "rms_norm" : "layer_norm";
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    int op = n->attrs.op;
    if (op != DT__NORM_LAYER && op != DT__NORM_RMS)
        return dt__fail(DT_ERR_ARG, "norm: operator %d is not layer_norm or rms_norm", op);
    const char *name = op_name(op);
    unsigned has = n->attrs.mask;
    int want_in = 1 + !!(has & DT__NORM_GAMMA) + !!(has & DT__NORM_BETA);
    if ((has & ~(unsigned)(DT__NORM_GAMMA | DT__NORM_BETA)) || n->nin != want_in ||
        (op == DT__NORM_RMS && (has & DT__NORM_BETA)))
        return dt__fail(DT_ERR_ARG, "%s: %d operands for operand mask 0x%x", name, n->nin, has);
    DT_TRY(dt__dtype_check(name, x->dtype, DT__FLOATING));
    char sx[DT__SHAPE_STR_MAX], sp[DT__SHAPE_STR_MAX];
    if (x->rank < 1)
        return dt__fail(DT_ERR_SHAPE, "%s: x is a scalar, expected rank 1 or more", name);
    double eps = n->attrs.a;
    if (!(eps >= 0) || isinf(eps))
        return dt__fail(DT_ERR_ARG, "%s: epsilon %g, expected a finite value >= 0", name, eps);
    int64_t last = x->shape[x->rank - 1];
    for (int i = 1; i < n->nin; i++) {
        const char *what = i == 1 && (has & DT__NORM_GAMMA) ? "gamma" : "beta";
        if (in[i]->rank != 1 || in[i]->shape[0] != last)
            return dt__fail(DT_ERR_SHAPE, "%s: %s is %s, x is %s: expected [%lld]", name, what,
                            dt__shape_str(sp, sizeof sp, in[i]->rank, in[i]->shape),
                            dt__shape_str(sx, sizeof sx, x->rank, x->shape), (long long)last);
        if (in[i]->dtype != x->dtype)
            return dt__fail(DT_ERR_DTYPE, "%s: %s is %s, x is %s (cast first)", name, what,
                            dt_dtype_name(in[i]->dtype), dt_dtype_name(x->dtype));
    }
    out->dtype = x->dtype;
    out->rank = x->rank;
    memcpy(out->shape, x->shape, sizeof out->shape);
    return DT_OK;
}

typedef struct norm_ctx {
    const dt__dist *x, *y;
    unsigned mode;
    double a, b;
} norm_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    norm_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    k->mode = c->mode;
    k->a = c->a;
    k->b = c->b;
}

/* One statistic: the local sums of `mode` (inputs ins[0..nin)), all-reduced over the mesh axis
 * of the last axis. */
static dt_status statistic(dt__program *p, const char *name, const dt__dist *x, unsigned mode,
                           int nin, const int ins[], dt__dist *out)
{
    dt_layout kl;
    int64_t ks[DT_MAX_RANK];
    dt__rowwise_reduced(x, 1u << (x->rank - 1), 1, DT_REDUCE_SUM, &kl, ks);
    DT_TRY(dt__slot_new(p, &kl, dt__acc_dtype(x->dtype), x->rank, ks, out));
    norm_ctx c = {.x = x, .y = out, .mode = mode, .a = 1.0 / (double)x->shape[x->rank - 1]};
    DT_TRY(dt__emit_kernel(p, name, DT__K_NORM, x->dtype, nin, ins, out->slot, x->layout.mesh, args,
                           &c));
    return dt__resolve_partial(p, name, out, out);
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int op = n->attrs.op;
    const char *name = op_name(op);
    dt__dist x = in[0], mu, v, y;
    dt_layout here = dt__rowwise_layout(&x, want);
    DT_TRY(dt__relayout_emit(p, name, &x, &here, &x));
    const dt_mesh *mesh = x.layout.mesh;
    /* gamma and beta: sharded as x's last axis */
    dt_layout pl = dt__layout_none(mesh, 1);
    pl.axes[0] = x.layout.axes[x.rank - 1];
    int ins[DT__STEP_MAX_IN], nin;
    dt__dist params[2];
    for (int i = 1; i < n->nin; i++)
        DT_TRY(dt__relayout_emit(p, name, &in[i], &pl, &params[i - 1]));
    if (op == DT__NORM_LAYER) {
        ins[0] = x.slot;
        DT_TRY(statistic(p, name, &x, DT__NORM_MEAN, 1, ins, &mu));
        ins[1] = mu.slot;
        DT_TRY(statistic(p, name, &x, DT__NORM_VAR, 2, ins, &v));
        ins[2] = v.slot;
        nin = 3;
    } else {
        ins[0] = x.slot;
        DT_TRY(statistic(p, name, &x, DT__NORM_MEAN_SQUARE, 1, ins, &v));
        ins[1] = v.slot;
        nin = 2;
    }
    for (int i = 1; i < n->nin; i++)
        ins[nin++] = params[i - 1].slot;
    DT_TRY(dt__slot_new(p, &x.layout, x.dtype, x.rank, x.shape, &y));
    norm_ctx c = {.x = &x, .y = &y, .mode = (unsigned)op | n->attrs.mask, .b = n->attrs.a};
    DT_TRY(dt__emit_kernel(p, name, DT__K_NORM, x.dtype, nin, ins, y.slot, mesh, args, &c));
    return dt__finish(p, name, &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    if (want->rank != in[0]->rank)
        return false;
    if (i == 0) {
        *in_want = *want;
        in_want->partial = 0;
        in_want->partial_op = DT_REDUCE_SUM;
        return true;
    }
    *in_want = dt__layout_none(want->mesh, 1);
    in_want->axes[0] = want->axes[want->rank - 1];
    return true;
}

/* With xhat the normalized x (the op itself without gamma and beta), r = 1 / sqrt(var + eps)
 * and g = dy gamma: layer_norm dx = r (g - mean(g) - xhat mean(g xhat)), rms_norm
 * dx = r (g - xhat mean(g xhat)), means over the last axis; dgamma = sum(dy xhat) and
 * dbeta = sum(dy) over every other axis (partial over a batch-sharding mesh axis: the
 * expansion resolves them in gamma's layout). */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    dt_tensor *X = x[0];
    bool layer = n->attrs.op == DT__NORM_LAYER;
    double eps = n->attrs.a;
    int last = X->rank - 1, others[DT_MAX_RANK], nothers = 0;
    for (int i = 0; i < last; i++)
        others[nothers++] = i;
    unsigned has = n->attrs.mask;
    dt_tensor *gamma = (has & DT__NORM_GAMMA) ? x[1] : NULL;
    dt_tensor *xhat, *r, *g = dy, *t, *u, *c;
    DT_TRY(dt__tape_keep(a,
                         layer ? dt_layer_norm(X, NULL, NULL, eps, NULL, &xhat)
                               : dt_rms_norm(X, NULL, eps, NULL, &xhat),
                         &xhat));
    /* r = rsqrt(mean over the last axis of (x - mean)^2, or of x^2, plus eps) */
    t = X;
    if (layer) {
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_MEAN, X, 1, &last, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, X, u, &t));
    }
    DT_TRY(dt__tape_unary(a, DT_UNARY_SQUARE, t, &t));
    DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_MEAN, t, 1, &last, &t));
    DT_TRY(dt__tape_scalar(a, X, eps, &c));
    DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, c, &t));
    DT_TRY(dt__tape_unary(a, DT_UNARY_RSQRT, t, &r));
    if (gamma)
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, gamma, &g));
    DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, g, xhat, &t));
    DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_MEAN, t, 1, &last, &t));
    DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, xhat, t, &t)); /* xhat mean(g xhat) */
    DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, g, t, &t));
    if (layer) {
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_MEAN, g, 1, &last, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, t, u, &t));
    }
    DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, r, t, &dx[0]));
    int next = 1;
    if (gamma) {
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, xhat, &t));
        if (nothers)
            DT_TRY(dt__tape_keep(a, dt_reduce(DT_REDUCE_SUM, t, nothers, others, 0, NULL, &t), &t));
        dx[next++] = t;
    }
    if (has & DT__NORM_BETA) {
        t = dy;
        if (nothers)
            DT_TRY(dt__tape_keep(a, dt_reduce(DT_REDUCE_SUM, t, nothers, others, 0, NULL, &t), &t));
        dx[next] = t;
    }
    return DT_OK;
}

/* The printer's words for the norm kernel's modes (common/kernels.h). */
static const char *describe(dt__kernel kernel, unsigned mode)
{
    static const char *const words[] = {"mean", "variance", "mean square", "layer_norm",
                                        "rms_norm"};
    unsigned m = DT__MODE_KIND(mode);
    return kernel != DT__K_NORM ? NULL : m < 5 ? words[m] : "?";
}

const dt__op_def dt__op_norm = {.name = "norm",
                                .min_inputs = 1,
                                .max_inputs = 3,
                                .infer = infer,
                                .expand = expand,
                                .pull = pull,
                                .vjp = vjp,
                                .describe = describe};

static dt_status call(int op, const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                      double epsilon, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.a = epsilon;
    const dt_tensor *in[3] = {x};
    int nin = 1;
    if (gamma) {
        a.mask |= DT__NORM_GAMMA;
        in[nin++] = gamma;
    }
    if (beta) {
        a.mask |= DT__NORM_BETA;
        in[nin++] = beta;
    }
    return dt__call(DT__OP_NORM, &a, nin, in, opts, out);
}

dt_status dt_layer_norm(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                        double epsilon, const dt_op_options *opts, dt_tensor **out)
{
    return call(DT__NORM_LAYER, x, gamma, beta, epsilon, opts, out);
}

dt_status dt_rms_norm(const dt_tensor *x, const dt_tensor *gamma, double epsilon,
                      const dt_op_options *opts, dt_tensor **out)
{
    return call(DT__NORM_RMS, x, gamma, NULL, epsilon, opts, out);
}
