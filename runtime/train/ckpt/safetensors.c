/* safetensors.c - the safetensors writer and its strict reader (see safetensors.h).
 *
 * The header is parsed by a small JSON reader of our own rather than a general JSON library:
 * the format needs exact unsigned 64-bit integers (a double holds 53 bits), must reject
 * duplicate keys, floats where integers belong and control characters, and every error should
 * say at which byte of the header it was found. The grammar accepted is JSON restricted to what
 * a safetensors header can hold: objects, arrays, strings and non-negative integers.
 */
#include "runtime/train/ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; dtrain supports little-endian machines only"
#endif

/* ================================================================================ dtypes === */

static const struct {
    const char *name;
    int bits;
} dtypes[DT_ST_NUM_DTYPES] = {
    [DT_ST_BOOL] = {"BOOL", 8},         [DT_ST_F4] = {"F4", 4},
    [DT_ST_F6_E2M3] = {"F6_E2M3", 6},   [DT_ST_F6_E3M2] = {"F6_E3M2", 6},
    [DT_ST_U8] = {"U8", 8},             [DT_ST_I8] = {"I8", 8},
    [DT_ST_F8_E5M2] = {"F8_E5M2", 8},   [DT_ST_F8_E4M3] = {"F8_E4M3", 8},
    [DT_ST_F8_E8M0] = {"F8_E8M0", 8},   [DT_ST_I16] = {"I16", 16},
    [DT_ST_U16] = {"U16", 16},          [DT_ST_F16] = {"F16", 16},
    [DT_ST_BF16] = {"BF16", 16},        [DT_ST_I32] = {"I32", 32},
    [DT_ST_U32] = {"U32", 32},          [DT_ST_F32] = {"F32", 32},
    [DT_ST_F64] = {"F64", 64},          [DT_ST_I64] = {"I64", 64},
    [DT_ST_U64] = {"U64", 64},
};

const char *dt_st_dtype_name(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_NUM_DTYPES ? dtypes[t].name : "?";
}

int dt_st_dtype_bits(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_NUM_DTYPES ? dtypes[t].bits : 0;
}

int dt_st_dtype_parse(const char *name, dt_st_dtype *out)
{
    for (int i = 0; i < DT_ST_NUM_DTYPES; i++)
        if (!strcmp(name, dtypes[i].name)) {
            *out = (dt_st_dtype)i;
            return 0;
        }
    return -EINVAL;
}

uint64_t dt_st_numel(const dt_st_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* numel * bits / 8 into *bytes with overflow checks; -ERANGE on overflow, -EINVAL when the size
 * is not a whole number of bytes. */
static int tensor_bytes(dt_st_dtype dtype, int ndim, const int64_t *shape, uint64_t *bytes)
{
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        uint64_t s = (uint64_t)shape[d];
        if (s && n > UINT64_MAX / s)
            return -ERANGE;
        n *= s;
    }
    uint64_t bits = (uint64_t)dt_st_dtype_bits(dtype);
    if (n && n > UINT64_MAX / bits)
        return -ERANGE;
    if ((n * bits) % 8)
        return -EINVAL;
    *bytes = n * bits / 8;
    return 0;
}

static void shape_str(char *out, size_t size, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(out + o, size - o, "(");
    for (int d = 0; d < ndim && o < size; d++)
        o += (size_t)snprintf(out + o, size - o, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (o < size)
        snprintf(out + o, size - o, ")");
}

/* true when s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        unsigned min;
        if ((c & 0xE0) == 0xC0)
            len = 2, min = 0x80, c &= 0x1F;
        else if ((c & 0xF0) == 0xE0)
            len = 3, min = 0x800, c &= 0x0F;
        else if ((c & 0xF8) == 0xF0)
            len = 4, min = 0x10000, c &= 0x07;
        else
            return false;
        if (i + (size_t)len > n)
            return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + (size_t)k] & 0xC0) != 0x80)
                return false;
            c = (c << 6) | (s[i + (size_t)k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            return false;
        i += (size_t)len;
    }
    return true;
}

/* ================================================================================ writer === */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    sb_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%" PRIu64, v));
}

/* A JSON string escaped as serde_json escapes it (the reference writer's JSON library):
 * quote, backslash and the short control escapes, \u00xx for other control characters, every
 * other byte (UTF-8 included) as is. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                sb_put(b, esc, 6);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

/* The reference order: dtype descending (in enum order), then name ascending bytewise. */
static int cmp_write_order(const void *a, const void *b)
{
    const dt_st_tensor *x = a, *y = b;
    if (x->dtype != y->dtype)
        return x->dtype < y->dtype ? 1 : -1;
    return strcmp(x->name, y->name);
}

int dt_st_layout(dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta, char **header,
                 size_t *header_len, uint64_t *data_len, dt_err *err)
{
    sbuf b = {0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = &tensors[i];
        if (!t->name || !t->name[0] || !utf8_valid((const void *)t->name, strlen(t->name)))
            return dt_err_set(err, -EINVAL, "safetensors: tensor %d has an empty or non-UTF-8 "
                              "name", i);
        if (!strcmp(t->name, "__metadata__"))
            return dt_err_set(err, -EINVAL, "safetensors: \"__metadata__\" is reserved and "
                              "cannot name a tensor");
        if ((unsigned)t->dtype >= DT_ST_NUM_DTYPES)
            return dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": invalid dtype %d",
                              t->name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > DT_ST_MAX_DIMS)
            return dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": %d dimensions (0..%d "
                              "supported)", t->name, t->ndim, DT_ST_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": negative "
                                  "dimension %" PRId64, t->name, t->shape[d]);
    }
    for (int i = 0; i < n_meta; i++)
        if (!meta[i].key || !meta[i].value || !utf8_valid((const void *)meta[i].key,
                                                          strlen(meta[i].key)) ||
            !utf8_valid((const void *)meta[i].value, strlen(meta[i].value)))
            return dt_err_set(err, -EINVAL, "safetensors: metadata entry %d is NULL or not "
                              "UTF-8", i);
    if (n > 1)
        qsort(tensors, (size_t)n, sizeof *tensors, cmp_write_order);
    for (int i = 1; i < n; i++)
        if (!strcmp(tensors[i].name, tensors[i - 1].name))
            return dt_err_set(err, -EINVAL, "safetensors: two tensors are called \"%s\"",
                              tensors[i].name);

    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes;
        rc = tensor_bytes(tensors[i].dtype, tensors[i].ndim, tensors[i].shape, &bytes);
        if (rc || off + bytes < off)
            return dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": size %s", tensors[i].name,
                              rc == -EINVAL ? "is not a whole number of bytes" : "overflows");
        tensors[i].begin = off;
        tensors[i].end = off + bytes;
        off += bytes;
    }

    sb_put(&b, "        ", 8); /* room for N */
    sb_put(&b, "{", 1);
    bool first = true;
    if (meta) {
        sb_str(&b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i)
                sb_put(&b, ",", 1);
            sb_json_str(&b, meta[i].key);
            sb_put(&b, ":", 1);
            sb_json_str(&b, meta[i].value);
        }
        sb_put(&b, "}", 1);
        first = false;
    }
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = &tensors[i];
        if (!first)
            sb_put(&b, ",", 1);
        first = false;
        sb_json_str(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, dt_st_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d)
                sb_put(&b, ",", 1);
            sb_u64(&b, (uint64_t)t->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, t->begin);
        sb_put(&b, ",", 1);
        sb_u64(&b, t->end);
        sb_str(&b, "]}");
    }
    sb_put(&b, "}", 1);
    while (!b.oom && b.len % 8)
        sb_put(&b, " ", 1);
    if (b.oom) {
        free(b.p);
        return dt_err_set(err, -ENOMEM, "safetensors: out of memory building the header");
    }
    uint64_t hn = b.len - 8;
    for (int k = 0; k < 8; k++)
        b.p[k] = (char)((hn >> (8 * k)) & 0xFF);
    *header = b.p;
    *header_len = b.len;
    *data_len = off;
    return 0;
}

int dt_st_write(dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta,
                dt_st_write_fn write_fn, void *ctx, uint64_t *total, dt_err *err)
{
    char *header = NULL;
    size_t hlen = 0;
    uint64_t dlen = 0;
    int rc = dt_st_layout(tensors, n, meta, n_meta, &header, &hlen, &dlen, err);
    if (rc)
        return rc;
    rc = write_fn(ctx, header, hlen, err);
    free(header);
    if (rc)
        return rc;
    /* Runs of tensors that are adjacent in memory go out in one call. */
    for (int i = 0; i < n;) {
        const char *start = tensors[i].data;
        uint64_t len = tensors[i].end - tensors[i].begin;
        int j = i + 1;
        while (j < n && start && tensors[j].data == start + len) {
            len += tensors[j].end - tensors[j].begin;
            j++;
        }
        if (len) {
            if (!start)
                return dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\" has no data",
                                  tensors[i].name);
            rc = write_fn(ctx, start, (size_t)len, err);
            if (rc)
                return rc;
        }
        i = j;
    }
    if (total)
        *total = hlen + dlen;
    return 0;
}

static int fd_sink(void *ctx, const void *buf, size_t n, dt_err *err)
{
    int fd = *(int *)ctx;
    int rc = dt_write_all(fd, buf, n);
    return rc ? dt_err_errno(err, -rc, "write failed") : 0;
}

int dt_st_save(const char *path, dt_st_tensor *tensors, int n, const dt_st_kv *meta, int n_meta,
               dt_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot create %s", path);
    int rc = dt_st_write(tensors, n, meta, n_meta, fd_sink, &fd, NULL, err);
    if (close(fd) != 0 && !rc)
        rc = dt_err_errno(err, errno, "close");
    if (rc) {
        dt_err_prefix(err, "writing %s: ", path);
        unlink(path);
    }
    return rc;
}

/* ================================================================================ reader === */

typedef struct st_priv {
    char **strs;   /* every string the file owns */
    int nstrs, capstrs;
    void *data;    /* the file's bytes when dt_st_open loaded them, else NULL */
} st_priv;

/* The header parser. s is the header text (N bytes). */
typedef struct jp {
    const char *s;
    size_t n, i;
    dt_err *err;
    st_priv *priv;
} jp;

static int jp_fail(jp *p, const char *fmt, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, what);
    return dt_err_set(p->err, -EINVAL, "safetensors header, byte %zu: %s", p->i, msg);
}

static void jp_ws(jp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static bool jp_eat(jp *p, char c)
{
    jp_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return true;
    }
    return false;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int jp_hex4(jp *p, unsigned *out)
{
    if (p->i + 4 > p->n)
        return jp_fail(p, "%s", "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0)
            return jp_fail(p, "%s", "bad \\u escape");
        v = v * 16 + (unsigned)h;
    }
    p->i += 4;
    *out = v;
    return 0;
}

/* A string into a new NUL-terminated buffer owned by the file (*out). */
static int jp_string(jp *p, const char **out)
{
    jp_ws(p);
    if (p->i >= p->n || p->s[p->i] != '"')
        return jp_fail(p, "%s", "expected a string");
    p->i++;
    st_priv *pv = p->priv;
    if (pv->nstrs == pv->capstrs) {
        int cap = pv->capstrs ? pv->capstrs * 2 : 64;
        char **ns = realloc(pv->strs, (size_t)cap * sizeof *ns);
        if (!ns)
            return dt_err_set(p->err, -ENOMEM, "safetensors: out of memory");
        pv->strs = ns, pv->capstrs = cap;
    }
    /* The decoded string is never longer than its encoding. */
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] != '"')
        p->i += p->s[p->i] == '\\' ? 2 : 1;
    if (p->i >= p->n)
        return jp_fail(p, "%s", "unterminated string");
    size_t enc_len = p->i - start;
    char *o = malloc(enc_len + 1);
    if (!o)
        return dt_err_set(p->err, -ENOMEM, "safetensors: out of memory");
    pv->strs[pv->nstrs++] = o;
    size_t k = 0;
    p->i = start;
    while (p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i];
        if (c < 0x20)
            return jp_fail(p, "%s", "control character in a string");
        if (c != '\\') {
            o[k++] = (char)c;
            p->i++;
            continue;
        }
        p->i++;
        char e = p->s[p->i++];
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            unsigned cp;
            int rc = jp_hex4(p, &cp);
            if (rc)
                return rc;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                    return jp_fail(p, "%s", "unpaired surrogate in \\u escape");
                p->i += 2;
                if ((rc = jp_hex4(p, &lo)))
                    return rc;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return jp_fail(p, "%s", "unpaired surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return jp_fail(p, "%s", "unpaired surrogate in \\u escape");
            }
            if (cp == 0)
                return jp_fail(p, "%s", "\\u0000 in a string is not supported");
            /* Encoded as UTF-8: at most 4 bytes, never longer than the 6+ bytes of the escape. */
            if (cp < 0x80) {
                o[k++] = (char)cp;
            } else if (cp < 0x800) {
                o[k++] = (char)(0xC0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            p->i--;
            return jp_fail(p, "%s", "invalid escape in a string");
        }
    }
    o[k] = '\0';
    p->i++; /* closing quote */
    *out = o;
    return 0;
}

/* A non-negative integer without sign, fraction, exponent or leading zeros. */
static int jp_uint(jp *p, const char *what, uint64_t *out)
{
    jp_ws(p);
    size_t start = p->i;
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            p->i = start;
            return jp_fail(p, "%s does not fit in 64 bits", what);
        }
        v = v * 10 + d;
        p->i++;
    }
    size_t len = p->i - start;
    if (len == 0 || (len > 1 && p->s[start] == '0') ||
        (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))) {
        p->i = start;
        return jp_fail(p, "%s must be a non-negative integer", what);
    }
    *out = v;
    return 0;
}

/* "[" uint ("," uint)* "]" or "[]" into out (at most max), *count. */
static int jp_uint_array(jp *p, const char *what, uint64_t *out, int max, int *count)
{
    int n = 0;
    if (!jp_eat(p, '['))
        return jp_fail(p, "%s must be an array", what);
    if (jp_eat(p, ']')) {
        *count = 0;
        return 0;
    }
    do {
        uint64_t v = 0;
        if (n == max)
            return jp_fail(p, "%s has too many entries", what);
        int rc = jp_uint(p, what, &v);
        if (rc)
            return rc;
        out[n++] = v;
    } while (jp_eat(p, ','));
    if (!jp_eat(p, ']'))
        return jp_fail(p, "%s: expected ',' or ']'", what);
    *count = n;
    return 0;
}

static int jp_tensor(jp *p, dt_st_tensor *t)
{
    bool have_dtype = false, have_shape = false, have_offsets = false;
    if (!jp_eat(p, '{'))
        return jp_fail(p, "tensor \"%s\": expected an object", t->name);
    if (!jp_eat(p, '}')) {
        do {
            const char *key;
            int rc = jp_string(p, &key);
            if (rc)
                return rc;
            if (!jp_eat(p, ':'))
                return jp_fail(p, "%s", "expected ':'");
            if (!strcmp(key, "dtype")) {
                const char *name;
                if (have_dtype)
                    return jp_fail(p, "tensor \"%s\": \"dtype\" given twice", t->name);
                if ((rc = jp_string(p, &name)))
                    return rc;
                if (dt_st_dtype_parse(name, &t->dtype)) {
                    char msg[DT_ERR_MSG_MAX / 2];
                    snprintf(msg, sizeof msg, "tensor \"%s\": unknown dtype \"%.40s\"", t->name,
                             name);
                    return jp_fail(p, "%s", msg);
                }
                have_dtype = true;
            } else if (!strcmp(key, "shape")) {
                uint64_t dims[DT_ST_MAX_DIMS];
                if (have_shape)
                    return jp_fail(p, "tensor \"%s\": \"shape\" given twice", t->name);
                if ((rc = jp_uint_array(p, "shape", dims, DT_ST_MAX_DIMS, &t->ndim)))
                    return rc;
                for (int d = 0; d < t->ndim; d++) {
                    if (dims[d] > (uint64_t)INT64_MAX)
                        return jp_fail(p, "tensor \"%s\": dimension too large", t->name);
                    t->shape[d] = (int64_t)dims[d];
                }
                have_shape = true;
            } else if (!strcmp(key, "data_offsets")) {
                uint64_t off[2];
                int cnt;
                if (have_offsets)
                    return jp_fail(p, "tensor \"%s\": \"data_offsets\" given twice", t->name);
                if ((rc = jp_uint_array(p, "data_offsets", off, 2, &cnt)))
                    return rc;
                if (cnt != 2)
                    return jp_fail(p, "tensor \"%s\": data_offsets must be [BEGIN, END]",
                                   t->name);
                t->begin = off[0], t->end = off[1];
                have_offsets = true;
            } else {
                char msg[DT_ERR_MSG_MAX / 2];
                snprintf(msg, sizeof msg, "tensor \"%s\": unknown key \"%.40s\" (expected dtype, "
                         "shape, data_offsets)", t->name, key);
                return jp_fail(p, "%s", msg);
            }
        } while (jp_eat(p, ','));
        if (!jp_eat(p, '}'))
            return jp_fail(p, "tensor \"%s\": expected ',' or '}'", t->name);
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return jp_fail(p, "tensor \"%s\" lacks one of dtype, shape, data_offsets", t->name);
    return 0;
}

static int jp_metadata(jp *p, dt_st_file *f)
{
    int cap = 0;
    if (!jp_eat(p, '{'))
        return jp_fail(p, "%s", "__metadata__ must be an object of strings");
    f->has_meta = true;
    if (jp_eat(p, '}'))
        return 0;
    do {
        dt_st_kv kv;
        int rc = jp_string(p, &kv.key);
        if (rc)
            return rc;
        if (!jp_eat(p, ':'))
            return jp_fail(p, "%s", "expected ':'");
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] != '"') {
            char msg[DT_ERR_MSG_MAX / 2];
            snprintf(msg, sizeof msg, "__metadata__ value of \"%.60s\" must be a string", kv.key);
            return jp_fail(p, "%s", msg);
        }
        if ((rc = jp_string(p, &kv.value)))
            return rc;
        for (int i = 0; i < f->num_meta; i++)
            if (!strcmp(f->meta[i].key, kv.key))
                return jp_fail(p, "__metadata__ key \"%.60s\" appears twice", kv.key);
        if (f->num_meta == cap) {
            cap = cap ? cap * 2 : 8;
            dt_st_kv *nm = realloc(f->meta, (size_t)cap * sizeof *nm);
            if (!nm)
                return dt_err_set(p->err, -ENOMEM, "safetensors: out of memory");
            f->meta = nm;
        }
        f->meta[f->num_meta++] = kv;
    } while (jp_eat(p, ','));
    if (!jp_eat(p, '}'))
        return jp_fail(p, "%s", "__metadata__: expected ',' or '}'");
    return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
    const dt_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void dt_st_free(dt_st_file *f)
{
    if (!f)
        return;
    st_priv *pv = f->priv;
    if (pv) {
        for (int i = 0; i < pv->nstrs; i++)
            free(pv->strs[i]);
        free(pv->strs);
        free(pv->data);
        free(pv);
    }
    free(f->tensors);
    free(f->meta);
    free(f);
}

int dt_st_parse(const void *buf, size_t avail, uint64_t file_size, dt_st_file **out,
                dt_err *err)
{
    const unsigned char *b = buf;
    dt_st_file *f = NULL;
    const char **names = NULL;
    int rc = 0, cap = 0;
    if (file_size < 8 || avail < 8)
        return dt_err_set(err, -EINVAL, "safetensors: file of %" PRIu64 " bytes is shorter than "
                          "the 8-byte header length", file_size);
    uint64_t hn = 0;
    for (int k = 7; k >= 0; k--)
        hn = (hn << 8) | b[k];
    if (hn > DT_ST_MAX_HEADER)
        return dt_err_set(err, -EINVAL, "safetensors: header length %" PRIu64 " exceeds the "
                          "%llu-byte limit (not a safetensors file?)", hn, DT_ST_MAX_HEADER);
    if (8 + hn > file_size)
        return dt_err_set(err, -EINVAL, "safetensors: header length %" PRIu64 " runs past the "
                          "end of the %" PRIu64 "-byte file (truncated?)", hn, file_size);
    if (8 + hn > avail)
        return dt_err_set(err, -EINVAL, "safetensors: only %zu of the %" PRIu64 " header bytes "
                          "given", avail, 8 + hn);
    const char *h = (const char *)b + 8;
    if (!utf8_valid((const unsigned char *)h, (size_t)hn))
        return dt_err_set(err, -EINVAL, "safetensors: header is not valid UTF-8");
    if (hn == 0 || h[0] != '{')
        return dt_err_set(err, -EINVAL, "safetensors: header does not start with '{'");

    f = calloc(1, sizeof *f);
    st_priv *pv = calloc(1, sizeof *pv);
    if (!f || !pv) {
        free(f);
        free(pv);
        return dt_err_set(err, -ENOMEM, "safetensors: out of memory");
    }
    f->priv = pv;
    f->header_len = hn;
    f->data_offset = 8 + hn;
    f->data_len = file_size - 8 - hn;

    jp p = {.s = h, .n = (size_t)hn, .i = 0, .err = err, .priv = pv};
    jp_eat(&p, '{');
    if (!jp_eat(&p, '}')) {
        do {
            const char *key;
            if ((rc = jp_string(&p, &key)))
                goto fail;
            if (!jp_eat(&p, ':')) {
                rc = jp_fail(&p, "%s", "expected ':'");
                goto fail;
            }
            if (!strcmp(key, "__metadata__")) {
                if (f->has_meta) {
                    rc = jp_fail(&p, "%s", "__metadata__ appears twice");
                    goto fail;
                }
                if ((rc = jp_metadata(&p, f)))
                    goto fail;
                continue;
            }
            if (f->num_tensors == cap) {
                cap = cap ? cap * 2 : 64;
                dt_st_tensor *nt = realloc(f->tensors, (size_t)cap * sizeof *nt);
                if (!nt) {
                    rc = dt_err_set(err, -ENOMEM, "safetensors: out of memory");
                    goto fail;
                }
                f->tensors = nt;
            }
            dt_st_tensor *t = &f->tensors[f->num_tensors++];
            memset(t, 0, sizeof *t);
            t->name = key;
            if (!key[0]) {
                rc = jp_fail(&p, "%s", "empty tensor name");
                goto fail;
            }
            if ((rc = jp_tensor(&p, t)))
                goto fail;
        } while (jp_eat(&p, ','));
        if (!jp_eat(&p, '}')) {
            rc = jp_fail(&p, "%s", "expected ',' or '}' after a tensor");
            goto fail;
        }
    }
    jp_ws(&p);
    if (p.i != p.n) {
        rc = jp_fail(&p, "%s", "unexpected bytes after the header object (only space padding "
                     "may follow)");
        goto fail;
    }

    /* Duplicate tensor names. */
    if (f->num_tensors > 1) {
        names = malloc((size_t)f->num_tensors * sizeof *names);
        if (!names) {
            rc = dt_err_set(err, -ENOMEM, "safetensors: out of memory");
            goto fail;
        }
        for (int i = 0; i < f->num_tensors; i++)
            names[i] = f->tensors[i].name;
        qsort(names, (size_t)f->num_tensors, sizeof *names, cmp_names);
        for (int i = 1; i < f->num_tensors; i++)
            if (!strcmp(names[i], names[i - 1])) {
                rc = dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\" appears twice in the "
                                "header", names[i]);
                goto fail;
            }
    }

    /* Offsets: sizes match dtype x shape, packed from 0 without holes or overlaps, and the data
     * section is exactly as long as the tensors. */
    if (f->num_tensors > 1)
        qsort(f->tensors, (size_t)f->num_tensors, sizeof *f->tensors, cmp_offsets);
    uint64_t pos = 0;
    for (int i = 0; i < f->num_tensors; i++) {
        dt_st_tensor *t = &f->tensors[i];
        char shp[160];
        uint64_t bytes;
        shape_str(shp, sizeof shp, t->ndim, t->shape);
        if (t->end < t->begin) {
            rc = dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": data_offsets [%" PRIu64
                            ", %" PRIu64 "] end before they begin", t->name, t->begin, t->end);
            goto fail;
        }
        int brc = tensor_bytes(t->dtype, t->ndim, t->shape, &bytes);
        if (brc) {
            rc = dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": %s %s %s", t->name,
                            dt_st_dtype_name(t->dtype), shp,
                            brc == -ERANGE ? "overflows 64 bits" : "is not a whole number of bytes");
            goto fail;
        }
        if (t->end - t->begin != bytes) {
            rc = dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\": data_offsets [%" PRIu64 ", %"
                            PRIu64 "] span %" PRIu64 " bytes but %s %s needs %" PRIu64, t->name,
                            t->begin, t->end, t->end - t->begin, dt_st_dtype_name(t->dtype), shp,
                            bytes);
            goto fail;
        }
        if (t->begin != pos) {
            if (t->begin < pos)
                rc = dt_err_set(err, -EINVAL, "safetensors: tensor \"%s\" at [%" PRIu64 ", %" PRIu64
                                ") overlaps the tensor before it (which ends at %" PRIu64 ")",
                                t->name, t->begin, t->end, pos);
            else
                rc = dt_err_set(err, -EINVAL, "safetensors: hole in the data section: bytes [%"
                                PRIu64 ", %" PRIu64 ") belong to no tensor (next: \"%s\")", pos,
                                t->begin, t->name);
            goto fail;
        }
        pos = t->end;
    }
    if (pos != f->data_len) {
        if (pos > f->data_len)
            rc = dt_err_set(err, -EINVAL, "safetensors: the tensors need %" PRIu64 " data bytes "
                            "but the file has %" PRIu64 " (truncated?)", pos, f->data_len);
        else
            rc = dt_err_set(err, -EINVAL, "safetensors: %" PRIu64 " bytes after the last tensor "
                            "(data section of %" PRIu64 " bytes, tensors end at %" PRIu64 ")",
                            f->data_len - pos, f->data_len, pos);
        goto fail;
    }
    if (avail >= file_size)
        for (int i = 0; i < f->num_tensors; i++)
            f->tensors[i].data = b + f->data_offset + f->tensors[i].begin;
    free(names);
    *out = f;
    return 0;
fail:
    free(names);
    dt_st_free(f);
    return rc;
}

int dt_st_open(const char *path, bool load_data, dt_st_file **out, dt_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char *buf = NULL;
    dt_st_file *f = NULL;
    int rc = 0;
    struct stat st;
    if (fd < 0)
        return dt_err_errno(err, errno, "cannot open %s", path);
    if (fstat(fd, &st) != 0) {
        rc = dt_err_errno(err, errno, "cannot stat %s", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    size_t want = 8;
    if (size >= 8) {
        unsigned char lenb[8];
        if ((rc = dt_read_all(fd, lenb, 8))) {
            rc = dt_err_errno(err, -rc, "cannot read %s", path);
            goto fail;
        }
        uint64_t hn = 0;
        for (int k = 7; k >= 0; k--)
            hn = (hn << 8) | lenb[k];
        want = load_data ? (size_t)size : (size_t)DT_MIN(8 + DT_MIN(hn, DT_ST_MAX_HEADER), size);
        if (load_data && size > SIZE_MAX / 2) {
            rc = dt_err_set(err, -EFBIG, "%s: file too large to load", path);
            goto fail;
        }
        buf = malloc(want ? want : 1);
        if (!buf) {
            rc = dt_err_set(err, -ENOMEM, "%s: out of memory for %zu bytes", path, want);
            goto fail;
        }
        memcpy(buf, lenb, 8);
        if (want > 8 && (rc = dt_read_all(fd, buf + 8, want - 8))) {
            rc = dt_err_errno(err, -rc, "cannot read %s", path);
            goto fail;
        }
    } else {
        want = 0;
    }
    if ((rc = dt_st_parse(buf ? buf : (const void *)"", want, size, &f, err))) {
        dt_err_prefix(err, "%s: ", path);
        goto fail;
    }
    if (load_data)
        ((st_priv *)f->priv)->data = buf;
    else
        free(buf);
    close(fd);
    *out = f;
    return 0;
fail:
    free(buf);
    close(fd);
    return rc;
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name)
{
    for (int i = 0; f && i < f->num_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

const char *dt_st_meta_get(const dt_st_file *f, const char *key)
{
    for (int i = 0; f && i < f->num_meta; i++)
        if (!strcmp(f->meta[i].key, key))
            return f->meta[i].value;
    return NULL;
}
