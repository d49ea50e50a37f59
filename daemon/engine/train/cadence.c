/* cadence.c: the cadence of a run (trainer.h): ddt_trainer_advance (a new run's baseline
 * evaluation, or a step and then the evaluation, the speculative one and the checkpoint that
 * fall due), ddt_trainer_hold (a checkpoint at a stop) and ddt_trainer_finish (the final
 * checkpoint and the export); a due one that fails is an "error" event and the outcome's warning.
 * Tested by tests/engine/train/test_trainer.c (the cadence's evaluations and every_evals),
 * tests/daemon/train_cli_test.sh (`ddtreed train` stopped, resumed and finished) and tests/daemon/api_e2e.py
 * (daemon_vs_foreground: the daemon's runs and `ddtreed train` write the same records).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/log.h"

#include <stdio.h>

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
        if (ddt_trainer_checkpoint(t, why, sizeof why) == 0)
            o->checkpointed = 1;
        else
            error_event(t, o, "the checkpoint", why);
    }
    return 0;
}

int ddt_trainer_hold(ddt_trainer *t, char *err, size_t err_len)
{
    int rc = t->checkpoint_step == t->step ? 0 : ddt_trainer_checkpoint(t, err, err_len);
    if (rc)
        error_event(t, NULL, "the checkpoint", err);
    return rc;
}

int ddt_trainer_finish(ddt_trainer *t, char *err, size_t err_len)
{
    char dir[2200], why[1024];
    int rc = ddt_trainer_hold(t, err, err_len);
    snprintf(dir, sizeof dir, "%s/export", t->run_dir);
    int exported = ddt_trainer_export(t, dir, why, sizeof why);
    if (exported) {
        error_event(t, NULL, "the export", why);
        if (!rc)
            snprintf(err, err_len, "%s", why);
    }
    return rc ? rc : exported;
}
