/* api.h: the HTTP/JSON API of ddtreed (API.md, "Endpoints"): routing and every handler, as a
 * plain function of a request (ddt_http_handler), so the transport, the end-to-end tests and
 * the fuzz target all drive the same code. Handlers read snapshots and post requests to the
 * run manager; they never wait for a training step.
 * Tested by tests/daemon/api_e2e.py and fuzzed by tests/fuzz/fuzz_api.c.
 */
#ifndef DDT_API_H
#define DDT_API_H

#include "config.h"
#include "http.h"
#include "runs.h"
#include "ui_access.h"
#include "ui_login_limit.h"

typedef struct ddt_api {
    ddt_runs *runs;
    ddt_store *store;            /* for the health: whether it can write (ddt_store_get_health) */
    const ddt_daemon_config *config;
    char db_path[1100];
    double started_s;            /* monotonic time of the start, for uptime */
    ddt_http_server *http;       /* for the request counts of /metrics; may be NULL */
    ddt_ui_access access;        /* the browser's rules and the web view's secrets (ui_access.h) */
    ddt_ui_login_limit login_limit;   /* wrong tokens at the login, per address (ui_login_limit.h) */
} ddt_api;

void ddt_api_handle(void *api, const ddt_http_request *req, ddt_http_response *res);

#endif
