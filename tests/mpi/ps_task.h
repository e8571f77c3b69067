/* What the parameter-server variable tests (ps_read.c, ps_counter.c) share: their start (dt_init,
 * TAP, an alarm, the strategy of DTENSOR_CLUSTER) and their end. */
#ifndef DT_TEST_PS_TASK_H
#define DT_TEST_PS_TASK_H

#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <unistd.h>

/* dt_init, TAP, an alarm in `seconds` (a hang fails), the parameter-server strategy *s and this
 * client's place in its cluster. False after a failure, with *rc the exit status. */
static inline bool ps_start(unsigned seconds, dt_strategy **s, dt_cluster *cl, int *rc)
{
    *s = NULL;
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        *rc = 1;
        return false;
    }
    tap_init();
    alarm(seconds);
    dt_status st = dt_strategy_create(DT_STRATEGY_PARAMETER_SERVER, NULL, s);
    if (!tap_check(st == DT_OK, "parameter-server strategy: %s", st ? dt_last_error() : "ok")) {
        *rc = tap_done();
        return false;
    }
    dt_strategy_cluster(*s, cl);
    return true;
}

/* The alarm off, the objects freed, TAP's plan, dt_finalize: the exit status. */
static inline int ps_finish(dt_ps_variable *pv, dt_tensor *t, dt_strategy *s)
{
    alarm(0);
    dt_ps_variable_free(pv);
    dt_tensor_free(t);
    dt_strategy_free(s);
    int rc = tap_done();
    dt_finalize();
    return rc;
}

#endif
