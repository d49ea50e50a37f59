/* runs_requests.c: what the API asks of the run manager (runs.h, runs_impl.h): a run submitted
 * (its config checked before it is queued) and the controls (pause, resume, cancel, rechunk,
 * checkpoint, export, speculate): each checked against the run's state and the body's values,
 * posted for its worker's next step boundary (or done at once when the run has no worker), and
 * answered with its reply.
 * Tested by tests/daemon/api_e2e.py (every control against the real daemon and client) and
 * tests/fuzz/fuzz_api.c (the handlers' bodies).
 */
#include "runs_impl.h"

#include "base/ddt_time.h"
#include "base/log.h"
#include "record/checkpoint.h"
#include "record/dir_kind.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ddt_runs_submit(ddt_runs *r, const char *json, size_t len, char *id, size_t id_len,
                    char *err, size_t err_len, char *field, size_t field_len)
{
    char new_id[40];
    ddt_store_new_run_id(new_id, sizeof new_id);
    run *u = ddt_runs_new_run(r, new_id, json, len);
    if (!u) {
        snprintf(err, err_len, "no memory for another run");
        return -ENOMEM;
    }
    int rc = ddt_runs_prepare(u, json, len, 1, err, err_len, field, field_len);
    if (rc) {
        ddt_runs_free_run(u);
        return rc;
    }
    snprintf(u->name, sizeof u->name, "%s", u->config.name);
    u->state = DDT_RUN_QUEUED;
    u->max_steps = u->config.steps;
    u->created_ms = u->updated_ms = ddt_wall_ms();
    /* the row before the run is in the list, outside the lock (its write is waited for); the
     * store refuses an id it has (two in the same second): another one then */
    for (int tries = 0; r->store && tries < 8; tries++) {
        rc = ddt_store_run_create(r->store, u->id, u->name, u->config_json, u->max_steps, u->created_ms);
        if (rc != -EEXIST)
            break;
        ddt_store_new_run_id(u->id, sizeof u->id);
    }
    if (rc) {
        ddt_store_health h = { 0 };
        if (r->store)
            ddt_store_get_health(r->store, &h);
        snprintf(err, err_len, "the database refused the run (%s)%s%.600s", strerror(-rc),
                 h.degraded ? ": the store cannot write now: " : "", h.cause);
        ddt_runs_free_run(u);
        return h.degraded ? -EAGAIN : rc;
    }
    pthread_mutex_lock(&r->lock);
    while (!r->store && ddt_runs_find(r, u->id))   /* no store to refuse a repeated id */
        ddt_store_new_run_id(u->id, sizeof u->id);
    if (ddt_runs_add_run(r, u)) {
        pthread_mutex_unlock(&r->lock);
        snprintf(err, err_len, "no memory for another run");
        ddt_runs_free_run(u);   /* its row stays queued: the next start of the daemon runs it */
        return -ENOMEM;
    }
    snprintf(id, id_len, "%s", u->id);
    ddt_log(DDT_LOG_INFO, "run=%s name=\"%s\" queued steps=%lld", u->id, u->name, (long long)u->max_steps);
    ddt_runs_schedule(r);
    ddt_runs_unlock(r);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Controls
 */

static int illegal(run *u, const char *what, char *err, size_t err_len)
{
    snprintf(err, err_len, "cannot %s run %s: it is %s", what, u->id, ddt_run_state_name(u->state));
    return -EBUSY;
}

static cJSON *state_reply(ddt_run_state s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", ddt_run_state_name(s));
    return o;
}

/* an integer member of a control body in [lo, hi] */
static int body_integer(const cJSON *item, double lo, double hi, int64_t *out, char *err, size_t err_len,
                        char *field, size_t field_len)
{
    double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!(v == floor(v)) || v < lo || v > hi) {
        snprintf(field, field_len, "%s", item->string);
        snprintf(err, err_len, "%s must be an integer in [%.0f, %.0f]", item->string, lo, hi);
        return -EINVAL;
    }
    *out = (int64_t)v;
    return 0;
}

/* POST /runs/{id}/speculate's body {"step": N?, "prompts": K?, "gen_len": G?, "tree_budgets": [..]?}
 * against the run's speculator caps (ddt_run_config_spec_caps): 0 with q, or -EINVAL */
static int parse_speculate(const cJSON *body, const ddt_run_config *c, ddt_trainer_spec_request *q, char *err,
                           size_t err_len, char *field, size_t field_len)
{
    int64_t max_prompts, max_gen, max_budget;
    ddt_run_config_spec_caps(c, &max_prompts, &max_gen, &max_budget);
    *q = (ddt_trainer_spec_request){ .step = -1, .n_budgets = -1 };
    if (body && !cJSON_IsObject(body)) {
        snprintf(err, err_len, "the body must be a JSON object {\"step\": N, \"prompts\": K, \"gen_len\": G, "
                 "\"tree_budgets\": [..]} (each may be omitted)");
        return -EINVAL;
    }
    for (const cJSON *item = body ? body->child : NULL; item; item = item->next) {
        int rc = 0;
        if (!strcmp(item->string, "step")) {
            rc = body_integer(item, 0, 9.0e15, &q->step, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "prompts")) {
            rc = body_integer(item, 1, (double)max_prompts, &q->prompts, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "gen_len")) {
            rc = body_integer(item, 1, (double)max_gen, &q->gen_len, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "tree_budgets")) {
            int n = cJSON_IsArray(item) ? cJSON_GetArraySize(item) : -1;
            if (n < 0 || n > DDT_MAX_BUDGETS) {
                snprintf(field, field_len, "tree_budgets");
                snprintf(err, err_len, "tree_budgets must be a list of at most %d node budgets", DDT_MAX_BUDGETS);
                return -EINVAL;
            }
            q->n_budgets = n;
            for (int i = 0; i < n && !rc; i++) {
                const cJSON *k = cJSON_GetArrayItem(item, i);
                double v = cJSON_IsNumber(k) ? k->valuedouble : NAN;
                if (!(v == floor(v)) || v < 1 || v > (double)max_budget) {
                    snprintf(field, field_len, "tree_budgets");
                    snprintf(err, err_len, "tree_budgets entries must be integers in [1, %lld]: the speculator's "
                             "trees are planned for at most %lld nodes (the largest of "
                             "eval.speculative.tree_budgets%s)", (long long)max_budget, (long long)max_budget,
                             c->spec ? "" : ", [8, 32] without it");
                    rc = -EINVAL;
                } else {
                    q->budgets[i] = (int64_t)v;
                }
            }
        } else {
            snprintf(field, field_len, "%s", item->string);
            snprintf(err, err_len, "%s is not a speculate field (step, prompts, gen_len, tree_budgets)", item->string);
            rc = -EINVAL;
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * POST /runs/{id}/export's destination
 */

/* whether dir is a directory that an export may replace: an empty one, or an earlier drafter
 * export (dir_kind.h: its manifest, or a config.json with a dflash_config). A model directory
 * (a target's model.safetensors and config.json) is not: replacing it would delete the model. */
static int replaceable(const char *dir)
{
    if (ddt_dir_kind_of(dir) == DDT_DIR_EXPORT)
        return 1;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int empty = 1;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* The export's directory from the body {"out": "/abs/dir", "replace_final": bool} (each may be
 * omitted) into dir: without out, runs/<id>/exports/step-NNNNNNNN (made here), which the run's
 * final export (runs/<id>/export) never touches. out is absolute, its parent exists, it is not
 * inside another run's directory nor this run's except as exports/NAME, or export itself with
 * replace_final (the final export then replaces it); when it exists it is an empty directory or
 * an earlier export. 0, or -EINVAL naming the field. */
static int export_destination(ddt_runs *r, run *u, const cJSON *body, int64_t step, char *dir, size_t dir_len,
                              char *err, size_t err_len, char *field, size_t field_len)
{
    const cJSON *out = NULL;
    int replace_final = 0;
    if (body && !cJSON_IsObject(body)) {
        snprintf(err, err_len, "the body must be a JSON object {\"out\": \"/absolute/dir\", \"replace_final\": "
                 "false} (each may be omitted)");
        return -EINVAL;
    }
    for (const cJSON *item = body ? body->child : NULL; item; item = item->next) {
        if (!strcmp(item->string, "out")) {
            out = item;
        } else if (!strcmp(item->string, "replace_final") && cJSON_IsBool(item)) {
            replace_final = cJSON_IsTrue(item);
        } else {
            snprintf(field, field_len, "%s", item->string);
            snprintf(err, err_len, !strcmp(item->string, "replace_final") ? "replace_final must be true or false"
                     : "%s is not an export field (out, replace_final)", item->string);
            return -EINVAL;
        }
    }
    char runs_dir[1100];
    snprintf(runs_dir, sizeof runs_dir, "%s/runs", r->state_dir);
    if (!out) {
        char exports[2200];
        snprintf(exports, sizeof exports, "%s/%s/exports", runs_dir, u->id);
        if (mkdir(exports, 0755) && errno != EEXIST) {
            snprintf(err, err_len, "cannot make %s: %s", exports, strerror(errno));
            return -EIO;
        }
        if (snprintf(dir, dir_len, "%s/step-%08lld", exports, (long long)step) >= (int)dir_len) {
            snprintf(err, err_len, "the state directory's path is too long for an export");
            return -ENAMETOOLONG;
        }
        return 0;
    }
    snprintf(field, field_len, "out");
    const char *text = cJSON_IsString(out) ? out->valuestring : NULL;
    size_t len = text ? strlen(text) : 0;
    while (len > 1 && text[len - 1] == '/')
        len--;
    if (!text || text[0] != '/' || len >= 2000) {
        snprintf(err, err_len, "out must be an absolute path of at most 2000 bytes (the directory the export "
                 "is written to, on the daemon's machine)");
        return -EINVAL;
    }
    char given[2048], parent[2048], real_parent[PATH_MAX], real_runs[PATH_MAX];
    snprintf(given, sizeof given, "%.*s", (int)len, text);
    const char *name = strrchr(given, '/') + 1;
    snprintf(parent, sizeof parent, "%.*s", name - given > 1 ? (int)(name - given - 1) : 1, given);
    if (!*name || !strcmp(name, ".") || !strcmp(name, "..")) {
        snprintf(err, err_len, "out must name a directory to write (%s ends in '%s')", given, name);
        return -EINVAL;
    }
    struct stat st;
    if (!realpath(parent, real_parent) || stat(real_parent, &st) || !S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "out: the directory it goes in (%s) does not exist on the daemon's machine; "
                 "make it first", parent);
        return -EINVAL;
    }
    if (snprintf(dir, dir_len, "%s/%s", strcmp(real_parent, "/") ? real_parent : "", name) >= (int)dir_len) {
        snprintf(err, err_len, "out is too long once its links are resolved (%s/%s)", real_parent, name);
        return -EINVAL;
    }
    /* inside the runs' directory: only this run's exports/NAME, or its export when asked */
    size_t n = realpath(runs_dir, real_runs) ? strlen(real_runs) : 0;
    if (n && !strncmp(dir, real_runs, n) && (dir[n] == '/' || !dir[n])) {
        const char *rest = dir[n] ? dir + n + 1 : "";
        size_t id_len = strcspn(rest, "/");
        int own = id_len == strlen(u->id) && !strncmp(rest, u->id, id_len) && rest[id_len] == '/';
        const char *inside = own ? rest + id_len + 1 : "";
        int allowed = own && ((!strncmp(inside, "exports/", 8) && inside[8] && !strchr(inside + 8, '/')) ||
                              (!strcmp(inside, "export") && replace_final));
        if (!allowed) {
            if (!own)
                snprintf(err, err_len, "out (%s) is inside %s%.*s's directory: choose a directory outside %s",
                         dir, id_len ? "run " : "the runs", (int)id_len, rest, real_runs);
            else if (!strcmp(inside, "export"))
                snprintf(err, err_len, "out (%s) is the run's final export, which the run's end writes again: "
                         "leave out out for %s/%s/exports/step-%08lld, or add \"replace_final\": true", dir,
                         runs_dir, u->id, (long long)step);
            else
                snprintf(err, err_len, "out (%s) is inside the run's own directory: only exports/NAME (or its "
                         "final export with replace_final) may be written there", dir);
            return -EINVAL;
        }
    }
    if (lstat(dir, &st) == 0 && (!S_ISDIR(st.st_mode) || !replaceable(dir))) {
        snprintf(err, err_len, "out (%s) exists and is %s: an export replaces only an empty directory or an "
                 "earlier export; choose a new directory", dir, S_ISDIR(st.st_mode) ? "not an export" :
                 S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory");
        return -EINVAL;
    }
    *field = '\0';
    return 0;
}

int ddt_runs_control(ddt_runs *r, const char *id, ddt_run_action action, const cJSON *body,
                     cJSON **reply, int *status, char *err, size_t err_len, char *field,
                     size_t field_len)
{
    *field = '\0';
    *status = 202;
    int64_t chunk = -1, tile = -1;
    if (action == DDT_RUN_RECHUNK) {   /* {"chunk": N, "vocab_tile": M}, either may be omitted */
        if (!cJSON_IsObject(body)) {
            snprintf(err, err_len, "the body must be a JSON object {\"chunk\": N, \"vocab_tile\": M}");
            return -EINVAL;
        }
        for (const cJSON *item = body->child; item; item = item->next) {
            int is_chunk = !strcmp(item->string, "chunk"), is_tile = !strcmp(item->string, "vocab_tile");
            double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
            if (!is_chunk && !is_tile) {
                snprintf(field, field_len, "%s", item->string);
                snprintf(err, err_len, "%s is not a rechunk field (chunk, vocab_tile)", item->string);
                return -EINVAL;
            }
            if (!(v == floor(v)) || v < (is_chunk ? 1 : 0) || v > 9.0e15) {
                snprintf(field, field_len, "%s", item->string);
                snprintf(err, err_len, "%s must be an integer >= %d", item->string, is_chunk ? 1 : 0);
                return -EINVAL;
            }
            *(is_chunk ? &chunk : &tile) = (int64_t)v;
        }
        if (chunk < 0 && tile < 0) {
            snprintf(err, err_len, "give chunk, vocab_tile or both");
            return -EINVAL;
        }
    }
    pthread_mutex_lock(&r->lock);
    run *u = ddt_runs_find(r, id);
    int rc = 0;
    if (!u) {
        snprintf(err, err_len, "no run %s", id);
        rc = -ENOENT;
        goto out;
    }
    int live = u->has_thread && !u->thread_done;
    switch (action) {
    case DDT_RUN_PAUSE:
        if (u->state == DDT_RUN_PAUSED && u->hold) {   /* held by a fault: now the user's pause, kept */
            u->hold = 0;
            *reply = state_reply(DDT_RUN_PAUSED);
            break;
        }
        if (u->state != DDT_RUN_RUNNING && u->state != DDT_RUN_PAUSING) {
            rc = illegal(u, "pause", err, err_len);
            break;
        }
        u->want_pause = 1;
        if (u->state == DDT_RUN_RUNNING)
            ddt_runs_set_state(r, u, DDT_RUN_PAUSING, NULL);
        *reply = state_reply(DDT_RUN_PAUSING);
        break;
    case DDT_RUN_RESUME:
        if (u->state == DDT_RUN_PAUSING || (u->state == DDT_RUN_RUNNING && u->want_pause)) {
            u->want_pause = 0;   /* not paused yet: the request is withdrawn */
            if (u->state == DDT_RUN_PAUSING)
                ddt_runs_set_state(r, u, DDT_RUN_RUNNING, NULL);
            *reply = state_reply(DDT_RUN_RUNNING);
        } else if (u->state == DDT_RUN_PAUSED && live) {
            u->want_resume = 1;
            pthread_cond_broadcast(&r->wake);
            *reply = state_reply(DDT_RUN_RUNNING);
        } else if (u->state == DDT_RUN_PAUSED || u->state == DDT_RUN_INTERRUPTED) {
            ddt_runs_set_state(r, u, DDT_RUN_QUEUED, NULL);   /* its worker is gone: continue from a checkpoint */
            ddt_runs_schedule(r);
            *reply = state_reply(u->state);
        } else {
            rc = illegal(u, "resume", err, err_len);
        }
        break;
    case DDT_RUN_CANCEL:
        if (!ddt_runs_active(u->state)) {
            rc = illegal(u, "cancel", err, err_len);
            break;
        }
        if (live) {
            u->want_cancel = 1;
            pthread_cond_broadcast(&r->wake);
        } else {
            ddt_runs_set_state(r, u, DDT_RUN_CANCELLED, NULL);
        }
        *reply = state_reply(live ? u->state : DDT_RUN_CANCELLED);
        cJSON_AddStringToObject(*reply, "requested", "cancel");   /* at the next step boundary */
        break;
    case DDT_RUN_RECHUNK:
        if (!ddt_runs_active(u->state)) {
            rc = illegal(u, "rechunk", err, err_len);
            break;
        }
        u->want_chunk = chunk;
        u->want_tile = tile;
        *reply = cJSON_CreateObject();
        /* a running worker is inside step + 1 now: the boundary after it applies the request */
        cJSON_AddNumberToObject(*reply, "applies_from_step",
                                (double)(u->step + (live && u->state == DDT_RUN_RUNNING ? 2 : 1)));
        break;
    case DDT_RUN_CHECKPOINT:
        if (!ddt_runs_has_worker(u)) {
            rc = illegal(u, "checkpoint", err, err_len);
            break;
        }
        u->want_checkpoint = 1;
        pthread_cond_broadcast(&r->wake);
        *reply = cJSON_CreateObject();
        cJSON_AddNumberToObject(*reply, "applies_from_step", (double)(u->step + (u->state == DDT_RUN_PAUSED ? 0 : 1)));
        break;
    case DDT_RUN_SPECULATE: {
        /* the worker holds the target and the speculator: a run without one is refused */
        if (!ddt_runs_has_worker(u)) {
            snprintf(err, err_len, "cannot speculate on run %s: it is %s and has no worker holding its target; "
                     "run `ddtreed speculate` on its export", u->id, ddt_run_state_name(u->state));
            rc = -EBUSY;
            break;
        }
        if (u->config.target_kind == DDT_SOURCE_SHARDS || u->devices.target_ranks ||
            (u->devices.gpu && !u->devices.colocated)) {   /* no target beside rank 0's drafter */
            snprintf(err, err_len, "cannot speculate on run %s: its target is not beside rank 0's drafter (%s); run "
                     "`ddtreed speculate` on its export", u->id,
                     u->config.target_kind == DDT_SOURCE_SHARDS ? "a shards run has none at train time"
                     : u->devices.target_ranks ? "a split puts it on other devices"
                                               : "GPU ranks with target.devices \"host\"");
            rc = -EBUSY;
            break;
        }
        if (u->want_spec) {
            snprintf(err, err_len, "run %s already has a speculative evaluation waiting for the next step boundary",
                     u->id);
            rc = -EBUSY;
            break;
        }
        ddt_trainer_spec_request q;
        if ((rc = parse_speculate(body, &u->config, &q, err, err_len, field, field_len)))
            break;
        if (q.step == u->step && u->state == DDT_RUN_PAUSED)
            q.step = -1;   /* the live weights are that step's */
        if (q.step >= 0) {
            char run_dir[2200], dir[2300];
            snprintf(run_dir, sizeof run_dir, "%s/runs/%s", r->state_dir, u->id);
            if (ddt_checkpoint_find(run_dir, q.step, dir, sizeof dir)) {
                snprintf(field, field_len, "step");
                if (q.step == u->step)   /* running: the weights move on before the next boundary */
                    snprintf(err, err_len, "step %lld has no kept checkpoint and the run is training past it: "
                             "leave step out for the live weights at the next step boundary, or pause the run "
                             "first", (long long)q.step);
                else
                    snprintf(err, err_len, "step %lld has no kept checkpoint (the newest is %lld; checkpoint.keep "
                             "keeps the newest); leave step out for the live weights", (long long)q.step,
                             (long long)u->last_checkpoint_step);
                rc = -EINVAL;
                break;
            }
        }
        u->spec_request = q;
        u->want_spec = 1;
        pthread_cond_broadcast(&r->wake);
        *reply = cJSON_CreateObject();
        cJSON_AddStringToObject(*reply, "weights", q.step >= 0 ? "checkpoint" : "live");
        if (q.step >= 0)
            cJSON_AddNumberToObject(*reply, "step", (double)q.step);
        else   /* the live weights at the next step boundary */
            cJSON_AddNumberToObject(*reply, "step",
                                    (double)(u->step + (u->state == DDT_RUN_PAUSED ? 0 : 1)));
        break;
    }
    case DDT_RUN_EXPORT: {
        int has_worker = ddt_runs_has_worker(u);
        if (has_worker && u->want_export) {
            snprintf(err, err_len, "run %s already has an export waiting for the next step boundary (into %s)",
                     u->id, u->export_dir);
            rc = -EBUSY;
            break;
        }
        char run_dir[2100], ckpt[2400], dir[sizeof u->export_dir];
        snprintf(run_dir, sizeof run_dir, "%s/runs/%s", r->state_dir, u->id);
        /* the step its weights are of: the next step boundary's, or the newest checkpoint's */
        int64_t step = u->step + (u->state == DDT_RUN_PAUSED ? 0 : 1);
        if (!has_worker && ddt_checkpoint_latest(run_dir, &step, ckpt, sizeof ckpt)) {
            snprintf(err, err_len, "cannot export run %s: it is %s, has no worker and no complete checkpoint to "
                     "export", u->id, ddt_run_state_name(u->state));
            rc = -EBUSY;
            break;
        }
        if ((rc = export_destination(r, u, body, step, dir, sizeof dir, err, err_len, field, field_len)))
            break;
        *reply = cJSON_CreateObject();
        cJSON_AddStringToObject(*reply, "path", dir);
        cJSON_AddNumberToObject(*reply, "step", (double)step);
        if (has_worker) {
            snprintf(u->export_dir, sizeof u->export_dir, "%s", dir);
            u->want_export = 1;
            pthread_cond_broadcast(&r->wake);
        } else {   /* no worker: from its newest checkpoint, now (outside the lock) */
            ddt_runs_unlock(r);
            rc = ddt_checkpoint_export(run_dir, step, dir, ckpt, sizeof ckpt, err, err_len);
            if (rc) {
                cJSON_Delete(*reply);
                *reply = NULL;
                return rc == -ENOENT ? -EBUSY : rc;
            }
            if (r->store) {   /* as the trainer's export event says it */
                cJSON *d = cJSON_CreateObject();
                cJSON_AddNumberToObject(d, "step", (double)step);
                cJSON_AddBoolToObject(d, "written", 1);
                cJSON_AddStringToObject(d, "path", dir);
                cJSON_AddStringToObject(d, "checkpoint", ckpt);
                ddt_store_event_object(r->store, id, ddt_wall_ms(), "export", d);
            }
            *status = 200;
            return 0;
        }
        break;
    }
    }
out:
    if (rc == 0)
        u->last_progress_s = ddt_mono_s();
    ddt_runs_unlock(r);
    return rc;
}
