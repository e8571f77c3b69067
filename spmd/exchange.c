/* Block exchange between layouts (and meshes over the same devices): dt__emit_exchange and
 * dt__emit_exchange_into (engine.h).
 *
 * Moving a tensor to an unrelated layout, taking a slice of it or placing it inside a larger
 * one: every target device t needs one box of the input (its shard of the result, shifted).
 * Each input block (a shard, and a term when partial) is sent to t by one holder: t itself
 * when it holds that block, else the block's first holder (coordinate 0 on the mesh axes that
 * replicate the input). Device s sends t the intersection of its shard with t's box: one
 * all-to-all(v) over every device, so nobody holds more than its own shards plus what it
 * sends and receives (never the global tensor). */
#include "engine.h"
#include "relayout.h"

#include <stdlib.h>

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
        if ((x->layout.partial & (1u << a)) && dt__coord(m, a, s) != dt__coord(m, a, t))
            return false;
    return true;
}

static bool first_holder(const dt__dist *x, int d)
{
    const dt_mesh *m = x->layout.mesh;
    unsigned used = dt__layout_used(&x->layout);
    for (int a = 0; a < m->num_axes; a++)
        if (!(used & (1u << a)) && dt__coord(m, a, d) != 0)
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
        if ((x->layout.partial & (1u << a)) && dt__coord(m, a, s) != dt__coord(m, a, ti))
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
    dt__copy_shape(b->extent, ext, rank);
    if (pack) {
        dt__local_shape(c->in, x_src(c, u), local, off);
        dt__copy_shape(b->src_shape, local, rank);
        dt__copy_shape(b->dst_shape, ext, rank);
        for (int i = 0; i < rank; i++)
            b->src_off[i] = lo[i] - off[i];
        b->dst_at = at;
    } else {
        dt__local_shape(c->out, x_dst(c, v), local, off);
        dt__copy_shape(b->src_shape, ext, rank);
        dt__copy_shape(b->dst_shape, local, rank);
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
    dt__copy_shape(k->shape, tl, k->rank);
    if (s < 0 || !x_box_any(c, v, v, lo, ext))
        return;
    dt__local_shape(c->in, s, local, off);
    dt__block *b = dt__one_block(k, c->in->rank, local, tl);
    if (!b)
        return;
    dt__copy_shape(b->extent, ext, b->rank);
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
