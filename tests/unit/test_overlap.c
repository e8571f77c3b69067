/* The overlap pass (spmd/overlap.c) on programs built step by step: where each collective
 * starts and where it is waited for, against the order worked out by hand from the steps'
 * buffers; with DTENSOR_OVERLAP=0 the emitted order with every collective waited for at once;
 * a collective's operand kept alive until its wait; both schedules run. */
#include "program_fixture.h"

#include <stdlib.h>

TestSuite(overlap, .init = start, .fini = stop);

static void args4(void *ctx, int device, dt__kargs *k)
{
    (void)ctx;
    (void)device;
    k->rank = 1;
    k->shape[0] = N;
}

static void kernel(dt__program *p, int nin, const int in[], int out)
{
    cr_assert_eq(dt__emit_kernel(p, "k", DT__K_FILL, DT_DTYPE_F32, nin, in, out, mesh, args4, NULL),
                 DT_OK, "%s", dt_last_error());
}

static void coll(dt__program *p, dt__coll_kind kind, int send, int recv)
{
    int64_t count = kind == DT__COLL_ALL_GATHER ? N / 2 : N;
    cr_assert_eq(dt__emit_coll(p, "c", kind, DT_DTYPE_F32, DT_REDUCE_SUM, 1u, send, recv, count,
                               NULL, NULL, 0, 0, "t"),
                 DT_OK, "%s", dt_last_error());
}

/* Steps (the slots are temporaries, `in` the program's input):
 *   0 a = k(in)    1 b = k(in)    2 c = k(b)    3 r = all_reduce(a)    4 d = k(c)
 *   5 e = k(r, d)  6 g = all_gather(in)   7 f = k(g, e)   8 h = all_gather(in)   9 o = k(h, f)
 * The all-reduce moves up to just after step 0, its operand's writer, and is waited for
 * before step 5, its reader. The first all-gather moves up to just below the all-reduce (no
 * collective passes another) and is waited for before step 7; the second may not start above
 * the first's reader (one gather ahead): it goes just before step 7 and is waited for before
 * step 9. */
static dt__program *build(void)
{
    dt__program *p;
    cr_assert_eq(dt__program_create("t", 1, 0, &p), DT_OK);
    int in = slot(p), a = slot(p), b = slot(p), c = slot(p), r = slot(p), d = slot(p), e = slot(p),
        g = slot(p), f = slot(p), h = slot(p), o = slot(p);
    p->slots[in].input = 0;
    kernel(p, 1, &in, a);
    kernel(p, 1, &in, b);
    kernel(p, 1, &b, c);
    coll(p, DT__COLL_ALL_REDUCE, a, r);
    kernel(p, 1, &c, d);
    kernel(p, 2, (int[]){r, d}, e);
    coll(p, DT__COLL_ALL_GATHER, in, g);
    kernel(p, 2, (int[]){g, e}, f);
    coll(p, DT__COLL_ALL_GATHER, in, h);
    kernel(p, 2, (int[]){h, f}, o);
    return p;
}

/* Where step i runs. */
static int position(const dt__program *p, int i)
{
    for (int q = 0; q < p->nsteps; q++)
        if ((p->order ? p->order[q] : q) == i)
            return q;
    return -1;
}

Test(overlap, collectives_start_early_and_wait_late)
{
    unsetenv("DTENSOR_OVERLAP");
    dt__program *p = build();
    dt__program_seal(p);
    cr_assert_not_null(p->order);
    int want[10] = {0, 3, 6, 1, 2, 4, 5, 8, 7, 9};
    for (int q = 0; q < 10; q++)
        cr_expect_eq(p->order[q], want[q], "run position %d: step %d, not %d", q, p->order[q],
                     want[q]);
    cr_expect_eq(p->steps[3].wait_at, position(p, 5), "the all-reduce is waited for at %d",
                 p->steps[3].wait_at);
    cr_expect_eq(p->steps[6].wait_at, position(p, 7), "the all-gather is waited for at %d",
                 p->steps[6].wait_at);
    cr_expect_eq(p->steps[8].wait_at, position(p, 9), "the second all-gather at %d",
                 p->steps[8].wait_at);
    /* the all-reduce's operand stays alive, apart from b, c and d, until its wait */
    cr_expect_geq(p->slots[p->steps[3].in[0]].last, p->steps[3].wait_at - 1);
    dt__program_release(p);
}

Test(overlap, off_keeps_the_emitted_order)
{
    setenv("DTENSOR_OVERLAP", "0", 1);
    dt__program *p = build();
    dt__program_seal(p);
    unsetenv("DTENSOR_OVERLAP");
    cr_expect_null(p->order);
    cr_expect_eq(p->steps[3].wait_at, 4);
    cr_expect_eq(p->steps[6].wait_at, 7);
    cr_expect_eq(p->steps[8].wait_at, 9);
    dt__program_release(p);
}

/* Both schedules run to completion: every collective in flight is completed by the run (the
 * sanitizer build checks that no buffer is touched after the run freed it). */
Test(overlap, runs)
{
    for (int on = 0; on < 2; on++) {
        if (on)
            unsetenv("DTENSOR_OVERLAP");
        else
            setenv("DTENSOR_OVERLAP", "0", 1);
        dt__program *p = build();
        dt__program_seal(p);
        dt_layout l;
        cr_assert_eq(dt_layout_parse(mesh, "unsharded", &l), DT_OK);
        dt_tensor *x;
        float host[N] = {1, 2, 3, 4};
        cr_assert_eq(
            dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){N}, host, sizeof host, &x), DT_OK,
            "%s", dt_last_error());
        dt__op_check chk = {.mesh = mesh, .a = {.what = "t"}};
        cr_expect_eq(dt__program_run(p, (const dt_tensor *const[]){x}, NULL, &chk), DT_OK, "%s",
                     dt_last_error());
        dt_tensor_free(x);
        dt__program_release(p);
    }
    unsetenv("DTENSOR_OVERLAP");
}
