/* random (uniform, normal): stateless Philox4x32-10. Element i of the global tensor depends
 * only on (seed, key, i): each device evaluates the global row-major index of every element of
 * its shard, so every layout, mesh, uneven split and client count gives the same bits. */
#include "../engine.h"

enum { UNIFORM = 0, NORMAL = 1 };

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)in;
    const char *name = n->attrs.op == NORMAL ? "random_normal" : "random_uniform";
    DT_TRY(dt__infer_creation(name, &n->attrs, out));
    return dt__dtype_check(name, n->attrs.dtype, DT__FLOATING);
}

static void args(void *ctx, int d, dt__kargs *k)
{
    const dt__creation_ctx *c = ctx;
    dt__kargs_out(k, c->out, d); /* offset, gshape: global index of each local element */
    k->seed = c->attrs->seed;
    k->key = c->attrs->key;
    k->a = c->attrs->a;
    k->b = c->attrs->b;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)in;
    return dt__expand_creation(p, "random", n, want,
                               n->attrs.op == NORMAL ? DT__K_PHILOX_NORMAL : DT__K_PHILOX_UNIFORM,
                               args, out);
}

const dt__op_def dt__op_random = {
    .name = "random", .min_inputs = 0, .max_inputs = 0, .infer = infer, .expand = expand};

static dt_status call_random(int dist, dt_dtype dtype, int rank, const int64_t shape[],
                             uint64_t seed, uint64_t key, double p0, double p1,
                             const dt_op_options *opts, dt_tensor **out)
{
    dt__attrs a;
    DT_TRY(dt__creation_attrs("random", dtype, rank, shape, &a, out));
    a.op = dist;
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
