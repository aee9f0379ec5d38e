/* err.h - the error-return convention every layer of dtrain uses.
 *
 * A function that can fail takes `dt_err *err` as its last argument (NULL allowed), returns 0 on
 * success or a negative errno-style code (-EINVAL, -ETIMEDOUT, -ENOMEM, ...) on failure, and on
 * failure writes into err->msg what failed, where, and what the user can do about it. Library
 * code never exits: only cmd/ and the worker's top level decide to exit.
 *
 * On failure, outputs promised by the function are left as documented at the function (usually
 * untouched); on success err is left unchanged.
 */
#ifndef DT_ERR_H
#define DT_ERR_H

#include <errno.h>
#include <stdarg.h>

#define DT_ERR_MSG_MAX 1024

typedef struct dt_err {
    int code;                  /* negative errno-style code of the last failure, 0 if none */
    char msg[DT_ERR_MSG_MAX];  /* human-readable message: what failed, where, what to do */
} dt_err;

/* Records `code` (a negative value; a positive one is negated) and the formatted message in err
 * (if not NULL). Returns the negative code, so `return dt_err_set(err, -EINVAL, ...)` reads
 * naturally. */
int dt_err_set(dt_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int dt_err_vset(dt_err *err, int code, const char *fmt, va_list ap);

/* Prepends context to an existing message: "opening checkpoint: " + old message. Returns
 * err->code (or -EIO when err is NULL). */
int dt_err_prefix(dt_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Same as dt_err_set with strerror(errnum) appended: "...: No such file or directory". */
int dt_err_errno(dt_err *err, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void dt_err_clear(dt_err *err);

/* The message of err, or a fixed string when err is NULL or empty. Never NULL. */
const char *dt_err_str(const dt_err *err);

#endif
