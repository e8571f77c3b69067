/* Elementwise binary with numpy broadcasting and type promotion. Operands of different dtypes
 * are both converted to dt_dtype_promote's dtype (a CAST step each, after the move); the
 * comparisons give bool, the logical ops take and give bool. The result's layout takes each
 * axis's mesh axis from an operand that spans it (a or b first: two candidates, or the
 * requested layout); each operand is relayouted to that layout restricted to its own axes
 * (broadcast axes unsharded), partial terms summed first; the cheaper candidate by the cost
 * model wins. */
#include "../engine.h"

#include <string.h>

static bool is_logical(int op)
{
    return op == DT_BINARY_LOGICAL_AND || op == DT_BINARY_LOGICAL_OR || op == DT_BINARY_LOGICAL_XOR;
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    int op = n->attrs.op;
    if ((unsigned)op >= DT_BINARY_COUNT)
        return dt__fail(DT_ERR_ARG, "binary: operator %d is outside 0..%d", op,
                        DT_BINARY_COUNT - 1);
    const char *name = dt_binary_op_name((dt_binary_op)op);
    dt_dtype t = dt_dtype_promote(in[0]->dtype, in[1]->dtype);
    /* comparisons take every dtype; max and min are or and and on bool; the logical ops take
     * bool only; the rest is arithmetic, on the promoted dtype (a bool operand beside a number
     * is promoted; two bools are refused: cast first) */
    if (is_logical(op)) {
        for (int q = 0; q < 2; q++)
            if (in[q]->dtype != DT_DTYPE_BOOL)
                return dt__fail(DT_ERR_DTYPE, "%s: %s is %s, %s takes bool only", name,
                                q ? "b" : "a", dt_dtype_name(in[q]->dtype), name);
    } else if (!DT__BINARY_IS_COMPARISON(op) && op != DT_BINARY_MAX && op != DT_BINARY_MIN &&
               t == DT_DTYPE_BOOL) {
        return dt__fail(DT_ERR_DTYPE, "%s: a and b are bool, %s takes numbers (cast first)", name,
                        name);
    }
    const int ranks[2] = {in[0]->rank, in[1]->rank};
    const int64_t *shapes[2] = {in[0]->shape, in[1]->shape};
    DT_TRY(dt__broadcast_shape(name, 2, ranks, shapes, &out->rank, out->shape));
    out->dtype = DT__BINARY_IS_COMPARISON(op) ? DT_DTYPE_BOOL : t;
    return DT_OK;
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
    const int ranks[2] = {a->rank, b->rank};
    const int64_t *shapes[2] = {a->shape, b->shape};
    int r;
    int64_t oshape[DT_MAX_RANK];
    DT_TRY(dt__broadcast_shape("binary", 2, ranks, shapes, &r, oshape));
    const dt__dist *ab[2] = {a, b};
    dt_layout best = dt__broadcast_layout(2, ab, r, oshape, want);
    const dt_layout *o = &best;
    dt_layout la = dt__operand_layout(a, o, oshape), lb = dt__operand_layout(b, o, oshape);
    dt__dist a2, b2, y;
    DT_TRY(dt__relayout_emit(p, "binary", a, &la, &a2));
    DT_TRY(dt__relayout_emit(p, "binary", b, &lb, &b2));
    dt_dtype t = dt_dtype_promote(a->dtype, b->dtype);
    if (a2.dtype != t)
        DT_TRY(dt__emit_cast(p, "binary", &a2, t, &a2));
    if (b2.dtype != t)
        DT_TRY(dt__emit_cast(p, "binary", &b2, t, &b2));
    bool cmp = DT__BINARY_IS_COMPARISON(n->attrs.op);
    DT_TRY(dt__slot_new(p, o, cmp ? DT_DTYPE_BOOL : t, r, oshape, &y));
    binary_ctx c = {.a = &a2, .b = &b2, .y = &y, .op = n->attrs.op};
    int ins[2] = {a2.slot, b2.slot};
    /* the table is indexed by the operands' dtype (a comparison writes bool) */
    DT_TRY(dt__emit_kernel(p, "binary", DT__K_BINARY, t, 2, ins, y.slot, o->mesh, args, &c));
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
