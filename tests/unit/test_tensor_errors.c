/* DTensor on one client: errors of from_host, pack, unpack and read, dt_tensor_wait, sizes that
 * overflow, fill values that do not fit. Part of unit_test_tensor (test_tensor.c). */
#include "../ref.h"
#include "tensor_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
