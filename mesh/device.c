/* Local devices: accounted allocation and one worker thread per device. */
#include "dt.h"
#include "spin.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Poll `flag` until it is true or DT__SPIN_NS have passed; true when it was seen set. */
static bool spin_until_set(const atomic_bool *flag)
{
    double end = dt__now_ns() + DT__SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(flag, memory_order_acquire))
                return true;
            dt__cpu_relax();
        }
        if (dt__now_ns() > end)
            return false;
        sched_yield(); /* a thread we wait for may share this core */
    }
}

static bool spin_until_zero(atomic_int *v)
{
    double end = dt__now_ns() + DT__SPIN_NS;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(v, memory_order_acquire) == 0)
                return true;
            dt__cpu_relax();
        }
        if (dt__now_ns() > end)
            return false;
        sched_yield(); /* a thread we wait for may share this core */
    }
}

static atomic_size_t fail_over = SIZE_MAX;

void dt__device_fail_allocs_over(size_t bytes)
{
    atomic_store(&fail_over, bytes);
}

/* ---- caching allocator ----------------------------------------------------------------- */

/* Size classes: 256 bytes, then four steps per doubling (2^e times 1.25, 1.5, 1.75, 2), so a
 * block is at most 25% larger than asked and repeated shapes land in the same class. Above
 * SIZE_MAX / 4 nothing is cached (the system would refuse such a block anyway). */
#define DT__CLASS_MIN 256u

static int size_class(size_t bytes, size_t *size)
{
    if (bytes <= DT__CLASS_MIN) {
        *size = DT__CLASS_MIN;
        return 0;
    }
    if (bytes > SIZE_MAX / 4) {
        *size = bytes;
        return -1;
    }
    int e = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^e < bytes <= 2^(e+1) */
    size_t base = (size_t)1 << e, step = base / 4;
    size_t q = (bytes - base + step - 1) / step; /* 1..4 */
    *size = base + q * step;
    return (e - 8) * 4 + (int)q;
}

/* The size of class cls > 0 is 2^e + q 2^(e-2) with cls = 4 (e - 8) + q, q in 1..4. */
static size_t class_size(int cls)
{
    if (cls == 0)
        return DT__CLASS_MIN;
    int e = (cls - 1) / 4 + 8, q = (cls - 1) % 4 + 1;
    return ((size_t)1 << e) + (size_t)q * ((size_t)1 << (e - 2));
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* A cached host block is poisoned, so a use after dt__device_free is still caught. */
static void poison(const dt__device *d, void *p, size_t size, bool on)
{
    if (!d->backend->host_accessible)
        return;
    if (on)
        ASAN_POISON_MEMORY_REGION(p, size);
    else
        ASAN_UNPOISON_MEMORY_REGION(p, size);
}
#else
static void poison(const dt__device *d, void *p, size_t size, bool on)
{
    (void)d, (void)p, (void)size, (void)on;
}
#endif

static void *cache_take(dt__device *d, int cls, size_t size)
{
    void *p = NULL;
    pthread_mutex_lock(&d->cache_lock);
    dt__cached *c = d->cache[cls];
    if (c) {
        d->cache[cls] = c->next;
        d->bytes_cached -= size;
        p = c->p;
    }
    pthread_mutex_unlock(&d->cache_lock);
    if (c) {
        free(c);
        poison(d, p, size, false);
    }
    return p;
}

void dt__device_release_cache(dt__device *d)
{
    pthread_mutex_lock(&d->cache_lock);
    for (int cls = 0; cls < DT__SIZE_CLASSES; cls++) {
        while (d->cache[cls]) {
            dt__cached *c = d->cache[cls];
            d->cache[cls] = c->next;
            poison(d, c->p, class_size(cls), false);
            d->backend->free(d, c->p);
            free(c);
        }
    }
    d->bytes_reserved -= d->bytes_cached;
    d->bytes_cached = 0;
    pthread_mutex_unlock(&d->cache_lock);
}

dt_status dt__device_alloc(dt__device *d, size_t bytes, void **out)
{
    *out = NULL;
    DT_TRY(dt__device_alive(d));
    if (bytes > atomic_load(&fail_over))
        return dt__fail(DT_ERR_NOMEM, "%s:%d: cannot allocate %zu bytes (test hook)",
                        dt_device_type_name(d->type), d->local_index, bytes);
    size_t size;
    int cls = size_class(bytes, &size);
    void *p = cls >= 0 ? cache_take(d, cls, size) : NULL;
    if (!p) {
        dt_status s = d->backend->alloc(d, size, &p);
        if (s != DT_OK) {
            /* What the cache holds may be what is missing: give it back and try once more. */
            dt__device_release_cache(d);
            DT_TRY(d->backend->alloc(d, size, &p));
        }
        pthread_mutex_lock(&d->cache_lock);
        d->bytes_reserved += size;
        d->system_allocs++;
        pthread_mutex_unlock(&d->cache_lock);
    }
    *out = p;
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
    /* Stream-aware: while a device collective may still use d's buffers on a side stream,
     * the block is handed back only once d's compute stream, where it will be reused, waits
     * for that side stream (a failure there marks the device dead: nothing runs on it). */
    dt__device *side = atomic_exchange(&d->fence, NULL);
    if (side && d->backend->dev->after_side(d, side) != DT_OK)
        dt__device_kill(d);
    atomic_fetch_sub(&d->bytes_current, bytes);
    size_t size;
    int cls = size_class(bytes, &size);
    dt__cached *c = cls >= 0 ? malloc(sizeof *c) : NULL;
    if (!c) {
        d->backend->free(d, p);
        pthread_mutex_lock(&d->cache_lock);
        d->bytes_reserved -= size;
        pthread_mutex_unlock(&d->cache_lock);
        return;
    }
    poison(d, p, size, true);
    c->p = p;
    pthread_mutex_lock(&d->cache_lock);
    c->next = d->cache[cls];
    d->cache[cls] = c;
    d->bytes_cached += size;
    pthread_mutex_unlock(&d->cache_lock);
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

/* Post fn to devices[first..n) and, when `here`, run index 0 on the caller; wait for all.
 * One thread posts at a time: every caller holds the API lock (common/dt.h), so a device's
 * one task slot is free whenever a task is posted (two threads posting at once overwrote each
 * other's tasks, and the members of one collective would wait for tasks that never came). */
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
