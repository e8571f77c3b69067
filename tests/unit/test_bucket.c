/* The bucket pass (spmd/bucket.c) on a program built step by step: which all-reduces merge,
 * where the copies in and out and the merged all-reduce go, against the steps worked out by
 * hand; the cap; the sums the run gives, against the fills' values added by hand (all-reduces
 * and reduce-scatters, even and in uneven blocks of one slot, with the other kind between);
 * all-gathers of the program's inputs, even and uneven, merged member-major within the cap and
 * the largest all-gather, against the inputs' values; and the cap read from DTENSOR_BUCKET_MB. */
#include "program_fixture.h"

#include <stdlib.h>
#include <string.h>

TestSuite(bucket, .init = start, .fini = stop);

/* A fill of `base` on device 0 and 10 * base on device 1. */
static void fill_args(void *ctx, int device, dt__kargs *k)
{
    k->rank = 1;
    k->shape[0] = N;
    k->a = *(const double *)ctx * (device ? 10 : 1);
}

static void copy_args(void *ctx, int device, dt__kargs *k)
{
    (void)ctx;
    (void)device;
    k->rank = 1;
    k->shape[0] = N;
    k->blocks = calloc(1, sizeof *k->blocks);
    cr_assert_not_null(k->blocks);
    k->nblocks = 1;
    k->blocks->rank = 1;
    k->blocks->src_shape[0] = k->blocks->dst_shape[0] = k->blocks->extent[0] = N;
}

static void fill(dt__program *p, int out, double base)
{
    cr_assert_eq(
        dt__emit_kernel(p, "k", DT__K_FILL, DT_DTYPE_F32, 0, NULL, out, mesh, fill_args, &base),
        DT_OK, "%s", dt_last_error());
}

static void copy(dt__program *p, int in, int out)
{
    cr_assert_eq(dt__emit_kernel(p, "k", DT__K_COPY_BLOCKS, DT_DTYPE_F32, 1, &in, out, mesh,
                                 copy_args, NULL),
                 DT_OK, "%s", dt_last_error());
}

static void all_reduce(dt__program *p, int send, int recv)
{
    cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_ALL_REDUCE, DT_DTYPE_F32, DT_REDUCE_SUM, 1u, send,
                               recv, N, NULL, NULL, 0, 4.0 * N, "t"),
                 DT_OK, "%s", dt_last_error());
}

static void output(dt__program *p, int o, int s)
{
    p->slots[s].output = o;
    p->out[o] = (dt__dist){.slot = s, .dtype = DT_DTYPE_F32, .rank = 1, .shape = {N}};
    cr_assert_eq(dt_layout_parse(mesh, "unsharded", &p->out[o].layout), DT_OK);
}

/* Steps (outputs x, o and rc):
 *   0 a = fill(1)   1 ra = all_reduce(a)   2 b = fill(2)   3 rb = all_reduce(b)
 *   4 x = copy(ra)  5 c = fill(3)          6 rc = all_reduce(c)   7 o = copy(rb)
 * Steps 1 and 3 share a bucket, closed by step 4 (it reads ra); step 6 is left alone (a bucket
 * of one). ra is copied out before step 4, rb before step 6 (the next collective: the flat
 * buffer does not live on to step 7). slots: a, ra, b, rb, c, rc (for the checks). */
static dt__program *build(int slots[6])
{
    dt__program *p;
    cr_assert_eq(dt__program_create("t", 0, 3, &p), DT_OK);
    int a = slot(p), ra = slot(p), b = slot(p), rb = slot(p), x = slot(p), c = slot(p),
        rc = slot(p), o = slot(p);
    fill(p, a, 1);
    all_reduce(p, a, ra);
    fill(p, b, 2);
    all_reduce(p, b, rb);
    copy(p, ra, x);
    fill(p, c, 3);
    all_reduce(p, c, rc);
    copy(p, rb, o);
    output(p, 0, x);
    output(p, 1, o);
    output(p, 2, rc);
    int s[6] = {a, ra, b, rb, c, rc};
    memcpy(slots, s, sizeof s);
    return p;
}

static int collectives(const dt__program *p)
{
    int n;
    dt__program_totals(p, NULL, &n, NULL);
    return n;
}

Test(bucket, merges_a_run_and_places_its_copies)
{
    int s[6];
    dt__program *p = build(s);
    cr_assert_eq(dt__program_bucket(p, 1 << 20), DT_OK, "%s", dt_last_error());
    /* fill a, pack a, fill b, pack b, all-reduce, unpack ra (before its reader), copy x,
     * fill c, unpack rb (before the next collective), all-reduce c, copy o */
    cr_assert_eq(p->nsteps, 11);
    cr_expect_eq(collectives(p), 2);
    const dt__step *st = p->steps;
    int flat = st[1].out;
    cr_expect(st[1].kind == DT__STEP_KERNEL && st[1].kernel == DT__K_COPY_BLOCKS &&
              st[1].in[0] == s[0]);
    cr_expect(st[3].kind == DT__STEP_KERNEL && st[3].in[0] == s[2] && st[3].out == flat);
    cr_expect(st[4].kind == DT__STEP_COLL && st[4].in[0] == flat && st[4].out == flat &&
              st[4].count == 2 * N);
    cr_expect_str_eq(st[4].text,
                     "all_reduce sum over {x} f32 bucket of 2 all-reduces, 8 elements: 32 bytes "
                     "sent per device");
    cr_expect(st[5].kind == DT__STEP_KERNEL && st[5].in[0] == flat && st[5].out == s[1]);
    cr_expect(st[6].in[0] == s[1]);
    cr_expect(st[8].kind == DT__STEP_KERNEL && st[8].in[0] == flat && st[8].out == s[3]);
    cr_expect(st[9].kind == DT__STEP_COLL && st[9].in[0] == s[4] && st[9].out == s[5]);
    cr_expect(st[10].in[0] == s[3]);
    /* the second member's block starts after the first's */
    cr_expect_eq(st[3].args[0].blocks[0].dst_at, N);
    cr_expect_eq(st[8].args[1].blocks[0].src_at, N);
    dt__program_release(p);
}

Test(bucket, the_cap_closes_a_bucket)
{
    int s[6];
    dt__program *p = build(s);
    /* one member's bytes reach the cap: no bucket has two */
    cr_assert_eq(dt__program_bucket(p, 4 * N), DT_OK, "%s", dt_last_error());
    cr_expect_eq(p->nsteps, 8);
    cr_expect_eq(collectives(p), 3);
    dt__program_release(p);
    p = build(s);
    cr_assert_eq(dt__program_bucket(p, 0), DT_OK);
    cr_expect_eq(collectives(p), 3);
    dt__program_release(p);
}

/* The bucketed program gives the sums of the fills on both devices (1 + 10, 2 + 20, 3 + 30),
 * with and without overlap. */
Test(bucket, runs)
{
    for (int on = 0; on < 2; on++) {
        if (on)
            unsetenv("DTENSOR_OVERLAP");
        else
            setenv("DTENSOR_OVERLAP", "0", 1);
        int s[6];
        dt__program *p = build(s);
        cr_assert_eq(dt__program_bucket(p, 1 << 20), DT_OK, "%s", dt_last_error());
        dt__program_seal(p);
        dt_tensor *out[3] = {NULL, NULL, NULL};
        dt__op_check chk = {.mesh = mesh, .a = {.what = "t"}};
        cr_assert_eq(dt__program_run(p, NULL, out, &chk), DT_OK, "%s", dt_last_error());
        const float want[3] = {11, 22, 33};
        for (int o = 0; o < 3; o++) {
            float got[N];
            cr_assert_eq(dt_tensor_read(out[o], got, sizeof got), DT_OK, "%s", dt_last_error());
            for (int i = 0; i < N; i++)
                cr_expect_eq(got[i], want[o], "output %d[%d] = %g, not %g", o, i, got[i], want[o]);
            dt_tensor_free(out[o]);
        }
        dt__program_release(p);
    }
    unsetenv("DTENSOR_OVERLAP");
}

/* arange from `start` (device 0) or 10 * start (device 1), step 1, over 2N elements. */
static void arange_args(void *ctx, int device, dt__kargs *k)
{
    k->rank = 1;
    k->shape[0] = 2 * N;
    k->a = *(const double *)ctx * (device ? 10 : 1);
    k->b = 1;
}

/* Reduce-scatters: a = arange(1 / 10), ra = reduce_scatter(a), b = arange(100 / 1000),
 * rb = reduce_scatter(b), results sharded ("x"): one bucket whose flat buffer holds device 0's
 * blocks of a and b, then device 1's; device d gets global elements g = d N + i of each,
 * 1 + g + 10 + g and 100 + g + 1000 + g. */
Test(bucket, reduce_scatters_merge_member_major)
{
    dt__program *p;
    cr_assert_eq(dt__program_create("t", 0, 2, &p), DT_OK);
    int64_t two[2] = {2 * N, 2 * N}, one[2] = {N, N};
    int a, b, ra, rb;
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, two, &a), DT_OK);
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, two, &b), DT_OK);
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, one, &ra), DT_OK);
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, one, &rb), DT_OK);
    double starts[2] = {1, 100};
    int srcs[2] = {a, b}, dsts[2] = {ra, rb};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dt__emit_kernel(p, "k", DT__K_ARANGE, DT_DTYPE_F32, 0, NULL, srcs[k], mesh,
                                     arange_args, &starts[k]),
                     DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_REDUCE_SCATTER, DT_DTYPE_F32, DT_REDUCE_SUM, 1u,
                                   srcs[k], dsts[k], N, NULL, NULL, 0, 4.0 * N, "t"),
                     DT_OK, "%s", dt_last_error());
    }
    for (int o = 0; o < 2; o++) {
        p->slots[dsts[o]].output = o;
        p->out[o] = (dt__dist){.slot = dsts[o], .dtype = DT_DTYPE_F32, .rank = 1, .shape = {2 * N}};
        cr_assert_eq(dt_layout_parse(mesh, "x", &p->out[o].layout), DT_OK);
    }
    cr_assert_eq(dt__program_bucket(p, 1 << 20), DT_OK, "%s", dt_last_error());
    /* arange a, pack a, arange b, pack b, reduce-scatter, unpack ra, unpack rb */
    cr_assert_eq(p->nsteps, 7);
    cr_expect_eq(collectives(p), 1);
    cr_expect_str_eq(p->steps[4].text, "reduce_scatter sum over {x} f32 bucket of 2 "
                                       "reduce-scatters, 8 elements: 32 bytes sent per device");
    dt__program_seal(p);
    dt_tensor *out[2] = {NULL, NULL};
    dt__op_check chk = {.mesh = mesh, .a = {.what = "t"}};
    cr_assert_eq(dt__program_run(p, NULL, out, &chk), DT_OK, "%s", dt_last_error());
    for (int o = 0; o < 2; o++) {
        float got[2 * N];
        cr_assert_eq(dt_tensor_read(out[o], got, sizeof got), DT_OK, "%s", dt_last_error());
        for (int g = 0; g < 2 * N; g++) {
            float want = (float)(11 * starts[o] + 2 * g);
            cr_expect_eq(got[g], want, "output %d[%d] = %g, not %g", o, g, got[g], want);
        }
        dt_tensor_free(out[o]);
    }
    dt__program_release(p);
}

/* Chunk c of a reduce-scatter into blocks of one slot (the chunked matmul's form): member q
 * receives cnt[c][q] elements, at offset into[c][q] of its N-element block. */
static const int64_t cnt[2][2] = {{3, 1}, {1, 3}}, into[2][2] = {{0, 0}, {3, 1}};

static void chunk_counts(void *ctx, int device, int64_t counts[])
{
    (void)device;
    const int64_t *c = ctx;
    counts[0] = c[0];
    counts[1] = c[1];
}

static void chunk_at(void *ctx, int device, int64_t at[])
{
    at[0] = 0;
    at[1] = ((const int64_t *)ctx)[device];
}

static void arange_n(void *ctx, int device, dt__kargs *k)
{
    k->rank = 1;
    k->shape[0] = N;
    k->a = *(const double *)ctx * (device ? 10 : 1);
    k->b = 1;
}

/* Two chunks of uneven counts into one slot r (r on device 0: 3 elements from chunk 0, 1 at
 * offset 3 from chunk 1; device 1: 1 at offset 0, then 3 at offset 1), each followed by an
 * all-reduce: a = arange(1 / 10), r <- chunk 0 of a, c = fill(3), rc = all_reduce(c),
 * b = arange(100 / 1000), r <- chunk 1 of b, e = fill(4), re = all_reduce(e). With buckets,
 * the chunks stay two reduce-scatters (a bucket takes one chunk of a slot, never the whole
 * partial sum) and the all-reduces, which the reduce-scatters between do not close, are one; the
 * values, worked out by hand: r = [1+10, 2+11, 3+12, 100+1000 | 4+13, 101+1001, 102+1002,
 * 103+1003], rc = 33, re = 44, with and without buckets. A copy out at a wrong offset, or a block
 * packed to the wrong member, changes r. */
Test(bucket, uneven_blocks_of_one_slot_and_interleaved_kinds)
{
    const float want_r[2 * N] = {11, 13, 15, 1100, 17, 1102, 1104, 1106};
    for (int on = 0; on < 2; on++) {
        dt__program *p;
        cr_assert_eq(dt__program_create("t", 0, 3, &p), DT_OK);
        int r = slot(p), rc = slot(p), re = slot(p);
        double starts[2] = {1, 100}, fills[2] = {3, 4};
        int ars[2] = {rc, re};
        for (int k = 0; k < 2; k++) {
            int a = slot(p), c = slot(p);
            cr_assert_eq(dt__emit_kernel(p, "k", DT__K_ARANGE, DT_DTYPE_F32, 0, NULL, a, mesh,
                                         arange_n, &starts[k]),
                         DT_OK, "%s", dt_last_error());
            cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_REDUCE_SCATTER, DT_DTYPE_F32, DT_REDUCE_SUM,
                                       1u, a, r, 0, chunk_counts, (void *)cnt[k], 2, 8.0, "t"),
                         DT_OK, "%s", dt_last_error());
            cr_assert_eq(dt__coll_at(p, chunk_at, (void *)into[k]), DT_OK);
            fill(p, c, fills[k]);
            all_reduce(p, c, ars[k]);
        }
        int outs[3] = {r, rc, re};
        for (int o = 0; o < 3; o++) {
            p->slots[outs[o]].output = o;
            p->out[o] = (dt__dist){
                .slot = outs[o], .dtype = DT_DTYPE_F32, .rank = 1, .shape = {o ? N : 2 * N}};
            cr_assert_eq(dt_layout_parse(mesh, o ? "unsharded" : "x", &p->out[o].layout), DT_OK);
        }
        cr_assert_eq(dt__program_bucket(p, on ? 1 << 20 : 0), DT_OK, "%s", dt_last_error());
        cr_expect_eq(collectives(p), on ? 3 : 4);
        bool ar2 = false, rss = false;
        for (int i = 0; i < p->nsteps; i++) {
            ar2 = ar2 || strstr(p->steps[i].text, "bucket of 2 all-reduces");
            rss = rss || strstr(p->steps[i].text, "reduce-scatters");
        }
        cr_expect(ar2 || !on, "no bucket of 2 all-reduces in the program");
        cr_expect(!rss, "the two chunks of one slot were bucketed");
        dt__program_seal(p);
        dt_tensor *out[3] = {NULL, NULL, NULL};
        dt__op_check chk = {.mesh = mesh, .a = {.what = "t"}};
        cr_assert_eq(dt__program_run(p, NULL, out, &chk), DT_OK, "%s", dt_last_error());
        float got[2 * N];
        cr_assert_eq(dt_tensor_read(out[0], got, sizeof got), DT_OK, "%s", dt_last_error());
        for (int g = 0; g < 2 * N; g++)
            cr_expect_eq(got[g], want_r[g], "buckets %s: r[%d] = %g, not %g", on ? "on" : "off", g,
                         got[g], want_r[g]);
        for (int o = 1; o < 3; o++) {
            cr_assert_eq(dt_tensor_read(out[o], got, sizeof(float) * N), DT_OK, "%s",
                         dt_last_error());
            for (int i = 0; i < N; i++)
                cr_expect_eq(got[i], 11 * fills[o - 1], "all-reduce %d[%d] = %g", o, i, got[i]);
        }
        for (int o = 0; o < 3; o++)
            dt_tensor_free(out[o]);
        dt__program_release(p);
    }
}

Test(bucket, cap_from_the_environment)
{
    size_t cap;
    unsetenv("DTENSOR_BUCKET_MB");
    cr_expect_eq(dt__bucket_cap(&cap), DT_OK);
    cr_expect_eq(cap, (size_t)25 << 20);
    setenv("DTENSOR_BUCKET_MB", "0", 1);
    cr_expect_eq(dt__bucket_cap(&cap), DT_OK);
    cr_expect_eq(cap, 0);
    setenv("DTENSOR_BUCKET_MB", "0.5", 1);
    cr_expect_eq(dt__bucket_cap(&cap), DT_OK);
    cr_expect_eq(cap, (size_t)1 << 19);
    const char *bad[] = {"-1", "25MB", "nan", "inf", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DTENSOR_BUCKET_MB", bad[i], 1);
        cr_expect_eq(dt__bucket_cap(&cap), DT_ERR_ARG, "%s", bad[i]);
        cr_expect(strstr(dt_last_error(), "DTENSOR_BUCKET_MB") != NULL, "%s", dt_last_error());
    }
    unsetenv("DTENSOR_BUCKET_MB");
}

/* arange from start (device 0) or 10 * start (device 1), step 1, over elems[device]. */
typedef struct arange_ctx {
    double start;
    int64_t elems[2];
} arange_ctx;

static void arange_dev(void *ctx, int device, dt__kargs *k)
{
    const arange_ctx *c = ctx;
    k->rank = 1;
    k->shape[0] = c->elems[device];
    k->a = c->start * (device ? 10 : 1);
    k->b = 1;
}

/* Input k of p: a slot of elems[device] elements holding a tensor of n elements sharded "x". */
static int input(dt__program *p, int k, const int64_t elems[2], int64_t n)
{
    int s;
    cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, elems, &s), DT_OK, "%s",
                 dt_last_error());
    p->slots[s].input = k;
    p->in[k] = (dt__dist){.slot = s, .dtype = DT_DTYPE_F32, .rank = 1, .shape = {n}};
    cr_assert_eq(dt_layout_parse(mesh, "x", &p->in[k].layout), DT_OK);
    return s;
}

static void uneven_counts(void *ctx, int device, int64_t counts[])
{
    (void)device;
    const int64_t *c = ctx;
    counts[0] = c[0];
    counts[1] = c[1];
}

/* All-gathers: inputs a (2 na elements) and b (3: 2 on device 0, 1 on device 1), both sharded
 * "x"; ga = all_gather(a), c = arange(7 / 70) (cn a device), gb = all_gather(b) (uneven),
 * gc = all_gather(c). ga and gb, of the program's inputs, become one all-gather of a flat
 * buffer (device d's blocks of a and b) when the cap and the largest all-gather (gc, or 64 KiB)
 * allow their bytes, copied in at the start and out where each was; gc, of an activation,
 * stays alone. The values: ga and gb the inputs' (from the host), gc 7.. then 70... */
static void gathers(int64_t na, int64_t cn, size_t cap, bool merged)
{
    int64_t most = 2 * (na > cn ? na : cn);
    float *host_a = calloc((size_t)most, sizeof *host_a), *got = calloc((size_t)most, sizeof *got),
          *want = calloc((size_t)most, sizeof *want);
    cr_assert(host_a && got && want);
    for (int64_t i = 0; i < 2 * na; i++)
        host_a[i] = (float)(i + 1);
    const float host_b[3] = {100, 101, 102};
    for (int on = 0; on < 2; on++) {
        if (on)
            unsetenv("DTENSOR_OVERLAP");
        else
            setenv("DTENSOR_OVERLAP", "0", 1);
        dt__program *p;
        cr_assert_eq(dt__program_create("t", 2, 3, &p), DT_OK);
        int64_t nb[2] = {2, 1}, gae[2] = {2 * na, 2 * na}, gce[2] = {2 * cn, 2 * cn};
        int a = input(p, 0, (int64_t[]){na, na}, 2 * na), b = input(p, 1, nb, 3), gb = slot(p), ga,
            gc;
        cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, gae, &ga), DT_OK);
        cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, gce, &gc), DT_OK);
        cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_ALL_GATHER, DT_DTYPE_F32, DT_REDUCE_SUM, 1u, a,
                                   ga, na, NULL, NULL, 0, 4.0 * (double)na, "t"),
                     DT_OK, "%s", dt_last_error());
        arange_ctx cc = {7, {cn, cn}};
        int c;
        cr_assert_eq(dt__slot_new_elems(p, mesh, DT_DTYPE_F32, cc.elems, &c), DT_OK);
        cr_assert_eq(
            dt__emit_kernel(p, "k", DT__K_ARANGE, DT_DTYPE_F32, 0, NULL, c, mesh, arange_dev, &cc),
            DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_ALL_GATHER, DT_DTYPE_F32, DT_REDUCE_SUM, 1u, b,
                                   gb, 0, uneven_counts, nb, 2, 8.0, "t"),
                     DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt__emit_coll(p, "c", DT__COLL_ALL_GATHER, DT_DTYPE_F32, DT_REDUCE_SUM, 1u, c,
                                   gc, cn, NULL, NULL, 0, 4.0 * (double)cn, "t"),
                     DT_OK, "%s", dt_last_error());
        int outs[3] = {ga, gb, gc};
        int64_t len[3] = {2 * na, 3, 2 * cn};
        for (int o = 0; o < 3; o++) {
            p->slots[outs[o]].output = o;
            p->out[o] =
                (dt__dist){.slot = outs[o], .dtype = DT_DTYPE_F32, .rank = 1, .shape = {len[o]}};
            cr_assert_eq(dt_layout_parse(mesh, "unsharded", &p->out[o].layout), DT_OK);
        }
        cr_assert_eq(dt__program_bucket(p, cap), DT_OK, "%s", dt_last_error());
        cr_expect_eq(collectives(p), merged ? 2 : 3, "na %lld, cn %lld, cap %zu", (long long)na,
                     (long long)cn, cap);
        if (merged) {
            /* pack a, pack b, all-gather, unpack ga, arange c, unpack gb, all-gather c */
            cr_assert_eq(p->nsteps, 7);
            const dt__step *st = p->steps;
            int send = st[0].out, recv = st[2].out;
            cr_expect(st[0].kernel == DT__K_COPY_BLOCKS && st[0].in[0] == a);
            cr_expect(st[1].kernel == DT__K_COPY_BLOCKS && st[1].in[0] == b && st[1].out == send);
            cr_expect(st[2].kind == DT__STEP_COLL && st[2].in[0] == send && st[2].counts);
            cr_expect(strstr(st[2].text, "all_gather over {x} f32 bucket of 2 all-gathers"), "%s",
                      st[2].text);
            if (na == N)
                cr_expect_str_eq(st[2].text, "all_gather over {x} f32 bucket of 2 all-gathers, 6 "
                                             "elements: 24 bytes sent per device");
            cr_expect(st[3].in[0] == recv && st[3].out == ga);
            cr_expect(st[4].kernel == DT__K_ARANGE && st[4].out == c);
            cr_expect(st[5].in[0] == recv && st[5].out == gb);
            cr_expect(st[6].kind == DT__STEP_COLL && st[6].in[0] == c);
        }
        dt__program_seal(p);
        dt_layout lx;
        cr_assert_eq(dt_layout_parse(mesh, "x", &lx), DT_OK);
        dt_tensor *in[2] = {NULL, NULL}, *out[3] = {NULL, NULL, NULL};
        cr_assert_eq(dt_tensor_from_host(&lx, DT_DTYPE_F32, 1, (int64_t[]){2 * na}, host_a,
                                         sizeof(float) * 2 * (size_t)na, &in[0]),
                     DT_OK, "%s", dt_last_error());
        cr_assert_eq(dt_tensor_from_host(&lx, DT_DTYPE_F32, 1, (int64_t[]){3}, host_b,
                                         sizeof host_b, &in[1]),
                     DT_OK, "%s", dt_last_error());
        dt__op_check chk = {.mesh = mesh, .a = {.what = "t"}};
        cr_assert_eq(dt__program_run(p, (const dt_tensor *const *)in, out, &chk), DT_OK, "%s",
                     dt_last_error());
        for (int o = 0; o < 3; o++) {
            if (o == 0)
                memcpy(want, host_a, sizeof(float) * 2 * (size_t)na);
            else if (o == 1)
                memcpy(want, host_b, sizeof host_b);
            else
                for (int64_t i = 0; i < cn; i++) {
                    want[i] = (float)(7 + i);
                    want[cn + i] = (float)(70 + i);
                }
            cr_assert_eq(dt_tensor_read(out[o], got, sizeof(float) * (size_t)len[o]), DT_OK, "%s",
                         dt_last_error());
            int64_t bad = -1;
            for (int64_t i = 0; i < len[o] && bad < 0; i++)
                if (got[i] != want[i])
                    bad = i;
            cr_expect_eq(bad, -1, "overlap %d: output %d[%lld] = %g, not %g", on, o, (long long)bad,
                         bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
            dt_tensor_free(out[o]);
        }
        dt_tensor_free(in[0]);
        dt_tensor_free(in[1]);
        dt__program_release(p);
    }
    free(host_a);
    free(got);
    free(want);
    unsetenv("DTENSOR_OVERLAP");
}

Test(bucket, all_gathers_of_inputs_merge_member_major)
{
    gathers(N, N, 1 << 20, true);
}

Test(bucket, the_cap_closes_an_all_gather_bucket)
{
    gathers(N, N, 32, false); /* ga and gb: 48 bytes */
}

/* Beyond 64 KiB, a bucket holds at most what the largest all-gather does: ga (128 KiB) and gb
 * (16 bytes: its busiest device's 2 elements, twice) merge only where gc is as large. */
Test(bucket, an_all_gather_bucket_holds_at_most_the_largest_all_gather)
{
    gathers(16384, N, 1 << 20, false);
    gathers(16384, 16386, 1 << 20, true);
}
