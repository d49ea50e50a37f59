/* watch.c: `ddtreectl watch ID`: one progress line (step/steps, loss, tok/s, peak memory, ETA),
 * redrawn on a terminal with a sparkline of the last losses, a line per poll in which the step or
 * the state changed otherwise, until the run ends. It polls GET /runs/ID and, when the step moved,
 * GET /runs/ID/steps for the newest records (the sparkline and the ETA). Exit status: 0 at
 * `completed`, 1 at `failed` or `cancelled`, 128+signal on SIGINT/SIGTERM (the line closed first),
 * or the failed request's (api_client.c). A signal only sets a flag; the loop acts on it.
 * Tested by tests/daemon/api_e2e.py (a run watched to completion) and by hand: the terminal mode
 * through `script -q -c "ddtreectl watch ID"`, a run that fails, one killed mid-watch
 * (client/README.md).
 */
#include "ddtreectl.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * The newest records and the progress line */

enum { DDC_SPARK_LEN = 40 };

/* the newest step records, oldest first: their losses draw the sparkline, their times the ETA */
typedef struct ddc_history {
    int count;
    long long last_step; /* the newest step taken in; -1 before any */
    long long step[DDC_SPARK_LEN];
    double loss[DDC_SPARK_LEN];  /* NAN when the record had none */
    double ts_ms[DDC_SPARK_LEN]; /* NAN when the record had none */
} ddc_history;

static volatile sig_atomic_t ddc_interrupted;

static void ddc_on_signal(int signo)
{
    ddc_interrupted = signo;
}

static void ddc_history_push(ddc_history *h, long long step, double loss, double ts_ms)
{
    if (h->count == DDC_SPARK_LEN) {
        memmove(h->step, h->step + 1, (DDC_SPARK_LEN - 1) * sizeof h->step[0]);
        memmove(h->loss, h->loss + 1, (DDC_SPARK_LEN - 1) * sizeof h->loss[0]);
        memmove(h->ts_ms, h->ts_ms + 1, (DDC_SPARK_LEN - 1) * sizeof h->ts_ms[0]);
        h->count--;
    }
    h->step[h->count] = step;
    h->loss[h->count] = loss;
    h->ts_ms[h->count] = ts_ms;
    h->count++;
    h->last_step = step;
}

/* Takes in the step records after the newest one held, at most the last DDC_SPARK_LEN up to
 * run_step (a watcher that starts late, or falls behind, needs no more). */
static int ddc_history_update(ddc_ctx *ctx, const char *id, long long run_step, ddc_history *h)
{
    long long after = run_step - DDC_SPARK_LEN;
    if (h->last_step > after)
        after = h->last_step;
    char suffix[96], path[DDC_PATH_MAX];
    if (after >= 0)
        snprintf(suffix, sizeof suffix, "/steps?after=%lld&limit=%d", after, DDC_SPARK_LEN);
    else
        snprintf(suffix, sizeof suffix, "/steps?limit=%d", DDC_SPARK_LEN);
    cJSON *root;
    int rc = ddc_run_path(id, suffix, path);
    if (rc || (rc = ddc_get_object(ctx, path, &root)))
        return rc;
    const cJSON *record;
    cJSON_ArrayForEach(record, ddc_array(ddc_get(root, "steps"))) {
        double step, loss = NAN, ts_ms = NAN;
        if (!ddc_number(ddc_get(record, "step"), &step) || (long long)step <= h->last_step)
            continue; /* a daemon whose "after" is inclusive repeats the last one */
        ddc_number(ddc_get(record, "loss"), &loss);
        ddc_number(ddc_get(record, "ts_ms"), &ts_ms);
        ddc_history_push(h, (long long)step, loss, ts_ms);
    }
    cJSON_Delete(root);
    return 0;
}

/* the last `width` losses of the history as a sparkline */
static void ddc_history_sparkline(const ddc_history *h, int width, char *out, size_t out_len)
{
    int shown = width < 0 ? 0 : width < h->count ? width : h->count; /* a narrow terminal: none */
    ddc_sparkline(h->loss + h->count - shown, shown, out, out_len);
}

/* seconds to the last step from the pace of the recent records, else of the run so far */
static double ddc_eta_s(const ddc_history *h, const cJSON *run, double step, double max_steps)
{
    if (step >= max_steps)
        return 0;
    double ms_per_step = -1;
    int oldest = -1, newest = -1;
    for (int k = 0; k < h->count; k++) {
        if (isfinite(h->ts_ms[k])) {
            oldest = oldest < 0 ? k : oldest;
            newest = k;
        }
    }
    if (oldest >= 0 && h->step[newest] > h->step[oldest] && h->ts_ms[newest] > h->ts_ms[oldest]) {
        ms_per_step = (h->ts_ms[newest] - h->ts_ms[oldest]) / (double)(h->step[newest] - h->step[oldest]);
    } else {
        double started, updated;
        if (step > 0 && ddc_number(ddc_get(run, "started_ms"), &started) &&
            ddc_number(ddc_get(run, "updated_ms"), &updated) && updated > started)
            ms_per_step = (updated - started) / step;
    }
    return ms_per_step > 0 ? (max_steps - step) * ms_per_step / 1000 : -1;
}

/* "step 120/1500  loss 5.12  12,345 tok/s  peak 10.1 MB  ETA 1m10s" (+ "  tau_spec 3.12" once a
 * speculative evaluation was made, + the state when it is not running) */
static void ddc_progress_text(const cJSON *run, const ddc_history *h, char *out, size_t out_len)
{
    const char *state = ddc_string(ddc_get(run, "state"));
    double step = -1, max_steps = -1, eta = -1;
    if (state && !strcmp(state, "running") && ddc_number(ddc_get(run, "step"), &step) &&
        ddc_number(ddc_get(run, "max_steps"), &max_steps))
        eta = ddc_eta_s(h, run, step, max_steps);
    const cJSON *peak = ddc_get(run, "peak_memory_bytes");
    int n = snprintf(out, out_len, "step %s  loss %s  %s tok/s  peak %s  ETA %s", ddc_step_of_max(run).s,
                     ddc_fmt_fixed_width_real(ddc_get(run, "loss"), 3).s, ddc_fmt_thousands(ddc_get(run, "tokens_per_s")).s,
                     ddc_fmt_bytes(cJSON_IsNumber(peak) ? peak : ddc_get(peak, "max")).s, ddc_duration_text(eta).s);
    const cJSON *tau_spec = ddc_get(run, "tau_spec");   /* eval.speculative's, once there is one */
    if (cJSON_IsNumber(tau_spec) && n > 0 && (size_t)n < out_len)
        n += snprintf(out + n, out_len - (size_t)n, "  tau_spec %s", ddc_fmt_real(tau_spec, 3).s);
    if ((!state || strcmp(state, "running")) && n > 0 && (size_t)n < out_len)
        snprintf(out + n, out_len - (size_t)n, "  [%s]", state ? state : "-");
}

static int ddc_terminal_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* sleeps, waking early when a signal came */
static void ddc_sleep(double seconds)
{
    struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (!ddc_interrupted && nanosleep(&left, &left) == -1 && errno == EINTR)
        ;
}

/* ---------------------------------------------------------------------------------------------
 * The loop */

int ddc_cmd_watch(ddc_ctx *ctx, const ddc_args *args)
{
    double interval = args->option[DDC_WATCH_INTERVAL].seconds;
    const char *id = args->operand;
    char run_path[DDC_PATH_MAX];
    int rc = ddc_run_path(id, "", run_path);
    if (rc)
        return rc;

    /* a signal only sets a flag: the loop ends the progress line and returns */
    struct sigaction action = {.sa_handler = ddc_on_signal};
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);

    int tty = !ctx->json && isatty(STDOUT_FILENO);
    ddc_history history = {.last_step = -1};
    double shown_step = -2;
    char shown_state[64] = "";
    for (;;) {
        cJSON *run;
        if ((rc = ddc_get_object(ctx, run_path, &run)))
            return rc;
        const char *state = ddc_string(ddc_get(run, "state"));
        double step = -1;
        ddc_number(ddc_get(run, "step"), &step);
        if (!ctx->json && step >= 0 && (long long)step > history.last_step &&
            (rc = ddc_history_update(ctx, id, (long long)step, &history))) {
            cJSON_Delete(run);
            return rc;
        }
        int changed = step != shown_step || strcmp(state ? state : "-", shown_state);
        shown_step = step;
        snprintf(shown_state, sizeof shown_state, "%s", state ? state : "-");

        if (ctx->json) {
            if (changed) { /* one compact line per change, for scripts that follow a run */
                char *line = cJSON_PrintUnformatted(run);
                if (line)
                    puts(line);
                free(line);
            }
        } else {
            char line[512], spark[DDC_SPARK_LEN * 4 + 1];
            ddc_progress_text(run, &history, line, sizeof line);
            if (tty) {
                /* one line that never wraps: the text first, the sparkline in what is left */
                int width = ddc_terminal_width() - 1, text_len = (int)strlen(line);
                if (text_len > width)
                    line[text_len = width] = '\0';
                int room = width - text_len - 2;
                ddc_history_sparkline(&history, room < DDC_SPARK_LEN ? room : DDC_SPARK_LEN, spark, sizeof spark);
                printf("\r\033[K%s%s%s", line, spark[0] ? "  " : "", spark);
                ctx->line_open = 1;
            } else if (changed) {
                puts(line);
            }
        }
        fflush(stdout);

        if (state && !strcmp(state, "completed")) {
            ddc_end_line(ctx);
            if (!ctx->json)
                printf("run %s completed: step %s, loss %s\n", id, ddc_step_of_max(run).s,
                       ddc_fmt_real(ddc_get(run, "loss"), 4).s);
            cJSON_Delete(run);
            return 0;
        }
        if (state && (!strcmp(state, "failed") || !strcmp(state, "cancelled"))) {
            ddc_end_line(ctx);
            fflush(stdout);
            const char *error = ddc_string(ddc_get(run, "error"));
            fprintf(stderr, "ddtreectl: run %s %s%s%s\n", id, state, error && *error ? ": " : "",
                    error && *error ? error : "");
            cJSON_Delete(run);
            return 1;
        }
        cJSON_Delete(run);
        ddc_sleep(interval);
        if (ddc_interrupted) {
            ddc_end_line(ctx);
            return 128 + (int)ddc_interrupted;
        }
    }
}
