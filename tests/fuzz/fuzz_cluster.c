/* libFuzzer target: TF_CONFIG text (and, split at the first newline, a DTENSOR_CLUSTER spec)
 * through dt_cluster_parse, a pure function, for a few client counts. Any input: a cluster or a
 * status, never a crash, unbounded recursion or a sanitizer report. */
#include <dtensor.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    char *spec = strchr(text, '\n');
    if (spec)
        *spec++ = '\0';
    dt_cluster c;
    for (int n = 1; n <= 5; n += 2)
        for (int client = 0; client < n; client++) {
            dt_cluster_parse(text, NULL, client, n, &c);
            if (spec)
                dt_cluster_parse(NULL, spec, client, n, &c);
        }
    free(text);
    return 0;
}
