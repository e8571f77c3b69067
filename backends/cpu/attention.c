/* The CPU attention kernel: o = softmax(scale q k^T) v over [..., T, E] slices, tiled with an
 * online softmax (memory grows with T, not T^2), and its gradient. The op is spmd/ops/attention.c;
 * the modes are in common/kernels.h. */
#include "attention.h"
#include "dt.h"
#include "pool.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Blocks of ATTN_BR queries and ATTN_BC keys: the scores of one block pair, their softmax
 * weights and gradients live in stack arrays, never a [T, T] matrix. */
enum { ATTN_BR = 64, ATTN_BC = 64 };

/* One call's operands: slices of T x E (n elements in all) split over the device's threads,
 * each slice computed whole by one thread, as on one thread (OpenBLAS runs gemms of these
 * block sizes on the calling thread). */
typedef struct {
    const dt__kargs *k;
    const void *const *in;
    void *out;
    int64_t T, E, n;
} attn_job;

#define ATTENTION(NAME, R, GEMM, EXP, LOG)                                                         \
    /* Keys of query row i0 + r in the key block at j0 of nc keys: all, or under the causal        \
     * mask those up to the row's own position. */                                                 \
    static int64_t attn_keys_##NAME(bool causal, int64_t i0, int64_t r, int64_t j0, int64_t nc)    \
    {                                                                                              \
        int64_t lim = causal ? i0 + r - j0 + 1 : nc;                                               \
        return lim < 0 ? 0 : lim > nc ? nc : lim;                                                  \
    }                                                                                              \
    /* Rows i0 .. i0 + nr of o = softmax(scale q k^T) v, by an online softmax over the key         \
     * blocks; m gets each row's log sum exp of its scores (the statistics of the gradient). */    \
    static void attn_rows_##NAME(int64_t T, int64_t E, R scale, bool causal, const R *q,           \
                                 const R *kk, const R *v, int64_t i0, int64_t nr, R *o, R m[],     \
                                 R s[])                                                            \
    {                                                                                              \
        R l[ATTN_BR];                                                                              \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            m[r] = -INFINITY;                                                                      \
            l[r] = 0;                                                                              \
            memset(o + (i0 + r) * E, 0, sizeof(R) * (size_t)E);                                    \
        }                                                                                          \
        int64_t jend = causal ? i0 + nr : T;                                                       \
        for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BC) {                                           \
            int64_t nc = jend - j0 < ATTN_BC ? jend - j0 : ATTN_BC;                                \
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)E, scale,         \
                 q + i0 * E, (int)E, kk + j0 * E, (int)E, 0, s, ATTN_BC);                          \
            for (int64_t r = 0; r < nr; r++) {                                                     \
                R *sr = s + r * ATTN_BC, *orow = o + (i0 + r) * E, mx = m[r], sum = 0;             \
                int64_t lim = attn_keys_##NAME(causal, i0, r, j0, nc);                             \
                for (int64_t c = 0; c < lim; c++)                                                  \
                    mx = sr[c] > mx ? sr[c] : mx;                                                  \
                if (lim > 0 && mx != m[r]) {                                                       \
                    R corr = m[r] == -INFINITY ? 0 : EXP(m[r] - mx);                               \
                    l[r] *= corr;                                                                  \
                    for (int64_t e = 0; e < E; e++)                                                \
                        orow[e] *= corr;                                                           \
                    m[r] = mx;                                                                     \
                }                                                                                  \
                for (int64_t c = 0; c < nc; c++) {                                                 \
                    sr[c] = c < lim ? EXP(sr[c] - m[r]) : 0;                                       \
                    sum += sr[c];                                                                  \
                }                                                                                  \
                l[r] += sum;                                                                       \
            }                                                                                      \
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)E, (int)nc, 1, s,        \
                 ATTN_BC, v + j0 * E, (int)E, 1, o + i0 * E, (int)E);                              \
        }                                                                                          \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            for (int64_t e = 0; e < E; e++)                                                        \
                o[(i0 + r) * E + e] /= l[r];                                                       \
            m[r] += LOG(l[r]);                                                                     \
        }                                                                                          \
    }                                                                                              \
    /* The gradient of one slice, as FlashAttention's: per query block, its output and log sum     \
     * exp again (the output in dq's rows, then cleared), D = rowsum(dy o); per key block the      \
     * weights P = exp(s - lse), dv += P^T dy, dS = P (dy v^T - D), dq += scale dS k, dk += scale  \
     * dS^T q. */                                                                                  \
    static void attn_grad_##NAME(int64_t T, int64_t E, R scale, bool causal, const R *q,           \
                                 const R *kk, const R *v, const R *dy, R *dq, R *dk, R *dv)        \
    {                                                                                              \
        R s[ATTN_BR * ATTN_BC], ds[ATTN_BR * ATTN_BC], lse[ATTN_BR], D[ATTN_BR];                   \
        memset(dk, 0, sizeof(R) * (size_t)(T * E));                                                \
        memset(dv, 0, sizeof(R) * (size_t)(T * E));                                                \
        for (int64_t i0 = 0; i0 < T; i0 += ATTN_BR) {                                              \
            int64_t nr = T - i0 < ATTN_BR ? T - i0 : ATTN_BR;                                      \
            attn_rows_##NAME(T, E, scale, causal, q, kk, v, i0, nr, dq, lse, s);                   \
            for (int64_t r = 0; r < nr; r++) {                                                     \
                R d = 0, *orow = dq + (i0 + r) * E;                                                \
                for (int64_t e = 0; e < E; e++)                                                    \
                    d += dy[(i0 + r) * E + e] * orow[e];                                           \
                D[r] = d;                                                                          \
                memset(orow, 0, sizeof(R) * (size_t)E);                                            \
            }                                                                                      \
            int64_t jend = causal ? i0 + nr : T;                                                   \
            for (int64_t j0 = 0; j0 < jend; j0 += ATTN_BC) {                                       \
                int64_t nc = jend - j0 < ATTN_BC ? jend - j0 : ATTN_BC;                            \
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)E, scale,     \
                     q + i0 * E, (int)E, kk + j0 * E, (int)E, 0, s, ATTN_BC);                      \
                for (int64_t r = 0; r < nr; r++) {                                                 \
                    int64_t lim = attn_keys_##NAME(causal, i0, r, j0, nc);                         \
                    for (int64_t c = 0; c < nc; c++)                                               \
                        s[r * ATTN_BC + c] = c < lim ? EXP(s[r * ATTN_BC + c] - lse[r]) : 0;       \
                }                                                                                  \
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)E, (int)nr, 1, s,      \
                     ATTN_BC, dy + i0 * E, (int)E, 1, dv + j0 * E, (int)E);                        \
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)E, 1,         \
                     dy + i0 * E, (int)E, v + j0 * E, (int)E, 0, ds, ATTN_BC);                     \
                for (int64_t r = 0; r < nr; r++)                                                   \
                    for (int64_t c = 0; c < nc; c++)                                               \
                        ds[r * ATTN_BC + c] = s[r * ATTN_BC + c] * (ds[r * ATTN_BC + c] - D[r]);   \
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)E, (int)nc, scale,   \
                     ds, ATTN_BC, kk + j0 * E, (int)E, 1, dq + i0 * E, (int)E);                    \
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)E, (int)nr, scale, ds, \
                     ATTN_BC, q + i0 * E, (int)E, 1, dk + j0 * E, (int)E);                         \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* Slices lo .. hi of the call (one thread's range; the slices are independent). */            \
    static void attn_slices_##NAME(void *arg, int64_t lo, int64_t hi)                              \
    {                                                                                              \
        const attn_job *j = arg;                                                                   \
        const dt__kargs *k = j->k;                                                                 \
        bool grad = DT__MODE_KIND(k->mode) == DT__ATTN_GRAD;                                       \
        bool causal = (k->mode & DT__ATTN_CAUSAL) != 0;                                            \
        int64_t T = j->T, E = j->E, n = j->n;                                                      \
        R scale = (R)k->a, *o = j->out;                                                            \
        const R *Q = j->in[0], *K = j->in[1], *V = j->in[2];                                       \
        for (int64_t b = lo; b < hi; b++) {                                                        \
            int64_t at = b * T * E;                                                                \
            if (grad) {                                                                            \
                attn_grad_##NAME(T, E, scale, causal, Q + at, K + at, V + at,                      \
                                 (const R *)j->in[3] + at, o + at, o + n + at, o + 2 * n + at);    \
                continue;                                                                          \
            }                                                                                      \
            R s[ATTN_BR * ATTN_BC], m[ATTN_BR];                                                    \
            for (int64_t i0 = 0; i0 < T; i0 += ATTN_BR)                                            \
                attn_rows_##NAME(T, E, scale, causal, Q + at, K + at, V + at, i0,                  \
                                 T - i0 < ATTN_BR ? T - i0 : ATTN_BR, o + at, m, s);               \
        }                                                                                          \
    }                                                                                              \
    void dt__cpu_attention_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[],   \
                                  void *out)                                                       \
    {                                                                                              \
        int r = DT__MODE_KIND(k->mode) == DT__ATTN_GRAD ? k->rank - 1 : k->rank;                   \
        const int64_t *qs = k->in_shape[0];                                                        \
        int64_t T = qs[r - 2], E = qs[r - 1], slices = dt__num_elements(r - 2, qs);                \
        int64_t n = slices * T * E, work = n * T; /* multiply-adds of q k^T */                     \
        attn_job j = {k, in, out, T, E, n};                                                        \
        if (n > 0)                                                                                 \
            dt__cpu_pool_run(x->pool, slices, dt__cpu_parts(x, work, slices), attn_slices_##NAME,  \
                             &j);                                                                  \
    }
ATTENTION(f32, float, cblas_sgemm, expf, logf)
ATTENTION(f64, double, cblas_dgemm, exp, log)
