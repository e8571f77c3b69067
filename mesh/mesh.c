/* Mesh: named axes over the global device list, created collectively. */
#include "dt.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---- hooks of the floors above ----------------------------------------------------------- */

/* Sorted by floor, bottom first; filled before main (constructors), read-only afterwards. */
static const dt__hooks *hooks[8];
static int num_hooks;

void dt__hooks_add(const dt__hooks *h)
{
    if (num_hooks == (int)(sizeof hooks / sizeof *hooks))
        abort(); /* a broken invariant of the build: more floors than slots */
    int i = num_hooks++;
    for (; i > 0 && hooks[i - 1]->floor > h->floor; i--)
        hooks[i] = hooks[i - 1];
    hooks[i] = h;
}

dt_status dt__hooks_mpi_up(void)
{
    dt_status s = DT_OK;
    for (int i = 0; i < num_hooks; i++)
        if (hooks[i]->mpi_up) {
            dt_status t = hooks[i]->mpi_up();
            s = s == DT_OK ? t : s;
        }
    return s;
}

void dt__hooks_mpi_down(void)
{
    for (int i = num_hooks - 1; i >= 0; i--)
        if (hooks[i]->mpi_down)
            hooks[i]->mpi_down();
}

void dt__hooks_finalize(void)
{
    for (int i = num_hooks - 1; i >= 0; i--)
        if (hooks[i]->finalize)
            hooks[i]->finalize();
}

dt_status dt__hooks_mesh_made(const dt_mesh *m)
{
    for (int i = 0; i < num_hooks; i++)
        if (hooks[i]->mesh_made)
            DT_TRY(hooks[i]->mesh_made(m));
    return DT_OK;
}

void dt__hooks_mesh_freed(dt_mesh *m)
{
    for (int i = num_hooks - 1; i >= 0; i--)
        if (hooks[i]->mesh_freed)
            hooks[i]->mesh_freed(m);
}

/* ---- meshes ------------------------------------------------------------------------------- */

static bool valid_name(const char *s)
{
    if (!s || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    size_t n = 0;
    for (; s[n]; n++)
        if (!(isalnum((unsigned char)s[n]) || s[n] == '_') || n + 1 >= DT_MAX_NAME)
            return false;
    return strcmp(s, DT_UNSHARDED_NAME) != 0;
}

/* The description every client sends: "x=3,y=2 CPU", built defensively from any input. */
static void describe(char *buf, size_t size, int num_axes, const char *const names[],
                     const int sizes[], dt_device_type type)
{
    if (num_axes < 0 || num_axes > DT_MAX_MESH_AXES || (num_axes && (!names || !sizes))) {
        snprintf(buf, size, "<%d axes%s> %s", num_axes, names && sizes ? "" : ", NULL arrays",
                 dt_device_type_name(type));
        return;
    }
    size_t n = 0;
    for (int a = 0; a < num_axes; a++)
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%.*s=%d", a ? "," : "",
                              DT_MAX_NAME, names[a] ? names[a] : "(null)", sizes[a]);
    snprintf(buf + n, n < size ? size - n : 0, " %s", dt_device_type_name(type));
}

/* Pure checks of a description every client agreed on, so all reach the same verdict. */
static dt_status validate(int num_axes, const char *const names[], const int sizes[],
                          dt_device_type type, const char *desc, bool all_devices)
{
    if ((unsigned)type >= DT_DEVICE_COUNT)
        return dt__fail(DT_ERR_ARG, "dt_mesh_create: device type %d is not CPU (0) or CUDA (1)",
                        (int)type);
    if (num_axes < 1 || num_axes > DT_MAX_MESH_AXES)
        return dt__fail(DT_ERR_MESH, "dt_mesh_create: %d axes, expected 1 to %d", num_axes,
                        DT_MAX_MESH_AXES);
    if (!names || !sizes)
        return dt__fail(DT_ERR_ARG, "dt_mesh_create: names or sizes is NULL");
    int64_t total = 1;
    for (int a = 0; a < num_axes; a++) {
        if (!valid_name(names[a]))
            return dt__fail(DT_ERR_MESH,
                            "dt_mesh_create: axis %d name \"%.*s\" is not an identifier of at "
                            "most %d characters other than \"unsharded\"",
                            a, DT_MAX_NAME, names[a] ? names[a] : "(null)", DT_MAX_NAME - 1);
        for (int b = 0; b < a; b++)
            if (strcmp(names[a], names[b]) == 0)
                return dt__fail(DT_ERR_MESH, "dt_mesh_create: axis name \"%s\" used twice in %s",
                                names[a], desc);
        if (sizes[a] < 1)
            return dt__fail(DT_ERR_MESH, "dt_mesh_create: axis \"%s\" has size %d in %s", names[a],
                            sizes[a], desc);
        total *= sizes[a];
        if (total > 1 << 24)
            return dt__fail(DT_ERR_MESH, "dt_mesh_create: %s has more than %d devices", desc,
                            1 << 24);
    }
    int global = dt_num_global_devices(type);
    if (all_devices && total != global) {
        /* name the clients with none of the type (a mesh over every GPU when some clients
         * have no GPU) */
        int nc = dt__rt.num_clients, *none = malloc(sizeof(int) * (size_t)(nc > 0 ? nc : 1)), k = 0;
        char list[160] = "";
        for (int c = 0; none && c < nc; c++)
            if (dt__rt.client_devices[type][c] == 0)
                none[k++] = c;
        if (k)
            dt__clients_str(list, sizeof list, none, k);
        free(none);
        return dt__fail(DT_ERR_MESH,
                        "dt_mesh_create: %s has %lld devices, but the %d clients have %d %s "
                        "devices%s%s%s",
                        desc, (long long)total, nc, global, dt_device_type_name(type),
                        k ? " (none on " : "", list, k ? ")" : "");
    }
    return DT_OK;
}

/* The whole description as structure (every name in full, every size, the type, every
 * device id), hashed: what clients compare. Defensive about any input: the arrays are read
 * only when the count is one validate accepts (a count of 9 or INT_MAX says nothing of how
 * long the caller's arrays are). */
static uint64_t structure(int num_axes, const char *const names[], const int sizes[],
                          dt_device_type type, int num_devices, const int ids[])
{
    uint64_t h = dt__hash(DT__HASH_SEED, &num_axes, sizeof num_axes);
    h = dt__hash(h, &type, sizeof type);
    bool arrays = names && sizes && num_axes <= DT_MAX_MESH_AXES;
    for (int a = 0; arrays && a < num_axes; a++) {
        size_t len = names[a] ? strnlen(names[a], 4096) : 0;
        h = dt__hash(h, &len, sizeof len);
        h = names[a] ? dt__hash(h, names[a], len) : h;
        h = dt__hash(h, &sizes[a], sizeof sizes[a]);
    }
    h = dt__hash(h, &num_devices, sizeof num_devices);
    if (ids && num_devices > 0 && num_devices <= 1 << 24)
        h = dt__hash(h, ids, sizeof *ids * (size_t)num_devices);
    return h;
}

/* A mesh description as the clients compare it when they differ: field by field, each
 * value with the whole description beside it. */
typedef struct mesh_desc {
    int num_axes;
    const char *const *names;
    const int *sizes;
    dt_device_type type;
    int num_devices; /* -1: every device */
    const int *ids;
    const char *desc;
} mesh_desc;

static int mesh_fields(const void *ctx, dt__field out[], int max)
{
    const mesh_desc *d = ctx;
    int n = 0;
    if (n < max)
        dt__field_set(&out[n++], "number of axes", &d->num_axes, sizeof d->num_axes,
                      "%d in \"%.150s\"", d->num_axes, d->desc);
    bool arrays = d->names && d->sizes && d->num_axes > 0 && d->num_axes <= DT_MAX_MESH_AXES;
    for (int a = 0; arrays && a < d->num_axes && n + 2 <= max; a++) {
        char nm[48];
        const char *name = d->names[a] ? d->names[a] : "(null)";
        size_t len = strnlen(name, 4096);
        snprintf(nm, sizeof nm, "axis %d name", a);
        dt__field_set(&out[n++], nm, name, len, "\"%.40s%s\" in \"%.120s\"", name,
                      len > 40 ? "..." : "", d->desc);
        snprintf(nm, sizeof nm, "axis %d size", a);
        dt__field_set(&out[n++], nm, &d->sizes[a], sizeof d->sizes[a], "%d in \"%.150s\"",
                      d->sizes[a], d->desc);
    }
    if (n < max)
        dt__field_set(&out[n++], "device type", &d->type, sizeof d->type, "%s in \"%.150s\"",
                      dt_device_type_name(d->type), d->desc);
    if (n < max) {
        uint64_t h = structure(0, NULL, NULL, DT_DEVICE_CPU, d->num_devices, d->ids);
        /* the ids' ends, where lists of one length differ when a client takes another */
        char ends[160] = "";
        size_t k = 0;
        for (int i = 0; d->ids && i < d->num_devices && i < 1 << 24 && k < sizeof ends; i++) {
            if (i == 4 && d->num_devices > 8) {
                k += (size_t)snprintf(ends + k, sizeof ends - k, ",...");
                i = d->num_devices - 4;
            }
            k += (size_t)snprintf(ends + k, sizeof ends - k, "%s%d", i ? "," : "", d->ids[i]);
        }
        if (d->num_devices < 0)
            dt__field_set(&out[n++], "devices", &h, sizeof h, "all");
        else
            dt__field_set(&out[n++], "devices", &h, sizeof h, "%d ids [%s]", d->num_devices, ends);
    }
    return n;
}

/* Every client brings the structure's hash; any difference fails on all, naming the first
 * field that differs. A failure of this client's own (local) fails every client. */
static dt_status agree_mesh(const char *fn, dt_status local, const mesh_desc *d)
{
    uint64_t fp = local == DT_OK
                      ? structure(d->num_axes, d->names, d->sizes, d->type, d->num_devices, d->ids)
                      : 0;
    return dt__agree_on(
        &(dt__agreement){.what = fn, .fingerprint = fp, .fields = mesh_fields, .ctx = d}, local);
}

/* A call without `out` still takes part in the exchange, with a description no other client
 * sends, so that the other clients fail with it instead of waiting for it. */
static dt_status no_out(const char *fn)
{
    dt_status s = dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    if (dt__rt.initialized)
        agree_mesh(fn, s, NULL);
    return s;
}

/* Device ids of dt_mesh_create_on_devices: every client checks the same list. */
static dt_status validate_ids(int num_devices, const int ids[], int64_t total, dt_device_type type,
                              const char *desc)
{
    if (num_devices < 1 || !ids)
        return dt__fail(DT_ERR_ARG, "dt_mesh_create_on_devices: %d device ids%s", num_devices,
                        ids ? "" : " (NULL list)");
    if (num_devices != total)
        return dt__fail(DT_ERR_MESH, "dt_mesh_create_on_devices: %s has %lld devices, %d ids given",
                        desc, (long long)total, num_devices);
    int global = dt_num_global_devices(type);
    for (int i = 0; i < num_devices; i++) {
        if (ids[i] < 0 || ids[i] >= global)
            return dt__fail(DT_ERR_MESH,
                            "dt_mesh_create_on_devices: device id %d is outside the %d %s "
                            "devices 0..%d",
                            ids[i], global, dt_device_type_name(type), global - 1);
        if (i && ids[i] <= ids[i - 1])
            return dt__fail(DT_ERR_MESH,
                            "dt_mesh_create_on_devices: device ids must be strictly increasing "
                            "(each client's devices stay one contiguous block of the mesh): "
                            "id %d at position %d follows %d",
                            ids[i], i, ids[i - 1]);
    }
    return DT_OK;
}

dt_status dt__mesh_build(int num_axes, const char *const names[], const int sizes[],
                         dt_device_type type, const int ids[], bool client_local, dt_mesh **out)
{
    *out = NULL;
    int nc = dt__rt.num_clients, me = dt__rt.client;
    const int *rt_first = dt__rt.client_first[type];
    int size = 1;
    for (int a = 0; a < num_axes; a++)
        size *= sizes[a];
    dt_mesh *m = calloc(1, sizeof *m);
    int *first = calloc((size_t)nc + 1, sizeof *first);
    int *gids = calloc((size_t)size, sizeof *gids);
    dt__device **local = calloc((size_t)dt__rt.num_devices[type] + 1, sizeof *local);
    if (!m || !first || !gids || !local) {
        free(m);
        free(first);
        free(gids);
        free(local);
        return dt__fail(DT_ERR_NOMEM, "mesh: out of memory for %d devices", size);
    }
    static atomic_uint_fast64_t next_serial = 1;
    atomic_init(&m->refs, 1);
    m->serial = (uint64_t)atomic_fetch_add(&next_serial, 1);
    m->num_axes = num_axes;
    m->type = type;
    m->size = 1;
    for (int a = num_axes - 1; a >= 0; a--) {
        snprintf(m->names[a], DT_MAX_NAME, "%s", names[a]);
        m->sizes[a] = sizes[a];
        m->strides[a] = m->size;
        m->size *= sizes[a];
    }
    for (int i = 0; i < size; i++)
        gids[i] = ids ? ids[i] : client_local ? rt_first[me] + i : i;
    m->content = dt__hash(DT__HASH_SEED, &type, sizeof type);
    m->content = dt__hash(m->content, m->names, sizeof m->names[0] * (size_t)num_axes);
    m->content = dt__hash(m->content, m->sizes, sizeof m->sizes[0] * (size_t)num_axes);
    m->content = dt__hash(m->content, gids, sizeof *gids * (size_t)size);
    /* client c owns the mesh ids whose global ids fall in its block (ids increase, so each
     * client's devices are one contiguous run of mesh ids); a client-local mesh gives every
     * device to this client */
    for (int c = 0; c <= nc; c++) {
        if (client_local) {
            first[c] = c <= me ? 0 : size;
            continue;
        }
        int k = 0;
        while (k < size && (c == nc || gids[k] < rt_first[c]))
            k++;
        first[c] = k;
    }
    m->num_clients = nc;
    m->client_first = first;
    m->global_ids = gids;
    m->first_local = first[me];
    m->num_local = first[me + 1] - first[me];
    m->local_base = m->num_local ? gids[m->first_local] - rt_first[me] : 0;
    for (int i = 0; i < m->num_local; i++)
        local[i] = &dt__rt.devices[type][m->local_base + i];
    m->local = local;
    m->comm = MPI_COMM_NULL; /* client-local: collectives stay in shared memory */
    /* collective meshes are built in the same order on every client: their number tells two
     * meshes of the same content apart (they have different communicators) */
    static uint64_t collective_meshes;
    if (!client_local)
        m->agree_id = ++collective_meshes;
    if (!client_local && dt__rt.world != MPI_COMM_NULL) {
        MPI_Request req;
        dt_status s = MPI_Comm_idup(dt__rt.world, &m->comm, &req) == MPI_SUCCESS
                          ? dt__mpi_wait_all(1, &req)
                          : dt__fail(DT_ERR_COMM, "mesh: MPI_Comm_idup failed");
        if (s != DT_OK) {
            free(local);
            free(gids);
            free(first);
            free(m);
            return s;
        }
    }
    atomic_fetch_add(&dt__rt.live_meshes, 1);
    /* communicators of device collectives are made now, agreed, never inside a step */
    dt_status s = client_local ? DT_OK : dt__hooks_mesh_made(m);
    if (s != DT_OK) {
        dt_mesh_free(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

bool dt__mesh_same_devices(const dt_mesh *a, const dt_mesh *b)
{
    return a->type == b->type && a->size == b->size &&
           memcmp(a->global_ids, b->global_ids, sizeof(int) * (size_t)a->size) == 0;
}

static dt_mesh *all_mesh[DT_DEVICE_COUNT];

dt_status dt__mesh_all(dt_device_type type, dt_mesh **out)
{
    if (!all_mesh[type]) {
        int n = dt_num_global_devices(type);
        const char *names[1] = {"all"};
        DT_TRY(dt__mesh_build(1, names, &n, type, NULL, false, &all_mesh[type]));
        atomic_fetch_sub(&dt__rt.live_meshes, 1);
    }
    *out = all_mesh[type];
    return DT_OK;
}

void dt__mesh_all_free(void)
{
    for (int t = 0; t < DT_DEVICE_COUNT; t++)
        if (all_mesh[t]) {
            atomic_fetch_add(&dt__rt.live_meshes, 1);
            dt_mesh_free(all_mesh[t]);
            all_mesh[t] = NULL;
        }
}

static dt_status create(const char *fn, int num_axes, const char *const names[], const int sizes[],
                        dt_device_type type, int num_devices, const int ids[], dt_mesh **out)
{
    if (!out)
        return no_out(fn);
    *out = NULL;
    DT_TRY(dt__require_init(fn));
    char desc[DT_STRING_MAX];
    describe(desc, sizeof desc, num_axes, names, sizes, type);
    if (num_devices >= 0) { /* the device list is part of what clients agree on */
        size_t n = strlen(desc);
        n += (size_t)snprintf(desc + n, sizeof desc - n, " on %d devices [", num_devices);
        for (int i = 0; ids && i < num_devices && n < sizeof desc; i++)
            n += (size_t)snprintf(desc + n, sizeof desc - n, "%s%d", i ? "," : "", ids[i]);
        if (n < sizeof desc)
            snprintf(desc + n, sizeof desc - n, "]");
    }
    mesh_desc d = {num_axes, names, sizes, type, num_devices, ids, desc};
    DT_TRY(agree_mesh("dt_mesh_create", DT_OK, &d));
    DT_TRY(validate(num_axes, names, sizes, type, desc, num_devices < 0));
    if (num_devices >= 0) {
        int64_t total = 1;
        for (int a = 0; a < num_axes; a++)
            total *= sizes[a];
        DT_TRY(validate_ids(num_devices, ids, total, type, desc));
    }
    return dt__mesh_build(num_axes, names, sizes, type, ids, false, out);
}

dt_status dt_mesh_create(int num_axes, const char *const names[], const int sizes[],
                         dt_device_type type, dt_mesh **out)
{
    DT__SERIAL();
    return create("dt_mesh_create", num_axes, names, sizes, type, -1, NULL, out);
}

dt_status dt_mesh_create_on_devices(int num_axes, const char *const names[], const int sizes[],
                                    dt_device_type type, int num_devices, const int device_ids[],
                                    dt_mesh **out)
{
    DT__SERIAL();
    return create("dt_mesh_create_on_devices", num_axes, names, sizes, type,
                  num_devices < 0 ? 0 : num_devices, device_ids, out);
}

dt_status dt_mesh_create_local(int num_axes, const char *const names[], const int sizes[],
                               dt_device_type type, int first_local, dt_mesh **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_mesh_create_local: out is NULL");
    *out = NULL;
    DT_TRY(dt__require_init("dt_mesh_create_local"));
    char desc[DT_STRING_MAX];
    describe(desc, sizeof desc, num_axes, names, sizes, type);
    DT_TRY(validate(num_axes, names, sizes, type, desc, false));
    int64_t total = 1;
    for (int a = 0; a < num_axes; a++)
        total *= sizes[a];
    int have = dt__rt.num_devices[type];
    if (first_local < 0 || first_local >= have || total > have - first_local)
        return dt__fail(DT_ERR_MESH,
                        "dt_mesh_create_local: %s over local devices %d..%lld, but this client "
                        "has %d %s devices (0..%d)",
                        desc, first_local, (long long)first_local + total - 1, have,
                        dt_device_type_name(type), have - 1);
    int *ids = malloc((size_t)total * sizeof *ids);
    if (!ids)
        return dt__fail(DT_ERR_NOMEM, "dt_mesh_create_local: out of memory");
    for (int i = 0; i < (int)total; i++)
        ids[i] = dt__rt.client_first[type][dt__rt.client] + first_local + i;
    dt_status s = dt__mesh_build(num_axes, names, sizes, type, ids, true, out);
    free(ids);
    return s;
}

dt_status dt_mesh_create_from_string(const char *spec, dt_device_type type, dt_mesh **out)
{
    DT__SERIAL();
    if (!out)
        return no_out("dt_mesh_create_from_string");
    *out = NULL;
    DT_TRY(dt__require_init("dt_mesh_create_from_string"));
    char buf[DT_STRING_MAX];
    char *names[DT_MAX_MESH_AXES];
    int sizes[DT_MAX_MESH_AXES];
    int n = 0;
    bool ok = spec && strlen(spec) < sizeof buf;
    if (ok) {
        strcpy(buf, spec);
        /* strsep, not strtok: an empty item ("x=2,,y=2", "x=4,") is an error, not skipped. */
        char *rest = buf;
        for (char *tok = strsep(&rest, ","); ok && tok; tok = strsep(&rest, ",")) {
            while (isspace((unsigned char)*tok))
                tok++;
            char *eq = strchr(tok, '='), *end;
            if (!eq || n == DT_MAX_MESH_AXES) {
                ok = false;
                break;
            }
            *eq = '\0';
            for (char *t = eq; t > tok && isspace((unsigned char)t[-1]); t--)
                t[-1] = '\0';
            long v = strtol(eq + 1, &end, 10);
            while (isspace((unsigned char)*end))
                end++;
            ok = end != eq + 1 && !*end && v >= 0 && v <= INT32_MAX;
            names[n] = tok;
            sizes[n++] = (int)v;
        }
        ok = ok && n > 0;
    }
    if (ok)
        return dt_mesh_create(n, (const char *const *)names, sizes, type, out);
    /* Still take part in the agreement so that no other client waits for this one. */
    dt_status s = dt__fail(DT_ERR_MESH,
                           "dt_mesh_create_from_string: cannot parse \"%.400s\": expected "
                           "\"name=size,...\" with 1 to %d axes",
                           spec ? spec : "(null)", DT_MAX_MESH_AXES);
    return agree_mesh("dt_mesh_create", s, NULL);
}

dt_mesh *dt__mesh_retain(const dt_mesh *m)
{
    dt_mesh *mm = (dt_mesh *)m;
    atomic_fetch_add(&mm->refs, 1);
    return mm;
}

void dt_mesh_free(dt_mesh *m)
{
    DT__SERIAL();
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    dt__hooks_mesh_freed(m);
    if (m->comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->comm);
    free(m->local);
    free(m->client_first);
    free(m->global_ids);
    free(m);
    atomic_fetch_sub(&dt__rt.live_meshes, 1);
}

dt__device *const *dt__mesh_local_devices(const dt_mesh *m)
{
    return m->local;
}

int dt_mesh_num_axes(const dt_mesh *m)
{
    return m ? m->num_axes : 0;
}

int dt_mesh_size(const dt_mesh *m)
{
    return m ? m->size : 0;
}

dt_device_type dt_mesh_device_type(const dt_mesh *m)
{
    return m ? m->type : DT_DEVICE_CPU;
}

const char *dt_mesh_axis_name(const dt_mesh *m, int axis)
{
    return m && axis >= 0 && axis < m->num_axes ? m->names[axis] : NULL;
}

int dt_mesh_axis_size(const dt_mesh *m, int axis)
{
    return m && axis >= 0 && axis < m->num_axes ? m->sizes[axis] : 0;
}

int dt_mesh_axis_index(const dt_mesh *m, const char *name)
{
    if (!m || !name)
        return -1;
    for (int a = 0; a < m->num_axes; a++)
        if (strcmp(m->names[a], name) == 0)
            return a;
    return -1;
}

int dt_mesh_num_local_devices(const dt_mesh *m)
{
    return m ? m->num_local : 0;
}

int dt_mesh_local_device_id(const dt_mesh *m, int i)
{
    return m && i >= 0 && i < m->num_local ? m->first_local + i : -1;
}

void *dt_mesh_local_stream(const dt_mesh *m, int i)
{
    if (!m || i < 0 || i >= m->num_local || m->type != DT_DEVICE_CUDA || dt__rt.cuda_emulated)
        return NULL;
    return m->local[i]->kx.stream;
}

int dt_mesh_global_device_id(const dt_mesh *m, int mesh_id)
{
    return m && mesh_id >= 0 && mesh_id < m->size ? m->global_ids[mesh_id] : -1;
}

static dt_status check_device(const dt_mesh *m, int device, const char *fn)
{
    if (!m)
        return dt__fail(DT_ERR_ARG, "%s: mesh is NULL", fn);
    if (device < 0 || device >= m->size)
        return dt__fail(DT_ERR_ARG, "%s: device %d is outside the mesh's 0..%d", fn, device,
                        m->size - 1);
    return DT_OK;
}

dt_status dt_mesh_device_coords(const dt_mesh *m, int device, int coords[])
{
    DT_TRY(check_device(m, device, "dt_mesh_device_coords"));
    if (!coords)
        return dt__fail(DT_ERR_ARG, "dt_mesh_device_coords: coords is NULL");
    for (int a = 0; a < m->num_axes; a++)
        coords[a] = device / m->strides[a] % m->sizes[a];
    return DT_OK;
}

dt_status dt_mesh_device_at(const dt_mesh *m, const int coords[], int *device)
{
    if (!m || !coords || !device)
        return dt__fail(DT_ERR_ARG, "dt_mesh_device_at: NULL argument");
    int id = 0;
    for (int a = 0; a < m->num_axes; a++) {
        if (coords[a] < 0 || coords[a] >= m->sizes[a])
            return dt__fail(DT_ERR_ARG,
                            "dt_mesh_device_at: coordinate %d on axis \"%s\" is "
                            "outside 0..%d",
                            coords[a], m->names[a], m->sizes[a] - 1);
        id += coords[a] * m->strides[a];
    }
    *device = id;
    return DT_OK;
}

dt_status dt_mesh_device_client(const dt_mesh *m, int device, int *client)
{
    DT_TRY(check_device(m, device, "dt_mesh_device_client"));
    if (!client)
        return dt__fail(DT_ERR_ARG, "dt_mesh_device_client: client is NULL");
    int c = 0;
    while (m->client_first[c + 1] <= device)
        c++;
    *client = c;
    return DT_OK;
}

int dt_mesh_format(const dt_mesh *m, char *buf, size_t size)
{
    if (!m)
        return snprintf(buf, size, "<Mesh NULL>");
    char axes[DT_STRING_MAX];
    size_t n = 0;
    for (int a = 0; a < m->num_axes; a++)
        n += (size_t)snprintf(axes + n, sizeof axes - n, "%s%s=%d", a ? "," : "", m->names[a],
                              m->sizes[a]);
    return snprintf(buf, size, "<Mesh %s %s:%d>", axes, dt_device_type_name(m->type), m->size);
}
