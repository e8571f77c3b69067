/* Collectives through host memory for devices whose memory host code cannot touch (GPUs, and
 * emulated GPUs), in groups that span clients where NCCL cannot run: clients sharing a GPU
 * (NCCL refuses two ranks on one GPU) or GPUs emulated on the host. Each local device's
 * buffers are copied to host memory (the backend's to_host, through its pinned staging), the
 * host path (shared memory inside the client, MPI across clients) runs on the copies, and the
 * received buffers are copied back (to_device). The ledger names the backend
 * "mpi (host-staged)" or "hierarchical (host-staged)". */
#include "coll_internal.h"

#include <stdlib.h>
#include <string.h>

struct dt__coll_stage {
    int n;
    char **send, **recv; /* host copies per local device (send may alias recv, or be NULL) */
    const void **send_ptrs;
    void **recv_ptrs;
    void *const *dev_recv; /* the caller's device buffers */
    size_t *recv_bytes;
};

bool dt__coll_needs_stage(const dt__coll_req *r, bool nccl_possible)
{
    const dt__backend *be = dt__backend_of(r->m->type);
    if (!be || be->host_accessible || nccl_possible)
        return false;
    for (int gi = 0; gi < r->mask->num_groups; gi++)
        if (r->mask->groups[gi].num_clients > 1)
            return true;
    return false;
}

/* Elements local device i sends and receives (false for counts no group would accept: the
 * plan's validation then names them). */
static bool elems(const dt__coll_req *r, int i, int64_t *ns, int64_t *nr)
{
    const dt__coll *c = &r->c;
    int g = dt__group_size(r->m, c->axes),
        me = dt__group_rank(r->m, c->axes, r->m->first_local + i);
    const int64_t *cnt = c->counts ? c->counts[i] : NULL;
    int64_t all = 0, in = 0, out = 0;
    if (me < 0 || me >= g)
        return false;
    if (cnt) {
        int n = c->kind == DT__COLL_ALL_TO_ALL ? g * g : g;
        for (int k = 0; k < n; k++) {
            if (cnt[k] < 0 || cnt[k] > ((int64_t)1 << 50))
                return false;
            all += cnt[k];
        }
        if (c->kind == DT__COLL_ALL_TO_ALL)
            for (int k = 0; k < g; k++) {
                out += cnt[me * g + k];
                in += cnt[k * g + me];
            }
    }
    int64_t n = c->count, mine = cnt ? cnt[me] : n, whole = cnt ? all : (int64_t)g * n;
    switch (c->kind) {
    case DT__COLL_ALL_GATHER:
        *ns = mine;
        *nr = whole;
        break;
    case DT__COLL_REDUCE_SCATTER:
        *ns = whole;
        *nr = mine;
        break;
    case DT__COLL_ALL_TO_ALL:
        *ns = cnt ? out : whole;
        *nr = cnt ? in : whole;
        break;
    default: /* all-reduce, broadcast */
        *ns = *nr = n;
        break;
    }
    return *ns >= 0 && *nr >= 0;
}

void dt__coll_stage_free(dt__coll_stage *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n; i++) {
        if (st->send[i] != st->recv[i])
            free(st->send[i]);
        free(st->recv[i]);
    }
    free(st->send);
    free(st->recv);
    free(st->send_ptrs);
    free(st->recv_ptrs);
    free(st->recv_bytes);
    free(st);
}

dt_status dt__coll_stage_in(dt__coll_req *r)
{
    int n = r->m->num_local;
    dt__coll_stage *st = calloc(1, sizeof *st);
    if (st) {
        st->n = n;
        st->send = calloc((size_t)n + 1, sizeof *st->send);
        st->recv = calloc((size_t)n + 1, sizeof *st->recv);
        st->send_ptrs = calloc((size_t)n + 1, sizeof *st->send_ptrs);
        st->recv_ptrs = calloc((size_t)n + 1, sizeof *st->recv_ptrs);
        st->recv_bytes = calloc((size_t)n + 1, sizeof *st->recv_bytes);
    }
    if (!st || !st->send || !st->recv || !st->send_ptrs || !st->recv_ptrs || !st->recv_bytes) {
        dt__coll_stage_free(st);
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory for host staging",
                        dt__coll_kind_name(r->c.kind));
    }
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < n; i++) {
        int64_t ns, nr;
        if (!elems(r, i, &ns, &nr)) {
            dt__coll_stage_free(st);
            return DT_OK; /* unstaged: the plan's validation fails this call */
        }
        const void *snd = r->c.send ? r->c.send[i] : NULL;
        size_t sb = (size_t)ns * r->es, rb = (size_t)nr * r->es;
        st->recv[i] = malloc(rb ? rb : 1);
        st->send[i] = snd == r->c.recv[i] ? st->recv[i] : snd ? malloc(sb ? sb : 1) : NULL;
        if (!st->recv[i] || (snd && !st->send[i])) {
            s = dt__fail(DT_ERR_NOMEM, "%s: no host staging for %zu bytes",
                         dt__coll_kind_name(r->c.kind), sb + rb);
            break;
        }
        st->recv_bytes[i] = rb;
        if (snd)
            s = devs[i]->backend->to_host(devs[i], st->send[i], snd, snd == r->c.recv[i] ? rb : sb);
        st->send_ptrs[i] = st->send[i];
        st->recv_ptrs[i] = st->recv[i];
    }
    if (s != DT_OK) {
        dt__coll_stage_free(st);
        return s;
    }
    st->dev_recv = r->c.recv;
    r->c.send = r->c.send ? st->send_ptrs : NULL;
    r->c.recv = st->recv_ptrs;
    r->stage = st;
    return DT_OK;
}

dt_status dt__coll_stage_out(dt__coll_req *r)
{
    dt__coll_stage *st = r->stage;
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    dt_status s = DT_OK;
    for (int i = 0; st && s == DT_OK && i < st->n; i++)
        s = devs[i]->backend->to_device(devs[i], st->dev_recv[i], st->recv[i], st->recv_bytes[i]);
    return s;
}
