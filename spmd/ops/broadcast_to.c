/* broadcast_to (tf.broadcast_to): x stretched to `shape` as numpy broadcasts (axes aligned
 * right; an extent-1 axis, or a missing leading one, repeats). The result keeps x's sharding on
 * the axes x spans; a broadcast axis may be sharded too (each device writes its slice of the
 * repeats). Each device broadcasts its own shard (a CAST step to x's own dtype, which
 * broadcasts): no communication unless the request moves x's sharding, in which case x is
 * relayouted first when that is cheaper (the alpha-beta model; x is the smaller). A partial-sum
 * x stays partial (broadcasting is linear). A second operand, given by the gradients (never by
 * dt_broadcast_to), lends the result its layout when none is requested: the gradient of a
 * reduction comes out sharded as the reduced value was, each device writing only its shard. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    const dt__attrs *a = &n->attrs;
    char sx[DT__SHAPE_STR_MAX], sy[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    if (a->rank < 0 || a->rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE, "broadcast_to: rank %d outside 0..%d", a->rank, DT_MAX_RANK);
    dt__shape_str(sy, sizeof sy, a->rank, a->shape);
    if (n->nin == 2 && (in[1]->rank != a->rank ||
                        memcmp(in[1]->shape, a->shape, sizeof(int64_t) * (size_t)a->rank))) {
        char sl[DT__SHAPE_STR_MAX];
        dt__shape_str(sl, sizeof sl, in[1]->rank, in[1]->shape);
        return dt__fail(DT_ERR_SHAPE, "broadcast_to: the layout's operand is %s, the result %s", sl,
                        sy);
    }
    bool ok = a->rank >= x->rank && dt__num_elements(a->rank, a->shape) >= 0;
    for (int i = 0; ok && i < x->rank; i++) {
        int64_t e = x->shape[i], t = a->shape[i + a->rank - x->rank];
        ok = e == t || e == 1;
    }
    if (!ok)
        return dt__fail(DT_ERR_SHAPE, "broadcast_to: %s does not broadcast to %s", sx, sy);
    out->dtype = x->dtype;
    out->rank = a->rank;
    memcpy(out->shape, a->shape, sizeof out->shape);
    return DT_OK;
}

typedef struct bcast_ctx {
    const dt__dist *x, *y;
} bcast_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    bcast_ctx *c = ctx;
    int64_t l[DT_MAX_RANK];
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, l, NULL);
    int off = k->rank - c->x->rank;
    for (int i = 0; i < k->rank; i++)
        k->in_shape[0][i] = i < off ? 1 : l[i - off];
    k->from = c->x->dtype;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *x = &in[0];
    int r = n->attrs.rank;
    const int64_t *shape = n->attrs.shape;
    dt_layout like;
    if (n->nin == 2 && !want) { /* sharded as the operand lending its layout */
        like = in[1].layout;
        like.partial = 0;
        want = &like;
    }
    bool keep = !x->layout.partial || x->layout.partial_op == DT_REDUCE_SUM;
    /* y takes x's sharding on the axes it spans or the request's, whichever moves less; a
     * partial sum stays partial on the mesh axes y does not use */
    const dt__dist *xs[1] = {x};
    dt_layout ol = dt__broadcast_layout(1, xs, r, shape, want);
    ol.partial = keep ? x->layout.partial & ~dt__layout_used(&ol) : 0;
    const dt_layout *o = &ol;
    dt_layout lx = dt__operand_layout(x, o, shape);
    lx.partial = o->partial;
    dt__dist x2, y;
    DT_TRY(dt__relayout_emit(p, "broadcast_to", x, &lx, &x2));
    DT_TRY(dt__slot_new(p, o, x->dtype, r, shape, &y));
    bcast_ctx c = {.x = &x2, .y = &y};
    DT_TRY(dt__emit_kernel(p, "broadcast_to", DT__K_CAST, x->dtype, 1, &x2.slot, y.slot, o->mesh,
                           args, &c));
    return dt__finish(p, "broadcast_to", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    if (i == 1)
        return false;
    const dt__val *x = in[0];
    int off = n->attrs.rank - x->rank;
    *in_want = dt__layout_none(want->mesh, x->rank);
    for (int q = 0; q < x->rank; q++)
        if (x->shape[q] == n->attrs.shape[q + off]) /* a broadcast axis stays unsharded */
            in_want->axes[q] = want->axes[q + off];
    return true;
}

/* dy summed over the broadcast axes. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return dt__tape_sum_to(a, dy, x[0]->rank, x[0]->shape, &dx[0]);
}

const dt__op_def dt__op_broadcast_to = {.name = "broadcast_to",
                                        .min_inputs = 1,
                                        .max_inputs = 2,
                                        .infer = infer,
                                        .expand = expand,
                                        .pull = pull,
                                        .like_operand = true,
                                        .vjp = vjp};

dt_status dt_broadcast_to(const dt_tensor *x, int rank, const int64_t shape[],
                          const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (rank < 0 || rank > DT_MAX_RANK || (rank && !shape))
        return dt__call_fail(DT__OP_BROADCAST_TO, 1, &x, opts,
                             dt__fail(DT_ERR_SHAPE,
                                      "broadcast_to: rank %d outside 0..%d or shape NULL", rank,
                                      DT_MAX_RANK));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.rank = rank;
    for (int i = 0; i < rank; i++)
        a.shape[i] = shape[i];
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_BROADCAST_TO, &a, 1, in, opts, out);
}
