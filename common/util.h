/* util.h - small helpers every layer uses: clocks, robust fd I/O, strings, numbers, files.
 * Nothing here allocates behind the caller's back except where the contract says so. */
#ifndef DT_UTIL_H
#define DT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define DT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- clocks ---- */
uint64_t dt_now_ns(void);        /* CLOCK_MONOTONIC in nanoseconds */
int dt_cmp_double(const void *a, const void *b); /* qsort comparator: doubles, ascending */
double dt_now_s(void);           /* CLOCK_MONOTONIC in seconds */
double dt_wall_s(void);          /* CLOCK_REALTIME in seconds (for logs and events) */
void dt_sleep_ms(int ms);        /* sleeps the whole time, EINTR retried */

/* ---- file descriptors ---- */
/* Write all n bytes (EINTR retried). 0 or -errno. */
int dt_write_all(int fd, const void *buf, size_t n);
/* Read exactly n bytes (EINTR retried). 0, -errno, or -EPIPE at end of file before n bytes. */
int dt_read_all(int fd, void *buf, size_t n);
/* The same at offset off (pread: the file position is left alone). */
int dt_pread_all(int fd, void *buf, size_t n, uint64_t off);
int dt_set_cloexec(int fd);
int dt_set_nonblock(int fd, bool on);

/* ---- strings ---- */
/* snprintf into dst that always terminates; returns true when nothing was cut. */
bool dt_strlcpy(char *dst, const char *src, size_t size);
/* Edit distance (insert, delete, substitute; case-insensitive; '-' and '_' equal). */
int dt_edit_distance(const char *a, const char *b);
/* The candidate closest to `word`, or NULL when none is within a distance that makes it a
 * plausible typo (about a third of the word's length, at least 2). */
const char *dt_nearest(const char *word, const char *const *candidates, size_t n);
/* Trims leading and trailing white space in place; returns s. */
char *dt_trim(char *s);

/* ---- numbers: whole string must parse, else -EINVAL (range errors -ERANGE) ---- */
/* Integers are decimal whatever their leading zeros ("010" is 10, never octal), or hexadecimal
 * with an explicit 0x ("0x1F"); an optional sign before either. */
int dt_parse_i64(const char *s, int64_t *out);
int dt_parse_int(const char *s, int *out);
int dt_parse_double(const char *s, double *out);
/* true/false, yes/no, on/off, 1/0 (case-insensitive). */
int dt_parse_bool(const char *s, bool *out);
/* "30", "30s", "500ms", "2m", "1h" -> seconds. */
int dt_parse_duration(const char *s, double *seconds);
/* A size in bytes: a number (fractions allowed where the product is whole) with an optional
 * suffix K M G T (powers of 1000) or Ki Mi Gi Ti (powers of 1024), each optionally followed by
 * B ("1GiB", "512Mi", "2G", "1e9"). 0, -EINVAL (not a size, negative, a fraction of a byte) or
 * -ERANGE (2^63 and more); *bytes untouched on failure. */
int dt_parse_bytes(const char *s, int64_t *bytes);

/* ---- files ---- */
/* Reads a whole file into a malloc'd, NUL-terminated buffer (caller frees). */
int dt_read_file(const char *path, char **data, size_t *len, dt_err *err);
/* mkdir -p with mode 0755. */
int dt_mkdir_p(const char *path, dt_err *err);
/* Removes a directory tree (like rm -rf); missing is not an error. */
int dt_rm_rf(const char *path, dt_err *err);
/* Host name without domain (static buffer). */
const char *dt_hostname(void);

#endif
