/* The checkpoint format's HDF5 pieces that saving and restoring share: the dtype table, HDF5's
 * errors, names, file access, attributes, and the blocks of a layout. */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pthread_mutex_t dt__h5_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- dtypes: one row per dtype ------------------------------------------------------------ */

/* The rows' file types (checkpoint.h says what a row holds). */
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

const h5_dtype dt__h5_dtypes[DT_DTYPE_COUNT] = {
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

dt_status dt__h5_dtype_row(const char *fn, dt_dtype d, const char *what, const h5_dtype **out)
{
    if (!dt__dtype_valid(d) || !dt__h5_dtypes[d].type)
        return dt__fail(DT_ERR_UNSUPPORTED, "%s: %s has dtype %s, which checkpoints cannot store",
                        fn, what, dt_dtype_name(d));
    *out = &dt__h5_dtypes[d];
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
const char *dt__h5_reason(char *buf, size_t size)
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

dt_status dt__h5_fail(const char *fn, const char *file, const char *what)
{
    char why[400];
    return dt__fail(DT_ERR_IO, "%s: %s %s failed (%s)", fn, file, what,
                    dt__h5_reason(why, sizeof why));
}

/* ---- names ---------------------------------------------------------------------------------- */

/* NAME: parts of [A-Za-z0-9_.:-], separated by single '/', none "." or "..". */
dt_status dt__ckpt_check_name(const char *fn, const char *name, bool slashes)
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

dt_status dt__ckpt_check_path(const char *fn, const char *path)
{
    if (!path || !path[0])
        return dt__fail(DT_ERR_ARG, "%s: path is %s", fn, path ? "empty" : "NULL");
    if (strlen(path) + 8 >= PATH_MAX_LEN)
        return dt__fail(DT_ERR_ARG, "%s: path of %zu bytes, at most %d", fn, strlen(path),
                        PATH_MAX_LEN - 9);
    return DT_OK;
}

/* ---- files ---------------------------------------------------------------------------------- */

bool dt__ckpt_multi_client(void)
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
hid_t dt__h5_fapl(bool alone)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0)
        return fapl;
    herr_t e = 0;
    if (dt__ckpt_multi_client() && !alone) {
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
hid_t dt__h5_dxpl(bool alone)
{
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    if (dxpl >= 0 && dt__ckpt_multi_client() && !alone &&
        (H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0 ||
         (!two_phase() && H5Pset_dxpl_mpio_collective_opt(dxpl, H5FD_MPIO_INDIVIDUAL_IO) < 0))) {
        H5Pclose(dxpl);
        return -1;
    }
    return dxpl;
}

bool dt__h5_exists(hid_t loc, const char *path)
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
        return dt__h5_fail("dt_checkpoint_write", file, what);
    }
    return DT_OK;
}

/* Variable-length UTF-8 strings: h5py reads them as str. */
dt_status dt__h5_attr_string(hid_t loc, const char *name, const char *value, const char *file)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        if (t >= 0)
            H5Tclose(t);
        return dt__h5_fail("dt_checkpoint_write", file, "making a string type");
    }
    dt_status s = attr_write(loc, name, t, &value, file);
    H5Tclose(t);
    return s;
}

dt_status dt__h5_attr_i64(hid_t loc, const char *name, int64_t v, const char *file)
{
    return attr_write(loc, name, H5T_STD_I64LE, &v, file);
}

dt_status dt__h5_attr_f64(hid_t loc, const char *name, double v, const char *file)
{
    return attr_write(loc, name, H5T_IEEE_F64LE, &v, file);
}

/* A string attribute of any HDF5 string kind into buf; false when absent or not a string. */
bool dt__h5_attr_read_string(hid_t loc, const char *name, char *buf, size_t size)
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

bool dt__h5_attr_read_num(hid_t loc, const char *name, hid_t mem, void *out)
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
dt_status dt__ckpt_block_of(const dt_layout *l, int rank, const int64_t shape[], int i,
                            int64_t off[], int64_t ext[], int64_t *elems)
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
bool dt__ckpt_writes_block(const dt_layout *l, int i)
{
    const dt_mesh *m = l->mesh;
    if (m->comm == MPI_COMM_NULL && dt__ckpt_multi_client() && dt__rt.client != 0)
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
dt_status dt__ckpt_rounds_max(int n, const int mine[], int out[])
{
    if (n == 0)
        return DT_OK;
    int nc = dt__ckpt_multi_client() ? dt__rt.num_clients : 1;
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
dt_status dt__h5_select_block(hid_t fspace, int rank, const int64_t off[], const int64_t ext[],
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
