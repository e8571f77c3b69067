/* Checkpoints (train/checkpoint*.c), private to them: the checkpoint object, and the HDF5
 * pieces that saving and restoring share (train/checkpoint_h5.c).
 *
 *   checkpoint.c          the object: its entries (variables, tensors, optimizers, generators,
 *                         counters), metadata and save counter
 *   checkpoint_h5.c       the format: the dtype table, HDF5's errors, names, file access,
 *                         attributes, blocks of a layout
 *   checkpoint_write.c    save: plan, write, publish
 *   checkpoint_read.c     restore: plan, read, then change the objects; one tensor's read
 *   checkpoint_manager.c  numbered checkpoints in a directory, the newest kept
 *
 * The format itself is in include/dtensor.h. */
#ifndef DT_TRAIN_CHECKPOINT_H
#define DT_TRAIN_CHECKPOINT_H

#include "train.h"

#include <hdf5.h>
#include <pthread.h>

#define FORMAT_NAME "dtensor-checkpoint"
#define FORMAT_VERSION 1
#define NAME_MAX_LEN 256
#define PATH_MAX_LEN 4096

/* HDF5 is not built thread-safe: one caller at a time. */
extern pthread_mutex_t dt__h5_lock;

/* ---- the checkpoint object ------------------------------------------------------------------ */

typedef enum entry_kind { E_VARIABLE, E_TENSOR, E_OPTIMIZER, E_GENERATOR, E_COUNTER } entry_kind;

typedef struct entry {
    entry_kind kind;
    char name[NAME_MAX_LEN];
    char path[NAME_MAX_LEN + 16]; /* in the file: "variables/NAME" */
    dt_variable *var;
    const dt_tensor *tensor;
    dt_optimizer *opt;
    dt_generator *gen;
    int64_t *counter;
} entry;

typedef struct meta {
    char *key, *value;
} meta;

struct dt_checkpoint {
    entry *e;
    int n;
    meta *meta;
    int nmeta;
    int64_t save_counter;
};

void dt__ckpt_meta_clear(meta *m, int n);
/* Set KEY to VALUE in the list (*m, *n), replacing an earlier value. */
dt_status dt__ckpt_meta_set(meta **m, int *n, const char *key, const char *value);

/* ---- the format (train/checkpoint_h5.c) ----------------------------------------------------- */

/* The file type of each dtype (little-endian, as numpy writes on x86, which is also the memory
 * layout here, so no conversion runs) and the "dtype" attribute written beside it. A dtype
 * HDF5 has no type for is stored as raw bits with attr_only set: it is recognised by its
 * attribute only (e.g. bfloat16 as 16-bit unsigned integers). A dtype without a row cannot be
 * checkpointed (DT_ERR_UNSUPPORTED). */
typedef struct h5_dtype {
    const char *name;
    hid_t (*type)(void);
    bool attr_only;
} h5_dtype;

extern const h5_dtype dt__h5_dtypes[DT_DTYPE_COUNT];
/* d's row; DT_ERR_UNSUPPORTED naming `what` when d has none. */
dt_status dt__h5_dtype_row(const char *fn, dt_dtype d, const char *what, const h5_dtype **out);

/* HDF5's own account of the last failure, then the stack cleared. */
const char *dt__h5_reason(char *buf, size_t size);
/* DT_ERR_IO: "FN: FILE WHAT failed (HDF5's reason)". */
dt_status dt__h5_fail(const char *fn, const char *file, const char *what);

/* NAME: parts of [A-Za-z0-9_.:-], separated by single '/' (when `slashes`), none "." or "..". */
dt_status dt__ckpt_check_name(const char *fn, const char *name, bool slashes);
/* A path short enough for PATH.tmp. */
dt_status dt__ckpt_check_path(const char *fn, const char *path);

/* Whether the clients run under a launcher (the world communicator). */
bool dt__ckpt_multi_client(void);
/* File access and data transfer properties: MPI-IO over every client, sec2 when `alone`. */
hid_t dt__h5_fapl(bool alone);
hid_t dt__h5_dxpl(bool alone);
/* Whether `path` (parts separated by '/') exists below loc. */
bool dt__h5_exists(hid_t loc, const char *path);

dt_status dt__h5_attr_string(hid_t loc, const char *name, const char *value, const char *file);
dt_status dt__h5_attr_i64(hid_t loc, const char *name, int64_t v, const char *file);
dt_status dt__h5_attr_f64(hid_t loc, const char *name, double v, const char *file);
bool dt__h5_attr_read_string(hid_t loc, const char *name, char *buf, size_t size);
bool dt__h5_attr_read_num(hid_t loc, const char *name, hid_t mem, void *out);

/* Local device i's block of a tensor of `shape` in layout l: offset, extent and elements. */
dt_status dt__ckpt_block_of(const dt_layout *l, int rank, const int64_t shape[], int i,
                            int64_t off[], int64_t ext[], int64_t *elems);
/* Whether local device i is the one that writes its block. */
bool dt__ckpt_writes_block(const dt_layout *l, int i);
/* The most of `mine` over every client (the rounds of collective transfers). */
dt_status dt__ckpt_rounds_max(int n, const int mine[], int out[]);
/* Select the block (off, ext) of a file space, or nothing when ext is NULL; *mspace matches. */
dt_status dt__h5_select_block(hid_t fspace, int rank, const int64_t off[], const int64_t ext[],
                              hid_t *mspace);

#endif
