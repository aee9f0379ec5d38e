/* protocol.c - encoding and the pure frame parser of the store protocol (see protocol.h).
 *
 * Nothing here does I/O or keeps state; the parser never reads outside [buf, buf + len) and
 * never trusts a count before it has checked it against the bytes actually present. */
#include "rendezvous/protocol.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t dt_proto_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

void dt_proto_wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)dt_proto_rd32(p) << 32 | dt_proto_rd32(p + 4);
}

static void wr64(uint8_t *p, uint64_t v)
{
    dt_proto_wr32(p, (uint32_t)(v >> 32));
    dt_proto_wr32(p + 4, (uint32_t)v);
}

size_t dt_proto_max_frame(size_t max_key, size_t max_value, size_t max_items)
{
    /* Saturating arithmetic: the settings are user-provided. */
    const uint64_t cap = UINT32_MAX;
    uint64_t per = (uint64_t)max_key + 8;
    if (max_items && per > cap / max_items)
        return (size_t)cap;
    uint64_t f = (uint64_t)max_items * per;
    if (max_value > cap || f + max_value + 65536 > cap)
        return (size_t)cap;
    return (size_t)(f + max_value + 65536);
}

dt_proto_limits dt_proto_reply_limits(void)
{
    dt_proto_limits l = {.max_frame = UINT32_MAX, .max_key = UINT32_MAX,
                         .max_value = UINT32_MAX, .max_items = UINT32_MAX};
    return l;
}

/* Item-count rules of each request op: keys in [kmin, kmax] (kmax -1 = up to max_items) and
 * values either a fixed count or (vals_eq_keys) one per key. */
static const struct {
    const char *name;
    int kmin, kmax, nvals, vals_eq_keys;
} ops[DT_OP_MAX_] = {
    [DT_OP_AUTH] = {"AUTH", 0, 0, 1, 0},          [DT_OP_SET] = {"SET", 1, 1, 1, 0},
    [DT_OP_GET] = {"GET", 1, 1, 0, 0},            [DT_OP_ADD] = {"ADD", 1, 1, 0, 0},
    [DT_OP_CAS] = {"CAS", 1, 1, 2, 0},            [DT_OP_CHECK] = {"CHECK", 0, -1, 0, 0},
    [DT_OP_WAIT] = {"WAIT", 0, -1, 0, 0},         [DT_OP_DELETE] = {"DELETE", 1, 1, 0, 0},
    [DT_OP_NUM_KEYS] = {"NUM_KEYS", 0, 0, 0, 0},  [DT_OP_APPEND] = {"APPEND", 1, 1, 1, 0},
    [DT_OP_MULTI_GET] = {"MULTI_GET", 0, -1, 0, 0},
    [DT_OP_MULTI_SET] = {"MULTI_SET", 0, -1, 0, 1},
    [DT_OP_PING] = {"PING", 0, 0, 0, 0},
};

ssize_t dt_proto_parse(const uint8_t *buf, size_t len, const dt_proto_limits *lim, int is_reply,
                       dt_proto_msg *m, size_t *need, const char **why)
{
    static const char *dummy;
    if (!why)
        why = &dummy;
    if (need)
        *need = 0;
    *why = NULL;
    if (len < DT_PROTO_LEN_SIZE)
        return 0;
    uint32_t flen = dt_proto_rd32(buf);
    if (flen < DT_PROTO_HDR_SIZE) {
        *why = "frame length is smaller than the frame header";
        return -EPROTO;
    }
    if (flen > lim->max_frame) {
        *why = "frame length exceeds the frame size limit";
        return -E2BIG;
    }
    size_t total = (size_t)DT_PROTO_LEN_SIZE + flen;
    if (len < total) {
        if (need)
            *need = total;
        return 0;
    }

    const uint8_t *p = buf + DT_PROTO_LEN_SIZE;
    memset(m, 0, sizeof *m);
    m->code = p[0];
    m->id = dt_proto_rd32(p + 1);
    m->num = (int64_t)rd64(p + 5);
    m->nkeys = dt_proto_rd32(p + 13);
    m->nvals = dt_proto_rd32(p + 17);
    m->end = buf + total;
    m->bad = DT_PROTO_OK;
    p += DT_PROTO_HDR_SIZE;
    m->keys = p;
    m->vals = p;

    /* Structure first: the counts must fit in the bytes present (each item is >= 4 bytes). */
    uint64_t nitems = (uint64_t)m->nkeys + m->nvals;
    size_t body = flen - DT_PROTO_HDR_SIZE;
    if (nitems > body / DT_PROTO_ITEM_OVERHEAD) {
        m->bad = DT_PROTO_EPROTO;
        m->why = "item counts exceed what the frame can hold";
        return (ssize_t)total;
    }
    /* Request rules: a known op with the item counts it takes. */
    if (!is_reply) {
        if (m->code == 0 || m->code >= DT_OP_MAX_) {
            m->bad = DT_PROTO_EINVAL;
            m->why = "unknown op code";
            return (ssize_t)total;
        }
        int kmax = ops[m->code].kmax;
        if (m->nkeys < (uint32_t)ops[m->code].kmin || (kmax >= 0 && m->nkeys > (uint32_t)kmax)) {
            m->bad = DT_PROTO_EINVAL;
            m->why = "wrong number of keys for this op";
            return (ssize_t)total;
        }
        uint32_t want_vals = ops[m->code].vals_eq_keys ? m->nkeys : (uint32_t)ops[m->code].nvals;
        if (m->nvals != want_vals) {
            m->bad = DT_PROTO_EINVAL;
            m->why = "wrong number of values for this op";
            return (ssize_t)total;
        }
        if (m->nkeys > lim->max_items) {
            m->bad = DT_PROTO_E2BIG;
            m->why = "too many keys in one request (max_keys_per_request)";
            return (ssize_t)total;
        }
    }
    /* Walk the items: each must lie inside the frame; check keys and values against limits. */
    const uint8_t *end = m->end;
    uint8_t limit_bad = DT_PROTO_OK;
    const char *limit_why = NULL;
    for (uint64_t i = 0; i < nitems; i++) {
        if (i == m->nkeys)
            m->vals = p;
        if ((size_t)(end - p) < DT_PROTO_ITEM_OVERHEAD) {
            m->bad = DT_PROTO_EPROTO;
            m->why = "an item overruns the frame";
            return (ssize_t)total;
        }
        uint32_t n = dt_proto_rd32(p);
        p += DT_PROTO_ITEM_OVERHEAD;
        if ((size_t)(end - p) < n) {
            m->bad = DT_PROTO_EPROTO;
            m->why = "an item overruns the frame";
            return (ssize_t)total;
        }
        if (!is_reply && limit_bad == DT_PROTO_OK) {
            if (i < m->nkeys) {
                if (n > lim->max_key) {
                    limit_bad = DT_PROTO_E2BIG;
                    limit_why = "key longer than max_key_size";
                } else if (memchr(p, 0, n)) {
                    limit_bad = DT_PROTO_EINVAL;
                    limit_why = "key contains a NUL byte";
                }
            } else if (n > lim->max_value) {
                limit_bad = DT_PROTO_E2BIG;
                limit_why = "value larger than max_value_size";
            }
        }
        p += n;
    }
    if (nitems == m->nkeys)
        m->vals = p;
    if (p != end) {
        m->bad = DT_PROTO_EPROTO;
        m->why = "trailing bytes after the last item";
        return (ssize_t)total;
    }
    m->bad = limit_bad;
    m->why = limit_why;
    return (ssize_t)total;
}

int dt_proto_next(const uint8_t **cursor, const uint8_t *end, dt_proto_item *it)
{
    const uint8_t *p = *cursor;
    if (p > end || (size_t)(end - p) < DT_PROTO_ITEM_OVERHEAD)
        return -1;
    uint32_t n = dt_proto_rd32(p);
    p += DT_PROTO_ITEM_OVERHEAD;
    if ((size_t)(end - p) < n)
        return -1;
    it->p = p;
    it->len = n;
    *cursor = p + n;
    return 0;
}

static int check_frames(const uint8_t *buf, size_t len, const dt_proto_limits *lim, int reply)
{
    int frames = 0;
    size_t off = 0;
    while (off < len) {
        dt_proto_msg m;
        size_t need = 0;
        const char *why = NULL;
        ssize_t r = dt_proto_parse(buf + off, len - off, lim, reply, &m, &need, &why);
        if (r < 0)
            return why ? frames : -1; /* unrecoverable, with a reason: the stream ends here */
        if (r == 0)
            return need == 0 || need > len - off ? frames : -1;
        if ((size_t)r > len - off || m.end != buf + off + (size_t)r)
            return -1;
        frames++;
        off += (size_t)r;
        if (m.bad != DT_PROTO_OK) {
            if (!m.why)
                return -1;
            continue;
        }
        if (!reply && (m.code == 0 || m.code >= DT_OP_MAX_ || m.nkeys > lim->max_items))
            return -1;
        const uint8_t *cur = m.keys;
        dt_proto_item it;
        for (uint32_t i = 0; i < m.nkeys; i++) {
            if (dt_proto_next(&cur, m.end, &it) < 0 || it.p + it.len > m.end)
                return -1;
            if (!reply && (it.len > lim->max_key || memchr(it.p, 0, it.len)))
                return -1;
        }
        if (cur != m.vals)
            return -1;
        for (uint32_t i = 0; i < m.nvals; i++) {
            if (dt_proto_next(&cur, m.end, &it) < 0 || it.p + it.len > m.end)
                return -1;
            if (!reply && it.len > lim->max_value)
                return -1;
        }
        if (cur != m.end)
            return -1;
    }
    return frames;
}

int dt_proto_check_stream(const uint8_t *buf, size_t len, const dt_proto_limits *lim)
{
    int a = check_frames(buf, len, lim, 0);
    dt_proto_limits rl = dt_proto_reply_limits();
    int b = check_frames(buf, len, &rl, 1);
    if (a < 0 || b < 0)
        return -1;
    if (len >= DT_PROTO_HELLO_SIZE) {
        uint16_t v, f;
        dt_proto_hello_decode(buf, &v, &f);
    }
    return a;
}

void dt_proto_hello_encode(uint8_t out[DT_PROTO_HELLO_SIZE], uint16_t version, uint16_t flags)
{
    dt_proto_wr32(out, DT_PROTO_MAGIC);
    out[4] = (uint8_t)(version >> 8);
    out[5] = (uint8_t)version;
    out[6] = (uint8_t)(flags >> 8);
    out[7] = (uint8_t)flags;
}

int dt_proto_hello_decode(const uint8_t in[DT_PROTO_HELLO_SIZE], uint16_t *version,
                          uint16_t *flags)
{
    if (dt_proto_rd32(in) != DT_PROTO_MAGIC)
        return -EPROTO;
    *version = (uint16_t)(in[4] << 8 | in[5]);
    *flags = (uint16_t)(in[6] << 8 | in[7]);
    return 0;
}

/* ---- encoding ---- */

int dt_proto_reserve(dt_proto_buf *b, size_t n)
{
    if (b->oom)
        return -ENOMEM;
    if (b->cap - b->len >= n)
        return 0;
    size_t want = b->len + n;
    if (want < b->len) {
        b->oom = 1;
        return -ENOMEM;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < want)
        cap = cap > SIZE_MAX / 2 ? want : cap * 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
        b->oom = 1;
        return -ENOMEM;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

void dt_proto_buf_free(dt_proto_buf *b)
{
    if (!b)
        return;
    free(b->data);
    memset(b, 0, sizeof *b);
}

size_t dt_proto_begin(dt_proto_buf *b, uint8_t code, uint32_t id, int64_t num, uint32_t nkeys,
                      uint32_t nvals)
{
    size_t start = b->len;
    if (dt_proto_reserve(b, DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE) < 0)
        return start;
    uint8_t *p = b->data + b->len;
    dt_proto_wr32(p, 0);
    p[4] = code;
    dt_proto_wr32(p + 5, id);
    wr64(p + 9, (uint64_t)num);
    dt_proto_wr32(p + 17, nkeys);
    dt_proto_wr32(p + 21, nvals);
    b->len += DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE;
    return start;
}

void dt_proto_put_item2(dt_proto_buf *b, const void *p1, size_t n1, const void *p2, size_t n2)
{
    size_t n = n1 + n2;
    if (n > UINT32_MAX) {
        b->oom = 1;
        return;
    }
    if (dt_proto_reserve(b, DT_PROTO_ITEM_OVERHEAD + n) < 0)
        return;
    uint8_t *p = b->data + b->len;
    dt_proto_wr32(p, (uint32_t)n);
    if (n1)
        memcpy(p + 4, p1, n1);
    if (n2)
        memcpy(p + 4 + n1, p2, n2);
    b->len += DT_PROTO_ITEM_OVERHEAD + n;
}

void dt_proto_put_item(dt_proto_buf *b, const void *p, size_t n)
{
    dt_proto_put_item2(b, p, n, NULL, 0);
}

void dt_proto_end(dt_proto_buf *b, size_t start)
{
    if (b->oom)
        return;
    size_t flen = b->len - start - DT_PROTO_LEN_SIZE;
    if (flen > UINT32_MAX) {
        b->oom = 1;
        return;
    }
    dt_proto_wr32(b->data + start, (uint32_t)flen);
}

void dt_proto_put_error(dt_proto_buf *b, uint32_t id, uint8_t status, const char *msg)
{
    size_t start = dt_proto_begin(b, status, id, 0, 0, 1);
    dt_proto_put_item(b, msg, strlen(msg));
    dt_proto_end(b, start);
}

/* ---- names and codes ---- */

const char *dt_proto_op_name(int op)
{
    if (op > 0 && op < DT_OP_MAX_ && ops[op].name)
        return ops[op].name;
    return "UNKNOWN";
}

static const struct {
    const char *name;
    int err;
} statuses[DT_PROTO_STATUS_MAX_] = {
    [DT_PROTO_OK] = {"OK", 0},
    [DT_PROTO_ETIMEDOUT] = {"ETIMEDOUT", ETIMEDOUT},
    [DT_PROTO_ENOENT] = {"ENOENT", ENOENT},
    [DT_PROTO_E2BIG] = {"E2BIG", E2BIG},
    [DT_PROTO_EACCES] = {"EACCES", EACCES},
    [DT_PROTO_EINVAL] = {"EINVAL", EINVAL},
    [DT_PROTO_EPROTO] = {"EPROTO", EPROTO},
    [DT_PROTO_ENOMEM] = {"ENOMEM", ENOMEM},
};

const char *dt_proto_status_name(int status)
{
    if (status >= 0 && status < DT_PROTO_STATUS_MAX_)
        return statuses[status].name;
    return "UNKNOWN";
}

int dt_proto_status_to_errno(int status)
{
    if (status >= 0 && status < DT_PROTO_STATUS_MAX_)
        return -statuses[status].err;
    return -EPROTO;
}

uint8_t dt_proto_status_from_errno(int negerr)
{
    for (int i = 0; i < DT_PROTO_STATUS_MAX_; i++)
        if (-statuses[i].err == negerr)
            return (uint8_t)i;
    return DT_PROTO_EINVAL;
}
