/* The checkpoint object: what a save writes and a restore reads (its entries, each a name in
 * one of the file's groups), its metadata and its save counter. Saving is in
 * train/checkpoint_write.c, restoring in train/checkpoint_read.c. */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per entry kind: its group in the file, the function that adds it, what it is called. */
static const char *const entry_group[] = {
    [E_VARIABLE] = "variables", [E_TENSOR] = "tensors",   [E_OPTIMIZER] = "optimizers",
    [E_GENERATOR] = "random",   [E_COUNTER] = "counters",
};
static const char *const entry_fn[] = {
    [E_VARIABLE] = "dt_checkpoint_add_variable",   [E_TENSOR] = "dt_checkpoint_add_tensor",
    [E_OPTIMIZER] = "dt_checkpoint_add_optimizer", [E_GENERATOR] = "dt_checkpoint_add_generator",
    [E_COUNTER] = "dt_checkpoint_add_counter",
};
static const char *const entry_what[] = {
    [E_VARIABLE] = "variable",   [E_TENSOR] = "tensor",   [E_OPTIMIZER] = "optimizer",
    [E_GENERATOR] = "generator", [E_COUNTER] = "counter",
};

dt_status dt_checkpoint_create(dt_checkpoint **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_create: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? DT_OK : dt__fail(DT_ERR_NOMEM, "dt_checkpoint_create: out of memory");
}

void dt__ckpt_meta_clear(meta *m, int n)
{
    for (int i = 0; i < n; i++) {
        free(m[i].key);
        free(m[i].value);
    }
    free(m);
}

void dt_checkpoint_free(dt_checkpoint *c)
{
    if (!c)
        return;
    free(c->e);
    dt__ckpt_meta_clear(c->meta, c->nmeta);
    free(c);
}

/* Entry e (its kind and object set) named `name` at the end, its path checked against every
 * other: unique, and no path a group of another ("a" and "a/b"). `obj` is e's object. */
static dt_status add_entry(dt_checkpoint *c, const char *name, const void *obj, entry e)
{
    entry_kind kind = e.kind;
    const char *fn = entry_fn[kind];
    if (!obj)
        return dt__fail(DT_ERR_ARG, "%s: %s \"%s\" is NULL", fn, entry_what[kind],
                        name ? name : "(null)");
    if (!c)
        return dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn);
    DT_TRY(dt__ckpt_check_name(fn, name, true));
    if (kind == E_COUNTER && !strcmp(name, "save_counter"))
        return dt__fail(DT_ERR_ARG, "%s: the counter name \"save_counter\" is the checkpoint's own",
                        fn);
    snprintf(e.name, sizeof e.name, "%s", name);
    snprintf(e.path, sizeof e.path, "%s/%s", entry_group[kind], name);
    size_t pl = strlen(e.path);
    for (int i = 0; i < c->n; i++) {
        const char *o = c->e[i].path;
        size_t ol = strlen(o);
        size_t k = pl < ol ? pl : ol;
        if (!strncmp(o, e.path, k) && (pl == ol || (pl < ol ? o[k] : e.path[k]) == '/'))
            return dt__fail(DT_ERR_ARG, "%s: \"%s\" clashes with \"%s\" already in the checkpoint",
                            fn, e.path, o);
    }
    entry *n = realloc(c->e, sizeof *n * (size_t)(c->n + 1));
    if (!n)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    c->e = n;
    c->e[c->n++] = e;
    return DT_OK;
}

dt_status dt_checkpoint_add_variable(dt_checkpoint *c, const char *name, dt_variable *v)
{
    return add_entry(c, name, v, (entry){.kind = E_VARIABLE, .var = v});
}

dt_status dt_checkpoint_add_model(dt_checkpoint *c, const char *name, dt_model *m)
{
    const char *fn = "dt_checkpoint_add_model";
    if (!m)
        return dt__fail(DT_ERR_ARG, "%s: model \"%s\" is NULL", fn, name ? name : "(null)");
    if (m->ps)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "%s: model \"%s\" lives on parameter-server tasks (MPI windows); "
                        "checkpoints of parameter-server variables are not supported yet",
                        fn, name ? name : "(null)");
    DT_TRY(dt__ckpt_check_name(fn, name, true));
    int first = c ? c->n : 0;
    for (int i = 0; i < m->nvars; i++) {
        char full[NAME_MAX_LEN + 40];
        snprintf(full, sizeof full, "%s/%s", name, m->names[i]);
        dt_status s = dt_checkpoint_add_variable(c, full, m->vars[i]);
        if (s != DT_OK) {
            c->n = first; /* as it was */
            return s;
        }
    }
    return DT_OK;
}

dt_status dt_checkpoint_add_tensor(dt_checkpoint *c, const char *name, const dt_tensor *t)
{
    return add_entry(c, name, t, (entry){.kind = E_TENSOR, .tensor = t});
}

dt_status dt_checkpoint_add_optimizer(dt_checkpoint *c, const char *name, dt_optimizer *o)
{
    return add_entry(c, name, o, (entry){.kind = E_OPTIMIZER, .opt = o});
}

dt_status dt_checkpoint_add_generator(dt_checkpoint *c, const char *name, dt_generator *g)
{
    return add_entry(c, name, g, (entry){.kind = E_GENERATOR, .gen = g});
}

dt_status dt_checkpoint_add_counter(dt_checkpoint *c, const char *name, int64_t *value)
{
    return add_entry(c, name, value, (entry){.kind = E_COUNTER, .counter = value});
}

dt_status dt__ckpt_meta_set(meta **m, int *n, const char *key, const char *value)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp((*m)[i].key, key)) {
            char *v = strdup(value);
            if (!v)
                return dt__fail(DT_ERR_NOMEM, "checkpoint metadata: out of memory");
            free((*m)[i].value);
            (*m)[i].value = v;
            return DT_OK;
        }
    meta *g = realloc(*m, sizeof *g * (size_t)(*n + 1));
    if (!g)
        return dt__fail(DT_ERR_NOMEM, "checkpoint metadata: out of memory");
    *m = g;
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return dt__fail(DT_ERR_NOMEM, "checkpoint metadata: out of memory");
    }
    g[(*n)++] = (meta){k, v};
    return DT_OK;
}

dt_status dt_checkpoint_set_metadata(dt_checkpoint *c, const char *key, const char *value)
{
    const char *fn = "dt_checkpoint_set_metadata";
    if (!c || !value)
        return dt__fail(DT_ERR_ARG, "%s: %s is NULL", fn, c ? "value" : "checkpoint");
    DT_TRY(dt__ckpt_check_name(fn, key, false));
    return dt__ckpt_meta_set(&c->meta, &c->nmeta, key, value);
}

const char *dt_checkpoint_metadata(const dt_checkpoint *c, const char *key)
{
    for (int i = 0; c && key && i < c->nmeta; i++)
        if (!strcmp(c->meta[i].key, key))
            return c->meta[i].value;
    return NULL;
}

int dt_checkpoint_num_metadata(const dt_checkpoint *c)
{
    return c ? c->nmeta : 0;
}

const char *dt_checkpoint_metadata_key(const dt_checkpoint *c, int i)
{
    return c && i >= 0 && i < c->nmeta ? c->meta[i].key : NULL;
}

int64_t dt_checkpoint_save_counter(const dt_checkpoint *c)
{
    return c ? c->save_counter : 0;
}

dt_status dt_checkpoint_set_save_counter(dt_checkpoint *c, int64_t n)
{
    if (!c || n < 0)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_set_save_counter: %s",
                        c ? "a negative counter" : "checkpoint is NULL");
    c->save_counter = n;
    return DT_OK;
}
