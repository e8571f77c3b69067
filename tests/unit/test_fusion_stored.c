/* Elementwise fusion of chains whose one fused step writes several results (spmd/fuse.c): Adam's
 * update written out (the new value and both moments, and a reader of a moment after the chain),
 * a chain's value stored beside its reduction, and the optimizers' traced updates (the value
 * and its slots); and chains on meshes of GPUs. Each runs eagerly, traced with fusion and
 * traced with DTENSOR_FUSION=0, and the three must be bitwise the same; the optimizers' updates
 * are also checked against the update computed here. */
#include <criterion/criterion.h>

#include "../../train/train.h"
#include "dt.h"
#include "fusion_chain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- chains with several results ------------------------------------------------------- */

/* Adam's update written out on w, g, m, v: m' = m * 0.9 + g * 0.1, v' = |v| * 0.99 + g^2 * 0.01,
 * w' = w + m' / (sqrt(v') + 1e-3) * -0.25; out[0..2] = w', m', v'. With `extra`, out[3] =
 * sum(m'), a reader outside the chain after it (m' is still stored by w's fused step). */
static dt_status moments(dt_tensor *const in[], bool extra, dt_tensor *out[])
{
    dt_dtype dt = dt_tensor_dtype(in[0]);
    dt_tensor *t[16] = {0};
    dt_status s = constant(dt, 0.9, &t[0]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[2], t[0], NULL, &t[1]);
    if (s == DT_OK)
        s = constant(dt, 0.1, &t[2]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, in[1], t[2], NULL, &t[3]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[1], t[3], NULL, &out[1]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_ABS, in[3], NULL, &t[4]);
    if (s == DT_OK)
        s = constant(dt, 0.99, &t[5]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[4], t[5], NULL, &t[6]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, in[1], NULL, &t[7]);
    if (s == DT_OK)
        s = constant(dt, 0.01, &t[8]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[7], t[8], NULL, &t[9]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[6], t[9], NULL, &out[2]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQRT, out[2], NULL, &t[10]);
    if (s == DT_OK)
        s = constant(dt, 1e-3, &t[11]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[10], t[11], NULL, &t[12]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_DIV, out[1], t[12], NULL, &t[13]);
    if (s == DT_OK)
        s = constant(dt, -0.25, &t[14]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, t[13], t[14], NULL, &t[15]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, in[0], t[15], NULL, &out[0]);
    if (s == DT_OK && extra)
        s = dt_reduce(DT_REDUCE_SUM, out[1], 0, NULL, 0, NULL, &out[3]);
    for (int i = 0; i < 16; i++)
        dt_tensor_free(t[i]);
    return s;
}

/* moments() on [5, 6, 20] tensors in layout `l`: traced with fusion, traced with
 * DTENSOR_FUSION=0 and eager give bitwise the same results; fused, the chain is one kernel
 * step writing m' and v' beside w' (with `extra`, then the sum of m' read from where the
 * fused step stored it), the unfused program has no fused step. */
static void check_moments(dt_dtype dt, const char *l, bool extra)
{
    int nout = extra ? 4 : 3;
    chain c = {"moments",        NULL,         4,
               {dt, dt, dt, dt}, {3, 3, 3, 3}, {{5, 6, 20}, {5, 6, 20}, {5, 6, 20}, {5, 6, 20}},
               {l, l, l, l}};
    dt_tensor *in[4], *res[3][4] = {{0}};
    for (int i = 0; i < 4; i++)
        in[i] = input(&c, i);
    cr_assert_eq(moments(in, extra, res[0]), DT_OK, "%s", dt_last_error());
    char *text[2] = {0};
    for (int k = 0; k < 2; k++) {
        bool fuse = k == 0;
        if (!fuse)
            setenv("DTENSOR_FUSION", "0", 1);
        dt_function *f = NULL;
        dt_tensor *x[4] = {0}, *y[4] = {0};
        cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
        dt_layout lx = L(l);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(dt_function_input(f, &lx, dt, 3, c.shape[i], &x[i]), DT_OK, "%s",
                         dt_last_error());
        cr_assert_eq(moments(x, extra, y), DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_function_end(f, nout, y), DT_OK, "%s", dt_last_error());
        unsetenv("DTENSOR_FUSION");
        for (int i = 0; i < 4; i++) {
            dt_tensor_free(x[i]);
            dt_tensor_free(y[i]);
        }
        text[k] = program_text(f);
        cr_assert_eq(dt_function_run(f, 4, (const dt_tensor *const *)in, nout, res[1 + k]), DT_OK,
                     "%s", dt_last_error());
        dt_function_free(f);
    }
    int steps = 0;
    for (const char *at = text[0]; (at = strstr(at, "kernel     ")) != NULL; at++)
        steps++;
    cr_expect_eq(steps, extra ? 2 : 1, "%s %s%s: %d kernel steps, expected %d:\n%s",
                 dt_dtype_name(dt), l, extra ? " (extra)" : "", steps, extra ? 2 : 1, text[0]);
    cr_expect(strstr(text[0], extra ? " -> x4; " : " -> x4; t") != NULL, "%s %s:\n%s",
              dt_dtype_name(dt), l, text[0]);
    cr_expect(strstr(text[1], "fused") == NULL, "DTENSOR_FUSION=0 fused:\n%s", text[1]);
    for (int o = 0; o < nout; o++) {
        size_t b[3];
        void *h[3];
        for (int k = 0; k < 3; k++)
            h[k] = read_all(res[k][o], &b[k]);
        cr_assert(b[1] == b[0] && b[2] == b[0]);
        cr_expect(memcmp(h[1], h[0], b[0]) == 0, "%s %s: result %d fused differs from eager:\n%s",
                  dt_dtype_name(dt), l, o, text[0]);
        cr_expect(memcmp(h[2], h[0], b[0]) == 0, "%s %s: result %d unfused differs from eager",
                  dt_dtype_name(dt), l, o);
        for (int k = 0; k < 3; k++) {
            free(h[k]);
            dt_tensor_free(res[k][o]);
        }
    }
    for (int i = 0; i < 4; i++)
        dt_tensor_free(in[i]);
    free(text[0]);
    free(text[1]);
}

Test(fusion, stored_results)
{
    start(8, "x=2,y=4");
    const char *layouts[] = {"unsharded,unsharded,unsharded", "y,x,unsharded",
                             "unsharded,unsharded,x"};
    for (size_t d = 0; d < sizeof floats / sizeof *floats; d++)
        for (int l = 0; l < 3; l++)
            for (int e = 0; e < 2; e++)
                check_moments(floats[d], layouts[l], e);
    stop();
}

/* ---- a reduction's chain stored ---------------------------------------------------------- */

/* out[0] = square(x - y) (y a row), out[1] = its sum over the last axis: the chain's value is a
 * program output, so the fused step stores it beside the reduction. */
static dt_status stored_sum(dt_tensor *const in[], dt_tensor *out[])
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_SUB, in[0], in[1], NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, t, NULL, &out[0]);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, out[0], 1, (int[]){2}, true, NULL, &out[1]);
    dt_tensor_free(t);
    return s;
}

Test(fusion, stored_reduction)
{
    start(4, "x=2,y=2");
    const char *lx[] = {"unsharded,unsharded,unsharded", "x,y,unsharded", "x,unsharded,y"};
    const char *ly[] = {"unsharded", "unsharded", "y"};
    for (size_t d = 0; d < sizeof floats / sizeof *floats; d++)
        for (int l = 0; l < 3; l++) {
            dt_dtype dt = floats[d];
            chain c = {"stored_sum", NULL, 2, {dt, dt}, {3, 1}, {{5, 6, 20}, {20}}, {lx[l], ly[l]}};
            dt_tensor *in[2] = {input(&c, 0), input(&c, 1)}, *res[3][2] = {{0}};
            cr_assert_eq(stored_sum(in, res[0]), DT_OK, "%s", dt_last_error());
            char *text[2] = {0};
            for (int k = 0; k < 2; k++) {
                if (k)
                    setenv("DTENSOR_FUSION", "0", 1);
                dt_function *f = NULL;
                dt_tensor *x[2] = {0}, *y[2] = {0};
                cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
                for (int i = 0; i < 2; i++) {
                    dt_layout li = L(c.layout[i]);
                    cr_assert_eq(dt_function_input(f, &li, dt, c.rank[i], c.shape[i], &x[i]), DT_OK,
                                 "%s", dt_last_error());
                }
                cr_assert_eq(stored_sum(x, y), DT_OK, "%s", dt_last_error());
                cr_assert_eq(dt_function_end(f, 2, y), DT_OK, "%s", dt_last_error());
                unsetenv("DTENSOR_FUSION");
                for (int i = 0; i < 2; i++) {
                    dt_tensor_free(x[i]);
                    dt_tensor_free(y[i]);
                }
                text[k] = program_text(f);
                cr_assert_eq(dt_function_run(f, 2, (const dt_tensor *const *)in, 2, res[1 + k]),
                             DT_OK, "%s", dt_last_error());
                dt_function_free(f);
            }
            if (reduce_kernels(2) == 2)
                cr_expect(strstr(text[0], "3 kernels: t1 = square(sub(x0, x1[1,1,") != NULL &&
                              strstr(text[0], " -> x2; sum(t1) -> [") != NULL,
                          "%s %s:\n%s", dt_dtype_name(dt), lx[l], text[0]);
            for (int o = 0; o < 2; o++) {
                size_t b[3];
                void *h[3];
                for (int k = 0; k < 3; k++)
                    h[k] = read_all(res[k][o], &b[k]);
                cr_assert(b[1] == b[0] && b[2] == b[0]);
                cr_expect(memcmp(h[1], h[0], b[0]) == 0 && memcmp(h[2], h[0], b[0]) == 0,
                          "%s %s: result %d differs from eager:\n%s", dt_dtype_name(dt), lx[l], o,
                          text[0]);
                for (int k = 0; k < 3; k++) {
                    free(h[k]);
                    dt_tensor_free(res[k][o]);
                }
            }
            dt_tensor_free(in[0]);
            dt_tensor_free(in[1]);
            free(text[0]);
            free(text[1]);
        }
    stop();
}

/* Meshes of GPUs fuse: emulated ones (DTENSOR_EMULATE_CUDA) with the CPU's kernel table, real
 * ones with the CUDA backend's fused kernel. Either way eager, fused and unfused agree
 * bitwise. */
Test(fusion, gpus)
{
    /* two logical devices on one GPU, real or emulated */
    setenv("DTENSOR_EMULATE_CUDA", "1", 1);
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = 2};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    unsetenv("DTENSOR_EMULATE_CUDA");
    if (dt_num_local_devices(DT_DEVICE_CUDA) < 2) {
        cr_expect_eq(dt_finalize(), DT_OK);
        cr_skip_test("fewer than 2 GPUs (emulated or real) in this build");
    }
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CUDA, &mesh), DT_OK, "%s",
                 dt_last_error());
    bool emulated = strstr(dt__backend_of(DT_DEVICE_CUDA)->name, "emulated") != NULL;
    const dt_dtype types[] = {DT_DTYPE_F32, DT_DTYPE_BF16};
    for (int t = 0; t < 2; t++) {
        dt_dtype dt = types[t];
        chain cs[] = {{"bias_gelu",
                       bias_gelu,
                       2,
                       {dt, dt},
                       {3, 1},
                       {{5, 6, 20}, {20}},
                       {"x,unsharded,unsharded", "unsharded"}},
                      {"residual_scale",
                       residual_scale,
                       2,
                       {dt, dt},
                       {3, 3},
                       {{5, 6, 20}, {5, 6, 20}},
                       {"x,unsharded,unsharded", "x,unsharded,unsharded"}}};
        for (int c = 0; c < 2; c++) {
            char *text = NULL;
            free(check_chain(&cs[c], 2, &text));
            cr_expect(strstr(text, "fused") != NULL, "%s (%s GPUs):\n%s", cs[c].name,
                      emulated ? "emulated" : "real", text);
            free(text);
        }
        check_moments(dt, "x,unsharded,unsharded", false);
    }
    stop();
}

/* The optimizers with slots trace their update per variable (train/optimizer.c), which fusion
 * runs as one kernel writing the new value and the new slots: three steps on an unevenly
 * sharded f64 variable, fused and with DTENSOR_FUSION=0, each bitwise equal to the update
 * computed here in the same order (Adam(W); SGD with momentum, plain and Nesterov; RMSprop
 * with and without momentum). */
static void optimizer_steps(dt_optimizer_kind kind, double momentum, bool nesterov, bool fuse)
{
    enum { R = 5, C = 7, N = R * C, STEPS = 3 };
    const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-7, wd = 0.05, rho = 0.9;
    double w[N], m[N] = {0}, v[N] = {0}, g[STEPS][N];
    for (int i = 0; i < N; i++) {
        w[i] = 0.25 * (i % 9) - 1;
        for (int t = 0; t < STEPS; t++)
            g[t][i] = 0.125 * ((i * (t + 3)) % 11) - 0.6;
    }
    dt_layout l = L("x,y");
    dt_tensor *init = NULL;
    dt_variable *var = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){R, C}, w, sizeof w, &init),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_variable_create(init, &var), DT_OK, "%s", dt_last_error());
    dt_tensor_free(init);
    dt_optimizer_config oc = {.kind = kind,
                              .learning_rate = lr,
                              .weight_decay = kind == DT_OPTIMIZER_ADAMW ? wd : 0,
                              .momentum = momentum,
                              .nesterov = nesterov,
                              .epsilon = eps,
                              .rho = rho};
    dt_optimizer *o = NULL;
    cr_assert_eq(dt_optimizer_create(&oc, &o), DT_OK, "%s", dt_last_error());
    char what[64];
    snprintf(what, sizeof what, "%s momentum %g%s%s",
             kind == DT_OPTIMIZER_SGD       ? "sgd"
             : kind == DT_OPTIMIZER_RMSPROP ? "rmsprop"
             : kind == DT_OPTIMIZER_ADAMW   ? "adamw"
                                            : "adam",
             momentum, nesterov ? " nesterov" : "", fuse ? "" : " (unfused)");
    if (!fuse)
        setenv("DTENSOR_FUSION", "0", 1);
    for (int t = 0; t < STEPS; t++) {
        dt_tensor *gt = NULL;
        cr_assert_eq(
            dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){R, C}, g[t], sizeof g[t], &gt),
            DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_optimizer_apply(o, 1, &var, (const dt_tensor *const *)&gt), DT_OK, "%s",
                     dt_last_error());
        dt_tensor_free(gt);
        if (t == 0) { /* the traced update: one step, writing the slots beside the value */
            int ns =
                kind == DT_OPTIMIZER_SGD || (kind == DT_OPTIMIZER_RMSPROP && !momentum) ? 1 : 2;
            char *text = program_text(o->slots[0].update);
            int steps = 0;
            for (const char *at = text; (at = strstr(at, "kernel     ")) != NULL; at++)
                steps++;
            cr_expect(fuse ? steps == 1 : steps > 1 && !strstr(text, "fused"),
                      "%s: %d kernel steps:\n%s", what, steps, text);
            cr_expect(!fuse || (strstr(text, " -> x") &&
                                (ns == 1 || strstr(text, " -> x6; ") || strstr(text, " -> x5; "))),
                      "%s:\n%s", what, text);
            free(text);
        }
        double lr_t = lr * sqrt(1.0 - pow(b2, t + 1)) / (1.0 - pow(b1, t + 1));
        for (int i = 0; i < N; i++) {
            double gi = g[t][i];
            if (kind == DT_OPTIMIZER_SGD) {
                m[i] = m[i] * momentum + gi * -lr;
                double u = nesterov ? m[i] * momentum + gi * -lr : m[i];
                w[i] = w[i] * 1.0 + u * 1.0;
            } else if (kind == DT_OPTIMIZER_RMSPROP) {
                m[i] = m[i] * rho + (gi * gi) * (1.0 - rho);
                double d = gi / sqrt(m[i] + eps);
                if (momentum > 0) {
                    v[i] = v[i] * momentum + d * lr;
                    w[i] = w[i] * 1.0 + v[i] * -1.0;
                } else {
                    w[i] = w[i] * 1.0 + d * -lr;
                }
            } else {
                double x = kind == DT_OPTIMIZER_ADAMW ? w[i] * (1.0 - lr * wd) : w[i];
                m[i] = m[i] * b1 + gi * (1.0 - b1);
                v[i] = v[i] * b2 + (gi * gi) * (1.0 - b2);
                double u = m[i] / (sqrt(v[i]) + eps);
                w[i] = x + u * -lr_t;
            }
        }
    }
    unsetenv("DTENSOR_FUSION");
    double got[N];
    cr_assert_eq(dt_tensor_read(dt_variable_value(var), got, sizeof got), DT_OK, "%s",
                 dt_last_error());
    for (int i = 0; i < N; i++)
        cr_expect(memcmp(&got[i], &w[i], sizeof got[i]) == 0, "%s element %d: %.17g, want %.17g",
                  what, i, got[i], w[i]);
    dt_optimizer_free(o);
    dt_variable_free(var);
}

Test(fusion, optimizers)
{
    start(4, "x=2,y=2");
    for (int f = 0; f < 2; f++) {
        optimizer_steps(DT_OPTIMIZER_ADAM, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_ADAMW, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_SGD, 0.9, false, f);
        optimizer_steps(DT_OPTIMIZER_SGD, 0.9, true, f);
        optimizer_steps(DT_OPTIMIZER_RMSPROP, 0, false, f);
        optimizer_steps(DT_OPTIMIZER_RMSPROP, 0.5, false, f);
    }
    stop();
}