/* fill (ones, zeros): every device writes its own shard; no communication. */
#include "../engine.h"

#include <string.h>

dt_status dt__infer_creation(const char *name, const dt__attrs *a, dt__val *out)
{
    DT_TRY(dt__dtype_check(name, a->dtype, DT__ANY));
    if (a->rank < 0 || a->rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_SHAPE, "%s: rank %d outside 0..%d", name, a->rank, DT_MAX_RANK);
    int64_t n = dt__num_elements(a->rank, a->shape);
    if (n < 0 || (uint64_t)n > (uint64_t)INT64_MAX / dt_dtype_size(a->dtype)) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE,
                        "%s: shape %s of %s has a negative extent or more bytes than 2^63", name,
                        dt__shape_str(sb, sizeof sb, a->rank, a->shape), dt_dtype_name(a->dtype));
    }
    out->dtype = a->dtype;
    out->rank = a->rank;
    memcpy(out->shape, a->shape, sizeof out->shape);
    return DT_OK;
}

void dt__kargs_out(dt__kargs *k, const dt__dist *x, int device)
{
    k->rank = x->rank;
    dt__local_shape(x, device, k->shape, k->offset);
    for (int i = 0; i < x->rank; i++)
        k->gshape[i] = x->shape[i];
}

dt_status dt__creation_attrs(const char *name, dt_dtype dtype, int rank, const int64_t shape[],
                             dt__attrs *a, dt_tensor **out)
{
    memset(a, 0, sizeof *a);
    if (out)
        *out = NULL;
    if (rank < 0 || rank > DT_MAX_RANK || (rank && !shape))
        return dt__fail(DT_ERR_SHAPE, "%s: rank %d outside 0..%d or shape NULL", name, rank,
                        DT_MAX_RANK);
    a->dtype = dtype;
    a->rank = rank;
    for (int i = 0; i < rank; i++)
        a->shape[i] = shape[i];
    return DT_OK;
}

dt_status dt__expand_creation(dt__program *p, const char *name, const dt__node *n,
                              const dt_layout *want, dt__kernel kernel, dt__args_fn args,
                              dt__dist *out)
{
    /* computed in the request's layout without partial axes, then marked partial */
    dt_layout base = *want;
    base.partial = 0;
    dt__dist y;
    DT_TRY(dt__slot_new(p, &base, n->attrs.dtype, n->attrs.rank, n->attrs.shape, &y));
    dt__creation_ctx c = {.out = &y, .attrs = &n->attrs};
    DT_TRY(dt__emit_kernel(p, name, kernel, y.dtype, 0, NULL, y.slot, want->mesh, args, &c));
    return dt__relayout_emit(p, name, &y, want, out);
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)in;
    DT_TRY(dt__infer_creation("fill", &n->attrs, out));
    return dt__value_check("fill", n->attrs.a, n->attrs.dtype);
}

static void args(void *ctx, int d, dt__kargs *k)
{
    const dt__creation_ctx *c = ctx;
    dt__kargs_out(k, c->out, d);
    k->a = c->attrs->a;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)in;
    /* out: the requested layout's shard on each device, filled locally */
    return dt__expand_creation(p, "fill", n, want, DT__K_FILL, args, out);
}

const dt__op_def dt__op_fill = {
    .name = "fill", .min_inputs = 0, .max_inputs = 0, .infer = infer, .expand = expand};

static dt_status call_fill(dt_dtype dtype, int rank, const int64_t shape[], double value,
                           const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    DT_TRY(dt__creation_attrs("fill", dtype, rank, shape, &a, out));
    a.a = value;
    return dt__call(DT__OP_FILL, &a, 0, NULL, opts, out);
}

dt_status dt_fill(dt_dtype dtype, int rank, const int64_t shape[], double value,
                  const dt_op_options *opts, dt_tensor **out)
{
    return call_fill(dtype, rank, shape, value, opts, out);
}

dt_status dt_ones(dt_dtype dtype, int rank, const int64_t shape[], const dt_op_options *opts,
                  dt_tensor **out)
{
    return call_fill(dtype, rank, shape, 1.0, opts, out);
}

dt_status dt_zeros(dt_dtype dtype, int rank, const int64_t shape[], const dt_op_options *opts,
                   dt_tensor **out)
{
    return call_fill(dtype, rank, shape, 0.0, opts, out);
}
