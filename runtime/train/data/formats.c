/* formats.c - the file formats (see formats.h): mappings, listings, token files (text, llm.c
 * shards), pixel files (CIFAR-10, MNIST). */
#include "runtime/train/data/formats.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CIFAR_RECORD 3073
#define MNIST_IMAGES_MAGIC 2051
#define MNIST_LABELS_MAGIC 2049

/* ---- files and listing --------------------------------------------------------------------- */

int dt_formats_map(dt_mapped *m, const char *path, dt_err *err)
{
    memset(m, 0, sizeof *m);
    dt_strlcpy(m->path, path, sizeof m->path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot open data file %s", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dt_err_errno(err, e, "cannot stat data file %s", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dt_err_set(err, -EINVAL, "data file %s is not a regular file", path);
    }
    m->len = (size_t)st.st_size;
    if (m->len > 0) {
        void *p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return dt_err_errno(err, e, "cannot map data file %s", path);
        }
        m->p = p;
    }
    close(fd);
    return 0;
}

void dt_formats_unmap(dt_mapped *m)
{
    if (m->p)
        munmap((void *)m->p, m->len);
    m->p = NULL;
    m->len = 0;
}

int dt_formats_list_add(dt_pathlist *l, const char *path, dt_err *err)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **nv = realloc(l->v, sizeof(char *) * (size_t)cap);
        if (!nv)
            return dt_err_set(err, -ENOMEM, "out of memory listing data files");
        l->v = nv;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(path)))
        return dt_err_set(err, -ENOMEM, "out of memory listing data files");
    l->n++;
    return 0;
}

void dt_formats_list_free(dt_pathlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

const char *dt_formats_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

bool dt_formats_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool dt_formats_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Regular files of a directory (sorted, hidden files skipped). */
int dt_formats_list_dir(const char *dir, dt_pathlist *out, dt_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return dt_err_errno(err, errno, "cannot open data directory %s", dir);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[DT_PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (!dt_formats_is_file(p))
            continue;
        if ((rc = dt_formats_list_add(out, p, err)))
            break;
    }
    closedir(d);
    if (!rc && out->n > 1)
        qsort(out->v, (size_t)out->n, sizeof(char *), cmp_str);
    return rc;
}

/* A file, or the regular files a glob matches (sorted). A directory is the caller's case. */
int dt_formats_list_glob(const char *pattern, dt_pathlist *out, dt_err *err)
{
    if (!strpbrk(pattern, "*?[")) {
        if (!dt_formats_is_file(pattern)) {
            struct stat st;
            if (stat(pattern, &st) != 0)
                return dt_err_errno(err, errno, "cannot open data file %s", pattern);
            return dt_err_set(err, -EINVAL, "data file %s is not a regular file", pattern);
        }
        return dt_formats_list_add(out, pattern, err);
    }
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH)
        return dt_err_set(err, -ENOENT, "no data file matches %s", pattern);
    if (r != 0)
        return dt_err_set(err, -EIO, "cannot expand the data glob %s", pattern);
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++)
        if (dt_formats_is_file(g.gl_pathv[i]))
            rc = dt_formats_list_add(out, g.gl_pathv[i], err);
    globfree(&g);
    if (!rc && out->n == 0)
        rc = dt_err_set(err, -ENOENT, "no regular data file matches %s", pattern);
    return rc;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* ---- token files: text (bytes) and llm.c shards ------------------------------------------- */

uint32_t dt_formats_tok_at(const dt_tok_file *f, int64_t i)
{
    const uint8_t *p = f->tokens + (size_t)i * (size_t)f->width;
    switch (f->width) {
    case 1:
        return p[0];
    case 2:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default:
        return (uint32_t)le32(p);
    }
}

int dt_formats_open_text(dt_tok_file *f, const char *path, dt_err *err)
{
    int rc = dt_formats_map(&f->m, path, err);
    if (rc)
        return rc;
    f->tokens = f->m.p;
    f->width = 1;
    f->ntok = (int64_t)f->m.len;
    return 0;
}

int dt_formats_open_shard(dt_tok_file *f, const char *path, dt_err *err)
{
    int rc = dt_formats_map(&f->m, path, err);
    if (rc)
        return rc;
    const dt_mapped *m = &f->m;
    int32_t magic = m->len >= 4 ? le32(m->p) : 0;
    if (magic != DT_LLMC_MAGIC) {
        rc = dt_err_set(err, -EINVAL,
                        "%s is not an llm.c token shard: magic %d, expected %d (data.type = tokens "
                        "reads llm.c .bin shards; for plain text use data.type = text)",
                        path, magic, DT_LLMC_MAGIC);
        goto fail;
    }
    if (m->len < DT_LLMC_HEADER_BYTES) {
        rc = dt_err_set(err, -EINVAL,
                        "token shard %s is truncated: %zu bytes, shorter than the 1024-byte llm.c "
                        "header",
                        path, m->len);
        goto fail;
    }
    int32_t version = le32(m->p + 4);
    int64_t ntok = le32(m->p + 8);
    if (version != 1 && version != 2) {
        rc = dt_err_set(err, -EINVAL,
                        "token shard %s has version %d; dtrain reads versions 1 (uint16 tokens) "
                        "and 2 (uint32 tokens)",
                        path, version);
        goto fail;
    }
    f->width = version == 1 ? 2 : 4;
    if (ntok < 0 || (size_t)ntok * (size_t)f->width + DT_LLMC_HEADER_BYTES != m->len) {
        size_t have = (m->len - DT_LLMC_HEADER_BYTES) / (size_t)f->width;
        rc = dt_err_set(err, -EINVAL,
                        "token shard %s is %s: its header says %lld tokens, the file holds %zu "
                        "(%zu bytes)",
                        path, (size_t)ntok > have ? "truncated" : "corrupt", (long long)ntok, have,
                        m->len);
        goto fail;
    }
    f->tokens = m->p + DT_LLMC_HEADER_BYTES;
    f->ntok = ntok;
    return 0;
fail:
    dt_formats_unmap(&f->m);
    return rc;
}

/* Fails when a token of f is >= vocab (scans the whole file). */
int dt_formats_scan_vocab(const dt_tok_file *f, int vocab, dt_err *err)
{
    if (f->width == 1 && vocab >= 256)
        return 0;
    for (int64_t i = 0; i < f->ntok; i++) {
        uint32_t t = dt_formats_tok_at(f, i);
        if (t >= (uint32_t)vocab)
            return dt_err_set(err, -EINVAL,
                              "%s: token %lld is %u, outside the vocabulary of %d (set "
                              "data.vocab_size to the tokenizer's vocabulary)",
                              f->m.path, (long long)i, t, vocab);
    }
    return 0;
}

/* ---- pixel files: CIFAR-10 and MNIST ----------------------------------------------------- */

int dt_formats_open_cifar(dt_pix_file *f, const char *path, dt_err *err)
{
    int rc = dt_formats_map(&f->img, path, err);
    if (rc)
        return rc;
    if (f->img.len == 0 || f->img.len % CIFAR_RECORD) {
        rc = dt_err_set(err, -EINVAL,
                        "CIFAR-10 batch %s is truncated or not a CIFAR-10 binary batch: %zu bytes "
                        "is not a whole number of 3073-byte records (1 label + 3x32x32 pixels)",
                        path, f->img.len);
        dt_formats_unmap(&f->img);
        return rc;
    }
    f->n = (int64_t)(f->img.len / CIFAR_RECORD);
    f->lab0 = f->img.p;
    f->pix0 = f->img.p + 1;
    f->stride = f->lab_stride = CIFAR_RECORD;
    return 0;
}

/* Opens an MNIST images file and its labels file; *rows, *cols get the image size. */
int dt_formats_open_mnist(dt_pix_file *f, const char *img_path, const char *lab_path, int *rows,
                          int *cols, dt_err *err)
{
    int rc = dt_formats_map(&f->img, img_path, err);
    if (rc)
        return rc;
    if ((rc = dt_formats_map(&f->lab, lab_path, err)))
        goto fail;
    const dt_mapped *im = &f->img, *lm = &f->lab;
    if (im->len < 16 || be32(im->p) != MNIST_IMAGES_MAGIC) {
        rc = dt_err_set(err, -EINVAL,
                        "%s is not an MNIST images file: magic %u, expected %d (IDX, unsigned "
                        "bytes, 3 dimensions; uncompress .gz files first)",
                        img_path, im->len >= 4 ? be32(im->p) : 0, MNIST_IMAGES_MAGIC);
        goto fail;
    }
    if (lm->len < 8 || be32(lm->p) != MNIST_LABELS_MAGIC) {
        rc = dt_err_set(err, -EINVAL,
                        "%s is not an MNIST labels file: magic %u, expected %d (uncompress .gz "
                        "files first)",
                        lab_path, lm->len >= 4 ? be32(lm->p) : 0, MNIST_LABELS_MAGIC);
        goto fail;
    }
    uint32_t n = be32(im->p + 4), r = be32(im->p + 8), c = be32(im->p + 12);
    uint32_t nl = be32(lm->p + 4);
    if (r == 0 || c == 0 || r > 4096 || c > 4096) {
        rc = dt_err_set(err, -EINVAL, "MNIST images file %s: bad image size %ux%u", img_path, r, c);
        goto fail;
    }
    if (16 + (size_t)n * r * c != im->len) {
        rc = dt_err_set(err, -EINVAL,
                        "MNIST images file %s is %s: its header says %u images of %ux%u (%zu "
                        "bytes), the file has %zu bytes",
                        img_path, 16 + (size_t)n * r * c > im->len ? "truncated" : "corrupt", n, r,
                        c, 16 + (size_t)n * r * c, im->len);
        goto fail;
    }
    if (8 + (size_t)nl != lm->len) {
        rc = dt_err_set(err, -EINVAL,
                        "MNIST labels file %s is %s: its header says %u labels, the file has %zu",
                        lab_path, 8 + (size_t)nl > lm->len ? "truncated" : "corrupt", nl,
                        lm->len - 8);
        goto fail;
    }
    if (nl != n) {
        rc = dt_err_set(err, -EINVAL, "MNIST files do not match: %s has %u images, %s has %u labels",
                        img_path, n, lab_path, nl);
        goto fail;
    }
    f->n = n;
    f->pix0 = im->p + 16;
    f->lab0 = lm->p + 8;
    f->stride = (size_t)r * c;
    f->lab_stride = 1;
    *rows = (int)r;
    *cols = (int)c;
    return 0;
fail:
    dt_formats_unmap(&f->img);
    dt_formats_unmap(&f->lab);
    return rc;
}

/* The labels file of an MNIST images file: "...-images-idx3-ubyte" -> "...-labels-idx1-ubyte"
 * (also the "images.idx3" spelling). */
int dt_formats_mnist_labels_path(const char *img, char *out, size_t cap, dt_err *err)
{
    static const char *const pairs[][2] = {{"images-idx3", "labels-idx1"},
                                           {"images.idx3", "labels.idx1"}};
    const char *b = dt_formats_base_name(img);
    for (size_t i = 0; i < DT_ARRAY_LEN(pairs); i++) {
        const char *at = strstr(b, pairs[i][0]);
        if (!at)
            continue;
        size_t pre = (size_t)(at - img);
        snprintf(out, cap, "%.*s%s%s", (int)pre, img, pairs[i][1], at + strlen(pairs[i][0]));
        return 0;
    }
    return dt_err_set(err, -EINVAL,
                      "%s: cannot tell the MNIST labels file from this name (expected "
                      "...-images-idx3-ubyte next to ...-labels-idx1-ubyte), or give data.path as "
                      "the directory that holds both",
                      img);
}
