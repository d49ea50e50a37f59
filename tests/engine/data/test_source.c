/* test_source.c: generation (generate.h), the dense target's decoding cache (target.h's
 * ddt_target_cache over target_dense_cache.c), ddt_target_open's dispatch and the feature
 * sources (source.h).
 * Generation: determinism per seed, greedy == argmax of the full forward's logits, the decode's
 * hidden states == the full forward's (llama and qwen3, chunked prefill of a prompt), top_p -> 0
 * == greedy. The dense cache (llama and qwen3, GQA): extend in pieces and token-by-token decode
 * give the taps, final hidden states and logits of one prefill; a verify block rolled back to
 * any accepted count (0 .. B), then a verify accepted whole and an extend, gives what a fresh
 * prefill of the kept tokens gives (a stale or lost key would differ far beyond rounding).
 * ddt_target_open: llama / qwen3 directories written here open through the "dense" ops to the
 * weights written, the shared qwen35-tiny (qwen3_5, qwen3_5_text; "skipped" when absent)
 * through "qwen3_5". Sources: synthetic (order, seek, held-out), hf with a token file over a llama
 * directory written here (shuffle per epoch, cut, skip, held-out reservation, features ==
 * the target's forward), shards written here (read back exactly, BF16, tied heads, every
 * validation rule refused with the file named), empty and one-token sequences skipped;
 * tokens_only (a co-located run): the same tokens, no features, a token file's target never
 * opened (no head), shards refused. Generated data without a source (a co-located trainer):
 * ddt_source_generate over a replica on rank 1's CPU backend gives the source's training and
 * held-out tokens; ddt_source_check keeps open's rules.
 * Good files are written through shard.h's writers; the broken ones by hand (shard.h's own
 * rules are tested by tests/engine/data/test_shard.c).
 * ctest: one line per case, a final "N passed, M failed".
 *
 * Legend: S tokens, H hidden, F = L_t*H feature width, V vocabulary.
 */
#include "check.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "model/generate.h"
#include "model/safetensors.h"
#include "data/shard.h"
#include "data/source.h"
#include "model/target.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef DDTREE_SHARED_MODELS
#define DDTREE_SHARED_MODELS "../shared/models"
#endif

enum { H = 16, V = 50, N_TAPS = 2, F = N_TAPS * H, MAX_S = 96 };

static char tmpdir[] = "/tmp/ddtree_test_source.XXXXXX";

static ddt_target_config tiny_config(int qwen3)
{
    return (ddt_target_config){ .qwen3 = qwen3, .hidden = H, .layers = 3, .heads = 4, .kv_heads = 2,
                                .head_dim = 4, .intermediate = 24, .vocab = V, .rms_norm_eps = 1e-6f,
                                .rope_theta = 10000.0f, .tie_word_embeddings = 0 };
}

static double max_rel_diff(const float *a, const float *b, int64_t n)
{
    double diff = 0.0, scale = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

/* ------------------------------------------------------------------------------------------
 * Generation
 */

static void test_generate_deterministic(void)
{
    ddt_target_model t;
    char err[512] = "";
    ddt_target_config c = tiny_config(0);
    check(ddt_target_open_synthetic(&c, 3, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    ddt_generator g;
    check(ddt_generator_open(&g, ddk_backend_cpu(), &t, 32, err, sizeof err) == 0, "generator: %s", err);
    const ddt_generate_params p = { 1.0f, 0.95f };
    int32_t a[32], b[32], other[32], heldout[32];
    uint64_t s0 = ddt_generate_seed(7, 0, "train");
    check(ddt_generate(&g, &p, s0, NULL, 0, 32, a, NULL) == 0, "generate failed");
    check(ddt_generate(&g, &p, ddt_generate_seed(7, 1, "train"), NULL, 0, 32, other, NULL) == 0, "generate failed");
    check(ddt_generate(&g, &p, s0, NULL, 0, 32, b, NULL) == 0, "generate failed");
    check(ddt_generate(&g, &p, ddt_generate_seed(7, 0, "heldout"), NULL, 0, 32, heldout, NULL) == 0, "generate failed");
    check(!memcmp(a, b, sizeof a), "the same seed gave different tokens (after another sequence in between)");
    check(memcmp(a, other, sizeof a) != 0, "sequence indices 0 and 1 gave the same tokens");
    check(memcmp(a, heldout, sizeof a) != 0, "streams train and heldout gave the same tokens");
    int in_range = 1, distinct = 0;
    for (int i = 0; i < 32; i++) {
        in_range &= a[i] >= 0 && a[i] < V;
        distinct += i > 0 && a[i] != a[i - 1];
    }
    check(in_range, "a token outside [0, V)");
    check(distinct > 4, "temperature 1 sampled a near-constant sequence (%d changes)", distinct);
    check(ddt_generate(&g, &p, s0, NULL, 0, 33, a, NULL) == -EINVAL, "S > max_len accepted");

    /* a stop token: the same tokens through the first sampled one equal to it, the rest untouched;
     * one never sampled: the whole length */
    const int32_t prompt[3] = { a[0], a[1], a[2] };
    int32_t whole[32], until[32];
    int64_t len = -1, first = -1;
    check(ddt_generate(&g, &p, 9, prompt, 3, 32, whole, NULL) == 0, "generate failed");
    for (int64_t i = 3; i < 32 && first < 0; i++)
        if (whole[i] == whole[10])
            first = i;
    for (int i = 0; i < 32; i++)
        until[i] = -7;
    check(ddt_generate_until(&g, &p, 9, prompt, 3, 32, whole[10], until, NULL, &len) == 0 && len == first + 1 &&
          !memcmp(until, whole, (size_t)len * sizeof(int32_t)) && (len == 32 || until[len] == -7),
          "stopping at token %d: length %lld, want %lld, or other tokens", whole[10], (long long)len,
          (long long)first + 1);
    check(ddt_generate_until(&g, &p, 9, prompt, 3, 32, V, until, NULL, &len) == 0 && len == 32 &&
          !memcmp(until, whole, sizeof whole), "a stop never sampled: length %lld, or other tokens", (long long)len);
    ddt_generator_free(&g);
    ddt_target_close(&t);
}

/* tokens (S) sampled greedily: each is the argmax of the full forward's logits one before */
static void test_greedy_is_argmax(void)
{
    ddt_target_model t;
    char err[512] = "";
    ddt_target_config c = tiny_config(0);
    check(ddt_target_open_synthetic(&c, 5, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    ddt_generator g;
    enum { S = 40 };
    check(ddt_generator_open(&g, ddk_backend_cpu(), &t, S, err, sizeof err) == 0, "generator: %s", err);
    const ddt_generate_params greedy = { 0.0f, 1.0f };
    int32_t tokens[S];
    check(ddt_generate(&g, &greedy, 11, NULL, 0, S, tokens, NULL) == 0, "generate failed");
    float *hidden = xcalloc(S * H, sizeof(float));   /* (S, H) */
    check(ddt_target_prefill(ddk_backend_cpu(), &t, tokens, S, NULL, 0, NULL, hidden, NULL) == 0, "prefill failed");
    int wrong = 0, changes = 0;
    for (int64_t i = 0; i + 1 < S; i++) {
        int64_t best = 0;
        float z[V];
        for (int64_t v = 0; v < V; v++) {
            z[v] = 0.0f;
            for (int64_t j = 0; j < H; j++)
                z[v] += hidden[i * H + j] * t.lm_head[v * H + j];
            if (z[v] > z[best])
                best = v;
        }
        wrong += tokens[i + 1] != best;
        changes += tokens[i + 1] != tokens[i];
    }
    check(wrong == 0, "%d of %d greedy tokens differ from the full forward's argmax", wrong, S - 1);
    check(changes > 0, "greedy output is constant: a weak test");
    free(hidden);
    ddt_generator_free(&g);
    ddt_target_close(&t);
}

/* the decode's hidden states at every position == ddt_target_prefill's final_hidden */
static void decode_matches_forward(int qwen3, int64_t P, int64_t S)
{
    ddt_target_model t;
    char err[512] = "";
    ddt_target_config c = tiny_config(qwen3);
    check(ddt_target_open_synthetic(&c, 9 + (uint64_t)qwen3, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    ddt_generator g;
    check(ddt_generator_open(&g, ddk_backend_cpu(), &t, S, err, sizeof err) == 0, "generator: %s", err);
    int32_t prompt[MAX_S], tokens[MAX_S];
    for (int64_t i = 0; i < P; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % V);
    const ddt_generate_params p = { 1.0f, 1.0f };
    float *decoded = xcalloc((size_t)(S * H), sizeof(float)), *full = xcalloc((size_t)(S * H), sizeof(float));
    check(ddt_generate(&g, &p, 21, P ? prompt : NULL, P, S, tokens, decoded) == 0, "generate failed");
    check(P == 0 || !memcmp(tokens, prompt, (size_t)P * sizeof *prompt), "the prompt was not kept");
    check(ddt_target_prefill(ddk_backend_cpu(), &t, tokens, S, NULL, 0, NULL, full, NULL) == 0, "prefill failed");
    double worst = 0.0;
    int64_t at = -1;
    for (int64_t i = 0; i < S; i++) {
        double r = max_rel_diff(decoded + i * H, full + i * H, H);
        if (r > worst) {
            worst = r;
            at = i;
        }
    }
    /* float32 sums in another order (one row vs the whole sequence; plain C vs BLAS) */
    check(worst <= 1e-5, "%s, prompt %lld: decode hidden differs from the full forward by %.3g (relative) at %lld",
          qwen3 ? "qwen3" : "llama", (long long)P, worst, (long long)at);
    free(decoded);
    free(full);
    ddt_generator_free(&g);
    ddt_target_close(&t);
}

static void test_decode_matches_forward(void)
{
    decode_matches_forward(0, 0, 48);
    decode_matches_forward(1, 0, 48);
    decode_matches_forward(0, 70, 90);   /* prefill in two chunks, then decode */
    decode_matches_forward(1, 5, 30);
}

static void test_top_p_tiny_is_greedy(void)
{
    ddt_target_model t;
    char err[512] = "";
    ddt_target_config c = tiny_config(1);
    check(ddt_target_open_synthetic(&c, 13, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    ddt_generator g;
    check(ddt_generator_open(&g, ddk_backend_cpu(), &t, 40, err, sizeof err) == 0, "generator: %s", err);
    const ddt_generate_params greedy = { 0.0f, 1.0f }, nucleus = { 1.0f, 1e-9f }, full = { 1.0f, 1.0f };
    int32_t a[40], b[40], sampled[40];
    for (uint64_t seed = 1; seed <= 3; seed++) {
        check(ddt_generate(&g, &greedy, seed, NULL, 0, 40, a, NULL) == 0, "generate failed");
        check(ddt_generate(&g, &nucleus, seed, NULL, 0, 40, b, NULL) == 0, "generate failed");
        check(ddt_generate(&g, &full, seed, NULL, 0, 40, sampled, NULL) == 0, "generate failed");
        check(!memcmp(a, b, sizeof a), "seed %llu: top_p 1e-9 differs from greedy", (unsigned long long)seed);
        check(memcmp(a, sampled, sizeof a) != 0, "seed %llu: top_p 1 equals greedy (sampling had no effect)",
              (unsigned long long)seed);
    }
    ddt_generator_free(&g);
    ddt_target_close(&t);
}

/* with top_p 0.5 every sampled token lies in the nucleus of the full forward's distribution
 * (the fewest most likely tokens whose probability reaches 0.5), and not always at its head */
static void test_top_p_nucleus(void)
{
    ddt_target_model t;
    char err[512] = "";
    ddt_target_config c = tiny_config(0);
    check(ddt_target_open_synthetic(&c, 15, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    ddt_generator g;
    enum { S = 64 };
    check(ddt_generator_open(&g, ddk_backend_cpu(), &t, S, err, sizeof err) == 0, "generator: %s", err);
    const float temperature = 0.7f, top_p = 0.5f;
    const ddt_generate_params p = { temperature, top_p };
    int32_t tokens[S];
    check(ddt_generate(&g, &p, 4, NULL, 0, S, tokens, NULL) == 0, "generate failed");
    float *hidden = xcalloc(S * H, sizeof(float));   /* (S, H) */
    check(ddt_target_prefill(ddk_backend_cpu(), &t, tokens, S, NULL, 0, NULL, hidden, NULL) == 0, "prefill failed");
    int outside = 0, not_first = 0;
    for (int64_t i = 0; i + 1 < S; i++) {
        double z[V], max = -1e30, sum = 0.0;
        for (int64_t v = 0; v < V; v++) {
            z[v] = 0.0;
            for (int64_t j = 0; j < H; j++)
                z[v] += (double)hidden[i * H + j] * t.lm_head[v * H + j];
            max = fmax(max, z[v]);
        }
        for (int64_t v = 0; v < V; v++)
            sum += exp((z[v] - max) / temperature);
        /* the probability of the tokens more likely than the sampled one: below top_p in the
         * nucleus (1e-4: the decode's logits are the forward's up to float rounding) */
        const int32_t y = tokens[i + 1];
        double before = 0.0;
        for (int64_t v = 0; v < V; v++)
            if (z[v] > z[y])
                before += exp((z[v] - max) / temperature) / sum;
        outside += before >= top_p + 1e-4;
        not_first += before > 0.0;
    }
    check(outside == 0, "%d of %d tokens outside the nucleus", outside, S - 1);
    check(not_first > 0, "top_p 0.5 always took the most likely token: a weak test");
    free(hidden);
    ddt_generator_free(&g);
    ddt_target_close(&t);
}

/* ------------------------------------------------------------------------------------------
 * The dense target's decoding cache (target.h's ddt_target_cache over target_dense_cache.c)
 */

/* Prefill's and the cache's rows differ by float32 rounding only: a BLAS product of T rows
 * against C-row chunks or plain C 8-wide matrix-vector products, the cached attention against
 * causal_attention: ~1e-6 seen, 1e-5 allowed (a stale or missing key moves a row by ~1e-1). */
static const double DENSE_CACHE_TOL = 1e-5;
enum { DC_T = 80, DC_TAPS = 3, DC_BLOCK = 5 };   /* T crosses the cache's 64-row passes */
static const int32_t dc_taps[DC_TAPS] = { 2, 0, 1 };

/* GQA (4 heads over 2); widths 24, 40 (multiples of 8) and 36, 50, head_dim 10 (not): the
 * 8-wide loops' vector and tail paths both */
static ddt_target_config dense_cache_config(int qwen3)
{
    return (ddt_target_config){ .qwen3 = qwen3, .hidden = 24, .layers = 3, .heads = 4, .kv_heads = 2,
                                .head_dim = 10, .intermediate = 36, .vocab = V, .rms_norm_eps = 1e-6f,
                                .rope_theta = 10000.0f };
}

/* the outputs of T rows: taps (T, DC_TAPS H), final (T, H), logits (T, V) */
typedef struct dc_rows {
    float *features, *final, *logits;
} dc_rows;

static dc_rows dc_rows_alloc(const ddt_target_model *m, int64_t T)
{
    return (dc_rows){ xcalloc((size_t)(T * DC_TAPS * m->hidden), sizeof(float)),
                      xcalloc((size_t)(T * m->hidden), sizeof(float)), xcalloc((size_t)(T * m->vocab), sizeof(float)) };
}

static void dc_rows_free(dc_rows *r)
{
    free(r->features), free(r->final), free(r->logits);
}

/* a fresh prefill of tokens (T) */
static dc_rows dc_prefill(const ddt_target_model *m, const int32_t *tokens, int64_t T)
{
    dc_rows r = dc_rows_alloc(m, T);
    check(ddt_target_prefill(ddk_backend_cpu(), m, tokens, T, dc_taps, DC_TAPS, r.features, r.final, r.logits) == 0,
          "prefill of %lld tokens failed", (long long)T);
    return r;
}

/* rows [i, i + n) of got against rows [j, j + n) of want: taps, final hidden, logits, each row
 * by max |d| / max |want|; the worst into *worst */
static void dc_compare(const ddt_target_model *m, const dc_rows *got, int64_t i, const dc_rows *want, int64_t j,
                       int64_t n, const char *what, double *worst)
{
    const int64_t hidden = m->hidden, width = DC_TAPS * hidden;
    for (int64_t r = 0; r < n; r++) {
        const double e[3] = { normalised_error_ff(got->features + (i + r) * width, want->features + (j + r) * width,
                                                  width),
                              normalised_error_ff(got->final + (i + r) * hidden, want->final + (j + r) * hidden,
                                                  hidden),
                              normalised_error_ff(got->logits + (i + r) * m->vocab, want->logits + (j + r) * m->vocab,
                                                  m->vocab) };
        for (int k = 0; k < 3; k++) {
            check(e[k] <= DENSE_CACHE_TOL, "%s %s, position %lld: %s differ by %.3g", m->model_type, what,
                  (long long)(j + r), (const char *[]){ "taps", "final hidden", "logits" }[k], e[k]);
            *worst = fmax(*worst, e[k]);
        }
    }
}

/* a fixed token sequence in [0, V), salted */
static void dc_tokens(int32_t *tokens, int64_t T, int salt)
{
    for (int64_t i = 0; i < T; i++)
        tokens[i] = (int32_t)((i * 31 + 7 * (i % 3) + salt) % V);
}

/* how the dense cache tests open their targets: NULL (CPU, fp32, the fast paths), then bf16 and
 * generic (the backend ops only) */
static const ddt_target_options *dc_options;

/* extend in pieces (one crossing a 64-row pass), and token by token: the prefill's rows */
static void dense_cache_extend(int qwen3)
{
    ddt_target_model m;
    char err[512] = "";
    ddt_target_config cfg = dense_cache_config(qwen3);
    check(ddt_target_open_synthetic_with(&cfg, 31 + (uint64_t)qwen3, dc_options, &m, err, sizeof err) == 0,
          "synthetic: %s", err);
    const int64_t hidden = m.hidden, width = DC_TAPS * hidden;
    int32_t tokens[DC_T];
    dc_tokens(tokens, DC_T, 3);
    dc_rows want = dc_prefill(&m, tokens, DC_T), pieces = dc_rows_alloc(&m, DC_T), steps = dc_rows_alloc(&m, DC_T);
    ddt_target_cache c;
    check(ddt_target_cache_open(ddk_backend_cpu(), &m, DC_T, DC_BLOCK, &c, err, sizeof err) == 0, "cache: %s", err);
    static const int64_t piece[] = { 70, 3, 7 };   /* 70: two passes inside the cache */
    int rc = 0;
    for (int64_t k = 0, p0 = 0; rc == 0 && k < 3; p0 += piece[k++])
        rc = ddt_target_extend(&c, tokens + p0, piece[k], dc_taps, DC_TAPS, pieces.features + p0 * width,
                               pieces.final + p0 * hidden, pieces.logits + p0 * m.vocab);
    check(rc == 0 && c.len == DC_T, "extend 70 + 3 + 7: %d, len %lld", rc, (long long)c.len);
    double worst = 0.0;
    dc_compare(&m, &pieces, 0, &want, 0, DC_T, "extend 70 + 3 + 7", &worst);
    ddt_target_cache_reset(&c);
    for (int64_t t = 0; rc == 0 && t < DC_T; t++)
        rc = ddt_target_decode(&c, tokens[t], dc_taps, DC_TAPS, steps.features + t * width, steps.final + t * hidden,
                               steps.logits + t * m.vocab);
    check(rc == 0 && c.len == DC_T, "decode x %d: %d, len %lld", DC_T, rc, (long long)c.len);
    dc_compare(&m, &steps, 0, &want, 0, DC_T, "decode token by token", &worst);
    check(ddt_target_decode(&c, tokens[0], NULL, 0, NULL, steps.final, NULL) == -EINVAL, "decode past max_len");
    printf("  %s: prefill of %d == extend in pieces == decode: max error %.3g\n", m.model_type, DC_T, worst);
    ddt_target_cache_close(&c);
    dc_rows_free(&want), dc_rows_free(&pieces), dc_rows_free(&steps);
    ddt_target_close(&m);
}

static void test_dense_cache_extend(void)
{
    dense_cache_extend(0);
    dense_cache_extend(1);
}

/* after a prefix of P: verify B (the first 2 the sequence's own, the rest not), rollback to a,
 * verify the next B and accept them all, then extend 3 more: every row == a fresh prefill of
 * what was kept (the block's rows: of the prefix and the whole block) */
static void dense_cache_verify(int qwen3)
{
    ddt_target_model m;
    char err[512] = "";
    ddt_target_config cfg = dense_cache_config(qwen3);
    check(ddt_target_open_synthetic_with(&cfg, 41 + (uint64_t)qwen3, dc_options, &m, err, sizeof err) == 0,
          "synthetic: %s", err);
    enum { P = 10, B = DC_BLOCK, MORE = 3 };
    int32_t tokens[DC_T], draft[B];
    dc_tokens(tokens, DC_T, 5);
    for (int64_t i = 0; i < B; i++)
        draft[i] = i < 2 ? tokens[P + i] : (int32_t)((tokens[P + i] + 1) % V);
    double worst = 0.0;
    for (int64_t a = 0; a <= B; a++) {
        ddt_target_cache c;
        check(ddt_target_cache_open(ddk_backend_cpu(), &m, DC_T, B, &c, err, sizeof err) == 0, "cache: %s", err);
        dc_rows prefix = dc_rows_alloc(&m, P), block = dc_rows_alloc(&m, B), second = dc_rows_alloc(&m, B),
                more = dc_rows_alloc(&m, MORE);
        int rc = ddt_target_extend(&c, tokens, P, dc_taps, DC_TAPS, prefix.features, prefix.final, prefix.logits);
        rc = rc ? rc : ddt_target_verify(&c, draft, B, dc_taps, DC_TAPS, block.features, block.final, block.logits);
        check(rc == 0 && c.len == P && c.pending == B, "verify: %d", rc);
        check(ddt_target_extend(&c, tokens, 1, NULL, 0, NULL, more.final, NULL) == -EINVAL, "extend before rollback");
        rc = rc ? rc : ddt_target_rollback(&c, a);
        check(rc == 0 && c.len == P + a && c.pending == 0, "rollback to %lld: %d", (long long)a, rc);
        /* what was kept: the prefix, a of the draft, then B + MORE of a continuation */
        int32_t fed[P + 2 * B + MORE];
        memcpy(fed, tokens, P * sizeof *fed);
        memcpy(fed + P, draft, (size_t)a * sizeof *fed);
        for (int64_t i = P + a; i < P + a + B + MORE; i++)
            fed[i] = (int32_t)((i * 17 + 11) % V);
        rc = rc ? rc : ddt_target_verify(&c, fed + P + a, B, dc_taps, DC_TAPS, second.features, second.final,
                                         second.logits);
        rc = rc ? rc : ddt_target_rollback(&c, B);
        rc = rc ? rc : ddt_target_extend(&c, fed + P + a + B, MORE, dc_taps, DC_TAPS, more.features, more.final,
                                         more.logits);
        check(rc == 0 && c.len == P + a + B + MORE, "verify, rollback to %d, extend %d: %d", B, MORE, rc);
        int32_t whole[P + B];
        memcpy(whole, tokens, P * sizeof *whole);
        memcpy(whole + P, draft, B * sizeof *whole);
        dc_rows want_block = dc_prefill(&m, whole, P + B), want = dc_prefill(&m, fed, P + a + B + MORE);
        char what[64];
        snprintf(what, sizeof what, "verify %d, rollback to %lld", B, (long long)a);
        dc_compare(&m, &prefix, 0, &want, 0, P, what, &worst);
        dc_compare(&m, &block, 0, &want_block, P, B, what, &worst);
        dc_compare(&m, &second, 0, &want, P + a, B, what, &worst);
        dc_compare(&m, &more, 0, &want, P + a + B, MORE, what, &worst);
        dc_rows_free(&want), dc_rows_free(&want_block);
        dc_rows_free(&prefix), dc_rows_free(&block), dc_rows_free(&second), dc_rows_free(&more);
        ddt_target_cache_close(&c);
    }
    ddt_target_cache c;
    float features[32];   /* (1, H) */
    int32_t bad_tap = 3;
    check(ddt_target_cache_open(ddk_backend_cpu(), &m, DC_T, B, &c, err, sizeof err) == 0, "cache: %s", err);
    check(ddt_target_verify(&c, tokens, B + 1, NULL, 0, NULL, NULL, NULL) == -EINVAL, "a block over max_block");
    check(ddt_target_extend(&c, tokens, 1, &bad_tap, 1, features, NULL, NULL) == -EINVAL && c.len == 0,
          "a tap beyond the last layer");
    ddt_target_cache_close(&c);
    printf("  %s: verify %d after %d, rollback to 0..%d, verify, extend == fresh prefill: max error %.3g\n",
           m.model_type, B, P, B, worst);
    ddt_target_close(&m);
}

static void test_dense_cache_verify(void)
{
    dense_cache_verify(0);
    dense_cache_verify(1);
}

/* the same two tests on a bf16 target and on a generic fp32 one (no CPU fast path: the backend's
 * matmul_w16 / matmul for one row, causal_attention with q_rows over the cache): the cache
 * against the same target's prefill, as tight as the fp32 fast path */
static void test_dense_cache_bf16_generic(void)
{
    static const ddt_target_options bf16 = { .bf16 = 1 }, generic = { .generic = 1 };
    const ddt_target_options *const opts[2] = { &bf16, &generic };
    for (int k = 0; k < 2; k++) {
        printf("  %s:\n", k ? "generic fp32" : "bf16");
        dc_options = opts[k];
        test_dense_cache_extend();
        test_dense_cache_verify();
    }
    dc_options = NULL;
}

/* bf16 weights against fp32 ones (the same synthetic values): the matrices and the activations
 * entering each product are rounded to bf16 (relative error 2^-9 each), which through 3 layers,
 * norms and the head gives ~5e-3 seen (max |d| / max |ref|); 2e-2 allowed (SPEC.md 3.1: a bf16
 * path within ~3e-2 of float64 at the last layers). The bf16 head read back (ddt_target_head_copy)
 * is the fp32 head rounded to nearest even, bit for bit. The generic fp32 cache's decode rows
 * against the fast path's: 1e-5 (the order of float sums only). */
static void test_dense_bf16_vs_fp32(void)
{
    static const ddt_target_options bf16 = { .bf16 = 1 }, generic = { .generic = 1 };
    for (int qwen3 = 0; qwen3 < 2; qwen3++) {
        ddt_target_config cfg = dense_cache_config(qwen3);
        ddt_target_model m32, m16, mg;
        char err[512] = "";
        check(ddt_target_open_synthetic(&cfg, 61, &m32, err, sizeof err) == 0, "fp32: %s", err);
        check(ddt_target_open_synthetic_with(&cfg, 61, &bf16, &m16, err, sizeof err) == 0, "bf16: %s", err);
        check(ddt_target_open_synthetic_with(&cfg, 61, &generic, &mg, err, sizeof err) == 0, "generic: %s", err);
        check(m16.embed_tokens == NULL && m16.lm_head == NULL && m16.bf16 && !m16.fast && m32.fast && !mg.fast &&
                  mg.embed_tokens == NULL, "the head pointers: fp32 CPU targets only");
        const ddt_target *t16 = m16.impl, *t32 = m32.impl;
        check(t16->weight_bytes == (size_t)ddt_target_weight_bytes(&cfg, 1) &&
                  t32->weight_bytes == (size_t)ddt_target_param_count(&cfg) * sizeof(float) &&
                  t32->weight_bytes == (size_t)ddt_target_weight_bytes(&cfg, 0) &&
                  t16->weight_bytes < t32->weight_bytes * 6 / 10,
              "weight bytes: bf16 %zu, fp32 %zu", t16->weight_bytes, t32->weight_bytes);
        int32_t tokens[DC_T];
        dc_tokens(tokens, DC_T, 7);
        dc_rows want = dc_prefill(&m32, tokens, DC_T), got = dc_prefill(&m16, tokens, DC_T);
        const int64_t hidden = m32.hidden;
        const double e[3] = { normalised_error_ff(got.features, want.features, DC_T * DC_TAPS * hidden),
                              normalised_error_ff(got.final, want.final, DC_T * hidden),
                              normalised_error_ff(got.logits, want.logits, DC_T * m32.vocab) };
        for (int k = 0; k < 3; k++)
            check(e[k] <= 2e-2 && e[k] > 0, "%s bf16 vs fp32 %s: %.3g", m32.model_type,
                  (const char *[]){ "taps", "final hidden", "logits" }[k], e[k]);
        printf("  %s: bf16 vs fp32 prefill of %d: taps %.3g, final %.3g, logits %.3g\n", m32.model_type, DC_T,
               e[0], e[1], e[2]);
        ddt_target_head head;
        check(ddt_target_head_copy(&m16, &head, err, sizeof err) == 0, "head copy: %s", err);
        int64_t bad = 0;
        for (int64_t i = 0; i < m32.vocab * hidden; i++)
            bad += head.embed_tokens[i] != ddk_round_bf16(m32.embed_tokens[i]) ||
                   head.lm_head[i] != ddk_round_bf16(m32.lm_head[i]);
        check(bad == 0 && head.lm_head != head.embed_tokens, "bf16 head read back: %lld values differ", (long long)bad);
        ddt_target_head_free(&head);
        /* decode on the fast and the generic path */
        ddt_target_cache cf, cg;
        dc_rows fast = dc_rows_alloc(&m32, DC_T), slow = dc_rows_alloc(&mg, DC_T);
        check(ddt_target_cache_open(ddk_backend_cpu(), &m32, DC_T, 1, &cf, err, sizeof err) == 0 &&
                  ddt_target_cache_open(ddk_backend_cpu(), &mg, DC_T, 1, &cg, err, sizeof err) == 0, "cache: %s", err);
        int rc = 0;
        for (int64_t t = 0; rc == 0 && t < DC_T; t++) {
            rc = ddt_target_decode(&cf, tokens[t], dc_taps, DC_TAPS, fast.features + t * DC_TAPS * hidden,
                                   fast.final + t * hidden, fast.logits + t * m32.vocab);
            rc = rc ? rc : ddt_target_decode(&cg, tokens[t], dc_taps, DC_TAPS, slow.features + t * DC_TAPS * hidden,
                                             slow.final + t * hidden, slow.logits + t * m32.vocab);
        }
        check(rc == 0, "decode: %d", rc);
        double worst = 0.0;
        dc_compare(&m32, &slow, 0, &fast, 0, DC_T, "generic decode vs the fast one", &worst);
        printf("  %s: generic cached attention and products vs the fast path, %d decode steps: %.3g\n",
               m32.model_type, DC_T, worst);
        ddt_target_cache_close(&cf), ddt_target_cache_close(&cg);
        dc_rows_free(&fast), dc_rows_free(&slow), dc_rows_free(&want), dc_rows_free(&got);
        ddt_target_close(&m32), ddt_target_close(&m16), ddt_target_close(&mg);
    }
}

/* ------------------------------------------------------------------------------------------
 * Sequences kept by the test
 */

typedef struct saved {
    int64_t S;
    int32_t ids[MAX_S];
    uint8_t mask[MAX_S];
    float features[MAX_S * F], teacher[MAX_S * H];
    int has_teacher;
} saved;

static void save(saved *sv, const ddt_sequence *q)
{
    sv->S = q->S;
    memcpy(sv->ids, q->input_ids, (size_t)q->S * sizeof(int32_t));
    memcpy(sv->mask, q->loss_mask, (size_t)q->S);
    memcpy(sv->features, q->features, (size_t)(q->S * F) * sizeof(float));
    sv->has_teacher = q->teacher_hidden != NULL;
    if (q->teacher_hidden)
        memcpy(sv->teacher, q->teacher_hidden, (size_t)(q->S * H) * sizeof(float));
}

/* bit-identical: the same sequence computed again by the same code */
static int same(const saved *sv, const ddt_sequence *q)
{
    return sv->S == q->S && !memcmp(sv->ids, q->input_ids, (size_t)q->S * sizeof(int32_t)) &&
           !memcmp(sv->mask, q->loss_mask, (size_t)q->S) &&
           !memcmp(sv->features, q->features, (size_t)(q->S * F) * sizeof(float)) &&
           sv->has_teacher == (q->teacher_hidden != NULL) &&
           (!q->teacher_hidden || !memcmp(sv->teacher, q->teacher_hidden, (size_t)(q->S * H) * sizeof(float)));
}

/* ------------------------------------------------------------------------------------------
 * Synthetic source
 */

static ddt_source_config synthetic_config(int prefetch);

static ddt_source_config synthetic_config(int prefetch)
{
    ddt_source_config c;
    memset(&c, 0, sizeof c);
    c.kind = DDT_SOURCE_SYNTHETIC;
    c.synthetic = tiny_config(1);
    c.seq_len = 12;
    c.n_taps = N_TAPS;
    c.taps[0] = 0;
    c.taps[1] = 2;
    c.want_teacher = 1;
    c.temperature = 1.0f;
    c.top_p = 0.9f;
    c.seed = 7;
    c.heldout = 2;
    c.prefetch = prefetch;
    return c;
}

enum { RUN = 6 };
static saved stream[RUN];   /* the synthetic source's first RUN sequences */

static void test_synthetic_order(void)
{
    char err[512] = "";
    ddt_source_config c = synthetic_config(3);
    ddt_source *s, *other;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    if (case_failed)
        return;
    check(ddt_source_vocab(s) == V && ddt_source_target_layers(s) == 3 && ddt_source_embed(s) &&
          ddt_source_lm_head(s), "vocab / layers / heads wrong");
    ddt_sequence q;
    for (int i = 0; i < RUN; i++) {
        check(ddt_source_next(s, &q, err, sizeof err) == 0, "next %d: %s", i, err);
        save(&stream[i], &q);
        int ok = q.S == c.seq_len && q.teacher_hidden;
        for (int64_t j = 0; ok && j < q.S; j++)
            ok = q.loss_mask[j] == 1 && q.input_ids[j] >= 0 && q.input_ids[j] < V;
        float mag = 0.0f;
        for (int64_t j = 0; j < q.S * F; j++)
            mag += fabsf(q.features[j]);
        check(ok && mag > 0.0f && isfinite(mag), "sequence %d malformed (S, mask, ids, features)", i);
    }
    check(ddt_source_cursor(s) == RUN, "cursor %lld after %d next()", (long long)ddt_source_cursor(s), RUN);
    check(memcmp(stream[0].ids, stream[1].ids, sizeof stream[0].ids) != 0, "sequences 0 and 1 are the same");
    ddt_source_close(s);

    /* another queue depth, the same stream */
    c.prefetch = 1;
    check(ddt_source_open(&c, H, &other, err, sizeof err) == 0, "open: %s", err);
    for (int i = 0; i < RUN && !case_failed; i++) {
        check(ddt_source_next(other, &q, err, sizeof err) == 0, "next %d: %s", i, err);
        check(same(&stream[i], &q), "prefetch 1 gave another sequence %d than prefetch 3", i);
    }
    ddt_source_close(other);
}

static void test_synthetic_seek(void)
{
    char err[512] = "";
    ddt_source_config c = synthetic_config(2);
    ddt_source *s;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    if (case_failed)
        return;
    ddt_sequence q;
    check(ddt_source_seek(s, 3) == 0 && ddt_source_cursor(s) == 3, "seek(3)");
    for (int i = 3; i < RUN; i++) {
        check(ddt_source_next(s, &q, err, sizeof err) == 0, "next: %s", err);
        check(same(&stream[i], &q), "after seek(3): sequence %d differs from the original stream", i);
    }
    /* back; the sequence handed out last stays intact while the loader refills the queue */
    check(ddt_source_seek(s, 1) == 0, "seek(1)");
    usleep(20000);
    check(same(&stream[RUN - 1], &q), "the sequence handed out last was overwritten after a seek");
    for (int i = 1; i < 3; i++) {
        check(ddt_source_next(s, &q, err, sizeof err) == 0, "next: %s", err);
        check(same(&stream[i], &q), "after seek(1): sequence %d differs from the original stream", i);
    }
    check(ddt_source_cursor(s) == 3, "cursor %lld, expected 3", (long long)ddt_source_cursor(s));
    /* seeks right after a next(), when the loader is most likely in the middle of a sequence
     * that must then be dropped */
    for (int k = 0; k < 200 && !case_failed; k++) {
        const int at = (k * 5) % (RUN - 1);
        check(ddt_source_seek(s, at) == 0, "seek(%d)", at);
        for (int i = at; i < at + 2; i++) {
            check(ddt_source_next(s, &q, err, sizeof err) == 0, "next: %s", err);
            check(same(&stream[i], &q), "repeated seeks: sequence %d differs from the original stream", i);
        }
    }
    check(ddt_source_seek(s, -1) == -EINVAL, "seek(-1) accepted");
    ddt_source_close(s);   /* with the loader busy filling the queue */
}

static void test_synthetic_heldout(void)
{
    char err[512] = "";
    ddt_source_config c = synthetic_config(2);
    ddt_source *s, *again;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    check(ddt_source_open(&c, H, &again, err, sizeof err) == 0, "open: %s", err);
    if (case_failed)
        return;
    ddt_sequence q;
    saved *held = xcalloc(2, sizeof *held);
    for (int i = 0; i < 2; i++) {
        check(ddt_source_heldout(s, i, &q, err, sizeof err) == 0, "heldout %d: %s", i, err);
        save(&held[i], &q);
        for (int j = 0; j < RUN; j++)
            check(memcmp(held[i].ids, stream[j].ids, (size_t)q.S * sizeof(int32_t)) != 0,
                  "held-out %d has the tokens of training sequence %d", i, j);
    }
    check(memcmp(held[0].ids, held[1].ids, sizeof held[0].ids) != 0, "held-out 0 and 1 are the same");
    check(ddt_source_next(s, &q, err, sizeof err) == 0 && same(&stream[0], &q),
          "held-out calls changed the training stream");
    for (int i = 1; i >= 0; i--) {
        check(ddt_source_heldout(s, i, &q, err, sizeof err) == 0 && same(&held[i], &q), "held-out %d not stable", i);
        check(ddt_source_heldout(again, i, &q, err, sizeof err) == 0 && same(&held[i], &q),
              "held-out %d differs between two sources of one config", i);
    }
    check(ddt_source_heldout(s, 2, &q, err, sizeof err) == -EINVAL && strstr(err, "held-out"),
          "held-out 2 of 2 accepted (%s)", err);
    free(held);
    ddt_source_close(s);
    ddt_source_close(again);
}

/* Generated data without a source (a co-located trainer's ranks): ddt_source_generate over an
 * fp32 replica of the synthetic target on another CPU backend (rank 1's, its own allocator) gives
 * the source's training tokens at the same cursor and its held-out tokens, masks all ones; a
 * bf16 replica (the backend ops only, as a GPU's) gives valid, repeatable tokens.
 * ddt_source_check keeps open's rules, the taps against the target's layers among them. */
static void test_generate_without_source(void)
{
    char err[512] = "";
    ddt_source_config c = synthetic_config(2);
    check(ddt_source_generates(&c), "synthetic data is generated");
    check(ddt_source_check(&c, H, 3, err, sizeof err) == 0, "check: %s", err);
    check(ddt_source_check(&c, H, 2, err, sizeof err) == -EINVAL && strstr(err, "layer id 2"),
          "tap 2 of a 2-layer target accepted (%s)", err);
    ddt_source_config bad = c;
    bad.top_p = 0.0f;
    check(ddt_source_check(&bad, H, 3, err, sizeof err) == -EINVAL && strstr(err, "top_p"),
          "top_p 0 accepted (%s)", err);
    ddt_source *s;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    if (case_failed)
        return;
    int32_t held[2][MAX_S];
    ddt_sequence q;
    for (int i = 0; i < 2; i++) {
        check(ddt_source_heldout(s, i, &q, err, sizeof err) == 0, "heldout %d: %s", i, err);
        memcpy(held[i], q.input_ids, (size_t)q.S * sizeof(int32_t));
    }
    ddt_source_close(s);
    for (int bf16 = 0; bf16 < 2 && !case_failed; bf16++) {
        const ddt_target_options o = { .be = ddk_backend_cpu_rank(1), .bf16 = bf16 };
        ddt_target_model m;
        ddt_generator gen;
        check(ddt_target_open_synthetic_with(&c.synthetic, ddt_generate_seed(c.seed, 0, "target"), &o, &m, err,
                                             sizeof err) == 0, "replica (bf16 %d): %s", bf16, err);
        if (case_failed)
            return;
        check(ddt_generator_open(&gen, o.be, &m, c.seq_len, err, sizeof err) == 0, "generator: %s", err);
        int32_t ids[MAX_S], again[MAX_S];
        uint8_t mask[MAX_S];
        for (int i = 0; i < RUN && !case_failed; i++) {
            memset(mask, 0, sizeof mask);
            check(ddt_source_generate(&c, &gen, 0, i, ids, mask, err, sizeof err) == 0, "generate %d: %s", i, err);
            int ones = 1, valid = 1;
            for (int64_t j = 0; j < c.seq_len; j++)
                ones &= mask[j] == 1, valid &= ids[j] >= 0 && ids[j] < V;
            check(ones && valid, "sequence %d (bf16 %d): mask not all ones or a token outside [0, V)", i, bf16);
            if (!bf16)
                check(!memcmp(ids, stream[i].ids, (size_t)c.seq_len * sizeof(int32_t)),
                      "training sequence %d on rank 1's replica differs from the source's", i);
            check(ddt_source_generate(&c, &gen, 0, i, again, NULL, err, sizeof err) == 0 &&
                      !memcmp(ids, again, (size_t)c.seq_len * sizeof(int32_t)),
                  "sequence %d (bf16 %d) not repeatable", i, bf16);
        }
        for (int i = 0; i < 2 && !bf16 && !case_failed; i++) {
            check(ddt_source_generate(&c, &gen, 1, i, ids, NULL, err, sizeof err) == 0, "held-out %d: %s", i, err);
            check(!memcmp(ids, held[i], (size_t)c.seq_len * sizeof(int32_t)),
                  "held-out %d on rank 1's replica differs from the source's", i);
        }
        ddt_generator_free(&gen);
        ddt_target_close(&m);
    }
}

/* the loader's forward refused memory: next() reports it (after the sequences made before);
 * a seek once memory is back resumes the same stream */
static void test_loader_error(void)
{
    char err[512] = "";
    ddt_source_config c = synthetic_config(1);
    ddt_source *s;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    if (case_failed)
        return;
    ddk_allocator *cpu = ddk_allocator_cpu();
    /* below what is live now: every later allocation (the next forward's workspace) fails */
    ddk_allocator_set_budget(cpu, ddk_allocator_stats(cpu).current - 1);
    ddt_sequence q;
    int64_t good = 0;
    int rc = 0;
    while (good < 4 && (rc = ddt_source_next(s, &q, err, sizeof err)) == 0) {
        check(same(&stream[good], &q), "sequence %lld before the error differs", (long long)good);
        good++;
    }
    ddk_allocator_set_budget(cpu, 0);
    check(rc == -ENOMEM && strstr(err, "training sequence") && strstr(err, "forward"),
          "after %lld sequences: rc %d, error \"%s\"", (long long)good, rc, err);
    check(ddt_source_next(s, &q, err, sizeof err) == -ENOMEM, "the error is not sticky until a seek");
    check(ddt_source_seek(s, ddt_source_cursor(s)) == 0, "seek");
    check(ddt_source_next(s, &q, err, sizeof err) == 0 && same(&stream[good], &q),
          "after the seek: not sequence %lld of the stream (%s)", (long long)good, err);
    ddt_source_close(s);
}

static void test_config_errors(void)
{
    char err[512] = "";
    ddt_source *s = NULL;
    ddt_source_config c = synthetic_config(2);
    c.taps[1] = 3;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == -EINVAL && !s && strstr(err, "layer id 3"),
          "a tap outside the target accepted (%s)", err);
    c = synthetic_config(2);
    check(ddt_source_open(&c, H + 1, &s, err, sizeof err) == -EINVAL && strstr(err, "hidden"),
          "a hidden size unlike the drafter's accepted (%s)", err);
    c.top_p = 0.0f;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == -EINVAL && strstr(err, "top_p"), "top_p 0 accepted (%s)", err);
    c = synthetic_config(0);
    check(ddt_source_open(&c, H, &s, err, sizeof err) == -EINVAL && strstr(err, "prefetch"),
          "prefetch 0 accepted (%s)", err);
}

/* ------------------------------------------------------------------------------------------
 * Files written by the test
 */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    check(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* a llama or qwen3 directory (as t's cfg.qwen3: config.json, model.safetensors F32) holding
 * t's weights */
static void write_dense_dir(const char *dir, const ddt_target *t)
{
    const ddt_target_config *c = &t->cfg;
    mkdir(dir, 0700);
    char path[512], json[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(json, sizeof json,
             "{\"model_type\": \"%s\", \"hidden_size\": %lld, \"num_hidden_layers\": %lld,"
             " \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld,"
             " \"intermediate_size\": %lld, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6,"
             " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}",
             c->qwen3 ? "qwen3" : "llama", (long long)c->hidden, (long long)c->layers, (long long)c->heads,
             (long long)c->kv_heads, (long long)c->head_dim, (long long)c->intermediate, (long long)c->vocab);
    write_text(path, json);
    static char names[64][96];
    ddt_st_entry e[64];
    int n = 0;
    const int64_t qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
#define ENTRY(ptr, rows, cols, ...)                                                    \
    do {                                                                               \
        snprintf(names[n], sizeof names[n], __VA_ARGS__);                              \
        e[n] = (ddt_st_entry){ names[n], DDT_F32, (cols) ? 2 : 1, { rows, cols }, ptr }; \
        n++;                                                                           \
    } while (0)
    ENTRY(t->embed_tokens, c->vocab, c->hidden, "model.embed_tokens.weight");
    for (int64_t l = 0; l < c->layers; l++) {
        const ddt_target_layer *L = &t->layer[l];
        ENTRY(L->input_layernorm, c->hidden, 0, "model.layers.%lld.input_layernorm.weight", (long long)l);
        ENTRY(L->q_proj, qd, c->hidden, "model.layers.%lld.self_attn.q_proj.weight", (long long)l);
        ENTRY(L->k_proj, kvd, c->hidden, "model.layers.%lld.self_attn.k_proj.weight", (long long)l);
        ENTRY(L->v_proj, kvd, c->hidden, "model.layers.%lld.self_attn.v_proj.weight", (long long)l);
        ENTRY(L->o_proj, c->hidden, qd, "model.layers.%lld.self_attn.o_proj.weight", (long long)l);
        if (c->qwen3) {
            ENTRY(L->q_norm, c->head_dim, 0, "model.layers.%lld.self_attn.q_norm.weight", (long long)l);
            ENTRY(L->k_norm, c->head_dim, 0, "model.layers.%lld.self_attn.k_norm.weight", (long long)l);
        }
        ENTRY(L->post_attention_layernorm, c->hidden, 0, "model.layers.%lld.post_attention_layernorm.weight",
              (long long)l);
        ENTRY(L->gate_proj, c->intermediate, c->hidden, "model.layers.%lld.mlp.gate_proj.weight", (long long)l);
        ENTRY(L->up_proj, c->intermediate, c->hidden, "model.layers.%lld.mlp.up_proj.weight", (long long)l);
        ENTRY(L->down_proj, c->hidden, c->intermediate, "model.layers.%lld.mlp.down_proj.weight", (long long)l);
    }
    ENTRY(t->norm, c->hidden, 0, "model.norm.weight");
    ENTRY(t->lm_head, c->vocab, c->hidden, "lm_head.weight");
#undef ENTRY
    for (int i = 0; i < n; i++)
        if (e[i].ndim == 1)
            e[i].shape[1] = 0;
    char err[512] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check(ddt_st_write(path, e, n, NULL, NULL, 0, err, sizeof err) == 0, "writing the model: %s", err);
}

/* ------------------------------------------------------------------------------------------
 * hf with a token file
 */

enum { TOK_SEQS = 7, TOK_TOTAL = 48, TOK_LEN = 8 };
static const int64_t tok_lengths[TOK_SEQS] = { 5, 1, 9, 3, 20, 6, 4 };   /* 1: skipped; 9, 20: cut to 8 */

/* dir: a llama directory of a synthetic target made with seed */
static void write_synthetic_llama_dir(const char *dir, uint64_t seed)
{
    char err[512] = "";
    ddt_target t;
    ddt_target_config tc = tiny_config(0);
    check(ddt_target_synthetic(&tc, seed, &t, err, sizeof err) == 0, "synthetic: %s", err);
    write_dense_dir(dir, &t);
    ddt_target_free(&t);
}

/* ------------------------------------------------------------------------------------------
 * ddt_target_open's dispatch on model_type
 */

/* DIR opened through ddt_target_open: its ops' name and model_type */
static void expect_opened_as(const char *dir, const char *ops, const char *model_type)
{
    ddt_target_model m;
    char err[1024] = "";
    int rc = ddt_target_open(dir, &m, err, sizeof err);
    check(rc == 0, "open %s: %s", dir, err);
    if (rc)
        return;
    check(!strcmp(m.ops->name, ops) && !strcmp(m.model_type, model_type), "%s opened as %s (%s), not %s (%s)", dir,
          m.ops->name, m.model_type, ops, model_type);
    check(m.ops->cache_open && m.ops->extend && m.ops->verify && m.ops->rollback, "%s: %s ops without a cache",
          dir, m.ops->name);
    ddt_target_close(&m);
}

/* llama and qwen3 directories written here open through the dense ops, to the weights written
 * (their prefill == the synthetic target's, bit for bit); qwen3_5 and qwen3_5_text ones (the
 * shared qwen35-tiny, when present) through the qwen3_5 ops */
static void test_target_open_dispatch(void)
{
    for (int qwen3 = 0; qwen3 <= 1; qwen3++) {
        ddt_target_config cfg = dense_cache_config(qwen3);
        ddt_target_model synthetic, opened;
        char dir[600], err[1024] = "";
        snprintf(dir, sizeof dir, "%s/dispatch_%s", tmpdir, qwen3 ? "qwen3" : "llama");
        check(ddt_target_open_synthetic(&cfg, 51, &synthetic, err, sizeof err) == 0, "synthetic: %s", err);
        write_dense_dir(dir, synthetic.impl);
        expect_opened_as(dir, "dense", qwen3 ? "qwen3" : "llama");
        int32_t tokens[9];
        dc_tokens(tokens, 9, 1);
        float *a = xcalloc((size_t)(9 * cfg.hidden), sizeof(float)), *b = xcalloc((size_t)(9 * cfg.hidden),
                                                                             sizeof(float));   /* (T, H) */
        check(ddt_target_open(dir, &opened, err, sizeof err) == 0, "open %s: %s", dir, err);
        check(ddt_target_prefill(ddk_backend_cpu(), &synthetic, tokens, 9, NULL, 0, NULL, a, NULL) == 0 &&
              ddt_target_prefill(ddk_backend_cpu(), &opened, tokens, 9, NULL, 0, NULL, b, NULL) == 0 &&
              !memcmp(a, b, (size_t)(9 * cfg.hidden) * sizeof(float)),
              "%s: the directory's target differs from the one written", dir);
        free(a), free(b);
        ddt_target_close(&opened);
        ddt_target_close(&synthetic);
    }
    static const char *const qwen35[2] = { "qwen35-tiny/bf16", "qwen35-tiny/text-only" };   /* qwen3_5, qwen3_5_text */
    for (int i = 0; i < 2; i++) {
        char dir[1024], config[1100];
        snprintf(dir, sizeof dir, "%s/%s", DDTREE_SHARED_MODELS, qwen35[i]);
        snprintf(config, sizeof config, "%s/config.json", dir);
        if (access(config, R_OK) != 0)
            printf("  skipped: %s is not there (the shared qwen35-tiny model)\n", config);
        else
            expect_opened_as(dir, "qwen3_5", "qwen3_5");
    }
}

/* q is seq_len tokens whose rows from n on are padding: id 0, mask 0 (and features and teacher 0
 * when zero_floats, the shards') */
static int padded(const ddt_sequence *q, int64_t n, int64_t seq_len, int zero_floats)
{
    if (q->S != seq_len)
        return 0;
    for (int64_t i = n; i < seq_len; i++)
        if (q->input_ids[i] || q->loss_mask[i])
            return 0;
    for (int64_t i = n * F; zero_floats && i < seq_len * F; i++)
        if (q->features[i])
            return 0;
    for (int64_t i = n * H; zero_floats && q->teacher_hidden && i < seq_len * H; i++)
        if (q->teacher_hidden[i])
            return 0;
    return 1;
}

/* hf over dir with the token file tokens_path: seq_len TOK_LEN, taps 1 and 2, 2 held out */
static ddt_source_config tokens_config(const char *dir, const char *tokens_path)
{
    ddt_source_config c;
    memset(&c, 0, sizeof c);
    c.kind = DDT_SOURCE_HF;
    snprintf(c.model_dir, sizeof c.model_dir, "%s", dir);
    snprintf(c.tokens_file, sizeof c.tokens_file, "%s", tokens_path);
    c.seq_len = TOK_LEN;
    c.n_taps = N_TAPS;
    c.taps[0] = 1;
    c.taps[1] = 2;
    c.want_teacher = 1;
    c.top_p = 1.0f;
    c.seed = 5;
    c.heldout = 2;
    c.prefetch = 2;
    return c;
}

static void test_hf_tokens(void)
{
    char err[512] = "", dir[256], tokens_path[256];
    snprintf(dir, sizeof dir, "%s/llama", tmpdir);
    snprintf(tokens_path, sizeof tokens_path, "%s/tokens.safetensors", tmpdir);
    ddt_target loaded;
    write_synthetic_llama_dir(dir, 17);
    check(ddt_target_load(dir, &loaded, err, sizeof err) == 0, "the written directory does not load: %s", err);
    if (case_failed)
        return;

    int32_t ids[TOK_TOTAL];
    int64_t offsets[TOK_SEQS + 1] = { 0 };
    for (int i = 0; i < TOK_TOTAL; i++)
        ids[i] = (i * 13 + 5) % V;
    for (int s = 0; s < TOK_SEQS; s++)
        offsets[s + 1] = offsets[s] + tok_lengths[s];
    check(offsets[TOK_SEQS] == TOK_TOTAL, "fixture lengths");
    check(ddt_shard_tokens_write(tokens_path, ids, TOK_TOTAL, offsets, TOK_SEQS, NULL, V, err, sizeof err) == 0,
          "writing tokens: %s", err);
    ddt_source_config c = tokens_config(dir, tokens_path);

    static const int train_items[4] = { 0, 2, 3, 4 };
    enum { EPOCHS = 3 };
    int order[2][EPOCHS * 4];
    for (int run = 0; run < 2; run++) {
        if (run == 1)
            c.seed = 6;
        ddt_source *s;
        check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
        if (case_failed)
            break;
        ddt_sequence q;
        float *features = xcalloc(TOK_LEN * F, sizeof(float)), *teacher = xcalloc(TOK_LEN * H, sizeof(float));
        for (int k = 0; k < EPOCHS * 4; k++) {
            check(ddt_source_next(s, &q, err, sizeof err) == 0, "next %d: %s", k, err);
            order[run][k] = -1;
            for (int j = 0; j < 4; j++) {
                int item = train_items[j];
                int64_t S = tok_lengths[item] < TOK_LEN ? tok_lengths[item] : TOK_LEN;
                if (!memcmp(q.input_ids, ids + offsets[item], (size_t)S * sizeof(int32_t)) && padded(&q, S, TOK_LEN, 0))
                    order[run][k] = item;
            }
            check(order[run][k] >= 0, "next %d is no training sequence of the file (cut to %d)", k, TOK_LEN);
            if (order[run][k] < 0)
                continue;
            check(ddt_target_forward(ddk_backend_cpu(), &loaded, q.input_ids, q.S, c.taps, N_TAPS, features,
                                     teacher) == 0, "forward");
            check(max_rel_diff(q.features, features, q.S * F) <= 1e-6 &&
                  max_rel_diff(q.teacher_hidden, teacher, q.S * H) <= 1e-6,
                  "next %d: features / teacher differ from the target's forward", k);
        }
        for (int epoch = 0; epoch < EPOCHS; epoch++) {
            int seen = 0;
            for (int k = 0; k < 4; k++)
                seen |= order[run][epoch * 4 + k] >= 0 ? 1 << order[run][epoch * 4 + k] : 0;
            check(seen == (1 << 0 | 1 << 2 | 1 << 3 | 1 << 4), "epoch %d is not a permutation of the training "
                  "sequences", epoch);
        }
        for (int i = 0; i < 2; i++) {
            int item = 5 + i;
            check(ddt_source_heldout(s, i, &q, err, sizeof err) == 0, "heldout: %s", err);
            check(padded(&q, tok_lengths[item], TOK_LEN, 0) &&
                  !memcmp(q.input_ids, ids + offsets[item], (size_t)tok_lengths[item] * 4),
                  "held-out %d is not the file's sequence %d (padded to %d)", i, item, TOK_LEN);
        }
        /* the same config again: the same order; a seek into epoch 2 too */
        ddt_source *again;
        check(ddt_source_open(&c, H, &again, err, sizeof err) == 0, "reopen: %s", err);
        check(ddt_source_seek(again, 9) == 0, "seek");
        for (int k = 9; k < EPOCHS * 4 && !case_failed; k++) {
            check(ddt_source_next(again, &q, err, sizeof err) == 0, "next: %s", err);
            const int64_t n = tok_lengths[order[run][k]] < TOK_LEN ? tok_lengths[order[run][k]] : TOK_LEN;
            check(!memcmp(q.input_ids, ids + offsets[order[run][k]], (size_t)n * 4),
                  "reopened and seeked to 9: sequence %d differs", k);
        }
        ddt_source_close(again);
        ddt_source_close(s);
        free(features);
        free(teacher);
    }
    int orders_differ = 0, epochs_differ = 0;
    for (int k = 0; k < EPOCHS * 4; k++) {
        orders_differ |= order[0][k] != order[1][k];
        epochs_differ |= order[0][k] != order[0][k % 4];
    }
    check(orders_differ, "seeds 5 and 6 gave the same order");
    check(epochs_differ, "every epoch has the same order (no reshuffle)");

    /* too few sequences for the held-out ones: 6 usable, 6 held out */
    c.heldout = 6;
    ddt_source *s = NULL;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == -EINVAL && !s && strstr(err, tokens_path) &&
          strstr(err, "too few"), "6 held-out of 6 usable sequences accepted (%s)", err);
    ddt_target_free(&loaded);
}

/* ------------------------------------------------------------------------------------------
 * Shards
 */

enum { SH_TOTAL = 18, SH_SEQS = 3, SH_LEN = 6 };
static const int64_t shard_offsets[SH_SEQS + 1] = { 0, 6, 11, 18 };   /* the 7-token one is cut to 6 */
static int32_t shard_ids[SH_TOTAL];
static uint8_t shard_mask[SH_TOTAL];
static float shard_features[SH_TOTAL * F], shard_teacher[SH_TOTAL * H];
static float heads_embed[V * H], heads_lm[V * H];

typedef struct shard_fault {
    const char *format, *version, *hidden, *taps, *vocab;
    int no_teacher, offsets_end, decreasing, feature_cols;
} shard_fault;

static const int64_t single_offsets[2] = { 0, 4 };   /* one sequence of rows [0, 4) */

/* shard path through shard.h's writer, holding rows [0, T) of the fixture as the nseq
 * sequences of offsets; dtype of the floats */
static void write_shard(const char *path, int64_t T, int64_t nseq, const int64_t *offsets, ddt_dtype dtype)
{
    uint16_t *half = xcalloc((size_t)(T * (F + H)), sizeof(uint16_t));
    for (int64_t i = 0; i < T * F; i++)
        half[i] = ddt_f32_to_bf16(shard_features[i]);
    for (int64_t i = 0; i < T * H; i++)
        half[T * F + i] = ddt_f32_to_bf16(shard_teacher[i]);
    const int bf16 = dtype == DDT_BF16;
    const int32_t taps[N_TAPS] = { 1, 2 };
    const ddt_shard_data d = { { H, V, N_TAPS, taps }, T, nseq, shard_ids, shard_mask, offsets, dtype,
                               bf16 ? (const void *)half : (const void *)shard_features,
                               bf16 ? (const void *)(half + T * F) : (const void *)shard_teacher, "test" };
    char err[512] = "";
    check(ddt_shard_write(path, &d, err, sizeof err) == 0, "writing %s: %s", path, err);
    free(half);
}

/* shard path written by hand (SPEC.md section 4's names spelled out), F32, rows [0, SH_TOTAL)
 * (offsets shard_offsets), with fault broken (zeroed: nothing) */
static void write_shard_by_hand(const char *path, const shard_fault *fault)
{
    const int64_t T = SH_TOTAL, nseq = SH_SEQS;
    int64_t offsets[SH_SEQS + 1];
    memcpy(offsets, shard_offsets, sizeof offsets);
    if (fault->offsets_end)
        offsets[nseq] += fault->offsets_end;
    if (fault->decreasing)
        offsets[1] = offsets[2] + 1;
    const int64_t cols = fault->feature_cols ? fault->feature_cols : F;
    float *wide = xcalloc((size_t)(T * cols), sizeof(float));
    for (int64_t r = 0; r < T; r++)
        for (int64_t j = 0; j < cols; j++)
            wide[r * cols + j] = j < F ? shard_features[r * F + j] : 0.0f;
    const ddt_st_entry e[] = {
        { "input_ids", DDT_I32, 1, { T }, shard_ids },
        { "loss_mask", DDT_U8, 1, { T }, shard_mask },
        { "offsets", DDT_I64, 1, { nseq + 1 }, offsets },
        { "features", DDT_F32, 2, { T, cols }, wide },
        { "teacher_hidden", DDT_F32, 2, { T, H }, shard_teacher },
    };
    const char *const keys[] = { "format", "version", "hidden_size", "target_layer_ids", "vocab_size", "target" };
    const char *const values[] = { fault->format ? fault->format : "ddtree-features",
                                   fault->version ? fault->version : "1", fault->hidden ? fault->hidden : "16",
                                   fault->taps ? fault->taps : "[1, 2]", fault->vocab ? fault->vocab : "50",
                                   "test" };
    char err[512] = "";
    check(ddt_st_write(path, e, fault->no_teacher ? 4 : 5, keys, values, 6, err, sizeof err) == 0,
          "writing %s: %s", path, err);
    free(wide);
}

/* DIR with embed (under name) and, unless tied, lm_head; config.json text */
static void write_heads_dir(const char *dir, const char *embed_name, ddt_dtype dtype, int with_lm_head,
                            const char *config)
{
    mkdir(dir, 0700);
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, config);
    uint16_t *half = xcalloc(V * H, sizeof(uint16_t));
    for (int i = 0; i < V * H; i++)
        half[i] = ddt_f32_to_bf16(heads_embed[i]);
    const ddt_st_entry e[] = {
        { embed_name, dtype, 2, { V, H }, dtype == DDT_BF16 ? (const void *)half : (const void *)heads_embed },
        { "lm_head.weight", DDT_F32, 2, { V, H }, heads_lm },
    };
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check(ddt_st_write(path, e, with_lm_head ? 2 : 1, NULL, NULL, 0, err, sizeof err) == 0, "heads: %s", err);
    free(half);
}

static ddt_source_config shard_config(const char *heads_dir, char (*paths)[1024], int count)
{
    ddt_source_config c;
    memset(&c, 0, sizeof c);
    c.kind = DDT_SOURCE_SHARDS;
    snprintf(c.model_dir, sizeof c.model_dir, "%s", heads_dir);
    c.shard_count = count;
    c.shards = paths;
    c.seq_len = SH_LEN;
    c.n_taps = N_TAPS;
    c.taps[0] = 1;
    c.taps[1] = 2;
    c.want_teacher = 1;
    c.seed = 3;
    c.heldout = 1;
    c.prefetch = 2;
    return c;
}

static void shard_fixture(void)
{
    uint64_t rng = 99;
    for (int i = 0; i < SH_TOTAL; i++) {
        shard_ids[i] = (int32_t)(ddk_rng_next(&rng) % V);
        shard_mask[i] = (uint8_t)(i % 5 != 2);
    }
    for (int i = 0; i < SH_TOTAL * F; i++)
        shard_features[i] = (float)ddk_rng_normal(&rng);
    for (int i = 0; i < SH_TOTAL * H; i++)
        shard_teacher[i] = (float)ddk_rng_normal(&rng);
    for (int i = 0; i < V * H; i++) {
        heads_embed[i] = (float)ddk_rng_normal(&rng);
        heads_lm[i] = (float)ddk_rng_normal(&rng);
    }
}

/* the source's sequence q is rows [start, start + S) of the fixture (features rounded by round) */
/* q is the shard's rows [start, start + S), padded to SH_LEN */
static int rows_match(const ddt_sequence *q, int64_t start, int64_t S, int bf16)
{
    if (!padded(q, S, SH_LEN, 1) || memcmp(q->input_ids, shard_ids + start, (size_t)S * 4) ||
        memcmp(q->loss_mask, shard_mask + start, (size_t)S))
        return 0;
    for (int64_t i = 0; i < S * F; i++) {
        float x = shard_features[start * F + i];
        if (q->features[i] != (bf16 ? ddt_bf16_to_f32(ddt_f32_to_bf16(x)) : x))
            return 0;
    }
    for (int64_t i = 0; i < S * H; i++) {
        float x = shard_teacher[start * H + i];
        if (q->teacher_hidden[i] != (bf16 ? ddt_bf16_to_f32(ddt_f32_to_bf16(x)) : x))
            return 0;
    }
    return 1;
}

static void shards_read_back(ddt_dtype dtype)
{
    char err[512] = "", heads[256];
    char (*paths)[1024] = xcalloc(2, sizeof *paths);
    snprintf(heads, sizeof heads, "%s/heads", tmpdir);
    write_heads_dir(heads, "model.embed_tokens.weight", DDT_F32, 1, "{\"model_type\": \"qwen3_5\"}");
    snprintf(paths[0], sizeof paths[0], "%s/a.safetensors", tmpdir);
    snprintf(paths[1], sizeof paths[1], "%s/b.safetensors", tmpdir);
    write_shard(paths[0], SH_TOTAL, SH_SEQS, shard_offsets, dtype);
    write_shard(paths[1], 4, 1, single_offsets, dtype);   /* the last sequence overall, held out */
    ddt_source_config c = shard_config(heads, paths, 2);
    ddt_source *s;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
    if (case_failed) {
        free(paths);
        return;
    }
    check(ddt_source_vocab(s) == V && ddt_source_target_layers(s) == 0, "vocab / target layers");
    check(!memcmp(ddt_source_embed(s), heads_embed, sizeof heads_embed) &&
          !memcmp(ddt_source_lm_head(s), heads_lm, sizeof heads_lm), "embed_tokens / lm_head not read back exactly");
    ddt_sequence q;
    const int bf16 = dtype == DDT_BF16;
    for (int k = 0; k < 6; k++) {   /* two epochs over the three sequences of shard a */
        check(ddt_source_next(s, &q, err, sizeof err) == 0, "next: %s", err);
        int found = 0;
        for (int i = 0; i < SH_SEQS; i++) {
            int64_t S = shard_offsets[i + 1] - shard_offsets[i];
            found += rows_match(&q, shard_offsets[i], S < SH_LEN ? S : SH_LEN, bf16);
        }
        check(found == 1, "next %d is not exactly one of the shard's sequences (cut to %d)", k, SH_LEN);
    }
    check(ddt_source_heldout(s, 0, &q, err, sizeof err) == 0 && rows_match(&q, 0, 4, bf16),
          "held-out 0 is not shard b's sequence (%s)", err);
    ddt_source_close(s);

    /* the teacher left out when not wanted */
    c.want_teacher = 0;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open without teacher: %s", err);
    if (!case_failed) {
        check(ddt_source_next(s, &q, err, sizeof err) == 0 && !q.teacher_hidden, "teacher_hidden given unasked");
        ddt_source_close(s);
    }
    free(paths);
}

static void test_shards_read_back(void)
{
    shards_read_back(DDT_F32);
}

static void test_shards_bf16(void)
{
    shards_read_back(DDT_BF16);
}

static void test_shards_tied_heads(void)
{
    char err[512] = "", heads[256];
    char (*paths)[1024] = xcalloc(1, sizeof *paths);
    snprintf(heads, sizeof heads, "%s/tied", tmpdir);
    snprintf(paths[0], sizeof paths[0], "%s/a.safetensors", tmpdir);
    write_shard(paths[0], SH_TOTAL, SH_SEQS, shard_offsets, DDT_F32);
    ddt_source_config c = shard_config(heads, paths, 1);
    ddt_source *s = NULL;

    write_heads_dir(heads, "model.language_model.embed_tokens.weight", DDT_BF16, 0, "{\"model_type\": \"qwen3_5\"}");
    check(ddt_source_open(&c, H, &s, err, sizeof err) == -EINVAL && strstr(err, "lm_head.weight") &&
          strstr(err, "tie_word_embeddings"), "no lm_head and no tie accepted (%s)", err);

    write_heads_dir(heads, "model.language_model.embed_tokens.weight", DDT_BF16, 0,
                    "{\"model_type\": \"qwen3_5\", \"text_config\": {\"tie_word_embeddings\": true}}");
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "tied heads refused: %s", err);
    if (s) {
        int ok = ddt_source_embed(s) == ddt_source_lm_head(s);
        for (int i = 0; ok && i < V * H; i++)
            ok = ddt_source_embed(s)[i] == ddt_bf16_to_f32(ddt_f32_to_bf16(heads_embed[i]));
        check(ok, "tied BF16 embedding not read as lm_head");
        ddt_source_close(s);
    }
    s = NULL;
    check(ddt_source_open(&c, H + 2, &s, err, sizeof err) == -EINVAL && strstr(err, heads),
          "embed_tokens of another hidden size accepted (%s)", err);
    free(paths);
}

static void test_shard_errors(void)
{
    static const struct {
        shard_fault fault;
        const char *named;
    } cases[] = {
        { { .format = "pt" }, "format" },
        { { .version = "2" }, "version" },
        { { .hidden = "32" }, "hidden_size" },
        { { .taps = "[1, 3]" }, "target_layer_ids" },
        { { .taps = "[1]" }, "target_layer_ids" },
        { { .vocab = "51" }, "vocab_size" },
        { { .no_teacher = 1 }, "teacher_hidden" },
        { { .offsets_end = -1 }, "offsets" },
        { { .offsets_end = 2 }, "offsets" },
        { { .decreasing = 1 }, "offsets" },
        { { .feature_cols = F + H }, "features" },
    };
    char err[512] = "", heads[256], (*paths)[1024] = xcalloc(2, sizeof *paths);
    snprintf(heads, sizeof heads, "%s/heads", tmpdir);
    write_heads_dir(heads, "model.embed_tokens.weight", DDT_F32, 1, "{}");
    snprintf(paths[0], sizeof paths[0], "%s/good.safetensors", tmpdir);
    snprintf(paths[1], sizeof paths[1], "%s/bad.safetensors", tmpdir);
    write_shard(paths[0], SH_TOTAL, SH_SEQS, shard_offsets, DDT_F32);
    ddt_source_config c = shard_config(heads, paths, 2);
    /* the same file by hand without a fault: what each fault below is the only change to */
    const shard_fault none = { 0 };
    write_shard_by_hand(paths[1], &none);
    ddt_source *s = NULL;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "the hand-made shard without a fault refused: %s", err);
    ddt_source_close(s);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_shard_by_hand(paths[1], &cases[i].fault);
        s = NULL;
        err[0] = 0;
        int rc = ddt_source_open(&c, H, &s, err, sizeof err);
        check(rc < 0 && !s && strstr(err, paths[1]) && strstr(err, cases[i].named),
              "fault %zu (%s): rc %d, error \"%s\" should name the file and %s", i, cases[i].named, rc, err,
              cases[i].named);
        if (s)
            ddt_source_close(s);
    }
    free(paths);
}

/* ------------------------------------------------------------------------------------------
 * Empty and one-token sequences (the offsets rule: never decreasing; training needs 2 tokens)
 */

enum { SHORT_SEQS = 6, SHORT_TOTAL = 11 };
static const int64_t short_offsets[SHORT_SEQS + 1] = { 0, 0, 3, 4, 4, 9, 11 };   /* 0, 3, 1, 0, 5, 2 tokens */

/* s (heldout 1, sequences padded to seq_len, their floats to 0 when zero_floats) trains on
 * sequences 1 and 4 only, held-out 0 being sequence 5 (2 tokens) */
static void expect_short_skipped(ddt_source *s, int64_t seq_len, int zero_floats, const char *what)
{
    ddt_sequence q;
    char err[512] = "";
    int seen[2] = { 0, 0 };
    for (int k = 0; k < 4 && !case_failed; k++) {   /* two epochs */
        check(ddt_source_next(s, &q, err, sizeof err) == 0, "%s: next %d: %s", what, k, err);
        for (int j = 0; j < 2 && !case_failed; j++) {
            const int64_t a = short_offsets[j ? 4 : 1], S = short_offsets[(j ? 4 : 1) + 1] - a;
            seen[j] += padded(&q, S, seq_len, zero_floats) && !memcmp(q.input_ids, shard_ids + a, (size_t)S * sizeof(int32_t));
        }
    }
    check(seen[0] == 2 && seen[1] == 2, "%s: two epochs gave sequences 1 and 4 %d and %d times, want 2 and 2 "
          "(and nothing else)", what, seen[0], seen[1]);
    check(ddt_source_heldout(s, 0, &q, err, sizeof err) == 0 && padded(&q, 2, seq_len, zero_floats) &&
          !memcmp(q.input_ids, shard_ids + short_offsets[5], 2 * sizeof(int32_t)),
          "%s: held-out 0 is not sequence 5 (2 tokens): %s", what, err);
}

static void test_short_sequences_skipped(void)
{
    char err[512] = "", dir[256], tokens_path[256], heads[256];
    snprintf(dir, sizeof dir, "%s/llama_short", tmpdir);
    snprintf(tokens_path, sizeof tokens_path, "%s/short_tokens.safetensors", tmpdir);
    write_synthetic_llama_dir(dir, 23);
    check(ddt_shard_tokens_write(tokens_path, shard_ids, SHORT_TOTAL, short_offsets, SHORT_SEQS, NULL, V, err,
                                 sizeof err) == 0, "writing tokens: %s", err);
    ddt_source_config c = tokens_config(dir, tokens_path);
    c.heldout = 1;
    ddt_source *s = NULL;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "a token file with empty and one-token sequences "
          "refused: %s", err);
    if (s)
        expect_short_skipped(s, TOK_LEN, 0, "token file");
    ddt_source_close(s);

    char (*paths)[1024] = xcalloc(1, sizeof *paths);
    snprintf(heads, sizeof heads, "%s/heads_short", tmpdir);
    write_heads_dir(heads, "model.embed_tokens.weight", DDT_F32, 1, "{}");
    snprintf(paths[0], sizeof paths[0], "%s/short.safetensors", tmpdir);
    write_shard(paths[0], SHORT_TOTAL, SHORT_SEQS, short_offsets, DDT_F32);
    c = shard_config(heads, paths, 1);
    s = NULL;
    check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "a shard with empty and one-token sequences refused: %s",
          err);
    if (s)
        expect_short_skipped(s, SH_LEN, 1, "shard");
    ddt_source_close(s);
    free(paths);
}

/* a token file's loss_mask: kept in the sequences (padding 0), a sequence without two consecutive
 * ones in its first seq_len skipped; tokens only too */
static void test_token_file_mask(void)
{
    char err[512] = "", dir[256], tokens_path[256];
    snprintf(dir, sizeof dir, "%s/llama-mask", tmpdir);
    snprintf(tokens_path, sizeof tokens_path, "%s/mask.safetensors", tmpdir);
    write_synthetic_llama_dir(dir, 29);
    int32_t ids[TOK_TOTAL];
    uint8_t mask[TOK_TOTAL];
    int64_t offsets[TOK_SEQS + 1] = { 0 };
    for (int s = 0; s < TOK_SEQS; s++)
        offsets[s + 1] = offsets[s] + tok_lengths[s];
    for (int i = 0; i < TOK_TOTAL; i++) {
        ids[i] = (i * 5 + 1) % V;
        mask[i] = i % 3 != 0;   /* pairs of ones between zeros */
    }
    for (int64_t i = offsets[0]; i < offsets[1]; i++)   /* sequence 0: alternating, no pair */
        mask[i] = (uint8_t)(i % 2);
    for (int64_t i = offsets[4]; i < offsets[4] + TOK_LEN; i++)   /* sequence 4: its pairs past the cut */
        mask[i] = 0;
    check(ddt_shard_tokens_write(tokens_path, ids, TOK_TOTAL, offsets, TOK_SEQS, mask, V, err, sizeof err) == 0,
          "writing tokens: %s", err);
    /* usable: 2, 3 and 5, 6 (1 is one token); held out: 5 and 6 */
    for (int only = 0; only < 2 && !case_failed; only++) {
        ddt_source_config c = tokens_config(dir, tokens_path);
        c.tokens_only = only;
        ddt_source *s = NULL;
        check(ddt_source_open(&c, H, &s, err, sizeof err) == 0, "open: %s", err);
        if (!s)
            return;
        int seen = 0;
        for (int k = 0; k < 4 && !case_failed; k++) {
            ddt_sequence q;
            check(ddt_source_next(s, &q, err, sizeof err) == 0, "next: %s", err);
            for (int item = 2; item <= 3; item++) {
                const int64_t n = tok_lengths[item] < TOK_LEN ? tok_lengths[item] : TOK_LEN;
                if (padded(&q, n, TOK_LEN, 0) && !memcmp(q.input_ids, ids + offsets[item], (size_t)n * 4) &&
                    !memcmp(q.loss_mask, mask + offsets[item], (size_t)n))
                    seen |= 1 << item;
            }
        }
        check(seen == (1 << 2 | 1 << 3), "tokens only %d: two epochs did not give sequences 2 and 3 with their "
              "masks (seen %#x)", only, seen);
        ddt_sequence q;
        check(ddt_source_heldout(s, 1, &q, err, sizeof err) == 0 && padded(&q, tok_lengths[6], TOK_LEN, 0) &&
              !memcmp(q.loss_mask, mask + offsets[6], (size_t)tok_lengths[6]), "held-out 1 is not sequence 6 "
              "with its mask: %s", err);
        ddt_source_close(s);
    }
}

/* tokens_only: the synthetic source's and a token file's sequences are the full sources' tokens
 * and masks, with features and teacher NULL; the token file's target is never opened (its head
 * is NULL, its shape from config.json); shards refuse it. */
static void test_tokens_only(void)
{
    char err[512] = "", dir[256], tokens_path[256];
    ddt_source_config full[2], only[2];
    full[0] = synthetic_config(2);
    snprintf(dir, sizeof dir, "%s/llama-tokens-only", tmpdir);
    snprintf(tokens_path, sizeof tokens_path, "%s/tokens-only.safetensors", tmpdir);
    write_synthetic_llama_dir(dir, 17);
    int32_t ids[TOK_TOTAL];
    int64_t offsets[TOK_SEQS + 1] = { 0 };
    for (int i = 0; i < TOK_TOTAL; i++)
        ids[i] = (i * 7 + 3) % V;
    for (int q = 0; q < TOK_SEQS; q++)
        offsets[q + 1] = offsets[q] + tok_lengths[q];
    check(ddt_shard_tokens_write(tokens_path, ids, TOK_TOTAL, offsets, TOK_SEQS, NULL, V, err, sizeof err) == 0,
          "writing tokens: %s", err);
    full[1] = tokens_config(dir, tokens_path);
    for (int k = 0; k < 2 && !case_failed; k++) {
        only[k] = full[k];
        only[k].tokens_only = 1;
        ddt_source *a, *b;
        check(ddt_source_open(&full[k], H, &a, err, sizeof err) == 0, "open %d: %s", k, err);
        if (case_failed)
            return;
        check(ddt_source_open(&only[k], H, &b, err, sizeof err) == 0, "open %d tokens only: %s", k, err);
        if (case_failed) {
            ddt_source_close(a);
            return;
        }
        check(ddt_source_vocab(b) == V && ddt_source_target_layers(b) == 3, "source %d tokens only: vocab %lld, "
              "layers %lld", k, (long long)ddt_source_vocab(b), (long long)ddt_source_target_layers(b));
        check(k == 0 ? ddt_source_embed(b) != NULL : ddt_source_embed(b) == NULL && ddt_source_lm_head(b) == NULL,
              "source %d tokens only: the head is %s", k, k == 0 ? "missing (the generator's)" : "there (no target)");
        check(ddt_source_queue_bytes(&only[k], H) < ddt_source_queue_bytes(&full[k], H),
              "source %d: the tokens-only queue is not smaller", k);
        for (int i = 0; i < 2 * RUN && !case_failed; i++) {
            ddt_sequence x, y;
            const int held = i >= RUN;
            int rc = held ? ddt_source_heldout(a, i - RUN < 2 ? i - RUN : 1, &x, err, sizeof err)
                          : ddt_source_next(a, &x, err, sizeof err);
            check(rc == 0, "source %d sequence %d: %s", k, i, err);
            static saved want;
            save(&want, &x);
            rc = held ? ddt_source_heldout(b, i - RUN < 2 ? i - RUN : 1, &y, err, sizeof err)
                      : ddt_source_next(b, &y, err, sizeof err);
            check(rc == 0 && y.S == want.S && !memcmp(y.input_ids, want.ids, (size_t)y.S * sizeof(int32_t)) &&
                      !memcmp(y.loss_mask, want.mask, (size_t)y.S) && !y.features && !y.teacher_hidden,
                  "source %d %s %d: tokens only differ from the full source's, or carry features", k,
                  held ? "held-out" : "sequence", i);
        }
        ddt_source_close(a);
        ddt_source_close(b);
    }
    ddt_source_config sh = full[1];
    sh.kind = DDT_SOURCE_SHARDS;
    sh.tokens_only = 1;
    char paths[1][1024] = { "/nonexistent.safetensors" };
    sh.shards = paths;
    sh.shard_count = 1;
    ddt_source *s = NULL;
    int rc = ddt_source_open(&sh, H, &s, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "tokens only"), "shards tokens only: rc %d, '%s'", rc, err);
    if (!rc)
        ddt_source_close(s);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    shard_fixture();
    static const test_case cases[] = {
        { "generation deterministic per (seed, index, stream)", test_generate_deterministic },
        { "temperature 0 == argmax of the full forward's logits", test_greedy_is_argmax },
        { "KV-cache decode hidden == full forward (llama, qwen3, prompts)", test_decode_matches_forward },
        { "top_p 1e-9 == greedy", test_top_p_tiny_is_greedy },
        { "top_p 0.5 samples inside the nucleus only", test_top_p_nucleus },
        { "dense cache: prefill == extend in pieces == decode (taps, final, logits)", test_dense_cache_extend },
        { "dense cache: verify, rollback to 0 .. B, verify, extend == fresh prefill", test_dense_cache_verify },
        { "dense cache, bf16 and generic targets: extend, decode, verify, rollback == their prefill",
          test_dense_cache_bf16_generic },
        { "dense bf16 vs fp32 prefill; bf16 head read back; generic decode == fast decode", test_dense_bf16_vs_fp32 },
        { "ddt_target_open: llama, qwen3 -> dense; qwen3_5 -> qwen3_5", test_target_open_dispatch },
        { "synthetic source: deterministic order, any prefetch", test_synthetic_order },
        { "synthetic source: seek then next == the original stream", test_synthetic_seek },
        { "synthetic source: held-out disjoint and stable", test_synthetic_heldout },
        { "generated data without a source: another backend's replica, the source's tokens",
          test_generate_without_source },
        { "synthetic source: a loader error surfaces from next(), seek resumes", test_loader_error },
        { "source config errors", test_config_errors },
        { "hf token file: shuffle per epoch, cut, skip, held-out", test_hf_tokens },
        { "tokens only: the same tokens, no features, no target for a token file", test_tokens_only },
        { "hf token file with a loss_mask: masks kept, sequences without an anchor skipped", test_token_file_mask },
        { "shards: F32 read back exactly", test_shards_read_back },
        { "shards: BF16 read back", test_shards_bf16 },
        { "shards: tied embed_tokens from model.language_model", test_shards_tied_heads },
        { "shards: each validation rule refused naming the file", test_shard_errors },
        { "token file and shards: empty and one-token sequences accepted, not trained on",
          test_short_sequences_skipped },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return cases_summary();
}
