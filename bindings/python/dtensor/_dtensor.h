/* dtensor._dtensor, the thin CPython layer under the `dtensor` package: what its C files share.
 * It holds meshes, tensors and the library's other objects as Handle objects and moves data
 * through the buffer protocol with no copies beyond the one into or out of device memory.
 * Everything Pythonic lives in the package's Python modules. The module's functions are in
 * _dtensor_mesh.c (runtime, meshes, layouts, the ledger), _dtensor_tensor.c (tensors, DLPack),
 * _dtensor_ops.c (ops), _dtensor_train.c (functions, variables, strategies, models, optimizers,
 * generators), _dtensor_ps.c (checkpoints, parameter server) and _dtensor_presets.c (the
 * transformer sharding presets), each file's in its method table below; _dtensor.c makes the
 * module; _dtensor_common.c defines what is declared here. */
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dtensor.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------------- */

/* dtensor.DTensorError, and "DT_ERR_..." -> the exception class raised for that status
 * (TensorFlow's error classes, all subclasses of DTensorError); the package fills the dict, a
 * status missing from it raises DTensorError itself. */
extern PyObject *dtpy_error;
extern PyObject *dtpy_error_classes;

/* Raise the status's class with the message, .status = "DT_ERR_..." and .code = int; NULL. */
PyObject *dtpy_raise(dt_status s);

/* Run a dtensor call without the GIL (collectives wait on other clients) and raise on
 * failure. */
#define CALL(expr)                 \
    do {                           \
        dt_status s_;              \
        Py_BEGIN_ALLOW_THREADS;    \
        s_ = (expr);               \
        Py_END_ALLOW_THREADS;      \
        if (s_ != DT_OK)           \
            return dtpy_raise(s_); \
    } while (0)

/* ---- handles: an owned dt_mesh, dt_tensor, ... -------------------------------------------- */

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

extern PyTypeObject dtpy_handle_type;

/* Free a handle's object now, or when the last DLPack consumer of a tensor's memory is done. */
void dtpy_handle_release(Handle *h);
/* A new handle owning ptr (freed when the handle is: also when this fails). */
PyObject *dtpy_wrap(int kind, void *ptr);
/* The object of a live handle of the kind; NULL with TypeError (another kind) or ValueError
 * (freed). */
void *dtpy_unwrap(PyObject *o, int kind);
/* A borrowed handle of a strategy's mesh (freed with the strategy). */
PyObject *dtpy_borrowed_mesh(const dt_mesh *m);

/* The argument prologue of the module's functions: PyArg_ParseTuple converters ("O&") of
 * handles, each giving the object of a live handle of its kind (`dt_tensor *t; ...
 * PyArg_ParseTuple(args, "O&i", dtpy_to_tensor, &t, &i)`), or failing as dtpy_unwrap. */
int dtpy_to_mesh(PyObject *o, void *out);        /* dt_mesh ** */
int dtpy_to_tensor(PyObject *o, void *out);      /* dt_tensor ** */
int dtpy_to_function(PyObject *o, void *out);    /* dt_function ** */
int dtpy_to_variable(PyObject *o, void *out);    /* dt_variable ** */
int dtpy_to_strategy(PyObject *o, void *out);    /* dt_strategy ** */
int dtpy_to_model(PyObject *o, void *out);       /* dt_model ** */
int dtpy_to_optimizer(PyObject *o, void *out);   /* dt_optimizer ** */
int dtpy_to_coordinator(PyObject *o, void *out); /* dt_ps_coordinator ** */
int dtpy_to_remote(PyObject *o, void *out);      /* dt_remote_value ** */
int dtpy_to_ps_variable(PyObject *o, void *out); /* dt_ps_variable ** */
int dtpy_to_generator(PyObject *o, void *out);   /* dt_generator ** */

/* ---- sequences, shapes and layouts -------------------------------------------------------- */

/* PySequence_Size and PySequence_GetItem whose failures raise TypeError or ValueError. */
Py_ssize_t dtpy_seq_size(PyObject *o);
PyObject *dtpy_seq_item(PyObject *o, Py_ssize_t i);
/* At most max integers of a sequence into out[], their count into *n; -1 with an exception. */
int dtpy_parse_ints(PyObject *o, int max, int64_t out[], int *n);
/* A shape of exactly `rank` extents. */
int dtpy_parse_shape(PyObject *o, int rank, int64_t shape[]);
/* The layout of a text on a mesh handle; -1 with an exception. */
int dtpy_parse_layout(PyObject *mesh_o, const char *text, dt_layout *out);

/* Most tensors a function's inputs or outputs (or an optimizer update) pass at once. */
#define MAX_FN_TENSORS 1024

/* At most max tensor handles of a sequence as tensors; -1 with an exception. */
int dtpy_collect_tensors(PyObject *seq, const dt_tensor **out, int max, int *n);

/* ---- the context of an op: an optional requested layout and the program asked for -------- */

typedef struct {
    dt_layout layout;
    bool given;
    bool program;
    char *text; /* the expanded program, when asked for */
    size_t len;
    FILE *f;
} op_ctx;

/* The requested layout (mesh handle and text, or None) and whether the program is asked for. */
int dtpy_ctx_open(op_ctx *c, PyObject *mesh_o, const char *text, int program);
dt_op_options dtpy_ctx_options(const op_ctx *c, int ta, int tb);
/* Wrap an op's result: a handle, or (handle, program text) when the program was asked for. */
PyObject *dtpy_ctx_close(op_ctx *c, dt_status s, dt_tensor *t);

/* ---- the module's functions, by file --------------------------------------------------- */

extern PyMethodDef dtpy_runtime_methods[]; /* _dtensor_mesh.c */
extern PyMethodDef dtpy_tensor_methods[];
extern PyMethodDef dtpy_ops_methods[];
extern PyMethodDef dtpy_train_methods[];
extern PyMethodDef dtpy_ps_methods[];
extern PyMethodDef dtpy_preset_methods[]; /* _dtensor_presets.c */
