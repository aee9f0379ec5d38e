/* test_plan.c - `dtrain plan` (cmd/plan.h): sizes, the layouts of every zoo model, the budget,
 * and the predicted peak memory against what the real trainer measures (peak_mem_bytes of its
 * metrics.jsonl, run through the launcher) within 10% on layouts of every axis. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/plan.h"
#include "common/util.h"
#include "tests/harness.h"

#define MIB (1024.0 * 1024.0)

static void test_bytes(void)
{
    double b = 0;
    DT_CHECK(dt_plan_parse_bytes("512Mi", &b) == 0 && b == 512 * MIB);
    DT_CHECK(dt_plan_parse_bytes("1GiB", &b) == 0 && b == 1024 * MIB);
    DT_CHECK(dt_plan_parse_bytes("1.5G", &b) == 0 && b == 1.5e9);
    DT_CHECK(dt_plan_parse_bytes("2K", &b) == 0 && b == 2000);
    DT_CHECK(dt_plan_parse_bytes("300", &b) == 0 && b == 300);
    DT_CHECK(dt_plan_parse_bytes("1Q", &b) != 0);
    DT_CHECK(dt_plan_parse_bytes("-1G", &b) != 0);
    DT_CHECK(dt_plan_parse_bytes("G", &b) != 0);
    DT_CHECK(dt_plan_parse_bytes("", &b) != 0);
}

static void load(dt_job *job, const char *cfg, char **ov, int n)
{
    static dt_config_errors errs;
    dt_err err = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/../../configs/%s", dt_test_self_dir(), cfg);
    DT_REQUIRE_OK(dt_job_load(job, path, ov, n, &errs, &err), &err);
}

static int find(const dt_plan *p, int T, int P, int z, dt_recompute_kind rc, int b, int M)
{
    for (int i = 0; i < p->n; i++) {
        const dt_plan_layout *l = &p->v[i];
        if (l->tensor == T && l->pipeline == P && l->zero == z && l->recompute == rc &&
            l->batch_size == b && l->micro_batches == M && !l->sequence_parallel &&
            l->schedule == DT_PP_1F1B)
            return i;
    }
    return -1;
}

/* Every model of the zoo plans on 2 ranks: layouts are ranked, fastest first, and the world
 * and global batch hold in each. */
static void test_zoo(void)
{
    static const char *const cfgs[] = {"quickstart.ini", "mlp.ini", "resnet.ini", "llama.ini",
                                       "bert-mlm.ini"};
    for (size_t c = 0; c < DT_ARRAY_LEN(cfgs); c++) {
        static dt_job job;
        load(&job, cfgs[c], NULL, 0);
        dt_plan_req req = {.nnodes = 1, .nproc = 2};
        dt_plan plan;
        dt_err err = {0};
        DT_REQUIRE_OK(dt_plan_make(&plan, &job, &req, NULL, &err), &err);
        DT_CHECK_MSG(plan.n > 0 && plan.n_fit == plan.n && plan.chosen == 0, "%s: %d layouts",
                     cfgs[c], plan.n);
        for (int i = 0; i < plan.n; i++) {
            const dt_plan_layout *l = &plan.v[i];
            DT_CHECK(l->data * l->tensor * l->pipeline == 2);
            DT_CHECK((int64_t)l->batch_size * l->grad_accum * l->data == plan.global_batch);
            DT_CHECK(l->peak_bytes > 0 && l->step_s > 0);
            if (i > 0)
                DT_CHECK(plan.v[i - 1].step_s <= l->step_s);
        }
        bool tp = false, pp = false;
        for (int i = 0; i < plan.n; i++) {
            tp |= plan.v[i].tensor > 1;
            pp |= plan.v[i].pipeline > 1;
        }
        bool is_tf = job.model_type == DT_MODEL_GPT || job.model_type == DT_MODEL_LLAMA ||
                     job.model_type == DT_MODEL_BERT;
        DT_CHECK_MSG(tp == is_tf, "%s: tensor layouts %d", cfgs[c], tp);
        DT_CHECK_MSG(pp, "%s: pipeline layouts %d", cfgs[c], pp); /* every model has stages */
        dt_plan_free(&plan);
    }
}

/* A budget: the layouts over it do not fit, say why, and come after every one that does. */
static void test_budget(void)
{
    static dt_job job;
    load(&job, "quickstart.ini", NULL, 0);
    dt_plan_req req = {.nnodes = 1, .nproc = 2, .device_memory = 20 * MIB};
    dt_plan plan;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_plan_make(&plan, &job, &req, NULL, &err), &err);
    DT_CHECK(plan.n_fit > 0 && plan.n_fit < plan.n && plan.chosen == 0);
    for (int i = 0; i < plan.n; i++) {
        const dt_plan_layout *l = &plan.v[i];
        DT_CHECK(l->fits == (i < plan.n_fit));
        DT_CHECK(l->fits == (l->peak_bytes <= req.device_memory));
        if (!l->fits)
            DT_CHECK_CONTAINS(l->why, "> budget 0.02 GiB");
    }
    /* zero 0 with the whole batch at once holds more than 20 MiB */
    int z0 = find(&plan, 1, 1, 0, DT_RECOMP_NONE, 8, 1);
    DT_REQUIRE(z0 >= 0);
    DT_CHECK(!plan.v[z0].fits);
    dt_plan_free(&plan);
}

/* Predicted against measured peak memory, through the launcher, on layouts of every axis. */
static void test_accuracy(void)
{
    static dt_job job;
    load(&job, "quickstart.ini", NULL, 0);
    dt_plan_req req = {.nnodes = 1, .nproc = 2};
    dt_plan plan;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_plan_make(&plan, &job, &req, NULL, &err), &err);
    const struct {
        int T, P, z;
        dt_recompute_kind rc;
        int b, M;
    } picks[] = {
        {1, 1, 0, DT_RECOMP_NONE, 8, 1},  {1, 1, 1, DT_RECOMP_NONE, 8, 1},
        {1, 1, 3, DT_RECOMP_BLOCK, 8, 1}, {2, 1, 0, DT_RECOMP_NONE, 16, 1},
        {1, 2, 0, DT_RECOMP_NONE, 16, 2}, {1, 2, 0, DT_RECOMP_BLOCK, 16, 4},
    };
    char path[1024];
    snprintf(path, sizeof path, "%s/../../configs/quickstart.ini", dt_test_self_dir());
    double worst = 1, pred[8], meas[8];
    int nm = 0, idx[8];
    for (size_t i = 0; i <= DT_ARRAY_LEN(picks); i++) { /* the last: the plan's choice */
        const bool chosen = i == DT_ARRAY_LEN(picks);
        int k = chosen ? plan.chosen
                       : find(&plan, picks[i].T, picks[i].P, picks[i].z, picks[i].rc,
                              picks[i].b, picks[i].M);
        DT_CHECK_MSG(k >= 0, "layout %zu not planned", i);
        if (k < 0)
            continue;
        char dir[1100];
        snprintf(dir, sizeof dir, "%s/check%zu", dt_test_tmpdir(), i);
        dt_plan_measure ms;
        DT_REQUIRE_OK(dt_plan_measure_layout(dt_test_dtrain_bin(), path, NULL, 0, &plan.v[k], 2,
                                             4, dir, &ms, &err),
                      &err);
        const dt_plan_layout *l = &plan.v[k];
        double r = ms.peak_bytes / l->peak_bytes;
        printf("  %sT%d P%d z%d %s b%dx%d M%d: predicted %.2f MiB %.1f ms, measured %.2f MiB "
               "(%.3f) %.1f ms (%.2f)\n", chosen ? "chosen: " : "", l->tensor, l->pipeline,
               l->zero, dt_recompute_name(l->recompute), l->batch_size, l->grad_accum,
               l->micro_batches, l->peak_bytes / MIB, l->step_s * 1e3, ms.peak_bytes / MIB, r,
               ms.step_s * 1e3, ms.step_s / l->step_s);
        pred[nm] = l->step_s;
        idx[nm] = k;
        meas[nm++] = ms.step_s;
        DT_CHECK_MSG(r > 1 / 1.10 && r < 1.10, "layout %zu: measured / predicted %.3f", i, r);
        worst = fmax(worst, fmax(r, 1 / r));
    }
    double fastest = HUGE_VAL;
    int fi = -1;
    for (int i = 0; i < nm - 1; i++)
        if (meas[i] < fastest)
            fastest = meas[i], fi = i;
    /* Another process of this shared machine that runs during one layout's 3 steps makes it
     * look slow (63 ms against 26 once): a choice that looks slow is measured again beside the
     * fastest, twice at most, and each keeps its best time. */
    for (int again = 0; again < 2 && fi >= 0 && meas[nm - 1] > 1.5 * fastest; again++) {
        const int which[2] = {nm - 1, fi};
        for (int w = 0; w < 2; w++) {
            char dir[1100];
            snprintf(dir, sizeof dir, "%s/again%d_%d", dt_test_tmpdir(), again, w);
            dt_plan_measure ms;
            DT_REQUIRE_OK(dt_plan_measure_layout(dt_test_dtrain_bin(), path, NULL, 0,
                                                 &plan.v[idx[which[w]]], 2, 4, dir, &ms, &err),
                          &err);
            meas[which[w]] = fmin(meas[which[w]], ms.step_s);
        }
        fastest = meas[fi];
        printf("  measured again: the choice %.1f ms, the fastest other %.1f ms\n",
               meas[nm - 1] * 1e3, fastest * 1e3);
    }
    printf("  worst ratio %.3f; step time rank correlation %.3f over %d; the choice's measured "
           "step / the fastest other's %.2f\n",
           worst, dt_plan_spearman(pred, meas, nm), nm, meas[nm - 1] / fastest);
    /* the choice is among the fastest measured, within the shared machine's noise (the
     * check runs 3 steps of each: one slow phase moves a median by tens of per cent) */
    DT_CHECK_MSG(meas[nm - 1] <= 1.5 * fastest, "the choice measured %.1f ms, the fastest "
                 "%.1f ms", meas[nm - 1] * 1e3, fastest * 1e3);
    dt_plan_free(&plan);
}

/* The command line: a flag without its value, a bad size, a missing --nproc-per-node. */
static void test_cli(void)
{
    char cmd[2048], out[4096];
    const char *cases[][2] = {
        {"--nproc-per-node 2 --device-memory 12X", "--device-memory \"12X\" is not a size"},
        {"", "--nproc-per-node is required"},
        {"--nproc-per-node 0", "--nproc-per-node needs a whole number >= 1"},
        {"--nproc-per-node 2 --bogus", "unknown option --bogus"},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        snprintf(cmd, sizeof cmd, "%s plan %s/../../configs/quickstart.ini %s 2>&1; echo rc=$?",
                 dt_test_dtrain_bin(), dt_test_self_dir(), cases[i][0]);
        FILE *p = popen(cmd, "r");
        DT_REQUIRE(p);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        pclose(p);
        DT_CHECK_CONTAINS(out, cases[i][1]);
        DT_CHECK_CONTAINS(out, "rc=2");
    }
    snprintf(cmd, sizeof cmd, "%s plan %s/../../configs/quickstart.ini --nproc-per-node=2 --json "
             "2>/dev/null | head -c 1000", dt_test_dtrain_bin(), dt_test_self_dir());
    FILE *p = popen(cmd, "r");
    DT_REQUIRE(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    DT_CHECK_CONTAINS(out, "\"chosen\":0,\"layouts\":[");
    DT_CHECK_CONTAINS(out, "\"predicted_peak_bytes\":");
}

/* parallel.layout = auto: the launcher plans, logs the choice and trains with it; a world that
 * is not numbers is refused before anything starts, and so is a job.device_memory no layout
 * fits. */
static void test_auto(void)
{
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "%s --nproc-per-node 2 %s/../../configs/quickstart.ini "
             "parallel.layout=auto train.steps=2 train.eval_every=0 checkpoint.every=0 "
             "job.output_dir=%s/auto 2>&1; echo rc=$?", dt_test_dtrain_bin(),
             dt_test_self_dir(), dt_test_tmpdir());
    FILE *p = popen(cmd, "r");
    DT_REQUIRE(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    DT_CHECK_CONTAINS(out, "parallel.layout = auto: gpt-tiny on 1 x 2 ranks, global batch 16: "
                           "chose D2 T1 P1");
    DT_CHECK_CONTAINS(out, "runner-up");
    DT_CHECK_CONTAINS(out, "rc=0");
    snprintf(cmd, sizeof cmd, "%s --nproc-per-node auto %s/../../configs/quickstart.ini "
             "parallel.layout=auto job.output_dir=%s/auto2 2>&1; echo rc=$?",
             dt_test_dtrain_bin(), dt_test_self_dir(), dt_test_tmpdir());
    p = popen(cmd, "r");
    DT_REQUIRE(p);
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    DT_CHECK_CONTAINS(out, "parallel.layout = auto plans for a fixed world");
    DT_CHECK_CONTAINS(out, "rc=2");
    /* job.device_memory is the budget auto plans under: at 30 MiB the fastest layout without
     * one (b8x1, 34.64 MiB predicted) no longer fits and the choice is one that does; at 1 MiB
     * none fits and nothing starts */
    snprintf(cmd, sizeof cmd, "%s --nproc-per-node 2 %s/../../configs/quickstart.ini "
             "parallel.layout=auto job.device_memory=30Mi train.steps=2 train.eval_every=0 "
             "checkpoint.every=0 job.output_dir=%s/auto3 2>&1; echo rc=$?",
             dt_test_dtrain_bin(), dt_test_self_dir(), dt_test_tmpdir());
    p = popen(cmd, "r");
    DT_REQUIRE(p);
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    const char *chose = strstr(out, "chose D2 T1 P1 ");
    DT_CHECK_MSG(chose != NULL, "%s", out);
    const char *peak = chose ? strstr(chose, "(predicted peak ") : NULL;
    DT_CHECK(peak != NULL);
    double mib = peak ? strtod(peak + strlen("(predicted peak "), NULL) : 1e9;
    DT_CHECK_MSG(mib <= 30.0, "chose a layout of %.2f MiB under a 30 MiB budget", mib);
    DT_CHECK_CONTAINS(out, "rc=0");
    snprintf(cmd, sizeof cmd, "%s --nproc-per-node 2 %s/../../configs/quickstart.ini "
             "parallel.layout=auto job.device_memory=1Mi job.output_dir=%s/auto4 2>&1; "
             "echo rc=$?", dt_test_dtrain_bin(), dt_test_self_dir(), dt_test_tmpdir());
    p = popen(cmd, "r");
    DT_REQUIRE(p);
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    pclose(p);
    DT_CHECK_CONTAINS(out, "parallel.layout = auto: no layout of gpt-tiny on 1 x 2 ranks fits "
                           "the budget; the nearest: ");
    DT_CHECK_CONTAINS(out, "nothing was started");
    DT_CHECK_CONTAINS(out, "rc=2");
}

/* The per-round plan of an elastic layout = auto job (dt_plan_auto_round): planned, it writes
 * the job with the chosen keys and says them with the global batch; applied on another node, the
 * same keys give the same job; keys read from the store that a plan does not set, or a layout
 * the job refuses, are refused (-EINVAL) and leave the resolved job as it was. */
static void test_auto_round(void)
{
    static dt_job job, back;
    static dt_config_errors errs;
    char *ov[] = {"parallel.layout=auto", "elastic.nnodes=1:2", "elastic.nproc_per_node=2"};
    load(&job, "quickstart.ini", ov, 3);
    DT_CHECK(dt_plan_auto_elastic(&job));
    char path[1024], choice[1024], again[1024];
    snprintf(path, sizeof path, "%s/round.ini", dt_test_tmpdir());
    dt_plan_auto pa = {.job = &job, .path = path};
    int T = 0, P = 0;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_plan_auto_round(&pa, 2, 2, NULL, choice, sizeof choice, &T, &P, &err), &err);
    DT_CHECK_CONTAINS(choice, "plan.global_batch=32 parallel.tensor=");
    DT_CHECK_INT(pa.global_batch, 32); /* batch 8 x 4 data-parallel ranks, the job's */
    DT_REQUIRE_OK(dt_job_load(&back, path, NULL, 0, &errs, &err), &err);
    DT_CHECK_INT(back.tensor, T);
    DT_CHECK_INT(back.pipeline, P);
    /* another node applies it: the same job */
    dt_plan_auto pb = {.job = &job, .path = path};
    DT_REQUIRE_OK(dt_plan_auto_round(&pb, 2, 2, choice, again, sizeof again, &T, &P, &err), &err);
    DT_CHECK_INT(pb.global_batch, 32);
    DT_CHECK(!strcmp(again, choice));
    char *before = dt_test_slurp(path);
    DT_CHECK(dt_plan_auto_round(&pb, 2, 2, "parallel.tensor=1 train.lr=5", again, sizeof again,
                                &T, &P, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "sets train.lr=5, which is no key a plan sets");
    DT_CHECK(dt_plan_auto_round(&pb, 2, 2, "parallel.tensor=3", again, sizeof again, &T, &P,
                                &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "is not valid for this job");
    char *after = dt_test_slurp(path);
    DT_CHECK(before && after && !strcmp(before, after));
    free(before);
    free(after);
    /* the next plan, for 1 x 2 ranks, keeps the global batch */
    DT_REQUIRE_OK(dt_plan_auto_round(&pb, 1, 2, NULL, again, sizeof again, &T, &P, &err), &err);
    DT_CHECK_CONTAINS(again, "plan.global_batch=32 ");
    DT_REQUIRE_OK(dt_job_load(&back, path, NULL, 0, &errs, &err), &err);
    int D = 2 / (back.tensor * back.pipeline);
    DT_CHECK_INT(back.batch_size * back.grad_accum * D, 32);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"plan_bytes", test_bytes, 10},
        {"plan_zoo", test_zoo, 200},
        {"plan_budget", test_budget, 60},
        {"plan_accuracy", test_accuracy, 300},
        {"plan_cli", test_cli, 60},
        {"plan_auto", test_auto, 120},
        {"plan_auto_round", test_auto_round, 60},
    };
    return dt_test_main("test_plan", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
