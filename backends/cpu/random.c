/* The CPU random-number kernels: uniform and normal values of the Philox stream
 * (common/philox.h, the one source shared with CUDA), bitwise the per-element definition
 * dt__random_value on the element's global index.
 *
 * A shard's elements are runs of consecutive global indices: the axes after its last cut axis
 * are whole, so a run spans them and the last cut axis's local extent. A run is walked by
 * Philox blocks (1, 2 or 4 elements a block, dt__random_per_block), DT__PHILOX_BATCH blocks
 * at a time: their words computed together (dt__philox_batch), then every element of the
 * batch converted (dt__random_from_block; the loops over a batch vectorize, compiled for AVX2
 * and for baseline x86-64, the CPU's form chosen at load, the same IEEE operations with no FMA
 * contraction), then the elements inside the run stored; a run that starts or ends inside a
 * block computes that block for the elements it has. The elements are split over the device's
 * threads in contiguous ranges; each element depends on its global index alone, so the values
 * do not depend on the split. */
#include "random.h"
#include "dtypes.h"
#include "index.h"
#include "philox.h"
#include "pool.h"

enum { BATCH = DT__PHILOX_BATCH };

/* The loops over a batch: everything they call inlined (flatten), compiled for AVX2 and for
 * baseline x86-64 (not under ThreadSanitizer, as backends/cpu/kernels.c says, nor with clang,
 * which takes target_clones only without flatten: the fuzzing build, scripts/fuzz.sh). */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__clang__)
#define RANDOM_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define RANDOM_CLONES __attribute__((flatten))
#endif

/* The values of a batch of blocks (words w) before rounding to the dtype: element k of block
 * i in v[k * BATCH + i]. One function for each distribution and stream (f32's 24-bit words or
 * f64's 53-bit pairs), so that the loops see constants. */
#define DEFINE_CONVERT(DIST, NORMAL, STREAM, WIDE)                                          \
    static inline void convert_##DIST##_##STREAM(uint32_t w[4][BATCH], double a, double b,  \
                                                 double *v)                                 \
    {                                                                                       \
        enum { PER = NORMAL ? (WIDE ? 1 : 2) : (WIDE ? 2 : 4) };                            \
        for (int i = 0; i < BATCH; i++) {                                                   \
            const uint32_t wi[4] = {w[0][i], w[1][i], w[2][i], w[3][i]};                    \
            _Pragma("GCC unroll 4") for (int k = 0; k < PER; k++) v[k * BATCH + i] =        \
                dt__random_scale(NORMAL, a, b, dt__random_from_block(NORMAL, WIDE, wi, k)); \
        }                                                                                   \
    }
DEFINE_CONVERT(uniform, false, f32, false)
DEFINE_CONVERT(uniform, false, f64, true)
DEFINE_CONVERT(normal, true, f32, false)
DEFINE_CONVERT(normal, true, f64, true)

/* o[0, n) = elements g, g + 1, ... of the global tensor (k's stream and scale), stored as S by
 * STORE from the double value (the 16-bit types round the f32 value, as the f32 stream). */
#define DEFINE_RUN(DIST, NORMAL, NAME, S, STREAM, STORE)                                     \
    RANDOM_CLONES static void run_##DIST##_##NAME(const dt__kargs *k, void *out, uint64_t g, \
                                                  int64_t n)                                 \
    {                                                                                        \
        S *o = out;                                                                          \
        enum { PER = NORMAL ? (sizeof(S) == 8 ? 1 : 2) : (sizeof(S) == 8 ? 2 : 4) };         \
        uint32_t w[4][BATCH];                                                                \
        double v[PER * BATCH];                                                               \
        uint64_t end = g + (uint64_t)n;                                                      \
        for (uint64_t blk = g / PER; blk * PER < end; blk += BATCH) {                        \
            dt__philox_batch(k->seed, k->key, blk, w);                                       \
            convert_##DIST##_##STREAM(w, k->a, k->b, v);                                     \
            uint64_t e0 = blk * PER, lo = g > e0 ? g - e0 : 0,                               \
                     hi = end - e0 < PER * BATCH ? end - e0 : PER * BATCH;                   \
            S *dst = o + (e0 + lo - g);                                                      \
            for (uint64_t j = lo; j < hi; j++)                                               \
                *dst++ = STORE(v[(j % PER) * BATCH + j / PER]);                              \
        }                                                                                    \
    }
#define STORE_f32(v) ((float)(v))
#define STORE_f64(v) (v)
#define STORE_bf16(v) STD_bf16((float)(v))
#define STORE_f16(v) STD_f16((float)(v))
#define DEFINE_RUNS(NAME, S, STREAM)                          \
    DEFINE_RUN(uniform, false, NAME, S, STREAM, STORE_##NAME) \
    DEFINE_RUN(normal, true, NAME, S, STREAM, STORE_##NAME)
DEFINE_RUNS(f32, float, f32)
DEFINE_RUNS(f64, double, f64)
DEFINE_RUNS(bf16, uint16_t, f32)
DEFINE_RUNS(f16, uint16_t, f32)

/* A kernel's shard as runs: `cut` leading axes of k's shape index the runs, each `len`
 * elements (the axes from `cut` on) starting at global index first(run). */
typedef struct {
    const dt__kargs *k;
    void (*run)(const dt__kargs *k, void *o, uint64_t g, int64_t n);
    void *out;
    size_t esz;
    int cut;
    int64_t len;
    int64_t gst[DT_MAX_RANK];
} shard;

static uint64_t run_first(const shard *s, const int64_t idx[])
{
    const dt__kargs *k = s->k;
    uint64_t g = k->rank ? (uint64_t)k->offset[s->cut] * (uint64_t)s->gst[s->cut] : 0;
    for (int a = 0; a < s->cut; a++)
        g += (uint64_t)(k->offset[a] + idx[a]) * (uint64_t)s->gst[a];
    return g;
}

/* Elements [lo, hi) of the shard (row-major local order). */
static void shard_range(void *arg, int64_t lo, int64_t hi)
{
    const shard *s = arg;
    int64_t idx[DT_MAX_RANK] = {0}, r = lo / s->len, c = lo % s->len;
    for (int a = s->cut - 1; a >= 0; a--) {
        idx[a] = r % s->k->shape[a];
        r /= s->k->shape[a];
    }
    while (lo < hi) {
        int64_t m = s->len - c < hi - lo ? s->len - c : hi - lo;
        s->run(s->k, (unsigned char *)s->out + (size_t)lo * s->esz, run_first(s, idx) + (uint64_t)c,
               m);
        lo += m;
        c = 0;
        next_index(s->cut, s->k->shape, idx);
    }
}

/* Element-steps an element counts for the split's threshold (DT__CPU_PARALLEL_MIN a thread):
 * on one core here an element takes 4-8 ns uniform and 15-21 ns normal (bench_random), an
 * add's step well under 1 ns. */
enum { STEPS_UNIFORM = 4, STEPS_NORMAL = 16 };

static void random_kernel(const dt__kctx *x, const dt__kargs *k, void *out, size_t esz, bool normal,
                          void (*run)(const dt__kargs *, void *, uint64_t, int64_t))
{
    int64_t n = dt__num_elements(k->rank, k->shape);
    if (n == 0)
        return;
    shard s = {.k = k, .run = run, .out = out, .esz = esz, .len = 1};
    strides_of(k->rank, k->gshape, s.gst);
    /* the last cut axis: every axis after it whole */
    s.cut = k->rank ? k->rank - 1 : 0;
    while (s.cut > 0 && k->shape[s.cut] == k->gshape[s.cut])
        s.cut--;
    for (int a = s.cut; a < k->rank; a++)
        s.len *= k->shape[a];
    int parts = dt__cpu_parts(x, n * (normal ? STEPS_NORMAL : STEPS_UNIFORM), n);
    if (parts < 2)
        shard_range(&s, 0, n);
    else
        dt__cpu_pool_run(x->pool, n, parts, shard_range, &s);
}

#define DEFINE_KERNELS(NAME, S)                                                                    \
    dt_status dt__cpu_uniform_##NAME(const dt__kctx *x, const dt__kargs *k,                        \
                                     const void *const in[], void *out)                            \
    {                                                                                              \
        (void)in;                                                                                  \
        random_kernel(x, k, out, sizeof(S), false, run_uniform_##NAME);                            \
        return DT_OK;                                                                              \
    }                                                                                              \
    dt_status dt__cpu_normal_##NAME(const dt__kctx *x, const dt__kargs *k, const void *const in[], \
                                    void *out)                                                     \
    {                                                                                              \
        (void)in;                                                                                  \
        random_kernel(x, k, out, sizeof(S), true, run_normal_##NAME);                              \
        return DT_OK;                                                                              \
    }
DEFINE_KERNELS(f32, float)
DEFINE_KERNELS(f64, double)
DEFINE_KERNELS(bf16, uint16_t)
DEFINE_KERNELS(f16, uint16_t)
