/* trainer.c: what every file of the trainer uses (trainer_impl.h), and the calls of trainer.h on
 * where the run stands: the run's events, the weights between the host and the ranks (pushed to
 * the ranks at open, pulled from rank 0 for a checkpoint or an export), the data's cursor after
 * the steps done, the memory plan, the getters, rechunk, checkpoint and export. The lowest of the
 * trainer's files: it calls none of the others.
 * Tested by tests/engine/train/test_trainer.c (exact resume from its checkpoints, plan vs peak),
 * tests/engine/record/test_checkpoint.c (a trainer's checkpoint read back) and tests/daemon/train_cli_test.sh (a run
 * stopped, resumed from its checkpoint and exported).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/ddt_time.h"
#include "base/errors.h"
#include "record/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ddt_trainer_event(ddt_trainer *t, const char *kind, const char *fmt, ...)
{
    if (!t->store)
        return;
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ddt_store_event(t->store, t->run_id, ddt_wall_ms(), kind, detail);
}

void ddt_trainer_store_message(ddt_trainer *t, const char *kind, int64_t step, int64_t prompt,
                               const char *message)
{
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "step", (double)step);
    if (prompt >= 0)
        cJSON_AddNumberToObject(d, "prompt", (double)prompt);
    cJSON_AddStringToObject(d, "message", message);
    ddt_store_event_object(t->store, t->run_id, ddt_wall_ms(), kind, d);
}

void ddt_trainer_push_weights(ddt_trainer *t)
{
    const size_t bytes = (size_t)t->total * sizeof(float);
    if (t->params16)
        ddk_backend_cpu()->round_bf16(ddk_backend_cpu(), t->params, t->total, t->params16);
    for (int r = 0; t->gpu && r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        rs->be->copy(rs->be, rs->params, t->params, bytes);
        rs->be->copy(rs->be, rs->m, t->adam.m, bytes);
        rs->be->copy(rs->be, rs->v, t->adam.v, bytes);
        if (rs->params16)
            rs->be->round_bf16(rs->be, rs->params, t->total, rs->params16);
        rs->be->synchronize(rs->be);
    }
}

/* The host's weights and moments := rank 0's (before a checkpoint or an export). */
static void pull_weights(ddt_trainer *t)
{
    if (!t->gpu)
        return;
    const size_t bytes = (size_t)t->total * sizeof(float);
    rank_state *rs = &t->rank[0];
    rs->be->copy(rs->be, t->params, rs->params, bytes);
    rs->be->copy(rs->be, t->adam.m, rs->m, bytes);
    rs->be->copy(rs->be, t->adam.v, rs->v, bytes);
    rs->be->synchronize(rs->be);
}

int64_t ddt_trainer_done_cursor(const ddt_trainer *t)
{
    const int64_t cursor = t->source ? ddt_source_cursor(t->source) : t->cursor;
    return cursor - (t->ahead != AHEAD_NONE ? t->cfg.sequences_per_step : 0);
}

/* what state.json holds: where the run stands (config_json stays the trainer's) */
static ddt_checkpoint_meta checkpoint_meta(const ddt_trainer *t)
{
    ddt_checkpoint_meta m = { .step = t->step, .cursor = ddt_trainer_done_cursor(t),
                              .chunk = t->chunk,
                              .vocab_tile = t->vocab_tile, .config_json = t->config_json,
                              .drafter = t->cfg.drafter };
    snprintf(m.run_id, sizeof m.run_id, "%s", t->run_id);
    return m;
}

int ddt_trainer_plan_for(const ddt_trainer *t, int64_t budget, ddt_memory_plan *p, char *err, size_t err_len)
{
    ddt_target_footprint f;
    const int online = t->cfg.target_kind != DDT_SOURCE_SHARDS;
    int rc = online ? ddt_run_footprint(&t->cfg, &f, err, err_len) : 0;
    return rc ? rc : ddt_plan(&t->cfg, budget, t->tied, online ? &f : NULL, t->gpu, t->colocated, 0, p);
}

const char *ddt_trainer_run_id(const ddt_trainer *t) { return t->run_id; }
const char *ddt_trainer_run_dir(const ddt_trainer *t) { return t->run_dir; }
const ddt_run_config *ddt_trainer_config(const ddt_trainer *t) { return &t->cfg; }
int64_t ddt_trainer_step_count(const ddt_trainer *t) { return t->step; }
const ddt_memory_plan *ddt_trainer_plan(const ddt_trainer *t) { return &t->plan; }
const char *ddt_trainer_devices_note(const ddt_trainer *t) { return t->devices_note; }
uint64_t ddt_trainer_oom_recoveries(const ddt_trainer *t) { return t->oom_recoveries; }
int64_t ddt_trainer_checkpoint_step(const ddt_trainer *t) { return t->checkpoint_step; }

int ddt_trainer_rechunk(ddt_trainer *t, int64_t chunk, int64_t vocab_tile, char *err, size_t err_len)
{
    if (chunk == 0 || vocab_tile < -1) {
        snprintf(err, err_len, "chunk must be >= 1 and vocab_tile >= 0");
        return -EINVAL;
    }
    int64_t old_chunk = t->chunk, old_tile = t->vocab_tile;
    if (chunk > 0)
        t->chunk = chunk;
    if (vocab_tile >= 0)
        t->vocab_tile = vocab_tile;
    ddt_trainer_event(t, "rechunk",
                      "{\"applies_from_step\": %lld, \"from\": {\"chunk\": %lld, \"vocab_tile\": %lld}, "
                      "\"to\": {\"chunk\": %lld, \"vocab_tile\": %lld}}", (long long)t->step + 1, (long long)old_chunk,
                      (long long)old_tile, (long long)t->chunk, (long long)t->vocab_tile);
    return 0;
}

/* what a checkpoint or an export of the drafter writes at most beside its tensors (JSON files) */
enum { JSON_BYTES_MAX = 64 << 10 };

int ddt_trainer_checkpoint(ddt_trainer *t, char *err, size_t err_len)
{
    /* weights and both moments in F32 */
    char dir[2200];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->run_dir);
    int rc = ddt_check_free_space(dir, "the checkpoint", 3ull * 4 * (unsigned long long)t->total + JSON_BYTES_MAX, err,
                                  err_len);
    if (rc)
        return rc;
    /* the records before it committed first: a crash after the checkpoint must not take records
     * older than the step a resume goes on from */
    if (t->store && (rc = ddt_store_commit_queued(t->store)) == -EINPROGRESS)
        return ddt_fail(err, err_len, rc, "the store cannot write: the records before the checkpoint wait in its "
                        "queue, and the checkpoint is written after them");
    pull_weights(t);
    const ddt_checkpoint_meta meta = checkpoint_meta(t);
    char path[2400];
    int64_t bytes = 0;
    rc = ddt_checkpoint_write(t->run_dir, &meta, t->params, &t->adam, (int)t->cfg.checkpoint_keep, path,
                                  sizeof path, &bytes, err, err_len);
    if (rc == 0)
        t->checkpoint_step = t->step;
    if (rc == 0 && t->store) {
        ddt_store_checkpoint(t->store, t->run_id, t->step, path, bytes, ddt_wall_ms());
        ddt_trainer_event(t, "checkpoint", "{\"step\": %lld, \"bytes\": %lld}", (long long)t->step,
                          (long long)bytes);
        ddt_store_run_checkpointed(t->store, t->run_id, t->step, ddt_wall_ms());   /* its state is the run's owner's */
    }
    return rc;
}

int ddt_trainer_export(ddt_trainer *t, const char *out_dir, char *err, size_t err_len)
{
    /* the weights, F32 at most; checked where the export goes (written beside it, then renamed) */
    int rc = ddt_check_free_space(out_dir, "the export", 4ull * (unsigned long long)t->total + JSON_BYTES_MAX, err,
                                  err_len);
    if (rc)
        return rc;
    pull_weights(t);
    rc = ddt_export_write(out_dir, &t->cfg.drafter, t->params, err, err_len);
    if (rc == 0 && t->store) {   /* where it went: the final export, or a manual one's destination */
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "step", (double)t->step);
        cJSON_AddBoolToObject(d, "written", 1);
        cJSON_AddStringToObject(d, "path", out_dir);
        ddt_store_event_object(t->store, t->run_id, ddt_wall_ms(), "export", d);
    }
    return rc;
}
