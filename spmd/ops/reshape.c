/* reshape: same elements, new shape. Input and output axes fall into groups of equal product;
 * a group may be sharded on one mesh axis when that axis leads the group on both sides with
 * extents divisible by the shard count (or unchanged), so every device's shard is the same
 * contiguous run before and after: no data moves, only metadata. Anything else is a clear
 * DT_ERR_LAYOUT (relayout first). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    const dt__attrs *a = &n->attrs;
    char sx[DT__SHAPE_STR_MAX], sy[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    dt__shape_str(sy, sizeof sy, a->rank, a->shape);
    if (a->rank < 0 || a->rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE, "reshape: rank %d outside 0..%d", a->rank, DT_MAX_RANK);
    int64_t known = 1;
    int infer_at = -1;
    for (int i = 0; i < a->rank; i++) {
        if (a->shape[i] == -1 && infer_at < 0) {
            infer_at = i;
            continue;
        }
        if (a->shape[i] < 0)
            return dt__fail(DT_ERR_SHAPE, "reshape: %s -> %s: extent %lld", sx, sy,
                            (long long)a->shape[i]);
        if (__builtin_mul_overflow(known, a->shape[i], &known))
            return dt__fail(DT_ERR_SHAPE, "reshape: %s -> %s: the extents overflow 2^63 elements",
                            sx, sy);
    }
    int64_t total = dt__num_elements(x->rank, x->shape);
    memcpy(out->shape, a->shape, sizeof out->shape);
    if (infer_at >= 0) {
        if (known == 0 || total % known)
            return dt__fail(DT_ERR_SHAPE, "reshape: %s -> %s: -1 cannot be inferred", sx, sy);
        out->shape[infer_at] = total / known;
        known = total;
    }
    if (known != total)
        return dt__fail(DT_ERR_SHAPE, "reshape: %s has %lld elements, %s has %lld", sx,
                        (long long)total, sy, (long long)known);
    out->dtype = x->dtype;
    out->rank = a->rank;
    return DT_OK;
}

/* The result's layout, or DT_ERR_LAYOUT (reported unless quiet: the pull probes layouts). */
static dt_status reshape_layout(const dt__dist *x, int rank, const int64_t shape[], bool quiet,
                                dt_layout *out)
{
    const dt_mesh *m = x->layout.mesh;
    *out = dt__layout_none(m, rank);
    out->partial = x->layout.partial;
    out->partial_op = x->layout.partial_op;
    if (dt__num_elements(x->rank, x->shape) == 0) {
        out->partial = 0; /* empty: nothing lies anywhere; the result is unsharded */
        return DT_OK;
    }
    int i = 0, j = 0;
    while (i < x->rank || j < rank) {
        int i0 = i, j0 = j;
        int64_t pi = 1, pj = 1;
        if (i < x->rank)
            pi *= x->shape[i++];
        if (j < rank)
            pj *= shape[j++];
        while (pi != pj) {
            if (pi < pj && i < x->rank)
                pi *= x->shape[i++];
            else if (j < rank)
                pj *= shape[j++];
            else
                break;
        }
        /* trailing extent-1 axes join the group */
        while (i < x->rank && x->shape[i] == 1 && x->layout.axes[i] == DT_UNSHARDED &&
               !(j < rank && shape[j] == 1))
            i++;
        int sharded = -1, count = 0;
        for (int q = i0; q < i; q++)
            if (x->layout.axes[q] != DT_UNSHARDED) {
                sharded = q;
                count++;
            }
        if (!count)
            continue;
        int a = x->layout.axes[sharded], s = m->sizes[a];
        bool leads = true;
        for (int q = i0; q < sharded; q++)
            leads = leads && x->shape[q] == 1;
        int js = j0;
        while (js < j - 1 && shape[js] == 1)
            js++;
        bool ok = count == 1 && leads && js < j &&
                  ((x->shape[sharded] % s == 0 && shape[js] % s == 0) ||
                   (x->shape[sharded] == shape[js]));
        if (!ok && quiet)
            return DT_ERR_LAYOUT;
        if (!ok) {
            char sx[DT__SHAPE_STR_MAX], sy[DT__SHAPE_STR_MAX], lb[DT_STRING_MAX];
            return dt__fail(DT_ERR_LAYOUT,
                            "reshape: %s \"%s\" -> %s: tensor axis %d (extent %lld, split over "
                            "mesh axis \"%s\" in %d shards) cannot stay sharded in the new "
                            "shape; relayout it first",
                            dt__shape_str(sx, sizeof sx, x->rank, x->shape),
                            dt__layout_str(&x->layout, lb, sizeof lb),
                            dt__shape_str(sy, sizeof sy, rank, shape), sharded,
                            (long long)x->shape[sharded], m->names[a], s);
        }
        out->axes[js] = a;
    }
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *x = &in[0];
    int64_t shape[DT_MAX_RANK];
    dt__val v;
    const dt__val xv = {.dtype = x->dtype, .rank = x->rank};
    const dt__val *ins[1] = {&xv};
    memcpy((int64_t *)xv.shape, x->shape, sizeof xv.shape);
    DT_TRY(infer(n, ins, &v));
    memcpy(shape, v.shape, sizeof shape);
    dt__dist y = *x;
    DT_TRY(reshape_layout(x, v.rank, shape, false, &y.layout));
    y.rank = v.rank;
    memcpy(y.shape, shape, sizeof y.shape);
    if (dt__num_elements(x->rank, x->shape) == 0)
        DT_TRY(dt__slot_new(p, &y.layout, y.dtype, y.rank, y.shape, &y));
    return dt__finish(p, "reshape", &y, want, out);
}

/* Sharded axes of x for the request's sharded axes from axis j on (distinct axes of x, tried
 * in order): true at the first assignment whose reshape lies as wanted. */
static bool pull_search(dt__dist *x, const dt_layout *want, int rank, const int64_t shape[], int j)
{
    while (j < want->rank && want->axes[j] == DT_UNSHARDED)
        j++;
    if (j == want->rank) {
        dt_layout y;
        if (reshape_layout(x, rank, shape, true, &y) != DT_OK)
            return false;
        for (int q = 0; q < rank; q++)
            if (y.axes[q] != want->axes[q])
                return false;
        return true;
    }
    for (int i = 0; i < x->rank; i++) {
        if (x->layout.axes[i] != DT_UNSHARDED)
            continue;
        x->layout.axes[i] = want->axes[j];
        if (pull_search(x, want, rank, shape, j + 1))
            return true;
        x->layout.axes[i] = DT_UNSHARDED;
    }
    return false;
}

/* The operand is wanted sharded so that the reshape moves nothing and lies as requested (a
 * bias's gradient summed over the batch then reshaped to the bias's shape is then reduce-
 * scattered into the bias's shards rather than all-reduced and sliced); no preference when
 * the request shards nothing or no layout of the operand does that. */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    bool sharded = false;
    for (int q = 0; q < want->rank; q++)
        sharded = sharded || want->axes[q] != DT_UNSHARDED;
    dt__val v;
    if (!sharded || infer(n, in, &v) != DT_OK || v.rank != want->rank)
        return false;
    dt__dist x;
    memset(&x, 0, sizeof x);
    x.dtype = in[0]->dtype;
    x.rank = in[0]->rank;
    memcpy(x.shape, in[0]->shape, sizeof x.shape);
    x.layout = dt__layout_none(want->mesh, x.rank);
    if (dt__num_elements(x.rank, x.shape) == 0 || !pull_search(&x, want, v.rank, v.shape, 0))
        return false;
    *in_want = x.layout;
    return true;
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return dt__tape_reshape(a, dy, x[0]->rank, x[0]->shape, &dx[0]);
}

const dt__op_def dt__op_reshape = {.name = "reshape",
                                   .min_inputs = 1,
                                   .max_inputs = 1,
                                   .infer = infer,
                                   .expand = expand,
                                   .pull = pull,
                                   .vjp = vjp};

dt_status dt_reshape(const dt_tensor *x, int rank, const int64_t shape[], const dt_op_options *opts,
                     dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (rank < 0 || rank > DT_MAX_RANK || (rank && !shape))
        return dt__fail(DT_ERR_SHAPE, "reshape: rank %d outside 0..%d or shape NULL", rank,
                        DT_MAX_RANK);
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.rank = rank;
    for (int i = 0; i < rank; i++)
        a.shape[i] = shape[i];
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_RESHAPE, &a, 1, in, opts, out);
}
