/* Row-wise ops (softmax, layer_norm, cumsum, argmax) beside baselines in the same run. Prints
 * CSV on stdout: nanoseconds per element of x (best of 5 runs of a traced function) for
 *   - the op (its fused kernels: spmd/ops/softmax.c, norm.c, cumsum.c, arg_reduce.c),
 *   - the same result composed from the elementwise and reduction ops (softmax: reduce max,
 *     subtract, exp, reduce sum, divide; layer_norm: mean, subtract, square, mean, add epsilon,
 *     rsqrt, multiply, multiply by gamma, add beta), where one exists,
 *   - a plain one-thread host loop of the same arithmetic on the whole tensor (the baseline),
 * on a 1-device mesh and on a 2-device mesh with the rows sharded and with the reduced (last)
 * axis sharded. Run as one process with 2 devices:
 *
 *   DTENSOR_CPU_DEVICES=2 build/benchmarks/bench_rowwise [rows] [cols]   (default 2048 1024)
 */
#include "bench.h"
#include "dt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef dt_status (*build_fn)(dt_tensor *const in[], dt_tensor **out);

static dt_tensor *scalar_of(const dt_tensor *like, double v)
{
    dt_layout l;
    BENCH_CHECK(dt_layout_replicated(dt_tensor_mesh(like), 0, &l));
    dt_op_options o = {.layout = &l};
    dt_tensor *t;
    BENCH_CHECK(dt_fill(DT_DTYPE_F32, 0, (int64_t[]){1}, v, &o, &t));
    return t;
}

/* Composed helpers: each keeps every intermediate in `own` (freed by the caller). */
static dt_tensor *own[32];
static int nown;

static dt_tensor *kept(dt_status s, dt_tensor **t)
{
    BENCH_CHECK(s);
    own[nown++] = *t;
    return *t;
}

static dt_status fused_softmax(dt_tensor *const in[], dt_tensor **out)
{
    return dt_softmax(in[0], -1, NULL, out);
}

static dt_status composed_softmax(dt_tensor *const in[], dt_tensor **out)
{
    int last = -1;
    dt_tensor *t;
    dt_tensor *m = kept(dt_reduce(DT_REDUCE_MAX, in[0], 1, &last, 1, NULL, &t), &t);
    dt_tensor *d = kept(dt_binary(DT_BINARY_SUB, in[0], m, NULL, &t), &t);
    dt_tensor *e = kept(dt_unary(DT_UNARY_EXP, d, NULL, &t), &t);
    dt_tensor *s = kept(dt_reduce(DT_REDUCE_SUM, e, 1, &last, 1, NULL, &t), &t);
    return dt_binary(DT_BINARY_DIV, e, s, NULL, out);
}

static dt_status fused_layer_norm(dt_tensor *const in[], dt_tensor **out)
{
    return dt_layer_norm(in[0], in[1], in[2], 1e-5, NULL, out);
}

static dt_status composed_layer_norm(dt_tensor *const in[], dt_tensor **out)
{
    int last = -1;
    dt_tensor *t;
    dt_tensor *mu = kept(dt_reduce(DT_REDUCE_MEAN, in[0], 1, &last, 1, NULL, &t), &t);
    dt_tensor *d = kept(dt_binary(DT_BINARY_SUB, in[0], mu, NULL, &t), &t);
    dt_tensor *sq = kept(dt_unary(DT_UNARY_SQUARE, d, NULL, &t), &t);
    dt_tensor *v = kept(dt_reduce(DT_REDUCE_MEAN, sq, 1, &last, 1, NULL, &t), &t);
    t = scalar_of(in[0], 1e-5);
    dt_tensor *eps = kept(DT_OK, &t);
    dt_tensor *ve = kept(dt_binary(DT_BINARY_ADD, v, eps, NULL, &t), &t);
    dt_tensor *r = kept(dt_unary(DT_UNARY_RSQRT, ve, NULL, &t), &t);
    dt_tensor *xh = kept(dt_binary(DT_BINARY_MUL, d, r, NULL, &t), &t);
    dt_tensor *xg = kept(dt_binary(DT_BINARY_MUL, xh, in[1], NULL, &t), &t);
    return dt_binary(DT_BINARY_ADD, xg, in[2], NULL, out);
}

static dt_status fused_cumsum(dt_tensor *const in[], dt_tensor **out)
{
    return dt_cumsum(in[0], -1, 0, 0, NULL, out);
}

static dt_status fused_argmax(dt_tensor *const in[], dt_tensor **out)
{
    return dt_argmax(in[0], -1, DT_DTYPE_I64, NULL, out);
}

/* Best seconds of one run of build() traced on inputs in their layouts. */
static double time_fn(build_fn build, int nin, dt_tensor *const vals[])
{
    dt_function *f;
    dt_tensor *sym[3], *y;
    BENCH_CHECK(dt_function_begin(&f));
    for (int i = 0; i < nin; i++)
        BENCH_CHECK(dt_function_input(f, dt_tensor_layout(vals[i]), DT_DTYPE_F32,
                                      dt_tensor_rank(vals[i]), dt_tensor_shape(vals[i]), &sym[i]));
    nown = 0;
    BENCH_CHECK(build(sym, &y));
    BENCH_CHECK(dt_function_end(f, 1, &y));
    double best = INFINITY;
    for (int rep = 0; rep < 6; rep++) {
        dt_tensor *r;
        double t0 = bench_now();
        BENCH_CHECK(dt_function_run(f, nin, (const dt_tensor *const *)vals, 1, &r));
        BENCH_CHECK(dt_tensor_wait(r));
        double t = bench_now() - t0;
        if (rep > 0 && t < best) /* the first run warms the caches and the allocator */
            best = t;
        dt_tensor_free(r);
    }
    for (int i = 0; i < nin; i++)
        dt_tensor_free(sym[i]);
    for (int i = 0; i < nown; i++)
        dt_tensor_free(own[i]);
    dt_tensor_free(y);
    dt_function_free(f);
    return best;
}

/* The host baselines: one thread, the whole tensor, the same passes as the kernels. */
static double host_loop(const char *op, const float *x, const float *g, const float *b, float *y,
                        int64_t rows, int64_t n)
{
    double best = INFINITY;
    for (int rep = 0; rep < 6; rep++) {
        double t0 = bench_now();
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * n;
            float *yr = y + r * n;
            if (!strcmp(op, "softmax")) {
                float m = -INFINITY;
                for (int64_t j = 0; j < n; j++)
                    m = xr[j] > m ? xr[j] : m;
                double s = 0;
                for (int64_t j = 0; j < n; j++)
                    s += expf(xr[j] - m);
                float inv = (float)(1.0 / s);
                for (int64_t j = 0; j < n; j++)
                    yr[j] = expf(xr[j] - m) * inv;
            } else if (!strcmp(op, "layer_norm")) {
                double mu = 0, v = 0;
                for (int64_t j = 0; j < n; j++)
                    mu += xr[j];
                mu /= (double)n;
                for (int64_t j = 0; j < n; j++)
                    v += (xr[j] - mu) * (xr[j] - mu);
                float rs = (float)(1.0 / sqrt(v / (double)n + 1e-5)), c = (float)mu;
                for (int64_t j = 0; j < n; j++)
                    yr[j] = (xr[j] - c) * rs * g[j] + b[j];
            } else if (!strcmp(op, "cumsum")) {
                float a = 0;
                for (int64_t j = 0; j < n; j++)
                    yr[j] = a += xr[j];
            } else {
                int64_t best_j = 0;
                for (int64_t j = 1; j < n; j++)
                    best_j = xr[j] > xr[best_j] ? j : best_j;
                yr[0] = (float)best_j;
            }
        }
        double t = bench_now() - t0;
        if (rep > 0 && t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    int64_t rows = argc > 1 ? atoll(argv[1]) : 2048, n = argc > 2 ? atoll(argv[2]) : 1024;
    BENCH_CHECK(dt_init(NULL));
    int64_t shape[2] = {rows, n}, s1[1] = {n}, ne = rows * n;
    float *hx = malloc(sizeof(float) * (size_t)ne), *hy = malloc(sizeof(float) * (size_t)ne);
    float *hg = malloc(sizeof(float) * (size_t)n), *hb = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < ne; i++)
        hx[i] = (float)sin((double)i * 0.37) * 3.0f;
    for (int64_t i = 0; i < n; i++) {
        hg[i] = 1.0f + 0.01f * (float)(i % 7);
        hb[i] = 0.1f * (float)(i % 5);
    }
    const char *ops[4] = {"softmax", "layer_norm", "cumsum", "argmax"};
    const build_fn fused[4] = {fused_softmax, fused_layer_norm, fused_cumsum, fused_argmax};
    const build_fn composed[4] = {composed_softmax, composed_layer_norm, NULL, NULL};
    double host[4];
    for (int k = 0; k < 4; k++)
        host[k] = host_loop(ops[k], hx, hg, hb, hy, rows, n);
    printf("op,mesh,layout,rows,cols,ns_per_elem_op,ns_per_elem_composed,ns_per_elem_host_loop,"
           "composed_over_op,host_loop_over_op\n");
    const char *meshes[2] = {"x=1", "x=2"};
    const char *layouts[3] = {"unsharded,unsharded", "x,unsharded", "unsharded,x"};
    for (int mi = 0; mi < 2; mi++) {
        dt_mesh *m;
        const char *names[1] = {"x"};
        if (dt_mesh_create_on_devices(1, names, (int[]){mi + 1}, DT_DEVICE_CPU, mi + 1,
                                      (int[]){0, 1}, &m) != DT_OK)
            continue;
        for (int li = 0; li < (mi ? 3 : 1); li++) {
            dt_layout l, l1;
            BENCH_CHECK(dt_layout_parse(m, layouts[li], &l));
            BENCH_CHECK(dt_layout_parse(m, li == 2 ? "x" : "unsharded", &l1));
            dt_tensor *v[3];
            BENCH_CHECK(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, hx,
                                            sizeof(float) * (size_t)ne, &v[0]));
            BENCH_CHECK(dt_tensor_from_host(&l1, DT_DTYPE_F32, 1, s1, hg, sizeof(float) * (size_t)n,
                                            &v[1]));
            BENCH_CHECK(dt_tensor_from_host(&l1, DT_DTYPE_F32, 1, s1, hb, sizeof(float) * (size_t)n,
                                            &v[2]));
            for (int k = 0; k < 4; k++) {
                int nin = k == 1 ? 3 : 1;
                double tf = time_fn(fused[k], nin, v);
                double tc = composed[k] ? time_fn(composed[k], nin, v) : NAN;
                double per = 1e9 / (double)ne;
                printf("%s,%s,\"%s\",%lld,%lld,%.3f,%.3f,%.3f,%.2f,%.2f\n", ops[k], meshes[mi],
                       layouts[li], (long long)rows, (long long)n, tf * per, tc * per,
                       host[k] * per, tc / tf, host[k] / tf);
            }
            for (int i = 0; i < 3; i++)
                dt_tensor_free(v[i]);
        }
        dt_mesh_free(m);
    }
    free(hx);
    free(hy);
    free(hg);
    free(hb);
    BENCH_CHECK(dt_finalize());
    return 0;
}
