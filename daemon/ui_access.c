/* ui_access.c: the browser's access rules (ui_access.h), applied by ddt_api_handle before it
 * routes a request.
 *
 * Order: the Host of a loopback listener, the Origin, Sec-Fetch-Site of a state-changing
 * request, then who it is (the transport's bearer check, else the session cookie), then the
 * CSRF token of a state-changing request from a browser. Secrets are compared in constant time.
 * Sessions and CSRF tokens live as long as the daemon (a restart logs everyone out); there is
 * one of each, as there is one token.
 * Not here: the bearer token itself (server/http.c), TLS (a proxy in front of a public listener).
 * Tested by tests/daemon/ui_browser_test.mjs and tests/daemon/api_e2e.py.
 */
#include "ui_access.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#define SESSION_COOKIE "ddtree_session"

static int random_hex(char out[DDT_UI_SECRET_HEX + 1])
{
    unsigned char bytes[DDT_UI_SECRET_HEX / 2];
    if (getrandom(bytes, sizeof bytes, 0) != (ssize_t)sizeof bytes)
        return -errno;
    for (size_t j = 0; j < sizeof bytes; j++)
        snprintf(out + 2 * j, 3, "%02x", bytes[j]);
    return 0;
}

int ddt_ui_access_init(ddt_ui_access *a, const char *token, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    if (token && strlen(token) >= sizeof a->token) {
        snprintf(err, err_len, "the token is longer than %zu bytes: choose a shorter one", sizeof a->token - 1);
        return -EINVAL;
    }
    snprintf(a->token, sizeof a->token, "%s", token ? token : "");
    int rc = random_hex(a->session);
    if (!rc)
        rc = random_hex(a->csrf);
    if (rc)
        snprintf(err, err_len, "no random bytes for the web view's secrets (getrandom: %s)", strerror(-rc));
    return rc;
}

/* given == secret, in time that does not depend on where they differ; an empty secret never matches */
static int secret_equal(const char *given, size_t given_len, const char *secret)
{
    size_t secret_len = strlen(secret);
    volatile unsigned char diff = given_len != secret_len || secret_len == 0;
    for (size_t j = 0; j < secret_len; j++)
        diff |= (unsigned char)secret[j] ^ (unsigned char)(j < given_len ? given[j] : 0);
    return diff == 0;
}

/* the session cookie's value in a Cookie header ("a=1; ddtree_session=...; b=2") */
static int has_session(const ddt_ui_access *a, const char *cookie)
{
    size_t name_len = strlen(SESSION_COOKIE);
    for (const char *c = cookie; c && *c;) {
        while (*c == ' ' || *c == ';')
            c++;
        size_t len = strcspn(c, ";");
        if (len > name_len && !strncmp(c, SESSION_COOKIE "=", name_len + 1))
            return secret_equal(c + name_len + 1, len - name_len - 1, a->session);
        c += len;
    }
    return 0;
}

/* host without its port: "127.0.0.1:7460" -> 127.0.0.1, "[::1]:7460" -> [::1] */
static int loopback_host(const char *host)
{
    if (!host)
        return 0;
    size_t n = host[0] == '[' ? strcspn(host, "]") + 1 : strcspn(host, ":");
    if (host[0] == '[')
        return n == 5 && !strncmp(host, "[::1]", 5) && (!host[n] || host[n] == ':');
    if (n == 9 && !strncasecmp(host, "localhost", 9))
        return 1;
    unsigned b[4];
    char tail;
    char name[64];
    if (n >= sizeof name)
        return 0;
    memcpy(name, host, n);
    name[n] = '\0';
    return sscanf(name, "%u.%u.%u.%u%c", &b[0], &b[1], &b[2], &b[3], &tail) == 4 && b[0] == 127 &&
           b[1] < 256 && b[2] < 256 && b[3] < 256;
}

/* Origin is this daemon as the browser asked for it: http(s)://<Host> */
static int same_origin(const char *origin, const char *host)
{
    if (!host)
        return 0;
    const char *rest = !strncasecmp(origin, "http://", 7) ? origin + 7
                     : !strncasecmp(origin, "https://", 8) ? origin + 8 : NULL;
    return rest && !strcasecmp(rest, host);
}

static int is_ui_path(const char *path)
{
    return !strcmp(path, "/ui") || !strncmp(path, "/ui/", 4);
}

ddt_ui_verdict ddt_ui_access_check(const ddt_ui_access *a, const ddt_http_request *req,
                                   ddt_http_response *res)
{
    int changes = strcmp(req->method, "GET") && strcmp(req->method, "HEAD");
    int browser = req->origin || req->cookie || req->sec_fetch_site;
    if (req->via == DDT_HTTP_VIA_LOOPBACK && !loopback_host(req->host)) {
        ddt_http_error(res, 403, "forbidden_host", NULL, "this listener answers to a loopback host only "
                       "(localhost, 127.0.0.1 or [::1]), not '%s': open http://127.0.0.1:PORT/ui (through an SSH "
                       "port forward from elsewhere)", req->host ? req->host : "");
        return DDT_UI_REFUSED;
    }
    if ((req->origin && !same_origin(req->origin, req->host)) ||
        (changes && req->sec_fetch_site && strcmp(req->sec_fetch_site, "same-origin") &&
         strcmp(req->sec_fetch_site, "none"))) {
        ddt_http_error(res, 403, "cross_origin", NULL, "a request from another site (Origin %s) is refused: "
                       "use ddtreed's own pages at /ui", req->origin ? req->origin : "unknown");
        return DDT_UI_REFUSED;
    }
    if (req->unauthenticated && !has_session(a, req->cookie)) {
        if (is_ui_path(req->path))
            return DDT_UI_LOGIN;
        ddt_http_error(res, 401, "unauthorized", NULL, "this listener needs the header 'Authorization: Bearer "
                       "<token>' with the daemon's token, or a login at /ui/login");
        return DDT_UI_REFUSED;
    }
    if (changes && browser && !(req->csrf && secret_equal(req->csrf, strlen(req->csrf), a->csrf)) &&
        strcmp(req->path, "/ui/login")) {
        ddt_http_error(res, 403, "csrf", NULL, "a state-changing request from a browser needs the header "
                       "X-DDTree-CSRF of ddtreed's pages: reload the page and try again");
        return DDT_UI_REFUSED;
    }
    return DDT_UI_ALLOWED;
}

int ddt_ui_access_login(const ddt_ui_access *a, const char *given, ddt_http_response *res)
{
    if (!secret_equal(given, strlen(given), a->token))
        return 0;
    snprintf(res->set_cookie, sizeof res->set_cookie, SESSION_COOKIE "=%s; Path=/; HttpOnly; SameSite=Strict",
             a->session);
    return 1;
}

void ddt_ui_access_logout(ddt_http_response *res)
{
    snprintf(res->set_cookie, sizeof res->set_cookie, SESSION_COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
}
