/* Collectives across clients: every kind, dtype, reduction and algorithm against direct loops
 * (tests/coll_ref.h), on 1-D and 2-D meshes with masks of one and several axes. Run with one
 * device per client (MPI backend) and with several (hierarchical: groups reduce locally, cross
 * clients once, copy locally; some groups lie inside a client, some span clients partially).
 * With GPUs emulated on the host (DTENSOR_EMULATE_CUDA), the same on CUDA meshes, whose groups
 * spanning clients run as device collectives (collectives/device.c over the emulated NCCL:
 * the logical devices of one GPU combined on it, one rank per GPU), or, when clients share
 * GPUs (DTENSOR_EMULATE_CUDA_VISIBLE=host with fewer GPUs than clients), through host copies
 * of the device buffers (collectives/staged.c). */
#include "../coll_ref.h"
#include "tap.h"

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
    const char *want = dt_num_clients() == 1              ? "local"
                       : !dt__rt.gpus_shared              ? "nccl (emulated)"
                       : dt_mesh_num_local_devices(m) > 1 ? "hierarchical (host-staged)"
                                                          : "mpi (host-staged)";
    tap_check(ok && strcmp(e.backend, want) == 0,
              "all-reduce on emulated GPUs: backend %s (expected %s) %s", e.backend, want, why);
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
    /* large enough for the automatic ring on a group spanning every client */
    dt_mesh *m = NULL;
    snprintf(spec, sizeof spec, "x=%d", n);
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) == DT_OK) {
        char why[512] = "";
        dt_ledger_entry e;
        bool ok = all_reduce_once(m, (DT__RING_MIN_BYTES + (1 << 20)) / 4, &e, why, sizeof why);
        bool spans = dt_num_clients() > 1;
        tap_check(ok && (!spans || e.algorithm == DT_ALGORITHM_RING),
                  "%lld MiB all-reduce (auto: %s on %s) %s",
                  (long long)(DT__RING_MIN_BYTES >> 20) + 1,
                  dt_collective_algorithm_name(e.algorithm), e.backend, why);
        dt_mesh_free(m);
    }
    if (dt__rt.cuda_emulated)
        staged();
    int rc = tap_done();
    dt_finalize();
    return rc;
}
