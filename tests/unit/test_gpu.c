/* GPUs without a GPU: which GPUs each client takes, from mocked lists of what every client
 * sees (dt__gpu_assign: identity, not counts), the combine of device collectives on the host
 * (dt__cpu_combine, what emulated GPUs run: the CUDA kernel's arithmetic) against direct
 * loops, and the CUDA kernels' 32-bit index division (common/fastdiv.h) against '/'. */
#include "dt.h"
#include "fastdiv.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

/* ---- GPU identity -------------------------------------------------------------------------- */

/* A made-up identity: GPU g of machine h. */
static void id_of(unsigned char id[16], int h, int g)
{
    memset(id, 0, 16);
    id[0] = 'G';
    id[1] = (unsigned char)h;
    id[2] = (unsigned char)g;
}

/* Client c sees GPUs first..first+n-1 of machine h. */
static void sees(dt__gpu_view *v, int h, int first, int n)
{
    v->n = n;
    for (int i = 0; i < n; i++)
        id_of(v->id[i], h, first + i);
}

/* Client me's GPUs as view indices, and the shared flag. */
static int take(int n, const dt__gpu_view views[], int me, int out[], bool *shared)
{
    int k = -1;
    dt__gpu_assign(n, views, me, out, &k, shared);
    return k;
}

/* Eight clients, each under its own CUDA_VISIBLE_DEVICES (one GPU each, all different): each
 * takes its own, nobody shares, so NCCL runs across them (a count rule, 8 clients > 1 visible
 * GPU, called them shared). */
Test(gpu_identity, eight_clients_one_visible_gpu_each)
{
    dt__gpu_view v[8];
    for (int c = 0; c < 8; c++)
        sees(&v[c], 0, c, 1);
    for (int c = 0; c < 8; c++) {
        int t[DT__MAX_GPUS];
        bool shared = true;
        cr_assert_eq(take(8, v, c, t, &shared), 1, "client %d", c);
        cr_expect_eq(t[0], 0);
        cr_expect_not(shared, "client %d sees its own GPU: nothing is shared", c);
        cr_expect_eq(dt__gpu_number(8, v, c, 0), c, "GPU of client %d is the job's GPU %d", c, c);
    }
}

/* Two clients on one GPU (both see it): the first takes it, the second shares it, and every
 * client knows GPUs are shared (host-staged exchanges). */
Test(gpu_identity, two_clients_sharing_one_gpu)
{
    dt__gpu_view v[2];
    sees(&v[0], 0, 0, 1);
    sees(&v[1], 0, 0, 1);
    int t[DT__MAX_GPUS];
    bool shared = false;
    cr_assert_eq(take(2, v, 0, t, &shared), 1);
    cr_expect_eq(t[0], 0);
    cr_expect(shared);
    shared = false;
    cr_assert_eq(take(2, v, 1, t, &shared), 1);
    cr_expect_eq(t[0], 0, "client 1 shares GPU 0");
    cr_expect(shared);
    cr_expect_eq(dt__gpu_number(2, v, 0, 0), dt__gpu_number(2, v, 1, 0), "one GPU, one number");
}

/* Two clients with one GPU each (their logical devices are the runtime's business): distinct
 * GPUs, distinct numbers, nothing shared; their logical devices combine on their GPU before
 * the one NCCL rank per GPU. */
Test(gpu_identity, two_clients_one_gpu_each_for_two_logical_devices)
{
    dt__gpu_view v[2];
    sees(&v[0], 0, 0, 1);
    sees(&v[1], 1, 0, 1); /* another machine's GPU 0 */
    for (int c = 0; c < 2; c++) {
        int t[DT__MAX_GPUS];
        bool shared = true;
        cr_assert_eq(take(2, v, c, t, &shared), 1);
        cr_expect_not(shared);
    }
    cr_expect_neq(dt__gpu_number(2, v, 0, 0), dt__gpu_number(2, v, 1, 0));
}

/* Eight clients seeing the same eight GPUs (no CUDA_VISIBLE_DEVICES): client k takes GPU k; with
 * sixteen, GPUs k and k + 8. */
Test(gpu_identity, clients_dividing_a_machines_gpus)
{
    dt__gpu_view v[8];
    for (int g = 8; g <= 16; g += 8) {
        for (int c = 0; c < 8; c++)
            sees(&v[c], 0, 0, g);
        for (int c = 0; c < 8; c++) {
            int t[DT__MAX_GPUS];
            bool shared = true;
            int k = take(8, v, c, t, &shared);
            cr_assert_eq(k, g / 8, "client %d of 8 on %d GPUs takes %d", c, g, g / 8);
            for (int i = 0; i < k; i++)
                cr_expect_eq(t[i], c + 8 * i);
            cr_expect_not(shared);
        }
    }
}

/* More clients than GPUs on a machine: client k shares GPU k mod the GPUs. */
Test(gpu_identity, more_clients_than_gpus_share_round_robin)
{
    dt__gpu_view v[5];
    for (int c = 0; c < 5; c++)
        sees(&v[c], 0, 0, 2);
    for (int c = 0; c < 5; c++) {
        int t[DT__MAX_GPUS];
        bool shared = false;
        cr_assert_eq(take(5, v, c, t, &shared), 1);
        cr_expect_eq(t[0], c % 2, "client %d", c);
        cr_expect(shared);
    }
}

/* Two pairs of clients, each pair under CUDA_VISIBLE_DEVICES=0,1 and =2,3 of one machine: each
 * client takes one GPU of its pair's; numbers follow clients. */
Test(gpu_identity, pairs_of_clients_on_their_own_gpus)
{
    dt__gpu_view v[4];
    sees(&v[0], 0, 0, 2);
    sees(&v[1], 0, 0, 2);
    sees(&v[2], 0, 2, 2);
    sees(&v[3], 0, 2, 2);
    int want[4] = {0, 1, 0, 1};
    for (int c = 0; c < 4; c++) {
        int t[DT__MAX_GPUS];
        bool shared = true;
        cr_assert_eq(take(4, v, c, t, &shared), 1);
        cr_expect_eq(t[0], want[c], "client %d takes its pair's GPU %d", c, want[c]);
        cr_expect_not(shared);
        cr_expect_eq(dt__gpu_number(4, v, c, t[0]), c);
    }
}

/* A client without GPUs takes none and does not make the others share. */
Test(gpu_identity, a_client_without_gpus)
{
    dt__gpu_view v[3];
    sees(&v[0], 0, 0, 1);
    v[1].n = 0;
    sees(&v[2], 0, 1, 1);
    int t[DT__MAX_GPUS];
    bool shared = true;
    cr_expect_eq(take(3, v, 1, t, &shared), 0);
    cr_expect_not(shared);
    cr_expect_eq(take(3, v, 2, t, &shared), 1);
    cr_expect_eq(dt__gpu_number(3, v, 2, 0), 1);
}

/* ---- the combine on the host -------------------------------------------------------------- */

static float bf(uint16_t h)
{
    return dt_bf16_to_f32(h);
}

/* bf16: the sources summed in f32 and rounded once (four sources whose pairwise roundings
 * differ from the exact sum), mean divided in f32; widened destinations keep the f32 sum. */
Test(gpu_combine, bf16_sums_round_once)
{
    /* 1 + 2^-8 is not a bf16 (7 bits of mantissa): 1 + 4 * 2^-9 is, rounded pairwise it is 1 */
    float x[4] = {1.0f, 0x1p-9f, 0x1p-9f, 0x1p-8f};
    uint16_t src[4][1], dst[1];
    float wide[1];
    for (int s = 0; s < 4; s++)
        src[s][0] = dt_f32_to_bf16(x[s]);
    dt__combine c = {
        .dtype = DT_DTYPE_BF16, .op = DT_REDUCE_SUM, .nsrc = 4, .ndst = 1, .by = 1, .n = 1};
    for (int s = 0; s < 4; s++)
        c.src[s] = src[s];
    c.dst[0] = dst;
    dt__cpu_combine(&c);
    float exact = 1.0f + 0x1p-9f + 0x1p-9f + 0x1p-8f; /* exact in f32 */
    cr_expect_eq(bf(dst[0]), bf(dt_f32_to_bf16(exact)), "%g, want %g", (double)bf(dst[0]),
                 (double)bf(dt_f32_to_bf16(exact)));
    c.dst_wide = true;
    c.dst[0] = wide;
    dt__cpu_combine(&c);
    cr_expect_eq(wide[0], exact);
    /* a widened source read back, divided by 4 and rounded once */
    c.src_wide = true;
    c.dst_wide = false;
    c.nsrc = 1;
    c.src[0] = wide;
    c.dst[0] = dst;
    c.by = 4;
    dt__cpu_combine(&c);
    cr_expect_eq(bf(dst[0]), bf(dt_f32_to_bf16(exact / 4.0f)));
}

/* Integers wrap, MAX keeps the running value on ties, MEAN divides as the type does. */
Test(gpu_combine, integers_wrap_and_divide)
{
    int8_t a[3] = {100, -7, 5}, b[3] = {100, 3, 5}, out[3];
    dt__combine c = {
        .dtype = DT_DTYPE_I8, .op = DT_REDUCE_SUM, .nsrc = 2, .ndst = 1, .by = 1, .n = 3};
    c.src[0] = a;
    c.src[1] = b;
    c.dst[0] = out;
    dt__cpu_combine(&c);
    cr_expect_eq(out[0], (int8_t)(uint8_t)200);
    cr_expect_eq(out[1], -4);
    c.by = 2;
    dt__cpu_combine(&c);
    cr_expect_eq(out[1], -2); /* -4 / 2 */
    cr_expect_eq(out[2], 5);
    int64_t x[1] = {INT64_MAX}, y[1] = {2}, z[1];
    c = (dt__combine){
        .dtype = DT_DTYPE_I64, .op = DT_REDUCE_PROD, .nsrc = 2, .ndst = 1, .by = 1, .n = 1};
    c.src[0] = x;
    c.src[1] = y;
    c.dst[0] = z;
    dt__cpu_combine(&c);
    cr_expect_eq(z[0], -2); /* (2^63 - 1) * 2 wraps */
}

/* In place (a destination is a source) and several destinations. */
Test(gpu_combine, in_place_to_several_destinations)
{
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {5, 4, 3, 2, 1}, c2[5];
    dt__combine c = {
        .dtype = DT_DTYPE_F32, .op = DT_REDUCE_MAX, .nsrc = 2, .ndst = 2, .by = 1, .n = 5};
    c.src[0] = a;
    c.src[1] = b;
    c.dst[0] = a;
    c.dst[1] = c2;
    dt__cpu_combine(&c);
    float want[5] = {5, 4, 3, 4, 5};
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(a[i], want[i]);
        cr_expect_eq(c2[i], want[i]);
    }
}

/* ---- the kernels' index division ------------------------------------------------------------ */

static void check_divisor(uint32_t d)
{
    dt__div32 v = dt__div32_of(d);
    uint32_t top = (uint32_t)1 << 31;
    /* around every multiple of d near 0, near 2^31 and at random */
    uint64_t x = 0x9E3779B97F4A7C15ull ^ d;
    for (int k = 0; k < 2000; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t base[3] = {(uint32_t)k * d, top - 1 - (uint32_t)k, (uint32_t)(x % top)};
        for (int b = 0; b < 3; b++)
            for (int e = -1; e <= 1; e++) {
                uint32_t n = base[b] + (uint32_t)e;
                if (n >= top || (b == 0 && (uint64_t)k * d + (uint64_t)(e + 1) > top))
                    continue;
                if (dt__div32_q(v, n) != n / d)
                    cr_assert_fail("%u / %u: %u, want %u", n, d, dt__div32_q(v, n), n / d);
            }
    }
}

Test(fastdiv, quotients_equal_division_below_2_31)
{
    for (uint32_t d = 1; d <= 1024; d++)
        check_divisor(d);
    for (int s = 10; s <= 30; s++)
        for (int e = -3; e <= 3; e++)
            check_divisor(((uint32_t)1 << s) + (uint32_t)e);
    uint32_t odd[] = {3 * 5 * 7 * 11 * 13 * 17, 65537, 1000003, 2147483629u, 2147483647u, 46341};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        check_divisor(odd[i]);
}
