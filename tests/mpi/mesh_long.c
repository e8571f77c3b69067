/* Mesh descriptions longer than any text buffer: 80 devices per client, a mesh over 150 of the
 * 160 devices whose axis names take 31 characters each. The clients' device lists differ only
 * in the last id, past the first 512 characters of the description's text: the clients compare
 * structure, so every client fails naming the field ("devices"), where a text cut at 512 bytes
 * let both pass on different meshes. The same lists everywhere give the mesh. */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <string.h>

int main(void)
{
    if (dt_init(&(dt_init_options){.cpu_devices = 80, .timeout_seconds = 30}) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int me = dt_client_id(), n = dt_num_clients(), g = dt_num_global_devices(DT_DEVICE_CPU);
    const char *names[3] = {"a234567890123456789012345678901", "b234567890123456789012345678901",
                            "c234567890123456789012345678901"};
    int sizes[3] = {5, 5, 6}, ids[150];
    for (int i = 0; i < 150; i++)
        ids[i] = i;
    if (me == n - 1)
        ids[149] = g - 1; /* the last id differs on the last client */
    char text[1024];
    size_t k = 0;
    for (int i = 0; i < 150 && k < sizeof text; i++)
        k += (size_t)snprintf(text + k, sizeof text - k, "%s%d", i ? "," : "", ids[i]);
    tap_check(g == 80 * n && strlen(text) + 3 * 34 > 512,
              "%d devices; the description takes more than %zu characters", g, 3 * 34 + k);
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_on_devices(3, names, sizes, DT_DEVICE_CPU, 150, ids, &m);
    char last[64];
    snprintf(last, sizeof last, "client %d has", n - 1);
    tap_check(n == 1 ? s == DT_OK
                     : s == DT_ERR_MISMATCH && strstr(dt_last_error(), "differ in devices") &&
                           strstr(dt_last_error(), last) && strstr(dt_last_error(), "148,149]") &&
                           strstr(dt_last_error(), "148,159]") && !m,
              "device lists that differ past 512 characters: a mismatch on every client (%s: %s)",
              dt_status_name(s), dt_last_error());
    dt_mesh_free(m);
    m = NULL;
    ids[149] = 149;
    s = dt_mesh_create_on_devices(3, names, sizes, DT_DEVICE_CPU, 150, ids, &m);
    tap_check(s == DT_OK && dt_mesh_size(m) == 150, "the same lists give the mesh: %s",
              s == DT_OK ? "" : dt_last_error());
    dt_mesh_free(m);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
