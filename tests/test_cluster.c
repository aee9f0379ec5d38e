/* test_cluster.c - scripts/sim-cluster.sh itself: hosts made of namespaces, as the other cluster
 * tests (dtrain across hosts) rely on them.
 *
 * Covered: `up` prints "HOST ADDRESS" per host and nothing else; each host has its own host
 * name, /dev/shm and /tmp (a file made in one is seen neither in another host nor outside), a
 * loopback, an address on the cluster's /24 and no route anywhere else, and the machine's own
 * network namespace gains no interface; a cut link makes packets vanish (a read on an open
 * connection times out, nothing is reset) and once restored the same connection carries on; a
 * shaped link carries about its rate, and unshaped again, more; nothing is left (namespaces,
 * processes inside, state, watcher) after `down`, after the owner's exit and after the owner is
 * SIGKILLed; two clusters with different names live side by side, each with its own h0; bad
 * input is refused with a message naming it.
 *
 * The test binary re-runs itself as helper servers inside hosts: `--echo` (echoes one
 * connection) and `--sink` (reads each connection to its end, then answers one byte). Each
 * binds port 0 and prints the port. The client side is the test process itself, moved into a
 * host's network namespace (dt_test_cluster_enter_net).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/cluster.h"
#include "tests/fixtures.h"

#define TMP dt_test_tmpdir()
#define SCRIPT dt_test_cluster_script()

/* ---- helper servers (run inside a host) ---------------------------------------------------- */

static int listen_port0(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static int serve(const char *mode)
{
    int port, lfd = listen_port0(&port);
    if (lfd < 0) {
        perror("helper: listen");
        return 1;
    }
    printf("listening on port %d\n", port);
    fflush(stdout);
    alarm(120); /* a helper never outlives a test for long */
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            return 1;
        char buf[1 << 16];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0)
            if (!strcmp(mode, "--echo") && write(fd, buf, (size_t)n) != n)
                break;
        if (!strcmp(mode, "--sink") && write(fd, "k", 1) != 1)
            perror("helper: write");
        close(fd);
        if (!strcmp(mode, "--echo"))
            return 0;
    }
}

/* Starts a helper in host k; returns its pid and its port. */
static pid_t start_helper(const dt_test_cluster *c, int k, const char *mode, int *port)
{
    const char *outp = dt_test_fmt("%s/helper%s.h%d.out", TMP, mode + 1, k);
    pid_t pid = dt_test_spawn(
        dt_test_cluster_cmd(c, k, dt_test_fmt("exec %s/test_cluster %s", dt_test_self_dir(), mode)),
        outp);
    *port = dt_test_read_port(outp, "listening on port ", 20);
    return pid;
}

static int connect_to(const char *addr, int port, int timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    DT_REQUIRE(fd >= 0);
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    DT_REQUIRE(inet_pton(AF_INET, addr, &a.sin_addr) == 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        dt_test_fail_at(__FILE__, __LINE__, "connect %s:%d: %s", addr, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static void set_rcvtimeo(int fd, double s)
{
    struct timeval tv = {.tv_sec = (time_t)s, .tv_usec = (suseconds_t)((s - (int)s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* Output of a command run in the root namespace (trailing newline cut), or NULL on failure. */
static char *run_out(const char *cmd, int *rc)
{
    char *out = NULL;
    *rc = dt_test_run(cmd, &out, 60);
    if (out) {
        size_t n = strlen(out);
        while (n && out[n - 1] == '\n')
            out[--n] = '\0';
    }
    return out;
}

static bool netns_exists(const char *name)
{
    return access(dt_test_fmt("/run/netns/%s", name), F_OK) == 0;
}

/* Nothing of cluster `name` left: namespaces, state directory, processes (pids in pidfile). */
static bool cluster_gone(const char *name_arg, const char *pidfile_arg, double timeout_s)
{
    /* copies: the loop makes many dt_test_fmt strings, which would recycle the caller's */
    char name[64], pidbuf[1024], *pidfile = pidfile_arg ? pidbuf : NULL;
    snprintf(name, sizeof name, "%s", name_arg);
    if (pidfile_arg)
        snprintf(pidbuf, sizeof pidbuf, "%s", pidfile_arg);
    double end = dt_test_now() + timeout_s * dt_test_timeout_scale();
    for (;;) {
        bool gone = !netns_exists(dt_test_fmt("%s-h0", name)) &&
                    !netns_exists(dt_test_fmt("%s-sw", name)) &&
                    access(dt_test_fmt("/run/sim-cluster/%s", name), F_OK) != 0;
        if (gone && pidfile) {
            char *p = dt_test_slurp(pidfile);
            int pid = p ? atoi(p) : 0;
            free(p);
            gone = pid > 0 && dt_test_pid_gone(pid);
        }
        if (gone)
            return true;
        if (dt_test_now() > end)
            return false;
        usleep(100000);
    }
}

static int count_root_links(void)
{
    int rc;
    char *out = run_out("ip -o link show | wc -l", &rc);
    int n = out ? atoi(out) : -1;
    free(out);
    return n;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_isolation(void)
{
    dt_test_cluster c;
    int links0 = count_root_links();
    dt_test_cluster_up(&c, 2, NULL);
    DT_CHECK(strcmp(c.addr[0], c.addr[1]) != 0);
    int rc;
    char *out = run_out(dt_test_cluster_cmd(&c, 1, "hostname"), &rc);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_STR(out, "h1");
    free(out);
    /* own /dev/shm and /tmp */
    const char *probe = dt_test_fmt("dtc-probe-%d", (int)getpid());
    out = run_out(dt_test_cluster_cmd(&c, 0, dt_test_fmt("echo x > /dev/shm/%s && echo y > /tmp/%s && "
                                                           "cat /dev/shm/%s /tmp/%s",
                                                           probe, probe, probe, probe)),
                  &rc);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_STR(out, "x\ny");
    free(out);
    out = run_out(dt_test_cluster_cmd(&c, 1, dt_test_fmt("ls /dev/shm/%s /tmp/%s 2>&1; echo end",
                                                           probe, probe)),
                  &rc);
    DT_CHECK_CONTAINS(out, "No such file");
    DT_CHECK(strstr(out, dt_test_fmt("/dev/shm/%s\n", probe)) == NULL);
    free(out);
    DT_CHECK(access(dt_test_fmt("/dev/shm/%s", probe), F_OK) != 0);
    DT_CHECK(access(dt_test_fmt("/tmp/%s", probe), F_OK) != 0);
    /* every host resolves every host's name (/etc/hosts of the cluster) */
    out = run_out(dt_test_cluster_cmd(&c, 0, "getent hosts h1"), &rc);
    DT_CHECK_CONTAINS(out, c.addr[1]);
    free(out);
    /* the routes: the /24 and nothing else (no default route; nothing else is reachable) */
    out = run_out(dt_test_cluster_cmd(&c, 0, "ip -4 route show; ip -4 -o addr show"), &rc);
    DT_CHECK_INT(rc, 0);
    DT_CHECK(strstr(out, "default") == NULL);
    DT_CHECK_CONTAINS(out, dt_test_fmt("inet %s/24", c.addr[0]));
    DT_CHECK_CONTAINS(out, "inet 127.0.0.1/8");
    int routes = 0;
    for (const char *p = out; (p = strstr(p, " dev ")); p++)
        routes++;
    DT_CHECK_MSG(routes == 1, "routes and addresses in h0: %s", out);
    free(out);
    /* asking the kernel for a route out sends nothing: it has none */
    out = run_out(dt_test_cluster_cmd(&c, 0, "ip route get 192.0.2.1 2>&1; ip route get 127.0.0.1"), &rc);
    DT_CHECK_CONTAINS(out, "unreachable");
    DT_CHECK_CONTAINS(out, "dev lo");
    free(out);
    /* the machine's own namespace got no interface */
    DT_CHECK_INT(count_root_links(), links0);
    /* exec keeps the directory and the environment */
    out = run_out(dt_test_fmt("cd %s && DTC_PROBE=kept %s exec --name %s h0 sh -c 'pwd; echo $DTC_PROBE'",
                              TMP, SCRIPT, c.name),
                  &rc);
    DT_CHECK_STR(out, dt_test_fmt("%s\nkept", TMP));
    free(out);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static void test_link_cut(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 2, NULL);
    int port;
    pid_t echo = start_helper(&c, 1, "--echo", &port);
    dt_test_cluster_enter_net(&c, 0);
    int fd = connect_to(c.addr[1], port, 10);
    DT_REQUIRE(fd >= 0);
    char buf[16] = "";
    DT_REQUIRE(write(fd, "one", 3) == 3);
    DT_CHECK_INT(read(fd, buf, sizeof buf), 3);
    DT_REQUIRE(dt_test_cluster_link(&c, 1, false) == 0);
    /* cut: the data goes out and vanishes; the read times out, nothing resets the connection */
    DT_REQUIRE(write(fd, "two", 3) == 3);
    set_rcvtimeo(fd, 2);
    double t0 = dt_test_now();
    ssize_t n = read(fd, buf, sizeof buf);
    int e = errno;
    DT_CHECK_MSG(n < 0 && (e == EAGAIN || e == EWOULDBLOCK),
                 "read across a cut link: %zd (%s), expected a timeout", n, strerror(e));
    DT_CHECK(dt_test_now() - t0 >= 1.5);
    /* new connections vanish too */
    int fd2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, c.addr[1], &a.sin_addr);
    DT_CHECK(connect(fd2, (struct sockaddr *)&a, sizeof a) != 0 && errno == EINPROGRESS);
    usleep(1000000);
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    getsockopt(fd2, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    getsockopt(fd2, IPPROTO_TCP, TCP_INFO, &ti, &tl);
    DT_CHECK_MSG(soerr == 0 && ti.tcpi_state == TCP_SYN_SENT,
                 "connect across a cut link: error %d, state %d (expected still SYN_SENT)", soerr,
                 ti.tcpi_state);
    close(fd2);
    /* restored: the same connection delivers what was sent meanwhile */
    DT_REQUIRE(dt_test_cluster_link(&c, 1, true) == 0);
    set_rcvtimeo(fd, 15 * dt_test_timeout_scale());
    n = read(fd, buf, sizeof buf);
    DT_CHECK_MSG(n == 3 && !memcmp(buf, "two", 3), "after the link came back: read %zd (%s)", n,
                 n < 0 ? strerror(errno) : "data");
    close(fd);
    DT_CHECK_INT(dt_test_wait_exit(echo, 10), 0);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* Sends bytes to a sink at addr:port and returns the goodput in bit/s (send to answer). */
static double goodput(const char *addr, int port, size_t bytes)
{
    int fd = connect_to(addr, port, 30);
    DT_REQUIRE(fd >= 0);
    size_t chunk = 1 << 20;
    char *b = calloc(1, chunk);
    DT_REQUIRE(b);
    double t0 = dt_test_now();
    for (size_t sent = 0; sent < bytes;) {
        ssize_t n = write(fd, b, DT_MIN(chunk, bytes - sent));
        DT_REQUIRE(n > 0);
        sent += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    char k;
    DT_REQUIRE(read(fd, &k, 1) == 1);
    double dt = dt_test_now() - t0;
    close(fd);
    free(b);
    return (double)bytes * 8.0 / dt;
}

static void test_rate(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 2, "200mbit");
    int port;
    pid_t sink = start_helper(&c, 1, "--sink", &port);
    dt_test_cluster_enter_net(&c, 0);
    goodput(c.addr[1], port, 1 << 20); /* warm up the window */
    double shaped = goodput(c.addr[1], port, 16u << 20);
    printf("    200mbit link: %.1f Mbit/s goodput (%.3f of the rate)\n", shaped / 1e6, shaped / 200e6);
    DT_CHECK_MSG(shaped <= 200e6 * 1.05 && shaped >= 200e6 * 0.6,
                 "200mbit link carried %.1f Mbit/s", shaped / 1e6);
    DT_REQUIRE(dt_test_cluster_rate(&c, 0, "none") == 0);
    DT_REQUIRE(dt_test_cluster_rate(&c, 1, "none") == 0);
    double free_rate = goodput(c.addr[1], port, 64u << 20);
    printf("    unshaped: %.1f Mbit/s (%.1fx the shaped link)\n", free_rate / 1e6, free_rate / shaped);
    DT_CHECK_MSG(free_rate > 2 * shaped, "unshaped %.1f Mbit/s vs shaped %.1f", free_rate / 1e6,
                 shaped / 1e6);
    DT_REQUIRE(dt_test_cluster_rate(&c, 1, "50mbit") == 0); /* one side shaped: h1's ingress is h0's */
    double slow = goodput(c.addr[1], port, 4u << 20);
    DT_CHECK_MSG(slow <= 50e6 * 1.05 && slow >= 50e6 * 0.6, "50mbit into h1: %.1f Mbit/s",
                 slow / 1e6);
    kill(sink, SIGKILL);
    dt_test_wait_exit(sink, 10);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static void test_down_removes_all(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 3, "1gbit");
    const char *pidf = dt_test_fmt("%s/inside.pid", TMP);
    /* a process inside that ignores SIGTERM and runs in a session of its own */
    pid_t p = dt_test_spawn(dt_test_cluster_cmd(&c, 2, dt_test_fmt("trap '' TERM; echo $$ > %s; "
                                                                    "exec setsid sleep 300",
                                                                    pidf)),
                            dt_test_fmt("%s/inside.out", TMP));
    DT_REQUIRE(dt_test_wait_text(pidf, "\n", 1, 20));
    char name[16];
    snprintf(name, sizeof name, "%s", c.name);
    DT_CHECK(netns_exists(dt_test_fmt("%s-h2", name)));
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
    DT_CHECK_MSG(cluster_gone(name, pidf, 2), "cluster %s still there after down", name);
    dt_test_wait_exit(p, 10);
    /* and `down` again, or on a name never used, says so and does no harm */
    int rc;
    char *out = run_out(dt_test_fmt("%s down --name %s", SCRIPT, name), &rc);
    DT_CHECK_CONTAINS(out, "no cluster named");
    free(out);
}

/* The owner is a shell that brings a cluster up, starts a process inside, then exits (or is
 * SIGKILLed): the watcher takes everything down. */
static void owner_case(bool sigkill)
{
    if (dt_test_cluster_unavailable())
        DT_SKIP(dt_test_cluster_unavailable());
    char name[16];
    snprintf(name, sizeof name, "o%d", (int)getpid() % 10000000);
    dt_test_at_end(dt_test_fmt("%s down --name %s >/dev/null 2>&1", SCRIPT, name));
    const char *pidf = dt_test_fmt("%s/owned.pid", TMP);
    const char *ready = dt_test_fmt("%s/ready", TMP);
    const char *script = dt_test_fmt(
        "%s up 2 --name %s >/dev/null || exit 1; "
        "%s exec --name %s h1 sh -c 'echo $$ > %s; exec sleep 300' >/dev/null 2>&1 & "
        "while [ ! -s %s ]; do sleep 0.1; done; echo up > %s; %s",
        SCRIPT, name, SCRIPT, name, pidf, pidf, ready, sigkill ? "sleep 300" : "exit 0");
    pid_t owner = dt_test_spawn(dt_test_fmt("bash -c %s", dt_test_fmt("\"%s\"", script)),
                                dt_test_fmt("%s/owner.out", TMP));
    DT_REQUIRE(dt_test_wait_text(ready, "up", 1, 30));
    DT_CHECK(netns_exists(dt_test_fmt("%s-h1", name)));
    if (sigkill) {
        kill(owner, SIGKILL);
        DT_CHECK_INT(dt_test_wait_exit(owner, 10), 128 + SIGKILL);
    } else {
        DT_CHECK_INT(dt_test_wait_exit(owner, 10), 0);
    }
    DT_CHECK_MSG(cluster_gone(name, pidf, 10), "cluster %s still there after its owner %s", name,
                 sigkill ? "was SIGKILLed" : "exited");
    if (!cluster_gone(name, NULL, 0)) {
        char *o = NULL;
        dt_test_run(dt_test_fmt("%s down --name %s", SCRIPT, name), &o, 30);
        free(o);
    }
}

static void test_owner_exit(void) { owner_case(false); }
static void test_owner_sigkill(void) { owner_case(true); }

static void test_two_clusters(void)
{
    dt_test_cluster a, b;
    dt_test_cluster_up(&a, 2, NULL);
    dt_test_cluster_up(&b, 3, "1gbit");
    DT_CHECK(strcmp(a.addr[0], b.addr[0]) != 0);
    int rc;
    char *out = run_out(dt_test_fmt("%s hosts --name %s; %s list", SCRIPT, b.name, SCRIPT), &rc);
    DT_CHECK_CONTAINS(out, dt_test_fmt("h2 %s", b.addr[2]));
    DT_CHECK_CONTAINS(out, a.name);
    free(out);
    /* the same host name in each, each its own: a file in a's h0 is not in b's h0 */
    out = run_out(dt_test_cluster_cmd(&a, 0, "hostname; echo a > /tmp/which"), &rc);
    DT_CHECK_STR(out, "h0");
    free(out);
    out = run_out(dt_test_cluster_cmd(&b, 0, "hostname; cat /tmp/which 2>/dev/null || echo none"), &rc);
    DT_CHECK_STR(out, "h0\nnone");
    free(out);
    /* a's hosts cannot reach b's addresses (separate switches) */
    out = run_out(dt_test_cluster_cmd(&a, 0, dt_test_fmt("ip route get %s 2>&1", b.addr[1])), &rc);
    DT_CHECK_MSG(strstr(out, "unreachable") || strcmp(a.addr[0], b.addr[0]) == 0,
                 "a's h0 has a route to b's h1: %s", out);
    free(out);
    char bname[16];
    snprintf(bname, sizeof bname, "%s", b.name);
    DT_CHECK_INT(dt_test_cluster_down(&a), 0);
    DT_CHECK(netns_exists(dt_test_fmt("%s-h2", bname)));
    out = run_out(dt_test_cluster_cmd(&b, 2, "hostname"), &rc);
    DT_CHECK_STR(out, "h2");
    free(out);
    DT_CHECK_INT(dt_test_cluster_down(&b), 0);
}

static void test_bad_input(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 1, NULL);
    int rc;
    char *out = run_out(dt_test_fmt("%s exec --name %s h5 true", SCRIPT, c.name), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "no host h5");
    free(out);
    out = run_out(dt_test_fmt("%s up 2 --name %s", SCRIPT, c.name), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "exists already");
    free(out);
    out = run_out(dt_test_fmt("%s rate --name %s h0 fast", SCRIPT, c.name), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "rate fast");
    free(out);
    out = run_out(dt_test_fmt("%s link --name %s h0 sideways", SCRIPT, c.name), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "say down or up");
    free(out);
    out = run_out(dt_test_fmt("%s up 2 --name bad-name", SCRIPT), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "--name bad-name");
    free(out);
    out = run_out(dt_test_fmt("%s exec --name nosuchcl h0 true", SCRIPT), &rc);
    DT_CHECK(rc != 0);
    DT_CHECK_CONTAINS(out, "no cluster named nosuchcl");
    free(out);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static const dt_test tests[] = {
    {"isolation", test_isolation, 60},
    {"link_cut", test_link_cut, 90},
    {"rate", test_rate, 90},
    {"down_removes_all", test_down_removes_all, 60},
    {"owner_exit", test_owner_exit, 60},
    {"owner_sigkill", test_owner_sigkill, 60},
    {"two_clusters", test_two_clusters, 60},
    {"bad_input", test_bad_input, 60},
};

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--echo") || !strcmp(argv[1], "--sink")))
        return serve(argv[1]);
    return dt_test_cluster_main("test_cluster", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
