/* data.h - datasets, the train/validation split, host batches and the distributed sampler:
 * the room's main header (runtime/train/data/). Its modules: data.c (datasets, splits, batches,
 * dt_data_open), formats.c (the file formats: mappings, listings, token and pixel files),
 * synth.c (the synthetic teachers), sampler.c (the sampler and the global-batch arithmetic,
 * sampler.h, which this header includes); outside the room only this header is included.
 *
 * Formats (data.type):
 *   synthetic  a learnable task generated from a seeded teacher, sample by sample from
 *              (seed, index), so it costs no memory at any size: classification vectors
 *              (data.synthetic_dim), images (data.synthetic_shape = CxHxW), or, for model.type =
 *              gpt, token sequences whose next token depends on the two before it.
 *   text       the raw bytes of any file: byte-level language modelling, vocabulary 256.
 *   tokens     llm.c token shards: a 1024-byte header of 256 int32 (magic 20240520, version,
 *              token count), then the tokens (uint16 for version 1, uint32 for version 2).
 *   cifar10    CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (3x32x32).
 *   mnist      MNIST IDX files: images (magic 2051) and labels (magic 2049), big-endian.
 *
 * data.path is a file, a directory or a glob. For a directory the usual names are recognised and
 * its held-out files become the validation set when data.val_path is empty: llm.c shards with
 * "val" in the name, CIFAR's test_batch.bin, MNIST's t10k-* files. Otherwise data.val_path names
 * the validation data, or the last data.val_fraction of the samples is held out (0 = none).
 *
 * A language-modelling sample i is the T+1 tokens starting at i*T of its shard (inputs are the
 * first T, targets the last T), as in llm.c. Files are memory-mapped and never copied whole.
 * For model.type = bert the same sample's first tokens become a masked-LM sample instead
 * (mlm.h: [CLS] ... [SEP], or sentence pairs with model.nsp; 4 special tokens after the
 * source's vocabulary; the masked positions a function of (job.seed, sample, position)).
 *
 * Every error names the file: a wrong magic, a truncated file, a label or token out of range of
 * the classes or the vocabulary, a validation file whose shape differs from the training data.
 *
 * What is left out on purpose: data augmentation, tokenisation of text (use llm.c's scripts to
 * make token shards), compressed files.
 */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/data/sampler.h" /* the sampler and the global batch */

/* One split (train or validation): samples 0..size-1, read-only once opened, safe to read from
 * several threads. */
typedef struct dt_dataset dt_dataset;

typedef struct dt_data {
    dt_sample_shape shape; /* what a sample looks like. Images also set input_dim = C*H*W. */
    dt_dataset *train;     /* owned; never NULL after dt_data_open */
    dt_dataset *val;       /* owned; NULL when there is no validation data */
    char desc[512];        /* one line for the log: format, source, sizes of both splits */
    void *impl;            /* the sources (files, maps) both splits read from */
} dt_data;

/* Opens the data of job ([data], plus model.type to choose synthetic tokens for gpt and
 * job.seed for synthetic data). On failure *out is untouched and err names the file. */
int dt_data_open(dt_data **out, const dt_job *job, dt_err *err);

/* Accepts NULL. */
void dt_data_free(dt_data *d);

/* Number of samples. */
int64_t dt_dataset_size(const dt_dataset *ds);

/* "train" or "val". */
const char *dt_dataset_split(const dt_dataset *ds);

/* Host buffers for batches of up to `capacity` samples of one shape. */
typedef struct dt_batch_buf {
    dt_batch batch;      /* the view handed to the model; points into the arrays below */
    dt_sample_shape shape;
    int capacity;        /* samples */
    int32_t *tokens;     /* (capacity,T) tokens kind, else NULL; owned */
    int32_t *targets;    /* (capacity,T) tokens kind, (capacity) labels otherwise; owned */
    float *x;            /* (capacity, input_dim) vector and image kinds, else NULL; owned */
    /* masked-LM samples (shape.mlm), else NULL; owned: */
    int32_t *types, *mask; /* (capacity,T) */
    int32_t *labels;       /* (capacity) next-sentence labels */
    int32_t *raw;          /* (2,T+1) scratch: a sample's source tokens and its partner's */
} dt_batch_buf;

int dt_batch_buf_init(dt_batch_buf *b, const dt_sample_shape *shape, int capacity, dt_err *err);
/* Accepts a zeroed or freed buffer. */
void dt_batch_buf_free(dt_batch_buf *b);

/* Fills b->batch with samples indices[0..n) of ds (n <= capacity, each index < size). Fails
 * (naming the file and the position) when a token or label is out of range. */
int dt_dataset_fill(const dt_dataset *ds, const int64_t *indices, int n, dt_batch_buf *b,
                    dt_err *err);

/* ---- writers, for tests and for tools that make datasets ---------------------------------- */

/* Writes an llm.c token shard (version 1 when every token < 65536, else version 2). */
int dt_data_write_token_shard(const char *path, const uint32_t *tokens, int64_t n, dt_err *err);

#endif
