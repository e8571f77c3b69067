/* The float functions of the unary op on f32 elements, 8 at a time with AVX2 and SLEEF
 * (common/unary.h gives the definitions): the elementary functions in float (SLEEF's 1-ulp
 * functions; sqrt and rsqrt from the correctly rounded vector square root), the composites in
 * double (SLEEF's 1-ulp double functions, the expression of dt__unary_f operation for
 * operation) and rounded once; gelu in float from a corrected argument where its inputs allow
 * (gelu8). Compiled with -mavx2 -mfma and called only where the CPU has
 * both (dt__vmath_usable, backends/cpu/kernels.c). */
#include "vmath.h"

#include "unary.h"

#include <float.h>
#include <immintrin.h>
#include <sleef.h>
#include <stdbool.h>

/* Four floats widened to double, op of dt__unary_f in double, rounded back. */
static __m128 composite4(int op, __m128 xf)
{
    __m256d x = _mm256_cvtps_pd(xf), one = _mm256_set1_pd(1.0), r;
    switch ((dt_unary_op)op) {
    case DT_UNARY_SIGMOID: /* 1 / (1 + exp(-x)) */
        r = _mm256_div_pd(
            one, _mm256_add_pd(one, Sleef_expd4_u10(_mm256_sub_pd(_mm256_setzero_pd(), x))));
        break;
    case DT_UNARY_SILU: /* x / (1 + exp(-x)) */
        r = _mm256_div_pd(
            x, _mm256_add_pd(one, Sleef_expd4_u10(_mm256_sub_pd(_mm256_setzero_pd(), x))));
        break;
    case DT_UNARY_GELU: { /* 0.5 x erfc(-x / sqrt 2) */
        __m256d e = Sleef_erfcd4_u15(_mm256_mul_pd(x, _mm256_set1_pd(-0.70710678118654752440)));
        r = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), x), e);
        break;
    }
    case DT_UNARY_GELU_TANH: { /* x / (1 + exp(-2 c (x + k x x x))) */
        __m256d k = _mm256_set1_pd(0.044715), c2 = _mm256_set1_pd(-1.59576912160573071176);
        __m256d cube = _mm256_mul_pd(_mm256_mul_pd(_mm256_mul_pd(k, x), x), x);
        __m256d e = Sleef_expd4_u10(_mm256_mul_pd(c2, _mm256_add_pd(x, cube)));
        r = _mm256_div_pd(x, _mm256_add_pd(one, e));
        break;
    }
    default:
        r = x;
    }
    return _mm256_cvtpd_ps(r);
}

/* Eight floats through composite4. */
static __m256 composite8(int op, __m256 x)
{
    __m128 lo = composite4(op, _mm256_castps256_ps128(x));
    __m128 hi = composite4(op, _mm256_extractf128_ps(x, 1));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

/* gelu in float where every lane is in [-12, FLT_MAX] (else false: the double composite):
 * 0.5 x erfc(z), z = -x / sqrt 2 carried as zf + dz (the product's rounding error from an fma,
 * and the constant's own), erfc(zf + dz) = erfc(zf) + erfc'(zf) dz to first order, the
 * correction computed with SLEEF's float exp (its relative error matters only at 2^-24 of
 * the result), and one rounding at the end: within 2 ulps of the double reference (every
 * seventh float of [-12, 12] checked; most within 1), at 6.7 ns an element against the double
 * composite's 16. Below -12 erfc(zf) nears the subnormals, and infinities and NaN make dz NaN:
 * those go through the double composite. */
static bool gelu8(__m256 x, __m256 *y)
{
    const __m256 lo = _mm256_set1_ps(-12.0f), hi = _mm256_set1_ps(FLT_MAX);
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LE_OQ));
    if (_mm256_movemask_ps(in) != 0xff)
        return false;
    const __m256 c_hi = _mm256_set1_ps(-0.707106769f); /* -1 / sqrt 2 rounded to float */
    const __m256 c_lo = _mm256_set1_ps((float)(-0.70710678118654752440 - (double)-0.707106769f));
    __m256 z = _mm256_mul_ps(x, c_hi);
    __m256 dz = _mm256_fmadd_ps(x, c_lo, _mm256_fmsub_ps(x, c_hi, z));
    /* erfc'(z) = -2 / sqrt(pi) exp(-z^2) */
    __m256 d =
        _mm256_mul_ps(_mm256_set1_ps(-1.12837916709551257390f),
                      Sleef_expf8_u10(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), z), z)));
    __m256 h = _mm256_mul_ps(_mm256_set1_ps(0.5f), x);
    *y = _mm256_fmadd_ps(h, Sleef_erfcf8_u15(z), _mm256_mul_ps(h, _mm256_mul_ps(d, dz)));
    return true;
}

static __m256 apply8(int op, __m256 x)
{
    __m256 y;
    switch ((dt_unary_op)op) {
    case DT_UNARY_EXP:
        return Sleef_expf8_u10(x);
    case DT_UNARY_LOG:
        return Sleef_logf8_u10(x);
    case DT_UNARY_SQRT:
        return _mm256_sqrt_ps(x);
    case DT_UNARY_RSQRT:
        return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(x));
    case DT_UNARY_TANH:
        return Sleef_tanhf8_u10(x);
    case DT_UNARY_SIN:
        return Sleef_sinf8_u10(x);
    case DT_UNARY_COS:
        return Sleef_cosf8_u10(x);
    case DT_UNARY_ERF:
        return Sleef_erff8_u10(x);
    case DT_UNARY_GELU:
        return gelu8(x, &y) ? y : composite8(op, x);
    default:
        return composite8(op, x);
    }
}

void dt__vmath_unary_f32(int op, const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, apply8(op, _mm256_loadu_ps(x + i)));
    if (i < n) { /* the tail through a padded block (ones: defined for every function) */
        float in[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8];
        for (int64_t j = i; j < n; j++)
            in[j - i] = x[j];
        _mm256_storeu_ps(out, apply8(op, _mm256_loadu_ps(in)));
        for (int64_t j = i; j < n; j++)
            y[j] = out[j - i];
    }
}
