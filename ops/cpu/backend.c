/* CPU backend: device buffers are 64-byte aligned host memory. */
#include "dt.h"

#include <stdlib.h>
#include <string.h>

static dt_status cpu_alloc(dt__device *d, size_t bytes, void **out)
{
    /* Round up: aligned_alloc wants a multiple of the alignment; 0 bytes still gets a unique
     * pointer so empty shards need no special case. */
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return dt__fail(DT_ERR_NOMEM, "CPU:%d: cannot allocate %zu bytes", d->local_index, bytes);
    *out = p;
    return DT_OK;
}

static void cpu_free(dt__device *d, void *p)
{
    (void)d;
    free(p);
}

static dt_status cpu_copy(dt__device *d, void *dst, const void *src, size_t bytes)
{
    (void)d;
    if (bytes)
        memcpy(dst, src, bytes);
    return DT_OK;
}

const dt__backend dt__cpu_backend = {
    .name = "cpu",
    .host_accessible = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .kernels = dt__cpu_kernels,
};
