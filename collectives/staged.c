/* Collectives through host memory for devices whose memory host code cannot touch (GPUs, and
 * emulated GPUs), in groups that span clients where NCCL cannot run: clients sharing a GPU
 * (NCCL refuses two ranks on one GPU) or GPUs emulated on the host. Each local device's
 * buffers are copied to host memory (the backend's to_host, through its pinned staging), the
 * host path (shared memory inside the client, MPI across clients) runs on the copies, and the
 * received buffers are copied back (to_device). The ledger names the backend
 * "mpi (host-staged)" or "hierarchical (host-staged)".
 *
 * bf16 and f16 sums, means and products are staged as f32 and rounded once on the way back,
 * as the device collectives and the in-client combine round them (a reduction across clients
 * of the 16-bit values themselves would round at every step of MPI's tree). */
#include "coll_internal.h"
#include "convert.h"

#include <stdlib.h>
#include <string.h>

struct dt__coll_stage {
    int n;
    char **send, **recv; /* host copies per local device (send may alias recv, or be NULL) */
    const void **send_ptrs;
    void **recv_ptrs;
    void *const *dev_recv; /* the caller's device buffers */
    size_t *recv_bytes;    /* as the device holds them */
    dt_dtype widened;      /* the 16-bit dtype staged as f32, or DT_DTYPE_F32 when none */
    void *half;            /* the 16-bit values on their way through the host */
};

/* 16-bit float reductions whose every step would round: staged in f32. */
static bool widen(const dt__coll_req *r)
{
    return (r->c.dtype == DT_DTYPE_BF16 || r->c.dtype == DT_DTYPE_F16) &&
           (r->c.kind == DT__COLL_ALL_REDUCE || r->c.kind == DT__COLL_REDUCE_SCATTER) &&
           r->c.op != DT_REDUCE_MAX && r->c.op != DT_REDUCE_MIN;
}

static void to_f32(dt_dtype t, float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = t == DT_DTYPE_BF16 ? dt__bf16_to_f32(src[i]) : dt__f16_to_f32(src[i]);
}

static void from_f32(dt_dtype t, uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = t == DT_DTYPE_BF16 ? dt__f32_to_bf16(src[i]) : dt__f32_to_f16(src[i]);
}

/* Devices whose memory host code cannot touch, in groups spanning clients without device
 * collectives (the device transport comes first: here clients share GPUs, or the GPUs are
 * emulated without its emulation). */
static bool stage_needed(const dt__coll_req *r)
{
    const dt__backend *be = dt__backend_of(r->m->type);
    if (!be || be->host_accessible)
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
    free(st->half);
    free(st);
}

/* Copy each local device's buffers to host memory and point r->c at the copies, so that the
 * host path runs on them. */
static dt_status stage_in(dt__coll_req *r)
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
    bool wide = widen(r);
    size_t es = r->es, hs = wide ? sizeof(float) : es; /* on the device, on the host */
    st->widened = wide ? r->c.dtype : DT_DTYPE_F32;
    dt_status s = DT_OK;
    for (int i = 0; s == DT_OK && i < n; i++) {
        int64_t ns, nr;
        if (!elems(r, i, &ns, &nr)) {
            dt__coll_stage_free(st);
            return DT_OK; /* unstaged: the plan's validation fails this call */
        }
        const void *snd = r->c.send ? r->c.send[i] : NULL;
        size_t sb = (size_t)ns * hs, rb = (size_t)nr * hs;
        st->recv[i] = malloc(rb ? rb : 1);
        st->send[i] = snd == r->c.recv[i] ? st->recv[i] : snd ? malloc(sb ? sb : 1) : NULL;
        if (!st->recv[i] || (snd && !st->send[i])) {
            s = dt__fail(DT_ERR_NOMEM, "%s: no host staging for %zu bytes",
                         dt__coll_kind_name(r->c.kind), sb + rb);
            break;
        }
        st->recv_bytes[i] = (size_t)nr * es;
        size_t count = (size_t)(snd == r->c.recv[i] ? nr : ns);
        if (snd && !wide)
            s = devs[i]->backend->to_host(devs[i], st->send[i], snd, count * es);
        if (snd && wide) { /* through 16-bit host memory into f32 */
            void *half = realloc(st->half, count * es + 1);
            s = half ? devs[i]->backend->to_host(devs[i], half, snd, count * es)
                     : dt__fail(DT_ERR_NOMEM, "%s: no host staging for %zu bytes",
                                dt__coll_kind_name(r->c.kind), count * es);
            st->half = half ? half : st->half;
            if (s == DT_OK)
                to_f32(st->widened, (float *)st->send[i], half, count);
        }
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
    if (wide) { /* the host path reduces f32 */
        r->c.dtype = DT_DTYPE_F32;
        r->es = sizeof(float);
    }
    r->stage = st;
    return DT_OK;
}

/* Copy the received ones back. */
static dt_status stage_out(dt__coll_req *r)
{
    dt__coll_stage *st = r->stage;
    dt__device *const *devs = dt__mesh_local_devices(r->m);
    dt_status s = DT_OK;
    bool wide = st && st->widened != DT_DTYPE_F32;
    for (int i = 0; st && s == DT_OK && i < st->n; i++) {
        const void *out = st->recv[i];
        if (wide) { /* rounded once, from the f32 result */
            void *half = realloc(st->half, st->recv_bytes[i] + 1);
            if (!half)
                return dt__fail(DT_ERR_NOMEM, "%s: no host staging for %zu bytes",
                                dt__coll_kind_name(r->c.kind), st->recv_bytes[i]);
            st->half = half;
            from_f32(st->widened, half, (const float *)st->recv[i], st->recv_bytes[i] / 2);
            out = half;
        }
        s = devs[i]->backend->to_device(devs[i], st->dev_recv[i], out, st->recv_bytes[i]);
    }
    if (wide) /* the ledger records the collective's own dtype */
        r->c.dtype = st->widened;
    return s;
}

/* The host path on the copies, then the copies back. */
static dt_status staged_finish(dt__coll_req *r)
{
    dt__coll_local_post(r);
    return stage_out(r);
}

static const dt__transport staged_transport = {.name = "staged",
                                               .priority = 20,
                                               .group_comms = true,
                                               .usable = stage_needed,
                                               .prepare = stage_in,
                                               .start = dt__coll_mpi_start,
                                               .progress = dt__coll_mpi_progress,
                                               .finish = staged_finish};

__attribute__((constructor)) static void staged_register(void)
{
    dt__transport_add(&staged_transport);
}
