/* The device collectives' transport on GPUs: NCCL. Compiled only with CUDA.
 *
 * Communicators are nonblocking (config.blocking = 0): creation, splits and enqueues may return
 * ncclInProgress, and the host then polls ncclCommGetAsyncError with the runtime's yielding
 * wait until the communicator is ready, for at most DTENSOR_TIMEOUT. A mesh's parent is made
 * the way llm.c makes one (the client holding rank 0 makes the unique id and broadcasts it
 * over MPI; every rank inits), its sets split from it (ncclCommSplit, sharing its resources).
 *
 * Ops run on their GPU's side stream (device.c orders it against the compute streams); the host
 * does not wait for them. A watchdog thread, as PyTorch's ProcessGroupNCCL runs one, follows
 * every run until an event recorded after it completes: an asynchronous error of one of its
 * communicators (ncclCommGetAsyncError), or DTENSOR_TIMEOUT passing (a peer that died or never
 * came), aborts the run's communicators (ncclCommAbort: the kernels waiting for the peer end,
 * so no stream and no host wait hangs) and marks the devices of its GPUs dead, so every later
 * op on them fails with DT_ERR_DEVICE naming what happened. */
#include "coll_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct dt__xcomm {
    ncclComm_t comm; /* NULL once aborted (NCCL freed it) */
    int rank, nranks;
    dt__device *side;
};

/* Every use of a communicator (enqueue, query, abort, free) holds this lock: the watchdog's
 * abort must not free a communicator the host is enqueueing on. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dt_status failed(ncclResult_t e, const char *what, ncclComm_t c)
{
    return dt__fail(DT_ERR_DEVICE, "NCCL: %s failed: %s (%s)", what, ncclGetErrorString(e),
                    ncclGetLastError(c));
}

static ncclDataType_t nccl_type(dt_dtype t)
{
    static const ncclDataType_t types[] = {
        [DT_DTYPE_F32] = ncclFloat32, [DT_DTYPE_F64] = ncclFloat64,   [DT_DTYPE_I32] = ncclInt32,
        [DT_DTYPE_I64] = ncclInt64,   [DT_DTYPE_BF16] = ncclBfloat16, [DT_DTYPE_F16] = ncclFloat16,
        [DT_DTYPE_BOOL] = ncclUint8,  [DT_DTYPE_U8] = ncclUint8,      [DT_DTYPE_I8] = ncclInt8,
    };
    return types[t];
}

static ncclRedOp_t nccl_op(dt_reduce_op op)
{
    static const ncclRedOp_t ops[] = {
        [DT_REDUCE_SUM] = ncclSum, [DT_REDUCE_MEAN] = ncclSum,  [DT_REDUCE_MAX] = ncclMax,
        [DT_REDUCE_MIN] = ncclMin, [DT_REDUCE_PROD] = ncclProd,
    };
    return ops[op];
}

/* Poll until none of the n communicators is in progress (the lock held): DT_OK when all are
 * ready; an error, or DTENSOR_TIMEOUT passing, aborts them all. */
static dt_status settle(int n, dt__xcomm *const c[], const char *what)
{
    dt__waiter w;
    dt__wait_begin(&w);
    dt_status s = DT_OK;
    for (;;) {
        bool busy = false;
        for (int j = 0; s == DT_OK && j < n; j++) {
            ncclResult_t e = ncclSuccess;
            if (!c[j] || !c[j]->comm)
                continue;
            ncclResult_t q = ncclCommGetAsyncError(c[j]->comm, &e);
            if (q != ncclSuccess)
                s = failed(q, what, c[j]->comm);
            else if (e == ncclInProgress)
                busy = true;
            else if (e != ncclSuccess)
                s = failed(e, what, c[j]->comm);
        }
        if (s != DT_OK || !busy)
            break;
        if (dt__wait_pause(&w)) {
            char where[96];
            snprintf(where, sizeof where, "in NCCL (%s)", what);
            s = dt__gave_up(&w, where, NULL);
            break;
        }
    }
    dt__wait_end(&w);
    for (int j = 0; s != DT_OK && j < n; j++)
        if (c[j] && c[j]->comm) {
            ncclCommAbort(c[j]->comm);
            c[j]->comm = NULL;
        }
    return s;
}

/* ---- the watchdog ------------------------------------------------------------------------- */

#define WATCH_MAX 64

typedef struct watch {
    struct watch *next;
    int n;                       /* side streams of the run */
    cudaEvent_t done[WATCH_MAX]; /* recorded on each after the run */
    dt__device *side[WATCH_MAX];
    int ncomm;
    dt__xcomm *comm[WATCH_MAX];
    double deadline;
} watch;

static watch *watches;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static bool watching;

static void watch_drop(watch *w)
{
    for (int i = 0; i < w->n; i++)
        cudaEventDestroy(w->done[i]);
    free(w);
}

/* Fail a run: abort its communicators, mark the devices of its GPUs dead with the message
 * (made in this thread) that says why. */
static void watch_fail(watch *w)
{
    for (int i = 0; i < w->ncomm; i++)
        if (w->comm[i]->comm) {
            ncclCommAbort(w->comm[i]->comm);
            w->comm[i]->comm = NULL;
        }
    for (int i = 0; i < w->n; i++)
        for (int d = 0; d < dt__rt.num_devices[DT_DEVICE_CUDA]; d++)
            if (dt__rt.devices[DT_DEVICE_CUDA][d].ordinal == w->side[i]->ordinal)
                dt__device_kill(&dt__rt.devices[DT_DEVICE_CUDA][d]);
}

/* One look at every run in flight (the lock held): true when it is over, one way or another. */
static bool watch_check(watch *w, double t)
{
    bool done = true;
    for (int i = 0; i < w->n; i++) {
        cudaError_t e = cudaEventQuery(w->done[i]);
        if (e == cudaErrorNotReady) {
            done = false;
        } else if (e != cudaSuccess) {
            dt__fail(DT_ERR_DEVICE, "NCCL: a device collective on GPU %d failed: %s",
                     w->side[i]->ordinal, cudaGetErrorString(e));
            watch_fail(w);
            return true;
        }
    }
    if (done)
        return true;
    for (int i = 0; i < w->ncomm; i++) {
        ncclResult_t e = ncclSuccess;
        if (!w->comm[i]->comm || ncclCommGetAsyncError(w->comm[i]->comm, &e) != ncclSuccess ||
            (e != ncclSuccess && e != ncclInProgress)) {
            dt__fail(DT_ERR_DEVICE,
                     "NCCL: a device collective failed asynchronously on GPU %d: %s (%s); its "
                     "communicators are aborted",
                     w->comm[i]->side->ordinal, ncclGetErrorString(e),
                     w->comm[i]->comm ? ncclGetLastError(w->comm[i]->comm) : "aborted");
            watch_fail(w);
            return true;
        }
    }
    if (t > w->deadline) {
        dt__fail(DT_ERR_COMM,
                 "NCCL: a device collective on GPU %d did not complete within %d s "
                 "(DTENSOR_TIMEOUT): a peer died or is stuck elsewhere; its communicators are "
                 "aborted",
                 w->side[0]->ordinal, dt__rt.timeout_s);
        watch_fail(w);
        return true;
    }
    return false;
}

static void *watchdog(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!watches)
            pthread_cond_wait(&wake, &lock);
        double t = now();
        for (watch **p = &watches; *p;) {
            watch *w = *p;
            if (watch_check(w, t)) {
                *p = w->next;
                watch_drop(w);
            } else {
                p = &w->next;
            }
        }
        pthread_mutex_unlock(&lock);
        struct timespec pause = {0, 1000000}; /* 1 ms */
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&lock);
    }
    return NULL;
}

/* Follow a run (the lock held): an event after it on each side stream it used. */
static dt_status watch_run(int n, const dt__xop ops[])
{
    watch *w = calloc(1, sizeof *w);
    if (!w)
        return dt__fail(DT_ERR_NOMEM, "NCCL: out of memory for the watchdog");
    w->deadline = now() + dt__rt.timeout_s;
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < n; i++) {
        int k = 0;
        while (k < w->n && w->side[k] != ops[i].side)
            k++;
        if (k == w->n && k < WATCH_MAX) {
            cudaEvent_t e;
            dt__device *d = ops[i].side;
            if (cudaSetDevice(d->ordinal) != cudaSuccess ||
                cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventRecord(e, (cudaStream_t)d->side) != cudaSuccess) {
                (void)cudaGetLastError();
                s = dt__fail(DT_ERR_DEVICE, "NCCL: cannot follow a collective on GPU %d",
                             d->ordinal);
                break;
            }
            w->done[w->n] = e;
            w->side[w->n++] = d;
        }
        k = 0;
        while (k < w->ncomm && w->comm[k] != ops[i].comm)
            k++;
        if (k == w->ncomm && k < WATCH_MAX)
            w->comm[w->ncomm++] = ops[i].comm;
    }
    if (s != DT_OK) {
        watch_drop(w);
        return s;
    }
    if (!watching) {
        pthread_t t;
        if (pthread_create(&t, NULL, watchdog, NULL) != 0) {
            watch_drop(w);
            return dt__fail(DT_ERR_DEVICE, "NCCL: cannot start the watchdog thread");
        }
        pthread_detach(t);
        watching = true;
    }
    w->next = watches;
    watches = w;
    pthread_cond_signal(&wake);
    return DT_OK;
}

/* Forget a communicator in every run followed (the lock held): it is going away. */
static void unwatch(const dt__xcomm *c)
{
    for (watch *w = watches; w; w = w->next)
        for (int i = 0; i < w->ncomm; i++)
            if (w->comm[i] == c)
                w->comm[i] = w->comm[--w->ncomm];
}

/* ---- the transport ----------------------------------------------------------------------------
 */

static ncclConfig_t config(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.splitShare = 1;
    return cfg;
}

static dt_status nccl_init(MPI_Comm comm, int nranks, const int client_of[], int k,
                           const int rank[], dt__device *const side[], bool fail, dt__xcomm *out[])
{
    for (int j = 0; j < k; j++)
        out[j] = NULL;
    /* the unique id from the client of rank 0, with its verdict */
    struct {
        int ok;
        ncclUniqueId id;
    } boot = {0};
    int me = 0;
    if (comm != MPI_COMM_NULL)
        MPI_Comm_rank(comm, &me);
    dt_status s = DT_OK;
    if (comm == MPI_COMM_NULL || me == client_of[0]) {
        ncclResult_t e = ncclGetUniqueId(&boot.id);
        boot.ok = e == ncclSuccess;
        if (!boot.ok)
            s = failed(e, "ncclGetUniqueId", NULL);
    }
    if (comm != MPI_COMM_NULL) {
        MPI_Request req;
        dt_status b =
            MPI_Ibcast(&boot, (int)sizeof boot, MPI_BYTE, client_of[0], comm, &req) == MPI_SUCCESS
                ? dt__mpi_wait_for(1, &req, "for NCCL's unique id")
                : dt__fail(DT_ERR_COMM, "NCCL: broadcast of the unique id failed");
        s = s != DT_OK ? s : b;
        if (s == DT_OK && !boot.ok)
            s = dt__fail(DT_ERR_DEVICE, "NCCL: client %d could not make the unique id",
                         client_of[0]);
    }
    if (s == DT_OK && fail)
        s = dt__fail(DT_ERR_DEVICE,
                     "NCCL: creating the communicator failed on client %d "
                     "(DTENSOR_FAULT)",
                     dt__rt.client);
    for (int j = 0; s == DT_OK && j < k; j++) {
        out[j] = calloc(1, sizeof *out[j]);
        if (!out[j])
            s = dt__fail(DT_ERR_NOMEM, "NCCL: out of memory");
        else
            *out[j] = (dt__xcomm){.rank = rank[j], .nranks = nranks, .side = side[j]};
    }
    if (s != DT_OK) {
        for (int j = 0; j < k; j++) {
            free(out[j]);
            out[j] = NULL;
        }
        return s;
    }
    pthread_mutex_lock(&lock);
    ncclConfig_t cfg = config();
    ncclResult_t e = ncclGroupStart();
    for (int j = 0; e == ncclSuccess && j < k; j++) {
        if (cudaSetDevice(side[j]->ordinal) != cudaSuccess) {
            (void)cudaGetLastError();
            e = ncclUnhandledCudaError;
            break;
        }
        e = ncclCommInitRankConfig(&out[j]->comm, nranks, boot.id, rank[j], &cfg);
        if (e == ncclInProgress)
            e = ncclSuccess;
    }
    ncclResult_t end = ncclGroupEnd();
    if (e == ncclSuccess && end != ncclSuccess && end != ncclInProgress)
        e = end;
    s = e != ncclSuccess ? failed(e, "ncclCommInitRankConfig", NULL)
                         : settle(k, out, "creating a communicator");
    for (int j = 0; s != DT_OK && j < k; j++) {
        if (out[j]->comm)
            ncclCommAbort(out[j]->comm);
        free(out[j]);
        out[j] = NULL;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

static dt_status nccl_split(int k, dt__xcomm *const parent[], int nm, const int members[],
                            dt__xcomm *out[])
{
    dt__xcomm *all[2 * WATCH_MAX];
    int n = 0;
    dt_status s = DT_OK;
    for (int j = 0; j < k; j++) {
        out[j] = NULL;
        int at = 0;
        while (at < nm && members[at] != parent[j]->rank)
            at++;
        if (at < nm && !(out[j] = calloc(1, sizeof *out[j])))
            s = dt__fail(DT_ERR_NOMEM, "NCCL: out of memory");
        if (out[j])
            *out[j] = (dt__xcomm){.rank = at, .nranks = nm, .side = parent[j]->side};
    }
    pthread_mutex_lock(&lock);
    ncclConfig_t cfg = config();
    ncclResult_t e = s == DT_OK ? ncclGroupStart() : ncclSuccess;
    for (int j = 0; s == DT_OK && e == ncclSuccess && j < k; j++) {
        if (!parent[j]->comm) {
            e = ncclInvalidUsage; /* aborted */
            break;
        }
        if (cudaSetDevice(parent[j]->side->ordinal) != cudaSuccess) {
            (void)cudaGetLastError();
            e = ncclUnhandledCudaError;
            break;
        }
        ncclComm_t nc = NULL;
        e = ncclCommSplit(parent[j]->comm, out[j] ? 0 : NCCL_SPLIT_NOCOLOR,
                          out[j] ? out[j]->rank : 0, &nc, &cfg);
        if (e == ncclInProgress)
            e = ncclSuccess;
        if (out[j])
            out[j]->comm = nc;
    }
    if (s == DT_OK) {
        ncclResult_t end = ncclGroupEnd();
        if (e == ncclSuccess && end != ncclSuccess && end != ncclInProgress)
            e = end;
        for (int j = 0; j < k && n < 2 * WATCH_MAX - 1; j++) {
            all[n++] = parent[j];
            if (out[j])
                all[n++] = out[j];
        }
        s = e != ncclSuccess ? failed(e, "ncclCommSplit", NULL)
                             : settle(n, all, "splitting a communicator");
    }
    for (int j = 0; s != DT_OK && j < k; j++) {
        if (out[j] && out[j]->comm)
            ncclCommAbort(out[j]->comm);
        free(out[j]);
        out[j] = NULL;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

static ncclResult_t enqueue(const dt__xop *o)
{
    ncclComm_t c = o->comm->comm;
    cudaStream_t st = (cudaStream_t)o->side->side;
    ncclDataType_t t = nccl_type(o->dtype);
    size_t n = (size_t)o->count;
    if (!c)
        return ncclInvalidUsage; /* aborted */
    if (cudaSetDevice(o->side->ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return ncclUnhandledCudaError;
    }
    switch (o->kind) {
    case DT__XOP_ALL_REDUCE:
        return ncclAllReduce(o->send, o->recv, n, t, nccl_op(o->op), c, st);
    case DT__XOP_ALL_GATHER:
        return ncclAllGather(o->send, o->recv, n, t, c, st);
    case DT__XOP_REDUCE_SCATTER:
        return ncclReduceScatter(o->send, o->recv, n, t, nccl_op(o->op), c, st);
    case DT__XOP_REDUCE:
        return ncclReduce(o->send, o->recv, n, t, nccl_op(o->op), o->peer, c, st);
    case DT__XOP_BROADCAST:
        return ncclBroadcast(o->send, o->recv, n, t, o->peer, c, st);
    case DT__XOP_SEND:
        return ncclSend(o->send, n, t, o->peer, c, st);
    case DT__XOP_RECV:
        return ncclRecv(o->recv, n, t, o->peer, c, st);
    }
    return ncclInvalidArgument;
}

static dt_status nccl_run(int n, const dt__xop ops[])
{
    dt__xcomm **used = malloc(sizeof *used * (size_t)n);
    if (!used)
        return dt__fail(DT_ERR_NOMEM, "NCCL: out of memory");
    int nu = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < nu && used[k] != ops[i].comm)
            k++;
        if (k == nu)
            used[nu++] = ops[i].comm;
    }
    pthread_mutex_lock(&lock);
    ncclResult_t e = ncclGroupStart();
    int i = 0;
    for (; e == ncclSuccess && i < n; i++) {
        e = enqueue(&ops[i]);
        if (e == ncclInProgress)
            e = ncclSuccess;
    }
    ncclResult_t end = ncclGroupEnd();
    if (e == ncclSuccess && end != ncclSuccess && end != ncclInProgress)
        e = end;
    char what[80];
    snprintf(what, sizeof what, "enqueueing %d ops", n);
    dt_status s =
        e != ncclSuccess
            ? failed(e, what, i > 0 && ops[i - 1].comm->comm ? ops[i - 1].comm->comm : NULL)
            : settle(nu, used, what);
    if (s == DT_OK)
        s = watch_run(n, ops);
    pthread_mutex_unlock(&lock);
    free(used);
    return s;
}

static void nccl_abort(dt__xcomm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&lock);
    unwatch(c);
    if (c->comm)
        ncclCommAbort(c->comm);
    pthread_mutex_unlock(&lock);
    free(c);
}

static void nccl_free(dt__xcomm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&lock);
    unwatch(c);
    /* flush what was issued (every client issued the same), then free; a communicator that
     * does not settle within DTENSOR_TIMEOUT is aborted */
    dt__xcomm *one[1] = {c};
    ncclResult_t e = c->comm ? ncclCommFinalize(c->comm) : ncclSuccess;
    if (c->comm && e != ncclSuccess && e != ncclInProgress)
        ncclCommAbort(c->comm);
    else if (c->comm && settle(1, one, "freeing a communicator") == DT_OK)
        ncclCommDestroy(c->comm);
    pthread_mutex_unlock(&lock);
    free(c);
}

static const dt__xport nccl_xport = {
    .name = "nccl",
    .emulated = false,
    .init = nccl_init,
    .split = nccl_split,
    .run = nccl_run,
    .abort = nccl_abort,
    .free = nccl_free,
};

__attribute__((constructor)) static void nccl_register(void)
{
    dt__xport_add(&nccl_xport);
}
