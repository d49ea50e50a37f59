/* ui.h: the web view's routes (docs/ui.md): GET /ui (the runs), /ui/runs/{id} (one run),
 * /ui/compare?runs=A,B (runs side by side), /ui/login (POST: the token, for the session
 * cookie), POST /ui/logout, GET /ui/assets/NAME (the embedded scripts, styles and uPlot). The
 * pages hold no user data: their scripts fetch it from the JSON API and write it as text.
 * Tested by tests/daemon/ui_browser_test.mjs.
 */
#ifndef DDT_UI_H
#define DDT_UI_H

#include "http.h"
#include "ui_access.h"
#include "ui_login_limit.h"

/* req->path is /ui or under it; verdict is ddt_ui_access_check's (ALLOWED or LOGIN) */
void ddt_ui_handle(const ddt_ui_access *access, ddt_ui_login_limit *limit, ddt_ui_verdict verdict,
                   const ddt_http_request *req,
                   ddt_http_response *res);

#endif
