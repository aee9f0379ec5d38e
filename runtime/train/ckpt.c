/* ckpt.c - checkpoints: writing (atomic, in the background), verification, discovery, loading.
 *
 * See ckpt.h for the layout and the guarantees. The order of operations of a save, and why:
 *
 *   1. wait for the previous save      the staging area is reused; a failure there stops us
 *   2. copy buffers to staging         the only part the training loop waits for
 *   3. mkdir step_N.tmp                (writer thread from here on)
 *   4. write each .safetensors file    through a 4 MiB buffer, hashed as it goes, then fsync
 *   5. write state.json, fsync         it records every file's size and XXH64, and its own
 *   6. fsync step_N.tmp                so the directory entries of the files are durable
 *   7. rename step_N.tmp -> step_N     atomic: readers see all of it or none of it
 *   8. fsync <dir>                     so the rename itself survives a power cut
 *   9. remove old checkpoints          only now, beyond `keep`, and only older than N: each
 *                                      renamed to step_M.old, <dir> synced, then deleted
 * (3 also fsyncs the parent of every directory that creating <dir> made.)
 *
 * ext4 and XFS need both the file fsyncs (4, 5) and the directory fsyncs (6, 8): fsync of a
 * file does not make its directory entry durable, and rename is only atomic, not durable, until
 * the parent directory is synced. Without step 6 a power cut after the rename could leave
 * step_N with files of length 0, which the checksum check then reports.
 *
 * Checksums are XXH64 of whole files (runtime/train/xxh64.h). state.json cannot hold its own hash, so
 * it holds the hash of itself with the "state_xxh64" value written as sixteen zeros.
 */
#include "runtime/train/ckpt.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/safetensors.h"
#include "runtime/train/xxh64.h"

#define IO_CHUNK (4u << 20)      /* write buffer and read chunk */
#define DIRECT_WRITE (256u << 10) /* pieces at least this large skip the write buffer */
#define WRITEBACK_STEP (8u << 20) /* start writeback of every 8 MiB written */
#define SELF_KEY "\"state_xxh64\""
#define ZERO16 "0000000000000000"

/* ==================================================================== system call table === */

static int posix_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }
static ssize_t posix_read(int fd, void *buf, size_t n) { return read(fd, buf, n); }
static ssize_t posix_write(int fd, const void *buf, size_t n) { return write(fd, buf, n); }
static int posix_fsync(int fd) { return fsync(fd); }
static int posix_close(int fd) { return close(fd); }
static int posix_mkdir(const char *path, mode_t mode) { return mkdir(path, mode); }
static int posix_rename(const char *from, const char *to) { return rename(from, to); }

const dt_ckpt_io dt_ckpt_io_posix = {posix_open,  posix_read,  posix_write, posix_fsync,
                                     posix_close, posix_mkdir, posix_rename};
static const dt_ckpt_io *io = &dt_ckpt_io_posix;

void dt_ckpt_set_io(const dt_ckpt_io *table) { io = table ? table : &dt_ckpt_io_posix; }

/* write(2) until done; EINTR retried, a short write continued. 0 or -errno. */
static int io_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = io->write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* read(2) exactly n bytes; -EPIPE at end of file first. */
static int io_read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = io->read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EPIPE;
        p += r, n -= (size_t)r;
    }
    return 0;
}

static int fsync_path(const char *path, bool dir, dt_err *err)
{
    int fd = io->open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot open %s to fsync it", path);
    int rc = 0;
    if (io->fsync(fd) != 0)
        rc = dt_err_errno(err, errno, "fsync of %s failed", path);
    io->close(fd);
    return rc;
}

/* ======================================================================== state helpers === */

void dt_ckpt_state_init(dt_ckpt_state *st)
{
    memset(st, 0, sizeof *st);
    st->loss = NAN;
}

void dt_ckpt_state_clear(dt_ckpt_state *st)
{
    free(st->job);
    dt_ckpt_state_init(st);
}

static int check_name(const char *name)
{
    return (!name || !name[0] || strlen(name) >= DT_CKPT_NAME_MAX) ? -EINVAL : 0;
}

int dt_ckpt_state_set_rng(dt_ckpt_state *st, const char *name, const dt_rng *rng)
{
    if (check_name(name))
        return -EINVAL;
    for (int i = 0; i < st->num_rng; i++)
        if (!strcmp(st->rng[i].name, name)) {
            st->rng[i].rng = *rng;
            return 0;
        }
    if (st->num_rng == DT_CKPT_MAX_RNG)
        return -ENOSPC;
    dt_strlcpy(st->rng[st->num_rng].name, name, DT_CKPT_NAME_MAX);
    st->rng[st->num_rng++].rng = *rng;
    return 0;
}

int dt_ckpt_state_set_scalar(dt_ckpt_state *st, const char *name, double value)
{
    if (check_name(name))
        return -EINVAL;
    for (int i = 0; i < st->num_scalars; i++)
        if (!strcmp(st->scalars[i].name, name)) {
            st->scalars[i].value = value;
            return 0;
        }
    if (st->num_scalars == DT_CKPT_MAX_SCALARS)
        return -ENOSPC;
    dt_strlcpy(st->scalars[st->num_scalars].name, name, DT_CKPT_NAME_MAX);
    st->scalars[st->num_scalars++].value = value;
    return 0;
}

int dt_ckpt_state_get_rng(const dt_ckpt_state *st, const char *name, dt_rng *out)
{
    for (int i = 0; i < st->num_rng; i++)
        if (!strcmp(st->rng[i].name, name)) {
            *out = st->rng[i].rng;
            return 0;
        }
    return -ENOENT;
}

int dt_ckpt_state_get_scalar(const dt_ckpt_state *st, const char *name, double *out)
{
    for (int i = 0; i < st->num_scalars; i++)
        if (!strcmp(st->scalars[i].name, name)) {
            *out = st->scalars[i].value;
            return 0;
        }
    return -ENOENT;
}

/* ============================================================================ the object === */

typedef struct entry {
    char *name;          /* prefix + tensor name, owned */
    int file;            /* index into c->files */
    int ndim;
    int64_t shape[DT_TENSOR_MAX_DIMS];
    size_t numel;
    size_t src_off;      /* elements into its buffer */
    size_t stage_off;    /* elements into the staging area */
} entry;

#define MAX_FILES 4

struct dt_ckpt {
    char dir[PATH_MAX - 1024]; /* leaves room for /step_<N>.tmp/<file> in PATH_MAX */
    int keep;
    bool async;
    bool concurrent;           /* async and host memory: the writer thread copies (see fence) */
    dt_backend *be;            /* borrowed; NULL = host memory */
    int nbufs;
    dt_ckpt_buf *bufs;         /* copies; file and prefix strings point into the entries' owner */
    size_t *buf_stage_off;     /* (nbufs) where each buffer starts in staging, in elements */
    int nentries;
    entry *entries;            /* registration order */
    int nfiles;
    char files[MAX_FILES][16];
    float *staging;            /* (staging_numel) host copy of every buffer, allocated once */
    size_t staging_numel;

    /* writer thread; everything below is guarded by mu */
    pthread_t thread;
    bool thread_started, pending, busy, quit;
    bool copy_pending;         /* the writer still has to copy the late buffers */
    bool fence_waiting;        /* the caller is blocked in dt_ckpt_fence since fence_start */
    double fence_start, fence_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dt_ckpt_state wstate;      /* the save being written; wstate.job owned */
    int result;                /* of the last write */
    bool result_reported;
    dt_err result_err;
    dt_ckpt_stats stats;
    double hold_s, wait_s, copy_s; /* of the save being written */
};

static int file_index(dt_ckpt *c, const char *file, dt_err *err)
{
    for (int i = 0; i < c->nfiles; i++)
        if (!strcmp(c->files[i], file))
            return i;
    size_t n = file ? strlen(file) : 0;
    if (n == 0 || n >= sizeof c->files[0] || !strcmp(file, "state"))
        return dt_err_set(err, -EINVAL, "checkpoint: bad file name \"%s\"", file ? file : "");
    for (size_t k = 0; k < n; k++)
        if (!(file[k] >= 'a' && file[k] <= 'z') && file[k] != '_')
            return dt_err_set(err, -EINVAL, "checkpoint: bad file name \"%s\" (a-z and _)", file);
    if (c->nfiles == MAX_FILES)
        return dt_err_set(err, -EINVAL, "checkpoint: more than %d files", MAX_FILES);
    dt_strlcpy(c->files[c->nfiles], file, sizeof c->files[0]);
    return c->nfiles++;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

static void *writer_main(void *arg);

int dt_ckpt_open(dt_ckpt **out, const dt_ckpt_opts *opts, dt_backend *be, const dt_ckpt_buf *bufs,
                 int nbufs, dt_err *err)
{
    int rc = 0;
    dt_ckpt *c = calloc(1, sizeof *c);
    if (!c)
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->stats.last_step = -1;
    if (!opts || !opts->dir || !opts->dir[0] || !dt_strlcpy(c->dir, opts->dir, sizeof c->dir)) {
        rc = dt_err_set(err, -EINVAL, "checkpoint: no directory given (or path too long)");
        goto fail;
    }
    c->keep = opts->keep < 1 ? 1 : opts->keep;
    c->async = opts->async;
    c->be = be;
    /* Concurrent copies read the buffers from the writer thread: only for host memory, which
     * another thread may read while the training thread reads it too. A CUDA backend must not
     * be driven from two threads, so its copies stay in dt_ckpt_save. */
    c->concurrent = opts->async && opts->concurrent_copy && (!be || !strcmp(be->name, "cpu"));
    c->nbufs = nbufs;
    c->bufs = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->bufs);
    c->buf_stage_off = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->buf_stage_off);
    int total = 0;
    for (int b = 0; b < nbufs; b++)
        total += bufs[b].num_tensors;
    c->entries = calloc((size_t)(total ? total : 1), sizeof *c->entries);
    if (!c->bufs || !c->buf_stage_off || !c->entries) {
        rc = dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    for (int b = 0; b < nbufs; b++) {
        const dt_ckpt_buf *B = &bufs[b];
        c->bufs[b] = *B;
        int fi = file_index(c, B->file, err);
        if (fi < 0) {
            rc = fi;
            goto fail;
        }
        c->buf_stage_off[b] = c->staging_numel;
        for (int t = 0; t < B->num_tensors; t++) {
            const dt_tensor_info *ti = &B->tensors[t];
            entry *e = &c->entries[c->nentries];
            size_t len = strlen(B->prefix ? B->prefix : "") + strlen(ti->name) + 1;
            e->name = malloc(len);
            if (!e->name) {
                rc = dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
                goto fail;
            }
            c->nentries++;
            snprintf(e->name, len, "%s%s", B->prefix ? B->prefix : "", ti->name);
            e->file = fi;
            e->ndim = ti->ndim;
            size_t numel = 1;
            if (ti->ndim < 0 || ti->ndim > DT_TENSOR_MAX_DIMS) {
                rc = dt_err_set(err, -EINVAL, "checkpoint: tensor %s has %d dimensions", e->name,
                                ti->ndim);
                goto fail;
            }
            for (int d = 0; d < ti->ndim; d++) {
                e->shape[d] = ti->shape[d];
                numel *= (size_t)ti->shape[d];
            }
            if (numel != ti->numel || ti->offset + ti->numel > B->numel) {
                rc = dt_err_set(err, -EINVAL, "checkpoint: tensor %s (offset %zu, %zu elements) "
                                "does not match its shape or lies outside its buffer of %zu",
                                e->name, ti->offset, ti->numel, B->numel);
                goto fail;
            }
            e->numel = numel;
            e->src_off = ti->offset;
            e->stage_off = c->staging_numel + ti->offset;
        }
        c->staging_numel += B->numel;
    }
    /* Names must be unique across buffers (they share files). */
    entry *sorted = malloc((size_t)(c->nentries ? c->nentries : 1) * sizeof *sorted);
    if (!sorted) {
        rc = dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    if (c->nentries)
        memcpy(sorted, c->entries, (size_t)c->nentries * sizeof *sorted);
    if (c->nentries > 1)
        qsort(sorted, (size_t)c->nentries, sizeof *sorted, cmp_entry_name);
    for (int i = 1; i < c->nentries; i++)
        if (!strcmp(sorted[i].name, sorted[i - 1].name)) {
            rc = dt_err_set(err, -EINVAL, "checkpoint: two tensors are called %s", sorted[i].name);
            free(sorted);
            goto fail;
        }
    free(sorted);
    dt_ckpt_state_init(&c->wstate);
    *out = c;
    return 0;
fail:
    dt_ckpt_close(c);
    return rc;
}

void dt_ckpt_close(dt_ckpt *c)
{
    if (!c)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->quit = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    if (c->result && !c->result_reported)
        DT_ERROR("checkpoint: the last save failed: %s", c->result_err.msg);
    for (int i = 0; i < c->nentries; i++)
        free(c->entries[i].name);
    free(c->entries);
    free(c->bufs);
    free(c->buf_stage_off);
    free(c->staging);
    free(c->wstate.job);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int ensure_staging(dt_ckpt *c, dt_err *err)
{
    if (c->staging || !c->staging_numel)
        return 0;
    c->staging = malloc(c->staging_numel * sizeof(float));
    if (!c->staging)
        return dt_err_set(err, -ENOMEM, "checkpoint: cannot allocate %.1f MB of host memory for "
                          "the staging copy", c->staging_numel * 4.0 / 1e6);
    return 0;
}

/* ================================================================================ saving === */

/* A buffered, hashing sink over a file descriptor (dt_st_write_fn). */
typedef struct wsink {
    int fd;
    const char *path;    /* for messages */
    char *buf;
    size_t len, cap;
    dt_xxh64_state hash;
    uint64_t total;      /* bytes consumed (hashed) */
    uint64_t written;    /* bytes handed to write(2) */
    uint64_t flushing;   /* writeback started up to here */
} wsink;

/* Writes to the file and, every WRITEBACK_STEP bytes, asks the kernel to start writing them to
 * the disk (sync_file_range, advisory). Without it the dirty pages of a checkpoint smaller than
 * the kernel's background threshold (10% of RAM) sit in memory until the fsync, so the disk
 * idles while we write and we idle while it flushes; with it both run at once. */
static int sink_out(wsink *s, const void *data, size_t n, dt_err *err)
{
    int rc = io_write_all(s->fd, data, n);
    if (rc)
        return dt_err_errno(err, -rc, "writing %s", s->path);
    s->written += n;
    if (s->written - s->flushing >= WRITEBACK_STEP) {
        sync_file_range(s->fd, (off64_t)s->flushing, (off64_t)(s->written - s->flushing),
                        SYNC_FILE_RANGE_WRITE);
        s->flushing = s->written;
    }
    return 0;
}

static int sink_flush(wsink *s, dt_err *err)
{
    if (!s->len)
        return 0;
    int rc = sink_out(s, s->buf, s->len, err);
    s->len = 0;
    return rc;
}

static int sink_write(void *ctx, const void *data, size_t n, dt_err *err)
{
    wsink *s = ctx;
    dt_xxh64_update(&s->hash, data, n);
    s->total += n;
    /* Small pieces (headers, biases) gather in the buffer; large ones go straight out. */
    if (n < DIRECT_WRITE && s->len + n <= s->cap) {
        memcpy(s->buf + s->len, data, n);
        s->len += n;
        return 0;
    }
    int rc = sink_flush(s, err);
    if (rc)
        return rc;
    if (n >= DIRECT_WRITE)
        return sink_out(s, data, n, err);
    memcpy(s->buf, data, n);
    s->len = n;
    return 0;
}

/* Creates path, writes through the sink (fn writes everything), fsyncs, closes. */
typedef int (*fill_fn)(dt_ckpt *c, int file, wsink *s, dt_err *err);

static int write_file(const char *path, dt_ckpt *c, int file, fill_fn fill, const void *raw,
                      size_t raw_len, uint64_t *bytes, uint64_t *hash, double *fsync_s,
                      dt_err *err)
{
    wsink s = {.fd = -1, .path = path};
    int rc = 0;
    dt_xxh64_init(&s.hash, 0);
    s.fd = io->open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s.fd < 0)
        return dt_err_errno(err, errno, "cannot create %s", path);
    if (fill) {
        s.cap = IO_CHUNK;
        s.buf = malloc(s.cap);
        if (!s.buf) {
            rc = dt_err_set(err, -ENOMEM, "out of memory writing %s", path);
            goto out;
        }
        if ((rc = fill(c, file, &s, err)) || (rc = sink_flush(&s, err)))
            goto out;
    } else {
        dt_xxh64_update(&s.hash, raw, raw_len);
        s.total = raw_len;
        if ((rc = io_write_all(s.fd, raw, raw_len))) {
            rc = dt_err_errno(err, -rc, "writing %s", path);
            goto out;
        }
    }
    double t0 = dt_now_s();
    if (io->fsync(s.fd) != 0) {
        rc = dt_err_errno(err, errno, "fsync of %s failed", path);
        goto out;
    }
    *fsync_s += dt_now_s() - t0;
out:
    if (io->close(s.fd) != 0 && !rc)
        rc = dt_err_errno(err, errno, "closing %s failed", path);
    free(s.buf);
    *bytes = s.total;
    *hash = dt_xxh64_digest(&s.hash);
    return rc;
}

/* Fills one .safetensors file from the staging copy. */
static int fill_safetensors(dt_ckpt *c, int file, wsink *s, dt_err *err)
{
    int n = 0;
    for (int i = 0; i < c->nentries; i++)
        n += c->entries[i].file == file;
    dt_st_tensor *ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    if (!ts)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < c->nentries; i++) {
        const entry *e = &c->entries[i];
        if (e->file != file)
            continue;
        dt_st_tensor *t = &ts[k++];
        t->name = e->name;
        t->dtype = DT_ST_F32;
        t->ndim = e->ndim;
        for (int d = 0; d < e->ndim; d++)
            t->shape[d] = e->shape[d];
        t->data = c->staging + e->stage_off;
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, c->wstate.step);
    /* "format": "pt" is what PyTorch-side loaders (transformers) expect of a safetensors file. */
    dt_st_kv meta[] = {{"format", "pt"}, {"producer", "dtrain " DT_VERSION}, {"step", step}};
    int rc = dt_st_write(ts, n, meta, (int)DT_ARRAY_LEN(meta), sink_write, s, NULL, err);
    free(ts);
    return rc;
}

static void hex64(char out[17], uint64_t v) { snprintf(out, 17, "%016" PRIx64, v); }

/* The text of state.json for c->wstate and the recorded files, with its self-checksum. */
static char *state_json(dt_ckpt *c, const dt_ckpt_file_desc *files, int nfiles)
{
    const dt_ckpt_state *st = &c->wstate;
    char hex[17];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", DT_CKPT_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)st->step);
    cJSON_AddNumberToObject(root, "epoch", (double)st->epoch);
    cJSON_AddNumberToObject(root, "sample_pos", (double)st->sample_pos);
    cJSON_AddNumberToObject(root, "samples_seen", (double)st->samples_seen);
    cJSON_AddNumberToObject(root, "world_size", st->world_size);
    if (isfinite(st->loss))
        cJSON_AddNumberToObject(root, "loss", st->loss);
    else
        cJSON_AddNullToObject(root, "loss");
    cJSON_AddNumberToObject(root, "lr", st->lr);
    cJSON_AddNumberToObject(root, "time", st->time);
    cJSON_AddStringToObject(root, "run_id", st->run_id);
    cJSON *rng = cJSON_AddObjectToObject(root, "rng");
    for (int i = 0; i < st->num_rng; i++) {
        cJSON *a = cJSON_AddArrayToObject(rng, st->rng[i].name);
        for (int k = 0; k < 4; k++) {
            hex64(hex, st->rng[i].rng.s[k]);
            cJSON_AddItemToArray(a, cJSON_CreateString(hex));
        }
    }
    cJSON *sc = cJSON_AddObjectToObject(root, "scalars");
    for (int i = 0; i < st->num_scalars; i++)
        cJSON_AddNumberToObject(sc, st->scalars[i].name, st->scalars[i].value);
    cJSON *tens = cJSON_AddArrayToObject(root, "tensors");
    for (int i = 0; i < c->nentries; i++) {
        const entry *e = &c->entries[i];
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", e->name);
        cJSON_AddStringToObject(t, "file", c->files[e->file]);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e->shape[d]));
        cJSON_AddItemToArray(tens, t);
    }
    cJSON *fo = cJSON_AddObjectToObject(root, "files");
    for (int i = 0; i < nfiles; i++) {
        cJSON *f = cJSON_AddObjectToObject(fo, files[i].name);
        cJSON_AddNumberToObject(f, "bytes", (double)files[i].bytes);
        hex64(hex, files[i].xxh64);
        cJSON_AddStringToObject(f, "xxh64", hex);
    }
    if (st->job)
        cJSON_AddStringToObject(root, "job", st->job);
    else
        cJSON_AddNullToObject(root, "job");
    cJSON_AddStringToObject(root, "state_xxh64", ZERO16);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return NULL;
    /* The placeholder is the last "state_xxh64" value: hash with zeros, then fill it in. */
    char *key = NULL;
    for (char *p = strstr(text, SELF_KEY); p; p = strstr(p + 1, SELF_KEY))
        key = p;
    char *val = key ? strstr(key, "\"" ZERO16 "\"") : NULL;
    if (!val) {
        free(text);
        return NULL;
    }
    hex64(hex, dt_xxh64(text, strlen(text), 0));
    memcpy(val + 1, hex, 16);
    return text;
}

/* Free space on the file system of dir, for messages about a full disk. */
static void space_note(char *out, size_t size, const char *dir, uint64_t need)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0)
        snprintf(out, size, " (the checkpoint needs %.1f MB; %.1f MB are free on that file "
                 "system)", need / 1e6, (double)sv.f_bavail * sv.f_frsize / 1e6);
    else
        out[0] = '\0';
}

static bool parse_step_name(const char *name, int64_t *step, const char *suffix)
{
    if (strncmp(name, "step_", 5) != 0)
        return false;
    const char *p = name + 5;
    if (*p < '0' || *p > '9')
        return false;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (*p - '0');
    }
    if (strcmp(p, suffix) != 0)
        return false;
    *step = v;
    return true;
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int dt_ckpt_list(const char *dir, int64_t **steps, int *count, dt_err *err)
{
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : dt_err_errno(err, errno, "cannot list %s", dir);
    int64_t *v = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s;
        if (!parse_step_name(de->d_name, &s, ""))
            continue;
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                free(v);
                closedir(d);
                return dt_err_set(err, -ENOMEM, "out of memory listing %s", dir);
            }
            v = nv;
        }
        v[n++] = s;
    }
    closedir(d);
    if (n > 1)
        qsort(v, (size_t)n, sizeof *v, cmp_i64_desc);
    *steps = v;
    *count = n;
    return 0;
}

/* Removes step_*.tmp directories an interrupted save left behind. */
static void remove_stale_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s;
        if (!parse_step_name(de->d_name, &s, ".tmp") && !parse_step_name(de->d_name, &s, ".old"))
            continue;
        char p[PATH_MAX];
        dt_err e = {0};
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (dt_rm_rf(p, &e) == 0)
            DT_INFO("checkpoint: removed %s, left by an interrupted save", p);
        else
            DT_WARN("checkpoint: cannot remove %s: %s", p, e.msg);
    }
    closedir(d);
}

static bool is_foreign(dt_ckpt *c, const char *path, char *why, size_t size);

/* dt_mkdir_p, and when it created directories, an fsync of the parent of each one it created:
 * the new directories' entries must survive a power cut, or the checkpoint under them (whose
 * rename and directory are synced) could vanish with them. */
static int make_dir_durable(const char *dir, dt_err *err)
{
    char top[PATH_MAX], p[PATH_MAX];
    struct stat sb;
    if (stat(dir, &sb) == 0)
        return dt_mkdir_p(dir, err); /* there already (or not a directory: its error) */
    /* the deepest ancestor that exists: the parents from dir's up to it get new entries */
    if (!dt_strlcpy(top, dir, sizeof top))
        return dt_err_set(err, -ENAMETOOLONG, "checkpoint directory path too long: %s", dir);
    for (;;) {
        char *slash = strrchr(top, '/');
        if (!slash) {
            dt_strlcpy(top, ".", sizeof top);
            break;
        }
        if (slash == top) {
            top[1] = '\0';
            break;
        }
        *slash = '\0';
        if (stat(top, &sb) == 0)
            break;
    }
    int rc = dt_mkdir_p(dir, err);
    if (rc)
        return rc;
    dt_strlcpy(p, dir, sizeof p);
    for (;;) {
        char *slash = strrchr(p, '/');
        if (!slash)
            dt_strlcpy(p, ".", sizeof p);
        else if (slash == p)
            p[1] = '\0';
        else
            *slash = '\0';
        if ((rc = fsync_path(p, true, err)))
            return dt_err_prefix(err, "creating the checkpoint directory %s: ", dir);
        if (!strcmp(p, top) || !strcmp(p, ".") || !strcmp(p, "/"))
            return 0;
    }
}

/* Keeps the `keep` newest checkpoints with step <= newest (the one just written); later steps
 * belong to another timeline (a resume from an older checkpoint) and are left alone, and so are
 * checkpoints of another setup (another model or optimizer): they are not this job's to remove,
 * and do not count. */
static void apply_retention(dt_ckpt *c, int64_t newest)
{
    int64_t *steps;
    int n;
    dt_err e = {0};
    if (dt_ckpt_list(c->dir, &steps, &n, &e) != 0) {
        DT_WARN("checkpoint: retention skipped: %s", e.msg);
        return;
    }
    /* Each one beyond keep is first renamed to step_<N>.old (atomic), then deleted: a kill
     * in the middle of a deletion leaves a .old directory that discovery ignores and the next
     * save removes, never a half-deleted step_<N> that resume and `ckpt list` report. */
    int kept = 0, nold = 0;
    char (*olds)[PATH_MAX + 8] = calloc((size_t)(n ? n : 1), sizeof *olds);
    if (!olds) {
        free(steps);
        DT_WARN("checkpoint: retention skipped: out of memory");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (steps[i] > newest)
            continue;
        char p[PATH_MAX], why[DT_ERR_MSG_MAX];
        snprintf(p, sizeof p, "%s/step_%" PRId64, c->dir, steps[i]);
        if (is_foreign(c, p, why, sizeof why)) {
            if (kept >= c->keep)
                DT_WARN("checkpoint: not removing %s (beyond keep = %d): it is another "
                        "setup's checkpoint (%s)", p, c->keep, why);
            continue;
        }
        if (++kept <= c->keep)
            continue;
        snprintf(olds[nold], sizeof olds[nold], "%s.old", p);
        dt_rm_rf(olds[nold], NULL); /* left by an earlier kill: the rename needs the name */
        if (io->rename(p, olds[nold]) != 0) {
            DT_WARN("checkpoint: cannot remove old checkpoint %s: cannot rename it to %s: %s", p,
                    olds[nold], strerror(errno));
            continue;
        }
        DT_INFO("checkpoint: removed %s (keep = %d)", p, c->keep);
        nold++;
    }
    free(steps);
    if (nold)
        fsync_path(c->dir, true, &e); /* the renames first: then no step_<N> is half gone */
    for (int i = 0; i < nold; i++)
        if (dt_rm_rf(olds[i], &e) != 0)
            DT_WARN("checkpoint: cannot delete %s: %s (the next save tries again)", olds[i],
                    e.msg);
    free(olds);
}

/* Steps 3..9 of a save, from c->staging and c->wstate. */
static int write_checkpoint(dt_ckpt *c, double *fsync_s, uint64_t *total_bytes, char *final,
                            size_t final_size, dt_err *err)
{
    char tmp[PATH_MAX], old[PATH_MAX], path[PATH_MAX + 128], note[256];
    dt_ckpt_file_desc files[MAX_FILES];
    int64_t step = c->wstate.step;
    int rc = 0;
    bool made_tmp = false, removed_tmp = false;
    uint64_t need = c->staging_numel * 4 + 65536;
    *fsync_s = 0;
    *total_bytes = 0;
    if (snprintf(final, final_size, "%s/step_%" PRId64, c->dir, step) >= (int)final_size ||
        snprintf(tmp, sizeof tmp, "%s.tmp", final) >= (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s.old", final) >= (int)sizeof old)
        return dt_err_set(err, -ENAMETOOLONG, "checkpoint directory path too long: %s", c->dir);
    if ((rc = make_dir_durable(c->dir, err)))
        goto fail;
    remove_stale_tmp(c->dir);
    if (io->mkdir(tmp, 0755) != 0) {
        rc = dt_err_errno(err, errno, "cannot create %s", tmp);
        goto fail;
    }
    made_tmp = true;
    for (int f = 0; f < c->nfiles; f++) {
        snprintf(files[f].name, sizeof files[f].name, "%s.safetensors", c->files[f]);
        snprintf(path, sizeof path, "%s/%.63s", tmp, files[f].name);
        if ((rc = write_file(path, c, f, fill_safetensors, NULL, 0, &files[f].bytes,
                             &files[f].xxh64, fsync_s, err)))
            goto fail;
        *total_bytes += files[f].bytes;
    }
    char *text = state_json(c, files, c->nfiles);
    if (!text) {
        rc = dt_err_set(err, -ENOMEM, "out of memory building state.json");
        goto fail;
    }
    uint64_t sb, sh;
    snprintf(path, sizeof path, "%s/state.json", tmp);
    rc = write_file(path, c, -1, NULL, text, strlen(text), &sb, &sh, fsync_s, err);
    free(text);
    if (rc)
        goto fail;
    *total_bytes += sb;
    double t0 = dt_now_s();
    if ((rc = fsync_path(tmp, true, err)))
        goto fail;
    if (io->rename(tmp, final) != 0) {
        int e = errno;
        if (e != EEXIST && e != ENOTEMPTY) {
            rc = dt_err_errno(err, e, "cannot rename %s to %s", tmp, final);
            goto fail;
        }
        /* The same step is already there (a job resumed from it and saved it again): move it
         * aside, put the new one in place, then remove the old one. Unless it is another
         * setup's (another model or optimizer): that one is the user's, never replaced. */
        char why[DT_ERR_MSG_MAX];
        if (is_foreign(c, final, why, sizeof why)) {
            rc = dt_err_set(err, -EEXIST, "%s is already there and is another setup's "
                            "checkpoint (%s); it is left as it is: give this job another "
                            "checkpoint.dir", final, why);
            goto fail;
        }
        if (io->rename(final, old) != 0) {
            rc = dt_err_errno(err, errno, "cannot move the existing %s aside", final);
            goto fail;
        }
        if (io->rename(tmp, final) != 0) {
            rc = dt_err_errno(err, errno, "cannot rename %s to %s", tmp, final);
            io->rename(old, final);
            goto fail;
        }
        made_tmp = false;
        if ((rc = fsync_path(c->dir, true, err)))
            goto fail;
        dt_rm_rf(old, NULL);
    }
    made_tmp = false;
    if ((rc = fsync_path(c->dir, true, err))) {
        /* The checkpoint is complete and in place, but its rename may not survive a power cut. */
        dt_err_prefix(err, "checkpoint %s was written but may not survive a power cut: ", final);
        return rc;
    }
    *fsync_s += dt_now_s() - t0;
    return 0;
fail:
    if (made_tmp) {
        dt_err e2 = {0};
        removed_tmp = dt_rm_rf(tmp, &e2) == 0;
        if (!removed_tmp)
            DT_WARN("checkpoint: cannot remove %s after a failed save: %s", tmp, e2.msg);
    }
    note[0] = '\0';
    if (rc == -ENOSPC || rc == -EDQUOT)
        space_note(note, sizeof note, c->dir, need);
    dt_err_prefix(err, "checkpoint step_%" PRId64 " not saved: ", step);
    if (err) {
        size_t l = strlen(err->msg);
        snprintf(err->msg + l, sizeof err->msg - l, "%s; earlier checkpoints under %.300s are "
                 "intact%s", note, c->dir, removed_tmp ? ", the partial step_N.tmp was removed" : "");
    }
    return rc;
}

enum { COPY_ALL, COPY_EARLY, COPY_LATE };
static void copy_to_staging(dt_ckpt *c, int which);

/* Runs the pending write (called by the writer thread, or inline when !async). */
static void run_write(dt_ckpt *c)
{
    dt_err e = {0};
    double fs = 0, t0 = dt_now_s();
    if (c->copy_pending) { /* read without the lock: only this thread clears it */
        copy_to_staging(c, COPY_LATE);
        pthread_mutex_lock(&c->mu);
        c->copy_pending = false;
        c->copy_s += dt_now_s() - t0;
        if (c->fence_waiting) {
            c->fence_s = dt_now_s() - c->fence_start;
            c->fence_waiting = false;
        }
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        t0 = dt_now_s();
    }
    uint64_t bytes = 0;
    char final[PATH_MAX];
    int rc = write_checkpoint(c, &fs, &bytes, final, sizeof final, &e);
    double dt = dt_now_s() - t0;
    if (!rc) /* the new checkpoint is complete: only now may older ones go */
        apply_retention(c, c->wstate.step);
    if (rc)
        DT_ERROR("%s", e.msg);
    else if (c->hold_s >= 0)
        DT_INFO("checkpoint: saved %s (%.1f MB in %.2f s, %.0f MB/s, in the background; "
                "training held %.3f s)", final, bytes / 1e6, dt, dt > 0 ? bytes / 1e6 / dt : 0.0,
                c->hold_s + c->fence_s);
    else
        DT_INFO("checkpoint: saved %s (%.1f MB in %.2f s, %.0f MB/s)", final, bytes / 1e6, dt,
                dt > 0 ? bytes / 1e6 / dt : 0.0);
    pthread_mutex_lock(&c->mu);
    c->result = rc;
    c->result_reported = false;
    c->result_err = e;
    if (!rc) {
        c->stats.saves++;
        c->stats.last_step = c->wstate.step;
        dt_strlcpy(c->stats.last_path, final, sizeof c->stats.last_path);
        c->stats.bytes = bytes;
        c->stats.hold_s = c->hold_s + c->fence_s;
        c->stats.fence_s = c->fence_s;
        c->stats.wait_s = c->wait_s;
        c->stats.copy_s = c->copy_s;
        c->stats.write_s = dt;
        c->stats.fsync_s = fs;
    }
    c->busy = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *writer_main(void *arg)
{
    dt_ckpt *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->pending && !c->quit)
            pthread_cond_wait(&c->cv, &c->mu);
        if (!c->pending)
            break;
        c->pending = false;
        pthread_mutex_unlock(&c->mu);
        run_write(c);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void dt_ckpt_fence(dt_ckpt *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->copy_pending) {
        c->fence_start = dt_now_s();
        c->fence_waiting = true;
        while (c->copy_pending)
            pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
}

static void wait_idle(dt_ckpt *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->busy)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

int dt_ckpt_wait(dt_ckpt *c, dt_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    while (c->busy)
        pthread_cond_wait(&c->cv, &c->mu);
    if (c->result && !c->result_reported) {
        rc = c->result;
        c->result_reported = true;
        if (err)
            *err = c->result_err;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Copies the buffers of one kind (COPY_EARLY: those marked copy_at_save; COPY_LATE: the others)
 * or all of them to the staging area. */
static void copy_to_staging(dt_ckpt *c, int which)
{
    for (int b = 0; b < c->nbufs; b++) {
        if ((which == COPY_EARLY && !c->bufs[b].copy_at_save) ||
            (which == COPY_LATE && c->bufs[b].copy_at_save))
            continue;
        float *dst = c->staging + c->buf_stage_off[b];
        size_t bytes = c->bufs[b].numel * sizeof(float);
        if (!bytes)
            continue;
        if (c->be)
            c->be->memcpy_d2h(c->be, dst, c->bufs[b].data, bytes);
        else
            memcpy(dst, c->bufs[b].data, bytes);
    }
}

int dt_ckpt_save(dt_ckpt *c, const dt_ckpt_state *st, dt_err *err)
{
    double t0 = dt_now_s();
    int rc = dt_ckpt_wait(c, err);
    if (rc) {
        dt_err_prefix(err, "an earlier checkpoint failed: ");
        return rc;
    }
    double t1 = dt_now_s();
    if ((rc = ensure_staging(c, err)))
        return rc;
    char *job = NULL;
    if (st->job && !(job = strdup(st->job)))
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    bool late = c->async && c->concurrent;
    copy_to_staging(c, late ? COPY_EARLY : COPY_ALL);
    double t2 = dt_now_s();
    free(c->wstate.job);
    c->wstate = *st;
    c->wstate.job = job;
    c->wstate.time = dt_wall_s();
    c->wait_s = t1 - t0;
    c->copy_s = t2 - t1;
    if (!c->async) {
        c->hold_s = -1; /* the whole write holds the caller; recorded below */
        pthread_mutex_lock(&c->mu);
        c->busy = true;
        pthread_mutex_unlock(&c->mu);
        run_write(c);
        pthread_mutex_lock(&c->mu);
        c->stats.hold_s = dt_now_s() - t0;
        pthread_mutex_unlock(&c->mu);
        return dt_ckpt_wait(c, err);
    }
    if (!c->thread_started) {
        if ((rc = pthread_create(&c->thread, NULL, writer_main, c)) != 0)
            return dt_err_errno(err, rc, "checkpoint: cannot start the writer thread");
        c->thread_started = true;
    }
    c->hold_s = dt_now_s() - t0;
    pthread_mutex_lock(&c->mu);
    c->busy = true;
    c->pending = true;
    c->copy_pending = late;
    c->fence_s = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void dt_ckpt_get_stats(dt_ckpt *c, dt_ckpt_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

/* =============================================================================== reading === */

/* A tensor a file must hold, and where its bytes go (NULL: only verified). */
typedef struct want {
    const char *name;
    int ndim;
    int64_t shape[8];
    void *dst;
    bool seen;
} want;

static int cmp_want(const void *a, const void *b)
{
    return strcmp(((const want *)a)->name, ((const want *)b)->name);
}

static void shape_text(char *out, size_t size, int ndim, const int64_t *shape)
{
    size_t o = (size_t)snprintf(out, size, "(");
    for (int d = 0; d < ndim && o < size; d++)
        o += (size_t)snprintf(out + o, size - o, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (o < size)
        snprintf(out + o, size - o, ")");
}

/* Reads <dir>/<name>: the size must be rec_bytes and the XXH64 rec_hash; the safetensors header
 * must list exactly the tensors of w[0..nw) (sorted by name) as F32 with their shapes; each
 * tensor's bytes go to its dst. Errors: -ENOENT missing, -EBADMSG anything else wrong. */
static int read_st_file(const char *dir, const char *name, uint64_t rec_bytes, uint64_t rec_hash,
                        want *w, int nw, dt_err *err)
{
    char path[PATH_MAX];
    unsigned char *head = NULL, *scratch = NULL;
    dt_st_file *f = NULL;
    dt_xxh64_state h;
    int rc = 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = io->open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return dt_err_set(err, -ENOENT, "%s is missing", name);
        return dt_err_errno(err, e, "cannot open %s", path);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = dt_err_errno(err, errno, "cannot stat %s", path);
        goto out;
    }
    if ((uint64_t)st.st_size != rec_bytes) {
        rc = dt_err_set(err, -EBADMSG, "%s has %" PRIu64 " bytes, the checkpoint recorded %" PRIu64
                        " (%s)", name, (uint64_t)st.st_size, rec_bytes,
                        (uint64_t)st.st_size < rec_bytes ? "truncated" : "appended to");
        goto out;
    }
    unsigned char lenb[8];
    if (rec_bytes < 8 || (rc = io_read_all(fd, lenb, 8))) {
        rc = dt_err_set(err, -EBADMSG, "%s: cannot read its header", name);
        goto out;
    }
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--)
        hn = (hn << 8) | lenb[k];
    if (hn > DT_ST_MAX_HEADER || 8 + hn > rec_bytes) {
        rc = dt_err_set(err, -EBADMSG, "%s: header length %" PRIu64 " is impossible for a file "
                        "of %" PRIu64 " bytes (corrupt)", name, hn, rec_bytes);
        goto out;
    }
    head = malloc((size_t)(8 + hn));
    scratch = malloc(IO_CHUNK);
    if (!head || !scratch) {
        rc = dt_err_set(err, -ENOMEM, "out of memory reading %s", name);
        goto out;
    }
    memcpy(head, lenb, 8);
    if ((rc = io_read_all(fd, head + 8, (size_t)hn))) {
        rc = dt_err_errno(err, -rc, "cannot read %s", path);
        goto out;
    }
    dt_xxh64_init(&h, 0);
    dt_xxh64_update(&h, head, (size_t)(8 + hn));
    if ((rc = dt_st_parse(head, (size_t)(8 + hn), rec_bytes, &f, err))) {
        dt_err_prefix(err, "%s: ", name);
        rc = err ? (err->code = -EBADMSG) : -EBADMSG;
        goto out;
    }
    /* The header must list exactly the wanted tensors. */
    for (int i = 0; i < nw; i++)
        w[i].seen = false;
    for (int i = 0; i < f->num_tensors; i++) {
        const dt_st_tensor *t = &f->tensors[i];
        want key = {.name = t->name};
        want *m = bsearch(&key, w, (size_t)nw, sizeof *w, cmp_want);
        char a[160], b[160];
        if (!m) {
            rc = dt_err_set(err, -EBADMSG, "%s holds tensor %s, which the checkpoint's table does "
                            "not list", name, t->name);
            goto out;
        }
        bool same = t->dtype == DT_ST_F32 && t->ndim == m->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == m->shape[d];
        if (!same) {
            shape_text(a, sizeof a, t->ndim, t->shape);
            shape_text(b, sizeof b, m->ndim, m->shape);
            rc = dt_err_set(err, -EBADMSG, "%s: tensor %s is %s %s, expected F32 %s", name,
                            t->name, dt_st_dtype_name(t->dtype), a, b);
            goto out;
        }
        m->seen = true;
    }
    for (int i = 0; i < nw; i++)
        if (!w[i].seen) {
            rc = dt_err_set(err, -EBADMSG, "%s lacks tensor %s", name, w[i].name);
            goto out;
        }
    /* The data section, tensor by tensor in file order, straight to where it belongs. */
    for (int i = 0; i < f->num_tensors; i++) {
        const dt_st_tensor *t = &f->tensors[i];
        want key = {.name = t->name};
        want *m = bsearch(&key, w, (size_t)nw, sizeof *w, cmp_want);
        uint64_t left = t->end - t->begin;
        unsigned char *dst = m->dst;
        while (left > 0) {
            size_t n = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
            unsigned char *p = dst ? dst : scratch;
            if ((rc = io_read_all(fd, p, n))) {
                rc = dt_err_errno(err, rc == -EPIPE ? EBADMSG : -rc, "cannot read %s", path);
                goto out;
            }
            dt_xxh64_update(&h, p, n);
            if (dst)
                dst += n;
            left -= n;
        }
    }
    uint64_t got = dt_xxh64_digest(&h);
    if (got != rec_hash) {
        rc = dt_err_set(err, -EBADMSG, "%s: checksum mismatch (xxh64 %016" PRIx64 ", recorded %016"
                        PRIx64 "): the file changed after it was written (corrupted)", name, got,
                        rec_hash);
        goto out;
    }
out:
    io->close(fd);
    dt_st_free(f);
    free(head);
    free(scratch);
    return rc;
}

/* ---- state.json ---- */

static int get_i64(const cJSON *root, const char *key, bool required, int64_t *out, dt_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) {
        if (!required)
            return 0;
        return dt_err_set(err, -EBADMSG, "state.json lacks \"%s\"", key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 9007199254740992.0)
        return dt_err_set(err, -EBADMSG, "state.json: \"%s\" is not an integer", key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int parse_hex64(const char *s, uint64_t *out)
{
    if (!s || strlen(s) != 16)
        return -EINVAL;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0)
            return -EINVAL;
        v = v * 16 + (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* Reads and checks <path>/state.json: its self-checksum, format and version; fills st (job
 * owned) and returns the parsed tree in *root (caller deletes). */
static int read_state(const char *path, dt_ckpt_state *st, cJSON **root_out, dt_err *err)
{
    char p[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    int rc = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) /* callers name the path */
        return dt_err_errno(err, errno, "cannot read the checkpoint directory");
    if (!S_ISDIR(sb.st_mode))
        return dt_err_set(err, -ENOTDIR, "%s is not a checkpoint directory", path);
    snprintf(p, sizeof p, "%s/state.json", path);
    if (access(p, F_OK) != 0)
        return dt_err_set(err, -ENOENT, "state.json is missing (an incomplete checkpoint)");
    if ((rc = dt_read_file(p, &text, &len, err)))
        return rc;
    if (strlen(text) != len) {
        rc = dt_err_set(err, -EBADMSG, "state.json holds a NUL byte (corrupt)");
        goto out;
    }
    /* Self-checksum: the last "state_xxh64" value, hashed as zeros. */
    char *key = NULL;
    for (char *q = strstr(text, SELF_KEY); q; q = strstr(q + 1, SELF_KEY))
        key = q;
    char *val = key ? strchr(key + strlen(SELF_KEY), '"') : NULL;
    char rec[17] = {0};
    uint64_t want_h, got_h;
    if (!val || strlen(val) < 18 || val[17] != '"') {
        rc = dt_err_set(err, -EBADMSG, "state.json has no valid state_xxh64 (corrupt or "
                        "truncated)");
        goto out;
    }
    memcpy(rec, val + 1, 16);
    memcpy(val + 1, ZERO16, 16);
    got_h = dt_xxh64(text, len, 0);
    memcpy(val + 1, rec, 16);
    if (parse_hex64(rec, &want_h) || got_h != want_h) {
        rc = dt_err_set(err, -EBADMSG, "state.json: checksum mismatch (corrupted)");
        goto out;
    }
    root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        rc = dt_err_set(err, -EBADMSG, "state.json is not valid JSON");
        goto out;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT_CKPT_FORMAT)) {
        rc = dt_err_set(err, -EBADMSG, "state.json is not a dtrain checkpoint (format)");
        goto out;
    }
    int64_t ver = 0, ws = 0;
    if ((rc = get_i64(root, "version", true, &ver, err)))
        goto out;
    if (ver != DT_CKPT_VERSION) {
        rc = dt_err_set(err, -EBADMSG, "checkpoint format version %" PRId64 " (this dtrain reads "
                        "version %d)", ver, DT_CKPT_VERSION);
        goto out;
    }
    dt_ckpt_state_init(st);
    if ((rc = get_i64(root, "step", true, &st->step, err)) ||
        (rc = get_i64(root, "epoch", true, &st->epoch, err)) ||
        (rc = get_i64(root, "sample_pos", true, &st->sample_pos, err)) ||
        (rc = get_i64(root, "samples_seen", false, &st->samples_seen, err)) ||
        (rc = get_i64(root, "world_size", false, &ws, err)))
        goto out;
    st->world_size = (int)ws;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "loss")) && cJSON_IsNumber(v))
        st->loss = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "lr")) && cJSON_IsNumber(v))
        st->lr = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "time")) && cJSON_IsNumber(v))
        st->time = v->valuedouble;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "run_id")) && cJSON_IsString(v))
        dt_strlcpy(st->run_id, v->valuestring, sizeof st->run_id);
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "rng"))
    {
        dt_rng r;
        bool ok = cJSON_IsArray(it) && cJSON_GetArraySize(it) == 4;
        for (int k = 0; ok && k < 4; k++) {
            const cJSON *x = cJSON_GetArrayItem(it, k);
            ok = cJSON_IsString(x) && parse_hex64(x->valuestring, &r.s[k]) == 0;
        }
        if (!ok || dt_ckpt_state_set_rng(st, it->string, &r)) {
            rc = dt_err_set(err, -EBADMSG, "state.json: bad rng entry \"%s\"", it->string);
            goto out;
        }
    }
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(root, "scalars"))
    {
        if (!cJSON_IsNumber(it) || dt_ckpt_state_set_scalar(st, it->string, it->valuedouble)) {
            rc = dt_err_set(err, -EBADMSG, "state.json: bad scalar \"%s\"", it->string);
            goto out;
        }
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "job")) && cJSON_IsString(v) &&
        !(st->job = strdup(v->valuestring))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
out:
    free(text);
    if (rc) {
        if (st->job)
            dt_ckpt_state_clear(st);
        cJSON_Delete(root);
        return rc;
    }
    *root_out = root;
    return 0;
}

/* The tensor table of state.json: fills descs (malloc'd) and *n. */
static int read_table(const cJSON *root, dt_ckpt_tensor_desc **descs, int *n, dt_err *err)
{
    const cJSON *tens = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    *descs = NULL;
    *n = 0;
    if (!cJSON_IsArray(tens))
        return dt_err_set(err, -EBADMSG, "state.json lacks the tensor table");
    int cnt = cJSON_GetArraySize(tens);
    dt_ckpt_tensor_desc *d = calloc((size_t)(cnt ? cnt : 1), sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tens)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *fl = cJSON_GetObjectItemCaseSensitive(t, "file");
        const cJSON *dty = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        bool ok = cJSON_IsString(nm) && cJSON_IsString(fl) && cJSON_IsArray(sh) &&
                  cJSON_GetArraySize(sh) <= 8 &&
                  dt_strlcpy(d[i].name, nm->valuestring, sizeof d[i].name) &&
                  dt_strlcpy(d[i].file, fl->valuestring, sizeof d[i].file);
        dt_strlcpy(d[i].dtype, cJSON_IsString(dty) ? dty->valuestring : "F32", sizeof d[i].dtype);
        const cJSON *x;
        d[i].ndim = 0;
        cJSON_ArrayForEach(x, sh)
        {
            if (!ok || !cJSON_IsNumber(x) || x->valuedouble < 0 ||
                x->valuedouble != floor(x->valuedouble)) {
                ok = false;
                break;
            }
            d[i].shape[d[i].ndim++] = (int64_t)x->valuedouble;
        }
        if (!ok) {
            free(d);
            return dt_err_set(err, -EBADMSG, "state.json: tensor table entry %d is malformed", i);
        }
        i++;
    }
    *descs = d;
    *n = cnt;
    return 0;
}

static int read_files(const cJSON *root, dt_ckpt_file_desc *files, int *n, dt_err *err)
{
    const cJSON *fo = cJSON_GetObjectItemCaseSensitive(root, "files"), *it;
    *n = 0;
    if (!cJSON_IsObject(fo))
        return dt_err_set(err, -EBADMSG, "state.json lacks the file list");
    cJSON_ArrayForEach(it, fo)
    {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(it, "bytes");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(it, "xxh64");
        dt_ckpt_file_desc *f = &files[*n];
        if (*n == MAX_FILES || !cJSON_IsNumber(b) || b->valuedouble < 0 || !cJSON_IsString(h) ||
            parse_hex64(h->valuestring, &f->xxh64) || strchr(it->string, '/') ||
            !dt_strlcpy(f->name, it->string, sizeof f->name))
            return dt_err_set(err, -EBADMSG, "state.json: bad file entry \"%s\"", it->string);
        f->bytes = (uint64_t)b->valuedouble;
        (*n)++;
    }
    return 0;
}

/* The first difference between the checkpoint's table (d, n) and the registered tensors of the
 * file named `file` (NULL: of every file), written to msg; false when they are the same. */
static bool table_diff(dt_ckpt *c, const dt_ckpt_tensor_desc *d, int n, const char *file,
                       char *msg, size_t size)
{
    char a[160], b[160];
    int here = 0, there = 0;
    for (int i = 0; i < c->nentries; i++) {
        const entry *e = &c->entries[i];
        if (file && strcmp(c->files[e->file], file))
            continue;
        here++;
        int j = 0;
        while (j < n && strcmp(d[j].name, e->name))
            j++;
        if (j == n) {
            snprintf(msg, size, "it has no tensor %s", e->name);
            return true;
        }
        bool same = d[j].ndim == e->ndim && !strcmp(d[j].file, c->files[e->file]) &&
                    !strcmp(d[j].dtype, "F32");
        for (int k = 0; same && k < e->ndim; k++)
            same = d[j].shape[k] == e->shape[k];
        if (!same) {
            shape_text(a, sizeof a, d[j].ndim, d[j].shape);
            shape_text(b, sizeof b, e->ndim, e->shape);
            snprintf(msg, size, "tensor %s is %s %s in %s there, F32 %s in %s here", e->name,
                     d[j].dtype, a, d[j].file, b, c->files[e->file]);
            return true;
        }
    }
    for (int j = 0; j < n; j++)
        there += !file || !strcmp(d[j].file, file);
    if (there != here) {
        snprintf(msg, size, "%d %s%stensors there, %d here", there, file ? file : "",
                 file ? " " : "", here);
        return true;
    }
    return false;
}

/* -EXDEV when the checkpoint's table differs from the registered tensors: "written for another
 * model" when the model's tensors differ, "written with another optimizer" when only the
 * optimiser state does (train.optimizer changed). */
static int check_foreign(dt_ckpt *c, const dt_ckpt_tensor_desc *d, int n, dt_err *err)
{
    char why[400];
    if (table_diff(c, d, n, "model", why, sizeof why))
        return dt_err_set(err, -EXDEV, "written for another model: %s", why);
    if (table_diff(c, d, n, NULL, why, sizeof why))
        return dt_err_set(err, -EXDEV, "written with another optimizer (its optimizer state "
                          "differs: %s)", why);
    return 0;
}

/* Whether the checkpoint directory `path` was written for another setup (another model or
 * optimizer: its tensor table differs). Unreadable or corrupt ones are not foreign: they are
 * damaged, and may be replaced or removed. why gets the difference. */
static bool is_foreign(dt_ckpt *c, const char *path, char *why, size_t size)
{
    dt_ckpt_state st;
    cJSON *root = NULL;
    dt_ckpt_tensor_desc *descs = NULL;
    int nd = 0;
    dt_err e = {0};
    dt_ckpt_state_init(&st);
    bool foreign = read_state(path, &st, &root, NULL) == 0 &&
                   read_table(root, &descs, &nd, NULL) == 0 &&
                   check_foreign(c, descs, nd, &e) == -EXDEV;
    if (foreign)
        dt_strlcpy(why, e.msg, size);
    dt_ckpt_state_clear(&st);
    cJSON_Delete(root);
    free(descs);
    return foreign;
}

int dt_ckpt_load(dt_ckpt *c, const char *path, dt_ckpt_state *st, dt_err *err)
{
    dt_ckpt_state tmp;
    cJSON *root = NULL;
    dt_ckpt_tensor_desc *descs = NULL;
    dt_ckpt_file_desc files[MAX_FILES];
    want *w = NULL;
    int nd = 0, nf = 0, rc;
    dt_ckpt_state_init(&tmp);
    wait_idle(c);
    if ((rc = read_state(path, &tmp, &root, err)))
        goto out;
    if ((rc = read_table(root, &descs, &nd, err)) || (rc = read_files(root, files, &nf, err)) ||
        (rc = check_foreign(c, descs, nd, err)) || (rc = ensure_staging(c, err)))
        goto out;
    w = calloc((size_t)(c->nentries ? c->nentries : 1), sizeof *w);
    if (!w) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int fi = 0; fi < c->nfiles; fi++) {
        char fname[64];
        snprintf(fname, sizeof fname, "%s.safetensors", c->files[fi]);
        const dt_ckpt_file_desc *rec = NULL;
        for (int k = 0; k < nf; k++)
            if (!strcmp(files[k].name, fname))
                rec = &files[k];
        if (!rec) {
            rc = dt_err_set(err, -EXDEV, "written %s: state.json lists no %s",
                            strcmp(fname, "model.safetensors") ? "with another optimizer"
                                                               : "for another model", fname);
            goto out;
        }
        int nw = 0;
        for (int i = 0; i < c->nentries; i++) {
            const entry *e = &c->entries[i];
            if (e->file != fi)
                continue;
            w[nw].name = e->name;
            w[nw].ndim = e->ndim;
            for (int d = 0; d < e->ndim; d++)
                w[nw].shape[d] = e->shape[d];
            w[nw].dst = c->staging + e->stage_off;
            nw++;
        }
        if (nw > 1)
            qsort(w, (size_t)nw, sizeof *w, cmp_want);
        if ((rc = read_st_file(path, fname, rec->bytes, rec->xxh64, w, nw, err)))
            goto out;
    }
    /* Everything checked: now the model changes. */
    for (int b = 0; b < c->nbufs; b++) {
        const float *src = c->staging + c->buf_stage_off[b];
        size_t bytes = c->bufs[b].numel * sizeof(float);
        if (!bytes)
            continue;
        if (c->be)
            c->be->memcpy_h2d(c->be, c->bufs[b].data, src, bytes);
        else
            memcpy(c->bufs[b].data, src, bytes);
    }
    dt_ckpt_state_clear(st);
    *st = tmp;
    tmp.job = NULL;
out:
    if (rc)
        dt_err_prefix(err, "checkpoint %s: ", path);
    dt_ckpt_state_clear(&tmp);
    cJSON_Delete(root);
    free(descs);
    free(w);
    return rc;
}

/* resume = auto: the newest checkpoint under c->dir that loads, skipping (with a warning)
 * every newer one that does not (partial, corrupt, or another setup's); with run_id, only
 * checkpoints that run wrote are considered. When none loads and some are another setup's, an
 * error (-EXDEV) rather than a fresh start among them. */
static int resume_newest(dt_ckpt *c, const char *run_id, dt_ckpt_state *st, bool *resumed,
                         char *path_out, size_t size, dt_err *err)
{
    int64_t *steps = NULL;
    int n = 0, skipped = 0, foreign = 0, rc;
    dt_err first_foreign = {0};
    *resumed = false;
    if ((rc = dt_ckpt_list(c->dir, &steps, &n, err)))
        return rc;
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX];
        dt_err e = {0};
        snprintf(p, sizeof p, "%s/step_%" PRId64, c->dir, steps[i]);
        if (run_id) {
            dt_ckpt_info info;
            bool mine = dt_ckpt_inspect(p, false, &info, NULL) == 0 &&
                        !strcmp(info.state.run_id, run_id);
            dt_ckpt_info_free(&info);
            if (!mine)
                continue;
        }
        if (dt_ckpt_load(c, p, st, &e) == 0) {
            if (skipped)
                DT_WARN("checkpoint: resuming from %s, an older checkpoint, after skipping %d "
                        "newer one%s", p, skipped, skipped > 1 ? "s" : "");
            if (path_out)
                dt_strlcpy(path_out, p, size);
            *resumed = true;
            free(steps);
            return 0;
        }
        if (e.code == -ENOMEM) {
            free(steps);
            if (err)
                *err = e;
            return e.code;
        }
        if (e.code == -EXDEV && !foreign++) /* the newest of another setup, for the error */
            first_foreign = e;
        DT_WARN("skipping %s%s", e.msg,
                e.code == -EXDEV ? " (another setup's checkpoint: left as it is)" : "");
        skipped++;
    }
    free(steps);
    if (foreign)
        /* Only checkpoints of another setup (and damaged ones): a fresh start here would save
         * into a directory that holds the user's other checkpoints. Stop and say so. */
        return dt_err_set(err, -EXDEV,
                          "%s; %d of the checkpoints under %s are another setup's and none is "
                          "this job's: set checkpoint.dir to another directory for this job, or "
                          "checkpoint.resume = never to start over (checkpoints of another setup "
                          "are never overwritten or removed)",
                          first_foreign.msg, foreign, c->dir);
    if (skipped)
        DT_WARN("checkpoint: none of the %d checkpoints under %s can be loaded; starting from "
                "scratch", skipped, c->dir);
    return 0;
}

int dt_ckpt_resume_run(dt_ckpt *c, const char *run_id, dt_ckpt_state *st, bool *resumed,
                       char *path_out, size_t size, dt_err *err)
{
    return resume_newest(c, run_id, st, resumed, path_out, size, err);
}

int dt_ckpt_resume(dt_ckpt *c, const char *resume, dt_ckpt_state *st, bool *resumed,
                   char *path_out, size_t size, dt_err *err)
{
    *resumed = false;
    if (!resume || !resume[0] || !strcmp(resume, "never"))
        return 0;
    if (strcmp(resume, "auto") != 0) {
        int rc = dt_ckpt_load(c, resume, st, err);
        if (rc) {
            /* A directory of checkpoints instead of one: say which one was probably meant. */
            int64_t *steps;
            int n;
            if (rc == -ENOENT && dt_ckpt_list(resume, &steps, &n, NULL) == 0 && n > 0) {
                size_t l = strlen(err ? err->msg : "");
                if (err)
                    snprintf(err->msg + l, sizeof err->msg - l, "; %s is a directory of "
                             "checkpoints: give one of them (newest: %s/step_%" PRId64 ") or "
                             "set checkpoint.dir to it with resume = auto", resume, resume,
                             steps[0]);
                free(steps);
            }
            return dt_err_prefix(err, "checkpoint.resume: "); /* the path is in the message */
        }
        if (path_out)
            dt_strlcpy(path_out, resume, size);
        *resumed = true;
        return 0;
    }
    return resume_newest(c, NULL, st, resumed, path_out, size, err);
}

/* A broadcast from `root` of `bytes` (a multiple of 4) of host memory, or (recv != NULL) an
 * all-gather of them into recv (world * bytes); through backend memory when the checkpointed
 * buffers are device memory. */
static int host_collective(dt_ckpt *c, dt_comm *comm, void *host, size_t bytes, int root,
                           void *recv, dt_err *err)
{
    size_t n = bytes / 4, total = recv ? bytes * (size_t)dt_comm_world_size(comm) : 0;
    if (!c->be)
        return recv ? dt_comm_allgather(comm, host, recv, n, DT_FLOAT32, NULL, err)
                    : dt_comm_broadcast(comm, host, n, DT_FLOAT32, root, NULL, err);
    char *dev = NULL;
    int rc = c->be->alloc(c->be, (void **)&dev, bytes + total, err);
    if (rc)
        return rc;
    c->be->memcpy_h2d(c->be, dev, host, bytes);
    rc = recv ? dt_comm_allgather(comm, dev, dev + bytes, n, DT_FLOAT32, NULL, err)
              : dt_comm_broadcast(comm, dev, n, DT_FLOAT32, root, NULL, err);
    if (!rc)
        c->be->memcpy_d2h(c->be, recv ? recv : host, recv ? dev + bytes : dev, recv ? total : bytes);
    c->be->free(c->be, dev);
    return rc;
}

int dt_ckpt_sync(dt_ckpt *c, dt_comm *comm, int rank, dt_ckpt_state *st, bool *resumed,
                 int *src_rank, int64_t *src_step, bool *adopted, dt_err *err)
{
    *adopted = false;
    *src_rank = rank;
    *src_step = *resumed ? st->step : -1;
    int world = dt_comm_world_size(comm);
    if (!comm || world < 2)
        return 0;
    /* every rank's step + 1 (0 = none), in two floats that hold 20 and 24 bits exactly (raw
     * copies through a float32 all-gather) */
    int64_t v = *resumed ? st->step + 1 : 0;
    float mine[2] = {(float)(v & 0xFFFFF), (float)(v >> 20)};
    float *all = calloc((size_t)world * 2, sizeof *all);
    if (!all)
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    int rc = host_collective(c, comm, mine, sizeof mine, 0, all, err);
    int64_t best = -1;
    int src = 0;
    bool alike = true;
    for (int r = 0; r < world && !rc; r++) {
        int64_t vr = (int64_t)all[2 * r] + ((int64_t)all[2 * r + 1] << 20);
        alike = alike && (r == 0 || vr == best);
        if (vr > best) {
            best = vr;
            src = r;
        }
    }
    free(all);
    if (rc)
        return rc;
    *src_rank = src;
    *src_step = best - 1;
    if (alike)
        return 0;
    /* Some rank did not see the newest checkpoint any rank found (a directory that is not shared
     * between nodes, or holds other steps on some node): every rank takes that rank's state and
     * buffers. */
    union {
        dt_ckpt_state s;
        float words[(sizeof(dt_ckpt_state) + 3) / 4];
    } u;
    memset(&u, 0, sizeof u);
    u.s = *st;
    u.s.job = NULL; /* a pointer of the source rank's: not sent */
    if ((rc = host_collective(c, comm, &u, sizeof u, src, NULL, err)))
        return rc;
    for (int i = 0; i < c->nbufs; i++)
        if (c->bufs[i].numel &&
            (rc = dt_comm_broadcast(comm, c->bufs[i].data, c->bufs[i].numel, DT_FLOAT32, src, NULL,
                                    err)))
            return dt_err_prefix(err, "checkpoint: taking rank %d's %s buffers: ", src,
                                 c->bufs[i].file);
    if (rank != src) {
        dt_ckpt_state_clear(st);
        *st = u.s;
    }
    *adopted = v != best;
    *resumed = true;
    return 0;
}

/* ================================================================================= tools === */

void dt_ckpt_info_free(dt_ckpt_info *info)
{
    if (!info)
        return;
    dt_ckpt_state_clear(&info->state);
    free(info->tensors);
    memset(info, 0, sizeof *info);
    dt_ckpt_state_init(&info->state);
}

int dt_ckpt_inspect(const char *path, bool verify, dt_ckpt_info *info, dt_err *err)
{
    dt_ckpt_info local;
    cJSON *root = NULL;
    want *w = NULL;
    int rc;
    if (!info)
        info = &local;
    memset(info, 0, sizeof *info);
    dt_ckpt_state_init(&info->state);
    if ((rc = read_state(path, &info->state, &root, err)))
        goto out;
    if ((rc = read_table(root, &info->tensors, &info->num_tensors, err)) ||
        (rc = read_files(root, info->files, &info->num_files, err)))
        goto out;
    if (!verify) {
        /* The cheap part: every file there with its recorded size. */
        for (int fi = 0; fi < info->num_files; fi++) {
            char p[PATH_MAX + 128];
            struct stat sb;
            const dt_ckpt_file_desc *f = &info->files[fi];
            snprintf(p, sizeof p, "%s/%.63s", path, f->name);
            if (stat(p, &sb) != 0) {
                rc = errno == ENOENT ? dt_err_set(err, -ENOENT, "%s is missing", f->name)
                                     : dt_err_errno(err, errno, "cannot stat %s", p);
                goto out;
            }
            if ((uint64_t)sb.st_size != f->bytes) {
                rc = dt_err_set(err, -EBADMSG, "%s has %" PRIu64 " bytes, the checkpoint "
                                "recorded %" PRIu64, f->name, (uint64_t)sb.st_size, f->bytes);
                goto out;
            }
        }
        goto out;
    }
    w = calloc((size_t)(info->num_tensors ? info->num_tensors : 1), sizeof *w);
    if (!w) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int fi = 0; fi < info->num_files; fi++) {
        const dt_ckpt_file_desc *f = &info->files[fi];
        size_t l = strlen(f->name);
        if (l < 12 || strcmp(f->name + l - 12, ".safetensors")) {
            rc = dt_err_set(err, -EBADMSG, "state.json lists %s, which is not a .safetensors "
                            "file", f->name);
            goto out;
        }
        int nw = 0;
        for (int i = 0; i < info->num_tensors; i++) {
            const dt_ckpt_tensor_desc *d = &info->tensors[i];
            if (strlen(d->file) != l - 12 || strncmp(d->file, f->name, l - 12))
                continue;
            w[nw].name = d->name;
            w[nw].ndim = d->ndim;
            memcpy(w[nw].shape, d->shape, sizeof d->shape);
            w[nw].dst = NULL;
            nw++;
        }
        if (nw > 1)
            qsort(w, (size_t)nw, sizeof *w, cmp_want);
        if ((rc = read_st_file(path, f->name, f->bytes, f->xxh64, w, nw, err)))
            goto out;
    }
    for (int i = 0; i < info->num_tensors; i++) {
        char fname[64];
        bool found = false;
        snprintf(fname, sizeof fname, "%s.safetensors", info->tensors[i].file);
        for (int k = 0; k < info->num_files; k++)
            found |= !strcmp(info->files[k].name, fname);
        if (!found) {
            rc = dt_err_set(err, -EBADMSG, "tensor %s is in %s, which state.json does not list",
                            info->tensors[i].name, fname);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    free(w);
    if (info == &local)
        dt_ckpt_info_free(&local);
    return rc;
}
