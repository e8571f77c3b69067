/* Collective tests' oracle, shared by the unit (one client) and MPI (many clients) tests.
 *
 * Inputs are a pure function of (global device id, element index), so every client knows
 * every device's input; the expected output of each local device is computed here by direct
 * loops over the group members, straight from the definitions in collectives.h, without any
 * of the library's group or reduction code except dt__group_* (tested on their own against
 * hand-written groups). */
#ifndef DT_TEST_COLL_REF_H
#define DT_TEST_COLL_REF_H

#include "../collectives/collectives.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Element e of device d's send buffer: small integers, exact in every dtype; products stay
 * small (1 or 2, so a product over 8 members is at most 256: exact in every float dtype, and
 * wrapping in the 8-bit integers as the library's arithmetic does). */
static inline double ref_val(int d, int64_t e, dt_reduce_op op)
{
    if (op == DT_REDUCE_PROD)
        return (double)((d * 7 + e * 3) % 2 + 1);
    return (double)((d * 7 + e * 3 + 5) % 11 - 5);
}

/* v as an element of dtype t holds it: integers wrap to their width, bool is v != 0, floats
 * round (bf16 and f16 to nearest even). */
static inline double ref_as(dt_dtype t, double v)
{
    switch (t) {
    case DT_DTYPE_F32:
        return (float)v;
    case DT_DTYPE_I32:
        return (int32_t)(int64_t)v;
    case DT_DTYPE_BF16:
        return dt_bf16_to_f32(dt_f64_to_bf16(v));
    case DT_DTYPE_F16:
        return dt_f16_to_f32(dt_f64_to_f16(v));
    case DT_DTYPE_BOOL:
        return v != 0;
    case DT_DTYPE_U8:
        return (uint8_t)(int64_t)v;
    case DT_DTYPE_I8:
        return (int8_t)(int64_t)v;
    default:
        return v;
    }
}

/* The input element as the send buffer holds it. */
static inline double ref_in(dt_dtype t, int d, int64_t e, dt_reduce_op op)
{
    return ref_as(t, ref_val(d, e, op));
}

static inline void ref_store(dt_dtype t, void *buf, int64_t i, double v)
{
    switch (t) {
    case DT_DTYPE_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case DT_DTYPE_F64:
        ((double *)buf)[i] = v;
        break;
    case DT_DTYPE_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case DT_DTYPE_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case DT_DTYPE_BF16:
        ((uint16_t *)buf)[i] = dt_f64_to_bf16(v);
        break;
    case DT_DTYPE_F16:
        ((uint16_t *)buf)[i] = dt_f64_to_f16(v);
        break;
    case DT_DTYPE_BOOL:
        ((uint8_t *)buf)[i] = v != 0;
        break;
    case DT_DTYPE_U8:
        ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
        break;
    default:
        ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
        break;
    }
}

static inline double ref_load(dt_dtype t, const void *buf, int64_t i)
{
    switch (t) {
    case DT_DTYPE_F32:
        return ((const float *)buf)[i];
    case DT_DTYPE_F64:
        return ((const double *)buf)[i];
    case DT_DTYPE_I32:
        return ((const int32_t *)buf)[i];
    case DT_DTYPE_I64:
        return (double)((const int64_t *)buf)[i];
    case DT_DTYPE_BF16:
        return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_DTYPE_F16:
        return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_DTYPE_BOOL:
    case DT_DTYPE_U8:
        return ((const uint8_t *)buf)[i];
    default:
        return ((const int8_t *)buf)[i];
    }
}

/* Reduce a list of values (as the dtype holds them) as the dtype would, mean included: exact
 * sums and products, then wrapped or rounded once (bf16 and f16 reduce in f32 and round). */
static inline double ref_reduce(dt_dtype t, dt_reduce_op op, const double *v, int n)
{
    double acc = v[0];
    for (int i = 1; i < n; i++) {
        switch (op) {
        case DT_REDUCE_MAX:
            acc = v[i] > acc ? v[i] : acc;
            break;
        case DT_REDUCE_MIN:
            acc = v[i] < acc ? v[i] : acc;
            break;
        case DT_REDUCE_PROD:
            acc *= v[i];
            break;
        default:
            acc += v[i];
            break;
        }
    }
    acc = ref_as(t, acc);
    if (op != DT_REDUCE_MEAN)
        return acc;
    switch (t) {
    case DT_DTYPE_F32:
        return (double)((float)acc / (float)n);
    case DT_DTYPE_F64:
        return acc / n;
    case DT_DTYPE_BF16:
    case DT_DTYPE_F16:
        return ref_as(t, acc / n);
    default:
        return ref_as(t, (double)((int64_t)acc / n)); /* C division: toward zero */
    }
}

/* Uneven counts: block r (all-gather, reduce-scatter) or block s->t (all-to-all), zeros
 * included. */
static inline int64_t ref_uneven(dt__coll_kind k, int g, int s, int t, int seed)
{
    if (k == DT__COLL_ALL_TO_ALL)
        return (s + 2 * t + seed) % 3;
    (void)g;
    return (s * 3 + seed) % 4;
}

typedef struct ref_case {
    dt__coll_kind kind;
    dt_dtype dtype;
    dt_reduce_op op;
    unsigned axes;
    int64_t count; /* even forms */
    bool uneven;
    int seed;
    int root;
    bool inplace; /* all-reduce with send == recv */
    dt_collective_algorithm algorithm;
    const char *cause;
} ref_case;

static inline int64_t ref_blk(const ref_case *c, int g, int s, int t)
{
    return c->uneven ? ref_uneven(c->kind, g, s, t, c->seed) : c->count;
}

/* Run the case on mesh m and compare every local device's output. Returns DT_OK and sets
 * *ok; the status of the collective otherwise. `why` gets the first difference. */
static inline dt_status ref_run(const dt_mesh *m, const ref_case *c, bool *ok, char *why, size_t wl)
{
    int nl = dt_mesh_num_local_devices(m);
    int g = dt__group_size(m, c->axes);
    size_t es = dt_dtype_size(c->dtype);
    const void **send = calloc((size_t)nl + 1, sizeof *send);
    void **recv = calloc((size_t)nl + 1, sizeof *recv);
    int64_t **counts = calloc((size_t)nl + 1, sizeof *counts);
    int64_t *nsend = calloc((size_t)nl + 1, sizeof *nsend), *nrecv = calloc((size_t)nl + 1, 8);
    int64_t clen = c->kind == DT__COLL_ALL_TO_ALL ? (int64_t)g * g : g;
    int64_t *carr = malloc(sizeof(int64_t) * (size_t)clen);
    dt_status s = DT_OK;
    *ok = true;
    why[0] = '\0';
    for (int s2 = 0; s2 < (c->kind == DT__COLL_ALL_TO_ALL ? g : 1); s2++)
        for (int t = 0; t < g; t++)
            carr[c->kind == DT__COLL_ALL_TO_ALL ? s2 * g + t : t] =
                c->kind == DT__COLL_ALL_TO_ALL ? ref_uneven(c->kind, g, s2, t, c->seed)
                                               : ref_uneven(c->kind, g, t, 0, c->seed);
    for (int i = 0; i < nl; i++) {
        int d = dt_mesh_local_device_id(m, i), q = dt__group_rank(m, c->axes, d);
        int64_t total = 0, ns = 0, nr = 0;
        for (int b = 0; b < g; b++)
            total += ref_blk(c, g, b, 0);
        switch (c->kind) {
        case DT__COLL_ALL_REDUCE:
        case DT__COLL_BROADCAST:
            ns = nr = c->count;
            break;
        case DT__COLL_ALL_GATHER:
            ns = ref_blk(c, g, q, 0);
            nr = total;
            break;
        case DT__COLL_REDUCE_SCATTER:
            ns = total;
            nr = ref_blk(c, g, q, 0);
            break;
        default:
            for (int t = 0; t < g; t++) {
                ns += ref_blk(c, g, q, t);
                nr += ref_blk(c, g, t, q);
            }
            break;
        }
        nsend[i] = ns;
        nrecv[i] = nr;
        void *sb = malloc((size_t)ns * es + 8);
        for (int64_t e = 0; e < ns; e++)
            ref_store(c->dtype, sb, e, ref_in(c->dtype, d, e, c->op));
        recv[i] = c->inplace ? sb : malloc((size_t)nr * es + 8);
        if (!c->inplace)
            memset(recv[i], 0xA5, (size_t)nr * es + 8);
        send[i] = sb;
        counts[i] = carr;
    }
    dt__coll call = {.kind = c->kind,
                     .dtype = c->dtype,
                     .op = c->op,
                     .axes = c->axes,
                     .root = c->root,
                     .algorithm = c->algorithm,
                     .cause = c->cause,
                     .send = send,
                     .recv = recv,
                     .count = c->count,
                     .counts = c->uneven ? (const int64_t *const *)counts : NULL};
    s = dt__collective(m, &call);
    for (int i = 0; s == DT_OK && *ok && i < nl; i++) {
        int d = dt_mesh_local_device_id(m, i), q = dt__group_rank(m, c->axes, d);
        int mem[64];
        double v[64];
        for (int r = 0; r < g && r < 64; r++)
            mem[r] = dt__group_member(m, c->axes, d, r);
        for (int64_t e = 0; *ok && e < nrecv[i]; e++) {
            double want = 0;
            switch (c->kind) {
            case DT__COLL_ALL_REDUCE:
                for (int r = 0; r < g; r++)
                    v[r] = ref_in(c->dtype, mem[r], e, c->op);
                want = ref_reduce(c->dtype, c->op, v, g);
                break;
            case DT__COLL_ALL_GATHER: {
                int r = 0;
                int64_t o = e;
                while (o >= ref_blk(c, g, r, 0))
                    o -= ref_blk(c, g, r++, 0);
                want = ref_in(c->dtype, mem[r], o, c->op);
                break;
            }
            case DT__COLL_REDUCE_SCATTER: {
                int64_t o = e;
                for (int b = 0; b < q; b++)
                    o += ref_blk(c, g, b, 0);
                for (int r = 0; r < g; r++)
                    v[r] = ref_in(c->dtype, mem[r], o, c->op);
                want = ref_reduce(c->dtype, c->op, v, g);
                break;
            }
            case DT__COLL_ALL_TO_ALL: {
                int src = 0;
                int64_t o = e;
                while (o >= ref_blk(c, g, src, q))
                    o -= ref_blk(c, g, src++, q);
                for (int t = 0; t < q; t++)
                    o += ref_blk(c, g, src, t);
                want = ref_in(c->dtype, mem[src], o, c->op);
                break;
            }
            default:
                want = ref_in(c->dtype, mem[c->root], e, c->op);
                break;
            }
            double got = ref_load(c->dtype, recv[i], e);
            if (got != want) {
                *ok = false;
                snprintf(why, wl,
                         "%s %s %s axes 0x%x%s: device %d (member %d of %d) element %lld is %g, "
                         "expected %g",
                         dt__coll_kind_name(c->kind), dt_dtype_name(c->dtype),
                         dt_reduce_op_name(c->op), c->axes, c->uneven ? " uneven" : "", d, q, g,
                         (long long)e, got, want);
            }
        }
    }
    for (int i = 0; i < nl; i++) {
        free((void *)send[i]);
        if (!c->inplace)
            free(recv[i]);
    }
    free(send);
    free(recv);
    free(counts);
    free(nsend);
    free(nrecv);
    free(carr);
    return s;
}

/* Every kind, dtype and reduction on one (mesh, mask): even counts 0, 5 and `big`, the
 * uneven forms, broadcast from the first and last member, in-place all-reduce. Returns the
 * number of collectives run, or -1 when any failed (why names the first). */
static inline int ref_sweep(const dt_mesh *m, unsigned axes, int64_t big,
                            dt_collective_algorithm alg, char *why, size_t wl)
{
    int runs = 0, g = dt__group_size(m, axes);
    bool failed = false;
    const int64_t counts[] = {0, 5, big};
    for (int k = 0; k < DT__COLL_KIND_COUNT; k++)
        for (int t = 0; t < DT_DTYPE_COUNT; t++) {
            bool red = k == DT__COLL_ALL_REDUCE || k == DT__COLL_REDUCE_SCATTER;
            for (int op = 0; op < (red ? DT_REDUCE_COUNT : 1); op++)
                for (int ci = 0; ci < 5; ci++) {
                    /* bool reduces by max and min alone (any, all): the ops never ask more */
                    if (red && t == DT_DTYPE_BOOL && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
                        continue;
                    ref_case c = {.kind = (dt__coll_kind)k,
                                  .dtype = (dt_dtype)t,
                                  .op = (dt_reduce_op)op,
                                  .axes = axes,
                                  .algorithm = alg,
                                  .cause = "ref_sweep"};
                    if (ci < 3) {
                        c.count = counts[ci];
                        /* the big count on one dtype / op per kind keeps the sweep quick */
                        if (ci == 2 && (big <= 5 || t != DT_DTYPE_F32 || op > 1))
                            continue;
                    } else if (ci == 3) {
                        if (k == DT__COLL_ALL_REDUCE || k == DT__COLL_BROADCAST) {
                            if (k == DT__COLL_BROADCAST || t != DT_DTYPE_F64)
                                continue;
                            c.count = 7;
                            c.inplace = true;
                        } else {
                            c.uneven = true;
                            c.seed = 1;
                        }
                    } else {
                        if (k == DT__COLL_BROADCAST) {
                            c.count = 3;
                            c.root = g - 1;
                        } else if (k != DT__COLL_ALL_REDUCE) {
                            c.uneven = true;
                            c.seed = 2;
                        } else {
                            continue;
                        }
                    }
                    bool ok;
                    char w[512];
                    dt_status s = ref_run(m, &c, &ok, w, sizeof w);
                    runs++;
                    /* keep going after a failure: other clients are in the same sequence */
                    if (s != DT_OK && !failed)
                        snprintf(why, wl, "%s %s: %s: %s", dt__coll_kind_name(c.kind),
                                 dt_dtype_name(c.dtype), dt_status_name(s), dt_last_error());
                    else if (!ok && !failed)
                        snprintf(why, wl, "%s", w);
                    failed = failed || s != DT_OK || !ok;
                }
        }
    return failed ? -1 : runs;
}

#endif /* DT_TEST_COLL_REF_H */
