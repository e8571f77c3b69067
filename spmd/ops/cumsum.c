/* cumsum along one axis (tf.math.cumsum): y[i] = x[0] + ... + x[i]; `exclusive` leaves x[i] out
 * of its own sum, `reverse` sums from the end (attrs.keepdims: bit 1 exclusive, bit 2 reverse).
 * Numeric dtypes (integers wrap); the 16-bit floats accumulate in f32.
 *
 * Expansion, on x's layout; the scan is linear, so partial-sum terms pass through (each term
 * is scanned; other partial x are summed first):
 *   axis whole:             scan (local)      x -> y
 *   axis sharded over a mesh axis `a` of g devices:
 *     scan totals (local)       x -> T [.., 1, ..] per device, laid out as x with the axis of
 *                                    global extent g, sharded on a (f32 for the 16-bit floats)
 *     all-gather over a         T -> [.., g, ..]: every shard's totals, in shard order
 *     scan with carry (local)   x, T -> y: each row starts from the totals of the shards before
 *                                    its own (after it, when reversed), by mesh coordinate
 * So a sharded axis costs one all-gather of the [rows, 1] totals (g values per row) and two
 * passes over x; no device gathers x. */
#include "../engine.h"

#include <string.h>

#define EXCLUSIVE 1
#define REVERSE 2

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    DT_TRY(dt__axis_error("cumsum", &n->attrs, x->rank));
    DT_TRY(dt__dtype_check("cumsum", x->dtype, DT__NUMERIC));
    if (n->attrs.keepdims & ~(EXCLUSIVE | REVERSE))
        return dt__fail(DT_ERR_ARG, "cumsum: flags 0x%x, expected exclusive (1) and reverse (2)",
                        (unsigned)n->attrs.keepdims);
    out->dtype = x->dtype;
    out->rank = x->rank;
    memcpy(out->shape, x->shape, sizeof out->shape);
    return DT_OK;
}

typedef struct scan_ctx {
    const dt__dist *x, *y, *tot;
    int axis;
    unsigned mode;
    unsigned group; /* mesh axis mask of the sharded axis (0: none) */
} scan_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    scan_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], NULL);
    if (c->tot)
        dt__local_shape(c->tot, d, k->in_shape[1], NULL);
    k->axis = c->axis;
    k->mode = c->mode;
    k->start = c->group ? dt__group_rank(c->x->layout.mesh, c->group, d) : 0;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int axis = n->attrs.axis, flags = n->attrs.keepdims;
    dt__dist x = in[0], t, y;
    if (x.layout.partial && x.layout.partial_op != DT_REDUCE_SUM)
        DT_TRY(dt__resolve_partial(p, "cumsum", &x, &x));
    const dt_mesh *mesh = x.layout.mesh;
    unsigned mode = DT__SCAN_SCAN | (flags & EXCLUSIVE ? DT__SCAN_EXCLUSIVE : 0) |
                    (flags & REVERSE ? DT__SCAN_REVERSE : 0);
    scan_ctx c = {.x = &x, .axis = axis};
    int a = x.layout.axes[axis], ins[2] = {x.slot, -1};
    if (a != DT_UNSHARDED) {
        /* each shard's totals, then every shard's on every device of the group */
        int64_t ts[DT_MAX_RANK];
        memcpy(ts, x.shape, sizeof ts);
        ts[axis] = mesh->sizes[a];
        DT_TRY(dt__slot_new(p, &x.layout, dt__acc_dtype(x.dtype), x.rank, ts, &t));
        c.y = &t;
        c.mode = DT__SCAN_TOTAL;
        DT_TRY(dt__emit_kernel(p, "cumsum", DT__K_SCAN, x.dtype, 1, ins, t.slot, mesh, args, &c));
        dt_layout gathered = t.layout;
        gathered.axes[axis] = DT_UNSHARDED;
        DT_TRY(dt__relayout_emit(p, "cumsum", &t, &gathered, &t));
        c.tot = &t;
        c.group = 1u << a;
        mode |= DT__SCAN_CARRY;
        ins[1] = t.slot;
    }
    DT_TRY(dt__slot_new(p, &x.layout, x.dtype, x.rank, x.shape, &y));
    c.y = &y;
    c.mode = mode;
    DT_TRY(dt__emit_kernel(p, "cumsum", DT__K_SCAN, x.dtype, c.tot ? 2 : 1, ins, y.slot, mesh, args,
                           &c));
    return dt__finish(p, "cumsum", &y, want, out);
}

/* The running sum taken the other way: cumsum of dy with reverse flipped. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)x;
    (void)y;
    int flags = n->attrs.keepdims;
    return dt__tape_keep(a, dt_cumsum(dy, n->attrs.axis, flags & 1, !(flags & 2), NULL, &dx[0]),
                         &dx[0]);
}

/* The printer's words for the scan kernel's modes (common/kernels.h). */
static const char *describe(dt__kernel kernel, unsigned mode)
{
    if (kernel != DT__K_SCAN)
        return NULL;
    return DT__MODE_KIND(mode) == DT__SCAN_TOTAL ? "totals"
           : (mode & DT__SCAN_CARRY) != 0        ? "running sum plus the shards before"
           : (mode & DT__SCAN_EXCLUSIVE) != 0    ? "exclusive running sum"
                                                 : "running sum";
}

const dt__op_def dt__op_cumsum = {.name = "cumsum",
                                  .min_inputs = 1,
                                  .max_inputs = 1,
                                  .infer = infer,
                                  .expand = expand,
                                  .pull = dt__pull_same,
                                  .vjp = vjp,
                                  .describe = describe};

dt_status dt_cumsum(const dt_tensor *x, int axis, int exclusive, int reverse,
                    const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.keepdims = (exclusive ? EXCLUSIVE : 0) | (reverse ? REVERSE : 0);
    dt__axes_attrs(x ? x->rank : 0, 1, &axis, &a);
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_CUMSUM, &a, 1, in, opts, out);
}
