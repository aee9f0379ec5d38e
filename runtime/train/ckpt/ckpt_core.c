/* ckpt_core.c - the checkpoint object: registration, staging, open/close; the system call
 * table; discovery of step_<N> directories.
 *
 * See ckpt.h for the layout and the guarantees and ckpt_core.h for how the checkpoint code is
 * split. Saving is ckpt_write.c, reading ckpt_read.c, the cross-rank agreement ckpt_sync.c.
 */
#include "runtime/train/ckpt/ckpt_core.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/comm.h"

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
const dt_ckpt_io *dt_ckpt__io = &dt_ckpt_io_posix;

void dt_ckpt_set_io(const dt_ckpt_io *table)
{
    dt_ckpt__io = table ? table : &dt_ckpt_io_posix;
}

int dt_ckpt__parse_hex64(const char *s, uint64_t *out)
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

int dt_ckpt__write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = dt_ckpt__io->write(fd, p, n);
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

int dt_ckpt__read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = dt_ckpt__io->read(fd, p, n);
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

int dt_ckpt__fsync_path(const char *path, bool dir, dt_err *err)
{
    int fd = dt_ckpt__io->open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot open %s to fsync it", path);
    int rc = 0;
    if (dt_ckpt__io->fsync(fd) != 0)
        rc = dt_err_errno(err, errno, "fsync of %s failed", path);
    dt_ckpt__io->close(fd);
    return rc;
}

/* ============================================================================ the object === */

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
    if (c->nfiles == DT_CKPT_MAX_FILES)
        return dt_err_set(err, -EINVAL, "checkpoint: more than %d files", DT_CKPT_MAX_FILES);
    dt_strlcpy(c->files[c->nfiles], file, sizeof c->files[0]);
    return c->nfiles++;
}

/* Whether the slice is consistent (ckpt_core.h). */
bool dt_ckpt__slice_valid(const dt_ckpt_slice *s, size_t start, size_t n)
{
    if (s->ndim < 0 || s->ndim > DT_TENSOR_MAX_DIMS)
        return false;
    size_t numel = 1;
    if (s->tp_parts <= 0) {
        for (int d = 0; d < s->ndim; d++)
            numel *= (size_t)s->whole[d];
        return start <= numel && n <= numel - start;
    }
    if (s->tp_dim < 0 || s->tp_dim >= s->ndim || s->tp_rank < 0 || !s->local)
        return false;
    for (int d = 0; d < s->ndim; d++) {
        if (s->local[d] < 0 || (d != s->tp_dim && s->local[d] != s->whole[d]))
            return false;
        numel *= (size_t)s->local[d];
    }
    int64_t parts = s->tp_parts;
    if (s->local[s->tp_dim] % parts || s->whole[s->tp_dim] % parts)
        return false;
    int64_t chunk = s->local[s->tp_dim] / parts;
    if ((int64_t)s->tp_rank * chunk > s->whole[s->tp_dim] / parts + chunk)
        return false;
    return start <= numel && n <= numel - start;
}

/* The sharded mode of opts, then its pieces (dt_ckpt_set_pieces). */
static int open_pieces(dt_ckpt *c, const dt_ckpt_opts *o, dt_err *err)
{
    c->npc = 0;
    c->sharded = o->sharded;
    c->io_buffer = o->io_buffer ? o->io_buffer : DT_CKPT_IO_BUFFER_DEFAULT;
    if (!c->sharded)
        return 0;
    c->rank = o->rank;
    c->world = o->world < 1 ? 1 : o->world;
    c->comm = o->comm;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 600;
    if (c->rank < 0 || c->rank >= c->world)
        return dt_err_set(err, -EINVAL, "checkpoint: rank %d of %d", c->rank, c->world);
    return dt_ckpt_set_pieces(c, o->pieces, o->npieces, err);
}

static void free_pieces(dt_ckpt *c)
{
    for (int i = 0; i < c->npc; i++)
        free(c->pcs[i].key);
    free(c->pcs);
    c->pcs = NULL;
    c->npc = 0;
}

int dt_ckpt_set_pieces(dt_ckpt *c, const dt_ckpt_piece *pieces, int npieces, dt_err *err)
{
    if (!c->sharded)
        return dt_err_set(err, -EINVAL, "checkpoint: pieces for a checkpoint that is not sharded");
    double t0 = dt_now_s();
    dt_ckpt__wait_idle(c); /* the writer reads the pieces */
    c->pre_wait_s = dt_now_s() - t0;
    free_pieces(c);
    size_t numel = 0;
    c->pcs = calloc((size_t)(npieces > 0 ? npieces : 1), sizeof *c->pcs);
    if (!c->pcs)
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < npieces; i++) {
        const dt_ckpt_piece *p = &pieces[i];
        dt_ckpt_pc *pc = &c->pcs[c->npc];
        int e = -1, dup = 0;
        for (int k = 0; k < c->nentries && e < 0; k++)
            if (!strcmp(c->entries[k].name, p->name))
                e = k;
        if (e < 0)
            return dt_err_set(err, -EINVAL, "checkpoint: piece %d is of tensor %s, which is not "
                              "registered", i, p->name);
        const dt_ckpt_entry *en = &c->entries[e];
        const dt_tensor_info *l = p->local;
        dt_ckpt_slice sl = {en->ndim, en->shape, l ? l->tp_dim : 0, l ? l->tp_parts : 0,
                            p->tp_rank, l ? l->shape : NULL};
        if (!l || l->ndim != en->ndim || p->n == 0 || !p->data ||
            !dt_ckpt__slice_valid(&sl, p->start, p->n) ||
            (l->tp_parts <= 0 && p->start + p->n > en->numel))
            return dt_err_set(err, -EINVAL, "checkpoint: piece %d of tensor %s (elements %zu.."
                              "%zu) does not fit it", i, p->name, p->start, p->start + p->n);
        for (int k = 0; k < c->npc; k++)
            dup += c->pcs[k].entry == e;
        pc->p = *p;
        pc->entry = e;
        pc->early = c->bufs[en->buf].copy_at_save;
        pc->stage_off = numel;
        if (!c->direct || pc->early) /* direct: the others are written from where they are */
            numel += p->n;
        size_t len = strlen(en->name) + 16;
        if (!(pc->key = malloc(len)))
            return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
        if (dup)
            snprintf(pc->key, len, "%s#%d", en->name, dup + 1);
        else
            snprintf(pc->key, len, "%s", en->name);
        c->npc++;
    }
    if (numel > c->pstage_cap) { /* the staging grows to the largest shard, allocated on use */
        dt_ckpt__charge(c, c->pstage ? c->pstage_cap * sizeof(float) : 0, false);
        free(c->pstage);
        c->pstage = NULL;
        c->pstage_cap = numel;
    }
    c->pstage_numel = numel;
    return 0;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const dt_ckpt_entry *)a)->name, ((const dt_ckpt_entry *)b)->name);
}

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
    /* A save that cannot succeed is refused now, not after the training up to it. */
    if ((rc = dt_ckpt__check_dir(c->dir, err)))
        goto fail;
    c->keep = opts->keep < 1 ? 1 : opts->keep;
    c->async = opts->async;
    c->be = be;
    /* Concurrent copies read the buffers from the writer thread: only for host memory, which
     * another thread may read while the training thread reads it too. A CUDA backend must not
     * be driven from two threads, so its copies stay in dt_ckpt_save. */
    c->concurrent = opts->async && opts->concurrent_copy && (!be || be->host_memory);
    /* Nothing changes the buffers before the write is done (a synchronous save, or the fence
     * waits for it): a host-memory writer then reads them where they are, and the save costs
     * no copy of the model. */
    c->direct = (!be || be->host_memory) && !opts->host_copy && (!opts->async || c->concurrent);
    c->nbufs = nbufs;
    c->bufs = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->bufs);
    c->buf_stage_off = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->buf_stage_off);
    c->buf_early_off = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->buf_early_off);
    c->prefixes = calloc((size_t)(nbufs ? nbufs : 1), sizeof *c->prefixes);
    int total = 0;
    for (int b = 0; b < nbufs; b++)
        total += bufs[b].num_tensors;
    c->entries = calloc((size_t)(total ? total : 1), sizeof *c->entries);
    if (!c->bufs || !c->buf_stage_off || !c->buf_early_off || !c->prefixes || !c->entries) {
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
        if (!(c->prefixes[b] = strdup(B->prefix ? B->prefix : ""))) {
            rc = dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
            goto fail;
        }
        c->bufs[b].file = c->files[fi]; /* the copies: the caller's strings may go */
        c->bufs[b].prefix = c->prefixes[b];
        c->buf_stage_off[b] = c->staging_numel;
        c->buf_early_off[b] = c->estage_numel;
        if (B->copy_at_save)
            c->estage_numel += B->numel;
        for (int t = 0; t < B->num_tensors; t++) {
            const dt_tensor_info *ti = &B->tensors[t];
            dt_ckpt_entry *e = &c->entries[c->nentries];
            size_t len = strlen(B->prefix ? B->prefix : "") + strlen(ti->name) + 1;
            e->name = malloc(len);
            if (!e->name) {
                rc = dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
                goto fail;
            }
            c->nentries++;
            snprintf(e->name, len, "%s%s", B->prefix ? B->prefix : "", ti->name);
            e->file = fi;
            e->buf = b;
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
            e->state = B->prefix && B->prefix[0];
        }
        c->staging_numel += B->numel;
    }
    /* Names must be unique across buffers (they share files). */
    dt_ckpt_entry *sorted = malloc((size_t)(c->nentries ? c->nentries : 1) * sizeof *sorted);
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
    if ((rc = open_pieces(c, opts, err)))
        goto fail;
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
    for (int b = 0; c->prefixes && b < c->nbufs; b++)
        free(c->prefixes[b]);
    free(c->prefixes);
    free(c->bufs);
    free(c->buf_stage_off);
    free(c->buf_early_off);
    free(c->staging);
    free(c->estage);
    free_pieces(c);
    free(c->pstage);
    free(c->wbuf);
    dt_ckpt__charge(c, c->charged, false);
    free(c->wstate.job);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int dt_ckpt__ensure_staging(dt_ckpt *c, dt_err *err)
{
    if (c->staging || !c->staging_numel)
        return 0;
    c->staging = malloc(c->staging_numel * sizeof(float));
    if (!c->staging)
        return dt_err_set(err, -ENOMEM, "checkpoint: cannot allocate %.1f MB of host memory for "
                          "the staging copy", c->staging_numel * 4.0 / 1e6);
    dt_ckpt__charge(c, c->staging_numel * sizeof(float), true);
    return 0;
}

void dt_ckpt__drop_staging(dt_ckpt *c)
{
    if (!c->staging)
        return;
    free(c->staging);
    c->staging = NULL;
    dt_ckpt__charge(c, c->staging_numel * sizeof(float), false);
}

int dt_ckpt__ensure_estage(dt_ckpt *c, dt_err *err)
{
    if (c->estage || !c->estage_numel)
        return 0;
    if (!(c->estage = malloc(c->estage_numel * sizeof(float))))
        return dt_err_set(err, -ENOMEM, "checkpoint: cannot allocate %.1f MB of host memory for "
                          "the copy of the buffers the next forward changes",
                          c->estage_numel * 4.0 / 1e6);
    dt_ckpt__charge(c, c->estage_numel * sizeof(float), true);
    return 0;
}

void dt_ckpt__charge(dt_ckpt *c, size_t bytes, bool add)
{
    if (!c->be || !c->be->host_memory || !bytes)
        return;
    bytes = add ? bytes : DT_MIN(bytes, c->charged);
    c->charged = add ? c->charged + bytes : c->charged - bytes;
    dt_mem_external(c->be, DT_MEM_OTHER, bytes, add);
}

size_t dt_ckpt__wbuf_bytes(const dt_ckpt *c)
{
    return c->io_buffer ? DT_MIN((size_t)DT_CKPT_IO_CHUNK, c->io_buffer) : DT_CKPT_IO_CHUNK;
}

int dt_ckpt__ensure_wbuf(dt_ckpt *c, dt_err *err)
{
    if (c->wbuf)
        return 0;
    if (!(c->wbuf = malloc(dt_ckpt__wbuf_bytes(c))))
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory for the write buffer");
    dt_ckpt__charge(c, dt_ckpt__wbuf_bytes(c), true);
    return 0;
}

int dt_ckpt__host_collective(dt_ckpt *c, dt_comm *comm, void *host, size_t count, dt_dtype t,
                             int root, void *recv, dt_err *err)
{
    size_t bytes = count * dt_dtype_size(t);
    size_t total = recv ? bytes * (size_t)dt_comm_world_size(comm) : 0;
    if (!c->be)
        return recv ? dt_comm_allgather(comm, host, recv, count, t, NULL, err)
                    : dt_comm_broadcast(comm, host, count, t, root, NULL, err);
    char *dev = NULL;
    int rc = c->be->alloc(c->be, (void **)&dev, bytes + total, err);
    if (rc)
        return rc;
    c->be->memcpy_h2d(c->be, dev, host, bytes);
    rc = recv ? dt_comm_allgather(comm, dev, dev + bytes, count, t, NULL, err)
              : dt_comm_broadcast(comm, dev, count, t, root, NULL, err);
    if (!rc)
        c->be->memcpy_d2h(c->be, recv ? recv : host, recv ? dev + bytes : dev, recv ? total : bytes);
    c->be->free(c->be, dev);
    return rc;
}

void dt_ckpt__wait_idle(dt_ckpt *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->busy)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ============================================================================= discovery === */

bool dt_ckpt__parse_step_name(const char *name, int64_t *step, const char *suffix)
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

/* The step_<digits> entries under dir that are directories (dirs) or that are not (!dirs),
 * newest first. A missing dir is an empty list. */
static int list_steps(const char *dir, bool dirs, int64_t **steps, int *count, dt_err *err)
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
        if (!dt_ckpt__parse_step_name(de->d_name, &s, ""))
            continue;
        char p[PATH_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if ((stat(p, &st) == 0 && S_ISDIR(st.st_mode)) != dirs)
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

int dt_ckpt_list(const char *dir, int64_t **steps, int *count, dt_err *err)
{
    return list_steps(dir, true, steps, count, err);
}

int dt_ckpt_list_strays(const char *dir, int64_t **steps, int *count, dt_err *err)
{
    return list_steps(dir, false, steps, count, err);
}

int dt_ckpt__check_dir(const char *dir, dt_err *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno == ENOTDIR)
            return dt_err_set(err, -ENOTDIR, "the checkpoint directory %s cannot be created: a "
                              "part of that path is a file, not a directory; set checkpoint.dir "
                              "to a directory", dir);
        return 0; /* created by the first save, or that save says what is wrong */
    }
    if (!S_ISDIR(sb.st_mode))
        return dt_err_set(err, -ENOTDIR, "the checkpoint directory %s is not a directory (a file "
                          "is there); set checkpoint.dir to a directory, or move that file away",
                          dir);
    int64_t *strays = NULL;
    int n = 0;
    if (list_steps(dir, false, &strays, &n, NULL) != 0 || n == 0) {
        free(strays);
        return 0;
    }
    int64_t s = strays[n - 1]; /* the oldest: the first a run would meet */
    free(strays);
    return dt_err_set(err, -ENOTDIR, "%s/step_%" PRId64 " is not a directory, but is named like "
                      "a checkpoint: a save of step %" PRId64 " would fail there (after all the "
                      "training up to it), and resume skips it%s; remove or rename it, or set "
                      "checkpoint.dir to another directory", dir, s, s,
                      n > 1 ? " (and it is not the only one: see `dtrain ckpt list`)" : "");
}
