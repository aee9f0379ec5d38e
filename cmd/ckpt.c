/* ckpt.c - `dtrain ckpt list|show|verify`: look at checkpoints without a model or a GPU.
 *
 *   dtrain ckpt list DIR      every step_<N> under DIR, newest first, each verified
 *   dtrain ckpt show PATH     one checkpoint: step, loss, data position, files, tensors, job
 *   dtrain ckpt verify PATH   full check (checksums, headers); exit 0 valid, 1 invalid
 *   dtrain ckpt export PATH OUT.safetensors   the model's tensors, whole, in one file
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/train/ckpt/ckpt.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain ckpt list DIR        checkpoints under DIR, newest first, verified\n"
            "       dtrain ckpt show PATH       what one checkpoint holds\n"
            "       dtrain ckpt verify PATH     check every file of a checkpoint (or of every\n"
            "                                   checkpoint under a directory)\n"
            "       dtrain ckpt export PATH OUT.safetensors\n"
            "                                   the model's weights, whole, in one safetensors file\n"
            "Each takes --help. Exit codes: 0 ok, 1 invalid or unreadable, 2 usage.\n");
}

static bool is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static void fmt_time(char *out, size_t size, double t)
{
    time_t s = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&s, &tm) || !strftime(out, size, "%Y-%m-%d %H:%M:%S", &tm))
        dt_strlcpy(out, "-", size);
}

static uint64_t total_bytes(const dt_ckpt_info *in)
{
    uint64_t b = 0;
    for (int i = 0; i < in->num_files; i++)
        b += in->files[i].bytes;
    return b;
}

/* Whether path holds a state.json: a single checkpoint rather than a directory of them. */
static bool is_one_checkpoint(const char *path)
{
    char sj[4096 + 32];
    snprintf(sj, sizeof sj, "%s/state.json", path);
    return access(sj, F_OK) == 0;
}

/* When dir is a job's output_dir rather than a checkpoint or a directory of them (it holds no
 * state.json and no step_<N>, and dir/checkpoints holds some), *sub (cap bytes) gets
 * dir/checkpoints and *newest its newest step: true. */
static bool output_dir_checkpoints(const char *dir, char *sub, size_t cap, int64_t *newest)
{
    int64_t *steps = NULL;
    int n = 0;
    if (is_one_checkpoint(dir) || (dt_ckpt_list(dir, &steps, &n, NULL) == 0 && n > 0)) {
        free(steps);
        return false;
    }
    free(steps);
    steps = NULL;
    n = 0;
    if ((size_t)snprintf(sub, cap, "%s/checkpoints", dir) >= cap ||
        dt_ckpt_list(sub, &steps, &n, NULL) != 0 || n == 0) {
        free(steps);
        return false;
    }
    *newest = steps[0];
    free(steps);
    return true;
}

/* show and export take one checkpoint: for a job's output_dir, say which ones it holds. */
static void hint_output_dir(const char *cmd, const char *path)
{
    char sub[4096 + 16];
    int64_t newest;
    if (output_dir_checkpoints(path, sub, sizeof sub, &newest))
        fprintf(stderr, "dtrain ckpt %s: %s is a job's output_dir: its checkpoints are in %s "
                "(newest: %s/step_%" PRId64 "; `dtrain ckpt list %s` shows them all)\n", cmd,
                path, sub, sub, newest, path);
}

/* The damaged checkpoints saves moved aside under dir (step_<N>.damaged[.k]), on one line. */
static void print_set_aside(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "step_", 5) || !strstr(de->d_name, ".damaged"))
            continue;
        printf("%s%s", n++ ? ", " : "set aside as damaged (resume ignores them, nothing removes "
                                    "them; repair or remove them by hand): ", de->d_name);
    }
    if (n)
        printf("\n");
    if (d)
        closedir(d);
}

static int cmd_list(int argc, char **argv)
{
    bool verify = true;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: dtrain ckpt list [--quick] DIR\n\n"
                   "Lists the step_<N> checkpoints under DIR (a job's checkpoint.dir, or its\n"
                   "output_dir: then DIR/checkpoints when DIR holds none itself), newest\n"
                   "first: step, epoch, samples seen, STEP_LOSS (the loss of that one step;\n"
                   "log lines and metrics.jsonl show means over job.log_every steps, so they\n"
                   "differ), size, when saved, and whether it is\n"
                   "valid: every file is read and checked as a resume would (checksums, headers).\n"
                   "The first valid one is what resume = auto loads (unless another setup's\n"
                   "checkpoint comes first). --quick checks only that state.json is intact and\n"
                   "every file is there with its size (\"complete (unverified)\"). Exit 0, or 1\n"
                   "when DIR does not exist or cannot be read.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--verify")) /* the default; kept for old scripts */
            verify = true;
        else if (!strcmp(argv[i], "--quick"))
            verify = false;
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else {
            fprintf(stderr, "dtrain ckpt list: unexpected argument \"%s\"\n", argv[i]);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: dtrain ckpt list [--quick] DIR\n");
        return 2;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "dtrain ckpt list: %s: %s\n", dir,
                stat(dir, &sb) != 0 ? strerror(errno) : "not a directory");
        return 1;
    }
    int64_t *steps = NULL, *strays = NULL;
    int n = 0, ns = 0;
    dt_err err = {0};
    char sub[4096 + 16];
    if ((size_t)snprintf(sub, sizeof sub, "%.4096s/checkpoints", dir) >= sizeof sub)
        sub[0] = '\0';
    for (int pass = 0; pass < 2; pass++) {
        if (dt_ckpt_list(dir, &steps, &n, &err) || dt_ckpt_list_strays(dir, &strays, &ns, &err)) {
            fprintf(stderr, "dtrain ckpt list: %s\n", err.msg);
            free(steps);
            return 1;
        }
        /* a job's output_dir: its checkpoints are in <output_dir>/checkpoints by default */
        if (pass || n || ns || stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
            break;
        free(steps);
        free(strays);
        steps = strays = NULL;
        printf("%s holds no checkpoints itself; listing %s, where a job whose output_dir it "
               "is keeps them\n", dir, sub);
        dir = sub;
    }
    if (n == 0 && ns == 0) {
        if (is_one_checkpoint(dir))
            printf("no checkpoints under %s: it is a single checkpoint, not a directory of "
                   "them; see `dtrain ckpt show %s`\n", dir, dir);
        else
            printf("no checkpoints under %s (a job keeps them in checkpoint.dir, by default "
                   "<job.output_dir>/checkpoints: give that directory)\n", dir);
        print_set_aside(dir);
        free(steps);
        free(strays);
        return 0;
    }
    /* STEP_LOSS: the loss of that step alone; log lines and metrics.jsonl show a mean over
     * job.log_every steps, which differs */
    printf("%-10s %6s %12s %10s %10s  %-19s  %s\n", "STEP", "EPOCH", "SAMPLES", "STEP_LOSS",
           "SIZE", "SAVED", "STATUS");
    bool first_valid = true;
    for (int i = 0, k = 0; i < n || k < ns;) {
        char path[4096 + 32], when[32], loss[32];
        if (k < ns && (i == n || strays[k] > steps[i])) { /* in step order, among the others */
            printf("%-10" PRId64 " %6s %12s %10s %10s  %-19s  invalid: step_%" PRId64 " is not a "
                   "directory (a file named like a checkpoint: resume skips it, a save of this "
                   "step would fail; remove or rename it)\n", strays[k], "-", "-", "-", "-", "-",
                   strays[k]);
            k++;
            continue;
        }
        dt_ckpt_info in;
        dt_err e = {0};
        snprintf(path, sizeof path, "%s/step_%" PRId64, dir, steps[i]);
        int rc = dt_ckpt_inspect(path, verify, &in, &e);
        fmt_time(when, sizeof when, in.state.time);
        if (isfinite(in.state.loss))
            snprintf(loss, sizeof loss, "%.4f", in.state.loss);
        else
            dt_strlcpy(loss, "-", sizeof loss);
        if (rc) {
            printf("%-10" PRId64 " %6s %12s %10s %10s  %-19s  invalid: %s\n", steps[i], "-", "-",
                   "-", "-", "-", e.msg);
        } else {
            printf("%-10" PRId64 " %6" PRId64 " %12" PRId64 " %10s %8.1fMB  %-19s  %s%s%s\n",
                   in.state.step, in.state.epoch, in.state.samples_seen, loss,
                   total_bytes(&in) / 1e6, when, verify ? "valid" : "complete (unverified)",
                   in.version == DT_CKPT_VERSION_SHARDED ? ", sharded" : "",
                   first_valid && verify ? " (resume = auto loads this one)" : "");
            first_valid = false;
        }
        dt_ckpt_info_free(&in);
        i++;
    }
    print_set_aside(dir);
    free(steps);
    free(strays);
    return 0;
}

static int cmd_show(int argc, char **argv)
{
    const char *path = NULL;
    bool job = true;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: dtrain ckpt show [--no-job] PATH\n\n"
                   "Prints what the checkpoint directory PATH (a step_<N>) holds: step, epoch,\n"
                   "global sample position, the loss of that step alone, learning rate, the\n"
                   "world size that wrote it, RNG states and other scalars, its files with sizes\n"
                   "and checksums, every tensor with its shape, and the resolved job (unless\n"
                   "--no-job). It reads state.json only; `dtrain ckpt verify` checks the files.\n"
                   "Exit 0, or 1 when state.json is missing or corrupt.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--no-job"))
            job = false;
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "dtrain ckpt show: unexpected argument \"%s\"\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: dtrain ckpt show [--no-job] PATH\n");
        return 2;
    }
    dt_ckpt_info in;
    dt_err err = {0};
    int rc = dt_ckpt_inspect(path, false, &in, &err);
    if (rc && in.num_tensors == 0) {
        int64_t *steps = NULL;
        int n = 0;
        fprintf(stderr, "dtrain ckpt show: %s: %s\n", path, err.msg);
        hint_output_dir("show", path);
        if (!is_one_checkpoint(path) && dt_ckpt_list(path, &steps, &n, NULL) == 0 && n > 0)
            fprintf(stderr, "dtrain ckpt show: %s is a directory of checkpoints, not one: give "
                    "one of them (newest: %s/step_%" PRId64 "), or see `dtrain ckpt list %s`\n",
                    path, path, steps[0], path);
        free(steps);
        dt_ckpt_info_free(&in);
        return 1;
    }
    const dt_ckpt_state *st = &in.state;
    char when[32];
    fmt_time(when, sizeof when, st->time);
    printf("checkpoint   %s%s%s\n", path, rc ? "  INCOMPLETE: " : "", rc ? err.msg : "");
    printf("step         %" PRId64 "\n", st->step);
    printf("epoch        %" PRId64 "\n", st->epoch);
    printf("sample_pos   %" PRId64 "  (global sample index in the epoch)\n", st->sample_pos);
    printf("samples_seen %" PRId64 "\n", st->samples_seen);
    if (isfinite(st->loss))
        printf("loss         %.6f  (of step %" PRId64 " alone; log lines and metrics.jsonl show "
               "means over job.log_every steps)\n", st->loss, st->step);
    else
        printf("loss         -\n");
    printf("lr           %.6g\n", st->lr);
    printf("world_size   %d  (any world size may resume)\n", st->world_size);
    printf("saved        %s\n", when);
    if (st->run_id[0])
        printf("run_id       %s\n", st->run_id);
    for (int i = 0; i < st->num_rng; i++)
        printf("rng          %s: %016" PRIx64 " %016" PRIx64 " %016" PRIx64 " %016" PRIx64 "\n",
               st->rng[i].name, st->rng[i].rng.s[0], st->rng[i].rng.s[1], st->rng[i].rng.s[2],
               st->rng[i].rng.s[3]);
    for (int i = 0; i < st->num_scalars; i++)
        printf("scalar       %s = %.17g\n", st->scalars[i].name, st->scalars[i].value);
    if (in.version == DT_CKPT_VERSION_SHARDED)
        printf("format       sharded: %d shard files (one a rank), %d pieces\n", in.num_files,
               in.num_pieces);
    else
        printf("format       whole tensors\n");
    for (int i = 0; i < in.num_files; i++)
        printf("file         %-20s %12" PRIu64 " bytes  xxh64 %016" PRIx64 "\n", in.files[i].name,
               in.files[i].bytes, in.files[i].xxh64);
    uint64_t elems = 0;
    for (int i = 0; i < in.num_tensors; i++) {
        uint64_t n = 1;
        for (int d = 0; d < in.tensors[i].ndim; d++)
            n *= (uint64_t)in.tensors[i].shape[d];
        elems += n;
    }
    printf("tensors      %d (%" PRIu64 " elements)\n", in.num_tensors, elems);
    for (int i = 0; i < in.num_tensors; i++) {
        const dt_ckpt_tensor_desc *t = &in.tensors[i];
        char shape[256];
        size_t o = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim && o < sizeof shape; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRId64, d ? ", " : "",
                                  t->shape[d]);
        if (o < sizeof shape)
            snprintf(shape + o, sizeof shape - o, "]");
        printf("  %s  %s  %s  %s\n", t->file, t->name, t->dtype, shape);
    }
    if (job && st->job) {
        printf("job:\n");
        for (const char *p = st->job; *p;) {
            const char *nl = strchr(p, '\n');
            int len = nl ? (int)(nl - p) : (int)strlen(p);
            printf("  %.*s\n", len, p);
            p += len + (nl ? 1 : 0);
        }
    }
    dt_ckpt_info_free(&in);
    return 0;
}

static int verify_one(const char *path)
{
    dt_ckpt_info in;
    dt_err err = {0};
    int rc = dt_ckpt_inspect(path, true, &in, &err);
    if (rc)
        printf("%s: invalid: %s\n", path, err.msg);
    else
        printf("%s: valid (step %" PRId64 ", %d files, %d tensors, %.1f MB%s)\n", path,
               in.state.step, in.num_files, in.num_tensors, total_bytes(&in) / 1e6,
               in.version == DT_CKPT_VERSION_SHARDED ? ", sharded" : "");
    dt_ckpt_info_free(&in);
    return rc ? 1 : 0;
}

/* dtrain ckpt export PATH OUT: what tools outside dtrain load (PyTorch, transformers). */
static int cmd_export(int argc, char **argv)
{
    if (argc == 2 && is_help(argv[1])) {
        printf("usage: dtrain ckpt export PATH OUT.safetensors\n\n"
               "Writes the model's parameters and buffers of checkpoint PATH (a step_<N>\n"
               "directory, whole-tensor or sharded) as one safetensors file of whole tensors\n"
               "under the usual names (\"format\": \"pt\"), after verifying the checkpoint.\n"
               "It streams tensor by tensor: memory is one tensor and a 64 MiB read buffer.\n");
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: dtrain ckpt export PATH OUT.safetensors\n");
        return 2;
    }
    dt_err e = {0};
    uint64_t bytes = 0;
    double t0 = dt_now_s();
    if (dt_ckpt_export(argv[1], argv[2], 0, &bytes, &e) != 0) {
        fprintf(stderr, "dtrain ckpt export: %s: %s\n", argv[1], e.msg);
        hint_output_dir("export", argv[1]);
        return 1;
    }
    printf("%s: %.1f MB of weights from %s in %.2f s\n", argv[2], bytes / 1e6, argv[1],
           dt_now_s() - t0);
    return 0;
}

static int cmd_verify(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i])) {
            printf("usage: dtrain ckpt verify PATH\n\n"
                   "Checks the checkpoint directory PATH (a step_<N>) as a resume would:\n"
                   "state.json intact (its own checksum), every file present with its recorded\n"
                   "size and XXH64, every safetensors header valid and matching the tensor table.\n"
                   "When PATH is a directory of checkpoints, checks each of them (a job's\n"
                   "output_dir that holds none itself: those in PATH/checkpoints).\n"
                   "Exit 0 when valid, 1 when not (the reason is printed), 2 on a usage error.\n");
            return 0;
        }
        if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "dtrain ckpt verify: unexpected argument \"%s\"\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: dtrain ckpt verify PATH\n");
        return 2;
    }
    char sj[4096 + 32], sub[4096 + 16];
    int64_t *steps = NULL, newest;
    int n = 0;
    if (output_dir_checkpoints(path, sub, sizeof sub, &newest)) {
        printf("%s holds no checkpoints itself; verifying %s, where a job whose output_dir it "
               "is keeps them\n", path, sub);
        path = sub;
    }
    snprintf(sj, sizeof sj, "%s/state.json", path);
    if (access(sj, F_OK) != 0 && dt_ckpt_list(path, &steps, &n, NULL) == 0 && n > 0) {
        int bad = 0;
        for (int i = 0; i < n; i++) {
            char p[4096 + 32];
            snprintf(p, sizeof p, "%s/step_%" PRId64, path, steps[i]);
            bad += verify_one(p);
        }
        free(steps);
        return bad ? 1 : 0;
    }
    free(steps);
    return verify_one(path);
}

int dt_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    dt_log_init();
    if (!strcmp(argv[1], "list"))
        return cmd_list(argc - 1, argv + 1);
    if (!strcmp(argv[1], "show"))
        return cmd_show(argc - 1, argv + 1);
    if (!strcmp(argv[1], "verify"))
        return cmd_verify(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export"))
        return cmd_export(argc - 1, argv + 1);
    const char *names[] = {"list", "show", "verify"};
    const char *near = dt_nearest(argv[1], names, 3);
    fprintf(stderr, "dtrain ckpt: unknown command \"%s\"%s%s%s\n", argv[1],
            near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
    usage(stderr);
    return 2;
}
