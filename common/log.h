/* log.h - levelled logging with a host/pid/rank prefix.
 *
 * Level from DTRAIN_LOG (debug, info, warn, error, off; default info). Every line is written to
 * stderr with one write(2), so lines from many processes never interleave mid-line:
 *
 *     dtrain[host:1234 agent] INFO: message
 *     dtrain[host:1234 r3] WARN store.c:120: message
 *
 * The level is checked before anything is formatted. Warnings and errors carry file:line.
 */
#ifndef DT_LOG_H
#define DT_LOG_H

#include <stddef.h>

enum { DT_LOG_DEBUG = 0, DT_LOG_INFO = 1, DT_LOG_WARN = 2, DT_LOG_ERROR = 3, DT_LOG_OFF = 4 };

extern int dt_log_level;

/* Reads DTRAIN_LOG and the host name. Safe to call more than once. */
void dt_log_init(void);
/* Role shown in the prefix: "agent", "store", "worker"... (copied). */
void dt_log_set_role(const char *role);
/* Global rank shown in the prefix as r<rank>; -1 shows the role instead. */
void dt_log_set_rank(int rank);
/* Parses a level name; returns -1 when unknown. */
int dt_log_parse_level(const char *s);

/* Where finished lines go instead of write(2) to stderr: fn(line, len) gets one whole line
 * (newline included), from whichever thread logged; NULL restores stderr. The agent uses it to
 * queue its lines behind worker output on a console that must never block it. */
void dt_log_set_sink(void (*fn)(const char *line, size_t len));

void dt_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A progress line on a terminal (stderr): text (no newline) replaces the one shown, which stays
 * open until dt_log_progress_end or the next log line, which ends it first (so log lines never
 * glue onto it, and no empty line follows later). Safe from several threads once used; a process
 * that never calls it takes no lock in dt_log_write. */
void dt_log_progress(const char *text);
/* Ends an open progress line with a newline (nothing when none is open). */
void dt_log_progress_end(void);

#define DT_LOG_AT(lvl, ...)                                                                        \
    do {                                                                                           \
        if ((lvl) >= dt_log_level)                                                                 \
            dt_log_write((lvl), __FILE__, __LINE__, __VA_ARGS__);                                  \
    } while (0)

#define DT_DEBUG(...) DT_LOG_AT(DT_LOG_DEBUG, __VA_ARGS__)
#define DT_INFO(...) DT_LOG_AT(DT_LOG_INFO, __VA_ARGS__)
#define DT_WARN(...) DT_LOG_AT(DT_LOG_WARN, __VA_ARGS__)
#define DT_ERROR(...) DT_LOG_AT(DT_LOG_ERROR, __VA_ARGS__)

#endif
