-- 0002_speculative.sql: speculative decoding on held-out prompts (SPEC.md section 7) beside the
-- teacher-forced evaluation of the same step: eval.speculative and POST /runs/{id}/speculate.
-- Applied by daemon/engine/store.c with PRAGMA user_version = 2 in one transaction.

ALTER TABLE evals ADD COLUMN tau_spec REAL;             -- tokens per target verification call (chain)
ALTER TABLE evals ADD COLUMN tau_spec_tree_json TEXT;   -- the same per DDTree node budget {"K": tau}
ALTER TABLE evals ADD COLUMN spec_json TEXT;            -- prompts, prompt_len, gen_len, mismatched,
                                                        -- greedy_equal, seconds (wall), per-way seconds
