/* ui.c: the web view's routes (ui.h). A page is one of the embedded HTML files with its
 * {{csrf}} placeholder filled (hex digits of our own: nothing a user typed reaches a page) and
 * {{logout}} (" hidden" where no login is wanted);
 * the login page's {{message}} is one of two fixed sentences.
 * Not here: the access rules (ui_access.c), the pages' logic (the scripts in web/).
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
#include "ui.h"
#include "ui_assets.h"
#include "base/ddt_time.h"
#include "base/log.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char html_type[] = "text/html; charset=utf-8";

static const ddt_ui_asset *asset(const char *name)
{
    for (const ddt_ui_asset *a = ddt_ui_assets; a->name; a++)
        if (!strcmp(a->name, name))
            return a;
    return NULL;
}

/* html with every {{key}} replaced by value, as the body of res */
static void page(ddt_http_response *res, int status, const char *name, const char *keys[],
                 const char *values[], int count)
{
    const ddt_ui_asset *a = asset(name);
    if (!a) {
        ddt_http_error(res, 500, "internal", NULL, "the page %s is not embedded in this ddtreed: rebuild it", name);
        return;
    }
    size_t cap = a->len + 1;
    for (int k = 0; k < count; k++)
        cap += 8 * strlen(values[k]);   /* a page names each placeholder a few times at most */
    char *out = malloc(cap), *o = out;
    if (!out) {
        ddt_http_error(res, 500, "out_of_memory", NULL, "the page could not be built");
        return;
    }
    for (const char *p = (const char *)a->bytes; *p;) {
        int done = 0;
        for (int k = 0; k < count && !done && !strncmp(p, "{{", 2); k++) {
            size_t n = strlen(keys[k]);
            if (!strncmp(p + 2, keys[k], n) && !strncmp(p + 2 + n, "}}", 2) &&
                (size_t)(o - out) + strlen(values[k]) < cap) {
                o += sprintf(o, "%s", values[k]);
                p += n + 4;
                done = 1;
            }
        }
        if (!done && (size_t)(o - out) + 1 < cap)
            *o++ = *p++;
        else if (!done)
            break;
    }
    *o = '\0';
    free(res->body);
    res->status = status;
    res->body = out;
    res->body_len = (size_t)(o - out);
    res->content_type = html_type;
}

static void see_other(ddt_http_response *res, const char *where)
{
    res->status = 303;
    snprintf(res->location, sizeof res->location, "%s", where);
}

static void login_page(ddt_http_response *res, int status, const char *message)
{
    const char *keys[] = { "message" }, *values[] = { message };
    page(res, status, "login.html", keys, values, 1);
}

/* the value of key in an application/x-www-form-urlencoded body, decoded into out */
static int form_value(const char *body, const char *key, char *out, size_t out_len)
{
    size_t key_len = strlen(key);
    for (const char *p = body; *p;) {
        size_t len = strcspn(p, "&");
        if (len > key_len && !strncmp(p, key, key_len) && p[key_len] == '=') {
            size_t n = 0;
            for (const char *c = p + key_len + 1; c < p + len; c++) {
                int byte = *c == '+' ? ' ' : (unsigned char)*c;
                if (*c == '%' && isxdigit((unsigned char)c[1]) && isxdigit((unsigned char)c[2])) {
                    char hex[3] = { c[1], c[2], 0 };
                    byte = (int)strtol(hex, NULL, 16);
                    c += 2;
                }
                if (n + 1 >= out_len)
                    return 0;
                out[n++] = (char)byte;
            }
            out[n] = '\0';
            return 1;
        }
        p += len + (p[len] == '&');
    }
    return 0;
}

/* a try at the login: refused (429) while its address must wait (ui_login_limit.h), else the
 * token checked, a wrong one counted and logged */
static void login(const ddt_ui_access *access, ddt_ui_login_limit *limit, const ddt_http_request *req,
                  ddt_http_response *res)
{
    const char *client = req->client ? req->client : "local";
    int64_t now_ms = (int64_t)(ddt_mono_s() * 1000.0);
    int64_t wait_s = ddt_ui_login_wait(limit, client, now_ms);
    if (wait_s > 0) {
        login_page(res, 429, "Too many wrong tokens from this address: wait a little, then try again.");
        res->retry_after = wait_s;
        return;
    }
    char given[512];
    if (form_value(req->body, "token", given, sizeof given) && ddt_ui_access_login(access, given, res)) {
        ddt_ui_login_succeeded(limit, client);
        see_other(res, "/ui");
        return;
    }
    int failures = ddt_ui_login_failed(limit, client, now_ms);
    ddt_log(DDT_LOG_WARNING, "ui: wrong token at the login client=%s in_a_row=%d%s", client, failures,
            failures >= DDT_UI_LOGIN_FREE ? " hint=\"the next tries from this address wait (429)\"" : "");
    login_page(res, 401, "That is not the daemon's token (the token setting of its configuration).");
}

static void get_asset(const char *name, ddt_http_response *res)
{
    const ddt_ui_asset *a = asset(name);
    if (!a || strstr(a->content_type, "text/html")) {
        ddt_http_error(res, 404, "not_found", NULL, "no asset %s", name);
        return;
    }
    res->status = 200;
    res->body = malloc(a->len ? a->len : 1);
    if (!res->body) {
        ddt_http_error(res, 500, "out_of_memory", NULL, "the asset could not be sent");
        return;
    }
    memcpy(res->body, a->bytes, a->len);
    res->body_len = a->len;
    res->content_type = a->content_type;
}

static int is_get(const ddt_http_request *req, ddt_http_response *res)
{
    if (!strcmp(req->method, "GET"))
        return 1;
    ddt_http_error(res, 405, "method_not_allowed", NULL, "%s %s: use GET", req->method, req->path);
    snprintf(res->allow, sizeof res->allow, "GET");
    return 0;
}

void ddt_ui_handle(const ddt_ui_access *access, ddt_ui_login_limit *limit, ddt_ui_verdict verdict,
                   const ddt_http_request *req, ddt_http_response *res)
{
    const char *p = req->path;
    if (!strncmp(p, "/ui/assets/", 11)) {
        if (is_get(req, res))
            get_asset(p + 11, res);
        return;
    }
    if (!strcmp(p, "/ui/login")) {
        if (!strcmp(req->method, "POST"))
            login(access, limit, req, res);
        else if (is_get(req, res) && verdict == DDT_UI_ALLOWED)
            see_other(res, "/ui");   /* logged in, or a listener that wants no token */
        else if (verdict == DDT_UI_LOGIN)
            login_page(res, 200, "");
        return;
    }
    if (!strcmp(p, "/ui/logout")) {
        if (strcmp(req->method, "POST")) {
            ddt_http_error(res, 405, "method_not_allowed", NULL, "%s %s: use POST", req->method, p);
            snprintf(res->allow, sizeof res->allow, "POST");
            return;
        }
        ddt_ui_access_logout(res);
        see_other(res, "/ui/login");
        return;
    }
    const char *name = !strcmp(p, "/ui") || !strcmp(p, "/ui/") ? "runs.html"
                     : !strcmp(p, "/ui/compare") ? "compare.html"
                     : !strncmp(p, "/ui/runs/", 9) && p[9] && !strchr(p + 9, '/') ? "run.html" : NULL;
    if (!name) {
        ddt_http_error(res, 404, "not_found", NULL, "no such page: %s (the pages: /ui, /ui/runs/ID, "
                       "/ui/compare?runs=A,B)", p);
        return;
    }
    if (!is_get(req, res))
        return;
    if (verdict == DDT_UI_LOGIN) {
        see_other(res, "/ui/login");
        return;
    }
    if (!ddt_ui_uplot_embedded) {
        ddt_http_error(res, 503, "ui_not_installed", NULL, "this ddtreed was built without uPlot, the web "
                       "view's charting library: install it (source scripts/lib/common.sh and "
                       "scripts/lib/web.sh, then ddtree_web_install; scripts/test does both) and build again");
        return;
    }
    /* "Log out" only where there is a session to end: a listener that wants the token, reached
     * with the login's cookie (not the Unix socket, a loopback listener without a token, or a
     * tool's bearer header) */
    const char *keys[] = { "csrf", "logout" }, *values[] = { access->csrf, req->unauthenticated ? "" : " hidden" };
    page(res, 200, name, keys, values, 2);
}
