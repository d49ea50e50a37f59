/* test_trainer.c: whole runs of the trainer on a tiny synthetic target:
 *   - exact resume: a run stopped after step 10 and resumed repeats steps 11..20 of an
 *     uninterrupted run bit for bit; so does a co-located one on 3 ranks with generated data
 *     (no source: the trainer keeps the cursor, the ranks sample their sequences);
 *   - 1 rank, 2 ranks, 3 ranks (uneven slices: 2, 1, 1 of 4 sequences) and 2 accumulated
 *     micro-batches give the same losses for the same global batch (float rounding);
 *   - an out-of-memory step under a budget that forces it is retried with a smaller chunk
 *     (then a vocab_tile) and the run goes on; a budget below the floor fails with a message
 *     that says what would fit;
 *   - the planner's prediction against the accounting allocator's measured peak (15%), and
 *     with a 151,680-token vocabulary (10%: no frozen head counted per CPU rank);
 *   - run config errors name the field (train.precision, devices, cluster.* among them), good
 *     configs parse to what they say, ddt_run_config_devices resolves "devices" against 0, 1,
 *     2 and 8 GPUs: "all" takes no more GPUs than sequences per step and says so, more ranks
 *     named than sequences are refused, a GPU run's drafter.head_dim beyond the CUDA attention
 *     is refused (also by ddt_trainer_open, before any step, on a machine without a GPU);
 *   - a GPU the node does not have ("cuda:N") fails at open, naming it, and leaves nothing
 *     that changes a later run;
 *   - train.precision "bf16": finite losses close to fp32's, not identical to them; its exact
 *     resume (the weights' bf16 copy made again from the resumed weights);
 *   - target.devices "same" on CPU ranks (each rank samples its generated sequences and prefills
 *     them with its own fp32 replica; no host target): the losses and the evaluation of the host
 *     target's run bit for bit, and rank 0's measured peak against the plan's co-located figures
 *     (10%), the host's (the held-out tokens alone) against the plan's; "auto" resolves to co-located on GPU ranks only, "same" / "host" with shards and
 *     unknown values are refused naming target.devices;
 *   - a split on CPU ranks (target.devices N: target ranks one step ahead, double-buffered): the
 *     host run's losses and evaluation bit for bit (1 target rank for 2 drafter ranks, 3 for 1),
 *     exact resume from a checkpoint taken with the next batch in flight, both kinds of rank's
 *     measured peaks against the plan's (10%);
 *   - a DFlash2 run's evaluation: its selector's figures, its unary head's beside in the evals
 *     row (equal chain and acc_k at step 0, where Bs = 0); a DFlash run's without;
 *   - train.anchors walk / tree_walk: a walked step's anchors are starts of the walk that a host
 *     recomputation of its blocks' accepted lengths gives (not the uniform draw's); the tree term
 *     (train.tree_weight): the slots' scales against margins recomputed from the blocks' logits;
 *     both resume bit for bit;
 *   - eval.speculative (SPEC.md 7): refused where it cannot run, naming the field; on the host
 *     target and co-located on CPU ranks every prompt greedy-equal, 1 <= tau_spec <= B, every
 *     tree of K >= B-1 nodes at least the chain, the two placements' figures equal, the evals row
 *     holding tau_spec beside tau_chain; every_evals skips evaluations; a kept checkpoint's
 *     weights give what the live ones gave at its step; requests beyond the caps are refused.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"   /* the walk's case reads rank 0's batch and the weights */
#include "data/batch.h"
#include "eval/acceptance.h"
#include "record/store_read.h"
#include "ddk.h"

#include <cjson/cJSON.h>

#include <dirent.h>
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
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 6,"        \
    " \"target_layer_ids\": [1, 2]},"                                                             \
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

/* base run for 2 * half steps straight, then half, a checkpoint, a resume and half more: the
 * resumed steps are the uninterrupted run's bit for bit */
static void check_resume(const char *base, int half)
{
    enum { MAX_HALF = 10 };
    double straight[2 * MAX_HALF], first[MAX_HALF], resumed[MAX_HALF];
    char json[4096];
    with_steps(base, 2 * half, json, sizeof json);
    ddt_trainer *t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, 2 * half, straight, NULL);
    ddt_trainer_close(t);

    t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, half, first, NULL);
    char err[1024], id[64];
    check(ddt_trainer_checkpoint(t, err, sizeof err) == 0, "checkpoint: %s", err);
    snprintf(id, sizeof id, "%s", ddt_trainer_run_id(t));
    ddt_trainer_close(t);

    t = open_run("", id);
    if (!t)
        return;
    check(ddt_trainer_step_count(t) == half, "resumed at step %lld, want %d", (long long)ddt_trainer_step_count(t),
          half);
    run_steps(t, half, resumed, NULL);
    ddt_trainer_close(t);
    for (int i = 0; i < half; i++) {
        check(first[i] == straight[i], "step %d: %.9g vs uninterrupted %.9g", i + 1, first[i], straight[i]);
        check(resumed[i] == straight[half + i], "resumed step %d: %.9g vs uninterrupted %.9g (bit for bit)",
              half + i + 1, resumed[i], straight[half + i]);
    }
}

static void test_exact_resume(void)
{
    check_resume(TINY("1", ""), 10);
}

static void with_place(const char *json, const char *place, char *out, size_t len);

/* json's drafter made DFlash2 (SPEC.md 2.1: group 8 of H 32, rank 8, top-K 4), its selector
 * weight warmed up and ramped */
static void with_dflash2(const char *json, char *out, size_t len)
{
    const char *d = strstr(json, "\"drafter\": {") + strlen("\"drafter\": {");
    const char *t = strstr(json, "\"train\": {") + strlen("\"train\": {");
    snprintf(out, len, "%.*s\"architecture\": \"dflash2\", \"conv_group_size\": 8, \"selector_rank\": 8, "
             "\"selector_top_k\": 4, %.*s\"selector_warmup\": 0.2, \"selector_ramp\": 0.3, %s",
             (int)(d - json), json, (int)(t - d), d, t);
}

/* the step's record: DFlash2's selector term and accuracy (reported at alpha_sel 0 too: the
 * warm-up's first step), none (NaN, stored NULL) for DFlash */
static void test_selector_record(void)
{
    char json[4096];
    with_dflash2(TINY("2", ""), json, sizeof json);
    for (int v2 = 0; v2 < 2; v2++) {
        ddt_trainer *t = open_run(v2 ? json : TINY("2", ""), NULL);
        if (!t)
            return;
        double loss;
        ddt_step_record rec;
        if (run_steps(t, 1, &loss, &rec) == 0) {
            if (v2)
                check(isfinite(rec.sel) && rec.sel > 0 && rec.sel_acc >= 0 && rec.sel_acc <= 1,
                      "dflash2: sel %g, sel_acc %g", rec.sel, rec.sel_acc);
            else
                check(isnan(rec.sel) && isnan(rec.sel_acc), "dflash: sel %g, sel_acc %g, want none", rec.sel,
                      rec.sel_acc);
        }
        ddt_trainer_close(t);
    }
}

/* a DFlash2 run on 2 CPU ranks resumes bit for bit, its selector's warm-up and ramp included */
static void test_dflash2_resume(void)
{
    char json[4096];
    with_dflash2(TINY("2", ""), json, sizeof json);
    check_resume(json, 5);
}

/* co-located generated data: no source; the trainer's own cursor is checkpointed and restored,
 * and the ranks sample from it on (3 ranks: uneven slices of the step's 4 sequences) */
static void test_colocated_resume(void)
{
    char json[4096];
    with_place(TINY("3", ""), "same", json, sizeof json);
    check_resume(json, 3);
}

/* json with fields (JSON members, each followed by ", ") put first in train */
static void with_train(const char *json, const char *fields, char *out, size_t len)
{
    const char *at = strstr(json, "\"train\": {") + strlen("\"train\": {");
    snprintf(out, len, "%.*s%s%s", (int)(at - json), json, fields, at);
}

/* json with "grad_accum": k in train */
static void with_accum(const char *json, int k, char *out, size_t len)
{
    char field[48];
    snprintf(field, sizeof field, "\"grad_accum\": %d, ", k);
    with_train(json, field, out, len);
}

/* TINY with fields first in train (with_train) on 1, 2 and 3 ranks and on 1 rank in 2
 * micro-batches: the same global batch, the same losses to float rounding (sums in another order) */
static void ranks_agree(const char *fields)
{
    static const char *const devices[3] = { TINY("1", ""), TINY("2", ""), TINY("3", "") };
    double losses[4][4];
    for (int v = 0; v < 4; v++) {
        char json[4096], accum[4096];
        with_train(devices[v < 3 ? v : 0], fields, json, sizeof json);
        if (v == 3)
            with_accum(json, 2, accum, sizeof accum);
        ddt_trainer *t = open_run(v == 3 ? accum : json, NULL);   /* 4 sequences over 3 ranks: 2, 1, 1 */
        if (!t)
            return;
        ddt_step_record rec = { 0 };
        run_steps(t, 4, losses[v], &rec);
        if (v == 1 || v == 2)
            check(rec.devices == v + 1 && rec.device_peak_bytes[v] > 0, "%d ranks should report %d peaks", v + 1,
                  v + 1);
        ddt_trainer_close(t);
    }
    static const char *const what[4] = { "1 rank", "2 ranks", "3 ranks", "2 micro-batches" };
    for (int v = 1; v < 4; v++)
        for (int i = 0; i < 4; i++)
            check(fabs(losses[0][i] - losses[v][i]) <= 1e-5 * fabs(losses[0][i]), "step %d: 1 rank %.9g, %s %.9g",
                  i + 1, losses[0][i], what[v], losses[v][i]);
}

static void test_ranks(void)
{
    ranks_agree("");
}

/* the walk's anchors and the tree term's scales per sequence, wherever its rank and micro-batch */
static void test_walk_ranks(void)
{
    ranks_agree("\"anchors\": \"walk\", \"walk_share\": 0.5, \"tree_weight\": 1, ");
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

/* json's run after one step, with the host allocator's peak counted from its opening (NULL when
 * it does not open); *p its plan */
static ddt_trainer *one_step_run(const char *json, const ddt_memory_plan **p)
{
    ddk_allocator_reset_peak(ddk_allocator_cpu());
    ddt_trainer *t = open_run(json, NULL);
    if (!t)
        return NULL;
    double losses[1];
    ddt_step_record rec = { 0 };
    run_steps(t, 1, losses, &rec);
    *p = ddt_trainer_plan(t);
    return t;
}

static void plan_vs_peak(const char *json)
{
    const ddt_memory_plan *p;
    ddt_trainer *t = one_step_run(json, &p);
    if (!t)
        return;
    /* rank 0's allocator holds all but the frozen head (the source's) */
    double predicted = (double)(p->peak - p->frozen_head);
    double measured = (double)ddk_allocator_stats(ddk_allocator_cpu_rank(0)).peak;
    check(fabs(measured - predicted) <= 0.15 * predicted, "measured peak %.0f vs predicted %.0f (%.1f%%)",
          measured, predicted, 100.0 * (measured - predicted) / predicted);
    printf("  # plan %.0f bytes, measured %.0f (%+.1f%%)\n", predicted, measured,
           100.0 * (measured - predicted) / predicted);
    ddt_trainer_close(t);
}

static void test_plan_vs_peak(void)
{
    plan_vs_peak(TINY("1", ""));
}

/* DFlash2: its convolutions' activations, its selector's tensors and loss workspace planned */
static void test_plan_vs_peak_dflash2(void)
{
    char json[4096];
    with_dflash2(TINY("1", ""), json, sizeof json);
    plan_vs_peak(json);
}

/* A real vocabulary on CPU ranks (151,680 tokens, Qwen's): the head the rank reads is the host
 * target's, counted under the target, not again per rank (issue 27: 56.8 MB predicted for an
 * 18.0 MB peak). The step record's peak (rank 0's allocator) against the plan's (10%). */
static void test_plan_real_vocab(void)
{
    char json[4096];
    with_vocab(TINY("1", ""), 151680, json, sizeof json);
    ddt_trainer *t = open_run(json, NULL);
    if (!t)
        return;
    double losses[2];
    ddt_step_record rec = { 0 };
    if (run_steps(t, 2, losses, &rec) == 0) {
        const ddt_memory_plan *p = ddt_trainer_plan(t);
        const double predicted = (double)p->peak, measured = (double)rec.peak_bytes;
        check(p->target.placement == DDT_PLACE_HOST && p->frozen_head == 0,
              "a CPU rank copies no head of the host target (placement %d, frozen head %lld)", p->target.placement,
              (long long)p->frozen_head);
        check(fabs(measured - predicted) <= 0.10 * predicted, "vocabulary 151680: measured peak %.0f vs the plan's "
              "%.0f (%+.1f%%)", measured, predicted, 100.0 * (measured - predicted) / predicted);
        printf("  # vocabulary 151680: plan %.1f MB, measured %.1f MB (%+.1f%%)\n", predicted / 1e6, measured / 1e6,
               100.0 * (measured - predicted) / predicted);
    }
    ddt_trainer_close(t);
}

/* The target's host memory (a CPU run's synthetic target: weights, the prefills' workspaces and
 * the generators, plus the source's sequence queue) against the plan's figure */
static void test_plan_target_host(void)
{
    const ddt_memory_plan *p;
    ddt_trainer *t = one_step_run(TINY("1", ""), &p);
    if (!t)
        return;
    double predicted = (double)p->target.peak, measured = (double)ddk_allocator_stats(ddk_allocator_cpu()).peak;
    check(p->target.placement == DDT_PLACE_HOST && p->target.weights > 0 && p->target.cache > 0,
          "a CPU run's synthetic target is planned in host memory, generating (placement %d)", p->target.placement);
    /* the plan holds both of the source's threads prefilling and generating at once; whether
     * they overlap is the scheduler's: the peak lies between one thread's and both threads' */
    const double one_thread = predicted - (double)(p->target.workspace + p->target.cache) / 2;
    check(measured <= predicted && measured >= one_thread,
          "host peak %.0f outside the plan's %.0f (both threads) .. %.0f (one thread)", measured, predicted,
          one_thread);
    printf("  # target plan %.0f bytes (one thread at a time: %.0f), host peak %.0f\n", predicted, one_thread,
           measured);
    ddt_trainer_close(t);
}

/* A valid cluster.unique_id: NCCL's when this libddk has it, else 256 hex digits of our own */
static char cluster_id[DDK_COMM_ID_HEX + 1];

static void make_cluster_id(void)
{
    char err[256];
    if (ddk_comm_unique_id(cluster_id, err, sizeof err) == 0 && ddk_comm_id_valid(cluster_id))
        return;
    for (int i = 0; i < DDK_COMM_ID_HEX; i++)
        cluster_id[i] = "0123456789abcdef"[(i * 7 + 3) % 16];
    cluster_id[DDK_COMM_ID_HEX] = '\0';
}

/* json with every "@ID@" replaced by id */
static void with_id(const char *json, const char *id, char *out, size_t len)
{
    size_t o = 0;
    for (const char *at = json; *at && o + 1 < len;) {
        if (!strncmp(at, "@ID@", 4)) {
            o += (size_t)snprintf(out + o, len - o, "%s", id);
            at += 4;
        } else {
            out[o++] = *at++;
        }
    }
    out[o < len ? o : len - 1] = '\0';
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
        /* train.precision */
        { "{\"train\": {\"precision\": \"fp16\"}}", "train.precision" },
        { "{\"train\": {\"precision\": \"BF16\"}}", "train.precision" },
        { "{\"train\": {\"precision\": 16}}", "train.precision" },
        /* DFlash2's fields without drafter.architecture "dflash2" */
        { "{\"drafter\": {\"selector_rank\": 64}}", "drafter.selector_rank" },
        { "{\"drafter\": {\"architecture\": \"dflash\"}, \"train\": {\"selector_weight\": 0.5}}", "train.selector_weight" },
        { "{\"drafter\": {\"architecture\": \"dflash2\", \"conv_kernel_size\": 9}}", "drafter.conv_kernel_size" },
        { "{\"drafter\": {\"architecture\": \"dflash3\"}}", "drafter.architecture" },
        /* the walks' fields without the walk they set */
        { "{\"train\": {\"walk_share\": 0.5}}", "train.walk_share" },
        { "{\"train\": {\"anchors\": \"uniform\", \"tree_budget\": 8}}", "train.tree_budget" },
        { "{\"train\": {\"anchors\": \"walk\", \"tree_budget\": 8}}", "train.tree_budget" },
        { "{\"train\": {\"tree_weight\": -1}}", "train.tree_weight" },
        { "{\"train\": {\"anchors\": \"serving\"}}", "train.anchors" },
        { "{\"train\": {\"anchors\": \"walk\", \"walk_share\": 1.5}}", "train.walk_share" },
        { "{\"train\": {\"anchors\": \"walk\", \"walk_share\": 0}}", "train.walk_share" },
        { "{\"train\": {\"tree_weight\": 17}}", "train.tree_weight" },
        /* devices */
        { "{\"devices\": 65}", "devices" },
        { "{\"devices\": \"gpu\"}", "devices" },
        { "{\"devices\": []}", "devices" },
        { "{\"devices\": [0]}", "devices" },
        { "{\"devices\": [\"cuda:0\", 1]}", "devices" },
        { "{\"devices\": [\"cuda:64\"]}", "devices" },
        { "{\"devices\": [\"cuda:-1\"]}", "devices" },
        { "{\"devices\": [\"cuda:\"]}", "devices" },
        { "{\"devices\": [\"cuda:1x\"]}", "devices" },
        { "{\"devices\": [\"cuda: 1\"]}", "devices" },
        { "{\"devices\": [\"gpu:0\"]}", "devices" },
        { "{\"devices\": [\"cpu\"]}", "devices" },
        { "{\"devices\": [\"cuda:2\", \"cuda:0\", \"cuda:2\"]}", "devices" },
        /* cluster */
        { "{\"cluster\": 3}", "cluster" },
        { "{\"cluster\": {\"rank\": 1}}", "cluster.rank" },
        { "{\"cluster\": {\"unique_id\": 7}}", "cluster.unique_id" },
        { "{\"cluster\": {\"unique_id\": \"abc\", \"world_size\": 2}, \"devices\": 1}", "cluster.unique_id" },
        { "{\"cluster\": {\"unique_id\": \"@ID@0\", \"world_size\": 2}, \"devices\": 1}", "cluster.unique_id" },
        { "{\"cluster\": {\"unique_id\": \"g@ID@\", \"world_size\": 2}, \"devices\": 1}", "cluster.unique_id" },
        { "{\"cluster\": {\"world_size\": 4}, \"devices\": 1}", "cluster.unique_id" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\"}, \"devices\": 1}", "cluster.world_size" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 1}, \"devices\": 1}", "cluster.world_size" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": -2}, \"devices\": 1}", "cluster.world_size" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 2.5}, \"devices\": 1}", "cluster.world_size" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4, \"first_rank\": 3}, \"devices\": 2}", "cluster.first_rank" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4, \"first_rank\": 3}, \"devices\": [\"cuda:0\", \"cuda:1\"]}", "cluster.first_rank" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4, \"first_rank\": -1}, \"devices\": 1}", "cluster.first_rank" },
        { "{\"cluster\": {\"first_rank\": 1}, \"devices\": 1}", "cluster.first_rank" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4}, \"devices\": \"all\"}", "devices" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4}, \"devices\": \"cpu\"}", "devices" },
        { "{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4}}", "devices" },
        /* target.devices */
        { "{\"target\": {\"devices\": \"gpu\"}}", "target.devices" },
        { "{\"target\": {\"devices\": \"Same\"}}", "target.devices" },
        { "{\"target\": {\"devices\": \"\"}}", "target.devices" },
        { "{\"target\": {\"devices\": 0}}", "target.devices" },
        { "{\"target\": {\"devices\": 65}}", "target.devices" },
        { "{\"target\": {\"devices\": 1.5}}", "target.devices" },
        { "{\"target\": {\"devices\": [\"cuda:1\"]}, \"devices\": \"cpu\"}", "target.devices" },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"], \"devices\": 2}}", "target.devices" },
        { "{\"target\": {\"devices\": null}}", "target.devices" },
        { "{\"target\": {\"devices\": [\"same\"]}}", "target.devices" },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"], \"devices\": \"same\"}}", "target.devices" },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"], \"devices\": \"host\"}}", "target.devices" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddt_run_config c;
        char json[1024], err[512] = "", field[128] = "x";
        with_id(cases[i].json, cluster_id, json, sizeof json);
        int rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
        check(rc == -EINVAL && !strcmp(field, cases[i].field), "%s: rc %d, field '%s' (want '%s'): %s",
              cases[i].json, rc, field, cases[i].field, err);
        /* the message is a sentence about that field: "path: what is wrong" */
        size_t n = strlen(cases[i].field);
        check(strlen(err) > n + 8 && (n == 0 || (!strncmp(err, cases[i].field, n) && err[n] == ':')),
              "%s: the message '%s' does not start with '%s: ' and a sentence", cases[i].json, err,
              cases[i].field);
    }
    /* the message says what is accepted or what is wrong */
    static const struct { const char *json, *says; } messages[] = {
        { "{\"train\": {\"precision\": \"fp16\"}}", "fp32|bf16" },
        { "{\"devices\": [\"cuda:64\"]}", "cuda:N" },
        { "{\"devices\": [\"cuda:2\", \"cuda:0\", \"cuda:2\"]}", "cuda:2 twice" },
        { "{\"cluster\": {\"unique_id\": \"@ID@0\"}}", "256" },
        { "{\"cluster\": {\"unique_id\": \"abc\", \"world_size\": 2}, \"devices\": 1}", "hex" },
        { "{\"target\": {\"devices\": \"gpu\"}}", "\"auto\", \"host\", \"same\", a list of GPUs [\"cuda:N\", ...] apart from devices' or a number of target ranks" },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"], \"devices\": \"same\"}}",
          "no target at train time" },
    };
    for (size_t i = 0; i < sizeof messages / sizeof messages[0]; i++) {
        ddt_run_config c;
        char json[1024], err[512] = "", field[128];
        with_id(messages[i].json, cluster_id, json, sizeof json);
        ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
        check(strstr(err, messages[i].says) != NULL, "%s: '%s' does not say '%s'", messages[i].json,
              err, messages[i].says);
    }
}

/* parses json (with "@ID@" the cluster id); check()s success */
static int parse_ok(const char *json_template, ddt_run_config *c)
{
    char json[4096], err[512] = "", field[128] = "";
    with_id(json_template, cluster_id, json, sizeof json);
    int rc = ddt_run_config_parse(json, strlen(json), c, err, sizeof err, field, sizeof field);
    check(rc == 0, "%s: rc %d [%s] %s", json_template, rc, field, err);
    return rc == 0;
}

static void test_config_good(void)
{
    ddt_run_config c;
    if (parse_ok("{}", &c)) {
        check(c.bf16 == 0, "train.precision defaults to fp32 (bf16 = %d)", c.bf16);
        check(c.devices_kind == DDT_DEVICES_ALL && c.ranks == 1, "devices defaults to \"all\" (kind %d, ranks %lld)",
              (int)c.devices_kind, (long long)c.ranks);
        check(!*c.cluster_id && c.cluster_world == 0 && c.cluster_first == 0, "cluster defaults to none");
        check(c.target_place == DDT_TARGET_AUTO && c.target_devices_count == 0,
              "target.devices defaults to \"auto\" (place %d)", (int)c.target_place);
        ddt_run_config_free(&c);
    }
    static const struct { const char *json; ddt_target_place place; int cpu, gpu; } places[] = {
        /* the place, and whether it is co-located on CPU ranks and on GPU ranks */
        { "{}", DDT_TARGET_AUTO, 0, 1 },
        { "{\"target\": {\"devices\": \"auto\"}}", DDT_TARGET_AUTO, 0, 1 },
        { "{\"target\": {\"devices\": \"host\"}}", DDT_TARGET_HOST, 0, 0 },
        { "{\"target\": {\"devices\": \"same\"}}", DDT_TARGET_SAME, 1, 1 },
        { "{\"target\": {\"kind\": \"hf\", \"path\": \"/x\", \"devices\": \"same\"}, \"devices\": \"cpu\"}", DDT_TARGET_SAME, 1, 1 },
        { "{\"target\": {\"devices\": [\"cuda:2\"]}, \"devices\": [\"cuda:0\"]}", DDT_TARGET_SPLIT, 0, 0 },
        { "{\"target\": {\"devices\": 2}}", DDT_TARGET_SPLIT, 0, 0 },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"]}}", DDT_TARGET_AUTO, 0, 0 },
        { "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a\"], \"devices\": \"auto\"}}", DDT_TARGET_AUTO, 0, 0 },
    };
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        if (!parse_ok(places[i].json, &c))
            continue;
        check(c.target_place == places[i].place && ddt_devices_colocated(&c, 0) == places[i].cpu &&
                  ddt_devices_colocated(&c, 1) == places[i].gpu,
              "%s: place %d, co-located on CPU ranks %d, on GPUs %d; want %d, %d, %d", places[i].json,
              (int)c.target_place, ddt_devices_colocated(&c, 0), ddt_devices_colocated(&c, 1), (int)places[i].place,
              places[i].cpu, places[i].gpu);
        /* ddt_run_config_devices says the same on a node without GPUs and with two */
        for (int gpus = 0; gpus <= 2 && c.target_place != DDT_TARGET_SPLIT; gpus += 2) {
            ddt_devices d;
            char err[512] = "";
            const ddt_node node = { .gpus = gpus };
            int rc = ddt_run_config_devices(&c, node, &d, err, sizeof err, NULL, 0);
            check(rc == 0 && d.colocated == (d.gpu ? places[i].gpu : places[i].cpu),
                  "%s on %d GPUs: rc %d (%s), colocated %d", places[i].json, gpus, rc, err, d.colocated);
        }
        ddt_run_config_free(&c);
    }
    if (parse_ok("{\"train\": {\"precision\": \"bf16\"}}", &c))
        check(c.bf16 == 1, "train.precision \"bf16\": bf16 = %d", c.bf16), ddt_run_config_free(&c);
    if (parse_ok("{\"train\": {\"precision\": \"fp32\"}}", &c))
        check(c.bf16 == 0, "train.precision \"fp32\": bf16 = %d", c.bf16), ddt_run_config_free(&c);
    if (parse_ok("{\"devices\": \"cpu\"}", &c))
        check(c.devices_kind == DDT_DEVICES_CPU && c.ranks == 1, "\"cpu\": kind %d, ranks %lld", (int)c.devices_kind,
              (long long)c.ranks), ddt_run_config_free(&c);
    if (parse_ok("{\"devices\": 3}", &c))
        check(c.devices_kind == DDT_DEVICES_COUNT && c.ranks == 3, "3: kind %d, ranks %lld", (int)c.devices_kind,
              (long long)c.ranks), ddt_run_config_free(&c);
    if (parse_ok("{\"devices\": [\"cuda:0\", \"cuda:3\"]}", &c)) {
        check(c.devices_kind == DDT_DEVICES_LIST && c.ranks == 2 && c.gpu_ids[0] == 0 && c.gpu_ids[1] == 3,
              "[cuda:0, cuda:3]: kind %d, ranks %lld, ids %d %d", (int)c.devices_kind, (long long)c.ranks,
              c.gpu_ids[0], c.gpu_ids[1]);
        ddt_run_config_free(&c);
    }
    char json[4096] = "{\"devices\": [";   /* all 64: cuda:63 .. cuda:0 */
    for (int i = 63; i >= 0; i--)
        snprintf(json + strlen(json), sizeof json - strlen(json), "\"cuda:%d\"%s", i, i ? ", " : "]}");
    if (parse_ok(json, &c)) {
        check(c.devices_kind == DDT_DEVICES_LIST && c.ranks == 64 && c.gpu_ids[0] == 63 && c.gpu_ids[63] == 0,
              "64 GPUs: kind %d, ranks %lld", (int)c.devices_kind, (long long)c.ranks);
        ddt_run_config_free(&c);
    }
    if (parse_ok("{\"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4, \"first_rank\": 2},"
                 " \"devices\": [\"cuda:0\", \"cuda:1\"]}", &c)) {
        check(!strcmp(c.cluster_id, cluster_id) && c.cluster_world == 4 && c.cluster_first == 2 && c.ranks == 2,
              "cluster: id %.8s..., world %lld, first %lld, ranks %lld", c.cluster_id, (long long)c.cluster_world,
              (long long)c.cluster_first, (long long)c.ranks);
        ddt_run_config_free(&c);
    }
    char upper[DDK_COMM_ID_HEX + 1];   /* the id in capitals: hex digits of either case */
    for (int i = 0; i <= DDK_COMM_ID_HEX; i++)
        upper[i] = (char)(cluster_id[i] >= 'a' && cluster_id[i] <= 'f' ? cluster_id[i] - 'a' + 'A' : cluster_id[i]);
    snprintf(json, sizeof json, "{\"cluster\": {\"unique_id\": \"%s\", \"world_size\": 2, \"first_rank\": 1},"
             " \"devices\": 1}", upper);
    if (parse_ok(json, &c))
        check(c.cluster_world == 2 && c.cluster_first == 1 && c.devices_kind == DDT_DEVICES_COUNT,
              "cluster in capitals"), ddt_run_config_free(&c);
}

/* ddt_run_config_devices: "devices" against a node of 0, 1, 2 or 8 GPUs (the count is a
 * parameter: no GPU needed). Every rank has a sequence of each step: "all" takes no more GPUs
 * than train.sequences_per_step (default 4) and says so; more ranks named are refused. A GPU
 * run's drafter.head_dim must be <= DDK_CUDA_MAX_HEAD_DIM, a list of GPUs being a GPU run even
 * on a node without them. */
#define SEQ(n) ", \"train\": {\"sequences_per_step\": " #n "}"
#define HD(n) ", \"drafter\": {\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": " #n "}"
static void test_config_devices(void)
{
    static const struct {
        const char *devices;   /* the JSON of "devices" (and what follows it) */
        int gpus, rc, gpu, ranks, ids[8];
        const char *says;      /* in err when rc != 0; in the note ("" none) when rc == 0 */
        const char *field;     /* rc != 0: the field at fault */
        int single_gpu;        /* the node: a CUDA build without NCCL */
    } cases[] = {
        { "\"all\"", 0, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "\"all\"", 2, 0, 1, 2, { 0, 1 }, "", NULL, 0 },
        { "\"all\"" SEQ(8), 8, 0, 1, 8, { 0, 1, 2, 3, 4, 5, 6, 7 }, "", NULL, 0 },
        { "\"all\"" SEQ(12), 8, 0, 1, 8, { 0, 1, 2, 3, 4, 5, 6, 7 }, "", NULL, 0 },
        /* "all" with fewer sequences per step than GPUs: the first ones, and a sentence */
        { "\"all\"", 8, 0, 1, 4, { 0, 1, 2, 3 },
          "devices \"all\": 8 GPUs but 4 sequences per step (train.sequences_per_step): training on "
          "cuda:0..cuda:3, the other 4 stay idle", NULL, 0 },
        { "\"all\"" SEQ(1), 8, 0, 1, 1, { 0 }, "training on cuda:0, the other 7 stay idle", NULL, 0 },
        { "\"all\"" SEQ(1), 1, 0, 1, 1, { 0 }, "", NULL, 0 },
        { "\"all\"" SEQ(1), 0, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "3", 0, 0, 0, 3, { 0 }, "", NULL, 0 },
        { "3", 2, -ENODEV, 0, 0, { 0 }, "3 GPUs", "devices", 0 },
        { "3", 8, 0, 1, 3, { 0, 1, 2 }, "", NULL, 0 },
        { "\"cpu\"", 0, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "\"cpu\"", 2, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "\"cpu\"", 8, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "[\"cuda:1\"]", 0, -ENODEV, 0, 0, { 0 }, "cuda:1", "devices", 0 },
        { "[\"cuda:1\"]", 2, 0, 1, 1, { 1 }, "", NULL, 0 },
        { "[\"cuda:1\"]", 8, 0, 1, 1, { 1 }, "", NULL, 0 },
        { "[\"cuda:5\"]", 0, -ENODEV, 0, 0, { 0 }, "cuda:5", "devices", 0 },
        { "[\"cuda:5\"]", 2, -ENODEV, 0, 0, { 0 }, "cuda:5", "devices", 0 },
        { "[\"cuda:5\"]", 8, 0, 1, 1, { 5 }, "", NULL, 0 },
        { "[\"cuda:6\", \"cuda:2\"]", 8, 0, 1, 2, { 6, 2 }, "", NULL, 0 },
        { "[\"cuda:0\", \"cuda:2\"]", 2, -ENODEV, 0, 0, { 0 }, "cuda:2", "devices", 0 },
        { "2, \"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4}", 0, -ENODEV, 0, 0, { 0 }, "GPU", "cluster", 0 },
        { "2, \"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 4}", 2, 0, 1, 2, { 0, 1 }, "", NULL, 0 },
        /* ranks named beyond the sequences per step: refused, GPUs or CPU ranks, whatever the node */
        { "8", 8, -EINVAL, 0, 0, { 0 }, "train.sequences_per_step is 4", "devices", 0 },
        { "8", 0, -EINVAL, 0, 0, { 0 }, "train.sequences_per_step is 4", "devices", 0 },
        { "5", 2, -EINVAL, 0, 0, { 0 }, "at most 4 devices", "devices", 0 },
        { "[\"cuda:0\", \"cuda:1\", \"cuda:2\", \"cuda:3\", \"cuda:4\"]", 8, -EINVAL, 0, 0, { 0 },
          "5 ranks but train.sequences_per_step is 4", "devices", 0 },
        { "[\"cuda:0\", \"cuda:1\"]" SEQ(1), 0, -EINVAL, 0, 0, { 0 }, "train.sequences_per_step", "devices", 0 },
        { "8" SEQ(8), 0, 0, 0, 8, { 0 }, "", NULL, 0 },
        { "2, \"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 8}", 2, -EINVAL, 0, 0, { 0 },
          "8 ranks but train.sequences_per_step is 4", "cluster.world_size", 0 },
        /* a head_dim the CUDA attention does not hold: refused for a GPU run only */
        { "[\"cuda:0\"]" HD(288), 0, -EINVAL, 0, 0, { 0 }, "drafter.head_dim: 288", "drafter.head_dim", 0 },
        { "[\"cuda:0\"]" HD(288), 1, -EINVAL, 0, 0, { 0 }, "\"devices\": \"cpu\"", "drafter.head_dim", 0 },
        { "\"all\"" HD(288), 2, -EINVAL, 0, 0, { 0 }, "<= 256", "drafter.head_dim", 0 },
        { "2" HD(288), 2, -EINVAL, 0, 0, { 0 }, "drafter.head_dim", "drafter.head_dim", 0 },
        { "\"all\"" HD(288), 0, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "2" HD(288), 0, 0, 0, 2, { 0 }, "", NULL, 0 },
        { "\"cpu\"" HD(288), 8, 0, 0, 1, { 0 }, "", NULL, 0 },
        { "[\"cuda:0\"]" HD(256), 1, 0, 1, 1, { 0 }, "", NULL, 0 },
        /* a CUDA build without NCCL: one GPU rank; "all" takes cuda:0 and says so */
        { "\"all\"", 8, 0, 1, 1, { 0 }, "devices \"all\": 8 GPUs but this ddtreed was built without NCCL: "
          "training on cuda:0, the other 7 stay idle", NULL, 1 },
        { "\"all\"", 1, 0, 1, 1, { 0 }, "", NULL, 1 },
        { "\"all\"", 0, 0, 0, 1, { 0 }, "", NULL, 1 },
        { "[\"cuda:3\"]", 8, 0, 1, 1, { 3 }, "", NULL, 1 },
        { "1", 8, 0, 1, 1, { 0 }, "", NULL, 1 },
        { "2", 8, -EINVAL, 0, 0, { 0 }, "2 GPU ranks need NCCL", "devices", 1 },
        { "[\"cuda:0\", \"cuda:1\"]", 8, -EINVAL, 0, 0, { 0 }, "built without it", "devices", 1 },
        { "[\"cuda:0\", \"cuda:1\"]", 0, -EINVAL, 0, 0, { 0 }, "need NCCL", "devices", 1 },
        { "1, \"cluster\": {\"unique_id\": \"@ID@\", \"world_size\": 2}", 1, -EINVAL, 0, 0, { 0 },
          "need NCCL", "cluster.world_size", 1 },
        { "2", 0, 0, 0, 2, { 0 }, "", NULL, 1 },   /* CPU ranks need no NCCL */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"devices\": %s}", cases[i].devices);
        ddt_run_config c;
        if (!parse_ok(json, &c))
            continue;
        ddt_devices d;
        memset(&d, 0xff, sizeof d);
        char err[512] = "", field[128] = "x";
        const ddt_node node = { .gpus = cases[i].gpus, .single_gpu = cases[i].single_gpu };
        int rc = ddt_run_config_devices(&c, node, &d, err, sizeof err, field, sizeof field);
        ddt_run_config_free(&c);
        if (cases[i].rc) {
            size_t n = strlen(cases[i].field);
            check(rc == cases[i].rc && strstr(err, cases[i].says) && !strcmp(field, cases[i].field) &&
                      !strncmp(err, cases[i].field, n) && err[n] == ':',
                  "devices %s on %d GPUs: rc %d, field '%s'; want %d, field '%s' and a message \"%s: ...\" "
                  "naming %s: '%s'", cases[i].devices, cases[i].gpus, rc, field, cases[i].rc, cases[i].field,
                  cases[i].field, cases[i].says, err);
            continue;
        }
        int same = rc == 0 && d.gpu == cases[i].gpu && d.ranks == cases[i].ranks && !*field;
        for (int r = 0; same && d.gpu && r < d.ranks; r++)
            same = d.gpu_ids[r] == cases[i].ids[r];
        check(same, "devices %s on %d GPUs: rc %d (%s), gpu %d, ranks %d, ids %d %d ...; want gpu %d, ranks %d, ids %d %d ...",
              cases[i].devices, cases[i].gpus, rc, err, d.gpu, d.ranks, d.gpu_ids[0], d.gpu_ids[1], cases[i].gpu,
              cases[i].ranks, cases[i].ids[0], cases[i].ids[1]);
        check(rc == 0 && (*cases[i].says ? strstr(d.note, cases[i].says) != NULL : !*d.note),
              "devices %s on %d GPUs: note '%s', want %s%s%s", cases[i].devices, cases[i].gpus, rc ? "" : d.note,
              *cases[i].says ? "one saying '" : "none", cases[i].says, *cases[i].says ? "'" : "");
    }
}

/* A split's target ranks resolved on a node: a number takes the node's last GPUs the drafter
 * leaves ("all": the drafter takes the rest, no more than sequences), or CPU target ranks beside
 * CPU drafter ranks; named GPUs are kept; too many, a GPU the node lacks, or no NCCL: refused,
 * naming target.devices. */
static void test_split_devices(void)
{
    static const struct {
        const char *json;
        int gpus, rc, gpu, ranks, targets, ids[4], target_ids[4];
        const char *says;
        int single_gpu;
    } cases[] = {
        { "\"devices\": 5, \"target\": {\"devices\": 3}, \"train\": {\"sequences_per_step\": 5}", 8, 0, 1, 5, 3,
          { 0, 1, 2, 3 }, { 5, 6, 7 }, "", 0 },
        { "\"devices\": \"all\", \"target\": {\"devices\": 3}, \"train\": {\"sequences_per_step\": 8}", 8, 0, 1, 5, 3,
          { 0, 1, 2, 3 }, { 5, 6, 7 }, "", 0 },
        { "\"devices\": \"all\", \"target\": {\"devices\": 2}", 8, 0, 1, 4, 2, { 0, 1, 2, 3 }, { 6, 7 }, "", 0 },
        { "\"devices\": [\"cuda:0\", \"cuda:7\"], \"target\": {\"devices\": 2}", 8, 0, 1, 2, 2, { 0, 7 }, { 5, 6 }, "", 0 },
        { "\"devices\": 1, \"target\": {\"devices\": [\"cuda:3\"]}", 8, 0, 1, 1, 1, { 0 }, { 3 }, "", 0 },
        { "\"devices\": 2, \"target\": {\"devices\": 3}", 0, 0, 0, 2, 3, { 0 }, { 0 }, "", 0 },
        { "\"devices\": \"cpu\", \"target\": {\"devices\": 1}", 8, 0, 0, 1, 1, { 0 }, { 0 }, "", 0 },
        { "\"devices\": 2, \"target\": {\"devices\": 7}, \"train\": {\"sequences_per_step\": 8}", 8, -ENODEV, 0, 0, 0, { 0 }, { 0 },
          "7 target GPUs asked for, and this node has 8 GPUs, 2 of them the drafter's", 0 },
        { "\"devices\": \"all\", \"target\": {\"devices\": 8}, \"train\": {\"sequences_per_step\": 8}", 8, -ENODEV, 0, 0, 0, { 0 }, { 0 }, "8 target GPUs", 0 },
        { "\"devices\": 1, \"target\": {\"devices\": [\"cuda:9\"]}", 8, -ENODEV, 0, 0, 0, { 0 }, { 0 }, "cuda:9", 0 },
        { "\"devices\": 1, \"target\": {\"devices\": 1}", 8, -EINVAL, 0, 0, 0, { 0 }, { 0 }, "without it", 1 },
        { "\"devices\": 4, \"target\": {\"devices\": 61}, \"train\": {\"sequences_per_step\": 64}", 0, -EINVAL, 0, 0, 0,
          { 0 }, { 0 }, "at most 64 CPU ranks", 0 },
        { "\"devices\": 1, \"target\": {\"devices\": 5}", 0, -EINVAL, 0, 0, 0, { 0 }, { 0 },
          "5 target ranks but train.sequences_per_step is 4", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{%s}", cases[i].json);
        ddt_run_config c;
        if (!parse_ok(json, &c))
            continue;
        ddt_devices d;
        memset(&d, 0, sizeof d);
        char err[512] = "", field[128] = "";
        const ddt_node node = { .gpus = cases[i].gpus, .single_gpu = cases[i].single_gpu };
        int rc = ddt_run_config_devices(&c, node, &d, err, sizeof err, field, sizeof field);
        ddt_run_config_free(&c);
        if (cases[i].rc) {
            check(rc == cases[i].rc && strstr(err, cases[i].says) && !strcmp(field, "target.devices") &&
                      !strncmp(err, "target.devices: ", 16),
                  "%s on %d GPUs: rc %d, field '%s', '%s'; want %d and \"target.devices: ...%s...\"", cases[i].json,
                  cases[i].gpus, rc, field, err, cases[i].rc, cases[i].says);
            continue;
        }
        int same = rc == 0 && d.gpu == cases[i].gpu && d.ranks == cases[i].ranks && d.target_ranks == cases[i].targets &&
                   !d.colocated;
        for (int r = 0; same && d.gpu && r < d.ranks && r < 4; r++)
            same = d.gpu_ids[r] == cases[i].ids[r];
        for (int j = 0; same && d.gpu && j < d.target_ranks; j++)
            same = d.target_gpu_ids[j] == cases[i].target_ids[j];
        check(same, "%s on %d GPUs: rc %d (%s), gpu %d, ranks %d (%d %d ...), target ranks %d (%d %d ...)", cases[i].json,
              cases[i].gpus, rc, err, d.gpu, d.ranks, d.gpu_ids[0], d.gpu_ids[1], d.target_ranks, d.target_gpu_ids[0],
              d.target_gpu_ids[1]);
    }
}

/* What a GPU run's config is refused for is refused when the trainer opens it, before any
 * step and without a GPU: ["cuda:0"] with drafter.head_dim 288 (beyond the CUDA attention),
 * and CPU ranks beyond the sequences per step; the message names the field and the way out. */
static void test_open_refuses(void)
{
    const char *tiny = TINY("[\"cuda:0\"]", "");
    const char *drafter = strstr(tiny, "\"drafter\":"), *hd = strstr(drafter, "\"head_dim\": 8");
    char json[4096];
    snprintf(json, sizeof json, "%.*s\"head_dim\": 288%s", (int)(hd - tiny), tiny, hd + strlen("\"head_dim\": 8"));
    static const struct { const char *json_or_null, *field, *says; } cases[] = {
        { NULL, "drafter.head_dim", "drafter.head_dim: 288 is more than the 256" },
        { TINY("8", ""), "devices", "train.sequences_per_step is 4" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *text = cases[i].json_or_null ? cases[i].json_or_null : json;
        ddt_trainer *t = NULL;
        char err[1024] = "", field[128] = "";
        int rc = ddt_trainer_open(text, strlen(text), state_dir, NULL, 0, NULL, &t, err, sizeof err, field,
                                  sizeof field);
        check(rc == -EINVAL && !strcmp(field, cases[i].field) && strstr(err, cases[i].says),
              "case %zu: rc %d, field '%s' (want -EINVAL, '%s'): '%s'", i, rc, field, cases[i].field, err);
        if (rc == 0)
            ddt_trainer_close(t);
        else
            printf("  # %s\n", err);
    }
}

/* A GPU this node does not have: cuda:N with N the node's GPU count (cuda:0 here, without
 * GPUs). ddt_trainer_open fails naming it and leaves nothing behind
 * that changes a later run: the allocators hold what they held, and a run after it repeats
 * the run before it bit for bit. */
/* entries of DIR (-1 when it cannot be read) */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_missing_gpu(void)
{
    const int gpus = ddk_cuda_device_count();
    if (gpus >= DDT_MAX_RANKS)
        return;   /* every cuda:N exists */
    double before[2] = { 0 }, after[2] = { 0 };
    ddt_trainer *t = open_run(TINY("1", ""), NULL);
    if (!t)
        return;
    int rc = run_steps(t, 2, before, NULL);
    ddt_trainer_close(t);
    if (rc)
        return;

    const size_t cpu0 = ddk_allocator_stats(ddk_allocator_cpu()).current,
                 rank0 = ddk_allocator_stats(ddk_allocator_cpu_rank(0)).current;
    char devices[40], json[4096], err[1024] = "", field[128] = "", gpu_name[24];
    snprintf(gpu_name, sizeof gpu_name, "cuda:%d", gpus);
    snprintf(devices, sizeof devices, "[\"%s\"]", gpu_name);
    const char *tiny = TINY("@D@", "");   /* the devices spliced in by hand */
    const char *at = strstr(tiny, "@D@");
    snprintf(json, sizeof json, "%.*s%s%s", (int)(at - tiny), tiny, devices, at + 3);
    t = NULL;
    char runs[sizeof state_dir + 8];
    snprintf(runs, sizeof runs, "%s/runs", state_dir);
    const int dirs = count_entries(runs);
    rc = ddt_trainer_open(json, strlen(json), state_dir, NULL, 0, NULL, &t, err, sizeof err, field,
                          sizeof field);
    check(count_entries(runs) == dirs, "the failed open left a run directory: %d entries, %d before",
          count_entries(runs), dirs);
    check(rc == -ENODEV && strstr(err, gpu_name), "devices [\"%s\"]: rc %d, want -ENODEV and a message naming %s: '%s'",
          gpu_name, rc, gpu_name, err);
    if (rc == 0) {
        ddt_trainer_close(t);
        return;
    }
    printf("  # %s\n", err);
    check(ddk_allocator_stats(ddk_allocator_cpu()).current == cpu0 &&
              ddk_allocator_stats(ddk_allocator_cpu_rank(0)).current == rank0,
          "the failed open left memory allocated: cpu %zu -> %zu, cpu:0 %zu -> %zu bytes", cpu0,
          ddk_allocator_stats(ddk_allocator_cpu()).current, rank0,
          ddk_allocator_stats(ddk_allocator_cpu_rank(0)).current);

    t = open_run(TINY("1", ""), NULL);
    if (!t)
        return;
    run_steps(t, 2, after, NULL);
    ddt_trainer_close(t);
    for (int i = 0; i < 2; i++)
        check(after[i] == before[i], "step %d after the failed open: %.9g, before it %.9g", i + 1, after[i],
              before[i]);
}

/* json with "precision": p and "ce_target": "data" in train */
static void with_precision(const char *json, const char *p, char *out, size_t len)
{
    const char *at = strstr(json, "\"train\": {") + strlen("\"train\": {");
    snprintf(out, len, "%.*s\"precision\": \"%s\", \"ce_target\": \"data\", %s", (int)(at - json),
             json, p, at);
}

/* train.precision "bf16": every product of the step (drafter and loss) takes bf16 operands,
 * each rounded by <= 2^-9 relative; weights, moments and statistics stay fp32. From features
 * to logits a chain of ~6 products (fc, q/k/v, o, MLP up/down, lm_head) each adds ~2 x 2^-9
 * of its output, random in sign: ~sqrt(12) 2^-9 / sqrt(3) = 4e-3 of the logits at most, and
 * the loss, smooth in them, moves as much relative; the next steps add the difference of a
 * few AdamW updates of lr 0.003. So 1e-2 relative (measured <= 5e-4). The CE labels are the
 * data's ("ce_target": "data"): the teacher's argmax (the default) flips at near-ties when its
 * logits are rounded, which moved one step's CE by 2% here, rounding or not. Not bit-identical
 * to fp32: the bf16 path was taken. */
static void test_bf16_run(void)
{
    enum { STEPS = 4 };
    double fp32[STEPS], bf16[STEPS];
    char json[4096];
    with_precision(TINY("1", ""), "fp32", json, sizeof json);
    ddt_trainer *t = open_run(json, NULL);
    if (!t)
        return;
    run_steps(t, STEPS, fp32, NULL);
    ddt_trainer_close(t);
    with_precision(TINY("1", ""), "bf16", json, sizeof json);
    t = open_run(json, NULL);
    if (!t)
        return;
    check(ddt_trainer_config(t)->bf16 == 1, "train.precision \"bf16\" not in the run's config");
    run_steps(t, STEPS, bf16, NULL);
    ddt_trainer_close(t);
    int identical = 1;
    for (int i = 0; i < STEPS; i++) {
        identical &= bf16[i] == fp32[i];
        check(isfinite(bf16[i]) && fabs(bf16[i] - fp32[i]) <= 1e-2 * fabs(fp32[i]),
              "step %d: bf16 loss %.9g, fp32 %.9g (relative %.3g)", i + 1, bf16[i], fp32[i],
              fabs(bf16[i] - fp32[i]) / fabs(fp32[i]));
    }
    check(!identical, "the bf16 run's losses are fp32's bit for bit: the bf16 path was not taken");
    printf("  # step 1: fp32 %.9g, bf16 %.9g (%+.2e); step %d: %.9g, %.9g (%+.2e)\n", fp32[0], bf16[0],
           (bf16[0] - fp32[0]) / fp32[0], STEPS, fp32[STEPS - 1], bf16[STEPS - 1],
           (bf16[STEPS - 1] - fp32[STEPS - 1]) / fp32[STEPS - 1]);
    /* the weights' bf16 copy is made again from the resumed weights (a stale or unrounded copy
     * would change the resumed steps) */
    check_resume(json, 2);
}

/* eval.blocks_per_sequence bounds the blocks an evaluation reads (each held-out sequence's
 * anchors are drawn as many, not train.max_anchors); the default evaluates all 4 here */
static void test_eval_blocks(void)
{
    char json[4096];
    const char *tiny = TINY("1", "");
    const char *at = strstr(tiny, "\"eval\": {") + strlen("\"eval\": {");
    snprintf(json, sizeof json, "%.*s\"blocks_per_sequence\": 2, %s", (int)(at - tiny), tiny, at);
    int64_t blocks[2] = { 0, 0 };
    const char *configs[2] = { tiny, json };
    for (int i = 0; i < 2; i++) {
        ddt_trainer *t = open_run(configs[i], NULL);
        if (!t)
            return;
        ddt_acceptance acc;
        char err[1024];
        check(ddt_trainer_eval(t, &acc, err, sizeof err) == 0, "eval: %s", err);
        blocks[i] = acc.blocks;
        ddt_trainer_close(t);
    }
    /* 4 held-out sequences: up to 4 anchors each by default, up to 2 with the bound */
    check(blocks[1] >= 1 && blocks[1] <= 4 * 2, "%lld blocks with blocks_per_sequence 2 (want 1..8)",
          (long long)blocks[1]);
    check(blocks[0] > blocks[1], "the default evaluated %lld blocks, no more than the bound's %lld",
          (long long)blocks[0], (long long)blocks[1]);
}

/* json with "devices": place in its target object */
static void with_place(const char *json, const char *place, char *out, size_t len)
{
    const char *at = strstr(json, "\"target\": {") + strlen("\"target\": {");
    snprintf(out, len, "%.*s\"devices\": \"%s\", %s", (int)(at - json), json, place, at);
}

/* target.devices "same" on CPU ranks with generated data: each rank's fp32 replica (the source's
 * seed, its own backend, the same CPU ops) samples the tokens the source's host target sampled
 * for the same indices (training and held-out), computes the features it computed, then the same
 * noise: the losses and the evaluation are the host run's bit for bit (equal losses need equal
 * tokens). The co-located run holds no target on the host: its host peak stays below one
 * replica's weights. 2 ranks, 3 steps, then an eval. */
static void test_colocated_same_losses(void)
{
    enum { STEPS = 3 };
    static const char *const places[2] = { "host", "same" };
    double losses[2][STEPS];
    ddt_acceptance acc[2];
    for (int k = 0; k < 2; k++) {
        char json[4096], err[1024] = "";
        with_place(TINY("2", ""), places[k], json, sizeof json);
        ddk_allocator_reset_peak(ddk_allocator_cpu());
        ddt_trainer *t = open_run(json, NULL);
        if (!t)
            return;
        const ddt_memory_plan *p = ddt_trainer_plan(t);
        check(p->target.placement == (k ? DDT_PLACE_SAME : DDT_PLACE_HOST),
              "target.devices \"%s\" on CPU ranks: placement %d", places[k], p->target.placement);
        run_steps(t, STEPS, losses[k], NULL);
        check(ddt_trainer_eval(t, &acc[k], err, sizeof err) == 0, "eval (%s): %s", places[k], err);
        const double host = (double)ddk_allocator_stats(ddk_allocator_cpu()).peak;
        if (k)
            check(host < (double)p->target.weights, "co-located: host peak %.0f, not below one replica's %lld "
                  "(a host target was opened?)", host, (long long)p->target.weights);
        printf("  # %s: host peak %.0f bytes (target weights %lld)\n", places[k], host,
               (long long)p->target.weights);
        ddt_trainer_close(t);
    }
    for (int i = 0; i < STEPS; i++)
        check(losses[1][i] == losses[0][i], "step %d: co-located %.9g, host %.9g (bit for bit)", i + 1,
              losses[1][i], losses[0][i]);
    check(acc[1].blocks == acc[0].blocks && acc[1].blocks > 0 &&
              ddt_acceptance_tau_chain(&acc[1]) == ddt_acceptance_tau_chain(&acc[0]) &&
              ddt_acceptance_tau_tree(&acc[1], 1) == ddt_acceptance_tau_tree(&acc[0], 1),
          "eval: co-located %lld blocks, tau %.9g, tree(8) %.9g; host %lld, %.9g, %.9g", (long long)acc[1].blocks,
          ddt_acceptance_tau_chain(&acc[1]), ddt_acceptance_tau_tree(&acc[1], 1), (long long)acc[0].blocks,
          ddt_acceptance_tau_chain(&acc[0]), ddt_acceptance_tau_tree(&acc[0], 1));
    printf("  # losses host %.9g %.9g %.9g, co-located %.9g %.9g %.9g; tau host %.6f, co-located %.6f\n",
           losses[0][0], losses[0][1], losses[0][2], losses[1][0], losses[1][1], losses[1][2],
           ddt_acceptance_tau_chain(&acc[0]), ddt_acceptance_tau_chain(&acc[1]));
}

/* json with target.devices n: a split of n target ranks */
static void with_split(const char *json, int n, char *out, size_t len)
{
    const char *at = strstr(json, "\"target\": {") + strlen("\"target\": {");
    snprintf(out, len, "%.*s\"devices\": %d, %s", (int)(at - json), json, n, at);
}

/* A split on CPU ranks (target ranks with their own fp32 replicas, each sampling and prefilling
 * its slice of a step's sequences one step ahead and copying the features into the drafter
 * ranks' second batch slots): the losses and the evaluation of the host target's run bit for bit,
 * with 1 target rank for 2 drafter ranks and with 3 for 1 (uneven slices of the 4 sequences), an
 * evaluation between steps while the next batch is in flight. */
static void test_split_losses(void)
{
    enum { STEPS = 4, RUNS = 4 };
    /* host on 2 ranks, the split 1 -> 2; host on 1 rank, the split 3 -> 1 */
    static const struct { int ranks, targets; } runs[RUNS] = { { 2, 0 }, { 2, 1 }, { 1, 0 }, { 1, 3 } };
    double losses[RUNS][STEPS];
    ddt_acceptance acc[RUNS];
    for (int k = 0; k < RUNS; k++) {
        char json[4096], err[1024] = "";
        if (runs[k].targets)
            with_split(TINY("2", ""), runs[k].targets, json, sizeof json);
        else
            with_place(TINY("2", ""), "host", json, sizeof json);
        if (runs[k].ranks == 1)
            memcpy(strstr(json, "\"devices\": 2,"), "\"devices\": 1,", strlen("\"devices\": 1,"));
        ddt_trainer *t = open_run(json, NULL);
        if (!t)
            return;
        const ddt_memory_plan *p = ddt_trainer_plan(t);
        check(p->target.placement == (runs[k].targets ? DDT_PLACE_SPLIT : DDT_PLACE_HOST) &&
                  p->target.devices == runs[k].targets,
              "target.devices %d: placement %d, %lld target ranks", runs[k].targets, p->target.placement,
              (long long)p->target.devices);
        run_steps(t, 2, losses[k], NULL);
        check(ddt_trainer_eval(t, &acc[k], err, sizeof err) == 0, "eval (%d target ranks): %s", runs[k].targets, err);
        run_steps(t, STEPS - 2, losses[k] + 2, NULL);
        ddt_trainer_close(t);
    }
    for (int k = 1; k < RUNS; k += 2) {
        for (int i = 0; i < STEPS; i++)
            check(losses[k][i] == losses[k - 1][i], "%d target rank(s) -> %d, step %d: %.9g, host %.9g (bit for bit)",
                  runs[k].targets, runs[k].ranks, i + 1, losses[k][i], losses[k - 1][i]);
        check(acc[k].blocks == acc[k - 1].blocks && acc[k].blocks > 0 &&
                  ddt_acceptance_tau_chain(&acc[k]) == ddt_acceptance_tau_chain(&acc[k - 1]),
              "eval: %d target rank(s) %lld blocks, tau %.9g; host %lld, %.9g", runs[k].targets,
              (long long)acc[k].blocks, ddt_acceptance_tau_chain(&acc[k]), (long long)acc[k - 1].blocks,
              ddt_acceptance_tau_chain(&acc[k - 1]));
        printf("  # %d drafter rank(s): losses host %.9g .. %.9g, split from %d target rank(s) %.9g .. %.9g; tau %.6f\n",
               runs[k].ranks, losses[k - 1][0], losses[k - 1][STEPS - 1], runs[k].targets, losses[k][0],
               losses[k][STEPS - 1], ddt_acceptance_tau_chain(&acc[k]));
    }
}

/* A split's checkpoint while the next batch is in flight records the cursor of the steps done:
 * the resumed run repeats the uninterrupted one bit for bit */
static void test_split_resume(void)
{
    char json[4096];
    with_split(TINY("2", ""), 2, json, sizeof json);
    check_resume(json, 3);
}

/* A split on CPU ranks: each drafter rank holds its drafter bytes and the second batch slot,
 * reading target rank 0's fp32 head in place (no frozen head of its own); each target rank its
 * replica, generator, prefill workspace and one sequence's send buffer. Both against the plan
 * (10%). */
static void test_plan_split_peak(void)
{
    char json[4096];
    with_split(TINY("1", ""), 1, json, sizeof json);
    const ddt_memory_plan *p;
    ddt_trainer *t = one_step_run(json, &p);
    if (!t)
        return;
    check(p->target.placement == DDT_PLACE_SPLIT && p->frozen_head == 0 && p->target.handoff == p->batch &&
              p->target.send > 0 && p->target.weights > 0,
          "split on CPU ranks: placement %d, frozen head %lld, hand-off %lld (batch %lld), send %lld", p->target.placement,
          (long long)p->frozen_head, (long long)p->target.handoff, (long long)p->batch, (long long)p->target.send);
    const double predicted = (double)p->peak, measured = (double)ddk_allocator_stats(ddk_allocator_cpu_rank(0)).peak,
                 tpredicted = (double)p->target.peak,
                 tmeasured = (double)ddk_allocator_stats(ddk_allocator_cpu_rank(1)).peak;
    check(fabs(measured - predicted) <= 0.10 * predicted, "drafter rank 0's peak %.0f vs the plan's %.0f (%+.1f%%)",
          measured, predicted, 100.0 * (measured - predicted) / predicted);
    check(fabs(tmeasured - tpredicted) <= 0.10 * tpredicted, "target rank 0's peak %.0f vs the plan's %.0f (%+.1f%%)",
          tmeasured, tpredicted, 100.0 * (tmeasured - tpredicted) / tpredicted);
    printf("  # drafter rank: plan %.0f bytes, measured %.0f (%+.1f%%); target rank: plan %.0f, measured %.0f (%+.1f%%)\n",
           predicted, measured, 100.0 * (measured - predicted) / predicted, tpredicted, tmeasured,
           100.0 * (tmeasured - tpredicted) / tpredicted);
    ddt_trainer_close(t);
}

/* A co-located CPU run's rank 0 holds the drafter's bytes, its replica and its generator (fp32
 * weights and one sequence's cache and sampling workspace held, its prefill's workspace before
 * the step, no frozen head of its own): its measured peak against the plan's SAME figure (10%).
 * Generated data opens no host target and no source: the host holds the held-out tokens alone
 * (the plan's host figure), far below one replica. */
static void test_plan_colocated_peak(void)
{
    char json[4096];
    with_place(TINY("1", ""), "same", json, sizeof json);
    const ddt_memory_plan *p;
    ddt_trainer *t = one_step_run(json, &p);
    if (!t)
        return;
    ddt_target_footprint f;
    char err[256];
    ddt_run_footprint(ddt_trainer_config(t), &f, err, sizeof err);
    check(p->target.placement == DDT_PLACE_SAME && p->frozen_head == 0 && p->target.weights > 0 &&
              p->target.cache == f.cache_bytes && p->target.queue == 0 && p->target.host > 0 &&
              p->target.host < p->target.weights,
          "co-located on a CPU rank, generating: placement %d, frozen head %lld, replica %lld, generator %lld "
          "(one: %lld), queue %lld, host %lld", p->target.placement, (long long)p->frozen_head,
          (long long)p->target.weights, (long long)p->target.cache, (long long)f.cache_bytes,
          (long long)p->target.queue, (long long)p->target.host);
    double predicted = (double)p->peak, measured = (double)ddk_allocator_stats(ddk_allocator_cpu_rank(0)).peak;
    check(fabs(measured - predicted) <= 0.10 * predicted, "rank 0's peak %.0f vs the plan's %.0f (%+.1f%%)", measured,
          predicted, 100.0 * (measured - predicted) / predicted);
    const double host_plan = (double)p->target.host, host = (double)ddk_allocator_stats(ddk_allocator_cpu()).peak;
    check(host == host_plan, "host peak %.0f, the plan's %.0f (the held-out tokens alone)", host, host_plan);
    printf("  # rank 0: plan %.0f bytes (replica %lld, generator %lld), measured %.0f (%+.1f%%); host: plan %.0f, "
           "measured %.0f\n", predicted, (long long)p->target.weights, (long long)p->target.cache, measured,
           100.0 * (measured - predicted) / predicted, host_plan, host);
    ddt_trainer_close(t);
}


/* ------------------------------------------------------------------------------------------
 * eval.speculative
 */

/* TINY with "speculative": spec in its eval object */
static void with_spec(const char *json, const char *spec, char *out, size_t len)
{
    const char *at = strstr(json, "\"eval\": {") + strlen("\"eval\": {");
    snprintf(out, len, "%.*s\"speculative\": %s, %s", (int)(at - json), json, spec, at);
}

static void test_spec_config(void)
{
    static const struct { const char *spec, *field; } cases[] = {
        { "3", "eval.speculative" },
        { "{\"prompts\": 0}", "eval.speculative.prompts" },
        { "{\"prompt_len\": 24}", "eval.speculative.prompt_len" },   /* train.seq_len 24 */
        { "{\"gen_len\": 1.5}", "eval.speculative.gen_len" },
        { "{\"tree_budgets\": [0]}", "eval.speculative.tree_budgets" },
        { "{\"tree_budgets\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", "eval.speculative.tree_budgets" },
        { "{\"tree_budgets\": [65537]}", "eval.speculative.tree_budgets" },
        { "{\"every_evals\": 0}", "eval.speculative.every_evals" },
        { "{}", "eval.speculative.prompt_len" },   /* the default 64 is not below train.seq_len 24 */
        { "{\"temperature\": 1}", "eval.speculative.temperature" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[4096], err[512], field[128];
        ddt_run_config c;
        with_spec(TINY("1", ""), cases[i].spec, json, sizeof json);
        int rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
        check(rc == -EINVAL && !strcmp(field, cases[i].field), "%s: rc %d field \"%s\" (want %s): %s", cases[i].spec,
              rc, field, cases[i].field, err);
    }
    /* where it cannot run: the placement's sentence names the field */
    char json[4096], split[4096], err[512], field[128];
    ddt_run_config c;
    with_spec(TINY("1", ""), "{\"prompt_len\": 10}", json, sizeof json);   /* the default 64 is train.seq_len's 24 and more */
    const char *at = strstr(json, "\"target\": {") + strlen("\"target\": {");
    snprintf(split, sizeof split, "%.*s\"devices\": 1, %s", (int)(at - json), json, at);
    int rc = ddt_run_config_parse(split, strlen(split), &c, err, sizeof err, field, sizeof field);
    check(rc == -EINVAL && !strcmp(field, "eval.speculative") && strstr(err, "split"), "a split: %d %s: %s", rc,
          field, err);
    const char *shards = "{\"target\": {\"kind\": \"shards\", \"path\": \"/x\", \"shards\": [\"/x/a.safetensors\"]},"
                         " \"eval\": {\"speculative\": {}}}";
    rc = ddt_run_config_parse(shards, strlen(shards), &c, err, sizeof err, field, sizeof field);
    check(rc == -EINVAL && !strcmp(field, "eval.speculative") && strstr(err, "shards"), "shards: %d %s: %s", rc,
          field, err);
    /* no held-out sequences: no prompts */
    char none[4096];
    const char *h = strstr(json, "\"heldout\": 4");
    snprintf(none, sizeof none, "%.*s\"heldout\": 0%s", (int)(h - json), json, h + strlen("\"heldout\": 4"));
    rc = ddt_run_config_parse(none, strlen(none), &c, err, sizeof err, field, sizeof field);
    check(rc == -EINVAL && !strcmp(field, "eval.speculative") && strstr(err, "train.heldout"), "heldout 0: %d %s: %s",
          rc, field, err);
    /* the defaults, and absence */
    check(ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field) == 0, "defaults: %s", err);
    check(c.spec == 1 && c.spec_prompts == 8 && c.spec_prompt_len == 10 && c.spec_gen_len == 64 &&
              c.spec_n_budgets == 2 && c.spec_budgets[0] == 8 && c.spec_budgets[1] == 32 && c.spec_every_evals == 1,
          "defaults: %d %lld %lld %lld %d", c.spec, (long long)c.spec_prompts, (long long)c.spec_prompt_len,
          (long long)c.spec_gen_len, c.spec_n_budgets);
    ddt_run_config_free(&c);
    const char *tiny = TINY("1", "");
    check(ddt_run_config_parse(tiny, strlen(tiny), &c, err, sizeof err, field, sizeof field) == 0 && c.spec == 0,
          "absent: spec %d", c.spec);
    ddt_run_config_free(&c);
}

/* the run's evals rows (GET /runs/{id}/evals), parsed */
static cJSON *read_evals(const char *db, const char *id)
{
    char *text = NULL, err[512];
    size_t len = 0;
    int rc = ddt_store_read_evals(db, id, -1, &text, &len, err, sizeof err);
    check(rc == 0, "read evals: %s", err);
    cJSON *o = rc == 0 ? cJSON_Parse(text) : NULL;
    free(text);
    return o;
}

/* one run with eval.speculative: the baseline (step 0) and 2 steps, evaluations every step */
static void spec_run(const char *place, ddt_speculate_totals *at0, ddt_speculate_totals *at1, int *speculated)
{
    char base[4096], json[4096], placed[4096], db[512], err[1024], field[128];
    ddt_speculate_totals live1;
    memset(&live1, 0, sizeof live1);
    with_spec(TINY("1", ""), "{\"prompts\": 3, \"prompt_len\": 10, \"gen_len\": 12, \"tree_budgets\": [2, 3, 8], "
              "\"every_evals\": 2}", base, sizeof base);
    /* eval.every_steps 1 (the eval object's own every_steps) */
    const char *at = strstr(base, "\"eval\": {");
    const char *e = strstr(at, "\"every_steps\": 100");
    snprintf(json, sizeof json, "%.*s\"every_steps\": 1%s", (int)(e - base), base, e + strlen("\"every_steps\": 100"));
    if (place)
        with_place(json, place, placed, sizeof placed);
    else
        snprintf(placed, sizeof placed, "%s", json);
    snprintf(db, sizeof db, "%s/spec-%s.db", state_dir, place ? place : "host");
    ddt_store *store = NULL;
    if (ddt_store_open(db, &store, err, sizeof err)) {
        check(0, "store: %s", err);
        return;
    }
    ddt_trainer *t = NULL;
    int rc = ddt_trainer_open(placed, strlen(placed), state_dir, NULL, 0, store, &t, err, sizeof err, field,
                              sizeof field);
    check(rc == 0, "open (%s): %s", place ? place : "host", err);
    for (int k = 0; rc == 0 && k < 3; k++) {   /* evaluations 0, 1, 2: every_evals 2 speculates on 0 and 2 */
        ddt_trainer_outcome o;
        rc = ddt_trainer_advance(t, &o, err, sizeof err);
        check(rc == 0 && !*o.warning, "advance %d: %s %s", k, err, o.warning);
        speculated[k] = o.speculated;
        if (k == 0)
            *at0 = o.spec;
        if (k == 1 && (rc = ddt_trainer_checkpoint(t, err, sizeof err)))   /* step 1's weights, kept */
            check(0, "checkpoint: %s", err);
        if (k == 1 && rc == 0) {   /* and step 1's live weights on request, for the checkpoint's below */
            ddt_trainer_spec_request live = { .step = -1, .n_budgets = -1 };
            check((rc = ddt_trainer_speculate(t, &live, &live1, err, sizeof err)) == 0, "live at 1: %s", err);
        }
    }
    /* step 1 was not speculated (every_evals 2): its checkpoint's weights now, at step 2 */
    ddt_trainer_spec_request q = { .step = 1, .n_budgets = -1 };
    if (rc == 0)
        check(ddt_trainer_speculate(t, &q, at1, err, sizeof err) == 0, "speculate at checkpoint 1: %s", err);
    /* the checkpoint's weights decode as the live ones did at its step */
    int same_as_live = at1->chain_tokens == live1.chain_tokens && at1->chain_calls == live1.chain_calls;
    for (int i = 0; i < at1->n_budgets; i++)
        same_as_live &= at1->tree_tokens[i] == live1.tree_tokens[i] && at1->tree_calls[i] == live1.tree_calls[i];
    check(rc == 0 && same_as_live && live1.prompts == 3, "checkpoint 1 vs live at 1: %lld/%lld vs %lld/%lld",
          (long long)at1->chain_tokens, (long long)at1->chain_calls, (long long)live1.chain_tokens,
          (long long)live1.chain_calls);
    /* beyond the caps, or no such checkpoint: refused */
    ddt_speculate_totals no;
    ddt_trainer_spec_request bad[] = { { .step = -1, .n_budgets = 1, .budgets = { 9 } },
                                       { .step = -1, .n_budgets = -1, .gen_len = 13 },
                                       { .step = -1, .n_budgets = -1, .prompts = 4 },
                                       { .step = 7, .n_budgets = -1 } };
    const int want[] = { -EINVAL, -EINVAL, -EINVAL, -ENOENT };
    for (int i = 0; rc == 0 && i < 4; i++) {
        int got = ddt_trainer_speculate(t, &bad[i], &no, err, sizeof err);
        check(got == want[i], "bad request %d: %d (want %d): %s", i, got, want[i], err);
    }
    char id[64];
    snprintf(id, sizeof id, "%s", t ? ddt_trainer_run_id(t) : "");
    ddt_trainer_close(t);
    ddt_store_close(store);   /* commits what was queued */
    cJSON *root = rc == 0 ? read_evals(db, id) : NULL;
    const cJSON *evals = cJSON_GetObjectItemCaseSensitive(root, "evals");
    check(cJSON_GetArraySize(evals) == 3, "%d evals rows (want steps 0, 1, 2)", cJSON_GetArraySize(evals));
    for (int k = 0; k < cJSON_GetArraySize(evals); k++) {
        const cJSON *row = cJSON_GetArrayItem(evals, k);
        const cJSON *tau = cJSON_GetObjectItemCaseSensitive(row, "tau_spec");
        const cJSON *tree = cJSON_GetObjectItemCaseSensitive(row, "tau_spec_tree");
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(row, "spec");
        /* every row speculated: 0 and 2 by the cadence, 1 by the request on its checkpoint */
        check(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(row, "tau_chain")), "row %d lost its tau_chain", k);
        check(cJSON_IsNumber(tau) && tau->valuedouble >= 1 && tau->valuedouble <= 4, "row %d tau_spec", k);
        check(cJSON_GetArraySize(tree) == 3 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(tree, "8")),
              "row %d tau_spec_tree", k);
        check(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(spec, "greedy_equal")) &&
                  cJSON_GetObjectItemCaseSensitive(spec, "prompts")->valuedouble == 3 &&
                  cJSON_GetObjectItemCaseSensitive(spec, "seconds")->valuedouble > 0,
              "row %d spec", k);
        check(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(spec, "weights")), k == 1 ? "checkpoint" : "live"),
              "row %d weights", k);
    }
    cJSON_Delete(root);
}

static void check_spec_totals(const ddt_speculate_totals *s, const char *what)
{
    const double tau = ddt_speculate_tau(s);
    check(s->prompts == 3 && s->mismatched == 0, "%s: %lld prompts, %lld not greedy-equal", what,
          (long long)s->prompts, (long long)s->mismatched);
    check(s->generated == 3 * 12, "%s: %lld generated (want 3 x 12)", what, (long long)s->generated);
    check(tau >= 1 && tau <= 4, "%s: tau_spec %.4f outside [1, B = 4]", what, tau);
    for (int i = 1; i < 3; i++)   /* budgets 3 and 8 >= B - 1: the chain is in the tree */
        check(ddt_speculate_tau_tree(s, i) >= tau, "%s: tau_spec_tree(%lld) %.4f below the chain's %.4f", what,
              (long long)s->budgets[i], ddt_speculate_tau_tree(s, i), tau);
}

static void test_spec_eval(void)
{
    ddt_speculate_totals host[2], same[2];
    int spec_host[3] = { 0 }, spec_same[3] = { 0 };
    spec_run(NULL, &host[0], &host[1], spec_host);
    spec_run("same", &same[0], &same[1], spec_same);
    check(spec_host[0] && !spec_host[1] && spec_host[2], "every_evals 2: speculated %d %d %d (want 1 0 1)",
          spec_host[0], spec_host[1], spec_host[2]);
    printf("  # tau_spec host %.4f (tree 2 %.4f, 3 %.4f, 8 %.4f), same %.4f; checkpoint 1 %.4f\n",
           ddt_speculate_tau(&host[0]), ddt_speculate_tau_tree(&host[0], 0), ddt_speculate_tau_tree(&host[0], 1),
           ddt_speculate_tau_tree(&host[0], 2), ddt_speculate_tau(&same[0]), ddt_speculate_tau(&host[1]));
    check_spec_totals(&host[0], "host, step 0");
    check_spec_totals(&host[1], "host, checkpoint 1");
    check_spec_totals(&same[0], "same, step 0");
    /* the co-located fp32 replica is the host target on another CPU backend: the same decoding */
    check(host[0].chain_tokens == same[0].chain_tokens && host[0].chain_calls == same[0].chain_calls &&
              host[1].chain_calls == same[1].chain_calls,
          "host vs same: %lld/%lld vs %lld/%lld", (long long)host[0].chain_tokens, (long long)host[0].chain_calls,
          (long long)same[0].chain_tokens, (long long)same[0].chain_calls);
}

/* without eval.speculative: no speculation at the cadence, one on request with the defaults */
static void test_spec_lazy(void)
{
    ddt_trainer *t = open_run(TINY("1", ""), NULL);
    if (!t)
        return;
    char err[1024];
    ddt_trainer_outcome o;
    check(ddt_trainer_advance(t, &o, err, sizeof err) == 0 && o.evaluated && !o.speculated, "baseline: %s", err);
    ddt_speculate_totals s;
    ddt_trainer_spec_request q = { .step = -1, .n_budgets = 1, .budgets = { 32 }, .gen_len = 5 };
    check(ddt_trainer_speculate(t, &q, &s, err, sizeof err) == 0, "speculate: %s", err);
    /* the defaults: min(8, train.heldout 4) prompts */
    check(s.prompts == 4 && s.mismatched == 0 && s.generated == 4 * 5 && s.n_budgets == 1 &&
              ddt_speculate_tau_tree(&s, 0) >= ddt_speculate_tau(&s),
          "lazy: %lld prompts, %lld generated, %lld mismatched", (long long)s.prompts, (long long)s.generated,
          (long long)s.mismatched);
    q.budgets[0] = 33;   /* above the default cap, 32 */
    check(ddt_trainer_speculate(t, &q, &s, err, sizeof err) == -EINVAL && strstr(err, "tree_budgets"), "33: %s", err);
    ddt_trainer_close(t);
}

/* A DFlash2 run's evaluation (SPEC.md 2.1): the evals row holds its path selector's figures
 * and its unary head's beside (unary); at step 0 (Bs = 0) the selector picks the unary argmax,
 * so tau_chain and acc_k agree (the trees need not: the lattice holds K = 4 candidates a slot).
 * A DFlash run's row has unary null. */
static void test_dflash2_eval(void)
{
    char dflash2[4096];
    const char *tiny = TINY("1", "");
    const char *at = strstr(tiny, "\"drafter\": {") + strlen("\"drafter\": {");
    snprintf(dflash2, sizeof dflash2, "%.*s\"architecture\": \"dflash2\", \"selector_rank\": 8, "
             "\"selector_top_k\": 4, %s", (int)(at - tiny), tiny, at);
    const char *configs[2] = { tiny, dflash2 };
    for (int v = 0; v < 2; v++) {
        char db[512], err[1024], field[128], id[64] = "";
        snprintf(db, sizeof db, "%s/arch-%d.db", state_dir, v);
        ddt_store *store = NULL;
        if (ddt_store_open(db, &store, err, sizeof err)) {
            check(0, "store: %s", err);
            return;
        }
        ddt_trainer *t = NULL;
        int rc = ddt_trainer_open(configs[v], strlen(configs[v]), state_dir, NULL, 0, store, &t, err, sizeof err,
                                  field, sizeof field);
        check(rc == 0, "open (%s): %s [%s]", v ? "dflash2" : "dflash", err, field);
        ddt_trainer_outcome o;
        if (rc == 0) {   /* the baseline evaluation at step 0 */
            rc = ddt_trainer_advance(t, &o, err, sizeof err);
            check(rc == 0 && o.evaluated && o.acceptance.selector == v && o.acceptance.blocks > 0,
                  "advance: %s (evaluated %d, selector %d)", err, o.evaluated, o.acceptance.selector);
            snprintf(id, sizeof id, "%s", ddt_trainer_run_id(t));
        }
        ddt_trainer_close(t);
        ddt_store_close(store);
        cJSON *root = rc == 0 ? read_evals(db, id) : NULL;
        const cJSON *row = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "evals"), 0);
        const cJSON *unary = cJSON_GetObjectItemCaseSensitive(row, "unary");
        if (!v) {
            check(row && cJSON_IsNull(unary), "a DFlash run's evals row has a unary entry");
        } else {
            const cJSON *tau = cJSON_GetObjectItemCaseSensitive(unary, "tau_chain"),
                        *tree = cJSON_GetObjectItemCaseSensitive(unary, "tau_tree");
            check(cJSON_IsNumber(tau) && tau->valuedouble == cJSON_GetObjectItemCaseSensitive(row, "tau_chain")->valuedouble,
                  "unary tau_chain missing or not the selector's at step 0");
            check(cJSON_Compare(cJSON_GetObjectItemCaseSensitive(unary, "acc"),
                                cJSON_GetObjectItemCaseSensitive(row, "acc"), 1),
                  "unary acc missing or not the selector's at step 0");
            check(cJSON_GetArraySize(tree) == 2 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(tree, "8")),
                  "unary tau_tree: want budgets 2 and 8");
            if (cJSON_IsNumber(tau))
                printf("  # step 0: tau_chain %.4f (unary %.4f), tau_tree(8) %.4f (unary %.4f)\n",
                       ddt_acceptance_tau_chain(&o.acceptance), tau->valuedouble,
                       ddt_acceptance_tau_tree(&o.acceptance, 1),
                       cJSON_GetObjectItemCaseSensitive(tree, "8")->valuedouble);
        }
        cJSON_Delete(root);
    }
}

/* The logits (B, V) and labels (B) of the block at candidate p of rank 0's sequence i under
 * weights w, recomputed from public calls: the drafter's forward of that one block, its logits on
 * the host in double; the labels the data's tokens, or (ce_target "teacher") the argmax of the
 * target's logits from its final hidden state before each, in double */
static void block_logits(ddt_trainer *t, const ddt_drafter_weights *w, int64_t i, int32_t p, float *logits,
                         int32_t *labels)
{
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    const rank_state *rs = &t->rank[0];
    const int64_t S = c->seq_len, B = d->block_size, H = d->hidden, V = d->vocab, LH = d->taps * H;
    const int32_t *ids = rs->b.input_ids + i * S;
    const uint8_t *mask = rs->b.loss_mask + i * S;
    const float *lm_head = rs->lm_head;
    int32_t anchor = p;
    uint8_t keep = 1;
    ddt_batch b = { 1, S, 1, ids, mask, rs->b.features + i * S * LH, NULL, &anchor, &keep, NULL };
    const ddt_head head = { rs->embed, rs->lm_head, 0 };
    float *hs = xcalloc((size_t)(B * H), sizeof(float));
    check(ddt_drafter_forward(rs->be, d, w, &head, &b, hs) == 0, "forward at %d", p);
    for (int64_t k = 0; k < B; k++) {
        for (int64_t v = 0; v < V; v++) {
            double z = 0;
            for (int64_t h = 0; h < H; h++)
                z += (double)hs[k * H + h] * lm_head[v * H + h];
            logits[k * V + v] = (float)z;
        }
        labels[k] = k >= 1 && p + k < S && mask[p + k] ? ids[p + k] : -1;
        if (labels[k] >= 0 && c->ce_target_teacher) {   /* the teacher's argmax after p + k - 1 */
            const float *th = rs->b.teacher + (i * S + p + k - 1) * H;
            double best = -INFINITY;
            for (int64_t v = 0; v < V; v++) {
                double z = 0;
                for (int64_t h = 0; h < H; h++)
                    z += (double)th[h] * lm_head[v * H + h];
                if (z > best)
                    best = z, labels[k] = (int32_t)v;
            }
        }
    }
    free(hs);
}

/* The accepted length + 1 of that block (SPEC.md 6): the chain's, or DDTree's with
 * train.tree_budget nodes */
static int32_t block_length(ddt_trainer *t, const ddt_drafter_weights *w, int64_t i, int32_t p, int tree)
{
    const ddt_drafter_config *d = &t->cfg.drafter;
    float *logits = xcalloc((size_t)(d->block_size * d->vocab), sizeof(float));
    int32_t labels[DDT_MAX_SLOTS];
    block_logits(t, w, i, p, logits, labels);
    ddt_acceptance a;
    ddt_acceptance_init(&a, &t->cfg.tree_budget, 1);
    ddt_acceptance_add_block(&a, logits, d->block_size, d->vocab, labels);
    free(logits);
    return 1 + (int32_t)(tree ? a.tree_sum[0] : a.chain_sum);
}

/* train.anchors walk and tree_walk (walk_share 1): after a step, rank 0's anchors of every
 * sequence are starts of the walk that block_length's lengths under the step's weights give
 * (min(A, starts) of them, the rest other candidates), not SPEC.md 2's uniform draw */
static void test_walk_anchors(void)
{
    static const char *const fields[2] = {
        "\"anchors\": \"walk\", \"walk_share\": 1, ",   /* the teacher's labels */
        "\"anchors\": \"tree_walk\", \"walk_share\": 1, \"tree_budget\": 64, \"ce_target\": \"data\", ",
    };
    for (int tree = 0; tree < 2; tree++) {
        char json[4096], longer[4096], greedy[4096];
        with_steps(TINY("1", ""), 40, longer, sizeof longer);
        with_train(longer, fields[tree], json, sizeof json);
        const char *at = strstr(json, "\"kind\": \"synthetic\", ");   /* greedy data: walks longer than 1 */
        snprintf(greedy, sizeof greedy, "%.*s\"temperature\": 0, %s", (int)(at - json), json, at);
        ddt_trainer *t = open_run(greedy, NULL);
        if (!t)
            return;
        const ddt_run_config *c = &t->cfg;
        const int64_t S = c->seq_len, A = c->max_anchors;
        enum { STEPS = 40 };
        double losses[STEPS];
        float *before = xcalloc((size_t)t->total, sizeof(float));
        if (run_steps(t, STEPS - 1, losses, NULL) == 0) {   /* the drafter taught some blocks */
            memcpy(before, t->params, (size_t)t->total * sizeof(float));
            run_steps(t, 1, losses, NULL);
        }
        ddt_drafter_weights w;
        ddt_drafter_bind(&c->drafter, before, &w);
        const rank_state *rs = &t->rank[0];
        int64_t skipped = 0, uniform = 0;   /* candidates the walks skip; sequences with uniform's anchors */
        for (int64_t i = 0; i < rs->nseq && !case_failed; i++) {
            const uint8_t *mask = rs->b.loss_mask + i * S;
            const int32_t *anchors = rs->b.anchors + i * A;
            const uint8_t *keep = rs->b.keep + i * A;
            uint8_t *start = xcalloc((size_t)S, 1);
            int64_t starts = 0, candidates = 0, kept = 0, from_walk = 0;
            for (int64_t p = 0; p + 1 < S; p++) {
                const int candidate = mask[p] && mask[p + 1];
                candidates += candidate;
                if (candidate && (p == 0 || starts == 0 || start[p])) {
                    start[p] = 1;
                    starts++;
                    int32_t len = block_length(t, &w, i, (int32_t)p, tree);
                    if (p + len < S)
                        start[p + len] = 1;   /* where the walk lands next (masked: none here) */
                }
            }
            skipped += candidates - starts;
            for (int64_t j = 0; j < A && keep[j]; j++) {
                kept++;
                from_walk += start[anchors[j]];
            }
            const int64_t want = starts < A ? starts : A;
            check(kept == (candidates < A ? candidates : A) && from_walk == want,
                  "%s, sequence %lld: %lld anchors, %lld of them walk starts; want %lld starts of %lld",
                  tree ? "tree_walk" : "walk", (long long)i, (long long)kept, (long long)from_walk, (long long)want,
                  (long long)starts);
            int32_t u[64];
            uint8_t uk[64];
            ddt_sample_anchors(mask, S, A, ddt_batch_seed(c->seed, STEPS - 1, rs->first + i, SEED_ANCHORS), u, uk);
            uniform += memcmp(u, anchors, (size_t)A * sizeof(int32_t)) == 0;
            free(start);
        }
        check(skipped > 0, "%s: the walks skipped no candidate (every block accepted nothing): the case "
              "tells nothing", tree ? "tree_walk" : "walk");
        check(uniform < rs->nseq, "%s: every sequence has the uniform draw's anchors", tree ? "tree_walk" : "walk");
        printf("  # %s: %lld candidates skipped by the walks of %lld sequences\n", tree ? "tree_walk" : "walk",
               (long long)skipped, (long long)rs->nseq);
        free(before);
        ddt_trainer_close(t);
    }
}

/* the walk and the tree term on 2 ranks resume bit for bit: they depend on (seed, step, weights) */
static void test_walk_resume(void)
{
    char json[4096];
    with_train(TINY("2", ""), "\"anchors\": \"walk\", \"walk_share\": 0.5, \"tree_weight\": 1, ", json,
               sizeof json);
    check_resume(json, 4);
}

/* train.tree_weight: after a step, every kept block's slot scales are 1 + 4 lambda times the
 * sum over the deeper labels' prefixes of sigma'(margin), the margins recomputed here from the
 * block's logits under the step's weights (ddt_tree_margins); non-increasing along the block,
 * above 1 somewhere; and the run's loss is not the one without the term */
static void test_tree_term(void)
{
    char json[4096], plain[4096];
    with_train(TINY("1", ""), "\"tree_weight\": 2, \"tree_budget\": 6, \"ce_target\": \"data\", ", json, sizeof json);
    with_train(TINY("1", ""), "\"ce_target\": \"data\", ", plain, sizeof plain);
    double with_term[3] = { 0 }, without[3] = { 0 };
    ddt_trainer *t = open_run(plain, NULL);
    if (!t)
        return;
    run_steps(t, 3, without, NULL);
    ddt_trainer_close(t);
    if (!(t = open_run(json, NULL)))
        return;
    const ddt_run_config *c = &t->cfg;
    const int64_t A = c->max_anchors, B = c->drafter.block_size, V = c->drafter.vocab;
    float *before = xcalloc((size_t)t->total, sizeof(float)), *logits = xcalloc((size_t)(B * V), sizeof(float));
    if (run_steps(t, 2, with_term, NULL) == 0) {
        memcpy(before, t->params, (size_t)t->total * sizeof(float));
        run_steps(t, 1, with_term + 2, NULL);
    }
    check(with_term[0] != without[0], "the tree term left the loss at %.9g", without[0]);
    ddt_drafter_weights w;
    ddt_drafter_bind(&c->drafter, before, &w);
    const rank_state *rs = &t->rank[0];
    int64_t above = 0;
    double worst = 0;
    for (int64_t i = 0; i < rs->nseq; i++)
        for (int64_t j = 0; j < A && rs->b.keep[i * A + j]; j++) {
            int32_t labels[DDT_MAX_SLOTS];
            double z[DDT_MAX_SLOTS], tail = 0;
            block_logits(t, &w, i, rs->b.anchors[i * A + j], logits, labels);
            double label_logp[DDT_MAX_SLOTS] = { 0 };
            for (int64_t k = 1; k < B && labels[k] >= 0; k++) {   /* log-softmax in double */
                double m = -INFINITY, sum = 0;
                for (int64_t v = 0; v < V; v++)
                    m = fmax(m, logits[k * V + v]);
                for (int64_t v = 0; v < V; v++)
                    sum += exp(logits[k * V + v] - m);
                label_logp[k] = logits[k * V + labels[k]] - m - log(sum);
            }
            ddt_block_ranks ranks;
            ddt_block_ranks_open(&ranks, logits, B, V, c->tree_budget);
            const int64_t D = ddt_tree_margins(&ranks, B, c->tree_budget, labels, label_logp, z);
            ddt_block_ranks_close(&ranks);
            const float *scale = rs->slot_scale + (i * A + j) * B;
            for (int64_t k = B - 1; k >= 1; k--) {
                if (k <= D)
                    tail += 1.0 / (1.0 + exp(-z[k])) * (1.0 - 1.0 / (1.0 + exp(-z[k])));
                worst = fmax(worst, fabs(scale[k] - (1.0 + 4.0 * c->tree_weight * tail)));
                above += scale[k] > 1.0f;
                if (k + 1 < B)
                    check(scale[k] >= scale[k + 1], "block %lld: slot %lld's scale %g below the next's %g",
                          (long long)j, (long long)k, scale[k], scale[k + 1]);
            }
        }
    check(worst < 1e-4, "the slot scales differ from the recomputed margins' by %.3g", worst);
    printf("  # %lld slots scaled above 1; loss %.6f with the term, %.6f without (step 1)\n", (long long)above,
           with_term[0], without[0]);
    free(before), free(logits);
    ddt_trainer_close(t);
}

int main(void)
{
    if (!mkdtemp(state_dir)) {
        perror("mkdtemp");
        return 1;
    }
    make_cluster_id();
    static const struct { const char *name; void (*fn)(void); } cases[] = {
        { "run config errors name the field", test_config_errors },
        { "run configs: precision, devices, cluster parsed", test_config_good },
        { "devices resolved on 0, 1, 2, 8 GPUs: idle ranks, GPU head_dim", test_config_devices },
        { "a split's target ranks resolved on 0 and 8 GPUs", test_split_devices },
        { "what a node cannot run is refused at open, naming the field", test_open_refuses },
        { "a GPU the node lacks fails at open, nothing left behind", test_missing_gpu },
        { "eval.blocks_per_sequence bounds the evaluated blocks", test_eval_blocks },
        { "a DFlash2 run's eval: the selector's figures, the unary head's beside", test_dflash2_eval },
        { "eval.speculative: refused where it cannot run, defaults", test_spec_config },
        { "eval.speculative: lossless, 1 <= tau <= B, tree >= chain, rows, checkpoints", test_spec_eval },
        { "speculation on request without eval.speculative", test_spec_lazy },
        { "train.precision bf16: close to fp32, not identical", test_bf16_run },
        { "train.anchors walk, tree_walk: the anchors are the walk's starts", test_walk_anchors },
        { "train.tree_weight: the slots' scales from the tree's margins", test_tree_term },
        { "exact resume, the walk and the tree term on 2 ranks", test_walk_resume },
        { "the walk and the tree term: 1, 2, 3 ranks and 2 micro-batches agree", test_walk_ranks },
        { "exact resume", test_exact_resume },
        { "exact resume, dflash2 on 2 ranks", test_dflash2_resume },
        { "the step's selector figures (dflash2), none (dflash)", test_selector_record },
        { "1 rank vs 2 ranks vs 3 ranks vs 2 micro-batches", test_ranks },
        { "out-of-memory recovery", test_oom_recovery },
        { "plan vs measured peak", test_plan_vs_peak },
        { "plan vs measured peak, dflash2", test_plan_vs_peak_dflash2 },
        { "the target's plan vs the host's peak", test_plan_target_host },
        { "plan vs measured peak with a 151680-token vocabulary on CPU", test_plan_real_vocab },
        { "target.devices same on CPU ranks: the host run's losses bit for bit", test_colocated_same_losses },
        { "co-located generated data: exact resume from the trainer's cursor", test_colocated_resume },
        { "co-located plan vs rank 0's and the host's peaks", test_plan_colocated_peak },
        { "a split on CPU ranks: the host run's losses and evaluation bit for bit", test_split_losses },
        { "a split: exact resume with the next batch in flight", test_split_resume },
        { "a split's plan vs the drafter and target ranks' peaks", test_plan_split_peak },
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
