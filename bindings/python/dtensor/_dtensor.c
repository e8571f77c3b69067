/* dtensor._dtensor: the thin CPython layer under the `dtensor` package. It holds meshes and
 * tensors as Handle objects and moves data through the buffer protocol with no copies beyond
 * the one into or out of device memory. Everything Pythonic lives in dtensor/__init__.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dtensor.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

static PyObject *DTensorError;
/* "DT_ERR_..." -> the exception class raised for that status (TensorFlow's error classes, all
 * subclasses of DTensorError); the package fills it, a status missing from it raises
 * DTensorError itself. */
static PyObject *error_classes;

/* Raise the status's class (DTensorError or a subclass) with the message, .status =
 * "DT_ERR_..." and .code = int. */
static PyObject *raise_status(dt_status s)
{
    PyObject *cls = error_classes ? PyDict_GetItemString(error_classes, dt_status_name(s)) : NULL;
    if (!cls)
        cls = DTensorError;
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

/* Run a dtensor call without the GIL (collectives wait on other clients) and raise on
 * failure. */
#define CALL(expr)                   \
    do {                             \
        dt_status s_;                \
        Py_BEGIN_ALLOW_THREADS;      \
        s_ = (expr);                 \
        Py_END_ALLOW_THREADS;        \
        if (s_ != DT_OK)             \
            return raise_status(s_); \
    } while (0)

/* ---- Handle: an owned dt_mesh or dt_tensor ----------------------------------------------- */

enum {
    KIND_MESH,
    KIND_TENSOR,
    KIND_FUNCTION,
    KIND_VARIABLE,
    KIND_STRATEGY,
    KIND_MODEL,
    KIND_OPTIMIZER,
    KIND_COORDINATOR,
    KIND_REMOTE,
    KIND_BORROWED_MESH, /* a strategy's mesh: freed with the strategy */
    KIND_PS_VARIABLE,
    KIND_GENERATOR,
};

typedef struct {
    PyObject_HEAD int kind;
    void *ptr;
    /* a tensor's components lent through DLPack: free() waits for the last one back */
    int exports;
    int free_pending;
} Handle;

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

static void handle_release(Handle *h)
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
    handle_release(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *handle_free(Handle *h, PyObject *unused)
{
    (void)unused;
    handle_release(h);
    Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"free", (PyCFunction)handle_free, METH_NOARGS, "Release the object now (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dtensor._dtensor.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
    .tp_doc = "An owned dt_mesh or dt_tensor.",
};

static PyObject *wrap(int kind, void *ptr)
{
    Handle *h = PyObject_New(Handle, &HandleType);
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

static void *unwrap(PyObject *o, int kind)
{
    int have = PyObject_TypeCheck(o, &HandleType) ? ((Handle *)o)->kind : -1;
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

static Py_ssize_t seq_size(PyObject *o)
{
    Py_ssize_t n = PySequence_Size(o);
    if (n < 0)
        sequence_error(o);
    return n;
}

static PyObject *seq_item(PyObject *o, Py_ssize_t i)
{
    PyObject *v = PySequence_GetItem(o, i);
    if (!v)
        sequence_error(o);
    return v;
}

/* ---- runtime ----------------------------------------------------------------------------- */

static PyObject *py_init(PyObject *self, PyObject *args)
{
    (void)self;
    int cpu_devices = 0, bind = 0;
    if (!PyArg_ParseTuple(args, "|ii", &cpu_devices, &bind))
        return NULL;
    dt_init_options opts = {.cpu_devices = cpu_devices, .bind = bind};
    CALL(dt_init(&opts));
    Py_RETURN_NONE;
}

static PyObject *py_finalize(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    CALL(dt_finalize());
    Py_RETURN_NONE;
}

static PyObject *py_runtime_info(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue(
        "{s:O,s:i,s:i,s:i,s:i,s:i,s:i}", "initialized", dt_is_initialized() ? Py_True : Py_False,
        "client_id", dt_client_id(), "num_clients", dt_num_clients(), "local_cpu",
        dt_num_local_devices(DT_DEVICE_CPU), "global_cpu", dt_num_global_devices(DT_DEVICE_CPU),
        "local_cuda", dt_num_local_devices(DT_DEVICE_CUDA), "global_cuda",
        dt_num_global_devices(DT_DEVICE_CUDA));
}

static PyObject *py_global_device_id(PyObject *self, PyObject *args)
{
    (void)self;
    int type, i;
    if (!PyArg_ParseTuple(args, "ii", &type, &i))
        return NULL;
    return PyLong_FromLong(dt_global_device_id((dt_device_type)type, i));
}

static PyObject *py_barrier(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    CALL(dt_barrier());
    Py_RETURN_NONE;
}

static PyObject *py_client_allgather(PyObject *self, PyObject *arg)
{
    (void)self;
    char *send;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &send, &n) < 0)
        return NULL;
    int clients = dt_num_clients();
    PyObject *all = PyBytes_FromStringAndSize(NULL, n * clients);
    if (!all)
        return NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = dt_client_allgather(send, (size_t)n, PyBytes_AS_STRING(all));
    Py_END_ALLOW_THREADS;
    if (s != DT_OK) {
        Py_DECREF(all);
        return raise_status(s);
    }
    PyObject *out = PyList_New(clients);
    for (int c = 0; out && c < clients; c++) {
        PyObject *one = PyBytes_FromStringAndSize(PyBytes_AS_STRING(all) + c * n, n);
        if (!one) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, c, one);
    }
    Py_DECREF(all);
    return out;
}

static PyObject *py_devices_report(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return PyErr_NoMemory();
    dt_status s = dt_devices_print(f);
    fclose(f);
    if (s != DT_OK) {
        free(text);
        return raise_status(s);
    }
    PyObject *r = PyUnicode_FromStringAndSize(text, (Py_ssize_t)len);
    free(text);
    return r;
}

/* ---- mesh -------------------------------------------------------------------------------- */

/* Axis names and sizes of a mesh from two Python sequences; the names stay valid while the
 * references in keep[] (released by the caller, n of them) live. -1 with an exception set. */
static Py_ssize_t parse_axes(PyObject *names_o, PyObject *sizes_o, const char *names[], int sizes[],
                             PyObject *keep[])
{
    Py_ssize_t n = seq_size(names_o);
    if (n < 0 || seq_size(sizes_o) != n || n > DT_MAX_MESH_AXES) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mesh: %zd names and %zd sizes (at most %d axes)", n,
                         seq_size(sizes_o), DT_MAX_MESH_AXES);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        keep[i] = seq_item(names_o, i);
        PyObject *size = seq_item(sizes_o, i);
        Py_ssize_t len = 0;
        names[i] = keep[i] ? PyUnicode_AsUTF8AndSize(keep[i], &len) : NULL;
        long v = size ? PyLong_AsLong(size) : -1;
        Py_XDECREF(size);
        if (names[i] && (size_t)len != strlen(names[i]) && !PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mesh axis name %R contains a NUL character", keep[i]);
        if (!names[i] || PyErr_Occurred()) {
            for (Py_ssize_t j = 0; j <= i; j++)
                Py_CLEAR(keep[j]);
            return -1;
        }
        sizes[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int)v;
    }
    return n;
}

static PyObject *py_mesh_create(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *names_o, *sizes_o, *ids_o = Py_None;
    int type;
    if (!PyArg_ParseTuple(args, "OOi|O", &names_o, &sizes_o, &type, &ids_o))
        return NULL;
    const char *names[DT_MAX_MESH_AXES];
    int sizes[DT_MAX_MESH_AXES];
    PyObject *keep[DT_MAX_MESH_AXES] = {0};
    Py_ssize_t n = parse_axes(names_o, sizes_o, names, sizes, keep);
    if (n < 0)
        return NULL;
    PyObject *result = NULL;
    /* ids: the global device ids of a mesh over a subset of the devices (None: all) */
    Py_ssize_t num_ids = ids_o == Py_None ? -1 : seq_size(ids_o);
    int *ids = num_ids > 0 ? PyMem_Calloc((size_t)num_ids, sizeof *ids) : NULL;
    if (ids_o != Py_None && (num_ids < 1 || num_ids > INT32_MAX || !ids)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mesh: %zd device ids", num_ids);
        goto done;
    }
    for (Py_ssize_t i = 0; i < num_ids; i++) {
        PyObject *id = seq_item(ids_o, i);
        long v = id ? PyLong_AsLong(id) : -1;
        Py_XDECREF(id);
        if (PyErr_Occurred())
            goto done;
        ids[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int)v;
    }
    dt_mesh *m = NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = ids ? dt_mesh_create_on_devices((int)n, names, sizes, (dt_device_type)type, (int)num_ids,
                                        ids, &m)
            : dt_mesh_create((int)n, names, sizes, (dt_device_type)type, &m);
    Py_END_ALLOW_THREADS;
    if (s != DT_OK) {
        raise_status(s);
        goto done;
    }
    result = wrap(KIND_MESH, m);
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(keep[i]);
    PyMem_Free(ids);
    return result;
}

/* mesh_create_local(names, sizes, type, first_local): a mesh over this client's devices only. */
static PyObject *py_mesh_create_local(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *names_o, *sizes_o;
    int type, first;
    if (!PyArg_ParseTuple(args, "OOii", &names_o, &sizes_o, &type, &first))
        return NULL;
    const char *names[DT_MAX_MESH_AXES];
    int sizes[DT_MAX_MESH_AXES];
    PyObject *keep[DT_MAX_MESH_AXES] = {0};
    Py_ssize_t n = parse_axes(names_o, sizes_o, names, sizes, keep);
    if (n < 0)
        return NULL;
    PyObject *result = NULL;
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_local((int)n, names, sizes, (dt_device_type)type, first, &m);
    if (s != DT_OK) {
        raise_status(s);
        goto done;
    }
    result = wrap(KIND_MESH, m);
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(keep[i]);
    return result;
}

static PyObject *py_mesh_info(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_mesh *m = unwrap(arg, KIND_MESH);
    if (!m)
        return NULL;
    int n = dt_mesh_num_axes(m), nl = dt_mesh_num_local_devices(m), size = dt_mesh_size(m);
    PyObject *names = PyList_New(n), *sizes = PyList_New(n), *local = PyList_New(nl);
    PyObject *ids = PyList_New(size);
    if (!names || !sizes || !local || !ids)
        goto fail;
    for (int d = 0; d < size; d++)
        PyList_SET_ITEM(ids, d, PyLong_FromLong(dt_mesh_global_device_id(m, d)));
    for (int a = 0; a < n; a++) {
        PyList_SET_ITEM(names, a, PyUnicode_FromString(dt_mesh_axis_name(m, a)));
        PyList_SET_ITEM(sizes, a, PyLong_FromLong(dt_mesh_axis_size(m, a)));
    }
    for (int i = 0; i < nl; i++)
        PyList_SET_ITEM(local, i, PyLong_FromLong(dt_mesh_local_device_id(m, i)));
    return Py_BuildValue("{s:N,s:N,s:N,s:N,s:i,s:s}", "names", names, "sizes", sizes, "local_ids",
                         local, "device_ids", ids, "size", size, "device_type",
                         dt_device_type_name(dt_mesh_device_type(m)));
fail:
    Py_XDECREF(names);
    Py_XDECREF(sizes);
    Py_XDECREF(local);
    Py_XDECREF(ids);
    return NULL;
}

/* ---- layouts ----------------------------------------------------------------------------- */

static int parse_layout(PyObject *mesh_o, const char *text, dt_layout *out)
{
    const dt_mesh *m = unwrap(mesh_o, KIND_MESH);
    if (!m)
        return -1;
    dt_status s = dt_layout_parse(m, text, out);
    if (s != DT_OK) {
        raise_status(s);
        return -1;
    }
    return 0;
}

static int parse_ints(PyObject *o, int max, int64_t out[], int *n);

/* A shape of exactly `rank` extents. */
static int parse_shape(PyObject *o, int rank, int64_t shape[])
{
    int n;
    if (parse_ints(o, DT_MAX_RANK, shape, &n) < 0)
        return -1;
    if (n != rank) {
        PyErr_Format(PyExc_ValueError, "shape has %d axes, the layout %d", n, rank);
        return -1;
    }
    return 0;
}

/* Canonical text of a layout, checked: ("x,unsharded", rank). */
static PyObject *py_layout_check(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o;
    const char *text;
    if (!PyArg_ParseTuple(args, "Os", &mesh_o, &text))
        return NULL;
    dt_layout l;
    if (parse_layout(mesh_o, text, &l) < 0)
        return NULL;
    char buf[DT_STRING_MAX];
    CALL(dt_layout_to_string(&l, buf, sizeof buf));
    return Py_BuildValue("(si)", buf, l.rank);
}

/* Local shape and offset of a global device's shard. */
static PyObject *py_layout_local_shape(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o;
    const char *text;
    int device;
    if (!PyArg_ParseTuple(args, "OsOi", &mesh_o, &text, &shape_o, &device))
        return NULL;
    dt_layout l;
    if (parse_layout(mesh_o, text, &l) < 0)
        return NULL;
    int64_t shape[DT_MAX_RANK], local[DT_MAX_RANK], off[DT_MAX_RANK];
    if (parse_shape(shape_o, l.rank, shape) < 0)
        return NULL;
    CALL(dt_layout_local_shape(&l, shape, device, local, off));
    PyObject *ls = PyTuple_New(l.rank), *os = PyTuple_New(l.rank);
    if (!ls || !os) {
        Py_XDECREF(ls);
        Py_XDECREF(os);
        return NULL;
    }
    for (int i = 0; i < l.rank; i++) {
        PyTuple_SET_ITEM(ls, i, PyLong_FromLongLong(local[i]));
        PyTuple_SET_ITEM(os, i, PyLong_FromLongLong(off[i]));
    }
    return Py_BuildValue("(NN)", ls, os);
}

/* ---- tensors ----------------------------------------------------------------------------- */

/* from_host(mesh, layout_text, dtype, shape, buffer) */
static PyObject *py_tensor_from_host(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o;
    const char *text;
    int dtype;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "OsiOy*", &mesh_o, &text, &dtype, &shape_o, &buf))
        return NULL;
    PyObject *result = NULL;
    dt_layout l;
    int64_t shape[DT_MAX_RANK];
    if (parse_layout(mesh_o, text, &l) == 0 && parse_shape(shape_o, l.rank, shape) == 0) {
        dt_tensor *t = NULL;
        dt_status s;
        Py_BEGIN_ALLOW_THREADS;
        s = dt_tensor_from_host(&l, (dt_dtype)dtype, l.rank, shape, buf.buf, (size_t)buf.len, &t);
        Py_END_ALLOW_THREADS;
        result = s == DT_OK ? wrap(KIND_TENSOR, t) : raise_status(s);
    }
    PyBuffer_Release(&buf);
    return result;
}

/* pack(mesh, layout_text, dtype, shape, [buffers], [shapes]) */
static PyObject *py_tensor_pack(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o, *bufs_o, *shapes_o;
    const char *text;
    int dtype;
    if (!PyArg_ParseTuple(args, "OsiOOO", &mesh_o, &text, &dtype, &shape_o, &bufs_o, &shapes_o))
        return NULL;
    dt_layout l;
    int64_t shape[DT_MAX_RANK];
    if (parse_layout(mesh_o, text, &l) < 0 || parse_shape(shape_o, l.rank, shape) < 0)
        return NULL;
    Py_ssize_t n = seq_size(bufs_o);
    if (n < 0 || seq_size(shapes_o) != n) {
        PyErr_SetString(PyExc_ValueError, "pack: components and shapes differ in length");
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc((size_t)n + 1, sizeof *views);
    const void **data = PyMem_Calloc((size_t)n + 1, sizeof *data);
    int64_t *shapes = PyMem_Calloc((size_t)(n + 1) * DT_MAX_RANK, sizeof *shapes);
    const int64_t **shape_ptrs = PyMem_Calloc((size_t)n + 1, sizeof *shape_ptrs);
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    if (!views || !data || !shapes || !shape_ptrs) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        PyObject *b = seq_item(bufs_o, got), *sh = seq_item(shapes_o, got);
        int ok = b && sh && PyObject_GetBuffer(b, &views[got], PyBUF_C_CONTIGUOUS) == 0;
        if (ok && parse_shape(sh, l.rank, shapes + got * DT_MAX_RANK) < 0) {
            PyBuffer_Release(&views[got]);
            ok = 0;
        }
        Py_XDECREF(b);
        Py_XDECREF(sh);
        if (!ok)
            goto done;
        data[got] = views[got].buf;
        shape_ptrs[got] = shapes + got * DT_MAX_RANK;
    }
    dt_tensor *t = NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = dt_tensor_pack(&l, (dt_dtype)dtype, l.rank, shape, (int)n, data, shape_ptrs, &t);
    Py_END_ALLOW_THREADS;
    result = s == DT_OK ? wrap(KIND_TENSOR, t) : raise_status(s);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(data);
    PyMem_Free(shapes);
    PyMem_Free(shape_ptrs);
    return result;
}

static PyObject *py_tensor_info(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_tensor *t = unwrap(arg, KIND_TENSOR);
    if (!t)
        return NULL;
    char text[DT_STRING_MAX];
    CALL(dt_layout_to_string(dt_tensor_layout(t), text, sizeof text));
    int rank = dt_tensor_rank(t), nl = dt_mesh_num_local_devices(dt_tensor_mesh(t));
    PyObject *shape = PyTuple_New(rank), *locals = PyList_New(nl);
    if (!shape || !locals)
        goto fail;
    for (int i = 0; i < rank; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(dt_tensor_shape(t)[i]));
    for (int d = 0; d < nl; d++) {
        int64_t local[DT_MAX_RANK];
        if (dt_tensor_local_shape(t, d, local) != DT_OK) {
            /* A symbolic tensor (recorded in a function being traced) holds no shards. */
            Py_DECREF(locals);
            locals = Py_None;
            Py_INCREF(locals);
            break;
        }
        PyObject *ls = PyTuple_New(rank);
        if (!ls)
            goto fail;
        for (int i = 0; i < rank; i++)
            PyTuple_SET_ITEM(ls, i, PyLong_FromLongLong(local[i]));
        PyList_SET_ITEM(locals, d, ls);
    }
    return Py_BuildValue("{s:i,s:N,s:s,s:N}", "dtype", (int)dt_tensor_dtype(t), "shape", shape,
                         "layout", text, "local_shapes", locals);
fail:
    Py_XDECREF(shape);
    Py_XDECREF(locals);
    return NULL;
}

/* tensor_meta(t) -> (dtype, shape, layout text): what wrapping a result needs, cheaply. */
static PyObject *py_tensor_meta(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_tensor *t = unwrap(arg, KIND_TENSOR);
    if (!t)
        return NULL;
    char text[DT_STRING_MAX];
    CALL(dt_layout_to_string(dt_tensor_layout(t), text, sizeof text));
    int rank = dt_tensor_rank(t);
    PyObject *shape = PyTuple_New(rank);
    if (!shape)
        return NULL;
    for (int i = 0; i < rank; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(dt_tensor_shape(t)[i]));
    return Py_BuildValue("(iNs)", (int)dt_tensor_dtype(t), shape, text);
}

/* tensor_to_host(tensor or variable, i, writable buffer): local device i's component (i >= 0),
 * or the global array gathered from every client (i == -1, collective). A variable's
 * component is read in place (no op runs), as a replica reads its copy of a variable. */
static PyObject *py_tensor_to_host(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t_o;
    int i;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "Oiw*", &t_o, &i, &buf))
        return NULL;
    bool variable = PyObject_TypeCheck(t_o, &HandleType) && ((Handle *)t_o)->kind == KIND_VARIABLE;
    const dt_variable *v = variable ? unwrap(t_o, KIND_VARIABLE) : NULL;
    const dt_tensor *t = variable ? (v ? dt_variable_value(v) : NULL) : unwrap(t_o, KIND_TENSOR);
    dt_status s = DT_OK;
    if (t) {
        Py_BEGIN_ALLOW_THREADS;
        s = i < 0 ? dt_tensor_read(t, buf.buf, (size_t)buf.len)
                  : dt_tensor_unpack(t, i, buf.buf, (size_t)buf.len);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&buf);
    if (!t)
        return NULL;
    if (s != DT_OK)
        return raise_status(s);
    Py_RETURN_NONE;
}

static PyObject *py_print_ordered(PyObject *self, PyObject *args)
{
    (void)self;
    const char *text;
    if (!PyArg_ParseTuple(args, "s", &text))
        return NULL;
    fflush(stdout);
    CALL(dt_print_ordered(stdout, text));
    Py_RETURN_NONE;
}

/* ---- DLPack: components lent and borrowed without a copy ---------------------------------- */

/* The DLPack ABI (dlpack.h, version 0.8 "dltensor" capsules), written from its specification. */
typedef struct {
    int32_t device_type; /* 1 CPU, 2 CUDA */
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code; /* 0 int, 1 uint, 2 float */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

enum { DL_CPU = 1, DL_CUDA = 2 };

/* DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool. */
static int dl_dtype(dt_dtype t, DLDataType *out)
{
    static const DLDataType codes[DT_DTYPE_COUNT] = {
        [DT_DTYPE_F32] = {2, 32, 1}, [DT_DTYPE_F64] = {2, 64, 1},  [DT_DTYPE_I32] = {0, 32, 1},
        [DT_DTYPE_I64] = {0, 64, 1}, [DT_DTYPE_BF16] = {4, 16, 1}, [DT_DTYPE_F16] = {2, 16, 1},
        [DT_DTYPE_BOOL] = {6, 8, 1}, [DT_DTYPE_U8] = {1, 8, 1},    [DT_DTYPE_I8] = {0, 8, 1},
    };
    if ((unsigned)t >= DT_DTYPE_COUNT)
        return -1;
    *out = codes[t];
    return 0;
}

/* What an exported component keeps: the DTensor's handle (its free waits) and the shape. */
typedef struct {
    DLManagedTensor managed;
    Handle *owner;
    int64_t shape[DT_MAX_RANK];
} export_ctx;

static void export_deleter(DLManagedTensor *m)
{
    export_ctx *e = (export_ctx *)m;
    PyGILState_STATE g = PyGILState_Ensure();
    Handle *h = e->owner;
    if (--h->exports == 0 && h->free_pending)
        handle_release(h);
    Py_DECREF(h);
    PyMem_Free(e);
    PyGILState_Release(g);
}

static void export_capsule_destructor(PyObject *cap)
{
    /* a capsule no consumer took ("used_dltensor" once taken) still owns its tensor */
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}

/* tensor_dlpack(tensor, i): local device i's component as a "dltensor" capsule, no copy. */
static PyObject *py_tensor_dlpack(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t_o;
    int i;
    if (!PyArg_ParseTuple(args, "Oi", &t_o, &i))
        return NULL;
    const dt_tensor *t = unwrap(t_o, KIND_TENSOR);
    if (!t)
        return NULL;
    dt_local_buffer b;
    int64_t local[DT_MAX_RANK];
    CALL(dt_tensor_local_buffer(t, i, &b));
    CALL(dt_tensor_wait(t)); /* GPU: the values are computed before another library reads */
    CALL(dt_tensor_local_shape(t, i, local));
    export_ctx *e = PyMem_Calloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    DLManagedTensor *m = &e->managed;
    if (dl_dtype(dt_tensor_dtype(t), &m->dl_tensor.dtype) < 0) {
        PyMem_Free(e);
        PyErr_Format(PyExc_TypeError, "DLPack: dtype %s has no DLPack code",
                     dt_dtype_name(dt_tensor_dtype(t)));
        return NULL;
    }
    int rank = dt_tensor_rank(t);
    memcpy(e->shape, local, sizeof(int64_t) * (size_t)rank);
    m->dl_tensor.data = b.data;
    m->dl_tensor.device = (DLDevice){b.type == DT_DEVICE_CUDA ? DL_CUDA : DL_CPU, b.device_ordinal};
    m->dl_tensor.ndim = rank;
    m->dl_tensor.shape = e->shape;
    m->manager_ctx = e;
    m->deleter = export_deleter;
    e->owner = (Handle *)t_o;
    PyObject *cap = PyCapsule_New(m, "dltensor", export_capsule_destructor);
    if (!cap) {
        PyMem_Free(e);
        return NULL;
    }
    Py_INCREF(t_o);
    e->owner->exports++;
    return cap;
}

/* mesh_stream(mesh, i): the CUDA stream of the mesh's local device i as an integer (0 for CPU
 * devices and emulated GPUs): what a DLPack producer is asked to order its work before. */
static PyObject *py_mesh_stream(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *m_o;
    int i;
    if (!PyArg_ParseTuple(args, "Oi", &m_o, &i))
        return NULL;
    const dt_mesh *m = unwrap(m_o, KIND_MESH);
    if (!m)
        return NULL;
    return PyLong_FromVoidPtr(dt_mesh_local_stream(m, i));
}

/* tensor_dlpack_device(tensor, i): (DLPack device type, device id) of component i. */
static PyObject *py_tensor_dlpack_device(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t_o;
    int i;
    if (!PyArg_ParseTuple(args, "Oi", &t_o, &i))
        return NULL;
    const dt_tensor *t = unwrap(t_o, KIND_TENSOR);
    if (!t)
        return NULL;
    dt_local_buffer b;
    CALL(dt_tensor_local_buffer(t, i, &b));
    return Py_BuildValue("(ii)", b.type == DT_DEVICE_CUDA ? DL_CUDA : DL_CPU, b.device_ordinal);
}

/* The DLManagedTensors a wrapped DTensor borrowed: handed back when it is freed. */
typedef struct {
    int n;
    int taken; /* 0 while the wrap may still be undone (the capsules keep their tensors) */
    DLManagedTensor *managed[];
} import_ctx;

static void import_release(void *ctx)
{
    import_ctx *c = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    for (int i = 0; c->taken && i < c->n; i++)
        if (c->managed[i]->deleter)
            c->managed[i]->deleter(c->managed[i]);
    PyMem_Free(c);
    PyGILState_Release(g);
}

/* tensor_from_dlpack(mesh, layout_text, dtype, shape, [capsules]): a DTensor whose component
 * i is capsule i's memory (taken: the capsules are marked used), no copy. */
static PyObject *py_tensor_from_dlpack(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o, *caps_o;
    const char *text;
    int dtype;
    if (!PyArg_ParseTuple(args, "OsiOO", &mesh_o, &text, &dtype, &shape_o, &caps_o))
        return NULL;
    dt_layout l;
    int64_t shape[DT_MAX_RANK];
    if (parse_layout(mesh_o, text, &l) < 0 || parse_shape(shape_o, l.rank, shape) < 0)
        return NULL;
    Py_ssize_t n = seq_size(caps_o);
    if (n < 0 || n > INT32_MAX)
        return NULL;
    import_ctx *c = PyMem_Calloc(1, sizeof *c + (size_t)(n + 1) * sizeof c->managed[0]);
    void **bufs = PyMem_Calloc((size_t)n + 1, sizeof *bufs);
    size_t *bytes = PyMem_Calloc((size_t)n + 1, sizeof *bytes);
    PyObject **caps = PyMem_Calloc((size_t)n + 1, sizeof *caps);
    PyObject *result = NULL;
    DLDataType want;
    if (!c || !bufs || !bytes || !caps) {
        PyErr_NoMemory();
        goto done;
    }
    if (dl_dtype((dt_dtype)dtype, &want) < 0) {
        PyErr_Format(PyExc_TypeError, "from_dlpack: dtype %d has no DLPack code", dtype);
        goto done;
    }
    c->n = (int)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        caps[i] = seq_item(caps_o, i);
        DLManagedTensor *m = caps[i] ? PyCapsule_GetPointer(caps[i], "dltensor") : NULL;
        if (!m) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError,
                             "from_dlpack: component %zd is not an unused "
                             "\"dltensor\" capsule",
                             i);
            }
            goto done;
        }
        const DLTensor *d = &m->dl_tensor;
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(&l, shape, dt_mesh_local_device_id(l.mesh, (int)i), local, NULL);
        int want_type = dt_mesh_device_type(l.mesh) == DT_DEVICE_CUDA ? DL_CUDA : DL_CPU;
        if (d->device.device_type != want_type) {
            PyErr_Format(PyExc_ValueError,
                         "from_dlpack: component %zd lives on DLPack device type %d, the mesh's "
                         "devices are %s",
                         i, (int)d->device.device_type, want_type == DL_CUDA ? "CUDA" : "CPU");
            goto done;
        }
        if (d->dtype.code != want.code || d->dtype.bits != want.bits || d->dtype.lanes != 1) {
            PyErr_Format(PyExc_TypeError,
                         "from_dlpack: component %zd has DLPack dtype (code %d, %d bits, %d "
                         "lanes), the tensor is %s",
                         i, d->dtype.code, d->dtype.bits, d->dtype.lanes,
                         dt_dtype_name((dt_dtype)dtype));
            goto done;
        }
        int ok = d->ndim == l.rank;
        int64_t expect = 1;
        for (int a = l.rank - 1; ok && a >= 0; a--) {
            ok = d->shape[a] == local[a] &&
                 (!d->strides || local[a] == 1 || d->strides[a] == expect);
            expect *= local[a];
        }
        if (!ok) {
            PyErr_Format(PyExc_ValueError,
                         "from_dlpack: component %zd is not a contiguous row-major array of its "
                         "device's local shape (rank %d; the layout gives rank %d)",
                         i, (int)d->ndim, l.rank);
            goto done;
        }
        bufs[i] = (char *)d->data + d->byte_offset;
        bytes[i] = (size_t)expect * (size_t)(want.bits / 8);
        c->managed[i] = m;
    }
    dt_tensor *t = NULL;
    dt_status s = dt_tensor_wrap(&l, (dt_dtype)dtype, l.rank, shape, (int)n, bufs, bytes,
                                 import_release, c, &t);
    if (s != DT_OK) {
        raise_status(s);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* a GPU component must be on its device's GPU */
        dt_local_buffer b;
        dt_tensor_local_buffer(t, (int)i, &b);
        if (b.type == DT_DEVICE_CUDA &&
            b.device_ordinal != c->managed[i]->dl_tensor.device.device_id) {
            PyErr_Format(PyExc_ValueError,
                         "from_dlpack: component %zd is on GPU %d, its device is on GPU %d", i,
                         (int)c->managed[i]->dl_tensor.device.device_id, b.device_ordinal);
            dt_tensor_free(t); /* releases c, taking nothing */
            c = NULL;
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) /* taken: their deleters run when t is freed */
        PyCapsule_SetName(caps[i], "used_dltensor");
    c->taken = 1;
    c = NULL;
    result = wrap(KIND_TENSOR, t);
done:
    for (Py_ssize_t i = 0; caps && i < n; i++)
        Py_XDECREF(caps[i]);
    PyMem_Free(caps);
    PyMem_Free(bufs);
    PyMem_Free(bytes);
    PyMem_Free(c);
    return result;
}

/* ---- ops --------------------------------------------------------------------------------- */

/* Optional requested layout: (mesh handle, text) or None. */
typedef struct {
    dt_layout layout;
    bool given;
    bool program;
    char *text; /* the expanded program, when asked for */
    size_t len;
    FILE *f;
} op_ctx;

static int ctx_open(op_ctx *c, PyObject *mesh_o, const char *text, int program)
{
    memset(c, 0, sizeof *c);
    if (mesh_o != Py_None && text) {
        if (parse_layout(mesh_o, text, &c->layout) < 0)
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

static dt_op_options ctx_options(const op_ctx *c, int ta, int tb)
{
    return (dt_op_options){.layout = c->given ? &c->layout : NULL,
                           .transpose_a = ta,
                           .transpose_b = tb,
                           .program = c->f};
}

/* Wrap an op's result: a handle, or (handle, program text) when the program was asked for. */
static PyObject *ctx_close(op_ctx *c, dt_status s, dt_tensor *t)
{
    if (c->f)
        fclose(c->f);
    PyObject *r = s == DT_OK ? wrap(KIND_TENSOR, t) : raise_status(s);
    if (r && c->f) {
        PyObject *text = PyUnicode_FromStringAndSize(c->text ? c->text : "", (Py_ssize_t)c->len);
        r = text ? Py_BuildValue("(NN)", r, text) : NULL;
    }
    free(c->text);
    return r;
}

static int parse_ints(PyObject *o, int max, int64_t out[], int *n)
{
    Py_ssize_t len = seq_size(o);
    if (len < 0 || len > max) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd values, at most %d", len, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *v = seq_item(o, i);
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
    if (parse_ints(shape_o, DT_MAX_RANK, shape, &rank) < 0 || ctx_open(&c, mesh_o, text, program))
        return NULL;
    dt_op_options o = ctx_options(&c, 0, 0);
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
    return ctx_close(&c, s, t);
}

static PyObject *apply_attention(PyObject *args); /* at the end of this file */
static int add_transformer_functions(PyObject *m);

/* apply(op, tensors, mesh, layout, program, *attrs): every op that takes tensors. */
static PyObject *py_apply(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t nargs = PyTuple_Size(args);
    if (nargs < 5) {
        PyErr_SetString(PyExc_TypeError, "apply(op, tensors, mesh, layout, program, *attrs)");
        return NULL;
    }
    const char *op = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, 0));
    PyObject *ts_o = PyTuple_GET_ITEM(args, 1), *mesh_o = PyTuple_GET_ITEM(args, 2);
    PyObject *text_o = PyTuple_GET_ITEM(args, 3);
    int program = PyObject_IsTrue(PyTuple_GET_ITEM(args, 4));
    const char *text = text_o == Py_None ? NULL : PyUnicode_AsUTF8(text_o);
    if (!op || (text_o != Py_None && !text))
        return NULL;
    if (strcmp(op, "attention") == 0)
        return apply_attention(args);
    static const char *const known[] = {
        "matmul", "unary", "binary", "reduce", "transpose", "reshape", "slice", "concat",
        "relayout", "copy_to_mesh", "cast", "where",
        /* row-wise ops */
        "softmax", "norm", "arg_reduce", "cumsum",
        /* shape and index ops */
        "gather", "unsorted_segment_sum", "one_hot", "einsum", "stack", "pad", "tile",
        "broadcast_to", "expand_dims", "squeeze"};
    bool found = false;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        found = found || strcmp(op, known[i]) == 0;
    bool needs_layout = strcmp(op, "relayout") == 0 || strcmp(op, "copy_to_mesh") == 0;
    if (!found || (needs_layout && !text)) {
        PyErr_Format(PyExc_ValueError, found ? "%s needs a layout" : "unknown op %s", op);
        return NULL;
    }
    /* the C call reads as many operands as the op takes: between lo and hi (concat and stack
     * take 1 to 64, einsum 1 or 2, norm x with gamma and beta as its flag says, checked below) */
    Py_ssize_t n = seq_size(ts_o), lo = 1, hi = 1;
    if (strcmp(op, "concat") == 0 || strcmp(op, "stack") == 0)
        hi = 64;
    else if (strcmp(op, "einsum") == 0)
        hi = 2;
    else if (strcmp(op, "norm") == 0)
        hi = 3;
    else if (strcmp(op, "where") == 0)
        lo = hi = 3;
    else if (strcmp(op, "matmul") == 0 || strcmp(op, "binary") == 0 || strcmp(op, "gather") == 0 ||
             strcmp(op, "unsorted_segment_sum") == 0)
        lo = hi = 2;
    if (n < lo || n > hi) {
        if (!PyErr_Occurred()) {
            if (lo == hi)
                PyErr_Format(PyExc_ValueError, "%s: %zd operands, expected %zd", op, n, lo);
            else
                PyErr_Format(PyExc_ValueError, "%s: %zd operands, expected %zd to %zd", op, n, lo,
                             hi);
        }
        return NULL;
    }
    const dt_tensor *ts[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = seq_item(ts_o, i);
        ts[i] = h ? unwrap(h, KIND_TENSOR) : NULL;
        Py_XDECREF(h);
        if (!ts[i])
            return NULL;
    }
    /* Attributes: integers (op code, axis, depth, ...), lists of integers (axes, perm, shape,
     * begin, size, ...), floats (fill values) and one string (an einsum equation), each kind
     * in the order given. */
    int64_t at[2][DT_MAX_RANK], iv[4] = {0, 0, 0, 0};
    double fl[2] = {0, 0};
    const char *str = NULL;
    int atn[2] = {0, 0}, code = 0, flag = 0, niv = 0, nfl = 0;
    for (Py_ssize_t i = 5, k = 0; i < nargs; i++) {
        PyObject *v = PyTuple_GET_ITEM(args, i);
        if (PyUnicode_Check(v)) {
            if (str) {
                PyErr_SetString(PyExc_TypeError, "too many string attributes");
                return NULL;
            }
            if (!(str = PyUnicode_AsUTF8(v)))
                return NULL;
        } else if (PyFloat_Check(v)) {
            if (nfl == 2) {
                PyErr_SetString(PyExc_TypeError, "too many float attributes");
                return NULL;
            }
            fl[nfl++] = PyFloat_AsDouble(v);
        } else if (PySequence_Check(v)) {
            if (k == 2 || parse_ints(v, DT_MAX_RANK, at[k], &atn[k]) < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "too many list attributes");
                return NULL;
            }
            k++;
        } else {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (x == -1 && PyErr_Occurred())
                return NULL;
            /* one_hot's depth and unsorted_segment_sum's num_segments (the first integer) are
             * 64-bit; every other integer attribute is an int of the C call (an op code, an
             * axis, a dtype, flags), never truncated */
            bool wide =
                i == 5 && (strcmp(op, "one_hot") == 0 || strcmp(op, "unsorted_segment_sum") == 0);
            if (overflow || (!wide && (x < INT_MIN || x > INT_MAX))) {
                PyObject *r = PyObject_Repr(v);
                PyErr_Format(PyExc_ValueError, "%s: integer attribute %zd is %s, outside %s", op,
                             i - 5, r ? PyUnicode_AsUTF8(r) : "?",
                             wide ? "64 bits" : "the range of a C int");
                Py_XDECREF(r);
                return NULL;
            }
            if (i == 5)
                code = (int)x;
            else
                flag = (int)x;
            if (niv < 4)
                iv[niv++] = (int64_t)x;
        }
    }
    /* transpose's perm and slice's begin and size name every axis: the C calls read rank
     * entries, so shorter (or longer) lists are refused here */
    bool per_axis = strcmp(op, "transpose") == 0 || strcmp(op, "slice") == 0;
    int rank = n > 0 ? dt_tensor_rank(ts[0]) : 0;
    if (per_axis && op[0] == 't' && atn[0] != rank) {
        PyErr_Format(PyExc_ValueError, "transpose: perm has %d entries, the tensor rank %d", atn[0],
                     rank);
        return NULL;
    }
    if (per_axis && op[0] == 's' && (atn[0] != rank || atn[1] != rank)) {
        PyErr_Format(PyExc_ValueError,
                     "slice: begin has %d entries and size %d, the tensor rank %d", atn[0], atn[1],
                     rank);
        return NULL;
    }
    /* row-wise ops: softmax (code 0 softmax, 1 log_softmax with one axis; 2 logsumexp over the
     * axes, flag keepdims), norm (code 0 layer_norm, 1 rms_norm; flag: 1 gamma, 2 beta follow x),
     * arg_reduce (code 0 argmax, 1 argmin; [axis, index dtype]), cumsum (code axis; flag 1
     * exclusive, 2 reverse) */
    int norm_parts = 1 + !!(flag & 1) + !!(flag & 2);
    if ((strcmp(op, "softmax") == 0 && code < 2 && atn[0] != 1) ||
        (strcmp(op, "norm") == 0 && n != norm_parts) ||
        (strcmp(op, "arg_reduce") == 0 && atn[0] != 2)) {
        PyErr_Format(PyExc_ValueError, "%s: attributes do not fit (%zd operands)", op, n);
        return NULL;
    }
    /* lists that name every axis, and the einsum's equation: the C calls read them whole */
    if ((strcmp(op, "pad") == 0 && (atn[0] != rank || atn[1] != rank)) ||
        (strcmp(op, "tile") == 0 && atn[0] != rank)) {
        PyErr_Format(PyExc_ValueError, "%s: %d entries per list for a tensor of rank %d", op,
                     atn[0], rank);
        return NULL;
    }
    if (strcmp(op, "einsum") == 0 && !str) {
        PyErr_SetString(PyExc_TypeError, "einsum: no equation");
        return NULL;
    }
    /* axes and perm entries are ints of the C calls, never truncated */
    bool int_list = strcmp(op, "reduce") == 0 || strcmp(op, "transpose") == 0 ||
                    strcmp(op, "softmax") == 0 || strcmp(op, "arg_reduce") == 0 ||
                    strcmp(op, "squeeze") == 0;
    for (int i = 0; int_list && i < atn[0]; i++)
        if (at[0][i] < INT_MIN || at[0][i] > INT_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "%s: list entry %d is %lld, outside the range of a C int", op, i,
                         (long long)at[0][i]);
            return NULL;
        }
    op_ctx c;
    if (ctx_open(&c, mesh_o, text, program) < 0)
        return NULL;
    int ints[DT_MAX_RANK];
    for (int i = 0; i < atn[0]; i++)
        ints[i] = (int)at[0][i];
    dt_tensor *t = NULL;
    dt_status s = DT_OK;
    Py_BEGIN_ALLOW_THREADS;
    if (strcmp(op, "matmul") == 0) {
        dt_op_options o = ctx_options(&c, code, flag);
        s = dt_matmul(ts[0], ts[1], &o, &t);
    } else {
        dt_op_options o = ctx_options(&c, 0, 0);
        if (strcmp(op, "unary") == 0)
            s = dt_unary((dt_unary_op)code, ts[0], &o, &t);
        else if (strcmp(op, "binary") == 0)
            s = dt_binary((dt_binary_op)code, ts[0], ts[1], &o, &t);
        else if (strcmp(op, "reduce") == 0)
            s = dt_reduce((dt_reduce_op)code, ts[0], atn[0], ints, flag, &o, &t);
        else if (strcmp(op, "transpose") == 0)
            s = dt_transpose(ts[0], ints, &o, &t);
        else if (strcmp(op, "reshape") == 0)
            s = dt_reshape(ts[0], atn[0], at[0], &o, &t);
        else if (strcmp(op, "slice") == 0)
            s = dt_slice(ts[0], at[0], at[1], &o, &t);
        else if (strcmp(op, "concat") == 0)
            s = dt_concat((int)n, ts, code, &o, &t);
        else if (strcmp(op, "cast") == 0)
            s = dt_cast(ts[0], (dt_dtype)code, &o, &t);
        else if (strcmp(op, "where") == 0)
            s = dt_where(ts[0], ts[1], ts[2], &o, &t);
        else if (strcmp(op, "softmax") == 0)
            s = code == 2   ? dt_logsumexp(ts[0], atn[0], ints, flag, &o, &t)
                : code == 1 ? dt_log_softmax(ts[0], ints[0], &o, &t)
                            : dt_softmax(ts[0], ints[0], &o, &t);
        else if (strcmp(op, "norm") == 0)
            s = code == 1 ? dt_rms_norm(ts[0], (flag & 1) ? ts[1] : NULL, fl[0], &o, &t)
                          : dt_layer_norm(ts[0], (flag & 1) ? ts[1] : NULL,
                                          (flag & 2) ? ts[n - 1] : NULL, fl[0], &o, &t);
        else if (strcmp(op, "arg_reduce") == 0)
            s = (code == 1 ? dt_argmin : dt_argmax)(ts[0], ints[0], (dt_dtype)ints[1], &o, &t);
        else if (strcmp(op, "cumsum") == 0)
            s = dt_cumsum(ts[0], code, flag & 1, flag & 2, &o, &t);
        else if (strcmp(op, "gather") == 0)
            s = dt_gather(ts[0], ts[1], &o, &t);
        else if (strcmp(op, "unsorted_segment_sum") == 0) /* num_segments */
            s = dt_unsorted_segment_sum(ts[0], ts[1], iv[0], &o, &t);
        else if (strcmp(op, "one_hot") == 0) /* depth, axis, dtype, on, off */
            s = dt_one_hot(ts[0], iv[0], fl[0], fl[1], (int)iv[1], (dt_dtype)iv[2], &o, &t);
        else if (strcmp(op, "einsum") == 0)
            s = dt_einsum(str, (int)n, ts, &o, &t);
        else if (strcmp(op, "stack") == 0) /* axis */
            s = dt_stack((int)n, ts, (int)iv[0], &o, &t);
        else if (strcmp(op, "pad") == 0) /* before, after, constant */
            s = dt_pad(ts[0], at[0], at[1], fl[0], &o, &t);
        else if (strcmp(op, "tile") == 0) /* multiples */
            s = dt_tile(ts[0], at[0], &o, &t);
        else if (strcmp(op, "broadcast_to") == 0) /* shape */
            s = dt_broadcast_to(ts[0], atn[0], at[0], &o, &t);
        else if (strcmp(op, "expand_dims") == 0) /* axis */
            s = dt_expand_dims(ts[0], (int)iv[0], &o, &t);
        else if (strcmp(op, "squeeze") == 0) /* axes (none: every extent-1 axis) */
            s = dt_squeeze(ts[0], atn[0], ints, &o, &t);
        else if (strcmp(op, "relayout") == 0)
            s = dt_relayout(ts[0], &c.layout, &o, &t);
        else
            s = dt_copy_to_mesh(ts[0], &c.layout, &o, &t);
    }
    Py_END_ALLOW_THREADS;
    return ctx_close(&c, s, t);
}

/* ---- functions (tracing) ----------------------------------------------------------------- */

static PyObject *py_function_begin(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    dt_function *f = NULL;
    CALL(dt_function_begin(&f));
    return wrap(KIND_FUNCTION, f);
}

/* function_input(f, mesh, layout, dtype, shape) -> symbolic tensor */
static PyObject *py_function_input(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *f_o, *mesh_o, *shape_o;
    const char *text;
    int dtype;
    if (!PyArg_ParseTuple(args, "OOsiO", &f_o, &mesh_o, &text, &dtype, &shape_o))
        return NULL;
    dt_function *f = unwrap(f_o, KIND_FUNCTION);
    dt_layout l;
    int64_t shape[DT_MAX_RANK];
    int rank;
    if (!f || parse_layout(mesh_o, text, &l) < 0 || parse_ints(shape_o, DT_MAX_RANK, shape, &rank))
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_function_input(f, &l, (dt_dtype)dtype, rank, shape, &t));
    return wrap(KIND_TENSOR, t);
}

/* Most tensors a function's inputs or outputs (or an optimizer update) pass at once. */
#define MAX_FN_TENSORS 1024

static int collect_tensors(PyObject *seq, const dt_tensor **out, int max, int *n)
{
    Py_ssize_t len = seq_size(seq);
    if (len < 0 || len > max) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%zd tensors, at most %d", len, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *h = seq_item(seq, i);
        out[i] = h ? unwrap(h, KIND_TENSOR) : NULL;
        Py_XDECREF(h);
        if (!out[i])
            return -1;
    }
    *n = (int)len;
    return 0;
}

static PyObject *py_function_end(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *f_o, *outs_o;
    if (!PyArg_ParseTuple(args, "OO", &f_o, &outs_o))
        return NULL;
    dt_function *f = unwrap(f_o, KIND_FUNCTION);
    const dt_tensor *outs[MAX_FN_TENSORS];
    int n;
    if (!f || collect_tensors(outs_o, outs, MAX_FN_TENSORS, &n) < 0)
        return NULL;
    CALL(dt_function_end(f, n, (dt_tensor *const *)outs));
    Py_RETURN_NONE;
}

/* function_run(f, inputs, num_outputs) -> [tensor handles] */
static PyObject *py_function_run(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *f_o, *ins_o;
    int nout;
    if (!PyArg_ParseTuple(args, "OOi", &f_o, &ins_o, &nout))
        return NULL;
    const dt_function *f = unwrap(f_o, KIND_FUNCTION);
    const dt_tensor *ins[MAX_FN_TENSORS];
    int nin;
    if (!f || collect_tensors(ins_o, ins, MAX_FN_TENSORS, &nin) < 0)
        return NULL;
    if (nout < 0 || nout > MAX_FN_TENSORS) {
        PyErr_Format(PyExc_ValueError, "%d outputs, at most %d", nout, MAX_FN_TENSORS);
        return NULL;
    }
    dt_tensor *outs[MAX_FN_TENSORS] = {0};
    CALL(dt_function_run(f, nin, ins, nout, outs));
    PyObject *r = PyList_New(nout);
    for (int i = 0; i < nout; i++) {
        PyObject *h = r ? wrap(KIND_TENSOR, outs[i]) : NULL;
        if (!h) {
            for (int j = i + 1; j < nout; j++)
                dt_tensor_free(outs[j]);
            Py_XDECREF(r);
            return NULL;
        }
        PyList_SET_ITEM(r, i, h);
    }
    return r;
}

static PyObject *py_function_program(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_function *f = unwrap(arg, KIND_FUNCTION);
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out)
        return PyErr_NoMemory();
    double mults = 0, bytes = 0;
    int colls = 0;
    dt_status s = dt_function_print(f, out);
    fclose(out);
    if (s == DT_OK)
        s = dt_function_cost(f, &mults, &colls, &bytes);
    PyObject *r = s == DT_OK ? Py_BuildValue("(s#did)", text ? text : "", (Py_ssize_t)len, mults,
                                             colls, bytes)
                             : raise_status(s);
    free(text);
    return r;
}

/* ---- variables --------------------------------------------------------------------------- */

static PyObject *py_variable_create(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_tensor *t = unwrap(arg, KIND_TENSOR);
    if (!t)
        return NULL;
    dt_variable *v = NULL;
    CALL(dt_variable_create(t, &v));
    return wrap(KIND_VARIABLE, v);
}

/* variable_assign(v, tensor, mode): mode 0 assign, 1 add, 2 sub. */
static PyObject *py_variable_assign(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *v_o, *t_o;
    int mode;
    if (!PyArg_ParseTuple(args, "OOi", &v_o, &t_o, &mode))
        return NULL;
    dt_variable *v = unwrap(v_o, KIND_VARIABLE);
    const dt_tensor *t = v ? unwrap(t_o, KIND_TENSOR) : NULL;
    if (!t)
        return NULL;
    CALL(mode == 1   ? dt_variable_assign_add(v, t)
         : mode == 2 ? dt_variable_assign_sub(v, t)
                     : dt_variable_assign(v, t));
    Py_RETURN_NONE;
}

/* variable_read(v) -> a new tensor holding a copy of the value (collective). */
static PyObject *py_variable_read(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_variable *v = unwrap(arg, KIND_VARIABLE);
    if (!v)
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_relayout(dt_variable_value(v), dt_variable_layout(v), NULL, &t));
    return wrap(KIND_TENSOR, t);
}

/* ---- collectives and the ledger ---------------------------------------------------------- */

static PyObject *py_mesh_set_algorithm(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o;
    const char *name;
    if (!PyArg_ParseTuple(args, "Os", &mesh_o, &name))
        return NULL;
    dt_mesh *m = unwrap(mesh_o, KIND_MESH);
    if (!m)
        return NULL;
    for (int a = 0; a < DT_ALGORITHM_COUNT; a++)
        if (strcmp(name, dt_collective_algorithm_name((dt_collective_algorithm)a)) == 0) {
            CALL(dt_mesh_set_collective_algorithm(m, (dt_collective_algorithm)a));
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "unknown collective algorithm %R", PyTuple_GET_ITEM(args, 1));
    return NULL;
}

/* ledger(json): the ledger as text (a table, or JSON). */
static PyObject *py_ledger(PyObject *self, PyObject *args)
{
    (void)self;
    int json;
    if (!PyArg_ParseTuple(args, "p", &json))
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return PyErr_NoMemory();
    dt_status s = json ? dt_ledger_write_json(f) : dt_ledger_print(f);
    fclose(f);
    PyObject *r = s == DT_OK ? PyUnicode_FromStringAndSize(text ? text : "", (Py_ssize_t)len)
                             : raise_status(s);
    free(text);
    return r;
}

static PyObject *py_ledger_clear(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    dt_ledger_clear();
    Py_RETURN_NONE;
}

static PyObject *py_ledger_next_step(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(dt_ledger_next_step());
}

/* ---- gradients, training, strategies, parameter server ----------------------------------- */

/* function_gradient(f, loss_output, [wrt]) -> function */
static PyObject *py_function_gradient(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *f_o, *wrt_o;
    int loss;
    if (!PyArg_ParseTuple(args, "OiO", &f_o, &loss, &wrt_o))
        return NULL;
    const dt_function *f = unwrap(f_o, KIND_FUNCTION);
    int64_t w[MAX_FN_TENSORS]; /* one per input, as function_run takes */
    int n;
    if (!f || parse_ints(wrt_o, MAX_FN_TENSORS, w, &n) < 0)
        return NULL;
    int wrt[MAX_FN_TENSORS];
    for (int i = 0; i < n; i++)
        wrt[i] = (int)w[i];
    dt_function *g = NULL;
    CALL(dt_function_gradient(f, loss, n, wrt, &g));
    return wrap(KIND_FUNCTION, g);
}

/* strategy_create(kind, fixed_shards, min_shard_bytes, max_shards) */
static PyObject *py_strategy_create(PyObject *self, PyObject *args)
{
    (void)self;
    int kind, fixed, max_shards, type = 0, device = 0, first = 0, count = 0;
    long long min_bytes, max_bytes = 0;
    if (!PyArg_ParseTuple(args, "iiLi|iiiiL", &kind, &fixed, &min_bytes, &max_shards, &type,
                          &device, &first, &count, &max_bytes))
        return NULL;
    dt_strategy_options o = {.partitioner = {.fixed_shards = fixed,
                                             .min_shard_bytes = min_bytes,
                                             .max_shards = max_shards,
                                             .max_shard_bytes = max_bytes},
                             .device_type = (dt_device_type)type,
                             .device = device,
                             .first_device = first,
                             .num_devices = count};
    dt_strategy *st = NULL;
    CALL(dt_strategy_create((dt_strategy_kind)kind, &o, &st));
    return wrap(KIND_STRATEGY, st);
}

/* A borrowed handle of a strategy's mesh (freed with the strategy). */
static PyObject *borrowed_mesh(const dt_mesh *m)
{
    Handle *h = PyObject_New(Handle, &HandleType);
    if (!h)
        return NULL;
    h->kind = KIND_BORROWED_MESH;
    h->ptr = (void *)m;
    h->exports = 0;
    h->free_pending = 0;
    return (PyObject *)h;
}

/* strategy_info(s) -> {kind, replicas, mesh (borrowed handle), variable_mesh (borrowed handle,
 * None when the variables live on mesh), cluster or None} */
static PyObject *py_strategy_info(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_strategy *st = unwrap(arg, KIND_STRATEGY);
    if (!st)
        return NULL;
    dt_layout vl;
    CALL(dt_strategy_variable_layout(st, 0, &vl));
    PyObject *mesh = borrowed_mesh(dt_strategy_mesh(st));
    if (!mesh)
        return NULL;
    PyObject *var_mesh = Py_None;
    if (vl.mesh != dt_strategy_mesh(st)) {
        var_mesh = borrowed_mesh(vl.mesh); /* central storage: device 0's */
        if (!var_mesh) {
            Py_DECREF(mesh);
            return NULL;
        }
    } else {
        Py_INCREF(var_mesh);
    }
    PyObject *cluster = Py_None;
    dt_cluster c;
    if (dt_strategy_cluster(st, &c) == DT_OK)
        cluster =
            Py_BuildValue("{s:s,s:i,s:i,s:i,s:i}", "task_type", dt_task_type_name(c.task_type),
                          "task_index", c.task_index, "workers", c.num_tasks[DT_TASK_WORKER], "ps",
                          c.num_tasks[DT_TASK_PS], "chief", c.num_tasks[DT_TASK_CHIEF]);
    else
        Py_INCREF(cluster);
    return Py_BuildValue("{s:s,s:i,s:N,s:N,s:N}", "kind",
                         dt_strategy_kind_name(dt_strategy_kind_of(st)), "replicas",
                         dt_strategy_num_replicas_in_sync(st), "mesh", mesh, "variable_mesh",
                         var_mesh, "cluster", cluster);
}

/* strategy_layouts(s, rank) -> (variable layout text, input layout text) */
static PyObject *py_strategy_layouts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o;
    int rank;
    if (!PyArg_ParseTuple(args, "Oi", &s_o, &rank))
        return NULL;
    const dt_strategy *st = unwrap(s_o, KIND_STRATEGY);
    if (!st)
        return NULL;
    dt_layout v, in;
    char vt[DT_STRING_MAX], it[DT_STRING_MAX];
    CALL(dt_strategy_variable_layout(st, rank, &v));
    CALL(dt_strategy_input_layout(st, rank, &in));
    CALL(dt_layout_to_string(&v, vt, sizeof vt));
    CALL(dt_layout_to_string(&in, it, sizeof it));
    return Py_BuildValue("(ss)", vt, it);
}

static PyObject *py_strategy_scope(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o;
    int enter;
    if (!PyArg_ParseTuple(args, "Op", &s_o, &enter))
        return NULL;
    dt_strategy *st = unwrap(s_o, KIND_STRATEGY);
    if (!st)
        return NULL;
    CALL(enter ? dt_strategy_scope_enter(st) : dt_strategy_scope_exit(st));
    Py_RETURN_NONE;
}

/* model_create(input_features, [(units, activation, kernel_init, bias_init, no_bias, l2)],
 * dtype, seed) */
static PyObject *py_model_create(PyObject *self, PyObject *args)
{
    (void)self;
    long long features;
    PyObject *layers_o;
    int dtype;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "LOiK", &features, &layers_o, &dtype, &seed))
        return NULL;
    Py_ssize_t n = seq_size(layers_o);
    if (n < 1 || n > 64) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "a model needs 1 to 64 layers, got %zd", n);
        return NULL;
    }
    dt_dense_config cfg[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = seq_item(layers_o, i);
        long long units;
        int act, kinit, binit, no_bias;
        double l2;
        if (l && !PyTuple_Check(l)) {
            PyErr_Format(PyExc_TypeError, "layer %zd: expected a tuple, got %.80s", i,
                         Py_TYPE(l)->tp_name);
            Py_CLEAR(l);
        }
        int ok = l && PyArg_ParseTuple(l, "Liiiid", &units, &act, &kinit, &binit, &no_bias, &l2);
        Py_XDECREF(l);
        if (!ok)
            return NULL;
        cfg[i] = (dt_dense_config){.units = units,
                                   .activation = (dt_activation)act,
                                   .kernel_init = (dt_initializer)kinit,
                                   .bias_init = (dt_initializer)binit,
                                   .no_bias = no_bias,
                                   .l2 = l2};
    }
    dt_model *m = NULL;
    CALL(dt_model_create(features, (int)n, cfg, (dt_dtype)dtype, seed, &m));
    return wrap(KIND_MODEL, m);
}

/* model_variables(m) -> [names] */
static PyObject *py_model_variables(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_model *m = unwrap(arg, KIND_MODEL);
    if (!m)
        return NULL;
    int n = dt_model_num_variables(m);
    PyObject *r = PyList_New(n);
    for (int i = 0; r && i < n; i++)
        PyList_SET_ITEM(r, i, PyUnicode_FromString(dt_model_variable_name(m, i)));
    return r;
}

/* model_variable_read(m, i) -> a copy of variable i's value (collective) */
static PyObject *py_model_variable_read(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *m_o;
    int i;
    if (!PyArg_ParseTuple(args, "Oi", &m_o, &i))
        return NULL;
    const dt_model *m = unwrap(m_o, KIND_MODEL);
    if (!m)
        return NULL;
    const dt_variable *v = dt_model_variable(m, i);
    if (!v) {
        PyErr_Format(PyExc_IndexError, "variable %d of %d", i, dt_model_num_variables(m));
        return NULL;
    }
    dt_tensor *t = NULL;
    CALL(dt_relayout(dt_variable_value(v), dt_variable_layout(v), NULL, &t));
    return wrap(KIND_TENSOR, t);
}

static PyObject *py_model_predict(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *m_o, *x_o;
    if (!PyArg_ParseTuple(args, "OO", &m_o, &x_o))
        return NULL;
    const dt_model *m = unwrap(m_o, KIND_MODEL);
    const dt_tensor *x = m ? unwrap(x_o, KIND_TENSOR) : NULL;
    if (!x)
        return NULL;
    dt_tensor *out = NULL;
    CALL(dt_model_predict(m, x, &out));
    return wrap(KIND_TENSOR, out);
}

/* model_evaluate(m, loss, x, y) -> mean loss */
static PyObject *py_model_evaluate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *m_o, *x_o, *y_o;
    int loss;
    if (!PyArg_ParseTuple(args, "OiOO", &m_o, &loss, &x_o, &y_o))
        return NULL;
    const dt_model *m = unwrap(m_o, KIND_MODEL);
    const dt_tensor *x = m ? unwrap(x_o, KIND_TENSOR) : NULL;
    const dt_tensor *y = x ? unwrap(y_o, KIND_TENSOR) : NULL;
    if (!y)
        return NULL;
    double value = 0;
    CALL(dt_model_evaluate(m, (dt_loss)loss, x, y, &value));
    return PyFloat_FromDouble(value);
}

/* optimizer_create(kind, lr, momentum, nesterov, beta_1, beta_2, epsilon, weight_decay, rho) */
static PyObject *py_optimizer_create(PyObject *self, PyObject *args)
{
    (void)self;
    dt_optimizer_config c = {0};
    int kind;
    if (!PyArg_ParseTuple(args, "iddpdddd|d", &kind, &c.learning_rate, &c.momentum, &c.nesterov,
                          &c.beta_1, &c.beta_2, &c.epsilon, &c.weight_decay, &c.rho))
        return NULL;
    c.kind = (dt_optimizer_kind)kind;
    dt_optimizer *o = NULL;
    CALL(dt_optimizer_create(&c, &o));
    return wrap(KIND_OPTIMIZER, o);
}

/* optimizer_set_learning_rate(o, lr) */
static PyObject *py_optimizer_set_learning_rate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_o;
    double lr;
    if (!PyArg_ParseTuple(args, "Od", &o_o, &lr))
        return NULL;
    dt_optimizer *o = unwrap(o_o, KIND_OPTIMIZER);
    if (!o)
        return NULL;
    CALL(dt_optimizer_set_learning_rate(o, lr));
    Py_RETURN_NONE;
}

/* train_step(strategy or None, model, loss, optimizer, x, y) -> loss */
static PyObject *py_train_step(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o, *m_o, *o_o, *x_o, *y_o;
    int loss;
    if (!PyArg_ParseTuple(args, "OOiOOO", &s_o, &m_o, &loss, &o_o, &x_o, &y_o))
        return NULL;
    dt_strategy *st = s_o == Py_None ? NULL : unwrap(s_o, KIND_STRATEGY);
    if (s_o != Py_None && !st)
        return NULL;
    dt_model *m = unwrap(m_o, KIND_MODEL);
    dt_optimizer *o = m ? unwrap(o_o, KIND_OPTIMIZER) : NULL;
    const dt_tensor *x = o ? unwrap(x_o, KIND_TENSOR) : NULL;
    const dt_tensor *y = x ? unwrap(y_o, KIND_TENSOR) : NULL;
    if (!y)
        return NULL;
    double value = 0;
    CALL(dt_model_train_step(st, m, (dt_loss)loss, o, x, y, &value));
    return PyFloat_FromDouble(value);
}

/* optimizer_apply(optimizer, [variables], [gradients]): one update. Collective. */
static PyObject *py_optimizer_apply(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *o_o, *vars_o, *grads_o;
    if (!PyArg_ParseTuple(args, "OOO", &o_o, &vars_o, &grads_o))
        return NULL;
    dt_optimizer *o = unwrap(o_o, KIND_OPTIMIZER);
    const dt_tensor *grads[MAX_FN_TENSORS];
    dt_variable *vars[MAX_FN_TENSORS];
    int n;
    if (!o || collect_tensors(grads_o, grads, MAX_FN_TENSORS, &n) < 0)
        return NULL;
    if (seq_size(vars_o) != n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "optimizer: %zd variables and %d gradients",
                         seq_size(vars_o), n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyObject *h = seq_item(vars_o, i);
        vars[i] = h ? unwrap(h, KIND_VARIABLE) : NULL;
        Py_XDECREF(h);
        if (!vars[i])
            return NULL;
    }
    CALL(dt_optimizer_apply(o, n, vars, grads));
    Py_RETURN_NONE;
}

/* optimizer_iterations(optimizer) -> updates applied so far */
static PyObject *py_optimizer_iterations(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_optimizer *o = unwrap(arg, KIND_OPTIMIZER);
    return o ? PyLong_FromLongLong((long long)dt_optimizer_iterations(o)) : NULL;
}

/* ---- random generator and checkpoints ---------------------------------------------------- */

/* generator_create(seed) */
static PyObject *py_generator_create(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred())
        return NULL;
    dt_generator *g = NULL;
    CALL(dt_generator_create(seed, &g));
    return wrap(KIND_GENERATOR, g);
}

/* generator_draw(g, kind, mesh, layout, dtype, shape, a, b, program): kind "uniform" (low a,
 * high b) or "normal" (mean a, stddev b). Collective. */
static PyObject *py_generator_draw(PyObject *self, PyObject *args)
{
    (void)self;
    const char *kind, *text;
    PyObject *g_o, *mesh_o, *shape_o;
    int dtype, program;
    double a, b;
    if (!PyArg_ParseTuple(args, "OsOsiOddp", &g_o, &kind, &mesh_o, &text, &dtype, &shape_o, &a, &b,
                          &program))
        return NULL;
    dt_generator *g = unwrap(g_o, KIND_GENERATOR);
    int64_t shape[DT_MAX_RANK];
    int rank;
    op_ctx c;
    if (!g || parse_ints(shape_o, DT_MAX_RANK, shape, &rank) < 0 ||
        ctx_open(&c, mesh_o, text, program))
        return NULL;
    dt_op_options o = ctx_options(&c, 0, 0);
    dt_tensor *t = NULL;
    dt_status s;
    bool normal = strcmp(kind, "normal") == 0;
    Py_BEGIN_ALLOW_THREADS;
    s = normal ? dt_generator_normal(g, (dt_dtype)dtype, rank, shape, a, b, &o, &t)
               : dt_generator_uniform(g, (dt_dtype)dtype, rank, shape, a, b, &o, &t);
    Py_END_ALLOW_THREADS;
    return ctx_close(&c, s, t);
}

/* generator_state(g) -> (seed, counter); generator_state(g, seed, counter) sets it. */
static PyObject *py_generator_state(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *g_o;
    unsigned long long seed = 0, counter = 0;
    int n = (int)PyTuple_Size(args);
    if (!PyArg_ParseTuple(args, "O|KK", &g_o, &seed, &counter))
        return NULL;
    dt_generator *g = unwrap(g_o, KIND_GENERATOR);
    if (!g)
        return NULL;
    if (n == 3)
        CALL(dt_generator_reset(g, seed, counter));
    uint64_t sd, ct;
    CALL(dt_generator_state(g, &sd, &ct));
    return Py_BuildValue("(KK)", (unsigned long long)sd, (unsigned long long)ct);
}

/* checkpoint_io(write, path, entries, metadata, save_counter) -> (save_counter, metadata):
 * entries [(kind, name, handle)] with kind "variable", "model", "optimizer", "generator" or
 * "tensor"; metadata {key: value}. Builds a dt_checkpoint for the call, writes or reads it,
 * frees it. Collective. */
static PyObject *py_checkpoint_io(PyObject *self, PyObject *args)
{
    (void)self;
    int write;
    const char *path;
    PyObject *entries, *md;
    long long counter;
    if (!PyArg_ParseTuple(args, "psOO!L", &write, &path, &entries, &PyDict_Type, &md, &counter))
        return NULL;
    dt_checkpoint *c = NULL;
    CALL(dt_checkpoint_create(&c));
    PyObject *result = NULL;
    dt_status s = dt_checkpoint_set_save_counter(c, counter);
    Py_ssize_t n = PySequence_Size(entries);
    if (n < 0)
        goto done;
    for (Py_ssize_t i = 0; s == DT_OK && i < n; i++) {
        PyObject *e = PySequence_GetItem(entries, i);
        const char *kind, *name;
        PyObject *h;
        bool ok = e && PyArg_ParseTuple(e, "ssO", &kind, &name, &h);
        if (ok && !strcmp(kind, "variable")) {
            dt_variable *v = unwrap(h, KIND_VARIABLE);
            ok = v && ((s = dt_checkpoint_add_variable(c, name, v)), true);
        } else if (ok && !strcmp(kind, "model")) {
            dt_model *m = unwrap(h, KIND_MODEL);
            ok = m && ((s = dt_checkpoint_add_model(c, name, m)), true);
        } else if (ok && !strcmp(kind, "optimizer")) {
            dt_optimizer *o = unwrap(h, KIND_OPTIMIZER);
            ok = o && ((s = dt_checkpoint_add_optimizer(c, name, o)), true);
        } else if (ok && !strcmp(kind, "generator")) {
            dt_generator *g = unwrap(h, KIND_GENERATOR);
            ok = g && ((s = dt_checkpoint_add_generator(c, name, g)), true);
        } else if (ok && !strcmp(kind, "tensor")) {
            const dt_tensor *t = unwrap(h, KIND_TENSOR);
            ok = t && ((s = dt_checkpoint_add_tensor(c, name, t)), true);
        } else if (ok) {
            PyErr_Format(PyExc_ValueError, "checkpoint: unknown entry kind %s", kind);
            ok = false;
        }
        Py_XDECREF(e);
        if (!ok)
            goto done;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (s == DT_OK && PyDict_Next(md, &pos, &key, &value)) {
        const char *k = PyUnicode_AsUTF8(key), *v = k ? PyUnicode_AsUTF8(value) : NULL;
        if (!v)
            goto done;
        s = dt_checkpoint_set_metadata(c, k, v);
    }
    if (s == DT_OK) {
        Py_BEGIN_ALLOW_THREADS;
        s = write ? dt_checkpoint_write(c, path) : dt_checkpoint_read(c, path);
        Py_END_ALLOW_THREADS;
    }
    if (s != DT_OK) {
        raise_status(s);
        goto done;
    }
    /* the metadata after a read: every key the file had (and those set) */
    PyObject *out = PyDict_New();
    for (int i = 0; out && i < dt_checkpoint_num_metadata(c); i++) {
        const char *k = dt_checkpoint_metadata_key(c, i);
        PyObject *v = PyUnicode_FromString(dt_checkpoint_metadata(c, k));
        if (!v || PyDict_SetItemString(out, k, v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    result = out ? Py_BuildValue("(LN)", (long long)dt_checkpoint_save_counter(c), out) : NULL;
done:
    dt_checkpoint_free(c);
    return result;
}
/* checkpoint_read_tensor(path, name, mesh, layout) -> tensor handle. Collective. */
static PyObject *py_checkpoint_read_tensor(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path, *name, *text;
    PyObject *mesh_o;
    if (!PyArg_ParseTuple(args, "ssOs", &path, &name, &mesh_o, &text))
        return NULL;
    dt_layout l;
    if (parse_layout(mesh_o, text, &l) < 0)
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_checkpoint_read_tensor(path, name, &l, &t));
    return wrap(KIND_TENSOR, t);
}

/* checkpoint_tensor_info(path, name) -> (dtype, shape). */
static PyObject *py_checkpoint_tensor_info(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path, *name;
    if (!PyArg_ParseTuple(args, "ss", &path, &name))
        return NULL;
    dt_dtype d;
    int rank;
    int64_t shape[DT_MAX_RANK];
    CALL(dt_checkpoint_tensor_info(path, name, &d, &rank, shape));
    PyObject *t = PyTuple_New(rank);
    for (int i = 0; t && i < rank; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong((long long)shape[i]));
    return t ? Py_BuildValue("(iN)", (int)d, t) : NULL;
}

/* checkpoint_latest(directory) -> path or None. */
static PyObject *py_checkpoint_latest(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *dir = PyUnicode_AsUTF8(arg);
    if (!dir)
        return NULL;
    char path[4096];
    CALL(dt_checkpoint_latest(dir, path, sizeof path));
    if (!path[0])
        Py_RETURN_NONE;
    return PyUnicode_FromString(path);
}

/* A parameter-server step closure: calls the Python callable with the step number from the
 * worker's thread, holding the GIL only for the call. A Python exception becomes a failing
 * status (the chief reschedules the step elsewhere). */
static dt_status ps_trampoline(void *ctx, int64_t step, double *value)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction((PyObject *)ctx, "L", (long long)step);
    dt_status s = DT_OK;
    if (!r) {
        PyObject *type, *val, *tb;
        PyErr_Fetch(&type, &val, &tb);
        PyObject *str = val ? PyObject_Str(val) : NULL;
        const char *msg = str ? PyUnicode_AsUTF8(str) : NULL;
        char buf[400];
        snprintf(buf, sizeof buf, "step %lld raised %s", (long long)step, msg ? msg : "?");
        Py_XDECREF(str);
        Py_XDECREF(type);
        Py_XDECREF(val);
        Py_XDECREF(tb);
        PyErr_Clear();
        PyGILState_Release(g);
        /* The message travels with the status the coordinator reports. */
        extern dt_status dt__fail(dt_status, const char *, ...);
        return dt__fail(DT_ERR_ARG, "%s", buf);
    }
    *value = PyFloat_Check(r) || PyLong_Check(r) ? PyFloat_AsDouble(r) : 0.0;
    Py_DECREF(r);
    PyGILState_Release(g);
    return s;
}

/* ps_coordinator_create(strategy, callable) -> coordinator. The callable is kept alive by the
 * Python layer for as long as the coordinator. Collective. */
static PyObject *py_ps_coordinator_create(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o, *fn;
    if (!PyArg_ParseTuple(args, "OO", &s_o, &fn))
        return NULL;
    dt_strategy *st = unwrap(s_o, KIND_STRATEGY);
    if (!st)
        return NULL;
    dt_ps_coordinator *c = NULL;
    CALL(dt_ps_coordinator_create(st, ps_trampoline, fn, &c));
    return wrap(KIND_COORDINATOR, c);
}

static PyObject *py_ps_schedule(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *c_o;
    long long step;
    if (!PyArg_ParseTuple(args, "OL", &c_o, &step))
        return NULL;
    dt_ps_coordinator *c = unwrap(c_o, KIND_COORDINATOR);
    if (!c)
        return NULL;
    dt_remote_value *v = NULL;
    CALL(dt_ps_schedule(c, step, &v));
    return wrap(KIND_REMOTE, v);
}

/* remote_fetch(v) -> (value, worker, attempts) */
static PyObject *py_remote_fetch(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_remote_value *v = unwrap(arg, KIND_REMOTE);
    if (!v)
        return NULL;
    double value = 0;
    int worker = -1, attempts = 0;
    CALL(dt_remote_value_fetch(v, &value, &worker, &attempts));
    return Py_BuildValue("(dii)", value, worker, attempts);
}

static PyObject *py_ps_pending(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_ps_coordinator *c = unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    int n = 0;
    CALL(dt_ps_pending(c, &n));
    return PyLong_FromLong(n);
}

static PyObject *py_ps_join_all(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_ps_coordinator *c = unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    CALL(dt_ps_join_all(c));
    Py_RETURN_NONE;
}

/* ps_variable_create(strategy, tensor): a variable on the ps tasks. Collective. */
static PyObject *py_ps_variable_create(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o, *t_o;
    if (!PyArg_ParseTuple(args, "OO", &s_o, &t_o))
        return NULL;
    dt_strategy *st = unwrap(s_o, KIND_STRATEGY);
    const dt_tensor *t = st ? unwrap(t_o, KIND_TENSOR) : NULL;
    if (!t)
        return NULL;
    dt_ps_variable *v = NULL;
    CALL(dt_ps_variable_create(st, t, &v));
    return wrap(KIND_PS_VARIABLE, v);
}

/* ps_variable_io(variable, buffer, add): read into a writable buffer, or add a buffer. */
static PyObject *py_ps_variable_io(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *v_o;
    Py_buffer buf;
    int add;
    if (!PyArg_ParseTuple(args, "Ow*p", &v_o, &buf, &add))
        return NULL;
    const dt_ps_variable *v = unwrap(v_o, KIND_PS_VARIABLE);
    dt_status s = DT_OK;
    if (v) {
        Py_BEGIN_ALLOW_THREADS;
        s = add ? dt_ps_variable_add(v, buf.buf, (size_t)buf.len)
                : dt_ps_variable_read(v, buf.buf, (size_t)buf.len);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&buf);
    if (!v)
        return NULL;
    if (s != DT_OK)
        return raise_status(s);
    Py_RETURN_NONE;
}

/* ps_variable_fetch_add(variable, delta, old): add delta, the value before it into old. */
static PyObject *py_ps_variable_fetch_add(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *v_o;
    Py_buffer delta, old;
    if (!PyArg_ParseTuple(args, "Oy*w*", &v_o, &delta, &old))
        return NULL;
    const dt_ps_variable *v = unwrap(v_o, KIND_PS_VARIABLE);
    dt_status s = DT_OK;
    if (v && delta.len != old.len) {
        PyErr_Format(PyExc_ValueError, "ps_variable_fetch_add: delta has %zd bytes, old %zd",
                     delta.len, old.len);
        v = NULL;
    }
    if (v) {
        Py_BEGIN_ALLOW_THREADS;
        s = dt_ps_variable_fetch_add(v, delta.buf, old.buf, (size_t)old.len);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&delta);
    PyBuffer_Release(&old);
    if (!v)
        return NULL;
    if (s != DT_OK)
        return raise_status(s);
    Py_RETURN_NONE;
}

/* ps_variable_shards(variable) -> [(ps task, row0, rows), ...] */
static PyObject *py_ps_variable_shards(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_ps_variable *v = unwrap(arg, KIND_PS_VARIABLE);
    if (!v)
        return NULL;
    int n = dt_ps_variable_num_shards(v);
    PyObject *r = PyList_New(n);
    for (int i = 0; r && i < n; i++) {
        int task;
        int64_t row0, rows;
        dt_ps_variable_shard(v, i, &task, &row0, &rows);
        PyList_SET_ITEM(r, i, Py_BuildValue("(iLL)", task, (long long)row0, (long long)rows));
    }
    return r;
}

/* ps_shutdown(coordinator handle): collective; workers run scheduled steps until the chief
 * releases them. The handle is emptied either way. */
static PyObject *py_ps_shutdown(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_ps_coordinator *c = unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    ((Handle *)arg)->ptr = NULL;
    CALL(dt_ps_coordinator_shutdown(c));
    Py_RETURN_NONE;
}

static PyObject *py_ps_pull(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *s_o, *m_o;
    if (!PyArg_ParseTuple(args, "OO", &s_o, &m_o))
        return NULL;
    dt_strategy *st = unwrap(s_o, KIND_STRATEGY);
    dt_model *m = st ? unwrap(m_o, KIND_MODEL) : NULL;
    if (!m)
        return NULL;
    CALL(dt_ps_pull(st, m));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(cpu_devices=0, bind=0). Collective."},
    {"finalize", py_finalize, METH_NOARGS, "Stop the runtime. Collective."},
    {"runtime_info", py_runtime_info, METH_NOARGS, "Clients and device counts."},
    {"global_device_id", py_global_device_id, METH_VARARGS,
     "Global id of a local device, -1 when out of range."},
    {"barrier", py_barrier, METH_NOARGS, "Wait for every client. Collective."},
    {"devices_report", py_devices_report, METH_NOARGS, "Topology and devices of this client."},
    {"client_allgather", py_client_allgather, METH_O,
     "Every client's bytes (the same length everywhere), in client order. Collective."},
    {"mesh_create", py_mesh_create, METH_VARARGS,
     "mesh_create(names, sizes, type, device_ids=None). Collective."},
    {"mesh_create_local", py_mesh_create_local, METH_VARARGS,
     "mesh_create_local(names, sizes, type, first_local): this client's devices only."},
    {"mesh_info", py_mesh_info, METH_O, "Axes, sizes and local device ids of a mesh."},
    {"layout_check", py_layout_check, METH_VARARGS, "Canonical text and rank of a layout."},
    {"layout_local_shape", py_layout_local_shape, METH_VARARGS,
     "Local shape and offset of a device's shard."},
    {"tensor_from_host", py_tensor_from_host, METH_VARARGS, "A DTensor from a full array."},
    {"tensor_pack", py_tensor_pack, METH_VARARGS, "A DTensor from per-device components."},
    {"tensor_dlpack", py_tensor_dlpack, METH_VARARGS, "A component as a DLPack capsule."},
    {"tensor_dlpack_device", py_tensor_dlpack_device, METH_VARARGS,
     "(DLPack device type, id) of a component."},
    {"mesh_stream", py_mesh_stream, METH_VARARGS,
     "The CUDA stream of a mesh's local device, as an integer (0: none)."},
    {"tensor_from_dlpack", py_tensor_from_dlpack, METH_VARARGS,
     "A DTensor over DLPack capsules' memory, no copy."},
    {"tensor_info", py_tensor_info, METH_O, "dtype, shape, layout and local shapes."},
    {"tensor_meta", py_tensor_meta, METH_O, "(dtype, shape, layout text) of a tensor."},
    {"tensor_to_host", py_tensor_to_host, METH_VARARGS,
     "Copy component i, or (i = -1) gather the global array (collective), into a buffer."},
    {"create", py_create, METH_VARARGS, "Creation ops (fill, arange, random). Collective."},
    {"apply", py_apply, METH_VARARGS, "Ops on tensors. Collective."},
    {"function_begin", py_function_begin, METH_NOARGS, "Start recording on this thread."},
    {"function_input", py_function_input, METH_VARARGS, "A symbolic input."},
    {"function_end", py_function_end, METH_VARARGS, "Stop recording and expand."},
    {"function_run", py_function_run, METH_VARARGS, "Run an ended function. Collective."},
    {"function_program", py_function_program, METH_O,
     "(program text, multiplies, "
     "collectives, bytes per device)."},
    {"variable_create", py_variable_create, METH_O, "A variable from a tensor. Collective."},
    {"variable_assign", py_variable_assign, METH_VARARGS, "Assign, add or sub. Collective."},
    {"variable_read", py_variable_read, METH_O, "A copy of the value. Collective."},
    {"mesh_set_algorithm", py_mesh_set_algorithm, METH_VARARGS, "Collective algorithm by name."},
    {"ledger", py_ledger, METH_VARARGS, "The communication ledger as a table or JSON."},
    {"ledger_clear", py_ledger_clear, METH_NOARGS, "Drop every ledger entry."},
    {"ledger_next_step", py_ledger_next_step, METH_NOARGS, "Start a new ledger step."},
    {"function_gradient", py_function_gradient, METH_VARARGS, "Gradient function of f."},
    {"strategy_create", py_strategy_create, METH_VARARGS, "A strategy. Collective."},
    {"strategy_info", py_strategy_info, METH_O, "Kind, replicas, mesh and cluster task."},
    {"strategy_layouts", py_strategy_layouts, METH_VARARGS, "Variable and input layouts."},
    {"strategy_scope", py_strategy_scope, METH_VARARGS, "Enter or exit the scope."},
    {"model_create", py_model_create, METH_VARARGS, "A sequential dense model. Collective."},
    {"model_variables", py_model_variables, METH_O, "Names of a model's variables."},
    {"model_variable_read", py_model_variable_read, METH_VARARGS, "Copy of a variable."},
    {"model_predict", py_model_predict, METH_VARARGS, "Forward pass. Collective."},
    {"model_evaluate", py_model_evaluate, METH_VARARGS, "Mean loss. Collective."},
    {"optimizer_create", py_optimizer_create, METH_VARARGS, "SGD, Adam, AdamW or RMSprop."},
    {"optimizer_set_learning_rate", py_optimizer_set_learning_rate, METH_VARARGS,
     "The learning rate of the next updates."},
    {"train_step", py_train_step, METH_VARARGS, "One training step. Collective."},
    {"optimizer_apply", py_optimizer_apply, METH_VARARGS, "One update. Collective."},
    {"ps_coordinator_create", py_ps_coordinator_create, METH_VARARGS, "Collective."},
    {"ps_schedule", py_ps_schedule, METH_VARARGS, "Chief: queue a step."},
    {"remote_fetch", py_remote_fetch, METH_O, "Chief: wait for a step's value."},
    {"ps_join_all", py_ps_join_all, METH_O, "Every client: join. Collective."},
    {"ps_pending", py_ps_pending, METH_O, "Chief: steps queued or running."},
    {"ps_variable_create", py_ps_variable_create, METH_VARARGS,
     "A variable on the ps tasks. Collective."},
    {"ps_variable_io", py_ps_variable_io, METH_VARARGS, "Read or add, one-sided."},
    {"ps_variable_fetch_add", py_ps_variable_fetch_add, METH_VARARGS,
     "Add, getting the value before, atomically per element; one-sided."},
    {"ps_variable_shards", py_ps_variable_shards, METH_O, "(ps task, row0, rows) per shard."},
    {"ps_shutdown", py_ps_shutdown, METH_O, "Release workers and ps tasks. Collective."},
    {"ps_pull", py_ps_pull, METH_VARARGS, "Copy the ps tasks' values into a model."},
    {"print_ordered", py_print_ordered, METH_VARARGS, "Client 0 prints all, in client order."},
    {"optimizer_iterations", py_optimizer_iterations, METH_O, "Updates applied so far."},
    {"generator_create", py_generator_create, METH_O, "A random generator at (seed, 0)."},
    {"generator_draw", py_generator_draw, METH_VARARGS, "The next draw. Collective."},
    {"generator_state", py_generator_state, METH_VARARGS, "Get or set (seed, counter)."},
    {"checkpoint_io", py_checkpoint_io, METH_VARARGS, "Write or read a checkpoint. Collective."},
    {"checkpoint_read_tensor", py_checkpoint_read_tensor, METH_VARARGS,
     "A tensor of a checkpoint in a layout. Collective."},
    {"checkpoint_tensor_info", py_checkpoint_tensor_info, METH_VARARGS,
     "(dtype, shape) of a tensor in a checkpoint."},
    {"checkpoint_latest", py_checkpoint_latest, METH_O, "The newest ckpt-N.h5 in a directory."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_dtensor",
    "The C layer of the dtensor package.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__dtensor(void)
{
    if (PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    DTensorError = PyErr_NewExceptionWithDoc(
        "dtensor.DTensorError",
        "A dtensor call failed; .status names the status code, .code is its value.",
        PyExc_RuntimeError, NULL);
    Py_INCREF(&HandleType);
    if (!DTensorError || PyModule_AddObject(m, "DTensorError", DTensorError) < 0 ||
        PyModule_AddObject(m, "Handle", (PyObject *)&HandleType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(DTensorError);
    error_classes = PyDict_New();
    if (!error_classes || PyModule_AddObject(m, "error_classes", error_classes) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(error_classes);
#define ADD_DTYPE(NAME, name, ctype) PyModule_AddIntConstant(m, "DTYPE_" #NAME, DT_DTYPE_##NAME);
    DT_DTYPE_LIST(ADD_DTYPE)
#undef ADD_DTYPE
#define ADD_UNARY(NAME, name) PyModule_AddIntConstant(m, "UNARY_" #NAME, DT_UNARY_##NAME);
    DT_UNARY_LIST(ADD_UNARY)
#undef ADD_UNARY
#define ADD_BINARY(NAME, name) PyModule_AddIntConstant(m, "BINARY_" #NAME, DT_BINARY_##NAME);
    DT_BINARY_LIST(ADD_BINARY)
#undef ADD_BINARY
#define ADD_REDUCE(NAME, name) PyModule_AddIntConstant(m, "REDUCE_" #NAME, DT_REDUCE_##NAME);
    DT_REDUCE_LIST(ADD_REDUCE)
#undef ADD_REDUCE
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "STRATEGY_" #NAME, DT_STRATEGY_##NAME);
    DT_STRATEGY_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "ACTIVATION_" #NAME, DT_ACTIVATION_##NAME);
    DT_ACTIVATION_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "LOSS_" #NAME, DT_LOSS_##NAME);
    DT_LOSS_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "INIT_" #NAME, DT_INITIALIZER_##NAME);
    DT_INITIALIZER_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "OPTIMIZER_" #NAME, DT_OPTIMIZER_##NAME);
    DT_OPTIMIZER_LIST(ADD_ENUM)
#undef ADD_ENUM
    PyModule_AddStringConstant(m, "VERSION", dt_version());
    PyModule_AddIntConstant(m, "DEVICE_CPU", DT_DEVICE_CPU);
    PyModule_AddIntConstant(m, "DEVICE_CUDA", DT_DEVICE_CUDA);
    if (add_transformer_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ---- fused attention and the transformer sharding presets ---------------------------------
 * One block: apply() hands it the op "attention"; the module's init adds its functions. */

/* apply("attention", [q, k, v], mesh, layout, program, causal, scale): dt_attention, reached
 * through apply so that tapes and traced functions replay it as any other op (scale <= 0:
 * 1 / sqrt(E)). */
static PyObject *apply_attention(PyObject *args)
{
    const char *op;
    PyObject *ts_o, *mesh_o, *text_o;
    int program, causal;
    double scale;
    if (!PyArg_ParseTuple(args, "sOOOpid:attention", &op, &ts_o, &mesh_o, &text_o, &program,
                          &causal, &scale))
        return NULL;
    const char *text = text_o == Py_None ? NULL : PyUnicode_AsUTF8(text_o);
    if (text_o != Py_None && !text)
        return NULL;
    Py_ssize_t n = seq_size(ts_o);
    if (n != 3) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "attention: %zd operands, expected 3 (q, k, v)", n);
        return NULL;
    }
    const dt_tensor *ts[3];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = seq_item(ts_o, i);
        ts[i] = h ? unwrap(h, KIND_TENSOR) : NULL;
        Py_XDECREF(h);
        if (!ts[i])
            return NULL;
    }
    op_ctx c;
    if (ctx_open(&c, mesh_o, text, program) < 0)
        return NULL;
    dt_op_options o = ctx_options(&c, 0, 0);
    dt_tensor *t = NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = dt_attention(ts[0], ts[1], ts[2], causal, scale, &o, &t);
    Py_END_ALLOW_THREADS;
    return ctx_close(&c, s, t);
}

/* preset_mesh(preset, model_size, device_type): the preset's mesh "batch" x "model" over every
 * device of the type (collective). */
static PyObject *py_preset_mesh(PyObject *self, PyObject *args)
{
    (void)self;
    int p, model, type;
    if (!PyArg_ParseTuple(args, "iii", &p, &model, &type))
        return NULL;
    dt_mesh *m = NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = dt_strategy_preset_mesh((dt_strategy_preset)p, model, (dt_device_type)type, &m);
    Py_END_ALLOW_THREADS;
    return s == DT_OK ? wrap(KIND_MESH, m) : raise_status(s);
}

/* preset_parameter_layout(preset, mesh, role, shape) -> (stored layout text, used layout text) */
static PyObject *py_preset_parameter_layout(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o;
    int p, role, rank;
    if (!PyArg_ParseTuple(args, "iOiO", &p, &mesh_o, &role, &shape_o))
        return NULL;
    const dt_mesh *m = unwrap(mesh_o, KIND_MESH);
    int64_t shape[DT_MAX_RANK];
    if (!m || parse_ints(shape_o, DT_MAX_RANK, shape, &rank) < 0)
        return NULL;
    dt_layout stored, used;
    char st[DT_STRING_MAX], ut[DT_STRING_MAX];
    CALL(dt_strategy_preset_parameter_layout((dt_strategy_preset)p, m, (dt_param_role)role, rank,
                                             shape, &stored, &used));
    CALL(dt_layout_to_string(&stored, st, sizeof st));
    CALL(dt_layout_to_string(&used, ut, sizeof ut));
    return Py_BuildValue("(ss)", st, ut);
}

/* preset_sequence_layout(mesh, rank) -> the layout text of activations [batch, sequence, ...] */
static PyObject *py_preset_sequence_layout(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o;
    int rank;
    if (!PyArg_ParseTuple(args, "Oi", &mesh_o, &rank))
        return NULL;
    const dt_mesh *m = unwrap(mesh_o, KIND_MESH);
    if (!m)
        return NULL;
    dt_layout l;
    char text[DT_STRING_MAX];
    CALL(dt_strategy_preset_sequence_layout(m, rank, &l));
    CALL(dt_layout_to_string(&l, text, sizeof text));
    return PyUnicode_FromString(text);
}

static PyMethodDef transformer_methods[] = {
    {"preset_mesh", py_preset_mesh, METH_VARARGS, NULL},
    {"preset_parameter_layout", py_preset_parameter_layout, METH_VARARGS, NULL},
    {"preset_sequence_layout", py_preset_sequence_layout, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

/* The block's functions and the PRESET_* and PARAM_* constants, added to the module m. */
static int add_transformer_functions(PyObject *m)
{
    if (PyModule_AddFunctions(m, transformer_methods) < 0)
        return -1;
#define ADD_ENUM(NAME, name)                                                        \
    if (PyModule_AddIntConstant(m, "PRESET_" #NAME, DT_STRATEGY_PRESET_##NAME) < 0) \
        return -1;
    DT_STRATEGY_PRESET_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name)                                             \
    if (PyModule_AddIntConstant(m, "PARAM_" #NAME, DT_PARAM_##NAME) < 0) \
        return -1;
    DT_PARAM_ROLE_LIST(ADD_ENUM)
#undef ADD_ENUM
    return 0;
}
