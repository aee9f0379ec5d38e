/* agent_report.c - see agent_report.h. */
#include "runtime/launch/agent_report.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/job/workenv.h"

/* ---- events.jsonl ----------------------------------------------------------------------- */

void dt_events_init(dt_events *ev, int node)
{
    ev->fd = -1;
    ev->node = node;
    ev->pending = cJSON_CreateArray();
}

static void write_event(dt_events *ev, cJSON *obj)
{
    char *text = cJSON_PrintUnformatted(obj);
    if (!text)
        return;
    size_t len = strlen(text);
    char *line = malloc(len + 2);
    if (line) {
        memcpy(line, text, len);
        line[len] = '\n';
        int rc = dt_write_all(ev->fd, line, len + 1);
        if (rc)
            DT_WARN("cannot write events.jsonl: %s", strerror(-rc));
        free(line);
    }
    free(text);
}

void dt_events_filename(char *out, size_t cap, int group_rank, bool elastic, int round,
                        const char *host, int pid)
{
    if (group_rank == 0 && (!elastic || round == 0))
        snprintf(out, cap, "events.jsonl");
    else if (!elastic)
        snprintf(out, cap, "events_node%d.jsonl", group_rank);
    else
        snprintf(out, cap, "events_node%d_%s_%d.jsonl", group_rank, host, pid);
}

int dt_events_open(dt_events *ev, const char *path, dt_err *err)
{
    if (ev->fd >= 0)
        return 0;
    ev->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (ev->fd < 0)
        return dt_err_errno(err, errno, "cannot open %s", path);
    cJSON *e;
    cJSON_ArrayForEach(e, ev->pending) write_event(ev, e);
    cJSON_Delete(ev->pending);
    ev->pending = NULL;
    return 0;
}

/* Emits one event. fields (may be NULL) is taken over: its members are added after "time",
 * "node" and "event". */
static void emit(dt_events *ev, const char *event, cJSON *fields)
{
    cJSON *obj = cJSON_CreateObject();
    if (!obj) {
        cJSON_Delete(fields);
        return;
    }
    cJSON_AddNumberToObject(obj, "time", (double)(int64_t)(dt_wall_s() * 1000) / 1000.0);
    cJSON_AddNumberToObject(obj, "node", ev->node);
    cJSON_AddStringToObject(obj, "event", event);
    if (fields) {
        while (fields->child) {
            cJSON *item = cJSON_DetachItemViaPointer(fields, fields->child);
            cJSON_AddItemToObject(obj, item->string, item);
        }
        cJSON_Delete(fields);
    }
    if (ev->fd >= 0) {
        write_event(ev, obj);
        cJSON_Delete(obj);
    } else if (ev->pending && cJSON_GetArraySize(ev->pending) < 10000) {
        cJSON_AddItemToArray(ev->pending, obj);
    } else {
        cJSON_Delete(obj);
    }
}

void dt_events_close(dt_events *ev)
{
    if (ev->fd >= 0)
        close(ev->fd);
    ev->fd = -1;
    cJSON_Delete(ev->pending);
    ev->pending = NULL;
}

/* ---- signals and statuses --------------------------------------------------------------- */

const char *dt_report_signame(int sig, char *buf, size_t cap)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, cap, "SIG%s", abbrev);
    else
        snprintf(buf, cap, "SIG%d", sig);
    return buf;
}

void dt_report_describe_status(int exit_code, int sig, char *buf, size_t cap)
{
    char name[32];
    if (!sig && exit_code == DT_REPORT_HANG_CULPRIT) {
        snprintf(buf, cap, "was named by the hang verdict");
        return;
    }
    if (sig) {
        const char *d = sigdescr_np(sig);
        snprintf(buf, cap, "killed by %s (%s)", dt_report_signame(sig, name, sizeof name),
                 d ? d : "unknown signal");
    } else {
        snprintf(buf, cap, "exited with code %d", exit_code);
    }
}

/* ---- the events ------------------------------------------------------------------------ */

/* A duration rounded to the millisecond. */
static double ms_round(double s)
{
    return (double)(int64_t)(s * 1000) / 1000.0;
}

void dt_report_agent_start(dt_events *ev, int pid, const char *host, int nproc,
                           const char *program)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "pid", pid);
    cJSON_AddStringToObject(f, "host", host);
    cJSON_AddNumberToObject(f, "nproc", nproc);
    cJSON_AddStringToObject(f, "program", program);
    emit(ev, "agent_start", f);
}

void dt_report_round_start(dt_events *ev, const dt_rdzv_round *r, double took_s)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "round", r->round);
    cJSON_AddNumberToObject(f, "attempt", r->attempt);
    cJSON_AddNumberToObject(f, "group_rank", r->group_rank);
    cJSON_AddNumberToObject(f, "group_world_size", r->group_world_size);
    cJSON_AddNumberToObject(f, "rank_base", r->rank_base);
    cJSON_AddNumberToObject(f, "local_world_size", r->local_world_size);
    cJSON_AddNumberToObject(f, "world_size", r->world_size);
    cJSON_AddStringToObject(f, "master_addr", r->master_addr);
    cJSON_AddNumberToObject(f, "master_port", r->master_port);
    cJSON_AddStringToObject(f, "run_id", r->run_id);
    cJSON_AddNumberToObject(f, "duration_s", ms_round(took_s));
    emit(ev, "rendezvous", f);
}

void dt_report_worker_start(dt_events *ev, int rank, int local_rank, int pid, int attempt)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddNumberToObject(f, "local_rank", local_rank);
    cJSON_AddNumberToObject(f, "pid", pid);
    cJSON_AddNumberToObject(f, "attempt", attempt);
    emit(ev, "start", f);
}

void dt_report_worker_paused(dt_events *ev, int rank, int pid, int stop_sig)
{
    char sn[32];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddNumberToObject(f, "pid", pid);
    if (stop_sig)
        cJSON_AddStringToObject(f, "signal", dt_report_signame(stop_sig, sn, sizeof sn));
    emit(ev, stop_sig ? "stopped" : "continued", f);
}

void dt_report_worker_exit(dt_events *ev, int rank, int local_rank, int pid, int attempt,
                           int status, const char *state, double duration_s)
{
    char name[32];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddNumberToObject(f, "local_rank", local_rank);
    cJSON_AddNumberToObject(f, "pid", pid);
    cJSON_AddNumberToObject(f, "attempt", attempt);
    if (WIFSIGNALED(status)) {
        cJSON_AddNumberToObject(f, "exit_code", -WTERMSIG(status));
        cJSON_AddStringToObject(f, "signal",
                                dt_report_signame(WTERMSIG(status), name, sizeof name));
    } else {
        cJSON_AddNumberToObject(f, "exit_code", WEXITSTATUS(status));
    }
    cJSON_AddStringToObject(f, "state", state);
    cJSON_AddNumberToObject(f, "duration_s", ms_round(duration_s));
    emit(ev, "exit", f);
}

void dt_report_signal(dt_events *ev, int sig, const char *action)
{
    char name[32];
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "signal", dt_report_signame(sig, name, sizeof name));
    cJSON_AddStringToObject(f, "action", action);
    emit(ev, "signal", f);
}

static cJSON *failure_json(const dt_rdzv_failure *f)
{
    cJSON *o = cJSON_CreateObject();
    char name[32];
    cJSON_AddNumberToObject(o, "failure_time", f->time);
    cJSON_AddStringToObject(o, "host", f->host);
    cJSON_AddNumberToObject(o, "failed_node", f->node);
    cJSON_AddNumberToObject(o, "rank", f->rank);
    cJSON_AddNumberToObject(o, "local_rank", f->local_rank);
    cJSON_AddNumberToObject(o, "pid", f->pid);
    cJSON_AddNumberToObject(o, "exit_code", f->signal ? -f->signal : f->exit_code);
    if (f->signal)
        cJSON_AddStringToObject(o, "signal", dt_report_signame(f->signal, name, sizeof name));
    cJSON_AddStringToObject(o, "message", f->message);
    if (f->error_file[0])
        cJSON_AddStringToObject(o, "error_file", f->error_file);
    return o;
}

void dt_report_failures(dt_events *ev, const dt_rdzv_failure *fl, int n, int attempt)
{
    cJSON *f = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(f, "failures");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, failure_json(&fl[i]));
    cJSON_AddNumberToObject(f, "attempt", attempt);
    emit(ev, "failure", f);
}

void dt_report_regroup(dt_events *ev, const char *why, int attempt)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "why", why);
    cJSON_AddNumberToObject(f, "attempt", attempt);
    emit(ev, "regroup", f);
}

void dt_report_layout(dt_events *ev, int world, int nodes, bool planned, const char *keys,
                      int attempt)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "world", world);
    cJSON_AddNumberToObject(f, "nodes", nodes);
    cJSON_AddBoolToObject(f, "planned", planned);
    cJSON_AddStringToObject(f, "keys", keys);
    cJSON_AddNumberToObject(f, "attempt", attempt);
    emit(ev, "layout", f);
}

void dt_report_restart(dt_events *ev, int attempt)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "attempt", attempt);
    emit(ev, "restart", f);
}

void dt_report_hang(dt_events *ev, const char *event, cJSON *fields)
{
    emit(ev, event, fields);
}

void dt_report_straggler(dt_events *ev, bool recovered, int rank, int node, double ratio,
                         int64_t first_step, int64_t last_step, double compute_ms,
                         double median_ms)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", rank);
    cJSON_AddNumberToObject(f, "node", node);
    cJSON_AddNumberToObject(f, "ratio", (double)(int64_t)(ratio * 1000) / 1000.0);
    cJSON_AddNumberToObject(f, "first_step", (double)first_step);
    cJSON_AddNumberToObject(f, "last_step", (double)last_step);
    cJSON_AddNumberToObject(f, "compute_ms", ms_round(compute_ms));
    cJSON_AddNumberToObject(f, "median_ms", ms_round(median_ms));
    emit(ev, recovered ? "straggler_recovered" : "straggler", f);
}

void dt_report_end(dt_events *ev, const char *result, int exit_code, int attempt,
                   uint64_t console_lines_dropped)
{
    cJSON *f = cJSON_CreateObject();
    cJSON_AddStringToObject(f, "result", result);
    cJSON_AddNumberToObject(f, "exit_code", exit_code);
    cJSON_AddNumberToObject(f, "attempt", attempt);
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cJSON_AddNumberToObject(f, "agent_max_rss_kb", (double)ru.ru_maxrss);
    cJSON_AddNumberToObject(f, "console_lines_dropped", (double)console_lines_dropped);
    emit(ev, "end", f);
}

/* ---- the root-cause table --------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (!b->p)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        char *p = realloc(b->p, 2 * (b->cap + (size_t)n));
        if (!p) {
            free(b->p);
            b->p = NULL;
            return;
        }
        b->p = p;
        b->cap = 2 * (b->cap + (size_t)n);
    }
}

static void fmt_time(double t, char *buf, size_t cap)
{
    if (t <= 0) {
        snprintf(buf, cap, "<unknown>");
        return;
    }
    time_t s = (time_t)t;
    struct tm tm;
    localtime_r(&s, &tm);
    char d[32];
    int ms = (int)((t - (double)s) * 1000);
    strftime(d, sizeof d, "%Y-%m-%d %H:%M:%S", &tm);
    snprintf(buf, cap, "%.24s.%03d", d, ms < 0 ? 0 : ms > 999 ? 999 : ms);
}

/* A message over several lines, indented under its label. */
static void sb_message(sbuf *b, const char *indent, const char *msg)
{
    const char *p = msg;
    bool first = true;
    while (*p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        sb_printf(b, "%s%.*s\n", first ? "" : indent, len, p);
        first = false;
        p += len + (nl ? 1 : 0);
    }
    if (first)
        sb_printf(b, "<none>\n");
}

char *dt_report_table(const dt_rdzv_failure *f, int n, const char *headline, const char *footer)
{
    static const char rule[] =
        "==========================================================================================";
    static const char thin[] =
        "------------------------------------------------------------------------------------------";
    sbuf b = {malloc(4096), 0, 4096};
    char when[64], what[128], name[32];
    sb_printf(&b, "%s\n%s\n%s\n", rule, headline, thin);
    if (n == 0) {
        sb_printf(&b, "No failure was recorded.\n");
    } else {
        const dt_rdzv_failure *r = &f[0];
        fmt_time(r->time, when, sizeof when);
        sb_printf(&b, "Root cause (first failure):\n");
        sb_printf(&b, "  time       : %s\n", when);
        sb_printf(&b, "  host       : %s (node %d)\n", r->host, r->node);
        if (r->rank >= 0)
            sb_printf(&b, "  rank       : %d (local_rank %d)\n", r->rank, r->local_rank);
        else
            sb_printf(&b, "  rank       : - (the node itself)\n");
        if (r->pid > 0)
            sb_printf(&b, "  pid        : %d\n", r->pid);
        if (r->signal)
            sb_printf(&b, "  exit code  : %d (%s)\n", -r->signal,
                      dt_report_signame(r->signal, name, sizeof name));
        else if (r->exit_code == DT_REPORT_HANG_CULPRIT)
            sb_printf(&b, "  exit code  : - (the hang verdict's culprit: it did not exit by "
                          "itself)\n");
        else if (r->rank >= 0)
            sb_printf(&b, "  exit code  : %d\n", r->exit_code);
        sb_printf(&b, "  error file : %s\n", r->error_file[0] ? r->error_file : "<none>");
        sb_printf(&b, "  message    : ");
        sb_message(&b, "               ", r->message);
        if (n > 1) {
            sb_printf(&b, "%s\nOther failures:\n", thin);
            for (int i = 1; i < n; i++) {
                const dt_rdzv_failure *o = &f[i];
                fmt_time(o->time, when, sizeof when);
                dt_report_describe_status(o->exit_code, o->signal, what, sizeof what);
                if (o->rank >= 0)
                    sb_printf(&b, "  [%d] rank %d (local_rank %d) on %s (node %d), %s, %s", i,
                              o->rank, o->local_rank, o->host, o->node, when, what);
                else
                    sb_printf(&b, "  [%d] node %d (%s), %s, lost", i, o->node, o->host, when);
                /* The first line of a message of its own (the full text is in the error file);
                 * nothing more when the message only repeats the status. */
                const char *nl = strchr(o->message, '\n');
                if (o->error_file[0] || strncmp(o->message, what, strlen(what)))
                    sb_printf(&b, ": %.*s", nl ? (int)(nl - o->message) : (int)strlen(o->message),
                              o->message);
                sb_printf(&b, "\n");
            }
        }
    }
    if (footer && *footer)
        sb_printf(&b, "%s\n%s\n", thin, footer);
    sb_printf(&b, "%s\n", rule);
    return b.p;
}

char *dt_report_job_failed(const dt_rdzv_failure *f, int n, const char *headline, int fatal,
                           int attempt, int max_restarts, const char *run_dir)
{
    char head[512], foot[4096], what[128], why[128]; /* foot: run_dir is a path plus a run id */
    /* why the job ends here rather than restarts */
    if (fatal == DT_EXIT_OOM)
        snprintf(why, sizeof why,
                 "attempt %d; not restarted: out of device memory, the layout does not fit",
                 attempt);
    else if (fatal)
        snprintf(why, sizeof why, "attempt %d; not restarted: a configuration error", attempt);
    else
        snprintf(why, sizeof why, "attempt %d; --max-restarts=%d spent", attempt, max_restarts);
    if (headline) {
        snprintf(head, sizeof head, "%.*s", (int)sizeof head - 1, headline);
    } else if (n > 0) {
        dt_report_describe_status(f[0].exit_code, f[0].signal, what, sizeof what);
        if (f[0].rank >= 0)
            snprintf(head, sizeof head, "dtrain: the job failed: rank %d on %s %s (%s)",
                     f[0].rank, f[0].host, what, why);
        else
            snprintf(head, sizeof head, "dtrain: the job failed: node %d (%s) was lost (%s)",
                     f[0].node, f[0].host, why);
    } else {
        snprintf(head, sizeof head, "dtrain: the job failed (%s)", why);
    }
    snprintf(foot, sizeof foot, "Logs: %s (events.jsonl; attempt_<k>/<rank>/)", run_dir);
    return dt_report_table(f, n, head, foot);
}
