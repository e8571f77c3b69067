/* dtensor._dtensor: The runtime, meshes, layouts, collective algorithms and the communication
 * ledger. */
#include "_dtensor.h"

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
        return dtpy_raise(s);
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
        return dtpy_raise(s);
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
    Py_ssize_t n = dtpy_seq_size(names_o);
    if (n < 0 || dtpy_seq_size(sizes_o) != n || n > DT_MAX_MESH_AXES) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mesh: %zd names and %zd sizes (at most %d axes)", n,
                         dtpy_seq_size(sizes_o), DT_MAX_MESH_AXES);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        keep[i] = dtpy_seq_item(names_o, i);
        PyObject *size = dtpy_seq_item(sizes_o, i);
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
    Py_ssize_t num_ids = ids_o == Py_None ? -1 : dtpy_seq_size(ids_o);
    int *ids = num_ids > 0 ? PyMem_Calloc((size_t)num_ids, sizeof *ids) : NULL;
    if (ids_o != Py_None && (num_ids < 1 || num_ids > INT32_MAX || !ids)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "mesh: %zd device ids", num_ids);
        goto done;
    }
    for (Py_ssize_t i = 0; i < num_ids; i++) {
        PyObject *id = dtpy_seq_item(ids_o, i);
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
        dtpy_raise(s);
        goto done;
    }
    result = dtpy_wrap(KIND_MESH, m);
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
        dtpy_raise(s);
        goto done;
    }
    result = dtpy_wrap(KIND_MESH, m);
done:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(keep[i]);
    return result;
}

static PyObject *py_mesh_info(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_mesh *m = dtpy_unwrap(arg, KIND_MESH);
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

/* Canonical text of a layout, checked: ("x,unsharded", rank). */
static PyObject *py_layout_check(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o;
    const char *text;
    if (!PyArg_ParseTuple(args, "Os", &mesh_o, &text))
        return NULL;
    dt_layout l;
    if (dtpy_parse_layout(mesh_o, text, &l) < 0)
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
    if (dtpy_parse_layout(mesh_o, text, &l) < 0)
        return NULL;
    int64_t shape[DT_MAX_RANK], local[DT_MAX_RANK], off[DT_MAX_RANK];
    if (dtpy_parse_shape(shape_o, l.rank, shape) < 0)
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

/* ---- collectives and the ledger ---------------------------------------------------------- */

static PyObject *py_mesh_set_algorithm(PyObject *self, PyObject *args)
{
    (void)self;
    dt_mesh *m;
    const char *name;
    if (!PyArg_ParseTuple(args, "O&s", dtpy_to_mesh, &m, &name))
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
    PyObject *r =
        s == DT_OK ? PyUnicode_FromStringAndSize(text ? text : "", (Py_ssize_t)len) : dtpy_raise(s);
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

PyMethodDef dtpy_runtime_methods[] = {
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
    {"mesh_set_algorithm", py_mesh_set_algorithm, METH_VARARGS, "Collective algorithm by name."},
    {"ledger", py_ledger, METH_VARARGS, "The communication ledger as a table or JSON."},
    {"ledger_clear", py_ledger_clear, METH_NOARGS, "Drop every ledger entry."},
    {"ledger_next_step", py_ledger_next_step, METH_NOARGS, "Start a new ledger step."},
    {NULL, NULL, 0, NULL},
};
