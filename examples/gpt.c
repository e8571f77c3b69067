/* A GPT-style decoder trained on a 2-D mesh `batch x model`, as Megatron-LM shards it: the
 * batch over `batch`; attention heads and the MLP's hidden axis over `model` (column-parallel
 * projections, then row-parallel ones); between those regions the residual stream split over
 * `model` along the sequence (sequence parallelism: an all-gather into each region, recomputed
 * by the gradient, and a reduce-scatter out of it); the token embedding and the tied output
 * projection split over the vocabulary (each shard looks up the ids it owns; the logits are
 * never gathered: the cross-entropy reduces per-row statistics across the shards). AdamW.
 *
 *   gpt [1|data|model|2d] [steps] [f32|bf16] [cpu|gpu]
 *                                   train under one sharding, print each step's loss
 *   gpt compare [steps] [f32|bf16] [cpu|gpu]
 *                                   every sharding in turn: the same loss curve (within 1e-5 in
 *                                   f32, BF16_TOL in bf16), Megatron's collectives in the forward
 *                                   pass, and each device's share of the parameters and of a
 *                                   training step's memory; exit 1 if any fails
 *   gpt bench [steps] [f32|bf16] [cpu|gpu] [1|data|model|2d]
 *                                   steps per second of each sharding (or of the one named), by
 *                                   the clock and per second of this process's CPU time (the
 *                                   figure to compare on a loaded machine), and the share of the
 *                                   step time spent in collectives (the ledger)
 *   gpt program                     print the expanded forward pass under 2d
 * Four devices in all: DTENSOR_CPU_DEVICES=4 gpt, or mpiexec.mpich -n 2 (2 devices each) or
 * -n 4; on GPUs, DTENSOR_CUDA_DEVICES=4 makes one GPU four logical ones. The sharding "1" runs
 * on global device 0 alone (the other clients hold nothing of it). The task: sequences where
 * each next token is a fixed permutation of the current one. */
#include <dtensor.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        dt_status s_ = (x);                                                              \
        if (s_ != DT_OK) {                                                               \
            fprintf(stderr, "client %d: %s: %s\n", dt_client_id(), #x, dt_last_error()); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* vocabulary V, sequence T, model width D, heads H of E = D / H, MLP hidden F, blocks NL,
 * global batch B */
enum { V = 512, T = 16, D = 64, H = 4, E = D / H, F = 4 * D, NL = 2, B = 8 };
enum { MAX_STEPS = 200 };
#define BF16_TOL 1e-2

/* The parameters' and activations' dtype (f32, or bf16 with the cross-entropy in f32). */
static dt_dtype dtype = DT_DTYPE_F32;
/* The devices' type: CPU, or CUDA (gpu). */
static dt_device_type dev = DT_DEVICE_CPU;

/* ---- parameters ---------------------------------------------------------------------------- */

/* Each parameter's global shape and layout on the mesh (axes "batch", "model"); initial
 * values N(0, scale) from one Philox stream per parameter, the same under every sharding.
 * Scale 0: zeros; scale -1: ones (layer norms). */
typedef struct param {
    char name[24];
    int rank;
    int64_t shape[3];
    const char *layout;
    double scale;
} param;

/* Per block: ln1 gamma, beta; wq, wk, wv [D, H, E] with heads on model (column-parallel);
 * wo [H, E, D] (row-parallel); ln2; w1 [D, F] column-parallel, b1 [F]; w2 [F, D] row-parallel,
 * b2 [D]. */
enum {
    P_WTE,
    P_WPE,
    P_FIRST_BLOCK,
    PER_BLOCK = 12,
    P_LNF_G = P_FIRST_BLOCK + NL * PER_BLOCK,
    P_LNF_B,
    NP
};
enum { B_LN1_G, B_LN1_B, B_WQ, B_WK, B_WV, B_WO, B_LN2_G, B_LN2_B, B_W1, B_B1, B_W2, B_B2 };

static param params[NP];

static void set(int i, const char *name, int rank, int64_t a, int64_t b, int64_t c,
                const char *layout, double scale)
{
    param *p = &params[i];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->rank = rank;
    p->shape[0] = a;
    p->shape[1] = b;
    p->shape[2] = c;
    p->layout = layout;
    p->scale = scale;
}

static void describe_params(void)
{
    double s = 0.02, out = 0.02 / sqrt(2.0 * NL); /* GPT-2: residual projections scaled */
    set(P_WTE, "wte", 2, V, D, 0, "model,unsharded", s);
    set(P_WPE, "wpe", 2, T, D, 0, "unsharded,unsharded", s);
    for (int l = 0; l < NL; l++) {
        int b = P_FIRST_BLOCK + l * PER_BLOCK;
        char n[24];
#define NAME(what) (snprintf(n, sizeof n, "h%d.%s", l, what), n)
        set(b + B_LN1_G, NAME("ln1.gamma"), 1, D, 0, 0, "unsharded", -1);
        set(b + B_LN1_B, NAME("ln1.beta"), 1, D, 0, 0, "unsharded", 0);
        set(b + B_WQ, NAME("wq"), 3, D, H, E, "unsharded,model,unsharded", s);
        set(b + B_WK, NAME("wk"), 3, D, H, E, "unsharded,model,unsharded", s);
        set(b + B_WV, NAME("wv"), 3, D, H, E, "unsharded,model,unsharded", s);
        set(b + B_WO, NAME("wo"), 3, H, E, D, "model,unsharded,unsharded", out);
        set(b + B_LN2_G, NAME("ln2.gamma"), 1, D, 0, 0, "unsharded", -1);
        set(b + B_LN2_B, NAME("ln2.beta"), 1, D, 0, 0, "unsharded", 0);
        set(b + B_W1, NAME("w1"), 2, D, F, 0, "unsharded,model", s);
        set(b + B_B1, NAME("b1"), 1, F, 0, 0, "model", 0);
        set(b + B_W2, NAME("w2"), 2, F, D, 0, "model,unsharded", out);
        set(b + B_B2, NAME("b2"), 1, D, 0, 0, "unsharded", 0);
#undef NAME
    }
    set(P_LNF_G, "lnf.gamma", 1, D, 0, 0, "unsharded", -1);
    set(P_LNF_B, "lnf.beta", 1, D, 0, 0, "unsharded", 0);
}

/* ---- the forward pass, traced once ------------------------------------------------------- */

/* The tensors a trace makes, freed once it is expanded. */
static dt_tensor *made[1024];
static int nmade;

static dt_tensor *keep(dt_tensor *t)
{
    if (nmade == (int)(sizeof made / sizeof made[0])) {
        fprintf(stderr, "gpt: too many traced tensors\n");
        exit(1);
    }
    return made[nmade++] = t;
}

static dt_tensor *op2(dt_binary_op op, const dt_tensor *a, const dt_tensor *b)
{
    dt_tensor *t;
    CHECK(dt_binary(op, a, b, NULL, &t));
    return keep(t);
}

static dt_tensor *einsum(const char *eq, const dt_tensor *a, const dt_tensor *b)
{
    dt_tensor *t;
    CHECK(dt_einsum(eq, 2, (const dt_tensor *const[]){a, b}, NULL, &t));
    return keep(t);
}

static dt_tensor *norm(const dt_tensor *x, dt_tensor *const p[], int g)
{
    dt_tensor *t;
    CHECK(dt_layer_norm(x, p[g], p[g + 1], 1e-5, NULL, &t));
    return keep(t);
}

static dt_tensor *scalar(const dt_mesh *m, double v)
{
    dt_layout l;
    CHECK(dt_layout_replicated(m, 0, &l));
    dt_op_options o = {.layout = &l};
    dt_tensor *t;
    CHECK(dt_fill(dtype, 0, NULL, v, &o, &t));
    return keep(t);
}

/* Sequence parallelism: between the tensor-parallel regions the residual stream [B, T, D] and
 * the layer norms are split over model along the sequence, not replicated. */
static const char *const SEQ = "batch,model,unsharded";

/* x (split along the sequence) whole on every model shard, for a tensor-parallel region: an
 * all-gather over model, recomputed by the gradient where it needs it rather than kept. */
static dt_tensor *whole(const dt_mesh *m, const dt_tensor *x)
{
    dt_layout l;
    CHECK(dt_layout_parse(m, "batch,unsharded,unsharded", &l));
    dt_tensor *t;
    CHECK(dt_relayout(x, &l, &(dt_op_options){.recompute = 1}, &t));
    return keep(t);
}

/* Mean next-token cross-entropy of the tokens tok [B, T] against tgt [B, T]; causal is the
 * [T, T] lower-triangular mask. */
static dt_tensor *forward(const dt_mesh *m, dt_tensor *const p[], const dt_tensor *tok,
                          const dt_tensor *tgt, const dt_tensor *causal)
{
    dt_tensor *t;
    dt_layout seq;
    CHECK(dt_layout_parse(m, SEQ, &seq));
    dt_op_options to_seq = {.layout = &seq};
    /* x [B, T, D]: each model shard looks up the ids of its vocabulary rows (zeros for the
     * others), then one reduce-scatter over model onto the sequence */
    CHECK(dt_gather(p[P_WTE], tok, &to_seq, &t));
    dt_tensor *x = op2(DT_BINARY_ADD, keep(t), p[P_WPE]);
    dt_tensor *inv_sqrt_e = scalar(m, 1.0 / sqrt((double)E)), *minus_inf = scalar(m, -1e9);
    for (int l = 0; l < NL; l++) {
        dt_tensor *const *b = p + P_FIRST_BLOCK + l * PER_BLOCK;
        /* attention: q, k, v [B, T, H, E] with the heads on model; scores [B, H, T, T] */
        dt_tensor *h = whole(m, norm(x, b, B_LN1_G));
        dt_tensor *q = einsum("btd,dhe->bthe", h, b[B_WQ]);
        dt_tensor *k = einsum("btd,dhe->bthe", h, b[B_WK]);
        dt_tensor *v = einsum("btd,dhe->bthe", h, b[B_WV]);
        dt_tensor *s = op2(DT_BINARY_MUL, einsum("bthe,bshe->bhts", q, k), inv_sqrt_e);
        CHECK(dt_where(causal, s, minus_inf, NULL, &t));
        CHECK(dt_softmax(keep(t), -1, NULL, &t));
        dt_tensor *c = einsum("bhts,bshe->bthe", keep(t), v);
        /* row-parallel output projection: partial over model, reduce-scattered onto the
         * sequence once */
        CHECK(dt_einsum("bthe,hed->btd", 2, (const dt_tensor *const[]){c, b[B_WO]}, &to_seq, &t));
        x = op2(DT_BINARY_ADD, x, keep(t));
        /* MLP: [B, T, F] with F on model, gelu, then row-parallel: one reduce-scatter */
        h = whole(m, norm(x, b, B_LN2_G));
        CHECK(dt_matmul(h, b[B_W1], NULL, &t));
        CHECK(dt_unary(DT_UNARY_GELU, op2(DT_BINARY_ADD, keep(t), b[B_B1]), NULL, &t));
        dt_tensor *u;
        CHECK(dt_matmul(keep(t), b[B_W2], &to_seq, &u));
        x = op2(DT_BINARY_ADD, x, op2(DT_BINARY_ADD, keep(u), b[B_B2]));
    }
    /* logits [B, T, V] with the vocabulary on model (the embedding, tied), in f32; the fused
     * cross-entropy reduces [B, T] statistics across the vocabulary shards */
    dt_tensor *logits = einsum("btd,vd->btv", whole(m, norm(x, p, P_LNF_G)), p[P_WTE]);
    if (dtype != DT_DTYPE_F32) {
        CHECK(dt_cast(logits, DT_DTYPE_F32, NULL, &t));
        logits = keep(t);
    }
    dt_tensor *loss;
    CHECK(dt_sparse_softmax_cross_entropy_with_logits(tgt, logits, NULL, &t));
    CHECK(dt_reduce(DT_REDUCE_MEAN, keep(t), 0, NULL, 0, NULL, &loss));
    return keep(loss);
}

/* ---- one sharding ------------------------------------------------------------------------ */

typedef struct run {
    const char *name;
    int batch, model; /* mesh axis sizes */
    dt_mesh *mesh;
    dt_variable *vars[NP];
    dt_function *fwd, *grad;
    dt_tensor *causal;
    size_t step_bytes; /* the most a training step added on one of this client's devices */
} run;

/* The mesh batch x model over global devices 0 .. batch * model - 1. */
static void make_mesh(run *r)
{
    const char *names[2] = {"batch", "model"};
    int ids[8];
    for (int i = 0; i < r->batch * r->model; i++)
        ids[i] = i;
    CHECK(dt_mesh_create_on_devices(2, names, (int[]){r->batch, r->model}, dev, r->batch * r->model,
                                    ids, &r->mesh));
}

/* Bytes in use on every local device (at most 8). */
static void device_bytes(size_t out[8])
{
    for (int i = 0; i < dt_num_local_devices(dev) && i < 8; i++) {
        size_t peak;
        CHECK(dt_device_memory(dev, i, &out[i], &peak));
    }
}

/* The largest of every client's `mine`. */
static size_t most_of_clients(size_t mine)
{
    uint64_t v = mine, all[64], most = 0;
    CHECK(dt_client_allgather(&v, sizeof v, all));
    for (int c = 0; c < dt_num_clients() && c < 64; c++)
        most = all[c] > most ? all[c] : most;
    return (size_t)most;
}

/* The parameters as variables, in their layouts; *bytes gets the most bytes they take on one
 * device (the library's own accounting, every client's devices). */
static void make_params(run *r, size_t *bytes)
{
    size_t before[8] = {0}, after[8] = {0};
    device_bytes(before);
    for (int i = 0; i < NP; i++) {
        const param *p = &params[i];
        dt_layout l;
        CHECK(dt_layout_parse(r->mesh, p->layout, &l));
        dt_op_options o = {.layout = &l};
        dt_tensor *v;
        if (p->scale > 0)
            CHECK(dt_random_normal(dtype, p->rank, p->shape, 2024, (uint64_t)i + 1, 0, p->scale, &o,
                                   &v));
        else
            CHECK(dt_fill(dtype, p->rank, p->shape, p->scale < 0 ? 1 : 0, &o, &v));
        CHECK(dt_variable_create(v, &r->vars[i]));
        dt_tensor_free(v);
    }
    device_bytes(after);
    size_t mine = 0;
    for (int i = 0; i < dt_num_local_devices(dev) && i < 8; i++)
        if (after[i] - before[i] > mine)
            mine = after[i] - before[i];
    *bytes = most_of_clients(mine);
}

/* The forward pass traced on the variables' layouts, and its gradient function (results: the
 * loss, then one gradient per parameter, each in its parameter's layout). */
static void make_functions(run *r)
{
    dt_layout tl, cl;
    CHECK(dt_layout_parse(r->mesh, "batch,unsharded", &tl));
    CHECK(dt_layout_replicated(r->mesh, 2, &cl));
    CHECK(dt_function_begin(&r->fwd));
    dt_tensor *in[NP + 3];
    for (int i = 0; i < NP; i++)
        CHECK(dt_function_input(r->fwd, dt_variable_layout(r->vars[i]), dtype, params[i].rank,
                                params[i].shape, &in[i]));
    CHECK(dt_function_input(r->fwd, &tl, DT_DTYPE_I32, 2, (int64_t[]){B, T}, &in[NP]));
    CHECK(dt_function_input(r->fwd, &tl, DT_DTYPE_I32, 2, (int64_t[]){B, T}, &in[NP + 1]));
    CHECK(dt_function_input(r->fwd, &cl, DT_DTYPE_BOOL, 2, (int64_t[]){T, T}, &in[NP + 2]));
    dt_tensor *loss = forward(r->mesh, in, in[NP], in[NP + 1], in[NP + 2]);
    CHECK(dt_function_end(r->fwd, 1, &loss));
    for (int i = 0; i < NP + 3; i++)
        dt_tensor_free(in[i]);
    for (int i = 0; i < nmade; i++)
        dt_tensor_free(made[i]);
    nmade = 0;
    int wrt[NP];
    for (int i = 0; i < NP; i++)
        wrt[i] = i;
    CHECK(dt_function_gradient(r->fwd, 0, NP, wrt, &r->grad));
    bool mask[T][T];
    for (int i = 0; i < T; i++)
        for (int j = 0; j < T; j++)
            mask[i][j] = j <= i;
    CHECK(dt_tensor_from_host(&cl, DT_DTYPE_BOOL, 2, (int64_t[]){T, T}, mask, sizeof mask,
                              &r->causal));
}

/* The batch of step `step`: B sequences of the permutation walk from random starts (the same
 * on every client). */
static void batch_of(int step, int32_t tok[B][T], int32_t tgt[B][T])
{
    static int32_t next[V];
    static bool ready;
    uint64_t x = 88172645463325252ull; /* xorshift64: the permutation, then each step's own */
#define RAND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    if (!ready) {
        for (int i = 0; i < V; i++)
            next[i] = i;
        for (int i = V - 1; i > 0; i--) {
            int j = (int)(RAND() % (uint64_t)(i + 1)), s = next[i];
            next[i] = next[j];
            next[j] = s;
        }
        ready = true;
    }
    x = 88172645463325252ull + (uint64_t)(step + 1) * 0x9E3779B97F4A7C15ull;
    for (int b = 0; b < B; b++) {
        int32_t c = (int32_t)(RAND() % V);
        for (int t = 0; t < T; t++) {
            tok[b][t] = c;
            tgt[b][t] = c = next[c];
        }
    }
#undef RAND
}

/* Train `steps` steps; losses[t] on every client (the loss is read from a copy on a mesh over
 * every device: under "1" the other clients hold no part of it). */
static void train(run *r, const dt_mesh *all, int steps, double losses[], bool print)
{
    dt_optimizer *opt;
    dt_optimizer_config oc = {
        .kind = DT_OPTIMIZER_ADAMW, .learning_rate = 3e-3, .weight_decay = 0.01};
    CHECK(dt_optimizer_create(&oc, &opt));
    dt_layout tl, everywhere;
    CHECK(dt_layout_parse(r->mesh, "batch,unsharded", &tl));
    CHECK(dt_layout_replicated(all, 0, &everywhere));
    for (int step = 0; step < steps; step++) {
        int32_t tok[B][T], tgt[B][T];
        batch_of(step, tok, tgt);
        const dt_tensor *in[NP + 3];
        dt_tensor *ttok, *ttgt, *res[NP + 1];
        CHECK(dt_tensor_from_host(&tl, DT_DTYPE_I32, 2, (int64_t[]){B, T}, tok, sizeof tok, &ttok));
        CHECK(dt_tensor_from_host(&tl, DT_DTYPE_I32, 2, (int64_t[]){B, T}, tgt, sizeof tgt, &ttgt));
        for (int i = 0; i < NP; i++)
            in[i] = dt_variable_value(r->vars[i]);
        in[NP] = ttok;
        in[NP + 1] = ttgt;
        in[NP + 2] = r->causal;
        /* what the step adds to the parameters, optimizer slots and inputs in use: the
         * activations kept for the backward pass, the gradients and the temporaries */
        size_t before[8] = {0}, peak[8] = {0};
        device_bytes(before);
        CHECK(dt_device_memory_reset_peak(dev, -1));
        CHECK(dt_function_run(r->grad, NP + 3, in, NP + 1, res));
        for (int i = 0; i < dt_num_local_devices(dev) && i < 8; i++) {
            CHECK(dt_device_memory(dev, i, NULL, &peak[i]));
            if (peak[i] - before[i] > r->step_bytes)
                r->step_bytes = peak[i] - before[i];
        }
        CHECK(dt_optimizer_apply(opt, NP, r->vars, (const dt_tensor *const *)res + 1));
        dt_tensor *copy;
        float loss;
        CHECK(dt_copy_to_mesh(res[0], &everywhere, NULL, &copy));
        CHECK(dt_tensor_read(copy, &loss, sizeof loss));
        dt_tensor_free(copy);
        losses[step] = loss;
        if (print && dt_client_id() == 0)
            printf("%s step %2d loss %.9g\n", r->name, step, losses[step]);
        for (int i = 0; i < NP + 1; i++)
            dt_tensor_free(res[i]);
        dt_tensor_free(ttok);
        dt_tensor_free(ttgt);
    }
    dt_optimizer_free(opt);
}

static void free_run(run *r)
{
    for (int i = 0; i < NP; i++)
        dt_variable_free(r->vars[i]);
    dt_function_free(r->fwd);
    dt_function_free(r->grad);
    dt_tensor_free(r->causal);
    dt_mesh_free(r->mesh);
}

/* The forward pass's collectives (from the printed program), by kind over model, then over
 * batch and over anything else. */
enum { C_AR_MODEL, C_AG_MODEL, C_RS_MODEL, C_OTHER_MODEL, C_BATCH, C_OTHER, C_KINDS };

static void count_collectives(const run *r, int c[C_KINDS])
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(dt_function_print(r->fwd, f));
    fclose(f);
    memset(c, 0, sizeof(int) * C_KINDS);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, " collective "))
            continue;
        if (!strstr(line, "over {model}"))
            c[strstr(line, "over {batch}") ? C_BATCH : C_OTHER]++;
        else if (strstr(line, " all_reduce "))
            c[C_AR_MODEL]++;
        else if (strstr(line, " all_gather "))
            c[C_AG_MODEL]++;
        else if (strstr(line, " reduce_scatter "))
            c[C_RS_MODEL]++;
        else
            c[C_OTHER_MODEL]++;
    }
    free(text);
}

static const run shardings[4] = {
    {.name = "1", .batch = 1, .model = 1},
    {.name = "data", .batch = 4, .model = 1},
    {.name = "model", .batch = 1, .model = 4},
    {.name = "2d", .batch = 2, .model = 2},
};

static double seconds(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void)
{
    return seconds(CLOCK_MONOTONIC);
}

/* Every sharding in turn: the loss curves against one device's (within tol), the forward
 * pass's collectives, the parameters and a training step's memory per device. True when all
 * hold (on every client). */
static bool compare(const dt_mesh *all, int steps, double tol)
{
    static double curves[4][MAX_STEPS];
    size_t bytes[4], step_bytes[4];
    int colls[4][C_KINDS];
    for (int s = 0; s < 4; s++) {
        run r = shardings[s];
        make_mesh(&r);
        make_params(&r, &bytes[s]);
        make_functions(&r);
        count_collectives(&r, colls[s]);
        train(&r, all, steps, curves[s], false);
        step_bytes[s] = most_of_clients(r.step_bytes);
        free_run(&r);
    }
    double worst = 0;
    for (int s = 1; s < 4; s++)
        for (int t = 0; t < steps; t++)
            worst = fmax(worst, fabs(curves[s][t] - curves[0][t]) / fabs(curves[0][t]));
    /* Megatron-LM with sequence parallelism, over model: a reduce-scatter for the embedding;
     * per block an all-gather into attention and a reduce-scatter out of it, the same around
     * the MLP; an all-gather into the output projection; 2 all-reduces of the loss's
     * statistics (the maximum; then the sum of exp with the target logit and its owner, one
     * [B, T, 3]). Over batch, the mean's one. Without a
     * model axis (1, data), none over model. */
    const int want[4][C_KINDS] = {
        {0},
        {[C_BATCH] = 1},
        {[C_AR_MODEL] = 2, [C_AG_MODEL] = 2 * NL + 1, [C_RS_MODEL] = 2 * NL + 1},
        {[C_AR_MODEL] = 2, [C_AG_MODEL] = 2 * NL + 1, [C_RS_MODEL] = 2 * NL + 1, [C_BATCH] = 1},
    };
    bool colls_ok = memcmp(colls, want, sizeof want) == 0;
    double share = (double)bytes[2] / (double)bytes[0];
    double step_share = (double)step_bytes[2] / (double)step_bytes[0];
    /* A step's bytes: a quarter within 10%; with collectives overlapping compute (unless
     * DTENSOR_OVERLAP=0) each keeps its operand and result until its first reader, which
     * across clients adds about 5% of the quarter (0.278 against 0.265 at -n 2 and -n 4) */
    const char *ov = getenv("DTENSOR_OVERLAP");
    double step_tol = ov && strcmp(ov, "0") == 0 ? 0.1 : 0.15;
    bool quarter = fabs(share * 4 - 1) <= 0.1 && fabs(step_share * 4 - 1) <= step_tol;
    if (dt_client_id() == 0) {
        printf("gpt: %d blocks, d_model %d, %d heads, vocabulary %d, sequence %d, batch %d, %s, "
               "AdamW, %d steps\n",
               NL, D, H, V, T, B, dt_dtype_name(dtype), steps);
        for (int s = 0; s < 4; s++)
            printf("  %-5s batch=%d,model=%d: first loss %.6f, last %.6f; forward collectives "
                   "over model %d all-reduce, %d all-gather, %d reduce-scatter, over batch %d; "
                   "on one device: parameters %zu bytes, a training step %zu bytes more\n",
                   shardings[s].name, shardings[s].batch, shardings[s].model, curves[s][0],
                   curves[s][steps - 1], colls[s][C_AR_MODEL], colls[s][C_AG_MODEL],
                   colls[s][C_RS_MODEL], colls[s][C_BATCH], bytes[s], step_bytes[s]);
        printf("largest relative difference from one device's curve: %.2e (<= %g: %s)\n", worst,
               tol, worst <= tol ? "yes" : "NO");
        printf("forward collectives as Megatron-LM's with sequence parallelism (over model: 2 "
               "all-reduce, %d all-gather, %d reduce-scatter; over batch: 1): %s\n",
               2 * NL + 1, 2 * NL + 1, colls_ok ? "yes" : "NO");
        printf("per device with model=4, of one device's: parameters %.3f, a training step's "
               "activations, gradients and temporaries %.3f (1/4, parameters within 10%%, the step "
               "within %.0f%%: %s)\n",
               share, step_share, step_tol * 100, quarter ? "yes" : "NO");
    }
    return worst <= tol && colls_ok && quarter && curves[0][steps - 1] < curves[0][0];
}

/* Steps per second of each sharding (or of the one named: only) over `steps` steps (after 3
 * untimed), by the clock and per second of this process's CPU time, and the share of the step
 * time this client spent in collectives (its ledger). */
static void bench(const dt_mesh *all, int steps, const char *only)
{
    static double losses[MAX_STEPS + 3];
    if (dt_client_id() == 0)
        printf("sharding,steps_per_second,steps_per_cpu_second,collective_fraction,"
               "collectives_per_step\n");
    for (int s = 0; s < 4; s++) {
        if (only && strcmp(only, shardings[s].name))
            continue;
        run r = shardings[s];
        size_t bytes;
        make_mesh(&r);
        make_params(&r, &bytes);
        make_functions(&r);
        train(&r, all, 3, losses, false);
        dt_ledger_clear();
        double t0 = now(), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
        train(&r, all, steps, losses, false);
        double t = now() - t0, c = seconds(CLOCK_PROCESS_CPUTIME_ID) - c0, in_coll = 0;
        int64_t n = dt_ledger_size();
        for (int64_t i = 0; i < n; i++) {
            dt_ledger_entry e;
            CHECK(dt_ledger_entry_get(i, &e));
            in_coll += e.seconds;
        }
        if (dt_client_id() == 0)
            printf("%s,%.2f,%.2f,%.3f,%.1f\n", r.name, steps / t, steps / c, in_coll / t,
                   (double)n / steps);
        free_run(&r);
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "2d";
    int steps = argc > 2 ? atoi(argv[2]) : 50;
    const char *type = argc > 3 ? argv[3] : "f32", *on = argc > 4 ? argv[4] : "cpu";
    const char *only = argc > 5 ? argv[5] : NULL;
    int named = 0;
    while (only && named < 4 && strcmp(only, shardings[named].name))
        named++;
    if (steps < 1 || steps > MAX_STEPS || (strcmp(type, "f32") && strcmp(type, "bf16")) ||
        (strcmp(on, "cpu") && strcmp(on, "gpu")) || named == 4) {
        fprintf(stderr,
                "gpt: steps %d (1 to %d), dtype %s (f32 or bf16), devices %s (cpu or gpu), "
                "sharding %s (1, data, model or 2d)\n",
                steps, MAX_STEPS, type, on, only ? only : "(all)");
        return 2;
    }
    dtype = strcmp(type, "bf16") ? DT_DTYPE_F32 : DT_DTYPE_BF16;
    dev = strcmp(on, "gpu") ? DT_DEVICE_CPU : DT_DEVICE_CUDA;
    CHECK(dt_init(NULL));
    if (dt_num_global_devices(dev) != 4) {
        fprintf(stderr,
                "gpt: needs 4 %s devices in all, this job has %d (DTENSOR_CPU_DEVICES=4 or "
                "DTENSOR_CUDA_DEVICES=4, or mpiexec.mpich -n 2 with 2 each, or -n 4)\n",
                dt_device_type_name(dev), dt_num_global_devices(dev));
        dt_finalize();
        return 2;
    }
    describe_params();
    dt_mesh *all;
    CHECK(dt_mesh_create_from_string("x=4", dev, &all));
    int rc = 0, s = 0;
    while (s < 4 && strcmp(mode, shardings[s].name))
        s++;
    if (strcmp(mode, "compare") == 0) {
        /* bf16: each device rounds its partial terms before they are added, so the curves
         * drift apart by bf16's rounding (2^-9 relative) over the steps */
        rc = compare(all, steps, dtype == DT_DTYPE_F32 ? 1e-5 : BF16_TOL) ? 0 : 1;
    } else if (strcmp(mode, "bench") == 0) {
        bench(all, steps, only);
    } else if (s < 4 || strcmp(mode, "program") == 0) {
        run r = shardings[s < 4 ? s : 3];
        size_t bytes;
        make_mesh(&r);
        make_params(&r, &bytes);
        make_functions(&r);
        if (s == 4) {
            if (dt_client_id() == 0)
                CHECK(dt_function_print(r.fwd, stdout));
        } else {
            static double losses[MAX_STEPS];
            train(&r, all, steps, losses, true);
            /* parameters, optimizer slots, activations and gradients at their most, on this
             * client's first device (the library's accounting; the 4-device mesh x=4 used to
             * read the loss adds a few bytes) */
            dt_memory_stats ms;
            CHECK(dt_device_memory_stats(dev, 0, &ms));
            if (dt_client_id() == 0)
                printf("%s: peak bytes in use on device 0: %zu\n", r.name, ms.peak);
        }
        free_run(&r);
    } else {
        if (dt_client_id() == 0)
            fprintf(stderr, "gpt: unknown mode %s (1, data, model, 2d, compare, bench, program)\n",
                    mode);
        rc = 2;
    }
    dt_mesh_free(all);
    CHECK(dt_finalize());
    return rc;
}
