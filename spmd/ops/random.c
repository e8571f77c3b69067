/* random (uniform, normal): stateless Philox4x32-10. Element i of the global tensor depends
 * only on (seed, key, i): each device evaluates the global row-major index of every element of
 * its shard, so every layout, mesh, uneven split and client count gives the same bits. */
#include "../engine.h"

#include <string.h>

enum { UNIFORM = 0, NORMAL = 1 };

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)in;
    const char *name = n->attrs.op == NORMAL ? "random_normal" : "random_uniform";
    DT_TRY(dt__infer_creation(name, &n->attrs, out));
    if (n->attrs.dtype != DT_DTYPE_F32 && n->attrs.dtype != DT_DTYPE_F64)
        return dt__fail(DT_ERR_DTYPE, "%s: dtype %s, expected f32 or f64", name,
                        dt_dtype_name(n->attrs.dtype));
    return DT_OK;
}

typedef struct random_ctx {
    const dt__dist *out;
    const dt__attrs *a;
} random_ctx;

static void args(void *ctx, int d, dt__kargs *k)
{
    random_ctx *c = ctx;
    dt__kargs_out(k, c->out, d); /* offset, gshape: global index of each local element */
    k->seed = c->a->seed;
    k->key = c->a->key;
    k->a = c->a->a;
    k->b = c->a->b;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)in;
    /* computed in the request's layout without partial axes, then marked partial */
    dt_layout base = *want;
    base.partial = 0;
    dt__dist y;
    DT_TRY(dt__slot_new(p, &base, n->attrs.dtype, n->attrs.rank, n->attrs.shape, &y));
    random_ctx c = {.out = &y, .a = &n->attrs};
    DT_TRY(dt__emit_kernel(p, "random",
                           n->attrs.op == NORMAL ? DT__K_PHILOX_NORMAL : DT__K_PHILOX_UNIFORM,
                           y.dtype, 0, NULL, y.slot, want->mesh, args, &c));
    return dt__relayout_emit(p, "random", &y, want, out);
}

const dt__op_def dt__op_random = {
    .name = "random", .min_inputs = 0, .max_inputs = 0, .infer = infer, .expand = expand};

static dt_status call_random(int dist, dt_dtype dtype, int rank, const int64_t shape[],
                             uint64_t seed, uint64_t key, double p0, double p1,
                             const dt_op_options *opts, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (rank < 0 || rank > DT_MAX_RANK || (rank && !shape))
        return dt__fail(DT_ERR_SHAPE, "random: rank %d outside 0..%d or shape NULL", rank,
                        DT_MAX_RANK);
    dt__attrs a;
    memset(&a, 0, sizeof a);
    a.op = dist;
    a.dtype = dtype;
    a.rank = rank;
    for (int i = 0; i < rank; i++)
        a.shape[i] = shape[i];
    a.seed = seed;
    a.key = key;
    a.a = p0;
    a.b = p1;
    return dt__call(DT__OP_RANDOM, &a, 0, NULL, opts, out);
}

dt_status dt_random_uniform(dt_dtype dtype, int rank, const int64_t shape[], uint64_t seed,
                            uint64_t key, double low, double high, const dt_op_options *opts,
                            dt_tensor **out)
{
    return call_random(UNIFORM, dtype, rank, shape, seed, key, low, high, opts, out);
}

dt_status dt_random_normal(dt_dtype dtype, int rank, const int64_t shape[], uint64_t seed,
                           uint64_t key, double mean, double stddev, const dt_op_options *opts,
                           dt_tensor **out)
{
    return call_random(NORMAL, dtype, rank, shape, seed, key, mean, stddev, opts, out);
}
