/* The collectives entry points: validation, the optional agreement check, the choice of
 * algorithm per group, and start / wait over the transport the table gives (dt__transport). */
#include "coll_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Local phases go to the device workers from this many bytes per device; below it the
 * caller does them (a hand-off costs more than the copy). */
#define DT__PARALLEL_MIN_BYTES ((int64_t)256 << 10)

const char *dt__coll_kind_name(dt__coll_kind k)
{
    static const char *const names[] = {
#define NAME(NAME, name) [DT__COLL_##NAME] = #name,
        DT__COLL_KIND_LIST(NAME)
#undef NAME
    };
    return (unsigned)k < DT__COLL_KIND_COUNT ? names[k] : "?";
}

const char *dt_collective_algorithm_name(dt_collective_algorithm a)
{
    static const char *const names[] = {
#define NAME(NAME, name) [DT_ALGORITHM_##NAME] = #name,
        DT_ALGORITHM_LIST(NAME)
#undef NAME
    };
    return (unsigned)a < DT_ALGORITHM_COUNT ? names[a] : "?";
}

dt_status dt_mesh_set_collective_algorithm(dt_mesh *m, dt_collective_algorithm a)
{
    DT__SERIAL();
    if (!m)
        return dt__fail(DT_ERR_ARG, "dt_mesh_set_collective_algorithm: mesh is NULL");
    if ((unsigned)a >= DT_ALGORITHM_COUNT)
        return dt__fail(DT_ERR_ARG,
                        "dt_mesh_set_collective_algorithm: algorithm %d is outside 0..%d", (int)a,
                        DT_ALGORITHM_COUNT - 1);
    DT_TRY(dt__coll_check_algorithm(m->type, a, "dt_mesh_set_collective_algorithm"));
    m->coll_algorithm = a;
    return DT_OK;
}

dt_collective_algorithm dt_mesh_collective_algorithm(const dt_mesh *m)
{
    DT__SERIAL();
    return m ? m->coll_algorithm : DT_ALGORITHM_AUTO;
}

/* Collectives of a mesh of `type` run on its devices (GPUs) rather than through host memory. */
static bool on_devices(dt_device_type type)
{
    const dt__backend *be = dt__backend_of(type);
    return be && be->device_collectives;
}

dt_status dt__coll_check_algorithm(dt_device_type type, dt_collective_algorithm a, const char *fn)
{
    if (on_devices(type) && a != DT_ALGORITHM_AUTO && a != DT_ALGORITHM_NCCL)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "%s: CUDA devices exchange by device copies (auto) or through NCCL, %s "
                        "was asked for",
                        fn, dt_collective_algorithm_name(a));
    if (type == DT_DEVICE_CUDA && !dt__backend_of(type))
        return dt__fail(DT_ERR_UNSUPPORTED, "%s: built without CUDA, so without NCCL", fn);
    if (!on_devices(type) && a == DT_ALGORITHM_NCCL)
        return dt__fail(
            DT_ERR_UNSUPPORTED, "%s: nccl needs CUDA devices on GPUs, the mesh has %s devices%s",
            fn, dt_device_type_name(type),
            type == DT_DEVICE_CUDA ? " emulated on the host (DTENSOR_EMULATE_CUDA)" : "");
    return DT_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void axes_str(const dt_mesh *m, unsigned axes, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int a = 0; a < m->num_axes && n < size; a++)
        if (axes >> a & 1u)
            n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? "," : "", m->names[a]);
}

dt__fault_kind dt__coll_fault(int *at)
{
    static int parsed, kind, client, nth;
    if (!parsed) {
        parsed = 1;
        const char *e = getenv("DTENSOR_FAULT");
        char what[16] = "";
        int c = -1, k = 1;
        if (e && sscanf(e, "%15[a-z]:%d:%d", what, &c, &k) >= 2) {
            kind = !strcmp(what, "comm")      ? DT__FAULT_COMM
                   : !strcmp(what, "enqueue") ? DT__FAULT_ENQUEUE
                   : !strcmp(what, "kill")    ? DT__FAULT_KILL
                   : !strcmp(what, "post")    ? DT__FAULT_POST
                                              : DT__FAULT_NONE;
            client = c;
            nth = k;
        }
    }
    *at = nth;
    return client == dt__rt.client ? (dt__fault_kind)kind : DT__FAULT_NONE;
}

/* ---- validation (pure metadata, the same verdict on every client) ------------------------- */

static dt_status validate_header(const dt_mesh *m, const dt__coll *c)
{
    if (!m || !c)
        return dt__fail(DT_ERR_ARG, "collective: mesh or description is NULL");
    const char *kn = dt__coll_kind_name(c->kind);
    if ((unsigned)c->kind >= DT__COLL_KIND_COUNT)
        return dt__fail(DT_ERR_ARG, "collective: kind %d is outside 0..%d", (int)c->kind,
                        DT__COLL_KIND_COUNT - 1);
    DT_TRY(dt__dtype_check(kn, c->dtype, DT__ANY));
    if ((c->kind == DT__COLL_ALL_REDUCE || c->kind == DT__COLL_REDUCE_SCATTER) &&
        (unsigned)c->op >= DT_REDUCE_COUNT)
        return dt__fail(DT_ERR_ARG, "%s: reduction %d is outside 0..%d", kn, (int)c->op,
                        DT_REDUCE_COUNT - 1);
    if (c->axes >> m->num_axes)
        return dt__fail(DT_ERR_ARG, "%s: axis mask 0x%x names axes beyond the mesh's %d", kn,
                        c->axes, m->num_axes);
    if ((unsigned)c->algorithm >= DT_ALGORITHM_COUNT)
        return dt__fail(DT_ERR_ARG, "%s: algorithm %d is outside 0..%d", kn, (int)c->algorithm,
                        DT_ALGORITHM_COUNT - 1);
    if (c->counts && c->kind != DT__COLL_ALL_GATHER && c->kind != DT__COLL_REDUCE_SCATTER &&
        c->kind != DT__COLL_ALL_TO_ALL)
        return dt__fail(DT_ERR_ARG, "%s has no uneven form, but counts were given", kn);
    if (!c->counts && c->count < 0)
        return dt__fail(DT_ERR_ARG, "%s: count is %lld", kn, (long long)c->count);
    int g = dt__group_size(m, c->axes);
    if (c->kind == DT__COLL_BROADCAST && (c->root < 0 || c->root >= g))
        return dt__fail(DT_ERR_ARG, "broadcast: root %d is outside the group's 0..%d", c->root,
                        g - 1);
    if (m->num_local > 0 && (!c->recv || (!c->send && c->kind != DT__COLL_BROADCAST)))
        return dt__fail(DT_ERR_ARG, "%s: the send or recv array is NULL", kn);
    if (c->counts)
        for (int i = 0; i < m->num_local; i++)
            if (!c->counts[i])
                return dt__fail(DT_ERR_ARG, "%s: counts[%d] is NULL", kn, i);
    dt_collective_algorithm a =
        c->algorithm != DT_ALGORITHM_AUTO ? c->algorithm : m->coll_algorithm;
    return dt__coll_check_algorithm(m->type, a, kn);
}

/* Counts of one group: every local member passes the same array, no entry is negative. */
static dt_status validate_group(dt__coll_req *r, dt__gcall *gc)
{
    const char *kn = dt__coll_kind_name(r->c.kind);
    const dt__cgroup *g = gc->g;
    int G = r->mask->size;
    int64_t len = r->c.kind == DT__COLL_ALL_TO_ALL ? (int64_t)G * G : G;
    if (gc->cnt) {
        for (int64_t e = 0; e < len; e++)
            if (gc->cnt[e] < 0)
                return dt__fail(DT_ERR_ARG, "%s: counts[%d][%lld] is %lld", kn, g->local[0],
                                (long long)e, (long long)gc->cnt[e]);
        for (int j = 1; j < g->num_local; j++) {
            const int64_t *o = r->c.counts[g->local[j]];
            for (int64_t e = 0; e < len; e++)
                if (o[e] != gc->cnt[e])
                    return dt__fail(DT_ERR_ARG,
                                    "%s: devices %d and %d of group %d pass different counts: "
                                    "entry %lld is %lld and %lld",
                                    kn, r->m->first_local + g->local[0],
                                    r->m->first_local + g->local[j], g->id, (long long)e,
                                    (long long)gc->cnt[e], (long long)o[e]);
        }
    }
    gc->total = 0;
    if (r->c.kind == DT__COLL_ALL_GATHER || r->c.kind == DT__COLL_REDUCE_SCATTER)
        for (int b = 0; b < G; b++)
            gc->total += dt__gc_block(r, gc, b, 0);
    /* per-device sizes: buffers present where needed, and the ledger's bytes */
    int64_t es = (int64_t)r->es;
    for (int j = 0; j < g->num_local; j++) {
        int q = g->first_rank + j;
        int64_t ns = 0, nr = 0, sent = 0, recd = 0;
        switch (r->c.kind) {
        case DT__COLL_ALL_REDUCE:
            ns = nr = r->c.count;
            sent = recd = G > 1 ? 2 * (G - 1) * r->c.count / G : 0;
            break;
        case DT__COLL_ALL_GATHER:
            ns = dt__gc_block(r, gc, q, 0);
            nr = gc->total;
            sent = ns * (G - 1);
            recd = nr - ns;
            break;
        case DT__COLL_REDUCE_SCATTER:
            ns = gc->total;
            nr = dt__gc_block(r, gc, q, 0);
            sent = ns - nr;
            recd = nr * (G - 1);
            break;
        case DT__COLL_ALL_TO_ALL:
            for (int t = 0; t < G; t++) {
                ns += dt__gc_block(r, gc, q, t);
                nr += dt__gc_block(r, gc, t, q);
            }
            sent = ns - dt__gc_block(r, gc, q, q);
            recd = nr - dt__gc_block(r, gc, q, q);
            break;
        case DT__COLL_BROADCAST:
            ns = q == r->c.root ? r->c.count : 0;
            nr = r->c.count;
            sent = ns * (G - 1);
            recd = q == r->c.root ? 0 : nr;
            break;
        default:
            break;
        }
        if ((ns > 0 && !gc->send[j]) || (nr > 0 && !gc->recv[j]))
            return dt__fail(DT_ERR_ARG, "%s: local device %d has a NULL %s buffer of %lld elements",
                            kn, g->local[j], ns > 0 && !gc->send[j] ? "send" : "recv",
                            (long long)(ns > 0 && !gc->send[j] ? ns : nr));
        gc->max_sent = sent * es > gc->max_sent ? sent * es : gc->max_sent;
        gc->max_recv = recd * es > gc->max_recv ? recd * es : gc->max_recv;
        int64_t most = ns > nr ? ns : nr;
        if (most * es >= DT__PARALLEL_MIN_BYTES)
            r->parallel = true;
    }
    return DT_OK;
}

/* ---- agreement check (DTENSOR_CHECK_COLLECTIVES=1) ------------------------------------------ */

#define DT__SIG_GROUPS 8
/* What one client's collective is, as the clients compare it (fixed layout, zeroed padding). */
typedef struct dt__sig {
    int32_t kind, dtype, op, root, algorithm;
    uint32_t axes;
    int32_t num_groups, pad;
    int64_t count;
    struct {
        int32_t id, pad;
        int64_t total;
        uint64_t hash;
    } groups[DT__SIG_GROUPS];
} dt__sig;

typedef struct sig_ctx {
    const dt_mesh *m;
    const dt__sig *sig;
} sig_ctx;

static int sig_fields(const void *ctx, dt__field out[], int max)
{
    const dt__sig *g = ((const sig_ctx *)ctx)->sig;
    const dt_mesh *m = ((const sig_ctx *)ctx)->m;
    char axes[DT_STRING_MAX], nm[48];
    int n = 0;
#define FIELD(...)                                 \
    do {                                           \
        if (n < max)                               \
            dt__field_set(&out[n++], __VA_ARGS__); \
    } while (0)
    FIELD("dtype", &g->dtype, sizeof g->dtype, "%s",
          dt__dtype_valid((dt_dtype)g->dtype) ? dt_dtype_name((dt_dtype)g->dtype) : "?");
    FIELD("reduction", &g->op, sizeof g->op, "%s",
          g->kind == DT__COLL_ALL_REDUCE || g->kind == DT__COLL_REDUCE_SCATTER
              ? dt_reduce_op_name((dt_reduce_op)g->op)
              : "-");
    if (g->count >= 0)
        FIELD("count", &g->count, sizeof g->count, "count %lld", (long long)g->count);
    else
        FIELD("count", &g->count, sizeof g->count, "uneven counts");
    axes_str(m, g->axes, axes, sizeof axes);
    FIELD("mesh axes", &g->axes, sizeof g->axes, "{%s}", axes);
    FIELD("root", &g->root, sizeof g->root, "%d", g->root);
    FIELD("algorithm", &g->algorithm, sizeof g->algorithm, "%s",
          dt_collective_algorithm_name((dt_collective_algorithm)g->algorithm));
    FIELD("groups", &g->num_groups, sizeof g->num_groups, "%d", g->num_groups);
    for (int i = 0; i < g->num_groups && i < DT__SIG_GROUPS; i++) {
        snprintf(nm, sizeof nm, "counts of group %d", g->groups[i].id);
        FIELD(nm, &g->groups[i], sizeof g->groups[i], "totalling %lld (hash %016llx)",
              (long long)g->groups[i].total, (unsigned long long)g->groups[i].hash);
    }
#undef FIELD
    return n;
}

/* DTENSOR_CHECK_COLLECTIVES=1: before it moves data, every client of the mesh agrees that all
 * issue this collective with the same kind, dtype, reduction, count, axes, root, algorithm and
 * per-group counts (through the agreement channel, whose sequence number also catches a client
 * that skipped a collective); a difference fails on every client naming the first field. */
static dt_status check_agreement(dt__coll_req *r, dt_status local)
{
    const dt_mesh *m = r->m;
    dt__sig mine;
    memset(&mine, 0, sizeof mine);
    mine.kind = r->c.kind;
    mine.dtype = r->c.dtype;
    mine.op = r->c.op == DT_REDUCE_MEAN ? DT_REDUCE_MEAN : r->c.op;
    if (r->c.kind != DT__COLL_ALL_REDUCE && r->c.kind != DT__COLL_REDUCE_SCATTER)
        mine.op = 0;
    mine.root = r->c.kind == DT__COLL_BROADCAST ? r->c.root : 0;
    mine.algorithm = r->c.algorithm;
    mine.axes = r->c.axes;
    mine.count = r->c.counts ? -1 : r->c.count;
    for (int gi = 0; local == DT_OK && gi < r->num_groups && gi < DT__SIG_GROUPS; gi++) {
        const dt__gcall *gc = &r->gc[gi];
        mine.groups[gi].id = gc->g->id;
        if (gc->cnt) {
            int G = r->mask->size;
            int64_t len = r->c.kind == DT__COLL_ALL_TO_ALL ? (int64_t)G * G : G;
            mine.groups[gi].hash = dt__hash(DT__HASH_SEED, gc->cnt, sizeof(int64_t) * (size_t)len);
            mine.groups[gi].total = gc->total;
        }
        mine.num_groups = gi + 1;
    }
    if (m->comm == MPI_COMM_NULL || m->num_clients == 1)
        return local;
    /* the collective's name is the call compared; the op that issued it stays the call a
     * timeout names */
    const char *call = dt__current_call();
    sig_ctx ctx = {m, &mine};
    dt_status s =
        dt__mesh_agree(m, local,
                       &(dt__agreement){.what = dt__coll_kind_name(r->c.kind),
                                        .fingerprint = dt__hash(DT__HASH_SEED, &mine, sizeof mine),
                                        .fields = sig_fields,
                                        .ctx = &ctx});
    dt__set_current_call(call);
    return s;
}

/* ---- requests -------------------------------------------------------------------------------- */

/* Leave a group call's MPI requests pending and the buffers they may still write to MPI: a
 * collective can be neither cancelled nor freed while active (MPI-3), and a cancelled receive
 * may still complete. Only a failure leaves requests live (the watchdog's, a post or a test
 * that failed), after which the mesh's collectives are not matched across clients anyway. */
static void abandon(dt__coll_req *r, dt__gcall *gc)
{
    gc->nreq = 0;
    gc->stage = gc->hbuf = NULL;
    r->stage = NULL;
    gc->uses_scratch = gc->own_scratch = false;
    if (gc->acc == r->mask->scratch || gc->tmp == r->mask->scratch) {
        r->mask->scratch = NULL; /* a new one next time */
        r->mask->scratch_bytes = 0;
        r->mask->scratch_busy = false;
    }
}

static void req_free(dt__coll_req *r)
{
    if (!r)
        return;
    for (int gi = 0; r->gc && gi < r->num_groups; gi++) {
        dt__gcall *gc = &r->gc[gi];
        dt__lane_leave(gc);
        for (int q = 0; q < gc->nreq; q++)
            if (gc->req[q] != MPI_REQUEST_NULL) {
                abandon(r, gc);
                break;
            }
        free(gc->stage);
        free(gc->hbuf);
        char *work = gc->acc < gc->tmp ? gc->acc : gc->tmp; /* the ring may swap them */
        if (gc->own_scratch)
            free(work);
        if (gc->uses_scratch)
            r->mask->scratch_busy = false;
    }
    free(r->gc);
    free(r->block);
    dt__coll_stage_free(r->stage);
    dt__dev_call_free(r);
    free(r);
}

/* Per group: the call's buffers and counts, and how it crosses clients. */
static dt_status plan(dt__coll_req *r)
{
    dt__cmask *k = r->mask;
    int ng = k->num_groups, G = k->size;
    size_t per = 0;
    for (int gi = 0; gi < ng; gi++) {
        const dt__cgroup *g = &k->groups[gi];
        per += 2 * sizeof(void *) * (size_t)g->num_local +
               sizeof(int) * 4 * (size_t)g->num_clients +
               sizeof(int64_t) * ((size_t)g->num_clients + 1);
    }
    r->gc = calloc((size_t)(ng ? ng : 1), sizeof *r->gc);
    char *block = calloc(1, per + 16);
    if (!r->gc || !block) {
        free(block);
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory for %d groups",
                        dt__coll_kind_name(r->c.kind), ng);
    }
    r->num_groups = ng;
    r->block = block; /* every group's small arrays */
    char *p = block;
    dt_collective_algorithm a =
        r->c.algorithm != DT_ALGORITHM_AUTO ? r->c.algorithm : r->m->coll_algorithm;
    bool spans = false, stacked = false, ring = false, rtod = false, hosts = false;
    for (int gi = 0; gi < ng; gi++) {
        dt__gcall *gc = &r->gc[gi];
        dt__cgroup *g = &k->groups[gi];
        gc->r = r;
        gc->g = g;
        gc->send = (const void **)(void *)p;
        p += sizeof(void *) * (size_t)g->num_local;
        gc->recv = (void **)p;
        p += sizeof(void *) * (size_t)g->num_local;
        gc->seg = (int64_t *)(void *)p;
        p += sizeof(int64_t) * ((size_t)g->num_clients + 1);
        gc->mc = (int *)(void *)p;
        p += sizeof(int) * 4 * (size_t)g->num_clients;
        for (int j = 0; j < g->num_local; j++) {
            int i = g->local[j];
            gc->send[j] = r->c.send ? r->c.send[i] : NULL;
            gc->recv[j] = r->c.recv[i];
        }
        gc->cnt = r->c.counts ? r->c.counts[g->local[0]] : NULL;
        DT_TRY(validate_group(r, gc));
        int64_t bytes =
            (r->c.kind == DT__COLL_ALL_REDUCE ? r->c.count : gc->total) * (int64_t)r->es;
        if (g->num_clients < 2)
            gc->mode = DT__X_NONE;
        else if (dt__hosts_choose(r->c.kind, a, g->hosts, g->num_clients, bytes))
            gc->mode = DT__X_HOSTS;
        else if (r->c.kind == DT__COLL_ALL_REDUCE && a == DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE)
            gc->mode = DT__X_REDUCE_BCAST;
        else if ((r->c.kind == DT__COLL_ALL_REDUCE || r->c.kind == DT__COLL_REDUCE_SCATTER ||
                  r->c.kind == DT__COLL_ALL_GATHER) &&
                 (a == DT_ALGORITHM_RING ||
                  (a == DT_ALGORITHM_AUTO && r->c.kind != DT__COLL_ALL_GATHER &&
                   bytes >= DT__RING_MIN_BYTES)))
            gc->mode = DT__X_RING;
        else
            gc->mode = DT__X_NATIVE;
        spans |= g->num_clients > 1;
        stacked |= g->num_clients > 1 && g->num_local > 1;
        ring |= gc->mode == DT__X_RING;
        rtod |= gc->mode == DT__X_REDUCE_BCAST;
        hosts |= gc->mode == DT__X_HOSTS;
    }
    (void)G;
    r->block = block;
    /* [some group goes by host][staged to the host][several devices on a client of a group] */
    static const char *const names[2][2][2] = {
        {{"mpi", "hierarchical"}, {"mpi (host-staged)", "hierarchical (host-staged)"}},
        {{"mpi by host", "hierarchical by host"},
         {"mpi by host (host-staged)", "hierarchical by host (host-staged)"}},
    };
    r->backend = spans ? names[hosts][r->stage != NULL][stacked] : "local";
    r->algorithm = ring ? DT_ALGORITHM_RING
                   : rtod || a == DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE
                       ? DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE
                       : DT_ALGORITHM_HIERARCHICAL_COPY;
    /* the device transports name themselves (the device transport by its link at start) */
    if (r->transport->ledger) {
        r->backend = r->transport->ledger;
        r->algorithm = r->transport->algorithm;
    }
    return DT_OK;
}

/* ---- the transports ------------------------------------------------------------------------ */

/* Sorted by priority, lowest first; filled before main (constructors), read-only afterwards. */
static const dt__transport *transports[8];
static int num_transports;

void dt__transport_add(const dt__transport *t)
{
    if (num_transports == (int)(sizeof transports / sizeof *transports))
        abort(); /* a broken invariant of the build: more transports than slots */
    int i = num_transports++;
    for (; i > 0 && transports[i - 1]->priority > t->priority; i--)
        transports[i] = transports[i - 1];
    transports[i] = t;
}

/* The first transport, by priority, that carries r (the host transport carries any). */
static const dt__transport *choose(const dt__coll_req *r)
{
    for (int i = 0; i < num_transports; i++)
        if (transports[i]->usable(r))
            return transports[i];
    abort(); /* a broken invariant of the build: no transport left */
}

dt_status dt__collective_start(const dt_mesh *m, const dt__coll *c, dt__coll_req **out)
{
    if (out)
        *out = NULL;
    if (!out)
        return dt__fail(DT_ERR_ARG, "collective: out is NULL");
    dt_status s = validate_header(m, c);
    bool check = dt__rt.check_collectives;
    if (s != DT_OK && !(check && m && c))
        return s;
    dt__coll_req *r = calloc(1, sizeof *r);
    if (!r)
        return dt__fail(DT_ERR_NOMEM, "collective: out of memory");
    r->t0 = now();
    r->m = m;
    r->c = *c;
    r->es = dt__dtype_valid(c->dtype) ? dt_dtype_size(c->dtype) : 1;
    unsigned axes = c->axes & ((1u << m->num_axes) - 1u);
    if (s == DT_OK)
        s = dt__coll_mask(m, axes, false, &r->mask);
    /* the first transport by priority that carries it (coll_internal.h: across clients, GPUs
     * exchange on the devices unless clients share a GPU, NCCL refusing two ranks on one; then
     * through host copies) */
    if (s == DT_OK) {
        r->transport = choose(r);
        if (r->transport->prepare)
            s = r->transport->prepare(r);
    }
    if (s == DT_OK)
        s = plan(r);
    if (s == DT_OK && r->transport->check)
        s = r->transport->check(r);
    if (check)
        s = check_agreement(r, s);
    if (s == DT_OK)
        s = dt__coll_mask(m, axes, r->transport->group_comms, &r->mask);
    if (s == DT_OK) {
        r->mask->seq++;
        s = r->transport->start(r);
    }
    if (s != DT_OK) {
        req_free(r);
        return s;
    }
    r->t_started = now();
    *out = r;
    return DT_OK;
}

/* Advance a started collective without blocking, where its transport progresses on this
 * thread (the host path: MPI, shared memory, host-staged copies of device buffers); true once
 * it is done (a failure is kept for the wait to return). */
bool dt__collective_test(dt__coll_req *r)
{
    if (!r || !r->transport->progress)
        return false;
    if (r->poked != DT_OK || r->t_done > 0)
        return true;
    dt_status s = DT_OK;
    if (!r->transport->progress(r, &s))
        return false;
    if (s != DT_OK) {
        r->poked = s;
        snprintf(r->poked_msg, sizeof r->poked_msg, "%s", dt_last_error());
    }
    r->t_done = now();
    return true;
}

/* The watchdog in a collective: name the collective, its mesh axes and the clients of this
 * client's groups. MPI cannot cancel a collective, so its requests and the buffers they write
 * are abandoned, not freed. */
static dt_status gave_up(dt__coll_req *r, const dt__waiter *w)
{
    char axes[DT_STRING_MAX], mesh[DT_STRING_MAX], who[256] = "", where[DT_STRING_MAX * 2 + 400];
    axes_str(r->m, r->c.axes, axes, sizeof axes);
    dt_mesh_format(r->m, mesh, sizeof mesh);
    size_t k = 0;
    for (int gi = 0; gi < r->num_groups && k < sizeof who; gi++) {
        const dt__gcall *gc = &r->gc[gi];
        if (gc->done || gc->g->num_clients < 2)
            continue;
        char list[200];
        dt__clients_str(list, sizeof list, gc->g->clients, gc->g->num_clients);
        k += (size_t)snprintf(who + k, sizeof who - k, "%sgroup %d: %s", k ? "; " : "", gc->g->id,
                              list);
    }
    snprintf(where, sizeof where, "in %s over axes {%s} of mesh %s (%s)",
             dt__coll_kind_name(r->c.kind), axes, mesh, k ? who : "this client's groups");
    for (int gi = 0; gi < r->num_groups; gi++)
        if (!r->gc[gi].done)
            abandon(r, &r->gc[gi]);
    return dt__gave_up(w, where, NULL);
}

dt_status dt__collective_wait(dt__coll_req *r)
{
    if (!r)
        return dt__fail(DT_ERR_ARG, "collective wait: request is NULL");
    dt_status s = DT_OK;
    const dt__transport *t = r->transport;
    r->t_wait = now();
    if (t->progress) {
        if (r->poked != DT_OK) {
            dt__set_error(r->poked_msg);
            s = r->poked;
        }
        dt__waiter w;
        dt__wait_begin(&w);
        while (s == DT_OK && !t->progress(r, &s))
            if (dt__wait_pause(&w)) {
                s = gave_up(r, &w);
                break;
            }
        dt__wait_end(&w);
        if (r->t_done <= 0)
            r->t_done = now();
    }
    if (s == DT_OK && t->finish)
        s = t->finish(r);
    if (s == DT_OK)
        dt__ledger_record(r, now());
    req_free(r);
    return s;
}

dt_status dt__collective(const dt_mesh *m, const dt__coll *c)
{
    dt__coll_req *r;
    DT_TRY(dt__collective_start(m, c, &r));
    return dt__collective_wait(r);
}

void dt__coll_axes_str(const dt_mesh *m, unsigned axes, char *buf, size_t size)
{
    axes_str(m, axes, buf, size);
}

/* mesh/ makes and frees the collectives' state per mesh and per runtime through these. */
static const dt__hooks coll_hooks = {.floor = DT__FLOOR_COLLECTIVES,
                                     .mpi_up = dt__coll_init,
                                     .mpi_down = dt__coll_shutdown,
                                     .mesh_made = dt__coll_mesh_open,
                                     .mesh_freed = dt__coll_mesh_free};

__attribute__((constructor)) static void coll_register(void)
{
    dt__hooks_add(&coll_hooks);
}
