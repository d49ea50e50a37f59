/* bench_speculate.c: speculative decoding's verification calls per second with the drafter's
 * context cache (drafter_cache.h) and without it (ddt_speculate_params.uncached: the whole
 * context's forward every call), side by side in one run, on stories260K from ../shared (exits
 * 77 without it) and a random drafter of the seed's depth. The drafts of both are the same
 * (test_speculate checks it); this prints only times. Not a test: figures, never asserted.
 * Usage: bench_speculate [--prompts 8] [--prompt-len 64] [--gen-len 64] [--block 16]
 *                        [--budget 32] [--layers 5] [--repeats 3]
 */
#include "bench_util.h"
#include "eval/speculate.h"
#include "model/drafter.h"
#include "model/target.h"

#ifndef DDTREE_SHARED_MODELS
#define DDTREE_SHARED_MODELS "../shared/models"
#endif

int main(int argc, char **argv)
{
    int64_t prompts = 8, prompt_len = 64, gen_len = 64, block = 16, budget = 32, layers = 5;
    int repeats = 3;
    const bench_opt opts[] = { { "--prompts", BENCH_I64, &prompts }, { "--prompt-len", BENCH_I64, &prompt_len },
                               { "--gen-len", BENCH_I64, &gen_len }, { "--block", BENCH_I64, &block },
                               { "--budget", BENCH_I64, &budget }, { "--layers", BENCH_I64, &layers },
                               { "--repeats", BENCH_INT, &repeats } };
    if (bench_parse("bench_speculate", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])) || repeats < 1 ||
        repeats > 64 || prompts < 1)
        return 2;
    const char *dir = DDTREE_SHARED_MODELS "/stories260k";
    char err[512];
    ddt_target_model m;
    if (ddt_target_open(dir, &m, err, sizeof err)) {
        printf("skipped: %s: %s\n", dir, err);
        return 77;
    }
    const ddk_backend *be = ddk_backend_cpu();
    /* the target's attention shape, 3 taps, the seed's 5 layers */
    ddt_drafter_config dc = { .hidden = m.hidden, .layers = layers, .heads = 8, .kv_heads = 4, .head_dim = 8,
                              .intermediate = 172, .vocab = m.vocab, .block_size = block, .rms_norm_eps = 1e-5f,
                              .rope_theta = 10000.0f, .taps = 3, .target_layer_ids = { 1, 2, 3 },
                              .mask_token_id = (int32_t)(m.vocab - 1), .num_target_layers = m.layers,
                              .max_positions = 512 };
    ddt_param params[DDT_MAX_PARAMS];
    int64_t total;
    ddt_drafter_param_table(&dc, params, &total);
    float *base = malloc((size_t)total * sizeof(float));
    ddt_drafter_weights w;
    ddt_drafter_init(&dc, base, 7);
    ddt_drafter_bind(&dc, base, &w);
    ddt_speculator *s;
    if (!base || ddt_speculator_open(&s, be, &m, &dc, prompt_len, gen_len, budget, err, sizeof err)) {
        fprintf(stderr, "bench_speculate: %s\n", base ? err : "no memory");
        return 1;
    }
    int32_t *prompt = malloc((size_t)(prompts * prompt_len) * sizeof(int32_t));
    uint64_t seed = 1;
    for (int64_t i = 0; prompt && i < prompts * prompt_len; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)(3 + (seed >> 33) % (uint64_t)(m.vocab - 4));
    }
    printf("stories260K, drafter %lld layers B %lld, %lld prompts of %lld tokens, gen_len %lld; median of %d\n",
           (long long)layers, (long long)block, (long long)prompts, (long long)prompt_len, (long long)gen_len, repeats);
    printf("%-10s %-9s %7s %9s %9s\n", "drafting", "decode", "calls", "seconds", "calls/s");
    for (int uncached = 1; prompt && uncached >= 0; uncached--) {
        ddt_speculate_params p = { .gen_len = gen_len, .n_budgets = 1, .budgets = { budget }, .stop = -1,
                                   .uncached = uncached };
        double chain_s[64], tree_s[64];
        int64_t chain_calls = 0, tree_calls = 0;
        for (int r = 0; r < repeats; r++) {
            ddt_speculate_totals t;
            ddt_speculate_totals_init(&t, &p);
            for (int64_t i = 0; i < prompts; i++) {
                ddt_speculate_prompt_result res;
                if (ddt_speculate_prompt(s, &w, &p, prompt + i * prompt_len, prompt_len, &res, err, sizeof err)) {
                    fprintf(stderr, "bench_speculate: %s\n", err);
                    return 1;
                }
                ddt_speculate_totals_add(&t, &res);
            }
            chain_s[r] = t.chain_seconds;
            tree_s[r] = t.tree_seconds[0];
            chain_calls = t.chain_calls;
            tree_calls = t.tree_calls[0];
        }
        const double cs = bench_median(chain_s, repeats), ts = bench_median(tree_s, repeats);
        const char *how = uncached ? "uncached" : "cached";
        printf("%-10s %-9s %7lld %9.4f %9.1f\n", how, "chain", (long long)chain_calls, cs, (double)chain_calls / cs);
        char tree[24];
        snprintf(tree, sizeof tree, "tree(%lld)", (long long)budget);
        printf("%-10s %-9s %7lld %9.4f %9.1f\n", how, tree, (long long)tree_calls, ts, (double)tree_calls / ts);
    }
    ddt_speculator_close(s);
    ddt_target_close(&m);
    free(prompt);
    free(base);
    return 0;
}
