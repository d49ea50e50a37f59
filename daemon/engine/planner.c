/* planner.c: predicts one device's memory for a run and picks chunk / vocab_tile (planner.h).
 * The activation and workspace figures are the engine's own arithmetic
 * (ddt_drafter_step_bytes, ddk_loss_workspace_bytes), so prediction and allocation agree by
 * construction (ddk_attention_workspace_bytes too); what remains between prediction and
 * measurement is rounding of allocations and the loss's and attention's workspaces never
 * overlapping.
 * Tested by tests/test_trainer.c.
 */
#include "planner.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void fill(const ddt_run_config *c, int tied_head, int64_t chunk, int64_t tile,
                 ddt_memory_plan *p)
{
    const ddt_drafter_config *d = &c->drafter;
    static _Thread_local ddt_param table[DDT_MAX_PARAMS];
    int64_t total = 0;
    ddt_drafter_param_table(d, table, &total);
    const int64_t F = (int64_t)sizeof(float), H = d->hidden, V = d->vocab;
    const int64_t world = c->cluster_world ? c->cluster_world : c->ranks;   /* every daemon's ranks */
    const int64_t nseq = (c->sequences_per_step + world - 1) / world;   /* the largest rank */
    const int64_t micro = (nseq + c->grad_accum - 1) / c->grad_accum;         /* its micro-batch */
    const int uses_teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
    p->positions = micro * c->max_anchors * d->block_size;
    p->weights = total * F;
    p->gradients = (micro < nseq ? 2 : 1) * total * F;
    p->optimizer = 2 * total * F;
    p->frozen_head = (tied_head ? 1 : 2) * V * H * F;
    p->batch = nseq * c->seq_len * ((d->taps + (uses_teacher ? 1 : 0)) * H * F + 5) +
               nseq * c->max_anchors * 5;
    p->activations = (int64_t)ddt_drafter_step_bytes(d, micro, c->seq_len, c->max_anchors, uses_teacher);
    ddk_loss_params lp = { .n = p->positions, .hidden = H, .vocab = V, .chunk = chunk,
                           .vocab_tile = tile, .kl_weight = c->kl_weight,
                           .kl_temperature = c->kl_temperature, .cap_weight = c->cap_weight,
                           .cap_temperature = c->cap_temperature };
    int64_t ws = ddk_loss_workspace_bytes(&lp, ddk_loss_uses_teacher(&lp, !c->ce_target_teacher));
    p->loss_workspace = ws > 0 ? ws : 0;
    ddk_attention_shape as = { .S = c->seq_len, .A = c->max_anchors, .B = d->block_size,
                               .nh = d->heads, .nkv = d->kv_heads, .d = d->head_dim };
    int64_t aws = ddk_attention_workspace_bytes(&as, 1);
    p->attention_workspace = aws > 0 ? aws : 0;
    p->chunk = chunk;
    p->vocab_tile = tile;
    /* the loss's and the attention's workspaces are never held at the same time */
    p->peak = p->weights + p->gradients + p->optimizer + p->frozen_head + p->batch +
              p->activations + (p->loss_workspace > p->attention_workspace ? p->loss_workspace
                                                                           : p->attention_workspace);
}

int ddt_plan(const ddt_run_config *c, int64_t budget, int tied_head, ddt_memory_plan *p)
{
    memset(p, 0, sizeof *p);
    p->budget = budget ? budget : c->budget_bytes;
    fill(c, tied_head, c->chunk, c->vocab_tile, p);
    if (!p->budget || p->peak <= p->budget) {
        p->fits = 1;
        return 0;
    }
    /* halve the chunk down to a floor; then stream the vocabulary in shrinking tiles */
    static const int64_t tiles[] = { 0, 16384, 8192, 4096, 2048, 1024, 512, 256 };
    const int64_t start = c->chunk < p->positions ? c->chunk : p->positions;
    for (size_t t = c->vocab_tile ? 1 : 0; t < sizeof tiles / sizeof tiles[0]; t++) {
        int64_t tile = t == 0 ? 0 : (c->vocab_tile && tiles[t] > c->vocab_tile ? c->vocab_tile : tiles[t]);
        for (int64_t chunk = start; chunk >= 1; chunk = chunk > 16 ? chunk / 2 : 0) {
            fill(c, tied_head, chunk, tile, p);
            if (p->peak <= p->budget) {
                p->fits = 1;
                return 0;
            }
        }
    }
    p->fits = 0;   /* p holds the smallest configuration tried */
    return 0;
}

/* one line of the table, in GB, or MB when the whole plan is under a gigabyte */
static void row(FILE *out, const char *what, int64_t bytes, int64_t scale, const char *how)
{
    int gb = scale >= 1000000000;
    fprintf(out, "  %-22s %12.3f %s   %s\n", what, bytes / (gb ? 1e9 : 1e6), gb ? "GB" : "MB", how);
}

void ddt_plan_print(const ddt_run_config *c, const ddt_memory_plan *p, FILE *out)
{
    const ddt_drafter_config *d = &c->drafter;
    char how[200];
    const int64_t world = c->cluster_world ? c->cluster_world : c->ranks;
    const int64_t nseq = (c->sequences_per_step + world - 1) / world;
    fprintf(out, "memory plan of \"%s\", per device (rank) of %lld: %lld positions "
            "(%lld sequences x %lld anchors x block %lld) at a time, vocabulary %lld\n", c->name,
            (long long)c->ranks, (long long)p->positions,
            (long long)((nseq + c->grad_accum - 1) / c->grad_accum), (long long)c->max_anchors,
            (long long)d->block_size, (long long)d->vocab);
    fprintf(out, "  one logits tensor: %lld x %lld x 2 B = %.2f GB in bf16 (%.2f GB in fp32); "
            "a naive KL holds three\n", (long long)p->positions, (long long)d->vocab,
            2.0 * p->positions * d->vocab / 1e9, 4.0 * p->positions * d->vocab / 1e9);
    fprintf(out, "  matrix products %s; weights, moments, activations and statistics in fp32\n",
            c->bf16 ? "with bf16 operands on the tensor cores (train.precision bf16)" : "in fp32");
    row(out, "weights", p->weights, p->peak, "fp32 master weights");
    row(out, "gradients", p->gradients, p->peak, c->grad_accum > 1 ? "fp32, and one micro-batch's" : "fp32");
    row(out, "optimizer state", p->optimizer, p->peak, "AdamW m and v, fp32");
    row(out, "frozen target head", p->frozen_head, p->peak, "embed_tokens and lm_head");
    row(out, "batch", p->batch, p->peak, "features, teacher hidden, tokens");
    row(out, "activations", p->activations, p->peak, "kept from forward for backward");
    if (p->vocab_tile)
        snprintf(how, sizeof how, "chunk %lld x vocab_tile %lld, streamed", (long long)p->chunk,
                 (long long)p->vocab_tile);
    else
        snprintf(how, sizeof how, "chunk %lld x %lld vocabulary, materialised", (long long)p->chunk,
                 (long long)d->vocab);
    row(out, "loss workspace", p->loss_workspace, p->peak, how);
    row(out, "attention workspace", p->attention_workspace, p->peak, "key tiles of one query group (not at the same time as the loss's)");
    row(out, "predicted peak", p->peak, p->peak, "");
    if (p->budget)
        fprintf(out, "  budget %.3f GB: %s\n", p->budget / 1e9,
                p->fits ? "fits" : "does NOT fit even at the smallest chunk and vocab_tile tried");
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
    cJSON_AddNumberToObject(o, "chunk", (double)p->chunk);
    cJSON_AddNumberToObject(o, "vocab_tile", (double)p->vocab_tile);
    cJSON_AddBoolToObject(o, "fits", p->fits);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}
