/* The CUDA backend's ATTENTION kernel (common/kernels.h; the op in spmd/ops/attention.c), f32
 * and f64, with the CPU kernel's semantics (backends/cpu/kernels.c): q, k, v of one shape
 * [..., T, E], the leading axes independent slices, y = softmax(scale q k^T) v, key j only for
 * queries i >= j under the causal mask; the gradient [3, ..., T, E] (dq, dk, dv) of dy.
 *
 * Tiled as FlashAttention-2, nothing of [T, T] held anywhere:
 *   forward   one block per (slice, tile of kBQ queries); the tiles of kBK keys and values pass
 *             through shared memory; each warp keeps its rows' running maximum, sum and output
 *             in registers (an online softmax; lane c scores key c of the tile). Under the causal
 *             mask the key tiles wholly above the diagonal are never loaded.
 *   gradient  three launches, deterministic (no atomics): (1) the forward pass again, keeping per
 *             query row only its log sum exp and D = rowsum(dy o), written into dq's own rows
 *             (2 values of the E there; E = 1 uses the device's kernel scratch); (2) one block per
 *             (slice, key tile) walks the query tiles and sums dk and dv in registers; (3) one
 *             block per (slice, query tile) walks the key tiles and sums dq, reading its rows'
 *             statistics before it overwrites them. With P = exp(s - lse) and
 *             dS = P (dy v^T - D): dv = P^T dy, dk = scale dS^T q, dq = scale dS k.
 * Sums run in the dtype (f32 or f64) in another order than the CPU's BLAS: results agree with
 * the CPU kernel to rounding, not bitwise. E up to kMaxE (GPT-2's 64 and the usual 128); a
 * wider feature axis is refused (DT_ERR_UNSUPPORTED), never computed wrong. */
#include "common.cuh"

namespace dtcuda
{
namespace
{

constexpr int kBQ = 32;   /* queries of a block's tile */
constexpr int kBK = 32;   /* keys of a tile: one per lane */
constexpr int kWarps = 8; /* warps of a block */
constexpr int kAttnThreads = kWarps * 32;
constexpr int kRows = kBQ / kWarps;      /* forward: rows of a warp */
constexpr int kSub = kAttnThreads / kBK; /* gradient: threads sharing a row's features */
constexpr int kMaxE = 128;
constexpr unsigned kFull = 0xffffffffu;

struct AttnArgs {
    int64_t slices, T;
    int E, ld; /* feature extent; shared rows padded to ld = E + 1 (no bank conflicts) */
    bool causal;
    double scale;
    int64_t sst; /* gradient: stride of a query row's statistics (lse, then D) */
};

template <typename C> __device__ C warp_max(C v)
{
    UNROLL
    for (int o = 16; o > 0; o >>= 1) {
        C w = __shfl_xor_sync(kFull, v, o);
        v = w > v ? w : v;
    }
    return v;
}

template <typename C> __device__ C warp_sum(C v)
{
    UNROLL
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* Rows [r0, r0 + nr) of a slice's [T, E] matrix into a shared tile of `rows` rows (rows past nr
 * zero). */
template <typename C>
__device__ void load_tile(C *tile, const C *src, int64_t r0, int64_t nr, int rows,
                          const AttnArgs &a)
{
    for (int t = threadIdx.x; t < rows * a.E; t += blockDim.x) {
        int r = t / a.E, e = t - r * a.E;
        tile[r * a.ld + e] = r < nr ? src[(r0 + r) * a.E + e] : (C)0;
    }
}

template <typename C> __device__ C dot(const C *x, const C *y, int E)
{
    C s = 0;
    for (int e = 0; e < E; e++)
        s += x[e] * y[e];
    return s;
}

/* Keys of query i in the key tile at j0 of nc keys (the CPU's attn_keys). */
__device__ int64_t keys_of(bool causal, int64_t i, int64_t j0, int64_t nc)
{
    int64_t lim = causal ? i - j0 + 1 : nc;
    return lim < 0 ? 0 : lim > nc ? nc : lim;
}

/* Forward over the query tiles (GRAD: the statistics of the gradient instead of the output).
 * Lane l holds features l, l + 32, ... of its rows (NE = EMAX / 32 of them). */
template <typename C, int EMAX, bool GRAD>
__global__ void __launch_bounds__(kAttnThreads)
    attn_fwd_k(const C *q, const C *k, const C *v, const C *dy, C *o, C *stats, AttnArgs a)
{
    constexpr int NE = EMAX / 32;
    extern __shared__ __align__(16) unsigned char smem[];
    C *Qs = (C *)smem, *Ks = Qs + kBQ * a.ld, *Vs = Ks + kBK * a.ld;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const C scale = (C)a.scale;
    const int64_t T = a.T, nt = (T + kBQ - 1) / kBQ;
    for (int64_t id = blockIdx.x; id < a.slices * nt; id += gridDim.x) {
        int64_t b = id / nt, i0 = (id - b * nt) * kBQ, nr = T - i0 < kBQ ? T - i0 : kBQ;
        int64_t base = b * T * a.E;
        __syncthreads(); /* the previous tile's readers are done */
        load_tile(Qs, q + base, i0, nr, kBQ, a);
        C m[kRows], l[kRows], acc[kRows][NE];
        UNROLL
        for (int w = 0; w < kRows; w++) {
            m[w] = -INFINITY;
            l[w] = 0;
            UNROLL
            for (int j = 0; j < NE; j++)
                acc[w][j] = 0;
        }
        int64_t jend = a.causal ? i0 + nr : T;
        for (int64_t j0 = 0; j0 < jend; j0 += kBK) {
            int64_t nc = jend - j0 < kBK ? jend - j0 : kBK;
            __syncthreads();
            load_tile(Ks, k + base, j0, nc, kBK, a);
            load_tile(Vs, v + base, j0, nc, kBK, a);
            __syncthreads();
            UNROLL
            for (int w = 0; w < kRows; w++) {
                int r = warp + kWarps * w; /* the same for the whole warp */
                if (r >= nr)
                    continue;
                int64_t lim = keys_of(a.causal, i0 + r, j0, nc);
                C s = lane < lim ? scale * dot(Qs + r * a.ld, Ks + lane * a.ld, a.E) : (C)-INFINITY;
                C mx = warp_max(s);
                if (mx == (C)-INFINITY)
                    continue;
                C mn = m[w] > mx ? m[w] : mx;
                C corr = m[w] == (C)-INFINITY ? (C)0 : cexp(m[w] - mn);
                C p = lane < lim ? cexp(s - mn) : (C)0;
                l[w] = l[w] * corr + warp_sum(p);
                m[w] = mn;
                UNROLL
                for (int j = 0; j < NE; j++)
                    acc[w][j] *= corr;
                for (int c = 0; c < nc; c++) {
                    C pc = __shfl_sync(kFull, p, c);
                    UNROLL
                    for (int j = 0; j < NE; j++)
                        if (lane + 32 * j < a.E)
                            acc[w][j] += pc * Vs[c * a.ld + lane + 32 * j];
                }
            }
        }
        UNROLL
        for (int w = 0; w < kRows; w++) {
            int r = warp + kWarps * w;
            if (r >= nr)
                continue;
            int64_t row = base + (i0 + r) * a.E;
            C d = 0;
            UNROLL
            for (int j = 0; j < NE; j++) {
                int e = lane + 32 * j;
                if (e >= a.E)
                    continue;
                if (GRAD)
                    d += dy[row + e] * (acc[w][j] / l[w]);
                else
                    o[row + e] = acc[w][j] / l[w];
            }
            if (GRAD) {
                d = warp_sum(d);
                if (lane == 0) {
                    C *st = stats + (b * T + i0 + r) * a.sst;
                    st[0] = m[w] + clog(l[w]);
                    st[1] = d;
                }
            }
        }
    }
}

/* The weight P and score gradient dS of query r against key c of the current tiles (0 outside
 * the slice or above the diagonal), for the kBQ x kBK pairs, kBQ / kWarps per thread. */
template <typename C>
__device__ void score_grads(const C *Qs, const C *Ys, const C *Ks, const C *Vs, const C *lse,
                            const C *D, C *P, C *dS, int64_t i0, int64_t nr, int64_t j0, int64_t nc,
                            const AttnArgs &a)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const C scale = (C)a.scale;
    for (int r = warp; r < kBQ; r += kWarps) {
        int c = lane;
        C p = 0, ds = 0;
        if (r < nr && c < nc && (!a.causal || j0 + c <= i0 + r)) {
            p = cexp(scale * dot(Qs + r * a.ld, Ks + c * a.ld, a.E) - lse[r]);
            ds = p * (dot(Ys + r * a.ld, Vs + c * a.ld, a.E) - D[r]);
        }
        if (P)
            P[r * (kBK + 1) + c] = p;
        dS[r * (kBK + 1) + c] = ds;
    }
}

/* Query rows [i0, i0 + nr): q and dy tiles, and their statistics. */
template <typename C>
__device__ void load_queries(C *Qs, C *Ys, C *lse, C *D, const C *q, const C *dy, const C *stats,
                             int64_t b, int64_t i0, int64_t nr, const AttnArgs &a)
{
    int64_t base = b * a.T * a.E;
    load_tile(Qs, q + base, i0, nr, kBQ, a);
    load_tile(Ys, dy + base, i0, nr, kBQ, a);
    for (int r = threadIdx.x; r < kBQ; r += blockDim.x) {
        const C *st = stats + (b * a.T + i0 + r) * a.sst;
        lse[r] = r < nr ? st[0] : (C)0;
        D[r] = r < nr ? st[1] : (C)0;
    }
}

/* dk and dv of one key tile per block: thread t sums key t / kSub, features t % kSub + kSub j. */
template <typename C, int EMAX>
__global__ void __launch_bounds__(kAttnThreads)
    attn_dkdv_k(const C *q, const C *k, const C *v, const C *dy, const C *stats, C *dk, C *dv,
                AttnArgs a)
{
    constexpr int NJ = EMAX / kSub;
    extern __shared__ __align__(16) unsigned char smem[];
    C *Ks = (C *)smem, *Vs = Ks + kBK * a.ld, *Qs = Vs + kBK * a.ld, *Ys = Qs + kBQ * a.ld,
      *P = Ys + kBQ * a.ld, *dS = P + kBQ * (kBK + 1), *lse = dS + kBQ * (kBK + 1), *D = lse + kBQ;
    const int c = threadIdx.x / kSub, sub = threadIdx.x % kSub;
    const int64_t T = a.T, nt = (T + kBK - 1) / kBK;
    for (int64_t id = blockIdx.x; id < a.slices * nt; id += gridDim.x) {
        int64_t b = id / nt, j0 = (id - b * nt) * kBK, nc = T - j0 < kBK ? T - j0 : kBK;
        int64_t base = b * T * a.E;
        C dka[NJ], dva[NJ];
        UNROLL
        for (int j = 0; j < NJ; j++)
            dka[j] = dva[j] = 0;
        __syncthreads();
        load_tile(Ks, k + base, j0, nc, kBK, a);
        load_tile(Vs, v + base, j0, nc, kBK, a);
        /* under the causal mask, the query tiles from the one holding key j0 (kBQ == kBK) */
        for (int64_t i0 = a.causal ? j0 / kBQ * kBQ : 0; i0 < T; i0 += kBQ) {
            int64_t nr = T - i0 < kBQ ? T - i0 : kBQ;
            __syncthreads();
            load_queries(Qs, Ys, lse, D, q, dy, stats, b, i0, nr, a);
            __syncthreads();
            score_grads(Qs, Ys, Ks, Vs, lse, D, P, dS, i0, nr, j0, nc, a);
            __syncthreads();
            for (int r = 0; r < nr; r++) {
                C pr = P[r * (kBK + 1) + c], dr = dS[r * (kBK + 1) + c];
                UNROLL
                for (int j = 0; j < NJ; j++) {
                    int e = sub + kSub * j;
                    if (e < a.E) {
                        dva[j] += pr * Ys[r * a.ld + e];
                        dka[j] += dr * Qs[r * a.ld + e];
                    }
                }
            }
        }
        if (c < nc) {
            UNROLL
            for (int j = 0; j < NJ; j++) {
                int e = sub + kSub * j;
                if (e < a.E) {
                    dk[base + (j0 + c) * a.E + e] = (C)a.scale * dka[j];
                    dv[base + (j0 + c) * a.E + e] = dva[j];
                }
            }
        }
    }
}

/* dq of one query tile per block: thread t sums row t / kSub, features t % kSub + kSub j. The
 * tile's statistics (which may live in these very rows of dq) are read before any is written. */
template <typename C, int EMAX>
__global__ void __launch_bounds__(kAttnThreads)
    attn_dq_k(const C *q, const C *k, const C *v, const C *dy, const C *stats, C *dq, AttnArgs a)
{
    constexpr int NJ = EMAX / kSub;
    extern __shared__ __align__(16) unsigned char smem[];
    C *Ks = (C *)smem, *Vs = Ks + kBK * a.ld, *Qs = Vs + kBK * a.ld, *Ys = Qs + kBQ * a.ld,
      *dS = Ys + kBQ * a.ld, *lse = dS + kBQ * (kBK + 1), *D = lse + kBQ;
    const int r = threadIdx.x / kSub, sub = threadIdx.x % kSub;
    const int64_t T = a.T, nt = (T + kBQ - 1) / kBQ;
    for (int64_t id = blockIdx.x; id < a.slices * nt; id += gridDim.x) {
        int64_t b = id / nt, i0 = (id - b * nt) * kBQ, nr = T - i0 < kBQ ? T - i0 : kBQ;
        int64_t base = b * T * a.E;
        C dqa[NJ];
        UNROLL
        for (int j = 0; j < NJ; j++)
            dqa[j] = 0;
        __syncthreads();
        load_queries(Qs, Ys, lse, D, q, dy, stats, b, i0, nr, a);
        int64_t jend = a.causal ? i0 + nr : T;
        for (int64_t j0 = 0; j0 < jend; j0 += kBK) {
            int64_t nc = jend - j0 < kBK ? jend - j0 : kBK;
            __syncthreads();
            load_tile(Ks, k + base, j0, nc, kBK, a);
            load_tile(Vs, v + base, j0, nc, kBK, a);
            __syncthreads();
            score_grads(Qs, Ys, Ks, Vs, lse, D, (C *)nullptr, dS, i0, nr, j0, nc, a);
            __syncthreads();
            if (r < nr)
                for (int c = 0; c < nc; c++) {
                    C dr = dS[r * (kBK + 1) + c];
                    UNROLL
                    for (int j = 0; j < NJ; j++) {
                        int e = sub + kSub * j;
                        if (e < a.E)
                            dqa[j] += dr * Ks[c * a.ld + e];
                    }
                }
        }
        __syncthreads(); /* every thread has read the tile's statistics */
        if (r < nr) {
            UNROLL
            for (int j = 0; j < NJ; j++) {
                int e = sub + kSub * j;
                if (e < a.E)
                    dq[base + (i0 + r) * a.E + e] = (C)a.scale * dqa[j];
            }
        }
    }
}

/* Shared memory beyond the default 48 KiB is opted into per kernel. */
template <typename K> cudaError_t allow_smem(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* Blocks of a grid over `tiles` tiles: a few waves, each block striding over the rest. */
unsigned attn_grid(const dt__kctx *x, int64_t tiles)
{
    int64_t cap = x->sms > 0 ? (int64_t)x->sms * 16 : kMaxBlocks;
    cap = cap < kMaxBlocks ? cap : kMaxBlocks;
    return (unsigned)(tiles < cap ? tiles : cap);
}

template <typename C, int EMAX>
dt_status attn_run(const dt__kctx *x, bool grad, AttnArgs a, const void *const in[], void *out)
{
    const C *q = (const C *)in[0], *k = (const C *)in[1], *v = (const C *)in[2];
    C *o = (C *)out;
    cudaStream_t st = stream_of(x);
    int64_t tiles = a.slices * ((a.T + kBQ - 1) / kBQ), n = a.slices * a.T * a.E;
    unsigned grid = attn_grid(x, tiles);
    size_t fwd = sizeof(C) * (size_t)(kBQ + 2 * kBK) * (size_t)a.ld;
    if (!grad) {
        cudaError_t e = allow_smem(attn_fwd_k<C, EMAX, false>, fwd);
        if (e != cudaSuccess)
            return queued(x, "attention", Ty<C>::dt, e);
        attn_fwd_k<C, EMAX, false>
            <<<grid, kAttnThreads, fwd, st>>>(q, k, v, nullptr, o, nullptr, a);
        return launched(x, "attention", Ty<C>::dt);
    }
    const C *dy = (const C *)in[3];
    C *dq = o, *dk = o + n, *dv = o + 2 * n, *stats = dq;
    if (a.E < 2) { /* no room in dq's rows: the kernel scratch */
        size_t need = sizeof(C) * 2 * (size_t)(a.slices * a.T);
        if (!x->scratch || need > x->scratch_bytes)
            return dt__fail(DT_ERR_UNSUPPORTED,
                            "CUDA:%d (GPU %d): attention gradient over a feature axis of 1 needs "
                            "%zu bytes of statistics, the kernel scratch holds %zu",
                            x->index, x->ordinal, need, x->scratch_bytes);
        stats = (C *)x->scratch;
        a.sst = 2;
    } else {
        a.sst = a.E;
    }
    size_t tiles2 = sizeof(C) * (size_t)(2 * kBK + 2 * kBQ) * (size_t)a.ld,
           dkdv = tiles2 + sizeof(C) * (size_t)(2 * kBQ * (kBK + 1) + 2 * kBQ),
           dqb = tiles2 + sizeof(C) * (size_t)(kBQ * (kBK + 1) + 2 * kBQ);
    cudaError_t e = allow_smem(attn_fwd_k<C, EMAX, true>, fwd);
    if (e == cudaSuccess)
        e = allow_smem(attn_dkdv_k<C, EMAX>, dkdv);
    if (e == cudaSuccess)
        e = allow_smem(attn_dq_k<C, EMAX>, dqb);
    if (e != cudaSuccess)
        return queued(x, "attention", Ty<C>::dt, e);
    attn_fwd_k<C, EMAX, true><<<grid, kAttnThreads, fwd, st>>>(q, k, v, dy, nullptr, stats, a);
    DT_TRY(launched(x, "attention", Ty<C>::dt));
    attn_dkdv_k<C, EMAX>
        <<<attn_grid(x, a.slices * ((a.T + kBK - 1) / kBK)), kAttnThreads, dkdv, st>>>(
            q, k, v, dy, stats, dk, dv, a);
    DT_TRY(launched(x, "attention", Ty<C>::dt));
    attn_dq_k<C, EMAX><<<grid, kAttnThreads, dqb, st>>>(q, k, v, dy, stats, dq, a);
    return launched(x, "attention", Ty<C>::dt);
}

} // namespace

template <typename S>
dt_status attention(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    static_assert(std::is_same<S, float>::value || std::is_same<S, double>::value,
                  "attention computes in f32 or f64");
    bool grad = DT__MODE_KIND(k->mode) == DT__ATTN_GRAD;
    int r = grad ? k->rank - 1 : k->rank;
    const int64_t *qs = k->in_shape[0];
    AttnArgs a{};
    a.T = qs[r - 2];
    int64_t E = qs[r - 1];
    a.slices = elems(r - 2, qs);
    if (a.slices * a.T * E <= 0)
        return DT_OK;
    if (E > kMaxE)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "CUDA:%d (GPU %d): attention over a feature axis of %lld: this kernel "
                        "takes 1 to %d",
                        x->index, x->ordinal, (long long)E, kMaxE);
    a.E = (int)E;
    a.ld = a.E + 1;
    a.causal = (k->mode & DT__ATTN_CAUSAL) != 0;
    a.scale = k->a;
    if (E <= 32)
        return attn_run<S, 32>(x, grad, a, in, out);
    if (E <= 64)
        return attn_run<S, 64>(x, grad, a, in, out);
    return attn_run<S, 128>(x, grad, a, in, out);
}

template dt_status attention<float>(const dt__kctx *, const dt__kargs *, const void *const[],
                                    void *);
template dt_status attention<double>(const dt__kctx *, const dt__kargs *, const void *const[],
                                     void *);

} // namespace dtcuda
