/* What threads polling for one another use: a monotonic clock in nanoseconds and the CPU's
 * spin-wait hint (a pause instruction on x86, nothing elsewhere). */
#ifndef DT_SPIN_H
#define DT_SPIN_H

#include <time.h>

static inline double dt__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

static inline void dt__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#endif
