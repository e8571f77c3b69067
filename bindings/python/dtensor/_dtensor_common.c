/* dtensor._dtensor: what the C files of the extension share (_dtensor.h): exceptions of a
 * status, handles and their argument converters, sequences and the context of an op. */
#include "_dtensor.h"

PyObject *dtpy_error;
PyObject *dtpy_error_classes;

PyObject *dtpy_raise(dt_status s)
{
    PyObject *cls =
        dtpy_error_classes ? PyDict_GetItemString(dtpy_error_classes, dt_status_name(s)) : NULL;
    if (!cls)
        cls = dtpy_error;
    PyObject *args = Py_BuildValue("(s)", dt_last_error());
    PyObject *exc = args ? PyObject_Call(cls, args, NULL) : NULL;
    Py_XDECREF(args);
    if (!exc)
        return NULL;
    PyObject *name = PyUnicode_FromString(dt_status_name(s));
    PyObject *code = PyLong_FromLong((long)s);
    if (name && code) {
        PyObject_SetAttrString(exc, "status", name);
        PyObject_SetAttrString(exc, "code", code);
    }
    Py_XDECREF(name);
    Py_XDECREF(code);
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

/* ---- Handle: an owned dt_mesh or dt_tensor ----------------------------------------------- */

static void free_object(int kind, void *ptr)
{
    switch (kind) {
    case KIND_MESH:
        dt_mesh_free(ptr);
        break;
    case KIND_TENSOR:
        dt_tensor_free(ptr);
        break;
    case KIND_FUNCTION:
        dt_function_free(ptr);
        break;
    case KIND_VARIABLE:
        dt_variable_free(ptr);
        break;
    case KIND_STRATEGY:
        dt_strategy_free(ptr);
        break;
    case KIND_MODEL:
        dt_model_free(ptr);
        break;
    case KIND_OPTIMIZER:
        dt_optimizer_free(ptr);
        break;
    case KIND_COORDINATOR:
        /* Collective; the Python layer shuts coordinators down explicitly. */
        dt_ps_coordinator_shutdown(ptr);
        break;
    case KIND_REMOTE:
        dt_remote_value_free(ptr);
        break;
    case KIND_PS_VARIABLE: /* collective: the Python layer frees them in program order */
        dt_ps_variable_free(ptr);
        break;
    case KIND_GENERATOR:
        dt_generator_free(ptr);
        break;
    default:
        break;
    }
}

static const char *const kind_names[] = {"mesh",         "tensor", "function",    "variable",
                                         "strategy",     "model",  "optimizer",   "coordinator",
                                         "remote value", "mesh",   "ps variable", "generator"};

void dtpy_handle_release(Handle *h)
{
    /* After dt_finalize the runtime is gone; dt_finalize refuses while objects live, so a
     * handle still set then belongs to a runtime that was never stopped. */
    if (!h->ptr || !dt_is_initialized())
        return;
    if (h->exports) { /* DLPack consumers still read its memory: free when they are done */
        h->free_pending = 1;
        return;
    }
    free_object(h->kind, h->ptr);
    h->ptr = NULL;
    h->free_pending = 0;
}

static void handle_dealloc(Handle *h)
{
    dtpy_handle_release(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *handle_free(Handle *h, PyObject *unused)
{
    (void)unused;
    dtpy_handle_release(h);
    Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"free", (PyCFunction)handle_free, METH_NOARGS, "Release the object now (idempotent)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject dtpy_handle_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtensor._dtensor.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
    .tp_doc = "An owned dt_mesh or dt_tensor.",
};

PyObject *dtpy_wrap(int kind, void *ptr)
{
    Handle *h = PyObject_New(Handle, &dtpy_handle_type);
    if (!h) {
        free_object(kind, ptr);
        return NULL;
    }
    h->kind = kind;
    h->ptr = ptr;
    h->exports = 0;
    h->free_pending = 0;
    return (PyObject *)h;
}

void *dtpy_unwrap(PyObject *o, int kind)
{
    int have = PyObject_TypeCheck(o, &dtpy_handle_type) ? ((Handle *)o)->kind : -1;
    if (have == KIND_BORROWED_MESH && kind == KIND_MESH)
        have = KIND_MESH;
    if (have != kind) {
        PyErr_Format(PyExc_TypeError, "expected a %s handle", kind_names[kind]);
        return NULL;
    }
    if (!((Handle *)o)->ptr || ((Handle *)o)->free_pending) {
        PyErr_SetString(PyExc_ValueError, "the object was already freed");
        return NULL;
    }
    return ((Handle *)o)->ptr;
}

PyObject *dtpy_borrowed_mesh(const dt_mesh *m)
{
    Handle *h = PyObject_New(Handle, &dtpy_handle_type);
    if (!h)
        return NULL;
    h->kind = KIND_BORROWED_MESH;
    h->ptr = (void *)m;
    h->exports = 0;
    h->free_pending = 0;
    return (PyObject *)h;
}

/* The converters of _dtensor.h: a handle of the kind, checked, as its C pointer. */
#define CONVERTER(name, type, kind)            \
    int dtpy_to_##name(PyObject *o, void *out) \
    {                                          \
        type *p = dtpy_unwrap(o, kind);        \
        *(type **)out = p;                     \
        return p != NULL;                      \
    }
CONVERTER(mesh, dt_mesh, KIND_MESH)
CONVERTER(tensor, dt_tensor, KIND_TENSOR)
CONVERTER(function, dt_function, KIND_FUNCTION)
CONVERTER(variable, dt_variable, KIND_VARIABLE)
CONVERTER(strategy, dt_strategy, KIND_STRATEGY)
CONVERTER(model, dt_model, KIND_MODEL)
CONVERTER(optimizer, dt_optimizer, KIND_OPTIMIZER)
CONVERTER(coordinator, dt_ps_coordinator, KIND_COORDINATOR)
CONVERTER(remote, dt_remote_value, KIND_REMOTE)
CONVERTER(ps_variable, dt_ps_variable, KIND_PS_VARIABLE)
CONVERTER(generator, dt_generator, KIND_GENERATOR)
#undef CONVERTER

/* ---- sequences ------------------------------------------------------------------------- */

/* An argument error from reading a sequence argument: what the object itself raised when that
 * is TypeError, ValueError, OverflowError or MemoryError, otherwise (a buffer of several
 * dimensions raises NotImplementedError, a broken __getitem__ anything) a TypeError naming
 * the object's type, so that every bad argument raises TypeError or ValueError. */
static void sequence_error(PyObject *o)
{
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError) ||
        PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_OverflowError) ||
        PyErr_ExceptionMatches(PyExc_MemoryError))
        return;
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "expected a list or tuple, got %.80s", Py_TYPE(o)->tp_name);
}

Py_ssize_t dtpy_seq_size(PyObject *o)
{
    Py_ssize_t n = PySequence_Size(o);
    if (n < 0)
        sequence_error(o);
    return n;
}

PyObject *dtpy_seq_item(PyObject *o, Py_ssize_t i)
{
    PyObject *v = PySequence_GetItem(o, i);
    if (!v)
        sequence_error(o);
    return v;
}

int dtpy_parse_ints(PyObject *o, int max, int64_t out[], int *n)
{
    Py_ssize_t len = dtpy_seq_size(o);
    if (len < 0 || len > max) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd values, at most %d", len, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *v = dtpy_seq_item(o, i);
        out[i] = v ? PyLong_AsLongLong(v) : -1;
        Py_XDECREF(v);
        if (PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) { /* an argument error */
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "entry %zd of the list does not fit in 64 bits", i);
            }
            return -1;
        }
    }
    *n = (int)len;
    return 0;
}

int dtpy_parse_layout(PyObject *mesh_o, const char *text, dt_layout *out)
{
    const dt_mesh *m = dtpy_unwrap(mesh_o, KIND_MESH);
    if (!m)
        return -1;
    dt_status s = dt_layout_parse(m, text, out);
    if (s != DT_OK) {
        dtpy_raise(s);
        return -1;
    }
    return 0;
}

int dtpy_parse_shape(PyObject *o, int rank, int64_t shape[])
{
    int n;
    if (dtpy_parse_ints(o, DT_MAX_RANK, shape, &n) < 0)
        return -1;
    if (n != rank) {
        PyErr_Format(PyExc_ValueError, "shape has %d axes, the layout %d", n, rank);
        return -1;
    }
    return 0;
}

int dtpy_collect_tensors(PyObject *seq, const dt_tensor **out, int max, int *n)
{
    Py_ssize_t len = dtpy_seq_size(seq);
    if (len < 0 || len > max) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd tensors, at most %d", len, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *h = dtpy_seq_item(seq, i);
        out[i] = h ? dtpy_unwrap(h, KIND_TENSOR) : NULL;
        Py_XDECREF(h);
        if (!out[i])
            return -1;
    }
    *n = (int)len;
    return 0;
}

/* ---- the context of an op -------------------------------------------------------------- */

int dtpy_ctx_open(op_ctx *c, PyObject *mesh_o, const char *text, int program)
{
    memset(c, 0, sizeof *c);
    if (mesh_o != Py_None && text) {
        if (dtpy_parse_layout(mesh_o, text, &c->layout) < 0)
            return -1;
        c->given = true;
    }
    if (program) {
        c->f = open_memstream(&c->text, &c->len);
        if (!c->f) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

dt_op_options dtpy_ctx_options(const op_ctx *c, int ta, int tb)
{
    return (dt_op_options){.layout = c->given ? &c->layout : NULL,
                           .transpose_a = ta,
                           .transpose_b = tb,
                           .program = c->f};
}

PyObject *dtpy_ctx_close(op_ctx *c, dt_status s, dt_tensor *t)
{
    if (c->f)
        fclose(c->f);
    PyObject *r = s == DT_OK ? dtpy_wrap(KIND_TENSOR, t) : dtpy_raise(s);
    if (r && c->f) {
        PyObject *text = PyUnicode_FromStringAndSize(c->text ? c->text : "", (Py_ssize_t)c->len);
        r = text ? Py_BuildValue("(NN)", r, text) : NULL;
    }
    free(c->text);
    return r;
}
