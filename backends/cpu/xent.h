/* The CPU sparse softmax cross-entropy kernel (backends/cpu/xent.c), behind the kernel table's
 * XENT entries. Private to the CPU kernels. */
#ifndef DT_CPU_XENT_H
#define DT_CPU_XENT_H

#include "kernels.h"

/* Split over x's threads by rows. */
dt_status dt__cpu_xent_f32(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                           void *out);
dt_status dt__cpu_xent_f64(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                           void *out);
dt_status dt__cpu_xent_bf16(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                            void *out);
dt_status dt__cpu_xent_f16(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                           void *out);

#endif
