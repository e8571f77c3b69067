/* Vectorized float functions of the CPU kernels (backends/cpu/vmath.c, built with AVX2 and FMA). */
#ifndef DT_VMATH_H
#define DT_VMATH_H

#include <stdint.h>

/* y[i] = the unary op `op` of x[i] for i < n, f32 (the ops common/unary.h computes in float,
 * and sigmoid, silu, gelu, gelu_tanh in double rounded once). Only where the CPU has AVX2 and
 * FMA. */
void dt__vmath_unary_f32(int op, const float *x, float *y, int64_t n);

#endif /* DT_VMATH_H */
