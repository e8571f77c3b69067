/* slice: x[begin : begin + size] per axis. Axes not cut keep their sharding and are not
 * touched; an axis that is cut and sharded is gathered first (all-gather on its mesh axis only),
 * then every device copies its shard of the result, which keeps the operand's layout (partial
 * terms included: slicing is linear). */
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
    dt_layout gathered = x->layout;
    for (int i = 0; i < x->rank; i++)
        if (n->attrs.begin[i] != 0 || n->attrs.shape[i] != x->shape[i])
            gathered.axes[i] = DT_UNSHARDED;
    dt__dist g, y;
    DT_TRY(dt__relayout_emit(p, "slice", x, &gathered, &g));
    DT_TRY(dt__emit_local_slice(p, "slice", &g, &x->layout, x->rank, n->attrs.shape, n->attrs.begin,
                                &y));
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
