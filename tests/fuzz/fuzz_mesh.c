/* libFuzzer target: mesh descriptions ("x=3,y=2") through dt_mesh_create_from_string on a
 * runtime of 6 devices. Any input: a mesh or a status, never a crash or a sanitizer report. */
#include <dtensor.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    dt_init_options o = {.cpu_devices = 6};
    if (dt_init(&o) != DT_OK)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    dt_mesh *m = NULL;
    if (dt_mesh_create_from_string(text, DT_DEVICE_CPU, &m) == DT_OK) {
        char buf[DT_STRING_MAX];
        dt_mesh_format(m, buf, sizeof buf);
        for (int a = 0; a < dt_mesh_num_axes(m); a++)
            dt_mesh_axis_index(m, dt_mesh_axis_name(m, a));
        dt_mesh_free(m);
    }
    free(text);
    return 0;
}
