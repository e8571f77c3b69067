/* slice: x[begin : begin + size] per axis. The result keeps the operand's layout (partial terms
 * included: slicing is linear). When no cut axis is sharded every device copies its shard
 * locally; otherwise the shards of the result are redistributed (a block exchange: each device
 * receives only the elements of its new shard it lacks, no axis is gathered). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    for (int i = 0; i < x->rank; i++) {
        int64_t b = n->attrs.begin[i], s = n->attrs.shape[i];
        if (b < 0 || s < 0 || b > x->shape[i] || s > x->shape[i] - b) {
            char sb[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_SHAPE,
                            "slice: axis %d: begin %lld, size %lld outside extent %lld of %s", i,
                            (long long)b, (long long)s, (long long)x->shape[i],
                            dt__shape_str(sb, sizeof sb, x->rank, x->shape));
        }
        out->shape[i] = s;
    }
    out->dtype = x->dtype;
    out->rank = x->rank;
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *x = &in[0];
    bool cut_sharded = false;
    for (int i = 0; i < x->rank; i++)
        if ((n->attrs.begin[i] != 0 || n->attrs.shape[i] != x->shape[i]) &&
            x->layout.axes[i] != DT_UNSHARDED)
            cut_sharded = true;
    dt__dist y;
    if (cut_sharded) /* each device receives the elements of its new shard from their holders */
        DT_TRY(dt__emit_exchange(p, "slice", x, &x->layout, x->rank, n->attrs.shape, n->attrs.begin,
                                 &y));
    else /* every device holds its shard of the result already */
        DT_TRY(dt__emit_local_slice(p, "slice", x, &x->layout, x->rank, n->attrs.shape,
                                    n->attrs.begin, &y));
    return dt__finish(p, "slice", &y, want, out);
}

/* The slice's gradient is dy padded with zeros back to x's shape, one axis at a time. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *X = x[0];
    dt_tensor *cur = dy;
    for (int i = 0; i < X->rank; i++) {
        int64_t before = n->attrs.begin[i], after = X->shape[i] - before - n->attrs.shape[i];
        if (!before && !after)
            continue;
        const dt_tensor *parts[3];
        int np = 0;
        int64_t shape[DT_MAX_RANK];
        memcpy(shape, cur->shape, sizeof(int64_t) * (size_t)cur->rank);
        dt_tensor *zb, *za;
        if (before) {
            shape[i] = before;
            DT_TRY(dt__tape_constant(a, X, X->rank, shape, 0.0, &zb));
            parts[np++] = zb;
        }
        parts[np++] = cur;
        if (after) {
            shape[i] = after;
            DT_TRY(dt__tape_constant(a, X, X->rank, shape, 0.0, &za));
            parts[np++] = za;
        }
        DT_TRY(dt__tape_keep(a, dt_concat(np, parts, i, NULL, &cur), &cur));
    }
    dx[0] = cur;
    return DT_OK;
}

const dt__op_def dt__op_slice = {.name = "slice",
                                 .min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer,
                                 .expand = expand,
                                 .vjp = vjp};

dt_status dt_slice(const dt_tensor *x, const int64_t begin[], const int64_t size[],
                   const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x || (x->rank && (!begin || !size)))
        return dt__call_fail(DT__OP_SLICE, 1, &x, opts,
                             dt__fail(DT_ERR_ARG, "slice: operand, begin or size is NULL"));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < x->rank; i++) {
        a.begin[i] = begin[i];
        a.shape[i] = size[i];
    }
    a.rank = x->rank;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_SLICE, &a, 1, in, opts, out);
}

dt_status dt_split(const dt_tensor *x, int num, const int64_t sizes[], int axis,
                   const dt_op_options *opts, dt_tensor *outs[])
{
    DT__SERIAL();
    if (outs)
        for (int i = 0; i < num; i++)
            outs[i] = NULL;
    dt_status s = DT_OK;
    if (!x || !outs)
        return dt__call_fail(DT__OP_SLICE, 1, &x, opts,
                             dt__fail(DT_ERR_ARG, "split: %s is NULL", x ? "outs" : "operand"));
    int ax = axis < 0 ? axis + x->rank : axis;
    char sx[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    if (ax < 0 || ax >= x->rank)
        s = dt__fail(DT_ERR_ARG, "split: axis %d is outside %s of rank %d", axis, sx, x->rank);
    else if (num < 1)
        s = dt__fail(DT_ERR_ARG, "split: %d pieces of %s", num, sx);
    else if (!sizes && x->shape[ax] % num)
        s = dt__fail(DT_ERR_SHAPE,
                     "split: axis %d of %s (extent %lld) does not split into %d "
                     "equal pieces",
                     axis, sx, (long long)x->shape[ax], num);
    int64_t total = 0;
    for (int i = 0; s == DT_OK && sizes && i < num; i++) {
        if (sizes[i] < 0 || sizes[i] > x->shape[ax])
            s = dt__fail(DT_ERR_SHAPE, "split: piece %d has size %lld", i, (long long)sizes[i]);
        total += s == DT_OK ? sizes[i] : 0;
    }
    if (s == DT_OK && sizes && total != x->shape[ax])
        s = dt__fail(DT_ERR_SHAPE, "split: the sizes add up to %lld, axis %d of %s has extent %lld",
                     (long long)total, axis, sx, (long long)x->shape[ax]);
    if (s != DT_OK) /* the other clients fail alike with this one */
        return dt__call_fail(DT__OP_SLICE, 1, &x, opts, s);
    int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
    memcpy(size, x->shape, sizeof(int64_t) * (size_t)x->rank);
    for (int i = 0; s == DT_OK && i < num; i++) {
        size[ax] = sizes ? sizes[i] : x->shape[ax] / num;
        s = dt_slice(x, begin, size, opts, &outs[i]);
        begin[ax] += size[ax];
    }
    if (s != DT_OK)
        for (int i = 0; i < num; i++) {
            dt_tensor_free(outs[i]);
            outs[i] = NULL;
        }
    return s;
}
