/* batch.h: training batches per SPEC.md section 2: seeded anchor sampling (candidates
 * p in [0, S-2] with m[p] = m[p+1] = 1; min(A, #candidates) drawn uniformly without
 * replacement, sorted, the rest padded with keep = 0) and the seeds of everything random in a
 * step (anchors, and the feature noise U(-sigma, sigma) that the backends' uniform_noise adds).
 * Deterministic for a given (seed, step, sequence).
 * Tested by tests/test_batch.c.
 */
#ifndef DDT_BATCH_H
#define DDT_BATCH_H

#include <stdint.h>

/* anchors (A) and keep (A) for one sequence of S tokens with loss mask m (S); returns the
 * number kept. Padding anchors repeat the last kept one (0 when none), so rows stay sorted. */
int64_t ddt_sample_anchors(const uint8_t *loss_mask, int64_t S, int64_t A, uint64_t seed,
                           int32_t *anchors, uint8_t *keep);

/* a seed for (run seed, step, sequence, purpose): streams that never overlap */
uint64_t ddt_batch_seed(uint64_t run_seed, int64_t step, int64_t sequence, uint32_t purpose);

#endif
