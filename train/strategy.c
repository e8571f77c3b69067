/* The strategies' runtime (ARCHITECTURE.md "Strategies as layout presets"): create and free,
 * scopes, run a step, reduce per-replica values, read results, the cluster. Where a strategy
 * puts its variables and inputs is layout/strategy.c's preset (dt__preset); everything else
 * (gradient all-reduce included) is the expansion engine's. Central storage's training step
 * copies the variables to the batch mesh and the gradients back (train/model.c); the parameter
 * server's runtime is train/ps.c. */
#include "train.h"

#include <stdlib.h>

const char *dt_strategy_kind_name(dt_strategy_kind k)
{
    static const char *const names[] = {
#define SNAME(NAME, name) [DT_STRATEGY_##NAME] = #name,
        DT_STRATEGY_LIST(SNAME)
#undef SNAME
    };
    return (unsigned)k < DT_STRATEGY_COUNT ? names[k] : "?";
}

/* ---- scope -------------------------------------------------------------------------------- */

#define MAX_SCOPES 16
static _Thread_local dt_strategy *scopes[MAX_SCOPES];
static _Thread_local int nscopes;

dt_strategy *dt__strategy_scope(void)
{
    return nscopes ? scopes[nscopes - 1] : NULL;
}

dt_strategy *dt_strategy_current(void)
{
    return dt__strategy_scope();
}

dt_status dt_strategy_scope_enter(dt_strategy *s)
{
    if (!s)
        return dt__fail(DT_ERR_ARG, "dt_strategy_scope_enter: strategy is NULL");
    if (nscopes == MAX_SCOPES)
        return dt__fail(DT_ERR_STATE, "dt_strategy_scope_enter: %d scopes nested already",
                        MAX_SCOPES);
    scopes[nscopes++] = s;
    return DT_OK;
}

dt_status dt_strategy_scope_exit(dt_strategy *s)
{
    if (!nscopes || scopes[nscopes - 1] != s)
        return dt__fail(DT_ERR_STATE,
                        "dt_strategy_scope_exit: strategy %s is not the innermost scope",
                        s ? dt_strategy_kind_name(s->kind) : "(NULL)");
    nscopes--;
    return DT_OK;
}

/* ---- create ------------------------------------------------------------------------------ */

dt_status dt_strategy_create(dt_strategy_kind kind, const dt_strategy_options *opts,
                             dt_strategy **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_create: out is NULL");
    *out = NULL;
    DT_TRY(dt__require_init("dt_strategy_create"));
    if ((unsigned)kind >= DT_STRATEGY_COUNT)
        return dt__fail(DT_ERR_ARG, "dt_strategy_create: kind %d outside 0..%d", (int)kind,
                        DT_STRATEGY_COUNT - 1);
    dt_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return dt__fail(DT_ERR_NOMEM, "dt_strategy_create: out of memory");
    s->kind = kind;
    s->comm = MPI_COMM_NULL;
    if (opts)
        s->partitioner = opts->partitioner;
    dt_device_type type = opts ? opts->device_type : DT_DEVICE_CPU;
    if ((unsigned)type >= DT_DEVICE_COUNT) {
        free(s);
        return dt__fail(DT_ERR_ARG, "dt_strategy_create: device_type %d outside 0..%d", (int)type,
                        DT_DEVICE_COUNT - 1);
    }
    /* the parameter server first: a cluster without ps or worker tasks fails on every client
     * (an agreement) before any mesh is made */
    dt_status st = DT_OK;
    if (kind == DT_STRATEGY_PARAMETER_SERVER) {
        st = dt_cluster_resolve(&s->cluster);
        if (st == DT_OK &&
            (s->cluster.num_tasks[DT_TASK_PS] < 1 || s->cluster.num_tasks[DT_TASK_WORKER] < 1))
            st = dt__fail(DT_ERR_ARG,
                          "dt_strategy_create: the parameter-server strategy needs at least one "
                          "ps task and one worker task; the cluster has %d ps and %d workers "
                          "(set TF_CONFIG or DTENSOR_CLUSTER, e.g. chief=1,worker=2,ps=1)",
                          s->cluster.num_tasks[DT_TASK_PS], s->cluster.num_tasks[DT_TASK_WORKER]);
    }
    if (st == DT_OK)
        st = dt__preset_create(kind, opts, &s->preset);
    /* the parameter server's variable windows are made on a communicator of its own, apart
     * from the runtime's */
    if (st == DT_OK && kind == DT_STRATEGY_PARAMETER_SERVER && dt__rt.world != MPI_COMM_NULL) {
        MPI_Request req;
        st = MPI_Comm_idup(dt__rt.world, &s->comm, &req) == MPI_SUCCESS
                 ? dt__mpi_wait_all(1, &req)
                 : dt__fail(DT_ERR_COMM, "dt_strategy_create: MPI_Comm_idup failed");
    }
    /* MultiWorkerMirroredStrategy reads TF_CONFIG as TensorFlow's: one worker (or chief) task
     * per client, this client's task the one its rank maps to; no ps tasks */
    if (st == DT_OK && kind == DT_STRATEGY_MULTI_WORKER_MIRRORED) {
        st = dt_cluster_resolve(&s->cluster);
        if (st == DT_OK && s->cluster.num_tasks[DT_TASK_PS] > 0)
            st = dt__fail(DT_ERR_ARG,
                          "dt_strategy_create: the cluster has %d ps tasks; multi-worker mirrored "
                          "training takes worker (and chief) tasks only (the parameter-server "
                          "strategy takes ps tasks)",
                          s->cluster.num_tasks[DT_TASK_PS]);
    }
    if (st != DT_OK) {
        dt__preset_free(&s->preset);
        free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s)
{
    DT__SERIAL();
    if (!s)
        return;
    for (int i = 0; i < nscopes; i++)
        if (scopes[i] == s)
            scopes[i] = NULL; /* a dangling scope would hand out a freed strategy */
    if (s->comm != MPI_COMM_NULL)
        MPI_Comm_free(&s->comm);
    dt__preset_free(&s->preset);
    free(s);
}

dt_strategy_kind dt_strategy_kind_of(const dt_strategy *s)
{
    return s ? s->kind : DT_STRATEGY_DEFAULT;
}

int dt_strategy_num_replicas_in_sync(const dt_strategy *s)
{
    return s ? s->preset.replicas : 0;
}

const dt_mesh *dt_strategy_mesh(const dt_strategy *s)
{
    return s ? s->preset.mesh : NULL;
}

dt_status dt_strategy_variable_layout(const dt_strategy *s, int rank, dt_layout *out)
{
    if (!s || !out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_variable_layout: strategy or out is NULL");
    return dt__preset_variable_layout(&s->preset, rank, out);
}

dt_status dt_strategy_variable_create(const dt_strategy *s, dt_dtype dtype, int rank,
                                      const int64_t shape[], const void *host, size_t bytes,
                                      dt_variable **out)
{
    DT__SERIAL();
    if (out)
        *out = NULL;
    const dt_strategy *in = s ? s : dt__strategy_scope();
    /* every client is in the same scope with the same arguments, so these fail alike */
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_variable_create: out is NULL");
    if (!in)
        return dt__fail(DT_ERR_STATE,
                        "dt_strategy_variable_create: no strategy given and none in scope on "
                        "this thread (dt_strategy_scope_enter); a variable outside a strategy is "
                        "made from a tensor in a layout of your choice (dt_variable_create)");
    if (in->kind == DT_STRATEGY_PARAMETER_SERVER)
        return dt__fail(DT_ERR_ARG, "dt_strategy_variable_create: the parameter-server "
                                    "strategy keeps variables on the ps tasks: use "
                                    "dt_ps_variable_create");
    dt_layout l;
    DT_TRY(dt_strategy_variable_layout(in, rank, &l));
    dt_tensor *t = NULL;
    DT_TRY(dt_tensor_from_host(&l, dtype, rank, shape, host, bytes, &t));
    dt_status st = dt_variable_create(t, out);
    dt_tensor_free(t);
    return st;
}

dt_status dt_strategy_input_layout(const dt_strategy *s, int rank, dt_layout *out)
{
    if (!s || !out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_input_layout: strategy or out is NULL");
    return dt__preset_input_layout(&s->preset, rank, out);
}

dt_status dt_strategy_distribute_batch(const dt_strategy *s, dt_dtype dtype, int rank,
                                       const int64_t shape[], const void *host, size_t bytes,
                                       dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_distribute_batch: out is NULL");
    *out = NULL;
    dt_layout l;
    DT_TRY(dt_strategy_input_layout(s, rank, &l));
    return dt_tensor_from_host(&l, dtype, rank, shape, host, bytes, out);
}

dt_status dt_strategy_run(dt_strategy *s, dt_strategy_step_fn step, void *ctx, int num_inputs,
                          const dt_tensor *const inputs[])
{
    DT__SERIAL();
    if (!s || !step || num_inputs < 0 || (num_inputs && !inputs))
        return dt__fail(DT_ERR_ARG, "dt_strategy_run: strategy, step or inputs NULL");
    for (int i = 0; i < num_inputs; i++) {
        if (!inputs[i])
            return dt__fail(DT_ERR_ARG, "dt_strategy_run: input %d is NULL", i);
        dt_layout l;
        DT_TRY(dt_strategy_input_layout(s, inputs[i]->rank, &l));
        if (!dt_layout_equal(&l, &inputs[i]->layout)) {
            char la[DT_STRING_MAX], lb[DT_STRING_MAX];
            return dt__fail(DT_ERR_LAYOUT,
                            "dt_strategy_run: input %d is laid out \"%s\", strategy %s takes "
                            "\"%s\" (use dt_strategy_distribute_batch)",
                            i, dt__layout_str(&inputs[i]->layout, la, sizeof la),
                            dt_strategy_kind_name(s->kind), dt__layout_str(&l, lb, sizeof lb));
        }
    }
    DT_TRY(dt_strategy_scope_enter(s));
    dt_status st = step(ctx, s, num_inputs, inputs);
    dt_strategy_scope_exit(s);
    return st;
}

dt_status dt_strategy_reduce(const dt_strategy *s, dt_reduce_op op, const dt_tensor *per_replica,
                             dt_tensor **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_reduce: out is NULL");
    *out = NULL;
    if (!s || !per_replica)
        return dt__fail(DT_ERR_ARG, "dt_strategy_reduce: strategy or value is NULL");
    if (op != DT_REDUCE_SUM && op != DT_REDUCE_MEAN)
        return dt__fail(DT_ERR_ARG, "dt_strategy_reduce: %s, expected sum or mean",
                        dt_reduce_op_name(op));
    if (per_replica->rank < 1 || per_replica->shape[0] != s->preset.replicas) {
        char sb[DT__SHAPE_STR_MAX];
        return dt__fail(DT_ERR_SHAPE,
                        "dt_strategy_reduce: value %s, expected one row per replica [%d, ...]",
                        dt__shape_str(sb, sizeof sb, per_replica->rank, per_replica->shape),
                        s->preset.replicas);
    }
    dt_layout l;
    DT_TRY(dt_layout_replicated(s->preset.mesh, per_replica->rank - 1, &l));
    dt_op_options o = {.layout = &l};
    return dt_reduce(op, per_replica, 1, (int[]){0}, 0, &o, out);
}

dt_status dt_strategy_local_result(const dt_strategy *s, const dt_tensor *value, int i, void *dst,
                                   size_t bytes)
{
    DT__SERIAL();
    if (!s || !value || value->mesh != s->preset.mesh)
        return dt__fail(DT_ERR_ARG, "dt_strategy_local_result: the value is not on the "
                                    "strategy's mesh");
    return dt_tensor_unpack(value, i, dst, bytes);
}

dt_status dt__read_replicated(const dt_tensor *t, void *dst, size_t bytes)
{
    if (dt_layout_is_replicated(&t->layout))
        return dt_tensor_unpack(t, 0, dst, bytes);
    dt_layout l;
    DT_TRY(dt_layout_replicated(t->mesh, t->rank, &l));
    dt_tensor *r;
    DT_TRY(dt_relayout(t, &l, NULL, &r));
    dt_status s = dt_tensor_unpack(r, 0, dst, bytes);
    dt_tensor_free(r);
    return s;
}

dt_status dt_strategy_read_scalar(const dt_strategy *s, const dt_tensor *t, double *value)
{
    DT__SERIAL();
    if (!s || !t || !value || dt_tensor_num_elements(t) != 1)
        return dt__fail(DT_ERR_ARG, "dt_strategy_read_scalar: a one-element tensor and a value "
                                    "pointer are needed");
    /* a mesh with a communicator may leave this client without a component (one device, or
     * a subset): the gathering read gives every client the value; a client-local mesh (no
     * communicator) has no other client to gather from */
    bool gather = t->mesh->comm != MPI_COMM_NULL;
    if (t->dtype == DT_DTYPE_F32) {
        float f;
        DT_TRY(gather ? dt_tensor_read(t, &f, sizeof f) : dt__read_replicated(t, &f, sizeof f));
        *value = f;
    } else if (t->dtype == DT_DTYPE_F64) {
        DT_TRY(gather ? dt_tensor_read(t, value, sizeof *value)
                      : dt__read_replicated(t, value, sizeof *value));
    } else {
        return dt__fail(DT_ERR_DTYPE, "dt_strategy_read_scalar: %s, expected f32 or f64",
                        dt_dtype_name(t->dtype));
    }
    return DT_OK;
}

dt_status dt_strategy_cluster(const dt_strategy *s, dt_cluster *out)
{
    if (!s || !out ||
        (s->kind != DT_STRATEGY_PARAMETER_SERVER && s->kind != DT_STRATEGY_MULTI_WORKER_MIRRORED))
        return dt__fail(DT_ERR_ARG, "dt_strategy_cluster: not a parameter-server or multi-worker "
                                    "mirrored strategy");
    *out = s->cluster;
    return DT_OK;
}
