/* dtensor._dtensor: the module itself, its exception, Handle type and constants; its functions
 * come from the method tables of the other C files (_dtensor.h). */
#include "_dtensor.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_dtensor",
    "The C layer of the dtensor package.",
    -1,
    NULL, /* the functions are added by table, one per file */
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__dtensor(void)
{
    if (PyType_Ready(&dtpy_handle_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    dtpy_error = PyErr_NewExceptionWithDoc(
        "dtensor.DTensorError",
        "A dtensor call failed; .status names the status code, .code is its value.",
        PyExc_RuntimeError, NULL);
    Py_INCREF(&dtpy_handle_type);
    if (!dtpy_error || PyModule_AddObject(m, "DTensorError", dtpy_error) < 0 ||
        PyModule_AddObject(m, "Handle", (PyObject *)&dtpy_handle_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(dtpy_error);
    dtpy_error_classes = PyDict_New();
    if (!dtpy_error_classes || PyModule_AddObject(m, "error_classes", dtpy_error_classes) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(dtpy_error_classes);
    PyMethodDef *tables[] = {dtpy_runtime_methods, dtpy_tensor_methods, dtpy_ops_methods,
                             dtpy_train_methods,   dtpy_ps_methods,     dtpy_preset_methods};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
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
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "PRESET_" #NAME, DT_STRATEGY_PRESET_##NAME);
    DT_STRATEGY_PRESET_LIST(ADD_ENUM)
#undef ADD_ENUM
#define ADD_ENUM(NAME, name) PyModule_AddIntConstant(m, "PARAM_" #NAME, DT_PARAM_##NAME);
    DT_PARAM_ROLE_LIST(ADD_ENUM)
#undef ADD_ENUM
    PyModule_AddStringConstant(m, "VERSION", dt_version());
    PyModule_AddIntConstant(m, "DEVICE_CPU", DT_DEVICE_CPU);
    PyModule_AddIntConstant(m, "DEVICE_CUDA", DT_DEVICE_CUDA);
    return m;
}
