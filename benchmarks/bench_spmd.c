/* SPMD engine benchmarks (not timed tests). Prints CSV on stdout.
 *
 *   bench_spmd dispatch            eager dispatch from the program cache on a tiny tensor
 *                                  (a 1-device mesh and one of every device), microseconds per
 *                                  call: add and neg (no data exchange), a read of the
 *                                  sharded tensor, and an add whose result is replicated (an
 *                                  all-gather)
 *   bench_spmd matmul [n] [dtype]  matmul C = A B (default n = 4096, dtype f32; bf16 and f16
 *                                  widen each matrix to f32 for one sgemm and round the product
 *                                  once) for each expansion on a 1-D mesh of every device (run
 *                                  as 1 process x 2 devices, DTENSOR_CPU_DEVICES=2, or
 *                                  mpiexec.mpich -n 2 x 1 device), beside single-process f32
 *                                  OpenBLAS with 2 threads in the same run (client 0 measures it
 *                                  while the others wait)
 */
#include "bench.h"
#include "dt.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int);

static void dispatch(void)
{
    if (dt_client_id() == 0)
        printf("benchmark,mesh,op,us_per_op\n");
    char meshes[2][32] = {"x=1"};
    snprintf(meshes[1], sizeof meshes[1], "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    static const char *const ops[] = {"add f32[8]", "neg f32[8]", "read f32[8]",
                                      "all-gather add f32[8]"};
    for (int k = 0; k < 2; k++) {
        dt_mesh *m;
        if (dt_mesh_create_from_string(meshes[k], DT_DEVICE_CPU, &m) != DT_OK)
            continue;
        dt_layout l, rep;
        BENCH_CHECK(dt_layout_parse(m, "x", &l));
        BENCH_CHECK(dt_layout_parse(m, "unsharded", &rep));
        const int64_t shape[1] = {8};
        dt_op_options o = {.layout = &l};
        dt_tensor *a, *b;
        BENCH_CHECK(dt_ones(DT_DTYPE_F32, 1, shape, &o, &a));
        BENCH_CHECK(dt_ones(DT_DTYPE_F32, 1, shape, &o, &b));
        for (int op = 0; op < 4; op++) {
            /* 7 rounds of 3000 calls after 1000 to warm up, each round started together on
             * every client (a skew between clients would be counted as dispatch); the median */
            enum { ROUNDS = 7, ITERS = 3000 };
            double us[ROUNDS];
            for (int r = -1; r < ROUNDS; r++) {
                bench_barrier(dt__rt.world, false);
                double t0 = bench_now();
                for (int i = 0; i < (r < 0 ? 1000 : ITERS); i++) {
                    dt_tensor *c = NULL;
                    float host[8];
                    if (op == 0)
                        BENCH_CHECK(dt_binary(DT_BINARY_ADD, a, b, NULL, &c));
                    else if (op == 1)
                        BENCH_CHECK(dt_unary(DT_UNARY_NEG, a, NULL, &c));
                    else if (op == 2)
                        BENCH_CHECK(dt_tensor_read(a, host, sizeof host));
                    else
                        BENCH_CHECK(
                            dt_binary(DT_BINARY_ADD, a, b, &(dt_op_options){.layout = &rep}, &c));
                    dt_tensor_free(c);
                }
                if (r >= 0)
                    us[r] = (bench_now() - t0) / ITERS * 1e6;
            }
            qsort(us, ROUNDS, sizeof us[0], bench_cmp_double);
            if (dt_client_id() == 0)
                printf("dispatch,%s,%s,%.2f\n", meshes[k], ops[op], us[ROUNDS / 2]);
        }
        dt_tensor_free(a);
        dt_tensor_free(b);
        dt_mesh_free(m);
    }
}

static double best_of(int reps, dt_tensor *a, dt_tensor *b, const dt_layout *out)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        dt_op_options o = {.layout = out};
        dt_tensor *c;
        bench_barrier(dt__rt.world, false);
        double t0 = bench_now();
        BENCH_CHECK(dt_matmul(a, b, &o, &c));
        bench_barrier(dt__rt.world, false);
        double t = bench_now() - t0;
        best = t < best ? t : best;
        dt_tensor_free(c);
    }
    return best;
}

static void matmul(int64_t n, dt_dtype dtype)
{
    /* Baseline: one process, OpenBLAS with 2 threads, client 0 while the others wait. */
    double base = 0;
    if (dt_client_id() == 0) {
        float *a = malloc(sizeof(float) * (size_t)(n * n)),
              *b = malloc(sizeof(float) * (size_t)(n * n)),
              *c = malloc(sizeof(float) * (size_t)(n * n));
        for (int64_t i = 0; i < n * n; i++) {
            a[i] = (float)(i % 7) * 0.1f;
            b[i] = (float)(i % 5) * 0.1f;
        }
        openblas_set_num_threads(2);
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = bench_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1, a,
                        (int)n, b, (int)n, 0, c, (int)n);
            double t = bench_now() - t0;
            best = t < best ? t : best;
        }
        base = 2.0 * (double)n * n * n / best / 1e9;
        free(a);
        free(b);
        free(c);
    }
    openblas_set_num_threads(1);
    bench_barrier(dt__rt.world, true);
    int devices = dt_num_global_devices(DT_DEVICE_CPU);
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", devices);
    dt_mesh *m;
    BENCH_CHECK(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m));
    const int64_t shape[2] = {n, n};
    struct {
        const char *name, *a, *b, *c;
    } cases[] = {
        {"rows of A (B replicated, all-gather-free)", "x,unsharded", "unsharded,unsharded",
         "x,unsharded"},
        {"rows of A, B sharded on rows (all-gather B)", "x,unsharded", "x,unsharded",
         "x,unsharded"},
        {"contracting (reduce-scatter)", "unsharded,x", "x,unsharded", "x,unsharded"},
        {"contracting (all-reduce)", "unsharded,x", "x,unsharded", "unsharded,unsharded"},
        {"columns of B", "unsharded,unsharded", "unsharded,x", "unsharded,x"},
    };
    if (dt_client_id() == 0)
        printf("benchmark,clients,devices,n,dtype,expansion,seconds,gflops,"
               "ratio_to_openblas_f32_2_threads\n");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_layout la, lb, lc;
        BENCH_CHECK(dt_layout_parse(m, cases[k].a, &la));
        BENCH_CHECK(dt_layout_parse(m, cases[k].b, &lb));
        BENCH_CHECK(dt_layout_parse(m, cases[k].c, &lc));
        dt_tensor *a, *b;
        BENCH_CHECK(
            dt_random_uniform(dtype, 2, shape, 1, 1, 0, 1, &(dt_op_options){.layout = &la}, &a));
        BENCH_CHECK(
            dt_random_uniform(dtype, 2, shape, 1, 2, 0, 1, &(dt_op_options){.layout = &lb}, &b));
        double t = best_of(3, a, b, &lc);
        double gf = 2.0 * (double)n * n * n / t / 1e9;
        if (dt_client_id() == 0)
            printf("matmul,%d,%d,%lld,%s,%s,%.4f,%.1f,%.3f\n", dt_num_clients(), devices,
                   (long long)n, dt_dtype_name(dtype), cases[k].name, t, gf, gf / base);
        fflush(stdout);
        dt_tensor_free(a);
        dt_tensor_free(b);
    }
    if (dt_client_id() == 0)
        printf("baseline,1,1,%lld,f32,openblas sgemm 2 threads,,%.1f,1.000\n", (long long)n, base);
    dt_mesh_free(m);
}

int main(int argc, char **argv)
{
    dt_dtype dtype = DT_DTYPE_F32;
    for (int d = 0; argc > 3 && d < DT_DTYPE_COUNT; d++)
        if (strcmp(argv[3], dt_dtype_name((dt_dtype)d)) == 0)
            dtype = (dt_dtype)d;
    if (argc < 2 || (strcmp(argv[1], "dispatch") && strcmp(argv[1], "matmul")) ||
        (argc > 3 && strcmp(argv[3], dt_dtype_name(dtype)))) {
        fprintf(stderr, "usage: %s dispatch | matmul [n] [f32|f64|bf16|f16]\n", argv[0]);
        return 2;
    }
    dt_init_options o = {0};
    BENCH_CHECK(dt_init(&o));
    if (strcmp(argv[1], "dispatch") == 0)
        dispatch();
    else
        matmul(argc > 2 ? atoll(argv[2]) : 4096, dtype);
    BENCH_CHECK(dt_finalize());
    return 0;
}
