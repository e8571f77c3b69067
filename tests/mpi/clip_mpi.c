/* Gradient clipping in the optimizers (Keras's clipvalue, clipnorm, global_clipnorm) and
 * AdamW's exclusion from weight decay, against a host reference in double written from Keras's
 * rules (tf.clip_by_value, tf.clip_by_norm, tf.clip_by_global_norm, then the optimizer's
 * update): two steps of three variables (7 x 5, 3 and 6 x 4, sharded unevenly, some shards
 * empty) on meshes over the first 1, 2, 3 and every global device, 1-D and, from 4 devices,
 * 2-D; the global norm read back against the host's; SGD with and without momentum (traced and
 * eager updates), RMSprop, AdamW with a variable excluded from the start and one excluded after
 * the first step; bf16 variables (the norm in f32). Bad configurations are refused with the
 * field and value named and nothing made; a global norm over two meshes is refused with the
 * variables untouched. Run at -n 1 with 8 devices, -n 2 with 2 each, -n 3 and -n 4 with 1. */
#include "dt.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NV = 3, MAXE = 35, STEPS = 2 };
static const int rank_of[NV] = {2, 1, 2};
static const int64_t shape_of[NV][2] = {{7, 5}, {3, 1}, {6, 4}};

static int elems(int v)
{
    return (int)(shape_of[v][0] * (rank_of[v] == 2 ? shape_of[v][1] : 1));
}

/* Initial values and each step's gradients: a fixed pseudo-random draw in [-1, 1]; the second
 * step's gradients are smaller (a tenth), so a clip that bites in step 1 may not in step 2. */
static double W0[NV][MAXE], G[STEPS][NV][MAXE];

static void make_data(void)
{
    unsigned s = 12345;
    for (int v = 0; v < NV; v++)
        for (int e = 0; e < elems(v); e++) {
            s = s * 1103515245u + 12345u;
            W0[v][e] = (double)((s >> 8) & 0xffff) / 32768.0 - 1.0;
            for (int t = 0; t < STEPS; t++) {
                s = s * 1103515245u + 12345u;
                G[t][v][e] = ((double)((s >> 8) & 0xffff) / 32768.0 - 1.0) * (t ? 0.1 : 1.0);
            }
        }
}

static double sumsq(const double *g, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += g[i] * g[i];
    return s;
}

/* ---- host reference ---------------------------------------------------------------------- */

typedef struct host_state {
    double w[NV][MAXE], m[NV][MAXE], s[NV][MAXE];
} host_state;

/* One update of every variable with the gradients gt of step t (iteration t + 1); decay[v]:
 * AdamW decays variable v in this step. Returns the global norm. */
static double host_step(const dt_optimizer_config *c, const bool decay[NV], int t,
                        const double gt[NV][MAXE], host_state *h)
{
    double g[NV][MAXE], total = 0;
    for (int v = 0; v < NV; v++)
        total += sumsq(gt[v], elems(v));
    double gnorm = sqrt(total);
    for (int v = 0; v < NV; v++) {
        int n = elems(v);
        double scale = 1;
        if (c->global_clipnorm > 0)
            scale = c->global_clipnorm / fmax(gnorm, c->global_clipnorm);
        if (c->clipnorm > 0)
            scale = c->clipnorm / fmax(sqrt(sumsq(gt[v], n)), c->clipnorm);
        for (int e = 0; e < n; e++) {
            g[v][e] = gt[v][e] * scale;
            if (c->clipvalue > 0)
                g[v][e] = fmin(fmax(g[v][e], -c->clipvalue), c->clipvalue);
        }
    }
    double lr = c->learning_rate, it = t + 1;
    for (int v = 0; v < NV; v++)
        for (int e = 0; e < elems(v); e++) {
            double *w = &h->w[v][e], *m = &h->m[v][e], *s = &h->s[v][e], gi = g[v][e];
            switch (c->kind) {
            case DT_OPTIMIZER_SGD:
                if (c->momentum > 0) {
                    *m = c->momentum * *m - lr * gi;
                    *w += *m;
                } else {
                    *w -= lr * gi;
                }
                break;
            case DT_OPTIMIZER_RMSPROP:
                *s = 0.9 * *s + 0.1 * gi * gi;
                *w -= lr * gi / sqrt(*s + 1e-7);
                break;
            default: { /* AdamW, Keras's defaults but the decay */
                double b1 = 0.9, b2 = 0.999, lr_t = lr * sqrt(1 - pow(b2, it)) / (1 - pow(b1, it));
                if (decay[v])
                    *w -= lr * c->weight_decay * *w;
                *m = b1 * *m + (1 - b1) * gi;
                *s = b2 * *s + (1 - b2) * gi * gi;
                *w -= lr_t * *m / (sqrt(*s) + 1e-7);
            }
            }
        }
    return gnorm;
}

/* ---- dtensor ----------------------------------------------------------------------------- */

static dt_mesh *all_; /* every global device, for reading back */

/* t's global values as doubles, through a replicated copy on every device. */
static bool read_back(const dt_tensor *t, double *out, int n)
{
    dt_layout l;
    dt_tensor *c = NULL, *f = NULL;
    bool ok = dt_layout_replicated(all_, t->rank, &l) == DT_OK &&
              dt_copy_to_mesh(t, &l, NULL, &c) == DT_OK &&
              dt_cast(c, DT_DTYPE_F64, NULL, &f) == DT_OK &&
              dt_tensor_read(f, out, (size_t)n * sizeof *out) == DT_OK;
    if (!ok)
        tap_diag("read back: %s", dt_last_error());
    dt_tensor_free(c);
    dt_tensor_free(f);
    return ok;
}

/* A mesh over the first k global devices: 1-D "x", or 2-D x = k / 2, y = 2. */
static dt_mesh *mesh_of(int k, bool two_d)
{
    int ids[64], sizes[2] = {two_d ? k / 2 : k, 2};
    for (int i = 0; i < k; i++)
        ids[i] = i;
    const char *names[2] = {"x", "y"};
    dt_mesh *m = NULL;
    if (dt_mesh_create_on_devices(two_d ? 2 : 1, names, sizes, DT_DEVICE_CPU, k, ids, &m) != DT_OK)
        tap_diag("mesh of %d: %s", k, dt_last_error());
    return m;
}

static const char *layout_text(int v, bool two_d)
{
    static const char *const one[NV] = {"x,unsharded", "x", "unsharded,x"};
    static const char *const two[NV] = {"x,y", "y", "unsharded,unsharded"};
    return two_d ? two[v] : one[v];
}

static bool from_host(const dt_layout *l, dt_dtype dt, int v, const double *x, dt_tensor **out)
{
    dt_tensor *d = NULL;
    bool ok = dt_tensor_from_host(l, DT_DTYPE_F64, rank_of[v], shape_of[v], x,
                                  (size_t)elems(v) * sizeof(double), &d) == DT_OK &&
              dt_cast(d, dt, NULL, out) == DT_OK;
    dt_tensor_free(d);
    return ok;
}

typedef struct trial {
    const char *name;
    dt_optimizer_config cfg;
    dt_dtype dtype;
    int exclude_first;  /* variable excluded from decay from the start, or -1 */
    int exclude_second; /* variable excluded after step 1, or -1 */
} trial;

/* Two steps of trial tr on a mesh of k devices; *err the largest |got - ref| / (1 + |ref|) over
 * every element after each step, *nerr the global norm's relative error (global_clipnorm). */
static bool run_trial(const trial *tr, int k, bool two_d, double *err, double *nerr)
{
    *err = *nerr = 0;
    dt_mesh *m = mesh_of(k, two_d);
    dt_variable *vars[NV] = {0};
    dt_tensor *grads[NV] = {0};
    dt_optimizer *o = NULL;
    bool ok = m != NULL && dt_optimizer_create(&tr->cfg, &o) == DT_OK;
    dt_layout l[NV];
    host_state h = {0};
    bool decay[NV];
    for (int v = 0; v < NV && ok; v++) {
        dt_tensor *t = NULL;
        ok = dt_layout_parse(m, layout_text(v, two_d), &l[v]) == DT_OK &&
             from_host(&l[v], tr->dtype, v, W0[v], &t) && dt_variable_create(t, &vars[v]) == DT_OK;
        dt_tensor_free(t);
        memcpy(h.w[v], W0[v], sizeof h.w[v]);
        decay[v] = tr->cfg.kind == DT_OPTIMIZER_ADAMW && v != tr->exclude_first;
    }
    if (ok && tr->exclude_first >= 0)
        ok = dt_optimizer_exclude_from_weight_decay(
                 o, 1, (const dt_variable *const *)&vars[tr->exclude_first]) == DT_OK;
    /* bf16: the host starts from the rounded values the device holds */
    for (int v = 0; v < NV && ok; v++)
        ok = read_back(dt_variable_value(vars[v]), h.w[v], elems(v));
    for (int t = 0; t < STEPS && ok; t++) {
        if (t == 1 && tr->exclude_second >= 0) {
            ok = dt_optimizer_exclude_from_weight_decay(
                     o, 1, (const dt_variable *const *)&vars[tr->exclude_second]) == DT_OK;
            decay[tr->exclude_second] = false;
        }
        double gh[NV][MAXE]; /* the gradients as the device holds them (bf16: rounded) */
        for (int v = 0; v < NV && ok; v++) {
            dt_tensor_free(grads[v]);
            grads[v] = NULL;
            ok = from_host(&l[v], tr->dtype, v, G[t][v], &grads[v]) &&
                 read_back(grads[v], gh[v], elems(v));
        }
        ok = ok && dt_optimizer_apply(o, NV, vars, (const dt_tensor *const *)grads) == DT_OK;
        if (!ok)
            tap_diag("%s: %s", tr->name, dt_last_error());
        double gnorm = host_step(&tr->cfg, decay, t, (const double(*)[MAXE])gh, &h);
        for (int v = 0; v < NV && ok; v++) {
            double got[MAXE];
            ok = read_back(dt_variable_value(vars[v]), got, elems(v));
            for (int e = 0; ok && e < elems(v); e++)
                *err = fmax(*err, fabs(got[e] - h.w[v][e]) / (1 + fabs(h.w[v][e])));
        }
        const dt_tensor *n = dt_optimizer_last_global_norm(o);
        if (ok && tr->cfg.global_clipnorm > 0) {
            double got;
            ok = n && read_back(n, &got, 1);
            *nerr = fmax(*nerr, fabs(got - gnorm) / gnorm);
        } else if (ok) {
            ok = n == NULL;
        }
    }
    dt_optimizer_free(o);
    for (int v = 0; v < NV; v++) {
        dt_variable_free(vars[v]);
        dt_tensor_free(grads[v]);
    }
    dt_mesh_free(m);
    return ok;
}

/* The global norm of step 1's gradients and the median of their own norms: clips that bite. */
static double global_norm0(void)
{
    double s = 0;
    for (int v = 0; v < NV; v++)
        s += sumsq(G[0][v], elems(v));
    return sqrt(s);
}

static void check_trials(int k, bool two_d)
{
    double gn = global_norm0(), norms[NV];
    for (int v = 0; v < NV; v++)
        norms[v] = sqrt(sumsq(G[0][v], elems(v)));
    double mid = fmax(fmin(norms[0], norms[1]), fmin(fmax(norms[0], norms[1]), norms[2]));
    const trial trials[] = {
        {"sgd global_clipnorm",
         {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .global_clipnorm = 0.5 * gn},
         DT_DTYPE_F32,
         -1,
         -1},
        {"sgd momentum global_clipnorm",
         {.kind = DT_OPTIMIZER_SGD,
          .learning_rate = 0.1,
          .momentum = 0.9,
          .global_clipnorm = 0.5 * gn},
         DT_DTYPE_F32,
         -1,
         -1},
        {"sgd clipnorm",
         {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .clipnorm = mid},
         DT_DTYPE_F32,
         -1,
         -1},
        {"sgd momentum clipnorm",
         {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .momentum = 0.9, .clipnorm = mid},
         DT_DTYPE_F32,
         -1,
         -1},
        {"sgd clipvalue",
         {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .clipvalue = 0.3},
         DT_DTYPE_F32,
         -1,
         -1},
        {"sgd momentum clipvalue",
         {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .momentum = 0.9, .clipvalue = 0.3},
         DT_DTYPE_F32,
         -1,
         -1},
        {"rmsprop clipnorm",
         {.kind = DT_OPTIMIZER_RMSPROP, .learning_rate = 0.01, .clipnorm = mid},
         DT_DTYPE_F32,
         -1,
         -1},
        {"adamw global_clipnorm, exclusions",
         {.kind = DT_OPTIMIZER_ADAMW,
          .learning_rate = 0.05,
          .weight_decay = 0.5,
          .global_clipnorm = 0.5 * gn},
         DT_DTYPE_F32,
         1,
         2},
        {"adamw unclipped, exclusions",
         {.kind = DT_OPTIMIZER_ADAMW, .learning_rate = 0.05, .weight_decay = 0.5},
         DT_DTYPE_F32,
         2,
         0},
        {"bf16 sgd momentum global_clipnorm",
         {.kind = DT_OPTIMIZER_SGD,
          .learning_rate = 0.1,
          .momentum = 0.9,
          .global_clipnorm = 0.5 * gn},
         DT_DTYPE_BF16,
         -1,
         -1},
    };
    for (size_t i = 0; i < sizeof trials / sizeof *trials; i++) {
        const trial *tr = &trials[i];
        double err, nerr;
        bool ok = run_trial(tr, k, two_d, &err, &nerr);
        /* bf16: each update rounds the variable (2^-8 relative) */
        double tol = tr->dtype == DT_DTYPE_BF16 ? 1e-2 : 2e-6;
        tap_check(ok && err <= tol && nerr <= 1e-6,
                  "%s, %d devices%s: both steps within %.0e of the host (max %.2e), the global "
                  "norm within 1e-6 (%.2e)",
                  tr->name, k, two_d ? " (2-D)" : "", tol, err, nerr);
    }
}

/* The host reference tells a clip from none, and decay from none: the checks can fail. */
static void check_reference_discriminates(void)
{
    double gn = global_norm0();
    dt_optimizer_config with = {.kind = DT_OPTIMIZER_SGD,
                                .learning_rate = 0.1,
                                .global_clipnorm = 0.5 * gn},
                        without = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1};
    bool decay[NV] = {0};
    host_state a = {0}, b = {0};
    memcpy(a.w, W0, sizeof a.w);
    memcpy(b.w, W0, sizeof b.w);
    host_step(&with, decay, 0, (const double(*)[MAXE])G[0], &a);
    host_step(&without, decay, 0, (const double(*)[MAXE])G[0], &b);
    double d = 0;
    for (int v = 0; v < NV; v++)
        for (int e = 0; e < elems(v); e++)
            d = fmax(d, fabs(a.w[v][e] - b.w[v][e]) / (1 + fabs(b.w[v][e])));
    tap_check(d > 1e-2, "an unapplied clip scale would miss the reference by %.2e", d);
}

static void check_bad_configs(void)
{
    static const struct {
        dt_optimizer_config c;
        const char *says;
    } bad[] = {
        {{.kind = DT_OPTIMIZER_ADAM, .learning_rate = 0.1, .clipnorm = -1}, "clipnorm -1"},
        {{.kind = DT_OPTIMIZER_ADAM, .learning_rate = 0.1, .global_clipnorm = NAN},
         "global_clipnorm nan"},
        {{.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .clipvalue = -0.5}, "clipvalue -0.5"},
        {{.kind = DT_OPTIMIZER_ADAMW, .learning_rate = 0.1, .clipnorm = 1, .global_clipnorm = 2},
         "clipnorm 1 and global_clipnorm 2"},
        {{.kind = DT_OPTIMIZER_ADAMW, .learning_rate = 0.1, .clipvalue = 3, .global_clipnorm = 2},
         "clipvalue 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dt_optimizer *o = (dt_optimizer *)1;
        dt_status s = dt_optimizer_create(&bad[i].c, &o);
        tap_check(s == DT_ERR_ARG && o == NULL && strstr(dt_last_error(), bad[i].says),
                  "refused, naming \"%s\": %s", bad[i].says, dt_last_error());
    }
    dt_optimizer *o = NULL;
    dt_optimizer_config c = {.kind = DT_OPTIMIZER_ADAMW, .learning_rate = 0.1};
    bool ok = dt_optimizer_create(&c, &o) == DT_OK;
    const dt_variable *none[1] = {NULL};
    dt_status s = dt_optimizer_exclude_from_weight_decay(o, 1, none);
    tap_check(ok && s == DT_ERR_ARG && strstr(dt_last_error(), "variable 0 is NULL"),
              "exclude_from_weight_decay: a NULL variable refused (%s)", dt_last_error());
    s = dt_optimizer_exclude_from_weight_decay(o, -1, none);
    tap_check(s == DT_ERR_ARG, "exclude_from_weight_decay: -1 variables refused (%s)",
              dt_last_error());
    dt_optimizer_free(o);
}

/* global_clipnorm over variables on two meshes: refused before anything runs. */
static void check_two_meshes(void)
{
    int k = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *a = mesh_of(1, false), *b = mesh_of(k, false);
    dt_optimizer *o = NULL;
    dt_optimizer_config c = {.kind = DT_OPTIMIZER_SGD, .learning_rate = 0.1, .global_clipnorm = 1};
    dt_variable *vars[2] = {0};
    dt_tensor *g[2] = {0};
    bool ok = a && b && dt_optimizer_create(&c, &o) == DT_OK;
    dt_layout l[2];
    for (int i = 0; i < 2 && ok; i++) {
        dt_tensor *t = NULL;
        ok = dt_layout_parse(i ? b : a, "x,unsharded", &l[i]) == DT_OK &&
             from_host(&l[i], DT_DTYPE_F32, 0, W0[0], &t) &&
             dt_variable_create(t, &vars[i]) == DT_OK &&
             from_host(&l[i], DT_DTYPE_F32, 0, G[0][0], &g[i]);
        dt_tensor_free(t);
    }
    dt_status s = ok ? dt_optimizer_apply(o, 2, vars, (const dt_tensor *const *)g) : DT_ERR_ARG;
    bool refused = s == DT_ERR_ARG && strstr(dt_last_error(), "different meshes");
    const char *msg = dt_last_error();
    double got[MAXE];
    bool same = ok;
    for (int i = 0; i < 2 && same; i++) {
        same = read_back(dt_variable_value(vars[i]), got, elems(0));
        for (int e = 0; same && e < elems(0); e++)
            same = got[e] == (double)(float)W0[0][e];
    }
    tap_check(ok && refused && same && dt_optimizer_iterations(o) == 0 &&
                  !dt_optimizer_last_global_norm(o),
              "global_clipnorm over two meshes refused, variables and optimizer untouched (%s)",
              msg);
    dt_optimizer_free(o);
    for (int i = 0; i < 2; i++) {
        dt_variable_free(vars[i]);
        dt_tensor_free(g[i]);
    }
    dt_mesh_free(a);
    dt_mesh_free(b);
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    make_data();
    int d = dt_num_global_devices(DT_DEVICE_CPU);
    all_ = mesh_of(d, false);
    check_bad_configs();
    check_reference_discriminates();
    check_two_meshes();
    for (int k = 1; k <= d; k++)
        if (k <= 3 || k == d)
            check_trials(k, false);
    if (d >= 4 && d % 2 == 0)
        check_trials(d, true);
    dt_mesh_free(all_);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
