/* The agreement channel: the hosts' shared-memory windows of slots, the leaders, and the
 * staging regions of a host that is every client (mesh/channel.h). */
#include "channel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the channel ------------------------------------------------------------------------- */

struct dt__channel dt__ch = {
    .comm = MPI_COMM_NULL, .host = MPI_COMM_NULL, .win = MPI_WIN_NULL, .stage_win = MPI_WIN_NULL};

/* How clients group into hosts: DTENSOR_AGREE_HOSTS unset or "shared" (by shared memory),
 * "none" (no shared memory: every client a host of its own) or K (the shared-memory hosts cut
 * into groups of K consecutive clients, to exercise the leaders' exchange on one machine). */
static dt_status hosts_mode(int *out)
{
    const char *e = getenv("DTENSOR_AGREE_HOSTS");
    *out = 0;
    if (!e || !*e || strcmp(e, "shared") == 0)
        return DT_OK;
    if (strcmp(e, "none") == 0) {
        *out = 1;
        return DT_OK;
    }
    char *end;
    long k = strtol(e, &end, 10);
    if (*end || k < 1 || k > 1 << 20)
        return dt__fail(DT_ERR_ARG,
                        "dt_init: DTENSOR_AGREE_HOSTS=\"%.64s\" is not shared, none or a group "
                        "size from 1",
                        e);
    *out = (int)k;
    return DT_OK;
}

void dt__channel_close(void)
{
    dt__watch_close();
    /* with a client lost, no collective free (MPI_Win_free waits for every client of the
     * host): the windows and communicators stay MPI's */
    bool lost = dt__watch_lost();
    if (dt__ch.win != MPI_WIN_NULL && !lost)
        MPI_Win_free(&dt__ch.win);
    if (dt__ch.stage_win != MPI_WIN_NULL && !lost)
        MPI_Win_free(&dt__ch.stage_win);
    if (dt__ch.host != MPI_COMM_NULL && !lost)
        MPI_Comm_free(&dt__ch.host);
    if (dt__ch.comm != MPI_COMM_NULL && !lost)
        MPI_Comm_free(&dt__ch.comm);
    free(dt__ch.members);
    free(dt__ch.slots);
    free(dt__ch.leader_of);
    free(dt__ch.leaders);
    free(dt__ch.stage);
    dt__ch = (struct dt__channel){.comm = MPI_COMM_NULL,
                                  .host = MPI_COMM_NULL,
                                  .win = MPI_WIN_NULL,
                                  .stage_win = MPI_WIN_NULL};
}

/* Bytes of one client's staging region per agreement (two are kept: by the parity of the
 * agreement's sequence, as the slots' entries are). Pages are touched only when used. */
#define DT__STAGE_BYTES ((size_t)2 << 20)

/* The staging regions of a host that is every client (collective over the host). */
static dt_status stage_open(void)
{
    char *mine = NULL;
    if (MPI_Win_allocate_shared((MPI_Aint)(2 * DT__STAGE_BYTES), 1, MPI_INFO_NULL, dt__ch.host,
                                &mine, &dt__ch.stage_win) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "dt_init: cannot allocate %zu bytes of shared staging",
                        2 * DT__STAGE_BYTES);
    dt__ch.stage = malloc(sizeof *dt__ch.stage * (size_t)dt__ch.host_size);
    if (!dt__ch.stage)
        return dt__fail(DT_ERR_NOMEM, "dt_init: out of memory");
    for (int i = 0; i < dt__ch.host_size; i++) {
        MPI_Aint size;
        int unit;
        if (MPI_Win_shared_query(dt__ch.stage_win, i, &size, &unit, &dt__ch.stage[i]) !=
            MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "dt_init: MPI_Win_shared_query failed");
    }
    return DT_OK;
}

size_t dt__stage_capacity(void)
{
    return dt__ch.open && dt__ch.stage ? DT__STAGE_BYTES : 0;
}

void *dt__stage_next(void)
{
    return dt__ch.stage[dt__ch.host_rank] + ((dt__ch.seq + 1) & 1) * DT__STAGE_BYTES;
}

const void *dt__stage_last(int client)
{
    int i = 0;
    while (i < dt__ch.host_size - 1 && dt__ch.members[i] != client)
        i++;
    return dt__ch.stage[i] + (dt__ch.seq & 1) * DT__STAGE_BYTES;
}

int dt__host_of(int client)
{
    return dt__ch.open && client >= 0 && client < dt__rt.num_clients ? dt__ch.leader_of[client]
                                                                     : -1;
}

/* An all-reduce (max) of a few words over the world, for the channel's own set-up. */
static dt_status world_max(int64_t v[], int n)
{
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, dt__rt.world, &req) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "dt_init: MPI_Iallreduce failed");
    return dt__mpi_wait_all(1, &req);
}

dt_status dt__channel_open(void)
{
    if (dt__rt.world == MPI_COMM_NULL)
        return DT_OK;
    int n = dt__rt.num_clients, me = dt__rt.client, mode = 0;
    dt_status local = hosts_mode(&mode);
    /* the mode is agreed: max of (failed, mode, -mode) */
    int64_t v[3] = {local != DT_OK, mode, -mode};
    DT_TRY(world_max(v, 3));
    if (v[0])
        return local != DT_OK ? local
                              : dt__fail(DT_ERR_ARG, "dt_init: another client's "
                                                     "DTENSOR_AGREE_HOSTS is not valid");
    if (v[1] != -v[2])
        return dt__fail(DT_ERR_MISMATCH,
                        "dt_init: clients set DTENSOR_AGREE_HOSTS differently (this client: "
                        "%d; 0 = shared, 1 = none, K = groups of K)",
                        mode);
    dt_status s = DT_OK;
    MPI_Request req;
    if (MPI_Comm_idup(dt__rt.world, &dt__ch.comm, &req) != MPI_SUCCESS)
        s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_idup failed");
    else
        s = dt__mpi_wait_all(1, &req);
    if (s == DT_OK)
        MPI_Comm_set_errhandler(dt__ch.comm, MPI_ERRORS_RETURN);
    MPI_Comm shared = MPI_COMM_NULL;
    if (s == DT_OK && mode != 1 &&
        MPI_Comm_split_type(dt__rt.world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared) !=
            MPI_SUCCESS)
        s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_split_type failed");
    if (s == DT_OK) {
        int color = me, key = 0;
        if (mode != 1) {
            MPI_Comm_rank(shared, &key);
            color = mode > 1 ? key / mode : 0;
        }
        /* split the shared communicator (or the world, for "none") further by color */
        if (MPI_Comm_split(mode == 1 ? dt__rt.world : shared, color, key, &dt__ch.host) !=
            MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_split failed");
    }
    if (shared != MPI_COMM_NULL)
        MPI_Comm_free(&shared);
    slot *mine = NULL;
    if (s == DT_OK) {
        MPI_Comm_rank(dt__ch.host, &dt__ch.host_rank);
        MPI_Comm_size(dt__ch.host, &dt__ch.host_size);
        if (MPI_Win_allocate_shared((MPI_Aint)sizeof(slot), 1, MPI_INFO_NULL, dt__ch.host, &mine,
                                    &dt__ch.win) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: cannot allocate the agreement's shared memory");
    }
    if (s == DT_OK) {
        memset(mine, 0, sizeof *mine);
        dt__ch.members = malloc(sizeof(int) * (size_t)dt__ch.host_size);
        dt__ch.slots = malloc(sizeof(slot *) * (size_t)dt__ch.host_size);
        dt__ch.leader_of = malloc(sizeof(int) * (size_t)n);
        dt__ch.leaders = malloc(sizeof(int) * (size_t)n);
        if (!dt__ch.members || !dt__ch.slots || !dt__ch.leader_of || !dt__ch.leaders)
            s = dt__fail(DT_ERR_NOMEM, "dt_init: out of memory for the agreement of %d clients", n);
    }
    if (s == DT_OK) {
        MPI_Group hg, wg;
        MPI_Comm_group(dt__ch.host, &hg);
        MPI_Comm_group(dt__rt.world, &wg);
        int *idx = dt__ch.leaders; /* scratch until the leaders are known */
        for (int i = 0; i < dt__ch.host_size; i++)
            idx[i] = i;
        MPI_Group_translate_ranks(hg, dt__ch.host_size, idx, wg, dt__ch.members);
        MPI_Group_free(&hg);
        MPI_Group_free(&wg);
        for (int i = 0; s == DT_OK && i < dt__ch.host_size; i++) {
            MPI_Aint size;
            int unit;
            if (MPI_Win_shared_query(dt__ch.win, i, &size, &unit, &dt__ch.slots[i]) != MPI_SUCCESS)
                s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Win_shared_query failed");
        }
    }
    if (s == DT_OK) {
        int leader = dt__ch.members[0];
        s = dt__allgather_bytes(dt__rt.world, &leader, sizeof leader, dt__ch.leader_of);
    }
    if (s == DT_OK) {
        dt__ch.nleaders = 0;
        for (int c = 0; c < n; c++)
            if (dt__ch.leader_of[c] == c) {
                if (c == dt__ch.members[0])
                    dt__ch.leader_index = dt__ch.nleaders;
                dt__ch.leaders[dt__ch.nleaders++] = c;
            }
    }
    if (s == DT_OK && dt__ch.nleaders == 1)
        s = stage_open();
    if (s == DT_OK)
        s = dt__watch_open(dt__ch.host, dt__ch.members, dt__ch.leader_of, dt__ch.leaders,
                           dt__ch.nleaders);
    /* every slot is zeroed before any client's first agreement reads it */
    int64_t failed[1] = {s != DT_OK};
    dt_status s2 = world_max(failed, 1);
    if (s == DT_OK && s2 != DT_OK)
        s = s2;
    if (s == DT_OK && failed[0])
        s = dt__fail(DT_ERR_COMM, "dt_init: another client could not set up the agreement");
    if (s != DT_OK) {
        dt__channel_close();
        return s;
    }
    dt__ch.seq = 0;
    dt__ch.open = true;
    return DT_OK;
}
