/* Private to collectives/: the per-mesh group cache, the request of one collective, and the
 * entry points of the backends (shared memory, MPI, NCCL) and of the ledger. */
#ifndef DT_COLL_INTERNAL_H
#define DT_COLL_INTERNAL_H

#include "collectives.h"

/* The order of the MPI collectives posted on one communicator. MPI matches the collectives of a
 * communicator by the order each client posts them, so with several collectives in flight a
 * step posted only after an earlier one completed (reduce-then-broadcast's broadcast, the
 * by-host path's rounds) could meet another collective's step on a client that saw its
 * completions in another order. A lane queues the group calls posting there in start order
 * (the same on every client); only its head posts, and it leaves once it posts no more. */
struct dt__gcall;
typedef struct dt__lane {
    struct dt__gcall *head, *tail;
} dt__lane;

/* The hosts of a set of clients, for the by-host path: combine inside each host (MPI between
 * the clients of one host goes through shared memory), cross between one leader per host (the
 * host's first client), spread inside each host. Built only where the clients span several
 * hosts and some host holds two or more of them (dt__hosts_build). Positions are the clients'
 * indices in the set; hosts are numbered in the order of their first client. */
typedef struct dt__hosts {
    int num_hosts;
    int my_host;
    int *host_first; /* num_hosts + 1 offsets into host_order */
    int *host_order; /* positions, host after host, ascending within a host */
    bool host_major; /* host_order is 0, 1, 2, ...: every host's clients are consecutive */
    int host_rank;   /* this client's index among its host's clients */
    int host_size;   /* its host's clients */
    MPI_Comm hcomm;  /* its host's clients, in position order (host_size > 1), or NULL */
    MPI_Comm lcomm;  /* the hosts' leaders in host order (on leaders only), or NULL */
    dt__lane lane;   /* of hcomm and lcomm together */
} dt__hosts;

/* The hosts of clients[0..n) (client ids, this client at position me), or *out = NULL when
 * the by-host path does not apply. Local. */
dt_status dt__hosts_build(const int clients[], int n, int me, dt__hosts **out);
/* Its communicators, over ranks of parent (the client ids; tags tag and tag + 1). Collective
 * over the n clients. */
dt_status dt__hosts_connect(dt__hosts *h, MPI_Comm parent, const int clients[], int tag);
void dt__hosts_free(dt__hosts *h);
/* Frees what the reads' gather keeps (dt__coll_shutdown). */
void dt__hosts_shutdown(void);
/* Reads DTENSOR_COLLECTIVES_BY_HOST (dt__coll_init). */
dt_status dt__hosts_configure(void);

/* One group of an axis mask, as this client sees it. Member ranks follow device ids, and
 * clients own contiguous device blocks, so the members a client holds are a contiguous range
 * of member ranks and the clients of a group are listed in member-rank order. */
typedef struct dt__cgroup {
    int id;           /* global device id of member 0 */
    int first_rank;   /* member rank of this client's first member */
    int num_local;    /* k: members on this client */
    int *local;       /* k local device indices, in member order */
    int num_clients;  /* clients holding members; > 1: the group spans clients */
    int my_pos;       /* this client's index in `clients` */
    int *clients;     /* client ids (ranks of the mesh communicator) */
    int *rank_first;  /* num_clients + 1: first member rank held by each client */
    MPI_Comm comm;    /* over `clients` when the group spans clients */
    bool owns_comm;   /* false when shared with an earlier group of the same clients */
    dt__hosts *hosts; /* by-host structure when it applies (made with comm), else NULL */
    dt__lane *lane;   /* of comm: own_lane, or the one of the group it shares comm with */
    dt__lane own_lane;
    int xset; /* device collectives: its communicators in the mesh's list (-1: unknown) */
} dt__cgroup;

/* Every group of one axis mask that holds a device of this client, by ascending id. */
typedef struct dt__cmask {
    unsigned axes;
    int size; /* g: members per group */
    int num_groups;
    dt__cgroup *groups;
    int *group_of; /* per local device: index into groups */
    bool spans;    /* some group spans clients */
    bool comms_ready;
    unsigned seq; /* collectives issued on this mask, for point-to-point tags */
    /* ring work buffers kept between calls (fresh pages would be faulted in and registered
     * with the network layer on every call); taken by one collective at a time */
    char *scratch;
    size_t scratch_bytes;
    bool scratch_busy;
} dt__cmask;

struct dt__coll_mesh {
    dt__cmask *masks[1u << DT_MAX_MESH_AXES];
    struct dt__devmesh *dev; /* device collectives' communicators (device.c), or NULL */
};

/* How one group's cross-client step is carried out. */
typedef enum dt__xmode {
    DT__X_NONE,         /* the group lies inside this client */
    DT__X_NATIVE,       /* one nonblocking MPI collective */
    DT__X_RING,         /* ring over point-to-point messages */
    DT__X_REDUCE_BCAST, /* MPI_Ireduce to the first client, then MPI_Ibcast */
    DT__X_HOSTS,        /* by host: in the host, between the hosts' leaders, in the host */
} dt__xmode;

/* One group's share of a collective. Counts are elements. */
typedef struct dt__gcall {
    struct dt__coll_req *r; /* the request it belongs to */
    dt__cgroup *g;
    const int64_t *cnt;         /* the group's counts array; NULL: uniform `count` */
    const void **send;          /* k send buffers of the local members, member order */
    void **recv;                /* k */
    int64_t total;              /* all-gather / reduce-scatter: sum of block counts */
    int64_t max_sent, max_recv; /* ledger: bytes per device, max over local members */
    /* cross-client step */
    dt__xmode mode;
    int *mc; /* 4 * num_clients ints: MPI counts and displacements */
    char *stage;
    size_t stage_bytes;
    char *xin, *xout; /* where the cross step reads and writes */
    char *seg_out;    /* reduce-scatter: where this client's reduced segment lands */
    MPI_Request req[2];
    int nreq;
    int phase, step;  /* ring: phase 0 reduce-scatter, 1 all-gather; step within */
    int64_t *seg;     /* ring: num_clients + 1 segment offsets */
    char *acc, *tmp;  /* ring work buffers */
    bool own_scratch; /* acc and tmp were allocated for this call (the mask's were busy) */
    char *hbuf;       /* by host: the leader's work buffers (one allocation) */
    bool uses_scratch;
    int tag;
    bool done;
    dt__lane *lane;              /* queued there (NATIVE, REDUCE_BCAST, HOSTS), else NULL */
    struct dt__gcall *lane_next; /* the next in the lane */
    bool queued;                 /* its first step waits for its turn in the lane */
} dt__gcall;

struct dt__coll_req {
    const dt_mesh *m;
    dt__coll c;
    dt__cmask *mask;
    dt_collective_algorithm algorithm; /* resolved */
    const char *backend;               /* "local", "mpi", "hierarchical", "cuda", "nccl" */
    size_t es;
    int num_groups;
    dt__gcall *gc;
    char *block; /* the groups' small arrays (send, recv, seg, mc) */
    /* monotonic seconds: the start called and returned, the wait entered, the completion seen
     * (by dt__collective_test or the wait; 0 until then) */
    double t0, t_started, t_wait, t_done;
    dt_status poked; /* a failure dt__collective_test met, returned by the wait */
    char poked_msg[512];
    bool parallel;                /* local phases on the device workers (large enough to pay off) */
    struct dt__coll_stage *stage; /* host copies of device buffers (staged.c), or NULL */
    const struct dt__transport *transport; /* what carries it (dt__transport_add) */
    struct dt__dev_call *dev;              /* its state while in flight, or NULL */
};

/* ---- transports ----------------------------------------------------------------------------
 *
 * One way of carrying a collective, as a backend's kernel table carries a kernel. Each file of
 * a transport adds its entry (a constructor; cuda.c exists only in builds with CUDA), and
 * dt__collective_start takes the first entry, by ascending priority, whose usable() is true:
 *   10 "device"  device.c  GPUs whose groups span clients, or NCCL asked for: NCCL or its
 *                          emulation over MPI, one rank per physical GPU
 *   20 "staged"  staged.c  devices the host cannot touch in groups spanning clients (clients
 *                          share GPUs, or emulated GPUs): host copies, then the host path
 *   30 "cuda"    cuda.c    GPUs of one client: device copies and reduction kernels
 *   40 "host"    mpi.c     shared memory inside a client, MPI across clients (always usable)
 * A request runs prepare (before the plan), check (after it), start; then progress until it
 * says done (the caller yields between calls and watches the time), then finish. */
typedef struct dt__transport {
    const char *name;
    int priority;
    /* The ledger's backend and the resolved algorithm, or NULL: the plan names them (the host
     * path: local, mpi, hierarchical, by host) */
    const char *ledger;
    dt_collective_algorithm algorithm;
    bool group_comms; /* runs over the groups' MPI communicators (dt__coll_mask makes them) */
    /* Pure metadata of r (its mesh and mask), so every client chooses alike. */
    bool (*usable)(const dt__coll_req *r);
    dt_status (*prepare)(dt__coll_req *r);     /* NULL: nothing */
    dt_status (*check)(const dt__coll_req *r); /* NULL: it can run every plan */
    dt_status (*start)(dt__coll_req *r);
    /* True once done (a failure sets *status); NULL: start or finish waits by itself. */
    bool (*progress)(dt__coll_req *r, dt_status *status);
    dt_status (*finish)(dt__coll_req *r); /* NULL: nothing */
} dt__transport;
/* Add t (static storage) to the transports; called before main (constructors). */
void dt__transport_add(const dt__transport *t);

/* DT_ERR_UNSUPPORTED unless algorithm `a` can run on devices of `type`. */
dt_status dt__coll_check_algorithm(dt_device_type type, dt_collective_algorithm a, const char *fn);
/* "x,y" for a mask. */
void dt__coll_axes_str(const dt_mesh *m, unsigned axes, char *buf, size_t size);

/* Group cache of a mask (built on first use; communicators too). Collective. */
dt_status dt__coll_mask(const dt_mesh *m, unsigned axes, bool need_comms, dt__cmask **out);

void dt__coll_divide(dt_dtype t, void *acc, size_t n, int by);
MPI_Datatype dt__coll_mpi_type(dt_dtype t);
/* The MPI reduction of (dtype, operator): MPI's own, or f32 user ops for bf16 and f16. */
MPI_Op dt__coll_mpi_op(dt_dtype t, dt_reduce_op op);

/* Shared-memory phases before and after the cross-client step (device workers). */
void dt__coll_local_pre(dt__coll_req *r);
void dt__coll_local_post(dt__coll_req *r);
/* Cross-client step: post and drive to completion. */
dt_status dt__coll_mpi_start(dt__coll_req *r);
/* True when every group is done; a failure sets *status. */
bool dt__coll_mpi_progress(dt__coll_req *r, dt_status *status);
/* Take gc out of its lane (where it is queued). */
void dt__lane_leave(dt__gcall *gc);

/* By host (hosts.c): should a group of p clients on h hosts, at most c on one, move `bytes` of
 * `kind` by host under the mesh's algorithm a; buffers of the by-host path, set up before the
 * local phase; the next step of a group once its last one completed (gc->phase counts them). */
bool dt__hosts_choose(dt__coll_kind kind, dt_collective_algorithm a, const dt__hosts *h,
                      int clients, int64_t bytes);
dt_status dt__hosts_setup(dt__coll_req *r, dt__gcall *gc);
dt_status dt__hosts_next(dt__coll_req *r, dt__gcall *gc);

/* The host copies of the staged transport (staged.c), freed with the request. */
typedef struct dt__coll_stage dt__coll_stage;
void dt__coll_stage_free(dt__coll_stage *st);

/* ---- device collectives across clients (device.c) ------------------------------------------
 *
 * A transport between physical GPUs: NCCL (nccl.c), or its emulation over MPI for GPUs
 * emulated on the host (xport_emulated.c). A communicator is one rank of a set of physical
 * GPUs; its ops run on the side stream of the rank's GPU (dt__dev_ops). */
typedef struct dt__xcomm dt__xcomm;

typedef enum dt__xop_kind {
    DT__XOP_ALL_REDUCE,     /* send, recv: count */
    DT__XOP_ALL_GATHER,     /* send: count, recv: nranks * count */
    DT__XOP_REDUCE_SCATTER, /* send: nranks * count, recv: count */
    DT__XOP_REDUCE,         /* send: count; recv (root `peer` only): count */
    DT__XOP_BROADCAST,      /* send (root `peer` only), recv: count */
    DT__XOP_SEND,           /* send: count, to rank `peer` */
    DT__XOP_RECV,           /* recv: count, from rank `peer` */
} dt__xop_kind;

/* One op of one rank. Ops between the same two ranks match in the order they are given, on
 * every client alike. */
typedef struct dt__xop {
    dt__xop_kind kind;
    dt_dtype dtype;  /* f32 for 16-bit floats widened to f32 */
    dt_reduce_op op; /* SUM, MAX, MIN or PROD */
    const void *send;
    void *recv;
    int64_t count;
    int peer;
    dt__xcomm *comm;
    dt__device *side; /* the rank's GPU's side device: the stream it runs on */
} dt__xop;

typedef struct dt__xport {
    const char *name; /* the ledger's backend */
    bool emulated;    /* links GPUs emulated on the host (dt__rt.cuda_emulated), else real ones */
    /* The communicators of `nranks` GPUs, ranks numbered as the caller chose: this client's k
     * GPUs are ranks rank[j], their side devices side[j]; client_of[r] is the client (rank in
     * comm) of rank r. out[j] gets rank[j]'s communicator. Collective over comm, whose every
     * client calls it (with k = 0 when it holds no rank); MPI_COMM_NULL when every rank is
     * this client's. `fail` (a fault injected for tests) makes this client fail as a rank
     * whose creation failed does. */
    dt_status (*init)(MPI_Comm comm, int nranks, const int client_of[], int k, const int rank[],
                      dt__device *const side[], bool fail, dt__xcomm *out[]);
    /* Communicators of the parents' ranks `members` (nm of them, ascending): every rank of the
     * parents calls it, the k held here by this client; out[j] is NULL for a parent that is
     * not a member. The new ranks are the members' places in the list. */
    dt_status (*split)(int k, dt__xcomm *const parent[], int nm, const int members[],
                       dt__xcomm *out[]);
    /* Queue the ops (one group call: every op of every rank of this client, in an order
     * every client follows). The host does not wait for them. */
    dt_status (*run)(int n, const dt__xop ops[]);
    /* End a communicator whose peers may be gone (in-flight ops abort), or an idle one. */
    void (*abort)(dt__xcomm *c);
    void (*free)(dt__xcomm *c);
} dt__xport;

/* Add x (static storage) to the links device.c chooses from: the one whose `emulated` is the
 * runtime's (nccl.c, only in builds with CUDA; xport_emulated.c). Called before main. */
void dt__xport_add(const dt__xport *x);

/* The state of a device collective (device.c's transport) while in flight: freed with the
 * request. */
void dt__dev_call_free(dt__coll_req *r);
/* The mesh's device communicators (dt__coll_mesh_open makes them: every set of GPUs a group
 * of some axis mask spans across clients, split from one per mesh), freed with it. */
void dt__dev_mesh_free(dt_mesh *m);

/* What collectives/ keeps per mesh and per runtime, made and freed through mesh/'s hooks
 * (collectives.c registers them):
 * - dt__coll_mesh_open: the communicators a mesh's collectives need before any step runs
 *   (device collectives across clients), made when the mesh is; the outcome is agreed by
 *   every client. Collective (a mesh that is not client-local).
 * - dt__coll_mesh_free: the per-mesh state (communicators included). Collective.
 * - dt__coll_init: MPI objects of the collectives (the 16-bit float reductions), made once
 *   MPI is up; also reads DTENSOR_COLLECTIVES_BY_HOST: DT_ERR_ARG naming a value that is not
 *   0, 1 or auto (the other objects are made all the same). dt__coll_shutdown frees them
 *   before MPI goes down. */
dt_status dt__coll_mesh_open(const dt_mesh *m);
void dt__coll_mesh_free(dt_mesh *m);
dt_status dt__coll_init(void);
void dt__coll_shutdown(void);

/* Faults injected for tests (DTENSOR_FAULT="KIND:K[:N]": client K's N-th event of the kind,
 * N 1 by default): "comm" a device communicator's creation fails, "enqueue" a device
 * collective's enqueue fails, "kill" the client exits there, "post" an MPI call posting a step
 * of a host-path collective fails. The kind asked of this client, and N in *at; DT__FAULT_NONE
 * when none is. */
typedef enum {
    DT__FAULT_NONE,
    DT__FAULT_COMM,
    DT__FAULT_ENQUEUE,
    DT__FAULT_KILL,
    DT__FAULT_POST
} dt__fault_kind;
dt__fault_kind dt__coll_fault(int *at);

/* Ledger: record a finished collective. */
/* Record r, whose wait returns at monotonic time `end`. */
void dt__ledger_record(const dt__coll_req *r, double end);

/* Block counts of a group's call. */
static inline int64_t dt__gc_block(const dt__coll_req *r, const dt__gcall *gc, int s, int t)
{
    if (!gc->cnt)
        return r->c.count;
    return r->c.kind == DT__COLL_ALL_TO_ALL ? gc->cnt[(int64_t)s * r->mask->size + t] : gc->cnt[s];
}

/* Element offset of block `upto` in a group's concatenated blocks (uniform or uneven). */
static inline int64_t dt__gc_block_off(const dt__coll_req *r, const dt__gcall *gc, int upto)
{
    if (!gc->cnt)
        return r->c.count * upto;
    int64_t o = 0;
    for (int b = 0; b < upto; b++)
        o += gc->cnt[b];
    return o;
}

#endif /* DT_COLL_INTERNAL_H */
