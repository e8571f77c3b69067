/* The host transport's cross-client step of a group that spans clients: one nonblocking MPI
 * collective on the group's communicator, or a ring of point-to-point messages, or
 * reduce-then-broadcast (local.c does the shared-memory phases around it). Every call here is
 * nonblocking; dt__coll_mpi_progress tests and advances (the caller yields). Also MPI's types
 * and reductions of the dtypes, and the transport's entry. */
#include "coll_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static dt_status fits_int(const dt__coll_req *r, const dt__gcall *gc, int64_t v, const char *what)
{
    if (v <= INT_MAX)
        return DT_OK;
    return dt__fail(DT_ERR_UNSUPPORTED,
                    "%s: %s of %lld elements in group %d exceeds MPI's int counts",
                    dt__coll_kind_name(r->c.kind), what, (long long)v, gc->g->id);
}

/* ---- MPI types and reductions of the dtypes ------------------------------------------------ */

MPI_Datatype dt__coll_mpi_type(dt_dtype t)
{
    static const MPI_Datatype types[] = {
        [DT_DTYPE_F32] = MPI_FLOAT,
        [DT_DTYPE_F64] = MPI_DOUBLE,
        [DT_DTYPE_I32] = MPI_INT32_T,
        [DT_DTYPE_I64] = MPI_INT64_T,
        /* the 16-bit floats as their bits: reductions use the ops of dt__coll_mpi_op */
        [DT_DTYPE_BF16] = MPI_UINT16_T,
        [DT_DTYPE_F16] = MPI_UINT16_T,
        [DT_DTYPE_BOOL] = MPI_UINT8_T,
        [DT_DTYPE_U8] = MPI_UINT8_T,
        [DT_DTYPE_I8] = MPI_INT8_T,
    };
    return types[t];
}

/* MPI's reductions know no 16-bit floats, MPICH 4.0 compares MPI_UINT8_T (and
 * MPI_UNSIGNED_CHAR) as signed in MPI_MAX and MPI_MIN (3 > 255), and its MPI_MAX and MPI_MIN of
 * floats keep or drop a NaN by the order of the operands: user ops (created at dt_init) run the
 * library's own element loops there. */
#define USER_MPI_FN(NAME, name, opname, OP)                                             \
    static void mpi_##name##_##opname(void *in, void *inout, int *len, MPI_Datatype *t) \
    {                                                                                   \
        (void)t;                                                                        \
        dt__coll_reduce(DT_DTYPE_##NAME, OP, inout, in, (size_t)*len);                  \
    }
#define USER_MPI_FNS(NAME, name)                  \
    USER_MPI_FN(NAME, name, sum, DT_REDUCE_SUM)   \
    USER_MPI_FN(NAME, name, prod, DT_REDUCE_PROD) \
    USER_MPI_FN(NAME, name, max, DT_REDUCE_MAX)   \
    USER_MPI_FN(NAME, name, min, DT_REDUCE_MIN)
USER_MPI_FNS(BF16, bf16)
USER_MPI_FNS(F16, f16)
USER_MPI_FN(U8, u8, max, DT_REDUCE_MAX)
USER_MPI_FN(U8, u8, min, DT_REDUCE_MIN)
USER_MPI_FN(F32, f32, max, DT_REDUCE_MAX)
USER_MPI_FN(F32, f32, min, DT_REDUCE_MIN)
USER_MPI_FN(F64, f64, max, DT_REDUCE_MAX)
USER_MPI_FN(F64, f64, min, DT_REDUCE_MIN)

static MPI_Op user_ops[DT_DTYPE_COUNT][DT_REDUCE_COUNT];
static bool user_ops_made;

dt_status dt__coll_init(void)
{
#define HALF_FNS(name)                     \
    {[DT_REDUCE_SUM] = mpi_##name##_sum,   \
     [DT_REDUCE_MEAN] = mpi_##name##_sum,  \
     [DT_REDUCE_PROD] = mpi_##name##_prod, \
     [DT_REDUCE_MAX] = mpi_##name##_max,   \
     [DT_REDUCE_MIN] = mpi_##name##_min}
    MPI_User_function *fns[DT_DTYPE_COUNT][DT_REDUCE_COUNT] = {
        [DT_DTYPE_BF16] = HALF_FNS(bf16),
        [DT_DTYPE_F16] = HALF_FNS(f16),
        [DT_DTYPE_U8] = {[DT_REDUCE_MAX] = mpi_u8_max, [DT_REDUCE_MIN] = mpi_u8_min},
        [DT_DTYPE_F32] = {[DT_REDUCE_MAX] = mpi_f32_max, [DT_REDUCE_MIN] = mpi_f32_min},
        [DT_DTYPE_F64] = {[DT_REDUCE_MAX] = mpi_f64_max, [DT_REDUCE_MIN] = mpi_f64_min},
    };
#undef HALF_FNS
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (int o = 0; o < DT_REDUCE_COUNT; o++)
            user_ops[t][o] = MPI_OP_NULL;
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        for (int o = 0; o < DT_REDUCE_COUNT; o++)
            if (fns[t][o])
                MPI_Op_create(fns[t][o], 1, &user_ops[t][o]);
    user_ops_made = true;
    return dt__hosts_configure();
}

void dt__coll_shutdown(void)
{
    dt__hosts_shutdown();
    for (int t = 0; user_ops_made && t < DT_DTYPE_COUNT; t++)
        for (int o = 0; o < DT_REDUCE_COUNT; o++)
            if (user_ops[t][o] != MPI_OP_NULL)
                MPI_Op_free(&user_ops[t][o]);
    user_ops_made = false;
}

MPI_Op dt__coll_mpi_op(dt_dtype t, dt_reduce_op op)
{
    static const MPI_Op ops[] = {
        [DT_REDUCE_SUM] = MPI_SUM, [DT_REDUCE_MEAN] = MPI_SUM,  [DT_REDUCE_MAX] = MPI_MAX,
        [DT_REDUCE_MIN] = MPI_MIN, [DT_REDUCE_PROD] = MPI_PROD,
    };
    return user_ops_made && user_ops[t][op] != MPI_OP_NULL ? user_ops[t][op] : ops[op];
}

/* DTENSOR_FAULT="post:K:N" (tests): client K's N-th MPI call posting a collective's step (a
 * native collective or a ring step's send) fails without being made. */
static bool post_fault(void)
{
    static int posts;
    int at;
    return dt__coll_fault(&at) == DT__FAULT_POST && ++posts == at;
}

/* ---- ring ---------------------------------------------------------------------------------- */

static dt_status ring_post(dt__coll_req *r, dt__gcall *gc)
{
    const dt__cgroup *g = gc->g;
    int p = g->num_clients, me = g->my_pos;
    int right = (me + 1) % p, left = (me - 1 + p) % p, s = gc->step;
    size_t es = r->es;
    MPI_Datatype t = dt__coll_mpi_type(r->c.dtype);
    int a, b;
    const char *sendbuf;
    char *recvbuf;
    if (gc->phase == 0) { /* reduce-scatter: pass a growing partial sum around */
        a = (me - s - 1 + 2 * p) % p;
        b = (me - s - 2 + 2 * p) % p;
        sendbuf = s == 0 ? gc->xin + gc->seg[a] * (int64_t)es : gc->acc;
        recvbuf = gc->tmp;
    } else { /* all-gather: forward the segment received last */
        a = (me - s + p) % p;
        b = (me - s - 1 + p) % p;
        sendbuf = gc->xout + gc->seg[a] * (int64_t)es;
        recvbuf = gc->xout + gc->seg[b] * (int64_t)es;
    }
    int na = (int)(gc->seg[a + 1] - gc->seg[a]), nb = (int)(gc->seg[b + 1] - gc->seg[b]);
    /* both counted from here, so that a receive posted before a failed send is left to MPI */
    gc->req[0] = gc->req[1] = MPI_REQUEST_NULL;
    gc->nreq = 2;
    if (MPI_Irecv(recvbuf, nb, t, left, gc->tag, g->comm, &gc->req[0]) != MPI_SUCCESS) {
        gc->req[0] = MPI_REQUEST_NULL;
        return dt__fail(DT_ERR_COMM, "%s: ring step %d of group %d: the receive failed",
                        dt__coll_kind_name(r->c.kind), s, g->id);
    }
    if (post_fault() ||
        MPI_Isend(sendbuf, na, t, right, gc->tag, g->comm, &gc->req[1]) != MPI_SUCCESS) {
        gc->req[1] = MPI_REQUEST_NULL;
        return dt__fail(DT_ERR_COMM, "%s: ring step %d of group %d: the send failed",
                        dt__coll_kind_name(r->c.kind), s, g->id);
    }
    return DT_OK;
}

/* The step gc->step of gc->phase has completed (or none has, step -1): finish it, post the
 * next. */
static dt_status ring_next(dt__coll_req *r, dt__gcall *gc)
{
    int p = gc->g->num_clients, me = gc->g->my_pos;
    size_t es = r->es;
    if (gc->phase == 0 && gc->step >= 0) {
        int b = (me - gc->step - 2 + 2 * p) % p;
        size_t n = (size_t)(gc->seg[b + 1] - gc->seg[b]);
        dt__coll_reduce(r->c.dtype, r->c.op, gc->tmp, gc->xin + gc->seg[b] * (int64_t)es, n);
        if (gc->step == p - 2) {
            if (n)
                memcpy(gc->seg_out, gc->tmp, n * es);
        } else {
            char *x = gc->acc;
            gc->acc = gc->tmp;
            gc->tmp = x;
        }
    }
    gc->step++;
    if (gc->phase == 0 && gc->step > p - 2) {
        if (r->c.kind == DT__COLL_REDUCE_SCATTER) {
            gc->done = true;
            return DT_OK;
        }
        gc->phase = 1;
        gc->step = 0;
    }
    if (gc->phase == 1 && gc->step > p - 2) {
        gc->done = true;
        return DT_OK;
    }
    return ring_post(r, gc);
}

/* ---- lanes ----------------------------------------------------------------------------------- */

static void lane_join(dt__gcall *gc, dt__lane *l)
{
    gc->lane = l;
    gc->lane_next = NULL;
    if (l->tail)
        l->tail->lane_next = gc;
    else
        l->head = gc;
    l->tail = gc;
}

void dt__lane_leave(dt__gcall *gc)
{
    dt__lane *l = gc->lane;
    if (!l)
        return;
    dt__gcall **at = &l->head, *prev = NULL;
    while (*at && *at != gc) {
        prev = *at;
        at = &(*at)->lane_next;
    }
    if (*at) {
        *at = gc->lane_next;
        if (l->tail == gc)
            l->tail = prev;
    }
    gc->lane = NULL;
    gc->lane_next = NULL;
}

static void leave_all(dt__coll_req *r)
{
    for (int gi = 0; gi < r->num_groups; gi++)
        dt__lane_leave(&r->gc[gi]);
}

/* Whether gc heads its lane. The request ahead is advanced meanwhile (this client may wait for
 * this one first), unless it is this request, whose own loop advances it. */
static bool my_turn(dt__gcall *gc)
{
    dt__gcall *h = gc->lane->head;
    if (h != gc && h->r != gc->r) {
        dt__collective_test(h->r);
        h = gc->lane->head;
    }
    return h == gc;
}

/* One nonblocking MPI collective for the group (never a blocking one: a blocking call cannot
 * give up when a client dies, and the watchdog must); the even forms when every block is the
 * same size and each client holds one member (MPICH's v forms take slower paths). */
static dt_status post_native(dt__coll_req *r, dt__gcall *gc)
{
    const dt__cgroup *g = gc->g;
    int nc = g->num_clients, me = g->my_pos, k = g->num_local;
    int *cc = gc->mc, *cd = gc->mc + nc, *rc = gc->mc + 2 * nc, *rd = gc->mc + 3 * nc;
    MPI_Datatype t = dt__coll_mpi_type(r->c.dtype);
    MPI_Op op = dt__coll_mpi_op(r->c.dtype, r->c.op);
    MPI_Comm comm = g->comm;
    MPI_Request *q = &gc->req[0];
    bool even = !gc->cnt && k == 1 && nc == r->mask->size;
    int n = (int)r->c.count, e = MPI_SUCCESS;
    if (post_fault())
        return dt__fail(DT_ERR_COMM, "%s: MPI call for group %d failed (DTENSOR_FAULT)",
                        dt__coll_kind_name(r->c.kind), g->id);
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE: {
        const void *in = gc->xin == gc->xout ? MPI_IN_PLACE : (const void *)gc->xin;
        if (gc->mode == DT__X_REDUCE_BCAST) {
            in = me == 0 ? in : gc->xin;
            e = MPI_Ireduce(in, gc->xout, n, t, op, 0, comm, q);
        } else {
            e = MPI_Iallreduce(in, gc->xout, n, t, op, comm, q);
        }
        break;
    }
    case DT__COLL_ALL_GATHER: {
        const void *in = k == 1 ? (const void *)gc->send[0] : MPI_IN_PLACE;
        if (even)
            e = MPI_Iallgather(in, n, t, gc->recv[0], n, t, comm, q);
        else
            e = MPI_Iallgatherv(in, cc[me], t, gc->recv[0], cc, cd, t, comm, q);
        break;
    }
    case DT__COLL_REDUCE_SCATTER: {
        const void *in = k == 1 ? (const void *)gc->send[0] : MPI_IN_PLACE;
        void *out = k == 1 ? gc->recv[0] : gc->stage;
        if (even)
            e = MPI_Ireduce_scatter_block(in, out, n, t, op, comm, q);
        else
            e = MPI_Ireduce_scatter(in, out, cc, t, op, comm, q);
        break;
    }
    case DT__COLL_ALL_TO_ALL:
        if (even)
            e = MPI_Ialltoall(gc->xin, n, t, gc->xout, n, t, comm, q);
        else
            e = MPI_Ialltoallv(gc->xin, cc, cd, t, gc->xout, rc, rd, t, comm, q);
        break;
    case DT__COLL_BROADCAST: {
        int root = 0;
        while (g->rank_first[root + 1] <= r->c.root)
            root++;
        e = MPI_Ibcast(gc->xout, n, t, root, comm, q);
        break;
    }
    default:
        break;
    }
    if (e != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "%s: MPI call for group %d failed (error %d)",
                        dt__coll_kind_name(r->c.kind), g->id, e);
    gc->nreq = 1;
    return DT_OK;
}

/* The first step of a group call at the head of its lane; it leaves the lane after the last
 * step it posts there. */
static dt_status post_first(dt__coll_req *r, dt__gcall *gc)
{
    gc->queued = false;
    dt_status s = gc->mode == DT__X_HOSTS ? dt__hosts_next(r, gc) : post_native(r, gc);
    if (gc->mode == DT__X_NATIVE || gc->done)
        dt__lane_leave(gc);
    return s;
}

static dt_status setup(dt__coll_req *r, dt__gcall *gc, int gi)
{
    const dt__cgroup *g = gc->g;
    int nc = g->num_clients, k = g->num_local, me = g->my_pos, q = g->first_rank;
    size_t es = r->es;
    int *cc = gc->mc, *cd = gc->mc + nc, *rc = gc->mc + 2 * nc, *rd = gc->mc + 3 * nc;
    /* The same on every client of the group: (collective number on this mask, group id).
     * MPI guarantees tags up to 32767. */
    (void)gi;
    gc->tag = (int)(((uint64_t)r->mask->seq * (uint64_t)r->m->size + (uint64_t)g->id) % 32000u) + 1;
    gc->xout = gc->recv[0];
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE:
        DT_TRY(fits_int(r, gc, r->c.count, "count"));
        gc->xin = k == 1 ? (char *)gc->send[0] : gc->recv[0];
        for (int c = 0; c <= nc; c++)
            gc->seg[c] = c < nc ? dt_shard_offset(r->c.count, nc, c) : r->c.count;
        gc->seg_out = gc->xout + gc->seg[me] * (int64_t)es;
        break;
    case DT__COLL_ALL_GATHER:
    case DT__COLL_REDUCE_SCATTER:
        for (int c = 0; c <= nc; c++)
            gc->seg[c] = dt__gc_block_off(r, gc, g->rank_first[c]);
        DT_TRY(fits_int(r, gc, gc->total, "the total"));
        for (int c = 0; c < nc; c++) {
            cc[c] = (int)(gc->seg[c + 1] - gc->seg[c]);
            cd[c] = (int)gc->seg[c];
        }
        if (r->c.kind == DT__COLL_REDUCE_SCATTER) {
            if (k > 1) {
                gc->stage_bytes = (size_t)gc->total * es;
                gc->xin = gc->stage = malloc(gc->stage_bytes ? gc->stage_bytes : 1);
                gc->seg_out =
                    gc->mode == DT__X_RING ? gc->stage + gc->seg[me] * (int64_t)es : gc->stage;
            } else {
                gc->xin = (char *)gc->send[0];
                gc->seg_out = gc->recv[0];
            }
        } else {
            gc->xin = gc->xout;
        }
        break;
    case DT__COLL_ALL_TO_ALL: {
        int64_t ps = 0, pr = 0;
        for (int c = 0; c < nc; c++) {
            int64_t sc = 0, rcv = 0;
            for (int s = 0; s < k; s++)
                for (int t = g->rank_first[c]; t < g->rank_first[c + 1]; t++)
                    sc += dt__gc_block(r, gc, q + s, t);
            for (int s = g->rank_first[c]; s < g->rank_first[c + 1]; s++)
                for (int t = 0; t < k; t++)
                    rcv += dt__gc_block(r, gc, s, q + t);
            DT_TRY(fits_int(r, gc, ps + sc, "a send offset"));
            DT_TRY(fits_int(r, gc, pr + rcv, "a receive offset"));
            cc[c] = (int)sc;
            cd[c] = (int)ps;
            rc[c] = (int)rcv;
            rd[c] = (int)pr;
            ps += sc;
            pr += rcv;
        }
        if (k > 1) {
            gc->stage_bytes = (size_t)(ps + pr) * es;
            gc->stage = malloc(gc->stage_bytes ? gc->stage_bytes : 1);
            gc->xin = gc->stage;
            gc->xout = gc->stage ? gc->stage + ps * (int64_t)es : NULL;
        } else {
            gc->xin = (char *)gc->send[0];
        }
        break;
    }
    case DT__COLL_BROADCAST: {
        DT_TRY(fits_int(r, gc, r->c.count, "count"));
        int root = r->c.root - q;
        if (root >= 0 && root < k)
            gc->xout = (char *)gc->send[root]; /* MPI_Ibcast only reads at the root */
        break;
    }
    default:
        break;
    }
    if ((r->c.kind == DT__COLL_REDUCE_SCATTER || r->c.kind == DT__COLL_ALL_TO_ALL) && k > 1 &&
        !gc->stage)
        return dt__fail(DT_ERR_NOMEM, "%s: cannot allocate %zu staging bytes",
                        dt__coll_kind_name(r->c.kind), gc->stage_bytes);
    if (gc->mode == DT__X_RING) {
        int64_t most = 0;
        for (int c = 0; c < nc; c++) {
            int64_t n = gc->seg[c + 1] - gc->seg[c];
            DT_TRY(fits_int(r, gc, n, "a ring segment"));
            most = n > most ? n : most;
        }
        size_t half = ((size_t)most * es + 63) / 64 * 64 + 64;
        dt__cmask *k = r->mask;
        if (!k->scratch_busy) {
            if (k->scratch_bytes < 2 * half) {
                free(k->scratch);
                k->scratch_bytes = 0;
                if (!(k->scratch = aligned_alloc(64, 2 * half)))
                    return dt__fail(DT_ERR_NOMEM, "%s: cannot allocate 2 ring buffers of %zu bytes",
                                    dt__coll_kind_name(r->c.kind), half);
                k->scratch_bytes = 2 * half;
            }
            k->scratch_busy = gc->uses_scratch = true;
            gc->acc = k->scratch;
        } else {
            gc->own_scratch = true;
            if (!(gc->acc = aligned_alloc(64, 2 * half)))
                return dt__fail(DT_ERR_NOMEM, "%s: cannot allocate 2 ring buffers of %zu bytes",
                                dt__coll_kind_name(r->c.kind), half);
        }
        gc->tmp = gc->acc + half;
    }
    return DT_OK;
}

dt_status dt__coll_mpi_start(dt__coll_req *r)
{
    for (int gi = 0; gi < r->num_groups; gi++) {
        dt__gcall *gc = &r->gc[gi];
        if (gc->mode == DT__X_NONE) {
            gc->done = true;
            continue;
        }
        DT_TRY(setup(r, gc, gi));
        if (gc->mode == DT__X_HOSTS)
            DT_TRY(dt__hosts_setup(r, gc));
    }
    /* Local work before the messages (reductions into the first local member, packing). */
    dt__coll_local_pre(r);
    for (int gi = 0; gi < r->num_groups; gi++) {
        dt__gcall *gc = &r->gc[gi];
        if (gc->done)
            continue;
        if (gc->mode == DT__X_RING) {
            gc->phase = r->c.kind == DT__COLL_ALL_GATHER ? 1 : 0;
            gc->step = -1;
            DT_TRY(ring_next(r, gc));
        } else {
            /* the ring's messages carry the collective's own tag; MPI's collectives are
             * matched by their order on the communicator */
            lane_join(gc, gc->mode == DT__X_HOSTS ? &gc->g->hosts->lane : gc->g->lane);
            gc->queued = true;
            if (my_turn(gc))
                DT_TRY(post_first(r, gc));
        }
    }
    return DT_OK;
}

bool dt__coll_mpi_progress(dt__coll_req *r, dt_status *status)
{
    bool all = true;
    for (int gi = 0; gi < r->num_groups; gi++) {
        dt__gcall *gc = &r->gc[gi];
        if (gc->done)
            continue;
        if (gc->queued) {
            dt_status s = my_turn(gc) ? post_first(r, gc) : DT_OK;
            if (s != DT_OK) {
                leave_all(r);
                *status = s;
                return true;
            }
            if (gc->queued || !gc->done)
                all = false;
            if (gc->queued || gc->done)
                continue;
        }
        int flag = 1;
        MPI_Status st[2];
        if (gc->nreq && MPI_Testall(gc->nreq, gc->req, &flag, st) != MPI_SUCCESS) {
            leave_all(r);
            *status = dt__fail(DT_ERR_COMM, "%s: MPI_Testall failed for group %d",
                               dt__coll_kind_name(r->c.kind), gc->g->id);
            return true;
        }
        if (!flag) {
            all = false;
            continue;
        }
        gc->nreq = 0;
        dt_status s = DT_OK;
        if (gc->mode == DT__X_RING) {
            s = ring_next(r, gc);
        } else if (gc->mode == DT__X_HOSTS) {
            s = dt__hosts_next(r, gc);
            if (gc->done)
                dt__lane_leave(gc);
        } else if (gc->mode == DT__X_REDUCE_BCAST && gc->phase == 0) {
            gc->phase = 1;
            MPI_Datatype t = dt__coll_mpi_type(r->c.dtype);
            int n = (int)r->c.count;
            if (MPI_Ibcast(gc->xout, n, t, 0, gc->g->comm, &gc->req[0]) != MPI_SUCCESS)
                s = dt__fail(DT_ERR_COMM, "all_reduce: MPI_Ibcast for group %d failed", gc->g->id);
            gc->nreq = 1;
            dt__lane_leave(gc);
        } else {
            gc->done = true;
        }
        if (s != DT_OK) {
            leave_all(r);
            *status = s;
            return true;
        }
        all = all && gc->done;
    }
    return all;
}

/* The host path reads and writes the buffers of devices the host cannot touch only after their
 * queued work is done (emulated GPUs in one client; staged copies wait by themselves). */
static dt_status host_start(dt__coll_req *r)
{
    const dt__backend *be = dt__backend_of(r->m->type);
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    for (int i = 0; be && !be->host_accessible && be->sync && i < r->m->num_local; i++)
        DT_TRY(be->sync(devs[i]));
    return dt__coll_mpi_start(r);
}

static bool host_usable(const dt__coll_req *r)
{
    (void)r;
    return true;
}

static dt_status host_finish(dt__coll_req *r)
{
    dt__coll_local_post(r);
    return DT_OK;
}

static const dt__transport host_transport = {.name = "host",
                                             .priority = 40,
                                             .group_comms = true,
                                             .usable = host_usable,
                                             .start = host_start,
                                             .progress = dt__coll_mpi_progress,
                                             .finish = host_finish};

__attribute__((constructor)) static void host_register(void)
{
    dt__transport_add(&host_transport);
}
