/* Training throughput of the strategies on an MLP (64 -> 256 relu -> 10, softmax
 * cross-entropy, SGD, global batch 256), in steps per second. Prints CSV:
 *   strategy,clients,devices_per_client,steps,seconds,steps_per_second
 *
 *   DTENSOR_CPU_DEVICES=2 OPENBLAS_NUM_THREADS=1 ./bench_train local [steps]
 *       one_device against mirrored on one process with 2 devices
 *   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 4 ./bench_train cluster [steps]
 *       multi_worker_mirrored against parameter_server (chief=1,worker=n-2,ps=1, unless
 *       DTENSOR_CLUSTER or TF_CONFIG says otherwise); the parameter server's steps are
 *       asynchronous, each on one worker's batch of 256 (the same examples per step as
 *       multi-worker mirrored's global batch). */
#include "bench.h"
#include <dtensor.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 64, HID = 256, OUT = 10, B = 256 };

static float X[B][IN], Y[B][OUT];

typedef struct run {
    dt_strategy *s;
    dt_model *m;
    dt_optimizer *o;
    dt_tensor *x, *y;
} run;

static void setup(run *r, dt_strategy_kind kind)
{
    memset(r, 0, sizeof *r);
    BENCH_CHECK(dt_strategy_create(kind, NULL, &r->s));
    const dt_dense_config layers[2] = {{.units = HID, .activation = DT_ACTIVATION_RELU},
                                       {.units = OUT}};
    BENCH_CHECK(dt_strategy_scope_enter(r->s));
    BENCH_CHECK(dt_model_create(IN, 2, layers, DT_DTYPE_F32, 3, &r->m));
    BENCH_CHECK(dt_strategy_scope_exit(r->s));
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.05};
    BENCH_CHECK(dt_optimizer_create(&oc, &r->o));
    BENCH_CHECK(dt_strategy_distribute_batch(r->s, DT_DTYPE_F32, 2, (int64_t[]){B, IN}, X, sizeof X,
                                             &r->x));
    BENCH_CHECK(dt_strategy_distribute_batch(r->s, DT_DTYPE_F32, 2, (int64_t[]){B, OUT}, Y,
                                             sizeof Y, &r->y));
}

static void teardown(run *r)
{
    dt_tensor_free(r->x);
    dt_tensor_free(r->y);
    dt_optimizer_free(r->o);
    dt_model_free(r->m);
    dt_strategy_free(r->s);
}

static dt_status one_step(void *p, int64_t t, double *loss)
{
    (void)t;
    run *r = p;
    return dt_model_train_step(r->s, r->m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, r->o, r->x, r->y, loss);
}

static void report(const char *name, int steps, double secs)
{
    if (dt_client_id() == 0)
        printf("%s,%d,%d,%d,%.4f,%.2f\n", name, dt_num_clients(),
               dt_num_local_devices(DT_DEVICE_CPU), steps, secs, steps / secs);
}

static void bench_sync(dt_strategy_kind kind, int steps)
{
    run r;
    setup(&r, kind);
    double loss;
    BENCH_CHECK(one_step(&r, 0, &loss)); /* trace and warm up */
    BENCH_CHECK(dt_barrier());
    double t0 = bench_now();
    for (int t = 0; t < steps; t++)
        BENCH_CHECK(one_step(&r, t, &loss));
    BENCH_CHECK(dt_barrier());
    report(dt_strategy_kind_name(kind), steps, bench_now() - t0);
    teardown(&r);
}

static void bench_ps(int steps)
{
    char spec[64];
    if (!getenv("DTENSOR_CLUSTER") && !getenv("TF_CONFIG")) {
        snprintf(spec, sizeof spec, "chief=1,worker=%d,ps=1", dt_num_clients() - 2);
        setenv("DTENSOR_CLUSTER", spec, 1);
    }
    run r;
    setup(&r, DT_STRATEGY_PARAMETER_SERVER);
    dt_cluster cl;
    BENCH_CHECK(dt_strategy_cluster(r.s, &cl));
    dt_ps_coordinator *co;
    BENCH_CHECK(dt_ps_coordinator_create(r.s, one_step, &r, &co));
    double t0 = bench_now();
    if (cl.task_type == DT_TASK_CHIEF) {
        for (int t = 0; t < steps; t++) {
            dt_remote_value *v;
            BENCH_CHECK(dt_ps_schedule(co, t, &v));
            dt_remote_value_free(v);
        }
        BENCH_CHECK(dt_ps_join(co));
    }
    double secs = bench_now() - t0;
    BENCH_CHECK(dt_ps_coordinator_shutdown(co));
    if (cl.task_type == DT_TASK_CHIEF)
        printf("parameter_server,%d,%d,%d,%.4f,%.2f\n", dt_num_clients(),
               dt_num_local_devices(DT_DEVICE_CPU), steps, secs, steps / secs);
    teardown(&r);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "local";
    int steps = argc > 2 ? atoi(argv[2]) : 50;
    for (int e = 0; e < B; e++) {
        for (int j = 0; j < IN; j++)
            X[e][j] = (float)((e * 31 + j * 7) % 17) / 17.0f - 0.5f;
        Y[e][e % OUT] = 1;
    }
    BENCH_CHECK(dt_init(NULL));
    if (dt_client_id() == 0)
        printf("strategy,clients,devices_per_client,steps,seconds,steps_per_second\n");
    if (strcmp(mode, "local") == 0) {
        bench_sync(DT_STRATEGY_ONE_DEVICE, steps);
        bench_sync(DT_STRATEGY_MIRRORED, steps);
    } else if (strcmp(mode, "cluster") == 0 && dt_num_clients() >= 3) {
        bench_sync(DT_STRATEGY_MULTI_WORKER_MIRRORED, steps);
        bench_ps(steps);
    } else {
        fprintf(stderr, "usage: bench_train local|cluster [steps] (cluster needs -n >= 3)\n");
        dt_finalize();
        return 2;
    }
    BENCH_CHECK(dt_finalize());
    return 0;
}
