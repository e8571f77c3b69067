/* The CPU kernels' dtypes (backends/cpu/kernels.c and the per-dtype template
 * backends/cpu/kernels_typed.h): how each dtype's elements are loaded, stored and compared, and
 * the list of dtypes. Private to the CPU kernels. */
#ifndef DT_OPS_CPU_DTYPES_H
#define DT_OPS_CPU_DTYPES_H

#include "convert.h"
#include "dt.h"

#include <math.h>
#include <stdint.h>

/* ---- per-dtype element access ----------------------------------------------------------- */

/* LD_x: storage -> compute; ST_x: compute -> storage; STD_x: double -> storage, rounded once;
 * STI_x: int64_t -> storage (integers wrap as C converts; floats round); NEG_x: is a compute
 * value negative (never, for unsigned types: written per dtype so no comparison is always
 * false). Floats to integers convert as the x86 reference does (common/convert.h). */
#define LD_f32(v) (v)
#define ST_f32(v) (v)
#define STD_f32(v) ((float)(v))
#define STI_f32(v) ((float)(v))
#define NEG_f32(v) ((v) < 0)
#define LD_f64(v) (v)
#define ST_f64(v) (v)
#define STD_f64(v) (v)
#define STI_f64(v) ((double)(v))
#define NEG_f64(v) ((v) < 0)
#define LD_i32(v) (v)
#define ST_i32(v) (v)
#define STD_i32(v) dt__f64_to_i32(v)
#define STI_i32(v) ((int32_t)(v))
#define NEG_i32(v) ((v) < 0)
#define LD_i64(v) (v)
#define ST_i64(v) (v)
#define STD_i64(v) dt__f64_to_i64(v)
#define STI_i64(v) ((int64_t)(v))
#define NEG_i64(v) ((v) < 0)
#define LD_bf16(v) dt__bf16_to_f32(v)
#define ST_bf16(v) dt__f32_to_bf16(v)
#define STD_bf16(v) dt__f64_to_bf16(v)
#define STI_bf16(v) dt__f64_to_bf16((double)(v))
#define NEG_bf16(v) ((v) < 0)
#define LD_f16(v) dt__f16_to_f32(v)
#define ST_f16(v) dt__f32_to_f16(v)
#define STD_f16(v) dt__f64_to_f16(v)
#define STI_f16(v) dt__f64_to_f16((double)(v))
#define NEG_f16(v) ((v) < 0)
#define LD_boolean(v) (v)
#define ST_boolean(v) ((uint8_t)((v) != 0))
#define STD_boolean(v) ((uint8_t)((v) != 0))
#define STI_boolean(v) ((uint8_t)((v) != 0))
#define NEG_boolean(v) 0
#define LD_u8(v) (v)
#define ST_u8(v) (v)
#define STD_u8(v) ((uint8_t)dt__f64_to_i32(v))
#define STI_u8(v) ((uint8_t)(v))
#define NEG_u8(v) 0
#define LD_i8(v) (v)
#define ST_i8(v) (v)
#define STD_i8(v) ((int8_t)dt__f64_to_i32(v))
#define STI_i8(v) ((int8_t)(v))
#define NEG_i8(v) ((v) < 0)

/* One row per dtype: name, S, C, is_float, is_signed, lowest, highest -- the kernels' view of
 * DT_DTYPE_LIST (lowest and highest in C: the identities of max and min). */
#define CPU_F32 f32, float, float, 1, 1, -INFINITY, INFINITY
#define CPU_F64 f64, double, double, 1, 1, -INFINITY, INFINITY
#define CPU_I32 i32, int32_t, int32_t, 0, 1, INT32_MIN, INT32_MAX
#define CPU_I64 i64, int64_t, int64_t, 0, 1, INT64_MIN, INT64_MAX
#define CPU_BF16 bf16, uint16_t, float, 1, 1, -INFINITY, INFINITY
#define CPU_F16 f16, uint16_t, float, 1, 1, -INFINITY, INFINITY
#define CPU_BOOLEAN boolean, uint8_t, uint8_t, 0, 0, 0, 1
#define CPU_U8 u8, uint8_t, uint8_t, 0, 0, 0, UINT8_MAX
#define CPU_I8 i8, int8_t, int8_t, 0, 1, INT8_MIN, INT8_MAX

/* X(name, S, C, is_float, is_signed, lowest, highest) for each row above. */
#define CPU_ROW(X, ...) X(__VA_ARGS__)
#define CPU_DTYPES(X)       \
    CPU_ROW(X, CPU_F32)     \
    CPU_ROW(X, CPU_F64)     \
    CPU_ROW(X, CPU_I32)     \
    CPU_ROW(X, CPU_I64)     \
    CPU_ROW(X, CPU_BF16)    \
    CPU_ROW(X, CPU_F16)     \
    CPU_ROW(X, CPU_BOOLEAN) \
    CPU_ROW(X, CPU_U8)      \
    CPU_ROW(X, CPU_I8)

/* The dtype of a kernel name, where the float functions above take it. */
#define FLOATS_f32 DT_DTYPE_F32
#define FLOATS_bf16 DT_DTYPE_BF16
#define FLOATS_f16 DT_DTYPE_F16
#define FLOATS_f64 DT_DTYPE_COUNT
#define FLOATS_i32 DT_DTYPE_COUNT
#define FLOATS_i64 DT_DTYPE_COUNT
#define FLOATS_boolean DT_DTYPE_COUNT
#define FLOATS_u8 DT_DTYPE_COUNT
#define FLOATS_i8 DT_DTYPE_COUNT

#endif
