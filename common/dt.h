/* Internal declarations shared by every part of the library (never installed). */
#ifndef DT_INTERNAL_H
#define DT_INTERNAL_H

#include "dtensor.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* ---- errors ------------------------------------------------------------------------------ */

/* Record a formatted message for dt_last_error() and return s. Call once, at the site of the
 * failure; callers only propagate with DT_TRY. */
dt_status dt__fail(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Set the message verbatim (used to re-raise a message received from another client). */
void dt__set_error(const char *msg);

/* "[3,2]" into buf; returns buf. */
char *dt__shape_str(char *buf, size_t size, int rank, const int64_t shape[]);
#define DT__SHAPE_STR_MAX (DT_MAX_RANK * 21 + 3)

/* Overflow-checked product of a shape; -1 on overflow or a negative extent. */
int64_t dt__num_elements(int rank, const int64_t shape[]);

bool dt__dtype_valid(dt_dtype d);

/* ---- integer arithmetic ------------------------------------------------------------------ */

/* Integer sums and products wrap modulo 2^bits, as numpy's do: C leaves signed overflow
 * undefined, so integers go through uint64_t (whose conversion back is modular with gcc).
 * Floating-point operands are untouched. */
#define DT__WRAP(OP, a, b)       \
    _Generic((a), float          \
             : (a)OP(b), double  \
             : (a)OP(b), default \
             : (__typeof__(a))((uint64_t)(a)OP(uint64_t)(b)))
#define DT__ADD(a, b) DT__WRAP(+, a, b)
#define DT__SUB(a, b) DT__WRAP(-, a, b)
#define DT__MUL(a, b) DT__WRAP(*, a, b)
#define DT__NEG(a) DT__SUB((__typeof__(a))0, a)

/* ---- host block copy --------------------------------------------------------------------- */

/* Copy the block `extent` (rank dims) starting at src_off inside a row-major array of
 * src_shape into dst at dst_off inside dst_shape. Innermost contiguous runs use memcpy. */
void dt__copy_block(void *dst, const int64_t dst_shape[], const int64_t dst_off[], const void *src,
                    const int64_t src_shape[], const int64_t src_off[], const int64_t extent[],
                    int rank, size_t elem_size);

/* ---- backends and devices ---------------------------------------------------------------- */

typedef struct dt__device dt__device;

/* ---- local kernels (ops/<backend>): what the expansion engine emits per device ------------ */

/* X(NAME, name): the short list of local kernels every backend implements per dtype. They see
 * only local shapes; global ops never reach a backend. */
#define DT__KERNEL_LIST(X)            \
    X(FILL, fill)                     \
    X(ARANGE, arange)                 \
    X(PHILOX_UNIFORM, philox_uniform) \
    X(PHILOX_NORMAL, philox_normal)   \
    X(UNARY, unary)                   \
    X(BINARY, binary)                 \
    X(REDUCE, reduce)                 \
    X(GEMM, gemm)                     \
    X(TRANSPOSE, transpose)           \
    X(COPY_BLOCKS, copy_blocks)       \
    X(SELECT_FILL, select_fill)

typedef enum dt__kernel {
#define DT__KERNEL_ENUM(NAME, name) DT__K_##NAME,
    DT__KERNEL_LIST(DT__KERNEL_ENUM)
#undef DT__KERNEL_ENUM
        DT__KERNEL_COUNT
} dt__kernel;

const char *dt__kernel_name(dt__kernel k);

/* One block move of COPY_BLOCKS: `extent` at src_off inside a src_shape array that starts
 * src_at elements into the source buffer, to dst_off inside dst_shape at dst_at. */
typedef struct dt__block {
    int rank;
    int64_t src_at, dst_at;
    int64_t src_shape[DT_MAX_RANK], src_off[DT_MAX_RANK];
    int64_t dst_shape[DT_MAX_RANK], dst_off[DT_MAX_RANK];
    int64_t extent[DT_MAX_RANK];
} dt__block;

/* Arguments of one kernel on one device: local shapes only (plus global offsets where an
 * element's value depends on its global index). Built at expansion time, per device. */
typedef struct dt__kargs {
    int rank;                               /* of the output */
    int64_t shape[DT_MAX_RANK];             /* output local shape */
    int64_t offset[DT_MAX_RANK];            /* global index of the output's first element */
    int64_t gshape[DT_MAX_RANK];            /* global output shape */
    int64_t in_shape[2][DT_MAX_RANK];       /* operands, aligned to `rank` (1 = broadcast) */
    int op;                                 /* unary / binary / reduce operator */
    double a, b;                            /* fill value; arange start, step; random
                                               bounds or mean, stddev; reduce scale */
    uint64_t seed, key;                     /* Philox key (seed) and counter high word (op key) */
    unsigned mask;                          /* reduce: local axes reduced */
    int perm[DT_MAX_RANK];                  /* transpose: out axis i = in axis perm[i] */
    int64_t batch, m, n, k;                 /* gemm: batch count and matrix extents */
    int64_t a_batch_stride, b_batch_stride; /* 0 broadcasts an operand over the batch */
    bool ta, tb;                            /* gemm transposes */
    bool select;                            /* select_fill: true copies, false fills with a */
    int nblocks;                            /* copy_blocks */
    dt__block *blocks;
    int64_t out_elems; /* size of the output buffer in elements */
} dt__kargs;

typedef void (*dt__kernel_fn)(const dt__kargs *k, const void *const in[], void *out);

/* What a device backend implements. Device buffers are opaque to everything above ops/.
 * Local kernels are added to the table by the expansion engine's kernel list. */
typedef struct dt__backend {
    const char *name;
    /* Host code may read and write device buffers directly (CPU). */
    bool host_accessible;
    dt_status (*alloc)(dt__device *d, size_t bytes, void **out);
    void (*free)(dt__device *d, void *p);
    dt_status (*to_device)(dt__device *d, void *dst, const void *src, size_t bytes);
    dt_status (*to_host)(dt__device *d, void *dst, const void *src, size_t bytes);
    dt_status (*copy)(dt__device *d, void *dst, const void *src, size_t bytes);
    /* Local kernels by (kernel, dtype); NULL when the backend has none. */
    const dt__kernel_fn (*kernels)[DT_DTYPE_COUNT];
} dt__backend;

/* The CPU backend's (kernel, dtype) table: reference loops, OpenBLAS for gemm. */
extern const dt__kernel_fn dt__cpu_kernels[DT__KERNEL_COUNT][DT_DTYPE_COUNT];

/* Philox4x32-10 (Salmon et al. 2011, Random123): one block of 4 words. */
void dt__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

extern const dt__backend dt__cpu_backend;
#ifdef DT_HAVE_CUDA
extern const dt__backend dt__cuda_backend;
int dt__cuda_device_count(void);
#endif

/* A task run on a device's worker thread: fn(device, index, arg). */
typedef void (*dt__task_fn)(dt__device *d, int index, void *arg);

struct dt__device {
    dt_device_type type;
    int local_index; /* among this client's devices of the type */
    int ordinal;     /* CUDA device ordinal; core index a CPU worker is bound to, or -1 */
    const dt__backend *backend;
    atomic_size_t bytes_current;
    atomic_size_t bytes_peak;

    /* worker thread: runs one posted task at a time */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_bool posted; /* a task waits; read without the lock while the worker spins */
    bool spin;          /* a core per worker: poll briefly before sleeping (wake-up latency) */
    dt__task_fn task;
    void *task_arg;
    int task_index;
    struct dt__join *join;
    bool stop;
    bool started;
};

/* Allocate with accounting (dt_device_memory). Zero bytes gives a valid unique pointer. */
dt_status dt__device_alloc(dt__device *d, size_t bytes, void **out);
void dt__device_free(dt__device *d, void *p, size_t bytes);
/* Test hook: from now on, this process's device allocations of more than `bytes` fail with
 * DT_ERR_NOMEM (SIZE_MAX, the default, turns it off). Simulates one client running out. */
void dt__device_fail_allocs_over(size_t bytes);

/* A device's worker loop (pthread start routine; the runtime binds the thread first). */
void *dt__device_worker(void *device);

/* Run fn(devices[i], i, arg) on each device's worker thread, in parallel, and wait for all. */
void dt__devices_run(dt__device *const devices[], int n, dt__task_fn fn, void *arg);
/* The same, but index 0 runs on the calling thread while the other workers run theirs: for
 * host-memory work that may run on any thread (in-process collectives), it saves a hand-off. */
void dt__devices_run_here(dt__device *const devices[], int n, dt__task_fn fn, void *arg);

/* ---- runtime ----------------------------------------------------------------------------- */

typedef struct dt__runtime {
    bool initialized;
    bool mpi_used;  /* clients are MPI ranks */
    bool mpi_owned; /* dt_init called MPI_Init and dt_finalize ends it */
    MPI_Comm world; /* dup of MPI_COMM_WORLD, MPI_COMM_NULL for a single client without MPI */
    int client;
    int num_clients;
    int cores; /* on this host (hwloc) */
    int clients_on_host;
    dt__device *devices[DT_DEVICE_COUNT];
    int num_devices[DT_DEVICE_COUNT];
    /* per type: devices of each client, and the exclusive prefix sums (first global id) */
    int *client_devices[DT_DEVICE_COUNT];
    int *client_first[DT_DEVICE_COUNT];
    atomic_int live_meshes;
    atomic_int live_tensors;
} dt__runtime;

extern dt__runtime dt__rt;

/* DT_ERR_STATE with the calling function's name unless dt_init has run. */
dt_status dt__require_init(const char *fn);

/* ---- client communication helpers (MPI, nonblocking, yielding wait) ---------------------- */

/* Complete requests with MPI_Test + sched_yield (blocking MPICH calls spin, TOOLCHAIN.md). */
dt_status dt__mpi_wait_all(int n, MPI_Request reqs[]);
/* Every client contributes `bytes` and receives all contributions in client order. With one
 * client it is a copy. Collective over comm. */
dt_status dt__allgather_bytes(MPI_Comm comm, const void *send, size_t bytes, void *recv);
/* Agree on local validation before a collective: every client passes its own status (the
 * message of a failure is taken from dt_last_error()). All return DT_OK, or all return the
 * first failing client's status and message, prefixed with the client. Collective. */
dt_status dt__agree(MPI_Comm comm, dt_status local);

/* ---- mesh -------------------------------------------------------------------------------- */

struct dt_mesh {
    atomic_int refs;
    uint64_t serial; /* unique for the process's lifetime: caches key on it, never on the
                        address, which a later mesh may reuse */
    int num_axes;
    char names[DT_MAX_MESH_AXES][DT_MAX_NAME];
    int sizes[DT_MAX_MESH_AXES];
    int strides[DT_MAX_MESH_AXES]; /* row-major: device id = sum coords[a] * strides[a] */
    int size;
    dt_device_type type;
    int first_local; /* mesh id of this client's first device */
    int num_local;
    int local_base; /* runtime local index of this client's first device of the mesh */
    int num_clients;
    int *client_first;  /* mesh ids: client c owns [client_first[c], client_first[c + 1]) */
    int *global_ids;    /* runtime global device id of each mesh device (strictly increasing) */
    MPI_Comm comm;      /* dup of the runtime's world; MPI_COMM_NULL without MPI */
    dt__device **local; /* this client's devices, by local index */
    /* collectives/: groups and communicators per axis mask, built on first use */
    struct dt__coll_mesh *coll;
    dt_collective_algorithm coll_algorithm; /* dt_mesh_set_collective_algorithm */
};

/* The eager program cache (spmd/graph.c): drop every program built for mesh m (called when
 * the mesh is destroyed, so no cached program outlives a mesh it points to); free it all (at
 * dt_finalize); the number of cached programs (tests). Not collective. */
void dt__program_cache_drop_mesh(const dt_mesh *m);
void dt__program_cache_free(void);
int dt__program_cache_count(void);

/* Free the collectives' per-mesh state (communicators included). Collective. */
void dt__coll_mesh_free(dt_mesh *m);

dt_mesh *dt__mesh_retain(const dt_mesh *m);
/* A mesh over the runtime devices `ids` (strictly increasing global ids; NULL: all of them),
 * without validation or exchange. client_local: a mesh over this client's devices only, where
 * the other clients are taken to own none and no communicator is made (not collective);
 * otherwise the communicator is a dup of the runtime's world (collective). */
dt_status dt__mesh_build(int num_axes, const char *const names[], const int sizes[],
                         dt_device_type type, const int ids[], bool client_local, dt_mesh **out);
/* True when a and b are over the same runtime devices (same type, same global ids). */
bool dt__mesh_same_devices(const dt_mesh *a, const dt_mesh *b);
/* The 1-D mesh "all" over every device of `type`, built on first use (collective then) and
 * kept until dt_finalize (dt__mesh_all_free); not counted as a live mesh. */
dt_status dt__mesh_all(dt_device_type type, dt_mesh **out);
void dt__mesh_all_free(void);
/* Local device objects of the mesh, indexed by local index. */
dt__device *const *dt__mesh_local_devices(const dt_mesh *m);

/* ---- layout ------------------------------------------------------------------------------ */

/* Shard index of tensor axis `axis` on `device` (0 when unsharded). */
int dt__layout_shard_index(const dt_layout *l, int axis, int device);

/* ---- tensor ------------------------------------------------------------------------------ */

struct dt_tensor {
    dt_mesh *mesh; /* retained */
    dt_layout layout;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    int num_local;
    void **data;   /* one device buffer per local device */
    size_t *bytes; /* its size */
    /* Symbolic tensors of a function being traced (spmd/graph.c): no buffers (num_local 0),
     * the graph value they stand for. NULL for a concrete tensor. */
    struct dt_function *trace;
    int trace_value;
};

/* DT_ERR_STATE, naming fn, when t is symbolic (recorded in a function being traced: it has no
 * values until the function runs); DT_OK for a concrete tensor. A pure function of metadata
 * every client shares, so every client fails alike. */
dt_status dt__tensor_require_values(const dt_tensor *t, const char *fn);

/* An empty tensor of the right local sizes (contents undefined). Not collective. */
dt_status dt__tensor_alloc(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                           dt_tensor **out);

#endif /* DT_INTERNAL_H */
