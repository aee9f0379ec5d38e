/* test_metrics.c - metrics.jsonl: one parseable JSON object per record, appended across opens
 * (a restarted job continues the file), nothing written by ranks other than 0. */
#include <cJSON.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/obs/metrics.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

static void test_records(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/out/run", dt_test_tmpdir()); /* created by open */
    dt_metrics *m = NULL;
    dt_err err = {0};
    for (int attempt = 0; attempt < 2; attempt++) {
        DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, attempt == 0, attempt, &err), &err);
        dt_step_record r = {.step = 10, .total_steps = 100, .epoch = 0, .loss = 2.5, .lr = 1e-3,
                            .grad_norm = 0.7, .items_per_s = 12345, .step_time_s = 0.02,
                            .peak_mem_bytes = 1 << 20, .max_rss_bytes = dt_metrics_max_rss()};
        if (attempt == 1) { /* the allocator's accounting, when there is one, is what counts */
            r.mem.peak[DT_MEM_PARAMS] = 1000;
            r.mem.peak[DT_MEM_ACTS] = 2500;
            r.mem.total_peak = 3000;
        }
        dt_metrics_step(m, &r);
        dt_eval_record e = {.step = 10, .val_loss = 2.75, .val_acc = attempt ? 0.5 : -1};
        dt_metrics_eval(m, &e);
        dt_metrics_close(m);
    }
    char path[1100], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    DT_REQUIRE_OK(dt_read_file(path, &text, &len, &err), &err);
    int lines = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        DT_REQUIRE(o);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        int attempt = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "attempt"));
        DT_CHECK_INT(attempt, lines / 2);
        DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step")), 10);
        DT_CHECK(cJSON_GetObjectItem(o, "time") != NULL);
        if (lines % 2 == 0) {
            DT_CHECK_STR(type, "train");
            DT_CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss")), 2.5, 1e-12);
            DT_CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "grad_norm")), 0.7, 1e-12);
            DT_CHECK(cJSON_GetObjectItem(o, attempt == 0 ? "tokens_per_s" : "samples_per_s"));
            DT_CHECK(cJSON_GetObjectItem(o, "step_time_s"));
            DT_CHECK(cJSON_GetObjectItem(o, "comm_time_s"));
            DT_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "max_rss_bytes")) > 0);
            cJSON *mp = cJSON_GetObjectItem(o, "mem_peak_bytes");
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "peak_mem_bytes")),
                         attempt ? 3000 : 1 << 20);
            DT_CHECK((mp != NULL) == (attempt == 1));
            if (mp) {
                DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(mp, "params")), 1000);
                DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(mp, "activations")), 2500);
                DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(mp, "grads")), 0);
                DT_CHECK(cJSON_GetObjectItem(mp, "optim") && cJSON_GetObjectItem(mp, "comm") &&
                         cJSON_GetObjectItem(mp, "other"));
            }
        } else {
            DT_CHECK_STR(type, "eval");
            DT_CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "val_loss")), 2.75, 1e-12);
            DT_CHECK((cJSON_GetObjectItem(o, "val_acc") != NULL) == (attempt == 1));
        }
        cJSON_Delete(o);
        lines++;
    }
    DT_CHECK_INT(lines, 4);
    free(text);
}

static void test_other_ranks_write_nothing(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/r1", dt_test_tmpdir());
    dt_metrics *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_metrics_open(&m, dir, false, true, 0, &err), &err);
    dt_step_record r = {.step = 1, .total_steps = 2};
    dt_metrics_step(m, &r);
    DT_CHECK_STR(dt_metrics_path(m), "");
    dt_metrics_close(m);
    DT_CHECK(access(dir, F_OK) != 0);
}

static void test_unwritable_dir(void)
{
    dt_metrics *m = NULL;
    dt_err err = {0};
    DT_CHECK(dt_metrics_open(&m, "/proc/version/x", true, true, 0, &err) < 0);
    DT_CHECK_CONTAINS(err.msg, "output_dir");
}

/* The loss of a record is a mean over the steps since the last record (job.log_every), not
 * the loss of the step it is logged at (which a checkpoint keeps): the log line and
 * metrics.jsonl say over how many steps. */
static void test_loss_is_a_window_mean(void)
{
    char dir[1024], errpath[1100];
    snprintf(dir, sizeof dir, "%s/win", dt_test_tmpdir());
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", dt_test_tmpdir());
    fflush(stderr);
    int saved = dup(2), fd = open(errpath, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    DT_REQUIRE(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
    close(fd);
    dt_metrics *m = NULL;
    dt_err err = {0};
    int rc = dt_metrics_open(&m, dir, true, true, 0, &err);
    dt_step_record r = {.step = 1, .total_steps = 300, .loss = 2.5, .loss_steps = 1,
                        .step_time_s = 0.01};
    if (!rc) {
        dt_metrics_step(m, &r);
        r.step = 300;
        r.loss = 2.3074;
        r.loss_steps = 10;
        dt_metrics_step(m, &r);
        dt_metrics_close(m);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    DT_REQUIRE_OK(rc, &err);
    char *log = NULL, *text = NULL, path[1100];
    size_t len;
    DT_REQUIRE_OK(dt_read_file(errpath, &log, &len, &err), &err);
    DT_CHECK_CONTAINS(log, "step 300/300 | loss 2.3074 (mean of 10 steps) |");
    DT_CHECK_CONTAINS(log, "step 1/300 | loss 2.5000 |");
    free(log);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    DT_REQUIRE_OK(dt_read_file(path, &text, &len, &err), &err);
    char *second = strchr(text, '\n');
    DT_REQUIRE(second);
    cJSON *o = cJSON_Parse(second + 1);
    DT_REQUIRE(o);
    DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss_steps")), 10);
    cJSON_Delete(o);
    free(text);
}

/* ---- a full disk: lost records are counted and reported, never called saved ---- */

/* output_dir/metrics.jsonl -> /dev/full: every append fails with ENOSPC. */
static const char *full_disk_dir(const char *name)
{
    static char dir[1024];
    char link[1100];
    snprintf(dir, sizeof dir, "%s/%s", dt_test_tmpdir(), name);
    snprintf(link, sizeof link, "%s/metrics.jsonl", dir);
    if (mkdir(dir, 0755) != 0 || symlink("/dev/full", link) != 0)
        DT_SKIP("cannot link metrics.jsonl to /dev/full");
    return dir;
}

static void test_full_disk_counts_lost(void)
{
    const char *dir = full_disk_dir("full");
    dt_metrics *m = NULL;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, true, 0, &err), &err);
    dt_step_record r = {.step = 1, .total_steps = 3, .loss = 2.5, .step_time_s = 0.01};
    for (int s = 1; s <= 3; s++) {
        r.step = s;
        dt_metrics_step(m, &r);
    }
    dt_eval_record e = {.step = 3, .val_loss = 2.75, .val_acc = -1};
    dt_metrics_eval(m, &e);
    DT_CHECK_INT(dt_metrics_lost(m), 4);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    DT_REQUIRE(out);
    dt_metrics_print_summary(m, out);
    fclose(out);
    DT_CHECK_MSG(!strstr(text, "metrics in"), "lost records reported as saved: %s", text);
    DT_CHECK_CONTAINS(text, "WARNING");
    DT_CHECK_CONTAINS(text, "4 of 4 metrics records were lost");
    DT_CHECK_CONTAINS(text, "No space left on device");
    DT_CHECK_CONTAINS(text, "/full/metrics.jsonl");
    free(text);
    dt_metrics_close(m);

    /* All saved: the usual line, nothing lost. */
    char ok[1100];
    snprintf(ok, sizeof ok, "%s/ok", dt_test_tmpdir());
    DT_REQUIRE_OK(dt_metrics_open(&m, ok, true, true, 0, &err), &err);
    dt_metrics_step(m, &r);
    DT_CHECK_INT(dt_metrics_lost(m), 0);
    out = open_memstream(&text, &len);
    dt_metrics_print_summary(m, out);
    fclose(out);
    DT_CHECK_CONTAINS(text, "dtrain: metrics in ");
    DT_CHECK_CONTAINS(text, "/ok/metrics.jsonl");
    DT_CHECK(!strstr(text, "lost"));
    free(text);
    dt_metrics_close(m);
}

/* The whole worker: the summary must not say "metrics in" for a file that holds nothing. */
static void test_worker_full_disk(void)
{
    const char *dir = full_disk_dir("wfull");
    char job[1100], cmd[4096];
    snprintf(job, sizeof job, "%s/job.ini", dt_test_tmpdir());
    DT_REQUIRE(dt_test_write_file(job, "[job]\nname = full\nseed = 1\ndevice = cpu\n"
                                       "log_every = 2\n\n[model]\ntype = mlp\nhidden = 16\n\n"
                                       "[data]\ntype = synthetic\nsynthetic_shape = vector\n"
                                       "synthetic_samples = 256\nsynthetic_dim = 8\n"
                                       "synthetic_classes = 4\nval_fraction = 0\n\n"
                                       "[train]\nbatch_size = 16\nsteps = 6\nthreads = 1\n\n"
                                       "[checkpoint]\nevery = 0\n") == 0);
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s 2>&1", dt_test_dtrain_bin(), job,
             dir);
    char *out = NULL;
    int code = dt_test_run(cmd, &out, 60);
    DT_REQUIRE(out);
    DT_CHECK_MSG(code == 0, "exit %d: %.3000s", code, out);
    DT_CHECK_MSG(!strstr(out, "metrics in"), "lost records reported as saved: %.3000s", out);
    /* the layout record and the train records of steps 1, 2, 4 and 6 */
    DT_CHECK_CONTAINS(out, "5 of 5 metrics records were lost");
    free(out);
}

/* ---- the progress line on a terminal ---- */

static void *log_from_thread(void *arg)
{
    (void)arg;
    DT_INFO("checkpoint: saved /x/step_2 (in the background)"); /* as the writer thread does */
    return NULL;
}

static void test_progress_line_tty(void)
{
    /* Under a pseudo-terminal: a log line (from another thread, as the checkpoint writer logs)
     * while the progress line is shown starts on a line of its own, and no empty line follows
     * when the run ends. */
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    DT_REQUIRE(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0);
    char slave[256];
    DT_REQUIRE(ptsname_r(master, slave, sizeof slave) == 0);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tty", dt_test_tmpdir());
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(slave, O_RDWR | O_NOCTTY);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(3);
        dt_metrics *m = NULL;
        if (dt_metrics_open(&m, dir, true, false, 0, NULL) != 0)
            _exit(4);
        dt_step_record r = {.step = 1, .total_steps = 3, .loss = 2.5, .step_time_s = 0.01};
        dt_metrics_step(m, &r);
        pthread_t t;
        pthread_create(&t, NULL, log_from_thread, NULL);
        pthread_join(t, NULL);
        r.step = 2;
        dt_metrics_step(m, &r);
        r.step = 3;
        dt_metrics_step(m, &r);
        dt_metrics_finish_line(m);
        DT_INFO("done");
        dt_metrics_close(m);
        _exit(0);
    }
    /* read until the child's end closes the terminal (EIO), 20 s at most */
    char out[8192];
    size_t len = 0;
    for (int i = 0; i < 200 && len < sizeof out - 1; i++) {
        struct pollfd p = {.fd = master, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0) {
            if (waitpid(pid, NULL, WNOHANG) == pid)
                pid = -1;
            if (pid < 0)
                break;
            continue;
        }
        ssize_t r = read(master, out + len, sizeof out - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    out[len] = '\0';
    if (pid > 0)
        waitpid(pid, NULL, 0);
    close(master);
    const char *ck = strstr(out, "checkpoint: saved");
    DT_REQUIRE(ck && strstr(out, "step 3/3"));
    const char *start = ck;
    while (start > out && strncmp(start, "dtrain[", 7))
        start--;
    DT_CHECK_MSG(start > out && start[-1] == '\n', "the log line is glued to the progress line: "
                 "%.300s", out);
    DT_CHECK_MSG(!strstr(out, "\n\r\n") && !strstr(out, "\n\n"), "an empty line: %.600s", out);
    DT_CHECK_MSG(strstr(out, "step 3/3") < strstr(out, "done") &&
                 strstr(strstr(out, "step 3/3"), "\n") < strstr(out, "done"),
                 "the last progress line was not ended: %.600s", out);
}

/* The layout record: once per open, just before the first train or eval record (an open that
 * records nothing leaves the file empty), with the grid's degrees; none when never set. */
static void test_layout_record(void)
{
    char dir[1024], path[1100], *text = NULL;
    snprintf(dir, sizeof dir, "%s/lay", dt_test_tmpdir());
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    dt_metrics *m = NULL;
    dt_err err = {0};
    dt_step_record r = {.step = 1, .total_steps = 3, .loss = 2.0};
    DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, true, 0, &err), &err);
    dt_metrics_layout(m, 8, 2, 2, 2);
    DT_REQUIRE_OK(dt_read_file(path, &text, NULL, &err), &err);
    DT_CHECK_STR(text, ""); /* nothing recorded yet */
    free(text);
    dt_metrics_step(m, &r);
    r.step = 2;
    dt_metrics_step(m, &r);
    dt_metrics_close(m);
    /* a second attempt on another world (an elastic job), and an open that sets none */
    DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, true, 1, &err), &err);
    dt_metrics_layout(m, 4, 1, 2, 2);
    dt_eval_record e = {.step = 2, .val_loss = 1.5, .val_acc = -1};
    dt_metrics_eval(m, &e);
    dt_metrics_close(m);
    DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, true, 2, &err), &err);
    dt_metrics_step(m, &r);
    dt_metrics_close(m);
    dt_metrics_layout(NULL, 1, 1, 1, 1); /* accepts NULL */
    DT_REQUIRE_OK(dt_read_file(path, &text, NULL, &err), &err);
    const char *want[] = {"layout", "train", "train", "layout", "eval", "train"};
    const int world[] = {8, 0, 0, 4, 0, 0}, dp[] = {2, 0, 0, 1, 0, 0};
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
        cJSON *o = cJSON_Parse(line);
        DT_REQUIRE(o && n < 6);
        DT_CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(o, "type")), want[n]);
        if (!strcmp(want[n], "layout")) {
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "world_size")), world[n]);
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "dp")), dp[n]);
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "tp")), 2);
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "pp")), 2);
            DT_CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(o, "attempt")), n ? 1 : 0);
            DT_CHECK(cJSON_GetObjectItem(o, "step") == NULL); /* not a step's record */
        }
        cJSON_Delete(o);
    }
    DT_CHECK_INT(n, 6);
    free(text);
}

/* docs/metrics.md's field table names every field the writer emits: each record type with every
 * optional field present (fp16's loss scale, the allocator's categories, val_acc, both rates). */
static void test_fields_documented(void)
{
    char dir[1024], path[1100], *text = NULL, *doc = NULL;
    snprintf(dir, sizeof dir, "%s/doc", dt_test_tmpdir());
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    dt_metrics *m = NULL;
    dt_err err = {0};
    for (int tokens = 0; tokens < 2; tokens++) {
        DT_REQUIRE_OK(dt_metrics_open(&m, dir, true, tokens, tokens, &err), &err);
        dt_metrics_layout(m, 8, 2, 2, 2);
        dt_step_record r = {.step = 1, .total_steps = 2, .loss = 2.0, .loss_steps = 1,
                            .loss_scale = 65536, .skipped_steps = 1, .items_per_s = 10,
                            .max_rss_bytes = 1};
        for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
            r.mem.peak[c] = 1;
        r.mem.total_peak = 6;
        dt_metrics_step(m, &r);
        dt_eval_record e = {.step = 1, .val_loss = 1.5, .val_acc = 0.5};
        dt_metrics_eval(m, &e);
        dt_metrics_close(m);
    }
    DT_REQUIRE_OK(dt_read_file(path, &text, NULL, &err), &err);
    DT_REQUIRE(dt_read_file("docs/metrics.md", &doc, NULL, NULL) == 0);
    int fields = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(line);
        DT_REQUIRE(o);
        for (cJSON *f = o->child; f; f = f->next) {
            DT_CHECK_MSG(strstr(doc, dt_test_fmt("`%s`", f->string)) != NULL,
                         "docs/metrics.md does not document metrics.jsonl's field %s", f->string);
            fields++;
            for (cJSON *g = cJSON_IsObject(f) ? f->child : NULL; g; g = g->next, fields++)
                DT_CHECK_MSG(strstr(doc, dt_test_fmt("`%s`", g->string)) != NULL,
                             "docs/metrics.md does not document %s.%s", f->string, g->string);
        }
        cJSON_Delete(o);
    }
    DT_CHECK(fields >= 30); /* layout 7, train 19 (+ 6 categories), eval 6, twice */
    free(text);
    free(doc);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"layout_record", test_layout_record, 0},
        {"fields_documented", test_fields_documented, 0},
        {"records", test_records, 0},
        {"other_ranks_write_nothing", test_other_ranks_write_nothing, 0},
        {"unwritable_dir", test_unwritable_dir, 0},
        {"loss_is_a_window_mean", test_loss_is_a_window_mean, 0},
        {"full_disk_counts_lost", test_full_disk_counts_lost, 0},
        {"worker_full_disk", test_worker_full_disk, 60},
        {"progress_line_tty", test_progress_line_tty, 30},
    };
    return dt_test_main("test_metrics", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
