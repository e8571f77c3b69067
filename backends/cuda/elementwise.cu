/* CUDA elementwise kernels: fill, arange, Philox random numbers, unary, binary (broadcasting;
 * comparisons write bool), cast and where, for every dtype the CPU's table takes, element for
 * element as the CPU reference computes (backends/cpu/kernels.c). Queued on the device's stream;
 * nothing here waits, allocates or changes the current GPU.
 *
 * Integer sums, differences and products wrap; the elementary functions of unary ops on f32,
 * bf16 and f16 are CUDA's float functions (within 2 ulps, as the CPU's SLEEF functions are
 * within 1: the backends agree within a few ulps, common/unary.h), the composite ones and pow
 * are computed in double and rounded once (CUDA's exp, log, tanh, pow may differ from glibc's
 * in the last bit of a double); random numbers come from common/philox.h with nvcc's --fmad=false,
 * so they are bitwise the CPU's. */
#include "common.cuh"
#include "unary.h"

namespace dtcuda
{
namespace
{

/* ---- arange, random ------------------------------------------------------------------------- */

template <typename S> __global__ void arange_k(S *o, int64_t n, double a, double b, int64_t off)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = Ty<S>::from_d(a + b * (double)(off + i));
}

/* A random block is a set of rows along its innermost axis: row r's elements are len
 * consecutive global indices from row_start(r). A work item is one Philox block of a row (the
 * 1, 2 or 4 elements a block gives: common/philox.h), so each block is computed once; a row
 * that starts or ends inside a block shares it with its neighbour item. */
struct RandArgs {
    int rank;
    int64_t shape[R];    /* the local block */
    int64_t offset[R];   /* global index of its first element */
    uint64_t gstride[R]; /* row-major strides of the global shape */
    uint64_t seed, key;
    double a, b;
    int64_t len;   /* elements of a row: the innermost local extent (1 for a scalar) */
    int64_t nbr;   /* blocks a row can touch */
    int64_t items; /* rows * nbr */
};

RandArgs plan_random(const dt__kargs *k, bool normal, bool wide)
{
    RandArgs r{};
    int64_t gst[R];
    strides_of(k->rank, k->gshape, gst);
    r.rank = k->rank;
    for (int a = 0; a < k->rank; a++) {
        r.shape[a] = k->shape[a];
        r.offset[a] = k->offset[a];
        r.gstride[a] = (uint64_t)gst[a];
    }
    r.seed = k->seed;
    r.key = k->key;
    r.a = k->a;
    r.b = k->b;
    r.len = k->rank ? k->shape[k->rank - 1] : 1;
    int64_t per = dt__random_per_block(normal, wide),
            rows = r.len ? elems(k->rank, k->shape) / r.len : 0;
    r.nbr = (r.len + 2 * (per - 1)) / per;
    r.items = rows * r.nbr;
    return r;
}

/* Item t: block kb of its row; its elements inside the row, each from the shared conversion of
 * the block's words (bitwise the CPU's per-element dt__random_value); f64 takes the 53-bit
 * stream, the others the f32 stream (rounded to f32 first, then to the 16-bit type, as the CPU
 * does). */
template <typename S, bool NORMAL> HD void random_item(const RandArgs &r, int64_t t, S *o)
{
    constexpr bool wide = sizeof(S) == 8;
    constexpr int per = NORMAL ? (wide ? 1 : 2) : (wide ? 2 : 4); /* dt__random_per_block */
    int64_t row = t / r.nbr, kb = t % r.nbr, rest = row;
    uint64_t g0 = r.rank ? (uint64_t)r.offset[r.rank - 1] : 0;
    UNROLL
    for (int q = R - 2; q >= 0; q--)
        if (q < r.rank - 1) {
            g0 += (uint64_t)(r.offset[q] + rest % r.shape[q]) * r.gstride[q];
            rest /= r.shape[q];
        }
    uint64_t blk = g0 / (uint64_t)per + (uint64_t)kb, e0 = blk * (uint64_t)per;
    uint64_t end = g0 + (uint64_t)r.len;
    if (e0 >= end)
        return;
    uint32_t w[4];
    dt__philox_block(r.seed, r.key, blk, w);
    for (int k = 0; k < per; k++) {
        uint64_t e = e0 + (uint64_t)k;
        if (e < g0 || e >= end)
            continue;
        double v = dt__random_scale(NORMAL, r.a, r.b, dt__random_from_block(NORMAL, wide, w, k));
        o[row * r.len + (int64_t)(e - g0)] = Ty<S>::from_d(wide ? v : (double)(float)v);
    }
}

template <typename S, bool NORMAL> __global__ void random_k(S *o, RandArgs r)
{
    for (int64_t t = first_index(); t < r.items; t += grid_step())
        random_item<S, NORMAL>(r, t, o);
}

/* A block whose elements are consecutive global indices g0, g0 + 1, ... (every axis but the
 * first whole: a shard of rows, or a whole tensor): work item t is Philox block
 * g0 / PER + t, its PER values stored at once as one vector when the block lies inside and its
 * destination is aligned (I: the index type, unsigned 32 bits when the items fit, so that
 * the index plus the grid's step stays below 2^32). Element for element the values of
 * random_item. */
template <typename S, bool NORMAL, typename I>
__global__ void random_run_k(S *o, uint64_t seed, uint64_t key, double a, double b, uint64_t g0,
                             I n, I items)
{
    constexpr bool wide = sizeof(S) == 8;
    constexpr int per = NORMAL ? (wide ? 1 : 2) : (wide ? 2 : 4);
    using V = Bits<S>[per];
    struct alignas(sizeof(Bits<S>) * per) Pack {
        V v;
    };
    const uint64_t first = g0 / per;
    for (I t = (I)first_index(); t < items; t += (I)grid_step()) {
        uint64_t blk = first + (uint64_t)t;
        int64_t at = (int64_t)(blk * per - g0); /* the block's first element, may be < 0 */
        uint32_t w[4];
        dt__philox_block(seed, key, blk, w);
        S v[per];
        UNROLL
        for (int k = 0; k < per; k++) {
            double u = dt__random_scale(NORMAL, a, b, dt__random_from_block(NORMAL, wide, w, k));
            v[k] = Ty<S>::from_d(wide ? u : (double)(float)u);
        }
        if (per > 1 && at >= 0 && at + per <= (int64_t)n &&
            (uintptr_t)(o + at) % sizeof(Pack) == 0) {
            Pack p;
            memcpy(&p, v, sizeof p);
            *(Pack *)(o + at) = p;
            continue;
        }
        UNROLL
        for (int k = 0; k < per; k++)
            if (at + k >= 0 && at + k < (int64_t)n)
                o[at + k] = v[k];
    }
}

/* ---- unary ---------------------------------------------------------------------------------- */

/* NEG, ABS, RELU, SQUARE in the compute type (integers wrap); the elementary functions of the
 * f32, bf16 and f16 elements in float, as the CPU computes them (common/unary.h); the rest
 * through double. */
template <typename S> HD S unary_one(int op, S s)
{
    using C = Cof<S>;
    C x = Ty<S>::ld(s);
    switch ((dt_unary_op)op) {
    case DT_UNARY_NEG:
        return Ty<S>::st(wneg(x));
    case DT_UNARY_ABS:
        return Ty<S>::st(is_neg(x) ? wneg(x) : x);
    case DT_UNARY_RELU:
        return Ty<S>::st(x > 0 ? x : (C)0);
    case DT_UNARY_SQUARE:
        return Ty<S>::st(wmul(x, x));
    default:
        if constexpr (std::is_same<C, float>::value)
            if (dt__unary_in_float(op))
                return Ty<S>::st(dt__unary_float(op, x));
        return Ty<S>::from_d(dt__unary_f(op, (double)x));
    }
}

template <typename S> __global__ void unary_k(const S *x, S *o, int64_t n, int op)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = unary_one<S>(op, x[i]);
}

/* ---- binary --------------------------------------------------------------------------------- */

/* pow((double)a, (double)b), as the CPU computes it. glibc's pow is exact whenever the power is
 * a representable integer (and correctly rounded in practice), CUDA's only within 2 ulps, which
 * truncation to an integer dtype would show (80.99999999999999 -> 80): for integer operands
 * whose power is an integer below 2^64 in magnitude, that integer rounded once. */
template <typename C> HD double pow_of(C a, C b)
{
    double da = (double)a, db = (double)b;
    if constexpr (!std::is_floating_point<C>::value) {
        /* |a| <= 1 and b < 0 are exact in CUDA's pow (IEEE special cases; 1 / a^-b is no
         * integer); b > 64 with |a| >= 2 is out of every integer range anyway. */
        if (fabs(da) >= 2.0 && db >= 0.0 && db <= 64.0) {
            uint64_t base = (uint64_t)fabs(da), mag = 1;
            int e = (int)db, i = 0;
            for (; i < e && mag <= UINT64_MAX / base; i++)
                mag *= base;
            if (i == e) {
                double p = (double)mag;
                return da < 0 && (e & 1) ? -p : p;
            }
        }
    }
    return pow(da, db);
}

/* numpy's divmod, as the CPU's floor_divmod: the quotient rounded towards minus infinity and
 * the remainder with the divisor's sign; floats through the exact fmod; an integer divisor of
 * 0 gives 0 and 0. */
template <typename C> HD C floor_divmod(C a, C b, C *mod)
{
    if constexpr (!std::is_floating_point<C>::value) {
        if (b == 0) {
            *mod = 0;
            return 0;
        }
        C q = std::is_signed<C>::value && b == (C)-1 ? wneg(a) : (C)(a / b);
        C r = wsub(a, wmul(q, b));
        bool fix = r != 0 && is_neg(r) != is_neg(b);
        *mod = fix ? wadd(r, b) : r;
        return fix ? wsub(q, (C)1) : q;
    } else {
        C m = (C)fmod((double)a, (double)b);
        if (b == 0) {
            *mod = m;
            return (C)(a / b);
        }
        C div = (C)((a - m) / b);
        if (m != 0 && (b < 0) != (m < 0)) {
            m = (C)(m + b);
            div = (C)(div - (C)1);
        }
        *mod = m != 0 ? m : (C)copysign(0.0, (double)b);
        if (div == 0)
            return (C)copysign(0.0, (double)(a / b));
        C fl = (C)floor((double)div);
        return div - fl > (C)0.5 ? (C)(fl + (C)1) : fl;
    }
}

/* The CPU's binary_one, in the compute type; comparisons and logical ops give 0 or 1. */
template <typename C> HD C binary_one(int op, C a, C b)
{
    switch ((dt_binary_op)op) {
    case DT_BINARY_ADD:
        return wadd(a, b);
    case DT_BINARY_SUB:
        return wsub(a, b);
    case DT_BINARY_MUL:
        return wmul(a, b);
    case DT_BINARY_DIV:
        if constexpr (std::is_floating_point<C>::value)
            return a / b;
        else
            return b == 0 ? (C)0 : std::is_signed<C>::value && b == (C)-1 ? wneg(a) : (C)(a / b);
    case DT_BINARY_MAX: /* numpy's maximum and minimum: a NaN operand gives NaN */
        return a > b || is_nan(a) ? a : b;
    case DT_BINARY_MIN:
        return a < b || is_nan(a) ? a : b;
    case DT_BINARY_EQ:
        return (C)(a == b);
    case DT_BINARY_NE:
        return (C)(a != b);
    case DT_BINARY_LT:
        return (C)(a < b);
    case DT_BINARY_LE:
        return (C)(a <= b);
    case DT_BINARY_GT:
        return (C)(a > b);
    case DT_BINARY_GE:
        return (C)(a >= b);
    case DT_BINARY_FLOORDIV:
    case DT_BINARY_FLOORMOD: {
        C mod, div = floor_divmod(a, b, &mod);
        return op == DT_BINARY_FLOORDIV ? div : mod;
    }
    case DT_BINARY_LOGICAL_AND:
        return (C)(a != 0 && b != 0);
    case DT_BINARY_LOGICAL_OR:
        return (C)(a != 0 || b != 0);
    case DT_BINARY_LOGICAL_XOR:
        return (C)((a != 0) != (b != 0));
    default:
        return a;
    }
}

/* Element i of the result: comparisons write bool (a byte), the rest the operands' dtype; pow is
 * computed in double and rounded once. */
template <typename S> HD void binary_put(int op, void *out, int64_t i, S sa, S sb)
{
    using C = Cof<S>;
    C a = Ty<S>::ld(sa), b = Ty<S>::ld(sb);
    if (op == DT_BINARY_POW)
        ((S *)out)[i] = Ty<S>::from_d(pow_of(a, b));
    else if (DT__BINARY_IS_COMPARISON(op))
        ((uint8_t *)out)[i] = (uint8_t)(binary_one(op, a, b) != 0);
    else
        ((S *)out)[i] = Ty<S>::st(binary_one(op, a, b));
}

template <typename S>
__global__ void binary_same_k(const S *a, const S *b, void *o, int64_t n, int op)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        binary_put<S>(op, o, i, a[i], b[i]);
}

template <typename S>
__global__ void binary_k(const S *a, const S *b, void *o, int64_t n, int op, Bcast g)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t ia, ib;
        offset2(i, g.nd, g.ext, g.st[0], g.st[1], &ia, &ib);
        binary_put<S>(op, o, i, a[ia], b[ib]);
    }
}

/* The same on 32-bit indices with precomputed divisors (n < 2^31: the unsigned loop index
 * plus the grid's step stays below 2^32). */
template <typename S>
__global__ void binary32_k(const S *a, const S *b, void *o, uint32_t n, int op, Bcast32 g)
{
    for (uint32_t i = (uint32_t)first_index(); i < n; i += (uint32_t)grid_step()) {
        int32_t ia, ib;
        offset2_32(i, g, &ia, &ib);
        binary_put<S>(op, o, (int64_t)i, a[ia], b[ib]);
    }
}

/* ---- cast, where ---------------------------------------------------------------------------- */

/* One element of dtype F as dtype T: integers and bool through int64_t, floats through double
 * (both exact), then converted once (as the CPU's STI / STD). */
template <typename T, typename F> HD T cast_one(F v)
{
    if constexpr (Ty<F>::flt)
        return Ty<T>::from_d((double)Ty<F>::ld(v));
    else
        return Ty<T>::from_i((int64_t)Ty<F>::ld(v));
}

template <typename T, typename F>
__global__ void cast_k(const F *x, T *o, int64_t n, bool plain, Bcast g)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = cast_one<T, F>(x[plain ? i : bcast_at(g, 0, i)]);
}

template <typename T, typename F>
dt_status cast_from(const dt__kctx *x, const void *in, void *out, int64_t n, bool plain,
                    const Bcast &g)
{
    cast_k<T, F><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const F *)in, (T *)out, n, plain, g);
    return launched(x, "cast", Ty<T>::dt);
}

/* out[i] = cond[i] ? x[i] : y[i], each operand broadcast to the output; dtype-blind (B: the
 * element's bits). */
template <typename B>
__global__ void where_k(const uint8_t *c, const B *xv, const B *yv, B *o, int64_t n, bool plain,
                        Bcast g)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        if (plain)
            o[i] = c[i] ? xv[i] : yv[i];
        else
            o[i] = c[bcast_at(g, 0, i)] ? xv[bcast_at(g, 1, i)] : yv[bcast_at(g, 2, i)];
    }
}

/* ---- fused chains (common/kernels.h FUSED) ------------------------------------------------- */

/* A chain, its operands and the broadcast plan of the CPU's fused kernel (backends/cpu/fused.c):
 * the output's axes merged where every operand is whole on both or broadcast on both, and each
 * operand's stride along the merged axes (0: broadcast). isz: each operand's element size. */
struct FusedArgs {
    dt__fused fz;
    const void *in[DT__FUSED_MAX_IN];
    int isz[DT__FUSED_MAX_IN];
    int nd;
    int64_t ext[R];
    int64_t st[DT__FUSED_MAX_IN][R];
    void *store[DT__FUSED_MAX_IN]; /* the values written out besides the output (fz.store) */
    int ssz[DT__FUSED_MAX_IN];
};

/* A value of the chain is held as its storage's bits, zero-extended to 64 bits. */
template <typename S> HD S from_bits(uint64_t b)
{
    S s;
    memcpy(&s, &b, sizeof s);
    return s;
}

template <typename S> HD uint64_t to_bits(S s)
{
    uint64_t b = 0;
    memcpy(&b, &s, sizeof s);
    return b;
}

/* Each op element for element as the kernel it replaces computes it (unary_one, binary_put,
 * cast_one, where_k, fill). */
template <typename S> HD uint64_t fused_unary(int op, uint64_t a)
{
    return to_bits(unary_one<S>(op, from_bits<S>(a)));
}

template <typename S> HD uint64_t fused_binary(int op, uint64_t a, uint64_t b)
{
    using C = Cof<S>;
    C x = Ty<S>::ld(from_bits<S>(a)), y = Ty<S>::ld(from_bits<S>(b));
    if (op == DT_BINARY_POW)
        return to_bits(Ty<S>::from_d(pow_of(x, y)));
    if (DT__BINARY_IS_COMPARISON(op))
        return (uint64_t)(binary_one(op, x, y) != 0);
    return to_bits(Ty<S>::st(binary_one(op, x, y)));
}

template <typename S> HD uint64_t fused_fill(double a)
{
    return to_bits(Ty<S>::from_d(a));
}

/* Calls F<S>(args...) for the storage type S of dtype t (0 for a dtype without one). */
#define FUSED_BY_DTYPE(t, F, ...)       \
    switch (t) {                        \
    case DT_DTYPE_F32:                  \
        return F<float>(__VA_ARGS__);   \
    case DT_DTYPE_F64:                  \
        return F<double>(__VA_ARGS__);  \
    case DT_DTYPE_I32:                  \
        return F<int32_t>(__VA_ARGS__); \
    case DT_DTYPE_I64:                  \
        return F<int64_t>(__VA_ARGS__); \
    case DT_DTYPE_BF16:                 \
        return F<bf16s>(__VA_ARGS__);   \
    case DT_DTYPE_F16:                  \
        return F<f16s>(__VA_ARGS__);    \
    case DT_DTYPE_BOOL:                 \
        return F<bools>(__VA_ARGS__);   \
    case DT_DTYPE_U8:                   \
        return F<uint8_t>(__VA_ARGS__); \
    case DT_DTYPE_I8:                   \
        return F<int8_t>(__VA_ARGS__);  \
    default:                            \
        return 0;                       \
    }

/* A cast to T from the storage type F. */
template <typename T> struct FusedCast {
    template <typename F> static HD uint64_t from(uint64_t a)
    {
        return to_bits(cast_one<T, F>(from_bits<F>(a)));
    }
};

template <typename T>
HD uint64_t fused_cast(dt_dtype from,
                       uint64_t a){FUSED_BY_DTYPE(from, FusedCast<T>::template from, a)}

HD uint64_t fused_op(const dt__fused_op &o, const uint64_t v[])
{
    uint64_t a = o.nin > 0 ? v[o.arg[0]] : 0, b = o.nin > 1 ? v[o.arg[1]] : 0;
    switch (o.kernel) {
    case DT__K_UNARY:
        FUSED_BY_DTYPE(o.dtype, fused_unary, o.op, a)
    case DT__K_BINARY:
        FUSED_BY_DTYPE(o.dtype, fused_binary, o.op, a, b)
    case DT__K_CAST:
        FUSED_BY_DTYPE(o.dtype, fused_cast, o.from, a)
    case DT__K_WHERE: /* bool condition, then the bits of either operand */
        return (a & 0xffu) ? b : v[o.arg[2]];
    case DT__K_FILL:
        FUSED_BY_DTYPE(o.dtype, fused_fill, o.a)
    default:
        return 0;
    }
}

HD uint64_t load_bits(const void *p, int64_t i, int size)
{
    switch (size) {
    case 1:
        return ((const uint8_t *)p)[i];
    case 2:
        return ((const uint16_t *)p)[i];
    case 4:
        return ((const uint32_t *)p)[i];
    default:
        return ((const uint64_t *)p)[i];
    }
}

HD void store_bits(void *p, int64_t i, int size, uint64_t r)
{
    switch (size) {
    case 1:
        ((uint8_t *)p)[i] = (uint8_t)r;
        break;
    case 2:
        ((uint16_t *)p)[i] = (uint16_t)r;
        break;
    case 4:
        ((uint32_t *)p)[i] = (uint32_t)r;
        break;
    default:
        ((uint64_t *)p)[i] = r;
    }
}

/* The chain at element i of its shape (row-major): its operands read where the plan puts them,
 * the ops in order, each value the chain writes out stored; returns the last op's result. One
 * copy that every kernel calls (not inlined: a chain ending in a reduction runs in each of the
 * fold engine's kernels, for each float dtype, and each unrolls its loads four times), reading a
 * in the calling kernel's __grid_constant__ parameter. */
__device__ __noinline__ uint64_t fused_at(const FusedArgs &a, int64_t i)
{
    const int nin = a.fz.nin, nops = a.fz.nops;
    uint64_t v[DT__FUSED_MAX_IN + DT__FUSED_MAX_OPS];
    int64_t off[DT__FUSED_MAX_IN] = {0}, rest = i;
    UNROLL
    for (int d = R - 1; d >= 0; d--)
        if (d < a.nd) {
            int64_t e = d > 0 ? rest % a.ext[d] : rest;
            rest = d > 0 ? rest / a.ext[d] : 0;
            UNROLL
            for (int q = 0; q < DT__FUSED_MAX_IN; q++)
                off[q] += e * a.st[q][d];
        }
    for (int q = 0; q < nin; q++)
        v[q] = a.isz[q] ? load_bits(a.in[q], off[q], a.isz[q]) : 0;
    for (int j = 0; j < nops; j++)
        v[nin + j] = fused_op(a.fz.ops[j], v);
    for (int e = 0; e < a.fz.nstore; e++)
        store_bits(a.store[e], i, a.ssz[e], v[a.fz.store[e]]);
    return v[nin + nops - 1];
}

/* One thread per output element, the last op's result stored (osz bytes). */
__global__ void fused_k(const __grid_constant__ FusedArgs a, void *out, int osz, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        store_bits(out, i, osz, fused_at(a, i));
}

/* A chain ending in a reduction: the REDUCE kernel's fold (common.cuh, S the last value's
 * storage type, A the accumulator) whose element at offset off of the chain's shape is the
 * chain computed there (the values written out stored on the way). The engine loads each
 * element once, so each stored value is written once; rows, order and accumulation are the
 * REDUCE kernel's, so the fused reduction is bitwise the unfused one on the same GPU. */
template <typename S, typename A> struct FusedFold : ReduceFold<S, A> {
    FusedArgs a;
    __device__ A load(int64_t, int64_t off, int64_t) const
    {
        return (A)Ty<S>::ld(from_bits<S>(fused_at(a, off)));
    }
};

/* A chain ending in a reduction over k->mask of its shape k->shape, of the last value's dtype S
 * (f32, f64, bf16, f16): folded as the REDUCE kernel folds (sequential rows in the compute type,
 * shared rows in double), scaled by k->a (a mean) and rounded once. */
template <typename S>
dt_status fused_reduce(const dt__kctx *x, const dt__kargs *k, const FusedArgs &a, void *out)
{
    Rows r;
    plan_rows(k->rank, k->shape, k->mask, &r);
    if (r.nrows <= 0)
        return DT_OK;
    FusedFold<S, Cof<S>> seq{{nullptr, (S *)out, a.fz.rop, k->a}, a};
    FusedFold<S, Wide<Cof<S>>> grp{{nullptr, (S *)out, a.fz.rop, k->a}, a};
    fold_rows(x, r, seq, grp);
    return launched(x, "fused", Ty<S>::dt);
}

/* The dtype operand q of op o is read in (the CPU's fused kernel's rule). */
dt_dtype fused_operand_dtype(const dt__fused_op *o, int q)
{
    if (o->kernel == DT__K_CAST)
        return o->from;
    if (o->kernel == DT__K_WHERE && q == 0)
        return DT_DTYPE_BOOL;
    return o->dtype;
}

} // namespace

/* ---- the table's entries -------------------------------------------------------------------- */

template <typename S>
dt_status fill(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    /* converted on the host, as the CPU converts it */
    return fill_value<S>(x, out, elems(k->rank, k->shape), Ty<S>::from_d(k->a), "fill");
}

template <typename S>
dt_status arange(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    int64_t n = k->shape[0];
    if (n <= 0)
        return DT_OK;
    arange_k<S><<<grid_for(n), kThreads, 0, stream_of(x)>>>((S *)out, n, k->a, k->b, k->offset[0]);
    return launched(x, "arange", Ty<S>::dt);
}

template <typename S, bool NORMAL>
dt_status random_values(const dt__kctx *x, const dt__kargs *k, void *out)
{
    const char *name = NORMAL ? "philox_normal" : "philox_uniform";
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    bool run = true; /* consecutive global indices: every axis after the first whole */
    for (int a = 1; a < k->rank; a++)
        run = run && k->shape[a] == k->gshape[a] && k->offset[a] == 0;
    if (run) {
        constexpr int per = NORMAL ? (sizeof(S) == 8 ? 1 : 2) : (sizeof(S) == 8 ? 2 : 4);
        int64_t gst[R];
        strides_of(k->rank, k->gshape, gst);
        uint64_t g0 = k->rank ? (uint64_t)k->offset[0] * (uint64_t)gst[0] : 0;
        int64_t items = (int64_t)((g0 + (uint64_t)n - 1) / per - g0 / per) + 1;
        int64_t cap = x->sms > 0 ? (int64_t)x->sms * 8 : kMaxBlocks,
                blocks = blocks_for(items, kThreads);
        unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
        if (items <= INT32_MAX)
            random_run_k<S, NORMAL, uint32_t><<<grid, kThreads, 0, stream_of(x)>>>(
                (S *)out, k->seed, k->key, k->a, k->b, g0, (uint32_t)n, (uint32_t)items);
        else
            random_run_k<S, NORMAL, int64_t><<<grid, kThreads, 0, stream_of(x)>>>(
                (S *)out, k->seed, k->key, k->a, k->b, g0, n, items);
        return launched(x, name, Ty<S>::dt);
    }
    RandArgs r = plan_random(k, NORMAL, sizeof(S) == 8);
    random_k<S, NORMAL><<<grid_for(r.items), kThreads, 0, stream_of(x)>>>((S *)out, r);
    return launched(x, name, Ty<S>::dt);
}

template <typename S>
dt_status philox_uniform(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random_values<S, false>(x, k, out);
}

template <typename S>
dt_status philox_normal(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random_values<S, true>(x, k, out);
}

template <typename S>
dt_status unary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    unary_k<S><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const S *)in[0], (S *)out, n, k->op);
    return launched(x, "unary", Ty<S>::dt);
}

template <typename S>
dt_status binary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    const S *a = (const S *)in[0], *b = (const S *)in[1];
    Bcast g;
    if (plan_bcast(k->rank, k->shape, 2, k->in_shape, &g))
        binary_same_k<S><<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, b, out, n, k->op);
    else if (Bcast32 h; plan_bcast32(g, 2, n, &h))
        binary32_k<S><<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, b, out, (uint32_t)n, k->op, h);
    else
        binary_k<S><<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, b, out, n, k->op, g);
    return launched(x, "binary", Ty<S>::dt);
}

/* out (the table's dtype S) from k->from, broadcast from in_shape[0]. */
template <typename S>
dt_status cast(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    Bcast g;
    bool plain = plan_bcast(k->rank, k->shape, 1, k->in_shape, &g);
    switch (k->from) {
    case DT_DTYPE_F32:
        return cast_from<S, float>(x, in[0], out, n, plain, g);
    case DT_DTYPE_F64:
        return cast_from<S, double>(x, in[0], out, n, plain, g);
    case DT_DTYPE_I32:
        return cast_from<S, int32_t>(x, in[0], out, n, plain, g);
    case DT_DTYPE_I64:
        return cast_from<S, int64_t>(x, in[0], out, n, plain, g);
    case DT_DTYPE_BF16:
        return cast_from<S, bf16s>(x, in[0], out, n, plain, g);
    case DT_DTYPE_F16:
        return cast_from<S, f16s>(x, in[0], out, n, plain, g);
    case DT_DTYPE_BOOL:
        return cast_from<S, bools>(x, in[0], out, n, plain, g);
    case DT_DTYPE_U8:
        return cast_from<S, uint8_t>(x, in[0], out, n, plain, g);
    case DT_DTYPE_I8:
        return cast_from<S, int8_t>(x, in[0], out, n, plain, g);
    default:
        return dt__fail(DT_ERR_DTYPE, "CUDA:%d (GPU %d): cast to %s from dtype %d", x->index,
                        x->ordinal, dt_dtype_name(Ty<S>::dt), (int)k->from);
    }
}

template <typename S>
dt_status where(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    using B = Bits<S>;
    Bcast g;
    bool plain = plan_bcast(k->rank, k->shape, 3, k->in_shape, &g);
    where_k<B><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const uint8_t *)in[0], (const B *)in[1],
                                                           (const B *)in[2], (B *)out, n, plain, g);
    return launched(x, "where", Ty<S>::dt);
}

/* The chain of k->fused (any table dtype: the ops carry their own), over k->shape: written out
 * whole, or (fz->reduce) reduced into out. */
dt_status fused(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    const dt__fused *fz = k->fused;
    int nin = fz->nin, rank = k->rank;
    dt_dtype ot = fz->ops[fz->nops - 1].out;
    int64_t n = elems(rank, k->shape);
    if (n <= 0 && !fz->reduce) /* an empty shard's reduction still writes its identity */
        return DT_OK;
    FusedArgs a{};
    a.fz = *fz;
    bool whole[DT__FUSED_MAX_IN][R];
    for (int i = 0; i < rank; i++) {
        if (k->shape[i] == 1)
            continue;
        bool merge = a.nd > 0;
        for (int q = 0; q < nin; q++)
            merge = merge && (k->in_shape[q][i] != 1) == whole[q][a.nd - 1];
        if (merge) {
            a.ext[a.nd - 1] *= k->shape[i];
            continue;
        }
        a.ext[a.nd] = k->shape[i];
        for (int q = 0; q < nin; q++)
            whole[q][a.nd] = k->in_shape[q][i] != 1;
        a.nd++;
    }
    for (int q = 0; q < nin; q++) {
        int64_t s = 1;
        for (int d = a.nd - 1; d >= 0; d--) {
            a.st[q][d] = whole[q][d] ? s : 0;
            s *= whole[q][d] ? a.ext[d] : 1;
        }
        a.in[q] = in[q];
    }
    for (int j = 0; j < fz->nops; j++)
        for (int q = 0; q < fz->ops[j].nin; q++)
            if (fz->ops[j].arg[q] < nin)
                a.isz[fz->ops[j].arg[q]] = (int)dt_dtype_size(fused_operand_dtype(&fz->ops[j], q));
    for (int e = 0; e < fz->nstore; e++) { /* in[nin + e]: a result, packed as the chain */
        a.store[e] = const_cast<void *>(in[nin + e]);
        a.ssz[e] = (int)dt_dtype_size(fz->ops[fz->store[e] - nin].out);
    }
    if (fz->reduce) {
        switch (ot) {
        case DT_DTYPE_F32:
            return fused_reduce<float>(x, k, a, out);
        case DT_DTYPE_F64:
            return fused_reduce<double>(x, k, a, out);
        case DT_DTYPE_BF16:
            return fused_reduce<bf16s>(x, k, a, out);
        case DT_DTYPE_F16:
            return fused_reduce<f16s>(x, k, a, out);
        default:
            return dt__fail(DT_ERR_UNSUPPORTED, "CUDA:%d (GPU %d): fused reduction of %s", x->index,
                            x->ordinal, dt_dtype_name(ot));
        }
    }
    fused_k<<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, out, (int)dt_dtype_size(ot), n);
    return launched(x, "fused", ot);
}

DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, fill)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, arange)
DT__CUDA_FLOAT_TYPES(DT__CUDA_INSTANTIATE, philox_uniform)
DT__CUDA_FLOAT_TYPES(DT__CUDA_INSTANTIATE, philox_normal)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, unary)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, binary)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, cast)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, where)

} // namespace dtcuda
