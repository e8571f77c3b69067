/* Layout algebra: which mesh axis splits each tensor axis, partial axes, uneven shards. */
#include "dt.h"

#include <ctype.h>
#include <string.h>

int64_t dt_shard_size(int64_t n, int s, int i)
{
    if (s < 1 || i < 0 || i >= s || n < 0)
        return 0;
    return n / s + (i < n % s);
}

int64_t dt_shard_offset(int64_t n, int s, int i)
{
    if (s < 1 || i < 0 || i >= s || n < 0)
        return 0;
    int64_t r = n % s;
    return i * (n / s) + (i < r ? i : r);
}

static dt_layout empty_layout(void)
{
    dt_layout l = {.mesh = NULL, .rank = 0, .partial = 0, .partial_op = DT_REDUCE_SUM};
    for (int i = 0; i < DT_MAX_RANK; i++)
        l.axes[i] = DT_UNSHARDED;
    return l;
}

static bool partial_op_valid(dt_reduce_op op)
{
    return op == DT_REDUCE_SUM || op == DT_REDUCE_MAX || op == DT_REDUCE_MIN ||
           op == DT_REDUCE_PROD;
}

dt_status dt_layout_check(const dt_layout *l)
{
    if (!l || !l->mesh)
        return dt__fail(DT_ERR_LAYOUT, "layout: %s is NULL", l ? "mesh" : "layout");
    const dt_mesh *m = l->mesh;
    if (l->rank < 0 || l->rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_LAYOUT, "layout: rank %d outside 0..%d", l->rank, DT_MAX_RANK);
    unsigned used = 0;
    for (int i = 0; i < l->rank; i++) {
        int a = l->axes[i];
        if (a == DT_UNSHARDED)
            continue;
        if (a < 0 || a >= m->num_axes)
            return dt__fail(DT_ERR_LAYOUT,
                            "layout: tensor axis %d names mesh axis %d, the mesh has %d axes", i, a,
                            m->num_axes);
        if (used & (1u << a))
            return dt__fail(DT_ERR_LAYOUT,
                            "layout: mesh axis \"%s\" shards more than one tensor axis (axis %d "
                            "again)",
                            m->names[a], i);
        used |= 1u << a;
    }
    if (l->partial >> m->num_axes)
        return dt__fail(DT_ERR_LAYOUT, "layout: partial mask 0x%x names axes beyond the mesh's %d",
                        l->partial, m->num_axes);
    if (l->partial & used)
        for (int a = 0; a < m->num_axes; a++)
            if (l->partial & used & (1u << a))
                return dt__fail(DT_ERR_LAYOUT,
                                "layout: mesh axis \"%s\" is both sharding and partial",
                                m->names[a]);
    if (l->partial && !partial_op_valid(l->partial_op))
        return dt__fail(DT_ERR_LAYOUT,
                        "layout: partial reduction \"%s\" is not sum, max, min or "
                        "prod",
                        dt_reduce_op_name(l->partial_op));
    return DT_OK;
}

dt_status dt_layout_create(const dt_mesh *m, int rank, const char *const specs[], dt_layout *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_layout_create: out is NULL");
    *out = empty_layout();
    if (!m)
        return dt__fail(DT_ERR_LAYOUT, "dt_layout_create: mesh is NULL");
    if (rank < 0 || rank > DT_MAX_RANK)
        return dt__fail(DT_ERR_LAYOUT, "dt_layout_create: rank %d outside 0..%d", rank,
                        DT_MAX_RANK);
    if (rank > 0 && !specs)
        return dt__fail(DT_ERR_ARG, "dt_layout_create: specs is NULL for rank %d", rank);
    dt_layout l = empty_layout();
    l.mesh = m;
    l.rank = rank;
    for (int i = 0; i < rank; i++) {
        if (!specs[i])
            return dt__fail(DT_ERR_LAYOUT, "dt_layout_create: spec of tensor axis %d is NULL", i);
        if (strcmp(specs[i], DT_UNSHARDED_NAME) == 0)
            continue;
        l.axes[i] = dt_mesh_axis_index(m, specs[i]);
        if (l.axes[i] < 0) {
            char mb[DT_STRING_MAX];
            dt_mesh_format(m, mb, sizeof mb);
            return dt__fail(DT_ERR_LAYOUT,
                            "layout: tensor axis %d names mesh axis \"%s\", which %s does not "
                            "have",
                            i, specs[i], mb);
        }
    }
    DT_TRY(dt_layout_check(&l));
    *out = l;
    return DT_OK;
}

/* Parse "y+z" into a mask of mesh axes. */
static dt_status parse_axis_set(const dt_mesh *m, char *s, unsigned *mask)
{
    *mask = 0;
    char *save = NULL;
    for (char *tok = strtok_r(s, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
        int a = dt_mesh_axis_index(m, tok);
        if (a < 0)
            return dt__fail(DT_ERR_LAYOUT, "layout: partial axis \"%s\" is not a mesh axis", tok);
        if (*mask & (1u << a))
            return dt__fail(DT_ERR_LAYOUT, "layout: partial axis \"%s\" named twice", tok);
        *mask |= 1u << a;
    }
    if (!*mask)
        return dt__fail(DT_ERR_LAYOUT, "layout: partial names no mesh axis");
    return DT_OK;
}

/* Remove blanks in place so "x, unsharded" and "x,unsharded" read the same. */
static void strip_blanks(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++)
        if (!isspace((unsigned char)*r))
            *w++ = *r;
    *w = '\0';
}

dt_status dt_layout_parse(const dt_mesh *m, const char *text, dt_layout *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_layout_parse: out is NULL");
    *out = empty_layout();
    if (!m || !text)
        return dt__fail(DT_ERR_LAYOUT, "dt_layout_parse: %s is NULL", m ? "text" : "mesh");
    char buf[DT_STRING_MAX];
    if (strlen(text) >= sizeof buf)
        return dt__fail(DT_ERR_LAYOUT, "dt_layout_parse: text of %zu characters is too long",
                        strlen(text));
    strcpy(buf, text);
    strip_blanks(buf);
    unsigned partial = 0;
    dt_reduce_op op = DT_REDUCE_SUM;
    char *semi = strchr(buf, ';');
    if (semi) {
        *semi = '\0';
        char *p = semi + 1, *eq = strchr(p, '=');
        if (!eq || strncmp(p, "partial_", 8) != 0)
            return dt__fail(DT_ERR_LAYOUT,
                            "dt_layout_parse: \"%s\": expected \";partial_<op>=axis[+axis]\" "
                            "after ';'",
                            text);
        *eq = '\0';
        const char *opname = p + 8;
        int found = -1;
        for (int o = 0; o < DT_REDUCE_COUNT; o++)
            if (strcmp(opname, dt_reduce_op_name((dt_reduce_op)o)) == 0)
                found = o;
        if (found < 0 || !partial_op_valid((dt_reduce_op)found))
            return dt__fail(DT_ERR_LAYOUT,
                            "dt_layout_parse: \"%s\": partial reduction \"%s\" is not sum, max, "
                            "min or prod",
                            text, opname);
        op = (dt_reduce_op)found;
        DT_TRY(parse_axis_set(m, eq + 1, &partial));
    }
    const char *specs[DT_MAX_RANK];
    int rank = 0;
    if (buf[0]) {
        char *p = buf;
        for (;;) {
            if (rank == DT_MAX_RANK) {
                int axes = 1;
                for (const char *c = text; *c && *c != ';'; c++)
                    axes += *c == ',';
                return dt__fail(DT_ERR_LAYOUT, "dt_layout_parse: \"%s\" has %d axes, at most %d",
                                text, axes, DT_MAX_RANK);
            }
            char *comma = strchr(p, ',');
            if (comma)
                *comma = '\0';
            if (!*p)
                return dt__fail(DT_ERR_LAYOUT, "dt_layout_parse: \"%s\": tensor axis %d is empty",
                                text, rank);
            specs[rank++] = p;
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    dt_layout l;
    DT_TRY(dt_layout_create(m, rank, specs, &l));
    l.partial = partial;
    l.partial_op = op;
    DT_TRY(dt_layout_check(&l));
    *out = l;
    return DT_OK;
}

dt_status dt_layout_replicated(const dt_mesh *m, int rank, dt_layout *out)
{
    const char *specs[DT_MAX_RANK];
    for (int i = 0; i < DT_MAX_RANK; i++)
        specs[i] = DT_UNSHARDED_NAME;
    return dt_layout_create(m, rank, specs, out);
}

static dt_status sharded_at(const dt_mesh *m, const char *axis, int rank, int at, const char *fn,
                            dt_layout *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = empty_layout();
    if (rank < 1)
        return dt__fail(DT_ERR_LAYOUT, "%s: rank %d has no axis to shard", fn, rank);
    const char *specs[DT_MAX_RANK];
    for (int i = 0; i < DT_MAX_RANK; i++)
        specs[i] = DT_UNSHARDED_NAME;
    specs[at < 0 ? (rank - 1 < DT_MAX_RANK ? rank - 1 : 0) : at] = axis;
    return dt_layout_create(m, rank, specs, out);
}

dt_status dt_layout_batch_sharded(const dt_mesh *m, const char *axis, int rank, dt_layout *out)
{
    return sharded_at(m, axis, rank, 0, "dt_layout_batch_sharded", out);
}

dt_status dt_layout_inner_sharded(const dt_mesh *m, const char *axis, int rank, dt_layout *out)
{
    return sharded_at(m, axis, rank, -1, "dt_layout_inner_sharded", out);
}

dt_status dt_layout_to_string(const dt_layout *l, char *buf, size_t size)
{
    DT_TRY(dt_layout_check(l));
    if (!buf)
        return dt__fail(DT_ERR_ARG, "dt_layout_to_string: buf is NULL");
    /* A rank-0 layout without partial axes writes nothing below: it is "". */
    if (size)
        buf[0] = '\0';
    size_t n = 0;
    for (int i = 0; i < l->rank; i++)
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s", i ? "," : "",
                              l->axes[i] == DT_UNSHARDED ? DT_UNSHARDED_NAME
                                                         : l->mesh->names[l->axes[i]]);
    if (l->partial) {
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0,
                              ";partial_%s=", dt_reduce_op_name(l->partial_op));
        const char *sep = "";
        for (int a = 0; a < l->mesh->num_axes; a++)
            if (l->partial & (1u << a)) {
                n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s", sep,
                                      l->mesh->names[a]);
                sep = "+";
            }
    }
    if (n >= size)
        return dt__fail(DT_ERR_ARG, "dt_layout_to_string: needs %zu bytes, buffer has %zu", n + 1,
                        size);
    return DT_OK;
}

int dt_layout_equal(const dt_layout *a, const dt_layout *b)
{
    if (!a || !b || a->mesh != b->mesh || a->rank != b->rank || a->partial != b->partial)
        return 0;
    if (a->partial && a->partial_op != b->partial_op)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->axes[i] != b->axes[i])
            return 0;
    return 1;
}

int dt_layout_is_replicated(const dt_layout *l)
{
    if (!l || l->partial)
        return 0;
    for (int i = 0; i < l->rank; i++)
        if (l->axes[i] != DT_UNSHARDED)
            return 0;
    return 1;
}

int dt_layout_num_shards(const dt_layout *l, int axis)
{
    /* a hand-built layout naming a mesh axis the mesh lacks counts as unsharded here (the
     * layout checks reject it wherever a layout enters an op) */
    if (!l || !l->mesh || axis < 0 || axis >= l->rank || l->axes[axis] < 0 ||
        l->axes[axis] >= l->mesh->num_axes)
        return 1;
    return l->mesh->sizes[l->axes[axis]];
}

int dt__layout_shard_index(const dt_layout *l, int axis, int device)
{
    int a = l->axes[axis];
    if (a == DT_UNSHARDED)
        return 0;
    return device / l->mesh->strides[a] % l->mesh->sizes[a];
}

dt_status dt_layout_local_shape(const dt_layout *l, const int64_t global_shape[], int device,
                                int64_t local_shape[], int64_t offset[])
{
    DT_TRY(dt_layout_check(l));
    if (device < 0 || device >= l->mesh->size)
        return dt__fail(DT_ERR_ARG, "dt_layout_local_shape: device %d is outside the mesh's 0..%d",
                        device, l->mesh->size - 1);
    if (l->rank && (!global_shape || !local_shape))
        return dt__fail(DT_ERR_ARG, "dt_layout_local_shape: NULL shape");
    for (int i = 0; i < l->rank; i++) {
        if (global_shape[i] < 0)
            return dt__fail(DT_ERR_SHAPE, "dt_layout_local_shape: extent %lld of axis %d",
                            (long long)global_shape[i], i);
        int s = dt_layout_num_shards(l, i), k = dt__layout_shard_index(l, i, device);
        local_shape[i] = dt_shard_size(global_shape[i], s, k);
        if (offset)
            offset[i] = dt_shard_offset(global_shape[i], s, k);
    }
    return DT_OK;
}
