/* Training on GPU devices gives the losses of the CPU run: a two-layer model (tanh, softmax
 * cross-entropy, L2, SGD with momentum) trained 50 steps under the mirrored strategy over 4
 * logical GPUs and over 4 CPU devices, from the same seed and batches; every step's loss
 * within 1e-5 relative. Skipped without a GPU. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>
#include <math.h>

enum { IN = 4, HID = 8, OUT = 3, B = 16, STEPS = 50, DEVICES = 4 };

static void run(dt_device_type type, double losses[STEPS])
{
    dt_strategy_options so = {.device_type = type};
    dt_strategy *s = NULL;
    cr_assert_eq(dt_strategy_create(DT_STRATEGY_MIRRORED, &so, &s), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_strategy_num_replicas_in_sync(s), DEVICES);
    cr_assert_eq(dt_strategy_scope_enter(s), DT_OK);
    const dt_dense_config layers[2] = {
        {.units = HID, .activation = DT_ACTIVATION_TANH, .l2 = 1e-3},
        {.units = OUT},
    };
    dt_model *m = NULL;
    cr_assert_eq(dt_model_create(IN, 2, layers, DT_DTYPE_F32, 42, &m), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_strategy_scope_exit(s), DT_OK);
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .momentum = 0.9};
    dt_optimizer *opt = NULL;
    cr_assert_eq(dt_optimizer_create(&oc, &opt), DT_OK);
    float x[B * IN], y[B * OUT];
    unsigned r = 7;
    for (int step = 0; step < STEPS; step++) {
        for (int e = 0; e < B; e++) {
            int cls = (step * B + e) % OUT;
            for (int j = 0; j < IN; j++) {
                r = r * 1103515245u + 12345u;
                x[e * IN + j] = (j == cls ? 1.5f : 0.0f) + (float)((r >> 8) & 0xffff) / 65536.0f;
            }
            for (int k = 0; k < OUT; k++)
                y[e * OUT + k] = k == cls;
        }
        dt_tensor *tx = NULL, *ty = NULL;
        cr_assert_eq(
            dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){B, IN}, x, sizeof x, &tx),
            DT_OK, "%s", dt_last_error());
        cr_assert_eq(
            dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){B, OUT}, y, sizeof y, &ty),
            DT_OK);
        cr_assert_eq(
            dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, opt, tx, ty, &losses[step]),
            DT_OK, "%s", dt_last_error());
        dt_tensor_free(tx);
        dt_tensor_free(ty);
    }
    dt_optimizer_free(opt);
    dt_model_free(m);
    dt_strategy_free(s);
}

Test(cuda_train, mirrored_on_4_logical_gpus_gives_the_cpu_losses, .timeout = 300)
{
    int gpus = ref_cuda_devices(0, 1);
    if (gpus == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    dt_init_options o = {.cpu_devices = DEVICES, .cuda_logical_devices = DEVICES};
    if (gpus > 1)
        cr_skip_test("%d GPUs: this test wants 4 logical devices of one GPU", gpus);
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    double cpu[STEPS], gpu[STEPS];
    run(DT_DEVICE_CPU, cpu);
    run(DT_DEVICE_CUDA, gpu);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabs(gpu[i] - cpu[i]) <= 1e-5 * fmax(1.0, fabs(cpu[i])),
                  "step %d: loss %.9g on GPUs, %.9g on CPUs", i, gpu[i], cpu[i]);
    cr_expect(cpu[STEPS - 1] < cpu[0], "the loss falls: %g -> %g", cpu[0], cpu[STEPS - 1]);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}
