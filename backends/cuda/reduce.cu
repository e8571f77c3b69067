/* CUDA reductions and the row-wise kernels (softmax, norm, scan, arg_reduce) of the CPU's table,
 * on the fold engine of common.cuh ("folds of rows"): the reduction's fold ReduceFold is there too,
 * as the fused chains that end in a reduction (elementwise.cu) fold the same way. */
#include "common.cuh"

namespace dtcuda
{
namespace
{

/* ---- softmax -------------------------------------------------------------------------------- */

/* TensorFlow's shift of reduce_logsumexp: the maximum where it is finite, else 0. */
template <typename C> HD C shift_of(C m)
{
    return isfinite((double)m) ? m : (C)0;
}

/* The row maximum (NaN skipped), stored in x's dtype. */
template <typename S> struct MaxFold {
    using acc_t = Cof<S>;
    const S *x;
    S *o;
    HD acc_t init() const
    {
        return (acc_t)-INFINITY;
    }
    HD acc_t load(int64_t, int64_t off, int64_t) const
    {
        return Ty<S>::ld(x[off]);
    }
    HD acc_t step(acc_t a, acc_t v) const
    {
        return v > a ? v : a;
    }
    HD void finish(int64_t q, acc_t a) const
    {
        o[q] = Ty<S>::st(a);
    }
};

/* sum exp(x - shift(m)), each term in the compute type, summed in double, stored in C. */
template <typename S> struct SumExpFold {
    using acc_t = double;
    using C = Cof<S>;
    const S *x, *m;
    C *s;
    HD double init() const
    {
        return 0;
    }
    HD double load(int64_t q, int64_t off, int64_t) const
    {
        return (double)cexp<C>(Ty<S>::ld(x[off]) - shift_of(Ty<S>::ld(m[q])));
    }
    HD double step(double a, double v) const
    {
        return a + v;
    }
    HD void finish(int64_t q, double a) const
    {
        s[q] = (C)a;
    }
};

/* y = exp(x - shift(m)) * (1 / s), or x - (shift(m) + log s): element i of x, its row's
 * statistics at g's offset of i (the CPU's formulas for rows of adjacent axes). */
template <typename S>
__global__ void softmax_apply_k(const S *x, const S *m, const Cof<S> *s, S *y, int64_t n, bool log,
                                Bcast g)
{
    using C = Cof<S>;
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t q = bcast_at(g, 0, i);
        C v = Ty<S>::ld(x[i]), sh = shift_of(Ty<S>::ld(m[q]));
        y[i] =
            log ? Ty<S>::st(v - (sh + clog<C>(s[q]))) : Ty<S>::st(cexp<C>(v - sh) * ((C)1 / s[q]));
    }
}

template <typename S> __global__ void lse_k(const S *m, const Cof<S> *s, S *o, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        o[i] = Ty<S>::st(shift_of(Ty<S>::ld(m[i])) + clog<Cof<S>>(s[i]));
}

/* ---- norm ----------------------------------------------------------------------------------- */

/* scale * sum (x - c) or scale * sum (x - c)^2 (c: the row's mean for VAR, else 0), in double,
 * stored in C. */
template <typename S> struct StatFold {
    using acc_t = double;
    using C = Cof<S>;
    const S *x;
    const C *mu;
    C *o;
    bool square;
    double scale;
    HD double init() const
    {
        return 0;
    }
    HD double load(int64_t q, int64_t off, int64_t) const
    {
        double v = (double)Ty<S>::ld(x[off]) - (mu ? (double)mu[q] : 0.0);
        return square ? mul_rn(v, v) : v;
    }
    HD double step(double a, double v) const
    {
        return a + v;
    }
    HD void finish(int64_t q, double a) const
    {
        o[q] = (C)(a * scale);
    }
};

/* y = (x - mu) rsqrt(v + eps) gamma + beta over rows of n (mu absent for RMS: 0). */
template <typename S>
__global__ void norm_apply_k(const S *x, const Cof<S> *mu, const Cof<S> *var, const S *gamma,
                             const S *beta, S *y, int64_t total, int64_t n, double eps)
{
    using C = Cof<S>;
    for (int64_t i = first_index(); i < total; i += grid_step()) {
        int64_t q = i / n, j = i % n;
        C c = mu ? mu[q] : (C)0, rs = (C)(1.0 / sqrt((double)var[q] + eps));
        C v = mul_rn(Ty<S>::ld(x[i]) - c, rs);
        if (gamma)
            v = mul_rn(v, Ty<S>::ld(gamma[j]));
        if (beta)
            v = add_rn(v, Ty<S>::ld(beta[j]));
        y[i] = Ty<S>::st(v);
    }
}

/* ---- scan ----------------------------------------------------------------------------------- */

/* The row's total in C (integers wrap), stored in C. */
template <typename S> struct TotalFold {
    using acc_t = Cof<S>;
    const S *x;
    acc_t *o;
    HD acc_t init() const
    {
        return 0;
    }
    HD acc_t load(int64_t, int64_t off, int64_t) const
    {
        return Ty<S>::ld(x[off]);
    }
    HD acc_t step(acc_t a, acc_t v) const
    {
        return wadd(a, v);
    }
    HD void finish(int64_t q, acc_t a) const
    {
        o[q] = a;
    }
};

struct ScanArgs {
    bool excl, rev;
    const void *tot; /* the totals of every shard of the group, (outer, g, inner) in C; or NULL */
    int64_t g, start, inner;
};

/* The totals of the shards before `start` (after it, when rev) for row q = o * inner + i. */
template <typename C> HD C scan_carry(const ScanArgs &a, int64_t q)
{
    const C *tot = (const C *)a.tot;
    int64_t o = q / a.inner, i = q % a.inner;
    C c = 0;
    for (int64_t b = a.rev ? a.start + 1 : 0; tot && b < (a.rev ? a.g : a.start); b++)
        c = wadd(c, tot[(o * a.g + b) * a.inner + i]);
    return c;
}

/* Elements jj0 <= jj < jj1 of row q in visiting order (from the end when rev) after the running
 * value c: y = c then c += x (exclusive), or c += x then y = c. Returns c. */
template <typename S>
HD Cof<S> scan_run(const S *x, S *y, const Rows &r, const ScanArgs &a, int64_t base, int64_t jj0,
                   int64_t jj1, Cof<S> c)
{
    for (int64_t jj = jj0; jj < jj1; jj++) {
        int64_t at = base + row_elem(r, a.rev ? r.n - 1 - jj : jj);
        Cof<S> v = Ty<S>::ld(x[at]);
        if (a.excl) {
            y[at] = Ty<S>::st(c);
            c = wadd(c, v);
        } else {
            c = wadd(c, v);
            y[at] = Ty<S>::st(c);
        }
    }
    return c;
}

/* One thread a row, in order: the CPU's sums. */
template <typename S> __global__ void scan_seq_k(const S *x, S *y, Rows r, ScanArgs a)
{
    for (int64_t q = first_index(); q < r.nrows; q += grid_step())
        scan_run<S>(x, y, r, a, row_base(r, q), 0, r.n, scan_carry<Cof<S>>(a, q));
}

/* One block a long row: each thread sums its chunk, the chunks' totals are scanned in order,
 * then each thread runs its chunk from its prefix (integers exact; float sums within rounding
 * of the sequential ones). */
template <typename S>
__global__ void __launch_bounds__(1024) scan_block_k(const S *x, S *y, Rows r, ScanArgs a)
{
    using C = Cof<S>;
    __shared__ C part[1024];
    const int t = (int)threadIdx.x;
    const int64_t chunk = (r.n + 1023) / 1024, jj0 = t * chunk < r.n ? t * chunk : r.n;
    const int64_t jj1 = jj0 + chunk < r.n ? jj0 + chunk : r.n;
    for (int64_t q = blockIdx.x; q < r.nrows; q += gridDim.x) {
        int64_t base = row_base(r, q);
        C c = 0;
        for (int64_t jj = jj0; jj < jj1; jj++)
            c = wadd(c, Ty<S>::ld(x[base + row_elem(r, a.rev ? r.n - 1 - jj : jj)]));
        part[t] = c;
        __syncthreads();
        if (t == 0) {
            C run = scan_carry<C>(a, q);
            for (int u = 0; u < 1024; u++) {
                C v = part[u];
                part[u] = run;
                run = wadd(run, v);
            }
        }
        __syncthreads();
        scan_run<S>(x, y, r, a, base, jj0, jj1, part[t]);
        __syncthreads();
    }
}

/* ---- arg_reduce ----------------------------------------------------------------------------- */

/* The extremum so far: its value, index along the axis (-1: none) and offset in x. A NaN wins
 * over every number, ties and NaNs go to the lower index: as the CPU's scan, which stops at the
 * first NaN and keeps the first of equal extremes, whatever order partial folds combine in. */
template <typename C> struct ArgAcc {
    C v;
    int64_t at, off;
    bool nan;
};

template <typename S> struct ArgFold {
    using C = Cof<S>;
    using acc_t = ArgAcc<C>;
    const S *x;
    void *out;
    bool records, max;
    dt_dtype to;
    int64_t start, inner;
    HD acc_t init() const
    {
        return acc_t{(C)0, -1, 0, false};
    }
    HD acc_t load(int64_t, int64_t off, int64_t j) const
    {
        C v = Ty<S>::ld(x[off]);
        bool nan = false;
        if constexpr (Ty<S>::flt)
            nan = isnan((double)v);
        return acc_t{v, j, off, nan};
    }
    HD acc_t step(acc_t a, acc_t b) const
    {
        if (a.at < 0 || b.at < 0)
            return a.at < 0 ? b : a;
        if (a.nan || b.nan) {
            if (a.nan && b.nan)
                return a.at < b.at ? a : b;
            return a.nan ? a : b;
        }
        if (a.v != b.v)
            return (max ? a.v > b.v : a.v < b.v) ? a : b;
        return a.at < b.at ? a : b;
    }
    HD void finish(int64_t q, acc_t a) const
    {
        int64_t at = a.at >= 0 ? a.at + start : -1;
        if (records) { /* the winner's storage bits, zero-extended, and its global index */
            int64_t *w = (int64_t *)out, bits = 0, o = q / inner, i = q % inner;
            if (a.at >= 0)
                memcpy(&bits, &x[a.off], sizeof(S));
            w[(o * 2) * inner + i] = bits;
            w[(o * 2 + 1) * inner + i] = at;
        } else if (to == DT_DTYPE_I64) {
            ((int64_t *)out)[q] = at;
        } else {
            ((int32_t *)out)[q] = (int32_t)at;
        }
    }
};

/* The records of g shards (in order) for each (o, i): the first NaN wins, else the first of the
 * extremes; -1 records (empty shards) are skipped. */
template <typename S>
__global__ void arg_merge_k(const int64_t *w, void *out, int64_t outer, int64_t g, int64_t inner,
                            bool max, dt_dtype to)
{
    using C = Cof<S>;
    for (int64_t q = first_index(); q < outer * inner; q += grid_step()) {
        int64_t o = q / inner, i = q % inner, at = -1;
        C b = 0;
        for (int64_t s = 0; s < g; s++) {
            int64_t bits = w[(o * 2 * g + 2 * s) * inner + i],
                    idx = w[(o * 2 * g + 2 * s + 1) * inner + i];
            if (idx < 0)
                continue;
            S sv;
            memcpy(&sv, &bits, sizeof sv);
            C v = Ty<S>::ld(sv);
            bool nan = false;
            if constexpr (Ty<S>::flt)
                nan = isnan((double)v);
            if (nan) {
                at = idx;
                break;
            }
            if (at < 0 || (max ? v > b : v < b)) {
                b = v;
                at = idx;
            }
        }
        if (to == DT_DTYPE_I64)
            ((int64_t *)out)[q] = at;
        else
            ((int32_t *)out)[q] = (int32_t)at;
    }
}

} // namespace

/* ---- the table's entries -------------------------------------------------------------------- */

/* out has the input's rank, the axes in k->mask of extent 1; an empty reduction writes init
 * (times the scale) everywhere. */
template <typename S>
dt_status reduce(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    Rows r;
    plan_rows(k->rank, k->in_shape[0], k->mask, &r);
    if (r.nrows <= 0)
        return DT_OK;
    const S *xs = (const S *)in[0];
    fold_rows(x, r, ReduceFold<S, Cof<S>>{xs, (S *)out, k->op, k->a},
              ReduceFold<S, Wide<Cof<S>>>{xs, (S *)out, k->op, k->a});
    return launched(x, "reduce", Ty<S>::dt);
}

/* Modes in common/kernels.h: the statistics fold rows over k->mask; the others are elementwise. */
template <typename S>
dt_status softmax(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using C = Cof<S>;
    cudaStream_t st = stream_of(x);
    unsigned mode = DT__MODE_KIND(k->mode);
    if (mode == DT__SOFTMAX_LSE) {
        int64_t n = elems(k->rank, k->shape);
        if (n > 0)
            lse_k<S>
                <<<grid_for(n), kThreads, 0, st>>>((const S *)in[0], (const C *)in[1], (S *)out, n);
        return launched(x, "softmax", Ty<S>::dt);
    }
    const S *xs = (const S *)in[0], *m = (const S *)in[1];
    if (mode == DT__SOFTMAX_MAX || mode == DT__SOFTMAX_SUMEXP) {
        Rows r;
        plan_rows(k->rank, k->in_shape[0], k->mask, &r);
        if (r.nrows <= 0)
            return DT_OK;
        if (mode == DT__SOFTMAX_MAX)
            fold_rows(x, r, MaxFold<S>{xs, (S *)out}, MaxFold<S>{xs, (S *)out});
        else
            fold_rows(x, r, SumExpFold<S>{xs, m, (C *)out}, SumExpFold<S>{xs, m, (C *)out});
        return launched(x, "softmax", Ty<S>::dt);
    }
    int64_t n = elems(k->rank, k->in_shape[0]);
    if (n <= 0)
        return DT_OK;
    int64_t stats[1][R];
    for (int i = 0; i < k->rank; i++)
        stats[0][i] = (k->mask & (1u << i)) ? 1 : k->in_shape[0][i];
    Bcast g;
    plan_bcast(k->rank, k->in_shape[0], 1, stats, &g);
    softmax_apply_k<S><<<grid_for(n), kThreads, 0, st>>>(xs, m, (const C *)in[2], (S *)out, n,
                                                         mode == DT__SOFTMAX_LOG_SOFTMAX, g);
    return launched(x, "softmax", Ty<S>::dt);
}

/* Over the last axis: rows of n elements; statistics in C, one per row. */
template <typename S>
dt_status norm(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    using C = Cof<S>;
    cudaStream_t st = stream_of(x);
    const S *xs = (const S *)in[0];
    unsigned mode = DT__MODE_KIND(k->mode);
    int r = k->rank;
    if (mode == DT__NORM_MEAN || mode == DT__NORM_VAR || mode == DT__NORM_MEAN_SQUARE) {
        Rows rw;
        plan_rows(r, k->in_shape[0], r ? 1u << (r - 1) : 0u, &rw);
        if (rw.nrows <= 0)
            return DT_OK;
        StatFold<S> f{xs, mode == DT__NORM_VAR ? (const C *)in[1] : nullptr, (C *)out,
                      mode != DT__NORM_MEAN, k->a};
        fold_rows(x, rw, f, f);
        return launched(x, "norm", Ty<S>::dt);
    }
    int64_t total = elems(r, k->in_shape[0]), n = r ? k->in_shape[0][r - 1] : 1;
    if (total <= 0)
        return DT_OK;
    bool layer = mode == DT__NORM_LAYER;
    const C *mu = layer ? (const C *)in[1] : nullptr, *var = (const C *)in[layer ? 2 : 1];
    int next = layer ? 3 : 2;
    const S *gamma = (k->mode & DT__NORM_GAMMA) ? (const S *)in[next++] : nullptr;
    const S *beta = (k->mode & DT__NORM_BETA) ? (const S *)in[next] : nullptr;
    norm_apply_k<S>
        <<<grid_for(total), kThreads, 0, st>>>(xs, mu, var, gamma, beta, (S *)out, total, n, k->b);
    return launched(x, "norm", Ty<S>::dt);
}

/* Running sums along k->axis (TOTAL: the sum of each row, in C). */
template <typename S>
dt_status scan(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    cudaStream_t st = stream_of(x);
    const S *xs = (const S *)in[0];
    Rows r;
    plan_rows(k->rank, k->in_shape[0], 1u << k->axis, &r);
    if (r.nrows <= 0 || (r.n <= 0 && DT__MODE_KIND(k->mode) != DT__SCAN_TOTAL))
        return DT_OK;
    if (DT__MODE_KIND(k->mode) == DT__SCAN_TOTAL) {
        TotalFold<S> f{xs, (Cof<S> *)out};
        fold_rows(x, r, f, f);
        return launched(x, "scan", Ty<S>::dt);
    }
    int64_t inner = 1;
    for (int i = k->axis + 1; i < k->rank; i++)
        inner *= k->in_shape[0][i];
    bool carry = k->mode & DT__SCAN_CARRY;
    ScanArgs a{(k->mode & DT__SCAN_EXCLUSIVE) != 0,
               (k->mode & DT__SCAN_REVERSE) != 0,
               carry ? in[1] : nullptr,
               carry ? k->in_shape[1][k->axis] : 0,
               k->start,
               inner};
    if (r.n >= 4096 && r.nrows < 2048)
        scan_block_k<S><<<blocks_for(r.nrows, 1), 1024, 0, st>>>(xs, (S *)out, r, a);
    else
        scan_seq_k<S><<<grid_for(r.nrows), kThreads, 0, st>>>(xs, (S *)out, r, a);
    return launched(x, "scan", Ty<S>::dt);
}

template <typename S>
dt_status arg_reduce(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    cudaStream_t st = stream_of(x);
    int64_t outer = 1, n = k->in_shape[0][k->axis], inner = 1;
    for (int i = 0; i < k->rank; i++) {
        if (i < k->axis)
            outer *= k->in_shape[0][i];
        else if (i > k->axis)
            inner *= k->in_shape[0][i];
    }
    if (outer * inner <= 0)
        return DT_OK;
    bool max = k->op == DT_REDUCE_MAX;
    if (DT__MODE_KIND(k->mode) == DT__ARG_MERGE) {
        arg_merge_k<S><<<grid_for(outer * inner), kThreads, 0, st>>>(
            (const int64_t *)in[0], out, outer, n / 2, inner, max, k->to);
        return launched(x, "arg_reduce", Ty<S>::dt);
    }
    Rows r;
    plan_rows(k->rank, k->in_shape[0], 1u << k->axis, &r);
    ArgFold<S> f{(const S *)in[0], out,  DT__MODE_KIND(k->mode) == DT__ARG_RECORDS, max, k->to,
                 k->start,         inner};
    fold_rows(x, r, f, f);
    return launched(x, "arg_reduce", Ty<S>::dt);
}

DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, reduce)
DT__CUDA_FLOAT_TYPES(DT__CUDA_INSTANTIATE, softmax)
DT__CUDA_FLOAT_TYPES(DT__CUDA_INSTANTIATE, norm)
DT__CUDA_NUMERIC_TYPES(DT__CUDA_INSTANTIATE, scan)
DT__CUDA_ALL_TYPES(DT__CUDA_INSTANTIATE, arg_reduce)

} // namespace dtcuda
