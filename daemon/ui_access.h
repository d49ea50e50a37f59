/* ui_access.h: who may use the API from a browser (docs/ui.md, "Access"): the checks every
 * request goes through before it is routed, the web view's login and its CSRF token.
 *
 * Tools (ddtreectl, curl: no Origin, Cookie or Sec-Fetch-* header) are left as the transport
 * authenticated them. A browser's request must come from the daemon's own pages: its Origin,
 * when sent, is the Host it asked (a page elsewhere cannot post here), on a loopback listener
 * the Host is a loopback name (a DNS-rebound name is refused), and a state-changing one carries
 * the pages' CSRF token in X-DDTree-CSRF. Where the listener wants the bearer token, a browser
 * logs in once with it (POST /ui/login) and gets an HttpOnly, SameSite=Strict session cookie.
 * Tested by tests/daemon/ui_browser_test.mjs (a real browser) and tests/daemon/api_e2e.py (the refusals).
 */
#ifndef DDT_UI_ACCESS_H
#define DDT_UI_ACCESS_H

#include "http.h"

#include <stddef.h>

enum { DDT_UI_SECRET_HEX = 64 };   /* 32 random bytes as hex */

typedef struct ddt_ui_access {
    char token[512];                       /* the daemon's bearer token; "" when none */
    char session[DDT_UI_SECRET_HEX + 1];   /* the login cookie's value, new at every start */
    char csrf[DDT_UI_SECRET_HEX + 1];      /* the pages' CSRF token, new at every start */
} ddt_ui_access;

/* New secrets from the kernel's random source. 0, or a negative errno with err. */
int ddt_ui_access_init(ddt_ui_access *a, const char *token, char *err, size_t err_len);

typedef enum ddt_ui_verdict {
    DDT_UI_ALLOWED,    /* route it */
    DDT_UI_LOGIN,      /* not logged in, a /ui path: only the login form or the login itself */
    DDT_UI_REFUSED,    /* res holds the 401 or 403 */
} ddt_ui_verdict;

ddt_ui_verdict ddt_ui_access_check(const ddt_ui_access *a, const ddt_http_request *req,
                                   ddt_http_response *res);

/* Whether given is the token; on success res->set_cookie holds the session cookie. */
int ddt_ui_access_login(const ddt_ui_access *a, const char *given, ddt_http_response *res);
/* res->set_cookie: the session cookie removed */
void ddt_ui_access_logout(ddt_http_response *res);

#endif
