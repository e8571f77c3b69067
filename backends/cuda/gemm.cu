/* CUDA gemm: C[b] = op(A[b]) op(B[b]), row-major, op = transpose when ta / tb. The floating
 * types through cuBLAS (FP64; FP32 exact, or on TF32 tensor cores when the runtime allows;
 * bf16 and f16 in and out with FP32 accumulation, rounded once, as the CPU's sgemm on widened
 * copies); the integers by a tiled kernel whose sums wrap as the CPU's loops do. */
#include "common.cuh"

#include <cublas_v2.h>

namespace dtcuda
{
namespace
{

/* ---- cuBLAS --------------------------------------------------------------------------------- */

/* cuBLAS's view of a floating dtype: element type, compute type, and the scalars' type. */
template <typename S> struct Blas;
template <> struct Blas<float> {
    static constexpr cudaDataType_t type = CUDA_R_32F;
    using scalar = float;
};
template <> struct Blas<double> {
    static constexpr cudaDataType_t type = CUDA_R_64F;
    using scalar = double;
};
template <> struct Blas<bf16s> {
    static constexpr cudaDataType_t type = CUDA_R_16BF;
    using scalar = float;
};
template <> struct Blas<f16s> {
    static constexpr cudaDataType_t type = CUDA_R_16F;
    using scalar = float;
};

template <typename S> cublasComputeType_t compute_of(const dt__kctx *x)
{
    if constexpr (std::is_same<S, double>::value)
        return CUBLAS_COMPUTE_64F;
    else if constexpr (std::is_same<S, float>::value)
        return x->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    else
        return CUBLAS_COMPUTE_32F;
}

/* One cuBLAS call: row-major C = op(A) op(B), `count` of them at strides sa, sb, sc, by the
 * column-major identity C^T = op(B)^T op(A)^T (B first, m and n swapped; lda as given (ta ? m
 * : k when packed), ldb = tb ? k : n, ldc = n). */
template <typename S>
cublasStatus_t blas_gemm(const dt__kctx *x, bool ta, bool tb, int m, int n, int kk, const S *A,
                         int lda, long long sa, const S *B, long long sb, S *C, long long sc,
                         int count)
{
    cublasHandle_t h = (cublasHandle_t)x->blas;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ldb = tb ? kk : n;
    const typename Blas<S>::scalar one = 1, zero = 0;
    constexpr cudaDataType_t t = Blas<S>::type;
    cublasComputeType_t ct = compute_of<S>(x);
    if (count == 1)
        return cublasGemmEx(h, opb, opa, n, m, kk, &one, B, t, ldb, A, t, lda, &zero, C, t, n, ct,
                            CUBLAS_GEMM_DEFAULT);
    return cublasGemmStridedBatchedEx(h, opb, opa, n, m, kk, &one, B, t, ldb, sb, A, t, lda, sa,
                                      &zero, C, t, n, sc, count, ct, CUBLAS_GEMM_DEFAULT);
}

/* Both operands batched: strided-batched calls (of at most INT_MAX matrices). cuBLAS does not
 * document a batch stride of 0, so a broadcast B under an untransposed A with contiguous batches
 * is one gemm of batch * m rows ([batch*m, k] @ [k, n] is C), and any other broadcast one call
 * per matrix. */
template <typename S>
dt_status gemm_blas(const dt__kctx *x, const dt__kargs *k, const S *A, const S *B, S *C)
{
    int64_t m = k->m, n = k->n, kk = k->k, batch = k->batch;
    int64_t sa = k->a_batch_stride, sb = k->b_batch_stride, mn = m * n;
    int64_t lda = k->lda ? k->lda : k->ta ? m : kk;
    if (m > INT32_MAX || n > INT32_MAX || kk > INT32_MAX || lda > INT32_MAX)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "CUDA:%d (GPU %d): gemm for %s of [%lld,%lld] @ [%lld,%lld]: cuBLAS takes "
                        "extents below 2^31",
                        x->index, x->ordinal, dt_dtype_name(Ty<S>::dt), (long long)m, (long long)kk,
                        (long long)kk, (long long)n);
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (batch == 1) {
        s = blas_gemm<S>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A, (int)lda, 0, B, 0, C, 0, 1);
    } else if (sa != 0 && sb != 0) {
        for (int64_t b0 = 0; b0 < batch && s == CUBLAS_STATUS_SUCCESS; b0 += INT32_MAX) {
            int64_t cnt = batch - b0 < INT32_MAX ? batch - b0 : INT32_MAX;
            s = blas_gemm<S>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A + b0 * sa, (int)lda, sa,
                             B + b0 * sb, sb, C + b0 * mn, mn, (int)cnt);
        }
    } else if (sb == 0 && !k->ta && sa == m * kk && lda == kk && batch * m <= INT32_MAX) {
        s = blas_gemm<S>(x, false, k->tb, (int)(batch * m), (int)n, (int)kk, A, (int)lda, 0, B, 0,
                         C, 0, 1);
    } else {
        for (int64_t b = 0; b < batch && s == CUBLAS_STATUS_SUCCESS; b++)
            s = blas_gemm<S>(x, k->ta, k->tb, (int)m, (int)n, (int)kk, A + b * sa, (int)lda, 0,
                             B + b * sb, 0, C + b * mn, 0, 1);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return dt__fail(DT_ERR_DEVICE, "CUDA:%d (GPU %d): %s kernel for %s failed: %s", x->index,
                        x->ordinal, "gemm (cuBLAS)", dt_dtype_name(Ty<S>::dt),
                        cublasGetStatusString(s));
    return DT_OK;
}

/* ---- integer gemm --------------------------------------------------------------------------- */

/* A 64 x 64 tile of C a block, 16 of k at a time through shared memory, each of 256 threads
 * 4 x 4 outputs (rows ty + 16 r, columns tx + 16 s). Sums and products in an unsigned type at
 * least as wide as T: the residues of the CPU's wrapping steps through uint64_t. */
constexpr int kGT = 64, kGK = 16;

struct GemmArgs {
    int64_t batch, m, n, k, sa, sb, lda; /* lda: A's leading dimension as stored */
    bool ta, tb;
};

template <typename T> using Uns = std::conditional_t<sizeof(T) <= 4, uint32_t, uint64_t>;

/* Thread th's share of loading as[q][i] = op(A)(i0 + i, q0 + q) and bs[q][j] = op(B)(q0 + q,
 * j0 + j): neighbouring threads along each operand's contiguous axis; zeros outside the matrices
 * (they add nothing). */
template <typename T>
HD void gemm_load(Uns<T> as[kGK][kGT + 1], Uns<T> bs[kGK][kGT + 1], const T *a, const T *b,
                  const GemmArgs &g, int64_t i0, int64_t j0, int64_t q0, int th)
{
    using U = Uns<T>;
    for (int l = th; l < kGT * kGK; l += 256) {
        int i = g.ta ? l % kGT : l / kGK, qa = g.ta ? l / kGT : l % kGK;
        int64_t gi = i0 + i, gq = q0 + qa;
        as[qa][i] =
            gi < g.m && gq < g.k ? (U)(g.ta ? a[gq * g.lda + gi] : a[gi * g.lda + gq]) : (U)0;
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

} // namespace

/* C[b] = op(A[b]) op(B[b]), row-major, for b < batch: A[b] at A + a_at + b * a_batch_stride
 * (leading dimension lda, 0: packed), B[b] at B + b * b_batch_stride (0 broadcasts), C[b] at
 * C + c_at + b * m * n. k == 0 gives zeros. */
template <typename S>
dt_status gemm(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t m = k->m, n = k->n, batch = k->batch;
    S *C = (S *)out + k->c_at;
    if (m <= 0 || n <= 0 || batch <= 0)
        return DT_OK;
    if (k->k <= 0)
        return queued(x, "gemm", Ty<S>::dt,
                      cudaMemsetAsync(C, 0, (size_t)(batch * m * n) * sizeof(S), stream_of(x)));
    const S *A = (const S *)in[0] + k->a_at, *B = (const S *)in[1];
    if constexpr (Ty<S>::flt) {
        return gemm_blas<S>(x, k, A, B, C);
    } else {
        int64_t lda = k->lda ? k->lda : k->ta ? m : k->k;
        GemmArgs g{batch, m, n, k->k, k->a_batch_stride, k->b_batch_stride, lda, k->ta, k->tb};
        int64_t tm = (m + kGT - 1) / kGT, tn = (n + kGT - 1) / kGT;
        dim3 grid((unsigned)(tn < 65535 ? tn : 65535), (unsigned)(tm < 65535 ? tm : 65535),
                  (unsigned)(batch < 65535 ? batch : 65535));
        gemm_int_k<S><<<grid, 256, 0, stream_of(x)>>>(A, B, C, g);
        return launched(x, "gemm", Ty<S>::dt);
    }
}

DT__CUDA_NUMERIC_TYPES(DT__CUDA_INSTANTIATE, gemm)

} // namespace dtcuda
