/* arange: element i = start + i * step; each device computes its shard from its offset. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)in;
    return dt__infer_creation("arange", &n->attrs, out);
}

typedef struct arange_ctx {
    const dt__dist *out;
    double start, step;
} arange_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    arange_ctx *c = ctx;
    dt__kargs_out(k, c->out, d); /* offset[0]: global index of the shard's first element */
    k->a = c->start;
    k->b = c->step;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)in;
    /* computed in the request's layout without partial axes, then marked partial */
    dt_layout base = *want;
    base.partial = 0;
    dt__dist y;
    DT_TRY(dt__slot_new(p, &base, n->attrs.dtype, 1, n->attrs.shape, &y));
    arange_ctx c = {.out = &y, .start = n->attrs.a, .step = n->attrs.b};
    DT_TRY(
        dt__emit_kernel(p, "arange", DT__K_ARANGE, y.dtype, 0, NULL, y.slot, want->mesh, args, &c));
    return dt__relayout_emit(p, "arange", &y, want, out);
}

const dt__op_def dt__op_arange = {
    .name = "arange", .min_inputs = 0, .max_inputs = 0, .infer = infer, .expand = expand};

dt_status dt_arange(dt_dtype dtype, int64_t n, double start, double step, const dt_op_options *opts,
                    dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    a.rank = 1;
    a.shape[0] = n;
    a.a = start;
    a.b = step;
    return dt__call(DT__OP_ARANGE, &a, 0, NULL, opts, out);
}
