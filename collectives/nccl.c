/* NCCL backend for CUDA meshes: one NCCL communicator per (group, local member), made the
 * way llm.c does it: the client holding member 0 makes the unique id and broadcasts it over
 * the group's MPI communicator; all members then init together. Compiled only with CUDA. */
#include "coll_internal.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>

static dt_status nccl_check(ncclResult_t e, const char *what, int group)
{
    if (e == ncclSuccess)
        return DT_OK;
    return dt__fail(DT_ERR_DEVICE, "NCCL: %s for group %d failed: %s", what, group,
                    ncclGetErrorString(e));
}

static ncclDataType_t nccl_type(dt_dtype t)
{
    static const ncclDataType_t types[] = {
        [DT_DTYPE_F32] = ncclFloat32, [DT_DTYPE_F64] = ncclFloat64,   [DT_DTYPE_I32] = ncclInt32,
        [DT_DTYPE_I64] = ncclInt64,   [DT_DTYPE_BF16] = ncclBfloat16, [DT_DTYPE_F16] = ncclFloat16,
        [DT_DTYPE_BOOL] = ncclUint8,  [DT_DTYPE_U8] = ncclUint8,      [DT_DTYPE_I8] = ncclInt8,
    };
    return types[t];
}

static ncclRedOp_t nccl_op(dt_reduce_op op)
{
    static const ncclRedOp_t ops[] = {
        [DT_REDUCE_SUM] = ncclSum, [DT_REDUCE_MEAN] = ncclAvg,  [DT_REDUCE_MAX] = ncclMax,
        [DT_REDUCE_MIN] = ncclMin, [DT_REDUCE_PROD] = ncclProd,
    };
    return ops[op];
}

void dt__nccl_group_free(dt__cgroup *g)
{
    for (int j = 0; g->nccl && j < g->num_local; j++)
        if (g->nccl[j])
            ncclCommDestroy((ncclComm_t)g->nccl[j]);
    for (int j = 0; g->streams && j < g->num_local; j++)
        if (g->streams[j])
            cudaStreamDestroy((cudaStream_t)g->streams[j]);
    free(g->nccl);
    free(g->streams);
    g->nccl = g->streams = NULL;
}

/* Communicators of one group. Collective over the group's clients. */
static dt_status init_group(const dt__coll_req *r, dt__cgroup *g)
{
    if (g->nccl)
        return DT_OK;
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    ncclUniqueId id;
    dt_status s = DT_OK;
    if (g->my_pos == 0)
        s = nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", g->id);
    if (g->num_clients > 1) {
        s = dt__agree(g->comm, s);
        MPI_Request req;
        if (s == DT_OK)
            s = MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, g->comm, &req) == MPI_SUCCESS
                    ? dt__mpi_wait_all(1, &req)
                    : dt__fail(DT_ERR_COMM, "NCCL: broadcast of the unique id failed");
    }
    DT_TRY(s);
    g->nccl = calloc((size_t)g->num_local, sizeof *g->nccl);
    g->streams = calloc((size_t)g->num_local, sizeof *g->streams);
    if (!g->nccl || !g->streams) {
        dt__nccl_group_free(g);
        return dt__fail(DT_ERR_NOMEM, "NCCL: out of memory");
    }
    int G = r->mask->size;
    ncclGroupStart();
    for (int j = 0; j < g->num_local; j++) {
        cudaSetDevice(devs[g->local[j]]->ordinal);
        cudaStream_t st;
        if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess)
            g->streams[j] = st;
        ncclComm_t c = NULL;
        ncclCommInitRank(&c, G, id, g->first_rank + j);
        g->nccl[j] = c;
    }
    s = nccl_check(ncclGroupEnd(), "ncclCommInitRank", g->id);
    for (int j = 0; s == DT_OK && j < g->num_local; j++)
        if (!g->streams[j] || !g->nccl[j])
            s = dt__fail(DT_ERR_DEVICE, "NCCL: no communicator or stream for member %d of group %d",
                         g->first_rank + j, g->id);
    if (s != DT_OK)
        dt__nccl_group_free(g);
    return s;
}

static int64_t off_of(const dt__coll_req *r, const dt__gcall *gc, int upto)
{
    int64_t o = 0;
    for (int b = 0; b < upto; b++)
        o += dt__gc_block(r, gc, b, 0);
    return o;
}

/* Enqueue one member's share. */
static ncclResult_t enqueue(const dt__coll_req *r, const dt__gcall *gc, int j)
{
    ncclComm_t comm = (ncclComm_t)gc->g->nccl[j];
    cudaStream_t st = (cudaStream_t)gc->g->streams[j];
    ncclDataType_t t = nccl_type(r->c.dtype);
    size_t es = r->es, n = (size_t)r->c.count;
    int G = r->mask->size, q = gc->g->first_rank + j;
    const char *send = gc->send[j];
    char *recv = gc->recv[j];
    ncclResult_t e = ncclSuccess;
    switch (r->c.kind) {
    case DT__COLL_ALL_REDUCE:
        return ncclAllReduce(send, recv, n, t, nccl_op(r->c.op), comm, st);
    case DT__COLL_ALL_GATHER:
        if (!gc->cnt)
            return ncclAllGather(send, recv, n, t, comm, st);
        for (int b = 0; b < G && e == ncclSuccess; b++) {
            char *dst = recv + off_of(r, gc, b) * (int64_t)es;
            e = ncclBroadcast(b == q ? (const void *)send : dst, dst,
                              (size_t)dt__gc_block(r, gc, b, 0), t, b, comm, st);
        }
        return e;
    case DT__COLL_REDUCE_SCATTER:
        if (!gc->cnt)
            return ncclReduceScatter(send, recv, n, t, nccl_op(r->c.op), comm, st);
        for (int b = 0; b < G && e == ncclSuccess; b++)
            e = ncclReduce(send + off_of(r, gc, b) * (int64_t)es, recv,
                           (size_t)dt__gc_block(r, gc, b, 0), t, nccl_op(r->c.op), b, comm, st);
        return e;
    case DT__COLL_ALL_TO_ALL: {
        int64_t so = 0, ro = 0;
        for (int b = 0; b < G && e == ncclSuccess; b++) {
            int64_t ns = dt__gc_block(r, gc, q, b), nr = dt__gc_block(r, gc, b, q);
            e = ncclSend(send + so * (int64_t)es, (size_t)ns, t, b, comm, st);
            if (e == ncclSuccess)
                e = ncclRecv(recv + ro * (int64_t)es, (size_t)nr, t, b, comm, st);
            so += ns;
            ro += nr;
        }
        return e;
    }
    case DT__COLL_BROADCAST:
        return ncclBroadcast(q == r->c.root ? (const void *)send : recv, recv, n, t, r->c.root,
                             comm, st);
    default:
        return ncclInvalidArgument;
    }
}

dt_status dt__nccl_run(dt__coll_req *r)
{
    for (int gi = 0; gi < r->num_groups; gi++)
        DT_TRY(init_group(r, r->gc[gi].g));
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    ncclGroupStart();
    ncclResult_t e = ncclSuccess;
    for (int gi = 0; gi < r->num_groups && e == ncclSuccess; gi++) {
        const dt__gcall *gc = &r->gc[gi];
        for (int j = 0; j < gc->g->num_local && e == ncclSuccess; j++) {
            cudaSetDevice(devs[gc->g->local[j]]->ordinal);
            e = enqueue(r, gc, j);
        }
    }
    ncclResult_t end = ncclGroupEnd();
    DT_TRY(nccl_check(e != ncclSuccess ? e : end, dt__coll_kind_name(r->c.kind),
                      r->num_groups ? r->gc[0].g->id : 0));
    /* Complete with a yielding poll, like the MPI waits. */
    for (int gi = 0; gi < r->num_groups; gi++) {
        const dt__gcall *gc = &r->gc[gi];
        for (int j = 0; j < gc->g->num_local; j++) {
            cudaStream_t st = (cudaStream_t)gc->g->streams[j];
            cudaError_t q;
            while ((q = cudaStreamQuery(st)) == cudaErrorNotReady)
                sched_yield();
            if (q != cudaSuccess)
                return dt__fail(DT_ERR_DEVICE, "NCCL: %s on group %d failed: %s",
                                dt__coll_kind_name(r->c.kind), gc->g->id, cudaGetErrorString(q));
        }
    }
    return DT_OK;
}
