/* Intra-op threads of a CPU device (backends/cpu/pool.h).
 *
 * A job is posted by bumping `generation` under `lock`; every helper runs its range (or none)
 * of each generation and then counts down `remaining`, so the caller knows no helper reads the
 * job once it reaches zero. Waiting polls briefly first when the threads have cores of their
 * own (a futex wake-up costs tens of microseconds, as long as a small kernel), then sleeps. */
#include "pool.h"
#include "spin.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POOL_SPIN_NS 50000

struct dt__cpu_pool {
    int threads;
    bool spin, gemm;
    pthread_t *helpers;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    atomic_uint generation; /* bumped under lock for each job (and to stop) */
    atomic_int remaining;   /* helpers still in the current job */
    bool stop;
    /* the current job, written under lock before generation moves */
    dt__cpu_range_fn fn;
    void *arg;
    int64_t n;
    int parts;
};

typedef struct {
    dt__cpu_pool *p;
    int index; /* 1 .. threads - 1 */
} helper_arg;

/* Range `part` of `parts` over [0, n): contiguous, sizes differing by at most one. */
static void range_of(int64_t n, int parts, int part, int64_t *lo, int64_t *hi)
{
    *lo = n / parts * part + (part < n % parts ? part : n % parts);
    *hi = *lo + n / parts + (part < n % parts ? 1 : 0);
}

/* Poll until generation differs from seen or the spin time is over. */
static void spin_for_job(dt__cpu_pool *p, unsigned seen)
{
    double end = dt__now_ns() + POOL_SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen)
                return;
            dt__cpu_relax();
        }
        if (dt__now_ns() > end)
            return;
        sched_yield();
    }
}

static void *helper_main(void *arg)
{
    helper_arg *h = arg;
    dt__cpu_pool *p = h->p;
    int index = h->index;
    free(h);
    unsigned seen = 0;
    for (;;) {
        if (p->spin)
            spin_for_job(p, seen);
        pthread_mutex_lock(&p->lock);
        while (atomic_load_explicit(&p->generation, memory_order_relaxed) == seen)
            pthread_cond_wait(&p->wake, &p->lock);
        seen = atomic_load_explicit(&p->generation, memory_order_relaxed);
        bool stop = p->stop;
        dt__cpu_range_fn fn = p->fn;
        void *fn_arg = p->arg;
        int64_t n = p->n;
        int parts = p->parts;
        pthread_mutex_unlock(&p->lock);
        if (stop)
            return NULL;
        if (index < parts) {
            int64_t lo, hi;
            range_of(n, parts, index, &lo, &hi);
            fn(fn_arg, lo, hi);
        }
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static void pool_stop(dt__cpu_pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->helpers[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->helpers);
    free(p);
}

dt_status dt__cpu_pool_open(int threads, bool spin, bool gemm, dt__cpu_pool **out)
{
    *out = NULL;
    dt__cpu_pool *p = calloc(1, sizeof *p);
    pthread_t *helpers = calloc((size_t)(threads > 1 ? threads - 1 : 1), sizeof *helpers);
    if (!p || !helpers) {
        free(p);
        free(helpers);
        return dt__fail(DT_ERR_NOMEM, "CPU: cannot allocate a pool of %d kernel threads", threads);
    }
    p->threads = threads;
    p->spin = spin;
    p->gemm = gemm;
    p->helpers = helpers;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->remaining, 0);
    for (int i = 1; i < threads; i++) {
        helper_arg *h = malloc(sizeof *h);
        if (h)
            *h = (helper_arg){.p = p, .index = i};
        int e = h ? pthread_create(&helpers[i - 1], NULL, helper_main, h) : ENOMEM;
        if (e) {
            free(h);
            pool_stop(p);
            return dt__fail(DT_ERR_DEVICE, "CPU: cannot start kernel thread %d of %d: %s", i,
                            threads, strerror(e));
        }
        p->started++;
    }
    *out = p;
    return DT_OK;
}

void dt__cpu_pool_close(dt__cpu_pool *p)
{
    if (p)
        pool_stop(p);
}

void dt__cpu_pool_run(dt__cpu_pool *p, int64_t n, int parts, dt__cpu_range_fn fn, void *arg)
{
    if (p && parts > p->threads)
        parts = p->threads;
    if (!p || parts < 2 || n < 2) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->parts = parts;
    atomic_store_explicit(&p->remaining, p->threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    int64_t lo, hi;
    range_of(n, parts, 0, &lo, &hi);
    fn(arg, lo, hi);
    if (p->spin) {
        double end = dt__now_ns() + POOL_SPIN_NS;
        while (atomic_load_explicit(&p->remaining, memory_order_acquire) > 0 && dt__now_ns() < end)
            for (int i = 0; i < 64; i++)
                dt__cpu_relax();
    }
    pthread_mutex_lock(&p->lock);
    while (atomic_load_explicit(&p->remaining, memory_order_acquire) > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

int dt__cpu_parts(const dt__kctx *x, int64_t work, int64_t n)
{
    if (!x->pool || n < 2)
        return 1;
    int64_t parts = work / DT__CPU_PARALLEL_MIN;
    if (parts > x->pool->threads)
        parts = x->pool->threads;
    if (parts > n)
        parts = n;
    return parts < 2 ? 1 : (int)parts;
}

/* ---- gemm's row tile ---------------------------------------------------------------------- */

/* OpenBLAS's cores whose gemm row tiles were measured (every cut of a call's rows against one
 * call, bit for bit, OpenBLAS 0.3.21; its Zen target runs the Haswell kernels). */
static const struct {
    const char *core;
    int tile_s, tile_d;
} known_tiles[] = {{"Haswell", 12, 2}, {"Zen", 12, 2}};

static int gemm_tiles[2] = {DT__CPU_GEMM_TILE_ANY, DT__CPU_GEMM_TILE_ANY}; /* sgemm, dgemm */
static pthread_once_t gemm_tiles_once = PTHREAD_ONCE_INIT;

/* Whether every output row of op(A) op(B) (m x n, kk, transposes ta and tb; elements of esz
 * bytes, deterministic values) comes out the same from one call and from calls on rows cut at
 * each multiple of tile. Under 2^18 multiply-adds for the tiles in the table, a size OpenBLAS
 * runs on one thread whatever its thread count. */
static bool tile_holds(size_t esz, int tile, bool ta, bool tb)
{
    enum { n = 37, kk = 131 };
    int64_t m = 3 * tile + 5, lda = ta ? m : kk, ldb = tb ? kk : n;
    /* A [m * kk] then B [kk * n] in a, C of one call in c, of the cut calls after it */
    unsigned char *a = malloc(esz * (size_t)((m + n) * kk)), *c = malloc(esz * (size_t)(2 * m * n));
    bool same = false;
    if (a && c) {
        uint64_t r = 0x9e3779b97f4a7c15u;
        for (int64_t i = 0; i < (m + n) * kk; i++) {
            r = r * 6364136223846793005u + 1442695040888963407u;
            double v = (double)(r >> 11) * 0x1p-50 - 4.0; /* [-4, 4), bits past f32's */
            if (esz == 4)
                ((float *)a)[i] = (float)v;
            else
                ((double *)a)[i] = v;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int64_t r0 = 0, r1; r0 < m; r0 = r1) {
                r1 = pass == 0 ? m : r0 + tile < m ? r0 + tile : m;
                size_t ao = (size_t)(ta ? r0 : r0 * lda), bo = (size_t)(m * kk),
                       co = (size_t)((pass * m + r0) * n);
                CBLAS_TRANSPOSE ot = ta ? CblasTrans : CblasNoTrans,
                                tt = tb ? CblasTrans : CblasNoTrans;
                if (esz == 4)
                    cblas_sgemm(CblasRowMajor, ot, tt, (blasint)(r1 - r0), n, kk, 1,
                                (float *)a + ao, (blasint)lda, (float *)a + bo, (blasint)ldb, 0,
                                (float *)c + co, n);
                else
                    cblas_dgemm(CblasRowMajor, ot, tt, (blasint)(r1 - r0), n, kk, 1,
                                (double *)a + ao, (blasint)lda, (double *)a + bo, (blasint)ldb, 0,
                                (double *)c + co, n);
            }
        same = !memcmp(c, c + esz * (size_t)(m * n), esz * (size_t)(m * n));
    }
    free(a);
    free(c);
    return same;
}

static void find_gemm_tiles(void)
{
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof known_tiles / sizeof known_tiles[0]; i++)
        if (!strcmp(core, known_tiles[i].core)) {
            int tiles[2] = {known_tiles[i].tile_s, known_tiles[i].tile_d};
            for (int d = 0; d < 2; d++) {
                bool holds = true;
                for (int t = 0; t < 4 && holds; t++)
                    holds = tile_holds(d ? 8 : 4, tiles[d], t & 1, t >> 1);
                if (holds)
                    gemm_tiles[d] = tiles[d];
            }
        }
}

int dt__cpu_gemm_tile(size_t esz)
{
    pthread_once(&gemm_tiles_once, find_gemm_tiles);
    return gemm_tiles[esz == 8];
}

/* ---- gemm's split ------------------------------------------------------------------------- */

int64_t dt__cpu_gemm_row_cut(const dt__cpu_gemm_split *s, int64_t m, int64_t i)
{
    if (i >= s->parts)
        return m;
    /* i / parts of the rows, to the nearest multiple of the tile */
    int64_t per = (int64_t)s->parts * s->tile;
    return (i * m + per / 2) / per * s->tile;
}

dt__cpu_gemm_split dt__cpu_gemm_plan(const dt__kctx *x, size_t esz, int64_t batch, int64_t m,
                                     int64_t n, int64_t kk)
{
    dt__cpu_gemm_split one = {1, DT__CPU_GEMM_BATCH, 1, batch};
    if (!x->pool || !x->pool->gemm)
        return one;
    double work = (double)batch * (double)m * (double)n * (double)kk;
    int parts = work / DT__CPU_GEMM_MIN < x->pool->threads ? (int)(work / DT__CPU_GEMM_MIN)
                                                           : x->pool->threads;
    if (parts < 2)
        return one;
    /* batch entries: the largest part has ceil(batch / parts) entries of m rows */
    int bparts = batch < parts ? (int)batch : parts;
    dt__cpu_gemm_split b = {bparts, DT__CPU_GEMM_BATCH, 1, batch};
    int64_t b_rows = (batch + bparts - 1) / bparts * m;
    /* rows: at most one part a tile; the largest part's rows in each of the batch entries */
    int tile = dt__cpu_gemm_tile(esz);
    int rparts = m / tile < parts ? (int)(m / tile) : parts;
    dt__cpu_gemm_split r = {rparts, DT__CPU_GEMM_ROWS, tile, rparts};
    int64_t r_rows = 0;
    for (int i = 0; i < rparts; i++) {
        int64_t rows = dt__cpu_gemm_row_cut(&r, m, i + 1) - dt__cpu_gemm_row_cut(&r, m, i);
        r_rows = rows > r_rows ? rows : r_rows;
    }
    r_rows *= batch;
    if (bparts >= 2 && (rparts < 2 || b_rows <= r_rows))
        return b;
    return rparts >= 2 ? r : one;
}
