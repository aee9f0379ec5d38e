/* synth.h - the synthetic data of data.type = synthetic (implemented in synth.c): learnable
 * tasks generated from a seeded teacher, sample by sample from (seed, index), so they cost no
 * memory at any size. Vectors labelled by a random two-layer teacher, images that are one of K
 * smooth prototypes shifted and noised, and token sequences whose next token depends on the two
 * before it. Internal to runtime/train/data/ (data.c's synthetic source holds one). */
#ifndef DT_DATA_SYNTH_H
#define DT_DATA_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/rng.h"

/* A teacher. The caller fills seed and the fields of its kind (vector: dim, classes; image:
 * C, H, W, classes; tokens: T, vocab), then calls the kind's init (tokens need none). */
typedef struct dt_synth {
    uint64_t seed;
    int dim, classes, C, H, W, T, vocab;
    float *w1, *b1, *w2, *bias2; /* vector teacher: (Hd,D), (Hd), (K,Hd), (K); owned */
    float *proto;                /* image prototypes (K,C,H,W); owned */
} dt_synth;

/* A random two-layer teacher, its output biases set so that the classes are about equally
 * frequent. */
int dt_synth_vec_init(dt_synth *s, dt_err *err);
/* K prototypes, bilinear from a periodic 4x4 grid of normal draws. */
int dt_synth_img_init(dt_synth *s, dt_err *err);
/* Frees what the inits allocated (a zeroed s is fine). */
void dt_synth_free(dt_synth *s);

/* The teacher's label of vector x (dim); logits (classes) is scratch. */
int dt_synth_vec_label(const dt_synth *s, const float *x, float *logits);
/* The stream sample idx is drawn from. */
void dt_synth_sample_rng(const dt_synth *s, int64_t idx, dt_rng *r);
/* Token sample idx: seq (T+1). */
void dt_synth_tokens(const dt_synth *s, int64_t idx, int32_t *seq);
/* Classification sample idx: x (dim, or C*H*W when image) and its label. */
int dt_synth_example(const dt_synth *s, bool image, int64_t idx, float *x, int32_t *label,
                     dt_err *err);

#endif
