/* squeeze (tf.squeeze): axes of extent 1 removed (the named ones, or every one). Metadata
 * only: every device's shard is the same bytes without those axes, the others keep their
 * sharding and partial terms stay. An extent-1 axis split over a mesh axis lies on one shard
 * (the others are empty), so it is made unsharded first (an all-gather of that one element per
 * row: the only move). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    unsigned mask = n->attrs.mask;
    if (mask >> x->rank)
        return dt__fail(DT_ERR_ARG, "squeeze: axes mask 0x%x names axes beyond rank %d", mask,
                        x->rank);
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!(mask & (1u << i))) {
            out->shape[out->rank++] = x->shape[i];
            continue;
        }
        if (x->shape[i] != 1) {
            char sx[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_SHAPE, "squeeze: axis %d of %s has extent %lld, not 1", i,
                            dt__shape_str(sx, sizeof sx, x->rank, x->shape),
                            (long long)x->shape[i]);
        }
    }
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    unsigned mask = n->attrs.mask;
    dt__dist x = in[0];
    dt_layout flat = x.layout;
    bool moves = false;
    for (int i = 0; i < x.rank; i++)
        if ((mask & (1u << i)) && flat.axes[i] != DT_UNSHARDED) {
            flat.axes[i] = DT_UNSHARDED;
            moves = true;
        }
    if (moves)
        DT_TRY(dt__relayout_emit(p, "squeeze", &x, &flat, &x));
    /* the same slot without the squeezed axes */
    dt__dist y = x;
    y.rank = 0;
    for (int i = 0; i < x.rank; i++) {
        if (mask & (1u << i))
            continue;
        y.shape[y.rank] = x.shape[i];
        y.layout.axes[y.rank++] = x.layout.axes[i];
    }
    y.layout.rank = y.rank;
    for (int i = y.rank; i < DT_MAX_RANK; i++) {
        y.shape[i] = 0;
        y.layout.axes[i] = DT_UNSHARDED;
    }
    return dt__finish(p, "squeeze", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    *in_want = *want;
    in_want->rank = in[0]->rank;
    for (int q = 0, j = 0; q < in[0]->rank; q++)
        in_want->axes[q] = n->attrs.mask & (1u << q) ? DT_UNSHARDED : want->axes[j++];
    return true;
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    dt_tensor *g = dy;
    for (int i = 0; i < x[0]->rank; i++) /* ascending: each axis lands where x had it */
        if (n->attrs.mask & (1u << i))
            DT_TRY(dt__tape_keep(a, dt_expand_dims(g, i, NULL, &g), &g));
    dx[0] = g;
    return DT_OK;
}

const dt__op_def dt__op_squeeze = {.name = "squeeze",
                                   .min_inputs = 1,
                                   .max_inputs = 1,
                                   .infer = infer,
                                   .expand = expand,
                                   .pull = pull,
                                   .vjp = vjp};

dt_status dt_squeeze(const dt_tensor *x, int num_axes, const int axes[], const dt_op_options *opts,
                     dt_tensor **out)
{
    if (out)
        *out = NULL;
    dt__attrs a;
    memset(&a, 0, sizeof a);
    dt_status s = DT_OK;
    if (!x)
        s = dt__fail(DT_ERR_ARG, "squeeze: operand is NULL");
    else if (num_axes < 0 || (num_axes && !axes))
        s = dt__fail(DT_ERR_ARG, "squeeze: %d axes%s", num_axes, axes ? "" : " (axes NULL)");
    for (int i = 0; s == DT_OK && i < num_axes; i++) {
        int ax = axes[i] < 0 ? axes[i] + x->rank : axes[i];
        if (ax < 0 || ax >= x->rank)
            s = dt__fail(DT_ERR_ARG, "squeeze: axis %d is outside a tensor of rank %d", axes[i],
                         x->rank);
        else if (a.mask & (1u << ax))
            s = dt__fail(DT_ERR_ARG, "squeeze: axis %d named twice", axes[i]);
        else
            a.mask |= 1u << ax;
    }
    if (s == DT_OK && num_axes == 0) /* every axis of extent 1 */
        for (int i = 0; i < x->rank; i++)
            if (x->shape[i] == 1)
                a.mask |= 1u << i;
    if (s != DT_OK) /* the other clients fail alike with this one */
        return dt__call_fail(DT__OP_SQUEEZE, 1, &x, opts, s);
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_SQUEEZE, &a, 1, in, opts, out);
}
