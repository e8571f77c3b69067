/* DTENSOR_CHECK_COLLECTIVES=1: a client that issues a different collective (here: another
 * count, other uneven counts, another kind) gets an error naming both sides' values on every
 * client, within 5 s, instead of a hang; a client whose collective fails validation fails
 * every client with its message; the next, matching collective still works. */
#include "../coll_ref.h"
#include "tap.h"

#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void)
{
    /* MPI outlives a failed dt_init when the program started it */
    int provided, me0, n0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me0);
    MPI_Comm_size(MPI_COMM_WORLD, &n0);
    /* the setting on the odd clients only: dt_init fails on every client, naming it, instead of
     * the checking clients waiting in an agreement the others never make */
    if (me0 % 2)
        setenv("DTENSOR_CHECK_COLLECTIVES", "1", 1);
    double t_init = now();
    dt_status some = dt_init(NULL);
    double some_took = now() - t_init;
    char some_msg[512];
    snprintf(some_msg, sizeof some_msg, "%s", dt_last_error());
    setenv("DTENSOR_CHECK_COLLECTIVES", "1", 1);
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    tap_check(n0 < 2 || (some == DT_ERR_MISMATCH && strstr(some_msg, "DTENSOR_CHECK_COLLECTIVES") &&
                         strstr(some_msg, "client 0 has off") && strstr(some_msg, "has on") &&
                         some_took < 5),
              "DTENSOR_CHECK_COLLECTIVES on the odd clients only: dt_init fails on every client "
              "in %.3f s (%s: %s)",
              some_took, dt_status_name(some), some_msg);
    int me = dt_client_id(), n = dt_num_global_devices(DT_DEVICE_CPU);
    int nl = dt_num_local_devices(DT_DEVICE_CPU);
    char spec[64];
    snprintf(spec, sizeof spec, "x=%d", n);
    dt_mesh *m = NULL;
    if (!tap_check(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) == DT_OK, "mesh %s", spec))
        return tap_done();
    float *buf = calloc((size_t)n * 128, sizeof *buf);
    const void *send[64];
    void *recv[64];
    for (int i = 0; i < nl && i < 64; i++) {
        send[i] = buf;
        recv[i] = buf + (size_t)(i + 1) * 128;
    }
    /* client 1 passes count 101 where the others pass 100 */
    dt__coll c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_F32,
                  .op = DT_REDUCE_SUM,
                  .axes = 1u,
                  .send = send,
                  .recv = recv,
                  .count = me == 1 ? 101 : 100};
    double t0 = now();
    dt_status s = dt__collective(m, &c);
    double dt = now() - t0;
    const char *e = dt_last_error();
    tap_check(s == DT_ERR_MISMATCH && strstr(e, "count 100") && strstr(e, "count 101") && dt < 5,
              "count mismatch fails on every client in %.3f s: %s", dt, e);

    /* uneven all-gather, client 1 passes other counts */
    int64_t *counts = calloc((size_t)n, sizeof *counts);
    const int64_t *cs[64];
    for (int r = 0; r < n; r++)
        counts[r] = r == 0 && me == 1 ? 3 : 2;
    for (int i = 0; i < nl && i < 64; i++)
        cs[i] = counts;
    dt__coll g = {.kind = DT__COLL_ALL_GATHER,
                  .dtype = DT_DTYPE_I32,
                  .axes = 1u,
                  .send = send,
                  .recv = recv,
                  .counts = cs};
    t0 = now();
    s = dt__collective(m, &g);
    dt = now() - t0;
    e = dt_last_error();
    char want[64], want1[64];
    snprintf(want, sizeof want, "totalling %d", 2 * n);
    snprintf(want1, sizeof want1, "totalling %d", 2 * n + 1);
    tap_check(s == DT_ERR_MISMATCH && strstr(e, want) && strstr(e, want1) && dt < 5,
              "uneven counts mismatch in %.3f s: %s", dt, e);

    /* another kind */
    dt__coll k = c;
    k.count = 100;
    if (me == 1)
        k.kind = DT__COLL_BROADCAST;
    s = dt__collective(m, &k);
    e = dt_last_error();
    tap_check(s == DT_ERR_MISMATCH && strstr(e, "all_reduce") && strstr(e, "broadcast"),
              "kind mismatch: %s", e);

    /* a client whose collective fails validation (a root outside the group): every client
     * fails with its message (read within bounds: it once overflowed a buffer here) */
    dt__coll bc = c;
    bc.kind = DT__COLL_BROADCAST;
    bc.count = 100;
    bc.root = me == 1 ? 1000 : 0;
    s = dt__collective(m, &bc);
    e = dt_last_error();
    tap_check(s == DT_ERR_ARG && strstr(e, "root 1000") && (me == 1 || strstr(e, "client 1: ")),
              "a failing client fails every client: %s", e);

    /* and then a matching collective runs and is right */
    bool ok;
    char why[512] = "";
    ref_case r = {.kind = DT__COLL_REDUCE_SCATTER,
                  .dtype = DT_DTYPE_I64,
                  .op = DT_REDUCE_SUM,
                  .axes = 1u,
                  .count = 4};
    s = ref_run(m, &r, &ok, why, sizeof why);
    tap_check(s == DT_OK && ok, "matching collective after the errors: %s %s",
              s == DT_OK ? "" : dt_last_error(), why);
    free(counts);
    free(buf);
    dt_mesh_free(m);
    int rc = tap_done();
    dt_finalize();
    MPI_Finalize();
    return rc;
}
