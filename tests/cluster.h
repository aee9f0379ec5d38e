/* cluster.h - tests on a simulated cluster: scripts/sim-cluster.sh hosts (network, UTS and mount
 * namespaces on a private bridge), for every test binary that runs dtrain across hosts.
 *
 * A test calls dt_test_cluster_up, which skips it (visibly, with the reason) where namespaces
 * cannot be made (not root, no CAP_NET_ADMIN, no iproute2). The cluster's owner is the test's
 * process: when the test ends, however it ends, the script's watcher takes the cluster down.
 * Hosts have their own /tmp, so a test that shares files between hosts must keep them where
 * every host sees them: test binaries using this set TMPDIR=/var/tmp before dt_test_main
 * (dt_test_cluster_main), so that dt_test_tmpdir() is such a place; commands run in a host get
 * TMPDIR unset again, so each host's programs use its own /tmp.
 */
#ifndef DT_TEST_CLUSTER_H
#define DT_TEST_CLUSTER_H

#include <stdbool.h>

#include "tests/harness.h"

#define DT_TEST_CLUSTER_MAX 8

typedef struct dt_test_cluster {
    char name[16];                        /* --name (unique per process and cluster) */
    int n;                                /* hosts h0 .. h(n-1) */
    char addr[DT_TEST_CLUSTER_MAX][32];   /* each host's address */
} dt_test_cluster;

/* dt_test_main, after pointing TMPDIR at /var/tmp (see above). */
int dt_test_cluster_main(const char *suite, const dt_test *tests, int n, int argc, char **argv);
/* Path of scripts/sim-cluster.sh in the source tree. */
const char *dt_test_cluster_script(void);
/* NULL when clusters can be made here; else why not (probed once per process). */
const char *dt_test_cluster_unavailable(void);
/* Brings up n hosts (rate NULL: unshaped; else a tc rate such as "1gbit") owned by this
 * process; skips the test when clusters cannot be made, fails it when `up` fails. */
void dt_test_cluster_up(dt_test_cluster *c, int n, const char *rate);
/* A shell command line that runs the shell code `cmd` in host k, in the current directory.
 * (A string that lives as long as dt_test_fmt's.) */
const char *dt_test_cluster_cmd(const dt_test_cluster *c, int k, const char *cmd);
/* Cuts (up = false) or restores host k's link; changes its rate ("none": unshaped). 0 or the
 * script's exit code. */
int dt_test_cluster_link(const dt_test_cluster *c, int k, bool up);
int dt_test_cluster_rate(const dt_test_cluster *c, int k, const char *rate);
/* Enters host k's network namespace in this process (its sockets are then the host's);
 * dt_test_cluster_down steps out again first (down ends every process in a host). */
void dt_test_cluster_enter_net(const dt_test_cluster *c, int k);
/* Takes the cluster down (processes inside, namespaces, state); 0 or the exit code. */
int dt_test_cluster_down(dt_test_cluster *c);

#endif
