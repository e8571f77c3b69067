/* The device collectives' transport for GPUs emulated on the host: NCCL's semantics over MPI
 * point-to-point messages, so that everything above the transport (device.c: the side streams,
 * the events both ways, the logical devices combined per GPU, communicators split from a
 * mesh's parent, aborts and timeouts) runs on machines without a GPU.
 *
 * A communicator is one rank of a set of GPUs; the ops of a run are matched between two ranks
 * in the order they are given (every message between parent ranks a and b carries the tag
 * 1 + a * nranks + b on the mesh's own communicator, and MPI keeps their order). Creation is a
 * handshake in which a rank that fails tells the others, as NCCL's bootstrap sees a peer's
 * failure. A run posts every message, waits with the runtime's yielding wait (DTENSOR_TIMEOUT:
 * a peer that never comes), then reduces in rank order: the emulated "GPU" computes at once,
 * its side stream never runs late. An abort tells every other client (tag 0), whose waits then
 * fail at once, as NCCL reports a peer's abort on a network transport; the buffers of an
 * abandoned run are left to MPI. */
#include "coll_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct world {
    int refs;
    MPI_Comm comm; /* dup of the mesh's, or of MPI_COMM_SELF when every rank is this client's */
    int nranks;    /* the parent's ranks */
    int *client_of;
    MPI_Request notice_req; /* a posted receive of a peer's abort notice */
    int notice;             /* the aborting client */
    bool aborted;
} world;

struct dt__xcomm {
    world *w;
    int nranks, rank;
    int *parent; /* per rank: its parent rank (NULL: the parent itself) */
};

static void world_release(world *w)
{
    if (!w || --w->refs > 0)
        return;
    if (w->notice_req != MPI_REQUEST_NULL) { /* a cancelled receive completes at once */
        MPI_Cancel(&w->notice_req);
        MPI_Wait(&w->notice_req, MPI_STATUS_IGNORE);
    }
    if (w->comm != MPI_COMM_NULL)
        MPI_Comm_free(&w->comm);
    free(w->client_of);
    free(w);
}

static void emu_free(dt__xcomm *c)
{
    if (!c)
        return;
    world_release(c->w);
    free(c->parent);
    free(c);
}

static void emu_abort(dt__xcomm *c)
{
    if (!c)
        return;
    world *w = c->w;
    int n = 0, me = 0;
    if (!w->aborted && w->comm != MPI_COMM_NULL) {
        MPI_Comm_size(w->comm, &n);
        MPI_Comm_rank(w->comm, &me);
        for (int q = 0; q < n; q++) {
            MPI_Request rq;
            if (q != me && MPI_Isend(&dt__rt.client, 1, MPI_INT, q, 0, w->comm, &rq) == MPI_SUCCESS)
                MPI_Request_free(&rq);
        }
    }
    w->aborted = true;
    emu_free(c);
}

static dt_status emu_init(MPI_Comm comm, int nranks, const int client_of[], int k, const int rank[],
                          dt__device *const side[], bool fail, dt__xcomm *out[])
{
    (void)side;
    for (int j = 0; j < k; j++)
        out[j] = NULL;
    world *w = calloc(1, sizeof *w);
    if (w) {
        w->comm = MPI_COMM_NULL;
        w->notice_req = MPI_REQUEST_NULL;
        w->nranks = nranks;
        w->client_of = malloc(sizeof(int) * (size_t)nranks);
    }
    dt_status s =
        w && w->client_of ? DT_OK : dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory");
    for (int r = 0; s == DT_OK && r < nranks; r++)
        w->client_of[r] = comm == MPI_COMM_NULL ? 0 : client_of[r];
    int tag_ub = 32767, *attr = NULL, flag = 0;
    if (s == DT_OK && comm != MPI_COMM_NULL) {
        MPI_Comm_get_attr(comm, MPI_TAG_UB, &attr, &flag);
        tag_ub = flag && attr ? *attr : tag_ub;
        MPI_Request req;
        s = MPI_Comm_idup(comm, &w->comm, &req) == MPI_SUCCESS
                ? dt__mpi_wait_for(1, &req, "creating a communicator of emulated GPUs")
                : dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_Comm_idup failed");
    } else if (s == DT_OK && MPI_Comm_dup(MPI_COMM_SELF, &w->comm) != MPI_SUCCESS) {
        s = dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_Comm_dup failed");
    }
    if (s == DT_OK)
        MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    if (s == DT_OK && (int64_t)nranks * nranks + 1 > tag_ub)
        s = dt__fail(DT_ERR_UNSUPPORTED, "emulated NCCL: %d GPUs need more message tags than %d",
                     nranks, tag_ub);
    /* the bootstrap: every client learns whether every other one made its ranks */
    if (s == DT_OK && comm != MPI_COMM_NULL) {
        int n = 0, mine = fail ? 1 : 0;
        MPI_Comm_size(w->comm, &n);
        int *all = malloc(sizeof(int) * (size_t)n);
        MPI_Request req;
        s = !all ? dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory")
            : MPI_Iallgather(&mine, 1, MPI_INT, all, 1, MPI_INT, w->comm, &req) != MPI_SUCCESS
                ? dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_Iallgather failed")
                : dt__mpi_wait_for(1, &req, "creating a communicator of emulated GPUs");
        for (int q = 0; s == DT_OK && q < n; q++)
            if (all[q])
                s = q == dt__rt.client
                        ? dt__fail(DT_ERR_DEVICE,
                                   "emulated NCCL: creating the communicator failed on client %d "
                                   "(DTENSOR_FAULT)",
                                   q)
                        : dt__fail(DT_ERR_DEVICE,
                                   "emulated NCCL: client %d failed to create its communicator", q);
        free(all);
    }
    if (s == DT_OK && MPI_Irecv(&w->notice, 1, MPI_INT, MPI_ANY_SOURCE, 0, w->comm,
                                &w->notice_req) != MPI_SUCCESS)
        s = dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_Irecv failed");
    for (int j = 0; s == DT_OK && j < k; j++) {
        dt__xcomm *c = calloc(1, sizeof *c);
        if (!c) {
            s = dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory");
            break;
        }
        *c = (dt__xcomm){.w = w, .nranks = nranks, .rank = rank[j]};
        w->refs++;
        out[j] = c;
    }
    if (s != DT_OK) {
        bool held = w && w->refs > 0; /* the communicators release the world with them */
        for (int j = 0; j < k; j++) {
            emu_free(out[j]);
            out[j] = NULL;
        }
        if (w && !held) {
            w->refs = 1;
            world_release(w);
        }
    }
    return s;
}

static dt_status emu_split(int k, dt__xcomm *const parent[], int nm, const int members[],
                           dt__xcomm *out[])
{
    /* membership is a pure function of the mesh: nothing to exchange */
    for (int j = 0; j < k; j++) {
        out[j] = NULL;
        int at = 0;
        while (at < nm && members[at] != parent[j]->rank)
            at++;
        if (at == nm)
            continue;
        dt__xcomm *c = calloc(1, sizeof *c);
        int *p = malloc(sizeof(int) * (size_t)nm);
        if (!c || !p) {
            free(c);
            free(p);
            for (int i = 0; i < j; i++)
                emu_free(out[i]);
            return dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory");
        }
        memcpy(p, members, sizeof(int) * (size_t)nm);
        *c = (dt__xcomm){.w = parent[j]->w, .nranks = nm, .rank = at, .parent = p};
        c->w->refs++;
        out[j] = c;
    }
    return DT_OK;
}

/* ---- a run ---------------------------------------------------------------------------------- */

typedef struct run_state {
    MPI_Request *req;
    int nreq, cap;
    char **tmp; /* per op: the ranks' contributions (reductions), or NULL */
} run_state;

static int parent_of(const dt__xcomm *c, int r)
{
    return c->parent ? c->parent[r] : r;
}

static int tag_of(const dt__xcomm *c, int from, int to)
{
    return 1 + parent_of(c, from) * c->w->nranks + parent_of(c, to);
}

static int client_of(const dt__xcomm *c, int r)
{
    return c->w->client_of[parent_of(c, r)];
}

static dt_status post(run_state *st, bool send, void *buf, size_t bytes, const dt__xcomm *c,
                      int from, int to)
{
    if (bytes > (size_t)1 << 30)
        return dt__fail(DT_ERR_UNSUPPORTED,
                        "emulated NCCL: a message of %zu bytes (the emulation sends at most 1 GiB)",
                        bytes);
    if (st->nreq == st->cap) {
        int cap = st->cap ? 2 * st->cap : 32;
        MPI_Request *q = realloc(st->req, sizeof *q * (size_t)cap);
        if (!q)
            return dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory");
        st->req = q;
        st->cap = cap;
    }
    MPI_Request *q = &st->req[st->nreq];
    int tag = tag_of(c, from, to);
    int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, client_of(c, to), tag, c->w->comm, q)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, client_of(c, from), tag, c->w->comm, q);
    if (rc != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_I%s failed", send ? "send" : "recv");
    st->nreq++;
    return DT_OK;
}

/* The buffers of a failed run that pending receives may still write (a peer that aborted may
 * never send, and MPI cannot take a posted receive back): kept, and reachable, for the
 * process's life. */
static struct abandoned {
    struct abandoned *next;
    void *buf;
} * abandoned;
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

static void abandon(void *buf)
{
    struct abandoned *a = malloc(sizeof *a);
    if (!a)
        return;
    pthread_mutex_lock(&abandoned_lock);
    *a = (struct abandoned){.next = abandoned, .buf = buf};
    abandoned = a;
    pthread_mutex_unlock(&abandoned_lock);
}

/* Post one op's messages; a reduction's contributions go to tmp[r * count]. */
static dt_status post_op(run_state *st, const dt__xop *o, char **tmp)
{
    const dt__xcomm *c = o->comm;
    int R = c->nranks, me = c->rank;
    size_t es = dt_dtype_size(o->dtype), n = (size_t)o->count * es;
    dt_status s = DT_OK;
    bool reduce = o->kind == DT__XOP_ALL_REDUCE || o->kind == DT__XOP_REDUCE_SCATTER ||
                  (o->kind == DT__XOP_REDUCE && me == o->peer);
    if (reduce) {
        *tmp = malloc(n * (size_t)R + 1);
        if (!*tmp)
            return dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory for %zu bytes",
                            n * (size_t)R);
        /* this rank's own part first: the op may run in place */
        const char *own = o->kind == DT__XOP_REDUCE_SCATTER ? (const char *)o->send + me * n
                                                            : (const char *)o->send;
        memcpy(*tmp + me * n, own, n);
    }
    switch (o->kind) {
    case DT__XOP_ALL_REDUCE:
        for (int t = 0; s == DT_OK && t < R; t++)
            if (t != me) {
                s = post(st, false, *tmp + t * n, n, c, t, me);
                if (s == DT_OK)
                    s = post(st, true, (void *)o->send, n, c, me, t);
            }
        break;
    case DT__XOP_REDUCE_SCATTER:
        for (int t = 0; s == DT_OK && t < R; t++)
            if (t != me) {
                s = post(st, false, *tmp + t * n, n, c, t, me);
                if (s == DT_OK)
                    s = post(st, true, (char *)o->send + t * n, n, c, me, t);
            }
        break;
    case DT__XOP_ALL_GATHER:
        if ((char *)o->recv + me * n != o->send)
            memmove((char *)o->recv + me * n, o->send, n);
        for (int t = 0; s == DT_OK && t < R; t++)
            if (t != me) {
                s = post(st, false, (char *)o->recv + t * n, n, c, t, me);
                if (s == DT_OK)
                    s = post(st, true, (char *)o->recv + me * n, n, c, me, t);
            }
        break;
    case DT__XOP_REDUCE:
        if (me != o->peer)
            return post(st, true, (void *)o->send, n, c, me, o->peer);
        for (int t = 0; s == DT_OK && t < R; t++)
            if (t != me)
                s = post(st, false, *tmp + t * n, n, c, t, me);
        break;
    case DT__XOP_BROADCAST:
        if (me != o->peer)
            return post(st, false, o->recv, n, c, o->peer, me);
        if (o->recv != o->send)
            memcpy(o->recv, o->send, n);
        for (int t = 0; s == DT_OK && t < R; t++)
            if (t != me)
                s = post(st, true, o->recv, n, c, me, t);
        break;
    case DT__XOP_SEND:
        return post(st, true, (void *)o->send, n, c, me, o->peer);
    case DT__XOP_RECV:
        return post(st, false, o->recv, n, c, o->peer, me);
    }
    return s;
}

/* recv = the ranks' contributions reduced in rank order (combines of at most
 * DT__COMBINE_MAX sources, the running result first after the first). */
static void reduce_op(const dt__xop *o, const char *tmp)
{
    int R = o->comm->nranks;
    size_t n = (size_t)o->count * dt_dtype_size(o->dtype);
    dt__combine cb = {.dtype = o->dtype, .op = o->op, .ndst = 1, .by = 1, .n = o->count};
    cb.dst[0] = o->recv;
    for (int r = 0; r < R;) {
        cb.nsrc = 0;
        if (r > 0)
            cb.src[cb.nsrc++] = o->recv;
        while (r < R && cb.nsrc < DT__COMBINE_MAX)
            cb.src[cb.nsrc++] = tmp + (size_t)r++ * n;
        dt__cpu_combine(&cb);
    }
}

/* A peer's abort notice on any world of the run's ops. */
static dt_status noticed(int n, const dt__xop ops[])
{
    for (int i = 0; i < n; i++) {
        world *w = ops[i].comm->w;
        int flag = 0;
        if (w->notice_req != MPI_REQUEST_NULL &&
            MPI_Test(&w->notice_req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            w->aborted = true;
            return dt__fail(DT_ERR_DEVICE,
                            "%s: client %d aborted the communicator (a device collective failed "
                            "there), so this one cannot complete",
                            dt__current_call(), w->notice);
        }
    }
    return DT_OK;
}

static dt_status wait_all(run_state *st, int nops, const dt__xop ops[])
{
    MPI_Status stat[16];
    dt__waiter wt;
    dt__wait_begin(&wt);
    dt_status s = DT_OK;
    for (;;) {
        int done = 1, flag = 0;
        for (int i = 0; s == DT_OK && i < st->nreq; i += 16) {
            int k = st->nreq - i < 16 ? st->nreq - i : 16;
            if (MPI_Testall(k, st->req + i, &flag, stat) != MPI_SUCCESS)
                s = dt__fail(DT_ERR_COMM, "emulated NCCL: MPI_Testall failed");
            done &= flag;
        }
        if (s != DT_OK || done || (s = noticed(nops, ops)) != DT_OK)
            break;
        if (dt__wait_pause(&wt)) {
            s = dt__gave_up(&wt, "in a device collective (emulated NCCL)", NULL);
            break;
        }
    }
    dt__wait_end(&wt);
    return s;
}

static dt_status emu_run(int n, const dt__xop ops[])
{
    run_state st = {0};
    st.tmp = calloc((size_t)n + 1, sizeof *st.tmp);
    dt_status s = st.tmp ? DT_OK : dt__fail(DT_ERR_NOMEM, "emulated NCCL: out of memory");
    /* the side streams' uses of the buffers, checked against the compute streams */
    for (int i = 0; s == DT_OK && i < n; i++) {
        const dt__xop *o = &ops[i];
        size_t es = dt_dtype_size(o->dtype), cnt = (size_t)o->count, R = (size_t)o->comm->nranks;
        size_t sb = o->kind == DT__XOP_REDUCE_SCATTER ? cnt * R : cnt;
        size_t rb = o->kind == DT__XOP_ALL_GATHER ? cnt * R : cnt;
        bool sends =
            o->kind != DT__XOP_RECV && (o->kind != DT__XOP_BROADCAST || o->comm->rank == o->peer);
        bool recvs =
            o->kind != DT__XOP_SEND && (o->kind != DT__XOP_REDUCE || o->comm->rank == o->peer);
        if (sends && o->send)
            s = dt__emulate_side_use(o->side, o->send, sb * es, false);
        if (s == DT_OK && recvs && o->recv)
            s = dt__emulate_side_use(o->side, o->recv, rb * es, true);
    }
    for (int i = 0; s == DT_OK && i < n; i++) {
        if (ops[i].comm->w->aborted)
            s = dt__fail(DT_ERR_DEVICE, "emulated NCCL: the communicator was aborted");
        if (s == DT_OK)
            s = post_op(&st, &ops[i], &st.tmp[i]);
    }
    if (s == DT_OK && n)
        s = wait_all(&st, n, ops);
    for (int i = 0; s == DT_OK && i < n; i++)
        if (st.tmp[i])
            reduce_op(&ops[i], st.tmp[i]);
    if (s == DT_OK) {
        for (int i = 0; i < n; i++)
            free(st.tmp[i]);
    } else {
        /* MPI may still write the buffers: the requests are released to complete on their
         * own and the buffers abandoned */
        for (int i = 0; i < st.nreq; i++)
            if (st.req[i] != MPI_REQUEST_NULL)
                MPI_Request_free(&st.req[i]);
        for (int i = 0; st.tmp && i < n; i++)
            if (st.tmp[i])
                abandon(st.tmp[i]);
    }
    free(st.req);
    free(st.tmp);
    return s;
}

static const dt__xport emu_xport = {
    .name = "nccl (emulated)",
    .emulated = true,
    .init = emu_init,
    .split = emu_split,
    .run = emu_run,
    .abort = emu_abort,
    .free = emu_free,
};

__attribute__((constructor)) static void emu_register(void)
{
    dt__xport_add(&emu_xport);
}
