/* The chain harness of the elementwise fusion tests (test_fusion.c, test_fusion_stored.c;
 * tests/cuda/test_cuda_fusion.c runs both on GPU meshes): a chain of ops built inside or
 * outside a function from inputs drawn the same way every time, traced fused and with
 * DTENSOR_FUSION=0, and check_chain(), which runs it eagerly, fused and unfused and asserts the
 * three bitwise equal; the float dtypes; the chains both files run. On the mesh of
 * fusion_fixture.h. */
#ifndef DT_TEST_FUSION_CHAIN_H
#define DT_TEST_FUSION_CHAIN_H

#include "dt.h"
#include "fusion_fixture.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define MAXIN 4

/* A chain: builds its result from in[] inside or outside a function. */
typedef dt_status (*chain_fn)(dt_tensor *const in[], dt_tensor **out);

typedef struct chain {
    const char *name;
    chain_fn build;
    int nin;
    dt_dtype dtype[MAXIN];
    int rank[MAXIN];
    int64_t shape[MAXIN][DT_MAX_RANK];
    const char *layout[MAXIN];
} chain;

/* A scalar constant of the given dtype, replicated on `mesh` (a fill inside a function). */
static inline dt_status constant(dt_dtype dtype, double v, dt_tensor **out)
{
    dt_layout l;
    DT_TRY(dt_layout_replicated(mesh, 0, &l));
    dt_op_options o = {.layout = &l};
    return dt_fill(dtype, 0, NULL, v, &o, out);
}

/* Input i: values in [-2, 2) on a grid of 1/64 (exact in every float dtype), integers in
 * [-20, 20), in the chain's dtype and layout. */
static inline dt_tensor *input(const chain *c, int i)
{
    int64_t n = dt__num_elements(c->rank[i], c->shape[i]);
    double *h = malloc((size_t)n * sizeof *h);
    unsigned seed = 777u + 31u * (unsigned)i;
    bool integer = c->dtype[i] == DT_DTYPE_I32 || c->dtype[i] == DT_DTYPE_I64;
    for (int64_t k = 0; k < n; k++) {
        seed = seed * 1103515245u + 12345u;
        int u = (int)((seed >> 16) & 255);
        h[k] = integer ? (double)(u % 40 - 20) : (u - 128) / 64.0;
    }
    dt_layout l = L(c->layout[i]);
    dt_tensor *t64 = NULL, *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, c->rank[i], c->shape[i], h,
                                     (size_t)n * sizeof *h, &t64),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_cast(t64, c->dtype[i], NULL, &t), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t64);
    free(h);
    return t;
}

/* The chain traced (fused unless DTENSOR_FUSION=0), its program text in *text. */
static inline dt_function *trace(const chain *c, bool fuse, char **text)
{
    if (fuse)
        unsetenv("DTENSOR_FUSION");
    else
        setenv("DTENSOR_FUSION", "0", 1);
    dt_function *f = NULL;
    dt_tensor *in[MAXIN] = {0}, *y = NULL;
    cr_assert_eq(dt_function_begin(&f), DT_OK, "%s", dt_last_error());
    for (int i = 0; i < c->nin; i++) {
        dt_layout l = L(c->layout[i]);
        cr_assert_eq(dt_function_input(f, &l, c->dtype[i], c->rank[i], c->shape[i], &in[i]), DT_OK,
                     "%s", dt_last_error());
    }
    cr_assert_eq(c->build(in, &y), DT_OK, "%s: %s", c->name, dt_last_error());
    cr_assert_eq(dt_function_end(f, 1, &y), DT_OK, "%s: %s", c->name, dt_last_error());
    unsetenv("DTENSOR_FUSION");
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(y);
    *text = program_text(f);
    return f;
}

static inline void *run_traced(const dt_function *f, const chain *c, dt_tensor *const in[],
                               size_t *bytes)
{
    dt_tensor *r = NULL;
    cr_assert_eq(dt_function_run(f, c->nin, (const dt_tensor *const *)in, 1, &r), DT_OK, "%s: %s",
                 c->name, dt_last_error());
    void *h = read_all(r, bytes);
    dt_tensor_free(r);
    return h;
}

/* Runs c eagerly, fused and unfused; asserts the three bitwise equal, the fused program has
 * at least `fused_kernels` kernels in one fused step and the unfused none. Returns the result
 * (free it). */
static inline void *check_chain(const chain *c, int fused_kernels, char **fused_text)
{
    dt_tensor *in[MAXIN] = {0}, *e = NULL;
    for (int i = 0; i < c->nin; i++)
        in[i] = input(c, i);
    cr_assert_eq(c->build(in, &e), DT_OK, "%s: %s", c->name, dt_last_error());
    size_t be, bf, bu;
    void *he = read_all(e, &be);
    dt_tensor_free(e);

    char *tf, *tu;
    dt_function *ff = trace(c, true, &tf), *fu = trace(c, false, &tu);
    void *hf = run_traced(ff, c, in, &bf), *hu = run_traced(fu, c, in, &bu);
    cr_expect(strstr(tu, "fused") == NULL, "%s: DTENSOR_FUSION=0 fused:\n%s", c->name, tu);
    int most = 0;
    for (const char *at = tf; (at = strstr(at, "kernel     fused ")) != NULL; at++) {
        const char *k = strstr(at, " kernels: ");
        int n = 0;
        while (k && k > at && k[-1] >= '0' && k[-1] <= '9')
            k--;
        if (k)
            n = atoi(k);
        most = n > most ? n : most;
    }
    cr_expect(most >= fused_kernels, "%s: largest fused step %d kernels, expected >= %d:\n%s",
              c->name, most, fused_kernels, tf);
    cr_assert_eq(bf, be);
    cr_assert_eq(bu, be);
    cr_expect(memcmp(hf, he, be) == 0, "%s: fused differs from eager:\n%s", c->name, tf);
    cr_expect(memcmp(hu, he, be) == 0, "%s: unfused traced differs from eager", c->name);
    dt_function_free(ff);
    dt_function_free(fu);
    free(hf);
    free(hu);
    free(tu);
    if (fused_text)
        *fused_text = tf;
    else
        free(tf);
    for (int i = 0; i < c->nin; i++)
        dt_tensor_free(in[i]);
    return he;
}

static const dt_dtype floats[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};

/* The kernels a chain of n - 1 ops and its reduction make one step of: n where the backend's
 * FUSED entry takes reductions (`fused_reduce`: the CPU, emulated and real GPUs), else the
 * reduction stays its own kernel. */
static inline int reduce_kernels(int n)
{
    const dt__backend *be = dt__backend_of(FUSION_DEVICE);
    return be && be->fused_reduce ? n : 1;
}

/* ---- chains both files run ------------------------------------------------------------------ */

/* gelu(x + b): the MLP's bias and activation */
static inline dt_status bias_gelu(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *t = NULL;
    dt_status s = dt_binary(DT_BINARY_ADD, in[0], in[1], NULL, &t);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_GELU, t, NULL, out);
    dt_tensor_free(t);
    return s;
}

/* (x + y) * 0.5 + tanh(x): a residual add, a scale by a constant, another branch */
static inline dt_status residual_scale(dt_tensor *const in[], dt_tensor **out)
{
    dt_tensor *a = NULL, *h = NULL, *m = NULL, *t = NULL;
    dt_status s = dt_binary(DT_BINARY_ADD, in[0], in[1], NULL, &a);
    if (s == DT_OK)
        s = constant(dt_tensor_dtype(in[0]), 0.5, &h);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, a, h, NULL, &m);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_TANH, in[0], NULL, &t);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, m, t, NULL, out);
    dt_tensor_free(a);
    dt_tensor_free(h);
    dt_tensor_free(m);
    dt_tensor_free(t);
    return s;
}

#endif
