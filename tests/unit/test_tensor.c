/* DTensor on one client: from_host, pack, unpack, read, partial layouts (errors in
 * test_tensor_errors.c, memory and zero-copy in test_tensor_memory.c). */
#include "../ref.h"
#include "tensor_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
