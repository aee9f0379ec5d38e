/* test_ckpt.c - checkpoints: XXH64, the safetensors writer and reader, atomic saves, retention,
 * discovery past damaged checkpoints, full disks (a real tmpfs, and injected ENOSPC through the
 * system call table), and the `dtrain ckpt` tools against a standard-library Python reader.
 *
 * These tests use a small fake model (a few named tensors in flat host buffers, as
 * runtime/train/models/model.h lays them out) so they need neither the model zoo nor a worker. The
 * end-to-end tests that drive `dtrain worker` and the launcher are in test_ckpt_e2e.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/train/ckpt/ckpt.h"
#include "runtime/comm/comm.h"
#include "runtime/train/ckpt/safetensors.h"
#include "runtime/train/ckpt/xxh64.h"
#include "tests/harness.h"

/* ================================================================================ helpers === */

static char *path_in(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *path_in(const char *fmt, ...)
{
    static char bufs[8][4096];
    static int k;
    char rel[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    char *b = bufs[k++ % 8];
    snprintf(b, 4096, "%s/%s", dt_test_tmpdir(), rel);
    return b;
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* stderr into a file for a while, to check what was logged. */
static int saved_stderr = -1;
static void capture_start(void)
{
    fflush(stderr);
    saved_stderr = dup(2);
    int fd = open(path_in("stderr.txt"), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(void)
{
    char *text = NULL;
    size_t len;
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    if (dt_read_file(path_in("stderr.txt"), &text, &len, NULL) != 0)
        text = strdup("");
    fprintf(stderr, "%s", text); /* keep it visible in the test log */
    return text;
}

static char *run(const char *cmd, int *code)
{
    char *out = NULL;
    *code = dt_test_run(cmd, &out, 60);
    return out ? out : strdup("");
}

/* A fake model: parameters (4 tensors), a buffer (running statistics), AdamW moments. */
typedef struct fake {
    dt_tensor_info pt[4], bt[1];
    float *params, *bufs, *m, *v;
    size_t np, nb;
    dt_ckpt_buf cb[4];
} fake;

static void set_tensor(dt_tensor_info *t, const char *name, size_t *off, int ndim, int64_t d0,
                       int64_t d1)
{
    memset(t, 0, sizeof *t);
    dt_strlcpy(t->name, name, sizeof t->name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    t->offset = *off;
    *off += t->numel;
}

/* width scales every tensor (another width = a foreign model). */
static void fake_init(fake *f, int width)
{
    memset(f, 0, sizeof *f);
    size_t off = 0;
    set_tensor(&f->pt[0], "wte", &off, 2, 64, width);
    set_tensor(&f->pt[1], "h.0.mlp.weight", &off, 2, width, width);
    set_tensor(&f->pt[2], "h.0.mlp.bias", &off, 1, width, 0);
    set_tensor(&f->pt[3], "ln_f.weight", &off, 1, width, 0);
    f->np = off;
    off = 0;
    set_tensor(&f->bt[0], "bn.running_mean", &off, 1, width, 0);
    f->nb = off;
    f->params = calloc(f->np, 4);
    f->m = calloc(f->np, 4);
    f->v = calloc(f->np, 4);
    f->bufs = calloc(f->nb, 4);
    f->cb[0] = (dt_ckpt_buf){"model", "", f->pt, 4, f->params, f->np, false};
    /* running statistics change in the forward pass: copied at save even when concurrent */
    f->cb[1] = (dt_ckpt_buf){"model", "", f->bt, 1, f->bufs, f->nb, true};
    f->cb[2] = (dt_ckpt_buf){"optim", "exp_avg.", f->pt, 4, f->m, f->np, false};
    f->cb[3] = (dt_ckpt_buf){"optim", "exp_avg_sq.", f->pt, 4, f->v, f->np, false};
}

static void fake_fill(fake *f, uint64_t seed)
{
    dt_rng r;
    dt_rng_seed(&r, seed);
    dt_rng_fill_normal(&r, f->params, f->np, 0, 1);
    dt_rng_fill_normal(&r, f->m, f->np, 0, 1);
    dt_rng_fill_normal(&r, f->v, f->np, 0, 1);
    dt_rng_fill_normal(&r, f->bufs, f->nb, 0, 1);
}

static void fake_zero(fake *f)
{
    memset(f->params, 0, f->np * 4);
    memset(f->m, 0, f->np * 4);
    memset(f->v, 0, f->np * 4);
    memset(f->bufs, 0, f->nb * 4);
}

static bool fake_equal(const fake *a, const fake *b)
{
    return a->np == b->np && !memcmp(a->params, b->params, a->np * 4) &&
           !memcmp(a->m, b->m, a->np * 4) && !memcmp(a->v, b->v, a->np * 4) &&
           !memcmp(a->bufs, b->bufs, a->nb * 4);
}

static void fake_free(fake *f)
{
    free(f->params);
    free(f->m);
    free(f->v);
    free(f->bufs);
}

static dt_ckpt *open_ckpt(fake *f, const char *dir, int keep, bool async)
{
    dt_ckpt *c = NULL;
    dt_err err = {0};
    dt_ckpt_opts o = {.dir = dir, .keep = keep, .async = async};
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, f->cb, 4, &err), &err);
    return c;
}

static void state_for(dt_ckpt_state *st, int64_t step)
{
    dt_ckpt_state_init(st);
    st->step = step;
    st->epoch = step / 10;
    st->sample_pos = step * 32 % 320;
    st->samples_seen = step * 32;
    st->world_size = 2;
    st->loss = 5.0 / (double)(step + 1);
    st->lr = 3e-4;
    dt_strlcpy(st->run_id, "test-run", sizeof st->run_id);
    dt_rng r;
    dt_rng_seed(&r, (uint64_t)step);
    dt_ckpt_state_set_rng(st, "data", &r);
    dt_ckpt_state_set_scalar(st, "optim.t", (double)step);
    dt_ckpt_state_set_scalar(st, "sched.warmup", 0.1);
    st->job = "[job]\nname = test\n\n[model]\ntype = mlp\n";
}

/* Saves step with data from seed, waits, and requires success. */
static void save_step(dt_ckpt *c, fake *f, int64_t step)
{
    dt_ckpt_state st;
    dt_err err = {0};
    fake_fill(f, (uint64_t)step);
    state_for(&st, step);
    DT_REQUIRE_OK(dt_ckpt_save(c, &st, &err), &err);
    DT_REQUIRE_OK(dt_ckpt_wait(c, &err), &err);
}

static int count_tmp_dirs(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strstr(de->d_name, ".tmp") != NULL || strstr(de->d_name, ".old") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* ================================================================================= xxh64 === */

static void test_xxh64_vectors(void)
{
    /* The reference values of the xxHash specification, seed 0 (and the sanity buffer of the
     * reference test suite for longer inputs and a non-zero seed). */
    DT_CHECK(dt_xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL);
    DT_CHECK(dt_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
    DT_CHECK(dt_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
    DT_CHECK(dt_xxh64("asdf", 4, 0) == 0x415872f599cea71eULL);
    DT_CHECK(dt_xxh64("Call me Ishmael.", 16, 0) == 0x6d04390fc9d61a90ULL);
    const char *nob = "Nobody inspects the spammish repetition";
    DT_CHECK(dt_xxh64(nob, strlen(nob), 0) == 0xFBCEA83C8A378BF1ULL);
    unsigned char sanity[101];
    uint32_t gen = 2654435761U; /* the generator of xxhsum's sanity check (0.6 era) */
    for (int i = 0; i < 101; i++) {
        sanity[i] = (unsigned char)(gen >> 24);
        gen *= gen;
    }
    const uint64_t prime = 2654435761U;
    DT_CHECK(dt_xxh64(NULL, 0, prime) == 0xAC75FDA2929B17EFULL);
    DT_CHECK(dt_xxh64(sanity, 1, 0) == 0x4FCE394CC88952D8ULL);
    DT_CHECK(dt_xxh64(sanity, 1, prime) == 0x739840CB819FA723ULL);
    DT_CHECK(dt_xxh64(sanity, 14, 0) == 0xCFFA8DB881BC3A3DULL);
    DT_CHECK(dt_xxh64(sanity, 14, prime) == 0x5B9611585EFCC9CBULL);
    DT_CHECK(dt_xxh64(sanity, 101, 0) == 0x0EAB543384F878ADULL);
    /* Streaming: every split of the input gives the one-shot result. */
    uint64_t whole = dt_xxh64(sanity, 101, 7);
    for (size_t cut = 0; cut <= 101; cut += 3) {
        dt_xxh64_state s;
        dt_xxh64_init(&s, 7);
        dt_xxh64_update(&s, sanity, cut);
        for (size_t i = cut; i < 101; i++)
            dt_xxh64_update(&s, sanity + i, 1);
        DT_CHECK(dt_xxh64_digest(&s) == whole);
    }
}

/* =========================================================================== safetensors === */

static void test_st_header_bytes(void)
{
    /* What the reference writer produces for these tensors: I64 sorts before F32 (widest dtype
     * first), compact JSON, "__metadata__" first, padded with spaces to 8 bytes. */
    int64_t a = 7;
    float b[2] = {1.5f, -2.0f};
    dt_st_tensor t[2] = {{.name = "b", .dtype = DT_ST_F32, .ndim = 1, .shape = {2}, .data = b},
                         {.name = "a", .dtype = DT_ST_I64, .ndim = 0, .data = &a}};
    dt_st_kv meta[] = {{"format", "pt"}};
    char *h = NULL;
    size_t hl = 0;
    uint64_t dl = 0;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_st_layout(t, 2, meta, 1, &h, &hl, &dl, &err), &err);
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
    size_t jl = strlen(json), padded = (jl + 8 + 7) / 8 * 8 - 8;
    DT_CHECK_INT(hl, 8 + padded);
    DT_CHECK_INT(hl % 8, 0);
    DT_CHECK_INT(dl, 16);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = (n << 8) | (unsigned char)h[k];
    DT_CHECK_INT(n, padded);
    DT_CHECK(memcmp(h + 8, json, jl) == 0);
    for (size_t i = 8 + jl; i < hl; i++)
        DT_CHECK(h[i] == ' ');
    free(h);

    /* Names with characters JSON escapes. */
    float one = 1;
    dt_st_tensor q = {.name = "we\"ird\\name\n", .dtype = DT_ST_F32, .ndim = 1, .shape = {1},
                      .data = &one};
    DT_REQUIRE_OK(dt_st_layout(&q, 1, NULL, 0, &h, &hl, &dl, &err), &err);
    DT_CHECK_CONTAINS(h + 8, "{\"we\\\"ird\\\\name\\n\":{\"dtype\"");
    free(h);

    /* The writer refuses what the format cannot hold. */
    dt_st_tensor dup[2] = {{.name = "x", .dtype = DT_ST_F32, .ndim = 1, .shape = {1}, .data = b},
                           {.name = "x", .dtype = DT_ST_F32, .ndim = 1, .shape = {1}, .data = b}};
    DT_CHECK(dt_st_layout(dup, 2, NULL, 0, &h, &hl, &dl, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "two tensors are called \"x\"");
    dt_st_tensor neg = {.name = "n", .dtype = DT_ST_F32, .ndim = 1, .shape = {-1}};
    DT_CHECK(dt_st_layout(&neg, 1, NULL, 0, &h, &hl, &dl, &err) == -EINVAL);
    dt_st_tensor odd = {.name = "f4", .dtype = DT_ST_F4, .ndim = 1, .shape = {3}};
    DT_CHECK(dt_st_layout(&odd, 1, NULL, 0, &h, &hl, &dl, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "whole number of bytes");
}

static void test_st_roundtrip(void)
{
    uint16_t h16[6] = {1, 2, 3, 4, 5, 6};
    double d[3] = {1.0 / 3, -0.0, 1e300};
    uint8_t flags[5] = {1, 0, 1, 1, 0};
    float empty[1];
    dt_st_tensor t[4] = {
        {.name = "half", .dtype = DT_ST_BF16, .ndim = 2, .shape = {2, 3}, .data = h16},
        {.name = "dbl", .dtype = DT_ST_F64, .ndim = 1, .shape = {3}, .data = d},
        {.name = "flags", .dtype = DT_ST_BOOL, .ndim = 1, .shape = {5}, .data = flags},
        {.name = "empty", .dtype = DT_ST_F32, .ndim = 2, .shape = {0, 4}, .data = empty},
    };
    dt_st_kv meta[] = {{"format", "pt"}, {"note", "ü \"quoted\""}};
    dt_err err = {0};
    const char *p = path_in("rt.safetensors");
    DT_REQUIRE_OK(dt_st_save(p, t, 4, meta, 2, &err), &err);

    dt_st_file *f = NULL;
    DT_REQUIRE_OK(dt_st_open(p, true, &f, &err), &err);
    DT_CHECK_INT(f->num_tensors, 4);
    DT_CHECK_INT(f->data_offset % 8, 0);
    DT_CHECK_INT(f->data_len, 12 + 24 + 5);
    DT_CHECK_STR(dt_st_meta_get(f, "note"), "ü \"quoted\"");
    DT_CHECK_STR(dt_st_meta_get(f, "format"), "pt");
    const dt_st_tensor *x = dt_st_find(f, "half");
    DT_REQUIRE(x);
    DT_CHECK(x->dtype == DT_ST_BF16 && x->ndim == 2 && x->shape[0] == 2 && x->shape[1] == 3);
    DT_CHECK(memcmp(x->data, h16, 12) == 0);
    x = dt_st_find(f, "dbl");
    DT_REQUIRE(x);
    DT_CHECK(memcmp(x->data, d, 24) == 0);
    x = dt_st_find(f, "empty");
    DT_REQUIRE(x);
    DT_CHECK(x->begin == x->end && x->shape[0] == 0);
    DT_CHECK(dt_st_find(f, "nope") == NULL);
    dt_st_free(f);

    /* Header only. */
    DT_REQUIRE_OK(dt_st_open(p, false, &f, &err), &err);
    DT_CHECK_INT(f->num_tensors, 4);
    DT_CHECK(f->tensors[0].data == NULL);
    dt_st_free(f);
}

/* Builds a file from a header text and a data section of data_len bytes, parses it, and checks
 * the error (want == NULL: must parse). */
static void expect_parse(const char *header, size_t data_len, const char *want)
{
    size_t hn = strlen(header);
    size_t total = 8 + hn + data_len;
    unsigned char *buf = calloc(1, total + 1);
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)(((uint64_t)hn >> (8 * k)) & 0xFF);
    memcpy(buf + 8, header, hn);
    dt_st_file *f = NULL;
    dt_err err = {0};
    int rc = dt_st_parse(buf, total, total, &f, &err);
    if (!want) {
        DT_CHECK_MSG(rc == 0, "header %s: %s", header, err.msg);
    } else {
        DT_CHECK_MSG(rc == -EINVAL, "header %s parsed (rc %d) but should fail with \"%s\"",
                     header, rc, want);
        if (rc)
            DT_CHECK_MSG(strstr(err.msg, want) != NULL, "header %s: \"%s\" lacks \"%s\"",
                         header, err.msg, want);
    }
    dt_st_free(f);
    free(buf);
}

#define T1(shape, off) "{\"x\":{\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":" off "}}"

static void test_st_rejects_malformed(void)
{
    /* Valid ones, to show the checks are not simply rejecting everything. */
    expect_parse("{}", 0, NULL);
    expect_parse("{}      ", 0, NULL);
    expect_parse(T1("[2,2]", "[0,16]"), 16, NULL);
    expect_parse("{\"__metadata__\":{},\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                 0, NULL);
    expect_parse("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4],\"dtype\":\"F32\"}}", 4, NULL);
    expect_parse("{\"\\u00e9\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, NULL);

    /* The header itself. */
    expect_parse(" {}", 0, "does not start with '{'");
    expect_parse("[]", 0, "does not start with '{'");
    expect_parse("{\"x\xff\":{}}", 0, "not valid UTF-8");
    expect_parse("{} x", 0, "unexpected bytes after the header");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}", 4,
                 "expected ',' or '}'");
    expect_parse("{\"a\tb\":{}}", 0, "control character");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}",
                 8, "appears twice");
    expect_parse("{\"__metadata__\":{\"k\":1}}", 0, "must be a string");
    expect_parse("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "appears twice");
    expect_parse("{\"\\ud800\":{}}", 0, "surrogate");
    /* Tensor entries. */
    expect_parse("{\"x\":{\"dtype\":\"F33\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                 "unknown dtype \"F33\"");
    expect_parse("{\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"y\":1}}", 4,
                 "unknown key \"y\"");
    expect_parse("{\"x\":{\"dtype\":\"F32\",\"shape\":[]}}", 0, "lacks one of");
    expect_parse(T1("[2.0]", "[0,8]"), 8, "non-negative integer");
    expect_parse(T1("[-2]", "[0,8]"), 8, "non-negative integer");
    expect_parse(T1("[1e1]", "[0,40]"), 40, "non-negative integer");
    expect_parse(T1("[02]", "[0,8]"), 8, "non-negative integer");
    expect_parse(T1("[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, "too many entries");
    expect_parse(T1("[2]", "[0,4,8]"), 8, "too many entries");
    expect_parse(T1("[2]", "[0]"), 8, "data_offsets must be [BEGIN, END]");
    expect_parse(T1("[18446744073709551615,2]", "[0,8]"), 8, "dimension too large");
    expect_parse(T1("[4294967296,4294967296]", "[0,8]"), 8, "overflows 64 bits");
    expect_parse(T1("[99999999999999999999]", "[0,8]"), 8, "does not fit in 64 bits");
    /* Offsets against sizes and the data section. */
    expect_parse(T1("[2,2]", "[0,12]"), 12, "span 12 bytes but F32 (2, 2) needs 16");
    expect_parse(T1("[2]", "[8,0]"), 8, "end before they begin");
    expect_parse(T1("[2]", "[4,12]"), 12, "hole in the data section");
    expect_parse(T1("[2]", "[0,8]"), 12, "4 bytes after the last tensor");
    expect_parse(T1("[4]", "[0,16]"), 8, "truncated");
    expect_parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 12, "overlaps");

    /* The length prefix. */
    dt_st_file *f = NULL;
    dt_err err = {0};
    unsigned char small[5] = {0};
    DT_CHECK(dt_st_parse(small, 5, 5, &f, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "shorter than the 8-byte header length");
    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    DT_CHECK(dt_st_parse(big, 16, 16, &f, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "exceeds");
    unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    DT_CHECK(dt_st_parse(past, 16, 16, &f, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "runs past the end");
}

/* ============================================================================ checkpoints === */

static void test_ckpt_roundtrip(void)
{
    fake a, b;
    fake_init(&a, 8);
    fake_init(&b, 8);
    const char *dir = path_in("ck");
    dt_ckpt *ca = open_ckpt(&a, dir, 3, true);
    dt_ckpt_state st, got;
    dt_err err = {0};
    fake_fill(&a, 42);
    state_for(&st, 120);
    DT_REQUIRE_OK(dt_ckpt_save(ca, &st, &err), &err);
    /* The snapshot is taken at save time: changing the buffers afterwards changes nothing. */
    fake snapshot;
    fake_init(&snapshot, 8);
    fake_fill(&snapshot, 42);
    fake_fill(&a, 43);
    DT_REQUIRE_OK(dt_ckpt_wait(ca, &err), &err);
    DT_CHECK(exists(path_in("ck/step_120/model.safetensors")));
    DT_CHECK(exists(path_in("ck/step_120/optim.safetensors")));
    DT_CHECK(exists(path_in("ck/step_120/state.json")));
    DT_CHECK_INT(count_tmp_dirs(dir), 0);
    dt_ckpt_stats s;
    dt_ckpt_get_stats(ca, &s);
    DT_CHECK_INT(s.saves, 1);
    DT_CHECK_INT(s.last_step, 120);
    DT_CHECK(s.bytes > a.np * 12);

    dt_ckpt *cb = open_ckpt(&b, dir, 3, true);
    dt_ckpt_state_init(&got);
    bool resumed = false;
    char from[4096];
    DT_REQUIRE_OK(dt_ckpt_resume(cb, "auto", &got, &resumed, from, sizeof from, &err), &err);
    DT_CHECK(resumed);
    DT_CHECK_CONTAINS(from, "step_120");
    DT_CHECK(fake_equal(&b, &snapshot));
    DT_CHECK_INT(got.step, 120);
    DT_CHECK_INT(got.epoch, st.epoch);
    DT_CHECK_INT(got.sample_pos, st.sample_pos);
    DT_CHECK_INT(got.samples_seen, st.samples_seen);
    DT_CHECK_INT(got.world_size, 2);
    DT_CHECK(got.loss == st.loss);
    DT_CHECK(got.lr == st.lr);
    DT_CHECK_STR(got.run_id, "test-run");
    DT_CHECK_STR(got.job, st.job);
    dt_rng r1, r2;
    DT_CHECK(dt_ckpt_state_get_rng(&got, "data", &r1) == 0);
    dt_ckpt_state_get_rng(&st, "data", &r2);
    DT_CHECK(memcmp(&r1, &r2, sizeof r1) == 0);
    double t = 0;
    DT_CHECK(dt_ckpt_state_get_scalar(&got, "optim.t", &t) == 0 && t == 120);
    DT_CHECK(dt_ckpt_state_get_scalar(&got, "sched.warmup", &t) == 0 && t == 0.1);
    DT_CHECK(dt_ckpt_state_get_scalar(&got, "missing", &t) == -ENOENT);

    /* The model file is plain safetensors with every model tensor, and nothing of the optimiser. */
    dt_st_file *f = NULL;
    DT_REQUIRE_OK(dt_st_open(path_in("ck/step_120/model.safetensors"), true, &f, &err), &err);
    DT_CHECK_INT(f->num_tensors, 5);
    DT_CHECK_STR(dt_st_meta_get(f, "format"), "pt");
    const dt_st_tensor *w = dt_st_find(f, "h.0.mlp.weight");
    DT_REQUIRE(w);
    DT_CHECK(w->ndim == 2 && w->shape[0] == 8 && w->shape[1] == 8);
    DT_CHECK(memcmp(w->data, snapshot.params + a.pt[1].offset, 64 * 4) == 0);
    DT_CHECK(dt_st_find(f, "bn.running_mean") != NULL);
    DT_CHECK(dt_st_find(f, "exp_avg.wte") == NULL);
    dt_st_free(f);

    /* Synchronous and background writes produce the same model file. */
    fake_fill(&a, 42);
    dt_ckpt *cs = open_ckpt(&a, path_in("ck_sync"), 3, false);
    DT_REQUIRE_OK(dt_ckpt_save(cs, &st, &err), &err);
    char *x = NULL, *y = NULL;
    size_t xl = 0, yl = 0;
    dt_read_file(path_in("ck/step_120/model.safetensors"), &x, &xl, NULL);
    dt_read_file(path_in("ck_sync/step_120/model.safetensors"), &y, &yl, NULL);
    DT_CHECK(x && y && xl == yl && memcmp(x, y, xl) == 0);
    free(x);
    free(y);
    dt_ckpt_close(cs);

    dt_ckpt_state_clear(&got);
    dt_ckpt_close(ca);
    dt_ckpt_close(cb);
    fake_free(&a);
    fake_free(&b);
    fake_free(&snapshot);
}

static void test_ckpt_concurrent_copy(void)
{
    /* The writer thread copies parameters and optimiser state while "training" goes on; after
     * dt_ckpt_fence the caller may change them, and the checkpoint still holds the values of
     * save time. The BatchNorm buffer (copy_at_save) may change right after dt_ckpt_save. */
    fake a, b, snapshot;
    fake_init(&a, 16);
    fake_init(&b, 16);
    fake_init(&snapshot, 16);
    fake_fill(&snapshot, 5);
    const char *dir = path_in("conc");
    dt_ckpt *c = NULL;
    dt_err err = {0};
    dt_ckpt_opts o = {.dir = dir, .keep = 2, .async = true, .concurrent_copy = true};
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, a.cb, 4, &err), &err);
    for (int round = 0; round < 3; round++) {
        dt_ckpt_state st;
        fake_fill(&a, 5);
        state_for(&st, 10 + round);
        DT_REQUIRE_OK(dt_ckpt_save(c, &st, &err), &err);
        a.bufs[0] = 1e9f; /* the next forward updates running statistics */
        dt_ckpt_fence(c);
        fake_fill(&a, 6); /* the optimiser update */
        dt_ckpt_fence(c); /* nothing pending: returns at once */
        DT_REQUIRE_OK(dt_ckpt_wait(c, &err), &err);
        dt_ckpt *cb = open_ckpt(&b, dir, 2, true);
        dt_ckpt_state got;
        dt_ckpt_state_init(&got);
        char p[4200];
        snprintf(p, sizeof p, "%s/step_%d", dir, 10 + round);
        DT_REQUIRE_OK(dt_ckpt_load(cb, p, &got, &err), &err);
        DT_CHECK(fake_equal(&b, &snapshot));
        dt_ckpt_stats s;
        dt_ckpt_get_stats(c, &s);
        DT_CHECK(s.hold_s >= s.fence_s && s.fence_s >= 0);
        dt_ckpt_state_clear(&got);
        dt_ckpt_close(cb);
    }
    dt_ckpt_close(c);
    fake_free(&a);
    fake_free(&b);
    fake_free(&snapshot);
}

static void test_ckpt_resume_run(void)
{
    /* A restart of a job that began from an explicit path takes the newest checkpoint of its
     * own run, not a newer one of another run. */
    fake a;
    fake_init(&a, 4);
    const char *dir = path_in("runs");
    dt_ckpt *c = open_ckpt(&a, dir, 5, true);
    save_step(c, &a, 10); /* run "test-run" */
    dt_ckpt_state st, got;
    dt_err err = {0};
    state_for(&st, 20);
    dt_strlcpy(st.run_id, "other", sizeof st.run_id);
    DT_REQUIRE_OK(dt_ckpt_save(c, &st, &err), &err);
    DT_REQUIRE_OK(dt_ckpt_wait(c, &err), &err);
    dt_ckpt_state_init(&got);
    bool resumed = false;
    char from[4096];
    DT_REQUIRE_OK(dt_ckpt_resume_run(c, "test-run", &got, &resumed, from, sizeof from, &err),
                  &err);
    DT_CHECK(resumed);
    DT_CHECK_INT(got.step, 10);
    DT_REQUIRE_OK(dt_ckpt_resume_run(c, "nobody", &got, &resumed, from, sizeof from, &err), &err);
    DT_CHECK(!resumed);
    DT_REQUIRE_OK(dt_ckpt_resume(c, "auto", &got, &resumed, from, sizeof from, &err), &err);
    DT_CHECK(resumed);
    DT_CHECK_INT(got.step, 20);
    dt_ckpt_state_clear(&got);
    dt_ckpt_close(c);
    fake_free(&a);
}

static void test_ckpt_keep_and_replace(void)
{
    fake a;
    fake_init(&a, 4);
    const char *dir = path_in("keep");
    /* A checkpoint of a later step from another timeline (a resume from an older one) is left
     * alone by retention. */
    dt_ckpt *c = open_ckpt(&a, dir, 2, true);
    save_step(c, &a, 900);
    for (int s = 1; s <= 5; s++)
        save_step(c, &a, s * 10);
    int64_t *steps = NULL;
    int n = 0;
    DT_REQUIRE_OK(dt_ckpt_list(dir, &steps, &n, NULL), (dt_err *)NULL);
    DT_REQUIRE(n == 3);
    DT_CHECK_INT(steps[0], 900);
    DT_CHECK_INT(steps[1], 50);
    DT_CHECK_INT(steps[2], 40);
    free(steps);

    /* Saving a step that is already there replaces it whole. */
    dt_ckpt_state st;
    dt_err err = {0};
    fake_fill(&a, 777);
    state_for(&st, 50);
    DT_REQUIRE_OK(dt_ckpt_save(c, &st, &err), &err);
    DT_REQUIRE_OK(dt_ckpt_wait(c, &err), &err);
    DT_CHECK_INT(count_tmp_dirs(dir), 0);
    fake b, want;
    fake_init(&b, 4);
    fake_init(&want, 4);
    fake_fill(&want, 777);
    dt_ckpt *cb = open_ckpt(&b, dir, 2, true);
    dt_ckpt_state got;
    dt_ckpt_state_init(&got);
    DT_REQUIRE_OK(dt_ckpt_load(cb, path_in("keep/step_50"), &got, &err), &err);
    DT_CHECK(fake_equal(&b, &want));

    /* Leftovers of an interrupted save are ignored by discovery and removed by the next save. */
    mkdir(path_in("keep/step_60.tmp"), 0755);
    FILE *junk = fopen(path_in("keep/step_60.tmp/model.safetensors"), "w");
    fputs("partial", junk);
    fclose(junk);
    DT_REQUIRE_OK(dt_ckpt_list(dir, &steps, &n, NULL), (dt_err *)NULL);
    DT_CHECK_INT(n, 3);
    free(steps);
    save_step(c, &a, 70);
    DT_CHECK(!exists(path_in("keep/step_60.tmp")));
    dt_ckpt_state_clear(&got);
    dt_ckpt_close(c);
    dt_ckpt_close(cb);
    fake_free(&a);
    fake_free(&b);
    fake_free(&want);
}

typedef enum damage { TRUNCATE_MODEL, FLIP_OPTIM, DELETE_OPTIM, CORRUPT_STATE, DELETE_STATE,
                      EMPTY_MODEL, APPEND_MODEL } damage;

static void do_damage(const char *dir, damage d)
{
    char p[4200];
    int fd;
    struct stat st;
    switch (d) {
    case TRUNCATE_MODEL:
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        stat(p, &st);
        DT_REQUIRE(truncate(p, st.st_size / 2) == 0);
        break;
    case EMPTY_MODEL: /* what a power cut without fsync leaves on ext4 */
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        DT_REQUIRE(truncate(p, 0) == 0);
        break;
    case APPEND_MODEL:
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        fd = open(p, O_WRONLY | O_APPEND);
        DT_REQUIRE(write(fd, "xx", 2) == 2);
        close(fd);
        break;
    case FLIP_OPTIM: {
        snprintf(p, sizeof p, "%s/optim.safetensors", dir);
        stat(p, &st);
        fd = open(p, O_RDWR);
        unsigned char b;
        off_t at = st.st_size - 5; /* in the data: the header stays valid */
        DT_REQUIRE(pread(fd, &b, 1, at) == 1);
        b ^= 0x10;
        DT_REQUIRE(pwrite(fd, &b, 1, at) == 1);
        close(fd);
        break;
    }
    case DELETE_OPTIM:
        snprintf(p, sizeof p, "%s/optim.safetensors", dir);
        DT_REQUIRE(unlink(p) == 0);
        break;
    case CORRUPT_STATE: {
        snprintf(p, sizeof p, "%s/state.json", dir);
        fd = open(p, O_RDWR);
        /* "step": 30 -> "step": 31: still valid JSON, caught by the self-checksum */
        char buf[8192];
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        DT_REQUIRE(n > 0);
        buf[n] = 0;
        char *s = strstr(buf, "\"step\":");
        DT_REQUIRE(s);
        char *digit = s + 7;
        while (*digit == ' ' || *digit == '\t')
            digit++;
        *digit = *digit == '9' ? '8' : (char)(*digit + 1);
        DT_REQUIRE(pwrite(fd, buf, (size_t)n, 0) == n);
        close(fd);
        break;
    }
    case DELETE_STATE:
        snprintf(p, sizeof p, "%s/state.json", dir);
        DT_REQUIRE(unlink(p) == 0);
        break;
    }
}

static void test_ckpt_power_cut(void)
{
    static const struct {
        damage d;
        const char *reason;
    } cases[] = {
        {TRUNCATE_MODEL, "model.safetensors has"},
        {EMPTY_MODEL, "truncated"},
        {APPEND_MODEL, "appended to"},
        {FLIP_OPTIM, "optim.safetensors: checksum mismatch"},
        {DELETE_OPTIM, "optim.safetensors is missing"},
        {CORRUPT_STATE, "state.json: checksum mismatch"},
        {DELETE_STATE, "state.json is missing"},
    };
    fake a, b, want;
    fake_init(&a, 8);
    fake_init(&b, 8);
    fake_init(&want, 8);
    fake_fill(&want, 20);
    const char *dir = path_in("pc");
    dt_ckpt *c = open_ckpt(&a, dir, 5, true);
    dt_ckpt *cb = open_ckpt(&b, dir, 5, true);
    save_step(c, &a, 10);
    save_step(c, &a, 20);
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        save_step(c, &a, 30);
        do_damage(path_in("pc/step_30"), cases[i].d);

        /* dtrain ckpt verify says what is wrong, exit 1. */
        char cmd[8192];
        int code;
        snprintf(cmd, sizeof cmd, "%s ckpt verify %s", dt_test_dtrain_bin(),
                 path_in("pc/step_30"));
        char *out = run(cmd, &code);
        DT_CHECK_INT(code, 1);
        DT_CHECK_CONTAINS(out, cases[i].reason);
        free(out);

        /* resume = auto skips it for step_20, with a warning naming it and the reason. */
        dt_ckpt_state got;
        dt_ckpt_state_init(&got);
        bool resumed = false;
        char from[4096] = "";
        dt_err err = {0};
        fake_zero(&b);
        capture_start();
        int rc = dt_ckpt_resume(cb, "auto", &got, &resumed, from, sizeof from, &err);
        char *log = capture_end();
        DT_CHECK_INT(rc, 0);
        DT_CHECK(resumed);
        DT_CHECK_CONTAINS(from, "step_20");
        DT_CHECK_INT(got.step, 20);
        DT_CHECK(fake_equal(&b, &want));
        DT_CHECK_CONTAINS(log, "WARN");
        DT_CHECK_CONTAINS(log, "step_30");
        DT_CHECK_CONTAINS(log, cases[i].reason);
        free(log);

        /* An explicit path to it is an error, and the model is left as it was. */
        fake_zero(&b);
        rc = dt_ckpt_resume(cb, path_in("pc/step_30"), &got, &resumed, NULL, 0, &err);
        DT_CHECK(rc != 0);
        DT_CHECK(!resumed);
        DT_CHECK_CONTAINS(err.msg, cases[i].reason);
        DT_CHECK(b.params[0] == 0 && b.m[0] == 0);
        dt_ckpt_state_clear(&got);
    }
    dt_ckpt_close(c);
    dt_ckpt_close(cb);
    fake_free(&a);
    fake_free(&b);
    fake_free(&want);
}

static void test_ckpt_foreign_and_bad_path(void)
{
    fake small, big;
    fake_init(&small, 8);
    fake_init(&big, 16);
    char dir[4096];
    dt_strlcpy(dir, path_in("fo"), sizeof dir);
    dt_ckpt *cs = open_ckpt(&small, dir, 5, true);
    dt_ckpt *cg = open_ckpt(&big, dir, 5, true);
    save_step(cs, &small, 5);
    save_step(cg, &big, 10);

    /* The big model's newer checkpoint is reported and skipped for the small model's older one
     * (and left as it is). */
    dt_ckpt_state got;
    dt_ckpt_state_init(&got);
    bool resumed = false;
    char from[4096];
    dt_err err = {0};
    capture_start();
    int rc = dt_ckpt_resume(cs, "auto", &got, &resumed, from, sizeof from, &err);
    char *skiplog = capture_end();
    DT_CHECK_MSG(rc == 0, "%s", err.msg);
    DT_CHECK(resumed);
    DT_CHECK_CONTAINS(from, "step_5");
    DT_CHECK_CONTAINS(skiplog, "written for another model");
    DT_CHECK_CONTAINS(skiplog, "another setup's checkpoint: left as it is");
    free(skiplog);

    /* A directory that holds only another setup's checkpoints: not a fresh start among them
     * (its saves would collide with the user's), an error that names the difference and what
     * to do. */
    char dir2[4096];
    dt_strlcpy(dir2, path_in("fo2"), sizeof dir2);
    dt_ckpt *cg2 = open_ckpt(&big, dir2, 5, true);
    save_step(cg2, &big, 10);
    dt_ckpt_close(cg2);
    dt_ckpt *cs2 = open_ckpt(&small, dir2, 5, true);
    resumed = true;
    rc = dt_ckpt_resume(cs2, "auto", &got, &resumed, from, sizeof from, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK(!resumed);
    DT_CHECK_CONTAINS(err.msg, "step_10");
    DT_CHECK_CONTAINS(err.msg, "written for another model: tensor wte is F32 (64, 16) in model "
                               "there, F32 (64, 8) in model here");
    DT_CHECK_CONTAINS(err.msg, "checkpoint.dir");
    DT_CHECK_CONTAINS(err.msg, "checkpoint.resume = never");
    dt_ckpt_close(cs2);

    /* Started over anyway (resume = never): the other model's step is never replaced, and
     * retention neither removes it nor counts it. */
    dt_ckpt_state st;
    fake_fill(&small, 10);
    state_for(&st, 10);
    DT_CHECK(dt_ckpt_save(cs, &st, &err) == 0 && dt_ckpt_wait(cs, &err) == -EEXIST);
    DT_CHECK_CONTAINS(err.msg, "written for another model");
    DT_CHECK_CONTAINS(err.msg, "another checkpoint.dir");
    dt_ckpt_info info;
    DT_CHECK_MSG(dt_ckpt_inspect(path_in("fo/step_10"), true, &info, &err) == 0, "%s", err.msg);
    DT_CHECK_INT(info.tensors[0].shape[1], 16);
    dt_ckpt_info_free(&info);
    dt_ckpt *c1 = open_ckpt(&small, dir, 1, true);
    save_step(c1, &small, 11);
    capture_start();
    save_step(c1, &small, 12);
    char *log = capture_end();
    DT_CHECK_CONTAINS(log, "not removing");
    free(log);
    DT_CHECK(exists(path_in("fo/step_10/model.safetensors")));
    DT_CHECK(!exists(path_in("fo/step_11")));
    DT_CHECK(!exists(path_in("fo/step_5")));
    dt_ckpt_close(c1);
    save_step(cs, &small, 5); /* the state the rest of this test expects */

    /* Only the optimiser differs (train.optimizer changed): it says so, not "another model". */
    dt_ckpt_buf sgd[3] = {small.cb[0], small.cb[1],
                          {"optim", "momentum_buffer.", small.pt, 4, small.m, small.np, false}};
    dt_ckpt *co = NULL;
    dt_ckpt_opts oo = {.dir = dir, .keep = 5, .async = true};
    DT_REQUIRE_OK(dt_ckpt_open(&co, &oo, NULL, sgd, 3, &err), &err);
    rc = dt_ckpt_load(co, path_in("fo/step_5"), &got, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK_CONTAINS(err.msg, "written with another optimizer");
    DT_CHECK(!strstr(err.msg, "another model"));
    dt_ckpt_close(co);

    /* Explicitly: an error, -EXDEV. */
    rc = dt_ckpt_resume(cs, path_in("fo/step_10"), &got, &resumed, NULL, 0, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK_CONTAINS(err.msg, "another model");

    /* A path that does not exist, and a directory of checkpoints instead of one. */
    rc = dt_ckpt_resume(cs, path_in("fo/step_99"), &got, &resumed, NULL, 0, &err);
    DT_CHECK_INT(rc, -ENOENT);
    DT_CHECK(!resumed);
    DT_CHECK_CONTAINS(err.msg, "checkpoint.resume: checkpoint ");
    DT_CHECK_CONTAINS(err.msg, "fo/step_99: cannot read the checkpoint directory");
    rc = dt_ckpt_resume(cs, dir, &got, &resumed, NULL, 0, &err);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(err.msg, "is a directory of checkpoints");
    DT_CHECK_CONTAINS(err.msg, "step_12");

    /* never: nothing read. auto on an empty directory: a fresh start. */
    rc = dt_ckpt_resume(cs, "never", &got, &resumed, NULL, 0, &err);
    DT_CHECK(rc == 0 && !resumed);
    dt_ckpt *ce = open_ckpt(&small, path_in("empty"), 5, true);
    rc = dt_ckpt_resume(ce, "auto", &got, &resumed, NULL, 0, &err);
    DT_CHECK(rc == 0 && !resumed);

    dt_ckpt_state_clear(&got);
    dt_ckpt_close(cs);
    dt_ckpt_close(cg);
    dt_ckpt_close(ce);
    fake_free(&small);
    fake_free(&big);
}

/* Which tensors are the model's and which an optimiser's state comes from what the caller
 * registers (a buffer with a prefix holds per-parameter state under that prefix) and from what
 * the checkpoint holds, not from built-in file or state names: here the model lives in
 * "weights.safetensors" and the state is called "velocity." / "m.", names ckpt never heard of. */
static void test_ckpt_foreign_names_from_caller(void)
{
    fake small, big;
    fake_init(&small, 8);
    fake_init(&big, 16);
    dt_err err = {0};
    dt_ckpt_opts o = {.dir = path_in("names"), .keep = 5, .async = false};
    dt_ckpt_buf vel[3] = {{"weights", "", small.pt, 4, small.params, small.np, false},
                          {"weights", "", small.bt, 1, small.bufs, small.nb, true},
                          {"opt_state", "velocity.", small.pt, 4, small.m, small.np, false}};
    dt_ckpt *c = NULL;
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, vel, 3, &err), &err);
    save_step(c, &small, 3);
    dt_ckpt_close(c);
    dt_ckpt_state got;
    dt_ckpt_state_init(&got);

    /* Another model, same file and state names: "another model", not "another optimizer". */
    dt_ckpt_buf bigv[3] = {{"weights", "", big.pt, 4, big.params, big.np, false},
                           {"weights", "", big.bt, 1, big.bufs, big.nb, true},
                           {"opt_state", "velocity.", big.pt, 4, big.m, big.np, false}};
    o.dir = path_in("names2");
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, bigv, 3, &err), &err);
    int rc = dt_ckpt_load(c, path_in("names/step_3"), &got, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK_CONTAINS(err.msg, "written for another model: tensor wte is F32 (64, 8) in weights "
                               "there, F32 (64, 16) in weights here");
    DT_CHECK(!strstr(err.msg, "optimizer"));
    dt_ckpt_close(c);

    /* The same model, another optimiser's state (two buffers "m." and "v." where the file has
     * "velocity."): "another optimizer", naming both sides' state from the prefixes. */
    dt_ckpt_buf mv[4] = {vel[0], vel[1],
                         {"opt_state", "m.", small.pt, 4, small.m, small.np, false},
                         {"opt_state", "v.", small.pt, 4, small.v, small.np, false}};
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, mv, 4, &err), &err);
    rc = dt_ckpt_load(c, path_in("names/step_3"), &got, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK_CONTAINS(err.msg, "written with another optimizer (its optimizer state differs: "
                               "it has no tensor m.wte");
    DT_CHECK_CONTAINS(err.msg, "the checkpoint holds velocity, this job's optimizer keeps m, v");
    DT_CHECK(!strstr(err.msg, "another model"));
    dt_ckpt_close(c);

    /* No state registered (SGD without momentum) against a checkpoint that has some. */
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, vel, 2, &err), &err);
    rc = dt_ckpt_load(c, path_in("names/step_3"), &got, &err);
    DT_CHECK_INT(rc, -EXDEV);
    DT_CHECK_CONTAINS(err.msg, "written with another optimizer");
    DT_CHECK_CONTAINS(err.msg, "the checkpoint holds velocity, this job's optimizer keeps none");
    dt_ckpt_close(c);

    /* And the same registration loads it. */
    DT_REQUIRE_OK(dt_ckpt_open(&c, &o, NULL, vel, 3, &err), &err);
    DT_CHECK_MSG(dt_ckpt_load(c, path_in("names/step_3"), &got, &err) == 0, "%s", err.msg);
    DT_CHECK_INT(got.step, 3);
    dt_ckpt_close(c);
    dt_ckpt_state_clear(&got);
    fake_free(&small);
    fake_free(&big);
}

/* A file named like a checkpoint (step_40, a regular file) where checkpoints go: resume says so
 * (naming it) instead of skipping it in silence, and open refuses the directory before any
 * training (a save of that step would fail with "Not a directory" after all of it); so does
 * open for a checkpoint.dir that is itself a file. `dtrain ckpt list` shows it. */
static void test_ckpt_stray_step_file(void)
{
    fake f;
    fake_init(&f, 8);
    char dir[4096];
    dt_strlcpy(dir, path_in("stray"), sizeof dir);
    dt_ckpt *c = open_ckpt(&f, dir, 5, false);
    save_step(c, &f, 20);
    DT_REQUIRE(dt_test_write_file(path_in("stray/step_40"), "not a checkpoint\n") == 0);

    dt_ckpt_state got;
    dt_ckpt_state_init(&got);
    bool resumed = false;
    char from[4096];
    dt_err err = {0};
    capture_start();
    int rc = dt_ckpt_resume(c, "auto", &got, &resumed, from, sizeof from, &err);
    char *log = capture_end();
    DT_CHECK_MSG(rc == 0 && resumed, "%d: %s", rc, err.msg);
    DT_CHECK_CONTAINS(from, "step_20");
    DT_CHECK_CONTAINS(log, "stray/step_40 is not a directory");
    free(log);
    dt_ckpt_close(c);

    dt_ckpt_opts o = {.dir = dir, .keep = 5};
    c = NULL;
    rc = dt_ckpt_open(&c, &o, NULL, f.cb, 4, &err);
    DT_CHECK_INT(rc, -ENOTDIR);
    DT_CHECK(c == NULL);
    DT_CHECK_CONTAINS(err.msg, "stray/step_40 is not a directory");
    DT_CHECK_CONTAINS(err.msg, "a save of step 40 would fail");
    DT_CHECK_CONTAINS(err.msg, "remove or rename it");
    DT_CHECK(exists(path_in("stray/step_40")) && exists(path_in("stray/step_20/state.json")));

    char cmd[8300];
    int code;
    snprintf(cmd, sizeof cmd, "%s ckpt list %s", dt_test_dtrain_bin(), dir);
    char *out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "invalid: step_40 is not a directory");
    DT_CHECK_CONTAINS(out, "(resume = auto loads this one)");
    free(out);

    o.dir = path_in("stray/step_40/ck"); /* below a file */
    rc = dt_ckpt_open(&c, &o, NULL, f.cb, 4, &err);
    DT_CHECK_INT(rc, -ENOTDIR);
    o.dir = path_in("stray/step_40"); /* a file */
    rc = dt_ckpt_open(&c, &o, NULL, f.cb, 4, &err);
    DT_CHECK_INT(rc, -ENOTDIR);
    DT_CHECK_CONTAINS(err.msg, "checkpoint directory");
    DT_CHECK_CONTAINS(err.msg, "stray/step_40 is not a directory");
    dt_ckpt_state_clear(&got);
    fake_free(&f);
}

/* ---- a kill in the middle of retention, and new directories made durable ---- */

static char opened_dirs[16][4096];
static int n_opened_dirs;

static int rec_open(const char *path, int flags, mode_t mode)
{
    if ((flags & O_DIRECTORY) && n_opened_dirs < 16)
        dt_strlcpy(opened_dirs[n_opened_dirs++], path, sizeof opened_dirs[0]);
    return open(path, flags, mode);
}

/* Renames, and ends the process right after retention moved a checkpoint aside (the moment a
 * kill -9 leaves the most behind: a directory whose files are about to be deleted). */
static int crash_after_old_rename(const char *a, const char *b)
{
    int rc = rename(a, b);
    size_t l = strlen(b);
    if (rc == 0 && l > 4 && !strcmp(b + l - 4, ".old") && strstr(a, "step_1"))
        _exit(42);
    return rc;
}

static void test_ckpt_retention_crash(void)
{
    fake a;
    fake_init(&a, 8);
    char dir[4096];
    dt_strlcpy(dir, path_in("ret"), sizeof dir);
    dt_ckpt *c = open_ckpt(&a, dir, 1, false);
    save_step(c, &a, 1);
    pid_t pid = fork();
    if (pid == 0) {
        dt_ckpt_io table = dt_ckpt_io_posix;
        table.rename = crash_after_old_rename;
        dt_ckpt_set_io(&table);
        dt_ckpt_state st;
        fake_fill(&a, 2);
        state_for(&st, 2);
        dt_ckpt_save(c, &st, NULL);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    DT_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 42,
                 "retention did not move step_1 aside before deleting it (status %d)", status);
    /* Killed there: no step_1 at all (discovery sees only complete checkpoints), and the next
     * save clears the leftover. */
    DT_CHECK(!exists(path_in("ret/step_1")));
    DT_CHECK(exists(path_in("ret/step_1.old/model.safetensors")));
    DT_CHECK(exists(path_in("ret/step_2/state.json")));
    save_step(c, &a, 3);
    DT_CHECK(!exists(path_in("ret/step_1.old")));
    DT_CHECK(!exists(path_in("ret/step_2")));
    dt_ckpt_close(c);

    /* A checkpoint directory that the first save creates, two levels deep: the parent of every
     * directory it created is synced, so the new entries survive a power cut. */
    char deep[4096];
    dt_strlcpy(deep, path_in("np/a/ck"), sizeof deep);
    c = open_ckpt(&a, deep, 1, false);
    dt_ckpt_io table = dt_ckpt_io_posix;
    table.open = rec_open;
    dt_ckpt_set_io(&table);
    n_opened_dirs = 0;
    save_step(c, &a, 1);
    dt_ckpt_set_io(NULL);
    const char *want[] = {path_in("np/a"), path_in("np"), dt_test_tmpdir()};
    for (size_t w = 0; w < DT_ARRAY_LEN(want); w++) {
        bool found = false;
        for (int i = 0; i < n_opened_dirs; i++)
            found |= !strcmp(opened_dirs[i], want[w]);
        DT_CHECK_MSG(found, "%s was not synced after the save created a directory in it",
                     want[w]);
    }
    dt_ckpt_close(c);
    fake_free(&a);
}

/* ---- injected failures through the system call table ---- */

static int fail_write_at = -1, fail_fsync_at = -1, fail_rename_at = -1;
static int n_writes, n_fsyncs, n_renames;

static ssize_t inj_write(int fd, const void *buf, size_t n)
{
    if (n_writes++ == fail_write_at) {
        /* A partial write first, then the error, as a filling disk does. */
        if (n > 1) {
            ssize_t w = write(fd, buf, n / 2);
            if (w > 0)
                return w;
        }
        errno = ENOSPC;
        return -1;
    }
    if (fail_write_at >= 0 && n_writes > fail_write_at) {
        errno = ENOSPC;
        return -1;
    }
    return write(fd, buf, n);
}

static int inj_fsync(int fd)
{
    if (n_fsyncs++ == fail_fsync_at) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static int inj_rename(const char *a, const char *b)
{
    if (n_renames++ == fail_rename_at) {
        errno = EACCES;
        return -1;
    }
    return rename(a, b);
}

static void test_ckpt_injected_failures(void)
{
    /* Full disk simulated through the system call table (deterministic, no root needed): the
     * k-th write fails with ENOSPC, for k across the whole save; then fsync (EIO) and rename
     * failures. Each time: a clear error, the earlier checkpoints still load, no .tmp left, and
     * the next save (disk freed) succeeds. */
    fake a, b;
    fake_init(&a, 8);
    fake_init(&b, 8);
    const char *dir = path_in("inj");
    dt_ckpt *c = open_ckpt(&a, dir, 2, false);
    dt_ckpt *cb = open_ckpt(&b, dir, 2, false);
    save_step(c, &a, 1);
    save_step(c, &a, 2);
    dt_ckpt_io table = dt_ckpt_io_posix;
    table.write = inj_write;
    table.fsync = inj_fsync;
    table.rename = inj_rename;

    /* Count the calls of one save. */
    dt_ckpt_set_io(&table);
    n_writes = n_fsyncs = n_renames = 0;
    save_step(c, &a, 3);
    int writes = n_writes, fsyncs = n_fsyncs, renames = n_renames;
    /* 6 fsyncs and 2 renames: retention moved step_1 aside, synced, then deleted it */
    DT_CHECK_MSG(writes >= 3 && fsyncs == 6 && renames == 2, "%d writes, %d fsyncs, %d renames",
                 writes, fsyncs, renames);
    int64_t step = 10;
    for (int kind = 0; kind < 3; kind++) {
        int limit = kind == 0 ? writes : kind == 1 ? fsyncs : renames;
        for (int k = 0; k < limit; k++, step++) {
            dt_ckpt_state st;
            dt_err err = {0};
            fail_write_at = kind == 0 ? k : -1;
            fail_fsync_at = kind == 1 ? k : -1;
            fail_rename_at = kind == 2 ? k : -1;
            n_writes = n_fsyncs = n_renames = 0;
            fake_fill(&a, (uint64_t)step);
            state_for(&st, step);
            int rc = dt_ckpt_save(c, &st, &err);
            /* fsyncs: each file, the .tmp directory, then (4) the checkpoint directory after
             * the rename, then retention's, whose failure is only logged. */
            bool after_rename = kind == 1 && k == 4;
            bool ok = (kind == 1 && k > 4) || (kind == 2 && k > 0); /* retention's: logged */
            if (after_rename) {
                DT_CHECK(rc != 0);
                DT_CHECK_CONTAINS(err.msg, "was written but may not survive a power cut");
            } else if (ok) {
                DT_CHECK_MSG(rc == 0, "kind %d k %d: %s", kind, k, err.msg);
            } else {
                DT_CHECK_MSG(rc != 0, "kind %d k %d: save succeeded", kind, k);
                DT_CHECK_CONTAINS(err.msg, "not saved");
                DT_CHECK_CONTAINS(err.msg, "intact");
                if (kind == 0)
                    DT_CHECK_CONTAINS(err.msg, "No space left on device");
                if (kind == 0)
                    DT_CHECK_CONTAINS(err.msg, "MB are free");
                if (kind == 1)
                    DT_CHECK_CONTAINS(err.msg, "fsync");
                char p[4200];
                snprintf(p, sizeof p, "%s/step_%" PRId64, dir, step);
                DT_CHECK(!exists(p));
            }
            DT_CHECK_INT(count_tmp_dirs(dir), 0);
            /* The newest complete checkpoint still loads. */
            fail_write_at = fail_fsync_at = fail_rename_at = -1;
            dt_ckpt_state got;
            dt_ckpt_state_init(&got);
            bool resumed = false;
            DT_CHECK(dt_ckpt_resume(cb, "auto", &got, &resumed, NULL, 0, &err) == 0 && resumed);
            DT_CHECK(got.step >= 3);
            if (after_rename || ok)
                DT_CHECK_INT(got.step, step);
            dt_ckpt_state_clear(&got);
        }
    }
    /* A failed background save is reported by the next save, which then starts nothing. */
    dt_ckpt *ca = open_ckpt(&a, dir, 2, true);
    dt_ckpt_state st;
    dt_err err = {0};
    fail_write_at = 0;
    n_writes = 0;
    state_for(&st, 500);
    capture_start();
    DT_CHECK_INT(dt_ckpt_save(ca, &st, &err), 0);
    state_for(&st, 501);
    int rc = dt_ckpt_save(ca, &st, &err);
    char *log = capture_end();
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(err.msg, "an earlier checkpoint failed");
    DT_CHECK_CONTAINS(err.msg, "step_500");
    DT_CHECK_CONTAINS(log, "ERROR");
    free(log);
    fail_write_at = -1;
    DT_CHECK_INT(dt_ckpt_wait(ca, &err), 0);
    DT_REQUIRE_OK(dt_ckpt_save(ca, &st, &err), &err);
    DT_REQUIRE_OK(dt_ckpt_wait(ca, &err), &err);
    DT_CHECK(exists(path_in("inj/step_501/state.json")));
    dt_ckpt_set_io(NULL);
    dt_ckpt_close(c);
    dt_ckpt_close(ca);
    dt_ckpt_close(cb);
    fake_free(&a);
    fake_free(&b);
}

/* ---- a real full disk: a small tmpfs in a private mount namespace ---- */

static int write_file_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, s, strlen(s));
    close(fd);
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

/* A private mount namespace where this process may mount: as root directly, else through a user
 * namespace. */
static int private_mount_ns(char *how, size_t size)
{
    if (unshare(CLONE_NEWNS) == 0) {
        dt_strlcpy(how, "root, private mount namespace", size);
    } else {
        uid_t uid = getuid();
        gid_t gid = getgid();
        char map[64];
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
            return -1;
        write_file_str("/proc/self/setgroups", "deny");
        snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
        if (write_file_str("/proc/self/uid_map", map) != 0)
            return -1;
        snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
        if (write_file_str("/proc/self/gid_map", map) != 0)
            return -1;
        dt_strlcpy(how, "user and mount namespace", size);
    }
    /* Keep our mounts from propagating to the rest of the machine. */
    return mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
}

static void test_ckpt_full_disk_tmpfs(void)
{
    fake a;
    fake_init(&a, 32);
    /* The size of one checkpoint, measured. */
    dt_ckpt *c0 = open_ckpt(&a, path_in("measure"), 3, false);
    save_step(c0, &a, 1);
    dt_ckpt_stats s;
    dt_ckpt_get_stats(c0, &s);
    dt_ckpt_close(c0);

    char how[64];
    if (private_mount_ns(how, sizeof how) != 0)
        DT_SKIP("cannot mount a tmpfs here (needs root or unprivileged user namespaces); "
                "test_ckpt_injected_failures covers a full disk through injected ENOSPC");
    const char *disk = path_in("disk");
    mkdir(disk, 0755);
    char opts[64];
    /* Room for two checkpoints and a half. */
    snprintf(opts, sizeof opts, "size=%" PRIu64 "k", (s.bytes * 5 / 2 + 4095) / 4096 * 4);
    if (mount("tmpfs", disk, "tmpfs", 0, opts) != 0)
        DT_SKIP("mount of a tmpfs failed; test_ckpt_injected_failures covers a full disk");
    fprintf(stderr, "    tmpfs of %s at %s (%s)\n", opts, disk, how);
    const char *dir = path_in("disk/ck");
    dt_ckpt *c = open_ckpt(&a, dir, 3, true);
    save_step(c, &a, 100);
    save_step(c, &a, 200);
    dt_ckpt_state st;
    dt_err err = {0};
    state_for(&st, 300);
    DT_REQUIRE_OK(dt_ckpt_save(c, &st, &err), &err);
    int rc = dt_ckpt_wait(c, &err);
    DT_CHECK(rc == -ENOSPC);
    DT_CHECK_CONTAINS(err.msg, "checkpoint step_300 not saved");
    DT_CHECK_CONTAINS(err.msg, "No space left on device");
    DT_CHECK_CONTAINS(err.msg, "MB are free");
    DT_CHECK_CONTAINS(err.msg, "intact");
    DT_CHECK(!exists(path_in("disk/ck/step_300")));
    DT_CHECK_INT(count_tmp_dirs(dir), 0);
    /* The earlier ones verify, and the job goes on once there is room again. */
    char p[4200];
    dt_ckpt_info info;
    for (int step = 100; step <= 200; step += 100) {
        snprintf(p, sizeof p, "%s/step_%d", dir, step);
        DT_CHECK_MSG(dt_ckpt_inspect(p, true, &info, &err) == 0, "%s: %s", p, err.msg);
        dt_ckpt_info_free(&info);
    }
    snprintf(p, sizeof p, "%s/step_100", dir);
    DT_REQUIRE(dt_rm_rf(p, NULL) == 0);
    save_step(c, &a, 300);
    snprintf(p, sizeof p, "%s/step_300", dir);
    DT_CHECK(dt_ckpt_inspect(p, true, &info, &err) == 0);
    dt_ckpt_info_free(&info);
    dt_ckpt_close(c);
    umount(disk);
    fake_free(&a);
}

/* ---- every rank resumes from the same checkpoint ---- */

/* Exit code (128+N for signal N), or -1 after timeout_s (the process group is then killed). */
static int wait_exit(pid_t pid, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        dt_sleep_ms(50);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Rank body: joins a 2-rank cpu communicator with a checkpoint whose buffers hold this rank's
 * values (seed 100 + rank) and that "resumed" at steps[rank] (-1: none), calls dt_ckpt_sync and
 * exits 0 when what it got is right, 2 if not: when the ranks differ, the state and buffers of
 * the rank with the newest step (adopted exactly where this rank's own step differed); its own
 * otherwise. */
static void sync_rank(int port, const char *run_id, int rank, const int64_t *steps)
{
    dt_err err = {0};
    dt_store *store = NULL;
    dt_comm *comm = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    dt_comm_opts co;
    dt_comm_opts_default(&co);
    co.rank = co.local_rank = rank;
    co.world_size = co.local_world_size = 2;
    co.run_id = run_id;
    co.timeout_ms = 20000;
    if (dt_store_connect(&store, "127.0.0.1", port, &so, &err) ||
        dt_comm_init(&comm, store, &co, &err))
        _exit(2);
    int64_t step = steps[rank];
    int src = steps[1] > steps[0] ? 1 : 0;
    bool differ = steps[0] != steps[1];
    fake f, want;
    fake_init(&f, 8);
    fake_init(&want, 8);
    fake_fill(&f, 100 + (uint64_t)rank);
    fake_fill(&want, 100 + (uint64_t)(differ ? src : rank));
    dt_ckpt *c = NULL;
    dt_ckpt_opts o = {.dir = path_in("sync"), .keep = 2};
    if (dt_ckpt_open(&c, &o, NULL, f.cb, 4, &err))
        _exit(2);
    dt_ckpt_state st;
    state_for(&st, step >= 0 ? step : 0);
    st.job = strdup(st.job); /* owned, as after a load */
    bool resumed = step >= 0, adopted = true;
    int got_src = -1;
    int64_t got_step = -2;
    int rc = dt_ckpt_sync(c, comm, rank, &st, &resumed, &got_src, &got_step, &adopted, &err);
    bool ok = rc == 0 && got_src == src && got_step == steps[src] && adopted == (step != steps[src]) &&
              resumed == (steps[src] >= 0) && fake_equal(&f, &want) &&
              (!resumed || st.step == steps[src]) && (rank == src || !differ || st.job == NULL);
    double t = -1;
    ok = ok && (!resumed || (st.samples_seen == steps[src] * 32 && st.epoch == steps[src] / 10 &&
                             !strcmp(st.run_id, "test-run") &&
                             dt_ckpt_state_get_scalar(&st, "optim.t", &t) == 0 &&
                             t == (double)steps[src]));
    if (!ok)
        fprintf(stderr, "rank %d: rc %d (%s) src %d step %lld adopted %d resumed %d step %lld "
                "equal %d\n", rank, rc, err.msg, got_src, (long long)got_step, adopted, resumed,
                (long long)st.step, fake_equal(&f, &want));
    _exit(ok ? 0 : 2);
}

static void test_ranks_resume_alike(void)
{
    int port;
    pid_t srv = dt_test_store_start(&port);
    /* both at 40; rank 1 without a checkpoint (node-local disks); rank 0 without one (rank 0 on
     * another node after a regroup); rank 1 with an older step; neither; then steps far past
     * 2^44 (what the float32 pair they once travelled in held exactly) that differ only in
     * their low bits: steps and state must travel exactly */
    const int64_t big = (INT64_C(1) << 50) + (INT64_C(1) << 21) + 5;
    const int64_t cases[][2] = {{40, 40}, {40, -1}, {-1, 40}, {40, 30}, {-1, -1},
                                {big, big - 2}, {big - 2, big}, {-1, big}};
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        char run_id[64];
        snprintf(run_id, sizeof run_id, "sync-%d-%d", (int)getpid(), k);
        pid_t pids[2];
        fflush(stderr);
        for (int r = 0; r < 2; r++)
            if ((pids[r] = fork()) == 0)
                sync_rank(port, run_id, r, cases[k]);
        for (int r = 0; r < 2; r++) {
            int code = wait_exit(pids[r], 30);
            DT_CHECK_MSG(code == 0, "case %d (rank 0 at %lld, rank 1 at %lld), rank %d: exit %d", k,
                         (long long)cases[k][0], (long long)cases[k][1], r, code);
        }
    }
    dt_test_store_stop(srv);
}

/* ================================================================================= tools === */

static void test_cli_tools(void)
{
    fake a;
    fake_init(&a, 8);
    const char *dir = path_in("cli");
    dt_ckpt *c = open_ckpt(&a, dir, 5, true);
    save_step(c, &a, 7);
    save_step(c, &a, 14);
    dt_ckpt_close(c);
    const char *bin = dt_test_dtrain_bin();
    char cmd[8192];
    int code;
    char *out;

    snprintf(cmd, sizeof cmd, "%s ckpt list %s", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "STEP");
    DT_CHECK_CONTAINS(out, "STEP_LOSS"); /* the loss of that step, not a log_every mean */
    DT_CHECK_CONTAINS(out, "resume = auto loads this one");
    DT_CHECK(strstr(out, "14 ") && strstr(out, "7 ") && strstr(out, "14 ") < strstr(out, "\n7 "));
    free(out);

    snprintf(cmd, sizeof cmd, "%s ckpt show %s/step_14", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "step         14");
    DT_CHECK_CONTAINS(out, "loss         0.333333  (of step 14 alone; log lines and "
                           "metrics.jsonl show means over job.log_every steps)");
    DT_CHECK_CONTAINS(out, "sample_pos   128");
    DT_CHECK_CONTAINS(out, "model  h.0.mlp.weight  F32  [8, 8]");
    DT_CHECK_CONTAINS(out, "optim  exp_avg_sq.wte  F32  [64, 8]");
    DT_CHECK_CONTAINS(out, "name = test");
    DT_CHECK_CONTAINS(out, "scalar       optim.t = 14");
    free(out);

    snprintf(cmd, sizeof cmd, "%s ckpt verify %s/step_14", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "valid (step 14");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt verify %s", bin, dir); /* every checkpoint under it */
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "step_7: valid");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt verify %s/nope", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 1);
    DT_CHECK_CONTAINS(out, "invalid");
    free(out);

    /* list marks a damaged one and points at the one resume would load. */
    char p[4200];
    snprintf(p, sizeof p, "%s/step_14/optim.safetensors", dir);
    DT_REQUIRE(truncate(p, 100) == 0);
    snprintf(cmd, sizeof cmd, "%s ckpt list %s", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "invalid: optim.safetensors has 100 bytes");
    char *seven = strstr(out, "\n7 ");
    DT_CHECK(seven && strstr(seven, "resume = auto loads this one"));
    free(out);

    /* A flipped byte (sizes intact) is found by list itself, not only by verify; --quick says
     * it did not look and claims nothing about what resume would load. */
    const char *dir2 = path_in("cli2");
    c = open_ckpt(&a, dir2, 5, true);
    save_step(c, &a, 3);
    save_step(c, &a, 6);
    dt_ckpt_close(c);
    snprintf(p, sizeof p, "%s/step_6/model.safetensors", dir2);
    int fd = open(p, O_RDWR | O_CLOEXEC);
    DT_REQUIRE(fd >= 0);
    off_t end = lseek(fd, 0, SEEK_END);
    unsigned char byte = 0;
    DT_REQUIRE(pread(fd, &byte, 1, end - 5) == 1);
    byte ^= 0x10;
    DT_REQUIRE(pwrite(fd, &byte, 1, end - 5) == 1);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s ckpt list %s", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    char *six = strstr(out, "\n6 ");
    DT_CHECK_MSG(six && strstr(six, "invalid") && strstr(six, "checksum"), "%s", out);
    char *three = strstr(out, "\n3 ");
    DT_CHECK(three && strstr(three, "resume = auto loads this one"));
    DT_CHECK(six && (!strstr(six, "resume = auto") || strstr(six, "resume = auto") > three));
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt list --quick %s", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(out, "complete (unverified)");
    DT_CHECK(!strstr(out, "resume = auto loads"));
    free(out);

    /* A path that is not there, or not a directory: exit 1 as --help says. list given one
     * checkpoint and show given a directory of them say which is which. */
    snprintf(cmd, sizeof cmd, "%s ckpt list %s/nonexistent", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 1);
    DT_CHECK_CONTAINS(out, "No such file or directory");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt list %s/step_3/state.json", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 1);
    DT_CHECK_CONTAINS(out, "not a directory");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt list %s/step_3", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_CONTAINS(out, "a single checkpoint");
    DT_CHECK_CONTAINS(out, "dtrain ckpt show");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt show %s", bin, dir2);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 1);
    DT_CHECK_CONTAINS(out, "is a directory of checkpoints");
    DT_CHECK_CONTAINS(out, "step_6");
    free(out);

    const char *helps[] = {"ckpt --help", "ckpt list --help", "ckpt show --help",
                           "ckpt verify --help"};
    for (size_t i = 0; i < DT_ARRAY_LEN(helps); i++) {
        snprintf(cmd, sizeof cmd, "%s %s", bin, helps[i]);
        out = run(cmd, &code);
        DT_CHECK_INT(code, 0);
        DT_CHECK_CONTAINS(out, "usage: dtrain ckpt");
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s ckpt lst %s", bin, dir);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 2);
    DT_CHECK_CONTAINS(out, "did you mean \"list\"");
    free(out);
    snprintf(cmd, sizeof cmd, "%s ckpt verify", bin);
    out = run(cmd, &code);
    DT_CHECK_INT(code, 2);
    free(out);
    fake_free(&a);
}

/* The path of tests/safetensors_read.py: in the source tree the tests run from (the repository
 * root, as `make test` does), else next to the build directory of the dtrain binary. */
static const char *py_reader(void)
{
    static char p[4096];
    if (realpath("tests/safetensors_read.py", p))
        return p;
    if (!realpath(dt_test_dtrain_bin(), p)) /* <root>/build/dtrain */
        snprintf(p, sizeof p, "%s", dt_test_dtrain_bin());
    for (int k = 0; k < 2; k++) {
        char *s = strrchr(p, '/');
        if (s)
            *s = '\0';
    }
    size_t l = strlen(p);
    snprintf(p + l, sizeof p - l, "/tests/safetensors_read.py");
    return p;
}

static void test_python_reader_agrees(void)
{
    int code;
    char *out = run("python3 -c 'import json, struct, sys; print(sys.version_info[0])'", &code);
    free(out);
    if (code != 0)
        DT_SKIP("python3 is not installed");
    fake a;
    fake_init(&a, 8);
    const char *dir = path_in("py");
    dt_ckpt *c = open_ckpt(&a, dir, 5, true);
    save_step(c, &a, 3);
    dt_ckpt_close(c);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "python3 %s %s/step_3/model.safetensors", py_reader(), dir);
    char *py = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    snprintf(cmd, sizeof cmd, "%s ckpt show --no-job %s/step_3", dt_test_dtrain_bin(), dir);
    char *show = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    /* Every tensor line of the Python reader ("model  NAME  DTYPE  [SHAPE]") is in the show
     * output, and they count the same model tensors. */
    int lines = 0;
    for (char *line = strtok(py, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "model  ", 7) != 0)
            continue;
        lines++;
        char want[512];
        snprintf(want, sizeof want, "  %s\n", line);
        DT_CHECK_CONTAINS(show, want);
    }
    DT_CHECK_INT(lines, 5);
    free(py);
    free(show);

    /* It checks the data too (sums of the float32 values against ours)... */
    snprintf(cmd, sizeof cmd, "python3 %s --sums %s/step_3/model.safetensors", py_reader(), dir);
    py = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    double sum = 0;
    for (size_t i = a.pt[0].offset; i < a.pt[0].offset + a.pt[0].numel; i++)
        sum += a.params[i];
    char want[128];
    snprintf(want, sizeof want, "sum wte %.6e", sum);
    DT_CHECK_CONTAINS(py, want);
    free(py);

    /* ...and, like our reader, rejects a damaged file. */
    char p[4200];
    snprintf(p, sizeof p, "%s/step_3/model.safetensors", dir);
    DT_REQUIRE(truncate(p, 300) == 0);
    char cmd2[16384];
    snprintf(cmd2, sizeof cmd2, "python3 %s %s", py_reader(), p);
    py = run(cmd2, &code);
    DT_CHECK(code != 0);
    DT_CHECK_CONTAINS(py, "invalid");
    free(py);
    fake_free(&a);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"xxh64_vectors", test_xxh64_vectors, 0},
        {"st_header_bytes", test_st_header_bytes, 0},
        {"st_roundtrip", test_st_roundtrip, 0},
        {"st_rejects_malformed", test_st_rejects_malformed, 0},
        {"ckpt_roundtrip", test_ckpt_roundtrip, 0},
        {"ckpt_concurrent_copy", test_ckpt_concurrent_copy, 0},
        {"ckpt_keep_and_replace", test_ckpt_keep_and_replace, 0},
        {"ckpt_resume_run", test_ckpt_resume_run, 0},
        {"ckpt_power_cut", test_ckpt_power_cut, 60},
        {"ckpt_foreign_and_bad_path", test_ckpt_foreign_and_bad_path, 0},
        {"ckpt_foreign_names_from_caller", test_ckpt_foreign_names_from_caller, 0},
        {"ckpt_stray_step_file", test_ckpt_stray_step_file, 0},
        {"ckpt_injected_failures", test_ckpt_injected_failures, 60},
        {"ckpt_retention_crash", test_ckpt_retention_crash, 60},
        {"ckpt_full_disk_tmpfs", test_ckpt_full_disk_tmpfs, 0},
        {"ranks_resume_alike", test_ranks_resume_alike, 60},
        {"cli_tools", test_cli_tools, 60},
        {"python_reader_agrees", test_python_reader_agrees, 0},
    };
    return dt_test_main("test_ckpt", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
