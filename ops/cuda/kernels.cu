/* CUDA local kernels: the (kernel, dtype) table of common/kernels.h for f32, f64, i32 and
 * i64, with the semantics of the CPU reference (ops/cpu/kernels.c) element for element, and
 * the combine kernel of the GPU collectives. Everything is queued on the device's stream
 * (x->stream); nothing here waits for the GPU, allocates memory or changes the current GPU.
 *
 * Arithmetic as on the CPU: integer sums, differences and products wrap (through uint64_t,
 * as DT__ADD and friends); the float functions of unary ops and pow are computed in double
 * and converted to the element type as the host converts (to_elem); random numbers come from
 * common/philox.h, and nvcc runs with --fmad=false, so they are bitwise the CPU's. CUDA's
 * exp, log, tanh, sin, cos and pow may differ from glibc's in the last bit of a double.
 *
 * Indices are int64_t throughout; every kernel loops grid-stride over a capped grid, so any
 * size runs with any grid. Shapes travel by value in small parameter structs, planned on the
 * host with extent-1 axes dropped and axes contiguous in every operand merged. The element
 * and index functions are __host__ __device__ and the plans plain host code, so that they can
 * be checked against the CPU kernels on a machine without a GPU. */
#include "kernels.h"
#include "philox.h"
#include "unary.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
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

namespace
{

constexpr int R = DT_MAX_RANK;
constexpr int kThreads = 256;
/* Grids are capped here; every kernel strides over its work by the grid it gets. */
constexpr int64_t kMaxBlocks = 65535 * 16;

/* Blocks for n items at per_block items a block (at least 1, at most kMaxBlocks). */
unsigned blocks_for(int64_t n, int64_t per_block)
{
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

unsigned grid_for(int64_t n)
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
int64_t elems(int rank, const int64_t s[])
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= s[i];
    return n;
}

/* Row-major strides of a shape. */
void strides_of(int rank, const int64_t shape[], int64_t st[])
{
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
}

cudaStream_t stream_of(const dt__kctx *x)
{
    return (cudaStream_t)x->stream;
}

template <typename T> constexpr bool kFloat = std::is_floating_point<T>::value;

template <typename T> constexpr dt_dtype dtype_of()
{
    return std::is_same<T, float>::value     ? DT_DTYPE_F32
           : std::is_same<T, double>::value  ? DT_DTYPE_F64
           : std::is_same<T, int32_t>::value ? DT_DTYPE_I32
                                             : DT_DTYPE_I64;
}

dt_status cuda_failed(const dt__kctx *x, const char *kernel, dt_dtype t, cudaError_t e)
{
    return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): %s kernel for %s failed: %s", x->index,
                    x->ordinal, kernel, dt_dtype_name(t), cudaGetErrorString(e));
}

/* After a launch: its error, if any, as DT_ERR_DEVICE. */
dt_status launched(const dt__kctx *x, const char *kernel, dt_dtype t)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? DT_OK : cuda_failed(x, kernel, t, e);
}

/* After an async memset or copy that returned e. */
dt_status queued(const dt__kctx *x, const char *kernel, dt_dtype t, cudaError_t e)
{
    if (e == cudaSuccess)
        return DT_OK;
    (void)cudaGetLastError(); /* clear a non-sticky error so the next launch starts clean */
    return cuda_failed(x, kernel, t, e);
}

/* ---- element arithmetic, as the CPU's ------------------------------------------------------ */

/* DT__ADD / DT__SUB / DT__MUL / DT__NEG: integers through uint64_t, so overflow wraps. */
template <typename T> HD T wadd(T a, T b)
{
    if constexpr (kFloat<T>)
        return a + b;
    else
        return (T)((uint64_t)a + (uint64_t)b);
}

template <typename T> HD T wsub(T a, T b)
{
    if constexpr (kFloat<T>)
        return a - b;
    else
        return (T)((uint64_t)a - (uint64_t)b);
}

template <typename T> HD T wmul(T a, T b)
{
    if constexpr (kFloat<T>)
        return a * b;
    else
        return (T)((uint64_t)a * (uint64_t)b);
}

template <typename T> HD T wneg(T a)
{
    return wsub((T)0, a);
}

/* The CPU's LOWEST and HIGHEST (reduce's MAX and MIN identities). */
template <typename T> HD T lowest()
{
    if constexpr (kFloat<T>)
        return (T)-INFINITY;
    else if constexpr (sizeof(T) == 4)
        return (T)INT32_MIN;
    else
        return (T)INT64_MIN;
}

template <typename T> HD T highest()
{
    if constexpr (kFloat<T>)
        return (T)INFINITY;
    else if constexpr (sizeof(T) == 4)
        return (T)INT32_MAX;
    else
        return (T)INT64_MAX;
}

/* (T)v as the host computes it. For integers out of range (and NaN) C leaves the conversion
 * undefined: x86's cvttsd2si, which the CPU reference compiles to, gives the most negative
 * integer there, where CUDA's conversion saturates (NaN to 0, as on aarch64 hosts). */
template <typename T> HD T to_elem(double v)
{
    if constexpr (kFloat<T>) {
        return (T)v;
    } else {
#if defined(__x86_64__) || defined(__i386__)
        bool in_range = sizeof(T) == 4 ? v > -2147483649.0 && v < 2147483648.0
                                       : v >= -9223372036854775808.0 && v < 9223372036854775808.0;
        if (!in_range)
            return lowest<T>();
#endif
        return (T)v;
    }
}

/* ---- row-major index decomposition ---------------------------------------------------------- */

/* The loops run over all R slots with a guard, so that they unroll and index the parameter
 * arrays with constants. */

/* Offset of the element of row-major index i over ext[0..nd) in an array of strides st. */
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

/* Append an axis (extent e, stride s) to a list, merged into the last one when the two are
 * one contiguous run in memory. */
void push_axis(int64_t ext[], int64_t st[], int *nd, int64_t e, int64_t s)
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

/* ---- fill, arange, random ------------------------------------------------------------------- */

template <typename T> __global__ void fill_k(T *o, int64_t n, T v)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = v;
}

template <typename T> HD T arange_at(double a, double b, int64_t off, int64_t i)
{
    return to_elem<T>(a + b * (double)(off + i));
}

template <typename T> __global__ void arange_k(T *o, int64_t n, double a, double b, int64_t off)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = arange_at<T>(a, b, off, i);
}

struct RandArgs {
    int rank;
    int64_t shape[R];    /* the local block */
    int64_t offset[R];   /* global index of its first element */
    uint64_t gstride[R]; /* row-major strides of the global shape */
    uint64_t seed, key;
    double a, b;
    bool normal;
};

RandArgs plan_random(const dt__kargs *k, bool normal)
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
    r.normal = normal;
    return r;
}

/* Element i of the local block: global linear index e = sum (offset + idx) * gstride, then
 * the shared Philox value of e (bitwise the CPU's). */
template <typename T> HD T random_at(const RandArgs &r, int64_t i)
{
    uint64_t e = 0;
    UNROLL
    for (int q = R - 1; q >= 0; q--)
        if (q < r.rank) {
            e += (uint64_t)(r.offset[q] + i % r.shape[q]) * r.gstride[q];
            i /= r.shape[q];
        }
    double u = dt__random_value(r.normal, sizeof(T) == 8, r.seed, r.key, e);
    return to_elem<T>(dt__random_scale(r.normal, r.a, r.b, u));
}

template <typename T> __global__ void random_k(T *o, int64_t n, RandArgs r)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = random_at<T>(r, i);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

/* NEG, ABS, RELU, SQUARE in T (integers wrap); the rest through double, as the CPU. */
template <typename T> HD T unary_one(int op, T x)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_NEG:
        return wneg(x);
    case DT_UNARY_ABS:
        return x < 0 ? wneg(x) : x;
    case DT_UNARY_RELU:
        return x > 0 ? x : (T)0;
    case DT_UNARY_SQUARE:
        return wmul(x, x);
    default:
        return to_elem<T>(dt__unary_f(op, (double)x));
    }
}

template <typename T> __global__ void unary_k(const T *x, T *o, int64_t n, int op)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = unary_one(op, x[i]);
}

/* pow((double)a, (double)b), as the CPU computes it. glibc's pow is exact whenever the power
 * is a representable integer (and correctly rounded in practice), CUDA's only within 2 ulps,
 * which truncation to an integer dtype would show (80.99999999999999 -> 80): for integer
 * operands whose power is an integer below 2^64 in magnitude, that integer rounded once. */
template <typename T> HD double pow_of(T a, T b)
{
    double da = (double)a, db = (double)b;
    if constexpr (!kFloat<T>) {
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
template <typename T> HD T floor_divmod(T a, T b, T *mod)
{
    if constexpr (!kFloat<T>) {
        if (b == 0) {
            *mod = 0;
            return 0;
        }
        T q = b == (T)-1 ? wneg(a) : (T)(a / b);
        T r = wsub(a, wmul(q, b));
        bool fix = r != 0 && (r < 0) != (b < 0);
        *mod = fix ? wadd(r, b) : r;
        return fix ? wsub(q, (T)1) : q;
    } else {
        T m = (T)fmod((double)a, (double)b);
        if (b == 0) {
            *mod = m;
            return (T)(a / b);
        }
        T div = (T)((a - m) / b);
        if (m != 0 && (b < 0) != (m < 0)) {
            m = (T)(m + b);
            div = (T)(div - (T)1);
        }
        *mod = m != 0 ? m : (T)copysign(0.0, (double)b);
        if (div == 0)
            return (T)copysign(0.0, (double)(a / b));
        T fl = (T)floor((double)div);
        return div - fl > (T)0.5 ? (T)(fl + (T)1) : fl;
    }
}

/* The CPU's binary_one. */
template <typename T> HD T binary_one(int op, T a, T b)
{
    switch ((dt_binary_op)op) {
    case DT_BINARY_ADD:
        return wadd(a, b);
    case DT_BINARY_SUB:
        return wsub(a, b);
    case DT_BINARY_MUL:
        return wmul(a, b);
    case DT_BINARY_DIV:
        if constexpr (kFloat<T>)
            return a / b;
        else
            return b == 0 ? (T)0 : b == (T)-1 ? wneg(a) : (T)(a / b);
    case DT_BINARY_MAX:
        return a > b ? a : b;
    case DT_BINARY_MIN:
        return a < b ? a : b;
    case DT_BINARY_POW:
        return to_elem<T>(pow_of(a, b));
    case DT_BINARY_EQ:
        return (T)(a == b);
    case DT_BINARY_NE:
        return (T)(a != b);
    case DT_BINARY_LT:
        return (T)(a < b);
    case DT_BINARY_LE:
        return (T)(a <= b);
    case DT_BINARY_GT:
        return (T)(a > b);
    case DT_BINARY_GE:
        return (T)(a >= b);
    case DT_BINARY_FLOORDIV:
    case DT_BINARY_FLOORMOD: {
        T mod, div = floor_divmod(a, b, &mod);
        return op == DT_BINARY_FLOORDIV ? div : mod;
    }
    default:
        return a;
    }
}

/* Broadcasting: the output's shape on merged axes and each operand's strides there (0 where
 * it broadcasts). */
struct BinArgs {
    int nd;
    int64_t ext[R], sa[R], sb[R];
};

/* The CPU's broadcasting (an operand's extent of 1 reads its element 0 on that axis) on
 * merged axes: output axes of extent 1 dropped, and neighbours where each operand is whole
 * on both or broadcast on both merged: (M, N) - (N) is [M, N] with b's strides [0, 1];
 * (B, M, N) + (N) is [B*M, N]. True when both operands are whole (index i of each). */
bool plan_binary(const dt__kargs *k, BinArgs *g)
{
    *g = BinArgs{};
    bool whole_a[R] = {false}, whole_b[R] = {false};
    for (int i = 0; i < k->rank; i++) {
        if (k->shape[i] == 1)
            continue;
        bool wa = k->in_shape[0][i] != 1, wb = k->in_shape[1][i] != 1;
        if (g->nd > 0 && wa == whole_a[g->nd - 1] && wb == whole_b[g->nd - 1]) {
            g->ext[g->nd - 1] *= k->shape[i];
        } else {
            g->ext[g->nd] = k->shape[i];
            whole_a[g->nd] = wa;
            whole_b[g->nd] = wb;
            g->nd++;
        }
    }
    int64_t st_a = 1, st_b = 1;
    bool same = true;
    for (int d = g->nd - 1; d >= 0; d--) {
        g->sa[d] = whole_a[d] ? st_a : 0;
        g->sb[d] = whole_b[d] ? st_b : 0;
        st_a *= whole_a[d] ? g->ext[d] : 1;
        st_b *= whole_b[d] ? g->ext[d] : 1;
        same = same && whole_a[d] && whole_b[d];
    }
    return same;
}

template <typename T> __global__ void binary_same_k(const T *a, const T *b, T *o, int64_t n, int op)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = binary_one(op, a[i], b[i]);
}

template <typename T>
__global__ void binary_k(const T *a, const T *b, T *o, int64_t n, int op, BinArgs g)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t ia, ib;
        offset2(i, g.nd, g.ext, g.sa, g.sb, &ia, &ib);
        o[i] = binary_one(op, a[ia], b[ib]);
    }
}

/* ---- reduce --------------------------------------------------------------------------------- */

/* The input's axes split into kept and reduced ones (extent-1 axes dropped, neighbours
 * contiguous in memory merged). Output i is row-major over the kept axes; its inputs are
 * row-major over the reduced axes, k = 0..nin-1 in increasing memory order: the order the
 * CPU adds them in. */
struct RedArgs {
    int nkeep, nred;
    int64_t keep_ext[R], keep_st[R];
    int64_t red_ext[R], red_st[R];
    int64_t nout, nin;
    int op;
    double scale;
};

/* How a reduction runs (see plan_reduce). */
enum RedPlan { RED_ROWS, RED_COLUMNS, RED_WARP, RED_BLOCK };

/* Which kernel: one thread per output when each output has few inputs, or when outputs are
 * many and the innermost axis is kept (coalesced; bitwise the CPU's order and float type).
 * Otherwise threads share an output: 8 threads on each of 32 neighbouring outputs when the
 * innermost axis is kept (a warp reads 32 neighbours), a warp on an output for moderate inner
 * reductions, a block of 1024 for long ones (a full sum runs on one block: there is no scratch
 * memory for partial results across blocks). */
RedPlan plan_reduce(const dt__kargs *k, RedArgs *r)
{
    *r = RedArgs{};
    r->nout = elems(k->rank, k->shape);
    int64_t ist[R];
    strides_of(k->rank, k->in_shape[0], ist);
    r->nin = 1;
    for (int i = 0; i < k->rank; i++) {
        int64_t e = k->in_shape[0][i];
        bool red = (k->mask >> i) & 1u;
        if (red)
            r->nin *= e;
        if (e == 1)
            continue;
        if (red)
            push_axis(r->red_ext, r->red_st, &r->nred, e, ist[i]);
        else
            push_axis(r->keep_ext, r->keep_st, &r->nkeep, e, ist[i]);
    }
    if (r->nin == 0)
        r->nred = 0; /* nothing is read: every output is init * scale */
    r->op = k->op;
    r->scale = k->a;
    bool inner_reduced = r->nred > 0 && r->red_st[r->nred - 1] == 1;
    if (r->nin <= 16 || (!inner_reduced && r->nout >= 8192))
        return RED_ROWS;
    if (!inner_reduced && r->nout >= 32)
        return RED_COLUMNS;
    return r->nin < 4096 ? RED_WARP : RED_BLOCK;
}

HD int64_t red_in(const RedArgs &r, int64_t k)
{
    return r.nred == 1 ? k * r.red_st[0] : offset1(k, r.nred, r.red_ext, r.red_st);
}

template <typename A> HD A red_init(int op, A lo, A hi)
{
    return op == DT_REDUCE_MAX ? lo : op == DT_REDUCE_MIN ? hi : (A)0;
}

/* The CPU's step: o = v > o ? v : o (MAX), v < o ? v : o (MIN), o + v otherwise. */
template <typename A> HD A red_step(int op, A acc, A v)
{
    if (op == DT_REDUCE_MAX)
        return v > acc ? v : acc;
    if (op == DT_REDUCE_MIN)
        return v < acc ? v : acc;
    return wadd(acc, v);
}

/* The CPU's scaling: (T)(o * a) with the product in double, when a != 1. */
template <typename T> HD T red_finish(const RedArgs &r, T v)
{
    return r.scale != 1.0 ? to_elem<T>((double)v * r.scale) : v;
}

/* Output i by one thread: its inputs in the CPU's order, in T (floats bitwise the CPU's). */
template <typename T> HD T reduce_row(const T *x, const RedArgs &r, int64_t i)
{
    const T *p = x + offset1(i, r.nkeep, r.keep_ext, r.keep_st);
    T acc = red_init<T>(r.op, lowest<T>(), highest<T>());
    for (int64_t k = 0; k < r.nin; k++)
        acc = red_step<T>(r.op, acc, p[red_in(r, k)]);
    return red_finish<T>(r, acc);
}

template <typename T> __global__ void reduce_rows_k(const T *x, T *o, RedArgs r)
{
    for (int64_t i = first_index(); i < r.nout; i += grid_step())
        o[i] = reduce_row<T>(x, r, i);
}

/* Accumulator of the shared reductions: double for floats (an f32 sum then loses less than
 * the CPU's sequential float sum, and the two agree within the 1e-5 the tests allow), T for
 * integers (wrapping, exact). */
template <typename T> using Acc = std::conditional_t<kFloat<T>, double, T>;

/* Lane `lane` of G on output i: inputs lane, lane + G, ... into four independent partial
 * results (loads in flight), then combined. */
template <typename T, int G>
HD Acc<T> reduce_lane(const T *x, const RedArgs &r, int64_t i, int lane)
{
    using A = Acc<T>;
    const T *p = x + offset1(i, r.nkeep, r.keep_ext, r.keep_st);
    A a0 = red_init<A>(r.op, (A)lowest<T>(), (A)highest<T>()), a1 = a0, a2 = a0, a3 = a0;
    int64_t k = lane;
    for (; k + 3 * G < r.nin; k += 4 * G) {
        a0 = red_step<A>(r.op, a0, (A)p[red_in(r, k)]);
        a1 = red_step<A>(r.op, a1, (A)p[red_in(r, k + G)]);
        a2 = red_step<A>(r.op, a2, (A)p[red_in(r, k + 2 * G)]);
        a3 = red_step<A>(r.op, a3, (A)p[red_in(r, k + 3 * G)]);
    }
    for (; k < r.nin; k += G)
        a0 = red_step<A>(r.op, a0, (A)p[red_in(r, k)]);
    return red_step<A>(r.op, red_step<A>(r.op, a0, a1), red_step<A>(r.op, a2, a3));
}

/* Thread t's output (of the block's THREADS / G) and lane: side by side (a warp on
 * neighbouring inputs of one output), or with OUT_MAJOR THREADS / G apart (a warp on the same
 * input of 32 neighbouring outputs). Its slot in shared memory is t. */
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

/* Outputs shared by G threads each: lanes, then a tree in shared memory whose shape depends
 * only on G, so that results are the same on every run. */
template <typename T, int THREADS, int G, bool OUT_MAJOR>
__global__ void __launch_bounds__(THREADS) reduce_group_k(const T *x, T *o, RedArgs r)
{
    using A = Acc<T>;
    constexpr int P = THREADS / G;
    __shared__ A part[THREADS];
    const int t = (int)threadIdx.x;
    int g, lane;
    group_of<THREADS, G, OUT_MAJOR>(t, &g, &lane);
    /* the loop bound is the block's, so every thread reaches every __syncthreads */
    for (int64_t base = (int64_t)blockIdx.x * P; base < r.nout; base += (int64_t)gridDim.x * P) {
        int64_t i = base + g;
        part[t] = i < r.nout ? reduce_lane<T, G>(x, r, i, lane)
                             : red_init<A>(r.op, (A)lowest<T>(), (A)highest<T>());
        __syncthreads();
        for (int w = G / 2; w > 0; w /= 2) {
            if (lane < w)
                part[t] =
                    red_step<A>(r.op, part[t], part[slot_of<THREADS, G, OUT_MAJOR>(g, lane + w)]);
            __syncthreads();
        }
        if (lane == 0 && i < r.nout)
            o[i] = red_finish<T>(r, (T)part[t]);
        __syncthreads();
    }
}

/* ---- transpose ------------------------------------------------------------------------------ */

/* Output axes (extent-1 axes dropped, runs contiguous in the input merged): extents and the
 * input stride of each (the output is row-major). */
struct PermArgs {
    int nd;
    int64_t ext[R], in_st[R];
};

/* When the innermost axis moves: 32 x 32 tiles of the plane (u, v), u the input's innermost
 * axis (stride 1 in the input, out_u in the output), v the output's innermost (stride 1 in
 * the output, in_v in the input); the other axes (row-major, "batch") index the planes. */
struct TileArgs {
    int nb;
    int64_t b_ext[R], b_in[R], b_out[R];
    int64_t eu, ev, out_u, in_v;
    int64_t tiles_u, tiles_v, ntiles;
};

/* out axis i = in axis perm[i]. True when the tiles are worth it (both sides of the plane at
 * least 16): then `a` is set, else `p` alone. */
bool plan_transpose(const dt__kargs *k, PermArgs *p, TileArgs *a)
{
    *p = PermArgs{};
    *a = TileArgs{};
    int64_t ist[R];
    strides_of(k->rank, k->in_shape[0], ist);
    for (int i = 0; i < k->rank; i++)
        if (k->shape[i] != 1)
            push_axis(p->ext, p->in_st, &p->nd, k->shape[i], ist[k->perm[i]]);
    int u = -1, v = p->nd - 1;
    for (int d = 0; d < p->nd; d++)
        if (p->in_st[d] == 1)
            u = d;
    if (u < 0 || u == v || p->ext[u] < 16 || p->ext[v] < 16)
        return false;
    int64_t ost[R];
    strides_of(p->nd, p->ext, ost);
    for (int d = 0; d < p->nd; d++)
        if (d != u && d != v) {
            a->b_ext[a->nb] = p->ext[d];
            a->b_in[a->nb] = p->in_st[d];
            a->b_out[a->nb] = ost[d];
            a->nb++;
        }
    a->eu = p->ext[u];
    a->ev = p->ext[v];
    a->out_u = ost[u];
    a->in_v = p->in_st[v];
    a->tiles_u = (a->eu + 31) / 32;
    a->tiles_v = (a->ev + 31) / 32;
    a->ntiles = elems(k->rank, k->shape) / (a->eu * a->ev) * a->tiles_u * a->tiles_v;
    return true;
}

template <typename T> __global__ void transpose_k(const T *x, T *o, int64_t n, PermArgs p)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = x[offset1(i, p.nd, p.ext, p.in_st)];
}

/* Tile t: the offsets of its plane and its first (u, v). */
HD void tile_origin(const TileArgs &a, int64_t t, int64_t *ib, int64_t *ob, int64_t *u0,
                    int64_t *v0)
{
    int64_t tv = t % a.tiles_v, rest = t / a.tiles_v;
    int64_t tu = rest % a.tiles_u, b = rest / a.tiles_u;
    offset2(b, a.nb, a.b_ext, a.b_in, a.b_out, ib, ob);
    *u0 = tu * 32;
    *v0 = tv * 32;
}

/* Thread th of 256 (32 along a row, 8 rows): reads along u (the input's contiguous axis),
 * writes along v (the output's); tile[v][u] in between. */
template <typename T>
HD void tile_load(T tile[32][33], const T *x, const TileArgs &a, int64_t ib, int64_t u0, int64_t v0,
                  int th)
{
    const int tx = th % 32, ty = th / 32;
    for (int j = ty; j < 32; j += 8) {
        int64_t u = u0 + tx, v = v0 + j;
        if (u < a.eu && v < a.ev)
            tile[j][tx] = x[ib + u + v * a.in_v];
    }
}

template <typename T>
HD void tile_store(T *o, const T tile[32][33], const TileArgs &a, int64_t ob, int64_t u0,
                   int64_t v0, int th)
{
    const int tx = th % 32, ty = th / 32;
    for (int j = ty; j < 32; j += 8) {
        int64_t u = u0 + j, v = v0 + tx;
        if (u < a.eu && v < a.ev)
            o[ob + u * a.out_u + v] = tile[tx][j];
    }
}

template <typename T>
__global__ void __launch_bounds__(256) transpose_tile_k(const T *x, T *o, TileArgs a)
{
    __shared__ T tile[32][33]; /* 33: the column reads hit distinct banks */
    for (int64_t t = blockIdx.x; t < a.ntiles; t += gridDim.x) {
        int64_t ib, ob, u0, v0;
        tile_origin(a, t, &ib, &ob, &u0, &v0);
        tile_load<T>(tile, x, a, ib, u0, v0, (int)threadIdx.x);
        __syncthreads();
        tile_store<T>(o, tile, a, ob, u0, v0, (int)threadIdx.x);
        __syncthreads();
    }
}

/* ---- block copies --------------------------------------------------------------------------- */

/* One block of COPY_BLOCKS: its extent with axes merged where contiguous in both arrays, the
 * strides of both arrays, and the offsets of its first element. */
struct CopyBlock {
    int nd;
    int64_t n, src, dst;
    int64_t ext[R], ss[R], ds[R];
};

/* dt__copy_block's mapping of a block. True when it is one contiguous run in both arrays. */
bool plan_block(const dt__block *b, CopyBlock *c)
{
    *c = CopyBlock{};
    int64_t ss[R], ds[R];
    strides_of(b->rank, b->src_shape, ss);
    strides_of(b->rank, b->dst_shape, ds);
    c->n = elems(b->rank, b->extent);
    c->src = b->src_at;
    c->dst = b->dst_at;
    for (int q = 0; q < b->rank; q++) {
        c->src += b->src_off[q] * ss[q];
        c->dst += b->dst_off[q] * ds[q];
        int64_t e = b->extent[q];
        if (e == 1)
            continue;
        int d = c->nd;
        if (d > 0 && c->ss[d - 1] == e * ss[q] && c->ds[d - 1] == e * ds[q]) {
            c->ext[d - 1] *= e;
            c->ss[d - 1] = ss[q];
            c->ds[d - 1] = ds[q];
        } else {
            c->ext[d] = e;
            c->ss[d] = ss[q];
            c->ds[d] = ds[q];
            c->nd++;
        }
    }
    return c->nd == 0 || (c->nd == 1 && c->ss[0] == 1 && c->ds[0] == 1);
}

/* Up to kPack blocks a launch, blockIdx.y picking one: a launch for many small blocks (about
 * 1.8 KB of parameters). */
constexpr int kPack = 8;
struct CopyPack {
    CopyBlock b[kPack];
};

template <typename T> __global__ void copy_blocks_k(const T *x, T *o, CopyPack pk)
{
    const CopyBlock &b = pk.b[blockIdx.y];
    for (int64_t i = first_index(); i < b.n; i += grid_step()) {
        int64_t s, d;
        offset2(i, b.nd, b.ext, b.ss, b.ds, &s, &d);
        o[b.dst + d] = x[b.src + s];
    }
}

/* ---- integer gemm --------------------------------------------------------------------------- */

/* Row-major C[b] (m x n) = op(A[b]) op(B[b]): a 64 x 64 tile of C a block, 16 of k at a time
 * through shared memory, each of 256 threads 4 x 4 outputs (rows ty + 16 r, columns tx +
 * 16 s). Sums and products in the unsigned type of T's width: the residues of the CPU's
 * wrapping steps through uint64_t. */
constexpr int kGT = 64, kGK = 16;

struct GemmArgs {
    int64_t batch, m, n, k, sa, sb;
    bool ta, tb;
};

template <typename T> using Uns = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

/* Thread th's share of loading as[q][i] = op(A)(i0 + i, q0 + q) and bs[q][j] =
 * op(B)(q0 + q, j0 + j): neighbouring threads along each operand's contiguous axis; zeros
 * outside the matrices (they add nothing). */
template <typename T>
HD void gemm_load(Uns<T> as[kGK][kGT + 1], Uns<T> bs[kGK][kGT + 1], const T *a, const T *b,
                  const GemmArgs &g, int64_t i0, int64_t j0, int64_t q0, int th)
{
    using U = Uns<T>;
    for (int l = th; l < kGT * kGK; l += 256) {
        int i = g.ta ? l % kGT : l / kGK, qa = g.ta ? l / kGT : l % kGK;
        int64_t gi = i0 + i, gq = q0 + qa;
        as[qa][i] = gi < g.m && gq < g.k ? (U)(g.ta ? a[gq * g.m + gi] : a[gi * g.k + gq]) : (U)0;
        int j = g.tb ? l / kGK : l % kGT, qb = g.tb ? l % kGK : l / kGT;
        int64_t gj = j0 + j;
        gq = q0 + qb;
        bs[qb][j] = gj < g.n && gq < g.k ? (U)(g.tb ? b[gj * g.k + gq] : b[gq * g.n + gj]) : (U)0;
    }
}

template <typename T>
HD void gemm_mac(Uns<T> acc[4][4], const Uns<T> as[kGK][kGT + 1], const Uns<T> bs[kGK][kGT + 1],
                 int th)
{
    const int tx = th % 16, ty = th / 16;
    UNROLL
    for (int q = 0; q < kGK; q++) {
        Uns<T> av[4], bv[4];
        UNROLL
        for (int r = 0; r < 4; r++) {
            av[r] = as[q][ty + 16 * r];
            bv[r] = bs[q][tx + 16 * r];
        }
        UNROLL
        for (int r = 0; r < 4; r++) {
            UNROLL
            for (int s = 0; s < 4; s++)
                acc[r][s] += av[r] * bv[s];
        }
    }
}

template <typename T>
HD void gemm_store(T *c, const Uns<T> acc[4][4], const GemmArgs &g, int64_t i0, int64_t j0, int th)
{
    const int tx = th % 16, ty = th / 16;
    UNROLL
    for (int r = 0; r < 4; r++) {
        UNROLL
        for (int s = 0; s < 4; s++) {
            int64_t gi = i0 + ty + 16 * r, gj = j0 + tx + 16 * s;
            if (gi < g.m && gj < g.n)
                c[gi * g.n + gj] = (T)acc[r][s];
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256) gemm_int_k(const T *A, const T *B, T *C, GemmArgs g)
{
    __shared__ Uns<T> as[kGK][kGT + 1], bs[kGK][kGT + 1];
    const int th = (int)threadIdx.x;
    const int64_t tiles_m = (g.m + kGT - 1) / kGT, tiles_n = (g.n + kGT - 1) / kGT;
    /* the loop bounds are the block's, so every thread reaches every __syncthreads */
    for (int64_t bi = blockIdx.z; bi < g.batch; bi += gridDim.z)
        for (int64_t ti = blockIdx.y; ti < tiles_m; ti += gridDim.y)
            for (int64_t tj = blockIdx.x; tj < tiles_n; tj += gridDim.x) {
                Uns<T> acc[4][4] = {};
                for (int64_t q0 = 0; q0 < g.k; q0 += kGK) {
                    gemm_load<T>(as, bs, A + bi * g.sa, B + bi * g.sb, g, ti * kGT, tj * kGT, q0,
                                 th);
                    __syncthreads();
                    gemm_mac<T>(acc, as, bs, th);
                    __syncthreads();
                }
                gemm_store<T>(C + bi * g.m * g.n, acc, g, ti * kGT, tj * kGT, th);
            }
}

/* ---- combine (collectives between the GPUs of one client) ----------------------------------- */

struct CombineArgs {
    const void *src[DT__COMBINE_MAX];
    void *dst[DT__COMBINE_MAX];
    int nsrc, ndst, by;
};

/* (src[0][i] op src[1][i] op ...) / by, left to right as the CPU's combine (MAX: a > b ? a : b
 * with a the running value; MIN likewise; SUM, MEAN and PROD wrap for integers). */
template <typename T, int OP> HD T combine_at(const CombineArgs &c, int64_t i)
{
    T v = ((const T *)c.src[0])[i];
    UNROLL
    for (int s = 1; s < DT__COMBINE_MAX; s++)
        if (s < c.nsrc) {
            T w = ((const T *)c.src[s])[i];
            if (OP == DT_REDUCE_MAX)
                v = v > w ? v : w;
            else if (OP == DT_REDUCE_MIN)
                v = v < w ? v : w;
            else if (OP == DT_REDUCE_PROD)
                v = wmul(v, w);
            else
                v = wadd(v, w);
        }
    return c.by > 1 ? (T)(v / (T)c.by) : v;
}

/* Every source is read at i before any destination is written there (in-place is fine). */
template <typename T, int OP> __global__ void combine_k(int64_t n, CombineArgs c)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        T v = combine_at<T, OP>(c, i);
        UNROLL
        for (int d = 0; d < DT__COMBINE_MAX; d++)
            if (d < c.ndst)
                ((T *)c.dst[d])[i] = v;
    }
}

template <typename T>
dt_status combine_typed(const dt__kctx *x, dt_reduce_op op, const CombineArgs &c, int64_t n)
{
    cudaStream_t st = stream_of(x);
    unsigned grid = grid_for(n);
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_MEAN:
        combine_k<T, DT_REDUCE_SUM><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_MAX:
        combine_k<T, DT_REDUCE_MAX><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_MIN:
        combine_k<T, DT_REDUCE_MIN><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_PROD:
        combine_k<T, DT_REDUCE_PROD><<<grid, kThreads, 0, st>>>(n, c);
        break;
    default:
        return dt__fail(DT_ERR_ARG, "CUDA:%d (GPU %d): combine: no reduction %d", x->index,
                        x->ordinal, (int)op);
    }
    return launched(x, "combine", dtype_of<T>());
}

/* ---- the table's entries -------------------------------------------------------------------- */

template <typename T> dt_status fill_n(const dt__kctx *x, T *out, int64_t n, T v, const char *name)
{
    if (n <= 0)
        return DT_OK;
    /* all-zero bytes (0, not -0.0) by memset */
    unsigned char bytes[sizeof(T)];
    memcpy(bytes, &v, sizeof v);
    bool zero = true;
    for (size_t i = 0; i < sizeof(T); i++)
        zero = zero && bytes[i] == 0;
    if (zero)
        return queued(x, name, dtype_of<T>(),
                      cudaMemsetAsync(out, 0, (size_t)n * sizeof(T), stream_of(x)));
    fill_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>(out, n, v);
    return launched(x, name, dtype_of<T>());
}

template <typename T>
dt_status fill(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    /* (T)k->a converted on the host, as the CPU converts it */
    return fill_n<T>(x, (T *)out, elems(k->rank, k->shape), (T)k->a, "fill");
}

template <typename T>
dt_status arange(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    int64_t n = k->shape[0];
    if (n <= 0)
        return DT_OK;
    arange_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((T *)out, n, k->a, k->b, k->offset[0]);
    return launched(x, "arange", dtype_of<T>());
}

template <typename T>
dt_status random_values(const dt__kctx *x, const dt__kargs *k, void *out, bool normal)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    random_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((T *)out, n, plan_random(k, normal));
    return launched(x, normal ? "philox_normal" : "philox_uniform", dtype_of<T>());
}

template <typename T>
dt_status philox_uniform(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random_values<T>(x, k, out, false);
}

template <typename T>
dt_status philox_normal(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random_values<T>(x, k, out, true);
}

template <typename T>
dt_status unary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    unary_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const T *)in[0], (T *)out, n, k->op);
    return launched(x, "unary", dtype_of<T>());
}

template <typename T>
dt_status binary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    const T *a = (const T *)in[0], *b = (const T *)in[1];
    BinArgs g;
    if (plan_binary(k, &g))
        binary_same_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, b, (T *)out, n, k->op);
    else
        binary_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>(a, b, (T *)out, n, k->op, g);
    return launched(x, "binary", dtype_of<T>());
}

/* out has the input's rank, the axes in k->mask of extent 1; an empty reduction writes
 * init * scale everywhere. */
template <typename T>
dt_status reduce(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    RedArgs r;
    RedPlan plan = plan_reduce(k, &r);
    if (r.nout <= 0)
        return DT_OK;
    const T *xin = (const T *)in[0];
    T *o = (T *)out;
    cudaStream_t st = stream_of(x);
    switch (plan) {
    case RED_ROWS:
        reduce_rows_k<T><<<grid_for(r.nout), kThreads, 0, st>>>(xin, o, r);
        break;
    case RED_COLUMNS:
        reduce_group_k<T, 256, 8, true><<<blocks_for(r.nout, 32), 256, 0, st>>>(xin, o, r);
        break;
    case RED_WARP:
        reduce_group_k<T, 256, 32, false><<<blocks_for(r.nout, 8), 256, 0, st>>>(xin, o, r);
        break;
    case RED_BLOCK:
        reduce_group_k<T, 1024, 1024, false><<<blocks_for(r.nout, 1), 1024, 0, st>>>(xin, o, r);
        break;
    }
    return launched(x, "reduce", dtype_of<T>());
}

template <typename T>
dt_status transpose(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    PermArgs p;
    TileArgs a;
    const T *xin = (const T *)in[0];
    if (plan_transpose(k, &p, &a))
        transpose_tile_k<T><<<blocks_for(a.ntiles, 1), 256, 0, stream_of(x)>>>(xin, (T *)out, a);
    else
        transpose_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>(xin, (T *)out, n, p);
    return launched(x, "transpose", dtype_of<T>());
}

/* Blocks of zero elements are skipped; a block that is one contiguous run of a million
 * elements or more is a cudaMemcpyAsync, the others go kPack to a launch. Launches and copies
 * are queued in block order (the blocks of one call are disjoint in the destination). */
template <typename T>
dt_status copy_blocks(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    if (k->nblocks > 0 && !k->blocks)
        return dt__fail(DT_ERR_ARG, "CUDA:%d (GPU %d): copy_blocks for %s: %d blocks and no list",
                        x->index, x->ordinal, dt_dtype_name(dtype_of<T>()), k->nblocks);
    const T *src = (const T *)in[0];
    T *dst = (T *)out;
    cudaStream_t st = stream_of(x);
    CopyPack pk{};
    int np = 0;
    int64_t most = 0;
    for (int i = 0; i <= k->nblocks; i++) {
        CopyBlock c{};
        bool run = false;
        if (i < k->nblocks) {
            run = plan_block(&k->blocks[i], &c);
            if (c.n <= 0)
                continue;
            run = run && c.n >= (1 << 20);
            if (!run) {
                pk.b[np++] = c;
                most = c.n > most ? c.n : most;
            }
        }
        /* the pack goes when full, before a copy, and at the end */
        if (np > 0 && (np == kPack || run || i == k->nblocks)) {
            copy_blocks_k<T><<<dim3(grid_for(most), (unsigned)np), kThreads, 0, st>>>(src, dst, pk);
            DT_TRY(launched(x, "copy_blocks", dtype_of<T>()));
            np = 0;
            most = 0;
        }
        if (run)
            DT_TRY(queued(x, "copy_blocks", dtype_of<T>(),
                          cudaMemcpyAsync(dst + c.dst, src + c.src, (size_t)c.n * sizeof(T),
                                          cudaMemcpyDeviceToDevice, st)));
    }
    return DT_OK;
}

template <typename T>
dt_status select_fill(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    if (!k->select)
        return fill_n<T>(x, (T *)out, n, (T)k->a, "select_fill");
    return queued(
        x, "select_fill", dtype_of<T>(),
        cudaMemcpyAsync(out, in[0], (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream_of(x)));
}

/* One cuBLAS call: row-major C = op(A) op(B), `count` of them at strides sa, sb, sc, by the
 * column-major identity C^T = op(B)^T op(A)^T (B first, m and n swapped; lda = ta ? m : k,
 * ldb = tb ? k : n, ldc = n). f32 in FP32, or on TF32 tensor cores when the runtime allows. */
template <typename T>
cublasStatus_t blas_gemm(const dt__kctx *x, bool ta, bool tb, int m, int n, int kk, const T *A,
                         long long sa, const T *B, long long sb, T *C, long long sc, int count)
{
    cublasHandle_t h = (cublasHandle_t)x->blas;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int lda = ta ? m : kk, ldb = tb ? kk : n;
    const T one = 1, zero = 0;
    if constexpr (std::is_same<T, float>::value) {
        cublasComputeType_t ct = x->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        if (count == 1)
            return cublasGemmEx(h, opb, opa, n, m, kk, &one, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda,
                                &zero, C, CUDA_R_32F, n, ct, CUBLAS_GEMM_DEFAULT);
        return cublasGemmStridedBatchedEx(h, opb, opa, n, m, kk, &one, B, CUDA_R_32F, ldb, sb, A,
                                          CUDA_R_32F, lda, sa, &zero, C, CUDA_R_32F, n, sc, count,
                                          ct, CUBLAS_GEMM_DEFAULT);
    } else {
        if (count == 1)
            return cublasDgemm(h, opb, opa, n, m, kk, &one, B, ldb, A, lda, &zero, C, n);
        return cublasDgemmStridedBatched(h, opb, opa, n, m, kk, &one, B, ldb, sb, A, lda, sa, &zero,
                                         C, n, sc, count);
    }
}

/* f32 and f64 through cuBLAS. Both operands batched: strided-batched calls (of at most
 * INT_MAX matrices). cuBLAS does not document a batch stride of 0, so a broadcast B under an
 * untransposed A with contiguous batches is one gemm of batch * m rows ([batch*m, k] @ [k, n]
 * is C), and any other broadcast one call per matrix. */
template <typename T>
dt_status gemm_blas(const dt__kctx *x, const dt__kargs *k, const T *A, const T *B, T *C)
{
    int64_t m = k->m, n = k->n, kk = k->k, batch = k->batch;
    int64_t sa = k->a_batch_stride, sb = k->b_batch_stride, mn = m * n;
    if (m > INT32_MAX || n > INT32_MAX || kk > INT32_MAX)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "CUDA:%d (GPU %d): gemm for %s of [%lld,%lld] @ [%lld,%lld]: cuBLAS "
                        "takes extents below 2^31",
                        x->index, x->ordinal, dt_dtype_name(dtype_of<T>()), (long long)m,
                        (long long)kk, (long long)kk, (long long)n);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (batch == 1) {
        s = blas_gemm<T>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A, 0, B, 0, C, 0, 1);
    } else if (sa != 0 && sb != 0) {
        for (int64_t b0 = 0; b0 < batch && s == CUBLAS_STATUS_SUCCESS; b0 += INT32_MAX) {
            int64_t cnt = batch - b0 < INT32_MAX ? batch - b0 : INT32_MAX;
            s = blas_gemm<T>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A + b0 * sa, sa, B + b0 * sb,
                             sb, C + b0 * mn, mn, (int)cnt);
        }
    } else if (sb == 0 && !k->ta && sa == m * kk && batch * m <= INT32_MAX) {
        s = blas_gemm<T>(x, false, k->tb, (int)(batch * m), (int)n, (int)kk, A, 0, B, 0, C, 0, 1);
    } else {
        for (int64_t b = 0; b < batch && s == CUBLAS_STATUS_SUCCESS; b++)
            s = blas_gemm<T>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A + b * sa, 0, B + b * sb, 0,
                             C + b * mn, 0, 1);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): %s kernel for %s failed: %s", x->index,
                        x->ordinal, "gemm (cuBLAS)", dt_dtype_name(dtype_of<T>()),
                        cublasGetStatusString(s));
    return DT_OK;
}

/* C[b] = op(A[b]) op(B[b]), row-major, for b < batch: A[b] at A + b * a_batch_stride, B[b]
 * likewise (0 broadcasts), C[b] at C + b * m * n. k == 0 gives zeros. */
template <typename T>
dt_status gemm(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t m = k->m, n = k->n, batch = k->batch;
    if (m <= 0 || n <= 0 || batch <= 0)
        return DT_OK;
    if (k->k <= 0)
        return queued(x, "gemm", dtype_of<T>(),
                      cudaMemsetAsync(out, 0, (size_t)(batch * m * n) * sizeof(T), stream_of(x)));
    const T *A = (const T *)in[0], *B = (const T *)in[1];
    if constexpr (kFloat<T>) {
        return gemm_blas<T>(x, k, A, B, (T *)out);
    } else {
        GemmArgs g{batch, m, n, k->k, k->a_batch_stride, k->b_batch_stride, k->ta, k->tb};
        int64_t tm = (m + kGT - 1) / kGT, tn = (n + kGT - 1) / kGT;
        dim3 grid((unsigned)(tn < 65535 ? tn : 65535), (unsigned)(tm < 65535 ? tm : 65535),
                  (unsigned)(batch < 65535 ? batch : 65535));
        gemm_int_k<T><<<grid, 256, 0, stream_of(x)>>>(A, B, (T *)out, g);
        return launched(x, "gemm", dtype_of<T>());
    }
}

} // namespace

extern "C" {

#define ROW(NAME)                                               \
    {                                                           \
        NAME<float>, NAME<double>, NAME<int32_t>, NAME<int64_t> \
    }

/* Rows in DT__KERNEL_LIST order, columns in DT_DTYPE_LIST order (f32, f64, i32, i64). */
const dt__kernel_fn dt__cuda_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {
    ROW(fill),      ROW(arange),      ROW(philox_uniform), ROW(philox_normal),
    ROW(unary),     ROW(binary),      ROW(reduce),         ROW(gemm),
    ROW(transpose), ROW(copy_blocks), ROW(select_fill),
};

#undef ROW

dt_status dt__cuda_combine(const dt__kctx *x, dt_dtype t, dt_reduce_op op, int nsrc,
                           const void *const src[], int ndst, void *const dst[], int64_t n, int by)
{
    if (nsrc < 1 || nsrc > DT__COMBINE_MAX || ndst < 1 || ndst > DT__COMBINE_MAX)
        return dt__fail(DT_ERR_ARG,
                        "CUDA:%d (GPU %d): combine of %d sources into %d destinations (1 to %d)",
                        x->index, x->ordinal, nsrc, ndst, DT__COMBINE_MAX);
    if (n <= 0)
        return DT_OK;
    CombineArgs c{};
    for (int i = 0; i < nsrc; i++)
        c.src[i] = src[i];
    for (int i = 0; i < ndst; i++)
        c.dst[i] = dst[i];
    c.nsrc = nsrc;
    c.ndst = ndst;
    c.by = by;
    switch (t) {
    case DT_DTYPE_F32:
        return combine_typed<float>(x, op, c, n);
    case DT_DTYPE_F64:
        return combine_typed<double>(x, op, c, n);
    case DT_DTYPE_I32:
        return combine_typed<int32_t>(x, op, c, n);
    case DT_DTYPE_I64:
        return combine_typed<int64_t>(x, op, c, n);
    default:
        return dt__fail(DT_ERR_DTYPE, "CUDA:%d (GPU %d): combine of dtype %d", x->index, x->ordinal,
                        (int)t);
    }
}

} /* extern "C" */
