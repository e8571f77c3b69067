/* arange: element i = start + i * step; each device computes its shard from its offset. */
#include "../engine.h"

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)in;
    DT_TRY(dt__infer_creation("arange", &n->attrs, out));
    return dt__dtype_check("arange", n->attrs.dtype, DT__NUMERIC);
}

static void args(void *ctx, int d, dt__kargs *k)
{
    const dt__creation_ctx *c = ctx;
    dt__kargs_out(k, c->out, d); /* offset[0]: global index of the shard's first element */
    k->a = c->attrs->a;          /* start */
    k->b = c->attrs->b;          /* step */
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)in;
    return dt__expand_creation(p, "arange", n, want, DT__K_ARANGE, args, out);
}

const dt__op_def dt__op_arange = {
    .name = "arange", .min_inputs = 0, .max_inputs = 0, .infer = infer, .expand = expand};

dt_status dt_arange(dt_dtype dtype, int64_t n, double start, double step, const dt_op_options *opts,
                    dt_tensor **out)
{
    dt__attrs a;
    const int64_t shape[1] = {n};
    DT_TRY(dt__creation_attrs("arange", dtype, 1, shape, &a, out));
    a.a = start;
    a.b = step;
    return dt__call(DT__OP_ARANGE, &a, 0, NULL, opts, out);
}
