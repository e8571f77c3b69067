/* copy_to_mesh: the same global tensor on another mesh over the same devices. The source is
 * made replicated on its mesh (all-gather / all-reduce), then each device slices its shard of
 * the target layout locally (and marks partial terms when the target is partial). */
#include "../engine.h"

#include <string.h>

static dt_status infer(const dt__node *n, const dt__val *const in[], dt__val *out)
{
    (void)n;
    out->dtype = in[0]->dtype;
    out->rank = in[0]->rank;
    memcpy(out->shape, in[0]->shape, sizeof out->shape);
    return DT_OK;
}

static dt_status expand(dt__program *p, const dt__node *n, const dt__dist in[],
                        const dt_layout *want, dt__dist *out)
{
    (void)n;
    const dt__dist *x = &in[0];
    const dt_mesh *src = x->layout.mesh, *dst = want->mesh;
    if (src->type != dst->type || src->size != dst->size) {
        char a[DT_STRING_MAX], b[DT_STRING_MAX];
        dt_mesh_format(src, a, sizeof a);
        dt_mesh_format(dst, b, sizeof b);
        return dt__fail(DT_ERR_MESH, "copy_to_mesh: %s and %s are not over the same devices", a, b);
    }
    dt__dist full, y;
    dt_layout rep = dt__layout_none(src, x->rank);
    DT_TRY(dt__relayout_emit(p, "copy_to_mesh", x, &rep, &full));
    dt_layout target = *want;
    target.partial = 0;
    int64_t zero[DT_MAX_RANK] = {0};
    DT_TRY(dt__emit_local_slice(p, "copy_to_mesh", &full, &target, x->rank, x->shape, zero, &y));
    return dt__relayout_emit(p, "copy_to_mesh", &y, want, out);
}

const dt__op_def dt__op_copy_to_mesh = {
    .name = "copy_to_mesh", .min_inputs = 1, .max_inputs = 1, .infer = infer, .expand = expand};

dt_status dt_copy_to_mesh(const dt_tensor *x, const dt_layout *layout, const dt_op_options *opts,
                          dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!layout)
        return dt__fail(DT_ERR_ARG, "copy_to_mesh: layout is NULL");
    dt_op_options o = {0};
    if (opts)
        o = *opts;
    o.layout = layout;
    dt__attrs a;
    memset(&a, 0, sizeof a);
    const dt_tensor *in[1] = {x};
    return dt__call(DT__OP_COPY_TO_MESH, &a, 1, in, &o, out);
}
