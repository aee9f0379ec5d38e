/* util.c - see util.h. */
#include "common/util.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t dt_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dt_now_s(void) { return (double)dt_now_ns() * 1e-9; }

double dt_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dt_sleep_ms(int ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int dt_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads n bytes at off (pread), or from the file position (read) when at is false. */
static int read_full(int fd, void *buf, size_t n, bool at, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = at ? pread(fd, p, n, (off_t)off) : read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EPIPE;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int dt_read_all(int fd, void *buf, size_t n) { return read_full(fd, buf, n, false, 0); }

int dt_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    return read_full(fd, buf, n, true, off);
}

int dt_set_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
        return -errno;
    return 0;
}

int dt_set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (fcntl(fd, F_SETFL, fl) < 0)
        return -errno;
    return 0;
}

bool dt_strlcpy(char *dst, const char *src, size_t size)
{
    if (size == 0)
        return false;
    size_t n = strlen(src);
    if (n >= size) {
        memcpy(dst, src, size - 1);
        dst[size - 1] = '\0';
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

static int norm_char(int c)
{
    c = tolower(c);
    return c == '_' ? '-' : c;
}

int dt_edit_distance(const char *a, const char *b)
{
    /* Optimal string alignment: insert, delete, substitute and swap of neighbours cost 1. */
    size_t la = strlen(a), lb = strlen(b);
    if (la > 128 || lb > 128)
        return INT_MAX / 2;
    static _Thread_local int d[129][129];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ai = norm_char((unsigned char)a[i - 1]), bj = norm_char((unsigned char)b[j - 1]);
            int v = d[i - 1][j - 1] + (ai != bj);
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ai == norm_char((unsigned char)b[j - 2]) &&
                norm_char((unsigned char)a[i - 2]) == bj && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

const char *dt_nearest(const char *word, const char *const *candidates, size_t n)
{
    const char *best = NULL;
    int best_d = INT_MAX;
    for (size_t i = 0; i < n; i++) {
        if (!candidates[i])
            continue;
        int d = dt_edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    int limit = (int)strlen(word) / 3;
    if (limit < 2)
        limit = 2;
    return best_d <= limit ? best : NULL;
}

char *dt_trim(char *s)
{
    char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (p != s)
        memmove(s, p, strlen(p) + 1);
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int dt_parse_i64(const char *s, int64_t *out)
{
    char *end;
    if (!s || !*s)
        return -EINVAL;
    /* Decimal (010 is ten, not octal eight), or hexadecimal after an explicit 0x. */
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '+' || *p == '-')
        p++;
    int base = p[0] == '0' && (p[1] == 'x' || p[1] == 'X') ? 16 : 10;
    errno = 0;
    long long v = strtoll(s, &end, base);
    if (errno == ERANGE)
        return -ERANGE;
    if (*end != '\0' || end == s)
        return -EINVAL;
    *out = v;
    return 0;
}

int dt_parse_int(const char *s, int *out)
{
    int64_t v;
    int rc = dt_parse_i64(s, &v);
    if (rc)
        return rc;
    if (v < INT_MIN || v > INT_MAX)
        return -ERANGE;
    *out = (int)v;
    return 0;
}

int dt_parse_double(const char *s, double *out)
{
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE)
        return -ERANGE;
    if (*end != '\0' || end == s || !isfinite(v))
        return -EINVAL;
    *out = v;
    return 0;
}

int dt_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

int dt_parse_duration(const char *s, double *seconds)
{
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -EINVAL;
    double mul = 1;
    if (!strcmp(end, "") || !strcmp(end, "s"))
        mul = 1;
    else if (!strcmp(end, "ms"))
        mul = 1e-3;
    else if (!strcmp(end, "m") || !strcmp(end, "min"))
        mul = 60;
    else if (!strcmp(end, "h"))
        mul = 3600;
    else
        return -EINVAL;
    *seconds = v * mul;
    return 0;
}

int dt_parse_bytes(const char *s, int64_t *bytes)
{
    static const struct { const char *suffix; double mul; } units[] = {
        {"", 1},         {"B", 1},           {"K", 1e3},          {"M", 1e6},
        {"G", 1e9},      {"T", 1e12},        {"Ki", 1024.0},      {"Mi", 1048576.0},
        {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
    };
    char *end;
    if (!s || !*s || isspace((unsigned char)*s))
        return -EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -EINVAL;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        size_t n = strlen(units[k].suffix);
        /* "1GiB", "1Gi", "1G" and "1GB" alike; a bare "B" only after a number */
        if (strncmp(end, units[k].suffix, n) ||
            (end[n] && (strcmp(end + n, "B") || !n)))
            continue;
        double b = v * units[k].mul;
        if (b >= 9.2e18)
            return -ERANGE;
        if (b != floor(b))
            return -EINVAL; /* a fraction of a byte */
        *bytes = (int64_t)b;
        return 0;
    }
    return -EINVAL;
}

int dt_read_file(const char *path, char **data, size_t *len, dt_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *buf = NULL;
    size_t cap = 0, n = 0;
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot open %s", path);
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                close(fd);
                return dt_err_set(err, -ENOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return dt_err_errno(err, e, "cannot read %s", path);
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    if (len)
        *len = n;
    return 0;
}

int dt_mkdir_p(const char *path, dt_err *err)
{
    char tmp[PATH_MAX];
    if (!dt_strlcpy(tmp, path, sizeof tmp))
        return dt_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return dt_err_errno(err, errno, "cannot create directory %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return dt_err_errno(err, errno, "cannot create directory %s", tmp);
    struct stat st;
    if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_err_set(err, -ENOTDIR, "%s exists and is not a directory", tmp);
    return 0;
}

int dt_rm_rf(const char *path, dt_err *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : dt_err_errno(err, errno, "cannot stat %s", path);
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return dt_err_errno(err, errno, "cannot open directory %s", path);
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof sub, "%s/%s", path, de->d_name) >= (int)sizeof sub) {
                closedir(d);
                return dt_err_set(err, -ENAMETOOLONG, "path too long under %s", path);
            }
            int rc = dt_rm_rf(sub, err);
            if (rc) {
                closedir(d);
                return rc;
            }
        }
        closedir(d);
        if (rmdir(path) != 0)
            return dt_err_errno(err, errno, "cannot remove directory %s", path);
    } else if (unlink(path) != 0) {
        return dt_err_errno(err, errno, "cannot remove %s", path);
    }
    return 0;
}

const char *dt_hostname(void)
{
    static char host[256];
    if (!host[0]) {
        if (gethostname(host, sizeof host) != 0)
            strcpy(host, "localhost");
        host[sizeof host - 1] = '\0';
    }
    return host;
}

int dt_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
