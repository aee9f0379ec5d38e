/* data.c - the datasets, the train/validation split and host batches; see data.h.
 *
 * Layout: a *source* is what one format reads (a set of mapped files, formats.h, or a synthetic
 * teacher, synth.h) and exposes samples 0..n-1 of; a *dataset* is a window [first, first+n) of a
 * source. Train and validation are two windows of one source (val_fraction) or of two sources
 * (val_path, or the held-out files of a directory). Files are memory-mapped read-only: a 10 GB
 * token set costs page cache, not heap, and every rank of a node shares those pages. The sampler
 * and the global batch are sampler.c's.
 *
 * Sections: sources and datasets - batches - writers - dt_data_open.
 */
#include "runtime/train/data/data.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "runtime/train/data/formats.h"
#include "runtime/train/data/mlm.h"
#include "runtime/train/data/synth.h"

/* Token files up to this many tokens are scanned for out-of-vocabulary ids when opened; larger
 * ones are checked sample by sample as batches are read (a full scan of a 10B-token set would
 * delay every start by minutes). */
#define VOCAB_SCAN_MAX (INT64_C(1) << 28)

/* ---- sources and datasets ----------------------------------------------------------------- */

typedef enum src_kind { SRC_TOKENS, SRC_PIXELS, SRC_SYN_TOKENS, SRC_SYN_VEC, SRC_SYN_IMG } src_kind;

typedef struct source {
    src_kind kind;
    int64_t n;          /* samples */
    /* tokens */
    dt_tok_file *tf;
    int ntf;
    int T, vocab;
    bool check_vocab;   /* check tokens as batches are read (not scanned at open) */
    /* pixels: normalised per channel as (p/255 - mean[c]) / std[c] */
    dt_pix_file *pf;
    int npf;
    int C, H, W, classes;
    float mean[4], std[4];
    /* synthetic */
    dt_synth syn;
    char what[DT_PATH_MAX + 64]; /* "GPL-3 (35068 bytes)", for desc */
} source;

struct dt_dataset {
    source *src;      /* borrowed from dt_data's impl */
    int64_t first, n; /* window of the source */
    const char *split;
    const dt_mlm *mlm; /* borrowed from dt_data's impl: masked-LM samples (bert), else NULL */
};

typedef struct data_impl {
    source *src[2];   /* [0] training, [1] validation when from other files, else NULL */
    dt_mlm mlm;       /* bert's masked-LM samples (used when shape.mlm) */
} data_impl;

static void source_free(source *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->ntf; i++)
        dt_formats_unmap(&s->tf[i].m);
    free(s->tf);
    for (int i = 0; i < s->npf; i++) {
        dt_formats_unmap(&s->pf[i].img);
        dt_formats_unmap(&s->pf[i].lab);
    }
    free(s->pf);
    dt_synth_free(&s->syn);
    free(s);
}

/* Token files of one split. `text` selects raw bytes; else llm.c shards. */
static int source_tokens(source **out, const dt_pathlist *files, bool text, int T, int vocab,
                         dt_err *err)
{
    source *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->tf = calloc((size_t)files->n, sizeof(dt_tok_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_TOKENS;
    s->T = T;
    s->vocab = vocab;
    int64_t total = 0;
    for (int i = 0; i < files->n; i++) {
        dt_tok_file *f = &s->tf[i];
        rc = text ? dt_formats_open_text(f, files->v[i], err) : dt_formats_open_shard(f, files->v[i], err);
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
            if ((rc = dt_formats_scan_vocab(&s->tf[i], vocab, err)))
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

static int source_cifar(source **out, const dt_pathlist *files, dt_err *err)
{
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    source *s = calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->pf = calloc((size_t)files->n, sizeof(dt_pix_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_PIXELS;
    s->C = 3;
    s->H = s->W = 32;
    s->classes = 10;
    set_norm(s, mean, std);
    for (int i = 0; i < files->n; i++) {
        if ((rc = dt_formats_open_cifar(&s->pf[i], files->v[i], err)))
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
    if (!s || !(s->pf = calloc(1, sizeof(dt_pix_file)))) {
        rc = dt_err_set(err, -ENOMEM, "out of memory opening data files");
        goto fail;
    }
    s->kind = SRC_PIXELS;
    s->C = 1;
    s->classes = 10;
    set_norm(s, mean, std);
    if ((rc = dt_formats_open_mnist(&s->pf[0], img, lab, &s->H, &s->W, err)))
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
static const dt_pix_file *pix_find(const source *s, int64_t i)
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

static const dt_tok_file *tok_find(const source *s, int64_t i)
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
        dt_synth_tokens(&s->syn, i, seq);
        return 0;
    }
    const dt_tok_file *f = tok_find(s, i);
    int64_t start = (i - f->first) * s->T;
    for (int t = 0; t <= s->T; t++) {
        uint32_t v = dt_formats_tok_at(f, start + t);
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
        const dt_pix_file *f = pix_find(s, i);
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
    return dt_synth_example(&s->syn, s->kind == SRC_SYN_IMG, i, x, label, err);
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
        if (shape->mlm &&
            (!(b->types = malloc(sizeof(int32_t) * cap * T)) ||
             !(b->mask = malloc(sizeof(int32_t) * cap * T)) ||
             !(b->labels = malloc(sizeof(int32_t) * cap)) ||
             !(b->raw = malloc(sizeof(int32_t) * 2 * (T + 1))))) {
            dt_batch_buf_free(b);
            return dt_err_set(err, -ENOMEM, "out of memory for a batch of %d samples", capacity);
        }
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
    free(b->types);
    free(b->mask);
    free(b->labels);
    free(b->raw);
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
        if (ds->mlm) {
            /* a masked-LM sample from the sample's first tokens (and, for a random second
             * segment, another sample's of the same split), indexed by its source index */
            const dt_mlm *ml = ds->mlm;
            const int T = b->shape.seq_len;
            const size_t at = (size_t)i * (size_t)T;
            int32_t *raw = b->raw, *other = b->raw + T + 1;
            if ((rc = read_tokens(s, j, raw, err)))
                return rc;
            if (ml->nsp && dt_mlm_label(ml, j) &&
                (rc = read_tokens(s, dt_mlm_partner(ml, j, ds->first, ds->n), other, err)))
                return rc;
            if ((rc = dt_mlm_sample(ml, j, raw, other, b->tokens + at, b->targets + at,
                                    b->types + at, b->mask + at, &b->labels[i], err)))
                return rc;
        } else if (b->shape.kind == DT_SAMPLE_TOKENS) {
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
    b->batch.types = ds->mlm ? b->types : NULL;
    b->batch.mask = ds->mlm ? b->mask : NULL;
    b->batch.labels = ds->mlm && ds->mlm->nsp ? b->labels : NULL;
    return 0;
}

/* ---- writers ------------------------------------------------------------------------------ */

int dt_data_write_token_shard(const char *path, const uint32_t *tokens, int64_t n, dt_err *err)
{
    int version = 1;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] > 0xffff)
            version = 2;
    int width = version == 1 ? 2 : 4;
    size_t bytes = DT_LLMC_HEADER_BYTES + (size_t)n * (size_t)width;
    uint8_t *buf = calloc(1, bytes);
    if (!buf)
        return dt_err_set(err, -ENOMEM, "out of memory writing %s", path);
    int32_t hdr[3] = {DT_LLMC_MAGIC, version, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++)
            buf[i * 4 + b] = (uint8_t)((uint32_t)hdr[i] >> (8 * b));
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < width; b++)
            buf[DT_LLMC_HEADER_BYTES + (size_t)i * (size_t)width + (size_t)b] =
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

static int split_dir(const char *dir, name_pred keep, name_pred held_out, dt_pathlist *train,
                     dt_pathlist *val, dt_err *err)
{
    dt_pathlist all = {0};
    int rc = dt_formats_list_dir(dir, &all, err);
    for (int i = 0; i < all.n && !rc; i++) {
        const char *b = dt_formats_base_name(all.v[i]);
        if (held_out && held_out(b))
            rc = dt_formats_list_add(val, all.v[i], err);
        else if (!keep || keep(b))
            rc = dt_formats_list_add(train, all.v[i], err);
    }
    dt_formats_list_free(&all);
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
        if (dt_formats_is_file(img) && dt_formats_is_file(lab))
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
    dt_pathlist train = {0}, held = {0};
    int rc = 0;
    dt_data_kind type = job->data_type;
    bool dir = dt_formats_is_dir(path);
    char img[DT_PATH_MAX + 64], lab[DT_PATH_MAX + 64];
    if (type == DT_DATA_MNIST) {
        if (dir) {
            if ((!for_val || mnist_in_dir(path, true, img, lab, sizeof img, NULL) != 0) &&
                (rc = mnist_in_dir(path, false, img, lab, sizeof img, err)))
                goto out;
        } else {
            dt_strlcpy(img, path, sizeof img);
            if ((rc = dt_formats_mnist_labels_path(path, lab, sizeof lab, err)))
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
                dt_formats_list_free(&held);
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
        rc = dt_formats_list_glob(path, &train, err);
    }
    if (rc)
        goto out;
    if (for_val && held.n) { /* data.val_path: its held-out files when it has any */
        dt_pathlist t = train;
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
    dt_formats_list_free(&train);
    dt_formats_list_free(&held);
    return rc;
}

static int open_synthetic(const dt_job *job, dt_sample_shape *shape, source **out, dt_err *err)
{
    source *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_synth *y = &s->syn;
    int rc = 0;
    y->seed = (uint64_t)job->seed;
    y->classes = job->synthetic_classes;
    s->n = job->synthetic_samples;
    if (dt_model_reads_tokens(job->model_type)) {
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
        rc = dt_synth_vec_init(y, err);
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
        rc = dt_synth_img_init(y, err);
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
    const bool bert = job->model_type == DT_MODEL_BERT;
    bool lm = type == DT_DATA_TEXT || type == DT_DATA_TOKENS ||
              (type == DT_DATA_SYNTHETIC && dt_model_reads_tokens(job->model_type));
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
    if (bert && lm) { /* masked-LM samples of the token source; the specials after its vocabulary */
        im->mlm = (dt_mlm){.vocab = shape->vocab_size, .T = shape->seq_len,
                           .prob = job->mlm_prob, .seed = (uint64_t)job->seed, .nsp = job->nsp};
        if ((rc = dt_mlm_check(&im->mlm, err)))
            goto fail;
        shape->vocab_size += DT_MLM_SPECIALS;
        shape->mlm = true;
        train->mlm = val->mlm = &im->mlm;
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
    char mdesc[96] = "";
    if (shape->mlm)
        snprintf(mdesc, sizeof mdesc, " as masked-LM samples (%g masked%s, vocabulary %d + 4)",
                 job->mlm_prob, job->nsp ? ", sentence pairs" : "", im->mlm.vocab);
    snprintf(d->desc, sizeof d->desc, "%s%s%.200s%s: train %lld samples, %.200s",
             type != DT_DATA_SYNTHETIC ? dt_data_name(type) : "",
             type != DT_DATA_SYNTHETIC ? " " : "", s->what, mdesc,
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
