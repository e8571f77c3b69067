/* DTensor on one client: memory accounting and zero-copy buffers. Part of unit_test_tensor
 * (test_tensor.c). */
#include "../ref.h"
#include "tensor_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
