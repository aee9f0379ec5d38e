/* config_load.c - reading a job: the INI reader (inih), settings and overrides, the checks of
 * the keys against each other at load, and the loaders of config.h (dt_job_load,
 * dt_job_load_settings, dt_launch_load, dt_job_set, dt_job_validate). It reads and writes single
 * values through the key table of config.c (dt_cfg_find, dt_cfg_set, dt_cfg_format), never the
 * other way round.
 *
 * Every error is collected with the source of the value it is about (file:line, flag or
 * override): parse_ctx remembers where each key got its value, and a check that involves several
 * keys names the one set last.
 */
#include "runtime/job/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/util.h"
#include "rendezvous/rdzv.h"

/* ---- errors ------------------------------------------------------------------------------ */

/* gpt and bert: the models with transformer layers (n_layer, n_head, n_embd, block_size, token
 * data, tensor and sequence parallelism). */
static bool is_transformer(dt_model_kind k) { return k == DT_MODEL_GPT || k == DT_MODEL_BERT; }

static void add_error(dt_config_errors *errs, const char *where, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_error(dt_config_errors *errs, const char *where, int line, const char *fmt, ...)
{
    if (!errs)
        return;
    if (errs->count >= (int)DT_ARRAY_LEN(errs->lines)) {
        errs->count++;
        return;
    }
    char *dst = errs->lines[errs->count++];
    size_t cap = sizeof errs->lines[0];
    int n = line > 0 ? snprintf(dst, cap, "%s:%d: ", where, line) : snprintf(dst, cap, "%s: ", where);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < cap)
        vsnprintf(dst + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct parse_ctx {
    dt_job *job;
    dt_config_errors *errs;
    const char *where;    /* file name (or the source of a setting) for messages */
    int line;             /* current line (counted by the reader); 0 outside the file */
    FILE *fp;
    int seen_line[256];   /* line each field was set on (duplicate detection) */
    bool seen_required[256];
    char src[256][96];    /* where each field last got its value ("job.ini:12", "--nnodes") */
    int seq[256];         /* order of that assignment (0 = still the default) */
    bool bad[256];        /* the last value given for the field was rejected */
    bool derived_micro_batches; /* parallel.micro_batches not given: = parallel.pipeline */
    int nseq;
    char long_value[4096]; /* the value of a line too long for inih (see long_line) */
    char full[4096 + 256]; /* the line being read (line_reader) */
} parse_ctx;

/* What inih gets in place of a value too long for it; on_ini_entry swaps the value back. */
#define LONG_MARK "\x1f"

static void note_source(parse_ctx *c, int idx, bool ok)
{
    if (c->line > 0)
        snprintf(c->src[idx], sizeof c->src[idx], "%s:%d", c->where, c->line);
    else
        snprintf(c->src[idx], sizeof c->src[idx], "%s", c->where);
    c->seq[idx] = ++c->nseq;
    c->bad[idx] = !ok;
}

static void fold_rdzv_conf(parse_ctx *c, const char *value);

static void report_unknown_key(parse_ctx *c, const char *section, const char *key)
{
    const char *cands[256];
    int n = 0;
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].section, section))
            cands[n++] = dt_cfg_fields[i].key;
    const char *near = dt_nearest(key, cands, (size_t)n);
    if (near) {
        add_error(c->errs, c->where, c->line, "unknown key \"%s\" in [%s]; did you mean \"%s\"?",
                  key, section, near);
        return;
    }
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (!strcasecmp(dt_cfg_fields[i].key, key)) {
            add_error(c->errs, c->where, c->line,
                      "unknown key \"%s\" in [%s]; it belongs in [%s]", key, section,
                      dt_cfg_fields[i].section);
            return;
        }
    add_error(c->errs, c->where, c->line,
              "unknown key \"%s\" in [%s] (see the job file reference, docs/keys.md)", key,
              section);
}

static int assign(parse_ctx *c, const char *section, const char *key, const char *value)
{
    const dt_cfg_field *f = dt_cfg_find(section, key);
    if (!f) {
        report_unknown_key(c, section, key);
        return 0;
    }
    int idx = (int)(f - dt_cfg_fields);
    c->seen_required[idx] = true; /* present, even if its value is wrong */
    if (c->seen_line[idx] > 0 && c->line) {
        add_error(c->errs, c->where, c->line, "%s.%s is set twice (also on line %d)", f->section,
                  f->key, c->seen_line[idx]);
        return 0;
    }
    /* "x y" stands for x y: quotes keep spaces at either end (--print-config writes them). */
    char unq[DT_PATH_MAX + 8];
    size_t len = strlen(value);
    if (len >= 1 && value[0] == '"' && (len == 1 || value[len - 1] != '"')) {
        add_error(c->errs, c->where, c->line,
                  "%s.%s: unterminated double quote in %.200s (end the value with \", or remove "
                  "the quote)",
                  f->section, f->key, value);
        c->seen_line[idx] = c->line > 0 ? c->line : -1;
        note_source(c, idx, false);
        return 0;
    }
    if (len >= 2 && value[0] == '"' && value[len - 1] == '"' && len - 2 < sizeof unq) {
        memcpy(unq, value + 1, len - 2);
        unq[len - 2] = '\0';
        value = unq;
    }
    c->seen_line[idx] = c->line > 0 ? c->line : -1;
    if (!strcmp(f->section, "rendezvous") && !strcmp(f->key, "conf")) {
        fold_rdzv_conf(c, value);
        return 0;
    }
    char why[512];
    if (dt_cfg_set(c->job, f, value, why, sizeof why) != 0) {
        add_error(c->errs, c->where, c->line, "%s", why);
        note_source(c, idx, false);
        return 0;
    }
    note_source(c, idx, true);
    return 0;
}

static void report_undt_cfg_known_section(parse_ctx *c, const char *section)
{
    const char *near = dt_nearest(section, dt_cfg_sections, (size_t)dt_cfg_sections_count);
    if (near)
        add_error(c->errs, c->where, c->line, "unknown section [%s]; did you mean [%s]?", section,
                  near);
    else
        add_error(c->errs, c->where, c->line,
                  "unknown section [%s] (sections: job, model, data, train, ddp, parallel, "
                  "checkpoint, elastic, rendezvous)",
                  section);
}

static int on_ini_entry(void *user, const char *section, const char *name, const char *value)
{
    parse_ctx *c = user;
    if (!name)
        return 1;
    if (!section[0]) {
        add_error(c->errs, c->where, c->line, "key \"%s\" is outside any [section]", name);
        return 1;
    }
    if (!dt_cfg_known_section(section))
        return 1; /* reported at its header by line_reader */
    if (c->long_value[0] && !strcmp(value, LONG_MARK))
        value = c->long_value;
    assign(c, section, name, value);
    c->long_value[0] = '\0';
    return 1;
}

/* inih reads at most INI_MAX_LINE (200 on Debian) bytes per line, far less than a path may
 * take. A longer "key = value" line (full, len bytes) gets its value, trimmed as inih trims values
 * (leading and trailing blanks, an inline "; comment"), into c->long_value, and inih gets
 * "key=" LONG_MARK instead (in str, num bytes). Lines that are not a key at the start of the
 * line, or longer than long_value, are reported and reach inih blank. */
static void long_line(parse_ctx *c, char *full, bool over, char *str, int num)
{
    char *eq = strpbrk(full, "=:");
    bool key = !strchr(" \t;#[", full[0]) && eq && eq - full + 2 < num - 2;
    char *v = eq ? eq + 1 : full;
    while (*v == ' ' || *v == '\t')
        v++;
    for (char *p = v; *p; p++)
        if (*p == ';' && p > v && isspace((unsigned char)p[-1])) {
            *p = '\0';
            break;
        }
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1]))
        v[--n] = '\0';
    if (over || !key || n >= sizeof c->long_value) {
        add_error(c->errs, c->where, c->line, "line longer than %zu characters",
                  key ? sizeof c->long_value - 1 : (size_t)num - 2);
        snprintf(str, (size_t)num, "\n");
        return;
    }
    memcpy(c->long_value, v, n + 1);
    snprintf(str, (size_t)num, "%.*s=%s\n", (int)(eq - full), full, LONG_MARK);
}

/* inih's reader. Reads one whole line byte by byte (a NUL is a byte like any other, so it can
 * neither hide the rest of a line nor shift the numbers of the lines after it), counts it, and
 * hands inih (str, num bytes) what it can parse: the line itself; a blank line for a comment of
 * any length and for a line it reports (a control character, which no job file holds: NUL, ESC,
 * BEL, a CR that does not end the line, ...); "key=" LONG_MARK for a key line longer than num
 * (long_line). Reports too the lines inih would silently treat as errors. */
static char *line_reader(char *str, int num, void *stream)
{
    parse_ctx *c = stream;
    char *full = c->full;
    size_t len = 0, cols = 0, bad_col = 0;
    bool over = false;
    int ch, bad = -1;
    while ((ch = getc(c->fp)) != EOF && ch != '\n') {
        cols++;
        if (len + 1 < sizeof c->full)
            full[len++] = (char)ch;
        else
            over = true;
        if (bad < 0 && ((ch < 0x20 && ch != '\t' && ch != '\r') || ch == 0x7f)) {
            bad = ch;
            bad_col = cols;
        }
        if (bad < 0 && ch == '\r') { /* only as the end of a CRLF line */
            int next = getc(c->fp);
            if (next != '\n' && next != EOF) {
                bad = ch;
                bad_col = cols;
            }
            if (next != EOF)
                ungetc(next, c->fp);
        }
    }
    if (ch == EOF && cols == 0)
        return NULL;
    full[len] = '\0';
    c->line++;
    if (c->line == 1 && len >= 3 && !memcmp(full, "\xEF\xBB\xBF", 3)) { /* a UTF-8 BOM */
        memmove(full, full + 3, len - 2);
        len -= 3;
    }
    snprintf(str, (size_t)num, "\n");
    if (bad >= 0) {
        add_error(c->errs, c->where, c->line,
                  "control character 0x%02x at column %zu: a job file is plain text (remove it; "
                  "a value that needs spaces at either end goes in double quotes)",
                  (unsigned)bad, bad_col);
        return str;
    }
    const char *p = full;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0' || *p == '\r' || *p == ';' || *p == '#')
        return str; /* blank, or a comment: whatever its length */
    if (len + 2 > (size_t)num) {
        long_line(c, full, over, str, num);
        return str;
    }
    snprintf(str, (size_t)num, "%s\n", full);
    if (*p == '[') {
        const char *end = strchr(p, ']');
        if (!end) {
            add_error(c->errs, c->where, c->line, "section header without closing ']'");
            return str;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(end - p - 1), p + 1);
        dt_trim(name);
        if (!dt_cfg_known_section(name))
            report_undt_cfg_known_section(c, name);
        return str;
    }
    if (!strchr(p, '=') && !strchr(p, ':'))
        add_error(c->errs, c->where, c->line,
                  "expected \"key = value\" or \"[section]\", got \"%.60s\"", dt_trim(full));
    return str;
}

static void apply_presets(dt_job *job)
{
    static const struct {
        dt_preset_kind preset;
        int L, H, C, T;
    } presets[] = {
        {DT_PRESET_GPT_TINY, 4, 4, 128, 128},
        {DT_PRESET_GPT_MINI, 6, 6, 384, 256},
        {DT_PRESET_GPT2_124M, 12, 12, 768, 1024},
        {DT_PRESET_BERT_TINY, 2, 2, 128, 512},
        {DT_PRESET_BERT_BASE, 12, 12, 768, 512},
        {DT_PRESET_BERT_LARGE, 24, 16, 1024, 512},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(presets); i++) {
        if (job->preset != presets[i].preset)
            continue;
        if (!job->n_layer)
            job->n_layer = presets[i].L;
        if (!job->n_head)
            job->n_head = presets[i].H;
        if (!job->n_embd)
            job->n_embd = presets[i].C;
        if (!job->block_size)
            job->block_size = presets[i].T;
    }
    /* llama: the shapes of Hugging Face's configs (Llama 3: meta-llama/Meta-Llama-3-8B, -70B) */
    static const struct {
        dt_preset_kind preset;
        int L, H, KV, C, F, T, V;
        double theta;
    } llamas[] = {
        {DT_PRESET_LLAMA_TINY, 4, 4, 2, 128, 384, 128, 0, 10000},
        {DT_PRESET_LLAMA3_8B, 32, 32, 8, 4096, 14336, 8192, 128256, 500000},
        {DT_PRESET_LLAMA3_70B, 80, 64, 8, 8192, 28672, 8192, 128256, 500000},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(llamas) && job->model_type == DT_MODEL_LLAMA; i++) {
        if (job->preset != llamas[i].preset)
            continue;
        job->n_layer = job->n_layer ? job->n_layer : llamas[i].L;
        job->n_head = job->n_head ? job->n_head : llamas[i].H;
        job->n_kv_head = job->n_kv_head ? job->n_kv_head : llamas[i].KV;
        job->n_embd = job->n_embd ? job->n_embd : llamas[i].C;
        job->intermediate_size = job->intermediate_size ? job->intermediate_size : llamas[i].F;
        job->block_size = job->block_size ? job->block_size : llamas[i].T;
        job->vocab_size = job->vocab_size ? job->vocab_size : llamas[i].V;
        job->rope_theta = job->rope_theta > 0 ? job->rope_theta : llamas[i].theta;
    }
    static const struct {
        dt_preset_kind preset;
        int depth;
    } resnets[] = {{DT_PRESET_RESNET18, 18}, {DT_PRESET_RESNET34, 34}, {DT_PRESET_RESNET50, 50},
                   {DT_PRESET_RESNET101, 101}, {DT_PRESET_RESNET152, 152}};
    bool tv = false;
    for (size_t i = 0; i < DT_ARRAY_LEN(resnets) && job->model_type == DT_MODEL_RESNET; i++)
        if (job->preset == resnets[i].preset) {
            job->depth = resnets[i].depth;
            tv = true;
        }
    if (job->model_type == DT_MODEL_RESNET && !job->width)
        job->width = tv ? 64 : 16;
    if (job->model_type == DT_MODEL_LLAMA) { /* what no preset gave */
        if (!job->n_kv_head)
            job->n_kv_head = job->n_head;
        if (!job->intermediate_size && job->n_embd > 0)
            job->intermediate_size = 256 * ((8 * job->n_embd / 3 + 255) / 256);
        if (!(job->rope_theta > 0))
            job->rope_theta = 10000;
    }
}

static int field_index(const char *section, const char *key)
{
    const dt_cfg_field *f = dt_cfg_find(section, key);
    return f ? (int)(f - dt_cfg_fields) : -1;
}

/* Folds rendezvous.conf ("k=v,...") into the typed [rendezvous] keys now, at the position of its
 * source: what is set later beats it, what was set earlier loses. torchrun's names are mapped:
 * timeout -> join_timeout, keep_alive_interval -> heartbeat_interval, keep_alive_max_attempt ->
 * heartbeat_timeout = heartbeat_interval x attempts. */
static void fold_rdzv_conf(parse_ctx *c, const char *value)
{
    static const char *const allowed[] = {
        "join_timeout",      "last_call_timeout", "close_timeout",       "heartbeat_interval",
        "heartbeat_timeout", "is_host",           "read_timeout",        "timeout",
        "keep_alive_interval", "keep_alive_max_attempt", "cacert", "cert", "key", "user",
        "password_file"};
    char buf[DT_STR_MID], *save = NULL;
    int attempts = 0, attempts_bad = 0;
    if (!dt_strlcpy(buf, value, sizeof buf)) {
        add_error(c->errs, c->where, c->line, "rendezvous.conf: longer than %zu characters",
                  sizeof buf - 1);
        return;
    }
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = dt_trim(tok);
        char *eq = strchr(tok, '=');
        if (!*tok)
            continue;
        if (!eq) {
            add_error(c->errs, c->where, c->line, "rendezvous.conf: \"%s\" is not key=value", tok);
            continue;
        }
        *eq = '\0';
        char *k = dt_trim(tok), *v = dt_trim(eq + 1);
        bool ok = false;
        for (size_t i = 0; i < DT_ARRAY_LEN(allowed); i++)
            ok |= !strcmp(allowed[i], k);
        if (!ok) {
            const char *near = dt_nearest(k, allowed, DT_ARRAY_LEN(allowed));
            add_error(c->errs, c->where, c->line, "rendezvous.conf: unknown key \"%s\"%s%s%s", k,
                      near ? "; did you mean \"" : " (known: join_timeout, last_call_timeout, "
                                                   "close_timeout, heartbeat_interval, "
                                                   "heartbeat_timeout, read_timeout, is_host, "
                                                   "timeout, keep_alive_interval, "
                                                   "keep_alive_max_attempt; etcd: cacert, "
                                                   "cert, key, user, password_file)",
                      near ? near : "", near ? "\"?" : "");
            continue;
        }
        if (!strcmp(k, "keep_alive_max_attempt")) {
            if (dt_parse_int(v, &attempts) || attempts < 1 || attempts > 1000000) {
                add_error(c->errs, c->where, c->line,
                          "rendezvous.conf: keep_alive_max_attempt: \"%s\" must be a whole "
                          "number >= 1",
                          v);
                attempts = 0;
                attempts_bad = 1;
            }
            continue;
        }
        if (!strcmp(k, "timeout"))
            k = "join_timeout";
        else if (!strcmp(k, "keep_alive_interval"))
            k = "heartbeat_interval";
        char why[512];
        int idx = field_index("rendezvous", k);
        bool good = dt_cfg_set(c->job, &dt_cfg_fields[idx], v, why, sizeof why) == 0;
        if (!good)
            add_error(c->errs, c->where, c->line, "rendezvous.conf: %s", why);
        note_source(c, idx, good);
    }
    int idx = field_index("rendezvous", "heartbeat_timeout");
    if (attempts > 0) {
        char v[64], why[512];
        snprintf(v, sizeof v, "%.17g", c->job->launch.heartbeat_interval * attempts);
        bool good = dt_cfg_set(c->job, &dt_cfg_fields[idx], v, why, sizeof why) == 0;
        if (!good)
            add_error(c->errs, c->where, c->line,
                      "rendezvous.conf: keep_alive_interval x keep_alive_max_attempt: %s", why);
        note_source(c, idx, good);
    } else if (attempts_bad) {
        note_source(c, idx, false);
    }
}

/* The source of whichever of keys ("section.key", NULL-terminated) was set last, else w. */
static const char *where_of(const parse_ctx *c, const char *w, const char *const *keys)
{
    int best = 0;
    const char *src = w;
    for (; c && *keys; keys++) {
        char sec[32];
        const char *dot = strchr(*keys, '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - *keys), *keys);
        int idx = field_index(sec, dot + 1);
        if (idx >= 0 && c->seq[idx] > best) {
            best = c->seq[idx];
            src = c->src[idx];
        }
    }
    return src;
}

/* True when one of keys had a rejected value (a cross-key check on it would only add noise). */
static bool any_bad(const parse_ctx *c, const char *const *keys)
{
    for (; c && *keys; keys++) {
        char sec[32];
        const char *dot = strchr(*keys, '.');
        snprintf(sec, sizeof sec, "%.*s", (int)(dot - *keys), *keys);
        int idx = field_index(sec, dot + 1);
        if (idx >= 0 && c->bad[idx])
            return true;
    }
    return false;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define AT(...) where_of(c, w, KEYS(__VA_ARGS__))
#define BAD(...) any_bad(c, KEYS(__VA_ARGS__))

static int launch_validate(const dt_launch *l, const parse_ctx *c, const char *w,
                           dt_config_errors *errs)
{
    int before = errs ? errs->count : 0;
    /* Per-key forms (already checked when a key is set; here for structs filled otherwise). */
    static const struct {
        const char *key;
        size_t off;
    } strs[] = {
        {"nnodes", offsetof(dt_launch, nnodes)},
        {"redirects", offsetof(dt_launch, redirects)},
        {"tee", offsetof(dt_launch, tee)},
        {"local_ranks_filter", offsetof(dt_launch, local_ranks_filter)},
        {"endpoint", offsetof(dt_launch, rdzv_endpoint)},
        {"id", offsetof(dt_launch, rdzv_id)},
    };
    for (size_t i = 0; i < DT_ARRAY_LEN(strs); i++) {
        const dt_cfg_field *f = dt_cfg_find("elastic", strs[i].key);
        if (!f)
            f = dt_cfg_find("rendezvous", strs[i].key);
        char why[512], k[64];
        if (f && dt_cfg_check_str(f, (const char *)l + strs[i].off, why, sizeof why)) {
            snprintf(k, sizeof k, "%s.%s", f->section, f->key);
            add_error(errs, where_of(c, w, KEYS(k)), 0, "%s", why);
        }
    }
    char why[512], given[32];
    if (dt_nproc_check(&l->nproc_per_node, dt_nproc_format(&l->nproc_per_node, given, sizeof given),
                    why, sizeof why))
        add_error(errs, AT("elastic.nproc_per_node"), 0, "%s", why);
    if (l->rdzv_backend != DT_RDZV_ETCD && strchr(l->rdzv_endpoint, ',') &&
        !BAD("rendezvous.endpoint"))
        add_error(errs, AT("rendezvous.endpoint", "rendezvous.backend"), 0,
                  "rendezvous.endpoint: a list (%s) names the members of an etcd cluster: it is "
                  "for --rdzv-backend=etcd; %s takes one HOST[:PORT]",
                  l->rdzv_endpoint, dt_rdzv_backend_name(l->rdzv_backend));
    if (l->rdzv_backend != DT_RDZV_ETCD &&
        (l->rdzv_cacert[0] || l->rdzv_cert[0] || l->rdzv_key[0] || l->rdzv_user[0] ||
         l->rdzv_password_file[0]))
        add_error(errs, AT("rendezvous.cacert", "rendezvous.cert", "rendezvous.key",
                           "rendezvous.user", "rendezvous.password_file"),
                  0, "rendezvous.cacert, cert, key, user and password_file are for "
                     "--rdzv-backend=etcd only (the dtrain store has --token instead)");
    if (l->rdzv_backend == DT_RDZV_ETCD && !l->rdzv_user[0] != !l->rdzv_password_file[0])
        add_error(errs, AT("rendezvous.user", "rendezvous.password_file"), 0,
                  "rendezvous.user and rendezvous.password_file go together (etcd "
                  "authentication)");
    if (l->rdzv_backend == DT_RDZV_ETCD && !l->rdzv_cert[0] != !l->rdzv_key[0])
        add_error(errs, AT("rendezvous.cert", "rendezvous.key"), 0,
                  "rendezvous.cert and rendezvous.key go together (a TLS client certificate "
                  "and its key)");
    if (l->heartbeat_timeout <= l->heartbeat_interval &&
        !BAD("rendezvous.heartbeat_timeout", "rendezvous.heartbeat_interval"))
        add_error(errs, AT("rendezvous.heartbeat_timeout", "rendezvous.heartbeat_interval"), 0,
                  "rendezvous.heartbeat_timeout (%g s) must be longer than heartbeat_interval "
                  "(%g s): a node would be declared lost between two heartbeats",
                  l->heartbeat_timeout, l->heartbeat_interval);
    int a, b, max_nodes = 0;
    char tail;
    if (sscanf(l->nnodes, "%d:%d%c", &a, &b, &tail) == 2)
        max_nodes = b;
    else if (sscanf(l->nnodes, "%d%c", &a, &tail) == 1)
        max_nodes = a;
    if (!l->standalone && max_nodes > 0 && l->node_rank >= max_nodes &&
        !BAD("rendezvous.node_rank", "elastic.nnodes"))
        add_error(errs, AT("rendezvous.node_rank", "elastic.nnodes"), 0,
                  "rendezvous.node_rank out of range (--node-rank=%d: must be 0..%d for "
                  "--nnodes=%s)",
                  l->node_rank, max_nodes - 1, l->nnodes);
    return errs && errs->count > before ? -EINVAL : 0;
}

int dt_launch_validate(const dt_launch *l, const char *w, dt_config_errors *errs)
{
    return launch_validate(l, NULL, w, errs);
}

/* ---- [parallel] ----------------------------------------------------------------------------- */

int dt_parallel_check_world(int world, int tensor, int pipeline, dt_err *err)
{
    if (world < 1 || tensor < 1 || pipeline < 1)
        return dt_err_set(err, -EINVAL,
                          "world size %d with parallel.tensor = %d and parallel.pipeline = %d: "
                          "all three must be >= 1",
                          world, tensor, pipeline);
    int tp = tensor * pipeline;
    if (world % tp == 0)
        return 0;
    char sizes[96];
    snprintf(sizes, sizeof sizes, "%d, %d, %d, ...", tp, 2 * tp, 3 * tp);
    return dt_err_set(err, -EINVAL,
                      "world size %d is not divisible by parallel.tensor x parallel.pipeline = "
                      "%d x %d = %d (the ranks of one data-parallel replica): run a multiple of "
                      "%d ranks (%s), or change parallel.tensor or parallel.pipeline",
                      world, tensor, pipeline, tp, tp, sizes);
}

/* What the job's pipeline blocks are called in messages. */
static const char *blocks_what(const dt_job *job)
{
    dt_cost_model m;
    dt_job_cost_model(job, &m);
    return dt_cost_blocks_what(&m);
}

/* The [parallel] keys against each other, the model, the strategy and a world size known at
 * load (fixed nodes x a number of workers per node). */
static void parallel_validate(const dt_job *job, const parse_ctx *c, const char *w,
                              dt_config_errors *errs)
{
    const int T = job->tensor, P = job->pipeline;
    const bool model_bad = BAD("model.type", "model.n_layer", "model.n_head", "model.preset",
                               "model.hidden");
    if (BAD("parallel.tensor", "parallel.pipeline"))
        return; /* every check below is about them */
    const bool llama = job->model_type == DT_MODEL_LLAMA;
    const bool splits = is_transformer(job->model_type) || llama; /* has a tensor-parallel form */
    if (T > 1 && !splits && !model_bad)
        add_error(errs, AT("parallel.tensor", "model.type"), 0,
                  "parallel.tensor = %d: tensor parallelism (Megatron-LM's column and row "
                  "splits) is supported for models gpt, bert and llama only, not %s; use "
                  "parallel.tensor = 1 (and parallel.pipeline or more data-parallel ranks)",
                  T, dt_model_name(job->model_type));
    if (T > 1 && llama && !model_bad && !BAD("model.n_kv_head", "model.intermediate_size") &&
        ((job->n_kv_head > 0 && job->n_kv_head % T) ||
         (job->intermediate_size > 0 && job->intermediate_size % T)))
        add_error(errs, AT("parallel.tensor", "model.n_kv_head", "model.intermediate_size"), 0,
                  "parallel.tensor = %d must divide model.n_kv_head = %d and "
                  "model.intermediate_size = %d (each tensor rank takes whole key/value heads "
                  "and an equal share of the MLP): choose a divisor of both",
                  T, job->n_kv_head, job->intermediate_size);
    if (T > 1 && splits && job->n_head > 0 && job->n_head % T && !model_bad) {
        char divs[256];
        size_t n = 0;
        int k = 0, count = 0;
        for (int d = 1; d <= job->n_head; d++)
            count += job->n_head % d == 0;
        divs[0] = '\0';
        for (int d = 1; d <= job->n_head && n < sizeof divs; d++)
            if (job->n_head % d == 0) {
                k++;
                n += (size_t)snprintf(divs + n, sizeof divs - n, "%s%d",
                                      k == 1 ? "" : k == count ? " or " : ", ", d);
            }
        add_error(errs, AT("parallel.tensor", "model.n_head", "model.preset"), 0,
                  "model.n_head = %d is not divisible by parallel.tensor = %d (each tensor rank "
                  "takes whole attention heads): use %s",
                  job->n_head, T, divs);
    }
    int total = dt_job_pipeline_blocks(job);
    if (P > 1 && total > 0 && P > total && !model_bad)
        add_error(errs, AT("parallel.pipeline", "model.n_layer", "model.hidden", "model.depth",
                           "model.preset"),
                  0,
                  "parallel.pipeline = %d is more than the model's %d %s: every stage needs at "
                  "least one; use parallel.pipeline = %d or fewer, or a deeper model",
                  P, total, blocks_what(job), total);
    if (job->n_stage_blocks > 0 && !BAD("parallel.stages") && !model_bad) {
        int sum = 0;
        char given[DT_STR_MID];
        dt_cfg_format(job, &dt_cfg_fields[field_index("parallel", "stages")], given,
                     sizeof given);
        for (int i = 0; i < job->n_stage_blocks; i++)
            sum += job->stage_blocks[i];
        if (job->n_stage_blocks != P)
            add_error(errs, AT("parallel.stages", "parallel.pipeline"), 0,
                      "parallel.stages = %s gives %d stage%s but parallel.pipeline = %d: give "
                      "the blocks of each of the %d stages, or leave parallel.stages empty for "
                      "a balanced split",
                      given, job->n_stage_blocks, job->n_stage_blocks == 1 ? "" : "s", P, P);
        else if (total > 0 && sum != total)
            add_error(errs, AT("parallel.stages", "model.n_layer", "model.hidden", "model.depth",
                               "model.preset"),
                      0,
                      "parallel.stages = %s adds up to %d blocks, but the model has %d %s: "
                      "make the stages' blocks add up to %d",
                      given, sum, total, blocks_what(job), total);
    }
    const int M = job->micro_batches;
    /* derived at this load (not given: parallel.pipeline's value), or as given */
    bool derived = c && c->derived_micro_batches;
    if (M > 0 && job->batch_size % M && !BAD("parallel.micro_batches", "train.batch_size"))
        add_error(errs, AT("parallel.micro_batches", "train.batch_size", "parallel.pipeline"), 0,
                  "parallel.micro_batches = %d%s does not divide train.batch_size = %d (a rank's "
                  "batch is cut into micro-batches of equal size): set parallel.micro_batches "
                  "to a divisor of %d, or train.batch_size to a multiple of %d",
                  M, derived ? " (its default: parallel.pipeline)" : "", job->batch_size,
                  job->batch_size, M);
    if ((T > 1 || P > 1) && job->strategy == DT_STRATEGY_DP && !BAD("job.strategy"))
        add_error(errs, AT("job.strategy", "parallel.tensor", "parallel.pipeline"), 0,
                  "parallel.tensor = %d and parallel.pipeline = %d need one worker process per "
                  "device, but job.strategy = dp drives every replica from one process: use "
                  "job.strategy = ddp",
                  T, P);
    /* The world, where the job alone fixes it; else the agent checks it after the rendezvous. */
    const dt_launch *l = &job->launch;
    int lo, hi;
    char tail;
    if ((T > 1 || P > 1) && l->nproc_per_node.kind == DT_NPROC_NUMBER &&
        !BAD("elastic.nnodes", "elastic.nproc_per_node")) {
        int n = l->nproc_per_node.n;
        dt_err e = {0};
        if (sscanf(l->nnodes, "%d%c", &lo, &tail) == 1 && lo >= 1 &&
            dt_parallel_check_world(lo * n, T, P, &e))
            add_error(errs, AT("elastic.nnodes", "elastic.nproc_per_node", "parallel.tensor",
                               "parallel.pipeline"),
                      0, "elastic.nnodes = %d x elastic.nproc_per_node = %d: %s", lo, n, e.msg);
        else if (sscanf(l->nnodes, "%d:%d%c", &lo, &hi, &tail) == 2 && lo >= 1 && hi >= lo) {
            int k = lo;
            while (k <= hi && (k * n) % (T * P))
                k++;
            if (k > hi)
                add_error(errs, AT("elastic.nnodes", "elastic.nproc_per_node",
                                   "parallel.tensor", "parallel.pipeline"),
                          0,
                          "elastic.nnodes = %s x elastic.nproc_per_node = %d: none of the world "
                          "sizes %d to %d is a multiple of parallel.tensor x parallel.pipeline = "
                          "%d x %d = %d; change the node range, the workers per node, or "
                          "parallel.tensor or parallel.pipeline",
                          l->nnodes, n, lo * n, hi * n, T, P, T * P);
        }
    }
}

/* parallel.sequence_parallel against parallel.tensor and the sequence length (kept apart from
 * parallel_validate: it only reads those). */
static void sequence_parallel_validate(const dt_job *job, const parse_ctx *c, const char *w,
                                       dt_config_errors *errs)
{
    const int T = job->tensor;
    if (!job->sequence_parallel || BAD("parallel.sequence_parallel", "parallel.tensor"))
        return;
    if (T <= 1) {
        add_error(errs, AT("parallel.sequence_parallel", "parallel.tensor"), 0,
                  "parallel.sequence_parallel = true splits what tensor parallelism replicates, "
                  "but parallel.tensor = %d: set parallel.tensor > 1 (gpt, bert, llama), or "
                  "parallel.sequence_parallel = false",
                  T);
        return;
    }
    const int seq = job->seq_len > 0 ? job->seq_len : job->block_size; /* 0: the block size */
    if ((is_transformer(job->model_type) || job->model_type == DT_MODEL_LLAMA) && seq > 0 &&
        seq % T &&
        !BAD("data.seq_len", "model.block_size", "model.preset"))
        add_error(errs, AT("parallel.sequence_parallel", "parallel.tensor", "data.seq_len"), 0,
                  "parallel.sequence_parallel = true splits each sequence's %d tokens over the "
                  "parallel.tensor = %d ranks, which does not divide it: set data.seq_len to a "
                  "multiple of %d, or parallel.sequence_parallel = false",
                  seq, T, T);
}

static int job_validate(const dt_job *job, const parse_ctx *c, dt_config_errors *errs)
{
    int before = errs ? errs->count : 0;
    const char *w = job->path[0] ? job->path : "job";
    launch_validate(&job->launch, c, w, errs);
    if (is_transformer(job->model_type) &&
        !BAD("model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "model.preset")) {
        if (job->n_layer <= 0 || job->n_head <= 0 || job->n_embd <= 0 || job->block_size <= 0)
            add_error(errs, AT("model.type", "model.preset"), 0,
                      "model: %s needs n_layer, n_head, n_embd and block_size (or a preset: %s)",
                      dt_model_name(job->model_type),
                      job->model_type == DT_MODEL_BERT ? "bert-tiny, bert-base, bert-large"
                                                       : "gpt-tiny, gpt-mini, gpt2-124m");
        else if (job->n_embd % job->n_head)
            add_error(errs, AT("model.n_embd", "model.n_head"), 0,
                      "model: n_embd (%d) must be divisible by n_head (%d)", job->n_embd,
                      job->n_head);
        if (job->seq_len > job->block_size && job->block_size > 0 && !BAD("data.seq_len"))
            add_error(errs, AT("data.seq_len", "model.block_size"), 0,
                      "data.seq_len (%d) must not exceed model.block_size (%d)", job->seq_len,
                      job->block_size);
    }
    if (job->model_type == DT_MODEL_LLAMA &&
        !BAD("model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "model.preset",
             "model.n_kv_head", "model.intermediate_size")) {
        if (job->n_layer <= 0 || job->n_head <= 0 || job->n_embd <= 0 || job->block_size <= 0)
            add_error(errs, AT("model.type", "model.preset"), 0,
                      "model: llama needs n_layer, n_head, n_embd and block_size (or a preset: "
                      "llama-tiny, llama3-8b, llama3-70b)");
        else if (job->n_embd % job->n_head || (job->n_embd / job->n_head) % 2)
            add_error(errs, AT("model.n_embd", "model.n_head"), 0,
                      "model: n_embd / n_head (%d / %d) must be a whole, even head size (rotary "
                      "embeddings turn pairs of channels)",
                      job->n_embd, job->n_head);
        else if (job->n_kv_head > 0 && job->n_head % job->n_kv_head)
            add_error(errs, AT("model.n_kv_head", "model.n_head"), 0,
                      "model.n_kv_head = %d must divide model.n_head = %d (each key/value head "
                      "serves n_head / n_kv_head query heads): use a divisor of %d",
                      job->n_kv_head, job->n_head, job->n_head);
        if (job->seq_len > job->block_size && job->block_size > 0 && !BAD("data.seq_len"))
            add_error(errs, AT("data.seq_len", "model.block_size"), 0,
                      "data.seq_len (%d) must not exceed model.block_size (%d)", job->seq_len,
                      job->block_size);
    }
    /* a preset belongs to one model: llama-* to llama only, resnet* to resnet only, and llama
     * takes no gpt-* or bert-* (the other models ignore those, as they always did) */
    const char *pname = dt_preset_name(job->preset);
    const bool gpt_preset = !strncmp(pname, "gpt", 3), llama_preset = !strncmp(pname, "llama", 5);
    const bool resnet_preset = !strncmp(pname, "resnet", 6);
    const bool bert_preset = !strncmp(pname, "bert", 4);
    if (((gpt_preset || bert_preset) && job->model_type == DT_MODEL_LLAMA) ||
        (llama_preset && job->model_type != DT_MODEL_LLAMA) ||
        (resnet_preset && job->model_type != DT_MODEL_RESNET)) {
        const char *of = gpt_preset    ? "gpt"
                         : bert_preset ? "bert"
                         : llama_preset ? "llama"
                                        : "resnet";
        if (!BAD("model.preset", "model.type"))
            add_error(errs, AT("model.preset", "model.type"), 0,
                      "model.preset = %s is a preset of model %s, but model.type = %s: use "
                      "model.type = %s, or a preset of %s",
                      pname, of, dt_model_name(job->model_type), of,
                      dt_model_name(job->model_type));
    }
    if (job->model_type == DT_MODEL_RESNET && !resnet_preset && (job->depth - 2) % 6 &&
        !BAD("model.depth"))
        add_error(errs, AT("model.depth"), 0, "model.depth: %d is not 6n+2 (use 20, 32, 44, 56 or 110)",
                  job->depth);
    if (job->model_type == DT_MODEL_MLP && !BAD("model.hidden")) {
        int widths[DT_MAX_HIDDEN];
        dt_err e = {0};
        int n = dt_job_mlp_widths(job->hidden, widths, &e);
        if (n == 0)
            dt_err_set(&e, -EINVAL, "model.hidden: \"%s\" must be positive widths such as 256,256",
                       job->hidden);
        if (n <= 0)
            add_error(errs, AT("model.hidden"), 0, "%s", e.msg);
    }
    if (job->data_type != DT_DATA_SYNTHETIC && !job->data_path[0] && !BAD("data.path"))
        add_error(errs, AT("data.type", "data.path"), 0, "data.path is required for data.type = %s",
                  dt_data_name(job->data_type));
    const int *chw = job->synthetic_shape;
    if (job->data_type == DT_DATA_SYNTHETIC && (chw[0] < 0 || chw[1] < 0 || chw[2] < 0 ||
                                                (chw[0] > 0) != (chw[1] > 0 && chw[2] > 0)))
        add_error(errs, AT("data.synthetic_shape"), 0,
                  "data.synthetic_shape: %dx%dx%d must be vector or CxHxW such as 3x32x32",
                  chw[0], chw[1], chw[2]);
    if ((is_transformer(job->model_type) || job->model_type == DT_MODEL_LLAMA) &&
        (job->data_type == DT_DATA_CIFAR10 || job->data_type == DT_DATA_MNIST))
        add_error(errs, AT("model.type", "data.type"), 0,
                  "model %s needs token data (text, tokens%s), not %s",
                  dt_model_name(job->model_type),
                  job->model_type == DT_MODEL_LLAMA ? "" : " or synthetic",
                  dt_data_name(job->data_type));
    if (job->nsp && job->model_type != DT_MODEL_BERT && !BAD("model.nsp", "model.type"))
        add_error(errs, AT("model.nsp", "model.type"), 0,
                  "model.nsp = true is bert's next-sentence head, not %s's: set model.type = "
                  "bert or drop model.nsp",
                  dt_model_name(job->model_type));
    if ((job->model_type == DT_MODEL_MLP || job->model_type == DT_MODEL_RESNET) &&
        (job->data_type == DT_DATA_TEXT || job->data_type == DT_DATA_TOKENS))
        add_error(errs, AT("model.type", "data.type"), 0,
                  "model %s needs classification data (synthetic, cifar10, mnist), not %s",
                  dt_model_name(job->model_type), dt_data_name(job->data_type));
    /* selective recomputation recomputes attention: the models without it cannot */
    if (job->recompute == DT_RECOMP_SELECTIVE &&
        (job->model_type == DT_MODEL_MLP || job->model_type == DT_MODEL_RESNET) &&
        !BAD("train.recompute", "model.type"))
        add_error(errs, AT("train.recompute", "model.type"), 0,
                  "train.recompute = selective recomputes attention, which model %s does not "
                  "have: use train.recompute = block (or none)",
                  dt_model_name(job->model_type));
    if (job->steps == 0 && job->epochs == 0 && !BAD("train.steps", "train.epochs"))
        add_error(errs, AT("train.steps", "train.epochs"), 0, "train: set steps or epochs (both are 0)");
    if (job->min_lr > job->lr && !BAD("train.min_lr", "train.lr"))
        add_error(errs, AT("train.min_lr", "train.lr"), 0,
                  "train.min_lr (%g) must not exceed train.lr (%g)", job->min_lr, job->lr);
    /* global_batch derives the accumulation from the world size at every start: a fixed
     * grad_accum beside it would say two things about the same step */
    if (job->global_batch > 0 && job->grad_accum != 1 && !BAD("train.global_batch", "train.grad_accum"))
        add_error(errs, AT("train.global_batch", "train.grad_accum"), 0,
                  "train.grad_accum = %d and train.global_batch = %lld both set the samples per "
                  "step: with global_batch the micro-steps are derived from it, batch_size and the "
                  "world size at every start; drop train.grad_accum (or set it to 1)",
                  job->grad_accum, (long long)job->global_batch);
    if (job->zero > 0 && job->strategy == DT_STRATEGY_DP && !BAD("parallel.zero", "job.strategy"))
        add_error(errs, AT("parallel.zero", "job.strategy"), 0,
                  "parallel.zero = %d shards state across worker processes, but job.strategy = dp "
                  "drives all replicas from one process: use job.strategy = ddp (one worker per "
                  "device) with parallel.zero, or parallel.zero = 0 with dp", job->zero);
    if (job->comm_backend == DT_COMM_BACKEND_NCCL && job->device == DT_DEVICE_CPU &&
        !BAD("ddp.backend", "job.device"))
        add_error(errs, AT("ddp.backend", "job.device"), 0,
                  "ddp.backend = nccl needs job.device = cuda (or auto on a node with GPUs), "
                  "not cpu: use ddp.backend = cpu or auto, or job.device = cuda");
    if (job->zero == 3 && job->global_batch > 0 && !BAD("parallel.zero", "train.global_batch"))
        add_error(errs, AT("parallel.zero", "train.global_batch"), 0,
                  "parallel.zero = 3 gathers parameters in every micro-step, so every rank must "
                  "run as many micro-steps, which train.global_batch does not promise: use "
                  "train.grad_accum with parallel.zero = 3, or parallel.zero = 1 or 2 with "
                  "train.global_batch");
    /* the low-bit all-reduce is DDP's reducer's, over host memory (docs/parallelism.md) */
    bool lowbit = job->compress == DT_COMPRESS_INT8 || job->compress == DT_COMPRESS_1BIT;
    if (lowbit && job->zero > 0 && !BAD("ddp.compress", "parallel.zero"))
        add_error(errs, AT("ddp.compress", "parallel.zero"), 0,
                  "ddp.compress = %s runs in DDP's all-reduce, not in ZeRO's reduce-scatter "
                  "(parallel.zero = %d): use parallel.zero = 0, or ddp.compress = bf16 or fp16 "
                  "with ZeRO", dt_compress_name(job->compress), job->zero);
    if (lowbit && job->device == DT_DEVICE_CUDA && !BAD("ddp.compress", "job.device"))
        add_error(errs, AT("ddp.compress", "job.device"), 0,
                  "ddp.compress = %s quantises on the CPU (there are no CUDA kernels for it yet): "
                  "use job.device = cpu, or ddp.compress = bf16 or fp16 on cuda",
                  dt_compress_name(job->compress));
    if (job->compress_stochastic && job->compress != DT_COMPRESS_INT8 &&
        !BAD("ddp.compress_stochastic", "ddp.compress"))
        add_error(errs, AT("ddp.compress_stochastic", "ddp.compress"), 0,
                  "ddp.compress_stochastic = true rounds int8 payloads, but ddp.compress = %s: "
                  "set ddp.compress = int8, or drop ddp.compress_stochastic",
                  dt_compress_name(job->compress));
    if (job->compress == DT_COMPRESS_1BIT && job->precision == DT_PRECISION_FP16 &&
        !BAD("ddp.compress", "train.precision"))
        add_error(errs, AT("ddp.compress", "train.precision"), 0,
                  "ddp.compress = 1bit keeps error-feedback residuals of the gradients it sends, "
                  "which under train.precision = fp16 are times a loss scale that changes (and "
                  "an overflowing step would leave inf in them): use train.precision = bf16 or "
                  "fp32 with 1bit, or ddp.compress = int8 with fp16");
    parallel_validate(job, c, w, errs);
    sequence_parallel_validate(job, c, w, errs);
    if (job->resume == DT_RESUME_PATH && !job->resume_path[0])
        add_error(errs, AT("checkpoint.resume"), 0, "checkpoint.resume: use auto, never or a path");
    return errs && errs->count > before ? -EINVAL : 0;
}

int dt_job_validate(const dt_job *job, dt_config_errors *errs)
{
    return job_validate(job, NULL, errs);
}

static void derive(dt_job *job)
{
    apply_presets(job);
    if (!job->output_dir[0])
        snprintf(job->output_dir, sizeof job->output_dir, "runs/%.200s", job->name);
    if ((is_transformer(job->model_type) || job->model_type == DT_MODEL_LLAMA) &&
        job->seq_len == 0)
        job->seq_len = job->block_size;
}

static int parse_assignment(parse_ctx *c, const char *text)
{
    char buf[DT_PATH_MAX + 128];
    dt_strlcpy(buf, text, sizeof buf);
    char *eq = strchr(buf, '=');
    char *dot = strchr(buf, '.');
    if (!eq || !dot || dot > eq) {
        add_error(c->errs, c->where, 0, "\"%s\" is not section.key=value (example: train.lr=1e-3)",
                  text);
        return -EINVAL;
    }
    *eq = '\0';
    *dot = '\0';
    char *section = dt_trim(buf), *key = dt_trim(dot + 1), *value = dt_trim(eq + 1);
    if (!dt_cfg_known_section(section)) {
        const char *near = dt_nearest(section, dt_cfg_sections, (size_t)dt_cfg_sections_count);
        add_error(c->errs, c->where, 0, "unknown section \"%s\" in \"%s\"%s%s%s", section, text,
                  near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
        return -EINVAL;
    }
    int before = c->errs ? c->errs->count : 0;
    assign(c, section, key, value);
    return c->errs && c->errs->count > before ? -EINVAL : 0;
}

int dt_job_set(dt_job *job, const char *assignment, dt_err *err)
{
    dt_config_errors *errs = calloc(1, sizeof *errs);
    parse_ctx *c = calloc(1, sizeof *c); /* large (source tables) */
    int rc = 0;
    if (!errs || !c) {
        rc = dt_err_set(err, -ENOMEM, "out of memory setting %.60s", assignment);
        goto out;
    }
    c->job = job;
    c->errs = errs;
    c->where = "override";
    if (parse_assignment(c, assignment) != 0)
        rc = dt_err_set(err, -EINVAL, "%s", errs->lines[0]);
out:
    free(c);
    free(errs);
    return rc;
}

static void apply_settings(parse_ctx *c, const dt_setting *settings, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        char where[96];
        if (settings[i].source)
            snprintf(where, sizeof where, "%s", settings[i].source);
        else
            snprintf(where, sizeof where, "override %d (%.40s)", ++k, settings[i].text);
        c->where = where;
        c->line = 0;
        parse_assignment(c, settings[i].text);
    }
}

/* The parse context of a load, reset: job at its defaults, errors into errs. One, static: it is
 * large (seen tables), and loads are not re-entrant, like the command line. */
static parse_ctx load_ctx;

static parse_ctx *load_begin(dt_job *job, dt_config_errors *errs)
{
    memset(&load_ctx, 0, sizeof load_ctx);
    dt_job_defaults(job);
    load_ctx.job = job;
    load_ctx.errs = errs;
    return &load_ctx;
}

const char *dt_job_source(const char *section, const char *key)
{
    int idx = field_index(section, key);
    return idx >= 0 && load_ctx.seq[idx] > 0 ? load_ctx.src[idx] : NULL;
}

/* "N error(s) <what><name>" when errs has any, else 0. */
static int load_end(const dt_config_errors *errs, const char *what, const char *name, dt_err *err)
{
    if (errs->count)
        return dt_err_set(err, -EINVAL, "%d error%s %s%s", errs->count, errs->count > 1 ? "s" : "",
                          what, name);
    return 0;
}

int dt_job_load_settings(dt_job *job, const char *path, const dt_setting *settings, int n,
                         dt_config_errors *errs, dt_err *err)
{
    dt_config_errors local = {0};
    if (!errs)
        errs = &local;
    parse_ctx *c = load_begin(job, errs);
    if (path) {
        struct stat st;
        dt_strlcpy(job->path, path, sizeof job->path);
        c->where = path;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            add_error(errs, path, 0, "cannot open job file: is a directory (give a .ini file)");
            return dt_err_set(err, -EISDIR, "no job loaded");
        }
        c->fp = fopen(path, "r");
        if (!c->fp) {
            add_error(errs, path, 0, "cannot open job file: %s", strerror(errno));
            return dt_err_set(err, -ENOENT, "no job loaded");
        }
        int rc = ini_parse_stream(line_reader, c, on_ini_entry, c);
        fclose(c->fp);
        if (rc < 0)
            add_error(errs, path, 0, "cannot read job file");
    }
    apply_settings(c, settings, n);
    char choices[256];
    for (int i = 0; i < dt_cfg_fields_count; i++)
        if (dt_cfg_fields[i].required && !c->seen_required[i])
            add_error(errs, path ? path : "job", 0,
                      "missing required key %s.%s (%s; one of %s)", dt_cfg_fields[i].section,
                      dt_cfg_fields[i].key, dt_cfg_fields[i].help,
                      dt_cfg_fields[i].choices
                          ? dt_cfg_choices_text(dt_cfg_fields[i].choices, choices, sizeof choices)
                          : "see docs/keys.md");
    derive(job);
    /* parallel.micro_batches not given: one micro-batch per stage keeps the bubble at
     * (P-1)/(2P-1) without asking for a batch the user did not size */
    int mb = field_index("parallel", "micro_batches");
    c->derived_micro_batches = c->seq[mb] == 0 && job->pipeline > 1;
    if (c->derived_micro_batches)
        job->micro_batches = job->pipeline;
    job_validate(job, c, errs);
    return load_end(errs, "loading ", path ? path : "the job", err);
}

int dt_job_load(dt_job *job, const char *path, char *const *overrides, int n_overrides,
                dt_config_errors *errs, dt_err *err)
{
    dt_setting *s = n_overrides > 0 ? calloc((size_t)n_overrides, sizeof *s) : NULL;
    if (n_overrides > 0 && !s)
        return dt_err_set(err, -ENOMEM, "out of memory loading %s", path ? path : "the job");
    for (int i = 0; i < n_overrides; i++)
        s[i].text = overrides[i];
    int rc = dt_job_load_settings(job, path, s, n_overrides, errs, err);
    free(s);
    return rc;
}

int dt_launch_load(dt_job *job, const dt_setting *settings, int n, dt_config_errors *errs,
                   dt_err *err)
{
    dt_config_errors local = {0};
    if (!errs)
        errs = &local;
    parse_ctx *c = load_begin(job, errs);
    apply_settings(c, settings, n);
    launch_validate(&job->launch, c, "command line", errs);
    return load_end(errs, "on the command line", "", err);
}

