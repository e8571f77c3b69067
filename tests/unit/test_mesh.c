/* Runtime start and stop, meshes: creation, every query, every bad input. Single client. */
#include "../ref.h"
#include "dt.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void init_devices(int devices)
{
    dt_init_options o = {.cpu_devices = devices};
    cr_assert_eq(dt_init(&o), DT_OK, "dt_init(%d): %s", devices, dt_last_error());
}

static void finalize(void)
{
    cr_assert_eq(dt_finalize(), DT_OK, "dt_finalize: %s", dt_last_error());
}

#define EXPECT_MSG(needle)                                                                       \
    cr_expect(strstr(dt_last_error(), (needle)), "message \"%s\" lacks \"%s\"", dt_last_error(), \
              (needle))

/* ---- runtime --------------------------------------------------------------------------- */

Test(runtime, init_with_1_to_8_devices)
{
    for (int n = 1; n <= 8; n++) {
        cr_assert_not(dt_is_initialized());
        init_devices(n);
        cr_expect(dt_is_initialized());
        cr_expect_eq(dt_client_id(), 0);
        cr_expect_eq(dt_num_clients(), 1);
        cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), n);
        cr_expect_eq(dt_num_global_devices(DT_DEVICE_CPU), n);
        for (int i = 0; i < n; i++) {
            size_t cur = 99, peak = 99;
            cr_expect_eq(dt_device_memory(DT_DEVICE_CPU, i, &cur, &peak), DT_OK);
            cr_expect(cur == 0 && peak == 0, "device %d: %zu / %zu bytes", i, cur, peak);
        }
        cr_expect_eq(dt_device_memory(DT_DEVICE_CPU, n, NULL, NULL), DT_ERR_ARG);
        char num[16];
        snprintf(num, sizeof num, "%d", n);
        EXPECT_MSG(num);
        cr_expect_eq(dt_device_memory(DT_DEVICE_CPU, -1, NULL, NULL), DT_ERR_ARG);
        /* a mesh over all of them */
        dt_mesh *m = NULL;
        char spec[32];
        snprintf(spec, sizeof spec, "d=%d", n);
        cr_assert_eq(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m), DT_OK, "%s",
                     dt_last_error());
        cr_expect_eq(dt_mesh_size(m), n);
        dt_mesh_free(m);
        finalize();
        cr_expect_not(dt_is_initialized());
        cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 0);
        cr_expect_eq(dt_num_global_devices(DT_DEVICE_CPU), 0);
        cr_expect_eq(dt_num_clients(), 1);
    }
}

Test(runtime, init_defaults_from_environment)
{
    setenv("DTENSOR_CPU_DEVICES", "3", 1);
    cr_assert_eq(dt_init(NULL), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 3);
    finalize();
    /* zeroed options read the environment too */
    dt_init_options zero = {0};
    cr_assert_eq(dt_init(&zero), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 3);
    finalize();
    /* an explicit count wins over the environment */
    init_devices(5);
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 5);
    finalize();
    /* unset or empty: one device */
    unsetenv("DTENSOR_CPU_DEVICES");
    cr_assert_eq(dt_init(NULL), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 1);
    finalize();
    setenv("DTENSOR_CPU_DEVICES", "", 1);
    cr_assert_eq(dt_init(NULL), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 1);
    finalize();
}

Test(runtime, init_errors)
{
    dt_init_options o = {.cpu_devices = -1};
    cr_expect_eq(dt_init(&o), DT_ERR_ARG);
    EXPECT_MSG("-1");
    cr_expect_not(dt_is_initialized());
    o.cpu_devices = 4097;
    cr_expect_eq(dt_init(&o), DT_ERR_ARG);
    EXPECT_MSG("4097");
    o = (dt_init_options){.cpu_devices = 1, .bind = 3};
    cr_expect_eq(dt_init(&o), DT_ERR_ARG);
    EXPECT_MSG("bind is 3");
    o.bind = -2;
    cr_expect_eq(dt_init(&o), DT_ERR_ARG);
    EXPECT_MSG("-2");

    static const char *const bad_env[] = {"abc", "0", "-2", "3x", "5000"};
    for (size_t k = 0; k < sizeof bad_env / sizeof bad_env[0]; k++) {
        setenv("DTENSOR_CPU_DEVICES", bad_env[k], 1);
        cr_expect_eq(dt_init(NULL), DT_ERR_ARG, "DTENSOR_CPU_DEVICES=%s", bad_env[k]);
        char quoted[32];
        snprintf(quoted, sizeof quoted, "\"%s\"", bad_env[k]);
        EXPECT_MSG(quoted);
        EXPECT_MSG("DTENSOR_CPU_DEVICES");
        cr_expect_not(dt_is_initialized());
    }
    /* a failed start leaves nothing behind: the next start works */
    setenv("DTENSOR_CPU_DEVICES", "2", 1);
    cr_assert_eq(dt_init(NULL), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 2);
    finalize();
}

Test(runtime, init_twice)
{
    init_devices(2);
    dt_init_options o = {.cpu_devices = 3};
    cr_expect_eq(dt_init(&o), DT_ERR_STATE);
    EXPECT_MSG("already initialized");
    /* the running runtime is untouched */
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 2);
    finalize();
}

Test(runtime, bind_required_without_enough_cores)
{
    int devices = (int)sysconf(_SC_NPROCESSORS_ONLN) + 1;
    dt_init_options o = {.cpu_devices = devices, .bind = 1};
    cr_expect_eq(dt_init(&o), DT_ERR_ARG);
    char num[32];
    snprintf(num, sizeof num, "%d devices", devices);
    EXPECT_MSG(num);
    cr_expect_not(dt_is_initialized());
    o.bind = 2; /* never bind: fine */
    cr_assert_eq(dt_init(&o), DT_OK, "%s", dt_last_error());
    finalize();
}

Test(runtime, calls_before_init)
{
    dt_mesh *m = (dt_mesh *)&m; /* not NULL, so the out-parameter reset is visible */
    cr_expect_eq(dt_mesh_create_from_string("x=1", DT_DEVICE_CPU, &m), DT_ERR_STATE);
    EXPECT_MSG("dt_mesh_create_from_string");
    EXPECT_MSG("dt_init");
    cr_expect_null(m);
    m = (dt_mesh *)&m;
    cr_expect_eq(dt_mesh_create(1, (const char *[]){"x"}, (int[]){1}, DT_DEVICE_CPU, &m),
                 DT_ERR_STATE);
    EXPECT_MSG("dt_mesh_create");
    cr_expect_null(m);
    cr_expect_eq(dt_finalize(), DT_ERR_STATE);
    EXPECT_MSG("dt_finalize");
    cr_expect_eq(dt_device_memory(DT_DEVICE_CPU, 0, NULL, NULL), DT_ERR_STATE);
    cr_expect_eq(dt_devices_print(stdout), DT_ERR_STATE);
    cr_expect_eq(dt_print_ordered(stdout, "x"), DT_ERR_STATE);
    cr_expect_eq(dt_client_allgather("x", 1, (char[1]){0}), DT_ERR_STATE);
    dt_layout l = {0};
    dt_tensor *t = NULL;
    cr_expect_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 0, NULL, NULL, 0, &t), DT_ERR_STATE);
    EXPECT_MSG("dt_tensor_from_host");
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CPU), 0);
    cr_expect_eq(dt_num_global_devices(DT_DEVICE_CPU), 0);
    cr_expect_eq(dt_client_id(), 0);
    cr_expect_eq(dt_num_clients(), 1);
}

Test(runtime, finalize_refuses_while_objects_live)
{
    init_devices(4);
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string("x=2,y=2", DT_DEVICE_CPU, &m), DT_OK);
    cr_expect_eq(dt_finalize(), DT_ERR_STATE);
    EXPECT_MSG("1 meshes");
    EXPECT_MSG("0 tensors");
    cr_expect(dt_is_initialized(), "a refused finalize stops nothing");

    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "x,y", &l), DT_OK);
    const int32_t host[6] = {1, 2, 3, 4, 5, 6};
    dt_tensor *t = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_I32, 2, (int64_t[]){2, 3}, host, sizeof host, &t),
                 DT_OK, "%s", dt_last_error());
    /* The caller's mesh reference goes; the tensor keeps the mesh alive. */
    dt_mesh_free(m);
    cr_expect_eq(dt_finalize(), DT_ERR_STATE);
    EXPECT_MSG("1 tensors");
    int32_t back[6] = {0};
    cr_expect_eq(dt_tensor_read(t, back, sizeof back), DT_OK, "%s", dt_last_error());
    cr_expect_arr_eq(back, host, sizeof host);
    cr_expect_eq(dt_mesh_size(dt_tensor_mesh(t)), 4);
    /* the devices are still there: a new mesh works */
    dt_mesh *m2 = NULL;
    cr_expect_eq(dt_mesh_create_from_string("z=4", DT_DEVICE_CPU, &m2), DT_OK);
    dt_mesh_free(m2);
    dt_tensor_free(t);
    finalize();
    cr_expect_not(dt_is_initialized());
}

Test(runtime, free_null_is_noop)
{
    dt_mesh_free(NULL);
    dt_tensor_free(NULL);
    init_devices(1);
    dt_mesh_free(NULL);
    dt_tensor_free(NULL);
    finalize(); /* nothing counted as alive */
}

Test(runtime, devices_print_mentions_every_device)
{
    init_devices(5);
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    cr_assert_eq(dt_devices_print(f), DT_OK, "%s", dt_last_error());
    long len = ftell(f);
    cr_assert_gt(len, 0);
    char *text = calloc((size_t)len + 1, 1);
    rewind(f);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    for (int i = 0; i < 5; i++) {
        char dev[32], id[32];
        snprintf(dev, sizeof dev, "CPU:%d ", i);
        snprintf(id, sizeof id, "global id %d,", i);
        cr_expect(strstr(text, dev), "no \"%s\" in:\n%s", dev, text);
        cr_expect(strstr(text, id), "no \"%s\" in:\n%s", id, text);
    }
    cr_expect_null(strstr(text, "CPU:5"), "a sixth device in:\n%s", text);
    if (ref_cuda_devices(0, 1) == 0)
        cr_expect(strstr(text, "no CUDA devices"), "%s", text);
    /* OpenBLAS threads per GEMM, and why: the user's variable, or cores over devices */
    const char *why = getenv("OPENBLAS_NUM_THREADS") && *getenv("OPENBLAS_NUM_THREADS")
                          ? "(OPENBLAS_NUM_THREADS)"
                          : "(the host's cores over its CPU devices)";
    cr_expect(strstr(text, "OpenBLAS: ") && strstr(text, why), "no \"%s\" in:\n%s", why, text);
    for (int i = 0; i < ref_cuda_devices(0, 1); i++) {
        char dev[32];
        snprintf(dev, sizeof dev, "CUDA:%d ", i);
        cr_expect(strstr(text, dev), "no \"%s\" in:\n%s", dev, text);
    }
    free(text);
    finalize();
}

Test(runtime, client_allgather_single_client)
{
    init_devices(1);
    const int64_t mine[3] = {3, -1, 7};
    int64_t all[3] = {0};
    cr_assert_eq(dt_client_allgather(mine, sizeof mine, all), DT_OK, "%s", dt_last_error());
    cr_expect_arr_eq(all, mine, sizeof mine);
    cr_expect_eq(dt_client_allgather(NULL, 0, NULL), DT_OK, "%s", dt_last_error());
    cr_expect_eq(dt_client_allgather(NULL, 8, all), DT_ERR_ARG);
    cr_expect(strstr(dt_last_error(), "client 0 passed NULL buffers"), "%s", dt_last_error());
    finalize();
}

Test(runtime, print_ordered_single_client)
{
    init_devices(1);
    FILE *f = tmpfile();
    cr_assert_eq(dt_print_ordered(f, "hello 42\n"), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_print_ordered(f, NULL), DT_OK, "%s", dt_last_error());
    char buf[64] = {0};
    rewind(f);
    cr_expect_eq(fread(buf, 1, sizeof buf - 1, f), 9);
    cr_expect_str_eq(buf, "hello 42\n");
    fclose(f);
    finalize();
}

/* CUDA devices: as many as the CUDA runtime reports (one client owns every GPU), none on a
 * machine without a GPU or a build without CUDA, which is not an error. */
Test(runtime, cuda_devices_as_the_driver_reports)
{
    init_devices(2);
    int n = ref_cuda_devices(0, 1);
    cr_expect_eq(dt_num_local_devices(DT_DEVICE_CUDA), n);
    cr_expect_eq(dt_num_global_devices(DT_DEVICE_CUDA), n);
    dt_mesh *m = NULL;
    if (n == 0) {
        cr_expect_eq(dt_device_memory(DT_DEVICE_CUDA, 0, NULL, NULL), DT_ERR_ARG);
        EXPECT_MSG("CUDA");
        cr_expect_eq(dt_mesh_create_from_string("x=1", DT_DEVICE_CUDA, &m), DT_ERR_MESH);
        EXPECT_MSG("0 CUDA devices");
        cr_expect_null(m);
    } else {
        size_t cur = 1;
        cr_expect_eq(dt_device_memory(DT_DEVICE_CUDA, n - 1, &cur, NULL), DT_OK);
        cr_expect_eq(cur, 0);
        cr_expect_eq(dt_device_memory(DT_DEVICE_CUDA, n, NULL, NULL), DT_ERR_ARG);
        cr_expect_eq(dt_mesh_create_from_string("x=1", DT_DEVICE_CUDA, &m), DT_OK, "%s",
                     dt_last_error());
        dt_mesh_free(m);
    }
    finalize();
}

/* ---- mesh queries ---------------------------------------------------------------------- */

static void check_queries(int num_axes, const char *const names[], const int sizes[])
{
    int devices = 1;
    for (int a = 0; a < num_axes; a++)
        devices *= sizes[a];
    init_devices(devices);
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create(num_axes, names, sizes, DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    cr_expect_eq(dt_mesh_num_axes(m), num_axes);
    cr_expect_eq(dt_mesh_size(m), devices);
    cr_expect_eq(dt_mesh_device_type(m), DT_DEVICE_CPU);
    for (int a = 0; a < num_axes; a++) {
        cr_expect_str_eq(dt_mesh_axis_name(m, a), names[a]);
        cr_expect_eq(dt_mesh_axis_size(m, a), sizes[a]);
        cr_expect_eq(dt_mesh_axis_index(m, names[a]), a);
    }
    cr_expect_null(dt_mesh_axis_name(m, num_axes));
    cr_expect_null(dt_mesh_axis_name(m, -1));
    cr_expect_eq(dt_mesh_axis_size(m, num_axes), 0);
    cr_expect_eq(dt_mesh_axis_size(m, -1), 0);
    cr_expect_eq(dt_mesh_axis_index(m, "nope"), -1);
    cr_expect_eq(dt_mesh_axis_index(m, "unsharded"), -1);
    cr_expect_eq(dt_mesh_axis_index(m, NULL), -1);

    /* one client: every device is local, ids in order */
    cr_expect_eq(dt_mesh_num_local_devices(m), devices);
    for (int i = 0; i < devices; i++)
        cr_expect_eq(dt_mesh_local_device_id(m, i), i);
    cr_expect_eq(dt_mesh_local_device_id(m, devices), -1);
    cr_expect_eq(dt_mesh_local_device_id(m, -1), -1);
    for (int i = 0; i < devices; i++)
        cr_expect_eq(dt_global_device_id(DT_DEVICE_CPU, i), i);
    cr_expect_eq(dt_global_device_id(DT_DEVICE_CPU, devices), -1);
    cr_expect_eq(dt_global_device_id(DT_DEVICE_CPU, -1), -1);
    cr_expect_eq(dt_global_device_id(DT_DEVICE_CUDA, 0), ref_cuda_devices(0, 1) ? 0 : -1);

    for (int d = 0; d < devices; d++) {
        int want[DT_MAX_MESH_AXES], got[DT_MAX_MESH_AXES];
        ref_coords(num_axes, sizes, d, want);
        cr_assert_eq(dt_mesh_device_coords(m, d, got), DT_OK, "%s", dt_last_error());
        for (int a = 0; a < num_axes; a++)
            cr_expect_eq(got[a], want[a], "device %d axis %d: %d, want %d", d, a, got[a], want[a]);
        int back = -1;
        cr_assert_eq(dt_mesh_device_at(m, want, &back), DT_OK, "%s", dt_last_error());
        cr_expect_eq(back, d);
        int client = -1;
        cr_expect_eq(dt_mesh_device_client(m, d, &client), DT_OK);
        cr_expect_eq(client, 0);
    }
    int coords[DT_MAX_MESH_AXES];
    cr_expect_eq(dt_mesh_device_coords(m, devices, coords), DT_ERR_ARG);
    char num[16];
    snprintf(num, sizeof num, "device %d", devices);
    EXPECT_MSG(num);
    cr_expect_eq(dt_mesh_device_coords(m, -1, coords), DT_ERR_ARG);
    EXPECT_MSG("device -1");
    int client;
    cr_expect_eq(dt_mesh_device_client(m, devices, &client), DT_ERR_ARG);
    cr_expect_eq(dt_mesh_device_coords(NULL, 0, coords), DT_ERR_ARG);

    for (int a = 0; a < num_axes; a++) {
        int c[DT_MAX_MESH_AXES] = {0}, dev = 1234;
        c[a] = sizes[a];
        cr_expect_eq(dt_mesh_device_at(m, c, &dev), DT_ERR_ARG);
        char needle[64];
        snprintf(needle, sizeof needle, "coordinate %d on axis \"%s\"", sizes[a], names[a]);
        EXPECT_MSG(needle);
        cr_expect_eq(dev, 1234, "device written on error");
        c[a] = -1;
        cr_expect_eq(dt_mesh_device_at(m, c, &dev), DT_ERR_ARG);
    }
    cr_expect_eq(dt_mesh_device_at(m, NULL, &client), DT_ERR_ARG);
    cr_expect_eq(dt_mesh_device_at(m, coords, NULL), DT_ERR_ARG);

    /* format, against the text built here */
    char want[DT_STRING_MAX] = "<Mesh ";
    for (int a = 0; a < num_axes; a++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s=%d", a ? "," : "", names[a],
                 sizes[a]);
    snprintf(want + strlen(want), sizeof want - strlen(want), " CPU:%d>", devices);
    char buf[DT_STRING_MAX];
    cr_expect_eq(dt_mesh_format(m, buf, sizeof buf), (int)strlen(want));
    cr_expect_str_eq(buf, want);
    char small[8];
    cr_expect_eq(dt_mesh_format(m, small, sizeof small), (int)strlen(want), "snprintf contract");
    cr_expect(strncmp(small, want, 7) == 0 && small[7] == '\0', "\"%s\"", small);
    cr_expect_eq(dt_mesh_format(m, NULL, 0), (int)strlen(want));

    dt_mesh_free(m);
    finalize();
}

Test(mesh, queries_x3_y2)
{
    check_queries(2, (const char *[]){"x", "y"}, (int[]){3, 2});
}
Test(mesh, queries_2x2x2)
{
    check_queries(3, (const char *[]){"batch", "model", "z_1"}, (int[]){2, 2, 2});
}
Test(mesh, queries_one_axis)
{
    check_queries(1, (const char *[]){"_d"}, (int[]){7});
}
Test(mesh, queries_with_unit_axes)
{
    check_queries(4, (const char *[]){"a", "b", "c", "d"}, (int[]){1, 3, 1, 2});
}
Test(mesh, queries_eight_axes)
{
    check_queries(8, (const char *[]){"a", "b", "c", "d", "e", "f", "g", "h"},
                  (int[]){1, 2, 1, 1, 2, 1, 1, 2});
}

Test(mesh, queries_on_null)
{
    cr_expect_eq(dt_mesh_num_axes(NULL), 0);
    cr_expect_eq(dt_mesh_size(NULL), 0);
    cr_expect_null(dt_mesh_axis_name(NULL, 0));
    cr_expect_eq(dt_mesh_axis_size(NULL, 0), 0);
    cr_expect_eq(dt_mesh_axis_index(NULL, "x"), -1);
    cr_expect_eq(dt_mesh_num_local_devices(NULL), 0);
    cr_expect_eq(dt_mesh_local_device_id(NULL, 0), -1);
}

Test(mesh, from_string_with_blanks)
{
    init_devices(6);
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string(" x = 3 , y=2 ", DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    char buf[64];
    dt_mesh_format(m, buf, sizeof buf);
    cr_expect_str_eq(buf, "<Mesh x=3,y=2 CPU:6>");
    dt_mesh_free(m);
    finalize();
}

Test(mesh, longest_name)
{
    init_devices(2);
    const char *name = "abcdefghijabcdefghijabcdefghija"; /* 31 characters */
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create(1, &name, (int[]){2}, DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    cr_expect_str_eq(dt_mesh_axis_name(m, 0), name);
    dt_layout l;
    cr_expect_eq(dt_layout_parse(m, "abcdefghijabcdefghijabcdefghija,unsharded", &l), DT_OK, "%s",
                 dt_last_error());
    cr_expect_eq(l.axes[0], 0);
    dt_mesh_free(m);
    finalize();
}

Test(mesh, local_mesh_over_some_devices)
{
    init_devices(4);
    const char *name = "r";
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_local(1, &name, (int[]){2}, DT_DEVICE_CPU, 1, &m), DT_OK, "%s",
                 dt_last_error());
    cr_expect_eq(dt_mesh_size(m), 2);
    cr_expect_eq(dt_mesh_num_local_devices(m), 2);
    /* a replicated tensor on local devices 1 and 2: ops run, values as on any mesh */
    dt_layout l;
    cr_assert_eq(dt_layout_parse(m, "r", &l), DT_OK, "%s", dt_last_error());
    float host[4] = {1, 2, 3, 4}, out[1] = {0};
    dt_tensor *t = NULL, *sum = NULL;
    cr_assert_eq(dt_tensor_from_host(&l, DT_DTYPE_F32, 1, (int64_t[]){4}, host, sizeof host, &t),
                 DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_reduce(DT_REDUCE_SUM, t, 0, NULL, 0, NULL, &sum), DT_OK, "%s", dt_last_error());
    cr_assert_eq(dt_tensor_read(sum, out, sizeof out), DT_OK, "%s", dt_last_error());
    cr_expect_eq(out[0], 10.0f);
    dt_tensor_free(sum);
    dt_tensor_free(t);
    dt_mesh_free(m);
    /* devices past this client's, a bad first index and bad names are refused, naming them */
    cr_expect_eq(dt_mesh_create_local(1, &name, (int[]){2}, DT_DEVICE_CPU, 3, &m), DT_ERR_MESH);
    EXPECT_MSG("local devices 3..4, but this client has 4 CPU devices (0..3)");
    cr_expect_null(m);
    cr_expect_eq(dt_mesh_create_local(1, &name, (int[]){1}, DT_DEVICE_CPU, -1, &m), DT_ERR_MESH);
    const char *bad = "1x";
    cr_expect_eq(dt_mesh_create_local(1, &bad, (int[]){1}, DT_DEVICE_CPU, 0, &m), DT_ERR_MESH);
    EXPECT_MSG("\"1x\"");
    cr_expect_eq(dt_mesh_create_local(1, &name, (int[]){1}, DT_DEVICE_CPU, 0, NULL), DT_ERR_ARG);
    finalize();
}

Test(mesh, many_meshes_on_the_same_devices)
{
    init_devices(4);
    dt_mesh *a = NULL, *b = NULL;
    cr_assert_eq(dt_mesh_create_from_string("x=4", DT_DEVICE_CPU, &a), DT_OK);
    cr_assert_eq(dt_mesh_create_from_string("x=2,y=2", DT_DEVICE_CPU, &b), DT_OK);
    cr_expect_neq(a, b);
    cr_expect_eq(dt_mesh_num_axes(a), 1);
    cr_expect_eq(dt_mesh_num_axes(b), 2);
    dt_mesh_free(a);
    cr_expect_eq(dt_finalize(), DT_ERR_STATE);
    dt_mesh_free(b);
    finalize();
}

/* ---- bad meshes ------------------------------------------------------------------------ */

static const struct {
    const char *spec;
    dt_status status;
    const char *needle[2];
} bad_specs[] = {
    {"x=2,x=2", DT_ERR_MESH, {"\"x\"", "twice"}},
    {"unsharded=4", DT_ERR_MESH, {"\"unsharded\"", "axis 0"}},
    {"x=2,unsharded=2", DT_ERR_MESH, {"\"unsharded\"", "axis 1"}},
    {"1x=4", DT_ERR_MESH, {"\"1x\"", "identifier"}},
    {"x-y=4", DT_ERR_MESH, {"\"x-y\"", "identifier"}},
    {"x=4,b.c=1", DT_ERR_MESH, {"\"b.c\"", "axis 1"}},
    {"=4", DT_ERR_MESH, {"\"\"", "axis 0"}},
    {"abcdefghijabcdefghijabcdefghijab=4",
     DT_ERR_MESH,
     {"\"abcdefghijabcdefghijabcdefghijab\"", "31"}},
    {"x=0,y=4", DT_ERR_MESH, {"\"x\"", "size 0"}},
    {"x=4,y=0", DT_ERR_MESH, {"\"y\"", "size 0"}},
    {"x=3", DT_ERR_MESH, {"x=3", "4 CPU devices"}},
    {"x=2,y=3", DT_ERR_MESH, {"x=2,y=3", "6 devices"}},
    {"x=8", DT_ERR_MESH, {"8 devices", "4 CPU devices"}},
    {"x=1", DT_ERR_MESH, {"1 devices", "4 CPU devices"}},
    {"x=3,,y", DT_ERR_MESH, {"\"x=3,,y\"", "name=size"}},
    {"x=2,,y=2", DT_ERR_MESH, {"\"x=2,,y=2\"", "name=size"}},
    {"x=4,", DT_ERR_MESH, {"\"x=4,\"", "name=size"}},
    {",x=4", DT_ERR_MESH, {"\",x=4\"", "name=size"}},
    {"x=2, ,y=2", DT_ERR_MESH, {"\"x=2, ,y=2\"", "name=size"}},
    {"x=a", DT_ERR_MESH, {"\"x=a\"", "name=size"}},
    {"x=", DT_ERR_MESH, {"\"x=\"", "name=size"}},
    {"x=4,y", DT_ERR_MESH, {"\"x=4,y\"", "name=size"}},
    {"x=-4", DT_ERR_MESH, {"\"x=-4\"", "name=size"}},
    {"x=4 y=1", DT_ERR_MESH, {"\"x=4 y=1\"", "name=size"}},
    {"x=99999999999", DT_ERR_MESH, {"\"x=99999999999\"", "name=size"}},
    {"", DT_ERR_MESH, {"\"\"", "name=size"}},
    {",", DT_ERR_MESH, {"\",\"", "name=size"}},
    {"a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=4,i=1", DT_ERR_MESH, {"i=1\"", "1 to 8 axes"}},
};

Test(mesh, bad_specs_name_the_values)
{
    init_devices(4);
    for (size_t k = 0; k < sizeof bad_specs / sizeof bad_specs[0]; k++) {
        dt_mesh *m = (dt_mesh *)&m;
        dt_status s = dt_mesh_create_from_string(bad_specs[k].spec, DT_DEVICE_CPU, &m);
        cr_expect_eq(s, bad_specs[k].status, "\"%s\": %s (%s)", bad_specs[k].spec,
                     dt_status_name(s), dt_last_error());
        for (int i = 0; i < 2; i++)
            cr_expect(strstr(dt_last_error(), bad_specs[k].needle[i]),
                      "\"%s\": message \"%s\" lacks %s", bad_specs[k].spec, dt_last_error(),
                      bad_specs[k].needle[i]);
        cr_expect_null(m, "\"%s\": out not cleared", bad_specs[k].spec);
    }
    cr_expect_eq(dt_mesh_create_from_string(NULL, DT_DEVICE_CPU, &(dt_mesh *){NULL}), DT_ERR_MESH);
    EXPECT_MSG("(null)");
    cr_expect_eq(dt_mesh_create_from_string("x=4", DT_DEVICE_CPU, NULL), DT_ERR_ARG);
    EXPECT_MSG("out is NULL");
    /* a long spec is refused, not overflowed */
    char longspec[DT_STRING_MAX + 64];
    memset(longspec, 'a', sizeof longspec - 1);
    longspec[sizeof longspec - 1] = '\0';
    cr_expect_eq(dt_mesh_create_from_string(longspec, DT_DEVICE_CPU, &(dt_mesh *){NULL}),
                 DT_ERR_MESH);
    finalize(); /* nothing half-built stayed alive */
}

Test(mesh, bad_arrays_name_the_values)
{
    init_devices(4);
    const char *nine[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    int ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 4};
    dt_mesh *m = (dt_mesh *)&m;
    cr_expect_eq(dt_mesh_create(0, nine, ones, DT_DEVICE_CPU, &m), DT_ERR_MESH);
    EXPECT_MSG("0 axes");
    cr_expect_null(m);
    cr_expect_eq(dt_mesh_create(9, nine, ones, DT_DEVICE_CPU, &m), DT_ERR_MESH);
    EXPECT_MSG("9 axes");
    cr_expect_eq(dt_mesh_create(-1, nine, ones, DT_DEVICE_CPU, &m), DT_ERR_MESH);
    EXPECT_MSG("-1 axes");
    cr_expect_eq(dt_mesh_create(2, NULL, ones, DT_DEVICE_CPU, &m), DT_ERR_ARG);
    EXPECT_MSG("NULL");
    cr_expect_eq(dt_mesh_create(2, nine, NULL, DT_DEVICE_CPU, &m), DT_ERR_ARG);
    cr_expect_eq(dt_mesh_create(2, (const char *[]){"x", NULL}, (int[]){2, 2}, DT_DEVICE_CPU, &m),
                 DT_ERR_MESH);
    EXPECT_MSG("(null)");
    cr_expect_eq(dt_mesh_create(1, (const char *[]){"x"}, (int[]){4}, (dt_device_type)7, &m),
                 DT_ERR_ARG);
    EXPECT_MSG("7");
    cr_expect_eq(dt_mesh_create(2, (const char *[]){"x", "y"}, (int[]){-2, -2}, DT_DEVICE_CPU, &m),
                 DT_ERR_MESH);
    EXPECT_MSG("size -2");
    cr_expect_eq(dt_mesh_create(1, (const char *[]){"x"}, (int[]){4}, DT_DEVICE_CPU, NULL),
                 DT_ERR_ARG);
    cr_expect_null(m);
    /* eight axes are allowed */
    cr_expect_eq(dt_mesh_create(8, nine + 1, ones + 1, DT_DEVICE_CPU, &m), DT_OK, "%s",
                 dt_last_error());
    cr_expect_eq(dt_mesh_num_axes(m), 8);
    dt_mesh_free(m);
    finalize();
}

/* `bytes` at the very end of a readable page that a PROT_NONE page follows: a read one byte past
 * them faults in every build (not only under AddressSanitizer). Unmapped at exit. */
static void *before_guard(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    cr_assert_eq(mprotect(p + page, page, PROT_NONE), 0);
    return p + page - bytes;
}

/* An axis count past the maximum is an error naming it, and the arrays are not read past the
 * two entries the caller passed (a count of INT_MAX once read past them). */
Test(mesh, axis_count_past_the_maximum_reads_only_the_callers_arrays)
{
    init_devices(4);
    const char **names = before_guard(2 * sizeof *names);
    names[0] = "x";
    names[1] = "y";
    int *sizes = before_guard(2 * sizeof *sizes);
    sizes[0] = sizes[1] = 2;
    for (int i = 0; i < 2; i++) {
        int count = i ? INT_MAX : DT_MAX_MESH_AXES + 1;
        dt_mesh *m = (dt_mesh *)&m;
        cr_expect_eq(dt_mesh_create(count, names, sizes, DT_DEVICE_CPU, &m), DT_ERR_MESH);
        char num[16];
        snprintf(num, sizeof num, "%d axes", count);
        EXPECT_MSG(num);
        cr_expect_null(m);
    }
    /* and the two entries themselves still make a mesh */
    dt_mesh *m = NULL;
    cr_expect_eq(dt_mesh_create(2, names, sizes, DT_DEVICE_CPU, &m), DT_OK, "%s", dt_last_error());
    dt_mesh_free(m);
    finalize();
}

/* NULL out-pointers and FILEs are errors naming the argument, never a crash. */
Test(runtime, null_arguments_are_errors)
{
    init_devices(2);
    dt_mesh *m = NULL;
    cr_assert_eq(dt_mesh_create_from_string("x=2", DT_DEVICE_CPU, &m), DT_OK);
    cr_expect_eq(dt_mesh_device_coords(m, 0, NULL), DT_ERR_ARG);
    EXPECT_MSG("coords is NULL");
    cr_expect_eq(dt_mesh_device_client(m, 1, NULL), DT_ERR_ARG);
    EXPECT_MSG("client is NULL");
    cr_expect_eq(dt_devices_print(NULL), DT_ERR_ARG);
    EXPECT_MSG("FILE is NULL");
    cr_expect_eq(dt_print_ordered(NULL, "x"), DT_ERR_ARG);
    EXPECT_MSG("FILE is NULL");
    /* a hand-built layout naming a mesh axis the mesh lacks */
    dt_layout l = {.mesh = m, .rank = 1, .axes = {5}};
    cr_expect_eq(dt_layout_num_shards(&l, 0), 1);
    dt_mesh_free(m);
    finalize();
}
