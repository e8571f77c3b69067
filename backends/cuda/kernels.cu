/* The CUDA backend's (kernel, dtype) table of common/kernels.h, for every dtype the CPU's table
 * takes, with the semantics of the CPU reference (backends/cpu/kernels.c) element for element; the
 * plans the kernel files share; and the combine kernel of the GPU collectives. Everything is
 * queued on the device's stream (x->stream); nothing here waits for the GPU, allocates memory or
 * changes the current GPU.
 *
 * Indices are int64_t throughout; every kernel loops grid-stride over a capped grid, so any size
 * runs with any grid. Shapes travel by value in small parameter structs, planned on the host with
 * extent-1 axes dropped and axes contiguous in every operand merged. The kernels live in
 * elementwise.cu (with the fused chains), reduce.cu (reductions and the row-wise kernels), gemm.cu,
 * attention.cu and move.cu (copies and the index kernels). */
#include "common.cuh"

namespace dtcuda
{

dt_status cuda_failed(const dt__kctx *x, const char *kernel, dt_dtype t, cudaError_t e)
{
    return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): %s kernel for %s failed: %s", x->index,
                    x->ordinal, kernel, dt_dtype_name(t), cudaGetErrorString(e));
}

bool plan_bcast(int rank, const int64_t out[], int nops, const int64_t in[][R], Bcast *g)
{
    *g = Bcast{};
    bool whole[3][R] = {};
    for (int i = 0; i < rank; i++) {
        if (out[i] == 1)
            continue;
        bool merge = g->nd > 0;
        for (int q = 0; q < nops; q++)
            merge = merge && (in[q][i] != 1) == whole[q][g->nd - 1];
        if (merge) {
            g->ext[g->nd - 1] *= out[i];
            continue;
        }
        g->ext[g->nd] = out[i];
        for (int q = 0; q < nops; q++)
            whole[q][g->nd] = in[q][i] != 1;
        g->nd++;
    }
    bool same = true;
    for (int q = 0; q < nops; q++) {
        int64_t st = 1;
        for (int d = g->nd - 1; d >= 0; d--) {
            g->st[q][d] = whole[q][d] ? st : 0;
            st *= whole[q][d] ? g->ext[d] : 1;
            same = same && whole[q][d];
        }
    }
    return same;
}

void plan_rows(int rank, const int64_t shape[], unsigned mask, Rows *r)
{
    *r = Rows{};
    int64_t st[R];
    strides_of(rank, shape, st);
    r->nrows = r->n = 1;
    for (int i = 0; i < rank; i++) {
        int64_t e = shape[i];
        bool red = (mask >> i) & 1u;
        if (red)
            r->n *= e;
        else
            r->nrows *= e;
        if (e == 1)
            continue;
        if (red)
            push_axis(r->red_ext, r->red_st, &r->nred, e, st[i]);
        else
            push_axis(r->keep_ext, r->keep_st, &r->nkeep, e, st[i]);
    }
    if (r->n == 0)
        r->nred = 0; /* nothing is read: every row folds to its initial value */
}

namespace
{

/* ---- combine (device collectives) ----------------------------------------------------------- */

struct CombineArgs {
    const void *src[DT__COMBINE_MAX];
    void *dst[DT__COMBINE_MAX];
    int nsrc, ndst, by;
};

/* What a combine reads and writes: S, or f32 for a widened 16-bit float (SW sources, DW
 * destinations). */
template <typename S, bool W> using Held = std::conditional_t<W, float, S>;

template <typename S, bool W> HD Cof<S> ld_held(Held<S, W> v)
{
    if constexpr (W)
        return v;
    else
        return Ty<S>::ld(v);
}

template <typename S, bool W> HD Held<S, W> st_held(Cof<S> v)
{
    if constexpr (W)
        return v;
    else
        return Ty<S>::st(v);
}

/* a then b, as the CPU's combine (MAX: a > b || a is NaN ? a : b with a the running value, so
 * a NaN wins; MIN likewise; SUM, MEAN and PROD wrap for integers; bf16 and f16 in f32) */
template <typename C, int OP> HD C combine_step(C a, C b)
{
    if (OP == DT_REDUCE_MAX)
        return a > b || is_nan(a) ? a : b;
    if (OP == DT_REDUCE_MIN)
        return a < b || is_nan(a) ? a : b;
    if (OP == DT_REDUCE_PROD)
        return wmul(a, b);
    return wadd(a, b);
}

/* V consecutive elements moved as one aligned vector (16 bytes on the wider side). */
template <typename T, int V> struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

/* Elements [V t, V t + V) for every t < nv: every source's chunk is read before any
 * destination's is written (in place is fine), each element combined left to right in the
 * compute type and stored once (16-bit floats rounded once, or kept in f32). */
template <typename S, int OP, bool SW, bool DW, int V>
__global__ void combine_vec_k(int64_t nv, CombineArgs c)
{
    using C = Cof<S>;
    using SI = Held<S, SW>;
    using DO = Held<S, DW>;
    for (int64_t t = first_index(); t < nv; t += grid_step()) {
        Vec<SI, V> a = ((const Vec<SI, V> *)c.src[0])[t];
        C v[V];
        UNROLL
        for (int k = 0; k < V; k++)
            v[k] = ld_held<S, SW>(a.v[k]);
        UNROLL
        for (int s = 1; s < DT__COMBINE_MAX; s++)
            if (s < c.nsrc) {
                Vec<SI, V> b = ((const Vec<SI, V> *)c.src[s])[t];
                UNROLL
                for (int k = 0; k < V; k++)
                    v[k] = combine_step<C, OP>(v[k], ld_held<S, SW>(b.v[k]));
            }
        Vec<DO, V> o;
        UNROLL
        for (int k = 0; k < V; k++)
            o.v[k] = st_held<S, DW>(c.by > 1 ? (C)(v[k] / (C)c.by) : v[k]);
        UNROLL
        for (int d = 0; d < DT__COMBINE_MAX; d++)
            if (d < c.ndst)
                ((Vec<DO, V> *)c.dst[d])[t] = o;
    }
}

template <typename S, bool SW, bool DW> constexpr int vec_width()
{
    constexpr size_t wide =
        sizeof(Held<S, SW>) > sizeof(Held<S, DW>) ? sizeof(Held<S, SW>) : sizeof(Held<S, DW>);
    return (int)(16 / wide);
}

template <typename S, int OP, bool SW, bool DW>
void combine_launch(const dt__kctx *x, CombineArgs c, int64_t n)
{
    constexpr int V = vec_width<S, SW, DW>();
    cudaStream_t st = stream_of(x);
    /* the vector path when every pointer is aligned to its side's vector */
    bool aligned = true;
    for (int i = 0; i < c.nsrc; i++)
        aligned = aligned && (uintptr_t)c.src[i] % sizeof(Vec<Held<S, SW>, V>) == 0;
    for (int i = 0; i < c.ndst; i++)
        aligned = aligned && (uintptr_t)c.dst[i] % sizeof(Vec<Held<S, DW>, V>) == 0;
    int64_t nv = aligned ? n / V : 0, done = nv * V;
    /* a few waves of blocks: each thread strides over the rest */
    int64_t cap = x->sms > 0 ? (int64_t)x->sms * 4 * (2048 / kThreads) : kMaxBlocks;
    if (nv > 0) {
        int64_t blocks = blocks_for(nv, kThreads);
        combine_vec_k<S, OP, SW, DW, V>
            <<<(unsigned)(blocks < cap ? blocks : cap), kThreads, 0, st>>>(nv, c);
    }
    if (done < n) { /* the tail (or everything, unaligned) one element a thread */
        CombineArgs t = c;
        for (int i = 0; i < c.nsrc; i++)
            t.src[i] = (const Held<S, SW> *)c.src[i] + done;
        for (int i = 0; i < c.ndst; i++)
            t.dst[i] = (Held<S, DW> *)c.dst[i] + done;
        int64_t blocks = blocks_for(n - done, kThreads);
        combine_vec_k<S, OP, SW, DW, 1>
            <<<(unsigned)(blocks < cap ? blocks : cap), kThreads, 0, st>>>(n - done, t);
    }
}

template <typename S, bool SW, bool DW>
dt_status combine_op(const dt__kctx *x, dt_dtype t, dt_reduce_op op, const CombineArgs &c,
                     int64_t n)
{
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_MEAN:
        combine_launch<S, DT_REDUCE_SUM, SW, DW>(x, c, n);
        break;
    case DT_REDUCE_MAX:
        combine_launch<S, DT_REDUCE_MAX, SW, DW>(x, c, n);
        break;
    case DT_REDUCE_MIN:
        combine_launch<S, DT_REDUCE_MIN, SW, DW>(x, c, n);
        break;
    case DT_REDUCE_PROD:
        combine_launch<S, DT_REDUCE_PROD, SW, DW>(x, c, n);
        break;
    default:
        return dt__fail(DT_ERR_ARG, "CUDA:%d (GPU %d): combine: no reduction %d", x->index,
                        x->ordinal, (int)op);
    }
    return launched(x, "combine", t);
}

/* The widened forms exist for the 16-bit floats only. */
template <typename S>
dt_status combine_typed(const dt__kctx *x, const dt__combine *k, const CombineArgs &c)
{
    if constexpr (std::is_same<S, bf16s>::value || std::is_same<S, f16s>::value) {
        if (k->src_wide && k->dst_wide)
            return combine_op<S, true, true>(x, k->dtype, k->op, c, k->n);
        if (k->src_wide)
            return combine_op<S, true, false>(x, k->dtype, k->op, c, k->n);
        if (k->dst_wide)
            return combine_op<S, false, true>(x, k->dtype, k->op, c, k->n);
    }
    return combine_op<S, false, false>(x, k->dtype, k->op, c, k->n);
}

} // namespace
} // namespace dtcuda

using namespace dtcuda;

extern "C" {

/* Rows in DT__KERNEL_LIST order (generated from the list, so a kernel without a row here does
 * not compile), columns in DT_DTYPE_LIST order; a kernel takes the dtypes the CPU's takes, the
 * shape rules refusing the others before any lookup. */
#define ALL(K)                                                                                \
    {                                                                                         \
        K<float>, K<double>, K<int32_t>, K<int64_t>, K<bf16s>, K<f16s>, K<bools>, K<uint8_t>, \
            K<int8_t>                                                                         \
    }
#define NUMERIC(K)                                                                           \
    {                                                                                        \
        K<float>, K<double>, K<int32_t>, K<int64_t>, K<bf16s>, K<f16s>, nullptr, K<uint8_t>, \
            K<int8_t>                                                                        \
    }
#define FLOATS(K)                                                                           \
    {                                                                                       \
        K<float>, K<double>, nullptr, nullptr, K<bf16s>, K<f16s>, nullptr, nullptr, nullptr \
    }
#define ROW_FILL ALL(fill)
#define ROW_ARANGE ALL(arange)
#define ROW_PHILOX_UNIFORM FLOATS(philox_uniform)
#define ROW_PHILOX_NORMAL FLOATS(philox_normal)
#define ROW_UNARY ALL(unary)
#define ROW_BINARY ALL(binary)
#define ROW_REDUCE ALL(reduce)
#define ROW_GEMM NUMERIC(gemm)
#define ROW_TRANSPOSE ALL(transpose)
#define ROW_COPY_BLOCKS ALL(copy_blocks)
#define ROW_SELECT_FILL ALL(select_fill)
#define ROW_CAST ALL(cast)
#define ROW_WHERE ALL(where)
#define ROW_SOFTMAX FLOATS(softmax)
#define ROW_NORM FLOATS(norm)
#define ROW_SCAN NUMERIC(scan)
#define ROW_ARG_REDUCE ALL(arg_reduce)
/* f32 and f64, as the CPU's (the op casts 16-bit floats to f32) */
#define ROW_ATTENTION                                                                              \
    {                                                                                              \
        attention<float>, attention<double>, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, \
            nullptr                                                                                \
    }
/* one entry for every dtype: each op of the chain carries its own */
#define ROW_FUSED                                                     \
    {                                                                 \
        fused, fused, fused, fused, fused, fused, fused, fused, fused \
    }
#define ROW_GATHER ALL(gather)
#define ROW_SEGMENT_SUM NUMERIC(segment_sum)
#define ROW_ONE_HOT ALL(one_hot)
#define ROW_XENT FLOATS(xent)
#define ROW(NAME, name) ROW_##NAME,

const dt__kernel_fn dt__cuda_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {DT__KERNEL_LIST(ROW)};

dt_status dt__cuda_combine(const dt__kctx *x, const dt__combine *k)
{
    if (k->nsrc < 1 || k->nsrc > DT__COMBINE_MAX || k->ndst < 1 || k->ndst > DT__COMBINE_MAX)
        return dt__fail(DT_ERR_ARG,
                        "CUDA:%d (GPU %d): combine of %d sources into %d destinations (1 to %d)",
                        x->index, x->ordinal, k->nsrc, k->ndst, DT__COMBINE_MAX);
    if (k->n <= 0)
        return DT_OK;
    CombineArgs c{};
    for (int i = 0; i < k->nsrc; i++)
        c.src[i] = k->src[i];
    for (int i = 0; i < k->ndst; i++)
        c.dst[i] = k->dst[i];
    c.nsrc = k->nsrc;
    c.ndst = k->ndst;
    c.by = k->by;
    switch (k->dtype) {
    case DT_DTYPE_F32:
        return combine_typed<float>(x, k, c);
    case DT_DTYPE_F64:
        return combine_typed<double>(x, k, c);
    case DT_DTYPE_I32:
        return combine_typed<int32_t>(x, k, c);
    case DT_DTYPE_I64:
        return combine_typed<int64_t>(x, k, c);
    case DT_DTYPE_BF16:
        return combine_typed<bf16s>(x, k, c);
    case DT_DTYPE_F16:
        return combine_typed<f16s>(x, k, c);
    case DT_DTYPE_BOOL: /* a byte, as the CPU's combine takes it */
    case DT_DTYPE_U8:
        return combine_typed<uint8_t>(x, k, c);
    case DT_DTYPE_I8:
        return combine_typed<int8_t>(x, k, c);
    default:
        return dt__fail(DT_ERR_DTYPE, "CUDA:%d (GPU %d): combine of dtype %d", x->index, x->ordinal,
                        (int)k->dtype);
    }
}

} /* extern "C" */
