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
 * The console never blocks the agent (whose one thread also reaps workers, handles signals and
 * sends the rendezvous heartbeats). dt_out_console_open gives the agent a non-blocking
 * description of its stdout and stderr when they are pipes or terminals (reopened through
 * /proc/self/fd, so the shell's own description is untouched); sockets are written with
 * MSG_DONTWAIT; regular files as they are. What the console does not take at once waits in a
 * bounded buffer per console fd:
 *   - above DT_OUT_CONSOLE_HIGH bytes the agent stops reading the workers' pipes (they wait, as
 *     they would on a slow terminal): a slow reader loses nothing;
 *   - when the reader takes nothing for DT_OUT_CONSOLE_STALL_S seconds (it stopped: a pager left
 *     open, a stopped process), the agent reads the workers again and drops whole lines, counted,
 *     until the buffer drains below DT_OUT_CONSOLE_LOW; then it prints "N lines dropped: the
 *     console did not keep up". Per-rank log files (--redirects/--tee) keep every byte.
 * If the agent's console goes away (EPIPE), console output is dropped from then on and the
 * workers carry on; file output is unaffected.
 */
#ifndef DT_AGENT_OUTPUT_H
#define DT_AGENT_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DT_OUT_LINE_MAX 16384 /* bytes of one line kept before it is cut */
#define DT_OUT_CONSOLE_CAP (1u << 20)   /* bytes waiting for one console fd, at most */
#define DT_OUT_CONSOLE_HIGH (256u << 10) /* above this the workers' pipes are not read */
#define DT_OUT_CONSOLE_LOW (64u << 10)   /* a stalled console below this takes lines again */
#define DT_OUT_CONSOLE_STALL_S 2.0       /* no progress this long: the reader stopped */

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

/* Writes the agent's own text (whole lines) to console fd 1 or 2: at once when the console takes
 * it, else queued behind what is waiting (waiting up to DT_OUT_CONSOLE_STALL_S for room when the
 * buffer is full, then dropped and counted). Dropped once the console has gone away. Without
 * dt_out_console_open, a plain blocking write. */
void dt_out_console_write(int fd, const char *text, size_t len);

/* Prepares the agent's fds 1 and 2 for non-blocking writes (see the top of this file). Call once
 * before any worker starts; pair with dt_out_console_close. Returns 0 (a console that cannot be
 * reopened is written as it is). Not thread-safe: the agent's thread only. */
int dt_out_console_open(dt_err *err);

/* Whether bytes wait for console fd (1 or 2): the caller then watches fd for EPOLLOUT and calls
 * dt_out_console_tick when it is writable. */
bool dt_out_console_pending(int fd);

/* Whether the caller should stop reading the workers' pipes for now (a console buffer is above
 * DT_OUT_CONSOLE_HIGH and its reader still makes progress). */
bool dt_out_console_throttled(void);

/* Writes what the consoles take, detects a stalled reader, prints the dropped-lines note once
 * there is room. Returns the milliseconds until it must run again to notice a stall (-1: only
 * when a console becomes writable). */
int dt_out_console_tick(void);

/* Makes the console the log's sink (dt_log_set_sink): the agent's own log lines are queued on the
 * console behind the workers' lines, neither lost nor able to block the agent. The calling
 * thread is taken as the agent's (the console buffer is its alone): lines of other threads (the
 * store server's) wait in a bounded buffer (64 KiB; lines that do not fit are dropped) until the
 * agent's thread calls dt_out_console_drain_logs, since written straight to the console they
 * could land in the middle of a worker line only partly out. Call after dt_out_console_open;
 * dt_log_set_sink(NULL) undoes it. */
void dt_out_console_take_logs(void);

/* On the agent's thread: the queued log lines of other threads to the console. */
void dt_out_console_drain_logs(void);

/* Lines dropped so far (both consoles, since dt_out_console_open). */
uint64_t dt_out_console_dropped(void);

/* Flushes what waits, giving up after wait_s seconds without progress (the dropped-lines note
 * goes last), and gives the process back its original (blocking) descriptions when everything
 * went out. Accepts a console never opened. */
void dt_out_console_close(double wait_s);

#endif
