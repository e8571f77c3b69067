/* Agreements: how the clients settle, before any data moves, that each of them is about to
 * make the same call and that none has failed -- the common path over the channel
 * (mesh/channel.h) and the rare path that names what differs. */
#include "channel.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the common path --------------------------------------------------------------------- */

static void fold(uint64_t acc[3], const uint64_t v[3])
{
    for (int i = 0; i < 3; i++)
        acc[i] = v[i] > acc[i] ? v[i] : acc[i];
}

static void publish(entry *e, uint64_t seq, const uint64_t v[3])
{
    memcpy(e->v, v, sizeof e->v);
    atomic_store_explicit(&e->seq, seq, memory_order_release);
}

/* The host's mark of agreement `seq` on its arrivals bell: every client's entry is in. */
static uint32_t arrivals_mark(uint64_t seq)
{
    return (uint32_t)(seq * (uint64_t)dt__ch.host_size);
}

/* Count this client's entry of `seq` in (after publishing it); the client that completes the
 * host wakes those asleep waiting for it. */
static void arrive(uint64_t seq)
{
    bell *b = &dt__ch.slots[0]->arrivals;
    if (dt__bell_reached(atomic_fetch_add(&b->word, 1) + 1, arrivals_mark(seq)))
        dt__bell_ring(b);
}

/* The clients ranks[i] whose done[i] is false, into `buf`; with `hosts`, ranks are hosts'
 * leaders and every client of their hosts is named. */
static void missing_str(char *buf, size_t size, const int ranks[], const bool done[], int n,
                        bool hosts)
{
    int nc = dt__rt.num_clients, *miss = malloc(sizeof(int) * (size_t)(nc > n ? nc : n)), k = 0;
    if (!miss) {
        snprintf(buf, size, "(out of memory)");
        return;
    }
    for (int i = 0; i < n; i++)
        if (!done[i] && !hosts)
            miss[k++] = ranks[i];
    for (int c = 0; hosts && c < nc; c++)
        for (int i = 0; i < n; i++)
            if (!done[i] && dt__ch.leader_of[c] == ranks[i]) {
                miss[k++] = c;
                break;
            }
    if (k)
        dt__clients_str(buf, size, miss, k);
    else if (size)
        buf[0] = '\0';
    free(miss);
}

/* A wait on shared memory makes no MPI call by itself; past its spin it drives MPI's progress
 * too, so that what other clients started towards this one (a parameter-server pull reading
 * this client's window) completes while it waits, instead of both waiting for ever. */
static void drive_progress(const dt__waiter *w)
{
    if (!w->spin || w->polls >= DT__WAIT_SPIN_POLLS) {
        int flag;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, dt__ch.comm, &flag, MPI_STATUS_IGNORE);
    }
}

/* The host's part: wait for every member's entry of `seq` and fold it into acc. */
static dt_status host_fold(uint64_t seq, uint64_t acc[3], dt__waiter *w)
{
    int n = dt__ch.host_size, left = n - 1;
    bool stack[64], *done = n <= 64 ? stack : calloc((size_t)n, sizeof *done);
    if (!done)
        return dt__fail(DT_ERR_NOMEM, "agreement: out of memory");
    memset(done, 0, sizeof *done * (size_t)n);
    done[dt__ch.host_rank] = true;
    dt_status s = DT_OK;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            entry *e = &dt__ch.slots[i]->mine[seq & 1];
            if (atomic_load_explicit(&e->seq, memory_order_acquire) == seq) {
                fold(acc, e->v);
                done[i] = true;
                left--;
            }
        }
        if (left > 0)
            drive_progress(w);
        if (left > 0 && dt__wait_pause_on(w, &dt__ch.slots[0]->arrivals, arrivals_mark(seq))) {
            char miss[256];
            missing_str(miss, sizeof miss, dt__ch.members, done, n, false);
            s = dt__gave_up(w, "in the agreement of all clients (on this host)", miss);
            break;
        }
    }
    if (done != stack)
        free(done);
    return s;
}

/* Point-to-point swap with the clients ranks[0..n) (world ranks; ranks[self] is this client):
 * each receives every other's `bytes` into all[i * bytes]. Fixed sizes: a message of another
 * length is an error naming its sender. */
static dt_status swap(const int ranks[], int n, int self, const void *mine, void *all, size_t bytes,
                      int kind, const char *where, bool hosts)
{
    memcpy((char *)all + (size_t)self * bytes, mine, bytes);
    if (n == 1)
        return DT_OK;
    /* MPI works on buffers of its own here: when the wait gives up, those still in use are
     * abandoned to it rather than freed under it */
    MPI_Request *req = malloc(sizeof *req * (size_t)n * 2);
    bool *done = calloc((size_t)n * 2, sizeof *done);
    char *out = malloc(bytes), *in = malloc(bytes * (size_t)n);
    if (!req || !done || !out || !in) {
        free(req);
        free(done);
        free(out);
        free(in);
        return dt__fail(DT_ERR_NOMEM, "agreement: out of memory for %d clients", n);
    }
    memcpy(out, mine, bytes);
    int tag = dt__channel_tag(dt__ch.seq, kind);
    dt_status s = DT_OK;
    for (int i = 0; i < n; i++) {
        req[i] = req[n + i] = MPI_REQUEST_NULL;
        done[i] = done[n + i] = i == self;
        if (i == self || s != DT_OK)
            continue;
        int e = MPI_Irecv(in + (size_t)i * bytes, (int)bytes, MPI_BYTE, ranks[i], tag, dt__ch.comm,
                          &req[i]);
        if (e == MPI_SUCCESS)
            e = MPI_Isend(out, (int)bytes, MPI_BYTE, ranks[i], tag, dt__ch.comm, &req[n + i]);
        if (e != MPI_SUCCESS) /* MPI knows it cannot reach the client (its host is gone) */
            s = dt__message_failed(ranks[i], e, where);
    }
    dt__waiter w;
    dt__wait_begin(&w);
    for (int left = 2 * (n - 1); s == DT_OK && left > 0;) {
        for (int i = 0; s == DT_OK && i < 2 * n; i++) {
            if (done[i])
                continue;
            int flag = 0;
            MPI_Status st;
            int e = MPI_Test(&req[i], &flag, &st);
            if (e == MPI_SUCCESS && !flag)
                continue;
            int count = -1;
            if (e == MPI_SUCCESS && i < n)
                MPI_Get_count(&st, MPI_BYTE, &count);
            if (e != MPI_SUCCESS)
                s = dt__message_failed(ranks[i % n], e, where);
            else if (i < n && count != (int)bytes)
                s = dt__fail(DT_ERR_COMM,
                             "%s: a malformed agreement message %s client %d (%d bytes, "
                             "expected %zu)",
                             dt__current_call(), i < n ? "from" : "to", ranks[i % n], count, bytes);
            done[i] = true;
            left--;
        }
        if (s == DT_OK && left > 0 && dt__wait_pause(&w)) {
            char miss[256];
            missing_str(miss, sizeof miss, ranks, done, n, hosts);
            s = dt__gave_up(&w, where, miss);
        }
    }
    dt__wait_end(&w);
    bool abandoned = false;
    if (s != DT_OK) /* nothing of this agreement may match a later one */
        for (int i = 0; i < 2 * n; i++)
            if (req[i] != MPI_REQUEST_NULL) {
                if (i < n)
                    MPI_Cancel(&req[i]);
                MPI_Request_free(&req[i]);
                abandoned = true;
            }
    for (int i = 0; s == DT_OK && i < n; i++)
        if (i != self)
            memcpy((char *)all + (size_t)i * bytes, in + (size_t)i * bytes, bytes);
    if (!abandoned) {
        free(out);
        free(in);
    }
    free(req);
    free(done);
    return s;
}

/* What a leader publishes for its host when it gave up (a verdict is 0 or 1). */
#define LEADER_GAVE_UP 2

/* Combine v over every client: shared memory within the host, leaders across hosts. */
static dt_status combine(uint64_t seq, const uint64_t v[3], uint64_t out[3])
{
    slot *me = dt__ch.slots[dt__ch.host_rank];
    publish(&me->mine[seq & 1], seq, v);
    arrive(seq);
    memcpy(out, v, sizeof(uint64_t) * 3);
    dt__waiter w;
    dt__wait_begin(&w);
    dt_status s = DT_OK;
    if (dt__ch.nleaders == 1) {
        s = host_fold(seq, out, &w);
    } else if (dt__ch.host_rank == 0) {
        s = host_fold(seq, out, &w);
        uint64_t mine[4] = {seq, out[0], out[1], out[2]}, *all = NULL;
        if (s == DT_OK) {
            all = malloc(sizeof mine * (size_t)dt__ch.nleaders);
            s = all ? swap(dt__ch.leaders, dt__ch.nleaders, dt__ch.leader_index, mine, all,
                           sizeof mine, KIND_LEADERS,
                           "in the agreement of all clients (between hosts)", true)
                    : dt__fail(DT_ERR_NOMEM, "agreement: out of memory");
        }
        for (int h = 0; s == DT_OK && h < dt__ch.nleaders; h++) {
            if (all[h * 4] != seq)
                s = dt__fail(DT_ERR_COMM,
                             "%s: the leader of client %d's host sent agreement %llu, this host "
                             "is at %llu: out of step",
                             dt__current_call(), dt__ch.leaders[h], (unsigned long long)all[h * 4],
                             (unsigned long long)seq);
            else
                fold(out, &all[h * 4 + 1]);
        }
        free(all);
        /* the host learns the result, or that its leader gave up */
        uint64_t failed[3] = {LEADER_GAVE_UP, 0, 0};
        publish(&me->host[seq & 1], seq, s == DT_OK ? out : failed);
        atomic_store(&me->results.word, (uint32_t)seq);
        dt__bell_ring(&me->results);
    } else {
        entry *e = &dt__ch.slots[0]->host[seq & 1];
        while (atomic_load_explicit(&e->seq, memory_order_acquire) != seq) {
            drive_progress(&w);
            if (dt__wait_pause_on(&w, &dt__ch.slots[0]->results, (uint32_t)seq)) {
                /* name this host's clients that have not arrived, else the other hosts */
                bool *done = calloc((size_t)dt__ch.host_size, sizeof *done);
                char miss[256] = "";
                if (done) {
                    int k = 0;
                    for (int i = 0; i < dt__ch.host_size; i++) {
                        entry *m = &dt__ch.slots[i]->mine[seq & 1];
                        done[i] = atomic_load_explicit(&m->seq, memory_order_acquire) == seq;
                        k += !done[i];
                    }
                    if (k) {
                        missing_str(miss, sizeof miss, dt__ch.members, done, dt__ch.host_size,
                                    false);
                    } else { /* the host is complete: its leader waits for the other hosts */
                        int *others = malloc(sizeof(int) * (size_t)dt__rt.num_clients), no = 0;
                        for (int c = 0; others && c < dt__rt.num_clients; c++)
                            if (dt__ch.leader_of[c] != dt__ch.members[0])
                                others[no++] = c;
                        char list[160] = "";
                        if (others)
                            dt__clients_str(list, sizeof list, others, no);
                        snprintf(miss, sizeof miss,
                                 "%s (the other hosts, through this host's leader, client %d)",
                                 list, dt__ch.members[0]);
                        free(others);
                    }
                }
                free(done);
                s = dt__gave_up(&w, "in the agreement of all clients", miss);
                break;
            }
        }
        if (s == DT_OK)
            memcpy(out, e->v, sizeof e->v);
        if (s == DT_OK && out[0] == LEADER_GAVE_UP)
            s = dt__fail(DT_ERR_COMM,
                         "%s: client %d, the leader of this client's host, gave up waiting for "
                         "the other hosts in the agreement of all clients (DTENSOR_TIMEOUT is %d "
                         "s): a client died, or is stuck in another call; stop the program",
                         dt__current_call(), dt__ch.members[0], dt__rt.timeout_s);
    }
    dt__wait_end(&w);
    if (s != DT_OK) { /* a late client reading this agreement sees a failure */
        uint64_t failed[3] = {1, v[1], v[2]};
        memcpy(me->mine[seq & 1].v, failed, sizeof failed);
        atomic_thread_fence(memory_order_seq_cst);
    }
    return s;
}

/* ---- the rare path ----------------------------------------------------------------------- */

typedef struct verdict {
    uint64_t seq;
    int32_t status;
    int32_t nfields;
    uint64_t fingerprint;
    char what[40];
    char msg[464];
    uint64_t hash[DT__AGREE_FIELDS];
} verdict;

typedef struct shown {
    char name[sizeof((dt__field *)0)->name];
    char text[sizeof((dt__field *)0)->text];
} shown;

/* The channel's own fields (the call, its mesh, the op number on that mesh), then the
 * caller's. Returns the count. */
static int all_fields(const dt__agreement *a, dt__field *f)
{
    int n = 0;
    dt__field_set(&f[n++], "operation", NULL, 0, "%s", a->what);
    if (a->mesh) {
        char mb[160];
        dt_mesh_format(a->mesh, mb, sizeof mb);
        uint64_t id[2] = {a->mesh->content, a->mesh->agree_id};
        dt__field_set(&f[n++], "mesh", id, sizeof id, "%s (mesh #%llu)", mb,
                      (unsigned long long)a->mesh->agree_id);
        dt__field_set(&f[n++], "op number on the mesh", &a->mesh->agree_seq,
                      sizeof a->mesh->agree_seq, "%llu", (unsigned long long)a->mesh->agree_seq);
    } else {
        dt__field_set(&f[n++], "mesh", NULL, 0, "none (all clients)");
        dt__field_set(&f[n++], "op number on the mesh", NULL, 0, "-");
    }
    if (a->fields)
        n += a->fields(a->ctx, f + n, DT__AGREE_FIELDS - n);
    return n < DT__AGREE_FIELDS ? n : DT__AGREE_FIELDS;
}

static uint64_t field_hash(const verdict *v, int i)
{
    return i < v->nfields ? v->hash[i] : 0x5a5a5a5a5a5a5a5aull; /* an absent field */
}

static int garble = INT_MIN; /* dt__agree_test_garble */

void dt__agree_test_garble(int status)
{
    garble = status;
}

static dt_status rare_path(const dt__agreement *a, dt_status local, uint64_t fp)
{
    int n = dt__rt.num_clients, me = dt__rt.client;
    verdict *all = malloc(sizeof *all * (size_t)n), mine;
    dt__field *f = malloc(sizeof *f * DT__AGREE_FIELDS);
    int *ranks = malloc(sizeof(int) * (size_t)n);
    shown *texts = NULL;
    dt_status s = DT_OK;
    if (!all || !f || !ranks) {
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory for the agreement of %d clients", a->what, n);
        goto done;
    }
    memset(&mine, 0, sizeof mine);
    mine.seq = dt__ch.seq;
    mine.status = (int32_t)local;
    mine.fingerprint = fp;
    snprintf(mine.what, sizeof mine.what, "%s", a->what);
    if (local != DT_OK) {
        snprintf(mine.msg, sizeof mine.msg, "%s", dt_last_error());
    } else {
        mine.nfields = all_fields(a, f);
        for (int i = 0; i < mine.nfields; i++)
            mine.hash[i] = f[i].hash;
    }
    if (garble != INT_MIN) { /* a peer sending what no client would: the others must cope */
        mine.status = garble;
        memset(mine.msg, 'A', sizeof mine.msg);
        garble = INT_MIN;
    }
    for (int c = 0; c < n; c++)
        ranks[c] = c;
    s = swap(ranks, n, me, &mine, all, sizeof mine, KIND_VERDICT,
             "in the agreement of all clients (exchanging verdicts)", false);
    if (s != DT_OK)
        goto done;
    /* whatever a peer sent: bounded strings, statuses in range, its sequence */
    int first_failed = -1, failures = 0;
    for (int c = 0; c < n; c++) {
        verdict *v = &all[c];
        v->what[sizeof v->what - 1] = v->msg[sizeof v->msg - 1] = '\0';
        if (v->nfields < 0 || v->nfields > DT__AGREE_FIELDS)
            v->nfields = 0;
        if (v->seq != dt__ch.seq) {
            snprintf(v->msg, sizeof v->msg,
                     "sent its part of agreement %llu while this client is at %llu (out of step)",
                     (unsigned long long)v->seq, (unsigned long long)dt__ch.seq);
            v->status = DT_ERR_COMM;
        } else if (v->status < 0 || v->status >= DT_STATUS_COUNT) {
            snprintf(v->msg, sizeof v->msg, "sent status %d, which is not a status",
                     (int)v->status);
            v->status = DT_ERR_COMM;
        }
        if (v->status != DT_OK) {
            failures++;
            if (first_failed < 0)
                first_failed = c;
        }
    }
    if (first_failed >= 0) {
        if (local != DT_OK)
            dt__set_error(mine.msg); /* a failing client keeps its own message */
        s = local != DT_OK ? local
                           : dt__fail((dt_status)all[first_failed].status, "client %d: %s%s",
                                      first_failed, all[first_failed].msg,
                                      failures > 1 ? " (other clients failed too)" : "");
        goto done;
    }
    /* no failure: the first field in which some client differs from client 0 */
    int most = 0, field = -1;
    for (int c = 0; c < n; c++)
        most = all[c].nfields > most ? all[c].nfields : most;
    for (int i = 0; field < 0 && i < most; i++)
        for (int c = 1; c < n; c++)
            if (field_hash(&all[c], i) != field_hash(&all[0], i)) {
                field = i;
                break;
            }
    if (field < 0) {
        int other = 1;
        while (other < n - 1 && all[other].fingerprint == all[0].fingerprint)
            other++;
        s = dt__fail(DT_ERR_MISMATCH,
                     "%s: clients differ: client 0 and client %d bring different fingerprints "
                     "(%016llx, %016llx) in no field described",
                     a->what, other, (unsigned long long)all[0].fingerprint,
                     (unsigned long long)all[other].fingerprint);
        goto done;
    }
    shown one = {{0}, {0}};
    if (field < mine.nfields) {
        snprintf(one.name, sizeof one.name, "%s", f[field].name);
        snprintf(one.text, sizeof one.text, "%s", f[field].text);
    } else {
        snprintf(one.name, sizeof one.name, "field %d", field);
        snprintf(one.text, sizeof one.text, "(nothing)");
    }
    texts = malloc(sizeof *texts * (size_t)n);
    s = texts ? swap(ranks, n, me, &one, texts, sizeof one, KIND_FIELD,
                     "in the agreement of all clients (exchanging a field)", false)
              : dt__fail(DT_ERR_NOMEM, "%s: out of memory", a->what);
    if (s != DT_OK)
        goto done;
    int differ[8], nd = 0, total = 0;
    for (int c = 1; c < n; c++)
        if (field_hash(&all[c], field) != field_hash(&all[0], field)) {
            if (nd < 8)
                differ[nd++] = c;
            total++;
        }
    for (int c = 0; c < n; c++) {
        texts[c].name[sizeof texts[c].name - 1] = '\0';
        texts[c].text[sizeof texts[c].text - 1] = '\0';
    }
    char who[192] = "";
    if (total > 1) {
        char list[96];
        dt__clients_str(list, sizeof list, differ, nd);
        snprintf(who, sizeof who, "; %d clients differ from client 0 (%s%s)", total, list,
                 total > nd ? ", ..." : "");
    }
    s = dt__fail(DT_ERR_MISMATCH, "%s: clients differ in %s: client 0 has %s, client %d has %s%s",
                 a->what, texts[0].name, texts[0].text, differ[0], texts[differ[0]].text, who);
done:
    free(texts);
    free(ranks);
    free(f);
    free(all);
    return s;
}

/* ---- agreements -------------------------------------------------------------------------- */

dt_status dt__agree_on(const dt__agreement *a, dt_status local)
{
    dt__set_current_call(a->what);
    if (!dt__ch.open)
        return local;
    dt__ch.seq++;
    uint64_t fp = dt__hash(a->fingerprint, a->what, strlen(a->what));
    if (a->mesh) {
        uint64_t id[3] = {a->mesh->content, a->mesh->agree_id, a->mesh->agree_seq};
        fp = dt__hash(fp, id, sizeof id);
    }
    dt_status s = local;
    if (dt__rt.num_clients > 1) {
        uint64_t v[3] = {local != DT_OK, fp, ~fp}, r[3];
        DT_TRY(combine(dt__ch.seq, v, r));
        if (!(r[0] == 0 && r[1] == ~r[2]))
            s = rare_path(a, local, fp);
    }
    /* counted on every client alike: only agreed successes, whose mesh every client shares */
    if (s == DT_OK && a->mesh)
        ((dt_mesh *)a->mesh)->agree_seq++;
    return s;
}

dt_status dt__mesh_agree(const dt_mesh *m, dt_status local, const dt__agreement *a)
{
    if (m && m->comm == MPI_COMM_NULL)
        return local; /* a client-local mesh: nothing to agree with */
    dt__agreement b = *a;
    b.mesh = m;
    return dt__agree_on(&b, local);
}

/* Clients of a communicator smaller than the world (a group of some clients): an all-reduce
 * of the verdicts, and the first failure's message when there is one. */
static dt_status agree_group(MPI_Comm comm, dt_status local, const char *what)
{
    int failed = local != DT_OK, any = 0, n;
    MPI_Request req;
    if (MPI_Iallreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm, &req) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "%s: MPI_Iallreduce failed", what);
    DT_TRY(dt__mpi_wait_for(1, &req, "in the agreement of a group of clients"));
    if (!any)
        return local;
    struct {
        int32_t status;
        char msg[476];
    } mine = {.status = (int32_t)local}, *every;
    if (local != DT_OK)
        snprintf(mine.msg, sizeof mine.msg, "%s", dt_last_error());
    MPI_Comm_size(comm, &n);
    every = malloc(sizeof *every * (size_t)n);
    if (!every)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", what);
    dt_status s = dt__allgather_bytes(comm, &mine, sizeof mine, every);
    for (int c = 0; s == DT_OK && c < n; c++) {
        every[c].msg[sizeof every[c].msg - 1] = '\0';
        if (every[c].status < 0 || every[c].status >= DT_STATUS_COUNT)
            every[c].status = DT_ERR_COMM;
        if (every[c].status == DT_OK)
            continue;
        if (local != DT_OK) {
            dt__set_error(mine.msg);
            s = local;
        } else {
            s = dt__fail((dt_status)every[c].status, "member %d of the group: %s", c, every[c].msg);
        }
        break;
    }
    free(every);
    return s;
}

dt_status dt__agree_status(MPI_Comm comm, dt_status local, const char *what)
{
    if (comm == MPI_COMM_NULL)
        return local;
    int size = 0;
    MPI_Comm_size(comm, &size);
    if (size < dt__rt.num_clients)
        return agree_group(comm, local, what);
    return dt__agree_on(&(dt__agreement){.what = what}, local);
}
