/* data.c - the readers, the split, batches and the distributed sampler; see data.h.
 *
 * Layout: a *source* is what one format reads (a set of mapped files, or a synthetic teacher)
 * and exposes samples 0..n-1 of; a *dataset* is a window [first, first+n) of a source. Train and
 * validation are two windows of one source (val_fraction) or of two sources (val_path, or the
 * held-out files of a directory). Files are memory-mapped read-only: a 10 GB token set costs
 * page cache, not heap, and every rank of a node shares those pages.
 *
 * Sections: files and listing - token files (text, llm.c shards) - pixel files (CIFAR-10,
 * MNIST) - synthetic teachers - sources and datasets - batches - the sampler - dt_data_open.
 */
#include "runtime/train/data/data.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024
#define CIFAR_RECORD 3073
#define MNIST_IMAGES_MAGIC 2051
#define MNIST_LABELS_MAGIC 2049
/* Token files up to this many tokens are scanned for out-of-vocabulary ids when opened; larger
 * ones are checked sample by sample as batches are read (a full scan of a 10B-token set would
 * delay every start by minutes). */
#define VOCAB_SCAN_MAX (INT64_C(1) << 28)

/* ---- files and listing --------------------------------------------------------------------- */

/* A read-only mapping of a whole file. */
typedef struct mapped {
    char path[DT_PATH_MAX];
    const uint8_t *p;  /* NULL when the file is empty */
    size_t len;
} mapped;

static int map_file(mapped *m, const char *path, dt_err *err)
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

static void unmap_file(mapped *m)
{
    if (m->p)
        munmap((void *)m->p, m->len);
    m->p = NULL;
    m->len = 0;
}

/* A list of paths (malloc'd strings). */
typedef struct pathlist {
    char **v;
    int n, cap;
} pathlist;

static int pathlist_add(pathlist *l, const char *path, dt_err *err)
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

static void pathlist_free(pathlist *l)
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

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Regular files of a directory (sorted, hidden files skipped). */
static int list_dir(const char *dir, pathlist *out, dt_err *err)
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
        if (!is_file(p))
            continue;
        if ((rc = pathlist_add(out, p, err)))
            break;
    }
    closedir(d);
    if (!rc && out->n > 1)
        qsort(out->v, (size_t)out->n, sizeof(char *), cmp_str);
    return rc;
}

/* A file, or the regular files a glob matches (sorted). A directory is the caller's case. */
static int list_glob(const char *pattern, pathlist *out, dt_err *err)
{
    if (!strpbrk(pattern, "*?[")) {
        if (!is_file(pattern)) {
            struct stat st;
            if (stat(pattern, &st) != 0)
                return dt_err_errno(err, errno, "cannot open data file %s", pattern);
            return dt_err_set(err, -EINVAL, "data file %s is not a regular file", pattern);
        }
        return pathlist_add(out, pattern, err);
    }
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH)
        return dt_err_set(err, -ENOENT, "no data file matches %s", pattern);
    if (r != 0)
        return dt_err_set(err, -EIO, "cannot expand the data glob %s", pattern);
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++)
        if (is_file(g.gl_pathv[i]))
            rc = pathlist_add(out, g.gl_pathv[i], err);
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

typedef struct tok_file {
    mapped m;
    const uint8_t *tokens; /* first token */
    int width;             /* bytes per token: 1 (text), 2 (llm.c v1), 4 (llm.c v2) */
    int64_t ntok;
    int64_t nsamples;      /* (ntok - 1) / T */
    int64_t first;         /* samples in the files before this one */
} tok_file;

static inline uint32_t tok_at(const tok_file *f, int64_t i)
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

static int open_text_file(tok_file *f, const char *path, dt_err *err)
{
    int rc = map_file(&f->m, path, err);
    if (rc)
        return rc;
    f->tokens = f->m.p;
    f->width = 1;
    f->ntok = (int64_t)f->m.len;
    return 0;
}

static int open_shard(tok_file *f, const char *path, dt_err *err)
{
    int rc = map_file(&f->m, path, err);
    if (rc)
        return rc;
    const mapped *m = &f->m;
    int32_t magic = m->len >= 4 ? le32(m->p) : 0;
    if (magic != LLMC_MAGIC) {
        rc = dt_err_set(err, -EINVAL,
                        "%s is not an llm.c token shard: magic %d, expected %d (data.type = tokens "
                        "reads llm.c .bin shards; for plain text use data.type = text)",
                        path, magic, LLMC_MAGIC);
        goto fail;
    }
    if (m->len < LLMC_HEADER_BYTES) {
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
    if (ntok < 0 || (size_t)ntok * (size_t)f->width + LLMC_HEADER_BYTES != m->len) {
        size_t have = (m->len - LLMC_HEADER_BYTES) / (size_t)f->width;
        rc = dt_err_set(err, -EINVAL,
                        "token shard %s is %s: its header says %lld tokens, the file holds %zu "
                        "(%zu bytes)",
                        path, (size_t)ntok > have ? "truncated" : "corrupt", (long long)ntok, have,
                        m->len);
        goto fail;
    }
    f->tokens = m->p + LLMC_HEADER_BYTES;
    f->ntok = ntok;
    return 0;
fail:
    unmap_file(&f->m);
    return rc;
}

/* Fails when a token of f is >= vocab (scans the whole file). */
static int scan_vocab(const tok_file *f, int vocab, dt_err *err)
{
    if (f->width == 1 && vocab >= 256)
        return 0;
    for (int64_t i = 0; i < f->ntok; i++) {
        uint32_t t = tok_at(f, i);
        if (t >= (uint32_t)vocab)
            return dt_err_set(err, -EINVAL,
                              "%s: token %lld is %u, outside the vocabulary of %d (set "
                              "data.vocab_size to the tokenizer's vocabulary)",
                              f->m.path, (long long)i, t, vocab);
    }
    return 0;
}

/* ---- pixel files: CIFAR-10 and MNIST ----------------------------------------------------- */

typedef struct pix_file {
    mapped img, lab;      /* lab.p == NULL for CIFAR (labels inside the image records) */
    const uint8_t *pix0;  /* pixels of sample 0 */
    const uint8_t *lab0;  /* label of sample 0 */
    size_t stride;        /* bytes between samples (pixels and labels alike for CIFAR) */
    size_t lab_stride;
    int64_t n;
    int64_t first;        /* samples in the files before this one */
} pix_file;

static int open_cifar(pix_file *f, const char *path, dt_err *err)
{
    int rc = map_file(&f->img, path, err);
    if (rc)
        return rc;
    if (f->img.len == 0 || f->img.len % CIFAR_RECORD) {
        rc = dt_err_set(err, -EINVAL,
                        "CIFAR-10 batch %s is truncated or not a CIFAR-10 binary batch: %zu bytes "
                        "is not a whole number of 3073-byte records (1 label + 3x32x32 pixels)",
                        path, f->img.len);
        unmap_file(&f->img);
        return rc;
    }
    f->n = (int64_t)(f->img.len / CIFAR_RECORD);
    f->lab0 = f->img.p;
    f->pix0 = f->img.p + 1;
    f->stride = f->lab_stride = CIFAR_RECORD;
    return 0;
}

/* Opens an MNIST images file and its labels file; *rows, *cols get the image size. */
static int open_mnist(pix_file *f, const char *img_path, const char *lab_path, int *rows,
                      int *cols, dt_err *err)
{
    int rc = map_file(&f->img, img_path, err);
    if (rc)
        return rc;
    if ((rc = map_file(&f->lab, lab_path, err)))
        goto fail;
    const mapped *im = &f->img, *lm = &f->lab;
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
    unmap_file(&f->img);
    unmap_file(&f->lab);
    return rc;
}

/* The labels file of an MNIST images file: "...-images-idx3-ubyte" -> "...-labels-idx1-ubyte"
 * (also the "images.idx3" spelling). */
static int mnist_labels_path(const char *img, char *out, size_t cap, dt_err *err)
{
    static const char *const pairs[][2] = {{"images-idx3", "labels-idx1"},
                                           {"images.idx3", "labels.idx1"}};
    const char *b = base_name(img);
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

/* ---- synthetic teachers ----------------------------------------------------------------- */

#define SYN_SAMPLE_SALT 0x5a4d504c45535eedull /* stream of the samples */
#define SYN_TEACHER_SALT 0x7eac4e5ull         /* stream of the teacher */
#define SYN_VEC_HIDDEN 32
#define SYN_IMG_GRID 4    /* prototypes are smooth: bilinear from a 4x4 grid */
#define SYN_IMG_SHIFT 4   /* samples are prototypes shifted by up to this many pixels */
#define SYN_IMG_NOISE 2.0f

typedef struct synth {
    uint64_t seed;
    int dim, classes, C, H, W, T, vocab;
    float *w1, *b1, *w2, *bias2; /* vector teacher: (Hd,D), (Hd), (K,Hd), (K) */
    float *proto;                /* image prototypes (K,C,H,W) */
} synth;

static void syn_vec_logits(const synth *s, const float *x, float *logits)
{
    float h[SYN_VEC_HIDDEN];
    for (int j = 0; j < SYN_VEC_HIDDEN; j++) {
        const float *w = s->w1 + (size_t)j * (size_t)s->dim;
        double a = s->b1[j];
        for (int i = 0; i < s->dim; i++)
            a += (double)w[i] * x[i];
        h[j] = tanhf((float)a);
    }
    for (int k = 0; k < s->classes; k++) {
        double a = s->bias2[k];
        for (int j = 0; j < SYN_VEC_HIDDEN; j++)
            a += (double)s->w2[k * SYN_VEC_HIDDEN + j] * h[j];
        logits[k] = (float)a;
    }
}

static int syn_vec_label(const synth *s, const float *x, float *logits)
{
    syn_vec_logits(s, x, logits);
    int best = 0;
    for (int k = 1; k < s->classes; k++)
        if (logits[k] > logits[best])
            best = k;
    return best;
}

/* A random two-layer teacher, its output biases set so that the classes are about equally
 * frequent (an argmax over random projections favours a few classes otherwise). */
static int syn_vec_init(synth *s, dt_err *err)
{
    size_t D = (size_t)s->dim, K = (size_t)s->classes;
    s->w1 = malloc(sizeof(float) * SYN_VEC_HIDDEN * D);
    s->b1 = malloc(sizeof(float) * SYN_VEC_HIDDEN);
    s->w2 = malloc(sizeof(float) * K * SYN_VEC_HIDDEN);
    s->bias2 = calloc(K, sizeof(float));
    float *x = malloc(sizeof(float) * D), *lg = malloc(sizeof(float) * K);
    double *mean = calloc(K, sizeof(double));
    int rc = 0;
    if (!s->w1 || !s->b1 || !s->w2 || !s->bias2 || !x || !lg || !mean) {
        rc = dt_err_set(err, -ENOMEM, "out of memory for the synthetic teacher (%d features)",
                        s->dim);
        goto out;
    }
    dt_rng r;
    dt_rng_seed2(&r, s->seed, SYN_TEACHER_SALT);
    dt_rng_fill_normal(&r, s->w1, SYN_VEC_HIDDEN * D, 0.0f, 1.5f / sqrtf((float)D));
    dt_rng_fill_normal(&r, s->b1, SYN_VEC_HIDDEN, 0.0f, 0.1f);
    dt_rng_fill_normal(&r, s->w2, K * SYN_VEC_HIDDEN, 0.0f, 1.0f);
    enum { PROBE = 2048 };
    for (int i = 0; i < PROBE; i++) {
        dt_rng_fill_normal(&r, x, D, 0.0f, 1.0f);
        syn_vec_logits(s, x, lg);
        for (size_t k = 0; k < K; k++)
            mean[k] += lg[k] / PROBE;
    }
    for (size_t k = 0; k < K; k++)
        s->bias2[k] = (float)-mean[k];
out:
    free(x);
    free(lg);
    free(mean);
    return rc;
}

static int syn_img_init(synth *s, dt_err *err)
{
    size_t plane = (size_t)s->H * (size_t)s->W, per = (size_t)s->C * plane;
    s->proto = malloc(sizeof(float) * per * (size_t)s->classes);
    if (!s->proto)
        return dt_err_set(err, -ENOMEM, "out of memory for the synthetic prototypes");
    dt_rng r;
    dt_rng_seed2(&r, s->seed, SYN_TEACHER_SALT);
    float grid[SYN_IMG_GRID * SYN_IMG_GRID];
    for (int k = 0; k < s->classes; k++)
        for (int c = 0; c < s->C; c++) {
            dt_rng_fill_normal(&r, grid, DT_ARRAY_LEN(grid), 0.0f, 1.0f);
            float *out = s->proto + (size_t)k * per + (size_t)c * plane;
            for (int h = 0; h < s->H; h++)
                for (int w = 0; w < s->W; w++) {
                    /* bilinear, periodic, so that shifted prototypes stay smooth */
                    float gy = (float)h * SYN_IMG_GRID / (float)s->H;
                    float gx = (float)w * SYN_IMG_GRID / (float)s->W;
                    int y0 = (int)gy, x0 = (int)gx;
                    float fy = gy - (float)y0, fx = gx - (float)x0;
                    int y1 = (y0 + 1) % SYN_IMG_GRID, x1 = (x0 + 1) % SYN_IMG_GRID;
                    out[h * s->W + w] = (1 - fy) * ((1 - fx) * grid[y0 * SYN_IMG_GRID + x0] +
                                                    fx * grid[y0 * SYN_IMG_GRID + x1]) +
                                        fy * ((1 - fx) * grid[y1 * SYN_IMG_GRID + x0] +
                                              fx * grid[y1 * SYN_IMG_GRID + x1]);
                }
        }
    return 0;
}

static void syn_sample_rng(const synth *s, int64_t idx, dt_rng *r)
{
    dt_rng_seed2(r, s->seed ^ SYN_SAMPLE_SALT, (uint64_t)idx);
}

/* Synthetic token sequences: t0, t1 uniform; then each next token is one of four successors of
 * the two before it (a hash), with probabilities 0.6, 0.2, 0.1, 0.1. The best possible loss is
 * the entropy of that choice, about 1.09 nats, against ln(V) for a model that learnt nothing. */
static uint32_t syn_successor(const synth *s, uint32_t a, uint32_t b, int j)
{
    uint64_t x = (((uint64_t)a * (uint64_t)s->vocab + b) << 2 | (uint64_t)j) ^ s->seed;
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)(x % (uint64_t)s->vocab);
}

static void syn_tokens(const synth *s, int64_t idx, int32_t *seq /* (T+1) */)
{
    dt_rng r;
    syn_sample_rng(s, idx, &r);
    seq[0] = (int32_t)dt_rng_below(&r, (uint64_t)s->vocab);
    seq[1] = (int32_t)dt_rng_below(&r, (uint64_t)s->vocab);
    for (int t = 2; t <= s->T; t++) {
        float u = dt_rng_uniform(&r);
        int j = u < 0.6f ? 0 : u < 0.8f ? 1 : u < 0.9f ? 2 : 3;
        seq[t] = (int32_t)syn_successor(s, (uint32_t)seq[t - 2], (uint32_t)seq[t - 1], j);
    }
}

/* ---- sources and datasets ----------------------------------------------------------------- */

typedef enum src_kind { SRC_TOKENS, SRC_PIXELS, SRC_SYN_TOKENS, SRC_SYN_VEC, SRC_SYN_IMG } src_kind;

typedef struct source {
    src_kind kind;
    int64_t n;          /* samples */
    /* tokens */
    tok_file *tf;
    int ntf;
    int T, vocab;
    bool check_vocab;   /* check tokens as batches are read (not scanned at open) */
    /* pixels: normalised per channel as (p/255 - mean[c]) / std[c] */
    pix_file *pf;
    int npf;
    int C, H, W, classes;
    float mean[4], std[4];
    /* synthetic */
    synth syn;
    char what[DT_PATH_MAX + 64]; /* "GPL-3 (35068 bytes)", for desc */
} source;

struct dt_dataset {
    source *src;      /* borrowed from dt_data's impl */
    int64_t first, n; /* window of the source */
    const char *split;
};

typedef struct data_impl {
    source *src[2];   /* [0] training, [1] validation when from other files, else NULL */
} data_impl;

static void source_free(source *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->ntf; i++)
        unmap_file(&s->tf[i].m);
    free(s->tf);
    for (int i = 0; i < s->npf; i++) {
        unmap_file(&s->pf[i].img);
        unmap_file(&s->pf[i].lab);
    }
    free(s->pf);
    free(s->syn.w1);
    free(s->syn.b1);
    free(s->syn.w2);
    free(s->syn.bias2);
    free(s->syn.proto);
    free(s);
}

/* Token files of one split. `text` selects raw bytes; else llm.c shards. */
static int source_tokens(source **out, const pathlist *files, bool text, int T, int vocab,
                         dt_err *err)
{
    source *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->tf = calloc((size_t)files->n, sizeof(tok_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_TOKENS;
    s->T = T;
    s->vocab = vocab;
    int64_t total = 0;
    for (int i = 0; i < files->n; i++) {
        tok_file *f = &s->tf[i];
        rc = text ? open_text_file(f, files->v[i], err) : open_shard(f, files->v[i], err);
        if (rc)
            goto fail;
        s->ntf++;
        if (f->ntok < T + 1) {
            rc = dt_err_set(err, -EINVAL,
                            "%s holds %lld tokens, too few for one sample of data.seq_len = %d "
                            "(needs %d)",
                            f->m.path, (long long)f->ntok, T, T + 1);
            goto fail;
        }
        f->nsamples = (f->ntok - 1) / T;
        f->first = s->n;
        s->n += f->nsamples;
        total += f->ntok;
    }
    if (total <= VOCAB_SCAN_MAX) {
        for (int i = 0; i < s->ntf; i++)
            if ((rc = scan_vocab(&s->tf[i], vocab, err)))
                goto fail;
    } else {
        s->check_vocab = true;
    }
    if (files->n == 1)
        snprintf(s->what, sizeof s->what, "%s (%lld tokens)", files->v[0], (long long)total);
    else
        snprintf(s->what, sizeof s->what, "%d files like %s (%lld tokens)", files->n,
                 files->v[0], (long long)total);
    *out = s;
    return 0;
fail:
    source_free(s);
    return rc;
}

static void set_norm(source *s, const float *mean, const float *std)
{
    for (int c = 0; c < s->C && c < 4; c++) {
        s->mean[c] = mean[c];
        s->std[c] = std[c];
    }
}

static int source_cifar(source **out, const pathlist *files, dt_err *err)
{
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    source *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->pf = calloc((size_t)files->n, sizeof(pix_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_PIXELS;
    s->C = 3;
    s->H = s->W = 32;
    s->classes = 10;
    set_norm(s, mean, std);
    for (int i = 0; i < files->n; i++) {
        if ((rc = open_cifar(&s->pf[i], files->v[i], err)))
            goto fail;
        s->npf++;
        s->pf[i].first = s->n;
        s->n += s->pf[i].n;
    }
    if (files->n == 1)
        snprintf(s->what, sizeof s->what, "%s (%lld images)", files->v[0], (long long)s->n);
    else
        snprintf(s->what, sizeof s->what, "%d batches like %s (%lld images)", files->n,
                 files->v[0], (long long)s->n);
    *out = s;
    return 0;
fail:
    source_free(s);
    return rc;
}

static int source_mnist(source **out, const char *img, const char *lab, dt_err *err)
{
    static const float mean[1] = {0.1307f}, std[1] = {0.3081f};
    source *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->pf = calloc(1, sizeof(pix_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_PIXELS;
    s->C = 1;
    s->classes = 10;
    set_norm(s, mean, std);
    if ((rc = open_mnist(&s->pf[0], img, lab, &s->H, &s->W, err)))
        goto fail;
    s->npf = 1;
    s->n = s->pf[0].n;
    snprintf(s->what, sizeof s->what, "%s (%lld images)", img, (long long)s->n);
    *out = s;
    return 0;
fail:
    source_free(s);
    return rc;
}

/* The pixel file holding sample i (binary search over the files' first samples). */
static const pix_file *pix_find(const source *s, int64_t i)
{
    int lo = 0, hi = s->npf - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->pf[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &s->pf[lo];
}

static const tok_file *tok_find(const source *s, int64_t i)
{
    int lo = 0, hi = s->ntf - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (s->tf[mid].first <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &s->tf[lo];
}

/* Sample i of a token source: seq (T+1). */
static int read_tokens(const source *s, int64_t i, int32_t *seq, dt_err *err)
{
    if (s->kind == SRC_SYN_TOKENS) {
        syn_tokens(&s->syn, i, seq);
        return 0;
    }
    const tok_file *f = tok_find(s, i);
    int64_t start = (i - f->first) * s->T;
    for (int t = 0; t <= s->T; t++) {
        uint32_t v = tok_at(f, start + t);
        if (s->check_vocab && v >= (uint32_t)s->vocab)
            return dt_err_set(err, -EINVAL,
                              "%s: token %lld is %u, outside the vocabulary of %d (set "
                              "data.vocab_size to the tokenizer's vocabulary)",
                              f->m.path, (long long)(start + t), v, s->vocab);
        seq[t] = (int32_t)v;
    }
    return 0;
}

/* Sample i of a classification source: x (numel) and its label. */
static int read_example(const source *s, int64_t i, float *x, int32_t *label, dt_err *err)
{
    size_t plane = (size_t)s->H * (size_t)s->W;
    if (s->kind == SRC_PIXELS) {
        const pix_file *f = pix_find(s, i);
        int64_t j = i - f->first;
        const uint8_t *p = f->pix0 + (size_t)j * f->stride;
        uint8_t lab = f->lab0[(size_t)j * f->lab_stride];
        if (lab >= s->classes)
            return dt_err_set(err, -EINVAL, "%s: sample %lld has label %u; labels must be < %d",
                              f->img.path, (long long)j, lab, s->classes);
        for (int c = 0; c < s->C; c++) {
            float sc = 1.0f / (255.0f * s->std[c]), off = s->mean[c] / s->std[c];
            for (size_t k = 0; k < plane; k++)
                x[(size_t)c * plane + k] = (float)p[(size_t)c * plane + k] * sc - off;
        }
        *label = lab;
        return 0;
    }
    const synth *y = &s->syn;
    dt_rng r;
    syn_sample_rng(y, i, &r);
    if (s->kind == SRC_SYN_VEC) {
        float logits[64], *lg = logits;
        if (y->classes > 64 && !(lg = malloc(sizeof(float) * (size_t)y->classes)))
            return dt_err_set(err, -ENOMEM, "out of memory generating a synthetic sample");
        dt_rng_fill_normal(&r, x, (size_t)y->dim, 0.0f, 1.0f);
        *label = syn_vec_label(y, x, lg);
        if (lg != logits)
            free(lg);
        return 0;
    }
    /* image: a prototype, shifted circularly, plus noise */
    int k = (int)dt_rng_below(&r, (uint64_t)y->classes);
    int dy = (int)dt_rng_below(&r, 2 * SYN_IMG_SHIFT + 1) - SYN_IMG_SHIFT;
    int dx = (int)dt_rng_below(&r, 2 * SYN_IMG_SHIFT + 1) - SYN_IMG_SHIFT;
    const float *proto = y->proto + (size_t)k * (size_t)y->C * plane;
    for (int c = 0; c < y->C; c++)
        for (int h = 0; h < y->H; h++)
            for (int w = 0; w < y->W; w++) {
                int sh = ((h + dy) % y->H + y->H) % y->H, sw = ((w + dx) % y->W + y->W) % y->W;
                x[(size_t)c * plane + (size_t)h * y->W + w] =
                    proto[(size_t)c * plane + (size_t)sh * y->W + sw] +
                    SYN_IMG_NOISE * dt_rng_normal(&r);
            }
    *label = k;
    return 0;
}

int64_t dt_dataset_size(const dt_dataset *ds) { return ds ? ds->n : 0; }

const char *dt_dataset_split(const dt_dataset *ds) { return ds ? ds->split : ""; }

/* ---- batches ---------------------------------------------------------------------------- */

int dt_batch_buf_init(dt_batch_buf *b, const dt_sample_shape *shape, int capacity, dt_err *err)
{
    memset(b, 0, sizeof *b);
    b->shape = *shape;
    b->capacity = capacity;
    size_t cap = (size_t)capacity;
    if (shape->kind == DT_SAMPLE_TOKENS) {
        size_t T = (size_t)shape->seq_len;
        b->tokens = malloc(sizeof(int32_t) * (cap * T + 1)); /* +1: the last sample's target */
        b->targets = malloc(sizeof(int32_t) * cap * T);
    } else {
        b->x = malloc(sizeof(float) * cap * (size_t)shape->input_dim);
        b->targets = malloc(sizeof(int32_t) * cap);
    }
    if (!b->targets || (!b->tokens && !b->x)) {
        dt_batch_buf_free(b);
        return dt_err_set(err, -ENOMEM, "out of memory for a batch of %d samples", capacity);
    }
    return 0;
}

void dt_batch_buf_free(dt_batch_buf *b)
{
    if (!b)
        return;
    free(b->tokens);
    free(b->targets);
    free(b->x);
    memset(b, 0, sizeof *b);
}

int dt_dataset_fill(const dt_dataset *ds, const int64_t *indices, int n, dt_batch_buf *b,
                    dt_err *err)
{
    if (n > b->capacity)
        return dt_err_set(err, -EINVAL, "batch of %d samples exceeds the buffer (%d)", n,
                          b->capacity);
    const source *s = ds->src;
    for (int i = 0; i < n; i++) {
        int64_t j = indices[i];
        if (j < 0 || j >= ds->n)
            return dt_err_set(err, -ERANGE, "%s sample %lld is out of range (%lld samples)",
                              ds->split, (long long)j, (long long)ds->n);
        j += ds->first;
        int rc;
        if (b->shape.kind == DT_SAMPLE_TOKENS) {
            int T = b->shape.seq_len;
            /* the sample's T+1 tokens go to the row, whose last slot spills into the next row
             * (or the scratch row at the end); inputs are the first T */
            int32_t *row = b->tokens + (size_t)i * (size_t)T;
            if ((rc = read_tokens(s, j, row, err)))
                return rc;
            memcpy(b->targets + (size_t)i * (size_t)T, row + 1, sizeof(int32_t) * (size_t)T);
        } else {
            int32_t label;
            if ((rc = read_example(s, j, b->x + (size_t)i * (size_t)b->shape.input_dim, &label,
                                   err)))
                return rc;
            b->targets[i] = label;
        }
    }
    b->batch.B = n;
    b->batch.T = b->shape.kind == DT_SAMPLE_TOKENS ? b->shape.seq_len : 0;
    b->batch.tokens = b->tokens;
    b->batch.targets = b->targets;
    b->batch.x = b->x;
    return 0;
}

/* ---- the sampler ---------------------------------------------------------------------------- */

int dt_sampler_init(dt_sampler *s, int64_t n, int rank, int world_size, int batch_size,
                    uint64_t seed, bool shuffle, bool drop_last, dt_err *err)
{
    memset(s, 0, sizeof *s);
    if (n <= 0 || world_size < 1 || rank < 0 || rank >= world_size || batch_size < 1)
        return dt_err_set(err, -EINVAL, "sampler: bad arguments (n=%lld rank=%d world=%d B=%d)",
                          (long long)n, rank, world_size, batch_size);
    int64_t global = (int64_t)world_size * batch_size;
    if (drop_last && n < global)
        return dt_err_set(err, -EINVAL,
                          "the training set has %lld samples, fewer than one step needs (%d rank%s "
                          "x batch_size %d = %lld) with data.drop_last = true; lower "
                          "train.batch_size, or set data.drop_last = false to repeat samples",
                          (long long)n, world_size, world_size == 1 ? "" : "s", batch_size,
                          (long long)global);
    s->n = n;
    s->rank = rank;
    s->world_size = world_size;
    s->batch_size = batch_size;
    s->seed = seed;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->perm_epoch = -1;
    return 0;
}

void dt_sampler_free(dt_sampler *s)
{
    if (!s)
        return;
    free(s->perm);
    s->perm = NULL;
    s->perm_epoch = -1;
}

int64_t dt_sampler_steps_per_epoch(const dt_sampler *s)
{
    int64_t g = s->gb.global > 0 ? s->gb.global : (int64_t)s->world_size * s->batch_size;
    return s->drop_last ? s->n / g : (s->n + g - 1) / g;
}

void dt_sampler_set_state(dt_sampler *s, int64_t epoch, int64_t pos)
{
    s->epoch = epoch < 0 ? 0 : epoch;
    s->pos = pos < 0 ? 0 : pos;
}

/* Starts the next epoch when a step of g positions does not fit the current one (see data.h),
 * and makes the permutation of the (new) epoch. */
static int sampler_begin(dt_sampler *s, int64_t g, dt_err *err)
{
    if (s->drop_last ? s->pos + g > s->n : s->pos >= s->n) {
        s->epoch++;
        s->pos = 0;
    }
    if (s->shuffle && s->perm_epoch != s->epoch) {
        if (!s->perm && !(s->perm = malloc(sizeof(uint64_t) * (size_t)s->n)))
            return dt_err_set(err, -ENOMEM, "out of memory for the order of %lld samples",
                              (long long)s->n);
        dt_rng r;
        dt_rng_seed2(&r, s->seed, (uint64_t)s->epoch);
        dt_rng_permutation(&r, s->perm, (size_t)s->n);
        s->perm_epoch = s->epoch;
    }
    return 0;
}

int dt_sampler_next(dt_sampler *s, int64_t *idx, dt_err *err)
{
    int64_t g = (int64_t)s->world_size * s->batch_size;
    int rc = sampler_begin(s, g, err);
    if (rc)
        return rc;
    for (int j = 0; j < s->batch_size; j++) {
        int64_t p = (s->pos + (int64_t)j * s->world_size + s->rank) % s->n; /* wrap = padding */
        idx[j] = s->shuffle ? (int64_t)s->perm[p] : p;
    }
    s->pos += g;
    return 0;
}

int dt_sampler_set_global(dt_sampler *s, const dt_gbatch *g, dt_err *err)
{
    if (g->global < 1 || g->world != s->world_size || g->cap != s->batch_size)
        return dt_err_set(err, -EINVAL, "sampler: a global batch of %lld over %d ranks of %d "
                                        "does not fit a sampler of %d ranks of %d",
                          (long long)g->global, g->world, g->cap, s->world_size, s->batch_size);
    if (s->drop_last && s->n < g->global)
        return dt_err_set(err, -EINVAL,
                          "the training set has %lld samples, fewer than one step needs "
                          "(train.global_batch = %lld) with data.drop_last = true; lower "
                          "train.global_batch, or set data.drop_last = false to repeat samples",
                          (long long)s->n, (long long)g->global);
    s->gb = *g;
    return 0;
}

int dt_sampler_next_step(dt_sampler *s, int64_t *idx, dt_err *err)
{
    const dt_gbatch *g = &s->gb;
    if (g->global < 1)
        return dt_err_set(err, -EINVAL, "sampler: not in global-batch mode");
    int rc = sampler_begin(s, g->global, err);
    if (rc)
        return rc;
    int64_t k = 0;
    for (int m = 0; m < g->micro_steps; m++) {
        /* micro-step m: positions [base, base + g_m), interleaved over the ranks */
        int64_t base = s->pos + dt_gbatch_micro_offset(g, m);
        int cnt = dt_gbatch_rank_count(g, m, s->rank);
        for (int j = 0; j < cnt; j++) {
            int64_t p = (base + (int64_t)j * s->world_size + s->rank) % s->n; /* wrap = padding */
            idx[k++] = s->shuffle ? (int64_t)s->perm[p] : p;
        }
    }
    s->pos += g->global;
    return 0;
}

/* ---- the global batch ------------------------------------------------------------------------ */

int dt_gbatch_init(dt_gbatch *g, int64_t global, int world, int cap, dt_err *err)
{
    memset(g, 0, sizeof *g);
    if (world < 1 || cap < 1 || global < 1)
        return dt_err_set(err, -EINVAL, "global batch: bad arguments (G=%lld world=%d B=%d)",
                          (long long)global, world, cap);
    if (global < world)
        return dt_err_set(err, -EINVAL,
                          "train.global_batch = %lld is smaller than the %d data-parallel ranks "
                          "of this run: every rank needs at least one sample per step; raise "
                          "train.global_batch to at least %d, or run on at most %lld ranks",
                          (long long)global, world, world, (long long)global);
    int64_t per = (int64_t)world * cap;
    int64_t m = (global + per - 1) / per;
    if (m > 1000000)
        return dt_err_set(err, -EINVAL,
                          "train.global_batch = %lld needs %lld micro-steps of %d ranks x "
                          "batch_size %d: raise train.batch_size",
                          (long long)global, (long long)m, world, cap);
    g->global = global;
    g->world = world;
    g->cap = cap;
    g->micro_steps = (int)m;
    return 0;
}

/* Whether the micro-steps split G evenly (every one of them then has at least W samples: always
 * unless batch_size is 1 and W does not divide G), or are full but the last. */
static bool gbatch_even(const dt_gbatch *g)
{
    return g->global / g->micro_steps >= g->world;
}

int64_t dt_gbatch_micro_size(const dt_gbatch *g, int m)
{
    if (gbatch_even(g))
        return g->global / g->micro_steps + (m < g->global % g->micro_steps ? 1 : 0);
    int64_t full = (int64_t)g->world * g->cap;
    return m < g->micro_steps - 1 ? full : g->global - full * (g->micro_steps - 1);
}

int64_t dt_gbatch_micro_offset(const dt_gbatch *g, int m)
{
    if (gbatch_even(g)) {
        int64_t q = g->global / g->micro_steps, r = g->global % g->micro_steps;
        return (int64_t)m * q + DT_MIN((int64_t)m, r);
    }
    return (int64_t)m * g->world * g->cap;
}

int dt_gbatch_rank_count(const dt_gbatch *g, int m, int rank)
{
    int64_t gm = dt_gbatch_micro_size(g, m);
    return (int)(gm / g->world + (rank < gm % g->world ? 1 : 0));
}

int dt_gbatch_rank_micro_steps(const dt_gbatch *g, int rank)
{
    int n = 0;
    while (n < g->micro_steps && dt_gbatch_rank_count(g, n, rank) > 0)
        n++;
    return n;
}

int64_t dt_gbatch_rank_samples(const dt_gbatch *g, int rank)
{
    int64_t n = 0;
    for (int m = 0; m < g->micro_steps; m++)
        n += dt_gbatch_rank_count(g, m, rank);
    return n;
}

void dt_eval_indices(int64_t n, int rank, int world_size, int batch_size, int64_t k, int64_t *idx)
{
    int64_t g = (int64_t)world_size * batch_size;
    for (int j = 0; j < batch_size; j++)
        idx[j] = (k * g + (int64_t)j * world_size + rank) % n;
}

/* ---- writers ------------------------------------------------------------------------------ */

int dt_data_write_token_shard(const char *path, const uint32_t *tokens, int64_t n, dt_err *err)
{
    int version = 1;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] > 0xffff)
            version = 2;
    int width = version == 1 ? 2 : 4;
    size_t bytes = LLMC_HEADER_BYTES + (size_t)n * (size_t)width;
    uint8_t *buf = calloc(1, bytes);
    if (!buf)
        return dt_err_set(err, -ENOMEM, "out of memory writing %s", path);
    int32_t hdr[3] = {LLMC_MAGIC, version, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++)
            buf[i * 4 + b] = (uint8_t)((uint32_t)hdr[i] >> (8 * b));
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < width; b++)
            buf[LLMC_HEADER_BYTES + (size_t)i * (size_t)width + (size_t)b] =
                (uint8_t)(tokens[i] >> (8 * b));
    int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = dt_err_errno(err, errno, "cannot create %s", path);
    else {
        if ((rc = dt_write_all(fd, buf, bytes)))
            dt_err_errno(err, -rc, "cannot write %s", path);
        if (close(fd) != 0 && !rc)
            rc = dt_err_errno(err, errno, "cannot write %s", path);
    }
    free(buf);
    return rc;
}

/* ---- dt_data_open ------------------------------------------------------------------------- */

/* Splits the files of a directory into training and held-out files. */
typedef bool (*name_pred)(const char *base);

static bool is_llmc_name(const char *b) { return strstr(b, ".bin") != NULL; }
static bool is_llmc_val(const char *b) { return strstr(b, "val") != NULL; }
static bool is_cifar_train(const char *b) { return !strncmp(b, "data_batch", 10); }
static bool is_cifar_val(const char *b) { return !strncmp(b, "test_batch", 10); }

static int split_dir(const char *dir, name_pred keep, name_pred held_out, pathlist *train,
                     pathlist *val, dt_err *err)
{
    pathlist all = {0};
    int rc = list_dir(dir, &all, err);
    for (int i = 0; i < all.n && !rc; i++) {
        const char *b = base_name(all.v[i]);
        if (held_out && held_out(b))
            rc = pathlist_add(val, all.v[i], err);
        else if (!keep || keep(b))
            rc = pathlist_add(train, all.v[i], err);
    }
    pathlist_free(&all);
    return rc;
}

/* Finds the MNIST training (or, with val, the t10k) pair in a directory. */
static int mnist_in_dir(const char *dir, bool val, char *img, char *lab, size_t cap, dt_err *err)
{
    static const char *const img_names[] = {"%s/%s-images-idx3-ubyte", "%s/%s-images.idx3-ubyte"};
    static const char *const lab_names[] = {"%s/%s-labels-idx1-ubyte", "%s/%s-labels.idx1-ubyte"};
    const char *pre = val ? "t10k" : "train";
    for (size_t i = 0; i < DT_ARRAY_LEN(img_names); i++) {
        snprintf(img, cap, img_names[i], dir, pre);
        snprintf(lab, cap, lab_names[i], dir, pre);
        if (is_file(img) && is_file(lab))
            return 0;
    }
    return dt_err_set(err, -ENOENT, "MNIST directory %s has no %s-images-idx3-ubyte and %s-labels-idx1-ubyte",
                      dir, pre, pre);
}

/* Opens a source from a path (file, directory or glob) of the job's format.
 * For the training data (val_src != NULL), a directory's held-out files (llm.c "val" shards,
 * CIFAR test_batch, MNIST t10k) go to *val_src (which may stay NULL). For data.val_path
 * (val_src == NULL), a directory's held-out files are the ones used when it has any. */
static int open_path(const dt_job *job, const char *path, const dt_sample_shape *shape,
                     source **src, source **val_src, dt_err *err)
{
    bool for_val = val_src == NULL;
    pathlist train = {0}, held = {0};
    int rc = 0;
    dt_data_kind type = job->data_type;
    bool dir = is_dir(path);
    char img[DT_PATH_MAX + 64], lab[DT_PATH_MAX + 64];
    if (type == DT_DATA_MNIST) {
        if (dir) {
            if ((!for_val || mnist_in_dir(path, true, img, lab, sizeof img, NULL) != 0) &&
                (rc = mnist_in_dir(path, false, img, lab, sizeof img, err)))
                goto out;
        } else {
            dt_strlcpy(img, path, sizeof img);
            if ((rc = mnist_labels_path(path, lab, sizeof lab, err)))
                goto out;
        }
        if ((rc = source_mnist(src, img, lab, err)))
            goto out;
        if (dir && !for_val && mnist_in_dir(path, true, img, lab, sizeof img, NULL) == 0)
            rc = source_mnist(val_src, img, lab, err);
        goto out;
    }
    if (dir) {
        if (type == DT_DATA_TOKENS)
            rc = split_dir(path, is_llmc_name, is_llmc_val, &train, &held, err);
        else if (type == DT_DATA_CIFAR10) {
            rc = split_dir(path, is_cifar_train, is_cifar_val, &train, &held, err);
            if (!rc && train.n == 0) { /* no data_batch_* names: every file but test_batch */
                pathlist_free(&held);
                rc = split_dir(path, NULL, is_cifar_val, &train, &held, err);
            }
        } else
            rc = split_dir(path, NULL, NULL, &train, &held, err);
        if (!rc && train.n == 0 && !(for_val && held.n))
            rc = dt_err_set(err, -ENOENT, "data directory %s holds no %s files%s", path,
                            for_val ? "validation" : "training",
                            type == DT_DATA_TOKENS    ? " (expected llm.c .bin shards)"
                            : type == DT_DATA_CIFAR10 ? " (expected data_batch_*.bin)"
                                                      : "");
    } else {
        rc = list_glob(path, &train, err);
    }
    if (rc)
        goto out;
    if (for_val && held.n) { /* data.val_path: its held-out files when it has any */
        pathlist t = train;
        train = held;
        held = t;
    }
    if (type == DT_DATA_CIFAR10) {
        if ((rc = source_cifar(src, &train, err)))
            goto out;
        if (!for_val && held.n)
            rc = source_cifar(val_src, &held, err);
    } else {
        bool text = type == DT_DATA_TEXT;
        if ((rc = source_tokens(src, &train, text, shape->seq_len, shape->vocab_size, err)))
            goto out;
        if (!for_val && held.n)
            rc = source_tokens(val_src, &held, text, shape->seq_len, shape->vocab_size, err);
    }
out:
    pathlist_free(&train);
    pathlist_free(&held);
    return rc;
}

static int open_synthetic(const dt_job *job, dt_sample_shape *shape, source **out, dt_err *err)
{
    source *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "out of memory");
    synth *y = &s->syn;
    int rc = 0;
    y->seed = (uint64_t)job->seed;
    y->classes = job->synthetic_classes;
    s->n = job->synthetic_samples;
    if (job->model_type == DT_MODEL_GPT) {
        s->kind = SRC_SYN_TOKENS;
        y->T = s->T = shape->seq_len;
        y->vocab = s->vocab = shape->vocab_size;
        snprintf(s->what, sizeof s->what,
                 "synthetic token sequences (%lld, vocabulary %d; best loss ~1.09)",
                 (long long)s->n, y->vocab);
    } else if (job->synthetic_shape[0] == 0) { /* vector */
        s->kind = SRC_SYN_VEC;
        y->dim = job->synthetic_dim;
        shape->kind = DT_SAMPLE_VECTOR;
        shape->input_dim = y->dim;
        shape->n_classes = y->classes;
        rc = syn_vec_init(y, err);
        snprintf(s->what, sizeof s->what, "synthetic vectors (%lld x %d features, %d classes)",
                 (long long)s->n, y->dim, y->classes);
    } else {
        s->kind = SRC_SYN_IMG;
        y->C = job->synthetic_shape[0];
        y->H = job->synthetic_shape[1];
        y->W = job->synthetic_shape[2];
        if (y->C < 1 || y->H < 1 || y->W < 1) {
            rc = dt_err_set(err, -EINVAL,
                            "data.synthetic_shape: %dx%dx%d must be vector or CxHxW such as "
                            "3x32x32",
                            y->C, y->H, y->W);
            goto out;
        }
        s->C = y->C;
        s->H = y->H;
        s->W = y->W;
        shape->kind = DT_SAMPLE_IMAGE;
        shape->channels = y->C;
        shape->height = y->H;
        shape->width = y->W;
        shape->input_dim = y->C * y->H * y->W;
        shape->n_classes = y->classes;
        rc = syn_img_init(y, err);
        snprintf(s->what, sizeof s->what, "synthetic images (%lld x %dx%dx%d, %d classes)",
                 (long long)s->n, y->C, y->H, y->W, y->classes);
    }
out:
    if (rc) {
        source_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* The shape a pixel source gives. */
static void pixel_shape(const source *s, dt_sample_shape *shape)
{
    shape->kind = DT_SAMPLE_IMAGE;
    shape->channels = s->C;
    shape->height = s->H;
    shape->width = s->W;
    shape->input_dim = s->C * s->H * s->W;
    shape->n_classes = s->classes;
}

int dt_data_open(dt_data **out, const dt_job *job, dt_err *err)
{
    dt_data *d = calloc(1, sizeof *d);
    data_impl *im = calloc(1, sizeof *im);
    dt_dataset *train = calloc(1, sizeof *train), *val = calloc(1, sizeof *val);
    int rc = 0;
    if (d)
        d->impl = im;
    if (!d || !im || !train || !val) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening the data");
        goto fail;
    }
    dt_data_kind type = job->data_type;
    bool lm = type == DT_DATA_TEXT || type == DT_DATA_TOKENS ||
              (type == DT_DATA_SYNTHETIC && job->model_type == DT_MODEL_GPT);
    dt_sample_shape *shape = &d->shape;
    if (lm) {
        shape->kind = DT_SAMPLE_TOKENS;
        shape->seq_len = job->seq_len > 0 ? job->seq_len : (job->block_size > 0 ? job->block_size : 64);
        shape->vocab_size = job->vocab_size > 0 ? job->vocab_size
                            : type == DT_DATA_TOKENS ? 50257
                                                      : 256;
    }
    if (type == DT_DATA_SYNTHETIC) {
        if (job->val_path[0])
            DT_WARN("data.val_path is ignored for synthetic data (val_fraction splits it)");
        rc = open_synthetic(job, shape, &im->src[0], err);
    } else {
        if (!job->data_path[0]) {
            rc = dt_err_set(err, -EINVAL, "data.path is required for data.type = %s",
                            dt_data_name(type));
            goto fail;
        }
        source *held = NULL;
        rc = open_path(job, job->data_path, shape, &im->src[0], &held, err);
        if (!rc && job->val_path[0]) {
            source_free(held); /* the held-out files of data.path give way to data.val_path */
            rc = open_path(job, job->val_path, shape, &im->src[1], NULL, err);
        } else {
            im->src[1] = held;
        }
    }
    if (rc)
        goto fail;
    if (im->src[0]->kind == SRC_PIXELS) {
        pixel_shape(im->src[0], shape);
        if (im->src[1] && (im->src[1]->C != im->src[0]->C || im->src[1]->H != im->src[0]->H ||
                           im->src[1]->W != im->src[0]->W)) {
            rc = dt_err_set(err, -EINVAL,
                            "validation data %s has %dx%dx%d images, the training data %dx%dx%d",
                            im->src[1]->what, im->src[1]->C, im->src[1]->H, im->src[1]->W,
                            im->src[0]->C, im->src[0]->H, im->src[0]->W);
            goto fail;
        }
    }

    /* the split */
    source *s = im->src[0];
    train->src = s;
    train->split = "train";
    val->split = "val";
    train->n = s->n;
    if (im->src[1]) {
        val->src = im->src[1];
        val->n = im->src[1]->n;
    } else if (job->val_fraction > 0) {
        int64_t nv = (int64_t)llround((double)s->n * job->val_fraction);
        if (nv < 1)
            nv = 1;
        if (nv >= s->n) {
            rc = dt_err_set(err, -EINVAL,
                            "%s: %lld samples are too few to hold out data.val_fraction = %g for "
                            "validation (set data.val_fraction = 0 or give data.val_path)",
                            s->what, (long long)s->n, job->val_fraction);
            goto fail;
        }
        train->n = s->n - nv;
        val->src = s;
        val->first = train->n;
        val->n = nv;
    }
    d->train = train;
    train = NULL;
    if (val->src) {
        d->val = val;
        val = NULL;
    }
    char vdesc[DT_PATH_MAX + 128] = "no validation data";
    if (d->val && d->val->src == d->train->src)
        snprintf(vdesc, sizeof vdesc, "val: last %lld samples", (long long)d->val->n);
    else if (d->val)
        snprintf(vdesc, sizeof vdesc, "val: %lld samples of %s", (long long)d->val->n,
                 d->val->src->what);
    snprintf(d->desc, sizeof d->desc, "%s%s%.200s: train %lld samples, %.200s",
             type != DT_DATA_SYNTHETIC ? dt_data_name(type) : "",
             type != DT_DATA_SYNTHETIC ? " " : "", s->what,
             (long long)d->train->n, vdesc);
    free(train);
    free(val);
    *out = d;
    return 0;
fail:
    free(train);
    free(val);
    if (!d)
        free(im);
    dt_data_free(d);
    return rc;
}

void dt_data_free(dt_data *d)
{
    if (!d)
        return;
    data_impl *im = d->impl;
    if (im) {
        source_free(im->src[0]);
        source_free(im->src[1]);
        free(im);
    }
    free(d->train);
    free(d->val);
    free(d);
}
