/* test_metrics.c: the /metrics text of ddt_metrics_render (daemon/server/metrics.c).
 *
 * A snapshot with two runs (one with an id that needs escaping), two devices, a step histogram
 * and response counts is rendered; the test looks for whole lines, the escaping, every run
 * state, the histogram (cumulative buckets, +Inf, _sum, _count) and the number formats. When
 * /usr/bin/python3 has prometheus_client (python3-prometheus-client), the text must also parse
 * there and give back the escaped label value; without it that case is reported as skipped.
 */
#include "check.h"
#include "metrics.h"

#include <unistd.h>

static const char weird_id[] = "a\"b\\c\nd";   /* a"b\c<newline>d */

static ddt_metrics_run test_runs[2];

static ddt_metrics_snapshot make_snapshot(void)
{
    ddt_metrics_snapshot m;
    memset(&m, 0, sizeof m);
    memset(test_runs, 0, sizeof test_runs);
    m.version = "0.1.0";
    for (int j = 0; j < DDT_RUN_STATE_COUNT; j++)
        m.runs_by_state[j] = j == 1 ? 2 : j == 4 ? 5 : 0;

    ddt_metrics_run *r = &test_runs[0];
    snprintf(r->id, sizeof r->id, "r1");
    r->step = 120;
    r->loss = 2.5;
    r->ce = 2.0;
    r->kl = 0.1;
    r->cap = 0.0;
    r->tokens_total = 491520;
    r->tokens_per_second = 1234.5;
    r->tau_chain = 1.75;
    r->n_budgets = 2;
    r->budgets[0] = 16;
    r->tau_tree[0] = 2.25;
    r->budgets[1] = 64;
    r->tau_tree[1] = 3.0;
    r->tau_spec = 1.5;   /* speculative decoding (SPEC.md 7) */
    r->n_spec_budgets = 2;
    r->spec_budgets[0] = 8;
    r->tau_spec_tree[0] = 2.0;
    r->spec_budgets[1] = 32;
    r->tau_spec_tree[1] = 2.5;
    r->oom_recoveries = 3;

    r = &test_runs[1];
    snprintf(r->id, sizeof r->id, "%s", weird_id);
    r->step = 0;
    r->loss = NAN;
    r->ce = INFINITY;
    r->kl = -INFINITY;
    r->cap = 1.0 / 3.0;
    r->tau_chain = -1;   /* not evaluated: no acceptance samples */
    r->n_budgets = 1;
    r->budgets[0] = 16;
    r->tau_tree[0] = -1;
    m.run_count = 2;
    m.runs = test_runs;

    m.device_count = 2;
    snprintf(m.device_names[0], sizeof m.device_names[0], "cpu:0");
    snprintf(m.device_names[1], sizeof m.device_names[1], "cuda:1");
    m.device_used_bytes[0] = 1000;
    m.device_peak_bytes[0] = 4096;
    m.device_used_bytes[1] = 0;
    m.device_peak_bytes[1] = 150000000000LL;   /* above 2^32: no narrowing on the way */

    /* 10 steps: 2 <= 0.005 s, 3 more <= 0.1 s, 4 more <= 1 s, 1 above 60 s */
    for (int b = 0; b <= DDT_METRICS_BUCKETS; b++) {
        double bound = b < DDT_METRICS_BUCKETS ? ddt_metrics_bucket_bounds[b] : INFINITY;
        m.step_buckets[b] = bound >= 60.5 ? 10 : bound >= 1.0 ? 9 : bound >= 0.1 ? 5 : bound >= 0.005 ? 2 : 0;
    }
    m.step_seconds_sum = 75.125;
    m.step_count = 10;

    m.code_count = 3;
    m.codes[0] = 200;
    m.code_counts[0] = 17;
    m.codes[1] = 404;
    m.code_counts[1] = 2;
    m.codes[2] = 413;
    m.code_counts[2] = 1;
    return m;
}

static char *rendered;
static size_t rendered_len;

/* whether line (without its newline) is a whole line of the text */
static int has_line(const char *line)
{
    size_t n = strlen(line);
    for (const char *p = rendered; (p = strstr(p, line)); p++)
        if ((p == rendered || p[-1] == '\n') && p[n] == '\n')
            return 1;
    return 0;
}

static void expect_line(const char *line)
{
    check(has_line(line), "missing line: %s", line);
}

/* ------------------------------------------------------------------------------------------ */

static void test_renders(void)
{
    ddt_metrics_snapshot m = make_snapshot();
    rendered = ddt_metrics_render(&m, &rendered_len);
    check(rendered != NULL, "render returned NULL");
    if (!rendered) {
        fprintf(stderr, "cannot go on without the text\n");
        exit(1);
    }
    check(strlen(rendered) == rendered_len, "len %zu, strlen %zu", rendered_len, strlen(rendered));
    check(rendered_len > 0 && rendered[rendered_len - 1] == '\n', "the text does not end in a newline");
}

static void test_help_and_type(void)
{
    const char *families[][2] = {
        {"ddtree_build_info", "gauge"},
        {"ddtree_runs", "gauge"},
        {"ddtree_run_step", "gauge"},
        {"ddtree_run_loss", "gauge"},
        {"ddtree_run_tokens_total", "counter"},
        {"ddtree_run_tokens_per_second", "gauge"},
        {"ddtree_run_acceptance_length", "gauge"},
        {"ddtree_device_memory_peak_bytes", "gauge"},
        {"ddtree_device_memory_used_bytes", "gauge"},
        {"ddtree_step_duration_seconds", "histogram"},
        {"ddtree_oom_recoveries_total", "counter"},
        {"ddtree_http_requests_total", "counter"},
    };
    for (size_t j = 0; j < sizeof families / sizeof families[0]; j++) {
        char line[160];
        snprintf(line, sizeof line, "# TYPE %s %s", families[j][0], families[j][1]);
        expect_line(line);
        snprintf(line, sizeof line, "# HELP %s ", families[j][0]);
        check(strstr(rendered, line) != NULL, "no HELP for %s", families[j][0]);
    }
}

static void test_samples(void)
{
    expect_line("ddtree_build_info{version=\"0.1.0\"} 1");
    expect_line("ddtree_run_step{run=\"r1\"} 120");
    expect_line("ddtree_run_loss{run=\"r1\",term=\"total\"} 2.5");
    expect_line("ddtree_run_loss{run=\"r1\",term=\"ce\"} 2");
    expect_line("ddtree_run_loss{run=\"r1\",term=\"kl\"} 0.1");
    expect_line("ddtree_run_loss{run=\"r1\",term=\"cap\"} 0");
    expect_line("ddtree_run_tokens_total{run=\"r1\"} 491520");
    expect_line("ddtree_run_tokens_per_second{run=\"r1\"} 1234.5");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"chain\"} 1.75");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"tree\",budget=\"16\"} 2.25");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"tree\",budget=\"64\"} 3");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"spec\"} 1.5");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"spec_tree\",budget=\"8\"} 2");
    expect_line("ddtree_run_acceptance_length{run=\"r1\",kind=\"spec_tree\",budget=\"32\"} 2.5");
    expect_line("ddtree_oom_recoveries_total{run=\"r1\"} 3");
    expect_line("ddtree_device_memory_used_bytes{device=\"cpu:0\"} 1000");
    expect_line("ddtree_device_memory_peak_bytes{device=\"cpu:0\"} 4096");
    expect_line("ddtree_device_memory_peak_bytes{device=\"cuda:1\"} 150000000000");
    expect_line("ddtree_device_memory_used_bytes{device=\"cuda:1\"} 0");
    expect_line("ddtree_http_requests_total{code=\"200\"} 17");
    expect_line("ddtree_http_requests_total{code=\"404\"} 2");
    expect_line("ddtree_http_requests_total{code=\"413\"} 1");
}

static void test_every_state(void)
{
    for (int j = 0; j < DDT_RUN_STATE_COUNT; j++) {
        char line[96];
        snprintf(line, sizeof line, "ddtree_runs{state=\"%s\"} %d", ddt_run_state_name(j),
                 j == 1 ? 2 : j == 4 ? 5 : 0);
        expect_line(line);
    }
    const char *want[DDT_RUN_STATE_COUNT] = {"queued", "running", "pausing", "paused",
                                        "completed", "failed", "cancelled", "interrupted"};
    for (int j = 0; j < DDT_RUN_STATE_COUNT; j++)
        check(!strcmp(ddt_run_state_name(j), want[j]), "state %d is %s, not %s", j,
              ddt_run_state_name(j), want[j]);
}

static void test_escaping_and_numbers(void)
{
    /* a"b\c<newline>d: a\"b\\c\nd between the quotes */
    expect_line("ddtree_run_step{run=\"a\\\"b\\\\c\\nd\"} 0");
    expect_line("ddtree_run_loss{run=\"a\\\"b\\\\c\\nd\",term=\"total\"} NaN");
    expect_line("ddtree_run_loss{run=\"a\\\"b\\\\c\\nd\",term=\"ce\"} +Inf");
    expect_line("ddtree_run_loss{run=\"a\\\"b\\\\c\\nd\",term=\"kl\"} -Inf");
    /* 1/3 needs 16 digits to read back as the same double */
    expect_line("ddtree_run_loss{run=\"a\\\"b\\\\c\\nd\",term=\"cap\"} 0.3333333333333333");
    check(strstr(rendered, "ddtree_run_acceptance_length{run=\"a\\\"b") == NULL,
          "a run never evaluated has acceptance samples (its zeroed tau_spec among them)");
    /* the raw newline of the id never reaches the text: every line is a comment or a sample */
    for (const char *line = rendered; *line;) {
        const char *end = strchr(line, '\n');
        check(line[0] == '#' || !strncmp(line, "ddtree_", 7), "a line that is no sample: %.40s", line);
        line = end ? end + 1 : line + strlen(line);
    }
}

static void test_histogram(void)
{
    const char *prefix = "ddtree_step_duration_seconds_bucket{le=\"";
    uint64_t previous = 0;
    int buckets = 0;
    const char *p = rendered;
    char last_le[32] = "";
    while ((p = strstr(p, prefix))) {
        p += strlen(prefix);
        const char *quote = strchr(p, '"');
        snprintf(last_le, sizeof last_le, "%.*s", (int)(quote - p), p);
        uint64_t count = strtoull(quote + 3, NULL, 10);   /* "} N */
        if (buckets < DDT_METRICS_BUCKETS) {
            double bound = strtod(last_le, NULL);
            check(bound == ddt_metrics_bucket_bounds[buckets], "bucket %d le=%s, bound %g",
                  buckets, last_le, ddt_metrics_bucket_bounds[buckets]);
        }
        check(count >= previous, "bucket le=%s has %llu < %llu: not cumulative", last_le,
              (unsigned long long)count, (unsigned long long)previous);
        previous = count;
        buckets++;
    }
    check(buckets == DDT_METRICS_BUCKETS + 1, "%d buckets, want %d", buckets, DDT_METRICS_BUCKETS + 1);
    check(!strcmp(last_le, "+Inf"), "the last bucket is le=\"%s\", not +Inf", last_le);
    expect_line("ddtree_step_duration_seconds_bucket{le=\"0.005\"} 2");
    expect_line("ddtree_step_duration_seconds_bucket{le=\"0.1\"} 5");
    expect_line("ddtree_step_duration_seconds_bucket{le=\"1\"} 9");
    expect_line("ddtree_step_duration_seconds_bucket{le=\"60\"} 9");
    expect_line("ddtree_step_duration_seconds_bucket{le=\"+Inf\"} 10");
    expect_line("ddtree_step_duration_seconds_sum 75.125");
    expect_line("ddtree_step_duration_seconds_count 10");
    for (int b = 1; b < DDT_METRICS_BUCKETS; b++)
        check(ddt_metrics_bucket_bounds[b] > ddt_metrics_bucket_bounds[b - 1],
              "bucket bounds not increasing at %d", b);
}

static void test_empty_snapshot(void)
{
    ddt_metrics_snapshot m;
    memset(&m, 0, sizeof m);
    size_t len = 0;
    char *text = ddt_metrics_render(&m, &len);
    check(text != NULL && len == strlen(text), "an empty snapshot does not render");
    if (!text)
        return;
    check(strstr(text, "ddtree_build_info{version=\"unknown\"} 1\n") != NULL, "no build_info");
    check(strstr(text, "ddtree_runs{state=\"interrupted\"} 0\n") != NULL, "a state at 0 left out");
    check(strstr(text, "# TYPE ddtree_run_step gauge\n") != NULL, "a family without samples left out");
    check(strstr(text, "ddtree_run_step{") == NULL, "a run sample without runs");
    check(strstr(text, "ddtree_step_duration_seconds_count 0\n") != NULL, "no _count");
    free(text);
}

/* ------------------------------------------------------------------------------------------
 * The reference parser
 */

static const char parser_script[] =
    "import sys\n"
    "from prometheus_client.parser import text_string_to_metric_families\n"
    "samples = [s for f in text_string_to_metric_families(open(sys.argv[1]).read()) for s in f.samples]\n"
    "steps = {s.labels['run']: s.value for s in samples if s.name == 'ddtree_run_step'}\n"
    "assert steps == {'r1': 120, 'a\"b\\\\c\\nd': 0}, steps\n"
    "inf = [s.value for s in samples if s.name == 'ddtree_step_duration_seconds_bucket' and s.labels['le'] == '+Inf']\n"
    "assert inf == [10], inf\n"
    "print('parsed', len(samples))\n";

static void test_prometheus_parser(void)
{
    if (system("/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1") != 0) {
        printf("skip prometheus_parser (python3 has no prometheus_client: "
               "apt-get install python3-prometheus-client)\n");
        return;
    }
    char dir[] = "/tmp/ddtree-metrics-XXXXXX";
    check(mkdtemp(dir) != NULL, "mkdtemp failed");
    char text_path[64], script_path[64], command[256];
    snprintf(text_path, sizeof text_path, "%s/metrics.txt", dir);
    snprintf(script_path, sizeof script_path, "%s/parse.py", dir);
    FILE *f = fopen(text_path, "w");
    FILE *g = fopen(script_path, "w");
    check(f && g, "cannot write into %s", dir);
    if (f) {
        fwrite(rendered, 1, rendered_len, f);
        fclose(f);
    }
    if (g) {
        fputs(parser_script, g);
        fclose(g);
    }
    snprintf(command, sizeof command, "/usr/bin/python3 %s %s 2>&1", script_path, text_path);
    FILE *p = popen(command, "r");
    check(p != NULL, "popen failed");
    char output[4096] = "";
    size_t n = p ? fread(output, 1, sizeof output - 1, p) : 0;
    output[n] = '\0';
    int status = p ? pclose(p) : -1;
    check(status == 0 && !strncmp(output, "parsed ", 7), "prometheus_client says: %s", output);
    unlink(text_path);
    unlink(script_path);
    rmdir(dir);
    case_done("prometheus_parser");
}

int main(void)
{
    const test_case cases[] = {
        {"renders", test_renders},
        {"help_and_type", test_help_and_type},
        {"samples", test_samples},
        {"every_state", test_every_state},
        {"escaping_and_numbers", test_escaping_and_numbers},
        {"histogram", test_histogram},
        {"empty_snapshot", test_empty_snapshot},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    case_failed = 0;
    test_prometheus_parser();
    free(rendered);
    return cases_summary();
}
