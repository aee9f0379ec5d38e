/* rng.c - xoshiro256** (Blackman and Vigna), seeded through splitmix64. */
#include "common/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dt_rng_seed(dt_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

void dt_rng_seed2(dt_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ 0x5851f42d4c957f2dull;
    uint64_t a = splitmix64(&x);
    x = stream + 0x2545f4914f6cdd1dull;
    dt_rng_seed(r, a ^ splitmix64(&x));
}

uint64_t dt_rng_u64(dt_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

double dt_rng_uniform_d(dt_rng *r) { return (double)(dt_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

uint64_t dt_rng_below(dt_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do
        v = dt_rng_u64(r);
    while (v >= limit);
    return v % n;
}

float dt_rng_normal(dt_rng *r)
{
    double u1 = dt_rng_uniform_d(r), u2 = dt_rng_uniform_d(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void dt_rng_fill_normal(dt_rng *r, float *x, size_t n, float mean, float std)
{
    for (size_t i = 0; i < n; i++)
        x[i] = mean + std * dt_rng_normal(r);
}

void dt_rng_permutation(dt_rng *r, uint64_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)dt_rng_below(r, i);
        uint64_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
