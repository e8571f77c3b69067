/* Device collectives across clients, on GPUs emulated on the host with late compute streams
 * (DTENSOR_EMULATE_LATE=1: every kernel, copy and upload waits in its stream until something
 * waits for it, and every use of a buffer by a collective's side stream is checked against the
 * compute streams; backends/cpu/emulated.c). Run at -n 2 with 2 logical GPUs per GPU and at -n 4
 * with one. Checks, each against direct loops over the global values:
 * 1. a collective's inputs come from kernels still queued (a late producer): the collective
 *    sees their values, and the consumers of its result see it (an integer matmul whose
 *    contracting axis is sharded: an all-reduce between its GEMM and a kernel using it);
 * 2. the same for every kind through relayouts (all-gather, all-to-all, reduce-scatter);
 * 3. a buffer freed while a collective may still read it goes back to the caching allocator
 *    only after the device's compute stream waits for that collective (reused at once here);
 * 4. bf16 sums are rounded once, from f32 (values whose pairwise roundings give another sum),
 *    on the device path and, with DTENSOR_EMULATE_CUDA_VISIBLE=host, on the host-staged one;
 * 5. the ledger names the path: "nccl (emulated)" when each client has its own GPUs, the
 *    host-staged one when clients share a GPU (DTENSOR_EMULATE_CUDA_VISIBLE=host, more clients
 *    than GPUs on the machine).
 * Any ordering fault fails the device (DT_ERR_DEVICE naming the two streams), hence the op. */
#include "../../collectives/collectives.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int me, nclients;

/* 1: C = A B with A[i,k] = (i + 2k) mod 7 - 3 (k sharded), B[k,j] = (3k + j) mod 5 - 2. */
static void matmul_check(const dt_mesh *m, int g)
{
    int64_t M = 5, K = 4 * (int64_t)g + 3, N = 6;
    dt_layout la, lb;
    char sa[64], sb[64];
    snprintf(sa, sizeof sa, "unsharded,%s", dt_mesh_axis_name(m, 0));
    snprintf(sb, sizeof sb, "%s,unsharded", dt_mesh_axis_name(m, 0));
    dt_layout_parse(m, sa, &la);
    dt_layout_parse(m, sb, &lb);
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(M * K)),
            *b = malloc(sizeof(int32_t) * (size_t)(K * N)), got[30] = {0};
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            a[i * K + k] = (int32_t)((i + 2 * k) % 7 - 3);
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < N; j++)
            b[k * N + j] = (int32_t)((3 * k + j) % 5 - 2);
    dt_tensor *ta = NULL, *tb = NULL, *tc = NULL, *td = NULL;
    dt_status s = dt_tensor_from_host(&la, DT_DTYPE_I32, 2, (int64_t[]){M, K}, a,
                                      sizeof(int32_t) * (size_t)(M * K), &ta);
    if (s == DT_OK)
        s = dt_tensor_from_host(&lb, DT_DTYPE_I32, 2, (int64_t[]){K, N}, b,
                                sizeof(int32_t) * (size_t)(K * N), &tb);
    /* the GEMM's partial products are queued, the all-reduce reads them, the add consumes it */
    if (s == DT_OK)
        s = dt_matmul(ta, tb, NULL, &tc);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, tc, tc, NULL, &td);
    if (s == DT_OK)
        s = dt_tensor_read(td, got, sizeof got);
    bool ok = s == DT_OK;
    for (int64_t i = 0; ok && i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            int64_t want = 0;
            for (int64_t k = 0; k < K; k++)
                want += (int64_t)a[i * K + k] * b[k * N + j];
            ok = ok && got[i * N + j] == 2 * want;
        }
    dt_ledger_entry e = {0};
    dt_ledger_entry_get(dt_ledger_size() - 1, &e);
    tap_check(ok, "late GEMM -> all-reduce -> add: 2 A B exactly (%s; last collective on %s)",
              s ? dt_last_error() : "ok", e.backend);
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(tc);
    dt_tensor_free(td);
    free(a);
    free(b);
}

/* 2: x * x (queued) relaid from each layout to every other: the gathered values. */
static void relayout_check(const dt_mesh *m)
{
    const char *layouts[] = {"x,unsharded", "unsharded,x", "x,y", "y,x", "unsharded,unsharded"};
    int nl = dt_mesh_num_axes(m) > 1 ? 5 : 2;
    int64_t shape[2] = {7, 6}, host[42];
    for (int i = 0; i < 42; i++)
        host[i] = i;
    bool ok = true;
    char why[300] = "";
    for (int f = 0; f < nl && ok; f++)
        for (int t = 0; t < nl && ok; t++) {
            dt_layout lf, lt;
            dt_layout_parse(m, layouts[f], &lf);
            dt_layout_parse(m, layouts[t], &lt);
            dt_tensor *x = NULL, *y = NULL, *z = NULL;
            int64_t got[42];
            dt_status s = dt_tensor_from_host(&lf, DT_DTYPE_I64, 2, shape, host, sizeof host, &x);
            if (s == DT_OK) /* a queued producer of the relayout's input */
                s = dt_binary(DT_BINARY_MUL, x, x, NULL, &y);
            if (s == DT_OK)
                s = dt_relayout(y, &lt, NULL, &z);
            if (s == DT_OK)
                s = dt_tensor_read(z, got, sizeof got);
            for (int i = 0; s == DT_OK && i < 42; i++)
                ok = ok && got[i] == (int64_t)i * i;
            if (s != DT_OK || !ok)
                snprintf(why, sizeof why, "%s -> %s: %s", layouts[f], layouts[t],
                         s ? dt_last_error() : "wrong values");
            ok = ok && s == DT_OK;
            dt_tensor_free(x);
            dt_tensor_free(y);
            dt_tensor_free(z);
        }
    tap_check(ok, "late producers relaid between %d layouts: x*x exactly %s", nl, why);
}

/* 3: an all-reduce started, its send buffer freed and reallocated (the same cached block) and
 * overwritten by an upload before the collective is waited for. */
static void free_in_flight(const dt_mesh *m)
{
    int nl = dt_mesh_num_local_devices(m), g = dt_mesh_size(m);
    dt__device *const *devs = dt__mesh_local_devices(m);
    const int64_t n = 1000;
    size_t bytes = sizeof(float) * (size_t)n;
    void *send[64] = {0}, *recv[64] = {0}, *again[64] = {0};
    float *host = malloc(bytes);
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < nl; i++) {
        s = dt__device_alloc(devs[i], bytes, &send[i]);
        if (s == DT_OK)
            s = dt__device_alloc(devs[i], bytes, &recv[i]);
        for (int64_t e = 0; e < n; e++)
            host[e] = (float)(dt_mesh_local_device_id(m, i) + 1);
        if (s == DT_OK)
            s = devs[i]->backend->to_device(devs[i], send[i], host, bytes);
    }
    dt__coll c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_F32,
                  .op = DT_REDUCE_SUM,
                  .axes = (1u << dt_mesh_num_axes(m)) - 1,
                  .send = (const void *const *)send,
                  .recv = recv,
                  .count = n};
    dt__coll_req *r = NULL;
    if (s == DT_OK)
        s = dt__collective_start(m, &c, &r);
    bool reused = true;
    for (int i = 0; s == DT_OK && i < nl; i++) {
        dt__device_free(devs[i], send[i], bytes);
        s = dt__device_alloc(devs[i], bytes, &again[i]);
        reused = reused && again[i] == send[i];
        for (int64_t e = 0; e < n; e++)
            host[e] = -1;
        if (s == DT_OK) /* a new owner writes the block on the compute stream */
            s = devs[i]->backend->to_device(devs[i], again[i], host, bytes);
    }
    if (r) {
        dt_status w = dt__collective_wait(r);
        s = s == DT_OK ? w : s;
    }
    bool ok = s == DT_OK;
    for (int i = 0; ok && i < nl; i++) {
        s = devs[i]->backend->to_host(devs[i], host, recv[i], bytes);
        ok = s == DT_OK && host[0] == (float)(g * (g + 1) / 2) && host[n - 1] == host[0];
    }
    tap_check(ok && reused,
              "a send buffer freed and reused while its all-reduce is in flight: the sum "
              "%d is intact (%s, block reused: %s)",
              g * (g + 1) / 2, s ? dt_last_error() : "ok", reused ? "yes" : "no");
    for (int i = 0; i < nl; i++) {
        dt__device_free(devs[i], again[i], bytes);
        dt__device_free(devs[i], recv[i], bytes);
    }
    free(host);
}

/* 4: bf16 values 1, 2^-9, 2^-9, 2^-9 (devices 0..3, then 0 beyond): the f32 sum 1 + 3 2^-9
 * rounds to 1 + 2^-7, every pairwise rounding order to 1. */
static void bf16_once(const dt_mesh *m)
{
    int nl = dt_mesh_num_local_devices(m);
    dt__device *const *devs = dt__mesh_local_devices(m);
    void *buf[64] = {0};
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < nl; i++) {
        int d = dt_mesh_local_device_id(m, i);
        uint16_t v[2] = {dt_f32_to_bf16(d == 0  ? 1.0f
                                        : d < 4 ? 0x1p-9f
                                                : 0.0f),
                         dt_f32_to_bf16(d == 0  ? 1.0f
                                        : d < 4 ? 0x1p-9f
                                                : 0.0f)};
        s = dt__device_alloc(devs[i], sizeof v, &buf[i]);
        if (s == DT_OK)
            s = devs[i]->backend->to_device(devs[i], buf[i], v, sizeof v);
    }
    dt__coll c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_BF16,
                  .op = DT_REDUCE_SUM,
                  .axes = (1u << dt_mesh_num_axes(m)) - 1,
                  .send = (const void *const *)buf,
                  .recv = buf,
                  .count = 2};
    if (s == DT_OK)
        s = dt__collective(m, &c);
    bool ok = s == DT_OK;
    float want = dt_bf16_to_f32(dt_f32_to_bf16(1.0f + 0x1p-9f * 3)), got = 0;
    for (int i = 0; ok && i < nl; i++) {
        uint16_t v[2];
        s = devs[i]->backend->to_host(devs[i], v, buf[i], sizeof v);
        got = dt_bf16_to_f32(v[0]);
        ok = s == DT_OK && got == want && v[1] == v[0];
    }
    dt_ledger_entry e = {0};
    dt_ledger_entry_get(dt_ledger_size() - 1, &e);
    tap_check(ok, "bf16 sum 1 + 3 x 2^-9 over %d devices (%s): %g, rounded once %g (%s)",
              dt_mesh_size(m), e.backend, (double)got, (double)want, s ? dt_last_error() : "ok");
    for (int i = 0; i < nl; i++)
        dt__device_free(devs[i], buf[i], 4);
}

int main(void)
{
    if (dt_init(&(dt_init_options){.timeout_seconds = 60}) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    me = dt_client_id();
    nclients = dt_num_clients();
    int g = dt_num_global_devices(DT_DEVICE_CUDA), per = dt_num_local_devices(DT_DEVICE_CUDA);
    if (!dt__rt.cuda_emulated || nclients < 2) {
        tap_diag("skipped: needs GPUs emulated on the host (DTENSOR_EMULATE_CUDA) on 2 or more "
                 "clients");
        tap_check(true, "nothing to check here");
        int rc = tap_done();
        dt_finalize();
        return rc;
    }
    /* GPUs shared when every client of the machine sees the same ones and they are fewer */
    const char *vis = getenv("DTENSOR_EMULATE_CUDA_VISIBLE"), *emu = getenv("DTENSOR_EMULATE_CUDA");
    bool shared = vis && !strcmp(vis, "host") && atoi(emu) < nclients;
    tap_diag("%d clients, %d CUDA devices each (emulated%s), %s", nclients, per,
             getenv("DTENSOR_EMULATE_LATE") ? ", late streams" : "",
             shared ? "GPUs shared" : "each client its own GPUs");
    char spec[64];
    snprintf(spec, sizeof spec, per > 1 ? "x=%d,y=%d" : "x=%d", per > 1 ? g / per : g, per);
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_from_string(spec, DT_DEVICE_CUDA, &m);
    if (!tap_check(s == DT_OK, "mesh %s: %s", spec, s ? dt_last_error() : "ok"))
        return tap_done();
    matmul_check(m, g);
    dt_ledger_entry e = {0};
    dt_ledger_entry_get(dt_ledger_size() - 1, &e);
    const char *want = shared ? "(host-staged)" : "nccl (emulated)";
    tap_check(strstr(e.backend, want) != NULL,
              "the all-reduce across clients went through %s (expected %s)", e.backend, want);
    if (dt_mesh_num_axes(m) == 1) {
        dt_mesh *m2 = NULL;
        snprintf(spec, sizeof spec, "x=%d,y=1", g);
        if (dt_mesh_create_from_string(spec, DT_DEVICE_CUDA, &m2) == DT_OK) {
            relayout_check(m2);
            dt_mesh_free(m2);
        }
    } else {
        relayout_check(m);
    }
    free_in_flight(m);
    bf16_once(m);
    /* nothing failed underneath: a device of the mesh still runs an op */
    dt_tensor *t = NULL;
    dt_layout rep;
    dt_layout_replicated(m, 1, &rep);
    s = dt_zeros(DT_DTYPE_F32, 1, (int64_t[]){4}, &(dt_op_options){.layout = &rep}, &t);
    tap_check(s == DT_OK, "the devices are alive at the end (%s)", s ? dt_last_error() : "ok");
    dt_tensor_free(t);
    dt_mesh_free(m);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
