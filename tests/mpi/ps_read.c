/* A parameter-server variable read one-sided (MPI_Rget from the ps task's window) while the ps
 * task already waits in the next agreement (a barrier). That wait goes through shared memory;
 * unless it also lets MPI make progress, the read waits for the ps task and the ps task for the
 * reader, for ever (found by the Python suite at -n 2). Run with DTENSOR_CLUSTER=worker=1,ps=1:
 * worker 0 reads, the ps task goes straight to the barrier; an alarm turns a hang into a
 * failure within 20 s. */
#include "ps_task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void)
{
    dt_strategy *s;
    dt_cluster cl;
    int rc;
    if (!ps_start(20, &s, &cl, &rc))
        return rc;
    dt_status st;
    bool reader = cl.task_type != DT_TASK_PS;
    enum { ROWS = 6, COLS = 2, ROUNDS = 20 };
    float init[ROWS * COLS], got[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        init[i] = (float)i;
    dt_layout rep;
    dt_tensor *t = NULL;
    dt_ps_variable *pv = NULL;
    st = dt_layout_replicated(dt_strategy_mesh(s), 2, &rep);
    st = st ? st
            : dt_tensor_from_host(&rep, DT_DTYPE_F32, 2, (int64_t[]){ROWS, COLS}, init, sizeof init,
                                  &t);
    st = st ? st : dt_ps_variable_create(s, t, &pv);
    bool ok = st == DT_OK;
    for (int r = 0; ok && r < ROUNDS; r++) {
        memset(got, 0, sizeof got);
        if (reader)
            ok = dt_ps_variable_read(pv, got, sizeof got) == DT_OK &&
                 memcmp(got, init, sizeof got) == 0;
        ok = dt_barrier() == DT_OK && ok;
    }
    tap_check(ok, "%d reads while the ps task waits in a barrier, each right: %s", ROUNDS,
              ok ? "ok" : dt_last_error());
    return ps_finish(pv, t, s);
}
