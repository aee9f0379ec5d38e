/* preflight.c - the job's files and directories on this node, checked before anything starts;
 * see preflight.h. */
#include "runtime/job/preflight.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

/* One line "SOURCE: key: message" (SOURCE: where the key was set at the last load; for a key
 * that kept its default, the job file, else "job"). */
static void add(dt_config_errors *errs, const dt_job *job, const char *section, const char *key,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void add(dt_config_errors *errs, const dt_job *job, const char *section, const char *key,
                const char *fmt, ...)
{
    if (!errs)
        return;
    if (errs->count >= (int)DT_ARRAY_LEN(errs->lines)) {
        errs->count++;
        return;
    }
    const char *src = dt_job_source(section, key);
    char *dst = errs->lines[errs->count++];
    size_t cap = sizeof errs->lines[0];
    int n = snprintf(dst, cap, "%s: %s.%s%s: ", src ? src : job->path[0] ? job->path : "job",
                     section, key, src ? "" : " (its default)");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < cap)
        vsnprintf(dst + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---- what the job reads ------------------------------------------------------------------- */

/* Whether path can be read: a regular file that opens, or a directory that lists. 0 or -errno
 * (-EINVAL: neither a file nor a directory). */
static int readable(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return -errno;
        closedir(d);
        return 0;
    }
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}

/* data.path or data.val_path (key): a file, a directory, or a glob (* ? [) matching at least one
 * regular file, readable. */
static void check_data(const dt_job *job, const char *key, const char *path,
                       dt_config_errors *errs)
{
    if (!path[0])
        return;
    if (strpbrk(path, "*?[")) {
        glob_t g;
        int r = glob(path, 0, NULL, &g);
        int rc = r == 0 && g.gl_pathc > 0 ? readable(g.gl_pathv[0]) : -ENOENT;
        if (r == 0)
            globfree(&g);
        if (rc)
            add(errs, job, "data", key, "no readable file matches %s%s%s (fix the pattern; data "
                "paths are checked on every node, %s here)", path, rc == -ENOENT ? "" : ": ",
                rc == -ENOENT ? "" : strerror(-rc), dt_hostname());
        return;
    }
    int rc = readable(path);
    if (rc == -EINVAL)
        add(errs, job, "data", key, "%s is neither a file nor a directory", path);
    else if (rc)
        add(errs, job, "data", key, "cannot read %s: %s (fix the path, or give %s.%s=PATH after "
            "the job file; data paths are checked on every node, %s here)", path, strerror(-rc),
            "data", key, dt_hostname());
}

/* ---- what the job writes ------------------------------------------------------------------ */

/* Whether a directory can be written at dir: when it exists it must be a directory, else its
 * nearest existing ancestor must be (the directories between are made later). A file is created
 * and removed there. 0, or -errno with *at (cap bytes) the path that failed. */
static int writable(const char *dir, char *at, size_t cap)
{
    char p[DT_PATH_MAX + 64];
    struct stat st;
    if (!dt_strlcpy(p, dir[0] ? dir : ".", sizeof p)) {
        dt_strlcpy(at, dir, cap);
        return -ENAMETOOLONG;
    }
    for (;;) {
        if (stat(p, &st) == 0)
            break;
        if (errno != ENOENT && errno != ENOTDIR) { /* ENOTDIR: a file above it, found below */
            dt_strlcpy(at, p, cap);
            return -errno;
        }
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/') /* "a/b/" -> "a/b" */
            p[--n] = '\0';
        char *slash = strrchr(p, '/');
        if (!slash)
            dt_strlcpy(p, ".", sizeof p);
        else if (slash == p)
            p[1] = '\0';
        else
            *slash = '\0';
    }
    dt_strlcpy(at, p, cap);
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    char probe[DT_PATH_MAX + 128];
    snprintf(probe, sizeof probe, "%s/.dtrain-probe-%d-XXXXXX", p, (int)getpid());
    int fd = mkostemp(probe, O_CLOEXEC);
    if (fd < 0)
        return -errno;
    close(fd);
    unlink(probe);
    return 0;
}

static void check_dir(const dt_job *job, const char *section, const char *key, const char *dir,
                      const char *what, dt_config_errors *errs)
{
    char at[DT_PATH_MAX + 64];
    int rc = writable(dir, at, sizeof at);
    if (!rc)
        return;
    bool self = !strcmp(at, dir);
    if (rc == -ENOTDIR)
        add(errs, job, section, key, "%s cannot hold %s: %s is a file, not a directory; give "
            "%s.%s a directory", dir, what, at, section, key);
    else
        add(errs, job, section, key, "cannot write %s in %s: %s%s%s (checked before starting "
            "anything, by creating a file there); give %s.%s a writable directory", what, dir,
            self ? "" : at, self ? "" : ": ", strerror(-rc), section, key);
}

int dt_preflight_check(const dt_job *job, dt_config_errors *errs)
{
    int before = errs ? errs->count : 0;
    if (job->data_type != DT_DATA_SYNTHETIC) {
        check_data(job, "path", job->data_path, errs);
        check_data(job, "val_path", job->val_path, errs);
    }
    check_dir(job, "job", "output_dir", job->output_dir, "metrics.jsonl and logs", errs);
    if (job->ckpt_dir[0]) {
        check_dir(job, "checkpoint", "dir", job->ckpt_dir, "checkpoints", errs);
    } else {
        char d[DT_PATH_MAX + 32];
        snprintf(d, sizeof d, "%s/checkpoints", job->output_dir);
        /* the output dir's own problem is said once, above */
        if (errs && errs->count == before)
            check_dir(job, "checkpoint", "dir", d, "checkpoints", errs);
    }
    return errs && errs->count > before ? -EINVAL : 0;
}
