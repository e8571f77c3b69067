/* Intra-op threads of a CPU device (backends/cpu/pool.h).
 *
 * A job is posted by bumping `generation` under `lock`; every helper runs its range (or none)
 * of each generation and then counts down `remaining`, so the caller knows no helper reads the
 * job once it reaches zero. Waiting polls briefly first when the threads have cores of their
 * own (a futex wake-up costs tens of microseconds, as long as a small kernel), then sleeps. */
#include "pool.h"
#include "spin.h"

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

dt__cpu_gemm_split dt__cpu_gemm_plan(const dt__kctx *x, int64_t batch, int64_t m, int64_t n,
                                     int64_t kk)
{
    dt__cpu_gemm_split one = {1, DT__CPU_GEMM_BATCH, batch};
    if (!x->pool || !x->pool->gemm)
        return one;
    double work = (double)batch * (double)m * (double)n * (double)kk;
    int parts = work / DT__CPU_GEMM_MIN < x->pool->threads ? (int)(work / DT__CPU_GEMM_MIN)
                                                           : x->pool->threads;
    if (parts < 2)
        return one;
    if (batch >= parts)
        return (dt__cpu_gemm_split){parts, DT__CPU_GEMM_BATCH, batch};
    dt__cpu_gemm_split s = {parts, DT__CPU_GEMM_ROWS, m / DT__CPU_GEMM_UNIT};
    if (s.units < parts)
        s.parts = (int)s.units;
    return s.parts < 2 ? one : s;
}
