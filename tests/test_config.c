/* test_config.c - the job file: defaults, every error class, precedence, --print-config round
 * trip, and every shipped config. */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "tests/harness.h"

static const char *write_file(const char *name, const char *text)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dt_test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static dt_job job;
static dt_config_errors errs;

/* load() for text with NUL bytes in it: n bytes. */
static int load_bytes(const char *text, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/job.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    DT_REQUIRE(fwrite(text, 1, n, f) == n);
    fclose(f);
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    return dt_job_load(&job, path, NULL, 0, &errs, &err);
}

static int load(const char *text, char *const *ov, int n)
{
    const char *p = write_file("job.ini", text);
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    return dt_job_load(&job, p, ov, n, &errs, &err);
}

static bool has_error(const char *needle)
{
    for (int i = 0; i < errs.count && i < 64; i++)
        if (strstr(errs.lines[i], needle))
            return true;
    return false;
}

static void dump_errors(void)
{
    for (int i = 0; i < errs.count && i < 64; i++)
        fprintf(stderr, "    | %s\n", errs.lines[i]);
}

static void test_defaults_and_minimal(void)
{
    int rc = load("[model]\ntype = mlp\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK(job.model_type == DT_MODEL_MLP);
    DT_CHECK_INT(job.batch_size, 8);
    DT_CHECK(job.optimizer == DT_OPTIM_ADAMW);
    DT_CHECK_NEAR(job.bucket_cap_mb, 25, 0);
    DT_CHECK_NEAR(job.first_bucket_mb, 1, 0);
    DT_CHECK_STR(job.output_dir, "runs/dtrain");
    DT_CHECK(job.launch.rdzv_backend == DT_RDZV_STATIC);
    DT_CHECK_INT(job.launch.master_port, 29500);
    DT_CHECK(job.resume == DT_RESUME_AUTO && !job.resume_path[0]);
}

static void test_every_field_has_valid_default(void)
{
    /* Defaults must parse through the same validator as user values. */
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *f = &dt_cfg_fields[i];
        if (f->required)
            continue;
        dt_job_defaults(&job);
        char buf[2048];
        snprintf(buf, sizeof buf, "%s.%s=%s", f->section, f->key, f->def);
        dt_err err = {0};
        DT_CHECK_MSG(dt_job_set(&job, buf, &err) == 0, "default of %s.%s rejected: %s",
                     f->section, f->key, err.msg);
        DT_CHECK_MSG(f->help && f->help[0], "%s.%s has no help", f->section, f->key);
    }
}

/* job.device_memory: sizes with decimal and binary suffixes, printed back exactly; a bad value
 * is refused with its file:line and the forms that work. */
static void test_device_memory(void)
{
    static const struct { const char *v; int64_t bytes; const char *printed; } ok[] = {
        {"0", 0, "0"},          {"1073741824", 1073741824, "1Gi"}, {"1GiB", 1073741824, "1Gi"},
        {"1Gi", 1073741824, "1Gi"}, {"512Mi", 512 << 20, "512Mi"}, {"2G", 2000000000, "1953125Ki"},
        {"1.5K", 1500, "1500"}, {"3KiB", 3072, "3Ki"},          {"10MB", 10000000, "10000000"},
        {"100B", 100, "100"},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(ok); i++) {
        dt_job_defaults(&job);
        char set[128], buf[64];
        snprintf(set, sizeof set, "job.device_memory=%s", ok[i].v);
        dt_err err = {0};
        DT_CHECK_MSG(dt_job_set(&job, set, &err) == 0, "%s: %s", set, err.msg);
        DT_CHECK_MSG(job.device_memory == ok[i].bytes, "%s: %lld", set,
                     (long long)job.device_memory);
        dt_cfg_format(&job, dt_cfg_find("job", "device_memory"), buf, sizeof buf);
        DT_CHECK_STR(buf, ok[i].printed);
    }
    static const char *const bad[] = {"lots", "1GiBB", "-1G", "1.5", "1 G", "G", "1iB", "9e30"};
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++) {
        char text[256];
        snprintf(text, sizeof text, "[model]\ntype = mlp\n[job]\ndevice_memory = \"%s\"\n", bad[i]);
        DT_CHECK_MSG(load(text, NULL, 0) == -EINVAL, "%s accepted", bad[i]);
        DT_CHECK_MSG(has_error("job.ini:4: job.device_memory: "), "%s", bad[i]);
    }
    DT_CHECK(load("[model]\ntype = mlp\n[job]\ndevice_memory = 1,5G\n", NULL, 0) == -EINVAL);
    DT_CHECK(has_error("job.ini:4: job.device_memory: \"1,5G\" is not a size in bytes (examples:"));
}

static void test_unknown_section_and_key(void)
{
    int rc = load("[model]\ntype = gpt\npreset = gpt-tiny\nn_layr = 3\n[trian]\nlr = 1\n"
                  "[train]\nbeta = 0.9\nwarmup = 3\n[data]\nlr = 0.1\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: unknown key \"n_layr\" in [model]; did you mean \"n_layer\"?"));
    DT_CHECK(has_error("job.ini:5: unknown section [trian]; did you mean [train]?"));
    DT_CHECK(has_error("job.ini:8: unknown key \"beta\" in [train]; did you mean"));
    DT_CHECK(has_error("job.ini:9: unknown key \"warmup\""));
    DT_CHECK(has_error("job.ini:11: unknown key \"lr\" in [data]; it belongs in [train]"));
    /* the unknown section's own keys are not reported one by one */
    DT_CHECK(!has_error("job.ini:6:"));
    if (errs.count != 5)
        dump_errors();
    DT_CHECK_INT(errs.count, 5);
}

static void test_wrong_types_and_ranges_all_at_once(void)
{
    int rc = load("[model]\ntype = mlp\n[train]\nbatch_size = eight\nlr = -1\nsteps = 1e3x\n"
                  "nesterov = maybe\noptimizer = adamm\n[ddp]\ntimeout = soon\n"
                  "[job]\ndevice = tpu\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: train.batch_size: \"eight\" is not an integer"));
    DT_CHECK(has_error("job.ini:5: train.lr: -1 is out of range"));
    DT_CHECK(has_error("job.ini:6: train.steps: \"1e3x\" is not an integer"));
    DT_CHECK(has_error("job.ini:7: train.nesterov: \"maybe\" is not a boolean"));
    DT_CHECK(has_error("job.ini:8: train.optimizer: \"adamm\" is not one of adamw|sgd; did you mean \"adamw\"?"));
    DT_CHECK(has_error("job.ini:10: ddp.timeout: \"soon\" is not a duration"));
    DT_CHECK(has_error("job.ini:12: job.device: \"tpu\" is not one of auto|cpu|cuda"));
    DT_CHECK_INT(errs.count, 7);
}

static void test_missing_required_and_syntax(void)
{
    int rc = load("[train]\nsteps = 10\nthis line is junk\n[model\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:3: expected \"key = value\""));
    DT_CHECK(has_error("job.ini:4: section header without closing ']'"));
    DT_CHECK(has_error("missing required key model.type"));
}

static void test_duplicate_key(void)
{
    int rc = load("[model]\ntype = mlp\n[train]\nlr = 0.1\nlr = 0.2\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: train.lr is set twice (also on line 4)"));
}

static void test_cross_key_validation(void)
{
    int rc = load("[model]\ntype = gpt\nn_layer = 2\nn_head = 3\nn_embd = 64\nblock_size = 32\n"
                  "[data]\ntype = text\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("n_embd (64) must be divisible by n_head (3)"));
    DT_CHECK(has_error("data.path is required for data.type = text"));
    rc = load("[model]\ntype = resnet\ndepth = 21\n", NULL, 0);
    DT_CHECK(has_error("model.depth: 21 is not 6n+2"));
    rc = load("[model]\ntype = mlp\n[elastic]\nnnodes = 3:2\nredirects = 7\n", NULL, 0);
    DT_CHECK(has_error("elastic.nnodes: \"3:2\" must be MIN:MAX"));
    DT_CHECK(has_error("elastic.redirects: \"7\" must be 0-3"));
    rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = join_timeout=5,hartbeat_timeout=3\n", NULL, 0);
    DT_CHECK(has_error("rendezvous.conf: unknown key \"hartbeat_timeout\"; did you mean \"heartbeat_timeout\"?"));
}

/* train.global_batch: a number of samples (0 = off); beside grad_accum it is an error that says
 * which to drop, with the line of the key, from the file or from an override. */
static void test_global_batch(void)
{
    int rc = load("[model]\ntype = mlp\n", NULL, 0);
    DT_CHECK(rc == 0);
    DT_CHECK_INT(job.global_batch, 0);
    rc = load("[model]\ntype = mlp\n[train]\nbatch_size = 8\nglobal_batch = 24\n", NULL, 0);
    DT_CHECK(rc == 0);
    DT_CHECK_INT(job.global_batch, 24);
    DT_CHECK_INT(job.grad_accum, 1);
    rc = load("[model]\ntype = mlp\n[train]\nglobal_batch = -3\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("train.global_batch"));
    rc = load("[model]\ntype = mlp\n[train]\ngrad_accum = 4\nglobal_batch = 64\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: train.grad_accum = 4 and train.global_batch = 64 both set"));
    DT_CHECK(has_error("drop train.grad_accum"));
    char *ov[] = {"train.global_batch=64"};
    rc = load("[model]\ntype = mlp\n[train]\ngrad_accum = 2\n", ov, 1);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("drop train.grad_accum"));
    char *ov1[] = {"train.global_batch=64", "train.grad_accum=1"};
    rc = load("[model]\ntype = mlp\n[train]\ngrad_accum = 2\n", ov1, 2);
    DT_CHECK(rc == 0);
    if (rc)
        dump_errors();
}

/* Every error at once: cross-key errors come with the file:line of the key involved, even when
 * other keys have errors too; a rejected key does not add noise from its default. */
static void test_cross_key_errors_with_lines(void)
{
    int rc = load("[model]\ntype = gpt\nn_layer = 2\nn_head = 3\nn_embd = 64\nblock_size = 32\n"
                  "[train]\nbatch_size = many\nlr = 0.001\nmin_lr = 0.01\n"
                  "[rendezvous]\nheartbeat_interval = 40\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:8: train.batch_size"));
    DT_CHECK(has_error("job.ini:5: model: n_embd (64) must be divisible by n_head (3)"));
    DT_CHECK(has_error("job.ini:10: train.min_lr (0.01) must not exceed"));
    DT_CHECK(has_error("job.ini:12: rendezvous.heartbeat_timeout (30 s)"));
    if (errs.count != 4)
        dump_errors();
    DT_CHECK_INT(errs.count, 4);
    /* n_head rejected: no "gpt needs n_head" on top of it */
    rc = load("[model]\ntype = gpt\npreset = gpt-tiny\nn_head = x\n[data]\ntype = synthetic\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK_INT(errs.count, 1);
    /* a conf entry's error carries the line of the conf */
    rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = heartbeat_interval=50\n", NULL, 0);
    DT_CHECK(has_error("job.ini:4: rendezvous.heartbeat_timeout"));
    rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = join_timeout=x\n", NULL, 0);
    DT_CHECK(has_error("job.ini:4: rendezvous.conf: rendezvous.join_timeout"));
    /* an override's error names the override */
    char *ov[] = {"rendezvous.heartbeat_interval=45"};
    rc = load("[model]\ntype = mlp\n", ov, 1);
    DT_CHECK(has_error("override 1 (rendezvous.heartbeat_interval=45): rendezvous.heartbeat_timeout"));
}

/* rendezvous.conf folds in where it is set; torchrun's conf names map onto dtrain's keys. */
static void test_rdzv_conf_position(void)
{
    char *ov[] = {"rendezvous.join_timeout=9"};
    int rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = join_timeout=7\n", ov, 1);
    DT_REQUIRE(rc == 0);
    DT_CHECK_NEAR(job.launch.join_timeout, 9, 0);
    char *ov2[] = {"rendezvous.conf=join_timeout=3,close_timeout=4"};
    rc = load("[model]\ntype = mlp\n[rendezvous]\njoin_timeout = 8\n", ov2, 1);
    DT_REQUIRE(rc == 0);
    DT_CHECK_NEAR(job.launch.join_timeout, 3, 0);
    DT_CHECK_NEAR(job.launch.close_timeout, 4, 0);
    DT_CHECK_STR(job.launch.rdzv_conf, ""); /* folded: nobody applies it twice */
    rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = timeout=11, keep_alive_interval=3, "
              "keep_alive_max_attempt=5, read_timeout=12s, is_host=true\n",
              NULL, 0);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_NEAR(job.launch.join_timeout, 11, 0);
    DT_CHECK_NEAR(job.launch.heartbeat_interval, 3, 0);
    DT_CHECK_NEAR(job.launch.heartbeat_timeout, 15, 0);
    DT_CHECK_NEAR(job.launch.read_timeout, 12, 0);
    DT_CHECK(job.launch.is_host);
    rc = load("[model]\ntype = mlp\n[rendezvous]\nconf = keep_alive_max_attempt=0\n", NULL, 0);
    DT_CHECK(has_error("job.ini:4: rendezvous.conf: keep_alive_max_attempt"));
}

/* Launcher keys are checked when set, so a file gets its line and a flag its name. */
static void test_launch_keys_checked_when_set(void)
{
    int rc = load("[model]\ntype = mlp\n[rendezvous]\nendpoint = host:abc\n[elastic]\nnnodes = 2\n"
                  "[rendezvous]\nnode_rank = 2\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: rendezvous.endpoint: endpoint \"host:abc\""));
    DT_CHECK(has_error("job.ini:8: rendezvous.node_rank out of range (--node-rank=2: must be 0..1"));
    dt_job_defaults(&job);
    dt_err err = {0};
    DT_CHECK(dt_job_set(&job, "rendezvous.endpoint=[::1]:29400", &err) == 0);
    DT_CHECK(dt_job_set(&job, "rendezvous.endpoint=node0", &err) == 0);
    DT_CHECK(dt_job_set(&job, "rendezvous.endpoint=node0:70000", &err) != 0);
    dt_setting s[] = {{"rendezvous.heartbeat_interval=50", "--rdzv-conf"}};
    memset(&errs, 0, sizeof errs);
    DT_CHECK(dt_launch_load(&job, s, 1, &errs, &err) == -EINVAL);
    DT_CHECK(has_error("--rdzv-conf: rendezvous.heartbeat_timeout"));
}

static void test_presets_and_explicit_values(void)
{
    int rc = load("[model]\ntype = gpt\npreset = gpt2-124m\nn_layer = 2\n[data]\ntype = synthetic\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_INT(job.n_layer, 2); /* explicit wins */
    DT_CHECK_INT(job.n_head, 12);
    DT_CHECK_INT(job.n_embd, 768);
    DT_CHECK_INT(job.block_size, 1024);
    DT_CHECK_INT(job.seq_len, 1024);
}

static void test_precedence(void)
{
    /* defaults < file < overrides (and later overrides win) */
    char *ov[] = {"train.lr=0.5", "train.batch_size=4", "train.lr=0.25"};
    int rc = load("[model]\ntype = mlp\n[train]\nlr = 0.1\nbatch_size = 2\nsteps = 7\n", ov, 3);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_NEAR(job.lr, 0.25, 0);
    DT_CHECK_INT(job.batch_size, 4);
    DT_CHECK_INT(job.steps, 7);
    char *bad[] = {"train.lr", "trian.lr=1", "train.lrr=1"};
    rc = load("[model]\ntype = mlp\n", bad, 3);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("\"train.lr\" is not section.key=value"));
    DT_CHECK(has_error("unknown section \"trian\""));
    DT_CHECK(has_error("unknown key \"lrr\" in [train]; did you mean \"lr\"?"));
}

static void test_print_round_trip(void)
{
    char *ov[] = {"train.lr=0.00123456789", "data.path=/tmp/some file.txt", "rendezvous.conf=join_timeout=7"};
    int rc = load("[model]\ntype = gpt\npreset = gpt-tiny\n[data]\ntype = text\n", ov, 3);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_NEAR(job.launch.join_timeout, 7, 0);
    static dt_job first;
    first = job;
    char path[1024];
    snprintf(path, sizeof path, "%s/printed.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print(&first, f);
    fclose(f);
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    rc = dt_job_load(&job, path, NULL, 0, &errs, &err);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    /* Everything but the source path and the already-folded rendezvous.conf string. */
    memset(first.path, 0, sizeof first.path);
    memset(job.path, 0, sizeof job.path);
    memset(first.launch.rdzv_conf, 0, sizeof first.launch.rdzv_conf);
    memset(job.launch.rdzv_conf, 0, sizeof job.launch.rdzv_conf);
    DT_CHECK(memcmp(&first, &job, sizeof job) == 0);
    DT_CHECK_STR(job.data_path, "/tmp/some file.txt");
}

/* --print-config writes the shortest number that reads back exactly, quotes what would lose
 * spaces or quotes, and values a job file cannot hold are refused where they are given. */
static void test_print_exact_values(void)
{
    char *ov[] = {"train.beta1=0.9", "train.lr=0.30000000000000004", "job.name=\" spaced \"",
                  "data.path=\"\"quoted\"\"", "job.output_dir=a;b #c"};
    int rc = load("[model]\ntype = mlp\n", ov, 5);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_STR(job.name, " spaced ");
    DT_CHECK_STR(job.data_path, "\"quoted\"");
    static dt_job first;
    first = job;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/exact.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print(&first, f);
    fclose(f);
    DT_REQUIRE(dt_read_file(path, &text, NULL, NULL) == 0);
    DT_CHECK_CONTAINS(text, "\nbeta1 = 0.9\n");
    DT_CHECK_CONTAINS(text, "\nlr = 0.30000000000000004\n");
    DT_CHECK_CONTAINS(text, "\nbeta2 = 0.999\n");
    DT_CHECK_CONTAINS(text, "\nname = \" spaced \"\n");
    free(text);
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    rc = dt_job_load(&job, path, NULL, 0, &errs, &err);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    memset(first.path, 0, sizeof first.path);
    memset(job.path, 0, sizeof job.path);
    DT_CHECK(memcmp(&first, &job, sizeof job) == 0);
    DT_CHECK_STR(job.name, " spaced ");
    DT_CHECK_STR(job.data_path, "\"quoted\"");
    DT_CHECK_STR(job.output_dir, "a;b #c");
    /* what cannot be written back is refused, naming where it came from */
    char *bad[] = {"job.output_dir=runs/x ;y", "data.path=a\nb"};
    rc = load("[model]\ntype = mlp\n", bad, 2);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("override 1 (job.output_dir=runs/x ;y): job.output_dir: \"runs/x ;y\" contains \" ;\""));
    DT_CHECK(has_error("override 2 (data.path=a"));
    DT_CHECK(has_error("line break"));
}

/* Small things a job file meets in the wild. */
static void test_small_input_handling(void)
{
    int rc = load("\xEF\xBB\xBF[model]\ntype = mlp\n[job]\nname = \"my job\"\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_CHECK(rc == 0); /* a UTF-8 BOM (Windows editors) is skipped */
    DT_CHECK_STR(job.name, "my job");
    rc = load("[model]\ntype = mlp\n[train]\nbatch_size = 9999999999\nsteps = 99999999999999999999\n"
              "[job]\nname =\n[rendezvous]\nid = a/b\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: train.batch_size: 9999999999 is out of range (min 1, max 10000000)"));
    DT_CHECK(has_error("job.ini:5: train.steps: 99999999999999999999 is out of range"));
    DT_CHECK(has_error("job.ini:7: job.name: \"\" must be a non-empty name without '/'"));
    DT_CHECK(has_error("job.ini:9: rendezvous.id: \"a/b\" must be a non-empty name"));
    char *ov[] = {"job.name=../x"};
    rc = load("[model]\ntype = mlp\n", ov, 1);
    DT_CHECK(has_error("job.name: \"../x\" must be a non-empty name without '/'"));
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    rc = dt_job_load(&job, dt_test_tmpdir(), NULL, 0, &errs, &err);
    DT_CHECK(rc != 0);
    DT_CHECK(has_error("cannot open job file: is a directory"));
}

static void test_long_line(void)
{
    /* inih reads 200 bytes per line; a longer key line is still read whole, its value trimmed
     * as inih trims (blanks, an inline "; comment"), and line numbers stay right after it. */
    char text[12000];
    char longpath[700];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    snprintf(text, sizeof text,
             "[model]\ntype = mlp\n[data]\npath = /%s/x;y  ; where the data is   \n[train]\nlr = x\n",
             longpath);
    int rc = load(text, NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(!has_error("longer than"));
    DT_CHECK(has_error("job.ini:6: train.lr"));
    char want[800];
    snprintf(want, sizeof want, "/%s/x;y", longpath);
    DT_CHECK_STR(job.data_path, want);
    /* a long value for a field that holds less: that field's limit, at its line */
    char name[400];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(text, sizeof text, "[model]\ntype = mlp\n[job]\nname = %s\n", name);
    DT_CHECK(load(text, NULL, 0) == -EINVAL);
    DT_CHECK(has_error("job.ini:4: job.name: value is longer than"));
    /* past what the reader takes (4095), and a long line that is no key: reported, skipped */
    char huge[5000];
    memset(huge, 'h', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    snprintf(text, sizeof text, "[model]\ntype = mlp\n[data]\npath = /%s\n  %s\n[train]\nlr = x\n",
             huge, longpath);
    DT_CHECK(load(text, NULL, 0) == -EINVAL);
    DT_CHECK(has_error("job.ini:4: line longer than 4095 characters"));
    DT_CHECK(has_error("job.ini:5: line longer than"));
    DT_CHECK(has_error("job.ini:7: train.lr"));
}

/* Every choice is decoded once, into the enum of config.h, at its position in the key's list;
 * the *_name functions and --print-config give the name back. */
static void test_enums_decoded(void)
{
    char *ov[] = {"job.strategy=DP", "train.precision=bf16", "ddp.compress=fp16",
                  "checkpoint.resume=/ckpt/step_5", "data.synthetic_shape=3x8x6",
                  "rendezvous.backend=c10d", "rendezvous.endpoint=node0:29400",
                  "train.schedule=cosine", "job.device=cpu", "model.preset=gpt-mini"};
    int rc = load("[model]\ntype = resnet\n[data]\ntype = synthetic\n", ov, 10);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK(job.model_type == DT_MODEL_RESNET && job.strategy == DT_STRATEGY_DP);
    DT_CHECK(job.precision == DT_PRECISION_BF16 && job.compress == DT_COMPRESS_FP16);
    DT_CHECK(job.resume == DT_RESUME_PATH);
    DT_CHECK_STR(job.resume_path, "/ckpt/step_5");
    DT_CHECK(job.synthetic_shape[0] == 3 && job.synthetic_shape[1] == 8 &&
             job.synthetic_shape[2] == 6);
    DT_CHECK(job.launch.rdzv_backend == DT_RDZV_C10D && job.schedule == DT_LR_COSINE);
    DT_CHECK(job.device == DT_DEVICE_CPU && job.preset == DT_PRESET_GPT_MINI);
    DT_CHECK_STR(dt_strategy_name(job.strategy), "dp");
    DT_CHECK_STR(dt_model_name(job.model_type), "resnet");
    DT_CHECK_STR(dt_rdzv_backend_name(job.launch.rdzv_backend), "c10d");
    DT_CHECK_STR(dt_preset_name(DT_PRESET_GPT2_124M), "gpt2-124m");
    DT_CHECK_STR(dt_model_name(DT_MODEL_UNSET), "");
    DT_CHECK_STR(dt_data_name((dt_data_kind)99), "");
    /* printed and read back: the same job */
    static dt_job first;
    first = job;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/enums.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print(&first, f);
    fclose(f);
    DT_REQUIRE(dt_read_file(path, &text, NULL, NULL) == 0);
    DT_CHECK_CONTAINS(text, "\nstrategy = dp\n");
    DT_CHECK_CONTAINS(text, "\nresume = /ckpt/step_5\n");
    DT_CHECK_CONTAINS(text, "\nsynthetic_shape = 3x8x6\n");
    free(text);
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    DT_REQUIRE(dt_job_load(&job, path, NULL, 0, &errs, &err) == 0);
    memset(first.path, 0, sizeof first.path);
    memset(job.path, 0, sizeof job.path);
    DT_CHECK(memcmp(&first, &job, sizeof job) == 0);
    /* every choice of every enum key: its position, and back to its name */
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        const dt_cfg_field *fd = &dt_cfg_fields[i];
        if (fd->type != DT_CFG_ENUM)
            continue;
        DT_CHECK_INT((int)fd->size, (int)sizeof(int));
        for (int k = 0; fd->choices[k]; k++) {
            char set[128];
            snprintf(set, sizeof set, "%s.%s=%s", fd->section, fd->key, fd->choices[k]);
            dt_job_defaults(&job);
            DT_REQUIRE_OK(dt_job_set(&job, set, &err), &err);
            DT_CHECK_MSG(*(const int *)((const char *)&job + fd->offset) == k, "%s", set);
        }
    }
    /* "never" and "auto" are no paths; a path is kept as given */
    dt_job_defaults(&job);
    DT_REQUIRE_OK(dt_job_set(&job, "checkpoint.resume=Never", &err), &err);
    DT_CHECK(job.resume == DT_RESUME_NEVER && !job.resume_path[0]);
    DT_CHECK(dt_job_set(&job, "checkpoint.resume=", &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "checkpoint.resume: use auto, never or a checkpoint path");
    DT_REQUIRE_OK(dt_job_set(&job, "data.synthetic_shape=vector", &err), &err);
    DT_CHECK(job.synthetic_shape[0] == 0);
    DT_CHECK(dt_job_set(&job, "data.synthetic_shape=3x0x2", &err) == -EINVAL);
}

/* elastic.nproc_per_node is decoded once into a dt_nproc (issue 16): a number or auto|cpu|gpu,
 * exactly as written; errors at their line; printed back as given. */
static void test_nproc_decoded(void)
{
    int rc = load("[model]\ntype = mlp\n[elastic]\nnproc_per_node = auto\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK(job.launch.nproc_per_node.kind == DT_NPROC_AUTO);
    DT_CHECK_STR(dt_nproc_name(job.launch.nproc_per_node.kind), "auto");
    dt_err err = {0};
    static const struct {
        const char *text;
        dt_nproc_kind kind;
        int n;
    } good[] = {{"7", DT_NPROC_NUMBER, 7}, {"cpu", DT_NPROC_CPU, 0}, {"gpu", DT_NPROC_GPU, 0},
                {"auto", DT_NPROC_AUTO, 0}, {"4096", DT_NPROC_NUMBER, 4096}};
    for (size_t i = 0; i < DT_ARRAY_LEN(good); i++) {
        char set[64], back[32];
        snprintf(set, sizeof set, "elastic.nproc_per_node=%s", good[i].text);
        dt_job_defaults(&job);
        DT_REQUIRE_OK(dt_job_set(&job, set, &err), &err);
        DT_CHECK_MSG(job.launch.nproc_per_node.kind == good[i].kind &&
                         job.launch.nproc_per_node.n == good[i].n,
                     "%s", set);
        DT_CHECK_STR(dt_nproc_format(&job.launch.nproc_per_node, back, sizeof back), good[i].text);
    }
    /* names in any case, as every key with fixed choices (docs/keys.md) */
    dt_job_defaults(&job);
    DT_REQUIRE_OK(dt_job_set(&job, "elastic.nproc_per_node=Auto", &err), &err);
    DT_CHECK(job.launch.nproc_per_node.kind == DT_NPROC_AUTO);
    static const char *const bad[] = {"0", "4097", "-1", "many", "", "2 workers"};
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++) {
        char set[64], want[128];
        snprintf(set, sizeof set, "elastic.nproc_per_node=%s", bad[i]);
        snprintf(want, sizeof want,
                 "elastic.nproc_per_node: \"%s\" must be a number from 1 to 4096, auto, cpu or gpu",
                 bad[i]);
        dt_job_defaults(&job);
        DT_CHECK_MSG(dt_job_set(&job, set, &err) == -EINVAL, "%s accepted", set);
        DT_CHECK_CONTAINS(err.msg, want);
        DT_CHECK(job.launch.nproc_per_node.kind == DT_NPROC_NUMBER &&
                 job.launch.nproc_per_node.n == 1); /* the default stays */
    }
    rc = load("[model]\ntype = mlp\n[elastic]\nnproc_per_node = 0\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: elastic.nproc_per_node: \"0\" must be a number from 1 to "
                       "4096, auto, cpu or gpu"));
    /* printed and read back: the same job, and the line --print-config always wrote */
    char *ov[] = {"elastic.nproc_per_node=gpu"};
    DT_REQUIRE(load("[model]\ntype = mlp\n", ov, 1) == 0);
    static dt_job first;
    first = job;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/nproc.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print(&first, f);
    fclose(f);
    DT_REQUIRE(dt_read_file(path, &text, NULL, NULL) == 0);
    DT_CHECK_CONTAINS(text, "\n[elastic]\nnnodes = 1\nnproc_per_node = gpu\n");
    free(text);
    memset(&errs, 0, sizeof errs);
    DT_REQUIRE(dt_job_load(&job, path, NULL, 0, &errs, &err) == 0);
    memset(first.path, 0, sizeof first.path);
    memset(job.path, 0, sizeof job.path);
    DT_CHECK(memcmp(&first, &job, sizeof job) == 0);
    /* a struct filled otherwise is checked too */
    dt_launch l;
    dt_launch_defaults(&l);
    l.nproc_per_node = (dt_nproc){DT_NPROC_NUMBER, 0};
    memset(&errs, 0, sizeof errs);
    DT_CHECK(dt_launch_validate(&l, "flags", &errs) == -EINVAL);
    DT_CHECK(has_error("flags: elastic.nproc_per_node: \"0\" must be a number from 1 to 4096"));
}

/* Issue 21: a NUL or another control byte is an error at its line, and the lines after it keep
 * their numbers; in a comment too. */
static void test_control_bytes(void)
{
    static const char nul[] = "[model]\ntype = mlp\n[job]\nname = ab\0cd\n[train]\nlr = x\n";
    DT_CHECK(load_bytes(nul, sizeof nul - 1) == -EINVAL);
    DT_CHECK(has_error("job.ini:4: control character 0x00"));
    DT_CHECK(has_error("job.ini:6: train.lr"));
    DT_CHECK(!has_error("job.ini:5:"));
    static const char nul_comment[] = "[model]\ntype = mlp\n; a \0 in a comment\n[train]\nlr = x\n";
    DT_CHECK(load_bytes(nul_comment, sizeof nul_comment - 1) == -EINVAL);
    DT_CHECK(has_error("job.ini:3: control character 0x00"));
    DT_CHECK(has_error("job.ini:5: train.lr"));
    /* ESC (a terminal colour code) and BEL in string values */
    DT_CHECK(load("[model]\ntype = mlp\n[job]\nname = \x1b[31mred\n[data]\npath = a\ab\n", NULL,
                  0) == -EINVAL);
    DT_CHECK(has_error("job.ini:4: control character 0x1b"));
    DT_CHECK(has_error("job.ini:6: control character 0x07"));
    /* a tab is white space, and CRLF line ends are fine */
    int rc = load("[model]\r\ntype =\tmlp\r\n[job]\r\nname = a\tb\r\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_CHECK(rc == 0);
    DT_CHECK_STR(job.name, "a\tb");
    /* the same from the command line */
    char *ov[] = {"job.name=a\x1b" "b"};
    DT_CHECK(load("[model]\ntype = mlp\n", ov, 1) == -EINVAL);
    DT_CHECK(has_error("job.name: the value contains control character 0x1b"));
}

/* Issue 21: integers are decimal; 010 is ten, 08 is eight, hex needs 0x. */
static void test_integers_are_decimal(void)
{
    int rc = load("[model]\ntype = mlp\n[train]\nsteps = 010\nbatch_size = 08\n"
                  "[rendezvous]\nmaster_port = 0x7530\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
    DT_CHECK_INT((int)job.steps, 10);
    DT_CHECK_INT(job.batch_size, 8);
    DT_CHECK_INT(job.launch.master_port, 30000);
}

/* Issue 21: a value that opens a double quote must close it. */
static void test_unterminated_quote(void)
{
    DT_CHECK(load("[model]\ntype = mlp\n[job]\nname = \"quick\n[data]\npath = \"\n", NULL, 0) ==
             -EINVAL);
    DT_CHECK(has_error("job.ini:4: job.name: unterminated double quote in \"quick"));
    DT_CHECK(has_error("job.ini:6: data.path: unterminated double quote"));
    char *ov[] = {"job.output_dir=\"runs/x"};
    DT_CHECK(load("[model]\ntype = mlp\n", ov, 1) == -EINVAL);
    DT_CHECK(has_error("override 1 (job.output_dir=\"runs/x): job.output_dir: unterminated double quote"));
    /* closed, and a quote inside: fine */
    int rc = load("[model]\ntype = mlp\n[job]\nname = \"quick\"\n[data]\npath = a\"b\n", NULL, 0);
    if (rc)
        dump_errors();
    DT_CHECK(rc == 0);
    DT_CHECK_STR(job.name, "quick");
    DT_CHECK_STR(job.data_path, "a\"b");
}

/* Issue 21: a comment may be as long as it likes; line numbers stay right after it. */
static void test_long_comment(void)
{
    char text[4000], note[600];
    memset(note, 'c', sizeof note - 1);
    note[sizeof note - 1] = '\0';
    snprintf(text, sizeof text,
             "; %s\n[model]\n  # %s\ntype = mlp ; %s\n[train]\n;%s\nlr = x\n", note, note, note,
             note);
    DT_CHECK(load(text, NULL, 0) == -EINVAL);
    if (has_error("longer than"))
        dump_errors();
    DT_CHECK(!has_error("longer than"));
    DT_CHECK(has_error("job.ini:7: train.lr"));
    DT_CHECK(job.model_type == DT_MODEL_MLP);
    DT_CHECK_INT(errs.count, 1);
}

static void test_shipped_configs_load(void)
{
    /* Every example job must load and validate as shipped. The test runs from the repository
     * root (make test). */
    const char *cmd = "ls configs/*.ini";
    char *out = NULL;
    DT_REQUIRE(dt_test_run(cmd, &out, 10) == 0);
    int n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        memset(&errs, 0, sizeof errs);
        dt_err err = {0};
        int rc = dt_job_load(&job, line, NULL, 0, &errs, &err);
        if (rc)
            dump_errors();
        DT_CHECK_MSG(rc == 0, "%s does not load: %s", line, err.msg);
        n++;
    }
    free(out);
    DT_CHECK(n >= 1);
}

/* ---- [parallel]: tensor, pipeline, micro_batches, schedule, stages ------------------------- */

#define GPT_MINI "[model]\ntype = gpt\npreset = gpt-mini\n" /* 6 blocks, 6 heads */

/* Loads text (with overrides) expecting success, and says why not. */
static void load_ok(const char *text, char **ov, int n)
{
    int rc = load(text, ov, n);
    if (rc)
        dump_errors();
    DT_REQUIRE(rc == 0);
}

/* Every key: defaults, values, the derived micro_batches, printing and reading back, and the
 * helpers that count a model's blocks and split them into stages. */
static void test_parallel_keys(void)
{
    load_ok("[model]\ntype = mlp\n", NULL, 0);
    DT_CHECK_INT(job.tensor, 1);
    DT_CHECK_INT(job.pipeline, 1);
    DT_CHECK_INT(job.micro_batches, 1); /* derived: no pipeline */
    DT_CHECK(job.pp_schedule == DT_PP_1F1B);
    DT_CHECK_INT(job.n_stage_blocks, 0);
    DT_CHECK_INT(dt_job_pipeline_blocks(&job), 3); /* hidden 256,256: three Linear layers */
    DT_CHECK_STR(dt_pp_schedule_name(DT_PP_1F1B), "1f1b");
    DT_CHECK_STR(dt_pp_schedule_name(DT_PP_GPIPE), "gpipe");
    DT_CHECK_STR(dt_pp_schedule_name((dt_pp_schedule_kind)7), "");

    /* 12 ranks = data 1 x tensor 2 x pipeline 3 on gpt-mini */
    load_ok(GPT_MINI "[train]\nbatch_size = 6\n[parallel]\ntensor = 2\npipeline = 3\n"
            "schedule = GPipe\nstages = 1, 2,3\n[elastic]\nnproc_per_node = 6\n",
            NULL, 0);
    DT_CHECK_INT(job.tensor, 2);
    DT_CHECK_INT(job.pipeline, 3);
    DT_CHECK_INT(job.micro_batches, 3); /* derived: = pipeline */
    DT_CHECK(job.pp_schedule == DT_PP_GPIPE);
    DT_CHECK_INT(job.n_stage_blocks, 3);
    DT_CHECK(job.stage_blocks[0] == 1 && job.stage_blocks[1] == 2 && job.stage_blocks[2] == 3 &&
             job.stage_blocks[3] == 0);
    int blocks[DT_MAX_STAGES];
    dt_err err = {0};
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 3);
    DT_CHECK(blocks[0] == 1 && blocks[1] == 2 && blocks[2] == 3);
    /* printed and read back: the same job, micro_batches as derived */
    static dt_job first;
    first = job;
    char path[1024], *text = NULL;
    snprintf(path, sizeof path, "%s/parallel.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print(&first, f);
    fclose(f);
    DT_REQUIRE(dt_read_file(path, &text, NULL, NULL) == 0);
    DT_CHECK_CONTAINS(text, "\n[parallel]\nzero = 0\ntensor = 2\npipeline = 3\nmicro_batches = 3\n"
                            "schedule = gpipe\nstages = 1,2,3\n");
    free(text);
    memset(&errs, 0, sizeof errs);
    DT_REQUIRE(dt_job_load(&job, path, NULL, 0, &errs, &err) == 0);
    memset(first.path, 0, sizeof first.path);
    memset(job.path, 0, sizeof job.path);
    DT_CHECK(memcmp(&first, &job, sizeof job) == 0);

    /* an explicit micro_batches is kept, 1 included; dt_job_defaults gives 1 */
    char *ov[] = {"parallel.pipeline=2", "parallel.micro_batches=4", "elastic.nproc_per_node=2"};
    load_ok(GPT_MINI, ov, 3);
    DT_CHECK_INT(job.micro_batches, 4);
    char *ov1[] = {"parallel.micro_batches=1", "parallel.pipeline=2", "elastic.nproc_per_node=2"};
    load_ok(GPT_MINI, ov1, 3);
    DT_CHECK_INT(job.micro_batches, 1);
    dt_job_defaults(&job);
    DT_CHECK(job.micro_batches == 1 && job.tensor == 1 && job.pipeline == 1);
    /* the balanced split: earlier stages take one more */
    char *ov4[] = {"parallel.pipeline=4", "elastic.nproc_per_node=4"};
    load_ok(GPT_MINI, ov4, 2);
    DT_CHECK_INT(job.micro_batches, 4);
    DT_CHECK_INT(dt_job_pipeline_blocks(&job), 6);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 4);
    DT_CHECK(blocks[0] == 2 && blocks[1] == 2 && blocks[2] == 1 && blocks[3] == 1);
    /* balanced by cost: gpt's head (2*C*V FLOPs a token) weighs on the last stage. C = 16,
     * T = 16, V = 256: a block 24*16^2 + 4*16*16 = 7168, the head 8192; over 2 stages 2,2 would
     * make the last 22528, 3,1 makes the first 21504 */
    char *ovh[] = {"parallel.pipeline=2", "model.n_layer=4", "model.n_head=4", "model.n_embd=16",
                   "model.block_size=16", "data.seq_len=16", "elastic.nproc_per_node=2"};
    load_ok(GPT_MINI, ovh, 7);
    double cb = 0, cf = -1, cl = 0;
    DT_CHECK_INT(dt_job_stage_costs(&job, &cb, &cf, &cl), 1);
    DT_CHECK(cb == 7168 && cf == 0 && cl == 8192);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 2);
    DT_CHECK_MSG(blocks[0] == 3 && blocks[1] == 1, "balanced 4 blocks as %d,%d", blocks[0],
                 blocks[1]);
    /* a GPT-2 vocabulary on gpt-tiny (C = 128, T = 128): the head weighs 28 blocks; the last
     * stage keeps one block and the others share the rest evenly (not 5,1,1,1, whose maximum
     * is the same) */
    char *ovv[] = {"model.preset=gpt-tiny", "model.n_layer=8", "data.vocab_size=50257",
                   "parallel.pipeline=4", "elastic.nproc_per_node=4"};
    load_ok("[model]\ntype = gpt\n", ovv, 5);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 4);
    DT_CHECK_MSG(blocks[0] == 3 && blocks[1] == 2 && blocks[2] == 2 && blocks[3] == 1,
                 "balanced 8 blocks as %d,%d,%d,%d", blocks[0], blocks[1], blocks[2], blocks[3]);
    /* parallel.stages wins over the balance */
    DT_REQUIRE_OK(dt_job_set(&job, "parallel.stages=1,1,2,4", &err), &err);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 4);
    DT_CHECK(blocks[0] == 1 && blocks[1] == 1 && blocks[2] == 2 && blocks[3] == 4);
    /* mlp: its Linear layers are the blocks */
    char *ovm[] = {"parallel.pipeline=3", "model.hidden=32,16", "train.batch_size=9",
                   "elastic.nproc_per_node=3"};
    load_ok("[model]\ntype = mlp\n", ovm, 4);
    DT_CHECK_INT(dt_job_pipeline_blocks(&job), 3);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 3);
    DT_CHECK(blocks[0] == 1 && blocks[1] == 1 && blocks[2] == 1);
    /* stages = "" goes back to balanced */
    DT_REQUIRE_OK(dt_job_set(&job, "parallel.stages=2,1", &err), &err);
    DT_CHECK_INT(job.n_stage_blocks, 2);
    DT_REQUIRE_OK(dt_job_set(&job, "parallel.stages=", &err), &err);
    DT_CHECK(job.n_stage_blocks == 0 && job.stage_blocks[0] == 0);
    /* resnet: its residual blocks, (depth - 2) / 2 of the CIFAR form, torchvision's 16 of
     * ResNet-50 (3 + 4 + 6 + 3), counted alike */
    load_ok("[model]\ntype = resnet\n", NULL, 0);
    DT_CHECK_INT(dt_job_pipeline_blocks(&job), 9);
    job.pipeline = 2;
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 2);
    DT_CHECK(blocks[0] == 5 && blocks[1] == 4);
    char *ovr[] = {"model.preset=resnet50", "parallel.pipeline=4", "elastic.nproc_per_node=4"};
    load_ok("[model]\ntype = resnet\n", ovr, 3);
    DT_CHECK_INT(dt_job_pipeline_blocks(&job), 16);
    DT_CHECK_INT(dt_job_stage_blocks(&job, blocks, &err), 4);
    DT_CHECK(blocks[0] == 4 && blocks[1] == 4 && blocks[2] == 4 && blocks[3] == 4);
    /* a world only the rendezvous knows is not checked at load: the agent does */
    char *ove[] = {"parallel.tensor=2", "elastic.nnodes=1:4"};
    load_ok(GPT_MINI, ove, 2); /* 2 or 4 nodes of one worker fit */
    char *ova[] = {"parallel.tensor=3", "elastic.nproc_per_node=auto"};
    load_ok(GPT_MINI, ova, 2);
}

/* Each error of the keys themselves, with its line. */
static void test_parallel_key_forms(void)
{
    int rc = load(GPT_MINI "[parallel]\ntensor = 0\npipeline = 65\nmicro_batches = 0\n"
                  "schedule = pipedream\nstages = 2,,2\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: parallel.tensor: 0 is out of range (min 1, max 1024)"));
    DT_CHECK(has_error("job.ini:6: parallel.pipeline: 65 is out of range (min 1, max 64)"));
    DT_CHECK(has_error("job.ini:7: parallel.micro_batches: 0 is out of range (min 1, max 1000000)"));
    DT_CHECK(has_error("job.ini:8: parallel.schedule: \"pipedream\" is not one of 1f1b|gpipe"));
    DT_CHECK(has_error("job.ini:9: parallel.stages: \"2,,2\" must be blocks per stage such as "
                       "4,4,2,2"));
    if (errs.count != 5)
        dump_errors();
    DT_CHECK_INT(errs.count, 5);
    static const char *const bad[] = {"0,4", "a", "4,", ",4", "3,-1", "1.5,2", "2 3"};
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++) {
        char set[64];
        dt_err err = {0};
        snprintf(set, sizeof set, "parallel.stages=%s", bad[i]);
        dt_job_defaults(&job);
        DT_CHECK_MSG(dt_job_set(&job, set, &err) == -EINVAL, "%s accepted", set);
        DT_CHECK_CONTAINS(err.msg, "must be blocks per stage");
        DT_CHECK_INT(job.n_stage_blocks, 0);
    }
    /* 65 stages is one more than DT_MAX_STAGES */
    char many[256] = "parallel.stages=1";
    for (int i = 1; i < 65; i++)
        strcat(many, ",1");
    dt_err err = {0};
    DT_CHECK(dt_job_set(&job, many, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "at most 64 stages");
}

/* The layout against the model, the strategy, ZeRO, the batch and a world fixed at load: each
 * error names the keys, the file:line of the key set last, and the fix. */
static void test_parallel_errors(void)
{
    /* tensor: gpt only, whole heads per rank */
    int rc = load("[model]\ntype = gpt\npreset = gpt2-124m\n[parallel]\ntensor = 5\n"
                  "[elastic]\nnproc_per_node = 5\n",
                  NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: model.n_head = 12 is not divisible by parallel.tensor = 5 "
                       "(each tensor rank takes whole attention heads): use 1, 2, 3, 4, 6 or 12"));
    DT_CHECK_INT(errs.count, 1);
    rc = load("[model]\ntype = mlp\n[parallel]\ntensor = 2\n[elastic]\nnproc_per_node = 2\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:4: parallel.tensor = 2: tensor parallelism (Megatron-LM's column "
                       "and row splits) is supported for models gpt, bert and llama only, not "
                       "mlp; use parallel.tensor = 1"));
    /* pipeline: at most the model's blocks (resnet's residual blocks) */
    rc = load("[model]\ntype = resnet\ndepth = 8\n[parallel]\npipeline = 4\n[elastic]\n"
              "nproc_per_node = 4\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: parallel.pipeline = 4 is more than the model's 3 residual "
                       "blocks (model.depth, model.preset): every stage needs at least one; use "
                       "parallel.pipeline = 3 or fewer, or a deeper model"));
    DT_CHECK_INT(errs.count, 1);
    char *ov7[] = {"parallel.pipeline=7", "train.batch_size=7", "elastic.nproc_per_node=7"};
    rc = load(GPT_MINI, ov7, 3);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("override 1 (parallel.pipeline=7): parallel.pipeline = 7 is more than the "
                       "model's 6 transformer blocks (model.n_layer): every stage needs at least "
                       "one; use parallel.pipeline = 6 or fewer"));
    DT_CHECK_INT(errs.count, 1);
    rc = load("[model]\ntype = mlp\nhidden = 64\n[parallel]\npipeline = 3\n[train]\n"
              "batch_size = 3\n[elastic]\nnproc_per_node = 3\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("parallel.pipeline = 3 is more than the model's 2 Linear layers "
                       "(model.hidden's widths + 1)"));
    /* stages: one per stage, adding up to the blocks */
    rc = load(GPT_MINI "[parallel]\npipeline = 2\nstages = 2,2,2\n[elastic]\nnproc_per_node = 2\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:6: parallel.stages = 2,2,2 gives 3 stages but parallel.pipeline "
                       "= 2: give the blocks of each of the 2 stages"));
    DT_CHECK_INT(errs.count, 1);
    rc = load(GPT_MINI "[parallel]\npipeline = 2\nstages = 4,3\n[elastic]\nnproc_per_node = 2\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:6: parallel.stages = 4,3 adds up to 7 blocks, but the model has 6 "
                       "transformer blocks (model.n_layer): make the stages' blocks add up to 6"));
    DT_CHECK_INT(errs.count, 1);
    /* micro_batches divides the rank's batch: given, or derived from the pipeline */
    rc = load(GPT_MINI "[parallel]\nmicro_batches = 3\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: parallel.micro_batches = 3 does not divide train.batch_size = 8 "
                       "(a rank's batch is cut into micro-batches of equal size): set "
                       "parallel.micro_batches to a divisor of 8, or train.batch_size to a "
                       "multiple of 3"));
    rc = load(GPT_MINI "[parallel]\npipeline = 3\n[elastic]\nnproc_per_node = 3\n", NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:5: parallel.micro_batches = 3 (its default: parallel.pipeline) "
                       "does not divide train.batch_size = 8"));
    DT_CHECK_INT(errs.count, 1);
    /* one worker per device; no ZeRO yet */
    rc = load(GPT_MINI "[job]\nstrategy = dp\n[parallel]\ntensor = 2\n[elastic]\n"
              "nproc_per_node = 2\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("job.ini:7: parallel.tensor = 2 and parallel.pipeline = 1 need one worker "
                       "process per device, but job.strategy = dp drives every replica from one "
                       "process: use job.strategy = ddp"));
    DT_CHECK_INT(errs.count, 1);
    /* ZeRO shards over the data-parallel groups of the tensor and pipeline shards */
    load_ok(GPT_MINI "[parallel]\nzero = 1\npipeline = 2\n[elastic]\nnproc_per_node = 4\n",
            NULL, 0);
    load_ok(GPT_MINI "[parallel]\nzero = 2\ntensor = 2\n[elastic]\nnproc_per_node = 4\n",
            NULL, 0);
    load_ok(GPT_MINI "[parallel]\nzero = 3\ntensor = 2\n[elastic]\nnproc_per_node = 4\n",
            NULL, 0);
    load_ok(GPT_MINI "[parallel]\nzero = 3\npipeline = 2\n[elastic]\nnproc_per_node = 4\n",
            NULL, 0);
    /* a world fixed at load: nodes x workers must be a multiple of T x P */
    char *ovw[] = {"parallel.tensor=2", "parallel.pipeline=2", "train.batch_size=4"};
    rc = load(GPT_MINI "[elastic]\nnnodes = 2\nnproc_per_node = 3\n", ovw, 3);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("override 2 (parallel.pipeline=2): elastic.nnodes = 2 x "
                       "elastic.nproc_per_node = 3: world size 6 is not divisible by "
                       "parallel.tensor x parallel.pipeline = 2 x 2 = 4 (the ranks of one "
                       "data-parallel replica): run a multiple of 4 ranks (4, 8, 12, ...), or "
                       "change parallel.tensor or parallel.pipeline"));
    DT_CHECK_INT(errs.count, 1);
    char *ovw2[] = {"parallel.tensor=2", "parallel.pipeline=2", "train.batch_size=4",
                    "elastic.nproc_per_node=2"};
    load_ok(GPT_MINI "[elastic]\nnnodes = 2\nnproc_per_node = 3\n", ovw2, 4);
    /* an elastic range none of whose worlds fits */
    char *ovr[] = {"parallel.tensor=3", "elastic.nnodes=1:2", "elastic.nproc_per_node=2"};
    rc = load(GPT_MINI, ovr, 3);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("elastic.nnodes = 1:2 x elastic.nproc_per_node = 2: none of the world sizes "
                       "2 to 4 is a multiple of parallel.tensor x parallel.pipeline = 3 x 1 = 3"));
    DT_CHECK_INT(errs.count, 1);
    /* all of them at once, each once */
    rc = load("[model]\ntype = resnet\n[job]\nstrategy = dp\n[parallel]\ntensor = 2\n"
              "pipeline = 2\nzero = 3\n[train]\nbatch_size = 5\n",
              NULL, 0);
    DT_CHECK(rc == -EINVAL);
    DT_CHECK(has_error("supported for models gpt, bert and llama only, not resnet"));
    DT_CHECK(has_error("micro_batches = 2 (its default: parallel.pipeline) does not divide"));
    DT_CHECK(has_error("job.strategy = dp drives every replica"));
    DT_CHECK(has_error("world size 1 is not divisible"));
    /* parallel.zero with job.strategy = dp is the older message, said too */
    DT_CHECK(has_error("parallel.zero = 3 shards state across worker processes"));
    if (errs.count != 5)
        dump_errors();
    DT_CHECK_INT(errs.count, 5);
}

static void test_reference_lists_every_key(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/ref.md", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    dt_job_print_reference(f);
    fclose(f);
    char *text = NULL;
    DT_REQUIRE(dt_read_file(path, &text, NULL, NULL) == 0);
    for (int i = 0; i < dt_cfg_fields_count; i++) {
        char key[128];
        snprintf(key, sizeof key, "`%s.%s`", dt_cfg_fields[i].section, dt_cfg_fields[i].key);
        DT_CHECK_CONTAINS(text, key);
    }
    /* docs/keys.md carries the same reference, generated from the same table. */
    char *doc = NULL;
    DT_REQUIRE(dt_read_file("docs/keys.md", &doc, NULL, NULL) == 0);
    DT_CHECK_MSG(strstr(doc, text) != NULL,
                 "docs/keys.md's job file reference differs from the table in runtime/job/config.c; "
                 "regenerate it with scripts/update-keys-doc.sh");
    free(doc);
    free(text);
}

/* "section.key=value" lines of INI text (comments and spaces dropped), one per line. */
static void ini_pairs(const char *text, char *out, size_t cap)
{
    char section[64] = "", line[512];
    size_t n = 0;
    out[0] = '\0';
    while (*text) {
        size_t len = strcspn(text, "\n");
        snprintf(line, sizeof line, "%.*s", (int)(len < 511 ? len : 511), text);
        text += len + (text[len] == '\n');
        char *semi = strstr(line, " ;");
        if (semi)
            *semi = '\0';
        char *t = dt_trim(line);
        if (t[0] == ';' || t[0] == '#' || !t[0])
            continue;
        if (t[0] == '[') {
            snprintf(section, sizeof section, "%.*s", (int)strcspn(t + 1, "]"), t + 1);
            continue;
        }
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = '\0';
        n += (size_t)snprintf(out + n, cap - n, "%s.%s=%s\n", section, dt_trim(t), dt_trim(eq + 1));
        if (n >= cap)
            return;
    }
}

/* README's annotated job file is configs/quickstart.ini, abridged: every key = value it shows
 * is the shipped one. */
static void test_readme_quickstart_block_matches(void)
{
    char *readme = NULL, *ini = NULL;
    DT_REQUIRE(dt_read_file("README.md", &readme, NULL, NULL) == 0);
    DT_REQUIRE(dt_read_file("configs/quickstart.ini", &ini, NULL, NULL) == 0);
    char *start = strstr(readme, "```ini\n; configs/quickstart.ini");
    DT_CHECK_MSG(start != NULL, "README.md has no ```ini block starting with ; configs/quickstart.ini");
    DT_REQUIRE(start != NULL);
    start = strchr(start, '\n') + 1;
    char *end = strstr(start, "```");
    DT_REQUIRE(end != NULL);
    *end = '\0';
    static char shown[8192], shipped[8192];
    ini_pairs(start, shown, sizeof shown);
    ini_pairs(ini, shipped, sizeof shipped);
    int n = 0;
    for (char *line = strtok(shown, "\n"); line; line = strtok(NULL, "\n"), n++) {
        char want[600];
        snprintf(want, sizeof want, "%s\n", line);
        DT_CHECK_MSG(strstr(shipped, want) != NULL,
                     "README.md's quickstart block shows %s, configs/quickstart.ini differs", line);
    }
    DT_CHECK(n >= 5);
    free(readme);
    free(ini);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"config_defaults_and_minimal", test_defaults_and_minimal, 0},
        {"config_every_field_has_valid_default", test_every_field_has_valid_default, 0},
        {"config_unknown_section_and_key", test_unknown_section_and_key, 0},
        {"config_device_memory", test_device_memory, 0},
        {"config_wrong_types_and_ranges", test_wrong_types_and_ranges_all_at_once, 0},
        {"config_missing_required_and_syntax", test_missing_required_and_syntax, 0},
        {"config_duplicate_key", test_duplicate_key, 0},
        {"config_cross_key_validation", test_cross_key_validation, 0},
        {"config_global_batch", test_global_batch, 0},
        {"config_presets", test_presets_and_explicit_values, 0},
        {"config_cross_key_errors_with_lines", test_cross_key_errors_with_lines, 0},
        {"config_rdzv_conf_position", test_rdzv_conf_position, 0},
        {"config_launch_keys_checked_when_set", test_launch_keys_checked_when_set, 0},
        {"config_precedence", test_precedence, 0},
        {"config_print_round_trip", test_print_round_trip, 0},
        {"config_print_exact_values", test_print_exact_values, 0},
        {"config_small_input_handling", test_small_input_handling, 0},
        {"config_long_line", test_long_line, 0},
        {"config_enums_decoded", test_enums_decoded, 0},
        {"config_nproc_decoded", test_nproc_decoded, 0},
        {"config_control_bytes", test_control_bytes, 0},
        {"config_integers_are_decimal", test_integers_are_decimal, 0},
        {"config_unterminated_quote", test_unterminated_quote, 0},
        {"config_long_comment", test_long_comment, 0},
        {"config_shipped_configs_load", test_shipped_configs_load, 0},
        {"config_parallel_keys", test_parallel_keys, 0},
        {"config_parallel_key_forms", test_parallel_key_forms, 0},
        {"config_parallel_errors", test_parallel_errors, 0},
        {"config_reference_lists_every_key", test_reference_lists_every_key, 0},
        {"config_readme_quickstart_block", test_readme_quickstart_block_matches, 0},
    };
    return dt_test_main("test_config", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
