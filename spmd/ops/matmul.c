/* matmul: C[..., m, n] = A[..., m, k] B[..., k, n], with transposes and leading batch axes.
 *
 * An expansion assigns a mesh axis (or none) to each batch axis, m, n and k, all distinct:
 *   A' = (batch, m, k), B' = (batch, k, n) as assigned; C' = (batch, m, n), partial over k's
 *   mesh axis when k is sharded (the local GEMM of k-shards gives pending sums).
 * Operands are relayouted to A', B' (a sharded contracting axis in one operand only is a local
 * slice of the other; conflicts relayout one operand), the local GEMM runs, and C' goes to the
 * requested layout: all-reduce for replicated, reduce-scatter for sharded, nothing for partial.
 * Candidates for each axis are the mesh axes the operands or the request put there, and none;
 * the cheapest expansion by the alpha-beta model (communication + GEMM time) wins. */
#include "../engine.h"

#include <math.h>
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
    if (S->want) {
        p->final = *S->want;
    } else {
        p->final = p->c;
        p->final.partial = 0;
    }
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
    /* c_local: (batch/.., m/.., n/..), partial over k's mesh axis when k is sharded */
    DT_TRY(dt__slot_new(p, &best->c, a->dtype, a->rank, cshape, &c));
    gemm_ctx g = {.a = &a2, .b = &b2, .c = &c, .s = s, .ta = n->attrs.ta, .tb = n->attrs.tb};
    int ins[2] = {a2.slot, b2.slot};
    DT_TRY(dt__emit_kernel(p, "matmul", DT__K_GEMM, a->dtype, 2, ins, c.slot, a->layout.mesh,
                           gemm_args, &g));
    return dt__relayout_emit(p, "matmul", &c, &best->final, out);
}

const dt__op_def dt__op_matmul = {
    .name = "matmul", .min_inputs = 2, .max_inputs = 2, .infer = infer, .expand = expand};

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
