/* The agreement channel (mesh/channel.c), waiting (mesh/wait.c) and the agreements over them
 * (mesh/agree.c): what they share, private to the three.
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
#ifndef DT_MESH_CHANNEL_H
#define DT_MESH_CHANNEL_H

#include "dt.h"

#define DT__WAIT_SPIN_POLLS 256 /* about 20-30 us of polls and pauses */

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

static inline bool dt__bell_reached(uint32_t word, uint32_t mark)
{
    return (int32_t)(word - mark) >= 0; /* wrap-safe: the two are never 2^31 apart */
}

/* Wake everyone asleep on the bell (after its word moved). */
void dt__bell_ring(bell *b);
/* The pause of a wait for bell `b` to reach `mark`, or of a wait with nothing to sleep on (b
 * NULL): dt__wait_pause. True once the wait has lasted DTENSOR_TIMEOUT. */
bool dt__wait_pause_on(dt__waiter *w, bell *b, uint32_t mark);
/* A message to or from `client` failed in MPI: the wait's end, naming the lost client. */
dt_status dt__message_failed(int client, int err, const char *where);

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

struct dt__channel {
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
};

/* The channel of this client: open between dt__channel_open and dt__channel_close. */
extern struct dt__channel dt__ch;

/* Tags of the channel's messages: the sequence (modulo what every MPI allows) and the kind. */
enum { KIND_LEADERS, KIND_VERDICT, KIND_FIELD, KIND_COUNT };
static inline int dt__channel_tag(uint64_t seq, int kind)
{
    return 1 + (int)(seq % 8000u) * KIND_COUNT + kind;
}

#endif
