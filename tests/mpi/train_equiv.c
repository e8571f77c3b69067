/* The same model, seed and global batches trained 50 steps under one-device, mirrored,
 * multi-worker mirrored and central storage: the loss of every step must match an
 * independent host implementation (hand-derived backpropagation in double, from the same
 * initial values) and the one-device run within 1e-5 relative. Run at -n 1 with 4 devices,
 * -n 2 with 2 devices each and -n 4 with 1. Also: Adam, AdamW and RMSprop (Keras's rule), AdamW's
 * and RMSprop's learning rate changed after LR_SWITCH steps as a schedule does, against the host,
 * errors for a model used under another strategy and a batch not in the strategy's layout; where
 * one-device and central-storage variables and optimizer slots live (device 0 only). */
#include "dt.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN = 4, HID = 8, OUT = 3, BMAX = 16, ROWS = 64, STEPS = 50 };
/* The global batch: 16, then 7, which does not divide by the replicas (uneven shards). */
static int B = BMAX;
#define L2 1e-3
#define LR 0.1
#define MOM 0.9

static double X[ROWS][IN], Y[ROWS][OUT];

static void make_data(void)
{
    unsigned s = 7;
    for (int r = 0; r < ROWS; r++) {
        int cls = r % OUT;
        for (int j = 0; j < IN; j++) {
            s = s * 1103515245u + 12345u;
            X[r][j] = (j == cls ? 1.5 : 0.0) + ((double)((s >> 8) & 0xffff) / 65536.0 - 0.5);
        }
        for (int k = 0; k < OUT; k++)
            Y[r][k] = k == cls;
    }
}

static const dt_dense_config layers[2] = {
    {.units = HID, .activation = DT_ACTIVATION_TANH, .l2 = L2},
    {.units = OUT},
};

/* ---- host reference ---------------------------------------------------------------------- */

typedef struct host_model {
    double W1[IN][HID], b1[HID], W2[HID][OUT], b2[OUT];
} host_model;

/* One step on rows [r0, r0 + B); returns the loss; g gets the gradients. */
static double host_grad(const host_model *m, int r0, host_model *g)
{
    memset(g, 0, sizeof *g);
    double loss = 0;
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < HID; j++)
            loss += L2 * m->W1[i][j] * m->W1[i][j];
    for (int e = 0; e < B; e++) {
        const double *x = X[(r0 + e) % ROWS], *y = Y[(r0 + e) % ROWS];
        double h[HID], z[OUT], mx = -1e300, sum = 0, dz[OUT], dh[HID];
        for (int j = 0; j < HID; j++) {
            double a = m->b1[j];
            for (int i = 0; i < IN; i++)
                a += x[i] * m->W1[i][j];
            h[j] = tanh(a);
        }
        for (int k = 0; k < OUT; k++) {
            z[k] = m->b2[k];
            for (int j = 0; j < HID; j++)
                z[k] += h[j] * m->W2[j][k];
            mx = z[k] > mx ? z[k] : mx;
        }
        for (int k = 0; k < OUT; k++)
            sum += exp(z[k] - mx);
        for (int k = 0; k < OUT; k++) {
            double p = exp(z[k] - mx) / sum;
            loss += -y[k] * (z[k] - mx - log(sum)) / B;
            dz[k] = (p - y[k]) / B;
            g->b2[k] += dz[k];
            for (int j = 0; j < HID; j++)
                g->W2[j][k] += h[j] * dz[k];
        }
        for (int j = 0; j < HID; j++) {
            dh[j] = 0;
            for (int k = 0; k < OUT; k++)
                dh[j] += dz[k] * m->W2[j][k];
            dh[j] *= 1 - h[j] * h[j];
            g->b1[j] += dh[j];
            for (int i = 0; i < IN; i++)
                g->W1[i][j] += x[i] * dh[j];
        }
    }
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < HID; j++)
            g->W1[i][j] += 2 * L2 * m->W1[i][j];
    return loss;
}

#define NPARAM ((int)(sizeof(host_model) / sizeof(double)))

/* opt: the optimizer kind (SGD with momentum, Adam, AdamW with weight decay WD, or RMSprop;
 * AdamW's and RMSprop's learning rate becomes LR2 from step LR_SWITCH) */
#define WD 0.05
#define LR_SWITCH 5
#define LR2 0.004

static void host_train(host_model m, dt_optimizer_kind opt, int steps, double *losses)
{
    double v[NPARAM] = {0}, mo[NPARAM] = {0};
    for (int t = 0; t < steps; t++) {
        host_model g;
        losses[t] = host_grad(&m, (t * B) % ROWS, &g);
        double *w = (double *)&m, *gg = (double *)&g;
        for (int p = 0; p < NPARAM; p++) {
            if (opt == DT_OPTIMIZER_SGD) {
                v[p] = MOM * v[p] - LR * gg[p];
                w[p] += v[p];
            } else if (opt == DT_OPTIMIZER_RMSPROP) {
                /* Keras: ms = rho ms + (1 - rho) g^2; w -= lr g / sqrt(ms + eps) */
                double lr = t < LR_SWITCH ? 0.01 : LR2;
                v[p] = 0.9 * v[p] + 0.1 * gg[p] * gg[p];
                w[p] -= lr * gg[p] / sqrt(v[p] + 1e-7);
            } else {
                double b1 = 0.9, b2 = 0.999, eps = 1e-7;
                double lr = opt == DT_OPTIMIZER_ADAMW && t >= LR_SWITCH ? LR2 : 0.01;
                if (opt == DT_OPTIMIZER_ADAMW)
                    w[p] -= lr * WD * w[p];
                mo[p] = b1 * mo[p] + (1 - b1) * gg[p];
                v[p] = b2 * v[p] + (1 - b2) * gg[p] * gg[p];
                double lr_t = lr * sqrt(1 - pow(b2, t + 1)) / (1 - pow(b1, t + 1));
                w[p] -= lr_t * mo[p] / (sqrt(v[p]) + eps);
            }
        }
    }
}

/* ---- dtensor runs -------------------------------------------------------------------------- */

/* The whole variable on every client (under one device and central storage the clients
 * other than client 0 hold no component of it). */
static bool read_var(dt_model *m, int i, double *dst, size_t bytes)
{
    return dt_tensor_read(dt_variable_value(dt_model_variable(m, i)), dst, bytes) == DT_OK;
}

/* Train under `kind`; losses per step; *init gets the initial variables. */
static bool train(dt_strategy_kind kind, dt_optimizer_kind opt, int steps, double *losses,
                  host_model *init, int *replicas)
{
    dt_strategy *s = NULL;
    dt_model *m = NULL;
    dt_optimizer *o = NULL;
    bool ok = dt_strategy_create(kind, NULL, &s) == DT_OK;
    ok = ok && dt_strategy_scope_enter(s) == DT_OK;
    ok = ok && dt_model_create(IN, 2, layers, DT_DTYPE_F64, 2024, &m) == DT_OK;
    if (s)
        dt_strategy_scope_exit(s);
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = LR, .momentum = MOM};
    if (opt != DT_OPTIMIZER_SGD)
        oc = (dt_optimizer_config){.kind = opt, .learning_rate = 0.01, .weight_decay = WD};
    ok = ok && dt_optimizer_create(&oc, &o) == DT_OK;
    if (ok && init) {
        ok = read_var(m, 0, &init->W1[0][0], sizeof init->W1) &&
             read_var(m, 1, init->b1, sizeof init->b1) &&
             read_var(m, 2, &init->W2[0][0], sizeof init->W2) &&
             read_var(m, 3, init->b2, sizeof init->b2);
    }
    if (ok)
        *replicas = dt_strategy_num_replicas_in_sync(s);
    for (int t = 0; ok && t < steps; t++) {
        if ((opt == DT_OPTIMIZER_RMSPROP || opt == DT_OPTIMIZER_ADAMW) && t == LR_SWITCH)
            ok = dt_optimizer_set_learning_rate(o, LR2) == DT_OK;
        double xb[BMAX][IN], yb[BMAX][OUT];
        for (int e = 0; e < B; e++) {
            memcpy(xb[e], X[(t * B + e) % ROWS], sizeof xb[e]);
            memcpy(yb[e], Y[(t * B + e) % ROWS], sizeof yb[e]);
        }
        dt_tensor *x = NULL, *y = NULL;
        ok = dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, xb,
                                          sizeof(double) * B * IN, &x) == DT_OK &&
             dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, OUT}, yb,
                                          sizeof(double) * B * OUT, &y) == DT_OK &&
             dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, o, x, y, &losses[t]) == DT_OK;
        dt_tensor_free(x);
        dt_tensor_free(y);
    }
    if (!ok)
        tap_diag("%s: %s", dt_strategy_kind_name(kind), dt_last_error());
    dt_optimizer_free(o);
    dt_model_free(m);
    dt_strategy_free(s);
    return ok;
}

/* Bytes in use on each local device (at most 16). */
static bool device_bytes(size_t bytes[16], int *n)
{
    *n = dt_num_local_devices(DT_DEVICE_CPU);
    for (int i = 0; i < *n && i < 16; i++) {
        size_t peak;
        if (dt_device_memory(DT_DEVICE_CPU, i, &bytes[i], &peak) != DT_OK)
            return false;
    }
    return *n <= 16;
}

/* Where a model's variables and the optimizer's slots sit: each device's bytes in use before
 * the model, after creating it and after two SGD-with-momentum steps (variables plus one
 * momentum slot each). want_all: every device holds a copy (mirrored), else global device 0
 * alone (local device 0 of client 0) and the others nothing once the step is over. */
static void check_placement(dt_strategy_kind kind, bool want_all)
{
    const size_t var_bytes = sizeof(double) * (IN * HID + HID + HID * OUT + OUT);
    size_t before[16], created[16], trained[16];
    int n = 0;
    dt_strategy *s = NULL;
    dt_model *m = NULL;
    dt_optimizer *o = NULL;
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = LR, .momentum = MOM};
    bool ok = dt_strategy_create(kind, NULL, &s) == DT_OK && device_bytes(before, &n) &&
              dt_optimizer_create(&oc, &o) == DT_OK && dt_strategy_scope_enter(s) == DT_OK;
    ok = ok && dt_model_create(IN, 2, layers, DT_DTYPE_F64, 3, &m) == DT_OK;
    if (s)
        dt_strategy_scope_exit(s);
    ok = ok && device_bytes(created, &n);
    for (int t = 0; ok && t < 2; t++) {
        dt_tensor *x = NULL, *y = NULL;
        ok = dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, X,
                                          sizeof(double) * B * IN, &x) == DT_OK &&
             dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, OUT}, Y,
                                          sizeof(double) * B * OUT, &y) == DT_OK &&
             dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, o, x, y, NULL) == DT_OK;
        dt_tensor_free(x);
        dt_tensor_free(y);
    }
    ok = ok && device_bytes(trained, &n);
    if (!ok)
        tap_diag("%s: %s", dt_strategy_kind_name(kind), dt_last_error());
    bool placed = ok;
    for (int i = 0; ok && i < n; i++) {
        bool holds = want_all || (dt_client_id() == 0 && i == 0);
        size_t dc = created[i] - before[i], dtr = trained[i] - before[i];
        if (dc != (holds ? var_bytes : 0) || dtr != (holds ? 2 * var_bytes : 0)) {
            placed = false;
            fprintf(stderr,
                    "client %d device %d: %zu bytes after creation, %zu after 2 steps; "
                    "expected %zu and %zu\n",
                    dt_client_id(), i, dc, dtr, holds ? var_bytes : 0, holds ? 2 * var_bytes : 0);
        }
    }
    tap_check(placed, "%s: variables (%zu bytes) and momentum slots on %s, nothing left elsewhere",
              dt_strategy_kind_name(kind), var_bytes,
              want_all ? "every device" : "global device 0 only");
    dt_optimizer_free(o);
    dt_model_free(m);
    dt_strategy_free(s);
}

/* Keras's input casting: an f32 model trained on f64 batches takes the same steps, bitwise, as
 * on the same batches rounded to f32 on the host; an i32 batch is still refused. */
static void check_input_cast(void)
{
    enum { N = 5 };
    static float x32[BMAX][IN], y32[BMAX][OUT];
    for (int e = 0; e < BMAX; e++) {
        for (int j = 0; j < IN; j++)
            x32[e][j] = (float)X[e][j];
        for (int k = 0; k < OUT; k++)
            y32[e][k] = (float)Y[e][k];
    }
    dt_strategy *s = NULL;
    dt_model *m[2] = {NULL, NULL};
    dt_optimizer *o[2] = {NULL, NULL};
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = LR};
    double loss[2][N] = {{0}};
    bool ok = dt_strategy_create(DT_STRATEGY_MULTI_WORKER_MIRRORED, NULL, &s) == DT_OK &&
              dt_strategy_scope_enter(s) == DT_OK;
    for (int k = 0; ok && k < 2; k++)
        ok = dt_model_create(IN, 2, layers, DT_DTYPE_F32, 5, &m[k]) == DT_OK &&
             dt_optimizer_create(&oc, &o[k]) == DT_OK;
    if (s)
        dt_strategy_scope_exit(s);
    for (int t = 0; ok && t < N; t++)
        for (int k = 0; ok && k < 2; k++) {
            dt_tensor *x = NULL, *y = NULL;
            if (k == 0)
                ok = dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){BMAX, IN}, x32,
                                                  sizeof x32, &x) == DT_OK &&
                     dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){BMAX, OUT}, y32,
                                                  sizeof y32, &y) == DT_OK;
            else
                ok = dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){BMAX, IN}, X,
                                                  sizeof(double) * BMAX * IN, &x) == DT_OK &&
                     dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){BMAX, OUT}, Y,
                                                  sizeof(double) * BMAX * OUT, &y) == DT_OK;
            ok = ok && dt_model_train_step(s, m[k], DT_LOSS_SOFTMAX_CROSS_ENTROPY, o[k], x, y,
                                           &loss[k][t]) == DT_OK;
            dt_tensor_free(x);
            dt_tensor_free(y);
        }
    if (!ok)
        tap_diag("input cast: %s", dt_last_error());
    tap_check(ok && memcmp(loss[0], loss[1], sizeof loss[0]) == 0,
              "an f32 model on f64 batches: the losses of f32 batches, bitwise (%.9g, %.9g)",
              loss[0][N - 1], loss[1][N - 1]);
    int32_t xi[BMAX][IN] = {{0}};
    dt_tensor *x = NULL, *y = NULL;
    ok = dt_strategy_distribute_batch(s, DT_DTYPE_I32, 2, (int64_t[]){BMAX, IN}, xi, sizeof xi,
                                      &x) == DT_OK &&
         dt_strategy_distribute_batch(s, DT_DTYPE_F32, 2, (int64_t[]){BMAX, OUT}, y32, sizeof y32,
                                      &y) == DT_OK;
    dt_status st =
        ok ? dt_model_train_step(s, m[0], DT_LOSS_SOFTMAX_CROSS_ENTROPY, o[0], x, y, NULL)
           : DT_ERR_ARG;
    tap_check(st == DT_ERR_SHAPE && strstr(dt_last_error(), "x i32"),
              "an integer batch is not cast: %s", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(y);
    for (int k = 0; k < 2; k++) {
        dt_optimizer_free(o[k]);
        dt_model_free(m[k]);
    }
    dt_strategy_free(s);
}

/* dt_strategy_variable_create: tf.Variable(1.) in each strategy's scope lands in the strategy's
 * variable layout, holding 1 on every device of it; without a scope, DT_ERR_STATE. */
static void check_variable_in_scope(dt_strategy_kind kind)
{
    const float one = 1.0f;
    dt_strategy *s = NULL;
    dt_variable *v = NULL;
    dt_layout want;
    bool ok = dt_strategy_create(kind, NULL, &s) == DT_OK && dt_strategy_scope_enter(s) == DT_OK;
    ok = ok &&
         dt_strategy_variable_create(NULL, DT_DTYPE_F32, 0, NULL, &one, sizeof one, &v) == DT_OK;
    if (s)
        dt_strategy_scope_exit(s);
    ok = ok && dt_strategy_variable_layout(s, 0, &want) == DT_OK &&
         dt_layout_equal(dt_variable_layout(v), &want);
    /* every local component of the variable holds 1 */
    const dt_tensor *t = ok ? dt_variable_value(v) : NULL;
    int n = t ? dt_mesh_num_local_devices(dt_tensor_mesh(t)) : 0;
    for (int i = 0; ok && i < n; i++) {
        float got = 0;
        ok = dt_tensor_unpack(t, i, &got, sizeof got) == DT_OK && got == 1.0f;
    }
    double read = 0;
    ok = ok && dt_strategy_read_scalar(s, t, &read) == DT_OK && read == 1.0;
    tap_check(ok,
              "%s: a variable made in its scope is in its variable layout, 1 on its %d "
              "local devices: %s",
              dt_strategy_kind_name(kind), n, ok ? "ok" : dt_last_error());
    dt_variable_free(v);
    dt_strategy_free(s);
}

static double max_rel(const double *a, const double *b, int n)
{
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double r = fabs(a[i] - b[i]) / fmax(fabs(b[i]), 1e-12);
        worst = r > worst ? r : worst;
    }
    return worst;
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    make_data();
    host_model init;
    double ref[STEPS], one[STEPS], got[STEPS];
    int rep = 0;
    bool ok = train(DT_STRATEGY_ONE_DEVICE, DT_OPTIMIZER_SGD, STEPS, one, &init, &rep);
    tap_check(ok && rep == 1, "one_device trains %d steps (replicas %d)", STEPS, rep);
    host_train(init, DT_OPTIMIZER_SGD, STEPS, ref);
    double r = max_rel(one, ref, STEPS);
    tap_check(ok && r <= 1e-5, "one_device losses match the host reference (max rel %.2e)", r);
    tap_check(ok && one[STEPS - 1] < 0.5 * one[0], "loss falls: %.4f -> %.4f", one[0],
              one[STEPS - 1]);
    const dt_strategy_kind kinds[] = {DT_STRATEGY_MIRRORED, DT_STRATEGY_MULTI_WORKER_MIRRORED,
                                      DT_STRATEGY_CENTRAL_STORAGE, DT_STRATEGY_DEFAULT};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        ok = train(kinds[k], DT_OPTIMIZER_SGD, STEPS, got, NULL, &rep);
        double a = max_rel(got, one, STEPS), b = max_rel(got, ref, STEPS);
        tap_check(ok && a <= 1e-5 && b <= 1e-5,
                  "%s (%d replicas): every step's loss within 1e-5 of one_device (max rel %.2e) "
                  "and the host (%.2e)",
                  dt_strategy_kind_name(kinds[k]), rep, a, b);
    }
    /* a global batch of 7: uneven shards over the replicas, the same losses as the host */
    B = 7;
    host_model init7;
    ok = train(DT_STRATEGY_ONE_DEVICE, DT_OPTIMIZER_SGD, 10, one, &init7, &rep);
    host_train(init7, DT_OPTIMIZER_SGD, 10, ref);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        ok = ok && train(kinds[k], DT_OPTIMIZER_SGD, 10, got, NULL, &rep);
        r = max_rel(got, ref, 10);
        tap_check(ok && r <= 1e-5,
                  "%s (%d replicas): a global batch of 7 (uneven shards) matches the host (max "
                  "rel %.2e)",
                  dt_strategy_kind_name(kinds[k]), rep, r);
    }
    B = BMAX;

    /* placement: one device and central storage keep state on global device 0 alone;
     * multi-worker mirrored on every device (so the check can tell them apart) */
    check_placement(DT_STRATEGY_ONE_DEVICE, false);
    check_placement(DT_STRATEGY_CENTRAL_STORAGE, false);
    check_placement(DT_STRATEGY_MULTI_WORKER_MIRRORED, true);

    /* Adam, AdamW and RMSprop, a few steps, mirrored against the host */
    static const char *const opt_names[] = {"sgd", "adam", "adamw", "rmsprop"};
    for (int k = DT_OPTIMIZER_ADAM; k <= DT_OPTIMIZER_RMSPROP; k++) {
        ok = train(DT_STRATEGY_MULTI_WORKER_MIRRORED, (dt_optimizer_kind)k, 10, got, &init, &rep);
        host_train(init, (dt_optimizer_kind)k, 10, ref);
        r = max_rel(got, ref, 10);
        tap_check(ok && r <= 1e-5, "%s under multi_worker_mirrored matches the host (max rel %.2e)",
                  opt_names[k], r);
    }

    /* bad rho and learning rates: DT_ERR_ARG naming the value */
    {
        dt_optimizer *o = NULL;
        dt_optimizer_config oc = {.kind = DT_OPTIMIZER_RMSPROP, .learning_rate = 0.01, .rho = 1.0};
        dt_status st = dt_optimizer_create(&oc, &o);
        tap_check(st == DT_ERR_ARG && !o && strstr(dt_last_error(), "rho 1"),
                  "rmsprop: rho 1 refused (%s)", dt_last_error());
        oc.rho = 0.9;
        st = dt_optimizer_create(&oc, &o);
        if (st == DT_OK)
            st = dt_optimizer_set_learning_rate(o, -1.0);
        tap_check(st == DT_ERR_ARG && strstr(dt_last_error(), "learning rate -1"),
                  "set_learning_rate: -1 refused (%s)", dt_last_error());
        dt_optimizer_free(o);
    }

    check_input_cast();
    const dt_strategy_kind placed[] = {DT_STRATEGY_MIRRORED, DT_STRATEGY_MULTI_WORKER_MIRRORED,
                                       DT_STRATEGY_CENTRAL_STORAGE, DT_STRATEGY_ONE_DEVICE,
                                       DT_STRATEGY_DEFAULT};
    for (size_t k = 0; k < sizeof placed / sizeof placed[0]; k++)
        check_variable_in_scope(placed[k]);
    {
        const float one = 1.0f;
        dt_variable *v = NULL;
        dt_status st =
            dt_strategy_variable_create(NULL, DT_DTYPE_F32, 0, NULL, &one, sizeof one, &v);
        tap_check(st == DT_ERR_STATE && !v && strstr(dt_last_error(), "none in scope"),
                  "no strategy in scope: %s", dt_last_error());
    }

    /* a model created outside the scope, used inside it: a clear error on every client */
    dt_strategy *s = NULL;
    dt_model *m = NULL;
    dt_optimizer *o = NULL;
    dt_tensor *x = NULL, *y = NULL;
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_SGD, .learning_rate = LR};
    ok = dt_strategy_create(DT_STRATEGY_MULTI_WORKER_MIRRORED, NULL, &s) == DT_OK &&
         dt_model_create(IN, 2, layers, DT_DTYPE_F64, 1, &m) == DT_OK &&
         dt_optimizer_create(&oc, &o) == DT_OK &&
         dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, X,
                                      sizeof(double) * B * IN, &x) == DT_OK &&
         dt_strategy_distribute_batch(s, DT_DTYPE_F64, 2, (int64_t[]){B, OUT}, Y,
                                      sizeof(double) * B * OUT, &y) == DT_OK;
    dt_status st =
        ok ? dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, o, x, y, NULL) : DT_ERR_ARG;
    tap_check(ok && st == DT_ERR_STATE &&
                  strstr(dt_last_error(), "created outside any strategy scope") &&
                  strstr(dt_last_error(), "dense_0/kernel"),
              "variable created outside the scope: %s", dt_last_error());
    dt_model_free(m);
    m = NULL;
    /* a batch not laid out by the strategy */
    dt_strategy_scope_enter(s);
    ok = dt_model_create(IN, 2, layers, DT_DTYPE_F64, 1, &m) == DT_OK;
    dt_strategy_scope_exit(s);
    dt_tensor *xr = NULL;
    dt_layout rl;
    ok = ok && dt_layout_replicated(dt_strategy_mesh(s), 2, &rl) == DT_OK &&
         dt_tensor_from_host(&rl, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, X, sizeof(double) * B * IN,
                             &xr) == DT_OK;
    bool sharded = dt_num_global_devices(DT_DEVICE_CPU) > 1;
    st = ok ? dt_model_train_step(s, m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, o, xr, y, NULL) : DT_ERR_ARG;
    tap_check(!sharded || (st == DT_ERR_LAYOUT && strstr(dt_last_error(), "distribute_batch")),
              "batch in the wrong layout: %s", sharded ? dt_last_error() : "(one device)");
    dt_tensor_free(xr);
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_optimizer_free(o);
    dt_model_free(m);
    dt_strategy_free(s);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
