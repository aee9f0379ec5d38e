/* log.c - see log.h. */
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int dt_log_level = DT_LOG_INFO;

static char log_host[64] = "?";
static char log_role[32] = "dtrain";
static int log_rank = -1;

static void (*log_sink)(const char *line, size_t len);

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

/* The progress line: guarded by progress_mu once progress_used (set by the first
 * dt_log_progress, before any other thread could depend on it). */
static pthread_mutex_t progress_mu = PTHREAD_MUTEX_INITIALIZER;
static volatile bool progress_used;
static bool progress_open;

static void write_stderr(const char *buf, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(STDERR_FILENO, buf + off, n - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        off += (size_t)w;
    }
}

void dt_log_progress(const char *text)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "\r\033[K%s", text);
    if (n < 0)
        return;
    if (n >= (int)sizeof buf)
        n = (int)sizeof buf - 1;
    progress_used = true;
    pthread_mutex_lock(&progress_mu);
    write_stderr(buf, (size_t)n);
    progress_open = true;
    pthread_mutex_unlock(&progress_mu);
}

void dt_log_progress_end(void)
{
    if (!progress_used)
        return;
    pthread_mutex_lock(&progress_mu);
    if (progress_open)
        write_stderr("\n", 1);
    progress_open = false;
    pthread_mutex_unlock(&progress_mu);
}

int dt_log_parse_level(const char *s)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    if (!s)
        return -1;
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(s, names[i]))
            return i;
    if (!strcasecmp(s, "warning"))
        return DT_LOG_WARN;
    return -1;
}

void dt_log_init(void)
{
    const char *env = getenv("DTRAIN_LOG");
    int lvl = dt_log_parse_level(env);
    if (lvl >= 0)
        dt_log_level = lvl;
    if (gethostname(log_host, sizeof log_host) != 0)
        strcpy(log_host, "?");
    log_host[sizeof log_host - 1] = '\0';
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    if (env && *env && lvl < 0) {
        /* Said once per job: the children (workers) inherit the level in effect. */
        static const char *const names[] = {"debug", "info", "warn", "error", "off"};
        DT_WARN("DTRAIN_LOG=%.40s is not a log level (debug, info, warn, error or off); using %s",
                env, names[dt_log_level]);
        setenv("DTRAIN_LOG", names[dt_log_level], 1);
    }
}

void dt_log_set_role(const char *role)
{
    snprintf(log_role, sizeof log_role, "%s", role ? role : "dtrain");
}

void dt_log_set_rank(int rank) { log_rank = rank; }

void dt_log_set_sink(void (*fn)(const char *line, size_t len)) { log_sink = fn; }

void dt_log_write(int level, const char *file, int line, const char *fmt, ...)
{
    char buf[4096];
    int n;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (level < 0 || level > DT_LOG_ERROR)
        level = DT_LOG_ERROR;
    if (log_rank >= 0)
        n = snprintf(buf, sizeof buf, "dtrain[%s:%d r%d] %s", log_host, (int)getpid(), log_rank,
                     level_names[level]);
    else
        n = snprintf(buf, sizeof buf, "dtrain[%s:%d %s] %s", log_host, (int)getpid(), log_role,
                     level_names[level]);
    if (level >= DT_LOG_WARN || dt_log_level == DT_LOG_DEBUG)
        n += snprintf(buf + n, sizeof buf - (size_t)n, " %s:%d", base, line);
    n += snprintf(buf + n, sizeof buf - (size_t)n, ": ");
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    if (n > 0 && buf[n - 1] != '\n')
        buf[n++] = '\n';
    if (log_sink) {
        log_sink(buf, (size_t)n);
        return;
    }
    /* One write per line: the kernel keeps it whole on pipes for up to PIPE_BUF bytes. */
    if (!progress_used) {
        write_stderr(buf, (size_t)n);
        return;
    }
    pthread_mutex_lock(&progress_mu); /* a progress line shown: end it first */
    if (progress_open)
        write_stderr("\n", 1);
    progress_open = false;
    write_stderr(buf, (size_t)n);
    pthread_mutex_unlock(&progress_mu);
}
