/* Shared-memory phases: the local devices of one client exchange through host memory, each
 * device's worker thread doing its share (a chunk of a reduction, its own receive buffer).
 * bf16 and f16 reduce in f32: loaded exactly, combined in f32 and rounded once per combine (a
 * combine of every local member is one rounding; a ring across clients rounds per step). */
#include "coll_internal.h"
#include "convert.h"

#include <math.h>
#include <string.h>

/* ---- element kernels, one per (dtype, op) ------------------------------------------------ */

/* max and min as numpy's: a NaN on any member survives the reduction (b is taken when a is
 * not larger, so a NaN b wins; a NaN a wins by the test). Integers cannot be NaN. */
#define DT__ISNAN(a) \
    _Generic((a), float : isnan((double)(a)), double : isnan((double)(a)), default : 0)
#define DT__MAX(a, b) ((a) > (b) || DT__ISNAN(a) ? (a) : (b))
#define DT__MIN(a, b) ((a) < (b) || DT__ISNAN(a) ? (a) : (b))

/* The loop macros use elem_t, a typedef each kernel makes of its element type. Loops run in
 * blocks of DT__VB elements: a loop of constant trip count is vectorized at -O2
 * (gcc's "very cheap" cost model skips loops that would need a scalar epilogue), so every
 * kernel below is a vector loop plus a scalar tail. */
#define DT__VB 16

/* acc[i] = acc[i] OP src[i], blocked. */
#define DT__REDUCE_LOOP(EXPR)                      \
    do {                                           \
        size_t i = 0;                              \
        for (; i + DT__VB <= n; i += DT__VB)       \
            for (int k = 0; k < DT__VB; k++) {     \
                elem_t a = x[i + k], b = y[i + k]; \
                x[i + k] = (EXPR);                 \
            }                                      \
        for (; i < n; i++) {                       \
            elem_t a = x[i], b = y[i];             \
            x[i] = (EXPR);                         \
        }                                          \
    } while (0)

/* dst[d][i] = (s0[i] OP s1[i]) / by for every d, blocked through a register-sized block, so a
 * dst may alias s0 or s1 (in-place all-reduce): a block is read before it is written. One pass
 * over memory: read both sources once, write each destination once. */
#define DT__FUSE_LOOP(EXPR)                                                \
    do {                                                                   \
        for (size_t i = 0; i < n; i += DT__VB) {                           \
            elem_t v[DT__VB];                                              \
            if (n - i >= DT__VB) {                                         \
                for (int k = 0; k < DT__VB; k++) {                         \
                    elem_t a = s0[i + k], b = s1[i + k];                   \
                    v[k] = (EXPR);                                         \
                }                                                          \
                if (by > 1)                                                \
                    for (int k = 0; k < DT__VB; k++)                       \
                        v[k] /= (elem_t)by;                                \
                for (int d = 0; d < nd; d++)                               \
                    memcpy((elem_t *)dst[d] + i, v, sizeof v);             \
            } else {                                                       \
                size_t len = n - i;                                        \
                for (size_t k = 0; k < len; k++) {                         \
                    elem_t a = s0[i + k], b = s1[i + k];                   \
                    v[k] = (EXPR);                                         \
                    if (by > 1)                                            \
                        v[k] /= (elem_t)by;                                \
                }                                                          \
                for (int d = 0; d < nd; d++)                               \
                    memcpy((elem_t *)dst[d] + i, v, len * sizeof(elem_t)); \
            }                                                              \
        }                                                                  \
    } while (0)

#define DT__OP_SWITCH(LOOP)  \
    switch (op) {            \
    case DT_REDUCE_SUM:      \
    case DT_REDUCE_MEAN:     \
        LOOP(DT__ADD(a, b)); \
        break;               \
    case DT_REDUCE_MAX:      \
        LOOP(DT__MAX(a, b)); \
        break;               \
    case DT_REDUCE_MIN:      \
        LOOP(DT__MIN(a, b)); \
        break;               \
    case DT_REDUCE_PROD:     \
        LOOP(DT__MUL(a, b)); \
        break;               \
    default:                 \
        break;               \
    }

#define DEF_KERNELS(NAME, name, ctype)                                                     \
    static void reduce_##name(dt_reduce_op op, void *acc, const void *src, size_t n)       \
    {                                                                                      \
        typedef ctype elem_t;                                                              \
        elem_t *restrict x = acc;                                                          \
        const elem_t *restrict y = src;                                                    \
        DT__OP_SWITCH(DT__REDUCE_LOOP)                                                     \
    }                                                                                      \
    static void fuse2_##name(dt_reduce_op op, void *const dst[], int nd, const void *src0, \
                             const void *src1, size_t n, int by)                           \
    {                                                                                      \
        typedef ctype elem_t;                                                              \
        const elem_t *s0 = src0, *s1 = src1;                                               \
        DT__OP_SWITCH(DT__FUSE_LOOP)                                                       \
    }                                                                                      \
    static void divide_##name(void *acc, size_t n, int by)                                 \
    {                                                                                      \
        ctype *x = acc;                                                                    \
        for (size_t i = 0; i < n; i++)                                                     \
            x[i] /= (ctype)by;                                                             \
    }
/* The dtypes stored as they compute (every one but bf16 and f16). */
#define PLAIN_DTYPES(X)       \
    X(F32, f32, float)        \
    X(F64, f64, double)       \
    X(I32, i32, int32_t)      \
    X(I64, i64, int64_t)      \
    X(BOOL, boolean, uint8_t) \
    X(U8, u8, uint8_t)        \
    X(I8, i8, int8_t)
PLAIN_DTYPES(DEF_KERNELS)
#undef DEF_KERNELS

/* The 16-bit floats: the same loops in f32, each result rounded. */
#define DT__HALF_OP(op, a, b)                 \
    ((op) == DT_REDUCE_MAX    ? DT__MAX(a, b) \
     : (op) == DT_REDUCE_MIN  ? DT__MIN(a, b) \
     : (op) == DT_REDUCE_PROD ? (a) * (b)     \
                              : (a) + (b))
#define DEF_HALF(name, LOAD, STORE)                                                        \
    static void reduce_##name(dt_reduce_op op, void *acc, const void *src, size_t n)       \
    {                                                                                      \
        uint16_t *x = acc;                                                                 \
        const uint16_t *y = src;                                                           \
        for (size_t i = 0; i < n; i++)                                                     \
            x[i] = STORE(DT__HALF_OP(op, LOAD(x[i]), LOAD(y[i])));                         \
    }                                                                                      \
    static void fuse2_##name(dt_reduce_op op, void *const dst[], int nd, const void *src0, \
                             const void *src1, size_t n, int by)                           \
    {                                                                                      \
        const uint16_t *s0 = src0, *s1 = src1;                                             \
        for (size_t i = 0; i < n; i++) {                                                   \
            float v = DT__HALF_OP(op, LOAD(s0[i]), LOAD(s1[i]));                           \
            uint16_t h = STORE(by > 1 ? v / (float)by : v);                                \
            for (int d = 0; d < nd; d++)                                                   \
                ((uint16_t *)dst[d])[i] = h;                                               \
        }                                                                                  \
    }                                                                                      \
    static void divide_##name(void *acc, size_t n, int by)                                 \
    {                                                                                      \
        uint16_t *x = acc;                                                                 \
        for (size_t i = 0; i < n; i++)                                                     \
            x[i] = STORE(LOAD(x[i]) / (float)by);                                          \
    }                                                                                      \
    /* dst[d][i] = (op over s of src[s][i]) / by, in f32, rounded once */                  \
    static void combine_##name(dt_reduce_op op, void *const dst[], int nd,                 \
                               const void *const src[], int ns, size_t n, int by)          \
    {                                                                                      \
        float t[1024];                                                                     \
        for (size_t o = 0; o < n; o += 1024) {                                             \
            size_t len = n - o < 1024 ? n - o : 1024;                                      \
            const uint16_t *s0 = (const uint16_t *)src[0] + o;                             \
            for (size_t i = 0; i < len; i++)                                               \
                t[i] = LOAD(s0[i]);                                                        \
            for (int s = 1; s < ns; s++) {                                                 \
                const uint16_t *y = (const uint16_t *)src[s] + o;                          \
                for (size_t i = 0; i < len; i++)                                           \
                    t[i] = DT__HALF_OP(op, t[i], LOAD(y[i]));                              \
            }                                                                              \
            for (size_t i = 0; by > 1 && i < len; i++)                                     \
                t[i] /= (float)by;                                                         \
            for (int d = 0; d < nd; d++)                                                   \
                for (size_t i = 0; i < len; i++)                                           \
                    ((uint16_t *)dst[d])[o + i] = STORE(t[i]);                             \
        }                                                                                  \
    }
DEF_HALF(bf16, dt__bf16_to_f32, dt__f32_to_bf16)
DEF_HALF(f16, dt__f16_to_f32, dt__f32_to_f16)
#define HALF_DTYPES(X) X(BF16, bf16) X(F16, f16)

#define CASE_HALF(NAME, name) CASE(NAME, name, uint16_t)

void dt__coll_reduce(dt_dtype t, dt_reduce_op op, void *acc, const void *src, size_t n)
{
    switch (t) {
#define CASE(NAME, name, ctype)         \
    case DT_DTYPE_##NAME:               \
        reduce_##name(op, acc, src, n); \
        break;
        PLAIN_DTYPES(CASE)
        HALF_DTYPES(CASE_HALF)
#undef CASE
    default:
        break;
    }
}

static void fuse2(dt_dtype t, dt_reduce_op op, void *const dst[], int nd, const void *s0,
                  const void *s1, size_t n, int by)
{
    switch (t) {
#define CASE(NAME, name, ctype)                   \
    case DT_DTYPE_##NAME:                         \
        fuse2_##name(op, dst, nd, s0, s1, n, by); \
        break;
        PLAIN_DTYPES(CASE)
        HALF_DTYPES(CASE_HALF)
#undef CASE
    default:
        break;
    }
}

void dt__coll_divide(dt_dtype t, void *acc, size_t n, int by)
{
    switch (t) {
#define CASE(NAME, name, ctype)    \
    case DT_DTYPE_##NAME:          \
        divide_##name(acc, n, by); \
        break;
        PLAIN_DTYPES(CASE)
        HALF_DTYPES(CASE_HALF)
#undef CASE
    default:
        break;
    }
}

/* ---- tile combine ------------------------------------------------------------------------- */

/* dst[d][off..off+n) = reduce over s of src[s][off..off+n), divided by `by` when by > 1, for
 * every d. Works through an L1-sized tile, so a dst may alias a src (in-place all-reduce):
 * every read of a tile precedes every write of it. */
static void combine(const dt__coll_req *r, void *const dst[], int nd, const void *const src[],
                    int ns, size_t off, size_t n, int by)
{
    size_t es = r->es;
    if (n == 0 || nd == 0)
        return;
    if (r->c.dtype == DT_DTYPE_BF16 || r->c.dtype == DT_DTYPE_F16) {
        const void *s[ns];
        void *d[nd];
        for (int i = 0; i < ns; i++)
            s[i] = (const char *)src[i] + off * es;
        for (int i = 0; i < nd; i++)
            d[i] = (char *)dst[i] + off * es;
        if (r->c.dtype == DT_DTYPE_BF16)
            combine_bf16(r->c.op, d, nd, s, ns, n, by);
        else
            combine_f16(r->c.op, d, nd, s, ns, n, by);
        return;
    }
    if (ns == 1 && by <= 1) {
        const char *s = (const char *)src[0] + off * es;
        for (int d = 0; d < nd; d++)
            if ((char *)dst[d] + off * es != s)
                memcpy((char *)dst[d] + off * es, s, n * es);
        return;
    }
    if (ns == 2) {
        void *d[nd];
        for (int i = 0; i < nd; i++)
            d[i] = (char *)dst[i] + off * es;
        fuse2(r->c.dtype, r->c.op, d, nd, (const char *)src[0] + off * es,
              (const char *)src[1] + off * es, n, by);
        return;
    }
    _Alignas(64) unsigned char tmp[16384];
    size_t tile = sizeof tmp / es;
    for (size_t o = off; o < off + n; o += tile) {
        size_t len = off + n - o < tile ? off + n - o : tile;
        memcpy(tmp, (const char *)src[0] + o * es, len * es);
        for (int s = 1; s < ns; s++)
            dt__coll_reduce(r->c.dtype, r->c.op, tmp, (const char *)src[s] + o * es, len);
        if (by > 1)
            dt__coll_divide(r->c.dtype, tmp, len, by);
        for (int d = 0; d < nd; d++)
            memcpy((char *)dst[d] + o * es, tmp, len * es);
    }
}

/* Chunk j of n over k workers, in whole cache lines. */
static void chunk(size_t n, int k, int j, size_t es, size_t *off, size_t *len)
{
    size_t line = es >= 64 ? 1 : 64 / es;
    size_t per = (n + (size_t)k - 1) / (size_t)k;
    per = (per + line - 1) / line * line;
    size_t a = per * (size_t)j, b = a + per;
    if (a > n)
        a = n;
    if (b > n)
        b = n;
    *off = a;
    *len = b - a;
}

static bool use_mean(const dt__coll_req *r)
{
    return r->c.op == DT_REDUCE_MEAN &&
           (r->c.kind == DT__COLL_ALL_REDUCE || r->c.kind == DT__COLL_REDUCE_SCATTER);
}

/* Where local device i is: its group call and its position j among the group's locals. */
static dt__gcall *locate(const dt__coll_req *r, int i, int *j)
{
    dt__gcall *gc = &r->gc[r->mask->group_of[i]];
    for (int p = 0; p < gc->g->num_local; p++)
        if (gc->g->local[p] == i) {
            *j = p;
            return gc;
        }
    *j = 0;
    return gc;
}

/* Local device i (member j of a group inside this client) pulls box s of every member s's
 * send buffer into its recv buffer: the exchange with no packing on either side. */
static void pull_boxes(const dt__coll_req *r, const dt__gcall *gc, int i, int j, int G)
{
    for (int s = 0; s < G; s++) {
        const dt__block *b = &r->c.boxes[i][s]; /* an empty box copies nothing */
        dt__copy_block((char *)gc->recv[j] + b->dst_at * (int64_t)r->es, b->dst_shape, b->dst_off,
                       (const char *)gc->send[s] + b->src_at * (int64_t)r->es, b->src_shape,
                       b->src_off, b->extent, b->rank, r->es);
    }
}

static void pre_task(dt__device *dev, int i, void *arg)
{
    (void)dev;
    dt__coll_req *r = arg;
    int j;
    dt__gcall *gc = locate(r, i, &j);
    const dt__cgroup *g = gc->g;
    int k = g->num_local, G = r->mask->size, rank = g->first_rank + j;
    bool spans = g->num_clients > 1;
    size_t es = r->es, off, len;
    int by = use_mean(r) && !spans ? G : 1;
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE:
        if (spans && k == 1)
            return;
        if (!spans && r->algorithm == DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE) {
            /* One device reduces everything, the others only receive. */
            if (j == 0)
                combine(r, gc->recv, k, (const void *const *)gc->send, k, 0, (size_t)r->c.count,
                        by);
            return;
        }
        chunk((size_t)r->c.count, k, j, es, &off, &len);
        if (spans) /* local partial into the first local member, then across clients */
            combine(r, gc->recv, 1, (const void *const *)gc->send, k, off, len, 1);
        else
            combine(r, gc->recv, k, (const void *const *)gc->send, k, off, len, by);
        return;
    case DT__COLL_ALL_GATHER: {
        int64_t n = dt__gc_block(r, gc, rank, 0);
        if (!spans && r->c.boxes) {
            pull_boxes(r, gc, i, j, G);
        } else if (!spans) {
            for (int s = 0; s < k; s++) {
                char *dst = (char *)gc->recv[j] + dt__gc_block_off(r, gc, s) * es;
                int64_t m = dt__gc_block(r, gc, s, 0);
                if (m && dst != gc->send[s])
                    memcpy(dst, gc->send[s], (size_t)m * es);
            }
        } else if (k > 1 || gc->mode == DT__X_RING) {
            char *dst = (char *)gc->recv[0] + dt__gc_block_off(r, gc, rank) * es;
            if (n && dst != gc->send[j])
                memcpy(dst, gc->send[j], (size_t)n * es);
        }
        return;
    }
    case DT__COLL_REDUCE_SCATTER:
        if (!spans) {
            const void *src[k];
            int64_t o = dt__gc_block_off(r, gc, j);
            for (int s = 0; s < k; s++)
                src[s] = (const char *)gc->send[s] + o * es;
            void *dst[1] = {gc->recv[j]};
            combine(r, dst, 1, src, k, 0, (size_t)dt__gc_block(r, gc, j, 0), by);
        } else if (k > 1) {
            chunk((size_t)gc->total, k, j, es, &off, &len);
            void *dst[1] = {gc->stage};
            combine(r, dst, 1, (const void *const *)gc->send, k, off, len, 1);
        }
        return;
    case DT__COLL_ALL_TO_ALL: {
        if (!spans && r->c.boxes) {
            pull_boxes(r, gc, i, j, G);
        } else if (!spans) {
            /* pull: block s of my recv is block `rank` of member s's send */
            char *dst = gc->recv[j];
            for (int s = 0; s < G; s++) {
                int64_t so = 0;
                for (int t = 0; t < rank; t++)
                    so += dt__gc_block(r, gc, s, t);
                int64_t m = dt__gc_block(r, gc, s, rank);
                if (m)
                    memcpy(dst, (const char *)gc->send[s] + so * es, (size_t)m * es);
                dst += m * (int64_t)es;
            }
        } else if (k > 1) {
            /* pack my blocks for each client c at its place in the staging buffer: client c's
             * part holds, for each local sender in order, its blocks for c's members */
            int nc = g->num_clients;
            char *p = gc->stage;
            const char *s0 = gc->send[j];
            for (int c = 0; c < nc; c++) {
                for (int s = 0; s < k; s++) {
                    int64_t m = 0, so = 0;
                    for (int t = 0; t < g->rank_first[c]; t++)
                        so += dt__gc_block(r, gc, g->first_rank + s, t);
                    for (int t = g->rank_first[c]; t < g->rank_first[c + 1]; t++)
                        m += dt__gc_block(r, gc, g->first_rank + s, t);
                    if (s == j && m)
                        memcpy(p, s0 + so * es, (size_t)m * es);
                    p += m * (int64_t)es;
                }
            }
        }
        return;
    }
    case DT__COLL_BROADCAST:
        if (!spans) {
            const void *src = gc->send[r->c.root];
            if (r->c.count && gc->recv[j] != src)
                memcpy(gc->recv[j], src, (size_t)r->c.count * es);
        }
        return;
    default:
        return;
    }
}

static void post_task(dt__device *dev, int i, void *arg)
{
    (void)dev;
    dt__coll_req *r = arg;
    int j;
    dt__gcall *gc = locate(r, i, &j);
    const dt__cgroup *g = gc->g;
    if (g->num_clients < 2)
        return;
    int k = g->num_local, G = r->mask->size, rank = g->first_rank + j;
    size_t es = r->es, off, len;
    int by = use_mean(r) ? G : 1;
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE: {
        /* chunk j: divide (mean) and copy the first member's result to every local member */
        chunk((size_t)r->c.count, k, j, es, &off, &len);
        const void *src[1] = {gc->recv[0]};
        combine(r, gc->recv, k, src, 1, off, len, by);
        return;
    }
    case DT__COLL_ALL_GATHER:
        if (j > 0 && gc->total)
            memcpy(gc->recv[j], gc->recv[0], (size_t)gc->total * es);
        return;
    case DT__COLL_REDUCE_SCATTER: {
        const void *src[1] = {
            gc->seg_out +
            (dt__gc_block_off(r, gc, rank) - dt__gc_block_off(r, gc, g->first_rank)) * es};
        void *dst[1] = {gc->recv[j]};
        combine(r, dst, 1, src, 1, 0, (size_t)dt__gc_block(r, gc, rank, 0), by);
        return;
    }
    case DT__COLL_ALL_TO_ALL: {
        if (k == 1)
            return;
        /* unpack: from client c come, for each of its members s, blocks for my local members
         * in order; block s of my recv is the one for me */
        const char *p = gc->xout; /* the receive half of the staging buffer */
        char *dst = gc->recv[j];
        for (int c = 0; c < g->num_clients; c++)
            for (int s = g->rank_first[c]; s < g->rank_first[c + 1]; s++)
                for (int t = 0; t < k; t++) {
                    int64_t m = dt__gc_block(r, gc, s, g->first_rank + t);
                    if (t == j && m)
                        memcpy(dst, p, (size_t)m * es);
                    if (t == j)
                        dst += m * (int64_t)es;
                    p += m * (int64_t)es;
                }
        return;
    }
    case DT__COLL_BROADCAST: {
        int rc = g->my_pos;
        bool root_here = r->c.root >= g->rank_first[rc] && r->c.root < g->rank_first[rc + 1];
        const void *src =
            root_here ? gc->send[r->c.root - g->first_rank] : (const void *)gc->recv[0];
        if (r->c.count && gc->recv[j] != src)
            memcpy(gc->recv[j], src, (size_t)r->c.count * es);
        return;
    }
    default:
        return;
    }
}

static void run(dt__coll_req *r, dt__task_fn fn)
{
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    int n = r->m->num_local;
    if (r->parallel && n > 1) {
        dt__devices_run_here(devs, n, fn, r);
        return;
    }
    for (int i = 0; i < n; i++)
        fn(devs[i], i, r);
}

void dt__coll_local_pre(dt__coll_req *r)
{
    run(r, pre_task);
}

void dt__coll_local_post(dt__coll_req *r)
{
    run(r, post_task);
}
