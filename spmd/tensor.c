/* DTensor: global shape, dtype, layout and one component buffer per local device. */
#include "../collectives/collectives.h"
#include "dt.h"

#include <stdlib.h>
#include <string.h>

/* ---- per-device tasks whose failures come back to the caller's thread -------------------- */

typedef struct task_result {
    dt_status status;
    char msg[400];
} task_result;

static void record(task_result *r, dt_status s)
{
    r->status = s;
    if (s != DT_OK)
        snprintf(r->msg, sizeof r->msg, "%s", dt_last_error());
}

/* First failure of a run, re-raised on the calling thread. */
static dt_status first_failure(const task_result *r, int n)
{
    for (int i = 0; i < n; i++)
        if (r[i].status != DT_OK) {
            dt__set_error(r[i].msg);
            return r[i].status;
        }
    return DT_OK;
}

/* ---- validation of metadata every client shares ----------------------------------------- */

static dt_status check_meta(const char *fn, const dt_layout *l, dt_dtype dtype, int rank,
                            const int64_t shape[], int64_t *elements)
{
    DT_TRY(dt__require_init(fn));
    if (!l)
        return dt__fail(DT_ERR_ARG, "%s: layout is NULL", fn);
    DT_TRY(dt_layout_check(l));
    DT_TRY(dt__dtype_check(fn, dtype, DT__ANY));
    if (rank != l->rank) {
        char lb[DT_STRING_MAX];
        dt_layout_to_string(l, lb, sizeof lb);
        return dt__fail(DT_ERR_LAYOUT, "%s: tensor of rank %d, layout \"%s\" has rank %d", fn, rank,
                        lb, l->rank);
    }
    if (rank && !shape)
        return dt__fail(DT_ERR_ARG, "%s: shape is NULL for rank %d", fn, rank);
    *elements = dt__num_elements(rank, shape);
    if (*elements < 0) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE, "%s: shape %s has a negative extent or overflows", fn,
                        dt__shape_str(sb, sizeof sb, rank, shape));
    }
    if ((uint64_t)*elements > SIZE_MAX / 8) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE, "%s: shape %s is too large", fn,
                        dt__shape_str(sb, sizeof sb, rank, shape));
    }
    return DT_OK;
}

/* ---- allocation -------------------------------------------------------------------------- */

/* dt_tensor_wrap without a release function: the caller keeps the buffers' ownership. */
static void no_release(void *ctx)
{
    (void)ctx;
}

static void release(dt_tensor *t)
{
    dt__device *const *devs = dt__mesh_local_devices(t->mesh);
    if (t->release) { /* the caller's buffers (dt_tensor_wrap); its code runs without the API
                       * lock, which it may need to wait for (a binding's own lock) */
        int held = dt__api_suspend();
        t->release(t->release_ctx);
        dt__api_resume(held);
    }
    for (int i = 0; !t->release && i < t->num_local; i++)
        dt__device_free(devs[i], t->data[i], t->bytes[i]);
    free(t->data);
    free(t->bytes);
    dt_mesh_free(t->mesh);
    free(t);
}

dt_status dt__tensor_alloc(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                           dt_tensor **out)
{
    *out = NULL;
    dt_tensor *t = calloc(1, sizeof *t);
    const dt_mesh *m = l->mesh;
    int n = m->num_local;
    if (!t)
        return dt__fail(DT_ERR_NOMEM, "tensor: out of memory");
    t->data = calloc((size_t)n + 1, sizeof *t->data);
    t->bytes = calloc((size_t)n + 1, sizeof *t->bytes);
    t->mesh = dt__mesh_retain(m);
    t->layout = *l;
    t->dtype = dtype;
    t->rank = rank;
    for (int i = 0; i < rank; i++)
        t->shape[i] = shape[i];
    if (!t->data || !t->bytes) {
        release(t);
        return dt__fail(DT_ERR_NOMEM, "tensor: out of memory");
    }
    dt__device *const *devs = dt__mesh_local_devices(m);
    for (int i = 0; i < n; i++) {
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(l, shape, m->first_local + i, local, NULL);
        size_t bytes = (size_t)dt__num_elements(rank, local) * dt_dtype_size(dtype);
        dt_status s = dt__device_alloc(devs[i], bytes, &t->data[i]);
        if (s != DT_OK) {
            release(t);
            return s;
        }
        t->bytes[i] = bytes;
        t->num_local = i + 1;
    }
    t->num_local = n;
    atomic_fetch_add(&dt__rt.live_tensors, 1);
    *out = t;
    return DT_OK;
}

void dt_tensor_free(dt_tensor *t)
{
    DT__SERIAL();
    if (!t)
        return;
    release(t);
    atomic_fetch_sub(&dt__rt.live_tensors, 1);
}

/* ---- from host --------------------------------------------------------------------------- */

typedef struct from_host_job {
    dt_tensor *t;
    const void *host;
    task_result *results;
} from_host_job;

/* Whether a block `local` at `off` of an array of `shape` is one run of its row-major bytes
 * (extent 1 on the axes before some axis k and whole on those after it), and that run's first
 * element. */
static bool contiguous_block(int rank, const int64_t shape[], const int64_t local[],
                             const int64_t off[], int64_t *first)
{
    int k = 0;
    while (k < rank && local[k] == 1)
        k++;
    for (int j = k + 1; j < rank; j++)
        if (local[j] != shape[j])
            return false;
    *first = 0;
    for (int j = 0; j < rank; j++)
        *first = *first * shape[j] + off[j];
    return true;
}

static void from_host_task(dt__device *d, int i, void *arg)
{
    from_host_job *job = arg;
    dt_tensor *t = job->t;
    int64_t local[DT_MAX_RANK], off[DT_MAX_RANK], zero[DT_MAX_RANK] = {0};
    dt_layout_local_shape(&t->layout, t->shape, t->mesh->first_local + i, local, off);
    size_t es = dt_dtype_size(t->dtype);
    dt_status s = DT_OK;
    int64_t first;
    if (d->backend->host_accessible) {
        dt__copy_block(t->data[i], local, zero, job->host, t->shape, off, local, t->rank, es);
    } else if (contiguous_block(t->rank, t->shape, local, off, &first)) {
        /* a replicated or leading-axis shard: straight from the caller's array through the
         * backend's pinned staging, without a pageable copy first */
        s = d->backend->to_device(d, t->data[i], (const char *)job->host + (size_t)first * es,
                                  t->bytes[i]);
    } else {
        void *stage = malloc(t->bytes[i] ? t->bytes[i] : 1);
        if (!stage) {
            s = dt__fail(DT_ERR_NOMEM, "dt_tensor_from_host: no staging for %zu bytes",
                         t->bytes[i]);
        } else {
            dt__copy_block(stage, local, zero, job->host, t->shape, off, local, t->rank, es);
            s = d->backend->to_device(d, t->data[i], stage, t->bytes[i]);
            free(stage);
        }
    }
    record(&job->results[i], s);
}

dt_status dt_tensor_from_host(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                              const void *host, size_t bytes, dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_tensor_from_host: out is NULL");
    *out = NULL;
    int64_t n;
    DT_TRY(check_meta("dt_tensor_from_host", l, dtype, rank, shape, &n));
    if (l->partial)
        return dt__fail(DT_ERR_LAYOUT, "dt_tensor_from_host: a full array cannot take a partial "
                                       "layout; pack its terms with dt_tensor_pack");
    size_t need = (size_t)n * dt_dtype_size(dtype);
    if (!host && need)
        return dt__fail(DT_ERR_ARG, "dt_tensor_from_host: host is NULL");
    if (bytes != need) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE, "dt_tensor_from_host: %s %s needs %zu bytes, got %zu",
                        dt_dtype_name(dtype), dt__shape_str(sb, sizeof sb, rank, shape), need,
                        bytes);
    }
    dt_tensor *t;
    DT_TRY(dt__tensor_alloc(l, dtype, rank, shape, &t));
    task_result *results = calloc((size_t)t->num_local + 1, sizeof *results);
    if (!results) {
        dt_tensor_free(t);
        return dt__fail(DT_ERR_NOMEM, "dt_tensor_from_host: out of memory");
    }
    from_host_job job = {.t = t, .host = host, .results = results};
    dt__devices_run(dt__mesh_local_devices(t->mesh), t->num_local, from_host_task, &job);
    dt_status s = first_failure(results, t->num_local);
    free(results);
    if (s != DT_OK) {
        dt_tensor_free(t);
        return s;
    }
    *out = t;
    return DT_OK;
}

/* ---- pack and unpack --------------------------------------------------------------------- */

/* What dt_tensor_pack and dt_tensor_wrap check first: out, the metadata, and one piece (a
 * component, a buffer) per local device. */
static dt_status check_pieces(const char *fn, const char *what, const dt_layout *l, dt_dtype dtype,
                              int rank, const int64_t shape[], int num, dt_tensor **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    int64_t n;
    DT_TRY(check_meta(fn, l, dtype, rank, shape, &n));
    if (num != l->mesh->num_local)
        return dt__fail(DT_ERR_ARG, "%s: %d %s for the %d local devices of this client", fn, num,
                        what, l->mesh->num_local);
    return DT_OK;
}

dt_status dt_tensor_pack(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                         int num_components, const void *const components[],
                         const int64_t *const component_shapes[], dt_tensor **out)
{
    DT__SERIAL();
    DT_TRY(
        check_pieces("dt_tensor_pack", "components", l, dtype, rank, shape, num_components, out));
    const dt_mesh *m = l->mesh;
    if (num_components && (!components || (rank && !component_shapes)))
        return dt__fail(DT_ERR_ARG, "dt_tensor_pack: components or component_shapes is NULL");
    for (int i = 0; i < num_components; i++) {
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(l, shape, m->first_local + i, local, NULL);
        if (rank && !component_shapes[i])
            return dt__fail(DT_ERR_ARG, "dt_tensor_pack: shape of component %d is NULL", i);
        for (int a = 0; a < rank; a++)
            if (component_shapes[i][a] != local[a]) {
                char want[DT__SHAPE_STR_MAX], got[DT__SHAPE_STR_MAX], glob[DT__SHAPE_STR_MAX];
                char lb[DT_STRING_MAX];
                dt_layout_to_string(l, lb, sizeof lb);
                return dt__fail(DT_ERR_SHAPE,
                                "dt_tensor_pack: component %d (device %d) has shape %s; layout "
                                "\"%s\" of %s gives it %s",
                                i, m->first_local + i,
                                dt__shape_str(got, sizeof got, rank, component_shapes[i]), lb,
                                dt__shape_str(glob, sizeof glob, rank, shape),
                                dt__shape_str(want, sizeof want, rank, local));
            }
        if (!components[i] && dt__num_elements(rank, local) > 0)
            return dt__fail(DT_ERR_ARG, "dt_tensor_pack: component %d is NULL", i);
    }
    dt_tensor *t;
    DT_TRY(dt__tensor_alloc(l, dtype, rank, shape, &t));
    dt__device *const *devs = dt__mesh_local_devices(m);
    for (int i = 0; i < t->num_local; i++) {
        dt_status s = devs[i]->backend->to_device(devs[i], t->data[i], components[i], t->bytes[i]);
        if (s != DT_OK) {
            dt_tensor_free(t);
            return s;
        }
    }
    *out = t;
    return DT_OK;
}

dt_status dt_tensor_wrap(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                         int num_buffers, void *const buffers[], const size_t bytes[],
                         dt_release_fn release, void *ctx, dt_tensor **out)
{
    DT__SERIAL();
    DT_TRY(check_pieces("dt_tensor_wrap", "buffers", l, dtype, rank, shape, num_buffers, out));
    const dt_mesh *m = l->mesh;
    if (num_buffers && (!buffers || !bytes))
        return dt__fail(DT_ERR_ARG, "dt_tensor_wrap: buffers or bytes is NULL");
    for (int i = 0; i < num_buffers; i++) {
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(l, shape, m->first_local + i, local, NULL);
        size_t need = (size_t)dt__num_elements(rank, local) * dt_dtype_size(dtype);
        if (bytes[i] < need || (!buffers[i] && need)) {
            char sb[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_SHAPE,
                            "dt_tensor_wrap: buffer %d (device %d) has %zu bytes%s; its %s "
                            "component %s needs %zu",
                            i, m->first_local + i, bytes[i], buffers[i] ? "" : " (NULL)",
                            dt_dtype_name(dtype), dt__shape_str(sb, sizeof sb, rank, local), need);
        }
    }
    dt_tensor *t = calloc(1, sizeof *t);
    void **data = calloc((size_t)num_buffers + 1, sizeof *data);
    size_t *sizes = calloc((size_t)num_buffers + 1, sizeof *sizes);
    if (!t || !data || !sizes) {
        free(t);
        free(data);
        free(sizes);
        return dt__fail(DT_ERR_NOMEM, "dt_tensor_wrap: out of memory");
    }
    for (int i = 0; i < num_buffers; i++) {
        data[i] = buffers[i];
        sizes[i] = bytes[i];
    }
    t->data = data;
    t->bytes = sizes;
    t->mesh = dt__mesh_retain(m);
    t->layout = *l;
    t->dtype = dtype;
    t->rank = rank;
    for (int a = 0; a < rank; a++)
        t->shape[a] = shape[a];
    t->num_local = num_buffers;
    t->release = release ? release : no_release;
    t->release_ctx = ctx;
    atomic_fetch_add(&dt__rt.live_tensors, 1);
    *out = t;
    return DT_OK;
}

dt_status dt_tensor_local_buffer(const dt_tensor *t, int i, dt_local_buffer *out)
{
    DT__SERIAL();
    if (!t || !out)
        return dt__fail(DT_ERR_ARG, "dt_tensor_local_buffer: %s is NULL", t ? "out" : "tensor");
    DT_TRY(dt__tensor_require_values(t, "dt_tensor_local_buffer"));
    if (i < 0 || i >= t->num_local)
        return dt__fail(DT_ERR_ARG, "dt_tensor_local_buffer: component %d, this client has 0..%d",
                        i, t->num_local - 1);
    const dt__device *d = dt__mesh_local_devices(t->mesh)[i];
    *out = (dt_local_buffer){.data = t->data[i],
                             .bytes = t->bytes[i],
                             .type = d->type,
                             .device_ordinal = d->type == DT_DEVICE_CUDA ? d->ordinal : 0};
    return DT_OK;
}

dt_status dt__tensor_require_values(const dt_tensor *t, const char *fn)
{
    if (t && t->trace)
        return dt__fail(DT_ERR_STATE,
                        "%s: tensor is symbolic (recorded in a function being traced); run the "
                        "function to get values",
                        fn);
    return DT_OK;
}

dt_status dt_tensor_unpack(const dt_tensor *t, int i, void *dst, size_t bytes)
{
    DT__SERIAL();
    if (!t)
        return dt__fail(DT_ERR_ARG, "dt_tensor_unpack: tensor is NULL");
    DT_TRY(dt__tensor_require_values(t, "dt_tensor_unpack"));
    if (i < 0 || i >= t->num_local)
        return dt__fail(DT_ERR_ARG, "dt_tensor_unpack: component %d, this client has 0..%d", i,
                        t->num_local - 1);
    if (bytes < t->bytes[i])
        return dt__fail(DT_ERR_ARG, "dt_tensor_unpack: component %d has %zu bytes, buffer %zu", i,
                        t->bytes[i], bytes);
    if (!dst && t->bytes[i])
        return dt__fail(DT_ERR_ARG, "dt_tensor_unpack: dst is NULL");
    dt__device *d = dt__mesh_local_devices(t->mesh)[i];
    return d->backend->to_host(d, dst, t->data[i], t->bytes[i]);
}

dt_status dt_tensor_wait(const dt_tensor *t)
{
    DT__SERIAL();
    if (!t)
        return dt__fail(DT_ERR_ARG, "dt_tensor_wait: tensor is NULL");
    DT_TRY(dt__tensor_require_values(t, "dt_tensor_wait"));
    dt__device *const *devs = dt__mesh_local_devices(t->mesh);
    for (int i = 0; i < t->num_local; i++)
        if (devs[i]->backend->sync)
            DT_TRY(devs[i]->backend->sync(devs[i]));
    return DT_OK;
}

/* ---- read: gather the global array on every client --------------------------------------- */

/* A device contributes to the global array when it is first (coordinate 0) on every mesh axis
 * that replicates the tensor; with partial axes, every term contributes. */
static bool contributes(const dt_layout *l, int device)
{
    const dt_mesh *m = l->mesh;
    unsigned splitting = l->partial;
    for (int i = 0; i < l->rank; i++)
        if (l->axes[i] != DT_UNSHARDED)
            splitting |= 1u << l->axes[i];
    for (int a = 0; a < m->num_axes; a++)
        if (!(splitting & (1u << a)) && device / m->strides[a] % m->sizes[a] != 0)
            return false;
    return true;
}

/* Is device the first term of its block (coordinate 0 on every partial axis)? */
static bool first_term(const dt_layout *l, int device)
{
    const dt_mesh *m = l->mesh;
    for (int a = 0; a < m->num_axes; a++)
        if ((l->partial & (1u << a)) && device / m->strides[a] % m->sizes[a] != 0)
            return false;
    return true;
}

/* Place one contributing device's component (contiguous, local shape) into the global dst. */
static dt_status place(const dt_tensor *t, int device, const void *component, void *dst,
                       void *scratch)
{
    int64_t local[DT_MAX_RANK], off[DT_MAX_RANK], zero[DT_MAX_RANK] = {0};
    dt_layout_local_shape(&t->layout, t->shape, device, local, off);
    size_t es = dt_dtype_size(t->dtype);
    if (first_term(&t->layout, device)) {
        dt__copy_block(dst, t->shape, off, component, local, zero, local, t->rank, es);
        return DT_OK;
    }
    /* A later partial term: pull the block out, reduce, put it back. */
    size_t n = (size_t)dt__num_elements(t->rank, local);
    dt__copy_block(scratch, local, zero, dst, t->shape, off, local, t->rank, es);
    dt__coll_reduce(t->dtype, t->layout.partial_op, scratch, component, n);
    dt__copy_block(dst, t->shape, off, scratch, local, zero, local, t->rank, es);
    return DT_OK;
}

static dt_status check_read(const dt_tensor *t, void *dst, size_t bytes, size_t need)
{
    if (bytes < need)
        return dt__fail(DT_ERR_ARG, "dt_tensor_read: global tensor has %zu bytes, buffer %zu", need,
                        bytes);
    if (!dst && need)
        return dt__fail(DT_ERR_ARG, "dt_tensor_read: dst is NULL");
    (void)t;
    return DT_OK;
}

/* A tensor as the clients compare it before a collective call on it: dtype, shape, layout. */
static int tensor_fields(const void *ctx, dt__field out[], int max)
{
    const dt_tensor *t = ctx;
    char tx[DT_STRING_MAX];
    int n = 0;
    if (n < max)
        dt__field_set(&out[n++], "dtype", &t->dtype, sizeof t->dtype, "%s",
                      dt_dtype_name(t->dtype));
    int64_t shape[DT_MAX_RANK + 1] = {t->rank};
    memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->rank);
    if (n < max)
        dt__field_set(&out[n++], "shape", shape, sizeof(int64_t) * (size_t)(t->rank + 1), "%s",
                      dt__shape_str(tx, sizeof tx, t->rank, t->shape));
    if (dt_layout_to_string(&t->layout, tx, sizeof tx) != DT_OK)
        snprintf(tx, sizeof tx, "?");
    if (n < max)
        dt__field_set(&out[n++], "layout", NULL, 0, "\"%s\"", tx);
    return n;
}

static uint64_t tensor_fingerprint(const dt_tensor *t)
{
    uint64_t h = dt__hash(DT__HASH_SEED, &t->dtype, sizeof t->dtype);
    h = dt__hash(h, &t->rank, sizeof t->rank);
    h = dt__hash(h, t->shape, sizeof(int64_t) * (size_t)t->rank);
    h = dt__hash(h, t->layout.axes, sizeof t->layout.axes[0] * (size_t)t->layout.rank);
    h = dt__hash(h, &t->layout.partial, sizeof t->layout.partial);
    return t->layout.partial ? dt__hash(h, &t->layout.partial_op, sizeof t->layout.partial_op) : h;
}

dt_status dt_tensor_read(const dt_tensor *t, void *dst, size_t bytes)
{
    DT__SERIAL();
    dt__agreement a = {.what = "dt_tensor_read"};
    if (!t) /* the mesh is unknown: agree with every client, so that none waits for this one */
        return dt__mesh_agree(NULL, dt__fail(DT_ERR_ARG, "dt_tensor_read: tensor is NULL"), &a);
    dt_status s = dt__tensor_require_values(t, "dt_tensor_read");
    if (s != DT_OK)
        return dt__mesh_agree(t->mesh, s, &a);
    const dt_mesh *m = t->mesh;
    const dt_layout *l = &t->layout;
    size_t es = dt_dtype_size(t->dtype);
    size_t need = (size_t)dt_tensor_num_elements(t) * es;
    /* Bytes each client sends: its contributing devices' components, in device order. */
    int nc = m->num_clients;
    int64_t *counts = calloc((size_t)nc + 1, sizeof *counts);
    size_t largest = 0;
    int64_t total = 0;
    for (int d = 0; counts && d < m->size; d++) {
        if (!contributes(l, d))
            continue;
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(l, t->shape, d, local, NULL);
        size_t b = (size_t)dt__num_elements(t->rank, local) * es;
        int c;
        dt_mesh_device_client(m, d, &c);
        counts[c] += (int64_t)b;
        total += (int64_t)b;
        largest = b > largest ? b : largest;
    }
    s = counts ? check_read(t, dst, bytes, need)
               : dt__fail(DT_ERR_NOMEM, "dt_tensor_read: out of memory");
    if (s == DT_OK && m->comm != MPI_COMM_NULL && total / (int64_t)es > INT32_MAX)
        s = dt__fail(DT_ERR_UNSUPPORTED,
                     "dt_tensor_read: gathering %lld elements exceeds what one MPI gather "
                     "addresses (2^31-1)",
                     (long long)(total / (int64_t)es));
    char *all = s == DT_OK ? malloc((size_t)total + 1) : NULL;
    void *scratch = s == DT_OK ? malloc(largest + 1) : NULL;
    int *cnt = s == DT_OK ? malloc(sizeof(int) * 2 * (size_t)nc) : NULL;
    if (s == DT_OK && (!all || !scratch || !cnt))
        s = dt__fail(DT_ERR_NOMEM, "dt_tensor_read: cannot stage %lld bytes", (long long)total);
    /* The buffer is this client's own input, and the clients must read tensors of one shape
     * and layout: agree before anyone starts the gather (every way this client can fail on a
     * host-accessible device is known by now, so that agreement is the only one there). */
    a.fingerprint = tensor_fingerprint(t);
    a.fields = tensor_fields;
    a.ctx = t;
    s = dt__mesh_agree(m, s, &a);
    const dt_status agreed = s;

    /* Stage this client's contributions at its place in `all`, or, when the clients share
     * one host, in its staging region (every client then copies every region out after the
     * next agreement: no MPI call, and waits that sleep on the agreement's bell). */
    int64_t mine = 0;
    for (int c = 0; s == DT_OK && c < m->num_clients && c < dt__rt.client; c++)
        mine += counts[c];
    bool shared = counts && m->comm != MPI_COMM_NULL && m->num_clients == dt__rt.num_clients &&
                  dt__stage_capacity() > 0; /* no staging across hosts, even for 0 bytes */
    for (int c = 0; shared && c < nc; c++)
        shared = (size_t)counts[c] <= dt__stage_capacity();
    char *to = s != DT_OK ? NULL : shared ? (char *)dt__stage_next() : all + mine;
    dt__device *const *devs = dt__mesh_local_devices(m);
    for (int i = 0; s == DT_OK && i < t->num_local; i++) {
        if (!contributes(l, m->first_local + i))
            continue;
        s = devs[i]->backend->to_host(devs[i], to, t->data[i], t->bytes[i]);
        to += t->bytes[i];
    }
    /* A copy from a device that is not host-accessible can fail: then the clients agree on the
     * outcome before the gather (decided by the mesh's device type, alike on every client). */
    const dt__backend *be = dt__backend_of(m->type);
    if (agreed == DT_OK && (shared || (be && !be->host_accessible && m->comm != MPI_COMM_NULL)))
        s = dt__mesh_agree(m, s, &(dt__agreement){.what = "dt_tensor_read"});
    if (s == DT_OK && shared) {
        int64_t at = 0;
        for (int c = 0; c < nc; c++) {
            memcpy(all + at, dt__stage_last(c), (size_t)counts[c]);
            at += counts[c];
        }
    } else if (s == DT_OK && m->comm != MPI_COMM_NULL) {
        MPI_Datatype elem;
        MPI_Type_contiguous((int)es, MPI_BYTE, &elem);
        MPI_Type_commit(&elem);
        int64_t at = 0;
        int *displ = cnt + nc;
        for (int c = 0; c < nc; c++) {
            cnt[c] = (int)(counts[c] / (int64_t)es);
            displ[c] = (int)(at / (int64_t)es);
            at += counts[c];
        }
        s = dt__coll_gather_clients(m, all, cnt, displ, elem, es);
        MPI_Type_free(&elem);
    }
    /* Every client places every contributing component, in global device order. */
    int64_t at = 0;
    for (int d = 0; s == DT_OK && d < m->size; d++) {
        if (!contributes(l, d))
            continue;
        int64_t local[DT_MAX_RANK];
        dt_layout_local_shape(l, t->shape, d, local, NULL);
        s = place(t, d, all + at, dst, scratch);
        at += dt__num_elements(t->rank, local) * (int64_t)es;
    }
    free(all);
    free(scratch);
    free(cnt);
    free(counts);
    return s;
}

/* ---- getters ----------------------------------------------------------------------------- */

const dt_layout *dt_tensor_layout(const dt_tensor *t)
{
    return t ? &t->layout : NULL;
}

const dt_mesh *dt_tensor_mesh(const dt_tensor *t)
{
    return t ? t->mesh : NULL;
}

dt_dtype dt_tensor_dtype(const dt_tensor *t)
{
    return t ? t->dtype : DT_DTYPE_COUNT;
}

int dt_tensor_rank(const dt_tensor *t)
{
    return t ? t->rank : 0;
}

const int64_t *dt_tensor_shape(const dt_tensor *t)
{
    return t ? t->shape : NULL;
}

int64_t dt_tensor_num_elements(const dt_tensor *t)
{
    return t ? dt__num_elements(t->rank, t->shape) : 0;
}

dt_status dt_tensor_local_shape(const dt_tensor *t, int i, int64_t local_shape[])
{
    if (!t)
        return dt__fail(DT_ERR_ARG, "dt_tensor_local_shape: tensor is NULL");
    DT_TRY(dt__tensor_require_values(t, "dt_tensor_local_shape"));
    if (i < 0 || i >= t->num_local)
        return dt__fail(DT_ERR_ARG, "dt_tensor_local_shape: component %d, this client has 0..%d", i,
                        t->num_local - 1);
    return dt_layout_local_shape(&t->layout, t->shape, t->mesh->first_local + i, local_shape, NULL);
}

int dt_tensor_is_symbolic(const dt_tensor *t)
{
    return t && t->trace;
}
