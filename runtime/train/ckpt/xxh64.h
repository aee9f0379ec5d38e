/* xxh64.h - XXH64, the 64-bit xxHash, for checkpoint checksums.
 *
 * Checkpoints record a checksum of every file they consist of so that a torn write, a truncated
 * file or a flipped bit is detected before anything is loaded. XXH64 is used because it runs at
 * memory speed in portable C (several GB/s per core, far above disk speed), its output is the
 * one `xxhsum -H1` prints for the same bytes, and it is short enough to implement here instead of
 * adding a dependency. It is not a cryptographic hash: it detects accidents, not tampering.
 *
 * One-shot: dt_xxh64(data, n, seed). Streaming (any split of the input gives the same result):
 * dt_xxh64_init, dt_xxh64_update..., dt_xxh64_digest.
 */
#ifndef DT_XXH64_H
#define DT_XXH64_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt_xxh64_state {
    uint64_t total;    /* bytes consumed so far */
    uint64_t v[4];     /* the four lanes */
    uint64_t seed;
    uint8_t buf[32];   /* a partial stripe */
    uint32_t buf_len;  /* bytes in buf (< 32) */
} dt_xxh64_state;

void dt_xxh64_init(dt_xxh64_state *s, uint64_t seed);
void dt_xxh64_update(dt_xxh64_state *s, const void *data, size_t n);
/* The hash of everything consumed; s is unchanged (more updates may follow). */
uint64_t dt_xxh64_digest(const dt_xxh64_state *s);

uint64_t dt_xxh64(const void *data, size_t n, uint64_t seed);

#endif
