/* "DTensor as operands" and "DTensor as output" from the DTensor guide, as a C program.
 *
 * Six CPU devices on a 3x2 mesh (x=3, y=2): one client with 6 local devices, or
 * `mpiexec.mpich -n 2` clients with 3 devices each. The output is the same in every case.
 *
 *   matmul [[1,2,3],[4,5,6]] @ [[6,5],[4,3],[2,1]] = [[20,14],[56,41]] under three layouts,
 *   with the expanded program and its multiply count (72, 24, 12);
 *   ones, zeros and stateless random numbers created directly in a layout (call_with_layout);
 *   a variable with a fixed layout refusing a value of another layout.
 */
#include "dtensor.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(expr)                                                                  \
    do {                                                                             \
        dt_status s_ = (expr);                                                       \
        if (s_ != DT_OK) {                                                           \
            fprintf(stderr, "client %d: %s failed: %s: %s\n", dt_client_id(), #expr, \
                    dt_status_name(s_), dt_last_error());                            \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* Client 0 prints; the others stay quiet (every client computes the same thing). */
static FILE *out0(void)
{
    return dt_client_id() == 0 ? stdout : NULL;
}

static void say(const char *fmt, const char *arg)
{
    if (dt_client_id() == 0) {
        printf(fmt, arg);
        fflush(stdout);
    }
}

static void format_matrix(char *buf, size_t size, const float *v, int64_t rows, int64_t cols)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int64_t r = 0; r < rows; r++) {
        n += (size_t)snprintf(buf + n, size - n, "%s[", r ? ", " : "");
        for (int64_t c = 0; c < cols; c++)
            n += (size_t)snprintf(buf + n, size - n, "%s%g", c ? ", " : "", v[r * cols + c]);
        n += (size_t)snprintf(buf + n, size - n, "]");
    }
    snprintf(buf + n, size - n, "]");
}

static void print_global(const char *title, const dt_tensor *t)
{
    float v[64];
    char text[1024], lt[DT_STRING_MAX];
    const int64_t *s = dt_tensor_shape(t);
    CHECK(dt_tensor_read(t, v, sizeof v));
    CHECK(dt_layout_to_string(dt_tensor_layout(t), lt, sizeof lt));
    format_matrix(text, sizeof text, v, s[0], dt_tensor_rank(t) > 1 ? s[1] : 1);
    if (dt_client_id() == 0) {
        printf("%s: Layout(\"%s\"), value %s\n", title, lt, text);
        fflush(stdout);
    }
}

static dt_tensor *make(const dt_mesh *m, const char *layout_text, const float *v, int64_t rows,
                       int64_t cols)
{
    dt_layout l;
    dt_tensor *t;
    CHECK(dt_layout_parse(m, layout_text, &l));
    const int64_t shape[2] = {rows, cols};
    CHECK(dt_tensor_from_host(&l, DT_DTYPE_F32, 2, shape, v, sizeof(float) * (size_t)(rows * cols),
                              &t));
    return t;
}

static void matmul_case(const dt_mesh *m, const char *title, const char *la, const char *lb)
{
    static const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {6, 5, 4, 3, 2, 1};
    say("\n== %s ==\n", title);
    dt_tensor *ta = make(m, la, a, 2, 3), *tb = make(m, lb, b, 3, 2), *c;
    dt_op_options o = {.program = out0()};
    CHECK(dt_matmul(ta, tb, &o, &c));
    print_global("c = a @ b", c);
    dt_tensor_free(ta);
    dt_tensor_free(tb);
    dt_tensor_free(c);
}

static void create_case(const dt_mesh *m, const char *what, const char *layout_text)
{
    dt_layout l;
    CHECK(dt_layout_parse(m, layout_text, &l));
    const int64_t shape[2] = {6, 4};
    dt_op_options o = {.layout = &l};
    dt_tensor *t;
    if (strcmp(what, "ones") == 0)
        CHECK(dt_ones(DT_DTYPE_F32, 2, shape, &o, &t));
    else if (strcmp(what, "zeros") == 0)
        CHECK(dt_zeros(DT_DTYPE_F32, 2, shape, &o, &t));
    else
        CHECK(dt_random_uniform(DT_DTYPE_F32, 2, shape, 1234, 0, 0.0, 1.0, &o, &t));
    char title[64];
    snprintf(title, sizeof title, "%s (6x4)", what);
    int64_t local[DT_MAX_RANK];
    CHECK(dt_tensor_local_shape(t, 0, local));
    print_global(title, t);
    char text[128];
    snprintf(text, sizeof text, "  each device holds a %lldx%lld shard\n", (long long)local[0],
             (long long)local[1]);
    say("%s", text);
    dt_tensor_free(t);
}

int main(void)
{
    dt_init_options opts = {0};
    if (!getenv("DTENSOR_CPU_DEVICES")) {
        const char *size = getenv("PMI_SIZE");
        int clients = size ? atoi(size) : 1;
        opts.cpu_devices = clients > 0 && 6 % clients == 0 ? 6 / clients : 1;
    }
    CHECK(dt_init(&opts));
    dt_mesh *mesh = NULL;
    CHECK(dt_mesh_create_from_string("x=3,y=2", DT_DEVICE_CPU, &mesh));

    say("%s", "DTensor as operands: a = [[1,2,3],[4,5,6]], b = [[6,5],[4,3],[2,1]] on a 3x2 "
              "mesh\n");
    matmul_case(mesh, "fully replicated: every device multiplies the whole matrices",
                "unsharded,unsharded", "unsharded,unsharded");
    matmul_case(mesh, "contracting axis sharded on x: local products, then an all-reduce over x",
                "unsharded,x", "x,unsharded");
    matmul_case(mesh, "and a's rows on y: each device computes one row of partial sums", "y,x",
                "x,unsharded");

    say("%s", "\nDTensor as output (call_with_layout): created directly in their layouts\n");
    create_case(mesh, "ones", "x,unsharded");
    create_case(mesh, "zeros", "unsharded,y");
    create_case(mesh, "stateless_random_uniform", "x,y");
    create_case(mesh, "stateless_random_uniform", "unsharded,unsharded");

    say("%s", "\nA variable keeps its layout\n");
    dt_layout lv;
    CHECK(dt_layout_parse(mesh, "x,unsharded", &lv));
    dt_op_options ov = {.layout = &lv};
    const int64_t shape[2] = {6, 4};
    dt_tensor *init, *value, *moved;
    CHECK(dt_zeros(DT_DTYPE_F32, 2, shape, &ov, &init));
    dt_variable *v;
    CHECK(dt_variable_create(init, &v));
    dt_layout lr;
    CHECK(dt_layout_parse(mesh, "unsharded,unsharded", &lr));
    dt_op_options orp = {.layout = &lr};
    CHECK(dt_ones(DT_DTYPE_F32, 2, shape, &orp, &value));
    dt_status s = dt_variable_assign(v, value);
    if (dt_client_id() == 0) {
        printf("assign a replicated value to a variable of layout \"x,unsharded\": %s\n  %s\n",
               dt_status_name(s), dt_last_error());
        fflush(stdout);
    }
    CHECK(dt_relayout(value, &lv, NULL, &moved));
    CHECK(dt_variable_assign_add(v, moved));
    print_global("after an explicit relayout and assign_add", dt_variable_value(v));

    dt_variable_free(v);
    dt_tensor_free(init);
    dt_tensor_free(value);
    dt_tensor_free(moved);
    dt_mesh_free(mesh);
    CHECK(dt_finalize());
    return s == DT_ERR_LAYOUT ? 0 : 1;
}
