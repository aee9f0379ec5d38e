/* fixtures.c - see fixtures.h. */
#include "tests/fixtures.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/rng.h"
#include "tests/harness.h"

void dt_test_batch_make(dt_test_batch *hb, const dt_model_config *c, int B, uint64_t seed)
{
    memset(hb, 0, sizeof *hb);
    dt_rng r;
    dt_rng_seed(&r, seed);
    hb->b.B = B;
    if (c->shape.kind == DT_SAMPLE_TOKENS) {
        int T = c->shape.seq_len, V = c->shape.vocab_size;
        hb->tokens = malloc(sizeof(int32_t) * (size_t)(B * T));
        hb->targets = malloc(sizeof(int32_t) * (size_t)(B * T));
        for (int i = 0; i < B * T; i++) {
            hb->tokens[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
            hb->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
        }
        hb->targets[1] = -1; /* an ignored position */
        hb->b.T = T;
        if (c->arch == DT_ARCH_BERT) {
            hb->types = malloc(sizeof(int32_t) * (size_t)(B * T));
            hb->mask = malloc(sizeof(int32_t) * (size_t)(B * T));
            hb->labels = malloc(sizeof(int32_t) * (size_t)B);
            const int pad = B > 1 ? T / 4 : 0, k = T / 4 > 1 ? T / 4 : 1;
            for (int b = 0; b < B; b++) {
                const int real = b == B - 1 ? T - pad : T;
                hb->labels[b] = (int32_t)dt_rng_below(&r, 2);
                for (int t = 0; t < T; t++) {
                    hb->types[b * T + t] = t >= T / 2;
                    hb->mask[b * T + t] = t < real;
                    hb->targets[b * T + t] = -1;
                }
                for (int n = 0; n < k;) { /* k distinct real positions */
                    int t = (int)dt_rng_below(&r, (uint64_t)real);
                    if (hb->targets[b * T + t] >= 0)
                        continue;
                    hb->targets[b * T + t] = (int32_t)dt_rng_below(&r, (uint64_t)V);
                    n++;
                }
            }
            hb->b.types = hb->types;
            hb->b.mask = hb->mask;
            hb->b.labels = hb->labels;
        }
    } else {
        int D = c->shape.input_dim;
        hb->x = malloc(sizeof(float) * (size_t)(B * D));
        hb->targets = malloc(sizeof(int32_t) * (size_t)B);
        for (int i = 0; i < B * D; i++)
            hb->x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
        for (int i = 0; i < B; i++)
            hb->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)c->shape.n_classes);
    }
    hb->b.tokens = hb->tokens;
    hb->b.targets = hb->targets;
    hb->b.x = hb->x;
}

void dt_test_batch_free(dt_test_batch *hb)
{
    free(hb->tokens);
    free(hb->targets);
    free(hb->x);
    free(hb->types);
    free(hb->mask);
    free(hb->labels);
}

/* ---- paths and strings ---------------------------------------------------------------------- */

const char *dt_test_fmt(const char *f, ...)
{
    static char *ring[64];
    static int k;
    char *s = NULL;
    va_list ap;
    va_start(ap, f);
    if (vasprintf(&s, f, ap) < 0)
        s = NULL;
    va_end(ap);
    DT_REQUIRE(s);
    free(ring[k]);
    ring[k] = s;
    k = (k + 1) % 64;
    return s;
}

const char *dt_test_repo_dir(const char *probe)
{
    static char dir[PATH_MAX];
    if (!dir[0]) {
        char bin[PATH_MAX];
        if (!realpath(dt_test_dtrain_bin(), bin))
            dt_strlcpy(bin, dt_test_dtrain_bin(), sizeof bin);
        for (int i = 0; i < 2; i++) {
            char *s = strrchr(bin, '/');
            if (s)
                *s = '\0';
        }
        dt_strlcpy(dir, bin, sizeof dir);
        if (access(dt_test_fmt("%s/%s", dir, probe), F_OK) != 0 && !getcwd(dir, sizeof dir))
            dir[0] = '\0';
    }
    return dir;
}

/* ---- forked ranks ----------------------------------------------------------------------------- */

void *dt_test_shared_map(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    DT_REQUIRE(p != MAP_FAILED);
    return p;
}

void dt_test_shared_unmap(void *p, size_t n)
{
    if (p)
        munmap(p, n);
}

int dt_test_rank_failed;

void dt_test_rank_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    char buf[1800];
    int n = snprintf(buf, sizeof buf, "    rank check failed at %s:%d: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof buf)
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    dt_strlcpy(buf + DT_MIN(strlen(buf), sizeof buf - 2), "\n", 2);
    if (write(2, buf, strlen(buf)) < 0)
        dt_test_rank_failed = 1;
    dt_test_rank_failed = 1;
}

void dt_test_run_ranks(const char *what, int n, int *port, dt_test_rank_fn fn, void *arg,
                       double limit_s, int *status)
{
    DT_REQUIRE(n >= 1 && n <= DT_TEST_MAX_RANKS);
    pid_t srv = dt_test_store_start(port);
    pid_t pids[DT_TEST_MAX_RANKS];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        DT_REQUIRE(pids[r] >= 0);
        if (pids[r] == 0) {
            fn(r, n, arg);
            fflush(stderr);
            _exit(dt_test_rank_failed ? 1 : 0);
        }
    }
    uint64_t deadline = dt_now_ns() + (uint64_t)(limit_s * 1e9);
    for (int r = 0; r < n; r++) {
        for (;;) {
            if (waitpid(pids[r], &status[r], WNOHANG) == pids[r])
                break;
            if (dt_now_ns() > deadline) {
                for (int q = 0; q < n; q++)
                    kill(pids[q], SIGKILL);
                waitpid(pids[r], &status[r], 0);
                dt_test_fail_at(__FILE__, __LINE__, "%s: rank %d still running after %g s", what,
                                r, limit_s);
                break;
            }
            dt_sleep_ms(5);
        }
    }
    dt_test_store_stop(srv);
}

bool dt_test_ranks_ok(const char *what, const int *status, int n, const char *msg, size_t stride)
{
    bool ok = true;
    for (int r = 0; r < n; r++)
        if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
            dt_test_fail_at(__FILE__, __LINE__, "%s: rank %d: status %d: %s", what, r, status[r],
                            msg + (size_t)r * stride);
            ok = false;
        }
    return ok;
}

void dt_test_rank_env(const char *transport, const char *hosts, int rank)
{
    setenv("DTRAIN_COMM_TRANSPORT", transport ? transport : "auto", 1);
    const char *p = hosts && *hosts ? hosts : NULL;
    for (int i = 0; i < rank && p; i++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    size_t len = p ? strcspn(p, ",") : 0;
    if (len) {
        char host[64];
        snprintf(host, sizeof host, "%.*s", (int)len, p);
        setenv("DTRAIN_COMM_HOST_ID", host, 1);
    } else {
        unsetenv("DTRAIN_COMM_HOST_ID");
    }
}

int dt_test_world_open(int port, const char *run_id, int attempt, int rank, int n,
                       int timeout_ms, dt_store **store, dt_comm **comm, dt_err *err)
{
    *comm = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    so.connect_timeout_ms = 10000;
    so.timeout_ms = timeout_ms > 20000 ? timeout_ms : 20000;
    int rc = dt_store_connect(store, "127.0.0.1", port, &so, err);
    if (rc != 0)
        return rc;
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.rank = rank;
    o.world_size = n;
    o.local_rank = rank;
    o.local_world_size = n;
    o.run_id = run_id;
    o.attempt = attempt;
    o.timeout_ms = timeout_ms ? timeout_ms : 20000;
    o.local_addr = "127.0.0.1";
    return dt_comm_init(comm, *store, &o, err);
}

typedef struct world_run {
    const dt_test_world *w;
    dt_test_world_fn fn;
    void *arg;
} world_run;

static void world_rank(int rank, int n, void *arg)
{
    const world_run *wr = arg;
    const dt_test_world *w = wr->w;
    dt_err err = {0};
    dt_test_rank_env(w->transport, w->hosts, rank);
    if (w->rank_env)
        w->rank_env(w, rank, w->env_arg);
    dt_test_rank x = {.rank = rank, .n = n, .w = w};
    if (dt_test_world_open(w->port, w->run_id, w->attempt, rank, n, w->timeout_ms, &x.store,
                           &x.c, &err) != 0) {
        fprintf(stderr, "    rank %d: %s: %s\n", rank, x.store ? "comm init" : "store", err.msg);
        _exit(x.store ? 3 : 2);
    }
    wr->fn(&x, wr->arg);
    dt_comm_free(x.c);
    dt_store_free(x.store);
}

void dt_test_world_run(dt_test_world *w, dt_test_world_fn fn, void *arg, double limit_s,
                       int *status)
{
    static int counter;
    if (!w->run_id[0])
        snprintf(w->run_id, sizeof w->run_id, "test-%d-%d", (int)getpid(), ++counter);
    world_run wr = {.w = w, .fn = fn, .arg = arg};
    dt_test_run_ranks(w->run_id, w->n, &w->port, world_rank, &wr, limit_s, status);
}

/* ---- the trainer on forked ranks -------------------------------------------------------------- */

int dt_test_trainer_start(dt_trainer *t, dt_job *job, const char *config, const char *const *ov,
                          int nov, const char *dir, const char *name, int rank, int n, int port,
                          char *msg, size_t cap)
{
    static dt_config_errors errs;
    dt_err err = {0};
    const char *all[64];
    if (nov < 0 || nov >= (int)DT_ARRAY_LEN(all)) {
        snprintf(msg, cap, "%d overrides: at most %d", nov, (int)DT_ARRAY_LEN(all) - 1);
        return -E2BIG;
    }
    for (int i = 0; i < nov; i++)
        all[i] = ov[i];
    all[nov] = dt_test_fmt("job.output_dir=%s/%s", dir, name);
    memset(&errs, 0, sizeof errs);
    int rc = dt_job_load(job, dt_test_fmt("%s/configs/%s", dt_test_repo_dir("configs"), config),
                         (char **)all, nov + 1, &errs, &err);
    if (rc != 0) {
        snprintf(msg, cap, "job: %.500s %.500s", err.msg, errs.count ? errs.lines[0] : "");
        return rc;
    }
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = n;
    dt_strlcpy(env.store_addr, "127.0.0.1", sizeof env.store_addr);
    env.store_port = port;
    snprintf(env.run_id, sizeof env.run_id, "%s-%d", name, (int)getppid());
    rc = dt_trainer_init(t, job, &env, &err);
    if (rc != 0)
        dt_strlcpy(msg, err.msg, cap);
    return rc;
}

/* The value of the last override "key=N" in ov, or def. */
static int ov_int(const char *const *ov, int nov, const char *key, int def)
{
    size_t n = strlen(key);
    for (int i = 0; i < nov; i++)
        if (!strncmp(ov[i], key, n) && ov[i][n] == '=')
            def = atoi(ov[i] + n + 1);
    return def;
}

bool dt_test_gathers_whole(const char *const *ov, int nov, int N, int q)
{
    int T = ov_int(ov, nov, "parallel.tensor", 1), P = ov_int(ov, nov, "parallel.pipeline", 1);
    int D = N / (T * P);
    return ov_int(ov, nov, "parallel.zero", 0) < 3 || D <= 1 || (q / T) % D == 0;
}
