/* Waiting for other clients, and the agreement channel: how the clients settle, before any
 * data moves, that each of them is about to make the same call and that none has failed.
 *
 * The channel. Every agreement has a sequence number, the same on every client: the k-th
 * agreement of one client meets the k-th of every other, whatever mesh or call it is for (every
 * multi-client mesh spans all clients, so one channel serves them all, and a client one call
 * behind on one mesh is caught at its next agreement on any). A client brings its verdict and
 * a 64-bit fingerprint of what it is about to do; the channel combines (failed, fingerprint,
 * ~fingerprint) by maximum over the clients: all succeeded with one fingerprint iff
 * max(failed) == 0 and max(fingerprint) == ~max(~fingerprint).
 * - Clients sharing a host combine through a shared-memory window: each publishes
 *   (sequence, failed, fingerprint, ~fingerprint) in its slot (two entries, by the sequence's
 *   parity: a client cannot reach agreement k + 2 before every other has read k) and reads the
 *   others' slots; a client that waits long blocks on a futex until the last one arrives
 *   (a "bell"). With one host that is all; no MPI call is made.
 * - With several hosts, each host's first client (its leader) combines its host's slots, swaps
 *   the combination with the other leaders by point-to-point messages whose tag carries the
 *   sequence, and publishes the result for its host (and rings the host's other bell).
 * - Anything but "all succeeded, one fingerprint" takes the rare path, on every client alike:
 *   every client sends every other its verdict (status and message, or the hashes of the
 *   fields of its call), then, when no client failed, the text of the first field in which
 *   the clients differ. Messages are point-to-point with sequence tags on the channel's own
 *   communicator, of fixed size, NUL-terminated and range-checked on receipt.
 * Every wait watches the clock (DTENSOR_TIMEOUT) and, when it gives up, names the call, the
 * group and the clients whose part did not arrive. */
#include "dt.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- waiting ----------------------------------------------------------------------------- */

/* A wait spins while it is young (only when every client of the host has a core), then
 * yields the core between polls. A yield normally comes back within microseconds (the other
 * clients' polls); one that takes a millisecond means another process took the core for a
 * whole time slice -- and each later yield would hand it another. From then on, for a while,
 * this thread's waits sleep instead (pauses growing from 2 to 50 us): a sleeper wakes and
 * takes the core back from such a process within a timer's latency, where a yielder waits for
 * its slice. Idle machines never sleep, so short waits keep their latency.
 * A wait in the shared-memory agreement has something better than a pause to sleep on: a bell
 * (below) of its host, rung by the client whose entry completes the host's part, or by the
 * leader when it publishes the result of several hosts. Such a wait blocks on it where other
 * waits would sleep, so its client sees the agreement complete as soon as it does rather than
 * at its next pause's end, and also once it has yielded for DT__WAIT_BLOCK_AFTER_S: a wait
 * that long is not about to end, and each yield is a system call on a core that a computing
 * client could use. Measured on 2 cores (README "Failure model"). */
#define DT__WAIT_SPIN_POLLS 256    /* about 20-30 us of polls and pauses */
#define DT__WAIT_SLOW_YIELD_S 1e-3 /* a yield this long: the core went to another process */
#define DT__WAIT_SLEEPY_S 0.05     /* how long waits sleep after a slow yield */
#define DT__WAIT_SLEEP_MIN_NS 2000
#define DT__WAIT_SLEEP_MAX_NS 50000
/* A wait blocked on a bell still wakes this often: to check the clock (DTENSOR_TIMEOUT) and
 * drive MPI's progress. */
#define DT__WAIT_BLOCK_NS 2000000
#define DT__WAIT_BLOCK_AFTER_S 2e-4 /* a wait on a bell this old blocks, slow yield or not */
/* The timer slack of a sleeping waiter (the kernel's default of 50 us would stretch every
 * pause to that); restored when the wait ends. */
#define DT__WAIT_SLACK_NS 1000
/* A wait this old asks whether a client was lost (mesh/watch.c), and again this often: a dead
 * client is named in well under a second on one host, within the heartbeat's silence across
 * hosts, whatever DTENSOR_TIMEOUT is. */
#define DT__WATCH_AFTER_S 0.1
#define DT__WATCH_EVERY_S 0.1

/* Until when this thread's waits sleep rather than yield (a slow yield was seen). */
static _Thread_local double sleepy_until;

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void dt__wait_begin(dt__waiter *w)
{
    *w = (dt__waiter){.spin = dt__rt.cores > 0 && dt__rt.clients_on_host <= dt__rt.cores,
                      .slack = -1};
}

/* A bell: a 32-bit word in the shared-memory window that only grows (modulo 2^32) and the
 * count of clients asleep on it (a futex). A waiter wants the word to reach a mark; whoever
 * moves the word past the mark rings, which costs a system call only when someone sleeps.
 *
 * Why no wake-up is lost: the waiter adds itself to `sleepers`, then reads the word, then sleeps
 * only while the word still holds what it read (FUTEX_WAIT compares atomically with going to
 * sleep); the ringer moves the word, then reads `sleepers`. All four are seq_cst, so they fall
 * in one total order: either the ringer's read of `sleepers` comes after the waiter's increment
 * (it sees a sleeper and wakes it, or FUTEX_WAIT finds the word moved and returns at once), or
 * it comes before, and then so does the move of the word, which the waiter's read then sees
 * (it does not sleep). The futex is not private: the window is shared between processes. */
typedef struct bell {
    _Atomic uint32_t word;
    _Atomic uint32_t sleepers;
} bell;

static bool bell_reached(uint32_t word, uint32_t mark)
{
    return (int32_t)(word - mark) >= 0; /* wrap-safe: the two are never 2^31 apart */
}

/* Sleep on the bell until its word reaches `mark`, a wake, or `ns` have passed. */
static void bell_sleep(bell *b, uint32_t mark, long ns)
{
    atomic_fetch_add(&b->sleepers, 1);
    uint32_t seen = atomic_load(&b->word);
    if (!bell_reached(seen, mark))
        syscall(SYS_futex, &b->word, FUTEX_WAIT, seen, &(struct timespec){.tv_nsec = ns}, NULL, 0);
    atomic_fetch_sub(&b->sleepers, 1);
}

/* Wake everyone asleep on the bell (after its word moved). */
static void bell_ring(bell *b)
{
    if (atomic_load(&b->sleepers))
        syscall(SYS_futex, &b->word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The pause of a wait for bell `b` to reach `mark`, or of a wait with nothing to sleep on (b
 * NULL): dt__wait_pause. True once the wait has lasted DTENSOR_TIMEOUT. */
static bool wait_pause(dt__waiter *w, bell *b, uint32_t mark)
{
    /* young: spin without reading the clock (a read costs as much as a short wait) */
    if (w->spin && w->polls < DT__WAIT_SPIN_POLLS) {
        w->polls++;
        cpu_relax();
        return false;
    }
    double now = seconds_now();
    if (w->start == 0)
        w->start = now;
    double waited = now - w->start;
    w->waited = waited;
    if (waited > dt__rt.timeout_s)
        return true;
    if (dt__watch_lost() || (waited >= DT__WATCH_AFTER_S && now >= w->watch_at)) {
        w->watch_at = now + DT__WATCH_EVERY_S;
        if (dt__watch_poll()) {
            w->lost = true;
            return true;
        }
    }
    if (b && (now < sleepy_until || waited > DT__WAIT_BLOCK_AFTER_S)) {
        bell_sleep(b, mark, DT__WAIT_BLOCK_NS);
        return false;
    }
    if (now >= sleepy_until) {
        sched_yield();
        double back = seconds_now();
        if (back - now > DT__WAIT_SLOW_YIELD_S)
            sleepy_until = back + DT__WAIT_SLEEPY_S;
        return false;
    }
    if (w->slack < 0) {
        int old = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        w->slack = old > 0 && prctl(PR_SET_TIMERSLACK, DT__WAIT_SLACK_NS, 0, 0, 0) == 0 ? old : 0;
        w->sleep_ns = DT__WAIT_SLEEP_MIN_NS;
    }
    nanosleep(&(struct timespec){.tv_nsec = w->sleep_ns}, NULL);
    w->sleep_ns = w->sleep_ns * 2 > DT__WAIT_SLEEP_MAX_NS ? DT__WAIT_SLEEP_MAX_NS : w->sleep_ns * 2;
    return false;
}

bool dt__wait_pause(dt__waiter *w)
{
    return wait_pause(w, NULL, 0);
}

void dt__wait_end(dt__waiter *w)
{
    if (w->slack > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)w->slack, 0, 0, 0);
    w->slack = -1;
}

/* The call this thread is making (set by each agreement): what a timeout names. */
static _Thread_local const char *current_call;

const char *dt__current_call(void)
{
    return current_call ? current_call : "(no call)";
}

void dt__set_current_call(const char *what)
{
    current_call = what;
}

dt_status dt__gave_up(const dt__waiter *w, const char *where, const char *missing)
{
    if (w->lost) {
        char why[160];
        dt__watch_why(why, sizeof why);
        return dt__fail(DT_ERR_COMM,
                        "%s: client %d stopped waiting %s after %.1f s: %s; what it waited for "
                        "stays pending, stop the program (dt_finalize waits for no one now)",
                        dt__current_call(), dt__rt.client, where, w->waited, why);
    }
    return dt__fail(DT_ERR_COMM,
                    "%s: client %d waited %.1f s %s and gave up (DTENSOR_TIMEOUT is %d s)%s%s: a "
                    "client died, or is stuck in another call; what it waited for stays "
                    "pending, stop the program",
                    dt__current_call(), dt__rt.client, w->waited, where, dt__rt.timeout_s,
                    missing && *missing ? "; not heard from " : "", missing ? missing : "");
}

/* "clients 0-3" or "client 2" for the run [first, last]. */
static size_t clients_str(char *buf, size_t size, const int ranks[], int n)
{
    size_t k = (size_t)snprintf(buf, size, "client%s ", n == 1 ? "" : "s");
    for (int i = 0; i < n && k < size; i++) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        if (j > i + 1)
            k += (size_t)snprintf(buf + k, size - k, "%s%d-%d", i ? ", " : "", ranks[i], ranks[j]);
        else
            k += (size_t)snprintf(buf + k, size - k, "%s%d", i ? ", " : "", ranks[i]);
        if (j > i + 1)
            i = j;
    }
    return k < size ? k : size - 1;
}

void dt__clients_str(char *buf, size_t size, const int ranks[], int n)
{
    if (size)
        clients_str(buf, size, ranks, n);
}

/* What MPI says of an error: the last line of its message (MPICH's is a stack, innermost
 * last, e.g. "... MPIDI_UCX_send Endpoint timeout)"). */
static void mpi_says(int err, char *buf, size_t size)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS || len <= 0) {
        snprintf(buf, size, "error %d", err);
        return;
    }
    text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' '))
        text[--len] = '\0';
    const char *last = strrchr(text, '\n');
    last = last ? last + 1 : text;
    size_t keep = size > 4 ? size - 4 : 0, len_last = strlen(last);
    if (len_last > keep) /* the cause ends the line: keep its end */
        snprintf(buf, size, "...%s", last + len_last - keep);
    else
        snprintf(buf, size, "%s", last);
}

/* A message to or from `client` failed in MPI: it is lost (unreachable), and the wait stops
 * naming it, or the client a liveness check found lost first. */
static dt_status message_failed(int client, int err, const char *where)
{
    char says[96];
    mpi_says(err, says, sizeof says);
    dt__watch_unreachable(client, says);
    dt__waiter w;
    dt__wait_begin(&w);
    w.lost = dt__watch_poll();
    return dt__gave_up(&w, where, NULL);
}

dt_status dt__mpi_wait_for(int n, MPI_Request reqs[], const char *where)
{
    MPI_Status st[8];
    dt__waiter w;
    dt__wait_begin(&w);
    dt_status s = DT_OK;
    for (;;) {
        int done = 1;
        for (int i = 0; i < n; i += 8) {
            int k = n - i < 8 ? n - i : 8, flag = 0;
            int e = MPI_Testall(k, reqs + i, &flag, st);
            if (e != MPI_SUCCESS) { /* which client is unknown: a liveness check may tell */
                char says[160];
                mpi_says(e, says, sizeof says);
                w.lost = dt__watch_poll();
                s = w.lost ? dt__gave_up(&w, where, NULL)
                           : dt__fail(DT_ERR_COMM, "%s: a message failed %s (MPI: %s)",
                                      dt__current_call(), where, says);
                goto done;
            }
            done &= flag;
        }
        if (done)
            break;
        if (dt__wait_pause(&w)) {
            s = dt__gave_up(&w, where, NULL);
            break;
        }
    }
done:
    dt__wait_end(&w);
    return s;
}

dt_status dt__mpi_wait_all(int n, MPI_Request reqs[])
{
    return dt__mpi_wait_for(n, reqs, "for all clients");
}

dt_status dt__allgather_bytes(MPI_Comm comm, const void *send, size_t bytes, void *recv)
{
    if (comm == MPI_COMM_NULL) {
        memcpy(recv, send, bytes);
        return DT_OK;
    }
    if (bytes > INT_MAX)
        return dt__fail(DT_ERR_ARG, "allgather: %zu bytes per client exceed INT_MAX", bytes);
    MPI_Request req;
    if (MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm, &req) !=
        MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "MPI_Iallgather of %zu bytes failed", bytes);
    return dt__mpi_wait_all(1, &req);
}

uint64_t dt__hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* a word at a time, mixed down */
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ---- fields: what the clients compare when they differ ----------------------------------- */

void dt__field_set(dt__field *f, const char *name, const void *raw, size_t raw_bytes,
                   const char *fmt, ...)
{
    snprintf(f->name, sizeof f->name, "%s", name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof f->text, fmt, ap);
    va_end(ap);
    f->hash = raw ? dt__hash(DT__HASH_SEED, raw, raw_bytes)
                  : dt__hash(DT__HASH_SEED, f->text, strlen(f->text));
}

/* ---- the channel ------------------------------------------------------------------------- */

/* One client's part of agreement `seq` (or its host's combination, published by the leader). */
typedef struct entry {
    _Atomic uint64_t seq; /* written last (release): the other words belong to this agreement */
    uint64_t v[3];        /* failed, fingerprint, ~fingerprint */
} entry;

/* A client's slot in its host's window: its own entries and, on the leader, the host's
 * result, each pair on a cache line of its own; then, used on the leader's slot only, the
 * host's bells: `arrivals` counts the entries the host's clients published (agreement k is
 * complete on the host when it reaches k * host_size), `results` is the sequence of the last
 * result the leader published for the host. */
typedef struct slot {
    entry mine[2];
    entry host[2];
    bell arrivals;
    bell results;
    char pad[64 - 2 * sizeof(bell)];
} slot;

_Static_assert(sizeof(entry) == 32, "two entries per cache line");

static struct channel {
    bool open;
    MPI_Comm comm; /* agreement messages only: a dup of the world, errors returned */
    MPI_Comm host; /* the clients sharing this host's window */
    MPI_Win win;
    MPI_Win stage_win; /* the staging regions, when the host is every client */
    char **stage;      /* per host member: its two regions (by agreement parity) */
    int host_rank, host_size;
    int *members;   /* world ranks of this host's clients, in host order (leader first) */
    slot **slots;   /* their slots */
    int *leader_of; /* per client: the world rank of its host's leader */
    int *leaders;   /* world ranks of the hosts' leaders, ascending */
    int nleaders;
    int leader_index; /* this host's place among the leaders */
    uint64_t seq;
} ch = {
    .comm = MPI_COMM_NULL, .host = MPI_COMM_NULL, .win = MPI_WIN_NULL, .stage_win = MPI_WIN_NULL};

/* Tags of the channel's messages: the sequence (modulo what every MPI allows) and the kind. */
enum { KIND_LEADERS, KIND_VERDICT, KIND_FIELD, KIND_COUNT };
static int tag_of(uint64_t seq, int kind)
{
    return 1 + (int)(seq % 8000u) * KIND_COUNT + kind;
}

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
    if (ch.win != MPI_WIN_NULL && !lost)
        MPI_Win_free(&ch.win);
    if (ch.stage_win != MPI_WIN_NULL && !lost)
        MPI_Win_free(&ch.stage_win);
    if (ch.host != MPI_COMM_NULL && !lost)
        MPI_Comm_free(&ch.host);
    if (ch.comm != MPI_COMM_NULL && !lost)
        MPI_Comm_free(&ch.comm);
    free(ch.members);
    free(ch.slots);
    free(ch.leader_of);
    free(ch.leaders);
    free(ch.stage);
    ch = (struct channel){.comm = MPI_COMM_NULL,
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
    if (MPI_Win_allocate_shared((MPI_Aint)(2 * DT__STAGE_BYTES), 1, MPI_INFO_NULL, ch.host, &mine,
                                &ch.stage_win) != MPI_SUCCESS)
        return dt__fail(DT_ERR_COMM, "dt_init: cannot allocate %zu bytes of shared staging",
                        2 * DT__STAGE_BYTES);
    ch.stage = malloc(sizeof *ch.stage * (size_t)ch.host_size);
    if (!ch.stage)
        return dt__fail(DT_ERR_NOMEM, "dt_init: out of memory");
    for (int i = 0; i < ch.host_size; i++) {
        MPI_Aint size;
        int unit;
        if (MPI_Win_shared_query(ch.stage_win, i, &size, &unit, &ch.stage[i]) != MPI_SUCCESS)
            return dt__fail(DT_ERR_COMM, "dt_init: MPI_Win_shared_query failed");
    }
    return DT_OK;
}

size_t dt__stage_capacity(void)
{
    return ch.open && ch.stage ? DT__STAGE_BYTES : 0;
}

void *dt__stage_next(void)
{
    return ch.stage[ch.host_rank] + ((ch.seq + 1) & 1) * DT__STAGE_BYTES;
}

const void *dt__stage_last(int client)
{
    int i = 0;
    while (i < ch.host_size - 1 && ch.members[i] != client)
        i++;
    return ch.stage[i] + (ch.seq & 1) * DT__STAGE_BYTES;
}

int dt__host_of(int client)
{
    return ch.open && client >= 0 && client < dt__rt.num_clients ? ch.leader_of[client] : -1;
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
    if (MPI_Comm_idup(dt__rt.world, &ch.comm, &req) != MPI_SUCCESS)
        s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_idup failed");
    else
        s = dt__mpi_wait_all(1, &req);
    if (s == DT_OK)
        MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN);
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
        if (MPI_Comm_split(mode == 1 ? dt__rt.world : shared, color, key, &ch.host) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_split failed");
    }
    if (shared != MPI_COMM_NULL)
        MPI_Comm_free(&shared);
    slot *mine = NULL;
    if (s == DT_OK) {
        MPI_Comm_rank(ch.host, &ch.host_rank);
        MPI_Comm_size(ch.host, &ch.host_size);
        if (MPI_Win_allocate_shared((MPI_Aint)sizeof(slot), 1, MPI_INFO_NULL, ch.host, &mine,
                                    &ch.win) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: cannot allocate the agreement's shared memory");
    }
    if (s == DT_OK) {
        memset(mine, 0, sizeof *mine);
        ch.members = malloc(sizeof(int) * (size_t)ch.host_size);
        ch.slots = malloc(sizeof(slot *) * (size_t)ch.host_size);
        ch.leader_of = malloc(sizeof(int) * (size_t)n);
        ch.leaders = malloc(sizeof(int) * (size_t)n);
        if (!ch.members || !ch.slots || !ch.leader_of || !ch.leaders)
            s = dt__fail(DT_ERR_NOMEM, "dt_init: out of memory for the agreement of %d clients", n);
    }
    if (s == DT_OK) {
        MPI_Group hg, wg;
        MPI_Comm_group(ch.host, &hg);
        MPI_Comm_group(dt__rt.world, &wg);
        int *idx = ch.leaders; /* scratch until the leaders are known */
        for (int i = 0; i < ch.host_size; i++)
            idx[i] = i;
        MPI_Group_translate_ranks(hg, ch.host_size, idx, wg, ch.members);
        MPI_Group_free(&hg);
        MPI_Group_free(&wg);
        for (int i = 0; s == DT_OK && i < ch.host_size; i++) {
            MPI_Aint size;
            int unit;
            if (MPI_Win_shared_query(ch.win, i, &size, &unit, &ch.slots[i]) != MPI_SUCCESS)
                s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Win_shared_query failed");
        }
    }
    if (s == DT_OK) {
        int leader = ch.members[0];
        s = dt__allgather_bytes(dt__rt.world, &leader, sizeof leader, ch.leader_of);
    }
    if (s == DT_OK) {
        ch.nleaders = 0;
        for (int c = 0; c < n; c++)
            if (ch.leader_of[c] == c) {
                if (c == ch.members[0])
                    ch.leader_index = ch.nleaders;
                ch.leaders[ch.nleaders++] = c;
            }
    }
    if (s == DT_OK && ch.nleaders == 1)
        s = stage_open();
    if (s == DT_OK)
        s = dt__watch_open(ch.host, ch.members, ch.leader_of, ch.leaders, ch.nleaders);
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
    ch.seq = 0;
    ch.open = true;
    return DT_OK;
}

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
    return (uint32_t)(seq * (uint64_t)ch.host_size);
}

/* Count this client's entry of `seq` in (after publishing it); the client that completes the
 * host wakes those asleep waiting for it. */
static void arrive(uint64_t seq)
{
    bell *b = &ch.slots[0]->arrivals;
    if (bell_reached(atomic_fetch_add(&b->word, 1) + 1, arrivals_mark(seq)))
        bell_ring(b);
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
            if (!done[i] && ch.leader_of[c] == ranks[i]) {
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
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, ch.comm, &flag, MPI_STATUS_IGNORE);
    }
}

/* The host's part: wait for every member's entry of `seq` and fold it into acc. */
static dt_status host_fold(uint64_t seq, uint64_t acc[3], dt__waiter *w)
{
    int n = ch.host_size, left = n - 1;
    bool stack[64], *done = n <= 64 ? stack : calloc((size_t)n, sizeof *done);
    if (!done)
        return dt__fail(DT_ERR_NOMEM, "agreement: out of memory");
    memset(done, 0, sizeof *done * (size_t)n);
    done[ch.host_rank] = true;
    dt_status s = DT_OK;
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            entry *e = &ch.slots[i]->mine[seq & 1];
            if (atomic_load_explicit(&e->seq, memory_order_acquire) == seq) {
                fold(acc, e->v);
                done[i] = true;
                left--;
            }
        }
        if (left > 0)
            drive_progress(w);
        if (left > 0 && wait_pause(w, &ch.slots[0]->arrivals, arrivals_mark(seq))) {
            char miss[256];
            missing_str(miss, sizeof miss, ch.members, done, n, false);
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
    int tag = tag_of(ch.seq, kind);
    dt_status s = DT_OK;
    for (int i = 0; i < n; i++) {
        req[i] = req[n + i] = MPI_REQUEST_NULL;
        done[i] = done[n + i] = i == self;
        if (i == self || s != DT_OK)
            continue;
        int e = MPI_Irecv(in + (size_t)i * bytes, (int)bytes, MPI_BYTE, ranks[i], tag, ch.comm,
                          &req[i]);
        if (e == MPI_SUCCESS)
            e = MPI_Isend(out, (int)bytes, MPI_BYTE, ranks[i], tag, ch.comm, &req[n + i]);
        if (e != MPI_SUCCESS) /* MPI knows it cannot reach the client (its host is gone) */
            s = message_failed(ranks[i], e, where);
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
                s = message_failed(ranks[i % n], e, where);
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
    slot *me = ch.slots[ch.host_rank];
    publish(&me->mine[seq & 1], seq, v);
    arrive(seq);
    memcpy(out, v, sizeof(uint64_t) * 3);
    dt__waiter w;
    dt__wait_begin(&w);
    dt_status s = DT_OK;
    if (ch.nleaders == 1) {
        s = host_fold(seq, out, &w);
    } else if (ch.host_rank == 0) {
        s = host_fold(seq, out, &w);
        uint64_t mine[4] = {seq, out[0], out[1], out[2]}, *all = NULL;
        if (s == DT_OK) {
            all = malloc(sizeof mine * (size_t)ch.nleaders);
            s = all ? swap(ch.leaders, ch.nleaders, ch.leader_index, mine, all, sizeof mine,
                           KIND_LEADERS, "in the agreement of all clients (between hosts)", true)
                    : dt__fail(DT_ERR_NOMEM, "agreement: out of memory");
        }
        for (int h = 0; s == DT_OK && h < ch.nleaders; h++) {
            if (all[h * 4] != seq)
                s = dt__fail(DT_ERR_COMM,
                             "%s: the leader of client %d's host sent agreement %llu, this host "
                             "is at %llu: out of step",
                             dt__current_call(), ch.leaders[h], (unsigned long long)all[h * 4],
                             (unsigned long long)seq);
            else
                fold(out, &all[h * 4 + 1]);
        }
        free(all);
        /* the host learns the result, or that its leader gave up */
        uint64_t failed[3] = {LEADER_GAVE_UP, 0, 0};
        publish(&me->host[seq & 1], seq, s == DT_OK ? out : failed);
        atomic_store(&me->results.word, (uint32_t)seq);
        bell_ring(&me->results);
    } else {
        entry *e = &ch.slots[0]->host[seq & 1];
        while (atomic_load_explicit(&e->seq, memory_order_acquire) != seq) {
            drive_progress(&w);
            if (wait_pause(&w, &ch.slots[0]->results, (uint32_t)seq)) {
                /* name this host's clients that have not arrived, else the other hosts */
                bool *done = calloc((size_t)ch.host_size, sizeof *done);
                char miss[256] = "";
                if (done) {
                    int k = 0;
                    for (int i = 0; i < ch.host_size; i++) {
                        entry *m = &ch.slots[i]->mine[seq & 1];
                        done[i] = atomic_load_explicit(&m->seq, memory_order_acquire) == seq;
                        k += !done[i];
                    }
                    if (k) {
                        missing_str(miss, sizeof miss, ch.members, done, ch.host_size, false);
                    } else { /* the host is complete: its leader waits for the other hosts */
                        int *others = malloc(sizeof(int) * (size_t)dt__rt.num_clients), no = 0;
                        for (int c = 0; others && c < dt__rt.num_clients; c++)
                            if (ch.leader_of[c] != ch.members[0])
                                others[no++] = c;
                        char list[160] = "";
                        if (others)
                            dt__clients_str(list, sizeof list, others, no);
                        snprintf(miss, sizeof miss,
                                 "%s (the other hosts, through this host's leader, client %d)",
                                 list, ch.members[0]);
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
                         dt__current_call(), ch.members[0], dt__rt.timeout_s);
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
    mine.seq = ch.seq;
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
        if (v->seq != ch.seq) {
            snprintf(v->msg, sizeof v->msg,
                     "sent its part of agreement %llu while this client is at %llu (out of step)",
                     (unsigned long long)v->seq, (unsigned long long)ch.seq);
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
    current_call = a->what;
    if (!ch.open)
        return local;
    ch.seq++;
    uint64_t fp = dt__hash(a->fingerprint, a->what, strlen(a->what));
    if (a->mesh) {
        uint64_t id[3] = {a->mesh->content, a->mesh->agree_id, a->mesh->agree_seq};
        fp = dt__hash(fp, id, sizeof id);
    }
    dt_status s = local;
    if (dt__rt.num_clients > 1) {
        uint64_t v[3] = {local != DT_OK, fp, ~fp}, r[3];
        DT_TRY(combine(ch.seq, v, r));
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
