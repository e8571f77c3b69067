/* Status codes, dtypes, reduction names and the per-thread error message. */
#include "dt.h"

#include <criterion/criterion.h>
#include <math.h>
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
    cr_expect_eq(DT_DTYPE_COUNT, 9);
    const struct {
        dt_dtype t;
        size_t size;
        const char *name;
        int floating, integer;
    } want[] = {{DT_DTYPE_F32, 4, "f32", 1, 0},   {DT_DTYPE_F64, 8, "f64", 1, 0},
                {DT_DTYPE_I32, 4, "i32", 0, 1},   {DT_DTYPE_I64, 8, "i64", 0, 1},
                {DT_DTYPE_BF16, 2, "bf16", 1, 0}, {DT_DTYPE_F16, 2, "f16", 1, 0},
                {DT_DTYPE_BOOL, 1, "bool", 0, 0}, {DT_DTYPE_U8, 1, "u8", 0, 1},
                {DT_DTYPE_I8, 1, "i8", 0, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_expect_eq(dt_dtype_size(want[i].t), want[i].size, "%s", want[i].name);
        cr_expect_str_eq(dt_dtype_name(want[i].t), want[i].name);
        cr_expect_eq(dt_dtype_is_floating(want[i].t), want[i].floating, "%s", want[i].name);
        cr_expect_eq(dt_dtype_is_integer(want[i].t), want[i].integer, "%s", want[i].name);
    }
    const int bad[] = {DT_DTYPE_COUNT, -1, 77};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(dt_dtype_size((dt_dtype)bad[i]), 0, "dtype %d", bad[i]);
        cr_expect_str_eq(dt_dtype_name((dt_dtype)bad[i]), "?", "dtype %d", bad[i]);
        cr_expect_eq(dt_dtype_promote((dt_dtype)bad[i], DT_DTYPE_F32), DT_DTYPE_COUNT);
    }
}

/* PyTorch's promotion rules (torch.result_type), as a table over the dtypes both have. */
Test(status, dtype_promotion)
{
    const struct {
        dt_dtype a, b, want;
    } cases[] = {
        {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_F64},    {DT_DTYPE_I64, DT_DTYPE_F32, DT_DTYPE_F32},
        {DT_DTYPE_I32, DT_DTYPE_I64, DT_DTYPE_I64},    {DT_DTYPE_BF16, DT_DTYPE_F16, DT_DTYPE_F32},
        {DT_DTYPE_BF16, DT_DTYPE_F32, DT_DTYPE_F32},   {DT_DTYPE_I64, DT_DTYPE_BF16, DT_DTYPE_BF16},
        {DT_DTYPE_BOOL, DT_DTYPE_U8, DT_DTYPE_U8},     {DT_DTYPE_BOOL, DT_DTYPE_F16, DT_DTYPE_F16},
        {DT_DTYPE_U8, DT_DTYPE_I8, DT_DTYPE_I32},      {DT_DTYPE_I8, DT_DTYPE_I32, DT_DTYPE_I32},
        {DT_DTYPE_BOOL, DT_DTYPE_BOOL, DT_DTYPE_BOOL}, {DT_DTYPE_U8, DT_DTYPE_F64, DT_DTYPE_F64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_expect_eq(dt_dtype_promote(cases[i].a, cases[i].b), cases[i].want, "%s, %s",
                     dt_dtype_name(cases[i].a), dt_dtype_name(cases[i].b));
        cr_expect_eq(dt_dtype_promote(cases[i].b, cases[i].a), cases[i].want, "%s, %s",
                     dt_dtype_name(cases[i].b), dt_dtype_name(cases[i].a));
    }
}

/* gcc's IEEE binary16 (an extension to ISO C): the reference of the f16 conversions. */
__extension__ typedef _Float16 gcc_f16;

/* The 16-bit conversions against independent references: every f16 bit pattern through
 * _Float16 (gcc's IEEE binary16), and bf16 against round-to-nearest-even written from the
 * definition with doubles (the midpoint between the two neighbours). */
Test(status, half_conversions)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        gcc_f16 ref;
        uint16_t bits = (uint16_t)h;
        memcpy(&ref, &bits, 2);
        float f = dt_f16_to_f32(bits);
        if (ref != ref) {
            cr_expect(f != f, "f16 %04x is NaN", h);
            continue;
        }
        cr_expect(f == (float)ref, "f16 %04x: %g, want %g", h, f, (double)(float)ref);
        cr_expect_eq(dt_f32_to_f16(f), bits, "f16 %04x round trip", h);
    }
    /* f32 -> f16: every exponent band, halfway cases, overflow and subnormals, against
     * gcc_f16's own conversion (gcc converts with round-to-nearest-even) */
    uint32_t seed = 12345;
    for (int i = 0; i < 2000000; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t u = (seed & 0x80000000u) | (0x30000000u + seed % 0x18000000u);
        float x;
        memcpy(&x, &u, 4);
        gcc_f16 r = (gcc_f16)x;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        cr_assert_eq(dt_f32_to_f16(x), rb, "f32 %08x -> f16 %04x, want %04x", u, dt_f32_to_f16(x),
                     rb);
        /* from double: rounded once, as gcc_f16 converts a double */
        double d = (double)x + ldexp((double)(seed % 1000) - 500.0, -40) * fabs((double)x);
        gcc_f16 rd = (gcc_f16)d;
        memcpy(&rb, &rd, 2);
        cr_assert_eq(dt_f64_to_f16(d), rb, "f64 %.17g -> f16", d);
    }
    /* bf16: the nearest of the two neighbours, ties to even */
    for (int i = 0; i < 2000000; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t u = seed;
        float x;
        memcpy(&x, &u, 4);
        if (x != x || isinf(x))
            continue;
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        float fl, fh;
        memcpy(&fl, &lo, 4);
        memcpy(&fh, &hi, 4);
        /* past the largest bf16 the next value is 2^128 (IEEE rounds, then overflows) */
        double dfh = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(ldexp(1, 128), (double)x) : fh;
        double dl = fabs((double)x - (double)fl), dh = fabs(dfh - (double)x);
        uint16_t want =
            (uint16_t)((dl < dh || (dl == dh && !((lo >> 16) & 1))) ? lo >> 16 : hi >> 16);
        cr_assert_eq(dt_f32_to_bf16(x), want, "f32 %08x -> bf16 %04x, want %04x", u,
                     dt_f32_to_bf16(x), want);
    }
    cr_expect_eq(dt_f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
    cr_expect_eq(dt_f32_to_f16(NAN) & 0x7e00, 0x7e00);
    cr_expect_eq(dt_f32_to_f16(65519.0f), 0x7bff);
    cr_expect_eq(dt_f32_to_f16(65520.0f), 0x7c00);
    cr_expect_eq(dt_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up to inf */
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
