/* argmax and argmin along one axis (tf.math.argmax / argmin): the index of the extremum, the
 * first on ties, the first NaN when there is one (numpy's rule), as i64 (TensorFlow's default)
 * or i32. The axis is removed from the result.
 *
 * Expansion, on x's layout without partial axes (a partial x is summed first):
 *   axis whole:            arg_reduce index (local)  x -> the indices
 *   axis sharded over a mesh axis `a` of g devices:
 *     arg_reduce records (local)   x -> R [.., 2, ..] i64 per device: the shard's extremum (its
 *                                       bits) and its global index, per row; R is laid out as
 *                                       x with the axis of global extent 2g, sharded on a
 *     all-gather over a            R -> [.., 2g, ..]: every shard's record, in shard order
 *     arg_reduce merge (local)     R -> the indices: the best record, the lowest index on ties
 * The records are 16 bytes per row and shard: the value and the index travel together, and no
 * device gathers x. The result is sharded as x's other axes, replicated over a. */
#include "../engine.h"

#include <string.h>

static const char *op_name(int op)
{
    return op == DT_REDUCE_MIN ? "argmin" : "argmax";
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    int op = n->attrs.op;
    if (op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
        return dt__fail(DT_ERR_ARG, "arg_reduce: operator %s is not max or min",
                        dt_reduce_op_name((dt_reduce_op)op));
    const char *name = op_name(op);
    DT_TRY(dt__axis_error(name, &n->attrs, x->rank));
    DT_TRY(dt__dtype_check(name, x->dtype, DT__ANY));
    dt_dtype to = n->attrs.dtype;
    if (to != DT_DTYPE_I64 && to != DT_DTYPE_I32)
        return dt__fail(DT_ERR_DTYPE, "%s: index dtype %s, expected i64 or i32", name,
                        dt__dtype_valid(to) ? dt_dtype_name(to) : "(invalid)");
    int axis = n->attrs.axis;
    char sb[DT__SHAPE_STR_MAX];
    if (x->shape[axis] == 0)
        return dt__fail(DT_ERR_SHAPE, "%s: axis %d of %s is empty", name, axis,
                        dt__shape_str(sb, sizeof sb, x->rank, x->shape));
    if (to == DT_DTYPE_I32 && x->shape[axis] > INT32_MAX)
        return dt__fail(DT_ERR_ARG, "%s: axis %d of %s has more elements than i32 indexes", name,
                        axis, dt__shape_str(sb, sizeof sb, x->rank, x->shape));
    out->dtype = to;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (i != axis)
            out->shape[out->rank++] = x->shape[i];
    return DT_OK;
}

typedef struct arg_ctx {
    const dt__dist *x, *y;
    int op, axis;
    unsigned mode;
    dt_dtype to;
} arg_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    arg_ctx *c = ctx;
    int64_t off[DT_MAX_RANK];
    dt__kargs_out(k, c->y, d);
    dt__local_shape(c->x, d, k->in_shape[0], off);
    k->op = c->op;
    k->axis = c->axis;
    k->mode = c->mode;
    k->to = c->to;
    k->start = c->mode == DT__ARG_MERGE ? 0 : off[c->axis];
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    int op = n->attrs.op, axis = n->attrs.axis;
    const char *name = op_name(op);
    dt__dist x = in[0], r, y;
    DT_TRY(dt__resolve_partial(p, name, &x, &x));
    const dt_mesh *mesh = x.layout.mesh;
    dt_layout kl;
    int64_t ks[DT_MAX_RANK];
    dt__rowwise_reduced(&x, 1u << axis, 1, DT_REDUCE_SUM, &kl, ks);
    kl.partial = 0; /* the winner is known on every device of the axis's group */
    arg_ctx c = {.x = &x, .op = op, .axis = axis, .to = n->attrs.dtype};
    int a = x.layout.axes[axis];
    if (a == DT_UNSHARDED) {
        DT_TRY(dt__slot_new(p, &kl, c.to, x.rank, ks, &y));
        c.y = &y;
        c.mode = DT__ARG_INDEX;
        DT_TRY(dt__emit_kernel(p, name, DT__K_ARG_REDUCE, x.dtype, 1, &x.slot, y.slot, mesh, args,
                               &c));
    } else {
        /* one record (2 words) per shard along the axis, then every shard's */
        int64_t rs[DT_MAX_RANK];
        memcpy(rs, x.shape, sizeof rs);
        rs[axis] = 2 * (int64_t)mesh->sizes[a];
        DT_TRY(dt__slot_new(p, &x.layout, DT_DTYPE_I64, x.rank, rs, &r));
        c.y = &r;
        c.mode = DT__ARG_RECORDS;
        DT_TRY(dt__emit_kernel(p, name, DT__K_ARG_REDUCE, x.dtype, 1, &x.slot, r.slot, mesh, args,
                               &c));
        dt_layout gathered = r.layout;
        gathered.axes[axis] = DT_UNSHARDED;
        DT_TRY(dt__relayout_emit(p, name, &r, &gathered, &r));
        DT_TRY(dt__slot_new(p, &kl, c.to, x.rank, ks, &y));
        c.x = &r;
        c.y = &y;
        c.mode = DT__ARG_MERGE;
        DT_TRY(dt__emit_kernel(p, name, DT__K_ARG_REDUCE, x.dtype, 1, &r.slot, y.slot, mesh, args,
                               &c));
    }
    /* drop the axis (extent 1): the same slot, new metadata */
    dt__dist z = y;
    z.rank = 0;
    for (int i = 0; i < x.rank; i++)
        if (i != axis) {
            z.shape[z.rank] = ks[i];
            z.layout.axes[z.rank++] = y.layout.axes[i];
        }
    z.layout.rank = z.rank;
    for (int i = z.rank; i < DT_MAX_RANK; i++) {
        z.shape[i] = 0;
        z.layout.axes[i] = DT_UNSHARDED;
    }
    return dt__finish(p, name, &z, want, out);
}

/* The operand as the result is wanted, the reduced axis unsharded. */
static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)i;
    const dt__val *x = in[0];
    int axis = n->attrs.axis;
    if (want->rank != x->rank - 1 || axis < 0 || axis >= x->rank)
        return false;
    *in_want = dt__layout_none(want->mesh, x->rank);
    for (int q = 0, j = 0; q < x->rank; q++)
        if (q != axis)
            in_want->axes[q] = want->axes[j++];
    return true;
}

/* The printer's words for the arg_reduce kernel's modes (common/kernels.h). */
static const char *describe(dt__kernel kernel, unsigned mode)
{
    static const char *const words[] = {"index", "records", "merge"};
    unsigned m = DT__MODE_KIND(mode);
    return kernel != DT__K_ARG_REDUCE ? NULL : m < 3 ? words[m] : "?";
}

const dt__op_def dt__op_arg_reduce = {.name = "arg_reduce",
                                      .min_inputs = 1,
                                      .max_inputs = 1,
                                      .infer = infer,
                                      .expand = expand,
                                      .pull = pull,
                                      .describe = describe};

static dt_status call(int op, const dt_tensor *x, int axis, dt_dtype index_dtype,
                      const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.dtype = index_dtype;
    dt__axes_attrs(x ? x->rank : 0, 1, &axis, &a);
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_ARG_REDUCE, &a, 1, in, opts, out);
}

dt_status dt_argmax(const dt_tensor *x, int axis, dt_dtype index_dtype, const dt_op_options *opts,
                    dt_tensor **out)
{
    return call(DT_REDUCE_MAX, x, axis, index_dtype, opts, out);
}

dt_status dt_argmin(const dt_tensor *x, int axis, dt_dtype index_dtype, const dt_op_options *opts,
                    dt_tensor **out)
{
    return call(DT_REDUCE_MIN, x, axis, index_dtype, opts, out);
}
