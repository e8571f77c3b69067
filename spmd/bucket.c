/* Gradient buckets: runs of all-reduces (or of reduce-scatters) merged into one collective
 * of a flat buffer.
 *
 * A backward pass emits one all-reduce per parameter gradient under data parallel (one
 * reduce-scatter under the fully sharded preset), and each pays a collective's fixed costs (a
 * start on every client, message latencies) on a few kilobytes to megabytes. This pass, run on
 * a traced function's program before the overlap schedule, groups them as PyTorch DDP's
 * buckets do. A collective in its even form (one count on every device, whole slots) joins
 * the open bucket when it has the bucket's kind, mesh, groups (its mesh axes but those of
 * size 1), dtype and reduction and no step since the bucket opened has read or written the
 * result of a member; the bucket closes when its bytes reach the cap (DTENSOR_BUCKET_MB; at
 * most 1 MiB for the first bucket), at a step touching a member's result, or at a collective
 * of its kind it cannot take. A bucket of two or more members becomes:
 *   - at each member's place, a copy of its operand into a flat temporary: for a
 *     reduce-scatter over g devices the flat buffer is g blocks (one per group member, in the
 *     order the collective hands them out), each holding that member's block of every
 *     operand at a fixed offset, so that one reduce-scatter leaves each device its blocks;
 *   - after the last of them, ONE collective of the flat buffer (an all-reduce in place);
 *   - before the first later step that reads or writes a member's result or the next
 *     collective of the program (or at its end), whichever comes first, a copy of the
 *     member's block of the flat result into that result.
 * The overlap schedule then starts the bucket's collective as soon as its last operand is
 * copied in, while backward goes on, and waits for it at the first copy out. The flat buffer
 * is memory the program without buckets does not take (there a gradient's all-reduce runs in
 * place in its result); copying out no later than the next collective keeps it alive only
 * from the bucket's first member to shortly after its last, not until the end of the program
 * (where a step's memory peaks when the gradients are its results). Every element is reduced
 * over the same terms as before, so the result differs at most in the order the collective
 * adds them (none at two devices). The pass is a pure function of the program and
 * the cap, so every client buckets alike and starts the same collectives in the same order. */
#include "engine.h"

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
 * all-reduce or a reduce-scatter in the even form over whole slots (a reduce-scatter's
 * operand holds the count once per member, in member order). From the program alone, the
 * same on every client. */
static int64_t bucket_members(const dt__step *st)
{
    if (st->kind != DT__STEP_COLL || st->counts || st->boxes || st->at || st->count <= 0)
        return 0;
    if (st->coll == DT__COLL_ALL_REDUCE)
        return 1;
    if (st->coll != DT__COLL_REDUCE_SCATTER)
        return 0;
    int64_t g = 1;
    for (int a = 0; a < st->mesh->num_axes; a++)
        if (st->axes & (1u << a))
            g *= st->mesh->sizes[a];
    return g;
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

static bool uses(const dt__step *st, int slot)
{
    if (st->out == slot)
        return true;
    for (int j = 0; j < st->nin; j++)
        if (st->in[j] == slot)
            return true;
    return false;
}

static bool touches(const dt__step *st, const bool held[])
{
    if (held[st->out])
        return true;
    for (int j = 0; j < st->nin; j++)
        if (held[st->in[j]])
            return true;
    return false;
}

/* A copy between a member's slot and the flat one: in (pack), g blocks of `count` elements
 * into blocks of `total` at offset `at` of each; out, `count` elements at `at`. */
typedef struct copy_ctx {
    int64_t g, count, total, at;
    bool pack;
    bool nomem;
} copy_ctx;

static void copy_args(void *ctx, int device, dt__kargs *k)
{
    (void)device;
    copy_ctx *c = ctx;
    k->rank = 1;
    k->shape[0] = c->pack ? c->g * c->count : c->count;
    k->blocks = calloc(1, sizeof *k->blocks);
    if (!k->blocks) {
        c->nomem = true;
        return;
    }
    k->nblocks = 1;
    dt__block *b = k->blocks;
    b->rank = 2;
    b->extent[0] = b->src_shape[0] = b->dst_shape[0] = c->pack ? c->g : 1;
    b->extent[1] = c->count;
    b->src_shape[1] = c->pack ? c->count : c->total;
    b->src_off[1] = c->pack ? 0 : c->at;
    b->dst_shape[1] = c->pack ? c->total : c->count;
    b->dst_off[1] = c->pack ? c->at : 0;
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

/* Emit a bucket's steps (at the end of p, placed by pl): members mem[0..n) of the original
 * steps, each over g group members; its results are copied out before original step `until`
 * at the latest (the next collective, or the original step count: the end). */
static dt_status emit_bucket(dt__program *p, placing *pl, const int mem[], int n, int until,
                             int64_t g)
{
    const dt__step first = p->steps[mem[0]]; /* a copy: emitting moves the array */
    const dt_mesh *m = first.mesh;
    bool ar = first.coll == DT__COLL_ALL_REDUCE;
    int64_t total = 0;
    double sent = 0;
    for (int j = 0; j < n; j++) {
        total += p->steps[mem[j]].count;
        sent += p->steps[mem[j]].bytes_max;
    }
    int64_t *elems = calloc((size_t)m->num_local + 1, sizeof *elems);
    if (!elems)
        return dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    for (int i = 0; i < m->num_local; i++)
        elems[i] = g * total;
    int flat, res;
    dt_status s = dt__slot_new_elems(p, m, first.dtype, elems, &flat);
    res = flat;
    for (int i = 0; i < m->num_local; i++)
        elems[i] = total;
    if (s == DT_OK && !ar)
        s = dt__slot_new_elems(p, m, first.dtype, elems, &res);
    free(elems);
    int64_t at = 0;
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step *st = &p->steps[mem[j]];
        copy_ctx c = {.g = g, .count = st->count, .total = total, .at = at, .pack = true};
        at += st->count;
        s = emit_copy(p, pl, mem[j], true, st->in[0], flat, m, first.dtype, &c);
    }
    char what[96];
    snprintf(what, sizeof what, "bucket of %d %s, %lld elements", n,
             ar ? "all-reduces" : "reduce-scatters", (long long)total);
    if (s == DT_OK)
        s = dt__emit_coll(p, "bucket", first.coll, first.dtype, first.op, first.axes, flat, res,
                          total, NULL, NULL, 0, sent, what);
    if (s == DT_OK) {
        pl->anchor[pl->n] = mem[n - 1];
        pl->replace[pl->n++] = true;
    }
    at = 0;
    for (int j = 0; s == DT_OK && j < n; j++) {
        const dt__step *st = &p->steps[mem[j]];
        int out = st->out;
        copy_ctx c = {.g = g, .count = st->count, .total = total, .at = at};
        at += st->count;
        int anchor = mem[n - 1] + 1; /* the first later step touching the result */
        while (anchor < until && !uses(&p->steps[anchor], out))
            anchor++;
        s = emit_copy(p, pl, anchor, false, res, out, m, first.dtype, &c);
    }
    return s;
}

/* Close the open bucket mem[open .. *nm): kept when it has two members or more (bk gets its
 * start and size), dropped otherwise; its results are no longer held. */
static void close_bucket(const dt__program *p, int mem[], int open, int *nm, bool held[],
                         int bk[][2], int *nb)
{
    int n = *nm - open;
    for (int k = open; k < *nm; k++)
        held[p->steps[mem[k]].out] = false;
    if (n >= 2) {
        bk[*nb][0] = open;
        bk[(*nb)++][1] = n;
    } else
        *nm = open;
}

dt_status dt__program_bucket(dt__program *p, size_t cap)
{
    int n0 = p->nsteps;
    if (!cap || n0 < 2)
        return DT_OK;
    int *mem = calloc((size_t)n0, sizeof *mem);
    int(*bk)[2] = calloc((size_t)n0, sizeof *bk);
    bool *held = calloc((size_t)p->nslots, sizeof *held);
    if (!mem || !bk || !held) {
        free(mem);
        free(bk);
        free(held);
        return dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    }
    /* the buckets, in program order */
    int nm = 0, nb = 0, open = 0;
    size_t bytes = 0;
    for (int i = 0; i < n0; i++) {
        const dt__step *st = &p->steps[i];
        if (nm > open && touches(st, held)) {
            close_bucket(p, mem, open, &nm, held, bk, &nb);
            open = nm;
            bytes = 0;
        }
        int64_t g = bucket_members(st);
        if (!g)
            continue;
        if (nm > open) {
            const dt__step *f = &p->steps[mem[open]];
            if (f->coll != st->coll || f->mesh != st->mesh || group_axes(f) != group_axes(st) ||
                f->dtype != st->dtype || f->op != st->op || bucket_members(f) != g) {
                close_bucket(p, mem, open, &nm, held, bk, &nb);
                open = nm;
                bytes = 0;
            }
        }
        mem[nm++] = i;
        held[st->out] = true;
        bytes += (size_t)(g * st->count) * dt_dtype_size(st->dtype); /* the operand's */
        if (bytes >= (nb == 0 && cap > DT__BUCKET_FIRST ? DT__BUCKET_FIRST : cap)) {
            close_bucket(p, mem, open, &nm, held, bk, &nb);
            open = nm;
            bytes = 0;
        }
    }
    if (nm > open)
        close_bucket(p, mem, open, &nm, held, bk, &nb);
    free(held);
    if (!nb) {
        free(mem);
        free(bk);
        return DT_OK;
    }
    /* each bucket's steps at the end of p, then every step moved to its place */
    int nnew = 2 * nm + nb;
    placing pl = {.anchor = calloc((size_t)nnew, sizeof *pl.anchor),
                  .next = calloc((size_t)nnew, sizeof *pl.next),
                  .replace = calloc((size_t)nnew, sizeof *pl.replace)};
    int *head = calloc((size_t)n0 + 1, sizeof *head), *tail = calloc((size_t)n0 + 1, sizeof *tail);
    bool *member = calloc((size_t)n0, sizeof *member);
    dt__step *steps = calloc((size_t)(n0 - nm + nnew), sizeof *steps);
    dt_status s = pl.anchor && pl.next && pl.replace && head && tail && member && steps
                      ? DT_OK
                      : dt__fail(DT_ERR_NOMEM, "bucket: out of memory");
    for (int b = 0; s == DT_OK && b < nb; b++) {
        int until = mem[bk[b][0] + bk[b][1] - 1] + 1; /* the next collective */
        while (until < n0 && p->steps[until].kind != DT__STEP_COLL)
            until++;
        s = emit_bucket(p, &pl, mem + bk[b][0], bk[b][1], until,
                        bucket_members(&p->steps[mem[bk[b][0]]]));
    }
    if (s == DT_OK) {
        for (int k = 0; k < nm; k++)
            member[mem[k]] = true;
        for (int i = 0; i <= n0; i++)
            head[i] = tail[i] = -1;
        for (int x = 0; x < pl.n; x++) {
            int a = pl.anchor[x];
            pl.next[x] = -1;
            if (tail[a] >= 0)
                pl.next[tail[a]] = x;
            else
                head[a] = x;
            tail[a] = x;
        }
        /* a member's place holds its replacements; the steps before an anchor precede them */
        int k = 0;
        for (int i = 0; i <= n0; i++) {
            for (int x = head[i]; x >= 0; x = pl.next[x])
                if (!pl.replace[x])
                    steps[k++] = p->steps[n0 + x];
            if (i == n0)
                break;
            if (!member[i])
                steps[k++] = p->steps[i];
            for (int x = head[i]; member[i] && x >= 0; x = pl.next[x])
                if (pl.replace[x])
                    steps[k++] = p->steps[n0 + x];
        }
        /* the members own nothing (no counts, boxes or offsets) */
        free(p->steps);
        p->steps = steps;
        p->nsteps = p->cap_steps = k;
        steps = NULL;
    }
    free(steps);
    free(pl.anchor);
    free(pl.next);
    free(pl.replace);
    free(head);
    free(tail);
    free(member);
    free(mem);
    free(bk);
    return s;
}
