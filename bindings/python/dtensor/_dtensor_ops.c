/* dtensor._dtensor: ops: the creation ops, and `apply`, which runs every op that takes tensors
 * (a table of them, each with its operand counts and its C call). */
#include "_dtensor.h"

/* create(kind, mesh, layout, dtype, shape, a, b, seed, key, program): kind is "fill",
 * "arange" (n = shape[0], start a, step b), "uniform" (low a, high b) or "normal" (mean a,
 * stddev b). */
static PyObject *py_create(PyObject *self, PyObject *args)
{
    (void)self;
    const char *kind, *text;
    PyObject *mesh_o, *shape_o;
    int dtype, program;
    double a, b;
    unsigned long long seed, key;
    if (!PyArg_ParseTuple(args, "sOsiOddKKp", &kind, &mesh_o, &text, &dtype, &shape_o, &a, &b,
                          &seed, &key, &program))
        return NULL;
    int64_t shape[DT_MAX_RANK];
    int rank;
    op_ctx c;
    if (dtpy_parse_ints(shape_o, DT_MAX_RANK, shape, &rank) < 0 ||
        dtpy_ctx_open(&c, mesh_o, text, program))
        return NULL;
    dt_op_options o = dtpy_ctx_options(&c, 0, 0);
    dt_tensor *t = NULL;
    dt_status s;
    dt_dtype d = (dt_dtype)dtype;
    Py_BEGIN_ALLOW_THREADS;
    if (strcmp(kind, "arange") == 0)
        s = dt_arange(d, rank ? shape[0] : 0, a, b, &o, &t);
    else if (strcmp(kind, "uniform") == 0)
        s = dt_random_uniform(d, rank, shape, seed, key, a, b, &o, &t);
    else if (strcmp(kind, "normal") == 0)
        s = dt_random_normal(d, rank, shape, seed, key, a, b, &o, &t);
    else
        s = dt_fill(d, rank, shape, a, &o, &t);
    Py_END_ALLOW_THREADS;
    return dtpy_ctx_close(&c, s, t);
}

/* ---- apply(op, tensors, mesh, layout, program, *attrs): every op that takes tensors ------- */

/* What apply reads of its arguments: the operands, and the attributes, each kind in the order
 * given: integers (op code, axis, depth, ...), lists of integers (axes, perm, shape, begin,
 * size, ...), floats (fill values) and one string (an einsum equation). */
typedef struct {
    const dt_tensor *ts[64];
    Py_ssize_t n; /* operands */
    int rank;     /* the first operand's */
    int64_t at[2][DT_MAX_RANK];
    int atn[2];
    int ints[DT_MAX_RANK]; /* at[0] as the ints of the C calls */
    int64_t iv[4];
    double fl[2];
    const char *str;
    int code, flag; /* the first integer, and the last after it */
    op_ctx c;
} apply_args;

typedef dt_status (*apply_fn)(const apply_args *a, const dt_op_options *o, dt_tensor **t);

/* One C call per op, its attributes as the comments say. */
static dt_status run_matmul(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_matmul(a->ts[0], a->ts[1], o, t); /* code, flag: the transposes, in o */
}

static dt_status run_unary(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_unary((dt_unary_op)a->code, a->ts[0], o, t);
}

static dt_status run_binary(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_binary((dt_binary_op)a->code, a->ts[0], a->ts[1], o, t);
}

static dt_status run_reduce(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_reduce((dt_reduce_op)a->code, a->ts[0], a->atn[0], a->ints, a->flag, o, t);
}

static dt_status run_transpose(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_transpose(a->ts[0], a->ints, o, t);
}

static dt_status run_reshape(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_reshape(a->ts[0], a->atn[0], a->at[0], o, t);
}

static dt_status run_slice(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_slice(a->ts[0], a->at[0], a->at[1], o, t);
}

static dt_status run_concat(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_concat((int)a->n, a->ts, a->code, o, t);
}

static dt_status run_relayout(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_relayout(a->ts[0], &a->c.layout, o, t);
}

static dt_status run_copy_to_mesh(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_copy_to_mesh(a->ts[0], &a->c.layout, o, t);
}

static dt_status run_cast(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_cast(a->ts[0], (dt_dtype)a->code, o, t);
}

static dt_status run_where(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_where(a->ts[0], a->ts[1], a->ts[2], o, t);
}

/* code 0 softmax, 1 log_softmax with one axis; 2 logsumexp over the axes, flag keepdims */
static dt_status run_softmax(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return a->code == 2   ? dt_logsumexp(a->ts[0], a->atn[0], a->ints, a->flag, o, t)
           : a->code == 1 ? dt_log_softmax(a->ts[0], a->ints[0], o, t)
                          : dt_softmax(a->ts[0], a->ints[0], o, t);
}

/* code 0 layer_norm, 1 rms_norm; flag: 1 gamma, 2 beta follow x; epsilon */
static dt_status run_norm(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    const dt_tensor *gamma = (a->flag & 1) ? a->ts[1] : NULL;
    if (a->code == 1)
        return dt_rms_norm(a->ts[0], gamma, a->fl[0], o, t);
    return dt_layer_norm(a->ts[0], gamma, (a->flag & 2) ? a->ts[a->n - 1] : NULL, a->fl[0], o, t);
}

/* code 0 argmax, 1 argmin; [axis, index dtype] */
static dt_status run_arg_reduce(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return (a->code == 1 ? dt_argmin : dt_argmax)(a->ts[0], a->ints[0], (dt_dtype)a->ints[1], o, t);
}

/* code: the axis; flag 1 exclusive, 2 reverse */
static dt_status run_cumsum(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_cumsum(a->ts[0], a->code, a->flag & 1, a->flag & 2, o, t);
}

static dt_status run_gather(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_gather(a->ts[0], a->ts[1], o, t);
}

/* num_segments */
static dt_status run_unsorted_segment_sum(const apply_args *a, const dt_op_options *o,
                                          dt_tensor **t)
{
    return dt_unsorted_segment_sum(a->ts[0], a->ts[1], a->iv[0], o, t);
}

/* depth, axis, dtype; on, off */
static dt_status run_one_hot(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_one_hot(a->ts[0], a->iv[0], a->fl[0], a->fl[1], (int)a->iv[1], (dt_dtype)a->iv[2], o,
                      t);
}

/* code 0: of logits; 1: of probabilities (Keras's from_logits=False), the float: epsilon */
static dt_status run_sparse_xent(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    if (a->code == 1)
        return dt_sparse_categorical_crossentropy(a->ts[0], a->ts[1], a->fl[0], o, t);
    return dt_sparse_softmax_cross_entropy_with_logits(a->ts[0], a->ts[1], o, t);
}

static dt_status run_einsum(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_einsum(a->str, (int)a->n, a->ts, o, t);
}

/* axis */
static dt_status run_stack(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_stack((int)a->n, a->ts, (int)a->iv[0], o, t);
}

/* before, after; constant */
static dt_status run_pad(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_pad(a->ts[0], a->at[0], a->at[1], a->fl[0], o, t);
}

/* multiples */
static dt_status run_tile(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_tile(a->ts[0], a->at[0], o, t);
}

/* shape */
static dt_status run_broadcast_to(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_broadcast_to(a->ts[0], a->atn[0], a->at[0], o, t);
}

/* axis */
static dt_status run_expand_dims(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_expand_dims(a->ts[0], (int)a->iv[0], o, t);
}

/* axes (none: every extent-1 axis) */
static dt_status run_squeeze(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_squeeze(a->ts[0], a->atn[0], a->ints, o, t);
}

/* code: causal (1) or not; the float: the scale (<= 0: 1 / sqrt(E)) */
static dt_status run_attention(const apply_args *a, const dt_op_options *o, dt_tensor **t)
{
    return dt_attention(a->ts[0], a->ts[1], a->ts[2], a->code, a->fl[0], o, t);
}

enum {
    NEEDS_LAYOUT = 1,   /* the requested layout is the op's argument */
    TRANSPOSES = 2,     /* code and flag transpose a and b */
    WIDE_FIRST_INT = 4, /* the first integer is 64-bit (a depth, a number of segments) */
    INT_LIST = 8,       /* the first list holds axes or a perm: ints of the C call */
};

/* The ops apply runs, with the operands their C calls read: between lo and hi (concat and
 * stack take 1 to 64, einsum 1 or 2, norm x with gamma and beta as its flag says). */
typedef struct {
    const char *name;
    Py_ssize_t lo, hi;
    unsigned flags;
    apply_fn run;
} apply_op;

static const apply_op apply_ops[] = {
    {"matmul", 2, 2, TRANSPOSES, run_matmul},
    {"unary", 1, 1, 0, run_unary},
    {"binary", 2, 2, 0, run_binary},
    {"reduce", 1, 1, INT_LIST, run_reduce},
    {"transpose", 1, 1, INT_LIST, run_transpose},
    {"reshape", 1, 1, 0, run_reshape},
    {"slice", 1, 1, 0, run_slice},
    {"concat", 1, 64, 0, run_concat},
    {"relayout", 1, 1, NEEDS_LAYOUT, run_relayout},
    {"copy_to_mesh", 1, 1, NEEDS_LAYOUT, run_copy_to_mesh},
    {"cast", 1, 1, 0, run_cast},
    {"where", 3, 3, 0, run_where},
    /* row-wise ops */
    {"softmax", 1, 1, INT_LIST, run_softmax},
    {"norm", 1, 3, 0, run_norm},
    {"arg_reduce", 1, 1, INT_LIST, run_arg_reduce},
    {"cumsum", 1, 1, 0, run_cumsum},
    {"attention", 3, 3, 0, run_attention},
    {"sparse_xent", 2, 2, 0, run_sparse_xent},
    /* shape and index ops */
    {"gather", 2, 2, 0, run_gather},
    {"unsorted_segment_sum", 2, 2, WIDE_FIRST_INT, run_unsorted_segment_sum},
    {"one_hot", 1, 1, WIDE_FIRST_INT, run_one_hot},
    {"einsum", 1, 2, 0, run_einsum},
    {"stack", 1, 64, 0, run_stack},
    {"pad", 1, 1, 0, run_pad},
    {"tile", 1, 1, 0, run_tile},
    {"broadcast_to", 1, 1, 0, run_broadcast_to},
    {"expand_dims", 1, 1, 0, run_expand_dims},
    {"squeeze", 1, 1, INT_LIST, run_squeeze},
};

static const apply_op *find_op(const char *name)
{
    for (size_t i = 0; i < sizeof apply_ops / sizeof apply_ops[0]; i++)
        if (strcmp(name, apply_ops[i].name) == 0)
            return &apply_ops[i];
    return NULL;
}

/* The operands: as many tensor handles as the op takes. */
static int parse_operands(PyObject *ts_o, const apply_op *op, apply_args *a)
{
    a->n = dtpy_seq_size(ts_o);
    if (a->n < op->lo || a->n > op->hi) {
        if (!PyErr_Occurred()) {
            if (op->lo == op->hi)
                PyErr_Format(PyExc_ValueError, "%s: %zd operands, expected %zd", op->name, a->n,
                             op->lo);
            else
                PyErr_Format(PyExc_ValueError, "%s: %zd operands, expected %zd to %zd", op->name,
                             a->n, op->lo, op->hi);
        }
        return -1;
    }
    for (Py_ssize_t i = 0; i < a->n; i++) {
        PyObject *h = dtpy_seq_item(ts_o, i);
        a->ts[i] = h ? dtpy_unwrap(h, KIND_TENSOR) : NULL;
        Py_XDECREF(h);
        if (!a->ts[i])
            return -1;
    }
    a->rank = dt_tensor_rank(a->ts[0]);
    return 0;
}

/* An integer attribute (argument i of apply): an int of the C call, never truncated, or the
 * 64-bit first one of a WIDE_FIRST_INT op. */
static int parse_int_attr(PyObject *v, Py_ssize_t i, const apply_op *op, apply_args *a, int *niv)
{
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    bool wide = i == 5 && (op->flags & WIDE_FIRST_INT);
    if (overflow || (!wide && (x < INT_MIN || x > INT_MAX))) {
        PyObject *r = PyObject_Repr(v);
        PyErr_Format(PyExc_ValueError, "%s: integer attribute %zd is %s, outside %s", op->name,
                     i - 5, r ? PyUnicode_AsUTF8(r) : "?",
                     wide ? "64 bits" : "the range of a C int");
        Py_XDECREF(r);
        return -1;
    }
    if (i == 5)
        a->code = (int)x;
    else
        a->flag = (int)x;
    if (*niv < 4)
        a->iv[(*niv)++] = (int64_t)x;
    return 0;
}

/* The attributes, arguments 5 on. */
static int parse_attrs(PyObject *args, Py_ssize_t nargs, const apply_op *op, apply_args *a)
{
    int nfl = 0, niv = 0;
    for (Py_ssize_t i = 5, k = 0; i < nargs; i++) {
        PyObject *v = PyTuple_GET_ITEM(args, i);
        if (PyUnicode_Check(v)) {
            if (a->str) {
                PyErr_SetString(PyExc_TypeError, "too many string attributes");
                return -1;
            }
            if (!(a->str = PyUnicode_AsUTF8(v)))
                return -1;
        } else if (PyFloat_Check(v)) {
            if (nfl == 2) {
                PyErr_SetString(PyExc_TypeError, "too many float attributes");
                return -1;
            }
            a->fl[nfl++] = PyFloat_AsDouble(v);
        } else if (PySequence_Check(v)) {
            if (k == 2 || dtpy_parse_ints(v, DT_MAX_RANK, a->at[k], &a->atn[k]) < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "too many list attributes");
                return -1;
            }
            k++;
        } else if (parse_int_attr(v, i, op, a, &niv) < 0) {
            return -1;
        }
    }
    return 0;
}

static bool is(const apply_op *op, const char *name)
{
    return strcmp(op->name, name) == 0;
}

/* The attributes fit the op: the C calls read every list that names the axes whole, and the
 * row-wise ops' attributes as their codes say (run_softmax, run_norm, run_arg_reduce). */
static int check_attrs(const apply_op *op, apply_args *a)
{
    if (is(op, "transpose") && a->atn[0] != a->rank) {
        PyErr_Format(PyExc_ValueError, "transpose: perm has %d entries, the tensor rank %d",
                     a->atn[0], a->rank);
        return -1;
    }
    if (is(op, "slice") && (a->atn[0] != a->rank || a->atn[1] != a->rank)) {
        PyErr_Format(PyExc_ValueError,
                     "slice: begin has %d entries and size %d, the tensor rank %d", a->atn[0],
                     a->atn[1], a->rank);
        return -1;
    }
    int norm_parts = 1 + !!(a->flag & 1) + !!(a->flag & 2);
    if ((is(op, "softmax") && a->code < 2 && a->atn[0] != 1) ||
        (is(op, "norm") && a->n != norm_parts) || (is(op, "arg_reduce") && a->atn[0] != 2)) {
        PyErr_Format(PyExc_ValueError, "%s: attributes do not fit (%zd operands)", op->name, a->n);
        return -1;
    }
    if ((is(op, "pad") && (a->atn[0] != a->rank || a->atn[1] != a->rank)) ||
        (is(op, "tile") && a->atn[0] != a->rank)) {
        PyErr_Format(PyExc_ValueError, "%s: %d entries per list for a tensor of rank %d", op->name,
                     a->atn[0], a->rank);
        return -1;
    }
    if (is(op, "einsum") && !a->str) {
        PyErr_SetString(PyExc_TypeError, "einsum: no equation");
        return -1;
    }
    for (int i = 0; (op->flags & INT_LIST) && i < a->atn[0]; i++)
        if (a->at[0][i] < INT_MIN || a->at[0][i] > INT_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "%s: list entry %d is %lld, outside the range of a C int", op->name, i,
                         (long long)a->at[0][i]);
            return -1;
        }
    for (int i = 0; i < a->atn[0]; i++)
        a->ints[i] = (int)a->at[0][i];
    return 0;
}

static PyObject *py_apply(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t nargs = PyTuple_Size(args);
    if (nargs < 5) {
        PyErr_SetString(PyExc_TypeError, "apply(op, tensors, mesh, layout, program, *attrs)");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, 0));
    PyObject *ts_o = PyTuple_GET_ITEM(args, 1), *mesh_o = PyTuple_GET_ITEM(args, 2);
    PyObject *text_o = PyTuple_GET_ITEM(args, 3);
    int program = PyObject_IsTrue(PyTuple_GET_ITEM(args, 4));
    const char *text = text_o == Py_None ? NULL : PyUnicode_AsUTF8(text_o);
    if (!name || (text_o != Py_None && !text))
        return NULL;
    const apply_op *op = find_op(name);
    if (!op || ((op->flags & NEEDS_LAYOUT) && !text)) {
        PyErr_Format(PyExc_ValueError, op ? "%s needs a layout" : "unknown op %s", name);
        return NULL;
    }
    apply_args a = {0};
    if (parse_operands(ts_o, op, &a) < 0 || parse_attrs(args, nargs, op, &a) < 0 ||
        check_attrs(op, &a) < 0 || dtpy_ctx_open(&a.c, mesh_o, text, program) < 0)
        return NULL;
    bool transposes = op->flags & TRANSPOSES;
    dt_op_options o = dtpy_ctx_options(&a.c, transposes ? a.code : 0, transposes ? a.flag : 0);
    dt_tensor *t = NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = op->run(&a, &o, &t);
    Py_END_ALLOW_THREADS;
    return dtpy_ctx_close(&a.c, s, t);
}

PyMethodDef dtpy_ops_methods[] = {
    {"create", py_create, METH_VARARGS, "Creation ops (fill, arange, random). Collective."},
    {"apply", py_apply, METH_VARARGS, "Ops on tensors. Collective."},
    {NULL, NULL, 0, NULL},
};
