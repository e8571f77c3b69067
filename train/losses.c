/* Losses composed from the engine's ops (so they differentiate and shard like any op), the
 * tf.nn helpers of the custom training loop, and initializers through the layout-invariant
 * random ops. Every intermediate is freed as soon as it is consumed (symbolic tensors
 * included: the traced graph keeps the node). */
#include "train.h"

#include <math.h>
#include <string.h>

#define NAME_FN(fn, type, LIST, PREFIX, COUNT)             \
    const char *fn(type x)                                 \
    {                                                      \
        static const char *const names[] = {LIST(PREFIX)}; \
        return (unsigned)x < COUNT ? names[x] : "?";       \
    }
#define ACT_NAME(NAME, name) [DT_ACTIVATION_##NAME] = #name,
#define LOSS_NAME(NAME, name) [DT_LOSS_##NAME] = #name,
#define INIT_NAME(NAME, name) [DT_INITIALIZER_##NAME] = #name,
NAME_FN(dt_activation_name, dt_activation, DT_ACTIVATION_LIST, ACT_NAME, DT_ACTIVATION_COUNT)
NAME_FN(dt_loss_name, dt_loss, DT_LOSS_LIST, LOSS_NAME, DT_LOSS_COUNT)
NAME_FN(dt_initializer_name, dt_initializer, DT_INITIALIZER_LIST, INIT_NAME, DT_INITIALIZER_COUNT)

/* A replicated scalar on x's mesh. */
static dt_status scalar(const dt_tensor *like, double v, dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(dt_tensor_mesh(like), 0, &l));
    dt_op_options o = {.layout = &l};
    int64_t none[1] = {1};
    return dt_fill(dt_tensor_dtype(like), 0, none, v, &o, out);
}

/* *acc = f(*acc, other) with the old *acc freed; a one-line chain step. */
static dt_status chain_bin(dt_binary_op op, dt_tensor **acc, const dt_tensor *other, bool left)
{
    dt_tensor *r;
    DT_TRY(left ? dt_binary(op, other, *acc, NULL, &r) : dt_binary(op, *acc, other, NULL, &r));
    dt_tensor_free(*acc);
    *acc = r;
    return DT_OK;
}

static dt_status chain_un(dt_unary_op op, dt_tensor **acc)
{
    dt_tensor *r;
    DT_TRY(dt_unary(op, *acc, NULL, &r));
    dt_tensor_free(*acc);
    *acc = r;
    return DT_OK;
}

static dt_status chain_reduce(dt_reduce_op op, dt_tensor **acc, int axis, int keepdims)
{
    dt_tensor *r;
    DT_TRY(dt_reduce(op, *acc, 1, &axis, keepdims, NULL, &r));
    dt_tensor_free(*acc);
    *acc = r;
    return DT_OK;
}

static dt_status check_loss_args(dt_loss loss, const dt_tensor *y, const dt_tensor *p)
{
    if (!y || !p)
        return dt__fail(DT_ERR_ARG, "dt_loss_per_example: %s is NULL",
                        y ? "predictions" : "labels");
    if ((unsigned)loss >= DT_LOSS_COUNT)
        return dt__fail(DT_ERR_ARG, "dt_loss_per_example: loss %d outside 0..%d", (int)loss,
                        DT_LOSS_COUNT - 1);
    char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
    if (p->rank != 2 || y->rank != 2 || p->shape[0] != y->shape[0] || p->shape[1] != y->shape[1])
        return dt__fail(DT_ERR_SHAPE, "%s: labels %s and predictions %s, expected both [batch, k]",
                        dt_loss_name(loss), dt__shape_str(sa, sizeof sa, y->rank, y->shape),
                        dt__shape_str(sb, sizeof sb, p->rank, p->shape));
    if (p->dtype != y->dtype || (p->dtype != DT_DTYPE_F32 && p->dtype != DT_DTYPE_F64))
        return dt__fail(DT_ERR_DTYPE, "%s: labels %s, predictions %s, expected f32 or f64 alike",
                        dt_loss_name(loss), dt_dtype_name(y->dtype), dt_dtype_name(p->dtype));
    return DT_OK;
}

dt_status dt_loss_per_example(dt_loss loss, const dt_tensor *labels, const dt_tensor *predictions,
                              dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_loss_per_example: out is NULL");
    *out = NULL;
    DT_TRY(check_loss_args(loss, labels, predictions));
    const dt_tensor *y = labels, *p = predictions;
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    dt_status s = DT_OK;
    switch (loss) {
    case DT_LOSS_MEAN_SQUARED_ERROR: /* mean_k (p - y)^2 */
        s = dt_binary(DT_BINARY_SUB, p, y, NULL, &a);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_SQUARE, &a);
        if (s == DT_OK)
            s = chain_reduce(DT_REDUCE_MEAN, &a, 1, 0);
        break;
    case DT_LOSS_SOFTMAX_CROSS_ENTROPY: /* m + log sum_k exp(p - m) - sum_k y p, m = max_k p */
        s = dt_reduce(DT_REDUCE_MAX, p, 1, (int[]){1}, 1, NULL, &b); /* [B, 1] */
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_SUB, p, b, NULL, &a);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_EXP, &a);
        if (s == DT_OK)
            s = chain_reduce(DT_REDUCE_SUM, &a, 1, 0);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_LOG, &a); /* [B] */
        if (s == DT_OK)
            s = chain_reduce(DT_REDUCE_SUM, &b, 1, 0); /* m as [B] */
        if (s == DT_OK)
            s = chain_bin(DT_BINARY_ADD, &a, b, false);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MUL, y, p, NULL, &c);
        if (s == DT_OK)
            s = chain_reduce(DT_REDUCE_SUM, &c, 1, 0);
        if (s == DT_OK)
            s = chain_bin(DT_BINARY_SUB, &a, c, false);
        break;
    case DT_LOSS_BINARY_CROSS_ENTROPY: /* mean_k relu(z) - z y + log(1 + exp(-|z|)) */
        s = dt_unary(DT_UNARY_ABS, p, NULL, &b);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_NEG, &b);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_EXP, &b);
        if (s == DT_OK)
            s = scalar(p, 1.0, &c);
        if (s == DT_OK)
            s = chain_bin(DT_BINARY_ADD, &b, c, false);
        if (s == DT_OK)
            s = chain_un(DT_UNARY_LOG, &b);
        if (s == DT_OK)
            s = dt_unary(DT_UNARY_RELU, p, NULL, &a);
        if (s == DT_OK)
            s = chain_bin(DT_BINARY_ADD, &a, b, false);
        dt_tensor_free(c);
        c = NULL;
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MUL, p, y, NULL, &c);
        if (s == DT_OK)
            s = chain_bin(DT_BINARY_SUB, &a, c, false);
        if (s == DT_OK)
            s = chain_reduce(DT_REDUCE_MEAN, &a, 1, 0);
        break;
    default:
        break;
    }
    dt_tensor_free(b);
    dt_tensor_free(c);
    if (s != DT_OK) {
        dt_tensor_free(a);
        return s;
    }
    *out = a;
    return DT_OK;
}

static dt_status scaled_sum(const char *fn, const dt_tensor *x, double scale, bool sum,
                            dt_tensor **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!x)
        return dt__fail(DT_ERR_ARG, "%s: operand is NULL", fn);
    dt_tensor *a = NULL, *c = NULL;
    dt_status s = sum ? dt_reduce(DT_REDUCE_SUM, x, 0, NULL, 0, NULL, &a) : DT_OK;
    if (s == DT_OK)
        s = scalar(x, scale, &c);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, sum ? a : x, c, NULL, out);
    dt_tensor_free(a);
    dt_tensor_free(c);
    return s;
}

dt_status dt_compute_average_loss(const dt_tensor *per_example, int64_t global_batch_size,
                                  dt_tensor **out)
{
    DT__SERIAL();
    if (global_batch_size < 1) {
        if (out)
            *out = NULL;
        return dt__fail(DT_ERR_ARG, "dt_compute_average_loss: global batch size %lld < 1",
                        (long long)global_batch_size);
    }
    return scaled_sum("dt_compute_average_loss", per_example, 1.0 / (double)global_batch_size, true,
                      out);
}

dt_status dt_scale_regularization_loss(const dt_tensor *loss, int num_replicas, dt_tensor **out)
{
    DT__SERIAL();
    if (num_replicas < 1) {
        if (out)
            *out = NULL;
        return dt__fail(DT_ERR_ARG, "dt_scale_regularization_loss: %d replicas < 1", num_replicas);
    }
    return scaled_sum("dt_scale_regularization_loss", loss, 1.0 / num_replicas, false, out);
}

dt_status dt_initializer_run(dt_initializer init, dt_dtype dtype, int rank, const int64_t shape[],
                             uint64_t seed, uint64_t key, const dt_layout *layout, dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_initializer_run: out is NULL");
    *out = NULL;
    if (!layout)
        return dt__fail(DT_ERR_ARG, "dt_initializer_run: layout is NULL");
    dt_op_options o = {.layout = layout};
    switch (init) {
    case DT_INITIALIZER_ZEROS:
        return dt_zeros(dtype, rank, shape, &o, out);
    case DT_INITIALIZER_ONES:
        return dt_ones(dtype, rank, shape, &o, out);
    case DT_INITIALIZER_GLOROT_UNIFORM: {
        double fan_in = rank >= 2 ? (double)shape[rank - 2] : (rank ? (double)shape[0] : 1);
        double fan_out = rank ? (double)shape[rank - 1] : 1;
        double lim = sqrt(6.0 / (fan_in + fan_out));
        return dt_random_uniform(dtype, rank, shape, seed, key, -lim, lim, &o, out);
    }
    case DT_INITIALIZER_RANDOM_NORMAL:
        return dt_random_normal(dtype, rank, shape, seed, key, 0.0, 0.05, &o, out);
    default:
        return dt__fail(DT_ERR_ARG, "dt_initializer_run: initializer %d outside 0..%d", (int)init,
                        DT_INITIALIZER_COUNT - 1);
    }
}
