/* Liveness of the other clients: a client that died is found in seconds, not at the timeout.
 *
 * A wait for other clients (mesh/wait.c's dt__wait_pause_on: the agreement, dt__mpi_wait_for, the
 * collectives) asks dt__watch_poll once it has lasted DT__WATCH_AFTER_S, then every
 * DT__WATCH_EVERY_S. A client is lost when:
 * - its process is gone, for the clients of this client's host (those sharing the agreement's
 *   window, so one machine): each published its pid, the start time of its process and its
 *   pid namespace in the window at dt_init; /proc/PID/stat missing, a zombie, or another start
 *   time (the pid reused) means the process ended. Clients in another pid namespace are not
 *   judged this way;
 * - its host is silent, for clients of other hosts: each host's leader (its first client) runs
 *   a heartbeat thread that every DT__BEAT_S sends a small message to every other leader over a
 *   communicator of its own and receives theirs, noting the time each host was last heard from
 *   in the window, and telling the others which of its host's clients died. A host not heard
 *   from for DT__SILENT_S (while this host's own thread keeps beating) is lost, every client of
 *   it. The thread beats whatever the clients do (compute for minutes, sleep in user code), so
 *   a slow client is never taken for a dead one: DTENSOR_TIMEOUT stays the bound for those. It
 *   needs MPI_THREAD_MULTIPLE (dt_init asks for it when it starts MPI); without it, clients of
 *   other hosts are only ever timed out;
 * - MPI reported it unreachable (a message to it failed: dt__watch_unreachable).
 * A loss is recorded in the window (every client of the host sees it) and never forgotten:
 * every later wait on other clients fails at once, and dt_finalize releases this client's own
 * resources without waiting for anyone (no agreement, no collective free, MPI not finalized). */
#include "dt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DT__BEAT_S 0.2   /* a leader's heartbeat period */
#define DT__SILENT_S 5.0 /* a host not heard from this long is lost */

/* Why a client is lost (a byte per client in the window; the first cause recorded stays). */
enum { ALIVE = 0, GONE, UNREACHABLE, SILENT };

/* What each client of a host publishes at dt_init, to be judged by the others. */
typedef struct member {
    int64_t pid;
    uint64_t start; /* its process's start time, clock ticks after boot (/proc/PID/stat) */
    uint64_t pidns; /* inode of its pid namespace */
} member;

/* A heartbeat: the sender's host and the clients of it that died (up to 7 named). */
typedef struct beat {
    int32_t gone_count;
    int32_t gone[7];
} beat;

static struct watch {
    bool open;
    MPI_Win win;
    MPI_Comm comm; /* heartbeats only: a dup of the world */
    int n, host_size, host_rank, nleaders, leader_index;
    int *members;              /* world ranks of this host's clients */
    int *leader_of;            /* per client: its host's leader */
    int *leaders;              /* the hosts' leaders, ascending */
    member *me;                /* the host's member records (host_size) */
    _Atomic uint8_t *lost;     /* per client: ALIVE or why it is lost */
    _Atomic uint64_t *heard;   /* per host (leader index): when last heard from, ns */
    _Atomic uint64_t *beat_at; /* when this host's heartbeat thread last beat, ns */
    _Atomic uint32_t *beating; /* this host's leader runs a heartbeat thread */
    uint64_t pidns;
    pthread_t thread;
    bool beats; /* every host's leader runs a heartbeat thread */
    bool thread_started;
    atomic_bool stop;
    MPI_Request *sends; /* per leader: the last heartbeat sent to it */
    beat *out;          /* per leader: its buffer */
} w = {.win = MPI_WIN_NULL, .comm = MPI_COMM_NULL};

/* A loss this client recorded (or saw) is never forgotten, not even by dt_finalize: a later
 * dt_init in this process would wait for the dead client. `why` is this client's account of
 * the first loss it saw (written by a wait or the heartbeat thread, under why_lock). */
static atomic_bool lost_ever;
static pthread_mutex_t why_lock = PTHREAD_MUTEX_INITIALIZER;
static char why[160];
/* What a loss leaves to MPI (heartbeats on their way to a lost host): kept reachable. */
static void *abandoned[4];

static void note_why(const char *text)
{
    pthread_mutex_lock(&why_lock);
    if (!why[0])
        snprintf(why, sizeof why, "%s", text);
    pthread_mutex_unlock(&why_lock);
    atomic_store(&lost_ever, true);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The state and start time of process pid, from /proc/PID/stat: 1, or 0 when there is no such
 * process, -1 when /proc cannot tell (another error: no verdict). */
static int proc_stat(int64_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT || errno == ESRCH ? 0 : -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (n == 0)
        return 0; /* it ended while being read */
    if (!p || p[1] != ' ')
        return -1;
    *state = p[2];
    /* fields after the name: state is field 3, the start time field 22 */
    p += 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    *start = p ? strtoull(p, NULL, 10) : 0;
    return 1;
}

static uint64_t pid_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Record that `client` is lost (the first cause stays), with this client's account of it. */
static void mark(int client, int cause, const char *text)
{
    uint8_t alive = ALIVE;
    atomic_compare_exchange_strong(&w.lost[client], &alive, (uint8_t)cause);
    note_why(text);
}

/* The clients of this host whose processes are gone. */
static void check_members(void)
{
    for (int i = 0; i < w.host_size; i++) {
        const member *m = &w.me[i];
        int c = w.members[i];
        if (i == w.host_rank || atomic_load(&w.lost[c]) != ALIVE || !w.pidns ||
            m->pidns != w.pidns || m->pid <= 0)
            continue;
        char state = 0;
        uint64_t start = 0;
        int found = proc_stat(m->pid, &state, &start);
        if (found == 0 || (found == 1 && (state == 'Z' || state == 'X' || start != m->start))) {
            char text[96];
            snprintf(text, sizeof text, "client %d died (its process, pid %lld, is gone)", c,
                     (long long)m->pid);
            mark(c, GONE, text);
        }
    }
}

/* Hosts not heard from for DT__SILENT_S while this host's own thread beats: every client of
 * them is lost. */
static void check_hosts(void)
{
    if (!atomic_load(w.beating))
        return;
    uint64_t now = now_ns(), silent = (uint64_t)(DT__SILENT_S * 1e9);
    if (now - atomic_load(w.beat_at) > silent / 2) /* this host's thread is behind: no verdict */
        return;
    /* the silent hosts, the longest silent first: a dead host stops first, while a live one
     * stuck in MPI on the dead (a connection timing out) may go silent just after it, and
     * the first loss recorded is the one every message names */
    for (;;) {
        int h = -1;
        for (int i = 0; i < w.nleaders; i++)
            if (i != w.leader_index && now - atomic_load(&w.heard[i]) > silent &&
                atomic_load(&w.lost[w.leaders[i]]) == ALIVE &&
                (h < 0 || atomic_load(&w.heard[i]) < atomic_load(&w.heard[h])))
                h = i;
        if (h < 0)
            return;
        int *of = malloc(sizeof(int) * (size_t)w.n), k = 0;
        char list[64] = "", text[160];
        for (int c = 0; of && c < w.n; c++)
            if (w.leader_of[c] == w.leaders[h])
                of[k++] = c;
        if (of)
            dt__clients_str(list, sizeof list, of, k);
        free(of);
        snprintf(text, sizeof text,
                 "%.60s %s unreachable (no heartbeat from %s host, led by client %d, for %.1f "
                 "s)",
                 list, k == 1 ? "is" : "are", k == 1 ? "its" : "their", w.leaders[h],
                 (double)(now - atomic_load(&w.heard[h])) * 1e-9);
        for (int c = 0; c < w.n; c++)
            if (w.leader_of[c] == w.leaders[h])
                mark(c, SILENT, text);
    }
}

/* ---- the heartbeat thread (a host's leader, several hosts, MPI_THREAD_MULTIPLE) ------------ */

enum { TAG_BEAT = 1, TAG_BYE = 2 };

/* One beat: judge this host's clients, tell every other leader which of them died, and take
 * in what the others sent. */
static void beat_once(void)
{
    check_members();
    beat mine = {0};
    for (int i = 0; i < w.host_size; i++)
        if (atomic_load(&w.lost[w.members[i]]) == GONE && mine.gone_count < 7)
            mine.gone[mine.gone_count++] = w.members[i];
    for (int h = 0; h < w.nleaders; h++) {
        if (h == w.leader_index)
            continue;
        int done = 1;
        if (w.sends[h] != MPI_REQUEST_NULL &&
            MPI_Test(&w.sends[h], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            done = 0; /* a failed send to a lost host: it stays silent */
        if (!done)
            continue;
        w.out[h] = mine;
        if (MPI_Isend(&w.out[h], sizeof mine, MPI_BYTE, w.leaders[h], TAG_BEAT, w.comm,
                      &w.sends[h]) != MPI_SUCCESS)
            w.sends[h] = MPI_REQUEST_NULL;
    }
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_BEAT, w.comm, &flag, &st) != MPI_SUCCESS || !flag)
            break;
        beat in;
        if (MPI_Recv(&in, sizeof in, MPI_BYTE, st.MPI_SOURCE, TAG_BEAT, w.comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        for (int h = 0; h < w.nleaders; h++)
            if (w.leaders[h] == st.MPI_SOURCE)
                atomic_store(&w.heard[h], now_ns());
        for (int i = 0; i < in.gone_count && i < 7; i++)
            if (in.gone[i] >= 0 && in.gone[i] < w.n) {
                char text[96];
                snprintf(text, sizeof text,
                         "client %d died (its host's leader, client %d, saw its process gone)",
                         in.gone[i], st.MPI_SOURCE);
                mark(in.gone[i], GONE, text);
            }
    }
    atomic_store(w.beat_at, now_ns());
}

static void *heartbeat(void *arg)
{
    (void)arg;
    while (!atomic_load(&w.stop)) {
        beat_once();
        nanosleep(&(struct timespec){.tv_nsec = (long)(DT__BEAT_S * 1e9)}, NULL);
    }
    return NULL;
}

/* Receive every heartbeat waiting on the communicator (after the threads stopped). */
static void drain(void)
{
    for (;;) {
        int flag = 0;
        MPI_Status st;
        beat in;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_BEAT, w.comm, &flag, &st) != MPI_SUCCESS || !flag ||
            MPI_Recv(&in, sizeof in, MPI_BYTE, st.MPI_SOURCE, TAG_BEAT, w.comm,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
    }
}

/* The leaders, every one alive, end the heartbeats so that none is left in flight: each sends
 * every other a last message after its thread stopped and receives theirs; messages from one
 * sender arrive in order, so once a leader's last message is in, every heartbeat it sent is
 * waiting here, and is received. Bounded by the waits' own watch (a leader lost meanwhile). */
static void goodbye(void)
{
    int n = w.nleaders, self = w.leader_index;
    MPI_Request *req = malloc(sizeof *req * (size_t)(2 * n));
    int *bye = calloc((size_t)(2 * n), sizeof *bye);
    if (!req || !bye) {
        free(req);
        free(bye);
        return;
    }
    int k = 0;
    for (int h = 0; h < n; h++)
        if (h != self &&
            (MPI_Irecv(&bye[h], 1, MPI_INT, w.leaders[h], TAG_BYE, w.comm, &req[k]) == MPI_SUCCESS))
            k++;
    for (int h = 0; h < n; h++)
        if (h != self && (MPI_Isend(&bye[n + h], 1, MPI_INT, w.leaders[h], TAG_BYE, w.comm,
                                    &req[k]) == MPI_SUCCESS))
            k++;
    if (dt__mpi_wait_for(k, req, "ending the heartbeats") == DT_OK) {
        drain();
        free(req);
        free(bye);
    } else { /* still MPI's */
        abandoned[2] = req;
        abandoned[3] = bye;
    }
}

/* ---- open, close, poll --------------------------------------------------------------------- */

/* Collective over the world (every client alive): the window of the host, the heartbeats'
 * communicator and, on a leader of several hosts, the thread. */
dt_status dt__watch_open(MPI_Comm host, const int members[], const int leader_of[],
                         const int leaders[], int nleaders)
{
    int n = dt__rt.num_clients;
    MPI_Comm_rank(host, &w.host_rank);
    MPI_Comm_size(host, &w.host_size);
    w.n = n;
    w.nleaders = nleaders;
    w.members = malloc(sizeof(int) * (size_t)w.host_size);
    w.leader_of = malloc(sizeof(int) * (size_t)n);
    w.leaders = malloc(sizeof(int) * (size_t)nleaders);
    w.sends = malloc(sizeof *w.sends * (size_t)nleaders);
    w.out = calloc((size_t)nleaders, sizeof *w.out);
    dt_status s = w.members && w.leader_of && w.leaders && w.sends && w.out
                      ? DT_OK
                      : dt__fail(DT_ERR_NOMEM,
                                 "dt_init: out of memory for the liveness of %d "
                                 "clients",
                                 n);
    if (s == DT_OK) {
        memcpy(w.members, members, sizeof(int) * (size_t)w.host_size);
        memcpy(w.leader_of, leader_of, sizeof(int) * (size_t)n);
        memcpy(w.leaders, leaders, sizeof(int) * (size_t)nleaders);
        for (int h = 0; h < nleaders; h++) {
            w.sends[h] = MPI_REQUEST_NULL;
            if (leaders[h] == members[0])
                w.leader_index = h;
        }
    }
    /* the window: members, then the lost bytes, the hosts' times, this host's beat and flag */
    size_t at_lost = sizeof(member) * (size_t)w.host_size;
    size_t at_heard = (at_lost + (size_t)n + 7) / 8 * 8;
    size_t bytes = at_heard + sizeof(uint64_t) * ((size_t)nleaders + 2);
    char *base = NULL;
    if (s == DT_OK && MPI_Win_allocate_shared(w.host_rank == 0 ? (MPI_Aint)bytes : 0, 8,
                                              MPI_INFO_NULL, host, &base, &w.win) != MPI_SUCCESS)
        s = dt__fail(DT_ERR_COMM, "dt_init: cannot allocate the liveness window");
    if (s == DT_OK) {
        MPI_Aint size;
        int unit;
        if (MPI_Win_shared_query(w.win, 0, &size, &unit, &base) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Win_shared_query failed");
    }
    if (s == DT_OK) {
        w.me = (member *)base;
        w.lost = (_Atomic uint8_t *)(base + at_lost);
        w.heard = (_Atomic uint64_t *)(base + at_heard);
        w.beat_at = w.heard + nleaders;
        w.beating = (_Atomic uint32_t *)(w.beat_at + 1);
        /* judged by its pid only where /proc tells this process's own state (pidns 0: never) */
        char state;
        uint64_t start = 0;
        w.pidns = proc_stat(getpid(), &state, &start) == 1 && start ? pid_namespace() : 0;
        w.me[w.host_rank] = (member){.pid = getpid(), .start = start, .pidns = w.pidns};
        if (w.host_rank == 0) {
            memset(base + at_lost, 0, bytes - at_lost);
            uint64_t t = now_ns();
            for (int h = 0; h < nleaders; h++)
                atomic_store(&w.heard[h], t);
            atomic_store(w.beat_at, t);
        }
    }
    if (s == DT_OK && nleaders > 1 &&
        MPI_Comm_dup(dt__rt.world, &w.comm) != MPI_SUCCESS) /* every client alike */
        s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Comm_dup for the heartbeats failed");
    /* every record is written before any client reads one (the caller's agreement of
     * success orders them), and the thread starts once the window is whole */
    if (s == DT_OK) {
        MPI_Request req;
        if (MPI_Ibarrier(host, &req) != MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Ibarrier failed");
        else
            s = dt__mpi_wait_all(1, &req);
    }
    /* heartbeats only when every leader can run the thread (MPI_THREAD_MULTIPLE everywhere):
     * a leader that beats to one that cannot receive would fill its queue */
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    int cannot = level != MPI_THREAD_MULTIPLE, any_cannot = 1;
    MPI_Request req;
    if (s == DT_OK && nleaders > 1) {
        if (MPI_Iallreduce(&cannot, &any_cannot, 1, MPI_INT, MPI_MAX, dt__rt.world, &req) !=
            MPI_SUCCESS)
            s = dt__fail(DT_ERR_COMM, "dt_init: MPI_Iallreduce failed");
        else
            s = dt__mpi_wait_all(1, &req);
    }
    w.beats = s == DT_OK && nleaders > 1 && !any_cannot;
    if (w.beats && w.host_rank == 0) {
        atomic_store(&w.stop, false);
        int e = pthread_create(&w.thread, NULL, heartbeat, NULL);
        if (e)
            s = dt__fail(DT_ERR_COMM, "dt_init: cannot start the heartbeat thread: %s",
                         strerror(e));
        w.thread_started = e == 0;
        atomic_store(w.beating, e == 0);
    }
    w.open = s == DT_OK || w.win != MPI_WIN_NULL;
    return s;
}

void dt__watch_close(void)
{
    if (w.thread_started) {
        atomic_store(&w.stop, true);
        pthread_join(w.thread, NULL);
        if (!atomic_load(&lost_ever))
            goodbye();
        else /* a last beat: the other hosts learn which of this host's clients died */
            beat_once();
    }
    if (atomic_load(&lost_ever)) {
        /* no collective free with a client gone (MPI_Win_free waits for every client of the
         * host); heartbeats still on their way to a lost host stay MPI's */
        abandoned[0] = w.out;
        abandoned[1] = w.sends;
    } else {
        for (int h = 0; w.sends && h < w.nleaders; h++)
            if (w.sends[h] != MPI_REQUEST_NULL) /* eager: completes on its own */
                MPI_Request_free(&w.sends[h]);
        if (w.win != MPI_WIN_NULL)
            MPI_Win_free(&w.win);
        if (w.comm != MPI_COMM_NULL)
            MPI_Comm_free(&w.comm);
        free(w.out);
        free(w.sends);
    }
    free(w.members);
    free(w.leader_of);
    free(w.leaders);
    w = (struct watch){.win = MPI_WIN_NULL, .comm = MPI_COMM_NULL};
}

bool dt__watch_lost(void)
{
    return atomic_load(&lost_ever);
}

bool dt__watch_poll(void)
{
    if (!w.open)
        return atomic_load(&lost_ever);
    check_members();
    check_hosts();
    for (int c = 0; c < w.n; c++) {
        int cause = atomic_load(&w.lost[c]);
        if (cause == ALIVE)
            continue;
        /* seen in the window: this client's own account, or another client's of the host */
        char text[96];
        snprintf(text, sizeof text, "client %d %s", c,
                 cause == GONE     ? "died (its process is gone)"
                 : cause == SILENT ? "is unreachable (its host sent no heartbeat for seconds)"
                                   : "is unreachable (MPI could not reach it)");
        note_why(text);
        return true;
    }
    return atomic_load(&lost_ever);
}

void dt__watch_unreachable(int client, const char *mpi_says)
{
    char text[160];
    snprintf(text, sizeof text, "client %d is unreachable (MPI: %.100s)", client, mpi_says);
    if (w.open && client >= 0 && client < w.n)
        mark(client, UNREACHABLE, text);
    else
        note_why(text);
}

void dt__watch_why(char *buf, size_t size)
{
    pthread_mutex_lock(&why_lock);
    snprintf(buf, size, "%s", why[0] ? why : "a client was lost");
    pthread_mutex_unlock(&why_lock);
}
