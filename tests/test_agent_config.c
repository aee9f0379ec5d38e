/* test_agent_config.c - a configuration error of the built-in worker (exit 2: here a
 * checkpoint.resume path that does not exist) on a job of several nodes is final: no node spends
 * a restart on it, every agent ends with exit 2, and the nodes whose own workers did not report
 * it say which node did. A failure that is not a configuration error still restarts every node.
 *
 * Real agents (build/dtrain) on 127.0.0.1: static jobs with node 0 hosting the store on port 0
 * (the test reads the port from its log), elastic (c10d) jobs on a store the test runs on port
 * 0. Heartbeats and timeouts are shortened through --rdzv-conf; every wait is bounded and
 * generous, and the checks are on behaviour (exit codes, log lines, events), not on speed.
 * The races (a node that already saw the round fail, one already joining the next round) are
 * driven through the rendezvous API with in-process agents, for both backends.
 *
 * A world that parallel.tensor x parallel.pipeline does not divide is a configuration error
 * too: refused at load when the job fixes the world, by the agent before any worker starts when
 * only the rendezvous knows it (an elastic job's round).
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/store_server.h"
#include "tests/harness.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

static const char *conf_static = "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=20,"
                                 "join_timeout=60,close_timeout=10 --stop-grace 5 "
                                 "--monitor-interval 0.05";

/* A job file the built-in worker accepts; the test breaks it with checkpoint.resume. */
static const char *job_file(void)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/cfg.ini", TMP);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fprintf(f, "[model]\ntype = mlp\n[data]\ntype = synthetic\n[train]\nsteps = 5\n");
    fclose(f);
    return path;
}

/* The job file's overrides for node k: a missing checkpoint when bad (a configuration error). */
static void overrides(char *buf, size_t cap, int k, bool bad)
{
    if (bad)
        snprintf(buf, cap, "job.output_dir=%s/out%d checkpoint.resume=%s/nonexistent/step_5", TMP,
                 k, TMP);
    else
        snprintf(buf, cap, "job.output_dir=%s/out%d", TMP, k);
}

typedef dt_test_group job;

/* Starts the agents of a static job with `nodes` nodes: node 0 first (store on port 0), then the
 * others on the port it printed. what(k) is node k's worker part of the command line. */
static void start_static(job *j, int nodes, const char *id, const char *opts, char what[][2048])
{
    char line[8192], out[1024];
    for (int k = 0; k < nodes; k++) {
        if (k == 1)
            j->port = dt_test_read_port(j->out[0], "hosting the rendezvous store at 127.0.0.1:",
                                        30 * dt_test_timeout_scale());
        snprintf(out, sizeof out, "%s/%s_node%d.out", TMP, id, k);
        snprintf(line, sizeof line,
                 "%s --nnodes %d --node-rank %d --master-addr 127.0.0.1 --master-port %d "
                 "--rdzv-id %s --log-dir %s/logs %s %s",
                 BIN, nodes, k, k == 0 ? 0 : j->port, id, TMP, opts, what[k]);
        dt_test_group_spawn(j, k, line, out);
    }
}

/* Starts the agents of an elastic job (c10d, --nnodes nn) on a store the test runs. */
static void start_c10d(job *j, int nodes, const char *id, const char *nn, const char *opts,
                       char what[][2048])
{
    char line[8192], out[1024];
    j->store = dt_test_store_start(&j->port);
    for (int k = 0; k < nodes; k++) {
        snprintf(out, sizeof out, "%s/%s_agent%d.out", TMP, id, k);
        snprintf(line, sizeof line,
                 "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s --nnodes %s "
                 "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=20,join_timeout=60,"
                 "last_call_timeout=3,close_timeout=10 --monitor-interval 0.05 --stop-grace 5 "
                 "--log-dir %s/logs %s %s",
                 BIN, j->port, id, nn, TMP, opts, what[k]);
        dt_test_group_spawn(j, k, line, out);
    }
}

/* Waits for the agents, then stops the store. */
static void wait_job(job *j, double timeout_s)
{
    dt_test_group_wait(j, timeout_s);
    dt_test_group_kill(j);
}

/* Every events*.jsonl of the run id, one after the other (malloc'd; "" when there is none). */
static char *all_events(const char *id)
{
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/logs/%s", TMP, id);
    char *all = strdup("");
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && all && (e = readdir(d))) {
        if (strncmp(e->d_name, "events", 6))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *s = dt_test_slurp(path);
        if (!s)
            continue;
        char *grown = realloc(all, strlen(all) + strlen(s) + 1);
        if (grown) {
            all = grown;
            strcat(all, s);
        }
        free(s);
    }
    if (d)
        closedir(d);
    return all;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Lines of text that hold both a and b. */
static int lines_with(const char *text, const char *a, const char *b)
{
    int n = 0;
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, len);
        if (line && strstr(line, a) && strstr(line, b))
            n++;
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    return n;
}

/* Both agents ended with 2, nobody restarted, and each events file that was opened ends with 2.
 * `told`: the agents that must name the other node's configuration error. */
static void check_config_end(job *j, const char *id, const bool *told)
{
    bool ok = true;
    for (int k = 0; k < j->n; k++) {
        DT_CHECK_INT(j->code[k], 2);
        ok = ok && j->code[k] == 2;
        char *o = dt_test_slurp(j->out[k]);
        DT_REQUIRE(o != NULL);
        bool restarted = strstr(o, "restarting every worker") != NULL;
        DT_CHECK_MSG(!restarted, "agent %d restarted on a configuration error", k);
        ok = ok && !restarted;
        if (told && told[k]) {
            bool named = strstr(o, "reports a configuration error (exit 2) in its workers: not "
                                   "restarting") != NULL;
            DT_CHECK_MSG(named, "agent %d does not say which node had the configuration error", k);
            ok = ok && named;
        }
        free(o);
    }
    char *ev = all_events(id);
    DT_REQUIRE(ev != NULL);
    DT_CHECK_INT(count_of(ev, "\"event\":\"restart\""), 0);
    DT_CHECK(count_of(ev, "\"event\":\"end\"") >= 1);
    DT_CHECK_INT(count_of(ev, "\"event\":\"end\""),
                 lines_with(ev, "\"event\":\"end\"", "\"exit_code\":2,"));
    free(ev);
    if (!ok)
        dt_test_group_dump(j);
}

/* (a) Static, 2 nodes, --max-restarts=3, checkpoint.resume missing on both: both agents end
 * with 2 after the first attempt, none restarts. */
static void test_static_both_bad(void)
{
    job j;
    char what[2][2048], ov[1024], opts[1024];
    dt_test_group_init(&j);
    const char *ini = job_file();
    for (int k = 0; k < 2; k++) {
        overrides(ov, sizeof ov, k, true);
        snprintf(what[k], sizeof what[k], "%s %s", ini, ov);
    }
    snprintf(opts, sizeof opts, "%s --nproc-per-node 1 --max-restarts 3", conf_static);
    start_static(&j, 2, "cs2", opts, what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    check_config_end(&j, "cs2", NULL);
    for (int k = 0; k < 2; k++)
        DT_CHECK(dt_test_count_text(j.out[k], "nonexistent/step_5: cannot read the checkpoint "
                                              "directory") >= 1);
}

/* Static, 2 nodes, the checkpoint.resume path missing on node 1 only: node 0's worker is
 * stopped (or fails on the lost peer), and node 0 still ends with 2, naming node 1. */
static void test_static_one_bad(void)
{
    job j;
    char what[2][2048], ov[1024], opts[1024];
    dt_test_group_init(&j);
    const char *ini = job_file();
    for (int k = 0; k < 2; k++) {
        overrides(ov, sizeof ov, k, k == 1);
        snprintf(what[k], sizeof what[k], "%s %s ddp.timeout=60", ini, ov);
    }
    snprintf(opts, sizeof opts, "%s --nproc-per-node 1 --max-restarts 3", conf_static);
    start_static(&j, 2, "cs1", opts, what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(j.code[0], 2);
    DT_CHECK_INT(j.code[1], 2);
    DT_CHECK(dt_test_count_text(j.out[1], "nonexistent/step_5: cannot read the checkpoint "
                                          "directory") >= 1);
    /* Node 0 learns it from the rendezvous and says where to look. */
    char *o = dt_test_slurp(j.out[0]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "node 1 (");
    DT_CHECK_CONTAINS(o, "reports a configuration error (exit 2) in its workers: not restarting");
    free(o);
    if (j.code[0] != 2 || j.code[1] != 2)
        dt_test_group_dump(&j);
}

/* (b) Elastic (c10d, --nnodes=1:2), checkpoint.resume missing on both agents: both end with 2,
 * none restarts. */
static void test_elastic_both_bad(void)
{
    job j;
    char what[2][2048], ov[1024];
    dt_test_group_init(&j);
    const char *ini = job_file();
    for (int k = 0; k < 2; k++) {
        overrides(ov, sizeof ov, k, true);
        snprintf(what[k], sizeof what[k], "%s %s", ini, ov);
    }
    start_c10d(&j, 2, "ce2", "1:2", "--nproc-per-node 1 --max-restarts 3", what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    check_config_end(&j, "ce2", NULL);
}

/* (c) Not a configuration error: a command's exit 2 and a worker's exit 1 on a 2-node job are
 * restarted on every node as before (the second attempt fails with 1, the third succeeds). */
static void test_static_failure_restarts(void)
{
    job j;
    char what[2][2048], opts[1024];
    dt_test_group_init(&j);
    for (int k = 0; k < 2; k++)
        snprintf(what[k], sizeof what[k], "%s",
                 "-- sh -c 'echo attempt=$DTRAIN_ATTEMPT rank=$RANK; [ $GROUP_RANK = 1 ] || "
                 "exit 0; [ $DTRAIN_ATTEMPT = 0 ] && exit 2; [ $DTRAIN_ATTEMPT = 1 ] && exit 1; "
                 "exit 0'");
    snprintf(opts, sizeof opts, "%s --nproc-per-node 1 --max-restarts 3", conf_static);
    start_static(&j, 2, "cr2", opts, what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    bool ok = true;
    for (int k = 0; k < 2; k++) {
        DT_CHECK_INT(j.code[k], 0);
        ok = ok && j.code[k] == 0;
        DT_CHECK_INT(dt_test_count_text(j.out[k], "restarting every worker on every node"), 2);
    }
    char *ev = all_events("cr2");
    DT_REQUIRE(ev != NULL);
    DT_CHECK_INT(count_of(ev, "\"event\":\"restart\""), 4); /* 2 per node */
    free(ev);
    if (!ok)
        dt_test_group_dump(&j);
}

/* The loss of the last "train" record in DIR/metrics.jsonl (NAN when there is none). */
static double last_loss(const char *dir)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *s = dt_test_slurp(path);
    double loss = NAN;
    for (char *line = s ? strtok(s, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        const char *p = strstr(line, "\"loss\":");
        if (strstr(line, "\"type\":\"train\"") && p)
            loss = strtod(p + 7, NULL);
    }
    free(s);
    return loss;
}

/* Runs the 2-node job `id` to `steps` steps, node k writing to dir[k]; both must succeed. */
static void run_unshared(job *j, const char *id, char dir[][1024], int steps)
{
    char what[2][2048], opts[1024];
    snprintf(opts, sizeof opts, "%s --nproc-per-node 1 --max-restarts 0", conf_static);
    dt_test_group_init(j);
    for (int k = 0; k < 2; k++)
        snprintf(what[k], sizeof what[k],
                 "%.900s job.output_dir=%.900s train.steps=%d checkpoint.every=10 "
                 "job.log_every=5 train.eval_every=0",
                 job_file(), dir[k], steps);
    start_static(j, 2, id, opts, what);
    wait_job(j, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(j->code[0], 0);
    DT_CHECK_INT(j->code[1], 0);
    if (j->code[0] || j->code[1])
        dt_test_group_dump(j);
}

/* Node-local checkpoint directories (no shared file system): each node's job.output_dir is its
 * own, so only node 0's, where rank 0 saves, holds checkpoints. Launched again with more steps,
 * node 1 finds none and takes rank 0's state over the network: the job resumes at step 20 on
 * both nodes and ends bit for bit as the same job whose nodes share one directory. Then with the
 * nodes swapped, rank 0 finds none and takes rank 1's. */
static void test_unshared_checkpoint_dir(void)
{
    char dir[2][1024];
    double loss[2];
    job j;
    for (int shared = 0; shared < 2; shared++) {
        for (int k = 0; k < 2; k++)
            snprintf(dir[k], sizeof dir[k], "%s/%s%d", TMP, shared ? "shared" : "local",
                     shared ? 0 : k);
        for (int run = 0; run < 2; run++) {
            char id[32];
            snprintf(id, sizeof id, "ul%d%d", shared, run);
            run_unshared(&j, id, dir, run ? 30 : 20);
            if (run == 1) {
                DT_CHECK(dt_test_count_text(j.out[0], "resumed from") == 1);
                int took = dt_test_count_text(j.out[1], "took rank 0's model and optimiser state");
                DT_CHECK_MSG(took == !shared, "shared %d: node 1 adopted rank 0's state %d times",
                             shared, took);
                if (!shared)
                    DT_CHECK(dt_test_count_text(j.out[1], "found no checkpoint") == 1);
            }
        }
        loss[shared] = last_loss(dir[0]);
    }
    DT_CHECK_MSG(isfinite(loss[0]) && loss[0] == loss[1],
                 "step 30 after resuming: node-local directories %.9g, shared %.9g", loss[0],
                 loss[1]);
    /* The nodes swapped (rank 0 now where no checkpoint is, as after a regroup): every rank takes
     * rank 1's step 30 instead of starting over from rank 0's nothing. */
    for (int k = 0; k < 2; k++)
        snprintf(dir[k], sizeof dir[k], "%s/local%d", TMP, 1 - k);
    run_unshared(&j, "ulsw", dir, 40);
    DT_CHECK_INT(dt_test_count_text(j.out[0], "resumed from rank 1's checkpoint, over the network: "
                                              "step 30"), 1);
    DT_CHECK_INT(dt_test_count_text(j.out[0], "done after 40 steps"), 1);
}

/* ---- the rendezvous API with in-process agents ------------------------------------------- */

typedef struct inproc {
    dt_rdzv *rz;
    dt_rdzv_round rd;
    dt_rdzv_status st;
    int rc;
    dt_err err;
} inproc;

static void *next_thread(void *arg)
{
    inproc *a = arg;
    a->rc = dt_rdzv_next(a->rz, &a->rd, &a->st, &a->err);
    return NULL;
}

static void open_inproc(inproc *a, const char *backend, const char *nnodes, int node, int port,
                        const char *id)
{
    dt_rdzv_opts o;
    memset(&o, 0, sizeof o);
    memset(a, 0, sizeof *a);
    dt_strlcpy(o.backend, backend, sizeof o.backend);
    dt_strlcpy(o.nnodes, nnodes, sizeof o.nnodes);
    o.node_rank = node;
    dt_strlcpy(o.endpoint_host, "127.0.0.1", sizeof o.endpoint_host);
    o.endpoint_port = port;
    dt_strlcpy(o.run_id, id, sizeof o.run_id);
    o.local_world_size = 1;
    o.max_restarts = 3;
    o.join_timeout = 60; /* far beyond what the test waits for: a timeout is a failure */
    o.close_timeout = 2;
    o.heartbeat_interval = 0.2;
    o.heartbeat_timeout = 30;
    o.last_call_timeout = 0.5;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_open(&a->rz, &o, &e), &e);
}

/* Polls until the round ends (bounded); returns how. */
static dt_rdzv_status poll_end(inproc *a, double timeout_s)
{
    double deadline = dt_test_now() + timeout_s;
    dt_rdzv_status st;
    dt_err e = {0};
    for (;;) {
        DT_REQUIRE_OK(dt_rdzv_poll(a->rz, &st, &e), &e);
        if (st.state != DT_RDZV_RUNNING)
            return st;
        DT_REQUIRE(dt_test_now() < deadline);
        dt_sleep_ms(20);
    }
}

static dt_rdzv_failure failure_of(int node, int code)
{
    dt_rdzv_failure f;
    memset(&f, 0, sizeof f);
    f.time = dt_wall_s();
    dt_strlcpy(f.host, "testhost", sizeof f.host);
    f.node = node;
    f.rank = node;
    f.exit_code = code;
    snprintf(f.message, sizeof f.message, "exited with code %d", code);
    return f;
}

/* Three agents. Node 1's worker fails (exit 1): every node sees the round FAILED; node 1 goes
 * on to join the next round. Then node 0's workers report a configuration error: node 2, which
 * saw FAILED and has not decided yet, sees the job ABORTED as a setup error on its next poll;
 * node 1, already waiting in the next round, ends with the setup error too (not at the join
 * timeout); node 0's own poll says the same, and the failures of both nodes are recorded. */
static void api_races(const char *backend, const char *nnodes, int next_rc)
{
    dt_store_server *srv = NULL;
    dt_store_server_opts so;
    dt_err e = {0};
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    DT_REQUIRE_OK(dt_store_server_start(&srv, &so, &e), &e);
    int port = dt_store_server_port(srv);
    static inproc a[3];
    for (int i = 0; i < 3; i++)
        open_inproc(&a[i], backend, nnodes, i, port, backend);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        DT_REQUIRE(pthread_create(&th[i], NULL, next_thread, &a[i]) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++)
        DT_REQUIRE_OK(a[i].rc, &a[i].err);
    inproc *by_g[3] = {NULL, NULL, NULL}; /* c10d ranks by join order */
    for (int i = 0; i < 3; i++) {
        DT_REQUIRE(a[i].rd.group_rank >= 0 && a[i].rd.group_rank < 3);
        by_g[a[i].rd.group_rank] = &a[i];
    }
    for (int g = 0; g < 3; g++)
        DT_REQUIRE(by_g[g] != NULL);
    inproc *n0 = by_g[0], *n1 = by_g[1], *n2 = by_g[2];

    dt_rdzv_failure f1 = failure_of(1, 1);
    DT_REQUIRE_OK(dt_rdzv_failed(n1->rz, &f1, 1, &e), &e);
    for (int g = 0; g < 3; g++)
        DT_CHECK_INT((int)poll_end(by_g[g], 10).state, (int)DT_RDZV_FAILED);
    DT_REQUIRE(pthread_create(&th[1], NULL, next_thread, n1) == 0);
    dt_sleep_ms(300); /* most likely waiting in the next round by now; either way it must end */

    dt_rdzv_failure f0 = failure_of(0, 2);
    const char *why = "node 0 (testhost:1) reports a configuration error (exit 2) in its workers";
    DT_REQUIRE_OK(dt_rdzv_abort_config(n0->rz, &f0, 1, why, &e), &e);

    dt_rdzv_status st = poll_end(n2, 10);
    DT_CHECK_INT((int)st.state, (int)DT_RDZV_ABORTED);
    DT_CHECK(st.setup_error);
    DT_CHECK_CONTAINS(st.why, why);
    st = poll_end(n0, 10);
    DT_CHECK_INT((int)st.state, (int)DT_RDZV_ABORTED);
    DT_CHECK(st.setup_error);

    pthread_join(th[1], NULL);
    DT_CHECK_INT(n1->rc, next_rc);
    DT_CHECK(n1->st.setup_error);
    DT_CHECK_CONTAINS(n1->st.why, why);
    DT_CHECK_CONTAINS(n1->err.msg, "reports a configuration error");

    /* Node 2 does not start another attempt either. */
    inproc *late = n2;
    late->rc = dt_rdzv_next(late->rz, &late->rd, &late->st, &late->err);
    DT_CHECK_INT(late->rc, next_rc);
    DT_CHECK(late->st.setup_error);

    dt_rdzv_failure *all = NULL;
    int n = 0;
    DT_REQUIRE_OK(dt_rdzv_failures(n0->rz, &all, &n, &e), &e);
    DT_CHECK_INT(n, 2);
    free(all);
    for (int i = 0; i < 3; i++)
        dt_rdzv_close(a[i].rz);
    dt_store_server_stop(srv);
}

static void test_api_races_static(void)
{
    api_races("static", "3", -EINVAL);
}

static void test_api_races_c10d(void)
{
    api_races("c10d", "3:3", -ECANCELED);
}

/* ---- the data x tensor x pipeline layout against the world ----------------------------------- */

/* A world fixed by the job (nodes x a number of workers) that parallel.tensor x
 * parallel.pipeline does not divide is refused at load: exit 2, the message naming the keys and
 * the valid world sizes, and nothing started (no events, no worker line). */
static void test_layout_fixed_world_refused(void)
{
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s --nproc-per-node 3 --log-dir %s/logs --rdzv-id lf3 %s job.output_dir=%s/lf3 "
             "parallel.pipeline=2",
             BIN, TMP, job_file(), TMP);
    int rc = dt_test_run(cmd, &out, 60);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "elastic.nnodes = 1 x elastic.nproc_per_node = 3: world size 3 is not "
                           "divisible by parallel.tensor x parallel.pipeline = 1 x 2 = 2");
    DT_CHECK_CONTAINS(out, "run a multiple of 2 ranks (2, 4, 6, ...)");
    DT_CHECK_CONTAINS(out, "nothing was started");
    DT_CHECK(!strstr(out, "layout:") && !strstr(out, "[0]:"));
    char *ev = all_events("lf3");
    DT_REQUIRE(ev != NULL);
    DT_CHECK_STR(ev, ""); /* no agent ran */
    free(ev);
    free(out);
}

/* An elastic job (c10d, --nnodes=1:2, one worker per node) with parallel.pipeline = 2 loads (a
 * world of 2 is within reach), but the round closes with one node: a world of 1, which the
 * agent refuses before it starts a worker, with exit 2 and the same message. */
static void test_layout_elastic_world_refused_by_agent(void)
{
    job j;
    char what[1][2048];
    dt_test_group_init(&j);
    snprintf(what[0], sizeof what[0], "%s job.output_dir=%s/le1 parallel.pipeline=2",
             job_file(), TMP);
    start_c10d(&j, 1, "le1", "1:2", "--nproc-per-node 1 --max-restarts 3", what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(j.code[0], 2);
    char *o = dt_test_slurp(j.out[0]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "this round gathered 1 node: world size 1 is not divisible by "
                         "parallel.tensor x parallel.pipeline = 1 x 2 = 2");
    DT_CHECK_CONTAINS(o, "run a multiple of 2 ranks (2, 4, 6, ...)");
    DT_CHECK_CONTAINS(o, "no worker was started");
    DT_CHECK(!strstr(o, "layout:") && !strstr(o, "[0]:"));
    DT_CHECK(!strstr(o, "restarting every worker"));
    char *ev = all_events("le1");
    DT_REQUIRE(ev != NULL);
    DT_CHECK_INT(count_of(ev, "\"event\":\"rendezvous\""), 1);
    DT_CHECK_INT(count_of(ev, "\"event\":\"start\""), 0);
    DT_CHECK_INT(lines_with(ev, "\"event\":\"end\"", "\"exit_code\":2,"), 1);
    if (j.code[0] != 2)
        dt_test_group_dump(&j);
    free(ev);
    free(o);
}

/* The same elastic job with two workers per node: the round's world of 2 holds one pipeline of
 * 2 stages, so the workers start, each logs its coordinates, and metrics.jsonl records the
 * layout (D = 1, re-derived from the world at the start). */
static void test_layout_elastic_world_accepted(void)
{
    job j;
    char what[1][2048], path[2048];
    dt_test_group_init(&j);
    snprintf(what[0], sizeof what[0],
             "%s job.output_dir=%s/la2 parallel.pipeline=2 checkpoint.resume=never "
             "train.eval_every=0",
             job_file(), TMP);
    start_c10d(&j, 1, "la2", "1:2", "--nproc-per-node 2 --max-restarts 0", what);
    wait_job(&j, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(j.code[0], 0);
    char *o = dt_test_slurp(j.out[0]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "layout: data 1 x tensor 1 x pipeline 2; this rank: dp 0, tp 0, pp 0");
    DT_CHECK_CONTAINS(o, "layout: data 1 x tensor 1 x pipeline 2; this rank: dp 0, tp 0, pp 1");
    DT_CHECK(!strstr(o, "is not divisible"));
    /* both stages draw data-parallel rank 0's samples: a step is one rank's batch */
    DT_CHECK_CONTAINS(o, "5 steps of 8 samples (batch 8 x accum 1 x 1 data-parallel ranks)");
    snprintf(path, sizeof path, "%s/la2/metrics.jsonl", TMP);
    char *m = dt_test_slurp(path);
    DT_REQUIRE(m != NULL);
    DT_CHECK(!strncmp(m, "{\"type\":\"layout\",\"world_size\":2,\"dp\":1,\"tp\":1,\"pp\":2,",
                      strlen("{\"type\":\"layout\",\"world_size\":2,\"dp\":1,\"tp\":1,\"pp\":2,")));
    if (j.code[0] != 0)
        dt_test_group_dump(&j);
    free(m);
    free(o);
}

static const dt_test tests[] = {
    {"static_both_bad", test_static_both_bad, 180},
    {"static_one_bad", test_static_one_bad, 180},
    {"elastic_both_bad", test_elastic_both_bad, 180},
    {"static_failure_restarts", test_static_failure_restarts, 180},
    {"unshared_checkpoint_dir", test_unshared_checkpoint_dir, 240},
    {"api_races_static", test_api_races_static, 120},
    {"api_races_c10d", test_api_races_c10d, 120},
    {"layout_fixed_world_refused", test_layout_fixed_world_refused, 90},
    {"layout_elastic_world_refused_by_agent", test_layout_elastic_world_refused_by_agent, 180},
    {"layout_elastic_world_accepted", test_layout_elastic_world_accepted, 180},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_agent_config", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
