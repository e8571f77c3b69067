/* The one source of random numbers for every backend: Philox4x32-10 (Salmon et al. 2011, the
 * Random123 generator), the mapping from a global element index to its words, and the
 * conversion of words to uniform and normal values. The CPU kernels (C) and the CUDA kernels
 * (nvcc) include this same file, so a random tensor is bitwise the same on both.
 *
 * Bitwise equality needs every floating-point step to round the same way on both: only
 * IEEE-754 operations that both round correctly (+, -, *, /, sqrt, exact scaling) appear
 * below, the logarithm and cosine of Box-Muller are computed here from them rather than taken
 * from libm (glibc and CUDA's libdevice differ in the last bit), and both compilers are told
 * not to fuse a*b+c (gcc -ffp-contract=off, nvcc --fmad=false; meson.build sets both). */
#ifndef DT_PHILOX_H
#define DT_PHILOX_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DT__HD __host__ __device__ __forceinline__
#else
#define DT__HD static inline
#endif

/* One round on the counter words c0..c3 under the round's key (k0, k1). */
DT__HD void dt__philox_round(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0,
                             uint32_t k1)
{
    uint64_t p0 = (uint64_t)0xD2511F53u * *c0, p1 = (uint64_t)0xCD9E8D57u * *c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    *c0 = hi1 ^ *c1 ^ k0;
    *c1 = lo1;
    *c2 = hi0 ^ *c3 ^ k1;
    *c3 = lo0;
}

/* One block: 10 rounds on a 4-word counter under a 2-word key. */
DT__HD void dt__philox_rounds(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        dt__philox_round(&c0, &c1, &c2, &c3, k0, k1);
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Block `block` of the stream (seed, key): counter (block, key), Philox key = seed. */
DT__HD void dt__philox_block(uint64_t seed, uint64_t key, uint64_t block, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)key,
                             (uint32_t)(key >> 32)};
    const uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    dt__philox_rounds(ctr, k, out);
}

/* DT__PHILOX_BATCH consecutive blocks first, first + 1, ... of the stream (seed, key) at once:
 * word j of block first + i in w[j][i], the words of dt__philox_block; each round a loop over
 * the blocks, which a compiler vectorizes. */
#define DT__PHILOX_BATCH 8
DT__HD void dt__philox_batch(uint64_t seed, uint64_t key, uint64_t first,
                             uint32_t w[4][DT__PHILOX_BATCH])
{
    uint32_t *c0 = w[0], *c1 = w[1], *c2 = w[2], *c3 = w[3];
    for (int i = 0; i < DT__PHILOX_BATCH; i++) {
        uint64_t block = first + (uint64_t)i;
        c0[i] = (uint32_t)block;
        c1[i] = (uint32_t)(block >> 32);
        c2[i] = (uint32_t)key;
        c3[i] = (uint32_t)(key >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        for (int i = 0; i < DT__PHILOX_BATCH; i++)
            dt__philox_round(&c0[i], &c1[i], &c2[i], &c3[i], k0, k1);
    }
}

/* Uniform in [0, 1) from 24 or 53 random bits (exact: the integer fits the mantissa). */
DT__HD double dt__u24(uint32_t w)
{
    return (double)(w >> 8) * 0x1p-24;
}

/* (hi 2^21 + (lo >> 11)) 2^-53, each step exact (integers below 2^53), converted from 32-bit
 * signed integers (hi in two halves), which vector units convert (64-bit integers they do not
 * without AVX-512). */
DT__HD double dt__u53(uint32_t hi, uint32_t lo)
{
    double h = (double)(int32_t)(hi >> 16) * 65536.0 + (double)(int32_t)(hi & 0xffffu);
    return (h * 0x1p21 + (double)(int32_t)(lo >> 11)) * 0x1p-53;
}

/* Natural logarithm of x in (0, 1], within a few ulps: x = m 2^e with m in [sqrt(1/2),
 * sqrt(2)), log m = 2 atanh(s) with s = (m-1)/(m+1), |s| < 0.172, by its odd series (the
 * terms after s^21/21 are below 2^-55 of the sum). x comes from dt__u24 / dt__u53 as 1 - u,
 * so it is at least 2^-53: normal, never zero. */
DT__HD double dt__log01(double x)
{
    union {
        double d;
        uint64_t u;
    } v = {x};
    /* the exponent held as a double (an exact integer), the select below on doubles: a loop of
     * these then vectorizes on baseline x86-64 (SSE2) too, not only with AVX2 */
    double e = (double)(int)((v.u >> 52) & 0x7ff) - 1023.0;
    v.u = (v.u & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
    double m = v.d;
    bool big = m > 1.4142135623730951; /* selects, not branches: a loop of these vectorizes */
    m = big ? m * 0.5 : m;
    e = big ? e + 1.0 : e;
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 21;
    p = p * s2 + 1.0 / 19;
    p = p * s2 + 1.0 / 17;
    p = p * s2 + 1.0 / 15;
    p = p * s2 + 1.0 / 13;
    p = p * s2 + 1.0 / 11;
    p = p * s2 + 1.0 / 9;
    p = p * s2 + 1.0 / 7;
    p = p * s2 + 1.0 / 5;
    p = p * s2 + 1.0 / 3;
    double logm = 2.0 * s + 2.0 * s * (s2 * p);
    /* ln 2 = hi + lo, hi with the low 32 bits zero so that e * hi is exact */
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    return e * ln2_hi + (e * ln2_lo + logm);
}

/* Taylor series of sin and cos on [0, pi/4] (the first terms left out are below 2^-58). */
DT__HD double dt__sin_q(double t)
{
    double t2 = t * t, q = 1.0 / 355687428096000.0; /* 1/17! */
    q = q * t2 - 1.0 / 1307674368000.0;             /* 1/15! */
    q = q * t2 + 1.0 / 6227020800.0;
    q = q * t2 - 1.0 / 39916800.0;
    q = q * t2 + 1.0 / 362880.0;
    q = q * t2 - 1.0 / 5040.0;
    q = q * t2 + 1.0 / 120.0;
    q = q * t2 - 1.0 / 6.0;
    return t + t * t2 * q;
}

DT__HD double dt__cos_q(double t)
{
    double t2 = t * t, r = -1.0 / 6402373705728000.0; /* 1/18! */
    r = r * t2 + 1.0 / 20922789888000.0;              /* 1/16! */
    r = r * t2 - 1.0 / 87178291200.0;
    r = r * t2 + 1.0 / 479001600.0;
    r = r * t2 - 1.0 / 3628800.0;
    r = r * t2 + 1.0 / 40320.0;
    r = r * t2 - 1.0 / 720.0;
    r = r * t2 + 1.0 / 24.0;
    r = r * t2 - 0.5;
    return 1.0 + t2 * r;
}

/* cos(2 pi b) for b in [0, 1), reduced exactly to an angle in [0, pi/4]. Both series are
 * computed and one selected (no branch, so that a loop of these vectorizes; the value is the
 * same). */
DT__HD double dt__cos2pi01(double b)
{
    double y = b < 0.5 ? b : 1.0 - b; /* cos is even and 1-periodic: y in [0, 1/2] */
    bool flip = y > 0.25;             /* cos(pi - t) = -cos t */
    double sign = flip ? -1.0 : 1.0;
    y = flip ? 0.5 - y : y;
    const double two_pi = 6.283185307179586;
    double s = dt__sin_q(two_pi * (0.25 - y)), c = dt__cos_q(two_pi * y);
    return sign * (y > 0.125 ? s : c);
}

/* Elements of the global tensor (row-major index e) of the stream (seed, key), in double:
 *   uniform f32: word e%4 of block e/4;   uniform f64: words 2(e%2), 2(e%2)+1 of block e/2
 *   normal f32:  words 2(e%2), 2(e%2)+1 of block e/2;   normal f64: all 4 words of block e
 * Normal values by Box-Muller: sqrt(-2 log(1 - a)) cos(2 pi b), a and b uniform.
 * Elements per block: */
DT__HD int dt__random_per_block(bool normal, bool f64)
{
    return normal ? (f64 ? 1 : 2) : (f64 ? 2 : 4);
}

/* Element k (< dt__random_per_block) of a block's words w. */
DT__HD double dt__random_from_block(bool normal, bool f64, const uint32_t w[4], int k)
{
    if (!normal)
        return f64 ? dt__u53(w[2 * k], w[2 * k + 1]) : dt__u24(w[k]);
    double a, b;
    if (!f64) {
        a = dt__u24(w[2 * k]);
        b = dt__u24(w[2 * k + 1]);
    } else {
        a = dt__u53(w[0], w[1]);
        b = dt__u53(w[2], w[3]);
    }
    return sqrt(-2.0 * dt__log01(1.0 - a)) * dt__cos2pi01(b);
}

/* Element e alone (a block computed for it). */
DT__HD double dt__random_value(bool normal, bool f64, uint64_t seed, uint64_t key, uint64_t e)
{
    int per = dt__random_per_block(normal, f64);
    uint32_t w[4];
    dt__philox_block(seed, key, e / (uint64_t)per, w);
    return dt__random_from_block(normal, f64, w, (int)(e % (uint64_t)per));
}

/* The value an element of a random tensor takes, before conversion to its dtype: uniform in
 * [lo, hi) or normal with mean `mean` and standard deviation `sd`, from u above. */
DT__HD double dt__random_scale(bool normal, double a, double b, double u)
{
    return normal ? a + b * u : a + (b - a) * u;
}

#endif /* DT_PHILOX_H */
