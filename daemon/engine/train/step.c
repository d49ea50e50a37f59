/* step.c: one optimizer step (ddt_trainer_step): the batch loaded (batches.c); every rank in its
 * own thread (rank_main: co-located, its features first; its slice in micro-batches); the
 * gradient of the globally normalised loss (CPU ranks: summed in rank order on the host; GPU
 * ranks: one NCCL all-reduce); AdamW; the step's record. A step out of memory is retried with
 * half the chunk, then a vocabulary tile, down to a floor (shrink), when auto_rechunk is on.
 * Tested by tests/engine/train/test_trainer.c (out-of-memory recovery and its floor; 1, 2 and 3 ranks and
 * accumulated micro-batches give the same losses; exact resume) and tests/engine/train/test_step_cuda.c (GPU
 * runs against the CPU's, the NCCL all-reduce on two GPUs; skipped without a GPU).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/ddt_time.h"
#include "data/batch.h"
#include "split.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Co-located: generated data's tokens first, sampled by the rank's generator (sequence i of the
 * slice is the step's global sequence first + i: index batch_cursor + first + i, what the
 * source would have given that slot); then the rank's sequences through its replica, their taps
 * and final hidden states straight into its batch buffers, then their noise, as
 * ddt_trainer_load_batch adds it on the host path (the same op and seed: the same bits). Run
 * again on a retried step: the tokens are kept (tokens_for), the prefill rewrites the features,
 * the noise is drawn again from the same seed. */
static int prefill_slice(rank_state *rs)
{
    const ddt_trainer *t = rs->t;
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const ddk_backend *be = rs->be;
    if (t->generates && rs->tokens_for != t->batch_cursor) {
        rs->tokens_for = -1;
        char err[256];   /* the generator's errors are its errno (a bad length: a programming error) */
        for (int64_t i = 0; i < rs->nseq; i++) {
            int rc = ddt_source_generate(&t->data, &rs->gen, 0, t->batch_cursor + rs->first + i,
                                         rs->b.input_ids + i * S, NULL, err, sizeof err);
            if (rc)
                return rc;
        }
        rs->tokens_for = t->batch_cursor;
    }
    for (int64_t i = 0; i < rs->nseq; i++) {
        float *features = rs->b.features + i * S * LH;
        int rc = ddt_target_prefill(be, &rs->replica, rs->b.input_ids + i * S, S, c->drafter.target_layer_ids,
                                    (int)c->drafter.taps, features, rs->b.teacher ? rs->b.teacher + i * S * H : NULL,
                                    NULL);
        if (rc)
            return rc;
        be->uniform_noise(be, features, S * LH, c->noise_std,
                          ddt_batch_seed(c->seed, t->step, rs->first + i, SEED_NOISE));
    }
    return 0;
}

/* alpha_sel of SPEC.md 2.1 at step (0-based): 0 through the first train.selector_warmup of the
 * steps, then rising linearly over the next train.selector_ramp of them to train.selector_weight */
static float selector_weight_at(const ddt_run_config *c, int64_t step)
{
    const double warm = c->selector_warmup * (double)c->steps, ramp = c->selector_ramp * (double)c->steps,
                 x = (double)step - warm;
    if (x < 0)
        return 0.0f;
    return x >= ramp ? c->selector_weight : (float)(c->selector_weight * x / ramp);
}

/* The rank's slice in micro-batches of at most ceil(nseq / grad_accum) sequences: each one's
 * gradient (of its own normalised loss) is weighted by its weight sum into the rank's, which
 * then is the gradient of the rank's normalised loss, as if the slice had run at once.
 * Co-located, the rank first computes its slice's features (prefill_slice); with a walk
 * (train.anchors), the walked sequences' anchors are redrawn, and with the tree term
 * (train.tree_weight) the slots' weights scaled (walk.c). */
static void *rank_main(void *arg)
{
    rank_state *rs = arg;
    ddt_trainer *t = rs->t;
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, A = c->max_anchors, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const int64_t micro = (rs->nseq + c->grad_accum - 1) / c->grad_accum;
    double t0 = ddt_mono_s();
    const int accumulate = micro < rs->nseq;   /* then micro_grads exists (ddt_trainer_alloc_ranks) */
    float *target = accumulate ? rs->micro_grads : rs->grads;
    ddt_drafter_weights *g = &rs->step_grads;
    const ddk_backend *be = rs->be;
    const size_t gbytes = (size_t)t->total * sizeof(float);
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    const float *features = rs->b.features, *teacher = rs->b.teacher;
    be->zero(be, rs->grads, gbytes);
    ddt_loss_config lc = { .gamma = c->gamma, .ce_target_teacher = c->ce_target_teacher,
                           .loss = { .chunk = t->chunk, .vocab_tile = t->vocab_tile,
                                     .kl_weight = c->kl_weight, .kl_temperature = c->kl_temperature,
                                     .cap_weight = c->cap_weight, .cap_temperature = c->cap_temperature,
                                     .bf16_products = c->bf16 },
                           .selector_weight = selector_weight_at(c, t->step),
                           .selector_inject = c->selector_inject,
                           .selector_stop_gradient = c->selector_stop_gradient };
    ddk_loss_result sum = { 0 };
    double sum_loss = 0, sum_ce = 0, sum_kl = 0, sum_cap = 0, sum_sel = 0;
    rs->rc = t->colocated ? prefill_slice(rs) : 0;
    if (rs->rc == 0 && (c->anchor_walk != DDT_ANCHORS_UNIFORM || c->tree_weight > 0))
        rs->rc = ddt_trainer_match_serving(rs);   /* the walks' anchors, the tree term's slot scales */
    for (int64_t first = 0; first < rs->nseq && rs->rc == 0; first += micro) {
        const int64_t n = rs->nseq - first < micro ? rs->nseq - first : micro;
        ddt_batch b = { n, S, A, rs->b.input_ids + first * S, rs->b.loss_mask + first * S,
                        features + first * S * LH, teacher ? teacher + first * S * H : NULL,
                        rs->b.anchors + first * A, rs->b.keep + first * A,
                        rs->slot_scale ? rs->slot_scale + first * A * c->drafter.block_size : NULL };
        ddk_loss_result r = { 0 };
        if (accumulate)
            be->zero(be, target, gbytes);
        rs->rc = ddt_drafter_step(be, &c->drafter, &rs->w, g, &head, &b, &lc, &r);
        if (accumulate && rs->rc == 0 && r.weight_sum > 0)
            be->axpby(be, t->total, (float)r.weight_sum, target, 1.0f, rs->grads);
        sum.weight_sum += r.weight_sum;
        sum.counted += r.counted;
        sum.correct += r.correct;
        sum.sel_correct += r.sel_correct;
        sum.sel_covered += r.sel_covered;
        sum_loss += r.weight_sum * r.loss;
        sum_ce += r.weight_sum * r.ce;
        sum_kl += r.weight_sum * r.kl;
        sum_cap += r.weight_sum * r.cap;
        sum_sel += r.weight_sum * r.sel;
    }
    if (sum.weight_sum > 0) {
        sum.loss = sum_loss / sum.weight_sum;
        sum.ce = sum_ce / sum.weight_sum;
        sum.kl = sum_kl / sum.weight_sum;
        sum.cap = sum_cap / sum.weight_sum;
        sum.sel = sum_sel / sum.weight_sum;
        if (accumulate)
            be->axpby(be, t->total, (float)(1.0 / sum.weight_sum), rs->grads, 0.0f, rs->grads);
    }
    be->synchronize(be);   /* the rank's time is its GPU's */
    rs->result = sum;
    rs->seconds = ddt_mono_s() - t0;
    return NULL;
}

static int run_ranks(ddt_trainer *t)
{
    pthread_t threads[MAX_RANKS];
    for (int r = 1; r < t->ranks; r++)
        if (pthread_create(&threads[r], NULL, rank_main, &t->rank[r]))
            t->rank[r].rc = -EAGAIN;
    rank_main(&t->rank[0]);
    int rc = t->rank[0].rc;
    for (int r = 1; r < t->ranks; r++) {
        pthread_join(threads[r], NULL);
        if (t->rank[r].rc && !rc)
            rc = t->rank[r].rc;
    }
    return rc;
}

/* A smaller loss configuration after an out-of-memory step: 0, or -ENOMEM at the floor. */
static int shrink(ddt_trainer *t)
{
    const int64_t positions = t->plan.positions;
    int64_t chunk = t->chunk < positions ? t->chunk : positions;
    if (chunk > CHUNK_FLOOR) {
        t->chunk = chunk / 2;
        return 0;
    }
    if (t->vocab_tile == 0 || t->vocab_tile > TILE_FLOOR) {
        t->vocab_tile = t->vocab_tile ? t->vocab_tile / 2 : 8192;
        t->chunk = t->cfg.chunk;   /* a tile makes the workspace small: start large again */
        return 0;
    }
    return -ENOMEM;
}

/* The gradient of the globally normalised loss into every rank's grads (CPU ranks: rank 0's
 * only), and the step's figures (weighted means over every rank of the run) into *sums. */
static int reduce_gradients(ddt_trainer *t, ddk_loss_result *sums, char *err, size_t err_len)
{
    memset(sums, 0, sizeof *sums);
    if (t->gpu && t->world > 1) {   /* NCCL: sum of weight-scaled gradients and the figures */
        float *bufs[MAX_RANKS];
        for (int r = 0; r < t->ranks; r++) {
            rank_state *rs = &t->rank[r];
            const ddk_loss_result *res = &rs->result;
            const double w = res->weight_sum;
            const float x[REDUCED] = { [R_WEIGHT] = (float)w, [R_LOSS] = (float)(w * res->loss),
                                       [R_CE] = (float)(w * res->ce), [R_KL] = (float)(w * res->kl),
                                       [R_CAP] = (float)(w * res->cap), [R_SEL] = (float)(w * res->sel),
                                       [R_COUNTED] = (float)res->counted, [R_CORRECT] = (float)res->correct,
                                       [R_SEL_CORRECT] = (float)res->sel_correct };
            memcpy(rs->reduced, x, sizeof x);
            rs->be->axpby(rs->be, t->total, (float)w, rs->grads, 0.0f, rs->grads);
            rs->be->copy(rs->be, rs->grads + t->total, rs->reduced, sizeof rs->reduced);
            bufs[r] = rs->grads;
        }
        int rc = ddk_comm_allreduce_sum(t->comm, bufs, t->total + REDUCED, err, err_len);
        if (rc) {
            ddt_trainer_event(t, "error", "{\"step\": %lld, \"message\": \"the gradient all-reduce failed\"}",
                              (long long)t->step + 1);
            return rc;
        }
        float total[REDUCED];
        const ddk_backend *be0 = t->rank[0].be;
        be0->copy(be0, total, t->rank[0].grads + t->total, sizeof total);
        be0->synchronize(be0);
        const double w = total[R_WEIGHT];
        for (int r = 0; r < t->ranks && w > 0; r++)
            t->rank[r].be->axpby(t->rank[r].be, t->total, (float)(1.0 / w), t->rank[r].grads, 0.0f,
                                 t->rank[r].grads);
        *sums = (ddk_loss_result){ .weight_sum = w, .counted = (int64_t)total[R_COUNTED],
                                   .correct = (int64_t)total[R_CORRECT],
                                   .sel_correct = (int64_t)total[R_SEL_CORRECT] };
        if (w > 0) {
            sums->loss = total[R_LOSS] / w;
            sums->ce = total[R_CE] / w;
            sums->kl = total[R_KL] / w;
            sums->cap = total[R_CAP] / w;
            sums->sel = total[R_SEL] / w;
        }
        return 0;
    }
    /* CPU ranks (or one GPU): rank 0's grads := sum over ranks of share_r * grads_r */
    for (int r = 0; r < t->ranks; r++)
        sums->weight_sum += t->rank[r].result.weight_sum;
    const ddk_backend *be0 = t->rank[0].be;
    float *g0 = t->rank[0].grads;
    for (int r = 0; r < t->ranks; r++) {
        const ddk_loss_result *res = &t->rank[r].result;
        double share = sums->weight_sum > 0 ? res->weight_sum / sums->weight_sum : 0.0;
        sums->loss += share * res->loss;
        sums->ce += share * res->ce;
        sums->kl += share * res->kl;
        sums->cap += share * res->cap;
        sums->sel += share * res->sel;
        sums->counted += res->counted;
        sums->correct += res->correct;
        sums->sel_correct += res->sel_correct;
        if (t->ranks > 1)
            be0->axpby(be0, t->total, (float)share, t->rank[r].grads, r == 0 ? 0.0f : 1.0f, g0);
    }
    return 0;
}

/* AdamW on the weights: the trainer's (CPU ranks) or every GPU rank's replica, from the same
 * reduced gradient. Returns the gradient's norm; when it is not finite nothing was changed. */
static double update_weights(ddt_trainer *t, double *lr)
{
    if (!t->gpu)
        return ddt_adamw_update(t->rank[0].be, &t->adam_cfg, t->table, t->param_count, t->params,
                                t->params16, t->rank[0].grads, &t->adam, lr);
    double norm = 0;
    for (int r = 0; r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        ddt_adamw_state replica = { t->adam.step, rs->m, rs->v };
        norm = ddt_adamw_update(rs->be, &t->adam_cfg, t->table, t->param_count, rs->params,
                                rs->params16, rs->grads, &replica, lr);
        if (!isfinite(norm))   /* the ranks' reduced gradients are the same bits: rank 0 already */
            return norm;       /* refused, and none was changed */
    }
    t->adam.step++;
    return norm;
}

int ddt_trainer_step(ddt_trainer *t, ddt_step_record *rec, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    double t0 = ddt_mono_s();
    if (t->split)   /* their figures: this step's batch, or the wait for it, and the next one's */
        ddt_split_reset_peaks(t->split);
    int rc = ddt_trainer_load_batch(t, err, err_len);
    for (char note[2048]; t->source && ddt_source_next_note(t->source, note, sizeof note);)   /* chat lines skipped */
        if (t->store)
            ddt_store_event(t->store, t->run_id, ddt_wall_ms(), "data_skipped", note);
    if (rc)
        return rc;
    for (int r = 0; r < t->ranks; r++)
        ddk_allocator_reset_peak(t->rank[r].be->alloc);
    for (;;) {
        rc = run_ranks(t);
        if (rc != -ENOMEM)
            break;
        int64_t old_chunk = t->chunk, old_tile = t->vocab_tile;
        if (!c->auto_rechunk || shrink(t)) {
            ddt_memory_plan fit = { 0 };
            ddt_trainer_plan_for(t, c->budget_bytes, &fit, err, err_len);
            snprintf(err, err_len, "step %lld ran out of memory at chunk %lld, vocab_tile %lld%s; "
                     "the plan for this config needs %.3f GB per device%s", (long long)t->step + 1,
                     (long long)old_chunk, (long long)old_tile,
                     c->auto_rechunk ? " (the floor of the automatic re-chunking)" : " and auto_rechunk is off",
                     fit.peak / 1e9, fit.fits ? "" : ": raise memory.budget_bytes or shrink the batch");
            ddt_trainer_event(t, "error",
                              "{\"message\": \"out of memory at the floor\", \"chunk\": %lld, \"vocab_tile\": %lld}",
                              (long long)old_chunk, (long long)old_tile);
            return -ENOMEM;
        }
        t->oom_recoveries++;
        ddt_trainer_event(t, "oom_recovery",
                          "{\"step\": %lld, \"from\": {\"chunk\": %lld, \"vocab_tile\": %lld}, "
                          "\"to\": {\"chunk\": %lld, \"vocab_tile\": %lld}}", (long long)t->step + 1,
                          (long long)old_chunk, (long long)old_tile, (long long)t->chunk, (long long)t->vocab_tile);
    }
    if (rc) {
        snprintf(err, err_len, "step %lld failed: %s", (long long)t->step + 1, strerror(-rc));
        return rc;
    }

    ddk_loss_result sums;
    if ((rc = reduce_gradients(t, &sums, err, err_len)))
        return rc;
    double lr = 0, norm = update_weights(t, &lr);
    if (!isfinite(norm)) {   /* an update now would ruin the weights and the moments */
        snprintf(err, err_len, "step %lld: the gradient is not finite (norm %g, loss %g): lower train.lr "
                 "or check the data; the weights were left as they were", (long long)t->step + 1, norm, sums.loss);
        ddt_trainer_event(t, "error", "{\"step\": %lld, \"message\": \"gradient not finite\"}",
                          (long long)t->step + 1);
        return -ERANGE;
    }
    t->step++;
    const double loss = sums.loss, ce = sums.ce, kl = sums.kl, cap = sums.cap;
    const int64_t counted = sums.counted, correct = sums.correct;

    double seconds = ddt_mono_s() - t0;
    memset(rec, 0, sizeof *rec);
    snprintf(rec->run_id, sizeof rec->run_id, "%s", t->run_id);
    rec->step = t->step;
    rec->ts_ms = ddt_wall_ms();
    rec->loss = loss;
    rec->ce = ce;
    rec->kl = kl;
    rec->cap = cap;
    rec->acc = counted ? (double)correct / (double)counted : 0.0;
    rec->sel = c->drafter.dflash2 ? sums.sel : NAN;
    rec->sel_acc = !c->drafter.dflash2 ? NAN : counted ? (double)sums.sel_correct / (double)counted : 0.0;
    rec->lr = lr;
    rec->grad_norm = norm;
    rec->tokens = c->sequences_per_step * c->seq_len;
    rec->positions = c->sequences_per_step * c->max_anchors * c->drafter.block_size;
    rec->step_ms = seconds * 1e3;
    rec->tokens_per_s = rec->tokens / seconds;
    rec->positions_per_s = rec->positions / seconds;
    rec->chunk = t->chunk;
    rec->vocab_tile = t->vocab_tile;
    rec->devices = t->ranks < DDT_STORE_MAX_DEVICES ? t->ranks : DDT_STORE_MAX_DEVICES;
    for (int r = 0; r < rec->devices; r++) {
        int64_t peak = (int64_t)ddk_allocator_stats(t->rank[r].be->alloc).peak;
        rec->device_peak_bytes[r] = peak;
        rec->device_step_ms[r] = t->rank[r].seconds * 1e3;
        if (peak > rec->peak_bytes)
            rec->peak_bytes = peak;
    }
    if (t->store)
        ddt_store_step(t->store, rec);
    return 0;
}
