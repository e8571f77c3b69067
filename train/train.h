/* Internal declarations of the training toolkit and the strategies' runtime (train/): models,
 * optimizers, checkpoints, strategies (train/strategy.c, over the presets of layout/
 * strategy.c), cluster roles (train/cluster.c), the parameter server (train/ps.c). Nothing below
 * train/ in the data flow includes it. Never installed. */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include "../spmd/engine.h"

/* One variable of a model under the parameter-server strategy: its rows split into shards
 * kept in an MPI window on the ps ranks (train/ps.c). */
typedef struct dt__ps_shard {
    int rank;      /* ps client holding it */
    int64_t row0;  /* first row (axis 0) */
    int64_t rows;  /* rows in the shard */
    MPI_Aint disp; /* element offset in that client's window */
} dt__ps_shard;

typedef struct dt__ps_var {
    MPI_Win win;
    void *base; /* this client's window memory (ps ranks), else NULL */
    int nshards;
    dt__ps_shard *shards;
    int64_t row_elems; /* elements per row */
    int64_t elems;     /* of the whole variable */
    dt_dtype dtype;
} dt__ps_var;

struct dt_strategy {
    dt_strategy_kind kind;
    dt__preset preset; /* its meshes and layouts (layout/strategy.c) */
    dt_partitioner partitioner;
    dt_cluster cluster; /* parameter server, multi-worker mirrored */
    MPI_Comm comm;      /* parameter server: a dup of the runtime's world */
    int live_models;
};

struct dt_model {
    dt_strategy *strategy; /* scope's, or own_strategy */
    dt_strategy *own_strategy;
    dt_dtype dtype;
    int64_t in_features;
    int nlayers;
    dt_dense_config *layers;
    int nvars;
    dt_variable **vars;
    char (*names)[32];
    int *var_layer; /* layer of each variable */
    bool *var_is_kernel;
    dt__ps_var *ps; /* per variable under the parameter server, else NULL */
    /* the traced gradient function of the last training step's metadata */
    dt_function *grad;
    dt_loss grad_loss;
    int64_t grad_xshape[2], grad_yshape[2];
    dt_layout grad_xl, grad_yl;
};

/* An optimizer's state per variable (train/optimizer.c), made on the variable's first update
 * in its layout; the checkpoint (train/checkpoint.c) saves and restores it. */
typedef struct dt__opt_slot {
    const dt_variable *var;
    dt_tensor *m, *v;    /* momentum or first moment; second moment (Adam) */
    dt_function *update; /* the update of this variable, traced at its first step */
} dt__opt_slot;

struct dt_optimizer {
    dt_optimizer_config cfg;
    int64_t iterations;
    dt__opt_slot *slots;
    int nslots;
    const dt_variable **no_decay; /* exclude_from_weight_decay's variables */
    int nno_decay;
    /* global_clipnorm: the traced global norm of the last apply's variables' gradients
     * (inputs the gradients; outputs the norm, then the scale in each dtype of scale_of) */
    dt_function *norm;
    const dt_variable **norm_vars;
    int norm_n;
    int *scale_of;          /* per variable: its scale's output */
    dt_tensor *global_norm; /* of the last apply */
};

/* Slot tensors per variable: 0 (SGD without momentum), 1 (m) or 2 (m, v). */
int dt__optimizer_slot_count(const dt_optimizer *o);
/* "sgd", "adam", "adamw" (the checkpoint's optimizer kind attribute). */
const char *dt__optimizer_kind_name(dt_optimizer_kind k);
/* Give v's slot the tensors m and w (w NULL unless Adam or AdamW), adopted, freeing any it had. On
 * error nothing is adopted. Not collective. */
dt_status dt__optimizer_set_slot(dt_optimizer *o, const dt_variable *v, dt_tensor *m, dt_tensor *w);

/* tf.random.Generator's state (train/generator.c). */
struct dt_generator {
    uint64_t seed;
    uint64_t counter; /* the key of the next draw */
};

/* The strategy a new model takes: the one in scope, else NULL. */
dt_strategy *dt__strategy_scope(void);
/* Read any tensor whose layout is replicated (or relayout it first) into host memory through
 * local device 0's component; for client-local meshes (this client must own a device of t's
 * mesh). Collective over t's mesh. */
dt_status dt__read_replicated(const dt_tensor *t, void *dst, size_t bytes);

/* Parameter server (train/ps.c). Collective over the runtime's clients. */
dt_status dt__ps_var_create(dt_strategy *s, const dt_variable *v, dt__ps_var *out);
void dt__ps_var_free(dt__ps_var *pv);
/* Read the whole variable from the shards into host (row-major). */
dt_status dt__ps_var_pull(const dt__ps_var *pv, void *host);
/* Add host delta (row-major, whole variable) to the shards, completed remotely. */
dt_status dt__ps_var_push(const dt__ps_var *pv, const void *delta);

/* Forward pass of the model on x with the given variable values (tensors of the model's
 * variables' metadata); eager or traced. */
dt_status dt__model_forward(const dt_model *m, const dt_tensor *x, const dt_tensor *const w[],
                            dt_tensor **out);

/* Checkpoints (train/checkpoint_write.c): a test hook called on every client after each tensor's
 * dataset of a save is written (tests kill a client there); NULL normally. */
extern void (*dt__checkpoint_test_hook)(int item);

#endif /* DT_TRAIN_H */
