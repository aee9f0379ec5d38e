/* errfile.c - see errfile.h. */
#include "runtime/job/errfile.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/util.h"

int dt_errfile_write(const char *path, int rank, int exit_code, const char *message, dt_err *err)
{
    if (!path)
        path = dt_env("DTRAIN_ERROR_FILE");
    if (!path)
        path = getenv("TORCHELASTIC_ERROR_FILE");
    if (!path || !*path)
        return 0;
    char ts[32], tmp[4096];
    snprintf(ts, sizeof ts, "%lld", (long long)time(NULL));
    cJSON *root = cJSON_CreateObject(), *msg = cJSON_AddObjectToObject(root, "message");
    cJSON_AddStringToObject(msg, "message", message);
    cJSON *extra = cJSON_AddObjectToObject(msg, "extraInfo");
    cJSON_AddStringToObject(extra, "py_callstack", "");
    cJSON_AddStringToObject(extra, "timestamp", ts);
    cJSON *dt = cJSON_AddObjectToObject(root, "dtrain");
    cJSON_AddNumberToObject(dt, "rank", rank);
    cJSON_AddStringToObject(dt, "host", dt_hostname());
    cJSON_AddNumberToObject(dt, "pid", (double)getpid());
    cJSON_AddNumberToObject(dt, "exit_code", exit_code);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory writing the error file");
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    int rc = 0;
    if (!f) {
        rc = dt_err_errno(err, errno, "cannot write error file %s", tmp);
    } else {
        fprintf(f, "%s\n", text);
        if (fclose(f) != 0 || rename(tmp, path) != 0) {
            rc = dt_err_errno(err, errno, "cannot write error file %s", path);
            unlink(tmp);
        }
    }
    free(text);
    return rc;
}

int dt_errfile_read(const char *path, char *message, size_t cap, double *timestamp, dt_err *err)
{
    char *data = NULL;
    message[0] = '\0';
    if (timestamp)
        *timestamp = 0;
    if (access(path, F_OK) != 0)
        return -ENOENT;
    int rc = dt_read_file(path, &data, NULL, err);
    if (rc)
        return rc;
    cJSON *root = cJSON_Parse(data);
    free(data);
    if (!root)
        return dt_err_set(err, -EBADMSG, "error file %s is not JSON", path);
    cJSON *msg = cJSON_GetObjectItemCaseSensitive(root, "message");
    const char *text = NULL, *ts = NULL;
    if (cJSON_IsString(msg)) {
        text = msg->valuestring;
    } else if (cJSON_IsObject(msg)) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(msg, "message");
        cJSON *extra = cJSON_GetObjectItemCaseSensitive(msg, "extraInfo");
        text = cJSON_IsString(m) ? m->valuestring : NULL;
        cJSON *t = extra ? cJSON_GetObjectItemCaseSensitive(extra, "timestamp") : NULL;
        ts = cJSON_IsString(t) ? t->valuestring : NULL;
    }
    if (text)
        dt_strlcpy(message, text, cap);
    if (ts && timestamp)
        *timestamp = atof(ts);
    cJSON_Delete(root);
    return text ? 0 : dt_err_set(err, -EBADMSG, "error file %s has no message", path);
}
