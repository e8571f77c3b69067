/* Gradient buckets: runs of all-reduces (or of reduce-scatters) merged into one collective
 * of a flat buffer.
 *
 * A backward pass emits one all-reduce per parameter gradient under data parallel (one
 * reduce-scatter under the fully sharded preset, or one per chunk of rows where the chunked
 * matmul makes the gradient), and each pays a collective's fixed costs (a start on every
 * client, message latencies) on a few kilobytes to megabytes. This pass, run on a traced
 * function's program before the overlap schedule, groups them as PyTorch DDP's buckets do.
 * All-reduces and reduce-scatters have an open bucket each (a fully sharded backward
 * interleaves its weights' reduce-scatters with the all-reduces of reductions over the
 * batch, and neither closes the other's bucket). An all-reduce in its even form over whole
 * slots, or a reduce-scatter (even or uneven, into a whole slot or into a block of rows of a
 * larger one: the chunked matmul's), joins the open bucket of its kind when it has the
 * bucket's mesh, groups (its mesh axes but those of size 1), dtype and reduction and no step
 * since the bucket opened has read or written the result of a member (another chunk into
 * a member's slot is such a touch: a bucket takes one chunk of a gradient, so that its flat
 * buffer never holds a whole partial sum the chunked matmul keeps a chunk at a time); the
 * bucket closes when its bytes reach the cap
 * (DTENSOR_BUCKET_MB; at most 1 MiB for the first bucket of each kind), at a step touching
 * a member's result, or at a collective of its kind it cannot take. A bucket of two or more
 * members becomes:
 *   - at each member's place, a copy of its operand into a flat temporary: for a
 *     reduce-scatter over g devices the flat buffer is g regions (one per group member, in
 *     the order the collective hands them out), region q holding block q of every member's
 *     operand in member order, so that one reduce-scatter (uneven when a member is) leaves
 *     each device its region: its blocks of every member;
 *   - after the last of them, ONE collective of the flat buffer (an all-reduce in place);
 *   - before the first later step that reads or writes a member's result or the next
 *     collective of the program (or at its end), whichever comes first, a copy of the
 *     member's block of the flat result into that result (at the member's offset into it).
 * The overlap schedule then starts the bucket's collective as soon as its last operand is
 * copied in, while backward goes on, and waits for it at the first copy out. The flat buffer
 * is memory the program without buckets does not take (there a gradient's all-reduce runs in
 * place in its result, and the chunked matmul keeps one chunk of rows); copying out no later
 * than the next collective keeps it alive only from the bucket's first member to shortly
 * after its last, not until the end of the program (where a step's memory peaks when the
 * gradients are its results), and the cap bounds it. Every element is reduced over the same
 * terms as before, so the result differs at most in the order the collective adds them (none
 * at two devices). The pass is a pure function of the program and the cap (a member's bytes
 * against the cap are the same on every client, uneven ones' included), so every client
 * buckets alike and starts the same collectives in the same order.
 *
 * All-gathers get buckets too, for the fully sharded preset's parameters: each weight is
 * gathered where it is used (forward, and again in backward), one small collective after
 * another, though every operand is ready from the program's start. A run of all-gathers of
 * one mesh, groups and dtype, each straight from a slot into a whole slot (even or uneven),
 * of the program's inputs (not activations: a tensor-parallel program gathers those where it
 * needs them, and gathered early they would be held longer), becomes:
 *   - copies of each member's operand (the device's block) into a flat operand, member after
 *     member, and ONE all-gather of it into a flat result of g regions (region q: member q's
 *     flat operand), placed as early as the first member could start: after its operands'
 *     writers (none, for inputs) and after the previous all-gather's first reader (the
 *     previous bucket's first copy out), so that gathers stay at most two at a time as the
 *     overlap schedule has them: the current layer's and the next one's, prefetched;
 *   - in each member's place, a copy of its g blocks out of the flat result into its result.
 * The bucket closes where a member would take its gathered bytes past the cap or past those
 * of the program's largest all-gather (so the flat result is never larger than the largest
 * gather the program makes without buckets, or 64 KiB; at the default cap under one GPT-2
 * small block), or at an all-gather of an input it cannot take (one whose operand is written
 * after the bucket's first member among them, or an input a member gathers already: a
 * recomputed gather's second time); an all-gather of an activation leaves it open
 * (the next bucket then starts after that one's first reader too). Results are bitwise those
 * of the separate all-gathers. */
#include "engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DT__BUCKET_MB_DEFAULT 25.0 /* PyTorch DDP's bucket_cap_mb */
#define DT__BUCKET_MB_MAX 1048576.0
/* A program's first bucket is capped lower, as DDP's first is, so that the reduction of the
 * gradients backward makes first starts early rather than at the end of a small model. */
#define DT__BUCKET_FIRST ((size_t)1 << 20)

dt_status dt__bucket_cap(size_t *bytes)
{
    *bytes = (size_t)(DT__BUCKET_MB_DEFAULT * 1048576.0);
    const char *e = getenv("DTENSOR_BUCKET_MB");
    if (!e || !*e)
        return DT_OK;
    char *end;
    double v = strtod(e, &end);
    if (*end || !(v >= 0 && v <= DT__BUCKET_MB_MAX)) /* NaN fails the comparison too */
        return dt__fail(DT_ERR_ARG,
                        "function: DTENSOR_BUCKET_MB=\"%.64s\" is not a number of megabytes "
                        "from 0 (no buckets) to %.0f",
                        e, DT__BUCKET_MB_MAX);
    *bytes = (size_t)(v * 1048576.0);
    return DT_OK;
}

/* Group members of a collective that may join a bucket (1 for an all-reduce), or 0: an
 * all-reduce in the even form over whole slots, or a reduce-scatter, even or with counts of
 * its own (then over 2 members or more), into a whole slot or a block of one (offsets: the
 * chunked matmul's). A reduce-scatter's operand holds every member's block in member order.
 * From the program alone, the same on every client. */
static int64_t bucket_members(const dt__step *st)
{
    if (st->kind != DT__STEP_COLL || st->boxes)
        return 0;
    if (st->coll == DT__COLL_ALL_REDUCE)
        return st->counts || st->at || st->count <= 0 ? 0 : 1;
    if (st->coll != DT__COLL_REDUCE_SCATTER || (!st->counts && st->count <= 0))
        return 0;
    int64_t g = 1;
    for (int a = 0; a < st->mesh->num_axes; a++)
        if (st->axes & (1u << a))
            g *= st->mesh->sizes[a];
    return st->counts && g < 2 ? 0 : g;
}

/* The mesh axes of a collective that make its groups: those of size 1 change none. */
static unsigned group_axes(const dt__step *st)
{
    unsigned axes = st->axes;
    for (int a = 0; a < st->mesh->num_axes; a++)
        if (st->mesh->sizes[a] == 1)
            axes &= ~(1u << a);
    return axes;
}

/* The operand's bytes a member adds to its bucket, the same on every client: an even one's
 * from its count; one with counts (which differ between devices) from the bytes the busiest
 * device sends, (g - 1) / g of the busiest operand. */
static size_t member_bytes(const dt__step *st, int64_t g)
{
    if (!st->counts)
        return (size_t)(g * st->count) * dt_dtype_size(st->dtype);
    return (size_t)(st->bytes_max * (double)g / (double)(g - 1));
}

/* Elements member q of the group receives from collective st on local device i. */
static int64_t count_of(const dt__step *st, int i, int64_t q)
{
    return st->counts ? st->counts[i][q] : st->count;
}

static bool uses(const dt__step *st, int slot)
{
    if (st->out == slot)
        return true;
    for (int j = 0; j < st->nin; j++)
        if (st->in[j] == slot)
            return true;
    return false;
}

static bool touches(const dt__step *st, const unsigned char held[])
{
    if (held[st->out])
        return true;
    for (int j = 0; j < st->nin; j++)
        if (held[st->in[j]])
            return true;
    return false;
}

/* A copy between a member's slot and the flat one on local device i (another client's
 * device gets no blocks: its counts are not in this client's program). In (pack): the g
 * blocks of the operand, one after the other from the member's send offset, each to
 * flat_at[i * g + q]; out: the device's block, flat_at[i] into the result, to the member's
 * receive offset. */
typedef struct copy_ctx {
    const dt__step *st; /* the member */
    int64_t g;
    bool pack;
    const int64_t *flat_at;
    const int *rank; /* out: local device i's rank in its group */
    int first_local, nlocal;
    bool nomem;
} copy_ctx;

static void copy_args(void *ctx, int device, dt__kargs *k)
{
    copy_ctx *c = ctx;
    int i = device - c->first_local;
    k->rank = 1;
    if (i < 0 || i >= c->nlocal)
        return;
    int64_t nb = c->pack ? c->g : 1;
    k->blocks = calloc((size_t)nb, sizeof *k->blocks);
    if (!k->blocks) {
        c->nomem = true;
        return;
    }
    k->nblocks = (int)nb;
    int64_t src = c->st->at ? c->st->at[i][0] : 0;
    for (int64_t q = 0; q < nb; q++) {
        dt__block *b = &k->blocks[q];
        int64_t n = count_of(c->st, i, c->pack ? q : c->rank[i]);
        b->rank = 1;
        b->extent[0] = b->src_shape[0] = b->dst_shape[0] = n;
        if (c->pack) {
            b->src_at = src;
            b->dst_at = c->flat_at[i * c->g + q];
            src += n;
        } else {
            b->src_at = c->flat_at[i];
            b->dst_at = c->st->at ? c->st->at[i][1] : 0;
        }
        k->shape[0] += n;
    }
}

/* Where the new steps go: before original step `anchor`, or in its place (replace), in the
 * order they were made; next links those of one anchor. */
typedef struct placing {
    int *anchor, *next, n;
    bool *replace;
} placing;

static dt_status emit_copy(dt__program *p, placing *pl, int anchor, bool replace, int from, int to,
                           const dt_mesh *m, dt_dtype dtype, copy_ctx *c)
{
    DT_TRY(dt__emit_kernel(p, "bucket", DT__K_COPY_BLOCKS, dtype, 1, &from, to, m, copy_args, c));
    pl->anchor[pl->n] = anchor;
    pl->replace[pl->n++] = replace;
    return c->nomem ? dt__fail(DT_ERR_NOMEM, "bucket: out of memory") : DT_OK;
}

/* An uneven bucket's counts: region[i * g + q] elements for member q on local device i. */
typedef struct counts_ctx {
    const int64_t *region;
    int64_t g;
    int first_local;
} counts_ctx;

static void bucket_counts(void *ctx, int device, int64_t counts[])
{
    const counts_ctx *c = ctx;
    for (int64_t q = 0; q < c->g; q++)
        counts[q] = c->region[(device - c->first_local) * c->g + q];
}

/* A bucket's layout on each local device i: its group rank, and region[i * g + q], the
 * elements of block q of every member (member after member); whether every member is even, the
 * elements each contributes then, and the bytes the members send (the ledger's). at and elems
 * are the callers' offsets, allocated here. */
typedef struct bucket_geom {
    int64_t *region, *at, *elems;
    int *rank;
    bool even;
    int64_t total;
    double sent;
} bucket_geom;

static void geom_free(bucket_geom *b)
{
    free(b->region);
    free(b->at);
    free(b->elems);
    free(b->rank);
}

/* ranked: the devices' group ranks (an all-reduce's regions need none: rank 0 each). */
static dt_status geom_new(const dt__program *p, const int mem[], int n, int64_t g, bool ranked,
                          bucket_geom *b)
{
    const dt__step *first = &p->steps[mem[0]];
    const dt_mesh *m = first->mesh;
    int nl = m->num_local;
    size_t cells = (size_t)nl * (size_t)g + 1;
    *b = (bucket_geom){.region = calloc(cells, sizeof *b->region),
                       .at = calloc(cells, sizeof *b->at),
                       .elems = calloc((size_t)nl + 1, sizeof *b->elems),
                       .rank = calloc((size_t)nl + 1, sizeof *b->rank),
                       .even = true};
    if (!b->region || !b->at || !b->elems || !b->rank) {
        geom_free(b);
        return dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    }
    for (int j = 0; j < n; j++) {
        const dt__step *st = &p->steps[mem[j]];
        b->even = b->even && !st->counts;
        b->total += st->count;
        b->sent += st->bytes_max;
    }
    for (int i = 0; i < nl; i++) {
        b->rank[i] = ranked ? dt__group_rank(m, first->axes, m->first_local + i) : 0;
        for (int64_t q = 0; q < g; q++)
            for (int j = 0; j < n; j++)
                b->region[i * g + q] += count_of(&p->steps[mem[j]], i, q);
    }
    return DT_OK;
}

/* The elements a bucket's label shows: each member's when even, else its operand's on the
 * busiest device over g. */
static int64_t geom_shown(const bucket_geom *b, int64_t g, dt_dtype t)
{
    return b->even ? b->total : llround(b->sent / (double)(g - 1) / (double)dt_dtype_size(t));
}

/* Emit a bucket's steps (at the end of p, placed by pl): members mem[0..n) of the original
 * steps, each over g group members; its results are copied out before original step `until`
 * at the latest (the next collective, or the original step count: the end). On local device
 * i the flat buffer is g regions, region q (region[i * g + q] elements) holding block q of
 * every member in member order; a reduce-scatter leaves the device its rank's region, the
 * result. */
static dt_status emit_bucket(dt__program *p, placing *pl, const int mem[], int n, int until,
                             int64_t g)
{
    const dt__step first = p->steps[mem[0]]; /* a copy: emitting moves the array */
    const dt_mesh *m = first.mesh;
    int nl = m->num_local;
    bool ar = first.coll == DT__COLL_ALL_REDUCE;
    bucket_geom b;
    dt_status s = geom_new(p, mem, n, g, !ar, &b);
    if (s != DT_OK)
        return s;
    int64_t *region = b.region, *at = b.at, *elems = b.elems;
    int *rank = b.rank;
    for (int i = 0; i < nl; i++)
        for (int64_t q = 0; q < g; q++) {
            at[i * g + q] = elems[i];
            elems[i] += region[i * g + q];
        }
    int flat = -1, res = -1;
    s = dt__slot_new_elems(p, m, first.dtype, elems, &flat);
    res = flat;
    for (int i = 0; s == DT_OK && i < nl; i++)
        elems[i] = region[i * g + rank[i]];
    if (s == DT_OK && !ar)
        s = dt__slot_new_elems(p, m, first.dtype, elems, &res);
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step st = p->steps[mem[j]];
        copy_ctx c = {.st = &st,
                      .g = g,
                      .pack = true,
                      .flat_at = at,
                      .first_local = m->first_local,
                      .nlocal = nl};
        s = emit_copy(p, pl, mem[j], true, st.in[0], flat, m, first.dtype, &c);
        for (int i = 0; i < nl; i++)
            for (int64_t q = 0; q < g; q++)
                at[i * g + q] += count_of(&st, i, q);
    }
    char what[96];
    snprintf(what, sizeof what, "bucket of %d %s, %lld elements", n,
             ar ? "all-reduces" : "reduce-scatters", (long long)geom_shown(&b, g, first.dtype));
    counts_ctx cc = {.region = region, .g = g, .first_local = m->first_local};
    if (s == DT_OK)
        s = dt__emit_coll(p, "bucket", first.coll, first.dtype, first.op, first.axes, flat, res,
                          b.even ? b.total : 0, b.even ? NULL : bucket_counts, &cc, (int)g, b.sent,
                          what);
    if (s == DT_OK) {
        pl->anchor[pl->n] = mem[n - 1];
        pl->replace[pl->n++] = true;
    }
    for (int i = 0; s == DT_OK && i < nl; i++)
        at[i] = 0; /* each device's offset into the result */
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step st = p->steps[mem[j]];
        copy_ctx c = {.st = &st,
                      .g = g,
                      .flat_at = at,
                      .rank = rank,
                      .first_local = m->first_local,
                      .nlocal = nl};
        int anchor = mem[n - 1] + 1; /* the first later step touching the result */
        while (anchor < until && !uses(&p->steps[anchor], st.out))
            anchor++;
        s = emit_copy(p, pl, anchor, false, res, st.out, m, first.dtype, &c);
        for (int i = 0; i < nl; i++)
            at[i] += count_of(&st, i, rank[i]);
    }
    geom_free(&b);
    return s;
}

/* The open bucket of one kind of collective (all-reduces, reduce-scatters): its members,
 * their operands' bytes, the buckets of its kind kept so far, and the slots its members write. */
typedef struct open_bucket {
    int *mem, n;
    size_t bytes;
    int kept;
    unsigned char *held;
} open_bucket;

/* Close bucket b: kept (appended to mem, bk gets its start and size) when it has two
 * members or more; its results are no longer held. */
static void close_bucket(const dt__program *p, open_bucket *b, int mem[], int *nm, int bk[][2],
                         int *nb)
{
    for (int k = 0; k < b->n; k++)
        b->held[p->steps[b->mem[k]].out] = 0;
    if (b->n >= 2) {
        memcpy(mem + *nm, b->mem, sizeof *mem * (size_t)b->n);
        bk[*nb][0] = *nm;
        bk[(*nb)++][1] = b->n;
        *nm += b->n;
        b->kept++;
    }
    b->n = 0;
    b->bytes = 0;
}

/* A member's owned arrays, freed when the pass drops it. */
static void free_member(dt__step *st)
{
    if (st->counts)
        for (int d = 0; d < st->nlocal; d++)
            free(st->counts[d]);
    free(st->counts);
    free(st->at);
}

static dt_status placing_new(placing *pl, int n)
{
    *pl = (placing){.anchor = calloc((size_t)n + 1, sizeof *pl->anchor),
                    .next = calloc((size_t)n + 1, sizeof *pl->next),
                    .replace = calloc((size_t)n + 1, sizeof *pl->replace)};
    return pl->anchor && pl->next && pl->replace ? DT_OK
                                                 : dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
}

static void placing_free(placing *pl)
{
    free(pl->anchor);
    free(pl->next);
    free(pl->replace);
}

/* Move the steps made at the end of p (the first n0 are the original ones) to their places:
 * the original steps mem[0..nm) give way to the steps that replace them. */
static dt_status rebuild(dt__program *p, int n0, const int mem[], int nm, placing *pl)
{
    int *head = calloc((size_t)n0 + 1, sizeof *head), *tail = calloc((size_t)n0 + 1, sizeof *tail);
    bool *member = calloc((size_t)n0 + 1, sizeof *member);
    dt__step *steps = calloc((size_t)(n0 - nm + pl->n) + 1, sizeof *steps);
    dt_status s =
        head && tail && member && steps ? DT_OK : dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    if (s == DT_OK) {
        for (int k = 0; k < nm; k++)
            member[mem[k]] = true;
        for (int i = 0; i <= n0; i++)
            head[i] = tail[i] = -1;
        for (int x = 0; x < pl->n; x++) {
            int a = pl->anchor[x];
            pl->next[x] = -1;
            if (tail[a] >= 0)
                pl->next[tail[a]] = x;
            else
                head[a] = x;
            tail[a] = x;
        }
        /* a member's place holds its replacements; the steps before an anchor precede them */
        int k = 0;
        for (int i = 0; i <= n0; i++) {
            for (int x = head[i]; x >= 0; x = pl->next[x])
                if (!pl->replace[x])
                    steps[k++] = p->steps[n0 + x];
            if (i == n0)
                break;
            if (!member[i])
                steps[k++] = p->steps[i];
            else
                free_member(&p->steps[i]);
            for (int x = head[i]; member[i] && x >= 0; x = pl->next[x])
                if (pl->replace[x])
                    steps[k++] = p->steps[n0 + x];
        }
        free(p->steps);
        p->steps = steps;
        p->nsteps = p->cap_steps = k;
        steps = NULL;
    }
    free(steps);
    free(head);
    free(tail);
    free(member);
    return s;
}

static dt_status bucket_reductions(dt__program *p, size_t cap)
{
    int n0 = p->nsteps;
    if (!cap || n0 < 2)
        return DT_OK;
    /* kind 0: all-reduces, 1: reduce-scatters; a bucket of one kind stays open across the
     * other's members (a fully sharded backward interleaves the weights' reduce-scatters with
     * the all-reduces of reductions over the batch) */
    open_bucket ob[2] = {{0}, {0}};
    int *mem = calloc((size_t)n0, sizeof *mem);
    int(*bk)[2] = calloc((size_t)n0, sizeof *bk);
    bool ok = mem && bk;
    for (int k = 0; k < 2; k++) {
        ob[k].mem = calloc((size_t)n0, sizeof *ob[k].mem);
        ob[k].held = calloc((size_t)p->nslots, sizeof *ob[k].held);
        ok = ok && ob[k].mem && ob[k].held;
    }
    if (!ok) {
        for (int k = 0; k < 2; k++) {
            free(ob[k].mem);
            free(ob[k].held);
        }
        free(mem);
        free(bk);
        return dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    }
    /* the buckets, in the order they close */
    int nm = 0, nb = 0;
    for (int i = 0; i < n0; i++) {
        const dt__step *st = &p->steps[i];
        int64_t g = bucket_members(st);
        int kind = st->coll == DT__COLL_ALL_REDUCE ? 0 : 1;
        for (int k = 0; k < 2; k++) {
            open_bucket *b = &ob[k];
            /* another chunk of a slot a member writes closes the bucket too: a bucket of
             * every chunk of a gradient would hold its whole partial sum, which the chunked
             * matmul exists to avoid */
            if (b->n && touches(st, b->held))
                close_bucket(p, b, mem, &nm, bk, &nb);
        }
        if (!g)
            continue;
        open_bucket *b = &ob[kind];
        if (b->n) {
            const dt__step *f = &p->steps[b->mem[0]];
            if (f->mesh != st->mesh || group_axes(f) != group_axes(st) || f->dtype != st->dtype ||
                f->op != st->op || bucket_members(f) != g)
                close_bucket(p, b, mem, &nm, bk, &nb);
        }
        b->mem[b->n++] = i;
        b->held[st->out] = 1;
        b->bytes += member_bytes(st, g);
        if (b->bytes >= (b->kept == 0 && cap > DT__BUCKET_FIRST ? DT__BUCKET_FIRST : cap))
            close_bucket(p, b, mem, &nm, bk, &nb);
    }
    for (int k = 0; k < 2; k++) {
        if (ob[k].n)
            close_bucket(p, &ob[k], mem, &nm, bk, &nb);
        free(ob[k].mem);
        free(ob[k].held);
    }
    if (!nb) {
        free(mem);
        free(bk);
        return DT_OK;
    }
    /* each bucket's steps at the end of p, then every step moved to its place */
    placing pl;
    dt_status s = placing_new(&pl, 2 * nm + nb);
    for (int b = 0; s == DT_OK && b < nb; b++) {
        const int *bm = mem + bk[b][0];
        int n = bk[b][1], until = bm[n - 1] + 1; /* the next collective */
        while (until < n0 && p->steps[until].kind != DT__STEP_COLL)
            until++;
        s = emit_bucket(p, &pl, bm, n, until, bucket_members(&p->steps[bm[0]]));
    }
    if (s == DT_OK)
        s = rebuild(p, n0, mem, nm, &pl);
    placing_free(&pl);
    free(mem);
    free(bk);
    return s;
}

/* ---- all-gathers ------------------------------------------------------------------------ */

/* Group members of an all-gather that may join a bucket, or 0: one straight from a slot into a
 * whole slot (no boxes, no offsets), even or with counts of its own, over 2 members or more.
 * Its result is the members' blocks in member order. */
static int64_t gather_members(const dt__step *st)
{
    if (st->kind != DT__STEP_COLL || st->coll != DT__COLL_ALL_GATHER || st->boxes || st->at ||
        (!st->counts && st->count <= 0))
        return 0;
    int64_t g = 1;
    for (int a = 0; a < st->mesh->num_axes; a++)
        if (st->axes & (1u << a))
            g *= st->mesh->sizes[a];
    return g < 2 ? 0 : g;
}

/* A bucket of all-gathers may always hold this much (see bucket_gathers). */
#define DT__GATHER_SMALL ((size_t)64 << 10)

/* The bytes an all-gather's result holds on the busiest device, the same on every client. */
static size_t gathered_bytes(const dt__step *st, int64_t g)
{
    return (size_t)(st->bytes_max * (double)g / (double)(g - 1));
}

/* A copy between an all-gather member's slots and a bucket's flat ones on local device i.
 * In (pack): the device's block, to flat_at[i] in the flat operand; out: the g blocks of the
 * member's result, one after the other, each from flat_at[i * g + q] in the flat result. */
typedef struct gcopy_ctx {
    const dt__step *st; /* the member */
    int64_t g;
    bool pack;
    const int64_t *flat_at;
    const int *rank; /* local device i's rank in its group */
    int first_local, nlocal;
    bool nomem;
} gcopy_ctx;

static void gcopy_args(void *ctx, int device, dt__kargs *k)
{
    gcopy_ctx *c = ctx;
    int i = device - c->first_local;
    k->rank = 1;
    if (i < 0 || i >= c->nlocal)
        return;
    int64_t nb = c->pack ? 1 : c->g;
    k->blocks = calloc((size_t)nb, sizeof *k->blocks);
    if (!k->blocks) {
        c->nomem = true;
        return;
    }
    k->nblocks = (int)nb;
    int64_t dst = 0;
    for (int64_t q = 0; q < nb; q++) {
        dt__block *b = &k->blocks[q];
        int64_t n = count_of(c->st, i, c->pack ? c->rank[i] : q);
        b->rank = 1;
        b->extent[0] = b->src_shape[0] = b->dst_shape[0] = n;
        b->src_at = c->pack ? 0 : c->flat_at[i * c->g + q];
        b->dst_at = c->pack ? c->flat_at[i] : dst;
        dst += n;
        k->shape[0] += n;
    }
}

/* Emit an all-gather bucket's steps (at the end of p, placed by pl): members mem[0..n) of the
 * original steps, each over g group members. The flat operand on local device i holds the
 * device's block of every member in member order, and the flat result g regions, region q
 * (region[i * g + q] elements) member q's flat operand: block q of every member. The copies
 * in and the all-gather go before original step `from`; each member's copy out in its place. */
static dt_status emit_gather_bucket(dt__program *p, placing *pl, const int mem[], int n, int from,
                                    int64_t g)
{
    const dt__step first = p->steps[mem[0]]; /* a copy: emitting moves the array */
    const dt_mesh *m = first.mesh;
    int nl = m->num_local;
    bucket_geom b;
    dt_status s = geom_new(p, mem, n, g, true, &b);
    if (s != DT_OK)
        return s;
    int64_t *region = b.region, *at = b.at, *elems = b.elems;
    int *rank = b.rank;
    for (int i = 0; i < nl; i++)
        elems[i] = region[i * g + rank[i]];
    int send = -1, recv = -1;
    s = dt__slot_new_elems(p, m, first.dtype, elems, &send);
    for (int i = 0; s == DT_OK && i < nl; i++) {
        elems[i] = 0;
        for (int64_t q = 0; q < g; q++) {
            at[i * g + q] = elems[i];
            elems[i] += region[i * g + q];
        }
    }
    if (s == DT_OK)
        s = dt__slot_new_elems(p, m, first.dtype, elems, &recv);
    int64_t *packed = elems; /* each device's offset into the flat operand */
    for (int i = 0; s == DT_OK && i < nl; i++)
        packed[i] = 0;
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step st = p->steps[mem[j]];
        gcopy_ctx c = {.st = &st,
                       .g = g,
                       .pack = true,
                       .flat_at = packed,
                       .rank = rank,
                       .first_local = m->first_local,
                       .nlocal = nl};
        s = dt__emit_kernel(p, "bucket", DT__K_COPY_BLOCKS, first.dtype, 1, &st.in[0], send, m,
                            gcopy_args, &c);
        if (s == DT_OK && c.nomem)
            s = dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
        pl->anchor[pl->n] = from;
        pl->replace[pl->n++] = false;
        for (int i = 0; i < nl; i++)
            packed[i] += count_of(&st, i, rank[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "bucket of %d all-gathers, %lld elements", n,
             (long long)geom_shown(&b, g, first.dtype));
    counts_ctx cc = {.region = region, .g = g, .first_local = m->first_local};
    if (s == DT_OK)
        s = dt__emit_coll(p, "bucket", DT__COLL_ALL_GATHER, first.dtype, first.op, first.axes, send,
                          recv, b.even ? b.total : 0, b.even ? NULL : bucket_counts, &cc, (int)g,
                          b.sent, what);
    if (s == DT_OK) {
        pl->anchor[pl->n] = from;
        pl->replace[pl->n++] = false;
    }
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step st = p->steps[mem[j]];
        gcopy_ctx c = {.st = &st,
                       .g = g,
                       .flat_at = at,
                       .rank = rank,
                       .first_local = m->first_local,
                       .nlocal = nl};
        s = dt__emit_kernel(p, "bucket", DT__K_COPY_BLOCKS, first.dtype, 1, &recv, st.out, m,
                            gcopy_args, &c);
        if (s == DT_OK && c.nomem)
            s = dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
        pl->anchor[pl->n] = mem[j];
        pl->replace[pl->n++] = true;
        for (int i = 0; i < nl; i++)
            for (int64_t q = 0; q < g; q++)
                at[i * g + q] += count_of(&st, i, q);
    }
    geom_free(&b);
    return s;
}

/* The first step after step k that reads or writes slot (n0: none). */
static int first_use(const dt__program *p, int n0, int k, int slot)
{
    int r = k + 1;
    while (r < n0 && !uses(&p->steps[r], slot))
        r++;
    return r;
}

/* The slots step st writes: its output, and the results a fused step stores beside it. */
static void mark_writes(const dt__step *st, int at, int last_write[])
{
    last_write[st->out] = at;
    if (st->kind == DT__STEP_KERNEL && st->kernel == DT__K_FUSED && st->fused)
        for (int j = st->fused->nin; j < st->nin; j++)
            last_write[st->in[j]] = at;
}

/* A bucket of all-gathers: members mem[start .. start + n), its copies in before step from. */
typedef struct gather_run {
    int start, n, from;
} gather_run;

static dt_status bucket_gathers(dt__program *p, size_t cap)
{
    int n0 = p->nsteps;
    int *mem = calloc((size_t)n0 + 1, sizeof *mem);
    gather_run *runs = calloc((size_t)n0 + 1, sizeof *runs);
    int *last_write = malloc(sizeof *last_write * ((size_t)p->nslots + 1));
    if (!mem || !runs || !last_write) {
        free(mem);
        free(runs);
        free(last_write);
        return dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    }
    for (int k = 0; k < p->nslots; k++)
        last_write[k] = -1;
    /* the open run: members mem[nm - open ..], their gathered bytes, where its copies in may
     * go at the earliest (after its operands' writers and, so that gathers run at most two
     * at once as the overlap schedule has them, not before the previous gather's first
     * reader or the previous bucket's first copy out) */
    int nm = 0, nr = 0, open = 0, from = 0, release = 0;
    int passed = 0; /* the first readers of other all-gathers since the run opened, the last */
    /* a bucket holds at most what the largest all-gather of the program holds anyway, or
     * DT__GATHER_SMALL (all-gathers that small cost their fixed costs, not their memory) */
    size_t bytes = 0, limit = DT__GATHER_SMALL;
    for (int i = 0; i < n0; i++) {
        int64_t g = gather_members(&p->steps[i]);
        size_t b = g ? gathered_bytes(&p->steps[i], g) : 0;
        limit = b > limit ? b : limit;
    }
    limit = limit < cap ? limit : cap;
    for (int i = 0; i <= n0; i++) {
        const dt__step *st = i < n0 ? &p->steps[i] : NULL;
        bool gathers = st && st->kind == DT__STEP_COLL && st->coll == DT__COLL_ALL_GATHER;
        /* members gather the program's inputs (a fully sharded model's parameters), not
         * activations: those a tensor-parallel program gathers where it needs them, and
         * gathered earlier they would be held longer */
        int64_t g = gathers && p->slots[st->in[0]].input >= 0 ? gather_members(st) : 0;
        if (open && gathers && !g) {
            /* another all-gather (an activation's) leaves the run open; the next run starts
             * after its first reader too */
            int r = first_use(p, n0, i, st->out);
            passed = passed > r ? passed : r;
        } else if (open && (!st || g)) {
            const dt__step *f = &p->steps[mem[nm - open]];
            bool joins = g && f->mesh == st->mesh && group_axes(f) == group_axes(st) &&
                         f->dtype == st->dtype && gather_members(f) == g &&
                         last_write[st->in[0]] < mem[nm - open] &&
                         bytes + gathered_bytes(st, g) <= limit;
            /* an input gathered again (a result marked recompute, gathered anew in backward)
             * starts a bucket of its own: one bucket would gather it twice, early */
            for (int k = nm - open; joins && k < nm; k++)
                joins = p->steps[mem[k]].in[0] != st->in[0];
            if (joins) {
                mem[nm++] = i;
                open++;
                bytes += gathered_bytes(st, g);
                from = from > last_write[st->in[0]] + 1 ? from : last_write[st->in[0]] + 1;
                mark_writes(st, i, last_write);
                continue;
            }
            /* close the open run: kept with two members or more */
            if (open >= 2) {
                runs[nr++] = (gather_run){.start = nm - open, .n = open, .from = from};
                release = mem[nm - open];
            } else {
                nm--;
                release = first_use(p, n0, mem[nm], p->steps[mem[nm]].out);
            }
            release = release > passed ? release : passed;
            open = 0;
        }
        if (!st)
            break;
        if (g) {
            mem[nm++] = i;
            open = 1;
            passed = 0;
            bytes = gathered_bytes(st, g);
            from = release > last_write[st->in[0]] + 1 ? release : last_write[st->in[0]] + 1;
            from = from < i ? from : i;
        } else if (gathers && !open) {
            release = first_use(p, n0, i, st->out);
        }
        mark_writes(st, i, last_write);
    }
    free(last_write);
    dt_status s = DT_OK;
    if (nr) {
        placing pl;
        s = placing_new(&pl, 2 * nm + nr);
        for (int r = 0; s == DT_OK && r < nr; r++)
            s = emit_gather_bucket(p, &pl, mem + runs[r].start, runs[r].n, runs[r].from,
                                   gather_members(&p->steps[mem[runs[r].start]]));
        if (s == DT_OK)
            s = rebuild(p, n0, mem, nm, &pl);
        placing_free(&pl);
    }
    free(mem);
    free(runs);
    return s;
}

dt_status dt__program_bucket(dt__program *p, size_t cap)
{
    if (!cap)
        return DT_OK;
    DT_TRY(bucket_reductions(p, cap));
    return bucket_gathers(p, cap);
}
