/* Internal declarations shared by every part of the library (never installed). */
#ifndef DT_INTERNAL_H
#define DT_INTERNAL_H

#include "dtensor.h"
#include "kernels.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* ---- errors ------------------------------------------------------------------------------ */

/* dt__fail (kernels.h): record a formatted message for dt_last_error() and return s. Call
 * once, at the site of the failure; callers only propagate with DT_TRY. */
/* Set the message verbatim (used to re-raise a message received from another client). */
void dt__set_error(const char *msg);

/* ---- the API lock: calls from several threads of one client ----------------------------- */

/* Every public call that agrees with other clients, runs work on devices or touches the
 * runtime's shared state (meshes' caches, the program cache, the agreement channel, each
 * device's one task slot) holds one process-wide lock for its whole duration, so calls from
 * several threads run one after another, each whole: collectives keep one order on every
 * client as long as each client issues its calls in one order. The lock is recursive (a call
 * made inside another, or from a callback the library runs under it, such as a strategy's
 * step, takes it again), and callbacks that may block on the caller's own locks (a tensor's
 * release function, a parameter-server step) run with it released (dt__api_suspend). Pure
 * calls (layouts, names, getters of immutable objects, dt_last_error) take no lock.
 * DT__SERIAL() as a function's first statement holds the lock until the function returns. */
void dt__api_lock(void);
void dt__api_unlock(void);
/* Release every level of the lock this thread holds (around a callback); returns the count
 * for dt__api_resume. */
int dt__api_suspend(void);
void dt__api_resume(int held);
static inline void dt__api_scope_end(const int *held)
{
    (void)held;
    dt__api_unlock();
}
#define DT__SERIAL()                                                              \
    const int dt__api_scope __attribute__((cleanup(dt__api_scope_end), unused)) = \
        (dt__api_lock(), 1)

/* "[3,2]" into buf; returns buf. */
char *dt__shape_str(char *buf, size_t size, int rank, const int64_t shape[]);
#define DT__SHAPE_STR_MAX (DT_MAX_RANK * 21 + 3)

/* Overflow-checked product of a shape; -1 on overflow or a negative extent. */
int64_t dt__num_elements(int rank, const int64_t shape[]);

bool dt__dtype_valid(dt_dtype d);

/* Kinds of dtype an op takes (a mask). */
#define DT__FLOATING 1u
#define DT__INTEGER 2u
#define DT__BOOL 4u
#define DT__NUMERIC (DT__FLOATING | DT__INTEGER)
#define DT__ANY (DT__NUMERIC | DT__BOOL)
/* DT_OK when d is valid and of one of `kinds`, else DT_ERR_DTYPE naming `what`, d and the
 * dtypes it takes ("matmul: bool, expected f32, f64, i32, i64, bf16, f16, u8 or i8"). */
dt_status dt__dtype_check(const char *what, dt_dtype d, unsigned kinds);
/* DT_OK when `value` (an element given as a double: a fill value, one_hot's on and off values)
 * becomes an element of d without wrapping: any value for the floats; for the integers a finite
 * value whose integer part is in d's range (the fraction is dropped, as numpy's conversion
 * does); for bool any value but NaN (nonzero is true). Else DT_ERR_ARG naming `what`, the
 * value, d and its range ("fill: value 1099511627776 does not fit i32 (-2147483648 to
 * 2147483647)"). */
dt_status dt__value_check(const char *what, double value, dt_dtype d);

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

/* What a device backend implements. Device buffers are opaque to everything above backends/.
 *
 * Ordering: each device has one queue of work (CUDA: its stream). Kernels, `copy` and the
 * device side of `to_device` go on it in call order and may still be running when the call
 * returns; `to_host` and `sync` wait for everything queued before them. A synchronous backend
 * (CPU) finishes everything before returning and leaves `sync` NULL. Buffers freed while work
 * that uses them is queued are safe to reuse for work queued later on the same device: the
 * caching allocator hands a block back only to its own device. */
typedef struct dt__backend {
    const char *name;
    /* Host code may read and write device buffers directly (CPU). */
    bool host_accessible;
    /* Per-device resources (stream, library handles, events) at dt_init and dt_finalize;
     * NULL when the backend needs none. */
    dt_status (*open)(dt__device *d);
    void (*close)(dt__device *d);
    /* Make d current on the calling thread before queueing work for it (CUDA: the GPU). */
    dt_status (*enter)(dt__device *d);
    /* Memory straight from the system (the caching allocator in mesh/device.c sits above). */
    dt_status (*alloc)(dt__device *d, size_t bytes, void **out);
    void (*free)(dt__device *d, void *p);
    /* Host to device: src may be reused when the call returns. */
    dt_status (*to_device)(dt__device *d, void *dst, const void *src, size_t bytes);
    /* Device to host: waits for the work queued on d before it, then copies. */
    dt_status (*to_host)(dt__device *d, void *dst, const void *src, size_t bytes);
    /* Device to device, queued on d (src may be on another device of the backend). */
    dt_status (*copy)(dt__device *d, void *dst, const void *src, size_t bytes);
    /* Wait for every piece of work queued on d; reports a failure of queued work. */
    dt_status (*sync)(dt__device *d);
    /* Local kernels by (kernel, dtype); NULL when the backend has none. */
    const dt__kernel_fn (*kernels)[DT_DTYPE_COUNT];
    /* Its FUSED entry takes chains that end in a reduction (dt__fused.reduce). */
    bool fused_reduce;
    /* Run kernel fn of the table on d, or queue it (emulated streams); NULL: the executor
     * calls fn itself with d's kernel context. */
    dt_status (*launch)(dt__device *d, dt__kernel_fn fn, const dt__kargs *k, const void *const in[],
                        void *out);
    /* Collectives between its devices run on the devices (CUDA copies and kernels, NCCL);
     * otherwise through host memory (the shared-memory and MPI phases). */
    bool device_collectives;
    /* Collectives across clients on the devices (collectives/device.c), with a transport
     * between physical GPUs (NCCL, or its emulation); NULL: they go through host memory. */
    const struct dt__dev_ops *dev;
    /* The arithmetic its gemm kernel runs with in `dtype`, in words, for the printer. */
    const char *(*gemm_math)(dt_dtype dtype);
} dt__backend;

/* What device collectives need of a backend besides its kernels and copies. Every device has,
 * beside its compute stream, a side stream: the collectives across clients of one physical GPU
 * run on the side stream of its first device (its "side device"), ordered against the compute
 * streams of the devices whose buffers they use, both ways, as PyTorch's ProcessGroupNCCL
 * orders its NCCL stream. Nothing here waits on the host. */
typedef struct dt__dev_ops {
    /* side's side stream waits for everything queued on member's compute stream so far (an
     * event recorded there) */
    dt_status (*side_after)(dt__device *side, dt__device *member);
    /* member's compute stream waits for everything queued on side's side stream so far */
    dt_status (*after_side)(dt__device *member, dt__device *side);
    /* queued on side's side stream: a device copy, and the combine of common/kernels.h */
    dt_status (*side_copy)(dt__device *side, void *dst, const void *src, size_t bytes);
    dt_status (*side_combine)(dt__device *side, const dt__combine *c);
} dt__dev_ops;

extern const dt__backend dt__cpu_backend;
/* CUDA devices emulated on the host (DTENSOR_EMULATE_CUDA, where no GPU is visible): the CPU's
 * kernels on host memory, used as a GPU's is (not host-accessible: values come and go through
 * to_device and to_host, the clients agree on kernels' outcome), so that the executor's device
 * paths run on machines without a GPU. */
extern const dt__backend dt__emulated_cuda_backend;
/* Threads of each OpenBLAS call: one when the devices' kernel threads split gemms (*split),
 * else the cores each local CPU device has (devices of every client on the host share its
 * cores), so concurrent GEMMs of several devices do not oversubscribe them; unchanged when the
 * user set OPENBLAS_NUM_THREADS (*user). Returns the count in use. */
int dt__cpu_blas_threads(int cores_per_device, bool *user, bool *split);
/* Test hook of emulated GPUs: true defers the work queued on every compute stream until the
 * host waits for it (a reader, a sync, a free) or a side stream is ordered after it, as a slow
 * GPU would, and checks every device collective's ordering against the compute streams (a
 * kernel touching a buffer a collective still uses, or a collective reading a buffer a queued
 * kernel has yet to write, fails the device with DT_ERR_DEVICE). DTENSOR_EMULATE_LATE=1 sets
 * it at dt_init. */
void dt__emulate_late(bool on);
/* An emulated side stream of `side` reads (writes) bytes at p: the transport's use of a
 * buffer, checked and remembered as dt__dev_ops's side copies are. */
dt_status dt__emulate_side_use(dt__device *side, const void *p, size_t bytes, bool write);
#ifdef DT_HAVE_CUDA
extern const dt__backend dt__cuda_backend;
/* Usable GPUs of this process (0 without a driver or a GPU: any error counts as none). */
int dt__cuda_device_count(void);
/* The 16-byte identity of visible GPU `ordinal`: its UUID, or its PCI address where it has
 * none. False when CUDA cannot tell. */
bool dt__cuda_identity(int ordinal, unsigned char id[16]);
/* Let every GPU of `ordinals` read and write the others' memory where the hardware allows
 * (kernels of one client's collectives read peers directly). */
dt_status dt__cuda_enable_peers(int n, const int ordinals[]);
/* True when a kernel on GPU `a` can read memory of GPU `b` (same GPU, or peer access on). */
bool dt__cuda_can_access(int a, int b);
#endif

/* The backend of a device type in this build; NULL when the build lacks it (CUDA without
 * CUDA). A pure function of the type: every client gets the same answer, also a client that
 * owns no device of that type. */
const dt__backend *dt__backend_of(dt_device_type type);

/* A task run on a device's worker thread: fn(device, index, arg). */
typedef void (*dt__task_fn)(dt__device *d, int index, void *arg);

/* The caching allocator's free lists of one device: blocks of one size class each, handed
 * back to the system only by dt_device_release_cache and dt_finalize. */
#define DT__SIZE_CLASSES 256
typedef struct dt__cached {
    void *p;
    struct dt__cached *next;
} dt__cached;

struct dt__device {
    dt_device_type type;
    int local_index; /* among this client's devices of the type */
    int ordinal;     /* CUDA device ordinal; core index a CPU worker is bound to, or -1 */
    int logical;     /* CUDA: index of this logical device on its physical GPU */
    int gpu;         /* CUDA: the job-wide number of its physical GPU (dt__rt.gpu_of) */
    /* this client's devices of its type, this one among them (the runtime's array): how a
     * backend reaches the other devices of a GPU */
    dt__device *siblings;
    int num_siblings;
    const dt__backend *backend;
    dt__kctx kx;              /* what kernels see (stream, BLAS handle, TF32) */
    void *ev_ready, *ev_done; /* CUDA events ordering collectives between devices' streams */
    /* Device collectives (dt__dev_ops): the side stream and the events recorded on the compute
     * stream (ev_in) and on the side stream (ev_out); the device whose side stream may still
     * use this device's buffers (set while a collective is in flight: a buffer freed then is
     * reused only after the compute stream waits for that side stream) */
    void *side, *ev_in, *ev_out;
    dt__device *_Atomic fence;
    /* A failure that leaves the device unusable (a sticky CUDA error, an aborted or timed-out
     * collective): 0 alive, 1 being marked, 2 dead with dead_msg. */
    atomic_int dead;
    char dead_msg[400];
    void *pinned[2]; /* CUDA: host staging buffers for transfers, made on first use */
    void *pinned_ev[2];
    atomic_size_t bytes_current; /* in use: bytes the callers asked for */
    atomic_size_t bytes_peak;
    /* caching allocator (mesh/device.c), under cache_lock */
    pthread_mutex_t cache_lock;
    dt__cached *cache[DT__SIZE_CLASSES];
    size_t bytes_reserved; /* taken from the system: in use (rounded up) plus cached */
    size_t bytes_cached;
    uint64_t system_allocs; /* blocks taken from the system since dt_init */

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
    bool opened; /* the backend's open succeeded: close it at the end */
};

/* Allocate with accounting (dt_device_memory) from the device's cache, falling back to the
 * system (once more after emptying the cache). Zero bytes gives a valid unique pointer.
 * dt__device_free takes the size that was asked for. */
dt_status dt__device_alloc(dt__device *d, size_t bytes, void **out);
void dt__device_free(dt__device *d, void *p, size_t bytes);
/* Hand every cached block of d back to the system. */
void dt__device_release_cache(dt__device *d);
/* Mark d dead with the message of the current failure (dt_last_error()): from now on every
 * allocation and kernel on it fails with DT_ERR_DEVICE naming it. The first mark stays.
 * dt__device_alive: DT_OK, or that failure again. (common/device.c: the backends mark their
 * devices too.) */
void dt__device_kill(dt__device *d);
dt_status dt__device_alive(const dt__device *d);
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
    bool mpi_used;      /* clients are MPI ranks */
    bool mpi_owned;     /* dt_init called MPI_Init and dt_finalize ends it */
    bool cuda_tf32;     /* f32 gemms on CUDA devices may use TF32 (dt_init_options.allow_tf32) */
    bool cuda_emulated; /* the job emulates its GPUs (dt__emulated_cuda_backend; agreed at init) */
    /* Some host has more clients than GPUs, so clients share them (the same on every client):
     * NCCL refuses two ranks on one GPU, so GPUs of different clients exchange through host
     * copies (collectives/staged.c). */
    bool gpus_shared;
    int blas_threads; /* threads of one OpenBLAS call */
    int timeout_s;    /* a wait for other clients gives up after this (dt_init_options) */
    /* DTENSOR_CHECK_COLLECTIVES: every collective is agreed on first (read and agreed at dt_init,
     * so that every client checks or none does) */
    bool check_collectives;
    bool blas_threads_user; /* set by OPENBLAS_NUM_THREADS */
    bool blas_split;        /* the devices' kernel threads split gemms */
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
    /* per global CUDA device: the job-wide number of its physical GPU (GPUs told apart by
     * identity, dt__gpu_assign); the same table on every client */
    int *gpu_of;
    atomic_int live_meshes;
    atomic_int live_tensors;
} dt__runtime;

extern dt__runtime dt__rt;

/* ---- GPU identity (mesh/runtime.c) ------------------------------------------------------- */

/* Physical GPUs one client uses at most. */
#define DT__MAX_GPUS 64
/* The GPUs one client sees, in its ordinal order (CUDA_VISIBLE_DEVICES applied): 16 bytes of
 * identity each (dt__cuda_identity; emulated GPUs get made-up ones). */
typedef struct dt__gpu_view {
    int n;
    unsigned char id[DT__MAX_GPUS][16];
} dt__gpu_view;
/* The GPUs client `me` of `nclients` takes, as indices into its view (take[], *ntake, at most
 * DT__MAX_GPUS), from every client's view. GPUs are told apart by identity, not counted: a GPU
 * that several clients see goes to one of them, the clients seeing the same set of GPUs taking
 * those GPUs in turn (client k of them: its k-th, (k + n)-th, ... of the set), so eight clients
 * each under its own CUDA_VISIBLE_DEVICES take one GPU each, and eight clients seeing the same
 * eight GPUs take one each too. A client left without one while it sees some shares one (its
 * k-th modulo what it sees): *shared is then true, as it is for every client (some GPU serves
 * two clients, which NCCL refuses). Pure: every client computes every client's answer alike. */
void dt__gpu_assign(int nclients, const dt__gpu_view views[], int me, int take[], int *ntake,
                    bool *shared);
/* The job-wide number of GPU `index` of client c's view: its position among the distinct GPUs
 * of every view, in client order then view order. Pure. */
int dt__gpu_number(int nclients, const dt__gpu_view views[], int c, int index);

/* DT_ERR_STATE with the calling function's name unless dt_init has run. */
dt_status dt__require_init(const char *fn);

/* ---- waiting for other clients and agreeing with them (mesh/wait.c, mesh/agree.c) -------- */

/* A wait for other clients: poll, then dt__wait_pause after every poll that found nothing. It
 * spins while young (when the host's clients each have a core), then yields, then sleeps with
 * a growing pause (up to tens of microseconds), so that long waits leave the core to whoever
 * computes (the shared-memory agreement blocks on a futex instead, mesh/wait.c);
 * dt__wait_pause returns true once DTENSOR_TIMEOUT has passed (the watchdog).
 * dt__wait_end restores what the wait changed (the thread's timer slack). */
typedef struct dt__waiter {
    double start, waited; /* seconds: the first pause, and the time waited so far */
    double watch_at;      /* when the wait next asks whether a client was lost */
    long sleep_ns;
    unsigned polls; /* pauses while spinning */
    int slack;      /* the thread's timer slack before the wait sleeps (-1: untouched) */
    bool spin;
    bool lost; /* it gave up because a client was lost (dt__watch_poll), not at the timeout */
} dt__waiter;
void dt__wait_begin(dt__waiter *w);
bool dt__wait_pause(dt__waiter *w);
void dt__wait_end(dt__waiter *w);
/* DT_ERR_COMM for a wait that gave up: names the call (dt__current_call), where it waited
 * ("in all_reduce over ...") and either the client that was lost (dt__watch_why) or, at the
 * timeout, the clients not heard from when known. */
dt_status dt__gave_up(const dt__waiter *w, const char *where, const char *missing);

/* Liveness of the other clients (mesh/watch.c): a wait asks dt__watch_poll once it has lasted
 * a tenth of a second, then every tenth; a client is lost when its process is gone (clients
 * of this host), its host's heartbeat stopped (other hosts), or MPI reported it unreachable
 * (dt__watch_unreachable). A loss is never forgotten: later waits fail at once and dt_finalize
 * waits for no one. dt__watch_open is collective over the world, with every client alive. */
dt_status dt__watch_open(MPI_Comm host, const int members[], const int leader_of[],
                         const int leaders[], int nleaders);
void dt__watch_close(void);
bool dt__watch_lost(void);
bool dt__watch_poll(void);
void dt__watch_unreachable(int client, const char *mpi_says);
/* This client's account of the first loss: "client 3 died (its process, pid 812, is gone)". */
void dt__watch_why(char *buf, size_t size);
/* The call this thread is making, as the last agreement named it ("matmul"); a timeout names
 * it. dt__set_current_call restores a saved name. */
const char *dt__current_call(void);
void dt__set_current_call(const char *what);
/* "clients 0-3, 5" for a sorted list of clients. */
void dt__clients_str(char *buf, size_t size, const int ranks[], int n);

/* Complete requests by polling with the wait above (blocking MPICH calls spin,
 * docs/ARCHITECTURE.md, toolchain); `where` says what for in a timeout's message ("for all
 * clients"). */
dt_status dt__mpi_wait_for(int n, MPI_Request reqs[], const char *where);
dt_status dt__mpi_wait_all(int n, MPI_Request reqs[]);
/* Every client contributes `bytes` and receives all contributions in client order. With one
 * client it is a copy. Collective over comm. */
dt_status dt__allgather_bytes(MPI_Comm comm, const void *send, size_t bytes, void *recv);

/* One field of what a client is about to do, compared field by field when clients differ:
 * its name ("operand 1 shape"), its text ("[2,5]") and a hash of its value. */
typedef struct dt__field {
    char name[48];
    char text[200];
    uint64_t hash;
} dt__field;
/* Set a field: the hash is of raw_bytes at raw, or of the text when raw is NULL. */
void dt__field_set(dt__field *f, const char *name, const void *raw, size_t raw_bytes,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define DT__AGREE_FIELDS 80
/* Fill out[0..max) with the fields of ctx's call, in an order every client shares; return the
 * count. Called only when clients differ. */
typedef int (*dt__fields_fn)(const void *ctx, dt__field out[], int max);

/* What a client brings to an agreement besides its verdict. */
typedef struct dt__agreement {
    const char *what;     /* the call: "matmul", "dt_barrier", "dt_mesh_create" */
    const dt_mesh *mesh;  /* the mesh it runs on (its identity and op count are compared), or
                             NULL */
    uint64_t fingerprint; /* everything else the clients must share, hashed */
    dt__fields_fn fields; /* the same, field by field (NULL: none beyond the channel's) */
    const void *ctx;
} dt__agreement;

/* Test hook: this client's next verdict on the rare path carries `status` as given (any int)
 * and a message with no terminating NUL, as a broken peer might send. */
void dt__agree_test_garble(int status);

/* The agreement channel over every client (dt_init opens it, dt_finalize closes it). */
dt_status dt__channel_open(void);
void dt__channel_close(void);
/* Agree with every client of the runtime on a call before it moves any data: each brings its
 * verdict (local; the message of a failure is dt_last_error()) and *a. All return DT_OK when
 * every client succeeded with the same call (name, mesh and its op count, fingerprint);
 * otherwise all fail alike: with the first failure (a failing client keeps its own message,
 * the others name it), or with DT_ERR_MISMATCH naming the first field in which clients differ,
 * its values and the clients involved. The common case is one exchange through shared memory
 * (one message between hosts' leaders); the agreement's sequence number orders it among all
 * others. Collective over every client. */
dt_status dt__agree_on(const dt__agreement *a, dt_status local);
/* The same for a call on mesh m (NULL: unknown to this client, e.g. every operand was NULL,
 * which still agrees with every client); a client-local mesh needs no agreement and returns
 * local. Collective over every client unless m is client-local. */
dt_status dt__mesh_agree(const dt_mesh *m, dt_status local, const dt__agreement *a);
/* Staging beside the channel, when every client shares one host's memory: each client has a
 * region of dt__stage_capacity() bytes for each agreement (0 when the clients span several
 * hosts). A client fills dt__stage_next() just before an agreement; once that agreement has
 * succeeded, every client reads any client's region with dt__stage_last(world rank) until it
 * makes its next agreement. The agreement is the only synchronisation: no MPI call. */
size_t dt__stage_capacity(void);
void *dt__stage_next(void);
const void *dt__stage_last(int client);
/* The host of a client as the channel groups them (shared memory, or DTENSOR_AGREE_HOSTS): the
 * world rank of its host's first client; -1 without the channel (a single client). */
int dt__host_of(int client);
/* Agree on a status alone, naming the calling function: over every client when comm spans them
 * (the channel), over comm's clients otherwise; MPI_COMM_NULL returns local. Collective over
 * comm. */
dt_status dt__agree_status(MPI_Comm comm, dt_status local, const char *what);
#define dt__agree(comm, local) dt__agree_status((comm), (local), __func__)

/* FNV-1a style hash of bytes (a word at a time), continuing from h (start with
 * DT__HASH_SEED). Not cryptographic: for caches and for telling clients' ops apart. */
#define DT__HASH_SEED 1469598103934665603ull
uint64_t dt__hash(uint64_t h, const void *p, size_t n);

/* ---- mesh -------------------------------------------------------------------------------- */

struct dt_mesh {
    atomic_int refs;
    uint64_t serial;  /* unique for the process's lifetime: caches key on it, never on the
                         address, which a later mesh may reuse */
    uint64_t content; /* hash of axes, sizes, type and device ids: the same on every client */
    /* Agreements (mesh/agree.c): the mesh's number among the collective meshes, and the count
     * of agreed calls on it, the same on every client (0 for a client-local mesh). */
    uint64_t agree_id;
    uint64_t agree_seq;
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

/* Hooks (mesh/mesh.c): the state that a floor above mesh/ keeps per mesh and per runtime is
 * made and dropped when mesh/ says, through hooks that floor registers (a constructor in its
 * own folder, at library load), so that no call runs up a floor. Every member may be NULL.
 * Hooks that make run bottom floor first; hooks that drop run top floor first (an upper
 * floor's state may point into a lower one's: programs cached per mesh before the mesh's
 * communicators). */
typedef struct dt__hooks {
    int floor; /* orders the hooks: DT__FLOOR_* */
    /* dt_init, MPI just up (a client of an MPI job), before the world communicator is made:
     * MPI objects of that floor. A failure is agreed by dt_init like its own. */
    dt_status (*mpi_up)(void);
    /* MPI about to go down (dt_finalize, or a dt_init that failed after mpi_up), once every
     * device has stopped; also after a client was lost, so it waits for no other client. */
    void (*mpi_down)(void);
    /* dt_finalize, every client agreed, before the runtime's own meshes are freed. */
    void (*finalize)(void);
    /* A mesh that is not client-local was made: what its steps need made now, agreed by
     * every client (collective over the mesh). A failure frees the mesh (mesh_freed). */
    dt_status (*mesh_made)(const dt_mesh *m);
    /* A mesh's last reference is freed. Collective as dt_mesh_free is. */
    void (*mesh_freed)(dt_mesh *m);
} dt__hooks;
/* The floors above mesh/ that keep state per mesh or runtime (docs/ARCHITECTURE.md, "The
 * floors"), bottom to top. */
enum { DT__FLOOR_LAYOUT = 1, DT__FLOOR_COLLECTIVES, DT__FLOOR_SPMD, DT__FLOOR_TRAIN };
/* Add h (kept, not copied: static storage) to the hooks. Called before main (constructors). */
void dt__hooks_add(const dt__hooks *h);
/* Run every hook of one kind (mesh/ alone calls these). */
dt_status dt__hooks_mpi_up(void);
void dt__hooks_mpi_down(void);
void dt__hooks_finalize(void);
dt_status dt__hooks_mesh_made(const dt_mesh *m);
void dt__hooks_mesh_freed(dt_mesh *m);
/* The number of programs in the eager program cache (spmd/graph.c; tests). Not collective. */
int dt__program_cache_count(void);

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

/* ---- strategy presets (layout/strategy.c) ------------------------------------------------ */

/* Where a strategy kind puts things: its meshes and, through the functions below, the layouts
 * of its variables and inputs. The strategies' runtime (train/strategy.c) holds one. */
typedef struct dt__preset {
    dt_mesh *mesh; /* 1-D, axis "batch": inputs and compute */
    /* CENTRAL_STORAGE: the variables' 1-device mesh (opts->device); NULL elsewhere, where
     * variables live on `mesh` */
    dt_mesh *var_mesh;
    int replicas;      /* num_replicas_in_sync */
    bool shard_inputs; /* inputs split on "batch" along their first axis, else replicated */
} dt__preset;

/* The meshes of strategy `kind` (valid, as opts->device_type; opts may be NULL): DEFAULT,
 * MULTI_WORKER_MIRRORED and CENTRAL_STORAGE over every device of the runtime (plus a 1-device
 * mesh for central storage's variables), ONE_DEVICE over one global device, MIRRORED and
 * PARAMETER_SERVER over this client's devices. On error *out is left empty. Collective
 * (mesh creation) except for MIRRORED and PARAMETER_SERVER. */
dt_status dt__preset_create(dt_strategy_kind kind, const dt_strategy_options *opts,
                            dt__preset *out);
/* Free the meshes (collective as dt_mesh_free is) and empty *p; an empty preset or NULL is a
 * no-op. */
void dt__preset_free(dt__preset *p);
/* Variables: replicated on their mesh. Inputs of rank >= 1: batch-sharded when the kind
 * shards inputs, else replicated. */
dt_status dt__preset_variable_layout(const dt__preset *p, int rank, dt_layout *out);
dt_status dt__preset_input_layout(const dt__preset *p, int rank, dt_layout *out);
/* PARAMETER_SERVER's variables: the number of row shards (dt_partitioner's rule) of a
 * variable of `rows` rows of `row_bytes` bytes over `nps` ps tasks. Pure. */
int dt__preset_ps_num_shards(const dt_partitioner *p, int64_t rows, int64_t row_bytes, int nps);

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
    /* dt_tensor_wrap: the buffers are the caller's, handed back through release(ctx) when
     * the tensor is freed (NULL: they came from the devices' allocators) */
    dt_release_fn release;
    void *release_ctx;
};

/* DT_ERR_STATE, naming fn, when t is symbolic (recorded in a function being traced: it has no
 * values until the function runs); DT_OK for a concrete tensor. A pure function of metadata
 * every client shares, so every client fails alike. */
dt_status dt__tensor_require_values(const dt_tensor *t, const char *fn);

/* An empty tensor of the right local sizes (contents undefined). Not collective. */
dt_status dt__tensor_alloc(const dt_layout *l, dt_dtype dtype, int rank, const int64_t shape[],
                           dt_tensor **out);

#endif /* DT_INTERNAL_H */
