/* Layout search for the op rules: where a broadcasting op computes (the shape and the operand
 * layouts), the choice of a mesh axis for each of an op's axes by the alpha-beta cost model
 * (gather, unsorted_segment_sum, one_hot, einsum), and the layout such a search ends in. */
#include "engine.h"

#include <math.h>
#include <string.h>

/* ---- broadcasting ops ---------------------------------------------------------------------- */

dt_status dt__broadcast_shape(const char *what, int n, const int ranks[],
                              const int64_t *const shapes[], int *rank, int64_t shape[])
{
    int r = 0;
    for (int q = 0; q < n; q++)
        r = ranks[q] > r ? ranks[q] : r;
    for (int i = 0; i < r; i++) {
        int64_t e = 1;
        int from = -1; /* the operand that set e */
        for (int q = 0; q < n; q++) {
            int iq = i - (r - ranks[q]);
            int64_t eq = iq >= 0 ? shapes[q][iq] : 1;
            if (eq == 1 || eq == e)
                continue;
            if (e == 1) {
                e = eq;
                from = q;
                continue;
            }
            char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX];
            return dt__fail(
                DT_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (axis %d: %lld vs %lld)", what,
                dt__shape_str(sa, sizeof sa, ranks[from], shapes[from]),
                dt__shape_str(sb, sizeof sb, ranks[q], shapes[q]), i, (long long)e, (long long)eq);
        }
        shape[i] = e;
    }
    *rank = r;
    return DT_OK;
}

dt_layout dt__operand_layout(const dt__dist *x, const dt_layout *o, const int64_t oshape[])
{
    dt_layout l = dt__layout_none(o->mesh, x->rank);
    int off = o->rank - x->rank;
    for (int i = 0; i < x->rank; i++)
        if (x->shape[i] == oshape[i + off])
            l.axes[i] = o->axes[i + off];
    return l;
}

/* A result layout taking each axis's mesh axis from the first of xs (in the order `first`,
 * then the others) that shards it. */
static dt_layout merged_layout(int n, const dt__dist *const xs[], int first, int rank,
                               const int64_t oshape[])
{
    dt_layout l = dt__layout_none(xs[0]->layout.mesh, rank);
    unsigned used = 0;
    for (int k = 0; k < n; k++) {
        const dt__dist *x = xs[(first + k) % n];
        int off = rank - x->rank;
        for (int i = 0; i < x->rank; i++) {
            int ax = x->layout.axes[i];
            if (ax == DT_UNSHARDED || (used & (1u << ax)) || l.axes[i + off] != DT_UNSHARDED ||
                x->shape[i] != oshape[i + off])
                continue;
            l.axes[i + off] = ax;
            used |= 1u << ax;
        }
    }
    return l;
}

dt_layout dt__broadcast_layout(int n, const dt__dist *const xs[], int rank, const int64_t oshape[],
                               const dt_layout *want)
{
    dt_layout best = merged_layout(n, xs, 0, rank, oshape);
    double best_cost = INFINITY;
    for (int c = 0; c <= n; c++) {
        dt_layout o;
        if (c < n) {
            o = merged_layout(n, xs, c, rank, oshape);
        } else if (want) {
            o = *want;
            o.partial = 0;
        } else {
            break;
        }
        double cost = want ? dt__relayout_cost(&o, want, xs[0]->dtype, rank, oshape) : 0;
        for (int q = 0; q < n; q++) {
            dt_layout lq = dt__operand_layout(xs[q], &o, oshape);
            cost += dt__relayout_cost(&xs[q]->layout, &lq, xs[q]->dtype, xs[q]->rank, xs[q]->shape);
        }
        /* on a tie the request wins: computing the requested shards directly never touches
         * more than computing another layout and then slicing it (which also holds the
         * other layout's larger shards for a while) */
        if (cost < best_cost || (c == n && cost <= best_cost)) {
            best_cost = cost;
            best = o;
        }
    }
    return best;
}

/* ---- choosing mesh axes for an op's axes ------------------------------------------------- */

void dt__assign_add(dt__assign *s, int slot, int axis)
{
    if (slot < 0 || slot >= s->n)
        return;
    for (int c = 0; c < s->ncand[slot]; c++)
        if (s->cand[slot][c] == axis)
            return;
    if (s->ncand[slot] < DT_MAX_MESH_AXES + 1)
        s->cand[slot][s->ncand[slot]++] = axis;
}

typedef struct assign_walk {
    const dt__assign *s;
    dt__assign_cost_fn cost;
    void *ctx;
    int cur[DT__ASSIGN_MAX];
    double best_cost;
    int *best;
    bool found;
} assign_walk;

static void assign_enumerate(assign_walk *w, int slot, unsigned used)
{
    if (slot == w->s->n) {
        double c = w->cost(w->ctx, w->cur);
        if (isfinite(c) && (!w->found || c < w->best_cost)) {
            w->best_cost = c;
            w->found = true;
            memcpy(w->best, w->cur, sizeof(int) * (size_t)w->s->n);
        }
        return;
    }
    for (int c = 0; c < w->s->ncand[slot]; c++) {
        int ax = w->s->cand[slot][c];
        if (ax != DT_UNSHARDED && (used & (1u << ax)))
            continue;
        w->cur[slot] = ax;
        assign_enumerate(w, slot + 1, ax == DT_UNSHARDED ? used : used | (1u << ax));
    }
}

bool dt__assign_best(const dt__assign *s, dt__assign_cost_fn cost, void *ctx, int best[])
{
    assign_walk w = {.s = s, .cost = cost, .ctx = ctx, .best = best};
    assign_enumerate(&w, 0, 0);
    return w.found;
}

dt_layout dt__search_final(const dt_layout *want, const dt_layout *computed)
{
    if (want)
        return *want;
    dt_layout l = *computed;
    l.partial = 0;
    return l;
}
