/* Variables: a tensor whose layout is fixed at creation (tf DVariable). Assignments check the
 * value's metadata against the variable's before any communication. */
#include "engine.h"

#include <stdlib.h>

struct dt_variable {
    dt_tensor *value;
};

static dt_status copy_of(const dt_tensor *x, dt_tensor **out)
{
    return dt_relayout(x, &x->layout, NULL, out);
}

dt_status dt_variable_create(const dt_tensor *initial, dt_variable **out)
{
    DT__SERIAL();
    const dt__agreement a = {.what = "dt_variable_create"};
    if (out)
        *out = NULL;
    /* the other clients are about to copy their initial values: a failure here fails them
     * too (over every client when this one cannot tell the mesh) */
    if (!out || !initial)
        return dt__mesh_agree(
            initial ? initial->mesh : NULL,
            dt__fail(DT_ERR_ARG, "dt_variable_create: %s is NULL", out ? "initial value" : "out"),
            &a);
    dt_status s = dt__tensor_require_values(initial, "dt_variable_create");
    if (s == DT_OK && initial->layout.partial) {
        char lb[DT_STRING_MAX];
        s = dt__fail(DT_ERR_LAYOUT,
                     "dt_variable_create: initial value has partial layout \"%s\"; a "
                     "variable's layout cannot be partial",
                     dt__layout_str(&initial->layout, lb, sizeof lb));
    }
    if (s != DT_OK)
        return dt__mesh_agree(initial->mesh, s, &a);
    dt_variable *v = calloc(1, sizeof *v);
    if (!v)
        return dt__fail(DT_ERR_NOMEM, "dt_variable_create: out of memory");
    s = copy_of(initial, &v->value);
    if (s != DT_OK) {
        free(v);
        return s;
    }
    *out = v;
    return DT_OK;
}

static dt_status fits(const char *fn, const dt_variable *v, const dt_tensor *x)
{
    if (!v || !x)
        return dt__fail(DT_ERR_ARG, "%s: %s is NULL", fn, v ? "value" : "variable");
    DT_TRY(dt__tensor_require_values(x, fn));
    const dt_tensor *t = v->value;
    char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
    dt__shape_str(sa, sizeof sa, t->rank, t->shape);
    dt__shape_str(sb, sizeof sb, x->rank, x->shape);
    if (x->dtype != t->dtype)
        return dt__fail(DT_ERR_DTYPE, "%s: variable is %s%s, value is %s%s", fn,
                        dt_dtype_name(t->dtype), sa, dt_dtype_name(x->dtype), sb);
    bool same = x->rank == t->rank;
    for (int i = 0; same && i < t->rank; i++)
        same = x->shape[i] == t->shape[i];
    if (!same)
        return dt__fail(DT_ERR_SHAPE, "%s: variable has shape %s, value has %s", fn, sa, sb);
    if (!dt_layout_equal(&x->layout, &t->layout)) {
        char la[DT_STRING_MAX], lb[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT,
                        "%s: variable has layout \"%s\", value has \"%s\"; relayout the value "
                        "explicitly (dt_relayout) to assign it",
                        fn, dt__layout_str(&t->layout, la, sizeof la),
                        dt__layout_str(&x->layout, lb, sizeof lb));
    }
    return DT_OK;
}

/* A value that does not fit fails on every client: the others, whose values fit, are about
 * to run the assignment's op and agree on it with this client. */
static dt_status check_value(const char *fn, const dt_variable *v, const dt_tensor *x)
{
    dt_status s = fits(fn, v, x);
    const dt_tensor *on = v ? v->value : x;
    return s == DT_OK ? s : dt__mesh_agree(on ? on->mesh : NULL, s, &(dt__agreement){.what = fn});
}

static dt_status replace(dt_variable *v, dt_status s, dt_tensor *next)
{
    if (s != DT_OK)
        return s;
    dt_tensor_free(v->value);
    v->value = next;
    return DT_OK;
}

dt_status dt_variable_assign(dt_variable *v, const dt_tensor *value)
{
    DT__SERIAL();
    DT_TRY(check_value("dt_variable_assign", v, value));
    dt_tensor *next;
    dt_status s = copy_of(value, &next);
    return replace(v, s, next);
}

dt_status dt__variable_adopt(dt_variable *v, dt_tensor *value)
{
    DT_TRY(fits("dt__variable_adopt", v, value));
    dt_tensor_free(v->value);
    v->value = value;
    return DT_OK;
}

static dt_status update(const char *fn, dt_binary_op op, dt_variable *v, const dt_tensor *value)
{
    DT_TRY(check_value(fn, v, value));
    dt_op_options o = {.layout = &v->value->layout};
    dt_tensor *next;
    dt_status s = dt_binary(op, v->value, value, &o, &next);
    return replace(v, s, next);
}

dt_status dt_variable_assign_add(dt_variable *v, const dt_tensor *value)
{
    DT__SERIAL();
    return update("dt_variable_assign_add", DT_BINARY_ADD, v, value);
}

dt_status dt_variable_assign_sub(dt_variable *v, const dt_tensor *value)
{
    DT__SERIAL();
    return update("dt_variable_assign_sub", DT_BINARY_SUB, v, value);
}

const dt_tensor *dt_variable_value(const dt_variable *v)
{
    DT__SERIAL();
    return v ? v->value : NULL;
}

const dt_layout *dt_variable_layout(const dt_variable *v)
{
    return v ? &v->value->layout : NULL;
}

void dt_variable_free(dt_variable *v)
{
    DT__SERIAL();
    if (!v)
        return;
    dt_tensor_free(v->value);
    free(v);
}
