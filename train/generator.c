/* A random generator (tf.random.Generator) over the stateless ops: (seed, counter), each draw
 * the stateless op with key = counter, then counter + 1. The whole state is two integers that
 * every client holds alike, so a checkpoint saves it and a restored run draws the same
 * numbers as one that never stopped. */
#include "train.h"

#include <stdlib.h>

dt_status dt_generator_create(uint64_t seed, dt_generator **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_generator_create: out is NULL");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return dt__fail(DT_ERR_NOMEM, "dt_generator_create: out of memory");
    (*out)->seed = seed;
    return DT_OK;
}

void dt_generator_free(dt_generator *g)
{
    free(g);
}

/* One draw: the op with the current key; the counter moves on only when it succeeded, which
 * every client agrees on (ops fail alike), so the states stay equal. */
static dt_status draw(const char *fn, dt_generator *g, bool normal, dt_dtype dtype, int rank,
                      const int64_t shape[], double a, double b, const dt_op_options *opts,
                      dt_tensor **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!g)
        return dt__fail(DT_ERR_ARG, "%s: generator is NULL", fn);
    DT_TRY(normal ? dt_random_normal(dtype, rank, shape, g->seed, g->counter, a, b, opts, out)
                  : dt_random_uniform(dtype, rank, shape, g->seed, g->counter, a, b, opts, out));
    g->counter++;
    return DT_OK;
}

dt_status dt_generator_uniform(dt_generator *g, dt_dtype dtype, int rank, const int64_t shape[],
                               double low, double high, const dt_op_options *opts, dt_tensor **out)
{
    DT__SERIAL();
    return draw("dt_generator_uniform", g, false, dtype, rank, shape, low, high, opts, out);
}

dt_status dt_generator_normal(dt_generator *g, dt_dtype dtype, int rank, const int64_t shape[],
                              double mean, double stddev, const dt_op_options *opts,
                              dt_tensor **out)
{
    DT__SERIAL();
    return draw("dt_generator_normal", g, true, dtype, rank, shape, mean, stddev, opts, out);
}

dt_status dt_generator_state(const dt_generator *g, uint64_t *seed, uint64_t *counter)
{
    if (!g)
        return dt__fail(DT_ERR_ARG, "dt_generator_state: generator is NULL");
    if (seed)
        *seed = g->seed;
    if (counter)
        *counter = g->counter;
    return DT_OK;
}

dt_status dt_generator_reset(dt_generator *g, uint64_t seed, uint64_t counter)
{
    if (!g)
        return dt__fail(DT_ERR_ARG, "dt_generator_reset: generator is NULL");
    g->seed = seed;
    g->counter = counter;
    return DT_OK;
}
