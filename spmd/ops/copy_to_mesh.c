/* copy_to_mesh: the same global tensor on another mesh.
 * - Same device type, over the same devices or others (a one-device mesh and a mesh over
 *   every device): partial terms are summed on the source mesh, then a block exchange moves to
 *   each device exactly the elements of its target shard it lacks (never the whole tensor;
 *   between different device sets it runs over every device, those in neither mesh sending
 *   and receiving nothing), and partial terms are marked when the target is partial.
 * - CPU <-> CUDA (as TF DTensor copies between host and device meshes): the meshes must have
 *   the same axes and the same number of devices on every client; the tensor is relaid out on
 *   the source mesh to the target's sharding, then each device's shard moves to the device at
 *   the same coordinates of the other mesh (through the pinned staging of the CUDA backend). */
#include "../engine.h"

#include <string.h>

/* Same axes, and every client owns the same number of devices of both meshes. */
static bool same_shape(const dt_mesh *a, const dt_mesh *b)
{
    if (a->num_axes != b->num_axes || a->num_clients != b->num_clients)
        return false;
    for (int i = 0; i < a->num_axes; i++)
        if (a->sizes[i] != b->sizes[i] || strcmp(a->names[i], b->names[i]) != 0)
            return false;
    for (int c = 0; c <= a->num_clients; c++)
        if (a->client_first[c] != b->client_first[c])
            return false;
    return true;
}

static dt_status across_types(dt__program *p, const dt__dist *x, const dt_layout *want,
                              dt__dist *out)
{
    const dt_mesh *src = x->layout.mesh, *dst = want->mesh;
    if (!same_shape(src, dst)) {
        char a[DT_STRING_MAX], b[DT_STRING_MAX];
        dt_mesh_format(src, a, sizeof a);
        dt_mesh_format(dst, b, sizeof b);
        return dt__fail(DT_ERR_MESH,
                        "copy_to_mesh: %s and %s have different device types, so they need the "
                        "same axes and the same devices per client (each device's shard moves to "
                        "the device at its coordinates)",
                        a, b);
    }
    dt__dist x0, y, z;
    DT_TRY(dt__resolve_partial(p, "copy_to_mesh", x, &x0));
    dt_layout on_src = *want, target = *want;
    on_src.mesh = src;
    on_src.partial = target.partial = 0;
    DT_TRY(dt__relayout_emit(p, "copy_to_mesh", &x0, &on_src, &y));
    DT_TRY(dt__emit_transfer(p, "copy_to_mesh", &y, &target, &z));
    return dt__relayout_emit(p, "copy_to_mesh", &z, want, out);
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)n;
    const dt__dist *x = &in[0];
    const dt_mesh *src = x->layout.mesh, *dst = want->mesh;
    if (src->type != dst->type)
        return across_types(p, x, want, out);
    /* terms summed on the source mesh (a partial operand keeps its shards), then every device
     * receives the blocks of its target shard it does not hold (no device holds the global
     * tensor), then the target's partial axes are marked */
    dt__dist x0, y;
    DT_TRY(dt__resolve_partial(p, "copy_to_mesh", x, &x0));
    dt_layout target = *want;
    target.partial = 0;
    int64_t zero[DT_MAX_RANK] = {0};
    DT_TRY(dt__emit_exchange(p, "copy_to_mesh", &x0, &target, x->rank, x->shape, zero, &y));
    return dt__relayout_emit(p, "copy_to_mesh", &y, want, out);
}

static dt_status vjp(dt__tape *a, const dt__node *n, dt_tensor *const x[], dt_tensor *y,
                     dt_tensor *dy, dt_tensor *dx[])
{
    (void)n;
    (void)y;
    /* back to the operand's mesh, replicated (its layout there may be free) */
    dt_layout l;
    DT_TRY(dt_layout_replicated(x[0]->mesh, x[0]->rank, &l));
    return dt__tape_keep(a, dt_copy_to_mesh(dy, &l, NULL, &dx[0]), &dx[0]);
}

const dt__op_def dt__op_copy_to_mesh = {.name = "copy_to_mesh",
                                        .min_inputs = 1,
                                        .max_inputs = 1,
                                        .infer = dt__infer_same_tensor,
                                        .expand = expand,
                                        .vjp = vjp};

dt_status dt_copy_to_mesh(const dt_tensor *x, const dt_layout *layout, const dt_op_options *opts,
                          dt_tensor **out)
{
    return dt__call_to_layout(DT__OP_COPY_TO_MESH, "copy_to_mesh", x, layout, opts, out);
}
