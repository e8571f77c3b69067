/* The graph of global ops, layout propagation, compilation into a program, the eager program
 * cache, and traced functions. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

/* ---- graph ------------------------------------------------------------------------------ */

static void graph_free(dt__graph *g)
{
    free(g->vals);
    free(g->nodes);
    free(g->inputs);
    free(g->outputs);
    memset(g, 0, sizeof *g);
}

static dt_status graph_add_val(dt__graph *g, const dt__val *v, int *id)
{
    if (g->nvals == g->cap_vals) {
        int cap = g->cap_vals ? 2 * g->cap_vals : 16;
        dt__val *n = realloc(g->vals, (size_t)cap * sizeof *n);
        if (!n)
            return dt__fail(DT_ERR_NOMEM, "graph: out of memory");
        g->vals = n;
        g->cap_vals = cap;
    }
    g->vals[g->nvals] = *v;
    *id = g->nvals++;
    return DT_OK;
}

static dt_status graph_add_input(dt__graph *g, const dt__val *v, int *id)
{
    if (g->ninputs == g->cap_inputs) {
        int cap = g->cap_inputs ? 2 * g->cap_inputs : 8;
        int *n = realloc(g->inputs, (size_t)cap * sizeof *n);
        if (!n)
            return dt__fail(DT_ERR_NOMEM, "graph: out of memory");
        g->inputs = n;
        g->cap_inputs = cap;
    }
    DT_TRY(graph_add_val(g, v, id));
    g->inputs[g->ninputs++] = *id;
    return DT_OK;
}

static dt_status check_want(const char *name, const dt__val *out, const dt_layout *want)
{
    DT_TRY(dt_layout_check(want));
    char lb[DT_STRING_MAX];
    if (want->mesh != out->mesh) {
        char ma[DT_STRING_MAX], mb[DT_STRING_MAX];
        dt_mesh_format(want->mesh, ma, sizeof ma);
        dt_mesh_format(out->mesh, mb, sizeof mb);
        return dt__fail(DT_ERR_LAYOUT,
                        "%s: requested layout \"%s\" is on %s, the result is on %s (use "
                        "dt_copy_to_mesh)",
                        name, dt__layout_str(want, lb, sizeof lb), ma, mb);
    }
    if (want->rank != out->rank) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_LAYOUT, "%s: requested layout \"%s\" has rank %d, the result %s %s",
                        name, dt__layout_str(want, lb, sizeof lb), want->rank,
                        dt_dtype_name(out->dtype),
                        dt__shape_str(sb, sizeof sb, out->rank, out->shape));
    }
    return DT_OK;
}

/* Add a node: validate (shape rule) and create its result value. */
static dt_status graph_add_node(dt__graph *g, dt__op op, const dt__attrs *attrs, int nin,
                                const int in[], const dt_layout *want, bool recompute, int *out_val)
{
    const dt__op_def *def = dt__op_get(op);
    if (nin < def->min_inputs || nin > def->max_inputs)
        return dt__fail(DT_ERR_ARG, "%s: %d operands, expected %d to %d", def->name, nin,
                        def->min_inputs, def->max_inputs);
    if (g->nnodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
        dt__node *n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n)
            return dt__fail(DT_ERR_NOMEM, "graph: out of memory");
        g->nodes = n;
        g->cap_nodes = cap;
    }
    dt__node *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->attrs = *attrs;
    n->nin = nin;
    n->recompute = recompute;
    const dt__val *ins[DT__MAX_INPUTS];
    for (int i = 0; i < nin; i++) {
        n->in[i] = in[i];
        ins[i] = &g->vals[in[i]];
    }
    for (int i = 1; i < nin && op != DT__OP_COPY_TO_MESH; i++)
        if (ins[i]->mesh != ins[0]->mesh) {
            char ma[DT_STRING_MAX], mb[DT_STRING_MAX];
            dt_mesh_format(ins[0]->mesh, ma, sizeof ma);
            dt_mesh_format(ins[i]->mesh, mb, sizeof mb);
            return dt__fail(DT_ERR_LAYOUT, "%s: operand 0 is on %s, operand %d on %s", def->name,
                            ma, i, mb);
        }
    dt__val out = {0};
    out.mesh = nin ? ins[0]->mesh : (want ? want->mesh : NULL);
    DT_TRY(def->infer(n, ins, &out));
    /* every result, whatever its shape rule, has a count of elements and of bytes that fit
     * (one_hot's depth, tile's multiples, pad's widths can make one that wraps) */
    int64_t elems = dt__num_elements(out.rank, out.shape);
    size_t es = dt_dtype_size(out.dtype);
    if (elems < 0 || (es && (uint64_t)elems > (uint64_t)INT64_MAX / es)) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(
            DT_ERR_SHAPE, "%s: the result %s %s has a negative extent or more than 2^63 bytes",
            def->name, dt_dtype_name(out.dtype), dt__shape_str(sb, sizeof sb, out.rank, out.shape));
    }
    if (op == DT__OP_COPY_TO_MESH && want)
        out.mesh = want->mesh;
    if (want) {
        DT_TRY(check_want(def->name, &out, want));
        out.has_layout = true;
        out.layout = *want;
    } else if (!out.mesh) {
        return dt__fail(DT_ERR_LAYOUT,
                        "%s: needs a requested layout (opts->layout) to name its "
                        "mesh",
                        def->name);
    }
    int id;
    DT_TRY(graph_add_val(g, &out, &id));
    g->nodes[g->nnodes].out = id; /* g->nodes may not move: vals and nodes are separate */
    g->nnodes++;
    *out_val = id;
    return DT_OK;
}

/* ---- compile: propagation, then expansion ---------------------------------------------- */

/* Expand g into a program; fuse: its repeated small steps computed once (spmd/cse.c) and its
 * elementwise chains fused steps (spmd/fuse.c);
 * bucket: its runs of all-reduces are merged up to that many bytes (spmd/bucket.c; 0: none). */
static dt_status compile(const dt__graph *g, const char *title, bool fuse, size_t bucket,
                         dt__program **out)
{
    *out = NULL;
    int nv = g->nvals;
    dt__dist *dist = calloc((size_t)nv + 1, sizeof *dist);
    bool *has_dist = calloc((size_t)nv + 1, sizeof *has_dist);
    dt_layout *want = calloc((size_t)nv + 1, sizeof *want);
    bool *has_want = calloc((size_t)nv + 1, sizeof *has_want);
    int *uses = calloc((size_t)nv + 1, sizeof *uses);
    bool *live = calloc((size_t)nv + 1, sizeof *live);
    dt__program *p = NULL;
    dt_status s = dist && has_dist && want && has_want && uses && live
                      ? dt__program_create(title, g->ninputs, g->noutputs, &p)
                      : dt__fail(DT_ERR_NOMEM, "compile: out of memory");
    if (s != DT_OK)
        goto done;
    /* Only what the outputs depend on is expanded (ops are pure): a traced function, and a
     * gradient above all, records values nothing reads (the gradient of a constant operand). */
    for (int i = 0; i < g->noutputs; i++)
        live[g->outputs[i]] = true;
    for (int i = g->nnodes - 1; i >= 0; i--)
        for (int j = 0; live[g->nodes[i].out] && j < g->nodes[i].nin; j++)
            live[g->nodes[i].in[j]] = true;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; live[g->nodes[i].out] && j < g->nodes[i].nin; j++)
            uses[g->nodes[i].in[j]] += j == 0 || !dt__op_get(g->nodes[i].op)->like_operand;
    for (int i = 0; i < g->noutputs; i++)
        uses[g->outputs[i]]++;
    bool *is_input = has_dist; /* inputs get their dist first below */

    /* Inputs: slots bound to the caller's tensors. */
    for (int i = 0; s == DT_OK && i < g->ninputs; i++) {
        const dt__val *v = &g->vals[g->inputs[i]];
        dt__dist *d = &dist[g->inputs[i]];
        s = dt__slot_new(p, &v->layout, v->dtype, v->rank, v->shape, d);
        if (s == DT_OK) {
            p->slots[d->slot].input = i;
            p->in[i] = *d;
            has_dist[g->inputs[i]] = true;
        }
    }
    if (s != DT_OK)
        goto done;

    /* Backward propagation: hard requests first, then each consumer's wish pulled into its
     * operand's producer when that operand feeds nothing else (merging producer and
     * consumer: the producer's rule then emits the cheap form, e.g. a reduce-scatter). */
    for (int v = 0; v < nv; v++)
        if (g->vals[v].has_layout && !is_input[v]) {
            want[v] = g->vals[v].layout;
            has_want[v] = true;
        }
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const dt__node *n = &g->nodes[i];
        const dt__op_def *def = dt__op_get(n->op);
        /* a recomputed result keeps its operands as they come: pulled into them, the cheap
         * operand that the gradient recomputes it from would itself become the costly one */
        if (!has_want[n->out] || !def->pull || !live[n->out] || n->recompute)
            continue;
        const dt__val *ins[DT__MAX_INPUTS];
        for (int j = 0; j < n->nin; j++)
            ins[j] = &g->vals[n->in[j]];
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (is_input[v] || has_want[v] || uses[v] != 1)
                continue;
            dt_layout w;
            if (def->pull(n, ins, &want[n->out], j, &w)) {
                want[v] = w;
                has_want[v] = true;
            }
        }
    }

    /* Forward: expand each node in order on the layouts its operands actually have. */
    for (int i = 0; s == DT_OK && i < g->nnodes; i++) {
        const dt__node *n = &g->nodes[i];
        const dt__op_def *def = dt__op_get(n->op);
        if (!live[n->out])
            continue;
        dt__dist ins[DT__MAX_INPUTS];
        for (int j = 0; j < n->nin; j++)
            ins[j] = dist[n->in[j]];
        dt__dist r;
        s = def->expand(p, n, ins, has_want[n->out] ? &want[n->out] : NULL, &r);
        if (s == DT_OK && g->vals[n->out].has_layout &&
            !dt_layout_equal(&r.layout, &g->vals[n->out].layout)) {
            char a[DT_STRING_MAX], b[DT_STRING_MAX];
            s = dt__fail(DT_ERR_LAYOUT, "%s: expansion gave \"%s\", \"%s\" was requested",
                         def->name, dt__layout_str(&r.layout, a, sizeof a),
                         dt__layout_str(&g->vals[n->out].layout, b, sizeof b));
        }
        dist[n->out] = r;
        has_dist[n->out] = true;
    }

    /* Outputs: each in a slot of its own, exactly its tensor's size, bound to no input. */
    for (int o = 0; s == DT_OK && o < g->noutputs; o++) {
        dt__dist x = dist[g->outputs[o]];
        const dt__slot *sl = &p->slots[x.slot];
        bool own = sl->input < 0 && sl->output < 0;
        for (int i = 0; own && i < sl->mesh->num_local; i++)
            own = sl->bytes[i] ==
                  (size_t)dt__local_elems(&x.layout, x.rank, x.shape, sl->mesh->first_local + i) *
                      dt_dtype_size(x.dtype);
        if (!own) {
            int64_t zero[DT_MAX_RANK] = {0};
            s = dt__emit_local_slice(p, "output", &x, &x.layout, x.rank, x.shape, zero, &x);
        }
        if (s == DT_OK) {
            p->slots[x.slot].output = o;
            p->out[o] = x;
        }
    }
    if (s == DT_OK) {
        if (fuse) {
            dt__program_cse(p);
            dt__program_fuse(p);
        }
        s = dt__program_bucket(p, bucket);
    }
    if (s == DT_OK)
        dt__program_seal(p);
done:
    free(dist);
    free(has_dist);
    free(want);
    free(has_want);
    free(uses);
    free(live);
    if (s != DT_OK) {
        dt__program_release(p);
        return s;
    }
    *out = p;
    return DT_OK;
}

/* ---- eager program cache ------------------------------------------------------------------ */

typedef struct key_input {
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    dt_layout layout;
} key_input;

/* Everything a program depends on; compared bytewise (built from zeroed memory). */
typedef struct cache_key {
    dt__op op;
    int nin;
    bool has_want;
    dt_layout want;
    dt__attrs attrs;
    /* the meshes involved by serial number (layouts above hold their addresses, which a later
     * mesh may reuse: entries of a mesh are dropped when it is destroyed) */
    uint64_t mesh, extra_mesh;
    key_input in[DT__MAX_INPUTS];
} cache_key;

typedef struct cache_entry {
    uint64_t hash;
    size_t len;
    cache_key key;
    dt__program *prog;
} cache_entry;

#define CACHE_SLOTS 1024 /* open addressing; cleared when half full */

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_entry *cache;
static int cache_count;

static void cache_clear_locked(void)
{
    if (!cache)
        return;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache[i].prog)
            dt__program_release(cache[i].prog);
    memset(cache, 0, sizeof *cache * CACHE_SLOTS);
    cache_count = 0;
}

/* A retained program or NULL. */
static dt__program *cache_find(const cache_key *k, size_t len, uint64_t h)
{
    dt__program *p = NULL;
    pthread_mutex_lock(&cache_lock);
    if (cache)
        for (int i = 0; i < CACHE_SLOTS; i++) {
            cache_entry *e = &cache[(h + (uint64_t)i) % CACHE_SLOTS];
            if (!e->prog)
                break;
            if (e->hash == h && e->len == len && memcmp(&e->key, k, len) == 0) {
                p = e->prog;
                atomic_fetch_add(&p->refs, 1);
                break;
            }
        }
    pthread_mutex_unlock(&cache_lock);
    return p;
}

static void cache_insert(const cache_key *k, size_t len, uint64_t h, dt__program *p)
{
    pthread_mutex_lock(&cache_lock);
    if (!cache)
        cache = calloc(CACHE_SLOTS, sizeof *cache);
    if (cache) {
        if (cache_count >= CACHE_SLOTS / 2)
            cache_clear_locked();
        for (int i = 0; i < CACHE_SLOTS; i++) {
            cache_entry *e = &cache[(h + (uint64_t)i) % CACHE_SLOTS];
            if (e->prog)
                continue;
            e->hash = h;
            e->len = len;
            memcpy(&e->key, k, len);
            e->prog = p;
            atomic_fetch_add(&p->refs, 1);
            cache_count++;
            break;
        }
    }
    pthread_mutex_unlock(&cache_lock);
}

/* Drop every program built for mesh m, so that no cached program outlives a mesh it points to. */
static void cache_drop_mesh(dt_mesh *m)
{
    pthread_mutex_lock(&cache_lock);
    int keep = 0;
    for (int i = 0; cache && i < CACHE_SLOTS; i++) {
        cache_entry *e = &cache[i];
        if (e->prog && (e->key.mesh == m->serial || e->key.extra_mesh == m->serial)) {
            dt__program_release(e->prog);
            e->prog = NULL;
        } else if (e->prog) {
            keep++;
        }
    }
    if (cache && keep != cache_count) {
        /* open addressing: re-insert the survivors so no probe chain has a hole */
        cache_entry *old = malloc(sizeof *old * (size_t)(keep ? keep : 1));
        int n = 0;
        for (int i = 0; old && i < CACHE_SLOTS; i++)
            if (cache[i].prog)
                old[n++] = cache[i];
        if (!old) { /* cannot rebuild: forget everything (programs are rebuilt on demand) */
            cache_clear_locked();
        } else {
            memset(cache, 0, sizeof *cache * CACHE_SLOTS);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < CACHE_SLOTS; i++) {
                    cache_entry *e = &cache[(old[j].hash + (uint64_t)i) % CACHE_SLOTS];
                    if (!e->prog) {
                        *e = old[j];
                        break;
                    }
                }
            cache_count = n;
            free(old);
        }
    }
    pthread_mutex_unlock(&cache_lock);
}

static void cache_free(void)
{
    pthread_mutex_lock(&cache_lock);
    cache_clear_locked();
    free(cache);
    cache = NULL;
    pthread_mutex_unlock(&cache_lock);
}

/* The cache follows the meshes and the runtime (mesh/ calls these through its hooks). */
static const dt__hooks cache_hooks = {
    .floor = DT__FLOOR_SPMD, .finalize = cache_free, .mesh_freed = cache_drop_mesh};

__attribute__((constructor)) static void cache_register(void)
{
    dt__hooks_add(&cache_hooks);
}

int dt__program_cache_count(void)
{
    pthread_mutex_lock(&cache_lock);
    int n = cache_count;
    pthread_mutex_unlock(&cache_lock);
    return n;
}

static size_t build_key(cache_key *k, dt__op op, const dt__attrs *attrs, int nin,
                        const dt_tensor *const in[], const dt_layout *want)
{
    size_t len = offsetof(cache_key, in) + (size_t)nin * sizeof(key_input);
    memset(k, 0, len);
    k->op = op;
    k->nin = nin;
    k->attrs = *attrs;
    if (want) {
        k->has_want = true;
        k->want = *want;
    }
    const dt_mesh *m = nin ? in[0]->mesh : want->mesh;
    k->mesh = m->serial;
    if (want && want->mesh != m) /* copy_to_mesh */
        k->extra_mesh = want->mesh->serial;
    for (int i = 0; i < nin; i++) {
        key_input *ki = &k->in[i];
        ki->dtype = in[i]->dtype;
        ki->rank = in[i]->rank;
        memcpy(ki->shape, in[i]->shape, sizeof(int64_t) * (size_t)in[i]->rank);
        ki->layout = in[i]->layout;
        for (int a = in[i]->layout.rank; a < DT_MAX_RANK; a++)
            ki->layout.axes[a] = DT_UNSHARDED;
    }
    /* layouts may carry stale values past their rank */
    for (int a = want ? want->rank : 0; want && a < DT_MAX_RANK; a++)
        k->want.axes[a] = DT_UNSHARDED;
    return len;
}

/* ---- what the clients agree on before an op runs ----------------------------------------- */

/* A layout as every client sees it: axes and partial sums, the mesh by content. */
static uint64_t hash_layout(uint64_t h, const dt_layout *l)
{
    h = dt__hash(h, &l->rank, sizeof l->rank);
    h = dt__hash(h, l->axes, sizeof l->axes[0] * (size_t)l->rank);
    h = dt__hash(h, &l->partial, sizeof l->partial);
    if (l->partial)
        h = dt__hash(h, &l->partial_op, sizeof l->partial_op);
    if (!l->mesh)
        return h;
    uint64_t id[2] = {l->mesh->content, l->mesh->agree_id};
    return dt__hash(h, id, sizeof id);
}

static uint64_t hash_meta(uint64_t h, dt_dtype dtype, int rank, const int64_t shape[],
                          const dt_layout *l)
{
    h = dt__hash(h, &dtype, sizeof dtype);
    h = dt__hash(h, &rank, sizeof rank);
    h = dt__hash(h, shape, sizeof *shape * (size_t)rank);
    return hash_layout(h, l);
}

/* The op one client is about to run, as the others must run it too. */
static uint64_t op_fingerprint(dt__op op, const dt__attrs *attrs, int nin,
                               const dt_tensor *const in[], const dt_layout *want)
{
    uint64_t h = dt__hash(DT__HASH_SEED, &op, sizeof op);
    h = dt__hash(h, attrs, sizeof *attrs); /* callers zero attrs before setting them */
    for (int i = 0; i < nin; i++)
        h = hash_meta(h, in[i]->dtype, in[i]->rank, in[i]->shape, &in[i]->layout);
    return want ? hash_layout(dt__hash(h, "want", 4), want) : h;
}

typedef struct op_desc {
    dt__op op;
    const dt__attrs *attrs;
    int nin;
    const dt_tensor *const *in;
    const dt_layout *want;
} op_desc;

/* The op's fields, in the order the clients compare them when their fingerprints differ:
 * operands, attributes (every one, seed and key included), the requested layout. */
static int op_fields(const void *ctx, dt__field out[], int max)
{
    const op_desc *d = ctx;
    const dt__attrs *a = d->attrs;
    int n = 0;
    char nm[48], tx[DT_STRING_MAX];
#define FIELD(...)                                 \
    do {                                           \
        if (n < max)                               \
            dt__field_set(&out[n++], __VA_ARGS__); \
    } while (0)
    FIELD("number of operands", &d->nin, sizeof d->nin, "%d", d->nin);
    for (int i = 0; i < d->nin; i++) {
        const dt_tensor *t = d->in[i];
        snprintf(nm, sizeof nm, "operand %d dtype", i);
        FIELD(nm, &t->dtype, sizeof t->dtype, "%s", dt_dtype_name(t->dtype));
        int64_t shape[DT_MAX_RANK + 1] = {t->rank};
        memcpy(shape + 1, t->shape, sizeof(int64_t) * (size_t)t->rank);
        snprintf(nm, sizeof nm, "operand %d shape", i);
        FIELD(nm, shape, sizeof(int64_t) * (size_t)(t->rank + 1), "%s",
              dt__shape_str(tx, sizeof tx, t->rank, t->shape));
        uint64_t h = hash_layout(DT__HASH_SEED, &t->layout);
        snprintf(nm, sizeof nm, "operand %d layout", i);
        FIELD(nm, &h, sizeof h, "\"%s\"", dt__layout_str(&t->layout, tx, sizeof tx));
    }
    const char *opname = d->op == DT__OP_UNARY    ? dt_unary_op_name((dt_unary_op)a->op)
                         : d->op == DT__OP_BINARY ? dt_binary_op_name((dt_binary_op)a->op)
                         : d->op == DT__OP_REDUCE ? dt_reduce_op_name((dt_reduce_op)a->op)
                         : d->op == DT__OP_RANDOM ? (a->op ? "normal" : "uniform")
                                                  : "-";
    FIELD("operator", &a->op, sizeof a->op, "%d (%s)", a->op, opname);
    FIELD("keepdims", &a->keepdims, sizeof a->keepdims, "%d", a->keepdims);
    FIELD("reduced axes", &a->mask, sizeof a->mask, "0x%x", a->mask);
    FIELD("transpose of a", &a->ta, sizeof a->ta, "%d", a->ta);
    FIELD("transpose of b", &a->tb, sizeof a->tb, "%d", a->tb);
    FIELD("axis", &a->axis, sizeof a->axis, "%d", a->axis);
    FIELD("dtype", &a->dtype, sizeof a->dtype, "%s",
          dt__dtype_valid(a->dtype) ? dt_dtype_name(a->dtype) : "?");
    int r = a->rank >= 0 && a->rank <= DT_MAX_RANK ? a->rank : DT_MAX_RANK;
    int64_t shape[DT_MAX_RANK + 1] = {a->rank};
    memcpy(shape + 1, a->shape, sizeof a->shape);
    FIELD("shape", shape, sizeof shape, "%s", dt__shape_str(tx, sizeof tx, r, a->shape));
    int ir = d->nin && d->in[0]->rank <= DT_MAX_RANK ? d->in[0]->rank : DT_MAX_RANK;
    FIELD("begin", a->begin, sizeof a->begin, "%s", dt__shape_str(tx, sizeof tx, ir, a->begin));
    int64_t perm[DT_MAX_RANK];
    for (int i = 0; i < DT_MAX_RANK; i++)
        perm[i] = a->perm[i];
    FIELD("permutation", a->perm, sizeof a->perm, "%s", dt__shape_str(tx, sizeof tx, ir, perm));
    FIELD("first parameter (value, start, minimum or mean)", &a->a, sizeof a->a, "%.17g", a->a);
    FIELD("second parameter (step, maximum or deviation)", &a->b, sizeof a->b, "%.17g", a->b);
    FIELD("seed", &a->seed, sizeof a->seed, "%llu", (unsigned long long)a->seed);
    FIELD("key", &a->key, sizeof a->key, "%llu", (unsigned long long)a->key);
    if (d->want) {
        uint64_t h = hash_layout(DT__HASH_SEED, d->want);
        FIELD("result layout", &h, sizeof h, "\"%s\"", dt__layout_str(d->want, tx, sizeof tx));
    } else {
        FIELD("result layout", NULL, 0, "none requested");
    }
#undef FIELD
    return n;
}

static const dt_mesh *op_mesh(int nin, const dt_tensor *const in[], const dt_layout *want)
{
    for (int i = 0; in && i < nin; i++)
        if (in[i])
            return in[i]->mesh;
    return want ? want->mesh : NULL;
}

/* ---- functions (tracing) ----------------------------------------------------------------- */

struct dt_function {
    dt__graph g;
    bool ended, failed;
    dt__program *prog;
    uint64_t fingerprint; /* the traced graph, as every client must have traced it */
    size_t bucket;        /* the bucket cap it was built with (it changes the collectives) */
};

static uint64_t graph_fingerprint(const dt__graph *g)
{
    uint64_t h = DT__HASH_SEED;
    for (int v = 0; v < g->nvals; v++) {
        const dt__val *x = &g->vals[v];
        dt_layout none = {.mesh = x->mesh};
        h = hash_meta(h, x->dtype, x->rank, x->shape, x->has_layout ? &x->layout : &none);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const dt__node *n = &g->nodes[i];
        h = dt__hash(h, &n->op, sizeof n->op);
        h = dt__hash(h, &n->attrs, sizeof n->attrs);
        h = dt__hash(h, n->in, sizeof n->in[0] * (size_t)n->nin);
        h = dt__hash(h, &n->out, sizeof n->out);
        h = dt__hash(h, &n->recompute, sizeof n->recompute);
    }
    return dt__hash(h, g->outputs, sizeof *g->outputs * (size_t)g->noutputs);
}

/* The mesh a function's clients agree over: its first input's, else its first output's. */
static const dt_mesh *function_mesh(const dt__program *p)
{
    return p->ninputs ? p->in[0].layout.mesh : p->out[0].layout.mesh;
}

static int function_fields(const void *ctx, dt__field out[], int max)
{
    const dt_function *f = ctx;
    if (max < 1)
        return 0;
    dt__field_set(&out[0], "function", &f->fingerprint, sizeof f->fingerprint, "%s #%08llx",
                  f->prog->title, (unsigned long long)(f->fingerprint & 0xffffffffull));
    if (max < 2)
        return 1;
    dt__field_set(&out[1], "DTENSOR_BUCKET_MB", &f->bucket, sizeof f->bucket, "%zu bytes",
                  f->bucket);
    return 2;
}

static _Thread_local dt_function *tracing;

/* Whether a traced function's program is fused: yes unless DTENSOR_FUSION=0 (each kernel of a
 * chain then runs as its own step, as eager ops do: for comparisons). */
static bool fusion_on(void)
{
    const char *e = getenv("DTENSOR_FUSION");
    return !e || strcmp(e, "0") != 0;
}

static dt_status symbolic_tensor(dt_function *f, int value, dt_tensor **out)
{
    const dt__val *v = &f->g.vals[value];
    dt_tensor *t = calloc(1, sizeof *t);
    const dt_mesh *m = v->mesh;
    if (t) {
        t->data = calloc((size_t)m->num_local + 1, sizeof *t->data);
        t->bytes = calloc((size_t)m->num_local + 1, sizeof *t->bytes);
    }
    if (!t || !t->data || !t->bytes) {
        if (t) {
            free(t->data);
            free(t->bytes);
        }
        free(t);
        return dt__fail(DT_ERR_NOMEM, "function: out of memory");
    }
    t->mesh = dt__mesh_retain(m);
    t->dtype = v->dtype;
    t->rank = v->rank;
    memcpy(t->shape, v->shape, sizeof t->shape);
    t->layout = v->has_layout ? v->layout : dt__layout_none(m, v->rank);
    t->num_local = 0;
    t->trace = f;
    t->trace_value = value;
    atomic_fetch_add(&dt__rt.live_tensors, 1);
    *out = t;
    return DT_OK;
}

dt_status dt_function_begin(dt_function **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_function_begin: out is NULL");
    *out = NULL;
    DT_TRY(dt__require_init("dt_function_begin"));
    if (tracing)
        return dt__fail(DT_ERR_STATE, "dt_function_begin: this thread is already recording a "
                                      "function");
    dt_function *f = calloc(1, sizeof *f);
    if (!f)
        return dt__fail(DT_ERR_NOMEM, "dt_function_begin: out of memory");
    tracing = f;
    *out = f;
    return DT_OK;
}

dt_status dt_function_input(dt_function *f, const dt_layout *layout, dt_dtype dtype, int rank,
                            const int64_t shape[], dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_function_input: out is NULL");
    *out = NULL;
    if (!f || f != tracing || f->ended)
        return dt__fail(DT_ERR_STATE, "dt_function_input: the function is not recording on this "
                                      "thread");
    if (!layout)
        return dt__fail(DT_ERR_ARG, "dt_function_input: layout is NULL");
    DT_TRY(dt_layout_check(layout));
    if (!dt__dtype_valid(dtype))
        return dt__fail(DT_ERR_DTYPE, "dt_function_input: dtype %d is not valid", (int)dtype);
    char lb[DT_STRING_MAX];
    if (rank != layout->rank || (rank && !shape) || dt__num_elements(rank, shape) < 0)
        return dt__fail(DT_ERR_SHAPE, "dt_function_input: rank %d with layout \"%s\"", rank,
                        dt__layout_str(layout, lb, sizeof lb));
    dt__val v = {
        .dtype = dtype, .rank = rank, .mesh = layout->mesh, .has_layout = true, .layout = *layout};
    for (int i = 0; i < rank; i++)
        v.shape[i] = shape[i];
    int id;
    DT_TRY(graph_add_input(&f->g, &v, &id));
    return symbolic_tensor(f, id, out);
}

dt_status dt_function_end(dt_function *f, int num_outputs, dt_tensor *const outputs[])
{
    DT__SERIAL();
    if (!f || f != tracing)
        return dt__fail(DT_ERR_STATE, "dt_function_end: the function is not recording on this "
                                      "thread");
    tracing = NULL;
    f->ended = true;
    f->failed = true;
    if (num_outputs < 1 || !outputs)
        return dt__fail(DT_ERR_ARG, "dt_function_end: %d outputs, expected at least 1",
                        num_outputs);
    f->g.outputs = calloc((size_t)num_outputs, sizeof *f->g.outputs);
    if (!f->g.outputs)
        return dt__fail(DT_ERR_NOMEM, "dt_function_end: out of memory");
    for (int i = 0; i < num_outputs; i++) {
        if (!outputs[i] || outputs[i]->trace != f)
            return dt__fail(DT_ERR_ARG,
                            "dt_function_end: output %d is not a tensor of this "
                            "function",
                            i);
        f->g.outputs[i] = outputs[i]->trace_value;
    }
    f->g.noutputs = num_outputs;
    char title[64];
    snprintf(title, sizeof title, "function (%d ops)", f->g.nnodes);
    size_t bucket;
    DT_TRY(dt__bucket_cap(&bucket));
    DT_TRY(compile(&f->g, title, fusion_on(), bucket, &f->prog));
    f->fingerprint = graph_fingerprint(&f->g);
    f->bucket = bucket;
    f->failed = false;
    return DT_OK;
}

static dt_status check_bound(const char *fn, int i, const dt_tensor *t, const dt__dist *want)
{
    if (!t)
        return dt__fail(DT_ERR_ARG, "%s: input %d is NULL", fn, i);
    if (t->trace)
        return dt__fail(DT_ERR_STATE,
                        "%s: input %d is symbolic (recorded in a function being traced); pass a "
                        "tensor with values",
                        fn, i);
    bool same = t->dtype == want->dtype && t->rank == want->rank &&
                dt_layout_equal(&t->layout, &want->layout);
    for (int a = 0; same && a < t->rank; a++)
        same = t->shape[a] == want->shape[a];
    if (!same) {
        char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX], la[DT_STRING_MAX], lb[DT_STRING_MAX];
        return dt__fail(DT_ERR_ARG, "%s: input %d is %s%s \"%s\", the function takes %s%s \"%s\"",
                        fn, i, dt_dtype_name(t->dtype),
                        dt__shape_str(sa, sizeof sa, t->rank, t->shape),
                        dt__layout_str(&t->layout, la, sizeof la), dt_dtype_name(want->dtype),
                        dt__shape_str(sb, sizeof sb, want->rank, want->shape),
                        dt__layout_str(&want->layout, lb, sizeof lb));
    }
    return DT_OK;
}

dt_status dt_function_run(const dt_function *f, int num_inputs, const dt_tensor *const inputs[],
                          int num_outputs, dt_tensor *results[])
{
    DT__SERIAL();
    if (results)
        for (int i = 0; i < num_outputs; i++)
            results[i] = NULL;
    /* a failure fails the other clients too (over every client when the mesh is unknown) */
    const dt__agreement fail = {.what = "dt_function_run"};
    if (!f || !f->ended || f->failed)
        return dt__mesh_agree(
            NULL,
            dt__fail(DT_ERR_STATE, "dt_function_run: the function was not ended successfully"),
            &fail);
    if (num_inputs != f->prog->ninputs || num_outputs != f->prog->noutputs ||
        (num_inputs && !inputs) || !results)
        return dt__mesh_agree(
            function_mesh(f->prog),
            dt__fail(DT_ERR_ARG,
                     "dt_function_run: %d inputs and %d results, the function has %d and %d",
                     num_inputs, num_outputs, f->prog->ninputs, f->prog->noutputs),
            &fail);
    /* an input that does not fit fails on every client, never leaving the others waiting */
    dt__op_check chk = {function_mesh(f->prog),
                        {.what = "dt_function_run",
                         .fingerprint = dt__hash(f->fingerprint, &f->bucket, sizeof f->bucket),
                         .fields = function_fields,
                         .ctx = f}};
    for (int i = 0; i < num_inputs; i++) {
        dt_status s = check_bound("dt_function_run", i, inputs[i], &f->prog->in[i]);
        if (s != DT_OK)
            return dt__mesh_agree(chk.mesh, s, &chk.a);
    }
    return dt__program_run(f->prog, inputs, results, &chk);
}

void dt_function_free(dt_function *f)
{
    DT__SERIAL();
    if (!f)
        return;
    if (tracing == f)
        tracing = NULL;
    dt__program_release(f->prog);
    graph_free(&f->g);
    free(f);
}

const dt__graph *dt__function_graph(const dt_function *f)
{
    return f && f->ended && !f->failed ? &f->g : NULL;
}

dt_status dt_function_print(const dt_function *f, FILE *out)
{
    DT__SERIAL();
    if (!f || !f->ended || f->failed || !out)
        return dt__fail(DT_ERR_STATE, "dt_function_print: the function was not ended "
                                      "successfully (or out is NULL)");
    return dt__program_print(f->prog, out);
}

dt_status dt_function_cost(const dt_function *f, double *multiplies, int *collectives,
                           double *bytes_per_device)
{
    DT__SERIAL();
    if (!f || !f->ended || f->failed)
        return dt__fail(DT_ERR_STATE, "dt_function_cost: the function was not ended "
                                      "successfully");
    dt__program_totals(f->prog, multiplies, collectives, bytes_per_device);
    return DT_OK;
}

/* ---- one op call: record or run --------------------------------------------------------- */

static dt_status record(dt__op op, const dt__attrs *attrs, int nin, const dt_tensor *const in[],
                        const dt_layout *want, bool recompute, dt_tensor **out)
{
    dt_function *f = tracing;
    int ids[DT__MAX_INPUTS];
    for (int i = 0; i < nin; i++) {
        if (in[i]->trace != f)
            return dt__fail(DT_ERR_ARG,
                            "%s: operand %d is a concrete tensor (or another function's); pass it "
                            "as a function input",
                            dt__op_get(op)->name, i);
        ids[i] = in[i]->trace_value;
    }
    int v;
    DT_TRY(graph_add_node(&f->g, op, attrs, nin, ids, want, recompute, &v));
    return symbolic_tensor(f, v, out);
}

/* Validate, find or build the program: the part of an eager op that may fail before its
 * agreement. */
static dt_status eager_program(dt__op op, const dt__attrs *attrs, int nin,
                               const dt_tensor *const in[], const dt_layout *want,
                               dt__program **out)
{
    const dt__op_def *def = dt__op_get(op);
    for (int i = 0; i < nin; i++)
        if (in[i]->trace)
            return dt__fail(DT_ERR_STATE,
                            "%s: operand %d is symbolic but no function is "
                            "recording on this thread",
                            def->name, i);
    if (!nin && !want)
        return dt__fail(DT_ERR_LAYOUT,
                        "%s: needs a requested layout (opts->layout) to name its "
                        "mesh",
                        def->name);
    if (want)
        DT_TRY(dt_layout_check(want));
    cache_key key;
    size_t len = build_key(&key, op, attrs, nin, in, want);
    uint64_t h = dt__hash(DT__HASH_SEED, &key, len);
    dt__program *p = cache_find(&key, len, h);
    if (!p) {
        dt__graph g = {0};
        int ids[DT__MAX_INPUTS], v;
        dt_status s = DT_OK;
        for (int i = 0; s == DT_OK && i < nin; i++) {
            dt__val iv = {.dtype = in[i]->dtype,
                          .rank = in[i]->rank,
                          .mesh = in[i]->mesh,
                          .has_layout = true,
                          .layout = in[i]->layout};
            memcpy(iv.shape, in[i]->shape, sizeof iv.shape);
            s = graph_add_input(&g, &iv, &ids[i]);
        }
        if (s == DT_OK)
            s = graph_add_node(&g, op, attrs, nin, ids, want, false, &v);
        if (s == DT_OK) {
            g.outputs = malloc(sizeof *g.outputs);
            s = g.outputs ? DT_OK : dt__fail(DT_ERR_NOMEM, "%s: out of memory", def->name);
        }
        if (s == DT_OK) {
            g.outputs[0] = v;
            g.noutputs = 1;
            s = compile(&g, def->name, false, 0, &p);
        }
        graph_free(&g);
        DT_TRY(s);
        cache_insert(&key, len, h, p);
    }
    *out = p;
    return DT_OK;
}

/* Every client of a multi-client mesh agrees on the op before it runs: a client whose
 * operands or options fail validation, or that runs another op (other shapes, layouts,
 * attributes), fails every client instead of leaving them waiting or computing garbage. */
static dt_status eager(dt__op op, const dt__attrs *attrs, int nin, const dt_tensor *const in[],
                       const dt_op_options *opts, dt_tensor **out)
{
    const dt_layout *want = opts ? opts->layout : NULL;
    const dt_mesh *mesh = op_mesh(nin, in, want);
    dt__program *p = NULL;
    dt_status s = eager_program(op, attrs, nin, in, want, &p);
    const char *name = dt__op_get(op)->name;
    if (s != DT_OK)
        return dt__mesh_agree(mesh, s, &(dt__agreement){.what = name});
    op_desc d = {op, attrs, nin, in, want};
    dt__op_check chk = {mesh, {.what = name, .fields = op_fields, .ctx = &d}};
    if (mesh->comm != MPI_COMM_NULL && !p->has_fingerprint) {
        p->fingerprint = op_fingerprint(op, attrs, nin, in, want);
        p->has_fingerprint = true;
    }
    chk.a.fingerprint = p->fingerprint;
    if (opts && opts->program)
        dt__program_print(p, opts->program);
    s = dt__program_run(p, in, out, &chk);
    dt__program_release(p);
    return s;
}

dt_status dt__call_fail(dt__op op, int nin, const dt_tensor *const in[], const dt_op_options *opts,
                        dt_status s)
{
    DT__SERIAL();
    if (tracing)
        return s;
    const dt_layout *want = opts ? opts->layout : NULL;
    return dt__mesh_agree(op_mesh(nin > DT__MAX_INPUTS ? 1 : nin, in, want), s,
                          &(dt__agreement){.what = dt__op_get(op)->name});
}

dt_status dt__call(dt__op op, const dt__attrs *attrs, int nin, const dt_tensor *const in[],
                   const dt_op_options *opts, dt_tensor **out)
{
    DT__SERIAL();
    const dt__op_def *def = dt__op_get(op);
    DT_TRY(dt__require_init(def->name));
    const dt_layout *want = opts ? opts->layout : NULL;
    dt_status s = DT_OK;
    if (!out)
        s = dt__fail(DT_ERR_ARG, "%s: out is NULL", def->name);
    else
        *out = NULL;
    if (s == DT_OK && nin > DT__MAX_INPUTS)
        s = dt__fail(DT_ERR_ARG, "%s: %d operands, at most %d", def->name, nin, DT__MAX_INPUTS);
    for (int i = 0; s == DT_OK && i < nin; i++)
        if (!in[i])
            s = dt__fail(DT_ERR_ARG, "%s: operand %d is NULL", def->name, i);
    if (tracing)
        return s == DT_OK ? record(op, attrs, nin, in, want, opts && opts->recompute, out) : s;
    if (s != DT_OK) /* the other clients, if this op is theirs too, fail with this client; a
                     * client that cannot tell the mesh (every operand NULL) agrees with all */
        return dt__mesh_agree(op_mesh(nin > DT__MAX_INPUTS ? 1 : nin, in, want), s,
                              &(dt__agreement){.what = def->name});
    return eager(op, attrs, nin, in, opts, out);
}
