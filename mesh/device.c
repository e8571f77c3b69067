/* Local devices: accounted allocation and one worker thread per device. */
#include "dt.h"

struct dt__join {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int remaining;
};

dt_status dt__device_alloc(dt__device *d, size_t bytes, void **out)
{
    *out = NULL;
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
    if (--j->remaining == 0)
        pthread_cond_signal(&j->done);
    pthread_mutex_unlock(&j->lock);
}

void *dt__device_worker(void *arg)
{
    dt__device *d = arg;
    for (;;) {
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
        pthread_mutex_unlock(&d->lock);
        fn(d, index, task_arg);
        join_one(j);
    }
}

void dt__devices_run(dt__device *const devices[], int n, dt__task_fn fn, void *arg)
{
    /* One device: run on the caller, no hand-off cost (eager ops on tiny tensors). */
    if (n == 1) {
        for (int i = 0; i < n; i++)
            fn(devices[i], i, arg);
        return;
    }
    struct dt__join j = {.remaining = n};
    pthread_mutex_init(&j.lock, NULL);
    pthread_cond_init(&j.done, NULL);
    for (int i = 0; i < n; i++) {
        dt__device *d = devices[i];
        pthread_mutex_lock(&d->lock);
        d->task = fn;
        d->task_arg = arg;
        d->task_index = i;
        d->join = &j;
        pthread_cond_signal(&d->wake);
        pthread_mutex_unlock(&d->lock);
    }
    pthread_mutex_lock(&j.lock);
    while (j.remaining > 0)
        pthread_cond_wait(&j.done, &j.lock);
    pthread_mutex_unlock(&j.lock);
    pthread_mutex_destroy(&j.lock);
    pthread_cond_destroy(&j.done);
}
