/* test_speculate.c: speculative decoding (daemon/engine/eval/speculate.c, SPEC.md section 7) and
 * the target interface's tree verify under it (target.c, target_dense_cache.c,
 * target_qwen35.c).
 * - tree verify: every node of a random tree gives the rows the same tokens give verified as a
 *   chain (its root path), on dense llama / qwen3 targets (fp32 fast, generic, bf16) and the
 *   tiny Qwen3.5 target (DeltaNet state and conv window along each path); rolling back to a
 *   path leaves the cache as extending by that path's tokens would; a path that is not one is
 *   refused;
 * - lossless: chain and trees (budgets below, at and above B - 1) generate exactly plain greedy
 *   decoding's tokens for random drafters on a dense synthetic target, the tiny Qwen3.5 target
 *   and stories260K (the last two from ../shared: skipped when absent); 1 <= tau <= B; a stop
 *   token ends all three alike;
 * - DFlash2 (SPEC.md 2.1): drafters with random selectors (Bs nonzero) lossless, chain and
 *   trees, and drafting otherwise than the DFlash drafter of their backbone; with Bs = 0 (a
 *   fresh one) drafting as it: the same calls, chain and trees with K = V, the chain with K < V;
 * - the drafter's context cache (drafter_cache.h): decoding with it and without it (the whole
 *   context's forward every call) gives the same tokens and calls, prompt by prompt, chain and
 *   trees, DFlash and DFlash2 drafters, with and without a sliding layer (not the same bits: the
 *   context products run over fewer rows, which a BLAS may sum in another order);
 * - faithful: the chain's calls are exactly the walk of the teacher-forced chain lengths (SPEC.md
 *   6) over the greedy sequence it generated (a call at p yields tau(p) tokens), a DFlash2
 *   drafter's along its selector's teacher-forced picks;
 * - bad input: a drafter that does not fit the target, a prompt too long, a budget above the
 *   cap, a token outside the vocabulary.
 */
#include "check.h"
#include "ddk_rng.h"
#include "model/drafter.h"
#include "eval/selector.h"
#include "eval/speculate.h"
#include "model/target.h"

#include <errno.h>

#ifndef DDTREE_SHARED_MODELS
#define DDTREE_SHARED_MODELS "../shared/models"
#endif

enum { TAPS = 2, PROMPT = 5, NODES = 12 };

static ddt_target_config dense_config(int qwen3, int64_t vocab)
{
    return (ddt_target_config){ .qwen3 = qwen3, .hidden = 24, .layers = 3, .heads = 4, .kv_heads = 2,
                                .head_dim = 10, .intermediate = 36, .vocab = vocab, .rms_norm_eps = 1e-6f,
                                .rope_theta = 10000.0f };
}

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* ------------------------------------------------------------------------------------------
 * Tree verify on the target interface
 */

typedef struct rows {
    float *features, *hidden;   /* (n, TAPS H), (n, H) host */
} rows;

static rows rows_alloc(const ddt_target_model *m, int64_t n)
{
    return (rows){ xcalloc((size_t)(n * TAPS * m->hidden), sizeof(float)),
                   xcalloc((size_t)(n * m->hidden), sizeof(float)) };
}

static void rows_free(rows *r)
{
    free(r->features), free(r->hidden);
}

/* path (returned length) = node i's root path, root first */
static int64_t root_path(const int32_t *parents, int64_t i, int32_t *path)
{
    int32_t rev[NODES];
    int64_t n = 0;
    for (int64_t at = i; at >= 0; at = parents[at])
        rev[n++] = (int32_t)at;
    for (int64_t k = 0; k < n; k++)
        path[k] = rev[n - 1 - k];
    return n;
}

/* m's cache on the CPU: every tree node's rows == its root path's as a chain; a path rollback
 * == extending by its tokens; non-paths refused */
static void tree_case(const char *what, const ddt_target_model *m, double tol)
{
    const ddk_backend *be = ddk_backend_cpu();
    const int32_t taps[TAPS] = { 0, (int32_t)(m->layers - 1) };
    const int64_t H = m->hidden, LH = TAPS * H;
    char err[512];
    ddt_target_cache c;
    check(ddt_target_cache_open(be, m, 64, NODES, &c, err, sizeof err) == 0, "%s: cache: %s", what, err);
    uint64_t seed = 7;
    int32_t prompt[PROMPT], tokens[NODES], parents[NODES], path[NODES], path_tokens[NODES];
    for (int i = 0; i < PROMPT; i++)
        prompt[i] = (int32_t)(rng_next(&seed) % (uint64_t)m->vocab);
    for (int i = 0; i < NODES; i++) {   /* one root, then a random parent before each node */
        tokens[i] = (int32_t)(rng_next(&seed) % (uint64_t)m->vocab);
        parents[i] = i == 0 ? -1 : (int32_t)(rng_next(&seed) % (uint64_t)i);
    }
    parents[5] = 4, parents[4] = 3, parents[3] = 1, parents[2] = 0, parents[1] = 0;   /* a path of depth 5 */
    rows tree = rows_alloc(m, NODES), chain = rows_alloc(m, NODES), a = rows_alloc(m, 1), b = rows_alloc(m, 1);
    check(ddt_target_extend(&c, prompt, PROMPT, NULL, 0, NULL, NULL, NULL) == 0 &&
              ddt_target_verify_tree(&c, tokens, parents, NODES, taps, TAPS, tree.features, tree.hidden, NULL) == 0,
          "%s: tree verify", what);
    check(ddt_target_rollback(&c, 3) == -EINVAL, "%s: a chain rollback of a tree that is no chain there", what);
    const int32_t bad[2] = { 1, 3 };   /* node 1 is not a child of the cache */
    check(ddt_target_rollback_path(&c, bad, 2) == -EINVAL, "%s: a path not from the root accepted", what);
    double worst = 0;
    for (int64_t i = 0; i < NODES; i++) {
        const int64_t n = root_path(parents, i, path);
        for (int64_t k = 0; k < n; k++)
            path_tokens[k] = tokens[path[k]];
        ddt_target_cache_reset(&c);
        check(ddt_target_extend(&c, prompt, PROMPT, NULL, 0, NULL, NULL, NULL) == 0 &&
                  ddt_target_verify(&c, path_tokens, n, taps, TAPS, chain.features, chain.hidden, NULL) == 0,
              "%s: chain verify of node %lld's path", what, (long long)i);
        double e = normalised_error_ff(tree.hidden + i * H, chain.hidden + (n - 1) * H, H);
        double f = normalised_error_ff(tree.features + i * LH, chain.features + (n - 1) * LH, LH);
        worst = e > worst ? e : worst;
        worst = f > worst ? f : worst;
    }
    check(worst < tol, "%s: tree rows differ from their paths' chain rows by %.3g", what, worst);

    /* roll back to node 5's path (depth 5), then one decode == extend by the path, decode */
    const int64_t n = root_path(parents, 5, path);
    for (int64_t k = 0; k < n; k++)
        path_tokens[k] = tokens[path[k]];
    ddt_target_cache_reset(&c);
    check(ddt_target_extend(&c, prompt, PROMPT, NULL, 0, NULL, NULL, NULL) == 0 &&
              ddt_target_verify_tree(&c, tokens, parents, NODES, NULL, 0, NULL, NULL, NULL) == 0 &&
              ddt_target_rollback_path(&c, path, n) == 0 && c.len == PROMPT + n &&
              ddt_target_decode(&c, 3, taps, TAPS, a.features, a.hidden, NULL) == 0,
          "%s: tree, path rollback, decode", what);
    ddt_target_cache_reset(&c);
    check(ddt_target_extend(&c, prompt, PROMPT, NULL, 0, NULL, NULL, NULL) == 0 &&
              ddt_target_extend(&c, path_tokens, n, NULL, 0, NULL, NULL, NULL) == 0 &&
              ddt_target_decode(&c, 3, taps, TAPS, b.features, b.hidden, NULL) == 0,
          "%s: extend by the path, decode", what);
    double e = normalised_error_ff(a.hidden, b.hidden, H), f = normalised_error_ff(a.features, b.features, LH);
    check(e < tol && f < tol, "%s: after the path rollback the cache differs from the path extended: %.3g %.3g",
          what, e, f);
    rows_free(&tree), rows_free(&chain), rows_free(&a), rows_free(&b);
    ddt_target_cache_close(&c);
}

static void test_tree_dense(void)
{
    char err[512];
    for (int variant = 0; variant < 4; variant++) {   /* llama fast, qwen3 fast, qwen3 generic, qwen3 bf16 */
        const ddt_target_config cfg = dense_config(variant > 0, 32);
        const ddt_target_options o = { .generic = variant == 2, .bf16 = variant == 3 };
        ddt_target_model m;
        check(ddt_target_open_synthetic_with(&cfg, 17, &o, &m, err, sizeof err) == 0, "synthetic: %s", err);
        static const char *names[] = { "llama fp32", "qwen3 fp32", "qwen3 generic", "qwen3 bf16" };
        tree_case(names[variant], &m, 2e-5);
        ddt_target_close(&m);
    }
}

static int open_shared(const char *sub, ddt_target_model *m)
{
    char dir[1024], cfg[1100], err[512];
    snprintf(dir, sizeof dir, "%s/%s", DDTREE_SHARED_MODELS, sub);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "r");
    if (!f) {
        printf("  skipped: %s is not there (../shared)\n", cfg);
        return 0;
    }
    fclose(f);
    int rc = ddt_target_open(dir, m, err, sizeof err);
    check(rc == 0, "%s: %s", dir, err);
    return rc == 0;
}

static void test_tree_qwen35(void)
{
    ddt_target_model m;
    if (!open_shared("qwen35-tiny/text-only", &m))
        return;
    tree_case("qwen3_5 tiny", &m, 2e-5);
    ddt_target_close(&m);
}

/* ------------------------------------------------------------------------------------------
 * Speculative decoding
 */

/* a drafter of n layers and block B for target m, tapping its first and last layers */
static ddt_drafter_config drafter_for(const ddt_target_model *m, int64_t layers, int64_t B)
{
    ddt_drafter_config c = { .hidden = m->hidden, .layers = layers, .heads = 2, .kv_heads = 1,
                             .head_dim = m->hidden / 2, .intermediate = 2 * m->hidden, .vocab = m->vocab,
                             .block_size = B, .sliding_window = 0, .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f,
                             .taps = TAPS, .mask_token_id = (int32_t)(m->vocab - 1),
                             .num_target_layers = m->layers, .max_positions = 4096 };
    c.target_layer_ids[0] = 0;
    c.target_layer_ids[1] = (int32_t)(m->layers - 1);
    return c;
}

/* drafter_for's DFlash2 form (the same backbone): K candidates a slot, selector rank 8 */
static ddt_drafter_config dflash2_for(const ddt_target_model *m, int64_t layers, int64_t B, int64_t K)
{
    ddt_drafter_config c = drafter_for(m, layers, B);
    c.dflash2 = 1;
    c.conv_taps = 2;
    c.conv_group_size = 1;
    c.selector_rank = 8;
    c.selector_top_k = K;
    return c;
}

/* a DFlash2 drafter's successor codebook Bs (0 at initialisation) N(0, scale^2) */
static void random_successors(const ddt_drafter_config *c, ddt_drafter_weights *w, uint64_t seed, float scale)
{
    for (int64_t j = 0; j < c->vocab * c->selector_rank; j++)
        w->sel_succ[j] = (float)(scale * ddk_rng_normal(&seed));
}

/* random weights, scaled by gain (a larger gain: sharper, more confident drafts) */
static float *drafter_weights(const ddt_drafter_config *c, uint64_t seed, float gain, ddt_drafter_weights *w)
{
    ddt_param params[DDT_MAX_PARAMS];
    int64_t total;
    const int count = ddt_drafter_param_table(c, params, &total);
    float *base = xcalloc((size_t)total, sizeof(float));
    ddt_drafter_init(c, base, seed);
    for (int i = 0; i < count; i++)
        for (int64_t j = 0; !params[i].is_norm && j < params[i].numel; j++)
            base[params[i].offset + j] *= gain;
    ddt_drafter_bind(c, base, w);
    return base;
}

/* prompts decoded every way with random drafter dc (a DFlash2 one's Bs of scale successors):
 * greedy-equal, 1 <= tau <= B */
static void lossless_drafter(const char *what, const ddt_target_model *m, const ddt_drafter_config dc, float gain,
                             float successors, int32_t stop)
{
    const ddk_backend *be = ddk_backend_cpu();
    const int64_t B = dc.block_size;
    ddt_drafter_weights w;
    float *base = drafter_weights(&dc, 23, gain, &w);
    if (dc.dflash2)
        random_successors(&dc, &w, 41, successors);
    const ddt_speculate_params p = { .gen_len = 40, .n_budgets = 3, .budgets = { 3, B - 1, 16 }, .stop = stop };
    char err[512];
    ddt_speculator *s;
    check(ddt_speculator_open(&s, be, m, &dc, 16, 40, 16, err, sizeof err) == 0, "%s: open: %s", what, err);
    ddt_speculate_totals t;
    ddt_speculate_totals_init(&t, &p);
    uint64_t seed = 99;
    int64_t stopped = 0;
    for (int prompt_i = 0; prompt_i < 6 && s; prompt_i++) {
        int32_t prompt[16];
        const int64_t P = 1 + (int64_t)(rng_next(&seed) % 16);
        for (int64_t i = 0; i < P; i++)
            prompt[i] = (int32_t)(rng_next(&seed) % (uint64_t)(m->vocab - 1));
        ddt_speculate_prompt_result r;
        check(ddt_speculate_prompt(s, &w, &p, prompt, P, &r, err, sizeof err) == 0, "%s: prompt %d: %s", what,
              prompt_i, err);
        check(r.equal, "%s: prompt %d (%lld tokens): speculative decoding differs from greedy", what, prompt_i,
              (long long)P);
        check(r.greedy.n >= 1 && r.greedy.n <= p.gen_len && (r.greedy.n == p.gen_len ||
              r.greedy.tokens[r.greedy.n - 1] == stop), "%s: greedy generated %lld", what, (long long)r.greedy.n);
        stopped += r.greedy.n < p.gen_len;
        for (int i = -1; i < p.n_budgets; i++) {
            const ddt_speculate_run *x = i < 0 ? &r.chain : &r.tree[i];
            check(x->n <= 1 || (x->calls >= 1 && (double)(x->n - 1) <= (double)(B * x->calls)),
                  "%s: %lld tokens in %lld calls of block %lld", what, (long long)x->n, (long long)x->calls,
                  (long long)B);
        }
        ddt_speculate_totals_add(&t, &r);
    }
    const double tau = ddt_speculate_tau(&t);
    check(tau >= 1.0 && tau <= (double)B, "%s: tau_spec %.3f outside [1, %lld]", what, tau, (long long)B);
    for (int i = 0; i < p.n_budgets; i++) {
        const double tt = ddt_speculate_tau_tree(&t, i);
        check(tt >= 1.0 && tt <= (double)B, "%s: tau_spec_tree(%lld) %.3f outside [1, B]", what,
              (long long)p.budgets[i], tt);
    }
    check(t.mismatched == 0 && t.prompts == 6, "%s: %lld of %lld prompts not greedy-equal", what,
          (long long)t.mismatched, (long long)t.prompts);
    if (stop >= 0)
        check(stopped > 0, "%s: the stop token %d never ended a sequence (pick another)", what, (int)stop);
    printf("  %s: tau_spec %.3f, tau_spec_tree(3, %lld, 16) %.3f %.3f %.3f\n", what, tau, (long long)B - 1,
           ddt_speculate_tau_tree(&t, 0), ddt_speculate_tau_tree(&t, 1), ddt_speculate_tau_tree(&t, 2));
    ddt_speculator_close(s);
    free(base);
}

static void lossless_case(const char *what, const ddt_target_model *m, int64_t B, float gain, int32_t stop)
{
    lossless_drafter(what, m, drafter_for(m, 2, B), gain, 0.0f, stop);
}

/* fn(name, m) on each dense synthetic target: llama, qwen3, qwen3 in bf16 */
static void for_each_dense(void (*fn)(const char *name, const ddt_target_model *m))
{
    char err[512];
    for (int variant = 0; variant < 3; variant++) {
        const ddt_target_config cfg = dense_config(variant > 0, 32);
        const ddt_target_options o = { .bf16 = variant == 2 };
        ddt_target_model m;
        check(ddt_target_open_synthetic_with(&cfg, 29, &o, &m, err, sizeof err) == 0, "synthetic: %s", err);
        static const char *names[] = { "llama", "qwen3", "qwen3 bf16" };
        fn(names[variant], &m);
        ddt_target_close(&m);
    }
}

static void lossless_dense(const char *name, const ddt_target_model *m)
{
    lossless_case(name, m, 4, 1.0f, -1);
    lossless_case(name, m, 6, 30.0f, -1);
}

static void test_lossless_dense(void)
{
    for_each_dense(lossless_dense);
}

static void test_lossless_stop(void)
{
    char err[512];
    const ddt_target_config cfg = dense_config(1, 32);
    ddt_target_model m;
    check(ddt_target_open_synthetic(&cfg, 29, &m, err, sizeof err) == 0, "synthetic: %s", err);
    lossless_case("qwen3, stop token 5", &m, 4, 30.0f, 5);
    ddt_target_close(&m);
}

static void test_lossless_qwen35(void)
{
    ddt_target_model m;
    if (!open_shared("qwen35-tiny/text-only", &m))
        return;
    lossless_case("qwen3_5 tiny", &m, 4, 1.0f, -1);
    lossless_case("qwen3_5 tiny", &m, 8, 30.0f, -1);
    ddt_target_close(&m);
}

static void test_lossless_stories(void)
{
    ddt_target_model m;
    if (!open_shared("stories260k", &m))
        return;
    lossless_case("stories260K", &m, 4, 1.0f, -1);
    lossless_case("stories260K", &m, 8, 30.0f, -1);
    ddt_target_close(&m);
}

/* ------------------------------------------------------------------------------------------
 * DFlash2: the path selector drafts
 */

static void lossless_dense_dflash2(const char *name, const ddt_target_model *m)
{
    char what[64];
    snprintf(what, sizeof what, "%s dflash2", name);
    lossless_drafter(what, m, dflash2_for(m, 2, 4, 4), 1.0f, 1.0f, -1);
    lossless_drafter(what, m, dflash2_for(m, 2, 6, 8), 30.0f, 3.0f, -1);
}

static void test_lossless_dflash2(void)
{
    for_each_dense(lossless_dense_dflash2);
    ddt_target_model m;
    if (open_shared("qwen35-tiny/text-only", &m)) {
        lossless_drafter("qwen3_5 tiny dflash2", &m, dflash2_for(&m, 2, 8, 16), 30.0f, 3.0f, -1);
        ddt_target_close(&m);
    }
}

/* calls[0] the chain's, calls[1 + i] budget i's tree's, of each prompt (PROMPTS) decoded with
 * drafter dc (Bs of scale successors when DFlash2) */
enum { PROMPTS = 5, SPEC_BUDGETS = 3 };
static void calls_of(const ddt_target_model *m, const ddt_drafter_config dc, float successors,
                     int64_t calls[PROMPTS][1 + SPEC_BUDGETS])
{
    ddt_drafter_weights w;
    float *base = drafter_weights(&dc, 23, 30.0f, &w);
    if (dc.dflash2)
        random_successors(&dc, &w, 41, successors);
    const ddt_speculate_params p = { .gen_len = 30, .n_budgets = SPEC_BUDGETS, .budgets = { 3, 5, 16 }, .stop = -1 };
    char err[512];
    ddt_speculator *s;
    check(ddt_speculator_open(&s, ddk_backend_cpu(), m, &dc, 12, 30, 16, err, sizeof err) == 0, "open: %s", err);
    uint64_t seed = 17;
    for (int i = 0; i < PROMPTS && s; i++) {
        int32_t prompt[12];
        const int64_t P = 1 + (int64_t)(rng_next(&seed) % 12);
        for (int64_t j = 0; j < P; j++)
            prompt[j] = (int32_t)(rng_next(&seed) % (uint64_t)(m->vocab - 1));
        ddt_speculate_prompt_result r;
        check(ddt_speculate_prompt(s, &w, &p, prompt, P, &r, err, sizeof err) == 0 && r.equal, "prompt %d: %s", i, err);
        calls[i][0] = r.chain.calls;
        for (int b = 0; b < SPEC_BUDGETS; b++)
            calls[i][1 + b] = r.tree[b].calls;
    }
    ddt_speculator_close(s);
    free(base);
}

/* a fresh DFlash2 drafter (Bs = 0; its convolutions at identity, its layers full attention)
 * proposes what the DFlash drafter of its backbone does: every call the same with K = V (its
 * lattice is the unary tree), the chain's with K < V; random Bs re-rank: some call differs */
static void test_dflash2_fresh_drafts_as_dflash(void)
{
    char err[512];
    const ddt_target_config cfg = dense_config(1, 32);
    ddt_target_model m;
    check(ddt_target_open_synthetic(&cfg, 29, &m, err, sizeof err) == 0, "synthetic: %s", err);
    int64_t dflash[PROMPTS][1 + SPEC_BUDGETS], all[PROMPTS][1 + SPEC_BUDGETS], top4[PROMPTS][1 + SPEC_BUDGETS],
            random[PROMPTS][1 + SPEC_BUDGETS];
    calls_of(&m, drafter_for(&m, 2, 6), 0.0f, dflash);
    calls_of(&m, dflash2_for(&m, 2, 6, 32), 0.0f, all);
    calls_of(&m, dflash2_for(&m, 2, 6, 4), 0.0f, top4);
    calls_of(&m, dflash2_for(&m, 2, 6, 8), 3.0f, random);
    int64_t accepted = 0, differ = 0;
    for (int i = 0; i < PROMPTS; i++) {
        check(!memcmp(all[i], dflash[i], sizeof all[i]), "prompt %d, K = V: calls (chain, trees 3, 5, 16) %lld %lld "
              "%lld %lld, DFlash's %lld %lld %lld %lld", i, (long long)all[i][0], (long long)all[i][1],
              (long long)all[i][2], (long long)all[i][3], (long long)dflash[i][0], (long long)dflash[i][1],
              (long long)dflash[i][2], (long long)dflash[i][3]);
        check(top4[i][0] == dflash[i][0], "prompt %d, K = 4: %lld chain calls, DFlash's %lld", i,
              (long long)top4[i][0], (long long)dflash[i][0]);
        accepted += dflash[i][0] < 29;   /* a call accepted a draft: the comparison says something */
        differ += memcmp(random[i], dflash[i], sizeof random[i]) != 0;
    }
    check(accepted > 0, "no chain call accepted a draft: pick a sharper drafter");
    check(differ > 0, "random successors never changed a call: is the selector drafting?");
    ddt_target_close(&m);
}

/* ------------------------------------------------------------------------------------------
 * The drafter's context cache: drafting over the cached context K/V gives the drafts of the
 * whole context's forward. The context products then run over fewer rows (the new ones), which
 * a BLAS may sum in another order, so the hidden states may differ in their last bits: the
 * tokens and the calls are compared, not the bits.
 */

/* prompts decoded with the cache and without it (params.uncached): the same tokens and the same
 * calls, chain and every tree, prompt by prompt; *accepting += the runs where a call accepted a
 * draft (a run that never does would compare little) */
static void cache_agrees(const char *what, const ddt_target_model *m, const ddt_drafter_config dc, int64_t *accepting)
{
    ddt_drafter_weights w;
    float *base = drafter_weights(&dc, 23, 30.0f, &w);
    if (dc.dflash2)
        random_successors(&dc, &w, 41, 3.0f);
    ddt_speculate_params p = { .gen_len = 30, .n_budgets = SPEC_BUDGETS, .budgets = { 3, 5, 16 }, .stop = -1 };
    char err[512];
    ddt_speculator *s;
    check(ddt_speculator_open(&s, ddk_backend_cpu(), m, &dc, 16, 30, 16, err, sizeof err) == 0, "%s: open: %s", what,
          err);
    uint64_t seed = 5;
    for (int i = 0; i < PROMPTS && s; i++) {
        int32_t prompt[16];
        const int64_t P = 1 + (int64_t)(rng_next(&seed) % 16);
        for (int64_t j = 0; j < P; j++)
            prompt[j] = (int32_t)(rng_next(&seed) % (uint64_t)(m->vocab - 1));
        ddt_speculate_prompt_result r[2];   /* cached, uncached */
        for (int u = 0; u < 2; u++) {
            p.uncached = u;
            check(ddt_speculate_prompt(s, &w, &p, prompt, P, &r[u], err, sizeof err) == 0 && r[u].equal,
                  "%s: prompt %d (%s): %s", what, i, u ? "uncached" : "cached", err);
            /* the runs' tokens live in the speculator until its next prompt: keep the cached ones */
            if (u == 0) {
                static int32_t kept[1 + SPEC_BUDGETS][30];
                for (int b = -1; b < SPEC_BUDGETS; b++) {
                    ddt_speculate_run *x = b < 0 ? &r[0].chain : &r[0].tree[b];
                    memcpy(kept[1 + b], x->tokens, (size_t)x->n * sizeof(int32_t));
                    x->tokens = kept[1 + b];
                }
            }
        }
        for (int b = -1; b < SPEC_BUDGETS; b++) {
            const ddt_speculate_run *x = b < 0 ? &r[0].chain : &r[0].tree[b], *y = b < 0 ? &r[1].chain : &r[1].tree[b];
            check(x->n == y->n && x->calls == y->calls && !memcmp(x->tokens, y->tokens, (size_t)x->n * sizeof(int32_t)),
                  "%s: prompt %d, %s%lld: cached %lld tokens in %lld calls, uncached %lld in %lld (or other tokens)",
                  what, i, b < 0 ? "chain" : "tree ", b < 0 ? 0LL : (long long)p.budgets[b], (long long)x->n,
                  (long long)x->calls, (long long)y->n, (long long)y->calls);
            *accepting += x->calls < x->n - 1;
        }
    }
    ddt_speculator_close(s);
    free(base);
}

/* DFlash and DFlash2 drafters (one of each with a sliding layer: the window over the cache) */
static void cache_dense(const char *name, const ddt_target_model *m)
{
    int64_t accepting = 0;
    char what[64];
    for (int v2 = 0; v2 < 2; v2++)
        for (int sliding = 0; sliding < 2; sliding++) {
            ddt_drafter_config dc = v2 ? dflash2_for(m, 2, 6, 8) : drafter_for(m, 2, 6);
            dc.sliding[1] = sliding;
            dc.sliding_window = sliding ? 7 : 0;
            snprintf(what, sizeof what, "%s %s%s", name, v2 ? "dflash2" : "dflash", sliding ? " sliding" : "");
            cache_agrees(what, m, dc, &accepting);
        }
    check(accepting > 0, "%s: no run accepted a draft: pick a sharper drafter", name);
    printf("  %s: %lld of %d runs accepted a draft\n", name, (long long)accepting, 4 * PROMPTS * (1 + SPEC_BUDGETS));
}

static void test_cache_agrees(void)
{
    for_each_dense(cache_dense);
}

/* ------------------------------------------------------------------------------------------
 * Faithfulness: the chain's calls are the walk of teacher-forced chain lengths
 */

/* On the greedy sequence seq (P prompt tokens, then G generated), the teacher-forced chain length
 * at every anchor p in [P, P+G-2] (SPEC.md 6: 1 + the leading slots whose drafter argmax equals
 * seq[p + k], features from one prefill of the whole sequence), walked as decoding walks it:
 * a call at p yields tau(p) tokens and the next call is at p + tau(p). Its calls are the
 * chain's verification calls exactly (up to float near-ties: none in these cases). A DFlash2
 * drafter's slots are its selector's teacher-forced picks (the predecessors the sequence's). */
static int64_t walked_calls(const ddt_target_model *m, const ddt_drafter_config *dc, const ddt_drafter_weights *w,
                            const int32_t *seq, int64_t P, int64_t G)
{
    const ddk_backend *be = ddk_backend_cpu();
    const int64_t S = P + G, A = G - 1, B = dc->block_size, H = m->hidden, V = m->vocab;
    float *features = xcalloc((size_t)(S * dc->taps * H), sizeof(float)), *hs = xcalloc((size_t)(A * B * H), sizeof(float)),
          *logits = xcalloc((size_t)(B * V), sizeof(float));
    int32_t *anchors = xcalloc((size_t)A, sizeof(int32_t)), *tau = xcalloc((size_t)S, sizeof(int32_t));
    uint8_t *keep = xcalloc((size_t)A, 1), *mask = xcalloc((size_t)S, 1);
    memset(keep, 1, (size_t)A);
    memset(mask, 1, (size_t)S);
    for (int64_t j = 0; j < A; j++)
        anchors[j] = (int32_t)(P + j);
    check(ddt_target_prefill(be, m, seq, S, dc->target_layer_ids, (int)dc->taps, features, NULL, NULL) == 0,
          "teacher-forced prefill");
    const ddt_head head = { m->embed_stored, m->lm_head_stored, m->bf16 };
    ddt_batch b = { 1, S, A, seq, mask, features, NULL, anchors, keep, NULL };
    check(ddt_drafter_forward(be, dc, w, &head, &b, hs) == 0, "teacher-forced drafter forward");
    ddt_selector *sel = NULL;
    char err[256];
    if (dc->dflash2)
        check(ddt_selector_open(&sel, be, dc, err, sizeof err) == 0, "selector: %s", err);
    for (int64_t j = 0; j < A; j++) {
        ddt_target_logits(be, m, hs + j * B * H, B, logits);
        int32_t picks[DDT_MAX_SLOTS], pred[DDT_MAX_SLOTS];
        for (int64_t k = 1; k < B; k++) {
            pred[k] = P + j + k - 1 < S ? seq[P + j + k - 1] : -1;
            int64_t best = 0;   /* the argmax, ties to the lowest id */
            for (int64_t v = 1; v < V; v++)
                best = logits[k * V + v] > logits[k * V + best] ? v : best;
            picks[k] = (int32_t)best;
        }
        if (sel)
            ddt_selector_picks(ddt_selector_fill(sel, w, hs + j * B * H, logits, pred), picks);
        int64_t n = 1;
        for (int64_t k = 1; k < B && P + j + k < S && picks[k] == seq[P + j + k]; k++)
            n++;
        tau[P + j] = (int32_t)n;
    }
    ddt_selector_close(sel);
    int64_t calls = 0;
    for (int64_t p = P, generated = 1; generated < G; calls++) {
        generated += tau[p];
        p += tau[p];
    }
    free(features), free(hs), free(logits), free(anchors), free(tau), free(keep), free(mask);
    return calls;
}

/* accepts: some call must accept a draft (a random drafter on a random 512-token target rarely
 * does); a DFlash2 dc's Bs N(0, 9) */
static void faithful_drafter(const char *what, const ddt_target_model *m, const ddt_drafter_config dc, float gain,
                             int accepts)
{
    ddt_drafter_weights w;
    float *base = drafter_weights(&dc, 31, gain, &w);
    if (dc.dflash2)
        random_successors(&dc, &w, 43, 3.0f);
    enum { G = 48 };
    const ddt_speculate_params p = { .gen_len = G, .stop = -1 };
    char err[512];
    ddt_speculator *s;
    check(ddt_speculator_open(&s, ddk_backend_cpu(), m, &dc, 8, G, 0, err, sizeof err) == 0, "%s: %s", what, err);
    uint64_t seed = 5;
    int64_t multi = 0;
    for (int prompt_i = 0; prompt_i < 4 && s; prompt_i++) {
        int32_t seq[8 + G];
        const int64_t P = 1 + (int64_t)(rng_next(&seed) % 8);
        for (int64_t i = 0; i < P; i++)
            seq[i] = (int32_t)(rng_next(&seed) % (uint64_t)(m->vocab - 1));
        ddt_speculate_prompt_result r;
        check(ddt_speculate_prompt(s, &w, &p, seq, P, &r, err, sizeof err) == 0 && r.equal, "%s: %s", what, err);
        memcpy(seq + P, r.greedy.tokens, (size_t)G * sizeof(int32_t));
        const int64_t walked = walked_calls(m, &dc, &w, seq, P, G);
        check(walked == r.chain.calls, "%s: prompt %d: %lld chain calls, the teacher-forced walk takes %lld", what,
              prompt_i, (long long)r.chain.calls, (long long)walked);
        multi += r.chain.calls < G - 1;   /* some call accepted a draft: the walk is not trivial */
    }
    check(multi > 0 || !accepts, "%s: no call accepted a draft: pick a sharper drafter", what);
    ddt_speculator_close(s);
    free(base);
}

static void faithful_case(const char *what, const ddt_target_model *m, int64_t B, float gain, int accepts)
{
    faithful_drafter(what, m, drafter_for(m, 2, B), gain, accepts);
}

static void test_faithful(void)
{
    char err[512];
    const ddt_target_config cfg = dense_config(1, 32);
    ddt_target_model m;
    check(ddt_target_open_synthetic(&cfg, 29, &m, err, sizeof err) == 0, "synthetic: %s", err);
    faithful_case("qwen3", &m, 6, 30.0f, 1);
    faithful_drafter("qwen3 dflash2", &m, dflash2_for(&m, 2, 6, 8), 30.0f, 1);
    ddt_target_close(&m);
    if (open_shared("qwen35-tiny/text-only", &m)) {
        faithful_case("qwen3_5 tiny", &m, 4, 30.0f, 0);
        ddt_target_close(&m);
    }
}

/* ------------------------------------------------------------------------------------------
 * Bad input
 */

static void test_bad_input(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    char err[512];
    const ddt_target_config cfg = dense_config(1, 32);
    ddt_target_model m;
    check(ddt_target_open_synthetic(&cfg, 3, &m, err, sizeof err) == 0, "synthetic: %s", err);
    ddt_speculator *s;
    ddt_drafter_config dc = drafter_for(&m, 1, 4);
    dc.hidden = 16;
    check(ddt_speculator_open(&s, be, &m, &dc, 8, 8, 4, err, sizeof err) == -EINVAL && strstr(err, "hidden_size"),
          "a drafter of another hidden size: %s", err);
    dc = drafter_for(&m, 1, 4);
    dc.vocab = 64;
    check(ddt_speculator_open(&s, be, &m, &dc, 8, 8, 4, err, sizeof err) == -EINVAL && strstr(err, "vocab_size"),
          "a drafter of another vocabulary: %s", err);
    dc = drafter_for(&m, 1, 4);
    dc.target_layer_ids[1] = 3;
    check(ddt_speculator_open(&s, be, &m, &dc, 8, 8, 4, err, sizeof err) == -EINVAL &&
              strstr(err, "target_layer_ids[1]"), "a tap past the target's layers: %s", err);
    dc = drafter_for(&m, 1, 4);
    dc.num_target_layers = 5;
    check(ddt_speculator_open(&s, be, &m, &dc, 8, 8, 4, err, sizeof err) == -EINVAL &&
              strstr(err, "num_target_layers"), "a drafter for a target of other depth: %s", err);

    dc = drafter_for(&m, 1, 4);
    ddt_drafter_weights w;
    float *base = drafter_weights(&dc, 1, 1.0f, &w);
    check(ddt_speculator_open(&s, be, &m, &dc, 8, 8, 4, err, sizeof err) == 0, "open: %s", err);
    int32_t prompt[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
    ddt_speculate_params p = { .gen_len = 8, .n_budgets = 1, .budgets = { 4 }, .stop = -1 };
    ddt_speculate_prompt_result r;
    check(ddt_speculate_prompt(s, &w, &p, prompt, 9, &r, err, sizeof err) == -EINVAL && strstr(err, "prompt of 9"),
          "a prompt longer than the speculator's: %s", err);
    p.budgets[0] = 5;
    check(ddt_speculate_prompt(s, &w, &p, prompt, 4, &r, err, sizeof err) == -EINVAL && strstr(err, "planned cap"),
          "a budget above the cap: %s", err);
    p.budgets[0] = 4;
    p.gen_len = 9;
    check(ddt_speculate_prompt(s, &w, &p, prompt, 4, &r, err, sizeof err) == -EINVAL && strstr(err, "gen_len 9"),
          "gen_len above the speculator's: %s", err);
    p.gen_len = 8;
    prompt[2] = 32;
    check(ddt_speculate_prompt(s, &w, &p, prompt, 4, &r, err, sizeof err) == -EINVAL && strstr(err, "token 2"),
          "a token outside the vocabulary: %s", err);
    prompt[2] = 3;
    check(ddt_speculate_prompt(s, &w, &p, prompt, 4, &r, err, sizeof err) == 0 && r.equal, "a good prompt: %s", err);
    ddt_speculator_close(s);
    free(base);
    ddt_target_close(&m);
}

int main(void)
{
    static const test_case cases[] = {
        { "tree verify == chain per root path, path rollback (dense)", test_tree_dense },
        { "tree verify == chain per root path, path rollback (qwen3_5 tiny)", test_tree_qwen35 },
        { "lossless: chain and trees == greedy (dense synthetic)", test_lossless_dense },
        { "lossless with a stop token", test_lossless_stop },
        { "lossless (qwen3_5 tiny)", test_lossless_qwen35 },
        { "lossless (stories260K)", test_lossless_stories },
        { "lossless: a DFlash2 drafter's selector chain and lattice trees == greedy", test_lossless_dflash2 },
        { "DFlash2 with Bs = 0 drafts as DFlash (K = V: trees too); random Bs re-rank",
          test_dflash2_fresh_drafts_as_dflash },
        { "the drafter's context cache drafts as the whole context's forward (tokens, calls)", test_cache_agrees },
        { "faithful: chain calls == the walk of teacher-forced chain lengths", test_faithful },
        { "bad input refused", test_bad_input },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
