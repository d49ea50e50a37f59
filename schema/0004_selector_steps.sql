-- 0004_selector_steps.sql: a DFlash2 drafter's training step (SPEC.md 2.1): its path selector's
-- term of the loss and how often its pick is the label, beside loss, ce, kl and cap.
-- Applied by daemon/engine/record/store_schema.c with PRAGMA user_version = 4 in one transaction.

ALTER TABLE steps ADD COLUMN sel REAL;       -- weighted mean of 1[label in the top-K] l_sel (loss
                                             -- includes train.selector_weight times it); NULL: DFlash
ALTER TABLE steps ADD COLUMN sel_acc REAL;   -- fraction of counted positions where the selector's
                                             -- pick (data predecessor) is the label; NULL: DFlash
