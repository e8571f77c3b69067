/* Shapes: their text and element counts, and copies of blocks between row-major arrays. */
#include "dt.h"

#include <stdio.h>
#include <string.h>

char *dt__shape_str(char *buf, size_t size, int rank, const int64_t shape[])
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "[");
    for (int i = 0; i < rank; i++)
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%lld", i ? "," : "",
                              (long long)shape[i]);
    snprintf(buf + n, n < size ? size - n : 0, "]");
    return buf;
}

int64_t dt__num_elements(int rank, const int64_t shape[])
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

void dt__copy_block(void *dst, const int64_t dst_shape[], const int64_t dst_off[], const void *src,
                    const int64_t src_shape[], const int64_t src_off[], const int64_t extent[],
                    int rank, size_t elem_size)
{
    for (int i = 0; i < rank; i++)
        if (extent[i] == 0)
            return;
    if (rank == 0) {
        memcpy(dst, src, elem_size);
        return;
    }
    /* Row-major strides in elements. */
    int64_t dstride[DT_MAX_RANK], sstride[DT_MAX_RANK];
    dstride[rank - 1] = sstride[rank - 1] = 1;
    for (int i = rank - 2; i >= 0; i--) {
        dstride[i] = dstride[i + 1] * dst_shape[i + 1];
        sstride[i] = sstride[i + 1] * src_shape[i + 1];
    }
    /* Merge trailing axes copied whole in both arrays into one contiguous run. */
    int inner = rank - 1;
    int64_t run = extent[rank - 1];
    while (inner > 0 && extent[inner] == dst_shape[inner] && extent[inner] == src_shape[inner]) {
        inner--;
        run *= extent[inner];
    }
    size_t run_bytes = (size_t)run * elem_size;
    int64_t idx[DT_MAX_RANK] = {0};
    for (;;) {
        int64_t d = 0, s = 0;
        for (int i = 0; i < inner; i++) {
            d += (dst_off[i] + idx[i]) * dstride[i];
            s += (src_off[i] + idx[i]) * sstride[i];
        }
        d += dst_off[inner] * dstride[inner];
        s += src_off[inner] * sstride[inner];
        memcpy((char *)dst + (size_t)d * elem_size, (const char *)src + (size_t)s * elem_size,
               run_bytes);
        int i = inner - 1;
        while (i >= 0 && ++idx[i] == extent[i])
            idx[i--] = 0;
        if (i < 0)
            return;
    }
}
