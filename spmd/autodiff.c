/* Reverse-mode differentiation over the graph of global ops (ARCHITECTURE.md "Strategies as
 * layout presets": training needs gradients).
 *
 * dt_function_gradient replays an ended function's graph into a new function, then walks its
 * nodes backwards and records, for each, the vector-Jacobian product of its operands by the
 * op's rule in the vjp table below (one entry per op of DT__OP_LIST, next to the op table).
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
typedef struct ad {
    dt_tensor **own;
    int nown, cap_own;
    dt_tensor **val;   /* forward value v as a tensor of the new function */
    dt_tensor **grad;  /* accumulated gradient of v, or NULL */
    dt_tensor **again; /* v recomputed for the backward pass (a recompute node's), or NULL */
    int *producer;     /* the node computing v, or -1 for an input */
} ad;

/* Record the tensor a call just made (`t` points at its out-parameter; read after the call). */
static dt_status keep(ad *a, dt_status s, dt_tensor **tp)
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

static dt_status un(ad *a, dt_unary_op op, const dt_tensor *x, dt_tensor **out)
{
    return keep(a, dt_unary(op, x, NULL, out), out);
}

static dt_status bin(ad *a, dt_binary_op op, const dt_tensor *x, const dt_tensor *y,
                     dt_tensor **out)
{
    return keep(a, dt_binary(op, x, y, NULL, out), out);
}

/* A constant of `shape`, replicated on x's mesh (rank 0: a scalar that broadcasts). */
static dt_status constant(ad *a, const dt_tensor *like, int rank, const int64_t shape[],
                          double value, dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(like->mesh, rank, &l));
    dt_op_options o = {.layout = &l};
    int64_t none[1] = {1};
    return keep(a, dt_fill(like->dtype, rank, rank ? shape : none, value, &o, out), out);
}

static dt_status scalar(ad *a, const dt_tensor *like, double value, dt_tensor **out)
{
    return constant(a, like, 0, NULL, value, out);
}

static dt_status cast(ad *a, const dt_tensor *x, dt_dtype dtype, dt_tensor **out)
{
    return keep(a, dt_cast(x, dtype, NULL, out), out);
}

static dt_status where(ad *a, const dt_tensor *cond, const dt_tensor *x, const dt_tensor *y,
                       dt_tensor **out)
{
    return keep(a, dt_where(cond, x, y, NULL, out), out);
}

static dt_status reshape(ad *a, const dt_tensor *x, int rank, const int64_t shape[],
                         dt_tensor **out)
{
    int64_t none[1] = {1};
    return keep(a, dt_reshape(x, rank, rank ? shape : none, NULL, out), out);
}

static dt_status reduce_keep(ad *a, dt_reduce_op op, const dt_tensor *x, int naxes,
                             const int axes[], dt_tensor **out)
{
    return keep(a, dt_reduce(op, x, naxes, axes, 1, NULL, out), out);
}

static dt_status matmul(ad *a, const dt_tensor *x, const dt_tensor *y, int ta, int tb,
                        dt_tensor **out)
{
    dt_op_options o = {.transpose_a = ta, .transpose_b = tb};
    return keep(a, dt_matmul(x, y, &o, out), out);
}

/* dy (of the broadcast result's shape) summed down to `shape` (numpy broadcasting in
 * reverse): leading extra axes and axes of extent 1 in `shape` are summed. */
static dt_status sum_to(ad *a, dt_tensor *dy, int rank, const int64_t shape[], dt_tensor **out)
{
    int axes[DT_MAX_RANK], n = 0, off = dy->rank - rank;
    for (int i = 0; i < dy->rank; i++)
        if (i < off || (shape[i - off] == 1 && dy->shape[i] != 1))
            axes[n++] = i;
    dt_tensor *r = dy;
    if (n)
        DT_TRY(reduce_keep(a, DT_REDUCE_SUM, dy, n, axes, &r));
    if (r->rank == rank) {
        *out = r;
        return DT_OK;
    }
    return reshape(a, r, rank, shape, out);
}

/* The gradient of operand x from g (of a broadcast result, in the promoted dtype): summed down to
 * x's shape and converted to x's dtype; none flows into an integer or bool operand. */
static dt_status grad_of(ad *a, dt_tensor *g, const dt_tensor *x, dt_tensor **out)
{
    *out = NULL;
    if (!dt_dtype_is_floating(x->dtype))
        return DT_OK;
    DT_TRY(sum_to(a, g, x->rank, x->shape, out));
    return (*out)->dtype == x->dtype ? DT_OK : cast(a, *out, x->dtype, out);
}

/* dy_keep (x's shape with some extents 1) broadcast to x's full shape, sharded as x turns out
 * to be at expansion (x lends its layout): each device writes only its shard, where a
 * replicated broadcast would hold the whole of x on every device (a vocabulary-sharded
 * logits' gradient whole on each model shard). */
static dt_status broadcast_to(ad *a, dt_tensor *dy_keep, const dt_tensor *x, dt_tensor **out)
{
    dt__attrs at;
    memset(&at, 0, sizeof at);
    at.rank = x->rank;
    memcpy(at.shape, x->shape, sizeof(int64_t) * (size_t)x->rank);
    const dt_tensor *in[2] = {dy_keep, x};
    return keep(a, dt__call(DT__OP_BROADCAST_TO, &at, 2, in, NULL, out), out);
}

/* ---- vector-Jacobian products, one per op ------------------------------------------------ */

/* Given the node, its operands x[] and result y (tensors of the new function) and the
 * gradient dy of y, set dx[i] to the gradient of operand i (NULL: none flows). */
typedef dt_status (*vjp_fn)(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[]);

/* fill, arange, random: constants, nothing flows. */
#define vjp_fill NULL
#define vjp_arange NULL
#define vjp_random NULL

static dt_status vjp_matmul(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *A = x[0], *B = x[1];
    int ta = n->attrs.ta, tb = n->attrs.tb;
    if (B->rank == 2 && A->rank > 2) {
        /* b of rank 2 shared by every batch: einsums, so that b's gradient is one contraction
         * over the batch axes and the rows (folded into one GEMM), never a product per batch
         * element summed afterwards (a temporary the batch's size times b's). Labels: x the
         * rows of C, y the contraction, z the columns of C. */
        char ea[4 * DT_MAX_RANK + 16], eb[4 * DT_MAX_RANK + 16], bat[DT_MAX_RANK + 1] = {0};
        for (int i = 0; i < A->rank - 2; i++)
            bat[i] = (char)('a' + i);
        const char *la = ta ? "yx" : "xy", *lb = tb ? "zy" : "yz";
        snprintf(ea, sizeof ea, "%sxz,%s->%s%s", bat, lb, bat, la);
        snprintf(eb, sizeof eb, "%s%s,%sxz->%s", bat, la, bat, lb);
        const dt_tensor *opa[2] = {dy, B}, *opb[2] = {A, dy};
        DT_TRY(keep(a, dt_einsum(ea, 2, opa, NULL, &dx[0]), &dx[0]));
        return keep(a, dt_einsum(eb, 2, opb, NULL, &dx[1]), &dx[1]);
    }
    /* C = op(A) op(B): dA and dB by the four transpose cases. */
    if (!ta && !tb) {
        DT_TRY(matmul(a, dy, B, 0, 1, &dx[0])); /* dC B^T */
        DT_TRY(matmul(a, A, dy, 1, 0, &dx[1])); /* A^T dC */
    } else if (ta && !tb) {
        DT_TRY(matmul(a, B, dy, 0, 1, &dx[0])); /* B dC^T */
        DT_TRY(matmul(a, A, dy, 0, 0, &dx[1])); /* A dC */
    } else if (!ta && tb) {
        DT_TRY(matmul(a, dy, B, 0, 0, &dx[0])); /* dC B */
        DT_TRY(matmul(a, dy, A, 1, 0, &dx[1])); /* dC^T A */
    } else {
        DT_TRY(matmul(a, B, dy, 1, 1, &dx[0])); /* B^T dC^T */
        DT_TRY(matmul(a, dy, A, 1, 1, &dx[1])); /* dC^T A^T */
    }
    return DT_OK;
}

static dt_status vjp_unary(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                           dt_tensor *dy, dt_tensor *dx[])
{
    dt_tensor *t, *u, *z;
    switch ((dt_unary_op)n->attrs.op) {
    case DT_UNARY_NEG:
        return un(a, DT_UNARY_NEG, dy, &dx[0]);
    case DT_UNARY_ABS: /* sign(x) = (x > 0) - (x < 0), comparisons in x's dtype */
        DT_TRY(scalar(a, x[0], 0.0, &z));
        DT_TRY(bin(a, DT_BINARY_GT, x[0], z, &t));
        DT_TRY(bin(a, DT_BINARY_LT, x[0], z, &u));
        DT_TRY(cast(a, t, x[0]->dtype, &t));
        DT_TRY(bin(a, DT_BINARY_SUB, t, u, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_EXP:
        return bin(a, DT_BINARY_MUL, dy, y, &dx[0]);
    case DT_UNARY_LOG:
        return bin(a, DT_BINARY_DIV, dy, x[0], &dx[0]);
    case DT_UNARY_SQRT: /* dy / (2 y) */
        DT_TRY(bin(a, DT_BINARY_ADD, y, y, &t));
        return bin(a, DT_BINARY_DIV, dy, t, &dx[0]);
    case DT_UNARY_RELU: /* dy * (x > 0) */
        DT_TRY(scalar(a, x[0], 0.0, &z));
        DT_TRY(bin(a, DT_BINARY_GT, x[0], z, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_TANH: /* dy (1 - y^2) */
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(un(a, DT_UNARY_SQUARE, y, &t));
        DT_TRY(bin(a, DT_BINARY_SUB, z, t, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SIGMOID: /* dy y (1 - y) */
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_SUB, z, y, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, y, t, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SQUARE: /* dy 2x */
        DT_TRY(bin(a, DT_BINARY_ADD, x[0], x[0], &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_SIN:
        DT_TRY(un(a, DT_UNARY_COS, x[0], &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_COS:
        DT_TRY(un(a, DT_UNARY_SIN, x[0], &t));
        DT_TRY(un(a, DT_UNARY_NEG, t, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_ERF: /* dy 2 / sqrt(pi) exp(-x^2) */
        DT_TRY(un(a, DT_UNARY_SQUARE, x[0], &t));
        DT_TRY(un(a, DT_UNARY_NEG, t, &t));
        DT_TRY(un(a, DT_UNARY_EXP, t, &t));
        DT_TRY(scalar(a, x[0], 1.12837916709551257390, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, t, z, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_GELU: /* dy (Phi(x) + x phi(x)), Phi = gelu(x) / x written with erf */
        DT_TRY(scalar(a, x[0], 0.70710678118654752440, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, x[0], z, &t));
        DT_TRY(un(a, DT_UNARY_ERF, t, &t));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(scalar(a, x[0], 0.5, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, t, z, &t)); /* Phi(x) */
        DT_TRY(un(a, DT_UNARY_SQUARE, x[0], &u));
        DT_TRY(scalar(a, x[0], -0.5, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, u, z, &u));
        DT_TRY(un(a, DT_UNARY_EXP, u, &u));
        DT_TRY(scalar(a, x[0], 0.39894228040143267794, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, u, z, &u)); /* phi(x) */
        DT_TRY(bin(a, DT_BINARY_MUL, u, x[0], &u));
        DT_TRY(bin(a, DT_BINARY_ADD, t, u, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_GELU_TANH: {
        /* th = tanh(c (x + k x^3)): dy (0.5 (1 + th) + 0.5 x (1 - th^2) c (1 + 3 k x^2)) */
        const double c = 0.79788456080286535588, k = 0.044715;
        dt_tensor *x2, *th, *v;
        DT_TRY(un(a, DT_UNARY_SQUARE, x[0], &x2));
        DT_TRY(scalar(a, x[0], k, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, x2, z, &t));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, t, x[0], &t));
        DT_TRY(scalar(a, x[0], c, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, t, z, &t));
        DT_TRY(un(a, DT_UNARY_TANH, t, &th));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_ADD, th, z, &u));
        DT_TRY(scalar(a, x[0], 0.5, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, u, z, &u)); /* 0.5 (1 + th) */
        DT_TRY(un(a, DT_UNARY_SQUARE, th, &v));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_SUB, z, v, &v)); /* 1 - th^2 */
        DT_TRY(scalar(a, x[0], 3 * k, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, x2, z, &t));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_ADD, t, z, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, v, t, &v));
        DT_TRY(bin(a, DT_BINARY_MUL, v, x[0], &v));
        DT_TRY(scalar(a, x[0], 0.5 * c, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, v, z, &v));
        DT_TRY(bin(a, DT_BINARY_ADD, u, v, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    }
    case DT_UNARY_SILU: /* s = sigmoid(x): dy s (1 + x (1 - s)) */
        DT_TRY(un(a, DT_UNARY_SIGMOID, x[0], &t));
        DT_TRY(scalar(a, x[0], 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_SUB, z, t, &u));
        DT_TRY(bin(a, DT_BINARY_MUL, u, x[0], &u));
        DT_TRY(bin(a, DT_BINARY_ADD, u, z, &u));
        DT_TRY(bin(a, DT_BINARY_MUL, t, u, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    case DT_UNARY_RSQRT: /* -dy y^3 / 2 */
        DT_TRY(un(a, DT_UNARY_SQUARE, y, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, t, y, &t));
        DT_TRY(scalar(a, x[0], -0.5, &z));
        DT_TRY(bin(a, DT_BINARY_MUL, t, z, &t));
        return bin(a, DT_BINARY_MUL, dy, t, &dx[0]);
    default: /* logical_not: bool, nothing flows */
        return DT_OK;
    }
}

static dt_status vjp_binary(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    dt_tensor *A = x[0], *B = x[1], *ga = NULL, *gb = NULL, *t, *u, *z;
    switch ((dt_binary_op)n->attrs.op) {
    case DT_BINARY_ADD:
        ga = gb = dy;
        break;
    case DT_BINARY_SUB:
        ga = dy;
        DT_TRY(un(a, DT_UNARY_NEG, dy, &gb));
        break;
    case DT_BINARY_MUL:
        DT_TRY(bin(a, DT_BINARY_MUL, dy, B, &ga));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, A, &gb));
        break;
    case DT_BINARY_DIV: /* d(a/b) = da / b - a db / b^2 = (dy / b, -dy y / b) */
        DT_TRY(bin(a, DT_BINARY_DIV, dy, B, &ga));
        DT_TRY(bin(a, DT_BINARY_MUL, ga, y, &t));
        DT_TRY(un(a, DT_UNARY_NEG, t, &gb));
        break;
    case DT_BINARY_MAX: /* to a where a >= b (TensorFlow's tie rule), else to b */
    case DT_BINARY_MIN: /* to a where a <= b */
        DT_TRY(bin(a, n->attrs.op == DT_BINARY_MAX ? DT_BINARY_GE : DT_BINARY_LE, A, B, &t));
        DT_TRY(scalar(a, A, 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_SUB, z, t, &u));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, t, &ga));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, u, &gb));
        break;
    case DT_BINARY_POW: /* (dy b a^(b-1), dy y log a) with log a taken as 0 where a <= 0 */
        DT_TRY(scalar(a, A, 1.0, &z));
        DT_TRY(bin(a, DT_BINARY_SUB, B, z, &t));
        DT_TRY(bin(a, DT_BINARY_POW, A, t, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, t, B, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, t, &ga));
        DT_TRY(scalar(a, A, 0.0, &z));
        DT_TRY(bin(a, DT_BINARY_GT, A, z, &t));  /* 1 where a > 0 */
        DT_TRY(bin(a, DT_BINARY_LE, A, z, &u));  /* 1 where a <= 0 */
        DT_TRY(bin(a, DT_BINARY_MUL, A, t, &t)); /* a, or 0 */
        DT_TRY(bin(a, DT_BINARY_ADD, t, u, &t)); /* a, or 1 */
        DT_TRY(un(a, DT_UNARY_LOG, t, &t));      /* log a, or 0 */
        DT_TRY(bin(a, DT_BINARY_MUL, y, t, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, t, &gb));
        break;
    case DT_BINARY_FLOORMOD: /* a - floordiv(a, b) b: (dy, -dy floordiv(a, b)) */
        ga = dy;
        DT_TRY(bin(a, DT_BINARY_FLOORDIV, A, B, &t));
        DT_TRY(bin(a, DT_BINARY_MUL, dy, t, &t));
        DT_TRY(un(a, DT_UNARY_NEG, t, &gb));
        break;
    default: /* comparisons, floordiv and the logical ops: piecewise constant */
        return DT_OK;
    }
    DT_TRY(grad_of(a, ga, A, &dx[0]));
    return grad_of(a, gb, B, &dx[1]);
}

static dt_status vjp_reduce(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    const dt_tensor *X = x[0];
    int64_t kshape[DT_MAX_RANK]; /* x's shape with the reduced axes of extent 1 */
    int axes[DT_MAX_RANK], nax = 0;
    double count = 1;
    for (int i = 0; i < X->rank; i++) {
        bool red = n->attrs.mask & (1u << i);
        kshape[i] = red ? 1 : X->shape[i];
        if (red) {
            axes[nax++] = i;
            count *= (double)X->shape[i];
        }
    }
    dt_tensor *dk = dy, *yk = y, *t, *c;
    if (!n->attrs.keepdims) {
        DT_TRY(reshape(a, dy, X->rank, kshape, &dk));
        DT_TRY(reshape(a, y, X->rank, kshape, &yk));
    }
    switch ((dt_reduce_op)n->attrs.op) {
    case DT_REDUCE_SUM:
        return broadcast_to(a, dk, X, &dx[0]);
    case DT_REDUCE_MEAN:
        DT_TRY(scalar(a, X, 1.0 / count, &c));
        DT_TRY(bin(a, DT_BINARY_MUL, dk, c, &t));
        return broadcast_to(a, t, X, &dx[0]);
    case DT_REDUCE_MAX:
    case DT_REDUCE_MIN: /* shared equally among the elements equal to the extremum */
        DT_TRY(bin(a, DT_BINARY_EQ, x[0], yk, &t));
        DT_TRY(cast(a, t, X->dtype, &t));
        DT_TRY(reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &c));
        DT_TRY(bin(a, DT_BINARY_DIV, dk, c, &c));
        return bin(a, DT_BINARY_MUL, t, c, &dx[0]);
    case DT_REDUCE_PROD: {
        /* d prod / d x_i is the product of the row's other elements: y / x_i in a row without
         * a zero; in a row with one zero, the product of its nonzero elements at the zero and 0
         * elsewhere; with two zeros or more, 0 (exact where TensorFlow's exclusive cumulative
         * products are, and without dividing by zero) */
        dt_tensor *zero, *one, *isz, *nz, *xnz, *pnz, *at0, *else0;
        DT_TRY(scalar(a, X, 0.0, &zero));
        DT_TRY(scalar(a, X, 1.0, &one));
        DT_TRY(bin(a, DT_BINARY_EQ, x[0], zero, &isz));
        DT_TRY(cast(a, isz, X->dtype, &t));
        DT_TRY(reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &nz)); /* zeros per row */
        DT_TRY(where(a, isz, one, x[0], &xnz));
        DT_TRY(reduce_keep(a, DT_REDUCE_PROD, xnz, nax, axes, &pnz));
        DT_TRY(bin(a, DT_BINARY_EQ, nz, one, &c));
        DT_TRY(where(a, c, pnz, zero, &at0));
        DT_TRY(bin(a, DT_BINARY_DIV, yk, xnz, &t));
        DT_TRY(bin(a, DT_BINARY_EQ, nz, zero, &c));
        DT_TRY(where(a, c, t, zero, &else0));
        DT_TRY(where(a, isz, at0, else0, &t));
        return bin(a, DT_BINARY_MUL, t, dk, &dx[0]);
    }
    default:
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: reduce %s has no gradient rule",
                        dt_reduce_op_name((dt_reduce_op)n->attrs.op));
    }
}

static dt_status vjp_transpose(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                               dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    int inv[DT_MAX_RANK];
    for (int i = 0; i < x[0]->rank; i++)
        inv[n->attrs.perm[i]] = i;
    return keep(a, dt_transpose(dy, inv, NULL, &dx[0]), &dx[0]);
}

static dt_status vjp_reshape(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                             dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return reshape(a, dy, x[0]->rank, x[0]->shape, &dx[0]);
}

/* The slice's gradient is dy padded with zeros back to x's shape, one axis at a time. */
static dt_status vjp_slice(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                           dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *X = x[0];
    dt_tensor *cur = dy;
    for (int i = 0; i < X->rank; i++) {
        int64_t before = n->attrs.begin[i], after = X->shape[i] - before - n->attrs.shape[i];
        if (!before && !after)
            continue;
        const dt_tensor *parts[3];
        int np = 0;
        int64_t shape[DT_MAX_RANK];
        memcpy(shape, cur->shape, sizeof(int64_t) * (size_t)cur->rank);
        dt_tensor *zb, *za;
        if (before) {
            shape[i] = before;
            DT_TRY(constant(a, X, X->rank, shape, 0.0, &zb));
            parts[np++] = zb;
        }
        parts[np++] = cur;
        if (after) {
            shape[i] = after;
            DT_TRY(constant(a, X, X->rank, shape, 0.0, &za));
            parts[np++] = za;
        }
        DT_TRY(keep(a, dt_concat(np, parts, i, NULL, &cur), &cur));
    }
    dx[0] = cur;
    return DT_OK;
}

static dt_status vjp_concat(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    int axis = n->attrs.axis;
    int64_t at = 0;
    for (int t = 0; t < n->nin; t++) {
        int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
        memcpy(size, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
        begin[axis] = at;
        size[axis] = x[t]->shape[axis];
        at += x[t]->shape[axis];
        DT_TRY(keep(a, dt_slice(dy, begin, size, NULL, &dx[t]), &dx[t]));
    }
    return DT_OK;
}

static dt_status vjp_relayout(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                              dt_tensor *dy, dt_tensor *dx[])
{
    (void)a;
    (void)n;
    (void)x;
    (void)y;
    dx[0] = dy; /* the same global tensor */
    return DT_OK;
}

static dt_status vjp_copy_to_mesh(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                                  dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    /* back to the operand's mesh, replicated (its layout there may be free) */
    dt_layout l;
    DT_TRY(dt_layout_replicated(x[0]->mesh, x[0]->rank, &l));
    return keep(a, dt_copy_to_mesh(dy, &l, NULL, &dx[0]), &dx[0]);
}

/* The conversion back to the operand's dtype (floating operands only). */
static dt_status vjp_cast(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                          dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    if (!dt_dtype_is_floating(x[0]->dtype))
        return DT_OK;
    return cast(a, dy, x[0]->dtype, &dx[0]);
}

/* dy to x where cond holds and to y elsewhere (zeros in the other), summed down to each
 * operand's shape; nothing flows into the condition. */
static dt_status vjp_where(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                           dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    dt_tensor *z, *gx, *gy;
    DT_TRY(scalar(a, dy, 0.0, &z));
    DT_TRY(keep(a, dt_where(x[0], dy, z, NULL, &gx), &gx));
    DT_TRY(keep(a, dt_where(x[0], z, dy, NULL, &gy), &gy));
    DT_TRY(grad_of(a, gx, x[1], &dx[1]));
    return grad_of(a, gy, x[2], &dx[2]);
}

/* ---- row-wise ops (softmax.c, norm.c, arg_reduce.c, cumsum.c) ---------------------------- */

/* The reduced axes of a mask, and a tensor's shape with them of extent 1. */
static int axes_of(unsigned mask, const dt_tensor *x, int axes[], int64_t kshape[])
{
    int n = 0;
    for (int i = 0; i < x->rank; i++) {
        kshape[i] = (mask & (1u << i)) ? 1 : x->shape[i];
        if (mask & (1u << i))
            axes[n++] = i;
    }
    return n;
}

/* softmax: y (dy - sum(dy y)); log_softmax: dy - exp(y) sum(dy); logsumexp: dy exp(x - y),
 * sums over the reduced axes kept as extent 1 (and dy, y reshaped so when keepdims was off). */
static dt_status vjp_softmax(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                             dt_tensor *dy, dt_tensor *dx[])
{
    int axes[DT_MAX_RANK];
    int64_t kshape[DT_MAX_RANK];
    int nax = axes_of(n->attrs.mask, x[0], axes, kshape);
    dt_tensor *t, *u;
    switch (n->attrs.op) {
    case DT__SOFTMAX_SOFTMAX:
        DT_TRY(bin(a, DT_BINARY_MUL, dy, y, &t));
        DT_TRY(reduce_keep(a, DT_REDUCE_SUM, t, nax, axes, &t));
        DT_TRY(bin(a, DT_BINARY_SUB, dy, t, &t));
        return bin(a, DT_BINARY_MUL, y, t, &dx[0]);
    case DT__SOFTMAX_LOG_SOFTMAX:
        DT_TRY(reduce_keep(a, DT_REDUCE_SUM, dy, nax, axes, &t));
        DT_TRY(un(a, DT_UNARY_EXP, y, &u));
        DT_TRY(bin(a, DT_BINARY_MUL, u, t, &t));
        return bin(a, DT_BINARY_SUB, dy, t, &dx[0]);
    default: {
        dt_tensor *dk = dy, *yk = y;
        if (!n->attrs.keepdims) {
            DT_TRY(reshape(a, dy, x[0]->rank, kshape, &dk));
            DT_TRY(reshape(a, y, x[0]->rank, kshape, &yk));
        }
        DT_TRY(bin(a, DT_BINARY_SUB, x[0], yk, &t));
        DT_TRY(un(a, DT_UNARY_EXP, t, &t));
        return bin(a, DT_BINARY_MUL, t, dk, &dx[0]);
    }
    }
}

/* Attention: its gradient op gives dq, dk, dv stacked on a leading axis of 3, each sliced off
 * (a local slice: that axis is never split). */
static dt_status vjp_attention(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                               dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    if (n->attrs.op != DT__ATTN_FORWARD)
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: of attention's own gradient");
    dt_tensor *g;
    DT_TRY(keep(a, dt__attention_grad(x[0], x[1], x[2], dy, n->attrs.axis, n->attrs.a, &g), &g));
    int r = x[0]->rank;
    int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
    size[0] = 1;
    for (int i = 0; i < r; i++)
        size[i + 1] = x[0]->shape[i];
    for (int j = 0; j < 3; j++) {
        dt_tensor *s;
        begin[0] = j;
        DT_TRY(keep(a, dt_slice(g, begin, size, NULL, &s), &s));
        DT_TRY(reshape(a, s, r, x[0]->shape, &dx[j]));
    }
    return DT_OK;
}

/* With xhat the normalized x (the op itself without gamma and beta), r = 1 / sqrt(var + eps)
 * and g = dy gamma: layer_norm dx = r (g - mean(g) - xhat mean(g xhat)), rms_norm
 * dx = r (g - xhat mean(g xhat)), means over the last axis; dgamma = sum(dy xhat) and
 * dbeta = sum(dy) over every other axis (partial over a batch-sharding mesh axis: the
 * expansion resolves them in gamma's layout). */
static dt_status vjp_norm(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                          dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    dt_tensor *X = x[0];
    bool layer = n->attrs.op == DT__NORM_LAYER;
    double eps = n->attrs.a;
    int last = X->rank - 1, others[DT_MAX_RANK], nothers = 0;
    for (int i = 0; i < last; i++)
        others[nothers++] = i;
    unsigned has = n->attrs.mask;
    dt_tensor *gamma = (has & DT__NORM_GAMMA) ? x[1] : NULL;
    dt_tensor *xhat, *r, *g = dy, *t, *u, *c;
    DT_TRY(keep(a,
                layer ? dt_layer_norm(X, NULL, NULL, eps, NULL, &xhat)
                      : dt_rms_norm(X, NULL, eps, NULL, &xhat),
                &xhat));
    /* r = rsqrt(mean over the last axis of (x - mean)^2, or of x^2, plus eps) */
    t = X;
    if (layer) {
        DT_TRY(reduce_keep(a, DT_REDUCE_MEAN, X, 1, &last, &u));
        DT_TRY(bin(a, DT_BINARY_SUB, X, u, &t));
    }
    DT_TRY(un(a, DT_UNARY_SQUARE, t, &t));
    DT_TRY(reduce_keep(a, DT_REDUCE_MEAN, t, 1, &last, &t));
    DT_TRY(scalar(a, X, eps, &c));
    DT_TRY(bin(a, DT_BINARY_ADD, t, c, &t));
    DT_TRY(un(a, DT_UNARY_RSQRT, t, &r));
    if (gamma)
        DT_TRY(bin(a, DT_BINARY_MUL, dy, gamma, &g));
    DT_TRY(bin(a, DT_BINARY_MUL, g, xhat, &t));
    DT_TRY(reduce_keep(a, DT_REDUCE_MEAN, t, 1, &last, &t));
    DT_TRY(bin(a, DT_BINARY_MUL, xhat, t, &t)); /* xhat mean(g xhat) */
    DT_TRY(bin(a, DT_BINARY_SUB, g, t, &t));
    if (layer) {
        DT_TRY(reduce_keep(a, DT_REDUCE_MEAN, g, 1, &last, &u));
        DT_TRY(bin(a, DT_BINARY_SUB, t, u, &t));
    }
    DT_TRY(bin(a, DT_BINARY_MUL, r, t, &dx[0]));
    int next = 1;
    if (gamma) {
        DT_TRY(bin(a, DT_BINARY_MUL, dy, xhat, &t));
        if (nothers)
            DT_TRY(keep(a, dt_reduce(DT_REDUCE_SUM, t, nothers, others, 0, NULL, &t), &t));
        dx[next++] = t;
    }
    if (has & DT__NORM_BETA) {
        t = dy;
        if (nothers)
            DT_TRY(keep(a, dt_reduce(DT_REDUCE_SUM, t, nothers, others, 0, NULL, &t), &t));
        dx[next] = t;
    }
    return DT_OK;
}

/* Integer indices: nothing flows (the pass skips the op: its result is not floating). */
#define vjp_arg_reduce NULL

/* The running sum taken the other way: cumsum of dy with reverse flipped. */
static dt_status vjp_cumsum(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int flags = n->attrs.keepdims;
    return keep(a, dt_cumsum(dy, n->attrs.axis, flags & 1, !(flags & 2), NULL, &dx[0]), &dx[0]);
}

/* ---- shape and index ops ----------------------------------------------------------------- */

/* The table's gradient: dy's rows added at the ids (requested in the table's layout by the
 * pass's final relayout, so with V split each device adds only the rows its shard owns); the
 * ids are integers: nothing flows. */
static dt_status vjp_gather(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return keep(a, dt_unsorted_segment_sum(dy, x[1], x[0]->shape[0], NULL, &dx[0]), &dx[0]);
}

/* Each data row's gradient is dy's row of its segment (zeros for an id outside the segments). */
static dt_status vjp_segment_sum(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                                 dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return keep(a, dt_gather(dy, x[1], NULL, &dx[0]), &dx[0]);
}

/* one_hot of integer indices: nothing flows. */
#define vjp_one_hot NULL

/* Operand q's gradient: the einsum of dy with the other operand giving q's labels that are in
 * the output or the other operand, then broadcast back along q's summed-only labels. */
static dt_status vjp_einsum(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                            dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    char lab[2][DT_MAX_RANK + 1] = {{0}}, out[DT_MAX_RANK + 1] = {0};
    const char *eq = n->attrs.equation, *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
    int nin = n->nin;
    if (!arrow || (nin == 2 && !comma))
        return dt__fail(DT_ERR_ARG, "gradient: einsum equation \"%s\"", eq);
    const char *end0 = nin == 2 ? comma : arrow;
    snprintf(lab[0], sizeof lab[0], "%.*s", (int)(end0 - eq), eq);
    if (nin == 2)
        snprintf(lab[1], sizeof lab[1], "%.*s", (int)(arrow - comma - 1), comma + 1);
    snprintf(out, sizeof out, "%s", arrow + 2);
    for (int q = 0; q < nin; q++) {
        if (!dt_dtype_is_floating(x[q]->dtype))
            continue;
        char kept[DT_MAX_RANK + 1] = {0}, eq2[64];
        int nk = 0, gone[DT_MAX_RANK], ngone = 0;
        for (int i = 0; lab[q][i]; i++) {
            char c = lab[q][i];
            if (strchr(out, c) || (nin == 2 && strchr(lab[1 - q], c)))
                kept[nk++] = c;
            else
                gone[ngone++] = i;
        }
        dt_tensor *g;
        if (nin == 2) {
            snprintf(eq2, sizeof eq2, "%s,%s->%s", out, lab[1 - q], kept);
            const dt_tensor *ops[2] = {dy, x[1 - q]};
            DT_TRY(keep(a, dt_einsum(eq2, 2, ops, NULL, &g), &g));
        } else {
            snprintf(eq2, sizeof eq2, "%s->%s", out, kept);
            const dt_tensor *ops[1] = {dy};
            DT_TRY(keep(a, dt_einsum(eq2, 1, ops, NULL, &g), &g));
        }
        if (ngone) { /* summed-only labels: every element of x along them got the same dy */
            for (int i = 0; i < ngone; i++)
                DT_TRY(keep(a, dt_expand_dims(g, gone[i], NULL, &g), &g));
            DT_TRY(broadcast_to(a, g, x[q], &g));
        }
        dx[q] = g;
    }
    return DT_OK;
}

/* Operand t's gradient is dy's slice t along the new axis, that axis removed. */
static dt_status vjp_stack(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                           dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int axis = n->attrs.axis;
    for (int t = 0; t < n->nin; t++) {
        int64_t begin[DT_MAX_RANK] = {0}, size[DT_MAX_RANK];
        memcpy(size, dy->shape, sizeof(int64_t) * (size_t)dy->rank);
        begin[axis] = t;
        size[axis] = 1;
        dt_tensor *s;
        DT_TRY(keep(a, dt_slice(dy, begin, size, NULL, &s), &s));
        DT_TRY(keep(a, dt_squeeze(s, 1, &axis, NULL, &dx[t]), &dx[t]));
    }
    return DT_OK;
}

/* The padding's gradient is dy without the padding: a slice. */
static dt_status vjp_pad(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                         dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    return keep(a, dt_slice(dy, n->attrs.begin, x[0]->shape, NULL, &dx[0]), &dx[0]);
}

/* The sum of the tiles: one slice of dy per copy, added. */
static dt_status vjp_tile(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                          dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *X = x[0];
    const int64_t *mult = n->attrs.shape;
    int64_t copies = 1;
    for (int i = 0; i < X->rank; i++)
        copies *= mult[i];
    if (copies == 0) {
        DT_TRY(constant(a, X, X->rank, X->shape, 0.0, &dx[0]));
        return DT_OK;
    }
    if (copies > 4096)
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: tile of %lld copies (at most 4096)",
                        (long long)copies);
    dt_tensor *sum = NULL;
    for (int64_t c = 0; c < copies; c++) {
        int64_t begin[DT_MAX_RANK] = {0}, rest = c;
        for (int i = X->rank - 1; i >= 0; i--) {
            begin[i] = rest % mult[i] * X->shape[i];
            rest /= mult[i];
        }
        dt_tensor *s;
        DT_TRY(keep(a, dt_slice(dy, begin, X->shape, NULL, &s), &s));
        if (sum)
            DT_TRY(bin(a, DT_BINARY_ADD, sum, s, &sum));
        else
            sum = s;
    }
    dx[0] = sum;
    return DT_OK;
}

/* dy summed over the broadcast axes. */
static dt_status vjp_broadcast_to(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                                  dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    return sum_to(a, dy, x[0]->rank, x[0]->shape, &dx[0]);
}

static dt_status vjp_expand_dims(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                                 dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int axis = n->attrs.axis;
    return keep(a, dt_squeeze(dy, 1, &axis, NULL, &dx[0]), &dx[0]);
}

static dt_status vjp_squeeze(ad *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                             dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    dt_tensor *g = dy;
    for (int i = 0; i < x[0]->rank; i++) /* ascending: each axis lands where x had it */
        if (n->attrs.mask & (1u << i))
            DT_TRY(keep(a, dt_expand_dims(g, i, NULL, &g), &g));
    dx[0] = g;
    return DT_OK;
}

/* The vjp table: one entry per op, in the op table's order. */
static const vjp_fn vjp_table[DT__OP_COUNT] = {
#define DT__VJP_ENTRY(NAME, name) [DT__OP_##NAME] = vjp_##name,
    DT__OP_LIST(DT__VJP_ENTRY)
#undef DT__VJP_ENTRY
};

/* ---- the pass ------------------------------------------------------------------------------ */

/* Replay node i of the forward graph into the new function on the operands `ins`. */
static dt_status replay(ad *a, const dt__graph *g, int i, const dt_tensor *const ins[],
                        dt_tensor **out)
{
    const dt__node *n = &g->nodes[i];
    const dt__val *ov = &g->vals[n->out];
    dt_op_options o = {.layout = ov->has_layout ? &ov->layout : NULL, .recompute = n->recompute};
    return keep(a, dt__call(n->op, &n->attrs, n->nin, ins, &o, out), out);
}

/* Forward value v as the backward pass reads it: the forward pass's tensor, or, for the result
 * of a node marked recompute, the node replayed once more on its forward operands, recorded
 * where the backward pass first needs it, so that the forward result dies with its last
 * forward reader. */
static dt_status backward_read(ad *a, const dt__graph *g, int v, dt_tensor **out)
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

static dt_status accumulate(ad *a, int v, dt_tensor *g)
{
    if (!g)
        return DT_OK;
    if (!a->grad[v]) {
        a->grad[v] = g;
        return DT_OK;
    }
    return bin(a, DT_BINARY_ADD, a->grad[v], g, &a->grad[v]);
}

static bool differentiable(dt_dtype d)
{
    return dt_dtype_is_floating(d);
}

static dt_status record_gradient(const dt__graph *g, dt_function *nf, int loss_output, int num_wrt,
                                 const int wrt[], ad *a, dt_tensor **outs)
{
    /* replay the forward graph */
    for (int i = 0; i < g->ninputs; i++) {
        const dt__val *v = &g->vals[g->inputs[i]];
        DT_TRY(keep(
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
    DT_TRY(constant(a, L, L->rank, L->shape, 1.0, &a->grad[lv]));
    /* backward */
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const dt__node *n = &g->nodes[i];
        dt_tensor *dy = a->grad[n->out];
        vjp_fn rule = vjp_table[n->op];
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
            DT_TRY(keep(a, dt_zeros(iv->dtype, iv->rank, iv->shape, &o, &gr), &gr));
        } else {
            DT_TRY(keep(a, dt_relayout(gr, &iv->layout, NULL, &gr), &gr));
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
    ad a = {0};
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
