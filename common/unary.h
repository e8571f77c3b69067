/* The floating-point functions of the unary op, in double: one definition for the CPU kernels
 * (C) and the CUDA kernels (nvcc), so both compute the same expression; only libm differs
 * (glibc or CUDA's, in the last bit). */
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
    case DT_UNARY_GELU:
        return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    case DT_UNARY_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
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

#endif /* DT_UNARY_H */
