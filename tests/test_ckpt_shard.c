/* test_ckpt_shard.c - sharded checkpoints (checkpoint.sharded, format version 2) end to end with
 * the real binary: every rank writes its own shard, and any layout resumes any other.
 *
 * The reference is the whole-tensor format written by the same layout: its model.safetensors is
 * what `dtrain ckpt export` of the sharded step must reproduce byte for byte (every piece in
 * its place), and a resume at the layout that saved must be bit for bit the run that did not
 * stop; at other layouts and world sizes within 1e-5 relative (their reductions add in other
 * orders). Damage to one shard or to the manifest makes the step invalid, named, and resume
 * falls back to the step before. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/train/ckpt/ckpt.h"
#include "runtime/train/ckpt/safetensors.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define fmt dt_test_fmt

static char *sh_out(const char *cmd, int *code)
{
    char *out = NULL;
    *code = dt_test_run(cmd, &out, (int)(240 * dt_test_timeout_scale()));
    return out ? out : strdup("");
}

/* Runs dtrain on np ranks with the tiny gpt, out under TMP/name, the extra overrides; the
 * output is kept in TMP/name.log. Returns the exit code. */
static int train(const char *name, int np, const char *extra)
{
    const char *out = fmt("%s/%s", dt_test_tmpdir(), name);
    const char *cmd = fmt(
        "%s --nproc-per-node=%d %s/configs/quickstart.ini job.device=cpu train.threads=1 "
        "job.cpu_bind=none model.n_layer=2 model.n_head=4 model.n_embd=16 model.block_size=16 "
        "data.seq_len=16 train.eval_every=0 data.val_fraction=0 train.schedule=constant "
        "train.warmup_steps=2 train.grad_clip=0.5 job.log_every=1 ddp.timeout=30 "
        "job.output_dir=%s %s > %s.log 2>&1",
        dt_test_dtrain_bin(), np, dt_test_repo_dir("configs"), out, extra, out);
    int code;
    free(sh_out(cmd, &code));
    if (code != 0) {
        char *log = dt_test_slurp(fmt("%s.log", out));
        size_t l = log ? strlen(log) : 0;
        DT_CHECK_MSG(code == 0, "%s exited %d:\n%s", name, code, log ? log + (l > 3000 ? l - 3000 : 0) : "");
        free(log);
    }
    return code;
}

/* The loss of `step` in TMP/name/metrics.jsonl (NAN when absent). */
static double loss_at(const char *name, int step)
{
    char *text = dt_test_slurp(fmt("%s/%s/metrics.jsonl", dt_test_tmpdir(), name));
    double v = NAN;
    const char *key = fmt("\"step\":%d,", step);
    for (char *q = text ? strstr(text, key) : NULL; q; q = strstr(q + 1, key)) {
        char *l = strstr(q, "\"loss\":");
        if (l && (!strchr(q, '\n') || l < strchr(q, '\n')))
            v = strtod(l + 7, NULL);
    }
    free(text);
    return v;
}

static const char *step_dir(const char *name, int step)
{
    return fmt("%s/%s/checkpoints/step_%d", dt_test_tmpdir(), name, step);
}

/* dtrain ckpt export of a step into TMP/<out>; the path. */
static const char *export(const char *name, int step, const char *out)
{
    const char *file = fmt("%s/%s", dt_test_tmpdir(), out);
    int code;
    char *o = sh_out(fmt("%s ckpt export %s %s", dt_test_dtrain_bin(), step_dir(name, step), file),
                     &code);
    DT_CHECK_MSG(code == 0, "ckpt export %s step %d: %s", name, step, o);
    free(o);
    return file;
}

static bool same_bytes(const char *a, const char *b)
{
    int code;
    free(sh_out(fmt("cmp -s '%s' '%s'", a, b), &code));
    return code == 0;
}

/* Relative L2 distance of two whole-model safetensors files over every tensor of a. */
static double rel_l2(const char *a, const char *b)
{
    dt_st_file *fa = NULL, *fb = NULL;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_st_open(a, true, &fa, &e), &e);
    DT_REQUIRE_OK(dt_st_open(b, true, &fb, &e), &e);
    double d = 0, n = 0;
    for (int i = 0; i < fa->num_tensors; i++) {
        const dt_st_tensor *x = &fa->tensors[i], *y = dt_st_find(fb, x->name);
        DT_CHECK_MSG(y && y->end - y->begin == x->end - x->begin, "%s differs in shape", x->name);
        if (!y || y->end - y->begin != x->end - x->begin)
            continue;
        const float *p = x->data, *q = y->data;
        for (uint64_t k = 0; k < (x->end - x->begin) / 4; k++) {
            d += ((double)p[k] - q[k]) * ((double)p[k] - q[k]);
            n += (double)q[k] * q[k];
        }
    }
    dt_st_free(fa);
    dt_st_free(fb);
    return sqrt(d / (n > 0 ? n : 1));
}

#define D2T2Z1 "parallel.tensor=2 parallel.zero=1 train.batch_size=4"

/* D2 x T2 with ZeRO-1 on 4 ranks saves sharded: 4 shard files and version 2, nothing whole;
 * the export is the whole-tensor format's model.safetensors byte for byte; the same layout
 * resumes bit for bit; one process, ZeRO-3 on 4 ranks and P2 x T2 resume within 1e-5; and the
 * whole-tensor checkpoint of the same run resumes sharded at ZeRO-3 as well. */
static void test_layouts_resume(void)
{
    if (train("a", 4, D2T2Z1 " train.steps=6 checkpoint.every=3 checkpoint.sharded=true") ||
        train("w", 4, D2T2Z1 " train.steps=3 checkpoint.sharded=false"))
        return;
    for (int r = 0; r < 4; r++)
        DT_CHECK_MSG(access(fmt("%s/shard-%05d-of-00004.safetensors", step_dir("a", 3), r),
                            F_OK) == 0, "step_3 lacks rank %d's shard", r);
    DT_CHECK(access(fmt("%s/model.safetensors", step_dir("a", 3)), F_OK) != 0);
    DT_CHECK(access(fmt("%s/shard-00000.json", step_dir("a", 3)), F_OK) != 0); /* indexes gone */
    char *state = dt_test_slurp(fmt("%s/state.json", step_dir("a", 3)));
    DT_CHECK_CONTAINS(state, "\"version\":\t2");
    DT_CHECK_CONTAINS(state, "\"pieces\"");
    free(state);
    const char *ex3 = export("a", 3, "a3.safetensors");
    DT_CHECK_MSG(same_bytes(ex3, fmt("%s/model.safetensors", step_dir("w", 3))),
                 "the export of the sharded step 3 differs from the whole-tensor format's "
                 "model.safetensors of the same run");
    int code;
    char *o = sh_out(fmt("%s ckpt verify %s", dt_test_dtrain_bin(), step_dir("a", 3)), &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(o, "sharded");
    free(o);
    const char *ref6 = export("a", 6, "a6.safetensors");
    double ref = loss_at("a", 6);
    /* the same layout: bit for bit */
    if (!train("same", 4, fmt(D2T2Z1 " train.steps=6 checkpoint.sharded=true "
                              "checkpoint.resume=%s", step_dir("a", 3)))) {
        DT_CHECK_MSG(loss_at("same", 6) == ref, "same layout: loss %.17g, the run that did not "
                     "stop %.17g", loss_at("same", 6), ref);
        DT_CHECK_MSG(same_bytes(export("same", 6, "same6.safetensors"), ref6),
                     "D2 x T2 ZeRO-1 resumed at the same layout: step 6 weights differ");
    }
    /* other layouts and world sizes */
    static const struct {
        const char *name, *over;
        int np;
    } to[] = {
        {"one", "train.batch_size=8 checkpoint.sharded=true", 1},
        {"ddp", "train.batch_size=4 checkpoint.sharded=true", 2},
        {"z3", "parallel.zero=3 train.batch_size=2 checkpoint.sharded=true", 4},
        {"pp", "parallel.pipeline=2 parallel.tensor=2 parallel.micro_batches=2 "
               "train.batch_size=8 checkpoint.sharded=true", 4},
    };
    for (size_t k = 0; k < DT_ARRAY_LEN(to); k++) {
        if (train(to[k].name, to[k].np, fmt("%s train.steps=6 checkpoint.resume=%s", to[k].over,
                                            step_dir("a", 3))))
            continue;
        double l = loss_at(to[k].name, 6);
        double w = rel_l2(export(to[k].name, 6, fmt("%s6.safetensors", to[k].name)), ref6);
        DT_CHECK_MSG(fabs(l - ref) <= 1e-5 * fabs(ref) && w <= 1e-5, "D2 x T2 ZeRO-1's sharded "
                     "step 3 resumed as %s: loss %.9g vs %.9g, weights %.2e off", to[k].name, l,
                     ref, w);
        printf("    sharded D2 x T2 ZeRO-1 step 3 -> %s on %d rank(s): step 6 loss %.3e "
               "relative, weights %.1e off\n", to[k].name, to[k].np, fabs(l - ref) / ref, w);
    }
    /* today's whole-tensor format, resumed by a sharded layout */
    if (!train("fromv1", 4, fmt("parallel.zero=3 train.batch_size=2 train.steps=6 "
                                "checkpoint.sharded=true checkpoint.resume=%s",
                                step_dir("w", 3)))) {
        double l = loss_at("fromv1", 6);
        DT_CHECK_MSG(fabs(l - ref) <= 1e-5 * fabs(ref), "the whole-tensor step 3 resumed at "
                     "ZeRO-3: loss %.9g vs %.9g", l, ref);
    }
}

/* Saves every step in the background with keep = 2: the two newest remain, both valid and
 * sharded; the rest were removed. */
static void test_async_retention(void)
{
    if (train("ret", 2, "parallel.zero=2 train.batch_size=4 train.steps=5 checkpoint.every=1 "
                        "checkpoint.keep=2 checkpoint.async=true checkpoint.sharded=true"))
        return;
    for (int s = 1; s <= 5; s++)
        DT_CHECK_MSG((access(step_dir("ret", s), F_OK) == 0) == (s >= 4), "step_%d %s", s,
                     s >= 4 ? "missing" : "not removed");
    int code;
    char *o = sh_out(fmt("%s ckpt list %s/ret/checkpoints", dt_test_dtrain_bin(),
                         dt_test_tmpdir()), &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_MSG(strstr(o, "valid, sharded (resume = auto loads this one)") != NULL, "%s", o);
    free(o);
}

/* Damage to one shard or to the manifest: `ckpt verify` names the file, and resume = auto
 * skips the step with a warning naming it and resumes from the step before. */
static void test_corruption(void)
{
    if (train("src", 2, "parallel.tensor=2 train.batch_size=4 train.steps=4 checkpoint.every=2 "
                        "checkpoint.sharded=true"))
        return;
    static const struct {
        const char *name, *damage, *file;
    } cases[] = {
        {"truncated", "truncate -s 1000 shard-00001-of-00002.safetensors",
         "shard-00001-of-00002.safetensors"},
        {"flipped", "printf 'XXXX' | dd of=shard-00000-of-00002.safetensors bs=1 seek=9000 "
                    "conv=notrunc 2>/dev/null", "shard-00000-of-00002.safetensors"},
        {"forged_header", "printf '[' | dd of=shard-00001-of-00002.safetensors bs=1 seek=8 "
                          "conv=notrunc 2>/dev/null", "shard-00001-of-00002.safetensors"},
        {"missing", "rm shard-00000-of-00002.safetensors", "shard-00000-of-00002.safetensors"},
        {"manifest_flipped", "printf 'Z' | dd of=state.json bs=1 seek=700 conv=notrunc "
                             "2>/dev/null", "state.json"},
        {"manifest_missing", "rm state.json", "state.json"},
    };
    for (size_t k = 0; k < DT_ARRAY_LEN(cases); k++) {
        const char *dir = fmt("%s/%s", dt_test_tmpdir(), cases[k].name);
        int code;
        free(sh_out(fmt("rm -rf %s && mkdir -p %s && cp -r %s/src/checkpoints %s/ && cd "
                        "%s/checkpoints/step_4 && %s", dir, dir, dt_test_tmpdir(), dir, dir,
                        cases[k].damage), &code));
        DT_CHECK_MSG(code == 0, "%s: the damage failed", cases[k].name);
        char *o = sh_out(fmt("%s ckpt verify %s/checkpoints/step_4", dt_test_dtrain_bin(), dir),
                         &code);
        DT_CHECK_MSG(code == 1 && strstr(o, cases[k].file), "%s: ckpt verify exit %d, not "
                     "naming %s: %s", cases[k].name, code, cases[k].file, o);
        free(o);
        /* resume = auto on one process: back to step 2, trains to 4 again */
        if (train(cases[k].name, 1, "train.batch_size=8 train.steps=4 checkpoint.sharded=true"))
            continue;
        char *log = dt_test_slurp(fmt("%s.log", dir));
        DT_CHECK_MSG(log && strstr(log, "skipping") && strstr(log, cases[k].file),
                     "%s: no warning naming %s:\n%s", cases[k].name, cases[k].file,
                     log ? log : "");
        DT_CHECK_MSG(log && strstr(log, "checkpoints/step_2: step 2"), "%s: did not resume "
                     "from step_2:\n%s", cases[k].name, log ? log : "");
        free(log);
    }
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"layouts_resume", test_layouts_resume, 600},
        {"async_retention", test_async_retention, 240},
        {"corruption", test_corruption, 600},
    };
    return dt_test_main("test_ckpt_shard", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
