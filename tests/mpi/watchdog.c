/* The watchdog: the last client dies right after creating a mesh (it exits without a word).
 * With DTENSOR_TIMEOUT at 1 s, every survivor, within 5 s each:
 * 1. fails its next op (a matmul) in the op agreement with DT_ERR_COMM naming the op, the
 *    group (the agreement of all clients) and the clients not heard from (the dead one; with
 *    DTENSOR_AGREE_HOSTS=K, a client whose host leader gave up names the leader);
 * 2. fails a collective started without an agreement before it (the executor's all-reduce
 *    called directly, as after an agreement a client died in) with DT_ERR_COMM naming the
 *    collective, its mesh axes, the mesh and the group's clients;
 * 3. fails a barrier (the agreement channel at its next sequence number) the same way as 1.
 * Run under `mpiexec.mpich -disable-auto-cleanup` so that the launcher leaves the survivors
 * running. Prints TAP from client 0; every survivor checks and exits 1 when a check fails (a
 * dead client cannot take part in the usual combined verdict), and leaves without
 * dt_finalize, which would wait for the dead. */
#include "../coll_ref.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int me, n, failures, checks;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check(bool ok, const char *what, dt_status s, double took)
{
    checks++;
    failures += !ok;
    if (!ok)
        fprintf(stderr, "# client %d: %s failed after %.2f s (%s: %s)\n", me, what, took,
                dt_status_name(s), dt_last_error());
    if (me == 0)
        printf("%s %d - client %d of %d died: %s: %s after %.2f s (%s)\n", ok ? "ok" : "not ok",
               checks, n - 1, n, what, dt_status_name(s), took, dt_last_error());
}

/* The message names the dead client among those not heard from (alone, in a range or a
 * list), or the host's leader that gave up for this client (DTENSOR_AGREE_HOSTS=K). */
static bool names_missing(const char *e)
{
    const char *p = strstr(e, "not heard from ");
    if (!p)
        return strstr(e, "the leader of this client's host") != NULL;
    p += strlen("not heard from ");
    const char *end = strstr(p, ": a client died");
    for (end = end ? end : p + strlen(p); p < end; p++) {
        if (*p < '0' || *p > '9' || (p[-1] >= '0' && p[-1] <= '9'))
            continue;
        int lo = atoi(p), hi = lo;
        const char *q = p;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (*q == '-')
            hi = atoi(q + 1);
        if (lo <= n - 1 && n - 1 <= hi)
            return true;
    }
    return false;
}

int main(void)
{
    /* Once a client has exited, MPICH's launcher sometimes sends the others SIGHUP, even under
     * -disable-auto-cleanup (about 1 run in 100 here, with or without this library's waits
     * blocking): the survivors are what this test watches, so they let it pass */
    signal(SIGHUP, SIG_IGN);
    dt_init_options o = {.timeout_seconds = 1};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    me = dt_client_id();
    n = dt_num_clients();
    int g = dt_num_global_devices(DT_DEVICE_CPU), nl = dt_num_local_devices(DT_DEVICE_CPU);
    dt_mesh *m = NULL;
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", g);
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK) {
        fprintf(stderr, "mesh: %s\n", dt_last_error());
        return 1;
    }
    /* a matmul (contracting axis sharded: an all-reduce) and an all-reduce while every client
     * lives, so that the communicators exist when the last client dies */
    dt_layout lr, lc;
    dt_layout_parse(m, "unsharded,x", &lr);
    dt_layout_parse(m, "x,unsharded", &lc);
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    float host[64] = {0};
    dt_tensor_from_host(&lr, DT_DTYPE_F32, 2, (int64_t[]){4, 16}, host, sizeof host, &a);
    dt_tensor_from_host(&lc, DT_DTYPE_F32, 2, (int64_t[]){16, 4}, host, sizeof host, &b);
    float *buf = calloc((size_t)(nl + 1) * 64, sizeof *buf);
    const void *send[64];
    void *recv[64];
    for (int i = 0; i < nl && i < 64; i++) {
        send[i] = buf;
        recv[i] = buf + (size_t)(i + 1) * 64;
    }
    dt__coll ar = {.kind = DT__COLL_ALL_REDUCE,
                   .dtype = DT_DTYPE_F32,
                   .op = DT_REDUCE_SUM,
                   .axes = 1u,
                   .send = send,
                   .recv = recv,
                   .count = 64};
    if (dt_matmul(a, b, NULL, &c) != DT_OK || dt__collective(m, &ar) != DT_OK) {
        fprintf(stderr, "before the death: %s\n", dt_last_error());
        return 1;
    }
    dt_tensor_free(c);
    c = NULL;
    if (me == n - 1)
        _exit(0); /* dies: no op, no finalize */
    if (me == 0)
        printf("1..3\n");

    /* 1. an op: the survivors wait for the dead client in the op agreement */
    double t0 = now();
    dt_status s = dt_matmul(a, b, NULL, &c);
    double took = now() - t0;
    const char *e = dt_last_error();
    check(s == DT_ERR_COMM && strstr(e, "matmul:") && strstr(e, "agreement of all clients") &&
              strstr(e, "DTENSOR_TIMEOUT") && names_missing(e) && took < 5.0 && !c,
          "a matmul fails in the op agreement naming the op, the group and the dead client", s,
          took);

    /* 2. a collective with no agreement before it: MPI waits for the dead client */
    char group[64];
    snprintf(group, sizeof group, "clients 0-%d", n - 1);
    if (n == 2)
        snprintf(group, sizeof group, "clients 0, 1");
    t0 = now();
    s = dt__collective(m, &ar);
    took = now() - t0;
    e = dt_last_error();
    check(s == DT_ERR_COMM && strstr(e, "in all_reduce over axes {x} of mesh") && strstr(e, spec) &&
              strstr(e, group) && took < 5.0,
          "an all-reduce fails naming the collective, its axes, the mesh and the group's clients",
          s, took);

    /* 3. the next agreement (a barrier) gives up too, naming the dead client again */
    t0 = now();
    s = dt_barrier();
    took = now() - t0;
    e = dt_last_error();
    check(s == DT_ERR_COMM && strstr(e, "dt_barrier:") && names_missing(e) && took < 5.0,
          "a barrier fails naming the call and the dead client", s, took);
    fflush(stdout);
    _exit(failures ? 1 : 0); /* without finalize: the dead client would never join it */
}
