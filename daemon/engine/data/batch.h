/* batch.h: training batches per SPEC.md section 2: seeded anchor sampling (candidates
 * p in [0, S-2] with m[p] = m[p+1] = 1; min(A, #candidates) drawn uniformly without
 * replacement, sorted, the rest padded with keep = 0) and the seeds of everything random in a
 * step (anchors, and the feature noise U(-sigma, sigma) that the backends' uniform_noise adds),
 * and how a step's sequences are sliced over ranks. Deterministic for a given (seed, step, sequence).
 * Tested by tests/engine/data/test_batch.c.
 */
#ifndef DDT_BATCH_H
#define DDT_BATCH_H

#include <stdint.h>

/* anchors (A) and keep (A) for one sequence of S tokens with loss mask m (S); returns the
 * number kept. Padding anchors repeat the last kept one (0 when none), so rows stay sorted. */
int64_t ddt_sample_anchors(const uint8_t *loss_mask, int64_t S, int64_t A, uint64_t seed,
                           int32_t *anchors, uint8_t *keep);

/* The anchor candidates of a sequence of S tokens with loss mask m (S): positions p in
 * [0, S-2] with m[p] = m[p+1] = 1, ascending, into candidates (S - 1); returns how many. */
int64_t ddt_anchor_candidates(const uint8_t *loss_mask, int64_t S, int32_t *candidates);

/* Serving-matched anchors (train.anchors "walk" / "tree_walk", SPEC.md 7): the walk over one
 * sequence of S tokens with loss mask m, given len (S): at each candidate p the block's
 * teacher-forced accepted length plus the bonus (>= 1; values < 1 count as 1). From the first
 * candidate, p -> p + len[p]; a position that is not a candidate moves on to the next one, which
 * starts a walk of its own (another assistant span). The starts (ascending) into starts (S - 1);
 * returns how many. */
int64_t ddt_walk_starts(const uint8_t *loss_mask, int64_t S, const int32_t *len, int32_t *starts);
/* anchors (A) and keep (A) as ddt_sample_anchors, drawn from the walk's starts first (min(A,
 * starts) of them uniformly without replacement), then uniformly from the other candidates for
 * what that leaves of A. Returns the number kept (min(A, candidates), as uniform anchors). */
int64_t ddt_walk_anchors(const uint8_t *loss_mask, int64_t S, const int32_t *len, int64_t A, uint64_t seed,
                         int32_t *anchors, uint8_t *keep);

/* The first of part j's items when n items are sliced over parts <= n contiguous parts as evenly
 * as they divide: n / parts each, and one more for each of the first n % parts (a step's
 * sequences over its ranks). */
int64_t ddt_slice_first(int64_t n, int64_t parts, int64_t j);
/* The part whose slice holds item i (ddt_slice_first's inverse) */
int64_t ddt_slice_part(int64_t n, int64_t parts, int64_t i);

/* a seed for (run seed, step, sequence, purpose): streams that never overlap */
uint64_t ddt_batch_seed(uint64_t run_seed, int64_t step, int64_t sequence, uint32_t purpose);

#endif
