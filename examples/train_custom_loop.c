/* The custom training loop of the tf.distribute guide, under a strategy chosen on the command
 * line: a Dense(1) model trained on ones (features and labels), mean squared error, SGD,
 * the loss printed every step.
 *
 *   train_custom_loop [default|one_device|mirrored|multi_worker_mirrored|central_storage]
 *   DTENSOR_CPU_DEVICES=4 ./train_custom_loop mirrored
 *   mpiexec.mpich -n 2 ./train_custom_loop multi_worker_mirrored
 */
#include <dtensor.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                              \
    do {                                                      \
        dt_status s_ = (x);                                   \
        if (s_ != DT_OK) {                                    \
            fprintf(stderr, "%s: %s\n", #x, dt_last_error()); \
            exit(1);                                          \
        }                                                     \
    } while (0)

enum { GLOBAL_BATCH = 8, FEATURES = 1, STEPS = 10 };

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "mirrored";
    dt_strategy_kind kind = DT_STRATEGY_COUNT;
    for (int k = 0; k < DT_STRATEGY_PARAMETER_SERVER; k++)
        if (strcmp(name, dt_strategy_kind_name((dt_strategy_kind)k)) == 0)
            kind = (dt_strategy_kind)k;
    if (kind == DT_STRATEGY_COUNT) {
        fprintf(stderr, "unknown strategy %s (parameter_server: see train_mlp)\n", name);
        return 2;
    }
    CHECK(dt_init(NULL));
    dt_strategy *strategy;
    CHECK(dt_strategy_create(kind, NULL, &strategy));
    if (dt_client_id() == 0)
        printf("strategy %s, replicas in sync %d\n", name,
               dt_strategy_num_replicas_in_sync(strategy));

    /* with strategy.scope(): model = Sequential([Dense(1)]), optimizer = SGD(0.1) */
    CHECK(dt_strategy_scope_enter(strategy));
    dt_dense_config dense = {.units = 1}; /* glorot-uniform kernel, zero bias */
    dt_model *model;
    CHECK(dt_model_create(FEATURES, 1, &dense, DT_DTYPE_F32, 42, &model));
    CHECK(dt_strategy_scope_exit(strategy));
    dt_optimizer *opt;
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1};
    CHECK(dt_optimizer_create(&oc, &opt));

    /* dataset = from_tensors(([1.], [1.])).repeat(100).batch(GLOBAL_BATCH), distributed */
    float ones[GLOBAL_BATCH * FEATURES];
    for (int i = 0; i < GLOBAL_BATCH * FEATURES; i++)
        ones[i] = 1.0f;
    int64_t shape[2] = {GLOBAL_BATCH, FEATURES};
    dt_tensor *x, *y;
    CHECK(dt_strategy_distribute_batch(strategy, DT_DTYPE_F32, 2, shape, ones, sizeof ones, &x));
    CHECK(dt_strategy_distribute_batch(strategy, DT_DTYPE_F32, 2, shape, ones, sizeof ones, &y));
    for (int step = 0; step < STEPS; step++) {
        double loss;
        CHECK(dt_model_train_step(strategy, model, DT_LOSS_MEAN_SQUARED_ERROR, opt, x, y, &loss));
        if (dt_client_id() == 0)
            printf("step %d loss %.6f\n", step, loss);
    }
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_optimizer_free(opt);
    dt_model_free(model);
    dt_strategy_free(strategy);
    CHECK(dt_finalize());
    return 0;
}
