/* Relayout: plan the minimal transition per mesh axis, cost it, emit it.
 *
 * Per mesh axis a (ARCHITECTURE.md "Expansion rules"):
 *   partial(a) -> replicated        all-reduce (partial axes going the same way are fused)
 *   partial(a) -> shard(i)          reduce-scatter
 *   shard(i)   -> replicated        all-gather
 *   shard(i)   -> shard(j)          all-to-all
 *   replicated -> shard(j)          local slice, no communication
 *   replicated -> partial(a)        local: member 0 keeps the value, the others the identity
 * Uneven shards use the collectives' v forms with per-device counts computed here from the
 * layouts, the same on every member of a group. The block exchange between unrelated layouts
 * is spmd/exchange.c; the layout search of the op rules, spmd/search.c. */
#include "relayout.h"
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- planning ----------------------------------------------------------------------------- */

int64_t dt__max_local_elems(const dt_layout *l, int rank, const int64_t shape[])
{
    /* The first shard of every axis is the largest. */
    int64_t e = 1;
    for (int i = 0; i < rank; i++)
        e *= dt_shard_size(shape[i], dt_layout_num_shards(l, i), 0);
    return e;
}

static int group_size(const dt_mesh *m, unsigned axes)
{
    int g = 1;
    for (int a = 0; a < m->num_axes; a++)
        if (axes & (1u << a))
            g *= m->sizes[a];
    return g;
}

/* Bytes the busiest device sends, and messages, for one transition. */
static void trans_volume(const dt__trans *t, dt_dtype dtype, int rank, const int64_t shape[],
                         double *bytes, double *msgs, double *local)
{
    const dt_mesh *m = t->before.mesh;
    int g = group_size(m, t->axes);
    double es = (double)dt_dtype_size(dtype);
    double bin = (double)dt__max_local_elems(&t->before, rank, shape) * es;
    double bout = (double)dt__max_local_elems(&t->after, rank, shape) * es;
    *bytes = *msgs = *local = 0;
    switch (t->kind) {
    case DT__T_ALL_REDUCE:
        *bytes = g > 1 ? 2.0 * (g - 1) / g * bin : 0;
        *msgs = 2.0 * (g - 1);
        break;
    case DT__T_REDUCE_SCATTER:
        *bytes = (double)(g - 1) / g * bin;
        *msgs = g - 1;
        break;
    case DT__T_ALL_GATHER:
        *bytes = (double)(g - 1) * bin;
        *msgs = g - 1;
        break;
    case DT__T_ALL_TO_ALL:
        *bytes = (double)(g - 1) / g * bin;
        *msgs = g - 1;
        break;
    case DT__T_SLICE:
    case DT__T_TO_PARTIAL:
        *local = bout;
        break;
    }
}

static dt_status push(dt__plan *plan, dt__trans_kind kind, unsigned axes, int from, int to,
                      dt_layout *cur, const dt_layout *after)
{
    if (plan->n == (int)(sizeof plan->t / sizeof plan->t[0]))
        return dt__fail(DT_ERR_LAYOUT, "relayout: plan longer than %d transitions", plan->n);
    dt__trans *t = &plan->t[plan->n++];
    t->kind = kind;
    t->axes = axes;
    t->from = from;
    t->to = to;
    t->before = *cur;
    t->after = *after;
    *cur = *after;
    return DT_OK;
}

static int axis_of(const dt_layout *l, int mesh_axis)
{
    for (int i = 0; i < l->rank; i++)
        if (l->axes[i] == mesh_axis)
            return i;
    return -1;
}

dt_status dt__plan_make(const dt_layout *from, const dt_layout *to, dt_dtype dtype, int rank,
                        const int64_t shape[], dt__plan *plan)
{
    plan->n = 0;
    plan->cost = 0;
    if (from->mesh != to->mesh || from->rank != to->rank || from->rank != rank) {
        char a[DT_STRING_MAX], b[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT,
                        "relayout: \"%s\" and \"%s\" are not layouts of one mesh and rank %d",
                        dt__layout_str(from, a, sizeof a), dt__layout_str(to, b, sizeof b), rank);
    }
    const dt_mesh *m = from->mesh;
    dt_layout cur = *from;

    /* 1. Pending partial terms: keep, reduce-scatter into a wanted shard, or all-reduce. */
    unsigned reduce_all = 0;
    for (int a = 0; a < m->num_axes; a++) {
        unsigned bit = 1u << a;
        if (!(cur.partial & bit))
            continue;
        if ((to->partial & bit) && to->partial_op == cur.partial_op)
            continue;
        int j = axis_of(to, a);
        /* a tensor axis on a mesh axis of size 1 is whole on every device: as free to take
         * the reduce-scatter as an unsharded one (e.g. a fully sharded gradient's sequence
         * axis on a size-1 "model" axis) */
        if (j >= 0 && (cur.axes[j] == DT_UNSHARDED || m->sizes[cur.axes[j]] == 1) &&
            (cur.partial_op == DT_REDUCE_SUM || cur.partial_op == DT_REDUCE_MAX ||
             cur.partial_op == DT_REDUCE_MIN || cur.partial_op == DT_REDUCE_PROD)) {
            dt_layout next = cur;
            next.partial &= ~bit;
            next.axes[j] = a;
            DT_TRY(push(plan, DT__T_REDUCE_SCATTER, bit, -1, j, &cur, &next));
        } else {
            reduce_all |= bit;
        }
    }
    if (reduce_all) {
        dt_layout next = cur;
        next.partial &= ~reduce_all;
        /* The partial op stays for the axes still pending. */
        DT_TRY(push(plan, DT__T_ALL_REDUCE, reduce_all, -1, -1, &cur, &next));
    }

    /* 2. Sharded axes in the wrong place: all-to-all where the target is free, all-gather
     * where the axis is not wanted; a cycle is broken by one all-gather. */
    for (;;) {
        bool pending = false, progress = false;
        for (int i = 0; i < rank; i++) {
            int a = cur.axes[i];
            if (a == DT_UNSHARDED || to->axes[i] == a)
                continue;
            pending = true;
            int j = axis_of(to, a);
            dt_layout next = cur;
            next.axes[i] = DT_UNSHARDED;
            if (j < 0) {
                DT_TRY(push(plan, DT__T_ALL_GATHER, 1u << a, i, -1, &cur, &next));
                progress = true;
            } else if (cur.axes[j] == DT_UNSHARDED) {
                next.axes[j] = a;
                DT_TRY(push(plan, DT__T_ALL_TO_ALL, 1u << a, i, j, &cur, &next));
                progress = true;
            }
        }
        if (!pending)
            break;
        if (!progress)
            for (int i = 0; i < rank; i++) {
                int a = cur.axes[i];
                if (a != DT_UNSHARDED && to->axes[i] != a) {
                    dt_layout next = cur;
                    next.axes[i] = DT_UNSHARDED;
                    DT_TRY(push(plan, DT__T_ALL_GATHER, 1u << a, i, -1, &cur, &next));
                    break;
                }
            }
    }

    /* 3. Replicated -> sharded: local slices. */
    for (int j = 0; j < rank; j++)
        if (to->axes[j] != DT_UNSHARDED && cur.axes[j] == DT_UNSHARDED) {
            dt_layout next = cur;
            next.axes[j] = to->axes[j];
            DT_TRY(push(plan, DT__T_SLICE, 1u << to->axes[j], -1, j, &cur, &next));
        }

    /* 4. Replicated -> partial. */
    for (int a = 0; a < m->num_axes; a++) {
        unsigned bit = 1u << a;
        if ((to->partial & bit) && !(cur.partial & bit)) {
            dt_layout next = cur;
            next.partial |= bit;
            next.partial_op = to->partial_op;
            DT_TRY(push(plan, DT__T_TO_PARTIAL, bit, -1, -1, &cur, &next));
        }
    }
    if (!dt_layout_equal(&cur, to)) {
        char a[DT_STRING_MAX], b[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT, "relayout: cannot go from \"%s\" to \"%s\"",
                        dt__layout_str(from, a, sizeof a), dt__layout_str(to, b, sizeof b));
    }
    for (int i = 0; i < plan->n; i++) {
        double bytes, msgs, local;
        trans_volume(&plan->t[i], dtype, rank, shape, &bytes, &msgs, &local);
        plan->cost += DT__ALPHA * msgs + DT__BETA * bytes + DT__BETA_LOCAL * local;
    }
    return DT_OK;
}

double dt__relayout_cost(const dt_layout *from, const dt_layout *to, dt_dtype dtype, int rank,
                         const int64_t shape[])
{
    if (dt_layout_equal(from, to))
        return 0;
    dt__plan plan;
    if (dt__plan_make(from, to, dtype, rank, shape, &plan) != DT_OK)
        return INFINITY;
    return plan.cost;
}

/* ---- emission ----------------------------------------------------------------------------- */

/* Everything one transition's per-device callbacks need. */
typedef struct tctx {
    const dt__trans *t;
    const dt__dist *in; /* before */
    dt__dist out;       /* after */
    int g;              /* group size */
    int mesh_axis;
    bool direct; /* the collective reads / writes the shards in place (no pack/unpack) */
} tctx;

static int member(const dt_mesh *m, int a, int device, int r)
{
    return device + (r - dt__coord(m, a, device)) * m->strides[a];
}

/* Does every group along mesh axis a sit inside one client, on devices the host can address?
 * Then its all-gathers and all-to-alls can move shards in place (dt__coll_boxes). The same
 * answer on every client: it depends on the mesh alone. */
static bool groups_in_client(const dt_mesh *m, int a)
{
    const dt__backend *be = dt__backend_of(m->type);
    if (!be || !be->host_accessible)
        return false;
    for (int d = 0; d < m->size; d++) {
        int cd, cs;
        dt_mesh_device_client(m, d, &cd);
        for (int r = 0; r < m->sizes[a]; r++) {
            dt_mesh_device_client(m, member(m, a, d, r), &cs);
            if (cs != cd)
                return false;
        }
    }
    return true;
}

/* Is tensor axis `axis` the outermost non-trivial axis of every device's shard of d (every
 * extent before it is 1)? Then each shard's blocks along `axis` are contiguous and a
 * collective can read or write the buffer directly, with no packing. */
static bool outermost_everywhere(const dt__dist *d, const dt_mesh *m, int axis)
{
    for (int dev = 0; dev < m->size; dev++) {
        int64_t l[DT_MAX_RANK];
        dt__local_shape(d, dev, l, NULL);
        for (int j = 0; j < axis; j++)
            if (l[j] != 1)
                return false;
    }
    return true;
}

/* -- all-gather: member s's block is its shard of axis `from`. */
static void ag_counts(void *ctx, int d, int64_t counts[])
{
    tctx *c = ctx;
    const dt_mesh *m = c->in->layout.mesh;
    for (int s = 0; s < c->g; s++)
        counts[s] = dt__local_elems(&c->in->layout, c->in->rank, c->in->shape,
                                    member(m, c->mesh_axis, d, s));
}

/* -- in place (groups inside one client): device d's box of member s's shard. All-gather:
 * s's whole shard, at s's range of axis `from` in d's result. */
static void ag_boxes(void *ctx, int d, dt__block boxes[])
{
    tctx *c = ctx;
    const dt_mesh *m = c->in->layout.mesh;
    int rank = c->in->rank, i = c->t->from;
    int64_t out_local[DT_MAX_RANK];
    dt__local_shape(&c->out, d, out_local, NULL);
    for (int s = 0; s < c->g; s++) {
        dt__block *b = &boxes[s];
        int64_t blk[DT_MAX_RANK];
        dt__local_shape(c->in, member(m, c->mesh_axis, d, s), blk, NULL);
        b->rank = rank;
        dt__copy_shape(b->src_shape, blk, rank);
        dt__copy_shape(b->extent, blk, rank);
        dt__copy_shape(b->dst_shape, out_local, rank);
        b->dst_off[i] = dt_shard_offset(c->in->shape[i], c->g, s);
    }
}

static void ag_unpack(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    int rank = c->in->rank;
    int64_t out_local[DT_MAX_RANK];
    dt__local_shape(&c->out, d, out_local, NULL);
    k->rank = rank;
    dt__copy_shape(k->shape, out_local, rank);
    k->nblocks = c->g;
    k->blocks = calloc((size_t)c->g, sizeof *k->blocks);
    if (!k->blocks)
        return;
    /* the boxes of the members' shards, found one after another in the gathered buffer */
    ag_boxes(ctx, d, k->blocks);
    int64_t at = 0;
    for (int s = 0; s < c->g; s++) {
        k->blocks[s].src_at = at;
        at += dt__num_elements(rank, k->blocks[s].extent);
    }
}

dt__block *dt__one_block(dt__kargs *k, int rank, const int64_t in_local[],
                         const int64_t out_local[])
{
    k->rank = rank;
    dt__copy_shape(k->shape, out_local, rank);
    k->blocks = calloc(1, sizeof *k->blocks);
    if (!k->blocks)
        return NULL;
    k->nblocks = 1;
    dt__block *b = k->blocks;
    b->rank = rank;
    dt__copy_shape(b->src_shape, in_local, rank);
    dt__copy_shape(b->dst_shape, out_local, rank);
    dt__copy_shape(b->extent, out_local, rank);
    return b;
}

/* -- local slice: the shard of axis `to` from a local copy holding the whole axis. */
static void slice_args(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    int rank = c->in->rank, j = c->t->to;
    int64_t in_local[DT_MAX_RANK], out_local[DT_MAX_RANK];
    dt__local_shape(c->in, d, in_local, NULL);
    dt__local_shape(&c->out, d, out_local, NULL);
    dt__block *b = dt__one_block(k, rank, in_local, out_local);
    if (!b)
        return;
    b->src_off[j] =
        dt_shard_offset(c->in->shape[j], c->g, dt__coord(c->in->layout.mesh, c->mesh_axis, d));
}

/* -- all-to-all: member r sends member s the part of its shard in s's range of axis `to`. */
static void a2a_counts(void *ctx, int d, int64_t counts[])
{
    tctx *c = ctx;
    int rank = c->in->rank, i = c->t->from, j = c->t->to, g = c->g;
    int64_t local[DT_MAX_RANK];
    dt__local_shape(c->in, d, local, NULL);
    int64_t other = 1;
    for (int q = 0; q < rank; q++)
        if (q != i && q != j)
            other *= local[q];
    for (int s = 0; s < g; s++)
        for (int r = 0; r < g; r++)
            counts[s * g + r] =
                other * dt_shard_size(c->in->shape[i], g, s) * dt_shard_size(c->in->shape[j], g, r);
}

static void a2a_pack(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    int rank = c->in->rank, j = c->t->to, g = c->g;
    int64_t local[DT_MAX_RANK];
    dt__local_shape(c->in, d, local, NULL);
    k->rank = 1;
    k->shape[0] = dt__num_elements(rank, local);
    k->nblocks = g;
    k->blocks = calloc((size_t)g, sizeof *k->blocks);
    int64_t at = 0;
    for (int s = 0; s < g && k->blocks; s++) {
        dt__block *b = &k->blocks[s];
        b->rank = rank;
        dt__copy_shape(b->src_shape, local, rank);
        dt__copy_shape(b->extent, local, rank);
        b->extent[j] = dt_shard_size(c->in->shape[j], g, s);
        b->src_off[j] = dt_shard_offset(c->in->shape[j], g, s);
        dt__copy_shape(b->dst_shape, b->extent, rank);
        b->dst_at = at;
        at += dt__num_elements(rank, b->extent);
    }
}

static void a2a_unpack(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    int rank = c->in->rank, i = c->t->from, g = c->g;
    int64_t out_local[DT_MAX_RANK];
    dt__local_shape(&c->out, d, out_local, NULL);
    k->rank = rank;
    dt__copy_shape(k->shape, out_local, rank);
    k->nblocks = g;
    k->blocks = calloc((size_t)g, sizeof *k->blocks);
    int64_t at = 0;
    for (int s = 0; s < g && k->blocks; s++) {
        dt__block *b = &k->blocks[s];
        b->rank = rank;
        dt__copy_shape(b->src_shape, out_local, rank);
        b->src_shape[i] = dt_shard_size(c->in->shape[i], g, s);
        dt__copy_shape(b->extent, b->src_shape, rank);
        dt__copy_shape(b->dst_shape, out_local, rank);
        b->dst_off[i] = dt_shard_offset(c->in->shape[i], g, s);
        b->src_at = at;
        at += dt__num_elements(rank, b->extent);
    }
}

/* -- in place (groups inside one client), all-to-all: device d's box of member s's shard is
 * the part in d's range of axis `to`, at s's range of axis `from` in d's result. */
static void a2a_boxes(void *ctx, int d, dt__block boxes[])
{
    tctx *c = ctx;
    const dt_mesh *m = c->in->layout.mesh;
    int rank = c->in->rank, i = c->t->from, j = c->t->to, g = c->g;
    int me = dt__coord(m, c->mesh_axis, d);
    int64_t out_local[DT_MAX_RANK];
    dt__local_shape(&c->out, d, out_local, NULL);
    for (int s = 0; s < g; s++) {
        dt__block *b = &boxes[s];
        int64_t local[DT_MAX_RANK];
        dt__local_shape(c->in, member(m, c->mesh_axis, d, s), local, NULL);
        b->rank = rank;
        dt__copy_shape(b->src_shape, local, rank);
        dt__copy_shape(b->extent, local, rank);
        b->extent[j] = dt_shard_size(c->in->shape[j], g, me);
        b->src_off[j] = dt_shard_offset(c->in->shape[j], g, me);
        dt__copy_shape(b->dst_shape, out_local, rank);
        b->dst_off[i] = dt_shard_offset(c->in->shape[i], g, s);
    }
}

/* -- reduce-scatter: block s of the send buffer is the range of axis `to` member s keeps
 * (packed by a2a_pack). */
static void rs_counts(void *ctx, int d, int64_t counts[])
{
    tctx *c = ctx;
    const dt_mesh *m = c->in->layout.mesh;
    for (int s = 0; s < c->g; s++)
        counts[s] = dt__local_elems(&c->out.layout, c->out.rank, c->out.shape,
                                    member(m, c->mesh_axis, d, s));
}

/* -- all-reduce of shards that differ in size across groups: a padded copy. */
static void pad_args(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    int64_t e = dt__local_elems(&c->in->layout, c->in->rank, c->in->shape, d);
    k->rank = 1;
    k->shape[0] = e;
    k->nblocks = 1;
    k->blocks = calloc(1, sizeof *k->blocks);
    if (!k->blocks)
        return;
    k->blocks->rank = 1;
    k->blocks->src_shape[0] = k->blocks->dst_shape[0] = k->blocks->extent[0] = e;
}

/* -- to partial: member 0 of each group keeps the value, the others the identity. */
static void partial_args(void *ctx, int d, dt__kargs *k)
{
    tctx *c = ctx;
    const dt_mesh *m = c->in->layout.mesh;
    int64_t local[DT_MAX_RANK];
    dt__local_shape(c->in, d, local, NULL);
    k->rank = c->in->rank;
    dt__copy_shape(k->shape, local, k->rank);
    bool first = true;
    for (int a = 0; a < m->num_axes; a++)
        if ((c->t->axes & (1u << a)) && dt__coord(m, a, d) != 0)
            first = false;
    dt_reduce_op op = c->out.layout.partial_op;
    k->select = first || op == DT_REDUCE_MAX || op == DT_REDUCE_MIN;
    k->a = op == DT_REDUCE_PROD ? 1.0 : 0.0;
}

static bool counts_even(const dt_mesh *m, dt__counts_fn fn, void *ctx, int n, int64_t *count)
{
    int64_t *buf = calloc((size_t)n + 1, sizeof *buf);
    bool even = buf != NULL;
    *count = -1;
    for (int d = 0; even && d < m->size; d++) {
        fn(ctx, d, buf);
        for (int q = 0; q < n && even; q++) {
            if (*count < 0)
                *count = buf[q];
            even = buf[q] == *count;
        }
    }
    free(buf);
    if (*count < 0)
        *count = 0;
    return even;
}

static void shape_of_max(char *buf, size_t size, const dt__dist *x)
{
    int64_t local[DT_MAX_RANK];
    for (int i = 0; i < x->rank; i++)
        local[i] = dt_shard_size(x->shape[i], dt_layout_num_shards(&x->layout, i), 0);
    dt__shape_str(buf, size, x->rank, local);
}

static dt_status emit_trans(dt__program *p, const char *cause, const dt__trans *t,
                            const dt__dist *in, dt__dist *out)
{
    const dt_mesh *m = in->layout.mesh;
    tctx c = {.t = t, .in = in, .g = group_size(m, t->axes)};
    if (c.g == 1) {
        /* over mesh axes of size 1 a shard is the whole axis and a partial value its one term:
         * the same data in the same slot, only the layout changes (no step, nothing moves) */
        *out = *in;
        out->layout = t->after;
        return DT_OK;
    }
    for (int a = 0; a < m->num_axes; a++)
        if (t->axes & (1u << a))
            c.mesh_axis = a;
    double bytes, msgs, local;
    trans_volume(t, in->dtype, in->rank, in->shape, &bytes, &msgs, &local);
    int rank = in->rank;
    char what[DT__SHAPE_STR_MAX + 64], sb[DT__SHAPE_STR_MAX];
    shape_of_max(sb, sizeof sb, in);
    c.out = *in;
    c.out.layout = t->after;

    switch (t->kind) {
    case DT__T_ALL_REDUCE: {
        snprintf(what, sizeof what, "local %s", sb);
        int64_t count = -1;
        bool even = true;
        for (int d = 0; d < m->size; d++) {
            int64_t e = dt__local_elems(&in->layout, rank, in->shape, d);
            even = even && (count < 0 || e == count);
            count = e > count ? e : count;
        }
        if (even) {
            DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
            return dt__emit_coll(p, cause, DT__COLL_ALL_REDUCE, in->dtype, in->layout.partial_op,
                                 t->axes, in->slot, out->slot, count, NULL, NULL, 0, bytes, what);
        }
        /* Shards differ in size between groups (uneven on another axis): all-reduce a buffer
         * padded to the largest; consumers read the leading elements. */
        int64_t *elems = calloc((size_t)m->num_local + 1, sizeof *elems);
        if (!elems)
            return dt__fail(DT_ERR_NOMEM, "relayout: out of memory");
        for (int i = 0; i < m->num_local; i++)
            elems[i] = count;
        *out = c.out;
        dt_status s = dt__slot_new_elems(p, m, in->dtype, elems, &out->slot);
        free(elems);
        DT_TRY(s);
        DT_TRY(dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, out->slot, m,
                               pad_args, &c));
        return dt__emit_coll(p, cause, DT__COLL_ALL_REDUCE, in->dtype, in->layout.partial_op,
                             t->axes, out->slot, out->slot, count, NULL, NULL, 0, bytes, what);
    }
    case DT__T_ALL_GATHER: {
        snprintf(what, sizeof what, "local %s, tensor axis %d", sb, t->from);
        int64_t count;
        bool even = counts_even(m, ag_counts, &c, c.g, &count);
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
        bool direct = outermost_everywhere(out, m, t->from);
        bool boxes = !direct && groups_in_client(m, c.mesh_axis);
        int recv = out->slot;
        if (!direct && !boxes) {
            dt__dist tmp;
            DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, &tmp));
            recv = tmp.slot;
        }
        DT_TRY(dt__emit_coll(p, cause, DT__COLL_ALL_GATHER, in->dtype, DT_REDUCE_SUM, t->axes,
                             in->slot, recv, count, even ? NULL : ag_counts, &c, c.g, bytes, what));
        if (boxes)
            return dt__coll_boxes(p, ag_boxes, &c, c.g);
        if (!direct)
            DT_TRY(dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &recv, out->slot, m,
                                   ag_unpack, &c));
        return DT_OK;
    }
    case DT__T_SLICE:
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
        return dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, out->slot, m,
                               slice_args, &c);
    case DT__T_ALL_TO_ALL: {
        snprintf(what, sizeof what, "local %s, tensor axis %d -> %d", sb, t->from, t->to);
        int64_t count;
        bool even = counts_even(m, a2a_counts, &c, c.g * c.g, &count);
        if (groups_in_client(m, c.mesh_axis)) {
            DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
            DT_TRY(dt__emit_coll(p, cause, DT__COLL_ALL_TO_ALL, in->dtype, DT_REDUCE_SUM, t->axes,
                                 in->slot, out->slot, count, even ? NULL : a2a_counts, &c,
                                 c.g * c.g, bytes, what));
            return dt__coll_boxes(p, a2a_boxes, &c, c.g);
        }
        dt__dist send, recv;
        DT_TRY(dt__slot_new(p, &t->before, in->dtype, rank, in->shape, &send));
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, &recv));
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
        DT_TRY(dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, send.slot, m,
                               a2a_pack, &c));
        DT_TRY(dt__emit_coll(p, cause, DT__COLL_ALL_TO_ALL, in->dtype, DT_REDUCE_SUM, t->axes,
                             send.slot, recv.slot, count, even ? NULL : a2a_counts, &c, c.g * c.g,
                             bytes, what));
        return dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &recv.slot, out->slot, m,
                               a2a_unpack, &c);
    }
    case DT__T_REDUCE_SCATTER: {
        snprintf(what, sizeof what, "local %s, tensor axis %d", sb, t->to);
        int64_t count;
        bool even = counts_even(m, rs_counts, &c, c.g, &count);
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
        bool direct = outermost_everywhere(in, m, t->to);
        int send = in->slot;
        if (!direct) {
            dt__dist tmp;
            DT_TRY(dt__slot_new(p, &t->before, in->dtype, rank, in->shape, &tmp));
            send = tmp.slot;
            /* the same packing as all-to-all's: block s is member s's range of axis `to` */
            DT_TRY(dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, send, m,
                                   a2a_pack, &c));
        }
        return dt__emit_coll(p, cause, DT__COLL_REDUCE_SCATTER, in->dtype, in->layout.partial_op,
                             t->axes, send, out->slot, count, even ? NULL : rs_counts, &c, c.g,
                             bytes, what);
    }
    case DT__T_TO_PARTIAL:
        DT_TRY(dt__slot_new(p, &t->after, in->dtype, rank, in->shape, out));
        return dt__emit_kernel(p, cause, DT__K_SELECT_FILL, in->dtype, 1, &in->slot, out->slot, m,
                               partial_args, &c);
    }
    return dt__fail(DT_ERR_ARG, "relayout: unknown transition %d", (int)t->kind);
}

dt_status dt__relayout_emit(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, dt__dist *out)
{
    if (dt_layout_equal(&in->layout, to)) {
        *out = *in;
        return DT_OK;
    }
    dt__plan plan;
    DT_TRY(dt__plan_make(&in->layout, to, in->dtype, in->rank, in->shape, &plan));
    dt__dist cur = *in;
    for (int i = 0; i < plan.n; i++) {
        dt__dist next;
        DT_TRY(emit_trans(p, cause, &plan.t[i], &cur, &next));
        cur = next;
    }
    *out = cur;
    return DT_OK;
}

/* ---- local slice between any two layouts (given the source holds what is needed) -------- */

typedef struct lsctx {
    const dt__dist *in;
    dt__dist out;
    const int64_t *shift;
} lsctx;

static void ls_args(void *ctx, int d, dt__kargs *k)
{
    lsctx *c = ctx;
    int rank = c->out.rank;
    int64_t in_local[DT_MAX_RANK], in_off[DT_MAX_RANK], out_local[DT_MAX_RANK],
        out_off[DT_MAX_RANK];
    dt__local_shape(c->in, d, in_local, in_off);
    dt__local_shape(&c->out, d, out_local, out_off);
    dt__block *b = dt__one_block(k, rank, in_local, out_local);
    if (!b)
        return;
    for (int i = 0; i < rank; i++)
        b->src_off[i] = out_off[i] + c->shift[i] - in_off[i];
}

dt_status dt__emit_local_slice(dt__program *p, const char *cause, const dt__dist *in,
                               const dt_layout *to, int rank, const int64_t shape[],
                               const int64_t shift[], dt__dist *out)
{
    lsctx c = {.in = in, .shift = shift};
    DT_TRY(dt__slot_new(p, to, in->dtype, rank, shape, &c.out));
    DT_TRY(dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, c.out.slot,
                           to->mesh, ls_args, &c));
    *out = c.out;
    return DT_OK;
}

/* ---- helpers shared by the op rules ------------------------------------------------------- */

dt_status dt__resolve_partial(dt__program *p, const char *cause, const dt__dist *x, dt__dist *out)
{
    if (!x->layout.partial) {
        *out = *x;
        return DT_OK;
    }
    dt_layout to = x->layout;
    to.partial = 0;
    to.partial_op = DT_REDUCE_SUM;
    return dt__relayout_emit(p, cause, x, &to, out);
}

dt_status dt__finish(dt__program *p, const char *cause, const dt__dist *x, const dt_layout *want,
                     dt__dist *out)
{
    if (!want)
        return dt__resolve_partial(p, cause, x, out);
    return dt__relayout_emit(p, cause, x, want, out);
}
