/* Elementwise binary with numpy broadcasting. The result's layout takes each axis's mesh axis
 * from an operand that spans it (a or b first: two candidates, or the requested layout); each
 * operand is relayouted to that layout restricted to its own axes (broadcast axes unsharded),
 * partial terms summed first; the cheaper candidate by the cost model wins. */
#include "../engine.h"

#include <math.h>
#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *a = in[0], *b = in[1];
    if ((unsigned)n->attrs.op >= DT_BINARY_COUNT)
        return dt__fail(DT_ERR_ARG, "binary: operator %d is outside 0..%d", n->attrs.op,
                        DT_BINARY_COUNT - 1);
    if (a->dtype != b->dtype)
        return dt__fail(DT_ERR_DTYPE, "%s: a is %s, b is %s",
                        dt_binary_op_name((dt_binary_op)n->attrs.op), dt_dtype_name(a->dtype),
                        dt_dtype_name(b->dtype));
    int r = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t ea = ia >= 0 ? a->shape[ia] : 1, eb = ib >= 0 ? b->shape[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_SHAPE,
                            "%s: shapes %s and %s do not broadcast (axis %d: %lld "
                            "vs %lld)",
                            dt_binary_op_name((dt_binary_op)n->attrs.op),
                            dt__shape_str(sa, sizeof sa, a->rank, a->shape),
                            dt__shape_str(sb, sizeof sb, b->rank, b->shape), i, (long long)ea,
                            (long long)eb);
        }
        out->shape[i] = ea == 1 ? eb : ea;
    }
    out->dtype = a->dtype;
    out->rank = r;
    return DT_OK;
}

/* The operand's layout for computing a result laid out as `o` (operand axes aligned right). */
static dt_layout operand_layout(const dt__dist *x, const dt_layout *o, const int64_t oshape[])
{
    dt_layout l = dt__layout_none(o->mesh, x->rank);
    int off = o->rank - x->rank;
    for (int i = 0; i < x->rank; i++)
        if (x->shape[i] == oshape[i + off])
            l.axes[i] = o->axes[i + off];
    return l;
}

/* A result layout preferring `first`'s mesh axes, then `second`'s. */
static dt_layout merged(const dt__dist *first, const dt__dist *second, int rank,
                        const int64_t oshape[])
{
    dt_layout l = dt__layout_none(first->layout.mesh, rank);
    unsigned used = 0;
    const dt__dist *xs[2] = {first, second};
    for (int q = 0; q < 2; q++) {
        const dt__dist *x = xs[q];
        int off = rank - x->rank;
        for (int i = 0; i < x->rank; i++) {
            int ax = x->layout.axes[i];
            if (ax == DT_UNSHARDED || (used & (1u << ax)) || l.axes[i + off] != DT_UNSHARDED ||
                x->shape[i] != oshape[i + off])
                continue;
            l.axes[i + off] = ax;
            used |= 1u << ax;
        }
    }
    return l;
}

static double cost_of(const dt__dist *a, const dt__dist *b, const dt_layout *o, int rank,
                      const int64_t oshape[], const dt_layout *want)
{
    dt_layout la = operand_layout(a, o, oshape), lb = operand_layout(b, o, oshape);
    double c = dt__relayout_cost(&a->layout, &la, a->dtype, a->rank, a->shape) +
               dt__relayout_cost(&b->layout, &lb, b->dtype, b->rank, b->shape);
    if (want)
        c += dt__relayout_cost(o, want, a->dtype, rank, oshape);
    return c;
}

typedef struct binary_ctx {
    const dt__dist *a, *b, *y;
    int op;
} binary_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    binary_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    k->op = c->op;
    const dt__dist *xs[2] = {c->a, c->b};
    for (int q = 0; q < 2; q++) {
        int64_t l[DT_MAX_RANK];
        dt__local_shape(xs[q], d, l, NULL);
        int off = k->rank - xs[q]->rank;
        for (int i = 0; i < k->rank; i++)
            k->in_shape[q][i] = i < off ? 1 : l[i - off];
    }
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *a = &in[0], *b = &in[1];
    int r = a->rank > b->rank ? a->rank : b->rank;
    int64_t oshape[DT_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t ea = ia >= 0 ? a->shape[ia] : 1, eb = ib >= 0 ? b->shape[ib] : 1;
        oshape[i] = ea == 1 ? eb : ea;
    }
    dt_layout cands[3];
    int nc = 0;
    cands[nc++] = merged(a, b, r, oshape);
    cands[nc++] = merged(b, a, r, oshape);
    if (want) {
        cands[nc] = *want;
        cands[nc++].partial = 0;
    }
    int best = 0;
    double best_cost = INFINITY;
    for (int c = 0; c < nc; c++) {
        double cost = cost_of(a, b, &cands[c], r, oshape, want);
        if (cost < best_cost) {
            best_cost = cost;
            best = c;
        }
    }
    const dt_layout *o = &cands[best];
    dt_layout la = operand_layout(a, o, oshape), lb = operand_layout(b, o, oshape);
    dt__dist a2, b2, y;
    DT_TRY(dt__relayout_emit(p, "binary", a, &la, &a2));
    DT_TRY(dt__relayout_emit(p, "binary", b, &lb, &b2));
    DT_TRY(dt__slot_new(p, o, a->dtype, r, oshape, &y));
    binary_ctx c = {.a = &a2, .b = &b2, .y = &y, .op = n->attrs.op};
    int ins[2] = {a2.slot, b2.slot};
    DT_TRY(dt__emit_kernel(p, "binary", DT__K_BINARY, a->dtype, 2, ins, y.slot, o->mesh, args, &c));
    return dt__finish(p, "binary", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    const dt__val *x = in[i];
    if (x->rank != want->rank)
        return false;
    *in_want = dt__layout_none(want->mesh, x->rank);
    for (int q = 0; q < x->rank; q++) {
        /* a broadcast operand axis (extent 1 against a larger result) stays unsharded */
        const dt__val *o = in[1 - i];
        int64_t other = q - (x->rank - o->rank) >= 0 ? o->shape[q - (x->rank - o->rank)] : 1;
        if (x->shape[q] == 1 && other != 1)
            continue;
        in_want->axes[q] = want->axes[q];
    }
    return true;
}

const dt__op_def dt__op_binary = {.name = "binary",
                                  .min_inputs = 2,
                                  .max_inputs = 2,
                                  .infer = infer,
                                  .expand = expand,
                                  .pull = pull};

dt_status dt_binary(dt_binary_op op, const dt_tensor *a, const dt_tensor *b,
                    const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs at;
    memset(&at, 0, sizeof at);
    at.op = (int)op;
    const dt_tensor *in[2] = {a, b};
    return dt__call(DT__OP_BINARY, &at, 2, in, opts, out);
}
