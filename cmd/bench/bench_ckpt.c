/* bench_ckpt.c - `dtrain bench ckpt`: checkpoint size, write throughput against this disk's
 * sequential write speed, and how long the training loop is held per save.
 *
 * Three measurements in the same run, in the same directory (so on the same disk):
 *   disk        a plain file of the checkpoint's size written in 4 MiB blocks, then fsync: the
 *               sequential write speed a checkpoint can hope for
 *   sync        dt_ckpt_save with checkpoint.async = false: the loop waits for the whole write
 *   background  dt_ckpt_save with checkpoint.async = true: the loop waits only for the copy of
 *               the buffers to host memory; the writer thread does the rest while "training"
 *               goes on (here: the benchmark waits for the write before the next save, as a job
 *               whose checkpoint interval is longer than one write would)
 *   concurrent  background, and the copy itself done by the writer thread while the next
 *               forward and backward run (host-memory buffers only: the CPU backend); the loop
 *               waits in dt_ckpt_fence before the optimiser update only if the copy is not done.
 *               Between the save and the fence the benchmark runs --step-ms of busy computation
 *               on the training thread, standing in for a forward and backward
 *               (checkpoint.host_copy = true in a job).
 *   in place    background, and no copy at all: the writer thread writes the buffers from where
 *               they are while the next forward and backward run, and dt_ckpt_fence waits until
 *               the write is done (host-memory buffers only; the CPU backend's default).
 * Each mode does one warm-up save first (the first save allocates and touches the staging
 * memory; its hold is reported apart) and then --saves measured ones.
 *
 * The tensors are the job's (its model's parameters and buffers, its optimiser's state) when a
 * job file is given, else a synthetic model of --params parameters with AdamW state.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "runtime/train/ckpt/ckpt.h"
#include "runtime/job/config.h"
#include "runtime/train/worker.h"

typedef struct bench_ctx {
    dt_ckpt_buf bufs[8];
    int nbufs;
    dt_backend *be;      /* NULL: host memory */
    char what[256];      /* description for the report */
    /* synthetic model, owned */
    dt_tensor_info *tensors;
    float *mem[3];
} bench_ctx;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench ckpt [JOB.ini [section.key=value ...]] [options]\n\n"
            "Measures a checkpoint of the job's model and optimiser (or, without a job, of a\n"
            "synthetic model with AdamW state): its size, the write throughput against this\n"
            "disk's sequential write speed measured in the same run, and how long the training\n"
            "loop is held per save with background writing against a synchronous save.\n"
            "Target: held < 10%% of a synchronous save.\n\n"
            "  --params N     synthetic model size in parameters (default 124000000, GPT-2 124M)\n"
            "  --saves K      saves per mode (default 2)\n"
            "  --step-ms MS   simulated forward+backward between a save and the next optimiser\n"
            "                 update, for the concurrent-copy mode (default 500)\n"
            "  --dir DIR      where to write (default: a new directory under $TMPDIR or /tmp,\n"
            "                 removed at the end); put it on the disk your checkpoints go to\n"
            "  --ranks 1,2,4  instead: train the job (its layout, its overrides) on each number\n"
            "                 of ranks with the launcher and save its step 3 sharded (every rank\n"
            "                 its own shard) and whole (rank 0 alone): time held, write time,\n"
            "                 bytes each rank wrote against 1/N + one tensor, and rank 0's\n"
            "                 peak_mem_bytes and max RSS at the steady state and the save step\n");
}

static int synthetic(bench_ctx *b, int64_t params, dt_err *err)
{
    const int nt = 12;
    b->tensors = calloc(nt, sizeof *b->tensors);
    if (!b->tensors)
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t off = 0, per = (size_t)params / nt;
    for (int i = 0; i < nt; i++) {
        dt_tensor_info *t = &b->tensors[i];
        snprintf(t->name, sizeof t->name, "layer.%d.weight", i);
        t->numel = i == nt - 1 ? (size_t)params - off : per;
        t->ndim = 1;
        t->shape[0] = (int64_t)t->numel;
        t->offset = off;
        off += t->numel;
    }
    for (int k = 0; k < 3; k++) {
        b->mem[k] = malloc((size_t)params * sizeof(float));
        if (!b->mem[k])
            return dt_err_set(err, -ENOMEM, "cannot allocate %.1f GB for the synthetic model",
                              params * 12.0 / 1e9);
        dt_rng r;
        dt_rng_seed(&r, (uint64_t)k + 1);
        for (int64_t i = 0; i < params; i++)
            b->mem[k][i] = dt_rng_uniform(&r);
    }
    const char *files[3] = {"model", "optim", "optim"};
    const char *prefix[3] = {"", "exp_avg.", "exp_avg_sq."};
    for (int k = 0; k < 3; k++)
        b->bufs[k] = (dt_ckpt_buf){.file = files[k], .prefix = prefix[k], .tensors = b->tensors,
                                   .num_tensors = nt, .data = b->mem[k],
                                   .numel = (size_t)params};
    b->nbufs = 3;
    snprintf(b->what, sizeof b->what, "synthetic model, %.1fM parameters, AdamW state",
             params / 1e6);
    return 0;
}

/* Sequential write of `bytes` in 4 MiB blocks plus fsync; MB/s. */
static double disk_speed(const char *dir, uint64_t bytes, dt_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/disk-speed.bin", dir);
    size_t blk = 4u << 20;
    char *buf = malloc(blk);
    if (!buf)
        return dt_err_set(err, -ENOMEM, "out of memory"), -1;
    dt_rng r;
    dt_rng_seed(&r, 7);
    for (size_t i = 0; i < blk / 8; i++)
        ((uint64_t *)buf)[i] = dt_rng_u64(&r);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(buf);
        return dt_err_errno(err, errno, "cannot create %s", path), -1;
    }
    double t0 = dt_now_s();
    int rc = 0;
    for (uint64_t done = 0; done < bytes && !rc; done += blk)
        rc = dt_write_all(fd, buf, (size_t)DT_MIN((uint64_t)blk, bytes - done));
    if (!rc && fsync(fd) != 0)
        rc = -errno;
    double t = dt_now_s() - t0;
    close(fd);
    unlink(path);
    free(buf);
    if (rc)
        return dt_err_errno(err, -rc, "writing %s", path), -1;
    return bytes / 1e6 / t;
}

enum { MODE_SYNC, MODE_BG, MODE_CONC, MODE_DIRECT };

typedef struct result {
    double first_hold, hold, copy, fence, write, fsync;
    uint64_t bytes;
} result;

/* ---- a job: its model and optimiser, real training steps between a save and the update ---- */

/* Replaces the trainer's checkpoint writer by one for this mode, with the buffers the worker
 * registers (model parameters and buffers, optimiser state under PyTorch's names). */
static int job_writer(dt_trainer *t, const char *dir, int mode, dt_err *err)
{
    dt_model *m = t->model;
    dt_optim *o = t->optim;
    dt_ckpt_buf bufs[4];
    int n = 0;
    bufs[n++] = (dt_ckpt_buf){.file = "model", .prefix = "", .tensors = m->tensors,
                              .num_tensors = m->num_tensors, .data = m->params,
                              .numel = m->num_params};
    if (m->num_buffers)
        bufs[n++] = (dt_ckpt_buf){.file = "model", .prefix = "", .tensors = m->buffer_tensors,
                                  .num_tensors = m->num_buffer_tensors, .data = m->buffers,
                                  .numel = m->num_buffers, .copy_at_save = true};
    for (int i = 0; i < o->num_states && i < 2; i++)
        bufs[n++] = (dt_ckpt_buf){.file = "optim", .prefix = o->states[i].prefix,
                                  .tensors = m->tensors, .num_tensors = m->num_tensors,
                                  .data = o->states[i].buf, .numel = m->num_params};
    dt_ckpt_opts co = {.dir = dir, .keep = 1, .async = mode != MODE_SYNC,
                       .concurrent_copy = mode == MODE_CONC || mode == MODE_DIRECT,
                       .host_copy = mode != MODE_DIRECT};
    dt_ckpt_close(t->ckpt);
    t->ckpt = NULL;
    return dt_ckpt_open(&t->ckpt, &co, t->be, bufs, n, err);
}

static int job_mode(dt_trainer *t, const char *dir, int mode, int saves, double base_step,
                    result *r, double *step_with_save, dt_err *err)
{
    dt_ckpt_stats s;
    dt_ckpt_state st;
    int rc = job_writer(t, dir, mode, err);
    memset(r, 0, sizeof *r);
    *step_with_save = 0;
    for (int k = 0; k < saves + 1 && !rc; k++) {
        dt_ckpt_state_init(&st);
        st.step = t->step;
        st.epoch = t->sampler.epoch;
        st.sample_pos = t->sampler.pos;
        st.loss = t->loss;
        dt_ckpt_state_set_scalar(&st, "optim_t", (double)t->optim->t);
        double t0 = dt_now_s();
        /* as the loop does: a save after step N, then step N+1 (whose update waits in the
         * fence for a concurrent copy) */
        if ((rc = dt_ckpt_save(t->ckpt, &st, err)) || (rc = dt_trainer_step(t, err)))
            break;
        double dt = dt_now_s() - t0;
        if ((rc = dt_ckpt_wait(t->ckpt, err)))
            break;
        dt_ckpt_get_stats(t->ckpt, &s);
        r->bytes = s.bytes;
        if (k == 0) {
            r->first_hold = s.hold_s;
            continue;
        }
        *step_with_save += (dt - base_step) / saves;
        r->hold += s.hold_s / saves;
        r->copy += s.copy_s / saves;
        r->fence += s.fence_s / saves;
        r->write += s.write_s / saves;
        r->fsync += s.fsync_s / saves;
    }
    return rc;
}

/* A fresh directory bench-ckpt-XXXXXX into dir[0..cap): under dir_opt (made when missing), else
 * under $TMPDIR or /tmp. Returns 0, or an error with err set. */
static int make_dir(const char *dir_opt, char *dir, size_t cap, dt_err *err)
{
    if (dir_opt) {
        int rc = dt_mkdir_p(dir_opt, err);
        if (rc)
            return rc;
        snprintf(dir, cap, "%s/bench-ckpt-XXXXXX", dir_opt);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, cap, "%s/bench-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    }
    if (!mkdtemp(dir))
        return dt_err_errno(err, errno, "cannot create a directory like %s", dir);
    return 0;
}

static int bench_job(const char *path, char **overrides, int n_over, int saves,
                     const char *dir_opt)
{
    static dt_job job;
    static dt_config_errors errs;
    static dt_trainer t;
    dt_err err = {0};
    char dir[4096];
    int code = 1;
    bool made_dir = false, inited = false;
    if (dt_job_load(&job, path, overrides, n_over, &errs, &err) != 0) {
        for (int i = 0; i < errs.count && i < 64; i++)
            fprintf(stderr, "dtrain bench ckpt: %s\n", errs.lines[i]);
        goto out;
    }
    if (make_dir(dir_opt, dir, sizeof dir, &err))
        goto out;
    made_dir = true;
    dt_strlcpy(job.output_dir, dir, sizeof job.output_dir);
    job.ckpt_dir[0] = '\0';
    job.resume = DT_RESUME_NEVER;
    job.resume_path[0] = '\0';
    job.ckpt_keep = 1;
    if (job.steps < 1000000)
        job.steps = 1000000; /* the schedule must not end while we measure */
    dt_worker_env env = {.world_size = 1, .local_world_size = 1};
    dt_strlcpy(env.run_id, "bench-ckpt", sizeof env.run_id);
    if (dt_trainer_init(&t, &job, &env, &err))
        goto out;
    inited = true;
    /* The step time without saves. */
    double base = 0;
    int nbase = saves + 1;
    for (int k = 0; k < 2 + nbase; k++) {
        double t0 = dt_now_s();
        if (dt_trainer_step(&t, &err))
            goto out;
        if (k >= 2)
            base += (dt_now_s() - t0) / nbase;
    }
    result sync, bg, conc, dir_;
    double sw_sync, sw_bg, sw_conc, sw_dir;
    uint64_t size = (uint64_t)t.model->num_params * 4 * (1 + (uint64_t)t.optim->num_states) +
                    (uint64_t)t.model->num_buffers * 4;
    double disk0 = disk_speed(dir, size, &err);
    char ckdir[4200];
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", dir);
    if (disk0 < 0 || job_mode(&t, ckdir, MODE_SYNC, saves, base, &sync, &sw_sync, &err) ||
        job_mode(&t, ckdir, MODE_BG, saves, base, &bg, &sw_bg, &err) ||
        job_mode(&t, ckdir, MODE_CONC, saves, base, &conc, &sw_conc, &err) ||
        job_mode(&t, ckdir, MODE_DIRECT, saves, base, &dir_, &sw_dir, &err))
        goto out;
    double disk1 = disk_speed(dir, size, &err);
    if (disk1 < 0)
        goto out;
    double disk = (disk0 + disk1) / 2, mb = sync.bytes / 1e6;
    bool conc_real = t.be->host_memory;
    printf("dtrain bench ckpt: %s (%s, %zu parameters, %s) on %s\n", path,
           dt_model_arch_name(t.model->cfg.arch), t.model->num_params, dt_optim_name(job.optimizer),
           t.be->name);
    printf("  directory                  %s\n", dir);
    printf("  checkpoint size            %.1f MB (model + optimiser + state.json)\n", mb);
    printf("  disk sequential write      %.0f MB/s (%.1f MB in 4 MiB blocks + fsync; %.0f before, "
           "%.0f after the saves)\n", disk, mb, disk0, disk1);
    printf("  checkpoint write (sync)    %.0f MB/s = %.0f%% of the disk (%.2f s, of which fsync "
           "%.2f s)\n", mb / sync.write, 100.0 * mb / sync.write / disk, sync.write, sync.fsync);
    printf("  checkpoint write (thread)  %.0f MB/s = %.0f%% of the disk (%.2f s)\n",
           mb / bg.write, 100.0 * mb / bg.write / disk, bg.write);
    printf("  training step              %.3f s without a save\n", base);
    printf("  training held per save (and the extra time of the step after it):\n");
    printf("    synchronous              %.3f s  (%+.3f s)\n", sync.hold, sw_sync);
    printf("    background               %.3f s = %.1f%% of synchronous  (%+.3f s; first save "
           "%.3f s)\n", bg.hold, 100 * bg.hold / sync.hold, sw_bg, bg.first_hold);
    printf("    background, concurrent   %.3f s = %.1f%% of synchronous  (%+.3f s; fence wait "
           "%.3f s, copy %.3f s%s)\n", conc.hold, 100 * conc.hold / sync.hold, sw_conc,
           conc.fence, conc.copy, conc_real ? " during forward/backward" : ": not on this "
           "backend, copied in the save");
    printf("    background, in place     %.3f s = %.1f%% of synchronous  (%+.3f s; fence wait "
           "%.3f s%s)\n", dir_.hold, 100 * dir_.hold / sync.hold, sw_dir, dir_.fence,
           conc_real ? ": the write itself, from where the buffers are, no copy"
                     : ": not on this backend, copied in the save");
    printf("  target: held < 10%% of a synchronous save: background %s, concurrent %s, in place "
           "%s\n", bg.hold < 0.1 * sync.hold ? "met" : "NOT met",
           conc.hold < 0.1 * sync.hold ? "met" : "NOT met",
           dir_.hold < 0.1 * sync.hold ? "met" : "NOT met");
    printf("  averages of %d saves per mode after one warm-up save; the checkpoint.async "
           "default on the CPU backend is in place (concurrent: checkpoint.host_copy = "
           "true)\n", saves);
    code = 0;
out:
    if (code)
        fprintf(stderr, "dtrain bench ckpt: %s\n", err.msg);
    if (inited)
        dt_trainer_close(&t);
    if (made_dir)
        dt_rm_rf(dir, NULL);
    return code;
}

/* Busy computation on this thread for ms milliseconds (a stand-in for forward + backward). */
static double busy(double ms)
{
    double t0 = dt_now_s(), x = 1.0;
    while ((dt_now_s() - t0) * 1e3 < ms)
        for (int i = 0; i < 10000; i++)
            x = x * 1.0000001 + 1e-9;
    return x;
}


static int measure(bench_ctx *b, const char *dir, int mode, int saves, double step_ms, result *r,
                   dt_err *err)
{
    dt_ckpt *c = NULL;
    dt_ckpt_opts o = {.dir = dir, .keep = 1, .async = mode != MODE_SYNC,
                      .concurrent_copy = mode == MODE_CONC || mode == MODE_DIRECT,
                      .host_copy = mode != MODE_DIRECT};
    dt_ckpt_state st;
    dt_ckpt_stats s;
    volatile double sink = 0;
    memset(r, 0, sizeof *r);
    dt_ckpt_state_init(&st);
    int rc = dt_ckpt_open(&c, &o, b->be, b->bufs, b->nbufs, err);
    if (rc)
        return rc;
    for (int k = 0; k < saves + 1 && !rc; k++) {
        st.step = 1000 * (mode + 1) + k;
        if ((rc = dt_ckpt_save(c, &st, err)))
            break;
        if (mode == MODE_CONC || mode == MODE_DIRECT) {
            sink += busy(step_ms);
            dt_ckpt_fence(c);
        }
        if ((rc = dt_ckpt_wait(c, err)))
            break;
        dt_ckpt_get_stats(c, &s);
        r->bytes = s.bytes;
        if (k == 0) {
            r->first_hold = s.hold_s;
            continue;
        }
        r->hold += s.hold_s / saves;
        r->copy += s.copy_s / saves;
        r->fence += s.fence_s / saves;
        r->write += s.write_s / saves;
        r->fsync += s.fsync_s / saves;
    }
    (void)sink;
    dt_ckpt_close(c);
    return rc;
}

int dt_bench_ckpt(int argc, char **argv)
{
    int64_t params = 124000000;
    int saves = 2;
    double step_ms = 500;
    const char *dir_opt = NULL, *job_path = NULL, *ranks = NULL;
    char *overrides[64];
    int n_over = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--params") && i + 1 < argc) {
            if (dt_parse_i64(argv[++i], &params) || params < 16) {
                fprintf(stderr, "dtrain bench ckpt: --params wants a count >= 16\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--saves") && i + 1 < argc) {
            if (dt_parse_int(argv[++i], &saves) || saves < 1 || saves > 100) {
                fprintf(stderr, "dtrain bench ckpt: --saves wants 1..100\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--step-ms") && i + 1 < argc) {
            if (dt_parse_double(argv[++i], &step_ms) || step_ms < 0) {
                fprintf(stderr, "dtrain bench ckpt: --step-ms wants milliseconds >= 0\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            dir_opt = argv[++i];
        } else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            ranks = argv[++i];
        } else if (argv[i][0] != '-' && !job_path && !strchr(argv[i], '=')) {
            job_path = argv[i];
        } else if (job_path && strchr(argv[i], '=') && n_over < 64) {
            overrides[n_over++] = argv[i];
        } else {
            fprintf(stderr, "dtrain bench ckpt: unexpected argument \"%s\"\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (ranks)
        return dt_bench_ckpt_ranks(ranks, job_path, overrides, n_over, dir_opt);
    dt_log_init();
    if (job_path)
        return bench_job(job_path, overrides, n_over, saves, dir_opt);

    bench_ctx b = {0};
    dt_err err = {0};
    char dir[4096];
    int code = 1;
    bool made_dir = false;
    result sync, bg, conc, dir_;
    if (synthetic(&b, params, &err))
        goto out;
    if (make_dir(dir_opt, dir, sizeof dir, &err))
        goto out;
    made_dir = true;
    /* The disk before and after the checkpoints (this machine's disk speed varies with what
     * else runs; the spread says how much to trust the percentages). */
    uint64_t size = 0;
    for (int k = 0; k < b.nbufs; k++)
        size += b.bufs[k].numel * sizeof(float);
    double disk0 = disk_speed(dir, size, &err);
    if (disk0 < 0 || measure(&b, dir, MODE_SYNC, saves, step_ms, &sync, &err) ||
        measure(&b, dir, MODE_BG, saves, step_ms, &bg, &err) ||
        measure(&b, dir, MODE_CONC, saves, step_ms, &conc, &err) ||
        measure(&b, dir, MODE_DIRECT, saves, step_ms, &dir_, &err))
        goto out;
    double disk1 = disk_speed(dir, size, &err);
    if (disk1 < 0)
        goto out;
    double disk = (disk0 + disk1) / 2;

    double mb = sync.bytes / 1e6;
    printf("dtrain bench ckpt: %s\n", b.what);
    printf("  directory                  %s\n", dir);
    printf("  checkpoint size            %.1f MB (model + optimiser + state.json)\n", mb);
    printf("  disk sequential write      %.0f MB/s (%.1f MB in 4 MiB blocks + fsync; %.0f before, "
           "%.0f after the saves)\n", disk, mb, disk0, disk1);
    printf("  checkpoint write (sync)    %.0f MB/s = %.0f%% of the disk (%.2f s, of which fsync "
           "%.2f s)\n", mb / sync.write, 100.0 * mb / sync.write / disk, sync.write, sync.fsync);
    printf("  checkpoint write (thread)  %.0f MB/s = %.0f%% of the disk (%.2f s)\n",
           mb / bg.write, 100.0 * mb / bg.write / disk, bg.write);
    printf("  training held per save:\n");
    printf("    synchronous              %.3f s\n", sync.hold);
    printf("    background               %.3f s = %.1f%% of synchronous (the copy to host memory; "
           "first save %.3f s)\n", bg.hold, 100 * bg.hold / sync.hold, bg.first_hold);
    printf("    background, concurrent   %.3f s = %.1f%% of synchronous (fence wait %.3f s; the "
           "copy, %.3f s, overlapped %.0f ms of simulated compute)\n", conc.hold,
           100 * conc.hold / sync.hold, conc.fence, conc.copy, step_ms);
    printf("    background, in place     %.3f s = %.1f%% of synchronous (fence wait %.3f s: the "
           "write itself, from where the buffers are, after %.0f ms of simulated compute; no "
           "copy: the default on the CPU backend)\n", dir_.hold, 100 * dir_.hold / sync.hold,
           dir_.fence, step_ms);
    printf("  target: held < 10%% of a synchronous save: background %s, concurrent %s, in place "
           "%s (the price of holding no copy)\n", bg.hold < 0.1 * sync.hold ? "met" : "NOT met",
           conc.hold < 0.1 * sync.hold ? "met" : "NOT met",
           dir_.hold < 0.1 * sync.hold ? "met" : "NOT met");
    printf("  averages of %d saves per mode after one warm-up save\n", saves);
    code = 0;
out:
    if (code)
        fprintf(stderr, "dtrain bench ckpt: %s\n", err.msg);
    if (made_dir)
        dt_rm_rf(dir, NULL);
    free(b.tensors);
    for (int k = 0; k < 3; k++)
        free(b.mem[k]);
    return code;
}
