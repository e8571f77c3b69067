/* Differential test core shared by tests/unit/test_spmd_diff.c (one client, N local devices)
 * and tests/mpi/spmd_diff.c (several clients): every op under every layout of its operands
 * (each assignment of mesh axes to tensor axes, unsharded, and partial sums), even and
 * uneven shapes, every dtype (f32, f64, i32, i64, bf16, f16, bool, u8, i8), against naive host
 * loops in double rounded once to the result's dtype (tests/coll_ref.h ref_as) and, for random
 * numbers, the Random123 reference Philox. Exact for fill, random, elementwise, casts,
 * relayout, slicing and every integer result; within 1e-5 relative for floating reductions and
 * matmul. A dtype an op does not take gives a clear DT_ERR_DTYPE naming it (random integers,
 * means of integers, arithmetic on bool, gemm of bool).
 *
 * The includer defines DIFF_REPORT(ok, ...) which records one verdict (every client calls it
 * the same number of times, in the same order). The sections are in diff_ops_*.h, included
 * below; this file holds the helpers, the host references and the options they share. */
#ifndef DT_TEST_DIFF_CORE_H
#define DT_TEST_DIFF_CORE_H

#include "../coll_ref.h"
#include "dt.h"

#include <Random123/philox.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYOUTS 96

/* Relative tolerance of floating-point elementwise results against the host loops: 0 (exact)
 * on CPU devices, whose kernels are those loops; a backend whose libm differs in the last bit
 * (CUDA's) sets it before diff_all. Integer results are always exact. */
static double diff_float_tol = 0;

/* Every layout of a rank-`rank` tensor on m: each injective assignment of mesh axes to tensor
 * axes (or none), and with `partial`, the same with a partial sum over the first mesh axis
 * left free. */
static int all_layouts(const dt_mesh *m, int rank, bool partial, dt_layout out[])
{
    int n = 0, na = dt_mesh_num_axes(m);
    int choice[DT_MAX_RANK] = {0}; /* 0 = unsharded, a+1 = mesh axis a */
    for (;;) {
        unsigned used = 0;
        bool ok = true;
        for (int i = 0; i < rank && ok; i++)
            if (choice[i]) {
                ok = !(used & (1u << (choice[i] - 1)));
                used |= 1u << (choice[i] - 1);
            }
        if (ok && n < MAX_LAYOUTS) {
            dt_layout l = {.mesh = m, .rank = rank, .partial = 0, .partial_op = DT_REDUCE_SUM};
            for (int i = 0; i < DT_MAX_RANK; i++)
                l.axes[i] = i < rank ? choice[i] - 1 : DT_UNSHARDED;
            out[n++] = l;
            if (partial && n < MAX_LAYOUTS)
                for (int a = 0; a < na; a++)
                    if (!(used & (1u << a)) && m->sizes[a] > 1) {
                        l.partial = 1u << a;
                        out[n++] = l;
                        break;
                    }
        }
        int i = rank - 1;
        while (i >= 0 && ++choice[i] > na)
            choice[i--] = 0;
        if (i < 0)
            break;
    }
    return n;
}

/* Test values: small multiples of 1/2 so sums and products are exact in f32. */
static double value_at(int64_t i, int salt)
{
    return (double)((i * 7 + salt * 3) % 11 - 5) * 0.5;
}

static bool is_int(dt_dtype dt)
{
    return dt_dtype_is_integer(dt);
}

static bool is_bool(dt_dtype dt)
{
    return dt == DT_DTYPE_BOOL;
}

/* The 16-bit floats and the 8-bit integers run on a subset of the layout pairs (their loops
 * are the same code as the wider types'; this keeps the suite quick). */
static bool narrow(dt_dtype dt)
{
    return dt_dtype_size(dt) < 4;
}

/* Element access in any dtype: the collective tests' helpers (tests/coll_ref.h). */
#define put ref_store
#define get ref_load

/* Integers take twice the value: whole numbers in -10..10 (u8 wraps the negative ones); bool
 * a mix of true and false. */
static void fill_host(dt_dtype dt, void *buf, int64_t n, int salt)
{
    for (int64_t i = 0; i < n; i++)
        put(dt, buf, i,
            is_bool(dt)  ? (double)((i * 5 + salt) % 3 != 0)
            : is_int(dt) ? 2 * value_at(i, salt)
                         : value_at(i, salt));
}

/* A tensor holding the global `host` in layout l; for a partial layout, the terms over the
 * partial axis are: member 0 holds v - (g-1), the others 1 (exact sums). */
static dt_tensor *make_tensor(const dt_layout *l, dt_dtype dt, int rank, const int64_t shape[],
                              const void *host)
{
    dt_tensor *t = NULL;
    if (!l->partial) {
        size_t bytes = (size_t)dt__num_elements(rank, shape) * dt_dtype_size(dt);
        if (dt_tensor_from_host(l, dt, rank, shape, host, bytes, &t) != DT_OK)
            return NULL;
        return t;
    }
    const dt_mesh *m = l->mesh;
    int nl = dt_mesh_num_local_devices(m), pa = __builtin_ctz(l->partial);
    int g = m->sizes[pa];
    void *comps[64];
    int64_t shapes[64][DT_MAX_RANK];
    const int64_t *sp[64];
    size_t es = dt_dtype_size(dt);
    for (int i = 0; i < nl; i++) {
        int dev = dt_mesh_local_device_id(m, i);
        int64_t local[DT_MAX_RANK], off[DT_MAX_RANK], zero[DT_MAX_RANK] = {0};
        dt_layout_local_shape(l, shape, dev, local, off);
        int64_t n = dt__num_elements(rank, local);
        comps[i] = malloc((size_t)n * es + 8);
        dt__copy_block(comps[i], local, zero, host, shape, off, local, rank, es);
        int c = dev / m->strides[pa] % g;
        for (int64_t k = 0; k < n; k++) {
            double v = get(dt, comps[i], k);
            put(dt, comps[i], k, c == 0 ? v - (g - 1) : 1.0);
        }
        memcpy(shapes[i], local, sizeof local);
        sp[i] = shapes[i];
    }
    dt_status s = dt_tensor_pack(l, dt, rank, shape, nl, (const void *const *)comps, sp, &t);
    for (int i = 0; i < nl; i++)
        free(comps[i]);
    return s == DT_OK ? t : NULL;
}

/* Read t and compare with the reference (exact when tol == 0; relative otherwise). */
static bool matches(const dt_tensor *t, dt_dtype dt, const double *ref, int64_t n, double tol)
{
    if (!t)
        return false;
    size_t bytes = (size_t)n * dt_dtype_size(dt);
    void *buf = malloc(bytes + 8);
    bool ok = dt_tensor_read(t, buf, bytes) == DT_OK;
    for (int64_t i = 0; ok && i < n; i++) {
        /* the reference rounded (or wrapped) once to the dtype */
        double g = get(dt, buf, i), r = ref_as(dt, ref[i]);
        if (isnan(r) && isnan(g))
            continue;
        ok = g == r || (tol > 0 && fabs(g - r) <= tol * fmax(1.0, fabs(r))); /* inf == inf */
    }
    free(buf);
    return ok;
}

/* Read t: true when its bytes equal `keep`'s, which the first call (*have false) fills. */
static bool same_bits(const dt_tensor *t, dt_dtype dt, int64_t n, void *keep, bool *have)
{
    size_t bytes = (size_t)n * dt_dtype_size(dt);
    void *buf = malloc(bytes + 8);
    bool ok = t && dt_tensor_read(t, buf, bytes) == DT_OK;
    if (ok && !*have)
        memcpy(keep, buf, bytes);
    else if (ok)
        ok = memcmp(keep, buf, bytes) == 0;
    *have = *have || ok;
    free(buf);
    return ok;
}

static void layout_text(const dt_layout *l, char *buf, size_t size)
{
    if (dt_layout_to_string(l, buf, size) != DT_OK)
        snprintf(buf, size, "?");
}

/* ---- references ------------------------------------------------------------------------- */

static double ref_unary(int op, dt_dtype dt, double x)
{
    double r;
    switch ((dt_unary_op)op) {
    case DT_UNARY_NEG:
        r = -x;
        break;
    case DT_UNARY_ABS:
        r = fabs(x);
        break;
    case DT_UNARY_EXP:
        r = exp(x);
        break;
    case DT_UNARY_LOG:
        r = log(x);
        break;
    case DT_UNARY_SQRT:
        r = sqrt(x);
        break;
    case DT_UNARY_RELU:
        r = x > 0 ? x : 0;
        break;
    case DT_UNARY_TANH:
        r = tanh(x);
        break;
    case DT_UNARY_SIGMOID:
        r = 1.0 / (1.0 + exp(-x));
        break;
    case DT_UNARY_SQUARE:
        r = x * x;
        break;
    case DT_UNARY_SIN:
        r = sin(x);
        break;
    case DT_UNARY_COS:
        r = cos(x);
        break;
    case DT_UNARY_ERF:
        r = erf(x);
        break;
    case DT_UNARY_GELU: /* x Phi(x), Phi the normal distribution */
        r = x * 0.5 * erfc(-x / sqrt(2.0));
        break;
    case DT_UNARY_GELU_TANH:
        r = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * pow(x, 3))));
        break;
    case DT_UNARY_SILU:
        r = x / (1.0 + exp(-x));
        break;
    case DT_UNARY_RSQRT:
        r = 1.0 / sqrt(x);
        break;
    default: /* logical_not */
        r = x == 0;
        break;
    }
    return ref_as(dt, r);
}

/* The exact result in double (comparisons and logical ops 1 or 0), before rounding. */
static double ref_binary(int op, dt_dtype dt, double a, double b)
{
    if (is_int(dt) && op == DT_BINARY_DIV) /* truncating; x / 0 is 0 (the kernels' rule) */
        return b == 0 ? 0 : trunc(a / b);
    if (op == DT_BINARY_FLOORDIV || op == DT_BINARY_FLOORMOD) {
        /* a = q b + r with q an integer and r between 0 and b (numpy); the test's values are
         * exact halves, so a / b rounds correctly; an integer divisor of 0 gives 0 and 0 */
        if (b == 0)
            return is_int(dt) ? 0 : op == DT_BINARY_FLOORDIV ? a / b : NAN;
        double q = floor(a / b);
        return op == DT_BINARY_FLOORDIV ? q : a - q * b;
    }
    switch ((dt_binary_op)op) {
    case DT_BINARY_ADD:
        return a + b;
    case DT_BINARY_SUB:
        return a - b;
    case DT_BINARY_MUL:
        return a * b;
    case DT_BINARY_DIV:
        return a / b;
    case DT_BINARY_MAX:
        return a > b ? a : b;
    case DT_BINARY_MIN:
        return a < b ? a : b;
    case DT_BINARY_POW:
        return pow(a, b);
    case DT_BINARY_EQ:
        return a == b;
    case DT_BINARY_NE:
        return a != b;
    case DT_BINARY_LT:
        return a < b;
    case DT_BINARY_LE:
        return a <= b;
    case DT_BINARY_GT:
        return a > b;
    case DT_BINARY_GE:
        return a >= b;
    case DT_BINARY_LOGICAL_AND:
        return a != 0 && b != 0;
    case DT_BINARY_LOGICAL_OR:
        return a != 0 || b != 0;
    default:
        return (a != 0) != (b != 0);
    }
}

/* The binary ops a dtype takes (the others fail with DT_ERR_DTYPE, tested in diff_dtype_errors):
 * bool compares, maxes, mins and the logical ops; numbers the rest (integer pow overflows on
 * the test's values and is left out). */
static bool takes_binary(dt_dtype dt, int op)
{
    bool logical = op >= DT_BINARY_LOGICAL_AND;
    if (is_bool(dt))
        return logical || DT__BINARY_IS_COMPARISON(op) || op == DT_BINARY_MAX ||
               op == DT_BINARY_MIN;
    return !logical && !(is_int(dt) && op == DT_BINARY_POW);
}

/* The dtype of a binary op's result. */
static dt_dtype binary_result(dt_dtype dt, int op)
{
    return DT__BINARY_IS_COMPARISON(op) ? DT_DTYPE_BOOL : dt;
}

/* Random123 reference of element e (same stream definition as the library's, written from
 * the Random123 API: counter (block, key), key = seed). */
static double ref_random(bool normal, bool f64, uint64_t seed, uint64_t key, uint64_t e)
{
    philox4x32_key_t k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    uint64_t block = !normal ? (f64 ? e / 2 : e / 4) : (f64 ? e : e / 2);
    philox4x32_ctr_t c = {
        {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)key, (uint32_t)(key >> 32)}};
    philox4x32_ctr_t r = philox4x32(c, k);
    uint32_t *w = r.v;
    double u, a, b;
    if (!normal) {
        if (!f64)
            u = (double)(w[e % 4] >> 8) / 16777216.0;
        else
            u = (double)(((uint64_t)w[2 * (e % 2)] << 21) ^ (w[2 * (e % 2) + 1] >> 11)) /
                9007199254740992.0;
        return u;
    }
    if (!f64) {
        a = (double)(w[2 * (e % 2)] >> 8) / 16777216.0;
        b = (double)(w[2 * (e % 2) + 1] >> 8) / 16777216.0;
    } else {
        a = (double)(((uint64_t)w[0] << 21) ^ (w[1] >> 11)) / 9007199254740992.0;
        b = (double)(((uint64_t)w[2] << 21) ^ (w[3] >> 11)) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(1.0 - a)) * cos(2.0 * M_PI * b);
}

/* ---- the suite --------------------------------------------------------------------------- */

typedef struct diff_opts {
    bool thorough; /* every pair of operand layouts; otherwise a deterministic subset */
} diff_opts;

/* Pairs (i, j) to run: all, or the diagonal plus a stride. */
static bool pick(const diff_opts *o, int i, int j, int n)
{
    return o->thorough || i == j || (i * 7 + j * 3) % (n > 8 ? 5 : 2) == 0;
}

#define NUM_DTYPES DT_DTYPE_COUNT
static const dt_dtype dtypes[NUM_DTYPES] = {DT_DTYPE_F32,  DT_DTYPE_F64,  DT_DTYPE_I32,
                                            DT_DTYPE_I64,  DT_DTYPE_BF16, DT_DTYPE_F16,
                                            DT_DTYPE_BOOL, DT_DTYPE_U8,   DT_DTYPE_I8};

/* Pairs to run for dtype dt: pick's, and a sparser subset for the narrow dtypes (the
 * diagonal alone when not thorough: every op then runs on every layout once). */
static bool pick_dt(const diff_opts *o, dt_dtype dt, int i, int j, int n)
{
    if (narrow(dt))
        return i == j || (o->thorough && (i * 7 + j * 3) % (n > 8 ? 7 : 3) == 0);
    return pick(o, i, j, n);
}

/* Every layout of a rank-`rank` tensor of dt (partial sums: not of bool). */
static int layouts_for(const dt_mesh *m, int rank, dt_dtype dt, dt_layout out[])
{
    return all_layouts(m, rank, !is_bool(dt), out);
}

static double ew_tol(dt_dtype dt)
{
    return dt_dtype_is_floating(dt) ? diff_float_tol : 0;
}

/* Tolerance of results summed from partial terms (reductions, matmul): each device's partial
 * term is rounded to the dtype before the terms are added, so the 16-bit floats carry a few
 * roundings of 2^-9 (bf16) or 2^-12 (f16) relative; f32 and f64 within 1e-5. */
static double sum_tol(dt_dtype dt)
{
    return dt == DT_DTYPE_BF16 ? 2e-2 : dt == DT_DTYPE_F16 ? 4e-3 : 1e-5;
}

/* The unary functions written here from another formula than the kernels' (gelu_tanh through
 * pow and tanh, silu through exp), so equal within a few ulps of a double; and for f32, bf16
 * and f16 the float functions are computed in float (common/unary.h: within 2 ulps), so
 * within 2 ulps of the reference rounded once (the 16-bit floats within one unit of their
 * last place). */
static double unary_tol(dt_dtype dt, int op)
{
    bool other_formula = op == DT_UNARY_GELU || op == DT_UNARY_GELU_TANH || op == DT_UNARY_SILU;
    bool function = op != DT_UNARY_NEG && op != DT_UNARY_ABS && op != DT_UNARY_RELU &&
                    op != DT_UNARY_SQUARE && op != DT_UNARY_LOGICAL_NOT;
    double own = dt == DT_DTYPE_F32    ? 0x1p-22
                 : dt == DT_DTYPE_BF16 ? 0x1p-7
                 : dt == DT_DTYPE_F16  ? 0x1p-10
                                       : 0;
    return fmax(fmax(ew_tol(dt), other_formula && dt == DT_DTYPE_F64 ? 1e-14 : 0),
                function ? own : 0);
}

/* The unary ops a dtype takes: bool logical_not alone; integers the exact ones (the others are
 * floating point functions); floats every one but logical_not. */
static bool takes_unary(dt_dtype dt, int op)
{
    if (is_bool(dt))
        return op == DT_UNARY_LOGICAL_NOT;
    if (op == DT_UNARY_LOGICAL_NOT)
        return false;
    return !is_int(dt) || op == DT_UNARY_NEG || op == DT_UNARY_ABS || op == DT_UNARY_RELU ||
           op == DT_UNARY_SQUARE;
}

#include "diff_ops_basic.h"
#include "diff_ops_elementwise.h"
#include "diff_ops_index.h"
#include "diff_ops_rowwise.h"

static void diff_all(const dt_mesh *m, const diff_opts *o)
{
    diff_creation(m, o);
    diff_relayout(m, o);
    diff_matmul(m, o);
    diff_matmul_chunked(m, o);
    diff_batch_matmul(m, o);
    diff_elementwise(m, o);
    diff_promotion(m, o);
    diff_cast(m, o);
    diff_where(m, o);
    diff_reduce(m, o);
    diff_shape_ops(m, o);
    diff_dtype_errors(m, o);
    diff_copy_to_mesh(m, o);
    /* row-wise ops */
    diff_softmax(m, o);
    diff_norm(m, o);
    diff_argmax(m, o);
    diff_cumsum(m, o);
    diff_rowwise_errors(m, o);
    /* shape and index ops */
    diff_gather(m, o);
    diff_segment_sum(m, o);
    diff_one_hot(m, o);
    diff_einsum(m, o);
    diff_shape_more(m, o);
}

#endif /* DT_TEST_DIFF_CORE_H */
