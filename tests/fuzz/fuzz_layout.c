/* libFuzzer target: layout text on a 3-axis mesh (dt_layout_parse, then the layout's text and
 * shard queries on a few shapes). Any input: a status, never a crash or a sanitizer report. */
#include <dtensor.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static dt_mesh *mesh;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    dt_init_options o = {.cpu_devices = 8};
    if (dt_init(&o) != DT_OK || dt_mesh_create_from_string("x=2,y=2,z=2", DT_DEVICE_CPU, &mesh))
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    dt_layout l;
    if (dt_layout_parse(mesh, text, &l) == DT_OK) {
        char buf[DT_STRING_MAX];
        dt_layout_to_string(&l, buf, sizeof buf);
        int64_t shape[DT_MAX_RANK], local[DT_MAX_RANK], off[DT_MAX_RANK];
        for (int a = 0; a < l.rank; a++)
            shape[a] = 1 + (int64_t)(size % 7) + a;
        for (int d = 0; d < 8; d++)
            dt_layout_local_shape(&l, shape, d, local, off);
        for (int a = -1; a <= l.rank; a++)
            dt_layout_num_shards(&l, a);
    }
    free(text);
    return 0;
}
