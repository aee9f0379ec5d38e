/* agent_output.h - worker output: whole lines, prefixed with the global rank, to the console and
 * to log files.
 *
 * A worker's stdout and stderr are either given a file directly (--redirects without --tee: the
 * agent never touches the bytes), /dev/null (a filtered rank with no file), or a pipe that the
 * agent reads. From a pipe the agent writes each complete line to its own stdout (or stderr) as
 * "[RANK]:line\n" with a single write, so lines of different workers never mix, and the raw bytes
 * to the worker's log file when --tee asks for one.
 *
 * Memory is bounded: a line longer than DT_OUT_LINE_MAX bytes (a progress bar drawn with '\r', a
 * worker printing megabytes without a newline) is cut and written in pieces of that size, each
 * as its own prefixed line. The partial-line buffer is allocated only while a partial line exists.
 *
 * If the agent's console goes away (EPIPE), console output is dropped from then on and the
 * workers carry on; file output is unaffected.
 */
#ifndef DT_AGENT_OUTPUT_H
#define DT_AGENT_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define DT_OUT_LINE_MAX 16384 /* bytes of one line kept before it is cut */

/* One worker stream (stdout or stderr) as the agent sees it. */
typedef struct dt_out_stream {
    int fd;             /* read end of the worker's pipe (non-blocking, close-on-exec); -1 = none */
    int console_fd;     /* the agent's 1 or 2 to show lines on; -1 = not shown */
    int file_fd;        /* raw copy to a log file (tee); -1 = none. Owned. */
    char prefix[24];    /* "[3]:" */
    char *line;         /* partial line, malloc'd lazily (DT_OUT_LINE_MAX bytes); owned */
    size_t len;         /* bytes in line */
    size_t bytes;       /* bytes read so far (for events and tests) */
} dt_out_stream;

/* How one worker stream is wired, decided from --redirects/--tee/--local-ranks-filter. */
typedef struct dt_out_plan {
    bool console;       /* lines go to the agent's console */
    bool file;          /* bytes go to a log file */
} dt_out_plan;

/* Parses a --redirects / --tee value ("3", or "0:3,1:1" per local rank) for one local rank into
 * a mask: 1 stdout, 2 stderr. Unlisted ranks of the per-rank form get 0. Invalid text gives 0
 * (the value was validated by the config already). */
int dt_out_mode_for(const char *spec, int local_rank);

/* Whether local_rank passes a --local-ranks-filter value ("" passes everything). */
bool dt_out_rank_shown(const char *filter, int local_rank);

/* Prepares the child side of one stream. plan says where the bytes go; path is the log file
 * (used when plan->file). On success *child_fd is the fd to give the worker (owned by the caller,
 * to be closed after the spawn) and s is ready to be pumped (s->fd == -1 when the worker writes
 * to a file or /dev/null directly). which: 1 stdout, 2 stderr. */
int dt_out_prepare(dt_out_stream *s, const dt_out_plan *plan, int which, int rank, const char *path,
                   int *child_fd, dt_err *err);

/* Reads once from s->fd and forwards the complete lines. Returns 1 while the stream is open, 0
 * when it reached end of file (the partial line is flushed, the fd closed), or a negative errno.
 * Never blocks. */
int dt_out_pump(dt_out_stream *s);

/* Reads whatever is left without blocking, flushes the partial line (newline added) and closes
 * everything. Accepts a stream that is already closed. */
void dt_out_finish(dt_out_stream *s);

/* Writes text to the agent's console fd as one write (retrying on EAGAIN and EINTR); drops it
 * once the console has gone away. */
void dt_out_console_write(int fd, const char *text, size_t len);

#endif
