/* agent_output.c - see agent_output.h. */
#include "runtime/launch/agent_output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

int dt_out_mode_for(const char *spec, int local_rank)
{
    int a, b;
    char tail;
    if (!spec || !*spec)
        return 0;
    if (sscanf(spec, "%d%c", &a, &tail) == 1)
        return a >= 0 && a <= 3 ? a : 0;
    char buf[512], *save = NULL;
    dt_strlcpy(buf, spec, sizeof buf);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (sscanf(tok, " %d:%d", &a, &b) == 2 && a == local_rank)
            return b >= 0 && b <= 3 ? b : 0;
    return 0;
}

bool dt_out_rank_shown(const char *filter, int local_rank)
{
    if (!filter || !*filter)
        return true;
    char buf[512], *save = NULL;
    dt_strlcpy(buf, filter, sizeof buf);
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        int r;
        if (dt_parse_int(tok, &r) == 0 && r == local_rank)
            return true;
    }
    return false;
}

/* ---- the console ------------------------------------------------------------------------ */

/* One of the agent's console fds (1 or 2) and the bytes waiting for it. */
typedef struct console {
    bool open;           /* dt_out_console_open prepared it */
    bool nonblock;       /* writes return EAGAIN instead of blocking (own description or socket) */
    bool sock;           /* a socket: send(MSG_DONTWAIT) */
    bool gone;           /* EPIPE or worse: everything for it is dropped from now on */
    bool dropping;       /* stalled: worker lines are dropped until the buffer drains */
    int saved;           /* the original description (to restore), or -1 */
    char *buf;           /* DT_OUT_CONSOLE_CAP bytes, malloc'd when first needed; owned */
    size_t off, len;     /* pending bytes: buf[off, off + len) */
    double progress_at;  /* when bytes last went out while some were pending (monotonic) */
    uint64_t dropped;    /* lines dropped and not yet reported on the console */
    uint64_t dropped_total;
} console;

static console con[3]; /* indexed by fd: 1 stdout, 2 stderr */
/* stdout and stderr are one file (`2>&1`, one terminal): everything goes through con[1], in
 * order, so a line the reader took only part of is finished before the next line, whichever fd
 * it was for (through two buffers, the agent's own lines could land inside a worker's). */
static bool con_same;

static int con_route(int fd) { return fd == 2 && con_same ? 1 : fd; }

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t count_lines(const char *p, size_t n)
{
    uint64_t k = 0;
    for (const char *e = p + n; p < e && (p = memchr(p, '\n', (size_t)(e - p))); p++)
        k++;
    return k ? k : 1;
}

/* One non-blocking write attempt; the bytes taken (0 when full), or -1 when the console is gone. */
static ssize_t con_write_some(int fd, const char *p, size_t n)
{
    for (;;) {
        ssize_t w = con[fd].sock ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : write(fd, p, n);
        if (w >= 0)
            return w;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
}

static void con_set_gone(int fd)
{
    con[fd].gone = true; /* EPIPE or worse: stop writing there, keep the job going */
    con[fd].len = con[fd].off = 0;
}

/* Writes what it can of the pending bytes without blocking. */
static void con_flush(int fd)
{
    console *c = &con[fd];
    while (c->len > 0 && !c->gone) {
        ssize_t w = con_write_some(fd, c->buf + c->off, c->len);
        if (w < 0) {
            con_set_gone(fd);
            return;
        }
        if (w == 0)
            return;
        c->off += (size_t)w;
        c->len -= (size_t)w;
        c->progress_at = mono_s();
    }
    if (c->len == 0)
        c->off = 0;
}

static void con_store(console *c, const char *p, size_t n)
{
    if (c->off + c->len + n > DT_OUT_CONSOLE_CAP) {
        memmove(c->buf, c->buf + c->off, c->len);
        c->off = 0;
    }
    memcpy(c->buf + c->off + c->len, p, n);
    c->len += n;
}

/* Reports the dropped lines once the console has room again. */
static void con_report_drops(int fd)
{
    console *c = &con[fd];
    if (c->len > DT_OUT_CONSOLE_LOW)
        return;
    c->dropping = false;
    if (!c->dropped)
        return;
    char note[160];
    int k = snprintf(note, sizeof note,
                     "dtrain: %llu line%s dropped: the console did not keep up (--tee 3 or "
                     "--redirects 3 keep every line in per-rank log files)\n",
                     (unsigned long long)c->dropped, c->dropped == 1 ? "" : "s");
    c->dropped = 0;
    if (k > 0 && (size_t)k < sizeof note && c->len + (size_t)k <= DT_OUT_CONSOLE_CAP)
        con_store(c, note, (size_t)k);
    con_flush(fd);
}

/* Queues or writes text (whole lines) for console fd. A line of a worker is dropped (and
 * counted) while the console is stalled or the buffer is full; the agent's own text waits for
 * room up to DT_OUT_CONSOLE_STALL_S without progress first. */
static void con_put(int fd, const char *p, size_t n, bool worker)
{
    fd = con_route(fd);
    console *c = &con[fd];
    if (c->gone || n == 0)
        return;
    if (!c->nonblock) { /* never prepared (a unit test, a regular file): plain writes */
        while (n > 0) {
            ssize_t w = write(fd, p, n);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                struct pollfd pf = {fd, POLLOUT, 0}; /* made non-blocking by someone else */
                poll(&pf, 1, 1000);
                continue;
            }
            if (w <= 0) {
                con_set_gone(fd);
                return;
            }
            p += w;
            n -= (size_t)w;
        }
        return;
    }
    if (c->len == 0 && !c->dropping) {
        ssize_t w = con_write_some(fd, p, n);
        if (w < 0) {
            con_set_gone(fd);
            return;
        }
        p += w;
        n -= (size_t)w;
        if (n == 0)
            return;
        c->progress_at = mono_s(); /* the stall clock starts with the first bytes left waiting */
    }
    if (!c->buf && !(c->buf = malloc(DT_OUT_CONSOLE_CAP))) {
        c->dropped += count_lines(p, n);
        c->dropped_total += count_lines(p, n);
        return;
    }
    if (worker && c->dropping) {
        c->dropped += count_lines(p, n);
        c->dropped_total += count_lines(p, n);
        return;
    }
    /* Full: wait a little for the reader (bounded), as the end of a round may queue the rest of
     * every pipe at once. */
    while (c->len + n > DT_OUT_CONSOLE_CAP && !c->gone) {
        con_flush(fd); /* first: the reader may have taken bytes while this agent was busy */
        if (c->len + n <= DT_OUT_CONSOLE_CAP)
            break;
        double waited = mono_s() - c->progress_at;
        if (waited >= DT_OUT_CONSOLE_STALL_S)
            break;
        struct pollfd pf = {fd, POLLOUT, 0};
        int ms = (int)((DT_OUT_CONSOLE_STALL_S - waited) * 1000) + 1;
        if (poll(&pf, 1, ms > 100 ? 100 : ms) < 0 && errno != EINTR)
            break;
    }
    if (c->gone)
        return;
    if (c->len + n > DT_OUT_CONSOLE_CAP) {
        c->dropping = true;
        c->dropped += count_lines(p, n);
        c->dropped_total += count_lines(p, n);
        return;
    }
    con_store(c, p, n);
}

int dt_out_console_open(dt_err *err)
{
    (void)err;
    struct stat s1, s2;
    con_same = fstat(1, &s1) == 0 && fstat(2, &s2) == 0 && s1.st_dev == s2.st_dev &&
               s1.st_ino == s2.st_ino && !S_ISREG(s1.st_mode);
    for (int fd = 1; fd <= 2; fd++) {
        console *c = &con[fd];
        free(c->buf);
        memset(c, 0, sizeof *c);
        c->saved = -1;
        c->open = true;
        struct stat st;
        if (fstat(fd, &st) != 0) {
            c->gone = true; /* closed: nothing to show */
            continue;
        }
        if (S_ISSOCK(st.st_mode)) {
            c->sock = c->nonblock = true;
            continue;
        }
        if (!S_ISFIFO(st.st_mode) && !isatty(fd))
            continue; /* a regular file or /dev/null: writes do not wait on a reader */
        /* A description of our own, so that O_NONBLOCK does not reach the shell or the other
         * processes that share the console. */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int nfd = open(path, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (nfd < 0) {
            DT_DEBUG("cannot reopen the console fd %d (%s): writes to it may block", fd,
                     strerror(errno));
            continue;
        }
        c->saved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (c->saved < 0 || dup2(nfd, fd) < 0) {
            if (c->saved >= 0)
                close(c->saved);
            c->saved = -1;
            close(nfd);
            continue;
        }
        close(nfd);
        c->nonblock = true;
    }
    return 0;
}

bool dt_out_console_pending(int fd)
{
    return fd >= 1 && fd <= 2 && con[fd].len > 0 && !con[fd].gone;
}

bool dt_out_console_throttled(void)
{
    for (int fd = 1; fd <= 2; fd++)
        if (con[fd].len > DT_OUT_CONSOLE_HIGH && !con[fd].dropping && !con[fd].gone)
            return true;
    return false;
}

int dt_out_console_tick(void)
{
    int ms = -1;
    double now = mono_s();
    for (int fd = 1; fd <= 2; fd++) {
        console *c = &con[fd];
        con_flush(fd);
        con_report_drops(fd);
        if (c->len == 0 || c->gone)
            continue;
        double idle = now - c->progress_at;
        if (!c->dropping && c->len > DT_OUT_CONSOLE_HIGH) {
            if (idle >= DT_OUT_CONSOLE_STALL_S) {
                c->dropping = true; /* the reader stopped: keep the workers going, drop lines */
                DT_DEBUG("console fd %d stalled for %.1f s: dropping worker lines", fd, idle);
            } else {
                int left = (int)((DT_OUT_CONSOLE_STALL_S - idle) * 1000) + 1;
                ms = ms < 0 || left < ms ? left : ms;
            }
        }
    }
    return ms;
}

uint64_t dt_out_console_dropped(void)
{
    return con[1].dropped_total + con[2].dropped_total;
}

void dt_out_console_close(double wait_s)
{
    bool stalled = false; /* a console already stopped taking bytes */
    for (int fd = 1; fd <= 2; fd++) {
        console *c = &con[fd];
        if (!c->open)
            continue;
        con_flush(fd);
        con_report_drops(fd);
        if (c->dropped && !c->gone) { /* still full: the note goes last, if it ever fits */
            uint64_t d = c->dropped;
            c->dropped = 0;
            char note[160];
            int k = snprintf(note, sizeof note,
                             "dtrain: %llu line%s dropped: the console did not keep up\n",
                             (unsigned long long)d, d == 1 ? "" : "s");
            if (k > 0 && c->buf && c->len + (size_t)k <= DT_OUT_CONSOLE_CAP)
                con_store(c, note, (size_t)k);
        }
        if (dt_out_console_pending(fd) && c->dropping)
            stalled = true;
    }
    /* Bounded, both consoles together: a reader that stopped for good must not keep the agent
     * from exiting. When one is known to have stalled, DT_OUT_CONSOLE_STALL_S more (a live
     * console drains in far less; stdout and stderr are often the same pipe). */
    if (stalled && wait_s > DT_OUT_CONSOLE_STALL_S)
        wait_s = DT_OUT_CONSOLE_STALL_S;
    double last = mono_s();
    for (;;) {
        struct pollfd pf[2];
        int n = 0;
        for (int fd = 1; fd <= 2; fd++) {
            size_t before = con[fd].len;
            con_flush(fd);
            if (con[fd].len < before)
                last = mono_s();
            if (dt_out_console_pending(fd))
                pf[n++] = (struct pollfd){fd, POLLOUT, 0};
        }
        double idle = mono_s() - last;
        if (n == 0 || idle >= wait_s)
            break;
        int ms = (int)((wait_s - idle) * 1000) + 1;
        poll(pf, (nfds_t)n, ms > 100 ? 100 : ms);
    }
    for (int fd = 1; fd <= 2; fd++) {
        console *c = &con[fd];
        if (!c->open)
            continue;
        if (c->saved >= 0) {
            if (c->len == 0) /* drained: give the process its blocking console back */
                dup2(c->saved, fd);
            close(c->saved); /* else keep ours: a later write must not hang on a dead reader */
            c->saved = -1;
        }
        free(c->buf);
        c->buf = NULL;
        c->len = c->off = 0;
        c->open = false;
        c->nonblock = c->sock = c->dropping = false;
    }
}

void dt_out_console_write(int fd, const char *text, size_t len)
{
    if (fd < 1 || fd > 2)
        return;
    con_put(fd, text, len, false);
}

int dt_out_prepare(dt_out_stream *s, const dt_out_plan *plan, int which, int rank, const char *path,
                   int *child_fd, dt_err *err)
{
    memset(s, 0, sizeof *s);
    s->fd = s->file_fd = s->console_fd = -1;
    snprintf(s->prefix, sizeof s->prefix, "[%d]:", rank);
    *child_fd = -1;
    int file = -1;
    if (plan->file) {
        file = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
        if (file < 0)
            return dt_err_errno(err, errno, "cannot open worker log %s", path);
    }
    if (!plan->console) {
        /* The worker writes straight to its file (or to /dev/null): no copy through the agent. */
        if (file < 0)
            file = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (file < 0)
            return dt_err_errno(err, errno, "cannot open /dev/null");
        *child_fd = file;
        return 0;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        int e = errno;
        if (file >= 0)
            close(file);
        return dt_err_errno(err, e, "cannot create a pipe for rank %d's output", rank);
    }
    dt_set_nonblock(p[0], true);
    s->fd = p[0];
    s->file_fd = file;
    s->console_fd = which;
    *child_fd = p[1];
    return 0;
}

/* Writes prefix + the stored partial line + extra[0..n) + '\n' in one write; empties the line. */
static void emit_line(dt_out_stream *s, const char *extra, size_t n)
{
    static char out[sizeof s->prefix + DT_OUT_LINE_MAX + 2];
    size_t k = strlen(s->prefix);
    memcpy(out, s->prefix, k);
    if (s->len) {
        memcpy(out + k, s->line, s->len);
        k += s->len;
    }
    memcpy(out + k, extra, n);
    k += n;
    out[k++] = '\n';
    s->len = 0;
    if (s->console_fd >= 1 && s->console_fd <= 2)
        con_put(s->console_fd, out, k, true);
}

static void forward(dt_out_stream *s, const char *p, size_t n)
{
    const char *end = p + n;
    if (s->file_fd >= 0) {
        int rc = dt_write_all(s->file_fd, p, n);
        if (rc) {
            DT_WARN("writing the log file of %s failed: %s; the file stops here", s->prefix,
                    strerror(-rc));
            close(s->file_fd);
            s->file_fd = -1;
        }
    }
    if (s->console_fd < 0)
        return;
    while (p < end) {
        size_t room = DT_OUT_LINE_MAX - s->len;
        size_t avail = (size_t)(end - p);
        size_t look = avail < room ? avail : room;
        const char *nl = memchr(p, '\n', look);
        if (nl) {
            emit_line(s, p, (size_t)(nl - p));
            p = nl + 1;
            continue;
        }
        if (look == room) { /* the line reached the cap: write this piece as a line of its own */
            emit_line(s, p, look);
            p += look;
            continue;
        }
        if (!s->line && !(s->line = malloc(DT_OUT_LINE_MAX))) {
            emit_line(s, p, look); /* no memory to keep it: show it as is */
        } else {
            memcpy(s->line + s->len, p, look);
            s->len += look;
        }
        p += look;
    }
}

static void close_stream(dt_out_stream *s)
{
    if (s->len)
        emit_line(s, "", 0);
    free(s->line);
    s->line = NULL;
    if (s->fd >= 0)
        close(s->fd);
    if (s->file_fd >= 0)
        close(s->file_fd);
    s->fd = s->file_fd = -1;
}

int dt_out_pump(dt_out_stream *s)
{
    char buf[65536];
    if (s->fd < 0)
        return 0;
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
            return 1;
        int e = errno;
        close_stream(s);
        return -e;
    }
    if (n == 0) {
        close_stream(s);
        return 0;
    }
    s->bytes += (size_t)n;
    forward(s, buf, (size_t)n);
    return 1;
}

void dt_out_finish(dt_out_stream *s)
{
    /* Bounded: a grandchild that keeps the pipe open and keeps writing cannot hold us here. */
    for (int i = 0; i < 64 && s->fd >= 0; i++) {
        char buf[65536];
        ssize_t n = read(s->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        s->bytes += (size_t)n;
        forward(s, buf, (size_t)n);
    }
    close_stream(s);
}

/* ---- the agent's log lines -------------------------------------------------------------- */

static pid_t log_tid; /* the agent's thread (dt_out_console_take_logs) */

/* Log lines of other threads, queued for the agent's thread (bounded). */
static pthread_mutex_t side_mu = PTHREAD_MUTEX_INITIALIZER;
static char side_buf[64 * 1024];
static size_t side_len;

void dt_out_console_drain_logs(void)
{
    char copy[sizeof side_buf];
    pthread_mutex_lock(&side_mu);
    size_t n = side_len;
    memcpy(copy, side_buf, n);
    side_len = 0;
    pthread_mutex_unlock(&side_mu);
    if (n)
        dt_out_console_write(STDERR_FILENO, copy, n);
}

static void log_sink(const char *line, size_t len)
{
    if (gettid() == log_tid) {
        dt_out_console_drain_logs();
        dt_out_console_write(STDERR_FILENO, line, len);
        return;
    }
    pthread_mutex_lock(&side_mu);
    if (side_len + len <= sizeof side_buf) {
        memcpy(side_buf + side_len, line, len);
        side_len += len;
    }
    pthread_mutex_unlock(&side_mu);
}

void dt_out_console_take_logs(void)
{
    log_tid = gettid();
    dt_log_set_sink(log_sink);
}
