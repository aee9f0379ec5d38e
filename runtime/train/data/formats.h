/* formats.h - the file formats dtrain reads, one level below the datasets (data.c): read-only
 * mappings of whole files, file listings (a directory, a glob), token files (raw bytes of any
 * file, llm.c token shards) and pixel files (CIFAR-10 binary batches, MNIST IDX files). Each
 * opener checks its format and names the file and the fix on a mismatch; none knows about
 * splits, samples of a sequence length or the sampler. Internal to runtime/train/data/.
 *
 * llm.c shard: a 1024-byte header of 256 int32 (magic 20240520, version, token count), then the
 * tokens (uint16 for version 1, uint32 for version 2). CIFAR-10: records of 1 label byte + 3072
 * pixel bytes (3x32x32). MNIST: images (magic 2051) and labels (magic 2049), big-endian IDX.
 */
#ifndef DT_DATA_FORMATS_H
#define DT_DATA_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/util.h"
#include "runtime/job/config.h" /* DT_PATH_MAX */

#define DT_LLMC_MAGIC 20240520
#define DT_LLMC_HEADER_BYTES 1024

/* A read-only mapping of a whole file. */
typedef struct dt_mapped {
    char path[DT_PATH_MAX];
    const uint8_t *p;  /* NULL when the file is empty */
    size_t len;
} dt_mapped;

/* Maps path read-only (m is zeroed first); on failure err names the file. */
int dt_formats_map(dt_mapped *m, const char *path, dt_err *err);
/* Unmaps (a zeroed or unmapped m is fine). */
void dt_formats_unmap(dt_mapped *m);

/* A list of paths (malloc'd strings, owned). */
typedef struct dt_pathlist {
    char **v;
    int n, cap;
} dt_pathlist;

int dt_formats_list_add(dt_pathlist *l, const char *path, dt_err *err);
/* Frees the strings and the array; l is zeroed. */
void dt_formats_list_free(dt_pathlist *l);
/* The part of path after its last '/'. */
const char *dt_formats_base_name(const char *path);
bool dt_formats_is_dir(const char *path);
bool dt_formats_is_file(const char *path);
/* Appends the regular files of directory dir (sorted, hidden files skipped) to out. */
int dt_formats_list_dir(const char *dir, dt_pathlist *out, dt_err *err);
/* Appends a file, or the regular files a glob matches (sorted); a directory is the caller's
 * case. */
int dt_formats_list_glob(const char *pattern, dt_pathlist *out, dt_err *err);

/* A token file: raw bytes (text) or an llm.c shard. */
typedef struct dt_tok_file {
    dt_mapped m;
    const uint8_t *tokens; /* first token */
    int width;             /* bytes per token: 1 (text), 2 (llm.c v1), 4 (llm.c v2) */
    int64_t ntok;
    int64_t nsamples;      /* (ntok - 1) / T: set by the dataset that opened it */
    int64_t first;         /* samples in the files before this one: likewise */
} dt_tok_file;

/* Token i of f (i < f->ntok). */
uint32_t dt_formats_tok_at(const dt_tok_file *f, int64_t i);
/* Opens path as raw bytes, vocabulary 256. */
int dt_formats_open_text(dt_tok_file *f, const char *path, dt_err *err);
/* Opens path as an llm.c shard (magic, version, size checked against the header). */
int dt_formats_open_shard(dt_tok_file *f, const char *path, dt_err *err);
/* Fails when a token of f is >= vocab (scans the whole file). */
int dt_formats_scan_vocab(const dt_tok_file *f, int vocab, dt_err *err);

/* A pixel file: a CIFAR-10 batch or an MNIST images + labels pair. */
typedef struct dt_pix_file {
    dt_mapped img, lab;   /* lab.p == NULL for CIFAR (labels inside the image records) */
    const uint8_t *pix0;  /* pixels of sample 0 */
    const uint8_t *lab0;  /* label of sample 0 */
    size_t stride;        /* bytes between samples (pixels and labels alike for CIFAR) */
    size_t lab_stride;
    int64_t n;
    int64_t first;        /* samples in the files before this one: set by the dataset */
} dt_pix_file;

int dt_formats_open_cifar(dt_pix_file *f, const char *path, dt_err *err);
/* Opens an MNIST images file and its labels file; *rows, *cols get the image size. */
int dt_formats_open_mnist(dt_pix_file *f, const char *img_path, const char *lab_path, int *rows,
                          int *cols, dt_err *err);
/* The labels file of an MNIST images file: "...-images-idx3-ubyte" -> "...-labels-idx1-ubyte"
 * (also the "images.idx3" spelling). */
int dt_formats_mnist_labels_path(const char *img, char *out, size_t cap, dt_err *err);

#endif
