/* test_step_cuda.c: a whole training step of the drafter (forward, the fused loss, backward into
 * every parameter) on GPU 0 against the same step on the CPU backend, and whole runs of the
 * trainer on GPUs against the same run on the CPU.
 *
 * Step cases: random weights (norm gains perturbed away from 1), a batch of 2 sequences with a
 * padded block, sliding and full layers, KL and CAP on, data and teacher labels, the loss
 * materialised and tiled, fp32 and bf16 products (the CPU's bf16 product rounds its operands
 * as the tensor cores do), and a bf16 head (embed_tokens and lm_head as bf16 bit patterns, read
 * in place: the step then takes bf16 operands everywhere, though the config asks fp32), and bf16
 * steps on the weights' bf16 copies (w.bf16: each side rounds its own weights with round_bf16,
 * the device's from its own buffer; the products then read the copies and activations rounded
 * once, matmul_16), with bf16 products or a bf16 head; DFlash2 drafters (SPEC.md 2.1: the block
 * convolutions and the selector's tensors away from their identity / zero start, bidirectional
 * blocks, the selector's term strict, and inject with stop_gradient, materialised and tiled, fp32
 * and on bf16 copies).
 * Compared: every figure of the loss result and each parameter's gradient by normalised error;
 * the forward's hidden states; with the bf16 head also the CPU's step against the CPU's step on
 * the widened fp32 head with bf16_products, bit for bit; with copies the device's copy against
 * the CPU's (bit for bit), the CPU's step with copies against its step without them (bit for
 * bit), the device's step with copies against the CPU's and against the device's own step
 * without them (bf16's tolerances); an -ENOMEM under a device budget that leaves the next step
 * (budget lifted) equal to the CPU's.
 * Run cases (a real GPU only): "cpu" against ["cuda:0"] (and ["cuda:0", "cuda:1"], the NCCL
 * all-reduce, when there are two GPUs) for 4 steps: losses, gradient norms, the acceptance
 * evaluation; an export and a checkpoint (rank 0's replica to the host) succeed.
 *
 * Skipped (exit 77, "SKIPPED: no GPU") without a GPU: never reported as passed.
 * DDTREE_STEP_CUDA_SELF_CHECK=1 runs the step cases with CPU rank 1's backend in the GPU's
 * place, a check of this test's plumbing on a machine without a GPU (then every comparison is
 * exact up to the BLAS's threading).
 * ctest: label gpu; one line per case; a final "N passed, M failed".
 *
 * Legend: H hidden, V vocabulary, S sequence length, A anchors, B block size, LH = taps * H.
 */
#include "check.h"
#include "model/drafter.h"
#include "train/trainer.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances, normalised error (max |dev - cpu| / max |cpu|) per tensor, with their reasons:
 * fp32: both sides accumulate every product in fp32 in different orders (cuBLAS tiles against
 * OpenBLAS kernels, the GPU's attention tiles and atomics for dk/dv), ~1e-6 relative per op;
 * through 2 layers of forward and backward the errors compound to a few 1e-5 on the smallest
 * gradients' scale: 2e-4 leaves margin and is still 100x below any real mistake (a wrong
 * mask or a missed term moves a gradient by O(1) of its scale). */
static const double tol_fp32 = 2e-4;
/* bf16: both sides round every product operand to bf16 (8-bit mantissa, 2^-9 relative); the
 * CPU rounds to nearest even and cuBLAS's down-conversion mode is not documented, so one
 * operand element may round differently: 2^-8 relative per differing element, averaged over
 * k-long dot products, then compounded through the layers: 2e-2. */
static const double tol_bf16 = 2e-2;
/* the loss's figures (loss, ce, kl, cap): sums of many positions, far more precise than any
 * single gradient element */
static const double tol_figures_fp32 = 1e-5, tol_figures_bf16 = 5e-3;

static const ddk_backend *cpu, *dev;
static int self_check;

/* ------------------------------------------------------------------------------------------
 * The problem: a config, weights, a batch
 */

typedef struct problem {
    ddt_drafter_config c;
    ddt_param table[DDT_MAX_PARAMS];
    int count;
    int64_t total, nseq, S, A;
    float *params, *embed, *lm_head, *features, *teacher;   /* host */
    int32_t *input_ids, *anchors;
    uint8_t *loss_mask, *keep;
} problem;

static void make_problem(problem *p, int sliding_first, int dflash2, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    ddt_drafter_config *c = &p->c;
    *c = (ddt_drafter_config){ .hidden = 48, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 12,
                               .intermediate = 80, .vocab = 211, .block_size = 5, .sliding_window = 7,
                               .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f, .taps = 2,
                               .target_layer_ids = { 0, 2 }, .mask_token_id = 210, .num_target_layers = 4 };
    c->sliding[0] = sliding_first;
    if (dflash2) {   /* G = 4 groups of 12 (or 48 of 1), rank 16, top-8 of 211 */
        c->dflash2 = 1;
        c->conv_taps = 2, c->conv_group_size = dflash2 == 3 ? 1 : 12, c->selector_rank = 16, c->selector_top_k = 8;
    }
    p->count = ddt_drafter_param_table(c, p->table, &p->total);
    p->nseq = 2, p->S = 37, p->A = 4;
    const int64_t H = c->hidden, V = c->vocab, S = p->S, LH = c->taps * H;
    uint64_t rng = seed;
    p->params = xcalloc((size_t)p->total, sizeof(float));
    ddt_drafter_init(c, p->params, seed);
    for (int i = 0; i < p->count; i++)   /* gains away from 1, so their gradients matter */
        if (p->table[i].init == DDT_INIT_ONES)
            for (int64_t j = 0; j < p->table[i].numel; j++)
                p->params[p->table[i].offset + j] = (float)(0.8 + 0.4 * ddk_rng_uniform(&rng));
        else if (p->table[i].init != DDT_INIT_NORMAL)   /* DFlash2's identity and zero starts */
            for (int64_t j = 0; j < p->table[i].numel; j++)
                p->params[p->table[i].offset + j] += (float)(0.2 * ddk_rng_normal(&rng));
    p->embed = xcalloc((size_t)(V * H), sizeof(float));
    p->lm_head = xcalloc((size_t)(V * H), sizeof(float));
    for (int64_t i = 0; i < V * H; i++) {
        p->embed[i] = (float)(0.5 * ddk_rng_normal(&rng));
        p->lm_head[i] = (float)(0.3 * ddk_rng_normal(&rng));
    }
    p->features = xcalloc((size_t)(p->nseq * S * LH), sizeof(float));
    p->teacher = xcalloc((size_t)(p->nseq * S * H), sizeof(float));
    for (int64_t i = 0; i < p->nseq * S * LH; i++)
        p->features[i] = (float)ddk_rng_normal(&rng);
    for (int64_t i = 0; i < p->nseq * S * H; i++)
        p->teacher[i] = (float)ddk_rng_normal(&rng);
    p->input_ids = xcalloc((size_t)(p->nseq * S), sizeof(int32_t));
    p->loss_mask = xcalloc((size_t)(p->nseq * S), 1);
    for (int64_t i = 0; i < p->nseq * S; i++) {
        p->input_ids[i] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);
        p->loss_mask[i] = i % S >= 3;
    }
    /* sequence 0: 4 blocks, one at the end (slots past S); sequence 1: 3 and a padded one */
    static const int32_t anchors[2][4] = { { 3, 10, 11, 34 }, { 5, 20, 30, 0 } };
    static const uint8_t keep[2][4] = { { 1, 1, 1, 1 }, { 1, 1, 1, 0 } };
    p->anchors = xcalloc(8, sizeof(int32_t));
    p->keep = xcalloc(8, 1);
    memcpy(p->anchors, anchors, sizeof anchors);
    memcpy(p->keep, keep, sizeof keep);
}

static void free_problem(problem *p)
{
    free(p->params), free(p->embed), free(p->lm_head), free(p->features), free(p->teacher);
    free(p->input_ids), free(p->anchors), free(p->loss_mask), free(p->keep);
}

/* bytes of host memory on the device under test */
static void *upload_bytes(const void *x, size_t bytes)
{
    void *d = ddk_malloc(dev->alloc, bytes);
    if (!d) {
        fprintf(stderr, "no device memory for %zu bytes\n", bytes);
        exit(2);
    }
    dev->copy(dev, d, x, bytes);
    return d;
}

/* count floats of host memory on the device under test */
static float *upload(const float *x, int64_t count)
{
    return upload_bytes(x, (size_t)count * sizeof(float));
}

/* x (count) rounded to bf16 in place (so x holds the widened values) and its bit patterns */
static uint16_t *round_to_bf16(float *x, int64_t count)
{
    uint16_t *bits = xcalloc((size_t)count, sizeof(uint16_t));
    for (int64_t i = 0; i < count; i++) {
        bits[i] = ddk_f32_to_bf16(x[i]);
        x[i] = ddk_bf16_to_f32(bits[i]);
    }
    return bits;
}

static float *download(const float *d, int64_t count)
{
    float *x = xcalloc((size_t)count, sizeof(float));
    dev->copy(dev, x, d, (size_t)count * sizeof(float));
    dev->synchronize(dev);
    return x;
}

static double max_rel(double a, double b)
{
    return fabs(a - b) / fmax(fabs(b), 1e-30);
}

/* ------------------------------------------------------------------------------------------
 * One step on both backends
 */

typedef struct step_case {
    const char *name;
    int sliding_first, teacher_labels;
    int bf16;   /* 1: bf16_products; 2: a bf16 head (embed, lm_head), the config's products fp32 */
    int64_t chunk, vocab_tile;
    float kl, cap;
    int copies; /* 1 (with bf16): the weights' bf16 copies (w.bf16), each side rounding its own */
    int dflash2; /* 1: a DFlash2 drafter (SPEC.md 2.1), strict; 2: inject and stop_gradient; 3: strict,
                    group size 1 (its coefficients' gradient (AB, 2 taps H) the widest operand staged) */
} step_case;

/* bf16 bit patterns at d (count, on the device under test) on the host */
static uint16_t *download16(const uint16_t *d, int64_t count)
{
    uint16_t *x = xcalloc((size_t)count, sizeof(uint16_t));
    dev->copy(dev, x, d, (size_t)count * sizeof(uint16_t));
    dev->synchronize(dev);
    return x;
}

/* A step's result got (its gradients g_got, over p's whole buffer) against another's, want and
 * g_want (the reference, ref in the messages): every figure of the loss result and each
 * parameter's gradient by normalised error, at fp32's or (bf16) bf16's tolerances */
static void compare_steps(const problem *p, const char *ref, int bf16, const ddk_loss_result *got,
                          const ddk_loss_result *want, const float *g_got, const float *g_want)
{
    const double tol = bf16 ? tol_bf16 : tol_fp32, tol_fig = bf16 ? tol_figures_bf16 : tol_figures_fp32;
    check(got->counted == want->counted, "counted %lld, %s %lld", (long long)got->counted, ref,
          (long long)want->counted);
    check(max_rel(got->weight_sum, want->weight_sum) <= 1e-6, "weight_sum %.9g, %s %.9g", got->weight_sum,
          ref, want->weight_sum);
    check(max_rel(got->loss, want->loss) <= tol_fig, "loss %.9g, %s %.9g", got->loss, ref, want->loss);
    check(max_rel(got->ce, want->ce) <= tol_fig, "ce %.9g, %s %.9g", got->ce, ref, want->ce);
    check(fabs(got->kl - want->kl) <= tol_fig * fmax(fabs(want->kl), 1e-3), "kl %.9g, %s %.9g", got->kl, ref,
          want->kl);
    check(fabs(got->cap - want->cap) <= tol_fig * fmax(fabs(want->cap), 1e-3), "cap %.9g, %s %.9g", got->cap,
          ref, want->cap);
    /* argmax ties aside, the same positions are right: a near-tie between two logits may round
     * to the other argmax on the GPU (another summation order, the tensor cores): fp32 +-1 */
    check(llabs(got->correct - want->correct) <= (bf16 ? 2 : 1), "correct %lld, %s %lld",
          (long long)got->correct, ref, (long long)want->correct);
    double *g_ref = xcalloc((size_t)p->total, sizeof(double));
    for (int i = 0; i < p->count; i++) {
        const ddt_param *t = &p->table[i];
        for (int64_t j = 0; j < t->numel; j++)
            g_ref[j] = g_want[t->offset + j];
        double e = normalised_error(g_got + t->offset, g_ref, t->numel);
        check(e <= tol, "d %s: normalised error %.3g > %.1g (against the %s)", t->name, e, tol, ref);
    }
    free(g_ref);
}

/* The CPU's step on a bf16 head (its result want, its gradients g_head) against the CPU's step on
 * the widened head (p's embed and lm_head, rounded) with bf16_products: the same bits, the loss
 * and every gradient (bf16 widening is exact and every product takes bf16 operands either way) */
static void check_widened_head(const problem *p, const ddt_batch *b, const ddt_loss_config *lc,
                               const float *g_head, const ddk_loss_result *want)
{
    ddt_loss_config wide_lc = *lc;
    wide_lc.loss.bf16_products = 1;
    float *g_wide = xcalloc((size_t)p->total, sizeof(float));
    ddt_drafter_weights w, g;
    ddt_drafter_bind(&p->c, p->params, &w);
    ddt_drafter_bind(&p->c, g_wide, &g);
    ddk_loss_result r;
    int rc = ddt_drafter_step(cpu, &p->c, &w, &g, &(ddt_head){ p->embed, p->lm_head, 0 }, b, &wide_lc, &r);
    check(rc == 0, "the CPU step on the widened head failed: %d", rc);
    check(memcmp(&r, want, sizeof r) == 0, "bf16 head: loss %.17g, on the widened head with bf16 products %.17g",
          want->loss, r.loss);
    check(memcmp(g_wide, g_head, (size_t)p->total * sizeof(float)) == 0,
          "bf16 head: the gradients differ from the widened head's with bf16 products");
    free(g_wide);
}

/* The CPU's step with the weights' bf16 copies (made here by the CPU's round_bf16, into *w16) and
 * its activations rounded once (matmul_16) against its step without them (want, g_want: every
 * product's operands rounded by matmul_bf16): the same bits, the loss and every gradient (the
 * same bf16 values meet in the same panels: drafter.h) */
static void check_cpu_copies(const problem *p, const ddt_batch *b, const ddt_loss_config *lc,
                             const ddt_head *head, const float *g_want, const ddk_loss_result *want,
                             uint16_t **w16)
{
    *w16 = xcalloc((size_t)p->total, sizeof(uint16_t));
    cpu->round_bf16(cpu, p->params, p->total, *w16);
    int64_t wrong = 0;
    for (int64_t i = 0; i < p->total; i++)
        wrong += (*w16)[i] != ddk_f32_to_bf16(p->params[i]);
    check(wrong == 0, "cpu: %lld of %lld bf16 copies are not the weights rounded to nearest even",
          (long long)wrong, (long long)p->total);
    float *g_copies = xcalloc((size_t)p->total, sizeof(float));
    ddt_drafter_weights w, g;
    ddt_drafter_bind(&p->c, p->params, &w);
    ddt_drafter_bind(&p->c, g_copies, &g);
    w.bf16 = *w16;
    ddk_loss_result r;
    int rc = ddt_drafter_step(cpu, &p->c, &w, &g, head, b, lc, &r);
    check(rc == 0, "the CPU step with bf16 copies failed: %d", rc);
    check(memcmp(&r, want, sizeof r) == 0, "bf16 copies: loss %.17g, without them %.17g", r.loss, want->loss);
    check(memcmp(g_copies, g_want, (size_t)p->total * sizeof(float)) == 0,
          "bf16 copies: the gradients differ from the step's without them");
    free(g_copies);
}

static void run_step_case(const step_case *sc)
{
    problem p;
    make_problem(&p, sc->sliding_first, sc->dflash2, 11);
    const ddt_drafter_config *c = &p.c;
    const int64_t H = c->hidden, V = c->vocab, S = p.S, LH = c->taps * H;
    const int64_t rows = p.nseq * p.A * c->block_size;
    ddt_loss_config lc = { .gamma = 4.0f, .ce_target_teacher = sc->teacher_labels,
                           .loss = { .chunk = sc->chunk, .vocab_tile = sc->vocab_tile, .kl_weight = sc->kl,
                                     .kl_temperature = 1.5f, .cap_weight = sc->cap, .cap_temperature = 1.0f,
                                     .bf16_products = sc->bf16 == 1 },
                           .selector_weight = 1.0f, .selector_inject = sc->dflash2 == 2,
                           .selector_stop_gradient = sc->dflash2 == 2 };
    const int teacher = sc->teacher_labels || sc->kl > 0;
    const int head16 = sc->bf16 == 2;
    uint16_t *embed16 = head16 ? round_to_bf16(p.embed, V * H) : NULL;     /* (V, H) */
    uint16_t *lm_head16 = head16 ? round_to_bf16(p.lm_head, V * H) : NULL; /* (V, H) */
    const ddt_head cpu_head = head16 ? (ddt_head){ embed16, lm_head16, 1 } : (ddt_head){ p.embed, p.lm_head, 0 };

    /* the CPU: host memory */
    float *g_cpu = xcalloc((size_t)p.total, sizeof(float));
    ddt_drafter_weights w, g;
    ddt_drafter_bind(c, p.params, &w);
    ddt_drafter_bind(c, g_cpu, &g);
    ddt_batch b = { p.nseq, S, p.A, p.input_ids, p.loss_mask, p.features, teacher ? p.teacher : NULL,
                    p.anchors, p.keep, NULL };
    ddk_loss_result want;
    int rc = ddt_drafter_step(cpu, c, &w, &g, &cpu_head, &b, &lc, &want);
    check(rc == 0, "the CPU step failed: %d", rc);
    float *hs_cpu = xcalloc((size_t)(rows * H), sizeof(float));
    check(ddt_drafter_forward(cpu, c, &w, &cpu_head, &b, hs_cpu) == 0, "the CPU forward failed");
    if (head16)
        check_widened_head(&p, &b, &lc, g_cpu, &want);
    uint16_t *w16 = NULL;   /* (total) the CPU's bf16 copy of the weights */
    if (sc->copies)
        check_cpu_copies(&p, &b, &lc, &cpu_head, g_cpu, &want, &w16);

    /* the device: its own copies; gradients start from a value to check that they ADD */
    const size_t head_bytes = (size_t)(V * H) * (head16 ? sizeof(uint16_t) : sizeof(float));
    void *d_embed = upload_bytes(head16 ? (const void *)embed16 : p.embed, head_bytes),
         *d_head = upload_bytes(head16 ? (const void *)lm_head16 : p.lm_head, head_bytes);
    const ddt_head dev_head = { d_embed, d_head, head16 };
    float *d_params = upload(p.params, p.total), *d_features = upload(p.features, p.nseq * S * LH),
          *d_teacher = upload(p.teacher, p.nseq * S * H);
    float *start = xcalloc((size_t)p.total, sizeof(float));
    for (int64_t i = 0; i < p.total; i++)
        start[i] = 0x1p-12f;   /* fl(2^-12 + g) keeps g to 2^-36: far inside every tolerance */
    float *d_grads = upload(start, p.total);
    ddt_drafter_weights dw, dg;
    ddt_drafter_bind(c, d_params, &dw);
    ddt_drafter_bind(c, d_grads, &dg);
    ddt_batch db = b;
    db.features = d_features;
    db.teacher_hidden = teacher ? d_teacher : NULL;
    /* copies: the device's own, rounded there from its weights (the trainer's, refreshed by
     * adamw's w16), which must be the CPU's bits */
    uint16_t *d_w16 = NULL;
    if (sc->copies) {
        d_w16 = ddk_malloc(dev->alloc, (size_t)p.total * sizeof(uint16_t));
        if (!d_w16) {
            fprintf(stderr, "no device memory for the %lld-value bf16 copy\n", (long long)p.total);
            exit(2);
        }
        dev->round_bf16(dev, d_params, p.total, d_w16);
        uint16_t *w16_dev = download16(d_w16, p.total);
        check(memcmp(w16_dev, w16, (size_t)p.total * sizeof(uint16_t)) == 0,
              "the device's bf16 copy of the weights differs from the CPU's");
        free(w16_dev);
        dw.bf16 = d_w16;
    }
    ddk_loss_result got;
    /* fp32 cases on the fp32 attention (the flash kernels' operands are bf16: ~6e-3 alone) */
    ddk_cuda_set_attention_kernels(sc->bf16 ? DDK_CUDA_ATTENTION_AUTO : DDK_CUDA_ATTENTION_SIMT);
    rc = ddt_drafter_step(dev, c, &dw, &dg, &dev_head, &db, &lc, &got);
    check(rc == 0, "the device step failed: %d", rc);
    float *g_dev = download(d_grads, p.total);
    for (int64_t i = 0; i < p.total; i++)
        g_dev[i] -= 0x1p-12f;   /* exact near 2^-12 (Sterbenz), one float rounding of g else */
    float *d_hs = ddk_malloc(dev->alloc, (size_t)(rows * H) * sizeof(float));
    check(ddt_drafter_forward(dev, c, &dw, &dev_head, &db, d_hs) == 0, "the device forward failed");
    float *hs_dev = download(d_hs, rows * H);
    float *g_plain = NULL;   /* copies: the device's step without them, from the same start */
    ddk_loss_result plain = { 0 };
    if (sc->copies) {
        ddt_drafter_weights pw = dw;
        pw.bf16 = NULL;
        dev->copy(dev, d_grads, start, (size_t)p.total * sizeof(float));
        rc = ddt_drafter_step(dev, c, &pw, &dg, &dev_head, &db, &lc, &plain);
        check(rc == 0, "the device step without copies failed: %d", rc);
        g_plain = download(d_grads, p.total);
        for (int64_t i = 0; i < p.total; i++)
            g_plain[i] -= 0x1p-12f;
    }
    ddk_cuda_set_attention_kernels(DDK_CUDA_ATTENTION_AUTO);

    /* a bf16 head (bf16 2) runs bf16 products: bf16's tolerances */
    compare_steps(&p, "CPU", sc->bf16 != 0, &got, &want, g_dev, g_cpu);
    /* with copies against without, both on the device: they differ only by how the operands
     * reach bf16 (round_bf16's nearest even once, against cuBLAS's undocumented conversion inside
     * each COMPUTE_32F_FAST_16BF product): tol_bf16's reason */
    if (sc->copies)
        compare_steps(&p, "device step without copies", 1, &got, &plain, g_dev, g_plain);
    const double tol = sc->bf16 ? tol_bf16 : tol_fp32;
    double *ref = xcalloc((size_t)(rows * H), sizeof(double));
    for (int64_t j = 0; j < rows * H; j++)
        ref[j] = hs_cpu[j];
    double e = normalised_error(hs_dev, ref, rows * H);
    check(e <= tol, "forward hs: normalised error %.3g > %.1g", e, tol);

    ddk_free(dev->alloc, d_w16, (size_t)p.total * sizeof(uint16_t));
    ddk_free(dev->alloc, d_hs, (size_t)(rows * H) * sizeof(float));
    ddk_free(dev->alloc, d_params, (size_t)p.total * sizeof(float));
    ddk_free(dev->alloc, d_grads, (size_t)p.total * sizeof(float));
    ddk_free(dev->alloc, d_embed, head_bytes);
    ddk_free(dev->alloc, d_head, head_bytes);
    ddk_free(dev->alloc, d_features, (size_t)(p.nseq * S * LH) * sizeof(float));
    ddk_free(dev->alloc, d_teacher, (size_t)(p.nseq * S * H) * sizeof(float));
    free(ref), free(g_cpu), free(g_dev), free(g_plain), free(start), free(hs_cpu), free(hs_dev);
    free(embed16), free(lm_head16), free(w16);
    free_problem(&p);
}

static const step_case step_cases[] = {
    { "step fp32: data labels, KL + CAP, materialised", 1, 0, 0, 64, 0, 0.3f, 0.1f, 0, 0 },
    { "step fp32: teacher labels, KL + CAP, tiled (64)", 1, 1, 0, 16, 64, 0.3f, 0.1f, 0, 0 },
    { "step fp32: teacher labels, CE only, full layer first", 0, 1, 0, 1000, 0, 0.0f, 0.0f, 0, 0 },
    { "step bf16: data labels, KL + CAP, materialised", 1, 0, 1, 64, 0, 0.3f, 0.1f, 0, 0 },
    { "step bf16: teacher labels, KL, tiled (50)", 0, 1, 1, 32, 50, 0.5f, 0.0f, 0, 0 },
    { "step bf16 head: data labels, KL + CAP, materialised", 1, 0, 2, 64, 0, 0.3f, 0.1f, 0, 0 },
    { "step bf16 head: teacher labels, KL, tiled (50)", 0, 1, 2, 32, 50, 0.5f, 0.0f, 0, 0 },
    { "step bf16 copies: data labels, KL + CAP, materialised", 1, 0, 1, 64, 0, 0.3f, 0.1f, 1, 0 },
    { "step bf16 copies: teacher labels, KL, tiled (50)", 0, 1, 1, 32, 50, 0.5f, 0.0f, 1, 0 },
    { "step bf16 head + copies: data labels, KL + CAP, materialised", 1, 0, 2, 64, 0, 0.3f, 0.1f, 1, 0 },
    { "step dflash2 fp32: data labels, KL, strict, materialised", 1, 0, 0, 64, 0, 0.3f, 0.0f, 0, 1 },
    { "step dflash2 fp32: teacher labels, CAP, inject + stop_gradient, tiled (50)", 1, 1, 0, 16, 50, 0.2f, 0.1f, 0, 2 },
    { "step dflash2 bf16 copies: data labels, KL, strict, tiled (64)", 1, 0, 1, 32, 64, 0.3f, 0.0f, 1, 1 },
    { "step dflash2 bf16 copies, group size 1: data labels, strict", 0, 0, 1, 64, 0, 0.3f, 0.0f, 1, 3 },
};

/* A device budget the step cannot live within: -ENOMEM, the allocator back where it was; with
 * the budget lifted the same step runs. */
static void test_out_of_memory(void)
{
    problem p;
    make_problem(&p, 1, 0, 3);
    const ddt_drafter_config *c = &p.c;
    const int64_t H = c->hidden, V = c->vocab, S = p.S, LH = c->taps * H;
    float *d_params = upload(p.params, p.total), *d_head = upload(p.lm_head, V * H),
          *d_features = upload(p.features, p.nseq * S * LH);
    float *zeros = xcalloc((size_t)p.total, sizeof(float));
    float *d_grads = upload(zeros, p.total);
    ddt_drafter_weights dw, dg;
    ddt_drafter_bind(c, d_params, &dw);
    ddt_drafter_bind(c, d_grads, &dg);
    ddt_batch db = { p.nseq, S, p.A, p.input_ids, p.loss_mask, d_features, NULL, p.anchors, p.keep, NULL };
    ddt_loss_config lc = { .gamma = 4.0f, .ce_target_teacher = 0,
                           .loss = { .chunk = 64, .kl_temperature = 1.0f, .cap_temperature = 1.0f } };
    dev->synchronize(dev);
    ddk_alloc_stats before = ddk_allocator_stats(dev->alloc);
    ddk_allocator_set_budget(dev->alloc, before.current + 4096);
    ddk_loss_result r;
    int rc = ddt_drafter_step(dev, c, &dw, &dg, &(ddt_head){ d_head, d_head, 0 }, &db, &lc, &r);
    check(rc == -ENOMEM, "a step over the budget returns -ENOMEM, got %d", rc);
    check(ddk_allocator_stats(dev->alloc).current == before.current, "nothing stays allocated after the refusal");
    ddk_allocator_set_budget(dev->alloc, 0);
    dev->zero(dev, d_grads, (size_t)p.total * sizeof(float));
    rc = ddt_drafter_step(dev, c, &dw, &dg, &(ddt_head){ d_head, d_head, 0 }, &db, &lc, &r);
    check(rc == 0 && isfinite(r.loss) && r.counted > 0, "the step runs once the budget is lifted (%d, loss %g)",
          rc, r.loss);
    ddk_free(dev->alloc, d_params, (size_t)p.total * sizeof(float));
    ddk_free(dev->alloc, d_grads, (size_t)p.total * sizeof(float));
    ddk_free(dev->alloc, d_head, (size_t)(V * H) * sizeof(float));
    ddk_free(dev->alloc, d_features, (size_t)(p.nseq * S * LH) * sizeof(float));
    free(zeros);
    free_problem(&p);
}

/* ------------------------------------------------------------------------------------------
 * Whole runs: the trainer on GPUs against the trainer on the CPU
 */

static char state_dir[] = "/tmp/ddtree_test_step_cuda.XXXXXX";

/* the target "host" (one fp32 target on the host, as the CPU run's): the drafter's step alone
 * differs between the runs; place "same" puts a bf16 replica on each GPU (test_run_colocated) */
#define RUN_AT(devices, place)                                                                    \
    "{\"name\": \"g\", \"target\": {\"kind\": \"synthetic\", \"devices\": \"" place "\", \"hidden_size\": 32, " \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "          \
    "\"head_dim\": 8, \"intermediate_size\": 48, \"vocab_size\": 96},"                             \
    " \"drafter\": {\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2," \
    " \"head_dim\": 8, \"intermediate_size\": 48, \"block_size\": 4,"                             \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 6,"        \
    " \"target_layer_ids\": [1, 2]},"                                                             \
    " \"train\": {\"steps\": 4, \"sequences_per_step\": 4, \"seq_len\": 24, \"max_anchors\": 4,"   \
    " \"heldout\": 4, \"noise_std\": 0.05, \"lr\": 0.003, \"seed\": 5},"                           \
    " \"loss\": {\"kl_weight\": 0.15, \"cap_weight\": 0.05, \"chunk\": 64},"                       \
    " \"devices\": " devices ", \"checkpoint\": {\"every_steps\": 100, \"keep\": 2},"             \
    " \"eval\": {\"every_steps\": 100, \"sequences\": 4, \"tree_budgets\": [2, 8]}}"
#define RUN(devices) RUN_AT(devices, "host")

typedef struct run_figures {
    double loss[4], norm[4], tau_chain;
} run_figures;

static int run_trainer(const char *json, run_figures *out)
{
    ddt_trainer *t = NULL;
    char err[1024] = "", field[128] = "";
    int rc = ddt_trainer_open(json, strlen(json), state_dir, NULL, 0, NULL, &t, err, sizeof err, field,
                              sizeof field);
    check(rc == 0, "open failed (%d): %s [%s]", rc, err, field);
    if (rc)
        return rc;
    for (int i = 0; i < 4 && rc == 0; i++) {
        ddt_step_record rec;
        rc = ddt_trainer_step(t, &rec, err, sizeof err);
        check(rc == 0, "step %d: %s", i + 1, err);
        out->loss[i] = rec.loss;
        out->norm[i] = rec.grad_norm;
    }
    ddt_acceptance acc;
    if (rc == 0 && (rc = ddt_trainer_eval(t, &acc, err, sizeof err)) == 0)
        out->tau_chain = ddt_acceptance_tau_chain(&acc);
    check(rc == 0, "eval: %s", err);
    char dir[2200];
    snprintf(dir, sizeof dir, "%s/export-%s", state_dir, ddt_trainer_run_id(t));
    if (rc == 0 && (rc = ddt_trainer_export(t, dir, err, sizeof err)) == 0)   /* the host mirror */
        rc = ddt_trainer_checkpoint(t, err, sizeof err);
    check(rc == 0, "export / checkpoint: %s", err);
    ddt_trainer_close(t);
    return rc;
}

static void compare_runs(const char *devices_json)
{
    char cpu_json[4096], dev_json[4096];
    snprintf(cpu_json, sizeof cpu_json, RUN("%s"), "\"cpu\"");
    snprintf(dev_json, sizeof dev_json, RUN("%s"), devices_json);
    run_figures a = { 0 }, b = { 0 };
    if (run_trainer(cpu_json, &a) || run_trainer(dev_json, &b))
        return;
    for (int i = 0; i < 4; i++) {
        check(max_rel(b.loss[i], a.loss[i]) <= 1e-4, "step %d: loss %.9g, CPU %.9g", i + 1, b.loss[i], a.loss[i]);
        check(max_rel(b.norm[i], a.norm[i]) <= 1e-3, "step %d: grad norm %.9g, CPU %.9g", i + 1, b.norm[i], a.norm[i]);
    }
    check(fabs(b.tau_chain - a.tau_chain) <= 0.05, "tau_chain %.4f, CPU %.4f", b.tau_chain, a.tau_chain);
}

static void test_run_one_gpu(void)
{
    compare_runs("[\"cuda:0\"]");
}

/* co-located: the target's bf16 replica on cuda:0 samples the sequences and makes their features,
 * so the data is the bf16 target's, not the CPU run's: the run must be finite and repeat itself
 * exactly (the same seeds, the same device arithmetic), and its step-1 loss lie near the CPU
 * run's (the same random drafter on a target of the same weights: within 25%) */
static void test_run_colocated(void)
{
    char cpu_json[4096], dev_json[4096];
    snprintf(cpu_json, sizeof cpu_json, RUN("%s"), "\"cpu\"");
    snprintf(dev_json, sizeof dev_json, RUN_AT("%s", "same"), "[\"cuda:0\"]");
    run_figures a = { 0 }, b = { 0 }, c = { 0 };
    if (run_trainer(cpu_json, &a) || run_trainer(dev_json, &b) || run_trainer(dev_json, &c))
        return;
    for (int i = 0; i < 4; i++)
        check(isfinite(b.loss[i]) && b.loss[i] == c.loss[i], "step %d: loss %.9g, again %.9g", i + 1, b.loss[i],
              c.loss[i]);
    check(max_rel(b.loss[0], a.loss[0]) <= 0.25, "step 1: loss %.9g, CPU (host target, fp32) %.9g", b.loss[0],
          a.loss[0]);
}

static void test_run_two_gpus(void)
{
    compare_runs("[\"cuda:0\", \"cuda:1\"]");
}

int main(void)
{
    self_check = getenv("DDTREE_STEP_CUDA_SELF_CHECK") && !strcmp(getenv("DDTREE_STEP_CUDA_SELF_CHECK"), "1");
    cpu = ddk_backend_cpu();
    dev = self_check ? ddk_backend_cpu_rank(1) : ddk_backend_cuda(0);
    if (!dev) {
        printf("SKIPPED: no GPU (%s)\n", ddk_has_cuda() ? "none visible" : "libddk built without CUDA");
        return 77;
    }
    ddk_cpu_set_threads(1);
    for (size_t i = 0; i < sizeof step_cases / sizeof step_cases[0]; i++) {
        case_failed = 0;
        run_step_case(&step_cases[i]);
        case_done(step_cases[i].name);
    }
    run_case("step under a device budget: -ENOMEM, then the step", test_out_of_memory);
    if (!self_check) {
        scratch_dir(state_dir);
        run_case("run: \"cpu\" against [\"cuda:0\"], 4 steps, eval, export", test_run_one_gpu);
        run_case("run: co-located on cuda:0 (a bf16 target replica) against \"cpu\"", test_run_colocated);
        if (ddk_cuda_device_count() >= 2)
            run_case("run: \"cpu\" against [\"cuda:0\", \"cuda:1\"] (NCCL), 4 steps", test_run_two_gpus);
        else
            printf("SKIPPED: run on two GPUs (this machine has one)\n");
        remove_tree(state_dir);
    }
    return cases_summary();
}
