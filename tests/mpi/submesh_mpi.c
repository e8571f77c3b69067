/* Meshes over a subset of the devices (dt_mesh_create_on_devices) under several clients:
 * rejected device lists fail alike on every client, tensors live on exactly the mesh's
 * devices (clients owning none take part and hold nothing), and dt_copy_to_mesh between a
 * one-device mesh and a mesh over every device gives back the host values (the reference)
 * while a device outside the source holds no more than its target shard and what it receives.
 * Run with 4 global CPU devices: -n 1 (4 devices), -n 2 (2 each), -n 4 (1 each). */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int global_;

static void restart_peaks(size_t held[])
{
    for (int i = 0; i < dt__rt.num_devices[DT_DEVICE_CPU]; i++) {
        dt_device_memory(DT_DEVICE_CPU, i, &held[i], NULL);
        atomic_store(&dt__rt.devices[DT_DEVICE_CPU][i].bytes_peak, held[i]);
    }
}

static void check_errors(void)
{
    const char *names[1] = {"d"};
    int two = 2;
    dt_mesh *m = (dt_mesh *)1;
    dt_status s = dt_mesh_create_on_devices(1, names, &two, DT_DEVICE_CPU, 2, (int[]){1, 0}, &m);
    tap_check(s == DT_ERR_MESH && m == NULL && strstr(dt_last_error(), "strictly increasing"),
              "decreasing device list rejected: %s", dt_last_error());
    s = dt_mesh_create_on_devices(1, names, &two, DT_DEVICE_CPU, 2, (int[]){0, global_}, &m);
    tap_check(s == DT_ERR_MESH && m == NULL, "device id outside the runtime rejected");
    int one = 1;
    int mine = dt__rt.client % 2; /* clients 0 and 1 name different devices */
    s = dt_mesh_create_on_devices(1, names, &one, DT_DEVICE_CPU, 1, &mine, &m);
    bool want = dt__rt.num_clients > 1 ? s == DT_ERR_MISMATCH : s == DT_OK;
    tap_check(want, "different device lists: mismatch on every client (%s)",
              s == DT_OK ? "one client" : dt_last_error());
    dt_mesh_free(m);
}

/* Bytes each local device holds of t. */
static bool holds_only(const dt_tensor *t, const int owner_ids[], int n, size_t before[],
                       size_t bytes_each)
{
    bool ok = true;
    for (int i = 0; i < dt__rt.num_devices[DT_DEVICE_CPU]; i++) {
        size_t cur;
        dt_device_memory(DT_DEVICE_CPU, i, &cur, NULL);
        int gid = dt_global_device_id(DT_DEVICE_CPU, i);
        bool owner = false;
        for (int j = 0; j < n; j++)
            owner = owner || owner_ids[j] == gid;
        ok = ok && cur - before[i] == (owner ? bytes_each : 0);
    }
    (void)t;
    return ok;
}

static void check_copy(void)
{
    const char *names[1] = {"batch"};
    int one = 1, g = global_;
    dt_mesh *solo = NULL, *all = NULL;
    dt_status s = dt_mesh_create_on_devices(1, names, &one, DT_DEVICE_CPU, 1, (int[]){0}, &solo);
    if (!tap_check(s == DT_OK, "one-device mesh on device 0: %s", dt_last_error()))
        return;
    s = dt_mesh_create(1, names, &g, DT_DEVICE_CPU, &all);
    tap_check(s == DT_OK, "mesh over every device");
    tap_check(dt_mesh_size(solo) == 1 &&
                  dt_mesh_num_local_devices(solo) == (dt__rt.client == 0 ? 1 : 0),
              "only client 0 owns a device of the one-device mesh");

    /* x: [64 g, 16] f64, value 1000 r + c + 0.5 (distinct, exact) */
    int64_t shape[2] = {64 * (int64_t)g, 16}, n = shape[0] * shape[1];
    double *host = malloc(sizeof(double) * (size_t)n), *back = calloc((size_t)n, sizeof *back);
    for (int64_t i = 0; i < n; i++)
        host[i] = 1000.0 * (double)(i / 16) + (double)(i % 16) + 0.5;
    size_t held[64];
    restart_peaks(held);
    dt_layout lsolo, lsplit;
    dt_layout_replicated(solo, 2, &lsolo);
    dt_layout_batch_sharded(all, "batch", 2, &lsplit);
    dt_tensor *x = NULL, *y = NULL, *z = NULL;
    s = dt_tensor_from_host(&lsolo, DT_DTYPE_F64, 2, shape, host, sizeof(double) * (size_t)n, &x);
    tap_check(s == DT_OK, "tensor on the one-device mesh: %s", dt_last_error());
    tap_check(holds_only(x, (int[]){0}, 1, held, sizeof(double) * (size_t)n),
              "it occupies device 0 only, the whole tensor there");
    s = dt_tensor_read(x, back, sizeof(double) * (size_t)n);
    tap_check(s == DT_OK && memcmp(back, host, sizeof(double) * (size_t)n) == 0,
              "every client reads it back");

    restart_peaks(held);
    s = dt_copy_to_mesh(x, &lsplit, NULL, &y);
    tap_check(s == DT_OK, "copy_to_mesh one device -> batch-sharded on %d: %s", g, dt_last_error());
    memset(back, 0, sizeof(double) * (size_t)n);
    s = s == DT_OK ? dt_tensor_read(y, back, sizeof(double) * (size_t)n) : s;
    tap_check(s == DT_OK && memcmp(back, host, sizeof(double) * (size_t)n) == 0,
              "values after the copy equal the host's");
    /* a device other than 0 holds its shard plus the receive buffer (and the temporaries'
     * alignment, under 1 KiB): never the whole tensor */
    size_t shard = sizeof(double) * (size_t)(n / g), slack = 1024;
    bool ok = true;
    for (int i = 0; i < dt__rt.num_devices[DT_DEVICE_CPU]; i++) {
        size_t peak;
        dt_device_memory(DT_DEVICE_CPU, i, NULL, &peak);
        if (dt_global_device_id(DT_DEVICE_CPU, i) != 0 && peak - held[i] > 2 * shard + slack) {
            tap_diag("device %d: peak %zu bytes over what it held, shard %zu",
                     dt_global_device_id(DT_DEVICE_CPU, i), peak - held[i], shard);
            ok = false;
        }
    }
    tap_check(
        ok,
        "devices other than 0 held at most twice their shard during the copy (%zu bytes of %zu)",
        2 * shard + slack, sizeof(double) * (size_t)n);

    restart_peaks(held);
    s = y ? dt_copy_to_mesh(y, &lsolo, NULL, &z) : DT_ERR_ARG;
    tap_check(s == DT_OK, "copy_to_mesh batch-sharded -> one device: %s", dt_last_error());
    memset(back, 0, sizeof(double) * (size_t)n);
    s = s == DT_OK ? dt_tensor_read(z, back, sizeof(double) * (size_t)n) : s;
    tap_check(s == DT_OK && memcmp(back, host, sizeof(double) * (size_t)n) == 0,
              "values after the copy back equal the host's");
    tap_check(z && z->num_local == (dt__rt.client == 0 ? 1 : 0),
              "the copy back has one component, on client 0");
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_tensor_free(z);
    dt_mesh_free(solo);
    dt_mesh_free(all);
    free(host);
    free(back);
}

/* Collectives on a mesh over devices 1..3, where clients hold different numbers of its
 * devices (at -n 2 x 2: one and two): a sum over the sharded axis and a matmul contracting it
 * give the host's answer on every client. They used to hang: each client chose blocking or
 * nonblocking MPI from its own device count, and the two never match. */
static void check_uneven_collectives(void)
{
    const char *names[1] = {"x"};
    int three = 3;
    dt_mesh *m = NULL;
    dt_status s =
        dt_mesh_create_on_devices(1, names, &three, DT_DEVICE_CPU, 3, (int[]){1, 2, 3}, &m);
    tap_check(s == DT_OK, "mesh over devices 1, 2, 3: %s", s ? dt_last_error() : "ok");
    if (s != DT_OK)
        return;
    dt_layout l, lr;
    dt_layout_parse(m, "x", &l);
    dt_layout_parse(m, "x,unsharded", &lr);
    float h[7] = {1, 2, 3, 4, 5, 6, 7}, sum = 0, dot[4] = {0};
    int64_t n = 7;
    dt_tensor *t = NULL, *r = NULL, *b = NULL, *c = NULL;
    s = dt_tensor_from_host(&l, DT_DTYPE_F32, 1, &n, h, sizeof h, &t);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, t, 1, (int[]){0}, 0, NULL, &r);
    if (s == DT_OK)
        s = dt_tensor_read(r, &sum, sizeof sum);
    tap_check(s == DT_OK && sum == 28, "sum over the sharded axis: %g (%s)", sum,
              s ? dt_last_error() : "ok");
    /* [1,7] @ [7,1]: the contracting axis on x, then an all-reduce */
    float bh[7] = {1, 1, 1, 1, 1, 1, 2};
    dt_tensor *a2 = NULL;
    dt_layout la;
    dt_layout_parse(m, "unsharded,x", &la);
    s = dt_tensor_from_host(&la, DT_DTYPE_F32, 2, (int64_t[]){1, 7}, h, sizeof h, &a2);
    if (s == DT_OK)
        s = dt_tensor_from_host(&lr, DT_DTYPE_F32, 2, (int64_t[]){7, 1}, bh, sizeof bh, &b);
    if (s == DT_OK)
        s = dt_matmul(a2, b, NULL, &c);
    if (s == DT_OK)
        s = dt_tensor_read(c, dot, sizeof(float));
    tap_check(s == DT_OK && dot[0] == 35, "matmul contracting the sharded axis: %g (%s)", dot[0],
              s ? dt_last_error() : "ok");
    dt_tensor_free(t);
    dt_tensor_free(r);
    dt_tensor_free(a2);
    dt_tensor_free(b);
    dt_tensor_free(c);
    dt_mesh_free(m);
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    global_ = dt_num_global_devices(DT_DEVICE_CPU);
    check_errors();
    check_copy();
    check_uneven_collectives();
    int rc = tap_done();
    dt_finalize();
    return rc;
}
