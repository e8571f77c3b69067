/* Communication overlap: the run order of a program's steps and the collectives in flight.
 *
 * A collective is started as soon as its operand is written and waited for just before the
 * first step that needs it complete, so that the kernels in between run while it moves (on
 * CPU meshes the executor polls it between kernels, since MPI progresses a nonblocking call
 * only inside MPI calls; device collectives progress on their own streams). The order is a
 * pure function of the program, so every client runs the same one and starts its collectives
 * in the same order: the invariant MPI and NCCL need. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reads(const dt__step *s, int slot)
{
    for (int j = 0; j < s->nin; j++)
        if (s->in[j] == slot)
            return true;
    return false;
}

/* Whether step e writes slot: its output, or a result a fused step stores beside it (listed
 * after its operands, spmd/fuse.c). */
static bool writes(const dt__step *e, int slot)
{
    if (e->out == slot)
        return true;
    if (e->kind != DT__STEP_KERNEL || e->kernel != DT__K_FUSED || !e->fused)
        return false;
    for (int j = e->fused->nin; j < e->nin; j++)
        if (e->in[j] == slot)
            return true;
    return false;
}

/* Whether step e may not run while collective c is in flight: e reads or writes what c writes,
 * or writes what c reads (a kernel's output slot counts as read too: chunked steps write
 * blocks of a slot that others wrote). */
static bool conflicts(const dt__step *c, const dt__step *e)
{
    if (e->out == c->out || reads(e, c->out))
        return true;
    for (int j = 0; j < c->nin; j++)
        if (writes(e, c->in[j]))
            return true;
    return false;
}

static bool overlap_enabled(void)
{
    const char *e = getenv("DTENSOR_OVERLAP");
    return !(e && strcmp(e, "0") == 0);
}

/* The first run position after `at` whose step conflicts with collective c (len: none). */
static int first_conflict(const dt__program *p, const int order[], int len, int at,
                          const dt__step *c)
{
    int w = at + 1;
    while (w < len && !conflicts(c, &p->steps[order[w]]))
        w++;
    return w;
}

void dt__program_schedule(dt__program *p)
{
    free(p->order);
    p->order = NULL;
    int n = p->nsteps;
    int *order = overlap_enabled() ? malloc(sizeof *order * ((size_t)n + 1)) : NULL;
    if (!order) { /* the emitted order, each collective waited for at once */
        for (int i = 0; i < n; i++)
            p->steps[i].wait_at = i + 1;
        return;
    }
    /* Build the order step by step: kernels go last, a collective as far up as it may.
     * prev: run position of the last collective placed; gather, gather_step: of the last
     * all-gather (positions of earlier steps move only when a collective goes above them,
     * and none goes above the last collective). */
    int len = 0, prev = -1, gather = -1, gather_step = -1;
    for (int i = 0; i < n; i++) {
        const dt__step *st = &p->steps[i];
        int at = len;
        if (st->kind == DT__STEP_COLL) {
            int lowest = prev + 1;
            bool gathers = st->coll == DT__COLL_ALL_GATHER;
            if (gathers && gather >= 0) {
                int w = first_conflict(p, order, len, gather, &p->steps[gather_step]);
                lowest = w > lowest ? w : lowest;
            }
            while (at > lowest && !conflicts(st, &p->steps[order[at - 1]]))
                at--;
            memmove(order + at + 1, order + at, sizeof *order * (size_t)(len - at));
            prev = at;
            if (gathers) {
                gather = at;
                gather_step = i;
            }
        }
        order[at] = i;
        len++;
    }
    for (int q = 0; q < n; q++) {
        dt__step *st = &p->steps[order[q]];
        if (st->kind == DT__STEP_COLL)
            st->wait_at = first_conflict(p, order, n, q, st);
    }
    p->order = order;
}

/* ---- collectives in flight ------------------------------------------------------------------ */

/* Several collectives in flight let each overlap the ones before it as well as the kernels;
 * the bound keeps their buffers and MPI's unexpected messages in check. */
#define DT__IN_FLIGHT_DEFAULT 4

dt_status dt__flight_init(dt__flight *f, const dt__program *p)
{
    memset(f, 0, sizeof *f);
    const char *e = getenv("DTENSOR_COLLECTIVES_IN_FLIGHT");
    f->most = DT__IN_FLIGHT_DEFAULT;
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end || v < 1 || v > 1024)
            return dt__fail(DT_ERR_ARG,
                            "program: DTENSOR_COLLECTIVES_IN_FLIGHT=\"%.64s\" is not a whole "
                            "number from 1 to 1024",
                            e);
        f->most = (int)v;
    }
    for (int i = 0; i < p->nsteps; i++)
        f->cap += p->steps[i].kind == DT__STEP_COLL;
    f->req = calloc((size_t)f->cap + 1, sizeof *f->req);
    f->wait_at = calloc((size_t)f->cap + 1, sizeof *f->wait_at);
    if (!f->req || !f->wait_at) {
        dt__flight_free(f);
        return dt__fail(DT_ERR_NOMEM, "program: out of memory");
    }
    return DT_OK;
}

void dt__flight_add(dt__flight *f, dt__coll_req *r, int wait_at)
{
    f->req[f->n] = r;
    f->wait_at[f->n++] = wait_at;
}

void dt__flight_poke(const dt__flight *f)
{
    for (int k = 0; k < f->n; k++)
        dt__collective_test(f->req[k]);
}

dt_status dt__flight_wait(dt__flight *f, int pos)
{
    dt_status s = DT_OK;
    bool any = false;
    for (int k = 0; k < f->n && !any; k++)
        any = f->wait_at[k] <= pos;
    if (!any)
        return DT_OK;
    dt__flight_poke(f); /* the others advance too before this client blocks */
    char first[512] = "";
    int kept = 0;
    for (int k = 0; k < f->n; k++) {
        if (f->wait_at[k] > pos) {
            f->req[kept] = f->req[k];
            f->wait_at[kept++] = f->wait_at[k];
            continue;
        }
        dt_status w = dt__collective_wait(f->req[k]);
        if (s == DT_OK && w != DT_OK) {
            s = w;
            snprintf(first, sizeof first, "%s", dt_last_error());
        }
    }
    f->n = kept;
    if (s != DT_OK)
        dt__set_error(first); /* the first failure's message, not a later one's */
    return s;
}

dt_status dt__flight_room(dt__flight *f)
{
    dt_status s = DT_OK;
    while (f->n >= f->most) {
        dt_status w = dt__collective_wait(f->req[0]);
        s = s == DT_OK ? w : s;
        memmove(f->req, f->req + 1, sizeof *f->req * (size_t)(f->n - 1));
        memmove(f->wait_at, f->wait_at + 1, sizeof *f->wait_at * (size_t)(f->n - 1));
        f->n--;
    }
    return s;
}

void dt__flight_free(dt__flight *f)
{
    free(f->req);
    free(f->wait_at);
    memset(f, 0, sizeof *f);
}
