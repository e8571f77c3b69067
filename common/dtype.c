/* Dtypes: sizes, names, kinds, checks of values against a dtype, promotion, and the public
 * conversions of the 16-bit floats (common/convert.h). */
#include "convert.h"
#include "dt.h"

#include <math.h>
#include <stdio.h>

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
