/* transpose: result axis i is operand axis perm[i]. The layout moves with the axes (partial
 * terms too), so each device transposes its own shard; no communication. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    unsigned seen = 0;
    for (int i = 0; i < x->rank; i++) {
        int q = n->attrs.perm[i];
        if (q < 0 || q >= x->rank || (seen & (1u << q)))
            return dt__fail(DT_ERR_ARG,
                            "transpose: perm[%d] = %d is not a fresh axis of a rank-%d tensor", i,
                            q, x->rank);
        seen |= 1u << q;
        out->shape[i] = x->shape[q];
    }
    out->dtype = x->dtype;
    out->rank = x->rank;
    return DT_OK;
}

typedef struct transpose_ctx {
    const dt__dist *x, *y;
    const int *perm;
} transpose_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    transpose_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    for (int i = 0; i < c->x->rank; i++)
        k->perm[i] = c->perm[i];
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *x = &in[0];
    dt_layout yl = x->layout;
    int64_t yshape[DT_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        yl.axes[i] = x->layout.axes[n->attrs.perm[i]];
        yshape[i] = x->shape[n->attrs.perm[i]];
    }
    dt__dist y;
    DT_TRY(dt__slot_new(p, &yl, x->dtype, x->rank, yshape, &y));
    transpose_ctx c = {.x = x, .y = &y, .perm = n->attrs.perm};
    DT_TRY(dt__emit_kernel(p, "transpose", DT__K_TRANSPOSE, x->dtype, 1, &x->slot, y.slot, yl.mesh,
                           args, &c));
    return dt__finish(p, "transpose", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    *in_want = *want;
    for (int q = 0; q < in[0]->rank; q++)
        in_want->axes[n->attrs.perm[q]] = want->axes[q];
    return true;
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    int inv[DT_MAX_RANK];
    for (int i = 0; i < x[0]->rank; i++)
        inv[n->attrs.perm[i]] = i;
    return dt__tape_keep(a, dt_transpose(dy, inv, NULL, &dx[0]), &dx[0]);
}

const dt__op_def dt__op_transpose = {.name = "transpose",
                                     .min_inputs = 1,
                                     .max_inputs = 1,
                                     .infer = infer,
                                     .expand = expand,
                                     .pull = pull,
                                     .vjp = vjp};

dt_status dt_transpose(const dt_tensor *x, const int perm[], const dt_op_options *opts,
                       dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x || !perm)
        return dt__fail(DT_ERR_ARG, "transpose: %s is NULL", x ? "perm" : "operand");
    dt__attrs a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < x->rank; i++)
        a.perm[i] = perm[i];
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_TRANSPOSE, &a, 1, in, opts, out);
}
