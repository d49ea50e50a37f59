/* cadence.c: the cadence of a run (trainer.h): ddt_trainer_advance (a new run's baseline
 * evaluation, or a step and then the evaluation, the speculative one and the checkpoint that
 * fall due), ddt_trainer_hold (a checkpoint at a stop) and ddt_trainer_finish (the final
 * checkpoint and the export); a due one that fails is an "error" event and the outcome's warning,
 * and a checkpoint or the export that fails is owed: ddt_trainer_ready holds the run until it is
 * written (and while the store cannot write).
 * Tested by tests/engine/train/test_trainer.c (the cadence's evaluations and every_evals),
 * tests/daemon/train_cli_test.sh (`ddtreed train` stopped, resumed and finished) and tests/daemon/api_e2e.py
 * (daemon_vs_foreground: the daemon's runs and `ddtreed train` write the same records).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/ddt_time.h"
#include "base/log.h"

#include <stdio.h>
#include <string.h>

/* how soon a checkpoint or an export that failed is tried again (seconds): the first time, and
 * at the longest, doubling between */
#define HOLD_RETRY_FIRST_S 1.0
#define HOLD_RETRY_LONGEST_S 60.0

/* attention that ran the SIMT kernels for want of a tensor-core instance on a GPU
 * (ddk_cuda_fallbacks): said once a run, a log line and a "kernel_fallback" event */
static void say_fallback(ddt_trainer *t)
{
    char what[320];
    if (t->fallback_said || ddk_cuda_fallbacks(what, sizeof what) == t->fallbacks_at_open)
        return;
    t->fallback_said = 1;
    ddt_log(DDT_LOG_WARNING, "run %s, step %lld: %s", t->run_id, (long long)t->step, what);
    if (t->store)
        ddt_trainer_store_message(t, "kernel_fallback", t->step, -1, what);
}

/* A due evaluation, checkpoint or export that failed: an "error" event and, when o, the
 * outcome's warning. */
static void error_event(ddt_trainer *t, ddt_trainer_outcome *o, const char *what, const char *why)
{
    if (o)
        snprintf(o->warning, sizeof o->warning, "%s at step %lld failed: %.900s", what, (long long)t->step, why);
    if (!t->store)
        return;
    char message[1100];
    snprintf(message, sizeof message, "%s failed: %.1000s", what, why);
    ddt_trainer_store_message(t, "error", t->step, -1, message);
}

/* what failed (a checkpoint, the final export) is owed: the run holds until it is written */
static void owe(ddt_trainer *t, const char *what, const char *why)
{
    t->owed = 1;
    t->owed_what = what;
    snprintf(t->owed_why, sizeof t->owed_why, "%s at step %lld failed: %.1000s", what, (long long)t->step, why);
    t->retry_pause_s = HOLD_RETRY_FIRST_S;
    t->retry_at_s = ddt_mono_s() + t->retry_pause_s;
}

/* the final export, once (ddt_trainer_finish and its retry) */
static int final_export(ddt_trainer *t, char *err, size_t err_len)
{
    char dir[2200];
    snprintf(dir, sizeof dir, "%s/export", t->run_dir);
    int rc = t->exported ? 0 : ddt_trainer_export(t, dir, err, err_len);
    t->exported = rc == 0;
    return rc;
}

/* A hold for why (into out): 0. Its reason kept; a hold whose reason changes (the store behind,
 * then locked; another error of the checkpoint) says the new one: a "held" event and a log
 * line (the first is the callers' pause, with its state event). */
static int held(ddt_trainer *t, const char *why, char *out, size_t out_len)
{
    if (*t->held_why && strcmp(t->held_why, why)) {
        ddt_log(DDT_LOG_WARNING, "run %s, step %lld: still held, now: %s", t->run_id, (long long)t->step, why);
        if (t->store)
            ddt_trainer_store_message(t, "held", t->step, -1, why);
    }
    snprintf(t->held_why, sizeof t->held_why, "%s", why);
    snprintf(out, out_len, "%s", why);
    return 0;
}

void ddt_trainer_retry_now(ddt_trainer *t)
{
    t->retry_at_s = 0;
}

int ddt_trainer_ready(ddt_trainer *t, char *why, size_t why_len)
{
    char reason[sizeof t->held_why];
    if (t->store) {
        ddt_store_health h;
        ddt_store_get_health(t->store, &h);
        if (h.degraded) {
            snprintf(reason, sizeof reason, "the store cannot write: %s", h.cause);
            return held(t, reason, why, why_len);
        }
        if (h.queued > h.capacity / 2) {   /* before a full queue would hold this thread inside a step */
            snprintf(reason, sizeof reason, "the store is behind: more than half of the %d records its queue holds "
                     "are waiting to be written", h.capacity);
            return held(t, reason, why, why_len);
        }
    }
    if (t->owed && ddt_mono_s() >= t->retry_at_s) {
        char err[1024];
        int rc = t->checkpoint_step == t->step ? 0 : ddt_trainer_checkpoint(t, err, sizeof err);
        if (rc == 0 && t->step >= t->cfg.steps)
            rc = final_export(t, err, sizeof err);
        if (rc == 0) {
            t->owed = 0;
            ddt_log(DDT_LOG_NOTICE, "run %s, step %lld: what was owed is written: %s", t->run_id, (long long)t->step,
                    t->owed_why);
        } else {
            snprintf(t->owed_why, sizeof t->owed_why, "%s at step %lld failed: %.1000s", t->owed_what,
                     (long long)t->step, err);   /* the newest reason */
            t->retry_pause_s = 2 * t->retry_pause_s < HOLD_RETRY_LONGEST_S ? 2 * t->retry_pause_s
                                                                            : HOLD_RETRY_LONGEST_S;
            t->retry_at_s = ddt_mono_s() + t->retry_pause_s;
        }
    }
    if (t->owed) {
        snprintf(reason, sizeof reason, "%s; tried again after 1 s, then at longer waits up to a minute: the run goes "
                 "on once it is written", t->owed_why);
        return held(t, reason, why, why_len);
    }
    t->held_why[0] = '\0';
    return 1;
}

int ddt_trainer_advance(ddt_trainer *t, ddt_trainer_outcome *o, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    char why[1024];
    o->done = o->stepped = o->evaluated = o->checkpointed = o->speculated = 0;
    o->warning[0] = '\0';
    if (t->step >= c->steps) {
        o->done = 1;
        return 0;
    }
    int baseline = t->step == 0 && !t->baseline_done;
    if (!baseline) {
        int rc = ddt_trainer_step(t, &o->rec, err, err_len);
        if (rc)
            return rc;
        o->stepped = 1;
        say_fallback(t);
    }
    t->baseline_done = 1;
    if (baseline || t->step % c->eval_every == 0 || t->step == c->steps) {
        if (ddt_trainer_eval(t, &o->acceptance, why, sizeof why) == 0)
            o->evaluated = 1;
        else
            error_event(t, o, "the evaluation", why);
        /* the k-th evaluation (k = ceil(step / every_steps): 0 the baseline, the same k after a
         * resume) speculates on every E-th */
        const int64_t k = (t->step + c->eval_every - 1) / c->eval_every;
        if (c->spec && k % c->spec_every_evals == 0) {
            const ddt_trainer_spec_request q = { .step = -1, .n_budgets = -1 };
            if (ddt_trainer_speculate(t, &q, &o->spec, why, sizeof why) == 0)
                o->speculated = 1;
            else
                error_event(t, o, "the speculative evaluation", why);
        }
    }
    if (!baseline && t->step % c->checkpoint_every == 0 && t->step < c->steps) {
        if (ddt_trainer_checkpoint(t, why, sizeof why) == 0) {
            o->checkpointed = 1;
        } else {
            error_event(t, o, "the checkpoint", why);
            owe(t, "the checkpoint", why);
        }
    }
    return 0;
}

int ddt_trainer_hold(ddt_trainer *t, char *err, size_t err_len)
{
    int rc = t->checkpoint_step == t->step ? 0 : ddt_trainer_checkpoint(t, err, err_len);
    if (rc) {
        error_event(t, NULL, "the checkpoint", err);
        owe(t, "the checkpoint", err);
    }
    return rc;
}

int ddt_trainer_finish(ddt_trainer *t, char *err, size_t err_len)
{
    char why[1024];
    int rc = ddt_trainer_hold(t, err, err_len);
    int exported = final_export(t, why, sizeof why);
    if (exported) {
        error_event(t, NULL, "the export", why);
        owe(t, "the export", why);
        if (!rc)
            snprintf(err, err_len, "%s", why);
    }
    return rc ? rc : exported;
}
