/* The CPU index kernels behind the kernel table's GATHER, SEGMENT_SUM and ONE_HOT entries
 * (common/kernels.h has their arguments and modes; the ops are spmd/ops/gather.c,
 * spmd/ops/segment_sum.c and spmd/ops/one_hot.c). Reference loops over the local shard; each
 * finishes before it returns and cannot fail. */
#include "gather.h"
#include "dtypes.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* gather: out (nidx, inner) row i = the table's local row ids[i] - lo (table in[0]: rows x
 * inner, ids in[1]), or zeros when ids[i] is outside [lo, lo + rows): another shard's row, or
 * outside the table. Never reads outside the local table.
 * segment_sum: out (rows, inner) = 0, then data row i (in[0]: nidx x inner) added into row
 * ids[i] - lo (ids in[1]) when inside [lo, lo + rows); the 16-bit floats accumulate in f32 and
 * round once.
 * one_hot: out (nidx / inner, rows, inner) is b (off), with a (on) where the index equals lo + j
 * (indices in[0]: (nidx / inner, inner)). */
#define DEFINE_INDEX_KERNELS(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)        \
    static void gather_##NAME(const dt__kargs *k, const void *const in[], void *out)  \
    {                                                                                 \
        const S *t = in[0];                                                           \
        S *o = out;                                                                   \
        size_t row = (size_t)k->inner * sizeof(S);                                    \
        if (!row)                                                                     \
            return;                                                                   \
        for (int64_t i = 0; i < k->nidx; i++) {                                       \
            int64_t r = dt__index_at(k->from, in[1], i) - k->lo;                      \
            if (r >= 0 && r < k->rows)                                                \
                memcpy(o + i * k->inner, t + r * k->inner, row);                      \
            else                                                                      \
                memset(o + i * k->inner, 0, row); /* zero bits: 0 in every dtype */   \
        }                                                                             \
    }                                                                                 \
    static void one_hot_##NAME(const dt__kargs *k, const void *const in[], void *out) \
    {                                                                                 \
        S *o = out, on = STD_##NAME(k->a), off = STD_##NAME(k->b);                    \
        int64_t w = k->inner, outer = w ? k->nidx / w : 0;                            \
        for (int64_t i = 0, n = outer * k->rows * w; i < n; i++)                      \
            o[i] = off;                                                               \
        for (int64_t i = 0; i < k->nidx; i++) {                                       \
            int64_t j = dt__index_at(k->from, in[0], i) - k->lo;                      \
            if (j >= 0 && j < k->rows)                                                \
                o[(i / w * k->rows + j) * w + i % w] = on;                            \
        }                                                                             \
    }
CPU_DTYPES(DEFINE_INDEX_KERNELS)

/* segment_sum into a base (mode DT__SEGMENT_INTO, common/kernels.h): out = base (nothing to
 * copy when the program runs it in place, out being base's buffer), then each
 * selected row's sum (from 0 over its data rows in index order, SEG_COLS columns at a time,
 * rounded to S) added to it once: bitwise base + the segment sum, touching only the selected
 * rows besides the copy. The data rows of one output row are chained (next[i]: the next index
 * of the same row), or found by a scan where that memory is not to be had. */
enum { SEG_COLS = 256 };
static int64_t seg_row(const dt__kargs *k, const void *ids, int64_t i)
{
    int64_t r = dt__index_at(k->from, ids, i) - k->lo;
    return r >= 0 && r < k->rows ? r : -1;
}
/* next[i] = the next index after i selecting the same row (-1: none); false without memory */
static bool seg_chain(const dt__kargs *k, const void *ids, int64_t *next)
{
    int64_t *last = malloc(((size_t)k->rows + 1) * sizeof *last);
    if (!last)
        return false;
    for (int64_t r = 0; r < k->rows; r++)
        last[r] = -1;
    for (int64_t i = k->nidx - 1; i >= 0; i--) {
        int64_t r = seg_row(k, ids, i);
        next[i] = r < 0 ? -1 : last[r];
        if (r >= 0)
            last[r] = i;
    }
    free(last);
    return true;
}
/* the first index selecting row r is i (no earlier one) */
static bool seg_first(const dt__kargs *k, const void *ids, const int64_t *next, int64_t i,
                      int64_t r, const bool *seen)
{
    if (next)
        return !seen[i];
    for (int64_t j = 0; j < i; j++)
        if (seg_row(k, ids, j) == r)
            return false;
    return true;
}
#define DEFINE_SEGMENT_INTO(NAME, S, C)                                                           \
    static void segment_into_##NAME(const dt__kargs *k, const void *const in[], void *out)        \
    {                                                                                             \
        const S *x = in[0], *b = in[2];                                                           \
        S *o = out;                                                                               \
        int64_t w = k->inner;                                                                     \
        if (k->rows * w > 0 && (const void *)o != (const void *)b) /* else in place */            \
            memcpy(o, b, (size_t)(k->rows * w) * sizeof(S));                                      \
        int64_t *next = malloc(((size_t)k->nidx + 1) * sizeof *next);                             \
        bool *seen = calloc((size_t)k->nidx + 1, sizeof *seen);                                   \
        if (next && (!seen || !seg_chain(k, in[1], next))) {                                      \
            free(next);                                                                           \
            next = NULL;                                                                          \
        }                                                                                         \
        C acc[SEG_COLS];                                                                          \
        for (int64_t i = 0; i < k->nidx; i++) {                                                   \
            int64_t r = seg_row(k, in[1], i);                                                     \
            if (r < 0 || !seg_first(k, in[1], next, i, r, seen))                                  \
                continue;                                                                         \
            for (int64_t c0 = 0; c0 < w; c0 += SEG_COLS) {                                        \
                int64_t cw = w - c0 < SEG_COLS ? w - c0 : SEG_COLS;                               \
                for (int64_t q = 0; q < cw; q++)                                                  \
                    acc[q] = (C)0;                                                                \
                for (int64_t j = i; j >= 0; j = next ? next[j] : j + 1 < k->nidx ? j + 1 : -1) {  \
                    if (!next && seg_row(k, in[1], j) != r)                                       \
                        continue;                                                                 \
                    if (next)                                                                     \
                        seen[j] = true;                                                           \
                    for (int64_t q = 0; q < cw; q++)                                              \
                        acc[q] = DT__ADD(acc[q], (C)LD_##NAME(x[j * w + c0 + q]));                \
                }                                                                                 \
                S *row = o + r * w + c0;                                                          \
                for (int64_t q = 0; q < cw; q++)                                                  \
                    row[q] = ST_##NAME(DT__ADD(LD_##NAME(row[q]), LD_##NAME(ST_##NAME(acc[q])))); \
            }                                                                                     \
        }                                                                                         \
        free(next);                                                                               \
        free(seen);                                                                               \
    }
DEFINE_SEGMENT_INTO(f32, float, float)
DEFINE_SEGMENT_INTO(f64, double, double)
DEFINE_SEGMENT_INTO(i32, int32_t, int32_t)
DEFINE_SEGMENT_INTO(i64, int64_t, int64_t)
DEFINE_SEGMENT_INTO(bf16, uint16_t, float)
DEFINE_SEGMENT_INTO(f16, uint16_t, float)
DEFINE_SEGMENT_INTO(u8, uint8_t, uint8_t)
DEFINE_SEGMENT_INTO(i8, int8_t, int8_t)

#define DEFINE_SEGMENT_SUM(NAME, S, C)                                                       \
    static void segment_sum_##NAME(const dt__kargs *k, const void *const in[], void *out)    \
    {                                                                                        \
        if (k->mode == DT__SEGMENT_INTO) {                                                   \
            segment_into_##NAME(k, in, out);                                                 \
            return;                                                                          \
        }                                                                                    \
        const S *x = in[0];                                                                  \
        S *o = out;                                                                          \
        int64_t no = k->rows * k->inner, w = k->inner;                                       \
        if (sizeof(C) == sizeof(S)) { /* accumulate in the output */                         \
            C *acc = out;                                                                    \
            for (int64_t i = 0; i < no; i++)                                                 \
                acc[i] = (C)0;                                                               \
            for (int64_t i = 0; i < k->nidx; i++) {                                          \
                int64_t r = dt__index_at(k->from, in[1], i) - k->lo;                         \
                if (r < 0 || r >= k->rows)                                                   \
                    continue;                                                                \
                for (int64_t q = 0; q < w; q++)                                              \
                    acc[r * w + q] = DT__ADD(acc[r * w + q], (C)LD_##NAME(x[i * w + q]));    \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        C *acc = calloc((size_t)no + 1, sizeof(C));                                          \
        for (int64_t i = 0; !acc && i < no; i++) /* no memory: round after every addition */ \
            o[i] = ST_##NAME((C)0);                                                          \
        for (int64_t i = 0; i < k->nidx; i++) {                                              \
            int64_t r = dt__index_at(k->from, in[1], i) - k->lo;                             \
            if (r < 0 || r >= k->rows)                                                       \
                continue;                                                                    \
            for (int64_t q = 0; q < w; q++) {                                                \
                C v = LD_##NAME(x[i * w + q]);                                               \
                if (acc)                                                                     \
                    acc[r * w + q] += v;                                                     \
                else                                                                         \
                    o[r * w + q] = ST_##NAME(LD_##NAME(o[r * w + q]) + v);                   \
            }                                                                                \
        }                                                                                    \
        for (int64_t i = 0; acc && i < no; i++)                                              \
            o[i] = ST_##NAME(acc[i]);                                                        \
        free(acc);                                                                           \
    }
DEFINE_SEGMENT_SUM(f32, float, float)
DEFINE_SEGMENT_SUM(f64, double, double)
DEFINE_SEGMENT_SUM(i32, int32_t, int32_t)
DEFINE_SEGMENT_SUM(i64, int64_t, int64_t)
DEFINE_SEGMENT_SUM(bf16, uint16_t, float)
DEFINE_SEGMENT_SUM(f16, uint16_t, float)
DEFINE_SEGMENT_SUM(u8, uint8_t, uint8_t)
DEFINE_SEGMENT_SUM(i8, int8_t, int8_t)

/* The table's entries (backends/cpu/gather.h). */
#define INDEX_ENTRIES(NAME, S, C, IS_FLOAT, IS_SIGNED, LOWEST, HIGHEST)                            \
    dt_status dt__cpu_gather_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], \
                                    void *out)                                                     \
    {                                                                                              \
        (void)x;                                                                                   \
        gather_##NAME(k, in, out);                                                                 \
        return DT_OK;                                                                              \
    }                                                                                              \
    dt_status dt__cpu_one_hot_##NAME(const dt__kctx *x, const dt__kargs *k,                        \
                                     const void *const in[], void *out)                            \
    {                                                                                              \
        (void)x;                                                                                   \
        one_hot_##NAME(k, in, out);                                                                \
        return DT_OK;                                                                              \
    }
CPU_DTYPES(INDEX_ENTRIES)
#define SEGMENT_ENTRY(NAME)                                                     \
    dt_status dt__cpu_segment_sum_##NAME(const dt__kctx *x, const dt__kargs *k, \
                                         const void *const in[], void *out)     \
    {                                                                           \
        (void)x;                                                                \
        segment_sum_##NAME(k, in, out);                                         \
        return DT_OK;                                                           \
    }
SEGMENT_ENTRY(f32)
SEGMENT_ENTRY(f64)
SEGMENT_ENTRY(i32)
SEGMENT_ENTRY(i64)
SEGMENT_ENTRY(bf16)
SEGMENT_ENTRY(f16)
SEGMENT_ENTRY(u8)
SEGMENT_ENTRY(i8)
