/* Status codes, dtypes, reduction names and the per-thread error message. */
#include "dt.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

/* The known answer, written out by hand (not through the X-macro). */
static const struct {
    dt_status s;
    const char *name, *desc;
} statuses[] = {
    {DT_OK, "DT_OK", "ok"},
    {DT_ERR_ARG, "DT_ERR_ARG", "invalid argument"},
    {DT_ERR_SHAPE, "DT_ERR_SHAPE", "shape mismatch"},
    {DT_ERR_DTYPE, "DT_ERR_DTYPE", "dtype mismatch"},
    {DT_ERR_LAYOUT, "DT_ERR_LAYOUT", "invalid layout"},
    {DT_ERR_MESH, "DT_ERR_MESH", "invalid mesh"},
    {DT_ERR_MISMATCH, "DT_ERR_MISMATCH", "clients disagree"},
    {DT_ERR_NOMEM, "DT_ERR_NOMEM", "out of memory"},
    {DT_ERR_DEVICE, "DT_ERR_DEVICE", "device error"},
    {DT_ERR_COMM, "DT_ERR_COMM", "communication error"},
    {DT_ERR_STATE, "DT_ERR_STATE", "wrong runtime state"},
    {DT_ERR_UNSUPPORTED, "DT_ERR_UNSUPPORTED", "unsupported"},
    {DT_ERR_IO, "DT_ERR_IO", "input/output error"},
};
#define NSTATUS ((int)(sizeof statuses / sizeof statuses[0]))

Test(status, ok_is_zero)
{
    cr_assert_eq(DT_OK, 0);
    cr_assert_eq(DT_STATUS_COUNT, NSTATUS, "a status code was added without a test entry");
}

Test(status, every_code_has_name_and_description)
{
    for (int i = 0; i < NSTATUS; i++) {
        cr_expect_str_eq(dt_status_name(statuses[i].s), statuses[i].name);
        cr_expect_str_eq(dt_status_string(statuses[i].s), statuses[i].desc);
    }
}

Test(status, names_and_descriptions_are_distinct)
{
    for (int i = 0; i < DT_STATUS_COUNT; i++)
        for (int j = 0; j < i; j++) {
            cr_expect_str_neq(dt_status_name((dt_status)i), dt_status_name((dt_status)j));
            cr_expect_str_neq(dt_status_string((dt_status)i), dt_status_string((dt_status)j));
        }
}

Test(status, out_of_range)
{
    const int bad[] = {DT_STATUS_COUNT, DT_STATUS_COUNT + 1, -1, 1000, -1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_str_eq(dt_status_name((dt_status)bad[i]), "DT_UNKNOWN_STATUS", "value %d",
                         bad[i]);
        cr_expect_str_eq(dt_status_string((dt_status)bad[i]), "unknown status", "value %d", bad[i]);
    }
}

Test(status, last_error_empty_at_start)
{
    cr_assert_not_null(dt_last_error());
    cr_assert_str_eq(dt_last_error(), "");
}

Test(status, last_error_after_failure_names_the_value)
{
    dt_layout l;
    cr_assert_eq(dt_layout_replicated(NULL, 2, &l), DT_ERR_LAYOUT);
    cr_assert(strstr(dt_last_error(), "mesh is NULL"), "got \"%s\"", dt_last_error());
    /* a success does not clear it */
    cr_assert_eq(dt_shard_size(5, 2, 0), 3);
    cr_assert(strstr(dt_last_error(), "mesh is NULL"));
    /* the next failure replaces it */
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CPU, NULL), DT_ERR_ARG);
    cr_assert(strstr(dt_last_error(), "out is NULL"), "got \"%s\"", dt_last_error());
    cr_assert_null(strstr(dt_last_error(), "mesh is NULL"));
}

Test(status, dtype_sizes_and_names)
{
    cr_expect_eq(DT_DTYPE_COUNT, 4);
    cr_expect_eq(dt_dtype_size(DT_DTYPE_F32), 4);
    cr_expect_eq(dt_dtype_size(DT_DTYPE_F64), 8);
    cr_expect_eq(dt_dtype_size(DT_DTYPE_I32), 4);
    cr_expect_eq(dt_dtype_size(DT_DTYPE_I64), 8);
    cr_expect_str_eq(dt_dtype_name(DT_DTYPE_F32), "f32");
    cr_expect_str_eq(dt_dtype_name(DT_DTYPE_F64), "f64");
    cr_expect_str_eq(dt_dtype_name(DT_DTYPE_I32), "i32");
    cr_expect_str_eq(dt_dtype_name(DT_DTYPE_I64), "i64");
    const int bad[] = {DT_DTYPE_COUNT, -1, 77};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(dt_dtype_size((dt_dtype)bad[i]), 0, "dtype %d", bad[i]);
        cr_expect_str_eq(dt_dtype_name((dt_dtype)bad[i]), "?", "dtype %d", bad[i]);
    }
}

Test(status, reduce_op_names)
{
    cr_expect_eq(DT_REDUCE_COUNT, 5);
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_SUM), "sum");
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_MEAN), "mean");
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_MAX), "max");
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_MIN), "min");
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_PROD), "prod");
    cr_expect_str_eq(dt_reduce_op_name(DT_REDUCE_COUNT), "?");
    cr_expect_str_eq(dt_reduce_op_name((dt_reduce_op)-1), "?");
}

Test(status, device_type_names)
{
    cr_expect_str_eq(dt_device_type_name(DT_DEVICE_CPU), "CPU");
    cr_expect_str_eq(dt_device_type_name(DT_DEVICE_CUDA), "CUDA");
    cr_expect_str_eq(dt_device_type_name(DT_DEVICE_COUNT), "?");
}

/* ---- per-thread message ---------------------------------------------------------------- */

typedef struct thread_result {
    dt_status status;
    char before[64];
    char after[256];
} thread_result;

static void *fail_on_thread(void *arg)
{
    thread_result *r = arg;
    /* A fresh thread starts with no message, whatever the main thread recorded. */
    snprintf(r->before, sizeof r->before, "%s", dt_last_error());
    dt_layout l;
    r->status = dt_layout_parse(NULL, "x", &l);
    snprintf(r->after, sizeof r->after, "%s", dt_last_error());
    return NULL;
}

Test(status, last_error_is_per_thread)
{
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CPU, NULL), DT_ERR_ARG);
    char mine[256];
    snprintf(mine, sizeof mine, "%s", dt_last_error());
    cr_assert(strstr(mine, "dt_mesh_create_from_string"), "got \"%s\"", mine);

    thread_result r = {0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, fail_on_thread, &r), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);

    cr_expect_str_eq(r.before, "", "the new thread saw \"%s\"", r.before);
    cr_expect_eq(r.status, DT_ERR_LAYOUT);
    cr_expect(strstr(r.after, "dt_layout_parse") && strstr(r.after, "mesh is NULL"),
              "thread message \"%s\"", r.after);
    /* The main thread's message is untouched by the other thread's failure. */
    cr_expect_str_eq(dt_last_error(), mine);
}
