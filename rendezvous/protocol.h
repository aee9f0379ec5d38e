/* protocol.h - the dtrain store wire protocol: handshake, frames, op codes, limits.
 *
 * This header is the specification. Both the server (store_server.c) and the client
 * (store.c) encode and decode through the functions below, and the frame parser is a
 * pure function over a byte buffer (no I/O, no allocation, no global state) so that it can be
 * fuzzed (tests/fuzz/) and unit-tested byte by byte.
 *
 * Byte order: every integer is big-endian (network order).
 *
 * 1. Handshake (fixed 8 bytes, before any frame, sent by BOTH sides without waiting):
 *
 *        u32 magic    0x44545354 ("DTST")
 *        u16 version  DT_PROTO_VERSION
 *        u16 flags    client: 0.  server: DT_PROTO_HELLO_AUTH (a token is required),
 *                     DT_PROTO_HELLO_FULL (connection limit reached; the server closes next)
 *
 *    The server sends its hello as soon as it accepts a connection; the client sends its own
 *    right after connecting (it may pipeline an AUTH frame behind it). A side that reads a
 *    wrong magic or a different version reports it ("peer speaks store protocol version 2, this
 *    side speaks 1") and closes: a mismatch is a clear error on both sides, never a misparse.
 *    When the server requires a token, the first frame must be AUTH; anything else is refused
 *    with DT_PROTO_EACCES and the connection is closed.
 *
 * 2. Frames (after the handshake; requests client->server, replies server->client):
 *
 *        u32 len      bytes that follow this field: DT_PROTO_HDR_SIZE + items
 *        u8  code     request: op (enum dt_proto_op); reply: status (enum dt_proto_status)
 *        u32 id       request id chosen by the client; the reply carries the same id
 *        i64 num      integer argument or result (see the op table)
 *        u32 nkeys    number of key items
 *        u32 nvals    number of value items
 *        items        nkeys keys then nvals values, each: u32 n, n bytes
 *
 *    Every request and every reply has this one shape. A reply with a status other than OK has
 *    nkeys = 0, nvals = 1, and that value is a human-readable message.
 *
 *    Requests are processed in order per connection, one at a time: a request that waits
 *    (GET, WAIT, MULTI_GET) holds back the requests pipelined behind it on that connection.
 *
 * 3. Ops                  keys   vals   num in              reply num / reply vals
 *        AUTH             0      1      -                   - / -            (val: token)
 *        SET              1      1      -                   - / -
 *        GET              1      0      timeout ms          - / value
 *        ADD              1      0      delta               new value / -
 *        CAS              1      2      -                   1 if swapped / current value
 *                                                           (vals: expected, desired)
 *        CHECK            0..K   0      -                   1 if all exist / -
 *        WAIT             0..K   0      timeout ms          - / -
 *        DELETE           1      0      -                   1 if it existed / -
 *        NUM_KEYS         0      0      -                   number of keys / -
 *        APPEND           1      1      -                   - / -
 *        MULTI_GET        0..K   0      timeout ms          - / one value per key
 *        MULTI_SET        0..K   =keys  -                   - / -
 *        PING             0      0      -                   server monotonic us / -
 *
 *    Timeouts (num of GET, WAIT, MULTI_GET): > 0 wait up to that many ms, then
 *    DT_PROTO_ETIMEDOUT; 0 do not wait (GET/MULTI_GET: DT_PROTO_ENOENT, WAIT:
 *    DT_PROTO_ETIMEDOUT when a key is missing); < 0 wait without limit. Waiters are woken by
 *    SET, ADD, APPEND, CAS (when it swaps) and MULTI_SET. ADD stores the value as decimal text
 *    and fails with DT_PROTO_EINVAL when the existing value is not an int64 or would overflow.
 *    CAS (torch's TCPStore compareSet): when the key is absent and expected is empty, or the
 *    value equals expected, the value becomes desired, num = 1 and the reply value is desired.
 *    Otherwise nothing changes, num = 0, and the reply value is the current value, or, when the
 *    key is absent (expected then non-empty), expected itself (as torch answers).
 *
 * 4. Limits (server settings; dt_store_server_opts): key size, value size, keys per request,
 *    total stored bytes, connections, buffered reply bytes. A frame whose len exceeds
 *    dt_proto_max_frame() is answered with DT_PROTO_E2BIG and the connection is closed (the
 *    stream cannot be resynchronised); a well-framed request that breaks any other limit, or
 *    is malformed inside its frame, gets an error reply and the connection carries on. Keys
 *    are NUL-free byte strings of 0..max_key_size bytes. A reply that would be larger than
 *    max_pending_output (the reply bytes the server buffers per client; at least
 *    max_value_size + 64 KiB) is answered with DT_PROTO_E2BIG instead. A client may pipeline
 *    any number of requests: while more than max_pending_output of replies wait for it, the
 *    server reads no more of its requests (flow control, not an error). Large request frames
 *    (over 64 KiB) in flight from all clients together share max_input_buffered: a client
 *    whose frame does not fit what is left is not read until others complete (flow control
 *    again); a frame larger than the whole budget is answered with DT_PROTO_E2BIG and the
 *    connection is closed.
 */
#ifndef DT_PROTOCOL_H
#define DT_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DT_PROTO_MAGIC 0x44545354u /* "DTST" */
#define DT_PROTO_VERSION 1
#define DT_PROTO_HELLO_SIZE 8

#define DT_PROTO_HELLO_AUTH 0x1 /* server: the first frame must be AUTH */
#define DT_PROTO_HELLO_FULL 0x2 /* server: connection limit reached, closing */

#define DT_PROTO_LEN_SIZE 4  /* the u32 len prefix */
#define DT_PROTO_HDR_SIZE 21 /* code + id + num + nkeys + nvals */
#define DT_PROTO_ITEM_OVERHEAD 4

enum dt_proto_op {
    DT_OP_AUTH = 1,
    DT_OP_SET = 2,
    DT_OP_GET = 3,
    DT_OP_ADD = 4,
    DT_OP_CAS = 5,
    DT_OP_CHECK = 6,
    DT_OP_WAIT = 7,
    DT_OP_DELETE = 8,
    DT_OP_NUM_KEYS = 9,
    DT_OP_APPEND = 10,
    DT_OP_MULTI_GET = 11,
    DT_OP_MULTI_SET = 12,
    DT_OP_PING = 13,
    DT_OP_MAX_ = 14 /* one past the last op */
};

enum dt_proto_status {
    DT_PROTO_OK = 0,
    DT_PROTO_ETIMEDOUT = 1, /* a wait ran out */
    DT_PROTO_ENOENT = 2,    /* key absent where the op does not wait */
    DT_PROTO_E2BIG = 3,     /* a server limit */
    DT_PROTO_EACCES = 4,    /* token missing or wrong */
    DT_PROTO_EINVAL = 5,    /* malformed request or bad argument */
    DT_PROTO_EPROTO = 6,    /* protocol violation */
    DT_PROTO_ENOMEM = 7,    /* the server ran out of memory */
    DT_PROTO_STATUS_MAX_ = 8
};

/* Limits the parser enforces. For requests the server passes its settings; for replies the
 * client passes dt_proto_reply_limits() (only the frame size and item count matter). */
typedef struct dt_proto_limits {
    size_t max_frame;    /* largest len accepted (see dt_proto_max_frame) */
    size_t max_key;      /* bytes per key */
    size_t max_value;    /* bytes per value (AUTH's token and CAS's operands included) */
    size_t max_items;    /* keys per request */
} dt_proto_limits;

/* The frame size limit the server derives from its settings:
 * max_value + max_items * (max_key + 8) + 64 KiB, capped at UINT32_MAX. */
size_t dt_proto_max_frame(size_t max_key, size_t max_value, size_t max_items);

/* Limits for parsing replies on the client: anything that fits the format. */
dt_proto_limits dt_proto_reply_limits(void);

/* One item (key or value) inside a parsed frame; p points into the parsed buffer. */
typedef struct dt_proto_item {
    const uint8_t *p;
    uint32_t len;
} dt_proto_item;

/* A parsed frame. Pointers point into the buffer given to dt_proto_parse and are valid as
 * long as it is. */
typedef struct dt_proto_msg {
    uint8_t code;            /* op (request) or status (reply) */
    uint32_t id;
    int64_t num;
    uint32_t nkeys, nvals;
    const uint8_t *keys;     /* first key item (its u32 length prefix) */
    const uint8_t *vals;     /* first value item (its u32 length prefix) */
    const uint8_t *end;      /* end of the frame */
    /* Set when the frame is well-delimited but its content is invalid: the status to answer
     * with (DT_PROTO_OK when the content is valid) and why (a static string). */
    uint8_t bad;
    const char *why;
} dt_proto_msg;

/* Parses one frame at the start of buf[0..len).
 * Returns:  > 0  the frame's total size (bytes consumed); *m is filled. If m->bad != OK the
 *                content is invalid (bad op, wrong item counts, a key or value over its limit,
 *                a NUL in a key, items overrunning the frame): answer with m->bad, m->why.
 *            0   more bytes are needed (at most len + the returned need is required: *need,
 *                if not NULL, gets the total frame size once the prefix is known, else 0).
 *           < 0  unrecoverable: -E2BIG (len prefix over lim->max_frame) or -EPROTO (len
 *                prefix smaller than the header). *why says which. Close the connection.
 * is_reply selects reply rules (code is a status, any item counts) over request rules. */
ssize_t dt_proto_parse(const uint8_t *buf, size_t len, const dt_proto_limits *lim, int is_reply,
                       dt_proto_msg *m, size_t *need, const char **why);

/* Iterates items: *cursor starts at m->keys or m->vals; fills *it and advances. Only valid on a
 * frame dt_proto_parse accepted with bad == OK (or on a reply), for at most nkeys / nvals
 * items. Returns 0, or -1 if the item would leave [*cursor, end) (cannot happen on a frame the
 * parser validated). */
int dt_proto_next(const uint8_t **cursor, const uint8_t *end, dt_proto_item *it);

/* Parses buf as a stream of request frames (the bytes a server reads after the handshake) with
 * lim, then again as replies, walking every item of every well-formed frame, and checks what
 * the parser promises: consumed sizes inside the buffer, items inside their frame, item counts
 * honoured, bad frames never reported as good. Returns the number of frames parsed, or -1 when
 * a promise is broken (a parser bug). For the fuzz target (tests/fuzz/fuzz_frame.c) and the
 * corpus replay in tests/test_store.c. */
int dt_proto_check_stream(const uint8_t *buf, size_t len, const dt_proto_limits *lim);

/* Handshake: writes the 8 hello bytes. */
void dt_proto_hello_encode(uint8_t out[DT_PROTO_HELLO_SIZE], uint16_t version, uint16_t flags);
/* Decodes 8 hello bytes. 0, or -EPROTO when the magic is wrong (version and flags untouched).
 * A version mismatch is for the caller to judge (it gets the version). */
int dt_proto_hello_decode(const uint8_t in[DT_PROTO_HELLO_SIZE], uint16_t *version,
                          uint16_t *flags);

/* ---- encoding into a growable buffer ---- */

typedef struct dt_proto_buf {
    uint8_t *data; /* owned (malloc'd) */
    size_t len, cap;
    int oom;       /* set when a growth failed; the buffer content is then invalid */
} dt_proto_buf;

/* Makes room for n more bytes. 0 or -ENOMEM (also sets b->oom). */
int dt_proto_reserve(dt_proto_buf *b, size_t n);
void dt_proto_buf_free(dt_proto_buf *b);

/* Starts a frame: writes the len placeholder and the header. Returns the frame's start offset
 * (to pass to dt_proto_end). Items must follow: nkeys keys then nvals values. */
size_t dt_proto_begin(dt_proto_buf *b, uint8_t code, uint32_t id, int64_t num, uint32_t nkeys,
                      uint32_t nvals);
/* Appends one item made of two parts (prefix + body; either may be empty), e.g. a view prefix
 * and a key. */
void dt_proto_put_item2(dt_proto_buf *b, const void *p1, size_t n1, const void *p2, size_t n2);
void dt_proto_put_item(dt_proto_buf *b, const void *p, size_t n);
/* Patches the len of the frame begun at `start`. */
void dt_proto_end(dt_proto_buf *b, size_t start);
/* An error reply: status + message. */
void dt_proto_put_error(dt_proto_buf *b, uint32_t id, uint8_t status, const char *msg);

/* Names for messages and logs ("SET", "ETIMEDOUT"); never NULL. */
const char *dt_proto_op_name(int op);
const char *dt_proto_status_name(int status);
/* Status <-> negative errno (DT_PROTO_ETIMEDOUT <-> -ETIMEDOUT, ...; unknown -> -EPROTO). */
int dt_proto_status_to_errno(int status);
uint8_t dt_proto_status_from_errno(int negerr);

/* Big-endian u32 read and write. */
uint32_t dt_proto_rd32(const uint8_t *p);
void dt_proto_wr32(uint8_t *p, uint32_t v);

#endif
