/* Runtime start and stop: clients (MPI ranks or one process), local devices, topology. */
#include "dt.h"

#include <hwloc.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

dt__runtime dt__rt = {.world = MPI_COMM_NULL, .num_clients = 1};

static hwloc_topology_t topology;

enum { BIND_AUTO = -1, BIND_NONE = 0, BIND_REQUIRED = 1, BIND_NEVER = 2 };

dt_status dt__require_init(const char *fn)
{
    if (!dt__rt.initialized)
        return dt__fail(DT_ERR_STATE, "%s: dt_init has not been called", fn);
    return DT_OK;
}

int dt_is_initialized(void)
{
    DT__SERIAL();
    return dt__rt.initialized;
}

int dt_client_id(void)
{
    DT__SERIAL();
    return dt__rt.initialized ? dt__rt.client : 0;
}

int dt_num_clients(void)
{
    DT__SERIAL();
    return dt__rt.initialized ? dt__rt.num_clients : 1;
}

int dt_num_local_devices(dt_device_type type)
{
    DT__SERIAL();
    if (!dt__rt.initialized || (unsigned)type >= DT_DEVICE_COUNT)
        return 0;
    return dt__rt.num_devices[type];
}

int dt_num_global_devices(dt_device_type type)
{
    DT__SERIAL();
    if (!dt__rt.initialized || (unsigned)type >= DT_DEVICE_COUNT)
        return 0;
    return dt__rt.client_first[type][dt__rt.num_clients];
}

int dt_global_device_id(dt_device_type type, int local_index)
{
    DT__SERIAL();
    if (!dt__rt.initialized || (unsigned)type >= DT_DEVICE_COUNT || local_index < 0 ||
        local_index >= dt__rt.num_devices[type])
        return -1;
    return dt__rt.client_first[type][dt__rt.client] + local_index;
}

static dt_status local_device(const char *fn, dt_device_type type, int local_index,
                              dt__device **out)
{
    DT_TRY(dt__require_init(fn));
    if ((unsigned)type >= DT_DEVICE_COUNT || local_index < 0 ||
        local_index >= dt__rt.num_devices[type])
        return dt__fail(DT_ERR_ARG, "%s: no local %s device %d (this client has %d)", fn,
                        dt_device_type_name(type), local_index,
                        (unsigned)type < DT_DEVICE_COUNT ? dt__rt.num_devices[type] : 0);
    *out = &dt__rt.devices[type][local_index];
    return DT_OK;
}

dt_status dt_device_memory_stats(dt_device_type type, int local_index, dt_memory_stats *out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_device_memory_stats: out is NULL");
    *out = (dt_memory_stats){0};
    dt__device *d;
    DT_TRY(local_device("dt_device_memory_stats", type, local_index, &d));
    pthread_mutex_lock(&d->cache_lock);
    out->reserved = d->bytes_reserved;
    out->cached = d->bytes_cached;
    out->system_allocs = d->system_allocs;
    pthread_mutex_unlock(&d->cache_lock);
    out->in_use = atomic_load(&d->bytes_current);
    out->peak = atomic_load(&d->bytes_peak);
    return DT_OK;
}

dt_status dt_device_release_cache(dt_device_type type, int local_index)
{
    DT__SERIAL();
    dt__device *d;
    if (local_index == -1 && (unsigned)type < DT_DEVICE_COUNT) {
        DT_TRY(dt__require_init("dt_device_release_cache"));
        for (int i = 0; i < dt__rt.num_devices[type]; i++)
            dt__device_release_cache(&dt__rt.devices[type][i]);
        return DT_OK;
    }
    DT_TRY(local_device("dt_device_release_cache", type, local_index, &d));
    dt__device_release_cache(d);
    return DT_OK;
}

dt_status dt_device_memory_reset_peak(dt_device_type type, int local_index)
{
    DT__SERIAL();
    int first = local_index, last = local_index;
    if (local_index == -1 && (unsigned)type < DT_DEVICE_COUNT) {
        DT_TRY(dt__require_init("dt_device_memory_reset_peak"));
        first = 0;
        last = dt__rt.num_devices[type] - 1;
    }
    for (int i = first; i <= last; i++) {
        dt__device *d;
        DT_TRY(local_device("dt_device_memory_reset_peak", type, i, &d));
        /* a buffer allocated meanwhile raises the peak again (device.c compares and swaps) */
        atomic_store(&d->bytes_peak, atomic_load(&d->bytes_current));
    }
    return DT_OK;
}

dt_status dt_device_memory(dt_device_type type, int local_index, size_t *current, size_t *peak)
{
    DT__SERIAL();
    dt__device *d;
    DT_TRY(local_device("dt_device_memory", type, local_index, &d));
    if (current)
        *current = atomic_load(&d->bytes_current);
    if (peak)
        *peak = atomic_load(&d->bytes_peak);
    return DT_OK;
}

const dt__backend *dt__backend_of(dt_device_type type)
{
    switch (type) {
    case DT_DEVICE_CPU:
        return &dt__cpu_backend;
    case DT_DEVICE_CUDA:
        if (dt__rt.cuda_emulated)
            return &dt__emulated_cuda_backend;
#ifdef DT_HAVE_CUDA
        return &dt__cuda_backend;
#else
        return NULL;
#endif
    default:
        return NULL;
    }
}

/* Launched by an MPI launcher? Hydra (MPICH) sets PMI_*, PMIx launchers PMIX_RANK. */
static bool launched_by_mpi(void)
{
    static const char *const vars[] = {"PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_RANK",
                                       "OMPI_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

typedef struct init_cfg {
    int cpu_devices;
    int bind;
    int cuda_logical; /* logical devices per physical GPU */
    int emulate;      /* emulated GPUs where none is visible (DTENSOR_EMULATE_CUDA) */
    bool tf32;
    int timeout_s;
    int32_t check_collectives; /* DTENSOR_CHECK_COLLECTIVES set and not "0" */
} init_cfg;

/* An option: `given` when non-zero, else the environment variable `env` when set (an integer
 * in lo..hi), else `fallback`. */
static dt_status option(const char *name, int given, const char *env, int lo, int hi, int fallback,
                        int *out)
{
    *out = fallback;
    if (given) {
        if (given < lo || given > hi)
            return dt__fail(DT_ERR_ARG, "dt_init: %s is %d, expected 0 (default) or %d to %d", name,
                            given, lo, hi);
        *out = given;
        return DT_OK;
    }
    const char *v = getenv(env);
    if (v && *v) {
        char *end;
        long x = strtol(v, &end, 10);
        if (*end || x < lo || x > hi)
            return dt__fail(DT_ERR_ARG, "dt_init: %s is \"%s\", expected %d to %d", env, v, lo, hi);
        *out = (int)x;
    }
    return DT_OK;
}

static dt_status read_options(const dt_init_options *opts, init_cfg *cfg)
{
    dt_init_options o = opts ? *opts : (dt_init_options){0};
    cfg->bind = o.bind ? o.bind : BIND_AUTO;
    if (cfg->bind < BIND_AUTO || cfg->bind > BIND_NEVER)
        return dt__fail(DT_ERR_ARG, "dt_init: bind is %d, expected -1, 0, 1 or 2", cfg->bind);
    DT_TRY(
        option("cpu_devices", o.cpu_devices, "DTENSOR_CPU_DEVICES", 1, 4096, 1, &cfg->cpu_devices));
    DT_TRY(option("cuda_logical_devices", o.cuda_logical_devices, "DTENSOR_CUDA_DEVICES", 1, 64, 1,
                  &cfg->cuda_logical));
    DT_TRY(option("DTENSOR_EMULATE_CUDA", 0, "DTENSOR_EMULATE_CUDA", 0, DT__MAX_GPUS, 0,
                  &cfg->emulate));
    int tf32 = 0;
    if (o.allow_tf32 == 2)
        tf32 = 0;
    else
        DT_TRY(option("allow_tf32", o.allow_tf32, "DTENSOR_ALLOW_TF32", 0, 1, 0, &tf32));
    cfg->tf32 = tf32 == 1;
    DT_TRY(option("timeout_seconds", o.timeout_seconds, "DTENSOR_TIMEOUT", 1, 7 * 86400, 600,
                  &cfg->timeout_s));
    const char *check = getenv("DTENSOR_CHECK_COLLECTIVES");
    cfg->check_collectives = check && *check && strcmp(check, "0") != 0;
    return DT_OK;
}

/* The settings every client must share, as the clients compare them at dt_init: a client
 * checking collectives (DTENSOR_CHECK_COLLECTIVES) agrees on each before it runs, so a client
 * that does not would leave it waiting in that agreement while it waits in the collective. */
static int settings_fields(const void *ctx, dt__field out[], int max)
{
    const init_cfg *c = ctx;
    if (max < 1)
        return 0;
    dt__field_set(&out[0], "DTENSOR_CHECK_COLLECTIVES", &c->check_collectives,
                  sizeof c->check_collectives, "%s", c->check_collectives ? "on" : "off");
    return 1;
}

static int bind_core_of(const dt__device *d);

static void *worker_start(void *arg)
{
    dt__device *d = arg;
    int core = bind_core_of(d);
    if (core >= 0) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topology, HWLOC_OBJ_CORE, (unsigned)core);
        if (obj)
            hwloc_set_cpubind(topology, obj->cpuset, HWLOC_CPUBIND_THREAD);
    }
    return dt__device_worker(d);
}

/* Cores for CPU workers: this client's first core on the host, or -1 when not binding. */
static int first_core = -1;
/* Every CPU worker of this host has a core of its own: workers may poll for tasks. */
static bool workers_fit;
/* CPU devices of every client on this host. */
static int host_cpu_devices;

static int bind_core_of(const dt__device *d)
{
    if (d->type != DT_DEVICE_CPU || first_core < 0)
        return -1;
    return first_core + d->local_index;
}

static void stop_devices(dt_device_type type)
{
    dt__device *devs = dt__rt.devices[type];
    for (int i = 0; i < dt__rt.num_devices[type]; i++) {
        dt__device *d = &devs[i];
        if (d->started) {
            pthread_mutex_lock(&d->lock);
            d->stop = true;
            pthread_cond_signal(&d->wake);
            pthread_mutex_unlock(&d->lock);
            pthread_join(d->thread, NULL);
        }
        if (d->opened) {
            dt__device_release_cache(d);
            if (d->backend->close)
                d->backend->close(d);
        }
        pthread_mutex_destroy(&d->lock);
        pthread_cond_destroy(&d->wake);
        pthread_mutex_destroy(&d->cache_lock);
    }
    free(devs);
    dt__rt.devices[type] = NULL;
    dt__rt.num_devices[type] = 0;
    free(dt__rt.client_devices[type]);
    free(dt__rt.client_first[type]);
    dt__rt.client_devices[type] = dt__rt.client_first[type] = NULL;
}

/* Devices of one type: ordinals[i] is the CUDA GPU of device i (NULL for CPU devices), and
 * logical[i] its index among the logical devices of that GPU. */
static dt_status start_devices(dt_device_type type, int count, const dt__backend *backend,
                               const int ordinals[], const int logical[], bool tf32)
{
    dt__device *devs = calloc((size_t)(count ? count : 1), sizeof *devs);
    if (!devs)
        return dt__fail(DT_ERR_NOMEM, "dt_init: cannot allocate %d device records", count);
    dt__rt.devices[type] = devs;
    dt__rt.num_devices[type] = count;
    for (int i = 0; i < count; i++) {
        dt__device *d = &devs[i];
        d->type = type;
        d->local_index = i;
        d->ordinal = ordinals ? ordinals[i] : -1;
        d->logical = logical ? logical[i] : 0;
        d->backend = backend;
        d->siblings = devs;
        d->num_siblings = count;
        pthread_mutex_init(&d->lock, NULL);
        pthread_cond_init(&d->wake, NULL);
        pthread_mutex_init(&d->cache_lock, NULL);
        d->spin = type == DT_DEVICE_CPU && workers_fit;
    }
    if (type == DT_DEVICE_CPU && first_core >= 0)
        for (int i = 0; i < count; i++)
            devs[i].ordinal = first_core + i;
    for (int i = 0; i < count; i++) {
        dt__device *d = &devs[i];
        d->kx = (dt__kctx){.type = dt_device_type_name(type),
                           .index = i,
                           .ordinal = d->ordinal,
                           .tf32 = tf32,
                           .cores = host_cpu_devices > 0 && dt__rt.cores > host_cpu_devices
                                        ? dt__rt.cores / host_cpu_devices
                                        : 1};
        if (backend->open)
            DT_TRY(backend->open(d));
        d->opened = true;
    }
    for (int i = 0; i < count; i++) {
        int e = pthread_create(&devs[i].thread, NULL, worker_start, &devs[i]);
        if (e)
            return dt__fail(DT_ERR_DEVICE, "dt_init: cannot start the worker of %s:%d: %s",
                            dt_device_type_name(type), i, strerror(e));
        devs[i].started = true;
    }
    return DT_OK;
}

/* What a client tells the others of its GPUs at dt_init besides its device counts. */
enum { GPU_EMULATED = 1, GPU_REAL = 2 };

/* Per type, every client's device count and the prefix sums, and what the clients' GPUs are:
 * whether they are emulated. Emulation is the whole job's (a client without
 * DTENSOR_EMULATE_CUDA, owning no GPU, takes the emulated backend too), so that every client
 * decides alike what a CUDA mesh's ops do (kernels, the agreement on their outcome, the
 * collectives' path). Collective over world. */
static dt_status exchange_counts(void)
{
    int n = dt__rt.num_clients;
    int mine[DT_DEVICE_COUNT + 1]; /* the counts, then the GPU_ flags */
    for (int t = 0; t < DT_DEVICE_COUNT; t++)
        mine[t] = dt__rt.num_devices[t];
    mine[DT_DEVICE_COUNT] =
        (dt__rt.cuda_emulated ? GPU_EMULATED : 0) |
        (!dt__rt.cuda_emulated && dt__rt.num_devices[DT_DEVICE_CUDA] ? GPU_REAL : 0);
    int *all = malloc(sizeof mine * (size_t)n);
    if (!all)
        return dt__fail(DT_ERR_NOMEM, "dt_init: cannot allocate device counts for %d clients", n);
    dt_status s = dt__allgather_bytes(dt__rt.world, mine, sizeof mine, all);
    int flags = 0;
    for (int c = 0; s == DT_OK && c < n; c++)
        flags |= all[c * (DT_DEVICE_COUNT + 1) + DT_DEVICE_COUNT];
    dt__rt.cuda_emulated = flags & GPU_EMULATED;
    if (s == DT_OK && (flags & GPU_EMULATED) && (flags & GPU_REAL))
        s = dt__fail(DT_ERR_ARG, "dt_init: some clients emulate GPUs (DTENSOR_EMULATE_CUDA) while "
                                 "others have real ones: emulate on every client or on none");
    for (int t = 0; s == DT_OK && t < DT_DEVICE_COUNT; t++) {
        dt__rt.client_devices[t] = malloc(sizeof(int) * (size_t)n);
        dt__rt.client_first[t] = malloc(sizeof(int) * (size_t)(n + 1));
        if (!dt__rt.client_devices[t] || !dt__rt.client_first[t]) {
            s = dt__fail(DT_ERR_NOMEM, "dt_init: cannot allocate device tables");
            break;
        }
        dt__rt.client_first[t][0] = 0;
        for (int c = 0; c < n; c++) {
            dt__rt.client_devices[t][c] = all[c * (DT_DEVICE_COUNT + 1) + t];
            dt__rt.client_first[t][c + 1] =
                dt__rt.client_first[t][c] + all[c * (DT_DEVICE_COUNT + 1) + t];
        }
    }
    free(all);
    return s;
}

/* ---- GPU identity ------------------------------------------------------------------------ */

static bool same_id(const unsigned char a[16], const unsigned char b[16])
{
    return memcmp(a, b, 16) == 0;
}

/* Index of `id` in view v (its first occurrence), or -1. */
static int seen_at(const dt__gpu_view *v, const unsigned char id[16])
{
    for (int i = 0; i < v->n; i++)
        if (same_id(v->id[i], id))
            return i;
    return -1;
}

/* Whether the clients seeing a and b are the same set. */
static bool same_viewers(int nclients, const dt__gpu_view views[], const unsigned char a[16],
                         const unsigned char b[16])
{
    for (int c = 0; c < nclients; c++)
        if ((seen_at(&views[c], a) < 0) != (seen_at(&views[c], b) < 0))
            return false;
    return true;
}

/* The client that takes GPU `id` (which some client sees): among the clients seeing it, the
 * one whose turn its place is, its place being its index among the GPUs of the same viewers
 * in the first viewer's order. */
static int owner_of(int nclients, const dt__gpu_view views[], const unsigned char id[16])
{
    int nv = 0, first = -1;
    for (int c = 0; c < nclients; c++)
        if (seen_at(&views[c], id) >= 0) {
            first = first < 0 ? c : first;
            nv++;
        }
    const dt__gpu_view *v = &views[first];
    int place = 0, at = seen_at(v, id);
    for (int i = 0; i < at; i++)
        if (seen_at(v, v->id[i]) == i && same_viewers(nclients, views, v->id[i], id))
            place++;
    int turn = place % nv;
    for (int c = first; c < nclients; c++)
        if (seen_at(&views[c], id) >= 0 && turn-- == 0)
            return c;
    return first;
}

/* Client me's own GPUs (those it takes by turn), as indices into its view. */
static int own_gpus(int nclients, const dt__gpu_view views[], int me, int take[])
{
    const dt__gpu_view *v = &views[me];
    int n = 0;
    for (int i = 0; i < v->n && n < DT__MAX_GPUS; i++)
        if (seen_at(v, v->id[i]) == i && owner_of(nclients, views, v->id[i]) == me)
            take[n++] = i;
    return n;
}

void dt__gpu_assign(int nclients, const dt__gpu_view views[], int me, int take[], int *ntake,
                    bool *shared)
{
    *shared = false;
    int scratch[DT__MAX_GPUS];
    for (int c = 0; c < nclients; c++)
        if (views[c].n > 0 && own_gpus(nclients, views, c, scratch) == 0)
            *shared = true;
    *ntake = own_gpus(nclients, views, me, take);
    const dt__gpu_view *v = &views[me];
    if (*ntake == 0 && v->n > 0) {
        /* none left for this client: the k-th of the clients seeing its first GPU shares its
         * k-th GPU (modulo those it sees), as clients outnumbering a host's GPUs do */
        int k = 0;
        for (int c = 0; c < me; c++)
            k += seen_at(&views[c], v->id[0]) >= 0;
        take[0] = k % v->n;
        *ntake = 1;
    }
}

int dt__gpu_number(int nclients, const dt__gpu_view views[], int c, int index)
{
    const unsigned char *id = views[c].id[index];
    int number = 0;
    for (int k = 0; k < nclients; k++)
        for (int i = 0; i < views[k].n; i++) {
            const unsigned char *x = views[k].id[i];
            if (same_id(x, id))
                return number;
            /* distinct: not seen earlier in this view or an earlier client's */
            bool earlier = seen_at(&views[k], x) < i;
            for (int j = 0; !earlier && j < k; j++)
                earlier = seen_at(&views[j], x) >= 0;
            number += !earlier;
        }
    return number;
}

/* What a client tells the others of its GPUs: what it sees and its logical devices per GPU. */
typedef struct gpu_record {
    dt__gpu_view view;
    int logical;
} gpu_record;

/* A made-up identity for emulated GPU g: the client's own (DTENSOR_EMULATE_CUDA_VISIBLE unset
 * or "client", as under a launcher giving each rank its own GPUs), or the host's, seen by every
 * client of the host ("host", as clients sharing a machine's GPUs). */
static void emulated_id(bool host_wide, int owner, int g, unsigned char id[16])
{
    memset(id, 0, 16);
    memcpy(id, host_wide ? "emuh" : "emuc", 4);
    memcpy(id + 4, &owner, sizeof owner);
    memcpy(id + 8, &g, sizeof g);
}

static dt_status emulated_visibility(bool *host_wide)
{
    const char *e = getenv("DTENSOR_EMULATE_CUDA_VISIBLE");
    *host_wide = e && strcmp(e, "host") == 0;
    if (e && *e && strcmp(e, "host") != 0 && strcmp(e, "client") != 0)
        return dt__fail(DT_ERR_ARG,
                        "dt_init: DTENSOR_EMULATE_CUDA_VISIBLE is \"%s\", expected client or host",
                        e);
    return DT_OK;
}

/* Every client's GPU record (collective over world), this client's GPUs (take[], *ntake: view
 * indices) and whether clients share GPUs; records[] stays for the device table. */
static dt_status exchange_gpus(const gpu_record *mine, gpu_record *records, int take[], int *ntake)
{
    DT_TRY(dt__allgather_bytes(dt__rt.world, mine, sizeof *mine, records));
    dt__gpu_view *views = malloc(sizeof *views * (size_t)dt__rt.num_clients);
    if (!views)
        return dt__fail(DT_ERR_NOMEM, "dt_init: out of memory for %d GPU views",
                        dt__rt.num_clients);
    for (int c = 0; c < dt__rt.num_clients; c++)
        views[c] = records[c].view;
    bool shared;
    dt__gpu_assign(dt__rt.num_clients, views, dt__rt.client, take, ntake, &shared);
    dt__rt.gpus_shared = shared;
    free(views);
    return DT_OK;
}

/* The physical GPU of every global CUDA device, and of each local one (d->gpu). */
static dt_status gpu_table(const gpu_record *records)
{
    int n = dt__rt.num_clients, total = dt__rt.client_first[DT_DEVICE_CUDA][n];
    dt__gpu_view *views = malloc(sizeof *views * (size_t)n);
    dt__rt.gpu_of = calloc((size_t)total + 1, sizeof *dt__rt.gpu_of);
    if (!views || !dt__rt.gpu_of) {
        free(views);
        return dt__fail(DT_ERR_NOMEM, "dt_init: out of memory for the GPU table");
    }
    for (int c = 0; c < n; c++)
        views[c] = records[c].view;
    int take[DT__MAX_GPUS], k;
    bool shared;
    for (int c = 0; c < n; c++) {
        dt__gpu_assign(n, views, c, take, &k, &shared);
        int first = dt__rt.client_first[DT_DEVICE_CUDA][c], per = records[c].logical;
        for (int i = 0; i < dt__rt.client_devices[DT_DEVICE_CUDA][c] && i < k * per; i++)
            dt__rt.gpu_of[first + i] = dt__gpu_number(n, views, c, take[i / per]);
    }
    free(views);
    int mine = dt__rt.client_first[DT_DEVICE_CUDA][dt__rt.client];
    for (int i = 0; i < dt__rt.num_devices[DT_DEVICE_CUDA]; i++)
        dt__rt.devices[DT_DEVICE_CUDA][i].gpu = dt__rt.gpu_of[mine + i];
    return DT_OK;
}

/* Where this client's workers go: clients on one host share its cores in rank order. */
static dt_status plan_binding(int bind, int cpu_devices, int *host_leader)
{
    dt__rt.cores = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_CORE);
    if (dt__rt.cores <= 0)
        dt__rt.cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int host_rank = 0, host_size = 1, before = 0, total = cpu_devices;
    if (dt__rt.mpi_used) {
        MPI_Comm host;
        if (MPI_Comm_split_type(dt__rt.world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) !=
            MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_split_type failed");
        MPI_Comm_rank(host, &host_rank);
        MPI_Comm_size(host, &host_size);
        /* per client of the host: its CPU devices and its world rank */
        int mine[2] = {cpu_devices, dt__rt.client};
        int *counts = malloc(sizeof mine * (size_t)host_size);
        dt_status s = counts ? dt__allgather_bytes(host, mine, sizeof mine, counts)
                             : dt__fail(DT_ERR_NOMEM, "dt_init: out of memory");
        MPI_Comm_free(&host);
        if (s != DT_OK) {
            free(counts);
            return s;
        }
        total = 0;
        for (int r = 0; r < host_size; r++) {
            if (r < host_rank)
                before += counts[2 * r];
            total += counts[2 * r];
        }
        *host_leader = counts[1];
        free(counts);
    }
    dt__rt.clients_on_host = host_size;
    first_core = -1;
    bool fits = total <= dt__rt.cores;
    workers_fit = fits;
    host_cpu_devices = total;
    if (bind == BIND_REQUIRED && !fits)
        return dt__fail(DT_ERR_ARG,
                        "dt_init: bind=1 needs a core per CPU device, but %d devices of %d "
                        "clients share %d cores on this host",
                        total, host_size, dt__rt.cores);
    if ((bind == BIND_AUTO || bind == BIND_REQUIRED) && fits)
        first_core = before;
    return DT_OK;
}

/* How long the clients of a job over several hosts stay out of MPI before MPI_Finalize: well
 * above how far apart the clients leave the last exchange (see quiesce): 0.2 to 11 ms at -n 4
 * and 7 ms at -n 8 on 2 namespace hosts of 2 cores with a load average of 15 to 24. A client
 * delayed longer than this can still hang MPICH 4.0's MPI_Finalize. */
#define DT__FINALIZE_QUIET_S 0.05

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Before MPI_Finalize, when the clients span hosts (they reach each other over UCX's TCP
 * transport). MPICH 4.0's MPI_Finalize closes every UCX endpoint in "flush" mode, then waits in
 * the launcher's barrier. Over TCP, flushing an endpoint that has sent anything since its last
 * flush sends an empty put and waits for the peer's acknowledgement, which the peer sends only
 * while it drives UCX; a peer that has already closed its own endpoints waits in the launcher's
 * barrier, not driving UCX, and the two wait for each other for ever (MPICH 4.2 moved the
 * barrier before the closes). Two things make every peer still drive UCX when the flush
 * reaches it: every client sends one byte to every other one and receives theirs, so every
 * endpoint between two clients has sent since its last flush, in both directions, and each
 * closing client waits for its peers' acknowledgements, which they send only after their own
 * flush (TCP keeps a peer's messages in order); and no client drives MPI between that exchange
 * and MPI_Finalize, waiting DT__FINALIZE_QUIET_S instead, so that no client acknowledges a
 * peer's flush before it has sent its own. Also when the caller owns MPI: its MPI_Finalize
 * right after dt_finalize is then just as safe. Returns when the quiet time started. */
static double quiesce(void)
{
    int n = dt__rt.num_clients, me = dt__rt.client, k = 0;
    char one = 1, *in = malloc((size_t)n);
    MPI_Request *req = malloc(sizeof *req * 2 * (size_t)n);
    for (int c = 0; in && req && c < n; c++) {
        if (c == me)
            continue;
        MPI_Irecv(&in[c], 1, MPI_CHAR, c, 0, dt__rt.world, &req[k++]);
        MPI_Isend(&one, 1, MPI_CHAR, c, 0, dt__rt.world, &req[k++]);
    }
    if (in && req)
        dt__mpi_wait_for(k, req, "in dt_finalize's last exchange between hosts");
    free(in);
    free(req);
    return seconds_now();
}

/* finalizing: every client is here (dt_finalize agreed), so the clients may exchange. With a
 * client lost (mesh/watch.c) nothing here waits for it: no MPI call that involves other
 * clients, and MPI is not finalized (MPI_Finalize waits for every process). */
static void release_all(bool finalizing)
{
    for (int t = 0; t < DT_DEVICE_COUNT; t++)
        stop_devices((dt_device_type)t);
    free(dt__rt.gpu_of);
    dt__channel_close();
    bool lost = dt__watch_lost();
    if (dt__rt.mpi_used)
        dt__hooks_mpi_down();
    bool hosts =
        finalizing && !lost && dt__rt.mpi_used && dt__rt.clients_on_host < dt__rt.num_clients;
    double quiet = hosts ? quiesce() : 0;
    if (dt__rt.world != MPI_COMM_NULL && !lost)
        MPI_Comm_free(&dt__rt.world);
    if (topology) {
        hwloc_topology_destroy(topology);
        topology = NULL;
    }
    for (double left; hosts && (left = quiet + DT__FINALIZE_QUIET_S - seconds_now()) > 0;)
        nanosleep(&(struct timespec){.tv_nsec = (long)(left * 1e9)}, NULL);
    if (dt__rt.mpi_owned && !lost)
        MPI_Finalize();
    first_core = -1;
    workers_fit = false;
    host_cpu_devices = 0;
    dt__rt = (dt__runtime){.world = MPI_COMM_NULL, .num_clients = 1};
}

dt_status dt_init(const dt_init_options *opts)
{
    DT__SERIAL();
    if (dt__rt.initialized)
        return dt__fail(DT_ERR_STATE, "dt_init: already initialized (client %d of %d)",
                        dt__rt.client, dt__rt.num_clients);
    if (dt__watch_lost()) { /* MPI still counts the lost client: an agreement would wait */
        char why[160];
        dt__watch_why(why, sizeof why);
        return dt__fail(DT_ERR_STATE,
                        "dt_init: a client was lost earlier in this process (%s); "
                        "start a new job",
                        why);
    }
    int mpi_init = 0, mpi_done = 0;
    MPI_Initialized(&mpi_init);
    MPI_Finalized(&mpi_done);
    if (mpi_done)
        return dt__fail(DT_ERR_STATE,
                        "dt_init: MPI was finalized in this process; dt_init cannot start again");
    init_cfg cfg = {0};
    dt_status local = read_options(opts, &cfg);
    /* the waits of dt_init itself are watched too (a bad value: the default while agreeing) */
    dt__rt.timeout_s = local == DT_OK ? cfg.timeout_s : 600;

    if (mpi_init || launched_by_mpi()) {
        if (!mpi_init) {
            int provided;
            /* MULTIPLE: the heartbeat thread of a host's leader (mesh/watch.c) sends while
             * the client's own calls use MPI; those are serialized by the API lock */
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
                return dt__fail(DT_ERR_COMM, "dt_init: MPI_Init_thread failed");
            dt__rt.mpi_owned = true;
        }
        dt__rt.mpi_used = true;
        dt_status c = dt__hooks_mpi_up();
        local = local == DT_OK ? c : local;
        MPI_Comm_dup(MPI_COMM_WORLD, &dt__rt.world);
        /* errors are statuses, never an abort of the job: a message that fails because a client
         * died must leave the others able to report it (every communicator made from this one
         * inherits the handler) */
        MPI_Comm_set_errhandler(dt__rt.world, MPI_ERRORS_RETURN);
        MPI_Comm_rank(dt__rt.world, &dt__rt.client);
        MPI_Comm_size(dt__rt.world, &dt__rt.num_clients);
    }
    /* every later agreement goes through the channel */
    dt_status s = dt__channel_open();
    if (s != DT_OK) {
        release_all(false);
        return s;
    }
    s = dt__agree_on(&(dt__agreement){.what = "dt_init",
                                      .fingerprint = dt__hash(DT__HASH_SEED, &cfg.check_collectives,
                                                              sizeof cfg.check_collectives),
                                      .fields = settings_fields,
                                      .ctx = &cfg},
                     local);
    int host_leader = dt__rt.client;
    if (s == DT_OK) {
        hwloc_topology_init(&topology);
        hwloc_topology_load(topology);
        s = plan_binding(cfg.bind, cfg.cpu_devices, &host_leader);
        s = dt__agree(dt__rt.world, s);
    }
    /* The GPUs every client sees, by identity: which this client takes, whether clients share
     * some (collective; every client has the same verdict so far) */
    int visible = 0;
#ifdef DT_HAVE_CUDA
    visible = dt__cuda_device_count();
#endif
    bool emulate = cfg.emulate && !visible, host_wide = false;
    gpu_record mine = {.logical = cfg.cuda_logical};
    if (s == DT_OK && emulate)
        s = emulated_visibility(&host_wide);
    for (int g = 0; emulate && g < cfg.emulate; g++)
        emulated_id(host_wide, host_wide ? host_leader : dt__rt.client, g, mine.view.id[g]);
    mine.view.n = emulate ? cfg.emulate : visible < DT__MAX_GPUS ? visible : DT__MAX_GPUS;
#ifdef DT_HAVE_CUDA
    /* a GPU CUDA cannot identify is told apart by its host and ordinal */
    for (int g = 0; !emulate && g < mine.view.n; g++)
        if (!dt__cuda_identity(g, mine.view.id[g]))
            emulated_id(true, host_leader, g, mine.view.id[g]);
#endif
    gpu_record *records = malloc(sizeof *records * (size_t)dt__rt.num_clients);
    if (s == DT_OK && !records)
        s = dt__fail(DT_ERR_NOMEM, "dt_init: out of memory for %d GPU records", dt__rt.num_clients);
    s = dt__agree(dt__rt.world, s);
    int take[DT__MAX_GPUS], ntake = 0;
    if (s == DT_OK)
        s = exchange_gpus(&mine, records, take, &ntake);
    if (s == DT_OK) {
        s = start_devices(DT_DEVICE_CPU, cfg.cpu_devices, &dt__cpu_backend, NULL, NULL, false);
        dt__rt.blas_threads =
            dt__cpu_blas_threads(dt__rt.cores / (host_cpu_devices > 0 ? host_cpu_devices : 1),
                                 &dt__rt.blas_threads_user, &dt__rt.blas_split);
    }
    /* Each GPU this client takes hosts cfg.cuda_logical devices (logical GPUs), consecutive in
     * the device list; emulated GPUs are numbered by their place in the view. */
    int n = ntake * cfg.cuda_logical, ordinals[DT__MAX_GPUS * 64], logical[DT__MAX_GPUS * 64];
    for (int i = 0; i < n; i++) {
        ordinals[i] = take[i / cfg.cuda_logical];
        logical[i] = i % cfg.cuda_logical;
    }
    if (s == DT_OK && emulate) {
        dt__rt.cuda_emulated = true;
        s = start_devices(DT_DEVICE_CUDA, n, &dt__emulated_cuda_backend, ordinals, logical,
                          cfg.tf32);
    }
#ifdef DT_HAVE_CUDA
    else if (s == DT_OK) {
        s = dt__cuda_enable_peers(ntake, take);
        if (s == DT_OK)
            s = start_devices(DT_DEVICE_CUDA, n, &dt__cuda_backend, ordinals, logical, cfg.tf32);
    }
#endif
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK)
        s = exchange_counts();
    if (s == DT_OK)
        s = gpu_table(records);
    free(records);
    if (s != DT_OK) {
        release_all(false);
        return s;
    }
    dt__rt.cuda_tf32 = cfg.tf32;
    dt__rt.check_collectives = cfg.check_collectives;
    dt__rt.initialized = true;
    return DT_OK;
}

dt_status dt_finalize(void)
{
    DT__SERIAL();
    DT_TRY(dt__require_init("dt_finalize"));
    /* Agreed: if any client still holds a mesh or tensor, every client refuses (and stays
     * usable), rather than the others ending MPI under it. */
    int meshes = atomic_load(&dt__rt.live_meshes), tensors = atomic_load(&dt__rt.live_tensors);
    dt_status local = DT_OK;
    if (meshes || tensors)
        local = dt__fail(DT_ERR_STATE,
                         "dt_finalize: client %d still has %d meshes and %d tensors alive; no "
                         "client finalizes",
                         dt__rt.client, meshes, tensors);
    /* after a client was lost, this client releases its own resources at once, agreeing with
     * no one (release_all makes no call that waits for other clients) */
    if (dt__watch_lost())
        DT_TRY(local);
    else
        DT_TRY(dt__agree(dt__rt.world, local));
    dt__hooks_finalize();
    dt__mesh_all_free();
    release_all(true);
    return DT_OK;
}

dt_status dt_devices_print(FILE *f)
{
    DT__SERIAL();
    DT_TRY(dt__require_init("dt_devices_print"));
    if (!f)
        return dt__fail(DT_ERR_ARG, "dt_devices_print: FILE is NULL");
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    int numa = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
    int pus = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PU);
    fprintf(f,
            "client %d of %d on %s: %d cores, %d hardware threads, %d NUMA nodes, %d clients "
            "on this host\n",
            dt__rt.client, dt__rt.num_clients, host, dt__rt.cores, pus, numa,
            dt__rt.clients_on_host);
    fprintf(f, "  OpenBLAS: %d thread%s per GEMM (%s)\n", dt__rt.blas_threads,
            dt__rt.blas_threads == 1 ? "" : "s",
            dt__rt.blas_split          ? "each device's kernel threads split a GEMM"
            : dt__rt.blas_threads_user ? "OPENBLAS_NUM_THREADS"
                                       : "the host's cores over its CPU devices");
    for (int t = 0; t < DT_DEVICE_COUNT; t++) {
        int first = dt__rt.client_first[t][dt__rt.client];
        for (int i = 0; i < dt__rt.num_devices[t]; i++) {
            const dt__device *d = &dt__rt.devices[t][i];
            fprintf(f, "  %s:%d global id %d, backend %s, ", dt_device_type_name(d->type), i,
                    first + i, d->backend->name);
            if (d->type == DT_DEVICE_CUDA && dt__rt.cuda_emulated)
                fprintf(f,
                        "emulated GPU %d (job-wide GPU %d, logical device %d of it; "
                        "DTENSOR_EMULATE_CUDA%s)",
                        d->ordinal, d->gpu, d->logical, dt__rt.gpus_shared ? ", shared" : "");
            else if (d->type == DT_DEVICE_CUDA)
                fprintf(
                    f, "GPU ordinal %d (job-wide GPU %d, logical device %d of it%s), f32 gemm %s",
                    d->ordinal, d->gpu, d->logical,
                    dt__rt.gpus_shared ? "; clients share GPUs" : "", d->kx.tf32 ? "TF32" : "FP32");
            else if (d->ordinal >= 0)
                fprintf(f, "worker bound to core %d", d->ordinal);
            else
                fprintf(f, "worker not bound (%d workers share %d cores)",
                        dt__rt.num_devices[t] * dt__rt.clients_on_host, dt__rt.cores);
            fprintf(f, ", %zu bytes in use, peak %zu\n", atomic_load(&d->bytes_current),
                    atomic_load(&d->bytes_peak));
        }
        if (t == DT_DEVICE_CUDA && dt__rt.num_devices[t] == 0)
            fprintf(f, "  no CUDA devices%s\n",
#ifdef DT_HAVE_CUDA
                    ""
#else
                    " (built without CUDA)"
#endif
            );
    }
    return DT_OK;
}

/* ---- client-level calls ------------------------------------------------------------------ */

dt_status dt_barrier(void)
{
    DT__SERIAL();
    DT_TRY(dt__require_init("dt_barrier"));
    return dt__agree(dt__rt.world, DT_OK);
}

static int bytes_fields(const void *ctx, dt__field out[], int max)
{
    const size_t *bytes = ctx;
    if (max < 1)
        return 0;
    dt__field_set(&out[0], "bytes per client", bytes, sizeof *bytes, "%zu", *bytes);
    return 1;
}

dt_status dt_client_allgather(const void *send, size_t bytes, void *recv)
{
    DT__SERIAL();
    DT_TRY(dt__require_init("dt_client_allgather"));
    /* the count is agreed first: a client passing another count (or no buffers) fails every
     * client instead of leaving them in MPI calls that do not match */
    dt_status s = bytes && (!send || !recv) ? dt__fail(DT_ERR_ARG,
                                                       "dt_client_allgather: client %d passed "
                                                       "NULL buffers",
                                                       dt__rt.client)
                                            : DT_OK;
    uint64_t fp = dt__hash(DT__HASH_SEED, &bytes, sizeof bytes);
    DT_TRY(dt__agree_on(&(dt__agreement){.what = "dt_client_allgather",
                                         .fingerprint = fp,
                                         .fields = bytes_fields,
                                         .ctx = &bytes},
                        s));
    if (bytes)
        s = dt__allgather_bytes(dt__rt.world, send, bytes, recv);
    return s;
}

dt_status dt_print_ordered(FILE *f, const char *text)
{
    DT__SERIAL();
    DT_TRY(dt__require_init("dt_print_ordered"));
    /* only client 0 writes, but a NULL FILE is an error on every client alike */
    DT_TRY(dt__agree(dt__rt.world,
                     f ? DT_OK : dt__fail(DT_ERR_ARG, "dt_print_ordered: FILE is NULL")));
    if (!text)
        text = "";
    if (dt__rt.world == MPI_COMM_NULL) {
        fputs(text, f);
        fflush(f);
        return DT_OK;
    }
    int n = dt__rt.num_clients;
    size_t len = strlen(text);
    DT_TRY(dt__agree(dt__rt.world, len > INT_MAX
                                       ? dt__fail(DT_ERR_ARG, "dt_print_ordered: %zu bytes", len)
                                       : DT_OK));
    int mine = (int)len, *lens = malloc(sizeof(int) * (size_t)n),
        *displ = malloc(sizeof(int) * (size_t)n);
    dt_status s = lens && displ ? dt__allgather_bytes(dt__rt.world, &mine, sizeof mine, lens)
                                : dt__fail(DT_ERR_NOMEM, "dt_print_ordered: out of memory");
    int64_t total = 0;
    for (int c = 0; s == DT_OK && c < n; c++) {
        displ[c] = (int)total;
        total += lens[c];
    }
    if (s == DT_OK && total > INT_MAX)
        s = dt__fail(DT_ERR_ARG, "dt_print_ordered: %lld bytes in all", (long long)total);
    char *all = s == DT_OK && dt__rt.client == 0 ? malloc((size_t)total + 1) : NULL;
    if (s == DT_OK && dt__rt.client == 0 && !all)
        s = dt__fail(DT_ERR_NOMEM, "dt_print_ordered: out of memory");
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK) {
        MPI_Request req;
        if (MPI_Igatherv(text, mine, MPI_CHAR, all, lens, displ, MPI_CHAR, 0, dt__rt.world, &req) !=
            MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_print_ordered: MPI_Igatherv failed");
        else
            s = dt__mpi_wait_all(1, &req);
    }
    if (s == DT_OK && dt__rt.client == 0) {
        fwrite(all, 1, (size_t)total, f);
        fflush(f);
    }
    free(all);
    free(lens);
    free(displ);
    return s;
}
