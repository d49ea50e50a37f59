/* format.c: the daemon's JSON as text for people: type-checked getters, numbers (counts,
 * thousands, bytes in decimal units, durations, local times), tables of columns and the loss
 * sparkline; and percent-encoding, a run id or a query value as part of a URL. Every field is type-checked before use: a missing, null or mistyped one prints as
 * "-", so a daemon that adds fields, or sends null before a run's first step, never breaks the
 * client. It makes no request and knows no route.
 * Tested by tests/client/test_client.c (each formatter, a table, the sparkline) and through the
 * commands by tests/daemon/api_e2e.py.
 */
#include "ddtreectl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------------
 * JSON getters */

ddc_text ddc_textf(const char *fmt, ...)
{
    ddc_text t;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t.s, sizeof t.s, fmt, ap);
    va_end(ap);
    return t;
}

const cJSON *ddc_get(const cJSON *object, const char *key)
{
    return cJSON_IsObject(object) ? cJSON_GetObjectItemCaseSensitive(object, key) : NULL;
}

const cJSON *ddc_array(const cJSON *item)
{
    return cJSON_IsArray(item) ? item : NULL;
}

const cJSON *ddc_object(const cJSON *item)
{
    return cJSON_IsObject(item) ? item : NULL;
}

int ddc_number(const cJSON *item, double *value)
{
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return 0;
    *value = item->valuedouble;
    return 1;
}

const char *ddc_string(const cJSON *item)
{
    return cJSON_IsString(item) && item->valuestring ? item->valuestring : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Numbers */

static int ddc_is_integral(double v)
{
    return v > -9e15 && v < 9e15 && (double)(long long)v == v;
}

ddc_text ddc_fmt_value(const cJSON *item)
{
    double v;
    if (ddc_string(item))
        return ddc_textf("%s", item->valuestring);
    if (ddc_number(item, &v))
        return ddc_is_integral(v) ? ddc_textf("%.0f", v) : ddc_textf("%.6g", v);
    if (cJSON_IsBool(item))
        return ddc_textf("%s", cJSON_IsTrue(item) ? "true" : "false");
    if (cJSON_IsObject(item) || cJSON_IsArray(item)) {
        char *compact = cJSON_PrintUnformatted(item);
        ddc_text t = ddc_textf("%s", compact ? compact : "-");
        free(compact);
        return t;
    }
    return ddc_textf("-");
}

ddc_text ddc_fmt_real(const cJSON *item, int digits)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%.*g", digits, v) : ddc_textf("-");
}

/* keeping trailing zeros, for a line that is redrawn */
ddc_text ddc_fmt_fixed_width_real(const cJSON *item, int digits)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%#.*g", digits, v) : ddc_textf("-");
}

ddc_text ddc_fmt_count(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%.0f", v) : ddc_textf("-");
}

static ddc_text ddc_thousands_text(double v)
{
    if (v >= 1e15 || v <= -1e15)
        return ddc_textf("%.3g", v);
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v < 0 ? -v : v);
    ddc_text t;
    size_t n = strlen(digits), o = 0;
    if (v <= -0.5)
        t.s[o++] = '-';
    for (size_t k = 0; k < n; k++) {
        if (k && (n - k) % 3 == 0)
            t.s[o++] = ',';
        t.s[o++] = digits[k];
    }
    t.s[o] = '\0';
    return t;
}

ddc_text ddc_fmt_thousands(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_thousands_text(v) : ddc_textf("-");
}

/* as the planner prints them (1 MB = 1e6 bytes) */
static ddc_text ddc_bytes_text(double bytes)
{
    if (bytes < 1e3)
        return ddc_textf("%.0f B", bytes);
    if (bytes < 1e6)
        return ddc_textf("%.1f kB", bytes / 1e3);
    if (bytes < 1e9)
        return ddc_textf("%.1f MB", bytes / 1e6);
    return ddc_textf("%.2f GB", bytes / 1e9);
}

ddc_text ddc_fmt_bytes(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_bytes_text(v) : ddc_textf("-");
}

/* 70 -> "1m10s", 7384 -> "2h03m" */
ddc_text ddc_duration_text(double seconds)
{
    if (!isfinite(seconds) || seconds < 0)
        return ddc_textf("-");
    long long s = (long long)(seconds + 0.5);
    if (s < 60)
        return ddc_textf("%llds", s);
    if (s < 3600)
        return ddc_textf("%lldm%02llds", s / 60, s % 60);
    if (s < 86400)
        return ddc_textf("%lldh%02lldm", s / 3600, s / 60 % 60);
    return ddc_textf("%lldd%02lldh", s / 86400, s / 3600 % 24);
}

ddc_text ddc_fmt_time(const cJSON *item)
{
    double ms;
    if (!ddc_number(item, &ms) || ms <= 0)
        return ddc_textf("-");
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    ddc_text text;
    if (!localtime_r(&t, &tm) || !strftime(text.s, sizeof text.s, "%Y-%m-%d %H:%M:%S", &tm))
        return ddc_textf("%.0f", ms);
    return text;
}

ddc_text ddc_step_of_max(const cJSON *run)
{
    return ddc_textf("%s/%s", ddc_fmt_count(ddc_get(run, "step")).s, ddc_fmt_count(ddc_get(run, "max_steps")).s);
}

/* created_ms, or -1 when it has none */
static double ddc_created(const cJSON *run)
{
    double t;
    return ddc_number(ddc_get(run, "created_ms"), &t) ? t : -1;
}

int ddc_runs_newest_first(const cJSON *runs, const cJSON **order, int cap)
{
    int n = 0;
    const cJSON *run;
    cJSON_ArrayForEach(run, ddc_array(runs)) {
        if (n == cap)
            break;
        /* before every run created at the same time or earlier (one of the same time came before it) */
        double t = ddc_created(run);
        int k = n;
        while (k > 0 && ddc_created(order[k - 1]) <= t)
            k--;
        memmove(order + k + 1, order + k, (size_t)(n - k) * sizeof *order);
        order[k] = run;
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Tables: one column list says the header and the row, so that they cannot disagree */

void ddc_table_fit(ddc_column *columns, int count, const ddc_text *cells)
{
    for (int k = 0; k < count; k++) {
        if (!columns[k].fit)
            continue;
        int header = (int)strlen(columns[k].header), cell = (int)strlen(cells[k].s);
        columns[k].width = header > columns[k].width ? header : columns[k].width;
        columns[k].width = cell > columns[k].width ? cell : columns[k].width;
    }
}

/* cell k of a line: padded and followed by two spaces, or the last and the line's end */
static void ddc_table_cell(const ddc_column *columns, int count, int k, const char *text)
{
    if (k == count - 1)
        printf("%s\n", text);
    else
        printf(columns[k].left ? "%-*s  " : "%*s  ", columns[k].width, text);
}

void ddc_table_header(const ddc_column *columns, int count)
{
    for (int k = 0; k < count; k++)
        ddc_table_cell(columns, count, k, columns[k].header);
}

void ddc_table_row(const ddc_column *columns, int count, const ddc_text *cells)
{
    for (int k = 0; k < count; k++)
        ddc_table_cell(columns, count, k, cells[k].s);
}

/* ---------------------------------------------------------------------------------------------
 * Sparkline */

void ddc_sparkline(const double *values, int count, char *out, size_t out_len)
{
    static const char *const bars[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    double lo = INFINITY, hi = -INFINITY;
    for (int k = 0; k < count; k++) {
        if (isfinite(values[k])) {
            lo = values[k] < lo ? values[k] : lo;
            hi = values[k] > hi ? values[k] : hi;
        }
    }
    size_t used = 0;
    out[0] = '\0';
    for (int k = 0; k < count && used + 4 < out_len; k++) {
        const char *bar = " ";
        if (isfinite(values[k]))
            bar = hi > lo ? bars[(int)((values[k] - lo) / (hi - lo) * 7 + 0.5)] : bars[3];
        used += (size_t)snprintf(out + used, out_len - used, "%s", bar);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Percent-encoding: a run id or a query value as it goes into a URL */

int ddc_escape(const char *text, char *out, size_t out_len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                    *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (o + (plain ? 1 : 3) >= out_len)
            return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
    return 0;
}
