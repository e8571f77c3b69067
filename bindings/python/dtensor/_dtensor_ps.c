/* dtensor._dtensor: Checkpoints and the parameter server (coordinator, remote values, ps
 * variables). */
#include "_dtensor.h"

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
            dt_variable *v = dtpy_unwrap(h, KIND_VARIABLE);
            ok = v && ((s = dt_checkpoint_add_variable(c, name, v)), true);
        } else if (ok && !strcmp(kind, "model")) {
            dt_model *m = dtpy_unwrap(h, KIND_MODEL);
            ok = m && ((s = dt_checkpoint_add_model(c, name, m)), true);
        } else if (ok && !strcmp(kind, "optimizer")) {
            dt_optimizer *o = dtpy_unwrap(h, KIND_OPTIMIZER);
            ok = o && ((s = dt_checkpoint_add_optimizer(c, name, o)), true);
        } else if (ok && !strcmp(kind, "generator")) {
            dt_generator *g = dtpy_unwrap(h, KIND_GENERATOR);
            ok = g && ((s = dt_checkpoint_add_generator(c, name, g)), true);
        } else if (ok && !strcmp(kind, "tensor")) {
            const dt_tensor *t = dtpy_unwrap(h, KIND_TENSOR);
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
        dtpy_raise(s);
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
    if (dtpy_parse_layout(mesh_o, text, &l) < 0)
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_checkpoint_read_tensor(path, name, &l, &t));
    return dtpy_wrap(KIND_TENSOR, t);
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
    dt_strategy *st;
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "O&O", dtpy_to_strategy, &st, &fn))
        return NULL;
    dt_ps_coordinator *c = NULL;
    CALL(dt_ps_coordinator_create(st, ps_trampoline, fn, &c));
    return dtpy_wrap(KIND_COORDINATOR, c);
}

static PyObject *py_ps_schedule(PyObject *self, PyObject *args)
{
    (void)self;
    dt_ps_coordinator *c;
    long long step;
    if (!PyArg_ParseTuple(args, "O&L", dtpy_to_coordinator, &c, &step))
        return NULL;
    dt_remote_value *v = NULL;
    CALL(dt_ps_schedule(c, step, &v));
    return dtpy_wrap(KIND_REMOTE, v);
}

/* remote_fetch(v) -> (value, worker, attempts) */
static PyObject *py_remote_fetch(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_remote_value *v = dtpy_unwrap(arg, KIND_REMOTE);
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
    dt_ps_coordinator *c = dtpy_unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    int n = 0;
    CALL(dt_ps_pending(c, &n));
    return PyLong_FromLong(n);
}

static PyObject *py_ps_join_all(PyObject *self, PyObject *arg)
{
    (void)self;
    dt_ps_coordinator *c = dtpy_unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    CALL(dt_ps_join_all(c));
    Py_RETURN_NONE;
}

/* ps_variable_create(strategy, tensor): a variable on the ps tasks. Collective. */
static PyObject *py_ps_variable_create(PyObject *self, PyObject *args)
{
    (void)self;
    dt_strategy *st;
    dt_tensor *t;
    if (!PyArg_ParseTuple(args, "O&O&", dtpy_to_strategy, &st, dtpy_to_tensor, &t))
        return NULL;
    dt_ps_variable *v = NULL;
    CALL(dt_ps_variable_create(st, t, &v));
    return dtpy_wrap(KIND_PS_VARIABLE, v);
}

/* ps_variable_io(variable, buffer, add): read into a writable buffer, or add a buffer. */
static PyObject *py_ps_variable_io(PyObject *self, PyObject *args)
{
    (void)self;
    dt_ps_variable *v;
    Py_buffer buf;
    int add;
    if (!PyArg_ParseTuple(args, "O&w*p", dtpy_to_ps_variable, &v, &buf, &add))
        return NULL;
    dt_status s;
    Py_BEGIN_ALLOW_THREADS;
    s = add ? dt_ps_variable_add(v, buf.buf, (size_t)buf.len)
            : dt_ps_variable_read(v, buf.buf, (size_t)buf.len);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&buf);
    if (s != DT_OK)
        return dtpy_raise(s);
    Py_RETURN_NONE;
}

/* ps_variable_fetch_add(variable, delta, old): add delta, the value before it into old. */
static PyObject *py_ps_variable_fetch_add(PyObject *self, PyObject *args)
{
    (void)self;
    dt_ps_variable *v;
    Py_buffer delta, old;
    if (!PyArg_ParseTuple(args, "O&y*w*", dtpy_to_ps_variable, &v, &delta, &old))
        return NULL;
    dt_status s = DT_OK;
    if (delta.len != old.len) {
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
        return dtpy_raise(s);
    Py_RETURN_NONE;
}

/* ps_variable_shards(variable) -> [(ps task, row0, rows), ...] */
static PyObject *py_ps_variable_shards(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_ps_variable *v = dtpy_unwrap(arg, KIND_PS_VARIABLE);
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
    dt_ps_coordinator *c = dtpy_unwrap(arg, KIND_COORDINATOR);
    if (!c)
        return NULL;
    ((Handle *)arg)->ptr = NULL;
    CALL(dt_ps_coordinator_shutdown(c));
    Py_RETURN_NONE;
}

static PyObject *py_ps_pull(PyObject *self, PyObject *args)
{
    (void)self;
    dt_strategy *st;
    dt_model *m;
    if (!PyArg_ParseTuple(args, "O&O&", dtpy_to_strategy, &st, dtpy_to_model, &m))
        return NULL;
    CALL(dt_ps_pull(st, m));
    Py_RETURN_NONE;
}

PyMethodDef dtpy_ps_methods[] = {
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
    {"checkpoint_io", py_checkpoint_io, METH_VARARGS, "Write or read a checkpoint. Collective."},
    {"checkpoint_read_tensor", py_checkpoint_read_tensor, METH_VARARGS,
     "A tensor of a checkpoint in a layout. Collective."},
    {"checkpoint_tensor_info", py_checkpoint_tensor_info, METH_VARARGS,
     "(dtype, shape) of a tensor in a checkpoint."},
    {"checkpoint_latest", py_checkpoint_latest, METH_O, "The newest ckpt-N.h5 in a directory."},
    {NULL, NULL, 0, NULL},
};
