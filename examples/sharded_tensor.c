/* The "sharded tensor" part of the DTensor guide, as a C program.
 *
 * Six CPU devices: one client with 6 local devices (the default here), or
 * `mpiexec.mpich -n 2` clients with 3 devices each, or `-n 6` with one each
 * (DTENSOR_CPU_DEVICES or --devices-per-client N). The output is the same in every case.
 *
 *   1-D mesh x=6: a replicated rank-1 tensor [0, 1] is a full copy on every device.
 *   3x2 mesh x,y: the 3x2 tensor [[0,1],[2,3],[4,5]] fully sharded ("x,y"), fully replicated
 *   ("unsharded,unsharded") and hybrid ("x,unsharded"), each device's component printed.
 */
#include "dtensor.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr)                                                                  \
    do {                                                                             \
        dt_status s_ = (expr);                                                       \
        if (s_ != DT_OK) {                                                           \
            fprintf(stderr, "client %d: %s failed: %s: %s\n", dt_client_id(), #expr, \
                    dt_status_name(s_), dt_last_error());                            \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* Append "[0, 1]" or "[[0], [1]]" for a row-major int32 array of rank 1 or 2. */
static size_t format_array(char *buf, size_t size, const int32_t *v, int rank,
                           const int64_t shape[])
{
    size_t n = 0;
    int64_t rows = rank == 2 ? shape[0] : 1, cols = shape[rank - 1];
    if (rank == 2)
        n += (size_t)snprintf(buf + n, size - n, "[");
    for (int64_t r = 0; r < rows; r++) {
        n += (size_t)snprintf(buf + n, size - n, "%s[", r ? ", " : "");
        for (int64_t c = 0; c < cols; c++)
            n += (size_t)snprintf(buf + n, size - n, "%s%d", c ? ", " : "", v[r * cols + c]);
        n += (size_t)snprintf(buf + n, size - n, "]");
    }
    if (rank == 2)
        n += (size_t)snprintf(buf + n, size - n, "]");
    return n;
}

/* Every device's component, in global device order across clients. */
static void print_components(const dt_tensor *t)
{
    const dt_mesh *m = dt_tensor_mesh(t);
    char text[4096];
    size_t n = 0;
    for (int i = 0; i < dt_mesh_num_local_devices(m); i++) {
        int64_t local[DT_MAX_RANK];
        int32_t component[64];
        CHECK(dt_tensor_local_shape(t, i, local));
        CHECK(dt_tensor_unpack(t, i, component, sizeof component));
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "  Device CPU:%d: ", dt_mesh_local_device_id(m, i));
        n += format_array(text + n, sizeof text - n, component, dt_tensor_rank(t), local);
        n += (size_t)snprintf(text + n, sizeof text - n, "\n");
    }
    CHECK(dt_print_ordered(stdout, text));
}

static void show(const dt_mesh *m, const char *layout_text, const char *title, int rank,
                 const int64_t shape[], const int32_t *values, size_t bytes)
{
    dt_layout layout;
    char mesh_text[DT_STRING_MAX], lt[DT_STRING_MAX];
    CHECK(dt_layout_parse(m, layout_text, &layout));
    CHECK(dt_layout_to_string(&layout, lt, sizeof lt));
    dt_mesh_format(m, mesh_text, sizeof mesh_text);
    dt_tensor *t = NULL;
    CHECK(dt_tensor_from_host(&layout, DT_DTYPE_I32, rank, shape, values, bytes, &t));
    if (dt_client_id() == 0) {
        printf("%s: Layout(\"%s\") on %s, global shape [", title, lt, mesh_text);
        for (int i = 0; i < rank; i++)
            printf("%s%lld", i ? ", " : "", (long long)shape[i]);
        printf("], dtype %s\n", dt_dtype_name(dt_tensor_dtype(t)));
    }
    fflush(stdout);
    print_components(t);
    /* Reading the global value back is explicit (a gather across clients). */
    int32_t global[64];
    char text[512];
    CHECK(dt_tensor_read(t, global, sizeof global));
    format_array(text, sizeof text, global, rank, shape);
    if (dt_client_id() == 0)
        printf("  read back: %s\n\n", text);
    fflush(stdout);
    dt_tensor_free(t);
}

int main(int argc, char **argv)
{
    dt_init_options opts = {0};
    bool devices = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--devices-per-client") == 0 && i + 1 < argc)
            opts.cpu_devices = atoi(argv[++i]);
        else if (strcmp(argv[i], "--report") == 0)
            devices = true;
        else {
            fprintf(stderr, "usage: %s [--devices-per-client N] [--report]\n", argv[0]);
            return 2;
        }
    }
    /* Six devices in all: split them evenly over the clients unless told otherwise. */
    if (!opts.cpu_devices && !getenv("DTENSOR_CPU_DEVICES")) {
        const char *size = getenv("PMI_SIZE");
        int clients = size ? atoi(size) : 1;
        opts.cpu_devices = clients > 0 && 6 % clients == 0 ? 6 / clients : 1;
    }
    CHECK(dt_init(&opts));
    if (devices)
        CHECK(dt_devices_print(stderr));

    dt_mesh *mesh_1d = NULL, *mesh_2d = NULL;
    CHECK(dt_mesh_create_from_string("x=6", DT_DEVICE_CPU, &mesh_1d));
    CHECK(dt_mesh_create_from_string("x=3,y=2", DT_DEVICE_CPU, &mesh_2d));

    const int32_t first[2] = {0, 1};
    show(mesh_1d, "unsharded", "my_first_dtensor", 1, (const int64_t[]){2}, first, sizeof first);

    const int32_t range6[6] = {0, 1, 2, 3, 4, 5}; /* tf.reshape(tf.range(6), (3, 2)) */
    const int64_t shape[2] = {3, 2};
    show(mesh_2d, "x,y", "fully sharded", 2, shape, range6, sizeof range6);
    show(mesh_2d, "unsharded,unsharded", "fully replicated", 2, shape, range6, sizeof range6);
    show(mesh_2d, "x,unsharded", "hybrid", 2, shape, range6, sizeof range6);

    dt_mesh_free(mesh_1d);
    dt_mesh_free(mesh_2d);
    CHECK(dt_finalize());
    return 0;
}
