/* The CUDA backend's XENT kernel, sparse softmax cross-entropy (common/kernels.h; the op in
 * spmd/ops/sparse_xent.c), with the CPU kernel's semantics (backends/cpu/xent.c): per row of
 * k->inner local classes, STATS (maximum, sum of exp, target logit, ownership), MAX, COMBINE,
 * LOSS, and GRAD = (exp(x - lse) - [j == label]) dy.
 *   STATS  one block per row (grid-stride over rows): each thread keeps an online maximum and
 *          sum (in double) over its strided elements, the block combines them in shared memory
 *          as the shards' statistics are combined. Sums run in another order than the CPU's
 *          8 chains: results agree with the CPU kernel to rounding, not bitwise.
 *   GRAD   elementwise over rows x classes.
 *   the rest elementwise over rows.
 * With the flag PROBS (probabilities clipped to [lo, hi] = [eps, 1 - eps] in the compute type),
 * STATS sums the clipped values (its maximum is 0) and takes the log of the target's; GRAD
 * writes (1 / sum - [j == label] / p_j) dy where the clip is not active, 0 where it is.
 * Compiled with -Dcuda=enabled and run on the emulated GPU build (which runs the CPU kernels);
 * it has not run on a real GPU yet. */
#include "common.cuh"

namespace dtcuda
{

template <typename C> HD C xshift(C m)
{
    return isfinite((double)m) ? m : (C)0;
}

/* (m, s) merged with (mb, sb): s rescaled to the larger maximum (an empty sum adds nothing). */
template <typename C> __device__ void merge(C &m, double &s, C mb, double sb)
{
    C mx = mb > m ? mb : m;
    double a = s > 0 ? s * exp((double)xshift(m) - (double)xshift(mx)) : 0;
    double b = sb > 0 ? sb * exp((double)xshift(mb) - (double)xshift(mx)) : 0;
    m = mx;
    s = a + b;
}

template <typename C> HD C clip(C v, C lo, C hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

template <typename S>
__global__ void __launch_bounds__(256)
    xent_stats_k(const S *x, const void *labels, dt_dtype lt, Cof<S> *o, int64_t rows, int64_t n,
                 int64_t lo, bool probs, Cof<S> plo, Cof<S> phi)
{
    using C = Cof<S>;
    __shared__ C sm[256];
    __shared__ double ss[256];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const S *row = x + r * n;
        C m = (C)-INFINITY;
        double s = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            C v = Ty<S>::ld(row[j]);
            if (probs) { /* m stays -inf: the merges add the sums as they are */
                s += (double)clip<C>(v, plo, phi);
                continue;
            }
            if (v > m) {
                s = s > 0 ? s * exp((double)xshift(m) - (double)xshift(v)) : 0;
                m = v;
            }
            s += (double)cexp<C>(v - xshift(m));
        }
        sm[threadIdx.x] = m;
        ss[threadIdx.x] = s;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w /= 2) {
            if ((int)threadIdx.x < w) {
                C mm = sm[threadIdx.x];
                double s2 = ss[threadIdx.x];
                merge<C>(mm, s2, sm[threadIdx.x + w], ss[threadIdx.x + w]);
                sm[threadIdx.x] = mm;
                ss[threadIdx.x] = s2;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            int64_t t = dt__index_at(lt, labels, r) - lo;
            bool own = t >= 0 && t < n;
            o[4 * r] = probs ? (C)0 : sm[0];
            o[4 * r + 1] = (C)ss[0];
            C xt = own ? Ty<S>::ld(row[t]) : (C)0;
            o[4 * r + 2] = probs && own ? (C)log((double)clip<C>(xt, plo, phi)) : xt;
            o[4 * r + 3] = own ? (C)1 : (C)0;
        }
        __syncthreads();
    }
}

template <typename S>
__global__ void xent_rows_k(unsigned mode, const Cof<S> *a, const void *b, Cof<S> *o, S *loss,
                            int64_t rows)
{
    using C = Cof<S>;
    for (int64_t r = first_index(); r < rows; r += grid_step()) {
        if (mode == DT__XENT_MAX) {
            o[r] = a[4 * r];
        } else if (mode == DT__XENT_COMBINE) {
            C ml = a[4 * r], m = ((const C *)b)[r];
            double s = a[4 * r + 1];
            o[3 * r] = s > 0 ? (C)(s * exp((double)xshift(ml) - (double)xshift(m))) : (C)0;
            o[3 * r + 1] = a[4 * r + 2];
            o[3 * r + 2] = a[4 * r + 3];
        } else { /* LOSS: a = m, b = combined */
            const C *c = (const C *)b;
            C lse = xshift(a[r]) + clog<C>(c[3 * r]);
            loss[r] = c[3 * r + 2] == (C)1 ? Ty<S>::st((C)((double)lse - (double)c[3 * r + 1]))
                                           : Ty<S>::st((C)NAN);
        }
    }
}

template <typename S>
__global__ void xent_grad_k(const S *x, const void *labels, dt_dtype lt, const Cof<S> *m,
                            const Cof<S> *c, const S *dy, S *o, int64_t rows, int64_t n, int64_t lo,
                            bool probs, Cof<S> plo, Cof<S> phi)
{
    using C = Cof<S>;
    int64_t total = rows * n;
    for (int64_t e = first_index(); e < total; e += grid_step()) {
        int64_t r = e / n, j = e % n;
        if (probs) {
            C v = Ty<S>::ld(x[e]), g = (C)0;
            if (c[3 * r + 2] != (C)1)
                g = (C)NAN;
            else if (v >= plo && v <= phi)
                g = (C)((1 / (double)c[3 * r] -
                         (dt__index_at(lt, labels, r) - lo == j ? 1 / (double)v : 0)) *
                        (double)Ty<S>::ld(dy[r]));
            o[e] = Ty<S>::st(g);
            continue;
        }
        C lse = c[3 * r + 2] == (C)1 ? xshift(m[r]) + clog<C>(c[3 * r]) : (C)NAN;
        C p = cexp<C>(Ty<S>::ld(x[e]) - lse);
        if (dt__index_at(lt, labels, r) - lo == j)
            p -= (C)1;
        o[e] = Ty<S>::st(p * Ty<S>::ld(dy[r]));
    }
}

template <typename S>
dt_status xent(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using C = Cof<S>;
    cudaStream_t st = stream_of(x);
    unsigned mode = DT__MODE_KIND(k->mode);
    int64_t rows = k->nidx, n = k->inner;
    bool probs = k->mode & DT__XENT_PROBS;
    C plo = (C)k->a, phi = (C)(1 - k->a); /* the clip's bounds (PROBS) */
    if (rows <= 0)
        return DT_OK;
    if (mode == DT__XENT_STATS)
        xent_stats_k<S><<<blocks_for(rows, 1), 256, 0, st>>>(
            (const S *)in[0], in[1], k->from, (C *)out, rows, n, k->lo, probs, plo, phi);
    else if (mode == DT__XENT_GRAD) {
        if (rows * n <= 0)
            return DT_OK;
        xent_grad_k<S><<<grid_for(rows * n), kThreads, 0, st>>>(
            (const S *)in[0], in[1], k->from, (const C *)in[2], (const C *)in[3], (const S *)in[4],
            (S *)out, rows, n, k->lo, probs, plo, phi);
    } else
        xent_rows_k<S><<<grid_for(rows), kThreads, 0, st>>>(mode, (const C *)in[0], in[1], (C *)out,
                                                            (S *)out, rows);
    return launched(x, "xent", Ty<S>::dt);
}

DT__CUDA_FLOAT_TYPES(DT__CUDA_INSTANTIATE, xent)

} // namespace dtcuda
