/* Waiting for other clients (spin, yield, sleep, block on a bell; the clock and the liveness
 * check), MPI's waits and the messages of lost clients, and the fields clients compare. */
#include "channel.h"
#include "spin.h"

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
 * (mesh/channel.h) of its host, rung by the client whose entry completes the host's part, or by the
 * leader when it publishes the result of several hosts. Such a wait blocks on it where other
 * waits would sleep, so its client sees the agreement complete as soon as it does rather than
 * at its next pause's end, and also once it has yielded for DT__WAIT_BLOCK_AFTER_S: a wait
 * that long is not about to end, and each yield is a system call on a core that a computing
 * client could use. Measured on 2 cores (README "Failure model"). */
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

void dt__wait_begin(dt__waiter *w)
{
    *w = (dt__waiter){.spin = dt__rt.cores > 0 && dt__rt.clients_on_host <= dt__rt.cores,
                      .slack = -1};
}

/* Sleep on the bell until its word reaches `mark`, a wake, or `ns` have passed. */
static void bell_sleep(bell *b, uint32_t mark, long ns)
{
    atomic_fetch_add(&b->sleepers, 1);
    uint32_t seen = atomic_load(&b->word);
    if (!dt__bell_reached(seen, mark))
        syscall(SYS_futex, &b->word, FUTEX_WAIT, seen, &(struct timespec){.tv_nsec = ns}, NULL, 0);
    atomic_fetch_sub(&b->sleepers, 1);
}

/* Wake everyone asleep on the bell (after its word moved). */
void dt__bell_ring(bell *b)
{
    if (atomic_load(&b->sleepers))
        syscall(SYS_futex, &b->word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The pause of a wait for bell `b` to reach `mark`, or of a wait with nothing to sleep on (b
 * NULL): dt__wait_pause. True once the wait has lasted DTENSOR_TIMEOUT. */
bool dt__wait_pause_on(dt__waiter *w, bell *b, uint32_t mark)
{
    /* young: spin without reading the clock (a read costs as much as a short wait) */
    if (w->spin && w->polls < DT__WAIT_SPIN_POLLS) {
        w->polls++;
        dt__cpu_relax();
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
    return dt__wait_pause_on(w, NULL, 0);
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
dt_status dt__message_failed(int client, int err, const char *where)
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
