/* What the CUDA kernel files share (internal to backends/cuda/): the dtypes' storage and compute
 * types, launch shapes, index arithmetic, error reporting, and the table entries each file
 * defines (kernels.cu holds the table, the shared plans and the collectives' combine). The element
 * semantics are the CPU reference's (backends/cpu/kernels.c), through the same conversions
 * (common/convert.h), Philox (common/philox.h) and float functions (common/unary.h).
 *
 * Each dtype has a storage type S (what a buffer holds) and a compute type C, as on the CPU:
 * f32, f64 and the integers compute as they are stored; bf16 and f16 (16-bit patterns) load
 * exactly into f32 and round to nearest even once on store; bool is a byte 0 or 1 that computes
 * as uint8_t. Ty<S> gives C and the conversions:
 *   ld(s)      storage -> compute (exact)
 *   st(c)      compute -> storage (16-bit floats rounded once; bool: c != 0)
 *   from_d(v)  double -> storage, rounded once (floats to integers as the x86 reference)
 *   from_i(v)  int64_t -> storage (integers wrap as C converts; floats round) */
#ifndef DT_CUDA_COMMON_CUH
#define DT_CUDA_COMMON_CUH

#include "convert.h"
#include "fastdiv.h"
#include "kernels.h"
#include "philox.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#define HD __host__ __device__ __forceinline__
/* #pragma unroll in functions the host compiler sees too */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

namespace dtcuda
{

constexpr int R = DT_MAX_RANK;
constexpr int kThreads = 256;
/* Grids are capped here; every kernel strides over its work by the grid it gets. */
constexpr int64_t kMaxBlocks = 65535 * 16;

/* ---- dtypes --------------------------------------------------------------------------------- */

struct bf16s {
    uint16_t u;
};
struct f16s {
    uint16_t u;
};
struct bools {
    uint8_t u;
};

template <typename S> struct Ty;

/* Types that compute as they are stored: f32, f64 and the integers. */
template <typename T, dt_dtype D> struct PlainTy {
    using C = T;
    static constexpr dt_dtype dt = D;
    static constexpr bool flt = std::is_floating_point<T>::value;
    static HD C ld(T v)
    {
        return v;
    }
    static HD T st(C v)
    {
        return v;
    }
    static HD T from_i(int64_t v)
    {
        return (T)v;
    }
    /* the identities of max and min */
    static HD C lo()
    {
        if constexpr (flt)
            return (C)-INFINITY;
        else if constexpr (std::is_signed<T>::value)
            return (T)((uint64_t)1 << (8 * sizeof(T) - 1)); /* two's complement minimum */
        else
            return 0;
    }
    static HD C hi()
    {
        if constexpr (flt)
            return (C)INFINITY;
        else if constexpr (std::is_signed<T>::value)
            return (T)(((uint64_t)1 << (8 * sizeof(T) - 1)) - 1);
        else
            return (T) ~(T)0;
    }
};

template <> struct Ty<float> : PlainTy<float, DT_DTYPE_F32> {
    static HD float from_d(double v)
    {
        return (float)v;
    }
};
template <> struct Ty<double> : PlainTy<double, DT_DTYPE_F64> {
    static HD double from_d(double v)
    {
        return v;
    }
};
template <> struct Ty<int32_t> : PlainTy<int32_t, DT_DTYPE_I32> {
    static HD int32_t from_d(double v)
    {
        return dt__f64_to_i32(v);
    }
};
template <> struct Ty<int64_t> : PlainTy<int64_t, DT_DTYPE_I64> {
    static HD int64_t from_d(double v)
    {
        return dt__f64_to_i64(v);
    }
};
/* the 8-bit integers go through i32 and wrap, as numpy's astype does on x86 */
template <> struct Ty<uint8_t> : PlainTy<uint8_t, DT_DTYPE_U8> {
    static HD uint8_t from_d(double v)
    {
        return (uint8_t)dt__f64_to_i32(v);
    }
};
template <> struct Ty<int8_t> : PlainTy<int8_t, DT_DTYPE_I8> {
    static HD int8_t from_d(double v)
    {
        return (int8_t)dt__f64_to_i32(v);
    }
};

/* bf16 and f16: f32 arithmetic, one rounding on store. */
template <typename S, dt_dtype D, uint16_t (*TO16)(float), float (*FROM16)(uint16_t),
          uint16_t (*D16)(double)>
struct HalfTy {
    using C = float;
    static constexpr dt_dtype dt = D;
    static constexpr bool flt = true;
    static HD C ld(S v)
    {
        return FROM16(v.u);
    }
    static HD S st(C v)
    {
        return S{TO16(v)};
    }
    static HD S from_d(double v)
    {
        return S{D16(v)};
    }
    static HD S from_i(int64_t v)
    {
        return S{D16((double)v)};
    }
    static HD C lo()
    {
        return -INFINITY;
    }
    static HD C hi()
    {
        return INFINITY;
    }
};
template <>
struct Ty<bf16s> : HalfTy<bf16s, DT_DTYPE_BF16, dt__f32_to_bf16, dt__bf16_to_f32, dt__f64_to_bf16> {
};
template <>
struct Ty<f16s> : HalfTy<f16s, DT_DTYPE_F16, dt__f32_to_f16, dt__f16_to_f32, dt__f64_to_f16> {
};

template <> struct Ty<bools> {
    using C = uint8_t;
    static constexpr dt_dtype dt = DT_DTYPE_BOOL;
    static constexpr bool flt = false;
    static HD C ld(bools v)
    {
        return v.u;
    }
    static HD bools st(C v)
    {
        return bools{(uint8_t)(v != 0)};
    }
    static HD bools from_d(double v)
    {
        return bools{(uint8_t)(v != 0)};
    }
    static HD bools from_i(int64_t v)
    {
        return bools{(uint8_t)(v != 0)};
    }
    static HD C lo()
    {
        return 0;
    }
    static HD C hi()
    {
        return 1;
    }
};

template <typename S> using Cof = typename Ty<S>::C;

/* An unsigned type of N bytes: what the dtype-blind kernels (copies, gathers) move. */
template <int N> struct BitsOf;
template <> struct BitsOf<1> {
    using T = uint8_t;
};
template <> struct BitsOf<2> {
    using T = uint16_t;
};
template <> struct BitsOf<4> {
    using T = uint32_t;
};
template <> struct BitsOf<8> {
    using T = uint64_t;
};
template <typename S> using Bits = typename BitsOf<(int)sizeof(S)>::T;

/* ---- arithmetic in a compute type, as the CPU's DT__ADD and friends ------------------------- */

/* Integers through uint64_t, so that overflow wraps; floats as they are. */
template <typename C> HD C wadd(C a, C b)
{
    if constexpr (std::is_floating_point<C>::value)
        return a + b;
    else
        return (C)((uint64_t)a + (uint64_t)b);
}

template <typename C> HD C wsub(C a, C b)
{
    if constexpr (std::is_floating_point<C>::value)
        return a - b;
    else
        return (C)((uint64_t)a - (uint64_t)b);
}

template <typename C> HD C wmul(C a, C b)
{
    if constexpr (std::is_floating_point<C>::value)
        return a * b;
    else
        return (C)((uint64_t)a * (uint64_t)b);
}

template <typename C> HD C wneg(C a)
{
    return wsub((C)0, a);
}

/* Whether a compute value is NaN (never, for the integers): max and min let a NaN win, as the
 * CPU's kernels and numpy do. */
template <typename C> HD bool is_nan(C v)
{
    if constexpr (std::is_floating_point<C>::value)
        return v != v;
    else
        return false;
}

/* Whether a compute value is negative (never, for the unsigned types). */
template <typename C> HD bool is_neg(C v)
{
    if constexpr (std::is_signed<C>::value)
        return v < 0;
    else
        return false;
}

/* A product and a sum each rounded on its own, as the CPU's (gcc -ffp-contract=off) are: never
 * contracted into a fused multiply-add, whatever nvcc's --fmad (only the files whose every
 * operation must round as the CPU's, elementwise.cu, build with --fmad=false). */
template <typename C> HD C mul_rn(C a, C b)
{
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same<C, double>::value)
        return __dmul_rn(a, b);
    else if constexpr (std::is_same<C, float>::value)
        return __fmul_rn(a, b);
    else
        return wmul(a, b);
#else
    return wmul(a, b);
#endif
}

template <typename C> HD C add_rn(C a, C b)
{
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same<C, double>::value)
        return __dadd_rn(a, b);
    else if constexpr (std::is_same<C, float>::value)
        return __fadd_rn(a, b);
    else
        return wadd(a, b);
#else
    return wadd(a, b);
#endif
}

/* exp and log in a compute type (float: the f32 functions; double: the f64 ones), as the CPU's
 * CEXP and CLOG. */
template <typename C> HD C cexp(C v)
{
    if constexpr (sizeof(C) == sizeof(double))
        return exp((double)v);
    else
        return expf((float)v);
}

template <typename C> HD C clog(C v)
{
    if constexpr (sizeof(C) == sizeof(double))
        return log((double)v);
    else
        return logf((float)v);
}

/* ---- launch shapes and index arithmetic ----------------------------------------------------- */

/* Blocks for n items at per_block items a block (at least 1, at most kMaxBlocks). */
inline unsigned blocks_for(int64_t n, int64_t per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

inline unsigned grid_for(int64_t n)
{
    return blocks_for(n, kThreads);
}

/* Grid-stride loops: for (int64_t i = first_index(); i < n; i += grid_step()) */
__device__ __forceinline__ int64_t first_index()
{
    return blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t grid_step()
{
    return (int64_t)gridDim.x * blockDim.x;
}

/* Product of a shape (the caller validated it: no overflow, no negative extent). */
inline int64_t elems(int rank, const int64_t s[])
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= s[i];
    return n;
}

/* Row-major strides of a shape. */
inline void strides_of(int rank, const int64_t shape[], int64_t st[])
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

inline cudaStream_t stream_of(const dt__kctx *x)
{
    return (cudaStream_t)x->stream;
}

/* Append an axis (extent e, stride s) to a list, merged into the last one when the two are one
 * contiguous run in memory. */
inline void push_axis(int64_t ext[], int64_t st[], int *nd, int64_t e, int64_t s)
{
    if (*nd > 0 && st[*nd - 1] == e * s) {
        ext[*nd - 1] *= e;
        st[*nd - 1] = s;
        return;
    }
    ext[*nd] = e;
    st[*nd] = s;
    (*nd)++;
}

/* The loops run over all R slots with a guard, so that they unroll and index the parameter
 * arrays with constants. Offset of the element of row-major index i over ext[0..nd) in an
 * array of strides st. */
HD int64_t offset1(int64_t i, int nd, const int64_t ext[], const int64_t st[])
{
    int64_t off = 0;
    UNROLL
    for (int q = R - 1; q > 0; q--)
        if (q < nd) {
            off += i % ext[q] * st[q];
            i /= ext[q];
        }
    return nd > 0 ? off + i * st[0] : 0;
}

/* The same index in two arrays at once (strides s1 and s2). */
HD void offset2(int64_t i, int nd, const int64_t ext[], const int64_t s1[], const int64_t s2[],
                int64_t *o1, int64_t *o2)
{
    int64_t a = 0, b = 0;
    UNROLL
    for (int q = R - 1; q > 0; q--)
        if (q < nd) {
            int64_t d = i % ext[q];
            a += d * s1[q];
            b += d * s2[q];
            i /= ext[q];
        }
    *o1 = nd > 0 ? a + i * s1[0] : 0;
    *o2 = nd > 0 ? b + i * s2[0] : 0;
}

/* Broadcasting of up to three operands to an output (an operand's extent of 1 reads its
 * element 0 on that axis, as the CPU's bcast_strides), on merged axes: output axes of extent 1
 * dropped, and neighbours where each operand is whole on both or broadcast on both merged. */
struct Bcast {
    int nd;
    int64_t ext[R], st[3][R];
};

/* Plan for `nops` operands of shapes in[q] (aligned to the output's rank) under the output
 * shape out. True when every operand has the output's shape (element i of each). */
bool plan_bcast(int rank, const int64_t out[], int nops, const int64_t in[][R], Bcast *g);

/* The same with 32-bit indices and divisors made once (common/fastdiv.h): for n elements below
 * 2^31 whose every operand offset fits too, no 64-bit division per element. */
struct Bcast32 {
    int nd;
    dt__div32 ext[R];
    int32_t st[3][R];
};

/* False when n or an operand's extent does not fit 32 bits (the 64-bit plan is used). */
inline bool plan_bcast32(const Bcast &g, int nops, int64_t n, Bcast32 *h)
{
    if (n >= ((int64_t)1 << 31))
        return false;
    *h = Bcast32{};
    h->nd = g.nd;
    for (int d = 0; d < g.nd; d++) {
        h->ext[d] = dt__div32_of((uint32_t)g.ext[d]);
        for (int q = 0; q < nops; q++) {
            if (g.st[q][d] * g.ext[d] >= ((int64_t)1 << 31))
                return false;
            h->st[q][d] = (int32_t)g.st[q][d];
        }
    }
    return true;
}

/* Element i's offsets in operands 0 and 1. */
HD void offset2_32(uint32_t i, const Bcast32 &g, int32_t *o1, int32_t *o2)
{
    int32_t a = 0, b = 0;
    UNROLL
    for (int q = R - 1; q > 0; q--)
        if (q < g.nd) {
            uint32_t up = dt__div32_q(g.ext[q], i), d = i - up * g.ext[q].d;
            a += (int32_t)d * g.st[0][q];
            b += (int32_t)d * g.st[1][q];
            i = up;
        }
    *o1 = g.nd > 0 ? a + (int32_t)i * g.st[0][0] : 0;
    *o2 = g.nd > 0 ? b + (int32_t)i * g.st[1][0] : 0;
}

/* Element i's offset in operand q. */
HD int64_t bcast_at(const Bcast &g, int q, int64_t i)
{
    return offset1(i, g.nd, g.ext, g.st[q]);
}

/* Rows: the axes of `mask` of a shape reduced, the others kept (extent-1 axes dropped,
 * neighbours contiguous in memory merged). Row q is row-major over the kept axes (the index of
 * the keepdims result); its elements j = 0..n-1 row-major over the reduced axes, in increasing
 * memory order: the order the CPU visits them in. */
struct Rows {
    int nkeep, nred;
    int64_t keep_ext[R], keep_st[R];
    int64_t red_ext[R], red_st[R];
    int64_t nrows, n;
};

void plan_rows(int rank, const int64_t shape[], unsigned mask, Rows *r);

/* True when a row's elements are adjacent in memory (its innermost reduced axis has stride 1). */
inline bool rows_contiguous(const Rows &r)
{
    return r.nred > 0 && r.red_st[r.nred - 1] == 1;
}

HD int64_t row_base(const Rows &r, int64_t q)
{
    return offset1(q, r.nkeep, r.keep_ext, r.keep_st);
}

HD int64_t row_elem(const Rows &r, int64_t j)
{
    return r.nred == 1 ? j * r.red_st[0] : offset1(j, r.nred, r.red_ext, r.red_st);
}

/* ---- errors ------------------------------------------------------------------------------- */

dt_status cuda_failed(const dt__kctx *x, const char *kernel, dt_dtype t, cudaError_t e);

/* After a launch: its error, if any, as DT_ERR_DEVICE naming the device and kernel. */
inline dt_status launched(const dt__kctx *x, const char *kernel, dt_dtype t)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? DT_OK : cuda_failed(x, kernel, t, e);
}

/* After an async memset or copy that returned e. */
inline dt_status queued(const dt__kctx *x, const char *kernel, dt_dtype t, cudaError_t e)
{
    if (e == cudaSuccess)
        return DT_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next launch starts clean */
    return cuda_failed(x, kernel, t, e);
}

template <typename B> __global__ void fill_k(B *o, int64_t n, B v)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = v;
}

/* n elements of storage value v (a memset when its bytes are all zero: 0, not -0.0). */
template <typename S>
dt_status fill_value(const dt__kctx *x, void *out, int64_t n, S v, const char *kernel)
{
    if (n <= 0)
        return DT_OK;
    Bits<S> b;
    memcpy(&b, &v, sizeof b);
    if (b == 0)
        return queued(x, kernel, Ty<S>::dt,
                      cudaMemsetAsync(out, 0, (size_t)n * sizeof b, stream_of(x)));
    fill_k<Bits<S>><<<grid_for(n), kThreads, 0, stream_of(x)>>>((Bits<S> *)out, n, b);
    return launched(x, kernel, Ty<S>::dt);
}

/* ---- folds of rows --------------------------------------------------------------------------- */

/* The engine of the reductions and row-wise kernels (reduce.cu) and of the fused chains that end
 * in a reduction (elementwise.cu): a fold of each row's elements (Rows: a row is the elements
 * that reduce into one output) by a small function object, run by one thread a row (the CPU's
 * order, so integers and f32 sums are bitwise the CPU's) or by 8, 32 or 1024 threads a row with
 * a tree of fixed shape (deterministic; float sums then accumulate in double, within the tests'
 * 1e-5 of the CPU's sequential sums). A fold object F has
 *   acc_t                      the accumulator
 *   init()                     the empty fold
 *   load(q, off, j)            element j of row q, at memory offset off
 *   step(a, b)                 a then b (associative: the tree combines partial folds with it)
 *   finish(q, a)               write row q's result
 * The kernels take the fold object as a __grid_constant__ parameter, so that a fold may pass
 * its fields by address to a function it calls (the fused chains' one copy of the chain's
 * evaluation, elementwise.cu) without a copy of the object per thread. Internal to each file
 * that includes this one, as the kernels it instantiates are. */
namespace
{

template <typename F> __global__ void rows_seq_k(const __grid_constant__ F f, Rows r)
{
    for (int64_t q = first_index(); q < r.nrows; q += grid_step()) {
        int64_t base = row_base(r, q);
        typename F::acc_t a = f.init();
        for (int64_t j = 0; j < r.n; j++)
            a = f.step(a, f.load(q, base + row_elem(r, j), j));
        f.finish(q, a);
    }
}

/* Thread t's row (of the block's THREADS / G) and lane: side by side (a warp on neighbouring
 * elements of one row), or with OUT_MAJOR THREADS / G apart (a warp on the same element of 32
 * neighbouring rows, when rows interleave in memory). Its slot in shared memory is t. */
template <int THREADS, int G, bool OUT_MAJOR> HD void group_of(int t, int *g, int *lane)
{
    constexpr int P = THREADS / G;
    *g = OUT_MAJOR ? t % P : t / G;
    *lane = OUT_MAJOR ? t / P : t % G;
}

template <int THREADS, int G, bool OUT_MAJOR> HD int slot_of(int g, int lane)
{
    return OUT_MAJOR ? lane * (THREADS / G) + g : g * G + lane;
}

/* Lane `lane` of G on elements [j0, j1) of row q: elements j0 + lane, j0 + lane + G, ... into
 * four independent partial folds (loads in flight), then combined. */
template <typename F, int G>
__device__ typename F::acc_t fold_span(const F &f, const Rows &r, int64_t q, int64_t j0, int64_t j1,
                                       int lane)
{
    using A = typename F::acc_t;
    int64_t base = row_base(r, q);
    A a0 = f.init(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = j0 + lane;
    for (; j + 3 * G < j1; j += 4 * G) {
        a0 = f.step(a0, f.load(q, base + row_elem(r, j), j));
        a1 = f.step(a1, f.load(q, base + row_elem(r, j + G), j + G));
        a2 = f.step(a2, f.load(q, base + row_elem(r, j + 2 * G), j + 2 * G));
        a3 = f.step(a3, f.load(q, base + row_elem(r, j + 3 * G), j + 3 * G));
    }
    for (; j < j1; j += G)
        a0 = f.step(a0, f.load(q, base + row_elem(r, j), j));
    return f.step(f.step(a0, a1), f.step(a2, a3));
}

template <typename F, int G>
__device__ typename F::acc_t fold_lane(const F &f, const Rows &r, int64_t q, int lane)
{
    return fold_span<F, G>(f, r, q, 0, r.n, lane);
}

/* The block's THREADS values folded by a tree of fixed shape (the same on every run); every
 * thread gets the result. */
template <typename F, int THREADS>
__device__ typename F::acc_t block_fold(const F &f, typename F::acc_t v, typename F::acc_t *part)
{
    const int t = (int)threadIdx.x;
    part[t] = v;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w /= 2) {
        if (t < w)
            part[t] = f.step(part[t], part[t + w]);
        __syncthreads();
    }
    v = part[0];
    __syncthreads();
    return v;
}

/* Long rows, few of them (a loss, a norm of a whole tensor): nb blocks a row, block b folding
 * elements [b chunk, (b + 1) chunk) into partial[q nb + b] (first pass), then one block a row
 * folding its nb partial results (second pass), both by fixed trees: deterministic, and the
 * whole GPU busy rather than one multiprocessor a row. */
template <typename F>
__global__ void __launch_bounds__(1024)
    rows_split_k(const __grid_constant__ F f, Rows r, int64_t chunk, int nb,
                 typename F::acc_t *partial)
{
    __shared__ typename F::acc_t part[1024];
    for (int64_t x = blockIdx.x; x < r.nrows * nb; x += gridDim.x) {
        int64_t q = x / nb, j0 = x % nb * chunk, j1 = j0 + chunk < r.n ? j0 + chunk : r.n;
        typename F::acc_t v =
            block_fold<F, 1024>(f, fold_span<F, 1024>(f, r, q, j0, j1, (int)threadIdx.x), part);
        if (threadIdx.x == 0)
            partial[x] = v;
    }
}

template <typename F>
__global__ void __launch_bounds__(1024) rows_merge_k(const __grid_constant__ F f, int64_t nrows,
                                                     int nb, const typename F::acc_t *partial)
{
    __shared__ typename F::acc_t part[1024];
    for (int64_t q = blockIdx.x; q < nrows; q += gridDim.x) {
        int t = (int)threadIdx.x;
        typename F::acc_t v = block_fold<F, 1024>(f, t < nb ? partial[q * nb + t] : f.init(), part);
        if (t == 0)
            f.finish(q, v);
    }
}

/* Rows shared by G threads each: lanes, then a tree in shared memory whose shape depends only on
 * G, so that results are the same on every run. */
template <typename F, int THREADS, int G, bool OUT_MAJOR>
__global__ void __launch_bounds__(THREADS) rows_group_k(const __grid_constant__ F f, Rows r)
{
    using A = typename F::acc_t;
    constexpr int P = THREADS / G;
    __shared__ A part[THREADS];
    const int t = (int)threadIdx.x;
    int g, lane;
    group_of<THREADS, G, OUT_MAJOR>(t, &g, &lane);
    /* the loop bound is the block's, so every thread reaches every __syncthreads */
    for (int64_t first = (int64_t)blockIdx.x * P; first < r.nrows;
         first += (int64_t)gridDim.x * P) {
        int64_t q = first + g;
        part[t] = q < r.nrows ? fold_lane<F, G>(f, r, q, lane) : f.init();
        __syncthreads();
        for (int w = G / 2; w > 0; w /= 2) {
            if (lane < w)
                part[t] = f.step(part[t], part[slot_of<THREADS, G, OUT_MAJOR>(g, lane + w)]);
            __syncthreads();
        }
        if (lane == 0 && q < r.nrows)
            f.finish(q, part[t]);
        __syncthreads();
    }
}

/* How rows are folded: one thread a row when rows are short, or many and interleaved (each
 * thread then reads a column: coalesced across threads); else 8 threads on each of 32
 * interleaved rows, a warp on a row of moderate length, a block of 1024 on a long one, or,
 * for a few rows of 64k elements and more, blocks of 16k elements each and a second pass (the
 * device's scratch holds the partial results; the number of blocks depends on the shape
 * only). SEQ is the fold object for one thread a row (the CPU's accumulator), GRP for shared
 * rows. */
template <typename SEQ, typename GRP>
void fold_rows(const dt__kctx *x, const Rows &r, const SEQ &seq, const GRP &grp)
{
    cudaStream_t st = stream_of(x);
    bool adjacent = rows_contiguous(r);
    using A = typename GRP::acc_t;
    if (adjacent && r.n >= ((int64_t)1 << 16) && r.nrows <= 64 && x->scratch) {
        int64_t nb = (r.n + (1 << 14) - 1) >> 14, fit = (int64_t)(x->scratch_bytes / sizeof(A));
        nb = nb > 1024 ? 1024 : nb;
        nb = nb * r.nrows > fit ? fit / r.nrows : nb;
        if (nb >= 2) {
            int64_t chunk = (r.n + nb - 1) / nb;
            nb = (r.n + chunk - 1) / chunk; /* no empty block */
            rows_split_k<GRP><<<blocks_for(r.nrows * nb, 1), 1024, 0, st>>>(grp, r, chunk, (int)nb,
                                                                            (A *)x->scratch);
            rows_merge_k<GRP><<<blocks_for(r.nrows, 1), 1024, 0, st>>>(grp, r.nrows, (int)nb,
                                                                       (const A *)x->scratch);
            return;
        }
    }
    if (r.n <= 16 || (!adjacent && r.nrows >= 8192))
        rows_seq_k<SEQ><<<grid_for(r.nrows), kThreads, 0, st>>>(seq, r);
    else if (!adjacent && r.nrows >= 32)
        rows_group_k<GRP, 256, 8, true><<<blocks_for(r.nrows, 32), 256, 0, st>>>(grp, r);
    else if (r.n < 4096)
        rows_group_k<GRP, 256, 32, false><<<blocks_for(r.nrows, 8), 256, 0, st>>>(grp, r);
    else
        rows_group_k<GRP, 1024, 1024, false><<<blocks_for(r.nrows, 1), 1024, 0, st>>>(grp, r);
}

/* Shared folds of float sums accumulate in double; integers in their own type (wrapping). */
template <typename C> using Wide = std::conditional_t<std::is_floating_point<C>::value, double, C>;

/* The CPU's step: v > a || v is NaN ? v : a (MAX), v < a || v is NaN ? v : a (MIN: a NaN wins,
 * as numpy's), a * v (PROD), a + v otherwise; then the scale (a mean) in double, rounded once. */
template <typename S, typename A> struct ReduceFold {
    using acc_t = A;
    const S *x;
    S *o;
    int op;
    double scale;
    HD A init() const
    {
        return op == DT_REDUCE_MAX    ? (A)Ty<S>::lo()
               : op == DT_REDUCE_MIN  ? (A)Ty<S>::hi()
               : op == DT_REDUCE_PROD ? (A)1
                                      : (A)0;
    }
    HD A load(int64_t, int64_t off, int64_t) const
    {
        return (A)Ty<S>::ld(x[off]);
    }
    HD A step(A a, A v) const
    {
        if (op == DT_REDUCE_MAX)
            return v > a || is_nan(v) ? v : a;
        if (op == DT_REDUCE_MIN)
            return v < a || is_nan(v) ? v : a;
        if (op == DT_REDUCE_PROD)
            return wmul(a, v);
        return wadd(a, v);
    }
    /* a float sum rounds once from its accumulator (double for shared folds) */
    HD void finish(int64_t q, A a) const
    {
        if (scale != 1.0)
            o[q] = Ty<S>::from_d((double)a * scale);
        else if constexpr (std::is_floating_point<A>::value)
            o[q] = Ty<S>::from_d((double)a);
        else
            o[q] = Ty<S>::st((Cof<S>)a);
    }
};

} // namespace

/* ---- the table's entries, by file ----------------------------------------------------------- */

#define DT__CUDA_ENTRY(NAME) \
    template <typename S>    \
    dt_status NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out);
/* elementwise.cu */
DT__CUDA_ENTRY(fill)
DT__CUDA_ENTRY(arange)
DT__CUDA_ENTRY(philox_uniform)
DT__CUDA_ENTRY(philox_normal)
DT__CUDA_ENTRY(unary)
DT__CUDA_ENTRY(binary)
DT__CUDA_ENTRY(cast)
DT__CUDA_ENTRY(where)
/* reduce.cu: reductions and the row-wise kernels */
DT__CUDA_ENTRY(reduce)
DT__CUDA_ENTRY(softmax)
DT__CUDA_ENTRY(norm)
DT__CUDA_ENTRY(scan)
DT__CUDA_ENTRY(arg_reduce)
/* gemm.cu */
DT__CUDA_ENTRY(gemm)
/* attention.cu */
DT__CUDA_ENTRY(attention)
/* move.cu: data movement and the index kernels */
DT__CUDA_ENTRY(transpose)
DT__CUDA_ENTRY(copy_blocks)
DT__CUDA_ENTRY(select_fill)
DT__CUDA_ENTRY(gather)
DT__CUDA_ENTRY(segment_sum)
DT__CUDA_ENTRY(one_hot)
/* xent.cu: sparse softmax cross-entropy */
DT__CUDA_ENTRY(xent)
#undef DT__CUDA_ENTRY
/* elementwise.cu: the FUSED chain, one entry for every dtype (each op carries its own) */
dt_status fused(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out);

/* Each entry is instantiated for the dtypes its kernel takes (the CPU table's). */
#define DT__CUDA_NUMERIC_TYPES(X, NAME) \
    X(NAME, float)                      \
    X(NAME, double)                     \
    X(NAME, int32_t)                    \
    X(NAME, int64_t)                    \
    X(NAME, bf16s)                      \
    X(NAME, f16s)                       \
    X(NAME, uint8_t)                    \
    X(NAME, int8_t)
#define DT__CUDA_ALL_TYPES(X, NAME) DT__CUDA_NUMERIC_TYPES(X, NAME) X(NAME, bools)
#define DT__CUDA_FLOAT_TYPES(X, NAME) X(NAME, float) X(NAME, double) X(NAME, bf16s) X(NAME, f16s)
#define DT__CUDA_INSTANTIATE(NAME, S) \
    template dt_status NAME<S>(const dt__kctx *, const dt__kargs *, const void *const[], void *);

} // namespace dtcuda

#endif /* DT_CUDA_COMMON_CUH */
