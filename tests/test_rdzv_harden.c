/* test_rdzv_harden.c - issue #34's rendezvous half, end to end through the real binary on
 * 127.0.0.1 (the etcd cases are in test_etcd.c, which starts etcd itself):
 *   - one job's settings agreed by every node: the first node's job defines the run; a node
 *     whose job differs (static, c10d) is refused with the differing keys named on that node,
 *     exits 2 and leaves the running job unharmed;
 *   - nothing adopted from the store is trusted: a conf record rewritten by a client of a
 *     token-less store (a run id that climbs out of the log dir, min > max, a negative budget,
 *     an ESC, garbage) is refused naming the key and the store, exit 2;
 *   - the store binds the address the job names (127.0.0.1 for --master-addr=127.0.0.1).
 *
 * Each test ran against the code before its fix and failed there. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/store.h"
#include "tests/harness.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

static const char *fast = "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=5,join_timeout=30,"
                          "close_timeout=10,last_call_timeout=0.5 --stop-grace 5 "
                          "--monitor-interval 0.05";

/* A small mlp job of `steps` steps (tens of thousands a second on one rank). */
static const char *mlp_job(int steps)
{
    static char path[1024];
    char text[1024];
    snprintf(path, sizeof path, "%s/mlp%d.ini", TMP, steps);
    snprintf(text, sizeof text,
             "[job]\nname = h\nseed = 3\ndevice = cpu\nlog_every = 50000\n"
             "[model]\ntype = mlp\nhidden = 32\n"
             "[data]\ntype = synthetic\nsynthetic_samples = 2048\n"
             "synthetic_dim = 16\nsynthetic_classes = 4\n"
             "[train]\nbatch_size = 16\nsteps = %d\nlr = 1e-3\nthreads = 1\n",
             steps);
    DT_REQUIRE(dt_test_write_file(path, text) == 0);
    return path;
}

static int free_port(void)
{
    int port = 0;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_free_port(&port, &e), &e);
    return port;
}

/* (item 1, static) Node 1 adds train.lr=5e-2: it is refused naming train.lr with both values,
 * exits 2 and starts no worker; node 0 says so and keeps waiting; node 1 started again with the
 * job's settings joins and the job ends 0 on both. */
static void test_static_job_differs_refused(void)
{
    dt_test_group g;
    char line[8192];
    const char *J = mlp_job(20);
    dt_test_group_init(&g);
    snprintf(g.out[0], sizeof g.out[0], "%s/node0.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --rdzv-id sd "
             "%s %s job.output_dir=%s/o0",
             BIN, fast, J, TMP);
    dt_test_group_spawn(&g, 0, line, g.out[0]);
    g.port = dt_test_read_port(g.out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
    /* job.output_dir and train.threads are node-local: they may differ */
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port %d --rdzv-id sd "
             "%s %s job.output_dir=%s/o1 train.threads=2 train.lr=5e-2",
             BIN, g.port, fast, J, TMP);
    snprintf(g.out[1], sizeof g.out[1], "%s/node1bad.out", TMP);
    dt_test_group_spawn(&g, 1, line, g.out[1]);
    g.code[1] = dt_test_wait_exit(g.pid[1], 30 * dt_test_timeout_scale());
    g.done[1] = true;
    DT_CHECK_INT(g.code[1], 2);
    char *o1 = dt_test_slurp(g.out[1]);
    DT_REQUIRE(o1 != NULL);
    DT_CHECK_CONTAINS(o1, "this node's job differs");
    DT_CHECK_CONTAINS(o1, "1 key differs: train.lr = \"0.05\" here, \"0.001\" in the job");
    DT_CHECK_MSG(!strstr(o1, "train.threads") && !strstr(o1, "output_dir"),
                 "node-local keys were compared: %.600s", o1);
    DT_CHECK_MSG(!strstr(o1, "attempt 0"), "the refused node started workers: %.600s", o1);
    free(o1);
    DT_CHECK(dt_test_wait_text(g.out[0], "node 1 was refused and exited", 1, 10));
    DT_CHECK(!dt_test_pid_gone(g.pid[0])); /* node 0 still waits */
    DT_CHECK(dt_test_count_text(g.out[0], "differs in train.lr") == 1);
    /* the right node 1 now */
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port %d --rdzv-id sd "
             "%s %s job.output_dir=%s/o1 train.threads=2",
             BIN, g.port, fast, J, TMP);
    snprintf(g.out[2], sizeof g.out[2], "%s/node1.out", TMP);
    dt_test_group_spawn(&g, 2, line, g.out[2]);
    dt_test_group_wait(&g, 90 * dt_test_timeout_scale());
    DT_CHECK_INT(g.code[0], 0);
    DT_CHECK_INT(g.code[2], 0);
    if (g.code[0] || g.code[2] || g.code[1] != 2)
        dt_test_group_dump(&g);
}

/* (item 1, c10d) A 1:2 job runs on node A; node B with train.lr=5e-2 is refused naming
 * train.lr (exit 2) and A's round is not disturbed (no regroup): A finishes 0. */
static void test_c10d_job_differs_refused(void)
{
    dt_test_group g;
    char line[8192], ep[64];
    const char *J = mlp_job(400000); /* seconds: B comes while it runs */
    dt_test_group_init(&g);
    snprintf(ep, sizeof ep, "127.0.0.1:%d", free_port());
    snprintf(g.out[0], sizeof g.out[0], "%s/a.out", TMP);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint %s --nnodes 1:2 --rdzv-id cd %s %s "
             "job.output_dir=%s/oa",
             BIN, ep, fast, J, TMP);
    dt_test_group_spawn(&g, 0, line, g.out[0]);
    DT_REQUIRE(dt_test_wait_text(g.out[0], "attempt 0 (round 0)", 1, 30 * dt_test_timeout_scale()));
    snprintf(g.out[1], sizeof g.out[1], "%s/b.out", TMP);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint %s --nnodes 1:2 --rdzv-id cd %s %s "
             "job.output_dir=%s/ob train.lr=5e-2",
             BIN, ep, fast, J, TMP);
    dt_test_group_spawn(&g, 1, line, g.out[1]);
    dt_test_group_wait(&g, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(g.code[1], 2);
    DT_CHECK_INT(g.code[0], 0);
    char *ob = dt_test_slurp(g.out[1]), *oa = dt_test_slurp(g.out[0]);
    DT_REQUIRE(oa && ob);
    DT_CHECK_CONTAINS(ob, "train.lr = \"0.05\" here, \"0.001\" in the job");
    DT_CHECK_CONTAINS(ob, "key dtrain/cd/");
    DT_CHECK_MSG(!strstr(oa, "joining the next round") && !strstr(oa, "regroup"),
                 "the running job was disturbed: %.2000s", oa);
    DT_CHECK_CONTAINS(oa, "all workers succeeded");
    if (g.code[0] || g.code[1] != 2)
        dt_test_group_dump(&g);
    free(oa);
    free(ob);
}

/* Rewrites the conf record of the c10d job with rendezvous id `id` on the store at port. */
static void tamper_conf(int port, const char *id, const char *value)
{
    dt_store *s = NULL;
    dt_store_opts so;
    dt_err e = {0};
    char key[256], *J = NULL;
    dt_store_opts_default(&so);
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", port, &so, &e), &e);
    snprintf(key, sizeof key, "dtrain/%s/job", id);
    DT_REQUIRE_OK(dt_rdzv_get_str(s, key, &J, 5000, &e), &e);
    snprintf(key, sizeof key, "dtrain/%s/%s/conf", id, J);
    DT_REQUIRE_OK(dt_rdzv_set_str(s, key, value, &e), &e);
    free(J);
    dt_store_free(s);
}

/* (item 2) A client of a token-less store rewrites the running job's conf: every value a later
 * agent would adopt is checked, and the agent is refused naming the key and the store (exit 2,
 * nothing written outside the log dir). */
static void test_c10d_conf_validated(void)
{
    static const struct {
        const char *conf, *want;
    } cases[] = {
        {"{\"run_id\":\"../../../../tmp/dtrain-pwned\",\"max_restarts\":0,\"min\":1,\"max\":2}",
         "\"run_id\" = \"../../../../tmp/dtrain-pwned\" holds '/'"},
        {"{\"run_id\":\"a..b\",\"max_restarts\":0,\"min\":1,\"max\":2}", "holds \"..\""},
        {"{\"run_id\":\"x\\u001b[2J\",\"max_restarts\":0,\"min\":1,\"max\":2}",
         "holds a control character"},
        {"{\"run_id\":\"ok\",\"max_restarts\":0,\"min\":3,\"max\":1}",
         "\"min\" = 3 is more than \"max\" = 1"},
        {"{\"run_id\":\"ok\",\"max_restarts\":-5,\"min\":1,\"max\":2}",
         "\"max_restarts\" = -5 must be a whole number from 0"},
        {"garbage{", "are not a JSON object (\"garbage{\")"},
    };
    dt_test_group g;
    char line[8192], ep[64];
    int port = free_port();
    dt_test_group_init(&g);
    snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
    snprintf(g.out[0], sizeof g.out[0], "%s/a.out", TMP);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint %s --nnodes 1:2 --rdzv-id cv %s -- sleep 30",
             BIN, ep, fast);
    dt_test_group_spawn(&g, 0, line, g.out[0]);
    DT_REQUIRE(dt_test_wait_text(g.out[0], "attempt 0 (round 0)", 1, 30 * dt_test_timeout_scale()));
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        tamper_conf(port, "cv", cases[i].conf);
        char *out = NULL;
        snprintf(line, sizeof line,
                 "%s --rdzv-backend c10d --rdzv-endpoint %s --nnodes 1:2 --rdzv-id cv %s "
                 "--log-dir %s/logs -- true 2>&1",
                 BIN, ep, fast, TMP);
        int code = dt_test_run(line, &out, 60);
        DT_CHECK_INT(code, 2);
        DT_CHECK_CONTAINS(out, cases[i].want);
        char where[128];
        snprintf(where, sizeof where, "the store at 127.0.0.1:%d (key dtrain/cv/", port);
        DT_CHECK_CONTAINS(out, where);
        DT_CHECK_MSG(!out || !strchr(out, 0x1b), "an ESC reached the output");
        if (code != 2) {
            fprintf(stderr, "case %zu: %s\n", i, out ? out : "");
            dt_test_group_dump(&g);
        }
        free(out);
    }
    DT_CHECK(access("/tmp/dtrain-pwned", F_OK) != 0);
    dt_test_group_kill(&g);
}

/* (item 11) An etcd TLS file or password file that cannot be read (missing, a directory) is a
 * configuration error as the other rendezvous ones are: exit 2 at once, naming the key and the
 * path, nothing retried. */
static void test_etcd_files_unreadable(void)
{
    static const char *const keys[] = {"cacert", "cert", "key", "password_file"};
    char line[4096], ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%d", free_port()); /* nobody listens: never reached */
    for (size_t i = 0; i < DT_ARRAY_LEN(keys); i++)
        for (int dir = 0; dir < 2; dir++) {
            char *out = NULL, want[1200];
            const char *path = dir ? TMP : "/nonexistent/dtrain-file";
            /* a key goes with a certificate, a password file with a user */
            snprintf(line, sizeof line,
                     "%s --rdzv-backend=etcd --rdzv-endpoint=%s --nnodes 1 --rdzv-conf "
                     "join_timeout=30%s,%s=%s -- true 2>&1",
                     BIN, ep, !strcmp(keys[i], "key")             ? ",cert=/dev/null"
                              : !strcmp(keys[i], "cert")          ? ",key=/dev/null"
                              : !strcmp(keys[i], "password_file") ? ",user=u"
                                                                  : "",
                     keys[i], path);
            double t0 = dt_test_now();
            int code = dt_test_run(line, &out, 60);
            DT_CHECK_INT(code, 2);
            snprintf(want, sizeof want, "rendezvous.%s: cannot read %s: %s", keys[i], path,
                     dir ? "Is a directory" : "No such file or directory");
            DT_CHECK_CONTAINS(out, want);
            DT_CHECK(dt_test_now() - t0 < 10 * dt_test_timeout_scale());
            free(out);
        }
}

/* (item 8) An etcd endpoint with a typo (a name that does not resolve) or that nobody serves is
 * said at once, naming it and why, and every few seconds while the agent waits (as the static
 * backend says what it waits for); after join_timeout the agent ends with 1. Before, both were
 * silent for the first call's whole budget (heartbeat_timeout / 2: 15 s by default). */
static void test_etcd_unreachable_said(void)
{
    dt_test_group g;
    char line[4096], eps[2][64];
    snprintf(eps[0], sizeof eps[0], "etcd-typo.invalid:2379");
    snprintf(eps[1], sizeof eps[1], "127.0.0.1:%d", free_port()); /* nobody listens */
    dt_test_group_init(&g);
    double t0 = dt_test_now();
    for (int k = 0; k < 2; k++) {
        snprintf(g.out[k], sizeof g.out[k], "%s/unreach%d.out", TMP, k);
        snprintf(line, sizeof line,
                 "%s --rdzv-backend=etcd --rdzv-endpoint=%s --rdzv-id u%d --nnodes 1 "
                 "--rdzv-conf join_timeout=20 -- true",
                 BIN, eps[k], k);
        dt_test_group_spawn(&g, k, line, g.out[k]);
    }
    DT_CHECK(dt_test_wait_text(g.out[0], "etcd member etcd-typo.invalid:2379: Couldn't resolve "
                                         "host name", 1, 4 * dt_test_timeout_scale()));
    DT_CHECK(dt_test_wait_text(g.out[1], "connection refused", 1, 4 * dt_test_timeout_scale()));
    DT_CHECK(dt_test_now() - t0 < 10); /* well before the first call's budget (15 s) */
    dt_test_group_wait(&g, 60 * dt_test_timeout_scale());
    for (int k = 0; k < 2; k++) {
        DT_CHECK_INT(g.code[k], 1);
        /* at 5, 10 and 15 s of the 20 */
        DT_CHECK(dt_test_count_text(g.out[k], "still waiting for the etcd cluster") >= 2);
        DT_CHECK(dt_test_count_text(g.out[k], eps[k]) >= 3);
        DT_CHECK(dt_test_count_text(g.out[k], "join_timeout 20 s") >= 2);
    }
    if (g.code[0] != 1 || g.code[1] != 1 ||
        dt_test_count_text(g.out[0], "still waiting for the etcd cluster") < 2)
        dt_test_group_dump(&g);
}

/* The IPv4 address (as /proc/net/tcp writes it, "0100007F" for 127.0.0.1) of the socket that
 * listens on port here; "" when none does. */
static void listen_addr(int port, char out[16])
{
    char line[512], want[8];
    out[0] = '\0';
    snprintf(want, sizeof want, ":%04X", port);
    FILE *f = fopen("/proc/net/tcp", "r");
    DT_REQUIRE(f != NULL);
    while (fgets(line, sizeof line, f)) {
        char local[64], remote[64], st[8];
        if (sscanf(line, "%*s %63s %63s %7s", local, remote, st) == 3 && !strcmp(st, "0A") &&
            strlen(local) == 13 && !strcmp(local + 8, want)) {
            snprintf(out, 16, "%.8s", local);
            break;
        }
    }
    fclose(f);
}

/* (item 17) The store listens on the address the job names, not on every interface: static
 * node 0 with --master-addr=127.0.0.2 on 127.0.0.2 only, a c10d agent with
 * --rdzv-endpoint=127.0.0.1:P on 127.0.0.1 only; every interface only when asked
 * (DTRAIN_STORE_BIND=0.0.0.0). Each agent waits for a node that never comes, so its store is
 * up while it is looked at; the job still works (static node 1 joins and both end 0). */
static void test_store_binds_named_address(void)
{
    dt_test_group g;
    char line[8192], a[16];
    const char *J = mlp_job(20);
    dt_test_group_init(&g);
    /* static node 0 at 127.0.0.2 (any 127/8 address is this host's) */
    snprintf(g.out[0], sizeof g.out[0], "%s/bind0.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.2 --master-port 0 --rdzv-id b0 "
             "%s %s job.output_dir=%s/b0",
             BIN, fast, J, TMP);
    dt_test_group_spawn(&g, 0, line, g.out[0]);
    int port = dt_test_read_port(g.out[0], "hosting the rendezvous store at 127.0.0.2:", 20);
    listen_addr(port, a);
    DT_CHECK_STR(a, "0200007F");
    /* c10d at 127.0.0.1:P */
    int cport = free_port();
    snprintf(g.out[1], sizeof g.out[1], "%s/bind1.out", TMP);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --nnodes 2 --rdzv-id b1 %s -- "
             "true",
             BIN, cport, fast);
    dt_test_group_spawn(&g, 1, line, g.out[1]);
    DT_CHECK(dt_test_wait_text(g.out[1], "hosting the rendezvous store", 1,
                               20 * dt_test_timeout_scale()));
    listen_addr(cport, a);
    DT_CHECK_STR(a, "0100007F");
    /* asked for every interface */
    snprintf(g.out[2], sizeof g.out[2], "%s/bind2.out", TMP);
    snprintf(line, sizeof line,
             "env DTRAIN_STORE_BIND=0.0.0.0 %s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 "
             "--master-port 0 --rdzv-id b2 %s -- true",
             BIN, fast);
    dt_test_group_spawn(&g, 2, line, g.out[2]);
    int aport = dt_test_read_port(g.out[2], "hosting the rendezvous store at 127.0.0.1:", 20);
    listen_addr(aport, a);
    DT_CHECK_STR(a, "00000000");
    kill(g.pid[1], SIGTERM);
    kill(g.pid[2], SIGTERM);
    /* the job at 127.0.0.2 forms and finishes */
    snprintf(g.out[3], sizeof g.out[3], "%s/bind3.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.2 --master-port %d --rdzv-id b0 "
             "%s %s job.output_dir=%s/b3",
             BIN, port, fast, J, TMP);
    dt_test_group_spawn(&g, 3, line, g.out[3]);
    dt_test_group_wait(&g, 90 * dt_test_timeout_scale());
    DT_CHECK_INT(g.code[0], 0);
    DT_CHECK_INT(g.code[3], 0);
    if (g.code[0] || g.code[3])
        dt_test_group_dump(&g);
}

/* (item 2, unit) dt_rdzv_conf_parse on what dtrain writes, and on what it must refuse. */
static void test_conf_parse(void)
{
    dt_rdzv_opts o;
    dt_rdzv_conf c;
    dt_err e = {0};
    memset(&o, 0, sizeof o);
    snprintf(o.run_id, sizeof o.run_id, "r1");
    o.max_restarts = 3;
    o.job = "train.lr=0.001\ntrain.steps=20\n";
    char *mine = dt_rdzv_conf_propose(&o, 1, 4);
    DT_REQUIRE(mine != NULL);
    DT_REQUIRE_OK(dt_rdzv_conf_parse(mine, "W", "F", &c, &e), &e);
    DT_CHECK_STR(c.run_id, "r1");
    DT_CHECK_INT(c.min, 1);
    DT_CHECK_INT(c.max, 4);
    DT_CHECK_INT(c.max_restarts, 3);
    DT_CHECK_INT(dt_rdzv_conf_check_job(&c, o.job, "W", NULL, 0, &e), 0);
    char keys[128];
    DT_CHECK_INT(dt_rdzv_conf_check_job(&c, "train.lr=0.05\ntrain.steps=20\n", "W", keys,
                                        sizeof keys, &e),
                 -EINVAL);
    DT_CHECK_STR(keys, "train.lr");
    DT_CHECK_CONTAINS(e.msg, "train.lr = \"0.05\" here, \"0.001\" in the job");
    dt_rdzv_conf_free(&c);
    free(mine);
    /* a job's text that does not match its digest, and one with control characters */
    DT_CHECK_INT(dt_rdzv_conf_parse("{\"run_id\":\"a\",\"max_restarts\":0,\"min\":1,\"max\":1,"
                                    "\"job\":\"a=1\\n\",\"digest\":\"0000000000000000\"}",
                                    "W", "F", &c, &e),
                 -EINVAL);
    DT_CHECK_CONTAINS(e.msg, "\"digest\" does not match");
    DT_CHECK_INT(dt_rdzv_conf_parse("{\"run_id\":\"a\",\"max_restarts\":0,\"min\":1,\"max\":1,"
                                    "\"job\":\"a=\\u001b\\n\"}",
                                    "W", "F", &c, &e),
                 -EINVAL);
    DT_CHECK_INT(dt_rdzv_conf_parse("{\"max_restarts\":0,\"min\":1,\"max\":1}", "W", "F", &c, &e),
                 -EINVAL);
    DT_CHECK_CONTAINS(e.msg, "\"run_id\" is missing");
    char why[128];
    DT_CHECK_INT(dt_rdzv_check_run_id("job-1.2_x", why, sizeof why), 0);
    DT_CHECK_INT(dt_rdzv_check_run_id("..", why, sizeof why), -EINVAL);
    DT_CHECK_INT(dt_rdzv_check_run_id("", why, sizeof why), -EINVAL);
}

static const dt_test tests[] = {
    {"conf_parse", test_conf_parse, 10},
    {"static_job_differs_refused", test_static_job_differs_refused, 240},
    {"c10d_job_differs_refused", test_c10d_job_differs_refused, 240},
    {"c10d_conf_validated", test_c10d_conf_validated, 240},
    {"etcd_files_unreadable", test_etcd_files_unreadable, 120},
    {"etcd_unreachable_said", test_etcd_unreachable_said, 180},
    {"store_binds_named_address", test_store_binds_named_address, 240},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_rdzv_harden", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
