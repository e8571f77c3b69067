/* Device collectives across clients: the groups of an axis mask that span clients exchange on
 * the GPUs, through a transport between physical GPUs (NCCL, or its emulation), ordered as
 * PyTorch's ProcessGroupNCCL orders its NCCL stream:
 *
 *   compute streams of the members --event--> the GPU's side stream: combine the members on
 *   that GPU (logical devices), the transport's op, give each member its result --event-->
 *   compute streams of the members (the consumers)
 *
 * The host waits for none of it. Each physical GPU of the job is one rank: the logical devices
 * of one GPU in a group reduce (or gather) on the GPU first, so no communicator ever holds a
 * GPU twice. The communicators are made when the mesh is made (dt__coll_mesh_open): one parent
 * over the mesh's GPUs, split into one per set of GPUs that some group of some axis mask spans
 * across clients; the outcome is agreed, so a failure on one client fails the mesh's creation
 * on every client. A collective that fails (an enqueue, the transport, or a peer that never
 * comes: the transport's watchdog) aborts the mesh's communicators and marks its devices dead:
 * every later op on them fails with DT_ERR_DEVICE on every client (the op agreement).
 *
 * 16-bit floats are summed (and multiplied) in f32 end to end, rounded once at the end, as the
 * in-client combine and the CPU do.
 *
 * DTENSOR_FAULT (tests; collectives/collectives.c parses it): "comm:K[:N]" fails client K's N-th
 * communicator creation (default the first), "enqueue:K[:N]" its N-th device collective's
 * enqueue, "kill:K[:N]" makes it exit there. */
#include "coll_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the mesh's communicators -------------------------------------------------------------- */

typedef struct xset {
    int nm;
    int *members;     /* parent ranks, ascending */
    dt__xcomm **comm; /* per local GPU of the mesh: its communicator, NULL when not a member */
} xset;

struct dt__devmesh {
    const dt__xport *x;
    int nranks;         /* the mesh's physical GPUs: the parent's ranks, by first device */
    int *rank_of;       /* per mesh device: its GPU's rank */
    int *client_of;     /* per rank: the client holding that GPU */
    int k;              /* this client's GPUs in the mesh */
    int *rank;          /* k: their ranks */
    dt__device **side;  /* k: their side devices */
    dt__xcomm **parent; /* k; NULL without a parent (every set lies in this client) */
    xset *sets;
    int nsets, cap;
};

/* The links between GPUs this build has; filled before main (constructors). */
static const dt__xport *xports[4];
static int num_xports;

void dt__xport_add(const dt__xport *x)
{
    if (num_xports == (int)(sizeof xports / sizeof *xports))
        abort(); /* a broken invariant of the build: more links than slots */
    xports[num_xports++] = x;
}

static const dt__xport *xport_of(dt_device_type type)
{
    for (int i = 0; type == DT_DEVICE_CUDA && i < num_xports; i++)
        if (xports[i]->emulated == dt__rt.cuda_emulated)
            return xports[i];
    return NULL;
}

/* The side device of GPU `gpu`: this client's first device on it, whatever the mesh. */
static dt__device *side_device(int gpu)
{
    for (int i = 0; i < dt__rt.num_devices[DT_DEVICE_CUDA]; i++)
        if (dt__rt.devices[DT_DEVICE_CUDA][i].gpu == gpu)
            return &dt__rt.devices[DT_DEVICE_CUDA][i];
    return NULL;
}

static int mesh_client_of(const dt_mesh *m, int device)
{
    int c = 0;
    while (c + 1 < m->num_clients && m->client_first[c + 1] <= device)
        c++;
    return c;
}

static void set_free(const dt__xport *x, xset *s, int k, bool abort)
{
    for (int j = 0; s->comm && j < k; j++)
        if (s->comm[j])
            (abort ? x->abort : x->free)(s->comm[j]);
    free(s->comm);
    free(s->members);
}

static void devmesh_free(struct dt__devmesh *dm, bool abort)
{
    if (!dm)
        return;
    for (int i = 0; i < dm->nsets; i++)
        set_free(dm->x, &dm->sets[i], dm->k, abort);
    for (int j = 0; dm->parent && j < dm->k; j++)
        if (dm->parent[j])
            (abort ? dm->x->abort : dm->x->free)(dm->parent[j]);
    free(dm->sets);
    free(dm->parent);
    free(dm->rank_of);
    free(dm->client_of);
    free(dm->rank);
    free(dm->side);
    free(dm);
}

/* Ranks of the mesh's GPUs (local: a pure function of the mesh and the runtime's GPU table). */
static dt_status devmesh_build(const dt_mesh *m, const dt__xport *x, struct dt__devmesh **out)
{
    *out = NULL;
    struct dt__devmesh *dm = calloc(1, sizeof *dm);
    int n = m->size;
    int *gpus = malloc(sizeof(int) * (size_t)n);
    if (dm) {
        dm->x = x;
        dm->rank_of = malloc(sizeof(int) * (size_t)n);
        dm->client_of = malloc(sizeof(int) * (size_t)n);
        dm->rank = malloc(sizeof(int) * (size_t)n);
        dm->side = calloc((size_t)n, sizeof *dm->side);
    }
    if (!dm || !gpus || !dm->rank_of || !dm->client_of || !dm->rank || !dm->side) {
        free(gpus);
        devmesh_free(dm, false);
        return dt__fail(DT_ERR_NOMEM, "device collectives: out of memory for %d devices", n);
    }
    for (int d = 0; d < n; d++) {
        int gpu = dt__rt.gpu_of[m->global_ids[d]], r = 0;
        while (r < dm->nranks && gpus[r] != gpu)
            r++;
        if (r == dm->nranks) {
            gpus[dm->nranks] = gpu;
            dm->client_of[dm->nranks++] = mesh_client_of(m, d);
        }
        dm->rank_of[d] = r;
        bool mine = d >= m->first_local && d < m->first_local + m->num_local;
        if (mine && (dm->k == 0 || dm->rank[dm->k - 1] != r)) {
            dm->rank[dm->k] = r;
            dm->side[dm->k++] = side_device(gpu);
        }
    }
    free(gpus);
    *out = dm;
    return DT_OK;
}

/* The parent ranks of a group's members, ascending and distinct (members of one GPU are
 * consecutive member ranks, since a GPU's devices are consecutive ids), into set[]; returns
 * their count; *spans: they lie on several clients. */
static int group_set(const dt_mesh *m, const struct dt__devmesh *dm, unsigned axes, int id,
                     int set[], bool *spans)
{
    int g = dt__group_size(m, axes), n = 0;
    *spans = false;
    for (int q = 0; q < g; q++) {
        int r = dm->rank_of[dt__group_member(m, axes, id, q)];
        if (n == 0 || set[n - 1] != r) {
            *spans = *spans || (n > 0 && dm->client_of[r] != dm->client_of[set[0]]);
            set[n++] = r;
        }
    }
    return n;
}

static int find_set(const struct dt__devmesh *dm, int nm, const int members[])
{
    for (int i = 0; i < dm->nsets; i++)
        if (dm->sets[i].nm == nm && !memcmp(dm->sets[i].members, members, sizeof(int) * (size_t)nm))
            return i;
    return -1;
}

/* Append a set (its communicators still NULL). */
static dt_status add_set(struct dt__devmesh *dm, int nm, const int members[])
{
    if (dm->nsets == dm->cap) {
        int cap = dm->cap ? 2 * dm->cap : 8;
        xset *s = realloc(dm->sets, sizeof *s * (size_t)cap);
        if (!s)
            return dt__fail(DT_ERR_NOMEM, "device collectives: out of memory for %d sets", cap);
        dm->sets = s;
        dm->cap = cap;
    }
    xset *s = &dm->sets[dm->nsets];
    s->nm = nm;
    s->members = malloc(sizeof(int) * (size_t)nm);
    s->comm = calloc((size_t)dm->k + 1, sizeof *s->comm);
    if (!s->members || !s->comm) {
        free(s->members);
        free(s->comm);
        return dt__fail(DT_ERR_NOMEM, "device collectives: out of memory");
    }
    memcpy(s->members, members, sizeof(int) * (size_t)nm);
    dm->nsets++;
    return DT_OK;
}

/* Every set of GPUs that a group of some axis mask spans across clients, in an order every
 * client shares (masks ascending, groups by id). */
static dt_status spanning_sets(const dt_mesh *m, struct dt__devmesh *dm)
{
    int n = m->size;
    int *set = malloc(sizeof(int) * (size_t)n);
    char *seen = malloc((size_t)n);
    dt_status s = set && seen ? DT_OK : dt__fail(DT_ERR_NOMEM, "device collectives: out of memory");
    for (unsigned axes = 1; s == DT_OK && axes < 1u << m->num_axes; axes++) {
        memset(seen, 0, (size_t)n);
        for (int d = 0; s == DT_OK && d < n; d++) {
            int id = dt__group_member(m, axes, d, 0);
            if (seen[id])
                continue;
            seen[id] = 1;
            bool spans;
            int nm = group_set(m, dm, axes, id, set, &spans);
            if (spans && find_set(dm, nm, set) < 0)
                s = add_set(dm, nm, set);
        }
    }
    free(set);
    free(seen);
    return s;
}

/* ---- opening and freeing a mesh's communicators ------------------------------------------- */

static dt_status open_sets(struct dt__devmesh *dm, MPI_Comm comm)
{
    static int opened;
    int at;
    bool fail = dt__coll_fault(&at) == DT__FAULT_COMM && ++opened == at;
    dm->parent = calloc((size_t)dm->k + 1, sizeof *dm->parent);
    if (!dm->parent)
        return dt__fail(DT_ERR_NOMEM, "device collectives: out of memory");
    DT_TRY(
        dm->x->init(comm, dm->nranks, dm->client_of, dm->k, dm->rank, dm->side, fail, dm->parent));
    for (int i = 0; i < dm->nsets; i++)
        DT_TRY(
            dm->x->split(dm->k, dm->parent, dm->sets[i].nm, dm->sets[i].members, dm->sets[i].comm));
    return DT_OK;
}

static bool mesh_uses_devices(const dt_mesh *m)
{
    const dt__backend *be = dt__backend_of(m->type);
    return be && be->dev && xport_of(m->type) && !dt__rt.gpus_shared;
}

dt_status dt__coll_mesh_open(const dt_mesh *m)
{
    if (!mesh_uses_devices(m) || m->comm == MPI_COMM_NULL)
        return DT_OK;
    dt_mesh *mm = (dt_mesh *)m; /* the collectives' state of a const mesh, as groups.c keeps */
    struct dt__devmesh *dm = NULL;
    dt_status s = devmesh_build(m, xport_of(m->type), &dm);
    if (s == DT_OK)
        s = spanning_sets(m, dm);
    if (s == DT_OK && !mm->coll && !(mm->coll = calloc(1, sizeof *mm->coll)))
        s = dt__fail(DT_ERR_NOMEM, "collectives: out of memory");
    /* the sets are a pure function of the mesh: every client agrees whether to make any */
    bool any = s == DT_OK && dm->nsets > 0;
    s = dt__agree(m->comm, s);
    if (s == DT_OK && any)
        s = dt__agree(m->comm, open_sets(dm, m->comm));
    if (s != DT_OK || !any) {
        devmesh_free(dm, s != DT_OK);
        return s;
    }
    mm->coll->dev = dm;
    return DT_OK;
}

void dt__dev_mesh_free(dt_mesh *m)
{
    if (m->coll) {
        devmesh_free(m->coll->dev, false);
        m->coll->dev = NULL;
    }
}

/* A failure inside a device collective: peers may wait for this client's part forever, so the
 * mesh's communicators are aborted (their in-flight ops end) and its devices marked dead. */
static void fail_mesh(const dt_mesh *m)
{
    struct dt__devmesh *dm = m->coll ? m->coll->dev : NULL;
    dt__device *const *devs = dt__mesh_local_devices(m);
    for (int i = 0; i < m->num_local; i++)
        dt__device_kill(devs[i]);
    for (int j = 0; dm && j < dm->k; j++)
        dt__device_kill(dm->side[j]);
    if (dm) {
        devmesh_free(dm, true);
        m->coll->dev = NULL;
    }
}

/* ---- one collective ------------------------------------------------------------------------ */

/* Whether a collective of r runs as a device collective (its groups spanning clients, or NCCL
 * asked for, on a backend with a transport whose GPUs no two clients share). Pure metadata. */
static bool dev_applies(const dt__coll_req *r)
{
    if (!mesh_uses_devices(r->m) || !r->mask)
        return false;
    dt_collective_algorithm a =
        r->c.algorithm != DT_ALGORITHM_AUTO ? r->c.algorithm : r->m->coll_algorithm;
    return r->mask->spans || a == DT_ALGORITHM_NCCL;
}

/* One physical GPU of one group, on this client. */
typedef struct dev_gpu {
    int a, b;  /* its members: the group's local members [a, b) */
    int srank; /* its rank in the group's set */
    dt__device *side;
    dt__xcomm *comm;
    char *scratch;
    size_t scratch_bytes;
} dev_gpu;

struct dt__dev_call {
    const struct dt__devmesh *dm;
    int ngpus;
    dev_gpu *gpus;
    int *first; /* per group of the request: its first entry of gpus; num_groups + 1 */
    int *srank; /* per group: per member rank, its GPU's rank in the set (rows of mask size) */
    dt__xop *ops;
    int nops, cap;
    bool queued; /* stream work was queued: the members must wait for it */
};

void dt__dev_call_free(dt__coll_req *r)
{
    struct dt__dev_call *c = r->dev;
    if (!c)
        return;
    for (int i = 0; i < c->ngpus; i++)
        if (c->gpus[i].scratch)
            dt__device_free(c->gpus[i].side, c->gpus[i].scratch, c->gpus[i].scratch_bytes);
    free(c->gpus);
    free(c->first);
    free(c->srank);
    free(c->ops);
    free(c);
    r->dev = NULL;
}

static dt_status push(struct dt__dev_call *c, dt__xop op)
{
    if (c->nops == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        dt__xop *o = realloc(c->ops, sizeof *o * (size_t)cap);
        if (!o)
            return dt__fail(DT_ERR_NOMEM, "device collective: out of memory for %d ops", cap);
        c->ops = o;
        c->cap = cap;
    }
    c->ops[c->nops++] = op;
    return DT_OK;
}

/* The group's set and its communicators, made now when the set lies in this client alone (no
 * peer waits for it: meshes of one client, NCCL asked for on groups inside a client). */
static dt_status group_comms(const dt__coll_req *r, struct dt__devmesh *dm, dt__cgroup *g, int *set)
{
    if (g->xset >= 0)
        return DT_OK;
    bool spans;
    int nm = group_set(r->m, dm, r->mask->axes, g->id, set, &spans);
    int i = find_set(dm, nm, set);
    if (i < 0) {
        if (spans)
            return dt__fail(DT_ERR_STATE,
                            "%s: group %d spans clients but has no communicator (the mesh was "
                            "made without them)",
                            dt__coll_kind_name(r->c.kind), g->id);
        DT_TRY(add_set(dm, nm, set));
        i = dm->nsets - 1;
        xset *x = &dm->sets[i];
        int *ranks = malloc(sizeof(int) * (size_t)nm), *clients = malloc(sizeof(int) * (size_t)nm);
        dt__device **side = malloc(sizeof *side * (size_t)nm);
        dt__xcomm **out = calloc((size_t)nm, sizeof *out);
        dt_status s = ranks && clients && side && out
                          ? DT_OK
                          : dt__fail(DT_ERR_NOMEM, "device collectives: out of memory");
        for (int j = 0; s == DT_OK && j < nm; j++) {
            ranks[j] = j;
            clients[j] = dt__rt.client;
            int l = 0;
            while (dm->rank[l] != set[j])
                l++;
            side[j] = dm->side[l];
        }
        if (s == DT_OK)
            s = dm->x->init(MPI_COMM_NULL, nm, clients, nm, ranks, side, false, out);
        for (int j = 0; s == DT_OK && j < nm; j++) {
            int l = 0;
            while (dm->rank[l] != set[j])
                l++;
            x->comm[l] = out[j];
        }
        free(ranks);
        free(clients);
        free(side);
        free(out);
        if (s != DT_OK) {
            set_free(dm->x, x, dm->k, true);
            dm->nsets--;
            return s;
        }
    }
    g->xset = i;
    return DT_OK;
}

static int local_gpu(const struct dt__devmesh *dm, int rank)
{
    for (int j = 0; j < dm->k; j++)
        if (dm->rank[j] == rank)
            return j;
    return -1;
}

/* The request's GPUs: per group, the runs of its local members on one GPU. */
static dt_status plan_gpus(dt__coll_req *r, struct dt__devmesh *dm, struct dt__dev_call *c)
{
    int G = r->mask->size, total = 0;
    for (int gi = 0; gi < r->num_groups; gi++)
        total += r->gc[gi].g->num_local;
    c->gpus = calloc((size_t)total + 1, sizeof *c->gpus);
    c->first = calloc((size_t)r->num_groups + 1, sizeof *c->first);
    c->srank = malloc(sizeof(int) * ((size_t)r->num_groups * (size_t)G + 1));
    int *set = malloc(sizeof(int) * (size_t)G + 1);
    if (!c->gpus || !c->first || !c->srank || !set) {
        free(set);
        return dt__fail(DT_ERR_NOMEM, "device collective: out of memory");
    }
    dt_status s = DT_OK;
    for (int gi = 0; s == DT_OK && gi < r->num_groups; gi++) {
        dt__cgroup *g = r->gc[gi].g;
        s = group_comms(r, dm, g, set);
        if (s != DT_OK)
            break;
        const xset *x = &dm->sets[g->xset];
        int *sr = c->srank + (size_t)gi * (size_t)G;
        for (int q = 0, at = 0; q < G; q++) {
            int rk = dm->rank_of[dt__group_member(r->m, r->mask->axes, g->id, q)];
            while (x->members[at] != rk)
                at++;
            sr[q] = at;
        }
        c->first[gi] = c->ngpus;
        for (int j = 0; j < g->num_local; j++) {
            int q = g->first_rank + j;
            if (j == 0 || c->gpus[c->ngpus - 1].srank != sr[q]) {
                int l = local_gpu(dm, x->members[sr[q]]);
                c->gpus[c->ngpus++] =
                    (dev_gpu){.a = j, .srank = sr[q], .side = dm->side[l], .comm = x->comm[l]};
            }
            dev_gpu *u = &c->gpus[c->ngpus - 1];
            u->b = j + 1;
            if (u->b - u->a > DT__COMBINE_MAX)
                s = dt__fail(DT_ERR_UNSUPPORTED,
                             "%s: group %d has more than %d devices on one GPU; a device "
                             "collective combines at most %d",
                             dt__coll_kind_name(r->c.kind), g->id, DT__COMBINE_MAX,
                             DT__COMBINE_MAX);
        }
    }
    c->first[r->num_groups] = c->ngpus;
    free(set);
    return s;
}

/* 16-bit float sums and products go through the transport in f32. */
static bool widened(const dt__coll_req *r)
{
    return (r->c.dtype == DT_DTYPE_BF16 || r->c.dtype == DT_DTYPE_F16) &&
           (r->c.kind == DT__COLL_ALL_REDUCE || r->c.kind == DT__COLL_REDUCE_SCATTER) &&
           r->c.op != DT_REDUCE_MAX && r->c.op != DT_REDUCE_MIN;
}

static dt_status scratch(dev_gpu *u, size_t bytes)
{
    void *p = NULL;
    u->scratch_bytes = bytes;
    dt_status s = dt__device_alloc(u->side, bytes, &p);
    u->scratch = p;
    return s;
}

static dt__combine combine_of(const dt__coll_req *r, bool src_wide, bool dst_wide, int64_t n,
                              int by)
{
    return (dt__combine){.dtype = r->c.dtype,
                         .op = r->c.op == DT_REDUCE_MEAN ? DT_REDUCE_SUM : r->c.op,
                         .by = by,
                         .src_wide = src_wide,
                         .dst_wide = dst_wide,
                         .n = n};
}

/* The ranks' superblocks: rank t of the set holds member ranks [lo[t], hi[t]), whose blocks
 * start off(lo[t]) elements into a concatenation. */
static void ranges(const int *sr, int G, int nm, int lo[], int hi[])
{
    for (int t = 0; t < nm; t++)
        lo[t] = hi[t] = -1;
    for (int q = 0; q < G; q++) {
        if (lo[sr[q]] < 0)
            lo[sr[q]] = q;
        hi[sr[q]] = q + 1;
    }
}

/* The ops and the side streams' work of one group. */
static dt_status plan_group(dt__coll_req *r, struct dt__dev_call *c, int gi)
{
    const dt__gcall *gc = &r->gc[gi];
    const dt__cgroup *g = gc->g;
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    const xset *x = &c->dm->sets[g->xset];
    const int *sr = c->srank + (size_t)gi * (size_t)r->mask->size;
    int G = r->mask->size, nm = x->nm;
    size_t es = r->es;
    bool wide = widened(r);
    dt_dtype xt = wide ? DT_DTYPE_F32 : r->c.dtype;
    size_t xs = wide ? sizeof(float) : es;
    dt_reduce_op xop = r->c.op == DT_REDUCE_MEAN ? DT_REDUCE_SUM : r->c.op;
    int *lo = malloc(sizeof(int) * (size_t)nm * 2);
    if (!lo)
        return dt__fail(DT_ERR_NOMEM, "device collective: out of memory");
    int *hi = lo + nm;
    ranges(sr, G, nm, lo, hi);
    /* equal superblocks: the transport's even collectives apply */
    bool even = !gc->cnt;
    for (int t = 1; even && t < nm; t++)
        even = hi[t] - lo[t] == hi[0] - lo[0];
    dt_status s = DT_OK;
    for (int p = c->first[gi]; s == DT_OK && p < c->first[gi + 1]; p++) {
        dev_gpu *u = &c->gpus[p];
        dt__device *S = u->side;
        const dt__dev_ops *ops = S->backend->dev;
        int k = u->b - u->a, me = u->srank;
        const void *send[DT__COMBINE_MAX] = {NULL};
        void *recv[DT__COMBINE_MAX] = {NULL};
        for (int j = 0; j < k; j++) {
            send[j] = gc->send[u->a + j];
            recv[j] = gc->recv[u->a + j];
        }
        for (int j = 0; s == DT_OK && j < k; j++)
            s = ops->side_after(S, devs[g->local[u->a + j]]);
        dt__xop op = {.dtype = xt, .op = xop, .comm = u->comm, .side = S};
        switch (r->c.kind) {
        case DT__COLL_ALL_REDUCE: {
            int64_t n = r->c.count;
            void *L = recv[0];
            if (wide) {
                if (s == DT_OK)
                    s = scratch(u, (size_t)n * xs);
                L = u->scratch;
            }
            dt__combine cb = combine_of(r, false, wide, n, 1);
            cb.nsrc = k;
            cb.ndst = 1;
            cb.dst[0] = L;
            for (int j = 0; j < k; j++)
                cb.src[j] = send[j];
            /* one member and no widening: the transport reads the send buffer itself */
            bool direct = k == 1 && !wide;
            if (s == DT_OK && !direct && n)
                s = ops->side_combine(S, &cb);
            op.kind = DT__XOP_ALL_REDUCE;
            op.send = direct ? send[0] : L;
            op.recv = L;
            op.count = n;
            if (s == DT_OK)
                s = push(c, op);
            break;
        }
        case DT__COLL_ALL_GATHER: {
            char *L = recv[0];
            for (int j = 0; s == DT_OK && j < k; j++) {
                int q = g->first_rank + u->a + j;
                char *at = L + dt__gc_block_off(r, gc, q) * (int64_t)es;
                if (at != send[j])
                    s = ops->side_copy(S, at, send[j], (size_t)dt__gc_block(r, gc, q, 0) * es);
            }
            if (even) {
                int64_t per = dt__gc_block_off(r, gc, hi[0]) - dt__gc_block_off(r, gc, lo[0]);
                op.kind = DT__XOP_ALL_GATHER;
                op.send = L + dt__gc_block_off(r, gc, lo[me]) * (int64_t)es;
                op.recv = L;
                op.count = per;
                if (s == DT_OK)
                    s = push(c, op);
                break;
            }
            for (int t = 0; s == DT_OK && t < nm; t++) {
                char *at = L + dt__gc_block_off(r, gc, lo[t]) * (int64_t)es;
                op.kind = DT__XOP_BROADCAST;
                op.send = op.recv = at;
                op.count = dt__gc_block_off(r, gc, hi[t]) - dt__gc_block_off(r, gc, lo[t]);
                op.peer = t;
                s = push(c, op);
            }
            break;
        }
        case DT__COLL_REDUCE_SCATTER: {
            int64_t total = gc->total;
            int64_t mine = dt__gc_block_off(r, gc, hi[me]) - dt__gc_block_off(r, gc, lo[me]);
            bool direct = k == 1 && !wide;
            /* F: the members' sends combined (or the one send); R: this GPU's superblock */
            const char *F = send[0];
            char *R = recv[0];
            if (!direct) {
                if (s == DT_OK)
                    s = scratch(u, (size_t)total * xs);
                F = u->scratch;
                R = u->scratch + dt__gc_block_off(r, gc, lo[me]) * (int64_t)xs;
                dt__combine cb = combine_of(r, false, wide, total, 1);
                cb.nsrc = k;
                cb.ndst = 1;
                cb.dst[0] = u->scratch;
                for (int j = 0; j < k; j++)
                    cb.src[j] = send[j];
                if (s == DT_OK && total)
                    s = ops->side_combine(S, &cb);
            }
            if (even) {
                op.kind = DT__XOP_REDUCE_SCATTER;
                op.send = F;
                op.recv = R;
                op.count = mine;
                if (s == DT_OK)
                    s = push(c, op);
            }
            for (int t = 0; !even && s == DT_OK && t < nm; t++) {
                const char *at = F + dt__gc_block_off(r, gc, lo[t]) * (int64_t)xs;
                op.kind = DT__XOP_REDUCE;
                op.send = at;
                op.recv = t == me ? (void *)R : (void *)at;
                op.count = dt__gc_block_off(r, gc, hi[t]) - dt__gc_block_off(r, gc, lo[t]);
                op.peer = t;
                s = push(c, op);
            }
            break;
        }
        case DT__COLL_BROADCAST: {
            char *L = recv[0];
            int root = sr[r->c.root];
            if (root == me) {
                int j = r->c.root - g->first_rank - u->a;
                if (s == DT_OK && L != send[j])
                    s = ops->side_copy(S, L, send[j], (size_t)r->c.count * es);
            }
            op.kind = DT__XOP_BROADCAST;
            op.send = op.recv = L;
            op.count = r->c.count;
            op.peer = root;
            if (s == DT_OK)
                s = push(c, op);
            break;
        }
        case DT__COLL_ALL_TO_ALL:
            /* member s sends block (s, t) to member t: on this GPU by side copies, to other
             * GPUs by sends, which every pair of ranks issues sender-major, receiver-minor */
            for (int j = 0; s == DT_OK && j < k; j++) {
                int q = g->first_rank + u->a + j;
                int64_t so = 0;
                for (int t = 0; s == DT_OK && t < G; t++) {
                    int64_t n = dt__gc_block(r, gc, q, t);
                    const char *from = (const char *)send[j] + so * (int64_t)es;
                    so += n;
                    if (!n)
                        continue;
                    if (sr[t] == me) {
                        int64_t ro = 0;
                        for (int b = 0; b < q; b++)
                            ro += dt__gc_block(r, gc, b, t);
                        char *to = (char *)gc->recv[t - g->first_rank] + ro * (int64_t)es;
                        s = ops->side_copy(S, to, from, (size_t)n * es);
                        continue;
                    }
                    op.kind = DT__XOP_SEND;
                    op.send = from;
                    op.count = n;
                    op.peer = sr[t];
                    s = push(c, op);
                }
            }
            for (int q = 0; s == DT_OK && q < G; q++) {
                if (sr[q] == me)
                    continue;
                for (int j = 0; s == DT_OK && j < k; j++) {
                    int t = g->first_rank + u->a + j;
                    int64_t n = dt__gc_block(r, gc, q, t), ro = 0;
                    for (int b = 0; b < q; b++)
                        ro += dt__gc_block(r, gc, b, t);
                    if (!n)
                        continue;
                    op.kind = DT__XOP_RECV;
                    op.recv = (char *)recv[j] + ro * (int64_t)es;
                    op.count = n;
                    op.peer = sr[q];
                    op.send = NULL;
                    s = push(c, op);
                }
            }
            break;
        default:
            s = dt__fail(DT_ERR_ARG, "device collective: kind %d", (int)r->c.kind);
        }
    }
    free(lo);
    return s;
}

/* After the transport: each member's result, on its GPU's side stream. */
static dt_status finish_group(dt__coll_req *r, struct dt__dev_call *c, int gi)
{
    const dt__gcall *gc = &r->gc[gi];
    const dt__cgroup *g = gc->g;
    const xset *x = &c->dm->sets[g->xset];
    const int *sr = c->srank + (size_t)gi * (size_t)r->mask->size;
    int G = r->mask->size, nm = x->nm;
    size_t es = r->es;
    bool wide = widened(r);
    size_t xs = wide ? sizeof(float) : es;
    int by = r->c.op == DT_REDUCE_MEAN ? G : 1;
    int *lo = malloc(sizeof(int) * (size_t)nm * 2);
    if (!lo)
        return dt__fail(DT_ERR_NOMEM, "device collective: out of memory");
    int *hi = lo + nm;
    ranges(sr, G, nm, lo, hi);
    dt_status s = DT_OK;
    for (int p = c->first[gi]; s == DT_OK && p < c->first[gi + 1]; p++) {
        dev_gpu *u = &c->gpus[p];
        dt__device *S = u->side;
        const dt__dev_ops *ops = S->backend->dev;
        int k = u->b - u->a;
        void *recv[DT__COMBINE_MAX] = {NULL};
        for (int j = 0; j < k; j++)
            recv[j] = gc->recv[u->a + j];
        switch (r->c.kind) {
        case DT__COLL_ALL_REDUCE: {
            /* the result (in recv[0], or the widened scratch) to every member, divided */
            int64_t n = r->c.count;
            if (!n || (k == 1 && !wide && by == 1))
                break;
            dt__combine cb = combine_of(r, wide, false, n, by);
            cb.nsrc = 1;
            cb.src[0] = wide ? u->scratch : recv[0];
            cb.ndst = k;
            for (int j = 0; j < k; j++)
                cb.dst[j] = recv[j];
            s = ops->side_combine(S, &cb);
            break;
        }
        case DT__COLL_ALL_GATHER:
        case DT__COLL_BROADCAST: {
            size_t bytes = (size_t)(r->c.kind == DT__COLL_BROADCAST ? r->c.count : gc->total) * es;
            for (int j = 1; s == DT_OK && j < k; j++)
                s = ops->side_copy(S, recv[j], recv[0], bytes);
            break;
        }
        case DT__COLL_REDUCE_SCATTER: {
            if (k == 1 && !wide && by == 1)
                break; /* the transport wrote the member's block itself */
            const char *R = k == 1 && !wide
                                ? (const char *)recv[0]
                                : u->scratch + dt__gc_block_off(r, gc, lo[u->srank]) * (int64_t)xs;
            for (int j = 0; s == DT_OK && j < k; j++) {
                int q = g->first_rank + u->a + j;
                int64_t n = dt__gc_block(r, gc, q, 0);
                if (!n)
                    continue;
                dt__combine cb = combine_of(r, wide, false, n, by);
                cb.nsrc = cb.ndst = 1;
                cb.src[0] =
                    k == 1 && !wide
                        ? R
                        : R + (dt__gc_block_off(r, gc, q) - dt__gc_block_off(r, gc, lo[u->srank])) *
                                  (int64_t)xs;
                cb.dst[0] = recv[j];
                s = ops->side_combine(S, &cb);
            }
            break;
        }
        default:
            break;
        }
    }
    free(lo);
    return s;
}

/* Queue it: the side streams wait for the members' compute streams, combine the logical
 * devices of each GPU, run the transport, and give each member its result; nothing waits on
 * the host. A failure aborts the mesh's communicators and marks its devices dead. */
static dt_status dev_start(dt__coll_req *r)
{
    const dt_mesh *m = r->m;
    dt_mesh *mm = (dt_mesh *)m;
    dt__device *const *devs = dt__mesh_local_devices(m);
    if (!mm->coll && !(mm->coll = calloc(1, sizeof *mm->coll)))
        return dt__fail(DT_ERR_NOMEM, "collectives: out of memory");
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < m->num_local; i++)
        s = dt__device_alive(devs[i]);
    if (s == DT_OK && !m->coll->dev)
        s = devmesh_build(m, xport_of(m->type), &mm->coll->dev);
    struct dt__dev_call *c = s == DT_OK ? calloc(1, sizeof *c) : NULL;
    if (s == DT_OK && !c)
        s = dt__fail(DT_ERR_NOMEM, "device collective: out of memory");
    if (s != DT_OK)
        return s;
    r->dev = c;
    c->dm = m->coll->dev;
    r->backend = c->dm->x->name;
    s = plan_gpus(r, m->coll->dev, c);
    int at;
    static int calls;
    dt__fault_kind f = dt__coll_fault(&at);
    calls++;
    if (s == DT_OK && f == DT__FAULT_KILL && calls == at) { /* a peer dies without a word (tests) */
        fprintf(stderr, "dtensor: DTENSOR_FAULT: client %d exits in its device collective %d\n",
                dt__rt.client, calls);
        _exit(0);
    }
    if (s == DT_OK && f == DT__FAULT_ENQUEUE && calls == at)
        s = dt__fail(DT_ERR_DEVICE, "%s: enqueue failed on client %d (DTENSOR_FAULT)",
                     dt__coll_kind_name(r->c.kind), dt__rt.client);
    c->queued = s == DT_OK;
    for (int gi = 0; s == DT_OK && gi < r->num_groups; gi++)
        s = plan_group(r, c, gi);
    if (s == DT_OK && c->nops)
        s = c->dm->x->run(c->nops, c->ops);
    for (int gi = 0; s == DT_OK && gi < r->num_groups; gi++)
        s = finish_group(r, c, gi);
    /* until the members wait, their buffers may be in use on the side streams */
    for (int gi = 0; s == DT_OK && gi < r->num_groups; gi++)
        for (int p = c->first[gi]; p < c->first[gi + 1]; p++)
            for (int j = c->gpus[p].a; j < c->gpus[p].b; j++)
                atomic_store(&devs[r->gc[gi].g->local[j]]->fence, c->gpus[p].side);
    if (s != DT_OK) {
        fail_mesh(m);
        dt__dev_call_free(r);
    }
    return s;
}

/* Every member's compute stream waits for its side stream (consumers come after), and the
 * request's temporaries go back. A failure aborts the mesh's communicators and marks its
 * devices dead. */
static dt_status dev_wait(dt__coll_req *r)
{
    struct dt__dev_call *c = r->dev;
    if (!c)
        return DT_OK;
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    dt_status s = DT_OK;
    for (int gi = 0; c->queued && gi < r->num_groups; gi++)
        for (int p = c->first[gi]; p < c->first[gi + 1]; p++) {
            dev_gpu *u = &c->gpus[p];
            const dt__dev_ops *ops = u->side->backend->dev;
            for (int j = u->a; j < u->b; j++) {
                dt__device *d = devs[r->gc[gi].g->local[j]];
                dt_status t = ops->after_side(d, u->side);
                atomic_store(&d->fence, NULL);
                s = s == DT_OK ? t : s;
            }
            /* the scratch goes back to the side device's compute stream */
            if (u->scratch) {
                dt_status t = ops->after_side(u->side, u->side);
                s = s == DT_OK ? t : s;
            }
        }
    if (s != DT_OK)
        fail_mesh(r->m);
    dt__dev_call_free(r);
    return s;
}

static const dt__transport dev_transport = {.name = "device",
                                            .priority = 10,
                                            .ledger = "nccl",
                                            .algorithm = DT_ALGORITHM_NCCL,
                                            .group_comms = false,
                                            .usable = dev_applies,
                                            .start = dev_start,
                                            .finish = dev_wait};

__attribute__((constructor)) static void dev_register(void)
{
    dt__transport_add(&dev_transport);
}
