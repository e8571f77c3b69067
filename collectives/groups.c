/* Group arithmetic of axis masks and the per-mesh cache of groups and their communicators. */
#include "coll_internal.h"

#include <stdlib.h>
#include <string.h>

int dt__group_size(const dt_mesh *m, unsigned axes)
{
    int g = 1;
    for (int a = 0; a < m->num_axes; a++)
        if (axes >> a & 1u)
            g *= m->sizes[a];
    return g;
}

int dt__group_rank(const dt_mesh *m, unsigned axes, int device)
{
    int r = 0;
    for (int a = 0; a < m->num_axes; a++)
        if (axes >> a & 1u)
            r = r * m->sizes[a] + device / m->strides[a] % m->sizes[a];
    return r;
}

int dt__group_member(const dt_mesh *m, unsigned axes, int device, int rank)
{
    for (int a = m->num_axes - 1; a >= 0; a--) {
        if (!(axes >> a & 1u))
            continue;
        int c = rank % m->sizes[a];
        rank /= m->sizes[a];
        device += (c - device / m->strides[a] % m->sizes[a]) * m->strides[a];
    }
    return device;
}

static int client_of(const dt_mesh *m, int device)
{
    int lo = 0, hi = m->num_clients - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->client_first[mid] <= device)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void free_mask(dt__cmask *k)
{
    if (!k)
        return;
    for (int i = 0; i < k->num_groups; i++) {
        dt__cgroup *g = &k->groups[i];
        if (g->owns_comm && g->comm != MPI_COMM_NULL)
            MPI_Comm_free(&g->comm);
        dt__hosts_free(g->hosts);
        free(g->local);
        free(g->clients);
        free(g->rank_first);
    }
    free(k->groups);
    free(k->group_of);
    free(k->scratch);
    free(k);
}

void dt__coll_mesh_free(dt_mesh *m)
{
    if (!m->coll)
        return;
    for (unsigned a = 0; a < 1u << DT_MAX_MESH_AXES; a++)
        free_mask(m->coll->masks[a]);
    dt__dev_mesh_free(m);
    free(m->coll);
    m->coll = NULL;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Groups of `axes` that hold this client's devices: ids, local members, clients. Local. */
static dt_status build_mask(const dt_mesh *m, unsigned axes, dt__cmask **out)
{
    dt_status s = DT_OK;
    int n = m->num_local;
    dt__cmask *k = calloc(1, sizeof *k);
    int *ids = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!k || !ids || !(k->group_of = malloc(sizeof(int) * (size_t)(n ? n : 1))) ||
        !(k->groups = calloc((size_t)(n ? n : 1), sizeof *k->groups))) {
        s = dt__fail(DT_ERR_NOMEM, "collectives: out of memory for the groups of %d devices", n);
        goto done;
    }
    k->axes = axes;
    k->size = dt__group_size(m, axes);
    /* distinct group ids (member 0), ascending */
    int ng = 0;
    for (int i = 0; i < n; i++)
        ids[ng++] = dt__group_member(m, axes, m->first_local + i, 0);
    qsort(ids, (size_t)ng, sizeof *ids, cmp_int);
    int uniq = 0;
    for (int i = 0; i < ng; i++)
        if (uniq == 0 || ids[uniq - 1] != ids[i])
            ids[uniq++] = ids[i];
    k->num_groups = uniq;
    for (int gi = 0; gi < uniq; gi++) {
        dt__cgroup *g = &k->groups[gi];
        g->id = ids[gi];
        g->comm = MPI_COMM_NULL;
        g->xset = -1;
        g->local = malloc(sizeof(int) * (size_t)k->size);
        g->clients = malloc(sizeof(int) * (size_t)k->size);
        g->rank_first = malloc(sizeof(int) * (size_t)(k->size + 1));
        if (!g->local || !g->clients || !g->rank_first) {
            s = dt__fail(DT_ERR_NOMEM, "collectives: out of memory for a group of %d", k->size);
            goto done;
        }
        g->first_rank = -1;
        for (int r = 0; r < k->size; r++) {
            int d = dt__group_member(m, axes, g->id, r);
            int c = client_of(m, d);
            if (g->num_clients == 0 || g->clients[g->num_clients - 1] != c) {
                g->clients[g->num_clients] = c;
                g->rank_first[g->num_clients++] = r;
            }
            if (c == dt__rt.client) {
                g->my_pos = g->num_clients - 1;
                if (g->first_rank < 0)
                    g->first_rank = r;
                g->local[g->num_local++] = d - m->first_local;
            }
        }
        g->rank_first[g->num_clients] = k->size;
        if (g->num_clients > 1) {
            k->spans = true;
            if ((s = dt__hosts_build(g->clients, g->num_clients, g->my_pos, &g->hosts)) != DT_OK)
                goto done;
        }
    }
    for (int i = 0; i < n; i++) {
        int id = dt__group_member(m, axes, m->first_local + i, 0);
        int *p = bsearch(&id, ids, (size_t)uniq, sizeof *ids, cmp_int);
        k->group_of[i] = (int)(p - ids);
    }
done:
    free(ids);
    if (s != DT_OK) {
        free_mask(k);
        k = NULL;
    }
    *out = k;
    return s;
}

/* One communicator per distinct client set of the spanning groups, in ascending group id,
 * the same order on every client. A group over every client of the mesh's communicator (the
 * runtime's clients, also those owning none of the mesh's devices) duplicates it without blocking
 * (MPI_Comm_idup); a smaller one uses MPI_Comm_create_group, which involves only its members. */
static dt_status make_comms(const dt_mesh *m, dt__cmask *k)
{
    int tag_ub = 32767, *attr = NULL, flag = 0;
    MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &attr, &flag);
    if (flag && attr)
        tag_ub = *attr;
    MPI_Group world = MPI_GROUP_NULL;
    dt_status s = DT_OK;
    for (int gi = 0; s == DT_OK && gi < k->num_groups; gi++) {
        dt__cgroup *g = &k->groups[gi];
        if (g->num_clients < 2)
            continue;
        g->lane = &g->own_lane;
        for (int pj = 0; pj < gi; pj++) {
            dt__cgroup *p = &k->groups[pj];
            if (p->num_clients == g->num_clients &&
                memcmp(p->clients, g->clients, sizeof(int) * (size_t)g->num_clients) == 0) {
                g->comm = p->comm;
                g->lane = p->lane;
                break;
            }
        }
        if (g->comm != MPI_COMM_NULL)
            continue;
        g->owns_comm = true;
        int comm_size = 0;
        MPI_Comm_size(m->comm, &comm_size);
        if (g->num_clients == comm_size) {
            MPI_Request req;
            char where[96];
            snprintf(where, sizeof where, "creating the communicator of group %d (every client)",
                     g->id);
            if (MPI_Comm_idup(m->comm, &g->comm, &req) != MPI_SUCCESS)
                s = dt__fail(DT_ERR_COMM, "collectives: MPI_Comm_idup for group %d failed", g->id);
            else
                s = dt__mpi_wait_for(1, &req, where);
            if (s != DT_OK) { /* a duplication still pending is MPI's: abandoned, never freed */
                g->comm = MPI_COMM_NULL;
                g->owns_comm = false;
            }
            continue;
        }
        MPI_Group sub = MPI_GROUP_NULL;
        if (world == MPI_GROUP_NULL)
            MPI_Comm_group(m->comm, &world);
        if (MPI_Group_incl(world, g->num_clients, g->clients, &sub) != MPI_SUCCESS ||
            MPI_Comm_create_group(m->comm, sub, g->id % tag_ub, &g->comm) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM,
                         "collectives: cannot create the communicator of group %d (%d clients)",
                         g->id, g->num_clients);
        if (sub != MPI_GROUP_NULL)
            MPI_Group_free(&sub);
    }
    if (world != MPI_GROUP_NULL)
        MPI_Group_free(&world);
    /* then the by-host path's communicators, two tags per group apart from the groups' own (ids
     * below the mesh's size): made after the groups' own, so that a client lost by now fails the
     * polled duplication above, never one of these blocking creations */
    for (int gi = 0; s == DT_OK && gi < k->num_groups; gi++) {
        dt__cgroup *g = &k->groups[gi];
        if (g->hosts && g->num_clients > 1)
            s = dt__hosts_connect(g->hosts, m->comm, g->clients,
                                  (m->size + 2 * g->id) % (tag_ub - 1));
    }
    return s;
}

dt_status dt__coll_mask(const dt_mesh *m, unsigned axes, bool need_comms, dt__cmask **out)
{
    /* The cache is internal state of a const mesh, like its reference count. */
    dt_mesh *mm = (dt_mesh *)m;
    if (!mm->coll && !(mm->coll = calloc(1, sizeof *mm->coll)))
        return dt__fail(DT_ERR_NOMEM, "collectives: out of memory");
    dt__cmask **slot = &mm->coll->masks[axes];
    if (!*slot)
        DT_TRY(build_mask(m, axes, slot));
    dt__cmask *k = *slot;
    if (need_comms && k->spans && !k->comms_ready) {
        DT_TRY(make_comms(m, k));
        k->comms_ready = true;
    }
    *out = k;
    return DT_OK;
}
