/* The local-kernel interface every backend implements (internal, never installed). Plain C
 * that nvcc also compiles: the CUDA kernels include this header, never dt.h (whose C11
 * atomics C++ does not take). Global ops never reach a backend; kernels see local shapes. */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include "dtensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Record a formatted message for dt_last_error() and return s (common/status.c). */
dt_status dt__fail(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* X(NAME, name): the short list of local kernels every backend implements per dtype. */
#define DT__KERNEL_LIST(X)            \
    X(FILL, fill)                     \
    X(ARANGE, arange)                 \
    X(PHILOX_UNIFORM, philox_uniform) \
    X(PHILOX_NORMAL, philox_normal)   \
    X(UNARY, unary)                   \
    X(BINARY, binary)                 \
    X(REDUCE, reduce)                 \
    X(GEMM, gemm)                     \
    X(TRANSPOSE, transpose)           \
    X(COPY_BLOCKS, copy_blocks)       \
    X(SELECT_FILL, select_fill)       \
    X(CAST, cast)                     \
    X(WHERE, where)                   \
    X(SOFTMAX, softmax)               \
    X(NORM, norm)                     \
    X(SCAN, scan)                     \
    X(ARG_REDUCE, arg_reduce)         \
    X(ATTENTION, attention)           \
    X(FUSED, fused)                   \
    DT__KERNEL_LIST_SHAPE(X)          \
    DT__KERNEL_LIST_LOSS(X)

/* Index kernels (spmd/ops/gather.c, segment_sum.c, one_hot.c). */
#define DT__KERNEL_LIST_SHAPE(X) \
    X(GATHER, gather)            \
    X(SEGMENT_SUM, segment_sum)  \
    X(ONE_HOT, one_hot)

/* The fused loss kernels (spmd/ops/sparse_xent.c). */
#define DT__KERNEL_LIST_LOSS(X) X(XENT, xent)

typedef enum dt__kernel {
#define DT__KERNEL_ENUM(NAME, name) DT__K_##NAME,
    DT__KERNEL_LIST(DT__KERNEL_ENUM)
#undef DT__KERNEL_ENUM
        DT__KERNEL_COUNT
} dt__kernel;

const char *dt__kernel_name(dt__kernel k);

/* One block move of COPY_BLOCKS: `extent` at src_off inside a src_shape array that starts
 * src_at elements into the source buffer, to dst_off inside dst_shape at dst_at. */
typedef struct dt__block {
    int rank;
    int64_t src_at, dst_at;
    int64_t src_shape[DT_MAX_RANK], src_off[DT_MAX_RANK];
    int64_t dst_shape[DT_MAX_RANK], dst_off[DT_MAX_RANK];
    int64_t extent[DT_MAX_RANK];
} dt__block;

/* FUSED: a chain of elementwise kernels computed in one pass over its output (spmd/fuse.c
 * builds it from a traced function's UNARY, BINARY, CAST, WHERE and FILL steps). Values are
 * numbered: 0 .. nin - 1 the kernel's operands (in[], each broadcast to the output as its
 * in_shape says), nin + j the result of ops[j]; the last op's result is the output. Each op is
 * the kernel it replaces, with that kernel's arguments and table dtype, so that the fused
 * kernel computes every element exactly as the chain of kernels did (the 16-bit floats
 * rounded after each op as before). A value other than an operand has the output's shape,
 * except a FILL marked `scalar`: one element its readers broadcast. A chain may have results
 * besides its output (Adam's moments beside the new value): in[nin + e], e < nstore, is then no
 * operand but a buffer of the output's shape (packed, in the value's `out` dtype) that the
 * kernel writes value store[e] into, in the same pass; nin + nstore <= DT__FUSED_MAX_IN.
 * A chain may end in a reduction (`reduce`, on backends that say `fused_reduce`): the ops'
 * shape is then k->shape, and the output is the last op's value reduced over the axes k->mask
 * by `rop` (sum, mean, max or min) and scaled by k->a, as the REDUCE kernel computes it (each
 * output's inputs in input order); that value is never written, unless stored. */
#define DT__FUSED_MAX_OPS 24
#define DT__FUSED_MAX_IN 8

typedef struct dt__fused_op {
    dt__kernel kernel; /* DT__K_UNARY, _BINARY, _CAST, _WHERE or _FILL */
    dt_dtype dtype;    /* the kernel's table dtype (cast: the result's; binary: the operands') */
    dt_dtype out;      /* the dtype of its result (bool for comparisons) */
    dt_dtype from;     /* cast: the operand's dtype */
    int op;            /* unary and binary operator */
    double a;          /* fill: the value */
    bool scalar;       /* fill: one element, broadcast by its readers */
    int nin;           /* operands (0 to 3) */
    int arg[3];        /* their value numbers */
} dt__fused_op;

typedef struct dt__fused {
    int nin, nops;
    int nstore, store[DT__FUSED_MAX_IN]; /* values also written out: in[nin + e] gets store[e] */
    bool reduce;                         /* the chain feeds a reduction by rop */
    int rop;
    dt__fused_op ops[DT__FUSED_MAX_OPS];
} dt__fused;

/* Arguments of one kernel on one device: local shapes only (plus global offsets where an
 * element's value depends on its global index). Built at expansion time, per device. */
typedef struct dt__kargs {
    int rank;                    /* of the output */
    int64_t shape[DT_MAX_RANK];  /* output local shape */
    int64_t offset[DT_MAX_RANK]; /* global index of the output's first element */
    int64_t gshape[DT_MAX_RANK]; /* global output shape */
    int64_t in_shape[DT__FUSED_MAX_IN][DT_MAX_RANK]; /* operands, aligned to `rank` (1 =
                                                        broadcast) */
    int op;                                          /* unary / binary / reduce operator */
    dt_dtype from;                          /* cast: the operand's dtype (the table's is the
                                               result's) */
    double a, b;                            /* fill value; arange start, step; random
                                               bounds or mean, stddev; reduce scale */
    uint64_t seed, key;                     /* Philox key (seed) and counter high word (op key) */
    unsigned mask;                          /* reduce: local axes reduced */
    int perm[DT_MAX_RANK];                  /* transpose: out axis i = in axis perm[i] */
    int64_t batch, m, n, k;                 /* gemm: batch count and matrix extents */
    int64_t a_batch_stride, b_batch_stride; /* 0 broadcasts an operand over the batch */
    /* gemm on a block of rows of op(A) into rows of a larger C (a chunked matmul): op(A)
     * starts a_at elements into the operand and C c_at elements into the output; lda is A's
     * leading dimension as stored (0: packed, m when transposed, else k) */
    int64_t a_at, c_at, lda;
    bool ta, tb;       /* gemm transposes */
    bool select;       /* select_fill: true copies, false fills with a */
    int nblocks;       /* copy_blocks */
    dt__block *blocks; /* host memory, nblocks entries */
    int64_t out_elems; /* size of the output buffer in elements */
    /* softmax, norm, scan, arg_reduce (below) */
    int axis;      /* scan, arg_reduce: the local axis they run along */
    unsigned mode; /* DT__SOFTMAX_*, DT__NORM_*, DT__SCAN_*, DT__ARG_* (with flags) */
    int64_t start; /* scan: the shard's place in its group; arg_reduce: global index of the
                      shard's first element along the axis */
    dt_dtype to;   /* arg_reduce: the index dtype written (i32 or i64) */
    /* gather, segment_sum, one_hot: nidx indices (dtype `from`: i32, i64, u8 or i8) select
     * rows of the local range [lo, lo + rows) of a global axis, `inner` elements per row;
     * an index outside the range selects nothing (gather writes zeros). segment_sum with
     * mode DT__SEGMENT_INTO: in[2] is a base of the output's shape; a selected row is base's
     * plus its sum (formed from 0 in index order, rounded to the dtype, then added once), an
     * unselected row is base's */
    int64_t nidx, lo, rows, inner;
    const dt__fused *fused; /* FUSED: the chain (host memory, the step's) */
} dt__kargs;

/* Kernels of the row-wise ops. The table is indexed by x's dtype. "acc" is x's accumulation
 * dtype: f32 for bf16 and f16 (and f32), f64 for f64, the dtype itself for integers; the
 * statistics below are held in it so that a 16-bit tensor's sums round once, at the end.
 *
 * SOFTMAX (floating x; k->mask: the axes reduced; in_shape[0]: x's local shape; m and s have
 * x's shape with those axes of extent 1; shift(m) = m where finite, else 0, as TensorFlow's
 * reduce_logsumexp shifts):
 *   SUMEXP       in x, m (x's dtype)        out s (acc) = sum exp(x - shift(m))
 *   SOFTMAX      in x, m, s                 out y = exp(x - shift(m)) / s
 *   LOG_SOFTMAX  in x, m, s                 out y = x - shift(m) - log(s)
 *   LSE          in m, s (shape of out)     out shift(m) + log(s)
 *   MAX          in x                       out m (x's dtype) = the maximum (NaN skipped)
 * NORM (floating x, over its last axis; stats in acc, of x's shape with the last axis 1;
 * k->a: the scale of sums (1 / the global extent of the axis); k->b: epsilon):
 *   MEAN         in x                       out mu = a sum x
 *   VAR          in x, mu                   out v = a sum (x - mu)^2
 *   MEAN_SQUARE  in x                       out ms = a sum x^2
 *   LAYER        in x, mu, v[, gamma][, beta]  y = (x - mu) rsqrt(v + b) gamma + beta
 *   RMS          in x, ms[, gamma]          out y = x rsqrt(ms + b) gamma
 *   (| DT__NORM_GAMMA, DT__NORM_BETA: which of gamma, beta (x's dtype, the local extent of the
 *   last axis) follow)
 * SCAN (numeric x, along k->axis; in_shape[0]: x's local shape):
 *   TOTAL        in x                       out t (acc, axis of extent 1) = sum along the axis
 *   SCAN         in x[, totals]             out y = the running sum (| EXCLUSIVE: without the
 *                element itself; | REVERSE: from the end); with | CARRY, in_shape[1] is the
 *                totals of every shard of the group (acc, axis of extent g) and each row adds
 *                those before shard k->start (after it, when REVERSE)
 * ARG_REDUCE (any x, along k->axis; k->op: DT_REDUCE_MAX or MIN; ties to the lowest index, a
 * NaN wins (the first), as numpy's argmax):
 *   INDEX        in x                       out the index (k->to) of the extremum, plus k->start
 *   RECORDS      in x                       out per row 2 int64 words along the axis: the
 *                extremum's bits (its storage, zero-extended) and its global index (k->start
 *                added; -1 for an empty shard)
 *   MERGE        in records of g shards (in_shape[0]: axis of extent 2g, in shard order)
 *                                           out the winner's global index (k->to)
 * ATTENTION (f32, f64; q, k, v of one local shape in_shape[0] = [..., T, E], the leading axes
 * independent slices; k->a: the scale; | DT__ATTN_CAUSAL: key j only for queries i >= j):
 *   FORWARD      in q, k, v                 out y = softmax(a q k^T) v, [..., T, E]
 *   GRAD         in q, k, v, dy             out [3, ..., T, E]: dq, dk, dv
 *   Tiled with an online softmax (blocks of queries and keys): scratch of a block, never
 *   [T, T]. */
enum {
    DT__SOFTMAX_SUMEXP,
    DT__SOFTMAX_SOFTMAX,
    DT__SOFTMAX_LOG_SOFTMAX,
    DT__SOFTMAX_LSE,
    DT__SOFTMAX_MAX,
    DT__NORM_MEAN = 0,
    DT__NORM_VAR,
    DT__NORM_MEAN_SQUARE,
    DT__NORM_LAYER,
    DT__NORM_RMS,
    DT__NORM_GAMMA = 16,
    DT__NORM_BETA = 32,
    DT__SCAN_TOTAL = 0,
    DT__SCAN_SCAN,
    DT__SCAN_EXCLUSIVE = 16,
    DT__SCAN_REVERSE = 32,
    DT__SCAN_CARRY = 64,
    DT__ARG_INDEX = 0,
    DT__ARG_RECORDS,
    DT__ARG_MERGE,
    DT__ATTN_FORWARD = 0,
    DT__ATTN_GRAD,
    DT__ATTN_CAUSAL = 16,
    DT__SEGMENT_INTO = 1,
};
/* XENT, sparse softmax cross-entropy (floating logits x; rows: k->nidx rows of k->inner local
 * classes, the global classes [k->lo, k->lo + k->inner); labels: one index per row of dtype
 * k->from; statistics in acc, as SOFTMAX's; sh(m) = m where finite, else 0):
 *   STATS        in x, labels               out per row 4 values: m_local (the row's maximum,
 *                NaN skipped), sum exp(x - sh(m_local)), x[label] where the label is local
 *                (else 0), 1 where it is (else 0); one pass over x
 *   MAX          in stats                   out m: each row's m_local
 *   COMBINE      in stats, m (the maximum over every shard)
 *                                           out per row 3 values: the sum of exp rescaled to
 *                sh(m), x[label], the ownership flag (summed over the shards: 1 for a label
 *                in [0, C))
 *   LOSS         in m, combined             out sh(m) + log(sum) - x[label] (x's dtype), NaN
 *                where the flag is not 1
 *   GRAD         in x, labels, m, combined, dy (one per row, x's dtype)
 *                                           out dx = (exp(x - sh(m) - log sum) - [j == label])
 *                dy, x's shape (NaN rows where the flag is not 1); one pass over x
 * With the flag PROBS on STATS and GRAD, x holds probabilities p and the loss is Keras's of
 * probabilities, that of the logits log c for c = clip(p, eps, 1 - eps), eps = k->a (bounds in
 * the compute type): log(sum c) - log c[label], with no log or exp per element:
 *   STATS|PROBS  out per row: 0 (so sh(m) = 0 and MAX, COMBINE, LOSS run as they are), sum c,
 *                log c[label] where the label is local (else 0), the ownership flag
 *   GRAD|PROBS   out dx = [eps <= p_j <= 1 - eps] (1 / sum - [j == label] / p_j) dy (0 where
 *                the clip is active, as the clip's gradient; NaN rows where the flag is not 1) */
enum {
    DT__XENT_STATS,
    DT__XENT_MAX,
    DT__XENT_COMBINE,
    DT__XENT_LOSS,
    DT__XENT_GRAD,
    DT__XENT_PROBS = 16,
};
/* The kernel's mode without its flags. */
#define DT__MODE_KIND(m) ((m)&15u)

/* What a kernel needs of the device it runs on (embedded in the device record). */
typedef struct dt__kctx {
    const char *type; /* "CPU", "CUDA": for messages */
    int index;        /* local index among this client's devices of the type */
    int ordinal;      /* CUDA: physical GPU ordinal; CPU: bound core or -1 */
    void *stream;     /* CUDA: the device's cudaStream_t (every kernel and copy goes on it) */
    void *blas;       /* CUDA: cublasHandle_t bound to the stream */
    bool tf32;        /* CUDA: f32 gemm may use TF32 tensor cores (opt-in) */
    int sms;          /* CUDA: the GPU's multiprocessors (grids of a few waves), 0 unknown */
    /* CUDA: device scratch the kernels of this stream may use between launches (multi-block
     * reductions' partial results), scratch_bytes of it; NULL: none */
    void *scratch;
    size_t scratch_bytes;
    int cores;                 /* CPU: the cores this device owns on its host (at least 1) */
    struct dt__cpu_pool *pool; /* CPU: threads that split large kernels; NULL: one thread */
} dt__kctx;

/* Binary operators whose result is bool (one byte per element) whatever the operands' dtype;
 * the kernel table is indexed by the operands' dtype. */
#define DT__BINARY_IS_COMPARISON(op) ((op) >= DT_BINARY_EQ && (op) <= DT_BINARY_GE)

/* Operands a kernel takes at most: in[] has this many entries, NULL past the last (a fused
 * chain takes the most). */
#define DT__KERNEL_MAX_IN DT__FUSED_MAX_IN

/* One local kernel on one device. CPU kernels finish before they return; CUDA kernels are
 * enqueued on x->stream and return without waiting (a launch failure is reported here, an
 * execution failure at the next synchronisation). A failure is DT_ERR_DEVICE naming the
 * device, the kernel and the backend's message. */
typedef dt_status (*dt__kernel_fn)(const dt__kctx *x, const dt__kargs *k, const void *const in[],
                                   void *out);

/* The backends' (kernel, dtype) tables; NULL entries: the backend lacks that kernel. */
extern const dt__kernel_fn dt__cpu_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT];
/* The arithmetic of those kernels' gemm (dt__backend.gemm_math of the CPU backend and of the
 * emulated CUDA one, which runs them). */
const char *dt__cpu_gemm_math(dt_dtype dtype);
extern const dt__kernel_fn dt__cuda_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT];

/* The CPU's FUSED kernel (backends/cpu/fused.c), the row of every dtype (ops run the table's own
 * kernels). */
dt_status dt__cpu_fused(const dt__kctx *x, const dt__kargs *k, const void *const in[], void *out);

/* Combine for collectives on devices: for each i < n,
 *   v = src[0][i] op src[1][i] op ... op src[nsrc-1][i]   (left to right in the compute type,
 *                                                          as the CPU does)
 *   v = v / by when by > 1                                 (mean: the compute type's division)
 *   dst[d][i] = v for every d < ndst                       (16-bit floats rounded once)
 * With src_wide (dst_wide) the sources (destinations) of a bf16 or f16 combine hold f32: a
 * reduction widened to f32 across several steps is rounded once, at its last. Every element
 * is read from every source before it is written, so a dst may alias a src at the same offset
 * (in-place all-reduce). 1 <= nsrc, ndst <= DT__COMBINE_MAX. */
#define DT__COMBINE_MAX 16
typedef struct dt__combine {
    dt_dtype dtype;
    dt_reduce_op op; /* MEAN combines as SUM; `by` divides */
    int nsrc, ndst, by;
    bool src_wide, dst_wide;
    const void *src[DT__COMBINE_MAX];
    void *dst[DT__COMBINE_MAX];
    int64_t n;
} dt__combine;
/* The combine on the CPU (host memory; emulated GPUs). */
void dt__cpu_combine(const dt__combine *c);
/* The combine as a CUDA kernel, enqueued on x->stream. Pointers may be on other GPUs with peer
 * access (unified addressing). */
dt_status dt__cuda_combine(const dt__kctx *x, const dt__combine *c);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_H */
