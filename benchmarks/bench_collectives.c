/* Collective bandwidth across clients, beside raw MPI on the same buffers in the same run.
 *
 *   mpiexec.mpich -n 2 build/benchmarks/bench_collectives sweep [max_bytes]
 *   mpiexec.mpich -n 8 build/benchmarks/bench_collectives latency
 *   BENCH_ALGORITHM=ring mpiexec.mpich -n 2 ...   (a mesh algorithm other than auto)
 *   scripts/multihost.sh -H 2 -p block -n 4 build/benchmarks/bench_collectives hosts [max_bytes]
 *
 * hosts: with the clients on several hosts, the by-host path against the flat one in the same
 * run: all-reduce, all-gather and reduce-scatter from 1 KiB to 64 MiB; "by_host" and "flat" are
 * dtensor forced to each path (DTENSOR_COLLECTIVES_BY_HOST's 1 and 0), "auto" its choice (the
 * path it took is the last column), "mpi_nb" MPI's own nonblocking call over every client;
 * ratio = busbw / flat's busbw. First, calibration lines: latency and bandwidth from client 0
 * to a client of its host and to one of another host (the cost model's constants).
 *
 * sweep: all-reduce, all-gather, reduce-scatter and all-to-all (f32, one device per client)
 * from 4 KiB to 256 MiB; bus bandwidth as nccl-tests defines it (size S = the per-rank
 * all-reduce buffer, the gathered / scattered / exchanged total otherwise; algbw = S / t;
 * busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for the others). "mpi" is the blocking
 * MPI call on the same buffers; "mpi_nb" its nonblocking form completed by MPI_Test and
 * sched_yield (what dtensor's own wait does); ratio = dtensor busbw / mpi busbw.
 * latency: 1 KiB all-reduce, median of many, dtensor beside MPI_Iallreduce + yield.
 * CSV on stdout (rank 0). A benchmark, not a test: the machine is shared and noisy. */
#include "../collectives/collectives.h"
#include "bench.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Median of per-iteration times, each the slowest rank's (so all ranks report alike). */
static double median(double *t, int n)
{
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, t, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req);
    dt__mpi_wait_all(1, &req);
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

enum { IMPL_DT, IMPL_MPI, IMPL_MPI_NB, IMPL_COUNT };
static const char *const impl_names[] = {"dtensor", "mpi", "mpi_nb"};

/* One call of `kind` on n floats per block (all-reduce: n elements in all). */
static void run_once(const dt_mesh *m, dt__coll_kind kind, int impl, float *send, float *recv,
                     int n, int ranks)
{
    if (impl == IMPL_DT) {
        const void *s[1] = {send};
        void *r[1] = {recv};
        dt__coll c = {.kind = kind,
                      .dtype = DT_DTYPE_F32,
                      .op = DT_REDUCE_SUM,
                      .axes = 1u,
                      .send = s,
                      .recv = r,
                      .count = n,
                      .cause = "bench"};
        if (dt__collective(m, &c) != DT_OK) {
            fprintf(stderr, "dtensor %s failed: %s\n", dt__coll_kind_name(kind), dt_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        return;
    }
    MPI_Comm w = MPI_COMM_WORLD;
    MPI_Request req;
    int *counts = NULL;
    if (kind == DT__COLL_REDUCE_SCATTER) {
        counts = malloc(sizeof(int) * (size_t)ranks);
        for (int i = 0; i < ranks; i++)
            counts[i] = n;
    }
    bool nb = impl == IMPL_MPI_NB;
    switch (kind) {
    case DT__COLL_ALL_REDUCE:
        if (nb)
            MPI_Iallreduce(send, recv, n, MPI_FLOAT, MPI_SUM, w, &req);
        else
            MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, w);
        break;
    case DT__COLL_ALL_GATHER:
        if (nb)
            MPI_Iallgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, w, &req);
        else
            MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, w);
        break;
    case DT__COLL_REDUCE_SCATTER:
        if (nb)
            MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, w, &req);
        else
            MPI_Reduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, w);
        break;
    default:
        if (nb)
            MPI_Ialltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, w, &req);
        else
            MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, w);
        break;
    }
    if (nb)
        bench_wait(&req, false);
    free(counts);
}

static void sweep(const dt_mesh *m, int ranks, size_t max_bytes)
{
    const dt__coll_kind kinds[] = {DT__COLL_ALL_REDUCE, DT__COLL_ALL_GATHER,
                                   DT__COLL_REDUCE_SCATTER, DT__COLL_ALL_TO_ALL};
    float *send = aligned_alloc(64, max_bytes), *recv = aligned_alloc(64, max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++)
        send[i] = (float)(i % 7);
    memset(recv, 0, max_bytes);
    if (dt_client_id() == 0)
        printf("bench,kind,bytes,ranks,impl,time_us,algbw_GBps,busbw_GBps,ratio_to_mpi\n");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
            /* S: the all-reduce buffer, else the total; n floats per block */
            int n = (int)(kinds[k] == DT__COLL_ALL_REDUCE ? bytes / 4 : bytes / 4 / (size_t)ranks);
            int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 20 : 5;
            double t[IMPL_COUNT], times[200];
            for (int impl = 0; impl < IMPL_COUNT; impl++) {
                for (int w = 0; w < 2; w++)
                    run_once(m, kinds[k], impl, send, recv, n, ranks);
                for (int i = 0; i < iters; i++) {
                    bench_barrier(MPI_COMM_WORLD, false);
                    double t0 = bench_now();
                    run_once(m, kinds[k], impl, send, recv, n, ranks);
                    times[i] = bench_now() - t0;
                }
                t[impl] = median(times, iters);
            }
            dt_ledger_clear();
            double f = kinds[k] == DT__COLL_ALL_REDUCE ? 2.0 * (ranks - 1) / ranks
                                                       : (double)(ranks - 1) / ranks;
            for (int impl = 0; impl < IMPL_COUNT && dt_client_id() == 0; impl++)
                printf("sweep,%s,%zu,%d,%s,%.2f,%.3f,%.3f,%.3f\n", dt__coll_kind_name(kinds[k]),
                       bytes, ranks, impl_names[impl], t[impl] * 1e6, bytes / t[impl] / 1e9,
                       bytes / t[impl] / 1e9 * f, t[IMPL_MPI] / t[impl]);
            if (dt_client_id() == 0)
                printf("overhead,%s,%zu,%d,dtensor-mpi_nb,%.2f,,,\n", dt__coll_kind_name(kinds[k]),
                       bytes, ranks, (t[IMPL_DT] - t[IMPL_MPI_NB]) * 1e6);
            fflush(stdout);
        }
    free(send);
    free(recv);
}

/* Half the round trip of `bytes` between client 0 and client `peer` (a yielding wait, as
 * dtensor's), the best of `iters`. Every client calls it; the others wait at the barrier. */
static double ping(int peer, size_t bytes, char *buf, int iters)
{
    int me = dt_client_id();
    double best = 1e30;
    for (int i = 0; i < iters; i++) {
        bench_barrier(MPI_COMM_WORLD, false);
        if (me != 0 && me != peer)
            continue;
        MPI_Request q;
        int other = me == 0 ? peer : 0;
        double t0 = bench_now();
        for (int leg = 0; leg < 2; leg++) {
            if ((leg == 0) == (me == 0))
                MPI_Isend(buf, (int)bytes, MPI_BYTE, other, 7, MPI_COMM_WORLD, &q);
            else
                MPI_Irecv(buf, (int)bytes, MPI_BYTE, other, 7, MPI_COMM_WORLD, &q);
            bench_wait(&q, false);
        }
        double t = (bench_now() - t0) / 2;
        best = t < best ? t : best;
    }
    return best;
}

/* The cost model's constants (collectives/hosts.c): latency (8 bytes) and bandwidth (16 MiB)
 * from client 0 to a client of its host and to one of another host. */
static void calibrate(size_t max_bytes)
{
    int n = dt_num_clients(), same = -1, other = -1;
    for (int c = 1; c < n; c++) {
        if (dt__host_of(c) == dt__host_of(0) && same < 0)
            same = c;
        if (dt__host_of(c) != dt__host_of(0) && other < 0)
            other = c;
    }
    size_t big = max_bytes < ((size_t)16 << 20) ? max_bytes : (size_t)16 << 20;
    char *buf = calloc(1, big);
    const int peers[2] = {same, other};
    const char *where[2] = {"in_host", "between_hosts"};
    for (int i = 0; i < 2; i++) {
        if (peers[i] < 0)
            continue;
        double a = ping(peers[i], 8, buf, 200), b = ping(peers[i], big, buf, 10);
        if (dt_client_id() == 0)
            printf("calibration,%s,client %d,alpha_us %.2f,beta_GBps %.3f\n", where[i], peers[i],
                   a * 1e6, (double)big / b / 1e9);
    }
    free(buf);
}

static void hosts(const dt_mesh *m, int ranks, size_t max_bytes)
{
    calibrate(max_bytes);
    const dt__coll_kind kinds[] = {DT__COLL_ALL_REDUCE, DT__COLL_ALL_GATHER,
                                   DT__COLL_REDUCE_SCATTER};
    enum { BY_HOST, FLAT, AUTO, MPI_NB, N_IMPL };
    static const char *const names[] = {"by_host", "flat", "auto", "mpi_nb"};
    float *send = aligned_alloc(64, max_bytes), *recv = aligned_alloc(64, max_bytes);
    for (size_t i = 0; i < max_bytes / 4; i++)
        send[i] = (float)(i % 7);
    memset(recv, 0, max_bytes);
    if (dt_client_id() == 0)
        printf("bench,kind,bytes,ranks,impl,time_us,busbw_GBps,ratio_to_flat,path\n");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
            int n = (int)(kinds[k] == DT__COLL_ALL_REDUCE ? bytes / 4 : bytes / 4 / (size_t)ranks);
            int iters = bytes <= (1 << 20) ? 100 : bytes <= (16 << 20) ? 10 : 4;
            double t[N_IMPL], times[100];
            char path[64] = "";
            for (int impl = 0; impl < N_IMPL; impl++) {
                dt__coll_set_by_host(impl == BY_HOST ? 1 : impl == FLAT ? 0 : 2);
                int how = impl == MPI_NB ? IMPL_MPI_NB : IMPL_DT;
                for (int w = 0; w < 2; w++)
                    run_once(m, kinds[k], how, send, recv, n, ranks);
                for (int i = 0; i < iters; i++) {
                    bench_barrier(MPI_COMM_WORLD, false);
                    double t0 = bench_now();
                    run_once(m, kinds[k], how, send, recv, n, ranks);
                    times[i] = bench_now() - t0;
                }
                t[impl] = median(times, iters);
                dt_ledger_entry e;
                if (impl == AUTO && dt_ledger_entry_get(dt_ledger_size() - 1, &e) == DT_OK)
                    snprintf(path, sizeof path, "%s", e.backend);
                dt_ledger_clear();
            }
            double f = kinds[k] == DT__COLL_ALL_REDUCE ? 2.0 * (ranks - 1) / ranks
                                                       : (double)(ranks - 1) / ranks;
            for (int impl = 0; impl < N_IMPL && dt_client_id() == 0; impl++)
                printf("hosts,%s,%zu,%d,%s,%.2f,%.3f,%.3f,%s\n", dt__coll_kind_name(kinds[k]),
                       bytes, ranks, names[impl], t[impl] * 1e6, bytes / t[impl] / 1e9 * f,
                       t[FLAT] / t[impl], impl == AUTO ? path : "");
            fflush(stdout);
        }
    dt__coll_set_by_host(2);
    free(send);
    free(recv);
}

static void latency(const dt_mesh *m, int ranks)
{
    float send[256], recv[256];
    for (int i = 0; i < 256; i++)
        send[i] = (float)i;
    enum { ITERS = 400 };
    double times[ITERS];
    if (dt_client_id() == 0)
        printf("bench,kind,bytes,ranks,impl,median_us,mean_us\n");
    for (int impl = 0; impl < IMPL_COUNT; impl++) {
        /* blocking MPI spins when ranks outnumber cores (docs/ARCHITECTURE.md, toolchain): a few
         * calls only */
        int iters = impl == IMPL_MPI ? 20 : ITERS;
        for (int w = 0; w < 5; w++)
            run_once(m, DT__COLL_ALL_REDUCE, impl, send, recv, 256, ranks);
        bench_barrier(MPI_COMM_WORLD, false);
        double t0 = bench_now();
        for (int i = 0; i < iters; i++) {
            double t1 = bench_now();
            run_once(m, DT__COLL_ALL_REDUCE, impl, send, recv, 256, ranks);
            times[i] = bench_now() - t1;
        }
        double mean = (bench_now() - t0) / iters;
        double med = median(times, iters);
        if (dt_client_id() == 0)
            printf("latency,all_reduce,1024,%d,%s,%.2f,%.2f\n", ranks, impl_names[impl], med * 1e6,
                   mean * 1e6);
        dt_ledger_clear();
    }
}

int main(int argc, char **argv)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    int ranks = dt_num_clients();
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    dt_mesh *m = NULL;
    if (dt_num_local_devices(DT_DEVICE_CPU) != 1 ||
        dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK) {
        fprintf(stderr, "needs one CPU device per client: %s\n", dt_last_error());
        dt_finalize();
        return 1;
    }
    /* BENCH_ALGORITHM=ring (or any name of dt_collective_algorithm) instead of auto */
    const char *alg = getenv("BENCH_ALGORITHM");
    for (int a = 0; alg && a < DT_ALGORITHM_COUNT; a++)
        if (strcmp(alg, dt_collective_algorithm_name((dt_collective_algorithm)a)) == 0)
            dt_mesh_set_collective_algorithm(m, (dt_collective_algorithm)a);
    if (argc > 1 && strcmp(argv[1], "latency") == 0)
        latency(m, ranks);
    else if (argc > 1 && strcmp(argv[1], "hosts") == 0)
        hosts(m, ranks, argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)64 << 20);
    else
        sweep(m, ranks, argc > 2 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)256 << 20);
    dt_mesh_free(m);
    dt_finalize();
    return 0;
}
