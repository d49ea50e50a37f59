/* bench_tokenizer.c: tokens per second on one core of our tokenizer (daemon/engine/data/tokenizer.h)
 * and of Hugging Face's Rust `tokenizers` (npm 0.23.2 through tests/engine/data/tokenizer_reference.js, one
 * thread: RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false), side by side, on the real Qwen3
 * tokenizer.json and the same generated documents (tests/bench/tokenizer_corpus.h). Ours is timed
 * cold (a fresh handle: every piece merged once) and warm (the piece cache filled, as in a long
 * run), the median of --repeat passes; the two token counts are compared. Seconds are CPU time
 * (this thread's; node's process's), so a busy machine changes the figures less.
 * Options: --mb N (corpus size, default 8), --repeat K (default 5).
 * Needs what scripts/test installs from npm (build-npm): exits 77 without it.
 */
#include "bench_util.h"
#include "data/tokenizer.h"
#include "tokenizer_corpus.h"

#include <stdlib.h>

static char npm_dir[] = DDTREE_NPM_DIR, reference_js[] = DDTREE_TESTS_DIR "/tokenizer_reference.js";

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* one pass over the documents: CPU seconds, tokens in *tokens (ids in ids, reused) */
static double encode_pass(const ddt_tokenizer *tok, const corpus_docs *docs, ddt_token_ids *ids, size_t *tokens)
{
    char err[256];
    double t0 = thread_cpu_s();
    ids->count = 0;
    for (int d = 0; d < docs->count; d++)
        if (ddt_tokenizer_encode(tok, docs->doc[d].bytes, docs->doc[d].len, DDT_TOKENIZE_ADDED, ids, err, sizeof err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err);
            exit(1);
        }
    *tokens = ids->count;
    return thread_cpu_s() - t0;
}

int main(int argc, char **argv)
{
    int mb = 8, repeat = 5;
    const bench_opt opts[] = {{"--mb", BENCH_INT, &mb}, {"--repeat", BENCH_INT, &repeat}};
    if (bench_parse("bench_tokenizer", argc, argv, opts, 2))
        return 2;
    repeat = repeat < 1 ? 1 : repeat;
    char qwen3_json[4096], dir[] = "/tmp/ddtree_bench_tokenizer.XXXXXX";
    if (!corpus_npm_paths(npm_dir, qwen3_json, sizeof qwen3_json)) {
        printf("SKIPPED: the npm packages are not in %s (scripts/test installs them), or node is missing\n", npm_dir);
        return 77;
    }
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    corpus_docs docs = {0};
    corpus_text t = {0};
    size_t bytes = 0;
    for (int d = 0; bytes < (size_t)mb << 20; d++) {
        corpus_document(2, d, 2048 + d * 7919 % 4096, &t);
        corpus_docs_add(&docs, t.bytes, t.len);
        bytes += t.len;
    }
    free(t.bytes);

    char err[512];
    double t0 = bench_now_s();
    ddt_tokenizer *tok = ddt_tokenizer_open(qwen3_json, err, sizeof err);
    double open_s = bench_now_s() - t0;
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    ddt_token_ids ids = {0};
    size_t tokens = 0;
    double cold = encode_pass(tok, &docs, &ids, &tokens);
    double *warm = calloc((size_t)repeat, sizeof *warm);
    for (int k = 0; k < repeat; k++)
        warm[k] = encode_pass(tok, &docs, &ids, &tokens);
    double warm_s = bench_median(warm, repeat);

    /* the Rust library on the same documents, one thread */
    char docs_path[256], cmd[8192];
    snprintf(docs_path, sizeof docs_path, "%s/docs.bin", dir);
    double rust_s = -1;
    long rust_tokens = -1;
    if (!corpus_write_docs(docs_path, &docs)) {
        snprintf(cmd, sizeof cmd, "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node '%s' bench '%s' '%s' '%s'",
                 reference_js, npm_dir, qwen3_json, docs_path);
        FILE *p = popen(cmd, "r");
        if (p) {
            if (fscanf(p, "tokens %ld seconds %lf", &rust_tokens, &rust_s) != 2)
                rust_s = -1;
            pclose(p);
        }
    }
    printf("bench_tokenizer: Qwen3 tokenizer.json (opened in %.2f s), %d documents, %.1f MB, %zu tokens\n", open_s,
           docs.count, (double)bytes / (1 << 20), tokens);
    printf("  ddtree, warm cache     %8.2f M tokens/s per core  (%5.1f MB/s)\n", tokens / warm_s / 1e6, bytes / warm_s / 1e6);
    printf("  ddtree, cold cache     %8.2f M tokens/s per core  (%5.1f MB/s)\n", tokens / cold / 1e6, bytes / cold / 1e6);
    if (rust_s > 0) {
        printf("  tokenizers 0.23.2      %8.2f M tokens/s per core  (%5.1f MB/s)\n", rust_tokens / rust_s / 1e6,
               bytes / rust_s / 1e6);
        if (rust_tokens != (long)tokens)
            printf("  (tokenizers made %ld tokens, ddtree %zu: the ids differ)\n", rust_tokens, tokens);
        printf("  ddtree / tokenizers    %8.1fx warm, %.1fx cold\n", rust_s / warm_s, rust_s / cold);
    } else {
        printf("  tokenizers 0.23.2      (the node reference failed: %s)\n", cmd);
    }
    free(warm);
    ddt_token_ids_free(&ids);
    ddt_tokenizer_close(tok);
    corpus_docs_free(&docs);
    remove(docs_path);
    remove(dir);
    return 0;
}
