/* Collectives between the GPU devices of one client: device-to-device copies (peer copies
 * between physical GPUs) and the reduction kernel dt__cuda_combine, queued on the members'
 * streams; nothing is staged through host memory and the host does not wait.
 *
 * Ordering: each member's stream first waits until every member of its group has reached the
 * collective (an event per device), so the sources it reads are complete; afterwards every
 * member's stream waits until every other member is done, so no later work of one device
 * overwrites a buffer another is still reading. Compiled only with CUDA. */
#include "coll_internal.h"

#include <cuda_runtime.h>

static dt_status check(cudaError_t e, const dt__coll_req *r, const dt__device *d)
{
    if (e == cudaSuccess)
        return DT_OK;
    (void)cudaGetLastError();
    return dt__fail(DT_ERR_DEVICE, "%s: on CUDA:%d (GPU %d) failed: %s",
                    dt__coll_kind_name(r->c.kind), d->local_index, d->ordinal,
                    cudaGetErrorString(e));
}

/* Every member's stream waits for every other member's latest `which` event (recorded now). */
static dt_status cross_wait(const dt__coll_req *r, dt__device *const mem[], int k, bool done)
{
    for (int j = 0; j < k; j++) {
        DT_TRY(mem[j]->backend->enter(mem[j]));
        cudaEvent_t ev = (cudaEvent_t)(done ? mem[j]->ev_done : mem[j]->ev_ready);
        DT_TRY(check(cudaEventRecord(ev, (cudaStream_t)mem[j]->kx.stream), r, mem[j]));
    }
    for (int j = 0; j < k; j++) {
        DT_TRY(mem[j]->backend->enter(mem[j]));
        for (int s = 0; s < k; s++)
            if (s != j) {
                cudaEvent_t ev = (cudaEvent_t)(done ? mem[s]->ev_done : mem[s]->ev_ready);
                DT_TRY(
                    check(cudaStreamWaitEvent((cudaStream_t)mem[j]->kx.stream, ev, 0), r, mem[j]));
            }
    }
    return DT_OK;
}

/* Offset (elements) of block `t` in member q's all-to-all send: its blocks for 0..t-1. */
static int64_t a2a_send_off(const dt__coll_req *r, const dt__gcall *gc, int q, int t)
{
    int64_t o = 0;
    for (int b = 0; b < t; b++)
        o += dt__gc_block(r, gc, q, b);
    return o;
}

/* Offset of the block from member s in member q's all-to-all receive. */
static int64_t a2a_recv_off(const dt__coll_req *r, const dt__gcall *gc, int q, int s)
{
    int64_t o = 0;
    for (int b = 0; b < s; b++)
        o += dt__gc_block(r, gc, b, q);
    return o;
}

/* Member j's share of one group's collective, queued on its stream. */
static dt_status member(const dt__coll_req *r, const dt__gcall *gc, dt__device *const mem[], int k,
                        int j)
{
    dt__device *d = mem[j];
    size_t es = r->es;
    const char *const *send = (const char *const *)gc->send;
    char *const *recv = (char *const *)gc->recv;
    dt__combine cb = {.dtype = r->c.dtype,
                      .op = r->c.op == DT_REDUCE_MEAN ? DT_REDUCE_SUM : r->c.op,
                      .by = r->c.op == DT_REDUCE_MEAN ? k : 1,
                      .nsrc = k};
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE: {
        /* Member j reduces chunk j of every source into chunk j of every destination. */
        int64_t n = r->c.count, per = (n + k - 1) / k, off = per * j;
        cb.n = off >= n ? 0 : n - off < per ? n - off : per;
        if (!cb.n)
            return DT_OK;
        cb.ndst = k;
        for (int s = 0; s < k; s++) {
            cb.src[s] = send[s] + off * (int64_t)es;
            cb.dst[s] = recv[s] + off * (int64_t)es;
        }
        return dt__cuda_combine(&d->kx, &cb);
    }
    case DT__COLL_REDUCE_SCATTER: {
        int64_t off = dt__gc_block_off(r, gc, j);
        cb.n = dt__gc_block(r, gc, j, 0);
        if (!cb.n)
            return DT_OK;
        for (int s = 0; s < k; s++)
            cb.src[s] = send[s] + off * (int64_t)es;
        cb.ndst = 1;
        cb.dst[0] = recv[j];
        return dt__cuda_combine(&d->kx, &cb);
    }
    case DT__COLL_ALL_GATHER:
        for (int s = 0; s < k; s++)
            DT_TRY(d->backend->copy(d, recv[j] + dt__gc_block_off(r, gc, s) * (int64_t)es, send[s],
                                    (size_t)dt__gc_block(r, gc, s, 0) * es));
        return DT_OK;
    case DT__COLL_ALL_TO_ALL:
        for (int s = 0; s < k; s++)
            DT_TRY(d->backend->copy(d, recv[j] + a2a_recv_off(r, gc, j, s) * (int64_t)es,
                                    send[s] + a2a_send_off(r, gc, s, j) * (int64_t)es,
                                    (size_t)dt__gc_block(r, gc, s, j) * es));
        return DT_OK;
    case DT__COLL_BROADCAST:
        return d->backend->copy(d, recv[j], send[r->c.root], (size_t)r->c.count * es);
    default:
        return dt__fail(DT_ERR_ARG, "collective: kind %d", (int)r->c.kind);
    }
}

/* Can every group exchange directly (at most DT__COMBINE_MAX members here, peer access)? */
static dt_status cuda_check(const dt__coll_req *r)
{
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    for (int gi = 0; gi < r->num_groups; gi++) {
        const dt__cgroup *g = r->gc[gi].g;
        if (g->num_local > DT__COMBINE_MAX)
            return dt__fail(DT_ERR_UNSUPPORTED,
                            "%s: group %d has %d GPU devices in this client; at most %d exchange "
                            "directly",
                            dt__coll_kind_name(r->c.kind), g->id, g->num_local, DT__COMBINE_MAX);
        for (int a = 0; a < g->num_local; a++)
            for (int b = 0; b < g->num_local; b++) {
                const dt__device *x = devs[g->local[a]], *y = devs[g->local[b]];
                if (!dt__cuda_can_access(x->ordinal, y->ordinal))
                    return dt__fail(DT_ERR_UNSUPPORTED,
                                    "%s: GPU %d cannot access GPU %d (no peer access), so "
                                    "CUDA:%d and CUDA:%d cannot exchange directly; use the nccl "
                                    "algorithm",
                                    dt__coll_kind_name(r->c.kind), x->ordinal, y->ordinal,
                                    x->local_index, y->local_index);
            }
    }
    return DT_OK;
}

/* Queue the collective on the members' streams; the host does not wait. */
static dt_status cuda_start(dt__coll_req *r)
{
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    for (int gi = 0; gi < r->num_groups; gi++) {
        const dt__gcall *gc = &r->gc[gi];
        int k = gc->g->num_local;
        dt__device *mem[DT__COMBINE_MAX];
        for (int j = 0; j < k; j++)
            mem[j] = devs[gc->g->local[j]];
        DT_TRY(cross_wait(r, mem, k, false));
        for (int j = 0; j < k; j++) {
            DT_TRY(mem[j]->backend->enter(mem[j]));
            DT_TRY(member(r, gc, mem, k, j));
        }
        DT_TRY(cross_wait(r, mem, k, true));
    }
    return DT_OK;
}

/* Collectives of a mesh whose backend runs them on its devices (GPUs, not emulated ones). */
static bool cuda_usable(const dt__coll_req *r)
{
    const dt__backend *be = dt__backend_of(r->m->type);
    return be && be->device_collectives;
}

static const dt__transport cuda_transport = {.name = "cuda",
                                             .priority = 30,
                                             .ledger = "cuda",
                                             .algorithm = DT_ALGORITHM_AUTO,
                                             .group_comms = true,
                                             .usable = cuda_usable,
                                             .check = cuda_check,
                                             .start = cuda_start};

__attribute__((constructor)) static void cuda_register(void)
{
    dt__transport_add(&cuda_transport);
}
