/* The SPMD expansion engine (internal): graph of global ops, programs of local steps, the op
 * table and the relayout planner. ARCHITECTURE.md "Data flow" and "Expansion rules".
 *
 *   graph (global values, some layouts)  --propagation-->  wanted layouts per value
 *     --expansion (one rule per op, spmd/ops/<op>.c)-->  program (slots + steps)
 *     --executor-->  kernels on each local device, collectives on mesh-axis groups
 */
#ifndef DT_SPMD_ENGINE_H
#define DT_SPMD_ENGINE_H

#include "../collectives/collectives.h"
#include "dt.h"

#define DT__MAX_INPUTS 16

/* ---- the op table: one entry here, one file spmd/ops/<name>.c --------------------------- */

/* X(NAME, name) */
#define DT__OP_LIST(X)            \
    X(FILL, fill)                 \
    X(ARANGE, arange)             \
    X(RANDOM, random)             \
    X(MATMUL, matmul)             \
    X(UNARY, unary)               \
    X(BINARY, binary)             \
    X(REDUCE, reduce)             \
    X(TRANSPOSE, transpose)       \
    X(RESHAPE, reshape)           \
    X(SLICE, slice)               \
    X(CONCAT, concat)             \
    X(RELAYOUT, relayout)         \
    X(COPY_TO_MESH, copy_to_mesh) \
    X(CAST, cast)                 \
    X(WHERE, where)               \
    X(SOFTMAX, softmax)           \
    X(NORM, norm)                 \
    X(ARG_REDUCE, arg_reduce)     \
    X(CUMSUM, cumsum)             \
    X(ATTENTION, attention)       \
    DT__OP_LIST_SHAPE(X)          \
    DT__OP_LIST_LOSS(X)

/* The shape and index ops (gather, unsorted_segment_sum, one_hot, einsum, stack, pad, tile,
 * broadcast_to, expand_dims, squeeze). */
#define DT__OP_LIST_SHAPE(X)      \
    X(GATHER, gather)             \
    X(SEGMENT_SUM, segment_sum)   \
    X(ONE_HOT, one_hot)           \
    X(EINSUM, einsum)             \
    X(STACK, stack)               \
    X(PAD, pad)                   \
    X(TILE, tile)                 \
    X(BROADCAST_TO, broadcast_to) \
    X(EXPAND_DIMS, expand_dims)   \
    X(SQUEEZE, squeeze)

/* Fused losses (sparse softmax cross-entropy). */
#define DT__OP_LIST_LOSS(X) X(SPARSE_XENT, sparse_xent)

typedef enum dt__op {
#define DT__OP_ENUM(NAME, name) DT__OP_##NAME,
    DT__OP_LIST(DT__OP_ENUM)
#undef DT__OP_ENUM
        DT__OP_COUNT
} dt__op;

/* Attributes of one op call. Zeroed before filling: the program cache compares them bytewise.
 */
typedef struct dt__attrs {
    int op; /* unary / binary / reduce operator */
    int keepdims;
    unsigned mask; /* reduce: axes reduced */
    int ta, tb;    /* matmul transposes */
    int axis;      /* concat */
    dt_dtype dtype;
    int rank; /* creation ops, reshape: result shape */
    int64_t shape[DT_MAX_RANK];
    int64_t begin[DT_MAX_RANK]; /* slice */
    int perm[DT_MAX_RANK];      /* transpose */
    double a, b;                /* fill value; arange start, step; random parameters */
    uint64_t seed, key;         /* random */
    /* shape and index ops: one_hot uses axis, dtype, a (on) and b (off); stack and
     * expand_dims axis; squeeze mask; tile shape (the multiples); broadcast_to rank and
     * shape; pad begin (elements before) and after */
    int64_t depth;              /* one_hot: depth; unsorted_segment_sum: num_segments */
    int64_t after[DT_MAX_RANK]; /* pad: elements after */
    char equation[40];          /* einsum: canonical "ab,bc->ac" (explicit output) */
} dt__attrs;

/* A value of the graph: global metadata, and a layout where one is known or required. */
typedef struct dt__val {
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    const dt_mesh *mesh;
    bool has_layout; /* graph inputs: their layout; op results: a hard request */
    dt_layout layout;
} dt__val;

typedef struct dt__node {
    dt__op op;
    dt__attrs attrs;
    int nin;
    int in[DT__MAX_INPUTS]; /* value ids */
    int out;                /* value id */
    bool recompute;         /* gradients recompute it (dt_op_options.recompute) */
} dt__node;

typedef struct dt__graph {
    dt__val *vals;
    int nvals, cap_vals;
    dt__node *nodes;
    int nnodes, cap_nodes;
    int *inputs; /* value ids, in input order */
    int ninputs, cap_inputs;
    int *outputs;
    int noutputs;
} dt__graph;

/* ---- programs ---------------------------------------------------------------------------- */

/* A buffer on every local device (per-device sizes; layouts live in dt__dist). */
typedef struct dt__slot {
    const dt_mesh *mesh;
    size_t *bytes;   /* per local device */
    int input;       /* program input it is bound to, or -1 */
    int output;      /* program output it is bound to, or -1 */
    int first, last; /* steps that first write and last touch it (temporaries live between) */
} dt__slot;

/* A distributed value during expansion: which slot holds it and how it lies. */
typedef struct dt__dist {
    int slot;
    dt_dtype dtype;
    int rank;
    int64_t shape[DT_MAX_RANK];
    dt_layout layout;
} dt__dist;

/* A transfer moves each device's shard to the device at the same mesh coordinates of a mesh
 * of another device type (CPU <-> CUDA), over the same clients. */
typedef enum dt__step_kind { DT__STEP_KERNEL, DT__STEP_COLL, DT__STEP_TRANSFER } dt__step_kind;

/* Operands of one kernel step (where: condition, x, y; norm: x, two statistics, gamma, beta;
 * a fused chain: up to DT__FUSED_MAX_IN). */
#define DT__STEP_MAX_IN DT__KERNEL_MAX_IN

typedef struct dt__step {
    dt__step_kind kind;
    const char *cause; /* the global op */
    const dt_mesh *mesh;
    int nlocal; /* the mesh's local devices (a cached program may outlive its mesh) */
    dt_dtype dtype;
    int nin, in[DT__STEP_MAX_IN], out; /* slots */
    /* kernel */
    dt__kernel kernel;
    dt__kargs *args;  /* per local device */
    dt__fused *fused; /* FUSED: the chain the args point to (owned) */
    double work;      /* elements touched plus multiplies, over this client's devices */
    /* collective */
    dt__coll_kind coll;
    dt_reduce_op op;
    unsigned axes;
    int64_t count;
    int64_t **counts;  /* per local device (uneven forms), or NULL */
    dt__block **boxes; /* per local device: dt__coll.boxes, or NULL */
    int64_t (*at)[2];  /* per local device: elements into the send and the recv buffer, or NULL */
    int wait_at;       /* position in the run order before which it is waited for (overlap.c) */
    /* the printed line and the totals it contributes */
    char text[768];
    double mults_total; /* gemm multiplies over every device of the mesh */
    double mults_max;   /* on the busiest device */
    double bytes_max;   /* collective: bytes the busiest device sends */
} dt__step;

typedef struct dt__program {
    atomic_int refs;
    char title[96];
    dt__slot *slots;
    int nslots, cap_slots;
    dt__step *steps;
    int nsteps, cap_steps;
    int ninputs, noutputs;
    dt__dist *in; /* per program input */
    dt__dist *out;
    /* an eager op's agreement fingerprint (spmd/graph.c), computed on its first run: the cache
     * key it is found by fixes everything the fingerprint hashes */
    uint64_t fingerprint;
    bool has_fingerprint;
    struct dt__arena_plan *plan; /* where the temporaries lie (dt__program_seal), or NULL */
    int *order; /* the run order of the steps (dt__program_schedule), or NULL: as emitted */
} dt__program;

dt_status dt__program_create(const char *title, int ninputs, int noutputs, dt__program **out);
void dt__program_release(dt__program *p);

/* A new slot: a buffer of the local shard of (layout, shape, dtype) on every local device. */
dt_status dt__slot_new(dt__program *p, const dt_layout *l, dt_dtype dtype, int rank,
                       const int64_t shape[], dt__dist *out);
/* A new slot of `elems(device)` elements per local device. */
dt_status dt__slot_new_elems(dt__program *p, const dt_mesh *m, dt_dtype dtype,
                             const int64_t elems_per_local[], int *slot);

/* Fill k for global device `device`; called for every device of the mesh at expansion. */
typedef void (*dt__args_fn)(void *ctx, int device, dt__kargs *k);

/* Append a kernel step: `fill` builds each device's arguments. */
dt_status dt__emit_kernel(dt__program *p, const char *cause, dt__kernel kernel, dt_dtype dtype,
                          int nin, const int in[], int out, const dt_mesh *m, dt__args_fn fill,
                          void *ctx);

/* Append a collective on the groups of mesh-axis mask `axes`. counts_of(ctx, device, counts)
 * gives the uneven counts of a device (NULL for the even form with `count`); sent is the
 * bytes the busiest device sends (for the printer and the cost model). */
typedef void (*dt__counts_fn)(void *ctx, int device, int64_t counts[]);
dt_status dt__emit_coll(dt__program *p, const char *cause, dt__coll_kind kind, dt_dtype dtype,
                        dt_reduce_op op, unsigned axes, int send, int recv, int64_t count,
                        dt__counts_fn counts_of, void *ctx, int ncounts, double sent,
                        const char *what);

/* Let the collective just appended (an all-gather or all-to-all whose groups each sit inside
 * one client, on host-accessible devices) move shards straight from its send buffers into its
 * recv buffers: boxes_of(ctx, device, boxes) gives the device's box of each member's send
 * buffer (dt__coll.boxes). */
typedef void (*dt__boxes_fn)(void *ctx, int device, dt__block boxes[]);
dt_status dt__coll_boxes(dt__program *p, dt__boxes_fn boxes_of, void *ctx, int nboxes);

/* Give the last step, a collective, offsets into its buffers: at_of(ctx, device, at) sets
 * at[0] (send) and at[1] (recv) in elements for global device `device` (a collective into a
 * block of rows of a larger slot: the chunked matmul). */
dt_status dt__coll_at(dt__program *p, dt__counts_fn at_of, void *ctx);

/* Append a transfer of `in` (not partial) to `to`, a layout of the same tensor axes on a mesh
 * of another device type with the same axes and the same local devices per client. */
dt_status dt__emit_transfer(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, dt__dist *out);

/* Run: inputs must match the program's input dists (checked by the caller); results get new
 * tensors in the output layouts. Collective. */
/* How the clients agree on a program run (dt__mesh_agree): over `mesh`'s clients (none for a
 * client-local mesh), on the call described by `a`. */
typedef struct dt__op_check {
    const dt_mesh *mesh;
    dt__agreement a; /* the call, its fingerprint and fields */
} dt__op_check;

/* Run p: allocate results and temporaries, agree (chk) on the outcome and on the op with the
 * other clients before the first collective, then run the steps. Collective over chk->mesh. */
dt_status dt__program_run(const dt__program *p, const dt_tensor *const in[], dt_tensor *out[],
                          const dt__op_check *chk);
dt_status dt__program_print(const dt__program *p, FILE *f);
/* Compute each temporary's lifetime and run all-reduces of dying temporaries in place (call
 * once the program is complete). */
void dt__program_seal(dt__program *p);
/* Communication overlap (spmd/overlap.c). The run order: each collective moves up to just
 * after the last step its buffers depend on (it writes its result, reads its operand), never
 * above the collective before it (every client starts collectives in the program's order, as
 * MPI and NCCL require), and an all-gather not above the first reader of the all-gather
 * before it (so that a fully sharded model's gathers are prefetched one ahead, not every
 * layer's at once); each is waited for just before the first later step that reads its
 * result or writes either buffer (wait_at). A pure function of the program, so identical on
 * every client. DTENSOR_OVERLAP=0 (read here, when a program is built) keeps the emitted
 * order and waits for each collective at once. Called by seal, before lifetimes. */
void dt__program_schedule(dt__program *p);
/* Collectives in flight during a run: started at their step, completed at their wait_at, at
 * most `most` at once (DTENSOR_COLLECTIVES_IN_FLIGHT). */
typedef struct dt__flight {
    dt__coll_req **req;
    int *wait_at;
    int n, cap, most;
} dt__flight;
/* Room for a program's collectives and the bound on those in flight (read here: a bad value
 * fails before the run's agreement, after which nothing fails). */
dt_status dt__flight_init(dt__flight *f, const dt__program *p);
/* Add a started collective, to be waited for before run position `wait_at`. */
void dt__flight_add(dt__flight *f, dt__coll_req *r, int wait_at);
/* Advance every collective in flight without blocking (between kernels). */
void dt__flight_poke(const dt__flight *f);
/* Complete those due before run position `pos` (INT_MAX: all), in start order; the first
 * failure is returned, and every one is completed or released all the same. */
dt_status dt__flight_wait(dt__flight *f, int pos);
/* Complete the oldest ones until another may start. */
dt_status dt__flight_room(dt__flight *f);
void dt__flight_free(dt__flight *f);
/* Gradient buckets (spmd/bucket.c). The cap in bytes from DTENSOR_BUCKET_MB (megabytes,
 * default 25, 0: none; DT_ERR_ARG naming a bad value), read when a function is traced. */
dt_status dt__bucket_cap(size_t *bytes);
/* Runs of even all-reduces of one mesh, axes, dtype and reduction, none of whose results is
 * touched before the run ends, each become copies into a flat temporary, one all-reduce of it
 * and copies out before each result's first later use; a run closes when its bytes reach
 * `cap` (the first at most 1 MiB; 0: nothing changes). The same for reduce-scatters, even
 * or not, into whole slots or blocks of one (the chunked matmul's); a run of one kind stays
 * open across collectives of the other. Then runs of all-gathers of one mesh, axes and dtype
 * of the program's inputs (a fully sharded model's parameters) become copies into a flat
 * temporary, one all-gather started as early as the first of them could be, and each result
 * copied out in its member's place; such a bucket holds at most `cap` bytes gathered and no
 * more than the largest all-gather of the program (or 64 KiB).
 * Call on a complete program, before sealing. */
dt_status dt__program_bucket(dt__program *p, size_t cap);
/* Elementwise fusion (spmd/fuse.c): each chain of elementwise kernel steps whose intermediates
 * nothing else reads becomes one FUSED step (call on a complete program, before sealing). */
void dt__program_fuse(dt__program *p);
/* Repeated kernel steps (spmd/cse.c): a kernel step equal to an earlier one on the same
 * unchanged operands, whose result is small, is dropped and its readers read the earlier
 * result (call on a complete program, before fusion). */
void dt__program_cse(dt__program *p);
void dt__program_totals(const dt__program *p, double *mults, int *colls, double *bytes);

/* Local shape of a dist's shard on global device d. */
void dt__local_shape(const dt__dist *x, int device, int64_t local[], int64_t offset[]);
int64_t dt__local_elems(const dt_layout *l, int rank, const int64_t shape[], int device);

/* Kernel steps touching fewer elements than this over all local devices run on the calling
 * thread instead of the device workers. */
#define DT__INLINE_WORK 32768.0

/* ---- the cost model (alpha-beta) ---------------------------------------------------------- */

#define DT__ALPHA 2e-6       /* seconds per message */
#define DT__BETA 5e-10       /* seconds per byte sent (2 GB/s) */
#define DT__BETA_LOCAL 1e-10 /* seconds per byte copied locally (10 GB/s) */
#define DT__GAMMA 2e-11      /* seconds per multiply-add (50 G/s per device) */

/* ---- relayout ---------------------------------------------------------------------------- */

/* One transition on one mesh axis (ARCHITECTURE.md: the minimal transition per axis). */
#define DT__TRANS_LIST(X)             \
    X(ALL_REDUCE, all_reduce)         \
    X(REDUCE_SCATTER, reduce_scatter) \
    X(ALL_GATHER, all_gather)         \
    X(ALL_TO_ALL, all_to_all)         \
    X(SLICE, local_slice)             \
    X(TO_PARTIAL, to_partial)

typedef enum dt__trans_kind {
#define DT__TRANS_ENUM(NAME, name) DT__T_##NAME,
    DT__TRANS_LIST(DT__TRANS_ENUM)
#undef DT__TRANS_ENUM
} dt__trans_kind;

typedef struct dt__trans {
    dt__trans_kind kind;
    unsigned axes; /* mesh axes (one, or several for a fused all-reduce) */
    int from, to;  /* tensor axes: gathered / scattered / sliced */
    dt_layout before, after;
} dt__trans;

/* A relayout plan is data: it can be costed and printed before it runs. */
typedef struct dt__plan {
    int n;
    dt__trans t[4 * DT_MAX_MESH_AXES + 2];
    double cost; /* seconds, by the alpha-beta model, for the busiest device */
} dt__plan;

dt_status dt__plan_make(const dt_layout *from, const dt_layout *to, dt_dtype dtype, int rank,
                        const int64_t shape[], dt__plan *plan);
/* Cost of relayouting (infinite when impossible). */
double dt__relayout_cost(const dt_layout *from, const dt_layout *to, dt_dtype dtype, int rank,
                         const int64_t shape[]);
/* Emit the steps of from -> to; *out may alias the input when nothing moves. */
dt_status dt__relayout_emit(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, dt__dist *out);
/* A local copy from `in` (whose local shard on each device contains the needed block) into a
 * new slot laid out as `to` (on in's mesh or another over the same devices); the element at
 * global index g of the result is taken from global index g + shift of the input. */
dt_status dt__emit_local_slice(dt__program *p, const char *cause, const dt__dist *in,
                               const dt_layout *to, int rank, const int64_t shape[],
                               const int64_t shift[], dt__dist *out);

/* Block exchange: a slot laid out as `to` (on in's mesh, or another over the same devices)
 * whose element at global index g is in's at g + shift; `shape` is the result's. Each device
 * receives exactly the elements of its shard it lacks (one all-to-all(v) over every device, or
 * local copies when nothing crosses devices); no device gathers a whole axis. A partial `in`
 * needs `to` on the same mesh with the same partial axes. The _into form writes into an
 * existing slot (only the elements coming from in: concat fills a result piece by piece). */
dt_status dt__emit_exchange(dt__program *p, const char *cause, const dt__dist *in,
                            const dt_layout *to, int rank, const int64_t shape[],
                            const int64_t shift[], dt__dist *out);
dt_status dt__emit_exchange_into(dt__program *p, const char *cause, const dt__dist *in,
                                 const int64_t shift[], const dt__dist *out);

/* ---- gradients: the tape (spmd/autodiff.c) ----------------------------------------------- */

/* One backward pass of dt_function_gradient: every symbolic tensor it records. An op's gradient
 * rule (its vjp slot) records with the public ops through these calls; each result is kept by
 * the pass (freed when it ends) and written to *out. */
typedef struct dt__tape dt__tape;

/* Keep the tensor a call just made (`tp` points at its out-parameter; read after the call). */
dt_status dt__tape_keep(dt__tape *a, dt_status s, dt_tensor **tp);
dt_status dt__tape_unary(dt__tape *a, dt_unary_op op, const dt_tensor *x, dt_tensor **out);
dt_status dt__tape_binary(dt__tape *a, dt_binary_op op, const dt_tensor *x, const dt_tensor *y,
                          dt_tensor **out);
/* A constant of `shape`, replicated on like's mesh in like's dtype (rank 0: a scalar). */
dt_status dt__tape_constant(dt__tape *a, const dt_tensor *like, int rank, const int64_t shape[],
                            double value, dt_tensor **out);
dt_status dt__tape_scalar(dt__tape *a, const dt_tensor *like, double value, dt_tensor **out);
dt_status dt__tape_cast(dt__tape *a, const dt_tensor *x, dt_dtype dtype, dt_tensor **out);
dt_status dt__tape_where(dt__tape *a, const dt_tensor *cond, const dt_tensor *x, const dt_tensor *y,
                         dt_tensor **out);
dt_status dt__tape_reshape(dt__tape *a, const dt_tensor *x, int rank, const int64_t shape[],
                           dt_tensor **out);
/* A reduction over `axes` keeping them as extent 1. */
dt_status dt__tape_reduce_keep(dt__tape *a, dt_reduce_op op, const dt_tensor *x, int naxes,
                               const int axes[], dt_tensor **out);
/* dy summed down to `shape` (numpy broadcasting in reverse). */
dt_status dt__tape_sum_to(dt__tape *a, dt_tensor *dy, int rank, const int64_t shape[],
                          dt_tensor **out);
/* The gradient of operand x from g (of a broadcast result): summed to x's shape, in x's dtype;
 * NULL for an integer or bool x. */
dt_status dt__tape_grad_of(dt__tape *a, dt_tensor *g, const dt_tensor *x, dt_tensor **out);
/* dt_unsorted_segment_sum(data, ids, n), noted by the pass: where it meets another gradient of
 * the same value, the pass adds data's rows into that gradient (dt__segment_sum_into) instead
 * of adding the two (a gather's gradient: no [n, ...] zeros and dense add). */
dt_status dt__tape_segment_sum(dt__tape *a, dt_tensor *data, dt_tensor *ids, int64_t n,
                               dt_tensor **out);
/* dy_keep (x's shape with some extents 1) broadcast to x's shape, sharded as x turns out to be. */
dt_status dt__tape_broadcast_to(dt__tape *a, dt_tensor *dy_keep, const dt_tensor *x,
                                dt_tensor **out);

/* An op's gradient rule: given the node, its operands x[] and result y (tensors of the gradient
 * function) and the gradient dy of y, set dx[i] to the gradient of operand i (NULL: none
 * flows). */
typedef dt_status (*dt__vjp_fn)(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                                dt_tensor *dy, dt_tensor *dx[]);

/* ---- op definitions ---------------------------------------------------------------------- */

typedef struct dt__op_def {
    const char *name;
    int min_inputs, max_inputs;
    /* Shape rule: validate operands and attributes and set the result's dtype, rank, shape and
     * mesh. Pure metadata (shared by all clients). */
    dt_status (*infer)(const dt__node *n, const dt__val *const in[], dt__val *out);
    /* Expansion: operands as they lie, the layout wanted of the result (NULL: free choice,
     * not partial). Emits steps; the result must lie exactly as wanted when want != NULL. */
    dt_status (*expand)(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out);
    /* Backward propagation (may be NULL): the layout operand i would best have when the
     * result is wanted in `want`; false for no preference. */
    bool (*pull)(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                 dt_layout *in_want);
    /* Operand 1, when given, lends the result its layout and nothing else: its values are never
     * read, so it is no use of them (a gradient broadcast shaped and sharded like the value it
     * differentiates, whose layout is known only at expansion). */
    bool like_operand;
    /* Gradient rule (spmd/autodiff.c walks the graph backwards and calls it); NULL: nothing
     * flows (constants, integer results). */
    dt__vjp_fn vjp;
    /* Printing (may be NULL): the mode of a kernel step of `kernel` that this op emits, in
     * words ("exp / sum"); NULL for a kernel it does not emit. The printer asks every op. */
    const char *(*describe)(dt__kernel kernel, unsigned mode);
} dt__op_def;

#define DT__OP_DECL(NAME, name) extern const dt__op_def dt__op_##name;
DT__OP_LIST(DT__OP_DECL)
#undef DT__OP_DECL

/* The op table (spmd/names.c). */
const dt__op_def *dt__op_get(dt__op op);

/* Shared helpers of op files. */
/* l as text ("<invalid layout>" when it is not one), in buf (spmd/names.c). */
char *dt__layout_str(const dt_layout *l, char *buf, size_t size);

/* A non-partial layout of rank `rank` on m with every axis unsharded. */
dt_layout dt__layout_none(const dt_mesh *m, int rank);
/* Bring x to its layout without partial axes (all-reduce / nothing). */
dt_status dt__resolve_partial(dt__program *p, const char *cause, const dt__dist *x, dt__dist *out);
/* Final step of most rules: relayout the computed result to `want` (or leave it when NULL
 * and it is not partial; resolve a partial result when NULL). */
dt_status dt__finish(dt__program *p, const char *cause, const dt__dist *x, const dt_layout *want,
                     dt__dist *out);
/* Shape rule of creation ops: attrs dtype, rank and shape. */
dt_status dt__infer_creation(const char *name, const dt__attrs *a, dt__val *out);
/* Attributes of a creation call (zeroed, then dtype, rank and shape), after checking rank and
 * shape; *out is set to NULL first. */
dt_status dt__creation_attrs(const char *name, dt_dtype dtype, int rank, const int64_t shape[],
                             dt__attrs *a, dt_tensor **out);
/* Expansion of creation ops: `kernel` writes each device's shard of the request's layout
 * without partial axes (args gets a dt__creation_ctx), then a relayout marks partial axes. */
typedef struct dt__creation_ctx {
    const dt__dist *out;    /* the slot written */
    const dt__attrs *attrs; /* the node's attributes (value, start/step, seed/key, bounds) */
} dt__creation_ctx;
dt_status dt__expand_creation(dt__program *p, const char *name, const dt__node *n,
                              const dt_layout *want, dt__kernel kernel, dt__args_fn args,
                              dt__dist *out);
/* Fill k's output shape and global offset from x's shard on device d. */
void dt__kargs_out(dt__kargs *k, const dt__dist *x, int device);
/* Mesh axes used by a layout (sharding and partial). */
unsigned dt__layout_used(const dt_layout *l);

/* Broadcasting ops (binary, where): the shape all operands broadcast to (numpy's rule: axes
 * aligned right, extent 1 stretches); DT_ERR_SHAPE naming `what` and the shapes otherwise. */
dt_status dt__broadcast_shape(const char *what, int n, const int ranks[],
                              const int64_t *const shapes[], int *rank, int64_t shape[]);
/* The layout of operand x for computing a result laid out as `o` of shape oshape: each axis
 * of x that spans the result's axis takes its mesh axis; broadcast axes stay unsharded. */
dt_layout dt__operand_layout(const dt__dist *x, const dt_layout *o, const int64_t oshape[]);
/* The result layout of a broadcasting op over operands xs[0..n) with result shape oshape:
 * candidates take each axis's mesh axis from the first operand that shards it, with each
 * operand first in turn, and the request (without partial axes); the one whose operand moves
 * (and the result's move to `want`) cost least by the alpha-beta model wins. */
dt_layout dt__broadcast_layout(int n, const dt__dist *const xs[], int rank, const int64_t oshape[],
                               const dt_layout *want);
/* pull of elementwise ops of one operand: the operand is wanted in the result's layout,
 * without partial axes. */
bool dt__pull_same(const dt__node *n, const dt__val *const in[], const dt_layout *want, int i,
                   dt_layout *in_want);
/* Choosing a mesh axis (or none) for each of an op's axes (gather, unsorted_segment_sum,
 * one_hot, einsum): every slot takes one of its candidates, no mesh axis twice; cost(ctx,
 * axis) prices a full assignment (INFINITY: impossible) and the cheapest wins (the first found
 * on ties: candidates are tried in the order added). */
#define DT__ASSIGN_MAX (2 * DT_MAX_RANK + 1)
typedef struct dt__assign {
    int n; /* slots */
    int ncand[DT__ASSIGN_MAX];
    int cand[DT__ASSIGN_MAX][DT_MAX_MESH_AXES + 1]; /* mesh axes or DT_UNSHARDED */
} dt__assign;
/* Add a candidate to a slot (once). */
void dt__assign_add(dt__assign *s, int slot, int axis);
typedef double (*dt__assign_cost_fn)(void *ctx, const int axis[]);
/* best[0..n) the cheapest assignment; false when none has a finite cost. */
bool dt__assign_best(const dt__assign *s, dt__assign_cost_fn cost, void *ctx, int best[]);
/* Where a searched expansion leaves its result: the request, or (none) the layout it is
 * computed in without partial axes. */
dt_layout dt__search_final(const dt_layout *want, const dt_layout *computed);
/* Elements of the largest shard of (layout, shape): the first shard of every axis. */
int64_t dt__max_local_elems(const dt_layout *l, int rank, const int64_t shape[]);

/* x with an unsharded extent-1 axis at `axis` (expand_dims, stack): the same slot, new
 * metadata. */
dt__dist dt__dist_with_axis(const dt__dist *x, int axis);

/* x converted to `dtype` in x's layout (partial terms summed first): a CAST kernel step. */
dt_status dt__emit_cast(dt__program *p, const char *cause, const dt__dist *x, dt_dtype dtype,
                        dt__dist *out);

/* Row-wise ops (softmax, norm, arg_reduce, cumsum). The dtype their sums are held in: f32 for
 * the 16-bit floats (one rounding at the end), else the dtype itself (common/kernels.h). */
static inline dt_dtype dt__acc_dtype(dt_dtype t)
{
    return t == DT_DTYPE_BF16 || t == DT_DTYPE_F16 ? DT_DTYPE_F32 : t;
}
/* Where an op that keeps its operand's shape computes (the operand x as it lies, or the
 * request): x's layout without partial axes, or `want`'s when moving x there first costs less
 * than moving the result afterwards (unary's rule). */
dt_layout dt__rowwise_layout(const dt__dist *x, const dt_layout *want);
/* x's layout with the axes of `mask` unsharded (their extents become `extent`, the rest
 * keep x's), and the mesh axes that sharded them marked partial under `op`. */
void dt__rowwise_reduced(const dt__dist *x, unsigned mask, int64_t extent, dt_reduce_op op,
                         dt_layout *l, int64_t shape[]);
/* Axes of a call (negative count from the end; none: every axis) into attributes: mask, and
 * axis (the last one). A bad axis is kept for the shape rule (every client agrees on the
 * failure there): mask 0, axis the value given, begin[0] 1 (outside the rank) or 2 (twice);
 * dt__axis_error reports it. */
void dt__axes_attrs(int rank, int num_axes, const int axes[], dt__attrs *a);
dt_status dt__axis_error(const char *name, const dt__attrs *a, int rank);

/* ---- entry points shared by the public API files ----------------------------------------- */

/* An op's argument failure found before dt__call (a NULL list, an out-of-range count or axis):
 * every client of the operands' mesh fails alike (every client when no operand is known), as
 * dt__call does for its own checks; inside a trace the failure is this client's. */
dt_status dt__call_fail(dt__op op, int nin, const dt_tensor *const in[], const dt_op_options *opts,
                        dt_status s);
/* Record (tracing) or compile-from-cache-and-run (eager) one op. Collective when eager. */
dt_status dt__call(dt__op op, const dt__attrs *attrs, int nin, const dt_tensor *const in[],
                   const dt_op_options *opts, dt_tensor **out);

/* Shape rule of ops whose result is the operand's global tensor (relayout, copy_to_mesh). */
dt_status dt__infer_same_tensor(const dt__node *n, const dt__val *const in[], dt__val *out);
/* An op of one operand whose result is asked in `layout` (relayout, copy_to_mesh). */
dt_status dt__call_to_layout(dt__op op, const char *name, const dt_tensor *x,
                             const dt_layout *layout, const dt_op_options *opts, dt_tensor **out);

/* The gradient of dt_attention(q, k, v, causal, scale) for dy: one tensor [3, ..., T, E] holding
 * dq, dk and dv (the attention op in mode DT__ATTN_GRAD; scale as the forward call resolved
 * it). Collective when eager, as every op. */
dt_status dt__attention_grad(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                             const dt_tensor *dy, int causal, double scale, dt_tensor **out);

/* base + dt_unsorted_segment_sum(data, segment_ids, num_segments), as one op that adds the
 * segment sums into base's selected rows (spmd/ops/segment_sum.c; bitwise the sum and the
 * add). Collective when eager, as every op. */
dt_status dt__segment_sum_into(const dt_tensor *data, const dt_tensor *segment_ids,
                               int64_t num_segments, const dt_tensor *base, dt_tensor **out);

/* The graph of an ended function (NULL when it was not ended successfully); read by the
 * autodiff pass (spmd/autodiff.c), which replays it into a new function. */
const dt__graph *dt__function_graph(const dt_function *f);

/* Make `value` (owned: taken on success, left with the caller on error) the variable's value
 * without a copy: it must have the variable's dtype, shape and layout (the errors of
 * dt_variable_assign otherwise, on this client alone: the caller agrees). Not collective. */
dt_status dt__variable_adopt(dt_variable *v, dt_tensor *value);

#endif /* DT_SPMD_ENGINE_H */
