/* ckpt.h - checkpoints: atomic, verifiable, resumable on any world size.
 *
 * Layout (DESIGN.md, "Checkpoints"): a checkpoint is a directory <dir>/step_<N>/ holding
 *
 *     model.safetensors   the model's parameters and non-trained buffers (BatchNorm statistics)
 *     optim.safetensors   the optimiser state (under the names the optimiser gives it), whole,
 *                         not per rank
 *     state.json          step, epoch, global sample position, RNG states, schedule and other
 *                         scalars, the resolved job (INI), the tensor table, and the size and
 *                         XXH64 of every file; it also carries a checksum of itself
 *
 * Each group of tensors registered with dt_ckpt_open says which file it goes to. The safetensors
 * files are plain safetensors (runtime/train/ckpt/safetensors.h): any standard reader loads model.safetensors.
 *
 * Atomicity. A save writes <dir>/step_<N>.tmp/, fsyncs every file and that directory, renames it
 * to step_<N> and fsyncs <dir>. A crash at any point leaves either the complete step_<N> or a
 * .tmp directory that discovery ignores (and the next save removes). Only after the new
 * checkpoint is complete are older ones beyond `keep` removed, so a full disk or a crash never
 * costs the checkpoints already there; a failed save removes its .tmp directory and says how much
 * space it needed and found.
 *
 * Background writing. dt_ckpt_save holds the caller only while it copies the buffers to host
 * memory (backend memcpy_d2h into a staging area allocated once); a writer thread does the
 * serialisation, hashing, writing and fsyncs. The next save, dt_ckpt_wait and dt_ckpt_close
 * wait for the previous one, and report its failure. With host-memory buffers (the CPU
 * backend) there is no copy at all (direct; opts.host_copy keeps one, taken by the writer thread
 * while the next forward and backward run): parameters and optimiser state change only in the
 * optimiser update, so the writer thread reads them in place while the next forward and
 * backward run (concurrent_copy), and dt_ckpt_fence (called before the update) waits until the
 * write is done; a synchronous save reads them in place too. Only copy_at_save buffers are
 * copied, at the save. Whatever host memory the checkpoint holds on such a backend (the write
 * buffer, copies, a load's staging, which a direct checkpoint frees after the load) is charged
 * to the backend's accounting as "other" (dt_mem_external): it is the device's memory there.
 *
 * Verification. Loading checks, before anything is copied into the model: state.json parses and
 * matches its own checksum; every file exists with the recorded size and XXH64; every
 * safetensors header is valid and lists exactly the registered tensors with their shapes. A
 * checkpoint written for another setup (another model: different tensors or shapes; another
 * optimizer: different per-parameter state, see dt_ckpt_buf) is "foreign". With resume=auto,
 * discovery walks step_<N> from newest to oldest and skips any that is incomplete or corrupt,
 * logging a warning that names the checkpoint and what is wrong (and names any step_<N> that
 * is not a directory, or a step_<N> whose state.json is another step's: a copy or a rename);
 * a foreign one is skipped too, but when none loads that is an error (-EXDEV: the directory
 * is another job's), and so it is when every one is damaged (-EBADMSG: never a fresh start
 * over checkpoints that may be repaired by hand). An explicit path that fails is an error.
 * A save never replaces a foreign checkpoint of the same step (-EEXIST; dt_ckpt_check_ahead
 * finds those before training), nor a damaged one of this setup, which it moves aside to
 * step_<N>.damaged (a name discovery ignores and nothing removes); retention removes neither
 * (a checkpoint beyond `keep` is verified in full before it is removed). A directory where a
 * save could not succeed (a file named step_<N>, or checkpoint.dir itself a file) is refused by
 * dt_ckpt_open, before any training.
 *
 * World size. Tensors are whole and the data position is a global sample index, so a checkpoint
 * written by W ranks resumes on any number of ranks at the same step and sample position.
 *
 * Sharded (format version 2, opts.pieces). Every rank writes the pieces it owns (its ZeRO shard,
 * its tensor-parallel slices, its stage's tensors: dt_ckpt_piece) to its own
 * shard-<rank>-of-<world>.safetensors in step_<N>.tmp/, each piece a 1-D tensor, in parallel;
 * state.json, written last by rank 0, keeps the tensor table of whole tensors and lists every
 * piece (tensor, file, byte offset, element range of the owner's slice, the slice, XXH64) and
 * every shard file (size, XXH64). The steps: rank 0 empties and creates step_<N>.tmp (inside
 * dt_ckpt_save, on the caller's thread; every rank then learns its outcome through opts.comm);
 * each rank copies its pieces (only its own: staging of its shard, not of the model), writes and
 * fsyncs its file, then publishes shard-<rank>.json (written, fsynced, renamed: it exists only
 * complete); rank 0 waits for all of them (a rank that fails leaves shard-<rank>.failed, which
 * ends the wait with its reason), checks that the pieces tile every tensor, writes state.json,
 * and commits as above (fsync of the directory, rename, fsync of its parent, retention). A
 * crash anywhere leaves step_<N>.tmp. Loading reads the pieces through a bounded buffer
 * (opts.io_buffer) into the registered buffers, after a first pass that checked every file
 * (size, header, XXH64) and every piece; checkpoints of either version load.
 *
 * Threads: one dt_ckpt is used by one thread (plus its own writer thread).
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/train/models/model.h"

#define DT_CKPT_FORMAT "dtrain-checkpoint"
#define DT_CKPT_VERSION 1          /* whole tensors, written by one rank */
#define DT_CKPT_VERSION_SHARDED 2  /* every rank's own shard file, and the pieces in state.json */
#define DT_CKPT_IO_BUFFER_DEFAULT (64u << 20)
#define DT_CKPT_NAME_MAX 48    /* RNG and scalar names */
#define DT_CKPT_MAX_RNG 8
#define DT_CKPT_MAX_SCALARS 32

/* A worker that stopped on SIGTERM, SIGUSR1 or SIGUSR2 after saving a checkpoint exits
 * DT_EXIT_PREEMPTED (runtime/job/workenv.h): running the same command again resumes. */

/* One flat float32 buffer saved as named tensors: a model's parameters or buffers, or an
 * optimiser state buffer laid out like the parameters.
 *
 * The prefix tells the two kinds apart: a buffer without one holds the model's own tensors, a
 * buffer with one holds per-parameter state under names the caller chose (the optimiser owns
 * them, e.g. "exp_avg." + "h.0.mlp.weight"). The checkpoint code knows no optimiser and no
 * state name: when a checkpoint's table differs from the registration, it is "written for
 * another model" when the model's own tensors (and the files that hold them) differ, and
 * "written with another optimizer" when only the rest does; that message names the state each
 * side keeps (the registered prefixes here, the prefixes of the checkpoint's other tensors
 * there). Keep the model's tensors and the state in different files. */
typedef struct dt_ckpt_buf {
    const char *file;               /* <file>.safetensors: a-z and _, e.g. "model", "optim" */
    const char *prefix;             /* prepended to every tensor name: "" (or NULL) for the
                                     * model's own tensors, e.g. "exp_avg." for state */
    const dt_tensor_info *tensors;  /* (num_tensors) borrowed; offsets in elements into data */
    int num_tensors;
    float *data;                    /* (numel) backend memory of `be`, borrowed */
    size_t numel;
    bool copy_at_save;              /* with concurrent_copy: copied inside dt_ckpt_save anyway
                                     * (buffers the next forward changes: BatchNorm statistics) */
} dt_ckpt_buf;

/* Everything besides tensors that a resumed run needs. */
typedef struct dt_ckpt_state {
    int64_t step;          /* optimiser steps completed */
    int64_t epoch;         /* epoch the next step draws from */
    int64_t sample_pos;    /* global sample index in that epoch where the next step starts */
    int64_t samples_seen;  /* samples consumed since the start of training, all ranks together */
    int world_size;        /* ranks of the run that saved (informational: any may resume) */
    double loss;           /* training loss of the last step (NAN when unknown) */
    double lr;             /* learning rate of the last step */
    double time;           /* wall-clock time of the save (Unix seconds); set by dt_ckpt_save */
    char run_id[128];      /* run that saved ("" when none) */
    int num_rng;
    struct {
        char name[DT_CKPT_NAME_MAX];
        dt_rng rng;
    } rng[DT_CKPT_MAX_RNG];        /* named RNG states (e.g. "data", "dropout") */
    int num_scalars;
    struct {
        char name[DT_CKPT_NAME_MAX];
        double value;              /* exact for integers up to 2^53 */
    } scalars[DT_CKPT_MAX_SCALARS]; /* named scalars: schedule state, optimiser step count... */
    char *job;             /* the resolved job as INI (dt_job_print) or NULL. For dt_ckpt_save:
                            * borrowed. Filled by loads: owned, freed by dt_ckpt_state_clear. */
} dt_ckpt_state;

/* Zeroes st (loss NAN). */
void dt_ckpt_state_init(dt_ckpt_state *st);
/* Frees st->job when a load filled it, and re-initialises st. */
void dt_ckpt_state_clear(dt_ckpt_state *st);
/* Sets (adds or replaces) a named RNG state / scalar. -ENOSPC when the table is full, -EINVAL
 * for a name that is empty or too long. */
int dt_ckpt_state_set_rng(dt_ckpt_state *st, const char *name, const dt_rng *rng);
int dt_ckpt_state_set_scalar(dt_ckpt_state *st, const char *name, double value);
/* Looks one up: 0, or -ENOENT (out untouched). */
int dt_ckpt_state_get_rng(const dt_ckpt_state *st, const char *name, dt_rng *out);
int dt_ckpt_state_get_scalar(const dt_ckpt_state *st, const char *name, double *out);

/* A run of a registered tensor that this rank owns and writes itself in a sharded save: elements
 * [start, start + n) of `local`, the tensor as this rank holds it, at data. local is the whole
 * tensor (tp_parts 0) or tensor-parallel rank tp_rank's slice of it (model.h's rule: tp_dim,
 * tp_parts, shape; the whole shape is the registered one). The pieces of all ranks of a sharded
 * save tile every registered tensor once (padding of a slice aside: written, never read). */
typedef struct dt_ckpt_piece {
    char name[160];                /* the registered tensor: prefix + name */
    const dt_tensor_info *local;   /* borrowed (offset unused), outlives the dt_ckpt */
    int tp_rank;
    size_t start, n;               /* elements of local, n > 0 */
    const float *data;             /* (n) backend memory of be, borrowed, outlives the dt_ckpt */
} dt_ckpt_piece;

typedef struct dt_ckpt_opts {
    const char *dir;    /* checkpoint directory (created by the first save); copied */
    int keep;           /* newest checkpoints kept (>= 1) */
    bool async;         /* write in a background thread (else dt_ckpt_save writes itself) */
    bool concurrent_copy; /* async and host memory (be NULL or "cpu") only, else ignored: the
                           * writer thread writes the buffers not marked copy_at_save from where
                           * they are (host_copy: copies them first) while training goes on;
                           * the caller MUST call dt_ckpt_fence before it changes them (before
                           * the next optimiser update) */
    /* Sharded saves (format version 2, "Sharded" above): every rank calls dt_ckpt_save at the
     * same steps and writes pieces[0..npieces) (copied; may be empty) to its own file; rank 0
     * writes state.json last, once every rank's file is durable. false: the whole-tensor
     * format, rank 0 alone (the fields below but io_buffer unused: it caps the write
     * buffer). */
    bool sharded;
    const dt_ckpt_piece *pieces;
    int npieces;
    dt_comm *comm;      /* borrowed: the world, for the start of every save (NULL: one rank) */
    int rank, world;
    size_t io_buffer;   /* bytes of the read and write buffers (0: DT_CKPT_IO_BUFFER_DEFAULT) */
    bool host_copy;     /* copy the buffers at a save even where the writer could read them in
                         * place (host memory): the caller is held less, for that copy's memory */
    double timeout_s;   /* rank 0 waits at most this long for the other ranks' files (0: 600) */
} dt_ckpt_opts;

typedef struct dt_ckpt dt_ckpt;

/* Registers the buffers a checkpoint consists of (bufs is copied, with its file and prefix
 * strings; the data pointers and tensor tables stay borrowed and must outlive the dt_ckpt). be
 * is the backend that owns the data (borrowed); NULL means plain host memory. Fails with -EINVAL
 * on a duplicate tensor name, a tensor outside its buffer, or a bad file name; with -ENOTDIR
 * when a save could not succeed because of what is already on disk: opts->dir (or a part of
 * its path) is a file, or it holds a step_<N> that is not a directory (the message names it). */
int dt_ckpt_open(dt_ckpt **out, const dt_ckpt_opts *opts, dt_backend *be, const dt_ckpt_buf *bufs,
                 int nbufs, dt_err *err);

/* Sharded: replaces the pieces this rank writes from the next save on (copied, as opts.pieces),
 * after waiting for a save in flight (its time counts as the next save's hold). What a rank
 * owns may move between saves (ZeRO-1/2's buckets are laid out anew after the first step), so
 * the caller gives them before every save. -EINVAL for a piece that is not registered or does
 * not fit its tensor (the pieces are then none until the next call). */
int dt_ckpt_set_pieces(dt_ckpt *c, const dt_ckpt_piece *pieces, int npieces, dt_err *err);

/* Waits for a background write, reporting its failure in the log, and frees everything.
 * Accepts NULL. */
void dt_ckpt_close(dt_ckpt *c);

/* Saves step st->step: waits for the previous save (if that one failed, returns its error and
 * starts nothing), copies every buffer to host memory, then writes <dir>/step_<step>/ in the
 * background (async) or before returning. st is copied (st->job too). A valid checkpoint of
 * the same step already on disk is replaced atomically; a damaged one is moved aside to
 * step_<N>.damaged (step_<N>.damaged.<k> when that is taken), with a warning. On failure nothing under <dir> changes except
 * that a leftover .tmp directory is removed. */
int dt_ckpt_save(dt_ckpt *c, const dt_ckpt_state *st, dt_err *err);

/* With concurrent_copy: returns once the last save has read the buffers (written them: no
 * copy is made), so they may change (call it before every optimiser update; it returns at once
 * when there is nothing to wait for).
 * The time it waits counts as time the save held training. Without concurrent_copy: no-op. */
void dt_ckpt_fence(dt_ckpt *c);

/* Waits for the background write, if any. Returns its result: 0, or its error (reported once). */
int dt_ckpt_wait(dt_ckpt *c, dt_err *err);

/* Figures of the last completed save, for logs and `dtrain bench ckpt`. */
typedef struct dt_ckpt_stats {
    int saves;              /* completed saves */
    int64_t last_step;      /* step of the last completed save (-1 when none) */
    char last_path[1024];   /* its directory */
    uint64_t bytes;         /* size of the last checkpoint (all files) */
    double hold_s;          /* time the last save held its caller: in dt_ckpt_save + fence */
    double wait_s;          /* of which: waiting for the save before it */
    double fence_s;         /* of which: waiting in dt_ckpt_fence for a concurrent copy */
    double copy_s;          /* copying the buffers to host memory (concurrent_copy: in part
                             * while training went on) */
    double write_s;         /* time the write took (serialise, hash, write, fsync, rename) */
    double fsync_s;         /* of which: fsyncs */
    uint64_t own_bytes;     /* bytes this rank wrote (sharded: its shard file; else = bytes) */
    double commit_wait_s;   /* sharded, rank 0: waiting for the other ranks' files */
} dt_ckpt_stats;

void dt_ckpt_get_stats(dt_ckpt *c, dt_ckpt_stats *out);

/* Loads the checkpoint directory `path` into the registered buffers and *st (cleared first;
 * st->job owned, see dt_ckpt_state_clear). Everything is verified before any buffer changes;
 * on failure the buffers and *st are untouched. Errors: -ENOENT (missing directory or file),
 * -EBADMSG (corrupt: checksum, size or format), -EXDEV (foreign: written for another model,
 * the message names the first difference). */
int dt_ckpt_load(dt_ckpt *c, const char *path, dt_ckpt_state *st, dt_err *err);

/* Resolves `resume` and loads:
 *   "never"  *resumed = false; nothing read.
 *   "auto"   the newest checkpoint under the directory that loads; every newer one that is
 *            incomplete or corrupt is skipped with a warning naming it and the reason. None:
 *            *resumed = false. A foreign one met on the way: -EXDEV, with what differs and
 *            what to do (another checkpoint.dir, or resume = never).
 *   a path   that checkpoint (a step_<N> directory); any failure is an error.
 * *path_out (may be NULL, size bytes) gets the directory loaded. */
int dt_ckpt_resume(dt_ckpt *c, const char *resume, dt_ckpt_state *st, bool *resumed,
                   char *path_out, size_t size, dt_err *err);

/* "auto" limited to the checkpoints run run_id wrote (state.json's run_id). For restarts of a
 * job that began from an explicit checkpoint path: the checkpoints it has written since are
 * newer than that path, and a restart must not go back to it. run_id NULL: any run's, which is
 * exactly "auto". */
int dt_ckpt_resume_run(dt_ckpt *c, const char *run_id, dt_ckpt_state *st, bool *resumed,
                       char *path_out, size_t size, dt_err *err);

/* Refuses another setup's checkpoints at the steps a run from step `from` to step `to` may save
 * (from < N <= to: every checkpoint.every, the last step, a preemption's step): -EXDEV naming
 * the oldest such one and what differs, so that the job stops before training rather than at
 * that save (which never replaces it). Damaged checkpoints there are not refused: the save moves
 * them aside (step_<N>.damaged). 0 when there is none. */
int dt_ckpt_check_ahead(dt_ckpt *c, int64_t from, int64_t to, dt_err *err);

/* Makes every rank resume from the same checkpoint. Every rank first resumes on its own (each
 * reads the checkpoint directory); then all ranks call this (collective through comm; nothing to
 * do when comm is NULL or has one rank). The source is the rank that found the newest step (the
 * lowest such rank): *src_rank, *src_step (-1: no rank found any). When every rank resumed at
 * that step, or none found any, nothing more moves. Otherwise (a checkpoint directory that is
 * not shared between nodes, or holds other steps on some node) every rank takes the source's
 * state (*st, *resumed; st->job is not sent: NULL on the others) and the checkpointed buffers by
 * broadcast, and *adopted tells the ranks whose own outcome differed. */
int dt_ckpt_sync(dt_ckpt *c, dt_comm *comm, int rank, dt_ckpt_state *st, bool *resumed,
                 int *src_rank, int64_t *src_step, bool *adopted, dt_err *err);

/* ---- tools (no model needed) ---- */

typedef struct dt_ckpt_tensor_desc {
    char name[160];
    char file[16];          /* "model", "optim" */
    char dtype[12];         /* "F32" */
    int ndim;
    int64_t shape[8];
} dt_ckpt_tensor_desc;

typedef struct dt_ckpt_file_desc {
    char name[64];          /* "model.safetensors", "shard-00001-of-00004.safetensors" */
    uint64_t bytes;
    uint64_t xxh64;
} dt_ckpt_file_desc;

/* What a checkpoint holds, as read by dt_ckpt_inspect. */
typedef struct dt_ckpt_info {
    dt_ckpt_state state;            /* st.job owned */
    int num_tensors;
    dt_ckpt_tensor_desc *tensors;   /* (num_tensors) owned */
    int num_files;
    dt_ckpt_file_desc *files;       /* (num_files) owned */
    int version;                    /* DT_CKPT_VERSION or DT_CKPT_VERSION_SHARDED */
    int num_pieces;                 /* sharded: the pieces state.json lists */
} dt_ckpt_info;

/* Reads state.json of checkpoint `path` (checking its own checksum) and checks that every file
 * it lists is there with its recorded size; when verify is true, also reads every file (XXH64,
 * safetensors header against the table). 0 when valid; else
 * -ENOENT, -EBADMSG as for dt_ckpt_load, with the reason in err. info (may be NULL) is filled
 * as far as state.json allowed; free it with dt_ckpt_info_free in every case. */
int dt_ckpt_inspect(const char *path, bool verify, dt_ckpt_info *info, dt_err *err);
void dt_ckpt_info_free(dt_ckpt_info *info);

/* Writes the model's own tensors (those of the "model" files: parameters and buffers, no
 * optimiser state) of checkpoint `path`, either version, verified first, as one whole-tensor
 * safetensors file `out` (the usual names, "format": "pt"), tensor by tensor: at most one
 * tensor and a read buffer of io bytes (0: the default) in memory. out is written as out.tmp,
 * fsynced and renamed. *bytes (may be NULL) gets its size. Errors as dt_ckpt_inspect's, or the
 * write's naming out. */
int dt_ckpt_export(const char *path, const char *out, size_t io, uint64_t *bytes, dt_err *err);

/* The step_<N> directories under dir, newest first: *steps (malloc'd, caller frees) and *count.
 * A missing dir is an empty list. Directories not named step_<digits> are ignored. */
int dt_ckpt_list(const char *dir, int64_t **steps, int *count, dt_err *err);

/* The entries under dir named like a checkpoint (step_<digits>) that are not directories (a
 * regular file, a dangling link), newest first, as dt_ckpt_list. Resume skips them with a
 * warning; dt_ckpt_open refuses a directory that holds one. */
int dt_ckpt_list_strays(const char *dir, int64_t **steps, int *count, dt_err *err);

/* ---- the system calls, replaceable so tests can inject failures (as SQLite's VFS) ---- */

typedef struct dt_ckpt_io {
    int (*open)(const char *path, int flags, mode_t mode);
    ssize_t (*read)(int fd, void *buf, size_t n);
    ssize_t (*write)(int fd, const void *buf, size_t n);
    int (*fsync)(int fd);
    int (*close)(int fd);
    int (*mkdir)(const char *path, mode_t mode);
    int (*rename)(const char *from, const char *to);
} dt_ckpt_io;

/* The real system calls. */
extern const dt_ckpt_io dt_ckpt_io_posix;
/* Replaces the table used by every dt_ckpt from now on (NULL restores the real calls). For
 * tests; call it while no save is in flight. */
void dt_ckpt_set_io(const dt_ckpt_io *io);

#endif
