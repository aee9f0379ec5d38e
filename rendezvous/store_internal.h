/* store_internal.h - store client and server internals exposed to tests/test_store.c only (not
 * a contract: nothing outside rendezvous/store_*.c and its tests may use it). */
#ifndef DT_STORE_INTERNAL_H
#define DT_STORE_INTERNAL_H

#include "common/rng.h"

/* A connect-retry delay: uniform in [base_ms / 2, base_ms * 3 / 2], so that thousands of
 * clients that lost the store at the same moment do not retry in lockstep. */
int dt_store_backoff_jitter_ms(dt_rng *rng, int base_ms);

#endif
