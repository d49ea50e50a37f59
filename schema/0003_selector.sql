-- 0003_selector.sql: a DFlash2 drafter's evaluation (SPEC.md 2.1): tau_chain, tau_tree_json and
-- acc_json are its path selector's; its unary head's figures over the same blocks beside them.
-- Applied by daemon/engine/record/store_schema.c with PRAGMA user_version = 3 in one transaction.

ALTER TABLE evals ADD COLUMN unary_json TEXT;   -- {"tau_chain", "tau_tree": {"K": tau}, "acc": {"k": acc}};
                                                -- NULL for a DFlash drafter (its figures are its unary head's)
