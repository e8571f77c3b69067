/* CUDA local kernels: the (kernel, dtype) table of common/kernels.h for f32, f64, i32 and
 * i64, with the semantics of the CPU reference (ops/cpu/kernels.c) element for element, and
 * the combine kernel of the GPU collectives. Everything is queued on the device's stream
 * (x->stream); nothing here waits for the GPU or allocates memory.
 *
 * Arithmetic as on the CPU: integer sums, differences and products wrap (through uint64_t, as
 * DT__ADD and friends); the float functions of unary ops are computed in double and rounded
 * to the element type; random numbers come from common/philox.h, and nvcc runs with
 * --fmad=false so they are bitwise the CPU's. Reductions accumulate in double for floats (the
 * CPU adds in the element type, left to right: results agree within the 1e-5 the tests
 * allow) and wrap for integers (exact). */
#include "kernels.h"
#include "philox.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <type_traits>

namespace
{

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535 * 16;

/* Blocks of a grid-stride launch over n elements (at least 1). */
unsigned grid_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

int64_t elems(int rank, const int64_t s[])
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= s[i];
    return n;
}

/* Row-major strides of a shape. */
struct Dims {
    int rank;
    int64_t shape[DT_MAX_RANK];
    int64_t stride[DT_MAX_RANK];
};

Dims dims_of(int rank, const int64_t s[])
{
    Dims d{};
    d.rank = rank;
    int64_t st = 1;
    for (int i = rank - 1; i >= 0; i--) {
        d.shape[i] = s[i];
        d.stride[i] = st;
        st *= s[i];
    }
    return d;
}

cudaStream_t stream_of(const dt__kctx *x)
{
    return (cudaStream_t)x->stream;
}

dt_status launched(const dt__kctx *x, const char *kernel, dt_dtype t)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return DT_OK;
    return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): %s kernel for %s failed: %s", x->index,
                    x->ordinal, kernel, dt_dtype_name(t), cudaGetErrorString(e));
}

template <typename T> constexpr dt_dtype dtype_of()
{
    return std::is_same<T, float>::value     ? DT_DTYPE_F32
           : std::is_same<T, double>::value  ? DT_DTYPE_F64
           : std::is_same<T, int32_t>::value ? DT_DTYPE_I32
                                             : DT_DTYPE_I64;
}

/* ---- wrapping arithmetic, as the CPU's DT__ADD / DT__SUB / DT__MUL ------------------------ */

template <typename T> __device__ T wadd(T a, T b)
{
    if constexpr (std::is_floating_point<T>::value)
        return a + b;
    else
        return (T)((uint64_t)a + (uint64_t)b);
}

template <typename T> __device__ T wsub(T a, T b)
{
    if constexpr (std::is_floating_point<T>::value)
        return a - b;
    else
        return (T)((uint64_t)a - (uint64_t)b);
}

template <typename T> __device__ T wmul(T a, T b)
{
    if constexpr (std::is_floating_point<T>::value)
        return a * b;
    else
        return (T)((uint64_t)a * (uint64_t)b);
}

template <typename T> __device__ T lowest()
{
    if constexpr (std::is_floating_point<T>::value)
        return (T)-INFINITY;
    else if constexpr (sizeof(T) == 4)
        return (T)INT32_MIN;
    else
        return (T)INT64_MIN;
}

template <typename T> __device__ T highest()
{
    if constexpr (std::is_floating_point<T>::value)
        return (T)INFINITY;
    else if constexpr (sizeof(T) == 4)
        return (T)INT32_MAX;
    else
        return (T)INT64_MAX;
}

/* ---- fill, arange, random ------------------------------------------------------------------ */

template <typename T> __global__ void fill_k(T *o, int64_t n, T v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        o[i] = v;
}

template <typename T> __global__ void arange_k(T *o, int64_t n, double a, double b, int64_t off)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        o[i] = (T)(a + b * (double)(off + i));
}

struct RandArgs {
    Dims local;                  /* the shard's shape and strides */
    int64_t offset[DT_MAX_RANK]; /* global index of its first element */
    int64_t gstride[DT_MAX_RANK];
    uint64_t seed, key;
    double a, b;
    bool normal;
};

template <typename T> __global__ void random_k(T *o, int64_t n, RandArgs r)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t e = 0;
        for (int a = 0; a < r.local.rank; a++) {
            int64_t idx = i / r.local.stride[a] % r.local.shape[a];
            e += (uint64_t)(r.offset[a] + idx) * (uint64_t)r.gstride[a];
        }
        double u = dt__random_value(r.normal, sizeof(T) == 8, r.seed, r.key, e);
        o[i] = (T)dt__random_scale(r.normal, r.a, r.b, u);
    }
}

/* ---- elementwise ------------------------------------------------------------------------- */

template <typename T> __device__ T unary_one(int op, T x)
{
    switch ((dt_unary_op)op) {
    case DT_UNARY_NEG:
        return wsub((T)0, x);
    case DT_UNARY_ABS:
        return x < 0 ? wsub((T)0, x) : x;
    case DT_UNARY_RELU:
        return x > 0 ? x : (T)0;
    case DT_UNARY_SQUARE:
        return wmul(x, x);
    default:
        break;
    }
    double v = (double)x;
    switch ((dt_unary_op)op) {
    case DT_UNARY_EXP:
        return (T)exp(v);
    case DT_UNARY_LOG:
        return (T)log(v);
    case DT_UNARY_SQRT:
        return (T)sqrt(v);
    case DT_UNARY_TANH:
        return (T)tanh(v);
    case DT_UNARY_SIGMOID:
        return (T)(1.0 / (1.0 + exp(-v)));
    case DT_UNARY_SIN:
        return (T)sin(v);
    case DT_UNARY_COS:
        return (T)cos(v);
    default:
        return x;
    }
}

template <typename T> __global__ void unary_k(const T *x, T *o, int64_t n, int op)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        o[i] = unary_one(op, x[i]);
}

/* numpy's divmod, as the CPU's floor_divmod: the quotient rounded towards minus infinity and
 * the remainder with the divisor's sign; floats through fmod; an integer divisor of 0 gives 0
 * and 0. */
template <typename T> __device__ T floor_divmod(T a, T b, T *mod)
{
    if constexpr (!std::is_floating_point<T>::value) {
        if (b == 0) {
            *mod = 0;
            return 0;
        }
        T q = b == (T)-1 ? wsub((T)0, a) : (T)(a / b);
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

template <typename T> __device__ T binary_one(int op, T a, T b)
{
    switch ((dt_binary_op)op) {
    case DT_BINARY_ADD:
        return wadd(a, b);
    case DT_BINARY_SUB:
        return wsub(a, b);
    case DT_BINARY_MUL:
        return wmul(a, b);
    case DT_BINARY_DIV:
        if constexpr (std::is_floating_point<T>::value)
            return a / b;
        else
            return b == 0 ? (T)0 : b == (T)-1 ? wsub((T)0, a) : (T)(a / b);
    case DT_BINARY_MAX:
        return a > b ? a : b;
    case DT_BINARY_MIN:
        return a < b ? a : b;
    case DT_BINARY_POW:
        return (T)pow((double)a, (double)b);
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

/* Operand strides aligned to the output (0 where an operand's extent is 1: broadcast). */
struct Bcast {
    Dims out;
    int64_t sa[DT_MAX_RANK], sb[DT_MAX_RANK];
};

template <typename T>
__global__ void binary_k(const T *a, const T *b, T *o, int64_t n, int op, bool same, Bcast bc)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (same) {
            o[i] = binary_one(op, a[i], b[i]);
            continue;
        }
        int64_t ia = 0, ib = 0;
        for (int q = 0; q < bc.out.rank; q++) {
            int64_t idx = i / bc.out.stride[q] % bc.out.shape[q];
            ia += idx * bc.sa[q];
            ib += idx * bc.sb[q];
        }
        o[i] = binary_one(op, a[ia], b[ib]);
    }
}

/* ---- reduce ------------------------------------------------------------------------------- */

/* Output element o and reduced element r (each a row-major index over its own axes) map to
 * the input offset sum over kept axes of idx * stride plus over reduced axes likewise. */
struct RedArgs {
    int nkeep, nred;
    int64_t keep_shape[DT_MAX_RANK], keep_stride[DT_MAX_RANK]; /* input strides */
    int64_t red_shape[DT_MAX_RANK], red_stride[DT_MAX_RANK];
    int64_t nout, nin_per_out;
    int op;
    double scale;
};

__device__ int64_t red_offset(const RedArgs &r, int64_t o, int64_t k)
{
    int64_t off = 0;
    for (int q = r.nkeep - 1; q >= 0; q--) {
        off += o % r.keep_shape[q] * r.keep_stride[q];
        o /= r.keep_shape[q];
    }
    for (int q = r.nred - 1; q >= 0; q--) {
        off += k % r.red_shape[q] * r.red_stride[q];
        k /= r.red_shape[q];
    }
    return off;
}

/* Accumulator: double for floats, the element type (wrapping) for integers. */
template <typename T>
using Acc = typename std::conditional<std::is_floating_point<T>::value, double, T>::type;

template <typename T> __device__ Acc<T> red_init(int op)
{
    return op == DT_REDUCE_MAX   ? (Acc<T>)lowest<T>()
           : op == DT_REDUCE_MIN ? (Acc<T>)highest<T>()
                                 : (Acc<T>)0;
}

template <typename T> __device__ Acc<T> red_step(int op, Acc<T> acc, Acc<T> v)
{
    if (op == DT_REDUCE_MAX)
        return v > acc ? v : acc;
    if (op == DT_REDUCE_MIN)
        return v < acc ? v : acc;
    return wadd(acc, v);
}

template <typename T> __device__ T red_finish(const RedArgs &r, Acc<T> acc)
{
    T v = (T)acc;
    return r.scale != 1.0 ? (T)(v * r.scale) : v;
}

/* Many outputs: one thread each, reducing its inputs in order. */
template <typename T> __global__ void reduce_rows_k(const T *x, T *o, RedArgs r)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < r.nout;
         i += (int64_t)gridDim.x * blockDim.x) {
        Acc<T> acc = red_init<T>(r.op);
        for (int64_t k = 0; k < r.nin_per_out; k++)
            acc = red_step<T>(r.op, acc, (Acc<T>)x[red_offset(r, i, k)]);
        o[i] = red_finish<T>(r, acc);
    }
}

/* Few outputs, many inputs each: one block per output, a tree in shared memory (fixed shape,
 * so the result is the same on every run). */
template <typename T> __global__ void reduce_tree_k(const T *x, T *o, RedArgs r)
{
    __shared__ Acc<T> part[kThreads];
    for (int64_t i = blockIdx.x; i < r.nout; i += gridDim.x) {
        Acc<T> acc = red_init<T>(r.op);
        for (int64_t k = threadIdx.x; k < r.nin_per_out; k += blockDim.x)
            acc = red_step<T>(r.op, acc, (Acc<T>)x[red_offset(r, i, k)]);
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int w = kThreads / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w)
                part[threadIdx.x] = red_step<T>(r.op, part[threadIdx.x], part[threadIdx.x + w]);
            __syncthreads();
        }
        if (threadIdx.x == 0)
            o[i] = red_finish<T>(r, part[0]);
        __syncthreads();
    }
}

/* ---- transpose and block copies ------------------------------------------------------------ */

struct Perm {
    Dims out;
    int64_t in_stride[DT_MAX_RANK]; /* of the input axis feeding each output axis */
};

template <typename T> __global__ void transpose_k(const T *x, T *o, int64_t n, Perm p)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t ii = 0;
        for (int q = 0; q < p.out.rank; q++)
            ii += i / p.out.stride[q] % p.out.shape[q] * p.in_stride[q];
        o[i] = x[ii];
    }
}

struct Block {
    Dims ext;                   /* the block's extent */
    int64_t src_base, dst_base; /* element offsets of its first element */
    int64_t sstride[DT_MAX_RANK], dstride[DT_MAX_RANK];
};

template <typename T> __global__ void copy_block_k(const T *x, T *o, int64_t n, Block b)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = b.src_base, d = b.dst_base;
        for (int q = 0; q < b.ext.rank; q++) {
            int64_t idx = i / b.ext.stride[q] % b.ext.shape[q];
            s += idx * b.sstride[q];
            d += idx * b.dstride[q];
        }
        o[d] = x[s];
    }
}

/* ---- integer gemm: row-major, one thread per output element, wrapping ------------------ */

template <typename T>
__global__ void gemm_int_k(const T *A, const T *B, T *C, int64_t batch, int64_t m, int64_t n,
                           int64_t kk, int64_t sa, int64_t sb, bool ta, bool tb)
{
    int64_t total = batch * m * n;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t bi = t / (m * n), i = t / n % m, j = t % n;
        const T *a = A + bi * sa, *b = B + bi * sb;
        T s = 0;
        for (int64_t q = 0; q < kk; q++)
            s = wadd(s, wmul(ta ? a[q * m + i] : a[i * kk + q], tb ? b[j * kk + q] : b[q * n + j]));
        C[t] = s;
    }
}

/* ---- combine (collectives between the GPUs of one client) ---------------------------------- */

struct CombineArgs {
    const void *src[DT__COMBINE_MAX];
    void *dst[DT__COMBINE_MAX];
    int nsrc, ndst, op, by;
};

template <typename T> __global__ void combine_k(int64_t n, CombineArgs c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        T v = ((const T *)c.src[0])[i];
        for (int s = 1; s < c.nsrc; s++) {
            T w = ((const T *)c.src[s])[i];
            switch ((dt_reduce_op)c.op) {
            case DT_REDUCE_MAX:
                v = v > w ? v : w;
                break;
            case DT_REDUCE_MIN:
                v = v < w ? v : w;
                break;
            case DT_REDUCE_PROD:
                v = wmul(v, w);
                break;
            default: /* sum, mean */
                v = wadd(v, w);
                break;
            }
        }
        if (c.by > 1)
            v /= (T)c.by;
        for (int d = 0; d < c.ndst; d++)
            ((T *)c.dst[d])[i] = v;
    }
}

/* ---- the table's entries ------------------------------------------------------------------- */

template <typename T>
dt_status fill(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n)
        fill_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((T *)out, n, (T)k->a);
    return launched(x, "fill", dtype_of<T>());
}

template <typename T>
dt_status arange(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    int64_t n = k->shape[0];
    if (n)
        arange_k<T>
            <<<grid_for(n), kThreads, 0, stream_of(x)>>>((T *)out, n, k->a, k->b, k->offset[0]);
    return launched(x, "arange", dtype_of<T>());
}

template <typename T>
dt_status random(const dt__kctx *x, const dt__kargs *k, void *out, bool normal)
{
    int64_t n = elems(k->rank, k->shape);
    if (!n)
        return DT_OK;
    RandArgs r{};
    r.local = dims_of(k->rank, k->shape);
    Dims g = dims_of(k->rank, k->gshape);
    for (int a = 0; a < k->rank; a++) {
        r.offset[a] = k->offset[a];
        r.gstride[a] = g.stride[a];
    }
    r.seed = k->seed;
    r.key = k->key;
    r.a = k->a;
    r.b = k->b;
    r.normal = normal;
    random_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((T *)out, n, r);
    return launched(x, normal ? "philox_normal" : "philox_uniform", dtype_of<T>());
}

template <typename T>
dt_status philox_uniform(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random<T>(x, k, out, false);
}

template <typename T>
dt_status philox_normal(const dt__kctx *x, const dt__kargs *k, const void *const *, void *out)
{
    return random<T>(x, k, out, true);
}

template <typename T>
dt_status unary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n)
        unary_k<T>
            <<<grid_for(n), kThreads, 0, stream_of(x)>>>((const T *)in[0], (T *)out, n, k->op);
    return launched(x, "unary", dtype_of<T>());
}

template <typename T>
dt_status binary(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (!n)
        return DT_OK;
    Bcast bc{};
    bc.out = dims_of(k->rank, k->shape);
    Dims da = dims_of(k->rank, k->in_shape[0]), db = dims_of(k->rank, k->in_shape[1]);
    bool same = true;
    for (int i = 0; i < k->rank; i++) {
        same = same && k->in_shape[0][i] == k->shape[i] && k->in_shape[1][i] == k->shape[i];
        bc.sa[i] = k->in_shape[0][i] == 1 ? 0 : da.stride[i];
        bc.sb[i] = k->in_shape[1][i] == 1 ? 0 : db.stride[i];
    }
    binary_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const T *)in[0], (const T *)in[1],
                                                            (T *)out, n, k->op, same, bc);
    return launched(x, "binary", dtype_of<T>());
}

template <typename T>
dt_status reduce(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    RedArgs r{};
    Dims din = dims_of(k->rank, k->in_shape[0]);
    r.nin_per_out = 1;
    for (int i = 0; i < k->rank; i++) {
        if (k->mask & (1u << i)) {
            r.red_shape[r.nred] = din.shape[i];
            r.red_stride[r.nred++] = din.stride[i];
            r.nin_per_out *= din.shape[i];
        } else {
            r.keep_shape[r.nkeep] = din.shape[i];
            r.keep_stride[r.nkeep++] = din.stride[i];
        }
    }
    r.nout = elems(k->rank, k->shape);
    r.op = k->op;
    r.scale = k->a;
    if (!r.nout)
        return DT_OK;
    if (r.nout < 4096 && r.nin_per_out >= 1024)
        reduce_tree_k<T><<<grid_for(r.nout * kThreads), kThreads, 0, stream_of(x)>>>(
            (const T *)in[0], (T *)out, r);
    else
        reduce_rows_k<T>
            <<<grid_for(r.nout), kThreads, 0, stream_of(x)>>>((const T *)in[0], (T *)out, r);
    return launched(x, "reduce", dtype_of<T>());
}

template <typename T>
dt_status transpose(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (!n)
        return DT_OK;
    Perm p{};
    p.out = dims_of(k->rank, k->shape);
    Dims din = dims_of(k->rank, k->in_shape[0]);
    for (int i = 0; i < k->rank; i++)
        p.in_stride[i] = din.stride[k->perm[i]];
    transpose_k<T><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const T *)in[0], (T *)out, n, p);
    return launched(x, "transpose", dtype_of<T>());
}

template <typename T>
dt_status copy_blocks(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    for (int i = 0; i < k->nblocks; i++) {
        const dt__block *b = &k->blocks[i];
        int64_t n = elems(b->rank, b->extent);
        if (!n)
            continue;
        Block blk{};
        blk.ext = dims_of(b->rank, b->extent);
        Dims ds = dims_of(b->rank, b->src_shape), dd = dims_of(b->rank, b->dst_shape);
        blk.src_base = b->src_at;
        blk.dst_base = b->dst_at;
        for (int q = 0; q < b->rank; q++) {
            blk.src_base += b->src_off[q] * ds.stride[q];
            blk.dst_base += b->dst_off[q] * dd.stride[q];
            blk.sstride[q] = ds.stride[q];
            blk.dstride[q] = dd.stride[q];
        }
        copy_block_k<T>
            <<<grid_for(n), kThreads, 0, stream_of(x)>>>((const T *)in[0], (T *)out, n, blk);
        DT_TRY(launched(x, "copy_blocks", dtype_of<T>()));
    }
    return DT_OK;
}

template <typename T>
dt_status select_fill(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (!n)
        return DT_OK;
    if (!k->select)
        return fill<T>(x, k, in, out);
    cudaError_t e =
        cudaMemcpyAsync(out, in[0], (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream_of(x));
    if (e != cudaSuccess)
        return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): select_fill copy for %s failed: %s",
                        x->index, x->ordinal, dt_dtype_name(dtype_of<T>()), cudaGetErrorString(e));
    return DT_OK;
}

/* gemm: f32 and f64 through cuBLAS, row-major by the column-major identity
 * C^T = op(B)^T op(A)^T (operands swapped, m and n swapped); integers by the kernel above. */
template <typename T>
dt_status gemm(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t m = k->m, n = k->n, kk = k->k;
    if (m == 0 || n == 0 || k->batch == 0)
        return DT_OK;
    if (kk == 0) {
        cudaError_t e =
            cudaMemsetAsync(out, 0, (size_t)(k->batch * m * n) * sizeof(T), stream_of(x));
        return e == cudaSuccess ? DT_OK
                                : dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): gemm zero fill: %s",
                                           x->index, x->ordinal, cudaGetErrorString(e));
    }
    if constexpr (!std::is_floating_point<T>::value) {
        gemm_int_k<T><<<grid_for(k->batch * m * n), kThreads, 0, stream_of(x)>>>(
            (const T *)in[0], (const T *)in[1], (T *)out, k->batch, m, n, kk, k->a_batch_stride,
            k->b_batch_stride, k->ta, k->tb);
        return launched(x, "gemm", dtype_of<T>());
    } else {
        if (m > INT32_MAX || n > INT32_MAX || kk > INT32_MAX || k->batch > INT32_MAX)
            return dt__fail(DT_ERR_UNSUPPORTED,
                            "CUDA:%d: gemm of %lld x %lld x %lld (batch %lld) exceeds cuBLAS's "
                            "int extents",
                            x->index, (long long)m, (long long)n, (long long)kk,
                            (long long)k->batch);
        cublasHandle_t h = (cublasHandle_t)x->blas;
        cublasOperation_t opa = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t opb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        int lda = (int)(k->ta ? m : kk), ldb = (int)(k->tb ? kk : n);
        const T one = 1, zero = 0;
        const T *A = (const T *)in[0], *B = (const T *)in[1];
        T *C = (T *)out;
        /* cuBLAS does not document a batch stride of 0: an operand broadcast over the batch
         * takes one call per matrix instead of one strided-batched call. */
        bool bcast = k->batch > 1 && (k->a_batch_stride == 0 || k->b_batch_stride == 0);
        int64_t calls = bcast ? k->batch : 1, per = bcast ? 1 : k->batch;
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        for (int64_t c = 0; c < calls && s == CUBLAS_STATUS_SUCCESS; c++) {
            const T *a = A + c * k->a_batch_stride, *b = B + c * k->b_batch_stride;
            T *cc = C + c * m * n;
            if constexpr (std::is_same<T, float>::value)
                s = cublasGemmStridedBatchedEx(
                    h, opb, opa, (int)n, (int)m, (int)kk, &one, b, CUDA_R_32F, ldb,
                    k->b_batch_stride, a, CUDA_R_32F, lda, k->a_batch_stride, &zero, cc, CUDA_R_32F,
                    (int)n, m * n, (int)per,
                    x->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT);
            else
                s = cublasDgemmStridedBatched(h, opb, opa, (int)n, (int)m, (int)kk, &one, b, ldb,
                                              k->b_batch_stride, a, lda, k->a_batch_stride, &zero,
                                              cc, (int)n, m * n, (int)per);
        }
        if (s != CUBLAS_STATUS_SUCCESS)
            return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): cuBLAS gemm for %s failed: %s",
                            x->index, x->ordinal, dt_dtype_name(dtype_of<T>()),
                            cublasGetStatusString(s));
        return DT_OK;
    }
}

} // namespace

#define ROW(NAME)                                               \
    {                                                           \
        NAME<float>, NAME<double>, NAME<int32_t>, NAME<int64_t> \
    }

extern "C" {

const dt__kernel_fn dt__cuda_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {
    /* rows in DT__KERNEL_LIST order, columns in DT_DTYPE_LIST order */
    ROW(fill),      ROW(arange),      ROW(philox_uniform), ROW(philox_normal),
    ROW(unary),     ROW(binary),      ROW(reduce),         ROW(gemm),
    ROW(transpose), ROW(copy_blocks), ROW(select_fill),
};

dt_status dt__cuda_combine(const dt__kctx *x, dt_dtype t, dt_reduce_op op, int nsrc,
                           const void *const src[], int ndst, void *const dst[], int64_t n, int by)
{
    if (nsrc < 1 || nsrc > DT__COMBINE_MAX || ndst < 1 || ndst > DT__COMBINE_MAX)
        return dt__fail(DT_ERR_ARG, "combine: %d sources and %d destinations, expected 1 to %d",
                        nsrc, ndst, DT__COMBINE_MAX);
    if (n <= 0)
        return DT_OK;
    CombineArgs c{};
    for (int i = 0; i < nsrc; i++)
        c.src[i] = src[i];
    for (int i = 0; i < ndst; i++)
        c.dst[i] = dst[i];
    c.nsrc = nsrc;
    c.ndst = ndst;
    c.op = op;
    c.by = op == DT_REDUCE_MEAN ? by : 1;
    cudaStream_t st = stream_of(x);
    switch (t) {
    case DT_DTYPE_F32:
        combine_k<float><<<grid_for(n), kThreads, 0, st>>>(n, c);
        break;
    case DT_DTYPE_F64:
        combine_k<double><<<grid_for(n), kThreads, 0, st>>>(n, c);
        break;
    case DT_DTYPE_I32:
        combine_k<int32_t><<<grid_for(n), kThreads, 0, st>>>(n, c);
        break;
    case DT_DTYPE_I64:
        combine_k<int64_t><<<grid_for(n), kThreads, 0, st>>>(n, c);
        break;
    default:
        return dt__fail(DT_ERR_DTYPE, "combine: dtype %d", (int)t);
    }
    return launched(x, "combine", t);
}

} /* extern "C" */
