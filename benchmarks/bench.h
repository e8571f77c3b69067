/* What every benchmark program shares: a fatal status check, a row-sharded mesh of every CPU
 * device, a monotonic clock, and waits on MPI requests that either yield (short waits inside a
 * timed region) or sleep (clients waiting while one client times a baseline alone: a yielding
 * loop still takes a core from a 2-thread GEMM on this 2-core machine). */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#include <mpi.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* For programs that include dtensor.h. */
#define BENCH_CHECK(expr)                                                                \
    do {                                                                                 \
        dt_status s_ = (expr);                                                           \
        if (s_ != DT_OK) {                                                               \
            fprintf(stderr, "%s: %s: %s\n", #expr, dt_status_name(s_), dt_last_error()); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

#ifdef DTENSOR_H
/* For programs that include dtensor.h before this header: dt_init, then a 1-D mesh "x" of every
 * CPU device of every client, and in *rows the layout of a matrix with its rows sharded over it
 * ("x,unsharded"). */
static inline dt_mesh *bench_rows_mesh(dt_layout *rows)
{
    BENCH_CHECK(dt_init(NULL));
    int n = dt_num_global_devices(DT_DEVICE_CPU);
    const char *axis = "x";
    dt_mesh *mesh;
    BENCH_CHECK(dt_mesh_create(1, &axis, &n, DT_DEVICE_CPU, &mesh));
    BENCH_CHECK(dt_layout_parse(mesh, "x,unsharded", rows));
    return mesh;
}
#endif

/* qsort's comparison of doubles, for medians. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void bench_wait(MPI_Request *req, bool sleepy)
{
    for (int done = 0;;) {
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done)
            return;
        if (sleepy)
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        else
            sched_yield();
    }
}

/* A barrier over comm (none for MPI_COMM_NULL, a single client without MPI). */
static inline void bench_barrier(MPI_Comm comm, bool sleepy)
{
    if (comm == MPI_COMM_NULL)
        return;
    MPI_Request req;
    MPI_Ibarrier(comm, &req);
    bench_wait(&req, sleepy);
}

/* A "Vm...:" line of /proc/self/status, in KiB (0 when absent). */
static inline long bench_status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n))
            v = atol(line + n);
    if (f)
        fclose(f);
    return v;
}

/* Memory one benchmark case costs the process: minor page faults (getrusage) and the resident
 * set's high-water mark above the resident set at the start. Linux restarts the high-water
 * mark (VmHWM) when 5 is written to /proc/self/clear_refs, so each case's peak is its own. */
typedef struct bench_usage {
    long faults0, rss0_kib;
} bench_usage;

static inline bench_usage bench_usage_start(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (bench_usage){.faults0 = ru.ru_minflt, .rss0_kib = bench_status_kib("VmRSS:")};
}

/* Minor faults since the start; peak resident set and its excess over the start, in KiB. */
static inline void bench_usage_end(const bench_usage *u, long *faults, long *peak_kib,
                                   long *extra_kib)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *faults = ru.ru_minflt - u->faults0;
    *peak_kib = bench_status_kib("VmHWM:");
    *extra_kib = *peak_kib - u->rss0_kib;
}

#endif /* DT_BENCH_H */
