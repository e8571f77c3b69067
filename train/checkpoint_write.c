/* Saving a checkpoint: every client opens PATH.tmp through HDF5's MPI-IO driver (sec2 for a single
 * client without MPI), every client creates the same groups, datasets (each at its tensor's GLOBAL
 * shape) and attributes, and then writes, collectively, only the blocks its own devices
 * hold: for a tensor of layout l, local device d writes block (offset, local shape) of d's
 * shard when d is the lowest owner of that block (coordinate 0 on every mesh axis l does not
 * shard: replicated axes), so each element is written once and nothing is gathered. A
 * collective H5Dwrite needs every client in it, so a tensor takes R rounds, R the most blocks
 * any client writes (an all-gather of the counts, once per save); a client with fewer blocks
 * joins the remaining rounds with an empty selection. The file is closed, client 0 syncs it,
 * renames it over PATH and syncs the directory, and the outcome is agreed. */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Test hook (train.h): called after each tensor's dataset is written. */
void (*dt__checkpoint_test_hook)(int item);

typedef struct witem {
    char path[PATH_MAX_LEN];
    const dt_tensor *t; /* not partial */
    dt_tensor *owned;   /* the reduced copy of a partial tensor */
    int blocks;         /* this client's blocks to write */
    int rounds;
} witem;

/* The variable name of an optimizer's slot variable among the checkpoint's variables. */
static const char *var_name(const dt_checkpoint *c, const dt_variable *v)
{
    for (int i = 0; i < c->n; i++)
        if (c->e[i].kind == E_VARIABLE && c->e[i].var == v)
            return c->e[i].name;
    return NULL;
}

static dt_status add_item(const char *fn, witem **items, int *n, const char *path,
                          const dt_tensor *t)
{
    const h5_dtype *row;
    DT_TRY(dt__tensor_require_values(t, fn));
    char what[PATH_MAX_LEN + 8];
    snprintf(what, sizeof what, "\"%s\"", path);
    DT_TRY(dt__h5_dtype_row(fn, t->dtype, what, &row));
    witem *g = realloc(*items, sizeof *g * (size_t)(*n + 1));
    if (!g)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    *items = g;
    memset(&g[*n], 0, sizeof g[*n]);
    snprintf(g[*n].path, sizeof g[*n].path, "%s", path);
    g[*n].t = t;
    (*n)++;
    return DT_OK;
}

/* Every tensor the checkpoint writes, in entry order (slots under their optimizer). Pure
 * metadata: every client builds the same list. */
static dt_status plan_write(const dt_checkpoint *c, witem **items, int *n)
{
    const char *fn = "dt_checkpoint_write";
    for (int i = 0; i < c->n; i++) {
        const entry *e = &c->e[i];
        if (e->kind == E_VARIABLE)
            DT_TRY(add_item(fn, items, n, e->path, dt_variable_value(e->var)));
        else if (e->kind == E_TENSOR)
            DT_TRY(add_item(fn, items, n, e->path, e->tensor));
        else if (e->kind == E_OPTIMIZER) {
            for (int k = 0; k < e->opt->nslots; k++) {
                const dt__opt_slot *sl = &e->opt->slots[k];
                const char *vn = var_name(c, sl->var);
                if (!vn)
                    return dt__fail(DT_ERR_ARG,
                                    "%s: optimizer \"%s\" has a slot for a variable the "
                                    "checkpoint does not hold (add the variable or its model)",
                                    fn, e->name);
                char p[PATH_MAX_LEN];
                snprintf(p, sizeof p, "%s/slots/%s/m", e->path, vn);
                if (sl->m)
                    DT_TRY(add_item(fn, items, n, p, sl->m));
                snprintf(p, sizeof p, "%s/slots/%s/v", e->path, vn);
                if (sl->v)
                    DT_TRY(add_item(fn, items, n, p, sl->v));
            }
        }
    }
    return DT_OK;
}

/* What every client must write alike: the path and each tensor's name and metadata. */
/* What every client must share about one tensor of a write: its path, dtype, shape, layout and
 * the mesh's shape (not its devices: a client-local mesh, mirrored on several clients, is over
 * other devices on every client). */
static uint64_t item_hash(const witem *it)
{
    const dt_tensor *t = it->t;
    uint64_t h = dt__hash(DT__HASH_SEED, it->path, strlen(it->path));
    h = dt__hash(h, &t->dtype, sizeof t->dtype);
    h = dt__hash(h, &t->rank, sizeof t->rank);
    h = dt__hash(h, t->shape, sizeof t->shape[0] * (size_t)t->rank);
    h = dt__hash(h, t->layout.axes, sizeof t->layout.axes[0] * (size_t)t->rank);
    h = dt__hash(h, &t->layout.partial, sizeof t->layout.partial);
    h = dt__hash(h, &t->mesh->num_axes, sizeof t->mesh->num_axes);
    h = dt__hash(h, t->mesh->names, sizeof t->mesh->names[0] * (size_t)t->mesh->num_axes);
    h = dt__hash(h, t->mesh->sizes, sizeof t->mesh->sizes[0] * (size_t)t->mesh->num_axes);
    return dt__hash(h, &t->mesh->type, sizeof t->mesh->type);
}

typedef struct plan_desc {
    const char *path;
    const witem *items;
    int n;
} plan_desc;

static uint64_t plan_hash(const plan_desc *d)
{
    uint64_t h = dt__hash(DT__HASH_SEED, d->path, strlen(d->path));
    for (int k = 0; k < d->n; k++) {
        uint64_t ih = item_hash(&d->items[k]);
        h = dt__hash(h, &ih, sizeof ih);
    }
    return h;
}

/* The write's fields for a disagreement's message: the file, the tensor count, then each
 * tensor (as many as fit). */
static int plan_fields(const void *ctx, dt__field out[], int max)
{
    const plan_desc *d = ctx;
    int k = 0;
    if (k < max)
        dt__field_set(&out[k++], "checkpoint file", NULL, 0, "%s", d->path);
    if (k < max)
        dt__field_set(&out[k++], "tensor count", &d->n, sizeof d->n, "%d", d->n);
    for (int i = 0; i < d->n && k < max; i++) {
        const dt_tensor *t = d->items[i].t;
        char name[48], shape[96], layout[128];
        uint64_t ih = item_hash(&d->items[i]);
        snprintf(name, sizeof name, "tensor %d", i);
        dt__shape_str(shape, sizeof shape, t->rank, t->shape);
        if (dt_layout_to_string(&t->layout, layout, sizeof layout) != DT_OK)
            snprintf(layout, sizeof layout, "?");
        dt__field_set(&out[k++], name, &ih, sizeof ih, "%s %s %s %s", d->items[i].path,
                      dt_dtype_name(t->dtype), shape, layout);
    }
    return k;
}

static void mesh_text(const dt_mesh *m, char *buf, size_t size)
{
    size_t k = 0;
    buf[0] = 0;
    for (int a = 0; a < m->num_axes && k < size; a++)
        k += (size_t)snprintf(buf + k, size - k, "%s%s=%d", a ? "," : "", m->names[a], m->sizes[a]);
}

static hid_t create_dataset(hid_t f, const char *path, hid_t type, int rank, const int64_t shape[])
{
    hsize_t dims[DT_MAX_RANK];
    for (int a = 0; a < rank; a++)
        dims[a] = (hsize_t)shape[a];
    hid_t sp = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t d = -1;
    /* contiguous, never filled: every element is written once by its owner */
    if (sp >= 0 && lcpl >= 0 && dcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0 &&
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0)
        d = H5Dcreate2(f, path, type, sp, lcpl, dcpl, H5P_DEFAULT);
    if (sp >= 0)
        H5Sclose(sp);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    if (dcpl >= 0)
        H5Pclose(dcpl);
    return d;
}

/* One tensor's dataset, attributes and blocks (rounds of collective writes). */
static dt_status write_item(hid_t f, hid_t dxpl, const witem *it, const char *file)
{
    const char *fn = "dt_checkpoint_write";
    const dt_tensor *t = it->t;
    const h5_dtype *row = &dt__h5_dtypes[t->dtype];
    const dt__backend *be = dt__backend_of(t->mesh->type);
    hid_t type = row->type();
    hid_t d = type < 0 ? -1 : create_dataset(f, it->path, type, t->rank, t->shape);
    hid_t fspace = d < 0 ? -1 : H5Dget_space(d);
    void *staging = NULL;
    dt_status s = DT_OK;
    if (fspace < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "creating dataset %s", it->path);
        s = dt__h5_fail(fn, file, what);
        goto done;
    }
    char lt[DT_STRING_MAX], mt[DT_STRING_MAX];
    mesh_text(t->mesh, mt, sizeof mt);
    s = dt_layout_to_string(&t->layout, lt, sizeof lt);
    if (s == DT_OK)
        s = dt__h5_attr_string(d, "layout", lt, file);
    if (s == DT_OK)
        s = dt__h5_attr_string(d, "mesh", mt, file);
    if (s == DT_OK)
        s = dt__h5_attr_string(d, "device_type", dt_device_type_name(t->mesh->type), file);
    if (s == DT_OK)
        s = dt__h5_attr_string(d, "dtype", row->name, file);
    int i = 0; /* next local device to consider */
    for (int r = 0; s == DT_OK && r < it->rounds; r++) {
        int64_t off[DT_MAX_RANK], ext[DT_MAX_RANK], elems = 0;
        const void *src = NULL;
        for (; i < t->num_local; i++) {
            s = dt__ckpt_block_of(&t->layout, t->rank, t->shape, i, off, ext, &elems);
            if (s != DT_OK || (elems > 0 && dt__ckpt_writes_block(&t->layout, i)))
                break;
        }
        if (s != DT_OK)
            break;
        bool mine = i < t->num_local;
        if (mine && be->host_accessible) {
            src = t->data[i];
        } else if (mine) { /* device memory: through a host copy of this block */
            free(staging);
            staging = malloc(t->bytes[i] ? t->bytes[i] : 1);
            if (!staging) {
                s = dt__fail(DT_ERR_NOMEM, "%s: out of memory for a block of %zu bytes", fn,
                             t->bytes[i]);
                break;
            }
            s = dt_tensor_unpack(t, i, staging, t->bytes[i]);
            src = staging;
        }
        hid_t mspace;
        if (s == DT_OK)
            s = dt__h5_select_block(fspace, t->rank, off, mine ? ext : NULL, &mspace);
        if (s != DT_OK)
            break;
        static const char none; /* a valid address for an empty selection */
        herr_t e = H5Dwrite(d, type, mspace, fspace, dxpl, src ? src : &none);
        H5Sclose(mspace);
        if (e < 0) {
            char what[PATH_MAX_LEN + 32];
            snprintf(what, sizeof what, "writing dataset %s", it->path);
            s = dt__h5_fail(fn, file, what);
        }
        i++;
    }
done:
    free(staging);
    if (fspace >= 0)
        H5Sclose(fspace);
    if (d >= 0 && H5Dclose(d) < 0 && s == DT_OK)
        s = dt__h5_fail(fn, file, "closing a dataset");
    if (type >= 0)
        H5Tclose(type);
    return s;
}

/* A scalar dataset written by client 0 (the others select nothing, as collective writes
 * need every client). */
static dt_status write_scalar(hid_t f, hid_t dxpl, const char *path, hid_t type, const void *v,
                              const char *file)
{
    hid_t d = create_dataset(f, path, type, 0, NULL);
    hid_t fspace = d < 0 ? -1 : H5Dget_space(d);
    dt_status s = DT_OK;
    if (fspace < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "creating dataset %s", path);
        s = dt__h5_fail("dt_checkpoint_write", file, what);
    }
    hid_t mspace = -1;
    int64_t none[1] = {0};
    if (s == DT_OK)
        s = dt__h5_select_block(fspace, 0, none, dt__rt.client == 0 ? none : NULL, &mspace);
    if (s == DT_OK && H5Dwrite(d, type, mspace, fspace, dxpl, v) < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "writing dataset %s", path);
        s = dt__h5_fail("dt_checkpoint_write", file, what);
    }
    if (mspace >= 0)
        H5Sclose(mspace);
    if (fspace >= 0)
        H5Sclose(fspace);
    if (d >= 0)
        H5Dclose(d);
    return s;
}

static dt_status write_group(hid_t f, const char *path, const char *file, hid_t *out)
{
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    *out = -1;
    if (lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0)
        *out = H5Gcreate2(f, path, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    if (*out < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "creating group %s", path);
        return dt__h5_fail("dt_checkpoint_write", file, what);
    }
    return DT_OK;
}

/* Everything but the tensors: root attributes, groups, counters, generators, optimizers'
 * settings and iterations, metadata. */
static dt_status write_rest(const dt_checkpoint *c, hid_t f, hid_t dxpl, const char *file)
{
    DT_TRY(dt__h5_attr_string(f, "format", FORMAT_NAME, file));
    DT_TRY(dt__h5_attr_i64(f, "format_version", FORMAT_VERSION, file));
    DT_TRY(dt__h5_attr_string(f, "library_version", dt_version(), file));
    DT_TRY(dt__h5_attr_i64(f, "num_clients", dt__rt.num_clients, file));
    static const char *const groups[] = {"variables", "tensors", "optimizers",
                                         "counters",  "random",  "metadata"};
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        if (dt__h5_exists(f, groups[k]))
            continue;
        hid_t g;
        DT_TRY(write_group(f, groups[k], file, &g));
        dt_status s = DT_OK;
        for (int i = 0; s == DT_OK && k == 5 && i < c->nmeta; i++)
            s = dt__h5_attr_string(g, c->meta[i].key, c->meta[i].value, file);
        H5Gclose(g);
        DT_TRY(s);
    }
    DT_TRY(write_scalar(f, dxpl, "counters/save_counter", H5T_STD_I64LE, &c->save_counter, file));
    for (int i = 0; i < c->n; i++) {
        const entry *e = &c->e[i];
        char p[PATH_MAX_LEN];
        if (e->kind == E_COUNTER) {
            DT_TRY(write_scalar(f, dxpl, e->path, H5T_STD_I64LE, e->counter, file));
        } else if (e->kind == E_GENERATOR) {
            snprintf(p, sizeof p, "%s/seed", e->path);
            DT_TRY(write_scalar(f, dxpl, p, H5T_STD_U64LE, &e->gen->seed, file));
            snprintf(p, sizeof p, "%s/counter", e->path);
            DT_TRY(write_scalar(f, dxpl, p, H5T_STD_U64LE, &e->gen->counter, file));
        } else if (e->kind == E_OPTIMIZER) {
            const dt_optimizer_config *cf = &e->opt->cfg;
            hid_t g = -1;
            if (dt__h5_exists(f, e->path))
                g = H5Gopen2(f, e->path, H5P_DEFAULT);
            else
                DT_TRY(write_group(f, e->path, file, &g));
            if (g < 0)
                return dt__h5_fail("dt_checkpoint_write", file, "opening an optimizer's group");
            dt_status s = dt__h5_attr_string(g, "kind", dt__optimizer_kind_name(cf->kind), file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "learning_rate", cf->learning_rate, file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "momentum", cf->momentum, file);
            if (s == DT_OK)
                s = dt__h5_attr_i64(g, "nesterov", cf->nesterov, file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "beta_1", cf->beta_1, file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "beta_2", cf->beta_2, file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "epsilon", cf->epsilon, file);
            if (s == DT_OK)
                s = dt__h5_attr_f64(g, "weight_decay", cf->weight_decay, file);
            H5Gclose(g);
            DT_TRY(s);
            snprintf(p, sizeof p, "%s/iterations", e->path);
            DT_TRY(write_scalar(f, dxpl, p, H5T_STD_I64LE, &e->opt->iterations, file));
        }
    }
    return DT_OK;
}

static void path_tmp(const char *path, char *buf, size_t size)
{
    snprintf(buf, size, "%s.tmp", path);
}

/* fsync a file or a directory by name. */
static dt_status sync_path(const char *fn, const char *path, bool dir)
{
    int fd = open(path, dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return dt__fail(DT_ERR_IO, "%s: syncing %s failed (%s)", fn, path, strerror(err));
    }
    close(fd);
    return DT_OK;
}

/* Client 0 makes PATH.tmp the checkpoint PATH: sync the file, rename, sync the directory. */
static dt_status publish(const char *fn, const char *tmp, const char *path)
{
    DT_TRY(sync_path(fn, tmp, false));
    if (rename(tmp, path) != 0)
        return dt__fail(DT_ERR_IO, "%s: renaming %s to %s failed (%s)", fn, tmp, path,
                        strerror(errno));
    char dir[PATH_MAX_LEN];
    snprintf(dir, sizeof dir, "%s", path);
    return sync_path(fn, dirname(dir), true);
}

dt_status dt_checkpoint_write(dt_checkpoint *c, const char *path)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_write";
    DT_TRY(dt__require_init(fn));
    witem *items = NULL;
    int n = 0;
    int *mine = NULL, *rounds = NULL;
    char tmp[PATH_MAX_LEN];
    hid_t fapl = -1, dxpl = -1, f = -1;
    dt_status s =
        !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn) : dt__ckpt_check_path(fn, path);
    if (s == DT_OK)
        s = plan_write(c, &items, &n);
    /* the plan is metadata, but a client passing another path or objects must not leave the
     * others in HDF5's collectives: agree on it, with a fingerprint of what each writes (a
     * NULL path, refused above, is described, not read) */
    plan_desc pd = {path ? path : "(null)", items, s == DT_OK ? n : 0};
    s = dt__agree_on(&(dt__agreement){.what = "dt_checkpoint_write",
                                      .fingerprint = plan_hash(&pd),
                                      .fields = plan_fields,
                                      .ctx = &pd},
                     s);
    if (s != DT_OK)
        goto done;
    /* partial tensors: their sums first (collective ops over their meshes, in item order) */
    for (int k = 0; s == DT_OK && k < n; k++)
        if (items[k].t->layout.partial) {
            dt_layout l = items[k].t->layout;
            l.partial = 0;
            s = dt_relayout(items[k].t, &l, NULL, &items[k].owned);
            items[k].t = items[k].owned;
        }
    if (s != DT_OK)
        goto done;
    mine = calloc((size_t)(n ? n : 1), sizeof *mine);
    rounds = calloc((size_t)(n ? n : 1), sizeof *rounds);
    if (!mine || !rounds)
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory for %d tensors", fn, n);
    for (int k = 0; s == DT_OK && k < n; k++)
        for (int i = 0; s == DT_OK && i < items[k].t->num_local; i++) {
            int64_t off[DT_MAX_RANK], ext[DT_MAX_RANK], elems;
            s = dt__ckpt_block_of(&items[k].t->layout, items[k].t->rank, items[k].t->shape, i, off,
                                  ext, &elems);
            mine[k] += s == DT_OK && elems > 0 && dt__ckpt_writes_block(&items[k].t->layout, i);
        }
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK)
        s = dt__ckpt_rounds_max(n, mine, rounds);
    if (s != DT_OK)
        goto done;
    for (int k = 0; k < n; k++)
        items[k].rounds = rounds[k];

    path_tmp(path, tmp, sizeof tmp);
    pthread_mutex_lock(&dt__h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    fapl = dt__h5_fapl(false);
    dxpl = dt__h5_dxpl(false);
    if (fapl < 0 || dxpl < 0)
        s = dt__h5_fail(fn, tmp, "setting up file access");
    if (s == DT_OK) {
        f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        if (f < 0)
            s = dt__h5_fail(fn, tmp, "creating");
    }
    for (int k = 0; s == DT_OK && k < n; k++) {
        s = write_item(f, dxpl, &items[k], tmp);
        if (s == DT_OK && dt__checkpoint_test_hook)
            dt__checkpoint_test_hook(k);
    }
    if (s == DT_OK)
        s = write_rest(c, f, dxpl, tmp);
    if (f >= 0 && H5Fclose(f) < 0 && s == DT_OK)
        s = dt__h5_fail(fn, tmp, "closing");
    if (fapl >= 0)
        H5Pclose(fapl);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    pthread_mutex_unlock(&dt__h5_lock);
    /* every client has written and closed: then client 0 publishes, or removes the rest */
    s = dt__agree(dt__rt.world, s);
    dt_status p = DT_OK;
    if (dt__rt.client == 0) {
        if (s == DT_OK)
            p = publish(fn, tmp, path);
        else
            unlink(tmp);
    }
    if (s == DT_OK)
        s = dt__agree(dt__rt.world, p);
done:
    for (int k = 0; k < n; k++)
        dt_tensor_free(items[k].owned);
    free(items);
    free(mine);
    free(rounds);
    return s;
}

dt_status dt_checkpoint_save(dt_checkpoint *c, const char *prefix, char *path, size_t size)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_save";
    if (path && size)
        path[0] = 0;
    if (!c)
        return dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn);
    DT_TRY(dt__ckpt_check_path(fn, prefix));
    char name[PATH_MAX_LEN];
    int64_t next = c->save_counter + 1;
    int len = snprintf(name, sizeof name, "%s-%" PRId64 ".h5", prefix, next);
    if (len >= (int)sizeof name)
        return dt__fail(DT_ERR_ARG, "%s: prefix \"%s\" too long", fn, prefix);
    if (path && (size_t)len >= size)
        return dt__fail(DT_ERR_ARG, "%s: path buffer of %zu bytes, %d needed", fn, size, len + 1);
    int64_t was = c->save_counter;
    c->save_counter = next;
    dt_status s = dt_checkpoint_write(c, name);
    if (s != DT_OK) {
        c->save_counter = was;
        return s;
    }
    if (path)
        snprintf(path, size, "%s", name);
    return DT_OK;
}
