/* bench_ckpt_ranks.c - `dtrain bench ckpt --ranks 1,2,4 JOB.ini ...`: the job's checkpoint saved
 * by N ranks, sharded (every rank writes its own shard, checkpoint.sharded = true) beside the
 * whole-tensor save (rank 0 alone, after every rank gathered the model), on the same model.
 *
 * For each N and each format it runs the real launcher (this binary, --nproc-per-node=N) for 5
 * steps with a save at step 3 (and one at the end), in the background (checkpoint.async), and
 * reads what the run left: rank 0's log line of the step 3 save (the time the loop was held,
 * the time the whole write took), the bytes each rank wrote (the step's files: a shard file a
 * rank; state.json is rank 0's), and metrics.jsonl's peak_mem_bytes and max_rss_bytes of rank 0
 * at step 3 (steady state: the step before the save) and step 4 (the save's step: its gather,
 * staging and copies come in between). Target: no rank writes more than 1/N of the checkpoint
 * plus one tensor's slice; the save step's peak at the steady state's plus one I/O buffer.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/util.h"
#include "runtime/train/ckpt/ckpt.h"

#define MAX_N 8

typedef struct ckpt_run {
    double held_s, write_s;
    uint64_t total, most, rank_bytes[64];
    int files;
    double peak3, peak4, rss3, rss4; /* MiB */
    uint64_t biggest_tensor;         /* bytes of the largest tensor */
} ckpt_run;

/* The value of "key": of the metrics record of `step` in text (-1 when absent). */
static double metric(const char *text, int step, const char *key)
{
    char want[48], k[64];
    snprintf(want, sizeof want, "\"step\":%d,", step);
    snprintf(k, sizeof k, "\"%s\":", key);
    for (const char *q = strstr(text, want); q; q = strstr(q + 1, want)) {
        const char *nl = strchr(q, '\n'), *v = strstr(q, k);
        if (v && (!nl || v < nl))
            return strtod(v + strlen(k), NULL);
    }
    return -1;
}

/* One run: N ranks, sharded or not, into dir/<tag>. 0, or the run's exit code. */
static int one_run(const char *self, const char *job, char **ov, int nov, int n, bool sharded,
                   const char *dir, ckpt_run *r)
{
    char out[1200], cmd[8192], p[1400];
    snprintf(out, sizeof out, "%s/n%d-%s", dir, n, sharded ? "sharded" : "whole");
    int o = snprintf(cmd, sizeof cmd, "'%s' --nproc-per-node=%d '%s'", self, n, job);
    for (int i = 0; i < nov && o < (int)sizeof cmd; i++)
        o += snprintf(cmd + o, sizeof cmd - o, " '%s'", ov[i]);
    snprintf(cmd + o, sizeof cmd - o, " train.steps=5 checkpoint.every=3 checkpoint.keep=3 "
             "checkpoint.async=true checkpoint.resume=never checkpoint.sharded=%s "
             "job.log_every=1 train.eval_every=0 job.output_dir='%s' > '%s.log' 2>&1",
             sharded ? "true" : "false", out, out);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "dtrain bench ckpt: %d rank(s), %s: the run failed (exit %d); see "
                "%s.log\n", n, sharded ? "sharded" : "whole", rc, out);
        return rc ? rc : 1;
    }
    memset(r, 0, sizeof *r);
    /* rank 0's line of the step 3 save */
    char *log = NULL, *met = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s.log", out);
    if (dt_read_file(p, &log, &len, NULL) == 0) {
        char *s = strstr(log, "/step_3 (");
        char *h = s ? strstr(s, "training held ") : NULL;
        char *w = s ? strstr(s, sharded ? "MB in " : "MB in ") : NULL;
        if (h)
            r->held_s = strtod(h + 14, NULL);
        if (w && sharded) /* "(X MB in N shards, this rank's Y MB in T s" */
            w = strstr(w + 6, "MB in ");
        if (w)
            r->write_s = strtod(w + 6, NULL);
    }
    free(log);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    if (dt_read_file(p, &met, &len, NULL) == 0) {
        r->peak3 = metric(met, 3, "peak_mem_bytes") / 1048576.0;
        r->peak4 = metric(met, 4, "peak_mem_bytes") / 1048576.0;
        r->rss3 = metric(met, 3, "max_rss_bytes") / 1048576.0;
        r->rss4 = metric(met, 4, "max_rss_bytes") / 1048576.0;
    }
    free(met);
    /* who wrote what: the step's files */
    dt_ckpt_info in;
    dt_err e = {0};
    snprintf(p, sizeof p, "%s/checkpoints/step_3", out);
    if (dt_ckpt_inspect(p, false, &in, &e) != 0) {
        fprintf(stderr, "dtrain bench ckpt: %s: %s\n", p, e.msg);
        dt_ckpt_info_free(&in);
        return 1;
    }
    struct stat sb;
    char sj[1500];
    snprintf(sj, sizeof sj, "%s/state.json", p);
    r->rank_bytes[0] = stat(sj, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    r->total = r->rank_bytes[0];
    for (int i = 0; i < in.num_files; i++) {
        int rank = 0;
        if (sharded && sscanf(in.files[i].name, "shard-%d-of", &rank) == 1 && rank >= 0 &&
            rank < 64)
            r->rank_bytes[rank] += in.files[i].bytes;
        else
            r->rank_bytes[0] += in.files[i].bytes;
        r->total += in.files[i].bytes;
    }
    for (int k = 0; k < 64; k++)
        r->most = DT_MAX(r->most, r->rank_bytes[k]);
    for (int t = 0; t < in.num_tensors; t++) {
        uint64_t b = 4;
        for (int d = 0; d < in.tensors[t].ndim; d++)
            b *= (uint64_t)in.tensors[t].shape[d];
        r->biggest_tensor = DT_MAX(r->biggest_tensor, b);
    }
    r->files = in.num_files;
    dt_ckpt_info_free(&in);
    return 0;
}

int dt_bench_ckpt_ranks(const char *ranks, const char *job, char **ov, int nov,
                        const char *dir_opt)
{
    int ns[MAX_N], n = 0;
    for (const char *q = ranks; *q && n < MAX_N;) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < 1 || v > 64) {
            fprintf(stderr, "dtrain bench ckpt: --ranks wants a list such as 1,2,4\n");
            return 2;
        }
        ns[n++] = (int)v;
        q = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            break;
    }
    if (!job) {
        fprintf(stderr, "dtrain bench ckpt --ranks needs a job file (e.g. configs/quickstart.ini "
                "model.preset=gpt-mini parallel.zero=3)\n");
        return 2;
    }
    char self[4096], dir[1024];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        perror("dtrain bench ckpt: /proc/self/exe");
        return 1;
    }
    self[sl] = '\0';
    if (dir_opt) {
        dt_strlcpy(dir, dir_opt, sizeof dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/dtrain-bench-ckpt-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("dtrain bench ckpt: mkdtemp");
            return 1;
        }
    }
    printf("checkpoint of %s at step 3, written in the background; rank 0's figures (held: the "
           "loop waited; write: the save's whole write; peaks: steady = step 3, save = step 4)\n",
           job);
    printf("%5s %-8s %10s %10s %10s %12s %12s %10s %13s %13s\n", "ranks", "format", "ckpt_MB",
           "held_s", "write_s", "most_rank_MB", "target_MB", "rank0_MB", "peak_MiB", "rss_MiB");
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        for (int f = 0; f < 2 && !rc; f++) {
            ckpt_run r;
            bool sharded = f == 1;
            if ((rc = one_run(self, job, ov, nov, ns[i], sharded, dir, &r)))
                break;
            /* 1/N of the tensors plus one tensor's slice, plus state.json on rank 0 */
            double target = ((double)r.total / ns[i] + r.biggest_tensor) / 1e6;
            printf("%5d %-8s %10.2f %10.3f %10.3f %12.2f %12.2f %10.2f %6.1f->%-6.1f "
                   "%6.1f->%-6.1f%s\n", ns[i], sharded ? "sharded" : "whole", r.total / 1e6,
                   r.held_s, r.write_s, r.most / 1e6, target, r.rank_bytes[0] / 1e6, r.peak3,
                   r.peak4, r.rss3, r.rss4,
                   sharded && r.most / 1e6 > target ? "  (a rank wrote more than the target)"
                                                    : "");
        }
    if (!dir_opt) {
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "dtrain bench ckpt: could not remove %s\n", dir);
    }
    return rc ? 1 : 0;
}
