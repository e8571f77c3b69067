/* The CPU kernels' loops over several rows at once and their other fast paths against plain
 * references written here, bit for bit: each output adds its inputs in input order (the sums
 * the CPU and GPU kernels promise), whatever rows or columns a loop advances together. Reduce
 * over rows of the last axes (row counts with and without a remainder to the block of rows,
 * sum, mean, max with NaNs, f32 and i32), reduce over axes that are not contiguous (a bias
 * gradient of [B, H, T, E] over B and T), the norms' statistics (sums in double), softmax's
 * maximum and sum of exponentials, and a cast of one broadcast element. The elementwise and
 * reduce loops run in the form the library picked for this CPU (AVX2 where it has it); the
 * elementwise ops against plain loops too, f32 and bf16, whole and broadcast operands. */
#include "dt.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t lcg = 98765;

/* values in [-4, 4) with a fractional part, deterministic */
static float next_value(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 11) / 9007199254740992.0 * 8.0 - 4.0);
}

static float *random_f32(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = next_value();
    return p;
}

/* k for an output of `shape`, operand 0 of in_shape */
static dt__kargs kargs_of(int rank, const int64_t shape[], const int64_t in_shape[])
{
    dt__kargs k;
    memset(&k, 0, sizeof k);
    k.rank = rank;
    for (int i = 0; i < rank; i++) {
        k.shape[i] = shape[i];
        k.in_shape[0][i] = in_shape[i];
    }
    k.a = 1.0;
    return k;
}

static const dt__kctx one = {.type = "CPU", .cores = 1};

static void run(dt__kernel kern, dt_dtype dt, const dt__kargs *k, const void *const in[], void *out)
{
    cr_assert_eq(dt__cpu_kernels[kern][dt](&one, k, in, out), DT_OK);
}

static void same_bytes(const char *what, const void *got, const void *want, size_t n)
{
    const unsigned char *g = got, *w = want;
    size_t at = 0;
    while (at < n && g[at] == w[at])
        at++;
    cr_assert_eq(at, n, "%s: byte %zu differs (%02x, reference %02x)", what, at, at < n ? g[at] : 0,
                 at < n ? w[at] : 0);
}

/* numpy's maximum as a running value: a NaN wins and stays */
static float max_one(float acc, float v)
{
    return v > acc || isnan(v) ? v : acc;
}

Test(cpu_rows, reduce_rows_of_the_last_axes)
{
    int64_t n = 203;
    for (int64_t rows = 1; rows <= 27; rows += 13) { /* 1, 14, 27: below, one block + rest */
        int64_t xs[3] = {rows, 7, n / 7}, os[3] = {rows, 1, 1};
        float *x = random_f32(rows * n), *got = malloc((size_t)rows * 4),
              *want = malloc((size_t)rows * 4);
        if (rows > 1)
            x[n + 5] = NAN; /* row 1 */
        for (int op = 0; op < 3; op++) {
            int kind = op == 0 ? DT_REDUCE_SUM : op == 1 ? DT_REDUCE_MEAN : DT_REDUCE_MAX;
            dt__kargs k = kargs_of(3, os, xs);
            k.op = kind;
            k.mask = 6u;
            k.a = kind == DT_REDUCE_MEAN ? 1.0 / (double)n : 1.0;
            for (int64_t q = 0; q < rows; q++) {
                float acc = kind == DT_REDUCE_MAX ? -INFINITY : 0;
                for (int64_t j = 0; j < n; j++)
                    acc = kind == DT_REDUCE_MAX ? max_one(acc, x[q * n + j]) : acc + x[q * n + j];
                want[q] = kind == DT_REDUCE_MEAN ? (float)((double)acc * k.a) : acc;
            }
            run(DT__K_REDUCE, DT_DTYPE_F32, &k, (const void *[]){x}, got);
            same_bytes("reduce f32 rows", got, want, (size_t)rows * 4);
        }
        /* integers wrap in their own type */
        int32_t *xi = malloc((size_t)(rows * n) * 4), *gi = malloc((size_t)rows * 4),
                *wi = malloc((size_t)rows * 4);
        for (int64_t i = 0; i < rows * n; i++)
            xi[i] = (int32_t)(x[i] * 1e8f);
        for (int64_t q = 0; q < rows; q++) {
            uint32_t acc = 0;
            for (int64_t j = 0; j < n; j++)
                acc += (uint32_t)xi[q * n + j];
            wi[q] = (int32_t)acc;
        }
        dt__kargs k = kargs_of(3, os, xs);
        k.op = DT_REDUCE_SUM;
        k.mask = 6u;
        run(DT__K_REDUCE, DT_DTYPE_I32, &k, (const void *[]){xi}, gi);
        same_bytes("reduce i32 rows", gi, wi, (size_t)rows * 4);
        free(x);
        free(got);
        free(want);
        free(xi);
        free(gi);
        free(wi);
    }
}

Test(cpu_rows, reduce_over_axes_apart)
{
    /* [B, H, T, E] over B and T (axes 0 and 2), and [B, T, F] over B alone with a 1 between */
    int64_t xs[4] = {3, 5, 11, 17}, os[4] = {1, 5, 1, 17}, ni = 3 * 5 * 11 * 17;
    float *x = random_f32(ni), *got = malloc(5 * 17 * 4), *want = malloc(5 * 17 * 4);
    x[2 * 5 * 11 * 17 + 7] = NAN;
    for (int op = 0; op < 2; op++) {
        int kind = op == 0 ? DT_REDUCE_SUM : DT_REDUCE_MAX;
        for (int h = 0; h < 5; h++)
            for (int e = 0; e < 17; e++) {
                float acc = kind == DT_REDUCE_MAX ? -INFINITY : 0;
                for (int b = 0; b < 3; b++) /* input order: b, then t */
                    for (int t = 0; t < 11; t++) {
                        float v = x[((b * 5 + h) * 11 + t) * 17 + e];
                        acc = kind == DT_REDUCE_MAX ? max_one(acc, v) : acc + v;
                    }
                want[h * 17 + e] = acc;
            }
        dt__kargs k = kargs_of(4, os, xs);
        k.op = kind;
        k.mask = 5u;
        run(DT__K_REDUCE, DT_DTYPE_F32, &k, (const void *[]){x}, got);
        same_bytes("reduce f32 over axes 0 and 2", got, want, 5 * 17 * 4);
    }
    /* the last axis reduced too: rows of one element */
    int64_t os2[4] = {1, 5, 1, 1};
    float w2[5];
    for (int h = 0; h < 5; h++) {
        float acc = 0;
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < 11; t++)
                for (int e = 0; e < 17; e++)
                    acc += x[((b * 5 + h) * 11 + t) * 17 + e];
        w2[h] = acc;
    }
    dt__kargs k = kargs_of(4, os2, xs);
    k.op = DT_REDUCE_SUM;
    k.mask = 13u;
    run(DT__K_REDUCE, DT_DTYPE_F32, &k, (const void *[]){x}, got);
    same_bytes("reduce f32 over axes 0, 2 and 3", got, w2, sizeof w2);
    free(x);
    free(got);
    free(want);
}

Test(cpu_rows, norm_statistics)
{
    for (int64_t rows = 5; rows <= 21; rows += 16) { /* below one block; two blocks + rest */
        int64_t n = 97, xs[2] = {rows, n}, os[2] = {rows, 1};
        float *x = random_f32(rows * n), *mu = random_f32(rows), *got = malloc((size_t)rows * 4),
              *want = malloc((size_t)rows * 4);
        unsigned modes[3] = {DT__NORM_MEAN, DT__NORM_VAR, DT__NORM_MEAN_SQUARE};
        for (int m = 0; m < 3; m++) {
            dt__kargs k = kargs_of(2, os, xs);
            k.mode = modes[m];
            k.a = 1.0 / (double)n;
            for (int64_t q = 0; q < rows; q++) {
                double acc = 0, c = modes[m] == DT__NORM_VAR ? (double)mu[q] : 0;
                for (int64_t j = 0; j < n; j++) {
                    double v = (double)x[q * n + j] - c;
                    acc += modes[m] == DT__NORM_MEAN ? v : v * v;
                }
                want[q] = (float)(acc * k.a);
            }
            run(DT__K_NORM, DT_DTYPE_F32, &k, (const void *[]){x, mu}, got);
            same_bytes("norm statistics", got, want, (size_t)rows * 4);
        }
        free(x);
        free(mu);
        free(got);
        free(want);
    }
}

Test(cpu_rows, softmax_max_and_sum_of_exp)
{
    for (int64_t rows = 3; rows <= 19; rows += 16) {
        int64_t n = 131, xs[2] = {rows, n}, os[2] = {rows, 1};
        float *x = random_f32(rows * n), *m = malloc((size_t)rows * 4),
              *want = malloc((size_t)rows * 4), *s = malloc((size_t)rows * 4);
        x[2 * n + 3] = NAN;  /* row 2: the maximum skips a NaN */
        x[n + 1] = INFINITY; /* row 1: an infinite maximum shifts by 0 */
        for (int64_t j = 0; j < n; j++)
            x[(rows - 1) * n + j] = -INFINITY; /* the last row: all -inf */
        dt__kargs k = kargs_of(2, os, xs);
        k.mask = 2u;
        k.mode = DT__SOFTMAX_MAX;
        for (int64_t q = 0; q < rows; q++) {
            float best = -INFINITY;
            for (int64_t j = 0; j < n; j++)
                best = x[q * n + j] > best ? x[q * n + j] : best;
            want[q] = best;
        }
        run(DT__K_SOFTMAX, DT_DTYPE_F32, &k, (const void *[]){x, NULL}, m);
        same_bytes("softmax max", m, want, (size_t)rows * 4);
        k.mode = DT__SOFTMAX_SUMEXP;
        for (int64_t q = 0; q < rows; q++) {
            float sh = isfinite(m[q]) ? m[q] : 0;
            double acc = 0;
            for (int64_t j = 0; j < n; j++)
                acc += (double)expf(x[q * n + j] - sh);
            want[q] = (float)acc;
        }
        run(DT__K_SOFTMAX, DT_DTYPE_F32, &k, (const void *[]){x, m}, s);
        same_bytes("softmax sum of exp", s, want, (size_t)rows * 4);
        free(x);
        free(m);
        free(want);
        free(s);
    }
}

Test(cpu_rows, cast_of_one_broadcast_element)
{
    int64_t os[3] = {3, 4, 5}, xs[3] = {1, 1, 1};
    float x = -2.75f;
    dt__kargs k = kargs_of(3, os, xs);
    k.from = DT_DTYPE_F32;
    double d[60], dw[60];
    int32_t i[60], iw[60];
    uint16_t h[60], hw[60];
    for (int q = 0; q < 60; q++) {
        dw[q] = -2.75;
        iw[q] = -2; /* towards zero, as C */
        hw[q] = dt_f32_to_bf16(-2.75f);
    }
    run(DT__K_CAST, DT_DTYPE_F64, &k, (const void *[]){&x}, d);
    same_bytes("cast f32 -> f64", d, dw, sizeof d);
    run(DT__K_CAST, DT_DTYPE_I32, &k, (const void *[]){&x}, i);
    same_bytes("cast f32 -> i32", i, iw, sizeof i);
    run(DT__K_CAST, DT_DTYPE_BF16, &k, (const void *[]){&x}, h);
    same_bytes("cast f32 -> bf16", h, hw, sizeof h);
}

static float op_one(int op, float a, float b)
{
    return op == DT_BINARY_ADD   ? a + b
           : op == DT_BINARY_SUB ? a - b
           : op == DT_BINARY_MUL ? a * b
                                 : a / b;
}

Test(cpu_rows, elementwise_against_plain_loops)
{
    /* [7, 301] with b whole and b a row [1, 301] broadcast over the rows */
    int64_t os[2] = {7, 301}, n = 7 * 301;
    float *a = random_f32(n), *b = random_f32(n), *got = malloc((size_t)n * 4),
          *want = malloc((size_t)n * 4);
    uint16_t *ha = malloc((size_t)n * 2), *hb = malloc((size_t)n * 2), *hg = malloc((size_t)n * 2),
             *hw = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        ha[i] = dt_f32_to_bf16(a[i]);
        hb[i] = dt_f32_to_bf16(b[i]);
    }
    int ops[4] = {DT_BINARY_ADD, DT_BINARY_SUB, DT_BINARY_MUL, DT_BINARY_DIV};
    for (int bc = 0; bc < 2; bc++)
        for (int o = 0; o < 4; o++) {
            int64_t bs[2] = {bc ? 1 : 7, 301};
            dt__kargs k = kargs_of(2, os, os);
            for (int i = 0; i < 2; i++)
                k.in_shape[1][i] = bs[i];
            k.op = ops[o];
            for (int64_t i = 0; i < n; i++) {
                int64_t j = bc ? i % 301 : i;
                want[i] = op_one(ops[o], a[i], b[j]);
                hw[i] =
                    dt_f32_to_bf16(op_one(ops[o], dt_bf16_to_f32(ha[i]), dt_bf16_to_f32(hb[j])));
            }
            run(DT__K_BINARY, DT_DTYPE_F32, &k, (const void *[]){a, b}, got);
            same_bytes("binary f32", got, want, (size_t)n * 4);
            run(DT__K_BINARY, DT_DTYPE_BF16, &k, (const void *[]){ha, hb}, hg);
            same_bytes("binary bf16", hg, hw, (size_t)n * 2);
        }
    int uops[4] = {DT_UNARY_NEG, DT_UNARY_ABS, DT_UNARY_RELU, DT_UNARY_SQUARE};
    for (int o = 0; o < 4; o++) {
        dt__kargs k = kargs_of(2, os, os);
        k.op = uops[o];
        for (int64_t i = 0; i < n; i++) {
            float v = a[i];
            want[i] = uops[o] == DT_UNARY_NEG    ? 0.0f - v
                      : uops[o] == DT_UNARY_ABS  ? (v < 0 ? 0.0f - v : v)
                      : uops[o] == DT_UNARY_RELU ? (v > 0 ? v : 0.0f)
                                                 : v * v;
        }
        run(DT__K_UNARY, DT_DTYPE_F32, &k, (const void *[]){a}, got);
        same_bytes("unary f32", got, want, (size_t)n * 4);
    }
    free(a);
    free(b);
    free(got);
    free(want);
    free(ha);
    free(hb);
    free(hg);
    free(hw);
}
