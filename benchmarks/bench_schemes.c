/* Sharding-scheme comparison harness: matmul under each sharding scheme beside the
 * single-process OpenBLAS limit, every relayout transition against the minimum it must move,
 * and the calibration (alpha, beta, gamma) of the cost model used for projections.
 * benchmarks/run.sh runs all of it and benchmarks/report.py turns the CSV into JSON and plots.
 *
 *   bench_schemes matmul    [--m M --n N --k K --batch B --dtype f64 --mesh x=2 --reps 5
 *                            --warmup 1 --schemes name,name --threads T --out file.csv]
 *   bench_schemes relayout  [--n N --dtype f64 --mesh x=2 --reps 5 --warmup 1 --out file.csv
 *                            --only 'x,unsharded>unsharded,x;x,unsharded>unsharded,unsharded']
 *   bench_schemes calibrate [--mesh x=2 --out calibration.json]
 *
 * Run as one process with DTENSOR_CPU_DEVICES local devices or under mpiexec.mpich -n N; the
 * mesh covers every device. CSV rows come from client 0; progress goes to stderr.
 *
 * matmul: C[batch, m, n] = A[batch, m, k] B[k, n] (no batch axis when batch = 1). Per scheme:
 * the median time of `reps` runs after `warmup` (each run's time is the slowest client's),
 * GFLOP/s of the useful 2·batch·M·N·K flops, flops per device, bytes sent per device as the
 * communication ledger measured them and as the expanded program (the cost model) predicts,
 * the textbook volume of the scheme, the alpha-beta-gamma time the engine's constants predict,
 * and the collectives that ran; the memory a scheme holds above its operands: minor page
 * faults per timed run, peak resident set and its excess over the start, the allocator's peak
 * above what was live (dt_device_memory_reset_peak), and C's shard for comparison. The
 * baseline row is one process of OpenBLAS with as many threads as the mesh has devices, timed by
 * client 0 while the other clients sleep.
 *
 * relayout: a [n, n] tensor between every ordered pair of a set of layouts (sharded on each
 * axis, replicated, partial sums); bytes each device sends and receives (ledger) against the
 * minimum a device must receive: the elements of its new shard it does not hold yet, plus for
 * pending partial sums over g devices a bandwidth-optimal reduction of the smaller of its old
 * and new shard: (g-1) terms per element kept sharded over the partial axes (reduce-scatter),
 * 2(g-1)/g per element left replicated on them (all-reduce). An estimate of the least traffic,
 * not a proof: a plan that reduces before it slices, or gathers what it then slices away,
 * shows up as moving more than this. GB/s is the tensor's global bytes over the median time,
 * beside a 1-thread memcpy of the same bytes in the same run (client 0, the others asleep).
 * `--only` keeps the listed transitions (the layouts as in the table below).
 *
 * calibrate: alpha (seconds per message: an 8-byte all-gather), beta (seconds per byte a device
 * sends: a 64 MiB all-gather and all-reduce), gamma (seconds per multiply-add of one device's
 * GEMM, every device at once), written as JSON for the projection in benchmarks/report.py. */
#include "../spmd/engine.h"
#include "bench.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void openblas_set_num_threads(int);

/* ---- options ------------------------------------------------------------------------------ */

typedef struct opts {
    int64_t m, n, k, batch;
    dt_dtype dtype;
    const char *mesh, *schemes, *only, *out;
    int reps, warmup, threads;
} opts;

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s matmul|relayout|calibrate [--m M] [--n N] [--k K] [--batch B]\n"
            "       [--dtype f32|f64] [--mesh x=2[,y=2]] [--reps R] [--warmup W]\n"
            "       [--schemes a,b,...] [--only 'from>to;from>to'] [--threads T] [--out file]\n",
            argv0);
    exit(2);
}

static opts parse(int argc, char **argv)
{
    opts o = {.m = 0, .n = 1024, .k = 0, .batch = 1, .dtype = DT_DTYPE_F64, .reps = 5, .warmup = 1};
    for (int i = 2; i < argc; i++) {
        if (i + 1 >= argc)
            usage(argv[0]);
        const char *key = argv[i], *v = argv[++i];
        if (!strcmp(key, "--m"))
            o.m = atoll(v);
        else if (!strcmp(key, "--n"))
            o.n = atoll(v);
        else if (!strcmp(key, "--k"))
            o.k = atoll(v);
        else if (!strcmp(key, "--batch"))
            o.batch = atoll(v);
        else if (!strcmp(key, "--dtype") && (!strcmp(v, "f32") || !strcmp(v, "f64")))
            o.dtype = !strcmp(v, "f32") ? DT_DTYPE_F32 : DT_DTYPE_F64;
        else if (!strcmp(key, "--mesh"))
            o.mesh = v;
        else if (!strcmp(key, "--schemes"))
            o.schemes = v;
        else if (!strcmp(key, "--only"))
            o.only = v;
        else if (!strcmp(key, "--out"))
            o.out = v;
        else if (!strcmp(key, "--reps"))
            o.reps = atoi(v);
        else if (!strcmp(key, "--warmup"))
            o.warmup = atoi(v);
        else if (!strcmp(key, "--threads"))
            o.threads = atoi(v);
        else
            usage(argv[0]);
    }
    if (o.m <= 0)
        o.m = o.n;
    if (o.k <= 0)
        o.k = o.n;
    if (o.n <= 0 || o.batch <= 0 || o.reps <= 0 || o.reps > 1000 || o.warmup < 0)
        usage(argv[0]);
    return o;
}

/* ---- timing across clients ---------------------------------------------------------------- */

/* The largest value over clients, the same on every client. */
static double max_over_clients(double v)
{
    if (dt__rt.world == MPI_COMM_NULL)
        return v;
    MPI_Request req;
    double r = v;
    MPI_Iallreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, dt__rt.world, &req);
    bench_wait(&req, false);
    return r;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

typedef void (*run_fn)(void *ctx);

/* Median over `reps` runs after `warmup`, each the slowest client's time. The ledger is
 * cleared before the last run, so it holds exactly one run's collectives afterwards. faults
 * (NULL: not wanted) gets the minor page faults per timed run, the most over clients: what a
 * run costs once the warm-up has faulted in what the caches keep. */
static double time_median(run_fn fn, void *ctx, int warmup, int reps, double *faults)
{
    double t[1000];
    for (int i = 0; i < warmup; i++)
        fn(ctx);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long f0 = ru.ru_minflt;
    for (int r = 0; r < reps; r++) {
        if (r == reps - 1)
            dt_ledger_clear();
        bench_barrier(dt__rt.world, false);
        double t0 = bench_now();
        fn(ctx);
        t[r] = max_over_clients(bench_now() - t0);
    }
    getrusage(RUSAGE_SELF, &ru);
    if (faults)
        *faults = max_over_clients((double)(ru.ru_minflt - f0) / reps);
    return median(t, reps);
}

/* ---- memory of one case ------------------------------------------------------------------- */

/* What a case holds above what was live when it started: the peak resident set (bench.h) and
 * the device allocator's peak (dt_device_memory_reset_peak, then peak - in use), each the most
 * over local devices and clients. The allocator's cache is emptied first, so that blocks an
 * earlier case left cached do not hide what this one needs from the resident set. */
enum { MAX_LOCAL = 64 }; /* local devices whose memory is followed */

typedef struct case_mem {
    bench_usage u;
    size_t live[MAX_LOCAL];
} case_mem;

typedef struct case_mem_result {
    double peak_rss, extra_rss, device_extra; /* bytes */
} case_mem_result;

static void case_mem_start(case_mem *c)
{
    BENCH_CHECK(dt_device_release_cache(DT_DEVICE_CPU, -1));
    int nl = dt_num_local_devices(DT_DEVICE_CPU);
    for (int i = 0; i < nl && i < MAX_LOCAL; i++) {
        dt_memory_stats ms;
        BENCH_CHECK(dt_device_memory_stats(DT_DEVICE_CPU, i, &ms));
        BENCH_CHECK(dt_device_memory_reset_peak(DT_DEVICE_CPU, i));
        c->live[i] = ms.in_use;
    }
    c->u = bench_usage_start();
}

static case_mem_result case_mem_end(const case_mem *c)
{
    long faults, peak, extra;
    bench_usage_end(&c->u, &faults, &peak, &extra);
    double dev = 0;
    int nl = dt_num_local_devices(DT_DEVICE_CPU);
    for (int i = 0; i < nl && i < MAX_LOCAL; i++) {
        dt_memory_stats ms;
        BENCH_CHECK(dt_device_memory_stats(DT_DEVICE_CPU, i, &ms));
        double e = (double)ms.peak - (double)c->live[i];
        dev = e > dev ? e : dev;
    }
    return (case_mem_result){.peak_rss = max_over_clients(1024.0 * (double)peak),
                             .extra_rss = max_over_clients(1024.0 * (double)extra),
                             .device_extra = max_over_clients(dev)};
}

/* ---- the ledger of one run ---------------------------------------------------------------- */

typedef struct ledger_sum {
    double sent, received; /* bytes per device, the most over clients */
    double msgs;           /* alpha terms: 2(g-1) per all-reduce, g-1 per other collective */
    double seconds;        /* in collectives, waits for late clients included (the most) */
    char ops[256];         /* "all_gather{x} reduce_scatter{y}" */
} ledger_sum;

static ledger_sum ledger_read(void)
{
    ledger_sum s;
    memset(&s, 0, sizeof s);
    size_t n = 0;
    for (int64_t i = 0; i < dt_ledger_size(); i++) {
        dt_ledger_entry e;
        BENCH_CHECK(dt_ledger_entry_get(i, &e));
        s.sent += (double)e.bytes_sent;
        s.received += (double)e.bytes_received;
        s.seconds += e.seconds;
        int g = e.group_size;
        s.msgs += strcmp(e.op, "all_reduce") == 0 ? 2.0 * (g - 1) : (double)(g - 1);
        if (n < sizeof s.ops - 64)
            n += (size_t)snprintf(s.ops + n, sizeof s.ops - n, "%s%s{%s}", n ? " " : "", e.op,
                                  e.axes_names);
    }
    s.sent = max_over_clients(s.sent);
    s.received = max_over_clients(s.received);
    s.msgs = max_over_clients(s.msgs);
    s.seconds = max_over_clients(s.seconds);
    if (!n)
        snprintf(s.ops, sizeof s.ops, "none");
    return s;
}

static FILE *open_out(const opts *o)
{
    if (dt_client_id() != 0)
        return NULL;
    if (!o->out)
        return stdout;
    FILE *f = fopen(o->out, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", o->out);
        exit(1);
    }
    return f;
}

static void close_out(FILE *f)
{
    if (f && f != stdout)
        fclose(f);
    else if (f)
        fflush(f);
}

static char *mesh_spec(const opts *o, char *buf, size_t size)
{
    if (o->mesh)
        snprintf(buf, size, "%s", o->mesh);
    else
        snprintf(buf, size, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    return buf;
}

/* ---- matmul schemes ----------------------------------------------------------------------- */

typedef enum volume {
    V_NONE,       /* no communication */
    V_GATHER_B,   /* (P-1)/P·K·N */
    V_ALL_REDUCE, /* 2(P-1)/P·batch·M·N */
    V_REDUCE_SCATTER,
    V_2D_GATHER, /* A gathered over y, B over x */
    V_2D_REDUCE_SCATTER,
    V_FREE, /* the engine chooses: no textbook value */
} volume;

/* Layouts of A [m, k], B [k, n] and C [m, n] (a leading unsharded batch axis is added to A and
 * C when batch > 1); c NULL: the engine picks the output layout (and so the expansion). */
typedef struct scheme {
    const char *name;
    int mesh_rank;
    const char *a, *b, *c;
    volume vol;
    const char *what;
} scheme;

static const scheme schemes[] = {
    {"replicated", 1, "unsharded,unsharded", "unsharded,unsharded", "unsharded,unsharded", V_NONE,
     "every device computes all of C"},
    {"row", 1, "x,unsharded", "unsharded,unsharded", "x,unsharded", V_NONE,
     "rows of A and C, B replicated"},
    {"row_gather_b", 1, "x,unsharded", "x,unsharded", "x,unsharded", V_GATHER_B,
     "rows of A and C, B sharded: all-gather B"},
    {"column", 1, "unsharded,unsharded", "unsharded,x", "unsharded,x", V_NONE,
     "columns of B and C, A replicated"},
    {"contracting_allreduce", 1, "unsharded,x", "x,unsharded", "unsharded,unsharded", V_ALL_REDUCE,
     "k sharded, partial C all-reduced"},
    {"contracting_reducescatter", 1, "unsharded,x", "x,unsharded", "x,unsharded", V_REDUCE_SCATTER,
     "k sharded, partial C reduce-scattered over rows"},
    {"auto", 1, "x,unsharded", "x,unsharded", NULL, V_FREE,
     "A and B row-sharded, output layout chosen by the cost model"},
    {"2d", 2, "x,y", "x,y", "x,y", V_2D_GATHER,
     "2-D blocks: A gathered over y, B over x (SUMMA volume)"},
    {"2d_contracting", 2, "x,y", "y,unsharded", "x,y", V_2D_REDUCE_SCATTER,
     "rows on x, k on y: partial C reduce-scattered over y"},
    {"auto_2d", 2, "x,y", "x,y", NULL, V_FREE, "2-D blocks, output chosen by the cost model"},
};
enum { NUM_SCHEMES = sizeof schemes / sizeof schemes[0] };

/* Textbook bytes each device sends (even shards), in elements times the element size. */
static double textbook(volume v, double M, double N, double K, double batch, double px, double py,
                       double es)
{
    double p = px * py;
    switch (v) {
    case V_NONE:
        return 0;
    case V_GATHER_B:
        return (p - 1) / p * K * N * es;
    case V_ALL_REDUCE:
        return 2 * (p - 1) / p * batch * M * N * es;
    case V_REDUCE_SCATTER:
        return (p - 1) / p * batch * M * N * es;
    case V_2D_GATHER:
        return ((py - 1) * batch * (M / px) * (K / py) + (px - 1) * (K / px) * (N / py)) * es;
    case V_2D_REDUCE_SCATTER:
        return (py - 1) / py * batch * (M / px) * N * es;
    case V_FREE:
        break;
    }
    return NAN;
}

static bool wanted(const opts *o, const char *name)
{
    if (!o->schemes || !*o->schemes || !strcmp(o->schemes, "all"))
        return true;
    size_t len = strlen(name);
    for (const char *p = o->schemes; p && *p;) {
        const char *q = strchr(p, ',');
        size_t l = q ? (size_t)(q - p) : strlen(p);
        if (l == len && !strncmp(p, name, len))
            return true;
        p = q ? q + 1 : NULL;
    }
    return false;
}

/* "unsharded," + text when the tensor has a batch axis. */
static void with_batch(char *buf, size_t size, const char *text, bool batch)
{
    snprintf(buf, size, "%s%s", batch ? "unsharded," : "", text);
}

typedef struct fn_ctx {
    const dt_function *f;
    int nin;
    const dt_tensor *const *in;
} fn_ctx;

static void run_function(void *ctx)
{
    fn_ctx *c = ctx;
    dt_tensor *out = NULL;
    BENCH_CHECK(dt_function_run(c->f, c->nin, c->in, 1, &out));
    dt_tensor_free(out);
}

typedef struct gemm_ctx {
    const opts *o;
    void *a, *b, *c;
} gemm_ctx;

static void run_gemm(void *ctx)
{
    gemm_ctx *g = ctx;
    const opts *o = g->o;
    int M = (int)o->m, N = (int)o->n, K = (int)o->k;
    for (int64_t i = 0; i < o->batch; i++) {
        if (o->dtype == DT_DTYPE_F64)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1,
                        (double *)g->a + i * M * K, K, g->b, N, 0, (double *)g->c + i * M * N, N);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1,
                        (float *)g->a + i * M * K, K, g->b, N, 0, (float *)g->c + i * M * N, N);
    }
}

static void *filled(size_t elems, size_t es)
{
    char *p = aligned_alloc(64, (elems * es + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "out of memory for %zu elements\n", elems);
        exit(1);
    }
    for (size_t i = 0; i < elems; i++) {
        double v = (double)(i % 13) * 0.01;
        if (es == 8)
            ((double *)(void *)p)[i] = v;
        else
            ((float *)(void *)p)[i] = (float)v;
    }
    return p;
}

/* One process of OpenBLAS with `threads` threads on client 0, the others asleep. Returns the
 * median seconds (the same on every client). */
static double openblas_baseline(const opts *o, int threads)
{
    double t = 0;
    if (dt_client_id() == 0) {
        size_t es = dt_dtype_size(o->dtype);
        gemm_ctx g = {.o = o,
                      .a = filled((size_t)(o->batch * o->m * o->k), es),
                      .b = filled((size_t)(o->k * o->n), es),
                      .c = filled((size_t)(o->batch * o->m * o->n), es)};
        openblas_set_num_threads(threads);
        double ts[1000];
        for (int i = 0; i < o->warmup; i++)
            run_gemm(&g);
        for (int r = 0; r < o->reps; r++) {
            double t0 = bench_now();
            run_gemm(&g);
            ts[r] = bench_now() - t0;
        }
        t = median(ts, o->reps);
        openblas_set_num_threads(1);
        free(g.a);
        free(g.b);
        free(g.c);
    }
    bench_barrier(dt__rt.world, true);
    return max_over_clients(t);
}

static void matmul(const opts *o)
{
    char spec[DT_STRING_MAX];
    dt_mesh *m;
    BENCH_CHECK(dt_mesh_create_from_string(mesh_spec(o, spec, sizeof spec), DT_DEVICE_CPU, &m));
    int mr = dt_mesh_num_axes(m), P = dt_mesh_size(m);
    int px = dt_mesh_axis_size(m, 0), py = mr > 1 ? dt_mesh_axis_size(m, 1) : 1;
    int threads = o->threads > 0 ? o->threads : P;
    FILE *out = open_out(o);
    bool bat = o->batch > 1;
    double es = (double)dt_dtype_size(o->dtype);
    double flops = 2.0 * (double)o->batch * (double)o->m * (double)o->n * (double)o->k;
    if (out)
        fprintf(out, "section,scheme,clients,devices,mesh,dtype,batch,m,n,k,layout_a,layout_b,"
                     "layout_c,reps,median_s,gflops,flops_per_device,bytes_sent_per_device,"
                     "bytes_received_per_device,model_bytes_per_device,textbook_bytes_per_device,"
                     "messages,madds_per_device,model_s,collectives,ratio_to_openblas,"
                     "minor_faults_per_run,peak_rss_bytes,extra_rss_bytes,"
                     "device_extra_bytes,output_bytes_per_device,collective_s\n");

    if (dt_client_id() == 0)
        fprintf(stderr, "[matmul] baseline: OpenBLAS, 1 process, %d threads, %s %lldx%lldx%lld\n",
                threads, dt_dtype_name(o->dtype), (long long)o->m, (long long)o->n,
                (long long)o->k);
    double tb = openblas_baseline(o, threads);
    if (out)
        fprintf(
            out,
            "matmul,openblas_%d_threads,1,1,-,%s,%lld,%lld,%lld,%lld,-,-,-,%d,%.6f,%.2f,%.6g,0,0,"
            "0,0,0,%.6g,,none,1.0000,,,,,,\n",
            threads, dt_dtype_name(o->dtype), (long long)o->batch, (long long)o->m, (long long)o->n,
            (long long)o->k, o->reps, tb, flops / tb / 1e9, flops, flops / 2);

    for (int s = 0; s < NUM_SCHEMES; s++) {
        const scheme *sc = &schemes[s];
        if (sc->mesh_rank != mr || !wanted(o, sc->name))
            continue;
        if (dt_client_id() == 0)
            fprintf(stderr, "[matmul] %s: %s ...\n", sc->name, sc->what);
        char ta[64], tc[64];
        dt_layout la, lb, lc;
        with_batch(ta, sizeof ta, sc->a, bat);
        BENCH_CHECK(dt_layout_parse(m, ta, &la));
        BENCH_CHECK(dt_layout_parse(m, sc->b, &lb));
        if (sc->c) {
            with_batch(tc, sizeof tc, sc->c, bat);
            BENCH_CHECK(dt_layout_parse(m, tc, &lc));
        }
        int ra = bat ? 3 : 2;
        int64_t sa[3], sb[2] = {o->k, o->n};
        sa[0] = o->batch;
        sa[ra - 2] = o->m;
        sa[ra - 1] = o->k;
        dt_tensor *a, *b;
        BENCH_CHECK(
            dt_random_uniform(o->dtype, ra, sa, 7, 1, -1, 1, &(dt_op_options){.layout = &la}, &a));
        BENCH_CHECK(
            dt_random_uniform(o->dtype, 2, sb, 7, 2, -1, 1, &(dt_op_options){.layout = &lb}, &b));
        dt_function *f;
        dt_tensor *sa_, *sb_, *sc_;
        BENCH_CHECK(dt_function_begin(&f));
        BENCH_CHECK(dt_function_input(f, &la, o->dtype, ra, sa, &sa_));
        BENCH_CHECK(dt_function_input(f, &lb, o->dtype, 2, sb, &sb_));
        BENCH_CHECK(dt_matmul(sa_, sb_, &(dt_op_options){.layout = sc->c ? &lc : NULL}, &sc_));
        BENCH_CHECK(dt_function_end(f, 1, &sc_));
        double mults, model_bytes;
        int colls;
        BENCH_CHECK(dt_function_cost(f, &mults, &colls, &model_bytes));
        const dt_tensor *in[2] = {a, b};
        fn_ctx c = {.f = f, .nin = 2, .in = in};
        case_mem cm;
        case_mem_start(&cm);
        double faults;
        double t = time_median(run_function, &c, o->warmup, o->reps, &faults);
        case_mem_result mem = case_mem_end(&cm);
        ledger_sum l = ledger_read();
        char lcs[DT_STRING_MAX] = "auto";
        if (sc->c)
            BENCH_CHECK(dt_layout_to_string(&lc, lcs, sizeof lcs));
        double madds = mults / P; /* every scheme here balances its GEMM over the devices */
        /* C's shard on the busiest device: the result a scheme must hold */
        double out_bytes = (double)o->batch * (double)o->m * (double)o->n * es;
        for (int i = 0; sc->c && i < lc.rank; i++)
            out_bytes /= dt_layout_num_shards(&lc, i);
        double model_s = DT__GAMMA * madds + DT__ALPHA * l.msgs + DT__BETA * model_bytes;
        double tbk = textbook(sc->vol, (double)o->m, (double)o->n, (double)o->k, (double)o->batch,
                              px, py, es);
        if (out)
            fprintf(out,
                    "matmul,%s,%d,%d,\"%s\",%s,%lld,%lld,%lld,%lld,\"%s\",\"%s\",\"%s\",%d,%.6f,"
                    "%.2f,%.6g,%.0f,%.0f,%.0f,%.0f,%.0f,%.6g,%.6g,\"%s\",%.4f,%.0f,%.0f,%.0f,%.0f,"
                    "%.0f,%.6f\n",
                    sc->name, dt_num_clients(), P, spec, dt_dtype_name(o->dtype),
                    (long long)o->batch, (long long)o->m, (long long)o->n, (long long)o->k, ta,
                    sc->b, lcs, o->reps, t, flops / t / 1e9, 2 * madds, l.sent, l.received,
                    model_bytes, tbk, l.msgs, madds, model_s, l.ops, tb / t, faults, mem.peak_rss,
                    mem.extra_rss, mem.device_extra, out_bytes, l.seconds);
        if (dt_client_id() == 0)
            fprintf(stderr,
                    "[matmul] %s: %.4f s, %.1f GFLOP/s (%.3f of OpenBLAS), %s %.4f s; %.0f faults "
                    "per run, peak RSS %.0f MiB (+%.0f), device peak +%.0f MiB (output %.0f MiB)\n",
                    sc->name, t, flops / t / 1e9, tb / t, l.ops, l.seconds, faults,
                    mem.peak_rss / 1048576, mem.extra_rss / 1048576, mem.device_extra / 1048576,
                    out_bytes / 1048576);
        if (out)
            fflush(out);
        dt_tensor_free(sa_);
        dt_tensor_free(sb_);
        dt_tensor_free(sc_);
        dt_function_free(f);
        dt_tensor_free(a);
        dt_tensor_free(b);
    }
    close_out(out);
    dt_mesh_free(m);
}

/* ---- relayout ----------------------------------------------------------------------------- */

static const char *const layouts_1d[] = {
    "unsharded,unsharded",
    "x,unsharded",
    "unsharded,x",
    "unsharded,unsharded;partial_sum=x",
};
static const char *const layouts_2d[] = {
    "unsharded,unsharded",
    "x,unsharded",
    "unsharded,x",
    "y,unsharded",
    "unsharded,y",
    "x,y",
    "y,x",
    "unsharded,unsharded;partial_sum=x",
    "x,unsharded;partial_sum=y",
    "unsharded,unsharded;partial_sum=x+y",
};

/* Elements of a box (local shape at offset) that also lie in another. */
static int64_t overlap(const int64_t s1[], const int64_t o1[], const int64_t s2[],
                       const int64_t o2[], int rank)
{
    int64_t v = 1;
    for (int i = 0; i < rank; i++) {
        int64_t lo = o1[i] > o2[i] ? o1[i] : o2[i];
        int64_t hi = o1[i] + s1[i] < o2[i] + s2[i] ? o1[i] + s1[i] : o2[i] + s2[i];
        v *= hi > lo ? hi - lo : 0;
    }
    return v;
}

static int group_of(const dt_mesh *m, unsigned axes)
{
    int g = 1;
    for (int a = 0; a < dt_mesh_num_axes(m); a++)
        if (axes & (1u << a))
            g *= dt_mesh_axis_size(m, a);
    return g;
}

static int coord_of(const dt_mesh *m, int device, int axis)
{
    int c[DT_MAX_MESH_AXES];
    dt_mesh_device_coords(m, device, c);
    return c[axis];
}

/* The least elements a device must receive to go from `from` to `to` (the most over devices),
 * as the header comment defines it. */
static double min_received(const dt_layout *from, const dt_layout *to, const int64_t shape[])
{
    const dt_mesh *m = from->mesh;
    int rank = from->rank;
    dt_layout plain = *from;
    plain.partial = 0;
    unsigned resolved = from->partial & ~(to->partial);
    double most = 0;
    for (int d = 0; d < dt_mesh_size(m); d++) {
        int64_t s1[DT_MAX_RANK], o1[DT_MAX_RANK], s2[DT_MAX_RANK], o2[DT_MAX_RANK];
        dt_layout_local_shape(&plain, shape, d, s1, o1);
        dt_layout_local_shape(to, shape, d, s2, o2);
        int64_t box = 1;
        for (int i = 0; i < rank; i++)
            box *= s2[i];
        /* into a partial layout only member 0 of each partial group needs the value */
        bool needs = true;
        for (int a = 0; a < dt_mesh_num_axes(m); a++)
            if ((to->partial & ~from->partial & (1u << a)) && coord_of(m, d, a) != 0)
                needs = false;
        int64_t src = 1;
        for (int i = 0; i < rank; i++)
            src *= s1[i];
        double v = needs ? (double)(box - overlap(s2, o2, s1, o1, rank)) : 0;
        if (resolved) {
            /* pending sums over `resolved`: the mesh axes of it that shard the result are a
             * reduce-scatter ((g-1) terms per element kept), the rest an all-reduce */
            unsigned scattered = 0;
            for (int i = 0; i < rank; i++)
                if (to->axes[i] != DT_UNSHARDED && (resolved & (1u << to->axes[i])))
                    scattered |= 1u << to->axes[i];
            int gs = group_of(m, scattered), ga = group_of(m, resolved & ~scattered);
            /* reduced where the region is smaller: before or after the data moves */
            double rs = (double)box < (double)src / gs ? (double)box : (double)src / gs;
            double ar = box < src ? (double)box : (double)src;
            v += (gs - 1) * rs + 2.0 * (ga - 1) / ga * ar;
        }
        most = v > most ? v : most;
    }
    return most;
}

/* Whether `--only` (a ';'-separated list of "from>to") keeps the transition; all without it. */
static bool pair_wanted(const opts *o, const char *from, const char *to)
{
    if (!o->only || !*o->only)
        return true;
    char want[2 * DT_STRING_MAX + 2];
    snprintf(want, sizeof want, "%s>%s", from, to);
    size_t len = strlen(want);
    for (const char *p = o->only; p && *p;) {
        const char *q = strchr(p, ';');
        size_t l = q ? (size_t)(q - p) : strlen(p);
        if (l == len && !strncmp(p, want, len))
            return true;
        p = q ? q + 1 : NULL;
    }
    return false;
}

typedef struct copy_ctx {
    void *dst;
    const void *src;
    size_t bytes;
} copy_ctx;

static void run_memcpy(void *ctx)
{
    copy_ctx *c = ctx;
    memcpy(c->dst, c->src, c->bytes);
}

/* 1-thread memcpy of `bytes` between two buffers faulted in beforehand, on client 0 while the
 * others sleep: median seconds, the same on every client. */
static double memcpy_baseline(size_t bytes, int warmup, int reps)
{
    double t = 0;
    if (dt_client_id() == 0) {
        /* bytes is a whole number of floats: n^2 elements of 4 or 8 bytes */
        copy_ctx c = {.dst = filled(bytes / sizeof(float), sizeof(float)),
                      .src = filled(bytes / sizeof(float), sizeof(float)),
                      .bytes = bytes};
        double ts[1000];
        for (int i = 0; i < warmup; i++)
            run_memcpy(&c);
        for (int r = 0; r < reps; r++) {
            double t0 = bench_now();
            run_memcpy(&c);
            ts[r] = bench_now() - t0;
        }
        t = median(ts, reps);
        free(c.dst);
        free((void *)c.src);
    }
    bench_barrier(dt__rt.world, true);
    return max_over_clients(t);
}

static void relayout(const opts *o)
{
    char spec[DT_STRING_MAX];
    dt_mesh *m;
    BENCH_CHECK(dt_mesh_create_from_string(mesh_spec(o, spec, sizeof spec), DT_DEVICE_CPU, &m));
    int mr = dt_mesh_num_axes(m), P = dt_mesh_size(m);
    const char *const *ls = mr == 1 ? layouts_1d : layouts_2d;
    int nl =
        mr == 1 ? (int)(sizeof layouts_1d / sizeof *ls) : (int)(sizeof layouts_2d / sizeof *ls);
    FILE *out = open_out(o);
    const int64_t shape[2] = {o->n, o->n};
    double es = (double)dt_dtype_size(o->dtype);
    if (out)
        fprintf(out, "section,from,to,clients,devices,mesh,dtype,n,reps,median_s,"
                     "bytes_sent_per_device,bytes_received_per_device,model_bytes_per_device,"
                     "min_received_bytes_per_device,collectives,gbps,ratio_to_memcpy,"
                     "minor_faults_per_run,peak_rss_bytes,extra_rss_bytes,device_extra_bytes\n");
    double bytes = (double)o->n * (double)o->n * es;
    double tm = memcpy_baseline((size_t)bytes, o->warmup, o->reps);
    if (out)
        fprintf(out, "relayout,memcpy,memcpy,1,1,-,%s,%lld,%d,%.6g,0,0,0,0,none,%.3f,1.000,,,,\n",
                dt_dtype_name(o->dtype), (long long)o->n, o->reps, tm, bytes / tm / 1e9);
    if (dt_client_id() == 0)
        fprintf(stderr, "[relayout] memcpy of %.0f MiB, 1 thread: %.2f GB/s\n", bytes / 1048576,
                bytes / tm / 1e9);
    for (int i = 0; i < nl; i++) {
        bool any = false;
        for (int j = 0; j < nl; j++)
            any = any || (i != j && pair_wanted(o, ls[i], ls[j]));
        if (!any)
            continue;
        dt_layout from, plain;
        BENCH_CHECK(dt_layout_parse(m, ls[i], &from));
        plain = from;
        plain.partial = 0;
        plain.partial_op = DT_REDUCE_SUM;
        dt_tensor *x0, *x;
        BENCH_CHECK(dt_random_uniform(o->dtype, 2, shape, 3, 1, -1, 1,
                                      &(dt_op_options){.layout = &plain}, &x0));
        BENCH_CHECK(dt_relayout(x0, &from, NULL, &x));
        dt_tensor_free(x0);
        if (dt_client_id() == 0)
            fprintf(stderr, "[relayout] from %s (%d of %d)\n", ls[i], i + 1, nl);
        for (int j = 0; j < nl; j++) {
            if (i == j || !pair_wanted(o, ls[i], ls[j]))
                continue;
            dt_layout to;
            BENCH_CHECK(dt_layout_parse(m, ls[j], &to));
            dt_function *f;
            dt_tensor *sx, *sy;
            BENCH_CHECK(dt_function_begin(&f));
            BENCH_CHECK(dt_function_input(f, &from, o->dtype, 2, shape, &sx));
            BENCH_CHECK(dt_relayout(sx, &to, NULL, &sy));
            BENCH_CHECK(dt_function_end(f, 1, &sy));
            double model_bytes;
            BENCH_CHECK(dt_function_cost(f, NULL, NULL, &model_bytes));
            const dt_tensor *in[1] = {x};
            fn_ctx c = {.f = f, .nin = 1, .in = in};
            case_mem cm;
            case_mem_start(&cm);
            double faults;
            double t = time_median(run_function, &c, o->warmup, o->reps, &faults);
            case_mem_result mem = case_mem_end(&cm);
            ledger_sum l = ledger_read();
            double lo = min_received(&from, &to, shape) * es;
            if (out) {
                fprintf(out,
                        "relayout,\"%s\",\"%s\",%d,%d,\"%s\",%s,%lld,%d,%.6g,%.0f,%.0f,%.0f,%.0f,"
                        "\"%s\",%.3f,%.3f,%.0f,%.0f,%.0f,%.0f\n",
                        ls[i], ls[j], dt_num_clients(), P, spec, dt_dtype_name(o->dtype),
                        (long long)o->n, o->reps, t, l.sent, l.received, model_bytes, lo, l.ops,
                        bytes / t / 1e9, tm / t, faults, mem.peak_rss, mem.extra_rss,
                        mem.device_extra);
                fflush(out);
            }
            if (dt_client_id() == 0 && o->only)
                fprintf(stderr,
                        "[relayout] %s -> %s: %.2f GB/s (%.2f of memcpy), %.0f faults per run, "
                        "device peak +%.0f MiB\n",
                        ls[i], ls[j], bytes / t / 1e9, tm / t, faults, mem.device_extra / 1048576);
            dt_tensor_free(sx);
            dt_tensor_free(sy);
            dt_function_free(f);
        }
        dt_tensor_free(x);
    }
    close_out(out);
    dt_mesh_free(m);
}

/* ---- calibration -------------------------------------------------------------------------- */

typedef struct coll_ctx {
    const dt_mesh *m;
    dt__coll c;
} coll_ctx;

static void run_coll(void *ctx)
{
    coll_ctx *c = ctx;
    BENCH_CHECK(dt__collective(c->m, &c->c));
}

/* Median seconds of one collective of `count` f64 elements per block on mask x (all devices
 * of a 1-D mesh), and the bytes a device sent (ledger). */
static double time_coll(const dt_mesh *m, dt__coll_kind kind, int64_t count, int reps, double *sent)
{
    int nl = dt_mesh_num_local_devices(m), g = dt_mesh_size(m);
    int64_t big = kind == DT__COLL_ALL_REDUCE ? count : count * g;
    void **sb = calloc((size_t)nl, sizeof *sb), **rb = calloc((size_t)nl, sizeof *rb);
    for (int i = 0; i < nl; i++) {
        sb[i] = filled((size_t)big, 8);
        rb[i] = filled((size_t)big, 8);
    }
    coll_ctx c = {.m = m,
                  .c = {.kind = kind,
                        .dtype = DT_DTYPE_F64,
                        .op = DT_REDUCE_SUM,
                        .axes = 1u,
                        .send = (const void *const *)sb,
                        .recv = rb,
                        .count = count,
                        .cause = "calibrate"}};
    double t = time_median(run_coll, &c, 2, reps, NULL);
    *sent = ledger_read().sent;
    for (int i = 0; i < nl; i++) {
        free(sb[i]);
        free(rb[i]);
    }
    free(sb);
    free(rb);
    return t;
}

typedef struct local_gemm_ctx {
    int n;
    bool f64;
    void *a, *b, *c;
} local_gemm_ctx;

/* Every client runs one 1-thread GEMM at once (a device's rate with its neighbours busy). */
static void run_local_gemm(void *ctx)
{
    local_gemm_ctx *g = ctx;
    if (g->f64)
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1, g->a, g->n,
                    g->b, g->n, 0, g->c, g->n);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1, g->a, g->n,
                    g->b, g->n, 0, g->c, g->n);
}

static void calibrate(const opts *o)
{
    dt_mesh *m;
    char spec[32];
    snprintf(spec, sizeof spec, "x=%d", dt_num_global_devices(DT_DEVICE_CPU));
    BENCH_CHECK(dt_mesh_create_from_string(spec, DT_DEVICE_CPU, &m));
    int g = dt_mesh_size(m);
    if (dt_client_id() == 0)
        fprintf(stderr, "[calibrate] alpha, beta on %s; gamma per device\n", spec);
    double sent_small, sent_ag, sent_ar;
    double t_small = g > 1 ? time_coll(m, DT__COLL_ALL_GATHER, 1, 201, &sent_small) : 0;
    double alpha = g > 1 ? t_small / (g - 1) : 0;
    int64_t big = ((int64_t)64 << 20) / 8;
    double t_ag = g > 1 ? time_coll(m, DT__COLL_ALL_GATHER, big / g, 7, &sent_ag) : 0;
    double t_ar = g > 1 ? time_coll(m, DT__COLL_ALL_REDUCE, big, 7, &sent_ar) : 0;
    double beta_ag = g > 1 ? (t_ag - alpha * (g - 1)) / sent_ag : 0;
    double beta_ar = g > 1 ? (t_ar - alpha * 2 * (g - 1)) / sent_ar : 0;
    double gamma[2];
    for (int f64 = 0; f64 < 2; f64++) {
        int n = 2048;
        local_gemm_ctx c = {.n = n, .f64 = f64 != 0};
        size_t es = f64 ? 8 : 4;
        c.a = filled((size_t)n * n, es);
        c.b = filled((size_t)n * n, es);
        c.c = filled((size_t)n * n, es);
        openblas_set_num_threads(1);
        gamma[f64] = time_median(run_local_gemm, &c, 1, 5, NULL) / ((double)n * n * n);
        free(c.a);
        free(c.b);
        free(c.c);
    }
    FILE *out = open_out(o);
    if (out) {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        fprintf(out,
                "{\n  \"host\": \"%s\",\n  \"clients\": %d,\n  \"devices\": %d,\n"
                "  \"alpha_s\": %.6g,\n  \"beta_s_per_byte\": {\"all_gather\": %.6g, "
                "\"all_reduce\": %.6g, \"reduce_scatter\": %.6g},\n"
                "  \"gamma_s_per_madd\": {\"f32\": %.6g, \"f64\": %.6g},\n"
                "  \"engine_constants\": {\"alpha_s\": %g, \"beta_s_per_byte\": %g, "
                "\"gamma_s_per_madd\": %g},\n"
                "  \"how\": \"alpha: median 8-byte all-gather / (g-1); beta: median 64 MiB "
                "all-gather (all-reduce) less its alpha terms, per byte a device sends (ledger); "
                "reduce-scatter takes the all-reduce's; gamma: median 1-thread GEMM n=2048 on "
                "every client at once, per multiply-add\"\n}\n",
                host, dt_num_clients(), g, alpha, beta_ag, beta_ar, beta_ar, gamma[0], gamma[1],
                DT__ALPHA, DT__BETA, DT__GAMMA);
        fprintf(stderr,
                "[calibrate] alpha %.3g s, beta %.3g s/B (all-gather) %.3g (all-reduce), gamma "
                "f32 %.3g f64 %.3g s/madd\n",
                alpha, beta_ag, beta_ar, gamma[0], gamma[1]);
    }
    close_out(out);
    dt_mesh_free(m);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage(argv[0]);
    const char *cmd = argv[1];
    if (strcmp(cmd, "matmul") && strcmp(cmd, "relayout") && strcmp(cmd, "calibrate"))
        usage(argv[0]);
    opts o = parse(argc, argv);
    openblas_set_num_threads(1);
    BENCH_CHECK(dt_init(NULL));
    if (!strcmp(cmd, "matmul"))
        matmul(&o);
    else if (!strcmp(cmd, "relayout"))
        relayout(&o);
    else
        calibrate(&o);
    BENCH_CHECK(dt_finalize());
    return 0;
}
