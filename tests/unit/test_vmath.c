/* The float functions of the unary op (common/unary.h, backends/cpu/vmath.c) against a double
 * reference: every f32 result within 2 ulps of the exact value rounded to f32, over edge cases
 * (zeros, infinities, NaN, subnormals, the largest floats, huge arguments of sin and cos) and
 * sweeps of many inputs; bf16 and f16 results within one unit of their last place of the
 * reference rounded to them. The references are written from libm's double functions, the
 * composites from other formulas than the kernels' (gelu_tanh through pow and exp(2u), the
 * sigmoid and silu through tanh). */
#include "dt.h"
#include "unary.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double reference(int op, double x)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_EXP:
        return exp(x);
    case DT_UNARY_LOG:
        return log(x);
    case DT_UNARY_SQRT:
        return sqrt(x);
    case DT_UNARY_RSQRT:
        return 1.0 / sqrt(x);
    case DT_UNARY_TANH:
        return tanh(x);
    case DT_UNARY_SIN:
        return sin(x);
    case DT_UNARY_COS:
        return cos(x);
    case DT_UNARY_ERF:
        return erf(x);
    case DT_UNARY_SIGMOID: /* (1 + tanh(x / 2)) / 2 */
        return x < 0 ? exp(x) / (1.0 + exp(x)) : 0.5 * (1.0 + tanh(0.5 * x));
    case DT_UNARY_SILU:
        return x < 0 ? x * exp(x) / (1.0 + exp(x)) : x * 0.5 * (1.0 + tanh(0.5 * x));
    case DT_UNARY_GELU:
        return x * 0.5 * erfc(-x / sqrt(2.0));
    case DT_UNARY_GELU_TANH: { /* 0.5 x (1 + tanh(u)), below 0 as x exp(2u) / (1 + exp(2u)) */
        double u = sqrt(2.0 / M_PI) * (x + 0.044715 * pow(x, 3));
        return u < 0 ? x * exp(2 * u) / (1.0 + exp(2 * u)) : 0.5 * x * (1.0 + tanh(u));
    }
    default:
        return NAN;
    }
}

static const int ops[] = {DT_UNARY_EXP,     DT_UNARY_LOG,  DT_UNARY_SQRT, DT_UNARY_RSQRT,
                          DT_UNARY_TANH,    DT_UNARY_SIN,  DT_UNARY_COS,  DT_UNARY_ERF,
                          DT_UNARY_SIGMOID, DT_UNARY_SILU, DT_UNARY_GELU, DT_UNARY_GELU_TANH};
enum { NOPS = sizeof ops / sizeof ops[0] };

/* Floats ordered as integers: the distance in ulps between two finite floats of any sign. */
static int64_t ordered(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

/* ulps between got and the reference rounded to f32; 0 when both are NaN or the same
 * infinity; a large number when only one is. */
static int64_t ulps(float got, double ref)
{
    float r = (float)ref;
    if (isnan(r) || isnan(got))
        return isnan(r) && isnan(got) ? 0 : INT32_MAX;
    if (isinf(r) || isinf(got)) {
        if (got == r)
            return 0;
        /* a result at the edge of overflow: the largest float against infinity is one ulp */
        return fabsf(got) == FLT_MAX || fabsf(r) == FLT_MAX ? 1 : INT32_MAX;
    }
    int64_t d = ordered(got) - ordered(r);
    return d < 0 ? -d : d;
}

/* The inputs: edge cases, then sweeps (uniform over [-12, 12], log-uniform magnitudes of both
 * signs from 1e-30 to 1e30), an odd count so that the vector kernels' tail runs too. */
static float *inputs(int64_t *n)
{
    static const float edges[] = {0.0f,    -0.0f,    INFINITY, -INFINITY,  NAN,        1.0f,
                                  -1.0f,   0.5f,     FLT_MIN,  -FLT_MIN,   1e-40f,     -1e-40f,
                                  FLT_MAX, -FLT_MAX, 88.7f,    -87.3f,     89.0f,      -104.0f,
                                  1e6f,    -1e6f,    1e30f,    3.1415927f, 1.5707964f, 9.0f,
                                  -9.0f,   20.0f,    -20.0f,   1e-7f,      -1e-7f,     4.0f};
    int64_t ne = sizeof edges / sizeof edges[0], nu = 100001, nl = 60000;
    float *x = malloc((size_t)(ne + nu + nl) * sizeof *x);
    cr_assert(x);
    memcpy(x, edges, sizeof edges);
    uint64_t s = 12345;
    for (int64_t i = 0; i < nu; i++)
        x[ne + i] = (float)(-12.0 + 24.0 * (double)i / (double)(nu - 1));
    for (int64_t i = 0; i < nl; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = (double)(s >> 11) / 9007199254740992.0;
        x[ne + nu + i] = (float)((i & 1 ? -1.0 : 1.0) * pow(10.0, -30.0 + 60.0 * u));
    }
    *n = ne + nu + nl;
    return x;
}

/* op applied by the library to x (n elements of dtype dt, as floats), read back as floats. */
static void library(dt_mesh *m, int op, dt_dtype dt, const float *x, int64_t n, float *y)
{
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(m, 1, &l), DT_OK);
    size_t es = dt_dtype_size(dt);
    void *host = malloc((size_t)n * es);
    cr_assert(host);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DT_DTYPE_F32)
            ((float *)host)[i] = x[i];
        else
            ((uint16_t *)host)[i] =
                dt == DT_DTYPE_BF16 ? dt_f32_to_bf16(x[i]) : dt_f32_to_f16(x[i]);
    }
    dt_tensor *t = NULL, *r = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, dt, 1, &n, host, (size_t)n * es, &t), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_unary((dt_unary_op)op, t, NULL, &r), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(r, host, (size_t)n * es), DT_OK, "%s", dt_last_error());
    for (int64_t i = 0; i < n; i++) {
        if (dt == DT_DTYPE_F32)
            y[i] = ((float *)host)[i];
        else
            y[i] = dt == DT_DTYPE_BF16 ? dt_bf16_to_f32(((uint16_t *)host)[i])
                                       : dt_f16_to_f32(((uint16_t *)host)[i]);
    }
    dt_tensor_free(t);
    dt_tensor_free(r);
    free(host);
}

static dt_mesh *setup(void)
{
    dt_init_options o = {.cpu_devices = 1};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string("x=1", DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    return m;
}

Test(vmath, f32_within_two_ulps)
{
    dt_mesh *m = setup();
    int64_t n;
    float *x = inputs(&n), *y = malloc((size_t)n * sizeof *y);
    cr_assert(y);
    for (int q = 0; q < NOPS; q++) {
        library(m, ops[q], DT_DTYPE_F32, x, n, y);
        int64_t worst = 0, at = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t u = ulps(y[i], reference(ops[q], (double)x[i]));
            if (u > worst) {
                worst = u;
                at = i;
            }
        }
        cr_expect(worst <= 2, "%s(%a) = %a, the reference %a: %lld ulps (at most 2)",
                  dt_unary_op_name((dt_unary_op)ops[q]), (double)x[at], (double)y[at],
                  reference(ops[q], (double)x[at]), (long long)worst);
        /* the float definitions the CUDA kernels compile (common/unary.h), on this libm */
        if (dt__unary_in_float(ops[q])) {
            int64_t w = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t u = ulps(dt__unary_float(ops[q], x[i]), reference(ops[q], (double)x[i]));
                w = u > w ? u : w;
            }
            cr_expect(w <= 2, "dt__unary_float %s: %lld ulps",
                      dt_unary_op_name((dt_unary_op)ops[q]), (long long)w);
        }
    }
    free(x);
    free(y);
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK);
}

/* The 16-bit floats widen a block to f32, compute, and round back: within one unit of their
 * last place of the reference rounded to them (the f32 result's own error may move a value
 * across a rounding boundary). */
Test(vmath, bf16_and_f16_within_one_unit)
{
    dt_mesh *m = setup();
    int64_t n;
    float *x = inputs(&n), *y = malloc((size_t)n * sizeof *y);
    cr_assert(y);
    const dt_dtype types[2] = {DT_DTYPE_BF16, DT_DTYPE_F16};
    for (int d = 0; d < 2; d++)
        for (int q = 0; q < NOPS; q++) {
            dt_dtype dt = types[d];
            library(m, ops[q], dt, x, n, y);
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++) {
                /* the operand as the library saw it, rounded to dt */
                float xi = dt == DT_DTYPE_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(x[i]))
                                               : dt_f16_to_f32(dt_f32_to_f16(x[i]));
                double ref = reference(ops[q], (double)xi);
                uint16_t rb = dt == DT_DTYPE_BF16 ? dt_f64_to_bf16(ref) : dt_f64_to_f16(ref);
                uint16_t gb = dt == DT_DTYPE_BF16 ? dt_f32_to_bf16(y[i]) : dt_f32_to_f16(y[i]);
                bool rn = isnan(ref), gn = isnan(y[i]);
                int d16 = (int)(rb & 0x7fff) - (int)(gb & 0x7fff);
                bool same_sign = (rb & 0x8000) == (gb & 0x8000) || ((rb | gb) & 0x7fff) <= 1;
                if (rn != gn || (!rn && (!same_sign || d16 < -1 || d16 > 1)))
                    bad = i;
            }
            cr_expect(bad < 0, "%s %s(%a) = %a, the reference %a", dt_dtype_name(dt),
                      dt_unary_op_name((dt_unary_op)ops[q]), bad < 0 ? 0.0 : (double)x[bad],
                      bad < 0 ? 0.0 : (double)y[bad],
                      bad < 0 ? 0.0 : reference(ops[q], (double)x[bad]));
        }
    free(x);
    free(y);
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK);
}
