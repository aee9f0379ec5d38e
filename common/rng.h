/* rng.h - the one deterministic random number generator of dtrain (xoshiro256**).
 *
 * Everything random (initialisation, synthetic data, sampler permutations, dropout-free training
 * noise) draws from a dt_rng seeded explicitly, so the same seed gives bit-identical runs on any
 * machine. The state is four words and is saved in checkpoints as is. */
#ifndef DT_RNG_H
#define DT_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt_rng {
    uint64_t s[4];
} dt_rng;

/* Seeds from one 64-bit value (through splitmix64, so nearby seeds give unrelated streams). */
void dt_rng_seed(dt_rng *r, uint64_t seed);
/* Seeds from a seed and a stream id (e.g. seed and epoch, seed and rank). */
void dt_rng_seed2(dt_rng *r, uint64_t seed, uint64_t stream);
uint64_t dt_rng_u64(dt_rng *r);
/* Uniform in [0, 1) with 24 random bits (float) or 53 bits (double). */
float dt_rng_uniform(dt_rng *r);
double dt_rng_uniform_d(dt_rng *r);
/* Uniform integer in [0, n), unbiased. n > 0. */
uint64_t dt_rng_below(dt_rng *r, uint64_t n);
/* Standard normal (Box-Muller, computed in double). */
float dt_rng_normal(dt_rng *r);
/* Fills x[0..n) with normal(mean, std). */
void dt_rng_fill_normal(dt_rng *r, float *x, size_t n, float mean, float std);
/* Fisher-Yates permutation of 0..n-1 into perm. */
void dt_rng_permutation(dt_rng *r, uint64_t *perm, size_t n);

#endif
