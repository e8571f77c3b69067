/* Intra-op threads of a CPU device: the device's worker and (threads - 1) helpers split one
 * kernel's rows or elements in contiguous ranges. Each output element is computed by the same
 * code in the same order as on one thread, so results are bit for bit those of one thread. */
#ifndef DT_CPU_POOL_H
#define DT_CPU_POOL_H

#include "dt.h"

typedef struct dt__cpu_pool dt__cpu_pool;

/* A pool of `threads` (the caller counts as one; threads - 1 helpers are started). spin: the
 * helpers poll briefly for work before sleeping (only when every thread has a core). gemm: the
 * pool splits gemms too (OpenBLAS runs one thread a call; backends/cpu/backend.c decides). */
dt_status dt__cpu_pool_open(int threads, bool spin, bool gemm, dt__cpu_pool **out);
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
 * one thread. A reduction whose kept rows are fewer than the threads also splits the kept
 * columns after its run (the kernel reads a chunk with the row's stride, k->lda). */
void dt__cpu_split_reduce(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                          const void *const in[], void *out, size_t ss);
/* A reduction's split over columns: the chunk of `inner` kept columns after its reduced run
 * that a unit takes (a multiple of DT__CPU_COLUMNS; `inner` itself: columns not split) when
 * its `rows` (kept rows before the run) are fewer than the threads `work` may use. Each output
 * is still one unit's, summed in input order. */
#define DT__CPU_COLUMNS 64
int64_t dt__cpu_column_chunk(const dt__kctx *x, int64_t work, int64_t rows, int64_t inner);
void dt__cpu_split_softmax(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                           const void *const in[], void *out, size_t ss, size_t cs);
void dt__cpu_split_norm(const dt__kctx *x, dt__cpu_loop fn, const dt__kargs *k,
                        const void *const in[], void *out, size_t ss, size_t cs);

/* ---- gemm split over the pool (backends/cpu/split.c) ---- */

/* One BLAS call, row-major, alpha 1 and beta 0: C (m x n, leading dimension ldc) = op(A) op(B),
 * op(A) m x kk and op(B) kk x n, A and B stored with leading dimensions lda and ldb. */
typedef void (*dt__cpu_gemm_call)(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const void *A,
                                  int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc);

/* How a gemm splits: `parts` ranges of `units` (parts 1: one call a batch entry on the caller):
 * batch entries (units = batch), or the output's rows in every entry (units = parts, one part a
 * unit) cut on multiples of `tile` rows as evenly as the tile allows (512 rows on a 12-row tile
 * in two parts: 252 and 260), whichever leaves the largest part the fewer rows (batch entries on
 * a tie). Results are bit for bit those of one single-threaded call: each batch entry is its own
 * call, and OpenBLAS computes an output row the same way wherever a call's rows start, provided
 * the part starts on a multiple of its kernel's row tile (dt__cpu_gemm_tile). Columns are never
 * split: sgemm's results there depend on where a call's columns start. (OpenBLAS's own threads
 * split both, so a call on several of them differs from one thread in the last bits.) Not split:
 * below DT__CPU_GEMM_MIN multiply-adds a part, fewer than two tiles of rows and one batch entry,
 * a pool without gemm. DT__CPU_GEMM_MIN: a part is then at least about 15 us of one core's
 * sgemm here; splitting a call's rows pays in compute from well below that (benchmarks/bench_gemm:
 * the largest part's CPU time 0.5-0.6 of one call's from 2^18 multiply-adds a part), so what
 * bounds it is the dispatch: under a microsecond to a helper still polling, tens of microseconds
 * to one asleep, which a part of this size repays. */
#define DT__CPU_GEMM_MIN (1 << 19)
enum { DT__CPU_GEMM_BATCH, DT__CPU_GEMM_ROWS };
typedef struct {
    int parts, axis, tile;
    int64_t units;
} dt__cpu_gemm_split;
dt__cpu_gemm_split dt__cpu_gemm_plan(const dt__kctx *x, size_t esz, int64_t batch, int64_t m,
                                     int64_t n, int64_t kk);

/* The row tile of the OpenBLAS gemm kernel in use for elements of esz bytes (4: sgemm, 8:
 * dgemm): the cores measured (Haswell and Zen: 12 rows for sgemm, 2 for dgemm) from
 * openblas_get_corename(), confirmed once a process by a probe (a small gemm of each transpose
 * cut on the tile against one call, bit for bit); DT__CPU_GEMM_TILE_ANY for other cores or a
 * failed probe (a multiple of every tile measured: 1 to 12 rows on OpenBLAS's x86-64 cores). */
#define DT__CPU_GEMM_TILE_ANY 48
int dt__cpu_gemm_tile(size_t esz);
/* The first output row of rows part i (0 .. s->parts; part s->parts: m) of a split by rows. */
int64_t dt__cpu_gemm_row_cut(const dt__cpu_gemm_split *s, int64_t m, int64_t i);

/* k's gemm (batch, m, n, k, ta, tb, a_at, lda, the batch strides; C at c_at, batch entries
 * m * n apart) by `call` on elements of esz bytes, split as dt__cpu_gemm_plan says. */
void dt__cpu_gemm(const dt__kctx *x, const dt__kargs *k, dt__cpu_gemm_call call, size_t esz,
                  const void *A, const void *B, void *C);
/* The same, split as s says (at most x's pool's threads). */
void dt__cpu_gemm_as(const dt__kctx *x, const dt__kargs *k, dt__cpu_gemm_call call, size_t esz,
                     const void *A, const void *B, void *C, dt__cpu_gemm_split s);

/* Converts n contiguous elements (the 16-bit floats' widening and rounding). */
typedef void (*dt__cpu_convert_fn)(const void *src, void *dst, int64_t n);

/* fn on `entries` x `rows` rows of `cols` elements: source row r of entry e at
 * (e * entry_stride + r * ld) elements of ssz bytes, written packed (row e * rows + r of dst,
 * elements of dsz bytes); split over the rows like an elementwise kernel. */
void dt__cpu_convert_rows(const dt__kctx *x, dt__cpu_convert_fn fn, int64_t entries, int64_t rows,
                          int64_t cols, const void *src, int64_t ld, int64_t entry_stride,
                          size_t ssz, void *dst, size_t dsz);

#endif
