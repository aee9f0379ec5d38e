/* trace.c - the per-process span recorder and its Chrome-trace writer; see trace.h.
 *
 * One recorder per process: a growable array of spans under a mutex, allocated on the first
 * span recorded (never when tracing is off), capped at max_events. Two atomics keep the off path
 * to one branch: g_open (between open and close) and g_recording (open and inside the step
 * range). Tracks are resolved when a span is recorded (a thread's track, cached in a
 * thread-local with the trace's generation, so a second trace in one process starts afresh) and
 * laid out when the file is written (an async group's lanes: each span on the first lane whose
 * last span ended by its start).
 *
 * The file is written one event per line between a fixed first line and a line "],", which is
 * what dt_trace_merge relies on to merge the ranks' files without a JSON parser.
 */
#include "runtime/train/obs/trace.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/job/config.h" /* DT_PATH_MAX */

#define MAX_TRACKS 64   /* thread tracks; threads past them share the last one */
#define MAX_GROUPS 16   /* async track groups */
#define MAX_LANES 64    /* lanes of one group; spans past them share the last one */
#define FIRST_CAP 1024  /* spans allocated at first */
#define HEADER "{\"traceEvents\":[\n"
#define END_LINE "],"

static const char *const cat_names[DT_TRACE_NCAT] = {
    "step", "data", "forward", "backward", "comm", "optim", "ckpt", "eval", "other"};

const char *dt_trace_cat_name(dt_trace_cat c)
{
    return (unsigned)c < DT_TRACE_NCAT ? cat_names[c] : "other";
}

typedef struct ev {
    uint64_t t0, t1;     /* CLOCK_MONOTONIC ns */
    const char *name;    /* borrowed literal */
    const char *key[2];  /* borrowed literals or NULL */
    int64_t value[2];
    int64_t step;        /* the step being recorded when it ended */
    int16_t track;       /* >= 0: thread track; < 0: async group -1 - track */
    uint8_t cat;
    uint8_t lane;        /* async: set when written */
} ev;

static atomic_bool g_open, g_recording;
static atomic_llong g_step;

static struct {
    pthread_mutex_t mu;
    unsigned gen;                  /* trace generation: thread-local tracks of older ones are stale */
    dt_trace_opts o;
    char dir[DT_PATH_MAX];
    int64_t offset_ns;             /* CLOCK_REALTIME - CLOCK_MONOTONIC at open */
    ev *ev;                        /* (cap) owned */
    size_t n, cap, dropped;
    bool warned;
    char track[MAX_TRACKS][48];    /* thread tracks' names */
    int ntracks;
    const char *group[MAX_GROUPS]; /* async groups' names (borrowed literals) */
    int ngroups;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int tl_track = -1;
static _Thread_local unsigned tl_gen;

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t dt_trace_now(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

/* ---- open, step, close --------------------------------------------------------------------- */

int dt_trace_open(const dt_trace_opts *o, dt_err *err)
{
    if (!o || !o->dir || !o->dir[0])
        return dt_err_set(err, -EINVAL, "trace: no directory to write the trace to");
    if (o->first_step < 1 || o->last_step < o->first_step)
        return dt_err_set(err, -EINVAL,
                          "trace: steps %" PRId64 " to %" PRId64 " are not a range of steps "
                          "(they count from 1; see train.trace)",
                          o->first_step, o->last_step);
    if (strlen(o->dir) >= sizeof g.dir)
        return dt_err_set(err, -ENAMETOOLONG, "trace: directory %s is too long", o->dir);
    int rc = dt_mkdir_p(o->dir, err);
    if (rc)
        return dt_err_prefix(err, "trace directory (train.trace): ");
    pthread_mutex_lock(&g.mu);
    if (atomic_load(&g_open)) {
        pthread_mutex_unlock(&g.mu);
        return dt_err_set(err, -EBUSY, "trace: already open in this process (one per process)");
    }
    g.o = *o;
    dt_strlcpy(g.dir, o->dir, sizeof g.dir);
    g.o.dir = g.dir;
    if (!g.o.max_events)
        g.o.max_events = DT_TRACE_MAX_EVENTS;
    /* the two reads are nanoseconds apart; the offset is the same for every process of a host */
    uint64_t mono = clock_ns(CLOCK_MONOTONIC), real = clock_ns(CLOCK_REALTIME);
    g.offset_ns = (int64_t)(real - mono);
    g.n = g.dropped = 0;
    g.warned = false;
    g.ngroups = 0;
    g.ntracks = 1;
    dt_strlcpy(g.track[0], "main", sizeof g.track[0]);
    g.gen++;
    tl_track = 0;
    tl_gen = g.gen;
    atomic_store(&g_step, 0);
    atomic_store(&g_recording, false);
    atomic_store(&g_open, true);
    pthread_mutex_unlock(&g.mu);
    return 0;
}

bool dt_trace_enabled(void)
{
    return atomic_load_explicit(&g_open, memory_order_relaxed);
}

void dt_trace_step(int64_t step)
{
    if (!atomic_load_explicit(&g_open, memory_order_relaxed))
        return;
    atomic_store(&g_step, (long long)step);
    atomic_store(&g_recording, step >= g.o.first_step && step <= g.o.last_step);
}

void dt_trace_close(void)
{
    pthread_mutex_lock(&g.mu);
    atomic_store(&g_recording, false);
    atomic_store(&g_open, false);
    free(g.ev);
    g.ev = NULL;
    g.n = g.cap = g.dropped = 0;
    g.gen++;
    pthread_mutex_unlock(&g.mu);
}

size_t dt_trace_count(void)
{
    pthread_mutex_lock(&g.mu);
    size_t n = g.n;
    pthread_mutex_unlock(&g.mu);
    return n;
}

size_t dt_trace_dropped(void)
{
    pthread_mutex_lock(&g.mu);
    size_t n = g.dropped;
    pthread_mutex_unlock(&g.mu);
    return n;
}

/* ---- recording ----------------------------------------------------------------------------- */

uint64_t dt_trace_begin(void)
{
    if (!atomic_load_explicit(&g_recording, memory_order_relaxed))
        return 0;
    return clock_ns(CLOCK_MONOTONIC);
}

/* The calling thread's track (g.mu held). */
static int thread_track(void)
{
    if (tl_gen != g.gen || tl_track < 0) {
        if (g.ntracks < MAX_TRACKS) {
            tl_track = g.ntracks++;
            snprintf(g.track[tl_track], sizeof g.track[0], "thread %d", tl_track);
        } else {
            tl_track = MAX_TRACKS - 1; /* shared by the threads past the table */
        }
        tl_gen = g.gen;
    }
    return tl_track;
}

/* The async group named track, added when new (g.mu held); -1 when the table is full. */
static int group_index(const char *track)
{
    for (int i = 0; i < g.ngroups; i++)
        if (g.group[i] == track || !strcmp(g.group[i], track))
            return i;
    if (g.ngroups == MAX_GROUPS)
        return -1;
    g.group[g.ngroups] = track;
    return g.ngroups++;
}

void dt_trace_thread_name(const char *name)
{
    if (!atomic_load_explicit(&g_open, memory_order_relaxed))
        return;
    pthread_mutex_lock(&g.mu);
    if (atomic_load(&g_open))
        dt_strlcpy(g.track[thread_track()], name, sizeof g.track[0]);
    pthread_mutex_unlock(&g.mu);
}

void dt_trace_add(const dt_trace_span *s)
{
    if (!s->t0)
        return;
    bool warn_cap = false, warn_mem = false;
    size_t cap_now = 0;
    pthread_mutex_lock(&g.mu);
    if (!atomic_load(&g_open))
        goto out;
    if (g.n == g.cap) {
        if (g.cap >= g.o.max_events) {
            warn_cap = !g.warned;
            g.warned = true;
            g.dropped++;
            cap_now = g.cap;
            goto out;
        }
        size_t cap = g.cap ? g.cap * 2 : FIRST_CAP;
        if (cap > g.o.max_events)
            cap = g.o.max_events;
        ev *p = realloc(g.ev, cap * sizeof *p);
        if (!p) {
            warn_mem = !g.warned;
            g.warned = true;
            g.dropped++;
            goto out;
        }
        g.ev = p;
        g.cap = cap;
    }
    ev *e = &g.ev[g.n++];
    e->t0 = s->t0;
    e->t1 = s->t1 < s->t0 ? s->t0 : s->t1;
    e->name = s->name ? s->name : "?";
    e->key[0] = s->key[0];
    e->key[1] = s->key[1];
    e->value[0] = s->value[0];
    e->value[1] = s->value[1];
    e->step = (int64_t)atomic_load(&g_step);
    e->cat = (uint8_t)((unsigned)s->cat < DT_TRACE_NCAT ? s->cat : DT_TRACE_OTHER);
    e->lane = 0;
    int gi = s->track ? group_index(s->track) : -1;
    e->track = (int16_t)(gi >= 0 ? -1 - gi : thread_track());
out:
    pthread_mutex_unlock(&g.mu);
    if (warn_cap)
        DT_WARN("trace: rank %d kept %zu spans, the cap; later spans are dropped (counted as "
                "\"dropped\" in the trace). Trace fewer steps: train.trace = A-B, e.g. 10-12",
                g.o.rank, cap_now);
    if (warn_mem)
        DT_WARN("trace: out of memory for more spans; later spans are dropped (trace fewer "
                "steps: train.trace = A-B)");
}

void dt_trace_end(uint64_t t0, dt_trace_cat cat, const char *name)
{
    if (!t0)
        return;
    dt_trace_span s = {.t0 = t0, .t1 = dt_trace_now(), .cat = cat, .name = name};
    dt_trace_add(&s);
}

void dt_trace_end_arg(uint64_t t0, dt_trace_cat cat, const char *name, const char *key,
                      int64_t value)
{
    if (!t0)
        return;
    dt_trace_span s = {.t0 = t0, .t1 = dt_trace_now(), .cat = cat, .name = name,
                       .key = {key, NULL}, .value = {value, 0}};
    dt_trace_add(&s);
}

void dt_trace_end_async_at(uint64_t t0, uint64_t t1, const char *track, dt_trace_cat cat,
                           const char *name, const char *key, int64_t value, const char *key2,
                           int64_t value2)
{
    if (!t0)
        return;
    dt_trace_span s = {.t0 = t0, .t1 = t1 < t0 ? t0 : t1, .cat = cat, .name = name,
                       .track = track ? track : "async", .key = {key, key2},
                       .value = {value, value2}};
    dt_trace_add(&s);
}

void dt_trace_end_async(uint64_t t0, const char *track, dt_trace_cat cat, const char *name,
                        const char *key, int64_t value, const char *key2, int64_t value2)
{
    if (t0)
        dt_trace_end_async_at(t0, dt_trace_now(), track, cat, name, key, value, key2, value2);
}

/* ---- writing ------------------------------------------------------------------------------- */

/* s as a JSON string (quotes included). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* ns as microseconds with three decimals, exactly. */
static void json_us(FILE *f, uint64_t ns)
{
    fprintf(f, "%" PRIu64 ".%03u", ns / 1000, (unsigned)(ns % 1000));
}

static const ev *sort_base;

/* By start, the longer (the parent) first at equal starts. */
static int by_start(const void *a, const void *b)
{
    const ev *x = &sort_base[*(const size_t *)a], *y = &sort_base[*(const size_t *)b];
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1)
        return x->t1 > y->t1 ? -1 : 1;
    return 0;
}

/* Puts each async span on the first lane of its group free at its start (order: sorted by
 * start); lanes[gi] gets the lanes group gi uses. */
static void assign_lanes(const size_t *order, int *lanes)
{
    static uint64_t end[MAX_GROUPS][MAX_LANES];
    memset(end, 0, sizeof end);
    for (int i = 0; i < MAX_GROUPS; i++)
        lanes[i] = 0;
    for (size_t k = 0; k < g.n; k++) {
        ev *e = &g.ev[order[k]];
        if (e->track >= 0)
            continue;
        int gi = -1 - e->track, l = 0;
        while (l < lanes[gi] && end[gi][l] > e->t0)
            l++;
        if (l == MAX_LANES)
            l = MAX_LANES - 1;
        if (l == lanes[gi])
            lanes[gi]++;
        if (e->t1 > end[gi][l])
            end[gi][l] = e->t1;
        e->lane = (uint8_t)l;
    }
}

/* Names in natural order: "replica 2" before "replica 10". */
static int natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            char *ea, *eb;
            unsigned long long x = strtoull(a, &ea, 10), y = strtoull(b, &eb, 10);
            if (x != y)
                return x < y ? -1 : 1;
            a = ea;
            b = eb;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a - (unsigned char)*b;
        a++;
        b++;
    }
    return (unsigned char)*a - (unsigned char)*b;
}

static int by_track_name(const void *x, const void *y)
{
    return natural_cmp(g.track[*(const int *)x], g.track[*(const int *)y]);
}

/* The metadata of a track: its name and its place. */
static void write_track_meta(FILE *f, int pid, int tid, const char *name)
{
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            pid, tid);
    json_str(f, name);
    fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"sort_index\":%d}},\n",
            pid, tid, tid);
}

static void write_file(FILE *f, const size_t *order, const int *lanes)
{
    const int pid = g.o.rank;
    /* tids: main 1, then every async group's lanes, then the other threads */
    int thread_tid[MAX_TRACKS], group_tid[MAX_GROUPS], next = 2;
    bool used[MAX_TRACKS] = {true};
    for (size_t k = 0; k < g.n; k++)
        if (g.ev[k].track >= 0)
            used[g.ev[k].track] = true;
    for (int gi = 0; gi < g.ngroups; gi++) {
        group_tid[gi] = next;
        next += lanes[gi];
    }
    int others[MAX_TRACKS], nothers = 0; /* the other threads, by name */
    for (int i = 1; i < g.ntracks; i++)
        if (used[i])
            others[nothers++] = i;
    qsort(others, (size_t)nothers, sizeof *others, by_track_name);
    for (int i = 0; i < g.ntracks; i++)
        thread_tid[i] = i == 0 ? 1 : 0;
    for (int i = 0; i < nothers; i++)
        thread_tid[others[i]] = next++;

    fputs(HEADER, f);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
               "\"rank %d\"}},\n",
            pid, pid);
    fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":"
               "{\"sort_index\":%d}},\n",
            pid, pid);
    for (int i = 0; i < g.ntracks; i++)
        if (used[i])
            write_track_meta(f, pid, thread_tid[i], g.track[i]);
    for (int gi = 0; gi < g.ngroups; gi++)
        for (int l = 0; l < lanes[gi]; l++) {
            char name[64];
            if (l == 0)
                snprintf(name, sizeof name, "%s", g.group[gi]);
            else
                snprintf(name, sizeof name, "%s #%d", g.group[gi], l + 1);
            write_track_meta(f, pid, group_tid[gi] + l, name);
        }
    for (size_t k = 0; k < g.n; k++) {
        const ev *e = &g.ev[order[k]];
        int tid = e->track >= 0 ? thread_tid[e->track] : group_tid[-1 - e->track] + e->lane;
        fputs("{\"name\":", f);
        json_str(f, e->name);
        fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":",
                cat_names[e->cat], pid, tid);
        json_us(f, (uint64_t)((int64_t)e->t0 + g.offset_ns));
        fputs(",\"dur\":", f);
        json_us(f, e->t1 - e->t0);
        fprintf(f, ",\"args\":{\"step\":%" PRId64, e->step);
        for (int a = 0; a < 2; a++)
            if (e->key[a]) {
                fputc(',', f);
                json_str(f, e->key[a]);
                fprintf(f, ":%" PRId64, e->value[a]);
            }
        fputs(k + 1 < g.n ? "}},\n" : "}}\n", f);
    }
    /* a trace with no span still has its metadata: drop the last comma */
    if (g.n == 0) {
        fflush(f);
        long pos = ftell(f);
        if (pos >= 2)
            fseek(f, pos - 2, SEEK_SET);
        fputs("\n", f);
    }
    fputs(END_LINE "\n\"displayTimeUnit\":\"ms\",\n", f);
    fprintf(f, "\"otherData\":{\"dtrain_trace\":1,\"rank\":%d,\"world_size\":%d,\"clock\":"
               "\"CLOCK_MONOTONIC + (CLOCK_REALTIME - CLOCK_MONOTONIC at start): microseconds "
               "since the Unix epoch; exact between the ranks of a host, as good as NTP "
               "across hosts\",\"first_step\":%" PRId64 ",\"last_step\":%" PRId64
               ",\"events\":%zu,\"dropped\":%zu,\"max_events\":%zu}}\n",
            pid, g.o.world_size, g.o.first_step,
            g.o.last_step == INT64_MAX ? (int64_t)-1 : g.o.last_step, g.n, g.dropped,
            g.o.max_events);
}

int dt_trace_write(char *path, size_t cap, dt_err *err)
{
    char final[DT_PATH_MAX + 32], tmp[DT_PATH_MAX + 48];
    int rc = 0;
    size_t *order = NULL;
    FILE *f = NULL;
    pthread_mutex_lock(&g.mu);
    if (!atomic_load(&g_open)) {
        rc = dt_err_set(err, -EINVAL, "trace: not open (train.trace is off)");
        goto out;
    }
    snprintf(final, sizeof final, "%s/rank%d.json", g.dir, g.o.rank);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", final, (int)getpid());
    if (path)
        dt_strlcpy(path, final, cap);
    if (!(order = malloc(sizeof *order * (g.n ? g.n : 1)))) {
        rc = dt_err_set(err, -ENOMEM, "trace: out of memory writing %s", final);
        goto out;
    }
    for (size_t k = 0; k < g.n; k++)
        order[k] = k;
    sort_base = g.ev;
    qsort(order, g.n, sizeof *order, by_start);
    int lanes[MAX_GROUPS];
    assign_lanes(order, lanes);
    if (!(f = fopen(tmp, "w"))) {
        rc = dt_err_errno(err, errno, "trace: cannot write %s", tmp);
        goto out;
    }
    write_file(f, order, lanes);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        rc = dt_err_errno(err, errno ? errno : EIO, "trace: writing %s failed", tmp);
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, final) != 0) {
        rc = dt_err_errno(err, errno, "trace: cannot rename %s to %s", tmp, final);
        unlink(tmp);
    }
out:
    pthread_mutex_unlock(&g.mu);
    free(order);
    return rc;
}

/* ---- merging ------------------------------------------------------------------------------- */

/* Appends the event lines of one rank's file (text, NUL-terminated) to out; *first: no event
 * written yet (no comma before this one). *dropped += its "dropped". */
static int merge_one(FILE *out, const char *path, char *text, bool *first, size_t *dropped,
                     dt_err *err)
{
    size_t hl = strlen(HEADER);
    if (strncmp(text, HEADER, hl) != 0)
        return dt_err_set(err, -EPROTO, "trace: %s is not a trace dtrain wrote (it does not "
                          "begin with {\"traceEvents\":[); remove it, or merge with "
                          "scripts/trace-png.py", path);
    char *save = NULL;
    bool ended = false;
    for (char *line = strtok_r(text + hl, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strcmp(line, END_LINE)) {
            ended = true;
            char *d = strstr(save ? save : "", "\"dropped\":");
            if (d)
                *dropped += strtoull(d + 10, NULL, 10);
            break;
        }
        size_t n = strlen(line);
        if (n && line[n - 1] == ',')
            line[--n] = '\0';
        if (n < 2 || line[0] != '{' || line[n - 1] != '}')
            return dt_err_set(err, -EPROTO, "trace: %s: \"%.60s\" is not an event line", path,
                              line);
        fputs(*first ? "" : ",\n", out);
        fputs(line, out);
        *first = false;
    }
    if (!ended)
        return dt_err_set(err, -EPROTO, "trace: %s ends early (no \"],\" line): a rank that "
                          "did not finish writing it", path);
    return 0;
}

int dt_trace_merge(const char *dir, int world_size, const char *out, int *found, dt_err *err)
{
    char tmp[DT_PATH_MAX + 48];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *f = fopen(tmp, "w");
    int rc = 0, n = 0;
    size_t dropped = 0;
    bool first = true;
    if (found)
        *found = 0;
    if (!f)
        return dt_err_errno(err, errno, "trace: cannot write %s", tmp);
    fputs(HEADER, f);
    for (int r = 0; r < world_size && !rc; r++) {
        char path[DT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/rank%d.json", dir, r);
        if (access(path, F_OK) != 0)
            continue;
        char *text = NULL;
        size_t len = 0;
        if ((rc = dt_read_file(path, &text, &len, err)))
            break;
        rc = merge_one(f, path, text, &first, &dropped, err);
        free(text);
        if (!rc)
            n++;
    }
    if (!rc && n == 0)
        rc = dt_err_set(err, -ENOENT, "trace: no rank<N>.json in %s to merge", dir);
    if (!rc) {
        fprintf(f, "\n" END_LINE "\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"dtrain_trace\":"
                   "1,\"world_size\":%d,\"ranks_found\":%d,\"dropped\":%zu}}\n",
                world_size, n, dropped);
    }
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        if (!rc)
            rc = dt_err_errno(err, errno ? errno : EIO, "trace: writing %s failed", tmp);
    }
    if (!rc && rename(tmp, out) != 0)
        rc = dt_err_errno(err, errno, "trace: cannot rename %s to %s", tmp, out);
    if (rc)
        unlink(tmp);
    else if (found)
        *found = n;
    return rc;
}
