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
 * the same number of times, in the same order). */
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

static void diff_creation(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{6, 12}, {5, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            bool fl = dt_dtype_is_floating(dt), wide = dt == DT_DTYPE_F64;
            int n = layouts_for(m, 2, dt, ls);
            int64_t ne = shapes[s][0] * shapes[s][1];
            double *ref = malloc(sizeof(double) * (size_t)ne);
            bool ok_fill = true, ok_u = true, ok_n = true, ok_ar = true, have_normal = false;
            void *normal_bits = malloc((size_t)ne * 8);
            /* a negative fill where the dtype holds it (u8 does not: dt_fill refuses it) */
            double value = is_bool(dt) ? 1.0 : dt == DT_DTYPE_U8 ? 3.0 : is_int(dt) ? -3.0 : 2.5;
            double step = is_int(dt) ? -2.0 : -0.5;
            for (int li = 0; li < n; li++) {
                dt_op_options op = {.layout = &ls[li]};
                dt_tensor *t = NULL;
                for (int64_t i = 0; i < ne; i++)
                    ref[i] = value;
                ok_fill = ok_fill && dt_fill(dt, 2, shapes[s], value, &op, &t) == DT_OK &&
                          matches(t, dt, ref, ne, 0);
                dt_tensor_free(t);
                t = NULL;
                if (ls[li].axes[1] == DT_UNSHARDED) {
                    dt_layout l1 = ls[li];
                    l1.rank = 1;
                    dt_op_options o1 = {.layout = &l1};
                    for (int64_t i = 0; i < shapes[s][0]; i++)
                        ref[i] = 3.0 + step * (double)i;
                    dt_status st = dt_arange(dt, shapes[s][0], 3.0, step, &o1, &t);
                    ok_ar = ok_ar &&
                            (is_bool(dt) ? st == DT_ERR_DTYPE && !t
                                         : st == DT_OK && matches(t, dt, ref, shapes[s][0], 0));
                    dt_tensor_free(t);
                    t = NULL;
                }
                if (!fl) { /* random numbers are floating point only, said clearly */
                    dt_status su = dt_random_uniform(dt, 2, shapes[s], 42, 7, -1.0, 2.0, &op, &t);
                    ok_u = ok_u && su == DT_ERR_DTYPE && !t &&
                           strstr(dt_last_error(), dt_dtype_name(dt)) &&
                           strstr(dt_last_error(), "f32, f64, bf16 or f16");
                    dt_status sn = dt_random_normal(dt, 2, shapes[s], 43, 9, 0.5, 2.0, &op, &t);
                    ok_n = ok_n && sn == DT_ERR_DTYPE && !t &&
                           strstr(dt_last_error(), dt_dtype_name(dt));
                    continue;
                }
                if (ls[li].partial)
                    continue; /* random terms are not partial sums of anything */
                /* f32, bf16, f16: the f32 stream (the 16-bit ones rounded from it) */
                for (int64_t i = 0; i < ne; i++) {
                    double v = -1.0 + 3.0 * ref_random(false, wide, 42, 7, (uint64_t)i);
                    ref[i] = wide ? v : (double)(float)v;
                }
                ok_u = ok_u &&
                       dt_random_uniform(dt, 2, shapes[s], 42, 7, -1.0, 2.0, &op, &t) == DT_OK &&
                       matches(t, dt, ref, ne, 0);
                dt_tensor_free(t);
                t = NULL;
                /* Box-Muller's log and cos are the library's own (the same bits on CPU and
                 * GPU), so against libm's within a few ulps, and bitwise the same tensor in
                 * every layout */
                for (int64_t i = 0; i < ne; i++) {
                    double v = 0.5 + 2.0 * ref_random(true, wide, 43, 9, (uint64_t)i);
                    ref[i] = wide ? v : (double)(float)v;
                }
                ok_n = ok_n &&
                       dt_random_normal(dt, 2, shapes[s], 43, 9, 0.5, 2.0, &op, &t) == DT_OK &&
                       matches(t, dt, ref, ne, wide ? 1e-14 : 0) &&
                       same_bits(t, dt, ne, normal_bits, &have_normal);
                dt_tensor_free(t);
            }
            DIFF_REPORT(ok_fill, "fill %s %s: %d layouts", dt_dtype_name(dt), s ? "uneven" : "even",
                        n);
            DIFF_REPORT(ok_u, "random_uniform %s %s: %s", dt_dtype_name(dt), s ? "uneven" : "even",
                        !fl ? "DT_ERR_DTYPE naming the dtype"
                            : "bitwise the Random123 stream in every layout");
            DIFF_REPORT(ok_n, "random_normal %s %s: %s", dt_dtype_name(dt), s ? "uneven" : "even",
                        !fl ? "DT_ERR_DTYPE naming the dtype"
                            : "the Random123 stream with libm's Box-Muller within 1e-14, "
                              "bitwise the same in every layout");
            DIFF_REPORT(ok_ar, "arange %s %s%s", dt_dtype_name(dt), s ? "uneven" : "even",
                        is_bool(dt) ? ": DT_ERR_DTYPE" : "");
            free(ref);
            free(normal_bits);
        }
}

/* Move a tensor from each layout of `from` to layouts of `to` (pairs by pick_dt) with
 * dt_relayout, or dt_copy_to_mesh when `copy`; every result must lie as asked and hold the
 * same global values. */
static bool move_pairs(const dt_layout from[], int nf, const dt_layout to[], int nt, bool copy,
                       dt_dtype dt, const int64_t shape[2], const diff_opts *o, char *bad,
                       size_t bl)
{
    int64_t ne = shape[0] * shape[1];
    double *ref = malloc(sizeof(double) * (size_t)ne);
    void *host = malloc((size_t)ne * 8);
    fill_host(dt, host, ne, copy ? 12 : 1);
    for (int64_t i = 0; i < ne; i++)
        ref[i] = get(dt, host, i);
    int most = nf > nt ? nf : nt;
    bool ok = true;
    for (int i = 0; i < nf; i++) {
        if (is_bool(dt) && from[i].partial)
            continue;
        dt_tensor *x = make_tensor(&from[i], dt, 2, shape, host);
        for (int j = 0; j < nt; j++) {
            if (!pick_dt(o, dt, i, j, most) || (is_int(dt) && !pick(&(diff_opts){0}, i, j, most)) ||
                (is_bool(dt) && to[j].partial))
                continue;
            dt_tensor *y = NULL;
            dt_status st = !x     ? DT_ERR_ARG
                           : copy ? dt_copy_to_mesh(x, &to[j], NULL, &y)
                                  : dt_relayout(x, &to[j], NULL, &y);
            bool one = st == DT_OK && dt_layout_equal(dt_tensor_layout(y), &to[j]) &&
                       matches(y, dt, ref, ne, 0);
            if (!one && ok) {
                char a[64], b[64];
                layout_text(&from[i], a, sizeof a);
                layout_text(&to[j], b, sizeof b);
                snprintf(bad, bl, " (first failure \"%s\" -> \"%s\": %s)", a, b, dt_last_error());
            }
            ok = ok && one;
            dt_tensor_free(y);
        }
        dt_tensor_free(x);
    }
    free(ref);
    free(host);
    return ok;
}

static void diff_relayout(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 12}, {5, 7}};
    int n = all_layouts(m, 2, true, ls);
    /* even and uneven by turns */
    for (int q = 0; q < NUM_DTYPES; q++) {
        int s = q % 2;
        dt_dtype dt = dtypes[q];
        char bad[256] = "";
        bool ok = move_pairs(ls, n, ls, n, false, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "relayout %s %s: %s of %d layouts%s", dt_dtype_name(dt),
                    s ? "uneven" : "even",
                    o->thorough && !is_int(dt) && !narrow(dt) ? "every pair" : "pairs", n, bad);
    }
}

static void ref_matmul(const double *a, const double *b, double *c, int64_t M, int64_t K, int64_t N,
                       bool ta, bool tb)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t q = 0; q < K; q++)
                s += (ta ? a[q * M + i] : a[i * K + q]) * (tb ? b[j * K + q] : b[q * N + j]);
            c[i * N + j] = s;
        }
}

/* Host operands of op(A)[M, K] @ op(B)[K, N] in dtype dt (filled from seeds sa and sb) and
 * their product computed in double from the values as stored. */
typedef struct mm_host {
    void *a, *b;
    double *c;
} mm_host;

static mm_host mm_host_make(dt_dtype dt, int64_t M, int64_t K, int64_t N, bool ta, bool tb, int sa,
                            int sb)
{
    mm_host h = {malloc((size_t)(M * K) * 8 + 8), malloc((size_t)(K * N) * 8 + 8),
                 malloc(sizeof(double) * (size_t)(M * N) + 8)};
    double *ra = malloc(sizeof(double) * (size_t)(M * K) + 8),
           *rb = malloc(sizeof(double) * (size_t)(K * N) + 8);
    fill_host(dt, h.a, M * K, sa);
    fill_host(dt, h.b, K * N, sb);
    for (int64_t i = 0; i < M * K; i++)
        ra[i] = get(dt, h.a, i);
    for (int64_t i = 0; i < K * N; i++)
        rb[i] = get(dt, h.b, i);
    ref_matmul(ra, rb, h.c, M, K, N, ta, tb);
    free(ra);
    free(rb);
    return h;
}

static void mm_host_free(mm_host *h)
{
    free(h->a);
    free(h->b);
    free(h->c);
}

static void diff_matmul(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    /* {M, K, N}: even and uneven */
    const int64_t dims[2][3] = {{4, 12, 6}, {5, 7, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            if (is_bool(dt))
                continue; /* refused: diff_dtype_errors */
            if ((is_int(dt) || narrow(dt)) && d % 2 != s)
                continue; /* integer and 16-bit gemm: one of even and uneven each */
            int64_t M = dims[s][0], K = dims[s][1], N = dims[s][2];
            for (int tr = 0; tr < 2; tr++) {
                bool ta = tr == 1, tb = tr == 1;
                int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {tb ? N : K, tb ? K : N};
                mm_host h = mm_host_make(dt, M, K, N, ta, tb, 2, 3);
                void *ha = h.a, *hb = h.b;
                const double *rc = h.c;
                int n = all_layouts(m, 2, true, ls);
                bool ok = true;
                char bad[256] = "";
                dt_op_options op = {.transpose_a = ta, .transpose_b = tb};
                for (int i = 0; i < n; i++) {
                    dt_tensor *a = make_tensor(&ls[i], dt, 2, sa, ha);
                    for (int j = 0; j < n; j++) {
                        if (!pick_dt(o, dt, i, j, n) || (tr && (i + j) % 3))
                            continue;
                        dt_tensor *b = make_tensor(&ls[j], dt, 2, sb, hb), *c = NULL;
                        bool one = a && b && dt_matmul(a, b, &op, &c) == DT_OK &&
                                   matches(c, dt, rc, M * N, sum_tol(dt));
                        if (!one && ok) {
                            char x[64], y[64];
                            layout_text(&ls[i], x, sizeof x);
                            layout_text(&ls[j], y, sizeof y);
                            snprintf(bad, sizeof bad, " (first failure a \"%s\" b \"%s\": %s)", x,
                                     y, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(b);
                        dt_tensor_free(c);
                    }
                    dt_tensor_free(a);
                }
                /* every requested output layout, from a fixed pair of operands */
                dt_tensor *a = make_tensor(&ls[n > 1 ? 1 : 0], dt, 2, sa, ha);
                dt_tensor *b = make_tensor(&ls[n - 1], dt, 2, sb, hb);
                for (int k = 0; k < n; k++) {
                    dt_op_options oo = op;
                    oo.layout = &ls[k];
                    dt_tensor *c = NULL;
                    bool one = a && b && dt_matmul(a, b, &oo, &c) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(c), &ls[k]) &&
                               matches(c, dt, rc, M * N, sum_tol(dt));
                    if (!one && ok) {
                        char x[64];
                        layout_text(&ls[k], x, sizeof x);
                        snprintf(bad, sizeof bad, " (first failure: requested \"%s\": %s)", x,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(c);
                }
                dt_tensor_free(a);
                dt_tensor_free(b);
                DIFF_REPORT(ok, "matmul %s %s%s: layouts of a, b and the result%s",
                            dt_dtype_name(dt), s ? "uneven" : "even", ta ? " transposed" : "", bad);
                mm_host_free(&h);
            }
        }
}

/* Contracting axis and the result's rows on one mesh axis: the expansion reduce-scatters the
 * partial product into rows in chunks (spmd/ops/matmul.c), each a gemm of a block of op(A)'s
 * rows into a temporary and a reduce-scatter into rows of the output. For each mesh axis of
 * more than one device (columns on the next axis, when there is one): even rows, uneven ones
 * (M mod P of 1 and P - 1), fewer rows than devices (empty blocks), A transposed, and the
 * gemm kernels of every kind (BLAS f32 and f64, widened bf16, integer loops); K is large
 * enough that the reduce-scatter is the plan taken. Against a host GEMM in double. */
static void diff_matmul_chunked(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    int na = dt_mesh_num_axes(m);
    const dt_dtype dts[4] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_I32};
    for (int ax = 0; ax < na; ax++) {
        int P = m->sizes[ax], nx = na > 1 ? (ax + 1) % na : -1;
        if (P < 2)
            continue;
        /* {M, K, N, transposed a} */
        const int64_t dims[5][4] = {{8 * P, 1536, 256, 0},
                                    {8 * P + 1, 1536, 200, 1},
                                    {8 * P + P - 1, 1500, 250, 0},
                                    {P - 1, 3000, 64, 0},
                                    {3 * P + 1, 2048, 128, 1}};
        bool ok = true;
        char bad[512] = "";
        for (int q = 0; q < 5; q++) {
            int64_t M = dims[q][0], K = dims[q][1], N = dims[q][2];
            bool ta = dims[q][3] != 0;
            dt_dtype dt = dts[q % 4];
            if (q == 4)
                dt = DT_DTYPE_F32;
            /* a: [M, K] (stored [K, M] when transposed), k on ax; b: [K, N], k on ax and n on
             * the next axis; c: rows on ax */
            dt_layout la = {.mesh = m, .rank = 2, .partial_op = DT_REDUCE_SUM}, lb = la, lc = la;
            for (int i = 0; i < DT_MAX_RANK; i++)
                la.axes[i] = lb.axes[i] = lc.axes[i] = DT_UNSHARDED;
            la.axes[ta ? 0 : 1] = ax;
            lb.axes[0] = ax;
            lc.axes[0] = ax;
            if (nx >= 0)
                lb.axes[1] = lc.axes[1] = nx;
            int64_t sa[2] = {ta ? K : M, ta ? M : K}, sb[2] = {K, N};
            mm_host h = mm_host_make(dt, M, K, N, ta, false, 6, 7);
            dt_tensor *a = make_tensor(&la, dt, 2, sa, h.a), *b = make_tensor(&lb, dt, 2, sb, h.b);
            dt_tensor *c = NULL;
            char *text = NULL;
            size_t len = 0;
            FILE *mem = open_memstream(&text, &len);
            dt_op_options op = {.transpose_a = ta, .layout = &lc, .program = mem};
            bool one = a && b && mem && dt_matmul(a, b, &op, &c) == DT_OK;
            if (mem)
                fclose(mem);
            /* the chunks are in the program (one row cannot be chunked) */
            bool chunked = M < 2 || (text && strstr(text, "chunk 1 of"));
            one = one && dt_layout_equal(dt_tensor_layout(c), &lc) &&
                  matches(c, dt, h.c, M * N, sum_tol(dt));
            if ((!one || !chunked) && ok)
                snprintf(bad, sizeof bad,
                         " (first failure: axis %d, %s [%lld,%lld]%s @ [%lld,%lld]%s: %s)", ax,
                         dt_dtype_name(dt), (long long)M, (long long)K, ta ? "^T" : "",
                         (long long)K, (long long)N, one ? ", not chunked" : "",
                         one && text ? text : dt_last_error());
            ok = ok && one && chunked;
            free(text);
            dt_tensor_free(a);
            dt_tensor_free(b);
            dt_tensor_free(c);
            mm_host_free(&h);
        }
        DIFF_REPORT(ok,
                    "matmul reduce-scattered into rows on mesh axis %d (chunked): even, "
                    "uneven, empty blocks, transposed a%s",
                    ax, bad);
    }
}

static void diff_batch_matmul(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l3[MAX_LAYOUTS], l2[MAX_LAYOUTS];
    const int64_t B = 3, M = 5, K = 4, N = 3;
    dt_dtype dt = DT_DTYPE_F64;
    int64_t sa[3] = {B, M, K}, sb[3] = {B, K, N}, sb2[2] = {K, N};
    double ha[60], hb[36], hc[45];
    fill_host(dt, ha, B * M * K, 4);
    fill_host(dt, hb, B * K * N, 5);
    int n3 = all_layouts(m, 3, false, l3), n2 = all_layouts(m, 2, false, l2);
    bool ok = true;
    for (int shared = 0; shared < 2; shared++) {
        for (int b = 0; b < B; b++)
            ref_matmul(ha + b * M * K, hb + (shared ? 0 : b * K * N), hc + b * M * N, M, K, N,
                       false, false);
        for (int i = 0; i < n3; i++) {
            dt_tensor *a = make_tensor(&l3[i], dt, 3, sa, ha);
            int nb = shared ? n2 : n3;
            for (int j = 0; j < nb; j += 3) {
                dt_tensor *bt = shared ? make_tensor(&l2[j], dt, 2, sb2, hb)
                                       : make_tensor(&l3[j], dt, 3, sb, hb);
                dt_tensor *c = NULL;
                ok = ok && a && bt && dt_matmul(a, bt, NULL, &c) == DT_OK &&
                     matches(c, dt, hc, B * M * N, 1e-5);
                dt_tensor_free(bt);
                dt_tensor_free(c);
            }
            dt_tensor_free(a);
        }
    }
    DIFF_REPORT(ok, "batch matmul f64 (batched and shared b), uneven: %d layouts of a", n3);
}

static void diff_elementwise(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 6}, {5, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1];
            void *ha = malloc((size_t)ne * 8), *hb = malloc((size_t)ne * 8);
            fill_host(dt, ha, ne, 6);
            fill_host(dt, hb, ne, 8);
            double *ref = malloc(sizeof(double) * (size_t)ne);
            int n = layouts_for(m, 2, dt, ls), n1 = layouts_for(m, 1, dt, l1), nu = 0;
            /* unary: every op the dtype takes, every layout */
            bool ok_u = true;
            for (int i = 0; i < n; i++) {
                if (narrow(dt) && i % 2)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, ha);
                for (int op = 0; op < DT_UNARY_COUNT; op++) {
                    if (!takes_unary(dt, op))
                        continue;
                    nu += i == 0;
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_unary(op, dt, get(dt, ha, k));
                    dt_tensor *y = NULL;
                    ok_u = ok_u && x && dt_unary((dt_unary_op)op, x, NULL, &y) == DT_OK &&
                           matches(y, dt, ref, ne, unary_tol(dt, op));
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok_u, "unary (%d ops) %s %s: %d layouts", nu, dt_dtype_name(dt),
                        s ? "uneven" : "even", n);
            /* binary: every op the dtype takes on pairs of layouts (a subset for the ops past
             * max) */
            bool ok_b = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                dt_tensor *a = make_tensor(&ls[i], dt, 2, sh, ha);
                for (int j = 0; j < n; j++) {
                    if (!pick_dt(o, dt, i, j, n))
                        continue;
                    dt_tensor *b = make_tensor(&ls[j], dt, 2, sh, hb);
                    for (int op = 0; op < DT_BINARY_COUNT; op++) {
                        if ((op > DT_BINARY_MAX && (i + j + op) % 4) || !takes_binary(dt, op))
                            continue;
                        for (int64_t k = 0; k < ne; k++)
                            ref[k] = ref_binary(op, dt, get(dt, ha, k), get(dt, hb, k));
                        dt_tensor *c = NULL;
                        bool one = a && b && dt_binary((dt_binary_op)op, a, b, NULL, &c) == DT_OK &&
                                   matches(c, binary_result(dt, op), ref, ne, ew_tol(dt));
                        if (!one && ok_b) {
                            char x[64], y[64];
                            layout_text(&ls[i], x, sizeof x);
                            layout_text(&ls[j], y, sizeof y);
                            snprintf(bad, sizeof bad, " (first failure %s \"%s\" \"%s\": %s)",
                                     dt_binary_op_name((dt_binary_op)op), x, y, dt_last_error());
                        }
                        ok_b = ok_b && one;
                        dt_tensor_free(c);
                    }
                    dt_tensor_free(b);
                }
                /* broadcasting: a (M, N) with b of shape (N) */
                int bop = is_bool(dt) ? DT_BINARY_LOGICAL_XOR : DT_BINARY_SUB;
                for (int j = 0; j < n1; j++) {
                    int64_t sb1[1] = {sh[1]};
                    dt_tensor *b = make_tensor(&l1[j], dt, 1, sb1, hb), *c = NULL;
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_binary(bop, dt, get(dt, ha, k), get(dt, hb, k % sh[1]));
                    bool one = a && b && dt_binary((dt_binary_op)bop, a, b, NULL, &c) == DT_OK &&
                               matches(c, dt, ref, ne, ew_tol(dt));
                    if (!one && ok_b)
                        snprintf(bad, sizeof bad, " (broadcast failure: %s)", dt_last_error());
                    ok_b = ok_b && one;
                    dt_tensor_free(b);
                    dt_tensor_free(c);
                }
                dt_tensor_free(a);
            }
            DIFF_REPORT(ok_b, "binary %s %s: pairs of %d layouts, broadcasting%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", n, bad);
            free(ha);
            free(hb);
            free(ref);
        }
}

/* Operands of two dtypes: both converted to dt_dtype_promote's, as PyTorch promotes; a
 * comparison of the two gives bool. */
static void diff_promotion(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    const dt_dtype pairs[][2] = {{DT_DTYPE_F32, DT_DTYPE_F64},  {DT_DTYPE_I32, DT_DTYPE_F32},
                                 {DT_DTYPE_BF16, DT_DTYPE_F16}, {DT_DTYPE_U8, DT_DTYPE_I8},
                                 {DT_DTYPE_BOOL, DT_DTYPE_I64}, {DT_DTYPE_I64, DT_DTYPE_BF16}};
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 3}, sb1[1] = {3};
    int n = all_layouts(m, 2, false, ls), n1 = all_layouts(m, 1, false, l1);
    double ha[15], hb[15], ref[15];
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        dt_dtype ta = pairs[p][0], tb = pairs[p][1], t = dt_dtype_promote(ta, tb);
        fill_host(ta, ha, 15, 3);
        fill_host(tb, hb, 15, 4);
        bool ok = true;
        char bad[256] = "";
        for (int i = 0; i < n; i++) {
            dt_tensor *a = make_tensor(&ls[i], ta, 2, sh, ha);
            for (int j = 0; j < n1; j++) {
                dt_tensor *b = make_tensor(&l1[j], tb, 1, sb1, hb), *c = NULL, *e = NULL;
                for (int64_t k = 0; k < 15; k++)
                    ref[k] = ref_binary(DT_BINARY_MUL, t, get(ta, ha, k), get(tb, hb, k % 3));
                bool one = a && b && dt_binary(DT_BINARY_MUL, a, b, NULL, &c) == DT_OK &&
                           dt_tensor_dtype(c) == t && matches(c, t, ref, 15, 0);
                for (int64_t k = 0; k < 15; k++)
                    ref[k] = get(ta, ha, k) < get(tb, hb, k % 3);
                one = one && dt_binary(DT_BINARY_LT, a, b, NULL, &e) == DT_OK &&
                      dt_tensor_dtype(e) == DT_DTYPE_BOOL && matches(e, DT_DTYPE_BOOL, ref, 15, 0);
                if (!one && ok)
                    snprintf(bad, sizeof bad, " (first failure at layouts %d, %d: %s)", i, j,
                             dt_last_error());
                ok = ok && one;
                dt_tensor_free(b);
                dt_tensor_free(c);
                dt_tensor_free(e);
            }
            dt_tensor_free(a);
        }
        DIFF_REPORT(ok, "promotion %s * %s -> %s (and <): %d x %d layouts%s", dt_dtype_name(ta),
                    dt_dtype_name(tb), dt_dtype_name(t), n, n1, bad);
    }
}

/* The conversion of one value as the tests define it, independently of the library's
 * kernels: to bool x != 0; from floats to integers toward zero (the values are small); else
 * the value rounded or wrapped once by ref_as. */
static double ref_cast(dt_dtype from, dt_dtype to, double v)
{
    if (to == DT_DTYPE_BOOL)
        return v != 0;
    if (dt_dtype_is_floating(from) && !dt_dtype_is_floating(to))
        return trunc(v);
    return v;
}

/* cast: every pair of dtypes on every layout (a subset of layouts for the narrow pairs);
 * even and uneven; the result keeps the layout, or takes a requested one. */
static void diff_cast(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 6}, {5, 3}};
    for (int s = 0; s < 2; s++)
        for (int f = 0; f < NUM_DTYPES; f++) {
            dt_dtype from = dtypes[f];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1];
            double hx[30], ref[30];
            /* thirds as well as halves: float to integer conversions truncate */
            for (int64_t k = 0; k < ne; k++)
                put(from, hx, k,
                    is_bool(from)  ? (double)(k % 3 != 0)
                    : is_int(from) ? 2 * value_at(k, 5)
                                   : value_at(k, 5) * 1.25);
            int n = layouts_for(m, 2, from, ls);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                if ((narrow(from) || s || !o->thorough) && i % 3)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], from, 2, sh, hx);
                for (int t = 0; t < NUM_DTYPES; t++) {
                    dt_dtype to = dtypes[t];
                    for (int64_t k = 0; k < ne; k++)
                        ref[k] = ref_cast(from, to, get(from, hx, k));
                    dt_op_options req = {.layout = &ls[(i + t) % n]};
                    if (req.layout->partial)
                        req.layout = &ls[0];
                    dt_tensor *y = NULL, *z = NULL;
                    bool one = x && dt_cast(x, to, NULL, &y) == DT_OK && dt_tensor_dtype(y) == to &&
                               matches(y, to, ref, ne, 0) && dt_cast(x, to, &req, &z) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(z), req.layout) &&
                               matches(z, to, ref, ne, 0);
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure to %s from \"%s\": %s)",
                                 dt_dtype_name(to), lx, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                    dt_tensor_free(z);
                }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "cast %s to every dtype %s: %d layouts%s", dt_dtype_name(from),
                        s ? "uneven" : "even", n, bad);
        }
}

/* where(cond, x, y): cond of every layout, x and y of layouts by pairs, with cond and y
 * broadcast, every dtype for x and y. */
static void diff_where(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], lb[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 6}, sh1[1] = {6};
    double hc[30], hx[30], hy[30], ref[30];
    fill_host(DT_DTYPE_BOOL, hc, 30, 7);
    int nb = all_layouts(m, 2, false, lb), n1 = all_layouts(m, 1, false, l1);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        fill_host(dt, hx, 30, 1);
        fill_host(dt, hy, 30, 2);
        int n = layouts_for(m, 2, dt, ls);
        bool ok = true;
        char bad[256] = "";
        for (int i = 0; i < nb; i++) {
            if (!o->thorough && i % 2)
                continue;
            dt_tensor *c = make_tensor(&lb[i], DT_DTYPE_BOOL, 2, sh, hc);
            for (int j = 0; j < n; j++) {
                if (!pick_dt(o, dt, i, j, n > nb ? n : nb))
                    continue;
                dt_tensor *x = make_tensor(&ls[j], dt, 2, sh, hx);
                dt_tensor *y1 = make_tensor(&l1[(i + j) % n1], dt, 1, sh1, hy), *r = NULL;
                for (int64_t k = 0; k < 30; k++)
                    ref[k] = get(DT_DTYPE_BOOL, hc, k) ? get(dt, hx, k) : get(dt, hy, k % 6);
                bool one = c && x && y1 && dt_where(c, x, y1, NULL, &r) == DT_OK &&
                           matches(r, dt, ref, 30, 0);
                if (!one && ok) {
                    char lc[64], lx[64];
                    layout_text(&lb[i], lc, sizeof lc);
                    layout_text(&ls[j], lx, sizeof lx);
                    snprintf(bad, sizeof bad, " (first failure cond \"%s\" x \"%s\": %s)", lc, lx,
                             dt_last_error());
                }
                ok = ok && one;
                dt_tensor_free(x);
                dt_tensor_free(y1);
                dt_tensor_free(r);
            }
            dt_tensor_free(c);
        }
        DIFF_REPORT(ok, "where %s: cond %d layouts, x %d layouts, y broadcast%s", dt_dtype_name(dt),
                    nb, n, bad);
    }
}

static void diff_reduce(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 3}};
    const int ops[5] = {DT_REDUCE_SUM, DT_REDUCE_MEAN, DT_REDUCE_MAX, DT_REDUCE_MIN,
                        DT_REDUCE_PROD};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            void *hx = malloc((size_t)ne * 8);
            fill_host(dt, hx, ne, 9);
            double ref[128];
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n; i++) {
                if (narrow(dt) && i % 3)
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                for (unsigned mask = 1; mask < 8; mask++)
                    for (int q = 0; q < 5; q++) {
                        if ((mask + (unsigned)q + (unsigned)i) % 2 && mask != 7)
                            continue;
                        int axes[3], na = 0;
                        for (int a = 0; a < 3; a++)
                            if (mask & (1u << a))
                                axes[na++] = a;
                        /* reference: keepdims layout of the output */
                        int64_t os[3], cnt = 1;
                        for (int a = 0; a < 3; a++) {
                            os[a] = (mask & (1u << a)) ? 1 : sh[a];
                            cnt *= (mask & (1u << a)) ? sh[a] : 1;
                        }
                        int64_t no = os[0] * os[1] * os[2];
                        /* products of integers wrap: their reference is a wrapping product */
                        uint64_t wrapped[128];
                        for (int64_t k = 0; k < no; k++) {
                            ref[k] = ops[q] == DT_REDUCE_MAX    ? -INFINITY
                                     : ops[q] == DT_REDUCE_MIN  ? INFINITY
                                     : ops[q] == DT_REDUCE_PROD ? 1
                                                                : 0;
                            wrapped[k] = 1;
                        }
                        for (int64_t i0 = 0; i0 < sh[0]; i0++)
                            for (int64_t i1 = 0; i1 < sh[1]; i1++)
                                for (int64_t i2 = 0; i2 < sh[2]; i2++) {
                                    int64_t ii[3] = {i0, i1, i2}, k = 0;
                                    for (int a = 0; a < 3; a++)
                                        k = k * os[a] + ((mask & (1u << a)) ? 0 : ii[a]);
                                    double v = get(dt, hx, (i0 * sh[1] + i1) * sh[2] + i2);
                                    if (ops[q] == DT_REDUCE_MAX)
                                        ref[k] = fmax(ref[k], v);
                                    else if (ops[q] == DT_REDUCE_MIN)
                                        ref[k] = fmin(ref[k], v);
                                    else if (ops[q] == DT_REDUCE_PROD)
                                        ref[k] *= v;
                                    else
                                        ref[k] += v;
                                    wrapped[k] *= (uint64_t)(int64_t)v;
                                }
                        for (int64_t k = 0; ops[q] == DT_REDUCE_PROD && is_int(dt) && k < no; k++)
                            ref[k] = dt == DT_DTYPE_I32  ? (double)(int32_t)wrapped[k]
                                     : dt == DT_DTYPE_U8 ? (double)(uint8_t)wrapped[k]
                                     : dt == DT_DTYPE_I8 ? (double)(int8_t)wrapped[k]
                                                         : (double)(int64_t)wrapped[k];
                        if (ops[q] == DT_REDUCE_MEAN)
                            for (int64_t k = 0; k < no; k++)
                                ref[k] /= (double)cnt;
                        for (int keep = 0; keep < 2; keep++) {
                            dt_tensor *y = NULL;
                            bool refused =
                                (ops[q] == DT_REDUCE_MEAN && !dt_dtype_is_floating(dt)) ||
                                ((ops[q] == DT_REDUCE_SUM || ops[q] == DT_REDUCE_PROD) &&
                                 is_bool(dt));
                            if (refused) {
                                /* means of integers, sums and products of bool, said clearly */
                                bool one = x &&
                                           dt_reduce((dt_reduce_op)ops[q], x, na, axes, keep, NULL,
                                                     &y) == DT_ERR_DTYPE &&
                                           !y && strstr(dt_last_error(), dt_dtype_name(dt));
                                if (!one && ok)
                                    snprintf(bad, sizeof bad, " (%s of %s: %s)",
                                             dt_reduce_op_name((dt_reduce_op)ops[q]),
                                             dt_dtype_name(dt), dt_last_error());
                                ok = ok && one;
                                continue;
                            }
                            bool one = x &&
                                       dt_reduce((dt_reduce_op)ops[q], x, na, axes, keep, NULL,
                                                 &y) == DT_OK &&
                                       dt_tensor_rank(y) == (keep ? 3 : 3 - na) &&
                                       matches(y, dt, ref, no, sum_tol(dt));
                            if (!one && ok) {
                                char lx[64];
                                layout_text(&ls[i], lx, sizeof lx);
                                snprintf(bad, sizeof bad,
                                         " (first failure %s mask %u keepdims %d \"%s\": %s)",
                                         dt_reduce_op_name((dt_reduce_op)ops[q]), mask, keep, lx,
                                         dt_last_error());
                            }
                            ok = ok && one;
                            dt_tensor_free(y);
                        }
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(
                ok, "reduce sum/mean/max/min %s %s: %d layouts%s%s", dt_dtype_name(dt),
                s ? "uneven" : "even", n,
                !dt_dtype_is_floating(dt) ? " (refused: DT_ERR_DTYPE naming the dtype)" : "", bad);
            free(hx);
        }
}

static void diff_shape_ops(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout ls[MAX_LAYOUTS];
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        const int64_t sh[2] = {5, 6};
        double hx[30], hy[30]; /* storage for 30 elements of any dtype */
        double ref[64];
        fill_host(dt, hx, 30, 10);
        fill_host(dt, hy, 30, 11);
        int n = layouts_for(m, 2, dt, ls);
        bool ok_t = true, ok_s = true, ok_c = true, ok_r = true;
        char bad[256] = "";
        for (int i = 0; i < n; i++) {
            if (narrow(dt) && i % 2)
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, hx), *y = NULL;
            /* transpose */
            const int perm[2] = {1, 0};
            for (int64_t r = 0; r < 6; r++)
                for (int64_t c = 0; c < 5; c++)
                    ref[r * 5 + c] = get(dt, hx, c * 6 + r);
            ok_t =
                ok_t && x && dt_transpose(x, perm, NULL, &y) == DT_OK && matches(y, dt, ref, 30, 0);
            dt_tensor_free(y);
            y = NULL;
            /* slice rows 1..4, columns 2..5 */
            const int64_t begin[2] = {1, 2}, size[2] = {3, 3};
            for (int64_t r = 0; r < 3; r++)
                for (int64_t c = 0; c < 3; c++)
                    ref[r * 3 + c] = get(dt, hx, (r + 1) * 6 + c + 2);
            ok_s = ok_s && x && dt_slice(x, begin, size, NULL, &y) == DT_OK &&
                   matches(y, dt, ref, 9, 0);
            dt_tensor_free(y);
            y = NULL;
            /* concat with itself and another layout's tensor, on both axes */
            for (int axis = 0; axis < 2; axis++) {
                dt_tensor *z = make_tensor(&ls[(i * 5 + axis) % n], dt, 2, sh, hy);
                const dt_tensor *xs[2] = {x, z};
                for (int64_t r = 0; r < (axis ? 5 : 10); r++)
                    for (int64_t c = 0; c < (axis ? 12 : 6); c++) {
                        int64_t w = axis ? 12 : 6;
                        bool first = axis ? c < 6 : r < 5;
                        ref[r * w + c] =
                            first ? get(dt, hx, r * 6 + c)
                                  : get(dt, hy, (axis ? r : r - 5) * 6 + (axis ? c - 6 : c));
                    }
                bool one = x && z && dt_concat(2, xs, axis, NULL, &y) == DT_OK &&
                           matches(y, dt, ref, 60, 0);
                if (!one && ok_c) {
                    char lx[64];
                    layout_text(&ls[i], lx, sizeof lx);
                    snprintf(bad, sizeof bad, " (concat failure axis %d \"%s\": %s)", axis, lx,
                             dt_last_error());
                }
                ok_c = ok_c && one;
                dt_tensor_free(y);
                dt_tensor_free(z);
                y = NULL;
            }
            /* reshape [5,6] -> [5,2,3] (expressible whenever axis 1 is unsharded or 2 | shards) */
            const int64_t rs[3] = {5, 2, 3};
            for (int64_t k = 0; k < 30; k++)
                ref[k] = get(dt, hx, k);
            dt_status st = x ? dt_reshape(x, 3, rs, NULL, &y) : DT_ERR_ARG;
            bool expressible = ls[i].axes[1] == DT_UNSHARDED || 2 % m->sizes[ls[i].axes[1]] == 0;
            ok_r = ok_r && (expressible ? st == DT_OK && matches(y, dt, ref, 30, 0)
                                        : st == DT_ERR_LAYOUT && strstr(dt_last_error(), "axis 1"));
            dt_tensor_free(y);
            dt_tensor_free(x);
        }
        const char *dn = dt_dtype_name(dt);
        DIFF_REPORT(ok_t, "transpose %s uneven: %d layouts", dn, n);
        DIFF_REPORT(ok_s, "slice %s uneven: %d layouts", dn, n);
        DIFF_REPORT(ok_c, "concat %s uneven: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_r, "reshape %s: %d layouts (local, or DT_ERR_LAYOUT where inexpressible)",
                    dn, n);
    }
}

/* Dtypes an op does not take: DT_ERR_DTYPE naming the dtype, nothing made. */
static void diff_dtype_errors(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    const int64_t sh[2] = {3, 3};
    double hb[9], hf[9];
    fill_host(DT_DTYPE_BOOL, hb, 9, 1);
    fill_host(DT_DTYPE_F32, hf, 9, 1);
    dt_tensor *b = make_tensor(&l, DT_DTYPE_BOOL, 2, sh, hb);
    dt_tensor *f = make_tensor(&l, DT_DTYPE_F32, 2, sh, hf), *r = NULL;
    bool ok = b && f;
    ok = ok && dt_matmul(b, b, NULL, &r) == DT_ERR_DTYPE && !r && strstr(dt_last_error(), "bool");
    ok = ok && dt_binary(DT_BINARY_ADD, b, b, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "bool");
    ok = ok && dt_binary(DT_BINARY_LOGICAL_AND, f, b, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "f32");
    ok = ok && dt_unary(DT_UNARY_EXP, b, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_unary(DT_UNARY_LOGICAL_NOT, f, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_where(f, f, f, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "condition is f32");
    ok = ok && dt_matmul(f, b, NULL, &r) == DT_ERR_DTYPE && !r;
    ok = ok && dt_cast(f, (dt_dtype)DT_DTYPE_COUNT, NULL, &r) == DT_ERR_DTYPE && !r;
    /* a bool beside a number is promoted, not refused */
    ok = ok && dt_binary(DT_BINARY_ADD, f, b, NULL, &r) == DT_OK &&
         dt_tensor_dtype(r) == DT_DTYPE_F32;
    DIFF_REPORT(ok, "dtypes an op does not take: DT_ERR_DTYPE naming them (%s)", dt_last_error());
    dt_tensor_free(r);
    dt_tensor_free(b);
    dt_tensor_free(f);
}

/* copy_to_mesh: every layout (partial included) on m to layouts of another mesh over the same
 * devices (another shape where one exists), even and uneven, every dtype. */
static void diff_copy_to_mesh(const dt_mesh *m, const diff_opts *o)
{
    int size = 1;
    for (int a = 0; a < dt_mesh_num_axes(m); a++)
        size *= m->sizes[a];
    char spec[32];
    if (size % 2 == 0 && size > 2)
        snprintf(spec, sizeof spec, "p=%d,q=2", size / 2);
    else
        snprintf(spec, sizeof spec, "p=%d", size);
    dt_mesh *m2 = NULL;
    bool ok_mesh = dt_mesh_create_from_string(spec, dt_mesh_device_type(m), &m2) == DT_OK;
    DIFF_REPORT(ok_mesh, "copy_to_mesh: a second mesh %s", spec);
    if (!ok_mesh)
        return;
    dt_layout ls[MAX_LAYOUTS], lt[MAX_LAYOUTS];
    const int64_t shapes[2][2] = {{4, 12}, {5, 7}};
    int n = all_layouts(m, 2, true, ls), n2 = all_layouts(m2, 2, true, lt);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        int s = d % 2;
        char bad[256] = "";
        bool ok = move_pairs(ls, n, lt, n2, true, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "copy_to_mesh %s %s to %s: layouts %d x %d%s", dt_dtype_name(dt),
                    s ? "uneven" : "even", spec, n, n2, bad);
    }
    dt_mesh_free(m2);
    /* to a mesh of the other device type with the same axes over as many devices (CPU <->
     * CUDA), and back, when this client has those devices */
    dt_device_type other = dt_mesh_device_type(m) == DT_DEVICE_CPU ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    if (dt_num_global_devices(other) != size)
        return;
    const char *names[DT_MAX_MESH_AXES];
    for (int a = 0; a < dt_mesh_num_axes(m); a++)
        names[a] = dt_mesh_axis_name(m, a);
    dt_mesh *mo = NULL;
    ok_mesh = dt_mesh_create(dt_mesh_num_axes(m), names, m->sizes, other, &mo) == DT_OK;
    DIFF_REPORT(ok_mesh, "copy_to_mesh: a %s mesh of the same axes", dt_device_type_name(other));
    if (!ok_mesh)
        return;
    int no = all_layouts(mo, 2, true, lt);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        int s = d % 2;
        char bad[256] = "";
        bool ok = move_pairs(ls, n, lt, no, true, dt, shapes[s], o, bad, sizeof bad) &&
                  move_pairs(lt, no, ls, n, true, dt, shapes[s], o, bad, sizeof bad);
        DIFF_REPORT(ok, "copy_to_mesh %s %s between %s and %s meshes: layouts %d x %d%s",
                    dt_dtype_name(dt), s ? "uneven" : "even",
                    dt_device_type_name(dt_mesh_device_type(m)), dt_device_type_name(other), n, no,
                    bad);
    }
    dt_mesh_free(mo);
}

/* ---- row-wise ops: softmax, log_softmax, logsumexp, layer_norm, rms_norm, argmax, argmin,
 * cumsum (spmd/ops/softmax.c, norm.c, arg_reduce.c, cumsum.c) --------------------------------- */

/* Layouts the row-wise sections run: every one when thorough (every third for the 16-bit
 * floats and the 8-bit integers); otherwise about five spread over the list (the first is
 * replicated, later ones shard the axes and, for most dtypes, hold partial sums). */
static bool row_pick(const diff_opts *o, dt_dtype dt, int i, int n)
{
    if (o->thorough)
        return !narrow(dt) || i % 3 == 0;
    int stride = n > 5 ? n / 5 : 1;
    return i % stride == 0 && (!narrow(dt) || (i / stride) % 2 == 0);
}

/* Tolerance of the floating row-wise results against double references: the kernels compute
 * in f32 (f64 for f64) and round once, so a 16-bit result may be one unit in the last place
 * away (2^-8 relative for bf16, 2^-11 for f16). */
static double row_tol(dt_dtype dt)
{
    return dt == DT_DTYPE_BF16  ? 1e-2
           : dt == DT_DTYPE_F16 ? 2e-3
           : dt == DT_DTYPE_F32 ? 1e-5
                                : 1e-12;
}

/* Rank-3 index helpers: element (i0, i1, i2) of shape sh, and its row (the index of the
 * keepdims result) when the axes of `mask` are reduced. */
static int64_t at3(const int64_t sh[3], int64_t i0, int64_t i1, int64_t i2)
{
    return (i0 * sh[1] + i1) * sh[2] + i2;
}

static int64_t row3(const int64_t sh[3], unsigned mask, const int64_t ii[3])
{
    int64_t k = 0;
    for (int a = 0; a < 3; a++)
        k = k * ((mask & (1u << a)) ? 1 : sh[a]) + ((mask & (1u << a)) ? 0 : ii[a]);
    return k;
}

/* softmax and log_softmax along `axis`, logsumexp over `mask`, of x (rank 3) in double:
 * sm and lsm of x's size, lse of the keepdims size. */
static void ref_softmax(const double *x, const int64_t sh[3], unsigned mask, double *sm,
                        double *lsm, double *lse)
{
    int64_t ne = sh[0] * sh[1] * sh[2], nr = 1;
    for (int a = 0; a < 3; a++)
        nr *= (mask & (1u << a)) ? 1 : sh[a];
    double *mx = malloc(sizeof(double) * (size_t)nr), *s = malloc(sizeof(double) * (size_t)nr);
    for (int64_t r = 0; r < nr; r++) {
        mx[r] = -INFINITY;
        s[r] = 0;
    }
    for (int pass = 0; pass < 3; pass++)
        for (int64_t e = 0; e < ne; e++) {
            int64_t ii[3] = {e / (sh[1] * sh[2]), e / sh[2] % sh[1], e % sh[2]};
            int64_t r = row3(sh, mask, ii);
            if (pass == 0)
                mx[r] = fmax(mx[r], x[e]);
            else if (pass == 1)
                s[r] += exp(x[e] - mx[r]);
            else if (sm) {
                sm[e] = exp(x[e] - mx[r]) / s[r];
                lsm[e] = x[e] - mx[r] - log(s[r]);
            }
        }
    for (int64_t r = 0; lse && r < nr; r++)
        lse[r] = mx[r] + log(s[r]);
    free(mx);
    free(s);
}

static void diff_softmax(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 3}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[64], xv[64], sm[64], lsm[64], lse[64];
            fill_host(dt, hx, ne, 13);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            if (!dt_dtype_is_floating(dt)) {
                /* softmax is floating point only, said clearly */
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_softmax(x, -1, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), dt_dtype_name(dt)) &&
                     dt_log_softmax(x, 0, NULL, &y) == DT_ERR_DTYPE && !y &&
                     dt_logsumexp(x, 0, NULL, 0, NULL, &y) == DT_ERR_DTYPE && !y;
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "softmax, log_softmax, logsumexp of %s: DT_ERR_DTYPE (%s)",
                                dt_dtype_name(dt), dt_last_error());
                continue;
            }
            double tol = row_tol(dt);
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int axis = 0; axis < 3; axis++) {
                    if (!o->thorough && (i + axis) % 2)
                        continue;
                    ref_softmax(xv, sh, 1u << axis, sm, lsm, NULL);
                    dt_tensor *y = NULL, *z = NULL;
                    bool one =
                        x && dt_softmax(x, axis - 3 * (axis % 2), NULL, &y) == DT_OK &&
                        dt_layout_equal(dt_tensor_layout(y), &kept) &&
                        matches(y, dt, sm, ne, tol) && dt_log_softmax(x, axis, NULL, &z) == DT_OK &&
                        dt_layout_equal(dt_tensor_layout(z), &kept) && matches(z, dt, lsm, ne, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure axis %d \"%s\": %s)", axis, lx,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                    dt_tensor_free(z);
                }
                for (unsigned mask = 1; mask < 8; mask++) {
                    if ((mask + (unsigned)i) % (o->thorough ? 2 : 5) && mask != 5)
                        continue;
                    int axes[3], na = 0;
                    for (int a = 0; a < 3; a++)
                        if (mask & (1u << a))
                            axes[na++] = a;
                    ref_softmax(xv, sh, mask, NULL, NULL, lse);
                    int64_t nr = 1;
                    for (int a = 0; a < 3; a++)
                        nr *= (mask & (1u << a)) ? 1 : sh[a];
                    int keep = (int)(mask + (unsigned)i) % 2;
                    dt_tensor *y = NULL;
                    bool one =
                        x && dt_logsumexp(x, mask == 7 ? 0 : na, axes, keep, NULL, &y) == DT_OK &&
                        dt_tensor_rank(y) == (keep ? 3 : 3 - na) && matches(y, dt, lse, nr, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure logsumexp mask %u \"%s\": %s)",
                                 mask, lx, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            /* requested result layouts, from a sharded x */
            ref_softmax(xv, sh, 2, sm, lsm, NULL);
            dt_tensor *x = make_tensor(&ls[n - 1], dt, 3, sh, hx);
            for (int j = 0; j < n; j += o->thorough ? 1 : 7) {
                dt_op_options req = {.layout = &ls[j]};
                dt_tensor *y = NULL;
                bool one = x && dt_softmax(x, 1, &req, &y) == DT_OK &&
                           dt_layout_equal(dt_tensor_layout(y), &ls[j]) &&
                           matches(y, dt, sm, ne, tol);
                if (!one && ok)
                    snprintf(bad, sizeof bad, " (requested layout %d: %s)", j, dt_last_error());
                ok = ok && one;
                dt_tensor_free(y);
            }
            dt_tensor_free(x);
            DIFF_REPORT(ok, "softmax, log_softmax, logsumexp %s %s: %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* layer_norm (gamma and beta, gamma only, neither) and rms_norm (with and without gamma) of x
 * [rows.., last] in double; gamma and beta NULL for none. */
static void ref_norm(bool layer, const double *x, int64_t rows, int64_t n, const double *gamma,
                     const double *beta, double eps, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * n;
        double mu = 0, v = 0;
        for (int64_t j = 0; layer && j < n; j++)
            mu += xr[j] / (double)n;
        for (int64_t j = 0; j < n; j++)
            v += (xr[j] - mu) * (xr[j] - mu) / (double)n;
        for (int64_t j = 0; j < n; j++)
            y[r * n + j] =
                (xr[j] - mu) / sqrt(v + eps) * (gamma ? gamma[j] : 1) + (beta ? beta[j] : 0);
    }
}

static void diff_norm(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l1[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{2, 3, 8}, {3, 2, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2], last = sh[2];
            double hx[64], hg[8], hb[8], xv[64], gv[8], bv[8], ref[64];
            fill_host(dt, hx, ne, 14);
            fill_host(dt, hg, last, 15);
            fill_host(dt, hb, last, 16);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            for (int64_t k = 0; k < last; k++) {
                gv[k] = get(dt, hg, k);
                bv[k] = get(dt, hb, k);
            }
            int n = layouts_for(m, 3, dt, ls), n1 = layouts_for(m, 1, dt, l1);
            bool ok = true;
            char bad[256] = "";
            if (!dt_dtype_is_floating(dt)) {
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_layer_norm(x, NULL, NULL, 1e-5, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), dt_dtype_name(dt)) &&
                     dt_rms_norm(x, NULL, 1e-5, NULL, &y) == DT_ERR_DTYPE && !y;
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "layer_norm, rms_norm of %s: DT_ERR_DTYPE (%s)",
                                dt_dtype_name(dt), dt_last_error());
                continue;
            }
            double tol = row_tol(dt) * (dt == DT_DTYPE_F64 ? 1 : 2), eps = 0.25;
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_tensor *g = make_tensor(&l1[(i * 5 + 1) % n1], dt, 1, &last, hg);
                dt_tensor *b = make_tensor(&l1[(i * 3 + 2) % n1], dt, 1, &last, hb);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int v = 0; v < 5; v++) {
                    if (!o->thorough && (i + v) % 2)
                        continue;
                    bool layer = v < 3;
                    const dt_tensor *tg = v == 2 || v == 4 ? NULL : g, *tb = v == 0 ? b : NULL;
                    ref_norm(layer, xv, sh[0] * sh[1], last, tg ? gv : NULL, tb ? bv : NULL, eps,
                             ref);
                    dt_tensor *y = NULL;
                    dt_status st = layer ? dt_layer_norm(x, tg, tb, eps, NULL, &y)
                                         : dt_rms_norm(x, tg, eps, NULL, &y);
                    bool one = x && g && b && st == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(y), &kept) &&
                               matches(y, dt, ref, ne, tol);
                    runs++;
                    if (!one && ok) {
                        char lx[64];
                        layout_text(&ls[i], lx, sizeof lx);
                        snprintf(bad, sizeof bad, " (first failure variant %d \"%s\": %s)", v, lx,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
                dt_tensor_free(g);
                dt_tensor_free(b);
            }
            DIFF_REPORT(ok, "layer_norm, rms_norm %s %s: %d runs over %d layouts of x%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* numpy's argmax / argmin along `axis` of a rank-3 x: the first extremum, the first NaN. */
static void ref_argext(bool is_max, const double *x, const int64_t sh[3], int axis, double *out)
{
    int64_t ii[3], k = 0;
    for (ii[0] = 0; ii[0] < (axis == 0 ? 1 : sh[0]); ii[0]++)
        for (ii[1] = 0; ii[1] < (axis == 1 ? 1 : sh[1]); ii[1]++)
            for (ii[2] = 0; ii[2] < (axis == 2 ? 1 : sh[2]); ii[2]++) {
                int64_t best = 0, jj[3] = {ii[0], ii[1], ii[2]};
                double bv = x[at3(sh, jj[0], jj[1], jj[2])];
                for (int64_t j = 1; j < sh[axis] && !isnan(bv); j++) {
                    jj[axis] = j;
                    double v = x[at3(sh, jj[0], jj[1], jj[2])];
                    if (isnan(v) || (is_max ? v > bv : v < bv)) {
                        bv = v;
                        best = j;
                    }
                }
                out[k++] = (double)best;
            }
}

static void diff_argmax(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[128], xv[128], ref[64];
            fill_host(dt, hx, ne, 17); /* repeated values: ties */
            if (dt_dtype_is_floating(dt))
                for (int64_t k = 5; k < ne; k += 11) /* NaNs in some rows, two in a few */
                    put(dt, hx, k, NAN);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            int runs = 0;
            for (int i = 0; i < n; i++) {
                /* NaN terms do not sum to NaN rows as one NaN value: floats skip partial x */
                if (!row_pick(o, dt, i, n) || (dt_dtype_is_floating(dt) && ls[i].partial))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                for (int axis = 0; axis < 3; axis++)
                    for (int q = 0; q < 2; q++) {
                        if ((i + axis + q) % 2 && !(o->thorough && !narrow(dt)))
                            continue;
                        bool is_max = (i + axis + q) % 2 == 0;
                        dt_dtype to = q ? DT_DTYPE_I32 : DT_DTYPE_I64;
                        ref_argext(is_max, xv, sh, axis, ref);
                        int64_t nr = ne / sh[axis];
                        dt_tensor *y = NULL;
                        dt_status st = x ? (is_max ? dt_argmax : dt_argmin)(x, axis, to, NULL, &y)
                                         : DT_ERR_ARG;
                        bool one = st == DT_OK && dt_tensor_dtype(y) == to &&
                                   dt_tensor_rank(y) == 2 && matches(y, to, ref, nr, 0);
                        /* the result keeps x's other axes' sharding */
                        const dt_layout *yl = y ? dt_tensor_layout(y) : NULL;
                        for (int a = 0, b = 0; one && a < 3; a++)
                            if (a != axis)
                                one = yl->axes[b++] == ls[i].axes[a];
                        runs++;
                        if (!one && ok) {
                            char lx[64];
                            layout_text(&ls[i], lx, sizeof lx);
                            snprintf(bad, sizeof bad, " (first failure %s axis %d \"%s\": %s)",
                                     is_max ? "argmax" : "argmin", axis, lx, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(y);
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "argmax, argmin %s %s (ties%s): %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even",
                        dt_dtype_is_floating(dt) ? ", NaN" : "", runs, n, bad);
        }
}

/* tf.math.cumsum along `axis` of a rank-3 x (flags: 1 exclusive, 2 reverse), in double. */
static void ref_cumsum(const double *x, const int64_t sh[3], int axis, int flags, double *y)
{
    int64_t ii[3];
    for (ii[0] = 0; ii[0] < (axis == 0 ? 1 : sh[0]); ii[0]++)
        for (ii[1] = 0; ii[1] < (axis == 1 ? 1 : sh[1]); ii[1]++)
            for (ii[2] = 0; ii[2] < (axis == 2 ? 1 : sh[2]); ii[2]++) {
                double acc = 0;
                int64_t jj[3] = {ii[0], ii[1], ii[2]};
                for (int64_t q = 0; q < sh[axis]; q++) {
                    jj[axis] = flags & 2 ? sh[axis] - 1 - q : q;
                    int64_t e = at3(sh, jj[0], jj[1], jj[2]);
                    if (flags & 1) {
                        y[e] = acc;
                        acc += x[e];
                    } else {
                        acc += x[e];
                        y[e] = acc;
                    }
                }
            }
}

static void diff_cumsum(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS];
    const int64_t shapes[2][3] = {{4, 6, 2}, {5, 3, 7}};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            const int64_t *sh = shapes[s];
            int64_t ne = sh[0] * sh[1] * sh[2];
            double hx[128], xv[128], ref[128];
            fill_host(dt, hx, ne, 18);
            for (int64_t k = 0; k < ne; k++)
                xv[k] = get(dt, hx, k);
            int n = layouts_for(m, 3, dt, ls);
            bool ok = true;
            char bad[256] = "";
            if (is_bool(dt)) {
                dt_tensor *x = make_tensor(&ls[0], dt, 3, sh, hx), *y = NULL;
                ok = x && dt_cumsum(x, 0, 0, 0, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), "bool");
                dt_tensor_free(x);
                if (s == 0)
                    DIFF_REPORT(ok, "cumsum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                continue;
            }
            int runs = 0;
            for (int i = 0; i < n; i++) {
                if (!row_pick(o, dt, i, n))
                    continue;
                dt_tensor *x = make_tensor(&ls[i], dt, 3, sh, hx);
                dt_layout kept = ls[i];
                kept.partial = 0;
                for (int axis = 0; axis < 3; axis++)
                    for (int flags = 0; flags < 4; flags++) {
                        if ((i + axis + flags) % (o->thorough && !narrow(dt) ? 2 : 4))
                            continue;
                        ref_cumsum(xv, sh, axis, flags, ref);
                        dt_tensor *y = NULL;
                        bool one = x &&
                                   dt_cumsum(x, axis, flags & 1, flags & 2, NULL, &y) == DT_OK &&
                                   dt_layout_equal(dt_tensor_layout(y), &kept) &&
                                   matches(y, dt, ref, ne, 0);
                        runs++;
                        if (!one && ok) {
                            char lx[64];
                            layout_text(&ls[i], lx, sizeof lx);
                            snprintf(bad, sizeof bad,
                                     " (first failure axis %d flags %d \"%s\": %s)", axis, flags,
                                     lx, dt_last_error());
                        }
                        ok = ok && one;
                        dt_tensor_free(y);
                    }
                dt_tensor_free(x);
            }
            DIFF_REPORT(ok, "cumsum %s %s (exclusive, reverse): %d runs over %d layouts%s",
                        dt_dtype_name(dt), s ? "uneven" : "even", runs, n, bad);
        }
}

/* Bad arguments of the row-wise ops: DT_ERR_* naming the values, nothing made. */
static void diff_rowwise_errors(const dt_mesh *m, const diff_opts *o)
{
    (void)o;
    dt_layout l2, l1;
    dt_layout_replicated(m, 2, &l2);
    dt_layout_replicated(m, 1, &l1);
    const int64_t sh[2] = {3, 4}, s3[1] = {3};
    double hf[12];
    fill_host(DT_DTYPE_F32, hf, 12, 1);
    dt_tensor *x = make_tensor(&l2, DT_DTYPE_F32, 2, sh, hf);
    dt_tensor *g3 = make_tensor(&l1, DT_DTYPE_F32, 1, s3, hf);
    dt_tensor *g4d = make_tensor(&l1, DT_DTYPE_F64, 1, sh + 1, hf), *r = NULL;
    bool ok = x && g3 && g4d;
    ok = ok && dt_softmax(x, 2, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "axis 2") && strstr(dt_last_error(), "rank 2");
    ok = ok && dt_logsumexp(x, 2, (const int[]){1, -1}, 0, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "twice");
    ok = ok && dt_argmax(x, -3, DT_DTYPE_I64, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "axis -3");
    ok = ok && dt_argmax(x, 0, DT_DTYPE_F32, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "index dtype f32");
    ok = ok && dt_cumsum(x, 5, 0, 0, NULL, &r) == DT_ERR_ARG && !r;
    ok = ok && dt_layer_norm(x, g3, NULL, 1e-5, NULL, &r) == DT_ERR_SHAPE && !r &&
         strstr(dt_last_error(), "gamma is [3]");
    ok = ok && dt_layer_norm(x, NULL, g4d, 1e-5, NULL, &r) == DT_ERR_DTYPE && !r &&
         strstr(dt_last_error(), "beta is f64");
    ok = ok && dt_rms_norm(x, NULL, -1.0, NULL, &r) == DT_ERR_ARG && !r &&
         strstr(dt_last_error(), "epsilon");
    ok = ok && dt_softmax(NULL, 0, NULL, &r) == DT_ERR_ARG && !r;
    DIFF_REPORT(ok, "row-wise ops' bad arguments: DT_ERR_* naming them (%s)", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(g3);
    dt_tensor_free(g4d);
}

/* ---- shape and index ops: gather, unsorted_segment_sum, one_hot, einsum, stack, split, pad,
 * tile, broadcast_to, expand_dims, squeeze ------------------------------------------------ */

/* Every n-th of a list in the MPI run (all when thorough); each index at least once over the
 * list's first stride. */
static bool pick_every(const diff_opts *o, int i, int every)
{
    return o->thorough || i % every == 0;
}

/* The MPI run takes each dtype in one of the even and uneven shapes (the one-client run both). */
static bool once(const diff_opts *o, int d, int s)
{
    return o->thorough || d % 2 == s;
}

/* Ids for gather and segment sums: mostly in [0, V), with -1, V and V + 3 among them (rows of
 * zeros, nothing added), repeats included. */
static void fill_ids(dt_dtype dt, void *buf, int64_t n, int64_t V, int salt)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (i * 5 + salt) % (V + 3);
        put(dt, buf, i, k == V + 2 ? -1.0 : k == V + 1 ? (double)(V + 3) : (double)k);
    }
}

static void diff_gather(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lt[MAX_LAYOUTS], li[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const int64_t tshapes[2][2] = {{8, 6}, {7, 5}}; /* [V, d]: even, uneven */
    const int64_t ishape[2] = {3, 4};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d], it = d % 2 ? DT_DTYPE_I64 : DT_DTYPE_I32;
            if (!once(o, d, s))
                continue;
            const int64_t *ts = tshapes[s];
            int64_t V = ts[0], D = ts[1], ni = ishape[0] * ishape[1];
            double ht[64], hi[16], ref[96];
            fill_host(dt, ht, V * D, 13);
            fill_ids(it, hi, ni, V, s + d);
            for (int64_t i = 0; i < ni; i++) {
                int64_t id = (int64_t)get(it, hi, i);
                for (int64_t c = 0; c < D; c++)
                    ref[i * D + c] = id >= 0 && id < V ? get(dt, ht, id * D + c) : 0.0;
            }
            int nt = layouts_for(m, 2, dt, lt), ni2 = all_layouts(m, 2, true, li);
            double tol = 0; /* copies, and sums of exact partial terms */
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < nt; i++) {
                dt_tensor *t = make_tensor(&lt[i], dt, 2, ts, ht);
                for (int j = 0; j < ni2; j++) {
                    if (!pick_dt(o, dt, i, j, nt > ni2 ? nt : ni2) || !pick_every(o, i + j, 2))
                        continue;
                    dt_tensor *ids = make_tensor(&li[j], it, 2, ishape, hi), *y = NULL;
                    bool one = t && ids && dt_gather(t, ids, NULL, &y) == DT_OK &&
                               dt_tensor_rank(y) == 3 && matches(y, dt, ref, ni * D, tol);
                    if (!one && ok) {
                        char a[64], b[64];
                        layout_text(&lt[i], a, sizeof a);
                        layout_text(&li[j], b, sizeof b);
                        snprintf(bad, sizeof bad, " (first failure table \"%s\" ids \"%s\": %s)", a,
                                 b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(ids);
                    dt_tensor_free(y);
                }
                dt_tensor_free(t);
            }
            /* every requested layout of y, from the vocabulary-sharded table and replicated ids
             */
            if (!narrow(dt) || o->thorough) {
                int ny = layouts_for(m, 3, dt, ly);
                dt_layout vt, ri;
                dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 2, &vt);
                dt_layout_replicated(m, 2, &ri);
                dt_tensor *t = make_tensor(&vt, dt, 2, ts, ht);
                dt_tensor *ids = make_tensor(&ri, it, 2, ishape, hi);
                for (int k = 0; k < ny; k++) {
                    if (!pick_every(o, k + d, 5))
                        continue;
                    dt_op_options op = {.layout = &ly[k]};
                    dt_tensor *y = NULL;
                    bool one = t && ids && dt_gather(t, ids, &op, &y) == DT_OK &&
                               dt_layout_equal(dt_tensor_layout(y), &ly[k]) &&
                               matches(y, dt, ref, ni * D, tol);
                    if (!one && ok) {
                        char a[64];
                        layout_text(&ly[k], a, sizeof a);
                        snprintf(bad, sizeof bad, " (first failure requested \"%s\": %s)", a,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(t);
                dt_tensor_free(ids);
            }
            DIFF_REPORT(ok,
                        "gather %s[%lld,%lld] by %s ids (out of range among them): layouts of "
                        "table, ids and result%s",
                        dt_dtype_name(dt), (long long)V, (long long)D, dt_dtype_name(it), bad);
        }
    /* a rank-3 table and rank-1 ids, f64 */
    {
        dt_layout l3[MAX_LAYOUTS], l1[MAX_LAYOUTS];
        const int64_t ts[3] = {5, 2, 3}, is[1] = {7};
        double ht[30], hi[7], ref[42];
        fill_host(DT_DTYPE_F64, ht, 30, 2);
        fill_ids(DT_DTYPE_I64, hi, 7, 5, 1);
        for (int64_t i = 0; i < 7; i++) {
            int64_t id = (int64_t)get(DT_DTYPE_I64, hi, i);
            for (int64_t c = 0; c < 6; c++)
                ref[i * 6 + c] = id >= 0 && id < 5 ? ht[id * 6 + c] : 0.0;
        }
        int n3 = all_layouts(m, 3, true, l3), n1 = all_layouts(m, 1, false, l1);
        bool ok = true;
        for (int i = 0; i < n3; i++) {
            if (!pick_every(o, i, 4))
                continue;
            dt_tensor *t = make_tensor(&l3[i], DT_DTYPE_F64, 3, ts, ht);
            dt_tensor *ids = make_tensor(&l1[i % n1], DT_DTYPE_I64, 1, is, hi), *y = NULL;
            ok = ok && t && ids && dt_gather(t, ids, NULL, &y) == DT_OK &&
                 matches(y, DT_DTYPE_F64, ref, 42, 0);
            dt_tensor_free(t);
            dt_tensor_free(ids);
            dt_tensor_free(y);
        }
        DIFF_REPORT(ok, "gather f64[5,2,3] by i64[7]: %d table layouts (%s)", n3,
                    ok ? "ok" : dt_last_error());
    }
}

static void diff_segment_sum(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lx[MAX_LAYOUTS], li[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const int64_t xshape[3] = {3, 4, 5}, ishape[2] = {3, 4};
    for (int s = 0; s < 2; s++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d], it = (d + s) % 2 ? DT_DTYPE_I64 : DT_DTYPE_I32;
            if (!once(o, d, s))
                continue;
            int64_t N = s ? 7 : 8, D = 5, nr = 12;
            double hx[64], hi[16], ref[64];
            fill_host(dt, hx, nr * D, 14);
            fill_ids(it, hi, nr, N, 2 * s + d);
            for (int64_t k = 0; k < N * D; k++)
                ref[k] = 0;
            for (int64_t r = 0; r < nr; r++) {
                int64_t id = (int64_t)get(it, hi, r);
                for (int64_t c = 0; id >= 0 && id < N && c < D; c++)
                    ref[id * D + c] += get(dt, hx, r * D + c);
            }
            if (is_bool(dt)) { /* sums of bool: refused, naming the dtype */
                dt_layout l, l2;
                dt_layout_replicated(m, 3, &l);
                dt_layout_replicated(m, 2, &l2);
                dt_tensor *x = make_tensor(&l, dt, 3, xshape, hx);
                dt_tensor *ids = make_tensor(&l2, it, 2, ishape, hi), *y = NULL;
                bool ok = x && ids &&
                          dt_unsorted_segment_sum(x, ids, N, NULL, &y) == DT_ERR_DTYPE && !y &&
                          strstr(dt_last_error(), "bool");
                DIFF_REPORT(ok, "unsorted_segment_sum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                dt_tensor_free(x);
                dt_tensor_free(ids);
                continue;
            }
            int n3 = layouts_for(m, 3, dt, lx), n2 = all_layouts(m, 2, true, li);
            bool ok = true;
            char bad[256] = "";
            for (int i = 0; i < n3; i++) {
                if (!pick_every(o, i, 2))
                    continue;
                dt_tensor *x = make_tensor(&lx[i], dt, 3, xshape, hx);
                for (int j = 0; j < n2; j++) {
                    if (!pick_dt(o, dt, i, j, n3 > n2 ? n3 : n2) || !pick_every(o, i + j, 3))
                        continue;
                    dt_tensor *ids = make_tensor(&li[j], it, 2, ishape, hi), *y = NULL;
                    bool one = x && ids && dt_unsorted_segment_sum(x, ids, N, NULL, &y) == DT_OK &&
                               matches(y, dt, ref, N * D, sum_tol(dt));
                    if (!one && ok) {
                        char a[64], b[64];
                        layout_text(&lx[i], a, sizeof a);
                        layout_text(&li[j], b, sizeof b);
                        snprintf(bad, sizeof bad, " (first failure data \"%s\" ids \"%s\": %s)", a,
                                 b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(ids);
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
            /* every requested layout of y (the segments axis split: the table's gradient), from
             * batch-sharded data and ids */
            int ny = layouts_for(m, 2, dt, ly);
            dt_layout bx, bi;
            dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 3, &bx);
            dt_layout_batch_sharded(m, dt_mesh_axis_name(m, 0), 2, &bi);
            dt_tensor *x = make_tensor(&bx, dt, 3, xshape, hx);
            dt_tensor *ids = make_tensor(&bi, it, 2, ishape, hi);
            for (int k = 0; k < ny; k++) {
                if (!pick_every(o, k + d, 4) || (narrow(dt) && k % 3))
                    continue;
                dt_op_options op = {.layout = &ly[k]};
                dt_tensor *y = NULL;
                bool one = x && ids && dt_unsorted_segment_sum(x, ids, N, &op, &y) == DT_OK &&
                           dt_layout_equal(dt_tensor_layout(y), &ly[k]) &&
                           matches(y, dt, ref, N * D, sum_tol(dt));
                if (!one && ok) {
                    char a[64];
                    layout_text(&ly[k], a, sizeof a);
                    snprintf(bad, sizeof bad, " (first failure requested \"%s\": %s)", a,
                             dt_last_error());
                }
                ok = ok && one;
                dt_tensor_free(y);
            }
            dt_tensor_free(x);
            dt_tensor_free(ids);
            DIFF_REPORT(ok,
                        "unsorted_segment_sum %s[3,4,5] by %s ids into %lld segments: layouts "
                        "of data, ids and result%s",
                        dt_dtype_name(dt), dt_dtype_name(it), (long long)N, bad);
        }
}

static void diff_one_hot(const dt_mesh *m, const diff_opts *o)
{
    dt_layout lx[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    const dt_dtype idx_types[4] = {DT_DTYPE_I32, DT_DTYPE_I64, DT_DTYPE_U8, DT_DTYPE_I8};
    const int64_t xshape[2] = {5, 3};
    int nx = all_layouts(m, 2, true, lx);
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d], it = idx_types[d % 4];
        int64_t depth = d % 2 ? 7 : 4;
        double hx[15], ref[128];
        for (int64_t i = 0; i < 15; i++) /* -1 .. depth + 1 (u8: 255 for -1) */
            put(it, hx, i, (double)((i * 3 + d) % (depth + 3) - 1));
        /* off_value -1 where the dtype holds it (u8 does not: one_hot refuses it) */
        double on = is_bool(dt)  ? 1
                    : is_int(dt) ? 3
                                 : 2.5,
               off = is_bool(dt)         ? 0
                     : dt == DT_DTYPE_U8 ? 7
                                         : -1;
        bool ok = true;
        char bad[256] = "";
        for (int axis = -1; axis < 3; axis++) {
            int ax = axis < 0 ? 2 : axis;
            int64_t ys[3];
            for (int i = 0, j = 0; i < 3; i++)
                ys[i] = i == ax ? depth : xshape[j++];
            for (int64_t a0 = 0; a0 < ys[0]; a0++)
                for (int64_t a1 = 0; a1 < ys[1]; a1++)
                    for (int64_t a2 = 0; a2 < ys[2]; a2++) {
                        int64_t yi[3] = {a0, a1, a2}, xi[2], pos = yi[ax];
                        for (int i = 0, j = 0; i < 3; i++)
                            if (i != ax)
                                xi[j++] = yi[i];
                        double v = get(it, hx, xi[0] * 3 + xi[1]);
                        ref[(a0 * ys[1] + a1) * ys[2] + a2] = v == (double)pos ? on : off;
                    }
            int ny = layouts_for(m, 3, dt, ly);
            for (int i = 0; i < nx; i++) {
                if (is_bool(dt) && lx[i].partial)
                    continue;
                dt_tensor *x = make_tensor(&lx[i], it, 2, xshape, hx);
                for (int k = -1; k < ny; k++) {
                    if (k >= 0 && !pick_dt(o, dt, i, k, ny))
                        continue;
                    if (!o->thorough && (i + k + axis + d) % 8)
                        continue;
                    dt_op_options op = {.layout = k >= 0 ? &ly[k] : NULL};
                    dt_tensor *y = NULL;
                    bool one = x && dt_one_hot(x, depth, on, off, axis, dt, &op, &y) == DT_OK &&
                               (k < 0 || dt_layout_equal(dt_tensor_layout(y), &ly[k])) &&
                               matches(y, dt, ref, 15 * depth, 0);
                    if (!one && ok) {
                        char a[64], b[64] = "free";
                        layout_text(&lx[i], a, sizeof a);
                        if (k >= 0)
                            layout_text(&ly[k], b, sizeof b);
                        snprintf(bad, sizeof bad,
                                 " (first failure axis %d indices \"%s\" result \"%s\": %s)", axis,
                                 a, b, dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(y);
                }
                dt_tensor_free(x);
            }
        }
        DIFF_REPORT(ok,
                    "one_hot %s indices [5,3] depth %lld into %s, axes -1..2: layouts of "
                    "indices and result%s",
                    dt_dtype_name(it), (long long)depth, dt_dtype_name(dt), bad);
    }
}

/* Extents of einsum labels: even or uneven by turns. */
static bool einsum_uneven;

static int64_t einsum_extent(char c)
{
    static const int64_t even[3] = {4, 2, 6}, uneven[3] = {5, 3, 7};
    return (einsum_uneven ? uneven : even)[(unsigned char)c % 3];
}

/* einsum reference: the sum over every label's index of the operands' product, in double. */
static void ref_einsum(const char *eq, int n, const double *const xs[], double *out, int64_t *nout)
{
    char lab[3][DT_MAX_RANK + 1] = {{0}};
    const char *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
    snprintf(lab[0], sizeof lab[0], "%.*s", (int)((n == 2 ? comma : arrow) - eq), eq);
    if (n == 2)
        snprintf(lab[1], sizeof lab[1], "%.*s", (int)(arrow - comma - 1), comma + 1);
    snprintf(lab[2], sizeof lab[2], "%s", arrow + 2);
    char all[3 * DT_MAX_RANK + 1] = {0};
    int nl = 0;
    for (int q = 0; q < 3; q++)
        for (const char *c = lab[q]; *c; c++)
            if (!strchr(all, *c))
                all[nl++] = *c;
    int64_t ext[3 * DT_MAX_RANK], idx[3 * DT_MAX_RANK] = {0};
    for (int l = 0; l < nl; l++)
        ext[l] = einsum_extent(all[l]);
    *nout = 1;
    for (const char *c = lab[2]; *c; c++)
        *nout *= einsum_extent(*c);
    for (int64_t i = 0; i < *nout; i++)
        out[i] = 0;
    for (;;) {
        double v = 1;
        int64_t at[3] = {0, 0, 0};
        for (int q = 0; q < 3; q++)
            for (const char *c = lab[q]; *c; c++) {
                int l = (int)(strchr(all, *c) - all);
                at[q] = at[q] * ext[l] + idx[l];
            }
        for (int q = 0; q < n; q++)
            v *= xs[q][at[q]];
        out[at[2]] += v;
        int l = nl - 1;
        while (l >= 0 && ++idx[l] == ext[l])
            idx[l--] = 0;
        if (l < 0)
            break;
    }
}
typedef struct einsum_case {
    const char *eq;  /* as passed */
    const char *ref; /* explicit, for the reference */
} einsum_case;

static void diff_einsum(const dt_mesh *m, const diff_opts *o)
{
    static const einsum_case cases[] = {
        {"bsh,hd->bsd", "bsh,hd->bsd"},
        {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk"},
        {"ij,jk->ik", "ij,jk->ik"},
        {"ij->ji", "ij->ji"},
        {"bij,bjk->bik", "bij,bjk->bik"},
        {"i,i->", "i,i->"},
        {"ij,j->i", "ij,j->i"},
        {"ijk->kj", "ijk->kj"},
        {"ab,cb->ca", "ab,cb->ca"},
        {"ik,kj", "ik,kj->ij"},
        {" ...ij, ...jk -> ...ik", "zij,zjk->zik"},
        {"ij,k->i", "ij,k->i"},
        {"i,j->ij", "i,j->ij"},
        {"bqhd,bkhd->bhqk", "bqhd,bkhd->bhqk"},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    dt_layout la[MAX_LAYOUTS], lb[MAX_LAYOUTS], ly[MAX_LAYOUTS];
    for (int cs = 0; cs < ncases; cs++)
        for (int d = 0; d < NUM_DTYPES; d++) {
            dt_dtype dt = dtypes[d];
            bool wide = dt == DT_DTYPE_F64;
            if (!wide && !is_bool(dt) && cs != 0 && cs != 2 && cs != 3)
                continue; /* every dtype on bsh,hd->bsd, ij,jk->ik and ij->ji; f64 on all */
            if (is_bool(dt) && cs != 2)
                continue;
            einsum_uneven = (cs + d) % 2;
            const char *eq = cases[cs].ref, *arrow = strstr(eq, "->"), *comma = strchr(eq, ',');
            int n = comma ? 2 : 1, rank[2] = {0, 0}, orank = (int)strlen(arrow + 2);
            int64_t shapes[2][DT_MAX_RANK], ne[2] = {1, 1};
            const char *starts[2] = {eq, comma ? comma + 1 : NULL};
            for (int q = 0; q < n; q++)
                for (const char *c = starts[q]; *c != ',' && *c != '-'; c++) {
                    shapes[q][rank[q]] = einsum_extent(*c);
                    ne[q] *= shapes[q][rank[q]++];
                }
            void *hx[2] = {malloc((size_t)ne[0] * 8 + 8), malloc((size_t)ne[1] * 8 + 8)};
            double *rx[2] = {malloc(sizeof(double) * (size_t)ne[0] + 8),
                             malloc(sizeof(double) * (size_t)ne[1] + 8)};
            double *ref = malloc(sizeof(double) * 4096);
            int64_t nout;
            for (int q = 0; q < n; q++) {
                fill_host(dt, hx[q], ne[q], 15 + q);
                for (int64_t k = 0; k < ne[q]; k++)
                    rx[q][k] = get(dt, hx[q], k);
            }
            ref_einsum(eq, n, (const double *const *)rx, ref, &nout);
            bool ok = true;
            char bad[320] = "";
            if (is_bool(dt)) { /* refused, naming the dtype */
                dt_layout_replicated(m, 2, &la[0]);
                dt_tensor *a = make_tensor(&la[0], dt, 2, shapes[0], hx[0]);
                dt_tensor *b = make_tensor(&la[0], dt, 2, shapes[1], hx[1]), *y = NULL;
                const dt_tensor *xs[2] = {a, b};
                ok = a && b && dt_einsum(cases[cs].eq, 2, xs, NULL, &y) == DT_ERR_DTYPE && !y &&
                     strstr(dt_last_error(), "bool");
                DIFF_REPORT(ok, "einsum of bool: DT_ERR_DTYPE (%s)", dt_last_error());
                dt_tensor_free(a);
                dt_tensor_free(b);
            } else {
                int na = all_layouts(m, rank[0], true, la);
                int nb = n == 2 ? all_layouts(m, rank[1], true, lb) : 1;
                int ny = all_layouts(m, orank, true, ly);
                int every = o->thorough ? (narrow(dt) || is_int(dt) ? 3 : 1) : 6;
                /* pairs: every layout of a with some of b, every layout of b with some of a,
                 * then every requested layout of the result from a fixed pair */
                int total = na + (n == 2 ? nb : 0) + ny;
                for (int t = 0; t < total; t++) {
                    if (t % every != (cs + d) % every)
                        continue;
                    int i, j, k = -1;
                    if (t < na) {
                        i = t;
                        j = (t * 5 + 1) % nb;
                    } else if (t < na + (n == 2 ? nb : 0)) {
                        j = t - na;
                        i = (j * 3 + 2) % na;
                    } else {
                        k = t - na - (n == 2 ? nb : 0);
                        i = na > 1 ? 1 : 0;
                        j = nb - 1;
                    }
                    dt_tensor *a = make_tensor(&la[i], dt, rank[0], shapes[0], hx[0]);
                    dt_tensor *b =
                        n == 2 ? make_tensor(&lb[j], dt, rank[1], shapes[1], hx[1]) : NULL;
                    dt_tensor *y = NULL;
                    const dt_tensor *xs[2] = {a, b};
                    dt_op_options op = {.layout = k >= 0 ? &ly[k] : NULL};
                    bool one = a && (n == 1 || b) &&
                               dt_einsum(cases[cs].eq, n, xs, &op, &y) == DT_OK &&
                               dt_tensor_rank(y) == orank &&
                               (k < 0 || dt_layout_equal(dt_tensor_layout(y), &ly[k])) &&
                               matches(y, dt, ref, nout, sum_tol(dt));
                    if (!one && ok) {
                        char x1[64], x2[64] = "-", x3[64] = "free";
                        layout_text(&la[i], x1, sizeof x1);
                        if (n == 2)
                            layout_text(&lb[j], x2, sizeof x2);
                        if (k >= 0)
                            layout_text(&ly[k], x3, sizeof x3);
                        snprintf(bad, sizeof bad,
                                 " (first failure a \"%s\" b \"%s\" result \"%s\": %s)", x1, x2, x3,
                                 dt_last_error());
                    }
                    ok = ok && one;
                    dt_tensor_free(a);
                    dt_tensor_free(b);
                    dt_tensor_free(y);
                }
                DIFF_REPORT(ok, "einsum \"%s\" %s %s: layouts of the operands and the result%s",
                            cases[cs].eq, dt_dtype_name(dt), einsum_uneven ? "uneven" : "even",
                            bad);
            }
            free(hx[0]);
            free(hx[1]);
            free(rx[0]);
            free(rx[1]);
            free(ref);
        }
    /* equations refused on every client, naming the problem */
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    const int64_t sq[2] = {3, 3}, sr[2] = {3, 4};
    double h[12] = {0};
    dt_tensor *a = make_tensor(&l, DT_DTYPE_F32, 2, sq, h),
              *b = make_tensor(&l, DT_DTYPE_F32, 2, sr, h);
    dt_tensor *y = NULL;
    const dt_tensor *xs[2] = {a, b};
    bool ok = a && b;
    ok = ok && dt_einsum("ii->i", 1, xs, NULL, &y) == DT_ERR_UNSUPPORTED && !y &&
         strstr(dt_last_error(), "'i' repeats");
    ok = ok && dt_einsum("ij,ij->i", 2, xs, NULL, &y) == DT_ERR_SHAPE && !y &&
         strstr(dt_last_error(), "label 'j'");
    ok = ok && dt_einsum("ij,jk->iz", 2, xs, NULL, &y) == DT_ERR_ARG && !y &&
         strstr(dt_last_error(), "'z' is in no operand");
    ok = ok && dt_einsum("ij->ij", 2, xs, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_einsum("i1,1k->ik", 2, xs, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_einsum("ijk,jk->i", 2, xs, NULL, &y) == DT_ERR_SHAPE && !y;
    DIFF_REPORT(ok, "einsum: bad equations fail clearly (%s)", dt_last_error());
    dt_tensor_free(a);
    dt_tensor_free(b);
}

/* stack, split, pad, tile, broadcast_to, expand_dims and squeeze on every layout of a [5, 6]
 * tensor (uneven on 2- and 4-device axes; partial sums included), every dtype. */
static void diff_shape_more(const dt_mesh *m, const diff_opts *o)
{
    dt_layout ls[MAX_LAYOUTS], l3[MAX_LAYOUTS];
    const int64_t sh[2] = {5, 6};
    for (int d = 0; d < NUM_DTYPES; d++) {
        dt_dtype dt = dtypes[d];
        double hx[30], hy[30], hz[30], ref[256];
        fill_host(dt, hx, 30, 16);
        fill_host(dt, hy, 30, 17);
        fill_host(dt, hz, 30, 18);
        const double *hs[3] = {hx, hy, hz};
        int n = layouts_for(m, 2, dt, ls), n3 = layouts_for(m, 3, dt, l3);
        bool ok_st = true, ok_sp = true, ok_pad = true, ok_tile = true, ok_bc = true, ok_ed = true,
             ok_sq = true;
        char bad[320] = "";
        double cval = is_bool(dt) ? 1 : is_int(dt) ? 3 : 1.5;
        for (int i = 0; i < n; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i + d, 6))
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, sh, hx), *y = NULL;
            dt_op_options req = {.layout = &ls[(i * 7 + 3) % n]};
            /* stack of three tensors in three layouts, on each axis (and a requested layout) */
            dt_tensor *x1 = make_tensor(&ls[(i * 5 + 1) % n], dt, 2, sh, hy);
            dt_tensor *x2 = make_tensor(&ls[(i * 3 + 2) % n], dt, 2, sh, hz);
            const dt_tensor *xs[3] = {x, x1, x2};
            for (int axis = -1; axis < 3; axis++) {
                int ax = axis < 0 ? 2 : axis;
                int64_t ys[3];
                for (int q = 0, j = 0; q < 3; q++)
                    ys[q] = q == ax ? 3 : sh[j++];
                for (int64_t a0 = 0; a0 < ys[0]; a0++)
                    for (int64_t a1 = 0; a1 < ys[1]; a1++)
                        for (int64_t a2 = 0; a2 < ys[2]; a2++) {
                            int64_t yi[3] = {a0, a1, a2}, xi[2];
                            for (int q = 0, j = 0; q < 3; q++)
                                if (q != ax)
                                    xi[j++] = yi[q];
                            ref[(a0 * ys[1] + a1) * ys[2] + a2] =
                                get(dt, hs[yi[ax]], xi[0] * 6 + xi[1]);
                        }
                dt_op_options r3 = {.layout = &l3[(i + axis + 1) % n3]};
                bool one = x && x1 && x2 &&
                           dt_stack(3, xs, axis, axis == 1 ? &r3 : NULL, &y) == DT_OK &&
                           (axis != 1 || dt_layout_equal(dt_tensor_layout(y), r3.layout)) &&
                           matches(y, dt, ref, 90, 0);
                if (!one && ok_st)
                    snprintf(bad, sizeof bad, " (stack axis %d: %s)", axis, dt_last_error());
                ok_st = ok_st && one;
                dt_tensor_free(y);
                y = NULL;
            }
            dt_tensor_free(x1);
            dt_tensor_free(x2);
            /* split: axis 0 into 2 and 3 rows, axis 1 into 3 equal pieces */
            dt_tensor *parts[3] = {NULL, NULL, NULL};
            const int64_t sizes[2] = {2, 3};
            bool one = x && dt_split(x, 2, sizes, 0, NULL, parts) == DT_OK;
            for (int q = 0; one && q < 2; q++) {
                for (int64_t k = 0; k < sizes[q] * 6; k++)
                    ref[k] = get(dt, hx, (q ? 2 * 6 : 0) + k);
                one = matches(parts[q], dt, ref, sizes[q] * 6, 0);
            }
            for (int q = 0; q < 3; q++) {
                dt_tensor_free(parts[q]);
                parts[q] = NULL;
            }
            one = one && dt_split(x, 3, NULL, -1, &req, parts) == DT_OK;
            for (int q = 0; one && q < 3; q++) {
                for (int64_t r = 0; r < 5; r++)
                    for (int64_t c = 0; c < 2; c++)
                        ref[r * 2 + c] = get(dt, hx, r * 6 + q * 2 + c);
                one = matches(parts[q], dt, ref, 10, 0) &&
                      dt_layout_equal(dt_tensor_layout(parts[q]), req.layout);
            }
            for (int q = 0; q < 3; q++)
                dt_tensor_free(parts[q]);
            if (!one && ok_sp)
                snprintf(bad, sizeof bad, " (split: %s)", dt_last_error());
            ok_sp = ok_sp && one;
            /* pad: 1 row before, 2 after, 3 columns after */
            const int64_t before[2] = {1, 0}, after[2] = {2, 3};
            for (int64_t r = 0; r < 8; r++)
                for (int64_t c = 0; c < 9; c++)
                    ref[r * 9 + c] = r >= 1 && r < 6 && c < 6 ? get(dt, hx, (r - 1) * 6 + c) : cval;
            for (int rq = 0; rq < 2; rq++) {
                one = x && dt_pad(x, before, after, cval, rq ? &req : NULL, &y) == DT_OK &&
                      (!rq || dt_layout_equal(dt_tensor_layout(y), req.layout)) &&
                      matches(y, dt, ref, 72, 0);
                if (!one && ok_pad)
                    snprintf(bad, sizeof bad, " (pad: %s)", dt_last_error());
                ok_pad = ok_pad && one;
                dt_tensor_free(y);
                y = NULL;
            }
            /* tile */
            const int64_t mults[3][2] = {{2, 3}, {1, 2}, {3, 1}};
            for (int t = 0; t < 3; t++) {
                int64_t R = 5 * mults[t][0], C = 6 * mults[t][1];
                for (int64_t r = 0; r < R; r++)
                    for (int64_t c = 0; c < C; c++)
                        ref[r * C + c] = get(dt, hx, (r % 5) * 6 + c % 6);
                one = x && dt_tile(x, mults[t], t == 2 ? &req : NULL, &y) == DT_OK &&
                      matches(y, dt, ref, R * C, 0);
                if (!one && ok_tile)
                    snprintf(bad, sizeof bad, " (tile %lldx%lld: %s)", (long long)mults[t][0],
                             (long long)mults[t][1], dt_last_error());
                ok_tile = ok_tile && one;
                dt_tensor_free(y);
                y = NULL;
            }
            /* expand_dims: the old axes keep their sharding, nothing moves */
            for (int axis = -1; axis < 3; axis++) {
                int ax = axis < 0 ? 2 : axis;
                one = x && dt_expand_dims(x, axis, NULL, &y) == DT_OK && dt_tensor_rank(y) == 3 &&
                      dt_tensor_shape(y)[ax] == 1;
                for (int q = 0, j = 0; one && q < 3; q++)
                    if (q != ax)
                        one = dt_tensor_layout(y)->axes[q] == ls[i].axes[j++];
                for (int64_t k = 0; one && k < 30; k++)
                    ref[k] = get(dt, hx, k);
                one = one && matches(y, dt, ref, 30, 0);
                if (!one && ok_ed)
                    snprintf(bad, sizeof bad, " (expand_dims %d: %s)", axis, dt_last_error());
                ok_ed = ok_ed && one;
                dt_tensor_free(y);
                y = NULL;
            }
            dt_tensor_free(x);
        }
        /* broadcast_to: [5, 1] -> [4, 5, 6] and [6] -> [5, 6], every layout of the operand */
        dt_layout l1[MAX_LAYOUTS];
        int n1 = layouts_for(m, 1, dt, l1);
        const int64_t s51[2] = {5, 1}, s6[1] = {6}, to3[3] = {4, 5, 6};
        for (int64_t k = 0; k < 120; k++)
            ref[k] = get(dt, hx, (k / 6) % 5);
        for (int i = 0; i < n; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i, 3))
                continue;
            dt_tensor *x = make_tensor(&ls[i], dt, 2, s51, hx), *y = NULL;
            dt_op_options r3 = {.layout = &l3[(i * 5 + 2) % n3]};
            bool one = x && dt_broadcast_to(x, 3, to3, i % 2 ? &r3 : NULL, &y) == DT_OK &&
                       (i % 2 == 0 || dt_layout_equal(dt_tensor_layout(y), r3.layout)) &&
                       matches(y, dt, ref, 120, 0);
            if (!one && ok_bc)
                snprintf(bad, sizeof bad, " (broadcast_to [5,1]: %s)", dt_last_error());
            ok_bc = ok_bc && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
        }
        for (int64_t k = 0; k < 30; k++)
            ref[k] = get(dt, hy, k % 6);
        for (int i = 0; i < n1; i++) {
            if (!pick_every(o, i + d, 3))
                continue;
            dt_tensor *x = make_tensor(&l1[i], dt, 1, s6, hy), *y = NULL;
            bool one =
                x && dt_broadcast_to(x, 2, sh, NULL, &y) == DT_OK && matches(y, dt, ref, 30, 0);
            if (!one && ok_bc)
                snprintf(bad, sizeof bad, " (broadcast_to [6]: %s)", dt_last_error());
            ok_bc = ok_bc && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
        }
        /* squeeze [5, 1, 6] (its middle axis sharded in some layouts) by axis and all */
        const int64_t s516[3] = {5, 1, 6};
        for (int64_t k = 0; k < 30; k++)
            ref[k] = get(dt, hx, k);
        for (int i = 0; i < n3; i++) {
            if ((narrow(dt) && i % 2) || !pick_every(o, i, 3))
                continue;
            dt_tensor *x = make_tensor(&l3[i], dt, 3, s516, hx), *y = NULL, *z = NULL;
            const int ax1[1] = {-2};
            bool one = x && dt_squeeze(x, 1, ax1, NULL, &y) == DT_OK && dt_tensor_rank(y) == 2 &&
                       matches(y, dt, ref, 30, 0) && dt_squeeze(x, 0, NULL, NULL, &z) == DT_OK &&
                       dt_tensor_rank(z) == 2 && matches(z, dt, ref, 30, 0);
            if (one && l3[i].axes[1] == DT_UNSHARDED) /* metadata only: the others stay */
                one = dt_tensor_layout(y)->axes[0] == l3[i].axes[0] &&
                      dt_tensor_layout(y)->axes[1] == l3[i].axes[2];
            if (!one && ok_sq)
                snprintf(bad, sizeof bad, " (squeeze: %s)", dt_last_error());
            ok_sq = ok_sq && one;
            dt_tensor_free(x);
            dt_tensor_free(y);
            dt_tensor_free(z);
        }
        const char *dn = dt_dtype_name(dt);
        DIFF_REPORT(ok_st, "stack %s of 3 [5,6] on axes -1..2: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_sp, "split %s [5,6] into [2,3] rows and 3 column pieces: %d layouts%s", dn,
                    n, bad);
        DIFF_REPORT(ok_pad, "pad %s [5,6] by (1,2),(0,3): %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_tile, "tile %s [5,6] by 2x3, 1x2, 3x1: %d layouts%s", dn, n, bad);
        DIFF_REPORT(ok_bc, "broadcast_to %s [5,1] -> [4,5,6], [6] -> [5,6]: all layouts%s", dn,
                    bad);
        DIFF_REPORT(ok_ed, "expand_dims %s [5,6] on axes -1..2 (metadata only): %d layouts%s", dn,
                    n, bad);
        DIFF_REPORT(ok_sq, "squeeze %s [5,1,6]: %d layouts%s", dn, n3, bad);
    }
    /* refused clearly */
    dt_layout l;
    dt_layout_replicated(m, 2, &l);
    double h[30] = {0};
    dt_tensor *x = make_tensor(&l, DT_DTYPE_F32, 2, sh, h), *y = NULL, *parts[4] = {0};
    bool ok = x;
    ok = ok && dt_split(x, 4, NULL, 0, NULL, parts) == DT_ERR_SHAPE && !parts[0];
    ok = ok && dt_squeeze(x, 1, (const int[]){0}, NULL, &y) == DT_ERR_SHAPE && !y &&
         strstr(dt_last_error(), "extent 5");
    ok = ok &&
         dt_pad(x, (const int64_t[]){-1, 0}, (const int64_t[]){0, 0}, 0, NULL, &y) == DT_ERR_ARG &&
         !y;
    ok = ok && dt_tile(x, (const int64_t[]){-1, 2}, NULL, &y) == DT_ERR_ARG && !y;
    ok = ok && dt_broadcast_to(x, 2, (const int64_t[]){4, 6}, NULL, &y) == DT_ERR_SHAPE && !y;
    ok = ok && dt_expand_dims(x, 4, NULL, &y) == DT_ERR_ARG && !y;
    double hi[6] = {0};
    dt_tensor *fi = make_tensor(&l, DT_DTYPE_F32, 2, (const int64_t[]){2, 3}, hi);
    ok = ok && fi && dt_gather(x, fi, NULL, &y) == DT_ERR_DTYPE && !y &&
         strstr(dt_last_error(), "expected i32 or i64");
    ok = ok && fi && dt_one_hot(fi, 3, 1, 0, -1, DT_DTYPE_F32, NULL, &y) == DT_ERR_DTYPE && !y;
    DIFF_REPORT(ok, "shape ops: bad arguments fail clearly (%s)", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(fi);
}

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
