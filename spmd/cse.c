/* Repeated kernel steps of a traced function's program, computed once (ARCHITECTURE.md
 * "Elementwise fusion").
 *
 * A gradient function recomputes in its backward half some of what its forward half computed:
 * a vjp is written from the op's operands, so the sparse cross-entropy's gradient computes the
 * logits' row statistics again (a pass over [rows, classes] with an exp per element) and the
 * layer norm's gradient its mean and variance. After expansion such a step is the same kernel
 * with the same arguments on the same slots as an earlier one. A later kernel step J is dropped,
 * its readers reading the result of the earlier step I instead, when:
 *   - I and J run the same kernel in the same dtype on the same mesh, with the same operand
 *     slots and byte for byte the same arguments on every local device (a copy's block list or
 *     a fused chain is behind a pointer: never equal, never dropped), and it is not a FILL (a
 *     constant, which the fuser folds into each chain reading it);
 *   - every operand slot is a program input or written once, before I (so it holds the same
 *     bytes at J as at I), and neither result is written by another step, read by its own step,
 *     bound to a program input, nor (J's) to a program output;
 *   - J's result is small: at most a quarter of the bytes it reads, or 64 KiB, on every local
 *     device. Keeping I's result alive from the forward half to the backward half then costs
 *     little memory: statistics are kept, a full-size recomputation (the layer norm's output)
 *     still runs again.
 * Kernels are deterministic functions of their arguments and operands, so the readers get
 * bitwise the bytes J would have written. Repeated steps that become equal once an earlier
 * repeat is dropped (the cross-entropy's maximum over the statistics) are found in the same
 * pass, which walks the steps in order.
 *
 * Collectives are dropped alike: the same even collective (same kind, reduction, groups, count
 * and dtype; no per-device counts, boxes or offsets) of the same unchanged operand slot, under
 * the same conditions on its result. The cross-entropy's gradient under a vocabulary-sharded
 * layout all-reduces the row statistics again (max, then the sums); the repeats go, and with
 * them the kernels that read their results. Every client drops the same ones (a pure function
 * of the program), so the collectives stay in step. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

enum { CSE_SMALL = 64 << 10 };

static bool same_step(const dt__step *a, const dt__step *b)
{
    if (a->kind != DT__STEP_KERNEL || b->kind != DT__STEP_KERNEL || a->kernel != b->kernel ||
        a->dtype != b->dtype || a->mesh != b->mesh || a->nlocal != b->nlocal || a->nin != b->nin ||
        a->kernel == DT__K_FILL || a->fused || b->fused || !a->args || !b->args)
        return false;
    if (memcmp(a->in, b->in, sizeof a->in[0] * (size_t)a->nin) != 0)
        return false;
    return memcmp(a->args, b->args, sizeof a->args[0] * (size_t)a->nlocal) == 0;
}

/* Collectives: the same even collective (no per-device counts, boxes or offsets) of the same
 * operand slot, over the same groups. A collective gives every device of a group the same
 * function of the group's operands, which hold at J what they held at I on every client. */
static bool same_coll(const dt__step *a, const dt__step *b)
{
    return a->kind == DT__STEP_COLL && b->kind == DT__STEP_COLL && a->coll == DT__COLL_ALL_REDUCE &&
           b->coll == DT__COLL_ALL_REDUCE && a->dtype == b->dtype && a->op == b->op &&
           a->axes == b->axes && a->count == b->count && a->mesh == b->mesh &&
           a->nlocal == b->nlocal && a->in[0] == b->in[0] && !a->counts && !b->counts &&
           !a->boxes && !b->boxes && !a->at && !b->at;
}

/* Whether step st's result is small beside what it reads, on every local device (false when a
 * slot lies on another mesh than the step: its devices do not match the step's). */
static bool small_result(const dt__program *p, const dt__step *st)
{
    const dt__slot *o = &p->slots[st->out];
    if (o->mesh != st->mesh)
        return false;
    for (int q = 0; q < st->nin; q++)
        if (p->slots[st->in[q]].mesh != st->mesh)
            return false;
    for (int d = 0; d < st->nlocal; d++) {
        size_t read = 0;
        for (int q = 0; q < st->nin; q++)
            read += p->slots[st->in[q]].bytes[d];
        if (o->bytes[d] > CSE_SMALL && o->bytes[d] > read / 4)
            return false;
    }
    return true;
}

void dt__program_cse(dt__program *p)
{
    int n = p->nsteps, ns = p->nslots;
    int *nwrite = calloc((size_t)ns + 1, sizeof *nwrite);
    int *writer = malloc(sizeof *writer * (size_t)(ns + 1));
    int *same = malloc(sizeof *same * (size_t)(ns + 1)); /* per slot: the slot it reads as */
    bool *drop = calloc((size_t)n + 1, sizeof *drop);
    if (!nwrite || !writer || !same || !drop)
        goto done; /* an optimisation: the program runs as it is */
    for (int s = 0; s < ns; s++)
        same[s] = s;
    for (int i = 0; i < n; i++) {
        nwrite[p->steps[i].out]++;
        writer[p->steps[i].out] = i;
    }
    for (int j = 0; j < n; j++) {
        dt__step *sj = &p->steps[j];
        for (int q = 0; q < sj->nin; q++) /* a dropped step's readers read its twin's result */
            sj->in[q] = same[sj->in[q]];
        const dt__slot *oj = &p->slots[sj->out];
        if (sj->kind == DT__STEP_TRANSFER || nwrite[sj->out] != 1 || oj->input >= 0 ||
            oj->output >= 0 || !small_result(p, sj))
            continue;
        bool inputs_fixed = true;
        for (int q = 0; q < sj->nin; q++) {
            int s = sj->in[q];
            inputs_fixed = inputs_fixed && s != sj->out &&
                           (nwrite[s] == 0 || (nwrite[s] == 1 && writer[s] < j));
        }
        if (!inputs_fixed)
            continue;
        for (int i = 0; i < j; i++) {
            const dt__step *si = &p->steps[i];
            if (drop[i] || !(same_step(si, sj) || same_coll(si, sj)) || nwrite[si->out] != 1 ||
                p->slots[si->out].input >= 0)
                continue;
            bool fixed = true; /* every operand written before I (then it holds at J too) */
            for (int q = 0; q < si->nin; q++)
                fixed = fixed && si->in[q] != si->out &&
                        (nwrite[si->in[q]] == 0 || writer[si->in[q]] < i);
            if (!fixed)
                continue;
            drop[j] = true;
            same[sj->out] = si->out;
            break;
        }
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        dt__step *st = &p->steps[i];
        if (drop[i]) {
            for (int d = 0; st->args && d < st->nlocal; d++)
                free(st->args[d].blocks);
            free(st->args);
            continue;
        }
        if (kept != i)
            p->steps[kept] = *st;
        kept++;
    }
    p->nsteps = kept;
done:
    free(nwrite);
    free(writer);
    free(same);
    free(drop);
}
