/* dtensor._dtensor: Functions (tracing), variables, gradients, strategies, models, optimizers and
 * random generators. */
#include "_dtensor.h"

/* ---- functions (tracing) ----------------------------------------------------------------- */

static PyObject *py_function_begin(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    dt_function *f = NULL;
    CALL(dt_function_begin(&f));
    return dtpy_wrap(KIND_FUNCTION, f);
}

/* function_input(f, mesh, layout, dtype, shape) -> symbolic tensor */
static PyObject *py_function_input(PyObject *self, PyObject *args)
{
    (void)self;
    dt_function *f;
    PyObject *mesh_o, *shape_o;
    const char *text;
    int dtype;
    if (!PyArg_ParseTuple(args, "O&OsiO", dtpy_to_function, &f, &mesh_o, &text, &dtype, &shape_o))
        return NULL;
    dt_layout l;
    int64_t shape[DT_MAX_RANK];
    int rank;
    if (dtpy_parse_layout(mesh_o, text, &l) < 0 ||
        dtpy_parse_ints(shape_o, DT_MAX_RANK, shape, &rank))
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_function_input(f, &l, (dt_dtype)dtype, rank, shape, &t));
    return dtpy_wrap(KIND_TENSOR, t);
}

static PyObject *py_function_end(PyObject *self, PyObject *args)
{
    (void)self;
    dt_function *f;
    PyObject *outs_o;
    if (!PyArg_ParseTuple(args, "O&O", dtpy_to_function, &f, &outs_o))
        return NULL;
    const dt_tensor *outs[MAX_FN_TENSORS];
    int n;
    if (dtpy_collect_tensors(outs_o, outs, MAX_FN_TENSORS, &n) < 0)
        return NULL;
    CALL(dt_function_end(f, n, (dt_tensor *const *)outs));
    Py_RETURN_NONE;
}

/* function_run(f, inputs, num_outputs) -> [tensor handles] */
static PyObject *py_function_run(PyObject *self, PyObject *args)
{
    (void)self;
    dt_function *f;
    PyObject *ins_o;
    int nout;
    if (!PyArg_ParseTuple(args, "O&Oi", dtpy_to_function, &f, &ins_o, &nout))
        return NULL;
    const dt_tensor *ins[MAX_FN_TENSORS];
    int nin;
    if (dtpy_collect_tensors(ins_o, ins, MAX_FN_TENSORS, &nin) < 0)
        return NULL;
    if (nout < 0 || nout > MAX_FN_TENSORS) {
        PyErr_Format(PyExc_ValueError, "%d outputs, at most %d", nout, MAX_FN_TENSORS);
        return NULL;
    }
    dt_tensor *outs[MAX_FN_TENSORS] = {0};
    CALL(dt_function_run(f, nin, ins, nout, outs));
    PyObject *r = PyList_New(nout);
    for (int i = 0; i < nout; i++) {
        PyObject *h = r ? dtpy_wrap(KIND_TENSOR, outs[i]) : NULL;
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
    const dt_function *f = dtpy_unwrap(arg, KIND_FUNCTION);
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
                             : dtpy_raise(s);
    free(text);
    return r;
}

/* ---- variables --------------------------------------------------------------------------- */

static PyObject *py_variable_create(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_tensor *t = dtpy_unwrap(arg, KIND_TENSOR);
    if (!t)
        return NULL;
    dt_variable *v = NULL;
    CALL(dt_variable_create(t, &v));
    return dtpy_wrap(KIND_VARIABLE, v);
}

/* variable_assign(v, tensor, mode): mode 0 assign, 1 add, 2 sub. */
static PyObject *py_variable_assign(PyObject *self, PyObject *args)
{
    (void)self;
    dt_variable *v;
    dt_tensor *t;
    int mode;
    if (!PyArg_ParseTuple(args, "O&O&i", dtpy_to_variable, &v, dtpy_to_tensor, &t, &mode))
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
    const dt_variable *v = dtpy_unwrap(arg, KIND_VARIABLE);
    if (!v)
        return NULL;
    dt_tensor *t = NULL;
    CALL(dt_relayout(dt_variable_value(v), dt_variable_layout(v), NULL, &t));
    return dtpy_wrap(KIND_TENSOR, t);
}

/* ---- gradients, training, strategies, parameter server ----------------------------------- */

/* function_gradient(f, loss_output, [wrt]) -> function */
static PyObject *py_function_gradient(PyObject *self, PyObject *args)
{
    (void)self;
    dt_function *f;
    PyObject *wrt_o;
    int loss;
    if (!PyArg_ParseTuple(args, "O&iO", dtpy_to_function, &f, &loss, &wrt_o))
        return NULL;
    int64_t w[MAX_FN_TENSORS];
    int n;
    if (dtpy_parse_ints(wrt_o, MAX_FN_TENSORS, w, &n) < 0)
        return NULL;
    int wrt[MAX_FN_TENSORS];
    for (int i = 0; i < n; i++)
        wrt[i] = (int)w[i];
    dt_function *g = NULL;
    CALL(dt_function_gradient(f, loss, n, wrt, &g));
    return dtpy_wrap(KIND_FUNCTION, g);
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
    return dtpy_wrap(KIND_STRATEGY, st);
}

/* strategy_info(s) -> {kind, replicas, mesh (borrowed handle), variable_mesh (borrowed handle,
 * None when the variables live on mesh), cluster or None} */
static PyObject *py_strategy_info(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_strategy *st = dtpy_unwrap(arg, KIND_STRATEGY);
    if (!st)
        return NULL;
    dt_layout vl;
    CALL(dt_strategy_variable_layout(st, 0, &vl));
    PyObject *mesh = dtpy_borrowed_mesh(dt_strategy_mesh(st));
    if (!mesh)
        return NULL;
    PyObject *var_mesh = Py_None;
    if (vl.mesh != dt_strategy_mesh(st)) {
        var_mesh = dtpy_borrowed_mesh(vl.mesh); /* central storage: device 0's */
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
    dt_strategy *st;
    int rank;
    if (!PyArg_ParseTuple(args, "O&i", dtpy_to_strategy, &st, &rank))
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
    dt_strategy *st;
    int enter;
    if (!PyArg_ParseTuple(args, "O&p", dtpy_to_strategy, &st, &enter))
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
    Py_ssize_t n = dtpy_seq_size(layers_o);
    if (n < 1 || n > 64) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "a model needs 1 to 64 layers, got %zd", n);
        return NULL;
    }
    dt_dense_config cfg[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *l = dtpy_seq_item(layers_o, i);
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
    return dtpy_wrap(KIND_MODEL, m);
}

/* model_variables(m) -> [names] */
static PyObject *py_model_variables(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_model *m = dtpy_unwrap(arg, KIND_MODEL);
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
    dt_model *m;
    int i;
    if (!PyArg_ParseTuple(args, "O&i", dtpy_to_model, &m, &i))
        return NULL;
    const dt_variable *v = dt_model_variable(m, i);
    if (!v) {
        PyErr_Format(PyExc_IndexError, "variable %d of %d", i, dt_model_num_variables(m));
        return NULL;
    }
    dt_tensor *t = NULL;
    CALL(dt_relayout(dt_variable_value(v), dt_variable_layout(v), NULL, &t));
    return dtpy_wrap(KIND_TENSOR, t);
}

static PyObject *py_model_predict(PyObject *self, PyObject *args)
{
    (void)self;
    dt_model *m;
    dt_tensor *x;
    if (!PyArg_ParseTuple(args, "O&O&", dtpy_to_model, &m, dtpy_to_tensor, &x))
        return NULL;
    dt_tensor *out = NULL;
    CALL(dt_model_predict(m, x, &out));
    return dtpy_wrap(KIND_TENSOR, out);
}

/* model_evaluate(m, loss, x, y) -> mean loss */
static PyObject *py_model_evaluate(PyObject *self, PyObject *args)
{
    (void)self;
    dt_model *m;
    dt_tensor *x;
    dt_tensor *y;
    int loss;
    if (!PyArg_ParseTuple(args, "O&iO&O&", dtpy_to_model, &m, &loss, dtpy_to_tensor, &x,
                          dtpy_to_tensor, &y))
        return NULL;
    double value = 0;
    CALL(dt_model_evaluate(m, (dt_loss)loss, x, y, &value));
    return PyFloat_FromDouble(value);
}

/* optimizer_create(kind, lr, momentum, nesterov, beta_1, beta_2, epsilon, weight_decay, rho,
 * clipnorm, global_clipnorm, clipvalue) */
static PyObject *py_optimizer_create(PyObject *self, PyObject *args)
{
    (void)self;
    dt_optimizer_config c = {0};
    int kind;
    if (!PyArg_ParseTuple(args, "iddpdddd|dddd", &kind, &c.learning_rate, &c.momentum, &c.nesterov,
                          &c.beta_1, &c.beta_2, &c.epsilon, &c.weight_decay, &c.rho, &c.clipnorm,
                          &c.global_clipnorm, &c.clipvalue))
        return NULL;
    c.kind = (dt_optimizer_kind)kind;
    dt_optimizer *o = NULL;
    CALL(dt_optimizer_create(&c, &o));
    return dtpy_wrap(KIND_OPTIMIZER, o);
}

/* optimizer_set_learning_rate(o, lr) */
static PyObject *py_optimizer_set_learning_rate(PyObject *self, PyObject *args)
{
    (void)self;
    dt_optimizer *o;
    double lr;
    if (!PyArg_ParseTuple(args, "O&d", dtpy_to_optimizer, &o, &lr))
        return NULL;
    CALL(dt_optimizer_set_learning_rate(o, lr));
    Py_RETURN_NONE;
}

/* A strategy handle, or None (NULL): the converter of train_step's first argument. */
static int to_strategy_or_none(PyObject *o, void *out)
{
    if (o != Py_None)
        return dtpy_to_strategy(o, out);
    *(dt_strategy **)out = NULL;
    return 1;
}

/* train_step(strategy or None, model, loss, optimizer, x, y) -> loss */
static PyObject *py_train_step(PyObject *self, PyObject *args)
{
    (void)self;
    dt_strategy *st;
    dt_model *m;
    dt_optimizer *o;
    dt_tensor *x, *y;
    int loss;
    if (!PyArg_ParseTuple(args, "O&O&iO&O&O&", to_strategy_or_none, &st, dtpy_to_model, &m, &loss,
                          dtpy_to_optimizer, &o, dtpy_to_tensor, &x, dtpy_to_tensor, &y))
        return NULL;
    double value = 0;
    CALL(dt_model_train_step(st, m, (dt_loss)loss, o, x, y, &value));
    return PyFloat_FromDouble(value);
}

/* optimizer_apply(optimizer, [variables], [gradients]): one update. Collective. */
static PyObject *py_optimizer_apply(PyObject *self, PyObject *args)
{
    (void)self;
    dt_optimizer *o;
    PyObject *vars_o, *grads_o;
    if (!PyArg_ParseTuple(args, "O&OO", dtpy_to_optimizer, &o, &vars_o, &grads_o))
        return NULL;
    const dt_tensor *grads[MAX_FN_TENSORS];
    dt_variable *vars[MAX_FN_TENSORS];
    int n;
    if (dtpy_collect_tensors(grads_o, grads, MAX_FN_TENSORS, &n) < 0)
        return NULL;
    if (dtpy_seq_size(vars_o) != n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "optimizer: %zd variables and %d gradients",
                         dtpy_seq_size(vars_o), n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyObject *h = dtpy_seq_item(vars_o, i);
        vars[i] = h ? dtpy_unwrap(h, KIND_VARIABLE) : NULL;
        Py_XDECREF(h);
        if (!vars[i])
            return NULL;
    }
    CALL(dt_optimizer_apply(o, n, vars, grads));
    Py_RETURN_NONE;
}

/* optimizer_exclude_from_weight_decay(optimizer, [variables]) */
static PyObject *py_optimizer_exclude_from_weight_decay(PyObject *self, PyObject *args)
{
    (void)self;
    dt_optimizer *o;
    PyObject *vars_o;
    if (!PyArg_ParseTuple(args, "O&O", dtpy_to_optimizer, &o, &vars_o))
        return NULL;
    Py_ssize_t n = dtpy_seq_size(vars_o);
    if (n < 0 || n > MAX_FN_TENSORS) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "exclude_from_weight_decay: %zd variables (at most %d)",
                         n, MAX_FN_TENSORS);
        return NULL;
    }
    const dt_variable *vars[MAX_FN_TENSORS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = dtpy_seq_item(vars_o, i);
        vars[i] = h ? dtpy_unwrap(h, KIND_VARIABLE) : NULL;
        Py_XDECREF(h);
        if (!vars[i])
            return NULL;
    }
    CALL(dt_optimizer_exclude_from_weight_decay(o, (int)n, vars));
    Py_RETURN_NONE;
}

/* optimizer_iterations(optimizer) -> updates applied so far */
static PyObject *py_optimizer_iterations(PyObject *self, PyObject *arg)
{
    (void)self;
    const dt_optimizer *o = dtpy_unwrap(arg, KIND_OPTIMIZER);
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
    return dtpy_wrap(KIND_GENERATOR, g);
}

/* generator_draw(g, kind, mesh, layout, dtype, shape, a, b, program): kind "uniform" (low a,
 * high b) or "normal" (mean a, stddev b). Collective. */
static PyObject *py_generator_draw(PyObject *self, PyObject *args)
{
    (void)self;
    dt_generator *g;
    const char *kind, *text;
    PyObject *mesh_o, *shape_o;
    int dtype, program;
    double a, b;
    if (!PyArg_ParseTuple(args, "O&sOsiOddp", dtpy_to_generator, &g, &kind, &mesh_o, &text, &dtype,
                          &shape_o, &a, &b, &program))
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
    bool normal = strcmp(kind, "normal") == 0;
    Py_BEGIN_ALLOW_THREADS;
    s = normal ? dt_generator_normal(g, (dt_dtype)dtype, rank, shape, a, b, &o, &t)
               : dt_generator_uniform(g, (dt_dtype)dtype, rank, shape, a, b, &o, &t);
    Py_END_ALLOW_THREADS;
    return dtpy_ctx_close(&c, s, t);
}

/* generator_state(g) -> (seed, counter); generator_state(g, seed, counter) sets it. */
static PyObject *py_generator_state(PyObject *self, PyObject *args)
{
    (void)self;
    dt_generator *g;
    unsigned long long seed = 0, counter = 0;
    int n = (int)PyTuple_Size(args);
    if (!PyArg_ParseTuple(args, "O&|KK", dtpy_to_generator, &g, &seed, &counter))
        return NULL;
    if (n == 3)
        CALL(dt_generator_reset(g, seed, counter));
    uint64_t sd, ct;
    CALL(dt_generator_state(g, &sd, &ct));
    return Py_BuildValue("(KK)", (unsigned long long)sd, (unsigned long long)ct);
}

PyMethodDef dtpy_train_methods[] = {
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
    {"optimizer_exclude_from_weight_decay", py_optimizer_exclude_from_weight_decay, METH_VARARGS,
     "Variables updated without AdamW's decay."},
    {"optimizer_iterations", py_optimizer_iterations, METH_O, "Updates applied so far."},
    {"generator_create", py_generator_create, METH_O, "A random generator at (seed, 0)."},
    {"generator_draw", py_generator_draw, METH_VARARGS, "The next draw. Collective."},
    {"generator_state", py_generator_state, METH_VARARGS, "Get or set (seed, counter)."},
    {NULL, NULL, 0, NULL},
};
