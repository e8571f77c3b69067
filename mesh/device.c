/* Local devices: accounted allocation and one worker thread per device. */
#include "dt.h"

#include <sched.h>
#include <stdint.h>
#include <time.h>

/* Completion of one dt__devices_run: `remaining` is decremented under `lock`, so a caller that
 * saw it reach zero and then took the lock once knows no worker touches the record again. */
struct dt__join {
    pthread_mutex_t lock;
    pthread_cond_t done;
    atomic_int remaining;
};

/* How long a thread polls before it sleeps on a condition variable. A futex wake-up costs
 * tens of microseconds (more when the core is shared), which small collectives cannot hide;
 * polling is only done when every worker has a core of its own (dt__device.spin). */
#define DT__SPIN_NS 50000

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Poll `flag` until it is true or DT__SPIN_NS have passed; true when it was seen set. */
static bool spin_until_set(const atomic_bool *flag)
{
    double end = now_ns() + DT__SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(flag, memory_order_acquire))
                return true;
            cpu_relax();
        }
        if (now_ns() > end)
            return false;
        sched_yield(); /* a thread we wait for may share this core */
    }
}

static bool spin_until_zero(atomic_int *v)
{
    double end = now_ns() + DT__SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(v, memory_order_acquire) == 0)
                return true;
            cpu_relax();
        }
        if (now_ns() > end)
            return false;
        sched_yield(); /* a thread we wait for may share this core */
    }
}

static atomic_size_t fail_over = SIZE_MAX;

void dt__device_fail_allocs_over(size_t bytes)
{
    atomic_store(&fail_over, bytes);
}

dt_status dt__device_alloc(dt__device *d, size_t bytes, void **out)
{
    *out = NULL;
    if (bytes > atomic_load(&fail_over))
        return dt__fail(DT_ERR_NOMEM, "%s:%d: cannot allocate %zu bytes (test hook)",
                        dt_device_type_name(d->type), d->local_index, bytes);
    DT_TRY(d->backend->alloc(d, bytes, out));
    size_t now = atomic_fetch_add(&d->bytes_current, bytes) + bytes;
    size_t peak = atomic_load(&d->bytes_peak);
    while (now > peak && !atomic_compare_exchange_weak(&d->bytes_peak, &peak, now))
        ;
    return DT_OK;
}

void dt__device_free(dt__device *d, void *p, size_t bytes)
{
    if (!p)
        return;
    d->backend->free(d, p);
    atomic_fetch_sub(&d->bytes_current, bytes);
}

static void join_one(struct dt__join *j)
{
    pthread_mutex_lock(&j->lock);
    if (atomic_fetch_sub_explicit(&j->remaining, 1, memory_order_acq_rel) == 1)
        pthread_cond_signal(&j->done);
    pthread_mutex_unlock(&j->lock);
}

void *dt__device_worker(void *arg)
{
    dt__device *d = arg;
    for (;;) {
        if (d->spin)
            spin_until_set(&d->posted);
        pthread_mutex_lock(&d->lock);
        while (!d->task && !d->stop)
            pthread_cond_wait(&d->wake, &d->lock);
        if (!d->task) {
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
        dt__task_fn fn = d->task;
        void *task_arg = d->task_arg;
        int index = d->task_index;
        struct dt__join *j = d->join;
        d->task = NULL;
        atomic_store_explicit(&d->posted, false, memory_order_relaxed);
        pthread_mutex_unlock(&d->lock);
        fn(d, index, task_arg);
        join_one(j);
    }
}

/* Post fn to devices[first..n) and, when `here`, run index 0 on the caller; wait for all. */
static void run_on(dt__device *const devices[], int n, dt__task_fn fn, void *arg, bool here)
{
    int first = here ? 1 : 0;
    struct dt__join j;
    pthread_mutex_init(&j.lock, NULL);
    pthread_cond_init(&j.done, NULL);
    atomic_init(&j.remaining, n - first);
    for (int i = first; i < n; i++) {
        dt__device *d = devices[i];
        pthread_mutex_lock(&d->lock);
        d->task = fn;
        d->task_arg = arg;
        d->task_index = i;
        d->join = &j;
        atomic_store_explicit(&d->posted, true, memory_order_release);
        pthread_cond_signal(&d->wake);
        pthread_mutex_unlock(&d->lock);
    }
    if (here)
        fn(devices[0], 0, arg);
    if (devices[n - 1]->spin)
        spin_until_zero(&j.remaining);
    pthread_mutex_lock(&j.lock);
    while (atomic_load_explicit(&j.remaining, memory_order_acquire) > 0)
        pthread_cond_wait(&j.done, &j.lock);
    pthread_mutex_unlock(&j.lock);
    pthread_mutex_destroy(&j.lock);
    pthread_cond_destroy(&j.done);
}

void dt__devices_run(dt__device *const devices[], int n, dt__task_fn fn, void *arg)
{
    /* No device (a client owning none of a mesh's devices): nothing to run. One device: run
     * on the caller, no hand-off cost (eager ops on tiny tensors). */
    if (n < 1)
        return;
    if (n == 1) {
        fn(devices[0], 0, arg);
        return;
    }
    run_on(devices, n, fn, arg, false);
}

void dt__devices_run_here(dt__device *const devices[], int n, dt__task_fn fn, void *arg)
{
    if (n < 1)
        return;
    if (n == 1) {
        fn(devices[0], 0, arg);
        return;
    }
    run_on(devices, n, fn, arg, true);
}
