/* ckpt_write.c - saving a checkpoint: atomic, durable, in the background; retention.
 *
 * See ckpt.h for the layout and the guarantees, ckpt_core.h for how the checkpoint code is
 * split. The order of operations of a save, and why:
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
 *                                      renamed to step_M.old, <dir> synced, then deleted;
 *                                      one that no longer verifies (damaged) is left alone
 * (3 also fsyncs the parent of every directory that creating <dir> made.)
 *
 * ext4 and XFS need both the file fsyncs (4, 5) and the directory fsyncs (6, 8): fsync of a
 * file does not make its directory entry durable, and rename is only atomic, not durable, until
 * the parent directory is synced. Without step 6 a power cut after the rename could leave
 * step_N with files of length 0, which the checksum check then reports.
 *
 * Checksums are XXH64 of whole files (runtime/train/ckpt/xxh64.h). state.json cannot hold its own
 * hash, so it holds the hash of itself with the "state_xxh64" value written as sixteen zeros.
 */
#include "runtime/train/ckpt/ckpt_core.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/ckpt/safetensors.h"
#include "runtime/train/ckpt/xxh64.h"

#define DIRECT_WRITE (256u << 10) /* pieces at least this large skip the write buffer */
#define WRITEBACK_STEP (8u << 20) /* start writeback of every 8 MiB written */

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
    int rc = dt_ckpt__write_all(s->fd, data, n);
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
    char *own = NULL; /* the buffer, when the checkpoint has none of its own */
    int rc = 0;
    dt_xxh64_init(&s.hash, 0);
    s.fd = dt_ckpt__io->open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s.fd < 0)
        return dt_err_errno(err, errno, "cannot create %s", path);
    if (fill) {
        s.cap = dt_ckpt__wbuf_bytes(c);
        s.buf = c->wbuf ? c->wbuf : (own = malloc(s.cap));
        if (!s.buf) {
            rc = dt_err_set(err, -ENOMEM, "out of memory writing %s", path);
            goto out;
        }
        if ((rc = fill(c, file, &s, err)) || (rc = sink_flush(&s, err)))
            goto out;
    } else {
        dt_xxh64_update(&s.hash, raw, raw_len);
        s.total = raw_len;
        if ((rc = dt_ckpt__write_all(s.fd, raw, raw_len))) {
            rc = dt_err_errno(err, -rc, "writing %s", path);
            goto out;
        }
    }
    double t0 = dt_now_s();
    if (dt_ckpt__io->fsync(s.fd) != 0) {
        rc = dt_err_errno(err, errno, "fsync of %s failed", path);
        goto out;
    }
    *fsync_s += dt_now_s() - t0;
out:
    if (dt_ckpt__io->close(s.fd) != 0 && !rc)
        rc = dt_err_errno(err, errno, "closing %s failed", path);
    free(own);
    *bytes = s.total;
    *hash = dt_xxh64_digest(&s.hash);
    return rc;
}

/* Where the writer reads registered tensor e: the staging copy, or (direct) the buffer itself
 * (its copy when the next forward changes it). */
static const float *entry_src(const dt_ckpt *c, const dt_ckpt_entry *e)
{
    if (!c->direct)
        return c->staging + e->stage_off;
    if (c->bufs[e->buf].copy_at_save)
        return c->estage + c->buf_early_off[e->buf] + e->src_off;
    return c->bufs[e->buf].data + e->src_off;
}

/* ... and piece pc: its copy in c->pstage, or (direct, not early) where it lives. */
static const float *piece_src(const dt_ckpt *c, const dt_ckpt_pc *pc)
{
    return c->direct && !pc->early ? pc->p.data : c->pstage + pc->stage_off;
}

/* Fills one .safetensors file from the staging copy (direct: from the buffers). */
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
        const dt_ckpt_entry *e = &c->entries[i];
        if (e->file != file)
            continue;
        dt_st_tensor *t = &ts[k++];
        t->name = e->name;
        t->dtype = DT_ST_F32;
        t->ndim = e->ndim;
        for (int d = 0; d < e->ndim; d++)
            t->shape[d] = e->shape[d];
        t->data = entry_src(c, e);
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

/* Fills this rank's shard file from c->pstage (direct: from the pieces' own memory, but the
 * early ones): every piece a 1-D F32 tensor under its key;
 * records each piece's offset in the file and its XXH64. */
static int fill_shard(dt_ckpt *c, int file, wsink *s, dt_err *err)
{
    (void)file;
    dt_st_tensor *ts = calloc((size_t)(c->npc ? c->npc : 1), sizeof *ts);
    char *header = NULL;
    size_t hl = 0;
    uint64_t dl = 0;
    if (!ts)
        return dt_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; i < c->npc; i++) {
        dt_ckpt_pc *pc = &c->pcs[i];
        ts[i] = (dt_st_tensor){.name = pc->key, .dtype = DT_ST_F32, .ndim = 1,
                               .shape = {(int64_t)pc->p.n}, .data = piece_src(c, pc)};
    }
    char step[32], rank[32];
    snprintf(step, sizeof step, "%" PRId64, c->wstate.step);
    snprintf(rank, sizeof rank, "%d/%d", c->rank, c->world);
    dt_st_kv meta[] = {{"format", "dtrain-shard"}, {"producer", "dtrain " DT_VERSION},
                       {"step", step}, {"rank", rank}};
    int rc = dt_st_layout(ts, c->npc, meta, (int)DT_ARRAY_LEN(meta), &header, &hl, &dl, err);
    if (!rc)
        rc = sink_write(s, header, hl, err);
    for (int i = 0; i < c->npc && !rc; i++) {
        /* sorted by dt_st_layout: the piece is the one of this key */
        dt_ckpt_pc *pc = NULL;
        for (int k = 0; k < c->npc && !pc; k++)
            if (c->pcs[k].key == ts[i].name)
                pc = &c->pcs[k];
        pc->offset = hl + ts[i].begin;
        pc->xxh64 = dt_xxh64(ts[i].data, pc->p.n * sizeof(float), 0);
        rc = sink_write(s, ts[i].data, pc->p.n * sizeof(float), err);
    }
    free(header);
    free(ts);
    return rc;
}

/* This rank's pieces as state.json lists them, in file `fname`. NULL when out of memory. */
static cJSON *pieces_json(dt_ckpt *c, const char *fname)
{
    char hex[17];
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < c->npc; i++) {
        const dt_ckpt_pc *pc = &c->pcs[i];
        const dt_tensor_info *l = pc->p.local;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "tensor", c->entries[pc->entry].name);
        cJSON_AddStringToObject(o, "file", fname);
        cJSON_AddStringToObject(o, "key", pc->key);
        cJSON_AddNumberToObject(o, "offset", (double)pc->offset);
        cJSON_AddNumberToObject(o, "start", (double)pc->p.start);
        cJSON_AddNumberToObject(o, "n", (double)pc->p.n);
        hex64(hex, pc->xxh64);
        cJSON_AddStringToObject(o, "xxh64", hex);
        if (l->tp_parts > 0) {
            cJSON *tp = cJSON_AddObjectToObject(o, "tp");
            cJSON_AddNumberToObject(tp, "dim", l->tp_dim);
            cJSON_AddNumberToObject(tp, "parts", l->tp_parts);
            cJSON_AddNumberToObject(tp, "rank", pc->p.tp_rank);
            cJSON *sh = cJSON_AddArrayToObject(tp, "shape");
            for (int d = 0; d < l->ndim; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)l->shape[d]));
        }
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

/* The text of state.json for c->wstate and the recorded files, with its self-checksum. */
static char *state_json(dt_ckpt *c, const dt_ckpt_file_desc *files, int nfiles, cJSON *pieces)
{
    const dt_ckpt_state *st = &c->wstate;
    char hex[17];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", pieces ? DT_CKPT_VERSION_SHARDED : DT_CKPT_VERSION);
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
        const dt_ckpt_entry *e = &c->entries[i];
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
    if (pieces) /* handed over to the tree */
        cJSON_AddItemToObject(root, "pieces", pieces);
    if (st->job)
        cJSON_AddStringToObject(root, "job", st->job);
    else
        cJSON_AddNullToObject(root, "job");
    cJSON_AddStringToObject(root, "state_xxh64", DT_CKPT_ZERO16);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text)
        return NULL;
    /* The placeholder is the last "state_xxh64" value: hash with zeros, then fill it in. */
    char *key = NULL;
    for (char *p = strstr(text, DT_CKPT_SELF_KEY); p; p = strstr(p + 1, DT_CKPT_SELF_KEY))
        key = p;
    char *val = key ? strstr(key, "\"" DT_CKPT_ZERO16 "\"") : NULL;
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

static void remove_stale_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s;
        if (!dt_ckpt__parse_step_name(de->d_name, &s, ".tmp") && !dt_ckpt__parse_step_name(de->d_name, &s, ".old"))
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
        if ((rc = dt_ckpt__fsync_path(p, true, err)))
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
        if (dt_ckpt__is_foreign(c, p, why, sizeof why)) {
            if (kept >= c->keep)
                DT_WARN("checkpoint: not removing %s (beyond keep = %d): it is another "
                        "setup's checkpoint (%s)", p, c->keep, why);
            continue;
        }
        if (++kept <= c->keep)
            continue;
        dt_err de = {0};
        if (dt_ckpt_inspect(p, true, NULL, &de) != 0) { /* damaged: not this job's to remove */
            DT_WARN("checkpoint: not removing %s (beyond keep = %d): it is damaged (%s) and may "
                    "be repaired by hand; remove it yourself when it is not needed", p, c->keep,
                    de.msg);
            kept--;
            continue;
        }
        snprintf(olds[nold], sizeof olds[nold], "%s.old", p);
        dt_rm_rf(olds[nold], NULL); /* left by an earlier kill: the rename needs the name */
        if (dt_ckpt__io->rename(p, olds[nold]) != 0) {
            DT_WARN("checkpoint: cannot remove old checkpoint %s: cannot rename it to %s: %s", p,
                    olds[nold], strerror(errno));
            continue;
        }
        DT_INFO("checkpoint: removed %s (keep = %d)", p, c->keep);
        nold++;
    }
    free(steps);
    if (nold)
        dt_ckpt__fsync_path(c->dir, true, &e); /* the renames first: then no step_<N> is half gone */
    for (int i = 0; i < nold; i++)
        if (dt_rm_rf(olds[i], &e) != 0)
            DT_WARN("checkpoint: cannot delete %s: %s (the next save tries again)", olds[i],
                    e.msg);
    free(olds);
}

/* Moves the damaged checkpoint directory path (why: what is wrong with it) to path.damaged, or
 * path.damaged.<k> for the first k free, with a warning. 0 or the rename's error. */
static int set_aside(const char *path, const char *why, dt_err *err)
{
    char to[PATH_MAX + 32];
    struct stat sb;
    snprintf(to, sizeof to, "%s.damaged", path);
    for (int k = 1; lstat(to, &sb) == 0 && k < 1000; k++)
        snprintf(to, sizeof to, "%s.damaged.%d", path, k);
    if (dt_ckpt__io->rename(path, to) != 0)
        return dt_err_errno(err, errno, "cannot move the damaged %s aside to %s (it is kept: "
                            "move or repair it)", path, to);
    DT_WARN("checkpoint: %s is damaged (%s): moved aside to %s, not replaced (repair it by hand, "
            "or remove it)", path, why, to);
    return 0;
}

/* ------------------------------------------------------------------- sharded saves --- */

static void shard_file_name(char *out, size_t cap, int rank, int world)
{
    snprintf(out, cap, "shard-%05d-of-%05d.safetensors", rank, world);
}

/* Leaves <tmp>/shard-<rank>.failed with the reason (best effort): rank 0 stops waiting. */
static void mark_failed(dt_ckpt *c, const char *tmp, const dt_err *err)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/shard-%05d.failed", tmp, c->rank);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    const char *m = err && err->msg[0] ? err->msg : "unknown error";
    dt_ckpt__write_all(fd, m, strlen(m));
    close(fd);
}

/* This rank's shard file and, once it is durable, its index shard-<rank>.json (written,
 * fsynced, renamed: it exists only complete), which lists the file and its pieces. */
static int write_shard(dt_ckpt *c, const char *tmp, double *fsync_s, uint64_t *own,
                       dt_err *err)
{
    char name[64], path[PATH_MAX + 128], ipath[PATH_MAX + 128], itmp[PATH_MAX + 160], hex[17];
    uint64_t bytes = 0, hash = 0, ib, ih;
    shard_file_name(name, sizeof name, c->rank, c->world);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    int rc = write_file(path, c, 0, fill_shard, NULL, 0, &bytes, &hash, fsync_s, err);
    if (rc)
        return rc;
    *own = bytes;
    cJSON *idx = cJSON_CreateObject();
    cJSON_AddStringToObject(idx, "file", name);
    cJSON_AddNumberToObject(idx, "bytes", (double)bytes);
    hex64(hex, hash);
    cJSON_AddStringToObject(idx, "xxh64", hex);
    cJSON *arr = pieces_json(c, name);
    if (arr)
        cJSON_AddItemToObject(idx, "pieces", arr);
    char *text = arr ? cJSON_PrintUnformatted(idx) : NULL;
    cJSON_Delete(idx);
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory building the index of %s", name);
    snprintf(ipath, sizeof ipath, "%s/shard-%05d.json", tmp, c->rank);
    snprintf(itmp, sizeof itmp, "%s.tmp", ipath);
    rc = write_file(itmp, c, -1, NULL, text, strlen(text), &ib, &ih, fsync_s, err);
    free(text);
    if (!rc && dt_ckpt__io->rename(itmp, ipath) != 0)
        rc = dt_err_errno(err, errno, "cannot rename %s to %s", itmp, ipath);
    return rc;
}

/* Rank 0: waits for every rank's index (at most c->timeout_s; a rank's .failed ends it), then
 * reads them: files[0..world) and every piece into *pieces (a cJSON array, caller's). The
 * indexes are removed once read. */
static int collect_shards(dt_ckpt *c, const char *tmp, dt_ckpt_file_desc *files,
                          cJSON **pieces, uint64_t *total, dt_err *err)
{
    char p[PATH_MAX + 64];
    double t0 = dt_now_s(), nap = 0.001;
    int rc = 0;
    *pieces = cJSON_CreateArray();
    *total = 0;
    for (int r = 0; r < c->world && !rc;) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/shard-%05d.json", tmp, r);
        if (stat(p, &sb) == 0) {
            r++;
            continue;
        }
        snprintf(p, sizeof p, "%s/shard-%05d.failed", tmp, r);
        char *why = NULL;
        size_t len = 0;
        if (stat(p, &sb) == 0 && dt_read_file(p, &why, &len, NULL) == 0) {
            rc = dt_err_set(err, -EIO, "rank %d could not write its shard: %s", r, why);
            free(why);
            break;
        }
        if (dt_now_s() - t0 > c->timeout_s) {
            rc = dt_err_set(err, -ETIMEDOUT, "rank %d's shard did not appear in %s within %.0f "
                            "s: is checkpoint.dir one directory that every node shares? (a "
                            "sharded checkpoint needs it)", r, tmp, c->timeout_s);
            break;
        }
        usleep((useconds_t)(nap * 1e6));
        nap = DT_MIN(nap * 2, 0.05);
    }
    c->commit_wait_s = dt_now_s() - t0; /* into stats under the lock, by run_write */
    for (int r = 0; r < c->world && !rc; r++) {
        char *text = NULL;
        size_t len = 0;
        snprintf(p, sizeof p, "%s/shard-%05d.json", tmp, r);
        if ((rc = dt_read_file(p, &text, &len, err)))
            break;
        cJSON *idx = cJSON_Parse(text), *it, *next;
        free(text);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(idx, "file");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(idx, "bytes");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(idx, "xxh64");
        cJSON *arr = cJSON_GetObjectItemCaseSensitive(idx, "pieces");
        if (!cJSON_IsString(fn) || !cJSON_IsNumber(b) || !cJSON_IsString(h) ||
            !cJSON_IsArray(arr) || !dt_strlcpy(files[r].name, fn->valuestring,
                                               sizeof files[r].name)) {
            cJSON_Delete(idx);
            rc = dt_err_set(err, -EBADMSG, "%s is malformed", p);
            break;
        }
        files[r].bytes = (uint64_t)b->valuedouble;
        files[r].xxh64 = strtoull(h->valuestring, NULL, 16);
        *total += files[r].bytes;
        for (it = arr->child; it; it = next) { /* moved into the one list */
            next = it->next;
            cJSON_AddItemToArray(*pieces, cJSON_DetachItemViaPointer(arr, it));
        }
        cJSON_Delete(idx);
        unlink(p);
    }
    return rc;
}

/* Rank 0, on the caller's thread, before any rank writes: <dir> there, leftovers of
 * interrupted saves removed (step_<N>.tmp included: no rank writes before this returns),
 * step_<N>.tmp created. */
static int prepare_step(dt_ckpt *c, int64_t step, dt_err *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/step_%" PRId64 ".tmp", c->dir, step) >= (int)sizeof tmp)
        return dt_err_set(err, -ENAMETOOLONG, "checkpoint directory path too long: %s", c->dir);
    int rc = make_dir_durable(c->dir, err);
    if (rc)
        return rc;
    remove_stale_tmp(c->dir);
    if (dt_ckpt__io->mkdir(tmp, 0755) != 0)
        return dt_err_errno(err, errno, "cannot create %s", tmp);
    return 0;
}

/* Steps 3..9 of a save, from c->staging and c->wstate. */
static int write_checkpoint(dt_ckpt *c, double *fsync_s, uint64_t *total_bytes, uint64_t *own,
                            char *final, size_t final_size, dt_err *err)
{
    char tmp[PATH_MAX], old[PATH_MAX], path[PATH_MAX + 128], note[256];
    dt_ckpt_file_desc files_v1[DT_CKPT_MAX_FILES], *files = files_v1;
    char *text = NULL;
    cJSON *pieces = NULL;
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
    if (c->sharded) {
        made_tmp = c->rank == 0; /* made by rank 0's dt_ckpt_save, removed by it on failure */
        if ((rc = write_shard(c, tmp, fsync_s, own, err))) {
            mark_failed(c, tmp, err);
            goto fail;
        }
        *total_bytes = *own;
        if (c->rank != 0)
            return 0;
        if (!(files = calloc((size_t)c->world, sizeof *files))) {
            rc = dt_err_set(err, -ENOMEM, "out of memory");
            goto fail;
        }
        if ((rc = collect_shards(c, tmp, files, &pieces, total_bytes, err)))
            goto fail;
        text = state_json(c, files, c->world, pieces);
        pieces = NULL; /* the tree's now */
        goto state;
    }
    if ((rc = make_dir_durable(c->dir, err)))
        goto fail;
    remove_stale_tmp(c->dir);
    if (dt_ckpt__io->mkdir(tmp, 0755) != 0) {
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
    *own = *total_bytes;
    text = state_json(c, files, c->nfiles, NULL);
state:
    if (!text) {
        rc = dt_err_set(err, -ENOMEM, "out of memory building state.json");
        goto fail;
    }
    uint64_t sb, sh;
    snprintf(path, sizeof path, "%s/state.json", tmp);
    rc = write_file(path, c, -1, NULL, text, strlen(text), &sb, &sh, fsync_s, err);
    free(text);
    text = NULL;
    if (rc)
        goto fail;
    *total_bytes += sb;
    if (c->sharded) {
        *own += sb;
        /* the pieces must form the checkpoint: every tensor covered once, every file there */
        if ((rc = dt_ckpt_inspect(tmp, false, NULL, err))) {
            dt_err_prefix(err, "the ranks' shards do not form a checkpoint: ");
            goto fail;
        }
    }
    double t0 = dt_now_s();
    if ((rc = dt_ckpt__fsync_path(tmp, true, err)))
        goto fail;
    if (dt_ckpt__io->rename(tmp, final) != 0) {
        int e = errno;
        if (e != EEXIST && e != ENOTEMPTY) {
            rc = dt_err_errno(err, e, "cannot rename %s to %s", tmp, final);
            goto fail;
        }
        /* The same step is already there (a job resumed from an older one and saved it
         * again): move it aside, put the new one in place, then remove the old one. Unless it
         * is another setup's (another model or optimizer): that one is the user's, never
         * replaced; or damaged: then it stays, set aside. */
        char why[DT_ERR_MSG_MAX];
        if (dt_ckpt__is_foreign(c, final, why, sizeof why)) {
            rc = dt_err_set(err, -EEXIST, "%s is already there and is another setup's "
                            "checkpoint (%s); it is left as it is: give this job another "
                            "checkpoint.dir", final, why);
            goto fail;
        }
        /* A damaged one of this setup may be repaired by hand: kept, under a name that
         * discovery ignores and nothing removes. */
        dt_err de = {0};
        if (dt_ckpt_inspect(final, true, NULL, &de) != 0) {
            if ((rc = set_aside(final, de.msg, err)))
                goto fail;
        } else if (dt_ckpt__io->rename(final, old) != 0) {
            rc = dt_err_errno(err, errno, "cannot move the existing %s aside", final);
            goto fail;
        }
        if (dt_ckpt__io->rename(tmp, final) != 0) {
            rc = dt_err_errno(err, errno, "cannot rename %s to %s", tmp, final);
            dt_ckpt__io->rename(old, final);
            goto fail;
        }
        made_tmp = false;
        if ((rc = dt_ckpt__fsync_path(c->dir, true, err)))
            goto fail;
        dt_rm_rf(old, NULL); /* nothing there when the old one was set aside */
    }
    made_tmp = false;
    if ((rc = dt_ckpt__fsync_path(c->dir, true, err))) {
        /* The checkpoint is complete and in place, but its rename may not survive a power cut. */
        dt_err_prefix(err, "checkpoint %s was written but may not survive a power cut: ", final);
        if (files != files_v1)
            free(files);
        return rc;
    }
    *fsync_s += dt_now_s() - t0;
    if (files != files_v1)
        free(files);
    return 0;
fail:
    if (files != files_v1)
        free(files);
    cJSON_Delete(pieces);
    free(text);
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

/* The buffers are read (copied since t0, or written where they are): dt_ckpt_fence returns. */
static void buffers_read(dt_ckpt *c, double t0)
{
    pthread_mutex_lock(&c->mu);
    c->copy_pending = false;
    c->copy_s += dt_now_s() - t0;
    if (c->fence_waiting) {
        c->fence_s = dt_now_s() - c->fence_start;
        c->fence_waiting = false;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Runs the pending write (called by the writer thread, or inline when !async). A direct write
 * reads the buffers themselves: the fence waits until the whole write is done. */
static void run_write(dt_ckpt *c)
{
    dt_err e = {0};
    double fs = 0, t0 = dt_now_s();
    /* read without the lock: only this thread clears it */
    bool in_place = c->copy_pending && c->direct;
    if (c->copy_pending && !c->direct) {
        copy_to_staging(c, COPY_LATE);
        buffers_read(c, t0);
        t0 = dt_now_s();
    }
    uint64_t bytes = 0, own = 0;
    char final[PATH_MAX];
    int rc = write_checkpoint(c, &fs, &bytes, &own, final, sizeof final, &e);
    if (in_place) /* the write's time is not a copy's */
        buffers_read(c, dt_now_s());
    double dt = dt_now_s() - t0;
    bool writer = !c->sharded || c->rank == 0; /* the one that commits */
    if (!rc && writer) /* the new checkpoint is complete: only now may older ones go */
        apply_retention(c, c->wstate.step);
    if (rc)
        DT_ERROR("%s", e.msg);
    else if (!writer)
        DT_DEBUG("checkpoint: wrote this rank's shard of %s (%.1f MB in %.2f s)", final,
                 own / 1e6, dt);
    else if (c->sharded)
        DT_INFO("checkpoint: saved %s (%.1f MB in %d shards, this rank's %.1f MB in %.2f s%s; "
                "training held %.3f s)", final, bytes / 1e6, c->world, own / 1e6, dt,
                c->async ? ", in the background" : "", c->hold_s >= 0 ? c->hold_s + c->fence_s
                                                                       : dt);
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
        c->stats.own_bytes = own;
        c->stats.commit_wait_s = c->commit_wait_s;
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
 * or all of them to the staging area. Direct: only the copy_at_save ones are ever copied (to
 * c->estage, or the pieces' c->pstage); the writer reads the others where they are. */
static void copy_to_staging(dt_ckpt *c, int which)
{
    if (c->direct && which == COPY_ALL)
        which = COPY_EARLY;
    if (c->direct && which == COPY_LATE)
        return;
    for (int i = 0; c->sharded && i < c->npc; i++) { /* this rank's pieces only */
        const dt_ckpt_pc *pc = &c->pcs[i];
        if ((which == COPY_EARLY && !pc->early) || (which == COPY_LATE && pc->early))
            continue;
        float *dst = c->pstage + pc->stage_off;
        if (c->be)
            c->be->memcpy_d2h(c->be, dst, pc->p.data, pc->p.n * sizeof(float));
        else
            memcpy(dst, pc->p.data, pc->p.n * sizeof(float));
    }
    for (int b = 0; !c->sharded && b < c->nbufs; b++) {
        if ((which == COPY_EARLY && !c->bufs[b].copy_at_save) ||
            (which == COPY_LATE && c->bufs[b].copy_at_save))
            continue;
        float *dst = c->direct ? c->estage + c->buf_early_off[b]
                               : c->staging + c->buf_stage_off[b];
        size_t bytes = c->bufs[b].numel * sizeof(float);
        if (!bytes)
            continue;
        if (c->be)
            c->be->memcpy_d2h(c->be, dst, c->bufs[b].data, bytes);
        else
            memcpy(dst, c->bufs[b].data, bytes);
    }
}

/* A sharded save's start, on every rank at the same step: the staging of this rank's pieces,
 * rank 0's step_<N>.tmp (its outcome sent to every rank), so that no rank writes before the
 * directory is ready nor after it failed. */
static int prepare_sharded(dt_ckpt *c, int64_t step, dt_err *err)
{
    if (!c->pstage && c->pstage_cap) {
        if (!(c->pstage = malloc(c->pstage_cap * sizeof(float))))
            return dt_err_set(err, -ENOMEM, "checkpoint: cannot allocate %.1f MB of host memory "
                              "for the copy of this rank's shard", c->pstage_cap * 4.0 / 1e6);
        dt_ckpt__charge(c, c->pstage_cap * sizeof(float), true);
    }
    dt_err e0 = {0};
    int64_t v = c->rank == 0 ? prepare_step(c, step, &e0) : 0;
    int rc = 0;
    if (c->comm && c->world > 1 &&
        (rc = dt_ckpt__host_collective(c, c->comm, &v, 1, DT_INT64, 0, NULL, err)))
        return dt_err_prefix(err, "checkpoint step_%" PRId64 " not saved: starting it: ", step);
    if (v && c->rank == 0) {
        if (err)
            *err = e0;
        return dt_err_prefix(err, "checkpoint step_%" PRId64 " not saved: ", step);
    }
    if (v)
        return dt_err_set(err, (int)v, "checkpoint step_%" PRId64 " not saved: rank 0 could not "
                          "create its directory (rank 0's log says why)", step);
    return 0;
}

int dt_ckpt_save(dt_ckpt *c, const dt_ckpt_state *st, dt_err *err)
{
    double t0 = dt_now_s() - c->pre_wait_s; /* dt_ckpt_set_pieces's wait held the caller too */
    c->pre_wait_s = 0;
    int rc = dt_ckpt_wait(c, err);
    if (rc) {
        dt_err_prefix(err, "an earlier checkpoint failed: ");
        return rc;
    }
    double t1 = dt_now_s();
    if ((rc = dt_ckpt__ensure_wbuf(c, err)))
        return rc;
    if (c->sharded) {
        if ((rc = prepare_sharded(c, st->step, err)))
            return rc;
    } else if ((rc = c->direct ? dt_ckpt__ensure_estage(c, err)
                               : dt_ckpt__ensure_staging(c, err))) {
        return rc;
    }
    char *job = NULL;
    if (st->job && !(job = strdup(st->job)))
        return dt_err_set(err, -ENOMEM, "checkpoint: out of memory");
    bool late = c->async && c->concurrent; /* direct: the write itself is late */
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
