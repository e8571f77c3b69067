/* The CPU kernel of sparse softmax cross-entropy (XENT; the op is spmd/ops/sparse_xent.c, the
 * modes are in common/kernels.h). The two passes over the logits (STATS, GRAD) take a row at a
 * time in blocks of XENT_BLOCK elements widened to the compute type; f32, bf16 and f16 compute
 * in f32 with the vector exp where the CPU has AVX2 and FMA (backends/cpu/vmath.c), f64 in
 * double. STATS keeps an online maximum: a block whose maximum exceeds the running one rescales
 * the running sum once, so the row is read once. Sums are in double, 8 running chains a row in
 * a fixed order; rows are split over the device's threads, each row computed as on one thread,
 * so results do not depend on the thread count. With the flag PROBS (Keras's loss of
 * probabilities), STATS sums the clipped probabilities and GRAD writes the clip-masked
 * 1 / sum: one pass each, no exp or log per element. */
#include "xent.h"
#include "convert.h"
#include "dt.h"
#include "pool.h"
#include "unary.h"
#include "vmath.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

enum { XENT_BLOCK = 256, XENT_CHAINS = 8 };

/* TensorFlow's shift of reduce_logsumexp: the maximum where it is finite, else 0. */
static double shift(double m)
{
    return isfinite(m) ? m : 0;
}

/* Elements [at, at + n) of a row of dtype dt widened to float. */
static void widen(dt_dtype dt, const void *row, int64_t at, int64_t n, float *buf)
{
    if (dt == DT_DTYPE_F32)
        for (int64_t j = 0; j < n; j++)
            buf[j] = ((const float *)row)[at + j];
    else if (dt == DT_DTYPE_BF16)
        for (int64_t j = 0; j < n; j++)
            buf[j] = dt__bf16_to_f32(((const uint16_t *)row)[at + j]);
    else
        for (int64_t j = 0; j < n; j++)
            buf[j] = dt__f16_to_f32(((const uint16_t *)row)[at + j]);
}

/* buf[0..n) stored as elements [at, at + n) of a row of dtype dt (f32, bf16 or f16), each
 * 16-bit float rounded once. */
static void narrow(dt_dtype dt, const float *buf, int64_t n, void *row, int64_t at)
{
    if (dt == DT_DTYPE_F32)
        for (int64_t j = 0; j < n; j++)
            ((float *)row)[at + j] = buf[j];
    else if (dt == DT_DTYPE_BF16)
        for (int64_t j = 0; j < n; j++)
            ((uint16_t *)row)[at + j] = dt__f32_to_bf16(buf[j]);
    else
        for (int64_t j = 0; j < n; j++)
            ((uint16_t *)row)[at + j] = dt__f32_to_f16(buf[j]);
}

/* buf[j] = exp(buf[j]) for j < n, f32. */
static void exp_f32(float *buf, int64_t n, bool vec)
{
    if (vec)
        dt__vmath_unary_f32(DT_UNARY_EXP, buf, buf, n);
    else
        for (int64_t j = 0; j < n; j++)
            buf[j] = expf(buf[j]);
}

/* sum of buf[0..n) into the chains, element j to chain j % XENT_CHAINS (n a multiple of it
 * except in a row's last block; the chains restart at each row). */
static void add_chains(double acc[XENT_CHAINS], const float *buf, int64_t n)
{
    int64_t j = 0;
    for (; j + XENT_CHAINS <= n; j += XENT_CHAINS)
        for (int b = 0; b < XENT_CHAINS; b++)
            acc[b] += (double)buf[j + b];
    for (int b = 0; j < n; j++, b++)
        acc[b] += (double)buf[j];
}

static double sum_chains(const double acc[XENT_CHAINS])
{
    double s = 0;
    for (int b = 0; b < XENT_CHAINS; b++)
        s += acc[b];
    return s;
}

static void add_chains_d(double acc[XENT_CHAINS], const double *buf, int64_t n)
{
    int64_t j = 0;
    for (; j + XENT_CHAINS <= n; j += XENT_CHAINS)
        for (int b = 0; b < XENT_CHAINS; b++)
            acc[b] += buf[j + b];
    for (int b = 0; j < n; j++, b++)
        acc[b] += buf[j];
}

/* The label of row r minus the shard's first class: a local class when in [0, n). */
static int64_t local_label(const dt__kargs *k, const void *labels, int64_t r)
{
    return dt__index_at(k->from, labels, r) - k->lo;
}

/* STATS of one row of n (>= 0) elements: out[0..4) = m, s, x[t], owned. */
static void stats_row(dt_dtype dt, const void *row, int64_t n, int64_t t, bool vec, double out[4])
{
    double m = -INFINITY, acc[XENT_CHAINS] = {0};
    double xt = 0;
    if (dt == DT_DTYPE_F64) {
        const double *x = row;
        double buf[XENT_BLOCK];
        for (int64_t at = 0; at < n; at += XENT_BLOCK) {
            int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
            double bm = -INFINITY;
            for (int64_t j = 0; j < len; j++)
                bm = x[at + j] > bm ? x[at + j] : bm;
            if (bm > m) { /* rescale the running sum to the new maximum */
                double f = exp(shift(m) - shift(bm));
                for (int b = 0; b < XENT_CHAINS; b++)
                    acc[b] *= f;
                m = bm;
            }
            double sh = shift(m);
            for (int64_t j = 0; j < len; j++)
                buf[j] = exp(x[at + j] - sh);
            add_chains_d(acc, buf, len);
        }
        if (t >= 0 && t < n)
            xt = x[t];
    } else {
        float buf[XENT_BLOCK];
        for (int64_t at = 0; at < n; at += XENT_BLOCK) {
            int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
            const float *src = buf; /* the block in f32: f32 read where it lies */
            if (dt == DT_DTYPE_F32)
                src = (const float *)row + at;
            else
                widen(dt, row, at, len, buf);
            float bm = -INFINITY;
            for (int64_t j = 0; j < len; j++)
                bm = src[j] > bm ? src[j] : bm;
            if (bm > m) {
                double f = exp(shift(m) - shift(bm));
                for (int b = 0; b < XENT_CHAINS; b++)
                    acc[b] *= f;
                m = bm;
            }
            float sh = (float)shift(m);
            for (int64_t j = 0; j < len; j++)
                buf[j] = src[j] - sh;
            exp_f32(buf, len, vec);
            add_chains(acc, buf, len);
        }
        if (t >= 0 && t < n) {
            float v;
            widen(dt, row, t, 1, &v);
            xt = v;
        }
    }
    out[0] = m;
    out[1] = sum_chains(acc);
    out[2] = xt;
    out[3] = t >= 0 && t < n ? 1 : 0;
}

/* GRAD of one row: dx = (exp(x - lse) - [j == t]) dy, lse = sh(m) + log s. */
static void grad_row(dt_dtype dt, const void *row, int64_t n, int64_t t, double lse, double dy,
                     bool vec, void *dst)
{
    if (dt == DT_DTYPE_F64) {
        const double *x = row;
        double *o = dst;
        for (int64_t j = 0; j < n; j++)
            o[j] = exp(x[j] - lse) * dy;
        if (t >= 0 && t < n)
            o[t] = (exp(x[t] - lse) - 1) * dy;
        return;
    }
    float buf[XENT_BLOCK], fl = (float)lse, fd = (float)dy;
    for (int64_t at = 0; at < n; at += XENT_BLOCK) {
        int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
        if (dt == DT_DTYPE_F32) { /* f32 read where it lies */
            for (int64_t j = 0; j < len; j++)
                buf[j] = ((const float *)row)[at + j] - fl;
        } else {
            widen(dt, row, at, len, buf);
            for (int64_t j = 0; j < len; j++)
                buf[j] -= fl;
        }
        exp_f32(buf, len, vec);
        if (t >= at && t < at + len)
            buf[t - at] -= 1;
        for (int64_t j = 0; j < len; j++)
            buf[j] *= fd;
        narrow(dt, buf, len, dst, at);
    }
}

/* p clipped to [lo, hi] (NaN stays NaN, as the clip's comparisons leave it). */
static float clip_f32(float p, float lo, float hi)
{
    return p < lo ? lo : p > hi ? hi : p;
}

static double clip_f64(double p, double lo, double hi)
{
    return p < lo ? lo : p > hi ? hi : p;
}

/* STATS|PROBS of one row of n probabilities clipped to [eps, 1 - eps] (bounds in the compute
 * type): out[0..4) = 0, sum c, log c[t], owned. */
static void stats_row_probs(dt_dtype dt, const void *row, int64_t n, int64_t t, double eps,
                            double out[4])
{
    double acc[XENT_CHAINS] = {0}, ct = 1;
    bool own = t >= 0 && t < n;
    if (dt == DT_DTYPE_F64) {
        const double *x = row;
        double buf[XENT_BLOCK];
        for (int64_t at = 0; at < n; at += XENT_BLOCK) {
            int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
            for (int64_t j = 0; j < len; j++)
                buf[j] = clip_f64(x[at + j], eps, 1 - eps);
            add_chains_d(acc, buf, len);
        }
        if (own)
            ct = clip_f64(x[t], eps, 1 - eps);
    } else {
        float buf[XENT_BLOCK], lo = (float)eps, hi = (float)(1 - eps);
        for (int64_t at = 0; at < n; at += XENT_BLOCK) {
            int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
            const float *src = buf; /* the block in f32: f32 read where it lies */
            if (dt == DT_DTYPE_F32)
                src = (const float *)row + at;
            else
                widen(dt, row, at, len, buf);
            for (int64_t j = 0; j < len; j++)
                buf[j] = clip_f32(src[j], lo, hi);
            add_chains(acc, buf, len);
        }
        if (own) {
            float v;
            widen(dt, row, t, 1, &v);
            ct = clip_f32(v, lo, hi);
        }
    }
    out[0] = 0;
    out[1] = sum_chains(acc);
    out[2] = own ? log(ct) : 0;
    out[3] = own ? 1 : 0;
}

/* GRAD|PROBS of one row: dx = [lo <= p_j <= hi] (1 / s - [j == t] / p_j) dy; NaN when !own. */
static void grad_row_probs(dt_dtype dt, const void *row, int64_t n, int64_t t, double s, bool own,
                           double dy, double eps, void *dst)
{
    if (dt == DT_DTYPE_F64) {
        const double *x = row;
        double *o = dst, g = own ? dy / s : NAN;
        for (int64_t j = 0; j < n; j++)
            o[j] = x[j] >= eps && x[j] <= 1 - eps ? g : own ? 0 : NAN;
        if (own && t >= 0 && t < n && x[t] >= eps && x[t] <= 1 - eps)
            o[t] = (1 / s - 1 / x[t]) * dy;
        return;
    }
    float buf[XENT_BLOCK], lo = (float)eps, hi = (float)(1 - eps);
    float g = own ? (float)(dy / s) : NAN, off = own ? 0 : NAN;
    for (int64_t at = 0; at < n; at += XENT_BLOCK) {
        int64_t len = n - at < XENT_BLOCK ? n - at : XENT_BLOCK;
        const float *src = buf;
        if (dt == DT_DTYPE_F32)
            src = (const float *)row + at;
        else
            widen(dt, row, at, len, buf);
        /* the target's place in the block, where its clip is not active (else -1) */
        int64_t tj =
            own && t >= at && t < at + len && src[t - at] >= lo && src[t - at] <= hi ? t - at : -1;
        float gt = tj >= 0 ? (float)((1 / s - 1 / (double)src[tj]) * dy) : 0;
        for (int64_t j = 0; j < len; j++)
            buf[j] = src[j] >= lo && src[j] <= hi ? g : off;
        if (tj >= 0)
            buf[tj] = gt;
        narrow(dt, buf, len, dst, at);
    }
}

/* An element of the acc dtype (f32 for f32, bf16, f16; f64) as double, and back. */
static double acc_ld(dt_dtype dt, const void *p, int64_t i)
{
    return dt == DT_DTYPE_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static void acc_st(dt_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DT_DTYPE_F64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* A value of x's dtype from double (16-bit floats rounded once, from f32). */
static void x_st(dt_dtype dt, void *p, int64_t i, double v)
{
    if (dt == DT_DTYPE_F64)
        ((double *)p)[i] = v;
    else if (dt == DT_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else if (dt == DT_DTYPE_BF16)
        ((uint16_t *)p)[i] = dt__f32_to_bf16((float)v);
    else
        ((uint16_t *)p)[i] = dt__f32_to_f16((float)v);
}

static double x_ld(dt_dtype dt, const void *p, int64_t i)
{
    float v;
    if (dt == DT_DTYPE_F64)
        return ((const double *)p)[i];
    widen(dt, p, i, 1, &v);
    return v;
}

typedef struct xent_job {
    dt_dtype dt;
    const dt__kargs *k;
    const void *const *in;
    void *out;
    bool vec;
} xent_job;

/* Rows [lo, hi) of one call. */
static void xent_range(void *arg, int64_t lo, int64_t hi)
{
    const xent_job *j = arg;
    const dt__kargs *k = j->k;
    dt_dtype dt = j->dt;
    size_t es = dt_dtype_size(dt);
    int64_t n = k->inner;
    unsigned mode = DT__MODE_KIND(k->mode);
    bool probs = k->mode & DT__XENT_PROBS;
    for (int64_t r = lo; r < hi; r++) {
        switch (mode) {
        case DT__XENT_STATS: {
            double st[4];
            const void *row = (const unsigned char *)j->in[0] + (size_t)(r * n) * es;
            if (probs)
                stats_row_probs(dt, row, n, local_label(k, j->in[1], r), k->a, st);
            else
                stats_row(dt, row, n, local_label(k, j->in[1], r), j->vec, st);
            for (int q = 0; q < 4; q++)
                acc_st(dt, j->out, 4 * r + q, st[q]);
            break;
        }
        case DT__XENT_MAX:
            acc_st(dt, j->out, r, acc_ld(dt, j->in[0], 4 * r));
            break;
        case DT__XENT_COMBINE: {
            double ml = acc_ld(dt, j->in[0], 4 * r), s = acc_ld(dt, j->in[0], 4 * r + 1);
            double m = acc_ld(dt, j->in[1], r);
            /* an empty (or all -inf) shard adds nothing: its sum is 0 */
            acc_st(dt, j->out, 3 * r, s > 0 ? s * exp(shift(ml) - shift(m)) : 0);
            acc_st(dt, j->out, 3 * r + 1, acc_ld(dt, j->in[0], 4 * r + 2));
            acc_st(dt, j->out, 3 * r + 2, acc_ld(dt, j->in[0], 4 * r + 3));
            break;
        }
        case DT__XENT_LOSS: {
            double m = acc_ld(dt, j->in[0], r), s = acc_ld(dt, j->in[1], 3 * r);
            double xt = acc_ld(dt, j->in[1], 3 * r + 1), own = acc_ld(dt, j->in[1], 3 * r + 2);
            double lse =
                dt == DT_DTYPE_F64 ? shift(m) + log(s) : (double)((float)shift(m) + logf((float)s));
            x_st(dt, j->out, r, own == 1 ? lse - xt : NAN);
            break;
        }
        case DT__XENT_GRAD: {
            double m = acc_ld(dt, j->in[2], r), s = acc_ld(dt, j->in[3], 3 * r);
            double own = acc_ld(dt, j->in[3], 3 * r + 2), dy = x_ld(dt, j->in[4], r);
            const void *row = (const unsigned char *)j->in[0] + (size_t)(r * n) * es;
            void *dst = (unsigned char *)j->out + (size_t)(r * n) * es;
            if (probs) {
                grad_row_probs(dt, row, n, local_label(k, j->in[1], r), s, own == 1, dy, k->a, dst);
                break;
            }
            double lse =
                dt == DT_DTYPE_F64 ? shift(m) + log(s) : (double)((float)shift(m) + logf((float)s));
            grad_row(dt, row, n, local_label(k, j->in[1], r), own == 1 ? lse : NAN, dy, j->vec,
                     dst);
            break;
        }
        default:
            break;
        }
    }
}

static void xent(dt_dtype dt, const dt__kctx *x, const dt__kargs *k, const void *const in[],
                 void *out)
{
    xent_job j = {dt, k, in, out,
                  dt != DT_DTYPE_F64 && __builtin_cpu_supports("avx2") &&
                      __builtin_cpu_supports("fma")};
    unsigned mode = DT__MODE_KIND(k->mode);
    bool pass = mode == DT__XENT_STATS || mode == DT__XENT_GRAD;
    int64_t rows = k->nidx;
    int parts = dt__cpu_parts(x, pass ? rows * k->inner : rows, rows);
    if (parts < 2)
        xent_range(&j, 0, rows);
    else
        dt__cpu_pool_run(x->pool, rows, parts, xent_range, &j);
}

#define XENT_ENTRY(NAME, DT)                                                                     \
    dt_status dt__cpu_xent_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], \
                                  void *out)                                                     \
    {                                                                                            \
        xent(DT, x, k, in, out);                                                                 \
        return DT_OK;                                                                            \
    }
XENT_ENTRY(f32, DT_DTYPE_F32)
XENT_ENTRY(f64, DT_DTYPE_F64)
XENT_ENTRY(bf16, DT_DTYPE_BF16)
XENT_ENTRY(f16, DT_DTYPE_F16)
