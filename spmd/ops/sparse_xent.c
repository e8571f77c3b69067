/* sparse_softmax_cross_entropy_with_logits (tf.nn.sparse_softmax_cross_entropy_with_logits):
 * labels [...] (i32 or i64) and logits [..., C] (floating) -> the loss of each row,
 * loss = logsumexp(logits) - logits[label], [...] in the logits' dtype (bf16 and f16 computed in
 * f32, rounded once). Its gradient, the same op in mode DT__XENT_GRAD (operands labels, logits,
 * dy): d logits = (softmax(logits) - onehot(label)) dy, computed in one pass without a one-hot
 * tensor; no gradient flows to the labels.
 *
 * Expansion, on the logits' layout without partial axes (the gradient: or the request's, when
 * moving the logits there is the cheaper side); P the mesh axis (if any) sharding the class
 * axis, g its size:
 *   xent STATS (local)       x [.., C], labels [..]  -> st [.., 4g]  each shard's maximum, sum of
 *                                                      exp, target logit (where it owns the
 *                                                      label) and ownership flag (4 per shard)
 *   xent MAX (local)         st                      -> m [.., 1]    partial MAX over P
 *   all-reduce MAX over P    m                                        (nothing when P is none)
 *   xent COMBINE (local)     st, m                   -> c [.., 3]    partial SUM over P
 *   all-reduce SUM over P    c
 *   xent LOSS (local)        m, c                    -> loss [..]    in the rows' layout
 *   or xent GRAD (local)     x, labels, m, c, dy     -> dx [.., C]   in x's layout
 * So a sharded class axis costs one all-reduce MAX and one all-reduce SUM of per-row statistics
 * and no gather of the logits (dt_logsumexp's pattern); the forward pass reads the logits once,
 * the gradient twice (the statistics again, then dx), except in a traced gradient function,
 * whose repeated statistics steps are dropped for the forward pass's (spmd/cse.c). The labels (and
 * dy) are laid out as the logits' leading axes. A label outside [0, C) is owned by no shard: its
 * row's loss (and gradient) is NaN, as TensorFlow's GPU kernel gives; the eager CPU path cannot
 * check cheaply without reading the labels back, so it does the same.
 *
 * sparse_categorical_crossentropy (Keras's loss of probabilities, from_logits=False): the same
 * op with the flag DT__XENT_PROBS and epsilon in attrs.a: probabilities p [..., C], the loss of
 * the logits log c for c = clip(p, eps, 1 - eps), as TensorFlow's Keras backend computes it
 * (the clip, the log of every element, then the cross-entropy of those logits), which is
 * log(sum c) - log c[label]. STATS (flag PROBS) sums c in one pass and takes the log of the
 * target's alone; its row maximum is 0 on every shard, so m needs no all-reduce and MAX,
 * COMBINE and LOSS run unchanged; GRAD (flag PROBS) writes (1 / sum c - [j == label] / p_j) dy
 * where the clip is not active and 0 where it is (the clip's gradient), one pass. */
#include "../engine.h"

#include <string.h>

static const char *op_name(const dt__attrs *a)
{
    return a->op & DT__XENT_PROBS ? "sparse_categorical_crossentropy"
                                  : "sparse_softmax_cross_entropy_with_logits";
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const char *name = op_name(&n->attrs);
    unsigned mode = DT__MODE_KIND((unsigned)n->attrs.op);
    bool grad = mode == DT__XENT_GRAD;
    if ((mode != DT__XENT_LOSS && !grad) || (n->attrs.op & ~(15 | DT__XENT_PROBS)))
        return dt__fail(DT_ERR_ARG, "%s: mode %d", name, n->attrs.op);
    /* epsilon: a number in (0, 0.5), so that the clip's bounds are in order */
    double eps = n->attrs.a;
    if ((n->attrs.op & DT__XENT_PROBS) && !(eps > 0 && eps < 0.5))
        return dt__fail(DT_ERR_ARG, "%s: epsilon %g is outside (0, 0.5)", name, eps);
    if (n->nin != (grad ? 3 : 2))
        return dt__fail(DT_ERR_ARG, "%s: %d operands", name, n->nin);
    const dt__val *l = in[0], *x = in[1];
    const char *what = n->attrs.op & DT__XENT_PROBS ? "probabilities" : "logits";
    char sl[DT__SHAPE_STR_MAX], sx[DT__SHAPE_STR_MAX];
    dt__shape_str(sl, sizeof sl, l->rank, l->shape);
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    if (x->dtype != DT_DTYPE_F32 && x->dtype != DT_DTYPE_F64 && x->dtype != DT_DTYPE_BF16 &&
        x->dtype != DT_DTYPE_F16)
        return dt__fail(DT_ERR_DTYPE, "%s: %s %s are %s, expected f32, f64, bf16 or f16", name,
                        what, sx, dt_dtype_name(x->dtype));
    if (l->dtype != DT_DTYPE_I32 && l->dtype != DT_DTYPE_I64)
        return dt__fail(DT_ERR_DTYPE, "%s: labels %s are %s, expected i32 or i64", name, sl,
                        dt_dtype_name(l->dtype));
    if (x->rank < 1)
        return dt__fail(DT_ERR_SHAPE, "%s: %s %s have rank 0, expected [..., classes]", name, what,
                        sx);
    bool same = l->rank == x->rank - 1;
    for (int i = 0; same && i < l->rank; i++)
        same = l->shape[i] == x->shape[i];
    if (!same)
        return dt__fail(DT_ERR_SHAPE,
                        "%s: labels %s do not match %s %s: expected labels of their shape "
                        "without the last axis",
                        name, sl, what, sx);
    if (grad) {
        const dt__val *dy = in[2];
        bool ok = dy->dtype == x->dtype && dy->rank == l->rank;
        for (int i = 0; ok && i < l->rank; i++)
            ok = dy->shape[i] == l->shape[i];
        if (!ok) {
            char sd[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "%s: dy is %s%s, expected %s%s", name, dt_dtype_name(dy->dtype),
                dt__shape_str(sd, sizeof sd, dy->rank, dy->shape), dt_dtype_name(x->dtype), sl);
        }
    }
    const dt__val *shape_of = grad ? x : l;
    out->dtype = x->dtype;
    out->rank = shape_of->rank;
    memcpy(out->shape, shape_of->shape, sizeof out->shape);
    return DT_OK;
}

/* The rows' layout: l's leading rank - 1 axes, not partial. */
static dt_layout rows_of(const dt_layout *l, int rank)
{
    dt_layout r = dt__layout_none(l->mesh, rank - 1);
    for (int i = 0; i + 1 < rank; i++)
        r.axes[i] = l->axes[i];
    return r;
}

typedef struct xent_ctx {
    const dt__dist *x, *labels, *y; /* the logits read, the labels, the slot written */
    unsigned mode;
    double eps; /* PROBS: the clip's epsilon */
} xent_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    xent_ctx *c = ctx;
    int64_t xl[DT_MAX_RANK], xo[DT_MAX_RANK];
    int r = c->x->rank;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, xl, xo);
    /* x_local: (rows, inner) classes [lo, lo + inner) of the global axis */
    k->nidx = dt__num_elements(r - 1, xl);
    k->inner = xl[r - 1];
    k->lo = xo[r - 1];
    k->from = c->labels->dtype;
    k->mode = c->mode;
    k->a = c->mode & DT__XENT_PROBS ? c->eps : 0;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const char *name = op_name(&n->attrs);
    bool grad = DT__MODE_KIND((unsigned)n->attrs.op) == DT__XENT_GRAD;
    /* the flag on the passes over x (STATS, GRAD); MAX, COMBINE and LOSS run as for logits */
    unsigned probs = n->attrs.op & DT__XENT_PROBS;
    double eps = n->attrs.a;
    dt__dist x = in[1], labels, m, st, c, y, dy;
    int r = x.rank;
    dt_layout here = dt__rowwise_layout(&x, grad ? want : NULL);
    DT_TRY(dt__relayout_emit(p, name, &x, &here, &x));
    dt_layout rows = rows_of(&here, r);
    DT_TRY(dt__relayout_emit(p, name, &in[0], &rows, &labels));
    const dt_mesh *mesh = here.mesh;
    dt_dtype acc = dt__acc_dtype(x.dtype);
    int cls = here.axes[r - 1];
    int g = cls == DT_UNSHARDED ? 1 : dt_mesh_axis_size(mesh, cls);
    /* st: 4 statistics per row and shard, the shards' along the class axis */
    int64_t shape[DT_MAX_RANK];
    memcpy(shape, x.shape, sizeof shape);
    shape[r - 1] = 4 * (int64_t)g;
    DT_TRY(dt__slot_new(p, &here, acc, r, shape, &st));
    xent_ctx k = {.x = &x, .labels = &labels, .y = &st, .mode = DT__XENT_STATS | probs, .eps = eps};
    int ins[5] = {x.slot, labels.slot, -1, -1, -1};
    DT_TRY(dt__emit_kernel(p, name, DT__K_XENT, x.dtype, 2, ins, st.slot, mesh, args, &k));
    /* m: each shard's maximum, then the maximum over the shards (of probabilities: 0 on every
     * shard, so not partial) */
    dt_layout kl;
    dt__rowwise_reduced(&x, 1u << (r - 1), 1, DT_REDUCE_MAX, &kl, shape);
    if (probs)
        kl.partial = 0;
    DT_TRY(dt__slot_new(p, &kl, acc, r, shape, &m));
    k = (xent_ctx){.x = &x, .labels = &labels, .y = &m, .mode = DT__XENT_MAX};
    DT_TRY(dt__emit_kernel(p, name, DT__K_XENT, x.dtype, 1, &st.slot, m.slot, mesh, args, &k));
    DT_TRY(dt__resolve_partial(p, name, &m, &m));
    /* c: the sums of exp rescaled to m, the target logit and the ownership, summed over them */
    dt__rowwise_reduced(&x, 1u << (r - 1), 3, DT_REDUCE_SUM, &kl, shape);
    DT_TRY(dt__slot_new(p, &kl, acc, r, shape, &c));
    k = (xent_ctx){.x = &x, .labels = &labels, .y = &c, .mode = DT__XENT_COMBINE};
    ins[0] = st.slot;
    ins[1] = m.slot;
    DT_TRY(dt__emit_kernel(p, name, DT__K_XENT, x.dtype, 2, ins, c.slot, mesh, args, &k));
    DT_TRY(dt__resolve_partial(p, name, &c, &c));
    if (!grad) {
        DT_TRY(dt__slot_new(p, &rows, x.dtype, r - 1, x.shape, &y));
        k = (xent_ctx){.x = &x, .labels = &labels, .y = &y, .mode = DT__XENT_LOSS};
        ins[0] = m.slot;
        ins[1] = c.slot;
        DT_TRY(dt__emit_kernel(p, name, DT__K_XENT, x.dtype, 2, ins, y.slot, mesh, args, &k));
        return dt__finish(p, name, &y, want, out);
    }
    DT_TRY(dt__relayout_emit(p, name, &in[2], &rows, &dy));
    DT_TRY(dt__slot_new(p, &here, x.dtype, r, x.shape, &y));
    k = (xent_ctx){.x = &x, .labels = &labels, .y = &y, .mode = DT__XENT_GRAD | probs, .eps = eps};
    int gins[5] = {x.slot, labels.slot, m.slot, c.slot, dy.slot};
    DT_TRY(dt__emit_kernel(p, name, DT__K_XENT, x.dtype, 5, gins, y.slot, mesh, args, &k));
    return dt__finish(p, name, &y, want, out);
}

/* Operands for a wanted result: the logits with the result's row axes (the gradient's: its
 * layout) and the class axis as the gradient's, the labels and dy with the row axes. */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    bool grad = DT__MODE_KIND((unsigned)n->attrs.op) == DT__XENT_GRAD;
    int r = in[1]->rank;
    if (want->rank != (grad ? r : r - 1))
        return false;
    if (i == 1) {
        *in_want = dt__layout_none(want->mesh, r);
        for (int a = 0; a < want->rank; a++)
            in_want->axes[a] = want->axes[a];
        return true;
    }
    *in_want = rows_of(want, r); /* want's row axes (the loss: want itself) */
    return true;
}

/* The op in mode `mode` (with its flags) and epsilon `eps` (PROBS). */
static dt_status call(int mode, double eps, int n, const dt_tensor *const in[],
                      const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = mode;
    a.a = eps;
    return dt__call(DT__OP_SPARSE_XENT, &a, n, in, opts, out);
}

/* d x for dy: the same op in its gradient mode, with the forward call's flag and epsilon (no
 * gradient flows to the labels). */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    if (DT__MODE_KIND((unsigned)n->attrs.op) != DT__XENT_LOSS)
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: of %s's own gradient", op_name(&n->attrs));
    dx[0] = NULL;
    const dt_tensor *in[3] = {x[0], x[1], dy};
    int mode = DT__XENT_GRAD | (n->attrs.op & DT__XENT_PROBS);
    return dt__tape_keep(a, call(mode, n->attrs.a, 3, in, NULL, &dx[1]), &dx[1]);
}

/* The printer's words for the xent kernel's modes (common/kernels.h). */
static const char *describe(dt__kernel kernel, unsigned mode)
{
    static const char *const words[] = {"max, sum of exp, target", "max of shards",
                                        "sum over shards", "loss", "d logits"};
    unsigned m = DT__MODE_KIND(mode);
    if (kernel == DT__K_XENT && (mode & DT__XENT_PROBS))
        return m == DT__XENT_STATS  ? "sum of clipped p, log target"
               : m == DT__XENT_GRAD ? "d probabilities"
                                    : "?";
    return kernel != DT__K_XENT ? NULL : m < 5 ? words[m] : "?";
}

const dt__op_def dt__op_sparse_xent = {.name = "sparse_softmax_cross_entropy_with_logits",
                                       .min_inputs = 2,
                                       .max_inputs = 3,
                                       .infer = infer,
                                       .expand = expand,
                                       .pull = pull,
                                       .vjp = vjp,
                                       .describe = describe};

dt_status dt_sparse_softmax_cross_entropy_with_logits(const dt_tensor *labels,
                                                      const dt_tensor *logits,
                                                      const dt_op_options *opts, dt_tensor **out)
{
    const dt_tensor *in[2] = {labels, logits};
    return call(DT__XENT_LOSS, 0, 2, in, opts, out);
}

dt_status dt_sparse_categorical_crossentropy(const dt_tensor *labels,
                                             const dt_tensor *probabilities, double epsilon,
                                             const dt_op_options *opts, dt_tensor **out)
{
    const dt_tensor *in[2] = {labels, probabilities};
    return call(DT__XENT_LOSS | DT__XENT_PROBS, epsilon, 2, in, opts, out);
}
