/* test_worker.c - `dtrain worker` as a user runs it: every shipped config trains (its loss falls
 * over a short run; one of several ranks or an elastic rendezvous through the launcher), the same seed gives bit-identical losses, a bad data file or a bad job is a
 * clear error with a non-zero exit and an error file, SIGTERM stops at a step boundary, epochs
 * and gradient accumulation count steps as documented. */
#include <cJSON.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cpuset.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "runtime/train/data/data.h"
#include "runtime/train/optim.h"
#include "runtime/train/ckpt/safetensors.h"
#include "runtime/train/worker.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* The fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt dt_test_fmt

static const char *repo_dir(void) { return dt_test_repo_dir("configs"); }

/* Runs `dtrain worker ARGS` (with ENV before it) in a shell; output in *out (caller frees). */
static int worker(const char *env, const char *args, char **out, int timeout_s)
{
    const char *cmd = fmt("cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK "
                          "-u LOCAL_WORLD_SIZE -u DTRAIN_OUTPUT_DIR %s '%s' worker %s",
                          dt_test_tmpdir(), env ? env : "", dt_test_dtrain_bin(), args);
    return dt_test_run(cmd, out, timeout_s);
}

typedef struct run_metrics {
    int ntrain, neval;
    double loss[512];       /* train loss per record */
    char last_loss[64];     /* the final train loss exactly as written */
    int64_t last_step;
    double val_loss[64];
} run_metrics;

static void read_metrics(const char *outdir, run_metrics *m)
{
    memset(m, 0, sizeof *m);
    char path[PATH_MAX + 32], *text = NULL;
    size_t len;
    dt_err err = {0};
    snprintf(path, sizeof path, "%s/metrics.jsonl", outdir);
    DT_REQUIRE_OK(dt_read_file(path, &text, &len, &err), &err);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        DT_REQUIRE(o);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        DT_REQUIRE(type);
        if (!strcmp(type, "train") && m->ntrain < 512) {
            m->loss[m->ntrain++] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss"));
            m->last_step = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step"));
            const char *at = strstr(line, "\"loss\":");
            DT_REQUIRE(at);
            at += 7;
            size_t n = strcspn(at, ",}");
            snprintf(m->last_loss, sizeof m->last_loss, "%.*s", (int)n, at);
        } else if (!strcmp(type, "eval") && m->neval < 64) {
            m->val_loss[m->neval++] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "val_loss"));
        }
        cJSON_Delete(o);
    }
    free(text);
}

static const char *outdir(const char *name) { return fmt("%s/%s", dt_test_tmpdir(), name); }

/* ---- every shipped config trains ------------------------------------------------------------ */

/* Short-run overrides per config (a few seconds each on a loaded 2-core machine); a config
 * that is not listed runs with the default below. The loss must fall by `factor`. */
#define GPT_SHORT "train.steps=40 train.warmup_steps=5 train.eval_every=20"
static const struct {
    const char *name;
    const char *overrides;
    double factor;
    bool val_falls; /* BatchNorm's running statistics lag in a 20-step run: val loss is noise */
    const char *shows; /* the mode ran: in the output or metrics.jsonl (NULL: nothing to look for) */
} short_runs[] = {
    {"quickstart.ini", GPT_SHORT, 0.85, true, NULL},
    {"zero3.ini", GPT_SHORT, 0.85, true, "(2 ranks, ZeRO-3 over 2 ranks)"},
    {"tp2.ini", GPT_SHORT, 0.85, true, "(2 ranks, tensor 2 x data 1)"},
    {"tp2-sp.ini", GPT_SHORT, 0.85, true, "(2 ranks, tensor 2 x data 1)"},
    {"pp2.ini", GPT_SHORT, 0.85, true, "(2 ranks, pipeline 2 x 4 micro-batches (1f1b))"},
    {"fp16.ini", GPT_SHORT, 0.85, true, "\"loss_scale\":65536,\"skipped_steps\":0"},
    {"elastic.ini", GPT_SHORT, 0.85, true, "attempt 0 (round 0): node 0 of 1"},
    {"llama.ini", GPT_SHORT, 0.85, true, NULL},
    {"mlp.ini", "train.steps=60 train.warmup_steps=5 train.eval_every=30", 0.8, true, NULL},
    {"resnet50.ini", "train.steps=30 train.warmup_steps=5 train.eval_every=15 "
                     "train.batch_size=16 data.synthetic_samples=1024", 0.9, false, NULL},
    {"resnet.ini", "train.steps=20 train.warmup_steps=2 train.eval_every=10 train.batch_size=16 "
                   "data.synthetic_samples=1024", 0.9, false, NULL},
};

/* The value of section.key in the job `dtrain --print-config PATH` resolves ("" if absent). */
static void resolved_value(const char *path, const char *section, const char *key, char *val,
                           size_t cap)
{
    char *out = NULL, sec[64] = "";
    val[0] = '\0';
    int rc = dt_test_run(fmt("'%s' --print-config '%s'", dt_test_dtrain_bin(), path), &out, 30);
    DT_CHECK_MSG(rc == 0, "dtrain --print-config %s: exit %d: %s", path, rc, out ? out : "");
    if (rc || !out) {
        free(out);
        return;
    }
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        size_t kl = strlen(key);
        if (line[0] == '[')
            snprintf(sec, sizeof sec, "%.*s", (int)strcspn(line + 1, "]"), line + 1);
        else if (!strcmp(sec, section) && !strncmp(line, key, kl) && !strncmp(line + kl, " = ", 3))
            snprintf(val, cap, "%s", line + kl + 3);
    }
    free(out);
}

/* A config that asks for more than one worker, or for an elastic rendezvous, runs as shipped:
 * through the launcher (`dtrain CONFIG`), which reads elastic.nproc_per_node and [rendezvous]
 * from it; c10d on a port of its own (port 0, this agent hosting the store), never the file's
 * fixed one. Any other runs as `dtrain worker CONFIG`. Returns whether to launch; *rdzv gets
 * the rendezvous overrides. */
static bool launched(const char *path, const char **rdzv, int *nproc_out)
{
    char nproc[64], backend[64];
    resolved_value(path, "elastic", "nproc_per_node", nproc, sizeof nproc);
    *nproc_out = atoi(nproc);
    resolved_value(path, "rendezvous", "backend", backend, sizeof backend);
    *rdzv = !strcmp(backend, "c10d") ? fmt("rendezvous.endpoint=127.0.0.1:0 rendezvous.is_host=true "
                                           "rendezvous.id=cfg%d", (int)getpid())
                                     : "";
    return strcmp(nproc, "1") != 0 || strcmp(backend, "static") != 0;
}

static void check_config(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const char *ovr = "train.steps=30 train.eval_every=15";
    double factor = 0.9;
    bool val_falls = true;
    const char *shows = NULL;
    for (size_t i = 0; i < DT_ARRAY_LEN(short_runs); i++)
        if (!strcmp(short_runs[i].name, base)) {
            ovr = short_runs[i].overrides;
            factor = short_runs[i].factor;
            val_falls = short_runs[i].val_falls;
            shows = short_runs[i].shows;
        }
    char *out = NULL;
    const char *od = outdir(base);
    const char *rdzv = "";
    int nproc = 0;
    bool launch = launched(path, &rdzv, &nproc);
    const char *args = fmt("'%s' job.output_dir='%s' job.device=cpu job.log_every=1 %s %s", path,
                           od, ovr, rdzv);
    int rc = launch ? dt_test_run(fmt("cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK "
                                      "-u LOCAL_WORLD_SIZE -u DTRAIN_OUTPUT_DIR '%s' --log-dir "
                                      "'%s/logs' %s", dt_test_tmpdir(), dt_test_dtrain_bin(),
                                      dt_test_tmpdir(), args), &out, 300)
                    : worker(NULL, args, &out, 300);
    DT_CHECK_MSG(rc == 0, "%s: exit %d: %s", base, rc, out);
    if (rc == 0) { /* the shipped layout ran: as many ranks as the file asks for, its mode */
        char *text = NULL;
        DT_REQUIRE(dt_read_file(fmt("%s/metrics.jsonl", od), &text, NULL, NULL) == 0);
        if (launch)
            DT_CHECK_CONTAINS(out, "all workers succeeded");
        if (launch && nproc > 0)
            DT_CHECK_MSG(strstr(text, fmt("{\"type\":\"layout\",\"world_size\":%d,", nproc)),
                         "%s: no layout record of %d ranks in metrics.jsonl", base, nproc);
        if (shows)
            DT_CHECK_MSG(strstr(out, shows) || strstr(text, shows),
                         "%s: neither its output nor metrics.jsonl shows %s", base, shows);
        free(text);
    }
    if (rc == 0) {
        DT_CHECK_CONTAINS(out, "dtrain: done after");
        run_metrics m;
        read_metrics(od, &m);
        DT_REQUIRE(m.ntrain >= 4);
        double first = m.loss[0], last = (m.loss[m.ntrain - 1] + m.loss[m.ntrain - 2]) / 2;
        DT_CHECK_MSG(last < first * factor, "%s: loss %.4f -> %.4f did not fall below x%.2f",
                     base, first, last, factor);
        DT_CHECK_MSG(m.neval >= 1, "%s: no evaluation", base);
        if (m.neval >= 1)
            DT_CHECK_MSG(val_falls ? m.val_loss[m.neval - 1] < first
                                   : isfinite(m.val_loss[m.neval - 1]), "%s: val loss %.4f vs first %.4f", base,
                         m.val_loss[m.neval - 1], first);
    }
    free(out);
}

static void test_configs_train(void)
{
    const char *pat = fmt("%s/configs/*.ini", repo_dir());
    glob_t g;
    DT_REQUIRE(glob(pat, 0, NULL, &g) == 0);
    DT_CHECK(g.gl_pathc >= 10); /* quickstart, mlp, mlp-dp, resnet, and one per parallel mode */
    for (size_t i = 0; i < g.gl_pathc; i++)
        check_config(g.gl_pathv[i]);
    globfree(&g);
}

/* The token models train on synthetic token sequences too (llama as gpt and bert): the source is
 * the synthetic one and the loss falls (a vocabulary of 16: the sequences' successor table has
 * 16^2 contexts, learnt in a hundred steps; 256^2 would take thousands). */
static void test_llama_synthetic(void)
{
    char *out = NULL;
    const char *od = outdir("llama-synthetic");
    int rc = worker(NULL, fmt("'%s/configs/llama.ini' job.output_dir='%s' job.device=cpu "
                              "job.log_every=1 data.type=synthetic data.vocab_size=16 train.steps=120 "
                              "train.warmup_steps=10 train.eval_every=60", repo_dir(), od),
                    &out, 300);
    DT_CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "synthetic token sequences");
    if (rc == 0) {
        run_metrics m;
        read_metrics(od, &m);
        DT_REQUIRE(m.ntrain >= 4);
        double first = m.loss[0], last = (m.loss[m.ntrain - 1] + m.loss[m.ntrain - 2]) / 2;
        DT_CHECK_MSG(last < first * 0.85, "loss %.4f -> %.4f did not fall below x0.85", first, last);
    }
    free(out);
}

/* ---- determinism ---------------------------------------------------------------------------- */

static void test_same_seed_bit_identical(void)
{
    char *out = NULL;
    static run_metrics a, b, c;
    for (int i = 0; i < 3; i++) {
        const char *args =
            fmt("'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu train.steps=25 "
                "job.log_every=5 train.grad_accum=2 %s",
                repo_dir(), outdir(i == 0 ? "a" : i == 1 ? "b" : "c"),
                i == 2 ? "job.seed=99" : "");
        int rc = worker(NULL, args, &out, 120);
        DT_REQUIRE(rc == 0 || (fprintf(stderr, "%s\n", out), 0));
        free(out);
        out = NULL;
    }
    read_metrics(outdir("a"), &a);
    read_metrics(outdir("b"), &b);
    read_metrics(outdir("c"), &c);
    DT_REQUIRE(a.ntrain == b.ntrain && a.ntrain > 2);
    DT_CHECK_STR(a.last_loss, b.last_loss);
    for (int i = 0; i < a.ntrain; i++)
        DT_CHECK_MSG(a.loss[i] == b.loss[i], "record %d: %.17g vs %.17g", i, a.loss[i],
                     b.loss[i]);
    DT_CHECK_MSG(strcmp(a.last_loss, c.last_loss) != 0, "another seed gave the same loss %s",
                 c.last_loss);
    /* not only the losses: the final parameters, bit for bit */
    char *pa = NULL, *pb = NULL, *pc = NULL;
    size_t la = 0, lb = 0, lc = 0;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(fmt("%s/checkpoints/step_25/model.safetensors", outdir("a")), &pa,
                               &la, &err), &err);
    DT_REQUIRE_OK(dt_read_file(fmt("%s/checkpoints/step_25/model.safetensors", outdir("b")), &pb,
                               &lb, &err), &err);
    DT_REQUIRE_OK(dt_read_file(fmt("%s/checkpoints/step_25/model.safetensors", outdir("c")), &pc,
                               &lc, &err), &err);
    DT_CHECK_MSG(la == lb && memcmp(pa, pb, la) == 0, "the same seed gave other parameters");
    DT_CHECK_MSG(la != lc || memcmp(pa, pc, la) != 0, "another seed gave the same parameters");
    free(pa);
    free(pb);
    free(pc);
}

/* Evaluation counts every validation sample once: the same parameters give the same val loss
 * and accuracy whatever the batch size, also when the last batch wraps around the set. */
static void test_eval_counts_each_sample_once(void)
{
    const char *base = "job.device=cpu data.synthetic_samples=100 train.steps=5";
    char *out = NULL;
    int rc = worker(NULL, fmt("'%s/configs/mlp.ini' job.output_dir='%s' %s train.batch_size=8 "
                              "checkpoint.every=5", repo_dir(), outdir("ev"), base), &out, 120);
    DT_REQUIRE(rc == 0 || (fprintf(stderr, "%s\n", out), 0));
    DT_CHECK_CONTAINS(out, "val: last 10 samples");
    free(out);
    const int sizes[] = {10, 8, 3}; /* one batch; 8 + 2 (6 wrapped); 3+3+3+1 (2 wrapped) */
    double loss[3], acc[3];
    for (int i = 0; i < 3; i++) {
        const char *od = outdir(fmt("ev%d", sizes[i]));
        rc = worker(NULL, fmt("'%s/configs/mlp.ini' job.output_dir='%s' %s train.batch_size=%d "
                              "checkpoint.resume='%s/checkpoints/step_5'",
                              repo_dir(), od, base, sizes[i], outdir("ev")), &out, 120);
        DT_REQUIRE(rc == 0 || (fprintf(stderr, "%s\n", out), 0));
        const char *at = strstr(out, "eval at step 5 | val_loss ");
        DT_REQUIRE(at && sscanf(at, "eval at step 5 | val_loss %lf | val_acc %lf", &loss[i],
                                &acc[i]) == 2);
        free(out);
        DT_CHECK_MSG(fabs(acc[i] * 10 - round(acc[i] * 10)) < 1e-6,
                     "batch %d: accuracy %.6f is not a count out of 10", sizes[i], acc[i]);
    }
    for (int i = 1; i < 3; i++) {
        DT_CHECK_MSG(fabs(loss[i] - loss[0]) < 1e-3, "batch %d: val_loss %.4f, one batch %.4f",
                     sizes[i], loss[i], loss[0]);
        DT_CHECK_NEAR(acc[i], acc[0], 1e-6);
    }
}

static void test_diverged_hint(void)
{
    static dt_job j;
    j.grad_clip = 1.0;
    DT_CHECK(!strstr(dt_trainer_diverged_hint(&j), "set train.grad_clip"));
    DT_CHECK_CONTAINS(dt_trainer_diverged_hint(&j), "already on");
    j.grad_clip = 0;
    DT_CHECK_CONTAINS(dt_trainer_diverged_hint(&j), "set train.grad_clip");
}

/* ---- failures --------------------------------------------------------------------------------- */

static void test_bad_data_file(void)
{
    char *out = NULL;
    const char *shard = fmt("%s/corrupt_train.bin", dt_test_tmpdir());
    const char *errfile = fmt("%s/error.json", dt_test_tmpdir());
    uint32_t tok[300];
    for (int i = 0; i < 300; i++)
        tok[i] = (uint32_t)i;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_data_write_token_shard(shard, tok, 300, &err), &err);
    DT_REQUIRE(truncate(shard, 1024 + 2 * 200) == 0); /* the header says 300 tokens */
    const char *env = fmt("DTRAIN_ERROR_FILE='%s'", errfile);
    const char *args = fmt("'%s/configs/quickstart.ini' job.output_dir='%s' job.device=cpu "
                           "data.type=tokens data.path='%s'",
                           repo_dir(), outdir("bad"), shard);
    int rc = worker(env, args, &out, 60);
    DT_CHECK_INT(rc, 2); /* every restart would fail the same way: the configuration code */
    DT_CHECK_CONTAINS(out, shard);
    DT_CHECK_CONTAINS(out, "truncated");
    free(out);
    char *rec = NULL;
    size_t len;
    DT_REQUIRE_OK(dt_read_file(errfile, &rec, &len, &err), &err);
    cJSON *o = cJSON_Parse(rec);
    DT_REQUIRE(o);
    const char *msg = cJSON_GetStringValue(
        cJSON_GetObjectItem(cJSON_GetObjectItem(o, "message"), "message"));
    DT_CHECK_CONTAINS(msg, shard);
    DT_CHECK_INT(cJSON_GetNumberValue(
                     cJSON_GetObjectItem(cJSON_GetObjectItem(o, "dtrain"), "exit_code")),
                 2);
    cJSON_Delete(o);
    free(rec);
}

static void test_bad_job(void)
{
    char *out = NULL;
    const char *errfile = fmt("%s/error.json", dt_test_tmpdir());
    const char *env = fmt("TORCHELASTIC_ERROR_FILE='%s'", errfile);
    const char *args = fmt("'%s/configs/mlp.ini' train.lrr=1", repo_dir());
    DT_CHECK_INT(worker(env, args, &out, 30), 2); /* DT_EXIT_CONFIG: the agent won't restart */
    DT_CHECK_CONTAINS(out, "train.lr");
    free(out);
    char *rec = NULL;
    size_t len;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(errfile, &rec, &len, &err), &err);
    DT_CHECK_CONTAINS(rec, "lrr");
    DT_CHECK_CONTAINS(rec, "\"exit_code\":2");
    free(rec);
    /* usage */
    DT_CHECK_INT(worker(NULL, "", &out, 30), 2);
    DT_CHECK_CONTAINS(out, "usage: dtrain worker");
    free(out);
    DT_CHECK_INT(worker(NULL, "--help", &out, 30), 0);
    free(out);
    /* a missing job file */
    DT_CHECK_INT(worker(NULL, "no-such-job.ini", &out, 30), 2);
    DT_CHECK_CONTAINS(out, "no-such-job.ini");
    free(out);
}

static void test_multi_rank_without_store(void)
{
    char *out = NULL;
    const char *args =
        fmt("'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu", repo_dir(), outdir("mr"));
    DT_CHECK_INT(worker("RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2", args, &out, 60), 1);
    DT_CHECK_CONTAINS(out, "DTRAIN_STORE_ADDR");
    free(out);
    DT_CHECK_INT(worker("RANK=2 WORLD_SIZE=2", args, &out, 30), 1);
    DT_CHECK_CONTAINS(out, "RANK=2 is not below WORLD_SIZE=2");
    free(out);
    /* DP is one process: several workers of it are a mistake the DP strategy names */
    const char *dp = fmt("'%s/configs/mlp-dp.ini' job.output_dir='%s' job.device=cpu",
                         repo_dir(), outdir("mr-dp"));
    DT_CHECK_INT(worker("RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2", dp, &out, 60), 1);
    DT_CHECK_CONTAINS(out, "job.strategy = dp: one process drives all 2 replicas");
    free(out);
}

/* ---- CPU binding ------------------------------------------------------------------------------ */

/* The CPU list after "local rank R runs on CPU(s) " in out, or "" when absent. */
static const char *bound_cpus(const char *out, int rank)
{
    const char *key = fmt("local rank %d runs on CPU(s) ", rank), *p = strstr(out, key);
    if (!p)
        return "";
    p += strlen(key);
    return fmt("%.*s", (int)strcspn(p, "\n"), p);
}

static void test_cpu_bind(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < 2)
        DT_SKIP("needs at least 2 CPUs to bind 2 workers to");
    for (int none = 0; none < 2; none++) {
        char *out = NULL;
        const char *cmd = fmt("cd '%s' && DTRAIN_LOG=debug '%s' --standalone --nproc-per-node=2 "
                              "'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu "
                              "train.steps=2 checkpoint.every=0 %s 2>&1",
                              dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(),
                              outdir(none ? "bind-none" : "bind"),
                              none ? "job.cpu_bind=none" : "");
        int rc = dt_test_run(cmd, &out, 120);
        DT_REQUIRE(rc == 0 || (fprintf(stderr, "%s\n", out), 0));
        const char *a = bound_cpus(out, 0), *b = bound_cpus(out, 1);
        if (none) {
            DT_CHECK_MSG(!*a && !*b, "job.cpu_bind=none, yet bound: \"%s\", \"%s\"", a, b);
        } else {
            /* Two disjoint, non-empty shares: on 2 CPUs "0" and "1". */
            DT_CHECK_MSG(*a && *b && strcmp(a, b) != 0, "shares \"%s\" and \"%s\"", a, b);
            DT_CHECK_CONTAINS(out, "job.cpu_bind = auto: each of this node's 2 workers");
        }
        free(out);
    }
}

/* GPU workers: a backend that names its GPUs' PCI addresses is bound near them. A cpu backend
 * stands in for cuda (the glue is the same), with a sysfs of our own. */
static int fake_bus_id(dt_backend *be, int device, char *buf, size_t cap)
{
    (void)be;
    snprintf(buf, cap, "0000:%02X:00.0", 0x10 + device);
    return 0;
}

static void test_cpu_bind_gpu(void)
{
    cpu_set_t cur, want, now;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_cpuset_current(&cur, &err), &err);
    if (CPU_COUNT(&cur) < 2)
        DT_SKIP("needs at least 2 CPUs to bind 2 workers to");
    char list[256];
    dt_cpuset_format(&cur, list, sizeof list);
    const char *sys = fmt("%s/sys", dt_test_tmpdir());
    for (int k = 0; k < 2; k++) {
        const char *dir = fmt("%s/bus/pci/devices/0000:%02x:00.0", sys, 0x10 + k);
        DT_REQUIRE(system(fmt("mkdir -p '%s'", dir)) == 0);
        /* GPU 0 and 1 both near every CPU here */
        DT_REQUIRE(dt_test_write_file(fmt("%s/local_cpulist", dir), fmt("%s\n", list)) == 0);
    }
    setenv("DTRAIN_SYSFS", sys, 1);
    static dt_job job;
    job.cpu_bind = DT_CPU_BIND_AUTO;
    dt_backend *be = NULL;
    dt_backend_opts bo;
    dt_backend_opts_default(&bo);
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, &bo, &err), &err);
    be->device_pci_bus_id = fake_bus_id;

    /* no NUMA information for GPU 1's node: not bound at all */
    DT_REQUIRE(dt_test_write_file(fmt("%s/bus/pci/devices/0000:11:00.0/local_cpulist", sys), "\n") == 0);
    dt_strategy_bind_cpus(&job, be, 1, 2);
    DT_REQUIRE_OK(dt_cpuset_current(&now, &err), &err);
    DT_CHECK(CPU_EQUAL(&now, &cur));

    /* both GPUs near every CPU here: local rank 1 gets the second share */
    DT_REQUIRE(dt_test_write_file(fmt("%s/bus/pci/devices/0000:11:00.0/local_cpulist", sys),
                          fmt("%s\n", list)) == 0);
    dt_strategy_bind_cpus(&job, be, 1, 2);
    DT_REQUIRE_OK(dt_cpuset_share(&cur, 1, 2, &want, &err), &err);
    DT_REQUIRE_OK(dt_cpuset_current(&now, &err), &err);
    DT_CHECK(CPU_EQUAL(&now, &want));
    be->close(be);
}

/* ---- fp16 loss scaling (the CPU computes in fp32; the scaler runs all the same) --------- */

/* A trainer of configs/mlp.ini on the CPU with extra overrides (NULL-terminated). */
static void trainer_open(dt_trainer *t, const char *name, const char *const *more)
{
    static dt_job job;
    dt_config_errors errs = {0};
    dt_err err = {0};
    char *ov[16];
    int n = 0;
    ov[n++] = (char *)fmt("job.output_dir=%s", outdir(name));
    ov[n++] = "job.device=cpu";
    ov[n++] = "checkpoint.resume=never";
    ov[n++] = "checkpoint.every=0";
    for (; more && *more && n < 16; more++)
        ov[n++] = (char *)*more;
    DT_REQUIRE_OK(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), ov, n, &errs, &err),
                  &err);
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.world_size = env.local_world_size = 1;
    dt_strlcpy(env.run_id, name, sizeof env.run_id);
    memset(t, 0, sizeof *t);
    DT_REQUIRE_OK(dt_trainer_init(t, &job, &env, &err), &err);
}

/* Multiplies the model's last weight matrix (the classifier's) by f: its logits become huge
 * but finite, and so does the loss, while the gradients reaching the hidden layers times a
 * large loss scale overflow float. */
static void blow_up_classifier(dt_trainer *t, float f)
{
    dt_model *m = t->model;
    const dt_tensor_info *w = NULL;
    for (int i = 0; i < m->num_tensors; i++)
        if (m->tensors[i].ndim == 2)
            w = &m->tensors[i];
    DT_REQUIRE(w != NULL);
    float *h = malloc(w->numel * sizeof *h);
    DT_REQUIRE(h != NULL);
    t->be->memcpy_d2h(t->be, h, m->params + w->offset, w->numel * sizeof *h);
    for (size_t i = 0; i < w->numel; i++)
        h[i] *= f;
    t->be->memcpy_h2d(t->be, m->params + w->offset, h, w->numel * sizeof *h);
    free(h);
}

static void test_fp16_loss_scaling(void)
{
    dt_err err = {0};
    /* Scaling by a power of two is exact: fp16 (scale 2^16) trains bit for bit as fp32, on one
     * replica and through DP (whose reduce sums the scaled gradients of both replicas). */
    dt_trainer a, b;
    for (int dp = 0; dp < 2; dp++) {
        const char *const fp32[] = {dp ? "job.strategy=dp" : NULL, NULL};
        const char *const fp16[] = {"train.precision=fp16", dp ? "job.strategy=dp" : NULL, NULL};
        trainer_open(&a, dp ? "fp32-dp" : "fp32", fp32);
        trainer_open(&b, dp ? "fp16-dp" : "fp16", fp16);
        DT_CHECK(!a.scaler.on && b.scaler.on && b.scaler.scale == 65536.0);
        DT_CHECK_STR(a.s->ops->name, dp ? "dp" : "single");
        DT_CHECK_STR(b.s->ops->name, dp ? "dp" : "single");
        for (int s = 0; s < 4; s++) {
            DT_REQUIRE_OK(dt_trainer_step(&a, &err), &err);
            DT_REQUIRE_OK(dt_trainer_step(&b, &err), &err);
            DT_CHECK_MSG(a.loss == b.loss && a.grad_norm == b.grad_norm,
                         "%s step %d: fp32 loss %.9g norm %.9g, fp16 (scaled) loss %.9g norm "
                         "%.9g", dp ? "DP" : "one replica", s, a.loss, a.grad_norm, b.loss,
                         b.grad_norm);
        }
        dt_trainer_close(&a);
        dt_trainer_close(&b);
    }

    /* Overflowing gradients: those steps are skipped (no update, the optimiser's count stays)
     * and the scale halves until they fit; then training goes on. */
    static const char *const big[] = {"train.precision=fp16", "train.loss_scale=1e12", NULL};
    trainer_open(&a, "fp16-overflow", big);
    blow_up_classifier(&a, 1e30f);
    DT_REQUIRE_OK(dt_trainer_step(&a, &err), &err); /* overflows right away */
    int steps = 1;
    DT_CHECK_INT((int)a.scaler.skipped, 1);
    DT_CHECK(a.scaler.scale == 5e11);
    DT_CHECK_INT((int)a.optim->t, 0);
    while (a.optim->t == 0 && steps < DT_LOSS_SCALER_MAX_SKIPS) {
        DT_REQUIRE_OK(dt_trainer_step(&a, &err), &err);
        steps++;
    }
    DT_CHECK_INT((int)a.optim->t, 1); /* the first step that fit updated */
    DT_CHECK_INT((int)a.step, steps);
    DT_CHECK_INT((int)a.scaler.skipped, steps - 1);
    DT_CHECK(a.scaler.scale == ldexp(1e12, -(steps - 1)));
    DT_CHECK(isfinite(a.grad_norm) && isfinite(a.loss));
    dt_trainer_close(&a);

    /* Gradients that overflow at every scale the scaler tries: divergence, said so. */
    static const char *const huge[] = {"train.precision=fp16", "train.loss_scale=1e38", NULL};
    trainer_open(&a, "fp16-diverged", huge);
    blow_up_classifier(&a, 1e30f);
    int rc = 0;
    for (int s = 0; s < DT_LOSS_SCALER_MAX_SKIPS && !rc; s++)
        rc = dt_trainer_step(&a, &err);
    DT_CHECK_INT(rc, -EDOM);
    DT_CHECK_CONTAINS(err.msg, fmt("as in the %d steps before it", DT_LOSS_SCALER_MAX_SKIPS - 1));
    dt_trainer_close(&a);
}

/* The scale and its clean-step count travel in the checkpoint: a resumed run goes on from
 * where the scale stood, not from train.loss_scale. */
static void test_fp16_scale_resumes(void)
{
    const char *dir = outdir("fp16-resume");
    const char *run = fmt("cd '%s' && '%s' --standalone '%s/configs/mlp.ini' job.output_dir='%s' "
                          "job.device=cpu train.precision=fp16 train.loss_scale=1000 "
                          "train.loss_scale_window=2 checkpoint.every=5 job.log_every=1 2>&1",
                          dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), dir);
    char *out = NULL;
    DT_REQUIRE(dt_test_run(fmt("%s train.steps=5", run), &out, 120) == 0 ||
               (fprintf(stderr, "%s\n", out), 0));
    free(out);
    out = NULL;
    DT_REQUIRE(dt_test_run(fmt("%s train.steps=7", run), &out, 120) == 0 ||
               (fprintf(stderr, "%s\n", out), 0));
    DT_CHECK_CONTAINS(out, "resumed from");
    free(out);
    char *m = dt_test_slurp(fmt("%s/metrics.jsonl", dir));
    DT_REQUIRE(m != NULL);
    /* 1000 doubles after steps 2 and 4 (4000), and after 6 (8000): the count of clean steps
     * (1 after step 5) came back too. From scratch, step 7 would have shown 2000. */
    DT_CHECK_CONTAINS(m, "\"step\":5,");
    const char *last = strstr(m, "\"step\":7,");
    DT_REQUIRE(last != NULL);
    DT_CHECK_CONTAINS(last, "\"loss_scale\":8000,");
    free(m);
}

/* ---- signals, epochs, accumulation ------------------------------------------------------------ */

static void test_sigterm_stops_at_step_boundary(void)
{
    const char *od = outdir("sig");
    char *out = NULL;
    /* start a long run, wait for its first metrics record, then SIGTERM it */
    const char *cmd = fmt(
             "cd '%s' && { env -u RANK -u WORLD_SIZE '%s' worker '%s/configs/mlp.ini' "
             "job.output_dir='%s' job.device=cpu train.steps=100000000 job.log_every=1 & "
             "pid=$!; i=0; while [ ! -s '%s/metrics.jsonl' ] && [ $i -lt 600 ]; do sleep 0.1; "
             "i=$((i+1)); done; kill -TERM $pid; wait $pid; echo \"exit=$?\"; }",
             dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), od, od);
    int rc = dt_test_run(cmd, &out, 120);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "exit=75");
    DT_CHECK_CONTAINS(out, "dtrain: stopped after");
    free(out);
    run_metrics m;
    read_metrics(od, &m);
    DT_CHECK(m.ntrain >= 1);
}

/* Under Slurm every process of the job gets SIGTERM and the agent forwards it again: the second
 * one must not kill the worker before its checkpoint is on disk. SIGTERM goes on every 50 ms
 * until the worker has exited; the step is made long (a wide MLP, one thread), so several land
 * while it finishes the step or writes ("already stopping" in its output shows they did). */
static void test_sigterm_twice_still_saves(void)
{
    const char *od = outdir("sig2");
    char *out = NULL;
    const char *cmd = fmt(
             "cd '%s' && { env -u RANK -u WORLD_SIZE -u DTRAIN_AGENT_PID '%s' worker "
             "'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu train.steps=100000000 "
             "job.log_every=1 model.hidden=2048,2048 train.batch_size=512 train.threads=1 & "
             "pid=$!; i=0; while [ ! -s '%s/metrics.jsonl' ] && [ $i -lt 600 ]; do sleep 0.1; "
             "i=$((i+1)); done; kill -TERM $pid; for i in $(seq 400); do sleep 0.05; "
             "st=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null); "
             "if [ -z \"$st\" ] || [ \"$st\" = Z ]; then break; fi; kill -TERM $pid; done; "
             "wait $pid; echo \"exit=$?\"; }",
             dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), od, od);
    int rc = dt_test_run(cmd, &out, 120);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "already stopping");
    DT_CHECK_CONTAINS(out, "checkpoint: saved");
    DT_CHECK_CONTAINS(out, "exit=75");
    free(out);
    glob_t g;
    DT_CHECK_MSG(glob(fmt("%s/checkpoints/step_*/state.json", od), 0, NULL, &g) == 0 &&
                     g.gl_pathc == 1, "no checkpoint under %s/checkpoints", od);
    globfree(&g);
}

/* A worker whose agent is gone (DTRAIN_AGENT_PID names a process that is not its parent) exits
 * at once with a message instead of training on alone. */
static void test_agent_gone(void)
{
    char *out = NULL;
    double t0 = dt_test_now();
    int rc = worker("DTRAIN_AGENT_PID=1",
                    fmt("'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu "
                        "train.steps=100000000", repo_dir(), outdir("gone")), &out, 60);
    DT_CHECK_MSG(rc != 0 && rc != -1, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "agent that started this worker (pid 1) is gone");
    DT_CHECK_MSG(dt_test_now() - t0 < 30, "it took %.1f s to notice", dt_test_now() - t0);
    free(out);
}

static void test_epochs_and_accumulation(void)
{
    char *out = NULL;
    /* 1000 synthetic samples, 10% held out: 900 train / (batch 32 x accum 2) = 14 steps per
     * epoch (drop_last), 2 epochs = 28 steps */
    const char *args = fmt(
             "'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu train.steps=0 "
             "train.epochs=2 train.batch_size=32 train.grad_accum=2 data.synthetic_samples=1000 "
             "data.val_fraction=0.1 job.log_every=1",
             repo_dir(), outdir("ep"));
    int rc = worker(NULL, args, &out, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "done after 28 steps");
    free(out);
    run_metrics m;
    read_metrics(outdir("ep"), &m);
    DT_CHECK_INT(m.last_step, 28);
    DT_CHECK_INT(m.ntrain, 28);
}

/* ---- the job is read only ----------------------------------------------------------------- */

/* The job text after its first line (which names the file it was read from). */
static const char *job_body(const char *text)
{
    const char *nl = strchr(text, '\n');
    return nl ? nl + 1 : text;
}

/* A DP job draws dp_replicas x batch_size samples per micro-step, but its checkpoint records the
 * job as it was written (batch_size per replica), and that job reads back to the same job: the
 * trainer derives the rank's batch instead of writing it into the job. */
static void test_dp_checkpoint_job_reads_back(void)
{
    const char *od = outdir("dp-job");
    char *out = NULL;
    const char *ov[] = {"job.device=cpu", "train.steps=2", "train.batch_size=48",
                        "job.dp_replicas=2", "checkpoint.every=0", "train.eval_every=0",
                        fmt("job.output_dir=%s", od)};
    int rc = worker(NULL, fmt("'%s/configs/mlp-dp.ini' %s %s %s %s %s %s '%s'", repo_dir(), ov[0],
                              ov[1], ov[2], ov[3], ov[4], ov[5], ov[6]), &out, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "batch 96 x accum 1 x 1 ranks"); /* the rank's batch: 2 x 48 */
    DT_CHECK_CONTAINS(out, "DataParallel x 2");
    free(out);
    char *text = NULL;
    size_t len;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(fmt("%s/checkpoints/step_2/state.json", od), &text, &len, &err),
                  &err);
    cJSON *st = cJSON_Parse(text);
    DT_REQUIRE(st);
    const char *saved = cJSON_GetStringValue(cJSON_GetObjectItem(st, "job"));
    DT_REQUIRE(saved);
    DT_CHECK_CONTAINS(saved, "\nbatch_size = 48\n");
    DT_CHECK_CONTAINS(saved, "\ndp_replicas = 2\n");
    /* the job as loaded from the file with the same overrides prints the same text */
    static dt_job a, b;
    dt_config_errors errs = {0};
    DT_REQUIRE_OK(dt_job_load(&a, fmt("%s/configs/mlp-dp.ini", repo_dir()), (char **)ov,
                              (int)DT_ARRAY_LEN(ov), &errs, &err), &err);
    char *printed = NULL;
    size_t plen = 0;
    FILE *f = open_memstream(&printed, &plen);
    DT_REQUIRE(f);
    dt_job_print(&a, f);
    fclose(f);
    DT_CHECK_STR(job_body(saved), job_body(printed));
    /* and the recorded job, read back as a job file, is that job again */
    const char *copy = fmt("%s/dp-job.ini", dt_test_tmpdir());
    DT_REQUIRE(dt_test_write_file(copy, saved) == 0);
    DT_REQUIRE_OK(dt_job_load(&b, copy, NULL, 0, &errs, &err), &err);
    DT_CHECK_INT(b.batch_size, 48);
    DT_CHECK_INT(b.dp_replicas, 2);
    char *again = NULL;
    f = open_memstream(&again, &plen);
    DT_REQUIRE(f);
    dt_job_print(&b, f);
    fclose(f);
    DT_CHECK_STR(job_body(again), job_body(printed));
    free(again);
    free(printed);
    cJSON_Delete(st);
    free(text);
}

/* Running a finished run again (`make run`, then the README's next command) trains nothing, and
 * says so with what to do, instead of a summary of zeros. */
static void test_complete_run_says_what_to_do(void)
{
    const char *args = fmt("'%s/configs/mlp.ini' job.output_dir='%s' job.device=cpu "
                           "train.steps=3 checkpoint.every=0 train.eval_every=0",
                           repo_dir(), outdir("complete"));
    char *out = NULL;
    int rc = worker(NULL, args, &out, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "dtrain: done after 3 steps");
    free(out);
    rc = worker(NULL, args, &out, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "dtrain: already complete at step 3 (train.steps = 3) (its val loss ");
    DT_CHECK_CONTAINS(out, "): nothing to train; raise train.steps to train on");
    DT_CHECK_CONTAINS(out, "checkpoint.resume=never");
    DT_CHECK_MSG(!strstr(out, "done after") && !strstr(out, "0.0 samples/s"),
                 "a summary of a run that trained nothing: %s", out);
    free(out);
}

/* ---- a global batch that survives a change of world size ---------------------------------- */

/* A small configs/mlp.ini (cosine schedule with warmup) under `dtrain --standalone` with nproc
 * workers, into outdir(name); more: extra overrides. */
static void gb_run(const char *name, int nproc, int64_t steps, const char *more)
{
    const char *cmd = fmt(
        "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
        "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR '%s' --standalone "
        "--max-restarts=0 --nproc-per-node=%d '%s/configs/mlp.ini' job.device=cpu "
        "job.log_every=1 train.eval_every=0 checkpoint.every=0 model.hidden=64,64 "
        "data.synthetic_samples=4096 train.schedule=cosine train.warmup_steps=3 "
        "train.steps=%lld job.output_dir='%s' %s",
        dt_test_tmpdir(), dt_test_dtrain_bin(), nproc, repo_dir(), (long long)steps,
        outdir(name), more);
    char *out = NULL;
    int rc = dt_test_run(cmd, &out, 240);
    DT_CHECK_MSG(rc == 0, "%s: exit %d: %.3000s", name, rc, out ? out : "");
    free(out);
}

typedef struct gb_steps {
    double loss[64], lr[64]; /* by step (1-based); the last record of a step wins */
    int64_t last;
} gb_steps;

static void gb_read(const char *name, gb_steps *g)
{
    memset(g, 0, sizeof *g);
    char *text = NULL;
    size_t len;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(fmt("%s/metrics.jsonl", outdir(name)), &text, &len, &err), &err);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        DT_REQUIRE(o);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        int64_t step = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step"));
        if (type && !strcmp(type, "train") && step >= 1 && step < 64) {
            g->loss[step] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss"));
            g->lr[step] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "lr"));
            if (step > g->last)
                g->last = step;
        }
        cJSON_Delete(o);
    }
    free(text);
}

/* What a comparison found, for the log of the run (the margins the tolerances leave). */
static void gb_note(const char *f, ...) __attribute__((format(printf, 1, 2)));
static void gb_note(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    fputs("    | ", stderr);
    vfprintf(stderr, f, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* Steps from..to of a and b: the same losses within tol relative, the same learning rates. */
static void gb_check_losses(const char *an, const char *bn, int64_t from, int64_t to, double tol)
{
    gb_steps a, b;
    gb_read(an, &a);
    gb_read(bn, &b);
    DT_CHECK_INT(a.last, to);
    DT_CHECK_INT(b.last, to);
    double worst = 0;
    for (int64_t k = from; k <= to && k < 64; k++) {
        DT_CHECK_MSG(isfinite(a.loss[k]) && a.loss[k] > 0, "%s step %lld: loss %g", an,
                     (long long)k, a.loss[k]);
        DT_CHECK_MSG(rel(a.loss[k], b.loss[k]) <= tol, "step %lld: %s loss %.9g, %s %.9g",
                     (long long)k, an, a.loss[k], bn, b.loss[k]);
        DT_CHECK_MSG(rel(a.lr[k], b.lr[k]) <= 1e-12, "step %lld: %s lr %.9g, %s %.9g",
                     (long long)k, an, a.lr[k], bn, b.lr[k]);
        worst = fmax(worst, rel(a.loss[k], b.loss[k]));
    }
    gb_note("%s vs %s, steps %lld-%lld: losses within %.2g relative", an, bn,
                (long long)from, (long long)to, worst);
}

/* The weights of step `step`'s checkpoints of a and b: every tensor within tol (relative to
 * its norm, and per element relative to the larger of the element and 1e-3). */
static void gb_check_weights(const char *an, const char *bn, int64_t step, double tol)
{
    dt_st_file *fa = NULL, *fb = NULL;
    dt_err err = {0};
    const char *pa = fmt("%s/checkpoints/step_%lld/model.safetensors", outdir(an), (long long)step);
    const char *pb = fmt("%s/checkpoints/step_%lld/model.safetensors", outdir(bn), (long long)step);
    DT_REQUIRE_OK(dt_st_open(pa, true, &fa, &err), &err);
    DT_REQUIRE_OK(dt_st_open(pb, true, &fb, &err), &err);
    DT_CHECK_INT(fa->num_tensors, fb->num_tensors);
    double worst = 0, worst_el = 0;
    for (int i = 0; i < fa->num_tensors; i++) {
        const dt_st_tensor *ta = &fa->tensors[i], *tb = dt_st_find(fb, ta->name);
        DT_REQUIRE(tb && ta->dtype == DT_ST_F32 && tb->end - tb->begin == ta->end - ta->begin);
        size_t n = (ta->end - ta->begin) / 4;
        const float *x = ta->data, *y = tb->data;
        double d2 = 0, n2 = 0, el = 0;
        for (size_t k = 0; k < n; k++) {
            d2 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            n2 += (double)y[k] * y[k];
            el = fmax(el, fabs((double)x[k] - y[k]) / fmax(fabs((double)y[k]), 1e-3));
        }
        double r = n2 > 0 ? sqrt(d2 / n2) : sqrt(d2);
        DT_CHECK_MSG(r <= tol && el <= 10 * tol, "%s: %s vs %s at step %lld: %.3g relative "
                     "(norm), %.3g (element)", ta->name, an, bn, (long long)step, r, el);
        worst = fmax(worst, r);
        worst_el = fmax(worst_el, el);
    }
    gb_note("%s vs %s, step %lld weights: within %.2g relative (norm per tensor), %.2g per "
            "element", an, bn, (long long)step, worst, worst_el);
    dt_st_free(fa);
    dt_st_free(fb);
}

/* state.json's key of step `step`'s checkpoint of name. */
static double gb_state(const char *name, int64_t step, const char *key)
{
    char *text = NULL;
    size_t len;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(fmt("%s/checkpoints/step_%lld/state.json", outdir(name),
                                   (long long)step), &text, &len, &err), &err);
    cJSON *st = cJSON_Parse(text);
    DT_REQUIRE(st);
    double v = cJSON_GetNumberValue(cJSON_GetObjectItem(st, key));
    cJSON_Delete(st);
    free(text);
    return v;
}

/* train.global_batch = 24 with batch_size 8: one process runs 3 micro-steps, 2 DDP ranks 12 + 12
 * samples (6 + 6 each), 3 ranks of batch 5 run 12 + 12 (4 + 4 each), 5 ranks of batch 4 run
 * 12 + 12; batch 1 with G = 7 on 3 ranks runs 3 + 3 + 1 (ranks on different micro-step
 * counts); 23 samples give the ranks
 * unequal shares (12 + 11 over 2 ranks, 8 + 8 + 7 over 3). Whatever the world, every step has
 * the same losses, learning rates, weights and sample position as one process. And a G that
 * divides evenly is grad_accum under another name: the same weights, bit for bit. */
static void test_global_batch_any_world(void)
{
    const int64_t S = 12;
    gb_run("gb24-1", 1, S, "train.batch_size=8 train.global_batch=24");
    gb_run("gb24-2", 2, S, "train.batch_size=8 train.global_batch=24");
    gb_run("gb24-3", 3, S, "train.batch_size=5 train.global_batch=24");
    /* 5 ranks of 4: micro-steps of 12 and 12 (3, 3, 2, 2, 2 per rank) */
    gb_run("gb24-5", 5, S, "train.batch_size=4 train.global_batch=24");
    /* batch 1: 7 over 3 ranks in micro-steps of 3, 3 and 1: ranks 1 and 2 run two of them */
    gb_run("gb7-1", 1, S, "train.batch_size=1 train.global_batch=7");
    gb_run("gb7-3", 3, S, "train.batch_size=1 train.global_batch=7");
    gb_run("gb23-1", 1, S, "train.batch_size=8 train.global_batch=23");
    gb_run("gb23-2", 2, S, "train.batch_size=8 train.global_batch=23");
    gb_run("gb23-3", 3, S, "train.batch_size=5 train.global_batch=23");
    gb_run("accum3", 1, S, "train.batch_size=8 train.grad_accum=3");
    gb_check_losses("gb24-2", "gb24-1", 1, S, 1e-5);
    gb_check_losses("gb24-3", "gb24-1", 1, S, 1e-5);
    gb_check_losses("gb24-5", "gb24-1", 1, S, 1e-5);
    gb_check_losses("gb7-3", "gb7-1", 1, S, 1e-5);
    gb_check_losses("gb23-2", "gb23-1", 1, S, 1e-5);
    gb_check_losses("gb23-3", "gb23-1", 1, S, 1e-5);
    gb_check_weights("gb24-2", "gb24-1", S, 1e-5);
    gb_check_weights("gb24-3", "gb24-1", S, 1e-5);
    gb_check_weights("gb24-5", "gb24-1", S, 1e-5);
    gb_check_weights("gb7-3", "gb7-1", S, 1e-5);
    gb_check_weights("gb23-2", "gb23-1", S, 1e-5);
    gb_check_weights("gb23-3", "gb23-1", S, 1e-5);
    /* 24 and 23 samples are different steps (the test can tell) */
    gb_steps a, b;
    gb_read("gb24-1", &a);
    gb_read("gb23-1", &b);
    DT_CHECK_MSG(rel(a.loss[S], b.loss[S]) > 1e-4, "G=24 and G=23 agree: %.9g %.9g", a.loss[S],
                 b.loss[S]);
    const char *runs[] = {"gb24-1", "gb24-2", "gb24-3", "gb23-1", "gb23-2", "gb23-3"};
    for (int k = 0; k < 6; k++) {
        double g = k < 3 ? 24 : 23;
        DT_CHECK_MSG(gb_state(runs[k], S, "sample_pos") == g * S, "%s: sample_pos %g", runs[k],
                     gb_state(runs[k], S, "sample_pos"));
        DT_CHECK_MSG(gb_state(runs[k], S, "samples_seen") == g * S, "%s: samples_seen %g",
                     runs[k], gb_state(runs[k], S, "samples_seen"));
    }
    /* grad_accum = 3 x batch 8 on one process: the same micro-batches with the same weights */
    gb_check_losses("gb24-1", "accum3", 1, S, 1e-12);
    char *out = NULL;
    int rc = dt_test_run(fmt("cmp '%s/checkpoints/step_%lld/model.safetensors' "
                             "'%s/checkpoints/step_%lld/model.safetensors'",
                             outdir("gb24-1"), (long long)S, outdir("accum3"), (long long)S),
                         &out, 30);
    DT_CHECK_MSG(rc == 0, "global_batch 24 and grad_accum 3 differ: %s", out);
    free(out);
}

/* The acceptance at the trainer: 3 ranks train 6 steps of G = 24 and checkpoint; from
 * that checkpoint 3 ranks and 2 ranks (and 1) continue with the same G: steps 7-12 have the
 * same losses (1e-5 relative), learning rates, weights and sample positions. */
static void test_global_batch_resume_other_world(void)
{
    const char *g = "train.batch_size=8 train.global_batch=24";
    gb_run("gbr-first", 3, 6, g);
    const char *copies[] = {"gbr-3", "gbr-2", "gbr-1"};
    for (int k = 0; k < 3; k++) {
        char *out = NULL;
        int rc = dt_test_run(fmt("rm -rf '%s' && cp -r '%s' '%s'", outdir(copies[k]),
                                 outdir("gbr-first"), outdir(copies[k])), &out, 30);
        DT_REQUIRE(rc == 0);
        free(out);
    }
    gb_run("gbr-3", 3, 12, g);
    gb_run("gbr-2", 2, 12, g);
    gb_run("gbr-1", 1, 12, g);
    gb_check_losses("gbr-2", "gbr-3", 7, 12, 1e-5);
    gb_check_losses("gbr-1", "gbr-3", 7, 12, 1e-5);
    gb_check_weights("gbr-2", "gbr-3", 12, 1e-5);
    gb_check_weights("gbr-1", "gbr-3", 12, 1e-5);
    for (int k = 0; k < 3; k++)
        DT_CHECK_MSG(gb_state(copies[k], 12, "sample_pos") == 24 * 12, "%s: sample_pos %g",
                     copies[k], gb_state(copies[k], 12, "sample_pos"));
    /* the steps before the change are the first run's */
    gb_steps a;
    gb_read("gbr-first", &a);
    DT_CHECK_INT(a.last, 6);
}

/* G smaller than the world, or model.sync_bn with ranks on different micro-step counts: a
 * configuration error (exit 2) that names the fix. */
static void test_global_batch_config_errors(void)
{
    const char *cmd = fmt(
        "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
        "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR '%s' --standalone "
        "--max-restarts=0 --nproc-per-node=3 '%s/configs/mlp.ini' job.device=cpu "
        "train.steps=2 train.global_batch=2 job.output_dir='%s'",
        dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), outdir("gb-small"));
    char *out = NULL;
    int rc = dt_test_run(cmd, &out, 120);
    DT_CHECK_MSG(rc == 2, "G=2 over 3 ranks: exit %d (not 2, a configuration error): %s", rc, out);
    DT_CHECK_CONTAINS(out, "train.global_batch = 2 is smaller than the 3 data-parallel ranks");
    DT_CHECK_CONTAINS(out, "raise train.global_batch to at least 3");
    free(out);
    /* SyncBatchNorm with ranks on different micro-step counts (3 over 2 of 1: 2 + 1) */
    cmd = fmt("cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
              "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR '%s' --standalone "
              "--max-restarts=0 --nproc-per-node=2 '%s/configs/mlp.ini' job.device=cpu "
              "model.type=resnet model.depth=8 data.synthetic_shape=3x8x8 model.sync_bn=true "
              "train.steps=2 train.batch_size=1 train.global_batch=3 job.output_dir='%s'",
              dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), outdir("gb-syncbn"));
    rc = dt_test_run(cmd, &out, 120);
    DT_CHECK_MSG(rc == 2, "sync_bn with 2 or 1 micro-steps: exit %d: %s", rc, out);
    DT_CHECK_CONTAINS(out, "gives the ranks 1 or 2 micro-steps, and model.sync_bn's collectives");
    DT_CHECK_CONTAINS(out, "make train.global_batch a multiple of the world size (2), raise "
                           "train.batch_size above 1");
    free(out);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"configs_train", test_configs_train, 600},
        {"llama_synthetic", test_llama_synthetic, 300},
        {"same_seed_bit_identical", test_same_seed_bit_identical, 300},
        {"eval_counts_each_sample_once", test_eval_counts_each_sample_once, 120},
        {"diverged_hint", test_diverged_hint, 0},
        {"bad_data_file", test_bad_data_file, 60},
        {"bad_job", test_bad_job, 60},
        {"multi_rank_without_store", test_multi_rank_without_store, 60},
        {"sigterm_stops_at_step_boundary", test_sigterm_stops_at_step_boundary, 120},
        {"sigterm_twice_still_saves", test_sigterm_twice_still_saves, 120},
        {"agent_gone", test_agent_gone, 60},
        {"epochs_and_accumulation", test_epochs_and_accumulation, 120},
        {"cpu_bind", test_cpu_bind, 240},
        {"cpu_bind_gpu", test_cpu_bind_gpu, 0},
        {"fp16_loss_scaling", test_fp16_loss_scaling, 60},
        {"fp16_scale_resumes", test_fp16_scale_resumes, 240},
        {"dp_checkpoint_job_reads_back", test_dp_checkpoint_job_reads_back, 120},
        {"complete_run_says_what_to_do", test_complete_run_says_what_to_do, 240},
        {"global_batch_any_world", test_global_batch_any_world, 600},
        {"global_batch_resume_other_world", test_global_batch_resume_other_world, 600},
        {"global_batch_config_errors", test_global_batch_config_errors, 120},
    };
    return dt_test_main("test_worker", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
