/* The parameter-server strategy's runtime: variable shards in MPI windows on the ps ranks,
 * read with MPI_Rget and updated with MPI_Raccumulate (passive target, one shared lock epoch
 * per window for the whole run, no barrier between workers), and the coordinator: the chief
 * keeps a queue of scheduled steps, workers pull from it by messages, results come back as
 * remote values. How many row shards a variable gets is the preset's rule
 * (dt__preset_ps_num_shards, layout/strategy.c); shard i lives on ps task i mod (ps tasks).
 *
 * Progress: MPICH ch4:ucx applies accumulates at the target by active messages, so a ps rank
 * must keep entering MPI: while serving, ps (and idle) ranks poll a nonblocking receive with
 * MPI_Test, yielding between polls and sleeping briefly when nothing happens for a while, so
 * that with more ranks than cores the workers get the cores (docs/ARCHITECTURE.md, toolchain). */
#include "train.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Complete requests, yielding; after many idle polls, sleep 50 us between polls. No timeout (a
 * step may be long in coming), but a client that was lost (mesh/watch.c: its process gone, its
 * host silent) ends the wait within a tenth of a second of being found. */
static dt_status wait_gently(int n, MPI_Request reqs[])
{
    double watch_at = 0;
    for (long spins = 0;; spins++) {
        if (spins % 256 == 255) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            double now = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
            if (watch_at == 0)
                watch_at = now + 0.1;
            if (now >= watch_at && dt__watch_poll()) {
                char why[160];
                dt__watch_why(why, sizeof why);
                return dt__fail(DT_ERR_COMM,
                                "parameter server: client %d stopped waiting: %s; "
                                "stop the program",
                                dt__rt.client, why);
            }
            if (now >= watch_at)
                watch_at = now + 0.1;
        }
        int done = 0;
        MPI_Status st[8];
        if (n <= 8 ? MPI_Testall(n, reqs, &done, st) != MPI_SUCCESS : false)
            return dt__fail(DT_ERR_COMM, "parameter server: MPI_Testall failed");
        if (n > 8) {
            done = 1;
            for (int i = 0; i < n; i++) {
                int d = 0;
                if (MPI_Test(&reqs[i], &d, st) != MPI_SUCCESS)
                    return dt__fail(DT_ERR_COMM, "parameter server: MPI_Test failed");
                done &= d;
            }
        }
        if (done)
            return DT_OK;
        if (spins < 2000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- variables ---------------------------------------------------------------------------- */

static MPI_Datatype mpi_type(dt_dtype d)
{
    return d == DT_DTYPE_F32   ? MPI_FLOAT
           : d == DT_DTYPE_F64 ? MPI_DOUBLE
           : d == DT_DTYPE_I32 ? MPI_INT32_T
                               : MPI_INT64_T;
}

dt_status dt__ps_var_create(dt_strategy *s, const dt_variable *v, dt__ps_var *out)
{
    memset(out, 0, sizeof *out);
    out->win = MPI_WIN_NULL;
    const dt_tensor *t = dt_variable_value(v);
    if (s->comm == MPI_COMM_NULL)
        return dt__fail(DT_ERR_STATE, "parameter server: the runtime has no MPI clients");
    size_t es = dt_dtype_size(t->dtype);
    int64_t rows = t->rank ? t->shape[0] : 1;
    out->dtype = t->dtype;
    out->elems = dt_tensor_num_elements(t);
    out->row_elems = rows ? out->elems / rows : 0;
    const dt_cluster *c = &s->cluster;
    int nps = c->num_tasks[DT_TASK_PS];
    out->nshards =
        dt__preset_ps_num_shards(&s->partitioner, rows, out->row_elems * (int64_t)es, nps);
    out->shards = calloc((size_t)out->nshards, sizeof *out->shards);
    void *full = malloc((size_t)out->elems * es + 1);
    dt_status st =
        out->shards && full ? DT_OK : dt__fail(DT_ERR_NOMEM, "parameter server: out of memory");
    /* every client holds the same initial value (layout-invariant initializers) */
    if (st == DT_OK)
        st = dt__read_replicated(t, full, (size_t)out->elems * es);
    MPI_Aint mine = 0; /* elements this client holds */
    for (int i = 0; st == DT_OK && i < out->nshards; i++) {
        dt__ps_shard *sh = &out->shards[i];
        sh->rank = c->first_rank[DT_TASK_PS] + i % nps;
        sh->row0 = dt_shard_offset(rows, out->nshards, i);
        sh->rows = dt_shard_size(rows, out->nshards, i);
        MPI_Aint at = 0;
        for (int k = 0; k < i; k++)
            if (out->shards[k].rank == sh->rank)
                at += (MPI_Aint)(out->shards[k].rows * out->row_elems);
        sh->disp = at;
        if (sh->rank == dt__rt.client)
            mine = at + (MPI_Aint)(sh->rows * out->row_elems);
    }
    if (st == DT_OK && mine) {
        out->base = malloc((size_t)mine * es);
        if (!out->base)
            st = dt__fail(DT_ERR_NOMEM, "parameter server: out of memory");
        for (int i = 0; st == DT_OK && i < out->nshards; i++) {
            const dt__ps_shard *sh = &out->shards[i];
            if (sh->rank == dt__rt.client)
                memcpy((char *)out->base + (size_t)sh->disp * es,
                       (char *)full + (size_t)(sh->row0 * out->row_elems) * es,
                       (size_t)(sh->rows * out->row_elems) * es);
        }
    }
    free(full);
    /* agree before the collective window creation, so that no client is left in it */
    st = dt__agree(s->comm, st);
    if (st == DT_OK && MPI_Win_create(out->base, mine * (MPI_Aint)es, (int)es, MPI_INFO_NULL,
                                      s->comm, &out->win) != MPI_SUCCESS)
        st = dt__fail(DT_ERR_COMM, "parameter server: MPI_Win_create failed");
    if (st == DT_OK && MPI_Win_lock_all(MPI_MODE_NOCHECK, out->win) != MPI_SUCCESS)
        st = dt__fail(DT_ERR_COMM, "parameter server: MPI_Win_lock_all failed");
    if (st != DT_OK) {
        free(out->shards);
        free(out->base);
        memset(out, 0, sizeof *out);
        out->win = MPI_WIN_NULL;
    }
    return st;
}

void dt__ps_var_free(dt__ps_var *pv)
{
    if (!pv || pv->win == MPI_WIN_NULL)
        return;
    MPI_Win_unlock_all(pv->win);
    MPI_Win_free(&pv->win);
    free(pv->shards);
    free(pv->base);
    memset(pv, 0, sizeof *pv);
    pv->win = MPI_WIN_NULL;
}

/* One shard's one-sided operation: `count` elements at byte `at` of the caller's buffers `in`
 * (what goes to the shard) and `out` (what comes back), the request in *req. */
typedef int (*shard_op)(const dt__ps_var *pv, const dt__ps_shard *sh, size_t at, int count,
                        const void *in, void *out, MPI_Request *req);

static int get_op(const dt__ps_var *pv, const dt__ps_shard *sh, size_t at, int count,
                  const void *in, void *out, MPI_Request *req)
{
    (void)in;
    MPI_Datatype type = mpi_type(pv->dtype);
    return MPI_Rget((char *)out + at, count, type, sh->rank, sh->disp, count, type, pv->win, req);
}

static int accumulate_op(const dt__ps_var *pv, const dt__ps_shard *sh, size_t at, int count,
                         const void *in, void *out, MPI_Request *req)
{
    (void)out;
    MPI_Datatype type = mpi_type(pv->dtype);
    return MPI_Raccumulate((const char *)in + at, count, type, sh->rank, sh->disp, count, type,
                           MPI_SUM, pv->win, req);
}

/* MPI_Get_accumulate is atomic per element with every other accumulate (MPI_Raccumulate of
 * dt_ps_variable_add included): concurrent fetch-adds each see a different value */
static int fetch_add_op(const dt__ps_var *pv, const dt__ps_shard *sh, size_t at, int count,
                        const void *in, void *out, MPI_Request *req)
{
    MPI_Datatype type = mpi_type(pv->dtype);
    return MPI_Rget_accumulate((const char *)in + at, count, type, (char *)out + at, count, type,
                               sh->rank, sh->disp, count, type, MPI_SUM, pv->win, req);
}

/* `op` (named `what` in errors) on every shard of pv, 64 requests in flight at most; with
 * `flush`, completed at the targets too, so that a later read (by anyone) sees the update. */
static dt_status each_shard(const dt__ps_var *pv, shard_op op, const char *what, const void *in,
                            void *out, bool flush)
{
    size_t es = dt_dtype_size(pv->dtype);
    MPI_Request reqs[64];
    int n = 0;
    for (int i = 0; i < pv->nshards; i++) {
        const dt__ps_shard *sh = &pv->shards[i];
        int count = (int)(sh->rows * pv->row_elems);
        size_t at = (size_t)(sh->row0 * pv->row_elems) * es;
        if (op(pv, sh, at, count, in, out, &reqs[n++]) != MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "parameter server: %s of shard %d failed", what, i);
        if (n == 64 || i == pv->nshards - 1) {
            DT_TRY(wait_gently(n, reqs));
            n = 0;
        }
    }
    if (flush && MPI_Win_flush_all(pv->win) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "parameter server: MPI_Win_flush_all failed");
    return DT_OK;
}

dt_status dt__ps_var_pull(const dt__ps_var *pv, void *host)
{
    return each_shard(pv, get_op, "MPI_Rget", NULL, host, false);
}

dt_status dt__ps_var_push(const dt__ps_var *pv, const void *delta)
{
    return each_shard(pv, accumulate_op, "MPI_Raccumulate", delta, NULL, true);
}

/* ---- coordinator ---------------------------------------------------------------------------- */

enum { TAG_READY = 7101, TAG_ASSIGN, TAG_STOP };

/* Worker -> chief: the result of the last step (if any) and a request for the next. */
typedef struct ready_msg {
    int64_t step;
    int32_t has_result;
    int32_t status;
    double value;
    char error[200];
} ready_msg;

struct dt_remote_value {
    int refs; /* the caller's and the coordinator's */
    int64_t step;
    bool done;
    dt_status status;
    char error[200];
    double value;
    int worker;                  /* that ran it (last) */
    int attempts;                /* runs so far */
    int failed_on;               /* worker of the last failure, or -1 */
    struct dt_ps_coordinator *c; /* NULL once the coordinator is shut down */
};

struct dt_ps_coordinator {
    dt_strategy *s;
    dt_ps_step_fn fn;
    void *ctx;
    MPI_Comm comm;
    /* chief */
    int nworkers;
    MPI_Request *recv;       /* per worker: its pending READY */
    ready_msg *msg;          /* per worker: receive buffer */
    dt_remote_value **busy;  /* per worker: the step it runs, or NULL */
    bool *idle;              /* per worker: waiting for an assignment */
    dt_remote_value **queue; /* FIFO of steps to run */
    int qhead, qlen, qcap;
    dt_remote_value **all; /* every value the coordinator holds a reference to */
    int nall, capall;
};

static void rv_release(dt_remote_value *v)
{
    if (v && --v->refs == 0)
        free(v);
}

void dt_remote_value_free(dt_remote_value *v)
{
    DT__SERIAL();
    rv_release(v);
}

static int worker_rank(const dt_ps_coordinator *c, int w)
{
    return c->s->cluster.first_rank[DT_TASK_WORKER] + w;
}

static bool is_chief(const dt_ps_coordinator *c)
{
    const dt_cluster *cl = &c->s->cluster;
    return cl->num_tasks[DT_TASK_CHIEF] ? cl->task_type == DT_TASK_CHIEF
                                        : cl->task_type == DT_TASK_WORKER && cl->task_index == 0;
}

static int chief_rank(const dt_ps_coordinator *c)
{
    const dt_cluster *cl = &c->s->cluster;
    return cl->num_tasks[DT_TASK_CHIEF] ? cl->first_rank[DT_TASK_CHIEF]
                                        : cl->first_rank[DT_TASK_WORKER];
}

static dt_status post_ready(dt_ps_coordinator *c, int w)
{
    if (MPI_Irecv(&c->msg[w], sizeof c->msg[w], MPI_BYTE, worker_rank(c, w), TAG_READY, c->comm,
                  &c->recv[w]) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "coordinator: MPI_Irecv from worker %d failed", w);
    return DT_OK;
}

dt_status dt_ps_coordinator_create(dt_strategy *s, dt_ps_step_fn fn, void *ctx,
                                   dt_ps_coordinator **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_ps_coordinator_create: out is NULL");
    *out = NULL;
    if (!s || s->kind != DT_STRATEGY_PARAMETER_SERVER || !fn)
        return dt__fail(DT_ERR_ARG, "dt_ps_coordinator_create: needs a parameter-server strategy "
                                    "and a step function");
    const dt_cluster *cl = &s->cluster;
    if (!cl->num_tasks[DT_TASK_CHIEF] && cl->num_tasks[DT_TASK_WORKER] < 2)
        return dt__fail(DT_ERR_ARG,
                        "dt_ps_coordinator_create: without a chief task worker 0 coordinates and "
                        "runs no steps, so the cluster needs another worker (it has %d); add a "
                        "chief task or a worker",
                        cl->num_tasks[DT_TASK_WORKER]);
    dt_ps_coordinator *c = calloc(1, sizeof *c);
    if (!c)
        return dt__fail(DT_ERR_NOMEM, "dt_ps_coordinator_create: out of memory");
    c->s = s;
    c->fn = fn;
    c->ctx = ctx;
    c->comm = MPI_COMM_NULL;
    c->nworkers = s->cluster.num_tasks[DT_TASK_WORKER];
    MPI_Request req;
    dt_status st = MPI_Comm_idup(s->comm, &c->comm, &req) == MPI_SUCCESS
                       ? dt__mpi_wait_all(1, &req)
                       : dt__fail(DT_ERR_COMM, "dt_ps_coordinator_create: MPI_Comm_idup failed");
    if (st == DT_OK && is_chief(c)) {
        int n = c->nworkers;
        c->recv = calloc((size_t)n, sizeof *c->recv);
        c->msg = calloc((size_t)n, sizeof *c->msg);
        c->busy = calloc((size_t)n, sizeof *c->busy);
        c->idle = calloc((size_t)n, sizeof *c->idle);
        if (!c->recv || !c->msg || !c->busy || !c->idle)
            st = dt__fail(DT_ERR_NOMEM, "dt_ps_coordinator_create: out of memory");
        for (int w = 0; st == DT_OK && w < n; w++)
            st = post_ready(c, w);
    }
    if (st != DT_OK) {
        if (c->comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->comm);
        free(c->recv);
        free(c->msg);
        free(c->busy);
        free(c->idle);
        free(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

static dt_status send_step(dt_ps_coordinator *c, int w, int64_t step)
{
    MPI_Request req;
    if (MPI_Isend(&step, 1, MPI_INT64_T, worker_rank(c, w), TAG_ASSIGN, c->comm, &req) !=
        MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "coordinator: MPI_Isend to worker %d failed", w);
    return wait_gently(1, &req);
}

static dt_status push_queue(dt_ps_coordinator *c, dt_remote_value *v, bool front)
{
    if (c->qlen == c->qcap) {
        int cap = c->qcap ? 2 * c->qcap : 64;
        dt_remote_value **n = malloc(sizeof *n * (size_t)cap);
        if (!n)
            return dt__fail(DT_ERR_NOMEM, "coordinator: out of memory");
        for (int i = 0; i < c->qlen; i++)
            n[i] = c->queue[(c->qhead + i) % c->qcap];
        free(c->queue);
        c->queue = n;
        c->qhead = 0;
        c->qcap = cap;
    }
    if (front) {
        c->qhead = (c->qhead + c->qcap - 1) % c->qcap;
        c->queue[c->qhead] = v;
    } else {
        c->queue[(c->qhead + c->qlen) % c->qcap] = v;
    }
    c->qlen++;
    return DT_OK;
}

/* The first queued step worker w may run (not the one that just failed there, unless w is the
 * only worker), removed from the queue; NULL when none. */
static dt_remote_value *pop_for(dt_ps_coordinator *c, int w)
{
    for (int i = 0; i < c->qlen; i++) {
        int at = (c->qhead + i) % c->qcap;
        dt_remote_value *v = c->queue[at];
        if (v->failed_on == w && c->nworkers > 1)
            continue;
        for (int k = i; k > 0; k--) /* close the gap */
            c->queue[(c->qhead + k) % c->qcap] = c->queue[(c->qhead + k - 1) % c->qcap];
        c->qhead = (c->qhead + 1) % c->qcap;
        c->qlen--;
        return v;
    }
    return NULL;
}

/* A step status that says the worker failed (rather than the function): rescheduled. */
static bool worker_failure(dt_status s)
{
    return s == DT_ERR_DEVICE || s == DT_ERR_COMM;
}

/* One round of the chief's dispatcher: collect results, hand out queued steps. */
static dt_status progress(dt_ps_coordinator *c, bool *moved)
{
    *moved = false;
    for (int w = 0; w < c->nworkers; w++) {
        int done = 0;
        MPI_Status st;
        if (!c->idle[w]) {
            if (MPI_Test(&c->recv[w], &done, &st) != MPI_SUCCESS)
                return dt__fail(DT_ERR_COMM, "coordinator: MPI_Test failed");
            if (done) {
                *moved = true;
                ready_msg *m = &c->msg[w];
                dt_remote_value *v = c->busy[w];
                c->busy[w] = NULL;
                c->idle[w] = true;
                if (v && m->has_result) {
                    v->worker = w;
                    v->attempts++;
                    if (m->status == DT_OK) {
                        v->done = true;
                        v->status = DT_OK;
                        v->value = m->value;
                    } else if (!worker_failure((dt_status)m->status) || v->attempts > c->nworkers) {
                        /* the function's own error is final, as TensorFlow's: only a worker
                         * that could not run it (device, communication) makes a rerun */
                        v->done = true;
                        v->status = (dt_status)m->status;
                        snprintf(v->error, sizeof v->error, "%s", m->error);
                    } else {
                        v->failed_on = w; /* reschedule, first in line, on another worker */
                        DT_TRY(push_queue(c, v, true));
                    }
                }
            }
        }
        if (c->idle[w]) {
            dt_remote_value *v = pop_for(c, w);
            if (v) {
                *moved = true;
                c->busy[w] = v;
                c->idle[w] = false;
                DT_TRY(post_ready(c, w));
                DT_TRY(send_step(c, w, v->step));
            }
        }
    }
    return DT_OK;
}

static void pause_a_little(long idle_rounds)
{
    if (idle_rounds < 2000) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

dt_status dt_ps_schedule(dt_ps_coordinator *c, int64_t step, dt_remote_value **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_ps_schedule: out is NULL");
    *out = NULL;
    if (!c || !is_chief(c))
        return dt__fail(DT_ERR_STATE, "dt_ps_schedule: only the chief schedules steps");
    if (step < 0)
        return dt__fail(DT_ERR_ARG, "dt_ps_schedule: step %lld < 0", (long long)step);
    dt_remote_value *v = calloc(1, sizeof *v);
    if (!v)
        return dt__fail(DT_ERR_NOMEM, "dt_ps_schedule: out of memory");
    v->refs = 2;
    v->step = step;
    v->failed_on = -1;
    v->worker = -1;
    v->c = c;
    if (c->nall == c->capall) {
        int cap = c->capall ? 2 * c->capall : 64;
        dt_remote_value **n = realloc(c->all, sizeof *n * (size_t)cap);
        if (!n) {
            free(v);
            return dt__fail(DT_ERR_NOMEM, "dt_ps_schedule: out of memory");
        }
        c->all = n;
        c->capall = cap;
    }
    dt_status s = push_queue(c, v, false);
    if (s != DT_OK) {
        free(v);
        return s;
    }
    c->all[c->nall++] = v;
    bool moved;
    DT_TRY(progress(c, &moved));
    *out = v;
    return DT_OK;
}

dt_status dt_remote_value_fetch(dt_remote_value *v, double *value, int *worker, int *attempts)
{
    DT__SERIAL();
    if (!v)
        return dt__fail(DT_ERR_ARG, "dt_remote_value_fetch: value is NULL");
    dt_ps_coordinator *c = v->c;
    for (long idle = 0; !v->done; idle++) {
        if (!c)
            return dt__fail(DT_ERR_STATE,
                            "dt_remote_value_fetch: step %lld is not done and its "
                            "coordinator is gone",
                            (long long)v->step);
        bool moved;
        DT_TRY(progress(c, &moved));
        if (moved)
            idle = 0;
        else
            pause_a_little(idle);
    }
    if (worker)
        *worker = v->worker;
    if (attempts)
        *attempts = v->attempts;
    if (v->status != DT_OK)
        return worker_failure(v->status)
                   ? dt__fail(v->status, "step %lld failed on every worker it ran on; last: %s",
                              (long long)v->step, v->error)
                   : dt__fail(v->status, "step %lld failed on worker %d: %s", (long long)v->step,
                              v->worker, v->error);
    if (value)
        *value = v->value;
    return DT_OK;
}

dt_status dt_ps_pending(dt_ps_coordinator *c, int *pending)
{
    DT__SERIAL();
    if (!c || !pending || !is_chief(c))
        return dt__fail(DT_ERR_STATE, "dt_ps_pending: only the chief counts its steps");
    bool moved;
    DT_TRY(progress(c, &moved));
    int n = c->qlen;
    for (int w = 0; w < c->nworkers; w++)
        n += c->busy[w] != NULL;
    *pending = n;
    return DT_OK;
}

dt_status dt_ps_join(dt_ps_coordinator *c)
{
    DT__SERIAL();
    if (!c || !is_chief(c))
        return dt__fail(DT_ERR_STATE, "dt_ps_join: only the chief joins");
    for (long idle = 0;; idle++) {
        bool busy = c->qlen > 0;
        for (int w = 0; !busy && w < c->nworkers; w++)
            busy = c->busy[w] != NULL;
        if (!busy)
            return DT_OK;
        bool moved;
        DT_TRY(progress(c, &moved));
        if (moved)
            idle = 0;
        else
            pause_a_little(idle);
    }
}

/* Worker: ask for steps and run them until told to stop. */
static dt_status worker_loop(dt_ps_coordinator *c)
{
    ready_msg m;
    memset(&m, 0, sizeof m);
    int chief = chief_rank(c);
    for (;;) {
        MPI_Request req[2];
        int64_t step = -1;
        if (MPI_Isend(&m, sizeof m, MPI_BYTE, chief, TAG_READY, c->comm, &req[0]) != MPI_SUCCESS ||
            MPI_Irecv(&step, 1, MPI_INT64_T, chief, TAG_ASSIGN, c->comm, &req[1]) != MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "worker: MPI_Isend/Irecv to the chief failed");
        DT_TRY(wait_gently(2, req));
        if (step < 0) /* -RELEASE_STOP or -RELEASE_JOINED */
            return DT_OK;
        memset(&m, 0, sizeof m);
        m.step = step;
        m.has_result = 1;
        /* the user's step runs without the API lock: it may wait for a lock of the caller's
         * (a binding's) that a thread waiting for the API lock holds */
        int held = dt__api_suspend();
        dt_status s = c->fn(c->ctx, step, &m.value);
        dt__api_resume(held);
        m.status = s;
        if (s != DT_OK)
            snprintf(m.error, sizeof m.error, "%s", dt_last_error());
    }
}

/* ps (and evaluator): serve the windows until the chief releases them (stop or joined). */
static dt_status serve_loop(dt_ps_coordinator *c)
{
    int token;
    MPI_Request req;
    if (MPI_Irecv(&token, 1, MPI_INT, chief_rank(c), TAG_STOP, c->comm, &req) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "ps: MPI_Irecv from the chief failed");
    return wait_gently(1, &req);
}

/* What the chief tells the others when it releases them: the coordinator is shut down, or
 * every scheduled step is done (dt_ps_join_all) and it goes on. */
enum { RELEASE_STOP = 1, RELEASE_JOINED = 2 };

static dt_status chief_release(dt_ps_coordinator *c, int why)
{
    DT_TRY(dt_ps_join(c));
    /* every worker is idle with its READY received: release it (a joined worker sends READY
     * again when it next serves, so the chief listens for it again) */
    for (int w = 0; w < c->nworkers; w++) {
        if (!c->idle[w]) {
            int done = 0;
            for (long idle = 0; !done; idle++) {
                MPI_Status st;
                MPI_Test(&c->recv[w], &done, &st);
                if (!done)
                    pause_a_little(idle);
            }
        }
        DT_TRY(send_step(c, w, -why));
        if (why == RELEASE_JOINED) {
            c->idle[w] = false;
            DT_TRY(post_ready(c, w));
        }
    }
    const dt_cluster *cl = &c->s->cluster;
    int token = why;
    for (int r = 0; r < dt__rt.num_clients; r++) {
        if (r == dt__rt.client ||
            (r >= cl->first_rank[DT_TASK_WORKER] &&
             r < cl->first_rank[DT_TASK_WORKER] + cl->num_tasks[DT_TASK_WORKER]))
            continue;
        MPI_Request req;
        if (MPI_Isend(&token, 1, MPI_INT, r, TAG_STOP, c->comm, &req) != MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "coordinator: MPI_Isend to rank %d failed", r);
        DT_TRY(wait_gently(1, &req));
    }
    return DT_OK;
}

/* The chief releases the others for `why`; workers run steps and ps tasks serve until then. */
static dt_status serve_until(dt_ps_coordinator *c, int why)
{
    if (is_chief(c))
        return chief_release(c, why);
    if (c->s->cluster.task_type == DT_TASK_WORKER)
        return worker_loop(c);
    return serve_loop(c);
}

dt_status dt_ps_join_all(dt_ps_coordinator *c)
{
    DT__SERIAL();
    if (!c)
        return dt__fail(DT_ERR_ARG, "dt_ps_join_all: coordinator is NULL");
    return dt__agree(c->comm, serve_until(c, RELEASE_JOINED));
}

dt_status dt_ps_coordinator_shutdown(dt_ps_coordinator *c)
{
    DT__SERIAL();
    if (!c)
        return dt__fail(DT_ERR_ARG, "dt_ps_coordinator_shutdown: coordinator is NULL");
    dt_status s = serve_until(c, RELEASE_STOP);
    /* everyone leaves together, and a failure anywhere is reported everywhere */
    s = dt__agree(c->comm, s);
    for (int i = 0; i < c->nall; i++) {
        c->all[i]->c = NULL;
        rv_release(c->all[i]);
    }
    free(c->all);
    free(c->queue);
    free(c->recv);
    free(c->msg);
    free(c->busy);
    free(c->idle);
    MPI_Comm_free(&c->comm);
    free(c);
    return s;
}

/* ---- variables of their own on the ps tasks ------------------------------------------------ */

struct dt_ps_variable {
    dt__ps_var pv;
    int nps;        /* ps tasks */
    int first_rank; /* of the first ps task */
};

dt_status dt_ps_variable_create(dt_strategy *s, const dt_tensor *initial, dt_ps_variable **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_ps_variable_create: out is NULL");
    *out = NULL;
    if (!s || s->kind != DT_STRATEGY_PARAMETER_SERVER || !initial)
        return dt__fail(DT_ERR_ARG, "dt_ps_variable_create: needs a parameter-server strategy "
                                    "and an initial value");
    dt_ps_variable *v = calloc(1, sizeof *v);
    if (!v)
        return dt__fail(DT_ERR_NOMEM, "dt_ps_variable_create: out of memory");
    dt_variable *tmp = NULL;
    dt_status st = dt_variable_create(initial, &tmp);
    if (st == DT_OK)
        st = dt__ps_var_create(s, tmp, &v->pv); /* agreed over every client */
    dt_variable_free(tmp);
    if (st != DT_OK) {
        free(v);
        return st;
    }
    v->nps = s->cluster.num_tasks[DT_TASK_PS];
    v->first_rank = s->cluster.first_rank[DT_TASK_PS];
    *out = v;
    return DT_OK;
}

void dt_ps_variable_free(dt_ps_variable *v)
{
    DT__SERIAL();
    if (!v)
        return;
    dt__ps_var_free(&v->pv);
    free(v);
}

static dt_status check_bytes(const char *fn, const dt_ps_variable *v, const void *p, size_t bytes)
{
    size_t need = v ? (size_t)v->pv.elems * dt_dtype_size(v->pv.dtype) : 0;
    if (!v || (!p && need) || bytes < need)
        return dt__fail(DT_ERR_ARG, "%s: %s, %zu bytes given, %zu needed", fn,
                        v ? (p ? "buffer too short" : "buffer is NULL") : "variable is NULL", bytes,
                        need);
    return DT_OK;
}

dt_status dt_ps_variable_read(const dt_ps_variable *v, void *host, size_t bytes)
{
    DT__SERIAL();
    DT_TRY(check_bytes("dt_ps_variable_read", v, host, bytes));
    return dt__ps_var_pull(&v->pv, host);
}

dt_status dt_ps_variable_add(const dt_ps_variable *v, const void *delta, size_t bytes)
{
    DT__SERIAL();
    DT_TRY(check_bytes("dt_ps_variable_add", v, delta, bytes));
    return dt__ps_var_push(&v->pv, delta);
}

dt_status dt_ps_variable_fetch_add(const dt_ps_variable *v, const void *delta, void *old,
                                   size_t bytes)
{
    DT__SERIAL();
    DT_TRY(check_bytes("dt_ps_variable_fetch_add", v, delta, bytes));
    DT_TRY(check_bytes("dt_ps_variable_fetch_add", v, old, bytes));
    return each_shard(&v->pv, fetch_add_op, "MPI_Rget_accumulate", delta, old, true);
}

int dt_ps_variable_num_shards(const dt_ps_variable *v)
{
    return v ? v->pv.nshards : 0;
}

dt_status dt_ps_variable_shard(const dt_ps_variable *v, int i, int *ps_task, int64_t *row0,
                               int64_t *rows)
{
    if (!v || i < 0 || i >= v->pv.nshards || !ps_task || !row0 || !rows)
        return dt__fail(DT_ERR_ARG, "dt_ps_variable_shard: shard %d of %d, or a NULL argument", i,
                        v ? v->pv.nshards : 0);
    *ps_task = v->pv.shards[i].rank - v->first_rank;
    *row0 = v->pv.shards[i].row0;
    *rows = v->pv.shards[i].rows;
    return DT_OK;
}
