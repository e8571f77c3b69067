/* The watchdog and the liveness of clients: `watchdog MODE`, run under
 * `mpiexec.mpich -disable-auto-cleanup` so that the launcher leaves the survivors running.
 *
 * - exit: the last client exits without a word right after the set-up (DTENSOR_TIMEOUT 1 s);
 * - kill: the last client kills itself with SIGKILL right after the set-up, at the DEFAULT
 *   timeout (600 s): the survivors must learn it from its process being gone (one host) or its
 *   host's silent heartbeat or MPI (other hosts, DTENSOR_AGREE_HOSTS=none or K), not from the
 *   clock;
 * - stuck: the last client stays alive but makes no call (it waits in user code until client
 *   0 has exited) with DTENSOR_TIMEOUT 1 s: the survivors time out, naming what they waited for.
 * Every survivor, within 5 s (exit, stuck) or 10 s (kill) each:
 * 1. fails its next op (a matmul) in the op agreement with DT_ERR_COMM naming the op, the
 *    group (the agreement of all clients) and the last client (not heard from, dead or
 *    unreachable; with DTENSOR_AGREE_HOSTS=K, the host's leader that gave up for it);
 * 2. fails a collective started without an agreement before it (the executor's all-reduce
 *    called directly, as after an agreement a client died in) with DT_ERR_COMM naming the
 *    collective, its mesh axes, the mesh and the group's clients;
 * 3. fails a barrier (the agreement channel at its next sequence number) naming the call and
 *    the last client (across hosts over TCP, MPI refuses to post to a dead client at once:
 *    that too names it);
 * 4. fails a collective on a mesh whose communicator was never made (MPI_Comm_idup gives up)
 *    and frees that mesh afterwards (a timed-out duplication was freed twice);
 * 5. (exit, kill) frees everything and finalizes in under 2 s, waiting for no one.
 * - slow: nobody dies; the last client sleeps 12 s in user code before its next op, with
 *   DTENSOR_TIMEOUT at 60 s: every client's matmul succeeds with the right values (the others
 *   waited about 12 s: a live client is never taken for a dead one, whatever its host's
 *   heartbeat says), then a barrier and dt_finalize.
 * The survivors combine their verdicts over a communicator made before the death; client 0
 * prints TAP. In kill mode the launcher's exit status reports the killed client: the test runs
 * through survivors.sh, which passes the TAP through and ignores that status. In slow mode every
 * client lives to MPI_Finalize, and no MPI call may come between dt_finalize and MPI_Finalize
 * (README, "Ending the job": one can make MPI_Finalize hang across hosts): the clients combine
 * the verdicts of checks 1-4 before dt_finalize, each judges its own dt_finalize, client 0
 * reports its own and any other client that fails says so and exits 1; that run is launched
 * without survivors.sh, so a client's exit status fails the test.
 *
 * MPICH 4.0.2's launcher, -disable-auto-cleanup or not, sends SIGKILL to the process groups of
 * the other clients after one dies of a signal, about one run in two (the proxy's handling of
 * the dead process's pipes races with its exit): a launcher's doing, which would kill the
 * survivors before they report. So each client runs as a child of the process the launcher
 * started, in a process group of its own; the launcher's process waits for it and exits as it
 * did. */
#include "../coll_ref.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECKS 5

static int me, n, victim;
static bool ok[CHECKS];
static char said[CHECKS][1100];
static double took_s[CHECKS];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check(int i, bool good, dt_status s, double took)
{
    ok[i] = good;
    took_s[i] = took;
    snprintf(said[i], sizeof said[i], "%s: %s", dt_status_name(s), dt_last_error());
    if (!good)
        fprintf(stderr, "# client %d: check %d failed after %.2f s (%s)\n", me, i + 1, took,
                said[i]);
}

/* Whether `text` from position p names client v: a number or a range "a-b" holding it. */
static bool names_in(const char *p, const char *end, int v)
{
    for (; p < end; p++) {
        if (*p < '0' || *p > '9' || (p[-1] >= '0' && p[-1] <= '9'))
            continue;
        int lo = atoi(p), hi = lo;
        const char *q = p;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (*q == '-')
            hi = atoi(q + 1);
        if (lo <= v && v <= hi)
            return true;
    }
    return false;
}

/* The message names the last client: among those not heard from (the timeout), as the client
 * that died or is unreachable (a loss), or through the host's leader that gave up for it. */
static bool names_victim(const char *e)
{
    const char *p = strstr(e, "not heard from ");
    if (p) {
        p += strlen("not heard from ");
        const char *end = strstr(p, ": a client died");
        return names_in(p, end ? end : p + strlen(p), victim);
    }
    p = strstr(e, "after ");
    const char *end = p ? strstr(p, "; what it waited for") : NULL;
    if (p && end) { /* "...after 0.3 s: client 3 died (...)" or "clients 2-3 are unreachable" */
        p = strchr(p, ':');
        const char *paren = p ? strchr(p, '(') : NULL;
        return p && (strstr(p, " died") || strstr(p, " unreachable")) &&
               names_in(p, paren && paren < end ? paren : end, victim);
    }
    return strstr(e, "the leader of this client's host") != NULL;
}

/* Wait for a request with a bound, yielding (the survivors' own verdict exchange). */
static bool wait_bounded(MPI_Request *r, double limit)
{
    double end = now() + limit;
    int done = 0;
    while (!done && now() < end) {
        if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return false;
        if (!done)
            nanosleep(&(struct timespec){.tv_nsec = 100000}, NULL);
    }
    return done;
}

/* The verdicts of checks [0, count) combined over the survivors (the minimum): false when MPI
 * fails or the survivors do not all answer within 30 s. */
static bool combine(MPI_Comm survivors, int count, int *all_ok)
{
    int mine_ok[CHECKS];
    for (int i = 0; i < count; i++)
        mine_ok[i] = ok[i];
    MPI_Request req;
    return MPI_Iallreduce(mine_ok, all_ok, count, MPI_INT, MPI_MIN, survivors, &req) ==
               MPI_SUCCESS &&
           wait_bounded(&req, 30);
}

/* Run the client as a child in a process group of its own (see above); returns in the child.
 * The launcher's process ignores the signals the launcher sends, waits, and exits as the child
 * did (a child killed by a signal: 128 + the signal). */
static void run_as_child(void)
{
    pid_t pid = fork();
    if (pid <= 0) { /* the client (or, if fork failed, this process as it is) */
        if (pid == 0)
            setpgid(0, 0);
        return;
    }
    signal(SIGUSR1, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

int main(int argc, char **argv)
{
    run_as_child();
    /* Once a client has exited, MPICH's launcher sometimes sends the others SIGHUP, even under
     * -disable-auto-cleanup (about 1 run in 100 here): the survivors are what this test
     * watches, so they let it pass */
    signal(SIGHUP, SIG_IGN);
    const char *mode = argc > 1 ? argv[1] : "exit";
    bool kill_mode = strcmp(mode, "kill") == 0, stuck = strcmp(mode, "stuck") == 0,
         slow = strcmp(mode, "slow") == 0;
    if (!kill_mode && !stuck && !slow && strcmp(mode, "exit") != 0) {
        fprintf(stderr, "usage: watchdog exit|kill|stuck|slow\n");
        return 2;
    }
    /* MPI is the test's, so that the survivors can still combine their verdicts after
     * dt_finalize (MULTIPLE, as dt_init asks: the hosts' heartbeat threads need it) */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    unsetenv("DTENSOR_TIMEOUT"); /* kill: the default, 600 s */
    dt_init_options o = {.timeout_seconds = kill_mode ? 0 : slow ? 60 : 1};
    if (dt_init(&o) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    me = dt_client_id();
    n = dt_num_clients();
    victim = n - 1;
    int g = dt_num_global_devices(DT_DEVICE_CPU), nl = dt_num_local_devices(DT_DEVICE_CPU);
    char spec[32], spec2[32];
    snprintf(spec, sizeof spec, "x=%d", g);
    snprintf(spec2, sizeof spec2, "p=%d", g);
    dt_mesh *m = NULL, *m2 = NULL;
    if (dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) != DT_OK ||
        dt_mesh_create_from_string(spec2, DT_DEVICE_CPU, &m2) != DT_OK) {
        fprintf(stderr, "mesh: %s\n", dt_last_error());
        return 1;
    }
    /* a matmul (contracting axis sharded: an all-reduce) and an all-reduce while every client
     * lives, so that the communicators of m exist when the last client dies (m2's do not) */
    dt_layout lr, lc;
    dt_layout_parse(m, "unsharded,x", &lr);
    dt_layout_parse(m, "x,unsharded", &lc);
    dt_tensor *a = NULL, *b = NULL, *c = NULL;
    float host[64];
    for (int i = 0; i < 64; i++)
        host[i] = 1;
    dt_tensor_from_host(&lr, DT_DTYPE_F32, 2, (int64_t[]){4, 16}, host, sizeof host, &a);
    dt_tensor_from_host(&lc, DT_DTYPE_F32, 2, (int64_t[]){16, 4}, host, sizeof host, &b);
    float *buf = calloc((size_t)(nl + 1) * 64, sizeof *buf);
    const void *send[64];
    void *recv[64];
    for (int i = 0; i < nl && i < 64; i++) {
        send[i] = buf;
        recv[i] = buf + (size_t)(i + 1) * 64;
    }
    dt__coll ar = {.kind = DT__COLL_ALL_REDUCE,
                   .dtype = DT_DTYPE_F32,
                   .op = DT_REDUCE_SUM,
                   .axes = 1u,
                   .send = send,
                   .recv = recv,
                   .count = 64};
    long long pids[64] = {0}, mine = getpid();
    if (dt_matmul(a, b, NULL, &c) != DT_OK || dt__collective(m, &ar) != DT_OK || n > 64 ||
        dt_client_allgather(&mine, sizeof mine, pids) != DT_OK) {
        fprintf(stderr, "before the death: %s\n", dt_last_error());
        return 1;
    }
    dt_tensor_free(c);
    c = NULL;
    /* the survivors' own communicator for their verdicts, made while every client lives */
    MPI_Comm survivors;
    MPI_Comm_split(MPI_COMM_WORLD, !slow && me == victim ? MPI_UNDEFINED : 0, me, &survivors);

    if (me == victim && !slow) {
        if (kill_mode)
            raise(SIGKILL);
        if (stuck) /* alive, in user code, until client 0 is done */
            for (int i = 0; i < 1200 && kill((pid_t)pids[0], 0) == 0; i++)
                nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
        _exit(0); /* no op, no finalize */
    }
    if (me == victim)
        sleep(12); /* slow: in user code, alive */
    double limit = kill_mode ? 10.0 : 5.0;

    /* 1. an op: the survivors wait for the last client in the op agreement */
    double t0 = now();
    dt_status s = dt_matmul(a, b, NULL, &c);
    double took = now() - t0;
    const char *e = dt_last_error();
    if (slow) {
        float got[16] = {0};
        bool right = s == DT_OK && dt_tensor_read(c, got, sizeof got) == DT_OK;
        for (int i = 0; i < 16; i++)
            right = right && got[i] == 16;
        check(0, right && (me == victim || took > 10), s, took);
    } else {
        check(0,
              s == DT_ERR_COMM && strstr(e, "matmul:") && strstr(e, "agreement of all clients") &&
                  names_victim(e) && took < limit && !c,
              s, took);
    }
    dt_tensor_free(c);
    c = NULL;

    /* 2. a collective with no agreement before it: MPI waits for the last client */
    char group[64];
    snprintf(group, sizeof group, "clients 0-%d", n - 1);
    if (n == 2)
        snprintf(group, sizeof group, "clients 0, 1");
    t0 = now();
    s = dt__collective(m, &ar);
    took = now() - t0;
    e = dt_last_error();
    check(1,
          slow ? s == DT_OK
               : s == DT_ERR_COMM && strstr(e, "in all_reduce over axes {x} of mesh") &&
                     strstr(e, spec) && strstr(e, group) && took < limit,
          s, took);

    /* 3. the next agreement (a barrier) names the last client again */
    t0 = now();
    s = dt_barrier();
    took = now() - t0;
    e = dt_last_error();
    check(2,
          slow ? s == DT_OK
               : s == DT_ERR_COMM && strstr(e, "dt_barrier:") && names_victim(e) && took < limit,
          s, took);

    /* 4. a collective on m2, whose communicator is made now (MPI_Comm_idup over every client),
     * then m2 freed */
    dt__coll ar2 = ar;
    t0 = now();
    s = dt__collective(m2, &ar2);
    dt_mesh_free(m2);
    took = now() - t0;
    check(3, slow ? s == DT_OK : s == DT_ERR_COMM && took < limit, s, took);

    /* slow: checks 1-4 combined while the runtime lives, as no MPI call may follow dt_finalize */
    int all_ok[CHECKS];
    bool combined = slow && combine(survivors, CHECKS - 1, all_ok);
    if (slow)
        MPI_Comm_free(&survivors);

    /* 5. free everything and finalize: at once after a loss, normally when all live */
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_mesh_free(m);
    t0 = now();
    if (stuck) { /* nobody is known dead: a finalize would time out in its agreement */
        s = DT_OK;
        check(4, true, s, 0);
    } else {
        s = dt_finalize();
        took = now() - t0;
        check(4, s == DT_OK && !dt_is_initialized() && (slow || took < 2.0), s, took);
    }

    /* the verdicts, combined over the survivors (slow: the last one is each client's own) */
    if (slow)
        all_ok[CHECKS - 1] = ok[CHECKS - 1];
    else
        combined = combine(survivors, CHECKS, all_ok);
    static const char *const what[CHECKS] = {
        "a matmul fails in the op agreement naming the op, the group and the last client",
        "an all-reduce fails naming the collective, its axes, the mesh and the group's clients",
        "a barrier fails naming the call and the last client",
        "a collective needing a new communicator fails, and its mesh is freed",
        "dt_finalize waits for no one"};
    static const char *const what_slow[CHECKS] = {
        "a matmul waits for the slow client and is right", "an all-reduce", "a barrier",
        "a collective needing a new communicator", "dt_finalize (the others: their exit status)"};
    if (me == 0) {
        printf("1..%d\n", CHECKS);
        for (int i = 0; i < CHECKS; i++)
            printf("%s %d - %s, client %d of %d %s: %s after %.2f s (%s)\n",
                   combined && all_ok[i] ? "ok" : "not ok", i + 1, slow ? what_slow[i] : what[i],
                   victim, n, slow ? "slow" : mode,
                   combined && !(slow && i == CHECKS - 1) ? "every survivor" : "client 0 alone",
                   took_s[i], said[i]);
        fflush(stdout);
    }
    bool good = combined;
    for (int i = 0; i < CHECKS; i++)
        good = good && all_ok[i];
    if (slow) { /* every client lives: a normal end, its status this client's verdict */
        free(buf);
        MPI_Finalize();
        return good ? 0 : 1;
    }
    _exit(good ? 0 : 1); /* MPI stays up: MPI_Finalize would wait for the dead client */
}
