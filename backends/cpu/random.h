/* The CPU random-number kernels (backends/cpu/random.c), behind the kernel table's
 * PHILOX_UNIFORM and PHILOX_NORMAL entries. Private to the CPU kernels. */
#ifndef DT_CPU_RANDOM_H
#define DT_CPU_RANDOM_H

#include "kernels.h"

/* Split over x's threads by ranges of elements. */
#define DT__CPU_RANDOM_DECL(NAME)                                                                  \
    dt_status dt__cpu_uniform_##NAME(const dt__kctx *x, const dt__kargs *k,                        \
                                     const void *const in[], void *out);                           \
    dt_status dt__cpu_normal_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], \
                                    void *out);
DT__CPU_RANDOM_DECL(f32)
DT__CPU_RANDOM_DECL(f64)
DT__CPU_RANDOM_DECL(bf16)
DT__CPU_RANDOM_DECL(f16)
#undef DT__CPU_RANDOM_DECL

#endif
