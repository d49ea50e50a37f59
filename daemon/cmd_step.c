/* cmd_step.c: `ddtreed step`: one drafter forward + loss + backward from files, writing the
 * loss terms and every gradient in its tensor's own shape (API.md, "ddtreed command line";
 * docs/formats.md, "ddtreed step --loss", for DFlash2's selector keys). It is how outside
 * references check the engine: tests/oracle/step_torch_check.py runs it against PyTorch float64;
 * tests/daemon/dflash2_cli_test.sh checks its readers and shapes.
 *
 *   ddtreed step --drafter DIR --head FILE --batch FILE --loss FILE --out FILE
 *                [--chunk N] [--vocab-tile M]
 */
#include "record/checkpoint.h"
#include "commands.h"
#include "model/drafter.h"
#include "base/json_fields.h"
#include "model/safetensors.h"
#include "model/tensor_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEP_USAGE                                                                            \
    "usage: ddtreed step --drafter DIR --head FILE --batch FILE --loss FILE --out FILE\n"      \
    "                    [--chunk N] [--vocab-tile M]\n"

/* Everything loaded, each buffer from the CPU allocator with its size. */
typedef struct step_inputs {
    ddt_drafter_config cfg;
    ddt_param params[DDT_MAX_PARAMS];
    int param_count;
    int64_t param_total;
    float *weights;               /* (param_total): ddt_export_read's, free() */
    float *grads;                 /* (param_total) */
    float *embed, *lm_head;       /* (V, H) each */
    int32_t *input_ids;           /* (nseq, S) */
    uint8_t *loss_mask;           /* (nseq, S) */
    float *features;              /* (nseq, S, L_t*H) */
    float *teacher_hidden;        /* (nseq, S, H) or NULL */
    int32_t *anchors;             /* (nseq, A) */
    uint8_t *keep;                /* (nseq, A) */
    int64_t nseq, S, A;
    ddt_loss_config loss;
    void *owned[16];
    size_t owned_bytes[16];
    int owned_count;
} step_inputs;

static void *keep_owned(step_inputs *in, void *ptr, size_t bytes)
{
    if (ptr) {
        in->owned[in->owned_count] = ptr;
        in->owned_bytes[in->owned_count++] = bytes;
    }
    return ptr;
}

static void free_inputs(step_inputs *in)
{
    for (int i = 0; i < in->owned_count; i++)
        ddk_free(ddk_allocator_cpu(), in->owned[i], in->owned_bytes[i]);
    free(in->weights);
}

static void *load(step_inputs *in, const ddt_st_file *f, const char *name, ddt_dtype kind,
                  int ndim, int64_t *dims, char *err, size_t err_len)
{
    ddt_tensor_want want = { name, kind, ndim, dims };
    size_t bytes = 0;
    return keep_owned(in, ddt_tensor_load(f, &want, &bytes, err, err_len), bytes);
}

/* DIR: the export format, read by its owner (engine/record/export.c); the gradients beside it */
static int load_drafter(step_inputs *in, const char *dir, char *err, size_t err_len)
{
    int rc = ddt_export_read(dir, &in->cfg, &in->weights, err, err_len);
    if (rc)
        return rc;
    in->param_count = ddt_drafter_param_table(&in->cfg, in->params, &in->param_total);
    size_t bytes = (size_t)in->param_total * sizeof(float);
    in->grads = keep_owned(in, ddk_malloc(ddk_allocator_cpu(), bytes), bytes);
    if (!in->grads) {
        snprintf(err, err_len, "no memory for %lld drafter gradients", (long long)in->param_total);
        return -ENOMEM;
    }
    return 0;
}

static int load_head(step_inputs *in, const char *path, char *err, size_t err_len)
{
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc)
        return rc;
    int64_t e_dims[2] = { in->cfg.vocab, in->cfg.hidden }, h_dims[2] = { in->cfg.vocab, in->cfg.hidden };
    in->embed = load(in, &f, "embed_tokens.weight", DDT_F32, 2, e_dims, err, err_len);
    if (in->embed)
        in->lm_head = load(in, &f, "lm_head.weight", DDT_F32, 2, h_dims, err, err_len);
    ddt_st_close(&f);
    return in->embed && in->lm_head ? 0 : -EINVAL;
}

static int load_batch(step_inputs *in, const char *path, char *err, size_t err_len)
{
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc)
        return rc;
    const int64_t H = in->cfg.hidden, LH = in->cfg.taps * H;
    int64_t ids[2] = { -1, -1 };
    in->input_ids = load(in, &f, "input_ids", DDT_I32, 2, ids, err, err_len);
    in->nseq = ids[0];
    in->S = ids[1];
    int64_t mask[2] = { in->nseq, in->S }, feat[3] = { in->nseq, in->S, LH },
            th[3] = { in->nseq, in->S, H }, anchors[2] = { in->nseq, -1 }, keep[2] = { in->nseq, -1 };
    if (in->input_ids)
        in->loss_mask = load(in, &f, "loss_mask", DDT_U8, 2, mask, err, err_len);
    if (in->loss_mask)
        in->features = load(in, &f, "features", DDT_F32, 3, feat, err, err_len);
    if (in->features)
        in->anchors = load(in, &f, "anchors", DDT_I32, 2, anchors, err, err_len);
    in->A = anchors[1];
    keep[1] = in->A;
    if (in->anchors)
        in->keep = load(in, &f, "keep", DDT_U8, 2, keep, err, err_len);
    if (in->keep && ddt_st_find(&f, "teacher_hidden"))
        in->teacher_hidden = load(in, &f, "teacher_hidden", DDT_F32, 3, th, err, err_len);
    rc = in->keep && (in->teacher_hidden || !ddt_st_find(&f, "teacher_hidden")) ? 0 : -EINVAL;
    ddt_st_close(&f);
    return rc;
}

/* {"gamma", "kl_weight", "kl_temperature", "cap_weight", "cap_temperature", "ce_target",
 *  "selector_weight", "selector_candidates", "selector_stop_gradient"}: the selector's three
 *  (DFlash2, SPEC.md 2.1) named and defaulted as the run config's train.selector_* */
static int load_loss(step_inputs *in, const char *path, char *err, size_t err_len)
{
    static const char *const fields[] = { "gamma", "kl_weight", "kl_temperature", "cap_weight", "cap_temperature",
                                          "ce_target", "selector_weight", "selector_candidates",
                                          "selector_stop_gradient", NULL };
    cJSON *root = ddt_json_parse_file(path, 1 << 16, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    double gamma = 0, kl = 0, T = 1, cap = 0, Tc = 1, sel = 1;
    int rc = ddt_json_only(&j, root, fields);
    if (!rc) rc = ddt_json_number(&j, root, "gamma", 0.0, 1, 1e30, 0, 0, &gamma);
    if (!rc) rc = ddt_json_number(&j, root, "kl_weight", 0.0, 0, 1.0, 1, 0.0, &kl);
    if (!rc) rc = ddt_json_number(&j, root, "kl_temperature", 0.0, 1, 1e6, 1, 1.0, &T);
    if (!rc) rc = ddt_json_number(&j, root, "cap_weight", 0.0, 0, 1e6, 1, 0.0, &cap);
    if (!rc) rc = ddt_json_number(&j, root, "cap_temperature", 0.0, 1, 1e6, 1, 1.0, &Tc);
    if (!rc) rc = ddt_json_number(&j, root, "selector_weight", 0.0, 0, 1e6, 1, 1.0, &sel);
    const char *target = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "ce_target"));
    if (!rc && (!target || (strcmp(target, "data") && strcmp(target, "teacher"))))
        rc = ddt_json_fail(&j, "ce_target", "must be \"data\" or \"teacher\"");
    const cJSON *cand = cJSON_GetObjectItemCaseSensitive(root, "selector_candidates");
    const char *candidates = cand ? cJSON_GetStringValue(cand) : "strict";
    if (!rc && (!candidates || (strcmp(candidates, "strict") && strcmp(candidates, "inject"))))
        rc = ddt_json_fail(&j, "selector_candidates", "must be \"strict\" or \"inject\"");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "selector_stop_gradient");
    if (!rc && stop && !cJSON_IsBool(stop))
        rc = ddt_json_fail(&j, "selector_stop_gradient", "must be true or false");
    if (!rc) {
        in->loss.gamma = (float)gamma;
        in->loss.ce_target_teacher = !strcmp(target, "teacher");
        in->loss.loss.kl_weight = (float)kl;
        in->loss.loss.kl_temperature = (float)T;
        in->loss.loss.cap_weight = (float)cap;
        in->loss.loss.cap_temperature = (float)Tc;
        in->loss.selector_weight = (float)sel;
        in->loss.selector_inject = !strcmp(candidates, "inject");
        in->loss.selector_stop_gradient = cJSON_IsTrue(stop);
    }
    cJSON_Delete(root);
    return rc;
}

static int write_output(const step_inputs *in, const ddk_loss_result *r, const char *path,
                        char *err, size_t err_len)
{
    enum { SCALARS = 6 };   /* sel: DFlash2's selector term (0 for DFlash), the loss holding it */
    ddt_st_entry entries[SCALARS + DDT_MAX_PARAMS];
    static char names[DDT_MAX_PARAMS][80];
    const double scalars[SCALARS] = { r->loss, r->ce, r->kl, r->cap, r->weight_sum, r->sel };
    const char *const scalar_names[SCALARS] = { "loss", "ce", "kl", "cap", "weight_sum", "sel" };
    int count = 0;
    for (int i = 0; i < SCALARS; i++)
        entries[count++] = (ddt_st_entry){ .name = scalar_names[i], .dtype = DDT_F64, .ndim = 0,
                                           .data = &scalars[i] };
    for (int i = 0; i < in->param_count; i++) {
        const ddt_param *p = &in->params[i];
        snprintf(names[i], sizeof names[i], "grad.%s", p->name);
        entries[count++] = (ddt_st_entry){ .name = names[i], .dtype = DDT_F32, .ndim = p->ndim,
                                           .shape = { p->shape[0], p->shape[1], p->shape[2] },
                                           .data = in->grads + p->offset };
    }
    return ddt_st_write(path, entries, count, NULL, NULL, 0, err, err_len);
}

int ddt_cmd_step(int argc, char **argv)
{
    const char *drafter = NULL, *head = NULL, *batch = NULL, *loss = NULL, *out = NULL;
    int64_t chunk = 0, vocab_tile = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(STEP_USAGE, stdout);
            return 0;
        }
        const char **slot = !strcmp(k, "--drafter") ? &drafter : !strcmp(k, "--head") ? &head
                          : !strcmp(k, "--batch") ? &batch : !strcmp(k, "--loss") ? &loss
                          : !strcmp(k, "--out") ? &out : NULL;
        int64_t *number = !strcmp(k, "--chunk") ? &chunk : !strcmp(k, "--vocab-tile") ? &vocab_tile : NULL;
        if ((!slot && !number) || !v) {
            fprintf(stderr, "ddtreed step: %s %s\n" STEP_USAGE, k, v ? "is not an option" : "needs a value");
            return 2;
        }
        if (slot)
            *slot = v;
        else if (ddt_parse_count(v, number) || (number == &chunk && chunk < 1)) {
            fprintf(stderr, "ddtreed step: %s wants a %s integer, got '%s'\n", k,
                    number == &chunk ? "positive" : "non-negative", v);
            return 2;
        }
        i++;
    }
    if (!drafter || !head || !batch || !loss || !out) {
        fprintf(stderr, "ddtreed step: --drafter, --head, --batch, --loss and --out are required\n" STEP_USAGE);
        return 2;
    }

    static step_inputs in;   /* large (the parameter table): not on the stack */
    memset(&in, 0, sizeof in);
    char err[1024] = "";
    int rc = load_drafter(&in, drafter, err, sizeof err);
    if (!rc) rc = load_head(&in, head, err, sizeof err);
    if (!rc) rc = load_batch(&in, batch, err, sizeof err);
    if (!rc) rc = load_loss(&in, loss, err, sizeof err);
    ddt_batch b = { in.nseq, in.S, in.A, in.input_ids, in.loss_mask, in.features,
                    in.teacher_hidden, in.anchors, in.keep, NULL };
    if (!rc) {
        char why[512];
        if ((rc = ddt_batch_check(&in.cfg, &b, &in.loss, why, sizeof why)))
            snprintf(err, sizeof err, "%s: %s", batch, why);
    }
    ddk_loss_result result = { 0 };
    if (!rc) {
        in.loss.loss.chunk = chunk ? chunk : in.nseq * in.A * in.cfg.block_size;
        in.loss.loss.vocab_tile = vocab_tile;
        ddt_drafter_weights w, g;
        ddt_drafter_bind(&in.cfg, in.weights, &w);
        ddt_drafter_bind(&in.cfg, in.grads, &g);
        memset(in.grads, 0, (size_t)in.param_total * sizeof(float));
        rc = ddt_drafter_step(ddk_backend_cpu(), &in.cfg, &w, &g, &(ddt_head){ in.embed, in.lm_head, 0 }, &b,
                              &in.loss, &result);
        if (rc)
            snprintf(err, sizeof err, "the step failed: %s", strerror(-rc));
    }
    if (!rc)
        rc = write_output(&in, &result, out, err, sizeof err);
    free_inputs(&in);
    if (rc) {
        fprintf(stderr, "ddtreed step: %s\n", err);
        return 1;
    }
    printf("loss %.9g ce %.9g kl %.9g cap %.9g weight_sum %.9g counted %lld correct %lld -> %s\n",
           result.loss, result.ce, result.kl, result.cap, result.weight_sum,
           (long long)result.counted, (long long)result.correct, out);
    return 0;
}
