/* libFuzzer target: the Python extension's argument converters (bindings/python/dtensor/
 * _dtensor.c: shapes, layouts, axis and permutation lists, tensor lists, handles, buffers).
 * The extension module is linked in and imported by an embedded interpreter; each input picks
 * a module function and decodes its arguments into Python objects (None, booleans, integers of
 * every size, floats with NaN and infinities, text with NUL and any byte, bytes, bytearrays,
 * lists and tuples nested a few deep, typed buffers of any format and shape, and the handles
 * of meshes and tensors made at start). The call must return a value, or raise TypeError,
 * ValueError, OverflowError (Python's own integer parsing), BufferError, MemoryError or the
 * library's DTensorError: any other exception (SystemError: an error returned without an
 * exception set; IndexError, AttributeError, ZeroDivisionError, KeyError) aborts, as does a
 * crash or a sanitizer report. Allocations over 64 MiB fail (DT_ERR_NOMEM), so a huge shape
 * costs an error, not the fuzzer's memory. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dtensor.h>

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

PyMODINIT_FUNC PyInit__dtensor(void);
void dt__device_fail_allocs_over(size_t bytes); /* the library's test hook */

/* The functions fuzzed: every converter-bearing entry point that returns without other
 * clients or callbacks (the parameter server's and the runtime's start and stop are left out). */
static const char *const names[] = {
    "layout_check",
    "layout_local_shape",
    "tensor_from_host",
    "tensor_pack",
    "tensor_to_host",
    "tensor_info",
    "tensor_meta",
    "create",
    "apply",
    "mesh_create",
    "mesh_create_local",
    "mesh_info",
    "client_allgather",
    "global_device_id",
    "mesh_set_algorithm",
    "ledger",
    "variable_create",
    "variable_assign",
    "variable_read",
    "strategy_create",
    "model_create",
    "optimizer_create",
    "optimizer_exclude_from_weight_decay",
    "tensor_dlpack",
    "tensor_dlpack_device",
    "tensor_from_dlpack",
    "function_input",
    "function_end",
    "function_run",
};
#define NFN ((int)(sizeof names / sizeof names[0]))

/* Words the converters look for, so that the fuzzer reaches past the first check. */
static const char *const words[] = {
    "x",      "y",           "unsharded", "x,unsharded", "unsharded,x", "x,y",      "y,x",
    "fill",   "arange",      "uniform",   "normal",      "matmul",      "unary",    "binary",
    "reduce", "transpose",   "reshape",   "slice",       "concat",      "relayout", "copy_to_mesh",
    "ring",   "nccl",        "auto",      "sgd",         "adam",        "json",     "table",
    "x=2",    "partial_sum", "",          "a\0b",
};
#define NWORDS ((int)(sizeof words / sizeof words[0]))

static PyObject *module, *fns[NFN], *handles[8], *dtensor_error;
static int nhandles;

typedef struct reader {
    const uint8_t *p;
    size_t n;
    int objects;
} reader;

static uint8_t next(reader *r)
{
    if (!r->n)
        return 0;
    r->n--;
    return *r->p++;
}

static uint64_t next_bytes(reader *r, int k)
{
    uint64_t v = 0;
    for (int i = 0; i < k; i++)
        v = v << 8 | next(r);
    return v;
}

static PyObject *decode(reader *r, int depth);

static PyObject *sequence(reader *r, int depth, bool tuple)
{
    int n = next(r) % 10;
    PyObject *o = tuple ? PyTuple_New(n) : PyList_New(n);
    for (int i = 0; o && i < n; i++) {
        PyObject *v = decode(r, depth + 1);
        if (!v) {
            Py_DECREF(o);
            return NULL;
        }
        if (tuple)
            PyTuple_SET_ITEM(o, i, v);
        else
            PyList_SET_ITEM(o, i, v);
    }
    return o;
}

/* A typed buffer: memoryview(bytes).cast(format, shape), or None when that refuses. */
static PyObject *buffer(reader *r)
{
    static const char *const formats[] = {"f", "d", "i", "q", "b", "B", "h", "?"};
    const char *fmt = formats[next(r) % 8];
    int rank = next(r) % 4;
    Py_ssize_t dims[3], count = 1;
    for (int i = 0; i < rank; i++) {
        dims[i] = next(r) % 6;
        count *= dims[i];
    }
    Py_ssize_t es = strchr("dq", fmt[0]) ? 8 : strchr("fi", fmt[0]) ? 4 : fmt[0] == 'h' ? 2 : 1;
    size_t bytes = (size_t)(count * es);
    char *raw = calloc(bytes + 1, 1);
    for (size_t i = 0; raw && i < bytes; i++)
        raw[i] = (char)next(r);
    PyObject *b = raw ? PyByteArray_FromStringAndSize(raw, (Py_ssize_t)bytes) : NULL;
    free(raw);
    PyObject *mv = b ? PyMemoryView_FromObject(b) : NULL;
    Py_XDECREF(b);
    PyObject *shape = PyTuple_New(rank), *cast = NULL;
    for (int i = 0; shape && i < rank; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromSsize_t(dims[i]));
    if (mv && shape)
        cast = rank ? PyObject_CallMethod(mv, "cast", "sO", fmt, shape)
                    : PyObject_CallMethod(mv, "cast", "s", fmt);
    Py_XDECREF(mv);
    Py_XDECREF(shape);
    if (!cast) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return cast;
}

static PyObject *decode(reader *r, int depth)
{
    if (++r->objects > 64 || depth > 3)
        Py_RETURN_NONE;
    switch (next(r) % 16) {
    case 0:
        Py_RETURN_NONE;
    case 1:
        return PyBool_FromLong(next(r) & 1);
    case 2:
        return PyLong_FromLong((int8_t)next(r));
    case 3:
        return PyLong_FromLong((int32_t)next_bytes(r, 4));
    case 4:
        return PyLong_FromLongLong((long long)next_bytes(r, 8));
    case 5: { /* an integer of up to 32 bytes, either sign */
        uint8_t buf[32];
        int k = 1 + next(r) % 32;
        for (int i = 0; i < k; i++)
            buf[i] = next(r);
        return _PyLong_FromByteArray(buf, (size_t)k, 1, 1);
    }
    case 6: {
        uint64_t w = next_bytes(r, 8);
        double d;
        memcpy(&d, &w, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case 7: { /* any bytes as text, NUL included */
        char buf[64];
        int k = next(r) % 64;
        for (int i = 0; i < k; i++)
            buf[i] = (char)next(r);
        return PyUnicode_DecodeLatin1(buf, k, NULL);
    }
    case 8: {
        int w = next(r) % NWORDS;
        return PyUnicode_FromStringAndSize(words[w],
                                           w == NWORDS - 1 ? 3 : (Py_ssize_t)strlen(words[w]));
    }
    case 9:
    case 10: { /* bytes, or a (writable) bytearray */
        char buf[64];
        bool array = r->n && (r->p[-1] % 16) == 10;
        int k = next(r) % 64;
        for (int i = 0; i < k; i++)
            buf[i] = (char)next(r);
        return array ? PyByteArray_FromStringAndSize(buf, k) : PyBytes_FromStringAndSize(buf, k);
    }
    case 11:
        return sequence(r, depth, false);
    case 12:
        return sequence(r, depth, true);
    case 13:
    case 14: {
        PyObject *h = handles[next(r) % nhandles];
        Py_INCREF(h);
        return h;
    }
    default:
        return buffer(r);
    }
}

static PyObject *call(const char *name, const char *fmt, ...)
{
    PyObject *f = PyObject_GetAttrString(module, name);
    va_list ap;
    va_start(ap, fmt);
    PyObject *args = Py_VaBuildValue(fmt, ap);
    va_end(ap);
    PyObject *r = f && args ? PyObject_CallObject(f, args) : NULL;
    Py_XDECREF(f);
    Py_XDECREF(args);
    if (!r) {
        PyErr_Print();
        abort();
    }
    return r;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
    if (PyImport_AppendInittab("_dtensor", PyInit__dtensor) < 0)
        abort();
    Py_Initialize();
    module = PyImport_ImportModule("_dtensor");
    if (!module) {
        PyErr_Print();
        abort();
    }
    for (int i = 0; i < NFN; i++)
        if (!(fns[i] = PyObject_GetAttrString(module, names[i]))) {
            PyErr_Print();
            abort();
        }
    dtensor_error = PyObject_GetAttrString(module, "DTensorError");
    Py_DECREF(call("init", "(ii)", 2, 0));
    dt__device_fail_allocs_over((size_t)64 << 20);
    /* handles: two meshes, tensors of a few dtypes and layouts on them */
    PyObject *m1 = call("mesh_create", "((s)(i)i)", "x", 2, DT_DEVICE_CPU);
    PyObject *m2 = call("mesh_create", "((ss)(ii)i)", "x", "y", 2, 1, DT_DEVICE_CPU);
    handles[nhandles++] = m1;
    handles[nhandles++] = m2;
    handles[nhandles++] =
        call("create", "(sOsi(i)ddKKi)", "fill", m1, "x", DT_DTYPE_F32, 4, 1.5, 0.0, 0ull, 0ull, 0);
    handles[nhandles++] = call("create", "(sOsi(ii)ddKKi)", "uniform", m2, "x,y", DT_DTYPE_F64, 2,
                               3, 0.0, 1.0, 7ull, 0ull, 0);
    handles[nhandles++] = call("create", "(sOsi(ii)ddKKi)", "fill", m2, "unsharded,x", DT_DTYPE_I32,
                               3, 2, 2.0, 0.0, 0ull, 0ull, 0);
    handles[nhandles++] =
        call("create", "(sOsi()ddKKi)", "fill", m1, "", DT_DTYPE_I64, 3.0, 0.0, 0ull, 0ull, 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    int which = next(&r) % NFN;
    PyObject *f = fns[which];
    int nargs = next(&r) % 12;
    PyObject *args = PyTuple_New(nargs);
    for (int i = 0; args && i < nargs; i++) {
        PyObject *v = decode(&r, 0);
        if (!v)
            abort(); /* the decoder only builds objects that cannot fail */
        PyTuple_SET_ITEM(args, i, v);
    }
    PyObject *res = PyObject_CallObject(f, args);
    Py_DECREF(args);
    if (res) {
        if (PyErr_Occurred()) { /* a value returned with an exception set */
            PyErr_Print();
            abort();
        }
        Py_DECREF(res);
        return 0;
    }
    if (!PyErr_Occurred())
        abort();
    if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError) &&
        !PyErr_ExceptionMatches(PyExc_OverflowError) &&
        !PyErr_ExceptionMatches(PyExc_BufferError) && !PyErr_ExceptionMatches(PyExc_MemoryError) &&
        !PyErr_ExceptionMatches(dtensor_error)) {
        fprintf(stderr, "fuzz_python: %s raised an exception outside the contract:\n",
                names[which]);
        PyErr_Print();
        abort();
    }
    PyErr_Clear();
    return 0;
}
