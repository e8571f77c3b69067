/* The CPU kernels split over a device's threads (backends/cpu/pool.h) against the same kernels
 * on one thread: every output byte identical, with pools of 2, 3 and 4 threads, on sizes
 * around the split threshold (DT__CPU_PARALLEL_MIN element-steps a thread) and uneven ranges,
 * for each kernel that splits: unary, binary (whole and broadcast operands, comparisons, bf16),
 * cast, where, reduce (rows, blocked columns, chunks of columns), softmax's steps, the norms,
 * attention, FUSED (and FUSED ending in a reduction) and gemm (f32, f64, bf16, f16; every
 * transpose; batched; odd sizes; rows cut evenly on the kernel's row tile; OpenBLAS on one
 * thread). */
#include "../../backends/cpu/pool.h"
#include "dt.h"

#include <cblas.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MIN_WORK DT__CPU_PARALLEL_MIN

static dt__cpu_pool *pools[3]; /* 2, 3 and 4 threads */

static void open_pools(void)
{
    /* as the runtime sets it when the pools split gemms (a call on several OpenBLAS threads
     * differs from one thread in the last bits) */
    openblas_set_num_threads(1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(dt__cpu_pool_open(i + 2, false, true, &pools[i]), DT_OK);
}

static void close_pools(void)
{
    for (int i = 0; i < 3; i++)
        dt__cpu_pool_close(pools[i]);
}

TestSuite(cpu_threads, .init = open_pools, .fini = close_pools);

static uint64_t lcg = 12345;

/* values in [-4, 4) with a fractional part, deterministic */
static double next_value(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) / 9007199254740992.0 * 8.0 - 4.0;
}

static void *random_f32(int64_t n, double lo)
{
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        double v = next_value();
        p[i] = (float)(lo > 0 ? lo + (v + 4.0) : v);
    }
    return p;
}

static void *random_bf16(int64_t n)
{
    uint16_t *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = dt_f32_to_bf16((float)next_value());
    return p;
}

static void *random_bool(int64_t n)
{
    uint8_t *p = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++)
        p[i] = next_value() > 0;
    return p;
}

/* k for an output of `shape`, every operand of that shape */
static dt__kargs kargs_of(int rank, const int64_t shape[])
{
    dt__kargs k;
    memset(&k, 0, sizeof k);
    k.rank = rank;
    for (int i = 0; i < rank; i++) {
        k.shape[i] = shape[i];
        for (int q = 0; q < DT__FUSED_MAX_IN; q++)
            k.in_shape[q][i] = shape[i];
    }
    k.a = 1.0;
    return k;
}

/* Kernel (kern, dt) on one thread and on each pool: out_bytes identical. work: the element-steps
 * the split is sized by, and units: what it divides (at least 2 ranges on the pool of 2). */
static void check(const char *what, dt__kernel kern, dt_dtype dt, const dt__kargs *k,
                  const void *const in[], size_t out_bytes, int64_t work, int64_t units)
{
    dt__kctx one = {.type = "CPU", .cores = 1};
    unsigned char *ref = malloc(out_bytes), *got = malloc(out_bytes);
    memset(ref, 0x5a, out_bytes);
    cr_assert_eq(dt__cpu_kernels[kern][dt](&one, k, in, ref), DT_OK);
    for (int i = 0; i < 3; i++) {
        dt__kctx many = {.type = "CPU", .cores = i + 2, .pool = pools[i]};
        int parts = dt__cpu_parts(&many, work, units);
        int64_t want = work / MIN_WORK < i + 2 ? work / MIN_WORK : i + 2;
        cr_assert_eq(parts, want < units ? want : units, "%s: %d ranges on %d threads", what, parts,
                     i + 2);
        cr_assert_geq(parts, 2, "%s: not split", what);
        memset(got, 0x5a, out_bytes);
        cr_assert_eq(dt__cpu_kernels[kern][dt](&many, k, in, got), DT_OK);
        size_t at = 0;
        while (at < out_bytes && ref[at] == got[at])
            at++;
        cr_assert_eq(at, out_bytes, "%s on %d threads: byte %zu differs (%02x, one thread %02x)",
                     what, i + 2, at, at < out_bytes ? got[at] : 0, at < out_bytes ? ref[at] : 0);
    }
    free(ref);
    free(got);
}

/* ---- the pool itself ------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    int64_t count[1000];
    pthread_t who[1000];
} cover;

static void mark(void *arg, int64_t lo, int64_t hi)
{
    cover *c = arg;
    for (int64_t i = lo; i < hi; i++) {
        c->count[i]++;
        c->who[i] = pthread_self();
    }
}

Test(cpu_threads, ranges_cover_once_on_distinct_threads)
{
    for (int i = 0; i < 3; i++)
        for (int64_t n = 2; n < 40; n += 7) {
            cover *c = calloc(1, sizeof *c);
            int parts = i + 2;
            dt__cpu_pool_run(pools[i], n, parts, mark, c);
            for (int64_t j = 0; j < n; j++)
                cr_assert_eq(c->count[j], 1, "n %ld, %d threads: element %ld ran %ld times",
                             (long)n, i + 2, (long)j, (long)c->count[j]);
            /* contiguous ranges: the thread changes exactly parts - 1 times */
            int changes = 0;
            for (int64_t j = 1; j < n; j++)
                changes += !pthread_equal(c->who[j], c->who[j - 1]);
            cr_assert_eq(changes, (n < parts ? n : parts) - 1, "n %ld on %d threads", (long)n,
                         i + 2);
            cr_assert(pthread_equal(c->who[0], pthread_self()), "the caller takes the first");
            free(c);
        }
}

Test(cpu_threads, below_the_threshold_one_range)
{
    dt__kctx many = {.type = "CPU", .cores = 4, .pool = pools[2]};
    cr_assert_eq(dt__cpu_parts(&many, 2 * MIN_WORK - 1, 1000000), 1);
    cr_assert_eq(dt__cpu_parts(&many, 2 * MIN_WORK, 1000000), 2);
    cr_assert_eq(dt__cpu_parts(&many, 100 * MIN_WORK, 3), 3);
    cr_assert_eq(dt__cpu_parts(&many, 100 * MIN_WORK, 1), 1);
    dt__kctx none = {.type = "CPU", .cores = 1};
    cr_assert_eq(dt__cpu_parts(&none, 100 * MIN_WORK, 1000), 1);
}

/* ---- elementwise ----------------------------------------------------------------------- */

Test(cpu_threads, unary)
{
    static const int64_t sizes[][2] = {{1, 2 * MIN_WORK}, {3, 2 * MIN_WORK / 3 + 1}, {7, 10007}};
    static const int ops[] = {DT_UNARY_NEG, DT_UNARY_EXP, DT_UNARY_TANH, DT_UNARY_GELU};
    for (int s = 0; s < 3; s++)
        for (int o = 0; o < 4; o++) {
            int64_t n = sizes[s][0] * sizes[s][1];
            dt__kargs k = kargs_of(2, sizes[s]);
            k.op = ops[o];
            void *x = random_f32(n, 0), *h = random_bf16(n);
            const void *in[1] = {x};
            check("unary f32", DT__K_UNARY, DT_DTYPE_F32, &k, in, (size_t)n * 4, n, n);
            in[0] = h;
            check("unary bf16", DT__K_UNARY, DT_DTYPE_BF16, &k, in, (size_t)n * 2, n, n);
            free(x);
            free(h);
        }
}

Test(cpu_threads, binary_whole_and_broadcast)
{
    static const int ops[] = {DT_BINARY_ADD, DT_BINARY_MUL, DT_BINARY_DIV, DT_BINARY_LT};
    /* whole operands: every axis merges, the elements split */
    int64_t shape[3] = {5, 3, 4099}, n = 5 * 3 * 4099;
    for (int o = 0; o < 4; o++) {
        dt__kargs k = kargs_of(3, shape);
        k.op = ops[o];
        size_t osz = ops[o] == DT_BINARY_LT ? 1 : 4;
        void *a = random_f32(n, 0), *b = random_f32(n, 0.5);
        const void *in[2] = {a, b};
        check("binary f32", DT__K_BINARY, DT_DTYPE_F32, &k, in, (size_t)n * osz, n, n);
        free(a);
        free(b);
        a = random_bf16(n);
        b = random_bf16(n);
        in[0] = a;
        in[1] = b;
        check("binary bf16", DT__K_BINARY, DT_DTYPE_BF16, &k, in, (size_t)n * (osz == 1 ? 1 : 2), n,
              n);
        /* b a row broadcast over the leading axes (a bias): they merge, split by rows */
        k.in_shape[1][0] = k.in_shape[1][1] = 1;
        void *row = random_bf16(4099);
        in[1] = row;
        check("binary bf16 + row", DT__K_BINARY, DT_DTYPE_BF16, &k, in,
              (size_t)n * (osz == 1 ? 1 : 2), n, 15);
        free(a);
        free(b);
        free(row);
    }
    /* b broadcast along the middle axis: only axis 0 splits (7 units) */
    int64_t s2[3] = {7, 33, 301}, n2 = 7 * 33 * 301;
    dt__kargs k = kargs_of(3, s2);
    k.op = DT_BINARY_SUB;
    k.in_shape[1][1] = 1;
    void *a = random_f32(n2, 0), *b = random_f32(7 * 301, 0);
    const void *in[2] = {a, b};
    check("binary f32 middle broadcast", DT__K_BINARY, DT_DTYPE_F32, &k, in, (size_t)n2 * 4, n2, 7);
    /* a scalar operand (rank-aligned, every axis 1) */
    for (int i = 0; i < 3; i++)
        k.in_shape[0][i] = 1;
    k.in_shape[1][1] = 33;
    float two = 2.5f;
    void *big = random_f32(n2, 0);
    const void *in2[2] = {&two, big};
    check("binary scalar - f32", DT__K_BINARY, DT_DTYPE_F32, &k, in2, (size_t)n2 * 4, n2, n2);
    free(a);
    free(b);
    free(big);
}

Test(cpu_threads, cast_and_where)
{
    int64_t shape[2] = {9, 5003}, n = 9 * 5003;
    dt__kargs k = kargs_of(2, shape);
    k.from = DT_DTYPE_F32;
    void *x = random_f32(n, 0);
    const void *in[3] = {x};
    check("cast f32 -> bf16", DT__K_CAST, DT_DTYPE_BF16, &k, in, (size_t)n * 2, n, n);
    check("cast f32 -> i32", DT__K_CAST, DT_DTYPE_I32, &k, in, (size_t)n * 4, n, n);
    k.in_shape[0][0] = 1; /* a row cast and broadcast */
    check("cast f32 row -> f64", DT__K_CAST, DT_DTYPE_F64, &k, in, (size_t)n * 8, n, 9);
    dt__kargs w = kargs_of(2, shape);
    w.in_shape[2][0] = 1;
    void *c = random_bool(n), *y = random_f32(5003, 0);
    const void *win[3] = {c, x, y};
    check("where", DT__K_WHERE, DT_DTYPE_F32, &w, win, (size_t)n * 4, n, 9);
    free(x);
    free(c);
    free(y);
}

/* ---- reductions and rows --------------------------------------------------------------- */

Test(cpu_threads, reduce)
{
    static const int ops[] = {DT_REDUCE_SUM, DT_REDUCE_MEAN, DT_REDUCE_MAX};
    /* rows over the last axis; a run of axes with kept columns after (the blocked loop) */
    int64_t last[2] = {301, 517}, mid[3] = {37, 300, 41};
    for (int o = 0; o < 3; o++) {
        dt__kargs k = kargs_of(2, last);
        k.op = ops[o];
        k.mask = 2u;
        k.shape[1] = 1;
        k.a = ops[o] == DT_REDUCE_MEAN ? 1.0 / 517 : 1.0;
        void *x = random_f32(301 * 517, 0), *h = random_bf16(301 * 517);
        const void *in[1] = {x};
        check("reduce f32 rows", DT__K_REDUCE, DT_DTYPE_F32, &k, in, 301 * 4, 301 * 517, 301);
        in[0] = h;
        check("reduce bf16 rows", DT__K_REDUCE, DT_DTYPE_BF16, &k, in, 301 * 2, 301 * 517, 301);
        free(x);
        free(h);
        dt__kargs m = kargs_of(3, mid);
        m.op = ops[o];
        m.mask = 2u;
        m.shape[1] = 1;
        x = random_f32(37 * 300 * 41, 0);
        in[0] = x;
        check("reduce f32 columns", DT__K_REDUCE, DT_DTYPE_F32, &m, in, 37 * 41 * 4, 37 * 300 * 41,
              37);
        free(x);
    }
}

Test(cpu_threads, softmax_steps)
{
    int64_t rows = 129, n = 513, all = rows * n;
    int64_t shape[2] = {rows, n};
    void *x = random_f32(all, 0);
    float *m = malloc((size_t)rows * 4), *s = malloc((size_t)rows * 4);
    dt__kctx one = {.type = "CPU", .cores = 1};
    dt__kargs k = kargs_of(2, shape);
    k.mask = 2u;
    k.shape[1] = 1;
    const void *in[3] = {x, m, s};
    k.mode = DT__SOFTMAX_MAX;
    check("softmax max", DT__K_SOFTMAX, DT_DTYPE_F32, &k, in, (size_t)rows * 4, all, rows);
    dt__cpu_kernels[DT__K_SOFTMAX][DT_DTYPE_F32](&one, &k, in, m);
    k.mode = DT__SOFTMAX_SUMEXP;
    check("softmax sumexp", DT__K_SOFTMAX, DT_DTYPE_F32, &k, in, (size_t)rows * 4, all, rows);
    dt__cpu_kernels[DT__K_SOFTMAX][DT_DTYPE_F32](&one, &k, in, s);
    k.shape[1] = n;
    k.mode = DT__SOFTMAX_SOFTMAX;
    check("softmax", DT__K_SOFTMAX, DT_DTYPE_F32, &k, in, (size_t)all * 4, all, rows);
    k.mode = DT__SOFTMAX_LOG_SOFTMAX;
    check("log_softmax", DT__K_SOFTMAX, DT_DTYPE_F32, &k, in, (size_t)all * 4, all, rows);
    free(x);
    free(m);
    free(s);
    /* over a middle axis, and the logsumexp of m and s (elementwise) */
    int64_t s3[3] = {16, 300, 9}, n3 = 16 * 300 * 9;
    x = random_f32(n3, 0);
    m = random_f32(16 * 9, 0);
    s = random_f32(16 * 9 * 300, 1.0);
    dt__kargs k3 = kargs_of(3, s3);
    k3.mask = 2u;
    const void *in3[3] = {x, m, s};
    k3.mode = DT__SOFTMAX_LOG_SOFTMAX;
    check("log_softmax middle", DT__K_SOFTMAX, DT_DTYPE_F32, &k3, in3, (size_t)n3 * 4, n3, 16);
    k3.mode = DT__SOFTMAX_LSE;
    const void *lse[2] = {x, s};
    check("logsumexp", DT__K_SOFTMAX, DT_DTYPE_F32, &k3, lse, (size_t)n3 * 4, n3, n3);
    free(x);
    free(m);
    free(s);
}

Test(cpu_threads, norms)
{
    int64_t rows = 4 * 17, n = 769, all = rows * n;
    int64_t shape[3] = {4, 17, n};
    void *x = random_f32(all, 0), *gamma = random_f32(n, 0), *beta = random_f32(n, 0);
    void *mu = random_f32(rows, 0), *var = random_f32(rows, 0.1);
    dt__kargs k = kargs_of(3, shape);
    k.a = 1.0 / (double)n;
    k.b = 1e-5;
    k.shape[2] = 1;
    const void *in[5] = {x, mu, var, gamma, beta};
    k.mode = DT__NORM_MEAN;
    check("norm mean", DT__K_NORM, DT_DTYPE_F32, &k, in, (size_t)rows * 4, all, rows);
    k.mode = DT__NORM_VAR;
    check("norm var", DT__K_NORM, DT_DTYPE_F32, &k, in, (size_t)rows * 4, all, rows);
    k.shape[2] = n;
    k.mode = DT__NORM_LAYER | DT__NORM_GAMMA | DT__NORM_BETA;
    check("layer norm", DT__K_NORM, DT_DTYPE_F32, &k, in, (size_t)all * 4, all, rows);
    const void *rms[3] = {x, var, gamma};
    k.mode = DT__NORM_RMS | DT__NORM_GAMMA;
    check("rms norm", DT__K_NORM, DT_DTYPE_F32, &k, rms, (size_t)all * 4, all, rows);
    free(x);
    free(gamma);
    free(beta);
    free(mu);
    free(var);
}

/* Attention split by slices (each slice on one thread), forward and gradient, causal or not;
 * T not a multiple of the kernel's blocks. */
Test(cpu_threads, attention)
{
    int64_t shape[3] = {6, 70, 16}, n = 6 * 70 * 16, work = 6 * 70 * 70 * 16;
    void *q = random_f32(n, 0), *kk = random_f32(n, 0), *v = random_f32(n, 0),
         *dy = random_f32(n, 0);
    const void *in[4] = {q, kk, v, dy};
    for (int causal = 0; causal < 2; causal++) {
        dt__kargs k = kargs_of(3, shape);
        k.a = 0.25;
        k.mode = DT__ATTN_FORWARD | (causal ? DT__ATTN_CAUSAL : 0);
        check("attention", DT__K_ATTENTION, DT_DTYPE_F32, &k, in, (size_t)n * 4, work, 6);
        /* the gradient's output [3, 6, 70, 16]; q's shape first in in_shape[0] */
        k.rank = 4;
        k.shape[0] = 3;
        for (int i = 0; i < 3; i++)
            k.shape[i + 1] = shape[i];
        k.mode = DT__ATTN_GRAD | (causal ? DT__ATTN_CAUSAL : 0);
        check("attention gradient", DT__K_ATTENTION, DT_DTYPE_F32, &k, in, (size_t)n * 12, work, 6);
    }
    free(q);
    free(kk);
    free(v);
    free(dy);
}

/* ---- FUSED ------------------------------------------------------------------------------ */

Test(cpu_threads, fused_chain)
{
    /* tanh(a * b) + a * 0.5 with b a row broadcast over a's rows, then cast to bf16 */
    dt__fused fz = {.nin = 2, .nops = 6};
    fz.ops[0] = (dt__fused_op){.kernel = DT__K_BINARY,
                               .dtype = DT_DTYPE_F32,
                               .out = DT_DTYPE_F32,
                               .op = DT_BINARY_MUL,
                               .nin = 2,
                               .arg = {0, 1}};
    fz.ops[1] = (dt__fused_op){.kernel = DT__K_UNARY,
                               .dtype = DT_DTYPE_F32,
                               .out = DT_DTYPE_F32,
                               .op = DT_UNARY_TANH,
                               .nin = 1,
                               .arg = {2}};
    fz.ops[2] = (dt__fused_op){
        .kernel = DT__K_FILL, .dtype = DT_DTYPE_F32, .out = DT_DTYPE_F32, .a = 0.5, .scalar = true};
    fz.ops[3] = (dt__fused_op){.kernel = DT__K_BINARY,
                               .dtype = DT_DTYPE_F32,
                               .out = DT_DTYPE_F32,
                               .op = DT_BINARY_MUL,
                               .nin = 2,
                               .arg = {0, 4}};
    fz.ops[4] = (dt__fused_op){.kernel = DT__K_BINARY,
                               .dtype = DT_DTYPE_F32,
                               .out = DT_DTYPE_F32,
                               .op = DT_BINARY_ADD,
                               .nin = 2,
                               .arg = {3, 5}};
    fz.ops[5] = (dt__fused_op){.kernel = DT__K_CAST,
                               .dtype = DT_DTYPE_BF16,
                               .out = DT_DTYPE_BF16,
                               .from = DT_DTYPE_F32,
                               .nin = 1,
                               .arg = {6}};
    static const int64_t shapes[][2] = {{3, 6000}, {40, 1025}, {2, 20000}};
    for (int s = 0; s < 3; s++) {
        int64_t rows = shapes[s][0], n = shapes[s][1], all = rows * n;
        dt__kargs k = kargs_of(2, shapes[s]);
        k.in_shape[1][0] = 1;
        k.fused = &fz;
        void *a = random_f32(all, 0), *b = random_f32(n, 0);
        const void *in[2] = {a, b};
        check("fused", DT__K_FUSED, DT_DTYPE_BF16, &k, in, (size_t)all * 2, all * 6,
              rows * ((n + 4095) / 4096)); /* blocks of 4096 elements a row */
        free(a);
        free(b);
    }
}

/* ---- gemm -------------------------------------------------------------------------------- */

/* The row tiles: on the cores measured, sgemm's kernel computes rows in groups of 12 and
 * dgemm's in 2 (every cut of a call's rows tried, OpenBLAS 0.3.21); elsewhere the fallback. */
Test(cpu_threads, gemm_tile)
{
    const char *core = openblas_get_corename();
    bool known = !strcmp(core, "Haswell") || !strcmp(core, "Zen");
    cr_assert_eq(dt__cpu_gemm_tile(4), known ? 12 : DT__CPU_GEMM_TILE_ANY, "%s", core);
    cr_assert_eq(dt__cpu_gemm_tile(8), known ? 2 : DT__CPU_GEMM_TILE_ANY, "%s", core);
}

/* The cuts of a split by rows: on multiples of the tile, each the multiple nearest i / parts of
 * the rows, the last part to the end. */
static void check_cuts(dt__cpu_gemm_split s, int64_t m)
{
    cr_assert_eq(s.axis, DT__CPU_GEMM_ROWS);
    cr_assert_eq(s.units, s.parts);
    cr_assert_eq(dt__cpu_gemm_row_cut(&s, m, 0), 0);
    cr_assert_eq(dt__cpu_gemm_row_cut(&s, m, s.parts), m);
    for (int i = 1; i <= s.parts; i++) {
        int64_t cut = dt__cpu_gemm_row_cut(&s, m, i);
        cr_assert_gt(cut, dt__cpu_gemm_row_cut(&s, m, i - 1), "m %ld: part %d of %d is empty",
                     (long)m, i - 1, s.parts);
        if (i < s.parts) /* |cut - i m / parts| <= tile / 2, times 2 parts */
            cr_assert(cut % s.tile == 0 && llabs(2 * s.parts * cut - 2 * i * m) <= s.parts * s.tile,
                      "m %ld, part %d of %d: row %ld, not the tile's multiple nearest %g", (long)m,
                      i, s.parts, (long)cut, (double)m * i / s.parts);
    }
}

Test(cpu_threads, gemm_plan)
{
    dt__kctx two = {.type = "CPU", .cores = 2, .pool = pools[0]};
    dt__kctx four = {.type = "CPU", .cores = 4, .pool = pools[2]};
    int t = dt__cpu_gemm_tile(4);
    int64_t rows = 2 * t, kk = (2 * DT__CPU_GEMM_MIN + rows * 64 - 1) / (rows * 64);
    /* below 2 parts' multiply-adds: one call */
    cr_assert_eq(dt__cpu_gemm_plan(&two, 4, 1, rows, 64, kk - 1).parts, 1);
    dt__cpu_gemm_split s = dt__cpu_gemm_plan(&two, 4, 1, rows, 64, kk);
    cr_assert(s.parts == 2 && s.tile == t, "%d %d", s.parts, s.tile);
    check_cuts(s, rows);
    cr_assert_eq(dt__cpu_gemm_row_cut(&s, rows, 1), t);
    /* at most the pool's threads, at most a part a tile (more columns do not help) */
    s = dt__cpu_gemm_plan(&four, 4, 1, 5 * t, 1000, 1000);
    cr_assert_eq(s.parts, 4);
    check_cuts(s, 5 * t);
    s = dt__cpu_gemm_plan(&four, 4, 1, 3 * t - 1, 100000, 1000);
    cr_assert_eq(s.parts, 2);
    check_cuts(s, 3 * t - 1);
    cr_assert_eq(dt__cpu_gemm_plan(&four, 4, 1, 2 * t - 1, 100000, 1000).parts, 1);
    cr_assert_eq(dt__cpu_gemm_plan(&four, 4, 1, 1, 100000, 1000).parts, 1);
    /* balanced on the tile: GPT-2's 512 rows (4 x 128 tokens) in halves as near 256 as the tile
     * allows (252 and 260 on 12 rows; 240 and 272 in the blocks of 48 before) */
    for (int64_t m = 2 * t; m < 40 * t; m += 7) {
        for (int i = 0; i < 3; i++) {
            dt__kctx x = {.type = "CPU", .cores = i + 2, .pool = pools[i]};
            s = dt__cpu_gemm_plan(&x, 4, 1, m, 4096, 4096);
            cr_assert_eq(s.parts, m / t < i + 2 ? m / t : i + 2);
            check_cuts(s, m);
        }
    }
    s = dt__cpu_gemm_plan(&two, 4, 1, 512, 768, 768);
    cr_assert_eq(dt__cpu_gemm_row_cut(&s, 512, 1), (256 + t / 2) / t * t);
    s = dt__cpu_gemm_plan(&two, 8, 1, 512, 768, 768); /* dgemm's tile */
    cr_assert(s.tile == dt__cpu_gemm_tile(8) && s.parts == 2);
    check_cuts(s, 512);
    /* batch entries, unless rows leave the largest part fewer rows */
    s = dt__cpu_gemm_plan(&four, 4, 4, 512, 512, 64);
    cr_assert(s.parts == 4 && s.axis == DT__CPU_GEMM_BATCH && s.units == 4);
    s = dt__cpu_gemm_plan(&two, 4, 4, 512, 512, 64);
    cr_assert(s.parts == 2 && s.axis == DT__CPU_GEMM_BATCH && s.units == 4);
    s = dt__cpu_gemm_plan(&four, 4, 3, 512, 512, 64); /* 1 entry of 512 rows, or 3 x 128 */
    cr_assert_eq(s.parts, 4);
    check_cuts(s, 512);
    s = dt__cpu_gemm_plan(&four, 4, 5, 512, 512, 64); /* 2 entries, or 5 x 128 */
    check_cuts(s, 512);
    s = dt__cpu_gemm_plan(&two, 4, 3, 512, 512, 64); /* 2 entries, or 3 x 256 */
    check_cuts(s, 512);
    s = dt__cpu_gemm_plan(&two, 4, 3, 1, 4096, 4096); /* one row: entries */
    cr_assert(s.parts == 2 && s.axis == DT__CPU_GEMM_BATCH && s.units == 3);
    /* no pool, or a pool that leaves gemm to OpenBLAS */
    dt__kctx none = {.type = "CPU", .cores = 1};
    cr_assert_eq(dt__cpu_gemm_plan(&none, 4, 1, 1000, 1000, 1000).parts, 1);
    dt__cpu_pool *blas;
    cr_assert_eq(dt__cpu_pool_open(2, false, false, &blas), DT_OK);
    dt__kctx own = {.type = "CPU", .cores = 2, .pool = blas};
    cr_assert_eq(dt__cpu_gemm_plan(&own, 4, 1, 1000, 1000, 1000).parts, 1);
    dt__cpu_pool_close(blas);
}

static void *random_of(dt_dtype dt, int64_t n)
{
    if (dt == DT_DTYPE_F32)
        return random_f32(n, 0);
    if (dt == DT_DTYPE_BF16)
        return random_bf16(n);
    if (dt == DT_DTYPE_F16) {
        uint16_t *p = malloc((size_t)n * sizeof *p);
        for (int64_t i = 0; i < n; i++)
            p[i] = dt_f32_to_f16((float)next_value());
        return p;
    }
    double *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = next_value() + next_value() * 0x1p-30; /* bits past f32's */
    return p;
}

/* gemm (dt) of k on one thread (one BLAS call a batch entry) against each pool: every output
 * byte identical, OpenBLAS on one thread throughout. split: whether the pools must split it
 * (else they must not). */
static void check_gemm(dt_dtype dt, const dt__kargs *k, const void *const in[], bool split)
{
    size_t esz = dt_dtype_size(dt);
    size_t out_bytes = (size_t)(k->c_at + k->batch * k->m * k->n) * esz;
    unsigned char *ref = malloc(out_bytes), *got = malloc(out_bytes);
    dt__kctx one = {.type = "CPU", .cores = 1};
    memset(ref, 0x5a, out_bytes);
    cr_assert_eq(dt__cpu_kernels[DT__K_GEMM][dt](&one, k, in, ref), DT_OK);
    for (int i = 0; i < 3; i++) {
        dt__kctx many = {.type = "CPU", .cores = i + 2, .pool = pools[i]};
        dt__cpu_gemm_split s =
            dt__cpu_gemm_plan(&many, dt == DT_DTYPE_F64 ? 8 : 4, k->batch, k->m, k->n, k->k);
        memset(got, 0x5a, out_bytes);
        cr_assert_eq(dt__cpu_kernels[DT__K_GEMM][dt](&many, k, in, got), DT_OK);
        size_t at = 0;
        while (at < out_bytes && ref[at] == got[at])
            at++;
        cr_assert_eq(at, out_bytes,
                     "gemm %s, batch %ld, %ldx%ldx%ld, ta %d tb %d, %d parts on %d threads: "
                     "byte %zu of %zu differs",
                     dt_dtype_name(dt), (long)k->batch, (long)k->m, (long)k->n, (long)k->k, k->ta,
                     k->tb, s.parts, i + 2, at, out_bytes);
        cr_assert_eq(s.parts > 1, split, "gemm %ldx%ldx%ld: %d parts on %d threads", (long)k->m,
                     (long)k->n, (long)k->k, s.parts, i + 2);
    }
    free(ref);
    free(got);
}

/* Every dtype and transpose on (batch, m, n, k): operands with batch stride 0 where asked,
 * op(A) a block of rows of a wider stored A at an offset (a_at, lda), C at c_at. */
static void gemm_case(int64_t batch, int64_t m, int64_t n, int64_t kk, bool a_repeat, bool b_repeat,
                      bool block, bool split)
{
    static const dt_dtype dts[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 4; t++) {
            dt__kargs k;
            memset(&k, 0, sizeof k);
            k.batch = batch;
            k.m = m;
            k.n = n;
            k.k = kk;
            k.ta = t & 1;
            k.tb = t >> 1;
            /* stored A: [kk, lda] when transposed (op(A)'s rows are its columns), else [m, lda] */
            int64_t stored_rows = k.ta ? kk : m, cols = k.ta ? m : kk;
            if (block) {
                k.lda = cols + 5;
                k.a_at = 3 * k.lda + 2;
                k.c_at = 7;
            }
            int64_t per_a = k.a_at + stored_rows * (k.lda ? k.lda : cols);
            k.a_batch_stride = a_repeat ? 0 : per_a;
            k.b_batch_stride = b_repeat ? 0 : kk * n;
            void *a = random_of(dts[d], (a_repeat ? 1 : batch) * per_a);
            void *b = random_of(dts[d], (b_repeat ? 1 : batch) * kk * n);
            check_gemm(dts[d], &k, (const void *const[]){a, b}, split);
            free(a);
            free(b);
        }
}

Test(cpu_threads, gemm_shapes)
{
    gemm_case(1, 257, 263, 31, false, false, false, true);   /* primes; 5 blocks of rows */
    gemm_case(1, 521, 7, 293, false, false, false, true);    /* n < parts */
    gemm_case(1, 1031, 1033, 1, false, false, false, true);  /* k = 1 */
    gemm_case(1, 1031, 1, 1031, false, false, false, true);  /* one column */
    gemm_case(1, 97, 113, 1031, false, false, false, true);  /* the last block takes the rest */
    gemm_case(1, 3, 1031, 347, false, false, false, false);  /* m < parts: one call */
    gemm_case(1, 1, 1031, 1031, false, false, false, false); /* one row: one call */
    gemm_case(1, 60, 40, 100, false, false, false, false);   /* small: one call */
}

Test(cpu_threads, gemm_batched_and_blocks)
{
    gemm_case(4, 67, 71, 73, false, false, false, true);   /* batch entries */
    gemm_case(5, 67, 71, 73, false, false, false, true);   /* rows: 5 x 36 rows, not 3 x 67 */
    gemm_case(2, 131, 257, 61, false, false, false, true); /* fewer entries than parts: rows */
    gemm_case(3, 97, 89, 83, true, false, false, true);    /* A repeated over the batch */
    gemm_case(3, 97, 89, 83, false, true, false, true);    /* B repeated */
    gemm_case(1, 263, 131, 47, false, false, true, true);  /* a block of a wider A, C at c_at */
    gemm_case(2, 129, 67, 71, false, false, true, true);
}

/* GPT-2's 512 rows cut as evenly as the tile allows (on 12 rows: 252 | 260 on 2 threads,
 * 168 | 168 | 176 on 3, 132 | 120 | 132 | 128 on 4), and batches split by rows */
Test(cpu_threads, gemm_balanced_rows)
{
    gemm_case(1, 512, 67, 97, false, false, false, true);
    gemm_case(1, 301, 29, 211, false, false, true, true);
    gemm_case(3, 512, 37, 41, false, false, false, true);
    gemm_case(5, 100, 43, 61, false, true, false, true);
}

static void call_s(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void *A, int64_t lda,
                   const void *B, int64_t ldb, void *C, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)kk, 1, A, (blasint)lda, B, (blasint)ldb, 0, C,
                (blasint)ldc);
}

static void call_d(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void *A, int64_t lda,
                   const void *B, int64_t ldb, void *C, int64_t ldc)
{
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)kk, 1, A, (blasint)lda, B, (blasint)ldb, 0, C,
                (blasint)ldc);
}

/* Whether op(A) op(B) of k (f32 or f64) split by rows on `tile` into `parts` on the 4-thread
 * pool equals one call, byte for byte. */
static bool split_equals_one(dt_dtype dt, const dt__kargs *k, int tile, int parts)
{
    size_t esz = dt_dtype_size(dt), bytes = (size_t)(k->m * k->n) * esz;
    dt__cpu_gemm_call call = dt == DT_DTYPE_F32 ? call_s : call_d;
    void *a = random_of(dt, k->m * k->k), *b = random_of(dt, k->k * k->n);
    unsigned char *ref = malloc(bytes), *got = malloc(bytes);
    dt__kctx one = {.type = "CPU", .cores = 1};
    dt__kctx four = {.type = "CPU", .cores = 4, .pool = pools[2]};
    dt__cpu_gemm_as(&one, k, call, esz, a, b, ref,
                    (dt__cpu_gemm_split){1, DT__CPU_GEMM_BATCH, 1, 1});
    dt__cpu_gemm_as(&four, k, call, esz, a, b, got,
                    (dt__cpu_gemm_split){parts, DT__CPU_GEMM_ROWS, tile, parts});
    bool same = !memcmp(ref, got, bytes);
    free(a);
    free(b);
    free(ref);
    free(got);
    return same;
}

/* Every cut on a multiple of the kernel's tile, in 2 to 4 parts, gives one call's bytes (sgemm,
 * dgemm, each transpose); a tile of 4 rows on a kernel of 12 does not (the tests above would
 * catch a wrong tile). */
Test(cpu_threads, gemm_tile_cuts)
{
    for (int d = 0; d < 2; d++) {
        dt_dtype dt = d ? DT_DTYPE_F64 : DT_DTYPE_F32;
        int tile = dt__cpu_gemm_tile(d ? 8 : 4);
        for (int t = 0; t < 4; t++) {
            dt__kargs k;
            memset(&k, 0, sizeof k);
            k.batch = 1;
            k.n = 53;
            k.k = 301;
            k.ta = t & 1;
            k.tb = t >> 1;
            /* each count of tiles a part can get: cuts at every multiple of the tile */
            for (k.m = 2 * tile; k.m <= 9 * tile + 5; k.m += tile / 2 + 1)
                for (int parts = 2; parts <= 4 && parts * tile <= k.m; parts++)
                    cr_assert(split_equals_one(dt, &k, tile, parts),
                              "%s, ta %d tb %d, %ld rows in %d parts on a tile of %d",
                              dt_dtype_name(dt), k.ta, k.tb, (long)k.m, parts, tile);
        }
    }
    if (dt__cpu_gemm_tile(4) != 12)
        cr_skip_test("sgemm's tile here is %d, not 12", dt__cpu_gemm_tile(4));
    dt__kargs k;
    memset(&k, 0, sizeof k);
    k.batch = 1;
    k.m = 100; /* cut at 52 on a tile of 4 */
    k.n = 53;
    k.k = 301;
    cr_assert(!split_equals_one(DT_DTYPE_F32, &k, 4, 2),
              "sgemm cut at row 52 equals one call: the test cannot see a wrong tile");
}

/* ---- reductions split by columns, and chains ending in one ------------------------------- */

static const dt_dtype float_types[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};

/* Leading axes reduced with fewer kept rows than threads ([1, 600, n] -> [1, 1, n], the
 * gradient of a bias or of a norm's gamma): chunks of the kept columns, the last one narrow
 * (129 columns: chunks of 64, 64 and 1). */
Test(cpu_threads, reduce_columns)
{
    static const int ops[] = {DT_REDUCE_SUM, DT_REDUCE_MEAN, DT_REDUCE_MAX, DT_REDUCE_MIN};
    static const int64_t cols[] = {700, 129};
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < 2; c++)
            for (int o = 0; o < 4; o++) {
                dt_dtype dt = float_types[t];
                int64_t shape[3] = {1, 600, cols[c]};
                dt__kargs k = kargs_of(3, shape);
                k.op = ops[o];
                k.mask = 2u;
                k.shape[1] = 1;
                k.a = ops[o] == DT_REDUCE_MEAN ? 1.0 / 600 : 1.0;
                void *x = random_of(dt, 600 * cols[c]);
                const void *in[1] = {x};
                check("reduce columns", DT__K_REDUCE, dt, &k, in,
                      (size_t)cols[c] * dt_dtype_size(dt), 600 * cols[c], cols[c]);
                free(x);
            }
}

/* A chain ending in a reduction: square(a - b) (b a row broadcast) reduced over the last axis
 * (rows), over the leading axis (columns, split in chunks) and over both (one running value: not
 * split, so compared on one pool here), in every float dtype. */
Test(cpu_threads, fused_reduce)
{
    for (int t = 0; t < 4; t++) {
        dt_dtype dt = float_types[t];
        dt__fused fz = {.nin = 2, .nops = 2, .reduce = true, .rop = DT_REDUCE_SUM};
        fz.ops[0] = (dt__fused_op){.kernel = DT__K_BINARY,
                                   .dtype = dt,
                                   .out = dt,
                                   .op = DT_BINARY_SUB,
                                   .nin = 2,
                                   .arg = {0, 1}};
        fz.ops[1] = (dt__fused_op){.kernel = DT__K_UNARY,
                                   .dtype = dt,
                                   .out = dt,
                                   .op = DT_UNARY_SQUARE,
                                   .nin = 1,
                                   .arg = {2}};
        int64_t shape[2] = {300, 700}, all = 300 * 700;
        void *a = random_of(dt, all), *b = random_of(dt, 700);
        const void *in[2] = {a, b};
        size_t sz = dt_dtype_size(dt);
        for (int v = 0; v < 3; v++) {
            dt__kargs k = kargs_of(2, shape);
            k.in_shape[1][0] = 1;
            k.fused = &fz;
            k.mask = v == 0 ? 2u : v == 1 ? 1u : 3u;
            fz.rop = v == 1 ? DT_REDUCE_MAX : DT_REDUCE_SUM;
            if (v < 2) {
                check(v ? "fused max columns" : "fused sum rows", DT__K_FUSED, dt, &k, in,
                      (size_t)(v ? 700 : 300) * sz, all * 3, v ? 700 : 300);
                continue;
            }
            /* the full reduction: the same on a pool as on one thread (one range) */
            dt__kctx one = {.type = "CPU", .cores = 1};
            dt__kctx many = {.type = "CPU", .cores = 4, .pool = pools[2]};
            uint64_t r1 = 0, r4 = 0;
            cr_assert_eq(dt__cpu_kernels[DT__K_FUSED][dt](&one, &k, in, &r1), DT_OK);
            cr_assert_eq(dt__cpu_kernels[DT__K_FUSED][dt](&many, &k, in, &r4), DT_OK);
            cr_expect_eq(r1, r4, "full fused sum %s on 4 threads", dt_dtype_name(dt));
        }
        free(a);
        free(b);
    }
}
