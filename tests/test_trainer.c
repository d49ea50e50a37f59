/* test_trainer.c: whole runs of the trainer on a tiny synthetic target:
 *   - exact resume: a run stopped after step 10 and resumed repeats steps 11..20 of an
 *     uninterrupted run bit for bit;
 *   - 1 rank, 2 ranks and 2 accumulated micro-batches give the same losses for the same
 *     global batch (float rounding);
 *   - an out-of-memory step under a budget that forces it is retried with a smaller chunk
 *     (then a vocab_tile) and the run goes on; a budget below the floor fails with a message
 *     that says what would fit;
 *   - the planner's prediction against the accounting allocator's measured peak (15%);
 *   - run config errors name the field.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char state_dir[] = "/tmp/ddtree_test_trainer.XXXXXX";

#define TINY(devices, extra)                                                                      \
    "{\"name\": \"t\", \"target\": {\"kind\": \"synthetic\", \"hidden_size\": 32, "               \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "          \
    "\"head_dim\": 8, \"intermediate_size\": 48, \"vocab_size\": 96},"                             \
    " \"drafter\": {\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2," \
    " \"head_dim\": 8, \"intermediate_size\": 48, \"block_size\": 4,"                             \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 6},"       \
    " \"train\": {\"steps\": 6, \"sequences_per_step\": 4, \"seq_len\": 24, \"max_anchors\": 4,"   \
    " \"heldout\": 4, \"noise_std\": 0.05, \"lr\": 0.003, \"seed\": 5},"                           \
    " \"loss\": {\"kl_weight\": 0.15, \"cap_weight\": 0.05, \"chunk\": 64" extra "},"              \
    " \"devices\": " devices ", \"checkpoint\": {\"every_steps\": 100, \"keep\": 2},"             \
    " \"eval\": {\"every_steps\": 100, \"sequences\": 4, \"tree_budgets\": [2, 8]}}"

static ddt_trainer *open_run(const char *json, const char *resume_id)
{
    ddt_trainer *t = NULL;
    char err[1024] = "", field[128] = "";
    int rc = ddt_trainer_open(json, strlen(json), state_dir, resume_id, resume_id != NULL, NULL, &t, err,
                              sizeof err, field, sizeof field);
    check(rc == 0, "open failed (%d): %s [%s]", rc, err, field);
    return rc == 0 ? t : NULL;
}

/* steps n times; losses[i] of each */
static int run_steps(ddt_trainer *t, int n, double *losses, ddt_step_record *last)
{
    char err[1024];
    for (int i = 0; i < n; i++) {
        ddt_step_record rec;
        int rc = ddt_trainer_step(t, &rec, err, sizeof err);
        if (rc) {
            check(0, "step %d failed: %s", i, err);
            return rc;
        }
        losses[i] = rec.loss;
        if (last)
            *last = rec;
    }
    return 0;
}

/* json with train.steps set to n */
static void with_steps(const char *json, int n, char *out, size_t len)
{
    const char *at = strstr(json, "\"steps\": 6");
    snprintf(out, len, "%.*s\"steps\": %d%s", (int)(at - json), json, n, at + strlen("\"steps\": 6"));
}

static void test_exact_resume(void)
{
    double straight[20], first[10], resumed[10];
    char json[4096];
    with_steps(TINY("1", ""), 20, json, sizeof json);
    ddt_trainer *t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, 20, straight, NULL);
    ddt_trainer_close(t);

    t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, 10, first, NULL);
    char err[1024], id[64];
    check(ddt_trainer_checkpoint(t, err, sizeof err) == 0, "checkpoint: %s", err);
    snprintf(id, sizeof id, "%s", ddt_trainer_run_id(t));
    ddt_trainer_close(t);

    t = open_run("", id);
    if (!t)
        return;
    check(ddt_trainer_step_count(t) == 10, "resumed at step %lld, want 10", (long long)ddt_trainer_step_count(t));
    run_steps(t, 10, resumed, NULL);
    ddt_trainer_close(t);
    for (int i = 0; i < 10; i++) {
        check(first[i] == straight[i], "step %d: %.9g vs uninterrupted %.9g", i + 1, first[i], straight[i]);
        check(resumed[i] == straight[10 + i], "resumed step %d: %.9g vs uninterrupted %.9g (bit for bit)",
              i + 11, resumed[i], straight[10 + i]);
    }
}

/* json with "grad_accum": k in train */
static void with_accum(const char *json, int k, char *out, size_t len)
{
    const char *at = strstr(json, "\"train\": {") + strlen("\"train\": {");
    snprintf(out, len, "%.*s\"grad_accum\": %d, %s", (int)(at - json), json, k, at);
}

static void test_ranks(void)
{
    double one[4], two[4], accum[4];
    ddt_trainer *t = open_run(TINY("1", ""), NULL);
    if (!t)
        return;
    run_steps(t, 4, one, NULL);
    ddt_trainer_close(t);
    t = open_run(TINY("2", ""), NULL);
    if (!t)
        return;
    ddt_step_record rec = { 0 };
    run_steps(t, 4, two, &rec);
    check(rec.devices == 2 && rec.device_peak_bytes[1] > 0, "two ranks should report two peaks");
    ddt_trainer_close(t);
    char json[4096];
    with_accum(TINY("1", ""), 2, json, sizeof json);
    t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, 4, accum, NULL);
    ddt_trainer_close(t);
    /* the same global batch: the losses agree to float rounding (sums in another order) */
    for (int i = 0; i < 4; i++) {
        check(fabs(one[i] - two[i]) <= 1e-5 * fabs(one[i]), "step %d: 1 rank %.9g, 2 ranks %.9g",
              i + 1, one[i], two[i]);
        check(fabs(one[i] - accum[i]) <= 1e-5 * fabs(one[i]), "step %d: 1 rank %.9g, 2 micro-batches %.9g",
              i + 1, one[i], accum[i]);
    }
}

/* json with the synthetic target's vocabulary set to vocab (a loss workspace that dominates) */
static void with_vocab(const char *json, int vocab, char *out, size_t len)
{
    const char *at = strstr(json, "\"vocab_size\": 96");
    snprintf(out, len, "%.*s\"vocab_size\": %d%s", (int)(at - json), json, vocab, at + strlen("\"vocab_size\": 96"));
}

static void test_oom_recovery(void)
{
    /* the plan at chunk 64, then a budget that only fits a smaller loss workspace */
    char base[4096];
    with_vocab(TINY("1", ""), 2048, base, sizeof base);
    ddt_trainer *t = open_run(base, NULL);
    if (!t)
        return;
    ddt_memory_plan p = *ddt_trainer_plan(t);
    ddt_trainer_close(t);
    /* room for everything but half the loss's workspace: the first step must re-chunk */
    int64_t budget = p.peak - p.frozen_head - p.loss_workspace / 2;
    char json[4096];
    snprintf(json, sizeof json, "%.*s, \"memory\": {\"budget_bytes\": %lld}}", (int)strlen(base) - 1, base,
             (long long)budget);
    t = open_run(json, NULL);
    if (!t)
        return;
    double losses[2];
    ddt_step_record rec = { 0 };
    int rc = run_steps(t, 2, losses, &rec);
    check(rc == 0 && rec.chunk < 64, "the step should go on with a smaller chunk (chunk %lld, rc %d)",
          (long long)rec.chunk, rc);
    check(rec.peak_bytes <= budget, "peak %lld over the budget %lld", (long long)rec.peak_bytes, (long long)budget);
    ddt_trainer_close(t);

    /* below the floor: a clear failure */
    snprintf(json, sizeof json, "%.*s, \"memory\": {\"budget_bytes\": %lld}}", (int)strlen(base) - 1, base,
             (long long)(p.peak - p.frozen_head - p.loss_workspace - p.activations / 2));
    t = open_run(json, NULL);
    if (!t)
        return;
    char err[1024] = "";
    ddt_step_record r2;
    rc = ddt_trainer_step(t, &r2, err, sizeof err);
    check(rc == -ENOMEM && strstr(err, "out of memory") && strstr(err, "GB"),
          "below the floor the step must fail saying what would fit: rc %d, '%s'", rc, err);
    ddt_trainer_close(t);
}

static void test_plan_vs_peak(void)
{
    ddt_trainer *t = open_run(TINY("1", ""), NULL);
    if (!t)
        return;
    double losses[1];
    ddt_step_record rec = { 0 };
    run_steps(t, 1, losses, &rec);
    const ddt_memory_plan *p = ddt_trainer_plan(t);
    /* rank 0's allocator holds all but the frozen head (the source's) */
    double predicted = (double)(p->peak - p->frozen_head);
    double measured = (double)ddk_allocator_stats(ddk_allocator_cpu_rank(0)).peak;
    check(fabs(measured - predicted) <= 0.15 * predicted, "measured peak %.0f vs predicted %.0f (%.1f%%)",
          measured, predicted, 100.0 * (measured - predicted) / predicted);
    printf("  # plan %.0f bytes, measured %.0f (%+.1f%%)\n", predicted, measured,
           100.0 * (measured - predicted) / predicted);
    ddt_trainer_close(t);
}

static void test_config_errors(void)
{
    static const struct { const char *json, *field; } cases[] = {
        { "{\"train\": {\"lr\": -1}}", "train.lr" },
        { "{\"train\": {\"steps\": 1.5}}", "train.steps" },
        { "{\"loss\": {\"kl_weight\": 2}}", "loss.kl_weight" },
        { "{\"loss\": {\"chunks\": 2}}", "loss.chunks" },
        { "{\"target\": {\"kind\": \"gguf\"}}", "target.kind" },
        { "{\"target\": {\"kind\": \"hf\"}}", "target.path" },
        { "{\"drafter\": {\"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\"]}}", "drafter.layer_types" },
        { "{\"devices\": 0}", "devices" },
        { "{\"eval\": {\"tree_budgets\": [0]}}", "eval.tree_budgets" },
        { "{\"train\": 3}", "train" },
        { "[]", "" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddt_run_config c;
        char err[512] = "", field[128] = "x";
        int rc = ddt_run_config_parse(cases[i].json, strlen(cases[i].json), &c, err, sizeof err, field, sizeof field);
        check(rc == -EINVAL && !strcmp(field, cases[i].field), "%s: rc %d, field '%s' (want '%s'): %s",
              cases[i].json, rc, field, cases[i].field, err);
    }
}

int main(void)
{
    if (!mkdtemp(state_dir)) {
        perror("mkdtemp");
        return 1;
    }
    static const struct { const char *name; void (*fn)(void); } cases[] = {
        { "run config errors name the field", test_config_errors },
        { "exact resume", test_exact_resume },
        { "1 rank vs 2 ranks vs 2 micro-batches", test_ranks },
        { "out-of-memory recovery", test_oom_recovery },
        { "plan vs measured peak", test_plan_vs_peak },
    };
    int passed = 0, failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        case_failed = 0;
        cases[i].fn();
        printf("%s %s\n", case_failed ? "FAIL" : "ok  ", cases[i].name);
        case_failed ? failed++ : passed++;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", state_dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
