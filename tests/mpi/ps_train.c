/* Parameter-server training (run with DTENSOR_CLUSTER=chief=1,worker=W,ps=P at -n 1+W+P):
 * 1. the MLP classifier trained asynchronously for STEPS steps reaches a final full-data loss
 *    within 5% of mirrored's after the same number of steps (the chief trains the mirrored
 *    reference on its own devices);
 * 2. asynchrony: worker 0 sleeps in every step; the other workers must run more steps than it
 *    (step counts, not wall-clock thresholds);
 * 3. a step failing on worker 0 is rescheduled on another worker and its value still comes
 *    back. */
#include "dt.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 4, HID = 16, OUT = 3, B = 32, ROWS = 256, STEPS = 120, ASYNC_STEPS = 40 };

static float X[ROWS][IN], Y[ROWS][OUT];

/* Three overlapping Gaussian-ish clusters: the loss plateaus well above zero. */
static void make_data(void)
{
    unsigned s = 99;
    for (int r = 0; r < ROWS; r++) {
        int cls = (r * 7) % OUT;
        for (int j = 0; j < IN; j++) {
            double u = 0;
            for (int k = 0; k < 4; k++) {
                s = s * 1103515245u + 12345u;
                u += (double)((s >> 8) & 0xffff) / 65536.0 - 0.5;
            }
            X[r][j] = (float)((j == cls ? 1.0 : 0.0) + 0.9 * u);
        }
        for (int k = 0; k < OUT; k++)
            Y[r][k] = k == cls;
    }
}

static const dt_dense_config layers[2] = {
    {.units = HID, .activation = DT_ACTIVATION_RELU},
    {.units = OUT},
};

static dt_status batch_of(dt_strategy *s, int64_t step, dt_tensor **x, dt_tensor **y)
{
    float xb[B][IN], yb[B][OUT];
    for (int e = 0; e < B; e++) {
        int r = (int)((step * B + e) % ROWS);
        memcpy(xb[e], X[r], sizeof xb[e]);
        memcpy(yb[e], Y[r], sizeof yb[e]);
    }
    *y = NULL;
    DT_TRY(dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){B, IN}, xb, sizeof xb, x));
    return dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){B, OUT}, yb, sizeof yb, y);
}

static dt_status full_loss(dt_strategy *s, dt_model *m, double *loss)
{
    dt_tensor *x = NULL, *y = NULL;
    dt_layout l;
    DT_TRY(dt_layout_replicated(dt_strategy_mesh(s), 2, &l));
    dt_status st = dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){ROWS, IN}, X, sizeof X, &x);
    if (st == DT_OK)
        st = dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){ROWS, OUT}, Y, sizeof Y, &y);
    if (st == DT_OK)
        st = dt_model_evaluate(m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, x, y, loss);
    dt_tensor_free(x);
    dt_tensor_free(y);
    return st;
}

typedef struct ctx {
    dt_strategy *s;
    dt_model *m;
    dt_optimizer *o;
    dt_cluster cl;
    int mode; /* 0 train; 1 train, worker 0 slow; 2 train, worker 0 fails; 3 odd steps' function
               * fails */
} ctx;

static dt_status step_fn(void *p, int64_t step, double *value)
{
    ctx *c = p;
    bool w0 = c->cl.task_type == DT_TASK_WORKER && c->cl.task_index == 0;
    if (c->mode == 2 && w0)
        return dt__fail(DT_ERR_DEVICE, "worker 0 fails step %lld on purpose", (long long)step);
    if (c->mode == 3 && step % 2)
        return dt__fail(DT_ERR_ARG, "step %lld's function fails on purpose", (long long)step);
    if (c->mode == 1 && w0) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    dt_tensor *x = NULL, *y = NULL;
    dt_status s = batch_of(c->s, step, &x, &y);
    if (s == DT_OK)
        s = dt_model_train_step(c->s, c->m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, c->o, x, y, value);
    dt_tensor_free(x);
    dt_tensor_free(y);
    return s;
}

/* The chief's mirrored reference: same model, seed, batches and optimizer. */
static dt_status mirrored_reference(double *loss)
{
    dt_strategy *s = NULL;
    dt_model *m = NULL;
    dt_optimizer *o = NULL;
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1};
    DT_TRY(dt_strategy_create(DT_STRATEGY_MIRRORED, NULL, &s));
    dt_strategy_scope_enter(s);
    dt_status st = dt_model_create(IN, 2, layers, DT_DTYPE_F32, 5, &m);
    dt_strategy_scope_exit(s);
    if (st == DT_OK)
        st = dt_optimizer_create(&oc, &o);
    for (int64_t t = 0; st == DT_OK && t < STEPS; t++) {
        dt_tensor *x = NULL, *y = NULL;
        st = batch_of(s, t, &x, &y);
        if (st == DT_OK)
            st = dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, o, x, y, NULL);
        dt_tensor_free(x);
        dt_tensor_free(y);
    }
    if (st == DT_OK)
        st = full_loss(s, m, loss);
    dt_optimizer_free(o);
    dt_model_free(m);
    dt_strategy_free(s);
    return st;
}

/* Schedule `n` steps from `first` under `mode`, fetch them all; per-worker counts. */
static bool phase(dt_ps_coordinator *co, int64_t first, int n, int counts[], int *reruns,
                  bool *all_ok, int *bad_worker)
{
    dt_remote_value **v = calloc((size_t)n, sizeof *v);
    bool ok = v != NULL;
    *reruns = 0;
    *all_ok = true;
    *bad_worker = -1;
    for (int i = 0; ok && i < n; i++)
        ok = dt_ps_schedule(co, first + i, &v[i]) == DT_OK;
    for (int i = 0; ok && i < n; i++) {
        double val;
        int w = -1, att = 0;
        if (dt_remote_value_fetch(v[i], &val, &w, &att) != DT_OK || !isfinite(val)) {
            *all_ok = false;
            tap_diag("step %lld: %s", (long long)(first + i), dt_last_error());
        }
        if (w >= 0)
            counts[w]++;
        if (w == 0)
            *bad_worker = 0;
        *reruns += att - 1;
    }
    ok = ok && dt_ps_join(co) == DT_OK;
    for (int i = 0; v && i < n; i++)
        dt_remote_value_free(v[i]);
    free(v);
    return ok;
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    make_data();
    ctx c = {0};
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1};
    dt_strategy_options so = {.partitioner = {.min_shard_bytes = 64}};
    dt_status st = dt_strategy_create(DT_STRATEGY_PARAMETER_SERVER, &so, &c.s);
    if (!tap_check(st == DT_OK, "parameter-server strategy: %s", st ? dt_last_error() : "ok"))
        return tap_done();
    dt_strategy_cluster(c.s, &c.cl);
    int nw = c.cl.num_tasks[DT_TASK_WORKER];
    bool chief = c.cl.task_type == DT_TASK_CHIEF;
    tap_diag("cluster: %d workers, %d ps", nw, c.cl.num_tasks[DT_TASK_PS]);
    dt_strategy_scope_enter(c.s);
    st = dt_model_create(IN, 2, layers, DT_DTYPE_F32, 5, &c.m);
    dt_strategy_scope_exit(c.s);
    tap_check(st == DT_OK, "model variables sharded on the ps tasks: %s",
              st ? dt_last_error() : "ok");
    st = st ? st : dt_optimizer_create(&oc, &c.o);

    double ref = 0, ps_loss = 0, before = 0;
    if (chief && st == DT_OK) {
        st = full_loss(c.s, c.m, &before);
        if (st == DT_OK)
            st = mirrored_reference(&ref);
    }
    int counts[16] = {0}, slow[16] = {0}, failc[16] = {0}, reruns = 0, freruns = 0, w0 = -1;
    bool ok1 = true, ok2 = true, ok3 = true;
    dt_ps_coordinator *co = NULL;
    if (st == DT_OK)
        st = dt_ps_coordinator_create(c.s, step_fn, &c, &co);
    if (chief && st == DT_OK) {
        c.mode = 0;
        bool ok = phase(co, 0, STEPS, counts, &reruns, &ok1, &w0);
        ok = ok && dt_ps_pull(c.s, c.m) == DT_OK && full_loss(c.s, c.m, &ps_loss) == DT_OK;
        ok1 = ok1 && ok;
    }
    /* every process sets the mode before each (collective) coordinator: a closure runs with
     * the ctx of the worker process it lands on */
    if (st == DT_OK)
        st = dt_ps_coordinator_shutdown(co);
    tap_check(st == DT_OK && ok1, "%d steps scheduled and fetched: %s", STEPS,
              st ? dt_last_error() : "ok");
    double rel = fabs(ps_loss - ref) / ref;
    int cnt[2] = {counts[0], counts[1]};
    tap_check(!chief || (rel <= 0.05 && ps_loss < 0.8 * before),
              "final loss %.4f (from %.4f) within 5%% of mirrored's %.4f (rel %.3f); steps per "
              "worker %d, %d",
              ps_loss, before, ref, rel, cnt[0], cnt[1]);

    /* 2: worker 0 slow */
    c.mode = 1;
    st = dt_ps_coordinator_create(c.s, step_fn, &c, &co);
    if (chief && st == DT_OK)
        ok2 = phase(co, STEPS, ASYNC_STEPS, slow, &reruns, &ok2, &w0) && ok2;
    if (st == DT_OK)
        st = dt_ps_coordinator_shutdown(co);
    bool fast_more = true;
    for (int w = 1; w < nw; w++)
        fast_more = fast_more && slow[w] > slow[0];
    tap_check(st == DT_OK && ok2 && (!chief || fast_more),
              "asynchronous: slow worker 0 ran %d steps, the others %d, %d (of %d)", slow[0],
              slow[1], nw > 2 ? slow[2] : 0, ASYNC_STEPS);

    /* 3: worker 0 fails every step: rescheduled elsewhere */
    c.mode = 2;
    st = dt_ps_coordinator_create(c.s, step_fn, &c, &co);
    if (chief && st == DT_OK)
        ok3 = phase(co, STEPS + ASYNC_STEPS, 6, failc, &freruns, &ok3, &w0) && ok3;
    if (st == DT_OK)
        st = dt_ps_coordinator_shutdown(co);
    tap_check(st == DT_OK && ok3 && (!chief || (failc[0] == 0 && freruns >= 1)),
              "failing steps rescheduled: worker 0 finished %d, reruns %d", failc[0], freruns);

    /* 4: a function's own error (not a worker's failure) ends its step, run once, and the
     * fetch reports it with the worker; the other steps run */
    c.mode = 3;
    bool ok4 = true;
    st = dt_ps_coordinator_create(c.s, step_fn, &c, &co);
    if (chief && st == DT_OK) {
        enum { N4 = 4 };
        const int64_t first = STEPS + ASYNC_STEPS + 6;
        dt_remote_value *v[N4] = {0};
        for (int i = 0; ok4 && i < N4; i++)
            ok4 = dt_ps_schedule(co, first + i, &v[i]) == DT_OK;
        for (int i = 0; ok4 && i < N4; i++) {
            double val = 0;
            int w = -1, att = 0;
            dt_status fs = dt_remote_value_fetch(v[i], &val, &w, &att);
            ok4 = (first + i) % 2 ? fs == DT_ERR_ARG && att == 1 && w >= 0 &&
                                        strstr(dt_last_error(), "failed on worker") &&
                                        strstr(dt_last_error(), "fails on purpose")
                                  : fs == DT_OK && att == 1 && isfinite(val);
            if (!ok4)
                tap_diag("step %lld: status %d, attempts %d: %s", (long long)(first + i), fs, att,
                         fs ? dt_last_error() : "ok");
        }
        ok4 = dt_ps_join(co) == DT_OK && ok4;
        for (int i = 0; i < N4; i++)
            dt_remote_value_free(v[i]);
    }
    if (st == DT_OK)
        st = dt_ps_coordinator_shutdown(co);
    tap_check(st == DT_OK && ok4,
              "a function's error ends its step (run once, fetched with its worker); the others "
              "run");

    dt_optimizer_free(c.o);
    dt_model_free(c.m);
    dt_strategy_free(c.s);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
