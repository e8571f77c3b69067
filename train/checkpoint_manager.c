/* The checkpoint manager: numbered checkpoints "ckpt-N.h5" in a directory, the newest
 * max_to_keep kept; and the newest checkpoint of a directory. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* N when `name` is exactly "ckpt-N.h5" with N >= 0. */
static bool ckpt_number(const char *name, int64_t *n)
{
    if (strncmp(name, "ckpt-", 5))
        return false;
    const char *p = name + 5;
    if (*p < '0' || *p > '9')
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || strcmp(end, ".h5"))
        return false;
    *n = v;
    return true;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The checkpoint numbers in a directory, ascending (malloc'd). */
static dt_status scan_dir(const char *fn, const char *dir, int64_t **nums, int *n)
{
    *nums = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return dt__fail(DT_ERR_IO, "%s: directory %s cannot be read (%s)", fn, dir,
                        strerror(errno));
    struct dirent *de;
    int cap = 0;
    dt_status s = DT_OK;
    while ((de = readdir(d))) {
        int64_t v;
        if (!ckpt_number(de->d_name, &v))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *g = realloc(*nums, sizeof *g * (size_t)cap);
            if (!g) {
                s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
                break;
            }
            *nums = g;
        }
        (*nums)[(*n)++] = v;
    }
    closedir(d);
    if (s != DT_OK) {
        free(*nums);
        *nums = NULL;
        *n = 0;
        return s;
    }
    if (*n)
        qsort(*nums, (size_t)*n, sizeof **nums, cmp_i64);
    return DT_OK;
}

dt_status dt_checkpoint_latest(const char *directory, char *path, size_t size)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_latest";
    if (!path || !size)
        return dt__fail(DT_ERR_ARG, "%s: path buffer is NULL or empty", fn);
    path[0] = 0;
    DT_TRY(dt__ckpt_check_path(fn, directory));
    int64_t *nums;
    int n;
    DT_TRY(scan_dir(fn, directory, &nums, &n));
    dt_status s = DT_OK;
    if (n) {
        int len = snprintf(path, size, "%s/ckpt-%" PRId64 ".h5", directory, nums[n - 1]);
        if (len >= (int)size) {
            path[0] = 0;
            s = dt__fail(DT_ERR_ARG, "%s: path buffer of %zu bytes, %d needed", fn, size, len + 1);
        }
    }
    free(nums);
    return s;
}

struct dt_checkpoint_manager {
    dt_checkpoint *ck;
    char dir[PATH_MAX_LEN];
    int max_to_keep;
    int64_t *nums; /* kept, ascending */
    int n;
    char **paths; /* names of nums */
    int npaths;
    char last[PATH_MAX_LEN + 32];
};

static dt_status mgr_names(dt_checkpoint_manager *m)
{
    for (int i = 0; m->paths && i < m->npaths; i++)
        free(m->paths[i]);
    free(m->paths);
    m->npaths = 0;
    m->paths = calloc((size_t)(m->n ? m->n : 1), sizeof *m->paths);
    if (!m->paths)
        return dt__fail(DT_ERR_NOMEM, "checkpoint manager: out of memory");
    m->npaths = m->n;
    for (int i = 0; i < m->n; i++) {
        char p[PATH_MAX_LEN + 32];
        snprintf(p, sizeof p, "%s/ckpt-%" PRId64 ".h5", m->dir, m->nums[i]);
        m->paths[i] = strdup(p);
        if (!m->paths[i])
            return dt__fail(DT_ERR_NOMEM, "checkpoint manager: out of memory");
    }
    return DT_OK;
}

void dt_checkpoint_manager_free(dt_checkpoint_manager *m)
{
    DT__SERIAL();
    if (!m)
        return;
    for (int i = 0; m->paths && i < m->npaths; i++)
        free(m->paths[i]);
    free(m->paths);
    free(m->nums);
    free(m);
}

/* mkdir -p */
static int make_dirs(const char *dir)
{
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return -1;
            *q = '/';
        }
    return mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

dt_status dt_checkpoint_manager_create(dt_checkpoint *c, const char *directory, int max_to_keep,
                                       dt_checkpoint_manager **out)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_manager_create";
    if (!out)
        return dt__fail(DT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    DT_TRY(dt__require_init(fn));
    dt_status s = !c ? dt__fail(DT_ERR_ARG, "%s: checkpoint is NULL", fn)
                     : dt__ckpt_check_path(fn, directory);
    if (s == DT_OK && strlen(directory) + 40 >= PATH_MAX_LEN)
        s = dt__fail(DT_ERR_ARG, "%s: directory name too long", fn);
    if (s == DT_OK && dt__rt.client == 0 && make_dirs(directory) != 0)
        s = dt__fail(DT_ERR_IO, "%s: cannot create directory %s (%s)", fn, directory,
                     strerror(errno));
    DT_TRY(dt__agree(dt__rt.world, s));
    dt_checkpoint_manager *m = calloc(1, sizeof *m);
    if (!m)
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    uint64_t h = DT__HASH_SEED;
    if (s == DT_OK) {
        m->ck = c;
        m->max_to_keep = max_to_keep;
        snprintf(m->dir, sizeof m->dir, "%s", directory);
        s = scan_dir(fn, directory, &m->nums, &m->n);
        if (s == DT_OK)
            h = dt__hash(h, m->nums, sizeof *m->nums * (size_t)m->n);
    }
    s = dt__agree(dt__rt.world, s);
    /* every client must see the same checkpoints (one shared directory) */
    int nc = dt__ckpt_multi_client() ? dt__rt.num_clients : 1;
    uint64_t *all = s == DT_OK ? malloc(sizeof *all * (size_t)nc) : NULL;
    if (s == DT_OK && !all)
        s = dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    s = dt__agree(dt__rt.world, s);
    if (s == DT_OK)
        s = dt__allgather_bytes(dt__rt.world, &h, sizeof h, all);
    for (int k = 1; s == DT_OK && k < nc; k++)
        if (all[k] != all[0])
            s = dt__fail(DT_ERR_MISMATCH,
                         "%s: clients 0 and %d see different checkpoints in %s (not one shared "
                         "directory?)",
                         fn, k, directory);
    free(all);
    if (s == DT_OK)
        s = mgr_names(m);
    if (s != DT_OK) {
        dt_checkpoint_manager_free(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_checkpoint_manager_save(dt_checkpoint_manager *m, int64_t number, const char **path)
{
    DT__SERIAL();
    const char *fn = "dt_checkpoint_manager_save";
    if (path)
        *path = NULL;
    if (!m)
        return dt__fail(DT_ERR_ARG, "%s: manager is NULL", fn);
    int64_t k = number >= 0 ? number : (m->n ? m->nums[m->n - 1] + 1 : 1);
    snprintf(m->last, sizeof m->last, "%s/ckpt-%" PRId64 ".h5", m->dir, k);
    int64_t was = m->ck->save_counter;
    m->ck->save_counter++;
    dt_status s = dt_checkpoint_write(m->ck, m->last);
    if (s != DT_OK) {
        m->ck->save_counter = was;
        return s;
    }
    /* the list: k added (or kept), the oldest beyond max_to_keep deleted by client 0 */
    int64_t *g = realloc(m->nums, sizeof *g * (size_t)(m->n + 1));
    if (!g)
        return dt__fail(DT_ERR_NOMEM, "%s: out of memory", fn);
    m->nums = g;
    bool have = false;
    for (int i = 0; i < m->n; i++)
        have = have || m->nums[i] == k;
    if (!have) {
        m->nums[m->n++] = k;
        qsort(m->nums, (size_t)m->n, sizeof *m->nums, cmp_i64);
    }
    dt_status del = DT_OK;
    while (m->max_to_keep > 0 && m->n > m->max_to_keep) {
        /* never the one just written, even when older numbers were saved later */
        int victim = m->nums[0] == k ? 1 : 0;
        char p[PATH_MAX_LEN + 32];
        snprintf(p, sizeof p, "%s/ckpt-%" PRId64 ".h5", m->dir, m->nums[victim]);
        if (dt__rt.client == 0 && unlink(p) != 0 && errno != ENOENT && del == DT_OK)
            del = dt__fail(DT_ERR_IO, "%s: saved %s but cannot delete %s (%s)", fn, m->last, p,
                           strerror(errno));
        memmove(&m->nums[victim], &m->nums[victim + 1],
                sizeof *m->nums * (size_t)(m->n - victim - 1));
        m->n--;
    }
    s = mgr_names(m);
    if (s == DT_OK)
        s = dt__agree(dt__rt.world, del);
    if (path && s == DT_OK)
        *path = m->last;
    return s;
}

const char *dt_checkpoint_manager_latest(const dt_checkpoint_manager *m)
{
    return m && m->n ? m->paths[m->n - 1] : NULL;
}

int dt_checkpoint_manager_num_checkpoints(const dt_checkpoint_manager *m)
{
    return m ? m->n : 0;
}

const char *dt_checkpoint_manager_checkpoint(const dt_checkpoint_manager *m, int i)
{
    return m && i >= 0 && i < m->n ? m->paths[i] : NULL;
}
