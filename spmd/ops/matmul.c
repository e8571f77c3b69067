/* matmul: C[..., m, n] = A[..., m, k] B[..., k, n], with transposes and leading batch axes.
 *
 * An expansion assigns a mesh axis (or none) to each batch axis, m, n and k, all distinct:
 *   A' = (batch, m, k), B' = (batch, k, n) as assigned; C' = (batch, m, n), partial over k's
 *   mesh axis when k is sharded (the local GEMM of k-shards gives pending sums).
 * Operands are relayouted to A', B' (a sharded contracting axis in one operand only is a local
 * slice of the other; conflicts relayout one operand), the local GEMM runs, and C' goes to the
 * requested layout: all-reduce for replicated, reduce-scatter for sharded, nothing for partial.
 * Candidates for each axis are the mesh axes the operands or the request put there, and none;
 * the cheapest expansion by the alpha-beta model (communication + GEMM time) wins.
 *
 * A reduce-scatter into rows (k and the result's rows on one mesh axis of P devices) is
 * chunked, so that its peak extra memory is the output plus one temporary no larger than the
 * smallest output block: see "chunked reduce-scatter" below. */
#include "../engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SLOTS = DT_MAX_RANK + 1 };

/* Where the matrix axes sit in a and b. */
typedef struct mm_shape {
    int nb;     /* batch axes */
    bool b_bat; /* b has the batch axes too (else it is shared by every batch) */
    int am, ak, bk, bn;
} mm_shape;

static mm_shape shape_of(const dt__attrs *at, int ra, int rb)
{
    mm_shape s;
    s.nb = ra - 2;
    s.b_bat = rb == ra && rb > 2;
    s.am = at->ta ? ra - 1 : ra - 2;
    s.ak = at->ta ? ra - 2 : ra - 1;
    s.bk = at->tb ? rb - 1 : rb - 2;
    s.bn = at->tb ? rb - 2 : rb - 1;
    return s;
}

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    const dt__val *a = in[0], *b = in[1];
    char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
    dt__shape_str(sa, sizeof sa, a->rank, a->shape);
    dt__shape_str(sb, sizeof sb, b->rank, b->shape);
    if (a->dtype != b->dtype)
        return dt__fail(DT_ERR_DTYPE, "matmul: a is %s, b is %s (cast one first)",
                        dt_dtype_name(a->dtype), dt_dtype_name(b->dtype));
    DT_TRY(dt__dtype_check("matmul", a->dtype, DT__NUMERIC));
    if (a->rank < 2 || b->rank < 2 || !(b->rank == a->rank || b->rank == 2))
        return dt__fail(DT_ERR_SHAPE,
                        "matmul: a is %s, b is %s: both need rank >= 2, and b the rank of a or 2",
                        sa, sb);
    mm_shape s = shape_of(&n->attrs, a->rank, b->rank);
    for (int i = 0; s.b_bat && i < s.nb; i++)
        if (a->shape[i] != b->shape[i])
            return dt__fail(DT_ERR_SHAPE, "matmul: a is %s, b is %s: batch axis %d differs", sa, sb,
                            i);
    if (a->shape[s.ak] != b->shape[s.bk])
        return dt__fail(
            DT_ERR_SHAPE, "matmul: a is %s%s, b is %s%s: contracting extents %lld and %lld differ",
            sa, n->attrs.ta ? " (transposed)" : "", sb, n->attrs.tb ? " (transposed)" : "",
            (long long)a->shape[s.ak], (long long)b->shape[s.bk]);
    out->dtype = a->dtype;
    out->rank = a->rank;
    for (int i = 0; i < s.nb; i++)
        out->shape[i] = a->shape[i];
    out->shape[s.nb] = a->shape[s.am];
    out->shape[s.nb + 1] = b->shape[s.bn];
    return DT_OK;
}

/* One candidate expansion: slots 0..nb-1 batch, nb = m, nb+1 = n, nb+2 = k. */
typedef struct mm_plan {
    int axis[MAX_SLOTS + 2];
    dt_layout a, b, c, final;
    double cost;
} mm_plan;

/* ---- chunked reduce-scatter ---------------------------------------------------------------
 *
 * C[M,N] = A[M,k] B[k,N] with k sharded on mesh axis x (P devices) and C wanted with its rows
 * on x: the plain form writes the partial C of all M rows on every device, then reduce-scatters
 * it into the output's block of about M/P rows, holding P times the output as a temporary.
 * The chunked form makes chunks of at most q = floor(M/P) rows (the smallest block; 1 when
 * M < P): chunk i takes rows[i][p] rows of each block p, contiguous and in order, so that
 *   temporary (cap rows, N/.. columns) = [block 0's rows of chunk i; block 1's; ...]
 * is exactly the reduce-scatter's send buffer (member blocks in rank order): one gemm per
 * block writes its rows of A's product into its place, and the reduce-scatter writes member
 * p's rows straight into its output at row at[i][p]. Each device then holds its output and
 * one temporary of at most q rows: at most twice its output, uneven shards included. The
 * rows each chunk takes from each block are dealt one at a time to the block with the most
 * rows left (the lowest block first on ties), so every chunk but the last has q rows and the
 * chunks number ceil(M/q): P when P divides M, P+1 or more otherwise. The same bytes cross
 * as in one reduce-scatter, in ceil(M/q) collectives; each output element is the same sum,
 * member by member, as before (its gemm row is computed alone rather than with the others). */
typedef struct rs_chunks {
    int g;         /* group size P */
    int n;         /* chunks */
    int64_t cap;   /* rows of the temporary: the largest chunk */
    int64_t *rows; /* rows[i * g + p]: rows of block p in chunk i */
    int64_t *at;   /* at[i * g + p]: their first row inside block p */
} rs_chunks;

/* Chunks of M >= 2 rows over g >= 2 blocks. */
static dt_status chunks_plan(int64_t M, int g, rs_chunks *c)
{
    memset(c, 0, sizeof *c);
    int64_t q = M / g;
    c->g = g;
    c->cap = q > 0 ? q : 1;
    c->n = (int)((M + c->cap - 1) / c->cap);
    c->rows = calloc((size_t)c->n * (size_t)g, sizeof *c->rows);
    c->at = calloc((size_t)c->n * (size_t)g, sizeof *c->at);
    int64_t *left = calloc((size_t)g, sizeof *left);
    if (!c->rows || !c->at || !left) {
        int n = c->n;
        free(c->rows);
        free(c->at);
        free(left);
        memset(c, 0, sizeof *c);
        return dt__fail(DT_ERR_NOMEM, "matmul: out of memory for %d chunks", n);
    }
    int64_t total = M;
    for (int p = 0; p < g; p++)
        left[p] = dt_shard_size(M, g, p);
    for (int i = 0; i < c->n; i++) {
        int64_t *rows = c->rows + (size_t)i * g, *at = c->at + (size_t)i * g;
        for (int p = 0; p < g; p++)
            at[p] = dt_shard_size(M, g, p) - left[p];
        int64_t take = total < c->cap ? total : c->cap;
        total -= take;
        /* rows left differ by at most one between blocks: those with the most give one row
         * each first (lowest block first), then every block a row a round, then the rest
         * from the lowest blocks */
        int64_t hi = 0;
        for (int p = 0; p < g; p++)
            hi = left[p] > hi ? left[p] : hi;
        for (int p = 0; p < g && take > 0; p++)
            if (left[p] == hi) {
                rows[p]++;
                left[p]--;
                take--;
            }
        int64_t rounds = take / g;
        for (int p = 0; p < g; p++) {
            rows[p] += rounds;
            left[p] -= rounds;
        }
        take -= rounds * g;
        for (int p = 0; p < g && take > 0; p++, take--) {
            rows[p]++;
            left[p]--;
        }
    }
    free(left);
    return DT_OK;
}

static void chunks_free(rs_chunks *c)
{
    free(c->rows);
    free(c->at);
    memset(c, 0, sizeof *c);
}

typedef struct search {
    const dt__dist *a, *b;
    const dt_layout *want;
    mm_shape s;
    int64_t K;
    int cand[MAX_SLOTS + 2][4];
    int ncand[MAX_SLOTS + 2];
    int nslots;
    mm_plan cur, best;
    bool found;
} search;

static void layouts_of(search *S, mm_plan *p)
{
    const dt_mesh *m = S->a->layout.mesh;
    mm_shape s = S->s;
    int kx = p->axis[s.nb + 2];
    p->a = dt__layout_none(m, S->a->rank);
    p->b = dt__layout_none(m, S->b->rank);
    p->c = dt__layout_none(m, S->a->rank);
    for (int i = 0; i < s.nb; i++) {
        p->a.axes[i] = p->c.axes[i] = p->axis[i];
        if (s.b_bat)
            p->b.axes[i] = p->axis[i];
    }
    p->a.axes[s.am] = p->c.axes[s.nb] = p->axis[s.nb];
    p->b.axes[s.bn] = p->c.axes[s.nb + 1] = p->axis[s.nb + 1];
    p->a.axes[s.ak] = p->b.axes[s.bk] = kx;
    if (kx != DT_UNSHARDED)
        p->c.partial = 1u << kx;
    p->final = dt__search_final(S->want, &p->c);
}

/* The group size P of a plan whose partial C goes to its rows on k's mesh axis by one
 * reduce-scatter and nothing else, with no batch to interleave (the chunked form); 0 when
 * the plan is not of that form. */
static int chunked_group(const dt__dist *a, const dt__dist *b, mm_shape s, const mm_plan *p)
{
    int kx = p->axis[s.nb + 2];
    if (kx == DT_UNSHARDED || p->c.axes[s.nb] != DT_UNSHARDED || p->c.partial != 1u << kx ||
        p->c.partial_op != DT_REDUCE_SUM)
        return 0;
    dt_layout want = p->c;
    want.partial = 0;
    want.axes[s.nb] = kx;
    if (!dt_layout_equal(&p->final, &want))
        return 0;
    for (int i = 0; i < s.nb; i++)
        if (a->shape[i] != 1)
            return 0;
    int g = a->layout.mesh->sizes[kx];
    return g > 1 && a->shape[s.am] >= 2 && b->shape[s.bn] > 0 ? g : 0;
}

static double gemm_time(const search *S, const mm_plan *p)
{
    /* The busiest device: the first shard of every axis. */
    double mults = 1;
    const int64_t *cs = S->a->shape;
    mm_shape s = S->s;
    for (int i = 0; i < s.nb; i++)
        mults *= (double)dt_shard_size(cs[i], dt_layout_num_shards(&p->c, i), 0);
    mults *= (double)dt_shard_size(S->a->shape[s.am], dt_layout_num_shards(&p->a, s.am), 0);
    mults *= (double)dt_shard_size(S->b->shape[s.bn], dt_layout_num_shards(&p->b, s.bn), 0);
    mults *= (double)dt_shard_size(S->K, dt_layout_num_shards(&p->a, s.ak), 0);
    return DT__GAMMA * mults;
}

static void evaluate(search *S)
{
    mm_plan *p = &S->cur;
    layouts_of(S, p);
    int64_t cshape[DT_MAX_RANK];
    for (int i = 0; i < S->s.nb; i++)
        cshape[i] = S->a->shape[i];
    cshape[S->s.nb] = S->a->shape[S->s.am];
    cshape[S->s.nb + 1] = S->b->shape[S->s.bn];
    p->cost = dt__relayout_cost(&S->a->layout, &p->a, S->a->dtype, S->a->rank, S->a->shape) +
              dt__relayout_cost(&S->b->layout, &p->b, S->b->dtype, S->b->rank, S->b->shape) +
              dt__relayout_cost(&p->c, &p->final, S->a->dtype, S->a->rank, cshape) +
              gemm_time(S, p);
    int g = chunked_group(S->a, S->b, S->s, p);
    if (g) {
        /* chunked: the same bytes and multiplies, in more reduce-scatters of g - 1 messages */
        int64_t M = S->a->shape[S->s.am], cap = M / g > 0 ? M / g : 1;
        p->cost += (double)((M + cap - 1) / cap - 1) * (g - 1) * DT__ALPHA;
    }
    if (!isfinite(p->cost))
        return;
    if (!S->found || p->cost < S->best.cost) {
        S->best = *p;
        S->found = true;
    }
}

static void enumerate(search *S, int slot, unsigned used)
{
    if (slot == S->nslots) {
        evaluate(S);
        return;
    }
    for (int c = 0; c < S->ncand[slot]; c++) {
        int ax = S->cand[slot][c];
        if (ax != DT_UNSHARDED && (used & (1u << ax)))
            continue;
        S->cur.axis[slot] = ax;
        enumerate(S, slot + 1, ax == DT_UNSHARDED ? used : used | (1u << ax));
    }
}

static void add_cand(search *S, int slot, int ax)
{
    for (int c = 0; c < S->ncand[slot]; c++)
        if (S->cand[slot][c] == ax)
            return;
    S->cand[slot][S->ncand[slot]++] = ax;
}

typedef struct gemm_ctx {
    const dt__dist *a, *b, *c;
    mm_shape s;
    bool ta, tb;
} gemm_ctx;

static void gemm_args(void *ctx, int d, dt__kargs *k)
{
    gemm_ctx *g = ctx;
    int64_t al[DT_MAX_RANK], bl[DT_MAX_RANK];
    dt__local_shape(g->a, d, al, NULL);
    dt__local_shape(g->b, d, bl, NULL);
    dt__kargs_out(k, g->c, d);
    /* a_local: (batch/.., m/.., k/..), b_local: (batch?, k/.., n/..) as assigned */
    k->batch = 1;
    for (int i = 0; i < g->s.nb; i++)
        k->batch *= al[i];
    k->m = al[g->s.am];
    k->k = al[g->s.ak];
    k->n = bl[g->s.bn];
    k->ta = g->ta;
    k->tb = g->tb;
    k->a_batch_stride = k->m * k->k;
    k->b_batch_stride = g->s.b_bat ? k->k * k->n : 0;
}

/* The chunked form's steps (see "chunked reduce-scatter"). */
typedef struct chunk_ctx {
    gemm_ctx gemm;
    const dt__dist *out;
    const rs_chunks *ch;
    unsigned axes; /* k's mesh axis */
    int64_t M;
    int i, p;       /* chunk, (first) block */
    int nblocks;    /* blocks in one gemm step: 1, or all of them when they are alike */
    int64_t stride; /* rows between the blocks' first rows (nblocks > 1) */
} chunk_ctx;

static int64_t local_cols(const chunk_ctx *c, int d)
{
    int64_t cl[DT_MAX_RANK];
    dt__local_shape(c->gemm.c, d, cl, NULL);
    return cl[c->gemm.s.nb + 1];
}

static void chunk_gemm_args(void *ctx, int d, dt__kargs *k)
{
    chunk_ctx *c = ctx;
    gemm_args(&c->gemm, d, k);
    const int64_t *rows = c->ch->rows + (size_t)c->i * c->ch->g;
    int64_t r0 = dt_shard_offset(c->M, c->ch->g, c->p) + c->ch->at[(size_t)c->i * c->ch->g + c->p];
    int64_t before = 0;
    for (int q = 0; q < c->p; q++)
        before += rows[q];
    /* a_local: (M, k/..) or, transposed, (k/.., M): rows r0.. of op(A) are rows or columns */
    int64_t kl = k->k, n = k->n;
    k->lda = c->gemm.ta ? k->m : kl;
    k->a_at = c->gemm.ta ? r0 : r0 * kl;
    k->m = rows[c->p];
    k->c_at = before * n;
    k->shape[c->gemm.s.nb] = k->m * c->nblocks;
    if (c->nblocks > 1) {
        /* the blocks as a batch of one shared B: block q's rows at r0 + q * stride of op(A),
         * its product right after block q - 1's in the temporary (c's batch stride m * n) */
        k->batch = c->nblocks;
        k->a_batch_stride = c->gemm.ta ? c->stride : c->stride * kl;
        k->b_batch_stride = 0;
    }
}

static void chunk_rs_counts(void *ctx, int d, int64_t counts[])
{
    chunk_ctx *c = ctx;
    int64_t n = local_cols(c, d);
    for (int q = 0; q < c->ch->g; q++)
        counts[q] = c->ch->rows[(size_t)c->i * c->ch->g + q] * n;
}

static void chunk_rs_at(void *ctx, int d, int64_t at[])
{
    chunk_ctx *c = ctx;
    int r = dt__group_rank(c->out->layout.mesh, c->axes, d);
    at[0] = 0;
    at[1] = c->ch->at[(size_t)c->i * c->ch->g + r] * local_cols(c, d);
}

/* Steps: per chunk, one gemm per block with rows in it, then a reduce-scatter into the rows of
 * every member's output. */
static dt_status emit_chunked(dt__program *p, const gemm_ctx *g, const mm_plan *best,
                              const rs_chunks *ch, int64_t M, dt__dist *out)
{
    const dt__dist *c = g->c;
    const dt_mesh *m = c->layout.mesh;
    int kx = best->axis[g->s.nb + 2];
    chunk_ctx cc = {.gemm = *g, .out = out, .ch = ch, .axes = 1u << kx, .M = M};
    DT_TRY(dt__slot_new(p, &best->final, c->dtype, c->rank, c->shape, out));
    /* tmp_local: (cap, n/..): the rows of one chunk, member blocks in rank order */
    int64_t *elems = calloc((size_t)m->num_local + 1, sizeof *elems);
    if (!elems)
        return dt__fail(DT_ERR_NOMEM, "matmul: out of memory");
    int64_t nmax = 0;
    for (int d = 0; d < m->size; d++) {
        int64_t n = local_cols(&cc, d);
        nmax = n > nmax ? n : nmax;
        if (d >= m->first_local && d < m->first_local + m->num_local)
            elems[d - m->first_local] = ch->cap * n;
    }
    int tmp;
    dt_status st = dt__slot_new_elems(p, m, c->dtype, elems, &tmp);
    free(elems);
    DT_TRY(st);
    double es = (double)dt_dtype_size(c->dtype);
    int ins[2] = {g->a->slot, g->b->slot};
    for (int i = 0; i < ch->n; i++) {
        cc.i = i;
        const int64_t *rows = ch->rows + (size_t)i * ch->g;
        int64_t total = 0;
        /* blocks of as many rows at a constant stride are one gemm step of a batch (fewer
         * steps, each a point where every device waits for the slowest) */
        const int64_t *at = ch->at + (size_t)i * ch->g;
        bool alike = true;
        for (int q = 1; q < ch->g; q++)
            alike = alike && rows[q] == rows[0] &&
                    dt_shard_offset(M, ch->g, q) + at[q] - dt_shard_offset(M, ch->g, q - 1) -
                            at[q - 1] ==
                        dt_shard_offset(M, ch->g, 1) + at[1] - at[0];
        cc.nblocks = alike ? ch->g : 1;
        cc.stride = dt_shard_offset(M, ch->g, 1) + at[1] - at[0];
        for (int q = 0; q < ch->g; q++)
            total += rows[q];
        for (int q = 0; q < ch->g; q += cc.nblocks) {
            if (!rows[q])
                continue;
            cc.p = q;
            DT_TRY(dt__emit_kernel(p, "matmul", DT__K_GEMM, c->dtype, 2, ins, tmp, m,
                                   chunk_gemm_args, &cc));
            dt__step *sp = &p->steps[p->nsteps - 1];
            int64_t r0 = dt_shard_offset(M, ch->g, q) + at[q];
            size_t len = strlen(sp->text);
            if (cc.nblocks > 1)
                snprintf(sp->text + len, sizeof sp->text - len,
                         "; chunk %d of %d: rows %lld..%lld of C and the same rows every %lld "
                         "after (one block per member)",
                         i + 1, ch->n, (long long)r0, (long long)(r0 + rows[q] - 1),
                         (long long)cc.stride);
            else
                snprintf(sp->text + len, sizeof sp->text - len,
                         "; chunk %d of %d: rows %lld..%lld of C (member %d's block)", i + 1, ch->n,
                         (long long)r0, (long long)(r0 + rows[q] - 1), q);
        }
        /* even when every member takes as many elements, on every device */
        bool even = true;
        int64_t count = -1;
        int64_t *cnt = calloc((size_t)ch->g, sizeof *cnt);
        if (!cnt)
            return dt__fail(DT_ERR_NOMEM, "matmul: out of memory");
        for (int d = 0; d < m->size && even; d++) {
            chunk_rs_counts(&cc, d, cnt);
            for (int q = 0; q < ch->g && even; q++) {
                count = count < 0 ? cnt[q] : count;
                even = cnt[q] == count;
            }
        }
        free(cnt);
        char what[128];
        snprintf(what, sizeof what, "chunk %d of %d, local [%lld,%lld] -> rows of each block",
                 i + 1, ch->n, (long long)total, (long long)nmax);
        double sent = (double)(ch->g - 1) / ch->g * (double)total * (double)nmax * es;
        DT_TRY(dt__emit_coll(p, "matmul", DT__COLL_REDUCE_SCATTER, c->dtype, DT_REDUCE_SUM, cc.axes,
                             tmp, out->slot, even ? count : 0, even ? NULL : chunk_rs_counts, &cc,
                             ch->g, sent, what));
        DT_TRY(dt__coll_at(p, chunk_rs_at, &cc));
    }
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    const dt__dist *a = &in[0], *b = &in[1];
    search S;
    memset(&S, 0, sizeof S);
    S.a = a;
    S.b = b;
    S.want = want;
    S.s = shape_of(&n->attrs, a->rank, b->rank);
    S.K = a->shape[S.s.ak];
    mm_shape s = S.s;
    S.nslots = s.nb + 3;
    /* candidates: what the operands and the request already use, then none */
    for (int i = 0; i < s.nb; i++) {
        add_cand(&S, i, a->layout.axes[i]);
        if (s.b_bat)
            add_cand(&S, i, b->layout.axes[i]);
        if (want)
            add_cand(&S, i, want->axes[i]);
    }
    add_cand(&S, s.nb, a->layout.axes[s.am]);
    add_cand(&S, s.nb + 1, b->layout.axes[s.bn]);
    if (want) {
        add_cand(&S, s.nb, want->axes[s.nb]);
        add_cand(&S, s.nb + 1, want->axes[s.nb + 1]);
    }
    add_cand(&S, s.nb + 2, a->layout.axes[s.ak]);
    add_cand(&S, s.nb + 2, b->layout.axes[s.bk]);
    for (int i = 0; i < S.nslots; i++)
        add_cand(&S, i, DT_UNSHARDED);
    enumerate(&S, 0, 0);
    if (!S.found) {
        char la[DT_STRING_MAX], lb[DT_STRING_MAX];
        return dt__fail(DT_ERR_LAYOUT, "matmul: no expansion for a \"%s\", b \"%s\"",
                        dt__layout_str(&a->layout, la, sizeof la),
                        dt__layout_str(&b->layout, lb, sizeof lb));
    }
    const mm_plan *best = &S.best;
    dt__dist a2, b2, c;
    DT_TRY(dt__relayout_emit(p, "matmul", a, &best->a, &a2));
    DT_TRY(dt__relayout_emit(p, "matmul", b, &best->b, &b2));
    int64_t cshape[DT_MAX_RANK];
    for (int i = 0; i < s.nb; i++)
        cshape[i] = a->shape[i];
    cshape[s.nb] = a->shape[s.am];
    cshape[s.nb + 1] = b->shape[s.bn];
    gemm_ctx g = {.a = &a2, .b = &b2, .c = &c, .s = s, .ta = n->attrs.ta, .tb = n->attrs.tb};
    int group = chunked_group(a, b, s, best);
    if (group) {
        /* c describes the partial C, never held whole: no slot */
        c = (dt__dist){.slot = -1, .dtype = a->dtype, .rank = a->rank, .layout = best->c};
        memcpy(c.shape, cshape, sizeof cshape[0] * (size_t)a->rank);
        rs_chunks ch;
        DT_TRY(chunks_plan(a->shape[s.am], group, &ch));
        dt_status st = emit_chunked(p, &g, best, &ch, a->shape[s.am], out);
        chunks_free(&ch);
        return st;
    }
    /* c_local: (batch/.., m/.., n/..), partial over k's mesh axis when k is sharded */
    DT_TRY(dt__slot_new(p, &best->c, a->dtype, a->rank, cshape, &c));
    int ins[2] = {a2.slot, b2.slot};
    DT_TRY(dt__emit_kernel(p, "matmul", DT__K_GEMM, a->dtype, 2, ins, c.slot, a->layout.mesh,
                           gemm_args, &g));
    return dt__relayout_emit(p, "matmul", &c, &best->final, out);
}

/* A product recorded on the tape (the gradient rule's four transpose cases). */
static dt_status record_matmul(dt__tape *a, const dt_tensor *x, const dt_tensor *y, int ta, int tb,
                               dt_tensor **out)
{
    dt_op_options o = {.transpose_a = ta, .transpose_b = tb};
    return dt__tape_keep(a, dt_matmul(x, y, &o, out), out);
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)y;
    const dt_tensor *A = x[0], *B = x[1];
    int ta = n->attrs.ta, tb = n->attrs.tb;
    if (B->rank == 2 && A->rank > 2) {
        /* b of rank 2 shared by every batch: einsums, so that b's gradient is one contraction
         * over the batch axes and the rows (folded into one GEMM), never a product per batch
         * element summed afterwards (a temporary the batch's size times b's). Labels: x the
         * rows of C, y the contraction, z the columns of C. */
        char ea[4 * DT_MAX_RANK + 16], eb[4 * DT_MAX_RANK + 16], bat[DT_MAX_RANK + 1] = {0};
        for (int i = 0; i < A->rank - 2; i++)
            bat[i] = (char)('a' + i);
        const char *la = ta ? "yx" : "xy", *lb = tb ? "zy" : "yz";
        snprintf(ea, sizeof ea, "%sxz,%s->%s%s", bat, lb, bat, la);
        snprintf(eb, sizeof eb, "%s%s,%sxz->%s", bat, la, bat, lb);
        const dt_tensor *opa[2] = {dy, B}, *opb[2] = {A, dy};
        DT_TRY(dt__tape_keep(a, dt_einsum(ea, 2, opa, NULL, &dx[0]), &dx[0]));
        return dt__tape_keep(a, dt_einsum(eb, 2, opb, NULL, &dx[1]), &dx[1]);
    }
    /* C = op(A) op(B): dA and dB by the four transpose cases. */
    if (!ta && !tb) {
        DT_TRY(record_matmul(a, dy, B, 0, 1, &dx[0])); /* dC B^T */
        DT_TRY(record_matmul(a, A, dy, 1, 0, &dx[1])); /* A^T dC */
    } else if (ta && !tb) {
        DT_TRY(record_matmul(a, B, dy, 0, 1, &dx[0])); /* B dC^T */
        DT_TRY(record_matmul(a, A, dy, 0, 0, &dx[1])); /* A dC */
    } else if (!ta && tb) {
        DT_TRY(record_matmul(a, dy, B, 0, 0, &dx[0])); /* dC B */
        DT_TRY(record_matmul(a, dy, A, 1, 0, &dx[1])); /* dC^T A */
    } else {
        DT_TRY(record_matmul(a, B, dy, 1, 1, &dx[0])); /* B^T dC^T */
        DT_TRY(record_matmul(a, dy, A, 1, 1, &dx[1])); /* dC^T A^T */
    }
    return DT_OK;
}

const dt__op_def dt__op_matmul = {.name = "matmul",
                                  .min_inputs = 2,
                                  .max_inputs = 2,
                                  .infer = infer,
                                  .expand = expand,
                                  .vjp = vjp};

dt_status dt_matmul(const dt_tensor *a, const dt_tensor *b, const dt_op_options *opts,
                    dt_tensor **out)
{
    dt__attrs at;
    memset(&at, 0, sizeof at);
    at.ta = opts && opts->transpose_a;
    at.tb = opts && opts->transpose_b;
    const dt_tensor *in[2] = {a, b};
    return dt__call(DT__OP_MATMUL, &at, 2, in, opts, out);
}
