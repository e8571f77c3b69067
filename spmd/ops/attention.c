/* Fused scaled-dot-product attention (torch.nn.functional.scaled_dot_product_attention without
 * dropout): y = softmax(scale q k^T, causal or not) v over q, k, v of one shape [..., T, E],
 * the leading axes (batch, heads) independent slices.
 *
 * Expansion: q, k, v (and dy for the gradient) are brought to one layout, their leading axes
 * sharded as q's are (or as the request's, when that moves less), the sequence and feature
 * axes whole (gathered when split: each slice needs all of its keys); then one kernel per
 * device on its slices, no collective. The kernel (backends/cpu/kernels.c) tiles queries and keys
 * in blocks with an online softmax, so its scratch is a block's, never [T, T]: memory grows
 * with T. bf16 and f16 operands are cast to f32 for the kernel and its result back.
 *
 * The gradient (the vjp slot below) is the same op in mode DT__ATTN_GRAD: operands
 * q, k, v, dy, result [3, ..., T, E] holding dq, dk, dv, laid out as the operands with a
 * leading unsharded axis; one fused kernel recomputes each query block's statistics
 * (FlashAttention's backward pass). */
#include "../engine.h"

#include <math.h>
#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    bool grad = n->attrs.op == DT__ATTN_GRAD;
    if (n->attrs.op != DT__ATTN_FORWARD && !grad)
        return dt__fail(DT_ERR_ARG, "attention: mode %d", n->attrs.op);
    if (n->nin != (grad ? 4 : 3))
        return dt__fail(DT_ERR_ARG, "attention: %d operands, expected %d", n->nin, grad ? 4 : 3);
    const dt__val *q = in[0];
    DT_TRY(dt__dtype_check("attention", q->dtype, DT__FLOATING));
    if (q->rank < 2 || (grad && q->rank + 1 > DT_MAX_RANK))
        return dt__fail(DT_ERR_SHAPE, "attention: q has rank %d, expected 2 to %d ([..., T, E])",
                        q->rank, DT_MAX_RANK - grad);
    static const char *const names[4] = {"q", "k", "v", "dy"};
    for (int i = 1; i < n->nin; i++) {
        bool same = in[i]->dtype == q->dtype && in[i]->rank == q->rank;
        for (int a = 0; same && a < q->rank; a++)
            same = in[i]->shape[a] == q->shape[a];
        if (!same) {
            char sq[DT__SHAPE_STR_MAX], si[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "attention: %s is %s%s, q %s%s: expected one shape and dtype",
                names[i], dt_dtype_name(in[i]->dtype),
                dt__shape_str(si, sizeof si, in[i]->rank, in[i]->shape), dt_dtype_name(q->dtype),
                dt__shape_str(sq, sizeof sq, q->rank, q->shape));
        }
    }
    if (!(n->attrs.a > 0) || !isfinite(n->attrs.a))
        return dt__fail(DT_ERR_ARG, "attention: scale %g, expected a positive finite number",
                        n->attrs.a);
    out->dtype = q->dtype;
    out->rank = q->rank + grad;
    out->shape[0] = 3;
    for (int a = 0; a < q->rank; a++)
        out->shape[a + grad] = q->shape[a];
    return DT_OK;
}

/* l without partial axes and with its last two axes (T, E) unsharded. */
static dt_layout slices_of(const dt_layout *l, int rank)
{
    dt_layout s = *l;
    s.partial = 0;
    s.partial_op = DT_REDUCE_SUM;
    s.axes[rank - 1] = s.axes[rank - 2] = DT_UNSHARDED;
    return s;
}

typedef struct attn_ctx {
    const dt__dist *q, *y;
    unsigned mode;
    double scale;
} attn_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    attn_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->q, d, k->in_shape[0], NULL);
    k->mode = c->mode;
    k->a = c->scale;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    bool grad = n->attrs.op == DT__ATTN_GRAD;
    int nin = n->nin, r = in[0].rank;
    dt__dist x[4], y;
    /* where the slices are computed: as q lies, or as the forward result is requested */
    dt_layout here = slices_of(&in[0].layout, r);
    if (want && !grad) {
        dt_layout there = slices_of(want, r);
        double cost_here = dt__relayout_cost(&here, want, in[0].dtype, r, in[0].shape);
        double cost_there = dt__relayout_cost(&there, want, in[0].dtype, r, in[0].shape);
        for (int i = 0; i < nin; i++) {
            cost_here += dt__relayout_cost(&in[i].layout, &here, in[i].dtype, r, in[i].shape);
            cost_there += dt__relayout_cost(&in[i].layout, &there, in[i].dtype, r, in[i].shape);
        }
        if (cost_there < cost_here)
            here = there;
    }
    dt_dtype dt = in[0].dtype, kt = dt == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
    int ins[4];
    for (int i = 0; i < nin; i++) {
        DT_TRY(dt__relayout_emit(p, "attention", &in[i], &here, &x[i]));
        if (kt != dt)
            DT_TRY(dt__emit_cast(p, "attention", &x[i], kt, &x[i]));
        ins[i] = x[i].slot;
    }
    dt_layout yl = here;
    int64_t shape[DT_MAX_RANK];
    shape[0] = 3;
    for (int a = 0; a < r; a++)
        shape[a + grad] = x[0].shape[a];
    if (grad) {
        yl.rank = r + 1;
        for (int a = r; a > 0; a--)
            yl.axes[a] = here.axes[a - 1];
        yl.axes[0] = DT_UNSHARDED;
    }
    DT_TRY(dt__slot_new(p, &yl, kt, r + grad, shape, &y));
    attn_ctx c = {.q = &x[0],
                  .y = &y,
                  .mode = (unsigned)n->attrs.op | (n->attrs.axis ? DT__ATTN_CAUSAL : 0u),
                  .scale = n->attrs.a};
    DT_TRY(dt__emit_kernel(p, "attention", DT__K_ATTENTION, kt, nin, ins, y.slot, x[0].layout.mesh,
                           args, &c));
    if (kt != dt)
        DT_TRY(dt__emit_cast(p, "attention", &y, dt, &y));
    return dt__finish(p, "attention", &y, want, out);
}

/* Every operand is wanted as the result's slices lie (the gradient's without its leading
 * axis). */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    int r = in[i]->rank;
    bool grad = n->attrs.op == DT__ATTN_GRAD;
    if (want->rank != r + grad)
        return false;
    dt_layout w = *want;
    if (grad) {
        for (int a = 0; a < r; a++)
            w.axes[a] = want->axes[a + 1];
        w.axes[r] = DT_UNSHARDED;
        w.rank = r;
    }
    *in_want = slices_of(&w, r);
    return true;
}

/* Attention: its gradient op gives dq, dk, dv stacked on a leading axis of 3, each sliced off
 * (a local slice: that axis is never split). */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    if (n->attrs.op != DT__ATTN_FORWARD)
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: of attention's own gradient");
    dt_tensor *g;
    DT_TRY(dt__tape_keep(a, dt__attention_grad(x[0], x[1], x[2], dy, n->attrs.axis, n->attrs.a, &g),
                         &g));
    int r = x[0]->rank;
    int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
    size[0] = 1;
    for (int i = 0; i < r; i++)
        size[i + 1] = x[0]->shape[i];
    for (int j = 0; j < 3; j++) {
        dt_tensor *s;
        begin[0] = j;
        DT_TRY(dt__tape_keep(a, dt_slice(g, begin, size, NULL, &s), &s));
        DT_TRY(dt__tape_reshape(a, s, r, x[0]->shape, &dx[j]));
    }
    return DT_OK;
}

const dt__op_def dt__op_attention = {.name = "attention",
                                     .min_inputs = 3,
                                     .max_inputs = 4,
                                     .infer = infer,
                                     .expand = expand,
                                     .pull = pull,
                                     .vjp = vjp};

static dt_status call(int mode, int n, const dt_tensor *const in[], int causal, double scale,
                      const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = mode;
    a.axis = causal ? 1 : 0;
    /* scale 0 or less: 1 / sqrt(E) (E known once q is: a missing q fails in dt__call) */
    const dt_tensor *q = in[0];
    a.a = scale > 0 || !q || q->rank < 1 ? scale : 1.0 / sqrt((double)q->shape[q->rank - 1]);
    return dt__call(DT__OP_ATTENTION, &a, n, in, opts, out);
}

dt_status dt_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, int causal,
                       double scale, const dt_op_options *opts, dt_tensor **out)
{
    const dt_tensor *in[3] = {q, k, v};
    return call(DT__ATTN_FORWARD, 3, in, causal, scale, opts, out);
}

dt_status dt__attention_grad(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                             const dt_tensor *dy, int causal, double scale, dt_tensor **out)
{
    const dt_tensor *in[4] = {q, k, v, dy};
    return call(DT__ATTN_GRAD, 4, in, causal, scale, NULL, out);
}
