/* GPUs emulated on the host (DTENSOR_EMULATE_CUDA, where no GPU is visible): host memory and
 * the CPU's kernels, used under a GPU's rules. Each device has two streams, as a CUDA device
 * has (dt__dev_ops in common/dt.h): a compute stream, where kernels, copies and uploads queue,
 * and a side stream for the collectives across clients.
 *
 * By default every stream runs its work as it is queued. Under the late test hook
 * (dt__emulate_late, DTENSOR_EMULATE_LATE=1) the compute streams keep their work queued until
 * something waits for it: a read (to_host), a sync, a free to the system, or a side stream
 * ordered after it (side_after). A producer then finishes as late as a GPU may let it, so a
 * collective that does not wait for its inputs' producers reads stale values; and the
 * ordering of every side stream use is checked against the compute streams: a collective that
 * reads a buffer a queued kernel has yet to write, or a compute op touching a buffer a
 * collective wrote (or writing one it read) before its stream waited for that collective,
 * fails the device with DT_ERR_DEVICE naming both. The side streams always run at once. */
#include "dt.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"

/* ---- streams ---------------------------------------------------------------------------- */

typedef enum { OP_KERNEL, OP_COPY, OP_WAIT } op_kind;

typedef struct emu_op {
    struct emu_op *next;
    op_kind kind;
    /* kernel */
    dt__kernel_fn fn;
    dt__kargs args;
    const void *in[DT__KERNEL_MAX_IN];
    void *out;
    /* copy: dst <- src; `owned` is a snapshot of host memory the copy frees */
    void *dst;
    const void *src;
    size_t bytes;
    void *owned;
    /* wait: the compute stream has waited for side device `side`'s stream up to `upto` */
    int side;
    uint64_t upto;
} emu_op;

typedef struct emu_dev {
    emu_op *head, *tail; /* the compute stream's queued work */
    int queued;
    uint64_t side_seq; /* uses of this device's side stream so far */
    uint64_t *waited;  /* per side device (local index): its side_seq this stream waited for */
    int ndev;
    dt_status failed; /* the first failure of queued work, reported at the next wait */
    char msg[400];
} emu_dev;

/* A buffer a side stream used: until every compute stream touching it has waited for that
 * use, a compute op may not write it (nor read it when the collective wrote it). */
typedef struct emu_region {
    struct emu_region *next;
    const char *p;
    size_t bytes;
    int side;
    uint64_t seq;
    bool write;
} emu_region;

static pthread_mutex_t lock;
static pthread_once_t lock_once = PTHREAD_ONCE_INIT;
static bool late;
static emu_region *regions;

static void make_lock(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&lock, &a);
    pthread_mutexattr_destroy(&a);
    const char *e = getenv("DTENSOR_EMULATE_LATE");
    late = e && strcmp(e, "1") == 0;
}

static void enter_lock(void)
{
    pthread_once(&lock_once, make_lock);
    pthread_mutex_lock(&lock);
}

void dt__emulate_late(bool on)
{
    enter_lock();
    late = on;
    pthread_mutex_unlock(&lock);
}

static emu_dev *dev_of(const dt__device *d)
{
    return d->side;
}

/* Fail the device: the message names it; the device is dead from now on. */
static dt_status emu_fail(dt__device *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static dt_status emu_fail(dt__device *d, const char *fmt, ...)
{
    emu_dev *e = dev_of(d);
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    dt_status s =
        dt__fail(DT_ERR_DEVICE, "CUDA:%d (emulated GPU %d): %s", d->local_index, d->ordinal, what);
    if (e && e->failed == DT_OK) {
        e->failed = s;
        snprintf(e->msg, sizeof e->msg, "%s", dt_last_error());
    }
    dt__device_kill(d);
    return s;
}

/* The client's emulated devices (the runtime's array, from their opens until the last close). */
static dt__device *cuda_devs;
static int num_cuda;

static dt__device *device(int local)
{
    return &cuda_devs[local];
}

/* Drop the regions every compute stream has waited for. */
static void prune(void)
{
    int n = num_cuda;
    for (emu_region **r = &regions; *r;) {
        bool all = true;
        for (int i = 0; all && i < n; i++) {
            emu_dev *e = dev_of(device(i));
            all = !e || e->waited[(*r)->side] >= (*r)->seq;
        }
        if (all) {
            emu_region *x = *r;
            *r = x->next;
            free(x);
        } else {
            r = &(*r)->next;
        }
    }
}

/* A compute op of d touches p: it must come after every side stream use of p that conflicts
 * (a collective's write, or a collective's read when the op writes). */
static dt_status check_compute(dt__device *d, const void *p, bool write, const char *what)
{
    emu_dev *e = dev_of(d);
    for (const emu_region *r = regions; p && r; r = r->next)
        if ((const char *)p >= r->p && (const char *)p < r->p + r->bytes && (r->write || write) &&
            e->waited[r->side] < r->seq)
            return emu_fail(d,
                            "%s touches a buffer that a device collective on the side stream of "
                            "CUDA:%d %s: the compute stream did not wait for the collective",
                            what, r->side, r->write ? "writes" : "reads");
    return DT_OK;
}

static void free_op(emu_op *o)
{
    if (o->kind == OP_KERNEL) {
        free(o->args.blocks);
        free((void *)o->args.fused);
    }
    free(o->owned);
    free(o);
}

/* Run one compute op of d (the lock held). */
static dt_status run_op(dt__device *d, emu_op *o)
{
    emu_dev *e = dev_of(d);
    dt_status s = DT_OK;
    switch (o->kind) {
    case OP_KERNEL:
        for (int j = 0; late && s == DT_OK && j < DT__KERNEL_MAX_IN; j++)
            s = check_compute(d, o->in[j], false, "a kernel's operand");
        if (late && s == DT_OK)
            s = check_compute(d, o->out, true, "a kernel's output");
        if (s == DT_OK)
            s = o->fn(&d->kx, &o->args, o->in, o->out);
        break;
    case OP_COPY:
        if (late)
            s = check_compute(d, o->src, false, "a copy's source");
        if (late && s == DT_OK)
            s = check_compute(d, o->dst, true, "a copy's destination");
        if (s == DT_OK && o->bytes && o->dst != o->src)
            memcpy(o->dst, o->src, o->bytes);
        break;
    case OP_WAIT:
        if (e->waited[o->side] < o->upto)
            e->waited[o->side] = o->upto;
        prune();
        break;
    }
    return s;
}

/* Run every op queued on d's compute stream; report the first failure of queued work. */
static dt_status drain(dt__device *d)
{
    emu_dev *e = dev_of(d);
    if (!e)
        return DT_OK;
    while (e->head) {
        emu_op *o = e->head;
        e->head = o->next;
        if (!e->head)
            e->tail = NULL;
        e->queued--;
        if (e->failed == DT_OK)
            run_op(d, o);
        free_op(o);
    }
    if (e->failed != DT_OK) {
        dt__set_error(e->msg);
        return e->failed;
    }
    return DT_OK;
}

static dt_status drain_all(void)
{
    dt_status s = DT_OK;
    for (int i = 0; i < num_cuda; i++) {
        dt_status t = drain(device(i));
        s = s == DT_OK ? t : s;
    }
    return s;
}

/* Queue o on d's compute stream, or run it now (not late). Takes o. */
static dt_status submit(dt__device *d, emu_op *o)
{
    enter_lock();
    emu_dev *e = dev_of(d);
    dt_status s = DT_OK;
    if (!late) {
        s = e->failed != DT_OK ? drain(d) : run_op(d, o);
        free_op(o);
    } else {
        if (e->tail)
            e->tail->next = o;
        else
            e->head = o;
        e->tail = o;
        /* a long queue is run, as a full GPU queue blocks the host */
        if (++e->queued > 4096)
            s = drain(d);
    }
    pthread_mutex_unlock(&lock);
    return s;
}

static emu_op *new_op(dt__device *d, op_kind kind)
{
    emu_op *o = calloc(1, sizeof *o);
    if (!o)
        dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): out of memory for queued work", d->local_index);
    else
        o->kind = kind;
    return o;
}

/* ---- the backend -------------------------------------------------------------------------- */

static dt_status emu_open(dt__device *d)
{
    enter_lock();
    pthread_mutex_unlock(&lock);
    emu_dev *e = calloc(1, sizeof *e);
    cuda_devs = d->siblings;
    num_cuda = d->num_siblings;
    int n = num_cuda;
    if (e)
        e->waited = calloc((size_t)n + 1, sizeof *e->waited);
    if (!e || !e->waited) {
        free(e);
        return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): out of memory for its streams",
                        d->local_index);
    }
    e->ndev = n;
    d->side = e;
    return DT_OK;
}

static void emu_close(dt__device *d)
{
    enter_lock();
    drain_all();
    emu_dev *e = dev_of(d);
    /* the last device closed takes the regions with it */
    bool last = true;
    for (int i = 0; i < num_cuda; i++)
        last = last && (device(i) == d || !dev_of(device(i)));
    while (last && regions) {
        emu_region *r = regions;
        regions = r->next;
        free(r);
    }
    d->side = NULL;
    if (last) { /* the runtime frees its array next */
        cuda_devs = NULL;
        num_cuda = 0;
    }
    pthread_mutex_unlock(&lock);
    if (e)
        free(e->waited);
    free(e);
}

static dt_status emu_enter(dt__device *d)
{
    return dt__device_alive(d);
}

static dt_status emu_alloc(dt__device *d, size_t bytes, void **out)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): cannot allocate %zu bytes",
                        d->local_index, bytes);
    *out = p;
    return DT_OK;
}

static void emu_free(dt__device *d, void *p)
{
    (void)d;
    /* queued work of any device may still use it (a copy reads another device's buffer) */
    enter_lock();
    drain_all();
    pthread_mutex_unlock(&lock);
    free(p);
}

static dt_status emu_to_device(dt__device *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return DT_OK;
    emu_op *o = new_op(d, OP_COPY);
    if (!o)
        return DT_ERR_NOMEM;
    o->dst = dst;
    o->bytes = bytes;
    o->src = src;
    if (late) { /* src may be reused when this returns: queue a snapshot */
        o->owned = malloc(bytes);
        if (!o->owned) {
            free(o);
            return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): no staging for %zu bytes",
                            d->local_index, bytes);
        }
        memcpy(o->owned, src, bytes);
        o->src = o->owned;
    }
    return submit(d, o);
}

static dt_status emu_sync(dt__device *d)
{
    enter_lock();
    dt_status s = drain(d);
    pthread_mutex_unlock(&lock);
    return s;
}

static dt_status emu_to_host(dt__device *d, void *dst, const void *src, size_t bytes)
{
    DT_TRY(emu_sync(d));
    if (bytes)
        memcpy(dst, src, bytes);
    return DT_OK;
}

static dt_status emu_copy(dt__device *d, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return DT_OK;
    emu_op *o = new_op(d, OP_COPY);
    if (!o)
        return DT_ERR_NOMEM;
    o->dst = dst;
    o->src = src;
    o->bytes = bytes;
    return submit(d, o);
}

static dt_status emu_launch(dt__device *d, dt__kernel_fn fn, const dt__kargs *k,
                            const void *const in[], void *out)
{
    emu_op *o = new_op(d, OP_KERNEL);
    if (!o)
        return DT_ERR_NOMEM;
    o->fn = fn;
    o->args = *k;
    o->out = out;
    for (int j = 0; j < DT__KERNEL_MAX_IN; j++)
        o->in[j] = in[j];
    o->args.blocks = NULL;
    o->args.fused = NULL;
    if (k->fused) { /* nor may a fused step's chain */
        dt__fused *fz = malloc(sizeof *fz);
        if (!fz) {
            free(o);
            return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): out of memory for a kernel",
                            d->local_index);
        }
        *fz = *k->fused;
        o->args.fused = fz;
    }
    if (k->nblocks > 0 && k->blocks) { /* the step's blocks may not outlive a late run */
        o->args.blocks = malloc(sizeof *k->blocks * (size_t)k->nblocks);
        if (!o->args.blocks) {
            free((void *)o->args.fused);
            free(o);
            return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): out of memory for a kernel",
                            d->local_index);
        }
        memcpy(o->args.blocks, k->blocks, sizeof *k->blocks * (size_t)k->nblocks);
    }
    return submit(d, o);
}

/* ---- side streams ------------------------------------------------------------------------- */

/* A side stream of `side` uses p: it must come after every queued compute op writing p (a
 * late producer) and, when it writes, every queued op reading p; then it is remembered until
 * the compute streams wait for it. */
static dt_status side_use(dt__device *side, const void *p, size_t bytes, bool write)
{
    emu_dev *e = dev_of(side);
    if (!late || !bytes)
        return DT_OK;
    for (int i = 0; i < num_cuda; i++) {
        dt__device *d = device(i);
        for (const emu_op *o = dev_of(d) ? dev_of(d)->head : NULL; o; o = o->next) {
            bool writes =
                     (o->kind == OP_KERNEL && o->out == p) || (o->kind == OP_COPY && o->dst == p),
                 reads = o->kind == OP_COPY && o->src == p;
            for (int j = 0; o->kind == OP_KERNEL && j < DT__KERNEL_MAX_IN; j++)
                reads = reads || o->in[j] == p;
            if (writes || (write && reads))
                return emu_fail(side,
                                "a device collective on its side stream %s a buffer that work "
                                "still queued on CUDA:%d %s: the side stream did not wait for "
                                "the compute stream",
                                write ? "writes" : "reads", d->local_index,
                                writes ? "has yet to write" : "has yet to read");
        }
    }
    emu_region *r = malloc(sizeof *r);
    if (!r)
        return dt__fail(DT_ERR_NOMEM, "CUDA:%d (emulated): out of memory", side->local_index);
    *r = (emu_region){.p = p,
                      .bytes = bytes,
                      .side = side->local_index,
                      .seq = e->side_seq,
                      .write = write,
                      .next = regions};
    regions = r;
    return DT_OK;
}

dt_status dt__emulate_side_use(dt__device *side, const void *p, size_t bytes, bool write)
{
    enter_lock();
    dev_of(side)->side_seq++;
    dt_status s = side_use(side, p, bytes, write);
    pthread_mutex_unlock(&lock);
    return s;
}

static dt_status emu_side_after(dt__device *side, dt__device *member)
{
    (void)side;
    return emu_sync(member);
}

static dt_status emu_after_side(dt__device *member, dt__device *side)
{
    emu_op *o = new_op(member, OP_WAIT);
    if (!o)
        return DT_ERR_NOMEM;
    enter_lock();
    o->side = side->local_index;
    o->upto = dev_of(side)->side_seq;
    pthread_mutex_unlock(&lock);
    return submit(member, o);
}

static dt_status emu_side_copy(dt__device *side, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return DT_OK;
    enter_lock();
    dev_of(side)->side_seq++;
    dt_status s = side_use(side, src, bytes, false);
    if (s == DT_OK)
        s = side_use(side, dst, bytes, true);
    if (s == DT_OK)
        memcpy(dst, src, bytes);
    pthread_mutex_unlock(&lock);
    return s;
}

static dt_status emu_side_combine(dt__device *side, const dt__combine *c)
{
    size_t es = dt_dtype_size(c->dtype), ws = es;
    if (c->dtype == DT_DTYPE_BF16 || c->dtype == DT_DTYPE_F16)
        ws = sizeof(float);
    enter_lock();
    dev_of(side)->side_seq++;
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < c->nsrc; i++)
        s = side_use(side, c->src[i], (size_t)c->n * (c->src_wide ? ws : es), false);
    for (int i = 0; s == DT_OK && i < c->ndst; i++)
        s = side_use(side, c->dst[i], (size_t)c->n * (c->dst_wide ? ws : es), true);
    if (s == DT_OK)
        dt__cpu_combine(c);
    pthread_mutex_unlock(&lock);
    return s;
}

static const dt__dev_ops emu_dev_ops = {
    .side_after = emu_side_after,
    .after_side = emu_after_side,
    .side_copy = emu_side_copy,
    .side_combine = emu_side_combine,
};

const dt__backend dt__emulated_cuda_backend = {
    .name = "cuda (emulated on the host)",
    .host_accessible = false,
    .open = emu_open,
    .close = emu_close,
    .enter = emu_enter,
    .alloc = emu_alloc,
    .free = emu_free,
    .to_device = emu_to_device,
    .to_host = emu_to_host,
    .copy = emu_copy,
    .sync = emu_sync,
    .launch = emu_launch,
    .kernels = dt__cpu_kernels,
    .fused_reduce = true,
    .dev = &emu_dev_ops,
    .gemm_math = dt__cpu_gemm_math,
};

/* ---- the combine of device collectives, on the host --------------------------------------- */

/* The CUDA combine kernel's arithmetic (backends/cuda/kernels.cu), element for element: MAX keeps
 * a > b ? a : b with a the running value, integers wrap, bf16 and f16 compute in f32. */
#define COMBINE_STEP(op, v, w)                          \
    ((op) == DT_REDUCE_MAX    ? ((v) > (w) ? (v) : (w)) \
     : (op) == DT_REDUCE_MIN  ? ((v) < (w) ? (v) : (w)) \
     : (op) == DT_REDUCE_PROD ? DT__MUL(v, w)           \
                              : DT__ADD(v, w))
#define COMBINE_PLAIN(T)                     \
    for (int64_t i = 0; i < c->n; i++) {     \
        T v = ((const T *)c->src[0])[i];     \
        for (int s = 1; s < c->nsrc; s++) {  \
            T w = ((const T *)c->src[s])[i]; \
            v = COMBINE_STEP(c->op, v, w);   \
        }                                    \
        if (c->by > 1)                       \
            v = (T)(v / (T)c->by);           \
        for (int d = 0; d < c->ndst; d++)    \
            ((T *)c->dst[d])[i] = v;         \
    }

static float half_load(const dt__combine *c, int s, int64_t i)
{
    if (c->src_wide)
        return ((const float *)c->src[s])[i];
    uint16_t h = ((const uint16_t *)c->src[s])[i];
    return c->dtype == DT_DTYPE_BF16 ? dt__bf16_to_f32(h) : dt__f16_to_f32(h);
}

static void half_store(const dt__combine *c, int d, int64_t i, float v)
{
    if (c->dst_wide)
        ((float *)c->dst[d])[i] = v;
    else
        ((uint16_t *)c->dst[d])[i] =
            c->dtype == DT_DTYPE_BF16 ? dt__f32_to_bf16(v) : dt__f32_to_f16(v);
}

void dt__cpu_combine(const dt__combine *c)
{
    switch (c->dtype) {
    case DT_DTYPE_F32:
        COMBINE_PLAIN(float);
        break;
    case DT_DTYPE_F64:
        COMBINE_PLAIN(double);
        break;
    case DT_DTYPE_I32:
        COMBINE_PLAIN(int32_t);
        break;
    case DT_DTYPE_I64:
        COMBINE_PLAIN(int64_t);
        break;
    case DT_DTYPE_BOOL: /* a byte, as the CUDA combine takes it */
    case DT_DTYPE_U8:
        COMBINE_PLAIN(uint8_t);
        break;
    case DT_DTYPE_I8:
        COMBINE_PLAIN(int8_t);
        break;
    case DT_DTYPE_BF16:
    case DT_DTYPE_F16:
        for (int64_t i = 0; i < c->n; i++) {
            float v = half_load(c, 0, i);
            for (int s = 1; s < c->nsrc; s++) {
                float w = half_load(c, s, i);
                v = COMBINE_STEP(c->op, v, w);
            }
            if (c->by > 1)
                v = v / (float)c->by;
            for (int d = 0; d < c->ndst; d++)
                half_store(c, d, i, v);
        }
        break;
    default:
        break;
    }
}
