/* The CUDA backend's (kernel, dtype) table of common/kernels.h, for every dtype the CPU's table
 * takes, with the semantics of the CPU reference (ops/cpu/kernels.c) element for element; the
 * plans the kernel files share; and the combine kernel of the GPU collectives. Everything is
 * queued on the device's stream (x->stream); nothing here waits for the GPU, allocates memory or
 * changes the current GPU.
 *
 * Indices are int64_t throughout; every kernel loops grid-stride over a capped grid, so any size
 * runs with any grid. Shapes travel by value in small parameter structs, planned on the host with
 * extent-1 axes dropped and axes contiguous in every operand merged. The kernels live in
 * elementwise.cu, reduce.cu (reductions and the row-wise kernels), gemm.cu and move.cu (copies
 * and the index kernels). */
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

/* ---- combine (collectives between the GPUs of one client) ----------------------------------- */

struct CombineArgs {
    const void *src[DT__COMBINE_MAX];
    void *dst[DT__COMBINE_MAX];
    int nsrc, ndst, by;
};

/* (src[0][i] op src[1][i] op ...) / by, left to right in the compute type, as the CPU's combine
 * (MAX: a > b ? a : b with a the running value; MIN likewise; SUM, MEAN and PROD wrap for
 * integers; bf16 and f16 in f32, rounded once). */
template <typename S, int OP> HD S combine_at(const CombineArgs &c, int64_t i)
{
    using C = Cof<S>;
    C v = Ty<S>::ld(((const S *)c.src[0])[i]);
    UNROLL
    for (int s = 1; s < DT__COMBINE_MAX; s++)
        if (s < c.nsrc) {
            C w = Ty<S>::ld(((const S *)c.src[s])[i]);
            if (OP == DT_REDUCE_MAX)
                v = v > w ? v : w;
            else if (OP == DT_REDUCE_MIN)
                v = v < w ? v : w;
            else if (OP == DT_REDUCE_PROD)
                v = wmul(v, w);
            else
                v = wadd(v, w);
        }
    return Ty<S>::st(c.by > 1 ? (C)(v / (C)c.by) : v);
}

/* Every source is read at i before any destination is written there (in-place is fine). */
template <typename S, int OP> __global__ void combine_k(int64_t n, CombineArgs c)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        S v = combine_at<S, OP>(c, i);
        UNROLL
        for (int d = 0; d < DT__COMBINE_MAX; d++)
            if (d < c.ndst)
                ((S *)c.dst[d])[i] = v;
    }
}

template <typename S>
dt_status combine_typed(const dt__kctx *x, dt_dtype t, dt_reduce_op op, const CombineArgs &c,
                        int64_t n)
{
    cudaStream_t st = stream_of(x);
    unsigned grid = grid_for(n);
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_MEAN:
        combine_k<S, DT_REDUCE_SUM><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_MAX:
        combine_k<S, DT_REDUCE_MAX><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_MIN:
        combine_k<S, DT_REDUCE_MIN><<<grid, kThreads, 0, st>>>(n, c);
        break;
    case DT_REDUCE_PROD:
        combine_k<S, DT_REDUCE_PROD><<<grid, kThreads, 0, st>>>(n, c);
        break;
    default:
        return dt__fail(DT_ERR_ARG, "CUDA:%d (GPU %d): combine: no reduction %d", x->index,
                        x->ordinal, (int)op);
    }
    return launched(x, "combine", t);
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
#define NONE                                                                            \
    {                                                                                   \
        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr \
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
/* no attention kernel on CUDA yet: the op says so (DT_ERR_UNSUPPORTED) */
#define ROW_ATTENTION NONE
/* no fused elementwise kernel on CUDA yet: the fusion pass (spmd/fuse.c) fuses only where the
 * backend's table has one, so chains on GPUs run kernel by kernel as before */
#define ROW_FUSED NONE
#define ROW_GATHER ALL(gather)
#define ROW_SEGMENT_SUM NUMERIC(segment_sum)
#define ROW_ONE_HOT ALL(one_hot)
#define ROW(NAME, name) ROW_##NAME,

const dt__kernel_fn dt__cuda_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT] = {DT__KERNEL_LIST(ROW)};

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
        return combine_typed<float>(x, t, op, c, n);
    case DT_DTYPE_F64:
        return combine_typed<double>(x, t, op, c, n);
    case DT_DTYPE_I32:
        return combine_typed<int32_t>(x, t, op, c, n);
    case DT_DTYPE_I64:
        return combine_typed<int64_t>(x, t, op, c, n);
    case DT_DTYPE_BF16:
        return combine_typed<bf16s>(x, t, op, c, n);
    case DT_DTYPE_F16:
        return combine_typed<f16s>(x, t, op, c, n);
    case DT_DTYPE_BOOL: /* a byte, as the CPU's combine takes it */
    case DT_DTYPE_U8:
        return combine_typed<uint8_t>(x, t, op, c, n);
    case DT_DTYPE_I8:
        return combine_typed<int8_t>(x, t, op, c, n);
    default:
        return dt__fail(DT_ERR_DTYPE, "CUDA:%d (GPU %d): combine of dtype %d", x->index, x->ordinal,
                        (int)t);
    }
}

} /* extern "C" */
