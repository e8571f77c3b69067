/* Kernels split over a CPU device's threads (backends/cpu/pool.h): each kernel's loop runs
 * unchanged on a view of its arguments cut to a range of rows or leading elements, so every
 * output element is computed by the same code in the same order as on one thread. */
#include "index.h"
#include "pool.h"

#include <string.h>

/* ---- kernels split along axis 0 of a view ------------------------------------------------ */

typedef struct {
    dt__cpu_loop fn;
    const dt__kargs *v;
    int nin;
    const size_t *in_step;
    size_t out_step;
    const void *const *in;
    void *out;
} rows_job;

static void rows_range(void *arg, int64_t lo, int64_t hi)
{
    const rows_job *j = arg;
    dt__kargs k = *j->v;
    const void *in[DT__FUSED_MAX_IN] = {NULL};
    k.shape[0] = hi - lo;
    for (int q = 0; q < j->nin; q++) {
        in[q] = j->in[q];
        if (j->in_step[q] && in[q]) {
            k.in_shape[q][0] = hi - lo;
            in[q] = (const unsigned char *)in[q] + (size_t)lo * j->in_step[q];
        }
    }
    j->fn(&k, in, (unsigned char *)j->out + (size_t)lo * j->out_step);
}

void dt__cpu_rows(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *v, int64_t work, int nin,
                  const size_t in_step[], size_t out_step, const void *const in[], void *out)
{
    int parts = v->rank > 0 ? dt__cpu_parts(x, work, v->shape[0]) : 1;
    if (parts < 2) {
        fn(v, in, out);
        return;
    }
    rows_job j = {fn, v, nin, in_step, out_step, in, out};
    dt__cpu_pool_run(x->pool, v->shape[0], parts, rows_range, &j);
}

void dt__cpu_elementwise(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k, int nin,
                         const size_t isz[], size_t osz, const void *const in[], void *out)
{
    int r = k->rank;
    int64_t n = dt__num_elements(r, k->shape);
    if (r == 0 || dt__cpu_parts(x, n, n) < 2) {
        fn(k, in, out);
        return;
    }
    /* the leading axes p along which each operand is either whole or broadcast throughout
     * (axes of extent 1 go with either) merge into one axis of extent `lead` */
    int p = 0;
    int64_t lead = 1;
    int whole[DT__FUSED_MAX_IN]; /* -1 undecided, 0 broadcast, 1 whole */
    for (int q = 0; q < nin; q++)
        whole[q] = -1;
    for (; p < r; p++) {
        bool fits = true;
        for (int q = 0; q < nin && fits; q++) {
            int w = k->in_shape[q][p] != 1;
            fits = k->shape[p] == 1 || whole[q] < 0 || whole[q] == w;
        }
        if (!fits)
            break;
        for (int q = 0; q < nin && k->shape[p] != 1; q++)
            whole[q] = k->in_shape[q][p] != 1;
        lead *= k->shape[p];
    }
    dt__kargs v = *k;
    v.rank = r - p + 1;
    v.shape[0] = lead;
    for (int i = p; i < r; i++)
        v.shape[i - p + 1] = k->shape[i];
    size_t step[DT__FUSED_MAX_IN];
    for (int q = 0; q < nin; q++) {
        v.in_shape[q][0] = whole[q] == 1 ? lead : 1;
        int64_t per = 1;
        for (int i = p; i < r; i++) {
            v.in_shape[q][i - p + 1] = k->in_shape[q][i];
            per *= k->in_shape[q][i];
        }
        step[q] = whole[q] == 1 ? (size_t)per * isz[q] : 0;
    }
    dt__cpu_rows(x, fn, &v, n, nin, step, (size_t)(n / lead) * osz, in, out);
}

int64_t dt__cpu_column_chunk(const dt__kctx *x, int64_t work, int64_t rows, int64_t inner)
{
    int most = dt__cpu_parts(x, work, rows * inner);
    if (inner < 2 || rows >= most)
        return inner;
    int64_t want = (most + rows - 1) / rows, c = (inner + want - 1) / want;
    c = (c + DT__CPU_COLUMNS - 1) / DT__CPU_COLUMNS * DT__CPU_COLUMNS;
    return c < inner ? c : inner;
}

typedef struct {
    dt__cpu_loop fn;
    const dt__kargs *v; /* [1, per_row, inner] reduced over axis 1 */
    int64_t per_row, inner, chunk, nchunk;
    const unsigned char *in;
    unsigned char *out;
    size_t sz;
} columns_job;

/* Units [lo, hi): (row, chunk of columns), each the kernel on the chunk's columns of the row,
 * read with the row's stride between reduced elements (k->lda). */
static void columns_range(void *arg, int64_t lo, int64_t hi)
{
    const columns_job *j = arg;
    for (int64_t u = lo; u < hi; u++) {
        int64_t q = u / j->nchunk, j0 = u % j->nchunk * j->chunk;
        dt__kargs k = *j->v;
        k.shape[2] = k.in_shape[0][2] = j->inner - j0 < j->chunk ? j->inner - j0 : j->chunk;
        k.lda = k.shape[2] < j->inner ? j->inner : 0;
        const void *in[1] = {j->in + (size_t)((q * j->per_row) * j->inner + j0) * j->sz};
        j->fn(&k, in, j->out + (size_t)(q * j->inner + j0) * j->sz);
    }
}

/* Reductions over a contiguous run of axes: split over the kept leading rows, and when they
 * are fewer than the threads, over chunks of the kept columns after the run too; each output
 * still summed alone in input order. */
void dt__cpu_split_reduce(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                          const void *const in[], void *out, size_t sz)
{
    int64_t rows, per_row, inner;
    if (!row_view(k->rank, k->in_shape[0], k->mask, &rows, &per_row, &inner)) {
        fn(k, in, out);
        return;
    }
    /* v: x is [rows, per_row, inner] reduced over axis 1 (the same path of the kernel) */
    dt__kargs v = *k;
    v.rank = 3;
    v.mask = 2u;
    v.shape[0] = v.in_shape[0][0] = rows;
    v.shape[1] = 1;
    v.in_shape[0][1] = per_row;
    v.shape[2] = v.in_shape[0][2] = inner;
    int64_t work = rows * per_row * inner;
    int64_t chunk = dt__cpu_column_chunk(x, work, rows, inner);
    if (chunk < inner) {
        columns_job j = {fn,    &v,  per_row, inner, chunk, (inner + chunk - 1) / chunk,
                         in[0], out, sz};
        v.shape[0] = v.in_shape[0][0] = 1;
        int64_t units = rows * j.nchunk;
        dt__cpu_pool_run(x->pool, units, dt__cpu_parts(x, work, units), columns_range, &j);
        return;
    }
    size_t step[1] = {(size_t)(per_row * inner) * sz};
    dt__cpu_rows(x, fn, &v, work, 1, step, (size_t)inner * sz, in, out);
}

/* Softmax's steps (common/kernels.h) over rows: x [outer, n, inner], its maximum m and sum s
 * [outer, 1, inner] (s in the compute type, size cs). */
void dt__cpu_split_softmax(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                           const void *const in[], void *out, size_t ss, size_t cs)
{
    unsigned mode = DT__MODE_KIND(k->mode);
    dt__kargs v = *k;
    if (mode == DT__SOFTMAX_LSE) { /* elementwise over m and s */
        int64_t n = dt__num_elements(k->rank, k->shape);
        v.rank = 1;
        v.shape[0] = n;
        size_t step[2] = {ss, cs};
        dt__cpu_rows(x, fn, &v, n, 2, step, ss, in, out);
        return;
    }
    int64_t outer, n, inner;
    if (!row_view(k->rank, k->in_shape[0], k->mask, &outer, &n, &inner)) {
        fn(k, in, out);
        return;
    }
    v.rank = 3;
    v.mask = 2u;
    v.shape[0] = v.in_shape[0][0] = outer;
    v.in_shape[0][1] = n;
    v.in_shape[0][2] = inner;
    size_t step[3] = {(size_t)(n * inner) * ss, (size_t)inner * ss, (size_t)inner * cs};
    int nin = mode == DT__SOFTMAX_MAX ? 1 : mode == DT__SOFTMAX_SUMEXP ? 2 : 3;
    size_t ostep = mode == DT__SOFTMAX_MAX      ? (size_t)inner * ss
                   : mode == DT__SOFTMAX_SUMEXP ? (size_t)inner * cs
                                                : (size_t)(n * inner) * ss;
    dt__cpu_rows(x, fn, &v, outer * n * inner, nin, step, ostep, in, out);
}

/* Norms over the last axis: rows of x [rows, n], their statistics (compute type) one a row;
 * gamma and beta [n] repeated. */
void dt__cpu_split_norm(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                        const void *const in[], void *out, size_t ss, size_t cs)
{
    int r = k->rank;
    if (r < 1) {
        fn(k, in, out);
        return;
    }
    const int64_t *xs = k->in_shape[0];
    int64_t n = xs[r - 1], rows = 1;
    for (int i = 0; i + 1 < r; i++)
        rows *= xs[i];
    dt__kargs v = *k;
    v.rank = 2;
    v.shape[0] = v.in_shape[0][0] = rows;
    v.shape[1] = v.in_shape[0][1] = n;
    unsigned mode = DT__MODE_KIND(k->mode);
    bool stats = mode == DT__NORM_MEAN || mode == DT__NORM_VAR || mode == DT__NORM_MEAN_SQUARE;
    int nin = stats ? (mode == DT__NORM_VAR ? 2 : 1)
                    : (mode == DT__NORM_LAYER ? 3 : 2) + !!(k->mode & DT__NORM_GAMMA) +
                          !!(k->mode & DT__NORM_BETA);
    /* layer: x, mu, var, gamma, beta; rms: x, var, gamma, beta; statistics: x (and mu) */
    size_t step[5] = {(size_t)n * ss, cs, mode == DT__NORM_LAYER ? cs : 0, 0, 0};
    dt__cpu_rows(x, fn, &v, rows * n, nin, step, stats ? cs : (size_t)n * ss, in, out);
}

/* ---- gemm ------------------------------------------------------------------------------ */

typedef struct {
    dt__cpu_gemm_call call;
    dt__cpu_gemm_split s;
    size_t esz;
    bool ta, tb;
    int64_t batch, m, n, kk, lda, ldb;
    const unsigned char *A, *B; /* batch entry 0's op(A) and B */
    unsigned char *C;
    int64_t a_stride, b_stride; /* elements between batch entries; 0 repeats the operand */
} gemm_job;

/* Units [lo, hi) of the split: batch entries, or parts of the rows in every batch entry. */
static void gemm_range(void *arg, int64_t lo, int64_t hi)
{
    const gemm_job *j = arg;
    int64_t b0 = 0, b1 = j->batch, r0 = 0, r1 = j->m;
    if (j->s.axis == DT__CPU_GEMM_BATCH) {
        b0 = lo;
        b1 = hi;
    } else {
        r0 = dt__cpu_gemm_row_cut(&j->s, j->m, lo);
        r1 = dt__cpu_gemm_row_cut(&j->s, j->m, hi);
    }
    size_t e = j->esz;
    for (int64_t b = b0; b < b1; b++) {
        /* rows r0.. of op(A): stored columns when transposed */
        const unsigned char *a = j->A + (size_t)(b * j->a_stride + (j->ta ? r0 : r0 * j->lda)) * e;
        const unsigned char *bb = j->B + (size_t)(b * j->b_stride) * e;
        unsigned char *c = j->C + (size_t)(b * j->m * j->n + r0 * j->n) * e;
        j->call(j->ta, j->tb, r1 - r0, j->n, j->kk, a, j->lda, bb, j->ldb, c, j->n);
    }
}

void dt__cpu_gemm(const dt__kctx *x, const dt__kargs *k, dt__cpu_gemm_call call, size_t esz,
                  const void *A, const void *B, void *C)
{
    dt__cpu_gemm_as(x, k, call, esz, A, B, C,
                    dt__cpu_gemm_plan(x, esz, k->batch, k->m, k->n, k->k));
}

void dt__cpu_gemm_as(const dt__kctx *x, const dt__kargs *k, dt__cpu_gemm_call call, size_t esz,
                     const void *A, const void *B, void *C, dt__cpu_gemm_split s)
{
    int64_t m = k->m, n = k->n, kk = k->k;
    unsigned char *c = (unsigned char *)C + (size_t)k->c_at * esz;
    if (m == 0 || n == 0 || k->batch == 0)
        return;
    if (kk == 0) {
        memset(c, 0, (size_t)(k->batch * m * n) * esz);
        return;
    }
    gemm_job j = {.call = call,
                  .s = s,
                  .esz = esz,
                  .ta = k->ta,
                  .tb = k->tb,
                  .batch = k->batch,
                  .m = m,
                  .n = n,
                  .kk = kk,
                  .lda = k->lda  ? k->lda
                         : k->ta ? m
                                 : kk,
                  .ldb = k->tb ? kk : n,
                  .A = (const unsigned char *)A + (size_t)k->a_at * esz,
                  .B = B,
                  .C = c,
                  .a_stride = k->a_batch_stride,
                  .b_stride = k->b_batch_stride};
    dt__cpu_pool_run(x->pool, j.s.units, j.s.parts, gemm_range, &j);
}

/* ---- conversions ------------------------------------------------------------------------ */

typedef struct {
    dt__cpu_convert_fn fn;
    int64_t rows, cols, ld, entry_stride;
    const unsigned char *src;
    size_t ssz, dsz;
    unsigned char *dst;
} convert_job;

static void convert_range(void *arg, int64_t lo, int64_t hi)
{
    const convert_job *j = arg;
    for (int64_t u = lo; u < hi; u++)
        j->fn(j->src + (size_t)(u / j->rows * j->entry_stride + u % j->rows * j->ld) * j->ssz,
              j->dst + (size_t)(u * j->cols) * j->dsz, j->cols);
}

void dt__cpu_convert_rows(const dt__kctx *x, dt__cpu_convert_fn fn, int64_t entries, int64_t rows,
                          int64_t cols, const void *src, int64_t ld, int64_t entry_stride,
                          size_t ssz, void *dst, size_t dsz)
{
    int64_t units = entries * rows;
    if (units == 0 || cols == 0)
        return;
    convert_job j = {fn, rows, cols, ld, entry_stride, src, ssz, dsz, dst};
    dt__cpu_pool_run(x->pool, units, dt__cpu_parts(x, units * cols, units), convert_range, &j);
}
