/* ckpt_core.h - what the checkpoint files share; internal to runtime/train/ckpt_*.c.
 *
 * The public contract is ckpt.h; nothing outside the ckpt_*.c files includes this header. The
 * checkpoint code is one object (struct dt_ckpt, below) worked on by four files:
 *
 *   ckpt.c    the object (registration, staging area, open/close), the state helpers,
 *                  the system call table, discovery of step_<N> directories
 *   ckpt_write.c   saving: serialisation, hashing, the atomic write, retention, writer thread
 *   ckpt_read.c    reading: verification, foreign-checkpoint detection, load, resume, inspect
 *   ckpt_sync.c    the cross-rank agreement on the checkpoint resumed from
 *
 * Dependencies point one way: write -> read -> core, sync -> core. Names shared between these
 * files are dt_ckpt__<name> (two underscores: internal, as libuv's uv__).
 */
#ifndef DT_CKPT_CORE_H
#define DT_CKPT_CORE_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/train/ckpt/ckpt.h"

#define DT_CKPT_IO_CHUNK (4u << 20)          /* write buffer and read chunk */
#define DT_CKPT_SELF_KEY "\"state_xxh64\""   /* state.json's checksum of itself ... */
#define DT_CKPT_ZERO16 "0000000000000000"    /* ... hashed with this in its place */
#define DT_CKPT_MAX_FILES 4                  /* .safetensors files of one checkpoint */

struct cJSON;

/* One registered tensor. */
typedef struct dt_ckpt_entry {
    char *name;          /* prefix + tensor name, owned */
    int file;            /* index into c->files */
    int buf;             /* index into c->bufs */
    int ndim;
    int64_t shape[DT_TENSOR_MAX_DIMS];
    size_t numel;
    size_t src_off;      /* elements into its buffer */
    size_t stage_off;    /* elements into the staging area */
    bool state;          /* registered with a prefix: per-parameter state (an optimiser's, named
                          * by the caller), not one of the model's own tensors */
} dt_ckpt_entry;

/* One piece this rank writes in a sharded save (ckpt.h's dt_ckpt_piece, resolved). */
typedef struct dt_ckpt_pc {
    dt_ckpt_piece p;       /* p.name points at key's tensor name (entries[entry].name) */
    int entry;             /* the registered tensor */
    char *key;             /* its name in the shard file (the tensor's, "#2".. for another
                            * piece of it), owned */
    size_t stage_off;      /* elements into c->pstage */
    bool early;            /* its buffer is copy_at_save */
    uint64_t offset;       /* of the last save: its bytes' offset in the shard file */
    uint64_t xxh64;        /* ... and their XXH64 */
} dt_ckpt_pc;

/* A piece as state.json lists it (reading). */
typedef struct dt_ckpt_pdesc {
    int tensor;            /* index into the table read with it */
    int file;              /* index into the files read with it */
    char key[200];
    uint64_t offset;       /* bytes from the start of the file */
    size_t start, n;       /* elements of the owner's local tensor */
    int tp_dim, tp_parts, tp_rank, ndim;
    int64_t shape[DT_TENSOR_MAX_DIMS]; /* the local tensor's (tp_parts > 0) */
    uint64_t xxh64;
    bool unhashed;         /* a whole tensor of a version 1 file: its file's XXH64 covers it */
} dt_ckpt_pdesc;

struct dt_ckpt {
    char dir[PATH_MAX - 1024]; /* leaves room for /step_<N>.tmp/<file> in PATH_MAX */
    int keep;
    bool async;
    bool concurrent;           /* async and host memory: the writer thread copies (see fence) */
    bool direct;               /* host memory, and the caller does not change the buffers
                                  before the save is written (a synchronous save, or
                                  concurrent_copy's fence): the writer reads them in place, and
                                  only the copy_at_save buffers are copied (see ckpt.h) */
    dt_backend *be;            /* borrowed; NULL = host memory */
    int nbufs;
    dt_ckpt_buf *bufs;         /* copies; file points into files, prefix into prefixes */
    char **prefixes;           /* (nbufs) owned copies of the buffers' prefixes */
    size_t *buf_stage_off;     /* (nbufs) where each buffer starts in staging, in elements */
    int nentries;
    dt_ckpt_entry *entries;    /* registration order */
    int nfiles;
    char files[DT_CKPT_MAX_FILES][16];
    float *staging;            /* (staging_numel) host copy of every buffer, allocated once (a
                                  load's too; direct: a load's only, freed after it) */
    size_t staging_numel;
    float *estage;             /* direct: (estage_numel) host copy of the copy_at_save buffers,
                                  buffer b's at buf_early_off[b] */
    size_t estage_numel;
    size_t *buf_early_off;     /* (nbufs) */
    /* sharded saves (npc >= 0) */
    bool sharded;
    int rank, world;
    dt_comm *comm;             /* borrowed */
    size_t io_buffer;          /* bytes */
    double timeout_s;
    int npc;
    dt_ckpt_pc *pcs;           /* (npc) owned */
    float *pstage;             /* (pstage_cap) host copy of this rank's pieces (direct: of the
                                  early ones), allocated on use */
    char *wbuf;                /* (dt_ckpt__wbuf_bytes) the write buffer, allocated on use */
    size_t charged;            /* bytes of staging, pstage and wbuf charged to be as "other"
                                  (be's memory is the host's: dt_mem_external) */
    size_t pstage_numel, pstage_cap;
    double pre_wait_s;         /* dt_ckpt_set_pieces waited for the last save this long */
    double commit_wait_s;      /* writer thread: rank 0 waited for the other ranks' shards */

    /* writer thread; everything below is guarded by mu */
    pthread_t thread;
    bool thread_started, pending, busy, quit;
    bool copy_pending;         /* the writer still has to copy the late buffers */
    bool fence_waiting;        /* the caller is blocked in dt_ckpt_fence since fence_start */
    double fence_start, fence_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dt_ckpt_state wstate;      /* the save being written; wstate.job owned */
    int result;                /* of the last write */
    bool result_reported;
    dt_err result_err;
    dt_ckpt_stats stats;
    double hold_s, wait_s, copy_s; /* of the save being written */
};

/* ---- ckpt.c ---- */

/* The system call table in use (dt_ckpt_set_io). */
extern const dt_ckpt_io *dt_ckpt__io;

/* write(2) until done through the table; EINTR retried, a short write continued. 0 or -errno. */
int dt_ckpt__write_all(int fd, const void *buf, size_t n);
/* 16 lower-case hex digits (an XXH64 as the checkpoint files write it) -> *out; -EINVAL else. */
int dt_ckpt__parse_hex64(const char *s, uint64_t *out);
/* read(2) exactly n bytes through the table; -EPIPE at end of file first. */
int dt_ckpt__read_all(int fd, void *buf, size_t n);
/* Opens path (a directory when dir), fsyncs it, closes it; 0 or -errno with the path in err. */
int dt_ckpt__fsync_path(const char *path, bool dir, dt_err *err);

/* Whether name is "step_<digits><suffix>"; *step gets the number. */
bool dt_ckpt__parse_step_name(const char *name, int64_t *step, const char *suffix);

/* Whether saves into dir can succeed as far as the directory goes: -ENOTDIR when dir (or a
 * part of its path) is a file, or dir holds an entry named like a checkpoint (step_<N>) that is
 * not a directory (a save of step N would fail at its rename); err names it and what to do. A
 * missing dir is fine (the first save creates it). */
int dt_ckpt__check_dir(const char *dir, dt_err *err);

/* Allocates the staging area on first use (-ENOMEM with the size in err). */
int dt_ckpt__ensure_staging(dt_ckpt *c, dt_err *err);
/* Frees the staging area (a direct checkpoint's load is done with it). */
void dt_ckpt__drop_staging(dt_ckpt *c);
/* Allocates c->estage on first use. */
int dt_ckpt__ensure_estage(dt_ckpt *c, dt_err *err);
/* The write buffer (c->wbuf, dt_ckpt__wbuf_bytes: DT_CKPT_IO_CHUNK, or io_buffer when
 * smaller), allocated on first use on the caller's thread. */
int dt_ckpt__ensure_wbuf(dt_ckpt *c, dt_err *err);
size_t dt_ckpt__wbuf_bytes(const dt_ckpt *c);
/* Charges (add) or gives back bytes of host memory the checkpoint holds to c->be's accounting
 * as "other", where be's memory is the host's (the cpu backend: a copy there takes the same
 * memory as the model); nothing otherwise. Caller's thread only (the accounting is the
 * training thread's). */
void dt_ckpt__charge(dt_ckpt *c, size_t bytes, bool add);

/* Returns once no save is being written (the writer thread is idle). */
void dt_ckpt__wait_idle(dt_ckpt *c);

/* A broadcast from root of count elements of type t at host (recv NULL), or an all-gather of
 * them into recv (count * world elements); through backend memory when c has a backend. */
int dt_ckpt__host_collective(dt_ckpt *c, dt_comm *comm, void *host, size_t count, dt_dtype t,
                             int root, void *recv, dt_err *err);

/* ---- ckpt_shard.c: pieces of tensors ---- */

/* A tensor's local layout for the run arithmetic: the whole shape and, sliced, the slice. */
typedef struct dt_ckpt_slice {
    int ndim;
    const int64_t *whole;  /* (ndim) the whole tensor's shape */
    int tp_dim, tp_parts, tp_rank;
    const int64_t *local;  /* (ndim) the slice's shape (tp_parts > 0) */
} dt_ckpt_slice;

/* Calls fn(ctx, whole_off, rel, len) for each run of elements [start, start + n) of the local
 * tensor that lies in the whole tensor: whole_off elements into the whole tensor, rel elements
 * after start, len long; in increasing order of both, neighbours merged, padding skipped.
 * Returns the elements that lie in the whole tensor. */
typedef void (*dt_ckpt_run_fn)(void *ctx, size_t whole_off, size_t rel, size_t len);
size_t dt_ckpt__runs(const dt_ckpt_slice *s, size_t start, size_t n, dt_ckpt_run_fn fn,
                     void *ctx);

/* Whether the slice is consistent (shape along tp_dim divisible by parts, the rest equal to
 * the whole's, tp_rank in range, start + n within the local tensor). */
bool dt_ckpt__slice_valid(const dt_ckpt_slice *s, size_t start, size_t n);

/* The pieces of a sharded state.json (root), against its table and files: *out (malloc'd) and
 * *n. -EBADMSG naming what is malformed. */
int dt_ckpt__read_pieces(const struct cJSON *root, const dt_ckpt_tensor_desc *t, int nt,
                         const dt_ckpt_file_desc *files, int nf, dt_ckpt_pdesc **out, int *n,
                         dt_err *err);

/* -EBADMSG unless the pieces cover every element of every tensor of the table exactly once
 * (as counted: the elements of each piece that lie in its tensor add up to the tensor's). */
int dt_ckpt__check_cover(const dt_ckpt_tensor_desc *t, int nt, const dt_ckpt_pdesc *p, int np,
                         dt_err *err);

/* Streams every piece of p[0..np) of checkpoint dir through a buffer of io bytes: checks its
 * bytes against its XXH64 (files[p.file]: the header read and checked already) and, when dst is
 * non-NULL, scatters its elements into dst(ctx, tensor) (the whole tensor's first element, be's
 * memory; NULL: that tensor is not wanted). -EBADMSG naming the file and the piece. */
typedef float *(*dt_ckpt_dst_fn)(void *ctx, int tensor);
int dt_ckpt__stream_pieces(const char *dir, const dt_ckpt_tensor_desc *t,
                           const dt_ckpt_file_desc *files, const dt_ckpt_pdesc *p, int np,
                           size_t io, dt_backend *be, dt_ckpt_dst_fn dst, void *ctx, dt_err *err);

/* ---- ckpt_read.c ---- */

/* Whether the checkpoint directory `path` was written for another setup (another model or
 * optimizer: its tensor table differs from what c registered). Unreadable or corrupt ones are
 * not foreign: they are damaged, and may be replaced or removed. why gets the difference. */
bool dt_ckpt__is_foreign(dt_ckpt *c, const char *path, char *why, size_t size);

#endif
