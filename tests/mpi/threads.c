/* The C API from several threads of one client (include/dtensor.h, "Threads"): four threads
 * run ops at once on one mesh, on meshes over the same devices, with traced functions, a
 * function shared by every thread, callbacks that call the API again (a strategy's step under
 * the lock, a wrapped tensor's release without it), and every result is checked against
 * loops here (small integers: exact in f32). Before the API lock two threads deadlocked (each
 * device has one task slot; one thread's task was overwritten).
 *
 * The meshes are each client's own (dt_mesh_create_local), so the threads' calls need no
 * order across clients; under a launcher a fifth thread meanwhile makes calls across clients
 * (barriers, reads of a tensor over every device): one thread of each client issues them, in
 * one order. A TAP program rather than a Criterion one, so that it runs under
 * ThreadSanitizer (scripts/test.sh; Criterion's arena cannot be mapped beside TSan's). */
#include "dt.h"
#include "tap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define ROUNDS 12
enum { M = 8, K = 12, N = 6 };

typedef struct job {
    int id;
    const dt_mesh *mesh; /* shared, or NULL: the thread makes its own from its axes */
    const char *axes[2];
    int sizes[2];
    const dt_function *fn;
    bool ok;
    char why[512];
} job;

static void fail(job *j, const char *what)
{
    if (j->ok)
        snprintf(j->why, sizeof j->why, "thread %d: %s: %s", j->id, what, dt_last_error());
    j->ok = false;
}

/* a [M,K] and b [K,N] of thread `id`, round r, and their product and column sums: loops */
static void operands(int id, int r, float a[M * K], float b[K * N], float c[M * N], float colsum[N])
{
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((i * 7 + id * 3 + r) % 11 - 5);
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((i * 5 + id + 2 * r) % 9 - 4);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < N; k++) {
            float s = 0;
            for (int q = 0; q < K; q++)
                s += a[i * K + q] * b[q * N + k];
            c[i * N + k] = s;
        }
    for (int k = 0; k < N; k++) {
        colsum[k] = 0;
        for (int i = 0; i < M; i++)
            colsum[k] += c[i * N + k];
    }
}

/* One round on mesh m (its first axis shards the contracting axis: a partial product
 * all-reduced between the devices) or through f; checks the product and its column sums. */
static void round_on(job *j, const dt_mesh *m, const dt_function *f, int r)
{
    float a[M * K], b[K * N], c[M * N], colsum[N], got[M * N], gotsum[N];
    operands(j->id, r, a, b, c, colsum);
    char la[64], lb[64];
    snprintf(la, sizeof la, "unsharded,%s", dt_mesh_axis_name(m, 0));
    snprintf(lb, sizeof lb, "%s,unsharded", dt_mesh_axis_name(m, 0));
    dt_layout pa, pb;
    dt_tensor *ta = NULL, *tb = NULL, *tc = NULL, *ts = NULL;
    bool ok =
        dt_layout_parse(m, la, &pa) == DT_OK && dt_layout_parse(m, lb, &pb) == DT_OK &&
        dt_tensor_from_host(&pa, DT_DTYPE_F32, 2, (int64_t[]){M, K}, a, sizeof a, &ta) == DT_OK &&
        dt_tensor_from_host(&pb, DT_DTYPE_F32, 2, (int64_t[]){K, N}, b, sizeof b, &tb) == DT_OK;
    const dt_tensor *in[2] = {ta, tb};
    if (!ok)
        fail(j, "from_host");
    else if ((f ? dt_function_run(f, 2, in, 1, &tc) : dt_matmul(ta, tb, NULL, &tc)) != DT_OK)
        fail(j, f ? "function run" : "matmul");
    else if (dt_reduce(DT_REDUCE_SUM, tc, 1, (int[]){0}, 0, NULL, &ts) != DT_OK)
        fail(j, "reduce");
    else if (dt_tensor_read(tc, got, sizeof got) != DT_OK ||
             dt_tensor_read(ts, gotsum, sizeof gotsum) != DT_OK)
        fail(j, "read");
    else if (memcmp(got, c, sizeof c) != 0 || memcmp(gotsum, colsum, sizeof colsum) != 0) {
        snprintf(j->why, sizeof j->why,
                 "thread %d round %d on %s: c[0] %g (expected %g), sum[0] %g (expected %g)", j->id,
                 r, f ? "a function" : "eager ops", got[0], c[0], gotsum[0], colsum[0]);
        j->ok = false;
    }
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(tc);
    dt_tensor_free(ts);
}

static void *eager_rounds(void *arg)
{
    job *j = arg;
    dt_mesh *own = NULL;
    if (!j->mesh && dt_mesh_create_local(j->sizes[1] ? 2 : 1, j->axes, j->sizes, DT_DEVICE_CPU, 0,
                                         &own) != DT_OK) {
        fail(j, "a mesh of its own");
        return NULL;
    }
    for (int r = 0; r < ROUNDS && j->ok; r++)
        round_on(j, own ? own : j->mesh, j->fn, r);
    dt_mesh_free(own);
    return NULL;
}

/* ---- tracing on one thread while others run eagerly; callbacks that call the API ---------- */

static void *trace_and_run(void *arg)
{
    job *j = arg;
    for (int r = 0; r < ROUNDS && j->ok; r++) {
        /* this thread records; the other threads' eager ops must not land in its function */
        dt_layout pa, pb;
        dt_function *f = NULL;
        dt_tensor *a = NULL, *b = NULL, *c = NULL;
        if (dt_layout_parse(j->mesh, "unsharded,x", &pa) != DT_OK ||
            dt_layout_parse(j->mesh, "x,unsharded", &pb) != DT_OK ||
            dt_function_begin(&f) != DT_OK ||
            dt_function_input(f, &pa, DT_DTYPE_F32, 2, (int64_t[]){M, K}, &a) != DT_OK ||
            dt_function_input(f, &pb, DT_DTYPE_F32, 2, (int64_t[]){K, N}, &b) != DT_OK ||
            dt_matmul(a, b, NULL, &c) != DT_OK || dt_function_end(f, 1, &c) != DT_OK)
            fail(j, "tracing");
        else
            round_on(j, j->mesh, f, r);
        dt_tensor_free(a);
        dt_tensor_free(b);
        dt_tensor_free(c);
        dt_function_free(f);
    }
    return NULL;
}

static int released;

/* Runs without the API lock (a binding's release takes a lock of its own, which a thread
 * waiting for the API lock may hold); calls the API all the same. */
static void release_calling_the_api(void *ctx)
{
    if (dt_num_local_devices(DT_DEVICE_CPU) == 4)
        __atomic_fetch_add(&released, 1, __ATOMIC_SEQ_CST);
    free(ctx);
}

static void *wrap_rounds(void *arg)
{
    job *j = arg;
    dt_layout sh;
    if (dt_layout_parse(j->mesh, "x", &sh) != DT_OK) {
        fail(j, "layout");
        return NULL;
    }
    for (int r = 0; r < ROUNDS && j->ok; r++) {
        /* [4] over x: element d on device d, released (a callback calling the API) when the
         * tensor is freed while the other threads compute */
        float *v = malloc(4 * sizeof *v), sum = 0;
        for (int d = 0; d < 4; d++)
            v[d] = (float)(d + r);
        void *parts[4] = {v, v + 1, v + 2, v + 3};
        size_t bytes[4] = {sizeof *v, sizeof *v, sizeof *v, sizeof *v};
        dt_tensor *t = NULL, *s = NULL;
        if (dt_tensor_wrap(&sh, DT_DTYPE_F32, 1, (int64_t[]){4}, 4, parts, bytes,
                           release_calling_the_api, v, &t) != DT_OK) {
            free(v);
            fail(j, "wrap");
        } else if (dt_reduce(DT_REDUCE_SUM, t, 0, NULL, 0, NULL, &s) != DT_OK ||
                   dt_tensor_read(s, &sum, sizeof sum) != DT_OK) {
            fail(j, "reduce of a wrapped tensor");
        } else if (sum != (float)(6 + 4 * r)) {
            snprintf(j->why, sizeof j->why, "thread %d: sum %g, expected %d", j->id, sum,
                     6 + 4 * r);
            j->ok = false;
        }
        dt_tensor_free(s);
        dt_tensor_free(t);
    }
    return NULL;
}

/* A strategy's step runs under the lock and calls ops itself (the lock is recursive). */
static dt_status step_with_ops(void *ctx, dt_strategy *s, int num_inputs,
                               const dt_tensor *const inputs[])
{
    (void)num_inputs;
    (void)s;
    float *out = ctx;
    dt_tensor *y = NULL, *r = NULL;
    dt_status st = dt_unary(DT_UNARY_SQUARE, inputs[0], NULL, &y);
    if (st == DT_OK)
        st = dt_reduce(DT_REDUCE_SUM, y, 0, NULL, 0, NULL, &r);
    if (st == DT_OK)
        st = dt_tensor_read(r, out, sizeof *out);
    dt_tensor_free(y);
    dt_tensor_free(r);
    return st;
}

static void *strategy_rounds(void *arg)
{
    job *j = arg;
    dt_strategy *s = NULL;
    if (dt_strategy_create(DT_STRATEGY_MIRRORED, NULL, &s) != DT_OK) {
        fail(j, "strategy");
        return NULL;
    }
    for (int r = 0; r < ROUNDS && j->ok; r++) {
        float x[8], got = -1, want = 0;
        for (int i = 0; i < 8; i++) {
            x[i] = (float)(i - 3 + r);
            want += x[i] * x[i];
        }
        dt_tensor *t = NULL;
        if (dt_strategy_distribute_batch(s, DT_DTYPE_F32, 1, (int64_t[]){8}, x, sizeof x, &t) !=
                DT_OK ||
            dt_strategy_run(s, step_with_ops, &got, 1, (const dt_tensor *const[]){t}) != DT_OK)
            fail(j, "strategy run");
        else if (got != want) {
            snprintf(j->why, sizeof j->why, "thread %d: sum of squares %g, expected %g", j->id, got,
                     want);
            j->ok = false;
        }
        dt_tensor_free(t);
    }
    dt_strategy_free(s);
    return NULL;
}

static void *mixed(void *arg)
{
    job *j = arg;
    void *(*bodies[THREADS])(void *) = {trace_and_run, wrap_rounds, strategy_rounds, eager_rounds};
    return bodies[j->id](arg);
}

/* ---- across clients: one thread per client makes these calls, in one order --------------- */

static volatile int others_running;

static void *across_clients(void *arg)
{
    job *j = arg;
    dt_mesh *g = NULL;
    char spec[32];
    snprintf(spec, sizeof spec, "all=%d", dt_num_global_devices(DT_DEVICE_CPU));
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &g) != DT_OK) {
        fail(j, "a mesh over every client");
        return NULL;
    }
    dt_layout l;
    dt_layout_parse(g, "all", &l);
    int64_t n = dt_num_global_devices(DT_DEVICE_CPU);
    /* rounds until every client's other threads are done: the clients decide together (one
     * client's own threads may end before another's) */
    for (int r = 0;; r++) {
        dt_tensor *t = NULL;
        int64_t sum = -1;
        if (dt_barrier() != DT_OK ||
            dt_arange(DT_DTYPE_I64, n, r, 1, &(dt_op_options){.layout = &l}, &t) != DT_OK)
            fail(j, "barrier, arange");
        dt_tensor *s = NULL;
        if (j->ok && (dt_reduce(DT_REDUCE_SUM, t, 0, NULL, 0, NULL, &s) != DT_OK ||
                      dt_tensor_read(s, &sum, sizeof sum) != DT_OK))
            fail(j, "sum over every client");
        if (j->ok && sum != n * r + n * (n - 1) / 2) {
            snprintf(j->why, sizeof j->why, "round %d: sum %lld over every device", r,
                     (long long)sum);
            j->ok = false;
        }
        dt_tensor_free(t);
        dt_tensor_free(s);
        int mine[2] = {__atomic_load_n(&others_running, __ATOMIC_SEQ_CST) || r + 1 < ROUNDS, j->ok},
            all[64][2];
        if (dt_num_clients() > 64 || dt_client_allgather(mine, sizeof mine, all) != DT_OK) {
            fail(j, "deciding whether to go on");
            break;
        }
        bool more = false, every_ok = true;
        for (int c = 0; c < dt_num_clients(); c++) {
            more = more || all[c][0];
            every_ok = every_ok && all[c][1];
        }
        if (!more || !every_ok)
            break;
    }
    dt_mesh_free(g);
    return NULL;
}

/* Four jobs on threads (a fifth across clients under a launcher); TAP check per job. */
static void run_threads(const char *what, job jobs[THREADS], void *(*body)(void *))
{
    pthread_t th[THREADS + 1];
    job cross = {.id = THREADS, .ok = true};
    bool multi = dt_num_clients() > 1;
    __atomic_store_n(&others_running, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < THREADS; i++) {
        jobs[i].id = i;
        jobs[i].ok = true;
        pthread_create(&th[i], NULL, body, &jobs[i]);
    }
    if (multi)
        pthread_create(&th[THREADS], NULL, across_clients, &cross);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    __atomic_store_n(&others_running, 0, __ATOMIC_SEQ_CST);
    if (multi)
        pthread_join(th[THREADS], NULL);
    bool ok = cross.ok;
    const char *why = cross.why;
    for (int i = 0; i < THREADS; i++)
        if (!jobs[i].ok) {
            ok = false;
            why = jobs[i].why;
        }
    tap_check(ok, "%s%s: %s", what, multi ? ", a fifth thread calling across clients" : "",
              ok ? "every result right" : why);
}

int main(void)
{
    dt_init_options o = {.cpu_devices = 4};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    dt_mesh *m = NULL;
    tap_check(dt_mesh_create_local(1, (const char *[]){"x"}, (int[]){4}, DT_DEVICE_CPU, 0, &m) ==
                  DT_OK,
              "a mesh of this client's four devices");

    job one[THREADS] = {{.mesh = m}, {.mesh = m}, {.mesh = m}, {.mesh = m}};
    run_threads("four threads on one mesh", one, eager_rounds);

    job own[THREADS] = {{.axes = {"x"}, .sizes = {4}},
                        {.axes = {"a", "b"}, .sizes = {2, 2}},
                        {.axes = {"y"}, .sizes = {4}},
                        {.axes = {"p", "q"}, .sizes = {2, 2}}};
    run_threads("four threads on meshes of their own over the same devices", own, eager_rounds);

    /* one traced function run by every thread at once (one program) */
    dt_layout pa, pb;
    dt_function *f = NULL;
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    bool traced = dt_layout_parse(m, "unsharded,x", &pa) == DT_OK &&
                  dt_layout_parse(m, "x,unsharded", &pb) == DT_OK &&
                  dt_function_begin(&f) == DT_OK &&
                  dt_function_input(f, &pa, DT_DTYPE_F32, 2, (int64_t[]){M, K}, &a) == DT_OK &&
                  dt_function_input(f, &pb, DT_DTYPE_F32, 2, (int64_t[]){K, N}, &b) == DT_OK &&
                  dt_matmul(a, b, NULL, &c) == DT_OK && dt_function_end(f, 1, &c) == DT_OK;
    tap_check(traced, "a traced matmul");
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
    job fn[THREADS] = {
        {.mesh = m, .fn = f}, {.mesh = m, .fn = f}, {.mesh = m}, {.mesh = m, .fn = f}};
    run_threads("three threads running one function, one eager ops", fn, eager_rounds);
    dt_function_free(f);

    released = 0;
    job mix[THREADS] = {{.mesh = m}, {.mesh = m}, {.mesh = m}, {.mesh = m}};
    run_threads("tracing, wrapped tensors whose release calls the API, a strategy's step calling "
                "ops, eager ops",
                mix, mixed);
    tap_check(released == ROUNDS, "every release callback ran once and saw the runtime (%d of %d)",
              released, ROUNDS);

    dt_mesh_free(m);
    int rc = tap_done();
    if (dt_finalize() != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        rc = 1;
    }
    return rc;
}
