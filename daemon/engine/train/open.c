/* open.c: a trainer opened (ddt_trainer_open, ddt_trainer_open_parsed) and closed: the run's
 * directory and row, its config (a resumed run's from its newest checkpoint), the target's shape,
 * the data (a source, or generated data's rules when the ranks sample), the host's weights, the
 * ranks (ranks.c), GPU ranks' NCCL communicator, the weights initialised or resumed (from the
 * newest checkpoint that verifies, newer ones passed over with a "checkpoint_corrupt" event, and
 * the checkpoint resumed from recorded again) and pushed to the ranks, the memory plan, the
 * speculator; ddt_trainer_close frees all of it.
 * Tested by tests/engine/train/test_trainer.c (exact resume; config errors and what a GPU run is refused,
 * before any step; a GPU the node does not have, leaving nothing behind),
 * tests/daemon/train_cli_test.sh (--resume; bad configs) and tests/daemon/api_e2e.py (runs opened and resumed
 * by the daemon).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/ddt_time.h"
#include "base/log.h"
#include "data/batch.h"
#include "record/checkpoint.h"
#include "split.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int make_dir(const char *path, char *err, size_t err_len)
{
    if (mkdir(path, 0750) && errno != EEXIST) {
        snprintf(err, err_len, "%s: cannot create the directory: %s", path, strerror(errno));
        return -errno;
    }
    return 0;
}

/* A newer checkpoint the resume passed over: moved aside to checkpoints/corrupt-step-NNNNNNNN (so
 * that it counts no more among the `keep` newest, which would otherwise prune a good one for
 * it, and the operator finds it to inspect or restore), a warning, and the run's event
 * "checkpoint_corrupt" naming it, where it went, the file, what is wrong and the step resumed from. */
static void report_passed(ddt_trainer *t, const ddt_checkpoint_passed *p, int64_t resumed_from)
{
    char said[1024], aside[4200];
    ddt_verdict_text(&p->verdict, said, sizeof said);
    const char *base = strrchr(p->dir, '/');
    snprintf(aside, sizeof aside, "%.*s/corrupt-%s", base ? (int)(base - p->dir) : 1, base ? p->dir : ".",
             base ? base + 1 : p->dir);
    if (rename(p->dir, aside) != 0)
        snprintf(aside, sizeof aside, "%s", p->dir);   /* left where it is: the log says so */
    ddt_log(DDT_LOG_WARNING, "run %s: checkpoint passed over at resume path=\"%s\" moved_to=\"%s\" verdict=\"%s\" "
            "resumed_from=%lld", t->run_id, p->dir, aside, said, (long long)resumed_from);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "checkpoint", p->dir);
    cJSON_AddStringToObject(d, "moved_to", aside);
    cJSON_AddNumberToObject(d, "step", (double)p->step);
    cJSON_AddStringToObject(d, "file", p->verdict.file);
    cJSON_AddStringToObject(d, "verdict", p->verdict.state == DDT_VERDICT_INCOMPLETE ? "incomplete" : "corrupt");
    cJSON_AddStringToObject(d, "message", said);
    cJSON_AddNumberToObject(d, "resumed_from", (double)resumed_from);
    if (t->store)
        ddt_store_event_object(t->store, t->run_id, ddt_wall_ms(), "checkpoint_corrupt", d);
    else
        cJSON_Delete(d);
}

/* The weights, moments and place in the data of the run's newest checkpoint that verifies
 * (ckpt: its path), each newer one passed over reported. */
static int resume_from(ddt_trainer *t, char *ckpt, size_t ckpt_len, char *err, size_t err_len)
{
    ddt_checkpoint_meta m;
    ddt_checkpoint_passed *passed;
    int n_passed;
    int rc = ddt_checkpoint_read_newest(t->run_dir, &t->cfg.drafter, t->params, &t->adam, &m, ckpt, ckpt_len,
                                        &passed, &n_passed, err, err_len);
    for (int i = 0; rc == 0 && i < n_passed; i++)
        report_passed(t, &passed[i], m.step);
    free(passed);
    if (rc)
        return rc;
    t->step = m.step;
    t->chunk = m.chunk;
    t->vocab_tile = m.vocab_tile;
    if (t->source)
        rc = ddt_source_seek(t->source, m.cursor);
    else if (m.cursor < 0)   /* generates: the ranks sample from this index on */
        rc = -EINVAL;
    else
        t->cursor = m.cursor;
    if (rc)
        snprintf(err, err_len, "the data source cannot seek to cursor %lld", (long long)m.cursor);
    ddt_checkpoint_meta_free(&m);
    return rc;
}

/* The checkpoint a run resumes from (ckpt), recorded again: its checkpoints row (the time now)
 * and the runs row's last_checkpoint_step. A crash after its directory was renamed into place and
 * before its row was committed left it on disk and out of the store, which would never list it
 * (tests/faults: "kill: checkpoint renamed"). Best effort, as every record of the trainer. */
static void record_resumed_checkpoint(ddt_trainer *t, const char *ckpt)
{
    int64_t bytes = 0;
    DIR *d = opendir(ckpt);
    for (struct dirent *e; d && (e = readdir(d));) {
        struct stat st;
        if (!fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) && S_ISREG(st.st_mode))
            bytes += (int64_t)st.st_size;
    }
    if (d)
        closedir(d);
    ddt_store_checkpoint(t->store, t->run_id, t->step, ckpt, bytes, ddt_wall_ms());
    ddt_store_run_checkpointed(t->store, t->run_id, t->step, ddt_wall_ms());
}

/* The config of a run to resume: the newest checkpoint's state.json that reads (a checkpoint
 * whose tensors do not verify is passed over later, by resume_from). */
static char *resume_config(const char *run_dir, char *ckpt, size_t ckpt_len, char *err, size_t err_len)
{
    int64_t step;
    if (ddt_checkpoint_latest(run_dir, &step, ckpt, ckpt_len)) {
        snprintf(err, err_len, "%s has no complete checkpoint to resume from", run_dir);
        return NULL;
    }
    ddt_checkpoint_meta m;
    return ddt_checkpoint_newest_meta(run_dir, &m, ckpt, ckpt_len, err, err_len) ? NULL
                                                                                 : m.config_json;   /* the caller's now */
}

int ddt_trainer_open(const char *config_json, size_t len, const char *state_dir,
                     const char *run_id, int resume, ddt_store *store, ddt_trainer **out,
                     char *err, size_t err_len, char *field, size_t field_len)
{
    *field = '\0';
    char run_dir[2100], ckpt[2400];
    char *text = NULL;
    if (resume) {
        snprintf(run_dir, sizeof run_dir, "%s/runs/%s", state_dir, run_id);
        if (!(text = resume_config(run_dir, ckpt, sizeof ckpt, err, err_len)))
            return -ENOENT;
    } else if (!(text = strndup(config_json, len))) {
        snprintf(err, err_len, "no memory for a trainer");
        return -ENOMEM;
    }
    ddt_run_config c;
    ddt_devices dev;
    int rc = ddt_run_config_parse(text, strlen(text), &c, err, err_len, field, field_len);
    if (!rc) {
        /* the ranks before anything is made: a config this node cannot run fails at once */
        rc = ddt_run_config_devices(&c, ddt_node_here(), &dev, err, err_len, field, field_len);
        if (!rc)
            rc = ddt_trainer_open_parsed(&c, text, &dev, state_dir, run_id, resume, store, out, err, err_len);
        ddt_run_config_free(&c);
    }
    free(text);
    return rc;
}

int ddt_trainer_open_parsed(const ddt_run_config *config, const char *config_json,
                            const ddt_devices *ranks, const char *state_dir, const char *run_id,
                            int resume, ddt_store *store, ddt_trainer **out, char *err,
                            size_t err_len)
{
    ddt_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_len, "no memory for a trainer");
        return -ENOMEM;
    }
    t->store = store;
    t->checkpoint_step = -1;
    t->fallbacks_at_open = ddk_cuda_fallbacks(NULL, 0);
    /* CPU ranks are the CPU parallelism, beside the loader thread: the BLAS runs each product on
     * its caller's thread (OpenBLAS threads even tiny products, and its spinning workers cost
     * more than they give at drafter sizes). Set before the source starts its loader, whose
     * products would otherwise run on as many threads as the setting has when they start, and
     * a product's bits may depend on that: the same run would not repeat itself bit for bit. */
    ddk_cpu_set_threads(1);
    char path[2100], ckpt[2400] = "";
    const ddt_devices dev = *ranks;
    snprintf(path, sizeof path, "%s/runs", state_dir);
    int rc = make_dir(state_dir, err, err_len);
    if (!rc)
        rc = make_dir(path, err, err_len);
    if (!rc) {
        if (run_id)
            snprintf(t->run_id, sizeof t->run_id, "%s", run_id);
        else
            ddt_store_new_run_id(t->run_id, sizeof t->run_id);
        snprintf(t->run_dir, sizeof t->run_dir, "%s/runs/%s", state_dir, t->run_id);
        t->config_json = strdup(config_json);
        rc = t->config_json ? ddt_run_config_copy(&t->cfg, config) : -ENOMEM;
        if (rc)
            snprintf(err, err_len, "no memory for a trainer");
    }
    int64_t newest;
    if (!rc && resume && ddt_checkpoint_latest(t->run_dir, &newest, ckpt, sizeof ckpt)) {
        snprintf(err, err_len, "%s has no complete checkpoint to resume from", t->run_dir);
        rc = -ENOENT;
    } else if (!rc && !resume) {
        rc = make_dir(t->run_dir, err, err_len);
    }

    /* the target's shape completes the drafter; then the data */
    if (!rc) {
        ddt_run_config *c = &t->cfg;
        int64_t hidden, vocab, layers;
        int tied;
        rc = ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, err, err_len);
        if (!rc)
            rc = ddt_run_config_resolve(c, hidden, vocab, layers, err, err_len);
        char field[160];   /* its sentence names the field */
        if (!rc)
            rc = ddt_run_config_check_files(c, vocab, err, err_len, field, sizeof field);
        ddt_source_config sc;
        ddt_run_config_source(c, &sc);
        sc.tokens_only = dev.colocated || dev.target_ranks;   /* the ranks compute the features */
        t->generates = sc.tokens_only && ddt_source_generates(&sc);   /* ... and sample the tokens */
        if (!rc && t->generates) {   /* no source: the data's rules, and the held-out tokens' room */
            rc = ddt_source_check(&sc, hidden, layers, err, err_len);
            t->data = sc;
            t->data.shards = NULL;
            if (!rc)
                rc = ddt_heldout_tokens_init(&t->held, &sc, err, err_len);
        } else if (!rc) {
            rc = ddt_source_open(&sc, hidden, &t->source, err, err_len);
        }
        if (!rc && t->source && ddt_source_vocab(t->source) != vocab) {
            snprintf(err, err_len, "the target's head has %lld rows but its vocabulary is %lld",
                     (long long)ddt_source_vocab(t->source), (long long)vocab);
            rc = -EINVAL;
        }
    }
    if (!rc) {
        t->embed = t->source ? ddt_source_embed(t->source) : NULL;   /* co-located, split: replica_head */
        t->lm_head = t->source ? ddt_source_lm_head(t->source) : NULL;
        t->param_count = ddt_drafter_param_table(&t->cfg.drafter, t->table, &t->total);
        t->gpu = dev.gpu;
        t->colocated = dev.colocated;
        t->target_ranks = dev.target_ranks;
        t->ranks = dev.ranks;
        snprintf(t->devices_note, sizeof t->devices_note, "%s", dev.note);
    }
    if (!rc) {
        const ddt_run_config *c = &t->cfg;
        t->cfg.ranks = t->ranks;   /* resolved ("all": the GPUs used): the plan's figures per rank */
        t->world = c->cluster_world ? (int)c->cluster_world : t->ranks;
        t->first_rank = (int)c->cluster_first;
        /* the weights of CPU ranks count on rank 0's device; a GPU run's host mirror on the host's */
        ddk_allocator *a0 = t->gpu ? ddk_allocator_cpu() : ddk_allocator_cpu_rank(0);
        size_t bytes = (size_t)t->total * sizeof(float);
        t->params = ddk_malloc(a0, bytes);
        t->adam.m = ddk_malloc(a0, bytes);
        t->adam.v = ddk_malloc(a0, bytes);
        if (!t->params || !t->adam.m || !t->adam.v) {
            snprintf(err, err_len, "no memory for the drafter's %lld parameters and their optimiser state "
                     "(%.3f GB); see `ddtreed plan`", (long long)t->total, 3.0 * bytes / 1e9);
            rc = -ENOMEM;
        }
    }
    if (!rc)
        rc = ddt_trainer_alloc_ranks(t, &dev, err, err_len);
    if (!rc && t->gpu && t->world > 1) {
        int32_t devices[MAX_RANKS];
        for (int r = 0; r < t->ranks; r++)
            devices[r] = t->rank[r].gpu;
        rc = ddk_comm_init(*t->cfg.cluster_id ? t->cfg.cluster_id : NULL, t->world, t->first_rank, t->ranks,
                           devices, &t->comm, err, err_len);
    }
    if (!rc) {
        ddt_drafter_bind(&t->cfg.drafter, t->params, &t->w);
        t->chunk = t->cfg.chunk;
        t->vocab_tile = t->cfg.vocab_tile;
        if (*ckpt) {
            rc = resume_from(t, ckpt, sizeof ckpt, err, err_len);
        } else {
            ddt_drafter_init(&t->cfg.drafter, t->params, ddt_batch_seed(t->cfg.seed, 0, 0, SEED_INIT));
            memset(t->adam.m, 0, (size_t)t->total * sizeof(float));
            memset(t->adam.v, 0, (size_t)t->total * sizeof(float));
        }
        ddt_trainer_push_weights(t);
        const ddt_run_config *c = &t->cfg;
        t->adam_cfg = (ddt_adamw_config){ .lr = c->lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                          .weight_decay = c->weight_decay, .grad_clip = c->grad_clip,
                                          .warmup_steps = (int64_t)llround(c->warmup_fraction * c->steps),
                                          .total_steps = c->steps };
        if (!rc)
            rc = ddt_trainer_plan_for(t, 0, &t->plan, err, err_len);
    }
    if (!rc && t->cfg.spec)
        rc = ddt_trainer_open_speculator(t, err, err_len);
    if (!rc && store && !resume) {
        rc = ddt_store_run_create(store, t->run_id, t->cfg.name, t->config_json, t->cfg.steps, ddt_wall_ms());
        rc = rc == -EEXIST ? 0 : rc;   /* the daemon creates the row when it queues the run */
    }
    if (!rc && resume)
        t->checkpoint_step = t->step;   /* on disk already: a stop or the end here writes none again */
    if (!rc && store && resume)
        record_resumed_checkpoint(t, ckpt);
    if (!rc && *t->devices_note) {   /* once the run's row exists; again at each resume */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "message", t->devices_note);
        cJSON_AddNumberToObject(o, "ranks", t->ranks);
        char *detail = cJSON_PrintUnformatted(o);
        if (detail)
            ddt_trainer_event(t, "devices", "%s", detail);
        free(detail);
        cJSON_Delete(o);
    }
    if (rc) {
        if (!resume)
            rmdir(t->run_dir);   /* the new run's directory, when nothing was written in it */
        ddt_trainer_close(t);
        return rc;
    }
    *out = t;   /* the caller (ddtreed train, the run manager) records the run's states */
    return 0;
}

void ddt_trainer_close(ddt_trainer *t)
{
    if (!t)
        return;
    ddt_speculator_close(t->spec);   /* before rank 0's replica, whose cache it holds */
    size_t bytes = (size_t)t->total * sizeof(float);
    ddk_comm_destroy(t->comm);
    ddt_split_close(t->split);   /* waits for a batch in flight into the ranks' buffers */
    free(t->dest);
    for (int r = 0; r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        if (!rs->be)
            continue;
        ddk_allocator *a = rs->be->alloc;
        rs->be->synchronize(rs->be);   /* nothing queued may still use what is freed */
        ddk_free(a, rs->grads, bytes + (t->gpu ? REDUCED * sizeof(float) : 0));
        ddk_free(a, rs->micro_grads, bytes);
        free(rs->slot_scale);
        if (t->gpu) {
            free(rs->batch_block);
            ddk_host_free_pinned(rs->staging);   /* after the synchronize above: no copy reads it */
            ddk_free(a, rs->dev_batch_block, rs->dev_batch_bytes);
            ddk_free(a, rs->params, bytes);
            ddk_free(a, rs->params16, (size_t)t->total * sizeof(uint16_t));
            ddk_free(a, rs->m, bytes);
            ddk_free(a, rs->v, bytes);
            ddk_free(a, rs->own_lm_head, rs->head_bytes);
            ddk_free(a, rs->own_embed, rs->head_bytes);
        } else {
            ddk_free(a, rs->batch_block, rs->batch_bytes);
        }
        ddt_generator_free(&rs->gen);      /* before its target; a zeroed one (none) is a no-op */
        ddt_target_close(&rs->replica);   /* a zeroed one (none) is a no-op */
        ddk_allocator_set_budget(a, 0);
    }
    ddk_allocator *a0 = t->gpu ? ddk_allocator_cpu() : ddk_allocator_cpu_rank(0);
    ddk_free(a0, t->params, bytes);
    ddk_free(a0, t->params16, (size_t)t->total * sizeof(uint16_t));
    ddk_free(a0, t->adam.m, bytes);
    ddk_free(a0, t->adam.v, bytes);
    free(t->head16);
    ddt_heldout_tokens_free(&t->held);
    if (t->source)
        ddt_source_close(t->source);
    ddt_run_config_free(&t->cfg);
    free(t->config_json);
    free(t);
}
