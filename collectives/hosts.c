/* By host: a group whose clients span several hosts, some host holding two or more of them,
 * combines inside each host first (MPI among the clients of one host goes through shared
 * memory), then crosses between the hosts with one client each (the host's leader: its first
 * client in the group), then spreads inside each host. Only one leader per host sends over the
 * network, and every byte crosses between hosts once per host instead of once per client.
 *
 *   all-reduce      reduce to the leader | all-reduce among leaders     | broadcast
 *   reduce-scatter  reduce to the leader | reduce-scatter among leaders | scatter the segments
 *                                          (a part per host)
 *   all-gather      gather to the leader | all-gather among leaders     | broadcast
 *   broadcast       the root's host      | leaders, from the root's one | the other hosts
 *   all-to-all      never: nothing combines, every byte would cross the host twice more
 *
 * Where a host's clients are not consecutive in the group (clients placed on the hosts in
 * turn), the leaders' step works on the blocks arranged host after host, packed and unpacked
 * around it. Every step is one nonblocking MPI call on communicators made once per group
 * (dt__hosts_build); gc->phase is the next step. dt__hosts_choose holds the cost model. */
#include "coll_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- structure ----------------------------------------------------------------------------- */

void dt__hosts_free(dt__hosts *h)
{
    if (!h)
        return;
    if (h->hcomm != MPI_COMM_NULL)
        MPI_Comm_free(&h->hcomm);
    if (h->lcomm != MPI_COMM_NULL)
        MPI_Comm_free(&h->lcomm);
    free(h->host_first);
    free(h->host_order);
    free(h);
}

/* A communicator over ranks[0..n) of parent, made by those ranks alone. */
static dt_status sub_comm(MPI_Comm parent, const int ranks[], int n, int tag, MPI_Comm *out)
{
    MPI_Group all = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
    int e = MPI_Comm_group(parent, &all);
    if (e == MPI_SUCCESS)
        e = MPI_Group_incl(all, n, ranks, &sub);
    if (e == MPI_SUCCESS)
        e = MPI_Comm_create_group(parent, sub, tag, out);
    if (sub != MPI_GROUP_NULL)
        MPI_Group_free(&sub);
    if (all != MPI_GROUP_NULL)
        MPI_Group_free(&all);
    return e == MPI_SUCCESS ? DT_OK
                            : dt__fail(DT_ERR_COMM,
                                       "collectives: cannot create a communicator of %d clients "
                                       "for the by-host path",
                                       n);
}

dt_status dt__hosts_build(const int clients[], int n, int me, dt__hosts **out)
{
    *out = NULL;
    int *host = malloc(sizeof(int) * (size_t)n), *key = malloc(sizeof(int) * (size_t)n);
    dt__hosts *h = calloc(1, sizeof *h);
    dt_status s = DT_OK;
    if (!host || !key || !h) {
        s = dt__fail(DT_ERR_NOMEM, "collectives: out of memory for the hosts of %d clients", n);
        goto done;
    }
    h->hcomm = h->lcomm = MPI_COMM_NULL;
    /* hosts numbered in the order of their first client */
    int nh = 0, most = 0;
    for (int c = 0; c < n; c++) {
        key[c] = dt__host_of(clients[c]);
        host[c] = -1;
        for (int p = 0; p < c && host[c] < 0; p++)
            if (key[p] == key[c])
                host[c] = host[p];
        if (host[c] < 0)
            host[c] = nh++;
    }
    if (nh < 2 || key[0] < 0)
        goto done; /* one host (or no channel): shared memory already serves the group */
    h->num_hosts = nh;
    h->host_first = calloc((size_t)nh + 1, sizeof(int));
    h->host_order = malloc(sizeof(int) * (size_t)n);
    if (!h->host_first || !h->host_order) {
        s = dt__fail(DT_ERR_NOMEM, "collectives: out of memory for the hosts of %d clients", n);
        goto done;
    }
    for (int c = 0; c < n; c++)
        h->host_first[host[c] + 1]++;
    for (int j = 0; j < nh; j++) {
        most = h->host_first[j + 1] > most ? h->host_first[j + 1] : most;
        h->host_first[j + 1] += h->host_first[j];
    }
    if (most < 2)
        goto done;   /* a client per host: nothing to combine inside a host */
    int *fill = key; /* reused: the next free place of each host */
    for (int j = 0; j < nh; j++)
        fill[j] = h->host_first[j];
    h->host_major = true;
    for (int c = 0; c < n; c++) {
        h->host_major &= fill[host[c]] == c;
        h->host_order[fill[host[c]]++] = c;
    }
    h->my_host = host[me];
    int first = h->host_first[h->my_host];
    h->host_size = h->host_first[h->my_host + 1] - first;
    for (int i = 0; i < h->host_size; i++)
        if (h->host_order[first + i] == me)
            h->host_rank = i;
    *out = h;
    h = NULL;
done:
    dt__hosts_free(h);
    free(host);
    free(key);
    return s;
}

dt_status dt__hosts_connect(dt__hosts *h, MPI_Comm parent, const int clients[], int tag)
{
    int *ranks =
        malloc(sizeof(int) * (size_t)(h->host_size > h->num_hosts ? h->host_size : h->num_hosts));
    if (!ranks)
        return dt__fail(DT_ERR_NOMEM, "collectives: out of memory");
    dt_status s = DT_OK;
    /* every client of the set makes its host's communicator, then the leaders theirs */
    int first = h->host_first[h->my_host];
    for (int i = 0; i < h->host_size; i++)
        ranks[i] = clients[h->host_order[first + i]];
    if (h->host_size > 1 && h->hcomm == MPI_COMM_NULL)
        s = sub_comm(parent, ranks, h->host_size, tag, &h->hcomm);
    if (s == DT_OK && h->host_rank == 0 && h->lcomm == MPI_COMM_NULL) {
        for (int j = 0; j < h->num_hosts; j++)
            ranks[j] = clients[h->host_order[h->host_first[j]]];
        s = sub_comm(parent, ranks, h->num_hosts, tag + 1, &h->lcomm);
    }
    free(ranks);
    return s;
}

/* ---- when ---------------------------------------------------------------------------------- */

/* The α-β cost model of the choice (seconds per message, seconds per byte): MPICH between
 * hosts over UCX's TCP transport and inside a host over shared memory, from a ping-pong
 * between two clients of one network-namespace host and of two (what `bench_collectives
 * hosts` prints as its calibration lines) on this project's 2-core machine, moderately loaded
 * (README "Running on several hosts"). There, both ways are memory copies by the same 2 cores,
 * so the host's shared memory saves latency but little bandwidth, and the model takes the
 * by-host path for small messages only. */
#define DT__NET_ALPHA 12e-6
#define DT__NET_BETA (1.0 / 1.1e9)
#define DT__SHM_ALPHA 3e-6
#define DT__SHM_BETA (1.0 / 1.5e9)

static int mode = 2; /* 0 never, 1 always, 2 auto: DTENSOR_COLLECTIVES_BY_HOST */

void dt__coll_set_by_host(int m)
{
    mode = m;
}

dt_status dt__hosts_configure(void)
{
    const char *e = getenv("DTENSOR_COLLECTIVES_BY_HOST");
    mode = 2;
    if (!e || !*e || strcmp(e, "auto") == 0)
        return DT_OK;
    if (strcmp(e, "0") == 0 || strcmp(e, "1") == 0) {
        mode = *e - '0';
        return DT_OK;
    }
    return dt__fail(DT_ERR_ARG,
                    "dt_init: DTENSOR_COLLECTIVES_BY_HOST=\"%.64s\" is not 0, 1 or auto", e);
}

/* Steps of a tree or recursive doubling over n. */
static double steps(int n)
{
    return n > 1 ? ceil(log2((double)n)) : 0;
}

bool dt__hosts_choose(dt__coll_kind kind, dt_collective_algorithm a, const dt__hosts *h,
                      int clients, int64_t bytes)
{
    int m = mode;
    if (!h || kind == DT__COLL_ALL_TO_ALL || m == 0 ||
        (a != DT_ALGORITHM_AUTO && a != DT_ALGORITHM_HIERARCHICAL_COPY))
        return false;
    if (m == 1 || a == DT_ALGORITHM_HIERARCHICAL_COPY)
        return true;
    /* flat: every step may cross hosts; by host: the host's steps on shared memory, the
     * leaders' among h hosts. p clients, at most c on one host, B bytes. */
    int c = 0;
    for (int j = 0; j < h->num_hosts; j++)
        c = h->host_first[j + 1] - h->host_first[j] > c ? h->host_first[j + 1] - h->host_first[j]
                                                        : c;
    double p = clients, H = h->num_hosts, B = (double)bytes, flat, hosts;
    double in_host = steps(c) * DT__SHM_ALPHA, between = steps(h->num_hosts) * DT__NET_ALPHA;
    switch (kind) {
    case DT__COLL_ALL_REDUCE: /* reduce + broadcast in the host, all-reduce between */
        flat = steps(clients) * DT__NET_ALPHA + 2 * (p - 1) / p * B * DT__NET_BETA;
        hosts = 2 * (in_host + B * DT__SHM_BETA) + between + 2 * (H - 1) / H * B * DT__NET_BETA;
        break;
    case DT__COLL_REDUCE_SCATTER: /* reduce the whole, scatter a host's part */
        flat = steps(clients) * DT__NET_ALPHA + (p - 1) / p * B * DT__NET_BETA;
        hosts = 2 * in_host + (B + B / H) * DT__SHM_BETA + between + (H - 1) / H * B * DT__NET_BETA;
        break;
    case DT__COLL_ALL_GATHER: /* gather a host's part, broadcast the whole */
        flat = steps(clients) * DT__NET_ALPHA + (p - 1) / p * B * DT__NET_BETA;
        hosts = 2 * in_host + (B / H + B) * DT__SHM_BETA + between + (H - 1) / H * B * DT__NET_BETA;
        break;
    default: /* broadcast: a binomial tree, each step the whole message */
        flat = steps(clients) * (DT__NET_ALPHA + B * DT__NET_BETA);
        hosts = 2 * steps(c) * (DT__SHM_ALPHA + B * DT__SHM_BETA) +
                steps(h->num_hosts) * (DT__NET_ALPHA + B * DT__NET_BETA);
        break;
    }
    return hosts < flat;
}

/* ---- the steps ----------------------------------------------------------------------------- */

/* Counts (elements, as MPI takes them) in gc->mc: per host, then per client of this host. */
#define H_COUNTS(gc) ((gc)->mc)
#define H_DISPLS(gc, h) ((gc)->mc + (h)->num_hosts)
#define M_COUNTS(gc, h) ((gc)->mc + 2 * (h)->num_hosts)
#define M_DISPLS(gc, h) ((gc)->mc + 2 * (h)->num_hosts + (h)->host_size)

/* The group's blocks (member order, seg[] per client) to host after host, or back. */
static void arrange(const dt__coll_req *r, const dt__gcall *gc, char *host_major,
                    char *member_order, bool to_hosts)
{
    const dt__hosts *h = gc->g->hosts;
    size_t es = r->es, at = 0;
    for (int i = 0; i < h->host_first[h->num_hosts]; i++) {
        int c = h->host_order[i];
        size_t len = (size_t)(gc->seg[c + 1] - gc->seg[c]) * es;
        char *m = member_order + (size_t)gc->seg[c] * es;
        if (len)
            memcpy(to_hosts ? host_major + at : m, to_hosts ? m : host_major + at, len);
        at += len;
    }
}

/* Reduce-scatter on a leader: the host's sum of the group's send buffer (in the group's own
 * staging when several local devices combined there, else in hbuf; the client's send buffer
 * itself when it is alone on its host), then that sum host after host (hbuf), then the host's
 * part of the result (hbuf). */
static bool sum_apart(const dt__gcall *gc)
{
    return gc->g->hosts->host_size > 1 && gc->g->num_local == 1;
}

static char *rs_sum(const dt__gcall *gc)
{
    return sum_apart(gc) ? gc->hbuf : gc->xin;
}

static char *rs_arranged(const dt__coll_req *r, const dt__gcall *gc)
{
    return gc->hbuf + (sum_apart(gc) ? (size_t)gc->total * r->es : 0);
}

static char *rs_part(const dt__coll_req *r, const dt__gcall *gc)
{
    return rs_arranged(r, gc) + (gc->g->hosts->host_major ? 0 : (size_t)gc->total * r->es);
}

dt_status dt__hosts_setup(dt__coll_req *r, dt__gcall *gc)
{
    const dt__hosts *h = gc->g->hosts;
    bool leader = h->host_rank == 0;
    int first = h->host_first[h->my_host], at = 0;
    /* per host: its clients' elements, host after host (the leaders' step) */
    for (int j = 0; j < h->num_hosts; j++) {
        int n = 0;
        for (int i = h->host_first[j]; i < h->host_first[j + 1]; i++)
            n += (int)(gc->seg[h->host_order[i] + 1] - gc->seg[h->host_order[i]]);
        H_COUNTS(gc)[j] = n;
        H_DISPLS(gc, h)[j] = h->host_major ? (int)gc->seg[h->host_order[h->host_first[j]]] : at;
        at += n;
    }
    /* per client of this host: its elements, where the gather puts them (its place in the
     * group's buffer) or where the scatter takes them (its place in the host's part) */
    for (int i = 0, in_part = 0; i < h->host_size; i++) {
        int c = h->host_order[first + i];
        M_COUNTS(gc, h)[i] = (int)(gc->seg[c + 1] - gc->seg[c]);
        M_DISPLS(gc, h)[i] = r->c.kind == DT__COLL_REDUCE_SCATTER ? in_part : (int)gc->seg[c];
        in_part += M_COUNTS(gc, h)[i];
    }
    size_t es = r->es, total = (size_t)gc->total * es, need = 0;
    if (leader && r->c.kind == DT__COLL_REDUCE_SCATTER)
        need = (sum_apart(gc) ? total : 0) + (h->host_major ? 0 : total) +
               (size_t)H_COUNTS(gc)[h->my_host] * es;
    if (leader && r->c.kind == DT__COLL_ALL_GATHER && !h->host_major)
        need = total;
    if (need && !(gc->hbuf = malloc(need)))
        return dt__fail(DT_ERR_NOMEM, "%s: cannot allocate %zu bytes for the by-host path",
                        dt__coll_kind_name(r->c.kind), need);
    gc->phase = 0;
    return DT_OK;
}

/* The group's clients hold the root member in this order; its host and place there. */
static void root_of(const dt__coll_req *r, const dt__gcall *gc, int *host, int *rank)
{
    const dt__cgroup *g = gc->g;
    const dt__hosts *h = g->hosts;
    int rc = 0;
    while (g->rank_first[rc + 1] <= r->c.root)
        rc++;
    for (int j = 0; j < h->num_hosts; j++)
        for (int i = h->host_first[j]; i < h->host_first[j + 1]; i++)
            if (h->host_order[i] == rc) {
                *host = j;
                *rank = i - h->host_first[j];
            }
}

/* Post step gc->phase (and any that need no message), or finish: true when a request is out. */
static int post(dt__coll_req *r, dt__gcall *gc)
{
    const dt__hosts *h = gc->g->hosts;
    bool leader = h->host_rank == 0, alone = h->host_size == 1;
    MPI_Datatype t = dt__coll_mpi_type(r->c.dtype);
    MPI_Op op = dt__coll_mpi_op(r->c.dtype, r->c.op);
    MPI_Request *q = &gc->req[0];
    size_t es = r->es;
    int n = (int)r->c.count, total = (int)gc->total, me = gc->g->my_pos, e = MPI_SUCCESS;
    int mine = (int)(gc->seg[me + 1] - gc->seg[me]);
    for (;; gc->phase++) {
        switch (r->c.kind * 4 + gc->phase) {
        /* all-reduce: into the leader, among leaders, back to the host */
        case DT__COLL_ALL_REDUCE * 4:
            if (alone) {
                if (gc->xin != gc->xout && n)
                    memcpy(gc->xout, gc->xin, (size_t)n * es);
                continue;
            }
            e = MPI_Ireduce(leader && gc->xin == gc->xout ? MPI_IN_PLACE : gc->xin, gc->xout, n, t,
                            op, 0, h->hcomm, q);
            break;
        case DT__COLL_ALL_REDUCE * 4 + 1:
            if (!leader)
                continue;
            e = MPI_Iallreduce(MPI_IN_PLACE, gc->xout, n, t, op, h->lcomm, q);
            break;
        case DT__COLL_ALL_REDUCE * 4 + 2:
        case DT__COLL_ALL_GATHER * 4 + 2:
            if (r->c.kind == DT__COLL_ALL_GATHER && leader && !h->host_major)
                arrange(r, gc, gc->hbuf, gc->xout, false);
            if (alone)
                continue;
            e = MPI_Ibcast(gc->xout, r->c.kind == DT__COLL_ALL_REDUCE ? n : total, t, 0, h->hcomm,
                           q);
            break;
        /* reduce-scatter: the whole into the leader, a part per host among leaders, a segment
         * per client */
        case DT__COLL_REDUCE_SCATTER * 4:
            if (alone)
                continue;
            if (!leader)
                e = MPI_Ireduce(gc->xin, NULL, total, t, op, 0, h->hcomm, q);
            else if (sum_apart(gc))
                e = MPI_Ireduce(gc->xin, rs_sum(gc), total, t, op, 0, h->hcomm, q);
            else
                e = MPI_Ireduce(MPI_IN_PLACE, gc->xin, total, t, op, 0, h->hcomm, q);
            break;
        case DT__COLL_REDUCE_SCATTER * 4 + 1: {
            if (!leader)
                continue;
            const char *src = rs_sum(gc);
            if (!h->host_major) {
                arrange(r, gc, rs_arranged(r, gc), (char *)src, true);
                src = rs_arranged(r, gc);
            }
            e = MPI_Ireduce_scatter(src, rs_part(r, gc), H_COUNTS(gc), t, op, h->lcomm, q);
            break;
        }
        case DT__COLL_REDUCE_SCATTER * 4 + 2:
            if (alone) {
                if (mine)
                    memcpy(gc->seg_out, rs_part(r, gc), (size_t)mine * es);
                continue;
            }
            e = MPI_Iscatterv(leader ? rs_part(r, gc) : NULL, M_COUNTS(gc, h), M_DISPLS(gc, h), t,
                              gc->seg_out, mine, t, 0, h->hcomm, q);
            break;
        /* all-gather: the host's blocks into the leader, among leaders, back to the host */
        case DT__COLL_ALL_GATHER * 4: {
            const void *src = gc->g->num_local == 1 ? gc->send[0] : gc->xout + gc->seg[me] * es;
            if (alone) {
                if (src != gc->xout + gc->seg[me] * es && mine)
                    memcpy(gc->xout + gc->seg[me] * es, src, (size_t)mine * es);
                continue;
            }
            e = MPI_Igatherv(leader && gc->g->num_local > 1 ? MPI_IN_PLACE : src, mine, t, gc->xout,
                             M_COUNTS(gc, h), M_DISPLS(gc, h), t, 0, h->hcomm, q);
            break;
        }
        case DT__COLL_ALL_GATHER * 4 + 1: {
            if (!leader)
                continue;
            char *all = gc->xout;
            if (!h->host_major) {
                arrange(r, gc, gc->hbuf, gc->xout, true);
                all = gc->hbuf;
            }
            e = MPI_Iallgatherv(MPI_IN_PLACE, 0, t, all, H_COUNTS(gc), H_DISPLS(gc, h), t, h->lcomm,
                                q);
            break;
        }
        /* broadcast: in the root's host, among leaders from it, in the other hosts */
        case DT__COLL_BROADCAST * 4:
        case DT__COLL_BROADCAST * 4 + 2: {
            int rh = 0, rr = 0;
            root_of(r, gc, &rh, &rr);
            if (alone || (gc->phase == 0) != (h->my_host == rh))
                continue;
            e = MPI_Ibcast(gc->xout, n, t, gc->phase == 0 ? rr : 0, h->hcomm, q);
            break;
        }
        case DT__COLL_BROADCAST * 4 + 1: {
            int rh = 0, rr = 0;
            root_of(r, gc, &rh, &rr);
            if (!leader)
                continue;
            e = MPI_Ibcast(gc->xout, n, t, rh, h->lcomm, q);
            break;
        }
        default: /* past the last step */
            gc->done = true;
            return 0;
        }
        if (e != MPI_SUCCESS)
            return -1;
        gc->nreq = 1;
        gc->phase++;
        return 1;
    }
}

dt_status dt__hosts_next(dt__coll_req *r, dt__gcall *gc)
{
    if (post(r, gc) < 0)
        return dt__fail(DT_ERR_COMM,
                        "%s: MPI call of step %d of the by-host path failed (group %d)",
                        dt__coll_kind_name(r->c.kind), gc->phase, gc->g->id);
    return DT_OK;
}

/* ---- the gather of dt_tensor_read --------------------------------------------------------- */

/* The hosts of every client (over the runtime's communicator), made at the first read that
 * goes by host; freed by dt__coll_shutdown. */
static dt__hosts *every;
static bool every_built;

void dt__hosts_shutdown(void)
{
    dt__hosts_free(every);
    every = NULL;
    every_built = false;
}

/* The clients' parts (cnt[c] elements at displ[c], client order) to host after host in
 * `arranged`, or back. */
static void arrange_clients(const dt__hosts *h, char *arranged, char *all, const int cnt[],
                            const int displ[], size_t es, bool to_hosts)
{
    size_t at = 0;
    for (int i = 0; i < h->host_first[h->num_hosts]; i++) {
        int c = h->host_order[i];
        size_t len = (size_t)cnt[c] * es;
        char *m = all + (size_t)displ[c] * es;
        if (len)
            memcpy(to_hosts ? arranged + at : m, to_hosts ? m : arranged + at, len);
        at += len;
    }
}

dt_status dt__coll_gather_clients(const dt_mesh *m, void *all, const int cnt[], const int displ[],
                                  MPI_Datatype elem, size_t es)
{
    int n = m->num_clients, me = dt__rt.client;
    int64_t total = 0;
    for (int c = 0; c < n; c++)
        total += cnt[c];
    dt_status s = DT_OK;
    if (!every_built) { /* every client reads: all build alike */
        int *ids = malloc(sizeof(int) * (size_t)n);
        if (!ids)
            return dt__fail(DT_ERR_NOMEM, "dt_tensor_read: out of memory");
        for (int c = 0; c < n; c++)
            ids[c] = c;
        s = dt__hosts_build(ids, n, me, &every);
        if (s == DT_OK && every)
            s = dt__hosts_connect(every, dt__rt.world, ids, 32000);
        free(ids);
        every_built = s == DT_OK;
        DT_TRY(s);
    }
    const dt__hosts *h = every;
    MPI_Request req;
    if (!dt__hosts_choose(DT__COLL_ALL_GATHER, DT_ALGORITHM_AUTO, h, n, total * (int64_t)es)) {
        if (MPI_Iallgatherv(MPI_IN_PLACE, 0, elem, all, cnt, displ, elem, m->comm, &req) !=
            MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "dt_tensor_read: MPI_Iallgatherv failed");
        return dt__mpi_wait_all(1, &req);
    }
    /* by host: the host's parts into its leader, among leaders, to the host */
    int nh = h->num_hosts, hs = h->host_size, first = h->host_first[h->my_host];
    int *mc = malloc(sizeof(int) * 2 * (size_t)(hs + nh));
    char *arranged = NULL;
    if (!mc ||
        (!h->host_major && h->host_rank == 0 && !(arranged = malloc((size_t)total * es + 1))))
        s = dt__fail(DT_ERR_NOMEM, "dt_tensor_read: out of memory for %lld bytes",
                     (long long)total * (long long)es);
    int *md = mc + hs, *hc = mc + 2 * hs, *hd = hc + nh;
    for (int i = 0; s == DT_OK && i < hs; i++) {
        mc[i] = cnt[h->host_order[first + i]];
        md[i] = displ[h->host_order[first + i]];
    }
    for (int j = 0, at = 0; s == DT_OK && j < nh; j++) {
        hc[j] = 0;
        for (int i = h->host_first[j]; i < h->host_first[j + 1]; i++)
            hc[j] += cnt[h->host_order[i]];
        hd[j] = h->host_major ? displ[h->host_order[h->host_first[j]]] : at;
        at += hc[j];
    }
    const char *where = "in dt_tensor_read's gather by host";
    if (s == DT_OK && hs > 1) {
        void *mine = h->host_rank == 0 ? MPI_IN_PLACE : (char *)all + (size_t)displ[me] * es;
        s = MPI_Igatherv(mine, cnt[me], elem, all, mc, md, elem, 0, h->hcomm, &req) == MPI_SUCCESS
                ? dt__mpi_wait_for(1, &req, where)
                : dt__fail(DT_ERR_COMM, "dt_tensor_read: MPI_Igatherv failed");
    }
    if (s == DT_OK && h->host_rank == 0) {
        char *buf = arranged ? arranged : all;
        if (arranged)
            arrange_clients(h, arranged, all, cnt, displ, es, true);
        s = MPI_Iallgatherv(MPI_IN_PLACE, 0, elem, buf, hc, hd, elem, h->lcomm, &req) == MPI_SUCCESS
                ? dt__mpi_wait_for(1, &req, where)
                : dt__fail(DT_ERR_COMM, "dt_tensor_read: MPI_Iallgatherv failed");
        if (s == DT_OK && arranged)
            arrange_clients(h, arranged, all, cnt, displ, es, false);
    }
    if (s == DT_OK && hs > 1)
        s = MPI_Ibcast(all, (int)total, elem, 0, h->hcomm, &req) == MPI_SUCCESS
                ? dt__mpi_wait_for(1, &req, where)
                : dt__fail(DT_ERR_COMM, "dt_tensor_read: MPI_Ibcast failed");
    free(mc);
    free(arranged);
    return s;
}
