/* DTensor on one client: from_host, pack, unpack, read, partial layouts, memory, errors. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const axis_names[] = {"x", "y", "z"};

static dt_mesh *setup(int num_axes, const int sizes[])
{
    int devices = 1;
    char spec[64] = "";
    for (int a = 0; a < num_axes; a++) {
        devices *= sizes[a];
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s=%d", a ? "," : "",
                 axis_names[a], sizes[a]);
    }
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

#define EXPECT_MSG(needle)                                                                       \
    cr_expect(strstr(dt_last_error(), (needle)), "message \"%s\" lacks \"%s\"", dt_last_error(), \
              (needle))

static size_t device_bytes(int i)
{
    size_t cur = 0;
    cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &cur, NULL), DT_OK, "%s", dt_last_error());
    return cur;
}

static void expect_no_memory(const dt_mesh *m, const char *what)
{
    for (int i = 0; i < dt_mesh_num_local_devices(m); i++)
        cr_expect_eq(device_bytes(i), 0, "%s: device %d still holds %zu bytes", what, i,
                     device_bytes(i));
}

/* ---- round trips over every layout -------------------------------------------------------- */

static const dt_dtype dtypes[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_I32, DT_DTYPE_I64};

/* from_host, then check every component by unpack, the memory of every device, the whole by
 * read; then the same through pack of the reference components. */
static void round_trip(dt_mesh *m, const int sizes[], int num_axes, const int axes[], int rank,
                       const int64_t shape[], dt_dtype dtype)
{
    const char *specs[DT_MAX_RANK];
    ref_specs(axis_names, rank, axes, specs);
    dt_layout l;
    cr_assert_eq(dt_layout_create(m, rank, specs, &l), DT_OK, "%s", dt_last_error());
    char what[DT_STRING_MAX + 256], lb[DT_STRING_MAX], sb[DT__SHAPE_STR_MAX];
    dt_layout_to_string(&l, lb, sizeof lb);
    snprintf(what, sizeof what, "layout \"%s\" shape %s %s", lb,
             dt__shape_str(sb, sizeof sb, rank, shape), dt_dtype_name(dtype));

    ref_place p = {.num_axes = num_axes, .rank = rank};
    memcpy(p.sizes, sizes, sizeof(int) * (size_t)num_axes);
    memcpy(p.axes, axes, sizeof(int) * (size_t)rank);
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
    size_t es = dt_dtype_size(dtype);
    int64_t n = ref_count(rank, shape);
    size_t full = (size_t)n * es;
    char *global = malloc(full + 1), *back = malloc(full + 16), *want = malloc(full + 1),
         *got = malloc(full + 16);
    ref_fill(dtype, n, global, rank * 7 + (int)dtype);

    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, dtype, rank, shape, global, full, &t), DT_OK, "%s: %s",
                 what, dt_last_error());
    cr_expect_eq(dt_tensor_rank(t), rank);
    cr_expect_eq(dt_tensor_dtype(t), dtype);
    cr_expect_eq(dt_tensor_num_elements(t), n);
    cr_expect_eq(dt_tensor_mesh(t), m);
    cr_expect(dt_layout_equal(dt_tensor_layout(t), &l), "%s", what);
    for (int i = 0; i < rank; i++)
        cr_expect_eq(dt_tensor_shape(t)[i], shape[i]);

    int devices = dt_mesh_size(m);
    const void *comps[64];
    const int64_t *comp_shapes[64];
    int64_t local_shapes[64][DT_MAX_RANK];
    char *comp_data[64];
    for (int d = 0; d < devices; d++) {
        int coords[DT_MAX_MESH_AXES];
        ref_coords(num_axes, sizes, d, coords);
        int64_t rl[DT_MAX_RANK], ro[DT_MAX_RANK], tl[DT_MAX_RANK];
        ref_local_shape(&p, coords, rl, ro);
        cr_assert_eq(dt_tensor_local_shape(t, d, tl), DT_OK, "%s", dt_last_error());
        for (int i = 0; i < rank; i++)
            cr_expect_eq(tl[i], rl[i], "%s device %d axis %d", what, d, i);
        int64_t count = ref_component(&p, coords, global, es, want);
        cr_expect_eq(count, ref_count(rank, rl), "%s device %d", what, d);
        size_t bytes = (size_t)count * es;
        memset(got, 0x6b, full + 16);
        cr_assert_eq(dt_tensor_unpack(t, d, got, bytes), DT_OK, "%s device %d: %s", what, d,
                     dt_last_error());
        cr_expect(memcmp(got, want, bytes) == 0, "%s device %d: component differs", what, d);
        cr_expect_eq((unsigned char)got[bytes], 0x6b, "%s device %d: unpack wrote past %zu bytes",
                     what, d, bytes);
        if (bytes)
            cr_expect_eq(dt_tensor_unpack(t, d, got, bytes - 1), DT_ERR_ARG, "%s", what);
        /* the device holds its shard and nothing more */
        cr_expect_eq(device_bytes(d), bytes, "%s device %d: %zu bytes allocated, shard is %zu",
                     what, d, device_bytes(d), bytes);
        memcpy(local_shapes[d], rl, sizeof rl);
        comp_shapes[d] = local_shapes[d];
        comp_data[d] = malloc(bytes + 1);
        memcpy(comp_data[d], want, bytes);
        comps[d] = comp_data[d];
    }
    memset(back, 0x5c, full + 16);
    cr_assert_eq(dt_tensor_read(t, back, full), DT_OK, "%s: %s", what, dt_last_error());
    cr_expect(memcmp(back, global, full) == 0, "%s: read differs", what);
    cr_expect_eq((unsigned char)back[full], 0x5c, "%s: read wrote past the end", what);
    /* a larger buffer is fine */
    cr_assert_eq(dt_tensor_read(t, back, full + 16), DT_OK, "%s: %s", what, dt_last_error());
    cr_expect(memcmp(back, global, full) == 0, "%s: read differs", what);
    dt_tensor_free(t);
    expect_no_memory(m, what);

    /* pack the reference components: read gives the global array again */
    t = NULL;
    cr_assert_eq(dt_tensor_pack(&l, dtype, rank, shape, devices, comps, comp_shapes, &t), DT_OK,
                 "%s: pack: %s", what, dt_last_error());
    memset(back, 0x5c, full + 16);
    cr_assert_eq(dt_tensor_read(t, back, full), DT_OK, "%s: %s", what, dt_last_error());
    cr_expect(memcmp(back, global, full) == 0, "%s: read after pack differs", what);
    dt_tensor_free(t);
    expect_no_memory(m, what);
    for (int d = 0; d < devices; d++)
        free(comp_data[d]);
    free(global);
    free(back);
    free(want);
    free(got);
}

static const int64_t shapes1[][1] = {{0}, {1}, {7}, {12}};
static const int64_t shapes2[][2] = {{0, 3}, {1, 1}, {5, 7}, {6, 4}, {3, 0}, {2, 9}};
static const int64_t shapes3[][3] = {{3, 5, 2}, {0, 2, 3}, {4, 1, 7}};

static void round_trips(int num_axes, const int sizes[])
{
    dt_mesh *m = setup(num_axes, sizes);
    int layouts[512][DT_MAX_RANK];
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++) {
        round_trip(m, sizes, num_axes, (int[]){0}, 0, (int64_t[]){1}, dtypes[k]);
        int count = ref_all_layouts(num_axes, 1, layouts, 512);
        for (int j = 0; j < count; j++)
            for (size_t s = 0; s < sizeof shapes1 / sizeof shapes1[0]; s++)
                round_trip(m, sizes, num_axes, layouts[j], 1, shapes1[s], dtypes[k]);
        count = ref_all_layouts(num_axes, 2, layouts, 512);
        for (int j = 0; j < count; j++)
            for (size_t s = 0; s < sizeof shapes2 / sizeof shapes2[0]; s++)
                round_trip(m, sizes, num_axes, layouts[j], 2, shapes2[s], dtypes[k]);
        count = ref_all_layouts(num_axes, 3, layouts, 512);
        for (int j = 0; j < count; j++)
            for (size_t s = 0; s < sizeof shapes3 / sizeof shapes3[0]; s++)
                round_trip(m, sizes, num_axes, layouts[j], 3, shapes3[s], dtypes[k]);
    }
    teardown(m);
}

Test(round_trip, mesh_1)
{
    round_trips(1, (int[]){1});
}
Test(round_trip, mesh_2)
{
    round_trips(1, (int[]){2});
}
Test(round_trip, mesh_4)
{
    round_trips(1, (int[]){4});
}
Test(round_trip, mesh_2x2)
{
    round_trips(2, (int[]){2, 2});
}
Test(round_trip, mesh_3x2)
{
    round_trips(2, (int[]){3, 2});
}
Test(round_trip, mesh_2x2x2)
{
    round_trips(3, (int[]){2, 2, 2});
}

/* The guide's example, by hand: 3x2 tensor on a 3x2 mesh, layout "x,y": one element each. */
Test(round_trip, guide_example_known_answer)
{
    dt_mesh *m = setup(2, (int[]){3, 2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,y", &l), DT_OK);
    const float host[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, host, sizeof host, &t),
                 DT_OK, "%s", dt_last_error());
    for (int i = 0; i < 6; i++) {
        float v = -1;
        cr_assert_eq(dt_tensor_unpack(t, i, &v, sizeof v), DT_OK);
        cr_expect_eq(v, host[i], "device %d holds %g", i, (double)v);
    }
    dt_tensor_free(t);
    /* "unsharded,y": device (i, j) holds column j, all 3 rows */
    cr_assert_eq(dt_layout_parse(m, "unsharded,y", &l), DT_OK);
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){3, 2}, host, sizeof host, &t),
                 DT_OK, "%s", dt_last_error());
    const float col[2][3] = {{1, 3, 5}, {2, 4, 6}};
    for (int i = 0; i < 6; i++) {
        float v[3] = {0};
        cr_assert_eq(dt_tensor_unpack(t, i, v, sizeof v), DT_OK);
        cr_expect_arr_eq(v, col[i % 2], sizeof v, "device %d", i);
    }
    dt_tensor_free(t);
    teardown(m);
}

/* ---- partial layouts --------------------------------------------------------------------- */

/* The term a device with partial-axis key `key` holds for global element e. */
static int64_t term(dt_reduce_op op, int64_t e, int key)
{
    switch (op) {
    case DT_REDUCE_SUM:
        return e * 3 + key * 100 - 50;
    case DT_REDUCE_PROD: {
        static const int64_t v[3] = {1, 2, -1};
        return v[(e + key) % 3];
    }
    default: /* max, min: the winning term moves between devices */
        return (e * 5 + key * 3) % 11 - 5;
    }
}

/* Pack pending terms under a partial layout; read must give their reduction, computed here by
 * visiting every device that holds each element. */
static void check_partial(dt_mesh *m, int num_axes, const int sizes[], const char *text, int rank,
                          const int64_t shape[], dt_dtype dtype)
{
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, text, &l), DT_OK, "\"%s\": %s", text, dt_last_error());
    cr_assert_eq(l.rank, rank);
    char what[128];
    snprintf(what, sizeof what, "\"%s\" %s", text, dt_dtype_name(dtype));
    ref_place p = {.num_axes = num_axes, .rank = rank};
    memcpy(p.sizes, sizes, sizeof(int) * (size_t)num_axes);
    memcpy(p.axes, l.axes, sizeof(int) * (size_t)rank);
    memcpy(p.shape, shape, sizeof(int64_t) * (size_t)rank);
    unsigned sharding = 0;
    for (int i = 0; i < rank; i++)
        if (l.axes[i] >= 0)
            sharding |= 1u << l.axes[i];

    int devices = dt_mesh_size(m);
    size_t es = dt_dtype_size(dtype);
    int64_t n = ref_count(rank, shape);
    int keys[64];
    bool counts[64]; /* coordinate 0 on every replicating axis */
    const void *comps[64];
    const int64_t *comp_shapes[64];
    int64_t local_shapes[64][DT_MAX_RANK];
    for (int d = 0; d < devices; d++) {
        int c[DT_MAX_MESH_AXES];
        ref_coords(num_axes, sizes, d, c);
        keys[d] = 0;
        counts[d] = true;
        for (int a = 0; a < num_axes; a++) {
            if (l.partial & (1u << a))
                keys[d] = keys[d] * sizes[a] + c[a];
            else if (!(sharding & (1u << a)) && c[a] != 0)
                counts[d] = false;
        }
        int64_t off[DT_MAX_RANK];
        ref_local_shape(&p, c, local_shapes[d], off);
        comp_shapes[d] = local_shapes[d];
        char *buf = malloc((size_t)ref_count(rank, local_shapes[d]) * es + 1);
        /* the held elements in row-major order, each the term of this device */
        int64_t idx[DT_MAX_RANK] = {0}, e = 0, k = 0;
        if (n)
            do {
                if (ref_holds(&p, c, idx))
                    ref_set(dtype, buf, k++, term(l.partial_op, e, keys[d]));
                e++;
            } while (ref_next(rank, shape, idx));
        comps[d] = buf;
    }
    /* expected: reduce over the devices that hold element e and count */
    char *want = malloc((size_t)n * es + 1), *got = malloc((size_t)n * es + 1);
    int64_t idx[DT_MAX_RANK] = {0}, e = 0;
    if (n)
        do {
            bool first = true;
            int64_t acc = 0;
            for (int d = 0; d < devices; d++) {
                int c[DT_MAX_MESH_AXES];
                ref_coords(num_axes, sizes, d, c);
                if (!counts[d] || !ref_holds(&p, c, idx))
                    continue;
                int64_t v = term(l.partial_op, e, keys[d]);
                if (first)
                    acc = v;
                else if (l.partial_op == DT_REDUCE_SUM)
                    acc += v;
                else if (l.partial_op == DT_REDUCE_PROD)
                    acc *= v;
                else if (l.partial_op == DT_REDUCE_MAX)
                    acc = v > acc ? v : acc;
                else
                    acc = v < acc ? v : acc;
                first = false;
            }
            cr_assert_not(first, "%s: element %ld held by no device", what, (long)e);
            ref_set(dtype, want, e, acc);
            e++;
        } while (ref_next(rank, shape, idx));

    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_pack(&l, dtype, rank, shape, devices, comps, comp_shapes, &t), DT_OK,
                 "%s: %s", what, dt_last_error());
    cr_expect(dt_layout_equal(dt_tensor_layout(t), &l));
    for (int d = 0; d < devices; d++)
        cr_expect_eq(device_bytes(d), (size_t)ref_count(rank, local_shapes[d]) * es, "%s", what);
    cr_assert_eq(dt_tensor_read(t, got, (size_t)n * es), DT_OK, "%s: %s", what, dt_last_error());
    cr_expect(memcmp(got, want, (size_t)n * es) == 0, "%s: read is not the reduction", what);
    /* the components themselves are unchanged by read */
    for (int d = 0; d < devices; d++) {
        size_t b = (size_t)ref_count(rank, local_shapes[d]) * es;
        char *u = malloc(b + 1);
        cr_assert_eq(dt_tensor_unpack(t, d, u, b), DT_OK);
        cr_expect(memcmp(u, comps[d], b) == 0, "%s device %d", what, d);
        free(u);
    }
    dt_tensor_free(t);
    expect_no_memory(m, what);
    for (int d = 0; d < devices; d++)
        free((void *)comps[d]);
    free(want);
    free(got);
}

Test(partial, mesh_2x2x2)
{
    int sizes[] = {2, 2, 2};
    dt_mesh *m = setup(3, sizes);
    static const struct {
        const char *text;
        int rank;
        int64_t shape[3];
    } cases[] = {
        {"x,unsharded;partial_sum=y", 2, {5, 3}},
        {"unsharded,unsharded;partial_sum=x+z", 2, {3, 4}},
        {"z,y;partial_sum=x", 2, {3, 5}},
        {";partial_sum=x+y+z", 0, {0}},
        {"unsharded;partial_sum=y", 1, {0}},
        {"unsharded,x;partial_max=y+z", 2, {4, 3}},
        {"y,unsharded;partial_max=x", 2, {5, 2}},
        {"x,unsharded,y;partial_min=z", 3, {3, 2, 3}},
        {"unsharded,y;partial_prod=x+z", 2, {2, 5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            check_partial(m, 3, sizes, cases[c].text, cases[c].rank, cases[c].shape, dtypes[k]);
    teardown(m);
}

Test(partial, mesh_3x2)
{
    int sizes[] = {3, 2};
    dt_mesh *m = setup(2, sizes);
    static const char *const texts[] = {
        "unsharded,y;partial_sum=x",           "x,unsharded;partial_sum=y",
        "unsharded,unsharded;partial_sum=x+y", "unsharded,unsharded;partial_max=x+y",
        "y,unsharded;partial_max=x",           "unsharded,y;partial_min=x"};
    for (size_t c = 0; c < sizeof texts / sizeof texts[0]; c++)
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            check_partial(m, 2, sizes, texts[c], 2, (int64_t[]){4, 5}, dtypes[k]);
    teardown(m);
}

Test(partial, mesh_4_known_answer)
{
    dt_mesh *m = setup(1, (int[]){4});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "unsharded;partial_sum=x", &l), DT_OK);
    /* four terms of a 2-vector: {1,10}, {2,20}, {3,30}, {4,40}; the sum is {10, 100} */
    const double terms[4][2] = {{1, 10}, {2, 20}, {3, 30}, {4, 40}};
    const void *comps[4] = {terms[0], terms[1], terms[2], terms[3]};
    const int64_t sh[1] = {2};
    const int64_t *shapes[4] = {sh, sh, sh, sh};
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_pack(&l, DT_DTYPE_F64, 1, sh, 4, comps, shapes, &t), DT_OK, "%s",
                 dt_last_error());
    double sum[2] = {0};
    cr_assert_eq(dt_tensor_read(t, sum, sizeof sum), DT_OK, "%s", dt_last_error());
    cr_expect(sum[0] == 10 && sum[1] == 100, "{%g, %g}", sum[0], sum[1]);
    dt_tensor_free(t);
    cr_assert_eq(dt_layout_parse(m, "unsharded;partial_max=x", &l), DT_OK);
    const double mx[4][2] = {{1, -5}, {7, -9}, {3, -2}, {-4, -8}};
    const void *comps2[4] = {mx[0], mx[1], mx[2], mx[3]};
    cr_assert_eq(dt_tensor_pack(&l, DT_DTYPE_F64, 1, sh, 4, comps2, shapes, &t), DT_OK);
    cr_assert_eq(dt_tensor_read(t, sum, sizeof sum), DT_OK, "%s", dt_last_error());
    cr_expect(sum[0] == 7 && sum[1] == -2, "{%g, %g}", sum[0], sum[1]);
    dt_tensor_free(t);
    teardown(m);
}

Test(partial, from_host_refused)
{
    dt_mesh *m = setup(2, (int[]){2, 2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded;partial_sum=y", &l), DT_OK);
    const float host[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *t = (dt_tensor *)&t;
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){2, 3}, host, sizeof host, &t),
                 DT_ERR_LAYOUT);
    EXPECT_MSG("partial");
    cr_expect_null(t);
    expect_no_memory(m, "refused from_host");
    teardown(m);
}

/* ---- errors -------------------------------------------------------------------------------- */

Test(errors, from_host)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &l), DT_OK);
    const int64_t shape[2] = {5, 3};
    float host[15] = {0};
    dt_tensor *t = (dt_tensor *)&t;

    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, host, 56, &t), DT_ERR_SHAPE);
    EXPECT_MSG("60");
    EXPECT_MSG("56");
    EXPECT_MSG("[5,3]");
    cr_expect_null(t);
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, shape, host, sizeof host, &t),
                 DT_ERR_SHAPE);
    EXPECT_MSG("120");
    EXPECT_MSG("f64");

    /* rank of the shape against the layout's */
    cr_expect_eq(
        dt_tensor_from_host(&l, DT_DTYPE_F32, 3, (int64_t[]){5, 3, 1}, host, sizeof host, &t),
        DT_ERR_LAYOUT);
    EXPECT_MSG("rank 3");
    EXPECT_MSG("rank 2");
    EXPECT_MSG("x,unsharded");
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){15}, host, sizeof host, &t),
                 DT_ERR_LAYOUT);
    EXPECT_MSG("rank 1");

    cr_expect_eq(dt_tensor_from_host(&l, (dt_dtype)9, 2, shape, host, sizeof host, &t),
                 DT_ERR_DTYPE);
    EXPECT_MSG("9");
    cr_expect_eq(
        dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){5, -3}, host, sizeof host, &t),
        DT_ERR_SHAPE);
    EXPECT_MSG("-3");
    cr_expect_eq(
        dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){INT64_MAX, 3}, host, sizeof host, &t),
        DT_ERR_SHAPE);
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, NULL, host, sizeof host, &t), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, NULL, sizeof host, &t),
                 DT_ERR_ARG);
    EXPECT_MSG("host is NULL");
    cr_expect_eq(dt_tensor_from_host(NULL, DT_DTYPE_F32, 2, shape, host, sizeof host, &t),
                 DT_ERR_ARG);
    EXPECT_MSG("layout is NULL");
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, host, sizeof host, NULL),
                 DT_ERR_ARG);
    dt_layout broken = l;
    broken.axes[1] = 5;
    cr_expect_eq(dt_tensor_from_host(&broken, DT_DTYPE_F32, 2, shape, host, sizeof host, &t),
                 DT_ERR_LAYOUT);
    cr_expect_null(t);
    expect_no_memory(m, "failed from_host");

    /* an empty tensor needs no host array */
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){0, 3}, NULL, 0, &t), DT_OK,
                 "%s", dt_last_error());
    cr_expect_eq(dt_tensor_num_elements(t), 0);
    cr_expect_eq(dt_tensor_read(t, NULL, 0), DT_OK, "%s", dt_last_error());
    dt_tensor_free(t);
    teardown(m);
}

Test(errors, pack)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &l), DT_OK);
    const int64_t shape[2] = {5, 3};
    /* 5 rows over 2 devices: 3 and 2 */
    const int64_t s0[2] = {3, 3}, s1[2] = {2, 3};
    int32_t c0[9] = {0}, c1[6] = {0};
    const void *comps[2] = {c0, c1};
    const int64_t *good[2] = {s0, s1};
    const int64_t *swapped[2] = {s1, s0};
    dt_tensor *t = (dt_tensor *)&t;

    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps, swapped, &t), DT_ERR_SHAPE);
    EXPECT_MSG("component 0");
    EXPECT_MSG("[2,3]");
    EXPECT_MSG("[3,3]");
    EXPECT_MSG("[5,3]");
    cr_expect_null(t);
    const int64_t wrong_cols[2] = {2, 4};
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps,
                                (const int64_t *[]){s0, wrong_cols}, &t),
                 DT_ERR_SHAPE);
    EXPECT_MSG("component 1");
    EXPECT_MSG("[2,4]");

    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 1, comps, good, &t), DT_ERR_ARG);
    EXPECT_MSG("1 components");
    EXPECT_MSG("2 local devices");
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 3, comps, good, &t), DT_ERR_ARG);
    EXPECT_MSG("3 components");
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, NULL, good, &t), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps, NULL, &t), DT_ERR_ARG);
    cr_expect_eq(
        dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, (const void *[]){c0, NULL}, good, &t),
        DT_ERR_ARG);
    EXPECT_MSG("component 1 is NULL");
    cr_expect_eq(
        dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps, (const int64_t *[]){s0, NULL}, &t),
        DT_ERR_ARG);
    EXPECT_MSG("component 1");
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 3, (int64_t[]){5, 3, 1}, 2, comps, good, &t),
                 DT_ERR_LAYOUT);
    EXPECT_MSG("rank 3");
    cr_expect_eq(dt_tensor_pack(&l, (dt_dtype)-1, 2, shape, 2, comps, good, &t), DT_ERR_DTYPE);
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps, good, NULL), DT_ERR_ARG);
    cr_expect_null(t);
    expect_no_memory(m, "failed pack");

    /* and the good call works, so the failures above were about their arguments */
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, shape, 2, comps, good, &t), DT_OK, "%s",
                 dt_last_error());
    dt_tensor_free(t);
    /* an empty component may be NULL */
    const int64_t e0[2] = {1, 0}, e1[2] = {1, 0};
    cr_expect_eq(dt_tensor_pack(&l, DT_DTYPE_I32, 2, (int64_t[]){2, 0}, 2,
                                (const void *[]){NULL, NULL}, (const int64_t *[]){e0, e1}, &t),
                 DT_OK, "%s", dt_last_error());
    dt_tensor_free(t);
    teardown(m);
}

Test(errors, unpack_read_local_shape)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &l), DT_OK);
    const int64_t shape[2] = {5, 3};
    float host[15];
    ref_fill(DT_DTYPE_F32, 15, host, 1);
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, host, sizeof host, &t), DT_OK);
    float buf[16];
    cr_expect_eq(dt_tensor_unpack(t, 2, buf, sizeof buf), DT_ERR_ARG);
    EXPECT_MSG("component 2");
    cr_expect_eq(dt_tensor_unpack(t, -1, buf, sizeof buf), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_unpack(t, 0, buf, 35), DT_ERR_ARG);
    EXPECT_MSG("36");
    EXPECT_MSG("35");
    cr_expect_eq(dt_tensor_unpack(t, 0, NULL, 36), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_unpack(NULL, 0, buf, sizeof buf), DT_ERR_ARG);

    cr_expect_eq(dt_tensor_read(t, buf, 59), DT_ERR_ARG);
    EXPECT_MSG("60");
    EXPECT_MSG("59");
    cr_expect_eq(dt_tensor_read(t, NULL, 60), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_read(NULL, buf, 60), DT_ERR_ARG);

    int64_t ls[2];
    cr_expect_eq(dt_tensor_local_shape(t, 2, ls), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_local_shape(NULL, 0, ls), DT_ERR_ARG);
    cr_expect_eq(dt_tensor_local_shape(t, 1, ls), DT_OK);
    cr_expect(ls[0] == 2 && ls[1] == 3);

    cr_expect_null(dt_tensor_layout(NULL));
    cr_expect_null(dt_tensor_mesh(NULL));
    cr_expect_null(dt_tensor_shape(NULL));
    cr_expect_eq(dt_tensor_rank(NULL), 0);
    cr_expect_eq(dt_tensor_num_elements(NULL), 0);
    /* the tensor is still whole after all that */
    cr_assert_eq(dt_tensor_read(t, buf, sizeof buf), DT_OK);
    cr_expect_arr_eq(buf, host, sizeof host);
    dt_tensor_free(t);
    teardown(m);
}

/* ---- memory accounting ------------------------------------------------------------------- */

Test(memory, sharded_tensor_holds_only_its_shards)
{
    dt_mesh *m = setup(2, (int[]){2, 2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,y", &l), DT_OK);
    /* 8x6 f64 = 384 bytes; each device holds a 4x3 block = 96 bytes */
    double host[48];
    ref_fill(DT_DTYPE_F64, 48, host, 3);
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 2, (int64_t[]){8, 6}, host, sizeof host, &t),
                 DT_OK);
    for (int i = 0; i < 4; i++) {
        size_t cur = 0, peak = 0;
        cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &cur, &peak), DT_OK);
        cr_expect_eq(cur, 96, "device %d holds %zu bytes", i, cur);
        cr_expect_geq(peak, cur);
    }
    /* a second, replicated tensor adds the full size on every device */
    dt_layout r;
    cr_assert_eq(dt_layout_replicated(m, 2, &r), DT_OK);
    dt_tensor *u = NULL;
    cr_assert_eq(dt_tensor_from_host(&r, DT_DTYPE_F64, 2, (int64_t[]){8, 6}, host, sizeof host, &u),
                 DT_OK);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(device_bytes(i), 96 + 384, "device %d", i);
    dt_tensor_free(t);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(device_bytes(i), 384, "device %d", i);
    dt_tensor_free(u);
    for (int i = 0; i < 4; i++) {
        size_t cur = 1, peak = 0;
        cr_assert_eq(dt_device_memory(DT_DEVICE_CPU, i, &cur, &peak), DT_OK);
        cr_expect_eq(cur, 0, "device %d", i);
        cr_expect_eq(peak, 96 + 384, "device %d peak %zu", i, peak);
    }
    teardown(m);
}

/* The caching allocator: once every shape of a loop has been seen, the loop takes nothing
 * more from the system; freed blocks are kept (reserved) until released. */
Test(memory, caching_allocator_steady_state)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout rows, cols;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &rows), DT_OK);
    cr_assert_eq(dt_layout_parse(m, "unsharded,x", &cols), DT_OK);
    const int64_t shape[2] = {96, 96};
    dt_op_options oa = {.layout = &cols}, ob = {.layout = &rows};
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 2, -1, 1, &oa, &a), DT_OK);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1, 3, -1, 1, &ob, &b), DT_OK);
    /* contracting axis sharded: partial products, then an all-reduce */
    cr_assert_eq(dt_matmul(a, b, NULL, &c), DT_OK, "%s", dt_last_error());
    dt_tensor_free(c);
    dt_memory_stats before[2], after[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &before[i]), DT_OK);
    for (int it = 0; it < 10; it++) {
        cr_assert_eq(dt_matmul(a, b, NULL, &c), DT_OK, "%s", dt_last_error());
        dt_tensor_free(c);
    }
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &after[i]), DT_OK);
        cr_expect_eq(after[i].system_allocs, before[i].system_allocs,
                     "device %d: %llu blocks from the system before the loop, %llu after", i,
                     (unsigned long long)before[i].system_allocs,
                     (unsigned long long)after[i].system_allocs);
        /* a and b live: 96x48 f32 each */
        cr_expect_eq(after[i].in_use, 2 * 96 * 48 * sizeof(float));
        cr_expect_geq(after[i].reserved, after[i].in_use + after[i].cached);
        cr_expect_gt(after[i].cached, 0);
        cr_expect_geq(after[i].peak, after[i].in_use + 96 * 96 * sizeof(float));
    }
    /* the peak restarts at what is in use, then counts the next matmul's result */
    cr_assert_eq(dt_device_memory_reset_peak(DT_DEVICE_CPU, -1), DT_OK);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &after[i]), DT_OK);
        cr_expect_eq(after[i].peak, after[i].in_use);
    }
    cr_assert_eq(dt_matmul(a, b, NULL, &c), DT_OK, "%s", dt_last_error());
    dt_tensor_free(c);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &after[i]), DT_OK);
        cr_expect_geq(after[i].peak, after[i].in_use + 96 * 96 * sizeof(float));
    }
    cr_assert_eq(dt_device_release_cache(DT_DEVICE_CPU, -1), DT_OK);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &after[i]), DT_OK);
        cr_expect_eq(after[i].cached, 0);
        /* live blocks rounded up to their size class: at most a quarter more */
        cr_expect_geq(after[i].reserved, after[i].in_use);
        cr_expect_leq(after[i].reserved, after[i].in_use + after[i].in_use / 4);
    }
    /* bad arguments name the values */
    cr_expect_eq(dt_device_memory_stats(DT_DEVICE_CPU, 2, &after[0]), DT_ERR_ARG);
    EXPECT_MSG("device 2");
    cr_expect_eq(dt_device_memory_stats(DT_DEVICE_CPU, 0, NULL), DT_ERR_ARG);
    cr_expect_eq(dt_device_release_cache(DT_DEVICE_CPU, 5), DT_ERR_ARG);
    EXPECT_MSG("device 5");
    cr_expect_eq(dt_device_memory_reset_peak(DT_DEVICE_CPU, 3), DT_ERR_ARG);
    EXPECT_MSG("device 3");
    dt_tensor_free(a);
    dt_tensor_free(b);
    teardown(m);
    cr_expect_eq(dt_device_memory_stats(DT_DEVICE_CPU, 0, &after[0]), DT_ERR_STATE);
}

/* One matmul case of the memory bound: a [M,K] @ b [K,N] -> c, f32, laid out as named. */
typedef struct peak_case {
    const char *a, *b, *c;
    int64_t M, K, N;
    /* rows of the temporary the expansion holds beside the output: 0 (none), or the chunk of
     * the reduce-scatter into rows, floor(M/P) (spmd/ops/matmul.c) */
    int64_t temp_rows;
} peak_case;

/* Run one case on m (ndev local devices) and check, per device, the allocator's peak above
 * what was in use before the call (the operands): the device's output plus the temporary, and
 * at most twice the output. The printed program must show the chunks when there is one. */
static void check_matmul_peak(dt_mesh *m, int ndev, const peak_case *k)
{
    dt_layout la, lb, lc;
    cr_assert_eq(dt_layout_parse(m, k->a, &la), DT_OK);
    cr_assert_eq(dt_layout_parse(m, k->b, &lb), DT_OK);
    cr_assert_eq(dt_layout_parse(m, k->c, &lc), DT_OK);
    const int64_t sa[2] = {k->M, k->K}, sb[2] = {k->K, k->N}, sc[2] = {k->M, k->N};
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    dt_op_options oa = {.layout = &la}, ob = {.layout = &lb};
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sa, 1, 2, -1, 1, &oa, &a), DT_OK);
    cr_assert_eq(dt_random_uniform(DT_DTYPE_F32, 2, sb, 1, 3, -1, 1, &ob, &b), DT_OK);
    dt_memory_stats before[8], after[8];
    for (int i = 0; i < ndev; i++) {
        cr_assert_eq(dt_device_memory_reset_peak(DT_DEVICE_CPU, i), DT_OK);
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &before[i]), DT_OK);
        cr_expect_eq(before[i].peak, before[i].in_use);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_op_options oc = {.layout = &lc, .program = mem};
    cr_assert_eq(dt_matmul(a, b, &oc, &c), DT_OK, "%s", dt_last_error());
    fclose(mem);
    if (k->temp_rows)
        cr_expect(strstr(text, "reduce_scatter") && strstr(text, "chunk 1 of"),
                  "%s @ %s -> %s, [%lld,%lld] @ [%lld,%lld]: a chunked reduce-scatter\n%s", k->a,
                  k->b, k->c, (long long)k->M, (long long)k->K, (long long)k->K, (long long)k->N,
                  text);
    for (int i = 0; i < ndev; i++) {
        int64_t local[2];
        cr_assert_eq(dt_layout_local_shape(&lc, sc, i, local, NULL), DT_OK);
        size_t out = (size_t)(local[0] * local[1]) * sizeof(float);
        size_t temp = (size_t)(k->temp_rows * local[1]) * sizeof(float);
        cr_assert_eq(dt_device_memory_stats(DT_DEVICE_CPU, i, &after[i]), DT_OK);
        size_t extra = after[i].peak - before[i].in_use;
        cr_expect_leq(extra, 2 * out,
                      "%s @ %s -> %s, [%lld,%lld] @ [%lld,%lld], device %d: %zu bytes above the "
                      "operands, output %zu\n%s",
                      k->a, k->b, k->c, (long long)k->M, (long long)k->K, (long long)k->K,
                      (long long)k->N, i, extra, out, text);
        cr_expect_eq(extra, out + temp,
                     "%s @ %s -> %s, [%lld,%lld] @ [%lld,%lld], device %d: %zu bytes above the "
                     "operands, want output %zu + temporary %zu",
                     k->a, k->b, k->c, (long long)k->M, (long long)k->K, (long long)k->K,
                     (long long)k->N, i, extra, out, temp);
    }
    free(text);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
}

/* A sharded matmul's peak extra memory is its output plus at most one temporary of the
 * output's size, read from the allocator's peak restarted before the call. The
 * contracting case all-reduces its partial product in place, so it holds the output alone;
 * so do the cases with no collective. The contracting case reduce-scattered into rows holds
 * its output and one chunk of floor(M/P) rows, never the whole partial product (P times the
 * output), uneven shards included. */
Test(memory, matmul_peak_is_output_plus_at_most_one_temporary)
{
    dt_mesh *m = setup(1, (int[]){2});
    const int64_t n = 96;
    const peak_case cases[] = {
        {"unsharded,x", "x,unsharded", "unsharded,unsharded", n, n, n, 0}, /* all-reduced */
        {"x,unsharded", "unsharded,unsharded", "x,unsharded", n, n, n, 0},
        {"unsharded,unsharded", "unsharded,unsharded", "unsharded,unsharded", n, n, n, 0},
        /* partial C reduce-scattered into rows, in chunks of floor(M/2) rows */
        {"unsharded,x", "x,unsharded", "x,unsharded", n, n, n, n / 2},
        {"unsharded,x", "x,unsharded", "x,unsharded", 97, 300, 83, 48}, /* 49 + 48 rows */
        {"unsharded,x", "x,unsharded", "x,unsharded", 150, 400, 64, 75},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_matmul_peak(m, 2, &cases[k]);
    cr_expect_eq(dt_device_memory_reset_peak(DT_DEVICE_CPU, 2), DT_ERR_ARG);
    EXPECT_MSG("device 2");
    teardown(m);
}

/* The same bound on 1 process x 4 devices, where the plain reduce-scatter held 4 times the
 * output: even and uneven rows (M mod 4 = 1, 2, 3; K large enough that the reduce-scatter is
 * the cheapest plan). */
Test(memory, matmul_reduce_scatter_peak_on_four_devices)
{
    dt_mesh *m = setup(1, (int[]){4});
    const peak_case cases[] = {
        {"unsharded,x", "x,unsharded", "x,unsharded", 128, 512, 128, 32},
        {"unsharded,x", "x,unsharded", "x,unsharded", 129, 1000, 120, 32},
        {"unsharded,x", "x,unsharded", "x,unsharded", 130, 1024, 96, 32},
        {"unsharded,x", "x,unsharded", "x,unsharded", 131, 1024, 128, 32},
        {"x,unsharded", "unsharded,unsharded", "x,unsharded", 130, 128, 128, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_matmul_peak(m, 4, &cases[k]);
    teardown(m);
}

/* dt_tensor_wait: nothing to wait for on CPU devices; bad arguments are errors. */
Test(tensor, wait)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x", &l), DT_OK);
    dt_tensor *t = NULL;
    dt_op_options o = {.layout = &l};
    cr_assert_eq(dt_ones(DT_DTYPE_F32, 1, (int64_t[]){5}, &o, &t), DT_OK);
    cr_expect_eq(dt_tensor_wait(t), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_tensor_wait(NULL), DT_ERR_ARG);
    EXPECT_MSG("NULL");
    dt_tensor_free(t);
    teardown(m);
}

/* Byte counts that overflow are shape errors naming the shape, never a short buffer written
 * past its end (f64 [2^61] is 2^64 bytes) nor a wrapped element count. */
Test(tensor, sizes_that_overflow_are_errors)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x", &l), DT_OK);
    dt_op_options o = {.layout = &l};
    dt_tensor *t = NULL;
    int64_t huge = (int64_t)1 << 61;
    cr_expect_eq(dt_fill(DT_DTYPE_F64, 1, &huge, 1.0, &o, &t), DT_ERR_SHAPE);
    EXPECT_MSG("[2305843009213693952]");
    cr_expect_null(t);
    int64_t half = (int64_t)1 << 60; /* 2^63 bytes of f64: one more than fits */
    cr_expect_eq(dt_fill(DT_DTYPE_F64, 1, &half, 1.0, &o, &t), DT_ERR_SHAPE);
    dt_tensor *x = NULL;
    cr_assert_eq(dt_ones(DT_DTYPE_F32, 1, (int64_t[]){4}, &o, &x), DT_OK);
    cr_expect_eq(dt_reshape(x, 2, (int64_t[]){((int64_t)1 << 62) + 1, 4}, NULL, &t), DT_ERR_SHAPE);
    EXPECT_MSG("overflow");
    cr_expect_null(t);
    /* a result whose size comes from an attribute: one_hot's depth (4 x 2^62 elements wrap;
     * 4 x 2^61 elements of f32 are 2^65 bytes) */
    dt_tensor *idx = NULL;
    cr_assert_eq(dt_zeros(DT_DTYPE_I32, 1, (int64_t[]){4}, &o, &idx), DT_OK);
    for (int e = 61; e <= 62; e++) {
        t = (dt_tensor *)&t;
        cr_expect_eq(dt_one_hot(idx, (int64_t)1 << e, 1, 0, -1, DT_DTYPE_F32, NULL, &t),
                     DT_ERR_SHAPE, "depth 2^%d: %s", e, dt_last_error());
        EXPECT_MSG("one_hot: the result f32 [4,");
        cr_expect_null(t);
    }
    dt_tensor_free(idx);
    dt_tensor_free(x);
    teardown(m);
}

/* Fill values an integer dtype cannot hold are DT_ERR_ARG naming the value and the dtype, never
 * a wrapped or saturated tensor (i32 2^40 gave -2^31, u8 -1 gave 255, i64 +Inf gave INT64_MIN);
 * the edges of each range still fill, the fraction dropped as numpy's np.full does. */
Test(errors, fill_values_fit_their_dtype)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x", &l), DT_OK);
    dt_op_options o = {.layout = &l};
    int64_t shape[1] = {3};
    const struct {
        dt_dtype dtype;
        double value;
        const char *says;
    } bad[] = {
        {DT_DTYPE_I32, 0x1p40, "1099511627776 does not fit i32"},
        {DT_DTYPE_I32, 2147483648.0, "does not fit i32 (-2147483648 to 2147483647)"},
        {DT_DTYPE_U8, -1, "-1 does not fit u8 (0 to 255)"},
        {DT_DTYPE_U8, 256, "256 does not fit u8"},
        {DT_DTYPE_I8, -129, "-129 does not fit i8"},
        {DT_DTYPE_I64, INFINITY, "inf does not fit i64"},
        {DT_DTYPE_I64, 0x1p63, "9223372036854775808 does not fit i64"},
        {DT_DTYPE_I32, NAN, "nan does not fit i32"},
        {DT_DTYPE_BOOL, NAN, "nan is not a bool"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_tensor *t = (dt_tensor *)&t;
        cr_expect_eq(dt_fill(bad[i].dtype, 1, shape, bad[i].value, &o, &t), DT_ERR_ARG,
                     "fill %g as %s", bad[i].value, dt_dtype_name(bad[i].dtype));
        EXPECT_MSG(bad[i].says);
        EXPECT_MSG("fill: value");
        cr_expect_null(t);
    }
    /* one_hot's on and off values too */
    dt_tensor *idx = NULL, *t = NULL;
    cr_assert_eq(dt_zeros(DT_DTYPE_I32, 1, shape, &o, &idx), DT_OK);
    cr_expect_eq(dt_one_hot(idx, 4, 300, 0, -1, DT_DTYPE_U8, NULL, &t), DT_ERR_ARG);
    EXPECT_MSG("one_hot: on_value: value 300 does not fit u8");
    cr_expect_eq(dt_one_hot(idx, 4, 1, -1, -1, DT_DTYPE_U8, NULL, &t), DT_ERR_ARG);
    EXPECT_MSG("off_value");
    cr_expect_null(t);
    dt_tensor_free(idx);
    /* the edges fill exactly */
    int64_t i64[3];
    cr_assert_eq(dt_fill(DT_DTYPE_I64, 1, shape, -0x1p63, &o, &t), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(t, i64, sizeof i64), DT_OK);
    cr_expect(i64[0] == INT64_MIN && i64[2] == INT64_MIN);
    dt_tensor_free(t);
    uint8_t u8[3];
    cr_assert_eq(dt_fill(DT_DTYPE_U8, 1, shape, 255.9, &o, &t), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(t, u8, sizeof u8), DT_OK);
    cr_expect(u8[0] == 255 && u8[2] == 255);
    dt_tensor_free(t);
    int32_t i32[3];
    cr_assert_eq(dt_fill(DT_DTYPE_I32, 1, shape, -2147483648.0, &o, &t), DT_OK);
    cr_assert_eq(dt_tensor_read(t, i32, sizeof i32), DT_OK);
    cr_expect(i32[1] == INT32_MIN);
    dt_tensor_free(t);
    teardown(m);
}

/* ---- zero-copy: dt_tensor_wrap and dt_tensor_local_buffer --------------------------------- */

static int released;

static void count_release(void *ctx)
{
    released += *(int *)ctx;
}

Test(zero_copy, wrap_computes_on_the_callers_buffers_and_releases_once)
{
    dt_mesh *m = setup(1, (int[]){3});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,unsharded", &l), DT_OK, "%s", dt_last_error());
    /* [5, 2] over 3 devices: rows 2, 2, 1 (uneven), each component the caller's */
    float c0[4] = {0, 1, 2, 3}, c1[4] = {4, 5, 6, 7}, c2[2] = {8, 9};
    void *bufs[3] = {c0, c1, c2};
    size_t bytes[3] = {sizeof c0, sizeof c1, sizeof c2};
    int one = 1;
    released = 0;
    dt_tensor *t = NULL, *sum = NULL;
    cr_assert_eq(dt_tensor_wrap(&l, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, 3, bufs, bytes,
                                count_release, &one, &t),
                 DT_OK, "%s", dt_last_error());
    for (int i = 0; i < 3; i++) {
        dt_local_buffer b;
        cr_assert_eq(dt_tensor_local_buffer(t, i, &b), DT_OK, "%s", dt_last_error());
        cr_expect_eq(b.data, bufs[i], "component %d is the caller's buffer", i);
        cr_expect_eq(b.bytes, bytes[i]);
        cr_expect_eq(b.type, DT_DEVICE_CPU);
    }
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, t, 0, NULL, 0, NULL, &sum), DT_OK, "%s", dt_last_error());
    float total = 0;
    cr_assert_eq(dt_tensor_read(sum, &total, sizeof total), DT_OK, "%s", dt_last_error());
    cr_expect_eq(total, 45.0f); /* 0 + ... + 9 */
    dt_tensor_free(sum);
    cr_expect_eq(released, 0);
    dt_tensor_free(t);
    cr_expect_eq(released, 1, "release is called once, when the tensor is freed");
    dt_local_buffer b;
    dt_tensor *u = NULL;
    /* errors take nothing: a short buffer, a wrong count, NULL arrays */
    size_t short_bytes[3] = {sizeof c0, 4, sizeof c2};
    cr_expect_eq(dt_tensor_wrap(&l, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, 3, bufs, short_bytes,
                                count_release, &one, &u),
                 DT_ERR_SHAPE);
    cr_expect(strstr(dt_last_error(), "buffer 1 (device 1) has 4 bytes; its f32 component [2,2] "
                                      "needs 16"),
              "%s", dt_last_error());
    cr_expect_eq(dt_tensor_wrap(&l, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, 2, bufs, bytes,
                                count_release, &one, &u),
                 DT_ERR_ARG);
    cr_expect_eq(
        dt_tensor_wrap(&l, DT_DTYPE_F32, 2, (int64_t[]){5, 2}, 3, NULL, bytes, NULL, NULL, &u),
        DT_ERR_ARG);
    cr_expect_null(u);
    cr_expect_eq(released, 1, "a failed wrap calls no release");
    cr_expect_eq(dt_tensor_local_buffer(NULL, 0, &b), DT_ERR_ARG);
    teardown(m);
}

Test(zero_copy, local_buffer_of_an_op_result)
{
    dt_mesh *m = setup(1, (int[]){2});
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x", &l), DT_OK, "%s", dt_last_error());
    const double host[4] = {1, 2, 3, 4};
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F64, 1, (int64_t[]){4}, host, sizeof host, &t),
                 DT_OK, "%s", dt_last_error());
    for (int i = 0; i < 2; i++) {
        dt_local_buffer b;
        cr_assert_eq(dt_tensor_local_buffer(t, i, &b), DT_OK, "%s", dt_last_error());
        cr_expect_eq(b.bytes, 2 * sizeof(double));
        cr_expect(memcmp(b.data, host + 2 * i, b.bytes) == 0, "component %d in place", i);
    }
    dt_local_buffer b;
    cr_expect_eq(dt_tensor_local_buffer(t, 2, &b), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "component 2, this client has 0..1"), "%s", dt_last_error());
    dt_tensor_free(t);
    teardown(m);
}
