/* Elementwise fusion of a traced function's program (ARCHITECTURE.md "Elementwise fusion").
 *
 * After expansion, each chain of elementwise kernel steps (unary, binary, cast, where, and the
 * fills of their constants) whose intermediate results nothing else reads becomes one FUSED
 * step: the backend computes the chain in one pass over the output (common/kernels.h), and the
 * intermediates are never written to memory. The pass works on the program, not on the graph
 * of global ops: a backend never sees a global op, gradients are expanded before it runs (so a
 * fused chain's gradient is just another program to fuse), and every step it merges already
 * has its per-device shapes. Each op of a fused step is the kernel it replaces, with that
 * kernel's arguments and dtypes, so the result is bitwise the unfused one.
 *
 * A producer step P joins the group of a later step C that reads its result t when:
 *   - t is bound to no program input, written by P alone, and every step that reads it is in
 *     C's group or runs after C; when t is a program output (Adam's new moments, which its new
 *     value reads) or read after C (the pre-activation of bias + GELU, which the gradient
 *     reads), the fused step writes it too, in its one pass (dt__fused.store), t then being of
 *     the reader's output shape (below); so must every value of P's group read outside it;
 *   - P and C run on the same mesh;
 *   - t has, as P made it and as each reader reads it, the rank and shape of the reader's
 *     output on every device (an element of t is used where it is made: not through a
 *     reshape, which shares the slot), or P is a fill whose every reader broadcasts its one
 *     element (a constant);
 *   - no step between P's group and C writes a slot P's group reads (the fused step reads its
 *     operands where C ran);
 *   - the merged group keeps within DT__FUSED_MAX_OPS ops and DT__FUSED_MAX_IN operands and
 *     stored results together.
 * Groups grow until nothing changes (a value read twice inside one chain joins once both
 * readers have), first with no value read outside its group, then with values read after it
 * (so that such a value does not pull a producer into the first of its readers' chains and cut
 * a chain that would have been one pass, as Adam's update is). Then a group whose result t a
 * reduction R reads (sum, mean, max or min of a float, on a backend whose FUSED entry takes
 * reductions), and no other step before R, ends in R, on the same conditions with t of R's input
 * shape on every device: the fused step evaluates the chain and reduces it, t never written (unless
 * it is a program output or read after R, as a bias's gradient chain is by its gemms: then stored).
 * The local reduction of a sharded axis is what fuses; its collective stays. The fused step takes
 * C's (or R's) place; the other members are removed. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

typedef struct fuser {
    dt__program *p;
    int *root;    /* per step: the last step of its group, or -1 (not fusable) */
    int *nwrite;  /* per slot: steps writing it */
    int *writer;  /* per slot: the step writing it (when nwrite is 1) */
    bool *scalar; /* per step: a fill read as one broadcast element */
    int *vals;    /* scratch: per slot, its value number while a group is built */
    bool later;   /* values read after the group may join it (written out) */
} fuser;

static bool fusable_kernel(dt__kernel k)
{
    return k == DT__K_UNARY || k == DT__K_BINARY || k == DT__K_CAST || k == DT__K_WHERE ||
           k == DT__K_FILL;
}

/* The dtype a kernel step's result has (comparisons write bool; the others the table's). */
static dt_dtype out_dtype(const dt__step *st)
{
    return st->kernel == DT__K_BINARY && DT__BINARY_IS_COMPARISON(st->args[0].op) ? DT_DTYPE_BOOL
                                                                                  : st->dtype;
}

/* Operand q of kernel step st on local device d, aligned to the step's rank. */
static void operand_shape(const dt__step *st, int q, int d, int64_t s[DT_MAX_RANK])
{
    const dt__kargs *k = &st->args[d];
    const int64_t *from = st->kernel == DT__K_UNARY ? k->shape : k->in_shape[q];
    for (int i = 0; i < DT_MAX_RANK; i++)
        s[i] = i < k->rank ? from[i] : 1;
}

/* Whether operand position q of a kernel can be one element broadcast over the output. */
static bool broadcasts(const dt__step *st, int q)
{
    return st->kernel == DT__K_BINARY || st->kernel == DT__K_WHERE ||
           (st->kernel == DT__K_CAST && q == 0);
}

static bool all_ones(int rank, const int64_t s[])
{
    for (int i = 0; i < rank; i++)
        if (s[i] != 1)
            return false;
    return true;
}

static bool same_shape(int rank, const int64_t a[], const int64_t b[])
{
    return memcmp(a, b, sizeof(int64_t) * (size_t)rank) == 0;
}

static int group_ops(const fuser *f, int r)
{
    int n = 0;
    for (int i = 0; i <= r; i++)
        n += f->root[i] == r;
    return n;
}

/* The first step of r's group. */
static int group_first(const fuser *f, int r)
{
    int i = 0;
    while (f->root[i] != r)
        i++;
    return i;
}

static bool reads(const dt__step *st, int slot)
{
    for (int q = 0; q < st->nin; q++)
        if (st->in[q] == slot)
            return true;
    return false;
}

/* Whether the result of step w (in group r) is written out by the group: a program output, or
 * read by a step outside the group. */
static bool written_out(const fuser *f, int w, int r)
{
    const dt__program *p = f->p;
    int t = p->steps[w].out;
    if (p->slots[t].output >= 0)
        return true;
    for (int j = w + 1; j < p->nsteps; j++)
        if (f->root[j] != r && j != r && reads(&p->steps[j], t))
            return true;
    return false;
}

/* Members of r's group other than r whose result it writes out (the results it stores beside
 * its own). */
static int group_stores(const fuser *f, int r)
{
    int n = 0;
    for (int i = 0; i < r; i++)
        n += f->root[i] == r && written_out(f, i, r);
    return n;
}

/* Whether every step outside groups P and C (C itself inside) that reads a value of P's group
 * runs after C, where the merged group writes such values out; *any: P's result has such a
 * reader. */
static bool outside_after(const fuser *f, int P, int C, bool *any)
{
    const dt__program *p = f->p;
    *any = false;
    for (int i = group_first(f, P); i <= P; i++) {
        if (f->root[i] != P)
            continue;
        int t = p->steps[i].out;
        for (int j = i + 1; j < p->nsteps; j++) {
            if (j == C || f->root[j] == P || f->root[j] == C || !reads(&p->steps[j], t))
                continue;
            if (j < C || !f->later)
                return false;
            *any = *any || i == P;
        }
    }
    return true;
}

/* Slots the groups ra and rb read from outside both (their operands once merged). */
static int merged_leaves(const fuser *f, int ra, int rb)
{
    const dt__program *p = f->p;
    int leaves[2 * DT__FUSED_MAX_OPS * 3], n = 0;
    for (int i = 0; i <= rb; i++) {
        if (f->root[i] != ra && f->root[i] != rb)
            continue;
        const dt__step *st = &p->steps[i];
        for (int q = 0; q < st->nin; q++) {
            int s = st->in[q], w = f->nwrite[s] == 1 ? f->writer[s] : -1;
            if (w >= 0 && (f->root[w] == ra || f->root[w] == rb))
                continue; /* made inside */
            bool seen = false;
            for (int j = 0; j < n; j++)
                seen = seen || leaves[j] == s;
            if (!seen)
                leaves[n++] = s;
        }
    }
    return n;
}

/* The slots P's group reads are not written again by another group's step before step `upto`
 * (where the group would run once merged). */
static bool inputs_kept(const fuser *f, int P, int upto)
{
    const dt__program *p = f->p;
    for (int i = group_first(f, P); i <= P; i++) {
        if (f->root[i] != P)
            continue;
        const dt__step *st = &p->steps[i];
        for (int q = 0; q < st->nin; q++)
            for (int j = i + 1; j <= upto; j++)
                if (f->root[j] != P && p->steps[j].out == st->in[q])
                    return false;
    }
    return true;
}

/* Can the group ending at P join the group of C (a later root) through t, P's result? Sets
 * f->scalar[P] for a fill read as a constant. */
static bool can_merge(fuser *f, int P, int C)
{
    const dt__program *p = f->p;
    const dt__step *ps = &p->steps[P], *cs = &p->steps[C];
    int t = ps->out;
    const dt__slot *sl = &p->slots[t];
    if (sl->input >= 0 || f->nwrite[t] != 1 || ps->mesh != cs->mesh)
        return false;
    /* every reader in C's group or after C (t then written out); t as each reader in the group
     * reads it of that reader's output shape, or (a fill) one element */
    bool outside, full = true, scalar = ps->kernel == DT__K_FILL;
    if (!outside_after(f, P, C, &outside))
        return false;
    for (int j = P + 1; j < p->nsteps; j++) {
        const dt__step *rs = &p->steps[j];
        if (!reads(rs, t) || f->root[j] != C)
            continue;
        for (int q = 0; q < rs->nin; q++) {
            if (rs->in[q] != t)
                continue;
            for (int d = 0; d < rs->nlocal; d++) {
                int64_t s[DT_MAX_RANK];
                operand_shape(rs, q, d, s);
                full = full && ps->args[d].rank == rs->args[d].rank &&
                       same_shape(rs->args[d].rank, s, rs->args[d].shape) &&
                       same_shape(rs->args[d].rank, ps->args[d].shape, s);
                scalar = scalar && broadcasts(rs, q) && all_ones(rs->args[d].rank, s) &&
                         dt__num_elements(ps->args[d].rank, ps->args[d].shape) == 1;
            }
        }
    }
    bool stored = sl->output >= 0 || outside; /* written out whole: not as a constant */
    scalar = scalar && !stored;
    if (!full && !scalar)
        return false;
    if (group_ops(f, P) + group_ops(f, C) > DT__FUSED_MAX_OPS ||
        merged_leaves(f, P, C) + group_stores(f, P) + stored + group_stores(f, C) >
            DT__FUSED_MAX_IN)
        return false;
    if (!inputs_kept(f, P, C))
        return false;
    f->scalar[P] = scalar;
    return true;
}

/* Whether kernel step st is a reduction a fused chain can end in. */
static bool fusable_reduce(const dt__step *st)
{
    if (st->kind != DT__STEP_KERNEL || st->kernel != DT__K_REDUCE || st->nlocal < 1)
        return false;
    const dt__backend *be = dt__backend_of(st->mesh->type);
    int op = st->args[0].op;
    bool fl = st->dtype == DT_DTYPE_F32 || st->dtype == DT_DTYPE_F64 ||
              st->dtype == DT_DTYPE_BF16 || st->dtype == DT_DTYPE_F16;
    return fl && be && be->fused_reduce &&
           (op == DT_REDUCE_SUM || op == DT_REDUCE_MEAN || op == DT_REDUCE_MAX ||
            op == DT_REDUCE_MIN);
}

/* Can the group ending at P end in the reduction R, which reads t, P's result? */
static bool can_merge_reduce(const fuser *f, int P, int R)
{
    const dt__program *p = f->p;
    const dt__step *ps = &p->steps[P], *rs = &p->steps[R];
    int t = ps->out;
    const dt__slot *sl = &p->slots[t];
    if (sl->input >= 0 || f->nwrite[t] != 1 || ps->mesh != rs->mesh || ps->kernel == DT__K_FILL ||
        out_dtype(ps) != rs->dtype)
        return false;
    bool outside; /* t read after R too: then written out */
    if (!outside_after(f, P, R, &outside))
        return false;
    for (int d = 0; d < rs->nlocal; d++)
        if (ps->args[d].rank != rs->args[d].rank ||
            !same_shape(rs->args[d].rank, ps->args[d].shape, rs->args[d].in_shape[0]))
            return false;
    if (merged_leaves(f, P, P) + group_stores(f, P) + (sl->output >= 0 || outside) >
        DT__FUSED_MAX_IN)
        return false;
    return inputs_kept(f, P, R);
}

/* The name of an op's value for the printed chain: its expression, written in place when one
 * reader uses it (else named tN and written once before). */
static size_t put(char *buf, size_t size, size_t n, const char *fmt, const char *s)
{
    return n + (size_t)snprintf(buf + n, n < size ? size - n : 0, fmt, s);
}

static size_t expr_text(const dt__fused *fz, const dt__kargs *k, const int *uses, int v, char *buf,
                        size_t size, size_t n)
{
    char tmp[DT__SHAPE_STR_MAX + 16];
    if (v < fz->nin) {
        snprintf(tmp, sizeof tmp, "x%d", v);
        n = put(buf, size, n, "%s", tmp);
        if (!same_shape(k->rank, k->in_shape[v], k->shape))
            n = put(buf, size, n, "%s", dt__shape_str(tmp, sizeof tmp, k->rank, k->in_shape[v]));
        return n;
    }
    int j = v - fz->nin;
    const dt__fused_op *o = &fz->ops[j];
    if (uses[v] > 1 && (j != fz->nops - 1 || fz->reduce)) { /* a reduced value if stored */
        snprintf(tmp, sizeof tmp, "t%d", j);
        return put(buf, size, n, "%s", tmp);
    }
    switch (o->kernel) {
    case DT__K_FILL:
        snprintf(tmp, sizeof tmp, "%.9g", o->a);
        return put(buf, size, n, "%s", tmp);
    case DT__K_UNARY:
        n = put(buf, size, n, "%s(", dt_unary_op_name((dt_unary_op)o->op));
        break;
    case DT__K_BINARY:
        n = put(buf, size, n, "%s(", dt_binary_op_name((dt_binary_op)o->op));
        break;
    case DT__K_CAST:
        n = put(buf, size, n, "cast_%s(", dt_dtype_name(o->out));
        break;
    default:
        n = put(buf, size, n, "%s", "where(");
        break;
    }
    for (int q = 0; q < o->nin; q++) {
        if (q)
            n = put(buf, size, n, "%s", ", ");
        n = expr_text(fz, k, uses, o->arg[q], buf, size, n);
    }
    return put(buf, size, n, "%s", ")");
}

/* The printed line: "fused f32 local [8,16,256], 3 kernels: gelu(add(x0, x1[1,1,256]))", with
 * values read more than once or written out named first ("t2 = ...; ", "t3 = ... -> x4; " for
 * the value written to the step's slot x4); a chain ending in a reduction wraps it and names
 * the reduced shape: "sum(square(x0)) -> [1,1]". */
static void fused_text(const dt__fused *fz, dt_dtype dtype, const dt__kargs *k, char *buf,
                       size_t size)
{
    int uses[DT__FUSED_MAX_IN + DT__FUSED_MAX_OPS] = {0}, to[DT__FUSED_MAX_IN + DT__FUSED_MAX_OPS];
    for (int j = 0; j < fz->nops; j++)
        for (int q = 0; q < fz->ops[j].nin; q++)
            uses[fz->ops[j].arg[q]]++;
    for (int v = 0; v < fz->nin + fz->nops; v++)
        to[v] = -1;
    for (int e = 0; e < fz->nstore; e++) {
        to[fz->store[e]] = fz->nin + e;
        uses[fz->store[e]] += 2; /* named */
    }
    char sh[DT__SHAPE_STR_MAX];
    size_t n =
        (size_t)snprintf(buf, size, "fused %s local %s, %d kernels: ", dt_dtype_name(dtype),
                         dt__shape_str(sh, sizeof sh, k->rank, k->shape), fz->nops + fz->reduce);
    for (int j = 0; j < fz->nops - !fz->reduce; j++) {
        int v = fz->nin + j;
        if (uses[v] < 2)
            continue;
        char name[16];
        snprintf(name, sizeof name, "t%d = ", j);
        n = put(buf, size, n, "%s", name);
        int was = uses[v];
        uses[v] = 1; /* write the expression itself */
        n = expr_text(fz, k, uses, v, buf, size, n);
        uses[v] = was;
        if (to[v] >= 0) {
            snprintf(name, sizeof name, " -> x%d", to[v]);
            n = put(buf, size, n, "%s", name);
        }
        n = put(buf, size, n, "%s", "; ");
    }
    if (fz->reduce)
        n = put(buf, size, n, "%s(", dt_reduce_op_name((dt_reduce_op)fz->rop));
    n = expr_text(fz, k, uses, fz->nin + fz->nops - 1, buf, size, n);
    if (fz->reduce) {
        int64_t rs[DT_MAX_RANK];
        for (int i = 0; i < k->rank; i++)
            rs[i] = k->mask & (1u << i) ? 1 : k->shape[i];
        n = put(buf, size, n, ") -> %s", dt__shape_str(sh, sizeof sh, k->rank, rs));
    }
    if (size > 4 && strlen(buf) == size - 1)
        memcpy(buf + size - 4, "...", 4);
}

/* Replace the group ending at r (2 or more steps; r may be a reduction ending it) by one FUSED
 * step at r; the other members are marked for removal (root -2). */
static dt_status build(fuser *f, int r)
{
    dt__program *p = f->p;
    dt__step *rs = &p->steps[r];
    int nl = rs->nlocal;
    dt__fused *fz = calloc(1, sizeof *fz);
    dt__kargs *args = calloc((size_t)nl + 1, sizeof *args);
    if (!fz || !args) {
        free(fz);
        free(args);
        return dt__fail(DT_ERR_NOMEM, "fusion: out of memory");
    }
    int leaves[DT__FUSED_MAX_IN],
        lfrom[DT__FUSED_MAX_IN][2]; /* slot; a (step, operand) reading it */
    int members[DT__FUSED_MAX_OPS], nm = 0;
    for (int i = 0; i <= r; i++)
        if (f->root[i] == r)
            members[nm++] = i;
    bool red = rs->kernel == DT__K_REDUCE;
    int nops = nm - red; /* the ops: the members but a reduction */
    /* operands first (in the order first read), then one value per member */
    for (int m = 0; m < nm; m++) {
        const dt__step *st = &p->steps[members[m]];
        for (int q = 0; q < st->nin; q++) {
            int s = st->in[q], w = f->nwrite[s] == 1 ? f->writer[s] : -1;
            if ((w >= 0 && f->root[w] == r) || f->vals[s] >= 0)
                continue;
            f->vals[s] = fz->nin;
            leaves[fz->nin] = s;
            lfrom[fz->nin][0] = members[m];
            lfrom[fz->nin][1] = q;
            fz->nin++;
        }
    }
    double work = red ? rs->work : 0;
    for (int m = 0; m < nops; m++) {
        const dt__step *st = &p->steps[members[m]];
        const dt__kargs *k = &st->args[0];
        dt__fused_op *o = &fz->ops[m];
        o->kernel = st->kernel;
        o->dtype = st->dtype;
        o->out = out_dtype(st);
        o->from = k->from;
        o->op = k->op;
        o->a = k->a;
        o->scalar = st->kernel == DT__K_FILL && f->scalar[members[m]];
        o->nin = st->nin;
        for (int q = 0; q < st->nin; q++)
            o->arg[q] = f->vals[st->in[q]];
        f->vals[st->out] = fz->nin + m;
        work += st->work;
        /* a member's result that is a program output or read outside the group is written out
         * too, after the operands */
        if (members[m] != r && written_out(f, members[m], r)) {
            fz->store[fz->nstore] = fz->nin + m;
            leaves[fz->nin + fz->nstore++] = st->out;
        }
    }
    fz->nops = nops;
    fz->reduce = red;
    fz->rop = red ? rs->args[0].op : 0;
    /* each device: the output's shape, each operand's as it is read, aligned to the output */
    for (int d = 0; d < nl; d++) {
        dt__kargs *k = &args[d];
        const dt__kargs *ro = &rs->args[d];
        k->rank = ro->rank;
        /* a reduction: the chain's shape, its reduced axes and scale */
        memcpy(k->shape, red ? ro->in_shape[0] : ro->shape, sizeof k->shape);
        k->mask = red ? ro->mask : 0;
        k->a = red ? ro->a : 0;
        memcpy(k->offset, ro->offset, sizeof k->offset);
        memcpy(k->gshape, ro->gshape, sizeof k->gshape);
        k->fused = fz;
        for (int q = 0; q < fz->nin; q++) {
            const dt__step *st = &p->steps[lfrom[q][0]];
            int64_t s[DT_MAX_RANK];
            operand_shape(st, lfrom[q][1], d, s);
            int off = k->rank - st->args[d].rank;
            for (int i = 0; i < k->rank; i++)
                k->in_shape[q][i] = i < off ? 1 : s[i - off];
        }
        for (int e = 0; e < fz->nstore; e++) /* the results written out: the chain's shape */
            memcpy(k->in_shape[fz->nin + e], k->shape, sizeof k->in_shape[0]);
    }
    /* the printed line from the device with the most elements */
    int busiest = 0;
    for (int d = 1; d < nl; d++)
        if (dt__num_elements(args[d].rank, args[d].shape) >
            dt__num_elements(args[busiest].rank, args[busiest].shape))
            busiest = d;
    dt__kargs shown = nl ? args[busiest] : (dt__kargs){.fused = fz};
    for (int i = 0; i < p->nslots; i++)
        f->vals[i] = -1;
    for (int m = 0; m < nm; m++) {
        dt__step *st = &p->steps[members[m]];
        for (int d = 0; d < st->nlocal; d++)
            free(st->args[d].blocks);
        free(st->args);
        st->args = NULL;
        if (members[m] != r)
            f->root[members[m]] = -2;
    }
    rs->kernel = DT__K_FUSED;
    rs->dtype = red ? rs->dtype : fz->ops[nops - 1].out;
    rs->args = args;
    rs->fused = fz;
    rs->nin = fz->nin + fz->nstore;
    for (int q = 0; q < rs->nin; q++)
        rs->in[q] = leaves[q];
    rs->work = work;
    fused_text(fz, rs->dtype, &shown, rs->text, sizeof rs->text);
    return DT_OK;
}

void dt__program_fuse(dt__program *p)
{
    int n = p->nsteps, ns = p->nslots;
    fuser f = {.p = p};
    f.root = malloc(sizeof *f.root * (size_t)(n + 1));
    f.nwrite = calloc((size_t)ns + 1, sizeof *f.nwrite);
    f.writer = malloc(sizeof *f.writer * (size_t)(ns + 1));
    f.scalar = calloc((size_t)n + 1, sizeof *f.scalar);
    f.vals = malloc(sizeof *f.vals * (size_t)(ns + 1));
    if (!f.root || !f.nwrite || !f.writer || !f.scalar || !f.vals)
        goto done; /* fusion is an optimisation: the program runs as it is */
    for (int s = 0; s < ns; s++)
        f.vals[s] = -1;
    for (int i = 0; i < n; i++) {
        const dt__step *st = &p->steps[i];
        const dt__backend *be = dt__backend_of(st->mesh->type);
        bool ok = st->kind == DT__STEP_KERNEL && fusable_kernel(st->kernel) && be && be->kernels &&
                  be->kernels[DT__K_FUSED][out_dtype(st)];
        f.root[i] = ok ? i : -1;
        f.nwrite[st->out]++;
        f.writer[st->out] = i;
    }
    /* chains whose values only they read first (one pass for Adam's update), then values read
     * after the chain too, written out (bias + GELU and its pre-activation) */
    for (int phase = 0; phase < 2; phase++) {
        f.later = phase == 1;
        for (bool changed = true; changed;) {
            changed = false;
            for (int c = 0; c < n; c++) {
                if (f.root[c] != c)
                    continue;
                for (int i = 0; i <= c; i++) {
                    if (f.root[i] != c)
                        continue;
                    const dt__step *st = &p->steps[i];
                    for (int q = 0; q < st->nin; q++) {
                        int s = st->in[q];
                        int w = f.nwrite[s] == 1 ? f.writer[s] : -1;
                        if (w < 0 || f.root[w] != w || w == c || !can_merge(&f, w, c))
                            continue;
                        for (int j = 0; j <= w; j++)
                            if (f.root[j] == w)
                                f.root[j] = c;
                        changed = true;
                    }
                }
            }
        }
    }
    /* chains that a reduction reads (and only steps after it) end in it */
    for (int r = 0; r < n; r++) {
        const dt__step *rs = &p->steps[r];
        if (!fusable_reduce(rs))
            continue;
        int t = rs->in[0], w = f.nwrite[t] == 1 ? f.writer[t] : -1;
        if (w < 0 || w >= r || f.root[w] != w || !can_merge_reduce(&f, w, r))
            continue;
        for (int j = 0; j <= w; j++)
            if (f.root[j] == w)
                f.root[j] = r;
        f.root[r] = r;
    }
    for (int r = 0; r < n; r++)
        if (f.root[r] == r && group_ops(&f, r) > 1 && build(&f, r) != DT_OK)
            break; /* out of memory: what is built stays; the rest runs unfused */
    /* drop the merged steps */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (f.root[i] == -2)
            continue;
        if (kept != i)
            p->steps[kept] = p->steps[i];
        kept++;
    }
    p->nsteps = kept;
done:
    free(f.root);
    free(f.nwrite);
    free(f.writer);
    free(f.scalar);
    free(f.vals);
}
