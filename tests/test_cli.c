/* test_cli.c - the dtrain command line as a user types it (drives build/dtrain). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmd/args.h"
#include "common/util.h"
#include "tests/harness.h"

static char *out;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", dt_test_dtrain_bin(), args);
    free(out);
    out = NULL;
    return dt_test_run(cmd, &out, 20);
}

static void test_help_and_version(void)
{
    DT_CHECK_INT(run("--help"), 0);
    DT_CHECK_CONTAINS(out, "usage: dtrain");
    DT_CHECK_CONTAINS(out, "Nodes and workers:");
    DT_CHECK_CONTAINS(out, "Rendezvous:");
    DT_CHECK_CONTAINS(out, "--nproc-per-node N|auto|cpu|gpu");
    DT_CHECK_CONTAINS(out, "--nnodes N|MIN:MAX");
    DT_CHECK_CONTAINS(out, "--rdzv-endpoint HOST[:PORT]");
    DT_CHECK(strstr(out, " V ") == NULL); /* every value has a named placeholder */
    DT_CHECK_CONTAINS(out, "[default: 29500]");
    DT_CHECK_CONTAINS(out, "Exit codes:");
    DT_CHECK_INT(run("-h"), 0);
    DT_CHECK_INT(run("--version"), 0);
    DT_CHECK_CONTAINS(out, "dtrain 0.");
    DT_CHECK_INT(run("--help-env"), 0);
    DT_CHECK_CONTAINS(out, "DTRAIN_LOG");
    DT_CHECK_INT(run("--help-config"), 0);
    DT_CHECK_CONTAINS(out, "`train.lr`");
}

static void test_bad_flags_exit_2_with_suggestion(void)
{
    DT_CHECK_INT(run("--nproc_per_nod=2 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "unknown option --nproc_per_nod; did you mean --nproc-per-node?");
    DT_CHECK_INT(run("--max-restart 3 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "did you mean --max-restarts?");
    DT_CHECK_INT(run("--frobnicate configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "unknown option --frobnicate");
    DT_CHECK_INT(run("--nnodes"), 2);
    DT_CHECK_CONTAINS(out, "--nnodes needs a value");
    DT_CHECK_INT(run("--nnodes=0 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "--nnodes");
    DT_CHECK_INT(run("--nnodes=4:2 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "MIN:MAX");
    DT_CHECK_INT(run("--nproc-per-node=lots configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "auto, cpu or gpu");
    DT_CHECK_INT(run("--rdzv-backend=zookeeper configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "static|c10d|etcd");
    DT_CHECK_INT(run("--master-port=70000 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "--master-port");
    DT_CHECK_INT(run("--monitor-interval=soon configs/quickstart.ini"), 2);
    DT_CHECK_INT(run("--redirects=9 configs/quickstart.ini"), 2);
    DT_CHECK_CONTAINS(out, "0-3");
    DT_CHECK_INT(run("--standalone=maybe configs/quickstart.ini"), 2);
    DT_CHECK_INT(run("--"), 2);
    DT_CHECK_CONTAINS(out, "nothing after --");
    DT_CHECK_INT(run("%s", ""), 2);
    DT_CHECK_CONTAINS(out, "no job given");
    DT_CHECK_INT(run("configs/quickstart.ini lr=3"), 2);
    DT_CHECK_CONTAINS(out, "section.key=value");
    DT_CHECK_INT(run("configs/quickstart.ini -- sh -c true"), 2);
    DT_CHECK_CONTAINS(out, "both a job file");
}

static void test_spellings_and_precedence(void)
{
    /* dashes, underscores, = and space forms, short forms; overrides beat the file, flags beat
     * overrides wherever they are given (issue #2's precedence). */
    DT_REQUIRE(run("--print-config --nproc_per_node 3 --max-restarts=2 -r 1 --tee=0:3,1:1 "
                   "configs/quickstart.ini elastic.max_restarts=5 train.lr=0.01") == 0);
    DT_CHECK_CONTAINS(out, "nproc_per_node = 3\n");
    DT_CHECK_CONTAINS(out, "max_restarts = 2\n");
    DT_CHECK_CONTAINS(out, "redirects = 1\n");
    DT_CHECK_CONTAINS(out, "tee = 0:3,1:1\n");
    DT_CHECK_CONTAINS(out, "lr = 0.01\n");
    DT_REQUIRE(run("--print-config configs/quickstart.ini elastic.max_restarts=5 "
                   "--max-restarts=2") == 0);
    DT_CHECK_CONTAINS(out, "max_restarts = 2\n");
    /* PET_* environment like torchrun: below explicit flags */
    DT_REQUIRE(run("--print-config configs/quickstart.ini") == 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "PET_NNODES=2:3 PET_MAX_RESTARTS=4 %s --max-restarts=1 --print-config configs/quickstart.ini",
             dt_test_dtrain_bin());
    free(out);
    DT_REQUIRE(dt_test_run(cmd, &out, 20) == 0);
    DT_CHECK_CONTAINS(out, "nnodes = 2:3\n");
    DT_CHECK_CONTAINS(out, "max_restarts = 1\n");
    /* PET_* are defaults under the command line: an override beats them too, the file does not */
    snprintf(cmd, sizeof cmd,
             "PET_NPROC_PER_NODE=2 %s --print-config configs/quickstart.ini elastic.nproc_per_node=4",
             dt_test_dtrain_bin());
    free(out);
    DT_REQUIRE(dt_test_run(cmd, &out, 20) == 0);
    DT_CHECK_CONTAINS(out, "nproc_per_node = 4\n");
    snprintf(cmd, sizeof cmd, "PET_NPROC_PER_NODE=2 %s --print-config configs/quickstart.ini",
             dt_test_dtrain_bin());
    free(out);
    DT_REQUIRE(dt_test_run(cmd, &out, 20) == 0);
    DT_CHECK_CONTAINS(out, "nproc_per_node = 2\n");
    snprintf(cmd, sizeof cmd, "PET_NNODES=x %s configs/quickstart.ini", dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 2);
    DT_CHECK_CONTAINS(out, "PET_NNODES");
}

/* rendezvous.conf takes effect where it is set; the flags are checked before anything starts. */
static void test_rdzv_conf_and_endpoint(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/conf.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fputs("[model]\ntype = mlp\n[rendezvous]\nconf = join_timeout=7,heartbeat_interval=2\n", f);
    fclose(f);
    DT_REQUIRE(run("--print-config %s rendezvous.join_timeout=9", path) == 0);
    DT_CHECK_CONTAINS(out, "join_timeout = 9\n");
    DT_CHECK_CONTAINS(out, "heartbeat_interval = 2\n");
    DT_REQUIRE(run("--print-config %s --rdzv-conf=join_timeout=3", path) == 0);
    DT_CHECK_CONTAINS(out, "join_timeout = 3\n");
    /* torchrun's conf keys map onto dtrain's */
    DT_REQUIRE(run("--print-config --rdzv-conf=timeout=5,keep_alive_interval=2,"
                   "keep_alive_max_attempt=4,read_timeout=9,is_host=1 %s", path) == 0);
    DT_CHECK_CONTAINS(out, "join_timeout = 5\n");
    DT_CHECK_CONTAINS(out, "heartbeat_interval = 2\n");
    DT_CHECK_CONTAINS(out, "heartbeat_timeout = 8\n");
    DT_CHECK_CONTAINS(out, "read_timeout = 9\n");
    DT_CHECK_CONTAINS(out, "is_host = true\n");
    /* the same checks with a command as with a job file, before anything starts */
    DT_CHECK_INT(run("--rdzv-conf=heartbeat_interval=40 -- true"), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-conf: rendezvous.heartbeat_timeout (30 s) must be longer");
    DT_CHECK_CONTAINS(out, "nothing was started");
    DT_CHECK_INT(run("--rdzv-conf=heartbeat_timeout=0.5,heartbeat_interval=1 -- true"), 2);
    DT_CHECK_INT(run("--rdzv-conf=heartbeat_timeout=0.5,heartbeat_interval=1 %s", path), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-conf: rendezvous.heartbeat_timeout (0.5 s)");
    DT_CHECK_INT(run("--rdzv-conf=hartbeat_interval=3 -- true"), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-conf: unknown key \"hartbeat_interval\"");
    DT_CHECK_INT(run("--rdzv-endpoint=host:abc -- true"), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-endpoint:");
    DT_CHECK_INT(run("--rdzv-endpoint=:99999 -- true"), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-endpoint:");
    DT_CHECK_INT(run("--rdzv-endpoint=[::1 -- true"), 2);
    DT_CHECK_INT(run("--nnodes=1:2 --node-rank=2 -- true"), 2);
    DT_CHECK_CONTAINS(out, "--node-rank: rendezvous.node_rank out of range (--node-rank=2: must be 0..1 for --nnodes=1:2)");
    DT_CHECK_INT(run("--node-rank=3 %s", path), 2);
    DT_CHECK_CONTAINS(out, "--node-rank=3: must be 0..0");
    DT_REQUIRE(run("--print-config --rdzv-endpoint=node0:29400 --nnodes=2 --node-rank=1 %s",
                   path) == 0);
    DT_CHECK_CONTAINS(out, "endpoint = node0:29400\n");
}

/* torchrun's other flags: accepted where they mean nothing here, a clear way out where not. */
static void test_torchrun_parity(void)
{
    DT_CHECK_INT(run("--no-python -- sh -c 'echo ran-$LOCAL_RANK'"), 0);
    DT_CHECK_CONTAINS(out, "ran-0");
    DT_CHECK_INT(run("--no_python --run-path --run_path -- true"), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "PET_NO_PYTHON=1 %s -- true", dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    DT_CHECK_INT(run("--start-method=spawn --start_method fork -- true"), 0);
    DT_CHECK_CONTAINS(out, "--start-method=fork ignored: dtrain always fork+execs");
    DT_CHECK_INT(run("--start-method=thread -- true"), 2);
    DT_CHECK_CONTAINS(out, "not one of spawn, fork, forkserver");
    DT_CHECK_INT(run("--role trainer -- sh -c 'test \"$ROLE_NAME\" = trainer'"), 0);
    DT_CHECK_INT(run("--role trainer -- sh -c 'test \"$ROLE_NAME\" = default'"), 1);
    DT_CHECK_INT(run("-m pkg.train --lr 1"), 2);
    DT_CHECK_CONTAINS(out, "dtrain runs commands: use -- python3 -m MODULE ...");
    DT_CHECK_INT(run("--module pkg.train"), 2);
    DT_CHECK_CONTAINS(out, "--module: dtrain runs commands");
    DT_CHECK_INT(run("wroker"), 2);
    DT_CHECK_CONTAINS(out, "unknown subcommand \"wroker\"; did you mean worker?");
    DT_CHECK_INT(run("stor"), 2);
    DT_CHECK_CONTAINS(out, "did you mean store?");
    char prog[1024];
    snprintf(prog, sizeof prog, "%s/a.sh", dt_test_tmpdir());
    FILE *f = fopen(prog, "w");
    DT_REQUIRE(f);
    fputs("#!/bin/sh\necho hi\n", f);
    fclose(f);
    DT_REQUIRE(chmod(prog, 0755) == 0);
    DT_CHECK_INT(run("%s", prog), 2);
    DT_CHECK_CONTAINS(out, "is a program, not a job file: to run a command, put it after --");
}

/* DTRAIN_LOG filters what the binary prints; a wrong level is named once, with the valid ones. */
static void test_dtrain_log_levels(void)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "DTRAIN_LOG=error %s --nproc-per-node=2 -- true", dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    DT_CHECK(strstr(out, "INFO") == NULL);
    snprintf(cmd, sizeof cmd, "DTRAIN_LOG=info %s --nproc-per-node=2 -- true", dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    DT_CHECK_CONTAINS(out, "INFO: all workers succeeded");
    DT_CHECK(strstr(out, "INFO agent.c:") == NULL);
    /* debug: every line carries its source file:line */
    snprintf(cmd, sizeof cmd, "DTRAIN_LOG=debug %s -- true", dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    DT_CHECK_CONTAINS(out, "INFO agent.c:");
    /* workers are `dtrain worker` processes too: the warning still comes once */
    snprintf(cmd, sizeof cmd, "DTRAIN_LOG=loud %s --nproc-per-node=2 -- %s worker --help",
             dt_test_dtrain_bin(), dt_test_dtrain_bin());
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    DT_CHECK_CONTAINS(out, "DTRAIN_LOG=loud is not a log level (debug, info, warn, error or off); using info");
    const char *first = strstr(out, "DTRAIN_LOG=loud");
    DT_CHECK(first && !strstr(first + 1, "DTRAIN_LOG=loud"));
    DT_CHECK_CONTAINS(out, "INFO: all workers succeeded");
}

/* The workers load the job the agent loaded: flags fixing what the file alone gets wrong reach
 * them too (here the file's heartbeat_interval needs the flag's longer heartbeat_timeout). */
static void test_workers_get_the_flags(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/w.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fprintf(f, "[model]\ntype = mlp\nhidden = 8\n[train]\nsteps = 2\n[rendezvous]\n"
               "heartbeat_interval = 40\n[job]\noutput_dir = %s/wrun\n",
            dt_test_tmpdir());
    fclose(f);
    DT_CHECK_INT(run("%s", path), 2);
    DT_CHECK_INT(run("--rdzv-conf=heartbeat_timeout=100 %s", path), 0);
    DT_CHECK_CONTAINS(out, "all workers succeeded");
}

/* The workers load the job the launcher resolved (written once to a private file under
 * $TMPDIR, removed at the end), not the job file and the settings again: DTRAIN_OUTPUT_DIR is
 * job.output_dir below overrides, and a job file that can be read only once still trains. */
static void test_workers_load_the_resolved_job(void)
{
    const char *t = dt_test_tmpdir();
    char path[1024], cmd[4096], dir[1200];
    struct stat st;
    snprintf(path, sizeof path, "%s/r.ini", t);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fprintf(f, "[model]\ntype = mlp\nhidden = 8\n[train]\nsteps = 2\n[job]\noutput_dir = %s/r-file\n", t);
    fclose(f);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/jobtmp", t);
    DT_REQUIRE(system(cmd) == 0);
    /* an override beats DTRAIN_OUTPUT_DIR, in the launcher and in every worker */
    snprintf(cmd, sizeof cmd, "TMPDIR=%s/jobtmp DTRAIN_OUTPUT_DIR=%s/r-env %s %s job.output_dir=%s/r-ovr",
             t, t, dt_test_dtrain_bin(), path, t);
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 60), 0);
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    snprintf(dir, sizeof dir, "%s/r-ovr/checkpoints", t);
    DT_CHECK_MSG(stat(dir, &st) == 0, "no %s", dir);
    snprintf(dir, sizeof dir, "%s/r-env", t);
    DT_CHECK_MSG(stat(dir, &st) != 0, "%s exists: a worker took DTRAIN_OUTPUT_DIR", dir);
    /* without the override DTRAIN_OUTPUT_DIR beats the file */
    snprintf(cmd, sizeof cmd, "TMPDIR=%s/jobtmp DTRAIN_OUTPUT_DIR=%s/r-env %s --print-config %s", t,
             t, dt_test_dtrain_bin(), path);
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 0);
    char want[1200];
    snprintf(want, sizeof want, "\noutput_dir = %s/r-env\n", t);
    DT_CHECK_CONTAINS(out, want);
    /* a job file that can be read once (a FIFO, like bash's <(...)) */
    snprintf(cmd, sizeof cmd,
             "rm -f %s/pipe.ini && mkfifo %s/pipe.ini && (cat %s > %s/pipe.ini &) && "
             "TMPDIR=%s/jobtmp %s %s/pipe.ini job.output_dir=%s/r-fifo",
             t, t, path, t, t, dt_test_dtrain_bin(), t, t);
    free(out);
    DT_CHECK_INT(dt_test_run(cmd, &out, 60), 0);
    DT_CHECK_CONTAINS(out, "all workers succeeded");
    /* the resolved job's private directory is gone */
    snprintf(cmd, sizeof cmd, "rmdir %s/jobtmp", t);
    DT_CHECK_MSG(system(cmd) == 0, "%s/jobtmp is not empty after the runs", t);
}

static void test_job_file_errors_exit_2(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/bad.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fputs("[model]\ntype = gtp\n[train]\nlr = fast\n", f);
    fclose(f);
    DT_CHECK_INT(run("%s", path), 2);
    DT_CHECK_CONTAINS(out, "bad.ini:2: model.type: \"gtp\" is not one of mlp|resnet|gpt|bert|llama; did you mean \"gpt\"?");
    DT_CHECK_CONTAINS(out, "bad.ini:4: train.lr: \"fast\" is not a number");
    DT_CHECK_CONTAINS(out, "nothing was started");
    /* `dtrain worker` on a job that does not load: exit 2 too (a configuration error the agent
     * does not restart), and the error file says so */
    char errfile[1100], cmd[4096];
    snprintf(errfile, sizeof errfile, "%s/worker-error.json", dt_test_tmpdir());
    remove(errfile);
    snprintf(cmd, sizeof cmd, "RANK=1 WORLD_SIZE=2 DTRAIN_ERROR_FILE=%s %s worker %s", errfile,
             dt_test_dtrain_bin(), path);
    free(out);
    out = NULL;
    DT_CHECK_INT(dt_test_run(cmd, &out, 20), 2);
    DT_CHECK_CONTAINS(out, "dtrain worker: ");
    DT_CHECK_CONTAINS(out, "bad.ini:2: model.type: \"gtp\" is not one of mlp|resnet|gpt|bert|llama");
    char *rec = dt_test_slurp(errfile);
    DT_CHECK_MSG(rec, "no error file %s", errfile);
    if (rec) {
        DT_CHECK_CONTAINS(rec, "\"exit_code\":2");
        DT_CHECK_CONTAINS(rec, "\"rank\":1");
        DT_CHECK_CONTAINS(rec, "bad.ini:2: model.type");
    }
    free(rec);
    DT_CHECK_INT(run("/nonexistent/job.ini"), 2);
    DT_CHECK_CONTAINS(out, "/nonexistent/job.ini: cannot open job file");
    DT_CHECK_INT(run("configs"), 2);
    DT_CHECK_CONTAINS(out, "configs: cannot open job file: is a directory");
    DT_CHECK_INT(run("--rdzv-id=a/b -- true"), 2);
    DT_CHECK_CONTAINS(out, "--rdzv-id: \"a/b\" must be a non-empty name without '/'");
}

static void test_print_config_every_shipped_file_round_trips(void)
{
    char *list = NULL;
    DT_REQUIRE(dt_test_run("ls configs/*.ini", &list, 10) == 0);
    int n = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n"), n++) {
        DT_CHECK_MSG(run("--print-config %s", line) == 0, "--print-config %s failed: %s", line, out);
        char printed[1024];
        snprintf(printed, sizeof printed, "%s/printed%d.ini", dt_test_tmpdir(), n);
        FILE *f = fopen(printed, "w");
        DT_REQUIRE(f);
        fputs(out, f);
        fclose(f);
        char *first = strdup(out);
        DT_CHECK_MSG(run("--print-config %s", printed) == 0, "reprint of %s failed: %s", line, out);
        /* Identical apart from the first comment line naming the source file. */
        const char *a = strchr(first, '\n'), *b = strchr(out, '\n');
        DT_CHECK_MSG(a && b && !strcmp(a, b), "%s does not round-trip through --print-config", line);
        free(first);
    }
    free(list);
    DT_CHECK(n >= 1);
    /* A value longer than inih's 200-byte line (a deep path on a cluster) round-trips too. */
    char deep[400];
    memset(deep, 'd', sizeof deep - 1);
    deep[sizeof deep - 1] = '\0';
    DT_REQUIRE(run("--print-config configs/quickstart.ini data.path=/%s/train.bin", deep) == 0);
    char printed[1024];
    snprintf(printed, sizeof printed, "%s/printed-long.ini", dt_test_tmpdir());
    FILE *f = fopen(printed, "w");
    DT_REQUIRE(f);
    fputs(out, f);
    fclose(f);
    char *first = strdup(out);
    DT_CHECK_MSG(run("--print-config %s", printed) == 0, "reprint failed: %s", out);
    const char *a = strchr(first, '\n'), *b = strchr(out, '\n');
    DT_CHECK_MSG(a && b && !strcmp(a, b), "a 400-character path does not round-trip");
    DT_CHECK_CONTAINS(out, "/train.bin");
    free(first);
}

static void test_subcommand_dispatch(void)
{
    DT_CHECK_INT(run("bench"), 2);
    DT_CHECK_CONTAINS(out, "usage: dtrain bench NAME");
    DT_CHECK_INT(run("bench alreduce"), 2);
    DT_CHECK_CONTAINS(out, "did you mean \"allreduce\"?");
    DT_CHECK_INT(run("bench --help"), 0);
}

static void test_args_parser_unit(void)
{
    dt_args a;
    dt_err err = {0};
    char *argv1[] = {"dtrain", "--nnodes", "2", "--no-python", "./prog", "--flag", "x", NULL};
    DT_REQUIRE_OK(dt_args_parse(&a, 7, argv1, &err), &err);
    DT_CHECK(a.job_path == NULL);
    DT_REQUIRE(a.n_command == 3);
    DT_CHECK_STR(a.command[0], "./prog");
    DT_CHECK_STR(a.command[1], "--flag");
    DT_CHECK(a.command[3] == NULL);
    DT_CHECK_INT(a.n_flag_keys, 1);
    DT_CHECK_STR(a.flag_keys[0], "elastic.nnodes=2");
    dt_args_free(&a);
    char *argv2[] = {"dtrain", "--standalone", "train.py", "--lr", "3", NULL};
    DT_REQUIRE_OK(dt_args_parse(&a, 5, argv2, &err), &err);
    DT_REQUIRE(a.n_command == 4);
    const char *py = strrchr(a.command[0], '/'); /* python3, as found in PATH */
    DT_CHECK_STR(py ? py + 1 : a.command[0], "python3");
    DT_CHECK_STR(a.command[1], "train.py");
    DT_CHECK_STR(a.command[2], "--lr");
    DT_CHECK_STR(a.flag_keys[0], "rendezvous.standalone=true");
    dt_args_free(&a);
    char *argv3[] = {"dtrain", "--", "sh", "-c", "echo hi", NULL};
    DT_REQUIRE_OK(dt_args_parse(&a, 5, argv3, &err), &err);
    DT_REQUIRE(a.n_command == 3);
    DT_CHECK_STR(a.command[0], "sh");
    dt_args_free(&a);
    char *argv4[] = {"dtrain", "job.ini", "--max_restarts=3", "train.lr=1", NULL};
    DT_REQUIRE_OK(dt_args_parse(&a, 4, argv4, &err), &err);
    DT_CHECK_STR(a.job_path, "job.ini");
    DT_CHECK_INT(a.n_overrides, 1);
    DT_CHECK_STR(a.flag_keys[0], "elastic.max_restarts=3");
    /* settings come lowest precedence first (overrides, then flags) and name their source */
    DT_REQUIRE(a.n_settings == 2);
    DT_CHECK_STR(a.settings[0].text, "train.lr=1");
    DT_CHECK(a.settings[0].source == NULL);
    DT_CHECK_STR(a.settings[1].text, "elastic.max_restarts=3");
    DT_CHECK_STR(a.settings[1].source, "--max-restarts");
    dt_args_free(&a);

    /* every error class: -EINVAL and a message naming the flag (and the spelling, when close) */
    static const struct {
        const char *argv[6];
        const char *want;
    } bad[] = {
        {{"--nproc_per_nod=2", "j.ini"}, "unknown option --nproc_per_nod; did you mean --nproc-per-node?"},
        {{"--zzzzzz", "j.ini"}, "unknown option --zzzzzz (see dtrain --help)"},
        {{"-x", "j.ini"}, "unknown option -x"},
        {{"--nnodes"}, "--nnodes needs a value"},
        {{"--nnodes=0", "j.ini"}, "--nnodes: "},
        {{"--master-port", "70000", "j.ini"}, "--master-port: 70000 is out of range"},
        {{"-r", "9", "j.ini"}, "-r/--redirects: "},
        {{"--rdzv-backend=zookeeper", "j.ini"}, "--rdzv-backend: \"zookeeper\" is not one of static|c10d|etcd"},
        {{"--rdzv-endpoint=h:x", "j.ini"}, "--rdzv-endpoint: endpoint \"h:x\""},
        {{"--rdzv-conf=bogus=1", "j.ini"}, "--rdzv-conf: unknown key \"bogus\""},
        {{"--standalone=maybe", "j.ini"}, "--standalone takes no value (or true/false)"},
        {{"--print-config=1", "j.ini"}, "--print-config takes no value"},
        {{"--start-method=thread", "j.ini"}, "--start-method: \"thread\" is not one of"},
        {{"-m", "pkg"}, "-m: dtrain runs commands: use -- python3 -m MODULE"},
        {{"--"}, "nothing after --"},
        {{"j.ini", "lr=3"}, "overrides are section.key=value"},
        {{"j.ini", "--", "true"}, "both a job file (j.ini) and a command"},
        {{NULL}, "no job given"},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(bad); i++) {
        char *argv[8] = {"dtrain"};
        int argc = 1;
        for (int k = 0; k < 6 && bad[i].argv[k]; k++)
            argv[argc++] = (char *)bad[i].argv[k];
        dt_err e = {0};
        int rc = dt_args_parse(&a, argc, argv, &e);
        DT_CHECK_MSG(rc == -EINVAL, "case %zu (%s): rc %d", i, bad[i].want, rc);
        DT_CHECK_MSG(strstr(e.msg, bad[i].want) != NULL, "case %zu: \"%s\" does not contain \"%s\"",
                     i, e.msg, bad[i].want);
        dt_args_free(&a);
    }
    /* a PET_* variable with a bad value names the variable */
    setenv("PET_NNODES", "x", 1);
    char *argv5[] = {"dtrain", "j.ini", NULL};
    DT_CHECK(dt_args_parse(&a, 2, argv5, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "environment PET_NNODES");
    dt_args_free(&a);
    unsetenv("PET_NNODES");
    setenv("PET_MAX_RESTARTS", "4", 1);
    char *argv6[] = {"dtrain", "j.ini", "--max-restarts=1", NULL};
    DT_REQUIRE_OK(dt_args_parse(&a, 3, argv6, &err), &err);
    DT_REQUIRE(a.n_settings == 2); /* PET first: the flag after it wins */
    DT_CHECK_STR(a.settings[0].source, "environment PET_MAX_RESTARTS");
    DT_CHECK_STR(a.settings[1].text, "elastic.max_restarts=1");
    dt_args_free(&a);
    unsetenv("PET_MAX_RESTARTS");
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"cli_help_and_version", test_help_and_version, 0},
        {"cli_bad_flags_exit_2", test_bad_flags_exit_2_with_suggestion, 0},
        {"cli_spellings_and_precedence", test_spellings_and_precedence, 0},
        {"cli_job_file_errors_exit_2", test_job_file_errors_exit_2, 0},
        {"cli_rdzv_conf_and_endpoint", test_rdzv_conf_and_endpoint, 0},
        {"cli_torchrun_parity", test_torchrun_parity, 0},
        {"cli_workers_get_the_flags", test_workers_get_the_flags, 0},
        {"cli_workers_load_the_resolved_job", test_workers_load_the_resolved_job, 120},
        {"cli_dtrain_log_levels", test_dtrain_log_levels, 0},
        {"cli_print_config_round_trips", test_print_config_every_shipped_file_round_trips, 0},
        {"cli_subcommand_dispatch", test_subcommand_dispatch, 0},
        {"cli_args_parser_unit", test_args_parser_unit, 0},
    };
    return dt_test_main("test_cli", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
