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
