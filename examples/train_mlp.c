/* A two-layer MLP classifier on synthetic clustered data (4 features, 3 classes), trained
 * under the strategy named on the command line; prints its loss curve. Each batch gets noise
 * from a random generator (data augmentation).
 *
 *   DTENSOR_CPU_DEVICES=2 ./train_mlp mirrored
 *   mpiexec.mpich -n 2 ./train_mlp multi_worker_mirrored
 *   DTENSOR_CLUSTER=chief=1,worker=2,ps=1 mpiexec.mpich -n 4 ./train_mlp parameter_server
 *
 * Save and resume: with a checkpoint directory the run restores the latest checkpoint there
 * (model, optimizer, generator, step), saves every 25 steps (the newest 3 are kept), and
 * stops after step STOP when given; run it again to continue where it stopped, with the same
 * losses as a run that never stopped (any strategy but the parameter server):
 *
 *   mpiexec.mpich -n 2 ./train_mlp multi_worker_mirrored /tmp/mlp 50   # steps 0..49
 *   mpiexec.mpich -n 2 ./train_mlp multi_worker_mirrored /tmp/mlp      # steps 50..99
 *
 * Under the parameter server the chief schedules the steps; workers pull them and train
 * asynchronously; the curve is the loss each step reported, in step order. */
#include <dtensor.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        dt_status s_ = (x);                                                              \
        if (s_ != DT_OK) {                                                               \
            fprintf(stderr, "client %d: %s: %s\n", dt_client_id(), #x, dt_last_error()); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

enum { IN = 4, HID = 16, OUT = 3, B = 32, ROWS = 512, STEPS = 100 };

static float X[ROWS][IN], Y[ROWS][OUT];

static void make_data(void)
{
    unsigned s = 1;
    for (int r = 0; r < ROWS; r++) {
        int cls = r % OUT;
        for (int j = 0; j < IN; j++) {
            s = s * 1103515245u + 12345u;
            X[r][j] =
                (float)((j == cls ? 1.0 : 0.0) + ((double)((s >> 8) & 0xffff) / 65536.0 - 0.5));
        }
        for (int k = 0; k < OUT; k++)
            Y[r][k] = k == cls;
    }
}

typedef struct run {
    dt_strategy *s;
    dt_model *m;
    dt_optimizer *o;
    dt_generator *g; /* noise added to each batch */
} run;

static dt_status step(void *p, int64_t t, double *loss)
{
    run *r = p;
    float xb[B][IN], yb[B][OUT];
    for (int e = 0; e < B; e++) {
        memcpy(xb[e], X[(t * B + e) % ROWS], sizeof xb[e]);
        memcpy(yb[e], Y[(t * B + e) % ROWS], sizeof yb[e]);
    }
    dt_tensor *x = NULL, *y = NULL, *noise = NULL, *xn = NULL;
    dt_layout li;
    dt_status s = dt_strategy_input_layout(r->s, 2, &li);
    dt_op_options o = {.layout = &li};
    if (s == DT_OK)
        s = dt_strategy_distribute_batch(r->s, DT_DTYPE_F32, 2, (int64_t[]){B, IN}, xb, sizeof xb,
                                         &x);
    if (s == DT_OK)
        s = dt_strategy_distribute_batch(r->s, DT_DTYPE_F32, 2, (int64_t[]){B, OUT}, yb, sizeof yb,
                                         &y);
    if (s == DT_OK) /* the next draw of the generator: its counter is checkpointed */
        s = dt_generator_normal(r->g, DT_DTYPE_F32, 2, (int64_t[]){B, IN}, 0.0, 0.1, &o, &noise);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, x, noise, &o, &xn);
    if (s == DT_OK)
        s = dt_model_train_step(r->s, r->m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, r->o, xn, y, loss);
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_tensor_free(noise);
    dt_tensor_free(xn);
    return s;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "mirrored";
    const char *ckpt_dir = argc > 2 ? argv[2] : NULL;
    int64_t stop = argc > 3 ? atoll(argv[3]) : STEPS;
    dt_strategy_kind kind = DT_STRATEGY_COUNT;
    for (int k = 0; k < DT_STRATEGY_COUNT; k++)
        if (strcmp(name, dt_strategy_kind_name((dt_strategy_kind)k)) == 0)
            kind = (dt_strategy_kind)k;
    if (kind == DT_STRATEGY_COUNT) {
        fprintf(stderr, "unknown strategy %s\n", name);
        return 2;
    }
    make_data();
    CHECK(dt_init(NULL));
    run r = {0};
    CHECK(dt_strategy_create(kind, NULL, &r.s));
    const dt_dense_config layers[2] = {{.units = HID, .activation = DT_ACTIVATION_RELU},
                                       {.units = OUT}};
    CHECK(dt_strategy_scope_enter(r.s));
    CHECK(dt_model_create(IN, 2, layers, DT_DTYPE_F32, 7, &r.m));
    CHECK(dt_strategy_scope_exit(r.s));
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_ADAM, .learning_rate = 0.01};
    CHECK(dt_optimizer_create(&oc, &r.o));
    CHECK(dt_generator_create(11, &r.g));
    bool print = dt_client_id() == 0;
    /* what a checkpoint holds: the model, the optimizer (slots, iterations), the generator
     * and the step; the manager keeps the newest 3 of DIR/ckpt-N.h5 */
    int64_t first = 0, next_step = 0;
    dt_checkpoint *ck = NULL;
    dt_checkpoint_manager *mgr = NULL;
    if (ckpt_dir) {
        CHECK(dt_checkpoint_create(&ck));
        CHECK(dt_checkpoint_add_model(ck, "model", r.m));
        CHECK(dt_checkpoint_add_optimizer(ck, "optimizer", r.o));
        CHECK(dt_checkpoint_add_generator(ck, "noise", r.g));
        CHECK(dt_checkpoint_add_counter(ck, "step", &next_step));
        CHECK(dt_checkpoint_manager_create(ck, ckpt_dir, 3, &mgr));
        const char *latest = dt_checkpoint_manager_latest(mgr);
        if (latest) {
            CHECK(dt_checkpoint_read(ck, latest));
            first = next_step;
            if (print)
                printf("restored %s: resuming at step %lld\n", latest, (long long)first);
        }
    }
    if (kind != DT_STRATEGY_PARAMETER_SERVER) {
        if (print)
            printf("strategy %s, %d replicas in sync\n", name,
                   dt_strategy_num_replicas_in_sync(r.s));
        for (int64_t t = first; t < STEPS && t < stop; t++) {
            double loss;
            CHECK(step(&r, t, &loss));
            if (print && (t % 10 == 0 || t == STEPS - 1))
                printf("step %3lld loss %.4f\n", (long long)t, loss);
            if (mgr && (t + 1) % 25 == 0) {
                const char *path;
                next_step = t + 1; /* where a restored run goes on */
                CHECK(dt_checkpoint_manager_save(mgr, next_step, &path));
                if (print)
                    printf("saved %s\n", path);
            }
        }
    } else {
        dt_cluster cl;
        CHECK(dt_strategy_cluster(r.s, &cl));
        bool chief = cl.task_type == DT_TASK_CHIEF;
        dt_ps_coordinator *co;
        CHECK(dt_ps_coordinator_create(r.s, step, &r, &co));
        if (chief) {
            printf("strategy %s, %d workers, %d ps\n", name, cl.num_tasks[DT_TASK_WORKER],
                   cl.num_tasks[DT_TASK_PS]);
            dt_remote_value *v[STEPS];
            for (int t = 0; t < STEPS; t++)
                CHECK(dt_ps_schedule(co, t, &v[t]));
            for (int t = 0; t < STEPS; t++) {
                double loss;
                int w;
                CHECK(dt_remote_value_fetch(v[t], &loss, &w, NULL));
                if (t % 10 == 0 || t == STEPS - 1)
                    printf("step %3d loss %.4f (worker %d)\n", t, loss, w);
                dt_remote_value_free(v[t]);
            }
            CHECK(dt_ps_join(co));
        }
        CHECK(dt_ps_coordinator_shutdown(co));
    }
    dt_checkpoint_manager_free(mgr);
    dt_checkpoint_free(ck);
    dt_generator_free(r.g);
    dt_optimizer_free(r.o);
    dt_model_free(r.m);
    dt_strategy_free(r.s);
    CHECK(dt_finalize());
    return 0;
}
