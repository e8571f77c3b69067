/* Gemm on a CPU device's kernel threads (backends/cpu/split.c) beside OpenBLAS, f32, in the
 * same run. Prints CSV on stdout: for each shape (batch, m, n, k, transposes) the best time of
 * `reps` calls (the methods alternating call by call, so each sees the same load), GFLOP/s, and
 * the critical path: the most CPU time one thread spent in the call's cblas calls (best of the
 * reps; what the call takes when its threads have cores of their own, the pool's dispatch aside:
 * on a loaded machine the steadier figure), of:
 *   - split:   the CPU gemm kernel on a device with a pool of 2 kernel threads, OpenBLAS on one
 *              thread a call, split as dt__cpu_gemm_plan says (the runtime's default);
 *   - blocks48: the same pool, rows cut on blocks of 48 rows (the split before it found the
 *              kernel's row tile; 512 rows: 240 and 272);
 *   - rows:    forced to split rows in two on the tile, whatever the size (where the threshold
 *              would not split: what splitting would give);
 *   - batch:   forced to split batch entries in two (batched shapes);
 *   - blas2:   one cblas call a batch entry on OpenBLAS's 2 threads (not bit for bit one thread);
 *   - blas1:   one cblas call a batch entry on one thread.
 * Ratios: split_vs_blas2 and split_vs_blas1 (wall time, above 1: split faster), and
 * crit_blas1_vs_split (one thread's CPU time over the split's critical path). Shapes: GPT-2
 * small's (4 x 128 tokens, d_model 768, MLP 3072, vocabulary 50304: forward, input gradients,
 * weight gradients), and (40 x reps calls each) the GPT example's (d_model 64) and a sweep of
 * small products around the split threshold.
 * Also the packing of the 512 x 768 x 50304 products: one thread's call on 256 rows against 512
 * (t(512) - 2 (t(512) - t(256)) is what a call spends independently of its rows: mostly packing
 * the 768 x 50304 operand, which each part of a split packs again).
 *
 * OpenBLAS's idle workers sleep at once (OPENBLAS_THREAD_TIMEOUT=4, set unless given), so a blas2
 * call's worker does not spin on the core that the next split call's helper needs; blas2 then
 * pays a wake-up a call, as in a program that does other work between its gemms.
 *
 *   OPENBLAS_NUM_THREADS unset; build-dev/benchmarks/bench_gemm [reps] [small|gpt2|pack|all]
 */
#include "../backends/cpu/pool.h"
#include "bench.h"
#include "dt.h"

#include <cblas.h>
#include <stdatomic.h>
#include <unistd.h>

enum { SPLIT, BLOCKS48, ROWS, BATCH, BLAS2, BLAS1, METHODS };
static const char *names[METHODS] = {"split", "blocks48", "rows", "batch", "blas2", "blas1"};
static dt__cpu_pool *pool;

/* CPU seconds each thread spent in this run's cblas calls (slot: the thread's, in order of first
 * call; the pool's 2 threads and the caller) */
static _Atomic double busy[4];
static atomic_int slots;
static _Thread_local int slot = -1;

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void call_s(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void *A, int64_t lda,
                   const void *B, int64_t ldb, void *C, int64_t ldc)
{
    if (slot < 0)
        slot = atomic_fetch_add(&slots, 1) % 4;
    double t0 = thread_cpu();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)kk, 1, A, (blasint)lda, B, (blasint)ldb, 0, C,
                (blasint)ldc);
    double was = atomic_load(&busy[slot]);
    while (!atomic_compare_exchange_weak(&busy[slot], &was, was + thread_cpu() - t0))
        ;
}

/* One run of method on k: wall seconds; *crit: the most CPU seconds one thread spent in its
 * cblas calls (what the run takes when each thread has a core of its own, less the pool's
 * dispatch; 0 for blas2, whose threads are OpenBLAS's). */
static double run(int method, const dt__kargs *k, const float *a, const float *b, float *c,
                  double *crit)
{
    dt__kctx x = {.type = "CPU", .cores = 2, .pool = pool};
    dt__cpu_gemm_split s = dt__cpu_gemm_plan(&x, 4, k->batch, k->m, k->n, k->k);
    if (method == BLOCKS48 && s.axis == DT__CPU_GEMM_ROWS)
        s.tile = 48;
    if (method == ROWS || method == BATCH) {
        int tile = dt__cpu_gemm_tile(4);
        int parts = method == ROWS ? (int)(k->m / tile < 2 ? k->m / tile : 2)
                                   : (int)(k->batch < 2 ? k->batch : 2);
        s = parts < 2        ? (dt__cpu_gemm_split){1, DT__CPU_GEMM_BATCH, 1, k->batch}
            : method == ROWS ? (dt__cpu_gemm_split){parts, DT__CPU_GEMM_ROWS, tile, parts}
                             : (dt__cpu_gemm_split){parts, DT__CPU_GEMM_BATCH, 1, k->batch};
    }
    if (method == BLAS1 || method == BLAS2)
        s = (dt__cpu_gemm_split){1, DT__CPU_GEMM_BATCH, 1, k->batch};
    openblas_set_num_threads(method == BLAS2 ? 2 : 1);
    for (int i = 0; i < 4; i++)
        atomic_store(&busy[i], 0.0);
    double t0 = bench_now();
    dt__cpu_gemm_as(&x, k, call_s, 4, a, b, c, s);
    double t = bench_now() - t0;
    *crit = 0;
    for (int i = 0; i < 4 && method != BLAS2; i++)
        *crit = atomic_load(&busy[i]) > *crit ? atomic_load(&busy[i]) : *crit;
    return t;
}

static float *values(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((i * 7919 % 2003) - 1001) / 1024.0f;
    return p;
}

/* Times every method on one shape (reps rounds, each method once a round in turn). */
static void shape(const char *what, int64_t batch, int64_t m, int64_t n, int64_t kk, bool ta,
                  bool tb, int reps)
{
    dt__kargs k;
    memset(&k, 0, sizeof k);
    k.batch = batch;
    k.m = m;
    k.n = n;
    k.k = kk;
    k.ta = ta;
    k.tb = tb;
    k.a_batch_stride = m * kk;
    k.b_batch_stride = kk * n;
    float *a = values(batch * m * kk), *b = values(batch * kk * n), *c = values(batch * m * n);
    double best[METHODS], crit[METHODS];
    bool used[METHODS] = {true, false, m / dt__cpu_gemm_tile(4) >= 2, batch > 1, true, true};
    dt__kctx x = {.type = "CPU", .cores = 2, .pool = pool};
    dt__cpu_gemm_split s = dt__cpu_gemm_plan(&x, 4, batch, m, n, kk);
    used[BLOCKS48] = s.axis == DT__CPU_GEMM_ROWS && s.parts > 1;
    for (int q = 0; q < METHODS; q++)
        best[q] = crit[q] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int q = 0; q < METHODS; q++)
            if (used[q]) {
                double cpu, t = run(q, &k, a, b, c, &cpu);
                best[q] = t < best[q] ? t : best[q];
                crit[q] = cpu < crit[q] ? cpu : crit[q];
            }
    double flops = 2.0 * (double)batch * (double)m * (double)n * (double)kk;
    printf("%s,%ld,%ld,%ld,%ld,%d,%d,%s,%d", what, (long)batch, (long)m, (long)n, (long)kk, ta, tb,
           s.parts < 2                   ? "one"
           : s.axis == DT__CPU_GEMM_ROWS ? "rows"
                                         : "batch",
           s.parts);
    for (int q = 0; q < METHODS; q++)
        if (used[q])
            printf(",%.4g,%.1f,%.4g", best[q] * 1e3, flops / best[q] * 1e-9,
                   q == BLAS2 ? 0.0 : crit[q] * 1e3);
        else
            printf(",,,");
    printf(",%.3f,%.3f,%.3f\n", best[BLAS2] / best[SPLIT], best[BLAS1] / best[SPLIT],
           crit[BLAS1] / crit[SPLIT]);
    fflush(stdout);
    free(a);
    free(b);
    free(c);
}

/* One thread's 512 x 768 x 50304 products on 512 and 256 rows: the part of a call that does not
 * scale with its rows. */
static void packing(int reps)
{
    static const struct {
        int64_t m, n, kk;
        bool ta, tb;
        const char *what;
    } p[] = {{512, 50304, 768, false, true, "logits"}, {512, 768, 50304, false, false, "dx"}};
    printf("product,rows,ms_512,ms_256,fixed_ms,fixed_share\n");
    for (int i = 0; i < 2; i++) {
        dt__kargs k;
        memset(&k, 0, sizeof k);
        k.batch = 1;
        k.n = p[i].n;
        k.k = p[i].kk;
        k.ta = p[i].ta;
        k.tb = p[i].tb;
        float *a = values(512 * p[i].kk), *b = values(p[i].kk * p[i].n), *c = values(512 * p[i].n);
        double t[2] = {1e30, 1e30};
        for (int r = 0; r < reps; r++)
            for (int h = 0; h < 2; h++) {
                k.m = h ? 256 : 512;
                double cpu, s = run(BLAS1, &k, a, b, c, &cpu);
                s = cpu < s ? cpu : s;
                t[h] = s < t[h] ? s : t[h];
            }
        double fixed = t[0] - 2 * (t[0] - t[1]);
        printf("%s,512,%.2f,%.2f,%.2f,%.3f\n", p[i].what, t[0] * 1e3, t[1] * 1e3, fixed * 1e3,
               fixed / t[0]);
        free(a);
        free(b);
        free(c);
    }
}

static void nothing(void *arg, int64_t lo, int64_t hi)
{
    (void)arg;
    (void)lo;
    (void)hi;
}

/* The pool's dispatch: the best of 2000 empty jobs in 2 parts, back to back (the helper polling,
 * as between a program's kernels). */
static double dispatch(void)
{
    double best = 1e30;
    for (int i = 0; i < 2000; i++) {
        double t0 = bench_now();
        dt__cpu_pool_run(pool, 2, 2, nothing, NULL);
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *set = argc > 2 ? argv[2] : "all";
    bool all = !strcmp(set, "all");
    if (getenv("OPENBLAS_NUM_THREADS")) {
        fprintf(stderr, "bench_gemm: unset OPENBLAS_NUM_THREADS (it sets the threads itself)\n");
        return 1;
    }
    /* OpenBLAS's idle workers sleep at once (read when OpenBLAS loads: so run again), else
     * after a blas2 call its worker spins on the core the next split call's helper needs */
    if (!getenv("OPENBLAS_THREAD_TIMEOUT")) {
        setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
        execv("/proc/self/exe", argv);
        perror("bench_gemm: execv");
        return 1;
    }
    BENCH_CHECK(dt__cpu_pool_open(2, true, true, &pool));
    fprintf(stderr, "OpenBLAS core %s; row tiles: sgemm %d, dgemm %d; pool dispatch %.2f us\n",
            openblas_get_corename(), dt__cpu_gemm_tile(4), dt__cpu_gemm_tile(8), dispatch() * 1e6);
    if (all || !strcmp(set, "gpt2") || !strcmp(set, "small")) {
        printf("shape,batch,m,n,k,ta,tb,plan,parts");
        for (int q = 0; q < METHODS; q++)
            printf(",%s_ms,%s_gflops,%s_crit_ms", names[q], names[q], names[q]);
        printf(",split_vs_blas2,split_vs_blas1,crit_blas1_vs_split\n");
    }
    if (all || !strcmp(set, "gpt2")) {
        /* forward: x [512, 768] times W; the tied logits against the embedding [50304, 768] */
        shape("qkv", 1, 512, 2304, 768, false, false, reps);
        shape("proj", 1, 512, 768, 768, false, false, reps);
        shape("mlp_up", 1, 512, 3072, 768, false, false, reps);
        shape("mlp_down", 1, 512, 768, 3072, false, false, reps);
        shape("logits", 1, 512, 50304, 768, false, true, reps);
        /* input gradients: dy W^T */
        shape("dx_qkv", 1, 512, 768, 2304, false, true, reps);
        shape("dx_mlp_up", 1, 512, 768, 3072, false, true, reps);
        shape("dx_logits", 1, 512, 768, 50304, false, false, reps);
        /* weight gradients: x^T dy */
        shape("dw_qkv", 1, 768, 2304, 512, true, false, reps);
        shape("dw_mlp_down", 1, 3072, 768, 512, true, false, reps);
        shape("dw_embedding", 1, 50304, 768, 512, true, false, reps);
        /* batched: 4 sequences' [128, 768] x [768, 768] */
        shape("batch4", 4, 128, 768, 768, false, false, reps);
        shape("batch3", 3, 128, 768, 768, false, false, reps);
    }
    if (all || !strcmp(set, "small")) {
        /* the GPT example (d_model 64, 128 tokens, MLP 256) and square products */
        shape("gpt_proj", 1, 128, 64, 64, false, false, reps * 40);
        shape("gpt_mlp_up", 1, 128, 256, 64, false, false, reps * 40);
        shape("gpt_mlp_down", 1, 128, 64, 256, false, false, reps * 40);
        shape("gpt_dw", 1, 64, 256, 128, true, false, reps * 40);
        for (int64_t e = 48; e <= 384; e += e < 96 ? 12 : e < 192 ? 24 : 48)
            shape("square", 1, e, e, e, false, false, reps * 40);
        for (int64_t kk = 32; kk <= 512; kk *= 2)
            shape("rows512", 1, 512, 64, kk, false, false, reps * 40);
    }
    if (all || !strcmp(set, "pack"))
        packing(reps);
    dt__cpu_pool_close(pool);
    return 0;
}
