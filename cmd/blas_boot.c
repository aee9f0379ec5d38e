/* blas_boot.c - see blas_boot.h. */
#include "cmd/blas_boot.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cpuid.h"
#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/cpu/cpu_blas.h"

extern char **environ;

#define PROBE_TIMEOUT_S 30.0
#define PROBE_MIN_TIME 0.03 /* seconds of sgemm timing per kernel */
#define FASTER 1.1          /* a candidate must beat OpenBLAS's own choice by this factor */
#define CACHE_MAGIC "dtrain-blas-cache 1"

/* ---- the probe helper --------------------------------------------------------------------- */

static int probe_main(void)
{
    dt_blas_check c;
    dt_blas_check_run(&c, PROBE_MIN_TIME);
    printf("dtrain-blas-probe core=%s gflops=%.3f err=%.3g ok=%d\n", c.corename, c.gflops,
           c.max_err, c.ok ? 1 : 0);
    fflush(stdout);
    return 0;
}

/* The child's environment: ours without OPENBLAS_CORETYPE and DTRAIN_BLAS_PROBE, plus the
 * probe's. Returns a malloc'd NULL-terminated array whose strings are ours or static. */
static char **probe_env(const char *coretype, char *core_kv, size_t cap)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18) &&
            strncmp(environ[i], "DTRAIN_BLAS_PROBE=", 18))
            env[k++] = environ[i];
    env[k++] = "DTRAIN_BLAS_PROBE=off";
    if (coretype) {
        snprintf(core_kv, cap, "OPENBLAS_CORETYPE=%s", coretype);
        env[k++] = core_kv;
    }
    env[k] = NULL;
    return env;
}

void dt_blas_probe(const char *exe, const char *coretype, double timeout_s,
                   dt_blas_probe_out *out)
{
    memset(out, 0, sizeof *out);
    char self[1024], core_kv[64], text[2048];
    size_t len = 0;
    if (!exe) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            snprintf(out->why, sizeof out->why, "cannot find this program (/proc/self/exe: %s)",
                     strerror(errno));
            return;
        }
        self[n] = '\0';
        exe = self;
    }
    char **env = probe_env(coretype, core_kv, sizeof core_kv);
    int fd[2] = {-1, -1};
    if (!env || pipe2(fd, O_CLOEXEC) != 0) {
        snprintf(out->why, sizeof out->why, "cannot start the probe: %s", strerror(errno));
        free(env);
        return;
    }
    double t0 = dt_now_s();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        dup2(fd[1], STDERR_FILENO);
        signal(SIGPIPE, SIG_DFL);
        char *argv[] = {(char *)exe, DT_BLAS_PROBE_ARG, NULL};
        execve(exe, argv, env);
        static const char msg[] = "exec failed\n";
        ssize_t w = write(STDOUT_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(fd[1]);
    free(env);
    if (pid < 0) {
        snprintf(out->why, sizeof out->why, "fork: %s", strerror(errno));
        close(fd[0]);
        return;
    }
    bool timed_out = false;
    for (;;) { /* the helper's output until EOF, or the deadline */
        int left_ms = (int)((t0 + timeout_s - dt_now_s()) * 1000);
        if (left_ms <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, left_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        ssize_t got = read(fd[0], text + len, sizeof text - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len == sizeof text - 1) { /* keep reading to EOF; the start is what matters */
            char sink[512];
            while (read(fd[0], sink, sizeof sink) > 0)
                ;
            break;
        }
    }
    close(fd[0]);
    text[len] = '\0';
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    out->seconds = dt_now_s() - t0;
    const char *line = strstr(text, "dtrain-blas-probe core=");
    char rest[160] = "";
    dt_strlcpy(rest, dt_trim(text), sizeof rest);
    for (char *c = rest; *c; c++)
        if (*c == '\n')
            *c = ' ';
    if (timed_out) {
        snprintf(out->why, sizeof out->why, "hung (killed after %.0f s)", timeout_s);
    } else if (WIFSIGNALED(st)) {
        snprintf(out->why, sizeof out->why, "crashed (%s)%s%s", strsignal(WTERMSIG(st)),
                 rest[0] ? ": " : "", rest);
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !line) {
        snprintf(out->why, sizeof out->why, "exited with status %d without a result%s%s",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, rest[0] ? ": " : "", rest);
    } else {
        int ok = 0;
        if (sscanf(line, "dtrain-blas-probe core=%31s gflops=%lf err=%lf ok=%d", out->core,
                   &out->gflops, &out->max_err, &ok) == 4) {
            out->ran = true;
            out->ok = ok != 0;
        } else {
            snprintf(out->why, sizeof out->why, "printed no result it could read: %.120s", line);
        }
    }
}

/* ---- the cache ---------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* What the verdict depends on, one line. */
static void cache_key(const dt_cpuid *id, char *key, size_t cap)
{
    const char *lib = dt_blas_library_path();
    struct stat st;
    memset(&st, 0, sizeof st);
    if (lib[0])
        stat(lib, &st);
    snprintf(key, cap, "cpu=%s|%s|%d/%d/%d|%08x lib=%s|%s|%lld|%lld|%llu", id->vendor, id->brand,
             id->family, id->model, id->stepping, (unsigned)id->features, dt_blas_config(), lib,
             (long long)st.st_size, (long long)st.st_mtime, (unsigned long long)st.st_ino);
}

/* The cache directory: DTRAIN_BLAS_CACHE, $XDG_CACHE_HOME/dtrain, ~/.cache/dtrain or
 * /tmp/dtrain-<uid>, the first that exists or can be made; false when off or none works. */
static bool cache_dir(char *dir, size_t cap)
{
    const char *set = dt_env("DTRAIN_BLAS_CACHE");
    if (set && !strcmp(set, "off"))
        return false;
    char cands[4][1024];
    int n = 0;
    if (set && *set)
        snprintf(cands[n++], sizeof cands[0], "%s", set);
    else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            snprintf(cands[n++], sizeof cands[0], "%s/dtrain", xdg);
        if (home && *home)
            snprintf(cands[n++], sizeof cands[0], "%s/.cache/dtrain", home);
        snprintf(cands[n++], sizeof cands[0], "/tmp/dtrain-%u", (unsigned)getuid());
    }
    for (int i = 0; i < n; i++) {
        dt_err e = {0};
        if (dt_mkdir_p(cands[i], &e) == 0 && access(cands[i], W_OK) == 0) {
            dt_strlcpy(dir, cands[i], cap);
            return true;
        }
    }
    return false;
}

typedef struct cache_entry {
    char use[32]; /* the kernel chosen, "" for none */
    double gflops, gflops_default;
    char note[512];
} cache_entry;

static void cache_path(const char *dir, const char *key, char *path, size_t cap)
{
    snprintf(path, cap, "%s/blas-%016llx.txt", dir, (unsigned long long)fnv1a(key));
}

static bool cache_read(const char *key, cache_entry *e)
{
    char dir[1024], path[1100], line[1024], keyline[2048];
    if (!cache_dir(dir, sizeof dir))
        return false;
    cache_path(dir, key, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = false;
    memset(e, 0, sizeof *e);
    if (fgets(line, sizeof line, f) && !strncmp(line, CACHE_MAGIC " ", strlen(CACHE_MAGIC) + 1) &&
        fgets(keyline, sizeof keyline, f) && !strncmp(keyline, "key: ", 5) &&
        !strcmp(dt_trim(keyline + 5), key)) {
        char use[32];
        char *note = strstr(line, " note=");
        if (note && sscanf(line + strlen(CACHE_MAGIC), " use=%31s gflops=%lf default=%lf", use,
                           &e->gflops, &e->gflops_default) == 3) {
            dt_strlcpy(e->use, strcmp(use, "-") ? use : "", sizeof e->use);
            dt_strlcpy(e->note, dt_trim(note + 6), sizeof e->note);
            ok = !e->use[0] || dt_blas_kernel_find(e->use) != NULL;
        }
    }
    fclose(f);
    return ok;
}

static void cache_write(const char *key, const cache_entry *e)
{
    char dir[1024], path[1100], tmp[1200];
    if (!cache_dir(dir, sizeof dir))
        return;
    cache_path(dir, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "%s use=%s gflops=%.3f default=%.3f note=%s\nkey: %s\n", CACHE_MAGIC,
            e->use[0] ? e->use : "-", e->gflops, e->gflops_default, e->note, key);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0)
        unlink(tmp);
    else
        DT_DEBUG("blas: verdict cached in %s", path);
}

/* ---- the decision ------------------------------------------------------------------------- */

/* OpenBLAS's own choice, timed in a helper like the candidates (with DTRAIN_BLAS_AS_IF, that
 * kernel forced). 0 when the helper fails. */
static double time_default(dt_blas_choice *c, const char *as_if)
{
    dt_blas_probe_out r;
    dt_blas_probe(NULL, as_if, PROBE_TIMEOUT_S, &r);
    c->probes++;
    if (!r.ran)
        DT_WARN("blas: timing OpenBLAS's own kernel in a helper failed: %s", r.why);
    return r.ran ? r.gflops : 0;
}

/* Every candidate is probed (they are at most three, once per machine); of those that pass and
 * beat OpenBLAS's own choice by FASTER, the fastest is used, a better-ranked one within
 * NEAR of it preferred (so that timing noise between equal kernels does not decide). */
#define NEAR 0.97
static void probe_candidates(dt_blas_choice *c, const dt_blas_plan *plan, const char *as_if,
                             cache_entry *e)
{
    double t0 = dt_now_s();
    const char *mine = plan->chosen->name;
    double base = time_default(c, as_if);
    const dt_blas_kernel *use = NULL;
    dt_blas_probe_out r[DT_ARRAY_LEN(plan->cand)];
    bool pass[DT_ARRAY_LEN(plan->cand)] = {false};
    for (int i = 0; i < plan->n && base > 0; i++) {
        const char *name = plan->cand[i]->name;
        dt_blas_probe(NULL, name, PROBE_TIMEOUT_S, &r[i]);
        c->probes++;
        if (!r[i].ran)
            DT_WARN("blas: the %s kernel is not used: its probe %s", name, r[i].why);
        else if (strcasecmp(r[i].core, name))
            DT_WARN("blas: the %s kernel is not used: OpenBLAS did not take OPENBLAS_CORETYPE=%s "
                    "(it ran %s)",
                    name, name, r[i].core);
        else if (!r[i].ok)
            DT_WARN("blas: the %s kernel is not used: it computes wrong results (normalised "
                    "error %.3g, at most %.0e allowed)",
                    name, r[i].max_err, DT_BLAS_ERR_MAX);
        else
            pass[i] = true;
    }
    int best = -1;
    for (int i = 0; i < plan->n; i++)
        if (pass[i] && (best < 0 || r[i].gflops * NEAR > r[best].gflops))
            best = i;
    if (best >= 0 && r[best].gflops >= FASTER * base) {
        /* OpenBLAS's own choice timed again before the winner is taken: a busy moment during
         * the first timing must not make the candidates look faster */
        double again = time_default(c, as_if);
        base = again > base ? again : base;
    }
    for (int i = 0; i < plan->n; i++)
        if (pass[i] && !(r[i].gflops >= FASTER * base))
            DT_WARN("blas: the %s kernel is not used: it is not faster than OpenBLAS's %s "
                    "(sgemm %.1f against %.1f GFLOP/s on one thread)",
                    plan->cand[i]->name, mine, r[i].gflops, base);
        else if (pass[i] && i != best)
            DT_DEBUG("blas: the %s kernel passed too (sgemm %.1f GFLOP/s): %s is faster",
                     plan->cand[i]->name, r[i].gflops, plan->cand[best]->name);
    if (best >= 0 && r[best].gflops >= FASTER * base)
        use = plan->cand[best];
    c->probe_seconds = dt_now_s() - t0;
    c->gflops_default = base;
    memset(e, 0, sizeof *e);
    e->gflops_default = base;
    if (use) {
        const dt_blas_probe_out *w = &r[best];
        dt_strlcpy(c->coretype, use->name, sizeof c->coretype);
        c->gflops = w->gflops;
        snprintf(c->note, sizeof c->note,
                 "%s; %s passed the check (normalised error %.2g) at %.1f GFLOP/s against %.1f "
                 "for %s, the fastest that did (%d helpers, %.2f s)",
                 plan->why, use->name, w->max_err, w->gflops, base, mine, c->probes,
                 c->probe_seconds);
        DT_INFO("blas: using OpenBLAS's %s kernel instead of %s (%s, sgemm %.1f against %.1f "
                "GFLOP/s on one thread; probed in %.2f s, cached)",
                use->name, mine, dt_blas_level_name(use->level), w->gflops, base,
                c->probe_seconds);
        dt_strlcpy(e->use, use->name, sizeof e->use);
        e->gflops = w->gflops;
    } else {
        c->gflops = base;
        snprintf(c->note, sizeof c->note, "%s; none passed, %s kept (%d helpers, %.2f s)",
                 plan->why, mine, c->probes, c->probe_seconds);
        e->gflops = base;
    }
    dt_strlcpy(e->note, c->note, sizeof e->note);
}

void dt_blas_choose(dt_blas_choice *c)
{
    memset(c, 0, sizeof *c);
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (set) { /* set at all, even empty: the user's or the machine's, or a dtrain parent's */
        snprintf(c->note, sizeof c->note, "OPENBLAS_CORETYPE=%s is set: left alone", set);
        return;
    }
    const char *mode = dt_env("DTRAIN_BLAS_PROBE");
    bool force = mode && !strcmp(mode, "force");
    if (mode && !strcmp(mode, "off")) {
        snprintf(c->note, sizeof c->note, "DTRAIN_BLAS_PROBE=off: OpenBLAS's own choice");
        return;
    }
    if (mode && !force && strcmp(mode, "auto"))
        DT_WARN("DTRAIN_BLAS_PROBE=%s is not auto, off or force; using auto", mode);
    const char *as_if = dt_env("DTRAIN_BLAS_AS_IF");
    if (as_if && !dt_blas_kernel_find(as_if)) {
        DT_WARN("DTRAIN_BLAS_AS_IF=%s is no OpenBLAS kernel dtrain knows; ignored", as_if);
        as_if = NULL;
    }
    dt_cpuid id;
    dt_cpuid_read(&id);
    dt_blas_plan plan;
    dt_blas_plan_make(&plan, id.features, as_if ? as_if : dt_blas_corename(), dt_blas_has_kernel,
                      NULL, force);
    if (plan.n == 0) {
        dt_strlcpy(c->note, plan.why, sizeof c->note);
        return;
    }
    char key[2100];
    cache_key(&id, key, sizeof key - 64);
    if (as_if) /* a test's verdict is not this machine's */
        snprintf(key + strlen(key), 64, " as-if=%s", as_if);
    cache_entry e;
    if (!force && cache_read(key, &e)) {
        dt_strlcpy(c->coretype, e.use, sizeof c->coretype);
        c->gflops = e.gflops;
        c->gflops_default = e.gflops_default;
        c->cached = true;
        snprintf(c->note, sizeof c->note, "%.490s (cached)", e.note);
        DT_DEBUG("blas: %s", c->note);
        return;
    }
    probe_candidates(c, &plan, as_if, &e);
    cache_write(key, &e);
}

/* ---- start-up ----------------------------------------------------------------------------- */

void dt_blas_choice_value(const dt_blas_choice *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %.3f %s", c->coretype, c->gflops, c->note);
}

int dt_blas_boot(int argc, char **argv, bool apply)
{
    if (argc >= 2 && !strcmp(argv[1], DT_BLAS_PROBE_ARG))
        return probe_main();
    if (!apply || getenv("OPENBLAS_CORETYPE"))
        return -1;
    dt_log_init();
    dt_blas_choice c;
    dt_blas_choose(&c);
    if (!c.coretype[0])
        return -1;
    char note[600];
    dt_blas_choice_value(&c, note, sizeof note);
    if (setenv("OPENBLAS_CORETYPE", c.coretype, 1) != 0 ||
        setenv("DTRAIN_BLAS_CHOICE", note, 1) != 0) {
        unsetenv("OPENBLAS_CORETYPE");
        return -1;
    }
    fflush(NULL);
    execv("/proc/self/exe", argv);
    DT_WARN("blas: cannot re-execute %s to load OpenBLAS's %s kernel (%s): running with %s",
            argv[0], c.coretype, strerror(errno), dt_blas_corename());
    unsetenv("OPENBLAS_CORETYPE"); /* ours, not the user's */
    unsetenv("DTRAIN_BLAS_CHOICE");
    return -1;
}

void dt_blas_describe(char *buf, size_t cap, bool measure)
{
    char version[64] = "OpenBLAS";
    const char *cfg = dt_blas_config();
    const char *sp = strchr(cfg, ' ');
    if (sp && !strncmp(cfg, "OpenBLAS ", 9)) { /* "OpenBLAS 0.3.21 NO_LAPACKE ..." */
        const char *end = strchr(sp + 1, ' ');
        snprintf(version, sizeof version, "%.*s", (int)((end ? end : sp + strlen(sp)) - cfg),
                 cfg);
    }
    const char *core = dt_blas_corename(), *set = getenv("OPENBLAS_CORETYPE");
    const char *choice = dt_env("DTRAIN_BLAS_CHOICE");
    char how[700];
    char ckern[32] = "";
    double cgf = 0;
    int used = 0;
    if (choice && sscanf(choice, "%31s %lf %n", ckern, &cgf, &used) >= 2 && set &&
        !strcasecmp(ckern, set)) {
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s set by dtrain, %.1f GFLOP/s when "
                 "checked: %s", set, cgf, choice + used);
    } else if (set) {
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s from the environment, left alone%s",
                 set, strcasecmp(set, core) ? "; OpenBLAS runs another kernel than it names" : "");
    } else {
        dt_cpuid id;
        dt_cpuid_read(&id);
        dt_blas_plan plan;
        dt_blas_plan_make(&plan, id.features, core, dt_blas_has_kernel, NULL, false);
        snprintf(how, sizeof how, "OpenBLAS's own choice: %s", plan.why);
    }
    int n = snprintf(buf, cap, "%s kernel %s (%s)", version, core, how);
    for (char **e = environ; *e && n >= 0 && (size_t)n < cap; e++) /* the others, as they are */
        if (!strncmp(*e, "OPENBLAS_", 9) && strncmp(*e, "OPENBLAS_CORETYPE=", 18))
            n += snprintf(buf + n, cap - (size_t)n, "; %s", *e);
    if (measure && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, "; sgemm 512^3 %.1f GFLOP/s on one thread",
                 dt_blas_sgemm_rate(512, 512, 512, 0.01));
}
