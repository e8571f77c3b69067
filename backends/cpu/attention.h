/* The CPU attention kernel (backends/cpu/attention.c), behind the kernel table's entry. Private
 * to the CPU kernels. */
#ifndef DT_CPU_ATTENTION_H
#define DT_CPU_ATTENTION_H

#include "kernels.h"

/* Split over x's threads by slices (the leading axes). */
void dt__cpu_attention_f32(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                           void *out);
void dt__cpu_attention_f64(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                           void *out);

#endif
