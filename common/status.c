/* Status codes, the per-thread error message, dtype and reduction names. */
#include "convert.h"
#include "dt.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char dt__error[1024];

/* ---- the API lock ------------------------------------------------------------------------- */

static pthread_mutex_t api_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static _Thread_local int api_held; /* levels this thread holds */

void dt__api_lock(void)
{
    pthread_mutex_lock(&api_lock);
    api_held++;
}

void dt__api_unlock(void)
{
    api_held--;
    pthread_mutex_unlock(&api_lock);
}

int dt__api_suspend(void)
{
    int held = api_held;
    while (api_held > 0)
        dt__api_unlock();
    return held;
}

void dt__api_resume(int held)
{
    for (int i = 0; i < held; i++)
        dt__api_lock();
}

dt_status dt__fail(dt_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dt__error, sizeof dt__error, fmt, ap);
    va_end(ap);
    if (getenv("DTENSOR_LOG") && strcmp(getenv("DTENSOR_LOG"), "debug") == 0)
        fprintf(stderr, "dtensor: %s: %s\n", dt_status_name(s), dt__error);
    return s;
}

void dt__set_error(const char *msg)
{
    snprintf(dt__error, sizeof dt__error, "%s", msg);
}

const char *dt_last_error(void)
{
    return dt__error;
}

const char *dt_status_name(dt_status s)
{
    static const char *const names[] = {
#define NAME(name, desc) [DT_##name] = "DT_" #name,
        DT_STATUS_LIST(NAME)
#undef NAME
    };
    return (unsigned)s < DT_STATUS_COUNT ? names[s] : "DT_UNKNOWN_STATUS";
}

const char *dt_status_string(dt_status s)
{
    static const char *const descs[] = {
#define DESC(name, desc) [DT_##name] = desc,
        DT_STATUS_LIST(DESC)
#undef DESC
    };
    return (unsigned)s < DT_STATUS_COUNT ? descs[s] : "unknown status";
}

#ifndef DT_VERSION
#define DT_VERSION "unknown"
#endif
const char *dt_version(void)
{
    return DT_VERSION;
}

bool dt__dtype_valid(dt_dtype d)
{
    return (unsigned)d < DT_DTYPE_COUNT;
}

size_t dt_dtype_size(dt_dtype d)
{
    static const size_t sizes[] = {
#define SIZE(NAME, name, ctype) [DT_DTYPE_##NAME] = sizeof(ctype),
        DT_DTYPE_LIST(SIZE)
#undef SIZE
    };
    return dt__dtype_valid(d) ? sizes[d] : 0;
}

const char *dt_dtype_name(dt_dtype d)
{
    static const char *const names[] = {
#define DNAME(NAME, name, ctype) [DT_DTYPE_##NAME] = #name,
        DT_DTYPE_LIST(DNAME)
#undef DNAME
    };
    return dt__dtype_valid(d) ? names[d] : "?";
}

static unsigned kind_of(dt_dtype d)
{
    return dt_dtype_is_floating(d) ? DT__FLOATING : dt_dtype_is_integer(d) ? DT__INTEGER : DT__BOOL;
}

dt_status dt__dtype_check(const char *what, dt_dtype d, unsigned kinds)
{
    if (dt__dtype_valid(d) && (kind_of(d) & kinds))
        return DT_OK;
    char list[128] = "";
    size_t n = 0;
    int count = 0, total = 0;
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        total += (kind_of((dt_dtype)t) & kinds) != 0;
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        if (!(kind_of((dt_dtype)t) & kinds))
            continue;
        count++;
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s",
                              count == 1       ? ""
                              : count == total ? " or "
                                               : ", ",
                              dt_dtype_name((dt_dtype)t));
    }
    if (!dt__dtype_valid(d))
        return dt__fail(DT_ERR_DTYPE, "%s: dtype %d is not one of %s", what, (int)d, list);
    return dt__fail(DT_ERR_DTYPE, "%s: dtype %s, expected %s", what, dt_dtype_name(d), list);
}

dt_status dt__value_check(const char *what, double value, dt_dtype d)
{
    /* the integers' ranges; as doubles lo is exact and so is hi + 1 (a power of two) */
    int64_t lo, hi;
    switch (d) {
    case DT_DTYPE_I8:
        lo = INT8_MIN, hi = INT8_MAX;
        break;
    case DT_DTYPE_U8:
        lo = 0, hi = UINT8_MAX;
        break;
    case DT_DTYPE_I32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    case DT_DTYPE_I64:
        lo = INT64_MIN, hi = INT64_MAX;
        break;
    case DT_DTYPE_BOOL:
        if (isnan(value))
            return dt__fail(DT_ERR_ARG, "%s: value nan is not a bool", what);
        return DT_OK;
    default:
        return DT_OK;
    }
    double t = trunc(value), hi_excl = 2.0 * (double)(hi / 2 + 1);
    if (t >= (double)lo && t < hi_excl)
        return DT_OK;
    char v[48];
    if (fabs(value) < 0x1p64 && value == t) /* a whole number: every digit */
        snprintf(v, sizeof v, "%.0f", value);
    else
        snprintf(v, sizeof v, "%.17g", value);
    return dt__fail(DT_ERR_ARG, "%s: value %s does not fit %s (%lld to %lld)", what, v,
                    dt_dtype_name(d), (long long)lo, (long long)hi);
}

int dt_dtype_is_floating(dt_dtype d)
{
    return d == DT_DTYPE_F32 || d == DT_DTYPE_F64 || d == DT_DTYPE_BF16 || d == DT_DTYPE_F16;
}

int dt_dtype_is_integer(dt_dtype d)
{
    return d == DT_DTYPE_I32 || d == DT_DTYPE_I64 || d == DT_DTYPE_U8 || d == DT_DTYPE_I8;
}

dt_dtype dt_dtype_promote(dt_dtype a, dt_dtype b)
{
    if (!dt__dtype_valid(a) || !dt__dtype_valid(b))
        return DT_DTYPE_COUNT;
    if (a == b)
        return a;
    /* kind first (bool < integer < floating), then width; the pairs of one width that are
     * not ordered (bf16 / f16, u8 / i8) meet in the next wider type */
    int ka = dt_dtype_is_floating(a) ? 2 : dt_dtype_is_integer(a) ? 1 : 0;
    int kb = dt_dtype_is_floating(b) ? 2 : dt_dtype_is_integer(b) ? 1 : 0;
    if (ka != kb)
        return ka > kb ? a : b;
    size_t sa = dt_dtype_size(a), sb = dt_dtype_size(b);
    if (sa != sb)
        return sa > sb ? a : b;
    return ka == 2 ? DT_DTYPE_F32 : DT_DTYPE_I32;
}

uint16_t dt_f32_to_bf16(float x)
{
    return dt__f32_to_bf16(x);
}

float dt_bf16_to_f32(uint16_t x)
{
    return dt__bf16_to_f32(x);
}

uint16_t dt_f32_to_f16(float x)
{
    return dt__f32_to_f16(x);
}

float dt_f16_to_f32(uint16_t x)
{
    return dt__f16_to_f32(x);
}

uint16_t dt_f64_to_bf16(double x)
{
    return dt__f64_to_bf16(x);
}

uint16_t dt_f64_to_f16(double x)
{
    return dt__f64_to_f16(x);
}

const char *dt_reduce_op_name(dt_reduce_op op)
{
    static const char *const names[] = {
#define RNAME(NAME, name) [DT_REDUCE_##NAME] = #name,
        DT_REDUCE_LIST(RNAME)
#undef RNAME
    };
    return (unsigned)op < DT_REDUCE_COUNT ? names[op] : "?";
}

const char *dt_device_type_name(dt_device_type t)
{
    switch (t) {
    case DT_DEVICE_CPU:
        return "CPU";
    case DT_DEVICE_CUDA:
        return "CUDA";
    default:
        return "?";
    }
}

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
