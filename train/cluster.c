/* Cluster description (TF_CONFIG JSON, read with jansson, or DTENSOR_CLUSTER) mapped onto MPI
 * ranks and agreed across clients: the roles (chief, worker, ps, evaluator) of the
 * parameter-server and multi-worker mirrored strategies, so it sits with them in train/. */
#include "train.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *dt_task_type_name(dt_task_type t)
{
    static const char *const names[] = {
#define TNAME(NAME, name) [DT_TASK_##NAME] = #name,
        DT_TASK_LIST(TNAME)
#undef TNAME
    };
    return (unsigned)t < DT_TASK_COUNT ? names[t] : "?";
}

static int task_of(const char *s, size_t n)
{
    for (int t = 0; t < DT_TASK_COUNT; t++)
        if (strlen(dt_task_type_name((dt_task_type)t)) == n &&
            strncmp(s, dt_task_type_name((dt_task_type)t), n) == 0)
            return t;
    return -1;
}

typedef struct tf_config {
    int counts[DT_TASK_COUNT];
    bool has_task;
    int task_type; /* -1: unknown name */
    char task_name[32];
    int task_index;
} tf_config;

/* TF_CONFIG through jansson: its parser bounds the nesting depth, and duplicate keys are
 * refused; the types are checked strictly (role lists of address strings, a known task type,
 * an integer index). */
static dt_status parse_tf_config(const char *text, tf_config *c)
{
    json_error_t e;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &e);
    if (!root)
        return dt__fail(DT_ERR_ARG, "TF_CONFIG: %s at line %d, column %d of \"%.200s\"", e.text,
                        e.line, e.column, text);
    dt_status s = DT_OK;
    json_t *cluster = json_object_get(root, "cluster"), *task = json_object_get(root, "task");
    if (!json_is_object(root))
        s = dt__fail(DT_ERR_ARG, "TF_CONFIG: not a JSON object: \"%.200s\"", text);
    else if (cluster && !json_is_object(cluster))
        s = dt__fail(DT_ERR_ARG, "TF_CONFIG: \"cluster\" is not an object");
    else if (task && !json_is_object(task))
        s = dt__fail(DT_ERR_ARG, "TF_CONFIG: \"task\" is not an object");
    const char *key;
    json_t *v;
    if (s == DT_OK && cluster)
        json_object_foreach(cluster, key, v)
        {
            int t = task_of(key, strlen(key));
            if (t < 0) {
                s = dt__fail(DT_ERR_ARG,
                             "TF_CONFIG: unknown role \"%.40s\" in cluster (chief, worker, ps, "
                             "evaluator)",
                             key);
                break;
            }
            size_t i;
            json_t *addr;
            bool strings = json_is_array(v);
            json_array_foreach(v, i, addr) strings = strings && json_is_string(addr);
            if (!strings) {
                s = dt__fail(DT_ERR_ARG, "TF_CONFIG: cluster.%s is not an array of address strings",
                             key);
                break;
            }
            c->counts[t] = (int)json_array_size(v);
        }
    if (s == DT_OK && task) {
        json_t *type = json_object_get(task, "type"), *index = json_object_get(task, "index");
        if (!json_is_string(type))
            s = dt__fail(DT_ERR_ARG, "TF_CONFIG: task.type is missing or not a string");
        else if (index && (!json_is_integer(index) || json_integer_value(index) < 0 ||
                           json_integer_value(index) > INT32_MAX))
            s = dt__fail(DT_ERR_ARG, "TF_CONFIG: task.index is not a non-negative integer");
        if (s == DT_OK) {
            snprintf(c->task_name, sizeof c->task_name, "%.31s", json_string_value(type));
            c->task_type = task_of(json_string_value(type), strlen(json_string_value(type)));
            c->task_index = index ? (int)json_integer_value(index) : 0;
            c->has_task = true;
        }
    }
    json_decref(root);
    return s;
}

/* "chief=1,worker=2,ps=1"; a role given twice is an error (as a duplicate key of TF_CONFIG
 * is), never the last one winning. */
static dt_status parse_spec(const char *spec, tf_config *c)
{
    const char *p = spec;
    unsigned seen = 0;
    while (*p) {
        const char *eq = strchr(p, '=');
        if (!eq)
            break;
        int t = task_of(p, (size_t)(eq - p));
        char *end;
        long v = strtol(eq + 1, &end, 10);
        if (t < 0 || end == eq + 1 || v < 0 || v > 1 << 20 || (*end && *end != ','))
            break;
        if (seen & 1u << t)
            return dt__fail(DT_ERR_ARG, "DTENSOR_CLUSTER \"%.200s\": role %.*s given twice", spec,
                            (int)(eq - p), p);
        seen |= 1u << t;
        c->counts[t] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*p || !*spec)
        return dt__fail(DT_ERR_ARG,
                        "DTENSOR_CLUSTER \"%.200s\": expected \"role=count,...\" with roles chief, "
                        "worker, ps, evaluator",
                        spec);
    return DT_OK;
}

dt_status dt_cluster_parse(const char *tf_config_text, const char *cluster_spec, int client,
                           int num_clients, dt_cluster *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_cluster_parse: out is NULL");
    memset(out, 0, sizeof *out);
    tf_config c;
    memset(&c, 0, sizeof c);
    c.task_type = -1;
    const char *src = tf_config_text ? "TF_CONFIG" : "DTENSOR_CLUSTER";
    if (num_clients < 1 || client < 0 || client >= num_clients)
        return dt__fail(DT_ERR_ARG, "dt_cluster_parse: client %d of %d clients", client,
                        num_clients);
    if (tf_config_text) {
        DT_TRY(parse_tf_config(tf_config_text, &c));
        if (c.has_task && c.task_type < 0)
            return dt__fail(DT_ERR_ARG,
                            "TF_CONFIG: task type \"%s\" is not chief, worker, ps or evaluator",
                            c.task_name);
        if (c.has_task && c.task_index >= c.counts[c.task_type])
            return dt__fail(DT_ERR_ARG, "TF_CONFIG: task %s:%d, but the cluster has %d %s tasks",
                            c.task_name, c.task_index, c.counts[c.task_type], c.task_name);
    } else if (cluster_spec) {
        DT_TRY(parse_spec(cluster_spec, &c));
    } else {
        c.counts[DT_TASK_CHIEF] = 1;
        c.counts[DT_TASK_WORKER] = num_clients - 1;
    }
    int total = 0;
    for (int t = 0; t < DT_TASK_COUNT; t++) {
        out->first_rank[t] = total;
        out->num_tasks[t] = c.counts[t];
        total += c.counts[t];
    }
    if (c.counts[DT_TASK_CHIEF] > 1)
        return dt__fail(DT_ERR_ARG, "%s: %d chief tasks, at most 1", src, c.counts[DT_TASK_CHIEF]);
    if (total != num_clients)
        return dt__fail(DT_ERR_ARG,
                        "%s names %d tasks (chief %d, worker %d, ps %d, evaluator %d) but there "
                        "are %d clients (MPI ranks); launch one rank per task",
                        src, total, c.counts[DT_TASK_CHIEF], c.counts[DT_TASK_WORKER],
                        c.counts[DT_TASK_PS], c.counts[DT_TASK_EVALUATOR], num_clients);
    for (int t = DT_TASK_COUNT - 1; t >= 0; t--)
        if (client >= out->first_rank[t] && c.counts[t]) {
            out->task_type = (dt_task_type)t;
            out->task_index = client - out->first_rank[t];
            break;
        }
    if (c.has_task && (c.task_type != (int)out->task_type || c.task_index != out->task_index))
        return dt__fail(DT_ERR_ARG,
                        "TF_CONFIG: task %s:%d, but MPI rank %d maps to %s:%d (ranks take tasks "
                        "in the order chief, worker, ps, evaluator)",
                        c.task_name, c.task_index, client, dt_task_type_name(out->task_type),
                        out->task_index);
    return DT_OK;
}

static int cluster_fields(const void *ctx, dt__field out[], int max)
{
    const dt_cluster *c = ctx;
    if (max < 1)
        return 0;
    dt__field_set(&out[0], "cluster", c->num_tasks, sizeof c->num_tasks,
                  "chief=%d,worker=%d,ps=%d,evaluator=%d", c->num_tasks[DT_TASK_CHIEF],
                  c->num_tasks[DT_TASK_WORKER], c->num_tasks[DT_TASK_PS],
                  c->num_tasks[DT_TASK_EVALUATOR]);
    return 1;
}

dt_status dt_cluster_resolve(dt_cluster *out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_cluster_resolve: out is NULL");
    DT_TRY(dt__require_init("dt_cluster_resolve"));
    const char *tf = getenv("TF_CONFIG"), *spec = getenv("DTENSOR_CLUSTER");
    if (tf && !*tf)
        tf = NULL;
    if (spec && !*spec)
        spec = NULL;
    dt_status s = dt_cluster_parse(tf, spec, dt__rt.client, dt__rt.num_clients, out);
    /* every client fails alike, with the first failing client's message; clients that resolve
     * different clusters (another DTENSOR_CLUSTER) all fail, naming both */
    uint64_t fp = dt__hash(DT__HASH_SEED, out->num_tasks, sizeof out->num_tasks);
    return dt__agree_on(
        &(dt__agreement){
            .what = "dt_cluster_resolve", .fingerprint = fp, .fields = cluster_fields, .ctx = out},
        s);
}
