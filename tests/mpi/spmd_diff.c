/* Multi-client differential test of the SPMD expansion engine (tests/unit/diff_core.h) and
 * its error contract: under mpiexec.mpich -n 2 (3 devices per client), -n 4 (2 each) and -n 8
 * (1 each: eight clients on the machine's 2 cores, the waits' hardest case).
 * Every client runs every check; rank 0 prints the combined TAP verdicts. With
 * DTENSOR_EMULATE_CUDA the meshes are of CUDA devices emulated on the host (DTENSOR_CUDA_DEVICES
 * per client): the executor's device paths across clients (skipped where GPUs are real: clients
 * sharing one are another matter). */
#include "../ref.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIFF_REPORT(ok, ...) tap_check((ok), __VA_ARGS__)
#include "../unit/diff_core.h"

static void errors(const dt_mesh *m)
{
    dt_layout rep, rows;
    dt_layout_replicated(m, 2, &rep);
    dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 2, &rows);
    float a[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *ta = NULL, *tb = NULL, *c = NULL;
    dt_tensor_from_host(&rows, DT_DTYPE_F32, 2, (const int64_t[]){2, 3}, a, sizeof a, &ta);
    dt_tensor_from_host(&rep, DT_DTYPE_F32, 2, (const int64_t[]){2, 3}, a, sizeof a, &tb);
    dt_status s = dt_matmul(ta, tb, NULL, &c);
    tap_check(s == DT_ERR_SHAPE && strstr(dt_last_error(), "[2,3]") && !c,
              "matmul [2,3] @ [2,3] fails with DT_ERR_SHAPE naming the shapes on every client");
    dt_tensor *d = NULL;
    dt_layout bad = rep;
    bad.rank = 3;
    dt_op_options o = {.layout = &bad};
    s = dt_binary(DT_BINARY_ADD, ta, tb, &o, &d);
    tap_check(s == DT_ERR_LAYOUT && !d,
              "a requested layout of the wrong rank fails on every "
              "client: %s",
              dt_last_error());
    const int64_t rs[1] = {7};
    s = dt_reshape(ta, 1, rs, NULL, &d);
    tap_check(s == DT_ERR_SHAPE && strstr(dt_last_error(), "[7]"),
              "reshape [2,3] -> [7] fails with DT_ERR_SHAPE on every client");
    /* after the failures every client is still in step: a collective op completes */
    s = dt_matmul(ta, tb, &(dt_op_options){.transpose_b = 1}, &c);
    float got[4];
    bool ok = s == DT_OK && dt_tensor_read(c, got, sizeof got) == DT_OK && got[0] == 14 &&
              got[1] == 32 && got[3] == 77;
    tap_check(ok, "a valid matmul after the failures completes on every client");
    dt_tensor_free(c);
    dt_tensor_free(ta);
    dt_tensor_free(tb);
}

int main(void)
{
    const char *size = getenv("PMI_SIZE");
    int clients = size ? atoi(size) : 1;
    const char *emulate = getenv("DTENSOR_EMULATE_CUDA");
    dt_device_type type = emulate && *emulate ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    if (type == DT_DEVICE_CUDA && !ref_cuda_emulated()) {
        printf("1..0 # SKIP GPUs are present: this run is for CUDA devices emulated on the host\n");
        return 0;
    }
    dt_init_options o = {.cpu_devices = clients == 2 ? 3 : clients >= 8 ? 1 : 2};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int total = dt_num_global_devices(type);
    const char *meshes[2];
    if (total == 6) {
        meshes[0] = "x=3,y=2";
        meshes[1] = "x=2,y=3";
    } else if (total == 8) {
        meshes[0] = "x=2,y=2,z=2";
        meshes[1] = "x=4,y=2";
    } else {
        meshes[0] = meshes[1] = total == 4 ? "x=2,y=2" : "x=2";
    }
    for (int k = 0; k < 2; k++) {
        dt_mesh *m = NULL;
        if (!tap_check(dt_mesh_create_from_string(meshes[k], type, &m) == DT_OK,
                       "mesh %s over %d clients", meshes[k], dt_num_clients()))
            break;
        diff_opts opts = {.thorough = false};
        diff_all(m, &opts);
        if (k == 0)
            errors(m);
        dt_mesh_free(m);
    }
    int rc = tap_done();
    dt_finalize();
    return rc;
}
