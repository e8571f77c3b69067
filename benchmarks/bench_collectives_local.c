/* In-process all-reduce over local devices (shared memory, device worker threads) against
 * memcpy bandwidth of a buffer of the same size, in the same run.
 *
 *   DTENSOR_CPU_DEVICES=2 build/benchmarks/bench_collectives_local [max_bytes]
 *
 * busbw (nccl-tests) = S / t x 2(g-1)/g for g devices, S the per-device buffer; memcpy_GBps =
 * S / (time of one memcpy of S bytes); ratio = busbw / memcpy_GBps. CSV on stdout. */
#include "../collectives/collectives.h"
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    int g = dt_num_local_devices(DT_DEVICE_CPU);
    size_t max_bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)256 << 20;
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", g);
    dt_mesh *m = NULL;
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK) {
        fprintf(stderr, "mesh: %s\n", dt_last_error());
        return 1;
    }
    float *buf[64];
    const void *send[64];
    void *recv[64];
    for (int i = 0; i < g && i < 64; i++) {
        buf[i] = aligned_alloc(64, max_bytes);
        memset(buf[i], 0, max_bytes);
        send[i] = recv[i] = buf[i]; /* in place, as gradients are reduced */
    }
    char *src = aligned_alloc(64, max_bytes), *dst = aligned_alloc(64, max_bytes);
    memset(src, 1, max_bytes);
    memset(dst, 0, max_bytes);
    printf("bench,kind,bytes,devices,time_us,busbw_GBps,memcpy_GBps,ratio\n");
    for (size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
        int iters = bytes <= (4 << 20) ? 100 : 8;
        double t[100], c[100];
        dt__coll call = {.kind = DT__COLL_ALL_REDUCE,
                         .dtype = DT_DTYPE_F32,
                         .op = DT_REDUCE_SUM,
                         .axes = 1u,
                         .send = send,
                         .recv = recv,
                         .count = (int64_t)(bytes / 4),
                         .cause = "bench"};
        for (int i = 0; i < iters + 2; i++) {
            double t0 = bench_now();
            memcpy(dst, src, bytes);
            double t1 = bench_now();
            if (dt__collective(m, &call) != DT_OK) {
                fprintf(stderr, "all-reduce: %s\n", dt_last_error());
                return 1;
            }
            double t2 = bench_now();
            if (i >= 2) {
                c[i - 2] = t1 - t0;
                t[i - 2] = t2 - t1;
            }
        }
        qsort(t, (size_t)iters, sizeof *t, bench_cmp_double);
        qsort(c, (size_t)iters, sizeof *c, bench_cmp_double);
        double tm = t[iters / 2], cm = c[iters / 2];
        double bus = bytes / tm / 1e9 * 2.0 * (g - 1) / g, mem = bytes / cm / 1e9;
        printf("local,all_reduce,%zu,%d,%.2f,%.3f,%.3f,%.3f\n", bytes, g, tm * 1e6, bus, mem,
               bus / mem);
        fflush(stdout);
        dt_ledger_clear();
    }
    for (int i = 0; i < g && i < 64; i++)
        free(buf[i]);
    free(src);
    free(dst);
    dt_mesh_free(m);
    dt_finalize();
    return 0;
}
