/* relayout: the same global tensor in the requested layout (spmd/relayout.c plans it). */
#include "../engine.h"

#include <string.h>

dt_status dt__infer_same_tensor(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)n;
    out->dtype = in[0]->dtype;
    out->rank = in[0]->rank;
    memcpy(out->shape, in[0]->shape, sizeof out->shape);
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)n;
    return dt__relayout_emit(p, "relayout", &in[0], want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    (void)in;
    (void)i;
    *in_want = *want;
    return true;
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)a;
    (void)n;
    (void)x;
    (void)y;
    dx[0] = dy; /* the same global tensor */
    return DT_OK;
}

const dt__op_def dt__op_relayout = {.name = "relayout",
                                    .min_inputs = 1,
                                    .max_inputs = 1,
                                    .infer = dt__infer_same_tensor,
                                    .expand = expand,
                                    .pull = pull,
                                    .vjp = vjp};

dt_status dt__call_to_layout(dt__op op, const char *name, const dt_tensor *x,
                             const dt_layout *layout, const dt_op_options *opts, dt_tensor **out)
{
    DT__SERIAL();
    if (out)
        *out = NULL;
    if (!layout)
        return dt__fail(DT_ERR_ARG, "%s: layout is NULL", name);
    dt_op_options o = {0};
    if (opts)
        o = *opts;
    o.layout = layout;
    dt__attrs a;
    memset(&a, 0, sizeof a);
    const dt_tensor *in[1] = {x};
    return dt__call(op, &a, 1, in, &o, out);
}

dt_status dt_relayout(const dt_tensor *x, const dt_layout *layout, const dt_op_options *opts,
                      dt_tensor **out)
{
    return dt__call_to_layout(DT__OP_RELAYOUT, "relayout", x, layout, opts, out);
}
