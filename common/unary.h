/* The floating-point functions of the unary op: one definition for the CPU kernels (C) and the
 * CUDA kernels (nvcc), so both compute the same expression. The elementary functions (exp,
 * log, sqrt, rsqrt, tanh, sin, cos, erf) of f32, bf16 and f16 elements are computed in float
 * (dt__unary_in_float, dt__unary_float): each within 2 ulps of the exact value on every
 * backend (the CPU's vector kernels, backends/cpu/vmath.c, are SLEEF's 1-ulp functions; CUDA's
 * float functions are within 2), so the backends agree within 4 ulps, not bitwise. The
 * composite functions (sigmoid, silu, gelu, gelu_tanh), whose float evaluation would lose
 * accuracy to cancellation (1 + tanh near -1), and every function of f64 and of integers are
 * computed in double (dt__unary_f) and rounded once. */
#ifndef DT_UNARY_H
#define DT_UNARY_H

#include "dtensor.h"
#include "philox.h" /* DT__HD */

#include <math.h>

DT__HD double dt__unary_f(int op, double x)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_NEG:
        return -x;
    case DT_UNARY_ABS:
        return fabs(x);
    case DT_UNARY_EXP:
        return exp(x);
    case DT_UNARY_LOG:
        return log(x);
    case DT_UNARY_SQRT:
        return sqrt(x);
    case DT_UNARY_RELU:
        return x > 0 ? x : 0;
    case DT_UNARY_TANH:
        return tanh(x);
    case DT_UNARY_SIGMOID:
        return 1.0 / (1.0 + exp(-x));
    case DT_UNARY_SQUARE:
        return x * x;
    case DT_UNARY_SIN:
        return sin(x);
    case DT_UNARY_COS:
        return cos(x);
    case DT_UNARY_ERF:
        return erf(x);
    case DT_UNARY_GELU: /* 0.5 x (1 + erf(x / sqrt 2)) without the cancellation below 0 */
        return 0.5 * x * erfc(x * -0.70710678118654752440);
    case DT_UNARY_GELU_TANH: /* 0.5 x (1 + tanh(u)) as x / (1 + exp(-2u)): no cancellation */
        return x / (1.0 + exp(-1.59576912160573071176 * (x + 0.044715 * x * x * x)));
    case DT_UNARY_SILU:
        return x / (1.0 + exp(-x));
    case DT_UNARY_RSQRT:
        return 1.0 / sqrt(x);
    case DT_UNARY_LOGICAL_NOT:
        return x == 0;
    default:
        return x;
    }
}

/* Whether op is computed in float for the f32, bf16 and f16 elements. */
DT__HD int dt__unary_in_float(int op)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_EXP:
    case DT_UNARY_LOG:
    case DT_UNARY_SQRT:
    case DT_UNARY_RSQRT:
    case DT_UNARY_TANH:
    case DT_UNARY_SIN:
    case DT_UNARY_COS:
    case DT_UNARY_ERF:
        return 1;
    default:
        return 0;
    }
}

/* The elementary functions in float (dt__unary_in_float's ops; x otherwise). */
DT__HD float dt__unary_float(int op, float x)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_EXP:
        return expf(x);
    case DT_UNARY_LOG:
        return logf(x);
    case DT_UNARY_SQRT:
        return sqrtf(x);
    case DT_UNARY_RSQRT:
        return 1.0f / sqrtf(x);
    case DT_UNARY_TANH:
        return tanhf(x);
    case DT_UNARY_SIN:
        return sinf(x);
    case DT_UNARY_COS:
        return cosf(x);
    case DT_UNARY_ERF:
        return erff(x);
    default:
        return x;
    }
}

#endif /* DT_UNARY_H */
