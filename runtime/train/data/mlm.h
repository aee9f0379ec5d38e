/* mlm.h - masked-language-model samples for bert from any token source (implemented in mlm.c):
 * the raw token sequences a source reads (text bytes, llm.c shards, synthetic tokens) become
 * BERT pre-training samples, as Google's create_pretraining_data.py builds them:
 *
 *   without NSP   [CLS] a_0 .. a_{T-3} [SEP]                         token types 0
 *   with NSP      [CLS] a_0 .. a_{la-1} [SEP] b_0 .. b_{lb-1} [SEP]   types 0 then 1 from b_0
 *                 la = (T-3)/2, lb = T-3-la; b is the lb tokens right after a in the same
 *                 sample (label 0, "is next") or the first lb tokens of another sample (label
 *                 1), half and half
 *
 * The special tokens follow the source's vocabulary V: [PAD] V, [CLS] V+1, [SEP] V+2, [MASK]
 * V+3, so the model's vocabulary is V + 4 (DT_MLM_SPECIALS). No sample is padded (every one
 * fills its T positions); the attention mask is all ones.
 *
 * Masking: of each sample's n content positions (not [CLS] or [SEP]) exactly k = max(1,
 * round(prob * n)) are chosen, those with the k smallest values of a hash of (seed, sample,
 * position); a chosen position becomes [MASK] with probability 0.8, a random token of the
 * source's vocabulary with 0.1, and stays with 0.1 (each decided by another hash of the same
 * triple), and its target is the original token; every other target is -1 (ignored). So the
 * masking is a function of (job seed, global sample index, position) alone: a resumed job, a
 * job on another world size or layout, a re-sharded one masks every sample the same, and the
 * same number of positions in every sample makes any split of a batch weigh samples alike (the
 * layouts' equality with one process). The masking is static (the same every epoch), as in the
 * original BERT. The next-sentence choice and the partner sample are hashes of (seed, sample)
 * likewise. */
#ifndef DT_DATA_MLM_H
#define DT_DATA_MLM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define DT_MLM_SPECIALS 4

typedef struct dt_mlm {
    int vocab;     /* the source's vocabulary V; the specials are V .. V+3 */
    int T;         /* positions per sample */
    double prob;   /* share of content positions masked (data.mlm_prob) */
    uint64_t seed; /* job.seed */
    bool nsp;      /* sentence pairs and next-sentence labels */
} dt_mlm;

/* Checks m (T large enough for the specials and one content token of each segment) and says
 * what to change; 0 or -EINVAL. */
int dt_mlm_check(const dt_mlm *m, dt_err *err);

/* The next-sentence label of sample idx (0: b follows a; 1: b is another sample's). */
int dt_mlm_label(const dt_mlm *m, int64_t idx);

/* The sample whose first tokens are idx's b when its label is 1: a hash of (seed, idx) in
 * [first, first + n), never idx itself (n >= 2; with n == 1 it is idx). */
int64_t dt_mlm_partner(const dt_mlm *m, int64_t idx, int64_t first, int64_t n);

/* Sample idx from raw (at least T - 2 tokens of the source from its start), and other (the
 * partner's raw tokens, read when nsp and the label is 1; else unused, may be NULL): tokens,
 * targets, types, mask (T each) and *label (nsp; else 0). -ENOMEM only. */
int dt_mlm_sample(const dt_mlm *m, int64_t idx, const int32_t *raw, const int32_t *other,
                  int32_t *tokens, int32_t *targets, int32_t *types, int32_t *mask,
                  int32_t *label, dt_err *err);

#endif
