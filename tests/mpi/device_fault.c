/* Faults in collectives across clients, injected with DTENSOR_FAULT on one client;
 * DTENSOR_TIMEOUT is 2 s. Device collectives run on GPUs emulated on the host (the emulated
 * NCCL of collectives/xport_emulated.c under the layer every GPU run uses,
 * collectives/device.c); host collectives on CPU devices, two per client. Run under
 * `mpiexec.mpich -disable-auto-cleanup` at -n 2 and -n 4, with the fault given as the first
 * argument:
 *   comm     client 1's communicator creation fails: creating a mesh that needs one fails on
 *            every client with DT_ERR_DEVICE naming client 1, at once; a second mesh (the fault
 *            was for the first creation) is made and runs
 *   enqueue  client 1's second device collective fails before its enqueue: that op fails on
 *            every client with DT_ERR_DEVICE within the timeout (client 1 aborts its
 *            communicators, the others see it); every later op on the mesh's GPUs fails with
 *            DT_ERR_DEVICE on every client; a CPU mesh still works
 *   kill     the last client exits in its second device collective: every survivor's op fails
 *            within twice the timeout (the collective's wait, then the outcome's agreement),
 *            and so does its next call; no survivor hangs
 *   post     on a CPU mesh where each client holds a member of two groups, client 1's MPI
 *            call for the second group of its second collective fails while the first
 *            group's is in flight: the op fails on every client within twice the timeout,
 *            client 1's with DT_ERR_COMM, and no client aborts (MPI cannot cancel the
 *            collective in flight: it is left to MPI)
 * Every client checks and exits 1 when a check fails; client 0 prints TAP (a dead client
 * cannot take part in a combined verdict), and the kill and post cases leave without
 * dt_finalize (a dead client, or a collective left in flight, would never let it end). */
#include "dt.h"

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
        printf("%s %d - %s: %s after %.2f s (%s)\n", ok ? "ok" : "not ok", checks, what,
               dt_status_name(s), took, dt_last_error());
    fflush(stdout);
}

/* An op needing a collective across clients: the sum of a sharded tensor, replicated. */
static dt_status reduce_once(const dt_mesh *m, float *got)
{
    dt_layout l, r;
    dt_layout_parse(m, "x", &l);
    dt_layout_replicated(m, 0, &r);
    int g = dt_mesh_size(m);
    float host[64];
    for (int i = 0; i < g; i++)
        host[i] = (float)(i + 1);
    dt_tensor *x = NULL, *y = NULL;
    dt_status s = dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){g}, host,
                                      sizeof(float) * (size_t)g, &x);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, x, 0, NULL, false, &(dt_op_options){.layout = &r}, &y);
    if (s == DT_OK)
        s = dt_tensor_read(y, got, sizeof *got);
    dt_tensor_free(x);
    dt_tensor_free(y);
    return s;
}

static dt_status mesh_of_all(dt_mesh **m)
{
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CUDA));
    return dt_mesh_create_from_string(spec, DT_DEVICE_CUDA, m);
}

static void comm_fault(void)
{
    dt_mesh *m = NULL;
    double t0 = now();
    dt_status s = mesh_of_all(&m);
    double took = now() - t0;
    check(s == DT_ERR_DEVICE && !m && strstr(dt_last_error(), "client 1") && took < 2.0,
          "a mesh whose communicator client 1 cannot create fails on every client", s, took);
    t0 = now();
    s = mesh_of_all(&m);
    float got = 0;
    int g = dt_num_global_devices(DT_DEVICE_CUDA);
    if (s == DT_OK)
        s = reduce_once(m, &got);
    took = now() - t0;
    check(s == DT_OK && got == (float)(g * (g + 1) / 2),
          "the next mesh is made and reduces across clients", s, took);
    dt_mesh_free(m);
}

static void enqueue_fault(void)
{
    dt_mesh *m = NULL, *cpu = NULL;
    int g = dt_num_global_devices(DT_DEVICE_CUDA);
    float got = 0;
    dt_status s = mesh_of_all(&m);
    if (s == DT_OK)
        s = reduce_once(m, &got); /* the first device collective: fine */
    check(s == DT_OK && got == (float)(g * (g + 1) / 2), "a first op reduces across clients", s, 0);
    double t0 = now();
    s = reduce_once(m, &got); /* client 1's second fails before its enqueue */
    double took = now() - t0;
    check(s == DT_ERR_DEVICE && took < 4.0,
          "the op whose collective client 1 cannot enqueue fails on every client", s, took);
    t0 = now();
    s = reduce_once(m, &got);
    took = now() - t0;
    check(s == DT_ERR_DEVICE && strstr(dt_last_error(), "unusable") && took < 4.0,
          "a later op on the mesh's GPUs fails on every client: the devices are dead", s, took);
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    s = dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &cpu);
    int c = dt_num_global_devices(DT_DEVICE_CPU);
    if (s == DT_OK)
        s = reduce_once(cpu, &got);
    check(s == DT_OK && got == (float)(c * (c + 1) / 2), "a CPU mesh still works", s, 0);
    dt_mesh_free(cpu);
    dt_mesh_free(m);
}

static void kill_fault(void)
{
    dt_mesh *m = NULL;
    float got = 0;
    dt_status s = mesh_of_all(&m);
    if (s == DT_OK)
        s = reduce_once(m, &got);
    check(s == DT_OK, "a first op reduces across clients", s, 0);
    double t0 = now();
    s = reduce_once(m, &got); /* the last client dies in it */
    double took = now() - t0;
    if (me == n - 1)
        _exit(9); /* not reached: the fault exits */
    check(s != DT_OK && took < 2 * 2.0 + 3.0,
          "the op in whose collective the last client died fails on every survivor", s, took);
    t0 = now();
    s = dt_barrier();
    took = now() - t0;
    check(s != DT_OK && took < 2.0 + 3.0, "the next call fails too, within the timeout", s, took);
}

/* The sum over "x" of a [clients, 2] tensor laid out "x,y" on the mesh x=clients, y=2: each
 * client's two devices are in the two groups of the all-reduce over x. */
static dt_status reduce_rows(const dt_mesh *m, float got[2])
{
    dt_layout l, r;
    dt_layout_parse(m, "x,y", &l);
    dt_layout_parse(m, "y", &r);
    float host[64];
    for (int i = 0; i < 2 * n; i++)
        host[i] = (float)(i + 1);
    dt_tensor *x = NULL, *y = NULL;
    dt_status s = dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){n, 2}, host,
                                      sizeof(float) * 2 * (size_t)n, &x);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, x, 1, (int[]){0}, false, &(dt_op_options){.layout = &r}, &y);
    if (s == DT_OK)
        s = dt_tensor_read(y, got, 2 * sizeof *got);
    dt_tensor_free(x);
    dt_tensor_free(y);
    return s;
}

static void post_fault(void)
{
    dt_mesh *m = NULL;
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d,y=2", n);
    dt_status s = dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m);
    float got[2] = {0, 0}, want0 = (float)(n * n), want1 = (float)(n * n + n);
    if (s == DT_OK)
        s = reduce_rows(m, got);
    check(s == DT_OK && got[0] == want0 && got[1] == want1,
          "a first op reduces over two groups across clients", s, 0);
    double t0 = now();
    s = reduce_rows(m, got); /* client 1's call for its second group fails */
    double took = now() - t0;
    check(s != DT_OK && (me != 1 || s == DT_ERR_COMM) && took < 2 * 2.0 + 3.0,
          "the op whose second group's MPI call failed on client 1 fails on every client", s, took);
    /* nobody leaves before every client's wait has run out: a peer's exit would end it early */
    while (now() - t0 < 2 * 2.0 + 1.0)
        usleep(10000);
}

int main(int argc, char **argv)
{
    signal(SIGHUP, SIG_IGN); /* as tests/mpi/watchdog.c: the launcher may signal survivors */
    if (dt_init(&(dt_init_options){.timeout_seconds = 2}) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    /* the launcher tells survivors that a client left without MPI_Finalize with SIGUSR1, whose
     * action MPI_Init set: the post case's clients all leave so */
    signal(SIGUSR1, SIG_IGN);
    me = dt_client_id();
    n = dt_num_clients();
    const char *what = argc > 1 ? argv[1] : "";
    bool post = !strcmp(what, "post");
    if (n < 2 || (post ? dt_num_global_devices(DT_DEVICE_CPU) != 2 * n : !dt__rt.cuda_emulated)) {
        if (me == 0)
            printf("1..0 # SKIP needs 2 or more clients, with GPUs emulated on the host (or "
                   "for post, 2 CPU devices each)\n");
        dt_finalize();
        return 0;
    }
    if (me == 0)
        printf("1..%d\n", !strcmp(what, "enqueue") ? 4 : !strcmp(what, "kill") ? 3 : 2);
    if (!strcmp(what, "comm"))
        comm_fault();
    else if (!strcmp(what, "enqueue"))
        enqueue_fault();
    else if (!strcmp(what, "kill"))
        kill_fault();
    else if (post)
        post_fault();
    else
        check(false, "a fault to inject (comm, enqueue, kill, post)", DT_ERR_ARG, 0);
    fflush(stdout);
    if (!strcmp(what, "kill") || post)
        _exit(failures ? 1 : 0); /* without finalize: see the top */
    dt_status s = dt_finalize();
    return failures || s != DT_OK ? 1 : 0;
}
