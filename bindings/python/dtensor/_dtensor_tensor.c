/* dtensor._dtensor: Tensors: made from host buffers and components, read back, and lent or borrowed
 * through DLPack without a copy. */
#include "_dtensor.h"

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
    if (dtpy_parse_layout(mesh_o, text, &l) == 0 && dtpy_parse_shape(shape_o, l.rank, shape) == 0) {
        dt_tensor *t = NULL;
        dt_status s;
        Py_BEGIN_ALLOW_THREADS;
        s = dt_tensor_from_host(&l, (dt_dtype)dtype, l.rank, shape, buf.buf, (size_t)buf.len, &t);
        Py_END_ALLOW_THREADS;
        result = s == DT_OK ? dtpy_wrap(KIND_TENSOR, t) : dtpy_raise(s);
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
    if (dtpy_parse_layout(mesh_o, text, &l) < 0 || dtpy_parse_shape(shape_o, l.rank, shape) < 0)
        return NULL;
    Py_ssize_t n = dtpy_seq_size(bufs_o);
    if (n < 0 || dtpy_seq_size(shapes_o) != n) {
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
        PyObject *b = dtpy_seq_item(bufs_o, got), *sh = dtpy_seq_item(shapes_o, got);
        int ok = b && sh && PyObject_GetBuffer(b, &views[got], PyBUF_C_CONTIGUOUS) == 0;
        if (ok && dtpy_parse_shape(sh, l.rank, shapes + got * DT_MAX_RANK) < 0) {
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
    result = s == DT_OK ? dtpy_wrap(KIND_TENSOR, t) : dtpy_raise(s);
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
    const dt_tensor *t = dtpy_unwrap(arg, KIND_TENSOR);
    if (!t)
        return NULL;
    char text[DT_STRING_MAX];
    CALL(dt_layout_to_string(dt_tensor_layout(t), text, sizeof text));
    /* A symbolic tensor (recorded in a function being traced) holds no shards: None, told
     * apart from a tensor with values on a client holding none of its mesh's devices ([]). */
    int rank = dt_tensor_rank(t), symbolic = dt_tensor_is_symbolic(t),
        nl = symbolic ? 0 : dt_mesh_num_local_devices(dt_tensor_mesh(t));
    PyObject *shape = PyTuple_New(rank), *locals = Py_None;
    if (symbolic)
        Py_INCREF(locals);
    else
        locals = PyList_New(nl);
    if (!shape || !locals)
        goto fail;
    for (int i = 0; i < rank; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(dt_tensor_shape(t)[i]));
    for (int d = 0; d < nl; d++) {
        int64_t local[DT_MAX_RANK];
        dt_status s = dt_tensor_local_shape(t, d, local);
        if (s != DT_OK) {
            dtpy_raise(s);
            goto fail;
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
    const dt_tensor *t = dtpy_unwrap(arg, KIND_TENSOR);
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
    bool variable =
        PyObject_TypeCheck(t_o, &dtpy_handle_type) && ((Handle *)t_o)->kind == KIND_VARIABLE;
    const dt_variable *v = variable ? dtpy_unwrap(t_o, KIND_VARIABLE) : NULL;
    const dt_tensor *t =
        variable ? (v ? dt_variable_value(v) : NULL) : dtpy_unwrap(t_o, KIND_TENSOR);
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
        return dtpy_raise(s);
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
        dtpy_handle_release(h);
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
    PyObject *t_o; /* the handle, which the capsule keeps */
    int i;
    if (!PyArg_ParseTuple(args, "Oi", &t_o, &i))
        return NULL;
    const dt_tensor *t = dtpy_unwrap(t_o, KIND_TENSOR);
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
    dt_mesh *m;
    int i;
    if (!PyArg_ParseTuple(args, "O&i", dtpy_to_mesh, &m, &i))
        return NULL;
    return PyLong_FromVoidPtr(dt_mesh_local_stream(m, i));
}

/* tensor_dlpack_device(tensor, i): (DLPack device type, device id) of component i. */
static PyObject *py_tensor_dlpack_device(PyObject *self, PyObject *args)
{
    (void)self;
    dt_tensor *t;
    int i;
    if (!PyArg_ParseTuple(args, "O&i", dtpy_to_tensor, &t, &i))
        return NULL;
    dt_local_buffer b;
    CALL(dt_tensor_local_buffer(t, i, &b));
    return Py_BuildValue("(ii)", b.type == DT_DEVICE_CUDA ? DL_CUDA : DL_CPU, b.device_ordinal);
}

/* The DLManagedTensors a wrapped DTensor borrowed: handed back when it is freed. */
typedef struct {
    int n;
    int taken; /* 0 while the dtpy_wrap may still be undone (the capsules keep their tensors) */
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
    if (dtpy_parse_layout(mesh_o, text, &l) < 0 || dtpy_parse_shape(shape_o, l.rank, shape) < 0)
        return NULL;
    Py_ssize_t n = dtpy_seq_size(caps_o);
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
        caps[i] = dtpy_seq_item(caps_o, i);
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
        dtpy_raise(s);
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
    result = dtpy_wrap(KIND_TENSOR, t);
done:
    for (Py_ssize_t i = 0; caps && i < n; i++)
        Py_XDECREF(caps[i]);
    PyMem_Free(caps);
    PyMem_Free(bufs);
    PyMem_Free(bytes);
    PyMem_Free(c);
    return result;
}

PyMethodDef dtpy_tensor_methods[] = {
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
    {"print_ordered", py_print_ordered, METH_VARARGS, "Client 0 prints all, in client order."},
    {NULL, NULL, 0, NULL},
};
