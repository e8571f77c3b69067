/* Division of 32-bit indices by a divisor fixed for a whole kernel launch, by a multiply and a
 * shift instead of a hardware division (Granlund and Montgomery's method, as GPU libraries
 * use it for index arithmetic): for 1 <= d < 2^31 the host makes s = ceil(log2 d) and
 * m = floor(2^32 (2^s - d) / d) + 1 once; then for every n < 2^31
 *     n / d = (umulhi(n, m) + n) >> s
 * exactly (the sum stays below 2^32 because n < 2^31). Plain C that nvcc compiles too: the CUDA
 * kernels' fast index paths use it, and a unit test checks it against '/' on the CPU. */
#ifndef DT_FASTDIV_H
#define DT_FASTDIV_H

#include "philox.h" /* DT__HD */

#include <stdint.h>

typedef struct dt__div32 {
    uint32_t d, m, s;
} dt__div32;

/* The multiplier and shift of d (1 <= d < 2^31). */
DT__HD dt__div32 dt__div32_of(uint32_t d)
{
    uint32_t s = 0;
    while (s < 31 && ((uint32_t)1 << s) < d)
        s++;
    uint64_t m = (((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1;
    dt__div32 v = {d, (uint32_t)m, s};
    return v;
}

/* n / d for n < 2^31. */
DT__HD uint32_t dt__div32_q(dt__div32 v, uint32_t n)
{
#ifdef __CUDA_ARCH__
    uint32_t t = __umulhi(n, v.m);
#else
    uint32_t t = (uint32_t)(((uint64_t)n * v.m) >> 32);
#endif
    return (t + n) >> v.s;
}

#endif /* DT_FASTDIV_H */
