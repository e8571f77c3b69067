/* Elementwise fusion (spmd/fuse.c) beside the same traced function unfused (DTENSOR_FUSION=0)
 * in the same run. Prints CSV on stdout: for each chain, nanoseconds per output element of the
 * unfused and the fused function (the median of `reps` runs, the two alternating) and their
 * ratio (unfused / fused: above 1, fusion is faster). Chains, on [rows, cols] f32 (and bf16):
 *   - bias_gelu:  gelu(x + b), b [cols] (the MLP's bias and activation),
 *   - residual:   x + (y + b) * 0.5 (a projection's bias, a scale, the residual add),
 *   - cast_chain: cast(gelu(cast(x, f32) + b), bf16) on a bf16 x (a bf16 activation through f32),
 *   - adamw:      dt_optimizer_apply of AdamW on an f32 [rows, cols] variable (its traced update:
 *                 3 fused kernels, or 21 unfused);
 * and chains ending in a reduction (one kernel fused, never writing the chain's value; per
 * element of x):
 *   - sum_square: sum(square(x)) over both axes (a global norm's sum of squares: one ordered
 *                 running value),
 *   - row_sum:    sum(x * y) over the last axis (a layer norm's gradient sums, the loss's
 *                 one-hot product),
 *   - col_sum:    sum(x * y) over the first axis (a norm's gamma gradient: chunks of columns).
 * Run as one process; the mesh is every local device, rows sharded:
 *
 *   DTENSOR_CPU_DEVICES=1 build/benchmarks/bench_fusion [rows] [cols] [reps]  (1024 3072 21)
 */
#include "bench.h"
#include "dt.h"

#include <stdlib.h>

static dt_mesh *mesh;

static dt_tensor *scalar(dt_dtype dt, double v)
{
    dt_layout l;
    BENCH_CHECK(dt_layout_replicated(mesh, 0, &l));
    dt_op_options o = {.layout = &l};
    dt_tensor *t;
    BENCH_CHECK(dt_fill(dt, 0, NULL, v, &o, &t));
    return t;
}

/* The chains: out from in[] (x, y, b); intermediates freed by the caller through own[]. */
static dt_tensor *own[16];
static int nown;

static dt_tensor *keep(dt_tensor *t)
{
    own[nown++] = t;
    return t;
}

static dt_tensor *bias_gelu(dt_tensor *const in[])
{
    dt_tensor *a, *y;
    BENCH_CHECK(dt_binary(DT_BINARY_ADD, in[0], in[2], NULL, &a));
    BENCH_CHECK(dt_unary(DT_UNARY_GELU, keep(a), NULL, &y));
    return y;
}

static dt_tensor *residual(dt_tensor *const in[])
{
    dt_tensor *a, *m, *y;
    BENCH_CHECK(dt_binary(DT_BINARY_ADD, in[1], in[2], NULL, &a));
    BENCH_CHECK(dt_binary(DT_BINARY_MUL, keep(a), keep(scalar(DT_DTYPE_F32, 0.5)), NULL, &m));
    BENCH_CHECK(dt_binary(DT_BINARY_ADD, in[0], keep(m), NULL, &y));
    return y;
}

static dt_tensor *cast_chain(dt_tensor *const in[])
{
    dt_tensor *c, *a, *g, *y;
    BENCH_CHECK(dt_cast(in[0], DT_DTYPE_F32, NULL, &c));
    BENCH_CHECK(dt_binary(DT_BINARY_ADD, keep(c), in[2], NULL, &a));
    BENCH_CHECK(dt_unary(DT_UNARY_GELU, keep(a), NULL, &g));
    BENCH_CHECK(dt_cast(keep(g), DT_DTYPE_BF16, NULL, &y));
    return y;
}

static dt_tensor *sum_square(dt_tensor *const in[])
{
    dt_tensor *s, *y;
    BENCH_CHECK(dt_unary(DT_UNARY_SQUARE, in[0], NULL, &s));
    BENCH_CHECK(dt_reduce(DT_REDUCE_SUM, keep(s), 2, (int[]){0, 1}, false, NULL, &y));
    return y;
}

static dt_tensor *product_sum(dt_tensor *const in[], int axis)
{
    dt_tensor *m, *y;
    BENCH_CHECK(dt_binary(DT_BINARY_MUL, in[0], in[1], NULL, &m));
    BENCH_CHECK(dt_reduce(DT_REDUCE_SUM, keep(m), 1, &axis, true, NULL, &y));
    return y;
}

static dt_tensor *row_sum(dt_tensor *const in[])
{
    return product_sum(in, 1);
}

static dt_tensor *col_sum(dt_tensor *const in[])
{
    return product_sum(in, 0);
}

typedef struct chain {
    const char *name;
    dt_tensor *(*build)(dt_tensor *const in[]);
    dt_dtype xdtype; /* x's and y's */
} chain;

static dt_function *trace(const chain *c, const dt_layout *l2, const dt_layout *l1,
                          const int64_t shape[2], bool fuse)
{
    setenv("DTENSOR_FUSION", fuse ? "1" : "0", 1);
    dt_function *f;
    dt_tensor *in[3], *y;
    BENCH_CHECK(dt_function_begin(&f));
    BENCH_CHECK(dt_function_input(f, l2, c->xdtype, 2, shape, &in[0]));
    BENCH_CHECK(dt_function_input(f, l2, c->xdtype, 2, shape, &in[1]));
    BENCH_CHECK(dt_function_input(f, l1, DT_DTYPE_F32, 1, &shape[1], &in[2]));
    nown = 0;
    y = c->build(in);
    BENCH_CHECK(dt_function_end(f, 1, &y));
    for (int i = 0; i < nown; i++)
        dt_tensor_free(own[i]);
    for (int i = 0; i < 3; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(y);
    unsetenv("DTENSOR_FUSION");
    return f;
}

static double run_once(const dt_function *f, dt_tensor *const in[])
{
    dt_tensor *y;
    double t0 = bench_now();
    BENCH_CHECK(dt_function_run(f, 3, (const dt_tensor *const *)in, 1, &y));
    BENCH_CHECK(dt_tensor_wait(y));
    double t = bench_now() - t0;
    dt_tensor_free(y);
    return t;
}

int main(int argc, char **argv)
{
    int64_t rows = argc > 1 ? atoll(argv[1]) : 1024, cols = argc > 2 ? atoll(argv[2]) : 3072;
    int reps = argc > 3 ? atoi(argv[3]) : 21;
    BENCH_CHECK(dt_init(NULL));
    int nd = dt_num_local_devices(DT_DEVICE_CPU);
    char spec[32];
    snprintf(spec, sizeof spec, "rows=%d", nd);
    BENCH_CHECK(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &mesh));
    dt_layout l2, l1;
    BENCH_CHECK(dt_layout_parse(mesh, "rows,unsharded", &l2));
    BENCH_CHECK(dt_layout_replicated(mesh, 1, &l1));
    const int64_t shape[2] = {rows, cols};
    const chain chains[] = {
        {"bias_gelu", bias_gelu, DT_DTYPE_F32},    {"residual", residual, DT_DTYPE_F32},
        {"cast_chain", cast_chain, DT_DTYPE_BF16}, {"sum_square", sum_square, DT_DTYPE_F32},
        {"row_sum", row_sum, DT_DTYPE_F32},        {"col_sum", col_sum, DT_DTYPE_F32}};
    printf("chain,devices,rows,cols,unfused_ns_per_element,fused_ns_per_element,ratio\n");
    for (size_t c = 0; c < sizeof chains / sizeof *chains; c++) {
        dt_tensor *in[3];
        for (int i = 0; i < 2; i++) {
            dt_op_options o = {.layout = &l2};
            dt_tensor *t;
            BENCH_CHECK(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, (uint64_t)i, -2, 2, &o, &t));
            BENCH_CHECK(dt_cast(t, chains[c].xdtype, NULL, &in[i]));
            dt_tensor_free(t);
        }
        dt_op_options o = {.layout = &l1};
        BENCH_CHECK(dt_random_uniform(DT_DTYPE_F32, 1, &cols, 1, 2, -1, 1, &o, &in[2]));
        dt_function *fu = trace(&chains[c], &l2, &l1, shape, false),
                    *ff = trace(&chains[c], &l2, &l1, shape, true);
        double *tu = malloc(sizeof(double) * (size_t)reps),
               *tf = malloc(sizeof(double) * (size_t)reps);
        run_once(fu, in);
        run_once(ff, in);
        for (int r = 0; r < reps; r++) {
            tu[r] = run_once(fu, in);
            tf[r] = run_once(ff, in);
        }
        qsort(tu, (size_t)reps, sizeof *tu, bench_cmp_double);
        qsort(tf, (size_t)reps, sizeof *tf, bench_cmp_double);
        double n = (double)(rows * cols), mu = tu[reps / 2], mf = tf[reps / 2];
        printf("%s,%d,%lld,%lld,%.3f,%.3f,%.2f\n", chains[c].name, nd, (long long)rows,
               (long long)cols, 1e9 * mu / n, 1e9 * mf / n, mu / mf);
        fflush(stdout);
        free(tu);
        free(tf);
        dt_function_free(fu);
        dt_function_free(ff);
        for (int i = 0; i < 3; i++)
            dt_tensor_free(in[i]);
    }
    /* AdamW: two optimizers on two variables, one traced (at its first apply) unfused */
    dt_variable *var[2];
    dt_optimizer *opt[2];
    dt_tensor *g;
    dt_op_options o = {.layout = &l2};
    BENCH_CHECK(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 3, -1, 1, &o, &g));
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_ADAMW, .learning_rate = 1e-3};
    double *t[2] = {malloc(sizeof(double) * (size_t)reps), malloc(sizeof(double) * (size_t)reps)};
    for (int k = 0; k < 2; k++) {
        BENCH_CHECK(dt_variable_create(g, &var[k]));
        BENCH_CHECK(dt_optimizer_create(&oc, &opt[k]));
        setenv("DTENSOR_FUSION", k ? "1" : "0", 1);
        BENCH_CHECK(dt_optimizer_apply(opt[k], 1, &var[k], (const dt_tensor *const *)&g));
        unsetenv("DTENSOR_FUSION");
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            double t0 = bench_now();
            BENCH_CHECK(dt_optimizer_apply(opt[k], 1, &var[k], (const dt_tensor *const *)&g));
            BENCH_CHECK(dt_tensor_wait(dt_variable_value(var[k])));
            t[k][r] = bench_now() - t0;
        }
    for (int k = 0; k < 2; k++)
        qsort(t[k], (size_t)reps, sizeof *t[k], bench_cmp_double);
    double n = (double)(rows * cols), mu = t[0][reps / 2], mf = t[1][reps / 2];
    printf("adamw,%d,%lld,%lld,%.3f,%.3f,%.2f\n", nd, (long long)rows, (long long)cols,
           1e9 * mu / n, 1e9 * mf / n, mu / mf);
    for (int k = 0; k < 2; k++) {
        free(t[k]);
        dt_optimizer_free(opt[k]);
        dt_variable_free(var[k]);
    }
    dt_tensor_free(g);
    dt_mesh_free(mesh);
    BENCH_CHECK(dt_finalize());
    return 0;
}
