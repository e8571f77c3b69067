/* The CPU random-number kernels (backends/cpu/random.c: PHILOX_UNIFORM, PHILOX_NORMAL) against
 * the per-element definition of the stream (common/philox.h: dt__random_value on the element's
 * global index, scaled, rounded to the dtype), byte for byte: f32, f64, bf16 and f16, uniform
 * and normal; global tensors of rank 0 to 3 cut into every shard of a grid (uneven: 5 rows in
 * 4 pieces; rows whose length is not a multiple of a block's elements, so that blocks straddle
 * rows and shards and rows start at odd global indices); on one thread and on pools of 2, 3
 * and 4 threads (ranges that start inside rows and blocks); empty shards write nothing. The
 * output buffer is filled with a pattern first and guarded past its end, so a dropped, moved or
 * extra element fails. */
#include "../../backends/cpu/pool.h"
#include "convert.h"
#include "dt.h"
#include "philox.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt__cpu_pool *pools[3]; /* 2, 3 and 4 threads */

static void open_pools(void)
{
    for (int i = 0; i < 3; i++)
        cr_assert_eq(dt__cpu_pool_open(i + 2, false, false, &pools[i]), DT_OK);
}

static void close_pools(void)
{
    for (int i = 0; i < 3; i++)
        dt__cpu_pool_close(pools[i]);
}

TestSuite(cpu_random, .init = open_pools, .fini = close_pools);

static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};
enum { GUARD = 64 };

/* Element e of the global tensor, stored in dtype dt at p. */
static void reference(dt_dtype dt, bool normal, const dt__kargs *k, uint64_t e, void *p)
{
    bool f64 = dt == DT_DTYPE_F64;
    double v =
        dt__random_scale(normal, k->a, k->b, dt__random_value(normal, f64, k->seed, k->key, e));
    if (dt == DT_DTYPE_F64)
        memcpy(p, &v, 8);
    else if (dt == DT_DTYPE_F32) {
        float f = (float)v;
        memcpy(p, &f, 4);
    } else {
        uint16_t h = dt == DT_DTYPE_BF16 ? dt__f32_to_bf16((float)v) : dt__f32_to_f16((float)v);
        memcpy(p, &h, 2);
    }
}

/* The shard k (shape, offset, gshape set) on one thread and on each pool against the reference.
 * split: the shard is large enough that the pool of 2 must cut it. */
static void check_shard(const dt__kargs *k, bool split, const char *what)
{
    int64_t n = dt__num_elements(k->rank, k->shape), gst[DT_MAX_RANK], idx[DT_MAX_RANK] = {0};
    int64_t s = 1;
    for (int a = k->rank - 1; a >= 0; a--) {
        gst[a] = s;
        s *= k->gshape[a];
    }
    for (int d = 0; d < 4; d++)
        for (int normal = 0; normal < 2; normal++) {
            dt_dtype dt = dtypes[d];
            size_t esz = dt_dtype_size(dt), bytes = (size_t)n * esz;
            unsigned char *want = malloc(bytes + GUARD), *got = malloc(bytes + GUARD);
            memset(want, 0x5a, bytes + GUARD);
            for (int a = 0; a < k->rank; a++)
                idx[a] = 0;
            for (int64_t i = 0; i < n; i++) {
                uint64_t e = 0;
                for (int a = 0; a < k->rank; a++)
                    e += (uint64_t)(k->offset[a] + idx[a]) * (uint64_t)gst[a];
                reference(dt, normal, k, e, want + (size_t)i * esz);
                for (int a = k->rank - 1; a >= 0 && ++idx[a] == k->shape[a]; a--)
                    idx[a] = 0;
            }
            dt__kernel kern = normal ? DT__K_PHILOX_NORMAL : DT__K_PHILOX_UNIFORM;
            for (int t = 0; t < 4; t++) {
                dt__kctx x = {.type = "CPU", .cores = t + 1, .pool = t ? pools[t - 1] : NULL};
                memset(got, 0x5a, bytes + GUARD);
                cr_assert_eq(dt__cpu_kernels[kern][dt](&x, k, NULL, got), DT_OK);
                size_t at = 0;
                while (at < bytes + GUARD && want[at] == got[at])
                    at++;
                cr_assert_eq(at, bytes + GUARD,
                             "%s, %s %s on %d threads: element %zu of %ld differs (byte %zu)", what,
                             dt_dtype_name(dt), normal ? "normal" : "uniform", t + 1, at / esz,
                             (long)n, at);
            }
            if (split) {
                dt__kctx two = {.type = "CPU", .cores = 2, .pool = pools[0]};
                cr_assert_geq(dt__cpu_parts(&two, n * 4, n), 2, "%s: not split", what);
            }
            free(want);
            free(got);
        }
}

/* Every shard of gshape (rank r) cut into pieces[a] along each axis a: piece j of an axis of
 * extent g starts at j g / p (uneven: 5 in 4 pieces are 1, 1, 1, 2). */
static void check_grid(int r, const int64_t gshape[], const int pieces[], uint64_t seed,
                       uint64_t key, bool split)
{
    int piece[DT_MAX_RANK] = {0};
    for (;;) {
        dt__kargs k;
        memset(&k, 0, sizeof k);
        k.rank = r;
        k.seed = seed;
        k.key = key;
        k.a = 0.25;
        k.b = 1.5;
        char what[160];
        int len =
            snprintf(what, sizeof what, "rank %d seed %llu shard", r, (unsigned long long)seed);
        for (int a = 0; a < r; a++) {
            int64_t lo = piece[a] * gshape[a] / pieces[a],
                    hi = (piece[a] + 1) * gshape[a] / pieces[a];
            k.gshape[a] = gshape[a];
            k.offset[a] = lo;
            k.shape[a] = hi - lo;
            len += snprintf(what + len, sizeof what - (size_t)len, " [%ld, %ld) of %ld", (long)lo,
                            (long)hi, (long)gshape[a]);
        }
        check_shard(&k, split, what);
        int a = r - 1;
        while (a >= 0 && ++piece[a] == pieces[a])
            piece[a--] = 0;
        if (a < 0)
            return;
    }
}

Test(cpu_random, scalar_and_small_shards)
{
    check_grid(0, NULL, NULL, 7, 3, false);
    check_grid(1, (int64_t[]){37}, (int[]){4}, 7, 3, false);
    check_grid(1, (int64_t[]){5}, (int[]){4}, 1, 0, false);
    check_grid(2, (int64_t[]){5, 7}, (int[]){4, 2}, 7, 3, false);
    check_grid(2, (int64_t[]){5, 7}, (int[]){1, 3}, 0xffffffffffffffffull, 5, false);
    check_grid(3, (int64_t[]){3, 5, 7}, (int[]){2, 4, 3}, 11, 2, false);
    check_grid(3, (int64_t[]){4, 2, 9}, (int[]){3, 1, 1}, 11, 2, false);
    check_grid(3, (int64_t[]){4, 6, 6}, (int[]){3, 1, 2}, 11, 2, false);
}

/* Shards that the pools cut into ranges: whole rows (one run of consecutive global indices)
 * and cut rows (runs of 4097 elements starting at odd global indices). */
Test(cpu_random, large_shards_split_over_threads)
{
    check_grid(2, (int64_t[]){9, 4099}, (int[]){2, 1}, 5, 1, true);
    check_grid(2, (int64_t[]){9, 8193}, (int[]){1, 2}, 5, 1, true);
    check_grid(3, (int64_t[]){5, 3, 2731}, (int[]){2, 1, 2}, 9, 4, false);
}

/* Runs across block 2^32 (the counter's second word), for 1, 2 and 4 elements a block. */
Test(cpu_random, counter_past_32_bits)
{
    for (int64_t per = 1; per <= 4; per *= 2) {
        dt__kargs k;
        memset(&k, 0, sizeof k);
        k.rank = 1;
        k.gshape[0] = 1ll << 36;
        k.offset[0] = per * (1ll << 32) - 13;
        k.shape[0] = 53;
        k.seed = 3;
        k.key = 1;
        k.a = -1;
        k.b = 1;
        check_shard(&k, false, "across block 2^32");
    }
}

Test(cpu_random, empty_shards_write_nothing)
{
    unsigned char buf[GUARD];
    dt__kargs k;
    memset(&k, 0, sizeof k);
    k.rank = 2;
    k.gshape[0] = 5;
    k.gshape[1] = 7;
    k.offset[0] = 5;
    k.shape[1] = 7;
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 4; t++) {
            dt__kctx x = {.type = "CPU", .cores = t + 1, .pool = t ? pools[t - 1] : NULL};
            memset(buf, 0x5a, sizeof buf);
            cr_assert_eq(dt__cpu_kernels[DT__K_PHILOX_NORMAL][dtypes[d]](&x, &k, NULL, buf), DT_OK);
            cr_assert_eq(dt__cpu_kernels[DT__K_PHILOX_UNIFORM][dtypes[d]](&x, &k, NULL, buf),
                         DT_OK);
            for (int i = 0; i < GUARD; i++)
                cr_assert_eq(buf[i], 0x5a, "%s: byte %d written", dt_dtype_name(dtypes[d]), i);
        }
}

/* dt__u53, computed from 32-bit halves, is the 53-bit integer hi 2^21 ^ (lo >> 11) scaled. */
Test(cpu_random, u53_is_the_53_bit_integer)
{
    static const uint32_t w[] = {0,          1,          0x7ff,      0x800,
                                 0xffff,     0x10000,    0x7fffffff, 0x80000000,
                                 0xfffff800, 0xffffffff, 0x9e3779b9, 0xd2511f53};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        for (size_t j = 0; j < sizeof w / sizeof *w; j++) {
            uint64_t m = ((uint64_t)w[i] << 21) ^ (w[j] >> 11);
            cr_assert_eq(dt__u53(w[i], w[j]), (double)m / 9007199254740992.0, "%08x %08x", w[i],
                         w[j]);
        }
}
