/* ckpt_shard.c - pieces of tensors in a sharded checkpoint (format version 2, ckpt.h): where a
 * piece's elements lie in its whole tensor, the pieces state.json lists, their cover of every
 * tensor, and streaming them from the shard files through a bounded buffer.
 *
 * A piece is elements [start, start + n) of the tensor as its owner held it: the whole tensor,
 * or a tensor-parallel slice of it (model.h's rule: along tp_dim, tp_parts parts, the owner's
 * chunk of each part, padding past a part's end). Both the owner's order and the whole tensor's
 * are row-major, and a slice keeps the order of its rows, so the piece is a list of runs that
 * increase in both: dt_ckpt__runs walks them row by row (rows of `inner` elements, the
 * dimensions after tp_dim), merging neighbours. No piece is ever assembled whole: a reader
 * streams it through its buffer and copies each run to where its tensor lives.
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
#include <unistd.h>

#include "common/util.h"
#include "runtime/train/ckpt/xxh64.h"

/* ================================================================================= runs === */

size_t dt_ckpt__runs(const dt_ckpt_slice *s, size_t start, size_t n, dt_ckpt_run_fn fn,
                     void *ctx)
{
    if (n == 0)
        return 0;
    if (s->tp_parts <= 0) {
        if (fn)
            fn(ctx, start, 0, n);
        return n;
    }
    const int d = s->tp_dim;
    size_t inner = 1;
    for (int i = d + 1; i < s->ndim; i++)
        inner *= (size_t)s->local[i];
    if (inner == 0)
        return 0;
    const size_t parts = (size_t)s->tp_parts, ldim = (size_t)s->local[d];
    const size_t wdim = (size_t)s->whole[d];
    const size_t chunk = ldim / parts, part = wdim / parts, first = (size_t)s->tp_rank * chunk;
    const size_t end = start + n;
    size_t in = 0, pw = 0, pr = 0, pl = 0;
    for (size_t r = start / inner; r * inner < end; r++) {
        size_t o = r / ldim, w = r % ldim, p = w / chunk, k = w % chunk;
        if (first + k >= part) /* padding: not in the whole tensor */
            continue;
        size_t wrow = o * wdim + p * part + first + k;
        size_t lo = DT_MAX(start, r * inner), hi = DT_MIN(end, (r + 1) * inner);
        size_t wo = wrow * inner + (lo - r * inner), rel = lo - start, len = hi - lo;
        if (pl && pw + pl == wo && pr + pl == rel) {
            pl += len;
        } else {
            if (pl && fn)
                fn(ctx, pw, pr, pl);
            pw = wo, pr = rel, pl = len;
        }
        in += len;
    }
    if (pl && fn)
        fn(ctx, pw, pr, pl);
    return in;
}

/* ============================================================================ the list === */

static int get_size(const cJSON *o, const char *key, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) ||
        v->valuedouble > 9007199254740992.0)
        return -EBADMSG;
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* One entry of "pieces", into *p; the reason in why when it is malformed. */
static int read_piece(const cJSON *it, const dt_ckpt_tensor_desc *t, int nt,
                      const dt_ckpt_file_desc *files, int nf, dt_ckpt_pdesc *p, char *why,
                      size_t cap)
{
    const cJSON *tn = cJSON_GetObjectItemCaseSensitive(it, "tensor");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(it, "file");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(it, "key");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(it, "xxh64");
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "tp");
    uint64_t start, n;
    memset(p, 0, sizeof *p);
    p->tensor = p->file = -1;
    if (!cJSON_IsString(tn) || !cJSON_IsString(fn) || !cJSON_IsString(key) ||
        !dt_strlcpy(p->key, key->valuestring, sizeof p->key) || !cJSON_IsString(h) ||
        dt_ckpt__parse_hex64(h->valuestring, &p->xxh64) || get_size(it, "offset", &p->offset) ||
        get_size(it, "start", &start) || get_size(it, "n", &n) || n == 0) {
        snprintf(why, cap, "malformed");
        return -EBADMSG;
    }
    p->start = (size_t)start, p->n = (size_t)n;
    for (int i = 0; i < nt && p->tensor < 0; i++)
        if (!strcmp(t[i].name, tn->valuestring))
            p->tensor = i;
    for (int i = 0; i < nf && p->file < 0; i++)
        if (!strcmp(files[i].name, fn->valuestring))
            p->file = i;
    if (p->tensor < 0 || p->file < 0) {
        snprintf(why, cap, "%s %s is not in the %s list", p->tensor < 0 ? "tensor" : "file",
                 p->tensor < 0 ? tn->valuestring : fn->valuestring,
                 p->tensor < 0 ? "tensor" : "file");
        return -EBADMSG;
    }
    const dt_ckpt_tensor_desc *td = &t[p->tensor];
    p->ndim = td->ndim;
    if (tp) {
        uint64_t dim, parts, rank;
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(tp, "shape"), *x;
        if (get_size(tp, "dim", &dim) || get_size(tp, "parts", &parts) || parts == 0 ||
            parts > 1024 || get_size(tp, "rank", &rank) || rank > 65536 || !cJSON_IsArray(sh) ||
            cJSON_GetArraySize(sh) != td->ndim || td->ndim > DT_TENSOR_MAX_DIMS) {
            snprintf(why, cap, "its slice (tp) is malformed");
            return -EBADMSG;
        }
        p->tp_dim = (int)dim, p->tp_parts = (int)parts, p->tp_rank = (int)rank;
        int d = 0;
        cJSON_ArrayForEach(x, sh)
        {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e15) {
                snprintf(why, cap, "its slice's shape is malformed");
                return -EBADMSG;
            }
            p->shape[d++] = (int64_t)x->valuedouble;
        }
    }
    dt_ckpt_slice sl = {p->ndim, td->shape, p->tp_dim, p->tp_parts, p->tp_rank, p->shape};
    if (td->ndim > DT_TENSOR_MAX_DIMS || !dt_ckpt__slice_valid(&sl, p->start, p->n)) {
        snprintf(why, cap, "its slice does not fit tensor %s", td->name);
        return -EBADMSG;
    }
    if (p->offset > files[p->file].bytes || p->n * 4 > files[p->file].bytes - p->offset) {
        snprintf(why, cap, "it lies past the end of %s (%" PRIu64 " bytes)",
                 files[p->file].name, files[p->file].bytes);
        return -EBADMSG;
    }
    return 0;
}

int dt_ckpt__read_pieces(const struct cJSON *root, const dt_ckpt_tensor_desc *t, int nt,
                         const dt_ckpt_file_desc *files, int nf, dt_ckpt_pdesc **out, int *n,
                         dt_err *err)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "pieces"), *it;
    *out = NULL;
    *n = 0;
    if (!cJSON_IsArray(arr))
        return dt_err_set(err, -EBADMSG, "state.json lacks the list of pieces");
    int cnt = cJSON_GetArraySize(arr), i = 0;
    dt_ckpt_pdesc *p = calloc((size_t)(cnt ? cnt : 1), sizeof *p);
    if (!p)
        return dt_err_set(err, -ENOMEM, "out of memory");
    cJSON_ArrayForEach(it, arr)
    {
        char why[256];
        if (read_piece(it, t, nt, files, nf, &p[i], why, sizeof why)) {
            free(p);
            return dt_err_set(err, -EBADMSG, "state.json: piece %d: %s", i, why);
        }
        i++;
    }
    *out = p;
    *n = cnt;
    return 0;
}

int dt_ckpt__check_cover(const dt_ckpt_tensor_desc *t, int nt, const dt_ckpt_pdesc *p, int np,
                         dt_err *err)
{
    uint64_t *have = calloc((size_t)(nt ? nt : 1), sizeof *have);
    if (!have)
        return dt_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; i < np; i++) {
        const dt_ckpt_tensor_desc *td = &t[p[i].tensor];
        dt_ckpt_slice sl = {p[i].ndim, td->shape, p[i].tp_dim, p[i].tp_parts, p[i].tp_rank,
                            p[i].shape};
        have[p[i].tensor] += dt_ckpt__runs(&sl, p[i].start, p[i].n, NULL, NULL);
    }
    int rc = 0;
    for (int i = 0; i < nt && !rc; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (uint64_t)t[i].shape[d];
        if (have[i] != numel)
            rc = dt_err_set(err, -EBADMSG, "the pieces of tensor %s hold %" PRIu64 " of its %"
                            PRIu64 " elements (a shard is missing from the list, or listed "
                            "twice)", t[i].name, have[i], numel);
    }
    free(have);
    return rc;
}

/* ============================================================================ streaming === */

typedef struct run {
    size_t whole, rel, len;
} run;

typedef struct runs {
    run *v;
    size_t n, cap;
    bool oom;
} runs;

static void add_run(void *ctx, size_t whole, size_t rel, size_t len)
{
    runs *r = ctx;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        run *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            r->oom = true;
            return;
        }
        r->v = v, r->cap = cap;
    }
    r->v[r->n++] = (run){whole, rel, len};
}

static int cmp_piece_pos(const void *a, const void *b, void *ctx)
{
    const dt_ckpt_pdesc *p = ctx;
    const dt_ckpt_pdesc *x = &p[*(const int *)a], *y = &p[*(const int *)b];
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int dt_ckpt__stream_pieces(const char *dir, const dt_ckpt_tensor_desc *t,
                           const dt_ckpt_file_desc *files, const dt_ckpt_pdesc *p, int np,
                           size_t io, dt_backend *be, dt_ckpt_dst_fn dst, void *ctx, dt_err *err)
{
    int rc = 0, fd = -1, cur = -1;
    io = DT_MAX(io & ~(size_t)3, (size_t)4096);
    unsigned char *buf = malloc(io);
    int *order = malloc((size_t)(np ? np : 1) * sizeof *order);
    runs rs = {0};
    if (!buf || !order) {
        rc = dt_err_set(err, -ENOMEM, "out of memory for the %zu-byte read buffer", io);
        goto out;
    }
    for (int i = 0; i < np; i++)
        order[i] = i;
    qsort_r(order, (size_t)np, sizeof *order, cmp_piece_pos, (void *)p); /* in file order */
    for (int oi = 0; oi < np && !rc; oi++) {
        const dt_ckpt_pdesc *pc = &p[order[oi]];
        const dt_ckpt_file_desc *f = &files[pc->file];
        char path[PATH_MAX];
        if (pc->file != cur) {
            if (fd >= 0)
                dt_ckpt__io->close(fd);
            snprintf(path, sizeof path, "%s/%s", dir, f->name);
            fd = dt_ckpt__io->open(path, O_RDONLY | O_CLOEXEC, 0);
            if (fd < 0) {
                rc = errno == ENOENT ? dt_err_set(err, -ENOENT, "%s is missing", f->name)
                                     : dt_err_errno(err, errno, "cannot open %s", path);
                break;
            }
            cur = pc->file;
        }
        float *base = dst ? dst(ctx, pc->tensor) : NULL;
        rs.n = 0;
        if (base) {
            dt_ckpt_slice sl = {pc->ndim, t[pc->tensor].shape, pc->tp_dim, pc->tp_parts,
                                pc->tp_rank, pc->shape};
            dt_ckpt__runs(&sl, pc->start, pc->n, add_run, &rs);
            if (rs.oom) {
                rc = dt_err_set(err, -ENOMEM, "out of memory");
                break;
            }
        }
        dt_xxh64_state h;
        dt_xxh64_init(&h, 0);
        size_t done = 0, ri = 0; /* elements of the piece read; first run not yet finished */
        while (done < pc->n) {
            size_t m = DT_MIN(pc->n - done, io / 4);
            if ((rc = dt_pread_all(fd, buf, m * 4, pc->offset + done * 4))) {
                rc = rc == -EPIPE ? dt_err_set(err, -EBADMSG, "%s is shorter than its pieces "
                                               "(truncated)", f->name)
                                  : dt_err_errno(err, -rc, "reading %s", f->name);
                break;
            }
            dt_xxh64_update(&h, buf, m * 4);
            /* the runs that overlap elements [done, done + m) of the piece */
            for (size_t k = ri; k < rs.n && rs.v[k].rel < done + m; k++) {
                size_t lo = DT_MAX(rs.v[k].rel, done);
                size_t hi = DT_MIN(rs.v[k].rel + rs.v[k].len, done + m);
                float *to = base + rs.v[k].whole + (lo - rs.v[k].rel);
                const unsigned char *from = buf + (lo - done) * 4;
                if (be && !be->host_memory)
                    be->memcpy_h2d(be, to, from, (hi - lo) * 4);
                else
                    memcpy(to, from, (hi - lo) * 4);
                if (rs.v[k].rel + rs.v[k].len <= done + m)
                    ri = k + 1;
            }
            done += m;
        }
        if (!rc && !pc->unhashed && dt_xxh64_digest(&h) != pc->xxh64)
            rc = dt_err_set(err, -EBADMSG, "%s: piece %s (bytes %" PRIu64 "..%" PRIu64 ") does "
                            "not match its checksum: the file changed after it was written "
                            "(corrupted)", f->name, pc->key, pc->offset,
                            pc->offset + (uint64_t)pc->n * 4);
    }
out:
    if (fd >= 0)
        dt_ckpt__io->close(fd);
    free(rs.v);
    free(order);
    free(buf);
    return rc;
}
