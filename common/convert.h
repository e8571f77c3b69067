/* The one set of element conversions every backend uses: the 16-bit floats (bfloat16 and IEEE
 * binary16, stored as their bits) to and from f32 and f64, floats to integers as the CPU
 * reference converts them, and the reading of index operands. The CPU kernels (C) and the CUDA
 * kernels (nvcc) include this same file, so a conversion gives the same bits on both: the 16-bit
 * roundings are integer arithmetic on the bit patterns, and the only floating-point steps (f64 to
 * f32, comparisons, fabs) round correctly everywhere. */
#ifndef DT_CONVERT_H
#define DT_CONVERT_H

#include "dtensor.h" /* dt_dtype */
#include "philox.h"  /* DT__HD */

#include <math.h>
#include <stdint.h>
#include <string.h>

DT__HD uint32_t dt__f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

DT__HD float dt__f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* f32 -> bf16: the upper 16 bits, rounded to nearest even; NaN stays a (quiet) NaN. */
DT__HD uint16_t dt__f32_to_bf16(float x)
{
    uint32_t u = dt__f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u); /* a carry into the exponent rounds up to inf */
    return (uint16_t)(u >> 16);
}

DT__HD float dt__bf16_to_f32(uint16_t h)
{
    return dt__f32_from_bits((uint32_t)h << 16);
}

/* f32 -> f16, rounded to nearest even: 65520 and above overflow to inf, subnormals exact
 * multiples of 2^-24 (rounded), NaN quiet. */
DT__HD uint16_t dt__f32_to_f16(float x)
{
    uint32_t u = dt__f32_bits(x), sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (u >= 0x477ff000u) /* 65520: the tie between 65504 and 2^16 rounds to even (inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (u >= 0x38800000u) { /* normal: round the 23-bit mantissa to 10, then rebias */
        u += 0xfffu + ((u >> 13) & 1u);
        return (uint16_t)(sign | ((u >> 13) - (112u << 10)));
    }
    if (u <= 0x33000000u) /* up to 2^-25 (a tie with 0, which is even) */
        return (uint16_t)sign;
    /* subnormal: x / 2^-24 = significand * 2^(exponent - 126), rounded to nearest even */
    uint32_t e = u >> 23, m = (u & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

DT__HD float dt__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return dt__f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return dt__f32_from_bits(sign);
        e = 113; /* normalize the subnormal: m * 2^-24 */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return dt__f32_from_bits(sign | (e << 23) | ((m & 0x3ffu) << 13));
    }
    return dt__f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/* f64 -> f32 rounded to odd (inexact results get an odd last bit): rounding that to 16 bits
 * to nearest even then equals rounding the f64 once (24 >= 11 + 2 bits). */
DT__HD float dt__f64_to_f32_odd(double x)
{
    float f = (float)x;
    if ((double)f == x || x != x)
        return f;
    uint32_t u = dt__f32_bits(f);
    if (!(u & 1u))
        u = fabs((double)f) > fabs(x) ? u - 1u : u + 1u;
    return dt__f32_from_bits(u);
}

DT__HD uint16_t dt__f64_to_bf16(double x)
{
    return dt__f32_to_bf16(dt__f64_to_f32_odd(x));
}

DT__HD uint16_t dt__f64_to_f16(double x)
{
    return dt__f32_to_f16(dt__f64_to_f32_odd(x));
}

/* Float to integer as the x86 CPU reference converts (cvttsd2si): toward zero, and the most
 * negative integer for NaN and values out of range, where C leaves the conversion undefined.
 * The 8-bit integers go through i32 and wrap, as numpy's astype does on x86. */
DT__HD int32_t dt__f64_to_i32(double v)
{
    return v > -2147483649.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
}

DT__HD int64_t dt__f64_to_i64(double v)
{
    return v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? (int64_t)v : INT64_MIN;
}

/* Index i of an index operand of dtype t (gather, segment_sum, one_hot: the shape rules admit
 * i32, i64, u8 and i8; anything else selects nothing). */
DT__HD int64_t dt__index_at(dt_dtype t, const void *p, int64_t i)
{
    switch (t) {
    case DT_DTYPE_I64:
        return ((const int64_t *)p)[i];
    case DT_DTYPE_I32:
        return ((const int32_t *)p)[i];
    case DT_DTYPE_U8:
        return ((const uint8_t *)p)[i];
    case DT_DTYPE_I8:
        return ((const int8_t *)p)[i];
    default:
        return -1;
    }
}

#endif /* DT_CONVERT_H */
