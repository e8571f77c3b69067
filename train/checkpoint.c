/* Checkpoints of sharded state in one HDF5 file (the format is in include/dtensor.h).
 *
 * Save: every client opens PATH.tmp through HDF5's MPI-IO driver (sec2 for a single client
 * without MPI), every client creates the same groups, datasets (each at its tensor's GLOBAL
 * shape) and attributes, and then writes, collectively, only the blocks its own devices
 * hold: for a tensor of layout l, local device d writes block (offset, local shape) of d's
 * shard when d is the lowest owner of that block (coordinate 0 on every mesh axis l does not
 * shard: replicated axes), so each element is written once and nothing is gathered. A
 * collective H5Dwrite needs every client in it, so a tensor takes R rounds, R the most blocks
 * any client writes (an all-gather of the counts, once per save); a client with fewer blocks
 * joins the remaining rounds with an empty selection. The file is closed, client 0 syncs it,
 * renames it over PATH and syncs the directory, and the outcome is agreed.
 *
 * Restore: every value is planned first (names, dtypes and shapes against the file), then
 * read: each local device of the target layout reads the block of its shard, straight into
 * its component when the device is host memory, in rounds as above; a local device whose
 * block another local device already read copies it. Only when every value is read (and the
 * clients agree) are the objects changed. */
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads need no coordination: each client opens the file read-only on its own (sec2) and
 * reads the blocks of its devices with independent reads. Collective MPI-IO reads (false)
 * gave nothing on a local file system and cost MPICH's blocking collectives, which spin when
 * clients outnumber cores (a restore at -n 4 on 2 cores took 20 s instead of 1 s). */
#define READ_ALONE true

#define FORMAT_NAME "dtensor-checkpoint"
#define FORMAT_VERSION 1
#define NAME_MAX_LEN 256
#define PATH_MAX_LEN 4096

/* Test hook (train.h): called after each tensor's dataset is written. */
void (*dt__checkpoint_test_hook)(int item);

/* HDF5 is not built thread-safe: one caller at a time. */
static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- dtypes: one row per dtype ------------------------------------------------------------ */

/* The file type of each dtype (little-endian, as numpy writes on x86, which is also the memory
 * layout here, so no conversion runs) and the "dtype" attribute written beside it. A dtype
 * HDF5 has no type for is stored as raw bits with attr_only set: it is recognised by its
 * attribute only (e.g. bfloat16 as 16-bit unsigned integers). A dtype without a row cannot be
 * checkpointed (DT_ERR_UNSUPPORTED). */
typedef struct h5_dtype {
    const char *name;
    hid_t (*type)(void);
    bool attr_only;
} h5_dtype;

static hid_t h5_f32(void)
{
    return H5Tcopy(H5T_IEEE_F32LE);
}
static hid_t h5_f64(void)
{
    return H5Tcopy(H5T_IEEE_F64LE);
}
static hid_t h5_i32(void)
{
    return H5Tcopy(H5T_STD_I32LE);
}
static hid_t h5_i64(void)
{
    return H5Tcopy(H5T_STD_I64LE);
}
static hid_t h5_u16(void)
{
    return H5Tcopy(H5T_STD_U16LE);
}
/* IEEE binary16, which HDF5 builds from its f32 type: sign bit 15, exponent bits 10..14
 * (bias 15), mantissa bits 0..9 (h5py and numpy read it as float16). */
static hid_t h5_f16(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t >= 0 && (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 ||
                   H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0)) {
        H5Tclose(t);
        return -1;
    }
    return t;
}
static hid_t h5_u8(void)
{
    return H5Tcopy(H5T_STD_U8LE);
}
static hid_t h5_i8(void)
{
    return H5Tcopy(H5T_STD_I8LE);
}

static const h5_dtype h5_dtypes[DT_DTYPE_COUNT] = {
    [DT_DTYPE_F32] = {"float32", h5_f32, false},
    [DT_DTYPE_F64] = {"float64", h5_f64, false},
    [DT_DTYPE_I32] = {"int32", h5_i32, false},
    [DT_DTYPE_I64] = {"int64", h5_i64, false},
    [DT_DTYPE_BF16] = {"bfloat16", h5_u16, true}, /* HDF5 has no bfloat16: its raw bits */
    [DT_DTYPE_F16] = {"float16", h5_f16, false},
    [DT_DTYPE_BOOL] = {"bool", h5_u8, true}, /* one byte, 0 or 1 */
    [DT_DTYPE_U8] = {"uint8", h5_u8, false},
    [DT_DTYPE_I8] = {"int8", h5_i8, false},
};

static dt_status dtype_row(const char *fn, dt_dtype d, const char *what, const h5_dtype **out)
{
    if (!dt__dtype_valid(d) || !h5_dtypes[d].type)
        return dt__fail(DT_ERR_UNSUPPORTED, "%s: %s has dtype %s, which checkpoints cannot store",
                        fn, what, dt_dtype_name(d));
    *out = &h5_dtypes[d];
    return DT_OK;
}

/* ---- HDF5 errors -------------------------------------------------------------------------- */

typedef struct h5_why {
    char top[160], inner[160];
} h5_why;

static herr_t why_walk(unsigned n, const H5E_error2_t *e, void *ctx)
{
    h5_why *w = ctx;
    if (!e->desc || !e->desc[0])
        return 0;
    if (n == 0)
        snprintf(w->top, sizeof w->top, "%s", e->desc);
    snprintf(w->inner, sizeof w->inner, "%s", e->desc);
    return 0;
}

/* HDF5's own account of the last failure ("unable to open file: file signature not found"),
 * then the stack cleared. */
static const char *h5_reason(char *buf, size_t size)
{
    h5_why w = {{0}, {0}};
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, why_walk, &w);
    H5Eclear2(H5E_DEFAULT);
    if (!w.top[0])
        snprintf(buf, size, "HDF5 gave no reason");
    else if (!strcmp(w.top, w.inner))
        snprintf(buf, size, "%s", w.top);
    else
        snprintf(buf, size, "%s: %s", w.top, w.inner);
    for (char *p = buf; *p; p++) /* MPI-IO's messages span lines */
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
    return buf;
}

static dt_status h5_fail(const char *fn, const char *file, const char *what)
{
    char why[400];
    return dt__fail(DT_ERR_IO, "%s: %s %s failed (%s)", fn, file, what, h5_reason(why, sizeof why));
}

/* ---- names ---------------------------------------------------------------------------------- */

/* NAME: parts of [A-Za-z0-9_.:-], separated by single '/', none "." or "..". */
static dt_status check_name(const char *fn, const char *name, bool slashes)
{
    if (!name || !name[0])
        return dt__fail(DT_ERR_ARG, "%s: name is %s", fn, name ? "empty" : "NULL");
    size_t n = strlen(name);
    if (n >= NAME_MAX_LEN)
        return dt__fail(DT_ERR_ARG, "%s: name of %zu bytes, at most %d", fn, n, NAME_MAX_LEN - 1);
    const char *part = name;
    for (size_t i = 0; i <= n; i++) {
        char ch = name[i];
        if (ch == '/' || ch == 0) {
            size_t len = (size_t)(name + i - part);
            if (ch == '/' && !slashes)
                return dt__fail(DT_ERR_ARG, "%s: name \"%s\" may not hold '/'", fn, name);
            if (!len || (len == 1 && part[0] == '.') ||
                (len == 2 && part[0] == '.' && part[1] == '.'))
                return dt__fail(DT_ERR_ARG,
                                "%s: name \"%s\" has an empty, \".\" or \"..\" part between "
                                "'/'",
                                fn, name);
            part = name + i + 1;
            continue;
        }
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok)
            return dt__fail(DT_ERR_ARG,
                            "%s: name \"%s\" holds '%c' (byte %u); names are made of "
                            "[A-Za-z0-9_.:-] and '/'",
                            fn, name, ch >= 32 && ch < 127 ? ch : '?', (unsigned char)ch);
    }
    return DT_OK;
}

/* ---- the checkpoint object ------------------------------------------------------------------ */

typedef enum entry_kind { E_VARIABLE, E_TENSOR, E_OPTIMIZER, E_GENERATOR, E_COUNTER } entry_kind;

static const char *const entry_group[] = {
    [E_VARIABLE] = "variables", [E_TENSOR] = "tensors",   [E_OPTIMIZER] = "optimizers",
    [E_GENERATOR] = "random",   [E_COUNTER] = "counters",
};

typedef struct entry {
    entry_kind kind;
    char name[NAME_MAX_LEN];
    char path[NAME_MAX_LEN + 16]; /* in the file: "variables/NAME" */
    dt_variable *var;
    const dt_tensor *tensor;
    dt_optimizer *opt;
    dt_generator *gen;
    int64_t *counter;
} entry;

typedef struct meta {
    char *key, *value;
} meta;

struct dt_checkpoint {
    entry *e;
    int n;
    meta *meta;
    int nmeta;
    int64_t save_counter;
};

dt_status dt_checkpoint_create(dt_checkpoint **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_create: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? DT_OK : dt__fail(DT_ERR_NOMEM, "dt_checkpoint_create: out of memory");
}

static void meta_clear(meta *m, int n)
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
    meta_clear(c->meta, c->nmeta);
    free(c);
}

/* A new entry at the end, its path checked against every other: unique, and no path a
 * group of another ("a" and "a/b"). */
static dt_status add_entry(const char *fn, dt_checkpoint *c, entry_kind kind, const char *name,
                           entry **out)
{
    if (!c)
        return dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn);
    DT_TRY(check_name(fn, name, true));
    if (kind == E_COUNTER && !strcmp(name, "save_counter"))
        return dt__fail(DT_ERR_ARG, "%s: the counter name \"save_counter\" is the checkpoint's own",
                        fn);
    entry e = {.kind = kind};
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
    c->e[c->n] = e;
    *out = &c->e[c->n++];
    return DT_OK;
}

dt_status dt_checkpoint_add_variable(dt_checkpoint *c, const char *name, dt_variable *v)
{
    if (!v)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_add_variable: variable \"%s\" is NULL",
                        name ? name : "(null)");
    entry *e;
    DT_TRY(add_entry("dt_checkpoint_add_variable", c, E_VARIABLE, name, &e));
    e->var = v;
    return DT_OK;
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
    DT_TRY(check_name(fn, name, true));
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
    if (!t)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_add_tensor: tensor \"%s\" is NULL",
                        name ? name : "(null)");
    entry *e;
    DT_TRY(add_entry("dt_checkpoint_add_tensor", c, E_TENSOR, name, &e));
    e->tensor = t;
    return DT_OK;
}

dt_status dt_checkpoint_add_optimizer(dt_checkpoint *c, const char *name, dt_optimizer *o)
{
    if (!o)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_add_optimizer: optimizer \"%s\" is NULL",
                        name ? name : "(null)");
    entry *e;
    DT_TRY(add_entry("dt_checkpoint_add_optimizer", c, E_OPTIMIZER, name, &e));
    e->opt = o;
    return DT_OK;
}

dt_status dt_checkpoint_add_generator(dt_checkpoint *c, const char *name, dt_generator *g)
{
    if (!g)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_add_generator: generator \"%s\" is NULL",
                        name ? name : "(null)");
    entry *e;
    DT_TRY(add_entry("dt_checkpoint_add_generator", c, E_GENERATOR, name, &e));
    e->gen = g;
    return DT_OK;
}

dt_status dt_checkpoint_add_counter(dt_checkpoint *c, const char *name, int64_t *value)
{
    if (!value)
        return dt__fail(DT_ERR_ARG, "dt_checkpoint_add_counter: counter \"%s\" is NULL",
                        name ? name : "(null)");
    entry *e;
    DT_TRY(add_entry("dt_checkpoint_add_counter", c, E_COUNTER, name, &e));
    e->counter = value;
    return DT_OK;
}

static dt_status meta_set(meta **m, int *n, const char *key, const char *value)
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
    DT_TRY(check_name(fn, key, false));
    return meta_set(&c->meta, &c->nmeta, key, value);
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

/* ---- files ---------------------------------------------------------------------------------- */

static bool multi_client(void)
{
    return dt__rt.world != MPI_COMM_NULL;
}

/* DTENSOR_CHECKPOINT_TWO_PHASE=1: MPI-IO's collective buffering for the data (ROMIO's two
 * phases: blocks are exchanged between clients so that a few aggregators write large runs)
 * and collective HDF5 metadata operations. Off by default: on one node's file system it
 * moved the same bytes no faster, and its blocking MPI collectives spin when clients
 * outnumber cores (the checkpoint tests at -n 4 on 2 cores took twice as long). Parallel
 * file systems with interleaved (column-sharded) blocks may gain from it. */
static bool two_phase(void)
{
    const char *v = getenv("DTENSOR_CHECKPOINT_TWO_PHASE");
    return v && !strcmp(v, "1");
}

/* File access: MPI-IO over every client under a launcher, sec2 otherwise (and when `alone`:
 * one client reading on its own). Datasets of 1 MiB and more start on a 1 MiB boundary (file
 * system blocks and stripes) and metadata goes in 1 MiB blocks, so the data moves in large
 * sequential runs. */
static hid_t open_fapl(bool alone)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        return fapl;
    herr_t e = 0;
    if (multi_client() && !alone) {
        e = H5Pset_fapl_mpio(fapl, dt__rt.world, MPI_INFO_NULL);
        if (e >= 0 && two_phase())
            e = H5Pset_all_coll_metadata_ops(fapl, 1);
        if (e >= 0 && two_phase())
            e = H5Pset_coll_metadata_write(fapl, 1);
    } else {
        e = H5Pset_fapl_sec2(fapl);
    }
    if (e >= 0)
        e = H5Pset_alignment(fapl, 1 << 20, 1 << 20);
    if (e >= 0)
        e = H5Pset_meta_block_size(fapl, 1 << 20);
    if (e < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

/* Data transfers: collective under MPI-IO (every client in every H5Dwrite), each client's
 * blocks then written by its own MPI-IO writes unless two_phase(). */
static hid_t open_dxpl(bool alone)
{
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    if (dxpl >= 0 && multi_client() && !alone &&
        (H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0 ||
         (!two_phase() && H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO) < 0))) {
        H5Pclose(dxpl);
        return -1;
    }
    return dxpl;
}

static bool exists(hid_t loc, const char *path)
{
    /* H5Lexists checks one level at a time: walk the parts */
    char buf[PATH_MAX_LEN];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf;; p++) {
        char save = *p;
        if (save == '/' || save == 0) {
            *p = 0;
            htri_t r = H5Lexists(loc, buf, H5P_DEFAULT);
            if (r <= 0) {
                H5Eclear2(H5E_DEFAULT);
                return false;
            }
            *p = save;
            if (!save)
                return true;
        }
    }
}

/* ---- attributes ----------------------------------------------------------------------------- */

static dt_status attr_write(hid_t loc, const char *name, hid_t type, const void *value,
                            const char *file)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp < 0 ? -1 : H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, type, value);
    if (a >= 0)
        H5Aclose(a);
    if (sp >= 0)
        H5Sclose(sp);
    if (e < 0) {
        char what[128];
        snprintf(what, sizeof what, "writing attribute %s", name);
        return h5_fail("dt_checkpoint_write", file, what);
    }
    return DT_OK;
}

/* Variable-length UTF-8 strings: h5py reads them as str. */
static dt_status attr_string(hid_t loc, const char *name, const char *value, const char *file)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        if (t >= 0)
            H5Tclose(t);
        return h5_fail("dt_checkpoint_write", file, "making a string type");
    }
    dt_status s = attr_write(loc, name, t, &value, file);
    H5Tclose(t);
    return s;
}

static dt_status attr_i64(hid_t loc, const char *name, int64_t v, const char *file)
{
    return attr_write(loc, name, H5T_STD_I64LE, &v, file);
}

static dt_status attr_f64(hid_t loc, const char *name, double v, const char *file)
{
    return attr_write(loc, name, H5T_IEEE_F64LE, &v, file);
}

/* A string attribute of any HDF5 string kind into buf; false when absent or not a string. */
static bool attr_read_string(hid_t loc, const char *name, char *buf, size_t size)
{
    buf[0] = 0;
    if (H5Aexists(loc, name) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
    }
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t ft = a < 0 ? -1 : H5Aget_type(a);
    bool ok = false;
    if (ft >= 0 && H5Tget_class(ft) == H5T_STRING) {
        if (H5Tis_variable_str(ft) > 0) {
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, H5T_VARIABLE);
            H5Tset_cset(mt, H5Tget_cset(ft));
            char *v = NULL;
            if (H5Aread(a, mt, &v) >= 0 && v) {
                snprintf(buf, size, "%s", v);
                ok = true;
            }
            if (v)
                H5free_memory(v);
            H5Tclose(mt);
        } else {
            size_t n = H5Tget_size(ft);
            char *v = calloc(1, n + 1);
            if (v && H5Aread(a, ft, v) >= 0) {
                snprintf(buf, size, "%.*s", (int)n, v);
                ok = true;
            }
            free(v);
        }
    }
    if (ft >= 0)
        H5Tclose(ft);
    if (a >= 0)
        H5Aclose(a);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

static bool attr_read_num(hid_t loc, const char *name, hid_t mem, void *out)
{
    if (H5Aexists(loc, name) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return false;
    }
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    bool ok = a >= 0 && H5Aread(a, mem, out) >= 0;
    if (a >= 0)
        H5Aclose(a);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

/* ---- blocks of a layout --------------------------------------------------------------------- */

/* Local device i's block of a tensor of `shape` in layout l: offset and extent. */
static dt_status block_of(const dt_layout *l, int rank, const int64_t shape[], int i, int64_t off[],
                          int64_t ext[], int64_t *elems)
{
    int id = dt_mesh_local_device_id(l->mesh, i);
    DT_TRY(dt_layout_local_shape(l, shape, id, ext, off));
    int64_t n = 1;
    for (int a = 0; a < rank; a++)
        n *= ext[a];
    *elems = n;
    return DT_OK;
}

/* Whether local device i is the one that writes its block: no other client of a client-local
 * mesh (mirrored on several clients: every client holds its own copy, client 0's is saved),
 * and coordinate 0 on every mesh axis the layout leaves replicated. */
static bool writes_block(const dt_layout *l, int i)
{
    const dt_mesh *m = l->mesh;
    if (m->comm == MPI_COMM_NULL && multi_client() && dt__rt.client != 0)
        return false;
    int coords[DT_MAX_MESH_AXES];
    if (dt_mesh_device_coords(m, dt_mesh_local_device_id(m, i), coords) != DT_OK)
        return false;
    for (int a = 0; a < m->num_axes; a++) {
        bool used = false;
        for (int k = 0; k < l->rank; k++)
            used = used || l->axes[k] == a;
        if (!used && coords[a] != 0)
            return false;
    }
    return true;
}

/* The most of `mine` over every client (an all-gather: the rounds of collective transfers). */
static dt_status rounds_max(int n, const int mine[], int out[])
{
    if (n == 0)
        return DT_OK;
    int nc = multi_client() ? dt__rt.num_clients : 1;
    int *all = malloc(sizeof(int) * (size_t)(n ? n : 1) * (size_t)nc);
    if (!all)
        return dt__fail(DT_ERR_NOMEM, "checkpoint: out of memory for %d counts", n * nc);
    dt_status s = dt__allgather_bytes(dt__rt.world, mine, sizeof(int) * (size_t)n, all);
    for (int k = 0; s == DT_OK && k < n; k++) {
        out[k] = 0;
        for (int c = 0; c < nc; c++)
            out[k] = all[c * n + k] > out[k] ? all[c * n + k] : out[k];
    }
    free(all);
    return s;
}

/* Select the block (off, ext) of a rank-`rank` file space (rank 0: the one element), or
 * nothing when ext is NULL; the memory space matches. */
static dt_status select_block(hid_t fspace, int rank, const int64_t off[], const int64_t ext[],
                              hid_t *mspace)
{
    *mspace = -1;
    herr_t e;
    if (!ext) {
        e = H5Sselect_none(fspace);
        *mspace = H5Scopy(fspace);
        if (*mspace >= 0)
            e = e < 0 ? e : H5Sselect_none(*mspace);
    } else if (rank == 0) {
        e = H5Sselect_all(fspace);
        *mspace = H5Screate(H5S_SCALAR);
    } else {
        hsize_t o[DT_MAX_RANK], c[DT_MAX_RANK];
        for (int a = 0; a < rank; a++) {
            o[a] = (hsize_t)off[a];
            c[a] = (hsize_t)ext[a];
        }
        e = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, o, NULL, c, NULL);
        *mspace = H5Screate_simple(rank, c, NULL);
    }
    if (e < 0 || *mspace < 0) {
        if (*mspace >= 0)
            H5Sclose(*mspace);
        *mspace = -1;
        return dt__fail(DT_ERR_IO, "checkpoint: selecting a block failed");
    }
    return DT_OK;
}

/* ---- writing -------------------------------------------------------------------------------- */

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
    DT_TRY(dtype_row(fn, t->dtype, what, &row));
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
    const h5_dtype *row = &h5_dtypes[t->dtype];
    const dt__backend *be = dt__backend_of(t->mesh->type);
    hid_t type = row->type();
    hid_t d = type < 0 ? -1 : create_dataset(f, it->path, type, t->rank, t->shape);
    hid_t fspace = d < 0 ? -1 : H5Dget_space(d);
    void *staging = NULL;
    dt_status s = DT_OK;
    if (fspace < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "creating dataset %s", it->path);
        s = h5_fail(fn, file, what);
        goto done;
    }
    char lt[DT_STRING_MAX], mt[DT_STRING_MAX];
    mesh_text(t->mesh, mt, sizeof mt);
    s = dt_layout_to_string(&t->layout, lt, sizeof lt);
    if (s == DT_OK)
        s = attr_string(d, "layout", lt, file);
    if (s == DT_OK)
        s = attr_string(d, "mesh", mt, file);
    if (s == DT_OK)
        s = attr_string(d, "device_type", dt_device_type_name(t->mesh->type), file);
    if (s == DT_OK)
        s = attr_string(d, "dtype", row->name, file);
    int i = 0; /* next local device to consider */
    for (int r = 0; s == DT_OK && r < it->rounds; r++) {
        int64_t off[DT_MAX_RANK], ext[DT_MAX_RANK], elems = 0;
        const void *src = NULL;
        for (; i < t->num_local; i++) {
            s = block_of(&t->layout, t->rank, t->shape, i, off, ext, &elems);
            if (s != DT_OK || (elems > 0 && writes_block(&t->layout, i)))
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
            s = select_block(fspace, t->rank, off, mine ? ext : NULL, &mspace);
        if (s != DT_OK)
            break;
        static const char none; /* a valid address for an empty selection */
        herr_t e = H5Dwrite(d, type, mspace, fspace, dxpl, src ? src : &none);
        H5Sclose(mspace);
        if (e < 0) {
            char what[PATH_MAX_LEN + 32];
            snprintf(what, sizeof what, "writing dataset %s", it->path);
            s = h5_fail(fn, file, what);
        }
        i++;
    }
done:
    free(staging);
    if (fspace >= 0)
        H5Sclose(fspace);
    if (d >= 0 && H5Dclose(d) < 0 && s == DT_OK)
        s = h5_fail(fn, file, "closing a dataset");
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
        s = h5_fail("dt_checkpoint_write", file, what);
    }
    hid_t mspace = -1;
    int64_t none[1] = {0};
    if (s == DT_OK)
        s = select_block(fspace, 0, none, dt__rt.client == 0 ? none : NULL, &mspace);
    if (s == DT_OK && H5Dwrite(d, type, mspace, fspace, dxpl, v) < 0) {
        char what[PATH_MAX_LEN + 32];
        snprintf(what, sizeof what, "writing dataset %s", path);
        s = h5_fail("dt_checkpoint_write", file, what);
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
        return h5_fail("dt_checkpoint_write", file, what);
    }
    return DT_OK;
}

/* Everything but the tensors: root attributes, groups, counters, generators, optimizers'
 * settings and iterations, metadata. */
static dt_status write_rest(const dt_checkpoint *c, hid_t f, hid_t dxpl, const char *file)
{
    DT_TRY(attr_string(f, "format", FORMAT_NAME, file));
    DT_TRY(attr_i64(f, "format_version", FORMAT_VERSION, file));
    DT_TRY(attr_string(f, "library_version", dt_version(), file));
    DT_TRY(attr_i64(f, "num_clients", dt__rt.num_clients, file));
    static const char *const groups[] = {"variables", "tensors", "optimizers",
                                         "counters",  "random",  "metadata"};
    for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++) {
        if (exists(f, groups[k]))
            continue;
        hid_t g;
        DT_TRY(write_group(f, groups[k], file, &g));
        dt_status s = DT_OK;
        for (int i = 0; s == DT_OK && k == 5 && i < c->nmeta; i++)
            s = attr_string(g, c->meta[i].key, c->meta[i].value, file);
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
            if (exists(f, e->path))
                g = H5Gopen2(f, e->path, H5P_DEFAULT);
            else
                DT_TRY(write_group(f, e->path, file, &g));
            if (g < 0)
                return h5_fail("dt_checkpoint_write", file, "opening an optimizer's group");
            dt_status s = attr_string(g, "kind", dt__optimizer_kind_name(cf->kind), file);
            if (s == DT_OK)
                s = attr_f64(g, "learning_rate", cf->learning_rate, file);
            if (s == DT_OK)
                s = attr_f64(g, "momentum", cf->momentum, file);
            if (s == DT_OK)
                s = attr_i64(g, "nesterov", cf->nesterov, file);
            if (s == DT_OK)
                s = attr_f64(g, "beta_1", cf->beta_1, file);
            if (s == DT_OK)
                s = attr_f64(g, "beta_2", cf->beta_2, file);
            if (s == DT_OK)
                s = attr_f64(g, "epsilon", cf->epsilon, file);
            if (s == DT_OK)
                s = attr_f64(g, "weight_decay", cf->weight_decay, file);
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

static dt_status check_path(const char *fn, const char *path)
{
    if (!path || !path[0])
        return dt__fail(DT_ERR_ARG, "%s: path is %s", fn, path ? "empty" : "NULL");
    if (strlen(path) + 8 >= PATH_MAX_LEN)
        return dt__fail(DT_ERR_ARG, "%s: path of %zu bytes, at most %d", fn, strlen(path),
                        PATH_MAX_LEN - 9);
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
    dt_status s = !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn) : check_path(fn, path);
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
            s = block_of(&items[k].t->layout, items[k].t->rank, items[k].t->shape, i, off, ext,
                         &elems);
            mine[k] += s == DT_OK && elems > 0 && writes_block(&items[k].t->layout, i);
        }
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK)
        s = rounds_max(n, mine, rounds);
    if (s != DT_OK)
        goto done;
    for (int k = 0; k < n; k++)
        items[k].rounds = rounds[k];

    path_tmp(path, tmp, sizeof tmp);
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    fapl = open_fapl(false);
    dxpl = open_dxpl(false);
    if (fapl < 0 || dxpl < 0)
        s = h5_fail(fn, tmp, "setting up file access");
    if (s == DT_OK) {
        f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
        if (f < 0)
            s = h5_fail(fn, tmp, "creating");
    }
    for (int k = 0; s == DT_OK && k < n; k++) {
        s = write_item(f, dxpl, &items[k], tmp);
        if (s == DT_OK && dt__checkpoint_test_hook)
            dt__checkpoint_test_hook(k);
    }
    if (s == DT_OK)
        s = write_rest(c, f, dxpl, tmp);
    if (f >= 0 && H5Fclose(f) < 0 && s == DT_OK)
        s = h5_fail(fn, tmp, "closing");
    if (fapl >= 0)
        H5Pclose(fapl);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    pthread_mutex_unlock(&h5_lock);
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
    DT_TRY(check_path(fn, prefix));
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

/* ---- reading -------------------------------------------------------------------------------- */

/* Open a checkpoint and check that it is one. */
static dt_status open_read(const char *fn, const char *path, bool alone, hid_t *out)
{
    *out = -1;
    struct stat st;
    if (stat(path, &st) != 0)
        return dt__fail(DT_ERR_IO, "%s: %s cannot be read (%s)", fn, path, strerror(errno));
    hid_t fapl = open_fapl(alone);
    if (fapl < 0)
        return h5_fail(fn, path, "setting up file access");
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f < 0) {
        char why[400];
        h5_reason(why, sizeof why); /* before the next HDF5 call clears it */
        H5Pclose(fapl);
        return dt__fail(DT_ERR_IO,
                        "%s: %s is not a readable HDF5 file (%s); a truncated or foreign file, "
                        "or a save that did not finish",
                        fn, path, why);
    }
    H5Pclose(fapl);
    char fmt[64];
    if (!attr_read_string(f, "format", fmt, sizeof fmt) || strcmp(fmt, FORMAT_NAME)) {
        H5Fclose(f);
        return dt__fail(DT_ERR_IO,
                        "%s: %s is an HDF5 file but not a dtensor checkpoint (its root has no "
                        "attribute format = \"%s\")",
                        fn, path, FORMAT_NAME);
    }
    int64_t version = 0;
    attr_read_num(f, "format_version", H5T_NATIVE_INT64, &version);
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
    if (attr_read_string(d, "dtype", attr, sizeof attr)) {
        for (int k = 0; k < DT_DTYPE_COUNT; k++)
            if (h5_dtypes[k].type && !strcmp(h5_dtypes[k].name, attr)) {
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
        if (!h5_dtypes[k].type || h5_dtypes[k].attr_only)
            continue;
        hid_t rt = h5_dtypes[k].type();
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
    if (!exists(f, name))
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
        return h5_fail(fn, path, "opening a dataset");
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
        s = block_of(l, rank, shape, i, offs[i], exts[i], &elems[i]);
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
        s = READ_ALONE ? (rounds = mine, DT_OK) : rounds_max(1, &mine, &rounds);
    if (s != DT_OK)
        goto done;
    type = h5_dtypes[dtype].type();
    d = type < 0 ? -1 : H5Dopen2(f, name, H5P_DEFAULT);
    fspace = d < 0 ? -1 : H5Dget_space(d);
    if (fspace < 0)
        s = h5_fail(fn, file, "opening a dataset");
    int i = 0;
    for (int r = 0; s == DT_OK && r < rounds; r++) {
        while (i < nl && (same[i] >= 0 || elems[i] == 0))
            i++;
        bool have = i < nl;
        hid_t mspace;
        s = select_block(fspace, rank, have ? offs[i] : NULL, have ? exts[i] : NULL, &mspace);
        if (s != DT_OK)
            break;
        static char none;
        if (H5Dread(d, type, mspace, fspace, dxpl, have ? host[i] : &none) < 0) {
            char what[PATH_MAX_LEN + 32];
            snprintf(what, sizeof what, "reading dataset %s", name);
            s = h5_fail(fn, file, what);
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
        s = h5_fail(fn, file, "opening a scalar dataset");
    else if (H5Sget_simple_extent_type(sp) != H5S_SCALAR || H5Tget_class(ft) != H5T_INTEGER)
        s = dt__fail(DT_ERR_ARG, "%s: \"%s\" in %s is not an integer scalar", fn, name, file);
    else if (H5Dread(d, mem, H5S_ALL, H5S_ALL, dxpl, out) < 0)
        s = h5_fail(fn, file, "reading a scalar");
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
    if (attr_read_string(loc, name, v, sizeof v) &&
        meta_set((meta **)p[0], (int *)p[1], name, v) != DT_OK)
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
            if (!exists(f, e->path))
                return dt__fail(DT_ERR_ARG, "%s: %s holds no %s \"%s\" (no %s)", fn, file,
                                e->kind == E_COUNTER ? "counter" : "generator", e->name, e->path);
        } else if (e->kind == E_OPTIMIZER) {
            snprintf(p, sizeof p, "%s/iterations", e->path);
            if (!exists(f, p))
                return dt__fail(DT_ERR_ARG, "%s: %s holds no optimizer \"%s\" (no %s)", fn, file,
                                e->name, p);
            char kind[32];
            hid_t g = H5Gopen2(f, e->path, H5P_DEFAULT);
            attr_read_string(g, "kind", kind, sizeof kind);
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
                    have += exists(f, p);
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
    dt_status s = !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn) : check_path(fn, path);
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
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (s == DT_OK)
        s = open_read(fn, path, READ_ALONE, &f);
    if (s == DT_OK)
        s = plan_read(c, f, path, items, &n);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK && (dxpl = open_dxpl(READ_ALONE)) < 0)
        s = h5_fail(fn, path, "setting up transfers");
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
    if (s == DT_OK && exists(f, "counters/save_counter"))
        s = read_scalar(fn, f, dxpl, path, "counters/save_counter", H5T_NATIVE_INT64,
                        &save_counter);
    if (s == DT_OK && exists(f, "metadata")) {
        void *ctx[2] = {&md, &nmd};
        hid_t g = H5Gopen2(f, "metadata", H5P_DEFAULT);
        if (g < 0 || H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, NULL, meta_collect, ctx) < 0)
            s = h5_fail(fn, path, "reading the metadata");
        if (g >= 0)
            H5Gclose(g);
    }
    if (dxpl >= 0)
        H5Pclose(dxpl);
    if (f >= 0 && H5Fclose(f) < 0 && s == DT_OK)
        s = h5_fail(fn, path, "closing");
    pthread_mutex_unlock(&h5_lock);
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
            s = meta_set(&c->meta, &c->nmeta, md[i].key, md[i].value);
    }
done:
    for (int k = 0; items && k < n; k++)
        dt_tensor_free(items[k].value);
    free(items);
    free(counters);
    free(gens);
    free(iters);
    meta_clear(md, nmd);
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
    dt_status s = check_path(fn, path);
    if (s == DT_OK && (!name || !layout))
        s = dt__fail(DT_ERR_ARG, "%s: %s is NULL", fn, name ? "layout" : "name");
    if (s == DT_OK)
        s = check_name(fn, name, true);
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
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (s == DT_OK)
        s = open_read(fn, path, READ_ALONE, &f);
    if (s == DT_OK)
        s = dataset_info(fn, f, path, name, &dtype, &rank, shape);
    if (s == DT_OK && rank != layout->rank)
        s = dt__fail(DT_ERR_LAYOUT, "%s: \"%s\" in %s has rank %d, the layout rank %d", fn, name,
                     path, rank, layout->rank);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK && (dxpl = open_dxpl(READ_ALONE)) < 0)
        s = h5_fail(fn, path, "setting up transfers");
    if (s == DT_OK)
        s = read_tensor(fn, f, dxpl, path, name, layout, dtype, rank, shape, out);
    if (dxpl >= 0)
        H5Pclose(dxpl);
    if (f >= 0)
        H5Fclose(f);
    pthread_mutex_unlock(&h5_lock);
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
    DT_TRY(check_path(fn, path));
    if (!name)
        return dt__fail(DT_ERR_ARG, "%s: name is NULL", fn);
    pthread_mutex_lock(&h5_lock);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = -1;
    dt_status s = open_read(fn, path, true, &f);
    if (s == DT_OK)
        s = dataset_info(fn, f, path, name, dtype, rank, shape);
    if (f >= 0)
        H5Fclose(f);
    pthread_mutex_unlock(&h5_lock);
    return s;
}

/* ---- the manager -------------------------------------------------------------------------- */

/* N when `name` is exactly "ckpt-N.h5" with N >= 0. */
static bool ckpt_number(const char *name, int64_t *n)
{
    if (strncmp(name, "ckpt-", 5))
        return false;
    const char *p = name + 5;
    if (*p < '0' || *p > '9')
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || strcmp(end, ".h5"))
        return false;
    *n = v;
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The checkpoint numbers in a directory, ascending (malloc'd). */
static dt_status scan_dir(const char *fn, const char *dir, int64_t **nums, int *n)
{
    *nums = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return dt__fail(DT_ERR_IO, "%s: directory %s cannot be read (%s)", fn, dir,
                        strerror(errno));
    struct dirent *de;
    int cap = 0;
    dt_status s = DT_OK;
    while ((de = readdir(d))) {
        int64_t v;
        if (!ckpt_number(de->d_name, &v))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *g = realloc(*nums, sizeof *g * (size_t)cap);
            if (!g) {
                s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
                break;
            }
            *nums = g;
        }
        (*nums)[(*n)++] = v;
    }
    closedir(d);
    if (s != DT_OK) {
        free(*nums);
        *nums = NULL;
        *n = 0;
        return s;
    }
    if (*n)
        qsort(*nums, (size_t)*n, sizeof **nums, cmp_i64);
    return DT_OK;
}

dt_status dt_checkpoint_latest(const char *directory, char *path, size_t size)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_latest";
    if (!path || !size)
        return dt__fail(DT_ERR_ARG, "%s: path buffer is NULL or empty", fn);
    path[0] = 0;
    DT_TRY(check_path(fn, directory));
    int64_t *nums;
    int n;
    DT_TRY(scan_dir(fn, directory, &nums, &n));
    dt_status s = DT_OK;
    if (n) {
        int len = snprintf(path, size, "%s/ckpt-%" PRId64 ".h5", directory, nums[n - 1]);
        if (len >= (int)size) {
            path[0] = 0;
            s = dt__fail(DT_ERR_ARG, "%s: path buffer of %zu bytes, %d needed", fn, size, len + 1);
        }
    }
    free(nums);
    return s;
}

struct dt_checkpoint_manager {
    dt_checkpoint *ck;
    char dir[PATH_MAX_LEN];
    int max_to_keep;
    int64_t *nums; /* kept, ascending */
    int n;
    char **paths; /* names of nums */
    int npaths;
    char last[PATH_MAX_LEN + 32];
};

static dt_status mgr_names(dt_checkpoint_manager *m)
{
    for (int i = 0; m->paths && i < m->npaths; i++)
        free(m->paths[i]);
    free(m->paths);
    m->npaths = 0;
    m->paths = calloc((size_t)(m->n ? m->n : 1), sizeof *m->paths);
    if (!m->paths)
        return dt__fail(DT_ERR_NOMEM, "checkpoint manager: out of memory");
    m->npaths = m->n;
    for (int i = 0; i < m->n; i++) {
        char p[PATH_MAX_LEN + 32];
        snprintf(p, sizeof p, "%s/ckpt-%" PRId64 ".h5", m->dir, m->nums[i]);
        m->paths[i] = strdup(p);
        if (!m->paths[i])
            return dt__fail(DT_ERR_NOMEM, "checkpoint manager: out of memory");
    }
    return DT_OK;
}

void dt_checkpoint_manager_free(dt_checkpoint_manager *m)
{
    DT__SERIAL();
    if (!m)
        return;
    for (int i = 0; m->paths && i < m->npaths; i++)
        free(m->paths[i]);
    free(m->paths);
    free(m->nums);
    free(m);
}

/* mkdir -p */
static int make_dirs(const char *dir)
{
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return -1;
            *q = '/';
        }
    return mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

dt_status dt_checkpoint_manager_create(dt_checkpoint *c, const char *directory, int max_to_keep,
                                       dt_checkpoint_manager **out)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_manager_create";
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    DT_TRY(dt__require_init(fn));
    dt_status s =
        !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn) : check_path(fn, directory);
    if (s == DT_OK && strlen(directory) + 40 >= PATH_MAX_LEN)
        s = dt__fail(DT_ERR_ARG, "%s: directory name too long", fn);
    if (s == DT_OK && dt__rt.client == 0 && make_dirs(directory) != 0)
        s = dt__fail(DT_ERR_IO, "%s: cannot create directory %s (%s)", fn, directory,
                     strerror(errno));
    DT_TRY(dt__agree(dt__rt.world, s));
    dt_checkpoint_manager *m = calloc(1, sizeof *m);
    if (!m)
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    uint64_t h = DT__HASH_SEED;
    if (s == DT_OK) {
        m->ck = c;
        m->max_to_keep = max_to_keep;
        snprintf(m->dir, sizeof m->dir, "%s", directory);
        s = scan_dir(fn, directory, &m->nums, &m->n);
        if (s == DT_OK)
            h = dt__hash(h, m->nums, sizeof *m->nums * (size_t)m->n);
    }
    s = dt__agree(dt__rt.world, s);
    /* every client must see the same checkpoints (one shared directory) */
    int nc = multi_client() ? dt__rt.num_clients : 1;
    uint64_t *all = s == DT_OK ? malloc(sizeof *all * (size_t)nc) : NULL;
    if (s == DT_OK && !all)
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK)
        s = dt__allgather_bytes(dt__rt.world, &h, sizeof h, all);
    for (int k = 1; s == DT_OK && k < nc; k++)
        if (all[k] != all[0])
            s = dt__fail(DT_ERR_MISMATCH,
                         "%s: clients 0 and %d see different checkpoints in %s (not one shared "
                         "directory?)",
                         fn, k, directory);
    free(all);
    if (s == DT_OK)
        s = mgr_names(m);
    if (s != DT_OK) {
        dt_checkpoint_manager_free(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_checkpoint_manager_save(dt_checkpoint_manager *m, int64_t number, const char **path)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_manager_save";
    if (path)
        *path = NULL;
    if (!m)
        return dt__fail(DT_ERR_ARG, "%s: manager is NULL", fn);
    int64_t k = number >= 0 ? number : (m->n ? m->nums[m->n - 1] + 1 : 1);
    snprintf(m->last, sizeof m->last, "%s/ckpt-%" PRId64 ".h5", m->dir, k);
    int64_t was = m->ck->save_counter;
    m->ck->save_counter++;
    dt_status s = dt_checkpoint_write(m->ck, m->last);
    if (s != DT_OK) {
        m->ck->save_counter = was;
        return s;
    }
    /* the list: k added (or kept), the oldest beyond max_to_keep deleted by client 0 */
    int64_t *g = realloc(m->nums, sizeof *g * (size_t)(m->n + 1));
    if (!g)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    m->nums = g;
    bool have = false;
    for (int i = 0; i < m->n; i++)
        have = have || m->nums[i] == k;
    if (!have) {
        m->nums[m->n++] = k;
        qsort(m->nums, (size_t)m->n, sizeof *m->nums, cmp_i64);
    }
    dt_status del = DT_OK;
    while (m->max_to_keep > 0 && m->n > m->max_to_keep) {
        /* never the one just written, even when older numbers were saved later */
        int victim = m->nums[0] == k ? 1 : 0;
        char p[PATH_MAX_LEN + 32];
        snprintf(p, sizeof p, "%s/ckpt-%" PRId64 ".h5", m->dir, m->nums[victim]);
        if (dt__rt.client == 0 && unlink(p) != 0 && errno != ENOENT && del == DT_OK)
            del = dt__fail(DT_ERR_IO, "%s: saved %s but cannot delete %s (%s)", fn, m->last, p,
                           strerror(errno));
        memmove(&m->nums[victim], &m->nums[victim + 1],
                sizeof *m->nums * (size_t)(m->n - victim - 1));
        m->n--;
    }
    s = mgr_names(m);
    if (s == DT_OK)
        s = dt__agree(dt__rt.world, del);
    if (path && s == DT_OK)
        *path = m->last;
    return s;
}

const char *dt_checkpoint_manager_latest(const dt_checkpoint_manager *m)
{
    return m && m->n ? m->paths[m->n - 1] : NULL;
}

int dt_checkpoint_manager_num_checkpoints(const dt_checkpoint_manager *m)
{
    return m ? m->n : 0;
}

const char *dt_checkpoint_manager_checkpoint(const dt_checkpoint_manager *m, int i)
{
    return m && i >= 0 && i < m->n ? m->paths[i] : NULL;
}
