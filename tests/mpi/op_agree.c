/* Clients that disagree inside an op: the last client passes something else (a bad shape, a
 * NULL, another result layout, an operand of another layout or shape, another seed, a value
 * of another layout to a variable, an input of another layout to a function, a NULL tensor to
 * read, an op on another mesh of the same axes, another call altogether) or skips an op. Every
 * client must fail the call alike -- the failing client with its own message, the others
 * naming it, or all with DT_ERR_MISMATCH naming the first field that differs and the clients
 * -- within 5 s (DTENSOR_TIMEOUT is 5 s here, so a wait for a client that never comes fails
 * the check too), never hang, never return DT_OK with wrong values; and the next call must
 * run normally on every client. */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int me, n, odd; /* odd: this client is the one that disagrees */
static dt_mesh *m;

/* A tensor of ones built from host memory: no communication and no agreement, so each
 * client may build its own (the disagreement under test is in the op that uses them). */
static dt_tensor *ones(const char *layout, int64_t r, int64_t c)
{
    dt_layout l;
    dt_tensor *t = NULL;
    static float host[64];
    for (int i = 0; i < 64; i++)
        host[i] = 1.0f;
    if (r * c > 64 || dt_layout_parse(m, layout, &l) != DT_OK ||
        dt_tensor_from_host(&l, DT_DTYPE_F32, 2, (int64_t[]){r, c}, host,
                            sizeof(float) * (size_t)(r * c), &t) != DT_OK)
        tap_diag("ones %s [%lld,%lld]: %s", layout, (long long)r, (long long)c, dt_last_error());
    return t;
}

static double t_start;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Start timing the call under test. */
static void start(void)
{
    t_start = now();
}

/* Every client got `want` (the odd one `want_odd`) within 5 s of start(), and the message
 * names the odd client or the mismatch, on every client. */
static void expect_all(dt_status got, dt_status want, dt_status want_odd, const char *needle,
                       const char *what)
{
    double took = now() - t_start;
    dt_status w = odd ? want_odd : want;
    tap_check(got == w && took < 5.0,
              "%s: %s on every client within 5 s (client %d got %s after "
              "%.3f s: %s)",
              what, dt_status_name(w), me, dt_status_name(got), took, dt_last_error());
    tap_check(odd || !needle || strstr(dt_last_error(), needle), "%s: the message says \"%s\": %s",
              what, needle ? needle : "", dt_last_error());
}

/* A mismatch: every client names the field, and the odd client by number. */
static void expect_field(dt_status got, const char *field, const char *what)
{
    char in[96], who[32];
    snprintf(in, sizeof in, "clients differ in %s: client 0 has ", field);
    snprintf(who, sizeof who, "client %d has ", n - 1);
    expect_all(got, DT_ERR_MISMATCH, DT_ERR_MISMATCH, in, what);
    tap_check(strstr(dt_last_error(), who) != NULL, "%s: every client names client %d: %s", what,
              n - 1, dt_last_error());
}

/* The next op after a failure runs on every client with the right values. */
static void still_works(const char *after)
{
    dt_tensor *a = ones("unsharded,x", 2, n * 2), *b = ones("x,unsharded", n * 2, 2), *c = NULL;
    float got[4] = {0};
    bool ok = dt_matmul(a, b, NULL, &c) == DT_OK && dt_tensor_read(c, got, sizeof got) == DT_OK;
    for (int i = 0; ok && i < 4; i++)
        ok = got[i] == (float)(n * 2);
    tap_check(ok, "after %s, the next matmul runs on every client: %s", after,
              ok ? "" : dt_last_error());
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
}

int main(void)
{
    if (dt_init(&(dt_init_options){.timeout_seconds = 5}) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    me = dt_client_id();
    n = dt_num_clients();
    odd = me == n - 1;
    char spec[32], client[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    snprintf(client, sizeof client, "client %d", n - 1);
    tap_check(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) == DT_OK, "mesh %s", spec);

    /* 1. the odd client's matmul has mismatched contracting extents */
    dt_tensor *a = ones("x,unsharded", 4, 2), *b = ones("unsharded,x", odd ? 3 : 2, 4), *c = NULL;
    start();
    dt_status s = dt_matmul(a, b, NULL, &c);
    expect_all(s, DT_ERR_SHAPE, DT_ERR_SHAPE, client, "a bad matmul on one client");
    tap_check(!c, "no result on any client");
    dt_tensor_free(b);
    still_works("a bad matmul");

    /* 2. the odd client passes a NULL operand, then a NULL out-pointer */
    b = ones("unsharded,x", 2, 4);
    start();
    s = dt_matmul(a, odd ? NULL : b, NULL, &c);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL operand on one client");
    dt_tensor_free(c);
    c = NULL;
    start();
    s = dt_matmul(a, b, NULL, odd ? NULL : &c);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL out-pointer on one client");
    dt_tensor_free(c);
    c = NULL;
    still_works("NULL arguments");

    /* 3. the odd client requests another result layout: a mismatch, not a wrong product */
    dt_layout lx, ly;
    dt_layout_parse(m, "x,unsharded", &lx);
    dt_layout_parse(m, "unsharded,x", &ly);
    start();
    s = dt_matmul(a, b, &(dt_op_options){.layout = odd ? &ly : &lx}, &c);
    expect_field(s, "result layout", "another result layout on one client");
    tap_check(!c, "no result on any client");
    still_works("another result layout");

    /* 4. an operand of another layout, then of another shape, on the odd client */
    dt_tensor *b2 = odd ? ones("x,unsharded", 2, 4) : ones("unsharded,x", 2, 4);
    start();
    s = dt_matmul(a, b2, NULL, &c);
    expect_field(s, "operand 1 layout", "an operand of another layout on one client");
    tap_check(strstr(dt_last_error(), "\"x,unsharded\""), "both layouts named: %s",
              dt_last_error());
    dt_tensor_free(b2);
    b2 = ones("unsharded,x", 2, odd ? 5 : 4);
    start();
    s = dt_matmul(a, b2, NULL, &c);
    expect_field(s, "operand 1 shape", "an operand of another shape on one client");
    tap_check(strstr(dt_last_error(), "[2,4]") && strstr(dt_last_error(), "[2,5]"),
              "both shapes named: %s", dt_last_error());
    dt_tensor_free(b2);
    still_works("operands of another layout and shape");

    /* 5. another seed on the odd client */
    dt_tensor *r = NULL;
    start();
    s = dt_random_uniform(DT_DTYPE_F32, 2, (int64_t[]){4, 4}, odd ? 8 : 7, 0, 0.0, 1.0,
                          &(dt_op_options){.layout = &lx}, &r);
    expect_field(s, "seed", "another random seed on one client");
    dt_tensor_free(r);
    r = NULL;
    start();
    s = dt_random_uniform(DT_DTYPE_F32, 2, (int64_t[]){4, 4}, 7, odd ? 3 : 0, 0.0, 1.0,
                          &(dt_op_options){.layout = &lx}, &r);
    expect_field(s, "key", "another random key on one client");
    dt_tensor_free(r);

    /* 6. a variable: the odd client assigns a value of another layout; the variable keeps its
     * value on every client */
    dt_tensor *v0 = ones("x,unsharded", 4, 4), *w = ones(odd ? "unsharded,x" : "x,unsharded", 4, 4);
    dt_variable *var = NULL;
    tap_check(dt_variable_create(v0, &var) == DT_OK, "variable");
    start();
    s = dt_variable_assign(var, w);
    expect_all(s, DT_ERR_LAYOUT, DT_ERR_LAYOUT, client, "a variable assigned another layout");
    float got[16] = {0};
    bool same = dt_tensor_read(dt_variable_value(var), got, sizeof got) == DT_OK;
    for (int i = 0; same && i < 16; i++)
        same = got[i] == 1.0f;
    tap_check(same, "the variable keeps its value on every client");
    dt_variable_free(var);
    dt_tensor_free(w);
    dt_tensor_free(v0);

    /* 7. a function run with an input of another layout on the odd client */
    dt_function *f = NULL;
    dt_tensor *xs = NULL, *ys = NULL;
    bool traced = dt_function_begin(&f) == DT_OK &&
                  dt_function_input(f, &lx, DT_DTYPE_F32, 2, (int64_t[]){4, 2}, &xs) == DT_OK &&
                  dt_unary(DT_UNARY_RELU, xs, NULL, &ys) == DT_OK &&
                  dt_function_end(f, 1, &ys) == DT_OK;
    tap_check(traced, "a traced function: %s", traced ? "" : dt_last_error());
    dt_tensor *in = odd ? ones("unsharded,x", 4, 2) : ones("x,unsharded", 4, 2), *res = NULL;
    start();
    s = dt_function_run(f, 1, (const dt_tensor *const[]){in}, 1, &res);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a function input of another layout");
    dt_tensor_free(res);
    dt_tensor_free(in);
    dt_tensor_free(xs);
    dt_tensor_free(ys);
    dt_function_free(f);
    still_works("a bad function input");

    /* 8. the odd client reads a NULL tensor; then runs an op whose only operand is NULL, so
     * it cannot tell the mesh: it agrees with every client all the same */
    start();
    s = dt_tensor_read(odd ? NULL : a, got, sizeof got);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL tensor read on one client");
    start();
    s = dt_unary(DT_UNARY_NEG, odd ? NULL : a, NULL, &c);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL only operand on one client");
    tap_check(!c, "no result on any client");
    still_works("NULL tensors");

    /* 9. the same op on another mesh of the same axes (another communicator): a mismatch */
    dt_mesh *m2 = NULL;
    tap_check(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m2) == DT_OK, "a second mesh %s",
              spec);
    dt_layout l2;
    dt_layout_parse(m2, "x,unsharded", &l2);
    start();
    s = dt_ones(DT_DTYPE_F32, 2, (int64_t[]){4, 4}, &(dt_op_options){.layout = odd ? &l2 : &lx},
                &c);
    expect_field(s, "mesh", "an op on a mesh of the same axes but another identity");
    dt_tensor_free(c);
    c = NULL;
    dt_mesh_free(m2);

    /* 10. another call altogether: the odd client's barrier meets the others' matmul */
    start();
    s = odd ? dt_barrier() : dt_matmul(a, b, NULL, &c);
    expect_field(s, "operation", "a barrier on one client, a matmul on the others");
    tap_check(strstr(dt_last_error(), "dt_barrier") && strstr(dt_last_error(), "matmul"),
              "both calls named: %s", dt_last_error());
    dt_tensor_free(c);
    c = NULL;
    still_works("another call");

    /* 11. with the collective check on, the odd client skips a matmul (its contracting axis is
     * sharded: an all-reduce). Every call after it fails clearly on every client or succeeds in
     * step, and clients get back in step by calling dt_barrier until it succeeds. */
    dt__rt.check_collectives =
        true; /* as DTENSOR_CHECK_COLLECTIVES=1 at dt_init, on every client */
    dt_tensor *ka = ones("unsharded,x", 2, n * 2), *kb = ones("x,unsharded", n * 2, 2), *kc = NULL;
    dt_status first = DT_OK, second, third;
    start();
    if (!odd)
        first = dt_matmul(ka, kb, NULL, &kc); /* the odd client skips it */
    dt_tensor_free(kc);
    kc = NULL;
    float kg[4] = {0};
    second = dt_matmul(ka, kb, NULL, &kc);
    third = dt_tensor_read(kc, kg, sizeof kg);
    /* the others' skipped matmul met the odd client's next one (the same op: it ran); their
     * next matmul met the odd client's read (a mismatch on both); their read of the matmul
     * that failed (NULL: DT_ERR_ARG) met the odd client's first barrier, which fails naming
     * them; their first barrier meets the odd client's second: in step again */
    int tries = 0;
    dt_status back;
    do
        back = dt_barrier();
    while (back != DT_OK && ++tries < 4);
    double took = now() - t_start;
    dt__rt.check_collectives = false;
    tap_check(first == DT_OK && (odd ? second == DT_OK : second == DT_ERR_MISMATCH) &&
                  third == (odd ? DT_ERR_MISMATCH : DT_ERR_ARG) && back == DT_OK &&
                  tries == (odd ? 1 : 0) && took < 5.0,
              "a skipped matmul: every later call fails clearly or runs in step, a barrier "
              "brings the clients back in step (client %d: %s, %s, %s, %d barriers failed; "
              "%.3f s)",
              me, dt_status_name(first), dt_status_name(second), dt_status_name(third), tries,
              took);
    dt_tensor_free(kc);
    dt_tensor_free(ka);
    dt_tensor_free(kb);
    still_works("a skipped op");

    /* 2b. the odd client's arguments fail before the op is recorded (a NULL list, a count out
     * of range): every client fails with it, in every op that checks its own arguments */
    {
        const dt_tensor *pair[2] = {a, a};
        const int64_t begin[2] = {0, 0}, size[2] = {1, 1}, mult[2] = {1, 2};
        const int axes[1] = {1};
        dt_tensor *parts[2] = {NULL, NULL};
        start(); /* all ten within the 5 s */
        struct {
            const char *what;
            dt_status want;
            dt_status got;
        } cs[] = {
            {"slice with begin NULL", DT_ERR_ARG, dt_slice(a, odd ? NULL : begin, size, NULL, &c)},
            {"split with outs NULL", DT_ERR_ARG, dt_split(a, 2, NULL, 1, NULL, odd ? NULL : parts)},
            {"pad with before NULL", DT_ERR_ARG, dt_pad(a, odd ? NULL : begin, size, 0, NULL, &c)},
            {"tile with multiples NULL", DT_ERR_ARG, dt_tile(a, odd ? NULL : mult, NULL, &c)},
            {"broadcast_to of rank -1", DT_ERR_SHAPE,
             dt_broadcast_to(a, odd ? -1 : 2, (const int64_t[]){4, 2}, NULL, &c)},
            {"stack of 0 operands", DT_ERR_ARG, dt_stack(odd ? 0 : 2, pair, 0, NULL, &c)},
            {"einsum with a NULL operand", DT_ERR_ARG,
             dt_einsum("ij,kj->ik", 2, odd ? (const dt_tensor *[]){a, NULL} : pair, NULL, &c)},
            {"einsum with a bad equation", DT_ERR_ARG,
             dt_einsum(odd ? "ij,jk->iq" : "ij,kj->ik", 2, pair, NULL, &c)},
            {"squeeze of an axis of extent 2", DT_ERR_SHAPE,
             dt_squeeze(a, odd ? 1 : 0, odd ? axes : NULL, NULL, &c)},
            {"logsumexp with axes NULL", DT_ERR_ARG,
             dt_logsumexp(a, 1, odd ? NULL : axes, 0, NULL, &c)},
        };
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) /* the calls ran in order */
            expect_all(cs[i].got, cs[i].want, cs[i].want, client, cs[i].what);
        dt_tensor_free(c);
        c = NULL;
        dt_tensor_free(parts[0]);
        dt_tensor_free(parts[1]);
        still_works("arguments failing before an op");
    }

    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_mesh_free(m);
    int rc = tap_done();
    if (dt_finalize() != DT_OK) {
        fprintf(stderr, "dt_finalize: %s\n", dt_last_error());
        rc = 1;
    }
    return rc;
}
