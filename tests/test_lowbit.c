/* test_lowbit.c - ddp.compress = int8 and 1bit through the real dtrain binary (2 workers):
 * comm_bytes against fp32's on the same job (int8 <= 0.27x, 1bit <= 0.05x after its warm-up,
 * exactly fp32's during it), the loss against compression off, an int8 resume continuing bit
 * for bit (int8 keeps no state across steps), the tensor- and pipeline-parallel layouts' data
 * groups, and the refusals at load. The reducer's side (the quantisation bound of every step's
 * gradient, bit-identical ranks, against one process) is test_ddp's int8 test; the quantisers
 * are test_quant's. */
#include <cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* DT_REQUIRE with a message. */
#define REQUIRE_MSG(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dt_test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                      \
            dt_test_stop();                                                                        \
        }                                                                                          \
    } while (0)

#define STEPS 40
#define WARMUP 10

/* What metrics.jsonl says per step (log_every = 1): loss and comm_bytes, from step 1. */
typedef struct run_metrics {
    double loss[STEPS + 1], bytes[STEPS + 1];
    int steps;
} run_metrics;

static void read_metrics(const char *dir, run_metrics *r)
{
    memset(r, 0, sizeof *r);
    char path[PATH_MAX + 32], *text = NULL;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    REQUIRE_MSG(dt_read_file(path, &text, NULL, NULL) == 0, "no %s", path);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *t = cJSON_GetObjectItem(o, "type"), *s = cJSON_GetObjectItem(o, "step");
        if (o && cJSON_IsString(t) && !strcmp(t->valuestring, "train") && cJSON_IsNumber(s) &&
            s->valueint >= 1 && s->valueint <= STEPS) {
            const cJSON *l = cJSON_GetObjectItem(o, "loss"), *b = cJSON_GetObjectItem(o, "comm_bytes");
            r->loss[s->valueint] = cJSON_IsNumber(l) ? l->valuedouble : NAN;
            r->bytes[s->valueint] = cJSON_IsNumber(b) ? b->valuedouble : NAN;
            r->steps = DT_MAX(r->steps, s->valueint);
        }
        cJSON_Delete(o);
    }
    free(text);
}

/* Runs dtrain on configs/<cfg> into <tmp>/<name>, 2 workers unless extra says
 * --nproc-per-node; extra holds launcher flags (-...) and key=value overrides, in any order.
 * Returns the exit status; the output in *out (caller frees; may be NULL). */
static int run_job(const char *name, const char *cfg, const char *extra, char **out)
{
    char flags[512] = "", keys[2048] = "";
    for (const char *p = extra; *p;) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        char *dst = p[0] == '-' ? flags : keys;
        size_t cap = p[0] == '-' ? sizeof flags : sizeof keys, at = strlen(dst);
        snprintf(dst + at, cap - at, " %.*s", (int)n, p);
        p += n;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
             "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR %s --standalone "
             "--max-restarts=0 %s%s configs/%s job.device=cpu job.log_every=1 "
             "train.eval_every=0 job.output_dir=%s/%s%s",
             dt_test_repo_dir("configs"), dt_test_dtrain_bin(),
             strstr(flags, "--nproc") ? "" : "--nproc-per-node=2", flags, cfg, dt_test_tmpdir(),
             name, keys);
    char *o = NULL;
    int rc = dt_test_run(cmd, &o, 240);
    if (out)
        *out = o;
    else
        free(o);
    return rc;
}

static void run_ok(const char *name, const char *cfg, const char *extra, run_metrics *m)
{
    char *out = NULL;
    int rc = run_job(name, cfg, extra, &out);
    REQUIRE_MSG(rc == 0, "%s (%s): exit %d: %.3000s", name, extra, rc, out ? out : "");
    free(out);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", dt_test_tmpdir(), name);
    read_metrics(dir, m);
    REQUIRE_MSG(m->steps == STEPS, "%s: %d steps in metrics.jsonl", name, m->steps);
}

/* The same mlp job with compression off, int8 and 1bit (warm-up 10): bytes per step and the
 * loss. int8: (256 + 4) / 1024 of fp32's payload plus the chunks' rounding (0.254 measured);
 * the loss within 1% of fp32's over 40 steps (issue 31's target for int8). 1bit: fp32's bytes,
 * exactly, during the warm-up, then (8 + 4) / 256 (0.047); its loss falls (its quality
 * against fp32 at 300 steps is measured in docs/parallelism.md, not asserted here). */
static void test_bytes_and_loss(void)
{
    const char *job = "checkpoint.every=0 train.steps=40 ddp.compress_warmup_steps=10";
    char extra[512];
    run_metrics off, i8, b1;
    snprintf(extra, sizeof extra, "%s ddp.compress=none", job);
    run_ok("off", "mlp.ini", extra, &off);
    snprintf(extra, sizeof extra, "%s ddp.compress=int8", job);
    run_ok("int8", "mlp.ini", extra, &i8);
    snprintf(extra, sizeof extra, "%s ddp.compress=1bit", job);
    run_ok("1bit", "mlp.ini", extra, &b1);
    for (int s = 1; s <= STEPS; s++) {
        DT_CHECK_MSG(off.bytes[s] > 0 && off.bytes[s] == off.bytes[1], "fp32 step %d: %g bytes",
                     s, off.bytes[s]);
        DT_CHECK_MSG(i8.bytes[s] <= 0.27 * off.bytes[s] && i8.bytes[s] > 0.2 * off.bytes[s],
                     "int8 step %d: %g bytes, fp32 %g (ratio %.4f, want <= 0.27)", s, i8.bytes[s],
                     off.bytes[s], i8.bytes[s] / off.bytes[s]);
        if (s <= WARMUP)
            DT_CHECK_MSG(b1.bytes[s] == off.bytes[s], "1bit warm-up step %d: %g bytes, fp32 %g",
                         s, b1.bytes[s], off.bytes[s]);
        else
            DT_CHECK_MSG(b1.bytes[s] <= 0.05 * off.bytes[s] && b1.bytes[s] > 0,
                         "1bit step %d: %g bytes, fp32 %g (ratio %.4f, want <= 0.05)", s,
                         b1.bytes[s], off.bytes[s], b1.bytes[s] / off.bytes[s]);
    }
    DT_CHECK_MSG(fabs(i8.loss[STEPS] - off.loss[STEPS]) <= 0.01 * off.loss[STEPS],
                 "int8 loss %.5f vs fp32 %.5f at step %d", i8.loss[STEPS], off.loss[STEPS], STEPS);
    /* the warm-up is fp32 exactly: the same losses bit for bit */
    for (int s = 1; s <= WARMUP; s++)
        DT_CHECK_MSG(b1.loss[s] == off.loss[s], "1bit warm-up step %d: loss %.9g, fp32 %.9g", s,
                     b1.loss[s], off.loss[s]);
    DT_CHECK_MSG(b1.loss[STEPS] < 0.9 * b1.loss[WARMUP] && isfinite(b1.loss[STEPS]),
                 "1bit: loss %.4f at step %d, %.4f after the warm-up", b1.loss[STEPS], STEPS,
                 b1.loss[WARMUP]);
}

static int files_equal(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = dt_read_file(a, &x, &nx, NULL) == 0 && dt_read_file(b, &y, &ny, NULL) == 0 &&
               nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

/* int8 keeps nothing from one step to the next (no residual: each step's quantisation error is
 * its own), so a job resumed from its step-10 checkpoint ends with the bits of one that ran
 * through: the step-20 checkpoints (parameters and AdamW moments) are the same files. */
static void resume_case(const char *how);

static void test_int8_resume(void)
{
    resume_case("ddp.compress=int8");
    /* stochastic rounding's draws are a function of the step, not a stream a resume restarts */
    resume_case("ddp.compress=int8 ddp.compress_stochastic=true");
}

static void resume_case(const char *how)
{
    const char *tmp = dt_test_tmpdir();
    char *out = NULL, a[PATH_MAX], b[PATH_MAX], cmd[3 * PATH_MAX];
    char extra[512];
    snprintf(extra, sizeof extra, "train.steps=20 checkpoint.every=10 %s", how);
    snprintf(cmd, sizeof cmd, "rm -rf %s/through %s/resumed", tmp, tmp);
    DT_REQUIRE(system(cmd) == 0);
    int rc = run_job("through", "mlp.ini", extra, &out);
    REQUIRE_MSG(rc == 0, "through: exit %d: %.3000s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/resumed/checkpoints && cp -r %s/through/checkpoints/step_10 "
             "%s/resumed/checkpoints/", tmp, tmp, tmp);
    DT_REQUIRE(system(cmd) == 0);
    rc = run_job("resumed", "mlp.ini", extra, &out);
    REQUIRE_MSG(rc == 0, "resumed: exit %d: %.3000s", rc, out ? out : "");
    DT_CHECK_CONTAINS(out, "resumed from");
    free(out);
    static const char *const files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/through/checkpoints/step_20/%s", tmp, files[i]);
        snprintf(b, sizeof b, "%s/resumed/checkpoints/step_20/%s", tmp, files[i]);
        DT_CHECK_MSG(files_equal(a, b), "%s: %s differs between the resumed job and one that "
                     "ran through", how, files[i]);
    }
}

/* The data-parallel groups of the tensor and pipeline layouts hold the same DDP sync: 4 ranks
 * as D 2 x T 2 and D 2 x P 2, int8 against off: the dp group's bytes at most 0.27x, the loss
 * close (20 steps of gpt-tiny). */
static void test_tensor_pipeline(void)
{
    static const char *const layouts[] = {"parallel.tensor=2", "parallel.tensor=1 parallel.pipeline=2"};
    for (int k = 0; k < 2; k++) {
        char extra[512];
        run_metrics off, i8;
        char *out = NULL;
        snprintf(extra, sizeof extra, "--nproc-per-node=4 train.steps=40 checkpoint.every=0 %s "
                 "ddp.compress=none", layouts[k]);
        DT_REQUIRE(run_job("lay-off", "tp2.ini", extra, &out) == 0);
        free(out);
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/lay-off", dt_test_tmpdir());
        read_metrics(dir, &off);
        snprintf(extra, sizeof extra, "--nproc-per-node=4 train.steps=40 checkpoint.every=0 %s "
                 "ddp.compress=int8", layouts[k]);
        DT_REQUIRE(run_job("lay-int8", "tp2.ini", extra, &out) == 0);
        free(out);
        snprintf(dir, sizeof dir, "%s/lay-int8", dt_test_tmpdir());
        read_metrics(dir, &i8);
        DT_REQUIRE(off.steps == STEPS && i8.steps == STEPS);
        DT_CHECK_MSG(i8.bytes[STEPS] <= 0.27 * off.bytes[STEPS] && i8.bytes[STEPS] > 0,
                     "%s: int8 %g bytes, fp32 %g", layouts[k], i8.bytes[STEPS], off.bytes[STEPS]);
        DT_CHECK_MSG(fabs(i8.loss[STEPS] - off.loss[STEPS]) <= 0.01 * off.loss[STEPS],
                     "%s: int8 loss %.5f, fp32 %.5f", layouts[k], i8.loss[STEPS], off.loss[STEPS]);
        char rm[PATH_MAX + 64];
        snprintf(rm, sizeof rm, "rm -rf %s/lay-off %s/lay-int8", dt_test_tmpdir(), dt_test_tmpdir());
        DT_CHECK(system(rm) == 0);
    }
}

/* Refused at load, naming both keys and what to do instead. */
static void test_refusals(void)
{
    char *out = NULL;
    int rc = run_job("zero", "mlp.ini", "train.steps=2 parallel.zero=1 ddp.compress=int8", &out);
    DT_CHECK(rc == 2);
    DT_CHECK_CONTAINS(out, "ddp.compress = int8 runs in DDP's all-reduce");
    DT_CHECK_CONTAINS(out, "parallel.zero = 0");
    free(out);
    rc = run_job("cuda", "mlp.ini", "train.steps=2 job.device=cuda ddp.compress=1bit", &out);
    DT_CHECK(rc == 2);
    DT_CHECK_CONTAINS(out, "ddp.compress = 1bit quantises on the CPU");
    free(out);
    rc = run_job("fp16", "mlp.ini", "train.steps=2 train.precision=fp16 ddp.compress=1bit", &out);
    DT_CHECK(rc == 2);
    DT_CHECK_CONTAINS(out, "use train.precision = bf16 or fp32 with 1bit");
    free(out);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"bytes_and_loss", test_bytes_and_loss, 240},
        {"int8_resume", test_int8_resume, 240},
        {"tensor_pipeline", test_tensor_pipeline, 300},
        {"refusals", test_refusals, 60},
    };
    return dt_test_main("test_lowbit", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
