/* where(cond, x, y): x where cond is true, else y (tf.where with three operands), each operand
 * broadcast to the result as numpy broadcasts; cond is bool, x and y are promoted to one dtype
 * (dt_dtype_promote). The result's layout takes each axis's mesh axis from x, then y, then cond
 * (or the request); each operand is relayouted to it restricted to its own axes, partial terms
 * summed first (a selection is not linear in cond), and each device selects in its shard. */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)n;
    if (in[0]->dtype != DT_DTYPE_BOOL)
        return dt__fail(DT_ERR_DTYPE,
                        "where: the condition is %s, expected bool (compare, or cast)",
                        dt_dtype_name(in[0]->dtype));
    const int ranks[3] = {in[0]->rank, in[1]->rank, in[2]->rank};
    const int64_t *shapes[3] = {in[0]->shape, in[1]->shape, in[2]->shape};
    DT_TRY(dt__broadcast_shape("where", 3, ranks, shapes, &out->rank, out->shape));
    out->dtype = dt_dtype_promote(in[1]->dtype, in[2]->dtype);
    return DT_OK;
}

typedef struct where_ctx {
    const dt__dist *ops[3], *y;
} where_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    where_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    for (int q = 0; q < 3; q++) {
        int64_t l[DT_MAX_RANK];
        dt__local_shape(c->ops[q], d, l, NULL);
        int off = k->rank - c->ops[q]->rank;
        for (int i = 0; i < k->rank; i++)
            k->in_shape[q][i] = i < off ? 1 : l[i - off];
    }
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)n;
    const int ranks[3] = {in[0].rank, in[1].rank, in[2].rank};
    const int64_t *shapes[3] = {in[0].shape, in[1].shape, in[2].shape};
    int r;
    int64_t oshape[DT_MAX_RANK];
    DT_TRY(dt__broadcast_shape("where", 3, ranks, shapes, &r, oshape));
    const dt__dist *all[3] = {&in[0], &in[1], &in[2]};
    dt_layout best = dt__broadcast_layout(3, all, r, oshape, want);
    const dt_layout *o = &best;
    dt_dtype t = dt_dtype_promote(in[1].dtype, in[2].dtype);
    dt__dist ops[3], y;
    for (int q = 0; q < 3; q++) {
        dt_layout lq = dt__operand_layout(&in[q], o, oshape);
        DT_TRY(dt__relayout_emit(p, "where", &in[q], &lq, &ops[q]));
        if (q > 0 && ops[q].dtype != t)
            DT_TRY(dt__emit_cast(p, "where", &ops[q], t, &ops[q]));
    }
    DT_TRY(dt__slot_new(p, o, t, r, oshape, &y));
    where_ctx c = {.ops = {&ops[0], &ops[1], &ops[2]}, .y = &y};
    int ins[3] = {ops[0].slot, ops[1].slot, ops[2].slot};
    DT_TRY(dt__emit_kernel(p, "where", DT__K_WHERE, t, 3, ins, y.slot, o->mesh, args, &c));
    return dt__finish(p, "where", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    const dt__val *x = in[i];
    if (x->rank != want->rank)
        return false;
    *in_want = dt__layout_none(want->mesh, x->rank);
    for (int q = 0; q < x->rank; q++)
        if (x->shape[q] != 1) /* a broadcast axis stays unsharded */
            in_want->axes[q] = want->axes[q];
    return true;
}

/* dy to x where cond holds and to y elsewhere (zeros in the other), summed down to each
 * operand's shape; nothing flows into the condition. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    dt_tensor *z, *gx, *gy;
    DT_TRY(dt__tape_scalar(a, dy, 0.0, &z));
    DT_TRY(dt__tape_keep(a, dt_where(x[0], dy, z, NULL, &gx), &gx));
    DT_TRY(dt__tape_keep(a, dt_where(x[0], z, dy, NULL, &gy), &gy));
    DT_TRY(dt__tape_grad_of(a, gx, x[1], &dx[1]));
    return dt__tape_grad_of(a, gy, x[2], &dx[2]);
}

const dt__op_def dt__op_where = {.name = "where",
                                 .min_inputs = 3,
                                 .max_inputs = 3,
                                 .infer = infer,
                                 .expand = expand,
                                 .pull = pull,
                                 .vjp = vjp};

dt_status dt_where(const dt_tensor *cond, const dt_tensor *x, const dt_tensor *y,
                   const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    const dt_tensor *in[3] = {cond, x, y};
    return dt__call(DT__OP_WHERE, &a, 3, in, opts, out);
}
