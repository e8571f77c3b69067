/* Cluster description (TF_CONFIG JSON or DTENSOR_CLUSTER) mapped onto MPI ranks, with a small
 * JSON reader of its own: objects, arrays, strings, numbers, true/false/null. */
#include "../train/train.h"

#include <ctype.h>
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

/* ---- JSON: a cursor over the text; each parse function skips one value ------------------- */

typedef struct json {
    const char *p;
    const char *err; /* first error, or NULL */
} json;

static void ws(json *j)
{
    while (isspace((unsigned char)*j->p))
        j->p++;
}

static bool fail(json *j, const char *what)
{
    if (!j->err)
        j->err = what;
    return false;
}

/* A string: its raw contents (escapes kept) as [*s, *s + *n). */
static bool jstring(json *j, const char **s, size_t *n)
{
    ws(j);
    if (*j->p != '"')
        return fail(j, "expected a string");
    const char *b = ++j->p;
    while (*j->p && *j->p != '"')
        j->p += *j->p == '\\' && j->p[1] ? 2 : 1;
    if (*j->p != '"')
        return fail(j, "unterminated string");
    *s = b;
    *n = (size_t)(j->p - b);
    j->p++;
    return true;
}

static bool jvalue(json *j);

/* Iterate an object: call on each key with the cursor at its value; on must consume it. */
typedef bool (*member_fn)(json *j, const char *key, size_t n, void *ctx);

static bool jobject(json *j, member_fn on, void *ctx)
{
    ws(j);
    if (*j->p != '{')
        return fail(j, "expected an object");
    j->p++;
    ws(j);
    if (*j->p == '}') {
        j->p++;
        return true;
    }
    for (;;) {
        const char *k;
        size_t n;
        if (!jstring(j, &k, &n))
            return false;
        ws(j);
        if (*j->p != ':')
            return fail(j, "expected ':'");
        j->p++;
        if (!(on ? on(j, k, n, ctx) : jvalue(j)))
            return false;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == '}') {
            j->p++;
            return true;
        }
        return fail(j, "expected ',' or '}'");
    }
}

/* An array; *count gets its length. */
static bool jarray(json *j, int *count)
{
    ws(j);
    if (*j->p != '[')
        return fail(j, "expected an array");
    j->p++;
    *count = 0;
    ws(j);
    if (*j->p == ']') {
        j->p++;
        return true;
    }
    for (;;) {
        if (!jvalue(j))
            return false;
        (*count)++;
        ws(j);
        if (*j->p == ',') {
            j->p++;
            continue;
        }
        if (*j->p == ']') {
            j->p++;
            return true;
        }
        return fail(j, "expected ',' or ']'");
    }
}

static bool jnumber(json *j, double *v)
{
    ws(j);
    char *end;
    *v = strtod(j->p, &end);
    if (end == j->p)
        return fail(j, "expected a number");
    j->p = end;
    return true;
}

static bool jvalue(json *j)
{
    ws(j);
    const char *s;
    size_t n;
    int c;
    double v;
    switch (*j->p) {
    case '{':
        return jobject(j, NULL, NULL);
    case '[':
        return jarray(j, &c);
    case '"':
        return jstring(j, &s, &n);
    default:
        for (const char *w = "true\0false\0null\0"; *w; w += strlen(w) + 1)
            if (strncmp(j->p, w, strlen(w)) == 0) {
                j->p += strlen(w);
                return true;
            }
        return jnumber(j, &v);
    }
}

typedef struct tf_config {
    int counts[DT_TASK_COUNT];
    bool has_task;
    int task_type; /* -1: unknown name */
    char task_name[32];
    int task_index;
    char bad_role[32];
} tf_config;

static bool on_cluster(json *j, const char *key, size_t n, void *ctx)
{
    tf_config *c = ctx;
    int t = task_of(key, n);
    if (t < 0) {
        snprintf(c->bad_role, sizeof c->bad_role, "%.*s", (int)(n < 31 ? n : 31), key);
        return fail(j, "unknown role in cluster");
    }
    return jarray(j, &c->counts[t]);
}

static bool on_task(json *j, const char *key, size_t n, void *ctx)
{
    tf_config *c = ctx;
    if (n == 4 && strncmp(key, "type", 4) == 0) {
        const char *s;
        size_t m;
        if (!jstring(j, &s, &m))
            return false;
        snprintf(c->task_name, sizeof c->task_name, "%.*s", (int)(m < 31 ? m : 31), s);
        c->task_type = task_of(s, m);
        c->has_task = true;
        return true;
    }
    if (n == 5 && strncmp(key, "index", 5) == 0) {
        double v;
        if (!jnumber(j, &v))
            return false;
        c->task_index = (int)v;
        return true;
    }
    return jvalue(j);
}

static bool on_top(json *j, const char *key, size_t n, void *ctx)
{
    if (n == 7 && strncmp(key, "cluster", 7) == 0)
        return jobject(j, on_cluster, ctx);
    if (n == 4 && strncmp(key, "task", 4) == 0)
        return jobject(j, on_task, ctx);
    return jvalue(j);
}

/* "chief=1,worker=2,ps=1" */
static dt_status parse_spec(const char *spec, tf_config *c)
{
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '=');
        if (!eq)
            break;
        int t = task_of(p, (size_t)(eq - p));
        char *end;
        long v = strtol(eq + 1, &end, 10);
        if (t < 0 || end == eq + 1 || v < 0 || v > 1 << 20 || (*end && *end != ','))
            break;
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
    if (tf_config_text) {
        json j = {.p = tf_config_text};
        if (!jobject(&j, on_top, &c) || (ws(&j), *j.p))
            return dt__fail(DT_ERR_ARG, "TF_CONFIG: %s%s%s at offset %d of \"%.200s\"",
                            j.err ? j.err : "trailing text", c.bad_role[0] ? " " : "", c.bad_role,
                            (int)(j.p - tf_config_text), tf_config_text);
        if (c.has_task && c.task_type < 0)
            return dt__fail(DT_ERR_ARG,
                            "TF_CONFIG: task type \"%s\" is not chief, worker, ps or evaluator",
                            c.task_name);
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

dt_status dt_cluster_resolve(dt_cluster *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_cluster_resolve: out is NULL");
    DT_TRY(dt__require_init("dt_cluster_resolve"));
    const char *tf = getenv("TF_CONFIG"), *spec = getenv("DTENSOR_CLUSTER");
    if (tf && !*tf)
        tf = NULL;
    if (spec && !*spec)
        spec = NULL;
    dt_status s = dt_cluster_parse(tf, spec, dt__rt.client, dt__rt.num_clients, out);
    /* every client fails alike, with the first failing client's message */
    return dt__agree(dt__rt.world, s);
}
