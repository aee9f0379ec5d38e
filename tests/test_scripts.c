/* test_scripts.c - the cluster scripts (scripts/dtrain-ssh.sh, dtrain-slurm.sbatch,
 * dtrain-retry.sh) with ssh, srun and scontrol replaced by local stand-ins first in PATH: the
 * "remote" commands run on this machine, so the real dtrain agents meet on 127.0.0.1.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/harness.h"

#define TMP dt_test_tmpdir()

static char root[PATH_MAX]; /* the repository: scripts/ and build/ */
static char bin[PATH_MAX];  /* build/dtrain, absolute */

static void find_root(void)
{
    DT_REQUIRE(realpath(dt_test_dtrain_bin(), bin) != NULL);
    snprintf(root, sizeof root, "%s", bin);
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(root, '/');
        DT_REQUIRE(slash != NULL);
        *slash = '\0';
    }
}

static void write_exec(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
    chmod(path, 0755);
}

static int runf(char **out, int timeout_s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int runf(char **out, int timeout_s, const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return dt_test_run(cmd, out, timeout_s);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    DT_REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    DT_REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* <tmp>/fake with ssh, srun and scontrol stand-ins. */
static const char *fake_bin(void)
{
    static char dir[PATH_MAX];
    char path[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/fake", TMP);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/ssh", dir);
    write_exec(path, "#!/bin/sh\n"
                     "# ssh stand-in: runs the remote command here (options are skipped)\n"
                     "while [ $# -gt 0 ]; do case \"$1\" in -o|-p|-i|-l) shift 2;; -*) shift;; "
                     "*) break;; esac; done\n"
                     "echo \"$1\" >> \"$FAKE_LOG\"\n"
                     "shift\n"
                     "exec sh -c \"$*\"\n");
    snprintf(path, sizeof path, "%s/scontrol", dir);
    write_exec(path, "#!/bin/sh\n"
                     "# scontrol stand-in: only `show hostnames A,B,...`\n"
                     "[ \"$1 $2\" = \"show hostnames\" ] || exit 1\n"
                     "echo \"$3\" | tr , '\\n'\n");
    snprintf(path, sizeof path, "%s/srun", dir);
    write_exec(path, "#!/bin/bash\n"
                     "# srun stand-in: one task per node, all here, with SLURM_NODEID/PROCID\n"
                     "nodes=${SLURM_NNODES:-1}\n"
                     "while [ $# -gt 0 ]; do case \"$1\" in --nodes=*) nodes=${1#*=}; shift;; "
                     "--*) shift;; *) break;; esac; done\n"
                     "pids=()\n"
                     "for ((k = 0; k < nodes; k++)); do\n"
                     "  SLURM_NODEID=$k SLURM_PROCID=$k SLURM_LOCALID=0 \"$@\" &\n"
                     "  pids+=($!)\n"
                     "done\n"
                     "rc=0\n"
                     "for p in \"${pids[@]}\"; do wait $p; r=$?; [ $r -gt $rc ] && rc=$r; done\n"
                     "exit $rc\n");
    return dir;
}

/* ---- --help --------------------------------------------------------------------------- */

static void test_help(void)
{
    find_root();
    const char *scripts[] = {"dtrain-ssh.sh", "dtrain-retry.sh", "dtrain-slurm.sbatch"};
    for (size_t i = 0; i < DT_ARRAY_LEN(scripts); i++) {
        char *out = NULL;
        int rc = runf(&out, 20, "bash %s/scripts/%s --help", root, scripts[i]);
        DT_CHECK_INT(rc, 0);
        DT_CHECK_CONTAINS(out, "usage:");
        free(out);
    }
    /* Misuse is a usage error (2), with a pointer to --help. */
    char *out = NULL;
    DT_CHECK_INT(runf(&out, 20, "%s/scripts/dtrain-ssh.sh -- true", root), 2);
    DT_CHECK_CONTAINS(out, "no hosts");
    free(out);
    DT_CHECK_INT(runf(&out, 20, "%s/scripts/dtrain-retry.sh", root), 2);
    free(out);
    DT_CHECK_INT(runf(&out, 20, "env -u SLURM_JOB_ID bash %s/scripts/dtrain-slurm.sbatch x.ini", root), 2);
    DT_CHECK_CONTAINS(out, "not inside a Slurm job");
    free(out);
}

/* ---- dtrain-retry.sh ------------------------------------------------------------------ */

static void test_retry_until_success(void)
{
    find_root();
    char *out = NULL;
    /* Fails on tries 1 and 2, succeeds on 3. */
    int rc = runf(&out, 30,
                  "%s/scripts/dtrain-retry.sh --max-tries 5 --delay 0.05 -- sh -c "
                  "'echo try=$DTRAIN_RETRY_TRY; [ $DTRAIN_RETRY_TRY -ge 3 ]'",
                  root);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "try=3");
    DT_CHECK(!strstr(out, "try=4"));
    DT_CHECK_CONTAINS(out, "try 3 succeeded");
    free(out);
}

static void test_retry_limit_and_no_retry(void)
{
    find_root();
    char *out = NULL;
    int rc = runf(&out, 30, "%s/scripts/dtrain-retry.sh --max-tries 3 --delay 0.05 -- sh -c "
                            "'echo try=$DTRAIN_RETRY_TRY; exit 5'", root);
    DT_CHECK_INT(rc, 5);
    DT_CHECK_CONTAINS(out, "try=3");
    DT_CHECK(!strstr(out, "try=4"));
    DT_CHECK_CONTAINS(out, "no tries left");
    free(out);
    rc = runf(&out, 30, "%s/scripts/dtrain-retry.sh --delay 0.05 -- sh -c 'echo try=$DTRAIN_RETRY_TRY; exit 2'",
              root);
    DT_CHECK_INT(rc, 2);
    DT_CHECK(!strstr(out, "try=2"));
    free(out);
}

/* The real launcher under the wrapper: its budget spent in try 1, the job passes in try 2. */
static void test_retry_dtrain(void)
{
    find_root();
    char *out = NULL;
    int rc = runf(&out, 60,
                  "%s/scripts/dtrain-retry.sh --max-tries 3 --delay 0.05 -- %s --nproc-per-node 2 "
                  "--max-restarts 1 --log-dir %s -- sh -c '[ $DTRAIN_RETRY_TRY -ge 2 ] || exit 3; "
                  "echo ok-$RANK'",
                  root, bin, TMP);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "Root cause");          /* try 1 ended with the table */
    DT_CHECK_CONTAINS(out, "try 1 exited 1");
    DT_CHECK_CONTAINS(out, "[1]:ok-1");
    free(out);
}

/* SIGTERM to the wrapper reaches the running try and ends the loop. */
static void test_retry_signal(void)
{
    find_root();
    char outp[PATH_MAX], ready[PATH_MAX], cmd[4 * PATH_MAX + 512];
    snprintf(outp, sizeof outp, "%s/retry.out", TMP);
    snprintf(ready, sizeof ready, "%s/ready", TMP);
    snprintf(cmd, sizeof cmd,
             "exec %s/scripts/dtrain-retry.sh --max-tries 5 --delay 0.05 -- %s --stop-grace 5 "
             "--log-dir %s -- sh -c 'trap \"echo got-term; exit 0\" TERM; touch %s; "
             "while :; do sleep 0.05; done'",
             root, bin, TMP, ready);
    pid_t pid = fork();
    DT_REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    double deadline = dt_test_now() + 20;
    while (access(ready, F_OK) != 0 && dt_test_now() < deadline)
        dt_sleep_ms(10);
    DT_REQUIRE(access(ready, F_OK) == 0);
    kill(pid, SIGTERM);
    int st = 0;
    deadline = dt_test_now() + 30;
    while (waitpid(pid, &st, WNOHANG) == 0 && dt_test_now() < deadline)
        dt_sleep_ms(10);
    if (dt_test_now() >= deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        DT_REQUIRE(!"the wrapper did not end");
    }
    DT_CHECK(WIFEXITED(st));
    DT_CHECK_INT(WEXITSTATUS(st), 128 + SIGTERM);
    char *out = dt_test_slurp(outp);
    DT_REQUIRE(out != NULL);
    DT_CHECK_CONTAINS(out, "[0]:got-term");
    DT_CHECK_CONTAINS(out, "not retrying");
    DT_CHECK(!strstr(out, "try 2"));
    free(out);
}

/* ---- dtrain-ssh.sh -------------------------------------------------------------------- */

static void test_ssh_two_hosts(void)
{
    find_root();
    const char *fake = fake_bin();
    char *out = NULL;
    int port = free_port();
    int rc = runf(&out, 60,
                  "PATH=%s:$PATH FAKE_LOG=%s/ssh.log %s/scripts/dtrain-ssh.sh --hosts "
                  "alice@node-a,node-b --endpoint 127.0.0.1 --port %d --dtrain %s --log-dir %s/sshlogs "
                  "-- --nproc-per-node 2 --rdzv-id sshjob --log-dir %s/dt -- sh -c "
                  "'echo \"rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK run=$DTRAIN_RUN_ID\"'",
                  fake, TMP, root, port, bin, TMP, TMP);
    DT_CHECK_INT(rc, 0);
    DT_CHECK_CONTAINS(out, "node-a: [0]:rank=0 world=4 group=0 run=sshjob");
    DT_CHECK_CONTAINS(out, "node-a: [1]:rank=1 world=4 group=0 run=sshjob");
    DT_CHECK_CONTAINS(out, "node-b: [2]:rank=2 world=4 group=1 run=sshjob");
    DT_CHECK_CONTAINS(out, "node-b: [3]:rank=3 world=4 group=1 run=sshjob");
    DT_CHECK_CONTAINS(out, "node 1 (node-b) exited 0");
    free(out);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/sshlogs/node-b.log", TMP);
    char *log = dt_test_slurp(path);
    DT_CHECK(log && strstr(log, "[3]:rank=3 world=4"));
    free(log);
    snprintf(path, sizeof path, "%s/ssh.log", TMP);
    log = dt_test_slurp(path);
    DT_CHECK(log && strstr(log, "alice@node-a\n") && strstr(log, "node-b\n"));
    free(log);
}

/* A worker failing on the second host fails the job on both (exit 1 from the script). */
static void test_ssh_failure(void)
{
    find_root();
    const char *fake = fake_bin();
    char *out = NULL, hosts[PATH_MAX + 16];
    snprintf(hosts, sizeof hosts, "%s/hosts", TMP);
    write_exec(hosts, "# two nodes\nnode-a slots=1\n\nnode-b\n");
    int rc = runf(&out, 60,
                  "PATH=%s:$PATH FAKE_LOG=%s/ssh.log %s/scripts/dtrain-ssh.sh --hostfile %s "
                  "--endpoint 127.0.0.1 --port %d --dtrain %s --log-dir %s/sshlogs -- "
                  "--log-dir %s/dt -- sh -c '[ $GROUP_RANK = 1 ] && exit 4; exec sleep 60'",
                  fake, TMP, root, hosts, free_port(), bin, TMP, TMP);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "node-a: ");
    DT_CHECK_CONTAINS(out, "Root cause");
    DT_CHECK_CONTAINS(out, "node 0 (node-a) exited 1");
    DT_CHECK_CONTAINS(out, "node 1 (node-b) exited 1");
    free(out);
}

/* Killing the script (even with SIGKILL) stops every remote agent and its workers. */
static void test_ssh_killed_stops_agents(void)
{
    find_root();
    const char *fake = fake_bin();
    char cmd[8 * PATH_MAX + 1024], outp[PATH_MAX];
    snprintf(outp, sizeof outp, "%s/ssh.out", TMP);
    snprintf(cmd, sizeof cmd,
             "PATH=%s:$PATH FAKE_LOG=%s/ssh.log exec %s/scripts/dtrain-ssh.sh --hosts node-a,node-b "
             "--endpoint 127.0.0.1 --port %d --dtrain %s --log-dir %s/sshlogs -- --stop-grace 5 "
             "--log-dir %s/dt -- sh -c 'echo $$ > %s/w.$RANK; exec sleep 60'",
             fake, TMP, root, free_port(), bin, TMP, TMP, TMP);
    pid_t pid = fork();
    DT_REQUIRE(pid >= 0);
    if (pid == 0) {
        int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int w[2] = {0, 0};
    char path[PATH_MAX + 16];
    double deadline = dt_test_now() + 30;
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/w.%d", TMP, r);
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        dt_sleep_ms(20);
        char *s = dt_test_slurp(path);
        w[r] = s ? atoi(s) : 0;
        free(s);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    DT_REQUIRE(w[0] > 1 && w[1] > 1);
    deadline = dt_test_now() + 20;
    for (int r = 0; r < 2; r++) {
        while (kill(w[r], 0) == 0 && dt_test_now() < deadline)
            dt_sleep_ms(20);
        DT_CHECK_MSG(kill(w[r], 0) != 0, "rank %d's worker (pid %d) survived the script", r, w[r]);
    }
}

/* ---- dtrain-slurm.sbatch -------------------------------------------------------------- */

static void test_slurm(void)
{
    find_root();
    const char *fake = fake_bin();
    char *out = NULL;
    int rc = runf(&out, 60,
                  "PATH=%s:$PATH SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=localhost,localhost "
                  "SLURM_NNODES=2 SLURM_JOB_NUM_NODES=2 DTRAIN=%s DTRAIN_NPROC=2 "
                  "DTRAIN_MASTER_PORT=%d bash %s/scripts/dtrain-slurm.sbatch --log-dir %s -- sh -c "
                  "'echo \"rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK run=$DTRAIN_RUN_ID "
                  "max=$TORCHELASTIC_MAX_RESTARTS\"'",
                  fake, bin, free_port(), root, TMP);
    DT_CHECK_INT(rc, 0);
    for (int r = 0; r < 4; r++) {
        char want[256];
        snprintf(want, sizeof want, "[%d]:rank=%d world=4 group=%d run=slurm-4242 max=3", r, r, r / 2);
        DT_CHECK_CONTAINS(out, want);
    }
    DT_CHECK_CONTAINS(out, "store at localhost:");
    free(out);
}

/* ---- install-deps.sh ------------------------------------------------------------------ */

/* A PATH of stand-ins: dpkg-query reports the packages in $INSTALLED as installed, id says
 * uid 1000 (not root), grep is the real one; make, cc, pkg-config and etcd only when asked
 * for. */
static const char *deps_path(const char *name, bool tools)
{
    static char dir[PATH_MAX];
    char path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/%s", TMP, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/dpkg-query", dir);
    write_exec(path, "#!/bin/sh\n"
                     "for p; do :; done\n"
                     "case \" $INSTALLED \" in *\" $p \"*) printf 'install ok installed';; *) exit 1;; esac\n");
    snprintf(path, sizeof path, "%s/id", dir);
    write_exec(path, "#!/bin/sh\necho 1000\n");
    const char *real[] = {"grep"};
    for (size_t i = 0; i < DT_ARRAY_LEN(real); i++) {
        char *where = NULL;
        char cmd[128];
        snprintf(cmd, sizeof cmd, "command -v %s", real[i]);
        DT_REQUIRE(dt_test_run(cmd, &where, 10) == 0);
        where[strcspn(where, "\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", dir, real[i]);
        unlink(path);
        DT_REQUIRE(symlink(where, path) == 0);
        free(where);
    }
    const char *tool[] = {"make", "cc", "pkg-config", "etcd"};
    for (size_t i = 0; tools && i < DT_ARRAY_LEN(tool); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, tool[i]);
        write_exec(path, "#!/bin/sh\nexit 0\n");
    }
    return dir;
}

static void test_install_deps(void)
{
    find_root();
    char *out = NULL;
    const char *all = "libuv1-dev libcjson-dev libinih-dev libopenblas-dev libcurl4-openssl-dev";
    const char *p = deps_path("deps-all", true);
    DT_CHECK_INT(runf(&out, 20, "INSTALLED='%s' PATH=%s /bin/sh %s/scripts/install-deps.sh", all, p,
                      root),
                 0);
    DT_CHECK_CONTAINS(out, "install-deps: all present: build-essential pkg-config libuv1-dev");
    free(out);
    /* A fresh machine: no compiler, make, pkg-config or etcd, one library missing. */
    p = deps_path("deps-fresh", false);
    DT_CHECK_INT(runf(&out, 20,
                      "INSTALLED='libuv1-dev libcjson-dev libopenblas-dev libcurl4-openssl-dev' "
                      "PATH=%s /bin/sh %s/scripts/install-deps.sh",
                      p, root),
                 1);
    DT_CHECK_CONTAINS(out, "install-deps: missing: build-essential pkg-config etcd-server "
                           "libinih-dev");
    /* No sudo on this PATH (minimal Debian): the command is for a root shell. */
    DT_CHECK_CONTAINS(out, "(and no sudo here)");
    DT_CHECK_CONTAINS(out, "\n    apt-get update && apt-get install -y build-essential "
                           "pkg-config etcd-server libinih-dev\n");
    free(out);
    /* With sudo installed: the sudo form. */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/sudo", p);
    write_exec(path, "#!/bin/sh\nexit 1\n");
    DT_CHECK_INT(runf(&out, 20,
                      "INSTALLED='libuv1-dev libcjson-dev libopenblas-dev libcurl4-openssl-dev' "
                      "PATH=%s /bin/sh %s/scripts/install-deps.sh",
                      p, root),
                 1);
    DT_CHECK_CONTAINS(out, "    sudo apt-get update && sudo apt-get install -y build-essential "
                           "pkg-config etcd-server libinih-dev\n");
    free(out);
    /* As root with no sudo anywhere: apt-get directly (a stand-in that logs its arguments). */
    p = deps_path("deps-root", false);
    snprintf(path, sizeof path, "%s/id", p);
    write_exec(path, "#!/bin/sh\necho 0\n");
    snprintf(path, sizeof path, "%s/apt-get", p);
    write_exec(path, "#!/bin/sh\necho \"apt-get $*\" >> \"$APT_LOG\"\n");
    DT_CHECK_INT(runf(&out, 20,
                      "APT_LOG=%s/apt.log INSTALLED='libuv1-dev libcjson-dev libopenblas-dev "
                      "libinih-dev libcurl4-openssl-dev' PATH=%s /bin/sh %s/scripts/install-deps.sh",
                      p, p, root),
                 0);
    DT_CHECK_CONTAINS(out, "install-deps: installed: build-essential pkg-config etcd-server\n");
    free(out);
    snprintf(path, sizeof path, "%s/apt.log", p);
    char *log = dt_test_slurp(path);
    DT_CHECK_CONTAINS(log, "apt-get update -qq\napt-get install -y -qq build-essential pkg-config "
                           "etcd-server\n");
    free(log);
    DT_CHECK_INT(runf(&out, 20, "/bin/sh %s/scripts/install-deps.sh --help", root), 0);
    DT_CHECK_CONTAINS(out, "build-essential");
    DT_CHECK_CONTAINS(out, "--cluster also: slurm-wlm munge openssh-server");
    free(out);
    /* --cluster: the daemons the simulated-cluster tests run, by package */
    p = deps_path("deps-cluster", true);
    DT_CHECK_INT(runf(&out, 20, "INSTALLED='%s munge' PATH=%s /bin/sh %s/scripts/install-deps.sh --cluster",
                      all, p, root),
                 1);
    DT_CHECK_CONTAINS(out, "install-deps: missing: slurm-wlm openssh-server gnuplot-nox\n");
    free(out);
    DT_CHECK_INT(runf(&out, 20,
                      "INSTALLED='%s slurm-wlm munge openssh-server gnuplot-nox' PATH=%s /bin/sh "
                      "%s/scripts/install-deps.sh --cluster",
                      all, p, root),
                 0);
    DT_CHECK_CONTAINS(out, "all present: build-essential pkg-config libuv1-dev");
    DT_CHECK_CONTAINS(out, "etcd-server slurm-wlm munge openssh-server gnuplot-nox");
    free(out);
    DT_CHECK_INT(runf(&out, 20, "/bin/sh %s/scripts/install-deps.sh --bogus", root), 2);
    free(out);
}

/* ---- make install ------------------------------------------------------------------------- */

/* `make install` into a temporary DESTDIR: the installed binary runs, launches workers (which are
 * itself, found through /proc/self/exe) and looks for the CUDA backend in <prefix>/lib/dtrain. */
static void test_make_install(void)
{
    find_root();
    char *out = NULL, build[PATH_MAX], dest[PATH_MAX + 16], inst[PATH_MAX + 64];
    if (runf(&out, 10, "command -v make") != 0) {
        free(out);
        DT_SKIP("make is not installed");
    }
    free(out);
    snprintf(build, sizeof build, "%s", bin);
    *strrchr(build, '/') = '\0'; /* the build directory the tests run from */
    snprintf(dest, sizeof dest, "%s/dest", TMP);
    /* Installs what is built; builds nothing (the binary is there). */
    /* The make running the tests passes its flags and jobserver down: not to this make. */
    int rc = runf(&out, 120,
                  "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C %s install BUILD=%s "
                  "DESTDIR=%s PREFIX=/opt/dt",
                  root, build, dest);
    DT_CHECK_MSG(rc == 0, "make install: exit %d: %s", rc, out ? out : "");
    free(out);
    snprintf(inst, sizeof inst, "%s/opt/dt/bin/dtrain", dest);
    DT_REQUIRE(access(inst, X_OK) == 0);
    DT_CHECK_INT(runf(&out, 20, "%s --version", inst), 0);
    char so[PATH_MAX + 128];
    snprintf(so, sizeof so, "%s/opt/dt/lib/dtrain/libdtrain_cuda.so", dest);
    DT_CHECK_CONTAINS(out, so); /* found there, or named as the place it would be */
    free(out);
    char built_so[PATH_MAX + 32];
    snprintf(built_so, sizeof built_so, "%s/libdtrain_cuda.so", build);
    DT_CHECK(access(so, R_OK) == 0 || access(built_so, R_OK) != 0); /* installed when built */
    DT_CHECK_INT(runf(&out, 20, "%s --help", inst), 0);
    DT_CHECK_CONTAINS(out, "75 preempted");
    free(out);
    DT_CHECK_INT(runf(&out, 60, "cd %s && %s --nproc-per-node 2 -- sh -c 'echo rank=$RANK' 2>&1",
                      TMP, inst),
                 0);
    DT_CHECK_CONTAINS(out, "[0]:rank=0");
    DT_CHECK_CONTAINS(out, "[1]:rank=1");
    free(out);
    /* The built-in worker is the installed binary too; without the library it says where. */
    char job[PATH_MAX + 32];
    snprintf(job, sizeof job, "%s/cuda.ini", TMP);
    DT_REQUIRE(dt_test_write_file(job, "[job]\ndevice = cuda\noutput_dir = out\n"
                                       "[model]\ntype = mlp\n[train]\nsteps = 1\n") == 0);
    if (access(so, R_OK) != 0) {
        DT_CHECK(runf(&out, 60, "cd %s && %s --max-restarts 0 %s 2>&1", TMP, inst, job) != 0);
        char want[PATH_MAX + 200];
        snprintf(want, sizeof want, "CUDA backend: %s not found", so);
        DT_CHECK_CONTAINS(out, want);
        free(out);
    }
    DT_CHECK_INT(runf(&out, 60,
                      "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C %s uninstall BUILD=%s "
                      "DESTDIR=%s PREFIX=/opt/dt",
                      root, build, dest),
                 0);
    free(out);
    DT_CHECK(access(inst, F_OK) != 0);
}

/* ---- plot-metrics.sh ------------------------------------------------------------------ */

static void test_plot_metrics(void)
{
    find_root();
    char *out = NULL;
    char dir[PATH_MAX], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/plotrun", TMP);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fputs("{\"type\":\"train\",\"step\":10,\"loss\":5.5,\"lr\":0.001,\"tokens_per_s\":1000}\n"
          "{\"type\":\"train\",\"step\":20,\"loss\":4.1,\"lr\":0.001,\"tokens_per_s\":1100}\n"
          "{\"type\":\"eval\",\"step\":20,\"val_loss\":4.3}\n"
          "{\"type\":\"train\",\"step\":30,\"loss\":3.2,\"lr\":0.001,\"tokens_per_s\":1150}\n",
          f);
    fclose(f);
    /* no training records: a clear error, whether or not gnuplot is there */
    snprintf(path, sizeof path, "%s/empty.jsonl", dir);
    f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fputs("{\"type\":\"eval\",\"step\":20,\"val_loss\":4.3}\n", f);
    fclose(f);
    if (dt_test_run("command -v gnuplot", &out, 10) != 0) {
        free(out);
        DT_SKIP("gnuplot is not installed (Debian: gnuplot-nox)");
    }
    free(out);
    DT_CHECK_INT(runf(&out, 20, "%s/scripts/plot-metrics.sh %s", root, path), 1);
    DT_CHECK_CONTAINS(out, "no training records");
    free(out);
    DT_CHECK_INT(runf(&out, 60, "%s/scripts/plot-metrics.sh -o %s/m.png --title test %s", root, dir,
                      dir),
                 0);
    DT_CHECK_CONTAINS(out, "plot-metrics: wrote");
    free(out);
    snprintf(path, sizeof path, "%s/m.png", dir);
    unsigned char magic[8] = {0};
    f = fopen(path, "rb");
    DT_REQUIRE(f != NULL);
    DT_CHECK(fread(magic, 1, 8, f) == 8);
    fclose(f);
    DT_CHECK(!memcmp(magic, "\x89PNG\r\n\x1a\n", 8));
}

static const dt_test tests[] = {
    {"help", test_help, 0},
    {"install_deps", test_install_deps, 0},
    {"make_install", test_make_install, 120},
    {"plot_metrics", test_plot_metrics, 60},
    {"retry_until_success", test_retry_until_success, 0},
    {"retry_limit_and_no_retry", test_retry_limit_and_no_retry, 0},
    {"retry_dtrain", test_retry_dtrain, 60},
    {"retry_signal", test_retry_signal, 60},
    {"ssh_two_hosts", test_ssh_two_hosts, 60},
    {"ssh_failure", test_ssh_failure, 60},
    {"ssh_killed_stops_agents", test_ssh_killed_stops_agents, 60},
    {"slurm", test_slurm, 60},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_scripts", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
