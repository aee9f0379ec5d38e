/* fixtures.c - see fixtures.h. */
#include "tests/fixtures.h"

#include <stdlib.h>
#include <string.h>

#include "common/rng.h"

void dt_test_batch_make(dt_test_batch *hb, const dt_model_config *c, int B, uint64_t seed)
{
    memset(hb, 0, sizeof *hb);
    dt_rng r;
    dt_rng_seed(&r, seed);
    hb->b.B = B;
    if (c->shape.kind == DT_SAMPLE_TOKENS) {
        int T = c->shape.seq_len, V = c->shape.vocab_size;
        hb->tokens = malloc(sizeof(int32_t) * (size_t)(B * T));
        hb->targets = malloc(sizeof(int32_t) * (size_t)(B * T));
        for (int i = 0; i < B * T; i++) {
            hb->tokens[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
            hb->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)V);
        }
        hb->targets[1] = -1; /* an ignored position */
        hb->b.T = T;
    } else {
        int D = c->shape.input_dim;
        hb->x = malloc(sizeof(float) * (size_t)(B * D));
        hb->targets = malloc(sizeof(int32_t) * (size_t)B);
        for (int i = 0; i < B * D; i++)
            hb->x[i] = 2.0f * dt_rng_uniform(&r) - 1.0f;
        for (int i = 0; i < B; i++)
            hb->targets[i] = (int32_t)dt_rng_below(&r, (uint64_t)c->shape.n_classes);
    }
    hb->b.tokens = hb->tokens;
    hb->b.targets = hb->targets;
    hb->b.x = hb->x;
}

void dt_test_batch_free(dt_test_batch *hb)
{
    free(hb->tokens);
    free(hb->targets);
    free(hb->x);
}
