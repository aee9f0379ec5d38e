/* fixtures.h - test data shared by the test binaries (linked into every one of them). */
#ifndef DT_TEST_FIXTURES_H
#define DT_TEST_FIXTURES_H

#include <stdint.h>

#include "runtime/train/model.h"

/* A random batch for a model config, in host memory (owned by the struct): token ids and
 * targets below the vocabulary with target 1 ignored (-1), or inputs in [-1, 1) with labels. */
typedef struct dt_test_batch {
    dt_batch b;
    int32_t *tokens, *targets;
    float *x;
} dt_test_batch;

void dt_test_batch_make(dt_test_batch *hb, const dt_model_config *c, int B, uint64_t seed);
void dt_test_batch_free(dt_test_batch *hb);

#endif
