/* Clients that disagree inside an op: the last client passes something else (a bad shape, a
 * NULL, another result layout, an operand of another layout or shape, another seed, a value
 * of another layout to a variable, an input of another layout to a function). Every client
 * must fail the op alike -- the failing client with its own message, the others naming it, or
 * all with DT_ERR_MISMATCH naming both ops -- never hang, never return DT_OK with wrong
 * values; and the next op must run normally on every client. */
#include "dt.h"
#include "tap.h"

#include <stdio.h>
#include <string.h>

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

/* Every client got `want` (the odd one `want_odd`), and the message names the odd client or
 * the mismatch, on every client. */
static void expect_all(dt_status got, dt_status want, dt_status want_odd, const char *needle,
                       const char *what)
{
    dt_status w = odd ? want_odd : want;
    tap_check(got == w, "%s: %s on every client (client %d got %s: %s)", what, dt_status_name(w),
              me, dt_status_name(got), dt_last_error());
    tap_check(odd || !needle || strstr(dt_last_error(), needle), "%s: the message says \"%s\": %s",
              what, needle ? needle : "", dt_last_error());
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
    if (dt_init(NULL) != DT_OK) {
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
    dt_status s = dt_matmul(a, b, NULL, &c);
    expect_all(s, DT_ERR_SHAPE, DT_ERR_SHAPE, client, "a bad matmul on one client");
    tap_check(!c, "no result on any client");
    dt_tensor_free(b);
    still_works("a bad matmul");

    /* 2. the odd client passes a NULL operand, then a NULL out-pointer */
    b = ones("unsharded,x", 2, 4);
    s = dt_matmul(a, odd ? NULL : b, NULL, &c);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL operand on one client");
    dt_tensor_free(c);
    c = NULL;
    s = dt_matmul(a, b, NULL, odd ? NULL : &c);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a NULL out-pointer on one client");
    dt_tensor_free(c);
    c = NULL;
    still_works("NULL arguments");

    /* 3. the odd client requests another result layout: a mismatch, not a wrong product */
    dt_layout lx, ly;
    dt_layout_parse(m, "x,unsharded", &lx);
    dt_layout_parse(m, "unsharded,x", &ly);
    s = dt_matmul(a, b, &(dt_op_options){.layout = odd ? &ly : &lx}, &c);
    expect_all(s, DT_ERR_MISMATCH, DT_ERR_MISMATCH, "clients differ",
               "another result layout on one client");
    tap_check(!c, "no result on any client");
    still_works("another result layout");

    /* 4. an operand of another layout, then of another shape, on the odd client */
    dt_tensor *b2 = odd ? ones("x,unsharded", 2, 4) : ones("unsharded,x", 2, 4);
    s = dt_matmul(a, b2, NULL, &c);
    expect_all(s, DT_ERR_MISMATCH, DT_ERR_MISMATCH, "\"x,unsharded\"",
               "an operand of another layout on one client");
    dt_tensor_free(b2);
    b2 = ones("unsharded,x", 2, odd ? 5 : 4);
    s = dt_matmul(a, b2, NULL, &c);
    expect_all(s, DT_ERR_MISMATCH, DT_ERR_MISMATCH, "[2,5]",
               "an operand of another shape on one client");
    dt_tensor_free(b2);
    still_works("operands of another layout and shape");

    /* 5. another seed on the odd client */
    dt_tensor *r = NULL;
    s = dt_random_uniform(DT_DTYPE_F32, 2, (int64_t[]){4, 4}, odd ? 8 : 7, 0, 0.0, 1.0,
                          &(dt_op_options){.layout = &lx}, &r);
    expect_all(s, DT_ERR_MISMATCH, DT_ERR_MISMATCH, "clients differ",
               "another random seed on one client");
    dt_tensor_free(r);

    /* 6. a variable: the odd client assigns a value of another layout; the variable keeps its
     * value on every client */
    dt_tensor *v0 = ones("x,unsharded", 4, 4), *w = ones(odd ? "unsharded,x" : "x,unsharded", 4, 4);
    dt_variable *var = NULL;
    tap_check(dt_variable_create(v0, &var) == DT_OK, "variable");
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
    s = dt_function_run(f, 1, (const dt_tensor *const[]){in}, 1, &res);
    expect_all(s, DT_ERR_ARG, DT_ERR_ARG, client, "a function input of another layout");
    dt_tensor_free(res);
    dt_tensor_free(in);
    dt_tensor_free(xs);
    dt_tensor_free(ys);
    dt_function_free(f);
    still_works("a bad function input");

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
