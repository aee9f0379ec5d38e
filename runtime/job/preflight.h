/* preflight.h - a loaded job against this node's file system, before anything starts.
 *
 * dt_job_load checks what the job says; this checks what the node has: the data files the job
 * reads are there and readable, and the directories it writes (job.output_dir, checkpoint.dir)
 * can be written. Each of these is a configuration error (no restart can fix it) that would
 * otherwise be found by the worker, after a rendezvous, a model build and often after training
 * (a read-only checkpoint.dir failed at the first save, every attempt). The launcher calls it
 * after loading the job (exit 2, "nothing was started"), every node for its own files (in a
 * static job of several nodes, which would wait for this one, its agent joins the first round
 * only to end the job there for every node: runtime/launch/agent.h's setup_error); the
 * built-in worker calls it again at its start (a worker run alone, or a file gone since), and
 * exits with the configuration code the agent does not retry.
 *
 * Nothing is created: a directory that does not exist yet is probed in its nearest existing
 * ancestor (the first save or the metrics file creates it, with the fsyncs that make it
 * durable). A probe creates and removes one empty file (.dtrain-probe-<pid>-XXXXXX).
 *
 * checkpoint.resume = PATH is not checked here: a missing path is the workers' configuration
 * error, which on a job of several nodes ends every node at once (a node that stopped at load
 * would leave the others waiting for it).
 */
#ifndef DT_PREFLIGHT_H
#define DT_PREFLIGHT_H

#include "runtime/job/config.h"

/* Appends one line to errs for each problem ("SOURCE: key: what; the fix", SOURCE being where
 * the key was set at the last load, dt_job_source); returns -EINVAL when it added any, else 0.
 * Checks data.path and data.val_path (not for synthetic data: exist, as a file, a directory or
 * a glob that matches a regular file, and can be read), job.output_dir and checkpoint.dir (or
 * <output_dir>/checkpoints): a directory, or one that can be created, where a file can be
 * created. */
int dt_preflight_check(const dt_job *job, dt_config_errors *errs);

#endif
