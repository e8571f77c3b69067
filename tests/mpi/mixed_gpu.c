/* Clients with and without a GPU (client 0 alone has one: emulated, mpiexec gives only it
 * DTENSOR_EMULATE_CUDA=1; skipped where a real GPU is visible). A mesh over every GPU of more
 * devices than there are is an error on every client naming the clients without one, never a
 * hang; a mesh on client 0's GPU runs ops every client takes part in (the others hold none of
 * it), and its values reach every client through a copy to a CPU mesh. */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    if (dt_init(&(dt_init_options){.timeout_seconds = 30}) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int me = dt_client_id(), n = dt_num_clients();
    int mine = dt_num_local_devices(DT_DEVICE_CUDA), all[64] = {0};
    dt_client_allgather(&mine, sizeof mine, all);
    bool emulated = all[0] == 1;
    for (int c = 1; c < n && c < 64; c++)
        emulated = emulated && all[c] == 0;
    if (!emulated || n < 2) {
        tap_diag("skipped: needs client 0 alone with one GPU (DTENSOR_EMULATE_CUDA=1 on it only, "
                 "no real GPU visible)");
        tap_check(true, "nothing to check here");
        int rc = tap_done();
        dt_finalize();
        return rc;
    }
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_from_string("x=2", DT_DEVICE_CUDA, &m);
    tap_check(s == DT_ERR_MESH && !m &&
                  strstr(dt_last_error(), n > 2 ? "(none on clients 1" : "(none on client 1)"),
              "a mesh of 2 GPUs where 1 client of %d has one: %s (%s)", n, dt_status_name(s),
              dt_last_error());
    s = dt_mesh_create_from_string("x=1", DT_DEVICE_CUDA, &m);
    tap_check(s == DT_OK, "a mesh on client 0's GPU: %s", s ? dt_last_error() : "");
    dt_layout l, cl;
    dt_mesh *cpu = NULL;
    dt_tensor *t = NULL, *u = NULL, *h = NULL;
    s = dt_layout_replicated(m, 1, &l);
    if (s == DT_OK)
        s = dt_ones(DT_DTYPE_F32, 1, (int64_t[]){6}, &(dt_op_options){.layout = &l}, &t);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t, t, NULL, &u);
    tap_check(s == DT_OK && u && (me == 0) == (u->num_local == 1),
              "ops on it: every client takes part, client 0 computes (%s)",
              s ? dt_last_error() : "");
    /* to client 0's CPU device (a copy between device types keeps the devices), then to
     * every client's */
    dt_mesh *cpu1 = NULL;
    dt_tensor *h1 = NULL;
    char desc[32];
    snprintf(desc, sizeof desc, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    if (s == DT_OK)
        s = dt_mesh_create_on_devices(1, (const char *[]){"x"}, (int[]){1}, DT_DEVICE_CPU, 1,
                                      (int[]){0}, &cpu1);
    if (s == DT_OK)
        s = dt_layout_replicated(cpu1, 1, &cl);
    if (s == DT_OK)
        s = dt_copy_to_mesh(u, &cl, NULL, &h1);
    if (s == DT_OK)
        s = dt_mesh_create_from_string(desc, DT_DEVICE_CPU, &cpu);
    if (s == DT_OK)
        s = dt_layout_replicated(cpu, 1, &cl);
    if (s == DT_OK)
        s = dt_copy_to_mesh(h1, &cl, NULL, &h);
    float v[6] = {0};
    if (s == DT_OK)
        s = dt_tensor_read(h, v, sizeof v);
    bool twos = s == DT_OK;
    for (int i = 0; i < 6; i++)
        twos = twos && v[i] == 2;
    tap_check(twos, "copied to a CPU mesh and read on every client: 2s (%s)",
              s ? dt_last_error() : "");
    dt_tensor_free(t);
    dt_tensor_free(u);
    dt_tensor_free(h);
    dt_tensor_free(h1);
    dt_mesh_free(cpu);
    dt_mesh_free(cpu1);
    dt_mesh_free(m);
    int rc = tap_done();
    s = dt_finalize();
    return s == DT_OK ? rc : 1;
}
