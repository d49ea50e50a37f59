/* cmd_train.c: `ddtreed train` (one run in the foreground, writing exactly what the daemon
 * writes: DIR/ddtree.db and DIR/runs/<id>/) and `ddtreed train --resume`.
 *
 *   ddtreed train CONFIG.json --state-dir DIR [--stop-after N]
 *   ddtreed train --resume DIR [--run ID] [--stop-after N]
 *
 * The loop is the trainer's (ddt_trainer_advance / _finish: the same calls as the daemon's
 * worker, hence the same steps, evals, checkpoints and events); this tool keeps the arguments
 * and the printing: a live progress line (step, loss, tok/s, peak memory, ETA), each
 * evaluation (the baseline at step 0, every eval.every_steps, the end), then a summary. The
 * run's state moves along run_state.h's table as the daemon's does (ddt_store_run_transition):
 * queued or the state it was resumed from -> running -> completed or failed; --stop-after N is
 * the daemon's pause after N steps (running -> pausing -> its checkpoint -> paused). A hold
 * (ddt_trainer_ready: the store cannot write, a checkpoint or the export failed) is a pause that
 * ends by itself (running -> paused -> running, waiting in place); data that cannot be read
 * (-EIO) ends the run paused, to resume from its newest checkpoint once the file is fixed. A
 * run left running or pausing is first marked interrupted (crash recovery), a finished one does
 * not resume.
 * Tested by tests/daemon/train_cli_test.sh (through scripts/test) and scripts/demo.
 */
#include "base/read_file.h"
#include "base/ddt_time.h"
#include "commands.h"
#include "model/model_config.h"
#include "record/store_read.h"
#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TRAIN_USAGE                                                                 \
    "usage: ddtreed train CONFIG.json --state-dir DIR [--stop-after N]\n"          \
    "       ddtreed train --resume DIR [--run ID] [--stop-after N]\n"

/* the newest run directory under DIR/runs (by name: ids start with their UTC time) */
static int newest_run(const char *state_dir, char *id, size_t len)
{
    char path[2100];
    snprintf(path, sizeof path, "%s/runs", state_dir);
    DIR *d = opendir(path);
    if (!d)
        return -ENOENT;
    *id = '\0';
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && strcmp(e->d_name, id) > 0)
            snprintf(id, len, "%s", e->d_name);
    closedir(d);
    return *id ? 0 : -ENOENT;
}

/* For --resume: the state of run id's row in db (*state), 0; or -ENOENT (no row), -EPERM (a
 * finished run), a read error, with err. A row left running or pausing (this tool or the daemon
 * stopped under it) is marked interrupted first, as the daemon does at its start. */
static int resume_state(ddt_store *store, const char *db, const char *id, ddt_run_state *state, char *err,
                        size_t err_len)
{
    ddt_run_row *rows = NULL;
    int count = 0;
    int rc = ddt_store_read_runs(db, &rows, &count, err, err_len);
    const ddt_run_row *row = NULL;
    for (int i = 0; rc == 0 && i < count && !row; i++)
        if (!strcmp(rows[i].id, id))
            row = &rows[i];
    if (!rc && !row) {
        snprintf(err, err_len, "%.1000s has no run %s", db, id);
        rc = -ENOENT;
    } else if (!rc && ddt_run_state_parse(row->state, state)) {
        snprintf(err, err_len, "run %s is in state \"%s\", which this ddtreed does not know", id, row->state);
        rc = -EINVAL;
    } else if (!rc && ddt_run_state_final(*state)) {
        snprintf(err, err_len, "run %s is %s: a finished run does not resume (ddtreed export RUN_DIR --out DIR "
                 "exports it again)", id, ddt_run_state_name(*state));
        rc = -EPERM;
    } else if (!rc && (*state == DDT_RUN_RUNNING || *state == DDT_RUN_PAUSING)) {
        fprintf(stderr, "run %s was left %s (stopped under it): interrupted, resumed from its newest checkpoint\n",
                id, ddt_run_state_name(*state));
        rc = ddt_store_run_transition(store, id, *state, DDT_RUN_INTERRUPTED, row->step, -1, ddt_wall_ms(), NULL);
        if (rc)
            snprintf(err, err_len, "cannot record run %s as interrupted: %s", id, strerror(-rc));
        *state = DDT_RUN_INTERRUPTED;
    }
    ddt_store_free_runs(rows, count);
    return rc;
}

/* tau_chain, tau_tree(K) and acc_1 of a */
static void print_figures(const ddt_acceptance *a, FILE *out)
{
    fprintf(out, "tau_chain %.3f", ddt_acceptance_tau_chain(a));
    for (int i = 0; i < a->n_budgets; i++)
        fprintf(out, ", tau_tree(%lld) %.3f", (long long)a->budgets[i], ddt_acceptance_tau_tree(a, i));
    fprintf(out, ", acc_1 %.3f", ddt_acceptance_acc(a, 1));
}

/* a DFlash2 drafter's figures are its path selector's, its unary head's beside */
static void print_eval(const ddt_acceptance *a, int64_t step, FILE *out)
{
    fprintf(out, "eval at step %lld: %s", (long long)step, a->selector ? "selector " : "");
    print_figures(a, out);
    if (a->selector) {
        const ddt_acceptance unary = ddt_acceptance_unary(a);
        fprintf(out, "; unary ");
        print_figures(&unary, out);
    }
    fprintf(out, " (%lld blocks)\n", (long long)a->blocks);
}

/* ddt_trainer_ready at a step boundary: 0 when the run may go on; else the run is recorded
 * paused with why (from *at), and this waits, asking again every second, until it is ready,
 * then records it running again and answers 1. The same hold as the daemon's: the store cannot
 * write, a checkpoint or the export owed. */
static int hold(ddt_store *store, ddt_trainer *t, ddt_run_state *at)
{
    char why[1600];
    if (ddt_trainer_ready(t, why, sizeof why))
        return 0;
    const char *id = ddt_trainer_run_id(t);
    int64_t step = ddt_trainer_step_count(t);
    fprintf(stderr, "\nrun %s paused at step %lld: %s\nit goes on by itself once this is over (Ctrl-C stops it; "
            "ddtreed train --resume goes on from its newest checkpoint)\n", id, (long long)step, why);
    char error[sizeof why + 8];
    snprintf(error, sizeof error, DDT_HOLD_PREFIX "%s", why);
    int rc = ddt_store_run_transition(store, id, *at, DDT_RUN_PAUSED, step, -1, ddt_wall_ms(), error);
    if (rc == 0 || rc == -EINPROGRESS)
        *at = DDT_RUN_PAUSED;
    char said[sizeof why];
    snprintf(said, sizeof said, "%s", why);
    for (;;) {
        nanosleep(&(struct timespec){ 1, 0 }, NULL);
        if (ddt_trainer_ready(t, why, sizeof why))
            break;
        if (strcmp(why, said))   /* held for another reason now */
            fprintf(stderr, "run %s still held at step %lld, now: %s\n", id, (long long)step, why);
        snprintf(said, sizeof said, "%s", why);
    }
    fprintf(stderr, "run %s goes on: what held it is over\n", id);
    rc = ddt_store_run_transition(store, id, *at, DDT_RUN_RUNNING, step, -1, ddt_wall_ms(), "");
    if (rc == 0 || rc == -EINPROGRESS)
        *at = DDT_RUN_RUNNING;
    return 1;
}

static void format_eta(double seconds, char *out, size_t len)
{
    long s = seconds > 0 && seconds < 1e9 ? (long)seconds : 0;
    if (s >= 3600)
        snprintf(out, len, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else
        snprintf(out, len, "%ldm%02lds", s / 60, s % 60);
}

int ddt_cmd_train(int argc, char **argv)
{
    const char *config = NULL, *state_dir = NULL, *resume = NULL, *run = NULL;
    int64_t stop_after = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(TRAIN_USAGE "\nThe run config (JSON; unknown keys are errors):\n\n", stdout);
            ddt_run_config_print_reference(stdout);
            return 0;
        }
        if (k[0] != '-' && !config) {
            config = k;
            continue;
        }
        const char **slot = !strcmp(k, "--state-dir") ? &state_dir : !strcmp(k, "--resume") ? &resume
                          : !strcmp(k, "--run") ? &run : NULL;
        if (!strcmp(k, "--stop-after") && v && !ddt_parse_count(v, &stop_after) && stop_after > 0) {
            i++;
            continue;
        }
        if (!slot || !v) {
            fprintf(stderr, "ddtreed train: %s %s\n" TRAIN_USAGE, k,
                    !strcmp(k, "--stop-after") ? "wants a positive integer" : v ? "is not an option" : "needs a value");
            return 2;
        }
        *slot = v;
        i++;
    }
    if (resume ? (config || state_dir) : (!config || !state_dir)) {
        fprintf(stderr, "ddtreed train: give CONFIG.json and --state-dir, or --resume DIR\n" TRAIN_USAGE);
        return 2;
    }
    if (resume)
        state_dir = resume;

    char err[2048] = "", field[160] = "", run_id[256] = "";
    char *json = NULL;
    /* relative paths in the file: against its folder (not this shell's directory) */
    if (!resume && !(json = ddt_run_config_read_file(config, err, sizeof err))) {
        fprintf(stderr, "ddtreed train: %s\n", err);
        return 1;
    }
    if (resume && !run && newest_run(state_dir, run_id, sizeof run_id)) {
        fprintf(stderr, "ddtreed train: %s/runs holds no run to resume\n", state_dir);
        return 1;
    }
    if (mkdir(state_dir, 0750) && errno != EEXIST) {
        fprintf(stderr, "ddtreed train: cannot create %s: %s\n", state_dir, strerror(errno));
        free(json);
        return 1;
    }
    char db[2100];
    snprintf(db, sizeof db, "%s/ddtree.db", state_dir);
    ddt_store *store = NULL;
    int rc = ddt_store_open(db, &store, err, sizeof err);
    const char *id = resume ? (run ? run : run_id) : NULL;   /* a new run's: the store names it */
    ddt_run_state from = DDT_RUN_QUEUED;                     /* a new run's row, made by the trainer */
    if (!rc && resume)
        rc = resume_state(store, db, id, &from, err, sizeof err);
    ddt_trainer *t = NULL;
    if (!rc)
        rc = ddt_trainer_open(json ? json : "", json ? strlen(json) : 0, state_dir, id, resume != NULL, store,
                              &t, err, sizeof err, field, sizeof field);
    if (!rc && (rc = ddt_store_run_transition(store, ddt_trainer_run_id(t), from, DDT_RUN_RUNNING,
                                              ddt_trainer_step_count(t), -1, ddt_wall_ms(), NULL)))
        snprintf(err, sizeof err, "cannot record run %s as running: %s", ddt_trainer_run_id(t), strerror(-rc));
    free(json);
    if (rc) {
        fprintf(stderr, "ddtreed train: %s%s%s\n", config && *field ? config : "", config && *field ? ": " : "", err);
        ddt_trainer_close(t);
        if (store)
            ddt_store_close(store);
        return 1;
    }

    const ddt_run_config *c = ddt_trainer_config(t);
    const ddt_memory_plan *plan = ddt_trainer_plan(t);
    fprintf(stderr, "run %s (%s): %lld steps, %lld sequences x %lld tokens per step, %lld rank(s); "
            "predicted peak %.1f MB per rank\n", ddt_trainer_run_id(t), c->name, (long long)c->steps,
            (long long)c->sequences_per_step, (long long)c->seq_len, (long long)c->ranks, plan->peak / 1e6);
    if (*ddt_trainer_devices_note(t))
        fprintf(stderr, "%s\n", ddt_trainer_devices_note(t));
    int tty = isatty(2);
    double tau_start = -1, first_loss = -1, last_loss = 0, tok_s = 0, elapsed = 0;
    int64_t peak = 0, done_here = 0;
    int have_eval = 0, finished = 0, unreadable = 0;
    ddt_acceptance acc;   /* the newest evaluation */
    ddt_trainer_outcome o;
    ddt_run_state at = DDT_RUN_RUNNING, end = DDT_RUN_FAILED;
    for (;;) {
        if (stop_after && done_here == stop_after && ddt_trainer_step_count(t) < c->steps) {
            /* --stop-after N: the daemon's pause, after N steps: pausing, its checkpoint, paused */
            int recorded = ddt_store_run_transition(store, ddt_trainer_run_id(t), at, DDT_RUN_PAUSING,
                                                    ddt_trainer_step_count(t), -1, ddt_wall_ms(), NULL);
            if (recorded)
                fprintf(stderr, "ddtreed train: the pause was not recorded in %s: %s\n", db, strerror(-recorded));
            at = recorded ? at : DDT_RUN_PAUSING;
            rc = ddt_trainer_hold(t, err, sizeof err);
            end = DDT_RUN_PAUSED;
            break;
        }
        if (hold(store, t, &at))
            continue;   /* it went on after a hold: ask again */
        if ((rc = ddt_trainer_advance(t, &o, err, sizeof err))) {
            unreadable = rc == -ENODATA;   /* its data could not be read: paused, to go on once it is fixed */
            end = unreadable ? DDT_RUN_PAUSED : end;
            break;   /* failed */
        }
        if (o.done) {   /* complete once the final checkpoint and the export are written */
            if (ddt_trainer_finish(t, err, sizeof err)) {
                fprintf(stderr, "%sddtreed train: %s\n", tty ? "\n" : "", err);
                continue;   /* owed: held until written (hold) */
            }
            finished = 1;
            end = DDT_RUN_COMPLETED;
            break;
        }
        const ddt_step_record *rec = &o.rec;
        if (o.stepped) {
            done_here++;
            first_loss = first_loss < 0 ? rec->loss : first_loss;
            last_loss = rec->loss;
            elapsed += rec->step_ms / 1e3;
            tok_s = rec->tokens * done_here / elapsed;
            peak = rec->peak_bytes > peak ? rec->peak_bytes : peak;
            char eta[32];
            format_eta((double)(c->steps - rec->step) * elapsed / (double)done_here, eta, sizeof eta);
            int64_t every = c->steps / 20 > 0 ? c->steps / 20 : 1;
            if (tty || rec->step % every == 0 || rec->step == c->steps)
                fprintf(stderr, "%sstep %lld/%lld  loss %.4f  acc %.3f  %.0f tok/s  peak %.1f MB  chunk %lld%s  eta %s%s",
                        tty ? "\r" : "", (long long)rec->step, (long long)c->steps, rec->loss, rec->acc,
                        rec->tokens_per_s, rec->peak_bytes / 1e6, (long long)rec->chunk,
                        rec->vocab_tile ? " (tiled)" : "", eta, tty ? "   " : "\n");
        }
        if (o.evaluated) {
            if (tty && o.stepped)
                fputc('\n', stderr);
            acc = o.acceptance;
            have_eval = 1;
            if (!o.stepped)   /* the baseline: where acceptance starts, for the summary */
                tau_start = ddt_acceptance_tau_chain(&acc);
            print_eval(&acc, ddt_trainer_step_count(t), stderr);
        }
        if (o.speculated) {   /* eval.speculative: the acceptance a server sees (SPEC.md 7) */
            fprintf(stderr, "speculative at step %lld: tau_spec %.3f", (long long)ddt_trainer_step_count(t),
                    ddt_speculate_tau(&o.spec));
            for (int i = 0; i < o.spec.n_budgets; i++)
                fprintf(stderr, ", tau_spec_tree(%lld) %.3f", (long long)o.spec.budgets[i],
                        ddt_speculate_tau_tree(&o.spec, i));
            fprintf(stderr, " (%lld prompts%s)\n", (long long)o.spec.prompts,
                    o.spec.mismatched ? ", NOT greedy-equal: a bug" : ", greedy-equal");
        }
        if (*o.warning)
            fprintf(stderr, "%sddtreed train: %s\n", tty ? "\n" : "", o.warning);
    }
    char export_dir[2200];
    snprintf(export_dir, sizeof export_dir, "%s/export", ddt_trainer_run_dir(t));
    int recorded = ddt_store_run_transition(store, ddt_trainer_run_id(t), at, end, ddt_trainer_step_count(t), -1,
                                            ddt_wall_ms(), end == DDT_RUN_FAILED || unreadable ? err : NULL);
    ddt_store_close(store);
    if (recorded && recorded != -EINPROGRESS)   /* kept in the queue: written by the close */
        fprintf(stderr, "ddtreed train: the run's end (%s) was not recorded in %s: %s\n", ddt_run_state_name(end),
                db, strerror(-recorded));

    if (rc)
        fprintf(stderr, "ddtreed train: %s\n", err);
    printf("\nrun %s %s at step %lld of %lld\n", ddt_trainer_run_id(t), ddt_run_state_name(end),
           (long long)ddt_trainer_step_count(t), (long long)c->steps);
    if (done_here) {
        printf("  loss          %.4f -> %.4f over %lld steps here\n", first_loss, last_loss, (long long)done_here);
        printf("  throughput    %.0f tokens/s (%lld rank(s))\n", tok_s, (long long)c->ranks);
        printf("  peak memory   %.1f MB per rank (predicted %.1f MB)\n", peak / 1e6, plan->peak / 1e6);
    }
    if (have_eval) {
        printf("  acceptance    tau_chain %.3f", ddt_acceptance_tau_chain(&acc));
        if (tau_start >= 0)
            printf(" (from %.3f at step 0)", tau_start);
        for (int i = 0; i < acc.n_budgets; i++)
            printf(", tau_tree(%lld) %.3f", (long long)acc.budgets[i], ddt_acceptance_tau_tree(&acc, i));
        if (acc.selector) {   /* DFlash2: the figures above are the path selector's */
            const ddt_acceptance unary = ddt_acceptance_unary(&acc);
            printf(" (path selector)\n  unary head    tau_chain %.3f", ddt_acceptance_tau_chain(&unary));
            for (int i = 0; i < unary.n_budgets; i++)
                printf(", tau_tree(%lld) %.3f", (long long)unary.budgets[i], ddt_acceptance_tau_tree(&unary, i));
        }
        printf("\n");
    }
    printf("  database      %s\n  checkpoints   %s/checkpoints\n", db, ddt_trainer_run_dir(t));
    if (finished && !rc)
        printf("  export        %s\n", export_dir);
    else if (end == DDT_RUN_PAUSED)
        printf("  resume with   ddtreed train --resume %s --run %s%s\n", state_dir, ddt_trainer_run_id(t),
               unreadable ? " (once the file named above is fixed: from its newest checkpoint)" : "");
    ddt_trainer_close(t);
    return rc ? 1 : 0;
}
