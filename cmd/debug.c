/* debug.c - `dtrain debug dump RUN_DIR` (ask a running job's agents for a dump of their
 * workers' flight records and a hang verdict) and `dtrain debug analyze RUN_DIR` (the verdict
 * again, from the files a dump left). RUN_DIR is the run's directory, <log dir>/<run id>: the
 * one holding events.jsonl and flight/. See docs/failures.md.
 */
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/util.h"
#include "runtime/launch/agent_flight.h"
#include "runtime/launch/flight_verdict.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain debug dump RUN_DIR [--timeout SECONDS]\n"
            "       dtrain debug analyze RUN_DIR\n"
            "\n"
            "RUN_DIR is a run's directory, <log dir>/<run id> (where events.jsonl is).\n"
            "  dump     asks the job's agents (running) for a dump of every worker's flight\n"
            "           records and a hang verdict, and prints the verdict (node 0's agent also\n"
            "           logs it and writes it to events.jsonl); waits up to --timeout (30) s\n"
            "  analyze  prints the hang verdict of the last dump from RUN_DIR/flight/ (the\n"
            "           rank_<N>.json files, verdict.json)\n");
}

static int flight_dir(const char *run_dir, char *out, size_t cap)
{
    struct stat st;
    if (snprintf(out, cap, "%s/flight", run_dir) >= (int)cap || stat(out, &st) != 0 ||
        !S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "dtrain debug: %s has no flight/ directory: give the run's directory, <log "
                "dir>/<run id>, the one with events.jsonl (the agent logs it as \"logs and "
                "events.jsonl: DIR\")\n",
                run_dir);
        return 2;
    }
    return 0;
}

static cJSON *read_json(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    if (dt_read_file(path, &text, &len, NULL) != 0)
        return NULL;
    cJSON *o = cJSON_Parse(text);
    free(text);
    return o;
}

static double num(const cJSON *o, const char *k, double def)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

/* ---- analyze ------------------------------------------------------------------------------- */

/* The verdict's input: verdict.json's (node 0's dump), each rank's entry replaced by its own
 * rank_<N>.json of the same dump where there is one; without verdict.json, the rank files
 * alone (their nodes as they name them). */
static cJSON *analysis_input(const char *dir)
{
    char path[DT_PATH_MAX + 320];
    snprintf(path, sizeof path, "%s/verdict.json", dir);
    cJSON *in = read_json(path);
    if (in)
        cJSON_DeleteItemFromObject(in, "verdict");
    double dump = in ? num(in, "dump", -1) : -1;
    DIR *d = opendir(dir);
    cJSON *files = cJSON_CreateArray();
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int r;
        char tail[8];
        if (sscanf(de->d_name, "rank_%d.jso%1s", &r, tail) != 2 || strstr(de->d_name, ".tmp"))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        cJSON *o = read_json(path);
        if (!o)
            continue;
        if (dump >= 0 && num(o, "dump", -2) != dump) {
            cJSON_Delete(o);
            continue; /* another dump's (a later one on another node) */
        }
        cJSON *t = dt_verdict_trim(o);
        cJSON_Delete(o);
        if (t)
            cJSON_AddItemToArray(files, t);
    }
    if (d)
        closedir(d);
    if (!in) {
        if (cJSON_GetArraySize(files) == 0) {
            cJSON_Delete(files);
            return NULL;
        }
        in = cJSON_CreateObject();
        double t = 0;
        int world = 0;
        cJSON *nodes = cJSON_AddArrayToObject(in, "nodes"), *f;
        cJSON_ArrayForEach(f, files)
        {
            t = num(f, "time", 0) > t ? num(f, "time", 0) : t;
            int r = (int)num(f, "rank", 0);
            world = r + 1 > world ? r + 1 : world;
            cJSON *no = cJSON_CreateObject();
            cJSON_AddNumberToObject(no, "node", num(f, "node", -1));
            cJSON_AddStringToObject(no, "host",
                                    cJSON_GetStringValue(cJSON_GetObjectItem(f, "host"))
                                        ? cJSON_GetStringValue(cJSON_GetObjectItem(f, "host"))
                                        : "");
            cJSON_AddNumberToObject(no, "rank_base", r);
            cJSON_AddNumberToObject(no, "nproc", 1);
            cJSON_AddBoolToObject(no, "answered", true);
            cJSON_AddItemToArray(nodes, no);
        }
        cJSON_AddNumberToObject(in, "time", t);
        cJSON_AddNumberToObject(in, "world_size", world);
        cJSON *trig = cJSON_AddObjectToObject(in, "trigger");
        cJSON_AddStringToObject(trig, "kind", "request");
        cJSON_AddStringToObject(trig, "reason", "the rank files of flight/ (no verdict.json: "
                                                "node 0's files are elsewhere)");
        cJSON_AddItemToObject(in, "ranks", files);
        return in;
    }
    /* the files replace verdict.json's entries of the same ranks */
    cJSON *ranks = cJSON_GetObjectItemCaseSensitive(in, "ranks"), *f;
    cJSON_ArrayForEach(f, files)
    {
        int r = (int)num(f, "rank", -1);
        for (int i = 0; i < cJSON_GetArraySize(ranks); i++)
            if ((int)num(cJSON_GetArrayItem(ranks, i), "rank", -2) == r) {
                cJSON_ReplaceItemInArray(ranks, i, cJSON_Duplicate(f, true));
                r = -3;
                break;
            }
        if (r != -3)
            cJSON_AddItemToArray(ranks, cJSON_Duplicate(f, true));
    }
    cJSON_Delete(files);
    return in;
}

static int analyze(const char *run_dir)
{
    char dir[DT_PATH_MAX + 16];
    int rc = flight_dir(run_dir, dir, sizeof dir);
    if (rc)
        return rc;
    cJSON *in = analysis_input(dir);
    if (!in) {
        fprintf(stderr, "dtrain debug analyze: %s holds no flight records (no dump was made: "
                        "`dtrain debug dump RUN_DIR` asks a running job for one)\n", dir);
        return 1;
    }
    dt_verdict v;
    dt_err e = {0};
    rc = dt_verdict_make(in, &v, &e);
    cJSON_Delete(in);
    if (rc) {
        fprintf(stderr, "dtrain debug analyze: %s\n", e.msg);
        return 1;
    }
    for (char *p = v.text; *p;) {
        char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        printf("hang verdict: %.*s\n", len, p);
        p += len + (nl ? 1 : 0);
    }
    dt_verdict_free(&v);
    return 0;
}

/* ---- dump ---------------------------------------------------------------------------------- */

static int dump(const char *run_dir, double timeout_s)
{
    char dir[DT_PATH_MAX + 16], req[DT_PATH_MAX + 32], tmp[DT_PATH_MAX + 48],
        verdict[DT_PATH_MAX + 32];
    int rc = flight_dir(run_dir, dir, sizeof dir);
    if (rc)
        return rc;
    snprintf(req, sizeof req, "%s/request", dir);
    snprintf(tmp, sizeof tmp, "%s/request.tmp.%d", dir, (int)getpid());
    snprintf(verdict, sizeof verdict, "%s/verdict.txt", dir);
    struct stat st;
    struct timespec before = {0, 0};
    if (stat(verdict, &st) == 0)
        before = st.st_mtim;
    char why[256];
    snprintf(why, sizeof why, "dtrain debug dump (pid %d on %s)\n", (int)getpid(), dt_hostname());
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(why, f) < 0 || fclose(f) != 0 || rename(tmp, req) != 0) {
        fprintf(stderr, "dtrain debug dump: cannot write %s: %s\n", req, strerror(errno));
        unlink(tmp);
        return 1;
    }
    double deadline = dt_now_s() + timeout_s;
    bool taken = false;
    while (dt_now_s() < deadline) {
        taken = taken || access(req, F_OK) != 0;
        if (taken && stat(verdict, &st) == 0 &&
            (st.st_mtim.tv_sec > before.tv_sec ||
             (st.st_mtim.tv_sec == before.tv_sec && st.st_mtim.tv_nsec > before.tv_nsec))) {
            dt_sleep_ms(50); /* renamed into place: whole */
            char *text = NULL;
            size_t len = 0;
            if (dt_read_file(verdict, &text, &len, NULL) == 0) {
                fputs(text, stdout);
                free(text);
                return 0;
            }
        }
        dt_sleep_ms(100);
    }
    if (!taken) {
        unlink(req);
        fprintf(stderr, "dtrain debug dump: no agent took the request in %g s: is the job running, "
                        "with built-in workers, and is %s its run directory? (its agents look "
                        "for %s every %g s)\n",
                timeout_s, run_dir, req, DT_AGENT_FLIGHT_TICK_S);
    } else {
        fprintf(stderr, "dtrain debug dump: an agent took the request but no verdict came in %g "
                        "s (node 0's agent writes it; on a log directory that is not shared, "
                        "run this on node 0's host)\n", timeout_s);
    }
    return 1;
}

int dt_cmd_debug(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc < 3) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "analyze") && argc == 3)
        return analyze(argv[2]);
    if (!strcmp(argv[1], "dump")) {
        double timeout = 30;
        if (argc == 5 && !strcmp(argv[3], "--timeout")) {
            char *end = NULL;
            timeout = strtod(argv[4], &end);
            if (end == argv[4] || *end || !(timeout > 0)) {
                fprintf(stderr, "dtrain debug dump: --timeout %s is not a number of seconds\n",
                        argv[4]);
                return 2;
            }
        } else if (argc != 3) {
            usage(stderr);
            return 2;
        }
        return dump(argv[2], timeout);
    }
    fprintf(stderr, "dtrain debug: unknown command \"%s\" (dump or analyze)\n", argv[1]);
    usage(stderr);
    return 2;
}
