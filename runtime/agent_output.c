/* agent_output.c - see agent_output.h. */
#include "runtime/agent_output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

static bool console_gone[3]; /* indexed by fd 1 or 2: EPIPE seen, drop from now on */

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

void dt_out_console_write(int fd, const char *text, size_t len)
{
    if (fd < 1 || fd > 2 || console_gone[fd])
        return;
    while (len > 0) {
        ssize_t w = write(fd, text, len);
        if (w > 0) {
            text += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* A console someone made non-blocking: wait until it drains. */
            struct pollfd p = {fd, POLLOUT, 0};
            poll(&p, 1, 1000);
            continue;
        }
        console_gone[fd] = true; /* EPIPE or worse: stop writing there, keep the job going */
        return;
    }
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
    dt_out_console_write(s->console_fd, out, k);
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
