/* The watchdog: the last client dies right after dt_init (it exits without a word); the
 * others' next op waits for it in the op agreement and gives up after DTENSOR_TIMEOUT (1 s
 * here) with DT_ERR_COMM naming the timeout, within seconds, instead of hanging. Run under
 * `mpiexec.mpich -disable-auto-cleanup` so that the launcher leaves the survivors running.
 * Prints TAP from client 0; every survivor checks (a dead client cannot take part in the
 * usual combined verdict), then leaves without dt_finalize, which would wait for the dead. */
#include "dt.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
    dt_init_options o = {.timeout_seconds = 1};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    int me = dt_client_id(), n = dt_num_clients();
    dt_mesh *m = NULL;
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK) {
        fprintf(stderr, "mesh: %s\n", dt_last_error());
        return 1;
    }
    if (me == n - 1)
        _exit(0); /* dies: no op, no finalize */
    dt_layout l;
    dt_layout_parse(m, "x", &l);
    float host[64] = {0};
    dt_tensor *a = NULL, *b = NULL;
    dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){64}, host, sizeof host, &a);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dt_status s = dt_unary(DT_UNARY_NEG, a, NULL, &b);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    int ok = s == DT_ERR_COMM && strstr(dt_last_error(), "DTENSOR_TIMEOUT") && took < 5.0;
    if (me == 0) {
        printf("1..1\n%s 1 - client %d of %d died: the others' op fails with DT_ERR_COMM after "
               "%.2f s (%s: %s)\n",
               ok ? "ok" : "not ok", n - 1, n, took, dt_status_name(s), dt_last_error());
        fflush(stdout);
    }
    _exit(ok ? 0 : 1); /* without finalize: the dead client would never join it */
}
