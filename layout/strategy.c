/* tf.distribute strategies as layout presets (ARCHITECTURE.md "Strategies as layout presets"):
 * for each kind, the meshes it makes and the layouts its variables and inputs take on them.
 * Mesh and layout code only; the strategies' runtime (scopes, steps, reductions, cluster
 * roles, the parameter server) sits above the engine, in train/strategy.c and train/ps.c. */
#include "dt.h"

#include <string.h>

/* A 1-D mesh "batch" over this client's devices only: the other clients own none of it, so
 * its collectives stay inside this client (and it has no communicator). Not collective. */
static dt_status local_batch_mesh(dt_device_type type, dt_mesh **out)
{
    *out = NULL;
    int n = dt__rt.num_devices[type];
    if (n < 1)
        return dt__fail(DT_ERR_MESH, "local mesh: this client has no %s device",
                        dt_device_type_name(type));
    const char *names[1] = {"batch"};
    return dt_mesh_create_local(1, names, &n, type, 0, out);
}

void dt__preset_free(dt__preset *p)
{
    if (!p)
        return;
    dt_mesh_free(p->var_mesh);
    dt_mesh_free(p->mesh);
    memset(p, 0, sizeof *p);
}

dt_status dt__preset_create(dt_strategy_kind kind, const dt_strategy_options *opts, dt__preset *out)
{
    memset(out, 0, sizeof *out);
    dt_device_type type = opts ? opts->device_type : DT_DEVICE_CPU;
    int device = opts ? opts->device : 0; /* checked by the mesh over it */
    const char *names[1] = {"batch"};
    dt_status st = DT_OK;
    switch (kind) {
    case DT_STRATEGY_ONE_DEVICE: /* one global device alone; other clients hold no component */
        st = dt_mesh_create_on_devices(1, names, (int[]){1}, type, 1, (int[]){device}, &out->mesh);
        out->replicas = 1;
        break;
    case DT_STRATEGY_DEFAULT:
    case DT_STRATEGY_MULTI_WORKER_MIRRORED:
    case DT_STRATEGY_CENTRAL_STORAGE: {
        int n = dt_num_global_devices(type);
        st = dt_mesh_create(1, names, &n, type, &out->mesh);
        out->shard_inputs = kind != DT_STRATEGY_DEFAULT;
        out->replicas = out->shard_inputs ? n : 1;
        if (st == DT_OK && kind == DT_STRATEGY_CENTRAL_STORAGE)
            st = dt_mesh_create_on_devices(1, names, (int[]){1}, type, 1, (int[]){device},
                                           &out->var_mesh);
        break;
    }
    case DT_STRATEGY_MIRRORED:
        if (opts && opts->num_devices) /* a range of this client's devices */
            st = dt_mesh_create_local(1, names, &opts->num_devices, type, opts->first_device,
                                      &out->mesh);
        else
            st = local_batch_mesh(type, &out->mesh);
        out->shard_inputs = true;
        out->replicas = st == DT_OK ? out->mesh->size : 0;
        break;
    case DT_STRATEGY_PARAMETER_SERVER: /* each worker computes alone on its own devices */
        st = local_batch_mesh(type, &out->mesh);
        out->shard_inputs = true;
        out->replicas = st == DT_OK ? out->mesh->size : 0;
        break;
    default:
        break;
    }
    if (st != DT_OK)
        dt__preset_free(out);
    return st;
}

dt_status dt__preset_variable_layout(const dt__preset *p, int rank, dt_layout *out)
{
    return dt_layout_replicated(p->var_mesh ? p->var_mesh : p->mesh, rank, out);
}

dt_status dt__preset_input_layout(const dt__preset *p, int rank, dt_layout *out)
{
    if (!p->shard_inputs || rank < 1)
        return dt_layout_replicated(p->mesh, rank, out);
    return dt_layout_batch_sharded(p->mesh, "batch", rank, out);
}

int dt__preset_ps_num_shards(const dt_partitioner *p, int64_t rows, int64_t row_bytes, int nps)
{
    int64_t bytes = rows * row_bytes, n = nps;
    if (p->fixed_shards > 0)
        n = p->fixed_shards;
    else if (p->max_shard_bytes > 0)
        n = (bytes + p->max_shard_bytes - 1) / p->max_shard_bytes;
    else if (p->min_shard_bytes > 0)
        n = bytes / p->min_shard_bytes;
    if (p->max_shards > 0 && n > p->max_shards)
        n = p->max_shards;
    if (n > rows)
        n = rows;
    return n < 1 ? 1 : (int)n;
}

/* ---- sharding presets for transformers ------------------------------------------------- */

const char *dt_strategy_preset_name(dt_strategy_preset p)
{
    static const char *const names[] = {
#define PRESET_NAME(NAME, name) [DT_STRATEGY_PRESET_##NAME] = #name,
        DT_STRATEGY_PRESET_LIST(PRESET_NAME)
#undef PRESET_NAME
    };
    return (unsigned)p < DT_STRATEGY_PRESET_COUNT ? names[p] : "?";
}

const char *dt_param_role_name(dt_param_role r)
{
    static const char *const names[] = {
#define ROLE_NAME(NAME, name) [DT_PARAM_##NAME] = #name,
        DT_PARAM_ROLE_LIST(ROLE_NAME)
#undef ROLE_NAME
    };
    return (unsigned)r < DT_PARAM_ROLE_COUNT ? names[r] : "?";
}

dt_status dt_strategy_preset_mesh(dt_strategy_preset p, int model_size, dt_device_type type,
                                  dt_mesh **out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_strategy_preset_mesh: out is NULL");
    *out = NULL;
    if ((unsigned)p >= DT_STRATEGY_PRESET_COUNT || model_size < 0)
        return dt__fail(DT_ERR_ARG, "dt_strategy_preset_mesh: preset %d, model size %d", (int)p,
                        model_size);
    int n = dt_num_global_devices(type), model = 1;
    if (p == DT_STRATEGY_PRESET_TENSOR_PARALLEL)
        model = n;
    else if (p == DT_STRATEGY_PRESET_FULLY_SHARDED_TENSOR_PARALLEL)
        model = model_size ? model_size : 2;
    if (n < 1 || n % model)
        return dt__fail(DT_ERR_MESH,
                        "dt_strategy_preset_mesh: %s over %d %s devices: a model axis "
                        "of %d does not divide them",
                        dt_strategy_preset_name(p), n, dt_device_type_name(type), model);
    const char *names[2] = {"batch", "model"};
    return dt_mesh_create(2, names, (int[]){n / model, model}, type, out);
}

dt_status dt_strategy_preset_parameter_layout(dt_strategy_preset p, const dt_mesh *m,
                                              dt_param_role role, int rank, const int64_t shape[],
                                              dt_layout *stored, dt_layout *used)
{
    int batch = m ? dt_mesh_axis_index(m, "batch") : -1;
    int model = m ? dt_mesh_axis_index(m, "model") : -1;
    if ((unsigned)p >= DT_STRATEGY_PRESET_COUNT || (unsigned)role >= DT_PARAM_ROLE_COUNT ||
        batch < 0 || model < 0 || rank < 0 || rank > DT_MAX_RANK || (rank && !shape))
        return dt__fail(DT_ERR_ARG,
                        "dt_strategy_preset_parameter_layout: preset %d, role %d, rank %d on a "
                        "mesh %s axes \"batch\" and \"model\"",
                        (int)p, (int)role, rank, m ? "without both" : "NULL, not one with");
    /* the axis split over "model" by the role (none: -1) */
    int split = role == DT_PARAM_COLUMN ? 1
                : role == DT_PARAM_COLUMN_BIAS || role == DT_PARAM_ROW || role == DT_PARAM_VOCAB
                    ? 0
                    : -1;
    bool tensor = p == DT_STRATEGY_PRESET_TENSOR_PARALLEL ||
                  p == DT_STRATEGY_PRESET_FULLY_SHARDED_TENSOR_PARALLEL;
    if (!tensor || split >= rank)
        split = -1;
    dt_layout u;
    DT_TRY(dt_layout_replicated(m, rank, &u));
    if (split >= 0)
        u.axes[split] = model;
    dt_layout s = u;
    if (p == DT_STRATEGY_PRESET_FULLY_SHARDED ||
        p == DT_STRATEGY_PRESET_FULLY_SHARDED_TENSOR_PARALLEL)
        for (int i = 0; i < rank; i++)
            if (s.axes[i] == DT_UNSHARDED && shape[i] >= dt_mesh_axis_size(m, batch)) {
                s.axes[i] = batch;
                break;
            }
    if (stored)
        *stored = s;
    if (used)
        *used = u;
    return DT_OK;
}

dt_status dt_strategy_preset_sequence_layout(const dt_mesh *m, int rank, dt_layout *out)
{
    int batch = m ? dt_mesh_axis_index(m, "batch") : -1;
    int model = m ? dt_mesh_axis_index(m, "model") : -1;
    if (!out || batch < 0 || model < 0 || rank < 2 || rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_ARG,
                        "dt_strategy_preset_sequence_layout: rank %d (at least 2) on a mesh with "
                        "axes \"batch\" and \"model\"",
                        rank);
    DT_TRY(dt_layout_replicated(m, rank, out));
    out->axes[0] = batch;
    out->axes[1] = model;
    return DT_OK;
}
