/*
 * dtensor: sharded tensor programs written against global tensors.
 *
 * A worked example (the "sharded tensor" part of the DTensor guide). Run it as one process
 * with 6 local CPU devices, or as `mpiexec.mpich -n 2` clients with 3 devices each:
 *
 *     dt_init_options opts = {.cpu_devices = 6};   // per client; 0 reads DTENSOR_CPU_DEVICES
 *     DT_TRY(dt_init(&opts));                       // Collective: brings up MPI if launched
 *
 *     dt_mesh *mesh = NULL;                         // 3x2 mesh over all 6 devices
 *     DT_TRY(dt_mesh_create_from_string("x=3,y=2", DT_DEVICE_CPU, &mesh));
 *
 *     dt_layout layout;                             // rows split over x, columns over y
 *     DT_TRY(dt_layout_parse(mesh, "x,y", &layout));
 *
 *     const float host[6] = {1, 2, 3, 4, 5, 6};     // global 3x2 tensor, every client passes it
 *     const int64_t shape[2] = {3, 2};
 *     dt_tensor *t = NULL;
 *     DT_TRY(dt_tensor_from_host(&layout, DT_DTYPE_F32, 2, shape, host, sizeof host, &t));
 *
 *     for (int i = 0; i < dt_mesh_num_local_devices(mesh); i++) {
 *         float component[6];                       // device i holds a 1x1 block
 *         DT_TRY(dt_tensor_unpack(t, i, component, sizeof component));
 *     }
 *     dt_tensor_free(t);
 *     dt_mesh_free(mesh);
 *     dt_finalize();                                // Collective
 *
 * Rules every function follows:
 * - A fallible call returns a dt_status; DT_OK is 0. On failure dt_last_error() holds a
 *   message naming the values involved (per thread, valid until the next failing call on that
 *   thread), out-parameters are set to NULL (or left zeroed for value types), and every object
 *   the call touched is left as it was.
 * - Arguments are borrowed, never adopted. `*_create` pairs with `*_free`; freeing NULL is a
 *   no-op.
 * - Functions marked **Collective** must be called by every client, in the same order, with
 *   the same metadata (mesh, shapes, layouts, dtypes). Validation of that metadata ends
 *   before the first message is sent, so every client fails the same way and none hangs.
 *   Functions not so marked touch only this client.
 * - Nothing aborts on user input.
 *
 * Threads. Any thread of a client may call any function. Calls that communicate, run work on
 * devices or change shared state (every op, function run, tensor creation, read, pack, unpack
 * and free, mesh and variable creation and free, every strategy, model, optimizer,
 * checkpoint, parameter-server and cluster call, dt_init, dt_finalize, dt_barrier) take one
 * lock of the runtime for their whole duration: they run one after another, each whole,
 * never interleaved and never deadlocked (a call made from inside another on the same thread,
 * such as ops in a strategy's step, takes the lock again). These run concurrently, taking
 * no lock: layout functions, getters of meshes, tensors, models and strategies (their
 * objects do not change after creation), names, dtype helpers and dt_last_error. Collective
 * calls keep one order on every client, as MPI and NCCL require: when several threads of a
 * client make them, the program must order them alike on every client (for instance one
 * thread makes every collective call, the others compute on client-local meshes); clients
 * that differ fail with DT_ERR_MISMATCH rather than hang. Callbacks: a strategy's step runs
 * under the lock (it may call the API; it must not wait for another thread that does);
 * a wrapped tensor's release function and a parameter-server step run without it (they may
 * take locks of their own that a thread waiting for the API lock holds). Freeing or changing
 * an object while another thread uses it remains the caller's error.
 */
#ifndef DTENSOR_H
#define DTENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Status                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* X(name, description): the one list of status codes. */
#define DT_STATUS_LIST(X)               \
    X(OK, "ok")                         \
    X(ERR_ARG, "invalid argument")      \
    X(ERR_SHAPE, "shape mismatch")      \
    X(ERR_DTYPE, "dtype mismatch")      \
    X(ERR_LAYOUT, "invalid layout")     \
    X(ERR_MESH, "invalid mesh")         \
    X(ERR_MISMATCH, "clients disagree") \
    X(ERR_NOMEM, "out of memory")       \
    X(ERR_DEVICE, "device error")       \
    X(ERR_COMM, "communication error")  \
    X(ERR_STATE, "wrong runtime state") \
    X(ERR_UNSUPPORTED, "unsupported")   \
    X(ERR_IO, "input/output error")

typedef enum dt_status {
#define DT__STATUS_ENUM(name, desc) DT_##name,
    DT_STATUS_LIST(DT__STATUS_ENUM)
#undef DT__STATUS_ENUM
        DT_STATUS_COUNT
} dt_status;

/* "DT_ERR_SHAPE" for DT_ERR_SHAPE; "DT_UNKNOWN_STATUS" for a value outside the list. */
const char *dt_status_name(dt_status s);
/* "shape mismatch" for DT_ERR_SHAPE. */
const char *dt_status_string(dt_status s);
/* The message of the last failing call on this thread; "" when none failed yet. */
const char *dt_last_error(void);

/* The library's version, "0.1.0" (written into every checkpoint). */
const char *dt_version(void);

/* Propagate a failure from a dt_status expression to the caller. */
#define DT_TRY(expr)                       \
    do {                                   \
        dt_status dt__try_status = (expr); \
        if (dt__try_status != DT_OK)       \
            return dt__try_status;         \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Data types and reductions                                                                */
/* ---------------------------------------------------------------------------------------- */

/* X(NAME, name, C storage type). bf16 (bfloat16) and f16 (IEEE binary16) are stored as
 * their 16 bits: kernels compute in f32 and round to nearest even on store (dt_f32_to_bf16,
 * dt_f32_to_f16), GEMMs and reductions accumulate in f32, random numbers are the f32 stream
 * rounded. bool is one byte, 0 or 1. */
#define DT_DTYPE_LIST(X)    \
    X(F32, f32, float)      \
    X(F64, f64, double)     \
    X(I32, i32, int32_t)    \
    X(I64, i64, int64_t)    \
    X(BF16, bf16, uint16_t) \
    X(F16, f16, uint16_t)   \
    X(BOOL, bool, uint8_t)  \
    X(U8, u8, uint8_t)      \
    X(I8, i8, int8_t)

typedef enum dt_dtype {
#define DT__DTYPE_ENUM(NAME, name, ctype) DT_DTYPE_##NAME,
    DT_DTYPE_LIST(DT__DTYPE_ENUM)
#undef DT__DTYPE_ENUM
        DT_DTYPE_COUNT
} dt_dtype;

/* Bytes per element; 0 for a value outside the list. */
size_t dt_dtype_size(dt_dtype d);
/* "f32"; "?" for a value outside the list. */
const char *dt_dtype_name(dt_dtype d);
/* Kinds: floating (f32, f64, bf16, f16), integer (i32, i64, u8, i8), bool; 0 for a value
 * outside the list. */
int dt_dtype_is_floating(dt_dtype d);
int dt_dtype_is_integer(dt_dtype d);
/* The dtype mixed operands are computed in, as PyTorch promotes: a floating type over an
 * integer or bool one, an integer type over bool; within a kind the wider type (bf16 with f16
 * gives f32, u8 with i8 gives i32). Binary ops and where cast both operands to it. Returns
 * DT_DTYPE_COUNT when either is outside the list. */
dt_dtype dt_dtype_promote(dt_dtype a, dt_dtype b);
/* The 16-bit float conversions every backend uses: round to nearest even, NaN kept quiet,
 * overflow to infinity, f16 subnormals exact. From double: rounded once (no double rounding
 * through f32). */
uint16_t dt_f32_to_bf16(float x);
float dt_bf16_to_f32(uint16_t x);
uint16_t dt_f32_to_f16(float x);
float dt_f16_to_f32(uint16_t x);
uint16_t dt_f64_to_bf16(double x);
uint16_t dt_f64_to_f16(double x);

/* X(NAME, name): reduction operators of collectives, reductions and partial layouts. */
#define DT_REDUCE_LIST(X) \
    X(SUM, sum)           \
    X(MEAN, mean)         \
    X(MAX, max)           \
    X(MIN, min)           \
    X(PROD, prod)

typedef enum dt_reduce_op {
#define DT__REDUCE_ENUM(NAME, name) DT_REDUCE_##NAME,
    DT_REDUCE_LIST(DT__REDUCE_ENUM)
#undef DT__REDUCE_ENUM
        DT_REDUCE_COUNT
} dt_reduce_op;

const char *dt_reduce_op_name(dt_reduce_op op);

/* X(NAME, name): how collectives are carried out, after tf.distribute's cross_device_ops.
 * AUTO chooses by size and topology. */
#define DT_ALGORITHM_LIST(X)                \
    X(AUTO, auto)                           \
    X(RING, ring)                           \
    X(NCCL, nccl)                           \
    X(HIERARCHICAL_COPY, hierarchical_copy) \
    X(REDUCTION_TO_ONE_DEVICE, reduction_to_one_device)

typedef enum dt_collective_algorithm {
#define DT__ALGORITHM_ENUM(NAME, name) DT_ALGORITHM_##NAME,
    DT_ALGORITHM_LIST(DT__ALGORITHM_ENUM)
#undef DT__ALGORITHM_ENUM
        DT_ALGORITHM_COUNT
} dt_collective_algorithm;

/* ---------------------------------------------------------------------------------------- */
/* Runtime: clients and devices                                                             */
/* ---------------------------------------------------------------------------------------- */

typedef enum dt_device_type { DT_DEVICE_CPU, DT_DEVICE_CUDA, DT_DEVICE_COUNT } dt_device_type;

const char *dt_device_type_name(dt_device_type t); /* "CPU", "CUDA" */

typedef struct dt_init_options {
    /* Local CPU devices of this client. 0: the value of DTENSOR_CPU_DEVICES, else 1.
     * Clients may differ; each client owns a contiguous block of the global device list. */
    int cpu_devices;
    /* Pin each CPU device's worker thread to a core with hwloc: -1 (0 in a zeroed struct
     * means the same) binds only when every worker of every client on this host gets a core
     * of its own; 1 requires it (error otherwise); 2 never binds. */
    int bind;
    /* Logical CUDA devices per physical GPU (as TensorFlow's logical GPU configuration): each
     * has its own stream and memory accounting, so a mesh of several GPU devices runs on one
     * GPU. 0: the value of DTENSOR_CUDA_DEVICES, else 1. Ignored without GPUs, unless
     * DTENSOR_EMULATE_CUDA=N (a testing aid, where no GPU is visible) gives each client N
     * GPUs emulated on the host: the CPU's kernels on host memory under a GPU's rules. */
    int cuda_logical_devices;
    /* f32 matrix products on CUDA devices: 1 lets cuBLAS use TF32 tensor cores (10-bit
     * mantissa inputs, faster), 2 keeps exact FP32; 0: TF32 when DTENSOR_ALLOW_TF32=1, else
     * exact FP32 (the default, as in PyTorch's matmul). The program printer names the math. */
    int allow_tf32;
    /* Seconds a wait for other clients may last before it gives up with DT_ERR_COMM (a client
     * died or is stuck elsewhere). 0: the value of DTENSOR_TIMEOUT, else 600 (as PyTorch's
     * gloo default). After such an error the collective is left pending (MPI cannot cancel
     * it): report and stop; the runtime cannot be used further. */
    int timeout_seconds;
} dt_init_options;

/* Start the runtime. opts may be NULL for defaults. Under a launcher (`mpiexec.mpich -n N`,
 * detected from its environment) or when the caller already initialized MPI, each MPI rank
 * becomes one client; otherwise the process is the only client and MPI is never started.
 * CUDA GPUs are discovered when the library was built with CUDA; none is not an error.
 * Collective. Returns DT_ERR_STATE if already initialized. */
dt_status dt_init(const dt_init_options *opts);

/* Stop worker threads, free devices, and finalize MPI if dt_init started it. Every mesh and
 * tensor must have been freed first, on every client: if any client still holds one, every
 * client returns DT_ERR_STATE naming that client and its counts, and nothing is stopped (the
 * runtime stays usable). When the clients span hosts, it ends with one byte between every
 * two clients and 50 ms without MPI, so that MPI_Finalize (its own, or the caller's right
 * after it) does not hang in MPICH 4.0's TCP transport (README "Running on several hosts");
 * a caller's MPI call between the two can make it hang. Collective. */
dt_status dt_finalize(void);

int dt_is_initialized(void);
int dt_client_id(void);   /* this client's index, 0 when not initialized */
int dt_num_clients(void); /* 1 when not initialized or single-client */

/* Local devices of one type on this client (0 when not initialized). */
int dt_num_local_devices(dt_device_type type);
/* Devices of one type over all clients. */
int dt_num_global_devices(dt_device_type type);
/* Global id of this client's local device (clients own contiguous blocks, client 0's first);
 * -1 when out of range. */
int dt_global_device_id(dt_device_type type, int local_index);

/* Bytes currently allocated and the peak since dt_init (or dt_device_memory_reset_peak) on one
 * local device. */
dt_status dt_device_memory(dt_device_type type, int local_index, size_t *current, size_t *peak);

/* Memory of one local device, as its caching allocator sees it. Freed buffers stay reserved
 * in per-size free lists (as PyTorch's caching allocator), so steady-state ops take nothing
 * from the system (cudaMalloc, or fresh pages that fault on first touch). */
typedef struct dt_memory_stats {
    size_t in_use;          /* bytes of live buffers, as asked for */
    size_t peak;            /* the most in_use since dt_init or dt_device_memory_reset_peak */
    size_t reserved;        /* held from the system: live buffers (rounded up) plus cached */
    size_t cached;          /* free blocks kept for reuse */
    uint64_t system_allocs; /* blocks taken from the system since dt_init */
} dt_memory_stats;
dt_status dt_device_memory_stats(dt_device_type type, int local_index, dt_memory_stats *out);

/* Start a new peak: the device's `peak` becomes its current `in_use` (local_index -1: every
 * local device of the type), so that a later dt_device_memory_stats gives the most one piece
 * of work held above what was live before it (as torch.cuda.reset_peak_memory_stats). Not
 * collective. */
dt_status dt_device_memory_reset_peak(dt_device_type type, int local_index);

/* Hand the cached free blocks of one local device (local_index -1: of every local device of
 * the type) back to the system. Live buffers are untouched. Not collective. */
dt_status dt_device_release_cache(dt_device_type type, int local_index);

/* Print host topology (cores, NUMA nodes, hwloc binding) and every local device. Only this
 * client prints. */
dt_status dt_devices_print(FILE *f);

/* Wait until every client has called it. Collective. */
dt_status dt_barrier(void);

/* Every client contributes `bytes` bytes from `send`; `recv` (dt_num_clients() * bytes) gets
 * every contribution in client order, on every client. For agreeing on metadata that only
 * some clients know before a collective (e.g. the global shape of per-device components).
 * Every client must pass the same `bytes`: the counts are compared first, and a difference
 * (or NULL buffers with bytes > 0 on some client) is DT_ERR_MISMATCH (DT_ERR_ARG) on every
 * client, naming the clients and counts. Collective. */
dt_status dt_client_allgather(const void *send, size_t bytes, void *recv);

/* Client 0 writes every client's `text` to f, in client order (the others write nothing), so
 * output is the same for any number of clients. Collective. */
dt_status dt_print_ordered(FILE *f, const char *text);

/* ---------------------------------------------------------------------------------------- */
/* Mesh                                                                                     */
/* ---------------------------------------------------------------------------------------- */

#define DT_MAX_MESH_AXES 8
#define DT_MAX_NAME 32    /* axis names: [A-Za-z_][A-Za-z0-9_]*, shorter than this */
#define DT_MAX_RANK 8     /* tensor rank */
#define DT_STRING_MAX 512 /* enough for any mesh or layout text form */

typedef struct dt_mesh dt_mesh;

/* Create a mesh of named axes over every device of `type` of every client, in row-major
 * order (the last axis varies fastest). The product of sizes must equal the global device
 * count. Every client must describe the same mesh: names, sizes and type are exchanged and
 * a difference is DT_ERR_MISMATCH on every client, naming both descriptions. Each mesh gets
 * its own communicator. Collective. */
dt_status dt_mesh_create(int num_axes, const char *const names[], const int sizes[],
                         dt_device_type type, dt_mesh **out);
/* A mesh over a subset of the devices of `type`: device_ids lists num_devices global device
 * ids (0 .. dt_num_global_devices - 1), one per mesh device in row-major order. The list must
 * be strictly increasing, so that each client's devices of the mesh are one contiguous block
 * of mesh ids (DT_ERR_MESH otherwise, naming the offending id). Clients may own none of the
 * mesh's devices: they still call every collective function on the mesh and its tensors (they
 * take part in the agreement and hold no components). Names, sizes, type and the id list are
 * exchanged as for dt_mesh_create (DT_ERR_MISMATCH on every client when they differ).
 * Collective over every client of the runtime. */
dt_status dt_mesh_create_on_devices(int num_axes, const char *const names[], const int sizes[],
                                    dt_device_type type, int num_devices, const int device_ids[],
                                    dt_mesh **out);
/* A mesh over this client's own devices first_local .. first_local + size - 1 (local indices),
 * e.g. one replica's device: the other clients take no part in it, so its ops and collectives
 * involve this client alone, and a client may run them while the others do something else.
 * Names and sizes are checked as for dt_mesh_create. Not collective. */
dt_status dt_mesh_create_local(int num_axes, const char *const names[], const int sizes[],
                               dt_device_type type, int first_local, dt_mesh **out);
/* Same as dt_mesh_create, from "x=3,y=2". Collective. */
dt_status dt_mesh_create_from_string(const char *spec, dt_device_type type, dt_mesh **out);
/* Release the caller's reference; tensors keep the mesh alive until they are freed.
 * Collective when it releases the last reference (it frees the communicator). */
void dt_mesh_free(dt_mesh *m);

int dt_mesh_num_axes(const dt_mesh *m);
int dt_mesh_size(const dt_mesh *m); /* number of devices */
dt_device_type dt_mesh_device_type(const dt_mesh *m);
const char *dt_mesh_axis_name(const dt_mesh *m, int axis);  /* NULL when out of range */
int dt_mesh_axis_size(const dt_mesh *m, int axis);          /* 0 when out of range */
int dt_mesh_axis_index(const dt_mesh *m, const char *name); /* -1 when unknown */
int dt_mesh_num_local_devices(const dt_mesh *m);
/* Mesh id (row-major index in the mesh) of this client's i-th device of the mesh; -1 when
 * out of range. On a mesh over every device it is also the device's global id. */
int dt_mesh_local_device_id(const dt_mesh *m, int i);
/* The CUDA stream (a cudaStream_t) on which the work of this client's i-th device of the mesh
 * is ordered, for another library to order its own work against it (DLPack's `stream`): NULL
 * for CPU devices and GPUs emulated on the host, or when i is out of range. */
void *dt_mesh_local_stream(const dt_mesh *m, int i);
/* Runtime global device id (devices of the mesh's type over all clients, client 0's first) of
 * the mesh's device `mesh_id`; -1 when out of range. */
int dt_mesh_global_device_id(const dt_mesh *m, int mesh_id);
/* Coordinates of a global device, one per mesh axis. */
dt_status dt_mesh_device_coords(const dt_mesh *m, int device, int coords[]);
/* Global device id at coordinates. */
dt_status dt_mesh_device_at(const dt_mesh *m, const int coords[], int *device);
/* The client that owns a global device. */
dt_status dt_mesh_device_client(const dt_mesh *m, int device, int *client);
/* "<Mesh x=3,y=2 CPU:6>"; snprintf's contract (returns the full length). */
int dt_mesh_format(const dt_mesh *m, char *buf, size_t size);

/* ---------------------------------------------------------------------------------------- */
/* Layout                                                                                   */
/* ---------------------------------------------------------------------------------------- */

#define DT_UNSHARDED (-1)
#define DT_UNSHARDED_NAME "unsharded"

/* How a tensor of rank `rank` lies on a mesh: a value type, valid while its mesh lives.
 * axes[i] is the mesh axis splitting tensor axis i, or DT_UNSHARDED. Mesh axes named nowhere
 * replicate the tensor, except those in `partial`: a bit mask of mesh axes over which the
 * components hold pending terms of a reduction `partial_op` (the global value is the
 * reduction over those axes). Text form: "x,unsharded", with partial axes as
 * "x,unsharded;partial_sum=y" or "...;partial_max=y+z". Shards may be uneven: an axis of n
 * over s shards gives the first n mod s shards one extra element; a shard may be empty. */
typedef struct dt_layout {
    const dt_mesh *mesh;
    int rank;
    int axes[DT_MAX_RANK];
    unsigned partial;
    dt_reduce_op partial_op;
} dt_layout;

/* specs[i]: a mesh axis name or "unsharded". */
dt_status dt_layout_create(const dt_mesh *m, int rank, const char *const specs[], dt_layout *out);
dt_status dt_layout_parse(const dt_mesh *m, const char *text, dt_layout *out);
dt_status dt_layout_replicated(const dt_mesh *m, int rank, dt_layout *out);
/* Tensor axis 0 on mesh axis `axis`, the rest unsharded. */
dt_status dt_layout_batch_sharded(const dt_mesh *m, const char *axis, int rank, dt_layout *out);
/* The last tensor axis on mesh axis `axis`, the rest unsharded. */
dt_status dt_layout_inner_sharded(const dt_mesh *m, const char *axis, int rank, dt_layout *out);
/* Check a layout built by hand: mesh, rank, axis indices, an axis used twice, a partial axis
 * that also shards. */
dt_status dt_layout_check(const dt_layout *l);
dt_status dt_layout_to_string(const dt_layout *l, char *buf, size_t size);
/* 1 when same mesh, rank, axes and partial state. */
int dt_layout_equal(const dt_layout *a, const dt_layout *b);
int dt_layout_is_replicated(const dt_layout *l); /* no sharded and no partial axis */
/* Number of shards of tensor axis `axis` (1 when unsharded). */
int dt_layout_num_shards(const dt_layout *l, int axis);
/* The shard of a global device: local shape and the global offset of its first element. */
dt_status dt_layout_local_shape(const dt_layout *l, const int64_t global_shape[], int device,
                                int64_t local_shape[], int64_t offset[]);
/* The balanced split of n over s shards: size and offset of shard i. Pure arithmetic. */
int64_t dt_shard_size(int64_t n, int s, int i);
int64_t dt_shard_offset(int64_t n, int s, int i);

/* ---------------------------------------------------------------------------------------- */
/* DTensor                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct dt_tensor dt_tensor;

/* Build from a full host array (row-major, `bytes` long) that every client passes: each
 * local device keeps its slice. A partial layout is refused (a full array is not a set of
 * pending terms). Every client calls it with the same metadata; no communication. */
dt_status dt_tensor_from_host(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                              const void *host, size_t bytes, dt_tensor **out);

/* Build from one component per local device, in local device order: components[i] is a
 * row-major host array of component_shapes[i], which must be the local shape the layout gives
 * that device. Every client calls it with the same metadata; no communication. */
dt_status dt_tensor_pack(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                         int num_components, const void *const components[],
                         const int64_t *const component_shapes[], dt_tensor **out);

/* Zero-copy access to components, as DLPack needs (bindings/python: __dlpack__,
 * dtensor.from_dlpack). A component is one contiguous row-major buffer of its local shape. */
typedef struct dt_local_buffer {
    void *data; /* device memory: host memory for CPU devices, a CUDA pointer for GPUs */
    size_t bytes;
    dt_device_type type;
    int device_ordinal; /* CUDA: the physical GPU's ordinal (cudaSetDevice); CPU: 0 */
} dt_local_buffer;

/* Local device i's component buffer, borrowed: valid while t lives, and never to be written
 * (tensors are values: other tensors may share nothing with it, but ops read it). On GPU
 * devices call dt_tensor_wait first so that its values are computed. Not collective. */
dt_status dt_tensor_local_buffer(const dt_tensor *t, int i, dt_local_buffer *out);

typedef void (*dt_release_fn)(void *ctx);

/* A tensor whose local components are the caller's buffers, without a copy: buffers[i] holds
 * local device i's component (row-major, its local shape's bytes at least bytes[i], memory of
 * that device: host memory for CPU devices, that GPU's memory for CUDA ones). The buffers
 * must stay valid and unchanged until release(ctx) (may be NULL) is called, once, when the
 * tensor is freed. Every client calls it with the same metadata; no communication. On error
 * nothing is taken: release is not called and the caller still owns the buffers. */
dt_status dt_tensor_wrap(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                         int num_buffers, void *const buffers[], const size_t bytes[],
                         dt_release_fn release, void *ctx, dt_tensor **out);

/* Copy local device i's component to host memory of `bytes` (at least its size). */
dt_status dt_tensor_unpack(const dt_tensor *t, int i, void *dst, size_t bytes);

/* The full global array, gathered from all clients into every client's dst (`bytes` at least
 * the global size; pending partial sums are reduced). The only call that materialises a
 * global tensor. Collective. */
dt_status dt_tensor_read(const dt_tensor *t, void *dst, size_t bytes);

/* Wait until the values of t's local components are computed. Ops on GPU devices return once
 * their kernels are queued (reads, unpacks and host exchanges wait by themselves); this is
 * for timing and for handing components to other libraries. Reports a failure of the queued
 * work as DT_ERR_DEVICE naming the device. A no-op on CPU devices. Not collective. */
dt_status dt_tensor_wait(const dt_tensor *t);

void dt_tensor_free(dt_tensor *t);

const dt_layout *dt_tensor_layout(const dt_tensor *t);
const dt_mesh *dt_tensor_mesh(const dt_tensor *t);
dt_dtype dt_tensor_dtype(const dt_tensor *t);
int dt_tensor_rank(const dt_tensor *t);
const int64_t *dt_tensor_shape(const dt_tensor *t); /* rank entries */
int64_t dt_tensor_num_elements(const dt_tensor *t); /* global */
/* Local shape of local device i's component. */
dt_status dt_tensor_local_shape(const dt_tensor *t, int i, int64_t local_shape[]);
/* 1 for a symbolic tensor (recorded in a function being traced, or an output of one), which
 * holds no values on any client; 0 for a tensor with values (even one with no component on
 * this client, whose mesh holds none of its devices) and for NULL. Not collective. */
int dt_tensor_is_symbolic(const dt_tensor *t);

/* ======================================================================================== */
/* Ops, functions (tracing), programs, variables: the SPMD expansion engine (spmd/)         */
/* ======================================================================================== */

/* ---------------------------------------------------------------------------------------- */
/* Ops                                                                                      */
/* ---------------------------------------------------------------------------------------- */
/*
 * Every op takes global tensors and returns a global tensor; the engine picks the layouts of
 * the intermediate pieces, emits local kernels on each device's shard and the collectives
 * that keep the result right, and caches the expanded program by (op, attributes, shapes,
 * dtypes, layouts), so a repeated eager call only dispatches.
 *
 * Contract of every op below:
 * - Collective: every client calls it, in the same order, with the same metadata.
 * - Returns a dt_status; the result comes through the trailing out-parameter, set to NULL on
 *   failure. Validation (shapes, dtypes, a layout on another mesh, an unknown axis, a reshape
 *   the layout cannot express) depends only on metadata every client shares and ends before
 *   the first collective, so every client fails alike with the same message and none hangs.
 * - Clients that do not agree fail alike too: on a mesh spanning clients, every client brings
 *   its verdict and a fingerprint of the op it runs (operator, attributes, operands' dtypes,
 *   shapes and layouts, the requested layout, the meshes by content) to one small all-reduce
 *   before the first collective. A client whose call fails (a bad shape, a NULL operand or
 *   out-pointer, a function input or variable value that does not fit) fails every client,
 *   which name it; clients running different ops all get DT_ERR_MISMATCH naming both. Then
 *   the next op runs normally. (A client that skips an op altogether still leaves the others
 *   waiting in it: nothing is there to agree with.)
 * - opts may be NULL. opts->layout is the requested layout of the result, a hard constraint
 *   (as dtensor.call_with_layout): the result has exactly that layout, which may be partial
 *   ("x,unsharded;partial_sum=y"). Without it the engine picks the cheapest valid expansion
 *   by an alpha-beta cost model and returns a non-partial layout. Creation ops (fill,
 *   arange, random) need it: it names the mesh.
 * - opts->program, when non-NULL, receives the expanded program as text before it runs (this
 *   client only; the program is the same on every client).
 * - Inside dt_function_begin/end the calls record symbolic tensors instead (see Functions).
 */

typedef struct dt_op_options {
    const dt_layout *layout; /* requested layout of the result, or NULL */
    int transpose_a;         /* matmul: use the transpose of a's last two axes */
    int transpose_b;         /* matmul: likewise for b */
    FILE *program;           /* print the expanded program here before running it */
    /* Inside a function: its gradient recomputes this result from the operands where the
     * backward pass reads it, instead of keeping it from the forward pass (activation
     * recomputation: e.g. an all-gather of a sequence-sharded activation, cheap to repeat and
     * costly to hold, as Megatron-LM's sequence parallelism does). Ignored outside functions. */
    int recompute;
} dt_op_options;

/* X(NAME, name): elementwise unary operators. NEG, ABS, RELU and SQUARE are exact on every
 * numeric dtype (integers wrap); the others are floating-point functions, computed in double
 * and rounded once to the element's dtype (integers convert the result as a cast does).
 * GELU is x * Phi(x) with the normal distribution's Phi = (1 + erf(x / sqrt 2)) / 2;
 * GELU_TANH the tanh approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)));
 * SILU x * sigmoid(x); RSQRT 1 / sqrt(x). LOGICAL_NOT takes and gives bool (the only unary
 * op on bool). */
#define DT_UNARY_LIST(X)    \
    X(NEG, neg)             \
    X(ABS, abs)             \
    X(EXP, exp)             \
    X(LOG, log)             \
    X(SQRT, sqrt)           \
    X(RELU, relu)           \
    X(TANH, tanh)           \
    X(SIGMOID, sigmoid)     \
    X(SQUARE, square)       \
    X(SIN, sin)             \
    X(COS, cos)             \
    X(ERF, erf)             \
    X(GELU, gelu)           \
    X(GELU_TANH, gelu_tanh) \
    X(SILU, silu)           \
    X(RSQRT, rsqrt)         \
    X(LOGICAL_NOT, logical_not)

typedef enum dt_unary_op {
#define DT__UNARY_ENUM(NAME, name) DT_UNARY_##NAME,
    DT_UNARY_LIST(DT__UNARY_ENUM)
#undef DT__UNARY_ENUM
        DT_UNARY_COUNT
} dt_unary_op;

/* X(NAME, name): elementwise binary operators. Comparisons (EQ ... GE) give bool; the logical
 * ops take and give bool; the others give the operands' dtype. Integer DIV truncates; FLOORDIV and
 * FLOORMOD round towards minus infinity as numpy's floor_divide and mod (and tf.math.floordiv /
 * floormod) do, for every dtype, so that a == floordiv(a, b) * b + floormod(a, b); an integer
 * divisor of 0 gives 0. */
#define DT_BINARY_LIST(X)       \
    X(ADD, add)                 \
    X(SUB, sub)                 \
    X(MUL, mul)                 \
    X(DIV, div)                 \
    X(MAX, maximum)             \
    X(MIN, minimum)             \
    X(POW, pow)                 \
    X(EQ, equal)                \
    X(NE, not_equal)            \
    X(LT, less)                 \
    X(LE, less_equal)           \
    X(GT, greater)              \
    X(GE, greater_equal)        \
    X(FLOORDIV, floordiv)       \
    X(FLOORMOD, floormod)       \
    X(LOGICAL_AND, logical_and) \
    X(LOGICAL_OR, logical_or)   \
    X(LOGICAL_XOR, logical_xor)

typedef enum dt_binary_op {
#define DT__BINARY_ENUM(NAME, name) DT_BINARY_##NAME,
    DT_BINARY_LIST(DT__BINARY_ENUM)
#undef DT__BINARY_ENUM
        DT_BINARY_COUNT
} dt_binary_op;

const char *dt_unary_op_name(dt_unary_op op);
const char *dt_binary_op_name(dt_binary_op op);

/* Creation ops: a tensor of `shape` in opts->layout (required). */
dt_status dt_fill(dt_dtype dtype, int rank, const int64_t shape[], double value,
                  const dt_op_options *opts, dt_tensor **out);
dt_status dt_ones(dt_dtype dtype, int rank, const int64_t shape[], const dt_op_options *opts,
                  dt_tensor **out);
dt_status dt_zeros(dt_dtype dtype, int rank, const int64_t shape[], const dt_op_options *opts,
                   dt_tensor **out);
/* Rank 1: element i = start + i * step, n elements. */
dt_status dt_arange(dt_dtype dtype, int64_t n, double start, double step, const dt_op_options *opts,
                    dt_tensor **out);

/* Stateless random numbers (f32, f64): element i of the global tensor is a function of
 * (seed, key, i) alone through Philox4x32-10, so the global tensor is bitwise the same for
 * every layout, mesh, uneven split and client count. Uniform in [low, high); normal with
 * `mean` and `stddev` (Box-Muller). */
dt_status dt_random_uniform(dt_dtype dtype, int rank, const int64_t shape[], uint64_t seed,
                            uint64_t key, double low, double high, const dt_op_options *opts,
                            dt_tensor **out);
dt_status dt_random_normal(dt_dtype dtype, int rank, const int64_t shape[], uint64_t seed,
                           uint64_t key, double mean, double stddev, const dt_op_options *opts,
                           dt_tensor **out);

/* C[..., m, n] = A[..., m, k] B[..., k, n] (after opts->transpose_a / transpose_b). Leading
 * batch axes must be equal, or b has rank 2 and is shared by every batch. A sharded
 * contracting axis gives a partial product, resolved by an all-reduce, or a reduce-scatter
 * when the requested layout shards the result, or kept when it is partial. */
dt_status dt_matmul(const dt_tensor *a, const dt_tensor *b, const dt_op_options *opts,
                    dt_tensor **out);

/* Elementwise; binary ops broadcast as numpy does. Operands share a mesh; operands of two
 * dtypes are both converted to dt_dtype_promote's (as PyTorch does; a cast step each).
 * Arithmetic takes numeric dtypes (cast bool first), comparisons any dtype (the result is
 * bool), the logical ops bool. */
dt_status dt_unary(dt_unary_op op, const dt_tensor *x, const dt_op_options *opts, dt_tensor **out);
dt_status dt_binary(dt_binary_op op, const dt_tensor *a, const dt_tensor *b,
                    const dt_op_options *opts, dt_tensor **out);

/* tf.cast: each element converted to `dtype`: floats to integers toward zero (out of range and
 * NaN as x86 converts: the most negative i32 or i64; u8 and i8 through i32, wrapping), to bool
 * as x != 0, bool to 1 or 0, between floats and to the 16-bit floats rounded to nearest even
 * once. Layout kept. */
dt_status dt_cast(const dt_tensor *x, dt_dtype dtype, const dt_op_options *opts, dt_tensor **out);
/* tf.where(cond, x, y): x where cond (bool) is true, else y; the three broadcast as numpy does,
 * x and y are promoted to one dtype (dt_dtype_promote). */
dt_status dt_where(const dt_tensor *cond, const dt_tensor *x, const dt_tensor *y,
                   const dt_op_options *opts, dt_tensor **out);

/* op: DT_REDUCE_SUM, MEAN, MAX, MIN or PROD over `num_axes` axes (negative counts from the end;
 * num_axes 0 reduces every axis). Correct on uneven and empty shards (a shard's empty product is
 * 1); sums and products of integers wrap. */
dt_status dt_reduce(dt_reduce_op op, const dt_tensor *x, int num_axes, const int axes[],
                    int keepdims, const dt_op_options *opts, dt_tensor **out);

/* Row-wise ops: softmax, normalization, arg reductions and running sums, along any axis,
 * sharded or not. A sharded axis costs collectives of the small per-row statistics only (the
 * [..., 1, ...] tensors), never a gather of x. */

/* tf.nn.softmax and tf.nn.log_softmax along `axis` (negative counts from the end) of a floating
 * x: exp(x - m) / sum exp(x - m) and x - m - log sum exp(x - m), m the maximum along the axis
 * (where finite, else 0). When the axis is sharded, each device reduces its shard and one
 * all-reduce MAX then one all-reduce SUM of the [..., 1, ...] statistics cross its mesh axis.
 * A partial x is summed first. The result keeps x's layout. The 16-bit floats compute in f32
 * and round once. */
dt_status dt_softmax(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out);
dt_status dt_log_softmax(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out);
/* tf.math.reduce_logsumexp: log sum exp(x) over `num_axes` axes (0: every axis), as
 * m + log sum exp(x - m), m the maximum where finite (else 0, as TensorFlow); keepdims keeps the
 * reduced axes with extent 1. Floating x; the collectives of softmax over every mesh axis that
 * shards a reduced axis. */
dt_status dt_logsumexp(const dt_tensor *x, int num_axes, const int axes[], int keepdims,
                       const dt_op_options *opts, dt_tensor **out);
/* tf.nn.sparse_softmax_cross_entropy_with_logits: the loss of each row of logits [..., C]
 * (f32, f64, bf16, f16) for labels [...] (i32 or i64, the logits' shape without the last
 * axis), logsumexp(logits) - logits[label], [...] in the logits' dtype (the 16-bit floats
 * computed in f32 and rounded once). One fused pass over the logits; its gradient
 * (softmax(logits) - onehot(labels)) dy is one more op of two passes, with no one-hot tensor;
 * none flows to the labels. Any sharding of the leading axes; a class axis sharded over a mesh
 * axis costs one all-reduce MAX and one all-reduce SUM of per-row statistics, never a gather of
 * the logits. A label outside [0, C) gives a NaN loss for its row (and NaN gradients), eager or
 * traced, as TensorFlow's GPU kernel. */
dt_status dt_sparse_softmax_cross_entropy_with_logits(const dt_tensor *labels,
                                                      const dt_tensor *logits,
                                                      const dt_op_options *opts, dt_tensor **out);
/* Keras's sparse_categorical_crossentropy of probabilities (from_logits=False), as
 * TensorFlow's Keras backend computes it: the loss above of the logits log c, c = clip(p,
 * epsilon, 1 - epsilon) (Keras's epsilon is 1e-7; 0 < epsilon < 0.5), which is
 * log(sum c) - log c[label] per row of probabilities p [..., C] (f32, f64, bf16, f16; bounds
 * in the compute type). One fused pass over p with no log or exp per element; its gradient
 * (1 / sum c - [j == label] / p_j) dy where the clip is not active, 0 where it is, one more.
 * Sharding, collectives (one all-reduce SUM of per-row statistics for a sharded class axis)
 * and NaN rows for labels outside [0, C) as above. */
dt_status dt_sparse_categorical_crossentropy(const dt_tensor *labels,
                                             const dt_tensor *probabilities, double epsilon,
                                             const dt_op_options *opts, dt_tensor **out);

/* torch.nn.functional.scaled_dot_product_attention without dropout: y = softmax(scale q k^T)
 * v, causal (query i sees keys 0..i) or not, for q, k, v of one shape and floating dtype
 * [..., T, E] (the leading axes, e.g. batch and heads, independent); scale <= 0 means
 * 1 / sqrt(E). Fused and tiled as FlashAttention: blocks of queries and keys with an online
 * softmax, so memory grows with T (no [T, T] scores are held), and its gradient is one fused
 * kernel too. The leading axes may be sharded: each device computes its own slices with no
 * collective (a split T or E axis is gathered first). bf16 and f16 compute in f32 and round
 * once. CPU devices (on CUDA meshes DT_ERR_UNSUPPORTED for now). */
dt_status dt_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, int causal,
                       double scale, const dt_op_options *opts, dt_tensor **out);

/* Layer normalization over the last axis: (x - mean) / sqrt(var + epsilon) * gamma + beta with
 * the mean and the biased variance of each row; rms_norm: x / sqrt(mean(x^2) + epsilon) * gamma.
 * x floating of rank >= 1; gamma and beta of shape [last extent] and x's dtype, each may be NULL
 * (no scale, no offset); epsilon >= 0. The statistics are kept in f32 for the 16-bit floats.
 * When the last axis is sharded, the row sums are all-reduced over its mesh axis (layer_norm:
 * one all-reduce SUM for the mean, one for the variance; rms_norm: one) and gamma and beta are
 * laid out like x's last axis. */
dt_status dt_layer_norm(const dt_tensor *x, const dt_tensor *gamma, const dt_tensor *beta,
                        double epsilon, const dt_op_options *opts, dt_tensor **out);
dt_status dt_rms_norm(const dt_tensor *x, const dt_tensor *gamma, double epsilon,
                      const dt_op_options *opts, dt_tensor **out);

/* tf.math.argmax and argmin along `axis` (removed from the result): the index of the largest
 * (smallest) element, the first on ties and the first NaN when there is one (numpy's rule). Any
 * dtype; index_dtype DT_DTYPE_I64 (TensorFlow's default) or DT_DTYPE_I32; the axis must not be
 * empty. When the axis is sharded, each device finds its shard's extremum and its global index
 * and one all-gather of these records (16 bytes per row and shard) over the mesh axis lets every
 * device pick the winner. A partial x is summed first. */
dt_status dt_argmax(const dt_tensor *x, int axis, dt_dtype index_dtype, const dt_op_options *opts,
                    dt_tensor **out);
dt_status dt_argmin(const dt_tensor *x, int axis, dt_dtype index_dtype, const dt_op_options *opts,
                    dt_tensor **out);

/* tf.math.cumsum along `axis` of a numeric x: `exclusive` leaves each element out of its own
 * sum, `reverse` sums from the end. When the axis is sharded, each device scans its shard, the
 * shard totals (a [..., 1, ...] tensor per device) are all-gathered over the mesh axis and each
 * device adds the totals of the shards before it (after it, when reversed). Integers wrap; the
 * 16-bit floats accumulate in f32. A partial x stays partial (the scan is linear). */
dt_status dt_cumsum(const dt_tensor *x, int axis, int exclusive, int reverse,
                    const dt_op_options *opts, dt_tensor **out);

/* Result axis i is x's axis perm[i]; the layout moves with the axes (no communication). */
dt_status dt_transpose(const dt_tensor *x, const int perm[], const dt_op_options *opts,
                       dt_tensor **out);
/* Same elements, new shape (one extent may be -1). Local when the layout can express it:
 * a sharded axis must lead its group of merged/split axes with extents divisible by its
 * shard count; otherwise DT_ERR_LAYOUT naming the axis (relayout first). */
dt_status dt_reshape(const dt_tensor *x, int rank, const int64_t shape[], const dt_op_options *opts,
                     dt_tensor **out);
/* x[begin[i] : begin[i] + size[i]] on every axis. */
dt_status dt_slice(const dt_tensor *x, const int64_t begin[], const int64_t size[],
                   const dt_op_options *opts, dt_tensor **out);
/* Join n tensors (same dtype, mesh, and extents except on `axis`) along `axis`. */
dt_status dt_concat(int n, const dt_tensor *const xs[], int axis, const dt_op_options *opts,
                    dt_tensor **out);

/* ---- shape and index ops (each Collective, as every op above) ---------------------------- */

/* tf.split: n pieces of x along `axis` (negative counts from the end), sizes[i] elements each
 * (they add up to the axis's extent), or n equal pieces when sizes is NULL (the extent must
 * divide by n). outs[0..n) receive n new tensors, the results of n slice ops (each in
 * opts->layout when given); on failure every outs[i] is NULL. */
dt_status dt_split(const dt_tensor *x, int n, const int64_t sizes[], int axis,
                   const dt_op_options *opts, dt_tensor *outs[]);
/* tf.stack: n tensors (1 to 16) of one shape and dtype joined along a new axis `axis` (-1:
 * last). The result lies as requested, or as xs[0] with the new axis unsharded; each operand
 * sends every device the part of its slice it holds (block exchanges, never a gather). */
dt_status dt_stack(int n, const dt_tensor *const xs[], int axis, const dt_op_options *opts,
                   dt_tensor **out);
/* tf.pad in constant mode: before[i] and after[i] (>= 0) elements of `constant_value` on each
 * side of axis i. The result lies as requested, or as x; each device fills its shard with the
 * constant and receives the elements of x inside it (a block exchange). */
dt_status dt_pad(const dt_tensor *x, const int64_t before[], const int64_t after[],
                 double constant_value, const dt_op_options *opts, dt_tensor **out);
/* tf.tile: x repeated multiples[i] (>= 0) times along axis i. The result lies as x: copies
 * along unsplit axes are local; along a split axis each copy is a block exchange. */
dt_status dt_tile(const dt_tensor *x, const int64_t multiples[], const dt_op_options *opts,
                  dt_tensor **out);
/* tf.broadcast_to: x stretched to shape[0..rank) as numpy broadcasts. x's sharding stays on
 * the axes it spans; each device broadcasts its own shard (no communication unless asked). */
dt_status dt_broadcast_to(const dt_tensor *x, int rank, const int64_t shape[],
                          const dt_op_options *opts, dt_tensor **out);
/* tf.expand_dims: an unsharded axis of extent 1 inserted at `axis` (-1: last). Metadata only. */
dt_status dt_expand_dims(const dt_tensor *x, int axis, const dt_op_options *opts, dt_tensor **out);
/* tf.squeeze: the axes named in axes[0..num_axes) removed (each of extent 1), or every axis of
 * extent 1 when num_axes is 0. Metadata only (a squeezed axis split over a mesh axis is made
 * unsharded first: it holds one element per row). */
dt_status dt_squeeze(const dt_tensor *x, int num_axes, const int axes[], const dt_op_options *opts,
                     dt_tensor **out);

/* tf.gather along axis 0 (tf.nn.embedding_lookup): y[i..., :] = table[ids[i...], :] for a table
 * [V, d...] of any dtype and ids (i32 or i64) of any shape; y is ids.shape + d. An id outside
 * [0, V) gives a row of zeros (ids are data: never an error, never a read out of bounds).
 * With V split over mesh axis v (a vocabulary-sharded embedding, as Megatron-LM's) each device
 * looks up the ids its rows own and writes zeros for the others, then one all-reduce over v
 * (a reduce-scatter when the request shards y on v, nothing when it is partial over v). The
 * ids must be replicated over v (relayouted otherwise); their other sharding carries to y's
 * leading axes, a sharded d axis of the table to y's trailing axes. */
dt_status dt_gather(const dt_tensor *table, const dt_tensor *ids, const dt_op_options *opts,
                    dt_tensor **out);
/* tf.math.unsorted_segment_sum: y [num_segments, d...] with y[s] = the sum of data[i..., :]
 * over the i with segment_ids[i...] == s; segment_ids (i32 or i64) has data's leading shape,
 * data is numeric; ids outside [0, num_segments) add nothing. The gradient of dt_gather. With
 * the segments axis requested split (the table's layout), each device adds only the rows its
 * shard owns; ids split over a mesh axis (the batch) leave pending sums over it, resolved by
 * an all-reduce or a reduce-scatter into the request. */
dt_status dt_unsorted_segment_sum(const dt_tensor *data, const dt_tensor *segment_ids,
                                  int64_t num_segments, const dt_op_options *opts, dt_tensor **out);
/* tf.one_hot: indices (i32, i64, u8 or i8) with a depth axis inserted at `axis` (-1: last):
 * on_value where the index equals the position, off_value elsewhere (an index outside
 * [0, depth) gives off_value only), as `dtype`. A depth axis requested split is written slice by
 * slice with each device's global offset: no communication. */
dt_status dt_one_hot(const dt_tensor *indices, int64_t depth, double on_value, double off_value,
                     int axis, dt_dtype dtype, const dt_op_options *opts, dt_tensor **out);
/* tf.einsum of one or two operands (numeric, one dtype): "bsh,hd->bsd", "bhqd,bhkd->bhqk",
 * "ij->ji", "ij->i", "i,i->", "...ij,...jk->...ik", or an implicit output ("ij,jk"). Labels are
 * letters; a label repeated inside one operand (a diagonal) is DT_ERR_UNSUPPORTED. Labels in
 * one operand only and not in the output are summed first; the rest is one batched GEMM of the
 * local shards ([batch, free, contracted] groups, each several axes), with a mesh axis chosen
 * for every label by the cost model: a contracted or summed label split over a mesh axis gives
 * a partial product, resolved by an all-reduce (a reduce-scatter into a sharded request,
 * nothing for a partial one). */
dt_status dt_einsum(const char *equation, int n, const dt_tensor *const xs[],
                    const dt_op_options *opts, dt_tensor **out);

/* The same global tensor in `layout` (same mesh), by the minimal transition per mesh axis:
 * all-gather, local slice, all-to-all, all-reduce, reduce-scatter. Into a partial layout,
 * the first member of each partial group keeps the value and the others hold the identity. */
dt_status dt_relayout(const dt_tensor *x, const dt_layout *layout, const dt_op_options *opts,
                      dt_tensor **out);
/* The same global tensor on another mesh of the same device type (over the same devices or
 * others), in `layout` (of that mesh). A partial x has its terms summed on x's mesh first (an
 * all-reduce there), then the sum is sent. */
dt_status dt_copy_to_mesh(const dt_tensor *x, const dt_layout *layout, const dt_op_options *opts,
                          dt_tensor **out);

/* ---------------------------------------------------------------------------------------- */
/* Functions (tracing)                                                                      */
/* ---------------------------------------------------------------------------------------- */
/*
 *     dt_function *f;
 *     dt_tensor *a, *b, *c;
 *     DT_TRY(dt_function_begin(&f));               // this thread now records
 *     DT_TRY(dt_function_input(f, &la, DT_DTYPE_F32, 2, sa, &a));
 *     DT_TRY(dt_function_input(f, &lb, DT_DTYPE_F32, 2, sb, &b));
 *     DT_TRY(dt_matmul(a, b, NULL, &c));            // symbolic: nothing runs
 *     DT_TRY(dt_function_end(f, 1, &c));            // propagate layouts, expand once
 *     DT_TRY(dt_function_run(f, 2, inputs, 1, results));   // run many times
 *
 * Symbolic tensors are freed with dt_tensor_free like any other; they hold no data. Layout
 * propagation runs backward (requested layouts and relayouts pull their producers' layouts,
 * so a sharded request on a matmul result becomes a reduce-scatter) and forward (each op's
 * rule picks the cheapest expansion for its operands' layouts). Concrete tensors cannot be
 * captured: pass them as inputs.
 */
typedef struct dt_function dt_function;

/* Start recording on this thread. Not collective. DT_ERR_STATE when already recording. */
dt_status dt_function_begin(dt_function **out);
/* A symbolic input of the given metadata; the tensor passed to dt_function_run at this
 * position must match it exactly (layout included). */
dt_status dt_function_input(dt_function *f, const dt_layout *layout, dt_dtype dtype, int rank,
                            const int64_t shape[], dt_tensor **out);
/* Stop recording and expand; outputs are symbolic tensors of this function. On failure the
 * function is left unusable (free it). Not collective (pure metadata). */
dt_status dt_function_end(dt_function *f, int num_outputs, dt_tensor *const outputs[]);
/* Run the expanded program: inputs in dt_function_input order, results[i] set to new tensors.
 * Collective. */
dt_status dt_function_run(const dt_function *f, int num_inputs, const dt_tensor *const inputs[],
                          int num_outputs, dt_tensor *results[]);
/* Abandon recording if still active, then free. NULL is a no-op. */
void dt_function_free(dt_function *f);

/* ---------------------------------------------------------------------------------------- */
/* Programs                                                                                 */
/* ---------------------------------------------------------------------------------------- */
/*
 * A program is the flat list of steps an expansion produced, the same on every client: each
 * step a local kernel (its local shapes, multiplies for gemm) or a collective (its mesh axes
 * and the bytes each device sends), with totals per device and over the mesh.
 */

/* Write an ended function's program to f. Not collective. */
dt_status dt_function_print(const dt_function *f, FILE *out);

/* Totals of an ended function's program: gemm multiplies summed over every device of the
 * mesh, collectives, and the largest number of bytes any device sends. Any pointer may be
 * NULL. Not collective. */
dt_status dt_function_cost(const dt_function *f, double *multiplies, int *collectives,
                           double *bytes_per_device);

/* ---------------------------------------------------------------------------------------- */
/* Variables                                                                                */
/* ---------------------------------------------------------------------------------------- */
/*
 * A variable (as tf DVariable) holds a tensor whose layout is fixed at creation. Assigning a
 * value of another layout is DT_ERR_LAYOUT naming both layouts; relayout it explicitly first.
 */
typedef struct dt_variable dt_variable;

/* A variable holding a copy of `initial`, in its layout (not partial). Collective. */
dt_status dt_variable_create(const dt_tensor *initial, dt_variable **out);
/* Collective. value must have the variable's dtype, shape and layout. */
dt_status dt_variable_assign(dt_variable *v, const dt_tensor *value);
dt_status dt_variable_assign_add(dt_variable *v, const dt_tensor *value);
dt_status dt_variable_assign_sub(dt_variable *v, const dt_tensor *value);
/* The current value, borrowed until the next assignment or free. */
const dt_tensor *dt_variable_value(const dt_variable *v);
const dt_layout *dt_variable_layout(const dt_variable *v);
void dt_variable_free(dt_variable *v);

/* ======================================================================================== */
/* Training: gradients, layers, losses, optimizers, strategies, parameter server            */
/* ======================================================================================== */

/* ---------------------------------------------------------------------------------------- */
/* Gradients                                                                                */
/* ---------------------------------------------------------------------------------------- */
/*
 * Reverse-mode differentiation over a traced function's graph of global ops (spmd/
 * autodiff.c). Every op of the engine has a gradient rule (creation ops and comparisons pass
 * none); the gradient graph is a graph like any other, propagated and expanded once. With
 * batch-sharded inputs and replicated variables the weight gradients come out of their matmul
 * partial over the batch mesh axis and the expansion all-reduces them: no caller reduces
 * gradients by hand.
 */

/* A new ended function with f's inputs, whose outputs are f's outputs followed by the
 * gradient of the sum of output `loss_output`'s elements with respect to each input named in
 * wrt[0..num_wrt) (f or f64, the loss's dtype), each in exactly that input's layout (an input
 * nothing flows into gets zeros). f stays usable. Not collective (pure metadata); running
 * the result is. DT_ERR_STATE when f was not ended successfully or this thread is recording. */
dt_status dt_function_gradient(const dt_function *f, int loss_output, int num_wrt, const int wrt[],
                               dt_function **out);

/* ---------------------------------------------------------------------------------------- */
/* Training                                                                                 */
/* ---------------------------------------------------------------------------------------- */
/*
 * A small Keras-like toolkit (train/): dense layers in a sequential model whose variables
 * take the layouts of the strategy in scope, losses composed from the engine's ops (so they
 * differentiate and shard like any op), layout-invariant initializers (Philox), and
 * optimizers that update variables in their fixed layouts. A training step follows the
 * custom training loop of the tf.distribute guide: per-example losses, summed per replica
 * and divided by the global batch size (compute_average_loss), regularization losses divided
 * by the number of replicas, the step's loss the SUM over replicas.
 */

/* X(NAME, name) */
#define DT_ACTIVATION_LIST(X) \
    X(NONE, none)             \
    X(RELU, relu)             \
    X(TANH, tanh)             \
    X(SIGMOID, sigmoid)

typedef enum dt_activation {
#define DT__ACTIVATION_ENUM(NAME, name) DT_ACTIVATION_##NAME,
    DT_ACTIVATION_LIST(DT__ACTIVATION_ENUM)
#undef DT__ACTIVATION_ENUM
        DT_ACTIVATION_COUNT
} dt_activation;

/* X(NAME, name): per-example losses of (labels, predictions), predictions of shape
 * [batch, k]: the mean over k of the squared error; softmax cross-entropy of logits against
 * label probabilities (one-hot) over k, computed as logsumexp - sum(labels * logits) after
 * subtracting the row maximum; binary cross-entropy of logits against labels in [0, 1], as
 * max(z, 0) - z y + log(1 + exp(-|z|)), averaged over k. */
#define DT_LOSS_LIST(X)                             \
    X(MEAN_SQUARED_ERROR, mean_squared_error)       \
    X(SOFTMAX_CROSS_ENTROPY, softmax_cross_entropy) \
    X(BINARY_CROSS_ENTROPY, binary_cross_entropy)

typedef enum dt_loss {
#define DT__LOSS_ENUM(NAME, name) DT_LOSS_##NAME,
    DT_LOSS_LIST(DT__LOSS_ENUM)
#undef DT__LOSS_ENUM
        DT_LOSS_COUNT
} dt_loss;

/* X(NAME, name): initializers, through the layout-invariant random ops (the same values for
 * every layout, mesh and client count). glorot_uniform: U(-l, l), l = sqrt(6 / (fan_in +
 * fan_out)) with fans of a rank-2 kernel [in, out]; random_normal: N(0, 0.05). */
#define DT_INITIALIZER_LIST(X)        \
    X(ZEROS, zeros)                   \
    X(ONES, ones)                     \
    X(GLOROT_UNIFORM, glorot_uniform) \
    X(RANDOM_NORMAL, random_normal)

typedef enum dt_initializer {
#define DT__INITIALIZER_ENUM(NAME, name) DT_INITIALIZER_##NAME,
    DT_INITIALIZER_LIST(DT__INITIALIZER_ENUM)
#undef DT__INITIALIZER_ENUM
        DT_INITIALIZER_COUNT
} dt_initializer;

const char *dt_activation_name(dt_activation a);
const char *dt_loss_name(dt_loss l);
const char *dt_initializer_name(dt_initializer i);

/* Per-example losses (shape [batch]) of predictions [batch, k] against labels of the same
 * shape and dtype (f32, f64). Eager or traced, like any op. Collective when eager. */
dt_status dt_loss_per_example(dt_loss loss, const dt_tensor *labels, const dt_tensor *predictions,
                              dt_tensor **out);
/* tf.nn.compute_average_loss: sum(per_example) / global_batch_size, a scalar. Collective when
 * eager. */
dt_status dt_compute_average_loss(const dt_tensor *per_example, int64_t global_batch_size,
                                  dt_tensor **out);
/* tf.nn.scale_regularization_loss: loss / num_replicas (num_replicas >= 1). Collective when
 * eager. */
dt_status dt_scale_regularization_loss(const dt_tensor *loss, int num_replicas, dt_tensor **out);
/* A tensor of `shape` in `layout` by the initializer; (seed, key) pick the random stream.
 * Collective. */
dt_status dt_initializer_run(dt_initializer init, dt_dtype dtype, int rank, const int64_t shape[],
                             uint64_t seed, uint64_t key, const dt_layout *layout, dt_tensor **out);

/* One dense layer: y = activation(x @ kernel + bias), kernel [in, units], bias [units]. */
typedef struct dt_dense_config {
    int64_t units;
    dt_activation activation;
    dt_initializer kernel_init; /* ZEROS (the value 0) means GLOROT_UNIFORM */
    dt_initializer bias_init;   /* ZEROS */
    int no_bias;                /* 1: no bias variable */
    double l2;                  /* L2 regularization of the kernel: l2 * sum(kernel^2) */
} dt_dense_config;

typedef struct dt_model dt_model;
typedef struct dt_strategy dt_strategy;

/* A sequential model of dense layers on inputs [batch, input_features] of `dtype` (f32,
 * f64). Its variables (kernel and bias of each layer, in that order) take the layouts of the
 * strategy in scope on this thread (dt_strategy_scope_enter), or of a default strategy of the
 * model's own when none is. Variable j of layer i is created from the random stream (seed,
 * 2 i + j), so every strategy starts from the same values. Collective. */
dt_status dt_model_create(int64_t input_features, int num_layers, const dt_dense_config layers[],
                          dt_dtype dtype, uint64_t seed, dt_model **out);
/* Collective (frees parameter-server windows). NULL is a no-op. */
void dt_model_free(dt_model *m);
int dt_model_num_variables(const dt_model *m);
/* Borrowed; NULL when out of range. Names: "dense_0/kernel", "dense_0/bias", ... */
dt_variable *dt_model_variable(const dt_model *m, int i);
const char *dt_model_variable_name(const dt_model *m, int i);
/* The strategy whose scope created the model (NULL for the model's own default strategy). */
dt_strategy *dt_model_strategy(const dt_model *m);
/* Forward pass of x [batch, input_features] (any layout on the variables' mesh, or on the
 * strategy's input mesh: variables on another mesh are copied there first). A floating x of
 * another floating dtype is cast to the model's first, as Keras casts a float64 batch for a
 * float32 model (dt_model_evaluate and dt_model_train_step cast x and y alike). Collective. */
dt_status dt_model_predict(const dt_model *m, const dt_tensor *x, dt_tensor **out);
/* Mean of the per-example losses over the whole batch, as a host value: an evaluation, no
 * update. Collective. */
dt_status dt_model_evaluate(const dt_model *m, dt_loss loss, const dt_tensor *x, const dt_tensor *y,
                            double *mean_loss);

/* X(NAME, name) */
#define DT_OPTIMIZER_LIST(X) \
    X(SGD, sgd)              \
    X(ADAM, adam)            \
    X(ADAMW, adamw)          \
    X(RMSPROP, rmsprop)

typedef enum dt_optimizer_kind {
#define DT__OPTIMIZER_ENUM(NAME, name) DT_OPTIMIZER_##NAME,
    DT_OPTIMIZER_LIST(DT__OPTIMIZER_ENUM)
#undef DT__OPTIMIZER_ENUM
        DT_OPTIMIZER_COUNT
} dt_optimizer_kind;

/* Keras semantics. SGD: v = momentum v - lr g; w += v (nesterov: w += momentum v - lr g);
 * momentum 0 is plain w -= lr g. Adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * w -= lr_t m / (sqrt(v) + eps), lr_t = lr sqrt(1 - b2^t) / (1 - b1^t). AdamW (decoupled
 * weight decay, Loshchilov and Hutter; Keras's AdamW): w -= lr weight_decay w, then Adam's
 * step. RMSprop (Keras's, not centered): s = rho s + (1 - rho) g^2; d = lr g / sqrt(s + eps);
 * with momentum u = momentum u + d, w -= u, else w -= d. Zeros mean the defaults: Adam b1 0.9,
 * b2 0.999, eps 1e-7; AdamW weight_decay 0.004; RMSprop rho 0.9, eps 1e-7.
 *
 * Gradient clipping, Keras's (0: off; each >= 0, not NaN), applied to the gradients of each
 * dt_optimizer_apply before the rule above: clipvalue clips each element to [-clipvalue,
 * clipvalue]; clipnorm scales each gradient g by clipnorm / max(||g||, clipnorm)
 * (tf.clip_by_norm); global_clipnorm scales every gradient of the call by c / max(N, c), N the
 * global norm sqrt(sum over all of them of ||g||^2) (tf.clip_by_global_norm; a non-finite N
 * makes the scale NaN, as TensorFlow's). At most one of clipnorm and global_clipnorm (Keras
 * raises), and clipvalue with neither (Keras would silently ignore it). The scale is folded into
 * each variable's update: no clipped copy of a gradient is written; the norm reads each gradient
 * once (its sum of squares, in f32 for 16-bit floats, summed locally per shard, then reduced
 * over the mesh: no gradient is gathered; where a gradient's last axis is whole on each device,
 * each row along it is summed first, then the rows' sums). Norms need every gradient of the
 * call on one mesh. */
typedef struct dt_optimizer_config {
    dt_optimizer_kind kind;
    double learning_rate;
    double momentum;
    int nesterov;
    double beta_1, beta_2, epsilon;
    double weight_decay;    /* AdamW */
    double rho;             /* RMSprop */
    double clipnorm;        /* per gradient */
    double global_clipnorm; /* over all gradients of an apply */
    double clipvalue;       /* per element */
} dt_optimizer_config;

typedef struct dt_optimizer dt_optimizer;

dt_status dt_optimizer_create(const dt_optimizer_config *cfg, dt_optimizer **out);
void dt_optimizer_free(dt_optimizer *o);
/* The learning rate of the next updates (a schedule's, Keras's LearningRateScheduler): > 0.
 * Not collective; every client sets the same before its next update. */
dt_status dt_optimizer_set_learning_rate(dt_optimizer *o, double learning_rate);
/* One update of vars[i] by grads[i] (each in its variable's dtype, shape and layout; slots
 * are made on first use in the variable's layout and kept per variable). Collective. */
dt_status dt_optimizer_apply(dt_optimizer *o, int n, dt_variable *const vars[],
                             const dt_tensor *const grads[]);
/* Keras's AdamW.exclude_from_weight_decay(var_list): vars[0..n) take Adam's step without the
 * decay from their next update on (AdamW; other kinds have no decay). Variables are borrowed
 * (compared by address); excluding one twice is harmless. On error nothing changes. Not
 * collective; every client excludes the same variables. */
dt_status dt_optimizer_exclude_from_weight_decay(dt_optimizer *o, int n,
                                                 const dt_variable *const vars[]);
/* The global norm of the gradients of the last dt_optimizer_apply with global_clipnorm (before
 * clipping; rank 0, replicated on the gradients' mesh, f32, or f64 when a gradient is f64), or
 * NULL before the first. Borrowed: valid until the next apply or dt_optimizer_free; read it
 * with dt_tensor_read (or dt_copy_to_mesh first when this client holds no device of it). */
const dt_tensor *dt_optimizer_last_global_norm(const dt_optimizer *o);

/* One training step of the custom training loop: per-example losses of model(x) against y,
 * per-replica loss = sum over the replica's examples / global batch + regularization /
 * replicas, gradients of their sum, one optimizer update; *loss (may be NULL) gets the SUM
 * over replicas. x and y must be laid out by dt_strategy_distribute_batch of s (a batch that
 * does not divide by the replicas gives uneven shards, as TensorFlow's rebatching gives
 * unequal per-replica batches); the model must have been created in s's scope (s NULL: the
 * model's own default strategy). The traced gradient function is built once per (shapes,
 * loss) and cached in the model. Under the parameter-server strategy, run it on a worker
 * (inside a scheduled step): it pulls the variables from the ps tasks, computes and updates
 * locally and pushes the difference. Collective over s's mesh (this client alone for
 * mirrored on several clients and the parameter-server strategy). */
dt_status dt_model_train_step(dt_strategy *s, dt_model *m, dt_loss loss, dt_optimizer *opt,
                              const dt_tensor *x, const dt_tensor *y, double *step_loss);

/* Updates applied so far (Keras's optimizer.iterations; Adam's bias correction uses it). */
int64_t dt_optimizer_iterations(const dt_optimizer *o);

/* ---------------------------------------------------------------------------------------- */
/* Random generator                                                                         */
/* ---------------------------------------------------------------------------------------- */
/*
 * tf.random.Generator over the stateless random ops: a seed and a counter. Each draw is the
 * stateless op with (seed, key = counter) and then advances the counter by one, so a program
 * that draws in the same order gets the same numbers, and a checkpoint that saves the state
 * (dt_checkpoint_add_generator) continues the same stream after a restore. Draws are
 * collective ops like any other: every client draws in the same order. The counter advances
 * only when the draw succeeds (which every client agrees on).
 */
typedef struct dt_generator dt_generator;

/* A generator at (seed, counter 0). Not collective. */
dt_status dt_generator_create(uint64_t seed, dt_generator **out);
void dt_generator_free(dt_generator *g);
/* dt_random_uniform / dt_random_normal with (seed, counter), then counter + 1. Collective. */
dt_status dt_generator_uniform(dt_generator *g, dt_dtype dtype, int rank, const int64_t shape[],
                               double low, double high, const dt_op_options *opts, dt_tensor **out);
dt_status dt_generator_normal(dt_generator *g, dt_dtype dtype, int rank, const int64_t shape[],
                              double mean, double stddev, const dt_op_options *opts,
                              dt_tensor **out);
/* The state (either pointer may be NULL) and setting it (tf's reset_from_seed / state.assign).
 * Not collective: every client keeps its own copy of the same state. */
dt_status dt_generator_state(const dt_generator *g, uint64_t *seed, uint64_t *counter);
dt_status dt_generator_reset(dt_generator *g, uint64_t seed, uint64_t counter);

/* ---------------------------------------------------------------------------------------- */
/* Checkpoints                                                                              */
/* ---------------------------------------------------------------------------------------- */
/*
 * Sharded state saved and restored with resharding, as tf.train.Checkpoint / DTensor's
 * checkpointing, in one HDF5 file (train/checkpoint.c) that h5py, h5dump and HDFView read:
 *
 *   /                         attributes format = "dtensor-checkpoint", format_version = 1,
 *                             library_version, num_clients (of the writer)
 *   /variables/NAME           one dataset per variable at its GLOBAL shape and dtype, with
 *                             attributes layout ("x,unsharded"), mesh ("x=2,y=2"),
 *                             device_type ("CPU") and dtype ("float32", ...)
 *   /tensors/NAME             tensors saved without a variable (dt_checkpoint_add_tensor)
 *   /optimizers/NAME          attributes kind, learning_rate, momentum, nesterov, beta_1,
 *                             beta_2, epsilon; dataset iterations (int64);
 *                             slots/VARIABLE/m and slots/VARIABLE/v (momentum, Adam's moments)
 *   /counters/NAME            int64 scalars: step counters, and save_counter
 *   /random/NAME/seed, counter uint64 scalars: generators' states
 *   /metadata                 attributes: the user's key = value strings
 *
 * NAME may hold '/' (groups in the file); each part is made of [A-Za-z0-9_.:-]. Dtypes map
 * to HDF5's little-endian IEEE floats (f16 as IEEE half) and two's-complement integers; bf16,
 * which HDF5 lacks, is stored as its raw 16 bits and bool as one byte, each with the
 * dataset attribute dtype = "bfloat16" / "bool" (every dataset has the attribute).
 *
 * Under a launcher the file is opened through HDF5's MPI-IO driver by every client; a single
 * client without MPI uses HDF5's sec2 driver. Saving gathers nothing: each client writes only
 * the blocks its devices own, as hyperslabs, with collective writes; a block held by several
 * devices (replicated mesh axes) is written once, by the device whose coordinates on those
 * axes are all 0. A partial tensor is first reduced (relayout to its non-partial layout).
 * Restoring reads, for each local device, only the block of its shard in the target layout,
 * so a checkpoint restores into any mesh, layout, device count and client count.
 *
 * A write goes to PATH.tmp, which is renamed to PATH (then the directory is synced) only when
 * every client has written and the file is closed and synced: a crash or kill during a save
 * leaves the previous PATH whole. A truncated, foreign or missing file is DT_ERR_IO naming it
 * and HDF5's reason; HDF5 prints nothing. Variables of the parameter-server strategy (kept in
 * MPI windows, dt_ps_variable_*, models under PARAMETER_SERVER) cannot be checkpointed yet:
 * DT_ERR_UNSUPPORTED names them.
 *
 *     dt_checkpoint *ck;
 *     DT_TRY(dt_checkpoint_create(&ck));
 *     DT_TRY(dt_checkpoint_add_model(ck, "model", model));
 *     DT_TRY(dt_checkpoint_add_optimizer(ck, "optimizer", opt));
 *     DT_TRY(dt_checkpoint_add_counter(ck, "step", &step));
 *     DT_TRY(dt_checkpoint_write(ck, "run/ckpt.h5"));   // Collective
 *     ...                                               // later, in any mesh or client count
 *     DT_TRY(dt_checkpoint_read(ck, "run/ckpt.h5"));    // Collective
 */
typedef struct dt_checkpoint dt_checkpoint;

/* An empty checkpoint: a list of named objects to save and restore, borrowed (each must
 * outlive its uses in write and read). Every client must add the same objects, in the same
 * order, with the same names. Not collective. */
dt_status dt_checkpoint_create(dt_checkpoint **out);
void dt_checkpoint_free(dt_checkpoint *c);
/* A variable, saved as /variables/NAME and restored into (its layout stays; the values are
 * read in it). A name used twice is DT_ERR_ARG. */
dt_status dt_checkpoint_add_variable(dt_checkpoint *c, const char *name, dt_variable *v);
/* Every variable of a model, as NAME/<variable name> ("model/dense_0/kernel"). */
dt_status dt_checkpoint_add_model(dt_checkpoint *c, const char *name, dt_model *m);
/* A tensor saved as /tensors/NAME (any layout, partial included); read does not restore it:
 * read it back with dt_checkpoint_read_tensor. */
dt_status dt_checkpoint_add_tensor(dt_checkpoint *c, const char *name, const dt_tensor *t);
/* An optimizer: its iterations and its slots, each saved under the name of the variable it
 * belongs to, which must be one the checkpoint holds (DT_ERR_ARG at write otherwise). Read
 * restores the iterations and the slots of the checkpoint's variables, in their layouts; the
 * kind (SGD, Adam) must match. */
dt_status dt_checkpoint_add_optimizer(dt_checkpoint *c, const char *name, dt_optimizer *o);
/* A generator's seed and counter. */
dt_status dt_checkpoint_add_generator(dt_checkpoint *c, const char *name, dt_generator *g);
/* An int64 counter (a step number) read from and written to *value. */
dt_status dt_checkpoint_add_counter(dt_checkpoint *c, const char *name, int64_t *value);
/* A user metadata string (key: [A-Za-z0-9_.:-]+), written as an attribute of /metadata;
 * setting a key again replaces its value. */
dt_status dt_checkpoint_set_metadata(dt_checkpoint *c, const char *key, const char *value);
/* The value of a metadata key, as set or as read by the last dt_checkpoint_read; NULL when
 * absent. Valid until the next change of c. */
const char *dt_checkpoint_metadata(const dt_checkpoint *c, const char *key);
/* The metadata keys, in the order set or read: i in 0 .. dt_checkpoint_num_metadata - 1. */
int dt_checkpoint_num_metadata(const dt_checkpoint *c);
const char *dt_checkpoint_metadata_key(const dt_checkpoint *c, int i);

/* Write every object to `path` (through path.tmp, renamed when complete). Collective. */
dt_status dt_checkpoint_write(dt_checkpoint *c, const char *path);
/* Restore every object from `path`. Every variable, counter, generator and optimizer of c
 * must be in the file (DT_ERR_ARG naming the first missing one); a variable's shape and dtype
 * must match the file's (DT_ERR_SHAPE / DT_ERR_DTYPE naming the variable and both). Objects
 * in the file that c does not hold are ignored. Checks end before any object changes, and
 * every value is read before any is assigned: on error nothing changes. Collective. */
dt_status dt_checkpoint_read(dt_checkpoint *c, const char *path);
/* tf.train.Checkpoint.save: increment the save counter (kept in the file as
 * /counters/save_counter, restored by read) and write "<prefix>-<counter>.h5"; `path` (size
 * bytes, may be NULL) receives that name. Collective. */
dt_status dt_checkpoint_save(dt_checkpoint *c, const char *prefix, char *path, size_t size);
int64_t dt_checkpoint_save_counter(const dt_checkpoint *c);
/* Set the save counter (a binding keeping its own count). Not collective. */
dt_status dt_checkpoint_set_save_counter(dt_checkpoint *c, int64_t n);

/* The tensor stored at `name` in the file ("variables/dense_0/kernel", "tensors/x"), read in
 * `layout` (any mesh, not partial): each client reads only its devices' blocks. Collective. */
dt_status dt_checkpoint_read_tensor(const char *path, const char *name, const dt_layout *layout,
                                    dt_tensor **out);
/* The global shape and dtype of the tensor at `name` in the file (shape: DT_MAX_RANK entries).
 * Not collective (every client may call it alone). */
dt_status dt_checkpoint_tensor_info(const char *path, const char *name, dt_dtype *dtype, int *rank,
                                    int64_t shape[]);

/* The checkpoint with the highest N among "ckpt-N.h5" in `directory` (tf.train.
 * latest_checkpoint): its path into `path` (size bytes), "" when there is none. Not
 * collective. */
dt_status dt_checkpoint_latest(const char *directory, char *path, size_t size);

/* tf.train.CheckpointManager: saves c as DIRECTORY/ckpt-N.h5 and keeps the newest
 * max_to_keep (<= 0 keeps all). Checkpoints already in the directory are adopted, so a
 * restarted job continues the numbering and finds the latest. */
typedef struct dt_checkpoint_manager dt_checkpoint_manager;

/* Creates the directory when missing (client 0; the outcome is agreed). Collective. */
dt_status dt_checkpoint_manager_create(dt_checkpoint *c, const char *directory, int max_to_keep,
                                       dt_checkpoint_manager **out);
void dt_checkpoint_manager_free(dt_checkpoint_manager *m);
/* Write the next checkpoint (number < 0: one more than the newest; else that number, as
 * manager.save(checkpoint_number=step)), then delete the oldest beyond max_to_keep (client
 * 0). *path (may be NULL) gets its name, valid until the next save. Collective. */
dt_status dt_checkpoint_manager_save(dt_checkpoint_manager *m, int64_t number, const char **path);
/* The newest checkpoint kept, NULL when none. */
const char *dt_checkpoint_manager_latest(const dt_checkpoint_manager *m);
/* Kept checkpoints, oldest first. */
int dt_checkpoint_manager_num_checkpoints(const dt_checkpoint_manager *m);
const char *dt_checkpoint_manager_checkpoint(const dt_checkpoint_manager *m, int i);

/* ---------------------------------------------------------------------------------------- */
/* Strategies                                                                               */
/* ---------------------------------------------------------------------------------------- */
/*
 * tf.distribute strategies as layout presets (layout/strategy.c; run by train/strategy.c).
 * Each has a 1-D mesh "batch" and two layouts: variables' and inputs'.
 *   DEFAULT: one replica; variables and inputs replicated (the computation of one device, on
 *     every device of the mesh over this runtime's devices).
 *   ONE_DEVICE: one replica on a 1-device mesh over global device 0 (dt_mesh_create_on_devices):
 *     variables and inputs live there alone; clients owning no device of it hold no
 *     components and still call every op (losses are read collectively).
 *   MIRRORED: the local devices of this client (a mesh of its own on several clients, which
 *     then train independently); variables replicated, inputs batch-sharded.
 *   MULTI_WORKER_MIRRORED: the devices of every client; as mirrored.
 *   CENTRAL_STORAGE: variables (and optimizer slots) on a second, 1-device mesh over global
 *     device 0; compute mirrored on the batch mesh over every device, inputs batch-sharded.
 *     Each training step copies the variables to a replicated layout on the batch mesh
 *     (dt_copy_to_mesh), computes the loss and gradients there, copies the gradients back to
 *     device 0 (their partial terms summed on the batch mesh first, then sent) and updates the
 *     variables on device 0.
 *   PARAMETER_SERVER: needs a cluster with ps tasks (see Parameter server).
 */

#define DT_STRATEGY_LIST(X)                         \
    X(DEFAULT, default)                             \
    X(ONE_DEVICE, one_device)                       \
    X(MIRRORED, mirrored)                           \
    X(MULTI_WORKER_MIRRORED, multi_worker_mirrored) \
    X(CENTRAL_STORAGE, central_storage)             \
    X(PARAMETER_SERVER, parameter_server)

typedef enum dt_strategy_kind {
#define DT__STRATEGY_ENUM(NAME, name) DT_STRATEGY_##NAME,
    DT_STRATEGY_LIST(DT__STRATEGY_ENUM)
#undef DT__STRATEGY_ENUM
        DT_STRATEGY_COUNT
} dt_strategy_kind;

const char *dt_strategy_kind_name(dt_strategy_kind k);

/* Variable partitioner of the parameter-server strategy, TensorFlow's three in one: a variable
 * of `rows` rows (axis 0) and `bytes` bytes is split into n shards, shard i on ps task i mod
 * (ps tasks), where n is fixed_shards (FixedShardsPartitioner), else ceil(bytes /
 * max_shard_bytes) (MaxSizePartitioner: as few shards as keep each under the size), else
 * floor(bytes / min_shard_bytes) (MinSizePartitioner: as many as keep each above it), else
 * one per ps task; then at most max_shards (when > 0) and rows, and at least 1. */
typedef struct dt_partitioner {
    int fixed_shards;
    int64_t min_shard_bytes;
    int max_shards;
    int64_t max_shard_bytes;
} dt_partitioner;

typedef struct dt_strategy_options {
    dt_partitioner partitioner; /* parameter server */
    /* The devices the strategy's meshes are made of (DT_DEVICE_CPU in a zeroed struct): the
     * same training program runs on GPU devices with DT_DEVICE_CUDA. */
    dt_device_type device_type;
    /* ONE_DEVICE's device and CENTRAL_STORAGE's variable device: a global device id (0 in a
     * zeroed struct), as tf.distribute.OneDeviceStrategy("/cpu:1"). */
    int device;
    /* MIRRORED over some of this client's devices (MirroredStrategy(devices=...)): local
     * indices first_device .. first_device + num_devices - 1; num_devices 0: all of them. */
    int first_device, num_devices;
} dt_strategy_options;

/* The strategy over this runtime's devices. PARAMETER_SERVER first resolves the cluster
 * (dt_cluster_resolve) and fails with DT_ERR_ARG on every client when it has no ps task or no
 * worker. opts may be NULL. Collective. */
dt_status dt_strategy_create(dt_strategy_kind kind, const dt_strategy_options *opts,
                             dt_strategy **out);
/* Collective. Every model created in its scope must be freed first. NULL is a no-op. */
void dt_strategy_free(dt_strategy *s);
dt_strategy_kind dt_strategy_kind_of(const dt_strategy *s);
/* Replicas that compute one step together (tf num_replicas_in_sync): the batch shards;
 * 1 for default and one-device; a worker's local devices for the parameter server (each
 * worker runs its steps alone). */
int dt_strategy_num_replicas_in_sync(const dt_strategy *s);
/* The mesh inputs and the computation live on (borrowed): the variables' too, except under
 * CENTRAL_STORAGE, whose variables are on the mesh of dt_strategy_variable_layout. Under
 * ONE_DEVICE and CENTRAL_STORAGE a client may own no device of it (0 local devices). */
const dt_mesh *dt_strategy_mesh(const dt_strategy *s);
/* Layouts of a variable and of an input (batch axis first) of rank `rank`. */
dt_status dt_strategy_variable_layout(const dt_strategy *s, int rank, dt_layout *out);
dt_status dt_strategy_input_layout(const dt_strategy *s, int rank, dt_layout *out);
/* A variable of a host value (row-major, the same on every client) placed as tf.Variable is in
 * a strategy's scope: in s's variable layout (dt_strategy_variable_layout: a copy on every
 * replica for the mirrored strategies, on the one device for ONE_DEVICE and CENTRAL_STORAGE,
 * on every device for DEFAULT). s NULL: the strategy in scope on this thread
 * (dt_strategy_scope_enter); DT_ERR_STATE when there is none (outside a strategy, make the
 * variable from a tensor in a layout of your choice: dt_variable_create). The
 * parameter-server strategy's variables are dt_ps_variable_create's (DT_ERR_ARG here).
 * Collective. */
dt_status dt_strategy_variable_create(const dt_strategy *s, dt_dtype dtype, int rank,
                                      const int64_t shape[], const void *host, size_t bytes,
                                      dt_variable **out);

/* Make s the strategy in scope on this thread (scopes nest; exit restores the previous).
 * Models created in scope take its layouts. Not collective. */
dt_status dt_strategy_scope_enter(dt_strategy *s);
dt_status dt_strategy_scope_exit(dt_strategy *s);
/* The strategy in scope on this thread, or NULL. */
dt_strategy *dt_strategy_current(void);

/* Distributed dataset: the global batch (a full host array every client passes, batch axis
 * first) split into per-replica batches, i.e. one tensor in the input layout. Collective. */
dt_status dt_strategy_distribute_batch(const dt_strategy *s, dt_dtype dtype, int rank,
                                       const int64_t shape[], const void *host, size_t bytes,
                                       dt_tensor **out);

/* A step of strategy.run: called with s in scope and the distributed inputs. */
typedef dt_status (*dt_strategy_step_fn)(void *ctx, dt_strategy *s, int num_inputs,
                                         const dt_tensor *const inputs[]);
/* Check that every input lies in s's input layout (DT_ERR_LAYOUT naming it otherwise), enter
 * the scope, call step, exit. Collective over s's mesh. */
dt_status dt_strategy_run(dt_strategy *s, dt_strategy_step_fn step, void *ctx, int num_inputs,
                          const dt_tensor *const inputs[]);
/* strategy.reduce: a per-replica value [replicas, ...] (one row per replica, laid out by
 * replica) reduced over its replicas by SUM or MEAN, replicated. Collective. */
dt_status dt_strategy_reduce(const dt_strategy *s, dt_reduce_op op, const dt_tensor *per_replica,
                             dt_tensor **out);
/* experimental_local_results: this client's i-th local replica's part of a distributed value
 * (its component on local device i), copied to dst. Not collective. */
dt_status dt_strategy_local_result(const dt_strategy *s, const dt_tensor *value, int i, void *dst,
                                   size_t bytes);
/* Read a replicated (or any) scalar tensor of s's meshes into a double, on every client
 * (gathered, so clients owning no device of the mesh get it too). Collective over s's mesh. */
dt_status dt_strategy_read_scalar(const dt_strategy *s, const dt_tensor *t, double *value);

/* ---- sharding presets for transformers ------------------------------------------------- */
/*
 * How a model whose parameters play Megatron-LM's roles is laid out on a 2-D mesh "batch" x
 * "model" over every device (layout/strategy.c). One model code serves every preset: it keeps
 * each parameter in its stored layout, brings it to its used layout where it is read
 * (dt_relayout, marked recompute: a no-op when the two are equal), and lays its inputs and its
 * residual stream out as the preset says. PyTorch's counterparts:
 *   DATA_PARALLEL      DistributedDataParallel: parameters replicated, the batch split over
 *                      "batch"; gradients come out partial and are all-reduced.
 *   FULLY_SHARDED      FSDP2's fully_shard (ZeRO-3): every parameter, its gradient and its
 *                      optimizer slots stored split on their first axis over "batch"; each
 *                      parameter is all-gathered where it is used and freed after its last
 *                      forward use, gathered again in the backward pass (the recompute
 *                      mark), and its gradient is reduce-scattered into the stored shards.
 *   TENSOR_PARALLEL    parallelize_module with ColwiseParallel / RowwiseParallel and
 *                      SequenceParallel: column-parallel weights split on their output axis,
 *                      row-parallel ones on their input axis, the vocabulary split, the
 *                      residual stream split along the sequence between the regions.
 *   FULLY_SHARDED_TENSOR_PARALLEL  2-D: tensor parallel over "model" and fully sharded over
 *                      "batch" (fully_shard on a 2-D DeviceMesh after parallelize_module).
 */
#define DT_STRATEGY_PRESET_LIST(X)      \
    X(DATA_PARALLEL, data_parallel)     \
    X(FULLY_SHARDED, fully_sharded)     \
    X(TENSOR_PARALLEL, tensor_parallel) \
    X(FULLY_SHARDED_TENSOR_PARALLEL, fully_sharded_tensor_parallel)

typedef enum dt_strategy_preset {
#define DT__PRESET_ENUM(NAME, name) DT_STRATEGY_PRESET_##NAME,
    DT_STRATEGY_PRESET_LIST(DT__PRESET_ENUM)
#undef DT__PRESET_ENUM
        DT_STRATEGY_PRESET_COUNT
} dt_strategy_preset;

/* X(NAME, name): what a parameter does, as Megatron-LM splits it. COLUMN: a weight whose axis 1
 * (the output features, or heads) splits over "model" (ColwiseParallel); COLUMN_BIAS: its bias,
 * axis 0; ROW: a weight whose axis 0 (the input features) splits (RowwiseParallel); VOCAB: an
 * embedding [vocabulary, ...] split over the vocabulary (tied with the output projection);
 * REPLICATED: the rest (layer norms, row-parallel biases, position embeddings). */
#define DT_PARAM_ROLE_LIST(X)   \
    X(REPLICATED, replicated)   \
    X(COLUMN, column)           \
    X(COLUMN_BIAS, column_bias) \
    X(ROW, row)                 \
    X(VOCAB, vocab)

typedef enum dt_param_role {
#define DT__ROLE_ENUM(NAME, name) DT_PARAM_##NAME,
    DT_PARAM_ROLE_LIST(DT__ROLE_ENUM)
#undef DT__ROLE_ENUM
        DT_PARAM_ROLE_COUNT
} dt_param_role;

/* "fully_sharded"; "?" outside the list. */
const char *dt_strategy_preset_name(dt_strategy_preset p);
const char *dt_param_role_name(dt_param_role r);

/* The mesh "batch" x "model" of a preset over every device of `type`: DATA_PARALLEL and
 * FULLY_SHARDED N x 1, TENSOR_PARALLEL 1 x N, FULLY_SHARDED_TENSOR_PARALLEL N / model_size x
 * model_size (model_size 0: 2). DT_ERR_MESH when model_size does not divide the devices.
 * Collective. */
dt_status dt_strategy_preset_mesh(dt_strategy_preset p, int model_size, dt_device_type type,
                                  dt_mesh **out);
/* A parameter of role `role` and `shape` on m (a mesh with axes "batch" and "model"): `stored`
 * is where it, its gradient and its optimizer slots live, `used` where it is read. Its used
 * layout follows its role over "model" (replicated for DATA_PARALLEL and FULLY_SHARDED, whose
 * "model" axis has size 1); the fully sharded presets store it with the first axis the used
 * layout leaves unsharded, of extent at least the "batch" axis's size, split over "batch" (as
 * used when there is none). Either pointer may be NULL. Pure. */
dt_status dt_strategy_preset_parameter_layout(dt_strategy_preset p, const dt_mesh *m,
                                              dt_param_role role, int rank, const int64_t shape[],
                                              dt_layout *stored, dt_layout *used);
/* Activations [batch, sequence, ...] of rank >= 2: the batch over "batch" and, between the
 * tensor-parallel regions (the residual stream, the layer norms), the sequence over "model"
 * (sequence parallelism; nothing moves while "model" has size 1). Inputs [batch, ...] take
 * dt_layout_batch_sharded(m, "batch", ...). Pure. */
dt_status dt_strategy_preset_sequence_layout(const dt_mesh *m, int rank, dt_layout *out);

/* ---------------------------------------------------------------------------------------- */
/* Parameter server                                                                         */
/* ---------------------------------------------------------------------------------------- */
/*
 * The cluster comes from TF_CONFIG (JSON, as tf.distribute: {"cluster": {"chief": [...],
 * "worker": [...], "ps": [...], "evaluator": [...]}, "task": {"type": "worker", "index": 0}})
 * or DTENSOR_CLUSTER ("chief=1,worker=2,ps=1"). Tasks map onto MPI ranks in the order chief,
 * worker, ps, evaluator; the number of tasks must equal the number of clients, and a task
 * named in TF_CONFIG must be the one the rank maps to. Errors are agreed: every client fails,
 * with its own message or, when it found nothing wrong itself, the first failing client's.
 *
 * Under PARAMETER_SERVER, a model's variables are split by the partitioner into shards kept
 * in MPI windows on the ps ranks. Each client also computes on a mesh of its own local
 * devices; a worker's step (dt_model_train_step) reads the shards with MPI_Get, computes the
 * gradient and the optimizer's update locally, and adds the change to the shards with
 * MPI_Accumulate, with no barrier between workers (asynchronous training). The chief
 * coordinates: it schedules steps, which workers pull from a queue; each scheduled step
 * returns a remote value that waits when fetched; a step whose function fails on a worker is
 * rescheduled on another worker.
 */

/* X(NAME, name) */
#define DT_TASK_LIST(X) \
    X(CHIEF, chief)     \
    X(WORKER, worker)   \
    X(PS, ps)           \
    X(EVALUATOR, evaluator)

typedef enum dt_task_type {
#define DT__TASK_ENUM(NAME, name) DT_TASK_##NAME,
    DT_TASK_LIST(DT__TASK_ENUM)
#undef DT__TASK_ENUM
        DT_TASK_COUNT
} dt_task_type;

const char *dt_task_type_name(dt_task_type t);

typedef struct dt_cluster {
    int num_tasks[DT_TASK_COUNT];
    dt_task_type task_type; /* this client's task */
    int task_index;
    int first_rank[DT_TASK_COUNT]; /* MPI rank (client) of task 0 of each type */
} dt_cluster;

/* Parse a cluster description without looking at the runtime: tf_config (JSON) if non-NULL,
 * else cluster_spec ("chief=1,worker=2,ps=1"), mapped for client `client` of `num_clients`.
 * Pure. */
dt_status dt_cluster_parse(const char *tf_config, const char *cluster_spec, int client,
                           int num_clients, dt_cluster *out);
/* The cluster from TF_CONFIG or DTENSOR_CLUSTER for this runtime (a single-task default:
 * every client a worker, the first the chief, when neither is set). Collective. */
dt_status dt_cluster_resolve(dt_cluster *out);
/* This client's task under a parameter-server or multi-worker mirrored strategy (DT_ERR_ARG
 * for another strategy). Multi-worker mirrored resolves the cluster at creation as TensorFlow
 * does from TF_CONFIG (worker and chief tasks, one per client; ps tasks are an error). */
dt_status dt_strategy_cluster(const dt_strategy *s, dt_cluster *out);

typedef struct dt_ps_coordinator dt_ps_coordinator;
typedef struct dt_remote_value dt_remote_value;

/* A step closure, run on a worker: `step` is what the chief scheduled; *value its result
 * (e.g. the loss). A failing status ends the step with that error (its value's fetch reports
 * it), as TensorFlow's coordinator treats a function's error; DT_ERR_DEVICE or DT_ERR_COMM
 * (the worker could not run it) makes the chief reschedule it on another worker instead. */
typedef dt_status (*dt_ps_step_fn)(void *ctx, int64_t step, double *value);

/* Every client registers the same step function. Collective. */
dt_status dt_ps_coordinator_create(dt_strategy *s, dt_ps_step_fn fn, void *ctx,
                                   dt_ps_coordinator **out);
/* Chief only: queue a step; *out waits for its value when fetched. */
dt_status dt_ps_schedule(dt_ps_coordinator *c, int64_t step, dt_remote_value **out);
/* Chief only: wait for the step's value. `worker` (may be NULL) gets the worker index that
 * ran it and `attempts` (may be NULL) how many times it was run. */
dt_status dt_remote_value_fetch(dt_remote_value *v, double *value, int *worker, int *attempts);
/* NULL is a no-op. The value keeps its coordinator busy until freed or fetched. */
void dt_remote_value_free(dt_remote_value *v);
/* Chief only: wait for every scheduled step. */
dt_status dt_ps_join(dt_ps_coordinator *c);
/* Chief only, without waiting: how many scheduled steps are queued or running. */
dt_status dt_ps_pending(dt_ps_coordinator *c, int *pending);
/* Every client: the chief waits for every scheduled step while the workers run them and the ps
 * tasks serve; then all return, and the coordinator goes on (schedule more, join again, shut
 * down). What a program that every client runs calls where TensorFlow's coordinator joins.
 * Collective. */
dt_status dt_ps_join_all(dt_ps_coordinator *c);

/* A variable of its own on the ps tasks (not a model's): `initial` (the same value on every
 * client, on the strategy's mesh) split by the strategy's partitioner into shards held in MPI
 * windows on the ps tasks. Reads and additions are one-sided (MPI_Get, MPI_Accumulate), so
 * workers update it asynchronously. Collective to create and to free. */
typedef struct dt_ps_variable dt_ps_variable;
dt_status dt_ps_variable_create(dt_strategy *s, const dt_tensor *initial, dt_ps_variable **out);
void dt_ps_variable_free(dt_ps_variable *v);
/* The whole current value, row-major, into host (`bytes` at least its size). Not collective. */
dt_status dt_ps_variable_read(const dt_ps_variable *v, void *host, size_t bytes);
/* Add `delta` (the whole shape, row-major) to the value on the ps tasks, visible to every
 * later read when it returns. Not collective. */
dt_status dt_ps_variable_add(const dt_ps_variable *v, const void *delta, size_t bytes);
/* Add `delta` as dt_ps_variable_add does and copy the value just before the addition into `old`
 * (both the whole shape, row-major), atomically per element: of concurrent fetch-adds on the
 * same element, each sees the value the others left, so an integer variable is a counter
 * shared by the cluster (the parameter-server strategy's per-worker iterators take their
 * positions from one). Not collective. */
dt_status dt_ps_variable_fetch_add(const dt_ps_variable *v, const void *delta, void *old,
                                   size_t bytes);
int dt_ps_variable_num_shards(const dt_ps_variable *v);
/* Shard i: the ps task (index among the ps tasks) holding it and its rows [row0, row0+rows). */
dt_status dt_ps_variable_shard(const dt_ps_variable *v, int i, int *ps_task, int64_t *row0,
                               int64_t *rows);
/* Collective: the chief joins and releases the workers and ps tasks; workers run scheduled
 * steps and ps tasks serve their windows until then. Every remote value must have been
 * freed. Then frees the coordinator. */
dt_status dt_ps_coordinator_shutdown(dt_ps_coordinator *c);
/* Chief (or any client): copy the current values of the model's variables from the ps tasks
 * into its local variables (for evaluation). Not collective. */
dt_status dt_ps_pull(dt_strategy *s, dt_model *m);

/* ---------------------------------------------------------------------------------------- */
/* Collectives and the communication ledger                                                 */
/* ---------------------------------------------------------------------------------------- */

/* The executor moves data between devices with collectives (all-reduce, all-gather,
 * reduce-scatter, all-to-all, broadcast and their uneven forms) over the groups of a mesh
 * axis or axis set. Local devices of one client exchange through shared memory, clients over
 * MPI (nonblocking calls completed by a yielding wait), groups that span clients with several
 * local devices each hierarchically (reduce locally, cross clients once, copy locally), CUDA
 * devices through NCCL. Every collective is recorded in this client's ledger.
 *
 * Environment: DTENSOR_LOG=comm prints each ledger entry to stderr as it is recorded;
 * DTENSOR_CHECK_COLLECTIVES=1 makes every collective first exchange a short description
 * (kind, dtype, reduction, counts, axes, root, algorithm) among all clients of the mesh, so a
 * client that issues a different collective gets DT_ERR_MISMATCH naming both sides' values,
 * on every client, instead of a hang. */

/* "ring" for DT_ALGORITHM_RING; "?" outside the list. */
const char *dt_collective_algorithm_name(dt_collective_algorithm a);

/* How the mesh's collectives are carried out when a call does not say (the default is
 * DT_ALGORITHM_AUTO: shared memory inside a client; across clients MPI's own collective,
 * or a ring of point-to-point messages for large all-reduce and reduce-scatter; NCCL on CUDA
 * devices). RING: ring for cross-client all-reduce, reduce-scatter and all-gather.
 * HIERARCHICAL_COPY: local reduction, one MPI collective per group, local copies.
 * REDUCTION_TO_ONE_DEVICE: all-reduce reduces onto one device (one client across clients)
 * and broadcasts from it. NCCL only on CUDA meshes, and CUDA meshes only NCCL or AUTO
 * (DT_ERR_UNSUPPORTED otherwise). Every client must set the same algorithm before its next
 * collective on the mesh (DTENSOR_CHECK_COLLECTIVES=1 checks it). */
dt_status dt_mesh_set_collective_algorithm(dt_mesh *m, dt_collective_algorithm a);
dt_collective_algorithm dt_mesh_collective_algorithm(const dt_mesh *m);

/* One recorded collective, as this client saw it. Bytes are per device (the most over this
 * client's devices) and count what the algorithm-independent exchange needs: all-reduce
 * 2(g-1)/g of the buffer each way (a ring's volume), all-gather its own block to g-1 members,
 * and so on, for a group of g members. */
typedef struct dt_ledger_entry {
    int64_t step;   /* the step it ran in (dt_ledger_next_step) */
    int64_t index;  /* position in this client's ledger since the last clear */
    char op[24];    /* "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast" */
    char reduce[8]; /* "sum", "mean", ...; "" for gathers, all-to-all and broadcast */
    dt_dtype dtype;
    unsigned axes;                      /* mesh axis mask of the groups */
    char axes_names[DT_STRING_MAX / 2]; /* "x,y" */
    int group_size;                     /* members per group */
    int uneven;                         /* 1 for the v forms */
    int64_t bytes_sent;                 /* per device */
    int64_t bytes_received;             /* per device */
    double seconds;                     /* from start to the end of the wait (end - start) */
    dt_collective_algorithm algorithm;  /* the one that ran (never AUTO) */
    char backend[32]; /* "local", "mpi", "hierarchical", "cuda", "nccl"; "mpi (host-staged)" and
                       * "hierarchical (host-staged)" for GPU buffers copied to the host */
    char cause[64];   /* the global op that caused it; "" when not given */
    /* When, in seconds of this client's monotonic clock (CLOCK_MONOTONIC): the start was
     * called and returned, the wait was entered, completion was seen (by a poll between
     * kernels, or in the wait; device collectives: at the end of the wait) and the wait
     * returned. start <= started <= wait <= end and start <= done <= end. A traced program
     * starts a collective as soon as its operand is written and waits for it just before the
     * first step that reads its result (or overwrites its buffers), so that compute runs in
     * between. */
    double start, started, wait, done, end;
} dt_ledger_entry;

/* Start a new step: later entries carry the next step number, which is returned. Steps start
 * at 0. This client only. */
int64_t dt_ledger_next_step(void);
/* Entries recorded since the last clear (at most 65536 are kept; dt_ledger_dropped() counts
 * the rest). */
int64_t dt_ledger_size(void);
int64_t dt_ledger_dropped(void);
/* Copy entry i (0 <= i < dt_ledger_size()) to *out. */
dt_status dt_ledger_entry_get(int64_t i, dt_ledger_entry *out);
/* Drop every entry and the dropped count; the step number goes back to 0. */
void dt_ledger_clear(void);
/* Print the entries as a table, per step with its totals (entries, bytes, time). */
dt_status dt_ledger_print(FILE *f);
/* Write {"client": c, "dropped": n, "entries": [{...}, ...]} with the fields above. */
dt_status dt_ledger_write_json(FILE *f);

/* How much of a run of steps' communication was hidden behind this client's compute. */
typedef struct dt_ledger_overlap {
    int64_t collectives;    /* entries of the steps */
    double comm_seconds;    /* the union of the entries' [start, done] intervals */
    double exposed_seconds; /* of that, the time this client was inside a collective's start
                             * or wait call (blocked, or combining shards itself) */
    double hidden_share;    /* 1 - exposed / comm: the share spent computing (0 when comm is 0) */
} dt_ledger_overlap;

/* The overlap of the entries of steps first_step..last_step (dt_ledger_next_step; entries
 * kept, not dropped). DT_ERR_ARG for a NULL out or last_step < first_step. This client only:
 * each client measures its own. */
dt_status dt_ledger_overlap_get(int64_t first_step, int64_t last_step, dt_ledger_overlap *out);

#ifdef __cplusplus
}
#endif

#endif /* DTENSOR_H */
