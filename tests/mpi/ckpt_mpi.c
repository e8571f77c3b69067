/* Checkpoints (train/checkpoint.c), as a TAP program run with and without a launcher.
 *
 *   ckpt_mpi                      in-process: bitwise round trips of every dtype under every
 *                                 layout of the runtime's mesh (restored into other layouts),
 *                                 partial tensors, errors (names, shapes, dtypes, foreign,
 *                                 truncated and missing files), the manager, and a training
 *                                 run resumed from a checkpoint giving bitwise the losses of
 *                                 the run that never stopped (random draws included)
 *   ckpt_mpi save PATH SALT       the resharding set, saved from a mesh over every device
 *                                 ("x=2,y=2" on 4 devices, else 1-D "x")
 *   ckpt_mpi restore PATH SALT    the resharding set read back into every layout of this
 *                                 run's mesh (3x2 on 6 devices, else 1-D), as variables and
 *                                 as tensors, checked against the host formula
 * (tests/mpi/ckpt_reshard.sh and ckpt_kill.sh run the last two across client counts.)
 *
 * Values come from a host formula of (tensor, element, salt): raw bytes for the dtype loop
 * (so any dtype the library gains is covered bitwise), finite numbers where arithmetic runs.
 * DTENSOR_TEST_KILL_AFTER=k makes client DTENSOR_TEST_KILL_RANK (default 1) kill itself with
 * SIGKILL once k + 1 tensors of a save are written (the kill -9 test). */
#include "../../train/train.h"
#include "tap.h"

#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static dt_mesh *mesh;
static char dir[256];

/* ---- host values ------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Raw bytes of tensor k: any bit pattern the dtype holds. */
static void fill_bytes(void *buf, size_t bytes, int k, int salt)
{
    unsigned char *b = buf;
    for (size_t i = 0; i < bytes; i++)
        b[i] = (unsigned char)(mix(((uint64_t)k << 40) ^ ((uint64_t)salt << 32) ^ i) >> 17);
}

/* ---- layouts ------------------------------------------------------------------------------ */

/* Every layout of `rank` on mesh m (each tensor axis unsharded or one unused mesh axis), up
 * to max; returns how many. */
static int all_layouts(const dt_mesh *m, int rank, dt_layout out[], int max)
{
    int na = dt_mesh_num_axes(m), n = 0;
    int choice[DT_MAX_RANK] = {0}; /* 0 unsharded, a + 1 mesh axis a */
    for (;;) {
        unsigned used = 0;
        bool ok = true;
        for (int i = 0; i < rank && ok; i++)
            if (choice[i]) {
                ok = !(used & (1u << (choice[i] - 1)));
                used |= 1u << (choice[i] - 1);
            }
        if (ok && n < max) {
            const char *specs[DT_MAX_RANK];
            for (int i = 0; i < rank; i++)
                specs[i] = choice[i] ? dt_mesh_axis_name(m, choice[i] - 1) : "unsharded";
            if (dt_layout_create(m, rank, specs, &out[n]) == DT_OK)
                n++;
        }
        int i = 0;
        while (i < rank && ++choice[i] > na)
            choice[i++] = 0;
        if (i == rank)
            return n;
    }
}

static bool tensor_is(const dt_tensor *t, const void *want, size_t bytes)
{
    void *got = malloc(bytes ? bytes : 1);
    bool ok = got && dt_tensor_read(t, got, bytes) == DT_OK && !memcmp(got, want, bytes);
    free(got);
    return ok;
}

static char *path_in(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* ---- round trips -------------------------------------------------------------------------- */

#define MAXL 64

static void test_round_trips(void)
{
    dt_layout ls[MAXL];
    int nl = all_layouts(mesh, 2, ls, MAXL);
    const int64_t shape[2] = {5, 7}; /* uneven over 2, 3 and 4 shards */
    int n = nl * DT_DTYPE_COUNT;
    dt_variable **vars = calloc((size_t)n, sizeof *vars);
    void **host = calloc((size_t)n, sizeof *host);
    dt_checkpoint *ck = NULL;
    bool ok = vars && host && dt_checkpoint_create(&ck) == DT_OK;
    for (int k = 0; ok && k < n; k++) {
        dt_dtype dt = (dt_dtype)(k / nl);
        size_t bytes = 35 * dt_dtype_size(dt);
        host[k] = malloc(bytes);
        fill_bytes(host[k], bytes, k, 1);
        dt_tensor *t = NULL;
        char name[64];
        snprintf(name, sizeof name, "%s/layout_%d", dt_dtype_name(dt), k % nl);
        ok = dt_tensor_from_host(&ls[k % nl], dt, 2, shape, host[k], bytes, &t) == DT_OK &&
             dt_variable_create(t, &vars[k]) == DT_OK &&
             dt_checkpoint_add_variable(ck, name, vars[k]) == DT_OK;
        dt_tensor_free(t);
    }
    /* a scalar, an empty tensor and a rank-3 one */
    dt_variable *extra[3] = {0};
    const int64_t e_shape[3][3] = {{0}, {0, 3}, {3, 5, 2}};
    const int e_rank[3] = {0, 2, 3};
    unsigned char e_host[3][3 * 5 * 2 * 8];
    dt_layout lr;
    for (int j = 0; ok && j < 3; j++) {
        dt_tensor *t = NULL;
        int64_t elems = 1;
        for (int a = 0; a < e_rank[j]; a++)
            elems *= e_shape[j][a];
        fill_bytes(e_host[j], (size_t)elems * 8, 1000 + j, 1);
        dt_layout l;
        ok = all_layouts(mesh, e_rank[j], &l, 1) == 1; /* replicated first */
        if (e_rank[j] >= 1) {
            const char *sp[3] = {dt_mesh_axis_name(mesh, 0), "unsharded", "unsharded"};
            if (e_rank[j] == 3 && dt_mesh_num_axes(mesh) > 1)
                sp[2] = dt_mesh_axis_name(mesh, dt_mesh_num_axes(mesh) - 1);
            ok = ok && dt_layout_create(mesh, e_rank[j], sp, &l) == DT_OK;
        }
        char name[32];
        snprintf(name, sizeof name, "extra/%d", j);
        ok = ok &&
             dt_tensor_from_host(&l, DT_DTYPE_F64, e_rank[j], e_shape[j], e_host[j],
                                 (size_t)elems * 8, &t) == DT_OK &&
             dt_variable_create(t, &extra[j]) == DT_OK &&
             dt_checkpoint_add_variable(ck, name, extra[j]) == DT_OK;
        dt_tensor_free(t);
    }
    /* a partial tensor: saved as its sum (here exact: one term and zeros) */
    dt_tensor *part = NULL, *full = NULL;
    float p_host[4 * 6];
    for (int i = 0; i < 24; i++)
        p_host[i] = (float)i / 3.0f - 2.5f;
    int last = dt_mesh_num_axes(mesh) - 1;
    char ptext[64];
    snprintf(ptext, sizeof ptext, "unsharded,unsharded;partial_sum=%s",
             dt_mesh_axis_name(mesh, last));
    ok = ok && dt_layout_replicated(mesh, 2, &lr) == DT_OK &&
         dt_tensor_from_host(&lr, DT_DTYPE_F32, 2, (int64_t[]){4, 6}, p_host, sizeof p_host,
                             &full) == DT_OK;
    dt_layout lp;
    ok = ok && dt_layout_parse(mesh, ptext, &lp) == DT_OK &&
         dt_relayout(full, &lp, NULL, &part) == DT_OK &&
         dt_checkpoint_add_tensor(ck, "partial", part) == DT_OK;
    tap_check(ok,
              "round trip: %d tensors of every dtype in %d layouts, scalar, empty, rank 3, "
              "partial",
              n, nl);
    ok = ok && dt_checkpoint_write(ck, path_in("rt.h5")) == DT_OK;
    tap_check(ok, "round trip: written");
    struct stat st;
    tap_check(stat(path_in("rt.h5.tmp"), &st) != 0 && stat(path_in("rt.h5"), &st) == 0,
              "round trip: the file is in place, no .tmp left");
    if (dt_num_clients() > 1) { /* clients naming different files fail alike, none waits */
        char mine[32];
        snprintf(mine, sizeof mine, "client%d.h5", dt_client_id());
        dt_status ms = dt_checkpoint_write(ck, path_in(mine));
        tap_check(ms == DT_ERR_MISMATCH && strstr(dt_last_error(), "client0.h5") &&
                      strstr(dt_last_error(), "client1.h5"),
                  "clients writing different paths: DT_ERR_MISMATCH naming both, on every client");
        tap_diag("%s", dt_last_error());
    }

    /* restore into variables of the NEXT layout (resharding), zeros first */
    dt_checkpoint *ck2 = NULL;
    dt_variable **back = calloc((size_t)n, sizeof *back);
    bool ok2 = ok && back && dt_checkpoint_create(&ck2) == DT_OK;
    for (int k = 0; ok2 && k < n; k++) {
        dt_dtype dt = (dt_dtype)(k / nl);
        dt_tensor *z = NULL;
        dt_op_options o = {.layout = &ls[(k + 1) % nl]};
        char name[64];
        snprintf(name, sizeof name, "%s/layout_%d", dt_dtype_name(dt), k % nl);
        ok2 = dt_zeros(dt, 2, shape, &o, &z) == DT_OK && dt_variable_create(z, &back[k]) == DT_OK &&
              dt_checkpoint_add_variable(ck2, name, back[k]) == DT_OK;
        dt_tensor_free(z);
    }
    ok2 = ok2 && dt_checkpoint_read(ck2, path_in("rt.h5")) == DT_OK;
    tap_check(ok2, "round trip: read into other layouts");
    bool same = ok2;
    for (int k = 0; same && k < n; k++)
        same = tensor_is(dt_variable_value(back[k]), host[k],
                         35 * dt_dtype_size((dt_dtype)(k / nl))) &&
               dt_layout_equal(dt_variable_layout(back[k]), &ls[(k + 1) % nl]);
    tap_check(same, "round trip: every dtype and layout bitwise, each variable keeps its layout");
    bool ex = ok;
    for (int j = 0; ex && j < 3; j++) {
        char name[32];
        snprintf(name, sizeof name, "variables/extra/%d", j);
        dt_layout l;
        dt_tensor *t = NULL;
        ex = all_layouts(mesh, e_rank[j], &l, 1) == 1 &&
             dt_checkpoint_read_tensor(path_in("rt.h5"), name, &l, &t) == DT_OK;
        int64_t elems = 1;
        for (int a = 0; a < e_rank[j]; a++)
            elems *= e_shape[j][a];
        ex = ex && tensor_is(t, e_host[j], (size_t)elems * 8);
        dt_tensor_free(t);
    }
    tap_check(ex, "round trip: scalar, empty and rank-3 tensors bitwise");
    dt_tensor *pt = NULL;
    bool pok =
        ok &&
        dt_checkpoint_read_tensor(path_in("rt.h5"), "tensors/partial", &ls[nl - 1], &pt) == DT_OK &&
        tensor_is(pt, p_host, sizeof p_host);
    tap_check(pok, "round trip: a partial tensor is saved as its sum");
    dt_dtype idt = DT_DTYPE_F32;
    int irank = -1;
    int64_t ishape[DT_MAX_RANK];
    tap_check(dt_checkpoint_tensor_info(path_in("rt.h5"), "variables/i64/layout_0", &idt, &irank,
                                        ishape) == DT_OK &&
                  idt == DT_DTYPE_I64 && irank == 2 && ishape[0] == 5 && ishape[1] == 7,
              "tensor_info: dtype and global shape from the file");
    dt_tensor_free(pt);

    /* errors leave the objects unchanged: a variable of the wrong shape, after a good one */
    dt_checkpoint *bad = NULL;
    dt_variable *good = NULL, *wrong = NULL;
    dt_tensor *z = NULL, *w = NULL;
    dt_op_options o0 = {.layout = &ls[0]};
    bool eok = dt_checkpoint_create(&bad) == DT_OK &&
               dt_zeros(DT_DTYPE_F32, 2, shape, &o0, &z) == DT_OK &&
               dt_variable_create(z, &good) == DT_OK &&
               dt_zeros(DT_DTYPE_F32, 2, (int64_t[]){7, 5}, &o0, &w) == DT_OK &&
               dt_variable_create(w, &wrong) == DT_OK &&
               dt_checkpoint_add_variable(bad, "f32/layout_0", good) == DT_OK &&
               dt_checkpoint_add_variable(bad, "f32/layout_1", wrong) == DT_OK;
    dt_status s = dt_checkpoint_read(bad, path_in("rt.h5"));
    float zeros[35] = {0};
    tap_check(eok && s == DT_ERR_SHAPE && strstr(dt_last_error(), "f32/layout_1") &&
                  strstr(dt_last_error(), "[7,5]") && strstr(dt_last_error(), "[5,7]") &&
                  tensor_is(dt_variable_value(good), zeros, sizeof zeros),
              "a variable of another shape: DT_ERR_SHAPE naming it and both shapes; nothing "
              "restored");
    tap_diag("%s", dt_last_error());
    dt_checkpoint_free(bad);
    dt_variable_free(wrong);
    dt_tensor_free(w);
    w = NULL;
    wrong = NULL;
    bad = NULL;
    eok = dt_checkpoint_create(&bad) == DT_OK &&
          dt_zeros(DT_DTYPE_F64, 2, shape, &o0, &w) == DT_OK &&
          dt_variable_create(w, &wrong) == DT_OK &&
          dt_checkpoint_add_variable(bad, "i32/layout_0", wrong) == DT_OK;
    s = dt_checkpoint_read(bad, path_in("rt.h5"));
    tap_check(eok && s == DT_ERR_DTYPE && strstr(dt_last_error(), "i32/layout_0") &&
                  strstr(dt_last_error(), "f64") && strstr(dt_last_error(), "i32"),
              "a variable of another dtype: DT_ERR_DTYPE naming it and both dtypes");
    dt_checkpoint_free(bad);
    bad = NULL;
    eok = dt_checkpoint_create(&bad) == DT_OK &&
          dt_checkpoint_add_variable(bad, "no/such", good) == DT_OK;
    s = dt_checkpoint_read(bad, path_in("rt.h5"));
    tap_check(eok && s == DT_ERR_ARG && strstr(dt_last_error(), "variables/no/such"),
              "a name the file lacks: DT_ERR_ARG naming it");
    dt_checkpoint_free(bad);
    bad = NULL;
    dt_checkpoint_create(&bad);
    tap_check(dt_checkpoint_add_variable(bad, "a/../b", good) == DT_ERR_ARG &&
                  dt_checkpoint_add_variable(bad, "a b", good) == DT_ERR_ARG &&
                  dt_checkpoint_add_variable(bad, "a", good) == DT_OK &&
                  dt_checkpoint_add_variable(bad, "a/b", good) == DT_ERR_ARG &&
                  dt_checkpoint_add_variable(bad, "a", good) == DT_ERR_ARG &&
                  dt_checkpoint_add_counter(bad, "save_counter", (int64_t[]){0}) == DT_ERR_ARG,
              "names: bad characters, '..', duplicates and a dataset used as a group refused");
    /* a NULL or empty path: DT_ERR_ARG naming it on every entry point taking a path */
    dt_dtype idt2;
    int irank2;
    int64_t ishape2[DT_MAX_RANK];
    char latest[64];
    dt_checkpoint_manager *nomg = NULL;
    bool paths = true;
    const char *const bad_paths[2] = {NULL, ""};
    for (int i = 0; i < 2; i++) {
        const char *p = bad_paths[i], *says = p ? "path is empty" : "path is NULL";
        dt_tensor *nt = NULL;
        dt_status st[7] = {
            dt_checkpoint_write(bad, p),
            dt_checkpoint_read(bad, p),
            dt_checkpoint_save(bad, p, latest, sizeof latest),
            dt_checkpoint_read_tensor(p, "a", &ls[0], &nt),
            dt_checkpoint_tensor_info(p, "a", &idt2, &irank2, ishape2),
            dt_checkpoint_latest(p, latest, sizeof latest),
            dt_checkpoint_manager_create(bad, p, 1, &nomg),
        };
        for (int k = 0; k < 7; k++)
            paths = paths && st[k] == DT_ERR_ARG;
        paths = paths && strstr(dt_last_error(), says) && !nt && !nomg;
    }
    tap_check(paths, "a NULL or empty path: DT_ERR_ARG naming it from write, read, save, "
                     "read_tensor, tensor_info, latest and the manager");

    /* files that are not checkpoints */
    if (dt_client_id() == 0) {
        FILE *f = fopen(path_in("foreign.h5"), "w");
        if (f) {
            fputs("just some text, not HDF5\n", f);
            fclose(f);
        }
        /* truncated: the first half of a good checkpoint */
        FILE *in = fopen(path_in("rt.h5"), "rb"), *out = fopen(path_in("trunc.h5"), "wb");
        if (in && out) {
            fseek(in, 0, SEEK_END);
            long size = ftell(in);
            fseek(in, 0, SEEK_SET);
            char *buf = malloc((size_t)size);
            if (buf && fread(buf, 1, (size_t)size, in) == (size_t)size)
                fwrite(buf, 1, (size_t)size / 2, out);
            free(buf);
        }
        if (in)
            fclose(in);
        if (out)
            fclose(out);
        /* an HDF5 file of another program */
        hid_t h = H5Fcreate(path_in("other.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        if (h >= 0)
            H5Fclose(h);
    }
    dt_barrier();
    dt_checkpoint_free(bad);
    bad = NULL;
    dt_checkpoint_create(&bad);
    dt_checkpoint_add_variable(bad, "f32/layout_0", good);
    s = dt_checkpoint_read(bad, path_in("foreign.h5"));
    tap_check(s == DT_ERR_IO && strstr(dt_last_error(), "foreign.h5") &&
                  strstr(dt_last_error(), "not a readable HDF5 file"),
              "a foreign file: DT_ERR_IO naming it");
    tap_diag("%s", dt_last_error());
    s = dt_checkpoint_read(bad, path_in("trunc.h5"));
    tap_check(s == DT_ERR_IO && strstr(dt_last_error(), "trunc.h5"),
              "a truncated file: DT_ERR_IO naming it");
    tap_diag("%s", dt_last_error());
    s = dt_checkpoint_read(bad, path_in("other.h5"));
    tap_check(s == DT_ERR_IO && strstr(dt_last_error(), "not a dtensor checkpoint"),
              "an HDF5 file without the format attribute: DT_ERR_IO");
    s = dt_checkpoint_read(bad, path_in("missing.h5"));
    tap_check(s == DT_ERR_IO && strstr(dt_last_error(), "missing.h5"),
              "a missing file: DT_ERR_IO naming it");
    tap_check(tensor_is(dt_variable_value(good), zeros, sizeof zeros),
              "after every failed read the variable is unchanged");
    s = dt_checkpoint_write(bad, path_in("no/such/dir/x.h5"));
    tap_check(s == DT_ERR_IO && strstr(dt_last_error(), "x.h5.tmp"),
              "writing into a missing directory: DT_ERR_IO naming the file");
    tap_diag("%s", dt_last_error());
    dt_checkpoint_free(bad);
    dt_variable_free(good);
    dt_variable_free(wrong);
    dt_tensor_free(z);
    dt_tensor_free(w);

    for (int k = 0; k < n; k++) {
        if (vars)
            dt_variable_free(vars[k]);
        if (back)
            dt_variable_free(back[k]);
        if (host)
            free(host[k]);
    }
    for (int j = 0; j < 3; j++)
        dt_variable_free(extra[j]);
    dt_tensor_free(part);
    dt_tensor_free(full);
    free(vars);
    free(back);
    free(host);
    dt_checkpoint_free(ck);
    dt_checkpoint_free(ck2);
}

/* ---- training resumed --------------------------------------------------------------------- */

enum { IN = 4, HID = 8, OUT = 3, B = 12, STEPS = 8, CUT = 4 };

static void batch(int step, double x[B][IN], double y[B][OUT])
{
    for (int e = 0; e < B; e++) {
        int r = step * B + e, cls = r % OUT;
        for (int j = 0; j < IN; j++)
            x[e][j] = (j == cls ? 1.0 : 0.0) +
                      (double)(mix((uint64_t)r * 31 + (uint64_t)j) % 1000) / 2000.0;
        for (int k = 0; k < OUT; k++)
            y[e][k] = k == cls;
    }
}

typedef struct run {
    dt_strategy *s;
    dt_model *m;
    dt_optimizer *o;
    dt_generator *g;
    dt_checkpoint *ck;
    int64_t step;
} run;

static dt_status run_open(run *r, uint64_t seed)
{
    static const dt_dense_config layers[2] = {
        {.units = HID, .activation = DT_ACTIVATION_TANH, .l2 = 1e-3},
        {.units = OUT},
    };
    memset(r, 0, sizeof *r);
    dt_optimizer_config oc = {.kind = DT_OPTIMIZER_ADAM, .learning_rate = 0.05};
    DT_TRY(dt_strategy_create(DT_STRATEGY_MULTI_WORKER_MIRRORED, NULL, &r->s));
    DT_TRY(dt_strategy_scope_enter(r->s));
    dt_status st = dt_model_create(IN, 2, layers, DT_DTYPE_F64, seed, &r->m);
    dt_strategy_scope_exit(r->s);
    DT_TRY(st);
    DT_TRY(dt_optimizer_create(&oc, &r->o));
    DT_TRY(dt_generator_create(seed * 7 + 1, &r->g));
    DT_TRY(dt_checkpoint_create(&r->ck));
    DT_TRY(dt_checkpoint_add_model(r->ck, "model", r->m));
    DT_TRY(dt_checkpoint_add_optimizer(r->ck, "optimizer", r->o));
    DT_TRY(dt_checkpoint_add_generator(r->ck, "noise", r->g));
    DT_TRY(dt_checkpoint_add_counter(r->ck, "step", &r->step));
    return dt_checkpoint_set_metadata(r->ck, "note", "resume test");
}

static void run_close(run *r)
{
    dt_checkpoint_free(r->ck);
    dt_generator_free(r->g);
    dt_optimizer_free(r->o);
    dt_model_free(r->m);
    dt_strategy_free(r->s);
}

/* One step: the batch plus noise drawn from the generator (a random op after the restore
 * must continue the stream), then the training step. */
static dt_status run_step(run *r, double *loss)
{
    double x[B][IN], y[B][OUT];
    batch((int)r->step, x, y);
    dt_tensor *xt = NULL, *yt = NULL, *noise = NULL, *xn = NULL;
    dt_layout li;
    DT_TRY(dt_strategy_input_layout(r->s, 2, &li));
    dt_op_options o = {.layout = &li};
    dt_status s =
        dt_strategy_distribute_batch(r->s, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, x, sizeof x, &xt);
    if (s == DT_OK)
        s = dt_strategy_distribute_batch(r->s, DT_DTYPE_F64, 2, (int64_t[]){B, OUT}, y, sizeof y,
                                         &yt);
    if (s == DT_OK)
        s = dt_generator_normal(r->g, DT_DTYPE_F64, 2, (int64_t[]){B, IN}, 0.0, 0.3, &o, &noise);
    if (s == DT_OK)
        s = dt_binary(DT_BINARY_ADD, xt, noise, &o, &xn);
    if (s == DT_OK)
        s = dt_model_train_step(r->s, r->m, DT_LOSS_SOFTMAX_CROSS_ENTROPY, r->o, xn, yt, loss);
    if (s == DT_OK)
        r->step++;
    dt_tensor_free(xt);
    dt_tensor_free(yt);
    dt_tensor_free(noise);
    dt_tensor_free(xn);
    return s;
}

static void test_resume(void)
{
    double straight[STEPS] = {0}, resumed[STEPS] = {0};
    run r;
    bool ok = run_open(&r, 3) == DT_OK;
    for (int t = 0; ok && t < STEPS; t++)
        ok = run_step(&r, &straight[t]) == DT_OK;
    run_close(&r);
    tap_check(ok, "resume: %d steps without a stop", STEPS);

    char mdir[512];
    snprintf(mdir, sizeof mdir, "%s/train", dir);
    dt_checkpoint_manager *mg = NULL;
    const char *saved = NULL;
    ok = run_open(&r, 3) == DT_OK && dt_checkpoint_manager_create(r.ck, mdir, 2, &mg) == DT_OK;
    for (int t = 0; ok && t < CUT; t++)
        ok = run_step(&r, &resumed[t]) == DT_OK &&
             dt_checkpoint_manager_save(mg, -1, &saved) == DT_OK; /* ckpt-1 .. ckpt-4 */
    tap_check(ok && saved && strstr(saved, "ckpt-4.h5") &&
                  dt_checkpoint_manager_num_checkpoints(mg) == 2 &&
                  strstr(dt_checkpoint_manager_checkpoint(mg, 0), "ckpt-3.h5") &&
                  !strcmp(dt_checkpoint_manager_latest(mg), saved),
              "manager: 4 saves keep the newest 2 (ckpt-3, ckpt-4)");
    struct stat st;
    char p[600];
    snprintf(p, sizeof p, "%s/ckpt-2.h5", mdir);
    tap_check(stat(p, &st) != 0, "manager: ckpt-2.h5 was deleted");
    dt_checkpoint_manager_free(mg);
    mg = NULL;
    run_close(&r);

    /* a new process's view: other seeds, everything from the latest checkpoint */
    char latest[600];
    ok = dt_checkpoint_latest(mdir, latest, sizeof latest) == DT_OK && strstr(latest, "ckpt-4.h5");
    tap_check(ok, "latest_checkpoint finds ckpt-4.h5");
    ok = ok && run_open(&r, 99) == DT_OK &&
         dt_checkpoint_manager_create(r.ck, mdir, 2, &mg) == DT_OK &&
         !strcmp(dt_checkpoint_manager_latest(mg), latest) &&
         dt_checkpoint_read(r.ck, latest) == DT_OK;
    uint64_t seed = 0, counter = 0;
    dt_generator_state(r.g, &seed, &counter);
    tap_check(ok && r.step == CUT && dt_optimizer_iterations(r.o) == CUT && seed == 3 * 7 + 1 &&
                  counter == CUT && dt_checkpoint_save_counter(r.ck) == CUT &&
                  dt_checkpoint_metadata(r.ck, "note") &&
                  !strcmp(dt_checkpoint_metadata(r.ck, "note"), "resume test"),
              "resume: step, iterations, generator state, save counter and metadata restored");
    for (int t = CUT; ok && t < STEPS; t++)
        ok = run_step(&r, &resumed[t]) == DT_OK;
    ok = ok && dt_checkpoint_manager_save(mg, -1, &saved) == DT_OK && strstr(saved, "ckpt-5.h5");
    tap_check(ok, "resume: steps %d..%d after the restore, and the manager numbers on (ckpt-5)",
              CUT, STEPS - 1);
    bool same = ok;
    for (int t = 0; t < STEPS; t++) {
        if (memcmp(&straight[t], &resumed[t], sizeof straight[t]))
            same = false;
        tap_diag("step %d: loss %.17g %s %.17g", t, straight[t],
                 memcmp(&straight[t], &resumed[t], sizeof straight[t]) ? "!=" : "==", resumed[t]);
    }
    tap_check(same, "resume: every loss bitwise as the run that never stopped");
    dt_checkpoint_manager_free(mg);
    run_close(&r);
}

/* ---- the resharding set (save / restore across runs) -------------------------------------- */

typedef struct spec {
    const char *name;
    dt_dtype dtype;
    int rank;
    int64_t shape[3];
    const char *saved; /* layout on the save mesh ("x=2,y=2" or "x") */
} spec;

static const spec set[] = {
    {"a", DT_DTYPE_F32, 2, {6, 4}, "x,y"},
    {"b", DT_DTYPE_F32, 2, {5, 7}, "y,x"},
    {"c", DT_DTYPE_F64, 2, {7, 3}, "x,unsharded"},
    {"d", DT_DTYPE_I32, 2, {4, 5}, "unsharded,y"},
    {"e", DT_DTYPE_I64, 1, {9}, "x"},
    {"s", DT_DTYPE_F32, 0, {0}, ""},
    {"r3", DT_DTYPE_F64, 3, {3, 5, 2}, "unsharded,x,y"},
    {"empty", DT_DTYPE_I32, 2, {0, 3}, "x,unsharded"},
    {"rep", DT_DTYPE_I64, 2, {3, 3}, "unsharded,unsharded"},
    {"h", DT_DTYPE_F16, 2, {5, 3}, "y,x"},
    {"bf", DT_DTYPE_BF16, 1, {7}, "x"},
    {"bl", DT_DTYPE_BOOL, 2, {3, 4}, "x,unsharded"},
    {"u8", DT_DTYPE_U8, 2, {4, 6}, "unsharded,y"},
    {"i8", DT_DTYPE_I8, 1, {5}, "y"},
};
#define NSET ((int)(sizeof set / sizeof set[0]))

static size_t spec_bytes(const spec *p)
{
    int64_t n = 1;
    for (int a = 0; a < p->rank; a++)
        n *= p->shape[a];
    return (size_t)n * dt_dtype_size(p->dtype);
}

static void kill_hook(int item)
{
    const char *after = getenv("DTENSOR_TEST_KILL_AFTER");
    const char *rank = getenv("DTENSOR_TEST_KILL_RANK");
    if (after && item == atoi(after) && dt_client_id() == (rank ? atoi(rank) : 1))
        raise(SIGKILL);
}

static int mode_save(const char *path, int salt)
{
    bool two_d = dt_mesh_num_axes(mesh) == 2;
    dt_checkpoint *ck = NULL;
    dt_variable *v[NSET] = {0};
    bool ok = dt_checkpoint_create(&ck) == DT_OK;
    for (int k = 0; ok && k < NSET; k++) {
        const spec *p = &set[k];
        size_t bytes = spec_bytes(p);
        void *h = malloc(bytes ? bytes : 1);
        fill_bytes(h, bytes, k, salt);
        char text[64];
        snprintf(text, sizeof text, "%s", p->saved);
        if (!two_d) /* a 1-D save mesh: y becomes unsharded */
            for (char *q = strstr(text, "y"); q; q = strstr(text, "y")) {
                memmove(q + 9, q + 1, strlen(q + 1) + 1);
                memcpy(q, "unsharded", 9);
            }
        dt_layout l;
        dt_tensor *t = NULL;
        ok = (p->rank ? dt_layout_parse(mesh, text, &l) : dt_layout_replicated(mesh, 0, &l)) ==
                 DT_OK &&
             dt_tensor_from_host(&l, p->dtype, p->rank, p->shape, h, bytes, &t) == DT_OK &&
             dt_variable_create(t, &v[k]) == DT_OK &&
             dt_checkpoint_add_variable(ck, p->name, v[k]) == DT_OK;
        dt_tensor_free(t);
        free(h);
    }
    int64_t step = 1000 + salt;
    ok = ok && dt_checkpoint_add_counter(ck, "step", &step) == DT_OK;
    if (getenv("DTENSOR_TEST_KILL_AFTER"))
        dt__checkpoint_test_hook = kill_hook;
    ok = ok && dt_checkpoint_write(ck, path) == DT_OK;
    tap_check(ok, "saved %d tensors (salt %d) from %d devices of %d clients", NSET, salt,
              dt_mesh_size(mesh), dt_num_clients());
    for (int k = 0; k < NSET; k++)
        dt_variable_free(v[k]);
    dt_checkpoint_free(ck);
    return ok;
}

static int mode_restore(const char *path, int salt)
{
    bool all = true;
    /* every layout of each tensor, as a tensor, compared to the host formula */
    for (int k = 0; k < NSET; k++) {
        const spec *p = &set[k];
        size_t bytes = spec_bytes(p);
        void *h = malloc(bytes ? bytes : 1);
        fill_bytes(h, bytes, k, salt);
        dt_layout ls[MAXL];
        int nl = all_layouts(mesh, p->rank, ls, MAXL);
        bool ok = nl > 0;
        for (int j = 0; ok && j < nl; j++) {
            dt_tensor *t = NULL;
            char name[64];
            snprintf(name, sizeof name, "variables/%s", p->name);
            ok = dt_checkpoint_read_tensor(path, name, &ls[j], &t) == DT_OK &&
                 dt_layout_equal(dt_tensor_layout(t), &ls[j]) && tensor_is(t, h, bytes);
            dt_tensor_free(t);
        }
        tap_check(ok,
                  "%s (%s, rank %d) read into each of its %d layouts on %d devices of %d "
                  "clients, bitwise",
                  p->name, dt_dtype_name(p->dtype), p->rank, nl, dt_mesh_size(mesh),
                  dt_num_clients());
        all = all && ok;
        free(h);
    }
    /* into variables of the last layout of each, with the counter */
    dt_checkpoint *ck = NULL;
    dt_variable *v[NSET] = {0};
    int64_t step = -1;
    bool ok =
        dt_checkpoint_create(&ck) == DT_OK && dt_checkpoint_add_counter(ck, "step", &step) == DT_OK;
    for (int k = 0; ok && k < NSET; k++) {
        const spec *p = &set[k];
        dt_layout ls[MAXL];
        int nl = all_layouts(mesh, p->rank, ls, MAXL);
        dt_op_options o = {.layout = &ls[nl - 1]};
        dt_tensor *z = NULL;
        ok = dt_zeros(p->dtype, p->rank, p->shape, &o, &z) == DT_OK &&
             dt_variable_create(z, &v[k]) == DT_OK &&
             dt_checkpoint_add_variable(ck, p->name, v[k]) == DT_OK;
        dt_tensor_free(z);
    }
    ok = ok && dt_checkpoint_read(ck, path) == DT_OK && step == 1000 + salt;
    for (int k = 0; ok && k < NSET; k++) {
        size_t bytes = spec_bytes(&set[k]);
        void *h = malloc(bytes ? bytes : 1);
        fill_bytes(h, bytes, k, salt);
        ok = tensor_is(dt_variable_value(v[k]), h, bytes);
        free(h);
    }
    tap_check(ok, "every tensor restored into variables (and the step counter) bitwise");
    for (int k = 0; k < NSET; k++)
        dt_variable_free(v[k]);
    dt_checkpoint_free(ck);
    return all && ok;
}

int main(int argc, char **argv)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int n = dt_num_global_devices(DT_DEVICE_CPU);
    const char *mode = argc > 1 ? argv[1] : "all";
    const char *ms = n == 4 && strcmp(mode, "restore") ? "x=2,y=2" : n == 6 ? "x=3,y=2" : NULL;
    char one[32];
    snprintf(one, sizeof one, "x=%d", n);
    bool ok = dt_mesh_create_from_string(ms ? ms : one, DT_DEVICE_CPU, &mesh) == DT_OK;
    tap_check(ok, "mesh %s over %d devices of %d clients", ms ? ms : one, n, dt_num_clients());
    if (ok && !strcmp(mode, "all")) {
        /* one scratch directory for every client: client 0 names it */
        char name[sizeof dir] = {0};
        if (dt_client_id() == 0) {
            snprintf(name, sizeof name, "/tmp/dtensor-ckpt-XXXXXX");
            if (!mkdtemp(name))
                name[0] = 0;
        }
        char *all = malloc(sizeof name * (size_t)dt_num_clients());
        ok = all && dt_client_allgather(name, sizeof name, all) == DT_OK && all[0];
        if (ok)
            memcpy(dir, all, sizeof dir);
        free(all);
        tap_check(ok, "scratch directory %s", dir);
        if (ok) {
            test_round_trips();
            test_resume();
        }
        dt_barrier();
        if (dt_client_id() == 0 && dir[0]) {
            char cmd[600];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", dir);
        }
    } else if (ok && argc == 4 && !strcmp(mode, "save")) {
        mode_save(argv[2], atoi(argv[3]));
    } else if (ok && argc == 4 && !strcmp(mode, "restore")) {
        mode_restore(argv[2], atoi(argv[3]));
    } else if (ok) {
        tap_check(false, "usage: %s [save|restore PATH SALT]", argv[0]);
    }
    dt_mesh_free(mesh);
    int rc = tap_done();
    if (dt_finalize() != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        rc = 1;
    }
    return rc;
}
