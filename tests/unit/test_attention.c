/* dt_attention (spmd/ops/attention.c) against a host reference in double written from the
 * definition (scores, softmax, weighted values; the gradient by the chain rule through the
 * softmax): causal or not, default and given scale, sequences shorter and longer than the
 * kernel's blocks and not a multiple of them, f32, f64 and bf16, on one device and on two with
 * the batch, the heads or the sequence split; and its memory: no [T, T] scores are held. */
#include "dt.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, H = 3, E = 8 };

static dt_mesh *setup(int devices)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    dt_mesh *m = NULL;
    char spec[16];
    snprintf(spec, sizeof spec, "x=%d", devices);
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "%s", dt_last_error());
    return m;
}

static void teardown(dt_mesh *m)
{
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* Inputs in [-1, 1) from a fixed sequence, exactly representable in bf16 (multiples of 1/64). */
static void fill(double *x, int64_t n, int salt)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (double)(((i * 37 + salt * 11) % 128) - 64) / 64.0;
}

/* y = softmax(scale q k^T) v per slice of [T, E]; with w, the gradients of sum(y w). */
static void reference(int64_t slices, int64_t T, bool causal, double scale, const double *q,
                      const double *k, const double *v, const double *w, double *y, double *dq,
                      double *dk, double *dv)
{
    double *p = malloc(sizeof(double) * (size_t)(T * T)),
           *dp = malloc(sizeof(double) * (size_t)(T * T));
    cr_assert(p && dp);
    for (int64_t b = 0; b < slices; b++) {
        const double *Q = q + b * T * E, *K = k + b * T * E, *V = v + b * T * E, *W = w + b * T * E;
        for (int64_t i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < T; j++) {
                double s = 0;
                for (int e = 0; e < E; e++)
                    s += Q[i * E + e] * K[j * E + e];
                p[i * T + j] = causal && j > i ? -INFINITY : scale * s;
                mx = fmax(mx, p[i * T + j]);
            }
            for (int64_t j = 0; j < T; j++)
                sum += p[i * T + j] = exp(p[i * T + j] - mx);
            for (int64_t j = 0; j < T; j++)
                p[i * T + j] /= sum;
            for (int e = 0; e < E; e++) {
                double acc = 0;
                for (int64_t j = 0; j < T; j++)
                    acc += p[i * T + j] * V[j * E + e];
                y[b * T * E + i * E + e] = acc;
            }
        }
        if (!dq)
            continue;
        /* dP = W V^T, dS = P (dP - rowsum(dP P)), dq = scale dS K, dk = scale dS^T Q, dv = P^T W */
        for (int64_t i = 0; i < T; i++) {
            double rs = 0;
            for (int64_t j = 0; j < T; j++) {
                double s = 0;
                for (int e = 0; e < E; e++)
                    s += W[i * E + e] * V[j * E + e];
                dp[i * T + j] = s;
                rs += s * p[i * T + j];
            }
            for (int64_t j = 0; j < T; j++)
                dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - rs);
        }
        for (int64_t i = 0; i < T; i++)
            for (int e = 0; e < E; e++) {
                double a = 0, c = 0, d = 0;
                for (int64_t j = 0; j < T; j++) {
                    a += dp[i * T + j] * K[j * E + e];
                    c += dp[j * T + i] * Q[j * E + e];
                    d += p[j * T + i] * W[j * E + e];
                }
                dq[b * T * E + i * E + e] = scale * a;
                dk[b * T * E + i * E + e] = scale * c;
                dv[b * T * E + i * E + e] = d;
            }
    }
    free(p);
    free(dp);
}

static dt_tensor *tensor(const dt_layout *l, dt_dtype dt, const int64_t shape[], const double *x,
                         int64_t n)
{
    size_t es = dt_dtype_size(dt);
    void *h = malloc((size_t)n * es);
    cr_assert(h);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DT_DTYPE_F64)
            ((double *)h)[i] = x[i];
        else if (dt == DT_DTYPE_F32)
            ((float *)h)[i] = (float)x[i];
        else
            ((uint16_t *)h)[i] = dt_f64_to_bf16(x[i]);
    }
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(l, dt, 4, shape, h, (size_t)n * es, &t), DT_OK, "%s",
                 dt_last_error());
    free(h);
    return t;
}

/* The largest relative difference (against max(1, |ref|)) of t from ref. */
static double worst(const dt_tensor *t, const double *ref, int64_t n)
{
    dt_dtype dt = dt_tensor_dtype(t);
    size_t es = dt_dtype_size(dt);
    void *h = malloc((size_t)n * es);
    cr_assert(h);
    cr_assert_eq(dt_tensor_read(t, h, (size_t)n * es), DT_OK, "%s", dt_last_error());
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = dt == DT_DTYPE_F64   ? ((double *)h)[i]
                   : dt == DT_DTYPE_F32 ? ((float *)h)[i]
                                        : dt_bf16_to_f32(((uint16_t *)h)[i]);
        double d = fabs(g - ref[i]) / fmax(1.0, fabs(ref[i]));
        w = isnan(d) ? INFINITY : fmax(w, d);
    }
    free(h);
    return w;
}

/* Forward and gradient of one case on mesh m with q, k, v (and the weights) in layout `spec`. */
static void check(const dt_mesh *m, const char *spec, dt_dtype dt, int64_t T, bool causal,
                  double scale)
{
    int64_t shape[4] = {B, H, T, E}, n = B * H * T * E;
    double *q = malloc(sizeof(double) * (size_t)n * 9);
    cr_assert(q);
    double *k = q + n, *v = k + n, *w = v + n, *y = w + n, *dq = y + n, *dk = dq + n, *dv = dk + n;
    fill(q, n, 1);
    fill(k, n, 2);
    fill(v, n, 3);
    fill(w, n, 4);
    double s = scale > 0 ? scale : 1.0 / sqrt((double)E);
    reference(B * H, T, causal, s, q, k, v, w, y, dq, dk, dv);
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, spec, &l), DT_OK, "%s", dt_last_error());
    dt_tensor *tq = tensor(&l, dt, shape, q, n), *tk = tensor(&l, dt, shape, k, n),
              *tv = tensor(&l, dt, shape, v, n), *tw = tensor(&l, dt, shape, w, n), *ty = NULL;
    double tol = dt == DT_DTYPE_F64 ? 1e-12 : dt == DT_DTYPE_F32 ? 2e-5 : 3e-2;
    cr_assert_eq(dt_attention(tq, tk, tv, causal, scale, NULL, &ty), DT_OK, "%s", dt_last_error());
    double fw = worst(ty, y, n);
    cr_expect(fw <= tol, "%s %s T %lld causal %d scale %g: forward off by %g (tolerance %g)",
              dt_dtype_name(dt), spec, (long long)T, causal, scale, fw, tol);
    /* the gradient of sum(attention(q, k, v) w) by the library's autodiff */
    dt_function *f = NULL, *g = NULL;
    dt_tensor *in[4], *o = NULL, *res[4] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(dt_function_input(f, &l, dt, 4, shape, &in[i]), DT_OK, "%s", dt_last_error());
    dt_tensor *a = NULL, *pr = NULL;
    cr_assert_eq(dt_attention(in[0], in[1], in[2], causal, scale, NULL, &a), DT_OK, "%s",
                 dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, a, in[3], NULL, &pr), DT_OK);
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, pr, 0, NULL, 0, NULL, &o), DT_OK);
    cr_assert_eq(dt_function_end(f, 1, &o), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_gradient(f, 0, 3, (int[]){0, 1, 2}, &g), DT_OK, "%s", dt_last_error());
    const dt_tensor *args[4] = {tq, tk, tv, tw};
    cr_assert_eq(dt_function_run(g, 4, args, 4, res), DT_OK, "%s", dt_last_error());
    const double *refs[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        cr_expect(dt_layout_equal(dt_tensor_layout(res[i + 1]), &l),
                  "d%c not in its input's layout", "qkv"[i]);
        double gw = worst(res[i + 1], refs[i], n);
        cr_expect(gw <= tol, "%s %s T %lld causal %d: d%c off by %g (tolerance %g)",
                  dt_dtype_name(dt), spec, (long long)T, causal, "qkv"[i], gw, tol);
    }
    for (int i = 0; i < 4; i++) {
        dt_tensor_free(in[i]);
        dt_tensor_free(res[i]);
    }
    dt_tensor_free(a);
    dt_tensor_free(pr);
    dt_tensor_free(o);
    dt_function_free(f);
    dt_function_free(g);
    dt_tensor_free(tq);
    dt_tensor_free(tk);
    dt_tensor_free(tv);
    dt_tensor_free(tw);
    dt_tensor_free(ty);
    free(q);
}

Test(attention, one_device)
{
    dt_mesh *m = setup(1);
    const int64_t ts[] = {1, 5, 64, 70, 130};
    for (int t = 0; t < 5; t++)
        for (int causal = 0; causal < 2; causal++) {
            check(m, "unsharded,unsharded,unsharded,unsharded", DT_DTYPE_F32, ts[t], causal, 0);
            check(m, "unsharded,unsharded,unsharded,unsharded", DT_DTYPE_F64, ts[t], causal, 0.3);
        }
    check(m, "unsharded,unsharded,unsharded,unsharded", DT_DTYPE_BF16, 70, 1, 0);
    teardown(m);
}

/* Split batch or heads: local slices; split sequence: gathered first, the gradients laid out
 * back as their operands. */
Test(attention, two_devices)
{
    dt_mesh *m = setup(2);
    const char *specs[] = {"x,unsharded,unsharded,unsharded", "unsharded,x,unsharded,unsharded",
                           "unsharded,unsharded,x,unsharded"};
    for (int i = 0; i < 3; i++)
        for (int causal = 0; causal < 2; causal++)
            check(m, specs[i], DT_DTYPE_F32, 70, causal, 0);
    check(m, specs[1], DT_DTYPE_BF16, 33, 1, 0);
    teardown(m);
}

/* T = 2048, E = 8: the scores of one slice would take 16 MiB in f32; the forward pass adds its
 * result (64 KiB) and block scratch on the stack only. */
Test(attention, memory_grows_with_t)
{
    dt_mesh *m = setup(1);
    int64_t T = 2048, shape[4] = {1, 1, T, E}, n = T * E;
    double *x = malloc(sizeof(double) * (size_t)n);
    cr_assert(x);
    fill(x, n, 5);
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(m, 4, &l), DT_OK);
    dt_tensor *q = tensor(&l, DT_DTYPE_F32, shape, x, n), *y = NULL;
    size_t before = 0, peak = 0;
    cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, 0, &before, NULL), DT_OK);
    cr_assert_eq(dt_device_memory_reset_peak(DT_DEVICE_CPU, 0), DT_OK);
    cr_assert_eq(dt_attention(q, q, q, 1, 0, NULL, &y), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, 0, NULL, &peak), DT_OK);
    size_t out = (size_t)n * sizeof(float);
    cr_expect(peak - before <= out, "attention held %zu bytes above its operands, its result %zu",
              peak - before, out);
    dt_tensor_free(q);
    dt_tensor_free(y);
    free(x);
    teardown(m);
}
