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

const dt__op_def dt__op_slice = {
    .name = "slice", .min_inputs = 1, .max_inputs = 1, .infer = infer, .expand = expand};

dt_status dt_slice(const dt_tensor *x, const int64_t begin[], const int64_t size[],
                   const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x || (x->rank && (!begin || !size)))
        return dt__fail(DT_ERR_ARG, "slice: operand, begin or size is NULL");
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
