/* Independent reference computations shared by the unit and multi-rank tests.
 *
 * Every function here is written without the library's formulas, so a test comparing the
 * library with it can fail:
 * - uneven shards by dealing elements out one at a time (no division, no remainder);
 * - device coordinates by counting through the mesh with an odometer (no strides);
 * - a device's component by walking the whole global array in row-major order and keeping
 *   the elements whose shard, on every sharded axis, is the device's coordinate (no block
 *   copies, no offsets).
 * Header only (static functions), so each test executable stays a single file.
 */
#ifndef DT_TEST_REF_H
#define DT_TEST_REF_H

#include "dtensor.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REF_MAX_SHARDS 64

#ifdef DT_HAVE_CUDA
int dt__cuda_device_count(void); /* the CUDA runtime's count, 0 on any error (no GPU) */
#endif

/* CUDA devices the runtime should give client `client` of `clients` on one host: the GPUs the
 * CUDA runtime reports, dealt round-robin to the clients, times DTENSOR_CUDA_DEVICES logical
 * devices each (default 1); 0 in a build without CUDA or on a machine without a GPU, unless
 * DTENSOR_EMULATE_CUDA gives each client that many GPUs emulated on the host. */
/* True when the CUDA devices are emulated on the host: no GPU, and DTENSOR_EMULATE_CUDA set. */
static inline bool ref_cuda_emulated(void)
{
    const char *emu = getenv("DTENSOR_EMULATE_CUDA");
#ifdef DT_HAVE_CUDA
    if (dt__cuda_device_count() > 0)
        return false;
#endif
    return emu && *emu && atoi(emu) > 0;
}

static inline int ref_cuda_devices(int client, int clients)
{
    int gpus = 0, visible = 0;
#ifdef DT_HAVE_CUDA
    visible = dt__cuda_device_count();
#endif
    for (int g = client; g < visible; g += clients)
        gpus++;
    const char *e = getenv("DTENSOR_CUDA_DEVICES");
    if (ref_cuda_emulated())
        gpus = atoi(getenv("DTENSOR_EMULATE_CUDA")); /* each client's own, on the host */
    return gpus * (e && *e ? atoi(e) : 1);
}

/* Deal n elements out one at a time to the shard holding the fewest so far (lowest index on
 * ties); offsets are the prefix sums of the sizes. s <= REF_MAX_SHARDS. */
static inline void ref_shards(int64_t n, int s, int64_t size[], int64_t off[])
{
    for (int k = 0; k < s; k++)
        size[k] = 0;
    for (int64_t e = 0; e < n; e++) {
        int best = 0;
        for (int k = 1; k < s; k++)
            if (size[k] < size[best])
                best = k;
        size[best]++;
    }
    int64_t at = 0;
    for (int k = 0; k < s; k++) {
        off[k] = at;
        at += size[k];
    }
}

/* Which shard of s holds element j of an axis of n (from the dealt sizes). */
static inline int ref_owner(int64_t n, int s, int64_t j)
{
    int64_t size[REF_MAX_SHARDS], off[REF_MAX_SHARDS];
    ref_shards(n, s, size, off);
    for (int k = 0; k < s; k++)
        if (j >= off[k] && j < off[k] + size[k])
            return k;
    return -1;
}

/* Coordinates of device `device` on a row-major mesh, found by counting from device 0 with an
 * odometer whose last digit turns fastest. */
static inline void ref_coords(int num_axes, const int sizes[], int device, int coords[])
{
    for (int a = 0; a < num_axes; a++)
        coords[a] = 0;
    for (int d = 0; d < device; d++) {
        int a = num_axes - 1;
        while (a >= 0 && ++coords[a] == sizes[a])
            coords[a--] = 0;
    }
}

/* A tensor's placement for the reference: for each tensor axis the mesh axis splitting it or
 * -1, as in dt_layout.axes but owned by the test. */
typedef struct ref_place {
    int num_axes; /* mesh */
    int sizes[DT_MAX_MESH_AXES];
    int rank; /* tensor */
    int axes[DT_MAX_RANK];
    int64_t shape[DT_MAX_RANK];
} ref_place;

/* Local shape and offset of the device at `coords`, from the dealt shards. */
static inline void ref_local_shape(const ref_place *p, const int coords[], int64_t local[],
                                   int64_t off[])
{
    for (int i = 0; i < p->rank; i++) {
        if (p->axes[i] < 0) {
            local[i] = p->shape[i];
            off[i] = 0;
            continue;
        }
        int64_t size[REF_MAX_SHARDS], offs[REF_MAX_SHARDS];
        int s = p->sizes[p->axes[i]];
        ref_shards(p->shape[i], s, size, offs);
        local[i] = size[coords[p->axes[i]]];
        off[i] = offs[coords[p->axes[i]]];
    }
}

static inline int64_t ref_count(int rank, const int64_t shape[])
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

/* Does the device at `coords` hold global element `idx` (a multi-index)? */
static inline bool ref_holds(const ref_place *p, const int coords[], const int64_t idx[])
{
    for (int i = 0; i < p->rank; i++)
        if (p->axes[i] >= 0 &&
            ref_owner(p->shape[i], p->sizes[p->axes[i]], idx[i]) != coords[p->axes[i]])
            return false;
    return true;
}

/* Advance a row-major multi-index; false after the last one. */
static inline bool ref_next(int rank, const int64_t shape[], int64_t idx[])
{
    int i = rank - 1;
    while (i >= 0 && ++idx[i] == shape[i])
        idx[i--] = 0;
    return i >= 0;
}

/* The component of the device at `coords`: every global element it holds, in row-major
 * order of the global array. Returns the number of elements written to dst. */
static inline int64_t ref_component(const ref_place *p, const int coords[], const void *global,
                                    size_t es, void *dst)
{
    if (ref_count(p->rank, p->shape) == 0)
        return 0;
    int64_t idx[DT_MAX_RANK] = {0}, e = 0, kept = 0;
    do {
        if (ref_holds(p, coords, idx)) {
            memcpy((char *)dst + (size_t)kept * es, (const char *)global + (size_t)e * es, es);
            kept++;
        }
        e++;
    } while (ref_next(p->rank, p->shape, idx));
    return kept;
}

/* A distinct, exactly representable value per element e and dtype, written to buf[e]. */
/* Element k of a buffer of `dtype` set to the integer v (exact for every dtype here). */
static inline void ref_set(dt_dtype dtype, void *buf, int64_t k, int64_t v)
{
    switch (dtype) {
    case DT_DTYPE_F32:
        ((float *)buf)[k] = (float)v;
        break;
    case DT_DTYPE_F64:
        ((double *)buf)[k] = (double)v;
        break;
    case DT_DTYPE_I32:
        ((int32_t *)buf)[k] = (int32_t)v;
        break;
    default:
        ((int64_t *)buf)[k] = v;
        break;
    }
}

static inline void ref_fill(dt_dtype dtype, int64_t n, void *buf, int salt)
{
    for (int64_t e = 0; e < n; e++) {
        int64_t v = (e * 37 + salt) % 100003 - 5000;
        switch (dtype) {
        case DT_DTYPE_F32:
            ((float *)buf)[e] = (float)v * 0.5f;
            break;
        case DT_DTYPE_F64:
            ((double *)buf)[e] = (double)v * 0.25;
            break;
        case DT_DTYPE_I32:
            ((int32_t *)buf)[e] = (int32_t)v;
            break;
        default:
            ((int64_t *)buf)[e] = v * 1000003;
            break;
        }
    }
}

/* Every assignment of mesh axes (each at most once) or unsharded to `rank` tensor axes:
 * layouts[k][i] in -1..num_axes-1. Returns the count (at most max). */
static inline int ref_all_layouts(int num_axes, int rank, int layouts[][DT_MAX_RANK], int max)
{
    int count = 0, cur[DT_MAX_RANK];
    for (int i = 0; i < rank; i++)
        cur[i] = -1;
    /* Odometer over (num_axes + 1)^rank choices, keeping those without a repeated mesh axis. */
    for (;;) {
        bool ok = true;
        for (int i = 0; i < rank && ok; i++)
            for (int j = 0; j < i && ok; j++)
                if (cur[i] >= 0 && cur[i] == cur[j])
                    ok = false;
        if (ok && count < max) {
            memcpy(layouts[count], cur, sizeof cur);
            count++;
        }
        int i = rank - 1;
        while (i >= 0 && ++cur[i] == num_axes)
            cur[i--] = -1;
        if (i < 0)
            break;
    }
    return count;
}

/* The names-array form of an axis assignment, for dt_layout_create. */
static inline void ref_specs(const char *const names[], int rank, const int axes[],
                             const char *specs[])
{
    for (int i = 0; i < rank; i++)
        specs[i] = axes[i] < 0 ? "unsharded" : names[axes[i]];
}

/* The largest difference of got from ref relative to max(1, |ref|); NaN anywhere: infinite. */
static inline double ref_worst(const double *got, const double *ref, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        w = isnan(d) ? INFINITY : fmax(w, d);
    }
    return w;
}

#endif
