/* test_bench.c - every `dtrain bench` runs end to end on tiny settings and prints its table.
 * The figures themselves are not checked (this machine is shared and noisy; benchmarks are for
 * people); what is checked is that each benchmark still works and reports what it promises. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/harness.h"

static char *out;

static int bench(int timeout_s, const char *args)
{
    char cmd[4096];
    /* make test runs from the repository root, where configs/ lives. */
    snprintf(cmd, sizeof cmd, "'%s' bench %s", dt_test_dtrain_bin(), args);
    free(out);
    out = NULL;
    int rc = dt_test_run(cmd, &out, timeout_s);
    if (rc != 0)
        fprintf(stdout, "    output of `dtrain bench %s`:\n%s\n", args, out ? out : "");
    return rc;
}

static void test_store(void)
{
    DT_CHECK_INT(bench(60, "store --clients 4 --ops 200 --round-clients 16 --hold 32"), 0);
    DT_CHECK_CONTAINS(out, "ops/s");
    DT_CHECK_CONTAINS(out, "p99");
    DT_CHECK_CONTAINS(out, "16 clients");
    DT_CHECK_CONTAINS(out, "32/32");
}

static void test_rdzv(void)
{
    DT_CHECK_INT(bench(90, "rdzv --nodes 8 --hb-interval 0.1 --hb-timeout 1 --poll 0.05"), 0);
    DT_CHECK_CONTAINS(out, "round_s");
    DT_CHECK_CONTAINS(out, "recovery_s");
}

static void test_kernels(void)
{
    DT_CHECK_INT(bench(120, "kernels --quick"), 0);
    DT_CHECK_CONTAINS(out, "plain cblas_sgemm");
    DT_CHECK_CONTAINS(out, "matmul_fwd");
    DT_CHECK_CONTAINS(out, "attention_bwd");
    DT_CHECK_CONTAINS(out, "conv2d_fwd");
}

static void test_train(void)
{
    DT_CHECK_INT(bench(120, "train configs/quickstart.ini --steps 2 --warmup 1"), 0);
    DT_CHECK_CONTAINS(out, "GEMM share of step time");
    DT_CHECK_CONTAINS(out, "matmul_bwd");
}

static void test_allreduce(void)
{
    DT_CHECK_INT(bench(120, "allreduce --nproc 2 --max 64K"), 0);
    DT_CHECK_CONTAINS(out, "busbw");
    DT_CHECK_CONTAINS(out, "memcpy bandwidth");
    DT_CHECK_CONTAINS(out, "4K");
}

static void test_dp_vs_ddp(void)
{
    DT_CHECK_INT(bench(180, "dp-vs-ddp configs/mlp.ini --steps 3 --warmup 1 --repeat 1"), 0);
    DT_CHECK_CONTAINS(out, "single");
    DT_CHECK_CONTAINS(out, "DP ");
    DT_CHECK_CONTAINS(out, "DDP");
    DT_CHECK_CONTAINS(out, "memory spread");
    DT_CHECK_CONTAINS(out, "gpu util");
    DT_CHECK_CONTAINS(out, "indep ");
    DT_CHECK_CONTAINS(out, "of this machine's ceiling");
}

/* --model bert-large: the seed's model in the job's place (scaled down on the cpu), and the row
 * in the seed's columns beside the seed's figures; an unknown model is a usage error. */
static void test_dp_vs_ddp_bert_large(void)
{
    DT_CHECK_INT(bench(240, "dp-vs-ddp configs/bert-mlm.ini --model bert-large --steps 2 "
                            "--warmup 1 --repeat 1 job.device=cpu"), 0);
    DT_CHECK_CONTAINS(out, "model bert,");
    DT_CHECK_CONTAINS(out, "the seed's experiment, bert-large (2 x 256 x 4, T 64, batch 4 (cpu: "
                           "scaled down))");
    DT_CHECK_CONTAINS(out, "DP sentences/s DDP sentences/s   DDP/DP    util DP   util DDP");
    DT_CHECK_CONTAINS(out, "\nbert-large ");
    DT_CHECK_CONTAINS(out, "(24 x 1024 x 16 on 8 V100s)");
    DT_CHECK_INT(bench(30, "dp-vs-ddp configs/bert-mlm.ini --model bert-huge"), 2);
    DT_CHECK_CONTAINS(out, "--model bert-huge is not one of the seed's models");
}

/* --model resnet50 in the place of another job's model and data (mlp's vectors): ResNet-50 on
 * images scaled down on the cpu (a smaller batch here), the row's DDP / DP its two throughputs'
 * ratio (one round), the seed's figures beside it. */
static void test_dp_vs_ddp_resnet50(void)
{
    DT_CHECK_INT(bench(240, "dp-vs-ddp configs/mlp.ini --model resnet50 --steps 2 --warmup 1 "
                            "--repeat 1 job.device=cpu train.batch_size=4"), 0);
    DT_CHECK_CONTAINS(out, "model resnet,");
    DT_CHECK_CONTAINS(out, "the seed's experiment, resnet50 (width 16, 3x32x32 images, batch 4 "
                           "(cpu: scaled down))");
    DT_CHECK_CONTAINS(out, "DP images/s");
    const char *row = out ? strstr(out, "\nresnet50 ") : NULL;
    DT_REQUIRE(row != NULL);
    double dp = 0, ddp = 0, ratio = 0;
    DT_CHECK_INT(sscanf(row, " resnet50 %lf %lf %lfx", &dp, &ddp, &ratio), 3);
    DT_CHECK_MSG(dp > 0 && ddp > 0 && fabs(ratio - ddp / dp) <= 0.006 + 0.01 * ratio,
                 "row: DP %.1f, DDP %.1f, ratio %.2f", dp, ddp, ratio);
    DT_CHECK_CONTAINS(out, "(ResNet-50 at 224x224 on 8 V100s)");
    DT_CHECK_CONTAINS(out, "1250           1820");
}

static void test_ckpt(void)
{
    DT_CHECK_INT(bench(120, "ckpt --params 100000 --saves 1 --step-ms 20"), 0);
    DT_CHECK_CONTAINS(out, "checkpoint size");
    DT_CHECK_CONTAINS(out, "disk sequential write");
    DT_CHECK_CONTAINS(out, "training held per save");
}

/* The model states of stage 0 are measured exactly: params 4Ψ, grads 4Ψ, AdamW state 8Ψ on
 * every rank; every other configuration is either measured or said to be not supported. */
static void test_memory(void)
{
    DT_CHECK_INT(bench(180, "memory configs/quickstart.ini --nproc 2 --steps 2 job.device=cpu "
                            "train.batch_size=2"), 0);
    DT_REQUIRE(out != NULL);
    const char *psi_at = strstr(out, "# \u03a8 = ");
    unsigned long long psi = 0;
    DT_REQUIRE(psi_at && sscanf(psi_at, "# \u03a8 = %llu parameters", &psi) == 1);
    DT_CHECK_INT(psi, 834304); /* gpt-tiny, vocabulary 256, block 64: the model's own count */
    for (int r = 0; r < 2; r++) {
        char key[64];
        snprintf(key, sizeof key, "# zero=0 recompute=none rank %d: ", r);
        const char *at = strstr(out, key);
        double p = 0, g = 0, o = 0, pp = 0, pg = 0, po = 0;
        DT_REQUIRE(at);
        DT_REQUIRE(sscanf(at + strlen(key), "%lf %lf %lf; predicted %lf %lf %lf", &p, &g, &o,
                          &pp, &pg, &po) == 6);
        /* gradients: one copy (DDP's communicator memory, charged as gradients) plus the
         * partial last page of the model's own buffer, which mem_release cannot give back */
        const double page = (double)sysconf(_SC_PAGESIZE);
        DT_CHECK(p == 4.0 * (double)psi && o == 8.0 * (double)psi);
        DT_CHECK_MSG(g >= 4.0 * (double)psi && g < 4.0 * (double)psi + page,
                     "rank %d: gradients %.0f bytes, 4 psi = %.0f", r, g, 4.0 * (double)psi);
        DT_CHECK(pp == p && pg == 4.0 * (double)psi && po == o);
    }
    /* stage 3, measured over the steps: parameters within 10% of 1/N plus two blocks, the
     * optimiser state 1/N (its padding: under 1%) */
    for (int r = 0; r < 2; r++) {
        char key[64];
        snprintf(key, sizeof key, "# zero=3 recompute=none rank %d: ", r);
        const char *at = strstr(out, key);
        double p = 0, g = 0, o = 0, pp = 0, pg = 0, po = 0;
        DT_REQUIRE(at);
        DT_REQUIRE(sscanf(at + strlen(key), "%lf %lf %lf; predicted %lf %lf %lf", &p, &g, &o,
                          &pp, &pg, &po) == 6);
        printf("    zero=3 rank %d: params %.0f (predicted %.0f), grads %.0f (%.0f), optim %.0f "
               "(%.0f)\n", r, p, pp, g, pg, o, po);
        DT_CHECK_MSG(p >= pp * 0.9 && p <= pp * 1.1, "zero=3: params %.0f, predicted %.0f", p, pp);
        DT_CHECK_MSG(o >= po && o <= po * 1.01, "zero=3: optim %.0f, predicted %.0f", o, po);
        DT_CHECK_MSG(g >= pg && g < 4.0 * (double)psi, "zero=3: grads %.0f, predicted %.0f", g, pg);
    }
    DT_CHECK_CONTAINS(out, "configuration");
    DT_CHECK_CONTAINS(out, "p.optim");
    static const char *const recs[] = {"none", "block"};
    for (int k = 0; k < 4; k++)
        for (int x = 0; x < 2; x++) {
            char row[64], bytes[64];
            snprintf(row, sizeof row, "zero=%d recompute=%s", k, recs[x]);
            snprintf(bytes, sizeof bytes, "# zero=%d recompute=%s rank 1: ", k, recs[x]);
            const char *at = strstr(out, row), *after = at ? at + strlen(row) : NULL;
            while (after && *after == ' ')
                after++;
            DT_CHECK_MSG(at && (strstr(out, bytes) ||
                                !strncmp(after, "not supported: ", 15)),
                         "%s: neither measured nor said to be unsupported", row);
        }
    /* the first step and a save beside the steady state: DDP's whole-tensor save within one
     * I/O buffer; with checkpoint.sharded every stage's first step and save are */
    DT_CHECK_CONTAINS(out, "1st step      save |");
    DT_CHECK_CONTAINS(out, "#   zero=0 recompute=none: above the steady state, most of any rank: "
                           "first step +0.000 MiB, save +4.000 MiB (<= +64 MiB: yes)");
    free(out);
    out = NULL;
    DT_CHECK_INT(bench(180, "memory configs/quickstart.ini --nproc 2 --steps 2 job.device=cpu "
                            "train.batch_size=2 checkpoint.sharded=true checkpoint.io_buffer_mb=1"),
                 0);
    DT_REQUIRE(out != NULL);
    for (int k = 0; k < 4; k++)
        for (int x = 0; x < 2; x++) {
            char line[96];
            snprintf(line, sizeof line, "#   zero=%d recompute=%s: above the steady state", k,
                     recs[x]);
            const char *at = strstr(out, line), *nl = at ? strchr(at, '\n') : NULL;
            const char *yes = at ? strstr(at, "(<= +1 MiB: yes)") : NULL;
            DT_CHECK_MSG(at && yes && (!nl || yes < nl), "%s: not within the I/O buffer: %.200s",
                         line, at ? at : "(no line)");
        }
}

/* Tensor parallelism: one process, DDP x 4, T = 2 and T = 4 all run; each tensor rank holds
 * exactly its slices (the allocator's parameter bytes = 4 x (split / T + replicated)), under
 * 0.6 (T = 2) and 0.35 (T = 4) of the whole model. The all-reduce bytes are counted by the
 * communicators (comm.h's dt_comm_stats) and deterministic, so they equal the schedule's
 * prediction exactly: at T = 2 and 4, 4 x ((4L + 2) x B x T x C + 3 x B x T) + 8 (the norm) + 16
 * (the loss: D = 1) bytes in 4L + 2 + 2 + 2 all-reduces, within 5% of Megatron's 4 x L x B x T x C
 * floats at L = 12 (above it by 2 / 4L + 3 / 4LC: the embedding's, ln_f's and the loss's); DDP's
 * its gradients plus the loss's two doubles. The job asks for sequence parallelism, so T = 1 and
 * DDP must run without it and T = 2 and 4 run twice: the "SP" rows count exactly gpt.c's SP
 * schedule, (4L + 2) reduce-scatters and (6L + 3) all-gathers of B x T x C floats (comm.h's
 * sizes: the whole buffer) and all-reduces of the cross-entropy's 3 x B x T and the LayerNorms'
 * (4L + 2) x C gradients (L + 1 calls) + 8 + 16; same parameters, and less activation memory than without. */
static void test_tensor(void)
{
    enum { L = 12, B = 4, T = 32, C = 32 };
    DT_CHECK_INT(bench(180, "tensor configs/quickstart.ini --nproc 4 --steps 2 job.device=cpu "
                            "model.n_layer=12 model.n_head=4 model.n_embd=32 model.block_size=32 "
                            "data.seq_len=32 train.batch_size=4 train.grad_accum=1 "
                            "parallel.sequence_parallel=true"), 0);
    DT_REQUIRE(out != NULL);
    double whole = 0;
    long long whole_n = 0;
    const char *at = strstr(out, "# T=1 (1 process) rank 0: params ");
    DT_REQUIRE(at && sscanf(at, "# T=1 (1 process) rank 0: params %lf", &whole) == 1);
    at = strstr(at, "holds ");
    DT_REQUIRE(at && sscanf(at, "holds %lld", &whole_n) == 1);
    const double model_bytes = 4.0 * ((4 * L + 2) * (double)B * T * C + 3.0 * B * T);
    const double want_ar = model_bytes + 8 + 16, want_meg = 4.0 * 4 * L * B * T * C;
    const double btc4 = 4.0 * B * T * C;
    const double want_sp_ar = 4.0 * (3.0 * B * T + (4 * L + 2) * C) + 8 + 16;
    const int Ts[2] = {2, 4};
    const double most[2] = {0.6, 0.35};
    DT_CHECK_CONTAINS(out, "T=1 and DDP x 4 run without it");
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < Ts[i]; r++) {
            char key[64];
            snprintf(key, sizeof key, "# T=%d rank %d: ", Ts[i], r);
            at = strstr(out, key);
            double p = 0, pp = 0, ar = 0, calls = 0, sched = 0, meg = 0, rs = 0, rsc = 0;
            double rss = 0, ag = 0, agc = 0, ags = 0, act = 0;
            DT_REQUIRE(at);
            DT_REQUIRE(sscanf(at + strlen(key), "params %lf predicted %lf; all-reduce bytes %lf "
                              "calls %lf schedule %lf reference %lf; reduce-scatter bytes %lf "
                              "calls %lf schedule %lf; all-gather bytes %lf calls %lf schedule "
                              "%lf; activations %lf", &p, &pp, &ar, &calls, &sched, &meg, &rs,
                              &rsc, &rss, &ag, &agc, &ags, &act) == 13);
            DT_CHECK_MSG(rs == 0 && ag == 0 && rss == 0 && ags == 0,
                         "T=%d rank %d: reduce-scattered %.0f, all-gathered %.0f without "
                         "sequence parallelism", Ts[i], r, rs, ag);
            /* the same rank with sequence parallelism */
            snprintf(key, sizeof key, "# T=%d SP rank %d: ", Ts[i], r);
            const char *sp = strstr(out, key);
            double sp_p = 0, sp_pp = 0, sp_ar = 0, sp_calls = 0, sp_sched = 0, sp_meg = 0;
            double sp_act = 0;
            DT_REQUIRE(sp);
            DT_REQUIRE(sscanf(sp + strlen(key), "params %lf predicted %lf; all-reduce bytes %lf "
                              "calls %lf schedule %lf reference %lf; reduce-scatter bytes %lf "
                              "calls %lf schedule %lf; all-gather bytes %lf calls %lf schedule "
                              "%lf; activations %lf", &sp_p, &sp_pp, &sp_ar, &sp_calls, &sp_sched,
                              &sp_meg, &rs, &rsc, &rss, &ag, &agc, &ags, &sp_act) == 13);
            DT_CHECK_MSG(sp_p == p && sp_pp == pp, "T=%d SP rank %d: params %.0f, without %.0f",
                         Ts[i], r, sp_p, p);
            DT_CHECK_MSG(sp_ar == sp_sched && sp_ar == want_sp_ar && sp_calls == L + 1 + 2 + 2,
                         "T=%d SP rank %d: all-reduced %.0f bytes in %.0f calls, the schedule "
                         "%.0f, want %.0f", Ts[i], r, sp_ar, sp_calls, sp_sched, want_sp_ar);
            DT_CHECK_MSG(rs == rss && rs == (4 * L + 2) * btc4 && rsc == 4 * L + 2,
                         "T=%d SP rank %d: reduce-scattered %.0f bytes in %.0f calls, the "
                         "schedule %.0f, want %.0f", Ts[i], r, rs, rsc, rss, (4 * L + 2) * btc4);
            DT_CHECK_MSG(ag == ags && ag == (6 * L + 3) * btc4 && agc == 6 * L + 3,
                         "T=%d SP rank %d: all-gathered %.0f bytes in %.0f calls, the schedule "
                         "%.0f, want %.0f", Ts[i], r, ag, agc, ags, (6 * L + 3) * btc4);
            DT_CHECK_MSG(sp_act > 0 && sp_act < act, "T=%d rank %d: activations %.0f with "
                         "sequence parallelism, %.0f without", Ts[i], r, sp_act, act);
            DT_CHECK_MSG(p == pp, "T=%d rank %d: params %.0f, predicted %.0f", Ts[i], r, p, pp);
            DT_CHECK_MSG(p < most[i] * whole, "T=%d: params %.0f of %.0f", Ts[i], p, whole);
            DT_CHECK_MSG(ar == sched && ar == want_ar,
                         "T=%d rank %d: all-reduced %.0f bytes a step, the schedule %.0f, want "
                         "%.0f", Ts[i], r, ar, sched, want_ar);
            DT_CHECK_MSG(calls == 4 * L + 2 + 2 + 2, "T=%d rank %d: %.0f all-reduces a step",
                         Ts[i], r, calls);
            DT_CHECK_MSG(meg == want_meg && ar > meg && ar / meg < 1.05,
                         "T=%d rank %d: all-reduced %.0f bytes, Megatron %.0f (want %.0f): %.4f",
                         Ts[i], r, ar, meg, want_meg, meg > 0 ? ar / meg : 0);
        }
    for (int r = 0; r < 4; r++) {
        char key[64];
        snprintf(key, sizeof key, "# DDP x 4 rank %d: ", r);
        at = strstr(out, key);
        double p = 0, pp = 0, ar = 0, calls = 0, sched = 0, ref = 0;
        DT_REQUIRE(at);
        DT_REQUIRE(sscanf(at + strlen(key), "params %lf predicted %lf; all-reduce bytes %lf "
                          "calls %lf schedule %lf reference %lf", &p, &pp, &ar, &calls, &sched,
                          &ref) == 6);
        DT_CHECK_MSG(ref == 4.0 * (double)whole_n && ar == sched && ar == ref + 16,
                     "DDP rank %d: all-reduced %.0f bytes, schedule %.0f, gradients %.0f (%lld "
                     "parameters)", r, ar, sched, ref, whole_n);
    }
    DT_CHECK_CONTAINS(out, "T=2 vs T=1 (one process): ");
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"bench_store", test_store, 90},
        {"bench_rdzv", test_rdzv, 120},
        {"bench_kernels", test_kernels, 150},
        {"bench_train", test_train, 150},
        {"bench_allreduce", test_allreduce, 150},
        {"bench_dp_vs_ddp", test_dp_vs_ddp, 200},
        {"bench_dp_vs_ddp_bert_large", test_dp_vs_ddp_bert_large, 300},
        {"bench_dp_vs_ddp_resnet50", test_dp_vs_ddp_resnet50, 300},
        {"bench_ckpt", test_ckpt, 150},
        {"bench_memory", test_memory, 200},
        {"bench_tensor", test_tensor, 200},
    };
    return dt_test_main("test_bench", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
