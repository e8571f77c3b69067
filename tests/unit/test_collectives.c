/* Collectives in one client: 1..8 local CPU devices exchanging through shared memory, every
 * kind, dtype, reduction and algorithm against direct loops (tests/coll_ref.h); the ledger;
 * validation. */
#include "../coll_ref.h"

#include <criterion/criterion.h>

static dt_mesh *mesh_of(const char *spec)
{
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "%s: %s", spec,
                 dt_last_error());
    return m;
}

static void start(int devices)
{
    dt_init_options o = {.cpu_devices = devices, .bind = 2};
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    dt_ledger_clear();
}

static void stop(void)
{
    cr_assert_eq(dt_finalize(), DT_OK, "%s", dt_last_error());
}

/* Every mask of the mesh, every case of ref_sweep. */
static void sweep_mesh(const char *spec, dt_collective_algorithm alg, int64_t big)
{
    dt_mesh *m = mesh_of(spec);
    int na = dt_mesh_num_axes(m);
    for (unsigned axes = 0; axes < 1u << na; axes++) {
        char why[512] = "";
        int runs = ref_sweep(m, axes, big, alg, why, sizeof why);
        cr_expect_gt(runs, 0, "%s axes 0x%x algorithm %s: %s", spec, axes,
                     dt_collective_algorithm_name(alg), why);
    }
    dt_mesh_free(m);
}

static void sweep_devices(int n)
{
    start(n);
    char spec[64];
    snprintf(spec, sizeof spec, "x=%d", n);
    sweep_mesh(spec, DT_ALGORITHM_AUTO, n <= 4 ? 70000 : 5);
    for (int a = 2; a < n; a++)
        if (n % a == 0) {
            snprintf(spec, sizeof spec, "x=%d,y=%d", a, n / a);
            sweep_mesh(spec, DT_ALGORITHM_AUTO, 5);
        }
    if (n == 8)
        sweep_mesh("x=2,y=2,z=2", DT_ALGORITHM_AUTO, 5);
    stop();
}

Test(collectives, devices_1)
{
    sweep_devices(1);
}
Test(collectives, devices_2)
{
    sweep_devices(2);
}
Test(collectives, devices_3)
{
    sweep_devices(3);
}
Test(collectives, devices_4)
{
    sweep_devices(4);
}
Test(collectives, devices_5)
{
    sweep_devices(5);
}
Test(collectives, devices_6)
{
    sweep_devices(6);
}
Test(collectives, devices_7)
{
    sweep_devices(7);
}
Test(collectives, devices_8)
{
    sweep_devices(8);
}

/* Large buffers take the parallel path (device workers) on a 2-D mesh, every algorithm. */
Test(collectives, algorithms_parallel)
{
    start(4);
    for (int a = DT_ALGORITHM_AUTO; a < DT_ALGORITHM_COUNT; a++) {
        if (a == DT_ALGORITHM_NCCL)
            continue;
        sweep_mesh("x=2,y=2", (dt_collective_algorithm)a, 70001);
    }
    stop();
}

Test(collectives, group_arithmetic)
{
    start(6);
    dt_mesh *m = mesh_of("x=3,y=2");
    /* mask {x}: groups {0,2,4} and {1,3,5}; device 4 is member 2 of the first */
    cr_expect_eq(dt__group_size(m, 1u), 3);
    cr_expect_eq(dt__group_rank(m, 1u, 4), 2);
    cr_expect_eq(dt__group_member(m, 1u, 4, 0), 0);
    cr_expect_eq(dt__group_member(m, 1u, 3, 2), 5);
    /* mask {y}: {0,1}, {2,3}, {4,5} */
    cr_expect_eq(dt__group_size(m, 2u), 2);
    cr_expect_eq(dt__group_rank(m, 2u, 3), 1);
    cr_expect_eq(dt__group_member(m, 2u, 3, 0), 2);
    /* both axes: one group of 6 in device order; none: groups of one */
    for (int d = 0; d < 6; d++) {
        cr_expect_eq(dt__group_rank(m, 3u, d), d);
        cr_expect_eq(dt__group_member(m, 3u, 5, d), d);
        cr_expect_eq(dt__group_rank(m, 0u, d), 0);
        cr_expect_eq(dt__group_member(m, 0u, d, 0), d);
    }
    cr_expect_eq(dt__group_size(m, 0u), 1);
    dt_mesh_free(m);
    stop();
}

Test(collectives, kind_and_algorithm_names)
{
    cr_expect_str_eq(dt__coll_kind_name(DT__COLL_REDUCE_SCATTER), "reduce_scatter");
    cr_expect_str_eq(dt__coll_kind_name(DT__COLL_KIND_COUNT), "?");
    cr_expect_str_eq(dt_collective_algorithm_name(DT_ALGORITHM_HIERARCHICAL_COPY),
                     "hierarchical_copy");
    cr_expect_str_eq(dt_collective_algorithm_name(DT_ALGORITHM_COUNT), "?");
}

/* Two collectives in flight at once, on different masks, completed in reverse order. */
Test(collectives, start_wait_overlap)
{
    start(4);
    dt_mesh *m = mesh_of("x=2,y=2");
    float a[4][8], b[4][8], ra[4][8], rb[4][16];
    const void *sa[4], *sb[4];
    void *pa[4], *pb[4];
    for (int i = 0; i < 4; i++) {
        for (int e = 0; e < 8; e++) {
            a[i][e] = (float)(i + e);
            b[i][e] = (float)(10 * i + e);
        }
        sa[i] = a[i];
        sb[i] = b[i];
        pa[i] = ra[i];
        pb[i] = rb[i];
    }
    dt__coll ca = {.kind = DT__COLL_ALL_REDUCE,
                   .dtype = DT_DTYPE_F32,
                   .op = DT_REDUCE_SUM,
                   .axes = 1u,
                   .send = sa,
                   .recv = pa,
                   .count = 8};
    dt__coll cb = {.kind = DT__COLL_ALL_GATHER,
                   .dtype = DT_DTYPE_F32,
                   .axes = 2u,
                   .send = sb,
                   .recv = pb,
                   .count = 8};
    dt__coll_req *qa = NULL, *qb = NULL;
    cr_assert_eq(dt__collective_start(m, &ca, &qa), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt__collective_start(m, &cb, &qb), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt__collective_wait(qb), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt__collective_wait(qa), DT_OK, "%s", dt_last_error());
    for (int i = 0; i < 4; i++)
        for (int e = 0; e < 8; e++) {
            /* x groups {0,2}, {1,3}; y groups {0,1}, {2,3} */
            int px = i ^ 2, y0 = i & 2;
            cr_expect_eq(ra[i][e], (float)(i + e + px + e));
            cr_expect_eq(rb[i][e], (float)(10 * y0 + e));
            cr_expect_eq(rb[i][8 + e], (float)(10 * (y0 + 1) + e));
        }
    dt_mesh_free(m);
    stop();
}

Test(collectives, ledger)
{
    start(4);
    dt_mesh *m = mesh_of("x=2,y=2");
    cr_expect_eq(dt_ledger_size(), 0);
    bool ok;
    char why[256];
    ref_case c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_F32,
                  .op = DT_REDUCE_SUM,
                  .axes = 3u,
                  .count = 1000,
                  .cause = "matmul#7"};
    cr_assert_eq(ref_run(m, &c, &ok, why, sizeof why), DT_OK, "%s", dt_last_error());
    cr_expect(ok, "%s", why);
    cr_expect_eq(dt_ledger_next_step(), 1);
    ref_case d = {.kind = DT__COLL_ALL_GATHER, .dtype = DT_DTYPE_I64, .axes = 1u, .count = 10};
    cr_assert_eq(ref_run(m, &d, &ok, why, sizeof why), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_ledger_size(), 2);
    dt_ledger_entry e;
    cr_assert_eq(dt_ledger_entry_get(0, &e), DT_OK);
    cr_expect_str_eq(e.op, "all_reduce");
    cr_expect_str_eq(e.reduce, "sum");
    cr_expect_str_eq(e.axes_names, "x,y");
    cr_expect_str_eq(e.cause, "matmul#7");
    cr_expect_str_eq(e.backend, "local");
    cr_expect_eq(e.group_size, 4);
    cr_expect_eq(e.step, 0);
    /* ring volume 2(g-1)/g of 4000 bytes */
    cr_expect_eq(e.bytes_sent, 6000);
    cr_expect_eq(e.bytes_received, 6000);
    cr_expect_geq(e.seconds, 0.0);
    cr_assert_eq(dt_ledger_entry_get(1, &e), DT_OK);
    cr_expect_str_eq(e.op, "all_gather");
    cr_expect_str_eq(e.axes_names, "x");
    cr_expect_eq(e.step, 1);
    cr_expect_eq(e.bytes_sent, 80);     /* own 10 x 8 bytes to 1 other member */
    cr_expect_eq(e.bytes_received, 80); /* the other member's block */
    cr_expect_eq(dt_ledger_entry_get(2, &e), DT_ERR_ARG);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(dt_ledger_print(f), DT_OK);
    fclose(f);
    cr_expect(strstr(text, "step 0") && strstr(text, "step 1") && strstr(text, "matmul#7") &&
                  strstr(text, "all_gather"),
              "%s", text);
    free(text);
    f = open_memstream(&text, &len);
    cr_assert_eq(dt_ledger_write_json(f), DT_OK);
    fclose(f);
    cr_expect(strstr(text, "\"op\": \"all_reduce\"") && strstr(text, "\"cause\": \"matmul#7\"") &&
                  strstr(text, "\"bytes_sent\": 6000") && strstr(text, "\"step\": 1"),
              "%s", text);
    free(text);
    dt_ledger_clear();
    cr_expect_eq(dt_ledger_size(), 0);
    dt_mesh_free(m);
    stop();
}

Test(collectives, mesh_algorithm)
{
    start(2);
    dt_mesh *m = mesh_of("x=2");
    cr_expect_eq(dt_mesh_collective_algorithm(m), DT_ALGORITHM_AUTO);
    cr_expect_eq(dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_NCCL), DT_ERR_UNSUPPORTED);
    cr_expect(strstr(dt_last_error(), "nccl"), "%s", dt_last_error());
    cr_expect_eq(dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_COUNT), DT_ERR_ARG);
    cr_expect_eq(dt_mesh_set_collective_algorithm(NULL, DT_ALGORITHM_RING), DT_ERR_ARG);
    cr_assert_eq(dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE), DT_OK);
    bool ok;
    char why[256];
    ref_case c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_I32,
                  .op = DT_REDUCE_MAX,
                  .axes = 1u,
                  .count = 33};
    cr_assert_eq(ref_run(m, &c, &ok, why, sizeof why), DT_OK, "%s", dt_last_error());
    cr_expect(ok, "%s", why);
    dt_ledger_entry e;
    cr_assert_eq(dt_ledger_entry_get(dt_ledger_size() - 1, &e), DT_OK);
    cr_expect_eq(e.algorithm, DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE);
    /* a per-call choice overrides the mesh's; NCCL on a CPU mesh is refused */
    c.algorithm = DT_ALGORITHM_NCCL;
    cr_expect_eq(ref_run(m, &c, &ok, why, sizeof why), DT_ERR_UNSUPPORTED);
    dt_mesh_free(m);
    stop();
}

Test(collectives, validation)
{
    start(3);
    dt_mesh *m = mesh_of("x=3");
    float buf[3][4] = {{0}};
    const void *s[3] = {buf[0], buf[1], buf[2]};
    void *r[3] = {buf[0], buf[1], buf[2]};
    dt__coll c = {.kind = DT__COLL_BROADCAST,
                  .dtype = DT_DTYPE_F32,
                  .axes = 1u,
                  .root = 3,
                  .send = s,
                  .recv = r,
                  .count = 4};
    cr_expect_eq(dt__collective(m, &c), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "root 3"), "%s", dt_last_error());
    c.root = 0;
    c.axes = 2u;
    cr_expect_eq(dt__collective(m, &c), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "0x2"), "%s", dt_last_error());
    c.axes = 1u;
    c.count = -1;
    cr_expect_eq(dt__collective(m, &c), DT_ERR_ARG);
    c.count = 4;
    c.dtype = DT_DTYPE_COUNT;
    cr_expect_eq(dt__collective(m, &c), DT_ERR_DTYPE);
    c.dtype = DT_DTYPE_F32;
    c.kind = DT__COLL_ALL_REDUCE;
    c.op = DT_REDUCE_COUNT;
    cr_expect_eq(dt__collective(m, &c), DT_ERR_ARG);
    /* the devices of one group must pass the same counts */
    int64_t c0[3] = {1, 1, 1}, c1[3] = {1, 2, 1};
    const int64_t *cs[3] = {c0, c1, c0};
    dt__coll g = {.kind = DT__COLL_ALL_GATHER,
                  .dtype = DT_DTYPE_F32,
                  .axes = 1u,
                  .send = s,
                  .recv = r,
                  .counts = cs};
    cr_expect_eq(dt__collective(m, &g), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "entry 1 is 1 and 2"), "%s", dt_last_error());
    g.kind = DT__COLL_ALL_REDUCE;
    cr_expect_eq(dt__collective(m, &g), DT_ERR_ARG); /* no uneven all-reduce */
    /* the check alone, one client: still runs and still catches local errors */
    dt__rt.check_collectives = true; /* as DTENSOR_CHECK_COLLECTIVES=1 at dt_init */
    bool ok;
    char why[256];
    ref_case rc = {.kind = DT__COLL_REDUCE_SCATTER,
                   .dtype = DT_DTYPE_F64,
                   .op = DT_REDUCE_MEAN,
                   .axes = 1u,
                   .uneven = true,
                   .seed = 3};
    cr_expect_eq(ref_run(m, &rc, &ok, why, sizeof why), DT_OK, "%s", dt_last_error());
    cr_expect(ok, "%s", why);
    g.kind = DT__COLL_ALL_GATHER;
    cr_expect_eq(dt__collective(m, &g), DT_ERR_ARG);
    dt__rt.check_collectives = false;
    dt_mesh_free(m);
    stop();
}
