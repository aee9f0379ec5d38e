/* metrics.c - metrics.jsonl, log lines and the progress line; see metrics.h. */
#include "runtime/train/obs/metrics.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/obs/flight.h"

struct dt_metrics {
    bool enabled;
    bool tokens;
    bool tty;          /* stderr is a terminal: progress line */
    int attempt;
    char run[32];      /* the run every record belongs to (dt_metrics_set_run); "" = none */
    int fd;            /* metrics.jsonl, O_APPEND; -1 when disabled */
    char path[DT_PATH_MAX + 32];
    double t0;
    int64_t records;   /* records handed to metrics.jsonl */
    int64_t lost;      /* of which: not written (a full disk, an I/O error) */
    int lost_errno;    /* why the last one was lost */
    int layout[4];     /* world, data, tensor, pipeline (dt_metrics_layout); [0] = 0: none */
    bool layout_written; /* the layout record went out, before this attempt's first record */
};

size_t dt_metrics_max_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

int dt_metrics_open(dt_metrics **out, const char *output_dir, bool enabled, bool tokens,
                    int attempt, dt_err *err)
{
    dt_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return dt_err_set(err, -ENOMEM, "out of memory");
    m->enabled = enabled;
    m->tokens = tokens;
    m->attempt = attempt;
    m->fd = -1;
    m->t0 = dt_now_s();
    if (enabled) {
        int rc = dt_mkdir_p(output_dir, err);
        if (rc) {
            free(m);
            return dt_err_prefix(err, "creating job.output_dir: ");
        }
        snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", output_dir);
        m->fd = open(m->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (m->fd < 0) {
            rc = dt_err_errno(err, errno, "cannot open %s", m->path);
            free(m);
            return rc;
        }
        m->tty = isatty(2) == 1;
    }
    *out = m;
    return 0;
}

/* Counts a record that did not reach the file; the first loss (and a change of reason) is
 * logged at once, the count at the end (dt_metrics_print_summary). */
static void lose(dt_metrics *m, int e)
{
    if (!m->lost || e != m->lost_errno)
        DT_WARN("cannot append to %s: %s; metrics are being lost (records that fail are "
                "counted and reported at the end of the run)", m->path, strerror(e));
    m->lost++;
    m->lost_errno = e;
}

/* Writes one JSON object as one line with one write(2) (lines never tear, even when a
 * restarted job and a slow old writer overlap). */
static void write_json(dt_metrics *m, cJSON *o);

/* The layout record, once per open, just before the first other record (not at open: a file
 * that is not empty says a step was recorded, and tests and scripts wait for that). */
static void write_layout(dt_metrics *m)
{
    if (m->layout_written || m->layout[0] <= 0)
        return;
    m->layout_written = true;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddStringToObject(o, "type", "layout");
    cJSON_AddNumberToObject(o, "world_size", m->layout[0]);
    cJSON_AddNumberToObject(o, "dp", m->layout[1]);
    cJSON_AddNumberToObject(o, "tp", m->layout[2]);
    cJSON_AddNumberToObject(o, "pp", m->layout[3]);
    write_json(m, o);
    cJSON_Delete(o);
}

void dt_metrics_layout(dt_metrics *m, int world, int dp, int tp, int pp)
{
    if (!m || !m->enabled)
        return;
    m->layout[0] = world;
    m->layout[1] = dp;
    m->layout[2] = tp;
    m->layout[3] = pp;
}

void dt_metrics_set_run(dt_metrics *m, const char *run)
{
    if (m)
        dt_strlcpy(m->run, run ? run : "", sizeof m->run);
}

static void write_json(dt_metrics *m, cJSON *o)
{
    write_layout(m);
    m->records++;
    cJSON_AddNumberToObject(o, "time", dt_wall_s());
    cJSON_AddNumberToObject(o, "attempt", m->attempt);
    if (m->run[0])
        cJSON_AddStringToObject(o, "run", m->run);
    char *text = cJSON_PrintUnformatted(o);
    char *line = NULL;
    size_t n = text ? strlen(text) : 0;
    if (!text || !(line = malloc(n + 2))) {
        lose(m, ENOMEM);
    } else {
        memcpy(line, text, n);
        line[n] = '\n';
        if (dt_write_all(m->fd, line, n + 1) != 0)
            lose(m, errno);
    }
    free(line);
    free(text);
}

/* 12345 -> "12.3k" */
static const char *human(double v, char *buf, size_t cap)
{
    if (v >= 1e9)
        snprintf(buf, cap, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        snprintf(buf, cap, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        snprintf(buf, cap, "%.1fk", v / 1e3);
    else
        snprintf(buf, cap, "%.0f", v);
    return buf;
}

static void clock_str(double s, char *buf, size_t cap)
{
    long t = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

void dt_metrics_step(dt_metrics *m, const dt_step_record *r)
{
    if (!m || !m->enabled)
        return;
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "type", "train");
        cJSON_AddNumberToObject(o, "step", (double)r->step);
        cJSON_AddNumberToObject(o, "epoch", (double)r->epoch);
        cJSON_AddNumberToObject(o, "loss", r->loss);
        if (r->loss_steps > 0)
            cJSON_AddNumberToObject(o, "loss_steps", (double)r->loss_steps);
        cJSON_AddNumberToObject(o, "lr", r->lr);
        cJSON_AddNumberToObject(o, "grad_norm", r->grad_norm);
        if (r->loss_scale > 0) {
            cJSON_AddNumberToObject(o, "loss_scale", r->loss_scale);
            cJSON_AddNumberToObject(o, "skipped_steps", (double)r->skipped_steps);
        }
        cJSON_AddNumberToObject(o, m->tokens ? "tokens_per_s" : "samples_per_s", r->items_per_s);
        cJSON_AddNumberToObject(o, "step_time_s", r->step_time_s);
        cJSON_AddNumberToObject(o, "comm_time_s", r->comm_time_s);
        if (r->comm_bytes >= 0)
            cJSON_AddNumberToObject(o, "comm_bytes", r->comm_bytes);
        cJSON_AddNumberToObject(o, "peak_mem_bytes",
                                (double)(r->mem.total_peak ? r->mem.total_peak
                                                           : r->peak_mem_bytes));
        if (r->mem.total_peak && r->peak_mem_bytes) /* the process's, set-up included */
            cJSON_AddNumberToObject(o, "run_peak_mem_bytes", (double)r->peak_mem_bytes);
        cJSON_AddNumberToObject(o, "max_rss_bytes", (double)r->max_rss_bytes);
        if (dt_flight_scoring()) { /* the ranks the agents flag now (runtime/train/obs/flight.h) */
            int st[DT_FLIGHTREC_STRAGGLERS];
            int ns = dt_flight_stragglers(st, DT_FLIGHTREC_STRAGGLERS);
            cJSON *sa = cJSON_AddArrayToObject(o, "stragglers");
            for (int i = 0; i < ns; i++)
                cJSON_AddItemToArray(sa, cJSON_CreateNumber(st[i]));
        }
        cJSON *mp = r->mem.total_peak ? cJSON_AddObjectToObject(o, "mem_peak_bytes") : NULL;
        static const dt_mem_cat order[] = {DT_MEM_PARAMS, DT_MEM_GRADS, DT_MEM_OPTIM,
                                           DT_MEM_ACTS,   DT_MEM_COMM,  DT_MEM_OTHER};
        for (size_t i = 0; mp && i < sizeof order / sizeof order[0]; i++)
            cJSON_AddNumberToObject(mp, dt_mem_cat_name(order[i]),
                                    (double)r->mem.peak[order[i]]);
        write_json(m, o);
        cJSON_Delete(o);
    }
    char thr[32], eta[32], el[32], loss[64];
    human(r->items_per_s, thr, sizeof thr);
    /* a mean over the window, not the loss of this step: say so (a checkpoint's is the step's) */
    if (r->loss_steps > 1)
        snprintf(loss, sizeof loss, "%.4f (mean of %lld steps)", r->loss,
                 (long long)r->loss_steps);
    else
        snprintf(loss, sizeof loss, "%.4f", r->loss);
    clock_str(r->step_time_s * (double)(r->total_steps - r->step), eta, sizeof eta);
    clock_str(dt_now_s() - m->t0, el, sizeof el);
    if (m->tty) { /* common/log ends it before any other log line */
        char line[256];
        snprintf(line, sizeof line,
                 "step %lld/%lld | loss %s | lr %.2e | norm %.2f | %s %s/s | %.1f ms/step | "
                 "%s elapsed, eta %s",
                 (long long)r->step, (long long)r->total_steps, loss, r->lr, r->grad_norm, thr,
                 m->tokens ? "tok" : "samples", r->step_time_s * 1e3, el, eta);
        dt_log_progress(line);
    } else {
        DT_INFO("step %lld/%lld | loss %s | lr %.2e | norm %.2f | %s %s/s | %.1f ms/step | "
                "eta %s",
                (long long)r->step, (long long)r->total_steps, loss, r->lr, r->grad_norm, thr,
                m->tokens ? "tok" : "samples", r->step_time_s * 1e3, eta);
    }
}

void dt_metrics_finish_line(dt_metrics *m)
{
    if (m && m->tty)
        dt_log_progress_end();
}

void dt_metrics_eval(dt_metrics *m, const dt_eval_record *r)
{
    if (!m || !m->enabled)
        return;
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "type", "eval");
        cJSON_AddNumberToObject(o, "step", (double)r->step);
        cJSON_AddNumberToObject(o, "val_loss", r->val_loss);
        if (r->val_acc >= 0)
            cJSON_AddNumberToObject(o, "val_acc", r->val_acc);
        write_json(m, o);
        cJSON_Delete(o);
    }
    dt_metrics_finish_line(m);
    if (r->val_acc >= 0)
        DT_INFO("eval at step %lld | val_loss %.4f | val_acc %.4f", (long long)r->step,
                r->val_loss, r->val_acc);
    else
        DT_INFO("eval at step %lld | val_loss %.4f", (long long)r->step, r->val_loss);
}

const char *dt_metrics_path(const dt_metrics *m) { return m && m->enabled ? m->path : ""; }

int64_t dt_metrics_lost(const dt_metrics *m) { return m ? m->lost : 0; }

void dt_metrics_print_summary(const dt_metrics *m, FILE *out)
{
    if (!m || !m->enabled)
        return;
    if (!m->lost) {
        fprintf(out, "dtrain: metrics in %s\n", m->path);
        return;
    }
    char msg[DT_PATH_MAX + 512];
    snprintf(msg, sizeof msg, "%lld of %lld metrics records were lost: they could not be "
             "appended to %s (last error: %s); that file is incomplete%s",
             (long long)m->lost, (long long)m->records, m->path, strerror(m->lost_errno),
             m->lost == m->records ? " (it holds none of this run's records)" : "");
    DT_WARN("%s", msg);
    fprintf(out, "dtrain: WARNING: %s\n", msg);
}

void dt_metrics_close(dt_metrics *m)
{
    if (!m)
        return;
    dt_metrics_finish_line(m);
    if (m->fd >= 0)
        close(m->fd);
    free(m);
}
