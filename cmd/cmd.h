/* cmd.h - the subcommands of the dtrain binary. cmd/ only parses and dispatches: each
 * subcommand parses its own arguments and calls into runtime/ or rendezvous/. Every function
 * returns the process exit code (0 success, 1 failure, 2 usage). */
#ifndef DT_CMD_H
#define DT_CMD_H

#include <stdbool.h>
#include <stdio.h>

#include "rendezvous/store_server.h"
#include "runtime/job/config.h"
#include "runtime/train/worker.h"

int dt_cmd_main(int argc, char **argv);   /* cmd/dtrain.c: dispatch and the default `run` */
int dt_cmd_worker(int argc, char **argv); /* cmd/worker.c: the built-in trainer */
int dt_cmd_store(int argc, char **argv);  /* cmd/store_cmd.c: standalone store server */
int dt_cmd_bench(int argc, char **argv);  /* cmd/bench/bench.c: dispatches to dt_bench_* */
int dt_cmd_ckpt(int argc, char **argv);   /* cmd/ckpt.c: list, show, verify */
int dt_cmd_debug(int argc, char **argv);  /* cmd/debug.c: dump, analyze (hang verdicts) */
int dt_cmd_plan(int argc, char **argv);   /* cmd/plan_cmd.c: layouts ranked (plan.h) */

/* Benchmarks: `dtrain bench NAME ...`, one file each (cmd/bench_NAME.c). */
int dt_bench_store(int argc, char **argv);
int dt_bench_rdzv(int argc, char **argv);
int dt_bench_launch(int argc, char **argv);
int dt_bench_kernels(int argc, char **argv);
int dt_bench_train(int argc, char **argv);
int dt_bench_allreduce(int argc, char **argv);
int dt_bench_dp_vs_ddp(int argc, char **argv);
int dt_bench_ckpt(int argc, char **argv);
/* `dtrain bench ckpt --ranks LIST JOB ...` (bench_ckpt_ranks.c): sharded against whole saves
 * on each number of ranks. */
int dt_bench_ckpt_ranks(const char *ranks, const char *job, char **ov, int nov,
                        const char *dir_opt);
int dt_bench_memory(int argc, char **argv);
int dt_bench_pipeline(int argc, char **argv);
int dt_bench_tensor(int argc, char **argv);

/* The absolute path of the running dtrain binary (for exec of `dtrain worker`). */
const char *dt_cmd_self_path(void);

/* A bench's command line (cmd/bench/bench.c): options that take a value (an int >= 0 into ival, or a
 * string into sval; exactly one of the two is set), `section.key=value` overrides appended to
 * ovr[*n_ovr] (room for argc), and one job file into *job_path. Returns 0; 1 after
 * print_usage(stdout) for --help/-h (the caller exits 0); 2 after saying what is wrong (name,
 * "dtrain bench NAME", starts the message), with print_usage(stderr) for an unknown option. */
typedef struct dt_bench_opt {
    const char *flag;
    int *ival;
    const char **sval;
} dt_bench_opt;
int dt_bench_parse_args(int argc, char **argv, const char *name, const dt_bench_opt *opts,
                        int nopts, const char **job_path, char **ovr, int *n_ovr,
                        void (*print_usage)(FILE *out));

/* The benches' ranks (cmd/bench/bench.c): forks n processes that exec av (this binary's path first,
 * NULL-terminated, built by the caller before any fork: a child only execs, as the caller may
 * run a store thread) with av[rank_slot] = the rank "0".."n-1" and, when out_slot >= 0,
 * av[out_slot] = out_prefix followed by the rank; waits for all of them, and once one fails
 * (or a fork did) stops the others with SIGTERM. status[r] gets each waitpid status, or -1 for
 * a rank that could not be started. Returns 0 when every rank exited 0, else 1. */
int dt_bench_run_ranks(char **av, int rank_slot, int out_slot, const char *out_prefix, int n,
                       int *status);

/* The benches' store (cmd/bench/bench.c): a store server on 127.0.0.1 and an ephemeral port, its port
 * written into port[0..cap) as text. Returns 0; 1 after "dtrain bench NAME: <why>" on stderr
 * (*srv then NULL). Stop it with dt_store_server_stop. */
int dt_bench_store_start(const char *name, dt_store_server **srv, char *port, size_t cap);

/* A run of a bench's child ranks (cmd/bench/bench.c): n processes of this binary, each with "bench",
 * then the words of parts[0..nparts) in order, then "--child-rank R --child-port PORT
 * --child-run-id RUN_ID --child-out OUT_PREFIX<R>", run as dt_bench_run_ranks runs them. With
 * with_store, a store (dt_bench_store_start, NAME in its message) serves them and is stopped
 * after; without, PORT is 0. Returns 0 when every rank exited 0, else 1. */
typedef struct dt_bench_words {
    char *const *w;
    int n;
} dt_bench_words;
int dt_bench_children(const char *name, bool with_store, const dt_bench_words *parts,
                      int nparts, const char *run_id, const char *out_prefix, int n);

/* One configuration of a bench (cmd/bench/bench.c): dt_bench_children(name, with_store, parts) on n
 * ranks, run id "bench-TAG-<pid>-ID", the ranks' outputs DIR/ID.<R>; then, when every rank exited
 * 0, each output read back in rank order with read(path, R, ctx) until one fails (non-zero).
 * Returns 0, or 1 when a rank or a read failed. */
int dt_bench_config(const char *name, const char *tag, bool with_store,
                    const dt_bench_words *parts, int nparts, const char *dir, const char *id,
                    int n, int (*read)(const char *path, int rank, void *ctx), void *ctx);

/* The main of a bench that runs ranks of itself (cmd/bench/bench.c), the steps every one takes:
 * parses argv against opts and the child ranks' options (--child, --child-rank, --child-port,
 * --child-run-id, --child-out into the fields below) with dt_bench_parse_args ("dtrain bench
 * NAME") into *job_path and *overrides (room for argc, owned here: valid until
 * dt_bench_main_run returns); without a job
 * file print_usage(stderr) and exit code 2; then check(o) when set (non-zero: the exit code,
 * after its own message); then starts the log. A child (*child set by --child) sets the log's
 * rank to *rank and runs run_child(o). The parent gets a fresh directory /tmp/dtrain-TAG-XXXXXX,
 * runs run_parent(o, dir) and removes the directory after ("dtrain bench NAME: could not remove
 * DIR" when that fails). Returns the exit code: 0 after --help, 2 for a bad command line, 1
 * when memory or the directory could not be had, else run_child's or run_parent's result. */
/* What every bench's command line gives: the job, the user's overrides, and in a child rank
 * the --child* options (the child's kind, its rank, the store's port, the run id, its result
 * file). Each bench embeds one in its options. */
typedef struct dt_bench_args {
    const char *job_path;
    char **overrides; /* the user's, then (children) the configuration's */
    int n_overrides;
    const char *child; /* --child's value: non-NULL in a child rank */
    int rank;          /* --child-rank's */
    int port;          /* --child-port's: the store's */
    const char *run_id; /* --child-run-id's */
    const char *out;   /* --child-out's: the rank's result file */
} dt_bench_args;

typedef struct dt_bench_main {
    const char *name;             /* "memory": in "dtrain bench memory: ..." */
    const char *tag;              /* in the directory's name */
    const dt_bench_opt *opts;     /* the bench's own options (pointing into *o) */
    int nopts;
    void (*print_usage)(FILE *out);
    void *o;                      /* the bench's options; args points into it */
    dt_bench_args *args;          /* filled from the command line (points into *o) */
    int (*check)(void *o);        /* may be NULL */
    int (*run_child)(void *o);
    int (*run_parent)(void *o, const char *dir);
} dt_bench_main;
int dt_bench_main_run(const dt_bench_main *m, int argc, char **argv);

/* A bench's job (cmd/bench/bench.c): job_path with the command line's overrides ov[0..n_ov) and then
 * more[0..n_more) (later ones win); *errs cleared first and filled as dt_job_load fills it.
 * Returns dt_job_load's result, or -ENOMEM with err set. */
int dt_bench_load_job(const char *job_path, char *const *ov, int n_ov, char *const *more,
                      int n_more, dt_job *job, dt_config_errors *errs, dt_err *err);

/* The parent's job of `dtrain bench NAME` (cmd/bench/bench.c): dt_bench_load_job into *job; on failure
 * prints the config errors, a line each, then "dtrain bench NAME: <error>" on stderr and
 * returns 1; else 0. */
int dt_bench_parent_job(const char *name, const char *job_path, char *const *ov, int n_ov,
                        char *const *more, int n_more, dt_job *job);

/* A bench's child rank (cmd/bench/bench.c): loads job_path with the overrides ov[0..n_ov), then
 * train.steps=steps (when steps > 0), job.output_dir=<out>.run, no checkpoints and no eval, and
 * starts the trainer *t on *job as rank `rank` of nproc on this host (against the store on
 * 127.0.0.1:port when nproc > 1), run id run_id. Returns 0; else the error, with err set and
 * the job's config errors printed on stderr, a line each. */
int dt_bench_child_trainer(dt_trainer *t, dt_job *job, const char *job_path, char *const *ov,
                           int n_ov, int steps, const char *out, int rank, int nproc, int port,
                           const char *run_id, dt_err *err);

#endif
