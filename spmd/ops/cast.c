/* cast: every element converted to another dtype (tf.cast): floats to integers toward zero (x86's
 * conversion out of range), to bool as x != 0, between floats rounded to nearest even once.
 * Each device converts its shard; the layout stays. A partial operand is summed first (a cast is
 * not linear: rounding, truncation). When another layout is requested, the conversion runs on the
 * side that moves fewer bytes (before the move when the result is narrower, after it when wider).
 */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    DT_TRY(dt__dtype_check("cast", n->attrs.dtype, DT__ANY));
    out->dtype = n->attrs.dtype;
    out->rank = in[0]->rank;
    memcpy(out->shape, in[0]->shape, sizeof out->shape);
    return DT_OK;
}

typedef struct cast_ctx {
    const dt__dist *x, *y;
} cast_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    cast_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    k->from = c->x->dtype;
}

dt_status dt__emit_cast(dt__program *p, const char *cause, const dt__dist *x, dt_dtype dtype,
                        dt__dist *out)
{
    dt__dist in = *x, y;
    if (in.layout.partial)
        DT_TRY(dt__resolve_partial(p, cause, &in, &in));
    DT_TRY(dt__slot_new(p, &in.layout, dtype, in.rank, in.shape, &y));
    cast_ctx c = {.x = &in, .y = &y};
    DT_TRY(dt__emit_kernel(p, cause, DT__K_CAST, dtype, 1, &in.slot, y.slot, in.layout.mesh, args,
                           &c));
    *out = y;
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    dt__dist x = in[0];
    dt_dtype to = n->attrs.dtype;
    if (want && dt_dtype_size(to) < dt_dtype_size(x.dtype)) {
        dt_layout there = *want;
        there.partial = 0;
        DT_TRY(dt__relayout_emit(p, "cast", &x, &there, &x));
    }
    dt__dist y;
    DT_TRY(dt__emit_cast(p, "cast", &x, to, &y));
    return dt__finish(p, "cast", &y, want, out);
}

/* The conversion back to the operand's dtype (floating operands only). */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    if (!dt_dtype_is_floating(x[0]->dtype))
        return DT_OK;
    return dt__tape_cast(a, dy, x[0]->dtype, &dx[0]);
}

const dt__op_def dt__op_cast = {.name = "cast",
                                .min_inputs = 1,
                                .max_inputs = 1,
                                .infer = infer,
                                .expand = expand,
                                .pull = dt__pull_same,
                                .vjp = vjp};

dt_status dt_cast(const dt_tensor *x, dt_dtype dtype, const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_CAST, &a, 1, in, opts, out);
}
