/* Checkpoint save and restore bandwidth against a plain sequential write and read of the same
 * bytes to the same disk, in the same run. Prints CSV:
 *   what,clients,devices_per_client,bytes,seconds,gb_per_s,ratio_to_baseline
 *
 *   OPENBLAS_NUM_THREADS=1 mpiexec.mpich -n 2 ./bench_checkpoint [MiB] [directory] [reps]
 *   DTENSOR_CPU_DEVICES=4 ./bench_checkpoint [MiB] [directory] [reps]
 *
 * State: 4 f32 variables of MiB/4 each, rows sharded over a 1-D mesh of every device
 * ("x,unsharded"), so each device owns a contiguous quarter/half of each dataset.
 * Baseline: client 0 alone writes the same number of bytes to one file in 8 MiB write()s and
 * fdatasync()s it (dd conv=fdatasync), then reads it back in 8 MiB read()s. The page cache
 * cannot be dropped here (no root on the host's /proc/sys/vm), so before every read the
 * file's cached pages are evicted with posix_fadvise(POSIX_FADV_DONTNEED) after an fsync
 * (clean pages are dropped): baseline file and checkpoint alike, so both reads come from the
 * disk. The save is dt_checkpoint_write whole (every client's blocks, HDF5 metadata, client
 * 0's fsync, the rename, the directory sync), into a directory where the previous checkpoint
 * was deleted untimed, as the baseline's file is (a rename over a 1 GiB file frees its blocks:
 * 0.15 s here); the restore is dt_checkpoint_read whole
 * (plans, reads into new tensors, assigns them to the variables). Seconds and GB/s are
 * medians of `reps` rounds after one untimed round; ratios (baseline time / checkpoint time)
 * are the medians of each round's ratio (the per-round ratios go to stderr). */
#include <dtensor.h>

#include "bench.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NVARS = 4, CHUNK = 8 << 20 };

static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* The same bytes written sequentially with write() + fdatasync(), in seconds. */
static double plain_write(const char *path, size_t bytes, char *buf)
{
    double t0 = bench_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < CHUNK ? bytes - done : CHUNK;
        ssize_t w = write(fd, buf, n);
        if (w <= 0) {
            perror("write");
            exit(1);
        }
        done += (size_t)w;
    }
    if (fdatasync(fd) != 0) {
        perror("fdatasync");
        exit(1);
    }
    close(fd);
    return bench_now() - t0;
}

static double plain_read(const char *path, size_t bytes, char *buf)
{
    double t0 = bench_now();
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    for (size_t done = 0; done < bytes;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r <= 0) {
            perror("read");
            exit(1);
        }
        done += (size_t)r;
    }
    close(fd);
    return bench_now() - t0;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 1024;
    const char *dir = argc > 2 ? argv[2] : ".";
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (mib < 4 || reps < 1 || reps > 15) {
        fprintf(stderr, "usage: %s [MiB >= 4] [directory] [reps 1..15]\n", argv[0]);
        return 2;
    }
    dt_layout l;
    dt_mesh *mesh = bench_rows_mesh(&l);
    int me = dt_client_id(), nc = dt_num_clients();
    /* [rows, 4096] f32 per variable: MiB / 4 each */
    int64_t shape[2] = {(int64_t)mib * 1024 * 1024 / 4 / NVARS / 4096, 4096};
    size_t bytes = (size_t)NVARS * (size_t)shape[0] * 4096 * 4;
    dt_variable *v[NVARS];
    dt_checkpoint *ck;
    BENCH_CHECK(dt_checkpoint_create(&ck));
    for (int i = 0; i < NVARS; i++) {
        dt_tensor *t;
        dt_op_options o = {.layout = &l};
        BENCH_CHECK(dt_random_uniform(DT_DTYPE_F32, 2, shape, 7, (uint64_t)i, -1, 1, &o, &t));
        BENCH_CHECK(dt_variable_create(t, &v[i]));
        dt_tensor_free(t);
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        BENCH_CHECK(dt_checkpoint_add_variable(ck, name, v[i]));
    }
    char ckpt[1024], plain[1024];
    snprintf(ckpt, sizeof ckpt, "%s/bench_ckpt.h5", dir);
    snprintf(plain, sizeof plain, "%s/bench_plain.bin", dir);
    char *buf = me == 0 ? malloc(CHUNK) : NULL;
    if (buf)
        for (size_t i = 0; i < CHUNK; i++)
            buf[i] = (char)(i * 131 + 7);
    double bw[16], br[16], cw[16], cr[16];
    /* round 0 warms the disk up (the first large write after a pause runs several times
     * slower on this virtual disk) and is not counted; the order of baseline and checkpoint
     * alternates, and the ratios are taken per round (pairs measured seconds apart on a
     * shared disk whose speed drifts) */
    for (int r = 0; r <= reps; r++) {
        for (int half = 0; half < 2; half++) {
            bool base = (half == 0) == (r % 2 == 0);
            BENCH_CHECK(dt_barrier());
            if (base && me == 0) { /* baseline: client 0 alone, the others wait */
                bw[r] = plain_write(plain, bytes, buf);
                evict(plain);
                br[r] = plain_read(plain, bytes, buf);
                unlink(plain);
            }
            if (base)
                continue;
            if (me == 0) /* as the baseline's file: no old file freed by the rename */
                unlink(ckpt);
            BENCH_CHECK(dt_barrier());
            double t0 = bench_now();
            BENCH_CHECK(dt_checkpoint_write(ck, ckpt));
            cw[r] = bench_now() - t0;
            if (me == 0)
                evict(ckpt);
            BENCH_CHECK(dt_barrier());
            t0 = bench_now();
            BENCH_CHECK(dt_checkpoint_read(ck, ckpt));
            cr[r] = bench_now() - t0;
        }
        BENCH_CHECK(dt_barrier());
    }
    if (me == 0) {
        double qw[16], qr[16];
        for (int r = 1; r <= reps; r++) {
            qw[r] = bw[r] / cw[r];
            qr[r] = br[r] / cr[r];
        }
        fprintf(stderr, "per-round save ratios:");
        for (int r = 1; r <= reps; r++)
            fprintf(stderr, " %.2f", qw[r]);
        fprintf(stderr, "\nper-round restore ratios:");
        for (int r = 1; r <= reps; r++)
            fprintf(stderr, " %.2f", qr[r]);
        fprintf(stderr, "\n");
        double mbw = median(bw + 1, reps), mbr = median(br + 1, reps), mcw = median(cw + 1, reps),
               mcr = median(cr + 1, reps);
        double rw = median(qw + 1, reps), rr = median(qr + 1, reps);
        int dev = dt_num_local_devices(DT_DEVICE_CPU);
        double gb = (double)bytes / 1e9;
        printf("what,clients,devices_per_client,bytes,seconds,gb_per_s,ratio_to_baseline\n");
        printf("plain_write_fdatasync,1,0,%zu,%.3f,%.3f,1\n", bytes, mbw, gb / mbw);
        printf("checkpoint_save,%d,%d,%zu,%.3f,%.3f,%.2f\n", nc, dev, bytes, mcw, gb / mcw, rw);
        printf("plain_read_uncached,1,0,%zu,%.3f,%.3f,1\n", bytes, mbr, gb / mbr);
        printf("checkpoint_restore,%d,%d,%zu,%.3f,%.3f,%.2f\n", nc, dev, bytes, mcr, gb / mcr, rr);
        unlink(ckpt);
    }
    free(buf);
    for (int i = 0; i < NVARS; i++)
        dt_variable_free(v[i]);
    dt_checkpoint_free(ck);
    dt_mesh_free(mesh);
    BENCH_CHECK(dt_finalize());
    return 0;
}
