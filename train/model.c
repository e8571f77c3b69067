/* A sequential model of dense layers, and the training step of the custom training loop.
 *
 * The step is traced once per (loss, x and y metadata): inputs x [B, in] and y [B, k] in the
 * strategy's input layout, then the variables in their layouts; output the step's loss
 * (scalar): the SUM over replicas of the per-replica losses, each the sum of its examples'
 * losses / B + regularization / R (tf.nn.compute_average_loss and scale_regularization_loss),
 * i.e. mean + regularization, for any split of the batch (uneven when B does not divide).
 * dt_function_gradient adds the variables' gradients, each in its variable's layout: with
 * batch-sharded x and replicated variables they come out partial and the expansion
 * all-reduces them. Under central storage the variables are inputs on their own 1-device mesh
 * (global device 0): the step copies each to a replicated layout on the batch mesh
 * (copy_to_mesh) and computes there; the gradient of that copy is the copy of the partial
 * gradient back to device 0, whose terms copy_to_mesh sums on the batch mesh (an all-reduce)
 * before sending the sum to device 0, where the optimizer updates the variables. */
#include "train.h"

#include <stdlib.h>
#include <string.h>

dt_strategy *dt_model_strategy(const dt_model *m)
{
    return m && !m->own_strategy ? m->strategy : NULL;
}

int dt_model_num_variables(const dt_model *m)
{
    return m ? m->nvars : 0;
}

dt_variable *dt_model_variable(const dt_model *m, int i)
{
    return m && i >= 0 && i < m->nvars ? m->vars[i] : NULL;
}

const char *dt_model_variable_name(const dt_model *m, int i)
{
    return m && i >= 0 && i < m->nvars ? m->names[i] : NULL;
}

void dt_model_free(dt_model *m)
{
    DT__SERIAL();
    if (!m)
        return;
    for (int i = 0; i < m->nvars; i++) {
        if (m->ps)
            dt__ps_var_free(&m->ps[i]);
        dt_variable_free(m->vars[i]);
    }
    dt_function_free(m->grad);
    if (m->strategy)
        m->strategy->live_models--;
    dt_strategy_free(m->own_strategy);
    free(m->ps);
    free(m->vars);
    free(m->names);
    free(m->var_layer);
    free(m->var_is_kernel);
    free(m->layers);
    free(m);
}

static dt_status create_vars(dt_model *m, uint64_t seed)
{
    int64_t fan_in = m->in_features;
    for (int l = 0; l < m->nlayers; l++) {
        const dt_dense_config *c = &m->layers[l];
        for (int j = 0; j < (c->no_bias ? 1 : 2); j++) {
            int rank = j == 0 ? 2 : 1;
            int64_t shape[2] = {fan_in, c->units};
            if (j == 1)
                shape[0] = c->units;
            dt_layout lay;
            DT_TRY(dt_strategy_variable_layout(m->strategy, rank, &lay));
            dt_initializer init =
                j == 0 ? (c->kernel_init ? c->kernel_init : DT_INITIALIZER_GLOROT_UNIFORM)
                       : c->bias_init;
            dt_tensor *t;
            DT_TRY(dt_initializer_run(init, m->dtype, rank, shape, seed, (uint64_t)(2 * l + j),
                                      &lay, &t));
            int i = m->nvars;
            dt_status s = dt_variable_create(t, &m->vars[i]);
            dt_tensor_free(t);
            DT_TRY(s);
            m->nvars++;
            snprintf(m->names[i], sizeof m->names[i], "dense_%d/%s", l, j ? "bias" : "kernel");
            m->var_layer[i] = l;
            m->var_is_kernel[i] = j == 0;
        }
        fan_in = c->units;
    }
    return DT_OK;
}

dt_status dt_model_create(int64_t input_features, int num_layers, const dt_dense_config layers[],
                          dt_dtype dtype, uint64_t seed, dt_model **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_model_create: out is NULL");
    *out = NULL;
    DT_TRY(dt__require_init("dt_model_create"));
    if (input_features < 1 || num_layers < 1 || !layers)
        return dt__fail(DT_ERR_ARG, "dt_model_create: %lld input features, %d layers%s",
                        (long long)input_features, num_layers, layers ? "" : " (NULL)");
    if (dtype != DT_DTYPE_F32 && dtype != DT_DTYPE_F64)
        return dt__fail(DT_ERR_DTYPE, "dt_model_create: dtype %s, expected f32 or f64",
                        dt_dtype_name(dtype));
    for (int l = 0; l < num_layers; l++)
        if (layers[l].units < 1 || (unsigned)layers[l].activation >= DT_ACTIVATION_COUNT ||
            (unsigned)layers[l].kernel_init >= DT_INITIALIZER_COUNT ||
            (unsigned)layers[l].bias_init >= DT_INITIALIZER_COUNT || layers[l].l2 < 0)
            return dt__fail(DT_ERR_ARG,
                            "dt_model_create: layer %d has %lld units, activation %d, "
                            "initializers %d and %d, l2 %g",
                            l, (long long)layers[l].units, (int)layers[l].activation,
                            (int)layers[l].kernel_init, (int)layers[l].bias_init, layers[l].l2);
    dt_model *m = calloc(1, sizeof *m);
    int maxv = 2 * num_layers;
    dt_status s = DT_OK;
    if (m) {
        m->layers = calloc((size_t)num_layers, sizeof *m->layers);
        m->vars = calloc((size_t)maxv, sizeof *m->vars);
        m->names = calloc((size_t)maxv, sizeof *m->names);
        m->var_layer = calloc((size_t)maxv, sizeof *m->var_layer);
        m->var_is_kernel = calloc((size_t)maxv, sizeof *m->var_is_kernel);
    }
    if (!m || !m->layers || !m->vars || !m->names || !m->var_layer || !m->var_is_kernel) {
        s = dt__fail(DT_ERR_NOMEM, "dt_model_create: out of memory");
        goto done;
    }
    memcpy(m->layers, layers, sizeof *layers * (size_t)num_layers);
    m->nlayers = num_layers;
    m->dtype = dtype;
    m->in_features = input_features;
    m->strategy = dt__strategy_scope();
    if (!m->strategy) {
        s = dt_strategy_create(DT_STRATEGY_DEFAULT, NULL, &m->own_strategy);
        if (s != DT_OK)
            goto done;
        m->strategy = m->own_strategy;
    }
    m->strategy->live_models++;
    s = create_vars(m, seed);
    if (s == DT_OK && m->strategy->kind == DT_STRATEGY_PARAMETER_SERVER) {
        m->ps = calloc((size_t)m->nvars, sizeof *m->ps);
        if (!m->ps)
            s = dt__fail(DT_ERR_NOMEM, "dt_model_create: out of memory");
        for (int i = 0; s == DT_OK && i < m->nvars; i++) {
            s = dt__ps_var_create(m->strategy, m->vars[i], &m->ps[i]);
            if (s != DT_OK) {
                for (int j = 0; j < i; j++)
                    dt__ps_var_free(&m->ps[j]);
                free(m->ps);
                m->ps = NULL;
            }
        }
    }
done:
    if (s != DT_OK) {
        dt_model_free(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

static const dt_unary_op act_op[DT_ACTIVATION_COUNT] = {
    [DT_ACTIVATION_RELU] = DT_UNARY_RELU,
    [DT_ACTIVATION_TANH] = DT_UNARY_TANH,
    [DT_ACTIVATION_SIGMOID] = DT_UNARY_SIGMOID,
};

dt_status dt__model_forward(const dt_model *m, const dt_tensor *x, const dt_tensor *const w[],
                            dt_tensor **out)
{
    *out = NULL;
    dt_tensor *h = NULL;
    const dt_tensor *cur = x;
    int v = 0;
    for (int l = 0; l < m->nlayers; l++) {
        const dt_dense_config *c = &m->layers[l];
        dt_tensor *t;
        dt_status s = dt_matmul(cur, w[v++], NULL, &t); /* [B, units], rows as x's */
        if (s == DT_OK && !c->no_bias) {
            dt_tensor *u;
            s = dt_binary(DT_BINARY_ADD, t, w[v++], NULL, &u);
            dt_tensor_free(t);
            t = s == DT_OK ? u : NULL;
        }
        if (s == DT_OK && c->activation != DT_ACTIVATION_NONE) {
            dt_tensor *u;
            s = dt_unary(act_op[c->activation], t, NULL, &u);
            dt_tensor_free(t);
            t = s == DT_OK ? u : NULL;
        }
        dt_tensor_free(h);
        h = t;
        DT_TRY(s);
        cur = h;
    }
    *out = h;
    return DT_OK;
}

static void values_of(const dt_model *m, const dt_tensor *w[])
{
    for (int i = 0; i < m->nvars; i++)
        w[i] = dt_variable_value(m->vars[i]);
}

/* The variables' values w[0..n) where the computation on `mesh` can use them: each borrowed
 * when already on that mesh, else copied there replicated into owned[i] (central storage:
 * from device 0 to every device of the batch mesh). Eager or traced. */
static dt_status vars_on_mesh(int n, const dt_tensor *const w[], const dt_mesh *mesh,
                              const dt_tensor *out[], dt_tensor *owned[])
{
    for (int i = 0; i < n; i++) {
        owned[i] = NULL;
        out[i] = w[i];
        if (w[i]->mesh == mesh)
            continue;
        dt_layout l;
        DT_TRY(dt_layout_replicated(mesh, w[i]->rank, &l));
        DT_TRY(dt_copy_to_mesh(w[i], &l, NULL, &owned[i]));
        out[i] = owned[i];
    }
    return DT_OK;
}

/* A floating input of another floating dtype than the model's, cast to the model's, as Keras
 * casts a float64 batch for a float32 model: *use is x itself, or the cast (owned, *cast). Other
 * dtypes stay (and the step names them). */
static dt_status as_model_dtype(const dt_model *m, const dt_tensor *x, const dt_tensor **use,
                                dt_tensor **cast)
{
    *cast = NULL;
    *use = x;
    if (!x || x->dtype == m->dtype || !dt_dtype_is_floating(x->dtype) ||
        !dt_dtype_is_floating(m->dtype))
        return DT_OK;
    DT_TRY(dt_cast(x, m->dtype, NULL, cast));
    *use = *cast;
    return DT_OK;
}

static void free_all(int n, dt_tensor *t[])
{
    for (int i = 0; i < n; i++) {
        dt_tensor_free(t[i]);
        t[i] = NULL;
    }
}

dt_status dt_model_predict(const dt_model *m, const dt_tensor *x, dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_model_predict: out is NULL");
    *out = NULL;
    if (!m || !x)
        return dt__fail(DT_ERR_ARG, "dt_model_predict: %s is NULL", m ? "x" : "model");
    const dt_tensor *w[2 * DT_MAX_RANK * 4];
    if (m->nvars > (int)(sizeof w / sizeof w[0]))
        return dt__fail(DT_ERR_ARG, "dt_model_predict: %d variables", m->nvars);
    values_of(m, w);
    dt_tensor *owned[sizeof w / sizeof w[0]] = {0}, *xc = NULL;
    const dt_tensor *wx[sizeof w / sizeof w[0]], *xm = x;
    dt_status s = as_model_dtype(m, x, &xm, &xc);
    if (s == DT_OK)
        s = vars_on_mesh(m->nvars, w, x->mesh, wx, owned);
    if (s == DT_OK)
        s = dt__model_forward(m, xm, wx, out);
    free_all(m->nvars, owned);
    dt_tensor_free(xc);
    return s;
}

dt_status dt_model_evaluate(const dt_model *m, dt_loss loss, const dt_tensor *x, const dt_tensor *y,
                            double *mean_loss)
{
    DT__SERIAL();
    if (!m || !x || !y || !mean_loss)
        return dt__fail(DT_ERR_ARG, "dt_model_evaluate: an argument is NULL");
    dt_tensor *p = NULL, *per = NULL, *avg = NULL, *yc = NULL;
    const dt_tensor *ym = y;
    dt_status s = as_model_dtype(m, y, &ym, &yc);
    if (s == DT_OK)
        s = dt_model_predict(m, x, &p);
    if (s == DT_OK)
        s = dt_loss_per_example(loss, ym, p, &per);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_MEAN, per, 0, NULL, 0, NULL, &avg);
    if (s == DT_OK)
        s = dt_strategy_read_scalar(m->strategy, avg, mean_loss);
    dt_tensor_free(p);
    dt_tensor_free(per);
    dt_tensor_free(avg);
    dt_tensor_free(yc);
    return s;
}

/* ---- the training step -------------------------------------------------------------------- */

/* Trace the step's loss on symbolic x, y and variables: the sum of the per-example losses / B
 * plus the regularization. That is the SUM over replicas of the per-replica losses of the
 * custom training loop (sum of the replica's examples / B + regularization / R), whatever
 * share of the batch each replica holds: a batch that does not divide gives uneven shards. */
static dt_status trace_loss(const dt_model *m, dt_loss loss, const dt_tensor *x, const dt_tensor *y,
                            const dt_tensor *const w[], dt_tensor **total)
{
    int64_t B = x->shape[0];
    dt_tensor *p = NULL, *per = NULL, *sum = NULL, *avg = NULL, *reg = NULL, *c = NULL;
    dt_layout sl;
    dt_status s = dt_layout_replicated(x->mesh, 0, &sl);
    dt_op_options so = {.layout = &sl};
    if (s == DT_OK)
        s = dt__model_forward(m, x, w, &p);
    if (s == DT_OK)
        s = dt_loss_per_example(loss, y, p, &per); /* [B], rows as x's */
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, per, 0, NULL, 0, NULL, &sum);
    if (s == DT_OK) /* as compute_average_loss with the global batch */
        s = dt_fill(x->dtype, 0, (int64_t[]){1}, 1.0 / (double)B, &so, &c);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, sum, c, NULL, &avg);
    dt_tensor_free(c);
    /* regularization: sum_l l2_l sum(kernel_l^2) */
    for (int i = 0; s == DT_OK && i < m->nvars; i++) {
        double l2 = m->layers[m->var_layer[i]].l2;
        if (!m->var_is_kernel[i] || l2 == 0)
            continue;
        dt_tensor *sq = NULL, *ssum = NULL, *term = NULL;
        c = NULL;
        s = dt_unary(DT_UNARY_SQUARE, w[i], NULL, &sq);
        if (s == DT_OK)
            s = dt_reduce(DT_REDUCE_SUM, sq, 0, NULL, 0, NULL, &ssum);
        if (s == DT_OK)
            s = dt_fill(x->dtype, 0, (int64_t[]){1}, l2, &so, &c);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MUL, ssum, c, NULL, &term);
        if (s == DT_OK && reg) {
            dt_tensor *r2;
            s = dt_binary(DT_BINARY_ADD, reg, term, NULL, &r2);
            dt_tensor_free(reg);
            dt_tensor_free(term);
            reg = r2;
        } else if (s == DT_OK) {
            reg = term;
        }
        dt_tensor_free(sq);
        dt_tensor_free(ssum);
        dt_tensor_free(c);
    }
    if (s == DT_OK && reg) {
        s = dt_binary(DT_BINARY_ADD, avg, reg, NULL, total);
    } else if (s == DT_OK) {
        *total = avg;
        avg = NULL;
    }
    dt_tensor_free(p);
    dt_tensor_free(per);
    dt_tensor_free(sum);
    dt_tensor_free(avg);
    dt_tensor_free(reg);
    return s;
}

static bool same_meta(const dt_model *m, dt_loss loss, const dt_tensor *x, const dt_tensor *y)
{
    return m->grad && m->grad_loss == loss && m->grad_xshape[0] == x->shape[0] &&
           m->grad_xshape[1] == x->shape[1] && m->grad_yshape[0] == y->shape[0] &&
           m->grad_yshape[1] == y->shape[1] && dt_layout_equal(&m->grad_xl, &x->layout) &&
           dt_layout_equal(&m->grad_yl, &y->layout);
}

static dt_status build_grad(dt_model *m, dt_loss loss, const dt_tensor *x, const dt_tensor *y)
{
    dt_function *f = NULL;
    int n = m->nvars;
    dt_tensor *xs = NULL, *ys = NULL, *ws[64] = {0}, *wc[64] = {0}, *out = NULL;
    const dt_tensor *wx[64];
    int wrt[64];
    DT_TRY(dt_function_begin(&f));
    dt_status s = dt_function_input(f, &x->layout, x->dtype, 2, x->shape, &xs);
    if (s == DT_OK)
        s = dt_function_input(f, &y->layout, y->dtype, 2, y->shape, &ys);
    for (int i = 0; s == DT_OK && i < n; i++) {
        const dt_tensor *v = dt_variable_value(m->vars[i]);
        s = dt_function_input(f, &v->layout, v->dtype, v->rank, v->shape, &ws[i]);
        wrt[i] = 2 + i;
    }
    /* central storage: the variables (inputs on device 0) copied to the batch mesh */
    if (s == DT_OK)
        s = vars_on_mesh(n, (const dt_tensor *const *)ws, x->mesh, wx, wc);
    if (s == DT_OK)
        s = trace_loss(m, loss, xs, ys, wx, &out);
    if (s == DT_OK) {
        s = dt_function_end(f, 1, &out);
    } else {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_function_end(f, 0, NULL);
        dt__set_error(msg);
    }
    dt_function *g = NULL;
    if (s == DT_OK)
        s = dt_function_gradient(f, 0, n, wrt, &g);
    dt_tensor_free(xs);
    dt_tensor_free(ys);
    free_all(n, ws);
    free_all(n, wc);
    dt_tensor_free(out);
    dt_function_free(f);
    DT_TRY(s);
    dt_function_free(m->grad);
    m->grad = g;
    m->grad_loss = loss;
    memcpy(m->grad_xshape, x->shape, sizeof m->grad_xshape);
    memcpy(m->grad_yshape, y->shape, sizeof m->grad_yshape);
    m->grad_xl = x->layout;
    m->grad_yl = y->layout;
    return DT_OK;
}

static dt_status check_step(dt_strategy *s, dt_model *m, dt_optimizer *opt, const dt_tensor *x,
                            const dt_tensor *y)
{
    if (!m || !opt || !x || !y)
        return dt__fail(DT_ERR_ARG, "dt_model_train_step: model, optimizer, x or y is NULL");
    dt_strategy *want = s ? s : m->own_strategy;
    if (m->strategy != want) {
        const char *where = m->own_strategy ? "outside any strategy scope"
                                            : dt_strategy_kind_name(m->strategy->kind);
        return dt__fail(DT_ERR_STATE,
                        "dt_model_train_step: variable \"%s\" was created %s%s, but the step "
                        "runs under strategy %s: create the model inside "
                        "dt_strategy_scope_enter(%s) .. dt_strategy_scope_exit",
                        m->names[0], m->own_strategy ? "" : "in the scope of strategy ", where,
                        s ? dt_strategy_kind_name(s->kind) : "(none)",
                        s ? dt_strategy_kind_name(s->kind) : "(none)");
    }
    if (m->nvars > 64)
        return dt__fail(DT_ERR_ARG, "dt_model_train_step: %d variables, at most 64", m->nvars);
    dt_layout xl, yl;
    DT_TRY(dt_strategy_input_layout(m->strategy, 2, &xl));
    yl = xl;
    char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
    if (x->rank != 2 || y->rank != 2 || x->shape[0] != y->shape[0] ||
        x->shape[1] != m->in_features || x->dtype != m->dtype || y->dtype != m->dtype)
        return dt__fail(DT_ERR_SHAPE,
                        "dt_model_train_step: x %s%s, y %s%s; the model takes %s[batch, %lld]",
                        dt_dtype_name(x->dtype), dt__shape_str(sa, sizeof sa, x->rank, x->shape),
                        dt_dtype_name(y->dtype), dt__shape_str(sb, sizeof sb, y->rank, y->shape),
                        dt_dtype_name(m->dtype), (long long)m->in_features);
    if (!dt_layout_equal(&x->layout, &xl) || !dt_layout_equal(&y->layout, &yl)) {
        char la[DT_STRING_MAX], lb[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT,
                        "dt_model_train_step: x is laid out \"%s\", the strategy's inputs \"%s\" "
                        "(use dt_strategy_distribute_batch)",
                        dt__layout_str(&x->layout, la, sizeof la),
                        dt__layout_str(&xl, lb, sizeof lb));
    }
    return DT_OK;
}

/* Parameter server, before the step: the variables' current values from the shards. */
static dt_status ps_pull_into(dt_model *m, void **host)
{
    for (int i = 0; i < m->nvars; i++) {
        const dt_tensor *v = dt_variable_value(m->vars[i]);
        size_t bytes = (size_t)m->ps[i].elems * dt_dtype_size(v->dtype);
        host[i] = malloc(bytes + 1);
        if (!host[i])
            return dt__fail(DT_ERR_NOMEM, "parameter server: out of memory");
        DT_TRY(dt__ps_var_pull(&m->ps[i], host[i]));
        dt_tensor *t;
        DT_TRY(dt_tensor_from_host(&v->layout, v->dtype, v->rank, v->shape, host[i], bytes, &t));
        dt_status s = dt_variable_assign(m->vars[i], t);
        dt_tensor_free(t);
        DT_TRY(s);
    }
    return DT_OK;
}

/* After the local update: push (new - old) of each variable. */
static dt_status ps_push_from(dt_model *m, void *const *old)
{
    for (int i = 0; i < m->nvars; i++) {
        const dt_tensor *v = dt_variable_value(m->vars[i]);
        int64_t n = m->ps[i].elems;
        size_t bytes = (size_t)n * dt_dtype_size(v->dtype);
        void *now = malloc(bytes + 1);
        if (!now)
            return dt__fail(DT_ERR_NOMEM, "parameter server: out of memory");
        dt_status s = dt__read_replicated(v, now, bytes);
        if (s == DT_OK) {
            if (v->dtype == DT_DTYPE_F32)
                for (int64_t k = 0; k < n; k++)
                    ((float *)now)[k] -= ((const float *)old[i])[k];
            else
                for (int64_t k = 0; k < n; k++)
                    ((double *)now)[k] -= ((const double *)old[i])[k];
            s = dt__ps_var_push(&m->ps[i], now);
        }
        free(now);
        DT_TRY(s);
    }
    return DT_OK;
}

static dt_status step_body(dt_model *m, dt_loss loss, dt_optimizer *opt, const dt_tensor *x,
                           const dt_tensor *y, double *step_loss)
{
    if (!same_meta(m, loss, x, y))
        DT_TRY(build_grad(m, loss, x, y));
    int n = m->nvars, nout = 1 + n; /* the loss, then each variable's gradient */
    const dt_tensor *in[66];
    dt_tensor *res[66] = {0};
    in[0] = x;
    in[1] = y;
    for (int i = 0; i < n; i++)
        in[2 + i] = dt_variable_value(m->vars[i]);
    dt_status s = dt_function_run(m->grad, 2 + n, in, nout, res);
    double total = 0;
    if (s == DT_OK)
        s = dt_strategy_read_scalar(m->strategy, res[0], &total);
    if (s == DT_OK)
        s = dt_optimizer_apply(opt, n, m->vars, (const dt_tensor *const *)&res[1]);
    for (int i = 0; i < nout; i++)
        dt_tensor_free(res[i]);
    if (s == DT_OK && step_loss)
        *step_loss = total;
    return s;
}

dt_status dt_model_train_step(dt_strategy *s, dt_model *m, dt_loss loss, dt_optimizer *opt,
                              const dt_tensor *x, const dt_tensor *y, double *step_loss)
{
    DT__SERIAL();
    if (!m)
        return check_step(s, m, opt, x, y);
    dt_tensor *xc = NULL, *yc = NULL;
    const dt_tensor *xm = x, *ym = y;
    dt_status st = as_model_dtype(m, x, &xm, &xc);
    if (st == DT_OK)
        st = as_model_dtype(m, y, &ym, &yc);
    if (st == DT_OK)
        st = check_step(s, m, opt, xm, ym);
    void *old[64] = {0};
    if (st == DT_OK && m->ps)
        st = ps_pull_into(m, old);
    if (st == DT_OK)
        st = step_body(m, loss, opt, xm, ym, step_loss);
    if (st == DT_OK && m->ps)
        st = ps_push_from(m, old);
    for (int i = 0; m->ps && i < m->nvars; i++)
        free(old[i]);
    dt_tensor_free(xc);
    dt_tensor_free(yc);
    return st;
}

dt_status dt_ps_pull(dt_strategy *s, dt_model *m)
{
    if (!s || !m || !m->ps || m->strategy != s)
        return dt__fail(DT_ERR_ARG, "dt_ps_pull: the model was not created in the scope of this "
                                    "parameter-server strategy");
    void *old[64] = {0};
    dt_status st = ps_pull_into(m, old);
    for (int i = 0; i < m->nvars; i++)
        free(old[i]);
    return st;
}
