/* Optimizers (Keras semantics): elementwise ops, every result requested in the variable's
 * fixed layout, so the update runs where the variable's shards live and moves no data. Slots
 * (momentum, Adam's moments, RMSprop's mean square) are kept per variable, in its layout. Each
 * optimizer with slots traces its update once per variable (inputs the variable, the gradient,
 * the slots and, for Adam(W), the step's -lr_t; outputs the new value and slots) so that
 * elementwise fusion (spmd/fuse.c) runs it as one kernel: one pass that reads w, g and the
 * slots and writes the new value and slots (the new slots are results the new value's chain
 * reads, stored in the same pass), bitwise the values of the eager ops (Adam 17 of them, AdamW
 * 19). SGD without momentum runs its one axpby eagerly. The new value becomes the variable's
 * (no copy); -lr_t is filled once per mesh and dtype per apply.
 *
 * Gradient clipping (Keras's clipvalue, clipnorm, global_clipnorm) is part of each variable's
 * traced update, so it fuses into the same pass and no clipped gradient is ever stored:
 * clipvalue is a min and a max of g, clipnorm a scale computed in the update from g's own sum
 * of squares (one more read of g), global_clipnorm a scale read as one more rank-0 input. That
 * scale comes from one traced function over every gradient of the apply (cached per list of
 * variables): per gradient a square and a local sum per shard (rows along a whole last axis
 * first, see sum_squares; the rank-0 sums all-reduced in one bucketed collective), their
 * total, its square root (the global norm) and c / max(norm, c). */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef dt__opt_slot slot;

const char *dt__optimizer_kind_name(dt_optimizer_kind k)
{
    static const char *const names[] = {
#define KIND_NAME(NAME, name) [DT_OPTIMIZER_##NAME] = #name,
        DT_OPTIMIZER_LIST(KIND_NAME)
#undef KIND_NAME
    };
    return (unsigned)k < DT_OPTIMIZER_COUNT ? names[k] : "?";
}

int64_t dt_optimizer_iterations(const dt_optimizer *o)
{
    return o ? o->iterations : 0;
}

/* Slots per variable: m and v (Adam's moments; RMSprop's mean square and, with momentum, its
 * momentum); SGD's m is its momentum. */
int dt__optimizer_slot_count(const dt_optimizer *o)
{
    switch (o->cfg.kind) {
    case DT_OPTIMIZER_SGD:
        return o->cfg.momentum > 0 ? 1 : 0;
    case DT_OPTIMIZER_RMSPROP:
        return o->cfg.momentum > 0 ? 2 : 1;
    default:
        return 2;
    }
}

dt_status dt__optimizer_set_slot(dt_optimizer *o, const dt_variable *v, dt_tensor *m, dt_tensor *w)
{
    for (int i = 0; i < o->nslots; i++)
        if (o->slots[i].var == v) {
            dt_tensor_free(o->slots[i].m);
            dt_tensor_free(o->slots[i].v);
            o->slots[i].m = m;
            o->slots[i].v = w;
            return DT_OK;
        }
    slot *n = realloc(o->slots, sizeof *n * (size_t)(o->nslots + 1));
    if (!n)
        return dt__fail(DT_ERR_NOMEM, "optimizer: out of memory for %d slots", o->nslots + 1);
    o->slots = n;
    o->slots[o->nslots++] = (slot){.var = v, .m = m, .v = w};
    return DT_OK;
}

dt_status dt_optimizer_create(const dt_optimizer_config *cfg, dt_optimizer **out)
{
    DT__SERIAL();
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_optimizer_create: out is NULL");
    *out = NULL;
    if (!cfg || (unsigned)cfg->kind >= DT_OPTIMIZER_COUNT || !(cfg->learning_rate > 0) ||
        cfg->momentum < 0 || cfg->momentum >= 1 || !(cfg->weight_decay >= 0) ||
        !(cfg->rho >= 0 && cfg->rho < 1))
        return dt__fail(DT_ERR_ARG,
                        "dt_optimizer_create: kind %d, learning rate %g, momentum %g, weight decay "
                        "%g, rho %g: expected a kind in 0..%d, a positive rate, momentum and rho "
                        "in [0, 1) and a weight decay of at least 0",
                        cfg ? (int)cfg->kind : -1, cfg ? cfg->learning_rate : 0.0,
                        cfg ? cfg->momentum : 0.0, cfg ? cfg->weight_decay : 0.0,
                        cfg ? cfg->rho : 0.0, DT_OPTIMIZER_COUNT - 1);
    const struct {
        const char *name;
        double v;
    } clips[] = {{"clipnorm", cfg->clipnorm},
                 {"global_clipnorm", cfg->global_clipnorm},
                 {"clipvalue", cfg->clipvalue}};
    for (size_t i = 0; i < sizeof clips / sizeof *clips; i++)
        if (!(clips[i].v >= 0))
            return dt__fail(DT_ERR_ARG, "dt_optimizer_create: %s %g: expected >= 0 (0: off)",
                            clips[i].name, clips[i].v);
    if (cfg->clipnorm > 0 && cfg->global_clipnorm > 0)
        return dt__fail(DT_ERR_ARG,
                        "dt_optimizer_create: clipnorm %g and global_clipnorm %g: only one of "
                        "them can be set",
                        cfg->clipnorm, cfg->global_clipnorm);
    if (cfg->clipvalue > 0 && (cfg->clipnorm > 0 || cfg->global_clipnorm > 0))
        return dt__fail(DT_ERR_ARG,
                        "dt_optimizer_create: clipvalue %g with clipnorm %g or global_clipnorm "
                        "%g: Keras would clip by the norm alone; set one of them",
                        cfg->clipvalue, cfg->clipnorm, cfg->global_clipnorm);
    dt_optimizer *o = calloc(1, sizeof *o);
    if (!o)
        return dt__fail(DT_ERR_NOMEM, "dt_optimizer_create: out of memory");
    o->cfg = *cfg;
    if (o->cfg.beta_1 == 0)
        o->cfg.beta_1 = 0.9;
    if (o->cfg.beta_2 == 0)
        o->cfg.beta_2 = 0.999;
    if (o->cfg.epsilon == 0)
        o->cfg.epsilon = 1e-7;
    if (o->cfg.kind == DT_OPTIMIZER_ADAMW && o->cfg.weight_decay == 0)
        o->cfg.weight_decay = 0.004;
    if (o->cfg.rho == 0)
        o->cfg.rho = 0.9;
    *out = o;
    return DT_OK;
}

dt_status dt_optimizer_set_learning_rate(dt_optimizer *o, double learning_rate)
{
    if (!o || !(learning_rate > 0))
        return dt__fail(DT_ERR_ARG,
                        "dt_optimizer_set_learning_rate: learning rate %g (expected > 0), "
                        "optimizer %s",
                        learning_rate, o ? "given" : "NULL");
    DT__SERIAL();
    /* the traced updates hold the rate (SGD's and RMSprop's, AdamW's decay): traced again */
    if (learning_rate != o->cfg.learning_rate)
        for (int i = 0; i < o->nslots; i++) {
            dt_function_free(o->slots[i].update);
            o->slots[i].update = NULL;
        }
    o->cfg.learning_rate = learning_rate;
    return DT_OK;
}

void dt_optimizer_free(dt_optimizer *o)
{
    DT__SERIAL();
    if (!o)
        return;
    for (int i = 0; i < o->nslots; i++) {
        dt_tensor_free(o->slots[i].m);
        dt_tensor_free(o->slots[i].v);
        dt_function_free(o->slots[i].update);
    }
    free(o->slots);
    free(o->no_decay);
    dt_function_free(o->norm);
    free(o->norm_vars);
    free(o->scale_of);
    dt_tensor_free(o->global_norm);
    free(o);
}

const dt_tensor *dt_optimizer_last_global_norm(const dt_optimizer *o)
{
    return o ? o->global_norm : NULL;
}

static bool excluded(const dt_optimizer *o, const dt_variable *v)
{
    for (int i = 0; i < o->nno_decay; i++)
        if (o->no_decay[i] == v)
            return true;
    return false;
}

dt_status dt_optimizer_exclude_from_weight_decay(dt_optimizer *o, int n,
                                                 const dt_variable *const vars[])
{
    if (!o || n < 0 || (n && !vars))
        return dt__fail(DT_ERR_ARG,
                        "dt_optimizer_exclude_from_weight_decay: optimizer %s, %d variables at "
                        "%s",
                        o ? "given" : "NULL", n, vars ? "an array" : "NULL");
    for (int i = 0; i < n; i++)
        if (!vars[i])
            return dt__fail(DT_ERR_ARG,
                            "dt_optimizer_exclude_from_weight_decay: variable %d is NULL", i);
    DT__SERIAL();
    const dt_variable **nd = realloc(o->no_decay, sizeof *nd * (size_t)(o->nno_decay + n + 1));
    if (!nd)
        return dt__fail(DT_ERR_NOMEM, "dt_optimizer_exclude_from_weight_decay: out of memory");
    o->no_decay = nd;
    for (int i = 0; i < n; i++) {
        if (excluded(o, vars[i]))
            continue;
        o->no_decay[o->nno_decay++] = vars[i];
        /* its traced update decays: traced again without */
        for (int k = 0; k < o->nslots; k++)
            if (o->slots[k].var == vars[i]) {
                dt_function_free(o->slots[k].update);
                o->slots[k].update = NULL;
            }
    }
    return DT_OK;
}

/* out = a * x + b * y (y may be NULL: out = a * x), in layout l. */
static dt_status axpby(double a, const dt_tensor *x, double b, const dt_tensor *y,
                       const dt_layout *l, dt_tensor **out)
{
    *out = NULL;
    dt_layout sl;
    DT_TRY(dt_layout_replicated(l->mesh, 0, &sl));
    dt_op_options so = {.layout = &sl}, o = {.layout = l};
    int64_t none[1] = {1};
    dt_tensor *ca = NULL, *cb = NULL, *ax = NULL, *by = NULL;
    dt_status s = dt_fill(dt_tensor_dtype(x), 0, none, a, &so, &ca);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, x, ca, y ? NULL : &o, &ax);
    if (s == DT_OK && y) {
        s = dt_fill(dt_tensor_dtype(x), 0, none, b, &so, &cb);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MUL, y, cb, NULL, &by);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_ADD, ax, by, &o, out);
    } else if (s == DT_OK) {
        *out = ax;
        ax = NULL;
    }
    dt_tensor_free(ca);
    dt_tensor_free(cb);
    dt_tensor_free(ax);
    dt_tensor_free(by);
    return s;
}

static dt_status slot_of(dt_optimizer *o, const dt_variable *v, slot **out)
{
    for (int i = 0; i < o->nslots; i++)
        if (o->slots[i].var == v) {
            *out = &o->slots[i];
            return DT_OK;
        }
    slot *n = realloc(o->slots, sizeof *n * (size_t)(o->nslots + 1));
    if (!n)
        return dt__fail(DT_ERR_NOMEM, "dt_optimizer_apply: out of memory");
    o->slots = n;
    slot *sl = &o->slots[o->nslots];
    memset(sl, 0, sizeof *sl);
    sl->var = v;
    const dt_tensor *w = dt_variable_value(v);
    dt_op_options lo = {.layout = dt_variable_layout(v)};
    DT_TRY(dt_zeros(w->dtype, w->rank, w->shape, &lo, &sl->m));
    if (dt__optimizer_slot_count(o) == 2) {
        dt_status s = dt_zeros(w->dtype, w->rank, w->shape, &lo, &sl->v);
        if (s != DT_OK) {
            dt_tensor_free(sl->m);
            return s;
        }
    }
    o->nslots++;
    *out = sl;
    return DT_OK;
}

static void replace(dt_tensor **slot_t, dt_tensor *next)
{
    dt_tensor_free(*slot_t);
    *slot_t = next;
}

/* Adam(W)'s update of w with gradient g, moments m and v, and nlr = -lr_t (rank 0): the new
 * value and moments. AdamW first decays w (by lr, not lr_t; unless w is excluded), then: m = b1 m +
 * (1 - b1) g; v = b2 v + (1 - b2) g^2; w + (m / (sqrt v + eps)) (-lr_t), the products and sums
 * rounded as axpby's (w times 1 is w exactly, so not computed). */
static dt_status adam_ops(const dt_optimizer_config *c, bool decay, const dt_tensor *w,
                          const dt_tensor *g, const dt_tensor *m, const dt_tensor *v,
                          const dt_tensor *nlr, const dt_layout *l, dt_tensor *out[3])
{
    dt_layout sl0;
    DT_TRY(dt_layout_replicated(l->mesh, 0, &sl0));
    dt_op_options so = {.layout = &sl0}, lo = {.layout = l};
    int64_t none[1] = {1};
    dt_tensor *decayed = NULL, *u = NULL, *t = NULL, *eps = NULL, *b = NULL;
    dt_status s = DT_OK;
    if (decay) {
        s = axpby(1.0 - c->learning_rate * c->weight_decay, w, 0, NULL, l, &decayed);
        w = decayed;
    }
    if (s == DT_OK)
        s = axpby(c->beta_1, m, 1.0 - c->beta_1, g, l, &out[1]);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, g, &lo, &u);
    if (s == DT_OK)
        s = axpby(c->beta_2, v, 1.0 - c->beta_2, u, l, &out[2]);
    dt_tensor_free(u);
    u = NULL;
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQRT, out[2], &lo, &u);
    if (s == DT_OK)
        s = dt_fill(w->dtype, 0, none, c->epsilon, &so, &eps);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, u, eps, &lo, &t);
    dt_tensor_free(u);
    u = NULL;
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_DIV, out[1], t, &lo, &u);
    /* w - lr_t u, -lr_t read from nlr */
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MUL, u, nlr, NULL, &b);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, w, b, &lo, &out[0]);
    dt_tensor *tmp[] = {decayed, u, t, eps, b};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
        dt_tensor_free(tmp[i]);
    return s;
}

/* SGD with momentum: m = momentum m - lr g; w + m, or nesterov w + momentum m - lr g. */
static dt_status sgd_ops(const dt_optimizer_config *c, const dt_tensor *w, const dt_tensor *g,
                         const dt_tensor *m, const dt_layout *l, dt_tensor *out[2])
{
    dt_status s = axpby(c->momentum, m, -c->learning_rate, g, l, &out[1]);
    if (s != DT_OK || !c->nesterov)
        return s == DT_OK ? axpby(1.0, w, 1.0, out[1], l, &out[0]) : s;
    dt_tensor *t = NULL;
    s = axpby(c->momentum, out[1], -c->learning_rate, g, l, &t);
    if (s == DT_OK)
        s = axpby(1.0, w, 1.0, t, l, &out[0]);
    dt_tensor_free(t);
    return s;
}

/* RMSprop: m = rho m + (1 - rho) g^2; d = lr g / sqrt(m + eps); with momentum (the slot v)
 * v = momentum v + d, the new value w - v, else w - d. */
static dt_status rmsprop_ops(const dt_optimizer_config *c, const dt_tensor *w, const dt_tensor *g,
                             const dt_tensor *m, const dt_tensor *v, const dt_layout *l,
                             dt_tensor *out[3])
{
    dt_layout l0;
    DT_TRY(dt_layout_replicated(l->mesh, 0, &l0));
    dt_op_options so = {.layout = &l0}, lo = {.layout = l};
    int64_t none[1] = {1};
    dt_tensor *sq = NULL, *t = NULL, *eps = NULL, *d = NULL;
    dt_status s = dt_unary(DT_UNARY_SQUARE, g, &lo, &sq);
    if (s == DT_OK)
        s = axpby(c->rho, m, 1.0 - c->rho, sq, l, &out[1]);
    if (s == DT_OK)
        s = dt_fill(w->dtype, 0, none, c->epsilon, &so, &eps);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, out[1], eps, &lo, &t);
    dt_tensor_free(sq);
    sq = NULL;
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQRT, t, &lo, &sq);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_DIV, g, sq, &lo, &d);
    if (s == DT_OK && c->momentum > 0) {
        s = axpby(c->momentum, v, c->learning_rate, d, l, &out[2]);
        if (s == DT_OK)
            s = axpby(1.0, w, -1.0, out[2], l, &out[0]);
    } else if (s == DT_OK) {
        s = axpby(1.0, w, -c->learning_rate, d, l, &out[0]);
    }
    dt_tensor_free(sq);
    dt_tensor_free(t);
    dt_tensor_free(eps);
    dt_tensor_free(d);
    return s;
}

/* The sum of squares of g's elements: rank 0, replicated on g's mesh; in f32 for 16-bit floats
 * (cast in the same pass), else in g's dtype. When g has rank 2 or more and its last axis is
 * whole on every device, each row along the last axis is summed first (in order), then the
 * rows' sums: the rows split over a device's threads, where one running value over every
 * element would keep a single thread adding one element at a time. */
static dt_status sum_squares(const dt_tensor *g, dt_tensor **out)
{
    dt_layout l0;
    DT_TRY(dt_layout_replicated(g->layout.mesh, 0, &l0));
    dt_tensor *wide = NULL, *sq = NULL, *rows = NULL;
    dt_status s = DT_OK;
    if (g->dtype == DT_DTYPE_BF16 || g->dtype == DT_DTYPE_F16)
        s = dt_cast(g, DT_DTYPE_F32, &(dt_op_options){.layout = &g->layout}, &wide);
    if (s == DT_OK)
        s = dt_unary(DT_UNARY_SQUARE, wide ? wide : g, NULL, &sq);
    if (s == DT_OK && g->rank >= 2 && g->layout.axes[g->rank - 1] == DT_UNSHARDED &&
        !g->layout.partial)
        s = dt_reduce(DT_REDUCE_SUM, sq, 1, (int[]){-1}, 0, NULL, &rows);
    if (s == DT_OK)
        s = dt_reduce(DT_REDUCE_SUM, rows ? rows : sq, 0, NULL, 0, &(dt_op_options){.layout = &l0},
                      out);
    dt_tensor_free(wide);
    dt_tensor_free(sq);
    dt_tensor_free(rows);
    return s;
}

/* From a sum of squares ss (rank 0, replicated): c / max(sqrt(ss), c) + (sqrt(ss) - sqrt(ss))
 * (the last term NaN for a non-finite norm, as tf.clip_by_global_norm's), in dtype; *norm
 * (may be NULL) gets sqrt(ss). */
static dt_status norm_scale(const dt_tensor *ss, double c, dt_dtype dtype, dt_tensor **norm,
                            dt_tensor **out)
{
    dt_layout l0;
    DT_TRY(dt_layout_replicated(ss->layout.mesh, 0, &l0));
    dt_op_options so = {.layout = &l0};
    int64_t none[1] = {1};
    dt_tensor *t[6] = {0};
    dt_status s = dt_unary(DT_UNARY_SQRT, ss, &so, &t[0]);
    if (s == DT_OK)
        s = dt_fill(ss->dtype, 0, none, c, &so, &t[1]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_MAX, t[0], t[1], &so, &t[2]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_DIV, t[1], t[2], &so, &t[3]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_SUB, t[0], t[0], &so, &t[4]);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, t[3], t[4], &so, &t[5]);
    if (s == DT_OK && dtype != ss->dtype)
        s = dt_cast(t[5], dtype, &so, out);
    else if (s == DT_OK) {
        *out = t[5];
        t[5] = NULL;
    }
    if (s == DT_OK && norm) {
        *norm = t[0];
        t[0] = NULL;
    }
    for (int i = 0; i < 6; i++)
        dt_tensor_free(t[i]);
    return s;
}

/* The gradient the rule reads, in layout l: g clipped to [-clipvalue, clipvalue], or scaled by
 * clipnorm / max(||g||, clipnorm), or by `scale` (global_clipnorm's, rank 0); *out NULL when
 * no clipping is set (the rule reads g). Traced into the update, or eager. */
static dt_status clip_ops(const dt_optimizer_config *c, const dt_tensor *g, const dt_tensor *scale,
                          const dt_layout *l, dt_tensor **out)
{
    *out = NULL;
    dt_op_options lo = {.layout = l};
    if (c->global_clipnorm > 0)
        return dt_binary(DT_BINARY_MUL, g, scale, &lo, out);
    dt_tensor *a = NULL, *b = NULL;
    dt_status s = DT_OK;
    if (c->clipnorm > 0) {
        s = sum_squares(g, &a);
        if (s == DT_OK)
            s = norm_scale(a, c->clipnorm, g->dtype, NULL, &b);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MUL, g, b, &lo, out);
    } else if (c->clipvalue > 0) {
        dt_layout l0;
        DT_TRY(dt_layout_replicated(l->mesh, 0, &l0));
        dt_op_options so = {.layout = &l0};
        int64_t none[1] = {1};
        dt_tensor *lo_v = NULL, *hi_v = NULL;
        s = dt_fill(g->dtype, 0, none, -c->clipvalue, &so, &lo_v);
        if (s == DT_OK)
            s = dt_fill(g->dtype, 0, none, c->clipvalue, &so, &hi_v);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MAX, g, lo_v, &lo, &a);
        if (s == DT_OK)
            s = dt_binary(DT_BINARY_MIN, a, hi_v, &lo, out);
        dt_tensor_free(lo_v);
        dt_tensor_free(hi_v);
    }
    dt_tensor_free(a);
    dt_tensor_free(b);
    return s;
}

/* The traced update of a variable with w's metadata, for the kinds with slots. Inputs: w, g,
 * its slots (m, then v where it has two), for Adam(W) the step's -lr_t (rank 0) and, under
 * global_clipnorm, the gradients' scale (rank 0); outputs: the new value and the new slots. */
static dt_status update_trace(const dt_optimizer *o, const dt_tensor *w, bool decay,
                              dt_function **out)
{
    const dt_optimizer_config *c = &o->cfg;
    const dt_layout *l = &w->layout;
    int ns = dt__optimizer_slot_count(o);
    bool adam = c->kind == DT_OPTIMIZER_ADAM || c->kind == DT_OPTIMIZER_ADAMW;
    dt_layout sl0;
    DT_TRY(dt_layout_replicated(l->mesh, 0, &sl0));
    dt_function *f = NULL;
    /* in: w, g, m, v, -lr_t, the scale; gc: g clipped */
    dt_tensor *in[6] = {0}, *res[3] = {0}, *gc = NULL;
    DT_TRY(dt_function_begin(&f));
    dt_status s = DT_OK;
    for (int i = 0; i < 2 + ns && s == DT_OK; i++)
        s = dt_function_input(f, l, w->dtype, w->rank, w->shape, &in[i]);
    if (s == DT_OK && adam)
        s = dt_function_input(f, &sl0, w->dtype, 0, NULL, &in[4]);
    if (s == DT_OK && c->global_clipnorm > 0)
        s = dt_function_input(f, &sl0, w->dtype, 0, NULL, &in[5]);
    if (s == DT_OK)
        s = clip_ops(c, in[1], in[5], l, &gc);
    const dt_tensor *g = gc ? gc : in[1];
    if (s == DT_OK && adam)
        s = adam_ops(c, decay, in[0], g, in[2], in[3], in[4], l, res);
    else if (s == DT_OK && c->kind == DT_OPTIMIZER_SGD)
        s = sgd_ops(c, in[0], g, in[2], l, res);
    else if (s == DT_OK)
        s = rmsprop_ops(c, in[0], g, in[2], in[3], l, res);
    if (s == DT_OK)
        s = dt_function_end(f, 1 + ns, res);
    dt_tensor_free(gc);
    for (int i = 0; i < 6; i++)
        dt_tensor_free(in[i]);
    for (int i = 0; i < 3; i++)
        dt_tensor_free(res[i]);
    if (s != DT_OK) {
        dt_function_free(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

/* -lr_t (rank 0, replicated) on w's mesh in w's dtype: *nlr kept while they match. */
static dt_status step_rate(const dt_tensor *w, double lr_t, dt_tensor **nlr)
{
    if (*nlr && (*nlr)->mesh == w->mesh && (*nlr)->dtype == w->dtype)
        return DT_OK;
    dt_tensor_free(*nlr);
    *nlr = NULL;
    dt_layout sl0;
    DT_TRY(dt_layout_replicated(w->layout.mesh, 0, &sl0));
    dt_op_options so = {.layout = &sl0};
    int64_t none[1] = {1};
    return dt_fill(w->dtype, 0, none, -lr_t, &so, nlr);
}

/* One variable: the new value into *next; *nlr holds Adam's -lr_t from one variable to the
 * next; scale is global_clipnorm's (else NULL). SGD without momentum (no slot) runs its one
 * axpby eagerly (after eager clipping); the others run their traced update and replace their
 * slots. */
static dt_status update_one(dt_optimizer *o, dt_variable *var, const dt_tensor *g,
                            const dt_tensor *scale, double lr_t, dt_tensor **nlr, dt_tensor **next)
{
    const dt_optimizer_config *c = &o->cfg;
    const dt_tensor *w = dt_variable_value(var);
    *next = NULL;
    if (c->kind == DT_OPTIMIZER_SGD && c->momentum == 0) {
        dt_tensor *gc = NULL;
        DT_TRY(clip_ops(c, g, scale, dt_variable_layout(var), &gc));
        dt_status s = axpby(1.0, w, -c->learning_rate, gc ? gc : g, dt_variable_layout(var), next);
        dt_tensor_free(gc);
        return s;
    }
    slot *sl = NULL;
    DT_TRY(slot_of(o, var, &sl));
    if (!sl->update)
        DT_TRY(update_trace(o, w, c->kind == DT_OPTIMIZER_ADAMW && !excluded(o, var), &sl->update));
    int ns = dt__optimizer_slot_count(o);
    bool adam = c->kind == DT_OPTIMIZER_ADAM || c->kind == DT_OPTIMIZER_ADAMW;
    if (adam)
        DT_TRY(step_rate(w, lr_t, nlr));
    dt_tensor *res[3] = {0};
    const dt_tensor *in[6] = {w, g, sl->m};
    int nin = 3;
    if (ns == 2)
        in[nin++] = sl->v;
    if (adam)
        in[nin++] = *nlr;
    if (scale)
        in[nin++] = scale;
    DT_TRY(dt_function_run(sl->update, nin, in, 1 + ns, res));
    *next = res[0];
    replace(&sl->m, res[1]);
    if (ns == 2)
        replace(&sl->v, res[2]);
    return DT_OK;
}

/* global_clipnorm's traced function for vars[0..n) (gradients of their metadata, on one
 * mesh): inputs the gradients; outputs the global norm (f32, f64 when a gradient is f64), then
 * the scale in each dtype the gradients have (o->scale_of[i]: gradient i's output). */
static dt_status norm_trace(dt_optimizer *o, int n, dt_variable *const vars[])
{
    dt_function_free(o->norm);
    o->norm = NULL;
    free(o->norm_vars);
    free(o->scale_of);
    o->norm_n = 0;
    o->norm_vars = malloc(sizeof *o->norm_vars * (size_t)n);
    o->scale_of = malloc(sizeof *o->scale_of * (size_t)n);
    dt_tensor **g = calloc((size_t)n, sizeof *g), *out[1 + DT_DTYPE_COUNT] = {0};
    if (!o->norm_vars || !o->scale_of || !g) {
        free(g);
        return dt__fail(DT_ERR_NOMEM, "dt_optimizer_apply: out of memory for %d norms", n);
    }
    dt_dtype acc = DT_DTYPE_F32, dtypes[DT_DTYPE_COUNT];
    int ndt = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor *w = dt_variable_value(vars[i]);
        o->norm_vars[i] = vars[i];
        acc = w->dtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : acc;
        int k = 0;
        while (k < ndt && dtypes[k] != w->dtype)
            k++;
        if (k == ndt)
            dtypes[ndt++] = w->dtype;
        o->scale_of[i] = 1 + k;
    }
    dt_function *f = NULL;
    dt_tensor *total = NULL, *ss = NULL, *t = NULL;
    dt_status s = dt_function_begin(&f);
    for (int i = 0; i < n && s == DT_OK; i++) {
        const dt_tensor *w = dt_variable_value(vars[i]);
        s = dt_function_input(f, &w->layout, w->dtype, w->rank, w->shape, &g[i]);
    }
    /* each gradient's local sum of squares, all-reduced as a rank-0 tensor: the expansion
     * buckets those all-reduces into one collective of n elements */
    for (int i = 0; i < n && s == DT_OK; i++) {
        s = sum_squares(g[i], &ss);
        if (s == DT_OK && ss->dtype != acc) {
            s = dt_cast(ss, acc, NULL, &t);
            dt_tensor_free(ss);
            ss = t;
            t = NULL;
        }
        if (s == DT_OK && total) {
            s = dt_binary(DT_BINARY_ADD, total, ss, NULL, &t);
            dt_tensor_free(total);
            dt_tensor_free(ss);
            total = t;
            t = NULL;
        } else if (s == DT_OK) {
            total = ss;
        }
        ss = NULL;
    }
    for (int k = 0; k < ndt && s == DT_OK; k++)
        s = norm_scale(total, o->cfg.global_clipnorm, dtypes[k], k ? NULL : &out[0], &out[1 + k]);
    if (s == DT_OK)
        s = dt_function_end(f, 1 + ndt, out);
    for (int i = 0; i < n; i++)
        dt_tensor_free(g[i]);
    free(g);
    dt_tensor_free(ss);
    dt_tensor_free(total);
    for (int k = 0; k < 1 + ndt; k++)
        dt_tensor_free(out[k]);
    if (s != DT_OK) {
        dt_function_free(f);
        return s;
    }
    o->norm = f;
    o->norm_n = n;
    return DT_OK;
}

/* Run global_clipnorm's function on grads: the norm into o->global_norm, the scales into
 * scales[] (1 + DT_DTYPE_COUNT, the first unused). */
static dt_status global_scales(dt_optimizer *o, int n, dt_variable *const vars[],
                               const dt_tensor *const grads[], dt_tensor *scales[])
{
    bool same = o->norm && o->norm_n == n;
    for (int i = 0; same && i < n; i++)
        same = o->norm_vars[i] == vars[i];
    if (!same)
        DT_TRY(norm_trace(o, n, vars));
    int nout = 0;
    for (int i = 0; i < n; i++)
        nout = o->scale_of[i] + 1 > nout ? o->scale_of[i] + 1 : nout;
    DT_TRY(dt_function_run(o->norm, n, grads, nout, scales));
    dt_tensor_free(o->global_norm);
    o->global_norm = scales[0];
    scales[0] = NULL;
    return DT_OK;
}

dt_status dt_optimizer_apply(dt_optimizer *o, int n, dt_variable *const vars[],
                             const dt_tensor *const grads[])
{
    DT__SERIAL();
    if (!o || n < 0 || (n && (!vars || !grads)))
        return dt__fail(DT_ERR_ARG, "dt_optimizer_apply: optimizer, variables or gradients NULL");
    /* metadata first: every client fails alike before any op runs */
    for (int i = 0; i < n; i++) {
        const dt_tensor *w = dt_variable_value(vars[i]), *g = grads[i];
        if (!w || !g)
            return dt__fail(DT_ERR_ARG, "dt_optimizer_apply: variable or gradient %d is NULL", i);
        bool same =
            g->dtype == w->dtype && g->rank == w->rank && dt_layout_equal(&g->layout, &w->layout);
        for (int a = 0; same && a < w->rank; a++)
            same = g->shape[a] == w->shape[a];
        if (!same) {
            char sa[DT__SHAPE_STR_MAX], sb[DT__SHAPE_STR_MAX], la[DT_STRING_MAX], lb[DT_STRING_MAX];
            return dt__fail(DT_ERR_ARG,
                            "dt_optimizer_apply: gradient %d is %s%s \"%s\", its variable %s%s "
                            "\"%s\"",
                            i, dt_dtype_name(g->dtype),
                            dt__shape_str(sa, sizeof sa, g->rank, g->shape),
                            dt__layout_str(&g->layout, la, sizeof la), dt_dtype_name(w->dtype),
                            dt__shape_str(sb, sizeof sb, w->rank, w->shape),
                            dt__layout_str(&w->layout, lb, sizeof lb));
        }
        if (o->cfg.global_clipnorm > 0 && w->mesh != dt_variable_value(vars[0])->mesh)
            return dt__fail(DT_ERR_ARG,
                            "dt_optimizer_apply: global_clipnorm %g: variables 0 and %d are on "
                            "different meshes (the global norm needs one)",
                            o->cfg.global_clipnorm, i);
    }
    dt_tensor *scales[1 + DT_DTYPE_COUNT] = {0};
    if (o->cfg.global_clipnorm > 0 && n > 0)
        DT_TRY(global_scales(o, n, vars, grads, scales));
    o->iterations++;
    double t = (double)o->iterations;
    double lr_t =
        o->cfg.learning_rate * sqrt(1.0 - pow(o->cfg.beta_2, t)) / (1.0 - pow(o->cfg.beta_1, t));
    /* each new value is a fresh tensor of the variable's metadata: it becomes the value */
    dt_tensor *nlr = NULL;
    dt_status s = DT_OK;
    for (int i = 0; i < n && s == DT_OK; i++) {
        dt_tensor *next;
        s = update_one(o, vars[i], grads[i],
                       o->cfg.global_clipnorm > 0 ? scales[o->scale_of[i]] : NULL, lr_t, &nlr,
                       &next);
        if (s == DT_OK)
            s = dt__variable_adopt(vars[i], next);
        if (s != DT_OK)
            dt_tensor_free(next);
    }
    dt_tensor_free(nlr);
    for (int k = 0; k < 1 + DT_DTYPE_COUNT; k++)
        dt_tensor_free(scales[k]);
    return s;
}
