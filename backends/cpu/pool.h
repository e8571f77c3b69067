/* Intra-op threads of a CPU device: the device's worker and (threads - 1) helpers split one
 * kernel's rows or elements in contiguous ranges. Each output element is computed by the same
 * code in the same order as on one thread, so results are bit for bit those of one thread. */
#ifndef DT_CPU_POOL_H
#define DT_CPU_POOL_H

#include "dt.h"

typedef struct dt__cpu_pool dt__cpu_pool;

/* A pool of `threads` (the caller counts as one; threads - 1 helpers are started). spin: the
 * helpers poll briefly for work before sleeping (only when every thread has a core). */
dt_status dt__cpu_pool_open(int threads, bool spin, dt__cpu_pool **out);
/* Stops and joins the helpers; NULL is a no-op. */
void dt__cpu_pool_close(dt__cpu_pool *p);

/* The body of a loop over [lo, hi) of a range. */
typedef void (*dt__cpu_range_fn)(void *arg, int64_t lo, int64_t hi);

/* fn over [0, n) in `parts` contiguous ranges (at most the pool's threads), the calling
 * thread taking the first; returns when every range is done. One caller at a time (the
 * device's worker). A NULL pool, or parts < 2, runs fn(arg, 0, n) here. */
void dt__cpu_pool_run(dt__cpu_pool *p, int64_t n, int parts, dt__cpu_range_fn fn, void *arg);

/* How many ranges a kernel doing `work` element-steps over `n` units (rows, elements) is split
 * into on x's pool: none (1) below DT__CPU_PARALLEL_MIN element-steps a thread. */
#define DT__CPU_PARALLEL_MIN 16384
int dt__cpu_parts(const dt__kctx *x, int64_t work, int64_t n);

/* ---- kernels split over the pool (backends/cpu/split.c) ---- */

/* A kernel's loop on one device, as in the table but without the context. */
typedef void (*dt__cpu_loop)(const dt__kargs *k, const void *const in[], void *out);

/* An elementwise kernel (unary, binary, cast, where): out (element size osz) from nin operands
 * broadcast to its shape (element sizes isz), split along the leading axes that every operand
 * either has whole or broadcasts. */
void dt__cpu_elementwise(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k, int nin,
                         const size_t isz[], size_t osz, const void *const in[], void *out);

/* fn on a view v whose axis 0 (v->shape[0] units) is split: each range runs fn on v with axis
 * 0 of the output and of each operand that steps along it (in_step[q] bytes a unit, 0:
 * repeated) cut to the range, operands and output advanced to its start. work: the
 * element-steps of the whole call. */
void dt__cpu_rows(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *v, int64_t work, int nin,
                  const size_t in_step[], size_t out_step, const void *const in[], void *out);

/* The row kernels' splits (fn: the kernel's loop; ss, cs: the sizes of its storage and compute
 * types): reductions over a contiguous run of axes by their kept leading rows, softmax's steps
 * by the rows around its axes, norms by the rows before the last axis. Other views run fn on
 * one thread. */
void dt__cpu_split_reduce(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                          const void *const in[], void *out, size_t ss);
void dt__cpu_split_softmax(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                           const void *const in[], void *out, size_t ss, size_t cs);
void dt__cpu_split_norm(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                        const void *const in[], void *out, size_t ss, size_t cs);

#endif
