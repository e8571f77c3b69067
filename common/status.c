/* Status codes, the per-thread error message, the API lock, the version, and the names of the
 * reduction ops and device types. */
#include "dt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char dt__error[1024];

/* ---- the API lock ------------------------------------------------------------------------- */

static pthread_mutex_t api_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static _Thread_local int api_held; /* levels this thread holds */

void dt__api_lock(void)
{
    pthread_mutex_lock(&api_lock);
    api_held++;
}

void dt__api_unlock(void)
{
    api_held--;
    pthread_mutex_unlock(&api_lock);
}

int dt__api_suspend(void)
{
    int held = api_held;
    while (api_held > 0)
        dt__api_unlock();
    return held;
}

void dt__api_resume(int held)
{
    for (int i = 0; i < held; i++)
        dt__api_lock();
}

dt_status dt__fail(dt_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dt__error, sizeof dt__error, fmt, ap);
    va_end(ap);
    if (getenv("DTENSOR_LOG") && strcmp(getenv("DTENSOR_LOG"), "debug") == 0)
        fprintf(stderr, "dtensor: %s: %s\n", dt_status_name(s), dt__error);
    return s;
}

void dt__set_error(const char *msg)
{
    snprintf(dt__error, sizeof dt__error, "%s", msg);
}

const char *dt_last_error(void)
{
    return dt__error;
}

const char *dt_status_name(dt_status s)
{
    static const char *const names[] = {
#define NAME(name, desc) [DT_##name] = "DT_" #name,
        DT_STATUS_LIST(NAME)
#undef NAME
    };
    return (unsigned)s < DT_STATUS_COUNT ? names[s] : "DT_UNKNOWN_STATUS";
}

const char *dt_status_string(dt_status s)
{
    static const char *const descs[] = {
#define DESC(name, desc) [DT_##name] = desc,
        DT_STATUS_LIST(DESC)
#undef DESC
    };
    return (unsigned)s < DT_STATUS_COUNT ? descs[s] : "unknown status";
}

#ifndef DT_VERSION
#define DT_VERSION "unknown"
#endif
const char *dt_version(void)
{
    return DT_VERSION;
}

const char *dt_reduce_op_name(dt_reduce_op op)
{
    static const char *const names[] = {
#define RNAME(NAME, name) [DT_REDUCE_##NAME] = #name,
        DT_REDUCE_LIST(RNAME)
#undef RNAME
    };
    return (unsigned)op < DT_REDUCE_COUNT ? names[op] : "?";
}

const char *dt_device_type_name(dt_device_type t)
{
    switch (t) {
    case DT_DEVICE_CPU:
        return "CPU";
    case DT_DEVICE_CUDA:
        return "CUDA";
    default:
        return "?";
    }
}
