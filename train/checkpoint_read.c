/* Restoring a checkpoint: every value is planned first (names, dtypes and shapes against the file),
 * then read: each local device of the target layout reads the block of its shard, straight into its
 * component when the device is host memory, in rounds as a save writes (train/checkpoint_write.c);
 * a local device whose block another local device already read copies it. Only when every value is
 * read (and the clients agree) are the objects changed. */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Reads need no coordination: each client opens the file read-only on its own (sec2) and
 * reads the blocks of its devices with independent reads. Collective MPI-IO reads (false)
 * gave nothing on a local file system and cost MPICH's blocking collectives, which spin when
 * clients outnumber cores (a restore at -n 4 on 2 cores took 20 s instead of 1 s). */
#define READ_ALONE true

/* Open a checkpoint and check that it is one. */
static dt_status open_read(const char *fn, const char *path, bool alone, hid_t *out)
{
    *out = -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return dt__fail(DT_ERR_IO, "%s: %s cannot be read (%s)", fn, path, strerror(errno));
    hid_t fapl = dt__h5_fapl(alone);
    if (fapl < 0)
        return dt__h5_fail(fn, path, "setting up file access");
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f < 0) {
        char why[400];
        dt__h5_reason(why, sizeof why); /* before the next HDF5 call clears it */
        H5Pclose(fapl);
        return dt__fail(DT_ERR_IO,
                        "%s: %s is not a readable HDF5 file (%s); a truncated or foreign file, "
                        "or a save that did not finish",
                        fn, path, why);
    }
    H5Pclose(fapl);
    char fmt[64];
    if (!dt__h5_attr_read_string(f, "format", fmt, sizeof fmt) || strcmp(fmt, FORMAT_NAME)) {
        H5Fclose(f);
        return dt__fail(DT_ERR_IO,
                        "%s: %s is an HDF5 file but not a dtensor checkpoint (its root has no "
                        "attribute format = \"%s\")",
                        fn, path, FORMAT_NAME);
    }
    int64_t version = 0;
    dt__h5_attr_read_num(f, "format_version", H5T_NATIVE_INT64, &version);
    if (version < 1 || version > FORMAT_VERSION) {
        H5Fclose(f);
        return dt__fail(DT_ERR_IO,
                        "%s: %s has checkpoint format version %" PRId64
                        "; this library reads 1 to %d",
                        fn, path, version, FORMAT_VERSION);
    }
    *out = f;
    return DT_OK;
}

/* The dtype of a dataset: its "dtype" attribute, else the first row whose HDF5 type has the
 * dataset's class, size and sign (files written by other programs). */
static dt_status dataset_dtype(const char *fn, hid_t d, const char *path, const char *name,
                               dt_dtype *out)
{
    char attr[32];
    if (dt__h5_attr_read_string(d, "dtype", attr, sizeof attr)) {
        for (int k = 0; k < DT_DTYPE_COUNT; k++)
            if (dt__h5_dtypes[k].type && !strcmp(dt__h5_dtypes[k].name, attr)) {
                *out = (dt_dtype)k;
                return DT_OK;
            }
        return dt__fail(DT_ERR_DTYPE, "%s: %s in %s has dtype \"%s\", which this library lacks", fn,
                        name, path, attr);
    }
    hid_t ft = H5Dget_type(d);
    dt_status s =
        dt__fail(DT_ERR_DTYPE, "%s: %s in %s has an HDF5 type no dtype maps to", fn, name, path);
    for (int k = 0; ft >= 0 && k < DT_DTYPE_COUNT; k++) {
        if (!dt__h5_dtypes[k].type || dt__h5_dtypes[k].attr_only)
            continue;
        hid_t rt = dt__h5_dtypes[k].type();
        bool same = H5Tget_class(ft) == H5Tget_class(rt) && H5Tget_size(ft) == H5Tget_size(rt) &&
                    (H5Tget_class(ft) != H5T_INTEGER || H5Tget_sign(ft) == H5Tget_sign(rt));
        H5Tclose(rt);
        if (same) {
            *out = (dt_dtype)k;
            s = DT_OK;
            break;
        }
    }
    if (ft >= 0)
        H5Tclose(ft);
    H5Eclear2(H5E_DEFAULT);
    return s;
}

/* Shape and dtype of the dataset at `name`. */
static dt_status dataset_info(const char *fn, hid_t f, const char *path, const char *name,
                              dt_dtype *dtype, int *rank, int64_t shape[])
{
    if (!dt__h5_exists(f, name))
        return dt__fail(DT_ERR_ARG, "%s: %s holds no \"%s\"", fn, path, name);
    hid_t o = H5Oopen(f, name, H5P_DEFAULT);
    bool is_dataset = o >= 0 && H5Iget_type(o) == H5I_DATASET;
    if (o >= 0)
        H5Oclose(o);
    if (!is_dataset) {
        H5Eclear2(H5E_DEFAULT);
        return dt__fail(DT_ERR_ARG, "%s: \"%s\" in %s is not a dataset", fn, name, path);
    }
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0)
        return dt__h5_fail(fn, path, "opening a dataset");
    hid_t sp = H5Dget_space(d);
    int r = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    dt_status s = DT_OK;
    if (r < 0 || r > DT_MAX_RANK || (sp >= 0 && H5Sget_simple_extent_type(sp) == H5S_NULL)) {
        s = dt__fail(DT_ERR_SHAPE, "%s: \"%s\" in %s has rank %d; at most %d", fn, name, path, r,
                     DT_MAX_RANK);
    } else {
        hsize_t dims[DT_MAX_RANK];
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int a = 0; a < r; a++)
            shape[a] = (int64_t)dims[a];
        *rank = r;
        s = dataset_dtype(fn, d, path, name, dtype);
    }
    if (sp >= 0)
        H5Sclose(sp);
    H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
    return s;
}

/* The dataset `name` (checked: dtype, rank, shape) read in layout l, each local device reading
 * its block, in rounds of collective reads. Collective (every client, same arguments). */
static dt_status read_tensor(const char *fn, hid_t f, hid_t dxpl, const char *file,
                             const char *name, const dt_layout *l, dt_dtype dtype, int rank,
                             const int64_t shape[], dt_tensor **out)
{
    *out = NULL;
    const dt_mesh *m = l->mesh;
    const dt__backend *be = dt__backend_of(m->type);
    int nl = m->num_local;
    int64_t(*offs)[DT_MAX_RANK] = calloc((size_t)(nl ? nl : 1), sizeof *offs);
    int64_t(*exts)[DT_MAX_RANK] = calloc((size_t)(nl ? nl : 1), sizeof *exts);
    int64_t *elems = calloc((size_t)(nl ? nl : 1), sizeof *elems);
    int *same = calloc((size_t)(nl ? nl : 1), sizeof *same); /* earlier device, same block */
    void **host = calloc((size_t)(nl ? nl : 1), sizeof *host);
    dt_tensor *t = NULL;
    size_t esz = dt_dtype_size(dtype);
    hid_t d = -1, fspace = -1, type = -1;
    dt_status s = DT_OK;
    int mine = 0; /* blocks this client reads (set before the goto that skips counting) */
    if (!offs || !exts || !elems || !same || !host) {
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory for %d devices", fn, nl);
        goto agree;
    }
    for (int i = 0; s == DT_OK && i < nl; i++) {
        s = dt__ckpt_block_of(l, rank, shape, i, offs[i], exts[i], &elems[i]);
        same[i] = -1;
        for (int j = 0; s == DT_OK && j < i && same[i] < 0; j++)
            if (!memcmp(offs[i], offs[j], sizeof offs[i]) &&
                !memcmp(exts[i], exts[j], sizeof exts[i]))
                same[i] = j;
        mine += s == DT_OK && same[i] < 0 && elems[i] > 0;
    }
    if (s == DT_OK && be->host_accessible) {
        s = dt__tensor_alloc(l, dtype, rank, shape, &t);
        for (int i = 0; s == DT_OK && i < nl; i++)
            host[i] = t->data[i];
    } else {
        for (int i = 0; s == DT_OK && i < nl; i++) {
            host[i] = malloc(elems[i] ? (size_t)elems[i] * esz : 1);
            if (!host[i])
                s = dt__fail(DT_ERR_NOMEM, "%s: out of memory for a block of %" PRId64 " elements",
                             fn, elems[i]);
        }
    }
    /* a failure here is this client's own (memory): agree before the collective reads */
agree:
    s = dt__agree(dt__rt.world, s);
    int rounds = 0;
    if (s == DT_OK)
        s = READ_ALONE ? (rounds = mine, DT_OK) : dt__ckpt_rounds_max(1, &mine, &rounds);
    if (s != DT_OK)
        goto done;
    type = dt__h5_dtypes[dtype].type();
    d = type < 0 ? -1 : H5Dopen2(f, name, H5P_DEFAULT);
    fspace = d < 0 ? -1 : H5Dget_space(d);
    if (fspace < 0)
        s = dt__h5_fail(fn, file, "opening a dataset");
    int i = 0;
    for (int r = 0; s == DT_OK && r < rounds; r++) {
        while (i < nl && (same[i] >= 0 || elems[i] == 0))
            i++;
        bool have = i < nl;
        hid_t mspace;
        s = dt__h5_select_block(fspace, rank, have ? offs[i] : NULL, have ? exts[i] : NULL,
                                &mspace);
        if (s != DT_OK)
            break;
        static char none;
        if (H5Dread(d, type, mspace, fspace, dxpl, have ? host[i] : &none) < 0) {
            char what[PATH_MAX_LEN + 32];
            snprintf(what, sizeof what, "reading dataset %s", name);
            s = dt__h5_fail(fn, file, what);
        }
        H5Sclose(mspace);
        i++;
    }
    for (int j = 0; s == DT_OK && j < nl; j++)
        if (same[j] >= 0 && elems[j] > 0)
            memcpy(host[j], host[same[j]], (size_t)elems[j] * esz);
    if (s == DT_OK && !be->host_accessible) {
        const int64_t **shp = malloc(sizeof *shp * (size_t)(nl ? nl : 1));
        if (!shp)
            s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
        for (int j = 0; s == DT_OK && j < nl; j++)
            shp[j] = exts[j];
        if (s == DT_OK)
            s = dt_tensor_pack(l, dtype, rank, shape, nl, (const void *const *)host, shp, &t);
        free(shp);
    }
done:
    if (fspace >= 0)
        H5Sclose(fspace);
    if (d >= 0)
        H5Dclose(d);
    if (type >= 0)
        H5Tclose(type);
    if (host && (!be->host_accessible))
        for (int j = 0; j < nl; j++)
            free(host[j]);
    free(host);
    free(offs);
    free(exts);
    free(elems);
    free(same);
    if (s != DT_OK) {
        dt_tensor_free(t);
        return s;
    }
    *out = t;
    return DT_OK;
}

/* A scalar dataset of any integer type read as `mem` (every client reads it). */
static dt_status read_scalar(const char *fn, hid_t f, hid_t dxpl, const char *file,
                             const char *name, hid_t mem, void *out)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t sp = d < 0 ? -1 : H5Dget_space(d);
    hid_t ft = d < 0 ? -1 : H5Dget_type(d);
    dt_status s = DT_OK;
    if (sp < 0 || ft < 0)
        s = dt__h5_fail(fn, file, "opening a scalar dataset");
    else if (H5Sget_simple_extent_type(sp) != H5S_SCALAR || H5Tget_class(ft) != H5T_INTEGER)
        s = dt__fail(DT_ERR_ARG, "%s: \"%s\" in %s is not an integer scalar", fn, name, file);
    else if (H5Dread(d, mem, H5S_ALL, H5S_ALL, dxpl, out) < 0)
        s = dt__h5_fail(fn, file, "reading a scalar");
    if (ft >= 0)
        H5Tclose(ft);
    if (sp >= 0)
        H5Sclose(sp);
    if (d >= 0)
        H5Dclose(d);
    H5Eclear2(H5E_DEFAULT);
    return s;
}

/* What a read changes, staged until every value is in. */
typedef struct ritem {
    char path[PATH_MAX_LEN];
    const dt_layout *layout;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    dt_variable *var;  /* a variable's value, or a slot's variable */
    dt_optimizer *opt; /* a slot of this optimizer */
    int slot;          /* 0: m, 1: v */
    dt_tensor *value;  /* read */
} ritem;

static herr_t meta_collect(hid_t loc, const char *name, const H5A_info_t *info, void *ctx)
{
    (void)info;
    void **p = ctx;
    char v[4096];
    if (dt__h5_attr_read_string(loc, name, v, sizeof v) &&
        dt__ckpt_meta_set((meta **)p[0], (int *)p[1], name, v) != DT_OK)
        return -1;
    return 0;
}

/* Plan one tensor to read: present, dtype and shape as the object's. */
static dt_status plan_tensor(const char *fn, hid_t f, const char *file, const char *what,
                             const char *name, const dt_tensor *like, ritem *it)
{
    dt_dtype dt;
    int rank = 0;
    int64_t shape[DT_MAX_RANK];
    DT_TRY(dataset_info(fn, f, file, name, &dt, &rank, shape));
    char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
    dt__shape_str(sa, sizeof sa, like->rank, like->shape);
    dt__shape_str(sb, sizeof sb, rank, shape);
    if (dt != like->dtype)
        return dt__fail(DT_ERR_DTYPE, "%s: %s is %s%s, %s holds %s%s at \"%s\"", fn, what,
                        dt_dtype_name(like->dtype), sa, file, dt_dtype_name(dt), sb, name);
    bool ok = rank == like->rank;
    for (int a = 0; ok && a < rank; a++)
        ok = shape[a] == like->shape[a];
    if (!ok)
        return dt__fail(DT_ERR_SHAPE, "%s: %s has shape %s, %s holds %s at \"%s\"", fn, what, sa,
                        file, sb, name);
    snprintf(it->path, sizeof it->path, "%s", name);
    it->layout = &like->layout;
    it->dtype = dt;
    it->rank = rank;
    memcpy(it->shape, shape, sizeof shape);
    return DT_OK;
}

static dt_status plan_read(dt_checkpoint *c, hid_t f, const char *file, ritem *items, int *n)
{
    const char *fn = "dt_checkpoint_read";
    *n = 0;
    for (int i = 0; i < c->n; i++) {
        const entry *e = &c->e[i];
        char what[NAME_MAX_LEN + 32], p[PATH_MAX_LEN];
        if (e->kind == E_VARIABLE) {
            snprintf(what, sizeof what, "variable \"%s\"", e->name);
            ritem *it = &items[(*n)++];
            DT_TRY(plan_tensor(fn, f, file, what, e->path, dt_variable_value(e->var), it));
            it->var = e->var;
        } else if (e->kind == E_COUNTER || e->kind == E_GENERATOR) {
            if (!dt__h5_exists(f, e->path))
                return dt__fail(DT_ERR_ARG, "%s: %s holds no %s \"%s\" (no %s)", fn, file,
                                e->kind == E_COUNTER ? "counter" : "generator", e->name, e->path);
        } else if (e->kind == E_OPTIMIZER) {
            snprintf(p, sizeof p, "%s/iterations", e->path);
            if (!dt__h5_exists(f, p))
                return dt__fail(DT_ERR_ARG, "%s: %s holds no optimizer \"%s\" (no %s)", fn, file,
                                e->name, p);
            char kind[32];
            hid_t g = H5Gopen2(f, e->path, H5P_DEFAULT);
            dt__h5_attr_read_string(g, "kind", kind, sizeof kind);
            if (g >= 0)
                H5Gclose(g);
            const char *want = dt__optimizer_kind_name(e->opt->cfg.kind);
            if (strcmp(kind, want))
                return dt__fail(DT_ERR_ARG, "%s: optimizer \"%s\" is %s, %s holds a \"%s\" one", fn,
                                e->name, want, file, kind);
            /* slots of the checkpoint's variables that the file has */
            for (int k = 0; k < c->n; k++) {
                if (c->e[k].kind != E_VARIABLE)
                    continue;
                int want_slots = dt__optimizer_slot_count(e->opt), have = 0;
                for (int sl = 0; sl < want_slots; sl++) {
                    snprintf(p, sizeof p, "%s/slots/%s/%s", e->path, c->e[k].name, sl ? "v" : "m");
                    have += dt__h5_exists(f, p);
                }
                if (have && have != want_slots)
                    return dt__fail(DT_ERR_ARG,
                                    "%s: %s holds %d of the %d slots of optimizer \"%s\" for "
                                    "\"%s\"",
                                    fn, file, have, want_slots, e->name, c->e[k].name);
                for (int sl = 0; have && sl < want_slots; sl++) {
                    snprintf(p, sizeof p, "%s/slots/%s/%s", e->path, c->e[k].name, sl ? "v" : "m");
                    snprintf(what, sizeof what, "the slot %s of \"%s\"", sl ? "v" : "m",
                             c->e[k].name);
                    ritem *it = &items[(*n)++];
                    DT_TRY(plan_tensor(fn, f, file, what, p, dt_variable_value(c->e[k].var), it));
                    it->var = c->e[k].var;
                    it->opt = e->opt;
                    it->slot = sl;
                }
            }
        }
    }
    return DT_OK;
}

dt_status dt_checkpoint_read(dt_checkpoint *c, const char *path)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_read";
    DT_TRY(dt__require_init(fn));
    ritem *items = NULL;
    int n = 0, cap = 0;
    hid_t f = -1, dxpl = -1;
    meta *md = NULL;
    int nmd = 0;
    int64_t save_counter = 0;
    int64_t *counters = NULL;
    uint64_t *gens = NULL;
    int64_t *iters = NULL;
    dt_status s =
        !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn) : dt__ckpt_check_path(fn, path);
    if (s == DT_OK) {
        for (int i = 0; i < c->n; i++)
            cap += c->e[i].kind == E_OPTIMIZER ? 2 * c->n : 1;
        items = calloc((size_t)(cap ? cap : 1), sizeof *items);
        counters = calloc((size_t)(c->n ? c->n : 1), sizeof *counters);
        gens = calloc((size_t)(c->n ? 2 * c->n : 1), sizeof *gens);
        iters = calloc((size_t)(c->n ? c->n : 1), sizeof *iters);
        if (!items || !counters || !gens || !iters)
            s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    }
    pthread_mutex_lock(&dt__h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (s == DT_OK)
        s = open_read(fn, path, READ_ALONE, &f);
    if (s == DT_OK)
        s = plan_read(c, f, path, items, &n);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK && (dxpl = dt__h5_dxpl(READ_ALONE)) < 0)
        s = dt__h5_fail(fn, path, "setting up transfers");
    for (int k = 0; s == DT_OK && k < n; k++)
        s = read_tensor(fn, f, dxpl, path, items[k].path, items[k].layout, items[k].dtype,
                        items[k].rank, items[k].shape, &items[k].value);
    for (int i = 0; s == DT_OK && i < c->n; i++) {
        const entry *e = &c->e[i];
        char p[PATH_MAX_LEN];
        if (e->kind == E_COUNTER)
            s = read_scalar(fn, f, dxpl, path, e->path, H5T_NATIVE_INT64, &counters[i]);
        else if (e->kind == E_OPTIMIZER) {
            snprintf(p, sizeof p, "%s/iterations", e->path);
            s = read_scalar(fn, f, dxpl, path, p, H5T_NATIVE_INT64, &iters[i]);
        } else if (e->kind == E_GENERATOR) {
            snprintf(p, sizeof p, "%s/seed", e->path);
            s = read_scalar(fn, f, dxpl, path, p, H5T_NATIVE_UINT64, &gens[2 * i]);
            snprintf(p, sizeof p, "%s/counter", e->path);
            if (s == DT_OK)
                s = read_scalar(fn, f, dxpl, path, p, H5T_NATIVE_UINT64, &gens[2 * i + 1]);
        }
    }
    if (s == DT_OK && dt__h5_exists(f, "counters/save_counter"))
        s = read_scalar(fn, f, dxpl, path, "counters/save_counter", H5T_NATIVE_INT64,
                        &save_counter);
    if (s == DT_OK && dt__h5_exists(f, "metadata")) {
        void *ctx[2] = {&md, &nmd};
        hid_t g = H5Gopen2(f, "metadata", H5P_DEFAULT);
        if (g < 0 || H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, NULL, meta_collect, ctx) < 0)
            s = dt__h5_fail(fn, path, "reading the metadata");
        if (g >= 0)
            H5Gclose(g);
    }
    if (dxpl >= 0)
        H5Pclose(dxpl);
    if (f >= 0 && H5Fclose(f) < 0 && s == DT_OK)
        s = dt__h5_fail(fn, path, "closing");
    pthread_mutex_unlock(&dt__h5_lock);
    s = dt__agree(dt__rt.world, s);
    if (s != DT_OK)
        goto done;
    /* every value is in: change the objects (nothing below fails but for memory) */
    for (int k = 0; s == DT_OK && k < n; k++) {
        ritem *it = &items[k];
        if (it->opt)
            continue;
        s = dt__variable_adopt(it->var, it->value);
        if (s == DT_OK)
            it->value = NULL;
    }
    for (int k = 0; s == DT_OK && k < n; k++) {
        ritem *it = &items[k];
        if (!it->opt || it->slot != 0)
            continue;
        ritem *v = NULL; /* Adam's second moment for the same variable */
        for (int j = 0; j < n; j++)
            if (items[j].opt == it->opt && items[j].var == it->var && items[j].slot == 1)
                v = &items[j];
        s = dt__optimizer_set_slot(it->opt, it->var, it->value, v ? v->value : NULL);
        if (s == DT_OK) {
            it->value = NULL;
            if (v)
                v->value = NULL;
        }
    }
    for (int i = 0; s == DT_OK && i < c->n; i++) {
        const entry *e = &c->e[i];
        if (e->kind == E_COUNTER)
            *e->counter = counters[i];
        else if (e->kind == E_OPTIMIZER)
            e->opt->iterations = iters[i];
        else if (e->kind == E_GENERATOR)
            dt_generator_reset(e->gen, gens[2 * i], gens[2 * i + 1]);
    }
    if (s == DT_OK) {
        c->save_counter = save_counter;
        for (int i = 0; s == DT_OK && i < nmd; i++)
            s = dt__ckpt_meta_set(&c->meta, &c->nmeta, md[i].key, md[i].value);
    }
done:
    for (int k = 0; items && k < n; k++)
        dt_tensor_free(items[k].value);
    free(items);
    free(counters);
    free(gens);
    free(iters);
    dt__ckpt_meta_clear(md, nmd);
    return s;
}

dt_status dt_checkpoint_read_tensor(const char *path, const char *name, const dt_layout *layout,
                                    dt_tensor **out)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_read_tensor";
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    DT_TRY(dt__require_init(fn));
    dt_status s = dt__ckpt_check_path(fn, path);
    if (s == DT_OK && (!name || !layout))
        s = dt__fail(DT_ERR_ARG, "%s: %s is NULL", fn, name ? "layout" : "name");
    if (s == DT_OK)
        s = dt__ckpt_check_name(fn, name, true);
    if (s == DT_OK)
        s = dt_layout_check(layout);
    if (s == DT_OK && layout->partial) {
        char lt[DT_STRING_MAX];
        s = dt__fail(DT_ERR_LAYOUT, "%s: layout \"%s\" is partial; read into a non-partial one", fn,
                     dt__layout_str(layout, lt, sizeof lt));
    }
    hid_t f = -1, dxpl = -1;
    dt_dtype dtype = DT_DTYPE_F32;
    int rank = 0;
    int64_t shape[DT_MAX_RANK];
    pthread_mutex_lock(&dt__h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (s == DT_OK)
        s = open_read(fn, path, READ_ALONE, &f);
    if (s == DT_OK)
        s = dataset_info(fn, f, path, name, &dtype, &rank, shape);
    if (s == DT_OK && rank != layout->rank)
        s = dt__fail(DT_ERR_LAYOUT, "%s: \"%s\" in %s has rank %d, the layout rank %d", fn, name,
                     path, rank, layout->rank);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK && (dxpl = dt__h5_dxpl(READ_ALONE)) < 0)
        s = dt__h5_fail(fn, path, "setting up transfers");
    if (s == DT_OK)
        s = read_tensor(fn, f, dxpl, path, name, layout, dtype, rank, shape, out);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    if (f >= 0)
        H5Fclose(f);
    pthread_mutex_unlock(&dt__h5_lock);
    s = dt__agree(dt__rt.world, s);
    if (s != DT_OK) {
        dt_tensor_free(*out);
        *out = NULL;
    }
    return s;
}

dt_status dt_checkpoint_tensor_info(const char *path, const char *name, dt_dtype *dtype, int *rank,
                                    int64_t shape[])
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_tensor_info";
    if (!dtype || !rank || !shape)
        return dt__fail(DT_ERR_ARG, "%s: an out-parameter is NULL", fn);
    DT_TRY(dt__ckpt_check_path(fn, path));
    if (!name)
        return dt__fail(DT_ERR_ARG, "%s: name is NULL", fn);
    pthread_mutex_lock(&dt__h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = -1;
    dt_status s = open_read(fn, path, true, &f);
    if (s == DT_OK)
        s = dataset_info(fn, f, path, name, dtype, rank, shape);
    if (f >= 0)
        H5Fclose(f);
    pthread_mutex_unlock(&dt__h5_lock);
    return s;
}
