/* CUDA data movement: transpose, the block copies behind slice, concat, pack, unpack and
 * relayout, select_fill, and the index kernels gather, one_hot and segment_sum. Copies are
 * dtype-blind (they move each element's bits: Bits<S>); segment_sum adds in the CPU's order
 * (increasing index, in the compute type), so its results are bitwise the CPU's. */
#include "common.cuh"

namespace dtcuda
{
namespace
{

/* ---- transpose ------------------------------------------------------------------------------ */

/* Output axes (extent-1 axes dropped, runs contiguous in the input merged): extents and the
 * input stride of each (the output is row-major). */
struct PermArgs {
    int nd;
    int64_t ext[R], in_st[R];
};

/* When the innermost axis moves: 32 x 32 tiles of the plane (u, v), u the input's innermost
 * axis (stride 1 in the input, out_u in the output), v the output's innermost (stride 1 in the
 * output, in_v in the input); the other axes (row-major, "batch") index the planes. */
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

template <typename B> __global__ void transpose_k(const B *x, B *o, int64_t n, PermArgs p)
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
 * writes along v (the output's); tile[v][u] in between (33 columns: the column reads hit
 * distinct banks). */
template <typename B>
__global__ void __launch_bounds__(256) transpose_tile_k(const B *x, B *o, TileArgs a)
{
    __shared__ B tile[32][33];
    const int tx = (int)threadIdx.x % 32, ty = (int)threadIdx.x / 32;
    for (int64_t t = blockIdx.x; t < a.ntiles; t += gridDim.x) {
        int64_t ib, ob, u0, v0;
        tile_origin(a, t, &ib, &ob, &u0, &v0);
        for (int j = ty; j < 32; j += 8) {
            int64_t u = u0 + tx, v = v0 + j;
            if (u < a.eu && v < a.ev)
                tile[j][tx] = x[ib + u + v * a.in_v];
        }
        __syncthreads();
        for (int j = ty; j < 32; j += 8) {
            int64_t u = u0 + j, v = v0 + tx;
            if (u < a.eu && v < a.ev)
                o[ob + u * a.out_u + v] = tile[tx][j];
        }
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

template <typename B> __global__ void copy_blocks_k(const B *x, B *o, CopyPack pk)
{
    const CopyBlock &b = pk.b[blockIdx.y];
    for (int64_t i = first_index(); i < b.n; i += grid_step()) {
        int64_t s, d;
        offset2(i, b.nd, b.ext, b.ss, b.ds, &s, &d);
        o[b.dst + d] = x[b.src + s];
    }
}

/* ---- index kernels -------------------------------------------------------------------------- */

/* out (nidx, inner): row i is the table's local row ids[i] - lo, or zeros when that is outside
 * [0, rows) (another shard's row, or outside the table). */
template <typename B>
__global__ void gather_k(const B *t, const void *ids, dt_dtype it, B *o, int64_t n, int64_t inner,
                         int64_t lo, int64_t rows)
{
    for (int64_t e = first_index(); e < n; e += grid_step()) {
        int64_t i = e / inner, c = e % inner, r = dt__index_at(it, ids, i) - lo;
        o[e] = r >= 0 && r < rows ? t[r * inner + c] : (B)0;
    }
}

/* out (nidx / w, rows, w): on where the index at (a, c) equals lo + j, else off. */
template <typename B>
__global__ void one_hot_k(const void *ids, dt_dtype it, B *o, int64_t n, int64_t w, int64_t lo,
                          int64_t rows, B on, B off)
{
    for (int64_t e = first_index(); e < n; e += grid_step()) {
        int64_t c = e % w, j = e / w % rows, a = e / (w * rows);
        o[e] = dt__index_at(it, ids, a * w + c) - lo == j ? on : off;
    }
}

/* out (rows, inner): block b takes output rows b, b + grid, ...; for each run of 256 columns,
 * the indices are scanned 256 at a time, the matches compacted in index order (warp ballots),
 * and each thread adds its column of every matching data row in that order: the CPU's sums. */
template <typename S>
__global__ void __launch_bounds__(256)
    segment_sum_k(const S *x, const void *ids, dt_dtype it, S *o, int64_t nidx, int64_t inner,
                  int64_t lo, int64_t rows, const S *base)
{
    using C = Cof<S>;
    __shared__ int64_t hits[256];
    __shared__ int warp_at[9];
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int64_t c0 = 0; c0 < inner; c0 += 256) {
            int64_t c = c0 + t;
            C acc = 0;
            bool any = false;
            for (int64_t at = 0; at < nidx; at += 256) {
                int64_t i = at + t;
                bool hit = i < nidx && dt__index_at(it, ids, i) - lo == r;
                unsigned mask = __ballot_sync(0xffffffffu, hit);
                if (lane == 0)
                    warp_at[warp + 1] = __popc(mask);
                __syncthreads();
                if (t == 0) {
                    warp_at[0] = 0;
                    for (int w = 1; w <= 8; w++)
                        warp_at[w] += warp_at[w - 1];
                }
                __syncthreads();
                if (hit)
                    hits[warp_at[warp] + __popc(mask & ((1u << lane) - 1u))] = i;
                __syncthreads();
                any = any || warp_at[8] > 0;
                for (int h = 0; h < warp_at[8] && c < inner; h++)
                    acc = wadd(acc, Ty<S>::ld(x[hits[h] * inner + c]));
                __syncthreads();
            }
            /* into a base: base + the sum rounded to S where selected, else base's own */
            if (c < inner && base)
                o[r * inner + c] =
                    any ? Ty<S>::st(wadd(Ty<S>::ld(base[r * inner + c]), Ty<S>::ld(Ty<S>::st(acc))))
                        : base[r * inner + c];
            else if (c < inner)
                o[r * inner + c] = Ty<S>::st(acc);
        }
}

} // namespace

/* ---- the table's entries -------------------------------------------------------------------- */

template <typename S>
dt_status transpose(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using B = Bits<S>;
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    PermArgs p;
    TileArgs a;
    const B *xin = (const B *)in[0];
    if (plan_transpose(k, &p, &a))
        transpose_tile_k<B><<<blocks_for(a.ntiles, 1), 256, 0, stream_of(x)>>>(xin, (B *)out, a);
    else
        transpose_k<B><<<grid_for(n), kThreads, 0, stream_of(x)>>>(xin, (B *)out, n, p);
    return launched(x, "transpose", Ty<S>::dt);
}

/* Blocks of zero elements are skipped; a block that is one contiguous run of a million elements
 * or more is a cudaMemcpyAsync, the others go kPack to a launch. Launches and copies are queued
 * in block order (the blocks of one call are disjoint in the destination). */
template <typename S>
dt_status copy_blocks(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using B = Bits<S>;
    if (k->nblocks > 0 && !k->blocks)
        return dt__fail(DT_ERR_ARG, "CUDA:%d (GPU %d): copy_blocks for %s: %d blocks and no list",
                        x->index, x->ordinal, dt_dtype_name(Ty<S>::dt), k->nblocks);
    const B *src = (const B *)in[0];
    B *dst = (B *)out;
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
            copy_blocks_k<B><<<dim3(grid_for(most), (unsigned)np), kThreads, 0, st>>>(src, dst, pk);
            DT_TRY(launched(x, "copy_blocks", Ty<S>::dt));
            np = 0;
            most = 0;
        }
        if (run)
            DT_TRY(queued(x, "copy_blocks", Ty<S>::dt,
                          cudaMemcpyAsync(dst + c.dst, src + c.src, (size_t)c.n * sizeof(B),
                                          cudaMemcpyDeviceToDevice, st)));
    }
    return DT_OK;
}

template <typename S>
dt_status select_fill(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    int64_t n = elems(k->rank, k->shape);
    if (n <= 0)
        return DT_OK;
    if (!k->select)
        return fill_value<S>(x, out, n, Ty<S>::from_d(k->a), "select_fill");
    return queued(
        x, "select_fill", Ty<S>::dt,
        cudaMemcpyAsync(out, in[0], (size_t)n * sizeof(S), cudaMemcpyDeviceToDevice, stream_of(x)));
}

template <typename S>
dt_status gather(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using B = Bits<S>;
    int64_t n = k->nidx * k->inner;
    if (n <= 0)
        return DT_OK;
    gather_k<B><<<grid_for(n), kThreads, 0, stream_of(x)>>>((const B *)in[0], in[1], k->from,
                                                            (B *)out, n, k->inner, k->lo, k->rows);
    return launched(x, "gather", Ty<S>::dt);
}

template <typename S>
dt_status one_hot(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using B = Bits<S>;
    int64_t w = k->inner, outer = w ? k->nidx / w : 0, n = outer * k->rows * w;
    if (n <= 0)
        return DT_OK;
    S on = Ty<S>::from_d(k->a), off = Ty<S>::from_d(k->b);
    B bon, boff;
    memcpy(&bon, &on, sizeof bon);
    memcpy(&boff, &off, sizeof boff);
    one_hot_k<B><<<grid_for(n), kThreads, 0, stream_of(x)>>>(in[0], k->from, (B *)out, n, w, k->lo,
                                                             k->rows, bon, boff);
    return launched(x, "one_hot", Ty<S>::dt);
}

template <typename S>
dt_status segment_sum(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    if (k->rows <= 0 || k->inner <= 0)
        return DT_OK;
    segment_sum_k<S><<<blocks_for(k->rows, 1), 256, 0, stream_of(x)>>>(
        (const S *)in[0], in[1], k->from, (S *)out, k->nidx, k->inner, k->lo, k->rows,
        k->mode == DT__SEGMENT_INTO ? (const S *)in[2] : nullptr);
    return launched(x, "segment_sum", Ty<S>::dt);
}

DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, transpose)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, copy_blocks)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, select_fill)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, gather)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, one_hot)
DT__CUDA_NUMERIC_TYPES(DT__CUDA_INSTANTIATE, segment_sum)

} // namespace dtcuda
