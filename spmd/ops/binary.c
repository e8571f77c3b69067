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

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    dt_tensor *A = x[0], *B = x[1], *ga = NULL, *gb = NULL, *t, *u, *z;
    switch ((dt_binary_op)n->attrs.op) {
    case DT_BINARY_ADD:
        ga = gb = dy;
        break;
    case DT_BINARY_SUB:
        ga = dy;
        DT_TRY(dt__tape_unary(a, DT_UNARY_NEG, dy, &gb));
        break;
    case DT_BINARY_MUL:
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, B, &ga));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, A, &gb));
        break;
    case DT_BINARY_DIV: /* d(a/b) = da / b - a db / b^2 = (dy / b, -dy y / b) */
        DT_TRY(dt__tape_binary(a, DT_BINARY_DIV, dy, B, &ga));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, ga, y, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_NEG, t, &gb));
        break;
    case DT_BINARY_MAX: /* to a where a >= b (TensorFlow's tie rule), else to b */
    case DT_BINARY_MIN: /* to a where a <= b */
        DT_TRY(dt__tape_binary(a, n->attrs.op == DT_BINARY_MAX ? DT_BINARY_GE : DT_BINARY_LE, A, B,
                               &t));
        DT_TRY(dt__tape_scalar(a, A, 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, z, t, &u));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, t, &ga));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, u, &gb));
        break;
    case DT_BINARY_POW: /* (dy b a^(b-1), dy y log a) with log a taken as 0 where a <= 0 */
        DT_TRY(dt__tape_scalar(a, A, 1.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_SUB, B, z, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_POW, A, t, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, t, B, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, t, &ga));
        DT_TRY(dt__tape_scalar(a, A, 0.0, &z));
        DT_TRY(dt__tape_binary(a, DT_BINARY_GT, A, z, &t));  /* 1 where a > 0 */
        DT_TRY(dt__tape_binary(a, DT_BINARY_LE, A, z, &u));  /* 1 where a <= 0 */
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, A, t, &t)); /* a, or 0 */
        DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, t, u, &t)); /* a, or 1 */
        DT_TRY(dt__tape_unary(a, DT_UNARY_LOG, t, &t));      /* log a, or 0 */
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, y, t, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, t, &gb));
        break;
    case DT_BINARY_FLOORMOD: /* a - floordiv(a, b) b: (dy, -dy floordiv(a, b)) */
        ga = dy;
        DT_TRY(dt__tape_binary(a, DT_BINARY_FLOORDIV, A, B, &t));
        DT_TRY(dt__tape_binary(a, DT_BINARY_MUL, dy, t, &t));
        DT_TRY(dt__tape_unary(a, DT_UNARY_NEG, t, &gb));
        break;
    default: /* comparisons, floordiv and the logical ops: piecewise constant */
        return DT_OK;
    }
    DT_TRY(dt__tape_grad_of(a, ga, A, &dx[0]));
    return dt__tape_grad_of(a, gb, B, &dx[1]);
}

const dt__op_def dt__op_binary = {.name = "binary",
                                  .min_inputs = 2,
                                  .max_inputs = 2,
                                  .infer = infer,
                                  .expand = expand,
                                  .pull = pull,
                                  .vjp = vjp};

dt_status dt_binary(dt_binary_op op, const dt_tensor *a, const dt_tensor *b,
                    const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs at;
    memset(&at, 0, sizeof at);
    at.op = (int)op;
    const dt_tensor *in[2] = {a, b};
    return dt__call(DT__OP_BINARY, &at, 2, in, opts, out);
}
