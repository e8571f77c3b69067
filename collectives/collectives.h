/* The collectives interface used by the executor (internal; ARCHITECTURE.md "Collectives").
 *
 * A collective runs over *groups* of a mesh: for an axis mask, the group of device d is every
 * device with d's coordinates on the mesh axes outside the mask. The member rank of d in its
 * group is the row-major index of d's coordinates on the masked axes (mesh axis order). For
 * mask = {x} on a 3x2 mesh the groups are {0,2,4} and {1,3,5}; device 4 is member 2 of the
 * first.
 *
 * One call handles every local device of this client at once: buffers come per local device
 * (mesh local index), each device's group is implied by the mask. Every client of the mesh
 * calls it, in the same order, with the same metadata (Collective).
 */
#ifndef DT_COLLECTIVES_H
#define DT_COLLECTIVES_H

#include "dt.h"

/* X(NAME, name) */
#define DT__COLL_KIND_LIST(X)         \
    X(ALL_REDUCE, all_reduce)         \
    X(ALL_GATHER, all_gather)         \
    X(REDUCE_SCATTER, reduce_scatter) \
    X(ALL_TO_ALL, all_to_all)         \
    X(BROADCAST, broadcast)

typedef enum dt__coll_kind {
#define DT__COLL_ENUM(NAME, name) DT__COLL_##NAME,
    DT__COLL_KIND_LIST(DT__COLL_ENUM)
#undef DT__COLL_ENUM
        DT__COLL_KIND_COUNT
} dt__coll_kind;

const char *dt__coll_kind_name(dt__coll_kind k);

/* acc[i] = acc[i] op src[i] on host memory, for every dtype (bf16 and f16 in f32, rounded):
 * the collectives' own element loop, also what reading a partial tensor sums with. */
void dt__coll_reduce(dt_dtype t, dt_reduce_op op, void *acc, const void *src, size_t n);

/* Under DT_ALGORITHM_AUTO, cross-client all-reduce and reduce-scatter of at least this many
 * bytes go around a ring of point-to-point messages (it beats MPICH's algorithm from here on
 * this machine kind: benchmarks/bench_collectives sweep at -n 2). */
#define DT__RING_MIN_BYTES ((int64_t)8 << 20)

/* Element counts and buffer sizes (g = group size, r = member rank):
 *   all-reduce      send, recv: count                   (no uneven form; send may == recv)
 *   all-gather      send: count, recv: g*count          recv holds member blocks in rank order
 *   reduce-scatter  send: g*count, recv: count          member r gets block r reduced
 *   all-to-all      send, recv: g*count                 block s of member r's recv = block r
 *                                                       of member s's send
 *   broadcast       send (root only), recv: count       every member gets the root's send
 * Uneven (v) forms: `counts` non-NULL, counts[i] for local device i, one array every member of
 * its group passes alike:
 *   all-gather:     counts[i][r]     elements member r contributes; recv is their
 *                                    concatenation in rank order
 *   reduce-scatter: counts[i][r]     elements of block r; send is the concatenation
 *   all-to-all:     counts[i][s*g+r] elements member s sends to member r; send of member s is
 *                                    its blocks for r = 0..g-1 concatenated, recv of member r
 *                                    is blocks from s = 0..g-1 concatenated
 * Zero counts are valid everywhere. */
typedef struct dt__coll {
    dt__coll_kind kind;
    dt_dtype dtype;
    dt_reduce_op op; /* all-reduce, reduce-scatter */
    unsigned axes;   /* mesh axis mask of the groups; 0 means groups of one device */
    int root;        /* broadcast: member rank of the root in every group */
    dt_collective_algorithm algorithm; /* DT_ALGORITHM_AUTO: the mesh's setting */
    const char *cause;       /* the global op that caused it, for the ledger; may be NULL */
    const void *const *send; /* send[i]: device buffer of local device i */
    void *const *recv;       /* recv[i] */
    int64_t count;
    const int64_t *const *counts;
    /* All-gather and all-to-all of groups inside one client on host-accessible devices, or
     * NULL: boxes[i][s] is the box of member s's send buffer that local device i's recv buffer
     * takes (strided on both sides; src_at and dst_at in elements), so that shards move
     * straight between the operand's and the result's layouts, with no packing. */
    const dt__block *const *boxes;
} dt__coll;

/* Run one collective to completion. Collective. */
dt_status dt__collective(const dt_mesh *m, const dt__coll *c);

/* Start one and complete it later, so that communication can overlap compute. Buffers must
 * stay valid until the wait returns. Collective (the start; every client waits too). */
typedef struct dt__coll_req dt__coll_req;
dt_status dt__collective_start(const dt_mesh *m, const dt__coll *c, dt__coll_req **out);
dt_status dt__collective_wait(dt__coll_req *r);
/* Advance a started collective without blocking (MPI_Test, the next round of a ring or of the
 * by-host steps), so that it progresses while the caller computes; true once it is complete
 * (the wait then returns at once). A failure is kept for the wait. Device collectives progress
 * on their own: false. This client only. */
bool dt__collective_test(dt__coll_req *r);

/* How groups spanning hosts choose the by-host path (collectives/hosts.c): 0 never, 1 always
 * where it applies, 2 by the cost model (the default; dt_init sets it from
 * DTENSOR_COLLECTIVES_BY_HOST=0, 1 or auto). For benchmarks; every client sets it alike. */
void dt__coll_set_by_host(int mode);

/* The gather of dt_tensor_read across clients: client c's cnt[c] elements of `elem` (es
 * bytes) at displ[c] of all, this client's already in place, into all on every client; by
 * host where the clients span hosts with company and the cost model says so, else one MPI
 * all-gather. Collective over every client. */
dt_status dt__coll_gather_clients(const dt_mesh *m, void *all, const int cnt[], const int displ[],
                                  MPI_Datatype elem, size_t es);

/* Group arithmetic shared by the expansion engine and the backends. */
int dt__group_size(const dt_mesh *m, unsigned axes);
int dt__group_rank(const dt_mesh *m, unsigned axes, int device);
/* Global device id of member `rank` of the group containing `device`. */
int dt__group_member(const dt_mesh *m, unsigned axes, int device, int rank);

#endif /* DT_COLLECTIVES_H */
