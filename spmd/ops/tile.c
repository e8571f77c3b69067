/* tile (tf.tile): x repeated multiples[i] times along each axis i.
 *
 * The result lies as x does (partial terms too: tiling is linear). Along an axis x does not
 * split, every device already holds what its shard of the result repeats: it copies its shard
 * multiples[i] times locally (one copy step per such axis). Along a split axis the copies
 * land on other devices: each copy is a block exchange of x shifted to its place (one
 * all-to-all(v) per copy, each device receiving only the elements of its shard that it lacks),
 * so no axis is gathered. */
#include "../engine.h"

#include <stdlib.h>
#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *x = in[0];
    const dt__attrs *a = &n->attrs;
    char sx[DT__SHAPE_STR_MAX];
    dt__shape_str(sx, sizeof sx, x->rank, x->shape);
    if (a->rank != x->rank)
        return dt__fail(DT_ERR_ARG, "tile: %d multiples for %s of rank %d", a->rank, sx, x->rank);
    out->dtype = x->dtype;
    out->rank = x->rank;
    for (int i = 0; i < x->rank; i++) {
        if (a->shape[i] < 0 || __builtin_mul_overflow(x->shape[i], a->shape[i], &out->shape[i]))
            return dt__fail(DT_ERR_ARG, "tile: multiple %lld for axis %d of %s",
                            (long long)a->shape[i], i, sx);
    }
    if (dt__num_elements(out->rank, out->shape) < 0)
        return dt__fail(DT_ERR_SHAPE, "tile: %s tiled has more than 2^63 elements", sx);
    return DT_OK;
}

typedef struct tile_ctx {
    const dt__dist *x, *y;
    int axis;
    int64_t times;
} tile_ctx;

/* y_local: x_local repeated `times` along the unsplit axis `axis` (one block per copy). */
static void local_args(void *ctx, int d, dt__kargs *k)
{
    tile_ctx *c = ctx;
    int rank = c->x->rank;
    int64_t xl[DT_MAX_RANK];
    dt__local_shape(c->x, d, xl, NULL);
    dt__kargs_out(k, c->y, d);
    if (!c->times || dt__num_elements(rank, xl) == 0)
        return;
    k->blocks = calloc((size_t)c->times, sizeof *k->blocks);
    if (!k->blocks)
        return;
    k->nblocks = (int)c->times;
    for (int64_t t = 0; t < c->times; t++) {
        dt__block *b = &k->blocks[t];
        b->rank = rank;
        for (int i = 0; i < rank; i++) {
            b->src_shape[i] = b->extent[i] = xl[i];
            b->dst_shape[i] = k->shape[i];
        }
        b->dst_off[c->axis] = t * xl[c->axis];
    }
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const int64_t *mult = n->attrs.shape;
    dt__dist x = in[0];
    int rank = x.rank;
    /* 1. along unsplit axes: local copies, one step per axis */
    for (int i = 0; i < rank; i++) {
        if (mult[i] == 1 || x.layout.axes[i] != DT_UNSHARDED)
            continue;
        if (mult[i] > 1 << 20)
            return dt__fail(DT_ERR_UNSUPPORTED, "tile: %lld copies along axis %d (at most 2^20)",
                            (long long)mult[i], i);
        int64_t shape[DT_MAX_RANK];
        memcpy(shape, x.shape, sizeof shape);
        shape[i] *= mult[i];
        dt__dist y;
        DT_TRY(dt__slot_new(p, &x.layout, x.dtype, rank, shape, &y));
        tile_ctx c = {.x = &x, .y = &y, .axis = i, .times = mult[i]};
        DT_TRY(dt__emit_kernel(p, "tile", DT__K_COPY_BLOCKS, x.dtype, 1, &x.slot, y.slot,
                               x.layout.mesh, local_args, &c));
        x = y;
    }
    /* 2. along split axes: one block exchange per copy */
    int split[DT_MAX_RANK], ns = 0;
    int64_t copies = 1, yshape[DT_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        yshape[i] = x.shape[i] * (x.layout.axes[i] != DT_UNSHARDED ? mult[i] : 1);
        if (x.layout.axes[i] != DT_UNSHARDED && mult[i] != 1) {
            split[ns++] = i;
            copies *= mult[i];
        }
    }
    if (!ns || !copies) {
        if (!copies) /* an empty result */
            DT_TRY(dt__slot_new(p, &x.layout, x.dtype, rank, yshape, &x));
        return dt__finish(p, "tile", &x, want, out);
    }
    if (copies > 4096)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "tile: %lld copies along split axes (at most 4096): relayout first",
                        (long long)copies);
    dt__dist y;
    DT_TRY(dt__slot_new(p, &x.layout, x.dtype, rank, yshape, &y));
    for (int64_t c = 0; c < copies; c++) {
        int64_t shift[DT_MAX_RANK] = {0}, rest = c;
        for (int q = ns - 1; q >= 0; q--) {
            int i = split[q];
            shift[i] = -(rest % mult[i]) * x.shape[i]; /* y index g holds x index g - t n */
            rest /= mult[i];
        }
        DT_TRY(dt__emit_exchange_into(p, "tile", &x, shift, &y));
    }
    return dt__finish(p, "tile", &y, want, out);
}

/* The sum of the tiles: one slice of dy per copy, added. */
static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *X = x[0];
    const int64_t *mult = n->attrs.shape;
    int64_t copies = 1;
    for (int i = 0; i < X->rank; i++)
        copies *= mult[i];
    if (copies == 0) {
        DT_TRY(dt__tape_constant(a, X, X->rank, X->shape, 0.0, &dx[0]));
        return DT_OK;
    }
    if (copies > 4096)
        return dt__fail(DT_ERR_UNSUPPORTED, "gradient: tile of %lld copies (at most 4096)",
                        (long long)copies);
    dt_tensor *sum = NULL;
    for (int64_t c = 0; c < copies; c++) {
        int64_t begin[DT_MAX_RANK] = {0}, rest = c;
        for (int i = X->rank - 1; i >= 0; i--) {
            begin[i] = rest % mult[i] * X->shape[i];
            rest /= mult[i];
        }
        dt_tensor *s;
        DT_TRY(dt__tape_keep(a, dt_slice(dy, begin, X->shape, NULL, &s), &s));
        if (sum)
            DT_TRY(dt__tape_binary(a, DT_BINARY_ADD, sum, s, &sum));
        else
            sum = s;
    }
    dx[0] = sum;
    return DT_OK;
}

const dt__op_def dt__op_tile = {
    .name = "tile", .min_inputs = 1, .max_inputs = 1, .infer = infer, .expand = expand, .vjp = vjp};

dt_status dt_tile(const dt_tensor *x, const int64_t multiples[], const dt_op_options *opts,
                  dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!x || (x->rank && !multiples))
        return dt__call_fail(DT__OP_TILE, 1, &x, opts,
                             dt__fail(DT_ERR_ARG, "tile: operand or multiples is NULL"));
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.rank = x->rank;
    for (int i = 0; i < x->rank; i++)
        a.shape[i] = multiples[i];
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_TILE, &a, 1, in, opts, out);
}
