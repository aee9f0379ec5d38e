/* mlm.c - masked-language-model samples (see mlm.h). */
#include "runtime/train/data/mlm.h"

#include <math.h>
#include <stdlib.h>

#define SALT_CHOOSE 0x6d6c6d2d63686f6full /* which positions are masked */
#define SALT_HOW 0x6d6c6d2d686f7721ull    /* [MASK], random or kept */
#define SALT_TOKEN 0x6d6c6d2d746f6b6eull  /* the random token */
#define SALT_NSP 0x6e73702d6c61626cull    /* the next-sentence label */
#define SALT_PARTNER 0x6e73702d70617274ull

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A hash of (seed, sample, position) for one purpose (salt). */
static uint64_t hash3(const dt_mlm *m, uint64_t salt, int64_t idx, int64_t pos)
{
    return mix(mix(mix(m->seed ^ salt) ^ (uint64_t)idx) ^ (uint64_t)pos);
}

static double unit(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }

int dt_mlm_check(const dt_mlm *m, dt_err *err)
{
    const int need = m->nsp ? 5 : 3;
    if (m->T < need)
        return dt_err_set(err, -EINVAL,
                          "data.seq_len = %d is too short for bert's samples (%s needs at least "
                          "%d positions): raise data.seq_len",
                          m->T, m->nsp ? "[CLS] A [SEP] B [SEP]" : "[CLS] text [SEP]", need);
    if (m->vocab <= 0 || !(m->prob > 0 && m->prob <= 1))
        return dt_err_set(err, -EINVAL, "data.mlm_prob = %g: a share in (0, 1], such as 0.15",
                          m->prob);
    return 0;
}

int dt_mlm_label(const dt_mlm *m, int64_t idx)
{
    return (int)(hash3(m, SALT_NSP, idx, 0) & 1);
}

int64_t dt_mlm_partner(const dt_mlm *m, int64_t idx, int64_t first, int64_t n)
{
    if (n < 2)
        return idx;
    /* one of the n - 1 others: skip idx */
    int64_t k = (int64_t)(hash3(m, SALT_PARTNER, idx, 0) % (uint64_t)(n - 1));
    int64_t r = first + k;
    return r >= idx ? r + 1 : r;
}

typedef struct ranked {
    uint64_t h;
    int pos;
} ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    return x->pos - y->pos;
}

int dt_mlm_sample(const dt_mlm *m, int64_t idx, const int32_t *raw, const int32_t *other,
                  int32_t *tokens, int32_t *targets, int32_t *types, int32_t *mask,
                  int32_t *label, dt_err *err)
{
    const int T = m->T, V = m->vocab;
    const int32_t CLS = V + 1, SEP = V + 2, MASK = V + 3;
    const int la = m->nsp ? (T - 3) / 2 : T - 2, lb = m->nsp ? T - 3 - la : 0;
    const int lbl = m->nsp ? dt_mlm_label(m, idx) : 0;
    *label = lbl;
    tokens[0] = CLS;
    for (int i = 0; i < la; i++)
        tokens[1 + i] = raw[i];
    tokens[la + 1] = SEP;
    const int32_t *b = lbl ? other : raw + la;
    for (int i = 0; i < lb; i++)
        tokens[la + 2 + i] = b[i];
    if (m->nsp)
        tokens[T - 1] = SEP;
    for (int t = 0; t < T; t++) {
        types[t] = m->nsp && t >= la + 2;
        mask[t] = 1;
        targets[t] = -1;
    }
    /* the content positions (not [CLS], not a [SEP]), ranked by their hash; the first k are
     * masked */
    ranked *r = malloc(sizeof *r * (size_t)T);
    if (!r)
        return dt_err_set(err, -ENOMEM, "out of memory masking a sample of %d tokens", T);
    int n = 0;
    for (int t = 1; t < T; t++)
        if (t != la + 1 && t != T - 1)
            r[n++] = (ranked){hash3(m, SALT_CHOOSE, idx, t), t};
    int k = (int)lround(m->prob * n);
    k = k < 1 ? 1 : k > n ? n : k;
    qsort(r, (size_t)n, sizeof r[0], cmp_ranked);
    for (int i = 0; i < k; i++) {
        const int t = r[i].pos;
        targets[t] = tokens[t];
        double u = unit(hash3(m, SALT_HOW, idx, t));
        if (u < 0.8)
            tokens[t] = MASK;
        else if (u < 0.9)
            tokens[t] = (int32_t)(hash3(m, SALT_TOKEN, idx, t) % (uint64_t)V);
    }
    free(r);
    return 0;
}
