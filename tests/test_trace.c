/* test_trace.c - the timeline (runtime/train/obs/trace.h, train.trace): train.trace's values, the
 * recorder off (nothing recorded, nothing written), spans and tracks in valid Chrome-trace JSON
 * (parsed with cJSON), nesting per track, the step range, the cap on spans, the merge of the
 * ranks' files, a 2-rank DDP run through the dtrain binary (every rank's spans, the buckets'
 * all-reduces, clocks that line up across ranks), and scripts/trace-png.py's PNG. */
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/obs/trace.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* The fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt dt_test_fmt

static const char *repo_dir(void) { return dt_test_repo_dir("scripts/trace-png.py"); }

static cJSON *parse_file(const char *path)
{
    char *text = dt_test_slurp(path);
    DT_REQUIRE(text);
    cJSON *doc = cJSON_Parse(text);
    DT_CHECK_MSG(doc != NULL, "%s is not valid JSON near: %.80s", path,
                 cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
    free(text);
    DT_REQUIRE(doc);
    return doc;
}

static cJSON *events_of(cJSON *doc)
{
    cJSON *evs = cJSON_GetObjectItem(doc, "traceEvents");
    DT_REQUIRE(cJSON_IsArray(evs));
    return evs;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, key));
    return s ? s : "";
}

static double num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static double arg_of(const cJSON *e, const char *key)
{
    return num_of(cJSON_GetObjectItem(e, "args"), key);
}

/* "X" events named name (NULL: any) of pid (-1: any) [and step (-1: any)]. */
static int count_x(cJSON *evs, const char *name, int pid, int step)
{
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        if (strcmp(str_of(e, "ph"), "X") || (name && strcmp(str_of(e, "name"), name)) ||
            (pid >= 0 && num_of(e, "pid") != pid) || (step >= 0 && arg_of(e, "step") != step))
            continue;
        n++;
    }
    return n;
}

/* The name a "thread_name" metadata event gives (pid, tid), or NULL. */
static const char *track_name(cJSON *evs, int pid, int tid)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        if (!strcmp(str_of(e, "ph"), "M") && !strcmp(str_of(e, "name"), "thread_name") &&
            num_of(e, "pid") == pid && num_of(e, "tid") == tid)
            return str_of(cJSON_GetObjectItem(e, "args"), "name");
    }
    return NULL;
}

typedef struct span {
    int pid, tid;
    double ts, end;
} span;

static int by_track_start(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid - y->pid;
    if (x->tid != y->tid)
        return x->tid - y->tid;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->end > y->end ? -1 : x->end < y->end;
}

/* Every "X" event is well formed (ph, name, cat of the known ones, ts, dur >= 0, pid, tid, args
 * with a step), every track it uses is named, and on every track spans nest: each one lies
 * wholly inside the one open around it, or after it. 1 us of slack: ts is read as a double. */
static void check_events(cJSON *evs)
{
    int n = cJSON_GetArraySize(evs), k = 0;
    span *sp = calloc((size_t)n + 1, sizeof *sp);
    DT_REQUIRE(sp);
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str_of(e, "ph");
        DT_CHECK_MSG(!strcmp(ph, "X") || !strcmp(ph, "M"), "event phase \"%s\"", ph);
        DT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(e, "pid")));
        DT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(e, "tid")));
        if (strcmp(ph, "X"))
            continue;
        const char *cat = str_of(e, "cat");
        bool known = false;
        for (int c = 0; c < DT_TRACE_NCAT; c++)
            known |= !strcmp(cat, dt_trace_cat_name((dt_trace_cat)c));
        DT_CHECK_MSG(known, "span %s has category \"%s\"", str_of(e, "name"), cat);
        DT_CHECK(str_of(e, "name")[0] != '\0');
        double ts = num_of(e, "ts"), dur = num_of(e, "dur");
        DT_CHECK_MSG(ts > 0 && dur >= 0, "span %s: ts %f dur %f", str_of(e, "name"), ts, dur);
        DT_CHECK(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "step")));
        sp[k].pid = (int)num_of(e, "pid");
        sp[k].tid = (int)num_of(e, "tid");
        DT_CHECK_MSG(track_name(evs, sp[k].pid, sp[k].tid) != NULL,
                     "pid %d tid %d has no thread_name", sp[k].pid, sp[k].tid);
        sp[k].ts = ts;
        sp[k].end = ts + dur;
        k++;
    }
    qsort(sp, (size_t)k, sizeof *sp, by_track_start);
    double stack[64];
    int depth = 0;
    for (int i = 0; i < k; i++) {
        if (i == 0 || sp[i].pid != sp[i - 1].pid || sp[i].tid != sp[i - 1].tid)
            depth = 0;
        while (depth > 0 && stack[depth - 1] <= sp[i].ts + 1.0)
            depth--;
        if (depth > 0)
            DT_CHECK_MSG(sp[i].end <= stack[depth - 1] + 1.0,
                         "pid %d tid %d: span [%.3f, %.3f] overlaps the one around it (ending "
                         "%.3f) without nesting",
                         sp[i].pid, sp[i].tid, sp[i].ts, sp[i].end, stack[depth - 1]);
        if (depth < 64)
            stack[depth++] = sp[i].end;
    }
    free(sp);
}

static void open_trace(const char *dir, int rank, int world, int64_t first, int64_t last,
                       size_t max_events)
{
    dt_err err = {0};
    dt_trace_opts o = {.dir = dir, .rank = rank, .world_size = world, .first_step = first,
                       .last_step = last, .max_events = max_events};
    DT_REQUIRE_OK(dt_trace_open(&o, &err), &err);
}

static void busy_us(int us)
{
    uint64_t end = dt_trace_now() + (uint64_t)us * 1000;
    while (dt_trace_now() < end) {
    }
}

/* ---- train.trace ---------------------------------------------------------------------------- */

static void test_steps_key(void)
{
    int64_t a, b;
    DT_CHECK(dt_job_trace_steps("off", &a, &b) == 0 && a == 0 && b == 0);
    DT_CHECK(dt_job_trace_steps("false", &a, &b) == 0 && a == 0);
    DT_CHECK(dt_job_trace_steps("on", &a, &b) == 0 && a == 1 && b == INT64_MAX);
    DT_CHECK(dt_job_trace_steps("ALL", &a, &b) == 0 && a == 1 && b == INT64_MAX);
    DT_CHECK(dt_job_trace_steps("7", &a, &b) == 0 && a == 7 && b == 7);
    DT_CHECK(dt_job_trace_steps("1", &a, &b) == 0 && a == 1 && b == 1); /* a step, not "true" */
    DT_CHECK(dt_job_trace_steps("10-12", &a, &b) == 0 && a == 10 && b == 12);
    DT_CHECK(dt_job_trace_steps(" 10 - 12 ", &a, &b) == 0 && a == 10 && b == 12);
    DT_CHECK(dt_job_trace_steps("5-", &a, &b) == 0 && a == 5 && b == INT64_MAX);
    const char *bad[] = {"0", "-3", "12-10", "x", "3-x", "1-2-3", "", "0-4"};
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++)
        DT_CHECK_MSG(dt_job_trace_steps(bad[i], &a, &b) == -EINVAL, "\"%s\" accepted", bad[i]);

    /* the job file: the default is off, a bad value names the key and the forms */
    dt_job job;
    dt_config_errors errs;
    dt_err err = {0};
    const char *path = fmt("%s/job.ini", dt_test_tmpdir());
    DT_REQUIRE(dt_test_write_file(path, "[model]\ntype = mlp\n") == 0);
    memset(&errs, 0, sizeof errs);
    DT_REQUIRE_OK(dt_job_load(&job, path, NULL, 0, &errs, &err), &err);
    DT_CHECK_STR(job.trace, "off");
    char *ok[] = {"train.trace=3-5"};
    DT_REQUIRE_OK(dt_job_load(&job, path, ok, 1, &errs, &err), &err);
    DT_CHECK_STR(job.trace, "3-5");
    char *ov[] = {"train.trace=5-3"};
    memset(&errs, 0, sizeof errs);
    DT_CHECK(dt_job_load(&job, path, ov, 1, &errs, &err) == -EINVAL);
    DT_REQUIRE(errs.count >= 1);
    DT_CHECK_CONTAINS(errs.lines[0], "train.trace");
    DT_CHECK_CONTAINS(errs.lines[0], "A-B");
}

/* ---- the recorder ------------------------------------------------------------------------- */

/* Off: begin gives 0, the ends do nothing, nothing is allocated or counted, there is no file
 * to write; open but outside the step range likewise. */
static void test_off_records_nothing(void)
{
    DT_CHECK(!dt_trace_enabled());
    DT_CHECK_INT(dt_trace_begin(), 0);
    dt_trace_step(1);
    DT_CHECK_INT(dt_trace_begin(), 0);
    dt_trace_end(dt_trace_begin(), DT_TRACE_FORWARD, "forward");
    dt_trace_end_async(dt_trace_begin(), "ddp buckets", DT_TRACE_COMM, "all-reduce", "bucket", 0,
                       NULL, 0);
    dt_trace_thread_name("comm");
    DT_CHECK_INT(dt_trace_count(), 0);
    dt_err err = {0};
    DT_CHECK_INT(dt_trace_write(NULL, 0, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "train.trace");

    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    open_trace(dir, 0, 1, 5, 6, 0);
    DT_CHECK(dt_trace_enabled());
    DT_CHECK_INT(dt_trace_begin(), 0); /* before the first step */
    dt_trace_step(4);
    uint64_t t = dt_trace_begin();
    DT_CHECK_INT(t, 0);
    dt_trace_end(t, DT_TRACE_STEP, "step");
    dt_trace_step(7);
    DT_CHECK_INT(dt_trace_begin(), 0);
    DT_CHECK_INT(dt_trace_count(), 0);
    dt_trace_close();
    DT_CHECK(!dt_trace_enabled());

    /* a second trace in the same process can open: one at a time */
    open_trace(dir, 0, 1, 1, 1, 0);
    dt_trace_opts o = {.dir = dir, .rank = 0, .world_size = 1, .first_step = 1, .last_step = 1};
    DT_CHECK_INT(dt_trace_open(&o, &err), -EBUSY);
    dt_trace_close();
    o.first_step = 0;
    DT_CHECK_INT(dt_trace_open(&o, &err), -EINVAL);
}

typedef struct comm_arg {
    int spans;
} comm_arg;

/* A second thread records on its own named track while the main one records on "main". */
static void *comm_thread(void *p)
{
    comm_arg *a = p;
    dt_trace_thread_name("comm \"thread\"");
    for (int i = 0; i < a->spans; i++) {
        uint64_t t = dt_trace_begin();
        busy_us(50);
        dt_trace_end_arg(t, DT_TRACE_COMM, "send", "bytes", 1024 * (i + 1));
    }
    return NULL;
}

static void test_spans_json(void)
{
    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    open_trace(dir, 3, 4, 2, 3, 0);
    pthread_t th;
    comm_arg ca = {.spans = 20};
    for (int64_t step = 1; step <= 4; step++) {
        dt_trace_step(step);
        uint64_t ts = dt_trace_begin();
        if (step == 2)
            DT_REQUIRE(pthread_create(&th, NULL, comm_thread, &ca) == 0);
        for (int mb = 0; mb < 2; mb++) {
            uint64_t t = dt_trace_begin();
            busy_us(100);
            dt_trace_end_arg(t, DT_TRACE_FORWARD, "forward", "mb", mb);
            /* three buckets in flight at once: their spans overlap */
            uint64_t b0 = dt_trace_begin();
            t = dt_trace_begin();
            busy_us(50);
            uint64_t b1 = dt_trace_begin();
            busy_us(50);
            uint64_t b2 = dt_trace_begin();
            busy_us(50);
            dt_trace_end(t, DT_TRACE_BACKWARD, "backward");
            dt_trace_end_async(b0, "ddp buckets", DT_TRACE_COMM, "all-reduce", "bucket", 0,
                               "bytes", 4096);
            dt_trace_end_async(b1, "ddp buckets", DT_TRACE_COMM, "all-reduce", "bucket", 1,
                               "bytes", 8192);
            busy_us(20);
            dt_trace_end_async(b2, "ddp buckets", DT_TRACE_COMM, "all-reduce", "bucket", 2,
                               NULL, 0);
        }
        dt_trace_span sp = {.t0 = dt_trace_begin(), .cat = DT_TRACE_OPTIM, .name = "optimizer"};
        busy_us(30);
        sp.t1 = dt_trace_now();
        dt_trace_add(&sp);
        dt_trace_end(ts, DT_TRACE_STEP, "step");
        if (step == 2)
            pthread_join(th, NULL);
    }
    /* steps 2 and 3: 1 step + 2 x (forward, backward, 3 buckets) + optimizer = 12 each, and
     * the other thread's 20 sends (recorded during step 2) */
    DT_CHECK_INT(dt_trace_count(), 2 * 12 + 20);
    DT_CHECK_INT(dt_trace_dropped(), 0);
    char path[PATH_MAX];
    dt_err err = {0};
    DT_REQUIRE_OK(dt_trace_write(path, sizeof path, &err), &err);
    dt_trace_close();
    DT_CHECK_STR(path, fmt("%s/rank3.json", dir));
    DT_CHECK(access(fmt("%s.tmp.%d", path, (int)getpid()), F_OK) != 0);

    cJSON *doc = parse_file(path);
    cJSON *evs = events_of(doc);
    check_events(evs);
    DT_CHECK_INT(count_x(evs, NULL, 3, -1), 44);
    DT_CHECK_INT(count_x(evs, NULL, -1, 1) + count_x(evs, NULL, -1, 4), 0);
    DT_CHECK_INT(count_x(evs, "step", 3, 2), 1);
    DT_CHECK_INT(count_x(evs, "forward", 3, 3), 2);
    DT_CHECK_INT(count_x(evs, "backward", 3, 3), 2);
    DT_CHECK_INT(count_x(evs, "all-reduce", 3, 2), 6);
    DT_CHECK_INT(count_x(evs, "optimizer", 3, -1), 2);
    DT_CHECK_INT(count_x(evs, "send", 3, 2), 20);
    /* the process is "rank 3"; tracks: main, the thread's name (escaped), bucket lanes */
    bool named = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        if (!strcmp(str_of(e, "name"), "process_name"))
            named = !strcmp(str_of(cJSON_GetObjectItem(e, "args"), "name"), "rank 3") &&
                    num_of(e, "pid") == 3;
    }
    DT_CHECK(named);
    int main_tid = -1, comm_tid = -1, lanes = 0;
    double main_step_ts = -1;
    cJSON_ArrayForEach(e, evs)
    {
        if (strcmp(str_of(e, "ph"), "X"))
            continue;
        int tid = (int)num_of(e, "tid");
        const char *tn = track_name(evs, 3, tid);
        DT_REQUIRE(tn);
        if (!strcmp(str_of(e, "name"), "step")) {
            DT_CHECK_STR(tn, "main");
            main_tid = tid;
            if (main_step_ts < 0)
                main_step_ts = num_of(e, "ts");
        } else if (!strcmp(str_of(e, "name"), "send")) {
            DT_CHECK_STR(tn, "comm \"thread\"");
            comm_tid = tid;
            DT_CHECK(arg_of(e, "bytes") >= 1024);
        } else if (!strcmp(str_of(e, "name"), "all-reduce")) {
            DT_CHECK_MSG(!strncmp(tn, "ddp buckets", 11), "bucket on track %s", tn);
            DT_CHECK(arg_of(e, "bucket") >= 0);
            int lane = tn[11] == '\0' ? 1 : atoi(tn + 13);
            if (lane > lanes)
                lanes = lane;
        } else if (!strcmp(str_of(e, "name"), "forward")) {
            DT_CHECK_INT(tid, main_tid);
            DT_CHECK(arg_of(e, "mb") == 0 || arg_of(e, "mb") == 1);
        }
    }
    DT_CHECK(main_tid > 0 && comm_tid > 0 && comm_tid != main_tid);
    DT_CHECK_INT(lanes, 3); /* three buckets in flight together: three lanes, no more */
    /* microseconds since the epoch: within a day of now */
    DT_CHECK_NEAR(main_step_ts / 1e6, dt_wall_s(), 86400);
    cJSON *other = cJSON_GetObjectItem(doc, "otherData");
    DT_CHECK_INT(num_of(other, "rank"), 3);
    DT_CHECK_INT(num_of(other, "dropped"), 0);
    DT_CHECK_CONTAINS(str_of(other, "clock"), "CLOCK_MONOTONIC");
    cJSON_Delete(doc);
}

/* Past max_events spans are dropped, counted, and warned about once. */
static void test_cap(void)
{
    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    const char *log = fmt("%s/stderr.txt", dt_test_tmpdir());
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    DT_REQUIRE(fd >= 0);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
    open_trace(dir, 0, 1, 1, INT64_MAX, 10);
    for (int64_t step = 1; step <= 5; step++) {
        dt_trace_step(step);
        for (int i = 0; i < 5; i++)
            dt_trace_end_arg(dt_trace_begin(), DT_TRACE_DATA, "data", "i", i);
    }
    DT_CHECK_INT(dt_trace_count(), 10);
    DT_CHECK_INT(dt_trace_dropped(), 15);
    dt_err err = {0};
    char path[PATH_MAX];
    DT_REQUIRE_OK(dt_trace_write(path, sizeof path, &err), &err);
    dt_trace_close();
    dup2(saved, STDERR_FILENO);
    close(saved);
    DT_CHECK_INT(dt_test_count_text(log, "the cap"), 1);
    DT_CHECK_INT(dt_test_count_text(log, "train.trace"), 1);
    cJSON *doc = parse_file(path);
    cJSON *evs = events_of(doc);
    check_events(evs);
    DT_CHECK_INT(count_x(evs, "data", 0, -1), 10);
    DT_CHECK_INT(count_x(evs, "data", 0, 3), 0); /* the first ten are kept: steps 1 and 2 */
    cJSON *other = cJSON_GetObjectItem(doc, "otherData");
    DT_CHECK_INT(num_of(other, "dropped"), 15);
    DT_CHECK_INT(num_of(other, "max_events"), 10);
    cJSON_Delete(doc);
}

/* An open trace with no span still writes valid JSON (its metadata). */
static void test_empty_trace(void)
{
    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    open_trace(dir, 1, 2, 100, 200, 0);
    dt_trace_step(1);
    dt_err err = {0};
    char path[PATH_MAX];
    DT_REQUIRE_OK(dt_trace_write(path, sizeof path, &err), &err);
    dt_trace_close();
    cJSON *doc = parse_file(path);
    cJSON *evs = events_of(doc);
    DT_CHECK_INT(count_x(evs, NULL, -1, -1), 0);
    DT_CHECK_STR(track_name(evs, 1, 1), "main");
    cJSON_Delete(doc);
}

/* Two ranks' files make one trace with a process each; a missing rank is skipped; a file that
 * is not a dtrain trace is an error. */
static void test_merge(void)
{
    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    for (int r = 0; r < 2; r++) {
        open_trace(dir, r, 3, 1, 1, 0);
        dt_trace_step(1);
        uint64_t ts = dt_trace_begin();
        dt_trace_end(dt_trace_begin(), DT_TRACE_FORWARD, "forward");
        dt_trace_end_async(dt_trace_begin(), "ddp buckets", DT_TRACE_COMM, "all-reduce",
                           "bucket", 0, NULL, 0);
        dt_trace_end(ts, DT_TRACE_STEP, "step");
        dt_err err = {0};
        DT_REQUIRE_OK(dt_trace_write(NULL, 0, &err), &err);
        dt_trace_close();
    }
    const char *out = fmt("%s/trace.json", dir);
    int found = -1;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_trace_merge(dir, 3, out, &found, &err), &err);
    DT_CHECK_INT(found, 2);
    cJSON *doc = parse_file(out);
    cJSON *evs = events_of(doc);
    check_events(evs);
    for (int r = 0; r < 2; r++) {
        DT_CHECK_INT(count_x(evs, "step", r, 1), 1);
        DT_CHECK_INT(count_x(evs, "forward", r, 1), 1);
        DT_CHECK_INT(count_x(evs, "all-reduce", r, 1), 1);
        DT_CHECK_STR(track_name(evs, r, 1), "main");
    }
    DT_CHECK_INT(num_of(cJSON_GetObjectItem(doc, "otherData"), "ranks_found"), 2);
    cJSON_Delete(doc);

    DT_REQUIRE(dt_test_write_file(fmt("%s/rank2.json", dir), "{\"traceEvents\":[]}\n") == 0);
    DT_CHECK_INT(dt_trace_merge(dir, 3, out, &found, &err), -EPROTO);
    DT_CHECK_CONTAINS(err.msg, "rank2.json");
    const char *none = fmt("%s/none", dt_test_tmpdir());
    DT_REQUIRE(mkdir(none, 0755) == 0);
    DT_CHECK_INT(dt_trace_merge(none, 2, fmt("%s/t.json", none), &found, &err), -ENOENT);
}

/* ---- the dtrain binary ---------------------------------------------------------------------- */

/* A small mlp job on 2 workers (DDP over the cpu backend), 4 steps; more: extra settings. */
static int run_ddp(const char *out, const char *more, char **log)
{
    const char *cmd = fmt(
        "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
        "-u DTRAIN_STORE_ADDR -u DTRAIN_STORE_PORT -u DTRAIN_OUTPUT_DIR '%s' --standalone "
        "--max-restarts=0 --nproc-per-node=2 '%s/configs/mlp.ini' job.device=cpu "
        "model.hidden=64,64 data.synthetic_samples=1024 train.steps=4 train.eval_every=2 "
        "train.eval_batches=1 checkpoint.every=0 ddp.bucket_cap_mb=0.01 ddp.first_bucket_mb=0.005 "
        "job.output_dir='%s' %s",
        dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), out, more);
    return dt_test_run(cmd, log, 240);
}

static void test_ddp_run_traced(void)
{
    const char *out = fmt("%s/run", dt_test_tmpdir());
    char *log = NULL;
    int rc = run_ddp(out, "train.trace=2-3", &log);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    DT_CHECK_CONTAINS(log, "trace in");
    free(log);
    DT_REQUIRE(rc == 0);
    for (int r = 0; r < 2; r++)
        DT_CHECK_MSG(access(fmt("%s/trace/rank%d.json", out, r), F_OK) == 0, "no rank%d.json", r);
    cJSON *doc = parse_file(fmt("%s/trace/trace.json", out));
    cJSON *evs = events_of(doc);
    check_events(evs);
    for (int r = 0; r < 2; r++) {
        for (int step = 2; step <= 3; step++) {
            DT_CHECK_INT(count_x(evs, "step", r, step), 1);
            DT_CHECK_INT(count_x(evs, "forward", r, step), 1);
            DT_CHECK_INT(count_x(evs, "backward", r, step), 1);
            DT_CHECK_INT(count_x(evs, "data", r, step), 1);
            DT_CHECK_INT(count_x(evs, "gradient sync", r, step), 1);
            DT_CHECK_INT(count_x(evs, "optimizer", r, step), 1);
            /* several buckets (bucket_cap_mb is tiny), each one all-reduced once a step */
            DT_CHECK_MSG(count_x(evs, "all-reduce", r, step) >= 2, "rank %d step %d: %d "
                         "bucket all-reduces", r, step, count_x(evs, "all-reduce", r, step));
        }
        DT_CHECK_INT(count_x(evs, "step", r, 1) + count_x(evs, "step", r, 4), 0);
        DT_CHECK_INT(count_x(evs, "eval", r, 2), 1); /* eval_every = 2: after step 2 */
    }
    /* the clocks line up: a step ends on every rank only after every rank joined its
     * all-reduces, so rank 0's and rank 1's spans of one step overlap in time */
    for (int step = 2; step <= 3; step++) {
        double ts[2] = {0}, end[2] = {0};
        const cJSON *e;
        cJSON_ArrayForEach(e, evs)
        {
            if (strcmp(str_of(e, "name"), "step") || arg_of(e, "step") != step)
                continue;
            int r = (int)num_of(e, "pid");
            ts[r] = num_of(e, "ts");
            end[r] = ts[r] + num_of(e, "dur");
        }
        DT_CHECK_MSG(ts[0] <= end[1] && ts[1] <= end[0],
                     "step %d: rank 0 [%.0f, %.0f] and rank 1 [%.0f, %.0f] do not overlap", step,
                     ts[0], end[0], ts[1], end[1]);
    }
    cJSON_Delete(doc);
}

/* ZeRO-2's reducer traces reduce-scatters and all-gathers; DP's replica threads trace their
 * forward and backward on tracks of their own. */
static void test_zero_and_dp_traced(void)
{
    const char *out = fmt("%s/zero", dt_test_tmpdir());
    char *log = NULL;
    int rc = run_ddp(out, "parallel.zero=2 train.trace=3", &log);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    free(log);
    DT_REQUIRE(rc == 0);
    cJSON *doc = parse_file(fmt("%s/trace/trace.json", out));
    cJSON *evs = events_of(doc);
    check_events(evs);
    for (int r = 0; r < 2; r++) {
        DT_CHECK_INT(count_x(evs, "step", r, -1), 1);
        DT_CHECK_INT(count_x(evs, "all-reduce", r, -1), 0);
        DT_CHECK(count_x(evs, "reduce-scatter", r, 3) >= 2);
        DT_CHECK(count_x(evs, "all-gather", r, 3) >= 2);
    }
    cJSON_Delete(doc);

    out = fmt("%s/dp", dt_test_tmpdir());
    const char *cmd = fmt(
        "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
        "-u DTRAIN_OUTPUT_DIR '%s' worker '%s/configs/mlp.ini' job.device=cpu job.strategy=dp "
        "job.dp_replicas=2 model.hidden=64,64 data.synthetic_samples=1024 train.steps=3 "
        "train.eval_every=0 train.eval_batches=1 checkpoint.every=0 train.trace=2-3 "
        "job.output_dir='%s'",
        dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), out);
    rc = dt_test_run(cmd, &log, 240);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    free(log);
    DT_REQUIRE(rc == 0);
    doc = parse_file(fmt("%s/trace/trace.json", out));
    evs = events_of(doc);
    check_events(evs);
    int replica1 = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        if (!strcmp(str_of(e, "ph"), "X") && !strcmp(str_of(e, "name"), "backward") &&
            arg_of(e, "replica") == 1) {
            DT_CHECK_STR(track_name(evs, 0, (int)num_of(e, "tid")), "replica 1");
            replica1++;
        }
    }
    DT_CHECK_INT(replica1, 2);
    DT_CHECK_INT(count_x(evs, "step", 0, -1), 2);
    cJSON_Delete(doc);
}

/* A resumed run that no longer trains the traced steps leaves the trace of the run that did;
 * a range past the end is a warning that names the steps to choose, and writes nothing. */
static void test_resume_keeps_trace(void)
{
    const char *out = fmt("%s/run", dt_test_tmpdir());
    const char *base = fmt(
        "cd '%s' && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE "
        "-u DTRAIN_OUTPUT_DIR '%s' worker '%s/configs/mlp.ini' job.device=cpu model.hidden=32 "
        "data.synthetic_samples=512 train.eval_every=0 train.eval_batches=1 job.output_dir='%s'",
        dt_test_tmpdir(), dt_test_dtrain_bin(), repo_dir(), out);
    char *log = NULL;
    int rc = dt_test_run(fmt("%s train.steps=3 train.trace=2-3", base), &log, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    free(log);
    const char *rank0 = fmt("%s/trace/rank0.json", out);
    char *before = dt_test_slurp(rank0);
    DT_REQUIRE(before);
    rc = dt_test_run(fmt("%s train.steps=5 train.trace=2-3", base), &log, 120);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    DT_CHECK_CONTAINS(log, "trains steps 4 to 5, so nothing is traced");
    DT_CHECK_CONTAINS(log, "train.trace = 4-5");
    free(log);
    char *after = dt_test_slurp(rank0);
    DT_CHECK(after && !strcmp(before, after));
    free(before);
    free(after);

    const char *out2 = fmt("%s/past", dt_test_tmpdir());
    rc = dt_test_run(fmt("%s train.steps=2 train.trace=5-6 job.output_dir='%s'", base, out2), &log,
                     120);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    DT_CHECK_CONTAINS(log, "nothing is traced");
    free(log);
    DT_CHECK(access(fmt("%s/metrics.jsonl", out2), F_OK) == 0);
    DT_CHECK(access(fmt("%s/trace", out2), F_OK) != 0);
}

static void test_ddp_run_untraced(void)
{
    const char *out = fmt("%s/run", dt_test_tmpdir());
    char *log = NULL;
    int rc = run_ddp(out, "", &log);
    DT_CHECK_MSG(rc == 0, "exit %d: %.3000s", rc, log ? log : "");
    DT_CHECK(log && !strstr(log, "trace"));
    free(log);
    DT_CHECK(access(fmt("%s/metrics.jsonl", out), F_OK) == 0);
    DT_CHECK_MSG(access(fmt("%s/trace", out), F_OK) != 0, "train.trace is off, yet %s/trace "
                 "exists", out);
}

/* ---- scripts/trace-png.py --------------------------------------------------------------------- */

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_png_script(void)
{
    char *out = NULL;
    if (dt_test_run("command -v python3", &out, 10) != 0) {
        free(out);
        DT_SKIP("python3 not found: scripts/trace-png.py not run");
    }
    free(out);
    const char *dir = fmt("%s/trace", dt_test_tmpdir());
    for (int r = 0; r < 2; r++) {
        open_trace(dir, r, 2, 1, 2, 0);
        for (int64_t step = 1; step <= 2; step++) {
            dt_trace_step(step);
            uint64_t ts = dt_trace_begin();
            uint64_t t = dt_trace_begin();
            busy_us(200);
            dt_trace_end(t, DT_TRACE_FORWARD, "forward");
            uint64_t b = dt_trace_begin();
            t = dt_trace_begin();
            busy_us(300);
            dt_trace_end(t, DT_TRACE_BACKWARD, "backward");
            dt_trace_end_async(b, "ddp buckets", DT_TRACE_COMM, "all-reduce", "bucket", 0, NULL,
                               0);
            dt_trace_end(ts, DT_TRACE_STEP, "step");
        }
        dt_err err = {0};
        DT_REQUIRE_OK(dt_trace_write(NULL, 0, &err), &err);
        dt_trace_close();
    }
    const char *png = fmt("%s/t.png", dt_test_tmpdir());
    /* a directory of rank files (no trace.json): the script merges them itself */
    int rc = dt_test_run(fmt("python3 '%s/scripts/trace-png.py' '%s' -o '%s' --width 640 "
                             "--merge '%s/merged.json'",
                             repo_dir(), dir, png, dt_test_tmpdir()),
                         &out, 60);
    DT_CHECK_MSG(rc == 0, "trace-png.py: exit %d: %s", rc, out ? out : "");
    DT_CHECK_CONTAINS(out, "640x");
    DT_CHECK_CONTAINS(out, "4 tracks"); /* each rank: main, and one bucket lane */
    free(out);
    char *text = NULL;
    size_t len = 0;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_read_file(png, &text, &len, &err), &err);
    const unsigned char *p = (const unsigned char *)text;
    DT_REQUIRE(len > 8 + 25 + 12);
    DT_CHECK(!memcmp(p, "\x89PNG\r\n\x1a\n", 8));
    DT_CHECK_INT(be32(p + 8), 13);
    DT_CHECK(!memcmp(p + 12, "IHDR", 4));
    uint32_t w = be32(p + 16), h = be32(p + 20);
    DT_CHECK_INT(w, 640);
    DT_CHECK_MSG(h >= 60 && h <= 2000, "height %u", h);
    DT_CHECK_INT(p[24], 8); /* bit depth */
    DT_CHECK_INT(p[25], 2); /* RGB */
    DT_CHECK_INT(be32(p + 29), crc32_of(p + 12, 17));
    DT_CHECK(!memcmp(p + len - 8, "IEND", 4));
    free(text);
    cJSON *doc = parse_file(fmt("%s/merged.json", dt_test_tmpdir()));
    DT_CHECK_INT(count_x(events_of(doc), "step", -1, -1), 4);
    cJSON_Delete(doc);

    /* not a trace: a clear error, exit 2 */
    DT_REQUIRE(dt_test_write_file(fmt("%s/bad.json", dt_test_tmpdir()), "[1, 2") == 0);
    rc = dt_test_run(fmt("python3 '%s/scripts/trace-png.py' '%s/bad.json' -o '%s/bad.png'",
                         repo_dir(), dt_test_tmpdir(), dt_test_tmpdir()),
                     &out, 60);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "bad.json");
    free(out);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"steps_key", test_steps_key, 0},
        {"off_records_nothing", test_off_records_nothing, 0},
        {"spans_json", test_spans_json, 0},
        {"cap", test_cap, 0},
        {"empty_trace", test_empty_trace, 0},
        {"merge", test_merge, 0},
        {"ddp_run_traced", test_ddp_run_traced, 240},
        {"zero_and_dp_traced", test_zero_and_dp_traced, 240},
        {"resume_keeps_trace", test_resume_keeps_trace, 240},
        {"ddp_run_untraced", test_ddp_run_untraced, 240},
        {"png_script", test_png_script, 60},
    };
    return dt_test_main("test_trace", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
