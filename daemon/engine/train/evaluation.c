/* evaluation.c: the evaluations on held-out data, driven on rank 0. Acceptance
 * (ddt_trainer_eval): the drafter's blocks against labels as training has them, recorded as an
 * eval; a DFlash2 drafter's along its path selector (SPEC.md 2.1), its unary head's figures
 * stored beside (the evals row's unary_json). Speculative decoding (ddt_trainer_speculate;
 * eval.speculative, POST /runs/{id}/speculate; SPEC.md section 7): rank 0 speculates with its own weights (or a
 * checkpoint's, brought to its memory) over the target beside it: its co-located replica, or on
 * CPU ranks the source's host target (read-only; the speculator keeps its own cache, so the
 * loader thread may use the target meanwhile). Its speculator is opened once, at open with
 * eval.speculative, else at the first request. Not here: a split's target (on other devices) and
 * GPU ranks with a host target.
 * Tested by tests/engine/train/test_trainer.c (eval.blocks_per_sequence; a DFlash2 run's selector
 * and unary figures, equal at step 0 where Bs = 0; co-located and split evaluations equal to the
 * host target's; eval.speculative's refusals, figures, every_evals, a checkpoint's
 * weights, the request's caps), tests/daemon/api_e2e.py (speculate: POST /runs/ID/speculate) and
 * tests/engine/train/test_step_cuda.c (a GPU run's evaluation against the CPU's; skipped without a GPU).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/ddt_time.h"
#include "base/errors.h"
#include "data/batch.h"
#include "eval/selector.h"
#include "record/checkpoint.h"
#include "split.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Acceptance on held-out sequences
 */

void ddt_head_logits(const ddk_backend *be, const ddt_head *head, int64_t rows, int64_t V, int64_t H,
                     const float *x, float *logits)
{
    if (head->bf16)
        be->matmul_w16(be, rows, V, H, 1.0f, x, H, head->lm_head, H, 0.0f, logits, V);
    else
        be->matmul(be, 0, 1, rows, V, H, 1.0f, x, H, head->lm_head, H, 0.0f, logits, V);
}

/* a's tau_tree {"K": tau} into tree and its acc {"k": acc_k} (slots 1 .. B-1) into per_slot */
static void figures_json(const ddt_acceptance *a, int64_t B, char *tree, size_t tree_len, char *per_slot,
                         size_t per_slot_len)
{
    size_t used = (size_t)snprintf(tree, tree_len, "{");
    for (int i = 0; i < a->n_budgets; i++)
        used += (size_t)snprintf(tree + used, tree_len - used, "%s\"%lld\": %.6f", i ? ", " : "",
                                 (long long)a->budgets[i], ddt_acceptance_tau_tree(a, i));
    snprintf(tree + used, tree_len - used, "}");
    used = (size_t)snprintf(per_slot, per_slot_len, "{");
    for (int64_t k = 1; k < B && k < DDT_MAX_SLOTS && used < per_slot_len - 40; k++)
        used += (size_t)snprintf(per_slot + used, per_slot_len - used, "%s\"%lld\": %.6f", k > 1 ? ", " : "",
                                 (long long)k, ddt_acceptance_acc(a, k));
    snprintf(per_slot + used, per_slot_len - used, "}");
}

/* the evals row of acceptance acc at the trainer's step (a DFlash2 drafter's unary figures in
 * unary_json) */
static void store_eval(ddt_trainer *t, const ddt_acceptance *acc, int64_t B)
{
    char tree[512], accj[2048], unary[2700] = "";
    figures_json(acc, B, tree, sizeof tree, accj, sizeof accj);
    if (acc->selector) {
        const ddt_acceptance u = ddt_acceptance_unary(acc);
        char utree[512], uacc[2048];
        figures_json(&u, B, utree, sizeof utree, uacc, sizeof uacc);
        snprintf(unary, sizeof unary, "{\"tau_chain\": %.6f, \"tau_tree\": %s, \"acc\": %s}",
                 ddt_acceptance_tau_chain(&u), utree, uacc);
    }
    ddt_store_eval(t->store, t->run_id, t->step, ddt_acceptance_tau_chain(acc), tree, accj,
                   acc->selector ? unary : NULL);
}

/* pred (B) of the block at anchor a of tokens (S: the sequence's length) with labels (B): the
 * anchor's token, then each slot's teacher-forced predecessor: the label before it where valid
 * (what an accepted chain put there), else the data token; -1 past the sequence */
static void selector_predecessors(const int32_t *tokens, int64_t S, int32_t a, const int32_t *labels, int64_t B,
                                  int32_t *pred)
{
    pred[1] = tokens[a];
    for (int64_t k = 2; k < B; k++)
        pred[k] = labels[k - 1] >= 0 ? labels[k - 1] : a + k - 1 < S ? tokens[a + k - 1] : -1;
}

int ddt_trainer_eval(ddt_trainer *t, ddt_acceptance *acc, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    /* eval.blocks_per_sequence anchors per sequence: at the seed's shape (1024 x 24 slots, V
     * 248,320) every block costs two (B, V) logit products read back to the host */
    const int64_t S = c->seq_len, A = c->max_anchors < c->eval_blocks ? c->max_anchors : c->eval_blocks,
                  B = d->block_size, H = d->hidden, V = d->vocab, LH = d->taps * H;
    rank_state *rs = &t->rank[0];   /* rank 0 evaluates, on its device */
    if (t->split)
        ddt_trainer_split_settle(t);   /* target rank 0 is free: the next step's batch waits in ahead */
    const ddk_backend *be = rs->be;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    ddt_acceptance_init(acc, c->tree_budgets, c->n_budgets);
    acc->selector = d->dflash2;   /* its figures the selector's (unary_* beside), blocks or none */
    int64_t n = c->eval_sequences < c->heldout ? c->eval_sequences : c->heldout;
    size_t hs_bytes = (size_t)(A * B * H) * sizeof(float), logit_bytes = (size_t)(B * V) * sizeof(float);
    float *hs = ddk_malloc(be->alloc, hs_bytes);               /* (A*B, H) */
    float *logits_dev = ddk_malloc(be->alloc, logit_bytes);    /* (B, V) */
    float *logits = malloc(logit_bytes);                        /* (B, V) host */
    int32_t *greedy_dev = ddk_malloc(be->alloc, DDT_MAX_SLOTS * sizeof(int32_t));   /* (B - 1) */
    int32_t *anchors = malloc((size_t)A * sizeof(int32_t)), labels[DDT_MAX_SLOTS], greedy[DDT_MAX_SLOTS];
    uint8_t *keep = malloc((size_t)A);
    int rc = hs && logits_dev && logits && greedy_dev && anchors && keep ? 0 : -ENOMEM;
    if (rc)
        snprintf(err, err_len, "no memory for the acceptance evaluation");
    ddt_selector *selector = NULL;   /* a DFlash2 drafter's path selector */
    if (rc == 0 && d->dflash2)
        rc = ddt_selector_open(&selector, be, d, err, err_len);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        ddt_sequence q;
        if (t->generates) {   /* rank 0's generator samples held-out i once, as the source would */
            int32_t *tokens;
            ddt_generator *gen = t->split ? ddt_split_generator(t->split) : &rs->gen;   /* target rank 0's */
            if ((rc = ddt_heldout_tokens_get(&t->held, &t->data, gen, i, &tokens, err, err_len)))
                break;
            memset(rs->b.loss_mask, 1, (size_t)S);   /* free between steps, as its features are */
            q = (ddt_sequence){ .S = S, .input_ids = tokens, .loss_mask = rs->b.loss_mask };
        } else if ((rc = ddt_source_heldout(t->source, i, &q, err, err_len))) {
            break;
        }
        ddt_sample_anchors(q.loss_mask, S, A, ddt_batch_seed(c->seed, 0, i, SEED_EVAL), anchors, keep);
        /* the held-out hidden states in rank 0's memory: its batch buffers are free between steps
         * (co-located: its replica computes them there) */
        const float *features = q.features, *th = q.teacher_hidden;
        if (t->colocated) {
            if ((rc = ddt_target_prefill(be, &rs->replica, q.input_ids, q.S < S ? q.S : S, c->drafter.target_layer_ids,
                                         (int)d->taps, rs->b.features, rs->b.teacher, NULL))) {
                snprintf(err, err_len, "the evaluation's target forward (rank 0's replica) failed: %s", strerror(-rc));
                break;
            }
            features = rs->b.features;
            th = rs->b.teacher;
        } else if (t->split) {   /* target rank 0 hands them to rank 0, as a step's */
            ddt_split_dest dest = { .drafter = 0, .tokens = q.input_ids, .features = rs->b.features,
                                    .teacher = rs->b.teacher };
            ddt_split_start(t->split, &dest, 1);
            if ((rc = ddt_split_wait(t->split, err, err_len)))
                break;
            features = rs->b.features;
            th = rs->b.teacher;
        } else if (rs->gpu >= 0) {
            be->copy(be, rs->b.features, q.features, (size_t)(S * LH) * sizeof(float));
            if (th && rs->b.teacher)
                be->copy(be, rs->b.teacher, th, (size_t)(S * H) * sizeof(float));
            features = rs->b.features;
            th = th ? rs->b.teacher : NULL;
        }
        ddt_batch b = { 1, S, A, q.input_ids, q.loss_mask, features, NULL, anchors, keep, NULL };
        if ((rc = ddt_drafter_forward(be, d, &rs->w, &head, &b, hs))) {
            snprintf(err, err_len, "the evaluation's forward failed: %s", strerror(-rc));
            break;
        }
        const int teacher_labels = c->ce_target_teacher && th;
        const int64_t slots = B < DDT_MAX_SLOTS ? B : DDT_MAX_SLOTS;
        for (int64_t j = 0; j < A && keep[j]; j++) {
            /* labels as training has them: the teacher's argmax (what greedy verification by
             * the target accepts), or the data's next token. Slot k >= 1 is taught by
             * th[a_j + k - 1]: rows a_j .. a_j + rows - 1, one product per block. */
            const int64_t rows = S - anchors[j] < slots - 1 ? S - anchors[j] : slots - 1;
            if (teacher_labels && rows > 0) {
                ddt_head_logits(be, &head, rows, V, H, th + anchors[j] * H, logits_dev);
                be->argmax_rows(be, logits_dev, rows, V, greedy_dev);   /* only the indices come back */
                be->copy(be, greedy, greedy_dev, (size_t)rows * sizeof(int32_t));
                be->synchronize(be);
            }
            for (int64_t k = 0; k < slots; k++) {
                int64_t p = anchors[j] + k;
                labels[k] = k >= 1 && p < S && q.loss_mask[p] ? q.input_ids[p] : -1;
                if (teacher_labels && labels[k] >= 0)
                    labels[k] = greedy[k - 1];
            }
            ddt_head_logits(be, &head, B, V, H, hs + j * B * H, logits_dev);
            be->copy(be, logits, logits_dev, logit_bytes);
            be->synchronize(be);
            if (selector) {
                int32_t pred[DDT_MAX_SLOTS];
                selector_predecessors(q.input_ids, q.S < S ? q.S : S, anchors[j], labels, B, pred);
                ddt_acceptance_add_selector_block(
                    acc, logits, ddt_selector_fill(selector, &rs->w, hs + j * B * H, logits_dev, pred), V, labels);
            } else {
                ddt_acceptance_add_block(acc, logits, B, V, labels);
            }
        }
    }
    ddk_free(be->alloc, hs, hs_bytes);
    ddk_free(be->alloc, logits_dev, logit_bytes);
    ddk_free(be->alloc, greedy_dev, DDT_MAX_SLOTS * sizeof(int32_t));
    free(logits);
    free(anchors);
    free(keep);
    ddt_selector_close(selector);
    if (rc == 0 && t->store)
        store_eval(t, acc, B);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Speculative decoding on held-out prompts (SPEC.md section 7)
 */

int ddt_trainer_open_speculator(ddt_trainer *t, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    rank_state *rs = &t->rank[0];
    if (t->split || c->target_place == DDT_TARGET_SPLIT)
        return ddt_fail(err, err_len, -ENOTSUP, "eval.speculative: the target is on a split's own devices, not "
                        "beside rank 0's drafter: run `ddtreed speculate` on an export instead");
    if (t->colocated)
        t->spec_target = &rs->replica;
    else if (t->source && !t->gpu)
        t->spec_target = ddt_source_target(t->source);   /* the host target: CPU ranks read host memory */
    if (!t->spec_target || !t->spec_target->ops)
        return ddt_fail(err, err_len, -ENOTSUP, "eval.speculative: no target beside rank 0's drafter (%s)",
                        t->gpu ? "GPU ranks with target.devices \"host\": use \"same\" (co-located)"
                               : "a token file read without its target, or feature shards");
    ddt_run_config_spec_caps(c, &t->spec_prompts, &t->spec_gen_len, &t->spec_max_budget);
    /* within train.seq_len (eval.speculative's own is checked to be; its default need not be) */
    t->spec_prompt_len = c->spec_prompt_len < c->seq_len - 1 ? c->spec_prompt_len : c->seq_len - 1;
    if (t->spec_prompt_len + t->spec_gen_len + c->drafter.block_size > c->drafter.max_positions)
        return ddt_fail(err, err_len, -EINVAL, "eval.speculative: prompt_len %lld + gen_len %lld + block_size is "
                        "beyond the target's context (%lld)", (long long)t->spec_prompt_len,
                        (long long)t->spec_gen_len, (long long)c->drafter.max_positions);
    char why[900];
    int rc = ddt_speculator_open(&t->spec, rs->be, t->spec_target, &c->drafter, t->spec_prompt_len, t->spec_gen_len,
                                 t->spec_max_budget, why, sizeof why);
    if (rc)
        return ddt_fail(err, err_len, rc, "eval.speculative: rank 0's speculator (%lld prompt + %lld generated "
                        "tokens, trees of %lld nodes; its bytes: the `speculator` row of `ddtreed plan`): %s",
                        (long long)t->spec_prompt_len, (long long)t->spec_gen_len, (long long)t->spec_max_budget,
                        why);
    return 0;
}

/* Held-out sequence i's prompt into *tokens, *n and its end token into *stop (-1: none): a
 * conversation's (chat data: through its last user message, then the generation prompt; longer
 * than P, its last P tokens, the generation prompt kept), else the sequence's first P tokens
 * (fewer: a shorter sequence), from the evaluation's stream (generated: rank 0's generator
 * samples it once; else the source's) */
static int spec_prompt(ddt_trainer *t, int64_t i, int64_t P, const int32_t **tokens, int64_t *n, int32_t *stop,
                       char *err, size_t err_len)
{
    *stop = -1;
    if (t->generates) {
        int32_t *row;
        int rc = ddt_heldout_tokens_get(&t->held, &t->data, &t->rank[0].gen, i, &row, err, err_len);
        *tokens = row;
        *n = P;
        return rc;
    }
    int rc = ddt_source_heldout_prompt(t->source, i, tokens, n, stop, err, err_len);
    if (rc != -ENOTSUP) {   /* conversations */
        if (rc == 0 && *n > P)
            *tokens += *n - P, *n = P;
        return rc;
    }
    ddt_sequence q;
    rc = ddt_source_heldout(t->source, i, &q, err, err_len);
    *tokens = q.input_ids;
    *n = q.S < P ? q.S : P;
    return rc;
}

static void store_spec(ddt_trainer *t, int64_t step, const ddt_speculate_totals *tot, int64_t prompt_len,
                       int64_t gen_len, double seconds, int live)
{
    double tau_tree[DDT_MAX_BUDGETS];
    for (int i = 0; i < tot->n_budgets; i++)
        tau_tree[i] = ddt_speculate_tau_tree(tot, i);
    cJSON *tree = ddt_speculate_budgets_json(tot, tau_tree), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "prompts", (double)tot->prompts);
    cJSON_AddNumberToObject(d, "prompt_len", (double)prompt_len);
    cJSON_AddNumberToObject(d, "gen_len", (double)gen_len);
    cJSON_AddNumberToObject(d, "generated", (double)tot->generated);
    cJSON_AddNumberToObject(d, "mismatched", (double)tot->mismatched);
    cJSON_AddBoolToObject(d, "greedy_equal", tot->mismatched == 0);
    cJSON_AddNumberToObject(d, "chain_calls", (double)tot->chain_calls);
    cJSON_AddNumberToObject(d, "seconds", seconds);
    cJSON_AddNumberToObject(d, "greedy_seconds", tot->greedy_seconds);
    cJSON_AddNumberToObject(d, "chain_seconds", tot->chain_seconds);
    cJSON_AddItemToObject(d, "tree_seconds", ddt_speculate_budgets_json(tot, tot->tree_seconds));
    cJSON_AddStringToObject(d, "weights", live ? "live" : "checkpoint");
    char *tree_text = cJSON_PrintUnformatted(tree), *detail = cJSON_PrintUnformatted(d);
    if (tree_text && detail)
        ddt_store_eval_spec(t->store, t->run_id, step, ddt_speculate_tau(tot), tree_text, detail);
    free(tree_text);
    free(detail);
    cJSON_Delete(tree);
    cJSON_Delete(d);
}

int ddt_trainer_speculate(ddt_trainer *t, const ddt_trainer_spec_request *q, ddt_speculate_totals *out, char *err,
                          size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    rank_state *rs = &t->rank[0];
    int rc = t->spec ? 0 : ddt_trainer_open_speculator(t, err, err_len);
    if (rc)
        return rc;
    ddt_speculate_params p = { .gen_len = q->gen_len > 0 ? q->gen_len : t->spec_gen_len, .stop = -1 };
    const int64_t prompts = q->prompts > 0 ? q->prompts : t->spec_prompts;
    if (q->n_budgets > DDT_MAX_BUDGETS)
        return ddt_fail(err, err_len, -EINVAL, "tree_budgets: at most %d", DDT_MAX_BUDGETS);
    /* the request's budgets, else eval.speculative.tree_budgets (its default without the section) */
    p.n_budgets = q->n_budgets >= 0 ? q->n_budgets : c->spec_n_budgets;
    memcpy(p.budgets, q->n_budgets >= 0 ? q->budgets : c->spec_budgets, sizeof(int64_t) * (size_t)p.n_budgets);
    if (prompts > t->spec_prompts)
        return ddt_fail(err, err_len, -EINVAL, "prompts: at most %lld (the speculator's, eval.speculative.prompts "
                        "and train.heldout)", (long long)t->spec_prompts);
    if (p.gen_len > t->spec_gen_len)
        return ddt_fail(err, err_len, -EINVAL, "gen_len: at most %lld (the speculator's, eval.speculative.gen_len)",
                        (long long)t->spec_gen_len);
    for (int i = 0; i < p.n_budgets; i++)
        if (p.budgets[i] < 1 || p.budgets[i] > t->spec_max_budget)
            return ddt_fail(err, err_len, -EINVAL, "tree_budgets: %lld is outside [1, %lld] (the planned cap, the "
                            "largest of eval.speculative.tree_budgets)", (long long)p.budgets[i],
                            (long long)t->spec_max_budget);
    /* the weights: rank 0's live ones, or a kept checkpoint's brought to rank 0's memory */
    const int live = q->step < 0 || q->step == t->step;
    const int64_t step = live ? t->step : q->step;
    const size_t bytes = (size_t)t->total * sizeof(float);
    float *host = NULL, *dev = NULL;
    ddt_drafter_weights w = rs->w;
    if (!live) {
        char dir[2200];
        if (ddt_checkpoint_find(t->run_dir, step, dir, sizeof dir))
            return ddt_fail(err, err_len, -ENOENT, "step: no kept checkpoint of step %lld (checkpoint.keep keeps "
                            "the newest)", (long long)step);
        if (!(host = malloc(bytes)))
            return ddt_fail(err, err_len, -ENOMEM, "no host memory for the checkpoint's weights");
        rc = ddt_checkpoint_read(dir, &c->drafter, host, NULL, NULL, err, err_len);
        if (!rc && rs->gpu >= 0) {
            if (!(dev = ddk_malloc(rs->be->alloc, bytes)))
                rc = ddt_fail(err, err_len, -ENOMEM, "no memory on rank 0 for the checkpoint's weights");
            else {
                rs->be->copy(rs->be, dev, host, bytes);
                rs->be->synchronize(rs->be);
            }
        }
        if (rc) {
            free(host);
            return rc;
        }
        ddt_drafter_bind(&c->drafter, dev ? dev : host, &w);
    }
    const double t0 = ddt_mono_s();
    ddt_speculate_totals_init(out, &p);
    for (int64_t i = 0; i < prompts && rc == 0; i++) {
        const int32_t *tokens;
        int64_t n;
        ddt_speculate_prompt_result r;
        if ((rc = spec_prompt(t, i, t->spec_prompt_len, &tokens, &n, &p.stop, err, err_len)))
            break;
        if ((rc = ddt_speculate_prompt(t->spec, &w, &p, tokens, n, &r, err, err_len)))
            break;
        ddt_speculate_totals_add(out, &r);
        if (!r.equal && t->store) {   /* a bug: speculative decoding is lossless (SPEC.md 7) */
            char message[300];
            snprintf(message, sizeof message, "speculative decoding of held-out prompt %lld at step %lld was not "
                     "equal to greedy decoding (a bug: it is lossless)", (long long)i, (long long)step);
            ddt_trainer_store_message(t, "error", step, i, message);
        }
    }
    const double seconds = ddt_mono_s() - t0;
    if (dev)
        ddk_free(rs->be->alloc, dev, bytes);
    free(host);
    if (rc == 0 && t->store)
        store_spec(t, step, out, t->spec_prompt_len, p.gen_len, seconds, live);
    return rc;
}
