/* The CPU index kernels (backends/cpu/gather.c), behind the kernel table's GATHER,
 * SEGMENT_SUM and ONE_HOT entries. Private to the CPU kernels. */
#ifndef DT_CPU_GATHER_H
#define DT_CPU_GATHER_H

#include "kernels.h"

#define DT__CPU_INDEX_DECL(K, NAME)                                                               \
    dt_status dt__cpu_##K##_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], \
                                   void *out);
#define DT__CPU_INDEX_NUMERIC(K) \
    DT__CPU_INDEX_DECL(K, f32)   \
    DT__CPU_INDEX_DECL(K, f64)   \
    DT__CPU_INDEX_DECL(K, i32)   \
    DT__CPU_INDEX_DECL(K, i64)   \
    DT__CPU_INDEX_DECL(K, bf16)  \
    DT__CPU_INDEX_DECL(K, f16) DT__CPU_INDEX_DECL(K, u8) DT__CPU_INDEX_DECL(K, i8)
DT__CPU_INDEX_NUMERIC(gather)
DT__CPU_INDEX_DECL(gather, boolean)
DT__CPU_INDEX_NUMERIC(one_hot)
DT__CPU_INDEX_DECL(one_hot, boolean)
DT__CPU_INDEX_NUMERIC(segment_sum)
#undef DT__CPU_INDEX_NUMERIC
#undef DT__CPU_INDEX_DECL

#endif
