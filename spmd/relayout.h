/* Helpers shared by the relayout files (internal): spmd/relayout.c (plan, cost, emit the
 * transitions per mesh axis) and spmd/exchange.c (the block exchange between any layouts). */
#ifndef DT_SPMD_RELAYOUT_H
#define DT_SPMD_RELAYOUT_H

#include "engine.h"

/* Coordinate of global device `device` along mesh axis a. */
static inline int dt__coord(const dt_mesh *m, int a, int device)
{
    return device / m->strides[a] % m->sizes[a];
}

/* dst[0..DT_MAX_RANK) = src[0..rank), zeros after. */
static inline void dt__copy_shape(int64_t dst[], const int64_t src[], int rank)
{
    for (int i = 0; i < DT_MAX_RANK; i++)
        dst[i] = i < rank ? src[i] : 0;
}

/* k copies one block into the whole local output `out_local` from a local input of shape
 * in_local; the caller sets the block's offsets. NULL when out of memory (no blocks). */
dt__block *dt__one_block(dt__kargs *k, int rank, const int64_t in_local[],
                         const int64_t out_local[]);

#endif /* DT_SPMD_RELAYOUT_H */
