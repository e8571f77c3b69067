/* Communication overlap in traced programs: a two-layer model's loss and weight gradients
 * (y = tanh(x W1) W2, loss = sum(y^2)), traced once with DTENSOR_OVERLAP=0 (the emitted order,
 * each collective waited for at once) and once with overlap (collectives moved up to their
 * operands, waited for at their first reader), under data parallel (replicated weights:
 * gradient all-reduces), fully sharded (row-sharded weights: all-gathers and reduce-scatters)
 * and tensor parallel (W1 by columns, W2 by rows: a partial result all-reduced). Checks: the
 * two runs' results are bitwise equal; both match a host computation in double (within 1e-12
 * relative); every ledger entry's times are in order (start <= started <= wait <= end, start
 * <= done <= end) and the hidden share lies in [0, 1]; the sequence of collectives (kind,
 * axes, group, cause) is the same on every client and with overlap on and off. Run at -n 2,
 * -n 4 (more ranks than cores), -n 1 with 3, 4 and 8 devices and -n 2 with 2 devices each. Also
 * with one collective in flight at a time (DTENSOR_COLLECTIVES_IN_FLIGHT=1: bitwise the same), with
 * all-reduces as reduce-then-broadcast (two steps on one communicator), and at -n 4 on two
 * hosts by host (rounds posted as earlier ones complete, several collectives in flight).
 * Gradient buckets (on by default in all of the above): traced again with DTENSOR_BUCKET_MB=0,
 * the results are bitwise the same where the all-reduces have two terms, within 1e-13
 * relative otherwise (the collective may add in another order), and data parallel and fully
 * sharded run fewer collectives with buckets (the all-reduces merge, and the chunked matmul's
 * reduce-scatters into blocks of rows, uneven ones included: "bucket of K reduce-scatters" in
 * the printed program; and the fully sharded weights' all-gathers, even and uneven: "bucket of
 * K all-gathers"); a bad DTENSOR_BUCKET_MB fails the trace with DT_ERR_ARG naming it on
 * every client. Each preset runs on the 1-D mesh "d" of every device and, with 4 devices or
 * more, on a 2-D mesh d x m (m = 2: the groups of "d" twice over). */
#include "dt.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* D = 10 rows of W1: uneven over 3, 4 and 8 devices; a batch of 4096: data parallel
 * all-reduces its gradients (with 8 it gathers the activations instead), and the fully sharded
 * preset reduce-scatters them in the chunked matmul's blocks on 2 to 8 devices (with 32 it
 * gathers the activations on 4 and more) */
enum { B = 4096, D = 10, H = 12 };

static double X[B][D], W1[D][H], W2[H][D];

static void make_data(void)
{
    unsigned s = 11;
    double *all[3] = {&X[0][0], &W1[0][0], &W2[0][0]};
    int n[3] = {B * D, D * H, H * D};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n[k]; i++) {
            s = s * 1103515245u + 12345u;
            all[k][i] = ((double)((s >> 8) & 0xffff) / 65536.0 - 0.5) * (k ? 0.6 : 2.0);
        }
}

/* The host reference: loss, dW1, dW2 by hand-derived backpropagation. */
static void host_grads(double *loss, double g1[D][H], double g2[H][D])
{
    static double h[B][H], y[B][D], dh[B][H];
    *loss = 0;
    memset(g1, 0, sizeof(double) * D * H);
    memset(g2, 0, sizeof(double) * H * D);
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < H; j++) {
            double z = 0;
            for (int i = 0; i < D; i++)
                z += X[b][i] * W1[i][j];
            h[b][j] = tanh(z);
        }
        for (int i = 0; i < D; i++) {
            y[b][i] = 0;
            for (int j = 0; j < H; j++)
                y[b][i] += h[b][j] * W2[j][i];
            *loss += y[b][i] * y[b][i];
        }
        for (int j = 0; j < H; j++) {
            double d = 0;
            for (int i = 0; i < D; i++) {
                g2[j][i] += h[b][j] * 2 * y[b][i];
                d += 2 * y[b][i] * W2[j][i];
            }
            dh[b][j] = d * (1 - h[b][j] * h[b][j]);
        }
        for (int i = 0; i < D; i++)
            for (int j = 0; j < H; j++)
                g1[i][j] += X[b][i] * dh[b][j];
    }
}

typedef struct preset {
    const char *name, *x, *w1, *w2;
} preset;

static const preset presets[] = {
    {"data parallel", "d,unsharded", "unsharded,unsharded", "unsharded,unsharded"},
    {"fully sharded", "d,unsharded", "d,unsharded", "d,unsharded"},
    {"tensor parallel", "unsharded,unsharded", "unsharded,d", "d,unsharded"},
};

/* The gradient function of the model for layouts of x, W1 and W2, traced with overlap on or
 * off, and buckets on (the default) or off (DTENSOR_OVERLAP and DTENSOR_BUCKET_MB are read
 * when the program is built). */
static dt_function *trace(const dt_mesh *m, const preset *p, bool overlap, bool buckets)
{
    if (overlap)
        unsetenv("DTENSOR_OVERLAP");
    else
        setenv("DTENSOR_OVERLAP", "0", 1);
    if (!buckets)
        setenv("DTENSOR_BUCKET_MB", "0", 1);
    dt_layout lx, l1, l2;
    dt_function *f = NULL, *g = NULL;
    dt_tensor *x = NULL, *w1 = NULL, *w2 = NULL, *z = NULL, *h = NULL, *y = NULL, *yy = NULL,
              *loss = NULL;
    bool ok = dt_layout_parse(m, p->x, &lx) == DT_OK && dt_layout_parse(m, p->w1, &l1) == DT_OK &&
              dt_layout_parse(m, p->w2, &l2) == DT_OK && dt_function_begin(&f) == DT_OK;
    ok = ok && dt_function_input(f, &lx, DT_DTYPE_F64, 2, (int64_t[]){B, D}, &x) == DT_OK &&
         dt_function_input(f, &l1, DT_DTYPE_F64, 2, (int64_t[]){D, H}, &w1) == DT_OK &&
         dt_function_input(f, &l2, DT_DTYPE_F64, 2, (int64_t[]){H, D}, &w2) == DT_OK &&
         dt_matmul(x, w1, NULL, &z) == DT_OK && dt_unary(DT_UNARY_TANH, z, NULL, &h) == DT_OK &&
         dt_matmul(h, w2, NULL, &y) == DT_OK &&
         dt_binary(DT_BINARY_MUL, y, y, NULL, &yy) == DT_OK &&
         dt_reduce(DT_REDUCE_SUM, yy, 0, NULL, 0, NULL, &loss) == DT_OK;
    if (f)
        ok = dt_function_end(f, 1, &loss) == DT_OK && ok;
    ok = ok && dt_function_gradient(f, 0, 2, (int[]){1, 2}, &g) == DT_OK;
    dt_function_free(f);
    dt_tensor *sym[8] = {x, w1, w2, z, h, y, yy, loss};
    for (int k = 0; k < 8; k++)
        dt_tensor_free(sym[k]);
    unsetenv("DTENSOR_OVERLAP");
    unsetenv("DTENSOR_BUCKET_MB");
    if (!ok)
        tap_diag("%s: trace: %s", p->name, dt_last_error());
    return ok ? g : NULL;
}

/* One collective as the order check compares it. */
typedef struct coll_sig {
    char op[24], axes[DT_STRING_MAX / 2], cause[64];
    int group_size, uneven; /* not the bytes: a client's own shards' (uneven shards differ) */
    double start;           /* to sort by, then cleared */
} coll_sig;

enum { MAX_COLL = 64 };

static int by_start(const void *a, const void *b)
{
    const coll_sig *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Run g; results (loss, dW1, dW2) into host arrays; the ledger step's collectives hashed in
 * order; the entries' times checked. */
static bool run(const dt_function *g, dt_tensor *const in[], double out[3][D * H], uint64_t *sig,
                int64_t *ncoll, bool *times_ok, double *hidden)
{
    int64_t first = dt_ledger_size(), step = dt_ledger_next_step();
    dt_tensor *res[3] = {NULL, NULL, NULL};
    bool ok = dt_function_run(g, 3, (const dt_tensor *const *)in, 3, res) == DT_OK;
    for (int k = 0; ok && k < 3; k++)
        ok = dt_tensor_read(res[k], out[k], k ? sizeof(double) * D * H : sizeof(double)) == DT_OK;
    for (int k = 0; k < 3; k++)
        dt_tensor_free(res[k]);
    *ncoll = 0;
    *times_ok = true;
    /* the ledger keeps the order of the waits: the start order is the order of start times */
    coll_sig c[MAX_COLL];
    for (int64_t i = first; ok && i < dt_ledger_size() && *ncoll < MAX_COLL; i++) {
        dt_ledger_entry e;
        ok = dt_ledger_entry_get(i, &e) == DT_OK;
        if (!ok || e.step != step)
            continue;
        coll_sig *x = &c[(*ncoll)++];
        memset(x, 0, sizeof *x);
        snprintf(x->op, sizeof x->op, "%s", e.op);
        snprintf(x->axes, sizeof x->axes, "%s", e.axes_names);
        snprintf(x->cause, sizeof x->cause, "%s", e.cause);
        x->group_size = e.group_size;
        x->uneven = e.uneven;
        x->start = e.start;
        *times_ok = *times_ok && e.start > 0 && e.start <= e.started && e.started <= e.wait &&
                    e.wait <= e.end && e.start <= e.done && e.done <= e.end &&
                    fabs(e.seconds - (e.end - e.start)) < 1e-9;
    }
    qsort(c, (size_t)*ncoll, sizeof *c, by_start);
    *sig = 1469598103934665603ull;
    for (int64_t k = 0; k < *ncoll; k++) {
        c[k].start = 0;
        *sig = fnv(*sig, &c[k], sizeof c[k]);
    }
    dt_ledger_overlap ov;
    ok = ok && dt_ledger_overlap_get(step, step, &ov) == DT_OK;
    *hidden = ov.hidden_share;
    *times_ok = *times_ok && ov.collectives == *ncoll && ov.hidden_share >= 0 &&
                ov.hidden_share <= 1 && ov.exposed_seconds <= ov.comm_seconds + 1e-12;
    if (!ok)
        tap_diag("run: %s", dt_last_error());
    return ok;
}

/* Whether g's printed program has a line with `what` in it. */
static bool prints(const dt_function *g, const char *what)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    bool ok = f && dt_function_print(g, f) == DT_OK;
    if (f)
        fclose(f);
    ok = ok && buf && strstr(buf, what);
    free(buf);
    return ok;
}

static double rel_err(const double *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The preset on mesh m (its axis "d" first), named `mesh` in the checks. */
static void check_preset(const dt_mesh *m, const char *mesh, const preset *p)
{
    static double ref[3][D * H], got[4][3][D * H];
    host_grads(&ref[0][0], (double(*)[H])ref[1], (double(*)[D])ref[2]);
    dt_layout lx, l1, l2;
    dt_tensor *in[3] = {NULL, NULL, NULL};
    bool ok = dt_layout_parse(m, p->x, &lx) == DT_OK && dt_layout_parse(m, p->w1, &l1) == DT_OK &&
              dt_layout_parse(m, p->w2, &l2) == DT_OK &&
              dt_tensor_from_host(&lx, DT_DTYPE_F64, 2, (int64_t[]){B, D}, X, sizeof X, &in[0]) ==
                  DT_OK &&
              dt_tensor_from_host(&l1, DT_DTYPE_F64, 2, (int64_t[]){D, H}, W1, sizeof W1, &in[1]) ==
                  DT_OK &&
              dt_tensor_from_host(&l2, DT_DTYPE_F64, 2, (int64_t[]){H, D}, W2, sizeof W2, &in[2]) ==
                  DT_OK;
    uint64_t sig[4] = {0, 0, 0, 0};
    int64_t ncoll[4] = {0, 0, 0, 0};
    bool times[4] = {false, false, false, false};
    double hidden[4] = {0, 0, 0, 0};
    bool printed = false;
    /* overlap off, on, on with one collective in flight at a time, on without buckets */
    for (int on = 0; on < 4; on++) {
        dt_function *g = ok ? trace(m, p, on > 0, on < 3) : NULL;
        if (on == 2)
            setenv("DTENSOR_COLLECTIVES_IN_FLIGHT", "1", 1);
        /* twice: the second run is the one a training loop repeats */
        for (int r = 0; r < 2 && g; r++)
            ok = run(g, in, got[on], &sig[on], &ncoll[on], &times[on], &hidden[on]) && ok;
        if (on == 1 && g)
            printed = p == &presets[1]
                          ? prints(g, "reduce-scatters, ") && prints(g, "all-gathers, ")
                          : prints(g, "all-reduces, ");
        unsetenv("DTENSOR_COLLECTIVES_IN_FLIGHT");
        ok = ok && g;
        dt_function_free(g);
    }
    for (int k = 0; k < 3; k++)
        dt_tensor_free(in[k]);
    int n[3] = {1, D * H, H * D};
    /* two terms add alike in any order */
    bool two = dt_mesh_axis_size(m, 0) == 2;
    bool same = ok, close = ok, unbucketed = ok;
    for (int k = 0; k < 3; k++) {
        same = same && memcmp(got[0][k], got[1][k], sizeof(double) * (size_t)n[k]) == 0 &&
               memcmp(got[2][k], got[1][k], sizeof(double) * (size_t)n[k]) == 0;
        close = close && rel_err(got[1][k], ref[k], n[k]) < 1e-12 &&
                rel_err(got[3][k], ref[k], n[k]) < 1e-12;
        unbucketed =
            unbucketed && (two ? memcmp(got[3][k], got[1][k], sizeof(double) * (size_t)n[k]) == 0
                               : rel_err(got[3][k], got[1][k], n[k]) < 1e-13);
    }
    tap_check(unbucketed, "%s %s: buckets on and off: %s", mesh, p->name,
              two ? "bitwise equal" : "within 1e-13 relative");
    /* data parallel's gradient all-reduces merge, and the fully sharded preset's chunked
     * reduce-scatters (the printed program says so); nothing is added anywhere */
    bool tp = p == &presets[2];
    bool fewer = ok && (tp ? ncoll[1] <= ncoll[3] : ncoll[1] < ncoll[3] && printed);
    tap_check(fewer, "%s %s: %lld collectives with buckets, %lld without%s", mesh, p->name,
              (long long)ncoll[1], (long long)ncoll[3],
              tp ? "" : ", the printed program has a bucket");
    tap_check(same,
              "%s %s: loss and gradients bitwise equal with overlap on and off and with one "
              "collective in flight",
              mesh, p->name);
    tap_check(close, "%s %s: they match the host's in double", mesh, p->name);
    tap_check(ok && times[0] && times[1] && times[3],
              "%s %s: ledger times in order, hidden share in [0, 1]", mesh, p->name);
    uint64_t all[4 * 64];
    int nc = dt_num_clients();
    bool order = ok && nc <= 64 && sig[0] == sig[1] && sig[2] == sig[1] && ncoll[0] == ncoll[1] &&
                 dt_client_allgather(sig, sizeof sig, all) == DT_OK;
    for (int c = 0; order && c < nc; c++)
        order = all[4 * c] == sig[0] && all[4 * c + 1] == sig[1] && all[4 * c + 3] == sig[3];
    tap_check(order,
              "%s %s: %lld collectives, in the same order on every client and with overlap "
              "on and off",
              mesh, p->name, (long long)ncoll[1]);
    tap_diag("%s %s: hidden share %.2f without overlap, %.2f with (client 0, not a verdict)", mesh,
             p->name, hidden[0], hidden[1]);
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    make_data();
    int n = dt_num_global_devices(DT_DEVICE_CPU);
    dt_mesh *m = NULL;
    bool ok = dt_mesh_create(1, (const char *const[]){"d"}, (int[]){n}, DT_DEVICE_CPU, &m) == DT_OK;
    tap_check(ok, "a mesh of %d devices", n);
    /* the default exchanges, then reduce-then-broadcast all-reduces: two steps on one
     * communicator each, several in flight (so with DTENSOR_COLLECTIVES_BY_HOST=1 the by-host
     * path's rounds) */
    static const dt_collective_algorithm algs[] = {DT_ALGORITHM_AUTO,
                                                   DT_ALGORITHM_REDUCTION_TO_ONE_DEVICE};
    /* a bound that is not a whole number from 1 fails the run on every client */
    dt_tensor *x = NULL, *y = NULL;
    dt_layout rep;
    setenv("DTENSOR_COLLECTIVES_IN_FLIGHT", "0", 1);
    ok = ok && dt_layout_parse(m, "unsharded", &rep) == DT_OK &&
         dt_tensor_from_host(&rep, DT_DTYPE_F64, 1, (int64_t[]){D}, X, sizeof X[0], &x) == DT_OK;
    dt_status bad = ok ? dt_reduce(DT_REDUCE_SUM, x, 0, NULL, 0, NULL, &y) : DT_OK;
    unsetenv("DTENSOR_COLLECTIVES_IN_FLIGHT");
    tap_check(bad == DT_ERR_ARG && strstr(dt_last_error(), "DTENSOR_COLLECTIVES_IN_FLIGHT=\"0\""),
              "DTENSOR_COLLECTIVES_IN_FLIGHT=0: DT_ERR_ARG naming it (%s)", dt_last_error());
    dt_tensor_free(x);
    dt_tensor_free(y);
    /* a bucket cap that is not a number of megabytes fails the trace on every client */
    setenv("DTENSOR_BUCKET_MB", "25MB", 1);
    dt_function *f = NULL;
    dt_tensor *v = NULL, *w = NULL;
    bad = !ok ? DT_OK
          : dt_function_begin(&f) != DT_OK ||
                  dt_function_input(f, &rep, DT_DTYPE_F64, 1, (int64_t[]){D}, &v) != DT_OK ||
                  dt_reduce(DT_REDUCE_SUM, v, 0, NULL, 0, NULL, &w) != DT_OK
              ? DT_OK
              : dt_function_end(f, 1, &w);
    unsetenv("DTENSOR_BUCKET_MB");
    tap_check(bad == DT_ERR_ARG && strstr(dt_last_error(), "DTENSOR_BUCKET_MB=\"25MB\""),
              "DTENSOR_BUCKET_MB=25MB: DT_ERR_ARG naming it (%s)", dt_last_error());
    dt_function_free(f);
    dt_tensor_free(v);
    dt_tensor_free(w);
    for (size_t a = 0; ok && a < sizeof algs / sizeof algs[0]; a++) {
        ok = dt_mesh_set_collective_algorithm(m, algs[a]) == DT_OK;
        tap_check(ok, "collective algorithm %s", dt_collective_algorithm_name(algs[a]));
        for (size_t k = 0; ok && k < sizeof presets / sizeof presets[0]; k++)
            check_preset(m, "1-D", &presets[k]);
    }
    dt_mesh_free(m);
    /* 2-D: the presets over "d" of n / 2 devices, each group of "d" once per index of "m" */
    dt_mesh *m2 = NULL;
    if (ok && n >= 4 && n % 2 == 0) {
        ok = dt_mesh_create(2, (const char *const[]){"d", "m"}, (int[]){n / 2, 2}, DT_DEVICE_CPU,
                            &m2) == DT_OK;
        tap_check(ok, "a mesh of %d x 2 devices", n / 2);
        for (size_t k = 0; ok && k < sizeof presets / sizeof presets[0]; k++)
            check_preset(m2, "2-D", &presets[k]);
    }
    dt_mesh_free(m2);
    int rc = tap_done();
    dt_finalize();
    return rc;
}
