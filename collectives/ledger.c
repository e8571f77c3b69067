/* The communication ledger: every collective this client ran, printable per step. */
#include "coll_internal.h"

#include <stdlib.h>
#include <string.h>

#define DT__LEDGER_MAX 65536

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dt_ledger_entry *entries;
static int64_t size, cap, dropped, step;

static bool log_comm(void)
{
    const char *e = getenv("DTENSOR_LOG");
    return e && (strcmp(e, "comm") == 0 || strcmp(e, "debug") == 0);
}

static void print_entry(FILE *f, const dt_ledger_entry *e)
{
    fprintf(f, "%6lld %-14s %-4s %-4s {%s} g=%-3d %s %12lld %12lld %10.1f us  %-23s %-12s %s\n",
            (long long)e->index, e->op, e->reduce[0] ? e->reduce : "-", dt_dtype_name(e->dtype),
            e->axes_names, e->group_size, e->uneven ? "v" : " ", (long long)e->bytes_sent,
            (long long)e->bytes_received, e->seconds * 1e6,
            dt_collective_algorithm_name(e->algorithm), e->backend, e->cause[0] ? e->cause : "-");
}

void dt__ledger_record(const dt__coll_req *r, double end)
{
    dt_ledger_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.op, sizeof e.op, "%s", dt__coll_kind_name(r->c.kind));
    if (r->c.kind == DT__COLL_ALL_REDUCE || r->c.kind == DT__COLL_REDUCE_SCATTER)
        snprintf(e.reduce, sizeof e.reduce, "%s", dt_reduce_op_name(r->c.op));
    e.dtype = r->c.dtype;
    e.axes = r->c.axes;
    dt__coll_axes_str(r->m, r->c.axes, e.axes_names, sizeof e.axes_names);
    e.group_size = r->mask->size;
    e.uneven = r->c.counts != NULL;
    for (int gi = 0; gi < r->num_groups; gi++) {
        if (r->gc[gi].max_sent > e.bytes_sent)
            e.bytes_sent = r->gc[gi].max_sent;
        if (r->gc[gi].max_recv > e.bytes_received)
            e.bytes_received = r->gc[gi].max_recv;
    }
    e.start = r->t0;
    e.started = r->t_started;
    e.wait = r->t_wait;
    e.done = r->t_done > 0 ? r->t_done : end;
    e.end = end;
    e.seconds = end - r->t0;
    e.algorithm = r->algorithm;
    snprintf(e.backend, sizeof e.backend, "%s", r->backend);
    snprintf(e.cause, sizeof e.cause, "%s", r->c.cause ? r->c.cause : "");
    pthread_mutex_lock(&lock);
    e.step = step;
    e.index = size + dropped;
    if (size == DT__LEDGER_MAX) {
        dropped++;
    } else {
        if (size == cap) {
            int64_t ncap = cap ? cap * 2 : 64;
            dt_ledger_entry *p = realloc(entries, sizeof *p * (size_t)ncap);
            if (p) {
                entries = p;
                cap = ncap;
            }
        }
        if (size < cap)
            entries[size++] = e;
        else
            dropped++;
    }
    pthread_mutex_unlock(&lock);
    if (log_comm()) {
        fprintf(stderr, "dtensor comm: client %d step %lld: ", dt__rt.client, (long long)e.step);
        print_entry(stderr, &e);
    }
}

int64_t dt_ledger_next_step(void)
{
    pthread_mutex_lock(&lock);
    int64_t s = ++step;
    pthread_mutex_unlock(&lock);
    return s;
}

int64_t dt_ledger_size(void)
{
    pthread_mutex_lock(&lock);
    int64_t n = size;
    pthread_mutex_unlock(&lock);
    return n;
}

int64_t dt_ledger_dropped(void)
{
    pthread_mutex_lock(&lock);
    int64_t n = dropped;
    pthread_mutex_unlock(&lock);
    return n;
}

dt_status dt_ledger_entry_get(int64_t i, dt_ledger_entry *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_ledger_entry_get: out is NULL");
    pthread_mutex_lock(&lock);
    int64_t n = size;
    if (i >= 0 && i < n)
        *out = entries[i];
    pthread_mutex_unlock(&lock);
    if (i < 0 || i >= n)
        return dt__fail(DT_ERR_ARG, "dt_ledger_entry_get: entry %lld is outside 0..%lld",
                        (long long)i, (long long)n - 1);
    return DT_OK;
}

void dt_ledger_clear(void)
{
    pthread_mutex_lock(&lock);
    free(entries);
    entries = NULL;
    size = cap = dropped = step = 0;
    pthread_mutex_unlock(&lock);
}

dt_status dt_ledger_print(FILE *f)
{
    if (!f)
        return dt__fail(DT_ERR_ARG, "dt_ledger_print: file is NULL");
    pthread_mutex_lock(&lock);
    fprintf(f, "communication ledger of client %d: %lld entries", dt__rt.client, (long long)size);
    if (dropped)
        fprintf(f, " (%lld more not kept)", (long long)dropped);
    fprintf(f, "\n");
    for (int64_t i = 0; i < size;) {
        int64_t s = entries[i].step, n = 0, sent = 0, recd = 0;
        double t = 0;
        fprintf(f, "step %lld\n%6s %-14s %-4s %-4s %-5s %-5s %12s %12s %13s  %-23s %-12s %s\n",
                (long long)s, "#", "op", "red", "type", "axes", "group", "sent/dev", "recv/dev",
                "time", "algorithm", "backend", "cause");
        for (; i < size && entries[i].step == s; i++, n++) {
            print_entry(f, &entries[i]);
            sent += entries[i].bytes_sent;
            recd += entries[i].bytes_received;
            t += entries[i].seconds;
        }
        fprintf(f,
                "step %lld total: %lld collectives, %lld bytes sent and %lld received per "
                "device, %.1f us\n",
                (long long)s, (long long)n, (long long)sent, (long long)recd, t * 1e6);
    }
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

dt_status dt_ledger_write_json(FILE *f)
{
    if (!f)
        return dt__fail(DT_ERR_ARG, "dt_ledger_write_json: file is NULL");
    pthread_mutex_lock(&lock);
    fprintf(f, "{\"client\": %d, \"dropped\": %lld, \"entries\": [", dt__rt.client,
            (long long)dropped);
    for (int64_t i = 0; i < size; i++) {
        const dt_ledger_entry *e = &entries[i];
        fprintf(f, "%s\n  {\"step\": %lld, \"index\": %lld, \"op\": ", i ? "," : "",
                (long long)e->step, (long long)e->index);
        json_string(f, e->op);
        fprintf(f, ", \"reduce\": ");
        json_string(f, e->reduce);
        fprintf(f, ", \"dtype\": \"%s\", \"axes\": ", dt_dtype_name(e->dtype));
        json_string(f, e->axes_names);
        fprintf(f,
                ", \"axis_mask\": %u, \"group_size\": %d, \"uneven\": %s, \"bytes_sent\": %lld, "
                "\"bytes_received\": %lld, \"seconds\": %.9f, \"start\": %.9f, \"started\": %.9f, "
                "\"wait\": %.9f, \"done\": %.9f, \"end\": %.9f, \"algorithm\": \"%s\", "
                "\"backend\": ",
                e->axes, e->group_size, e->uneven ? "true" : "false", (long long)e->bytes_sent,
                (long long)e->bytes_received, e->seconds, e->start, e->started, e->wait, e->done,
                e->end, dt_collective_algorithm_name(e->algorithm));
        json_string(f, e->backend);
        fprintf(f, ", \"cause\": ");
        json_string(f, e->cause);
        fprintf(f, "}");
    }
    fprintf(f, "%s]}\n", size ? "\n" : "");
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

/* ---- overlap ------------------------------------------------------------------------------ */

static int by_begin(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The measure of the union of n intervals [iv[i][0], iv[i][1]] (sorted here). */
static double union_measure(double (*iv)[2], int64_t n)
{
    qsort(iv, (size_t)n, sizeof *iv, by_begin);
    double total = 0, lo = 0, hi = 0;
    bool open = false;
    for (int64_t i = 0; i < n; i++) {
        if (iv[i][1] <= iv[i][0])
            continue;
        if (!open || iv[i][0] > hi) {
            open = true;
            total += hi - lo;
            lo = iv[i][0];
            hi = iv[i][1];
        } else if (iv[i][1] > hi) {
            hi = iv[i][1];
        }
    }
    return total + hi - lo;
}

dt_status dt_ledger_overlap_get(int64_t first_step, int64_t last_step, dt_ledger_overlap *out)
{
    if (!out)
        return dt__fail(DT_ERR_ARG, "dt_ledger_overlap_get: out is NULL");
    memset(out, 0, sizeof *out);
    if (last_step < first_step)
        return dt__fail(DT_ERR_ARG,
                        "dt_ledger_overlap_get: last step %lld is before the first %lld",
                        (long long)last_step, (long long)first_step);
    pthread_mutex_lock(&lock);
    /* per entry its communication [start, done] and the parts of it this client was blocked
     * in: inside the start call, and from entering the wait on */
    double(*comm)[2] = malloc(sizeof *comm * (size_t)(size + 1));
    double(*busy)[2] = malloc(2 * sizeof *busy * (size_t)(size + 1));
    int64_t n = 0, nb = 0;
    for (int64_t i = 0; comm && busy && i < size; i++) {
        const dt_ledger_entry *e = &entries[i];
        if (e->step < first_step || e->step > last_step)
            continue;
        comm[n][0] = e->start;
        comm[n++][1] = e->done;
        busy[nb][0] = e->start;
        busy[nb++][1] = e->started < e->done ? e->started : e->done;
        if (e->wait < e->done) {
            busy[nb][0] = e->wait;
            busy[nb++][1] = e->done;
        }
    }
    pthread_mutex_unlock(&lock);
    dt_status s = DT_OK;
    if (!comm || !busy) {
        s = dt__fail(DT_ERR_NOMEM, "dt_ledger_overlap_get: out of memory");
    } else {
        out->collectives = n;
        out->comm_seconds = union_measure(comm, n);
        out->exposed_seconds = union_measure(busy, nb);
        if (out->comm_seconds > 0)
            out->hidden_share = 1.0 - out->exposed_seconds / out->comm_seconds;
    }
    free(comm);
    free(busy);
    return s;
}
