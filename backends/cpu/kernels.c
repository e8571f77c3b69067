/* CPU local kernels: the (kernel, dtype) table. Reference loops, OpenBLAS for gemm.
 * Kernels see local shapes only (plus global offsets for index-dependent values).
 *
 * Each dtype has a storage type S (what a buffer holds) and a compute type C: the same for
 * f32, f64 and the integers; f32 for bf16 and f16, which are loaded exactly, computed in f32
 * and rounded to nearest even once on store (common/convert.h); bool is a byte 0 or 1. Values
 * computed in double (float functions, fill values, arange, random numbers) are rounded once
 * from double. The shape rules (spmd/ops/) refuse dtypes an op does not take (arithmetic on
 * bool, float functions of bool, random integers), so the loops below never see them. */
#include "attention.h"
#include "dtypes.h"
#include "gather.h"
#include "index.h"
#include "pool.h"
#include "random.h"
#include "unary.h"
#include "vmath.h"
#include "xent.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *dt__kernel_name(dt__kernel k)
{
    static const char *const names[] = {
#define KNAME(NAME, name) [DT__K_##NAME] = #name,
        DT__KERNEL_LIST(KNAME)
#undef KNAME
    };
    return (unsigned)k < DT__KERNEL_COUNT ? names[k] : "?";
}

/* ---- transposition ------------------------------------------------------------------------ */

/* out = in[0] with its axes permuted (out axis i is in axis k->perm[i]), elements of `size`
 * bytes: output axes merged where they are consecutive in the input too, then rows of the last
 * merged axis copied whole (a memcpy where the input is contiguous along it, else a strided
 * loop of that element size), the source offset carried from row to row. */
#define TRANSPOSE_ROWS(T)                                          \
    for (int64_t q = 0; q < rows; q++, o += row * (int64_t)size) { \
        const T *s_ = (const T *)(src + off * (int64_t)size);      \
        T *o_ = (T *)o;                                            \
        for (int64_t j = 0; j < row; j++)                          \
            o_[j] = s_[j * step];                                  \
        for (int d = nd - 2; d >= 0; d--) {                        \
            off += st[d];                                          \
            if (++idx[d] < ext[d])                                 \
                break;                                             \
            off -= st[d] * ext[d];                                 \
            idx[d] = 0;                                            \
        }                                                          \
    }
static void transpose_elements(const dt__kargs *k, const void *in, void *out, size_t size)
{
    int64_t si[DT_MAX_RANK], ext[DT_MAX_RANK], st[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    int nd = 0;
    strides_of(k->rank, k->in_shape[0], si);
    for (int i = 0; i < k->rank; i++) {
        int64_t e = k->shape[i], s = si[k->perm[i]];
        if (e == 1)
            continue;
        if (nd > 0 && st[nd - 1] == s * e) {
            ext[nd - 1] *= e;
            st[nd - 1] = s;
            continue;
        }
        ext[nd] = e;
        st[nd++] = s;
    }
    int64_t n = dt__num_elements(k->rank, k->shape);
    int64_t row = nd ? ext[nd - 1] : 1, step = nd ? st[nd - 1] : 1, rows = n ? n / row : 0, off = 0;
    const unsigned char *src = in;
    unsigned char *o = out;
    if (step == 1) {
        for (int64_t q = 0; q < rows; q++, o += row * (int64_t)size) {
            memcpy(o, src + off * (int64_t)size, (size_t)row * size);
            for (int d = nd - 2; d >= 0; d--) {
                off += st[d];
                if (++idx[d] < ext[d])
                    break;
                off -= st[d] * ext[d];
                idx[d] = 0;
            }
        }
        return;
    }
    switch (size) {
    case 1:
        TRANSPOSE_ROWS(uint8_t)
        break;
    case 2:
        TRANSPOSE_ROWS(uint16_t)
        break;
    case 4:
        TRANSPOSE_ROWS(uint32_t)
        break;
    default:
        TRANSPOSE_ROWS(uint64_t)
        break;
    }
}
#undef TRANSPOSE_ROWS

/* ---- float functions, a block at a time ---------------------------------------------------- */

enum { FLOAT_BLOCK = 256 };

/* The float functions of the unary op on f32, bf16 and f16 elements (common/unary.h): blocks
 * of up to FLOAT_BLOCK elements widened to f32 (the 16-bit floats), computed by the vector
 * functions where the CPU has AVX2 and FMA (backends/cpu/vmath.c; else element by element, the
 * same definitions), rounded back to the element's dtype. False for any other dtype. */
static bool unary_floats(dt_dtype dt, int op, const void *x, void *y, int64_t n)
{
    if (dt != DT_DTYPE_F32 && dt != DT_DTYPE_BF16 && dt != DT_DTYPE_F16)
        return false;
    bool vec = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    float in[FLOAT_BLOCK], out[FLOAT_BLOCK];
    for (int64_t at = 0; at < n; at += FLOAT_BLOCK) {
        int64_t m = n - at < FLOAT_BLOCK ? n - at : FLOAT_BLOCK;
        const uint16_t *h = (const uint16_t *)x + at;
        const float *xi = dt == DT_DTYPE_F32 ? (const float *)x + at : in;
        float *yo = dt == DT_DTYPE_F32 ? (float *)y + at : out;
        if (dt == DT_DTYPE_BF16)
            for (int64_t j = 0; j < m; j++)
                in[j] = dt__bf16_to_f32(h[j]);
        else if (dt == DT_DTYPE_F16)
            for (int64_t j = 0; j < m; j++)
                in[j] = dt__f16_to_f32(h[j]);
        if (vec)
            dt__vmath_unary_f32(op, xi, yo, m);
        else if (dt__unary_in_float(op))
            for (int64_t j = 0; j < m; j++)
                yo[j] = dt__unary_float(op, xi[j]);
        else
            for (int64_t j = 0; j < m; j++)
                yo[j] = (float)dt__unary_f(op, (double)xi[j]);
        uint16_t *o = (uint16_t *)y + at;
        if (dt == DT_DTYPE_BF16)
            for (int64_t j = 0; j < m; j++)
                o[j] = dt__f32_to_bf16(out[j]);
        else if (dt == DT_DTYPE_F16)
            for (int64_t j = 0; j < m; j++)
                o[j] = dt__f32_to_f16(out[j]);
    }
    return true;
}

/* The elementwise and reduce loops compiled twice, for the baseline x86-64 (SSE2) and for AVX2, the
 * one the CPU runs chosen when the library loads; the same IEEE operations (no contraction into
 * FMA: -ffp-contract=off), so the same results, on vectors twice as wide. Not under
 * ThreadSanitizer: the clones' resolver runs while the dynamic loader relocates the library,
 * before the sanitizer's runtime is up, and its instrumented code crashes there. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define CPU_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_VECTOR_CLONES
#endif

/* Running values a blocked reduction keeps (the reduce kernels of kernels_typed.h), and rows
 * a reduction over rows advances together (their sums are independent chains of additions,
 * which the CPU overlaps). */
enum { REDUCE_BLOCK = 256, ROW_BLOCK = 8 };

/* ---- typed kernels ----------------------------------------------------------------------- */

/* backends/cpu/kernels_typed.h once per dtype of CPU_DTYPES (a dtype left out here leaves its
 * functions undefined in the table below: a compile error). */
#define CPU_KT CPU_F32
#include "kernels_typed.h"
#define CPU_KT CPU_F64
#include "kernels_typed.h"
#define CPU_KT CPU_I32
#include "kernels_typed.h"
#define CPU_KT CPU_I64
#include "kernels_typed.h"
#define CPU_KT CPU_BF16
#include "kernels_typed.h"
#define CPU_KT CPU_F16
#include "kernels_typed.h"
#define CPU_KT CPU_BOOLEAN
#include "kernels_typed.h"
#define CPU_KT CPU_U8
#include "kernels_typed.h"
#define CPU_KT CPU_I8
#include "kernels_typed.h"

/* ---- cast: out (the table's dtype) from k->from, broadcast from in_shape[0] -------------- */

/* X(NAME, ...) again with an extra first argument (the cast's result), for the nested list. */
#define CPU_DTYPES_ARG(X, A)        \
    X(A, f32, float, F32, 1)        \
    X(A, f64, double, F64, 1)       \
    X(A, i32, int32_t, I32, 0)      \
    X(A, i64, int64_t, I64, 0)      \
    X(A, bf16, uint16_t, BF16, 1)   \
    X(A, f16, uint16_t, F16, 1)     \
    X(A, boolean, uint8_t, BOOL, 0) \
    X(A, u8, uint8_t, U8, 0)        \
    X(A, i8, int8_t, I8, 0)

/* Integers and bool go through int64_t, floats through double (both exact), then convert
 * once to the result (STI / STD). */
#define CAST_FROM(NAME, FNAME, FS, FENUM, FIS_FLOAT)                              \
    case DT_DTYPE_##FENUM: {                                                      \
        const FS *x = in[0];                                                      \
        if (one) { /* one element broadcast: converted once */                    \
            __typeof__(*o) v = FIS_FLOAT ? STD_##NAME((double)LD_##FNAME(x[0]))   \
                                         : STI_##NAME((int64_t)LD_##FNAME(x[0])); \
            for (int64_t i = 0; i < n; i++)                                       \
                o[i] = v;                                                         \
            break;                                                                \
        }                                                                         \
        for (int64_t i = 0; i < n; i++) {                                         \
            FS v = x[plain ? i : offset_of(r, idx, sx)];                          \
            o[i] = FIS_FLOAT ? STD_##NAME((double)LD_##FNAME(v))                  \
                             : STI_##NAME((int64_t)LD_##FNAME(v));                \
            if (!plain)                                                           \
                next_index(r, k->shape, idx);                                     \
        }                                                                         \
        break;                                                                    \
    }

#define DEFINE_CAST(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)                       \
    static void cast_##NAME(const dt__kargs *k, const void *const in[], void *out)          \
    {                                                                                       \
        S *o = out;                                                                         \
        int r = k->rank;                                                                    \
        int64_t n = dt__num_elements(r, k->shape), sx[DT_MAX_RANK], idx[DT_MAX_RANK] = {0}; \
        bool plain = same_shapes(k, 1), one = !plain && n > 0;                              \
        for (int i = 0; one && i < r; i++)                                                  \
            one = k->in_shape[0][i] == 1;                                                   \
        bcast_strides(r, k->in_shape[0], sx);                                               \
        switch (k->from) {                                                                  \
            CPU_DTYPES_ARG(CAST_FROM, NAME)                                                 \
        default:                                                                            \
            break;                                                                          \
        }                                                                                   \
    }
CPU_DTYPES(DEFINE_CAST)

/* ---- row-wise kernels: softmax, norm, scan, arg_reduce (modes in common/kernels.h) -------- */

/* exp and log in a compute type (float: the f32 functions; double: the f64 ones). */
#define CEXP(C, v) ((C)(sizeof(C) == sizeof(double) ? exp((double)(v)) : expf((float)(v))))
#define CLOG(C, v) ((C)(sizeof(C) == sizeof(double) ? log((double)(v)) : logf((float)(v))))
/* TensorFlow's shift of reduce_logsumexp: the maximum where it is finite, else 0. */
#define SHIFT(C, m) (isfinite((double)(m)) ? (m) : (C)0)

/* S: storage; C: compute and accumulation type (float for f32, bf16, f16; double for f64).
 * Sums over a row accumulate in double and round once to C. */
#define DEFINE_SOFTMAX(NAME, S, C)                                                            \
    static void softmax_generic_##NAME(const dt__kargs *k, const void *const in[], void *out) \
    {                                                                                         \
        /* any mask: m and s broadcast over the masked axes */                                \
        unsigned mode = DT__MODE_KIND(k->mode);                                               \
        const S *x = in[0], *m = in[1];                                                       \
        const C *s = in[2];                                                                   \
        int r = k->rank;                                                                      \
        const int64_t *xs = k->in_shape[0];                                                   \
        int64_t ks[DT_MAX_RANK], sm[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};                     \
        for (int i = 0; i < r; i++)                                                           \
            ks[i] = (k->mask & (1u << i)) ? 1 : xs[i];                                        \
        bcast_strides(r, ks, sm);                                                             \
        for (int i = 0; i < r; i++)                                                           \
            if (k->mask & (1u << i))                                                          \
                sm[i] = 0;                                                                    \
        int64_t nx = dt__num_elements(r, xs), nk = dt__num_elements(r, ks);                   \
        for (int64_t q = 0; mode == DT__SOFTMAX_SUMEXP && q < nk; q++)                        \
            ((C *)out)[q] = 0;                                                                \
        for (int64_t q = 0; mode == DT__SOFTMAX_MAX && q < nk; q++)                           \
            ((S *)out)[q] = ST_##NAME(-INFINITY);                                             \
        for (int64_t i = 0; i < nx; i++) {                                                    \
            int64_t q = offset_of(r, idx, sm);                                                \
            C v = LD_##NAME(x[i]);                                                            \
            if (mode == DT__SOFTMAX_MAX) {                                                    \
                if (v > LD_##NAME(((S *)out)[q]))                                             \
                    ((S *)out)[q] = x[i];                                                     \
                next_index(r, xs, idx);                                                       \
                continue;                                                                     \
            }                                                                                 \
            C sh = SHIFT(C, LD_##NAME(m[q]));                                                 \
            if (mode == DT__SOFTMAX_SUMEXP)                                                   \
                ((C *)out)[q] += CEXP(C, v - sh);                                             \
            else if (mode == DT__SOFTMAX_SOFTMAX)                                             \
                ((S *)out)[i] = ST_##NAME(CEXP(C, v - sh) / s[q]);                            \
            else                                                                              \
                ((S *)out)[i] = ST_##NAME(v - sh - CLOG(C, s[q]));                            \
            next_index(r, xs, idx);                                                           \
        }                                                                                     \
    }                                                                                         \
    static void softmax_##NAME(const dt__kargs *k, const void *const in[], void *out)         \
    {                                                                                         \
        unsigned mode = DT__MODE_KIND(k->mode);                                               \
        if (mode == DT__SOFTMAX_LSE) {                                                        \
            const S *m = in[0];                                                               \
            const C *s = in[1];                                                               \
            S *o = out;                                                                       \
            int64_t n = dt__num_elements(k->rank, k->shape);                                  \
            for (int64_t i = 0; i < n; i++)                                                   \
                o[i] = ST_##NAME(SHIFT(C, LD_##NAME(m[i])) + CLOG(C, s[i]));                  \
            return;                                                                           \
        }                                                                                     \
        int64_t outer, n, inner;                                                              \
        if (!row_view(k->rank, k->in_shape[0], k->mask, &outer, &n, &inner)) {                \
            softmax_generic_##NAME(k, in, out);                                               \
            return;                                                                           \
        }                                                                                     \
        const S *x = in[0], *m = in[1];                                                       \
        /* rows (inner 1) ROW_BLOCK at a time, their running values independent chains; each  \
         * row the same operations in the same order as alone */                              \
        int64_t o0 = inner == 1 ? outer / ROW_BLOCK * ROW_BLOCK : 0;                          \
        if (mode == DT__SOFTMAX_MAX) {                                                        \
            S *mo = out;                                                                      \
            for (int64_t o = 0; o < o0; o += ROW_BLOCK) {                                     \
                C best[ROW_BLOCK];                                                            \
                for (int b = 0; b < ROW_BLOCK; b++)                                           \
                    best[b] = -INFINITY;                                                      \
                for (int64_t j = 0; j < n; j++)                                               \
                    for (int b = 0; b < ROW_BLOCK; b++) {                                     \
                        C v = LD_##NAME(x[(o + b) * n + j]);                                  \
                        best[b] = v > best[b] ? v : best[b];                                  \
                    }                                                                         \
                for (int b = 0; b < ROW_BLOCK; b++)                                           \
                    mo[o + b] = ST_##NAME(best[b]);                                           \
            }                                                                                 \
            for (int64_t o = o0; o < outer; o++)                                              \
                for (int64_t i = 0; i < inner; i++) {                                         \
                    const S *row = x + o * n * inner + i;                                     \
                    C best = -INFINITY;                                                       \
                    for (int64_t j = 0; j < n; j++) {                                         \
                        C v = LD_##NAME(row[j * inner]);                                      \
                        best = v > best ? v : best;                                           \
                    }                                                                         \
                    mo[o * inner + i] = ST_##NAME(best);                                      \
                }                                                                             \
            return;                                                                           \
        }                                                                                     \
        if (mode == DT__SOFTMAX_SUMEXP) {                                                     \
            C *s = out;                                                                       \
            for (int64_t o = 0; o < o0; o += ROW_BLOCK) {                                     \
                C sh[ROW_BLOCK];                                                              \
                double acc[ROW_BLOCK];                                                        \
                for (int b = 0; b < ROW_BLOCK; b++) {                                         \
                    sh[b] = SHIFT(C, LD_##NAME(m[o + b]));                                    \
                    acc[b] = 0;                                                               \
                }                                                                             \
                for (int64_t j = 0; j < n; j++)                                               \
                    for (int b = 0; b < ROW_BLOCK; b++)                                       \
                        acc[b] += (double)CEXP(C, LD_##NAME(x[(o + b) * n + j]) - sh[b]);     \
                for (int b = 0; b < ROW_BLOCK; b++)                                           \
                    s[o + b] = (C)acc[b];                                                     \
            }                                                                                 \
            for (int64_t o = o0; o < outer; o++)                                              \
                for (int64_t i = 0; i < inner; i++) {                                         \
                    const S *row = x + o * n * inner + i;                                     \
                    C sh = SHIFT(C, LD_##NAME(m[o * inner + i]));                             \
                    double acc = 0;                                                           \
                    for (int64_t j = 0; j < n; j++)                                           \
                        acc += (double)CEXP(C, LD_##NAME(row[j * inner]) - sh);               \
                    s[o * inner + i] = (C)acc;                                                \
                }                                                                             \
            return;                                                                           \
        }                                                                                     \
        const C *s = in[2];                                                                   \
        S *y = out;                                                                           \
        for (int64_t o = 0; o < outer; o++)                                                   \
            for (int64_t i = 0; i < inner; i++) {                                             \
                int64_t q = o * inner + i, at = o * n * inner + i;                            \
                C sh = SHIFT(C, LD_##NAME(m[q]));                                             \
                if (mode == DT__SOFTMAX_SOFTMAX) {                                            \
                    C inv = (C)1 / s[q];                                                      \
                    for (int64_t j = 0; j < n; j++, at += inner)                              \
                        y[at] = ST_##NAME(CEXP(C, LD_##NAME(x[at]) - sh) * inv);              \
                } else {                                                                      \
                    C off = sh + CLOG(C, s[q]);                                               \
                    for (int64_t j = 0; j < n; j++, at += inner)                              \
                        y[at] = ST_##NAME(LD_##NAME(x[at]) - off);                            \
                }                                                                             \
            }                                                                                 \
    }
DEFINE_SOFTMAX(f32, float, float)
DEFINE_SOFTMAX(f64, double, double)
DEFINE_SOFTMAX(bf16, uint16_t, float)
DEFINE_SOFTMAX(f16, uint16_t, float)

/* Over the last axis: rows of n elements; statistics in C (one per row), sums in double. */
#define DEFINE_NORM(NAME, S, C)                                                              \
    static void norm_##NAME(const dt__kargs *k, const void *const in[], void *out)           \
    {                                                                                        \
        const S *x = in[0];                                                                  \
        int r = k->rank;                                                                     \
        const int64_t *xs = k->in_shape[0];                                                  \
        int64_t n = r ? xs[r - 1] : 1, rows = 1;                                             \
        for (int i = 0; i + 1 < r; i++)                                                      \
            rows *= xs[i];                                                                   \
        unsigned mode = DT__MODE_KIND(k->mode);                                              \
        if (mode == DT__NORM_MEAN || mode == DT__NORM_VAR || mode == DT__NORM_MEAN_SQUARE) { \
            const C *mu = in[1];                                                             \
            C *st = out;                                                                     \
            int64_t q0 = rows / ROW_BLOCK * ROW_BLOCK;                                       \
            /* ROW_BLOCK rows at a time (independent chains), each as alone below */         \
            for (int64_t q = 0; q < q0; q += ROW_BLOCK) {                                    \
                double acc[ROW_BLOCK], c[ROW_BLOCK];                                         \
                for (int b = 0; b < ROW_BLOCK; b++) {                                        \
                    acc[b] = 0;                                                              \
                    c[b] = mode == DT__NORM_VAR ? (double)mu[q + b] : 0;                     \
                }                                                                            \
                for (int64_t j = 0; j < n; j++)                                              \
                    for (int b = 0; b < ROW_BLOCK; b++) {                                    \
                        double v = (double)LD_##NAME(x[(q + b) * n + j]) - c[b];             \
                        acc[b] += mode == DT__NORM_MEAN ? v : v * v;                         \
                    }                                                                        \
                for (int b = 0; b < ROW_BLOCK; b++)                                          \
                    st[q + b] = (C)(acc[b] * k->a);                                          \
            }                                                                                \
            for (int64_t q = q0; q < rows; q++) {                                            \
                const S *row = x + q * n;                                                    \
                double acc = 0, c = mode == DT__NORM_VAR ? (double)mu[q] : 0;                \
                for (int64_t j = 0; j < n; j++) {                                            \
                    double v = (double)LD_##NAME(row[j]) - c;                                \
                    acc += mode == DT__NORM_MEAN ? v : v * v;                                \
                }                                                                            \
                st[q] = (C)(acc * k->a);                                                     \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        bool layer = mode == DT__NORM_LAYER;                                                 \
        const C *mu = layer ? in[1] : NULL, *var = layer ? in[2] : in[1];                    \
        int next = layer ? 3 : 2;                                                            \
        const S *gamma = (k->mode & DT__NORM_GAMMA) ? in[next++] : NULL;                     \
        const S *beta = (k->mode & DT__NORM_BETA) ? in[next] : NULL;                         \
        S *y = out;                                                                          \
        for (int64_t q = 0; q < rows; q++) {                                                 \
            C c = mu ? mu[q] : (C)0, rs = (C)(1.0 / sqrt((double)var[q] + k->b));            \
            const S *row = x + q * n;                                                        \
            S *yr = y + q * n;                                                               \
            for (int64_t j = 0; j < n; j++) {                                                \
                C v = (LD_##NAME(row[j]) - c) * rs;                                          \
                if (gamma)                                                                   \
                    v *= LD_##NAME(gamma[j]);                                                \
                if (beta)                                                                    \
                    v += LD_##NAME(beta[j]);                                                 \
                yr[j] = ST_##NAME(v);                                                        \
            }                                                                                \
        }                                                                                    \
    }
DEFINE_NORM(f32, float, float)
DEFINE_NORM(f64, double, double)
DEFINE_NORM(bf16, uint16_t, float)
DEFINE_NORM(f16, uint16_t, float)

/* Running sums along k->axis in C (integers wrap). A row (inner == 1) keeps its sum in a
 * register; interleaved columns (inner > 1) keep one sum per column and advance a whole row of
 * columns at a time (one column at a time when there is no memory for the sums). */
#define SCAN_STEP(NAME, C, a, xv, yp) \
    do {                              \
        C v_ = LD_##NAME(xv);         \
        if (excl) {                   \
            *(yp) = ST_##NAME(a);     \
            (a) = DT__ADD((a), v_);   \
        } else {                      \
            (a) = DT__ADD((a), v_);   \
            *(yp) = ST_##NAME(a);     \
        }                             \
    } while (0)
#define DEFINE_SCAN(NAME, S, C)                                                              \
    /* the totals of the shards before `start` (after it, when rev) for column i of row o */ \
    static C scan_carry_##NAME(const C *tot, int64_t g, int64_t start, bool rev, int64_t o,  \
                               int64_t i, int64_t inner)                                     \
    {                                                                                        \
        C a = 0;                                                                             \
        for (int64_t b = rev ? start + 1 : 0; tot && b < (rev ? g : start); b++)             \
            a = DT__ADD(a, tot[(o * g + b) * inner + i]);                                    \
        return a;                                                                            \
    }                                                                                        \
    static void scan_##NAME(const dt__kargs *k, const void *const in[], void *out)           \
    {                                                                                        \
        const S *x = in[0];                                                                  \
        S *y = out;                                                                          \
        int64_t outer, n, inner;                                                             \
        row_view(k->rank, k->in_shape[0], 1u << k->axis, &outer, &n, &inner);                \
        if (DT__MODE_KIND(k->mode) == DT__SCAN_TOTAL) {                                      \
            C *t = out;                                                                      \
            for (int64_t o = 0; o < outer; o++) {                                            \
                C *tr = t + o * inner;                                                       \
                if (inner == 1) { /* a row: the sum in a register */                         \
                    C a = 0;                                                                 \
                    for (int64_t j = 0; j < n; j++)                                          \
                        a = DT__ADD(a, LD_##NAME(x[o * n + j]));                             \
                    tr[0] = a;                                                               \
                    continue;                                                                \
                }                                                                            \
                for (int64_t i = 0; i < inner; i++)                                          \
                    tr[i] = 0;                                                               \
                for (int64_t j = 0; j < n; j++) {                                            \
                    const S *xr = x + (o * n + j) * inner;                                   \
                    for (int64_t i = 0; i < inner; i++)                                      \
                        tr[i] = DT__ADD(tr[i], LD_##NAME(xr[i]));                            \
                }                                                                            \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        bool excl = k->mode & DT__SCAN_EXCLUSIVE, rev = k->mode & DT__SCAN_REVERSE;          \
        const C *tot = (k->mode & DT__SCAN_CARRY) ? in[1] : NULL;                            \
        int64_t g = tot ? k->in_shape[1][k->axis] : 0;                                       \
        C *acc = inner > 1 ? malloc(sizeof(C) * (size_t)inner) : NULL;                       \
        for (int64_t o = 0; o < outer; o++) {                                                \
            const S *xo = x + o * n * inner;                                                 \
            S *yo = y + o * n * inner;                                                       \
            if (!acc) {                                                                      \
                for (int64_t i = 0; i < inner; i++) {                                        \
                    C a = scan_carry_##NAME(tot, g, k->start, rev, o, i, inner);             \
                    for (int64_t jj = 0; jj < n; jj++) {                                     \
                        int64_t at = (rev ? n - 1 - jj : jj) * inner + i;                    \
                        SCAN_STEP(NAME, C, a, xo[at], &yo[at]);                              \
                    }                                                                        \
                }                                                                            \
                continue;                                                                    \
            }                                                                                \
            for (int64_t i = 0; i < inner; i++)                                              \
                acc[i] = scan_carry_##NAME(tot, g, k->start, rev, o, i, inner);              \
            for (int64_t jj = 0; jj < n; jj++) {                                             \
                int64_t at = (rev ? n - 1 - jj : jj) * inner;                                \
                for (int64_t i = 0; i < inner; i++)                                          \
                    SCAN_STEP(NAME, C, acc[i], xo[at + i], &yo[at + i]);                     \
            }                                                                                \
        }                                                                                    \
        free(acc);                                                                           \
    }
DEFINE_SCAN(f32, float, float)
DEFINE_SCAN(f64, double, double)
DEFINE_SCAN(i32, int32_t, int32_t)
DEFINE_SCAN(i64, int64_t, int64_t)
DEFINE_SCAN(bf16, uint16_t, float)
DEFINE_SCAN(f16, uint16_t, float)
DEFINE_SCAN(u8, uint8_t, uint8_t)
DEFINE_SCAN(i8, int8_t, int8_t)

/* The extremum of n values at stride `stride` for argmax (op MAX) or argmin: the first on
 * ties, and the first NaN, which ends the search (numpy's rule); its index (-1 when n is 0),
 * its value in *best. */
#define DEFINE_ARG(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)                           \
    static int64_t arg_row_##NAME(int op, const S *row, int64_t n, int64_t stride, S *best)    \
    {                                                                                          \
        int64_t at = -1;                                                                       \
        C b = 0;                                                                               \
        for (int64_t j = 0; j < n; j++) {                                                      \
            C v = LD_##NAME(row[j * stride]);                                                  \
            if (IS_FLOAT && isnan((double)v)) {                                                \
                at = j;                                                                        \
                break;                                                                         \
            }                                                                                  \
            if (at < 0 || (op == DT_REDUCE_MAX ? v > b : v < b)) {                             \
                b = v;                                                                         \
                at = j;                                                                        \
            }                                                                                  \
        }                                                                                      \
        if (at >= 0)                                                                           \
            *best = row[at * stride];                                                          \
        return at;                                                                             \
    }                                                                                          \
    static void arg_reduce_##NAME(const dt__kargs *k, const void *const in[], void *out)       \
    {                                                                                          \
        unsigned mode = DT__MODE_KIND(k->mode);                                                \
        int64_t outer, n, inner;                                                               \
        row_view(k->rank, k->in_shape[0], 1u << k->axis, &outer, &n, &inner);                  \
        for (int64_t o = 0; o < outer; o++)                                                    \
            for (int64_t i = 0; i < inner; i++) {                                              \
                int64_t at;                                                                    \
                if (mode == DT__ARG_MERGE) {                                                   \
                    /* the records of the shards in order: the best, the first NaN wins */     \
                    const int64_t *w = (const int64_t *)in[0] + o * n * inner + i;             \
                    C b = 0;                                                                   \
                    at = -1;                                                                   \
                    for (int64_t r = 0; r < n / 2; r++) {                                      \
                        int64_t bits = w[2 * r * inner], idx = w[(2 * r + 1) * inner];         \
                        S sv;                                                                  \
                        memcpy(&sv, &bits, sizeof sv);                                         \
                        C v = LD_##NAME(sv);                                                   \
                        if (idx < 0)                                                           \
                            continue;                                                          \
                        if (IS_FLOAT && isnan((double)v)) {                                    \
                            at = idx;                                                          \
                            break;                                                             \
                        }                                                                      \
                        if (at < 0 || (k->op == DT_REDUCE_MAX ? v > b : v < b)) {              \
                            b = v;                                                             \
                            at = idx;                                                          \
                        }                                                                      \
                    }                                                                          \
                } else {                                                                       \
                    S bs = 0;                                                                  \
                    at = arg_row_##NAME(k->op, (const S *)in[0] + o * n * inner + i, n, inner, \
                                        &bs);                                                  \
                    if (at >= 0)                                                               \
                        at += k->start;                                                        \
                    if (mode == DT__ARG_RECORDS) {                                             \
                        int64_t *w = out, bits = 0;                                            \
                        memcpy(&bits, &bs, sizeof bs);                                         \
                        w[(o * 2) * inner + i] = bits;                                         \
                        w[(o * 2 + 1) * inner + i] = at;                                       \
                        continue;                                                              \
                    }                                                                          \
                }                                                                              \
                if (k->to == DT_DTYPE_I64)                                                     \
                    ((int64_t *)out)[o * inner + i] = at;                                      \
                else                                                                           \
                    ((int32_t *)out)[o * inner + i] = (int32_t)at;                             \
            }                                                                                  \
    }
CPU_DTYPES(DEFINE_ARG)

/* ---- gemm: C[b] = op(A[b]) op(B[b]), row-major; op = transpose when ta / tb -------------- */

/* A's leading dimension as stored: packed unless the arguments name a wider one (a block of
 * op(A)'s rows is a block of the stored columns when transposed). */
#define GEMM_LDA(k) ((k)->lda ? (k)->lda : (k)->ta ? (k)->m : (k)->k)

#define GEMM_REF(T, NAME)                                                                      \
    static void gemm_##NAME(const dt__kargs *k, const void *const in[], void *out)             \
    {                                                                                          \
        const T *A = in[0], *B = in[1];                                                        \
        T *C = out;                                                                            \
        int64_t m = k->m, n = k->n, kk = k->k, lda = GEMM_LDA(k);                              \
        for (int64_t b = 0; b < k->batch; b++) {                                               \
            const T *a = A + k->a_at + b * k->a_batch_stride, *bb = B + b * k->b_batch_stride; \
            T *c = C + k->c_at + b * m * n;                                                    \
            for (int64_t i = 0; i < m; i++)                                                    \
                for (int64_t j = 0; j < n; j++) {                                              \
                    T s = 0;                                                                   \
                    for (int64_t q = 0; q < kk; q++)                                           \
                        s = DT__ADD(s, DT__MUL(k->ta ? a[q * lda + i] : a[i * lda + q],        \
                                               k->tb ? bb[j * kk + q] : bb[q * n + j]));       \
                    c[i * n + j] = s;                                                          \
                }                                                                              \
        }                                                                                      \
    }
GEMM_REF(int32_t, i32)
GEMM_REF(int64_t, i64)
GEMM_REF(uint8_t, u8)
GEMM_REF(int8_t, i8)

/* f32 and f64 through cblas, one call a batch entry, or split over the device's threads
 * (backends/cpu/split.c), each part one call on a block of the output, bit for bit the same. */
#define GEMM_BLAS(T, NAME, FN)                                                                 \
    static void call_##NAME(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void *A, \
                            int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc)     \
    {                                                                                          \
        FN(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,      \
           (blasint)m, (blasint)n, (blasint)kk, 1, A, (blasint)lda, B, (blasint)ldb, 0, C,     \
           (blasint)ldc);                                                                      \
    }                                                                                          \
    static void gemm_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[],     \
                            void *out)                                                         \
    {                                                                                          \
        dt__cpu_gemm(x, k, call_##NAME, sizeof(T), in[0], in[1], out);                         \
    }
GEMM_BLAS(float, f32, cblas_sgemm)
GEMM_BLAS(double, f64, cblas_dgemm)

/* 16-bit floats: both operands widened to f32 (exact), one sgemm accumulating in f32 (split
 * as above), the product rounded once; the widening and rounding loops split by rows. Without
 * memory for the widened copies, a loop accumulating in f32 gives the same products (in
 * another summation order). */
#define GEMM_HALF(NAME)                                                                          \
    static void widen_##NAME(const void *src, void *dst, int64_t n)                              \
    {                                                                                            \
        const uint16_t *s = src;                                                                 \
        float *d = dst;                                                                          \
        for (int64_t i = 0; i < n; i++)                                                          \
            d[i] = LD_##NAME(s[i]);                                                              \
    }                                                                                            \
    static void round_##NAME(const void *src, void *dst, int64_t n)                              \
    {                                                                                            \
        const float *s = src;                                                                    \
        uint16_t *d = dst;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                          \
            d[i] = ST_##NAME(s[i]);                                                              \
    }                                                                                            \
    static void gemm_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[],       \
                            void *out)                                                           \
    {                                                                                            \
        const uint16_t *A = in[0], *B = in[1];                                                   \
        uint16_t *Cm = (uint16_t *)out + k->c_at;                                                \
        int64_t m = k->m, n = k->n, kk = k->k, lda = GEMM_LDA(k);                                \
        /* op(A) [m, kk] stored as rows of A (stored [kk, m] when transposed); B [kk, n] or      \
         * [n, kk] packed; an operand with batch stride 0 is widened once */                     \
        int64_t na = k->a_batch_stride ? k->batch : 1, nb = k->b_batch_stride ? k->batch : 1;    \
        int64_t arows = k->ta ? kk : m, acols = k->ta ? m : kk;                                  \
        float *fa = malloc(sizeof(float) * (size_t)(na * m * kk + 1)),                           \
              *fb = malloc(sizeof(float) * (size_t)(nb * kk * n + 1)),                           \
              *fc = malloc(sizeof(float) * (size_t)(k->batch * m * n + 1));                      \
        if (fa && fb && fc) {                                                                    \
            dt__cpu_convert_rows(x, widen_##NAME, na, arows, acols, A + k->a_at, lda,            \
                                 k->a_batch_stride, 2, fa, 4);                                   \
            dt__cpu_convert_rows(x, widen_##NAME, nb, kk, n, B, n, k->b_batch_stride, 2, fb, 4); \
            dt__kargs f = *k;                                                                    \
            f.a_at = f.c_at = f.lda = 0;                                                         \
            f.a_batch_stride = k->a_batch_stride ? m * kk : 0;                                   \
            f.b_batch_stride = k->b_batch_stride ? kk * n : 0;                                   \
            gemm_f32(x, &f, (const void *const[]){fa, fb}, fc);                                  \
            dt__cpu_convert_rows(x, round_##NAME, 1, m * k->batch, n, fc, n, 0, 4, Cm, 2);       \
        } else                                                                                   \
            for (int64_t b = 0; b < k->batch; b++) {                                             \
                const uint16_t *a = A + k->a_at + b * k->a_batch_stride,                         \
                               *bb = B + b * k->b_batch_stride;                                  \
                uint16_t *c = Cm + b * m * n;                                                    \
                for (int64_t i = 0; i < m; i++)                                                  \
                    for (int64_t j = 0; j < n; j++) {                                            \
                        float s = 0;                                                             \
                        for (int64_t q = 0; q < kk; q++)                                         \
                            s += LD_##NAME(k->ta ? a[q * lda + i] : a[i * lda + q]) *            \
                                 LD_##NAME(k->tb ? bb[j * kk + q] : bb[q * n + j]);              \
                        c[i * n + j] = ST_##NAME(s);                                             \
                    }                                                                            \
            }                                                                                    \
        free(fa);                                                                                \
        free(fb);                                                                                \
        free(fc);                                                                                \
    }
GEMM_HALF(bf16)
GEMM_HALF(f16)

/* ---- copy blocks (dtype-independent: element size from the table's dtype) ---------------- */

#define COPY_BLOCKS(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)                              \
    static void copy_blocks_##NAME(const dt__kargs *k, const void *const in[], void *out)          \
    {                                                                                              \
        for (int i = 0; i < k->nblocks; i++) {                                                     \
            const dt__block *b = &k->blocks[i];                                                    \
            int rr = b->rank;                                                                      \
            const int64_t *ss = b->src_shape, *ds = b->dst_shape, *ex = b->extent;                 \
            if (dt__num_elements(rr, ex) == 0)                                                     \
                continue;                                                                          \
            dt__copy_block((S *)out + b->dst_at, ds, b->dst_off, (const S *)in[0] + b->src_at, ss, \
                           b->src_off, ex, rr, sizeof(S));                                         \
        }                                                                                          \
    }
CPU_DTYPES(COPY_BLOCKS)

/* The table's entries: each loop above behind the kernel signature (CPU kernels finish
 * before they return and cannot fail). */
#define WRAP_CALL(KNAME, NAME, ...)                                              \
    static dt_status cpu_##KNAME##_##NAME(const dt__kctx *x, const dt__kargs *k, \
                                          const void *const in[], void *out)     \
    {                                                                            \
        __VA_ARGS__;                                                             \
        return DT_OK;                                                            \
    }
#define WRAP(KNAME, NAME) WRAP_CALL(KNAME, NAME, (void)x; KNAME##_##NAME(k, in, out))
/* the elementwise and row kernels split over the device's threads (backends/cpu/split.c);
 * WRAP_EW: operand count, output element size, then the operands' element sizes */
#define WRAP_EW(KNAME, NAME, NIN, OSZ, ...) \
    WRAP_CALL(                              \
        KNAME, NAME,                        \
        dt__cpu_elementwise(x, KNAME##_##NAME, k, NIN, (size_t[]){__VA_ARGS__}, OSZ, in, out))
#define WRAP_DTYPE(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)                       \
    WRAP(fill, NAME)                                                                       \
    WRAP(arange, NAME)                                                                     \
    WRAP_EW(unary, NAME, 1, sizeof(S), sizeof(S))                                          \
    WRAP_EW(binary, NAME, 2, DT__BINARY_IS_COMPARISON(k->op) ? 1 : sizeof(S), sizeof(S),   \
            sizeof(S))                                                                     \
    WRAP_CALL(reduce, NAME, dt__cpu_split_reduce(x, reduce_##NAME, k, in, out, sizeof(S))) \
    WRAP(transpose, NAME)                                                                  \
    WRAP(copy_blocks, NAME)                                                                \
    WRAP(select_fill, NAME)                                                                \
    WRAP_EW(cast, NAME, 1, sizeof(S), dt_dtype_size(k->from))                              \
    WRAP_EW(where, NAME, 3, sizeof(S), 1, sizeof(S), sizeof(S))                            \
    WRAP(arg_reduce, NAME)
CPU_DTYPES(WRAP_DTYPE)
#define WRAP_ROWS(NAME, S, C)                                                             \
    WRAP_CALL(softmax, NAME,                                                              \
              dt__cpu_split_softmax(x, softmax_##NAME, k, in, out, sizeof(S), sizeof(C))) \
    WRAP_CALL(norm, NAME, dt__cpu_split_norm(x, norm_##NAME, k, in, out, sizeof(S), sizeof(C)))
WRAP_ROWS(f32, float, float)
WRAP_ROWS(f64, double, double)
WRAP_ROWS(bf16, uint16_t, float)
WRAP_ROWS(f16, uint16_t, float)
#define WRAP_FLOAT(NAME) WRAP_CALL(gemm, NAME, gemm_##NAME(x, k, in, out)) WRAP(scan, NAME)
WRAP_CALL(attention, f32, dt__cpu_attention_f32(x, k, in, out))
WRAP_CALL(attention, f64, dt__cpu_attention_f64(x, k, in, out))
WRAP_FLOAT(f32)
WRAP_FLOAT(f64)
WRAP_FLOAT(bf16)
WRAP_FLOAT(f16)
WRAP(gemm, i32)
WRAP(gemm, i64)
WRAP(gemm, u8)
WRAP(gemm, i8)
WRAP(scan, i32)
WRAP(scan, i64)
WRAP(scan, u8)
WRAP(scan, i8)

/* P: the entries' prefix (cpu_ here, dt__cpu_ for another file's) */
#define FLOATS_OF(P, K)                                                                      \
    [DT_DTYPE_F32] = P##K##_f32, [DT_DTYPE_F64] = P##K##_f64, [DT_DTYPE_BF16] = P##K##_bf16, \
    [DT_DTYPE_F16] = P##K##_f16
#define NUMERIC_OF(P, K)                                                       \
    FLOATS_OF(P, K), [DT_DTYPE_I32] = P##K##_i32, [DT_DTYPE_I64] = P##K##_i64, \
                     [DT_DTYPE_U8] = P##K##_u8, [DT_DTYPE_I8] = P##K##_i8
#define ALL_OF(P, K) NUMERIC_OF(P, K), [DT_DTYPE_BOOL] = P##K##_boolean
#define FLOATS(K) FLOATS_OF(cpu_, K)
#define NUMERIC(K) NUMERIC_OF(cpu_, K)
#define ALL(K) ALL_OF(cpu_, K)

/* Random numbers only for the floating types and no gemm on bool: the shape rules refuse
 * those with DT_ERR_DTYPE before any lookup. */
const dt__kernel_fn dt__cpu_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {
    [DT__K_FILL] = {ALL(fill)},
    [DT__K_ARANGE] = {ALL(arange)},
    [DT__K_PHILOX_UNIFORM] = {[DT_DTYPE_F32] = dt__cpu_uniform_f32,
                              [DT_DTYPE_F64] = dt__cpu_uniform_f64,
                              [DT_DTYPE_BF16] = dt__cpu_uniform_bf16,
                              [DT_DTYPE_F16] = dt__cpu_uniform_f16},
    [DT__K_PHILOX_NORMAL] = {[DT_DTYPE_F32] = dt__cpu_normal_f32,
                             [DT_DTYPE_F64] = dt__cpu_normal_f64,
                             [DT_DTYPE_BF16] = dt__cpu_normal_bf16,
                             [DT_DTYPE_F16] = dt__cpu_normal_f16},
    [DT__K_UNARY] = {ALL(unary)},
    [DT__K_BINARY] = {ALL(binary)},
    [DT__K_REDUCE] = {ALL(reduce)},
    [DT__K_GEMM] = {NUMERIC(gemm)},
    [DT__K_TRANSPOSE] = {ALL(transpose)},
    [DT__K_COPY_BLOCKS] = {ALL(copy_blocks)},
    [DT__K_SELECT_FILL] = {ALL(select_fill)},
    [DT__K_CAST] = {ALL(cast)},
    [DT__K_WHERE] = {ALL(where)},
    [DT__K_SOFTMAX] = {FLOATS(softmax)},
    [DT__K_NORM] = {FLOATS(norm)},
    [DT__K_SCAN] = {NUMERIC(scan)},
    [DT__K_ARG_REDUCE] = {ALL(arg_reduce)},
    /* bf16 and f16 attention computes in f32 (casts in the op) */
    [DT__K_ATTENTION] = {[DT_DTYPE_F32] = cpu_attention_f32, [DT_DTYPE_F64] = cpu_attention_f64},
    [DT__K_FUSED] = {[DT_DTYPE_F32] = dt__cpu_fused,
                     [DT_DTYPE_F64] = dt__cpu_fused,
                     [DT_DTYPE_I32] = dt__cpu_fused,
                     [DT_DTYPE_I64] = dt__cpu_fused,
                     [DT_DTYPE_BF16] = dt__cpu_fused,
                     [DT_DTYPE_F16] = dt__cpu_fused,
                     [DT_DTYPE_BOOL] = dt__cpu_fused,
                     [DT_DTYPE_U8] = dt__cpu_fused,
                     [DT_DTYPE_I8] = dt__cpu_fused},
    [DT__K_GATHER] = {ALL_OF(dt__cpu_, gather)},
    [DT__K_SEGMENT_SUM] = {NUMERIC_OF(dt__cpu_, segment_sum)},
    [DT__K_ONE_HOT] = {ALL_OF(dt__cpu_, one_hot)},
    [DT__K_XENT] = {[DT_DTYPE_F32] = dt__cpu_xent_f32,
                    [DT_DTYPE_F64] = dt__cpu_xent_f64,
                    [DT_DTYPE_BF16] = dt__cpu_xent_bf16,
                    [DT_DTYPE_F16] = dt__cpu_xent_f16},
};
