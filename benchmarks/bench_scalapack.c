/* ScaLAPACK PDGEMM / PSGEMM baseline for benchmarks/bench_schemes (built only when meson finds
 * libscalapack-mpich; Debian's libscalapack-mpich-dev, BLACS included).
 *
 *   mpiexec.mpich -n 2 bench_scalapack [--m M --n N --k K --batch B --dtype f64 --grid 1x2
 *                                       --nb 128 --reps 5 --warmup 1 --out file.csv]
 *
 * C = A B on a PR x PC process grid (default 1 x ranks), block-cyclic with nb x nb blocks;
 * batch > 1 runs that many GEMMs back to back. Median of `reps` after `warmup`, each run's time
 * the slowest rank's. Writes one CSV row in bench_schemes' matmul format (scheme
 * "scalapack_<grid>"; the communication columns are left empty: ScaLAPACK keeps no ledger).
 * Set OPENBLAS_NUM_THREADS=1 (one rank per core). */
#include "bench.h"
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* BLACS and ScaLAPACK (Fortran and C BLACS entry points; no header is installed). */
void Cblacs_pinfo(int *me, int *procs);
void Cblacs_get(int ctx, int what, int *val);
void Cblacs_gridinit(int *ctx, const char *order, int rows, int cols);
void Cblacs_gridinfo(int ctx, int *rows, int *cols, int *row, int *col);
void Cblacs_gridexit(int ctx);
int numroc_(const int *n, const int *nb, const int *iproc, const int *isrc, const int *nprocs);
void descinit_(int *desc, const int *m, const int *n, const int *mb, const int *nb,
               const int *irsrc, const int *icsrc, const int *ctx, const int *lld, int *info);
void pdgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k,
             const double *alpha, const double *a, const int *ia, const int *ja, const int *desca,
             const double *b, const int *ib, const int *jb, const int *descb, const double *beta,
             double *c, const int *ic, const int *jc, const int *descc);
void psgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k,
             const float *alpha, const float *a, const int *ia, const int *ja, const int *desca,
             const float *b, const int *ib, const int *jb, const int *descb, const float *beta,
             float *c, const int *ic, const int *jc, const int *descc);

static void *local_matrix(int rows, int cols, int es, int seed)
{
    size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)(cols > 0 ? cols : 1);
    char *p = malloc(n * (size_t)es);
    if (!p) {
        fprintf(stderr, "bench_scalapack: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < n; i++) {
        double v = (double)((i * 7 + (size_t)seed) % 13) * 0.01;
        if (es == 8)
            ((double *)(void *)p)[i] = v;
        else
            ((float *)(void *)p)[i] = (float)v;
    }
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    int M = 0, N = 1024, K = 0, batch = 1, nb = 128, reps = 5, warmup = 1, pr = 1, pc = np;
    int f64 = 1;
    const char *out_path = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *key = argv[i], *v = argv[i + 1];
        if (!strcmp(key, "--m"))
            M = atoi(v);
        else if (!strcmp(key, "--n"))
            N = atoi(v);
        else if (!strcmp(key, "--k"))
            K = atoi(v);
        else if (!strcmp(key, "--batch"))
            batch = atoi(v);
        else if (!strcmp(key, "--nb"))
            nb = atoi(v);
        else if (!strcmp(key, "--reps"))
            reps = atoi(v);
        else if (!strcmp(key, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(key, "--dtype"))
            f64 = strcmp(v, "f32") != 0;
        else if (!strcmp(key, "--grid") && sscanf(v, "%dx%d", &pr, &pc) == 2)
            ;
        else if (!strcmp(key, "--out"))
            out_path = v;
        else {
            if (me == 0)
                fprintf(stderr, "bench_scalapack: unknown option %s\n", key);
            MPI_Finalize();
            return 2;
        }
    }
    M = M > 0 ? M : N;
    K = K > 0 ? K : N;
    if (pr * pc != np || reps < 1 || reps > 1000 || batch < 1) {
        if (me == 0)
            fprintf(stderr, "bench_scalapack: grid %dx%d does not match %d ranks\n", pr, pc, np);
        MPI_Finalize();
        return 2;
    }
    int ctx, myr, myc, nr, ncl;
    Cblacs_get(-1, 0, &ctx);
    Cblacs_gridinit(&ctx, "Row", pr, pc);
    Cblacs_gridinfo(ctx, &nr, &ncl, &myr, &myc);
    int zero = 0, one = 1, info;
    int es = f64 ? 8 : 4;
    /* local pieces of A (M x K), B (K x N), C (M x N), column-major, block-cyclic */
    int am = numroc_(&M, &nb, &myr, &zero, &pr), ak = numroc_(&K, &nb, &myc, &zero, &pc);
    int bk = numroc_(&K, &nb, &myr, &zero, &pr), bn = numroc_(&N, &nb, &myc, &zero, &pc);
    int cm = numroc_(&M, &nb, &myr, &zero, &pr), cn = numroc_(&N, &nb, &myc, &zero, &pc);
    int lda = am > 1 ? am : 1, ldb = bk > 1 ? bk : 1, ldc = cm > 1 ? cm : 1;
    int da[9], db[9], dc[9];
    descinit_(da, &M, &K, &nb, &nb, &zero, &zero, &ctx, &lda, &info);
    descinit_(db, &K, &N, &nb, &nb, &zero, &zero, &ctx, &ldb, &info);
    descinit_(dc, &M, &N, &nb, &nb, &zero, &zero, &ctx, &ldc, &info);
    void *a = local_matrix(am, ak, es, 1), *b = local_matrix(bk, bn, es, 2),
         *c = local_matrix(cm, cn, es, 3);
    double times[1000];
    for (int r = -warmup; r < reps; r++) {
        MPI_Request req;
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        bench_wait(&req, false);
        double t0 = bench_now();
        for (int i = 0; i < batch; i++) {
            if (f64) {
                double al = 1, be = 0;
                pdgemm_("N", "N", &M, &N, &K, &al, a, &one, &one, da, b, &one, &one, db, &be, c,
                        &one, &one, dc);
            } else {
                float al = 1, be = 0;
                psgemm_("N", "N", &M, &N, &K, &al, a, &one, &one, da, b, &one, &one, db, &be, c,
                        &one, &one, dc);
            }
        }
        double t = bench_now() - t0, tmax = t;
        MPI_Iallreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req);
        bench_wait(&req, false);
        if (r >= 0)
            times[r] = tmax;
    }
    qsort(times, (size_t)reps, sizeof *times, bench_cmp_double);
    double t = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    if (me == 0) {
        FILE *f = out_path ? fopen(out_path, "w") : stdout;
        if (!f) {
            fprintf(stderr, "bench_scalapack: cannot write %s\n", out_path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double flops = 2.0 * batch * (double)M * N * K;
        fprintf(f, "section,scheme,clients,devices,mesh,dtype,batch,m,n,k,layout_a,layout_b,"
                   "layout_c,reps,median_s,gflops,flops_per_device,bytes_sent_per_device,"
                   "bytes_received_per_device,model_bytes_per_device,textbook_bytes_per_device,"
                   "messages,madds_per_device,model_s,collectives\n");
        fprintf(f,
                "matmul,scalapack_%dx%d,%d,%d,grid=%dx%d nb=%d,%s,%d,%d,%d,%d,block-cyclic,"
                "block-cyclic,block-cyclic,%d,%.6f,%.2f,%.6g,,,,,,%.6g,,%s\n",
                pr, pc, np, np, pr, pc, nb, f64 ? "f64" : "f32", batch, M, N, K, reps, t,
                flops / t / 1e9, flops / np, flops / 2 / np, f64 ? "pdgemm" : "psgemm");
        if (f != stdout)
            fclose(f);
        fprintf(stderr, "[scalapack] %s %dx%dx%d on %dx%d: %.4f s, %.1f GFLOP/s\n",
                f64 ? "pdgemm" : "psgemm", M, N, K, pr, pc, t, flops / t / 1e9);
    }
    free(a);
    free(b);
    free(c);
    Cblacs_gridexit(ctx);
    MPI_Finalize();
    return 0;
}
