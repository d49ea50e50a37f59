/* http.h: the HTTP transport of ddtreed (libmicrohttpd): the Unix control socket (mode 0660,
 * removed on stop) and an optional TCP listener, each served by libmicrohttpd's own thread.
 * Bodies are accumulated with a hard cap (413 beyond it) and the handler is called once the
 * whole body is in: it is a plain function of (request) -> (response), which is what the API
 * module implements and the fuzz target drives without a socket. Connection timeouts and
 * limits are always set. TCP on a non-loopback address requires a bearer token (compared in
 * constant time); a missing or wrong token is 401 before the handler runs, except for the web
 * view's requests (a path under /ui, or one carrying a Cookie), which reach the handler marked
 * `unauthenticated`: it answers them (a login form, its session cookie) or refuses them
 * (daemon/ui_access.h). The browser's headers that the handler needs to tell a page of its own
 * from another site's (Host, Origin, Cookie, Sec-Fetch-Site, X-DDTree-CSRF) come with the
 * request; an HTML answer carries a Content-Security-Policy and is never framed or cached.
 * Tested by tests/daemon/api_e2e.py (the real daemon and client) and tests/daemon/server/test_http.c.
 */
#ifndef DDT_HTTP_H
#define DDT_HTTP_H

#include <stddef.h>
#include <stdint.h>

enum { DDT_HTTP_MAX_QUERY = 8, DDT_HTTP_MAX_BODY = 1 << 20 };

/* the listener a request came through */
typedef enum ddt_http_via {
    DDT_HTTP_VIA_UNIX = 0,   /* the control socket (its file mode guards it) */
    DDT_HTTP_VIA_LOOPBACK,   /* TCP on a loopback address */
    DDT_HTTP_VIA_TCP,        /* TCP on any other address */
} ddt_http_via;

typedef struct ddt_http_request {
    const char *method;                          /* "GET", "POST", ... */
    const char *path;                            /* "/runs/ID/pause", without the query */
    int query_count;
    const char *query_keys[DDT_HTTP_MAX_QUERY];  /* ?key=value pairs, URL-decoded */
    const char *query_values[DDT_HTTP_MAX_QUERY];
    const char *body;                            /* NUL-terminated copy, body_len bytes */
    size_t body_len;
    ddt_http_via via;
    int unauthenticated;     /* the listener wants the token and the request has none that matches */
    const char *host, *origin, *cookie, *sec_fetch_site, *csrf;   /* headers; NULL when absent */
    const char *client;      /* the peer's address ("127.0.0.1", "::1"); "local" on the Unix socket */
} ddt_http_request;

typedef struct ddt_http_response {
    int status;
    char *body;                 /* malloc'd (the transport frees it), or NULL */
    size_t body_len;
    const char *content_type;   /* a static string; NULL: application/json */
    char location[256];         /* a Location header when not empty */
    char allow[64];             /* an Allow header (405) when not empty */
    char set_cookie[192];       /* a Set-Cookie header when not empty */
    int64_t retry_after;        /* a Retry-After header (seconds) when > 0 (429, 503) */
} ddt_http_response;

typedef void (*ddt_http_handler)(void *ctx, const ddt_http_request *req, ddt_http_response *res);

typedef struct ddt_http_config {
    const char *socket_path;    /* the control socket; NULL: none */
    const char *listen;         /* "HOST:PORT" for TCP; NULL or "": none */
    const char *token;          /* bearer token; required when listen is not a loopback address */
    unsigned max_connections;   /* per listener */
    unsigned timeout_s;         /* idle connections are closed after this */
    unsigned max_per_address;   /* TCP: connections from one client address at once */
    unsigned request_timeout_s; /* a request's whole time (headers and body); then its connection
                                   is closed, however slowly its bytes trickle in */
} ddt_http_config;

typedef struct ddt_http_server ddt_http_server;

/* Starts the listeners. 0, or a negative errno with err saying what to do (e.g. the socket's
 * directory missing, the port taken, a public address without a token). */
int ddt_http_start(const ddt_http_config *c, ddt_http_handler handler, void *ctx,
                   ddt_http_server **out, char *err, size_t err_len);
/* Stops accepting, finishes the requests in flight, removes the Unix socket. */
void ddt_http_stop(ddt_http_server *s);

/* Requests answered so far by status code: fills up to max (code, count) pairs, returns how many. */
int ddt_http_counts(ddt_http_server *s, int *codes, uint64_t *counts, int max);

/* Helpers for handlers: a JSON body (takes ownership of text), and the API's error body
 * {"error": {"code", "message", "field"?}}. */
void ddt_http_json(ddt_http_response *res, int status, char *text);
void ddt_http_error(ddt_http_response *res, int status, const char *code, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* the value of query key, or NULL */
const char *ddt_http_query(const ddt_http_request *req, const char *key);

#endif
