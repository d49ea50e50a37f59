/* drafter_check.c: drafter_check.h's fixture and comparisons. Exercised by
 * tests/engine/model/test_drafter_reference.c and tests/simt/test_simt_step.cpp.
 *
 * Legend: H hidden, V vocabulary, S sequence length, A anchors, B block size, LH = L_t H.
 */
#include "drafter_check.h"
#include "check.h"   /* its own copy of the case state: a check fails case_failed here, returned */
#include "ddk_rng.h"
#include "drafter_reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NSEQ = 2, S = 12, A = 3 };

static ddt_drafter_config config(int dflash2)
{
    ddt_drafter_config c = { .hidden = 8, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 4,
                             .intermediate = 12, .vocab = 24, .block_size = 4, .sliding_window = 5,
                             .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f, .sliding = { 1, 0 },
                             .taps = 2, .target_layer_ids = { 0, 1 }, .mask_token_id = 23,
                             .num_target_layers = 3, .max_positions = 64 };
    if (dflash2) {
        c.dflash2 = 1;
        c.conv_taps = 2;
        c.conv_group_size = 4;   /* G = 2 */
        c.selector_rank = 3;
        c.selector_top_k = 4;
    }
    return c;
}

typedef struct fixture {
    ddt_drafter_config c;
    int64_t total;
    float *w;                  /* (total) */
    float *embed, *lm_head;    /* (V, H) */
    int32_t ids[NSEQ * S], anchors[NSEQ * A];
    uint8_t mask[NSEQ * S], keep[NSEQ * A];
    float *features, *teacher; /* (NSEQ, S, LH), (NSEQ, S, H) */
    float scale[NSEQ * A * 4]; /* (NSEQ, A, B): a setting's slot scales */
    ddt_batch b;
} fixture;

static float uniform(uint64_t *s)
{
    return (float)(2.0 * ((double)(ddk_rng_next(s) >> 11) * 0x1p-53) - 1.0);
}

static void fixture_make(fixture *f, int dflash2, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->c = config(dflash2);
    const ddt_drafter_config *c = &f->c;
    char err[256];
    if (ddt_drafter_config_check(c, err, sizeof err)) {
        fprintf(stderr, "bad test config: %s\n", err);
        abort();
    }
    ddt_param table[DDT_MAX_PARAMS];
    int n = ddt_drafter_param_table(c, table, &f->total);
    f->w = xcalloc((size_t)f->total, sizeof(float));
    ddt_drafter_init(c, f->w, seed);
    uint64_t s = seed + 7;
    for (int i = 0; i < n; i++)   /* every tensor away from its start, the products' scale kept */
        for (int64_t j = 0; j < table[i].numel; j++) {
            float *x = f->w + table[i].offset + j;
            *x = table[i].init == DDT_INIT_NORMAL ? 8.0f * *x : *x + 0.3f * uniform(&s);
        }
    const int64_t H = c->hidden, V = c->vocab, LH = c->taps * H;
    f->embed = xcalloc((size_t)(V * H), sizeof(float));
    f->lm_head = xcalloc((size_t)(V * H), sizeof(float));
    for (int64_t i = 0; i < V * H; i++) {
        f->embed[i] = uniform(&s);
        f->lm_head[i] = 0.8f * uniform(&s);
    }
    f->features = xcalloc((size_t)(NSEQ * S * LH), sizeof(float));
    f->teacher = xcalloc((size_t)(NSEQ * S * H), sizeof(float));
    for (int64_t i = 0; i < NSEQ * S * LH; i++)
        f->features[i] = uniform(&s);
    for (int64_t i = 0; i < NSEQ * S * H; i++)
        f->teacher[i] = 2.0f * uniform(&s);
    for (int64_t i = 0; i < NSEQ * S; i++) {
        f->ids[i] = (int32_t)(ddk_rng_next(&s) % (uint64_t)(V - 1));
        f->mask[i] = i % 7 != 5;
    }
    const int32_t anchors[NSEQ * A] = { 1, 4, 9, 0, 6, 0 };   /* sequence 1: its last block padded */
    const uint8_t keep[NSEQ * A] = { 1, 1, 1, 1, 1, 0 };
    memcpy(f->anchors, anchors, sizeof anchors);
    memcpy(f->keep, keep, sizeof keep);
    for (int64_t i = 0; i < NSEQ * A * c->block_size; i++)   /* 0 on some slots, scaled on others */
        f->scale[i] = (float)(i % 3) * 0.5f;
    f->b = (ddt_batch){ NSEQ, S, A, f->ids, f->mask, f->features, f->teacher, f->anchors, f->keep, NULL };
}

static void fixture_free(fixture *f)
{
    free(f->w), free(f->embed), free(f->lm_head), free(f->features), free(f->teacher);
}

static drafter_reference_loss ref_loss(const drafter_setting *st)
{
    return (drafter_reference_loss){ .gamma = 3.0, .ce_target_teacher = st->teacher_labels,
                                     .kl_weight = st->kl, .kl_temperature = 1.5, .cap_weight = st->cap,
                                     .cap_temperature = 0.7, .selector_weight = st->sel_weight,
                                     .selector_inject = st->inject };
}

static double reference_at(const fixture *f, const double *wd, const drafter_reference_loss *rl, double *hs)
{
    return drafter_reference(&f->c, wd, f->embed, f->lm_head, &f->b, rl, hs);
}

/* The reference's gradient (total) of setting st at the weights wd, by central differences: the
 * same whatever the backend under test, so made once per setting and process, then kept */
static const double *central_differences(const drafter_setting *st, const fixture *f, double *wd,
                                         const drafter_reference_loss *rl, int64_t total)
{
    enum { SETTINGS = 32 };
    static const drafter_setting *keys[SETTINGS];
    static double *values[SETTINGS];
    int at = 0;
    while (at < SETTINGS && keys[at] && keys[at] != st)
        at++;
    if (at == SETTINGS)
        abort();   /* more settings than drafter_settings holds */
    if (keys[at])
        return values[at];
    double *fd = xcalloc((size_t)total, sizeof(double));
    for (int64_t i = 0; i < total; i++) {
        const double keep = wd[i], h = 1e-5;
        wd[i] = keep + h;
        const double up = reference_at(f, wd, rl, NULL);
        wd[i] = keep - h;
        const double down = reference_at(f, wd, rl, NULL);
        wd[i] = keep;
        fd[i] = (up - down) / (2 * h);
    }
    keys[at] = st;
    values[at] = fd;
    return fd;
}

int drafter_check_step(const ddk_backend *be, const drafter_setting *st, double tol, double grad_tol)
{
    case_failed = 0;
    fixture f;
    fixture_make(&f, st->dflash2, 11);
    f.b.slot_scale = st->slot_scale ? f.scale : NULL;
    const ddt_drafter_config *c = &f.c;
    const int64_t H = c->hidden, B = c->block_size, rows = NSEQ * A * B;
    ddt_drafter_weights w, g;
    float *grads = xcalloc((size_t)f.total, sizeof(float));
    ddt_drafter_bind(c, f.w, &w);
    ddt_drafter_bind(c, grads, &g);
    const ddt_head head = { f.embed, f.lm_head, 0 };
    ddt_loss_config lc = { .gamma = 3.0f, .ce_target_teacher = st->teacher_labels,
                           .loss = { .chunk = st->chunk, .vocab_tile = st->vocab_tile, .kl_weight = st->kl,
                                     .kl_temperature = 1.5f, .cap_weight = st->cap, .cap_temperature = 0.7f },
                           .selector_weight = st->sel_weight, .selector_inject = st->inject,
                           .selector_stop_gradient = st->stop_gradient };
    ddk_loss_result out;
    int rc = ddt_drafter_step(be, c, &w, &g, &head, &f.b, &lc, &out);
    check(rc == 0, "ddt_drafter_step: %d", rc);

    double *wd = xcalloc((size_t)f.total, sizeof(double)), *hs_ref = xcalloc((size_t)(rows * H), sizeof(double));
    for (int64_t i = 0; i < f.total; i++)
        wd[i] = f.w[i];
    drafter_reference_loss rl = ref_loss(st);
    const double loss_ref = reference_at(&f, wd, &rl, hs_ref);
    check(fabs(out.loss - loss_ref) <= tol * fmax(1.0, fabs(loss_ref)), "loss %.9g, reference %.9g",
          out.loss, loss_ref);
    if (st->stop_gradient)
        rl.frozen_hs = hs_ref;

    /* the forward's hidden states of the kept blocks */
    float *hs = xcalloc((size_t)(rows * H), sizeof(float));
    rc = ddt_drafter_forward(be, c, &w, &head, &f.b, hs);
    check(rc == 0, "ddt_drafter_forward: %d", rc);
    for (int64_t j = 0; j < NSEQ * A; j++)
        if (!f.keep[j])
            for (int64_t i = 0; i < B * H; i++)
                hs[j * B * H + i] = 0.0f;   /* the reference leaves padded blocks 0 */
    const double hs_err = normalised_error(hs, hs_ref, rows * H);
    check(hs_err < tol, "hidden states: normalised error %.3g", hs_err);

    /* every gradient against central differences of the reference */
    ddt_param table[DDT_MAX_PARAMS];
    int64_t total;
    const int n = ddt_drafter_param_table(c, table, &total);
    double worst = 0;
    const char *worst_name = "";
    const double *const fd = central_differences(st, &f, wd, &rl, total);
    for (int i = 0; i < n; i++) {
        const ddt_param *p = &table[i];
        double scale = 0;
        for (int64_t j = 0; j < p->numel; j++)
            scale = fmax(scale, fabs(fd[p->offset + j]));
        const double err = normalised_error(grads + p->offset, fd + p->offset, p->numel);
        const int zero_expected = scale == 0;
        check(!(zero_expected && p->dflash2_only && st->sel_weight > 0),
              "%s: no gradient in the reference: the fixture does not exercise the selector term", p->name);
        if (zero_expected) {   /* e.g. the selector's tensors at alpha_sel 0 */
            int all_zero = 1;
            for (int64_t j = 0; j < p->numel; j++)
                all_zero &= grads[p->offset + j] == 0.0f;
            check(all_zero, "%s: the reference's gradient is 0, the step's is not", p->name);
            continue;
        }
        if (err > worst)
            worst = err, worst_name = p->name;
        check(err < grad_tol, "%s: gradient normalised error %.3g (scale %.3g)", p->name, err, scale);
    }
    printf("  # loss %.6f (reference %.6f), hidden states %.2g, worst gradient %.2g (%s)\n", out.loss,
           loss_ref, hs_err, worst, worst_name);
    free(wd), free(hs_ref), free(hs), free(grads);
    fixture_free(&f);
    return case_failed;
}

const drafter_setting drafter_settings[] = {
    { "dflash: data labels, KL", 0, 0, 0, 0, 0.3f, 0.0f, 0.0f, 64, 0, 0 },
    { "dflash: teacher labels, CAP, streamed", 0, 1, 0, 0, 0.2f, 0.5f, 0.0f, 5, 7, 0 },
    { "dflash2: strict, data labels, KL", 1, 0, 0, 0, 0.3f, 0.0f, 1.0f, 64, 0, 0 },
    { "dflash2: inject, teacher labels, CAP", 1, 1, 1, 0, 0.2f, 0.4f, 1.0f, 64, 0, 0 },
    { "dflash2: strict, streamed tiles 7, chunk 5", 1, 0, 0, 0, 0.3f, 0.0f, 1.0f, 5, 7, 0 },
    { "dflash2: inject, streamed tiles 5, chunk 3, alpha_sel 0.5", 1, 0, 1, 0, 0.0f, 0.3f, 0.5f, 3, 5, 0 },
    { "dflash2: stop_gradient, strict", 1, 0, 0, 1, 0.3f, 0.0f, 1.0f, 64, 0, 0 },
    { "dflash2: stop_gradient, inject, streamed", 1, 1, 1, 1, 0.2f, 0.0f, 1.0f, 7, 11, 0 },
    { "dflash2: alpha_sel 0 (no selector gradient)", 1, 0, 0, 0, 0.3f, 0.0f, 0.0f, 64, 0, 0 },
    { "dflash: teacher labels, KL, slot scales (train.tree_weight)", 0, 1, 0, 0, 0.3f, 0.0f, 0.0f, 5, 0, 1 },
    { "dflash2: inject, teacher labels, slot scales", 1, 1, 1, 0, 0.2f, 0.0f, 1.0f, 64, 0, 1 },
};

const int drafter_setting_count = sizeof drafter_settings / sizeof drafter_settings[0];

/* A DFlash2 drafter at its initialisation is DFlash with the same backbone (SPEC.md 2.1): the
 * engine's hidden states of the DFlash2 drafter equal the DFlash drafter's of the same seed, and
 * the reference's too */
int drafter_check_init_is_dflash(const ddk_backend *be)
{
    case_failed = 0;
    fixture f1, f2;
    fixture_make(&f1, 0, 5);
    fixture_make(&f2, 1, 5);
    ddt_drafter_init(&f1.c, f1.w, 5);
    ddt_drafter_init(&f2.c, f2.w, 5);
    const int64_t H = f1.c.hidden, rows = NSEQ * A * f1.c.block_size;
    ddt_drafter_weights w1, w2;
    ddt_drafter_bind(&f1.c, f1.w, &w1);
    ddt_drafter_bind(&f2.c, f2.w, &w2);
    const size_t bytes = (size_t)(H * f1.c.taps * H) * sizeof(float);
    check(!memcmp(w1.fc, w2.fc, bytes) && !memcmp(w1.layer[1].down_proj, w2.layer[1].down_proj,
                                                   (size_t)(H * f1.c.intermediate) * sizeof(float)),
          "the DFlash2 drafter's backbone does not start as the DFlash drafter's of the same seed");
    const ddt_head head = { f1.embed, f1.lm_head, 0 };
    float *hs1 = xcalloc((size_t)(rows * H), sizeof(float)), *hs2 = xcalloc((size_t)(rows * H), sizeof(float));
    check(ddt_drafter_forward(be, &f1.c, &w1, &head, &f1.b, hs1) == 0, "forward (dflash)");
    check(ddt_drafter_forward(be, &f2.c, &w2, &head, &f1.b, hs2) == 0, "forward (dflash2)");
    /* with identity convolutions only the block's visibility differs: a sliding layer's block rows
     * see their later slots in DFlash2 only, all-full layers see the same in both */
    double *hs1d = xcalloc((size_t)(rows * H), sizeof(double));
    for (int64_t i = 0; i < rows * H; i++)
        hs1d[i] = hs1[i];
    const double sliding_err = normalised_error(hs2, hs1d, rows * H);
    check(sliding_err > 1e-3, "a sliding layer: the fresh DFlash2 drafter's hidden states equal DFlash's "
          "(%.3g): its blocks are not bidirectional", sliding_err);
    f1.c.sliding[0] = f2.c.sliding[0] = 0;
    check(ddt_drafter_forward(be, &f1.c, &w1, &head, &f1.b, hs1) == 0, "forward (dflash, full)");
    check(ddt_drafter_forward(be, &f2.c, &w2, &head, &f1.b, hs2) == 0, "forward (dflash2, full)");
    for (int64_t i = 0; i < rows * H; i++)
        hs1d[i] = hs1[i];
    const double err = normalised_error(hs2, hs1d, rows * H);
    free(hs1d);
    check(err < 1e-6, "full layers: the fresh DFlash2 drafter's hidden states differ from DFlash's by %.3g", err);
    double *wd1 = xcalloc((size_t)f1.total, sizeof(double)), *wd2 = xcalloc((size_t)f2.total, sizeof(double));
    double *r1 = xcalloc((size_t)(rows * H), sizeof(double)), *r2 = xcalloc((size_t)(rows * H), sizeof(double));
    for (int64_t i = 0; i < f1.total; i++)
        wd1[i] = f1.w[i];
    for (int64_t i = 0; i < f2.total; i++)
        wd2[i] = f2.w[i];
    const drafter_reference_loss rl = { .gamma = 3.0 };
    drafter_reference(&f1.c, wd1, f1.embed, f1.lm_head, &f1.b, &rl, r1);
    drafter_reference(&f2.c, wd2, f1.embed, f1.lm_head, &f1.b, &rl, r2);
    double d = 0;
    for (int64_t i = 0; i < rows * H; i++)
        d = fmax(d, fabs(r1[i] - r2[i]));
    check(d < 1e-12, "the reference's fresh DFlash2 drafter differs from DFlash by %.3g", d);
    free(hs1), free(hs2), free(wd1), free(wd2), free(r1), free(r2);
    fixture_free(&f1);
    fixture_free(&f2);
    return case_failed;
}
