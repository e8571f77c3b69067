/* pad (tf.pad, constant mode): x with before[i] and after[i] elements of constant_values added
 * on each side of axis i.
 *
 * The result lies as requested (without partial axes), or as x does. Each device fills its
 * shard with the constant, then receives the elements of x that fall inside it: a block
 * exchange shifted by `before` (one all-to-all(v) where shards cross devices, local copies
 * where they do not; no device ever holds x whole). A partial x is summed first (the constant
 * is not a term of a sum). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    const dt__attrs *a = &n->attrs;
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (int i = 0; i < x->rank; i++) {
        int64_t b = a->begin[i], e = a->after[i];
        if (b < 0 || e < 0 || b > INT64_MAX / 4 || e > INT64_MAX / 4 ||
            x->shape[i] > INT64_MAX / 2) {
            char sx[DT__SHAPE_STR_MAX];
            return dt__fail(DT_ERR_ARG, "pad: axis %d of %s: paddings %lld and %lld (each >= 0)", i,
                            dt__shape_str(sx, sizeof sx, x->rank, x->shape), (long long)b,
                            (long long)e);
        }
        out->shape[i] = x->shape[i] + b + e;
    }
    if (dt__num_elements(out->rank, out->shape) < 0) {
        char sy[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE, "pad: the result %s has more than 2^63 elements",
                        dt__shape_str(sy, sizeof sy, out->rank, out->shape));
    }
    return DT_OK;
}

typedef struct pad_ctx {
    const dt__dist *y;
    double value;
} pad_ctx;

static void fill_args(void *ctx, int d, dt__kargs *k)
{
    pad_ctx *c = ctx;
    dt__kargs_out(k, c->y, d);
    k->a = c->value;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__attrs *a = &n->attrs;
    dt__dist x, y;
    DT_TRY(dt__resolve_partial(p, "pad", &in[0], &x));
    int64_t shape[DT_MAX_RANK], shift[DT_MAX_RANK] = {0};
    for (int i = 0; i < x.rank; i++) {
        shape[i] = x.shape[i] + a->begin[i] + a->after[i];
        shift[i] = -a->begin[i]; /* y index g holds x index g - before */
    }
    dt_layout yl = want ? *want : x.layout;
    yl.partial = 0;
    /* y_local: the constant, then x's elements that fall inside the shard */
    DT_TRY(dt__slot_new(p, &yl, x.dtype, x.rank, shape, &y));
    pad_ctx c = {.y = &y, .value = a->a};
    DT_TRY(dt__emit_kernel(p, "pad", DT__K_FILL, x.dtype, 0, NULL, y.slot, yl.mesh, fill_args, &c));
    DT_TRY(dt__emit_exchange_into(p, "pad", &x, shift, &y));
    return dt__finish(p, "pad", &y, want, out);
}

static bool pull(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want)
{
    (void)n;
    (void)in;
    (void)i;
    *in_want = *want;
    in_want->partial = 0;
    return true;
}

/* The padding's gradient is dy without the padding: a slice. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    return dt__tape_keep(a, dt_slice(dy, n->attrs.begin, x[0]->shape, NULL, &dx[0]), &dx[0]);
}

const dt__op_def dt__op_pad = {.name = "pad",
                               .min_inputs = 1,
                               .max_inputs = 1,
                               .infer = infer,
                               .expand = expand,
                               .pull = pull,
                               .vjp = vjp};

dt_status dt_pad(const dt_tensor *x, const int64_t before[], const int64_t after[],
                 double constant_value, const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x || (x->rank && (!before || !after)))
        return dt__call_fail(DT__OP_PAD, 1, &x, opts,
                             dt__fail(DT_ERR_ARG, "pad: operand, before or after is NULL"));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < x->rank; i++) {
        a.begin[i] = before[i];
        a.after[i] = after[i];
    }
    a.a = constant_value;
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_PAD, &a, 1, in, opts, out);
}
