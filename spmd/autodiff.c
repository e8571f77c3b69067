/* Reverse-mode differentiation over the graph of global ops (ARCHITECTURE.md "Strategies as
 * layout presets": training needs gradients).
 *
 * dt_function_gradient replays an ended function's graph into a new function, then walks its
 * nodes backwards and records, for each, the vector-Jacobian product of its operands by the
 * op's rule: the vjp slot of its definition, beside its expansion in spmd/ops/<op>.c. This
 * file keeps the tape (the recorders below, which the rules call) and that walk.
 * The rules are written with the public ops, so the gradient graph is an ordinary graph:
 * propagated and expanded like any other. Each gradient output is requested in the layout of
 * the input it differentiates (a variable's fixed, non-partial layout); a weight gradient of a
 * batch-sharded computation comes out of its matmul partial over the batch mesh axis, and the
 * expansion resolves it by an all-reduce (or keeps the cheaper reduce-scatter when the input is
 * sharded). No caller reduces gradients by hand. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The state of one backward pass: every symbolic tensor it made (freed at the end) and the
 * replayed forward values by graph value id. */
struct dt__tape {
    dt_tensor **own;
    int nown, cap_own;
    dt_tensor **val;   /* forward value v as a tensor of the new function */
    dt_tensor **grad;  /* accumulated gradient of v, or NULL */
    dt_tensor **again; /* v recomputed for the backward pass (a recompute node's), or NULL */
    int *producer;     /* the node computing v, or -1 for an input */
    /* segment sums noted by dt__tape_segment_sum: sums[i] = segsum(data[i], ids[i], rows[i]) */
    struct dt__tape_seg {
        dt_tensor *sum, *data, *ids;
        int64_t rows;
    } * segs;
    int nsegs, cap_segs;
};

/* Record the tensor a call just made (`t` points at its out-parameter; read after the call). */
dt_status dt__tape_keep(dt__tape *a, dt_status s, dt_tensor **tp)
{
    if (s != DT_OK)
        return s;
    dt_tensor *t = *tp;
    if (a->nown == a->cap_own) {
        int cap = a->cap_own ? 2 * a->cap_own : 64;
        dt_tensor **n = realloc(a->own, (size_t)cap * sizeof *n);
        if (!n) {
            dt_tensor_free(t);
            return dt__fail(DT_ERR_NOMEM, "gradient: out of memory");
        }
        a->own = n;
        a->cap_own = cap;
    }
    a->own[a->nown++] = t;
    return DT_OK;
}

/* ---- small recorders: each result is kept by the pass ---------------------------------- */

dt_status dt__tape_unary(dt__tape *a, dt_unary_op op, const dt_tensor *x, dt_tensor **out)
{
    return dt__tape_keep(a, dt_unary(op, x, NULL, out), out);
}

dt_status dt__tape_binary(dt__tape *a, dt_binary_op op, const dt_tensor *x, const dt_tensor *y,
                          dt_tensor **out)
{
    return dt__tape_keep(a, dt_binary(op, x, y, NULL, out), out);
}

/* A constant of `shape`, replicated on x's mesh (rank 0: a scalar that broadcasts). */
dt_status dt__tape_constant(dt__tape *a, const dt_tensor *like, int rank, const int64_t shape[],
                            double value, dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(like->mesh, rank, &l));
    dt_op_options o = {.layout = &l};
    int64_t none[1] = {1};
    return dt__tape_keep(a, dt_fill(like->dtype, rank, rank ? shape : none, value, &o, out), out);
}

dt_status dt__tape_scalar(dt__tape *a, const dt_tensor *like, double value, dt_tensor **out)
{
    return dt__tape_constant(a, like, 0, NULL, value, out);
}

dt_status dt__tape_cast(dt__tape *a, const dt_tensor *x, dt_dtype dtype, dt_tensor **out)
{
    return dt__tape_keep(a, dt_cast(x, dtype, NULL, out), out);
}

dt_status dt__tape_where(dt__tape *a, const dt_tensor *cond, const dt_tensor *x, const dt_tensor *y,
                         dt_tensor **out)
{
    return dt__tape_keep(a, dt_where(cond, x, y, NULL, out), out);
}

dt_status dt__tape_reshape(dt__tape *a, const dt_tensor *x, int rank, const int64_t shape[],
                           dt_tensor **out)
{
    int64_t none[1] = {1};
    return dt__tape_keep(a, dt_reshape(x, rank, rank ? shape : none, NULL, out), out);
}

dt_status dt__tape_reduce_keep(dt__tape *a, dt_reduce_op op, const dt_tensor *x, int naxes,
                               const int axes[], dt_tensor **out)
{
    return dt__tape_keep(a, dt_reduce(op, x, naxes, axes, 1, NULL, out), out);
}

/* dy (of the broadcast result's shape) summed down to `shape` (numpy broadcasting in
 * reverse): leading extra axes and axes of extent 1 in `shape` are summed. */
dt_status dt__tape_sum_to(dt__tape *a, dt_tensor *dy, int rank, const int64_t shape[],
                          dt_tensor **out)
{
    int axes[DT_MAX_RANK], n = 0, off = dy->rank - rank;
    for (int i = 0; i < dy->rank; i++)
        if (i < off || (shape[i - off] == 1 && dy->shape[i] != 1))
            axes[n++] = i;
    dt_tensor *r = dy;
    if (n)
        DT_TRY(dt__tape_reduce_keep(a, DT_REDUCE_SUM, dy, n, axes, &r));
    if (r->rank == rank) {
        *out = r;
        return DT_OK;
    }
    return dt__tape_reshape(a, r, rank, shape, out);
}

/* The gradient of operand x from g (of a broadcast result, in the promoted dtype): summed down to
 * x's shape and converted to x's dtype; none flows into an integer or bool operand. */
dt_status dt__tape_grad_of(dt__tape *a, dt_tensor *g, const dt_tensor *x, dt_tensor **out)
{
    *out = NULL;
    if (!dt_dtype_is_floating(x->dtype))
        return DT_OK;
    DT_TRY(dt__tape_sum_to(a, g, x->rank, x->shape, out));
    return (*out)->dtype == x->dtype ? DT_OK : dt__tape_cast(a, *out, x->dtype, out);
}

/* dy_keep (x's shape with some extents 1) broadcast to x's full shape, sharded as x turns out
 * to be at expansion (x lends its layout): each device writes only its shard, where a
 * replicated broadcast would hold the whole of x on every device (a vocabulary-sharded
 * logits' gradient whole on each model shard). */
dt_status dt__tape_broadcast_to(dt__tape *a, dt_tensor *dy_keep, const dt_tensor *x,
                                dt_tensor **out)
{
    dt__attrs at;
    memset(&at, 0, sizeof at);
    at.rank = x->rank;
    memcpy(at.shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    const dt_tensor *in[2] = {dy_keep, x};
    return dt__tape_keep(a, dt__call(DT__OP_BROADCAST_TO, &at, 2, in, NULL, out), out);
}

dt_status dt__tape_segment_sum(dt__tape *a, dt_tensor *data, dt_tensor *ids, int64_t n,
                               dt_tensor **out)
{
    DT_TRY(dt__tape_keep(a, dt_unsorted_segment_sum(data, ids, n, NULL, out), out));
    if (a->nsegs == a->cap_segs) {
        int cap = a->cap_segs ? 2 * a->cap_segs : 8;
        struct dt__tape_seg *m = realloc(a->segs, (size_t)cap * sizeof *m);
        if (!m)
            return dt__fail(DT_ERR_NOMEM, "gradient: out of memory");
        a->segs = m;
        a->cap_segs = cap;
    }
    a->segs[a->nsegs++] = (struct dt__tape_seg){*out, data, ids, n};
    return DT_OK;
}

/* ---- the pass ------------------------------------------------------------------------------ */

/* Replay node i of the forward graph into the new function on the operands `ins`. */
static dt_status replay(dt__tape *a, const dt__graph *g, int i, const dt_tensor *const ins[],
                        dt_tensor **out)
{
    const dt__node *n = &g->nodes[i];
    const dt__val *ov = &g->vals[n->out];
    dt_op_options o = {.layout = ov->has_layout ? &ov->layout : NULL, .recompute = n->recompute};
    return dt__tape_keep(a, dt__call(n->op, &n->attrs, n->nin, ins, &o, out), out);
}

/* Forward value v as the backward pass reads it: the forward pass's tensor, or, for the result
 * of a node marked recompute, the node replayed once more on its forward operands, recorded
 * where the backward pass first needs it, so that the forward result dies with its last
 * forward reader. */
static dt_status backward_read(dt__tape *a, const dt__graph *g, int v, dt_tensor **out)
{
    int i = a->producer[v];
    if (i < 0 || !g->nodes[i].recompute) {
        *out = a->val[v];
        return DT_OK;
    }
    if (!a->again[v]) {
        const dt__node *n = &g->nodes[i];
        const dt_tensor *ins[DT__MAX_INPUTS];
        for (int j = 0; j < n->nin; j++)
            ins[j] = a->val[n->in[j]];
        DT_TRY(replay(a, g, i, ins, &a->again[v]));
    }
    *out = a->again[v];
    return DT_OK;
}

/* The noted segment sum that t is, or NULL. */
static const struct dt__tape_seg *noted_sum(const dt__tape *a, const dt_tensor *t)
{
    for (int i = 0; i < a->nsegs; i++)
        if (a->segs[i].sum == t)
            return &a->segs[i];
    return NULL;
}

/* Add g to v's gradient. Where one of the two is a noted segment sum (a gather's gradient) and
 * the other another gradient of the same table (its dtype and shape), the sum's rows are added
 * into the other (one op, bitwise the same values): the segment sum itself, unused, is never
 * computed. */
static dt_status accumulate(dt__tape *a, int v, dt_tensor *g)
{
    if (!g)
        return DT_OK;
    if (!a->grad[v]) {
        a->grad[v] = g;
        return DT_OK;
    }
    const struct dt__tape_seg *seg = noted_sum(a, g);
    dt_tensor *base = g;
    if (seg)
        base = a->grad[v];
    else
        seg = noted_sum(a, a->grad[v]);
    bool same = seg && base->dtype == seg->sum->dtype && base->rank == seg->sum->rank &&
                !memcmp(base->shape, seg->sum->shape, sizeof(int64_t) * (size_t)base->rank);
    if (same)
        return dt__tape_keep(
            a, dt__segment_sum_into(seg->data, seg->ids, seg->rows, base, &a->grad[v]),
            &a->grad[v]);
    return dt__tape_binary(a, DT_BINARY_ADD, a->grad[v], g, &a->grad[v]);
}

static bool differentiable(dt_dtype d)
{
    return dt_dtype_is_floating(d);
}

static dt_status record_gradient(const dt__graph *g, dt_function *nf, int loss_output, int num_wrt,
                                 const int wrt[], dt__tape *a, dt_tensor **outs)
{
    /* replay the forward graph */
    for (int i = 0; i < g->ninputs; i++) {
        const dt__val *v = &g->vals[g->inputs[i]];
        DT_TRY(dt__tape_keep(
            a,
            dt_function_input(nf, &v->layout, v->dtype, v->rank, v->shape, &a->val[g->inputs[i]]),
            &a->val[g->inputs[i]]));
    }
    for (int v = 0; v < g->nvals; v++)
        a->producer[v] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const dt__node *n = &g->nodes[i];
        const dt_tensor *ins[DT__MAX_INPUTS];
        for (int j = 0; j < n->nin; j++)
            ins[j] = a->val[n->in[j]];
        a->producer[n->out] = i;
        DT_TRY(replay(a, g, i, ins, &a->val[n->out]));
    }
    /* seed: d(sum of the loss's elements) / d(loss) = 1 */
    int lv = g->outputs[loss_output];
    const dt_tensor *L = a->val[lv];
    DT_TRY(dt__tape_constant(a, L, L->rank, L->shape, 1.0, &a->grad[lv]));
    /* backward */
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const dt__node *n = &g->nodes[i];
        dt_tensor *dy = a->grad[n->out];
        dt__vjp_fn rule = dt__op_get(n->op)->vjp;
        if (!dy || !rule || !differentiable(g->vals[n->out].dtype))
            continue;
        dt_tensor *xs[DT__MAX_INPUTS], *dx[DT__MAX_INPUTS] = {0}, *ys;
        for (int j = 0; j < n->nin; j++)
            DT_TRY(backward_read(a, g, n->in[j], &xs[j]));
        DT_TRY(backward_read(a, g, n->out, &ys));
        DT_TRY(rule(a, n, xs, ys, dy, dx));
        for (int j = 0; j < n->nin; j++)
            DT_TRY(accumulate(a, n->in[j], dx[j]));
    }
    /* outputs: the forward outputs, then each gradient in its input's layout */
    for (int i = 0; i < g->noutputs; i++)
        outs[i] = a->val[g->outputs[i]];
    for (int w = 0; w < num_wrt; w++) {
        int v = g->inputs[wrt[w]];
        const dt__val *iv = &g->vals[v];
        dt_tensor *gr = a->grad[v];
        if (!gr) {
            dt_op_options o = {.layout = &iv->layout};
            DT_TRY(dt__tape_keep(a, dt_zeros(iv->dtype, iv->rank, iv->shape, &o, &gr), &gr));
        } else {
            DT_TRY(dt__tape_keep(a, dt_relayout(gr, &iv->layout, NULL, &gr), &gr));
        }
        outs[g->noutputs + w] = gr;
    }
    return DT_OK;
}

dt_status dt_function_gradient(const dt_function *f, int loss_output, int num_wrt, const int wrt[],
                               dt_function **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_function_gradient: out is NULL");
    *out = NULL;
    const dt__graph *g = dt__function_graph(f);
    if (!g)
        return dt__fail(DT_ERR_STATE,
                        "dt_function_gradient: the function was not ended successfully");
    if (loss_output < 0 || loss_output >= g->noutputs)
        return dt__fail(DT_ERR_ARG, "dt_function_gradient: loss output %d, the function has %d",
                        loss_output, g->noutputs);
    const dt__val *lv = &g->vals[g->outputs[loss_output]];
    if (!differentiable(lv->dtype))
        return dt__fail(DT_ERR_DTYPE,
                        "dt_function_gradient: loss output %d is %s, expected a floating dtype",
                        loss_output, dt_dtype_name(lv->dtype));
    if (num_wrt < 0 || (num_wrt && !wrt))
        return dt__fail(DT_ERR_ARG, "dt_function_gradient: %d inputs to differentiate%s", num_wrt,
                        wrt ? "" : " (wrt NULL)");
    for (int w = 0; w < num_wrt; w++) {
        if (wrt[w] < 0 || wrt[w] >= g->ninputs)
            return dt__fail(DT_ERR_ARG,
                            "dt_function_gradient: wrt[%d] = %d, the function has %d "
                            "inputs",
                            w, wrt[w], g->ninputs);
        const dt__val *iv = &g->vals[g->inputs[wrt[w]]];
        if (!differentiable(iv->dtype))
            return dt__fail(DT_ERR_DTYPE,
                            "dt_function_gradient: input %d is %s, expected a floating dtype",
                            wrt[w], dt_dtype_name(iv->dtype));
        if (iv->layout.partial)
            return dt__fail(DT_ERR_LAYOUT, "dt_function_gradient: input %d has a partial layout",
                            wrt[w]);
    }
    dt__tape a = {0};
    dt_function *nf = NULL;
    int nouts = g->noutputs + num_wrt;
    a.val = calloc((size_t)g->nvals + 1, sizeof *a.val);
    a.grad = calloc((size_t)g->nvals + 1, sizeof *a.grad);
    a.again = calloc((size_t)g->nvals + 1, sizeof *a.again);
    a.producer = calloc((size_t)g->nvals + 1, sizeof *a.producer);
    dt_tensor **outs = calloc((size_t)nouts + 1, sizeof *outs);
    dt_status s = a.val && a.grad && a.again && a.producer && outs
                      ? dt_function_begin(&nf)
                      : dt__fail(DT_ERR_NOMEM, "dt_function_gradient: out of memory");
    if (s != DT_OK)
        goto done;
    s = record_gradient(g, nf, loss_output, num_wrt, wrt, &a, outs);
    if (s == DT_OK) {
        s = dt_function_end(nf, nouts, outs);
    } else {
        /* stop recording, keeping the message of the failure above */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_function_end(nf, 0, NULL);
        dt__set_error(msg);
    }
done:
    for (int i = 0; i < a.nown; i++)
        dt_tensor_free(a.own[i]);
    free(a.own);
    free(a.segs);
    free(a.val);
    free(a.grad);
    free(a.again);
    free(a.producer);
    free(outs);
    if (s != DT_OK) {
        dt_function_free(nf);
        return s;
    }
    *out = nf;
    return DT_OK;
}
