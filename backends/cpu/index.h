/* Index helpers of the CPU kernels (backends/cpu/kernels.c and backends/cpu/kernels_typed.h):
 * row-major multi-indices, strides and broadcasting. Private to the CPU kernels. */
#ifndef DT_OPS_CPU_INDEX_H
#define DT_OPS_CPU_INDEX_H

#include "dt.h"

/* Marked unused: each file that includes this one takes the helpers it needs. */

/* Advance a row-major multi-index; false after the last. */
static __attribute__((unused)) bool next_index(int rank, const int64_t shape[], int64_t idx[])
{
    for (int i = rank - 1; i >= 0; i--) {
        if (++idx[i] < shape[i])
            return true;
        idx[i] = 0;
    }
    return false;
}

static __attribute__((unused)) void strides_of(int rank, const int64_t shape[], int64_t st[])
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

/* Strides of an operand broadcast to the output's rank (0 along its extent-1 axes). */
static __attribute__((unused)) void bcast_strides(int rank, const int64_t in_shape[], int64_t st[])
{
    strides_of(rank, in_shape, st);
    for (int i = 0; i < rank; i++)
        if (in_shape[i] == 1)
            st[i] = 0;
}

/* True when operand q of k (q < nops) has the output's shape: plain element-wise loops. */
static __attribute__((unused)) bool same_shapes(const dt__kargs *k, int nops)
{
    for (int q = 0; q < nops; q++)
        for (int i = 0; i < k->rank; i++)
            if (k->in_shape[q][i] != k->shape[i])
                return false;
    return true;
}

/* A local shape seen around the axes of `mask` when they are contiguous: outer (the product of
 * the axes before them), n (of the masked axes) and inner (of the axes after); false when the
 * masked axes are not contiguous. No axis masked: n is 1 and inner 1. */
static __attribute__((unused)) bool row_view(int rank, const int64_t shape[], unsigned mask,
                                             int64_t *outer, int64_t *n, int64_t *inner)
{
    int lo = rank, hi = rank - 1;
    for (int i = 0; i < rank; i++)
        if (mask & (1u << i)) {
            lo = lo == rank ? i : lo;
            hi = i;
        }
    for (int i = lo; i <= hi; i++)
        if (!(mask & (1u << i)))
            return false;
    *outer = *n = *inner = 1;
    for (int i = 0; i < rank; i++)
        *(i < lo ? outer : i <= hi ? n : inner) *= shape[i];
    return true;
}

/* Offset of multi-index idx under strides st. */
static __attribute__((unused)) int64_t offset_of(int rank, const int64_t idx[], const int64_t st[])
{
    int64_t o = 0;
    for (int q = 0; q < rank; q++)
        o += idx[q] * st[q];
    return o;
}

#endif
