/* dtensor._dtensor: the transformer sharding presets (data parallel, fully sharded, tensor
 * parallel, 2-D): their meshes and the layouts of parameters and activations, from the C
 * presets (dt_strategy_preset_*). */
#include "_dtensor.h"

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
    return s == DT_OK ? dtpy_wrap(KIND_MESH, m) : dtpy_raise(s);
}

/* preset_parameter_layout(preset, mesh, role, shape) -> (stored layout text, used layout text) */
static PyObject *py_preset_parameter_layout(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *mesh_o, *shape_o;
    int p, role, rank;
    if (!PyArg_ParseTuple(args, "iOiO", &p, &mesh_o, &role, &shape_o))
        return NULL;
    const dt_mesh *m = dtpy_unwrap(mesh_o, KIND_MESH);
    int64_t shape[DT_MAX_RANK];
    if (!m || dtpy_parse_ints(shape_o, DT_MAX_RANK, shape, &rank) < 0)
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
    const dt_mesh *m = dtpy_unwrap(mesh_o, KIND_MESH);
    if (!m)
        return NULL;
    dt_layout l;
    char text[DT_STRING_MAX];
    CALL(dt_strategy_preset_sequence_layout(m, rank, &l));
    CALL(dt_layout_to_string(&l, text, sizeof text));
    return PyUnicode_FromString(text);
}

PyMethodDef dtpy_preset_methods[] = {
    {"preset_mesh", py_preset_mesh, METH_VARARGS, "A preset's mesh over every device. Collective."},
    {"preset_parameter_layout", py_preset_parameter_layout, METH_VARARGS,
     "(stored, used) layout texts of a parameter."},
    {"preset_sequence_layout", py_preset_sequence_layout, METH_VARARGS,
     "The layout text of activations [batch, sequence, ...]."},
    {NULL, NULL, 0, NULL},
};
