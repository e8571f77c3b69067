/* CPU local kernels: the (kernel, dtype) table. Reference loops, OpenBLAS for f32/f64 gemm.
 * Kernels see local shapes only (plus global offsets for index-dependent values). */
#include "dt.h"
#include "philox.h"
#include "unary.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *dt__kernel_name(dt__kernel k)
{
    static const char *const names[] = {
#define KNAME(NAME, name) [DT__K_##NAME] = #name,
        DT__KERNEL_LIST(KNAME)
#undef KNAME
    };
    return (unsigned)k < DT__KERNEL_COUNT ? names[k] : "?";
}

/* ---- index helpers ----------------------------------------------------------------------- */

/* Advance a row-major multi-index; false after the last. */
static bool next_index(int rank, const int64_t shape[], int64_t idx[])
{
    for (int i = rank - 1; i >= 0; i--) {
        if (++idx[i] < shape[i])
            return true;
        idx[i] = 0;
    }
    return false;
}

static void strides_of(int rank, const int64_t shape[], int64_t st[])
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

/* ---- typed kernels ----------------------------------------------------------------------- */

#define DEFINE_KERNELS(T, NAME, IS_FLOAT, LOWEST, HIGHEST)                                         \
    static void fill_##NAME(const dt__kargs *k, const void *const in[], void *out)                 \
    {                                                                                              \
        (void)in;                                                                                  \
        T *o = out, v = (T)k->a;                                                                   \
        int64_t n = dt__num_elements(k->rank, k->shape);                                           \
        for (int64_t i = 0; i < n; i++)                                                            \
            o[i] = v;                                                                              \
    }                                                                                              \
    static void arange_##NAME(const dt__kargs *k, const void *const in[], void *out)               \
    {                                                                                              \
        (void)in;                                                                                  \
        T *o = out;                                                                                \
        for (int64_t i = 0; i < k->shape[0]; i++)                                                  \
            o[i] = (T)(k->a + k->b * (double)(k->offset[0] + i));                                  \
    }                                                                                              \
    static void random_##NAME(const dt__kargs *k, void *out, bool normal)                          \
    {                                                                                              \
        T *o = out;                                                                                \
        int64_t n = dt__num_elements(k->rank, k->shape), gst[DT_MAX_RANK], idx[DT_MAX_RANK] = {0}; \
        strides_of(k->rank, k->gshape, gst);                                                       \
        for (int64_t i = 0; i < n; i++) {                                                          \
            uint64_t e = 0;                                                                        \
            for (int a = 0; a < k->rank; a++)                                                      \
                e += (uint64_t)(k->offset[a] + idx[a]) * (uint64_t)gst[a];                         \
            double u = dt__random_value(normal, sizeof(T) == 8, k->seed, k->key, e);               \
            o[i] = (T)dt__random_scale(normal, k->a, k->b, u);                                     \
            next_index(k->rank, k->shape, idx);                                                    \
        }                                                                                          \
    }                                                                                              \
    static void philox_uniform_##NAME(const dt__kargs *k, const void *const in[], void *out)       \
    {                                                                                              \
        (void)in;                                                                                  \
        random_##NAME(k, out, false);                                                              \
    }                                                                                              \
    static void philox_normal_##NAME(const dt__kargs *k, const void *const in[], void *out)        \
    {                                                                                              \
        (void)in;                                                                                  \
        random_##NAME(k, out, true);                                                               \
    }                                                                                              \
    static void unary_##NAME(const dt__kargs *k, const void *const in[], void *out)                \
    {                                                                                              \
        const T *x = in[0];                                                                        \
        T *o = out;                                                                                \
        int64_t n = dt__num_elements(k->rank, k->shape);                                           \
        switch ((dt_unary_op)k->op) {                                                              \
        case DT_UNARY_NEG:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = DT__NEG(x[i]);                                                              \
            break;                                                                                 \
        case DT_UNARY_ABS:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] < 0 ? DT__NEG(x[i]) : x[i];                                            \
            break;                                                                                 \
        case DT_UNARY_RELU:                                                                        \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = x[i] > 0 ? x[i] : (T)0;                                                     \
            break;                                                                                 \
        case DT_UNARY_SQUARE:                                                                      \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = DT__MUL(x[i], x[i]);                                                        \
            break;                                                                                 \
        default:                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = (T)dt__unary_f(k->op, (double)x[i]);                                        \
        }                                                                                          \
    }                                                                                              \
    /* numpy's divmod: the quotient rounded towards minus infinity and the remainder with the      \
     * divisor's sign; floats through the exact fmod (as npy_divmod), so that 1 // 0.1 is 9;       \
     * an integer divisor of 0 gives 0 and 0 (as the integer DIV)                                  \
     */                                                                                            \
    static T floor_divmod_##NAME(T a, T b, T *mod)                                                 \
    {                                                                                              \
        if (!IS_FLOAT && b == 0) {                                                                 \
            *mod = 0;                                                                              \
            return 0;                                                                              \
        }                                                                                          \
        if (!IS_FLOAT) {                                                                           \
            T q = b == (T)-1 ? DT__NEG(a) : (T)(a / b);                                            \
            T r = DT__SUB(a, DT__MUL(q, b));                                                       \
            bool fix = r != 0 && (r < 0) != (b < 0);                                               \
            *mod = fix ? DT__ADD(r, b) : r;                                                        \
            return fix ? DT__SUB(q, (T)1) : q;                                                     \
        }                                                                                          \
        T m = (T)fmod((double)a, (double)b);                                                       \
        if (b == 0) {                                                                              \
            *mod = m;                                                                              \
            return (T)(a / b);                                                                     \
        }                                                                                          \
        T div = (T)((a - m) / b);                                                                  \
        if (m != 0 && (b < 0) != (m < 0)) {                                                        \
            m = (T)(m + b);                                                                        \
            div = (T)(div - (T)1);                                                                 \
        }                                                                                          \
        *mod = m != 0 ? m : (T)copysign(0.0, (double)b);                                           \
        if (div == 0)                                                                              \
            return (T)copysign(0.0, (double)(a / b));                                              \
        T fl = (T)floor((double)div);                                                              \
        return div - fl > (T)0.5 ? (T)(fl + (T)1) : fl;                                            \
    }                                                                                              \
    static T binary_one_##NAME(int op, T a, T b)                                                   \
    {                                                                                              \
        switch ((dt_binary_op)op) {                                                                \
        case DT_BINARY_ADD:                                                                        \
            return DT__ADD(a, b);                                                                  \
        case DT_BINARY_SUB:                                                                        \
            return DT__SUB(a, b);                                                                  \
        case DT_BINARY_MUL:                                                                        \
            return DT__MUL(a, b);                                                                  \
        case DT_BINARY_DIV:                                                                        \
            return IS_FLOAT ? (T)(a / b) : b == 0 ? (T)0 : b == (T)-1 ? DT__NEG(a) : (T)(a / b);   \
        case DT_BINARY_MAX:                                                                        \
            return a > b ? a : b;                                                                  \
        case DT_BINARY_MIN:                                                                        \
            return a < b ? a : b;                                                                  \
        case DT_BINARY_POW:                                                                        \
            return (T)pow((double)a, (double)b);                                                   \
        case DT_BINARY_EQ:                                                                         \
            return (T)(a == b);                                                                    \
        case DT_BINARY_NE:                                                                         \
            return (T)(a != b);                                                                    \
        case DT_BINARY_LT:                                                                         \
            return (T)(a < b);                                                                     \
        case DT_BINARY_LE:                                                                         \
            return (T)(a <= b);                                                                    \
        case DT_BINARY_GT:                                                                         \
            return (T)(a > b);                                                                     \
        case DT_BINARY_GE:                                                                         \
            return (T)(a >= b);                                                                    \
        case DT_BINARY_FLOORDIV:                                                                   \
        case DT_BINARY_FLOORMOD: {                                                                 \
            T mod, div = floor_divmod_##NAME(a, b, &mod);                                          \
            return op == DT_BINARY_FLOORDIV ? div : mod;                                           \
        }                                                                                          \
        default:                                                                                   \
            return a;                                                                              \
        }                                                                                          \
    }                                                                                              \
    static void binary_##NAME(const dt__kargs *k, const void *const in[], void *out)               \
    {                                                                                              \
        const T *a = in[0], *b = in[1];                                                            \
        T *o = out;                                                                                \
        int r = k->rank;                                                                           \
        int64_t n = dt__num_elements(r, k->shape);                                                 \
        bool same = true;                                                                          \
        for (int i = 0; i < r; i++)                                                                \
            same = same && k->in_shape[0][i] == k->shape[i] && k->in_shape[1][i] == k->shape[i];   \
        if (same) {                                                                                \
            for (int64_t i = 0; i < n; i++)                                                        \
                o[i] = binary_one_##NAME(k->op, a[i], b[i]);                                       \
            return;                                                                                \
        }                                                                                          \
        int64_t sa[DT_MAX_RANK], sb[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};                          \
        strides_of(r, k->in_shape[0], sa);                                                         \
        strides_of(r, k->in_shape[1], sb);                                                         \
        for (int i = 0; i < r; i++) {                                                              \
            if (k->in_shape[0][i] == 1)                                                            \
                sa[i] = 0;                                                                         \
            if (k->in_shape[1][i] == 1)                                                            \
                sb[i] = 0;                                                                         \
        }                                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                          \
            int64_t ia = 0, ib = 0;                                                                \
            for (int q = 0; q < r; q++) {                                                          \
                ia += idx[q] * sa[q];                                                              \
                ib += idx[q] * sb[q];                                                              \
            }                                                                                      \
            o[i] = binary_one_##NAME(k->op, a[ia], b[ib]);                                         \
            next_index(r, k->shape, idx);                                                          \
        }                                                                                          \
    }                                                                                              \
    /* out has in's rank with reduced axes (k->mask) of extent 1. */                               \
    static void reduce_##NAME(const dt__kargs *k, const void *const in[], void *out)               \
    {                                                                                              \
        const T *x = in[0];                                                                        \
        T *o = out;                                                                                \
        int r = k->rank;                                                                           \
        int64_t no = dt__num_elements(r, k->shape), ni = dt__num_elements(r, k->in_shape[0]);      \
        int64_t so[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};                                           \
        strides_of(r, k->shape, so);                                                               \
        for (int i = 0; i < r; i++)                                                                \
            if (k->mask & (1u << i))                                                               \
                so[i] = 0;                                                                         \
        T init = k->op == DT_REDUCE_MAX ? LOWEST : k->op == DT_REDUCE_MIN ? HIGHEST : (T)0;        \
        for (int64_t i = 0; i < no; i++)                                                           \
            o[i] = init;                                                                           \
        for (int64_t i = 0; i < ni; i++) {                                                         \
            int64_t io = 0;                                                                        \
            for (int q = 0; q < r; q++)                                                            \
                io += idx[q] * so[q];                                                              \
            T v = x[i];                                                                            \
            if (k->op == DT_REDUCE_MAX)                                                            \
                o[io] = v > o[io] ? v : o[io];                                                     \
            else if (k->op == DT_REDUCE_MIN)                                                       \
                o[io] = v < o[io] ? v : o[io];                                                     \
            else                                                                                   \
                o[io] = DT__ADD(o[io], v);                                                         \
            next_index(r, k->in_shape[0], idx);                                                    \
        }                                                                                          \
        if (k->a != 1.0)                                                                           \
            for (int64_t i = 0; i < no; i++)                                                       \
                o[i] = (T)(o[i] * k->a);                                                           \
    }                                                                                              \
    static void transpose_##NAME(const dt__kargs *k, const void *const in[], void *out)            \
    {                                                                                              \
        const T *x = in[0];                                                                        \
        T *o = out;                                                                                \
        int r = k->rank;                                                                           \
        int64_t n = dt__num_elements(r, k->shape), si[DT_MAX_RANK], sp[DT_MAX_RANK],               \
                idx[DT_MAX_RANK] = {0};                                                            \
        strides_of(r, k->in_shape[0], si);                                                         \
        for (int i = 0; i < r; i++)                                                                \
            sp[i] = si[k->perm[i]];                                                                \
        for (int64_t i = 0; i < n; i++) {                                                          \
            int64_t ii = 0;                                                                        \
            for (int q = 0; q < r; q++)                                                            \
                ii += idx[q] * sp[q];                                                              \
            o[i] = x[ii];                                                                          \
            next_index(r, k->shape, idx);                                                          \
        }                                                                                          \
    }                                                                                              \
    static void select_fill_##NAME(const dt__kargs *k, const void *const in[], void *out)          \
    {                                                                                              \
        int64_t n = dt__num_elements(k->rank, k->shape);                                           \
        if (k->select) {                                                                           \
            if (n)                                                                                 \
                memcpy(out, in[0], (size_t)n * sizeof(T));                                         \
            return;                                                                                \
        }                                                                                          \
        T *o = out;                                                                                \
        for (int64_t i = 0; i < n; i++)                                                            \
            o[i] = (T)k->a;                                                                        \
    }

DEFINE_KERNELS(float, f32, 1, -INFINITY, INFINITY)
DEFINE_KERNELS(double, f64, 1, -INFINITY, INFINITY)
DEFINE_KERNELS(int32_t, i32, 0, INT32_MIN, INT32_MAX)
DEFINE_KERNELS(int64_t, i64, 0, INT64_MIN, INT64_MAX)

/* ---- gemm: C[b] = op(A[b]) op(B[b]), row-major; op = transpose when ta / tb -------------- */

#define GEMM_REF(T, NAME)                                                                \
    static void gemm_##NAME(const dt__kargs *k, const void *const in[], void *out)       \
    {                                                                                    \
        const T *A = in[0], *B = in[1];                                                  \
        T *C = out;                                                                      \
        int64_t m = k->m, n = k->n, kk = k->k;                                           \
        for (int64_t b = 0; b < k->batch; b++) {                                         \
            const T *a = A + b * k->a_batch_stride, *bb = B + b * k->b_batch_stride;     \
            T *c = C + b * m * n;                                                        \
            for (int64_t i = 0; i < m; i++)                                              \
                for (int64_t j = 0; j < n; j++) {                                        \
                    T s = 0;                                                             \
                    for (int64_t q = 0; q < kk; q++)                                     \
                        s = DT__ADD(s, DT__MUL(k->ta ? a[q * m + i] : a[i * kk + q],     \
                                               k->tb ? bb[j * kk + q] : bb[q * n + j])); \
                    c[i * n + j] = s;                                                    \
                }                                                                        \
        }                                                                                \
    }
GEMM_REF(int32_t, i32)
GEMM_REF(int64_t, i64)

#define GEMM_BLAS(T, NAME, FN)                                                                  \
    static void gemm_##NAME(const dt__kargs *k, const void *const in[], void *out)              \
    {                                                                                           \
        const T *A = in[0], *B = in[1];                                                         \
        T *C = out;                                                                             \
        int64_t m = k->m, n = k->n, kk = k->k;                                                  \
        if (m == 0 || n == 0)                                                                   \
            return;                                                                             \
        if (kk == 0) {                                                                          \
            memset(C, 0, (size_t)(k->batch * m * n) * sizeof(T));                               \
            return;                                                                             \
        }                                                                                       \
        for (int64_t b = 0; b < k->batch; b++)                                                  \
            FN(CblasRowMajor, k->ta ? CblasTrans : CblasNoTrans,                                \
               k->tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)kk, 1,       \
               A + b * k->a_batch_stride, (blasint)(k->ta ? m : kk), B + b * k->b_batch_stride, \
               (blasint)(k->tb ? kk : n), 0, C + b * m * n, (blasint)n);                        \
    }
GEMM_BLAS(float, f32, cblas_sgemm)
GEMM_BLAS(double, f64, cblas_dgemm)

/* ---- copy blocks (dtype-independent: element size from the table's dtype) ---------------- */

#define COPY_BLOCKS(T, NAME)                                                                       \
    static void copy_blocks_##NAME(const dt__kargs *k, const void *const in[], void *out)          \
    {                                                                                              \
        for (int i = 0; i < k->nblocks; i++) {                                                     \
            const dt__block *b = &k->blocks[i];                                                    \
            int rr = b->rank;                                                                      \
            const int64_t *ss = b->src_shape, *ds = b->dst_shape, *ex = b->extent;                 \
            if (dt__num_elements(rr, ex) == 0)                                                     \
                continue;                                                                          \
            dt__copy_block((T *)out + b->dst_at, ds, b->dst_off, (const T *)in[0] + b->src_at, ss, \
                           b->src_off, ex, rr, sizeof(T));                                         \
        }                                                                                          \
    }
COPY_BLOCKS(float, f32)
COPY_BLOCKS(double, f64)
COPY_BLOCKS(int32_t, i32)
COPY_BLOCKS(int64_t, i64)

/* The table's entries: each loop above behind the kernel signature (CPU kernels finish
 * before they return and cannot fail). */
#define WRAP(NAME, name, ctype)                                                 \
    static dt_status cpu_##NAME##_##name(const dt__kctx *x, const dt__kargs *k, \
                                         const void *const in[], void *out)     \
    {                                                                           \
        (void)x;                                                                \
        NAME##_##name(k, in, out);                                              \
        return DT_OK;                                                           \
    }
#define WRAP_ALL(NAME) \
    WRAP(NAME, f32, float) WRAP(NAME, f64, double) WRAP(NAME, i32, int32_t) WRAP(NAME, i64, int64_t)
#define WRAP_KERNEL(NAME, name) WRAP_ALL(name)
DT__KERNEL_LIST(WRAP_KERNEL)

#define ROW(NAME)                                                         \
    [DT_DTYPE_F32] = cpu_##NAME##_f32, [DT_DTYPE_F64] = cpu_##NAME##_f64, \
    [DT_DTYPE_I32] = cpu_##NAME##_i32, [DT_DTYPE_I64] = cpu_##NAME##_i64

const dt__kernel_fn dt__cpu_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {
    [DT__K_FILL] = {ROW(fill)},
    [DT__K_ARANGE] = {ROW(arange)},
    [DT__K_PHILOX_UNIFORM] = {ROW(philox_uniform)},
    [DT__K_PHILOX_NORMAL] = {ROW(philox_normal)},
    [DT__K_UNARY] = {ROW(unary)},
    [DT__K_BINARY] = {ROW(binary)},
    [DT__K_REDUCE] = {ROW(reduce)},
    [DT__K_GEMM] = {ROW(gemm)},
    [DT__K_TRANSPOSE] = {ROW(transpose)},
    [DT__K_COPY_BLOCKS] = {ROW(copy_blocks)},
    [DT__K_SELECT_FILL] = {ROW(select_fill)},
};
