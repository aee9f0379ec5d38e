/* err.c - error records: see err.h for the convention. */
#include "common/err.h"

#include <stdio.h>
#include <string.h>

int dt_err_vset(dt_err *err, int code, const char *fmt, va_list ap)
{
    if (code > 0)
        code = -code;
    if (code == 0)
        code = -EIO;
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int dt_err_set(dt_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    code = dt_err_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int dt_err_errno(dt_err *err, int errnum, const char *fmt, ...)
{
    va_list ap;
    int code;
    va_start(ap, fmt);
    code = dt_err_vset(err, errnum ? -errnum : -EIO, fmt, ap);
    va_end(ap);
    if (err) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, ": %s", strerror(errnum));
    }
    return code;
}

int dt_err_prefix(dt_err *err, const char *fmt, ...)
{
    char head[DT_ERR_MSG_MAX];
    va_list ap;
    if (!err)
        return -EIO;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    size_t hl = strlen(head), ol = strlen(err->msg);
    if (hl >= sizeof err->msg)
        hl = sizeof err->msg - 1;
    if (hl + ol >= sizeof err->msg)
        ol = sizeof err->msg - 1 - hl;
    memmove(err->msg + hl, err->msg, ol);
    memcpy(err->msg, head, hl);
    err->msg[hl + ol] = '\0';
    if (err->code == 0)
        err->code = -EIO;
    return err->code;
}

void dt_err_clear(dt_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

const char *dt_err_str(const dt_err *err)
{
    if (!err || !err->msg[0])
        return "(no error message)";
    return err->msg;
}
