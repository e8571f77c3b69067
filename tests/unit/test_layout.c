/* Layouts: text form, errors, helpers, equality, uneven shards and local shapes. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>
#include <string.h>

static dt_mesh *setup(int devices, const char *spec)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "dt_init: %s", dt_last_error());
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "mesh %s: %s", spec,
                 dt_last_error());
    return m;
}

static void teardown(dt_mesh *m)
{
    dt_mesh_free(m);
    cr_assert_eq(dt_finalize(), DT_OK, "dt_finalize: %s", dt_last_error());
}

/* ---- text form ----------------------------------------------------------------------------- */

/* Mesh x=2,y=2,z=2: axis indices x 0, y 1, z 2. Expected fields written by hand. */
static const struct {
    const char *text, *canonical;
    int rank;
    int axes[DT_MAX_RANK];
    unsigned partial;
    dt_reduce_op op;
} good[] = {
    {"x,unsharded", "x,unsharded", 2, {0, -1}, 0, DT_REDUCE_SUM},
    {" x , unsharded ", "x,unsharded", 2, {0, -1}, 0, DT_REDUCE_SUM},
    {"x,\tunsharded", "x,unsharded", 2, {0, -1}, 0, DT_REDUCE_SUM},
    {"", "", 0, {0}, 0, DT_REDUCE_SUM},
    {"   ", "", 0, {0}, 0, DT_REDUCE_SUM},
    {"unsharded", "unsharded", 1, {-1}, 0, DT_REDUCE_SUM},
    {"z,x,y", "z,x,y", 3, {2, 0, 1}, 0, DT_REDUCE_SUM},
    {"unsharded,unsharded,unsharded,y,unsharded,unsharded,unsharded,unsharded",
     "unsharded,unsharded,unsharded,y,unsharded,unsharded,unsharded,unsharded",
     8,
     {-1, -1, -1, 1, -1, -1, -1, -1},
     0,
     DT_REDUCE_SUM},
    {";partial_sum=y", ";partial_sum=y", 0, {0}, 2, DT_REDUCE_SUM},
    {"unsharded,y;partial_sum=x", "unsharded,y;partial_sum=x", 2, {-1, 1}, 1, DT_REDUCE_SUM},
    {";partial_max=x+y", ";partial_max=x+y", 0, {0}, 3, DT_REDUCE_MAX},
    {"z ; partial_max = x + y", "z;partial_max=x+y", 1, {2}, 3, DT_REDUCE_MAX},
    {"x;partial_min=y+z", "x;partial_min=y+z", 1, {0}, 6, DT_REDUCE_MIN},
    {"unsharded;partial_prod=z", "unsharded;partial_prod=z", 1, {-1}, 4, DT_REDUCE_PROD},
};

Test(layout, parse_print_round_trip)
{
    dt_mesh *m = setup(8, "x=2,y=2,z=2");
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        dt_layout l;
        cr_assert_eq(dt_layout_parse(m, good[k].text, &l), DT_OK, "\"%s\": %s", good[k].text,
                     dt_last_error());
        cr_expect_eq(l.mesh, m);
        cr_expect_eq(l.rank, good[k].rank, "\"%s\"", good[k].text);
        for (int i = 0; i < good[k].rank; i++)
            cr_expect_eq(l.axes[i], good[k].axes[i], "\"%s\" axis %d", good[k].text, i);
        cr_expect_eq(l.partial, good[k].partial, "\"%s\"", good[k].text);
        if (good[k].partial)
            cr_expect_eq(l.partial_op, good[k].op, "\"%s\"", good[k].text);
        cr_expect_eq(dt_layout_check(&l), DT_OK, "\"%s\"", good[k].text);

        char buf[DT_STRING_MAX];
        cr_assert_eq(dt_layout_to_string(&l, buf, sizeof buf), DT_OK);
        cr_expect_str_eq(buf, good[k].canonical);
        dt_layout back;
        cr_assert_eq(dt_layout_parse(m, buf, &back), DT_OK, "\"%s\": %s", buf, dt_last_error());
        cr_expect(dt_layout_equal(&l, &back), "\"%s\" -> \"%s\"", good[k].text, buf);
    }
    teardown(m);
}

Test(layout, partial_axis_order_does_not_matter)
{
    dt_mesh *m = setup(8, "x=2,y=2,z=2");
    dt_layout a, b;
    cr_assert_eq(dt_layout_parse(m, "x;partial_sum=z+y", &a), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_layout_parse(m, "x;partial_sum=y+z", &b), DT_OK, "%s", dt_last_error());
    cr_expect(dt_layout_equal(&a, &b));
    cr_expect_eq(a.partial, 6u);
    teardown(m);
}

static const struct {
    const char *text;
    dt_status status;
    const char *needle[2]; /* must appear in the message */
} bad[] = {
    {"w", DT_ERR_LAYOUT, {"\"w\"", "x=2,y=2,z=2"}},
    {"x,X", DT_ERR_LAYOUT, {"\"X\"", "axis 1"}},
    {"x,x", DT_ERR_LAYOUT, {"\"x\"", "more than one"}},
    {"y,unsharded,y", DT_ERR_LAYOUT, {"\"y\"", "axis 2"}},
    {"unsharded,unsharded,unsharded,unsharded,unsharded,unsharded,unsharded,unsharded,unsharded",
     DT_ERR_LAYOUT,
     {"9 axes", "at most 8"}},
    {"x,", DT_ERR_LAYOUT, {"\"x,\"", "empty"}},
    {",x", DT_ERR_LAYOUT, {"\",x\"", "axis 0"}},
    {"x;partial_mean=y", DT_ERR_LAYOUT, {"\"mean\"", "partial"}},
    {"x;partial_foo=y", DT_ERR_LAYOUT, {"\"foo\"", "partial"}},
    {"x;partial_sum=x", DT_ERR_LAYOUT, {"\"x\"", "partial"}},
    {"x,y;partial_max=z+y", DT_ERR_LAYOUT, {"\"y\"", "partial"}},
    {"x;partial_sum=w", DT_ERR_LAYOUT, {"\"w\"", "partial"}},
    {"x;partial_sum=y+y", DT_ERR_LAYOUT, {"\"y\"", "twice"}},
    {"x;partial_sum=", DT_ERR_LAYOUT, {"partial", "no mesh axis"}},
    {"x;sum=y", DT_ERR_LAYOUT, {"x;sum=y", "partial_"}},
    {"x;partial_sum", DT_ERR_LAYOUT, {"x;partial_sum", "partial_"}},
};

Test(layout, parse_errors_name_the_values)
{
    dt_mesh *m = setup(8, "x=2,y=2,z=2");
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dt_layout l;
        memset(&l, 0x5a, sizeof l);
        dt_status s = dt_layout_parse(m, bad[k].text, &l);
        cr_expect_eq(s, bad[k].status, "\"%s\": got %s (%s)", bad[k].text, dt_status_name(s),
                     dt_last_error());
        for (int i = 0; i < 2; i++)
            cr_expect(strstr(dt_last_error(), bad[k].needle[i]), "\"%s\": message \"%s\" lacks %s",
                      bad[k].text, dt_last_error(), bad[k].needle[i]);
        cr_expect_null(l.mesh, "\"%s\": out not cleared", bad[k].text);
        cr_expect_eq(l.rank, 0);
    }
    teardown(m);
}

Test(layout, parse_too_long)
{
    dt_mesh *m = setup(2, "x=2");
    char text[DT_STRING_MAX + 10];
    memset(text, ' ', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    text[0] = 'x';
    dt_layout l;
    cr_expect_eq(dt_layout_parse(m, text, &l), DT_ERR_LAYOUT);
    char num[32];
    snprintf(num, sizeof num, "%zu", strlen(text));
    cr_expect(strstr(dt_last_error(), num), "\"%s\" lacks %s", dt_last_error(), num);
    teardown(m);
}

Test(layout, null_arguments)
{
    dt_mesh *m = setup(2, "x=2");
    dt_layout l;
    cr_expect_eq(dt_layout_parse(NULL, "x", &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "mesh is NULL"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_parse(m, NULL, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "text is NULL"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_parse(m, "x", NULL), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "out is NULL"), "%s", dt_last_error());

    cr_expect_eq(dt_layout_create(NULL, 1, (const char *[]){"x"}, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "mesh is NULL"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_create(m, 1, NULL, &l), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "specs is NULL"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_create(m, 2, (const char *[]){"x", NULL}, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "axis 1 is NULL"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_create(m, 1, (const char *[]){"x"}, NULL), DT_ERR_ARG);
    cr_expect_eq(dt_layout_create(m, 9, NULL, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "rank 9"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_create(m, -1, NULL, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "rank -1"), "%s", dt_last_error());
    /* rank 0 needs no specs */
    cr_expect_eq(dt_layout_create(m, 0, NULL, &l), DT_OK, "%s", dt_last_error());
    cr_expect_eq(l.rank, 0);

    cr_expect_eq(dt_layout_check(NULL), DT_ERR_LAYOUT);
    char buf[64];
    cr_expect_eq(dt_layout_to_string(NULL, buf, sizeof buf), DT_ERR_LAYOUT);
    dt_layout ok;
    cr_assert_eq(dt_layout_parse(m, "x", &ok), DT_OK);
    cr_expect_eq(dt_layout_to_string(&ok, NULL, 10), DT_ERR_ARG);
    teardown(m);
}

Test(layout, create_unknown_axis_names_it)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_layout l;
    const char *specs[] = {"y", "batch"};
    cr_expect_eq(dt_layout_create(m, 2, specs, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"batch\""), "%s", dt_last_error());
    cr_expect(strstr(dt_last_error(), "x=3,y=2"), "%s", dt_last_error());
    cr_expect_null(l.mesh);
    const char *ok_specs[] = {"y", "unsharded", "x"};
    cr_assert_eq(dt_layout_create(m, 3, ok_specs, &l), DT_OK, "%s", dt_last_error());
    cr_expect_eq(l.axes[0], 1);
    cr_expect_eq(l.axes[1], DT_UNSHARDED);
    cr_expect_eq(l.axes[2], 0);
    cr_expect_eq(l.partial, 0u);
    teardown(m);
}

/* A layout built by hand, then damaged one field at a time. */
Test(layout, check_hand_built)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_layout base = {.mesh = m, .rank = 2, .axes = {0, DT_UNSHARDED}};
    cr_expect_eq(dt_layout_check(&base), DT_OK, "%s", dt_last_error());

    dt_layout l = base;
    l.axes[1] = 2;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "mesh axis 2") && strstr(dt_last_error(), "2 axes"), "%s",
              dt_last_error());
    char buf[64];
    cr_expect_eq(dt_layout_to_string(&l, buf, sizeof buf), DT_ERR_LAYOUT);

    l = base;
    l.axes[0] = -2;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "-2"), "%s", dt_last_error());

    l = base;
    l.axes[1] = 0;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"x\""), "%s", dt_last_error());

    l = base;
    l.rank = 9;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "rank 9"), "%s", dt_last_error());
    l.rank = -1;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "rank -1"), "%s", dt_last_error());

    l = base;
    l.mesh = NULL;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "mesh is NULL"), "%s", dt_last_error());

    l = base;
    l.partial = 1u << 2; /* the mesh has 2 axes */
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "0x4"), "%s", dt_last_error());

    l = base;
    l.partial = 1u; /* x shards axis 0 */
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"x\"") && strstr(dt_last_error(), "partial"), "%s",
              dt_last_error());

    l = base;
    l.partial = 2u;
    l.partial_op = DT_REDUCE_MEAN;
    cr_expect_eq(dt_layout_check(&l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"mean\""), "%s", dt_last_error());
    l.partial_op = DT_REDUCE_MAX;
    cr_expect_eq(dt_layout_check(&l), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_layout_to_string(&l, buf, sizeof buf), DT_OK);
    cr_expect_str_eq(buf, "x,unsharded;partial_max=y");
    teardown(m);
}

Test(layout, to_string_small_buffer)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &l), DT_OK);
    char buf[11];
    cr_expect_eq(dt_layout_to_string(&l, buf, sizeof buf), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "12") && strstr(dt_last_error(), "11"), "%s",
              dt_last_error());
    char exact[12];
    cr_expect_eq(dt_layout_to_string(&l, exact, sizeof exact), DT_OK, "%s", dt_last_error());
    cr_expect_str_eq(exact, "x,unsharded");
    teardown(m);
}

/* ---- helpers, equality, shards --------------------------------------------------------------- */

Test(layout, helpers)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_layout l;
    for (int rank = 0; rank <= DT_MAX_RANK; rank++) {
        cr_assert_eq(dt_layout_replicated(m, rank, &l), DT_OK, "%s", dt_last_error());
        cr_expect_eq(l.rank, rank);
        for (int i = 0; i < rank; i++)
            cr_expect_eq(l.axes[i], DT_UNSHARDED);
        cr_expect_eq(l.partial, 0u);
        cr_expect(dt_layout_is_replicated(&l));
    }
    cr_expect_eq(dt_layout_replicated(m, 9, &l), DT_ERR_LAYOUT);

    cr_assert_eq(dt_layout_batch_sharded(m, "y", 3, &l), DT_OK, "%s", dt_last_error());
    cr_expect(l.rank == 3 && l.axes[0] == 1 && l.axes[1] == -1 && l.axes[2] == -1);
    cr_expect_not(dt_layout_is_replicated(&l));
    cr_assert_eq(dt_layout_batch_sharded(m, "x", 1, &l), DT_OK, "%s", dt_last_error());
    cr_expect(l.rank == 1 && l.axes[0] == 0);

    cr_assert_eq(dt_layout_inner_sharded(m, "x", 3, &l), DT_OK, "%s", dt_last_error());
    cr_expect(l.rank == 3 && l.axes[0] == -1 && l.axes[1] == -1 && l.axes[2] == 0);
    cr_assert_eq(dt_layout_inner_sharded(m, "y", 1, &l), DT_OK, "%s", dt_last_error());
    cr_expect(l.rank == 1 && l.axes[0] == 1);
    cr_assert_eq(dt_layout_inner_sharded(m, "y", 8, &l), DT_OK, "%s", dt_last_error());
    cr_expect(l.axes[7] == 1 && l.axes[0] == -1);

    cr_expect_eq(dt_layout_batch_sharded(m, "x", 0, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "rank 0"), "%s", dt_last_error());
    cr_expect_eq(dt_layout_inner_sharded(m, "x", 0, &l), DT_ERR_LAYOUT);
    cr_expect_eq(dt_layout_batch_sharded(m, "z", 2, &l), DT_ERR_LAYOUT);
    cr_expect(strstr(dt_last_error(), "\"z\""), "%s", dt_last_error());
    cr_expect_null(l.mesh);
    cr_expect_eq(dt_layout_inner_sharded(m, "x", 9, &l), DT_ERR_LAYOUT);
    cr_expect_eq(dt_layout_batch_sharded(m, "x", 2, NULL), DT_ERR_ARG);

    /* partial only: not replicated */
    cr_assert_eq(dt_layout_parse(m, "unsharded;partial_sum=x", &l), DT_OK);
    cr_expect_not(dt_layout_is_replicated(&l));
    cr_expect_not(dt_layout_is_replicated(NULL));
    teardown(m);
}

Test(layout, equality)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_mesh *other = NULL;
    cr_assert_eq(dt_mesh_create_from_string("x=3,y=2", DT_DEVICE_CPU, &other), DT_OK);
    dt_layout a, b;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &a), DT_OK);
    cr_assert_eq(dt_layout_batch_sharded(m, "x", 2, &b), DT_OK);
    cr_expect(dt_layout_equal(&a, &b));
    cr_expect(dt_layout_equal(&a, &a));

    static const char *const differ[] = {
        "y,unsharded", "unsharded,x", "x", "x,unsharded,unsharded", "x,unsharded;partial_sum=y",
        "x,y"};
    for (size_t k = 0; k < sizeof differ / sizeof differ[0]; k++) {
        cr_assert_eq(dt_layout_parse(m, differ[k], &b), DT_OK, "%s", dt_last_error());
        cr_expect_not(dt_layout_equal(&a, &b), "\"x,unsharded\" vs \"%s\"", differ[k]);
        cr_expect_not(dt_layout_equal(&b, &a), "\"%s\" vs \"x,unsharded\"", differ[k]);
    }
    dt_layout p1, p2;
    cr_assert_eq(dt_layout_parse(m, "x;partial_sum=y", &p1), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "x;partial_max=y", &p2), DT_OK);
    cr_expect_not(dt_layout_equal(&p1, &p2));

    /* Same text on a different mesh (even one described the same way) is not equal. */
    cr_assert_eq(dt_layout_parse(other, "x,unsharded", &b), DT_OK);
    cr_expect_not(dt_layout_equal(&a, &b));
    cr_expect_not(dt_layout_equal(&a, NULL));
    cr_expect_not(dt_layout_equal(NULL, &a));
    dt_mesh_free(other);
    teardown(m);
}

Test(layout, num_shards)
{
    dt_mesh *m = setup(6, "x=3,y=2");
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "y,unsharded,x", &l), DT_OK);
    cr_expect_eq(dt_layout_num_shards(&l, 0), 2);
    cr_expect_eq(dt_layout_num_shards(&l, 1), 1);
    cr_expect_eq(dt_layout_num_shards(&l, 2), 3);
    cr_expect_eq(dt_layout_num_shards(&l, 3), 1);
    cr_expect_eq(dt_layout_num_shards(&l, -1), 1);
    cr_expect_eq(dt_layout_num_shards(NULL, 0), 1);
    cr_assert_eq(dt_layout_parse(m, "unsharded;partial_sum=x+y", &l), DT_OK);
    cr_expect_eq(dt_layout_num_shards(&l, 0), 1, "partial axes do not split a tensor axis");
    teardown(m);
}

/* ---- uneven shards (pure arithmetic, no runtime) ---------------------------------------- */

Test(shards, against_dealing)
{
    for (int64_t n = 0; n <= 20; n++)
        for (int s = 1; s <= 7; s++) {
            int64_t size[REF_MAX_SHARDS], off[REF_MAX_SHARDS];
            ref_shards(n, s, size, off);
            int64_t sum = 0, lo = INT64_MAX, hi = 0;
            for (int i = 0; i < s; i++) {
                int64_t got = dt_shard_size(n, s, i), at = dt_shard_offset(n, s, i);
                cr_expect_eq(got, size[i], "n=%ld s=%d i=%d: size %ld, dealt %ld", (long)n, s, i,
                             (long)got, (long)size[i]);
                cr_expect_eq(at, off[i], "n=%ld s=%d i=%d: offset %ld, dealt %ld", (long)n, s, i,
                             (long)at, (long)off[i]);
                /* contiguous: each shard starts where the previous ends */
                cr_expect_eq(at, sum, "n=%ld s=%d i=%d: offset %ld after %ld elements", (long)n, s,
                             i, (long)at, (long)sum);
                cr_expect_geq(got, 0);
                sum += got;
                lo = got < lo ? got : lo;
                hi = got > hi ? got : hi;
                /* the first n mod s shards carry the extra element */
                if (i > 0)
                    cr_expect_leq(got, dt_shard_size(n, s, i - 1));
            }
            cr_expect_eq(sum, n, "n=%ld s=%d: sizes sum to %ld", (long)n, s, (long)sum);
            cr_expect_leq(hi - lo, 1, "n=%ld s=%d: sizes %ld..%ld", (long)n, s, (long)lo, (long)hi);
        }
}

Test(shards, large_extent)
{
    /* Beyond 32 bits; known answer: 10^12 + 3 over 7 is 142857142857 r 4. */
    const int64_t n = 1000000000003LL;
    int64_t sum = 0;
    for (int i = 0; i < 7; i++) {
        int64_t want = 142857142857LL + (i < 4 ? 1 : 0);
        cr_expect_eq(dt_shard_size(n, 7, i), want, "shard %d", i);
        cr_expect_eq(dt_shard_offset(n, 7, i), sum, "shard %d", i);
        sum += want;
    }
    cr_expect_eq(sum, n);
}

/* ---- local shapes for every device of several meshes ---------------------------------------- */

static const int64_t shapes2[][2] = {{0, 3}, {1, 1}, {5, 7}, {6, 4}, {3, 0}, {2, 9}, {8, 8}};
static const int64_t shapes3[][3] = {{3, 5, 2}, {0, 2, 3}, {4, 1, 7}, {2, 2, 2}, {7, 3, 5}};

static void check_shape_of(dt_mesh *m, const int sizes[], int num_axes, const int axes[], int rank,
                           const int64_t shape[])
{
    const char *const names[] = {"x", "y", "z"};
    const char *specs[DT_MAX_RANK];
    ref_specs(names, rank, axes, specs);
    dt_layout l;
    cr_assert_eq(dt_layout_create(m, rank, specs, &l), DT_OK, "%s", dt_last_error());
    ref_place p = {.num_axes = num_axes, .rank = rank};
    memcpy(p.sizes, sizes, sizeof(int) * (size_t)num_axes);
    memcpy(p.axes, axes, sizeof(int) * (size_t)rank);
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
    char lb[DT_STRING_MAX];
    dt_layout_to_string(&l, lb, sizeof lb);
    int64_t held = 0;
    for (int d = 0; d < dt_mesh_size(m); d++) {
        int coords[DT_MAX_MESH_AXES];
        ref_coords(num_axes, sizes, d, coords);
        int64_t want[DT_MAX_RANK], want_off[DT_MAX_RANK], got[DT_MAX_RANK], got_off[DT_MAX_RANK];
        ref_local_shape(&p, coords, want, want_off);
        cr_assert_eq(dt_layout_local_shape(&l, shape, d, got, got_off), DT_OK, "%s",
                     dt_last_error());
        for (int i = 0; i < rank; i++) {
            cr_expect_eq(got[i], want[i], "layout \"%s\" device %d axis %d: %ld, want %ld", lb, d,
                         i, (long)got[i], (long)want[i]);
            cr_expect_eq(got_off[i], want_off[i],
                         "layout \"%s\" device %d axis %d: offset %ld, "
                         "want %ld",
                         lb, d, i, (long)got_off[i], (long)want_off[i]);
        }
        /* offset may be NULL */
        cr_expect_eq(dt_layout_local_shape(&l, shape, d, got, NULL), DT_OK);
        held += ref_count(rank, got);
    }
    /* Every element is held by exactly the devices that replicate it. */
    int64_t copies = dt_mesh_size(m);
    for (int i = 0; i < rank; i++)
        if (axes[i] >= 0)
            copies /= sizes[axes[i]];
    cr_expect_eq(held, ref_count(rank, shape) * copies, "layout \"%s\"", lb);

    int64_t tmp[DT_MAX_RANK];
    cr_expect_eq(dt_layout_local_shape(&l, shape, dt_mesh_size(m), tmp, NULL), DT_ERR_ARG);
    cr_expect_eq(dt_layout_local_shape(&l, shape, -1, tmp, NULL), DT_ERR_ARG);
}

static void check_local_shapes(int num_axes, const int sizes[], const char *spec)
{
    int devices = 1;
    for (int a = 0; a < num_axes; a++)
        devices *= sizes[a];
    dt_mesh *m = setup(devices, spec);
    int layouts[512][DT_MAX_RANK];
    int count = ref_all_layouts(num_axes, 2, layouts, 512);
    for (int k = 0; k < count; k++)
        for (size_t s = 0; s < sizeof shapes2 / sizeof shapes2[0]; s++)
            check_shape_of(m, sizes, num_axes, layouts[k], 2, shapes2[s]);
    count = ref_all_layouts(num_axes, 3, layouts, 512);
    for (int k = 0; k < count; k++)
        for (size_t s = 0; s < sizeof shapes3 / sizeof shapes3[0]; s++)
            check_shape_of(m, sizes, num_axes, layouts[k], 3, shapes3[s]);
    /* a negative extent is refused */
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(m, 2, &l), DT_OK);
    int64_t tmp[2];
    cr_expect_eq(dt_layout_local_shape(&l, (int64_t[]){2, -3}, 0, tmp, NULL), DT_ERR_SHAPE);
    cr_expect(strstr(dt_last_error(), "-3"), "%s", dt_last_error());
    teardown(m);
}

Test(local_shape, mesh_1)
{
    check_local_shapes(1, (int[]){1}, "x=1");
}
Test(local_shape, mesh_2)
{
    check_local_shapes(1, (int[]){2}, "x=2");
}
Test(local_shape, mesh_4)
{
    check_local_shapes(1, (int[]){4}, "x=4");
}
Test(local_shape, mesh_2x2)
{
    check_local_shapes(2, (int[]){2, 2}, "x=2,y=2");
}
Test(local_shape, mesh_3x2)
{
    check_local_shapes(2, (int[]){3, 2}, "x=3,y=2");
}
Test(local_shape, mesh_2x3)
{
    check_local_shapes(2, (int[]){2, 3}, "x=2,y=3");
}
Test(local_shape, mesh_2x2x2)
{
    check_local_shapes(3, (int[]){2, 2, 2}, "x=2,y=2,z=2");
}
Test(local_shape, mesh_3x1x2)
{
    check_local_shapes(3, (int[]){3, 1, 2}, "x=3,y=1,z=2");
}
