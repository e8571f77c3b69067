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
 * rank-1 operand of extent m or 1. */
#include "dt.h"
#include "pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK = 4096, SMALL = 256 };

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
} fused_job;

/* Bytes of value j's block (of blk elements, in its dtype, a whole number of cache lines). */
static size_t value_bytes(const dt__fused *fz, int j, int64_t blk)
{
    return ((size_t)blk * dt_dtype_size(fz->ops[j].out) + 63) / 64 * 64;
}

static void fused_items(void *arg, int64_t lo, int64_t hi)
{
    fused_job *f = arg;
    const dt__fused *fz = f->fz;
    int nin = fz->nin, nops = fz->nops, nd = f->nd;
    int64_t row = f->row, blk = f->blk;
    /* each op's value block: this range's part of mem, or here */
    _Alignas(64) unsigned char small[DT__FUSED_MAX_OPS][SMALL * 8];
    unsigned char *buf[DT__FUSED_MAX_OPS];
    unsigned char *next =
        f->mem ? f->mem + (size_t)atomic_fetch_add(&f->ranges, 1) * f->part : NULL;
    for (int j = 0; j < nops; j++) {
        buf[j] = next ? next : small[j];
        next = next ? next + value_bytes(fz, j, blk) : NULL;
    }
    /* each op's arguments, made once: rank 1, the block's extent set per block */
    dt__kargs ka[DT__FUSED_MAX_OPS];
    dt__kernel_fn fn[DT__FUSED_MAX_OPS];
    int stored[DT__FUSED_MAX_OPS]; /* the result e an op's value is written to, or -1 */
    void *at[DT__FUSED_MAX_OPS];   /* where each op's value of the block lies */
    for (int j = 0; j < nops; j++)
        stored[j] = -1;
    for (int e = 0; e < fz->nstore; e++)
        stored[fz->store[e] - nin] = e;
    for (int j = 0; j < nops; j++) {
        const dt__fused_op *o = &fz->ops[j];
        at[j] = buf[j];
        memset(&ka[j], 0, sizeof ka[j]);
        ka[j].rank = 1;
        ka[j].op = o->op;
        ka[j].from = o->from;
        ka[j].a = o->a;
        fn[j] = dt__cpu_kernels[o->kernel][o->dtype];
        if (o->scalar) { /* a constant: one element, made once */
            ka[j].rank = 0;
            fn[j](f->x, &ka[j], NULL, buf[j]);
        }
    }
    size_t osz = dt_dtype_size(fz->ops[nops - 1].out);
    for (int64_t t = lo; t < hi; t++) {
        int64_t r = t / f->nblk, j0 = t % f->nblk * blk;
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
        int64_t m = row - j0 < blk ? row - j0 : blk;
        for (int j = 0; j < nops; j++) {
            const dt__fused_op *o = &fz->ops[j];
            if (o->scalar)
                continue;
            const void *ins[3] = {NULL, NULL, NULL};
            ka[j].shape[0] = m;
            for (int q = 0; q < o->nin; q++) {
                int v = o->arg[q];
                bool one;
                if (v < nin) {
                    one = nd == 0 || f->st[v][nd - 1] == 0;
                    ins[q] = base[v] + (one ? 0 : (size_t)j0 * f->isz[v]);
                } else {
                    one = fz->ops[v - nin].scalar;
                    ins[q] = at[v - nin];
                }
                ka[j].in_shape[q][0] = one ? 1 : m;
            }
            size_t e0 = (size_t)(r * row + j0);
            if (j == nops - 1)
                at[j] = (unsigned char *)f->out + e0 * osz;
            else if (stored[j] >= 0)
                at[j] = (unsigned char *)f->in[nin + stored[j]] + e0 * dt_dtype_size(o->out);
            fn[j](f->x, &ka[j], ins, at[j]);
        }
    }
}

dt_status dt__cpu_fused(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out)
{
    const dt__fused *fz = k->fused;
    int nin = fz->nin, nops = fz->nops, rank = k->rank;
    int64_t n = dt__num_elements(rank, k->shape);
    if (n <= 0)
        return DT_OK;
    /* merged axes: ext[d], and each operand's stride along them (0: broadcast) */
    int nd = 0;
    int64_t ext[DT_MAX_RANK], st[DT__FUSED_MAX_IN][DT_MAX_RANK];
    bool whole[DT__FUSED_MAX_IN][DT_MAX_RANK];
    for (int i = 0; i < rank; i++) {
        if (k->shape[i] == 1)
            continue;
        bool merge = nd > 0;
        for (int q = 0; q < nin; q++)
            merge = merge && (k->in_shape[q][i] != 1) == whole[q][nd - 1];
        if (merge) {
            ext[nd - 1] *= k->shape[i];
            continue;
        }
        ext[nd] = k->shape[i];
        for (int q = 0; q < nin; q++)
            whole[q][nd] = k->in_shape[q][i] != 1;
        nd++;
    }
    for (int q = 0; q < nin; q++) {
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
    /* the value blocks of each range (dt__cpu_pool_run runs `parts` ranges) */
    int64_t blk = row < BLOCK ? row : BLOCK, nblk = (row + blk - 1) / blk;
    int parts = dt__cpu_parts(x, n * nops, rows * nblk);
    size_t part = 0;
    for (int j = 0; j < nops; j++)
        part += value_bytes(fz, j, blk);
    unsigned char *mem = blk > SMALL ? aligned_alloc(64, part * (size_t)parts) : NULL;
    if (!mem && blk > SMALL) {
        blk = SMALL;
        nblk = (row + blk - 1) / blk;
        parts = dt__cpu_parts(x, n * nops, rows * nblk);
    }
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
                   .mem = mem,
                   .part = part};
    atomic_init(&f.ranges, 0);
    dt__cpu_pool_run(x->pool, rows * nblk, parts, fused_items, &f);
    free(mem);
    return DT_OK;
}
