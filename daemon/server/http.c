/* http.c: the HTTP transport of ddtreed on libmicrohttpd (MHD), see http.h.
 *
 * Two listeners, each an MHD daemon with its own internal polling thread (epoll where the
 * system has it, MHD_USE_AUTO): the Unix control socket, which we create ourselves (socket,
 * bind, chmod 0660, listen: nothing can connect before the mode is set) and hand to MHD with
 * MHD_OPTION_LISTEN_SOCKET, and the optional TCP listener, which MHD binds itself. A socket
 * file already at the path is probed first: a live daemon answering there refuses the start,
 * a stale file (nobody listening) is removed, anything that is not a socket is left alone and
 * refuses the start. Only the socket file we bound is removed on stop (its inode is checked),
 * so a failed second daemon never removes the first one's socket.
 *
 * A request goes through the access handler in MHD's three steps: the first call allocates the
 * per-connection state (and decides whether a TCP request carries the bearer token), the upload
 * calls append to a body buffer capped at DDT_HTTP_MAX_BODY (beyond it the buffer is dropped and
 * the rest discarded), and only the last call, with the whole body in, queues the response:
 * 401 or 413 from here, otherwise whatever the handler says. The handler is called from MHD's
 * threads, one per listener, so it may run on two threads at once.
 *
 * The token is needed on TCP whenever one is configured (compared in constant time); the Unix
 * socket needs none, its file mode guards it. A TCP request without it that belongs to the web
 * view (a path under /ui, or a Cookie) goes to the handler marked unauthenticated, body and all
 * (the login form's token is in it); any other is 401 here. Responses are counted per status code (atomics)
 * for /metrics. MHD's own messages become single log lines "<4>http: libmicrohttpd: ...".
 *
 * Slow and abusive clients: a TCP listener takes at most max_per_address connections from one
 * address (MHD closes the rest at once), and every connection's request must be in whole,
 * headers and body, within request_timeout_s of its start (or of its previous answer on a
 * kept-alive connection): a sweeper thread shuts down the ones that are not (MHD's own timeout
 * counts only idleness, which a header line every few seconds resets).
 *
 * Not here: routing and JSON bodies of the API (the API module's handler), TLS (put a proxy in
 * front of a public listener).
 *
 * Tested by tests/daemon/server/test_http.c (libcurl over the Unix socket and TCP) and tests/daemon/api_e2e.py.
 */
#include "http.h"
#include "base/ddt_time.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum {
    DEFAULT_MAX_CONNECTIONS = 256,
    DEFAULT_MAX_PER_ADDRESS = 16,
    DEFAULT_TIMEOUT_S = 30,
    DEFAULT_REQUEST_TIMEOUT_S = 30,
    CONNECTION_MEMORY_LIMIT = 64 * 1024,  /* per connection: headers + read buffer (MHD: 32 KiB) */
    FIRST_BODY_CAPACITY = 4096,
    STOP_DRAIN_MS = 2000,                 /* stop waits this long for requests being answered */
    STATUS_MIN = 100, STATUS_MAX = 599,
};

static const char json_type[] = "application/json";

/* ------------------------------------------------------------------------------------------
 * The server
 */

/* A connection's clock for the whole-request deadline: since when it has been taking in its
 * current request (accepted, or its last response sent), or paused (< 0) while its complete
 * request is answered. fd is our own dup of its socket: the sweeper shuts down that socket and
 * never another one that reused MHD's descriptor number. */
typedef struct conn_clock {
    int fd;
    double since_s;
    int closed;                          /* shut down by the sweeper */
    char client[INET6_ADDRSTRLEN];
    struct conn_clock *prev, *next;
} conn_clock;

typedef struct listener {
    struct ddt_http_server *server;
    struct MHD_Daemon *daemon;
    int is_tcp;
    int loopback;      /* TCP on a loopback address */
    int quiesced_fd;   /* the listen socket MHD_quiesce_daemon handed back, closed after stop */
} listener;

struct ddt_http_server {
    ddt_http_handler handler;
    void *ctx;
    char *token;       /* NULL: TCP open to whoever can reach it (a loopback address) */
    char *socket_path; /* the socket file we bound, removed on stop */
    dev_t socket_dev;
    ino_t socket_ino;
    listener unix_listener, tcp_listener;
    atomic_uint_fast64_t counts[STATUS_MAX - STATUS_MIN + 1];
    pthread_mutex_t log_lock;
    char last_log[256];  /* MHD's latest message: a failed start quotes it */

    /* the whole-request deadline: every open connection's clock, and the sweeper that closes the
     * connections whose request is not in after request_timeout_s */
    pthread_mutex_t clock_lock;
    pthread_cond_t clock_wake;
    conn_clock *clocks;
    double request_timeout_s;
    pthread_t sweeper;
    int sweeper_started, stopping;
};

/* MHD's messages, as single log lines; the latest is kept for the error of a failed start */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    ddt_http_server *s = cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    for (char *c = line; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    size_t n = strlen(line);
    while (n && line[n - 1] == ' ')
        line[--n] = '\0';
    ddt_log(DDT_LOG_WARNING, "http: libmicrohttpd: %s", line);
    pthread_mutex_lock(&s->log_lock);
    snprintf(s->last_log, sizeof s->last_log, "%s", line);
    pthread_mutex_unlock(&s->log_lock);
}

static void count_status(ddt_http_server *s, int status)
{
    if (status >= STATUS_MIN && status <= STATUS_MAX)
        atomic_fetch_add_explicit(&s->counts[status - STATUS_MIN], 1, memory_order_relaxed);
}

int ddt_http_counts(ddt_http_server *s, int *codes, uint64_t *counts, int max)
{
    int n = 0;
    for (int status = STATUS_MIN; status <= STATUS_MAX && n < max; status++) {
        uint64_t c = atomic_load_explicit(&s->counts[status - STATUS_MIN], memory_order_relaxed);
        if (c) {
            codes[n] = status;
            counts[n] = c;
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------------------------------------
 * Handler helpers
 */

void ddt_http_json(ddt_http_response *res, int status, char *text)
{
    if (!text) {   /* cJSON_Print* ran out of memory: not the success the handler meant */
        ddt_http_error(res, 500, "out_of_memory", NULL, "the response could not be built");
        return;
    }
    free(res->body);
    res->status = status;
    res->body = text;
    res->body_len = strlen(text);
    res->content_type = NULL;
}

void ddt_http_error(ddt_http_response *res, int status, const char *code, const char *field,
                    const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    char *message = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (message) {
        va_start(args, fmt);
        vsnprintf(message, n > 0 ? (size_t)n + 1 : 1, fmt, args);
        va_end(args);
    }
    char *text = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *error = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    if (error && cJSON_AddStringToObject(error, "code", code) &&
        cJSON_AddStringToObject(error, "message", message ? message : code) &&
        (!field || cJSON_AddStringToObject(error, "field", field)))
        text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    free(message);
    free(res->body);
    res->status = status;
    res->body = text;   /* NULL (out of memory): the status alone */
    res->body_len = text ? strlen(text) : 0;
    res->content_type = NULL;
}

const char *ddt_http_query(const ddt_http_request *req, const char *key)
{
    for (int j = 0; j < req->query_count; j++)
        if (!strcmp(req->query_keys[j], key))
            return req->query_values[j];
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Requests
 */

typedef struct request_state {
    char *body;        /* the upload so far, NUL-terminated; NULL once too large */
    size_t len, capacity;
    int too_large;     /* the rest of the upload is discarded, the answer is 413 */
    int unauthorized;  /* TCP without the right token: the upload is discarded, 401 */
    int unauthenticated;   /* ... but the web view's: the handler decides */
} request_state;

/* a == b over b's length in time that does not depend on where they differ */
static int token_equal(const char *given, const char *token)
{
    size_t given_len = strlen(given), token_len = strlen(token);
    volatile unsigned char diff = given_len != token_len;
    for (size_t j = 0; j < token_len; j++)
        diff |= (unsigned char)token[j] ^ (unsigned char)(j < given_len ? given[j] : 0);
    return diff == 0;
}

static int authorized(const ddt_http_server *s, struct MHD_Connection *conn)
{
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h)
        return 0;
    while (*h == ' ')
        h++;
    if (strncasecmp(h, "Bearer", 6) || (h[6] != ' ' && h[6] != '\t'))
        return 0;
    h += 7;
    while (*h == ' ' || *h == '\t')
        h++;
    char given[512];
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    if (n >= sizeof given)
        return 0;
    memcpy(given, h, n);
    given[n] = '\0';
    return token_equal(given, s->token);
}

static void append_body(request_state *st, const char *data, size_t n)
{
    if (st->too_large || st->unauthorized)
        return;
    if (st->len + n > DDT_HTTP_MAX_BODY) {
        st->too_large = 1;
        free(st->body);
        st->body = NULL;
        st->len = st->capacity = 0;
        return;
    }
    if (st->len + n + 1 > st->capacity) {
        size_t capacity = st->capacity ? st->capacity : FIRST_BODY_CAPACITY;
        while (capacity < st->len + n + 1)
            capacity *= 2;
        if (capacity > (size_t)DDT_HTTP_MAX_BODY + 1)
            capacity = (size_t)DDT_HTTP_MAX_BODY + 1;
        char *grown = realloc(st->body, capacity);
        if (!grown) {   /* answered as too large: the server cannot hold it either */
            st->too_large = 1;
            free(st->body);
            st->body = NULL;
            st->len = st->capacity = 0;
            return;
        }
        st->body = grown;
        st->capacity = capacity;
    }
    memcpy(st->body + st->len, data, n);
    st->len += n;
    st->body[st->len] = '\0';
}

typedef struct query_fill {
    ddt_http_request *req;
    int overflow;
} query_fill;

static enum MHD_Result add_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    query_fill *q = cls;
    if (q->req->query_count == DDT_HTTP_MAX_QUERY) {
        q->overflow = 1;
        return MHD_NO;
    }
    q->req->query_keys[q->req->query_count] = key;
    q->req->query_values[q->req->query_count] = value ? value : "";   /* "?flag" */
    q->req->query_count++;
    return MHD_YES;
}

/* an HTML page's: its scripts and styles from the daemon only, never framed (clickjacking),
 * never cached (it holds the CSRF token), no Referer to elsewhere (same-origin: "no-referrer"
 * would make the browser send "Origin: null", refused) */
static int add_page_headers(struct MHD_Response *r)
{
    return MHD_add_response_header(r, "Content-Security-Policy",
                                   "default-src 'none'; script-src 'self'; style-src 'self'; "
                                   "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                                   "base-uri 'none'; frame-ancestors 'none'") == MHD_YES &&
           MHD_add_response_header(r, "X-Frame-Options", "DENY") == MHD_YES &&
           MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store") == MHD_YES &&
           MHD_add_response_header(r, "Referrer-Policy", "same-origin") == MHD_YES;
}

/* queues res (its body is handed to MHD, or freed), counts its status */
static enum MHD_Result send_response(ddt_http_server *s, struct MHD_Connection *conn,
                                     ddt_http_response *res, int close_after)
{
    struct MHD_Response *r;
    if (res->body && res->body_len) {
        r = MHD_create_response_from_buffer(res->body_len, res->body, MHD_RESPMEM_MUST_FREE);
        if (!r)
            free(res->body);   /* MHD takes the buffer only with the response */
    } else {
        free(res->body);
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    res->body = NULL;
    if (!r)
        return MHD_NO;   /* out of memory: MHD closes the connection */
    int ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                     res->content_type ? res->content_type : json_type) == MHD_YES;
    if (ok && res->location[0])
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, res->location) == MHD_YES;
    if (ok && res->allow[0])
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, res->allow) == MHD_YES;
    if (ok && res->set_cookie[0])
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_SET_COOKIE, res->set_cookie) == MHD_YES;
    if (ok && res->retry_after > 0) {
        char seconds[24];
        snprintf(seconds, sizeof seconds, "%lld", (long long)res->retry_after);
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, seconds) == MHD_YES;
    }
    if (ok)
        ok = MHD_add_response_header(r, "X-Content-Type-Options", "nosniff") == MHD_YES;
    if (ok && res->content_type && !strncmp(res->content_type, "text/html", 9))
        ok = add_page_headers(r);
    if (ok && res->status == 401)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer") == MHD_YES;
    if (ok && close_after)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close") == MHD_YES;
    enum MHD_Result queued = ok ? MHD_queue_response(conn, (unsigned)res->status, r) : MHD_NO;
    MHD_destroy_response(r);
    if (queued == MHD_YES)
        count_status(s, res->status);
    return queued;
}

/* ------------------------------------------------------------------------------------------
 * The whole-request deadline
 */

/* conn's clock set to since (< 0: paused) */
static void clock_set(ddt_http_server *s, struct MHD_Connection *conn, double since)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_clock *c = info ? info->socket_context : NULL;
    if (!c)
        return;
    pthread_mutex_lock(&s->clock_lock);
    c->since_s = since;
    pthread_mutex_unlock(&s->clock_lock);
}

/* The sweeper: once a second, the connections whose request has taken longer than
 * request_timeout_s are shut down (MHD then sees them end and closes them). */
static void *sweep(void *arg)
{
    ddt_http_server *s = arg;
    pthread_mutex_lock(&s->clock_lock);
    while (!s->stopping) {
        double now = ddt_mono_s();
        for (conn_clock *c = s->clocks; c; c = c->next)
            if (!c->closed && c->since_s >= 0 && now - c->since_s > s->request_timeout_s) {
                shutdown(c->fd, SHUT_RDWR);
                c->closed = 1;
                ddt_log(DDT_LOG_WARNING, "http: a request was not in after %.0f s, its connection closed client=%s "
                        "hint=\"a client that sends its request this slowly is stalled or abusive\"",
                        s->request_timeout_s, c->client);
            }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&s->clock_wake, &s->clock_lock, &until);
    }
    pthread_mutex_unlock(&s->clock_lock);
    return NULL;
}

/* the peer's address as text into out (left as it is on the Unix socket, or when unknown) */
static void peer_address(struct MHD_Connection *conn, int is_tcp, char *out, socklen_t len)
{
    const union MHD_ConnectionInfo *info = is_tcp ? MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS)
                                                  : NULL;
    const struct sockaddr *sa = info ? info->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out, len);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out, len);
}

/* MHD_OPTION_NOTIFY_CONNECTION: a clock for each connection from its start to its end */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    listener *l = cls;
    ddt_http_server *s = l->server;
    conn_clock *c = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = info ? calloc(1, sizeof *c) : NULL;
        if (!c)
            return;   /* out of memory: this connection has no deadline but its idle timeout */
        c->fd = fcntl(info->connect_fd, F_DUPFD_CLOEXEC, 0);
        if (c->fd < 0) {
            free(c);
            return;
        }
        snprintf(c->client, sizeof c->client, "local");
        peer_address(conn, l->is_tcp, c->client, sizeof c->client);
        c->since_s = ddt_mono_s();
        pthread_mutex_lock(&s->clock_lock);
        c->next = s->clocks;
        if (s->clocks)
            s->clocks->prev = c;
        s->clocks = c;
        pthread_mutex_unlock(&s->clock_lock);
        *socket_context = c;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && c) {
        pthread_mutex_lock(&s->clock_lock);
        if (c->prev)
            c->prev->next = c->next;
        else
            s->clocks = c->next;
        if (c->next)
            c->next->prev = c->prev;
        pthread_mutex_unlock(&s->clock_lock);
        close(c->fd);
        free(c);
        *socket_context = NULL;
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    listener *l = cls;
    ddt_http_server *s = l->server;
    request_state *st = *req_cls;

    if (!st) {   /* the headers are in: decide what to do with the body */
        st = calloc(1, sizeof *st);
        if (!st)
            return MHD_NO;
        *req_cls = st;
        if (l->is_tcp && s->token && !authorized(s, conn)) {
            int web = !strcmp(url, "/ui") || !strncmp(url, "/ui/", 4) ||
                      MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_COOKIE);
            st->unauthenticated = web;
            st->unauthorized = !web;
        }
        const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > DDT_HTTP_MAX_BODY)
            st->too_large = 1;   /* known from the start: nothing is kept */
        return MHD_YES;
    }
    if (*upload_data_size) {
        append_body(st, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }

    /* the last call: the whole body is in (the deadline stops until the answer is sent) */
    clock_set(s, conn, -1.0);
    ddt_http_response res;
    memset(&res, 0, sizeof res);
    if (st->unauthorized) {
        ddt_http_error(&res, 401, "unauthorized", NULL,
                       "this listener needs the header 'Authorization: Bearer <token>' with the "
                       "daemon's token");
        return send_response(s, conn, &res, 0);
    }
    if (st->too_large) {
        ddt_http_error(&res, 413, "body_too_large", NULL,
                       "the request body is larger than %d bytes", DDT_HTTP_MAX_BODY);
        return send_response(s, conn, &res, 1);
    }
    ddt_http_request req;
    memset(&req, 0, sizeof req);
    req.method = method;
    req.path = url;
    req.body = st->body ? st->body : "";
    req.body_len = st->len;
    req.via = !l->is_tcp ? DDT_HTTP_VIA_UNIX : l->loopback ? DDT_HTTP_VIA_LOOPBACK : DDT_HTTP_VIA_TCP;
    req.unauthenticated = st->unauthenticated;
    req.host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    req.origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    req.cookie = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_COOKIE);
    req.sec_fetch_site = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Sec-Fetch-Site");
    req.csrf = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-DDTree-CSRF");
    char client[INET6_ADDRSTRLEN] = "local";
    peer_address(conn, l->is_tcp, client, sizeof client);
    req.client = client;
    query_fill q = {&req, 0};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_query, &q);
    if (q.overflow) {
        ddt_http_error(&res, 400, "too_many_query_parameters", NULL,
                       "a request takes at most %d query parameters", DDT_HTTP_MAX_QUERY);
        return send_response(s, conn, &res, 0);
    }
    s->handler(s->ctx, &req, &res);
    if (res.status < STATUS_MIN || res.status > STATUS_MAX) {
        ddt_log(DDT_LOG_ERR, "http: handler gave no valid status method=%s path=%s status=%d", method,
                url, res.status);
        ddt_http_error(&res, 500, "internal", NULL, "the daemon gave no answer to %s %s", method,
                       url);
    }
    return send_response(s, conn, &res, 0);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    listener *l = cls;
    clock_set(l->server, conn, ddt_mono_s());   /* a kept-alive connection's next request starts now */
    request_state *st = *req_cls;
    if (st) {
        free(st->body);
        free(st);
        *req_cls = NULL;
    }
}

/* ------------------------------------------------------------------------------------------
 * Listeners
 */

/* an MHD daemon on listen_fd (>= 0) or bound by MHD to addr */
static struct MHD_Daemon *start_daemon(ddt_http_server *s, listener *l, const ddt_http_config *c,
                                       int listen_fd, const struct sockaddr *addr, uint16_t port)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC;   /* ITC: MHD_quiesce_daemon on stop */
    /* MHD's own bind sets SO_REUSEADDR (a restart is not refused for TIME_WAIT); never
     * MHD_OPTION_LISTENING_ADDRESS_REUSE, which is SO_REUSEPORT: a second daemon on the port */
    struct MHD_OptionItem where[2] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
    if (listen_fd >= 0) {
        where[0] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, listen_fd, NULL};
    } else {
        if (addr->sa_family == AF_INET6)
            flags |= MHD_USE_IPv6;
        where[0] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)addr};
    }
    unsigned max_connections = c->max_connections ? c->max_connections : DEFAULT_MAX_CONNECTIONS;
    unsigned timeout_s = c->timeout_s ? c->timeout_s : DEFAULT_TIMEOUT_S;
    /* one address's share of a TCP listener; the Unix socket's clients have no address to tell
     * apart (and one operator) */
    unsigned per_address = !l->is_tcp ? 0 : c->max_per_address ? c->max_per_address : DEFAULT_MAX_PER_ADDRESS;
    return MHD_start_daemon(flags, port, NULL, NULL, on_request, l,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, l,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, l,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_address,
                            MHD_OPTION_CONNECTION_LIMIT, max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY_LIMIT,
                            MHD_OPTION_ARRAY, where,
                            MHD_OPTION_END);
}

/* what MHD said last, for an error message */
static void last_log(ddt_http_server *s, char *out, size_t len)
{
    pthread_mutex_lock(&s->log_lock);
    snprintf(out, len, "%s", s->last_log[0] ? s->last_log : "no detail");
    pthread_mutex_unlock(&s->log_lock);
}

/* Whether a daemon answers on the socket at path: 1 yes, 0 a stale file (nobody listening),
 * negative errno when it cannot be told. */
static int socket_is_live(const struct sockaddr_un *addr)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int rc = connect(fd, (const struct sockaddr *)addr, sizeof *addr);
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS)   /* EAGAIN: its backlog is full */
        return 1;
    if (e == ECONNREFUSED)
        return 0;
    return -e;
}

/* The control socket: bound, mode 0660, listening; -errno with err saying what to do. */
static int open_unix_socket(ddt_http_server *s, const char *path, char *err, size_t err_len)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        snprintf(err, err_len, "the socket path %s is longer than %zu bytes: pick a shorter one",
                 path, sizeof addr.sun_path - 1);
        return -ENAMETOOLONG;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);

    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, err_len, "%s exists and is not a socket: remove it or pick another "
                     "socket path", path);
            return -EEXIST;
        }
        int live = socket_is_live(&addr);
        if (live == 1) {
            snprintf(err, err_len, "another daemon is listening on %s: stop it first, or give "
                     "this one another socket path", path);
            return -EADDRINUSE;
        }
        if (live < 0) {
            snprintf(err, err_len, "cannot tell whether a daemon listens on %s (%s): remove the "
                     "file if none does", path, strerror(-live));
            return live;
        }
        if (unlink(path) != 0 && errno != ENOENT) {
            int e = errno;
            snprintf(err, err_len, "cannot remove the stale socket %s (%s)", path, strerror(e));
            return -e;
        }
        ddt_log(DDT_LOG_NOTICE, "http: removed a stale socket path=%s", path);
    }

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(err, err_len, "cannot create a Unix socket (%s)", strerror(e));
        return -e;
    }
    if (bind(fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT) {
            char dir[sizeof addr.sun_path];
            snprintf(dir, sizeof dir, "%s", path);
            char *slash = strrchr(dir, '/');
            if (slash && slash != dir)
                *slash = '\0';
            else
                snprintf(dir, sizeof dir, ".");
            snprintf(err, err_len, "the socket's directory %s does not exist: create it "
                     "(systemd: RuntimeDirectory=ddtreed) or pick another socket path", dir);
        } else if (e == EACCES) {
            snprintf(err, err_len, "no permission to create %s: run as the daemon's user or "
                     "pick another socket path", path);
        } else {
            snprintf(err, err_len, "cannot bind %s (%s)", path, strerror(e));
        }
        return -e;
    }
    /* the mode is set before listen(): nobody can connect through a wider one */
    if (chmod(path, 0660) != 0 || lstat(path, &st) != 0 || listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        snprintf(err, err_len, "cannot set up %s (%s)", path, strerror(e));
        return -e;
    }
    s->socket_dev = st.st_dev;
    s->socket_ino = st.st_ino;
    s->socket_path = strdup(path);
    if (!s->socket_path) {
        close(fd);
        unlink(path);
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    return fd;
}

/* removes the socket file when it is still the one we bound */
static void remove_socket_file(ddt_http_server *s)
{
    struct stat st;
    if (s->socket_path && lstat(s->socket_path, &st) == 0 && st.st_dev == s->socket_dev &&
        st.st_ino == s->socket_ino)
        unlink(s->socket_path);
}

/* "HOST:PORT", HOST an IPv4 address, [IPv6] or localhost; 0 or -EINVAL with err */
static int parse_listen(const char *text, struct sockaddr_storage *addr, uint16_t *port,
                        int *loopback, char *err, size_t err_len)
{
    char host[64];
    const char *colon;
    if (text[0] == '[') {
        const char *close_bracket = strchr(text, ']');
        if (!close_bracket || close_bracket[1] != ':' || (size_t)(close_bracket - text - 1) >= sizeof host)
            goto bad;
        memcpy(host, text + 1, (size_t)(close_bracket - text - 1));
        host[close_bracket - text - 1] = '\0';
        colon = close_bracket + 1;
    } else {
        colon = strchr(text, ':');
        if (!colon || strchr(colon + 1, ':') || (size_t)(colon - text) >= sizeof host)
            goto bad;
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
    }
    const char *digits = colon + 1;
    if (!*digits || strlen(digits) > 5 || strspn(digits, "0123456789") != strlen(digits))
        goto bad;
    long p = strtol(digits, NULL, 10);
    if (p > 65535)
        goto bad;
    *port = (uint16_t)p;

    memset(addr, 0, sizeof *addr);
    struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)addr;
    if (text[0] == '[') {
        if (inet_pton(AF_INET6, host, &v6->sin6_addr) != 1)
            goto bad;
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(*port);
        *loopback = IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr) ||
                    (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr) && v6->sin6_addr.s6_addr[12] == 127);
    } else {
        if (!strcmp(host, "localhost"))
            snprintf(host, sizeof host, "127.0.0.1");
        if (inet_pton(AF_INET, host, &v4->sin_addr) != 1)
            goto bad;
        v4->sin_family = AF_INET;
        v4->sin_port = htons(*port);
        *loopback = (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    }
    return 0;
bad:
    snprintf(err, err_len, "listen address '%s' is not HOST:PORT (HOST an IPv4 address, [IPv6] "
             "or localhost; PORT 0-65535)", text);
    return -EINVAL;
}

/* After MHD could not bind: the reason, from a bind of our own to the same address. */
static int bind_error(const struct sockaddr_storage *addr)
{
    socklen_t len = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in);
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc = bind(fd, (const struct sockaddr *)addr, len) == 0 ? -EIO : -errno;
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Start and stop
 */

int ddt_http_start(const ddt_http_config *c, ddt_http_handler handler, void *ctx,
                   ddt_http_server **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err_len)
        err[0] = '\0';
    int want_unix = c->socket_path && c->socket_path[0];
    int want_tcp = c->listen && c->listen[0];
    if (!want_unix && !want_tcp) {
        snprintf(err, err_len, "neither a socket path nor a listen address: give at least one");
        return -EINVAL;
    }
    struct sockaddr_storage tcp_addr;
    uint16_t tcp_port = 0;
    int loopback = 0;
    if (want_tcp) {
        int rc = parse_listen(c->listen, &tcp_addr, &tcp_port, &loopback, err, err_len);
        if (rc)
            return rc;
        if (!loopback && !(c->token && c->token[0])) {
            snprintf(err, err_len, "listen address %s is not a loopback address: set a bearer "
                     "token for it, or listen on 127.0.0.1 or [::1]", c->listen);
            return -EINVAL;
        }
    }

    ddt_http_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    s->handler = handler;
    s->ctx = ctx;
    pthread_mutex_init(&s->log_lock, NULL);
    pthread_mutex_init(&s->clock_lock, NULL);
    pthread_cond_init(&s->clock_wake, NULL);
    s->request_timeout_s = c->request_timeout_s ? c->request_timeout_s : DEFAULT_REQUEST_TIMEOUT_S;
    s->unix_listener = (listener){s, NULL, 0, 0, -1};
    s->tcp_listener = (listener){s, NULL, 1, loopback, -1};
    for (int j = 0; j <= STATUS_MAX - STATUS_MIN; j++)
        atomic_init(&s->counts[j], 0);
    int rc = pthread_create(&s->sweeper, NULL, sweep, s);
    if (rc) {
        snprintf(err, err_len, "cannot start the request deadline's thread (%s)", strerror(rc));
        rc = -rc;
        goto fail;
    }
    s->sweeper_started = 1;
    if (c->token && c->token[0] && !(s->token = strdup(c->token))) {
        snprintf(err, err_len, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }

    if (want_unix) {
        int fd = open_unix_socket(s, c->socket_path, err, err_len);
        if (fd < 0) {
            rc = fd;
            goto fail;
        }
        s->unix_listener.daemon = start_daemon(s, &s->unix_listener, c, fd, NULL, 0);
        if (!s->unix_listener.daemon) {
            /* MHD closes a listen socket it was given only once it runs */
            close(fd);
            char why[256];
            last_log(s, why, sizeof why);
            snprintf(err, err_len, "libmicrohttpd could not serve %s (%s)", c->socket_path, why);
            rc = -EIO;
            goto fail;
        }
        ddt_log(DDT_LOG_INFO, "http: listening socket=%s mode=0660", c->socket_path);
    }
    if (want_tcp) {
        s->tcp_listener.daemon = start_daemon(s, &s->tcp_listener, c, -1,
                                              (const struct sockaddr *)&tcp_addr, tcp_port);
        if (!s->tcp_listener.daemon) {
            char why[256];
            last_log(s, why, sizeof why);
            rc = bind_error(&tcp_addr);
            if (rc == -EADDRINUSE)
                snprintf(err, err_len, "%s is taken (another daemon?): stop it or pick another "
                         "listen address (%s)", c->listen, why);
            else if (rc == -EADDRNOTAVAIL)
                snprintf(err, err_len, "%s is not an address of this machine (%s)", c->listen, why);
            else if (rc == -EACCES)
                snprintf(err, err_len, "no permission to listen on %s: use a port above 1023 "
                         "(%s)", c->listen, why);
            else
                snprintf(err, err_len, "libmicrohttpd could not listen on %s (%s)", c->listen, why);
            goto fail;
        }
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->tcp_listener.daemon,
                                                               MHD_DAEMON_INFO_BIND_PORT);
        ddt_log(DDT_LOG_INFO, "http: listening listen=%s port=%u token=%s", c->listen,
                info ? (unsigned)info->port : (unsigned)tcp_port, s->token ? "yes" : "no");
    }
    *out = s;
    return 0;

fail:
    ddt_http_stop(s);
    return rc;
}

/* the connections of l's daemon still open (0 when it has none or cannot say) */
/* connections whose complete request is being answered (their clock paused): what a stop waits
 * for; an idle keep-alive connection, or one still trickling its request in, is not */
static int answering(ddt_http_server *s)
{
    int n = 0;
    pthread_mutex_lock(&s->clock_lock);
    for (const conn_clock *c = s->clocks; c; c = c->next)
        n += !c->closed && c->since_s < 0;
    pthread_mutex_unlock(&s->clock_lock);
    return n;
}

void ddt_http_stop(ddt_http_server *s)
{
    if (!s)
        return;
    listener *ls[2] = {&s->unix_listener, &s->tcp_listener};
    /* stop accepting; the requests being answered are finished (for at most STOP_DRAIN_MS), and
     * the other connections (idle, or a request not yet in) are closed at once */
    for (int j = 0; j < 2; j++)
        if (ls[j]->daemon)
            ls[j]->quiesced_fd = MHD_quiesce_daemon(ls[j]->daemon);
    remove_socket_file(s);
    for (int waited = 0; waited < STOP_DRAIN_MS; waited += 10) {
        if (!answering(s))
            break;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    for (int j = 0; j < 2; j++) {
        if (ls[j]->daemon)
            MHD_stop_daemon(ls[j]->daemon);
        if (ls[j]->quiesced_fd >= 0)
            close(ls[j]->quiesced_fd);
    }
    if (s->sweeper_started) {
        pthread_mutex_lock(&s->clock_lock);
        s->stopping = 1;
        pthread_cond_signal(&s->clock_wake);
        pthread_mutex_unlock(&s->clock_lock);
        pthread_join(s->sweeper, NULL);
    }
    free(s->socket_path);
    free(s->token);
    pthread_mutex_destroy(&s->log_lock);
    pthread_mutex_destroy(&s->clock_lock);
    pthread_cond_destroy(&s->clock_wake);
    free(s);
}
