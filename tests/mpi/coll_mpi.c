/* Collectives across clients: every kind, dtype, reduction and algorithm against direct loops
 * (tests/coll_ref.h), on 1-D and 2-D meshes with masks of one and several axes. Run with one
 * device per client (MPI backend) and with several (hierarchical: groups reduce locally, cross
 * clients once, copy locally; some groups lie inside a client, some span clients partially).
 * With clients on several hosts (scripts/multihost.sh, or DTENSOR_AGREE_HOSTS=2 on one), the
 * sweeps under auto and hierarchical_copy take the by-host path (collectives/hosts.c) on every
 * kind, dtype and uneven form.
 * With GPUs emulated on the host (DTENSOR_EMULATE_CUDA), the same on CUDA meshes, whose groups
 * spanning clients run as device collectives (collectives/device.c over the emulated NCCL:
 * the logical devices of one GPU combined on it, one rank per GPU), or, when clients share
 * GPUs (DTENSOR_EMULATE_CUDA_VISIBLE=host with fewer GPUs than clients), through host copies
 * of the device buffers (collectives/staged.c). */
#include "../coll_ref.h"
#include "tap.h"

#include <math.h>

static void sweep_on(dt_device_type type, const char *spec, dt_collective_algorithm alg,
                     int64_t big)
{
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_from_string(spec, type, &m);
    if (!tap_check(s == DT_OK, "mesh %s", spec))
        return;
    for (unsigned axes = 0; axes < 1u << dt_mesh_num_axes(m); axes++) {
        char why[512] = "";
        int runs = ref_sweep(m, axes, big, alg, why, sizeof why);
        tap_check(runs > 0, "%s axes 0x%x (group of %d) %s: %d collectives%s%s", spec, axes,
                  dt__group_size(m, axes), dt_collective_algorithm_name(alg), runs,
                  runs > 0 ? "" : ": ", why);
    }
    dt_mesh_free(m);
}

static void sweep(const char *spec, dt_collective_algorithm alg, int64_t big)
{
    sweep_on(DT_DEVICE_CPU, spec, alg, big);
}

/* One f32 sum all-reduce of `count` elements over the first axis of m, checked against the
 * reference; *e gets its ledger entry. */
static bool all_reduce_once(const dt_mesh *m, int64_t count, dt_ledger_entry *e, char *why,
                            size_t wl)
{
    bool ok;
    ref_case c = {.kind = DT__COLL_ALL_REDUCE,
                  .dtype = DT_DTYPE_F32,
                  .op = DT_REDUCE_SUM,
                  .axes = 1u,
                  .count = count};
    dt_status s = ref_run(m, &c, &ok, why, wl);
    *e = (dt_ledger_entry){0};
    dt_ledger_entry_get(dt_ledger_size() - 1, e);
    return s == DT_OK && ok;
}

/* A NaN on one device survives an all-reduce MAX or MIN, wherever it sits (MPICH's MPI_MAX of
 * floats keeps or drops it by the order of the operands): element 0 is NaN on one device, the
 * first or the last of the mesh, element 1 is the device's number everywhere, so its max is
 * the last device's number and its min 0. f32, f64 and the 16-bit floats; every algorithm. */
static void nan_survives(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CPU), nl = dt_num_local_devices(DT_DEVICE_CPU);
    int first = dt_global_device_id(DT_DEVICE_CPU, 0);
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", n);
    dt_mesh *m = NULL;
    if (!tap_check(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) == DT_OK, "mesh %s", spec))
        return;
    const dt_dtype dts[4] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};
    bool ok = true;
    char why[256] = "";
    for (int a = DT_ALGORITHM_AUTO; a < DT_ALGORITHM_COUNT; a++) {
        if (a == DT_ALGORITHM_NCCL)
            continue;
        for (int t = 0; t < 4; t++)
            for (int op = 0; op < 2; op++)
                for (int where = 0; where < 2; where++) {
                    int holder = where ? n - 1 : 0;
                    double buf[64][2]; /* per local device, as f64, f32 or 16-bit values */
                    const void *send[64];
                    void *recv[64];
                    for (int i = 0; i < nl && i < 64; i++) {
                        int d = first + i;
                        float f[2] = {d == holder ? NAN : (float)d, (float)d};
                        if (dts[t] == DT_DTYPE_F64)
                            memcpy(buf[i], (double[]){f[0], f[1]}, 2 * sizeof(double));
                        else if (dts[t] == DT_DTYPE_F32)
                            memcpy(buf[i], f, sizeof f);
                        else if (dts[t] == DT_DTYPE_BF16)
                            memcpy(buf[i], (uint16_t[]){dt_f32_to_bf16(f[0]), dt_f32_to_bf16(f[1])},
                                   2 * sizeof(uint16_t));
                        else
                            memcpy(buf[i], (uint16_t[]){dt_f32_to_f16(f[0]), dt_f32_to_f16(f[1])},
                                   2 * sizeof(uint16_t));
                        send[i] = recv[i] = buf[i];
                    }
                    dt__coll c = {.kind = DT__COLL_ALL_REDUCE,
                                  .dtype = dts[t],
                                  .op = op ? DT_REDUCE_MIN : DT_REDUCE_MAX,
                                  .axes = 1u,
                                  .algorithm = (dt_collective_algorithm)a,
                                  .send = send,
                                  .recv = recv,
                                  .count = 2};
                    if (dt__collective(m, &c) != DT_OK) {
                        ok = false;
                        snprintf(why, sizeof why, "%s", dt_last_error());
                        continue;
                    }
                    for (int i = 0; i < nl && i < 64; i++) {
                        double got[2];
                        if (dts[t] == DT_DTYPE_F64)
                            memcpy(got, buf[i], sizeof got);
                        for (int k = 0; k < 2 && dts[t] != DT_DTYPE_F64; k++) {
                            uint16_t h;
                            float f;
                            memcpy(dts[t] == DT_DTYPE_F32 ? (void *)&f : (void *)&h,
                                   (char *)buf[i] + k * dt_dtype_size(dts[t]),
                                   dt_dtype_size(dts[t]));
                            got[k] = dts[t] == DT_DTYPE_F32    ? f
                                     : dts[t] == DT_DTYPE_BF16 ? dt_bf16_to_f32(h)
                                                               : dt_f16_to_f32(h);
                        }
                        if (!isnan(got[0]) || got[1] != (op ? 0 : n - 1)) {
                            ok = false;
                            snprintf(why, sizeof why,
                                     "%s %s %s, NaN on device %d: device %d got %g, %g",
                                     dt_collective_algorithm_name((dt_collective_algorithm)a),
                                     dt_dtype_name(dts[t]), op ? "min" : "max", holder, first + i,
                                     got[0], got[1]);
                        }
                    }
                }
    }
    tap_check(ok,
              "a NaN on the first or the last device survives all-reduce MAX and MIN (f32, "
              "f64, bf16, f16; every algorithm) %s",
              why);
    dt_mesh_free(m);
}

/* Emulated GPUs: every kind on a CUDA mesh over every GPU, and the ledger naming the path. */
static void staged(void)
{
    int n = dt_num_global_devices(DT_DEVICE_CUDA);
    char spec[64];
    snprintf(spec, sizeof spec, "x=%d", n);
    sweep_on(DT_DEVICE_CUDA, spec, DT_ALGORITHM_AUTO, 3001);
    dt_mesh *m = NULL;
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CUDA, &m) != DT_OK)
        return;
    char why[512] = "";
    dt_ledger_entry e;
    bool ok = all_reduce_once(m, 1000, &e, why, sizeof why);
    const char *kind = dt_mesh_num_local_devices(m) > 1 ? "hierarchical" : "mpi";
    char want[64];
    if (dt_num_clients() == 1)
        snprintf(want, sizeof want, "local");
    else if (!dt__rt.gpus_shared)
        snprintf(want, sizeof want, "nccl (emulated)");
    else
        snprintf(want, sizeof want, "%s%s (host-staged)", kind,
                 strstr(e.backend, " by host") ? " by host" : "");
    tap_check(ok && strcmp(e.backend, want) == 0,
              "all-reduce on emulated GPUs: backend %s (expected %s) %s", e.backend, want, why);
    dt_mesh_free(m);
}

/* Whether the group of every client goes by host: its clients span hosts (as the agreement
 * groups them: namespace hosts, or DTENSOR_AGREE_HOSTS) and some host holds two of them. */
static bool spans_hosts_with_company(void)
{
    int n = dt_num_clients(), hosts = 0, most = 0;
    for (int c = 0; c < n; c++) {
        int same = 0, first = 1;
        for (int d = 0; d < n; d++) {
            same += dt__host_of(d) == dt__host_of(c);
            first &= !(d < c && dt__host_of(d) == dt__host_of(c));
        }
        hosts += first;
        most = same > most ? same : most;
    }
    return dt__host_of(0) >= 0 && hosts > 1 && most > 1;
}

/* The by-host path, when asked for (hierarchical_copy) or chosen (auto, large): the ledger
 * names it exactly where the group spans hosts with two clients on one; values as always. */
static void by_host(int n)
{
    dt_mesh *m = NULL;
    char spec[64], why[512] = "";
    snprintf(spec, sizeof spec, "x=%d", n);
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK)
        return;
    bool want = spans_hosts_with_company();
    dt_ledger_entry e;
    dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_HIERARCHICAL_COPY);
    bool ok = all_reduce_once(m, 1000, &e, why, sizeof why);
    tap_check(ok && (strstr(e.backend, "by host") != NULL) == want,
              "hierarchical_copy all-reduce on %s: backend %s (by host expected: %s) %s", spec,
              e.backend, want ? "yes" : "no", why);
    dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_AUTO);
    ok = all_reduce_once(m, (DT__RING_MIN_BYTES + (1 << 20)) / 4, &e, why, sizeof why);
    bool spans = dt_num_clients() > 1;
    tap_check(ok && (!spans || e.algorithm == DT_ALGORITHM_RING || strstr(e.backend, "by host")),
              "%lld MiB all-reduce (auto: %s on %s) %s", (long long)(DT__RING_MIN_BYTES >> 20) + 1,
              dt_collective_algorithm_name(e.algorithm), e.backend, why);
    dt_mesh_free(m);
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int n = dt_num_global_devices(DT_DEVICE_CPU);
    tap_diag("%d clients, %d devices each, %d in all", dt_num_clients(),
             dt_num_local_devices(DT_DEVICE_CPU), n);
    char spec[64];
    snprintf(spec, sizeof spec, "x=%d", n);
    for (int a = DT_ALGORITHM_AUTO; a < DT_ALGORITHM_COUNT; a++)
        if (a != DT_ALGORITHM_NCCL)
            sweep(spec, (dt_collective_algorithm)a, 3001);
    for (int a = 2; a < n; a++)
        if (n % a == 0) {
            snprintf(spec, sizeof spec, "x=%d,y=%d", a, n / a);
            sweep(spec, DT_ALGORITHM_AUTO, 3001);
            sweep(spec, DT_ALGORITHM_RING, 5);
        }
    /* large enough for the automatic ring on a group spanning every client, unless it goes
     * by host */
    by_host(n);
    nan_survives();
    if (dt__rt.cuda_emulated)
        staged();
    int rc = tap_done();
    dt_finalize();
    return rc;
}
