/* ckpt_read.c - reading checkpoints: verification, foreign-checkpoint detection, loading,
 * resume (which checkpoint), and inspection for `dtrain ckpt`.
 *
 * See ckpt.h for what is verified and in which order, ckpt_core.h for how the checkpoint code is
 * split. Nothing is copied into the registered buffers before everything has been checked: the
 * files are read into the staging area, and only a checkpoint that passed every check is copied
 * from there into the model and the optimiser state.
 */
#include "runtime/train/ckpt/ckpt_core.h"

#include <cJSON.h>
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
#include "runtime/train/ckpt/safetensors.h"
#include "runtime/train/ckpt/xxh64.h"

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

/* A file of the wrong size (size bytes, fd at its start): when it is a whole safetensors file
 * of its own, it was replaced after the save, and what fills why says so: another model's file
 * (the first tensor that differs from w[0..nw), sorted by name), or this model's tensors in
 * another file (another step's, or another run's). why = "" when it is no such file (truncated,
 * appended to). fd is left at an undefined offset. */
static void replaced_file(int fd, uint64_t size, const want *w, int nw, char *why, size_t cap)
{
    unsigned char lenb[8], *head = NULL;
    dt_st_file *f = NULL;
    uint64_t hn = 0;
    why[0] = '\0';
    if (size < 8 || dt_ckpt__read_all(fd, lenb, 8))
        return;
    for (int k = 7; k >= 0; k--)
        hn = (hn << 8) | lenb[k];
    if (hn > DT_ST_MAX_HEADER || 8 + hn > size || !(head = malloc((size_t)(8 + hn))))
        return;
    memcpy(head, lenb, 8);
    if (dt_ckpt__read_all(fd, head + 8, (size_t)hn) == 0 &&
        dt_st_parse(head, (size_t)(8 + hn), size, &f, NULL) == 0) {
        char a[160], b[160];
        const char *diff = NULL;
        for (int i = 0; i < nw && !diff; i++) {
            const dt_st_tensor *t = dt_st_find(f, w[i].name);
            bool same = t && t->dtype == DT_ST_F32 && t->ndim == w[i].ndim;
            for (int d = 0; same && d < t->ndim; d++)
                same = t->shape[d] == w[i].shape[d];
            if (!t) {
                snprintf(why, cap, "it is a whole safetensors file of another model, without "
                         "tensor %s: it was replaced after the save", w[i].name);
                diff = w[i].name;
            } else if (!same) {
                shape_text(a, sizeof a, t->ndim, t->shape);
                shape_text(b, sizeof b, w[i].ndim, w[i].shape);
                snprintf(why, cap, "it is a whole safetensors file of another model: tensor %s "
                         "is %s %s there, F32 %s in this checkpoint; it was replaced after the "
                         "save", w[i].name, dt_st_dtype_name(t->dtype), a, b);
                diff = w[i].name;
            }
        }
        if (!diff)
            snprintf(why, cap, "it is a whole safetensors file with this checkpoint's %s, but "
                     "not the one it wrote (%s): it was replaced after the save",
                     f->num_tensors == nw ? "tensors" : "tensors and others",
                     dt_st_meta_get(f, "step") ? "another step's, or another run's"
                                               : "written by another program");
    }
    dt_st_free(f);
    free(head);
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
    int fd = dt_ckpt__io->open(path, O_RDONLY | O_CLOEXEC, 0);
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
        char what[DT_ERR_MSG_MAX / 2];
        replaced_file(fd, (uint64_t)st.st_size, w, nw, what, sizeof what);
        rc = dt_err_set(err, -EBADMSG, "%s has %" PRIu64 " bytes, the checkpoint recorded %" PRIu64
                        " (%s)", name, (uint64_t)st.st_size, rec_bytes,
                        what[0] ? what : (uint64_t)st.st_size < rec_bytes ? "truncated"
                                                                          : "appended to");
        goto out;
    }
    unsigned char lenb[8];
    if (rec_bytes < 8 || (rc = dt_ckpt__read_all(fd, lenb, 8))) {
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
    scratch = malloc(DT_CKPT_IO_CHUNK);
    if (!head || !scratch) {
        rc = dt_err_set(err, -ENOMEM, "out of memory reading %s", name);
        goto out;
    }
    memcpy(head, lenb, 8);
    if ((rc = dt_ckpt__read_all(fd, head + 8, (size_t)hn))) {
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
            size_t n = left < DT_CKPT_IO_CHUNK ? (size_t)left : DT_CKPT_IO_CHUNK;
            unsigned char *p = dst ? dst : scratch;
            if ((rc = dt_ckpt__read_all(fd, p, n))) {
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
    dt_ckpt__io->close(fd);
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

/* Reads and checks <path>/state.json: its self-checksum, format and version; fills st (job
 * owned) and returns the parsed tree in *root (caller deletes). */
static int read_state(const char *path, dt_ckpt_state *st, cJSON **root_out, int *version,
                      dt_err *err)
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
    for (char *q = strstr(text, DT_CKPT_SELF_KEY); q; q = strstr(q + 1, DT_CKPT_SELF_KEY))
        key = q;
    char *val = key ? strchr(key + strlen(DT_CKPT_SELF_KEY), '"') : NULL;
    char rec[17] = {0};
    uint64_t want_h, got_h;
    if (!val || strlen(val) < 18 || val[17] != '"') {
        rc = dt_err_set(err, -EBADMSG, "state.json has no valid state_xxh64 (corrupt or "
                        "truncated)");
        goto out;
    }
    memcpy(rec, val + 1, 16);
    memcpy(val + 1, DT_CKPT_ZERO16, 16);
    got_h = dt_xxh64(text, len, 0);
    memcpy(val + 1, rec, 16);
    if (dt_ckpt__parse_hex64(rec, &want_h) || got_h != want_h) {
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
    if (ver != DT_CKPT_VERSION && ver != DT_CKPT_VERSION_SHARDED) {
        rc = dt_err_set(err, -EBADMSG, "checkpoint format version %" PRId64 " (this dtrain reads "
                        "versions %d and %d)", ver, DT_CKPT_VERSION, DT_CKPT_VERSION_SHARDED);
        goto out;
    }
    if (version)
        *version = (int)ver;
    dt_ckpt_state_init(st);
    if ((rc = get_i64(root, "step", true, &st->step, err)) ||
        (rc = get_i64(root, "epoch", true, &st->epoch, err)) ||
        (rc = get_i64(root, "sample_pos", true, &st->sample_pos, err)) ||
        (rc = get_i64(root, "samples_seen", false, &st->samples_seen, err)) ||
        (rc = get_i64(root, "world_size", false, &ws, err)))
        goto out;
    st->world_size = (int)ws;
    /* A step_<N> directory holds step N: a copy or a rename (cp -r step_275 step_300) would
     * resume at one step with another step's state, and count as the newest. */
    char base[PATH_MAX];
    dt_strlcpy(base, path, sizeof base);
    for (size_t n = strlen(base); n > 1 && base[n - 1] == '/'; n--)
        base[n - 1] = '\0';
    const char *slash = strrchr(base, '/');
    int64_t named;
    if (dt_ckpt__parse_step_name(slash ? slash + 1 : base, &named, "") && named != st->step) {
        rc = dt_err_set(err, -EBADMSG, "the directory is named step_%" PRId64 " but its "
                        "state.json is step %" PRId64 "'s (a copy or a rename?): rename it "
                        "back to step_%" PRId64 ", or remove it", named, st->step, st->step);
        goto out;
    }
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
            ok = cJSON_IsString(x) && dt_ckpt__parse_hex64(x->valuestring, &r.s[k]) == 0;
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

/* The file list of state.json: *files (malloc'd, caller frees, also on failure) and *n. */
static int read_files(const cJSON *root, dt_ckpt_file_desc **files_out, int *n, dt_err *err)
{
    const cJSON *fo = cJSON_GetObjectItemCaseSensitive(root, "files"), *it;
    *n = 0;
    *files_out = NULL;
    if (!cJSON_IsObject(fo))
        return dt_err_set(err, -EBADMSG, "state.json lacks the file list");
    int cnt = cJSON_GetArraySize(fo);
    dt_ckpt_file_desc *files = calloc((size_t)(cnt ? cnt : 1), sizeof *files);
    if (!files)
        return dt_err_set(err, -ENOMEM, "out of memory");
    *files_out = files;
    cJSON_ArrayForEach(it, fo)
    {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(it, "bytes");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(it, "xxh64");
        dt_ckpt_file_desc *f = &files[*n];
        if (*n == cnt || !cJSON_IsNumber(b) || b->valuedouble < 0 || !cJSON_IsString(h) ||
            dt_ckpt__parse_hex64(h->valuestring, &f->xxh64) || strchr(it->string, '/') ||
            !dt_strlcpy(f->name, it->string, sizeof f->name))
            return dt_err_set(err, -EBADMSG, "state.json: bad file entry \"%s\"", it->string);
        f->bytes = (uint64_t)b->valuedouble;
        (*n)++;
    }
    return 0;
}

/* Whether file holds any of the model's own tensors (those registered without a prefix). */
static bool is_model_file(dt_ckpt *c, const char *file)
{
    for (int i = 0; i < c->nentries; i++)
        if (!c->entries[i].state && !strcmp(c->files[c->entries[i].file], file))
            return true;
    return false;
}

/* The first difference between the checkpoint's table (d, n) and the registered tensors, written
 * to msg; false when they are the same. model_only: only the model's own tensors (registered
 * without a prefix) against the checkpoint's tensors in the files that hold them here. */
static bool table_diff(dt_ckpt *c, const dt_ckpt_tensor_desc *d, int n, bool model_only,
                       char *msg, size_t size)
{
    char a[160], b[160];
    int here = 0, there = 0;
    for (int i = 0; i < c->nentries; i++) {
        const dt_ckpt_entry *e = &c->entries[i];
        if (model_only && e->state)
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
        there += !model_only || is_model_file(c, d[j].file);
    if (there != here) {
        snprintf(msg, size, "%d %stensors there, %d here", there, model_only ? "model " : "",
                 here);
        return true;
    }
    return false;
}

/* Appends name[0..len) to the ", "-separated list out unless it is there already. */
static void add_name(char *out, size_t size, const char *name, size_t len)
{
    for (const char *p = out; *p;) {
        const char *end = strstr(p, ", ");
        size_t l = end ? (size_t)(end - p) : strlen(p);
        if (l == len && !strncmp(p, name, len))
            return;
        p += l + (end ? 2 : 0);
    }
    size_t o = strlen(out);
    snprintf(out + o, size - o, "%s%.*s", o ? ", " : "", (int)len, name);
}

/* The per-parameter state each side keeps, by name, for the message about another optimizer:
 * here the prefixes the caller registered, there the prefixes of the checkpoint's tensors
 * outside the model's files (what precedes a model tensor's name: "exp_avg" of
 * "exp_avg.h.0.mlp.weight"; else the name up to its first dot). Trailing dots dropped. */
static void state_names(dt_ckpt *c, const dt_ckpt_tensor_desc *d, int n, char *there,
                        char *here, size_t size)
{
    there[0] = here[0] = '\0';
    for (int b = 0; b < c->nbufs; b++) {
        const char *p = c->bufs[b].prefix;
        size_t l = p ? strlen(p) : 0;
        while (l > 0 && p[l - 1] == '.')
            l--;
        if (l)
            add_name(here, size, p, l);
    }
    for (int j = 0; j < n; j++) {
        if (is_model_file(c, d[j].file))
            continue;
        const char *name = d[j].name;
        size_t len = strlen(name), best = 0;
        for (int i = 0; i < c->nentries; i++) {
            const dt_ckpt_entry *e = &c->entries[i];
            size_t l = strlen(e->name);
            if (!e->state && l < len && l > best && !strcmp(name + len - l, e->name))
                best = l;
        }
        size_t l = best ? len - best : strcspn(name, ".");
        while (l > 0 && name[l - 1] == '.')
            l--;
        add_name(there, size, name, l ? l : len);
    }
    if (!there[0])
        dt_strlcpy(there, "none", size);
    if (!here[0])
        dt_strlcpy(here, "none", size);
}

/* -EXDEV when the checkpoint's table differs from the registered tensors: "written for another
 * model" when the model's own tensors differ, "written with another optimizer" when only the
 * per-parameter state does (train.optimizer changed). Which tensors are the model's and which
 * the optimiser's comes from the registration (prefix or none), never from built-in names. */
static int check_foreign(dt_ckpt *c, const dt_ckpt_tensor_desc *d, int n, dt_err *err)
{
    char why[400], there[160], here[160];
    if (table_diff(c, d, n, true, why, sizeof why))
        return dt_err_set(err, -EXDEV, "written for another model: %s", why);
    if (table_diff(c, d, n, false, why, sizeof why)) {
        state_names(c, d, n, there, here, sizeof there);
        return dt_err_set(err, -EXDEV, "written with another optimizer (its optimizer state "
                          "differs: %s; the checkpoint holds %s, this job's optimizer keeps %s)",
                          why, there, here);
    }
    return 0;
}

/* Whether the checkpoint directory `path` was written for another setup (another model or
 * optimizer: its tensor table differs). Unreadable or corrupt ones are not foreign: they are
 * damaged, and may be replaced or removed. why gets the difference. */
bool dt_ckpt__is_foreign(dt_ckpt *c, const char *path, char *why, size_t size)
{
    dt_ckpt_state st;
    cJSON *root = NULL;
    dt_ckpt_tensor_desc *descs = NULL;
    int nd = 0;
    dt_err e = {0};
    dt_ckpt_state_init(&st);
    bool foreign = read_state(path, &st, &root, NULL, NULL) == 0 &&
                   read_table(root, &descs, &nd, NULL) == 0 &&
                   check_foreign(c, descs, nd, &e) == -EXDEV;
    if (foreign)
        dt_strlcpy(why, e.msg, size);
    dt_ckpt_state_clear(&st);
    cJSON_Delete(root);
    free(descs);
    return foreign;
}

/* Sharded: every shard file state.json lists read whole and checked (size, XXH64, a header
 * that lists exactly its pieces, 1-D F32 of their lengths); then every piece's own checksum
 * (stream_pieces). w: scratch of np entries. */
static int verify_shards(const char *path, const dt_ckpt_file_desc *files, int nf,
                         const dt_ckpt_pdesc *p, int np, want *w, dt_err *err)
{
    for (int fi = 0; fi < nf; fi++) {
        int nw = 0;
        for (int i = 0; i < np; i++) {
            if (p[i].file != fi)
                continue;
            w[nw] = (want){.name = p[i].key, .ndim = 1, .shape = {(int64_t)p[i].n}};
            nw++;
        }
        if (nw > 1)
            qsort(w, (size_t)nw, sizeof *w, cmp_want);
        int rc = read_st_file(path, files[fi].name, files[fi].bytes, files[fi].xxh64, w, nw, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Where a sharded load puts tensor t of the checkpoint's table: the registered buffer. */
typedef struct load_dst {
    dt_ckpt *c;
    const int *entry; /* (table) the registered entry of each tensor */
} load_dst;

static float *load_dst_of(void *ctx, int t)
{
    load_dst *d = ctx;
    const dt_ckpt_entry *e = &d->c->entries[d->entry[t]];
    return d->c->bufs[e->buf].data + e->src_off;
}

/* A sharded checkpoint (state.json read: root, its table descs[0..nd), files[0..nf)) into the
 * registered buffers: everything checked first, then the pieces streamed through the read
 * buffer straight to where their tensors live (no copy of the model in between). */
static int load_sharded(dt_ckpt *c, const char *path, const cJSON *root,
                        const dt_ckpt_tensor_desc *descs, int nd, const dt_ckpt_file_desc *files,
                        int nf, dt_err *err)
{
    dt_ckpt_pdesc *p = NULL;
    int np = 0, rc;
    want *w = NULL;
    int *entry = calloc((size_t)(nd ? nd : 1), sizeof *entry);
    if (!entry)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if ((rc = dt_ckpt__read_pieces(root, descs, nd, files, nf, &p, &np, err)) ||
        (rc = dt_ckpt__check_cover(descs, nd, p, np, err)))
        goto out;
    if (!(w = calloc((size_t)(np ? np : 1), sizeof *w))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int t = 0; t < nd; t++) { /* check_foreign: the same tensors, registered */
        entry[t] = -1;
        for (int i = 0; i < c->nentries && entry[t] < 0; i++)
            if (!strcmp(c->entries[i].name, descs[t].name))
                entry[t] = i;
        if (entry[t] < 0) {
            rc = dt_err_set(err, -EXDEV, "written for another model: it has tensor %s",
                            descs[t].name);
            goto out;
        }
    }
    size_t io = c->io_buffer ? c->io_buffer : DT_CKPT_IO_BUFFER_DEFAULT;
    if ((rc = verify_shards(path, files, nf, p, np, w, err)) ||
        (rc = dt_ckpt__stream_pieces(path, descs, files, p, np, io, NULL, NULL, NULL, err)))
        goto out;
    /* Everything checked: now the model changes. */
    load_dst d = {c, entry};
    rc = dt_ckpt__stream_pieces(path, descs, files, p, np, io, c->be, load_dst_of, &d, err);
out:
    free(entry);
    free(p);
    free(w);
    return rc;
}

int dt_ckpt_load(dt_ckpt *c, const char *path, dt_ckpt_state *st, dt_err *err)
{
    dt_ckpt_state tmp;
    cJSON *root = NULL;
    dt_ckpt_tensor_desc *descs = NULL;
    dt_ckpt_file_desc *files = NULL;
    want *w = NULL;
    int nd = 0, nf = 0, version = 0, rc;
    dt_ckpt_state_init(&tmp);
    dt_ckpt__wait_idle(c);
    if ((rc = read_state(path, &tmp, &root, &version, err)))
        goto out;
    if ((rc = read_table(root, &descs, &nd, err)) || (rc = read_files(root, &files, &nf, err)) ||
        (rc = check_foreign(c, descs, nd, err)))
        goto out;
    if (version == DT_CKPT_VERSION_SHARDED) {
        if ((rc = load_sharded(c, path, root, descs, nd, files, nf, err)))
            goto out;
        goto loaded;
    }
    if ((rc = dt_ckpt__ensure_staging(c, err)))
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
                            is_model_file(c, c->files[fi]) ? "for another model"
                                                           : "with another optimizer", fname);
            goto out;
        }
        int nw = 0;
        for (int i = 0; i < c->nentries; i++) {
            const dt_ckpt_entry *e = &c->entries[i];
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
loaded:
    dt_ckpt_state_clear(st);
    *st = tmp;
    tmp.job = NULL;
out:
    if (c->direct) /* saves write from the buffers: nothing needs the copy any more */
        dt_ckpt__drop_staging(c);
    if (rc)
        dt_err_prefix(err, "checkpoint %s: ", path);
    dt_ckpt_state_clear(&tmp);
    cJSON_Delete(root);
    free(descs);
    free(files);
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
    int n = 0, skipped = 0, foreign = 0, damaged = 0, rc;
    dt_err first_foreign = {0}, first_damaged = {0};
    *resumed = false;
    if (dt_ckpt_list_strays(c->dir, &steps, &n, NULL) == 0)
        for (int i = 0; i < n; i++)
            DT_WARN("checkpoint: %s/step_%" PRId64 " is not a directory (a file named like a "
                    "checkpoint): resume skips it, and a save of step %" PRId64 " would fail; "
                    "remove or rename it", c->dir, steps[i], steps[i]);
    free(steps);
    steps = NULL;
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
        else if (e.code != -EXDEV && !damaged++)
            first_damaged = e;
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
    if (damaged)
        /* Only damaged checkpoints of this setup: a fresh start would train from step 0 over
         * checkpoints that may be repaired by hand (a file put back). Stop and say so. */
        return dt_err_set(err, -EBADMSG,
                          "none of the %d checkpoints under %s can be loaded (the newest: %s); "
                          "they are left as they are: repair them (put back what changed), "
                          "give this job another checkpoint.dir, or set checkpoint.resume = "
                          "never to start over (a fresh start moves a damaged checkpoint it "
                          "would save over aside, as step_<N>.damaged, and never replaces or "
                          "removes one)",
                          damaged, c->dir, first_damaged.msg);
    return 0;
}

int dt_ckpt_check_ahead(dt_ckpt *c, int64_t from, int64_t to, dt_err *err)
{
    int64_t *steps = NULL;
    int n = 0, rc = dt_ckpt_list(c->dir, &steps, &n, err);
    if (rc)
        return rc;
    for (int i = n - 1; i >= 0; i--) { /* oldest first: the save this run meets first */
        char p[PATH_MAX], why[DT_ERR_MSG_MAX];
        if (steps[i] <= from || steps[i] > to)
            continue;
        snprintf(p, sizeof p, "%s/step_%" PRId64, c->dir, steps[i]);
        if (dt_ckpt__is_foreign(c, p, why, sizeof why)) {
            rc = dt_err_set(err, -EXDEV,
                            "%s is another setup's checkpoint (%s), at a step this run may "
                            "save (it trains steps %" PRId64 " to %" PRId64 " and saves every "
                            "checkpoint.every steps, at its last step, and at any step where a "
                            "stop signal ends it); it is left as it is: give this job another "
                            "checkpoint.dir, or move that checkpoint out of %s",
                            p, why, from + 1, to, c->dir);
            break;
        }
    }
    free(steps);
    return rc;
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
/* ================================================================================= tools === */

void dt_ckpt_info_free(dt_ckpt_info *info)
{
    if (!info)
        return;
    dt_ckpt_state_clear(&info->state);
    free(info->tensors);
    free(info->files);
    memset(info, 0, sizeof *info);
    dt_ckpt_state_init(&info->state);
}

int dt_ckpt_inspect(const char *path, bool verify, dt_ckpt_info *info, dt_err *err)
{
    dt_ckpt_info local;
    cJSON *root = NULL;
    want *w = NULL;
    dt_ckpt_pdesc *pieces = NULL;
    int rc, np = 0;
    if (!info)
        info = &local;
    memset(info, 0, sizeof *info);
    dt_ckpt_state_init(&info->state);
    if ((rc = read_state(path, &info->state, &root, &info->version, err)))
        goto out;
    if ((rc = read_table(root, &info->tensors, &info->num_tensors, err)) ||
        (rc = read_files(root, &info->files, &info->num_files, err)))
        goto out;
    if (info->version == DT_CKPT_VERSION_SHARDED) {
        if ((rc = dt_ckpt__read_pieces(root, info->tensors, info->num_tensors, info->files,
                                       info->num_files, &pieces, &np, err)) ||
            (rc = dt_ckpt__check_cover(info->tensors, info->num_tensors, pieces, np, err)))
            goto out;
        info->num_pieces = np;
    }
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
    w = calloc((size_t)(DT_MAX(info->num_tensors, np) + 1), sizeof *w);
    if (!w) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (info->version == DT_CKPT_VERSION_SHARDED) { /* every file, then every piece */
        if (!(rc = verify_shards(path, info->files, info->num_files, pieces, np, w, err)))
            rc = dt_ckpt__stream_pieces(path, info->tensors, info->files, pieces, np,
                                        DT_CKPT_IO_BUFFER_DEFAULT, NULL, NULL, NULL, err);
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
    free(pieces);
    if (info == &local)
        dt_ckpt_info_free(&local);
    return rc;
}

/* ================================================================================ export === */

/* The export's destination: one tensor's buffer, for the tensor being written. */
typedef struct export_dst {
    int tensor;
    float *buf;
} export_dst;

static float *export_dst_of(void *ctx, int t)
{
    export_dst *d = ctx;
    return t == d->tensor ? d->buf : NULL;
}

/* The pieces of checkpoint path: a sharded one's list, or for version 1 every tensor whole at
 * its place in its file (from the headers). */
static int export_pieces(const char *path, const cJSON *root, const dt_ckpt_info *in,
                         dt_ckpt_pdesc **out, int *np, dt_err *err)
{
    if (in->version == DT_CKPT_VERSION_SHARDED)
        return dt_ckpt__read_pieces(root, in->tensors, in->num_tensors, in->files,
                                    in->num_files, out, np, err);
    dt_ckpt_pdesc *p = calloc((size_t)(in->num_tensors ? in->num_tensors : 1), sizeof *p);
    if (!p)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int rc = 0;
    for (int fi = 0; fi < in->num_files && !rc; fi++) {
        char fp[PATH_MAX + 128];
        dt_st_file *f = NULL;
        snprintf(fp, sizeof fp, "%s/%s", path, in->files[fi].name);
        if ((rc = dt_st_open(fp, false, &f, err)))
            break;
        for (int t = 0; t < in->num_tensors; t++) {
            const dt_st_tensor *st = dt_st_find(f, in->tensors[t].name);
            size_t l = strlen(in->tensors[t].file);
            if (!st || strncmp(in->files[fi].name, in->tensors[t].file, l) ||
                strcmp(in->files[fi].name + l, ".safetensors"))
                continue;
            p[t] = (dt_ckpt_pdesc){.tensor = t, .file = fi, .offset = f->data_offset + st->begin,
                                   .start = 0, .n = (size_t)((st->end - st->begin) / 4),
                                   .ndim = in->tensors[t].ndim, .unhashed = true};
            dt_strlcpy(p[t].key, in->tensors[t].name, sizeof p[t].key);
        }
        dt_st_free(f);
    }
    if (rc) {
        free(p);
        return rc;
    }
    *out = p;
    *np = in->num_tensors;
    return 0;
}

int dt_ckpt_export(const char *path, const char *out, size_t io, uint64_t *bytes, dt_err *err)
{
    dt_ckpt_info in;
    cJSON *root = NULL;
    dt_ckpt_pdesc *p = NULL;
    dt_st_tensor *ts = NULL;
    int *of = NULL;
    char *header = NULL, tmp[PATH_MAX + 8] = "";
    float *buf = NULL;
    size_t hl = 0;
    uint64_t dl = 0;
    int np = 0, nt = 0, fd = -1, rc;
    dt_ckpt_state st;
    if (!io)
        io = DT_CKPT_IO_BUFFER_DEFAULT;
    /* everything verified first: files, headers, every piece */
    if ((rc = dt_ckpt_inspect(path, true, &in, err)))
        goto out;
    if ((rc = read_state(path, &st, &root, NULL, err)))
        goto out;
    dt_ckpt_state_clear(&st);
    if ((rc = export_pieces(path, root, &in, &p, &np, err)))
        goto out;
    ts = calloc((size_t)(in.num_tensors ? in.num_tensors : 1), sizeof *ts);
    of = calloc((size_t)(in.num_tensors ? in.num_tensors : 1), sizeof *of);
    if (!ts || !of) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    size_t most = 1;
    for (int t = 0; t < in.num_tensors; t++) {
        const dt_ckpt_tensor_desc *d = &in.tensors[t];
        if (strcmp(d->file, "model"))
            continue; /* optimiser state: not the model's */
        dt_st_tensor *x = &ts[nt];
        x->name = d->name;
        x->dtype = DT_ST_F32;
        x->ndim = d->ndim;
        memcpy(x->shape, d->shape, sizeof(int64_t) * (size_t)d->ndim);
        x->data = (const void *)(intptr_t)(t + 1); /* which tensor, through the sort */
        most = DT_MAX(most, (size_t)dt_st_numel(x));
        nt++;
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, in.state.step);
    dt_st_kv meta[] = {{"format", "pt"}, {"producer", "dtrain " DT_VERSION}, {"step", step}};
    if ((rc = dt_st_layout(ts, nt, meta, (int)DT_ARRAY_LEN(meta), &header, &hl, &dl, err)))
        goto out;
    if (!(buf = malloc(most * sizeof(float)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory for a tensor of %zu elements", most);
        goto out;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = dt_err_errno(err, errno, "cannot create %s", tmp);
        goto out;
    }
    if ((rc = dt_ckpt__write_all(fd, header, hl))) {
        rc = dt_err_errno(err, -rc, "writing %s", tmp);
        goto out;
    }
    for (int i = 0; i < nt && !rc; i++) { /* in file order: one tensor in memory at a time */
        int t = (int)(intptr_t)ts[i].data - 1;
        size_t n = (size_t)dt_st_numel(&ts[i]);
        export_dst d = {t, buf};
        int k = 0;
        for (int j = 0; j < np; j++) /* its pieces, to the front */
            if (p[j].tensor == t) {
                dt_ckpt_pdesc x = p[k];
                p[k++] = p[j];
                p[j] = x;
            }
        if ((rc = dt_ckpt__stream_pieces(path, in.tensors, in.files, p, k, io, NULL,
                                         export_dst_of, &d, err)))
            break;
        if ((rc = dt_ckpt__write_all(fd, buf, n * sizeof(float))))
            rc = dt_err_errno(err, -rc, "writing %s", tmp);
    }
    if (!rc && fsync(fd) != 0)
        rc = dt_err_errno(err, errno, "fsync of %s failed", tmp);
    if (close(fd) != 0 && !rc)
        rc = dt_err_errno(err, errno, "closing %s failed", tmp);
    fd = -1;
    if (!rc && rename(tmp, out) != 0)
        rc = dt_err_errno(err, errno, "cannot rename %s to %s", tmp, out);
    if (!rc && bytes)
        *bytes = hl + dl;
out:
    if (fd >= 0)
        close(fd);
    if (rc && tmp[0])
        unlink(tmp);
    dt_ckpt_info_free(&in);
    cJSON_Delete(root);
    free(p);
    free(ts);
    free(of);
    free(header);
    free(buf);
    return rc;
}
