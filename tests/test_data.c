/* test_data.c - every data reader on generated files of its format and on corrupt ones; the
 * train/validation split; bert's masked-LM samples (the layout of a sample, exact counts, the
 * 80/10/10 split, sentence pairs, masks a function of (seed, sample, position)); the distributed
 * sampler (disjoint shards, coverage, determinism, and resuming on another world size). */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/data/data.h"
#include "tests/harness.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    DT_REQUIRE(f);
    DT_REQUIRE(n == 0 || fwrite(p, 1, n, f) == n);
    DT_REQUIRE(fclose(f) == 0);
}

static char *tmp_path(const char *name)
{
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 1024, "%s/%s", dt_test_tmpdir(), name);
    return b;
}

static void job_for(dt_job *job, const char *model, const char *type, const char *path)
{
    char set[96];
    dt_err err = {0};
    dt_job_defaults(job);
    snprintf(set, sizeof set, "model.type=%s", model);
    DT_REQUIRE_OK(dt_job_set(job, set, &err), &err);
    snprintf(set, sizeof set, "data.type=%s", type);
    DT_REQUIRE_OK(dt_job_set(job, set, &err), &err);
    if (path)
        dt_strlcpy(job->data_path, path, sizeof job->data_path);
}

/* Opens data expecting failure; returns the message. */
static const char *open_fails(const dt_job *job)
{
    static dt_err err;
    dt_data *d = NULL;
    memset(&err, 0, sizeof err);
    int rc = dt_data_open(&d, job, &err);
    DT_CHECK_MSG(rc < 0, "dt_data_open succeeded, expected a failure");
    if (rc == 0)
        dt_data_free(d);
    return err.msg;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* ---- text --------------------------------------------------------------------------------- */

static void test_text_reader(void)
{
    enum { N = 1000, T = 8 };
    uint8_t text[N];
    for (int i = 0; i < N; i++)
        text[i] = (uint8_t)(i * 7 + 3);
    const char *path = tmp_path("corpus.txt");
    write_bytes(path, text, N);
    dt_job job;
    job_for(&job, "gpt", "text", path);
    job.seq_len = T;
    job.val_fraction = 0.1;
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_TOKENS);
    DT_CHECK_INT(d->shape.seq_len, T);
    DT_CHECK_INT(d->shape.vocab_size, 256);
    int64_t total = (N - 1) / T;
    DT_REQUIRE(d->val);
    DT_CHECK_INT(dt_dataset_size(d->train) + dt_dataset_size(d->val), total);
    DT_CHECK_INT(dt_dataset_size(d->val), 12); /* round(124 * 0.1) */
    DT_CHECK_CONTAINS(d->desc, "corpus.txt");

    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 4, &err), &err);
    int64_t idx[3] = {5, 0, 2};
    DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 3, &b, &err), &err);
    DT_CHECK_INT(b.batch.B, 3);
    DT_CHECK_INT(b.batch.T, T);
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < T; t++) {
            DT_CHECK_INT(b.batch.tokens[i * T + t], text[idx[i] * T + t]);
            DT_CHECK_INT(b.batch.targets[i * T + t], text[idx[i] * T + t + 1]);
        }
    /* the validation split is the tail of the file */
    int64_t v0 = 0;
    DT_REQUIRE_OK(dt_dataset_fill(d->val, &v0, 1, &b, &err), &err);
    DT_CHECK_INT(b.batch.tokens[0], text[(total - 12) * T]);
    /* out-of-range index */
    int64_t bad = dt_dataset_size(d->train);
    DT_CHECK(dt_dataset_fill(d->train, &bad, 1, &b, &err) < 0);
    dt_batch_buf_free(&b);
    dt_data_free(d);

    /* no validation */
    job.val_fraction = 0;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK(d->val == NULL);
    DT_CHECK_INT(dt_dataset_size(d->train), total);
    dt_data_free(d);

    /* data.val_path: another text file */
    const char *vpath = tmp_path("val.txt");
    write_bytes(vpath, text, 100);
    dt_strlcpy(job.val_path, vpath, sizeof job.val_path);
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_REQUIRE(d->val);
    DT_CHECK_INT(dt_dataset_size(d->val), (100 - 1) / T);
    DT_CHECK_INT(dt_dataset_size(d->train), total);
    dt_data_free(d);
}

static void test_text_errors(void)
{
    const char *path = tmp_path("short.txt");
    write_bytes(path, "hello", 5);
    dt_job job;
    job_for(&job, "gpt", "text", path);
    job.seq_len = 8;
    const char *msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, path);
    DT_CHECK_CONTAINS(msg, "seq_len");

    job_for(&job, "gpt", "text", tmp_path("missing.txt"));
    job.seq_len = 8;
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, "missing.txt");

    /* a vocabulary smaller than the bytes in the file */
    write_bytes(path, "hello world, hello world", 24);
    job_for(&job, "gpt", "text", path);
    job.seq_len = 4;
    job.vocab_size = 100; /* 'w' = 119 */
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, path);
    DT_CHECK_CONTAINS(msg, "vocabulary");

    /* too few samples to hold out a validation split */
    write_bytes(path, "abcdefghij", 10);
    job_for(&job, "gpt", "text", path);
    job.seq_len = 8;
    job.val_fraction = 0.5;
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, "val_fraction");
}

/* ---- llm.c token shards ------------------------------------------------------------------- */

static void write_shard(const char *path, int64_t n, uint32_t mul, uint32_t mod)
{
    uint32_t *t = malloc(sizeof(uint32_t) * (size_t)n);
    DT_REQUIRE(t);
    for (int64_t i = 0; i < n; i++)
        t[i] = (uint32_t)((i * mul + 1) % mod);
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_write_token_shard(path, t, n, &err), &err);
    free(t);
}

static void test_token_shards(void)
{
    enum { T = 16 };
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/shards", dt_test_tmpdir());
    DT_REQUIRE(mkdir(dir, 0755) == 0);
    char p1[1100], p2[1100], pv[1100];
    snprintf(p1, sizeof p1, "%s/tiny_train_000001.bin", dir);
    snprintf(p2, sizeof p2, "%s/tiny_train_000002.bin", dir);
    snprintf(pv, sizeof pv, "%s/tiny_val_000000.bin", dir);
    write_shard(p1, 1601, 31, 50257); /* 100 samples */
    write_shard(p2, 330, 17, 50257);  /* 20 samples */
    write_shard(pv, 170, 5, 50257);   /* 10 samples */
    /* the header as llm.c writes it */
    FILE *f = fopen(p1, "rb");
    DT_REQUIRE(f);
    int32_t hdr[3];
    DT_REQUIRE(fread(hdr, 4, 3, f) == 3);
    fclose(f);
    DT_CHECK_INT(hdr[0], 20240520);
    DT_CHECK_INT(hdr[1], 1);
    DT_CHECK_INT(hdr[2], 1601);

    dt_job job;
    job_for(&job, "gpt", "tokens", dir);
    job.seq_len = T;
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.vocab_size, 50257);
    DT_CHECK_INT(dt_dataset_size(d->train), 120);
    DT_REQUIRE(d->val);
    DT_CHECK_INT(dt_dataset_size(d->val), 10);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 2, &err), &err);
    int64_t idx[2] = {99, 100}; /* last sample of shard 1, first of shard 2 */
    DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 2, &b, &err), &err);
    for (int t = 0; t < T; t++) {
        DT_CHECK_INT(b.batch.tokens[t], ((99 * T + t) * 31 + 1) % 50257);
        DT_CHECK_INT(b.batch.targets[t], ((99 * T + t + 1) * 31 + 1) % 50257);
        DT_CHECK_INT(b.batch.tokens[T + t], (t * 17 + 1) % 50257);
    }
    int64_t v = 3;
    DT_REQUIRE_OK(dt_dataset_fill(d->val, &v, 1, &b, &err), &err);
    DT_CHECK_INT(b.batch.tokens[0], (3 * T * 5 + 1) % 50257);
    dt_batch_buf_free(&b);
    dt_data_free(d);

    /* a glob of the training shards only, and version 2 (uint32) shards */
    char glob[1100];
    snprintf(glob, sizeof glob, "%s/tiny_train_*.bin", dir);
    job_for(&job, "gpt", "tokens", glob);
    job.seq_len = T;
    job.val_fraction = 0;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(dt_dataset_size(d->train), 120);
    DT_CHECK(d->val == NULL);
    dt_data_free(d);

    const char *p3 = tmp_path("big_vocab.bin");
    write_shard(p3, 200, 1000, 128256);
    f = fopen(p3, "rb");
    DT_REQUIRE(f);
    DT_REQUIRE(fread(hdr, 4, 3, f) == 3);
    fclose(f);
    DT_CHECK_INT(hdr[1], 2);
    job_for(&job, "gpt", "tokens", p3);
    job.seq_len = T;
    job.vocab_size = 128256;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 1, &err), &err);
    v = 2;
    DT_REQUIRE_OK(dt_dataset_fill(d->train, &v, 1, &b, &err), &err);
    DT_CHECK_INT(b.batch.tokens[5], ((2 * T + 5) * 1000 + 1) % 128256);
    dt_batch_buf_free(&b);
    dt_data_free(d);
    /* the same file with the GPT-2 vocabulary: tokens out of range */
    job.vocab_size = 0;
    DT_CHECK_CONTAINS(open_fails(&job), "outside the vocabulary of 50257");
}

static void test_token_shard_errors(void)
{
    const char *good = tmp_path("good.bin");
    write_shard(good, 500, 3, 1000);
    char *data;
    size_t len;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(good, &data, &len, &err), &err);
    dt_job job;

    /* wrong magic */
    const char *bad = tmp_path("bad_magic.bin");
    data[0] ^= 0x55;
    write_bytes(bad, data, len);
    data[0] ^= 0x55;
    job_for(&job, "gpt", "tokens", bad);
    job.seq_len = 16;
    const char *msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, bad);
    DT_CHECK_CONTAINS(msg, "magic");

    /* truncated tokens, truncated header */
    const char *tr = tmp_path("truncated.bin");
    write_bytes(tr, data, len - 10);
    job_for(&job, "gpt", "tokens", tr);
    job.seq_len = 16;
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, tr);
    DT_CHECK_CONTAINS(msg, "truncated");
    write_bytes(tr, data, 100);
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, "truncated");

    /* bad version */
    data[4] = 7;
    write_bytes(bad, data, len);
    job_for(&job, "gpt", "tokens", bad);
    job.seq_len = 16;
    DT_CHECK_CONTAINS(open_fails(&job), "version 7");
    data[4] = 1;

    /* a text file given as tokens */
    write_bytes(bad, "just some text, not a shard at all......................................",
                70);
    DT_CHECK_CONTAINS(open_fails(&job), "not an llm.c token shard");

    /* vocabulary smaller than the tokens */
    job_for(&job, "gpt", "tokens", good);
    job.seq_len = 16;
    job.vocab_size = 500;
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, good);
    DT_CHECK_CONTAINS(msg, "vocabulary of 500");

    /* a glob that matches nothing */
    job_for(&job, "gpt", "tokens", tmp_path("nothing_*.bin"));
    DT_CHECK_CONTAINS(open_fails(&job), "nothing_*.bin");
    free(data);
}

/* ---- CIFAR-10 ------------------------------------------------------------------------------ */

static void write_cifar(const char *path, int n, int label_base)
{
    uint8_t *buf = malloc((size_t)n * 3073);
    DT_REQUIRE(buf);
    for (int i = 0; i < n; i++) {
        buf[i * 3073] = (uint8_t)((label_base + i) % 10);
        for (int k = 0; k < 3072; k++)
            buf[i * 3073 + 1 + k] = (uint8_t)(i + k);
    }
    write_bytes(path, buf, (size_t)n * 3073);
    free(buf);
}

static void test_cifar(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/cifar", dt_test_tmpdir());
    DT_REQUIRE(mkdir(dir, 0755) == 0);
    char p[1100];
    snprintf(p, sizeof p, "%s/data_batch_1.bin", dir);
    write_cifar(p, 20, 0);
    snprintf(p, sizeof p, "%s/data_batch_2.bin", dir);
    write_cifar(p, 10, 3);
    snprintf(p, sizeof p, "%s/test_batch.bin", dir);
    write_cifar(p, 7, 5);
    snprintf(p, sizeof p, "%s/batches.meta.txt", dir);
    write_bytes(p, "airplane\n", 9);

    dt_job job;
    job_for(&job, "resnet", "cifar10", dir);
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_IMAGE);
    DT_CHECK_INT(d->shape.channels, 3);
    DT_CHECK_INT(d->shape.height, 32);
    DT_CHECK_INT(d->shape.width, 32);
    DT_CHECK_INT(d->shape.input_dim, 3072);
    DT_CHECK_INT(d->shape.n_classes, 10);
    DT_CHECK_INT(dt_dataset_size(d->train), 30);
    DT_REQUIRE(d->val);
    DT_CHECK_INT(dt_dataset_size(d->val), 7);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 2, &err), &err);
    int64_t idx[2] = {1, 22}; /* batch 1 record 1, batch 2 record 2 */
    DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 2, &b, &err), &err);
    DT_CHECK_INT(b.batch.targets[0], 1);
    DT_CHECK_INT(b.batch.targets[1], 5);
    /* pixel k of record i is (i + k) & 255, normalised per channel */
    DT_CHECK_NEAR(b.batch.x[0], (1 / 255.0 - 0.4914) / 0.2470, 1e-5);
    DT_CHECK_NEAR(b.batch.x[1024 + 3], ((1 + 1024 + 3) % 256 / 255.0 - 0.4822) / 0.2435, 1e-5);
    DT_CHECK_NEAR(b.batch.x[3072 + 2048], ((2 + 2048) % 256 / 255.0 - 0.4465) / 0.2616, 1e-5);
    int64_t v = 6;
    DT_REQUIRE_OK(dt_dataset_fill(d->val, &v, 1, &b, &err), &err);
    DT_CHECK_INT(b.batch.targets[0], 1); /* (5 + 6) % 10 */
    dt_batch_buf_free(&b);
    dt_data_free(d);

    /* one batch file: val_fraction splits it */
    snprintf(p, sizeof p, "%s/data_batch_1.bin", dir);
    job_for(&job, "resnet", "cifar10", p);
    job.val_fraction = 0.25;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(dt_dataset_size(d->train), 15);
    DT_CHECK_INT(dt_dataset_size(d->val), 5);
    dt_data_free(d);
}

static void test_cifar_errors(void)
{
    const char *p = tmp_path("data_batch_1.bin");
    write_cifar(p, 3, 0);
    /* truncated: a partial record */
    FILE *f = fopen(p, "ab");
    DT_REQUIRE(f);
    fputc(1, f);
    fclose(f);
    dt_job job;
    job_for(&job, "resnet", "cifar10", p);
    const char *msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, p);
    DT_CHECK_CONTAINS(msg, "truncated");

    /* a label out of range is reported with the file when read */
    uint8_t rec[3073] = {0};
    rec[0] = 12;
    write_bytes(p, rec, sizeof rec);
    job.val_fraction = 0;
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 1, &err), &err);
    int64_t i0 = 0;
    DT_CHECK(dt_dataset_fill(d->train, &i0, 1, &b, &err) < 0);
    DT_CHECK_CONTAINS(err.msg, p);
    DT_CHECK_CONTAINS(err.msg, "label 12");
    dt_batch_buf_free(&b);
    dt_data_free(d);

    /* an empty directory */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/empty", dt_test_tmpdir());
    DT_REQUIRE(mkdir(dir, 0755) == 0);
    job_for(&job, "resnet", "cifar10", dir);
    DT_CHECK_CONTAINS(open_fails(&job), "holds no training files");
}

/* ---- MNIST -------------------------------------------------------------------------------- */

static void write_mnist(const char *dir, const char *prefix, int n, int rows, int cols)
{
    char p[1100];
    size_t ib = 16 + (size_t)n * rows * cols;
    uint8_t *img = calloc(1, ib), *lab = calloc(1, 8 + (size_t)n);
    DT_REQUIRE(img && lab);
    put_be32(img, 2051);
    put_be32(img + 4, (uint32_t)n);
    put_be32(img + 8, (uint32_t)rows);
    put_be32(img + 12, (uint32_t)cols);
    for (size_t k = 16; k < ib; k++)
        img[k] = (uint8_t)(k * 13);
    put_be32(lab, 2049);
    put_be32(lab + 4, (uint32_t)n);
    for (int i = 0; i < n; i++)
        lab[8 + i] = (uint8_t)(i % 10);
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", dir, prefix);
    write_bytes(p, img, ib);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", dir, prefix);
    write_bytes(p, lab, 8 + (size_t)n);
    free(img);
    free(lab);
}

static void test_mnist(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/mnist", dt_test_tmpdir());
    DT_REQUIRE(mkdir(dir, 0755) == 0);
    write_mnist(dir, "train", 50, 28, 28);
    write_mnist(dir, "t10k", 12, 28, 28);
    dt_job job;
    job_for(&job, "mlp", "mnist", dir);
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_IMAGE);
    DT_CHECK_INT(d->shape.channels, 1);
    DT_CHECK_INT(d->shape.height, 28);
    DT_CHECK_INT(d->shape.input_dim, 784);
    DT_CHECK_INT(dt_dataset_size(d->train), 50);
    DT_REQUIRE(d->val);
    DT_CHECK_INT(dt_dataset_size(d->val), 12);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 1, &err), &err);
    int64_t i = 7;
    DT_REQUIRE_OK(dt_dataset_fill(d->train, &i, 1, &b, &err), &err);
    DT_CHECK_INT(b.batch.targets[0], 7);
    size_t k = 16 + 7 * 784 + 5;
    DT_CHECK_NEAR(b.batch.x[5], ((uint8_t)(k * 13) / 255.0 - 0.1307) / 0.3081, 1e-5);
    dt_batch_buf_free(&b);
    dt_data_free(d);

    /* the images file by name, its labels file found next to it; val_path = the t10k files */
    char img[1100], vimg[1100];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte", dir);
    snprintf(vimg, sizeof vimg, "%s/t10k-images-idx3-ubyte", dir);
    job_for(&job, "mlp", "mnist", img);
    dt_strlcpy(job.val_path, vimg, sizeof job.val_path);
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(dt_dataset_size(d->train), 50);
    DT_CHECK_INT(dt_dataset_size(d->val), 12);
    dt_data_free(d);
}

static void test_mnist_errors(void)
{
    char dir[1024], p[1100];
    snprintf(dir, sizeof dir, "%s/m", dt_test_tmpdir());
    DT_REQUIRE(mkdir(dir, 0755) == 0);
    write_mnist(dir, "train", 10, 28, 28);
    dt_job job;
    job_for(&job, "mlp", "mnist", dir);

    /* labels swapped for images: wrong magic */
    char *data;
    size_t len;
    dt_err err = {0};
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", dir);
    DT_REQUIRE_OK(dt_read_file(p, &data, &len, &err), &err);
    data[3] = 1; /* 2049: a labels magic in the images file */
    write_bytes(p, data, len);
    const char *msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, p);
    DT_CHECK_CONTAINS(msg, "magic");
    data[3] = 3;
    /* truncated images */
    write_bytes(p, data, len - 100);
    msg = open_fails(&job);
    DT_CHECK_CONTAINS(msg, p);
    DT_CHECK_CONTAINS(msg, "truncated");
    write_bytes(p, data, len);
    free(data);
    /* counts that differ */
    write_mnist(dir, "x", 9, 28, 28);
    char lab[1100];
    snprintf(lab, sizeof lab, "%s/x-labels-idx1-ubyte", dir);
    char lab2[1100];
    snprintf(lab2, sizeof lab2, "%s/train-labels-idx1-ubyte", dir);
    DT_REQUIRE(rename(lab, lab2) == 0);
    DT_CHECK_CONTAINS(open_fails(&job), "do not match");
    /* validation images of another size */
    write_mnist(dir, "train", 10, 28, 28);
    write_mnist(dir, "t10k", 5, 14, 14);
    DT_CHECK_CONTAINS(open_fails(&job), "1x14x14");
    /* no labels file next to an oddly named images file */
    snprintf(p, sizeof p, "%s/pictures.idx", dir);
    write_bytes(p, "x", 1);
    job_for(&job, "mlp", "mnist", p);
    DT_CHECK_CONTAINS(open_fails(&job), "labels");
}

/* ---- synthetic ---------------------------------------------------------------------------- */

static void test_synthetic_vectors(void)
{
    dt_job job;
    job_for(&job, "mlp", "synthetic", NULL);
    job.synthetic_samples = 2000;
    job.synthetic_dim = 16;
    job.synthetic_classes = 5;
    dt_data *d = NULL, *d2 = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_REQUIRE_OK(dt_data_open(&d2, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_VECTOR);
    DT_CHECK_INT(d->shape.input_dim, 16);
    DT_CHECK_INT(d->shape.n_classes, 5);
    DT_CHECK_INT(dt_dataset_size(d->train), 1800);
    DT_CHECK_INT(dt_dataset_size(d->val), 200);
    dt_batch_buf a, b;
    DT_REQUIRE_OK(dt_batch_buf_init(&a, &d->shape, 100, &err), &err);
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 100, &err), &err);
    int count[5] = {0};
    for (int k = 0; k < 18; k++) {
        int64_t idx[100];
        for (int i = 0; i < 100; i++)
            idx[i] = k * 100 + i;
        DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 100, &a, &err), &err);
        DT_REQUIRE_OK(dt_dataset_fill(d2->train, idx, 100, &b, &err), &err);
        DT_CHECK(!memcmp(a.x, b.x, sizeof(float) * 100 * 16));
        DT_CHECK(!memcmp(a.targets, b.targets, sizeof(int32_t) * 100));
        for (int i = 0; i < 100; i++) {
            DT_REQUIRE(a.targets[i] >= 0 && a.targets[i] < 5);
            count[a.targets[i]]++;
        }
    }
    /* the teacher's biases balance the classes: none below half its share */
    for (int c = 0; c < 5; c++)
        DT_CHECK_MSG(count[c] > 1800 / 5 / 2, "class %d has %d of 1800 samples", c, count[c]);
    /* the same index in val differs from train (a different sample) */
    int64_t i0 = 0;
    DT_REQUIRE_OK(dt_dataset_fill(d->val, &i0, 1, &b, &err), &err);
    DT_REQUIRE_OK(dt_dataset_fill(d->train, &i0, 1, &a, &err), &err);
    DT_CHECK(memcmp(a.x, b.x, sizeof(float) * 16) != 0);
    dt_data_free(d2);
    /* another seed, other data */
    job.seed = 7;
    DT_REQUIRE_OK(dt_data_open(&d2, &job, &err), &err);
    DT_REQUIRE_OK(dt_dataset_fill(d2->train, &i0, 1, &b, &err), &err);
    DT_CHECK(memcmp(a.x, b.x, sizeof(float) * 16) != 0);
    dt_batch_buf_free(&a);
    dt_batch_buf_free(&b);
    dt_data_free(d);
    dt_data_free(d2);
}

static void test_synthetic_images_and_tokens(void)
{
    dt_job job;
    job_for(&job, "resnet", "synthetic", NULL);
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_job_set(&job, "data.synthetic_shape=3x16x12", &err), &err);
    job.synthetic_classes = 4;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_IMAGE);
    DT_CHECK_INT(d->shape.channels, 3);
    DT_CHECK_INT(d->shape.height, 16);
    DT_CHECK_INT(d->shape.width, 12);
    DT_CHECK_INT(d->shape.input_dim, 3 * 16 * 12);
    DT_CHECK_INT(d->shape.n_classes, 4);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 8, &err), &err);
    int64_t idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 8, &b, &err), &err);
    double sum = 0;
    for (int i = 0; i < 8; i++) {
        DT_CHECK(b.targets[i] >= 0 && b.targets[i] < 4);
        for (int k = 0; k < 3 * 16 * 12; k++)
            sum += b.x[i * 576 + k];
    }
    DT_CHECK(isfinite(sum));
    dt_batch_buf_free(&b);
    dt_data_free(d);

    DT_CHECK(dt_job_set(&job, "data.synthetic_shape=3x32", &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "must be vector or CxHxW");
    job.synthetic_shape[2] = 0; /* a struct filled otherwise: the data still checks it */
    DT_CHECK_CONTAINS(open_fails(&job), "synthetic_shape");

    job_for(&job, "gpt", "synthetic", NULL);
    job.seq_len = 32;
    job.vocab_size = 64;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK_INT(d->shape.kind, DT_SAMPLE_TOKENS);
    DT_CHECK_INT(d->shape.vocab_size, 64);
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 8, &err), &err);
    DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 8, &b, &err), &err);
    /* the successor structure: targets follow inputs, tokens in the vocabulary */
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 32; t++) {
            DT_CHECK(b.tokens[i * 32 + t] >= 0 && b.tokens[i * 32 + t] < 64);
            if (t + 1 < 32)
                DT_CHECK_INT(b.targets[i * 32 + t], b.tokens[i * 32 + t + 1]);
        }
    dt_batch_buf_free(&b);
    dt_data_free(d);
}

/* ---- the sampler -------------------------------------------------------------------------- */

/* Runs `steps` steps of every rank of a world of W; marks seen[idx]++. */
static void run_world(int64_t n, int W, int B, bool shuffle, bool drop_last, int64_t *epoch,
                      int64_t *pos, int steps, int *seen, int64_t count_epoch)
{
    dt_err err = {0};
    int64_t e = 0, p = 0;
    for (int r = 0; r < W; r++) {
        dt_sampler s;
        DT_REQUIRE_OK(dt_sampler_init(&s, n, r, W, B, 42, shuffle, drop_last, &err), &err);
        dt_sampler_set_state(&s, *epoch, *pos);
        int64_t idx[64];
        for (int k = 0; k < steps; k++) {
            DT_REQUIRE_OK(dt_sampler_next(&s, idx, &err), &err);
            for (int j = 0; j < B; j++) {
                DT_REQUIRE(idx[j] >= 0 && idx[j] < n);
                if (s.epoch == count_epoch)
                    seen[idx[j]]++;
            }
        }
        if (r == 0) {
            e = s.epoch;
            p = s.pos;
        } else {
            DT_CHECK_INT(s.epoch, e);
            DT_CHECK_INT(s.pos, p);
        }
        dt_sampler_free(&s);
    }
    *epoch = e;
    *pos = p;
}

/* ---- masked-LM samples (bert) -------------------------------------------------------------- */

/* Random bytes in a file; the job of bert on it. */
static uint8_t *mlm_text(dt_job *job, size_t n, int T, bool nsp, const char *name)
{
    uint8_t *text = malloc(n);
    DT_REQUIRE(text);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        text[i] = (uint8_t)(x >> 24);
    }
    const char *path = tmp_path(name);
    write_bytes(path, text, n);
    job_for(job, "bert", "text", path);
    job->seq_len = T;
    job->nsp = nsp;
    job->val_fraction = 0;
    return text;
}

/* Checks sample row i of b (dataset index idx) against the text: [CLS] a [SEP] (b [SEP]),
 * exactly k targets, each the original token, its input [MASK], a random byte or kept, every
 * other position the original. Counts the masked inputs by kind into how[3]. b_from: where the
 * second segment's bytes start in the text (nsp). */
static void check_mlm_row(const dt_batch *bt, int i, const uint8_t *text, int64_t idx, int T,
                          bool nsp, int64_t b_from, int *how)
{
    const int V = 256, la = nsp ? (T - 3) / 2 : T - 2, lb = nsp ? T - 3 - la : 0;
    const int32_t *tok = bt->tokens + (size_t)i * T, *tgt = bt->targets + (size_t)i * T;
    DT_CHECK_INT(tok[0], V + 1);
    DT_CHECK_INT(tok[la + 1], V + 2);
    DT_CHECK_INT(tok[T - 1], V + 2);
    int masked = 0, content = T - 2 - nsp;
    for (int t = 0; t < T; t++) {
        DT_CHECK_INT(bt->mask[(size_t)i * T + t], 1);
        DT_CHECK_INT(bt->types[(size_t)i * T + t], nsp && t >= la + 2);
        int32_t orig = t == 0 || t == la + 1 || t == T - 1 ? -1
                       : t <= la                           ? text[idx * T + t - 1]
                                                           : text[b_from + t - la - 2];
        if (tgt[t] < 0) {
            if (orig >= 0)
                DT_CHECK_MSG(tok[t] == orig, "sample %lld position %d: %d, the text has %d",
                             (long long)idx, t, tok[t], orig);
            continue;
        }
        masked++;
        DT_CHECK_MSG(orig >= 0 && tgt[t] == orig, "sample %lld position %d: target %d, text %d",
                     (long long)idx, t, tgt[t], orig);
        how[tok[t] == V + 3 ? 0 : tok[t] == orig ? 2 : 1]++;
        DT_CHECK(tok[t] == V + 3 || (tok[t] >= 0 && tok[t] < V));
    }
    int want = (int)lround(0.15 * content);
    DT_CHECK_MSG(masked == (want < 1 ? 1 : want), "sample %lld: %d masked of %d, want %d",
                 (long long)idx, masked, content, want);
    (void)lb;
}

/* Without NSP: [CLS] the sample's first T-2 bytes [SEP], 15% masked exactly (80/10/10 over many
 * samples), vocabulary 256 + 4; the masking a function of (seed, sample, position): the same
 * sample in other batches, at another position of a batch, in another process is the same bits;
 * another seed masks other positions. */
static void test_mlm_samples(void)
{
    enum { T = 34, N = 64 * 1024 };
    dt_job job;
    uint8_t *text = mlm_text(&job, N, T, false, "mlm.txt");
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK(d->shape.mlm);
    DT_CHECK_INT(d->shape.vocab_size, 260);
    DT_CHECK_CONTAINS(d->desc, "masked-LM");
    const int64_t n = dt_dataset_size(d->train);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 64, &err), &err);
    int how[3] = {0};
    int64_t idx[64];
    for (int64_t at = 0; at + 64 <= n; at += 64) {
        for (int i = 0; i < 64; i++)
            idx[i] = at + i;
        DT_REQUIRE_OK(dt_dataset_fill(d->train, idx, 64, &b, &err), &err);
        DT_CHECK(b.batch.labels == NULL && b.batch.types && b.batch.mask);
        for (int i = 0; i < 64; i++)
            check_mlm_row(&b.batch, i, text, idx[i], T, false, 0, how);
    }
    const double all = how[0] + how[1] + how[2];
    printf("    %d masked positions: %.3f [MASK], %.3f random, %.3f kept\n", (int)all,
           how[0] / all, how[1] / all, how[2] / all);
    DT_CHECK(all > 8000);
    DT_CHECK_MSG(fabs(how[0] / all - 0.8) < 0.02 && fabs(how[1] / all - 0.1) < 0.015 &&
                     fabs(how[2] / all - 0.1) < 0.015,
                 "[MASK] %.3f, random %.3f, kept %.3f (want 0.8, 0.1, 0.1)", how[0] / all,
                 how[1] / all, how[2] / all);
    /* the same sample, wherever it is drawn: bit for bit */
    int32_t row[2][3 * T];
    int64_t a[2] = {7, 3}, c[3] = {9, 3, 7};
    DT_REQUIRE_OK(dt_dataset_fill(d->train, a, 2, &b, &err), &err);
    memcpy(row[0], b.batch.tokens, sizeof(int32_t) * T);      /* 7 */
    memcpy(row[0] + T, b.batch.targets, sizeof(int32_t) * T); /* 7 */
    DT_REQUIRE_OK(dt_dataset_fill(d->train, c, 3, &b, &err), &err);
    DT_CHECK(!memcmp(row[0], b.batch.tokens + 2 * T, sizeof(int32_t) * T));
    DT_CHECK(!memcmp(row[0] + T, b.batch.targets + 2 * T, sizeof(int32_t) * T));
    dt_data_free(d);
    /* a fresh open (another process, a resumed job): the same; another seed: other positions */
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_REQUIRE_OK(dt_dataset_fill(d->train, a, 1, &b, &err), &err);
    DT_CHECK(!memcmp(row[0] + T, b.batch.targets, sizeof(int32_t) * T));
    dt_data_free(d);
    job.seed++;
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_REQUIRE_OK(dt_dataset_fill(d->train, a, 1, &b, &err), &err);
    DT_CHECK(memcmp(row[0] + T, b.batch.targets, sizeof(int32_t) * T) != 0);
    dt_batch_buf_free(&b);
    dt_data_free(d);
    free(text);
}

/* With NSP: [CLS] A [SEP] B [SEP], types 0 then 1; label 0: B the bytes after A, label 1: the
 * first bytes of another sample of the split (about half each); 15% of the content masked. */
static void test_mlm_sentence_pairs(void)
{
    enum { T = 41, N = 32 * 1024 };
    dt_job job;
    uint8_t *text = mlm_text(&job, N, T, true, "nsp.txt");
    job.val_fraction = 0.25;
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    const int la = (T - 3) / 2, lb = T - 3 - la;
    const int64_t n = dt_dataset_size(d->train), nv = dt_dataset_size(d->val);
    dt_batch_buf b;
    DT_REQUIRE_OK(dt_batch_buf_init(&b, &d->shape, 1, &err), &err);
    int how[3] = {0}, random = 0, total = 0;
    for (int split = 0; split < 2; split++)
        for (int64_t j = 0; j < (split ? nv : n); j++) {
            const dt_dataset *ds = split ? d->val : d->train;
            const int64_t first = split ? n : 0; /* the validation split is the tail */
            DT_REQUIRE_OK(dt_dataset_fill(ds, &j, 1, &b, &err), &err);
            DT_REQUIRE(b.batch.labels);
            int lbl = b.batch.labels[0];
            DT_REQUIRE(lbl == 0 || lbl == 1);
            int64_t from = (first + j) * T + la; /* is next: the bytes after A */
            if (lbl) { /* the partner: the sample of this split whose first bytes B are */
                int64_t p = -1;
                for (int64_t q = first; q < first + (split ? nv : n) && p < 0; q++) {
                    if (q == first + j)
                        continue;
                    bool same = true;
                    for (int t = 0; t < lb && same; t++)
                        same = b.batch.targets[la + 2 + t] >= 0 ||
                               b.batch.tokens[la + 2 + t] == text[q * T + t];
                    p = same ? q : -1;
                }
                DT_CHECK_MSG(p >= 0, "sample %lld: B is no other sample's start", (long long)j);
                if (p < 0)
                    dt_test_stop();
                from = p * T;
                random++;
            }
            total++;
            check_mlm_row(&b.batch, 0, text, first + j, T, true, from, how);
        }
    DT_CHECK_MSG(fabs((double)random / total - 0.5) < 0.08, "%d of %d pairs random", random,
                 total);
    dt_batch_buf_free(&b);
    dt_data_free(d);
    free(text);
}

static void test_mlm_errors(void)
{
    dt_job job;
    uint8_t *text = mlm_text(&job, 4096, 4, true, "short.txt");
    DT_CHECK_CONTAINS(open_fails(&job), "data.seq_len = 4 is too short");
    job.nsp = false;
    job.seq_len = 2;
    DT_CHECK_CONTAINS(open_fails(&job), "raise data.seq_len");
    free(text);
    /* synthetic tokens as bert samples */
    job_for(&job, "bert", "synthetic", NULL);
    job.seq_len = 16;
    job.vocab_size = 50;
    dt_data *d = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_open(&d, &job, &err), &err);
    DT_CHECK(d->shape.mlm && d->shape.kind == DT_SAMPLE_TOKENS);
    DT_CHECK_INT(d->shape.vocab_size, 54);
    dt_data_free(d);
}

static void test_sampler_disjoint_coverage(void)
{
    enum { N = 103 };
    int seen[N];
    for (int drop = 0; drop < 2; drop++) {
        memset(seen, 0, sizeof seen);
        int64_t e = 0, p = 0;
        dt_sampler s;
        dt_err err = {0};
        DT_REQUIRE_OK(dt_sampler_init(&s, N, 0, 4, 5, 42, true, drop, &err), &err);
        int64_t spe = dt_sampler_steps_per_epoch(&s);
        dt_sampler_free(&s);
        DT_CHECK_INT(spe, drop ? 5 : 6);
        run_world(N, 4, 5, true, drop, &e, &p, (int)spe, seen, 0);
        DT_CHECK_INT(e, 0);
        int once = 0, more = 0;
        for (int i = 0; i < N; i++) {
            once += seen[i] == 1;
            more += seen[i] > 1;
        }
        if (drop) {
            DT_CHECK_INT(once, 100); /* 5 steps x 20, tail of 3 dropped */
            DT_CHECK_INT(more, 0);
        } else {
            /* every sample once; the padding of the last step repeats 17 from the start */
            DT_CHECK_INT(once + more, N);
            DT_CHECK_INT(more, 17);
        }
        /* the next step starts epoch 1 */
        run_world(N, 4, 5, true, drop, &e, &p, 1, seen, -1);
        DT_CHECK_INT(e, 1);
        DT_CHECK_INT(p, 20);
    }
}

static void test_sampler_deterministic_and_shuffled(void)
{
    dt_err err = {0};
    dt_sampler a, b;
    DT_REQUIRE_OK(dt_sampler_init(&a, 1000, 1, 2, 8, 7, true, true, &err), &err);
    DT_REQUIRE_OK(dt_sampler_init(&b, 1000, 1, 2, 8, 7, true, true, &err), &err);
    int64_t x[8], y[8], first[8];
    DT_REQUIRE_OK(dt_sampler_next(&a, first, &err), &err);
    DT_REQUIRE_OK(dt_sampler_next(&b, y, &err), &err);
    DT_CHECK(!memcmp(first, y, sizeof y));
    bool sequential = true;
    for (int j = 0; j < 8; j++)
        sequential &= first[j] == 1 + 2 * j;
    DT_CHECK(!sequential);
    /* epoch 1 is another permutation */
    dt_sampler_set_state(&a, 1, 0);
    DT_REQUIRE_OK(dt_sampler_next(&a, x, &err), &err);
    DT_CHECK(memcmp(first, x, sizeof x) != 0);
    DT_CHECK_INT(a.epoch, 1);
    dt_sampler_free(&a);
    dt_sampler_free(&b);
    /* no shuffle: interleaved in order */
    DT_REQUIRE_OK(dt_sampler_init(&a, 1000, 1, 2, 8, 7, false, true, &err), &err);
    DT_REQUIRE_OK(dt_sampler_next(&a, x, &err), &err);
    for (int j = 0; j < 8; j++)
        DT_CHECK_INT(x[j], 1 + 2 * j);
    dt_sampler_free(&a);
    /* a step larger than the data set with drop_last */
    DT_CHECK(dt_sampler_init(&a, 10, 0, 4, 4, 7, true, true, &err) < 0);
    DT_CHECK_CONTAINS(err.msg, "drop_last");
    /* without drop_last it pads */
    DT_REQUIRE_OK(dt_sampler_init(&a, 10, 3, 4, 4, 7, true, false, &err), &err);
    DT_CHECK_INT(dt_sampler_steps_per_epoch(&a), 1);
    DT_REQUIRE_OK(dt_sampler_next(&a, x, &err), &err);
    dt_sampler_free(&a);
}

static void test_sampler_resume_other_world_size(void)
{
    /* 2 ranks x 6 for 7 steps, then the same epoch on 3 ranks x 6, then on 1 rank x 6 with
     * the state passed along: the epoch still sees every sample at most once. */
    enum { N = 360 };
    int seen[N];
    memset(seen, 0, sizeof seen);
    int64_t e = 0, p = 0;
    run_world(N, 2, 6, true, true, &e, &p, 7, seen, 0);
    DT_CHECK_INT(p, 84);
    run_world(N, 3, 6, true, true, &e, &p, 8, seen, 0);
    DT_CHECK_INT(p, 84 + 144);
    run_world(N, 1, 6, true, true, &e, &p, 22, seen, 0);
    DT_CHECK_INT(e, 0);
    DT_CHECK_INT(p, N);
    for (int i = 0; i < N; i++)
        DT_CHECK_MSG(seen[i] == 1, "sample %d seen %d times", i, seen[i]);
    /* and it is the same order a single world would have used */
    dt_sampler s;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_sampler_init(&s, N, 0, 1, 12, 42, true, true, &err), &err);
    int64_t idx[12];
    for (int k = 0; k < 8; k++)
        DT_REQUIRE_OK(dt_sampler_next(&s, idx, &err), &err);
    dt_sampler a;
    DT_REQUIRE_OK(dt_sampler_init(&a, N, 1, 4, 3, 42, true, true, &err), &err);
    dt_sampler_set_state(&a, 0, 84);
    int64_t idx2[3];
    DT_REQUIRE_OK(dt_sampler_next(&a, idx2, &err), &err);
    /* position 84 + 1 + 4j of the permutation = entries 1, 5, 9 of the 8th single-world step */
    DT_CHECK_INT(idx2[0], idx[1]);
    DT_CHECK_INT(idx2[1], idx[5]);
    DT_CHECK_INT(idx2[2], idx[9]);
    dt_sampler_free(&s);
    dt_sampler_free(&a);
}

static void test_eval_indices(void)
{
    int64_t a[4], b[4];
    dt_eval_indices(10, 0, 2, 4, 0, a);
    dt_eval_indices(10, 1, 2, 4, 0, b);
    int64_t ea[4] = {0, 2, 4, 6}, eb[4] = {1, 3, 5, 7};
    DT_CHECK(!memcmp(a, ea, sizeof a));
    DT_CHECK(!memcmp(b, eb, sizeof b));
    dt_eval_indices(10, 0, 2, 4, 1, a); /* wraps */
    int64_t ea1[4] = {8, 0, 2, 4};
    DT_CHECK(!memcmp(a, ea1, sizeof a));
}

/* ---- the global batch ------------------------------------------------------------------------ */

/* The split of G over W ranks and micro-steps of at most B: every share fits B, the shares add
 * up to G, a rank's micro-steps are a prefix, M is the fewest micro-steps that can hold G, and
 * when W x B x M = G every share is B (the layout of grad_accum = M). */
static void test_gbatch_split(void)
{
    dt_err err = {0};
    int checked = 0;
    for (int W = 1; W <= 7; W++)
        for (int B = 1; B <= 9; B++)
            for (int64_t G = W; G <= 80; G++) {
                dt_gbatch g;
                DT_REQUIRE_OK(dt_gbatch_init(&g, G, W, B, &err), &err);
                int64_t per = (int64_t)W * B;
                DT_CHECK_INT(g.micro_steps, (G + per - 1) / per);
                int64_t total = 0, off = 0;
                for (int m = 0; m < g.micro_steps; m++) {
                    DT_CHECK_INT(dt_gbatch_micro_offset(&g, m), off);
                    int64_t gm = 0;
                    for (int r = 0; r < W; r++) {
                        int c = dt_gbatch_rank_count(&g, m, r);
                        DT_CHECK_MSG(c >= 0 && c <= B, "G=%lld W=%d B=%d m=%d r=%d: %d",
                                     (long long)G, W, B, m, r, c);
                        /* a prefix: nothing after a micro-step without samples */
                        DT_CHECK(c > 0 || m >= dt_gbatch_rank_micro_steps(&g, r));
                        DT_CHECK(c == 0 || m < dt_gbatch_rank_micro_steps(&g, r));
                        if (G == per * g.micro_steps)
                            DT_CHECK_INT(c, B);
                        if (B > 1 || G % W == 0) /* then every rank runs every micro-step */
                            DT_CHECK_MSG(c > 0, "G=%lld W=%d B=%d: rank %d has nothing in "
                                         "micro-step %d", (long long)G, W, B, r, m);
                        gm += c;
                    }
                    DT_CHECK_INT(gm, dt_gbatch_micro_size(&g, m));
                    /* even (sizes differ by at most one), or full but the last (B = 1) */
                    int64_t g0 = dt_gbatch_micro_size(&g, 0);
                    if (B > 1)
                        DT_CHECK(gm == g0 || gm == g0 - 1);
                    else if (m < g.micro_steps - 1)
                        DT_CHECK_INT(gm, W);
                    off += gm;
                    total += gm;
                }
                DT_CHECK_INT(total, G);
                int64_t by_rank = 0;
                for (int r = 0; r < W; r++) {
                    int64_t n = dt_gbatch_rank_samples(&g, r);
                    DT_CHECK(n >= 1); /* G >= W: every rank has a sample */
                    by_rank += n;
                }
                DT_CHECK_INT(by_rank, G);
                checked++;
            }
    DT_CHECK(checked > 1000);
    /* the case: 24 over 2 ranks of 8: micro-steps of 12 and 12, 6 per rank each */
    dt_gbatch g;
    DT_REQUIRE_OK(dt_gbatch_init(&g, 24, 2, 8, &err), &err);
    DT_CHECK_INT(g.micro_steps, 2);
    DT_CHECK_INT(dt_gbatch_rank_count(&g, 0, 1), 6);
    DT_CHECK_INT(dt_gbatch_rank_count(&g, 1, 0), 6);
    DT_CHECK_INT(dt_gbatch_micro_offset(&g, 1), 12);
    /* unequal shares: 23 over 3 ranks of 5: micro-steps of 12 and 11; 8, 8, 7 per rank */
    DT_REQUIRE_OK(dt_gbatch_init(&g, 23, 3, 5, &err), &err);
    DT_CHECK_INT(g.micro_steps, 2);
    DT_CHECK_INT(dt_gbatch_micro_size(&g, 1), 11);
    DT_CHECK_INT(dt_gbatch_rank_samples(&g, 0), 8);
    DT_CHECK_INT(dt_gbatch_rank_samples(&g, 2), 7);
    /* 24 over 5 ranks of 4: 12 and 12, every rank in both (3, 3, 2, 2, 2 each) */
    DT_REQUIRE_OK(dt_gbatch_init(&g, 24, 5, 4, &err), &err);
    DT_CHECK_INT(dt_gbatch_rank_micro_steps(&g, 4), 2);
    DT_CHECK_INT(dt_gbatch_rank_count(&g, 1, 4), 2);
    /* batch 1: 4 over 3 ranks: 3 then 1 (an even 2 + 2 would leave rank 2 nothing) */
    DT_REQUIRE_OK(dt_gbatch_init(&g, 4, 3, 1, &err), &err);
    DT_CHECK_INT(dt_gbatch_micro_size(&g, 0), 3);
    DT_CHECK_INT(dt_gbatch_rank_micro_steps(&g, 0), 2);
    DT_CHECK_INT(dt_gbatch_rank_micro_steps(&g, 2), 1);
    /* 3 over 2 ranks of 1: rank 1 runs one micro-step, rank 0 two */
    DT_REQUIRE_OK(dt_gbatch_init(&g, 3, 2, 1, &err), &err);
    DT_CHECK_INT(dt_gbatch_rank_micro_steps(&g, 0), 2);
    DT_CHECK_INT(dt_gbatch_rank_micro_steps(&g, 1), 1);
    /* fewer samples than ranks: an error that says what to change */
    DT_CHECK(dt_gbatch_init(&g, 3, 4, 8, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "train.global_batch = 3 is smaller than the 4 data-parallel ranks");
    DT_CHECK_CONTAINS(err.msg, "raise train.global_batch to at least 4");
}

/* One step of every rank of a world W in global-batch mode: the union of the ranks' indices. */
static void gbatch_world_step(int64_t n, int W, int B, int64_t G, bool shuffle, bool drop_last,
                              int64_t *epoch, int64_t *pos, int64_t *out, int64_t *nout)
{
    dt_err err = {0};
    int64_t e = 0, p = 0;
    *nout = 0;
    for (int r = 0; r < W; r++) {
        dt_sampler s;
        dt_gbatch g;
        DT_REQUIRE_OK(dt_sampler_init(&s, n, r, W, B, 42, shuffle, drop_last, &err), &err);
        DT_REQUIRE_OK(dt_gbatch_init(&g, G, W, B, &err), &err);
        DT_REQUIRE_OK(dt_sampler_set_global(&s, &g, &err), &err);
        dt_sampler_set_state(&s, *epoch, *pos);
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)(g.micro_steps * B));
        DT_REQUIRE(idx);
        DT_REQUIRE_OK(dt_sampler_next_step(&s, idx, &err), &err);
        int64_t k = dt_gbatch_rank_samples(&g, r);
        memcpy(out + *nout, idx, sizeof(int64_t) * (size_t)k);
        *nout += k;
        e = s.epoch;
        p = s.pos;
        free(idx);
        dt_sampler_free(&s);
    }
    *epoch = e;
    *pos = p;
}

/* Over an epoch, whatever the world size (and the world changing between steps), every step
 * takes exactly G samples, the position moves by exactly G, and no sample is skipped or seen
 * twice; with drop_last the tail shorter than G is dropped, without it the last step is
 * completed from the start of the same order. Each world's step is the same set of samples. */
static void test_sampler_global_batch_coverage(void)
{
    const int64_t N = 101, G = 24;
    const int worlds[] = {1, 2, 3, 5, 2, 4, 1};
    for (int drop = 0; drop <= 1; drop++) {
        int64_t epoch = 0, pos = 0;
        int seen[101] = {0};
        int64_t steps = drop ? N / G : (N + G - 1) / G;
        for (int64_t st = 0; st < steps; st++) {
            int64_t out[64], nout = 0, ref[64], nref = 0;
            int W = worlds[st % (int64_t)DT_ARRAY_LEN(worlds)];
            int B = 3 + (int)st % 4;
            int64_t e0 = epoch, p0 = pos;
            /* the reference: one rank drawing the whole step */
            int64_t re = epoch, rp = pos;
            gbatch_world_step(N, 1, (int)G, G, true, drop, &re, &rp, ref, &nref);
            gbatch_world_step(N, W, B, G, true, drop, &epoch, &pos, out, &nout);
            DT_CHECK_INT(nout, G);
            DT_CHECK_INT(epoch, 0);
            DT_CHECK_INT(pos, p0 + G);
            DT_CHECK_INT(re, e0);
            DT_CHECK_INT(rp, pos);
            /* the same samples as the one rank's step (in another order) */
            int a[101] = {0};
            for (int64_t i = 0; i < nref; i++)
                a[ref[i]]++;
            for (int64_t i = 0; i < nout; i++)
                a[out[i]]--;
            for (int i = 0; i < N; i++)
                DT_CHECK_MSG(a[i] == 0, "step %lld W=%d: sample %d differs", (long long)st, W, i);
            for (int64_t i = 0; i < nout; i++)
                seen[out[i]]++;
        }
        int once = 0, twice = 0;
        for (int i = 0; i < N; i++) {
            once += seen[i] == 1;
            twice += seen[i] == 2;
            DT_CHECK(seen[i] <= 2);
        }
        if (drop) { /* 4 steps of 24 = 96 distinct samples, the last 5 dropped */
            DT_CHECK_INT(once, 96);
            DT_CHECK_INT(twice, 0);
        } else { /* 5 steps = 120 draws: all 101, the first 19 of the order twice (padding) */
            DT_CHECK_INT(once, 101 - 19);
            DT_CHECK_INT(twice, 19);
        }
        /* the next step starts the next epoch */
        int64_t out[64], nout = 0;
        gbatch_world_step(N, 3, 5, G, true, drop, &epoch, &pos, out, &nout);
        DT_CHECK_INT(epoch, 1);
        DT_CHECK_INT(pos, G);
    }
    /* With W x B x M = G the step is exactly M plain micro-steps of the plain sampler, rank by
     * rank: a global batch that divides evenly changes nothing but how it is said. */
    dt_err err = {0};
    for (int r = 0; r < 2; r++) {
        dt_sampler a, b;
        dt_gbatch g;
        DT_REQUIRE_OK(dt_sampler_init(&a, 1000, r, 2, 4, 9, true, true, &err), &err);
        DT_REQUIRE_OK(dt_sampler_init(&b, 1000, r, 2, 4, 9, true, true, &err), &err);
        DT_REQUIRE_OK(dt_gbatch_init(&g, 24, 2, 4, &err), &err);
        DT_REQUIRE_OK(dt_sampler_set_global(&b, &g, &err), &err);
        DT_CHECK_INT(dt_sampler_steps_per_epoch(&b), 1000 / 24);
        /* 1000 = 41 x 24 + 16: the plain sampler starts epoch 1 within step 42 (its third
         * micro-step would pass the end), the global batch at step 42's start (the step would) */
        for (int st = 0; st < 41; st++) {
            int64_t x[12], y[12];
            for (int m = 0; m < 3; m++)
                DT_REQUIRE_OK(dt_sampler_next(&a, x + 4 * m, &err), &err);
            DT_REQUIRE_OK(dt_sampler_next_step(&b, y, &err), &err);
            for (int i = 0; i < 12; i++)
                DT_CHECK_INT(y[i], x[i]);
            DT_CHECK_INT(b.pos, a.pos);
            DT_CHECK_INT(b.epoch, a.epoch);
        }
        int64_t y[12];
        DT_REQUIRE_OK(dt_sampler_next_step(&b, y, &err), &err);
        DT_CHECK_INT(b.epoch, 1);
        DT_CHECK_INT(b.pos, 24);
        dt_sampler_free(&a);
        dt_sampler_free(&b);
    }
    /* with drop_last an epoch must hold one step */
    dt_sampler s;
    dt_gbatch g;
    DT_REQUIRE_OK(dt_sampler_init(&s, 20, 0, 2, 8, 9, true, true, &err), &err);
    DT_REQUIRE_OK(dt_gbatch_init(&g, 24, 2, 8, &err), &err);
    DT_CHECK(dt_sampler_set_global(&s, &g, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "fewer than one step needs (train.global_batch = 24)");
    int64_t x[16];
    DT_CHECK(dt_sampler_next_step(&s, x, &err) == -EINVAL); /* not in global mode */
    dt_sampler_free(&s);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"text_reader", test_text_reader, 0},
        {"text_errors", test_text_errors, 0},
        {"token_shards", test_token_shards, 0},
        {"token_shard_errors", test_token_shard_errors, 0},
        {"cifar", test_cifar, 0},
        {"cifar_errors", test_cifar_errors, 0},
        {"mnist", test_mnist, 0},
        {"mnist_errors", test_mnist_errors, 0},
        {"synthetic_vectors", test_synthetic_vectors, 0},
        {"synthetic_images_and_tokens", test_synthetic_images_and_tokens, 0},
        {"mlm_samples", test_mlm_samples, 0},
        {"mlm_sentence_pairs", test_mlm_sentence_pairs, 0},
        {"mlm_errors", test_mlm_errors, 0},
        {"sampler_disjoint_coverage", test_sampler_disjoint_coverage, 0},
        {"sampler_deterministic_and_shuffled", test_sampler_deterministic_and_shuffled, 0},
        {"sampler_resume_other_world_size", test_sampler_resume_other_world_size, 0},
        {"eval_indices", test_eval_indices, 0},
        {"gbatch_split", test_gbatch_split, 0},
        {"sampler_global_batch_coverage", test_sampler_global_batch_coverage, 0},
    };
    return dt_test_main("test_data", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
