/* Bytes per device of each matmul sharding scheme of the benchmark harness
 * (benchmarks/bench_schemes.c): the communication ledger, the expanded program (the cost
 * model) and the textbook volume written out here must agree, under the default algorithm and
 * under an explicit ring; every scheme's result must match a host GEMM.
 * Run at -n 2 (mesh x=2), -n 4 (x=4 and x=2,y=2) and -n 2 with 2 devices per client.
 *
 * Textbook volumes per device for C[M,N] = A[M,K] B[K,N] (batch·M rows for a batched A) on P
 * devices, in elements (BASELINE.md): ring all-reduce of the partial C 2(P-1)/P·M·N; its
 * reduce-scatter (P-1)/P·M·N; all-gather of B (P-1)/P·K·N; on a px x py mesh, A's k gathered
 * over y (py-1)·(M/px)(K/py) plus B's k over x (px-1)·(K/px)(N/py); k on y with C
 * reduce-scattered over y (py-1)/py·(M/px)·N. */
#include "tap.h"

#include "dtensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* large enough that every scheme takes its textbook plan in the cost model (the chunked
 * reduce-scatter pays one collective per chunk: at x=4 it beats moving A and B from here on) */
enum { M = 192, N = 160, K = 224 };

typedef enum vol { NONE, GATHER_B, ALL_REDUCE, REDUCE_SCATTER, GATHER_2D, RS_2D } vol;

typedef struct scheme {
    const char *name;
    int mesh_rank;
    const char *a, *b, *c; /* A [m,k], B [k,n], C [m,n] */
    vol v;
    const char *ops; /* the collectives expected, in order */
} scheme;

static const scheme schemes[] = {
    {"replicated", 1, "unsharded,unsharded", "unsharded,unsharded", "unsharded,unsharded", NONE,
     ""},
    {"row", 1, "x,unsharded", "unsharded,unsharded", "x,unsharded", NONE, ""},
    {"row_gather_b", 1, "x,unsharded", "x,unsharded", "x,unsharded", GATHER_B, "all_gather "},
    {"column", 1, "unsharded,unsharded", "unsharded,x", "unsharded,x", NONE, ""},
    {"contracting_allreduce", 1, "unsharded,x", "x,unsharded", "unsharded,unsharded", ALL_REDUCE,
     "all_reduce "},
    /* chunked (spmd/ops/matmul.c): one reduce-scatter per chunk of M/P rows, P of them */
    {"contracting_reducescatter", 1, "unsharded,x", "x,unsharded", "x,unsharded", REDUCE_SCATTER,
     "reduce_scatter "},
    {"2d", 2, "x,y", "x,y", "x,y", GATHER_2D, "all_gather all_gather "},
    {"2d_contracting", 2, "x,y", "y,unsharded", "x,y", RS_2D, "reduce_scatter "},
};

static double textbook(vol v, int batch, int px, int py, double es)
{
    double p = px * py, b = batch;
    switch (v) {
    case NONE:
        return 0;
    case GATHER_B:
        return (p - 1) / p * K * N * es;
    case ALL_REDUCE:
        return 2 * (p - 1) / p * b * M * N * es;
    case REDUCE_SCATTER:
        return (p - 1) / p * b * M * N * es;
    case GATHER_2D:
        return ((py - 1) * b * (M / px) * (K / py) + (px - 1) * (double)(K / px) * (N / py)) * es;
    case RS_2D:
        return (py - 1) / (double)py * b * (M / px) * N * es;
    }
    return -1;
}

static void run(dt_mesh *m, const scheme *s, int batch, dt_collective_algorithm alg)
{
    int px = dt_mesh_axis_size(m, 0), py = dt_mesh_num_axes(m) > 1 ? dt_mesh_axis_size(m, 1) : 1;
    char ta[64], tc[64], mesh[64];
    dt_mesh_format(m, mesh, sizeof mesh);
    snprintf(ta, sizeof ta, "%s%s", batch > 1 ? "unsharded," : "", s->a);
    snprintf(tc, sizeof tc, "%s%s", batch > 1 ? "unsharded," : "", s->c);
    dt_layout la, lb, lc;
    bool ok = dt_layout_parse(m, ta, &la) == DT_OK && dt_layout_parse(m, s->b, &lb) == DT_OK &&
              dt_layout_parse(m, tc, &lc) == DT_OK;
    ok = ok && dt_mesh_set_collective_algorithm(m, alg) == DT_OK;
    int ra = batch > 1 ? 3 : 2;
    int64_t sa[3] = {batch, M, K}, sb[2] = {K, N};
    const int64_t *sap = batch > 1 ? sa : sa + 1;
    dt_tensor *a = NULL, *b = NULL, *c = NULL, *xa = NULL, *xb = NULL, *xc = NULL;
    dt_function *f = NULL;
    ok = ok &&
         dt_random_uniform(DT_DTYPE_F64, ra, sap, 5, 1, -1, 1, &(dt_op_options){.layout = &la},
                           &a) == DT_OK &&
         dt_random_uniform(DT_DTYPE_F64, 2, sb, 5, 2, -1, 1, &(dt_op_options){.layout = &lb}, &b) ==
             DT_OK;
    ok = ok && dt_function_begin(&f) == DT_OK &&
         dt_function_input(f, &la, DT_DTYPE_F64, ra, sap, &xa) == DT_OK &&
         dt_function_input(f, &lb, DT_DTYPE_F64, 2, sb, &xb) == DT_OK &&
         dt_matmul(xa, xb, &(dt_op_options){.layout = &lc}, &xc) == DT_OK &&
         dt_function_end(f, 1, &xc) == DT_OK;
    double model = -1;
    ok = ok && dt_function_cost(f, NULL, NULL, &model) == DT_OK;
    dt_ledger_clear();
    const dt_tensor *in[2] = {a, b};
    ok = ok && dt_function_run(f, 2, in, 1, &c) == DT_OK;
    /* this client's ledger: bytes per device summed over the run's collectives */
    double sent = 0;
    char ops[256] = "";
    bool alg_ok = true;
    size_t n = 0;
    for (int64_t i = 0; ok && i < dt_ledger_size(); i++) {
        dt_ledger_entry e;
        ok = dt_ledger_entry_get(i, &e) == DT_OK;
        sent += (double)e.bytes_sent;
        n += (size_t)snprintf(ops + n, sizeof ops - n, "%s ", e.op);
        if (alg == DT_ALGORITHM_RING && strcmp(e.backend, "local") && strcmp(e.op, "all_to_all"))
            alg_ok = alg_ok && e.algorithm == DT_ALGORITHM_RING;
    }
    double want = textbook(s->v, batch, px, py, 8);
    const char *an = dt_collective_algorithm_name(alg);
    tap_check(ok, "%s %s batch %d %s: runs", mesh, s->name, batch, an);
    /* the reduce-scatter into rows is chunked: P collectives of M/P rows each (P divides M) */
    char want_ops[256] = "";
    for (int q = 0, reps = s->v == REDUCE_SCATTER && batch == 1 ? px * py : 1; q < reps; q++)
        strncat(want_ops, s->ops, sizeof want_ops - strlen(want_ops) - 1);
    tap_check(ok && strcmp(ops, want_ops) == 0,
              "%s %s batch %d %s: collectives \"%s\" (want \"%s\")", mesh, s->name, batch, an, ops,
              want_ops);
    tap_check(ok && fabs(sent - want) < 0.5,
              "%s %s batch %d %s: ledger %.0f bytes per device == textbook %.0f", mesh, s->name,
              batch, an, sent, want);
    tap_check(ok && fabs(model - want) < 0.5,
              "%s %s batch %d %s: cost model %.0f bytes per device == textbook %.0f", mesh, s->name,
              batch, an, model, want);
    tap_check(ok && alg_ok, "%s %s batch %d %s: the ledger names the algorithm asked for", mesh,
              s->name, batch, an);
    /* the result against a host GEMM of the same global inputs */
    size_t na = (size_t)batch * M * K, nc = (size_t)batch * M * N;
    double *ha = malloc(na * 8), *hb = malloc((size_t)K * N * 8), *hc = malloc(nc * 8);
    bool close = ok && ha && hb && hc && dt_tensor_read(a, ha, na * 8) == DT_OK &&
                 dt_tensor_read(b, hb, (size_t)K * N * 8) == DT_OK &&
                 dt_tensor_read(c, hc, nc * 8) == DT_OK;
    for (int q = 0; close && q < batch; q++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double r = 0;
                for (int l = 0; l < K; l++)
                    r += ha[((size_t)q * M + i) * K + l] * hb[(size_t)l * N + j];
                close = close && fabs(r - hc[((size_t)q * M + i) * N + j]) < 1e-9 * K;
            }
    tap_check(close, "%s %s batch %d %s: C matches a host GEMM", mesh, s->name, batch, an);
    free(ha);
    free(hb);
    free(hc);
    dt_tensor_free(xa);
    dt_tensor_free(xb);
    dt_tensor_free(xc);
    dt_function_free(f);
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_tensor_free(c);
    dt_mesh_set_collective_algorithm(m, DT_ALGORITHM_AUTO);
}

static void on_mesh(const char *spec)
{
    dt_mesh *m = NULL;
    if (!tap_check(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m) == DT_OK, "mesh %s", spec))
        return;
    const dt_collective_algorithm algs[2] = {DT_ALGORITHM_AUTO, DT_ALGORITHM_RING};
    for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
        if (schemes[i].mesh_rank != dt_mesh_num_axes(m))
            continue;
        for (int k = 0; k < 2; k++) {
            run(m, &schemes[i], 1, algs[k]);
            if (schemes[i].v == ALL_REDUCE || schemes[i].v == RS_2D)
                run(m, &schemes[i], 3, algs[k]);
        }
    }
    dt_mesh_free(m);
}

int main(void)
{
    if (dt_init(NULL) != DT_OK) {
        fprintf(stderr, "dt_init: %s\n", dt_last_error());
        return 1;
    }
    tap_init();
    int p = dt_num_global_devices(DT_DEVICE_CPU);
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", p);
    on_mesh(spec);
    if (p == 4)
        on_mesh("x=2,y=2");
    int status = tap_done();
    dt_finalize();
    return status;
}
