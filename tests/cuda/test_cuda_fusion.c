/* Elementwise fusion on GPU meshes: the fusion tests (tests/unit/test_fusion.c and
 * test_fusion_stored.c) with their meshes of 1, 4 and 8 logical GPUs. Each chain runs eagerly (the
 * CUDA backend's kernels one by one), traced and fused (its FUSED kernel,
 * backends/cuda/elementwise.cu) and traced unfused, and the three must agree bitwise; the
 * gradient's fused chains likewise, and the chains fused into their reductions. Then chains ending
 * in each reduction on one and two GPUs against the same on a CPU device and against values
 * computed here (cuda_fusion/reductions_against_the_cpu). Skipped, and said so, without a GPU. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>

#define FUSION_DEVICE DT_DEVICE_CUDA

/* `devices` logical GPUs over the GPUs there are (and one CPU device): the tests' meshes take
 * every CUDA device. */
static void fusion_init(int devices)
{
    int gpus = ref_cuda_devices(0, 1);
    if (gpus == 0)
        cr_skip_test("no CUDA device (a build without CUDA, or no GPU on this machine)");
    if (devices % gpus)
        cr_skip_test("%d GPUs do not make %d logical GPUs evenly", gpus, devices);
    dt_init_options o = {.cpu_devices = 1, .cuda_logical_devices = devices / gpus};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
}

#include "../unit/test_fusion.c"
#include "../unit/test_fusion_stored.c"

/* ---- chains ending in a reduction: GPU meshes against the CPU ------------------------------- */

/* t = (x - b) * x, x of [RA, RB, RN] and b a row [RN] on a grid of 1/64 in [-2, 2), reduced
 * (sum, mean, max, min; over the last axis, the first, the leading ones or all; kept or not) in
 * a traced function, on one and two logical GPUs (rows split unevenly, or the reduced columns
 * split and the partial sums combined) and on one CPU device. On every mesh the chain and its
 * reduction print as one fused step. The results against values computed here: max and min
 * bitwise (one of the chain's values, the same on every device), the stored t bitwise, sums and
 * means within tol max(1, |ref|) of the sum in double of the chain's values (rounded to bf16
 * for bf16, as the kernels round each op) and of the CPU's, tol 1e-5 for f32 and 1.6e-2 for
 * bf16 (the GPU's shared rows add in double, the CPU's in input order in f32). */
enum { RA = 5, RB = 6, RN = 40 };

typedef struct reduction {
    const char *name;
    dt_reduce_op op;
    int naxes, axes[3];
    bool keep, stored; /* stored: t is an output too, written beside the reduction */
} reduction;

static const reduction reductions[] = {
    {"sum over the last axis, kept", DT_REDUCE_SUM, 1, {2}, true, false},
    {"mean over the last axis", DT_REDUCE_MEAN, 1, {2}, false, false},
    {"max over the first axis, kept", DT_REDUCE_MAX, 1, {0}, true, false},
    {"min over the leading axes", DT_REDUCE_MIN, 2, {0, 1}, false, false},
    {"mean over the leading axes, kept", DT_REDUCE_MEAN, 2, {0, 1}, true, false},
    {"max over the last axis", DT_REDUCE_MAX, 1, {2}, false, false},
    {"sum over every axis", DT_REDUCE_SUM, 3, {0, 1, 2}, false, false},
    {"sum over the last axis, t stored beside", DT_REDUCE_SUM, 1, {2}, true, true},
};

/* A mesh x=n of this client's first n devices of a type. */
static dt_mesh *mesh_on(dt_device_type type, int n)
{
    const char *names[1] = {"x"};
    int ids[2] = {0, 1};
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_on_devices(1, names, (int[]){n}, type, n, ids, &m), DT_OK, "%s",
                 dt_last_error());
    return m;
}

static dt_layout layout_on(const dt_mesh *m, const char *text)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, text, &l), DT_OK, "%s: %s", text, dt_last_error());
    return l;
}

/* f32 rounded to bf16 (to nearest, ties to even), as the kernels round each op's result. */
static float to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Element i of a host copy of f32 or bf16 values. */
static double value_at(const void *h, dt_dtype dt, int64_t i)
{
    if (dt == DT_DTYPE_F32)
        return ((const float *)h)[i];
    uint32_t u = (uint32_t)((const uint16_t *)h)[i] << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The reduction of t traced on mesh m, x in layout lx and b in lb; its program text in *text.
 * Outputs: the reduction, then t when stored. */
static dt_function *trace_reduction(const dt_mesh *m, const reduction *r, dt_dtype dt,
                                    const char *lx, const char *lb, char **text)
{
    dt_layout l[2] = {layout_on(m, lx), layout_on(m, lb)};
    const int64_t sx[3] = {RA, RB, RN}, sb[1] = {RN};
    dt_function *f = NULL;
    dt_tensor *x = NULL, *b = NULL, *u = NULL, *out[2] = {0};
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &l[0], dt, 3, sx, &x), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_function_input(f, &l[1], dt, 1, sb, &b), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_SUB, x, b, NULL, &u), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_binary(DT_BINARY_MUL, u, x, NULL, &out[1]), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_reduce(r->op, out[1], r->naxes, r->axes, r->keep, NULL, &out[0]), DT_OK,
                 "%s: %s", r->name, dt_last_error());
    cr_assert_eq(dt_function_end(f, r->stored ? 2 : 1, out), DT_OK, "%s: %s", r->name,
                 dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(b);
    dt_tensor_free(u);
    dt_tensor_free(out[0]);
    dt_tensor_free(out[1]);
    *text = program_text(f);
    return f;
}

/* Whether a line of the printed program is a fused step of 3 kernels (sub, mul and the
 * reduction) whose chain ends in the reduction op (a mean: a sum scaled by the kernel). */
static bool fused_into(const char *text, dt_reduce_op op)
{
    char name[24];
    snprintf(name, sizeof name, "%s(",
             dt_reduce_op_name(op == DT_REDUCE_MEAN ? DT_REDUCE_SUM : op));
    for (const char *at = text; (at = strstr(at, "3 kernels: ")) != NULL; at++) {
        const char *line = at, *end = strchr(at, '\n'), *n = strstr(at, name);
        while (line > text && line[-1] != '\n')
            line--;
        const char *f = strstr(line, " fused ");
        if (n && (!end || n < end) && f && f < at)
            return true;
    }
    return false;
}

/* The inputs on mesh m: x and b (host values xs, bs) in layouts lx, lb, of dtype dt. */
static void inputs_on(const dt_mesh *m, dt_dtype dt, const char *lx, const char *lb,
                      const double *xs, const double *bs, dt_tensor *in[2])
{
    const char *ls[2] = {lx, lb};
    const double *hs[2] = {xs, bs};
    const int64_t shapes[2][3] = {{RA, RB, RN}, {RN}};
    const int ranks[2] = {3, 1};
    const int64_t counts[2] = {RA * RB * RN, RN};
    for (int i = 0; i < 2; i++) {
        dt_layout l = layout_on(m, ls[i]);
        dt_tensor *t = NULL;
        cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, ranks[i], shapes[i], hs[i],
                                         (size_t)counts[i] * sizeof(double), &t),
                     DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_cast(t, dt, NULL, &in[i]), DT_OK, "%s", dt_last_error());
        dt_tensor_free(t);
    }
}

/* The reduction's result and t (when stored) on mesh m, in host copies (free them). */
static void run_on(const dt_mesh *m, const reduction *r, dt_dtype dt, const char *lx,
                   const char *lb, const double *xs, const double *bs, void *res[2],
                   size_t bytes[2])
{
    char *text = NULL;
    dt_function *f = trace_reduction(m, r, dt, lx, lb, &text);
    cr_expect(fused_into(text, r->op),
              "%s %s, x %s: the chain and its %s are not one fused step:\n%s", r->name,
              dt_dtype_name(dt), lx, dt_reduce_op_name(r->op), text);
    dt_tensor *in[2] = {0}, *out[2] = {0};
    inputs_on(m, dt, lx, lb, xs, bs, in);
    int nout = r->stored ? 2 : 1;
    cr_assert_eq(dt_function_run(f, 2, (const dt_tensor *const *)in, nout, out), DT_OK, "%s: %s",
                 r->name, dt_last_error());
    res[1] = NULL;
    for (int o = 0; o < nout; o++) {
        res[o] = read_all(out[o], &bytes[o]);
        dt_tensor_free(out[o]);
    }
    dt_tensor_free(in[0]);
    dt_tensor_free(in[1]);
    dt_function_free(f);
    free(text);
}

/* The reference: t computed here (each op rounded as the dtype rounds it), reduced in double
 * into ref (of the outputs' count, returned). */
static int64_t reference(const reduction *r, dt_dtype dt, const double *xs, const double *bs,
                         double *t, double *ref)
{
    const int64_t shape[3] = {RA, RB, RN};
    unsigned mask = 0;
    for (int a = 0; a < r->naxes; a++)
        mask |= 1u << r->axes[a];
    int64_t nout = 1, count = 1;
    for (int a = 0; a < 3; a++) {
        nout *= mask & (1u << a) ? 1 : shape[a];
        count *= mask & (1u << a) ? shape[a] : 1;
    }
    for (int64_t o = 0; o < nout; o++)
        ref[o] = r->op == DT_REDUCE_MAX ? -INFINITY : r->op == DT_REDUCE_MIN ? INFINITY : 0;
    for (int64_t i = 0; i < RA * RB * RN; i++) {
        int64_t idx[3] = {i / (RB * RN), i / RN % RB, i % RN}, o = 0;
        float u = (float)(xs[i] - bs[idx[2]]), p = u * (float)xs[i]; /* both exact in f32 */
        t[i] = dt == DT_DTYPE_BF16 ? to_bf16(p) : p;
        for (int a = 0; a < 3; a++)
            o = o * (mask & (1u << a) ? 1 : shape[a]) + (mask & (1u << a) ? 0 : idx[a]);
        ref[o] = r->op == DT_REDUCE_MAX   ? fmax(ref[o], t[i])
                 : r->op == DT_REDUCE_MIN ? fmin(ref[o], t[i])
                                          : ref[o] + t[i];
    }
    for (int64_t o = 0; o < nout && r->op == DT_REDUCE_MEAN; o++)
        ref[o] /= (double)count;
    return nout;
}

static void check_reduction(const reduction *r, dt_dtype dt, dt_mesh *cpu, dt_mesh *const gpus[],
                            const char *const lx[], const char *const lb[], int nlayouts)
{
    double xs[RA * RB * RN], bs[RN], t[RA * RB * RN], ref[RA * RB * RN];
    unsigned seed = 2026u;
    for (int64_t i = 0; i < RA * RB * RN + RN; i++) {
        seed = seed * 1103515245u + 12345u;
        double v = ((int)((seed >> 16) & 255) - 128) / 64.0;
        if (i < RA * RB * RN)
            xs[i] = v;
        else
            bs[i - RA * RB * RN] = v;
    }
    int64_t nout = reference(r, dt, xs, bs, t, ref);
    double tol = dt == DT_DTYPE_F32 ? 1e-5 : 1.6e-2;
    bool exact = r->op == DT_REDUCE_MAX || r->op == DT_REDUCE_MIN;
    void *c[2];
    size_t cb[2];
    run_on(cpu, r, dt, "unsharded,unsharded,unsharded", "unsharded", xs, bs, c, cb);
    size_t esz = dt_dtype_size(dt);
    cr_assert_eq(cb[0], (size_t)nout * esz);
    for (int g = 0; g < nlayouts; g++) {
        void *h[2];
        size_t hb[2];
        run_on(gpus[g], r, dt, lx[g], lb[g], xs, bs, h, hb);
        cr_assert_eq(hb[0], cb[0]);
        for (int64_t o = 0; o < nout; o++) {
            double got = value_at(h[0], dt, o), want = value_at(c[0], dt, o);
            if (exact)
                cr_expect(got == ref[o] && got == want,
                          "%s %s, x %s: output %lld is %.9g, the CPU's %.9g, expected %.9g",
                          r->name, dt_dtype_name(dt), lx[g], (long long)o, got, want, ref[o]);
            else
                cr_expect(fabs(got - ref[o]) <= tol * fmax(1, fabs(ref[o])) &&
                              fabs(got - want) <= tol * fmax(1, fabs(want)),
                          "%s %s, x %s: output %lld is %.9g, the CPU's %.9g, expected %.9g "
                          "(tolerance %g)",
                          r->name, dt_dtype_name(dt), lx[g], (long long)o, got, want, ref[o], tol);
        }
        if (r->stored) {
            cr_assert_eq(hb[1], (size_t)RA * RB * RN * esz);
            cr_expect(memcmp(h[1], c[1], hb[1]) == 0, "%s %s, x %s: t differs from the CPU's",
                      r->name, dt_dtype_name(dt), lx[g]);
            for (int64_t i = 0; i < RA * RB * RN; i++)
                cr_expect(value_at(h[1], dt, i) == t[i], "%s %s, x %s: t[%lld] %.9g, expected %.9g",
                          r->name, dt_dtype_name(dt), lx[g], (long long)i, value_at(h[1], dt, i),
                          t[i]);
        }
        free(h[0]);
        free(h[1]);
    }
    free(c[0]);
    free(c[1]);
}

/* One CPU device and two logical GPUs over the GPUs there are (skipped, saying why, without
 * one). */
Test(cuda_fusion, reductions_against_the_cpu)
{
    fusion_init(2);
    dt_mesh *cpu = mesh_on(DT_DEVICE_CPU, 1), *g1 = mesh_on(DT_DEVICE_CUDA, 1),
            *g2 = mesh_on(DT_DEVICE_CUDA, 2);
    /* one GPU; two with the rows split (5 over 2: uneven); two with the last axis split */
    dt_mesh *const gpus[3] = {g1, g2, g2};
    const char *const lx[3] = {"unsharded,unsharded,unsharded", "x,unsharded,unsharded",
                               "unsharded,unsharded,x"};
    const char *const lb[3] = {"unsharded", "unsharded", "x"};
    const dt_dtype types[2] = {DT_DTYPE_F32, DT_DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (size_t r = 0; r < sizeof reductions / sizeof *reductions; r++)
            check_reduction(&reductions[r], types[d], cpu, gpus, lx, lb, 3);
    dt_mesh_free(cpu);
    dt_mesh_free(g1);
    dt_mesh_free(g2);
    cr_expect_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}
