/* dt_ps_variable_fetch_add as a counter shared by the cluster (run with DTENSOR_CLUSTER=chief=1,
 * worker=W,ps=P at -n 1+W+P): every worker adds {1, 2} to an int64 variable of two rows (one
 * shard per ps task when P = 2) K times at once, keeping the values it saw before each of its
 * additions. Atomic per element means the first row's values seen across the workers are
 * 0, 1, ..., W K - 1, each exactly once (the second row's 0, 2, ..., each once: the rows are
 * separate elements, maybe on separate ps tasks, so a pair need not match), and the final
 * value is {W K, 2 W K}. */
#include "ps_task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { K = 50, MAX_CLIENTS = 16 };

int main(void)
{
    dt_strategy *s;
    dt_cluster cl;
    int rc;
    if (!ps_start(60, &s, &cl, &rc))
        return rc;
    dt_status st;
    int workers = cl.num_tasks[DT_TASK_WORKER], clients = dt_num_clients();
    bool worker = cl.task_type == DT_TASK_WORKER;
    const int64_t zero[2] = {0, 0}, delta[2] = {1, 2};
    dt_layout rep;
    dt_tensor *t = NULL;
    dt_ps_variable *pv = NULL;
    st = dt_layout_replicated(dt_strategy_mesh(s), 1, &rep);
    st =
        st ? st : dt_tensor_from_host(&rep, DT_DTYPE_I64, 1, (int64_t[]){2}, zero, sizeof zero, &t);
    st = st ? st : dt_ps_variable_create(s, t, &pv);
    tap_check(st == DT_OK, "an int64 counter of 2 rows in %d shards: %s",
              pv ? dt_ps_variable_num_shards(pv) : 0, st ? dt_last_error() : "ok");
    /* seen[k]: this client's k-th pair of values before its addition (none on non-workers) */
    int64_t seen[K][2] = {{0}};
    bool ok = st == DT_OK;
    ok = dt_barrier() == DT_OK && ok; /* every worker starts together */
    for (int k = 0; ok && worker && k < K; k++)
        ok = dt_ps_variable_fetch_add(pv, delta, seen[k], sizeof delta) == DT_OK;
    ok = dt_barrier() == DT_OK && ok;
    tap_check(ok, "%d fetch-adds on each of %d workers: %s", K, workers,
              ok ? "ok" : dt_last_error());
    /* every client gets every client's values: each count must be seen exactly once */
    int64_t(*all)[K][2] = calloc((size_t)clients, sizeof *all);
    ok =
        ok && all && clients <= MAX_CLIENTS && dt_client_allgather(seen, sizeof seen, all) == DT_OK;
    int hits[2][MAX_CLIENTS * K] = {{0}}, bad = 0;
    for (int c = 0; ok && c < clients; c++) {
        bool was_worker =
            c >= cl.first_rank[DT_TASK_WORKER] && c < cl.first_rank[DT_TASK_WORKER] + workers;
        for (int k = 0; was_worker && k < K; k++)
            for (int r = 0; r < 2; r++) {
                int64_t v = all[c][k][r], step = delta[r];
                if (v < 0 || v >= (int64_t)workers * K * step || v % step)
                    bad++;
                else
                    hits[r][v / step]++;
            }
    }
    for (int i = 0; ok && i < workers * K; i++)
        bad += (hits[0][i] != 1) + (hits[1][i] != 1);
    tap_check(ok && bad == 0,
              "the values seen are 0..%d, each once (second row twice them): "
              "%d wrong",
              workers * K - 1, bad);
    int64_t final[2] = {-1, -1};
    st = ok ? dt_ps_variable_read(pv, final, sizeof final) : DT_ERR_STATE;
    tap_check(st == DT_OK && final[0] == (int64_t)workers * K && final[1] == 2 * final[0],
              "final value {%lld, %lld}, want {%d, %d}", (long long) final[0], (long long) final[1],
              workers * K, 2 * workers * K);
    int64_t short_buf[1];
    tap_check(dt_ps_variable_fetch_add(pv, delta, short_buf, sizeof short_buf) == DT_ERR_ARG,
              "a short buffer is refused: %s", dt_last_error());
    free(all);
    return ps_finish(pv, t, s);
}
