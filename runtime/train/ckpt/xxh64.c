/* xxh64.c - XXH64 (the xxHash specification, version 0.1.1), portable C, little-endian reads.
 * Checked against the reference vectors in tests/test_ckpt.c. */
#include "runtime/train/ckpt/xxh64.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Reads are little-endian by the specification; memcpy keeps them alignment-safe. */
static inline uint64_t read64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t read32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t round1(uint64_t acc, uint64_t input)
{
    acc += input * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static inline uint64_t merge(uint64_t acc, uint64_t val)
{
    acc ^= round1(0, val);
    return acc * P1 + P4;
}

void dt_xxh64_init(dt_xxh64_state *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->seed = seed;
    s->v[0] = seed + P1 + P2;
    s->v[1] = seed + P2;
    s->v[2] = seed;
    s->v[3] = seed - P1;
}

/* Consumes whole 32-byte stripes of p[0..n) into the lanes; returns the bytes consumed. */
static size_t stripes(uint64_t v[4], const uint8_t *p, size_t n)
{
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a = round1(a, read64(p + i));
        b = round1(b, read64(p + i + 8));
        c = round1(c, read64(p + i + 16));
        d = round1(d, read64(p + i + 24));
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
    return i;
}

void dt_xxh64_update(dt_xxh64_state *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    if (n == 0)
        return;
    s->total += n;
    if (s->buf_len) {
        size_t take = 32 - s->buf_len;
        if (take > n)
            take = n;
        memcpy(s->buf + s->buf_len, p, take);
        s->buf_len += (uint32_t)take;
        p += take, n -= take;
        if (s->buf_len < 32)
            return;
        stripes(s->v, s->buf, 32);
        s->buf_len = 0;
    }
    size_t done = stripes(s->v, p, n);
    memcpy(s->buf, p + done, n - done);
    s->buf_len = (uint32_t)(n - done);
}

uint64_t dt_xxh64_digest(const dt_xxh64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        h = rotl(s->v[0], 1) + rotl(s->v[1], 7) + rotl(s->v[2], 12) + rotl(s->v[3], 18);
        for (int i = 0; i < 4; i++)
            h = merge(h, s->v[i]);
    } else {
        h = s->seed + P5;
    }
    h += s->total;
    const uint8_t *p = s->buf;
    size_t n = s->buf_len;
    for (; n >= 8; p += 8, n -= 8) {
        h ^= round1(0, read64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (n >= 4) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4, n -= 4;
    }
    for (; n > 0; p++, n--) {
        h ^= (*p) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t dt_xxh64(const void *data, size_t n, uint64_t seed)
{
    dt_xxh64_state s;
    dt_xxh64_init(&s, seed);
    dt_xxh64_update(&s, data, n);
    return dt_xxh64_digest(&s);
}
