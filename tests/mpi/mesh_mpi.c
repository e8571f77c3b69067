/* Meshes across clients: creation, queries, and clients that disagree (an error on every
 * client, never a hang). Run under mpiexec.mpich -n 1, 2, 4, 8.
 *
 * The program initializes MPI itself, so that it can start and stop the runtime several
 * times with different device counts per client (dt_finalize ends MPI only when dt_init
 * started it).
 */
#include "../ref.h"
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_, size_;

/* Independent device bookkeeping: client c has devs[c] devices; ids are dealt in client
 * order. */
static int devs[1024];

static int first_id(int c)
{
    int at = 0;
    for (int k = 0; k < c; k++)
        at += devs[k];
    return at;
}

static int total_devices(void)
{
    return first_id(size_);
}

/* The owner of device d, found by walking the clients' blocks. */
static int owner(int d)
{
    for (int c = 0, at = 0; c < size_; c++) {
        at += devs[c];
        if (d < at)
            return c;
    }
    return -1;
}

/* Does every client hold the same text? (Compared through the library's gather.) */
static bool same_on_all(const char *text)
{
    char mine[DT_STRING_MAX * 2] = {0};
    snprintf(mine, sizeof mine, "%s", text);
    char *all = malloc(sizeof mine * (size_t)size_);
    bool same = dt__rt.world == MPI_COMM_NULL ||
                dt__allgather_bytes(dt__rt.world, mine, sizeof mine, all) == DT_OK;
    for (int c = 1; same && dt__rt.world != MPI_COMM_NULL && c < size_; c++)
        same = strcmp(all, all + sizeof mine * (size_t)c) == 0;
    free(all);
    return same;
}

static bool has(const char *needle)
{
    return strstr(dt_last_error(), needle) != NULL;
}

/* ---- one configuration of devices -------------------------------------------------------- */

static void check_runtime(const char *config)
{
    tap_check(dt_num_clients() == size_ && dt_client_id() == rank_, "%s: client %d of %d", config,
              dt_client_id(), dt_num_clients());
    tap_check(dt_num_local_devices(DT_DEVICE_CPU) == devs[rank_], "%s: local device count", config);
    tap_check(dt_num_global_devices(DT_DEVICE_CPU) == total_devices(),
              "%s: %d global devices over all clients", config, total_devices());
    bool ids = true;
    for (int i = 0; i < devs[rank_]; i++)
        ids = ids && dt_global_device_id(DT_DEVICE_CPU, i) == first_id(rank_) + i;
    ids = ids && dt_global_device_id(DT_DEVICE_CPU, devs[rank_]) == -1;
    tap_check(ids, "%s: global ids of local devices follow the clients before", config);
    /* every rank on one host: the GPUs are dealt round-robin (none without a GPU) */
    int gpus = 0;
    for (int r = 0; r < size_; r++)
        gpus += ref_cuda_devices(r, size_);
    tap_check(dt_num_local_devices(DT_DEVICE_CUDA) == ref_cuda_devices(rank_, size_) &&
                  dt_num_global_devices(DT_DEVICE_CUDA) == gpus,
              "%s: %d CUDA devices here, %d in all, as the CUDA runtime reports", config,
              ref_cuda_devices(rank_, size_), gpus);
    tap_check(dt_barrier() == DT_OK, "%s: barrier", config);
}

/* Create a mesh of `spec` (which must cover every device) and check every query. */
static void check_mesh(const char *config, const char *spec, int num_axes, const int sizes[])
{
    dt_mesh *m = NULL;
    dt_status s = dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m);
    if (!tap_check(s == DT_OK, "%s: mesh %s created on every client", config, spec)) {
        dt_mesh_free(m);
        return;
    }
    int g = total_devices();
    bool ok = dt_mesh_size(m) == g && dt_mesh_num_axes(m) == num_axes;
    for (int a = 0; a < num_axes; a++)
        ok = ok && dt_mesh_axis_size(m, a) == sizes[a];
    tap_check(ok, "%s: %s axes and size", config, spec);

    ok = dt_mesh_num_local_devices(m) == devs[rank_];
    for (int i = 0; i < devs[rank_]; i++)
        ok = ok && dt_mesh_local_device_id(m, i) == first_id(rank_) + i;
    ok = ok && dt_mesh_local_device_id(m, devs[rank_]) == -1;
    tap_check(ok, "%s: %s local device ids are this client's contiguous block", config, spec);

    ok = true;
    for (int d = 0; d < g; d++) {
        int c = -1;
        ok = ok && dt_mesh_device_client(m, d, &c) == DT_OK && c == owner(d);
    }
    int c = 0;
    ok = ok && dt_mesh_device_client(m, g, &c) == DT_ERR_ARG;
    tap_check(ok, "%s: %s owner of every device", config, spec);

    ok = true;
    for (int d = 0; d < g; d++) {
        int want[DT_MAX_MESH_AXES], got[DT_MAX_MESH_AXES], back = -1;
        ref_coords(num_axes, sizes, d, want);
        ok = ok && dt_mesh_device_coords(m, d, got) == DT_OK &&
             memcmp(want, got, sizeof(int) * (size_t)num_axes) == 0 &&
             dt_mesh_device_at(m, want, &back) == DT_OK && back == d;
    }
    tap_check(ok, "%s: %s coordinates of every device, row-major", config, spec);
    dt_mesh_free(m);
}

/* ---- clients that disagree ----------------------------------------------------------------- */

static void check_disagreement(const char *config)
{
    int g = total_devices();
    char one[64], two[64];
    snprintf(one, sizeof one, "x=%d", g);
    /* a different description of the same device count */
    if (g % 2 == 0 && g > 2)
        snprintf(two, sizeof two, "x=%d,y=2", g / 2);
    else
        snprintf(two, sizeof two, "y=%d", g);

    /* client 0 says one thing, the others another */
    dt_mesh *m = (dt_mesh *)&m;
    dt_status s = dt_mesh_create_from_string(rank_ == 0 ? one : two, DT_DEVICE_CPU, &m);
    if (size_ > 1) {
        char d1[80], d2[80];
        snprintf(d1, sizeof d1, "\"%s CPU\"", one);
        snprintf(d2, sizeof d2, "\"%s CPU\"", two);
        tap_check(s == DT_ERR_MISMATCH, "%s: \"%s\" on client 0, \"%s\" elsewhere: mismatch (%s)",
                  config, one, two, dt_status_name(s));
        tap_check(has(d1) && has(d2), "%s: the message names both descriptions", config);
        tap_check(same_on_all(dt_last_error()), "%s: every client has the same message", config);
    } else {
        tap_check(s == DT_OK, "%s: one client cannot disagree with itself", config);
        dt_mesh_free(m);
        m = NULL;
    }
    tap_check(m == NULL, "%s: out is NULL after the failure", config);

    /* the last client's one axis named "x=2,y" of size g/2 prints like the others' x=2,y=g/2:
     * the clients compare structure, not text, so every client fails */
    if (size_ > 1 && g % 2 == 0) {
        const char *split[2] = {"x", "y"}, *joined[1] = {"x=2,y"};
        m = NULL;
        s = rank_ == size_ - 1 ? dt_mesh_create(1, joined, (int[]){g / 2}, DT_DEVICE_CPU, &m)
                               : dt_mesh_create(2, split, (int[]){2, g / 2}, DT_DEVICE_CPU, &m);
        tap_check(s == DT_ERR_MISMATCH && has("differ in number of axes") && m == NULL,
                  "%s: names that print alike but split differently: mismatch on every client "
                  "(%s: %s)",
                  config, dt_status_name(s), dt_last_error());
    }

    /* the same axes, but CPU on client 0 and CUDA elsewhere */
    m = NULL;
    s = dt_mesh_create_from_string(one, rank_ == 0 ? DT_DEVICE_CPU : DT_DEVICE_CUDA, &m);
    if (size_ > 1)
        tap_check(s == DT_ERR_MISMATCH && has("CPU\"") && has("CUDA\""),
                  "%s: device types differ: mismatch naming both (%s)", config, dt_status_name(s));
    else
        dt_mesh_free(m);

    /* sizes differ in the arrays form: the last client has one more axis of size 1 */
    const char *names[2] = {"x", "y"};
    int sizes[2] = {g, 1};
    m = NULL;
    s = dt_mesh_create(rank_ == size_ - 1 && size_ > 1 ? 2 : 1, names, sizes, DT_DEVICE_CPU, &m);
    if (size_ > 1)
        tap_check(s == DT_ERR_MISMATCH && has("x=") && has("y=1"),
                  "%s: an extra axis on the last client: mismatch (%s)", config, dt_status_name(s));
    else
        dt_mesh_free(m);

    /* an unparsable spec on one client only: every client fails, none waits */
    m = NULL;
    s = dt_mesh_create_from_string(rank_ == size_ - 1 ? "x=3,,y" : one, DT_DEVICE_CPU, &m);
    tap_check(s != DT_OK && m == NULL, "%s: unparsable on client %d only: every client fails (%s)",
              config, size_ - 1, dt_status_name(s));
    tap_check(has("x=3,,y"), "%s: the message names the unparsable spec", config);
    m = NULL;
    s = dt_mesh_create_from_string(rank_ == 0 ? "x=a" : one, DT_DEVICE_CPU, &m);
    tap_check(s != DT_OK && m == NULL && has("x=a"),
              "%s: \"x=a\" on client 0 only: every client fails naming it (%s)", config,
              dt_status_name(s));

    /* no out-parameter on one client only: that client's own mistake, but no other client may
     * be left waiting for it */
    m = NULL;
    s = dt_mesh_create_from_string(one, DT_DEVICE_CPU, rank_ == size_ - 1 ? NULL : &m);
    tap_check(s != DT_OK && m == NULL,
              "%s: from_string with out NULL on client %d only: every client fails (%s)", config,
              size_ - 1, dt_status_name(s));
    tap_check(rank_ != size_ - 1 || (s == DT_ERR_ARG && has("out is NULL")),
              "%s: the client without out says so", config);
    s = dt_mesh_create(1, (const char *[]){"x"}, (int[]){g}, DT_DEVICE_CPU, rank_ == 0 ? NULL : &m);
    tap_check(s != DT_OK && m == NULL,
              "%s: mesh_create with out NULL on client 0 only: every client fails (%s)", config,
              dt_status_name(s));

    /* the same invalid mesh everywhere: the same error everywhere */
    char wrong[64];
    snprintf(wrong, sizeof wrong, "x=%d", g + 1);
    m = NULL;
    s = dt_mesh_create_from_string(wrong, DT_DEVICE_CPU, &m);
    char count[64];
    snprintf(count, sizeof count, "have %d CPU devices", g);
    tap_check(s == DT_ERR_MESH && has(wrong) && has(count),
              "%s: \"%s\" on every client: DT_ERR_MESH naming it (%s)", config, wrong,
              dt_status_name(s));
    tap_check(same_on_all(dt_last_error()), "%s: the same message on every client", config);
    m = NULL;
    s = dt_mesh_create_from_string("x=2,x=2", DT_DEVICE_CPU, &m);
    tap_check(s == DT_ERR_MESH && has("\"x\"") && same_on_all(dt_last_error()),
              "%s: a name used twice, on every client (%s)", config, dt_status_name(s));
    m = NULL;
    s = dt_mesh_create_from_string("x=,", DT_DEVICE_CPU, &m);
    tap_check(s == DT_ERR_MESH && has("x=,"), "%s: unparsable on every client (%s)", config,
              dt_status_name(s));

    /* after all that, the clients still agree on a good mesh */
    m = NULL;
    s = dt_mesh_create_from_string(one, DT_DEVICE_CPU, &m);
    tap_check(s == DT_OK && dt_mesh_size(m) == g, "%s: a good mesh after the failures", config);
    dt_mesh_free(m);
}

static void check_print_ordered(const char *config)
{
    FILE *f = tmpfile();
    char line[64];
    snprintf(line, sizeof line, "client %d has %d devices\n", rank_, devs[rank_]);
    dt_status s = dt_print_ordered(f, line);
    char got[4096] = {0}, want[4096] = "";
    rewind(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    if (rank_ == 0)
        for (int c = 0; c < size_; c++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "client %d has %d devices\n",
                     c, devs[c]);
    tap_check(s == DT_OK && n == strlen(want) && strcmp(got, want) == 0,
              "%s: print_ordered: client 0 writes every line in client order, others nothing",
              config);
}

static void check_client_allgather(const char *config)
{
    /* each client sends (its id, its device count); every client receives all, in order */
    int64_t mine[2] = {rank_, devs[rank_]}, all[2 * 1024] = {0};
    dt_status s = dt_client_allgather(mine, sizeof mine, all);
    bool ok = s == DT_OK;
    for (int c = 0; ok && c < size_; c++)
        ok = all[2 * c] == c && all[2 * c + 1] == devs[c];
    tap_check(ok, "%s: client_allgather: every client gets every contribution in order", config);
    /* client 0 sends one byte more: every client fails with the counts, none hangs */
    s = dt_client_allgather(mine, sizeof mine - (rank_ ? 1 : 0), all);
    tap_check(size_ == 1 ? s == DT_OK
                         : s == DT_ERR_MISMATCH && strstr(dt_last_error(), "client 0 has 16"),
              "%s: client_allgather: different counts fail on every client (%s)", config,
              dt_last_error());
    s = dt_client_allgather(rank_ == size_ - 1 ? NULL : mine, sizeof mine, all);
    tap_check(s == DT_ERR_ARG && strstr(dt_last_error(), "NULL"),
              "%s: client_allgather: NULL buffers on one client fail on every client", config);
}

/* A mesh over one client's own devices: the last client runs ops on it alone while the others
 * do nothing, then all meet in a barrier (no hang, no cross-client traffic). */
static void check_local_mesh(const char *config)
{
    bool ok = true;
    if (rank_ == size_ - 1) {
        const char *name = "r";
        dt_mesh *m = NULL;
        dt_layout l;
        dt_tensor *t = NULL, *sum = NULL;
        float host[3] = {1, 2, 3}, out = 0;
        ok = dt_mesh_create_local(1, &name, (int[]){devs[rank_]}, DT_DEVICE_CPU, 0, &m) == DT_OK &&
             dt_mesh_num_local_devices(m) == devs[rank_] && dt_layout_parse(m, "r", &l) == DT_OK &&
             dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){3}, host, sizeof host, &t) ==
                 DT_OK &&
             dt_reduce(DT_REDUCE_SUM, t, 0, NULL, 0, NULL, &sum) == DT_OK &&
             dt_tensor_read(sum, &out, sizeof out) == DT_OK && out == 6.0f;
        dt_tensor_free(sum);
        dt_tensor_free(t);
        dt_mesh_free(m);
    }
    ok = dt_barrier() == DT_OK && ok;
    tap_check(ok, "%s: a client-local mesh computes on one client while the others wait (%s)",
              config, ok ? "" : dt_last_error());
}

static void run_config(const char *config)
{
    check_runtime(config);
    int g = total_devices();
    char spec[64];
    snprintf(spec, sizeof spec, "x=%d", g);
    check_mesh(config, spec, 1, (int[]){g});
    for (int a = 2; a < g; a++)
        if (g % a == 0) {
            snprintf(spec, sizeof spec, "x=%d,y=%d", a, g / a);
            check_mesh(config, spec, 2, (int[]){a, g / a});
        }
    if (g % 4 == 0) {
        snprintf(spec, sizeof spec, "x=2,y=%d,z=2", g / 4);
        check_mesh(config, spec, 3, (int[]){2, g / 4, 2});
    }
    snprintf(spec, sizeof spec, "a=1,b=%d,c=1", g);
    check_mesh(config, spec, 3, (int[]){1, g, 1});
    check_disagreement(config);
    check_print_ordered(config);
    check_client_allgather(config);
    check_local_mesh(config);
}

int main(void)
{
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (size_ > 1024)
        return 1;
    unsetenv("DTENSOR_CPU_DEVICES");

    /* 1. two devices on every client, from the options */
    for (int c = 0; c < size_; c++)
        devs[c] = 2;
    dt_init_options o = {.cpu_devices = 2};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    run_config("2 per client");
    dt_status s = dt_finalize();
    if (s != DT_OK)
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());

    /* 2. clients differ: 1 device on even clients, 2 on odd ones */
    for (int c = 0; c < size_; c++)
        devs[c] = 1 + c % 2;
    o.cpu_devices = devs[rank_];
    if (dt_init(&o) != DT_OK)
        return 1;
    tap_check(s == DT_OK, "finalize after the first configuration");
    run_config("1 or 2 per client");
    s = dt_finalize();

    /* 3. from DTENSOR_CPU_DEVICES: 3 devices on client 0, 1 on the others */
    for (int c = 0; c < size_; c++)
        devs[c] = c == 0 ? 3 : 1;
    setenv("DTENSOR_CPU_DEVICES", rank_ == 0 ? "3" : "1", 1);
    if (dt_init(NULL) != DT_OK)
        return 1;
    tap_check(s == DT_OK, "finalize after the second configuration");
    run_config("DTENSOR_CPU_DEVICES 3 then 1");

    /* a bad DTENSOR_CPU_DEVICES on one client: dt_init fails on every client */
    s = dt_finalize();
    setenv("DTENSOR_CPU_DEVICES", rank_ == size_ - 1 ? "abc" : "1", 1);
    dt_status bad = dt_init(NULL);
    char msg[DT_STRING_MAX];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    setenv("DTENSOR_CPU_DEVICES", "1", 1);
    for (int c = 0; c < size_; c++)
        devs[c] = 1;
    if (dt_init(NULL) != DT_OK)
        return 1;
    tap_check(s == DT_OK, "finalize after the third configuration");
    tap_check(bad == DT_ERR_ARG && strstr(msg, "\"abc\""),
              "DTENSOR_CPU_DEVICES=abc on client %d only: dt_init fails on every client naming it "
              "(%s: %s)",
              size_ - 1, dt_status_name(bad), msg);
    /* a bad DTENSOR_COLLECTIVES_BY_HOST on client 0 only: the same */
    s = dt_finalize();
    if (rank_ == 0)
        setenv("DTENSOR_COLLECTIVES_BY_HOST", "often", 1);
    bad = dt_init(NULL);
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    unsetenv("DTENSOR_COLLECTIVES_BY_HOST");
    if (dt_init(NULL) != DT_OK)
        return 1;
    tap_check(s == DT_OK, "finalize after the fourth configuration");
    tap_check(bad == DT_ERR_ARG && strstr(msg, "DTENSOR_COLLECTIVES_BY_HOST=\"often\""),
              "DTENSOR_COLLECTIVES_BY_HOST=often on client 0 only: dt_init fails on every client "
              "naming it (%s: %s)",
              dt_status_name(bad), msg);
    check_runtime("1 per client after a failed start");

    int status = tap_done();
    s = dt_finalize();
    if (s != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        status = 1;
    }
    MPI_Finalize();
    return status;
}
