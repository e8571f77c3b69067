/* The README's first program: C = A @ B with the contracting axis of A and B split over the
 * mesh axis "x", every status checked. It runs as one client or several, on whatever devices
 * they have (one CPU device per client unless DTENSOR_CPU_DEVICES says more):
 *
 *   DTENSOR_CPU_DEVICES=6 build/examples/first_program
 *   mpiexec.mpich -n 2 build/examples/first_program
 *
 * and prints the expanded program and C = [[20, 14], [56, 41]] on client 0. */
#include <dtensor.h>

#include <stdio.h>

#define CHECK(call)                                                 \
    do {                                                            \
        if ((call) != DT_OK) {                                      \
            fprintf(stderr, "%s: %s\n", #call, dt_last_error());    \
            goto done; /* every client fails alike: errors agree */ \
        }                                                           \
    } while (0)

int main(void)
{
    int rc = 1;
    dt_mesh *mesh = NULL;
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    if (dt_init(NULL) != DT_OK) { /* Collective; brings up MPI under mpiexec */
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    int n = dt_num_global_devices(DT_DEVICE_CPU); /* every client's devices */
    const char *axis = "x";
    CHECK(dt_mesh_create(1, &axis, &n, DT_DEVICE_CPU, &mesh)); /* Collective */
    dt_layout la, lb;
    CHECK(dt_layout_parse(mesh, "unsharded,x", &la)); /* A [2,3]: columns split over x */
    CHECK(dt_layout_parse(mesh, "x,unsharded", &lb)); /* B [3,2]: rows split over x */
    const float a_host[6] = {1, 2, 3, 4, 5, 6}, b_host[6] = {6, 5, 4, 3, 2, 1};
    CHECK(dt_tensor_from_host(&la, DT_DTYPE_F32, 2, (int64_t[]){2, 3}, a_host, sizeof a_host, &a));
    CHECK(dt_tensor_from_host(&lb, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, b_host, sizeof b_host, &b));
    dt_op_options show = {.program = dt_client_id() == 0 ? stdout : NULL};
    CHECK(dt_matmul(a, b, &show, &c)); /* local GEMMs + one all-reduce over x */
    float out[4];
    CHECK(dt_tensor_read(c, out, sizeof out)); /* explicit gather, on every client */
    if (dt_client_id() == 0)
        printf("C = [[%g, %g], [%g, %g]] on %d devices\n", out[0], out[1], out[2], out[3], n);
    rc = 0;
    for (int i = 0; i < 2; i++) /* against the product computed here, on the host */
        for (int j = 0; j < 2; j++) {
            float want = 0;
            for (int k = 0; k < 3; k++)
                want += a_host[i * 3 + k] * b_host[k * 2 + j];
            if (out[i * 2 + j] != want) {
                fprintf(stderr, "C[%d][%d] is %g, the host computes %g\n", i, j, out[i * 2 + j],
                        want);
                rc = 1;
            }
        }
done:
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
    dt_mesh_free(mesh);
    if (dt_finalize() != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        rc = 1;
    }
    return rc;
}
