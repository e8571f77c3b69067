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
 * layouts, the same on every member of a group. */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- planning ----------------------------------------------------------------------------- */

static int64_t max_local_elems(const dt_layout *l, int rank, const int64_t shape[])
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
    double bin = (double)max_local_elems(&t->before, rank, shape) * es;
    double bout = (double)max_local_elems(&t->after, rank, shape) * es;
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
        if (j >= 0 && cur.axes[j] == DT_UNSHARDED &&
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

static int coord(const dt_mesh *m, int a, int device)
{
    return device / m->strides[a] % m->sizes[a];
}

static int member(const dt_mesh *m, int a, int device, int r)
{
    return device + (r - coord(m, a, device)) * m->strides[a];
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

static void copy_shape(int64_t dst[], const int64_t src[], int rank)
{
    for (int i = 0; i < DT_MAX_RANK; i++)
        dst[i] = i < rank ? src[i] : 0;
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
        copy_shape(b->src_shape, blk, rank);
        copy_shape(b->extent, blk, rank);
        copy_shape(b->dst_shape, out_local, rank);
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
    copy_shape(k->shape, out_local, rank);
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

/* k copies one block into the whole local output `out_local` from a local input of shape
 * in_local; the caller sets the block's offsets. NULL when out of memory (no blocks). */
static dt__block *one_block(dt__kargs *k, int rank, const int64_t in_local[],
                            const int64_t out_local[])
{
    k->rank = rank;
    copy_shape(k->shape, out_local, rank);
    k->blocks = calloc(1, sizeof *k->blocks);
    if (!k->blocks)
        return NULL;
    k->nblocks = 1;
    dt__block *b = k->blocks;
    b->rank = rank;
    copy_shape(b->src_shape, in_local, rank);
    copy_shape(b->dst_shape, out_local, rank);
    copy_shape(b->extent, out_local, rank);
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
    dt__block *b = one_block(k, rank, in_local, out_local);
    if (!b)
        return;
    b->src_off[j] =
        dt_shard_offset(c->in->shape[j], c->g, coord(c->in->layout.mesh, c->mesh_axis, d));
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
        copy_shape(b->src_shape, local, rank);
        copy_shape(b->extent, local, rank);
        b->extent[j] = dt_shard_size(c->in->shape[j], g, s);
        b->src_off[j] = dt_shard_offset(c->in->shape[j], g, s);
        copy_shape(b->dst_shape, b->extent, rank);
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
    copy_shape(k->shape, out_local, rank);
    k->nblocks = g;
    k->blocks = calloc((size_t)g, sizeof *k->blocks);
    int64_t at = 0;
    for (int s = 0; s < g && k->blocks; s++) {
        dt__block *b = &k->blocks[s];
        b->rank = rank;
        copy_shape(b->src_shape, out_local, rank);
        b->src_shape[i] = dt_shard_size(c->in->shape[i], g, s);
        copy_shape(b->extent, b->src_shape, rank);
        copy_shape(b->dst_shape, out_local, rank);
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
    int me = coord(m, c->mesh_axis, d);
    int64_t out_local[DT_MAX_RANK];
    dt__local_shape(&c->out, d, out_local, NULL);
    for (int s = 0; s < g; s++) {
        dt__block *b = &boxes[s];
        int64_t local[DT_MAX_RANK];
        dt__local_shape(c->in, member(m, c->mesh_axis, d, s), local, NULL);
        b->rank = rank;
        copy_shape(b->src_shape, local, rank);
        copy_shape(b->extent, local, rank);
        b->extent[j] = dt_shard_size(c->in->shape[j], g, me);
        b->src_off[j] = dt_shard_offset(c->in->shape[j], g, me);
        copy_shape(b->dst_shape, out_local, rank);
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
    copy_shape(k->shape, local, k->rank);
    bool first = true;
    for (int a = 0; a < m->num_axes; a++)
        if ((c->t->axes & (1u << a)) && coord(m, a, d) != 0)
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
    dt__block *b = one_block(k, rank, in_local, out_local);
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

/* ---- block exchange between layouts (and meshes over the same devices) ------------------- */

/* Moving a tensor to an unrelated layout, taking a slice of it or placing it inside a larger
 * one: every target device t needs one box of the input (its shard of the result, shifted).
 * Each input block (a shard, and a term when partial) is sent to t by one holder: t itself
 * when it holds that block, else the block's first holder (coordinate 0 on the mesh axes that
 * replicate the input). Device s sends t the intersection of its shard with t's box: one
 * all-to-all(v) over every device, so nobody holds more than its own shards plus what it
 * sends and receives (never the global tensor). */
typedef struct xctx {
    const dt__dist *in;
    const dt__dist *out;
    const int64_t *shift; /* result index g is input index g + shift */
    int g;                /* devices of the exchange */
    /* Meshes over different devices exchange over the mesh of every device: exchange id u is
     * input-mesh device src[u] and output-mesh device dst[u] (-1 where that mesh lacks it),
     * output-mesh device t is exchange id of_dst[t]. NULL arrays: one mesh's ids for all. */
    const int *src, *dst, *of_dst;
} xctx;

static int x_src(const xctx *c, int u)
{
    return c->src ? c->src[u] : u;
}

static int x_dst(const xctx *c, int u)
{
    return c->dst ? c->dst[u] : u;
}

static int x_of_dst(const xctx *c, int t)
{
    return c->of_dst ? c->of_dst[t] : t;
}

/* Same block of the input on devices s and t: same shard on every tensor axis and the same
 * coordinates on the partial mesh axes. */
static bool same_block(const dt__dist *x, int s, int t)
{
    const dt_mesh *m = x->layout.mesh;
    for (int i = 0; i < x->rank; i++)
        if (dt__layout_shard_index(&x->layout, i, s) != dt__layout_shard_index(&x->layout, i, t))
            return false;
    for (int a = 0; a < m->num_axes; a++)
        if ((x->layout.partial & (1u << a)) && coord(m, a, s) != coord(m, a, t))
            return false;
    return true;
}

static bool first_holder(const dt__dist *x, int d)
{
    const dt_mesh *m = x->layout.mesh;
    unsigned used = dt__layout_used(&x->layout);
    for (int a = 0; a < m->num_axes; a++)
        if (!(used & (1u << a)) && coord(m, a, d) != 0)
            return false;
    return true;
}

/* Elements exchange device u gives v (u == v included); lo (input global index) and ext give
 * the box. u sends from its input shard (input-mesh device s), v receives into its output
 * shard (output-mesh device t); v's own input shard ti, when it has one, serves v itself. */
static int64_t x_box_any(const xctx *c, int u, int v, int64_t lo[], int64_t ext[])
{
    const dt__dist *x = c->in;
    int rank = x->rank;
    for (int i = 0; i < DT_MAX_RANK; i++)
        lo[i] = ext[i] = 0;
    int s = x_src(c, u), ti = x_src(c, v), t = x_dst(c, v);
    if (s < 0 || t < 0)
        return 0;
    /* a partial result takes each term from the device of the same term (one mesh only) */
    const dt_mesh *m = x->layout.mesh;
    for (int a = 0; a < m->num_axes; a++)
        if ((x->layout.partial & (1u << a)) && coord(m, a, s) != coord(m, a, ti))
            return 0;
    if (ti >= 0 && same_block(x, s, ti) ? u != v : !first_holder(x, s))
        return 0;
    int64_t sl[DT_MAX_RANK], so[DT_MAX_RANK], tl[DT_MAX_RANK], to[DT_MAX_RANK];
    dt__local_shape(x, s, sl, so);
    dt__local_shape(c->out, t, tl, to);
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        int64_t a = so[i] > to[i] + c->shift[i] ? so[i] : to[i] + c->shift[i];
        int64_t b = so[i] + sl[i] < to[i] + c->shift[i] + tl[i] ? so[i] + sl[i]
                                                                : to[i] + c->shift[i] + tl[i];
        lo[i] = a;
        ext[i] = b > a ? b - a : 0;
        n *= ext[i];
    }
    return n;
}

/* What crosses devices: a device's own part is copied straight into its shard (x_direct), not
 * staged through the all-to-all's buffers. */
static int64_t x_box(const xctx *c, int u, int v, int64_t lo[], int64_t ext[])
{
    return u == v ? 0 : x_box_any(c, u, v, lo, ext);
}

static void x_counts(void *ctx, int d, int64_t counts[])
{
    (void)d; /* every member passes the whole matrix */
    const xctx *c = ctx;
    int64_t lo[DT_MAX_RANK], ext[DT_MAX_RANK];
    for (int s = 0; s < c->g; s++)
        for (int t = 0; t < c->g; t++)
            counts[s * c->g + t] = x_box(c, s, t, lo, ext);
}

/* One block of the box u -> v, from u's shard (pack) or into v's shard (unpack). */
static void x_block(const xctx *c, int u, int v, bool pack, int64_t at, dt__block *b)
{
    int rank = c->in->rank;
    int64_t lo[DT_MAX_RANK], ext[DT_MAX_RANK], local[DT_MAX_RANK], off[DT_MAX_RANK];
    x_box(c, u, v, lo, ext);
    b->rank = rank;
    copy_shape(b->extent, ext, rank);
    if (pack) {
        dt__local_shape(c->in, x_src(c, u), local, off);
        copy_shape(b->src_shape, local, rank);
        copy_shape(b->dst_shape, ext, rank);
        for (int i = 0; i < rank; i++)
            b->src_off[i] = lo[i] - off[i];
        b->dst_at = at;
    } else {
        dt__local_shape(c->out, x_dst(c, v), local, off);
        copy_shape(b->src_shape, ext, rank);
        copy_shape(b->dst_shape, local, rank);
        for (int i = 0; i < rank; i++)
            b->dst_off[i] = lo[i] - c->shift[i] - off[i];
        b->src_at = at;
    }
}

/* On exchange device u (the send buffer's mesh). */
static void x_pack(void *ctx, int u, dt__kargs *k)
{
    const xctx *c = ctx;
    int64_t lo[DT_MAX_RANK], ext[DT_MAX_RANK], at = 0;
    k->rank = 1;
    k->blocks = calloc((size_t)c->g, sizeof *k->blocks);
    for (int v = 0; v < c->g && k->blocks; v++) {
        int64_t n = x_box(c, u, v, lo, ext);
        if (n)
            x_block(c, u, v, true, at, &k->blocks[k->nblocks++]);
        at += n;
    }
    k->shape[0] = at;
}

/* On output-mesh device t. */
static void x_unpack(void *ctx, int t, dt__kargs *k)
{
    const xctx *c = ctx;
    int64_t lo[DT_MAX_RANK], ext[DT_MAX_RANK], at = 0;
    int v = x_of_dst(c, t);
    k->rank = c->out->rank;
    dt__local_shape(c->out, t, k->shape, NULL);
    k->blocks = calloc((size_t)c->g, sizeof *k->blocks);
    for (int u = 0; u < c->g && k->blocks; u++) {
        int64_t n = x_box(c, u, v, lo, ext);
        if (n)
            x_block(c, u, v, false, at, &k->blocks[k->nblocks++]);
        at += n;
    }
}

/* Each output-mesh device t copies its own box straight into its shard (none when the input
 * mesh lacks t's device). */
static void x_direct(void *ctx, int t, dt__kargs *k)
{
    const xctx *c = ctx;
    int64_t lo[DT_MAX_RANK], ext[DT_MAX_RANK];
    int64_t local[DT_MAX_RANK], off[DT_MAX_RANK], tl[DT_MAX_RANK], to[DT_MAX_RANK];
    int v = x_of_dst(c, t), s = x_src(c, v);
    dt__local_shape(c->out, t, tl, to);
    k->rank = c->out->rank;
    copy_shape(k->shape, tl, k->rank);
    if (s < 0 || !x_box_any(c, v, v, lo, ext))
        return;
    dt__local_shape(c->in, s, local, off);
    dt__block *b = one_block(k, c->in->rank, local, tl);
    if (!b)
        return;
    copy_shape(b->extent, ext, b->rank);
    for (int i = 0; i < b->rank; i++) {
        b->src_off[i] = lo[i] - off[i];
        b->dst_off[i] = lo[i] - c->shift[i] - to[i];
    }
}

/* Maps of an exchange between meshes over different devices, through the mesh of every
 * device `all`: exchange ids are global device ids. */
static dt_status cross_maps(const dt_mesh *m, const dt_mesh *mo, const dt_mesh *all, xctx *c,
                            int **maps, const char *cause)
{
    int g = all->size;
    *maps = malloc(sizeof(int) * (size_t)(2 * g + mo->size));
    if (!*maps)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", cause);
    int *src = *maps, *dst = src + g, *of_dst = dst + g;
    for (int u = 0; u < 2 * g; u++)
        src[u] = -1;
    for (int s = 0; s < m->size; s++)
        src[m->global_ids[s]] = s;
    for (int t = 0; t < mo->size; t++) {
        dst[mo->global_ids[t]] = t;
        of_dst[t] = mo->global_ids[t];
    }
    c->g = g;
    c->src = src;
    c->dst = dst;
    c->of_dst = of_dst;
    return DT_OK;
}

dt_status dt__emit_exchange_into(dt__program *p, const char *cause, const dt__dist *in,
                                 const int64_t shift[], const dt__dist *out)
{
    const dt_mesh *m = in->layout.mesh, *mo = out->layout.mesh;
    if (m->type != mo->type)
        return dt__fail(DT_ERR_MESH, "%s: meshes of %s and %s devices", cause,
                        dt_device_type_name(m->type), dt_device_type_name(mo->type));
    bool same = dt__mesh_same_devices(m, mo);
    if (in->layout.partial && (mo != m || out->layout.partial != in->layout.partial))
        return dt__fail(DT_ERR_LAYOUT, "%s: a partial operand keeps its partial axes", cause);
    if (!same && dt__rt.world != MPI_COMM_NULL &&
        (m->comm == MPI_COMM_NULL || mo->comm == MPI_COMM_NULL))
        return dt__fail(DT_ERR_MESH,
                        "%s: meshes over different devices, one of them a mesh of one client's "
                        "devices only",
                        cause);
    xctx c = {.in = in, .out = out, .shift = shift, .g = m->size};
    int *maps = NULL;
    const dt_mesh *mx = m; /* where the all-to-all runs: in's mesh, or the mesh of every device */
    if (!same) {
        dt_mesh *all;
        DT_TRY(dt__mesh_all(m->type, &all));
        DT_TRY(cross_maps(m, mo, all, &c, &maps, cause));
        mx = all;
    }
    int g = c.g;
    int64_t *counts = calloc((size_t)g * (size_t)g, sizeof *counts);
    if (!counts) {
        free(maps);
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", cause);
    }
    x_counts(&c, 0, counts);
    /* per local device: elements sent and received; the busiest device's bytes */
    int64_t *sent = calloc((size_t)mx->num_local + 1, sizeof *sent);
    int64_t *recd = calloc((size_t)mx->num_local + 1, sizeof *recd);
    double most = 0;
    bool cross = false;
    for (int s = 0; s < g; s++) {
        int64_t out_s = 0;
        for (int t = 0; t < g; t++) {
            int64_t n = counts[s * g + t];
            cross = cross || n;
            out_s += n;
            int ls = s - mx->first_local, lt = t - mx->first_local;
            if (sent && ls >= 0 && ls < mx->num_local)
                sent[ls] += n;
            if (recd && lt >= 0 && lt < mx->num_local)
                recd[lt] += n;
        }
        double bytes = (double)out_s * (double)dt_dtype_size(in->dtype);
        most = bytes > most ? bytes : most;
    }
    free(counts);
    dt_status s = sent && recd ? DT_OK : dt__fail(DT_ERR_NOMEM, "%s: out of memory", cause);
    if (s == DT_OK)
        s = dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, out->slot, mo,
                            x_direct, &c);
    if (s == DT_OK && cross) {
        int send = -1, recv = -1;
        s = dt__slot_new_elems(p, mx, in->dtype, sent, &send);
        if (s == DT_OK)
            s = dt__slot_new_elems(p, mx, in->dtype, recd, &recv);
        if (s == DT_OK)
            s = dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &in->slot, send, mx,
                                x_pack, &c);
        char what[64];
        snprintf(what, sizeof what, "block exchange over %d devices", g);
        if (s == DT_OK)
            s = dt__emit_coll(p, cause, DT__COLL_ALL_TO_ALL, in->dtype, DT_REDUCE_SUM,
                              (1u << mx->num_axes) - 1u, send, recv, 0, x_counts, &c, g * g, most,
                              what);
        if (s == DT_OK)
            s = dt__emit_kernel(p, cause, DT__K_COPY_BLOCKS, in->dtype, 1, &recv, out->slot, mo,
                                x_unpack, &c);
    }
    free(sent);
    free(recd);
    free(maps);
    return s;
}

dt_status dt__emit_exchange(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, int rank, const int64_t shape[],
                            const int64_t shift[], dt__dist *out)
{
    DT_TRY(dt__slot_new(p, to, in->dtype, rank, shape, out));
    return dt__emit_exchange_into(p, cause, in, shift, out);
}

/* ---- broadcasting ops ---------------------------------------------------------------------- */

dt_status dt__broadcast_shape(const char *what, int n, const int ranks[],
                              const int64_t *const shapes[], int *rank, int64_t shape[])
{
    int r = 0;
    for (int q = 0; q < n; q++)
        r = ranks[q] > r ? ranks[q] : r;
    for (int i = 0; i < r; i++) {
        int64_t e = 1;
        int from = -1; /* the operand that set e */
        for (int q = 0; q < n; q++) {
            int iq = i - (r - ranks[q]);
            int64_t eq = iq >= 0 ? shapes[q][iq] : 1;
            if (eq == 1 || eq == e)
                continue;
            if (e == 1) {
                e = eq;
                from = q;
                continue;
            }
            char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (axis %d: %lld vs %lld)", what,
                dt__shape_str(sa, sizeof sa, ranks[from], shapes[from]),
                dt__shape_str(sb, sizeof sb, ranks[q], shapes[q]), i, (long long)e, (long long)eq);
        }
        shape[i] = e;
    }
    *rank = r;
    return DT_OK;
}

dt_layout dt__operand_layout(const dt__dist *x, const dt_layout *o, const int64_t oshape[])
{
    dt_layout l = dt__layout_none(o->mesh, x->rank);
    int off = o->rank - x->rank;
    for (int i = 0; i < x->rank; i++)
        if (x->shape[i] == oshape[i + off])
            l.axes[i] = o->axes[i + off];
    return l;
}

/* A result layout taking each axis's mesh axis from the first of xs (in the order `first`,
 * then the others) that shards it. */
static dt_layout merged_layout(int n, const dt__dist *const xs[], int first, int rank,
                               const int64_t oshape[])
{
    dt_layout l = dt__layout_none(xs[0]->layout.mesh, rank);
    unsigned used = 0;
    for (int k = 0; k < n; k++) {
        const dt__dist *x = xs[(first + k) % n];
        int off = rank - x->rank;
        for (int i = 0; i < x->rank; i++) {
            int ax = x->layout.axes[i];
            if (ax == DT_UNSHARDED || (used & (1u << ax)) || l.axes[i + off] != DT_UNSHARDED ||
                x->shape[i] != oshape[i + off])
                continue;
            l.axes[i + off] = ax;
            used |= 1u << ax;
        }
    }
    return l;
}

dt_layout dt__broadcast_layout(int n, const dt__dist *const xs[], int rank, const int64_t oshape[],
                               const dt_layout *want)
{
    dt_layout best = merged_layout(n, xs, 0, rank, oshape);
    double best_cost = INFINITY;
    for (int c = 0; c <= n; c++) {
        dt_layout o;
        if (c < n) {
            o = merged_layout(n, xs, c, rank, oshape);
        } else if (want) {
            o = *want;
            o.partial = 0;
        } else {
            break;
        }
        double cost = want ? dt__relayout_cost(&o, want, xs[0]->dtype, rank, oshape) : 0;
        for (int q = 0; q < n; q++) {
            dt_layout lq = dt__operand_layout(xs[q], &o, oshape);
            cost += dt__relayout_cost(&xs[q]->layout, &lq, xs[q]->dtype, xs[q]->rank, xs[q]->shape);
        }
        /* on a tie the request wins: computing the requested shards directly never touches
         * more than computing another layout and then slicing it (which also holds the
         * other layout's larger shards for a while) */
        if (cost < best_cost || (c == n && cost <= best_cost)) {
            best_cost = cost;
            best = o;
        }
    }
    return best;
}

/* ---- choosing mesh axes for an op's axes ------------------------------------------------- */

int64_t dt__max_local_elems(const dt_layout *l, int rank, const int64_t shape[])
{
    return max_local_elems(l, rank, shape);
}

void dt__assign_add(dt__assign *s, int slot, int axis)
{
    if (slot < 0 || slot >= s->n)
        return;
    for (int c = 0; c < s->ncand[slot]; c++)
        if (s->cand[slot][c] == axis)
            return;
    if (s->ncand[slot] < DT_MAX_MESH_AXES + 1)
        s->cand[slot][s->ncand[slot]++] = axis;
}

typedef struct assign_walk {
    const dt__assign *s;
    dt__assign_cost_fn cost;
    void *ctx;
    int cur[DT__ASSIGN_MAX];
    double best_cost;
    int *best;
    bool found;
} assign_walk;

static void assign_enumerate(assign_walk *w, int slot, unsigned used)
{
    if (slot == w->s->n) {
        double c = w->cost(w->ctx, w->cur);
        if (isfinite(c) && (!w->found || c < w->best_cost)) {
            w->best_cost = c;
            w->found = true;
            memcpy(w->best, w->cur, sizeof(int) * (size_t)w->s->n);
        }
        return;
    }
    for (int c = 0; c < w->s->ncand[slot]; c++) {
        int ax = w->s->cand[slot][c];
        if (ax != DT_UNSHARDED && (used & (1u << ax)))
            continue;
        w->cur[slot] = ax;
        assign_enumerate(w, slot + 1, ax == DT_UNSHARDED ? used : used | (1u << ax));
    }
}

bool dt__assign_best(const dt__assign *s, dt__assign_cost_fn cost, void *ctx, int best[])
{
    assign_walk w = {.s = s, .cost = cost, .ctx = ctx, .best = best};
    assign_enumerate(&w, 0, 0);
    return w.found;
}
