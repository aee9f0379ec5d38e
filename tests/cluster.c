/* cluster.c - tests on a simulated cluster (scripts/sim-cluster.sh); see cluster.h. */
#include "tests/cluster.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fixtures.h"

int dt_test_cluster_main(const char *suite, const dt_test *tests, int n, int argc, char **argv)
{
    setenv("TMPDIR", "/var/tmp", 1);
    return dt_test_main(suite, tests, n, argc, argv);
}

const char *dt_test_cluster_script(void)
{
    static char path[4096];
    if (!path[0])
        snprintf(path, sizeof path, "%s/scripts/sim-cluster.sh", dt_test_repo_dir("scripts"));
    return path;
}

/* Single quotes around s for sh ('\'' for each quote inside). */
static const char *sh_quote(const char *s)
{
    size_t n = strlen(s), k = 0;
    char *q = malloc(4 * n + 3);
    DT_REQUIRE(q);
    q[k++] = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(q + k, "'\\''", 4);
            k += 4;
        } else {
            q[k++] = *p;
        }
    }
    q[k++] = '\'';
    q[k] = '\0';
    const char *out = dt_test_fmt("%s", q);
    free(q);
    return out;
}

const char *dt_test_cluster_unavailable(void)
{
    static int probed;
    static char why[512];
    if (probed)
        return why[0] ? why : NULL;
    probed = 1;
    if (geteuid() != 0) {
        snprintf(why, sizeof why, "simulated cluster: not root (network namespaces need root)");
        return why;
    }
    if (access(dt_test_cluster_script(), X_OK) != 0) {
        snprintf(why, sizeof why, "simulated cluster: %s not found", dt_test_cluster_script());
        return why;
    }
    char *out = NULL;
    char name[16];
    snprintf(name, sizeof name, "p%d", (int)getpid() % 10000000);
    int rc = dt_test_run(dt_test_fmt("%s up 1 --name %s --owner %d >/dev/null && %s down --name %s",
                                     dt_test_cluster_script(), name, (int)getpid(),
                                     dt_test_cluster_script(), name),
                         &out, 30);
    if (rc != 0) {
        const char *o = out ? out : "";
        const char *nl = strchr(o, '\n');
        snprintf(why, sizeof why, "simulated cluster cannot be made here (sim-cluster.sh up: %.*s)",
                 nl ? (int)(nl - o) : 300, o);
    }
    free(out);
    return why[0] ? why : NULL;
}

void dt_test_cluster_up(dt_test_cluster *c, int n, const char *rate)
{
    static int seq;
    const char *why = dt_test_cluster_unavailable();
    if (why)
        DT_SKIP(why);
    DT_REQUIRE(n >= 1 && n <= DT_TEST_CLUSTER_MAX);
    memset(c, 0, sizeof *c);
    c->n = n;
    snprintf(c->name, sizeof c->name, "t%d%c", (int)getpid() % 10000000, 'a' + seq++ % 26);
    /* The harness kills the script's watcher with the test's other processes: it downs what is
     * left afterwards instead. */
    dt_test_at_end(dt_test_fmt("%s down --name %s >/dev/null 2>&1", dt_test_cluster_script(), c->name));
    char *out = NULL;
    const char *errp = dt_test_fmt("%s/%s.up.err", dt_test_tmpdir(), c->name);
    int rc = dt_test_run(dt_test_fmt("%s up %d --name %s --owner %d%s%s 2>%s",
                                     dt_test_cluster_script(), n, c->name, (int)getpid(),
                                     rate ? " --rate " : "", rate ? rate : "", errp),
                         &out, 60);
    if (rc != 0) {
        char *e = dt_test_slurp(errp);
        dt_test_fail_at(__FILE__, __LINE__, "sim-cluster.sh up %d --name %s: exit %d: %s", n,
                        c->name, rc, e ? e : "");
        free(e);
        free(out);
        dt_test_stop();
    }
    /* "HOST ADDRESS" per host, nothing else */
    int k = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), k++) {
        char host[32], addr[32], extra[8];
        int got = sscanf(line, "%31s %31s %7s", host, addr, extra);
        DT_CHECK_MSG(got == 2 && k < n && !strcmp(host, dt_test_fmt("h%d", k)),
                     "sim-cluster.sh up: line %d is \"%s\"", k, line);
        if (k < n)
            snprintf(c->addr[k], sizeof c->addr[k], "%s", addr);
    }
    free(out);
    DT_REQUIRE(k == n);
}

const char *dt_test_cluster_cmd(const dt_test_cluster *c, int k, const char *cmd)
{
    return dt_test_fmt("%s exec --name %s h%d env -u TMPDIR sh -c %s", dt_test_cluster_script(),
                       c->name, k, sh_quote(cmd));
}

int dt_test_cluster_link(const dt_test_cluster *c, int k, bool up)
{
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("%s link --name %s h%d %s", dt_test_cluster_script(), c->name,
                                     k, up ? "up" : "down"),
                         &out, 30);
    if (rc != 0)
        fprintf(stderr, "sim-cluster.sh link h%d %s: %s\n", k, up ? "up" : "down", out ? out : "");
    free(out);
    return rc;
}

int dt_test_cluster_rate(const dt_test_cluster *c, int k, const char *rate)
{
    char *out = NULL;
    int rc = dt_test_run(
        dt_test_fmt("%s rate --name %s h%d %s", dt_test_cluster_script(), c->name, k, rate), &out,
        30);
    if (rc != 0)
        fprintf(stderr, "sim-cluster.sh rate h%d %s: %s\n", k, rate, out ? out : "");
    free(out);
    return rc;
}

/* This process's own network namespace while it is in a host's (dt_test_cluster_enter_net), so
 * that it can step out before `down`, which ends every process inside the hosts. */
static int home_netns = -1;

void dt_test_cluster_enter_net(const dt_test_cluster *c, int k)
{
    if (home_netns < 0)
        home_netns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    DT_REQUIRE(home_netns >= 0);
    int fd = open(dt_test_fmt("/run/netns/%s-h%d", c->name, k), O_RDONLY | O_CLOEXEC);
    DT_REQUIRE(fd >= 0);
    DT_REQUIRE(setns(fd, CLONE_NEWNET) == 0);
    close(fd);
}

int dt_test_cluster_down(dt_test_cluster *c)
{
    if (!c->name[0])
        return 0;
    if (home_netns >= 0) {
        DT_REQUIRE(setns(home_netns, CLONE_NEWNET) == 0);
        close(home_netns);
        home_netns = -1;
    }
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("%s down --name %s", dt_test_cluster_script(), c->name), &out,
                         60);
    if (rc != 0)
        fprintf(stderr, "sim-cluster.sh down --name %s: %s\n", c->name, out ? out : "");
    free(out);
    c->name[0] = '\0';
    return rc;
}
