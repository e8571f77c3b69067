/* Random tensors: dt_random_uniform and dt_random_normal, f32 and f64, of `elements` elements
 * sharded over every local device (rows of a [elements / 1024, 1024] tensor). Prints CSV:
 *   dtype,distribution,elements,reps,best_s,median_s,ns_per_element,cpu_s
 * best and median of `reps` calls (each waited for) after one untimed call; ns_per_element from
 * the best; cpu_s: the process's CPU time (every thread) of the median call. Public API only, so
 * the same binary times another build of the library (its RUNPATH names the build's
 * libdtensor, or LD_LIBRARY_PATH):
 *
 *   DTENSOR_CPU_DEVICES=1 build/benchmarks/bench_random [elements] [reps]   (10000000 5)
 */
#include <dtensor.h>

#include "bench.h"

#include <stdio.h>
#include <stdlib.h>

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    long long elements = argc > 1 ? atoll(argv[1]) : 10000000;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (elements < 1024 || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: %s [elements >= 1024] [reps 1..99]\n", argv[0]);
        return 2;
    }
    dt_layout l;
    dt_mesh *mesh = bench_rows_mesh(&l);
    dt_op_options o = {.layout = &l};
    int64_t shape[2] = {elements / 1024, 1024};
    static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64};
    printf("dtype,distribution,elements,reps,best_s,median_s,ns_per_element,cpu_s\n");
    for (int d = 0; d < 2; d++)
        for (int normal = 0; normal < 2; normal++) {
            double wall[100], cpu[100];
            for (int r = 0; r <= reps; r++) {
                dt_tensor *t;
                double w0 = bench_now(), c0 = cpu_now();
                if (normal)
                    BENCH_CHECK(
                        dt_random_normal(dtypes[d], 2, shape, 7, (uint64_t)r, 0, 0.02, &o, &t));
                else
                    BENCH_CHECK(
                        dt_random_uniform(dtypes[d], 2, shape, 7, (uint64_t)r, -1, 1, &o, &t));
                BENCH_CHECK(dt_tensor_wait(t));
                double w1 = bench_now(), c1 = cpu_now();
                dt_tensor_free(t);
                if (r) { /* the first call is untimed (allocation, page faults) */
                    wall[r - 1] = w1 - w0;
                    cpu[r - 1] = c1 - c0;
                }
            }
            double sorted[100];
            for (int r = 0; r < reps; r++)
                sorted[r] = wall[r];
            qsort(sorted, (size_t)reps, sizeof *sorted, bench_cmp_double);
            double med = sorted[reps / 2], med_cpu = 0;
            for (int r = 0; r < reps; r++)
                if (wall[r] == med)
                    med_cpu = cpu[r];
            int64_t count = shape[0] * shape[1];
            printf("%s,%s,%lld,%d,%.4f,%.4f,%.2f,%.4f\n", dt_dtype_name(dtypes[d]),
                   normal ? "normal" : "uniform", (long long)count, reps, sorted[0], med,
                   1e9 * sorted[0] / (double)count, med_cpu);
        }
    dt_mesh_free(mesh);
    BENCH_CHECK(dt_finalize());
    return 0;
}
