/* Bad cluster configuration gives the same clear error on every client (each check's verdict
 * is the AND over ranks, so one rank without the error fails it). */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void expect_error(const char *tf_config, const char *spec, const char *needle,
                         const char *what)
{
    if (tf_config)
        setenv("TF_CONFIG", tf_config, 1);
    else
        unsetenv("TF_CONFIG");
    if (spec)
        setenv("DTENSOR_CLUSTER", spec, 1);
    else
        unsetenv("DTENSOR_CLUSTER");
    dt_strategy *s = (dt_strategy *)1;
    dt_status st = dt_strategy_create(DT_STRATEGY_PARAMETER_SERVER, NULL, &s);
    tap_check(st == DT_ERR_ARG && s == NULL && strstr(dt_last_error(), needle) != NULL, "%s: %s",
              what, dt_last_error());
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int n = dt_num_clients();
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"cluster\": {\"chief\": [\"h:1\"], \"worker\": [\"h:2\", \"h:3\", \"h:4\"], "
             "\"ps\": [\"h:5\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}");
    expect_error(buf, NULL, n == 5 ? "task chief:0" : "names 5 tasks",
                 "TF_CONFIG naming more tasks than ranks");
    snprintf(buf, sizeof buf, "chief=1,worker=%d", n - 1);
    expect_error(NULL, buf, "needs at least one ps task", "no ps task");
    snprintf(buf, sizeof buf, "chief=1,worker=%d,ps=0", n - 1);
    expect_error(NULL, buf, "needs at least one ps task", "ps=0");
    /* a role given twice: an error, not the last count winning (worker=3,worker=1 made one
     * worker; with ps=1 and a chief that is a valid cluster at -n 3) */
    snprintf(buf, sizeof buf, "chief=1,worker=3,ps=1,worker=%d", n > 2 ? n - 2 : 0);
    expect_error(NULL, buf, "role worker given twice", "a role given twice");
    /* every rank claims to be worker 0 of a cluster of 1 chief and n - 1 ps: rank 0 maps to the
     * chief, the others to ps tasks; every rank fails */
    int at = snprintf(buf, sizeof buf, "{\"cluster\": {\"chief\": [\"a\"], \"ps\": [");
    for (int i = 1; i < n; i++)
        at += snprintf(buf + at, sizeof buf - (size_t)at, "%s\"b\"", i > 1 ? ", " : "");
    snprintf(buf + at, sizeof buf - (size_t)at,
             "]}, \"task\": {\"type\": \"worker\", \"index\": 0}}");
    expect_error(buf, NULL, "TF_CONFIG: task worker:0, but the cluster has 0 worker tasks",
                 "TF_CONFIG naming a task the cluster lacks");
    if (n > 1) { /* n workers; every rank claims the next rank's task */
        at = snprintf(buf, sizeof buf, "{\"cluster\": {\"worker\": [");
        for (int i = 0; i < n; i++)
            at += snprintf(buf + at, sizeof buf - (size_t)at, "%s\"w\"", i ? ", " : "");
        snprintf(buf + at, sizeof buf - (size_t)at,
                 "]}, \"task\": {\"type\": \"worker\", \"index\": %d}}", (dt_client_id() + 1) % n);
        expect_error(buf, NULL, "but MPI rank", "TF_CONFIG task disagreeing with the rank");
    }
    expect_error("{\"cluster\": {\"master\": [\"a\"]}}", NULL, "unknown role \"master\"",
                 "unknown role");
    /* strict JSON and types (jansson): nesting past its depth limit, a fractional or huge
     * index, duplicate keys, trailing commas, addresses that are not strings */
    static char deep[100001];
    memset(deep, '[', sizeof deep - 1);
    expect_error(deep, NULL, "TF_CONFIG:", "100 KB of nested brackets");
    expect_error("{\"cluster\": {\"worker\": [\"a\"]}, \"task\": {\"type\": \"worker\", "
                 "\"index\": 1.9}}",
                 NULL, "task.index is not a non-negative integer", "a fractional index");
    expect_error("{\"cluster\": {\"worker\": [\"a\"]}, \"task\": {\"type\": \"worker\", "
                 "\"index\": 1e300}}",
                 NULL, "task.index is not a non-negative integer", "an index of 1e300");
    expect_error("{\"cluster\": {\"worker\": [\"a\"], \"worker\": [\"b\"]}}", NULL,
                 "duplicate object key", "a duplicate key");
    expect_error("{\"cluster\": {\"worker\": [\"a\",]}}", NULL, "TF_CONFIG:", "a trailing comma");
    expect_error("{\"cluster\": {\"worker\": [1]}}", NULL, "not an array of address strings",
                 "an address that is not a string");
    /* clients resolving different clusters fail alike, naming both */
    if (n > 1) {
        snprintf(buf, sizeof buf, "chief=1,worker=%d,ps=%d", dt_client_id() ? n - 2 : n - 1,
                 dt_client_id() ? 1 : 0);
        unsetenv("TF_CONFIG");
        setenv("DTENSOR_CLUSTER", buf, 1);
        dt_cluster c;
        dt_status st = dt_cluster_resolve(&c);
        tap_check(st == DT_ERR_MISMATCH &&
                      strstr(dt_last_error(), "clients differ in cluster: client 0 has") &&
                      strstr(dt_last_error(), "ps=0") && strstr(dt_last_error(), "ps=1"),
                  "clients with different DTENSOR_CLUSTER fail alike: %s", dt_last_error());
    }
    unsetenv("TF_CONFIG");
    unsetenv("DTENSOR_CLUSTER");
    /* strategies over devices of a type: an unknown type, and a type with no device here */
    dt_strategy *s = (dt_strategy *)1;
    dt_strategy_options bad = {.device_type = (dt_device_type)7};
    dt_status st = dt_strategy_create(DT_STRATEGY_MIRRORED, &bad, &s);
    tap_check(st == DT_ERR_ARG && !s && strstr(dt_last_error(), "device_type 7"),
              "unknown device type: %s", dt_last_error());
    if (dt_num_global_devices(DT_DEVICE_CUDA) == 0) {
        dt_strategy_options gpu = {.device_type = DT_DEVICE_CUDA};
        s = (dt_strategy *)1;
        st = dt_strategy_create(DT_STRATEGY_MULTI_WORKER_MIRRORED, &gpu, &s);
        tap_check(st != DT_OK && !s && strstr(dt_last_error(), "CUDA"),
                  "a strategy over CUDA devices without any: %s", dt_last_error());
    }
    /* placement: one device anywhere (here the last global device), a range of local devices
     * for mirrored, and devices that do not exist */
    int g = dt_num_global_devices(DT_DEVICE_CPU), local = dt_num_local_devices(DT_DEVICE_CPU);
    dt_strategy_options one = {.device = g - 1};
    s = NULL;
    st = dt_strategy_create(DT_STRATEGY_ONE_DEVICE, &one, &s);
    const dt_mesh *sm = s ? dt_strategy_mesh(s) : NULL;
    tap_check(st == DT_OK && dt_mesh_global_device_id(sm, 0) == g - 1 &&
                  dt_mesh_num_local_devices(sm) == (dt_client_id() == n - 1),
              "one_device on global device %d: %s", g - 1, st ? dt_last_error() : "");
    dt_strategy_free(s);
    one.device = g;
    s = (dt_strategy *)1;
    st = dt_strategy_create(DT_STRATEGY_ONE_DEVICE, &one, &s);
    tap_check(st != DT_OK && !s && strstr(dt_last_error(), "device id"),
              "one_device on a device that does not exist: %s", dt_last_error());
    dt_strategy_options range = {.first_device = local - 1, .num_devices = 1};
    s = NULL;
    st = dt_strategy_create(DT_STRATEGY_MIRRORED, &range, &s);
    tap_check(st == DT_OK && dt_strategy_num_replicas_in_sync(s) == 1,
              "mirrored on this client's last device: %s", st ? dt_last_error() : "");
    dt_strategy_free(s);
    range = (dt_strategy_options){.first_device = local - 1, .num_devices = 2};
    s = (dt_strategy *)1;
    st = dt_strategy_create(DT_STRATEGY_MIRRORED, &range, &s);
    tap_check(st != DT_OK && !s && strstr(dt_last_error(), "local devices"),
              "mirrored past this client's devices: %s", dt_last_error());
    int rc = tap_done();
    dt_finalize();
    return rc;
}
