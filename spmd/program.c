/* Programs: slots (per-device buffers) and steps (local kernels, collectives); the executor
 * and the printer. A program is built from global metadata only, so it is the same on every
 * client; only the per-local-device arguments differ. */
#include "engine.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- metadata helpers ------------------------------------------------------------------- */

int64_t dt__local_elems(const dt_layout *l, int rank, const int64_t shape[], int device)
{
    int64_t local[DT_MAX_RANK];
    dt_layout_local_shape(l, shape, device, local, NULL);
    return dt__num_elements(rank, local);
}

void dt__local_shape(const dt__dist *x, int device, int64_t local[], int64_t offset[])
{
    dt_layout_local_shape(&x->layout, x->shape, device, local, offset);
}

dt_layout dt__layout_none(const dt_mesh *m, int rank)
{
    dt_layout l = {.mesh = m, .rank = rank, .partial = 0, .partial_op = DT_REDUCE_SUM};
    for (int i = 0; i < DT_MAX_RANK; i++)
        l.axes[i] = DT_UNSHARDED;
    return l;
}

bool dt__pull_same(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                   dt_layout *in_want)
{
    (void)n;
    (void)in;
    (void)i;
    *in_want = *want;
    in_want->partial = 0;
    return true;
}

unsigned dt__layout_used(const dt_layout *l)
{
    unsigned used = l->partial;
    for (int i = 0; i < l->rank; i++)
        if (l->axes[i] != DT_UNSHARDED)
            used |= 1u << l->axes[i];
    return used;
}

/* ---- building ----------------------------------------------------------------------------- */

dt_status dt__program_create(const char *title, int ninputs, int noutputs, dt__program **out)
{
    *out = NULL;
    dt__program *p = calloc(1, sizeof *p);
    if (!p)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    p->in = calloc((size_t)ninputs + 1, sizeof *p->in);
    p->out = calloc((size_t)noutputs + 1, sizeof *p->out);
    if (!p->in || !p->out) {
        free(p->in);
        free(p->out);
        free(p);
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    }
    atomic_init(&p->refs, 1);
    snprintf(p->title, sizeof p->title, "%s", title);
    p->ninputs = ninputs;
    p->noutputs = noutputs;
    *out = p;
    return DT_OK;
}

struct dt__arena_plan;
static void plan_free(struct dt__arena_plan *pl);

void dt__program_release(dt__program *p)
{
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    for (int s = 0; s < p->nslots; s++)
        free(p->slots[s].bytes);
    for (int i = 0; i < p->nsteps; i++) {
        dt__step *st = &p->steps[i];
        int nl = st->nlocal;
        if (st->args)
            for (int d = 0; d < nl; d++)
                free(st->args[d].blocks);
        free(st->args);
        free(st->fused);
        if (st->counts)
            for (int d = 0; d < nl; d++)
                free(st->counts[d]);
        free(st->counts);
        if (st->boxes)
            for (int d = 0; d < nl; d++)
                free(st->boxes[d]);
        free(st->boxes);
        free(st->at);
    }
    free(p->slots);
    free(p->steps);
    plan_free(p->plan);
    free(p->order);
    free(p->in);
    free(p->out);
    free(p);
}

static dt_status grow(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return DT_OK;
    int ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, (size_t)ncap * elem);
    if (!n)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory for %d entries", ncap);
    memset((char *)n + (size_t)*cap * elem, 0, (size_t)(ncap - *cap) * elem);
    *arr = n;
    *cap = ncap;
    return DT_OK;
}

dt_status dt__slot_new_elems(dt__program *p, const dt_mesh *m, dt_dtype dtype,
                             const int64_t elems_per_local[], int *slot)
{
    DT_TRY(grow((void **)&p->slots, &p->cap_slots, p->nslots + 1, sizeof *p->slots));
    dt__slot *s = &p->slots[p->nslots];
    s->bytes = calloc((size_t)m->num_local + 1, sizeof *s->bytes);
    if (!s->bytes)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    s->mesh = m;
    s->input = s->output = -1;
    for (int i = 0; i < m->num_local; i++)
        s->bytes[i] = (size_t)elems_per_local[i] * dt_dtype_size(dtype);
    *slot = p->nslots++;
    return DT_OK;
}

dt_status dt__slot_new(dt__program *p, const dt_layout *l, dt_dtype dtype, int rank,
                       const int64_t shape[], dt__dist *out)
{
    const dt_mesh *m = l->mesh;
    int64_t *elems = calloc((size_t)m->num_local + 1, sizeof *elems);
    if (!elems)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    for (int i = 0; i < m->num_local; i++)
        elems[i] = dt__local_elems(l, rank, shape, m->first_local + i);
    dt_status s = dt__slot_new_elems(p, m, dtype, elems, &out->slot);
    free(elems);
    DT_TRY(s);
    out->dtype = dtype;
    out->rank = rank;
    for (int i = 0; i < DT_MAX_RANK; i++)
        out->shape[i] = i < rank ? shape[i] : 0;
    out->layout = *l;
    return DT_OK;
}

/* A zeroed step at the end of p (not yet counted), with what every step records. */
static dt_status new_step(dt__program *p, dt__step_kind kind, const char *cause, const dt_mesh *m,
                          dt_dtype dtype, int nin, const int in[], int out, dt__step **stp)
{
    DT_TRY(grow((void **)&p->steps, &p->cap_steps, p->nsteps + 1, sizeof *p->steps));
    dt__step *st = &p->steps[p->nsteps];
    memset(st, 0, sizeof *st);
    st->kind = kind;
    st->cause = cause;
    st->mesh = m;
    st->nlocal = m->num_local;
    st->dtype = dtype;
    st->nin = nin;
    for (int i = 0; i < nin; i++)
        st->in[i] = in[i];
    st->out = out;
    *stp = st;
    return DT_OK;
}

static void shape_text(char *buf, size_t size, int rank, const int64_t s[])
{
    dt__shape_str(buf, size, rank, s);
}

/* A kernel's mode in words, from the op that emits the kernel (its describe slot), or NULL. */
static const char *mode_words(dt__kernel kernel, unsigned mode)
{
    for (int op = 0; op < DT__OP_COUNT; op++) {
        const dt__op_def *d = dt__op_get((dt__op)op);
        const char *w = d->describe ? d->describe(kernel, mode) : NULL;
        if (w)
            return w;
    }
    return NULL;
}

/* The printed line of a kernel, from the busiest device's arguments. */
static void kernel_text(char *buf, size_t size, dt__kernel kernel, dt_device_type type,
                        dt_dtype dtype, const dt__kargs *k, double mults_total, double mults_max,
                        int ndev)
{
    char out[DT__SHAPE_STR_MAX], a[DT__SHAPE_STR_MAX];
    shape_text(out, sizeof out, k->rank, k->shape);
    const char *dn = dt_dtype_name(dtype);
    switch (kernel) {
    case DT__K_GEMM: {
        const dt__backend *be = dt__backend_of(type); /* it names its gemm's arithmetic */
        char bs[32] = "";
        if (k->batch != 1)
            snprintf(bs, sizeof bs, "%lld x ", (long long)k->batch);
        snprintf(buf, size,
                 "gemm %s %s[%lld,%lld]%s @ [%lld,%lld]%s -> [%lld,%lld]: %.0f multiplies per "
                 "device (at most), %.0f on %d devices, %s",
                 dn, bs, (long long)k->m, (long long)k->k, k->ta ? "^T" : "", (long long)k->k,
                 (long long)k->n, k->tb ? "^T" : "", (long long)k->m, (long long)k->n, mults_max,
                 mults_total, ndev, be && be->gemm_math ? be->gemm_math(dtype) : "?");
        break;
    }
    case DT__K_UNARY:
        snprintf(buf, size, "unary %s %s local %s", dt_unary_op_name((dt_unary_op)k->op), dn, out);
        break;
    case DT__K_BINARY: {
        char b[DT__SHAPE_STR_MAX];
        shape_text(a, sizeof a, k->rank, k->in_shape[0]);
        shape_text(b, sizeof b, k->rank, k->in_shape[1]);
        snprintf(buf, size, "binary %s %s local %s, %s -> %s",
                 dt_binary_op_name((dt_binary_op)k->op), dn, a, b, out);
        break;
    }
    case DT__K_REDUCE:
        shape_text(a, sizeof a, k->rank, k->in_shape[0]);
        snprintf(buf, size, "reduce %s %s local %s -> %s", dt_reduce_op_name((dt_reduce_op)k->op),
                 dn, a, out);
        break;
    case DT__K_TRANSPOSE:
        shape_text(a, sizeof a, k->rank, k->in_shape[0]);
        snprintf(buf, size, "transpose %s local %s -> %s", dn, a, out);
        break;
    case DT__K_COPY_BLOCKS:
        snprintf(buf, size, "copy %s local -> %s (%d blocks)", dn, out, k->nblocks);
        break;
    default: {
        const char *mode = mode_words(kernel, k->mode);
        if (mode) {
            shape_text(a, sizeof a, k->rank, k->in_shape[0]);
            snprintf(buf, size, "%s %s %s local %s -> %s", dt__kernel_name(kernel), mode, dn, a,
                     out);
        } else {
            snprintf(buf, size, "%s %s local %s", dt__kernel_name(kernel), dn, out);
        }
        break;
    }
    }
}

dt_status dt__emit_kernel(dt__program *p, const char *cause, dt__kernel kernel, dt_dtype dtype,
                          int nin, const int in[], int out, const dt_mesh *m, dt__args_fn fill,
                          void *ctx)
{
    /* Asked of the mesh's device type, not of a local device: a client owning no device of
     * the mesh gets the same verdict as the others (and no client waits for another). */
    const dt__backend *be = dt__backend_of(m->type);
    if (!be)
        return dt__fail(DT_ERR_UNSUPPORTED, "%s: this build has no %s backend", cause,
                        dt_device_type_name(m->type));
    if (!be->kernels || !be->kernels[kernel][dtype])
        return dt__fail(DT_ERR_UNSUPPORTED, "%s: the %s backend has no %s kernel for %s", cause,
                        be->name, dt__kernel_name(kernel), dt_dtype_name(dtype));
    dt__step *st;
    DT_TRY(new_step(p, DT__STEP_KERNEL, cause, m, dtype, nin, in, out, &st));
    st->kernel = kernel;
    st->args = calloc((size_t)m->num_local + 1, sizeof *st->args);
    if (!st->args)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    dt__kargs busiest = {0};
    int64_t most = -1;
    for (int d = 0; d < m->size; d++) {
        dt__kargs k = {0};
        fill(ctx, d, &k);
        int64_t e = dt__num_elements(k.rank, k.shape);
        double mults = kernel == DT__K_GEMM ? (double)k.batch * k.m * k.n * k.k : 0;
        st->mults_total += mults;
        if (mults > st->mults_max)
            st->mults_max = mults;
        if (e > most || (kernel == DT__K_GEMM && mults >= st->mults_max && e >= most)) {
            free(busiest.blocks);
            busiest = k;
            busiest.blocks = NULL;
            most = e;
        }
        int li = d - m->first_local;
        if (li >= 0 && li < m->num_local) {
            double work = (double)e + mults;
            for (int q = 0; q < k.nblocks; q++)
                work += (double)dt__num_elements(k.blocks[q].rank, k.blocks[q].extent);
            if (kernel == DT__K_REDUCE || kernel == DT__K_BINARY || kernel == DT__K_SOFTMAX ||
                kernel == DT__K_NORM || kernel == DT__K_SCAN || kernel == DT__K_ARG_REDUCE)
                work += (double)dt__num_elements(k.rank, k.in_shape[0]);
            if (kernel == DT__K_SEGMENT_SUM)
                work += (double)k.nidx * (double)k.inner;
            st->work += work;
            st->args[li] = k;
        } else
            free(k.blocks);
    }
    p->nsteps++;
    kernel_text(st->text, sizeof st->text, kernel, m->type, dtype, &busiest, st->mults_total,
                st->mults_max, m->size);
    return DT_OK;
}

static void axes_text(char *buf, size_t size, const dt_mesh *m, unsigned axes)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int a = 0; a < m->num_axes; a++)
        if (axes & (1u << a))
            n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s", n ? "," : "",
                                  m->names[a]);
}

dt_status dt__emit_coll(dt__program *p, const char *cause, dt__coll_kind kind, dt_dtype dtype,
                        dt_reduce_op op, unsigned axes, int send, int recv, int64_t count,
                        dt__counts_fn counts_of, void *ctx, int ncounts, double sent,
                        const char *what)
{
    const dt_mesh *m = p->slots[recv].mesh;
    dt__step *st;
    DT_TRY(new_step(p, DT__STEP_COLL, cause, m, dtype, 1, &send, recv, &st));
    st->coll = kind;
    st->op = op;
    st->axes = axes;
    st->count = count;
    st->bytes_max = sent;
    if (counts_of) {
        st->counts = calloc((size_t)m->num_local + 1, sizeof *st->counts);
        if (!st->counts)
            return dt__fail(DT_ERR_NOMEM, "program: out of memory");
        for (int i = 0; i < m->num_local; i++) {
            st->counts[i] = calloc((size_t)ncounts + 1, sizeof **st->counts);
            if (!st->counts[i]) {
                for (int j = 0; j < i; j++)
                    free(st->counts[j]);
                free(st->counts);
                st->counts = NULL;
                return dt__fail(DT_ERR_NOMEM, "program: out of memory");
            }
            counts_of(ctx, m->first_local + i, st->counts[i]);
        }
    }
    p->nsteps++;
    char ax[DT_STRING_MAX];
    axes_text(ax, sizeof ax, m, axes);
    char opname[16] = "";
    if (kind == DT__COLL_ALL_REDUCE || kind == DT__COLL_REDUCE_SCATTER)
        snprintf(opname, sizeof opname, " %s", dt_reduce_op_name(op));
    snprintf(st->text, sizeof st->text, "%s%s over {%s} %s %s: %.0f bytes sent per device",
             dt__coll_kind_name(kind), opname, ax, dt_dtype_name(dtype), what, sent);
    return DT_OK;
}

dt_status dt__coll_boxes(dt__program *p, dt__boxes_fn boxes_of, void *ctx, int nboxes)
{
    dt__step *st = &p->steps[p->nsteps - 1];
    int nl = st->mesh->num_local;
    st->boxes = calloc((size_t)nl + 1, sizeof *st->boxes);
    if (!st->boxes)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    for (int i = 0; i < nl; i++) {
        st->boxes[i] = calloc((size_t)nboxes + 1, sizeof **st->boxes);
        if (!st->boxes[i])
            return dt__fail(DT_ERR_NOMEM, "program: out of memory");
        boxes_of(ctx, st->mesh->first_local + i, st->boxes[i]);
    }
    size_t len = strlen(st->text);
    snprintf(st->text + len, sizeof st->text - len, ", shard to shard with no packing");
    return DT_OK;
}

dt_status dt__coll_at(dt__program *p, dt__counts_fn at_of, void *ctx)
{
    dt__step *st = &p->steps[p->nsteps - 1];
    st->at = calloc((size_t)st->nlocal + 1, sizeof *st->at);
    if (!st->at)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    for (int i = 0; i < st->nlocal; i++)
        at_of(ctx, st->mesh->first_local + i, st->at[i]);
    return DT_OK;
}

dt_status dt__emit_transfer(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, dt__dist *out)
{
    const dt_mesh *from = in->layout.mesh, *m = to->mesh;
    DT_TRY(dt__slot_new(p, to, in->dtype, in->rank, in->shape, out));
    dt__step *st;
    DT_TRY(new_step(p, DT__STEP_TRANSFER, cause, m, in->dtype, 1, &in->slot, out->slot, &st));
    double most = 0;
    for (int d = 0; d < m->size; d++) {
        double e = (double)dt__local_elems(to, in->rank, in->shape, d);
        most = e > most ? e : most;
    }
    st->bytes_max = 0; /* nothing crosses clients or devices of one type */
    p->nsteps++;
    snprintf(st->text, sizeof st->text,
             "transfer %s %s -> %s: each device's shard to the device at its coordinates, at "
             "most %.0f bytes",
             dt_dtype_name(in->dtype), dt_device_type_name(from->type),
             dt_device_type_name(m->type), most * (double)dt_dtype_size(in->dtype));
    return DT_OK;
}

/* ---- executor ----------------------------------------------------------------------------- */

/* A kernel's failure on one device, kept until the step is over (messages are per thread). */
typedef struct dt__failure {
    dt_status status;
    char msg[512];
} dt__failure;

typedef struct run_ctx {
    const dt__program *p;
    const dt__step *st;
    void ***bufs;        /* bufs[slot][local] */
    dt__failure *failed; /* per local device of the step's mesh */
} run_ctx;

/* The buffer of `slot` on local device i of the step's mesh. A copy between meshes over
 * different devices reads a slot of another mesh: the same runtime device has another local
 * index there, or none (NULL: that step's arguments on i then touch no input). */
static void *slot_buf(const run_ctx *c, int slot, int i)
{
    const dt_mesh *sm = c->p->slots[slot].mesh, *m = c->st->mesh;
    int j = sm == m ? i : i + m->local_base - sm->local_base;
    return j >= 0 && j < sm->num_local ? c->bufs[slot][j] : NULL;
}

static void kernel_task(dt__device *d, int i, void *arg)
{
    const run_ctx *c = arg;
    const dt__step *st = c->st;
    const void *in[DT__STEP_MAX_IN] = {NULL};
    for (int j = 0; j < st->nin; j++)
        in[j] = slot_buf(c, st->in[j], i);
    dt_status s = d->backend->enter ? d->backend->enter(d) : DT_OK;
    dt__kernel_fn fn = d->backend->kernels[st->kernel][st->dtype];
    if (s == DT_OK && d->backend->launch)
        s = d->backend->launch(d, fn, &st->args[i], in, slot_buf(c, st->out, i));
    else if (s == DT_OK)
        s = fn(&d->kx, &st->args[i], in, slot_buf(c, st->out, i));
    if (s != DT_OK)
        c->failed[i] = (dt__failure){.status = s};
    if (s != DT_OK)
        snprintf(c->failed[i].msg, sizeof c->failed[i].msg, "%s", dt_last_error());
}

/* Run one kernel step on every local device. Small kernels on host-accessible devices run on
 * the caller (waking the workers costs more than the work: eager dispatch on tiny tensors);
 * kernels of devices with a queue of their own (CUDA) are queued from the caller, which only
 * takes microseconds per device. The first failure is returned with its message. */
static dt_status run_kernel(run_ctx *c)
{
    const dt__step *st = c->st;
    dt__device *const *devs = dt__mesh_local_devices(st->mesh);
    int nl = st->mesh->num_local;
    for (int d = 0; d < nl; d++)
        c->failed[d].status = DT_OK;
    if (nl > 1 && (!devs[0]->backend->host_accessible || st->work < DT__INLINE_WORK))
        for (int d = 0; d < nl; d++)
            kernel_task(devs[d], d, c);
    else
        dt__devices_run(devs, nl, kernel_task, c);
    for (int d = 0; d < nl; d++)
        if (c->failed[d].status != DT_OK) {
            dt__set_error(c->failed[d].msg);
            return c->failed[d].status;
        }
    return DT_OK;
}

/* A transfer between meshes of different device types over the same clients and coordinates:
 * the host-side backend's buffer is host memory, so the other backend moves it. */
static dt_status run_transfer(const dt__program *p, const dt__step *st, void ***bufs)
{
    const dt_mesh *from = p->slots[st->in[0]].mesh, *to = st->mesh;
    dt__device *const *src = dt__mesh_local_devices(from), *const *dst = dt__mesh_local_devices(to);
    const size_t *bytes = p->slots[st->out].bytes;
    for (int i = 0; i < to->num_local; i++) {
        void *s = bufs[st->in[0]][i], *d = bufs[st->out][i];
        if (src[i]->backend->host_accessible)
            DT_TRY(dst[i]->backend->to_device(dst[i], d, s, bytes[i]));
        else
            DT_TRY(src[i]->backend->to_host(src[i], d, s, bytes[i]));
    }
    return DT_OK;
}

/* Start the collective; scratch: room for 2 pointers per local device, this collective's
 * alone while it is in flight (allocated before the run's agreement, so that nothing here can
 * fail on one client alone). */
static dt_status run_coll(const dt__step *st, void ***bufs, void **scratch, dt__coll_req **req)
{
    const void **sat = NULL;
    void **rat = NULL;
    if (st->at) {
        /* offsets into the slots' buffers (a block of rows of a larger slot) */
        sat = (const void **)scratch;
        rat = scratch + st->nlocal;
        size_t es = dt_dtype_size(st->dtype);
        for (int i = 0; i < st->nlocal; i++) {
            sat[i] = (const char *)bufs[st->in[0]][i] + (size_t)st->at[i][0] * es;
            rat[i] = (char *)bufs[st->out][i] + (size_t)st->at[i][1] * es;
        }
    }
    dt__coll c = {
        .kind = st->coll,
        .dtype = st->dtype,
        .op = st->op,
        .axes = st->axes,
        .root = 0,
        .algorithm = DT_ALGORITHM_AUTO,
        .cause = st->cause,
        .send = sat ? (const void *const *)sat : (const void *const *)bufs[st->in[0]],
        .recv = rat ? (void *const *)rat : bufs[st->out],
        .count = st->count,
        .counts = (const int64_t *const *)st->counts,
        .boxes = (const dt__block *const *)st->boxes,
    };
    return dt__collective_start(st->mesh, &c, req);
}

/* ---- temporaries: one arena per device, planned before the first collective ------------- */

/* Temporaries are placed in one arena per device, at offsets planned from their lifetimes
 * (the steps from the first that touches them to the last), so two live at once never share
 * bytes but a relayout chain reuses the bytes of intermediates already dead: the arena is the
 * peak of what is live, not the sum. It is allocated with the results, before the first
 * collective, and the clients agree on both: an out-of-memory on one client is an error on
 * every client, never a client left waiting in a collective. */
#define DT__ARENA_ALIGN 256

typedef struct arena {
    dt__device *dev;
    size_t size;
    void *base;
} arena;

typedef struct placed {
    int slot, local, first, last;
    size_t bytes, at;
} placed;

/* Where every temporary lies: items[j] of arena which[j]; arenas[a] has its device and size
 * (no base). Planned once, at seal (plan_temps is quadratic in the temporaries). */
struct dt__arena_plan {
    int n, na;
    placed *items;
    int *which;
    arena *arenas;
};

static void plan_free(struct dt__arena_plan *pl)
{
    if (!pl)
        return;
    free(pl->items);
    free(pl->which);
    free(pl->arenas);
    free(pl);
}

static bool is_temp(const dt__slot *sl)
{
    return sl->input < 0 && sl->output < 0 && sl->first <= sl->last;
}

static void lifetimes(dt__program *p)
{
    for (int i = 0; i < p->nslots; i++) {
        p->slots[i].first = p->nsteps;
        p->slots[i].last = -1;
    }
    /* in run order; a collective's buffers live on until its wait */
    for (int q = 0; q < p->nsteps; q++) {
        const dt__step *st = &p->steps[p->order ? p->order[q] : q];
        int until = st->kind == DT__STEP_COLL && st->wait_at - 1 > q ? st->wait_at - 1 : q;
        for (int t = -1; t < st->nin; t++) { /* the output, then each operand */
            dt__slot *sl = &p->slots[t < 0 ? st->out : st->in[t]];
            if (q < sl->first)
                sl->first = q;
            if (until > sl->last)
                sl->last = until;
        }
    }
}

/* o is untouched before step i and t dead after it: t's writers (and readers) from t's first
 * step to i use o's bytes. */
static void retarget(dt__program *p, int t, int o, int i)
{
    for (int j = p->slots[t].first; j <= i; j++) {
        dt__step *sj = &p->steps[j];
        for (int k = 0; k < sj->nin; k++)
            if (sj->in[k] == t)
                sj->in[k] = o;
        if (sj->out == t)
            sj->out = o;
    }
    lifetimes(p);
}

/* Whether step i's result o can take over the buffer of its operand t: t a temporary step i
 * reads last, o no program input, first written by step i, on the same mesh with the same
 * bytes on every device. */
static bool takes_over(const dt__program *p, int t, int o, int i)
{
    const dt__slot *ts = &p->slots[t], *os = &p->slots[o];
    if (t == o || !is_temp(ts) || ts->last != i || os->input >= 0 || os->first != i ||
        ts->mesh != os->mesh)
        return false;
    for (int d = 0; d < ts->mesh->num_local; d++)
        if (ts->bytes[d] != os->bytes[d])
            return false;
    return true;
}

/* An even all-reduce whose input is a temporary it reads last, into a slot it writes first of
 * the same bytes, runs in place: the steps that wrote the temporary write the output's buffer
 * instead, and the collective reduces it where it lies (every backend takes send == recv). A
 * sharded matmul's partial product is then its result: its peak extra memory is the output
 * alone, not the output and a partial product of the same size. */
static void reduce_in_place(dt__program *p)
{
    for (int i = 0; i < p->nsteps; i++) {
        const dt__step *st = &p->steps[i];
        if (st->kind != DT__STEP_COLL || st->coll != DT__COLL_ALL_REDUCE || st->counts)
            continue;
        if (takes_over(p, st->in[0], st->out, i))
            retarget(p, st->in[0], st->out, i);
    }
}

/* A segment sum into a base (the tied embedding's gather gradient added into the gemm's) whose
 * base is a temporary it reads last, into a slot it writes first of the same bytes, runs in
 * place the same way: the base's writers write the result's buffer, and the kernel adds the
 * selected rows' sums where they lie instead of copying the base first (bitwise the same; the
 * base's bytes leave the arena). The printed step says ", in place". */
static void segment_in_place(dt__program *p)
{
    for (int i = 0; i < p->nsteps; i++) {
        const dt__step *st = &p->steps[i];
        if (st->kind != DT__STEP_KERNEL || st->kernel != DT__K_SEGMENT_SUM || st->nin != 3 ||
            !st->args || st->args[0].mode != DT__SEGMENT_INTO)
            continue;
        int t = st->in[2];
        if (st->in[0] == t || st->in[1] == t || !takes_over(p, t, st->out, i))
            continue;
        retarget(p, t, st->out, i);
        dt__step *sm = &p->steps[i];
        size_t n = strlen(sm->text);
        snprintf(sm->text + n, sizeof sm->text - n, ", in place");
    }
}

static size_t align_up(size_t n)
{
    return (n + DT__ARENA_ALIGN - 1) / DT__ARENA_ALIGN * DT__ARENA_ALIGN;
}

/* First fit: the lowest aligned offset where `x` overlaps no earlier item alive at once. An
 * empty buffer still takes a byte: buffers alive at once keep distinct addresses (MPI refuses
 * a send buffer that aliases a receive buffer, even an empty one). */
static void place(placed *items, int n, placed *x)
{
    x->at = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int j = 0; j < n; j++) {
            const placed *y = &items[j];
            bool alive = y->first <= x->last && x->first <= y->last;
            bool clash = x->at < y->at + y->bytes && y->at < x->at + x->bytes;
            if (alive && clash) {
                x->at = align_up(y->at + y->bytes);
                moved = true;
            }
        }
    }
}

static void free_arenas(arena *ar, int n)
{
    for (int a = 0; a < n; a++)
        dt__device_free(ar[a].dev, ar[a].base, ar[a].size);
    free(ar);
}

/* Plan the temporaries' arenas: per local device, each temporary at the first offset where it
 * overlaps no other alive at once. */
static dt_status plan_temps(const dt__program *p, struct dt__arena_plan **out)
{
    *out = NULL;
    int total = 0;
    for (int i = 0; i < p->nslots; i++)
        if (is_temp(&p->slots[i]))
            total += p->slots[i].mesh->num_local;
    struct dt__arena_plan *pl = calloc(1, sizeof *pl);
    placed *mine = calloc((size_t)total + 1, sizeof *mine);
    if (pl) {
        pl->items = calloc((size_t)total + 1, sizeof *pl->items);
        pl->arenas = calloc((size_t)total + 1, sizeof *pl->arenas);
        pl->which = calloc((size_t)total + 1, sizeof *pl->which);
    }
    if (!pl || !mine || !pl->items || !pl->arenas || !pl->which) {
        plan_free(pl);
        free(mine);
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    }
    int n = 0, na = 0;
    for (int i = 0; i < p->nslots; i++) {
        const dt__slot *sl = &p->slots[i];
        if (!is_temp(sl))
            continue;
        dt__device *const *devs = dt__mesh_local_devices(sl->mesh);
        for (int d = 0; d < sl->mesh->num_local; d++) {
            int a = 0;
            while (a < na && pl->arenas[a].dev != devs[d])
                a++;
            if (a == na)
                pl->arenas[na++].dev = devs[d];
            /* items of one device are placed against each other only */
            placed x = {.slot = i,
                        .local = d,
                        .first = sl->first,
                        .last = sl->last,
                        .bytes = sl->bytes[d] ? sl->bytes[d] : 1};
            int nm = 0;
            for (int j = 0; j < n; j++)
                if (pl->which[j] == a)
                    mine[nm++] = pl->items[j];
            place(mine, nm, &x);
            if (x.at + x.bytes > pl->arenas[a].size)
                pl->arenas[a].size = x.at + x.bytes;
            pl->which[n] = a;
            pl->items[n++] = x;
        }
    }
    free(mine);
    pl->n = n;
    pl->na = na;
    *out = pl;
    return DT_OK;
}

void dt__program_seal(dt__program *p)
{
    free(p->order); /* reduce_in_place works in the emitted order */
    p->order = NULL;
    for (int i = 0; i < p->nsteps; i++)
        p->steps[i].wait_at = 0;
    lifetimes(p);
    reduce_in_place(p);
    segment_in_place(p);
    dt__program_schedule(p);
    lifetimes(p);
    plan_free(p->plan);
    if (plan_temps(p, &p->plan) != DT_OK)
        p->plan = NULL; /* each run plans for itself */
}

/* Allocate the temporaries' arenas as planned (at seal; planned here if that ran out of
 * memory); bufs[slot] of each temporary gets its per-device pointers. Local: the caller agrees
 * on the status. */
static dt_status alloc_temps(const dt__program *p, void ***bufs, arena **out, int *nout)
{
    *out = NULL;
    *nout = 0;
    struct dt__arena_plan *own = NULL;
    const struct dt__arena_plan *pl = p->plan;
    if (!pl) {
        DT_TRY(plan_temps(p, &own));
        pl = own;
    }
    if (!pl->n) {
        plan_free(own);
        return DT_OK;
    }
    arena *ar = calloc((size_t)pl->na, sizeof *ar);
    dt_status s = ar ? DT_OK : dt__fail(DT_ERR_NOMEM, "program: out of memory");
    for (int i = 0; s == DT_OK && i < p->nslots; i++) {
        const dt__slot *sl = &p->slots[i];
        if (!is_temp(sl))
            continue;
        bufs[i] = calloc((size_t)sl->mesh->num_local + 1, sizeof **bufs);
        if (!bufs[i])
            s = dt__fail(DT_ERR_NOMEM, "program: out of memory");
    }
    for (int a = 0; s == DT_OK && a < pl->na; a++) {
        ar[a] = (arena){.dev = pl->arenas[a].dev, .size = pl->arenas[a].size};
        s = dt__device_alloc(ar[a].dev, ar[a].size, &ar[a].base);
    }
    for (int j = 0; s == DT_OK && j < pl->n; j++)
        bufs[pl->items[j].slot][pl->items[j].local] =
            (char *)ar[pl->which[j]].base + pl->items[j].at;
    int na = pl->na;
    plan_free(own);
    if (s != DT_OK) {
        if (ar)
            free_arenas(ar, na); /* those not allocated have a NULL base: a no-op */
        return s;
    }
    *out = ar;
    *nout = na;
    return s;
}

dt_status dt__program_run(const dt__program *p, const dt_tensor *const in[], dt_tensor *out[],
                          const dt__op_check *chk)
{
    for (int o = 0; o < p->noutputs; o++)
        out[o] = NULL;
    dt_status s = DT_OK;
    void ***bufs = calloc((size_t)p->nslots + 1, sizeof *bufs);
    if (!bufs)
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    arena *ar = NULL;
    int na = 0;
    /* Results and temporaries are allocated first, and clients agree on that before any
     * collective. */
    for (int o = 0; s == DT_OK && o < p->noutputs; o++) {
        const dt__dist *x = &p->out[o];
        s = dt__tensor_alloc(&x->layout, x->dtype, x->rank, x->shape, &out[o]);
    }
    if (s == DT_OK)
        s = alloc_temps(p, bufs, &ar, &na);
    for (int i = 0; s == DT_OK && i < p->nslots; i++) {
        const dt__slot *sl = &p->slots[i];
        if (sl->input >= 0)
            bufs[i] = in[sl->input]->data;
        else if (sl->output >= 0)
            bufs[i] = out[sl->output]->data;
    }
    /* the steps' scratch too: after the agreement nothing may fail on one client alone */
    int most = 0;
    for (int i = 0; i < p->nsteps; i++)
        if (p->steps[i].mesh->num_local > most)
            most = p->steps[i].mesh->num_local;
    dt__flight fl = {0};
    if (s == DT_OK)
        s = dt__flight_init(&fl, p);
    dt__failure *failed = s == DT_OK ? calloc((size_t)most + 1, sizeof *failed) : NULL;
    void **scratch =
        s == DT_OK ? calloc(2 * (size_t)most * ((size_t)fl.cap + 1) + 1, sizeof *scratch) : NULL;
    if (s == DT_OK && (!failed || !scratch))
        s = dt__fail(DT_ERR_NOMEM, "program: out of memory");
    const dt_mesh *m0 = p->nslots ? p->slots[0].mesh : NULL;
    s = dt__mesh_agree(chk->mesh, s, &chk->a);
    /* A failing kernel (a device error: CPU kernels cannot fail) stops the kernels of this
     * client, but its collectives still run, so that no client waits for one that left; on
     * devices whose kernels can fail, the clients then agree on the outcome (on every op, so
     * that every client takes the same path). */
    dt_status kernels = DT_OK;
    int ncoll = 0;
    for (int q = 0; s == DT_OK && q < p->nsteps; q++) {
        const dt__step *st = &p->steps[p->order ? p->order[q] : q];
        s = dt__flight_wait(&fl, q);
        if (s != DT_OK)
            break;
        if (st->kind == DT__STEP_KERNEL) {
            run_ctx c = {.p = p, .st = st, .bufs = bufs, .failed = failed};
            if (kernels == DT_OK)
                kernels = run_kernel(&c);
        } else if (st->kind == DT__STEP_TRANSFER) {
            if (kernels == DT_OK)
                kernels = run_transfer(p, st, bufs);
        } else {
            s = dt__flight_room(&fl);
            if (s != DT_OK)
                break;
            dt__coll_req *r;
            s = run_coll(st, bufs, scratch + 2 * (size_t)most * (size_t)ncoll++, &r);
            if (s == DT_OK)
                dt__flight_add(&fl, r, st->wait_at);
        }
        dt__flight_poke(&fl);
    }
    /* every collective started is completed (or released) even after a failure */
    dt_status w = dt__flight_wait(&fl, INT_MAX);
    if (s == DT_OK)
        s = w;
    dt__flight_free(&fl);
    free(failed);
    free(scratch);
    if (s == DT_OK)
        s = kernels;
    const dt__backend *be = m0 ? dt__backend_of(m0->type) : NULL;
    if (be && !be->host_accessible && chk->mesh->comm != MPI_COMM_NULL)
        s = dt__mesh_agree(chk->mesh, s, &(dt__agreement){.what = "kernels' outcome"});
    for (int i = 0; i < p->nslots; i++)
        if (is_temp(&p->slots[i]))
            free(bufs[i]);
    free_arenas(ar, na);
    free(bufs);
    if (s != DT_OK)
        for (int o = 0; o < p->noutputs; o++) {
            dt_tensor_free(out[o]);
            out[o] = NULL;
        }
    return s;
}

/* ---- printer ------------------------------------------------------------------------------ */

void dt__program_totals(const dt__program *p, double *mults, int *colls, double *bytes)
{
    double mu = 0, by = 0;
    int co = 0;
    for (int i = 0; i < p->nsteps; i++) {
        mu += p->steps[i].mults_total;
        if (p->steps[i].kind == DT__STEP_COLL) {
            co++;
            by += p->steps[i].bytes_max;
        }
    }
    if (mults)
        *mults = mu;
    if (colls)
        *colls = co;
    if (bytes)
        *bytes = by;
}

static void dist_text(char *buf, size_t size, const dt__dist *x)
{
    char sb[DT__SHAPE_STR_MAX], lb[DT_STRING_MAX];
    snprintf(buf, size, "%s%s \"%s\"", dt_dtype_name(x->dtype),
             dt__shape_str(sb, sizeof sb, x->rank, x->shape),
             dt__layout_str(&x->layout, lb, sizeof lb));
}

dt_status dt__program_print(const dt__program *p, FILE *f)
{
    char mb[DT_STRING_MAX], xb[DT_STRING_MAX + 64];
    const dt_mesh *m = p->noutputs ? p->out[0].layout.mesh : NULL;
    if (m)
        dt_mesh_format(m, mb, sizeof mb);
    else
        snprintf(mb, sizeof mb, "<no mesh>");
    fprintf(f, "program %s on %s: %d step%s\n", p->title, mb, p->nsteps, p->nsteps == 1 ? "" : "s");
    for (int i = 0; i < p->ninputs; i++) {
        dist_text(xb, sizeof xb, &p->in[i]);
        fprintf(f, "  input %d: %s\n", i, xb);
    }
    double mults_max = 0;
    for (int i = 0; i < p->nsteps; i++) {
        const dt__step *st = &p->steps[i];
        fprintf(f, "  %2d. %-10s %s  (%s)\n", i + 1,
                st->kind == DT__STEP_COLL ? "collective" : "kernel", st->text, st->cause);
        mults_max += st->mults_max;
    }
    for (int i = 0; i < p->noutputs; i++) {
        dist_text(xb, sizeof xb, &p->out[i]);
        fprintf(f, "  output %d: %s\n", i, xb);
    }
    double mults, bytes;
    int colls;
    dt__program_totals(p, &mults, &colls, &bytes);
    int ndev = m ? m->size : 0;
    fprintf(f,
            "  total: %.0f multiplies on %d devices (at most %.0f per device); %d collective%s, "
            "at most %.0f bytes sent per device\n",
            mults, ndev, mults_max, colls, colls == 1 ? "" : "s", bytes);
    return DT_OK;
}
