/* DTensors on meshes that span clients: from_host, unpack, read (all layouts, uneven shapes,
 * every dtype), partial terms reduced across clients, and a bad buffer on one client only.
 * Run under mpiexec.mpich -n 1, 2, 4, 8.
 *
 * The program initializes MPI itself so that it can run with two device configurations:
 * 2 devices on every client, then 1 or 2 (clients own blocks of different sizes).
 */
#include "../ref.h"
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_, size_;
static const char *const axis_names[] = {"x", "y", "z"};
static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_I32, DT_DTYPE_I64};

/* Every client's verdict on a local step, so that a failure on one client skips the
 * collective steps after it on all of them (instead of leaving the others waiting). */
static dt_status agree(dt_status s)
{
    return dt__agree(dt__rt.world, s);
}

typedef struct mesh_case {
    int num_axes;
    int sizes[DT_MAX_MESH_AXES];
    dt_mesh *mesh;
    char spec[64];
} mesh_case;

static bool make_mesh(mesh_case *mc)
{
    mc->spec[0] = '\0';
    for (int a = 0; a < mc->num_axes; a++)
        snprintf(mc->spec + strlen(mc->spec), sizeof mc->spec - strlen(mc->spec), "%s%s=%d",
                 a ? "," : "", axis_names[a], mc->sizes[a]);
    mc->mesh = NULL;
    dt_status s = dt_mesh_create_from_string(mc->spec, DT_DEVICE_CPU, &mc->mesh);
    return tap_check(s == DT_OK, "mesh %s over %d clients", mc->spec, size_);
}

/* ---- round trips ------------------------------------------------------------------------- */

/* One tensor: from_host, each local component against the reference slice, the memory of each
 * local device, then read. Returns this client's verdict; *what gets the failing step. */
static bool round_trip(const mesh_case *mc, const int axes[], int rank, const int64_t shape[],
                       dt_dtype dtype, char *what, size_t what_size)
{
    dt_mesh *m = mc->mesh;
    const char *specs[DT_MAX_RANK];
    ref_specs(axis_names, rank, axes, specs);
    dt_layout l;
    if (dt_layout_create(m, rank, specs, &l) != DT_OK) {
        snprintf(what, what_size, "layout: %s", dt_last_error());
        return false;
    }
    ref_place p = {.num_axes = mc->num_axes, .rank = rank};
    memcpy(p.sizes, mc->sizes, sizeof(int) * (size_t)mc->num_axes);
    memcpy(p.axes, axes, sizeof(int) * (size_t)rank);
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
    size_t es = dt_dtype_size(dtype);
    int64_t n = ref_count(rank, shape);
    size_t full = (size_t)n * es;
    char *global = malloc(full + 1), *want = malloc(full + 1), *got = malloc(full + 8);
    ref_fill(dtype, n, global, 11 * rank + (int)dtype);
    bool ok = true;

    dt_tensor *t = NULL;
    dt_status s = agree(dt_tensor_from_host(&l, dtype, rank, shape, global, full, &t));
    if (s != DT_OK) {
        snprintf(what, what_size, "from_host: %s", dt_last_error());
        ok = false;
        goto done;
    }
    for (int i = 0; ok && i < dt_mesh_num_local_devices(m); i++) {
        int d = dt_mesh_local_device_id(m, i), coords[DT_MAX_MESH_AXES];
        ref_coords(mc->num_axes, mc->sizes, d, coords);
        size_t bytes = (size_t)ref_component(&p, coords, global, es, want) * es;
        size_t cur = 0;
        memset(got, 0x3c, full + 8);
        if (dt_tensor_unpack(t, i, got, bytes) != DT_OK || memcmp(got, want, bytes) != 0) {
            snprintf(what, what_size, "component of device %d differs (%s)", d, dt_last_error());
            ok = false;
        } else if (dt_device_memory(DT_DEVICE_CPU, i, &cur, NULL) != DT_OK || cur != bytes) {
            snprintf(what, what_size, "device %d holds %zu bytes, its shard is %zu", d, cur, bytes);
            ok = false;
        }
    }
    memset(got, 0x3c, full + 8);
    s = dt_tensor_read(t, got, full);
    if (s != DT_OK) {
        snprintf(what, what_size, "read: %s", dt_last_error());
        ok = false;
    } else if (memcmp(got, global, full) != 0 || (unsigned char)got[full] != 0x3c) {
        snprintf(what, what_size, "read differs from the host array");
        ok = false;
    }
    dt_tensor_free(t);
    for (int i = 0; ok && i < dt_mesh_num_local_devices(m); i++) {
        size_t cur = 1;
        dt_device_memory(DT_DEVICE_CPU, i, &cur, NULL);
        if (cur != 0) {
            snprintf(what, what_size, "local device %d keeps %zu bytes after free", i, cur);
            ok = false;
        }
    }
done:
    free(global);
    free(want);
    free(got);
    return ok;
}

/* Every layout of `rank` with every shape. all_dtypes: each (layout, shape) in the four
 * dtypes; otherwise one dtype each, turning with the layout and the shape (every dtype still
 * comes up), which keeps the runs with many clients short on two cores. */
static void round_trips(const mesh_case *mc, int rank, const int64_t (*shapes)[3], int nshapes,
                        bool all_dtypes)
{
    int layouts[512][DT_MAX_RANK];
    int count = ref_all_layouts(mc->num_axes, rank, layouts, 512);
    int ndt = (int)(sizeof dtypes / sizeof dtypes[0]);
    for (int k = 0; k < count; k++) {
        bool ok = true;
        /* every client runs every step (the collectives stay in step); the verdict is combined
         * by tap_check */
        for (int s = 0; s < nshapes; s++)
            for (int d = 0; d < ndt; d++) {
                if (!all_dtypes && d != (k + s) % ndt)
                    continue;
                char step[400] = "";
                if (!round_trip(mc, layouts[k], rank, shapes[s], dtypes[d], step, sizeof step)) {
                    char sb[DT__SHAPE_STR_MAX];
                    fprintf(stderr, "# client %d: mesh %s shape %s %s: %s\n", rank_, mc->spec,
                            dt__shape_str(sb, sizeof sb, rank, shapes[s]), dt_dtype_name(dtypes[d]),
                            step);
                    ok = false;
                }
            }
        const char *specs[DT_MAX_RANK];
        ref_specs(axis_names, rank, layouts[k], specs);
        char lb[128] = "";
        for (int i = 0; i < rank; i++)
            snprintf(lb + strlen(lb), sizeof lb - strlen(lb), "%s%s", i ? "," : "", specs[i]);
        tap_check(ok, "mesh %s layout \"%s\": from_host, unpack, read (%d shapes, %s)", mc->spec,
                  lb, nshapes, all_dtypes ? "4 dtypes each" : "dtypes in turn");
    }
}

/* ---- partial terms across clients ---------------------------------------------------------- */

static int64_t term(dt_reduce_op op, int64_t e, int key)
{
    if (op == DT_REDUCE_SUM)
        return e * 3 + key * 100 - 50;
    if (op == DT_REDUCE_PROD) {
        static const int64_t v[3] = {1, 2, -1};
        return v[(e + key) % 3];
    }
    return (e * 5 + key * 3) % 11 - 5;
}

/* Key of a device among the terms: its coordinates on the partial axes, mixed radix. */
static int term_key(const mesh_case *mc, unsigned partial, const int coords[])
{
    int key = 0;
    for (int a = 0; a < mc->num_axes; a++)
        if (partial & (1u << a))
            key = key * mc->sizes[a] + coords[a];
    return key;
}

static bool check_partial(const mesh_case *mc, const char *text, int rank, const int64_t shape[],
                          dt_dtype dtype, char *what, size_t what_size)
{
    dt_mesh *m = mc->mesh;
    dt_layout l;
    dt_status s = dt_layout_parse(m, text, &l);
    if (s != DT_OK) {
        snprintf(what, what_size, "parse: %s", dt_last_error());
        return false;
    }
    ref_place p = {.num_axes = mc->num_axes, .rank = rank};
    memcpy(p.sizes, mc->sizes, sizeof(int) * (size_t)mc->num_axes);
    memcpy(p.axes, l.axes, sizeof(int) * (size_t)rank);
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
    unsigned sharding = 0;
    for (int i = 0; i < rank; i++)
        if (l.axes[i] >= 0)
            sharding |= 1u << l.axes[i];
    size_t es = dt_dtype_size(dtype);
    int64_t n = ref_count(rank, shape);
    int nl = dt_mesh_num_local_devices(m);

    /* this client's components: each held element's term */
    void **comps = calloc((size_t)nl, sizeof *comps);
    int64_t(*lshapes)[DT_MAX_RANK] = calloc((size_t)nl, sizeof *lshapes);
    const int64_t **cshapes = calloc((size_t)nl, sizeof *cshapes);
    for (int i = 0; i < nl; i++) {
        int c[DT_MAX_MESH_AXES];
        int64_t off[DT_MAX_RANK];
        ref_coords(mc->num_axes, mc->sizes, dt_mesh_local_device_id(m, i), c);
        ref_local_shape(&p, c, lshapes[i], off);
        cshapes[i] = lshapes[i];
        comps[i] = malloc((size_t)ref_count(rank, lshapes[i]) * es + 1);
        int key = term_key(mc, l.partial, c);
        int64_t idx[DT_MAX_RANK] = {0}, e = 0, k = 0;
        if (n)
            do {
                if (ref_holds(&p, c, idx))
                    ref_set(dtype, comps[i], k++, term(l.partial_op, e, key));
                e++;
            } while (ref_next(rank, shape, idx));
    }
    /* expected: the reduction over every device of the mesh that holds the element and sits
     * at coordinate 0 of each replicating axis */
    char *want = malloc((size_t)n * es + 1), *got = malloc((size_t)n * es + 1);
    int64_t idx[DT_MAX_RANK] = {0}, e = 0;
    if (n)
        do {
            bool first = true;
            int64_t acc = 0;
            for (int d = 0; d < dt_mesh_size(m); d++) {
                int c[DT_MAX_MESH_AXES];
                ref_coords(mc->num_axes, mc->sizes, d, c);
                bool counts = ref_holds(&p, c, idx);
                for (int a = 0; a < mc->num_axes; a++)
                    if (!((l.partial | sharding) & (1u << a)) && c[a] != 0)
                        counts = false;
                if (!counts)
                    continue;
                int64_t v = term(l.partial_op, e, term_key(mc, l.partial, c));
                if (first)
                    acc = v;
                else if (l.partial_op == DT_REDUCE_SUM)
                    acc += v;
                else if (l.partial_op == DT_REDUCE_PROD)
                    acc *= v;
                else if (l.partial_op == DT_REDUCE_MAX)
                    acc = v > acc ? v : acc;
                else
                    acc = v < acc ? v : acc;
                first = false;
            }
            ref_set(dtype, want, e, acc);
            e++;
        } while (ref_next(rank, shape, idx));

    bool ok = true;
    dt_tensor *t = NULL;
    s = agree(dt_tensor_pack(&l, dtype, rank, shape, nl, (const void *const *)comps, cshapes, &t));
    if (s != DT_OK) {
        snprintf(what, what_size, "pack: %s", dt_last_error());
        ok = false;
    } else {
        s = dt_tensor_read(t, got, (size_t)n * es);
        if (s != DT_OK) {
            snprintf(what, what_size, "read: %s", dt_last_error());
            ok = false;
        } else if (memcmp(got, want, (size_t)n * es) != 0) {
            snprintf(what, what_size, "read is not the %s of the terms",
                     dt_reduce_op_name(l.partial_op));
            ok = false;
        }
    }
    dt_tensor_free(t);
    for (int i = 0; i < nl; i++)
        free(comps[i]);
    free(comps);
    free(lshapes);
    free(cshapes);
    free(want);
    free(got);
    return ok;
}

static void partials(const mesh_case *mc)
{
    /* Layouts with a replicating axis next to a partial one matter: only one copy of each
     * term may count. NULL ends each list. */
    static const char *const one_axis[] = {
        "unsharded,unsharded;partial_sum=x", "unsharded,unsharded;partial_max=x",
        "unsharded,unsharded;partial_min=x", "unsharded,unsharded;partial_prod=x", NULL};
    static const char *const two_axes[] = {"x,unsharded;partial_sum=y",
                                           "unsharded,y;partial_sum=x",
                                           "unsharded,unsharded;partial_sum=x+y",
                                           "unsharded,x;partial_max=y",
                                           "y,unsharded;partial_min=x",
                                           "unsharded,unsharded;partial_prod=x+y",
                                           "unsharded,unsharded;partial_sum=x",
                                           "unsharded,unsharded;partial_max=y",
                                           NULL};
    static const char *const three_axes[] = {
        "x,unsharded;partial_sum=y+z",       "z,y;partial_max=x",
        "unsharded,unsharded;partial_sum=y", "unsharded,unsharded;partial_sum=x",
        "y,unsharded;partial_min=z",         NULL};
    const char *const *texts = mc->num_axes == 1   ? one_axis
                               : mc->num_axes == 2 ? two_axes
                                                   : three_axes;
    const int64_t shape[2] = {5, 3};
    for (int k = 0; texts[k]; k++) {
        bool ok = true;
        char what[600] = "";
        for (size_t d = 0; ok && d < sizeof dtypes / sizeof dtypes[0]; d++) {
            char step[400] = "";
            if (!check_partial(mc, texts[k], 2, shape, dtypes[d], step, sizeof step)) {
                snprintf(what, sizeof what, "%s: %s", dt_dtype_name(dtypes[d]), step);
                ok = false;
            }
        }
        ok = agree(ok ? DT_OK : dt__fail(DT_ERR_SHAPE, "%s", what)) == DT_OK;
        if (!tap_check(ok, "mesh %s \"%s\": terms packed on every client, read reduces them",
                       mc->spec, texts[k]))
            tap_diag("%s", dt_last_error());
    }
}

/* ---- a bad buffer on one client only -------------------------------------------------------- */

static void bad_read_on_one_client(const mesh_case *mc)
{
    dt_layout l;
    dt_layout_batch_sharded(mc->mesh, "x", 2, &l);
    const int64_t shape[2] = {7, 3};
    int32_t host[21], back[21];
    ref_fill(DT_DTYPE_I32, 21, host, 5);
    dt_tensor *t = NULL;
    dt_status s = agree(dt_tensor_from_host(&l, DT_DTYPE_I32, 2, shape, host, sizeof host, &t));
    if (!tap_check(s == DT_OK, "mesh %s: from_host for the bad-buffer checks", mc->spec))
        return;
    int last = size_ - 1;
    s = dt_tensor_read(t, back, rank_ == last ? sizeof back - 1 : sizeof back);
    bool names = rank_ == last ? strstr(dt_last_error(), "84") && strstr(dt_last_error(), "83")
                               : strstr(dt_last_error(), "84") != NULL;
    char who[32];
    snprintf(who, sizeof who, "client %d", last);
    if (rank_ != last)
        names = names && strstr(dt_last_error(), who);
    tap_check(s == DT_ERR_ARG && names,
              "mesh %s: read into 83 bytes on client %d only: DT_ERR_ARG on every client, "
              "naming the sizes (%s)",
              mc->spec, last, dt_status_name(s));
    s = dt_tensor_read(t, rank_ == 0 ? NULL : back, sizeof back);
    tap_check(s == DT_ERR_ARG, "mesh %s: NULL buffer on client 0 only: every client fails (%s)",
              mc->spec, dt_status_name(s));
    memset(back, 0, sizeof back);
    s = dt_tensor_read(t, back, sizeof back);
    tap_check(s == DT_OK && memcmp(back, host, sizeof host) == 0,
              "mesh %s: the next read works on every client", mc->spec);
    dt_tensor_free(t);
}

/* ---- one device configuration ------------------------------------------------------------- */

static const int64_t shapes0[][3] = {{0}}; /* a scalar: the extents are not read */
static const int64_t shapes1[][3] = {{0}, {1}, {5}, {19}};
static const int64_t shapes2[][3] = {{5, 7}, {0, 3}, {2, 1}, {17, 2}};
static const int64_t shapes3[][3] = {{3, 4, 5}, {2, 0, 3}};
/* Reads too large for the clients' shared staging (2 MiB a client) take MPI's gather: the
 * replicated layout (one client sends all of it, over 2 MiB in every dtype) and, at -n 2, some
 * sharded ones; the others go through shared memory. */
static const int64_t shapes_large[][3] = {{131, 67, 61}};

/* thorough: every dtype for every layout and shape on 1-D and 2-D meshes, and rank 3 on 3-D
 * meshes. */
static void run_mesh(mesh_case *mc, bool thorough)
{
    if (!make_mesh(mc))
        return;
    bool all_dtypes = thorough && mc->num_axes < 3;
    round_trips(mc, 0, shapes0, 1, all_dtypes);
    round_trips(mc, 1, shapes1, 4, all_dtypes);
    round_trips(mc, 2, shapes2, 4, all_dtypes);
    if (thorough && mc->num_axes == 1)
        round_trips(mc, 3, shapes_large, 1, false);
    if (thorough && mc->num_axes == 3)
        round_trips(mc, 3, shapes3, 2, false);
    partials(mc);
    bad_read_on_one_client(mc);
    dt_mesh_free(mc->mesh);
}

static void run_config(bool thorough)
{
    int g = dt_num_global_devices(DT_DEVICE_CPU);
    mesh_case mc = {.num_axes = 1, .sizes = {g}};
    run_mesh(&mc, thorough);
    /* 2-D meshes: the most square factorization, and the one with 2 on the last axis */
    int best = 0;
    for (int a = 2; a < g; a++)
        if (g % a == 0 && (best == 0 || abs(a - g / a) < abs(best - g / best)))
            best = a;
    if (best) {
        mc = (mesh_case){.num_axes = 2, .sizes = {best, g / best}};
        run_mesh(&mc, thorough);
    }
    if (g % 2 == 0 && g > 2 && g / 2 != best) {
        mc = (mesh_case){.num_axes = 2, .sizes = {g / 2, 2}};
        run_mesh(&mc, thorough);
    }
    if (g % 4 == 0 && (thorough || size_ <= 4)) {
        mc = (mesh_case){.num_axes = 3, .sizes = {2, g / 4, 2}};
        run_mesh(&mc, thorough);
    }
}

int main(void)
{
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);

    /* 1. two devices on every client */
    dt_init_options o = {.cpu_devices = 2};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    tap_diag("%d clients, 2 devices each", size_);
    run_config(true);
    dt_status s = dt_finalize();

    /* 2. clients of 1 and 2 devices: blocks of different sizes */
    o.cpu_devices = 1 + rank_ % 2;
    if (dt_init(&o) != DT_OK)
        return 1;
    tap_check(s == DT_OK, "finalize after the first configuration");
    tap_diag("%d clients, 1 or 2 devices", size_);
    run_config(false);

    int status = tap_done();
    if (dt_finalize() != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        status = 1;
    }
    MPI_Finalize();
    return status;
}
