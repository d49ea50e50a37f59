-- 0001_init.sql: the first schema of ddtreed's store (API.md, "SQLite"): runs, steps,
-- step_devices, evals, events, checkpoints.
--
-- Applied by daemon/engine/store.c inside one transaction that also sets PRAGMA user_version = 1
-- (embedded into ddtreed by cmake/embed_schema.cmake). A migration never changes a released
-- file: a later change is a new file, 0002_*.sql, and so on.
--
-- Times are integer milliseconds since the Unix epoch (*_ms). Floating-point step metrics are
-- nullable: SQLite stores a NaN as NULL, and a diverged step must still be recorded. Rows of a
-- run go with it (ON DELETE CASCADE; store.c turns foreign_keys on). steps, evals and
-- checkpoints are keyed by (run_id, step) and written with INSERT OR REPLACE, so that a run
-- resumed from its last checkpoint after a crash overwrites the steps it re-runs; replacing a
-- steps row removes its step_devices rows through the cascade.
-- Not here: JSON validity checks (the writer must never lose a step over a malformed detail).

CREATE TABLE runs (
    id                   TEXT    NOT NULL PRIMARY KEY,
    name                 TEXT    NOT NULL DEFAULT '',
    state                TEXT    NOT NULL DEFAULT 'queued'
                                 CHECK (state IN ('queued', 'running', 'pausing', 'paused',
                                                  'completed', 'failed', 'cancelled',
                                                  'interrupted')),
    config_json          TEXT    NOT NULL,
    created_ms           INTEGER NOT NULL,
    started_ms           INTEGER,                    -- NULL until it first runs
    updated_ms           INTEGER NOT NULL,
    finished_ms          INTEGER,                    -- NULL until completed/failed/cancelled
    step                 INTEGER NOT NULL DEFAULT 0, -- steps done
    max_steps            INTEGER NOT NULL,
    last_checkpoint_step INTEGER,                    -- NULL before the first checkpoint
    error                TEXT                        -- NULL unless it failed
);
CREATE INDEX runs_state ON runs (state);

CREATE TABLE steps (
    run_id          TEXT    NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step            INTEGER NOT NULL,
    ts_ms           INTEGER NOT NULL,
    loss            REAL,
    ce              REAL,
    kl              REAL,
    cap             REAL,
    acc             REAL,
    lr              REAL,
    grad_norm       REAL,
    tokens          INTEGER NOT NULL,
    positions       INTEGER NOT NULL,
    step_ms         REAL,
    tokens_per_s    REAL,
    positions_per_s REAL,
    peak_bytes      INTEGER NOT NULL,                -- max over devices
    chunk           INTEGER NOT NULL,
    vocab_tile      INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE step_devices (
    run_id     TEXT    NOT NULL,
    step       INTEGER NOT NULL,
    device     INTEGER NOT NULL,                     -- rank within the run, 0-based
    peak_bytes INTEGER NOT NULL,
    step_ms    REAL,
    PRIMARY KEY (run_id, step, device),
    FOREIGN KEY (run_id, step) REFERENCES steps (run_id, step) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE evals (
    run_id        TEXT    NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step          INTEGER NOT NULL,
    tau_chain     REAL,
    tau_tree_json TEXT,                              -- acceptance length per tree budget
    acc_json      TEXT,                              -- acceptance per block position
    PRIMARY KEY (run_id, step)
);

CREATE TABLE events (
    id          INTEGER PRIMARY KEY,                 -- increasing: GET /runs/{id}/events order
    run_id      TEXT    REFERENCES runs (id) ON DELETE CASCADE,  -- NULL: the daemon's own
    ts_ms       INTEGER NOT NULL,
    kind        TEXT    NOT NULL,                    -- state, rechunk, oom_recovery, checkpoint, error, ...
    detail_json TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX events_run ON events (run_id, id);

CREATE TABLE checkpoints (
    run_id TEXT    NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step   INTEGER NOT NULL,
    path   TEXT    NOT NULL,
    bytes  INTEGER NOT NULL,
    ts_ms  INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
);
