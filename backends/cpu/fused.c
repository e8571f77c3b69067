/* The CPU's FUSED kernel (common/kernels.h): a chain of elementwise kernels computed one block
 * of the output at a time. Each op runs the very kernel it replaces (the table's, on a block of
 * up to BLOCK elements held in its result's dtype, the chain's blocks in L2), so every element
 * is computed exactly as the unfused chain computed it; only the intermediates' trips through
 * memory and the steps' dispatch are gone. The blocks are long so that an op's call costs
 * little beside its work (Adam's update, 19 ops: a quarter less time at 4096 elements than at
 * 256); each thread's blocks are one allocation per kernel call (on the stack at SMALL
 * elements when that fails). A value the chain also writes out (dt__fused.store) is computed
 * straight into its place in that result, where the ops after it read it.
 *
 * The output's axes are merged where every operand is either whole or broadcast on both (the
 * plan of the broadcasting kernels), and the output is walked by rows of the last merged axis:
 * along a row each operand steps by one element or repeats one, which the kernels take as a
 * rank-1 operand of extent m or 1.
 *
 * A chain that ends in a reduction (dt__fused.reduce) is walked in the same blocks, its last
 * value left in its block and added into a running value per output (in the REDUCE kernel's
 * compute type: f32 for the 16-bit floats) by the REDUCE kernel's step, then rounded and scaled
 * as it does: each output's inputs in input order, bitwise the unfused reduction. The output is
 * one more operand of the plan (broadcast along the reduced axes), so along a row each value
 * goes to one output or to consecutive ones. Threads split the outputs: rows of a reduction
 * over the last axes, or rows and ranges of columns of one over a run of axes followed by kept
 * ones; a full reduction to one element (and one over axes that are not one run) keeps one
 * ordered running value, on one thread. */
#include "dt.h"
#include "dtypes.h"
#include "index.h"
#include "pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 4096, SMALL = 256, ROWS = 8 };

/* The dtype operand q of op o is read in. */
static dt_dtype operand_dtype(const dt__fused_op *o, int q)
{
    if (o->kernel == DT__K_CAST)
        return o->from;
    if (o->kernel == DT__K_WHERE && q == 0)
        return DT_DTYPE_BOOL;
    return o->dtype;
}

/* The output in items of one block of one row; a range of items on one thread. */
typedef struct {
    const dt__kctx *x; /* without a pool: the ops' kernels run on the range's thread */
    const dt__fused *fz;
    const void *const *in;
    void *out;
    int nd;
    const int64_t *ext;
    const int64_t (*st)[DT_MAX_RANK];
    const size_t *isz;
    int64_t row, nblk, blk; /* row: elements of a row; nblk: blocks of a row of blk elements */
    unsigned char *mem;     /* per range `part` bytes of value blocks, or NULL (blk is SMALL) */
    size_t part;
    atomic_int ranges; /* ranges started: the index of a range's blocks in mem */
    /* a reduction: each output's stride along the merged axes (0: reduced), its running
     * values (acc, of the compute type), and the units: rows [outer, per_row, inner] of the
     * chain, `chunk` columns of inner a unit (unit u: row u / nchunk, chunk u % nchunk) */
    const int64_t *ost;
    void *acc;
    int64_t per_row, inner, chunk, nchunk;
} fused_job;

/* An op's state on one thread: its arguments, kernel, value block and where it lies. */
typedef struct {
    dt__kargs ka[DT__FUSED_MAX_OPS];
    dt__kernel_fn fn[DT__FUSED_MAX_OPS];
    int stored[DT__FUSED_MAX_OPS]; /* the result e an op's value is written to, or -1 */
    unsigned char *buf[DT__FUSED_MAX_OPS];
    void *at[DT__FUSED_MAX_OPS];
} chain_state;

/* Bytes of value j's block (of blk elements, in its dtype, a whole number of cache lines). */
static size_t value_bytes(const dt__fused *fz, int j, int64_t blk)
{
    return ((size_t)blk * dt_dtype_size(fz->ops[j].out) + 63) / 64 * 64;
}

/* The ops' arguments, made once (rank 1, the block's extent set per block), and their value
 * blocks (from `small` when the job has no memory); the constants computed. */
static void chain_init(fused_job *f, chain_state *c, unsigned char (*small)[SMALL * 8])
{
    const dt__fused *fz = f->fz;
    int nin = fz->nin, nops = fz->nops;
    unsigned char *next =
        f->mem ? f->mem + (size_t)atomic_fetch_add(&f->ranges, 1) * f->part : NULL;
    for (int j = 0; j < nops; j++) {
        c->buf[j] = next ? next : small[j];
        next = next ? next + value_bytes(fz, j, f->blk) : NULL;
        c->stored[j] = -1;
    }
    for (int e = 0; e < fz->nstore; e++)
        c->stored[fz->store[e] - nin] = e;
    for (int j = 0; j < nops; j++) {
        const dt__fused_op *o = &fz->ops[j];
        c->at[j] = c->buf[j];
        memset(&c->ka[j], 0, sizeof c->ka[j]);
        c->ka[j].rank = 1;
        c->ka[j].op = o->op;
        c->ka[j].from = o->from;
        c->ka[j].a = o->a;
        c->fn[j] = dt__cpu_kernels[o->kernel][o->dtype];
        if (o->scalar) { /* a constant: one element, made once */
            c->ka[j].rank = 0;
            c->fn[j](f->x, &c->ka[j], NULL, c->buf[j]);
        }
    }
}

/* The chain on elements j0 .. j0 + m - 1 of row r (m <= blk); the last value written to `last`
 * (NULL: left in its block). Returns where the last value lies. */
static const void *chain_block(const fused_job *f, chain_state *c, int64_t r, int64_t j0, int64_t m,
                               void *last)
{
    const dt__fused *fz = f->fz;
    int nin = fz->nin, nops = fz->nops, nd = f->nd;
    /* the row's index over the merged axes before the last */
    int64_t idx[DT_MAX_RANK] = {0}, rest = r;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = rest % f->ext[d];
        rest /= f->ext[d];
    }
    const unsigned char *base[DT__FUSED_MAX_IN];
    for (int q = 0; q < nin; q++) {
        int64_t off = 0;
        for (int d = 0; d + 1 < nd; d++)
            off += idx[d] * f->st[q][d];
        base[q] = (const unsigned char *)f->in[q] + (size_t)off * f->isz[q];
    }
    size_t e0 = (size_t)(r * f->row + j0);
    for (int j = 0; j < nops; j++) {
        const dt__fused_op *o = &fz->ops[j];
        if (o->scalar)
            continue;
        const void *ins[3] = {NULL, NULL, NULL};
        c->ka[j].shape[0] = m;
        for (int q = 0; q < o->nin; q++) {
            int v = o->arg[q];
            bool one;
            if (v < nin) {
                one = nd == 0 || f->st[v][nd - 1] == 0;
                ins[q] = base[v] + (one ? 0 : (size_t)j0 * f->isz[v]);
            } else {
                one = fz->ops[v - nin].scalar;
                ins[q] = c->at[v - nin];
            }
            c->ka[j].in_shape[q][0] = one ? 1 : m;
        }
        if (c->stored[j] >= 0)
            c->at[j] = (unsigned char *)f->in[nin + c->stored[j]] + e0 * dt_dtype_size(o->out);
        else if (j == nops - 1)
            c->at[j] = last ? last : c->buf[j];
        c->fn[j](f->x, &c->ka[j], ins, c->at[j]);
    }
    return c->at[nops - 1];
}

static void fused_items(void *arg, int64_t lo, int64_t hi)
{
    fused_job *f = arg;
    const dt__fused *fz = f->fz;
    int64_t blk = f->blk;
    _Alignas(64) unsigned char small[DT__FUSED_MAX_OPS][SMALL * 8];
    chain_state c;
    chain_init(f, &c, small);
    size_t osz = dt_dtype_size(fz->ops[fz->nops - 1].out);
    for (int64_t t = lo; t < hi; t++) {
        int64_t r = t / f->nblk, j0 = t % f->nblk * blk;
        int64_t m = f->row - j0 < blk ? f->row - j0 : blk;
        chain_block(f, &c, r, j0, m, (unsigned char *)f->out + (size_t)(r * f->row + j0) * osz);
    }
}

/* ---- chains ending in a reduction ---------------------------------------------------------- */

/* The REDUCE kernel's step and finish (backends/cpu/kernels_typed.h) for a float dtype NAME
 * (storage S, compute C): m values v added to one running value (one) or each to its own. */
#define REDUCE_STEP(op, a, v)                                                \
    ((op) == DT_REDUCE_MAX   ? ((v) > (a) || isnan((double)(v)) ? (v) : (a)) \
     : (op) == DT_REDUCE_MIN ? ((v) < (a) || isnan((double)(v)) ? (v) : (a)) \
                             : (a) + (v))
#define DEFINE_ACC(NAME, S, C)                                                                  \
    static void acc_##NAME(int op, const void *vals, int64_t m, void *running, bool one)        \
    {                                                                                           \
        const S *v = vals;                                                                      \
        C *acc = running;                                                                       \
        if (one) {                                                                              \
            C a = *acc;                                                                         \
            for (int64_t i = 0; i < m; i++)                                                     \
                a = REDUCE_STEP(op, a, LD_##NAME(v[i]));                                        \
            *acc = a;                                                                           \
        } else if (op == DT_REDUCE_SUM || op == DT_REDUCE_MEAN) {                               \
            for (int64_t i = 0; i < m; i++)                                                     \
                acc[i] = acc[i] + LD_##NAME(v[i]);                                              \
        } else {                                                                                \
            for (int64_t i = 0; i < m; i++)                                                     \
                acc[i] = REDUCE_STEP(op, acc[i], LD_##NAME(v[i]));                              \
        }                                                                                       \
    }                                                                                           \
    static void rows_##NAME(int op, const void *const vals[], int nb, int64_t m, void *running) \
    {                                                                                           \
        C *acc = running, a[ROWS];                                                              \
        for (int b = 0; b < nb; b++)                                                            \
            a[b] = acc[b];                                                                      \
        if (nb == ROWS && (op == DT_REDUCE_SUM || op == DT_REDUCE_MEAN))                        \
            for (int64_t i = 0; i < m; i++)                                                     \
                for (int b = 0; b < ROWS; b++)                                                  \
                    a[b] = a[b] + LD_##NAME(((const S *)vals[b])[i]);                           \
        else                                                                                    \
            for (int64_t i = 0; i < m; i++)                                                     \
                for (int b = 0; b < nb; b++)                                                    \
                    a[b] = REDUCE_STEP(op, a[b], LD_##NAME(((const S *)vals[b])[i]));           \
        for (int b = 0; b < nb; b++)                                                            \
            acc[b] = a[b];                                                                      \
    }                                                                                           \
    static void init_##NAME(int op, void *running, int64_t n)                                   \
    {                                                                                           \
        C *acc = running, v = op == DT_REDUCE_MAX   ? (C)-INFINITY                              \
                              : op == DT_REDUCE_MIN ? (C)INFINITY                               \
                                                    : (C)0;                                     \
        for (int64_t i = 0; i < n; i++)                                                         \
            acc[i] = v;                                                                         \
    }                                                                                           \
    static void finish_##NAME(double scale, const void *running, void *out, int64_t n)          \
    {                                                                                           \
        const C *acc = running;                                                                 \
        S *o = out;                                                                             \
        for (int64_t i = 0; i < n; i++)                                                         \
            o[i] = scale != 1.0 ? STD_##NAME((double)acc[i] * scale) : ST_##NAME(acc[i]);       \
    }
DEFINE_ACC(f32, float, float)
DEFINE_ACC(f64, double, double)
DEFINE_ACC(bf16, uint16_t, float)
DEFINE_ACC(f16, uint16_t, float)

typedef void (*acc_fn)(int op, const void *vals, int64_t m, void *running, bool one);
typedef void (*rows_fn)(int op, const void *const vals[], int nb, int64_t m, void *running);

/* The chain's elements e .. e + len - 1 (flat, in the chain's shape) added to their outputs'
 * running values, a block of a row at a time. */
static void reduce_range(const fused_job *f, chain_state *c, acc_fn add, size_t csz, int64_t e,
                         int64_t len)
{
    int nd = f->nd;
    while (len > 0) {
        int64_t r = e / f->row, j0 = e % f->row;
        int64_t m = f->row - j0 < f->blk ? f->row - j0 : f->blk;
        m = m < len ? m : len;
        const void *v = chain_block(f, c, r, j0, m, NULL);
        int64_t o = 0, rest = r;
        for (int d = nd - 2; d >= 0; d--) {
            o += rest % f->ext[d] * f->ost[d];
            rest /= f->ext[d];
        }
        bool one = nd == 0 || f->ost[nd - 1] == 0;
        o += one ? 0 : j0;
        add(f->fz->rop, v, m, (unsigned char *)f->acc + (size_t)o * csz, one);
        e += m;
        len -= m;
    }
}

typedef struct {
    fused_job *f;
    acc_fn add;
    rows_fn add_rows;
    size_t csz;
} reduce_job;

/* Rows q .. q + nb - 1 (nb <= ROWS) of a reduction over the last axes, advanced together a
 * block at a time (the REDUCE kernel's 8 rows: independent chains of additions, which the CPU
 * overlaps), each row still in input order; each row's block of values in bufs[b]. The rows
 * start on multiples of the merged row, so their blocks fall at the same places. */
static void reduce_rows(const fused_job *f, chain_state *c, const reduce_job *rj,
                        unsigned char *const bufs[], int64_t q, int nb)
{
    for (int64_t at = 0; at < f->per_row;) {
        int64_t m = f->row - at % f->row;
        m = m < f->blk ? m : f->blk;
        m = m < f->per_row - at ? m : f->per_row - at;
        const void *v[ROWS];
        for (int b = 0; b < nb; b++) {
            int64_t e = (q + b) * f->per_row + at;
            v[b] = chain_block(f, c, e / f->row, e % f->row, m, bufs[b]);
        }
        rj->add_rows(f->fz->rop, v, nb, m, (unsigned char *)f->acc + (size_t)q * rj->csz);
        at += m;
    }
}

/* Units [lo, hi): rows of [outer, per_row, inner] (inner 1), rows and column chunks, or (one
 * unit) the whole chain. */
static void reduce_items(void *arg, int64_t lo, int64_t hi)
{
    const reduce_job *rj = arg;
    fused_job *f = rj->f;
    _Alignas(64) unsigned char small[DT__FUSED_MAX_OPS][SMALL * 8];
    chain_state c;
    chain_init(f, &c, small);
    size_t vb = value_bytes(f->fz, f->fz->nops - 1, f->blk);
    unsigned char *rows = f->inner == 1 && hi - lo > 1 ? aligned_alloc(64, ROWS * vb) : NULL;
    if (rows) {
        unsigned char *bufs[ROWS];
        for (int b = 0; b < ROWS; b++)
            bufs[b] = rows + (size_t)b * vb;
        for (int64_t q = lo; q < hi; q += ROWS)
            reduce_rows(f, &c, rj, bufs, q, hi - q < ROWS ? (int)(hi - q) : ROWS);
        free(rows);
        return;
    }
    for (int64_t u = lo; u < hi; u++) {
        int64_t q = u / f->nchunk, j0 = u % f->nchunk * f->chunk;
        int64_t m = f->inner - j0 < f->chunk ? f->inner - j0 : f->chunk;
        if (f->inner == 1) /* one row: its elements in one range */
            reduce_range(f, &c, rj->add, rj->csz, q * f->per_row, f->per_row);
        else
            for (int64_t p = 0; p < f->per_row; p++)
                reduce_range(f, &c, rj->add, rj->csz, (q * f->per_row + p) * f->inner + j0, m);
    }
}

/* A chain ending in a reduction (the job planned over the chain's shape, the output its last
 * operand plan ost): the units and their split, the running values, the outputs written. */
static dt_status fused_reduce(const dt__kctx *x, const dt__kargs *k, fused_job *f, int64_t n,
                              void *out)
{
    const dt__fused *fz = f->fz;
    int rop = fz->rop;
    int64_t no = 1;
    for (int i = 0; i < k->rank; i++)
        no *= k->mask & (1u << i) ? 1 : k->shape[i];
    acc_fn add;
    rows_fn add_rows;
    void (*init)(int, void *, int64_t);
    void (*finish)(double, const void *, void *, int64_t);
    size_t csz = sizeof(float);
    switch (fz->ops[fz->nops - 1].out) {
    case DT_DTYPE_F32:
        add = acc_f32, add_rows = rows_f32, init = init_f32, finish = finish_f32;
        break;
    case DT_DTYPE_F64:
        add = acc_f64, add_rows = rows_f64, init = init_f64, finish = finish_f64;
        csz = sizeof(double);
        break;
    case DT_DTYPE_BF16:
        add = acc_bf16, add_rows = rows_bf16, init = init_bf16, finish = finish_bf16;
        break;
    case DT_DTYPE_F16:
        add = acc_f16, add_rows = rows_f16, init = init_f16, finish = finish_f16;
        break;
    default:
        return dt__fail(DT_ERR_UNSUPPORTED, "fused reduction of %s",
                        dt_dtype_name(fz->ops[fz->nops - 1].out));
    }
    f->acc = malloc(csz * (size_t)no);
    if (!f->acc)
        return dt__fail(DT_ERR_NOMEM, "fused reduction: %lld running values", (long long)no);
    init(rop, f->acc, no);
    if (n <= 0) { /* an empty shard: the outputs are the reduction's identity, as REDUCE's */
        finish(k->a, f->acc, out, no);
        free(f->acc);
        return DT_OK;
    }
    /* units: rows around a contiguous run of reduced axes (whole rows when the run is last,
     * else rows and chunks of the kept columns after it), or one */
    int64_t outer;
    if (!row_view(k->rank, k->shape, k->mask, &outer, &f->per_row, &f->inner)) {
        outer = 1;
        f->per_row = n;
        f->inner = 1;
    }
    int64_t work = n * (fz->nops + 1);
    f->chunk = dt__cpu_column_chunk(x, work, outer, f->inner);
    f->nchunk = (f->inner + f->chunk - 1) / f->chunk;
    int64_t units = outer * f->nchunk;
    int parts = dt__cpu_parts(x, work, units);
    if (f->blk > SMALL) {
        f->mem = aligned_alloc(64, f->part * (size_t)parts);
        if (!f->mem) { /* the small blocks */
            f->blk = SMALL;
            f->part = 0;
        }
    }
    reduce_job rj = {f, add, add_rows, csz};
    dt__cpu_pool_run(x->pool, units, parts, reduce_items, &rj);
    finish(k->a, f->acc, out, no);
    free(f->mem);
    free(f->acc);
    return DT_OK;
}

dt_status dt__cpu_fused(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    const dt__fused *fz = k->fused;
    int nin = fz->nin, nops = fz->nops, rank = k->rank;
    int64_t n = dt__num_elements(rank, k->shape);
    if (n <= 0 && fz->reduce)
        return fused_reduce(x, k, &(fused_job){.fz = fz}, 0, out);
    if (n <= 0)
        return DT_OK;
    /* merged axes: ext[d], and each operand's stride along them (0: broadcast); a reduction's
     * output is one more operand (ost), broadcast along the reduced axes */
    int nd = 0, nplan = nin + fz->reduce;
    int64_t ext[DT_MAX_RANK], st[DT__FUSED_MAX_IN + 1][DT_MAX_RANK];
    bool whole[DT__FUSED_MAX_IN + 1][DT_MAX_RANK];
    int64_t oshape[DT_MAX_RANK];
    const int64_t *shp[DT__FUSED_MAX_IN + 1];
    for (int i = 0; i < rank; i++)
        oshape[i] = k->mask & (1u << i) ? 1 : k->shape[i];
    for (int q = 0; q < nplan; q++)
        shp[q] = q < nin ? k->in_shape[q] : oshape;
    for (int i = 0; i < rank; i++) {
        if (k->shape[i] == 1)
            continue;
        bool merge = nd > 0;
        for (int q = 0; q < nplan; q++)
            merge = merge && (shp[q][i] != 1) == whole[q][nd - 1];
        if (merge) {
            ext[nd - 1] *= k->shape[i];
            continue;
        }
        ext[nd] = k->shape[i];
        for (int q = 0; q < nplan; q++)
            whole[q][nd] = shp[q][i] != 1;
        nd++;
    }
    for (int q = 0; q < nplan; q++) {
        int64_t s = 1;
        for (int d = nd - 1; d >= 0; d--) {
            st[q][d] = whole[q][d] ? s : 0;
            s *= whole[q][d] ? ext[d] : 1;
        }
    }
    int64_t row = nd ? ext[nd - 1] : 1, rows = n / row;
    /* each operand's element size (from any op reading it) */
    size_t isz[DT__FUSED_MAX_IN] = {0};
    for (int j = 0; j < nops; j++)
        for (int q = 0; q < fz->ops[j].nin; q++)
            if (fz->ops[j].arg[q] < nin)
                isz[fz->ops[j].arg[q]] = dt_dtype_size(operand_dtype(&fz->ops[j], q));
    dt__kctx one = *x;
    one.pool = NULL;
    int64_t blk = row < BLOCK ? row : BLOCK, nblk = (row + blk - 1) / blk;
    size_t part = 0;
    for (int j = 0; j < nops; j++)
        part += value_bytes(fz, j, blk);
    fused_job f = {.x = &one,
                   .fz = fz,
                   .in = in,
                   .out = out,
                   .nd = nd,
                   .ext = ext,
                   .st = (const int64_t(*)[DT_MAX_RANK])st,
                   .isz = isz,
                   .row = row,
                   .nblk = nblk,
                   .blk = blk,
                   .part = part,
                   .ost = st[nin]};
    atomic_init(&f.ranges, 0);
    if (fz->reduce)
        return fused_reduce(x, k, &f, n, out);
    /* the value blocks of each range (dt__cpu_pool_run runs `parts` ranges) */
    int parts = dt__cpu_parts(x, n * nops, rows * nblk);
    unsigned char *mem = blk > SMALL ? aligned_alloc(64, part * (size_t)parts) : NULL;
    if (!mem && blk > SMALL) {
        f.blk = blk = SMALL;
        f.nblk = nblk = (row + blk - 1) / blk;
        parts = dt__cpu_parts(x, n * nops, rows * nblk);
    }
    f.mem = mem;
    dt__cpu_pool_run(x->pool, rows * nblk, parts, fused_items, &f);
    free(mem);
    return DT_OK;
}
