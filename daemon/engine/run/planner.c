/* planner.c: predicts one device's memory for a run and picks chunk / vocab_tile (planner.h).
 * The activation and workspace figures are the engine's own arithmetic
 * (ddt_drafter_step_bytes, ddk_loss_workspace_bytes), so prediction and allocation agree by
 * construction (ddk_attention_workspace_bytes too); what remains between prediction and
 * measurement is rounding of allocations and the loss's and attention's workspaces never
 * overlapping. The target's part follows its placement (planner.h): the host's target, a
 * replica co-located on every rank (CPU or GPU; generating, with its own generator, and no
 * target on the host), or a split.
 * Tested by tests/engine/train/test_trainer.c (the drafter's peak, HOST's host peak, SAME on CPU ranks),
 * tests/engine/test_engine.c (a bf16 run's plan; memory.card's memory as the budget) and
 * tests/daemon/train_cli_test.sh (the examples' plans, the 96 GB card's among them).
 */
#include "planner.h"
#include "base/errors.h"
#include "eval/speculate.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the sequences of a step the largest rank takes (every daemon's ranks share the step) */
static int64_t rank_sequences(const ddt_run_config *c)
{
    const int64_t world = c->cluster_world ? c->cluster_world : c->ranks;
    return (c->sequences_per_step + world - 1) / world;
}

/* The bytes of a bf16 replica (a GPU's, opened with ddt_target_options.bf16 whatever the
 * checkpoint's dtype): exact for synthetic and BF16 checkpoints; an F32 / F16 checkpoint's
 * footprint knows only its fp32 block, halved (its fp32 vectors counted at half: < 0.1% low) */
static int64_t bf16_weight_bytes(const ddt_run_config *c, const ddt_target_footprint *f)
{
    if (c->target_kind == DDT_SOURCE_SYNTHETIC)
        return ddt_target_weight_bytes(&c->synthetic, 1);
    return f->stored_bytes == 2 ? f->stored_weight_bytes : f->fp32_bytes / 2;
}

/* The target's bytes where it runs, for a placement (HOST, SAME or SPLIT with `devices` target
 * ranks) on ranks that are GPUs (gpu) or CPU ranks */
static void target_bytes(const ddt_run_config *c, const ddt_target_footprint *f, ddt_placement placement,
                         int64_t devices, int gpu, ddt_target_plan *t)
{
    const int generating = c->target_kind == DDT_SOURCE_SYNTHETIC || !*c->target_tokens;
    memset(t, 0, sizeof *t);
    t->placement = placement;
    t->devices = placement == DDT_PLACE_SPLIT ? devices : 0;
    t->speculator = placement == DDT_PLACE_SPLIT ? 0 : f->speculator_bytes;   /* a split refuses it */
    t->weights = placement != DDT_PLACE_HOST && gpu ? bf16_weight_bytes(c, f) : f->fp32_bytes;
    /* the host's source runs its loader and its held-out worker, each with a generator; a rank
     * (SAME, or a SPLIT's target rank) prefills its own sequences one at a time and, generating,
     * samples them with its one generator (rank 0's, or target rank 0's, makes the held-out ones
     * between steps); a target rank sends from one sequence's features and teacher */
    const int threads = placement == DDT_PLACE_HOST ? 2 : 1;
    t->workspace = threads * f->prefill_bytes;
    t->cache = generating ? threads * f->cache_bytes : 0;
    if (placement == DDT_PLACE_SPLIT) {
        const int teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
        t->send = c->seq_len * (c->drafter.taps + (teacher ? 1 : 0)) * f->hidden * (int64_t)sizeof(float);
    }
    ddt_source_config src;
    ddt_run_config_source(c, &src);
    src.tokens_only = placement == DDT_PLACE_SAME || placement == DDT_PLACE_SPLIT;
    if (placement == DDT_PLACE_HOST || (src.tokens_only && !generating))
        t->queue = ddt_source_queue_bytes(&src, f->hidden);
    /* SAME, SPLIT: no host target at all; a token file's source keeps its token queue, generated
     * data has no source, only the held-out tokens kept once sampled */
    if (src.tokens_only)
        t->host = generating ? ddt_source_heldout_token_bytes(&src) : t->queue;
}

/* What one drafter device holds at its busiest, as parts that sum to its peak: what it holds
 * throughout (SAME: the replica's weights and generator; SAME, HOST: rank 0's speculator; SPLIT:
 * the second batch slot), then the step's transient bytes: its activations with the larger of
 * the loss's and the attention's workspaces (never held at the same time), or, co-located, the
 * replica's prefill when that is larger (it runs before the step, not during it). */
static int plan_parts(const ddt_memory_plan *p, const ddt_target_plan *t, ddt_plan_part *out)
{
    const ddt_placement placement = t ? t->placement : DDT_PLACE_NONE;
    int n = 0;
#define PART(k, b) (out[n++] = (ddt_plan_part){ (k), (b) })
    PART("weights", p->weights);
    PART("gradients", p->gradients);
    PART("optimizer", p->optimizer);
    PART("frozen_head", p->frozen_head);
    PART("batch", p->batch);
    if (placement == DDT_PLACE_SAME) {
        PART("target", t->weights);
        if (t->cache)
            PART("generator", t->cache);
    }
    if ((placement == DDT_PLACE_SAME || placement == DDT_PLACE_HOST) && t->speculator)
        PART("speculator", t->speculator);
    if (placement == DDT_PLACE_SPLIT)
        PART("handoff", t->handoff);
    const int64_t ws = p->loss_workspace > p->attention_workspace ? p->loss_workspace : p->attention_workspace;
    if (placement == DDT_PLACE_SAME && t->workspace > p->activations + ws) {
        PART("target_prefill", t->workspace);
    } else {
        PART("activations", p->activations);
        PART(p->loss_workspace >= p->attention_workspace ? "loss_workspace" : "attention_workspace", ws);
    }
#undef PART
    return n;
}

int ddt_plan_parts(const ddt_memory_plan *p, ddt_plan_part parts[DDT_PLAN_PARTS])
{
    return plan_parts(p, &p->target, parts);
}

/* The drafter's figures at (chunk, tile), and the peak of one drafter device with the target as
 * t places it: SAME adds its weights and, generating, its generator (cache and workspace, opened
 * with the replica) to what the device holds throughout and its forward (run by the rank before
 * its step, never during it) beside the step's transient bytes; a CPU rank
 * reads its replica's embed_tokens / lm_head in place (fp32 on a CPU rank, bf16 on a GPU).
 * SPLIT adds the second batch slot the target ranks fill while the step trains on the first
 * (double-buffered); a CPU rank reads target rank 0's fp32 head in place, a GPU keeps a bf16
 * copy. */
static void fill(const ddt_run_config *c, int tied_head, int64_t chunk, int64_t tile, const ddt_target_footprint *f,
                 ddt_target_plan *t, ddt_memory_plan *p)
{
    const ddt_drafter_config *d = &c->drafter;
    static _Thread_local ddt_param table[DDT_MAX_PARAMS];
    int64_t total = 0;
    ddt_drafter_param_table(d, table, &total);
    const int64_t F = (int64_t)sizeof(float), H = d->hidden, V = d->vocab;
    const int64_t nseq = rank_sequences(c);
    const int64_t micro = (nseq + c->grad_accum - 1) / c->grad_accum;         /* its micro-batch */
    const int uses_teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
    const ddt_placement placement = t ? t->placement : DDT_PLACE_NONE;
    p->positions = micro * c->max_anchors * d->block_size;
    /* a bf16 step (train.precision bf16, or a GPU reading the target's bf16 head) keeps a bf16
     * copy of the weights and stages its activation operands in bf16 (drafter.c's products) */
    const int bf16_step = c->bf16 || (p->gpu && (placement == DDT_PLACE_SAME || placement == DDT_PLACE_SPLIT));
    p->weights = total * F + (bf16_step ? total * 2 : 0);
    p->gradients = (micro < nseq ? 2 : 1) * total * F;
    p->optimizer = 2 * total * F;
    /* a GPU's copy is bf16 in a split and with train.precision bf16 (train/ranks.c round_host_head) */
    const int head16_copy = p->gpu && (placement == DDT_PLACE_SPLIT || c->bf16);
    /* a CPU rank never copies the head: it reads the host target's, a replica's or target rank
     * 0's in place, counted under the target already (train/ranks.c); only a shards run's head,
     * which no target holds, is counted here */
    p->frozen_head = placement == DDT_PLACE_SAME || (placement != DDT_PLACE_NONE && !p->gpu) ? 0
                     : (tied_head ? 1 : 2) * V * H * (head16_copy ? 2 : F);
    p->batch = nseq * c->seq_len * ((d->taps + (uses_teacher ? 1 : 0)) * H * F + 5) +
               nseq * c->max_anchors * 5;
    p->activations = (int64_t)ddt_drafter_step_bytes(d, micro, c->seq_len, c->max_anchors, uses_teacher,
                                                     bf16_step, bf16_step);
    ddk_loss_params lp = { .n = p->positions, .hidden = H, .vocab = V, .chunk = chunk,
                           .vocab_tile = tile, .kl_weight = c->kl_weight,
                           .kl_temperature = c->kl_temperature, .cap_weight = c->cap_weight,
                           .cap_temperature = c->cap_temperature };
    const ddk_selector sel = { .top_k = d->selector_top_k, .rank = d->selector_rank };
    lp.selector = d->dflash2 ? &sel : NULL;   /* DFlash2's candidates and scores per chunk row */
    int64_t ws = ddk_loss_workspace_bytes(&lp, ddk_loss_uses_teacher(&lp, !c->ce_target_teacher));
    p->loss_workspace = ws > 0 ? ws : 0;
    ddk_attention_shape as = { .S = c->seq_len, .A = c->max_anchors, .B = d->block_size,
                               .nh = d->heads, .nkv = d->kv_heads, .d = d->head_dim };
    int64_t aws = ddk_attention_workspace_bytes(&as, 1);
    p->attention_workspace = aws > 0 ? aws : 0;
    p->chunk = chunk;
    p->vocab_tile = tile;
    if (placement == DDT_PLACE_SPLIT) {
        t->handoff = p->batch;
        t->peak = t->weights + t->workspace + t->cache + t->send;
    } else if (placement == DDT_PLACE_HOST) {
        t->peak = t->weights + t->workspace + t->cache + t->queue;
    }
    /* the peak is the sum of its parts, one arithmetic for the plan, its table and its JSON */
    ddt_plan_part parts[DDT_PLAN_PARTS];
    const int n = plan_parts(p, t, parts);
    p->peak = 0;
    for (int i = 0; i < n; i++)
        p->peak += parts[i].bytes;
}

/* The drafter's devices at the config's chunk, else the largest chunk (then vocab_tile) that fits
 * the budget; 1 when one does */
static int fit_chunk(const ddt_run_config *c, int tied_head, const ddt_target_footprint *f, ddt_target_plan *t,
                     ddt_memory_plan *p)
{
    fill(c, tied_head, c->chunk, c->vocab_tile, f, t, p);
    if (!p->budget || p->peak <= p->budget)
        return 1;
    /* halve the chunk down to a floor; then stream the vocabulary in shrinking tiles */
    static const int64_t tiles[] = { 0, 16384, 8192, 4096, 2048, 1024, 512, 256 };
    const int64_t start = c->chunk < p->positions ? c->chunk : p->positions;
    for (size_t i = c->vocab_tile ? 1 : 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        int64_t tile = i == 0 ? 0 : (c->vocab_tile && tiles[i] > c->vocab_tile ? c->vocab_tile : tiles[i]);
        for (int64_t chunk = start; chunk >= 1; chunk = chunk > 16 ? chunk / 2 : 0) {
            fill(c, tied_head, chunk, tile, f, t, p);
            if (p->peak <= p->budget)
                return 1;
        }
    }
    return 0;   /* p holds the smallest configuration tried */
}

/* A split of node_gpus: target GPUs in proportion to the target's share of a step's FLOPs, at
 * least one of each */
static int64_t split_target_gpus(double share, int node_gpus)
{
    int64_t m = (int64_t)llround(share * node_gpus);
    return m < 1 ? 1 : m > node_gpus - 1 ? node_gpus - 1 : m;
}

int ddt_plan(const ddt_run_config *c, int64_t budget, int tied_head, const ddt_target_footprint *f, int gpu,
             int colocated, int node_gpus, ddt_memory_plan *p)
{
    memset(p, 0, sizeof *p);
    p->budget = budget ? budget : c->budget_bytes;
    p->budget_card = !p->budget && gpu && c->card;
    if (p->budget_card)   /* a GPU can hold no more than its memory */
        p->budget = c->card->memory_bytes;
    p->gpu = gpu;
    p->ranks = c->ranks;
    ddt_target_plan t = { 0 };
    if (!f) {
        p->fits = fit_chunk(c, tied_head, NULL, NULL, p);
        return 0;
    }
    if (!gpu || (!colocated && c->target_devices_count == 0)) {   /* CPU ranks, or "host" */
        target_bytes(c, f, c->target_devices_count ? DDT_PLACE_SPLIT : colocated ? DDT_PLACE_SAME : DDT_PLACE_HOST,
                     c->target_devices_count, gpu, &t);
        p->fits = fit_chunk(c, tied_head, f, &t, p);
        p->target = t;
        return 0;
    }
    /* per sequence: the share does not depend on how many a rank takes */
    const double target_flops = f->prefill_flops,
                 drafter_flops = ddt_drafter_step_flops(&c->drafter, c->seq_len, c->max_anchors, c->vocab_tile ? 5 : 3);
    const double share = target_flops / (target_flops + drafter_flops);
    if (c->target_devices_count == 0) {   /* co-located when it fits */
        target_bytes(c, f, DDT_PLACE_SAME, 0, gpu, &t);
        p->fits = fit_chunk(c, tied_head, f, &t, p);
        t.flops_share = share;
        p->target = t;
        if (p->fits)
            return 0;
        if (node_gpus == 0) {   /* the trainer's own plan: what it runs */
            snprintf(p->why, sizeof p->why, "the target co-located needs %.1f GB per GPU against a budget of "
                     "%.1f GB", p->peak / 1e9, p->budget / 1e9);
            return 0;
        }
        if (node_gpus < 2) {
            snprintf(p->why, sizeof p->why, "the target co-located needs %.1f GB per GPU against a budget of "
                     "%.1f GB, and a split needs two GPUs at least (this plan has %d)", p->peak / 1e9,
                     p->budget / 1e9, node_gpus);
            return 0;
        }
        /* propose a split of the node's GPUs */
        ddt_run_config split = *c;
        split.target_devices_count = (int)split_target_gpus(share, node_gpus);
        split.ranks = node_gpus - split.target_devices_count;
        ddt_memory_plan q;
        memset(&q, 0, sizeof q);
        q.budget = p->budget;
        q.budget_card = p->budget_card;
        q.gpu = 1;
        q.ranks = split.ranks;
        target_bytes(&split, f, DDT_PLACE_SPLIT, split.target_devices_count, 1, &t);
        q.fits = fit_chunk(&split, tied_head, f, &t, &q) && t.peak <= q.budget;
        t.proposed = 1;
        t.flops_share = share;
        q.target = t;
        snprintf(q.why, sizeof q.why, "co-located, the target and the drafter need %.1f GB per GPU against a "
                 "budget of %.1f GB", p->peak / 1e9, p->budget / 1e9);
        *p = q;
    } else {
        target_bytes(c, f, DDT_PLACE_SPLIT, c->target_devices_count, 1, &t);
        p->fits = fit_chunk(c, tied_head, f, &t, p);
        t.flops_share = share;
        p->target = t;
    }
    if (p->target.peak > p->budget && p->budget && p->target.placement == DDT_PLACE_SPLIT) {
        p->fits = 0;
        snprintf(p->why, sizeof p->why, "one target GPU needs %.1f GB (weights %.1f GB in bf16, a prefill's %.2f GB, "
                 "generator %.2f GB, send buffer %.2f GB) against a budget of %.1f GB: no placement fits; a target "
                 "split over several GPUs by layers is not built", p->target.peak / 1e9, p->target.weights / 1e9,
                 p->target.workspace / 1e9, p->target.cache / 1e9, p->target.send / 1e9,
                 p->budget / 1e9);
    }
    return 0;
}

/* one line of the table, in GB, or MB when the whole plan is under a gigabyte */
static void row(FILE *out, const char *what, int64_t bytes, int64_t scale, const char *how)
{
    int gb = scale >= 1000000000;
    fprintf(out, "  %-22s %12.3f %s   %s\n", what, bytes / (gb ? 1e9 : 1e6), gb ? "GB" : "MB", how);
}

static cJSON *cuda_name(int32_t gpu)
{
    char name[24];
    snprintf(name, sizeof name, "cuda:%d", (int)gpu);
    return cJSON_CreateString(name);
}

/* a proposed split's "devices" and "target.devices" as a JSON merge patch of the run config
 * (POST /plan's proposal.config) */
static void proposal_lines(const ddt_memory_plan *p, FILE *out)
{
    fputs("    {\"devices\": [", out);
    for (int64_t i = 0; i < p->ranks; i++)
        fprintf(out, "%s\"cuda:%d\"", i ? ", " : "", (int)p->split_devices[i]);
    fputs("], \"target\": {\"devices\": [", out);
    for (int64_t i = 0; i < p->target.devices; i++)
        fprintf(out, "%s\"cuda:%d\"", i ? ", " : "", (int)p->split_target_devices[i]);
    fputs("]}}\n", out);
}

void ddt_plan_print(const ddt_run_config *c, const ddt_memory_plan *p, FILE *out)
{
    const ddt_drafter_config *d = &c->drafter;
    char how[200];
    if (p->target.proposed)
        fprintf(out, "memory plan of \"%s\" as the split proposed (co-located does not fit): per drafter GPU of "
                "%lld, beside %lld target GPU(s); the config names %lld\n", c->name, (long long)p->ranks,
                (long long)p->target.devices, (long long)c->ranks);
    else
        fprintf(out, "memory plan of \"%s\", per device (rank) of %lld\n", c->name, (long long)p->ranks);
    const int64_t world = c->cluster_world ? c->cluster_world : p->ranks,
                  per_rank = (c->sequences_per_step + world - 1) / world;
    fprintf(out, "  %lld positions at a time (%lld sequence(s) x %lld anchors x block %lld; a rank takes %lld of "
            "the step's %lld sequences%s), vocabulary %lld\n", (long long)p->positions,
            (long long)(p->positions / (c->max_anchors * d->block_size)), (long long)c->max_anchors,
            (long long)d->block_size, (long long)per_rank, (long long)c->sequences_per_step,
            c->grad_accum > 1 ? " over its micro-batches" : "", (long long)d->vocab);
    fprintf(out, "  one logits tensor: %lld x %lld x 2 B = %.2f GB in bf16 (%.2f GB in fp32); "
            "a naive KL holds three\n", (long long)p->positions, (long long)d->vocab,
            2.0 * p->positions * d->vocab / 1e9, 4.0 * p->positions * d->vocab / 1e9);
    if (c->card)
        fprintf(out, "  card %s (%s, sm_%d, %d SMs): memory %.3f GB, shared memory %g KiB per block (%g KiB per SM), "
                "%d threads per SM%s\n", c->card->name, c->card->card, c->card->compute_capability,
                c->card->multiprocessors, c->card->memory_bytes / 1e9, c->card->smem_per_block_optin / 1024.0,
                c->card->smem_per_sm / 1024.0, c->card->threads_per_sm,
                p->gpu ? "" : "; not applied: these ranks are CPU ranks (name the GPUs in devices to plan for the card)");
    const int head16 = p->gpu && (p->target.placement == DDT_PLACE_SAME || p->target.placement == DDT_PLACE_SPLIT);
    fprintf(out, "  matrix products %s; %s\n",
            c->bf16 ? "with bf16 operands on the tensor cores (train.precision bf16)"
            : head16 ? "with bf16 operands on the tensor cores (the loss reads the target's bf16 head)" : "in fp32",
            c->bf16 || head16 ? "master weights, moments, activations and statistics in fp32 (the MLP's gate and "
                                "up in bf16), the products' operands in bf16 (a copy of the weights, the "
                                "activations rounded once a product)"
                              : "weights, moments, activations and statistics in fp32");
    row(out, "weights", p->weights, p->peak, c->bf16 || head16 ? "fp32 master weights and their bf16 copy" : "fp32 master weights");
    row(out, "gradients", p->gradients, p->peak, c->grad_accum > 1 ? "fp32, and one micro-batch's" : "fp32");
    row(out, "optimizer state", p->optimizer, p->peak, "AdamW m and v, fp32");
    row(out, "frozen target head", p->frozen_head, p->peak,
        p->target.placement == DDT_PLACE_SAME && !p->gpu ? "none: the rank reads its fp32 replica's embed_tokens and lm_head in place"
        : p->target.placement == DDT_PLACE_SAME ? "none: the rank reads its bf16 replica's embed_tokens and lm_head in place"
        : p->target.placement == DDT_PLACE_SPLIT && !p->gpu ? "none: the rank reads target rank 0's fp32 replica's embed_tokens and lm_head in place"
        : p->target.placement == DDT_PLACE_HOST && !p->gpu ? "none: the rank reads the host target's fp32 embed_tokens and lm_head in place"
        : p->target.placement == DDT_PLACE_SPLIT || (p->gpu && c->bf16)
            ? "embed_tokens and lm_head, a bf16 copy per GPU (the loss reads it as stored)"
            : "embed_tokens and lm_head, fp32");
    row(out, "batch", p->batch, p->peak, "features, teacher hidden, tokens");
    row(out, "activations", p->activations, p->peak, c->bf16 || head16 ? "kept from forward for backward (the MLP's "
        "gate and up in bf16), and the products' three bf16 staging buffers" : "kept from forward for backward");
    if (p->vocab_tile)
        snprintf(how, sizeof how, "chunk %lld x vocab_tile %lld, streamed", (long long)p->chunk,
                 (long long)p->vocab_tile);
    else
        snprintf(how, sizeof how, "chunk %lld x %lld vocabulary, materialised", (long long)p->chunk,
                 (long long)d->vocab);
    row(out, "loss workspace", p->loss_workspace, p->peak, how);
    row(out, "attention workspace", p->attention_workspace, p->peak, "key tiles of one query group (not at the same time as the loss's)");
    const ddt_target_plan *t = &p->target;
    if (t->placement == DDT_PLACE_SAME)
        row(out, "target (co-located)", t->weights, p->peak, p->gpu ? "the replica's weights, bf16; its prefill "
            "runs before the step, within the step's transient bytes" : "the replica's weights, fp32; its prefill "
            "runs before the step, within the step's transient bytes");
    if (t->placement == DDT_PLACE_SAME && t->cache)
        row(out, "generator (co-located)", t->cache, p->peak, "the replica's decoding cache of one sequence and "
            "the sampling workspace (each rank samples its own sequences)");
    if (t->speculator)
        row(out, "speculator", t->speculator, p->peak, "eval.speculative on rank 0: the target's cache of "
            "prompt_len + gen_len + max(B, K + 1) positions (a qwen3_5 target's DeltaNet state per tree node) "
            "and the drafter's block");
    if (t->placement == DDT_PLACE_SPLIT)
        row(out, "feature hand-off", t->handoff, p->peak, "the next step's batch, filled by the target ranks during "
            "this one's (double-buffered)");
    row(out, "predicted peak", p->peak, p->peak, "");
    if (t->placement == DDT_PLACE_HOST || t->placement == DDT_PLACE_SPLIT) {
        if (t->placement == DDT_PLACE_HOST)
            fprintf(out, "the target, in host memory (fp32, shared by the ranks):\n");
        else
            fprintf(out, "each of %lld target %s%s:\n", (long long)t->devices, p->gpu ? "GPU(s)" : "CPU rank(s)",
                    t->proposed ? " (proposed: co-location does not fit)" : "");
        row(out, "target weights", t->weights, t->peak, t->placement == DDT_PLACE_HOST || !p->gpu ? "fp32" : "bf16");
        row(out, "target prefill", t->workspace, t->peak, t->placement == DDT_PLACE_HOST ? "two sequences' forward workspace (the loader and the held-out worker), fp32" : "one sequence's forward workspace, fp32");
        row(out, "generator", t->cache, t->peak, t->cache ? (t->placement == DDT_PLACE_HOST ? "the cache and workspace of the loader's and the held-out worker's" : "one generating sequence's cache and workspace") : "none: a token file");
        if (t->placement == DDT_PLACE_HOST)
            row(out, "sequence queue", t->queue, t->peak, "the source's buffers of features and teacher states");
        if (t->placement == DDT_PLACE_SPLIT)
            row(out, "send buffer", t->send, t->peak, "one sequence's features and teacher, sent as the next is computed");
        row(out, "target peak", t->peak, t->peak, "");
    }
    if (t->placement == DDT_PLACE_SAME || t->placement == DDT_PLACE_SPLIT) {
        const int generating = c->target_kind == DDT_SOURCE_SYNTHETIC || !*c->target_tokens;
        if (generating) {
            fprintf(out, "the host, beside the replicas (no host target: the ranks sample the data):\n");
            row(out, "held-out tokens", t->host, t->host, "the evaluation's sequences, sampled once by rank 0");
        } else {
            fprintf(out, "the host, beside the replicas (the source yields tokens only):\n");
            row(out, "token queue", t->queue, t->host, "the source's buffers of tokens and loss masks");
        }
    }
    if (t->placement == DDT_PLACE_SPLIT || (t->placement == DDT_PLACE_SAME && p->gpu))
        fprintf(out, "  target: %.0f%% of a step's matrix FLOPs%s%s\n", 100.0 * t->flops_share,
                t->proposed ? "; the split proposed gives it that share of the node's GPUs" : "", "");
    char of_card[128] = "";
    if (p->budget_card)
        snprintf(of_card, sizeof of_card, ", the %s's memory", c->card->name);
    else if (c->card && p->gpu)
        snprintf(of_card, sizeof of_card, " of the %s's %.3f GB", c->card->name, c->card->memory_bytes / 1e9);
    if (t->proposed) {   /* the figures above are the split's, not the config's */
        fprintf(out, "  budget %.3f GB%s: does NOT fit as configured: %s\n", p->budget / 1e9, of_card, p->why);
        if (p->fits) {
            fprintf(out, "  fits as a split (the figures above): %lld drafter GPU(s), %lld target GPU(s); write "
                    "into the run config (merged: the target's other keys stay):\n", (long long)p->ranks, (long long)t->devices);
            proposal_lines(p, out);
        } else {
            fprintf(out, "  the split proposed (the figures above: %lld drafter GPU(s), %lld target GPU(s)) does not "
                    "fit either%s\n", (long long)p->ranks, (long long)t->devices,
                    p->target.peak > p->budget ? ": a target GPU is over the budget" : " even at the smallest chunk "
                    "and vocab_tile tried");
        }
        return;
    }
    if (p->budget)
        fprintf(out, "  budget %.3f GB%s: %s\n", p->budget / 1e9, of_card,
                p->fits ? "fits" : "does NOT fit even at the smallest chunk and vocab_tile tried");
    if (*p->why)
        fprintf(out, "  %s\n", p->why);
}

char *ddt_plan_json(const ddt_run_config *c, const ddt_memory_plan *p, const char *note)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "ranks", (double)c->ranks);
    if (note && *note)
        cJSON_AddStringToObject(o, "devices_note", note);
    cJSON_AddNumberToObject(o, "positions_per_rank", (double)p->positions);
    cJSON *b = cJSON_AddObjectToObject(o, "bytes");
    cJSON_AddNumberToObject(b, "weights", (double)p->weights);
    cJSON_AddNumberToObject(b, "gradients", (double)p->gradients);
    cJSON_AddNumberToObject(b, "optimizer", (double)p->optimizer);
    cJSON_AddNumberToObject(b, "frozen_head", (double)p->frozen_head);
    cJSON_AddNumberToObject(b, "batch", (double)p->batch);
    cJSON_AddNumberToObject(b, "activations", (double)p->activations);
    cJSON_AddNumberToObject(b, "loss_workspace", (double)p->loss_workspace);
    cJSON_AddNumberToObject(b, "attention_workspace", (double)p->attention_workspace);
    cJSON_AddNumberToObject(o, "predicted_peak_bytes", (double)p->peak);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)p->budget);
    cJSON_AddStringToObject(o, "budget_from", !p->budget ? "none" : p->budget_card ? "card" : "given");
    if (c->card) {
        cJSON *k = cJSON_AddObjectToObject(o, "card");
        cJSON_AddStringToObject(k, "name", c->card->name);
        cJSON_AddStringToObject(k, "card", c->card->card);
        cJSON_AddNumberToObject(k, "compute_capability", c->card->compute_capability);
        cJSON_AddNumberToObject(k, "multiprocessors", c->card->multiprocessors);
        cJSON_AddNumberToObject(k, "memory_bytes", (double)c->card->memory_bytes);
        cJSON_AddNumberToObject(k, "shared_memory_per_block_bytes", c->card->smem_per_block_optin);
        cJSON_AddNumberToObject(k, "shared_memory_per_sm_bytes", c->card->smem_per_sm);
        cJSON_AddNumberToObject(k, "threads_per_sm", c->card->threads_per_sm);
        cJSON_AddBoolToObject(k, "applies", p->gpu);   /* CPU ranks: not theirs */
    }
    cJSON_AddNumberToObject(o, "chunk", (double)p->chunk);
    cJSON_AddNumberToObject(o, "vocab_tile", (double)p->vocab_tile);
    cJSON_AddBoolToObject(o, "fits", ddt_plan_fits(p));
    if (*p->why)
        cJSON_AddStringToObject(o, "why", p->why);
    ddt_plan_part parts[DDT_PLAN_PARTS];
    const int n = ddt_plan_parts(p, parts);
    cJSON *sum = cJSON_AddObjectToObject(o, "peak_parts");
    for (int i = 0; i < n; i++)
        cJSON_AddNumberToObject(sum, parts[i].key, (double)parts[i].bytes);
    if (p->target.proposed) {   /* what to write for the split the figures are of */
        cJSON *q = cJSON_AddObjectToObject(o, "proposal");
        cJSON_AddBoolToObject(q, "fits", p->fits);
        cJSON_AddNumberToObject(q, "drafter_ranks", (double)p->ranks);
        cJSON_AddNumberToObject(q, "target_ranks", (double)p->target.devices);
        cJSON *w = cJSON_AddObjectToObject(q, "config");
        cJSON *dv = cJSON_AddArrayToObject(w, "devices");
        for (int64_t i = 0; i < p->ranks; i++)
            cJSON_AddItemToArray(dv, cuda_name(p->split_devices[i]));
        cJSON *tv = cJSON_AddArrayToObject(cJSON_AddObjectToObject(w, "target"), "devices");
        for (int64_t i = 0; i < p->target.devices; i++)
            cJSON_AddItemToArray(tv, cuda_name(p->split_target_devices[i]));
    }
    const ddt_target_plan *t = &p->target;
    if (t->placement != DDT_PLACE_NONE) {
        static const char *const names[] = { "none", "host", "same", "split" };
        cJSON *j = cJSON_AddObjectToObject(o, "target");
        cJSON_AddStringToObject(j, "placement", names[t->placement]);
        cJSON_AddBoolToObject(j, "proposed", t->proposed);
        cJSON_AddNumberToObject(j, "devices", (double)t->devices);
        cJSON_AddNumberToObject(j, "weights", (double)t->weights);
        cJSON_AddNumberToObject(j, "prefill", (double)t->workspace);
        cJSON_AddNumberToObject(j, "cache", (double)t->cache);
        cJSON_AddNumberToObject(j, "speculator", (double)t->speculator);
        cJSON_AddNumberToObject(j, "queue", (double)t->queue);
        cJSON_AddNumberToObject(j, "host", (double)t->host);
        cJSON_AddNumberToObject(j, "handoff", (double)t->handoff);
        cJSON_AddNumberToObject(j, "send", (double)t->send);
        cJSON_AddNumberToObject(j, "peak_bytes", (double)t->peak);
        cJSON_AddNumberToObject(j, "flops_share", t->flops_share);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

int ddt_run_footprint(const ddt_run_config *c, ddt_target_footprint *f, char *err, size_t err_len)
{
    int64_t max_len = 0, max_block = 0, rest = 0;
    if (c->spec)
        rest = ddt_speculator_workspace_bytes(&c->drafter, c->spec_prompt_len, c->spec_gen_len,
                                              ddt_run_config_spec_max_budget(c), &max_len, &max_block);
    int rc = 0;
    if (c->target_kind == DDT_SOURCE_HF)
        rc = ddt_target_footprint_load(c->target_path, c->seq_len, f, err, err_len);
    else
        ddt_target_footprint_dense(&c->synthetic, (int)sizeof(float), c->seq_len, f);   /* made in fp32 */
    if (rc == 0 && c->spec)
        rc = ddt_target_footprint_speculator(c->target_kind == DDT_SOURCE_HF ? c->target_path : NULL,
                                             &c->synthetic, max_len, max_block, rest, f, err, err_len);
    return rc;
}

/* A proposed split's GPUs (p->ranks drafter GPUs, then p->target.devices target GPUs): the n
 * GPUs the config names or "all" resolved to (ids) first, then the others of the node's in
 * order, so that the drafter keeps the GPUs it was given where it can */
static void split_gpus(const int32_t *ids, int n, int node_gpus, ddt_memory_plan *p)
{
    int32_t order[DDT_MAX_RANKS];
    int count = 0;
    for (int i = 0; i < n && count < DDT_MAX_RANKS; i++)
        order[count++] = ids[i];
    for (int g = 0; g < node_gpus && count < DDT_MAX_RANKS; g++) {
        int seen = 0;
        for (int i = 0; i < n; i++)
            seen |= ids[i] == g;
        if (!seen)
            order[count++] = g;
    }
    for (int i = 0; i < count; i++) {
        if (i < p->ranks)
            p->split_devices[i] = order[i];
        else if (i - p->ranks < p->target.devices)
            p->split_target_devices[i - p->ranks] = order[i];
    }
}

int ddt_plan_config(ddt_run_config *c, ddt_node node, int64_t budget, ddt_memory_plan *plan, char *note,
                    size_t note_len, char *remark, size_t remark_len, char *err, size_t err_len, char *field,
                    size_t field_len)
{
    *note = *remark = '\0';
    ddt_devices dev = { 0 };
    char why[1024];
    int rc = ddt_run_config_devices(c, node, &dev, why, sizeof why, field, field_len);
    int gpu = dev.gpu, node_gpus = node.gpus, colocated = dev.colocated;
    if (rc == -ENODEV) {   /* planned away from the node it names: the ranks and GPUs it names */
        snprintf(remark, remark_len, "%s; planning with the %lld rank(s) it names", why, (long long)c->ranks);
        *field = '\0';
        gpu = c->devices_kind == DDT_DEVICES_LIST || c->target_devices_count > 0;
        node_gpus = (int)c->ranks + c->target_devices_count;
        colocated = ddt_devices_colocated(c, gpu);
    } else if (rc) {
        return ddt_fail(err, err_len, rc, "%s", why);
    } else {
        c->ranks = dev.ranks;
        snprintf(note, note_len, "%s", dev.note);
    }
    int64_t hidden = 0, vocab = 0, layers = 0;
    int tied = 0;
    ddt_target_footprint f;
    const int has_target = c->target_kind != DDT_SOURCE_SHARDS;
    int shaped = ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, why, sizeof why) == 0 &&
                 (!has_target || ddt_run_footprint(c, &f, why, sizeof why) == 0);
    if (!shaped) {   /* planning needs only the shape: the config's target.* fields, a dense target */
        size_t used = strlen(remark);
        const ddt_target_config *d = &c->synthetic;   /* every field the target's weights depend on */
        snprintf(remark + used, remark_len - used, "%s%s; planning with the config's declared target shape "
                 "(target.hidden_size %lld, num_hidden_layers %lld, num_attention_heads %lld, num_key_value_heads "
                 "%lld, head_dim %lld, intermediate_size %lld, vocab_size %lld, a dense target: declare the model's "
                 "own, or its weights are planned wrong)", used ? "\n" : "", why, (long long)d->hidden,
                 (long long)d->layers, (long long)d->heads, (long long)d->kv_heads, (long long)d->head_dim,
                 (long long)d->intermediate, (long long)d->vocab);
        hidden = c->synthetic.hidden, vocab = c->synthetic.vocab, layers = c->synthetic.layers;
        ddt_target_footprint_dense(&c->synthetic, 2, c->seq_len, &f);
    }
    if ((rc = ddt_run_config_resolve(c, hidden, vocab, layers, err, err_len)))
        return rc;
    rc = ddt_plan(c, budget, tied, has_target ? &f : NULL, gpu, colocated, node_gpus, plan);
    if (rc == 0 && plan->target.proposed) {
        const int listed = c->devices_kind == DDT_DEVICES_LIST;
        split_gpus(listed ? c->gpu_ids : dev.gpu_ids, listed || dev.gpu ? (int)c->ranks : 0, node_gpus, plan);
    }
    return rc;
}
