/* test_http.c: the HTTP transport (daemon/server/http.c) through a real client, libcurl.
 *
 * A server listens on a Unix socket in a fresh temporary directory and on TCP 127.0.0.1 (a port
 * found free just before) with a bearer token; its handler echoes what it was given as JSON or
 * answers fixed paths (201 with Location, text/plain, an error, no answer). The cases check what
 * the handler sees (method, path, URL-decoded query, body), the body cap (413 for a 2 MiB body,
 * with and without Content-Length, and exactly 1 MiB accepted), the token on TCP (401 without
 * or with a wrong one, 200 with it; none needed on the socket), headers, the counts per status,
 * the socket's mode and its removal, and the start-up refusals (a live daemon on the socket, a
 * file that is no socket, a missing directory, a taken port, a public address without a token,
 * malformed addresses). A stale socket file is replaced.
 */
#include "check.h"
#include "http.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char dir[] = "/tmp/ddtree-http-XXXXXX";
static char socket_path[100];   /* fits sun_path (108) */
static char listen_addr[64];
static int tcp_port;
static const char token[] = "t0ken-for-the-test";
static ddt_http_server *server;

/* ------------------------------------------------------------------------------------------
 * The handler
 */

static void test_handler(void *ctx, const ddt_http_request *req, ddt_http_response *res)
{
    if (!strcmp(req->path, "/created")) {
        ddt_http_json(res, 201, strdup("{\"id\":\"abc\",\"state\":\"queued\"}"));
        snprintf(res->location, sizeof res->location, "/runs/abc");
        return;
    }
    if (!strcmp(req->path, "/text")) {
        res->status = 200;
        res->body = strdup("hello\n");
        res->body_len = 6;
        res->content_type = "text/plain; charset=utf-8";
        return;
    }
    if (!strcmp(req->path, "/missing")) {
        ddt_http_error(res, 404, "not_found", "run.id", "no run \"%s\"", "x\\y");
        return;
    }
    if (!strcmp(req->path, "/nothing"))
        return;   /* no status: the transport answers 500 */

    /* anything else: what the handler was given, as JSON */
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "method", req->method);
    cJSON_AddStringToObject(root, "path", req->path);
    cJSON *query = cJSON_AddObjectToObject(root, "query");
    for (int j = 0; j < req->query_count; j++)
        cJSON_AddStringToObject(query, req->query_keys[j], req->query_values[j]);
    cJSON_AddNumberToObject(root, "body_len", (double)req->body_len);
    unsigned long sum = 0;
    for (size_t j = 0; j < req->body_len; j++)
        sum += (unsigned char)req->body[j];
    cJSON_AddNumberToObject(root, "body_sum", (double)sum);
    cJSON_AddBoolToObject(root, "body_terminated", req->body[req->body_len] == '\0');
    if (req->body_len < 1000)
        cJSON_AddStringToObject(root, "body", req->body);
    ddt_http_json(res, 200, cJSON_PrintUnformatted(root));
    cJSON_Delete(root);
}

/* ------------------------------------------------------------------------------------------
 * The client
 */

typedef struct reply {
    long status;
    char *body;
    size_t len;
    char content_type[128];
    char location[256];
    char www_authenticate[64];
    cJSON *json;   /* the body parsed, or NULL */
} reply;

static size_t on_data(char *data, size_t size, size_t count, void *cls)
{
    reply *r = cls;
    size_t n = size * count;
    char *grown = realloc(r->body, r->len + n + 1);
    if (!grown)
        return 0;
    r->body = grown;
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}

static void reply_free(reply *r)
{
    free(r->body);
    cJSON_Delete(r->json);
    memset(r, 0, sizeof *r);
}

static void copy_header(CURL *curl, const char *name, char *out, size_t len)
{
    struct curl_header *h;
    if (curl_easy_header(curl, name, 0, CURLH_HEADER, -1, &h) == CURLHE_OK)
        snprintf(out, len, "%s", h->value);
}

/* One request: over the Unix socket (tcp 0) or TCP; body NULL for none; auth a whole
 * "Authorization: ..." header or NULL; extra one more header or NULL. 0, or -1 when curl
 * could not talk to the server (r->status 0). */
static int request(int tcp, const char *method, const char *target, const char *body,
                   size_t body_len, const char *auth, const char *extra, reply *r)
{
    memset(r, 0, sizeof *r);
    CURL *curl = curl_easy_init();
    if (!curl)
        return -1;
    char url[512];
    if (tcp) {
        snprintf(url, sizeof url, "http://127.0.0.1:%d%s", tcp_port, target);
    } else {
        snprintf(url, sizeof url, "http://localhost%s", target);
        curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, socket_path);
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 20L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, r);
    if (body) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    struct curl_slist *headers = NULL;
    if (auth)
        headers = curl_slist_append(headers, auth);
    if (extra)
        headers = curl_slist_append(headers, extra);
    if (headers)
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    CURLcode rc = curl_easy_perform(curl);
    if (rc == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
        char *type = NULL;
        curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &type);
        snprintf(r->content_type, sizeof r->content_type, "%s", type ? type : "");
        copy_header(curl, "Location", r->location, sizeof r->location);
        copy_header(curl, "WWW-Authenticate", r->www_authenticate, sizeof r->www_authenticate);
        if (r->body)
            r->json = cJSON_Parse(r->body);
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return rc == CURLE_OK ? 0 : -1;
}

static const char *json_string(const cJSON *j, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double json_number(const cJSON *j, const char *a)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static int same(const char *got, const char *want)
{
    return got && !strcmp(got, want);
}

/* the error code of an API error body, or "" */
static const char *error_code(const reply *r)
{
    const char *code = json_string(r->json, "error", "code");
    return code ? code : "";
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static ddt_http_config config(const char *sock, const char *listen, const char *tok)
{
    ddt_http_config c = {.socket_path = sock, .listen = listen, .token = tok, .max_connections = 16, .timeout_s = 10};
    return c;
}

/* a server of the case's own on c, with test_handler; NULL, a failed check naming what, when it
 * does not start */
static ddt_http_server *start_server(ddt_http_config c, const char *what)
{
    char err[512];
    ddt_http_server *s = NULL;
    int rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == 0, "start %s: %d %s", what, rc, err);
    return rc == 0 ? s : NULL;
}

/* GET target over the socket (tcp 0) or TCP answered 200; a failed check naming what if not */
static void check_get_ok(int tcp, const char *target, const char *what)
{
    reply r;
    int ok = request(tcp, "GET", target, NULL, 0, NULL, NULL, &r) == 0 && r.status == 200;
    check(ok, "%s: status %ld", what, r.status);
    reply_free(&r);
}

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void test_start(void)
{
    tcp_port = free_port();
    check(tcp_port > 0, "no free TCP port");
    snprintf(listen_addr, sizeof listen_addr, "127.0.0.1:%d", tcp_port);
    ddt_http_config c = config(socket_path, listen_addr, token);
    char err[512];
    int rc = ddt_http_start(&c, test_handler, NULL, &server, err, sizeof err);
    check(rc == 0 && server, "start: %d %s", rc, err);
    if (rc) {
        fprintf(stderr, "cannot go on without the server\n");
        exit(1);
    }
}

static void test_routing(void)
{
    reply r;
    check(request(0, "GET", "/runs/abc/steps?after=10&limit=5&name=a%20b%2Fc&flag", NULL, 0, NULL,
                  NULL, &r) == 0, "GET failed");
    check(r.status == 200, "status %ld", r.status);
    check(same(json_string(r.json, "method", NULL), "GET"), "method: %s", r.body);
    check(same(json_string(r.json, "path", NULL), "/runs/abc/steps"), "path: %s", r.body);
    check(same(json_string(r.json, "query", "after"), "10"), "after: %s", r.body);
    check(same(json_string(r.json, "query", "limit"), "5"), "limit: %s", r.body);
    check(same(json_string(r.json, "query", "name"), "a b/c"), "name not decoded: %s", r.body);
    check(same(json_string(r.json, "query", "flag"), ""), "flag: %s", r.body);
    check(json_number(r.json, "body_len") == 0, "body_len: %s", r.body);
    check(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r.json, "body_terminated")),
          "empty body not NUL-terminated");
    reply_free(&r);

    const char body[] = "{\"chunk\": 2048, \"name\": \"x\"}";
    check(request(0, "POST", "/runs/r1/rechunk", body, strlen(body), NULL,
                  "Content-Type: application/json", &r) == 0, "POST failed");
    check(r.status == 200, "status %ld", r.status);
    check(same(json_string(r.json, "method", NULL), "POST"), "method: %s", r.body);
    check(same(json_string(r.json, "path", NULL), "/runs/r1/rechunk"), "path: %s", r.body);
    check(same(json_string(r.json, "body", NULL), body), "body: %s", r.body);
    check(json_number(r.json, "body_len") == (double)strlen(body), "body_len: %s", r.body);
    check(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r.json, "body_terminated")),
          "body not NUL-terminated");
    reply_free(&r);

    check(request(0, "DELETE", "/runs/r1", NULL, 0, NULL, NULL, &r) == 0, "DELETE failed");
    check(same(json_string(r.json, "method", NULL), "DELETE"), "method: %s", r.body);
    reply_free(&r);

    /* more query parameters than a request holds: refused, not silently cut */
    check(request(0, "GET", "/x?a=1&b=2&c=3&d=4&e=5&f=6&g=7&h=8&i=9", NULL, 0, NULL, NULL, &r) == 0,
          "GET failed");
    check(r.status == 400, "9 query parameters: status %ld", r.status);
    reply_free(&r);
}

static void test_body_limit(void)
{
    size_t big = 2u << 20;
    char *body = xcalloc(big + 1, 1);
    unsigned long sum = 0;
    for (size_t j = 0; j < big; j++) {
        body[j] = (char)('a' + j % 26);
        if (j < DDT_HTTP_MAX_BODY)
            sum += (unsigned char)body[j];
    }
    reply r;

    /* exactly the cap: accepted whole */
    check(request(0, "POST", "/upload", body, DDT_HTTP_MAX_BODY, NULL, NULL, &r) == 0, "POST failed");
    check(r.status == 200, "1 MiB: status %ld", r.status);
    check(json_number(r.json, "body_len") == DDT_HTTP_MAX_BODY, "1 MiB: body_len %g",
          json_number(r.json, "body_len"));
    check(json_number(r.json, "body_sum") == (double)sum, "1 MiB: body bytes differ");
    reply_free(&r);

    /* 2 MiB with Content-Length */
    check(request(0, "POST", "/upload", body, big, NULL, NULL, &r) == 0, "2 MiB POST failed");
    check(r.status == 413, "2 MiB: status %ld", r.status);
    check(same(error_code(&r), "body_too_large"), "2 MiB: body %s", r.body ? r.body : "");
    check(json_string(r.json, "error", "message") != NULL, "no message: %s", r.body ? r.body : "");
    check(same(r.content_type, "application/json"), "413 content type %s", r.content_type);
    reply_free(&r);

    /* 2 MiB chunked (no Content-Length): caught while accumulating */
    check(request(0, "POST", "/upload", body, big, NULL, "Transfer-Encoding: chunked", &r) == 0,
          "chunked POST failed");
    check(r.status == 413, "2 MiB chunked: status %ld", r.status);
    check(same(error_code(&r), "body_too_large"), "chunked: body %s", r.body ? r.body : "");
    reply_free(&r);

    check_get_ok(0, "/after", "after the 413s");   /* the server goes on */
    free(body);
}

static void test_token(void)
{
    reply r;
    check(request(1, "GET", "/healthz", NULL, 0, NULL, NULL, &r) == 0, "TCP GET failed");
    check(r.status == 401, "no token: status %ld", r.status);
    check(same(error_code(&r), "unauthorized"), "no token: body %s", r.body ? r.body : "");
    check(!strncmp(r.www_authenticate, "Bearer", 6), "no WWW-Authenticate: Bearer (%s)",
          r.www_authenticate);
    reply_free(&r);

    check(request(1, "GET", "/healthz", NULL, 0, "Authorization: Bearer t0ken-for-the-tesT", NULL,
                  &r) == 0 && r.status == 401, "wrong token: status %ld", r.status);
    reply_free(&r);
    check(request(1, "GET", "/healthz", NULL, 0, "Authorization: Bearer t0ken-for-the-test-", NULL,
                  &r) == 0 && r.status == 401, "longer token: status %ld", r.status);
    reply_free(&r);
    check(request(1, "GET", "/healthz", NULL, 0, "Authorization: Bearer t0ken", NULL, &r) == 0 &&
          r.status == 401, "prefix of the token: status %ld", r.status);
    reply_free(&r);
    check(request(1, "GET", "/healthz", NULL, 0, "Authorization: Basic dXNlcjpwYXNz", NULL, &r) == 0 &&
          r.status == 401, "Basic auth: status %ld", r.status);
    reply_free(&r);

    const char body[] = "{\"a\":1}";
    check(request(1, "POST", "/runs", body, strlen(body), NULL, NULL, &r) == 0 && r.status == 401,
          "POST without a token: status %ld", r.status);
    reply_free(&r);

    check(request(1, "GET", "/healthz?x=1", NULL, 0, "Authorization: Bearer t0ken-for-the-test", NULL,
                  &r) == 0, "TCP GET failed");
    check(r.status == 200, "right token: status %ld", r.status);
    check(same(json_string(r.json, "query", "x"), "1"), "right token: body %s", r.body ? r.body : "");
    reply_free(&r);
    check(request(1, "POST", "/runs", body, strlen(body), "Authorization: bearer t0ken-for-the-test",
                  NULL, &r) == 0, "TCP POST failed");
    check(r.status == 200 && same(json_string(r.json, "body", NULL), body),
          "right token (scheme in lower case), POST: status %ld", r.status);
    reply_free(&r);

    check_get_ok(0, "/healthz", "socket without a token");   /* the socket needs none */
}

static void test_headers(void)
{
    reply r;
    check(request(0, "POST", "/created", "{}", 2, NULL, NULL, &r) == 0, "POST failed");
    check(r.status == 201, "status %ld", r.status);
    check(same(r.location, "/runs/abc"), "Location '%s'", r.location);
    check(same(r.content_type, "application/json"), "content type '%s'", r.content_type);
    check(same(json_string(r.json, "id", NULL), "abc"), "body %s", r.body ? r.body : "");
    reply_free(&r);

    check(request(0, "GET", "/text", NULL, 0, NULL, NULL, &r) == 0, "GET failed");
    check(r.status == 200 && same(r.body, "hello\n"), "text: %ld", r.status);
    check(same(r.content_type, "text/plain; charset=utf-8"), "content type '%s'", r.content_type);
    check(r.location[0] == '\0', "a Location nobody set: %s", r.location);
    reply_free(&r);

    check(request(0, "GET", "/missing", NULL, 0, NULL, NULL, &r) == 0, "GET failed");
    check(r.status == 404, "status %ld", r.status);
    check(same(error_code(&r), "not_found"), "code: %s", r.body ? r.body : "");
    check(same(json_string(r.json, "error", "field"), "run.id"), "field: %s", r.body ? r.body : "");
    check(same(json_string(r.json, "error", "message"), "no run \"x\\y\""), "message: %s",
          r.body ? r.body : "");
    reply_free(&r);

    check(request(0, "GET", "/nothing", NULL, 0, NULL, NULL, &r) == 0, "GET failed");
    check(r.status == 500 && same(error_code(&r), "internal"), "no answer: %ld %s", r.status,
          r.body ? r.body : "");
    reply_free(&r);
}

static void test_socket_mode(void)
{
    struct stat st;
    check(stat(socket_path, &st) == 0, "stat %s: %s", socket_path, strerror(errno));
    check(S_ISSOCK(st.st_mode), "%s is not a socket", socket_path);
    check((st.st_mode & 07777) == 0660, "mode %o, want 0660", (unsigned)(st.st_mode & 07777));
}

static void test_second_server_refused(void)
{
    ddt_http_server *second = NULL;
    char err[512] = "";
    ddt_http_config c = config(socket_path, NULL, NULL);
    int rc = ddt_http_start(&c, test_handler, NULL, &second, err, sizeof err);
    check(rc == -EADDRINUSE && !second, "same socket: rc %d", rc);
    check(strstr(err, socket_path) != NULL, "the error does not name the socket: %s", err);
    if (second)
        ddt_http_stop(second);

    /* the same TCP port (another socket path) */
    char other[100];
    snprintf(other, sizeof other, "%s/other.sock", dir);
    c = config(other, listen_addr, token);
    err[0] = '\0';
    rc = ddt_http_start(&c, test_handler, NULL, &second, err, sizeof err);
    check(rc == -EADDRINUSE && !second, "same port: rc %d (%s)", rc, err);
    check(strstr(err, listen_addr) != NULL, "the error does not name the address: %s", err);
    check(access(other, F_OK) != 0, "the failed start left %s behind", other);
    if (second)
        ddt_http_stop(second);

    /* the first goes on, its socket file untouched */
    check_get_ok(0, "/still", "the first server after a refused second");
}

static void test_counts(void)
{
    char path[100];
    snprintf(path, sizeof path, "%s/counts.sock", dir);
    ddt_http_server *s = start_server(config(path, NULL, NULL), path);
    if (!s)
        return;
    char saved[100];
    snprintf(saved, sizeof saved, "%s", socket_path);
    snprintf(socket_path, sizeof socket_path, "%s", path);
    reply r;
    const char *targets[] = {"/a", "/b", "/missing", "/c", "/created", "/missing"};
    for (size_t j = 0; j < sizeof targets / sizeof targets[0]; j++) {
        check(request(0, "GET", targets[j], NULL, 0, NULL, NULL, &r) == 0, "GET %s", targets[j]);
        reply_free(&r);
    }
    char *body = xcalloc(DDT_HTTP_MAX_BODY + 2, 1);
    memset(body, 'x', DDT_HTTP_MAX_BODY + 1);
    check(request(0, "POST", "/big", body, DDT_HTTP_MAX_BODY + 1, NULL, NULL, &r) == 0 &&
          r.status == 413, "one byte over: %ld", r.status);
    reply_free(&r);
    free(body);
    snprintf(socket_path, sizeof socket_path, "%s", saved);

    int codes[8];
    uint64_t counts[8];
    int n = ddt_http_counts(s, codes, counts, 8);
    const int want_codes[] = {200, 201, 404, 413};
    const uint64_t want_counts[] = {3, 1, 2, 1};
    check(n == 4, "%d codes, want 4", n);
    for (int j = 0; j < n && j < 4; j++)
        check(codes[j] == want_codes[j] && counts[j] == want_counts[j],
              "code %d count %llu, want %d %llu", codes[j], (unsigned long long)counts[j],
              want_codes[j], (unsigned long long)want_counts[j]);
    check(ddt_http_counts(s, codes, counts, 2) == 2 && codes[1] == 201, "max not respected");
    ddt_http_stop(s);
}

static void test_stop_removes_socket(void)
{
    ddt_http_stop(server);
    server = NULL;
    struct stat st;
    check(lstat(socket_path, &st) != 0 && errno == ENOENT, "%s still there after stop", socket_path);
    reply r;
    check(request(0, "GET", "/x", NULL, 0, NULL, NULL, &r) != 0, "the socket answers after stop");
    reply_free(&r);
    check(request(1, "GET", "/x", NULL, 0, NULL, NULL, &r) != 0, "TCP answers after stop");
    reply_free(&r);
}

static void test_stale_socket_replaced(void)
{
    /* a socket file nobody listens on: what a killed daemon leaves */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", socket_path);
    check(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind: %s", strerror(errno));
    close(fd);
    struct stat st;
    check(lstat(socket_path, &st) == 0 && S_ISSOCK(st.st_mode), "no stale socket to replace");

    ddt_http_server *s = start_server(config(socket_path, NULL, NULL), "over a stale socket");
    check_get_ok(0, "/fresh", "the new server");
    check(stat(socket_path, &st) == 0 && (st.st_mode & 07777) == 0660, "mode after replacing");
    ddt_http_stop(s);
    check(access(socket_path, F_OK) != 0, "socket left after stop");
}

static void test_refusals(void)
{
    char err[512], path[100];
    ddt_http_server *s = NULL;
    ddt_http_config c;
    int rc;

    /* a file that is not a socket is never removed */
    snprintf(path, sizeof path, "%s/plain-file", dir);
    FILE *f = fopen(path, "w");
    check(f != NULL, "cannot write %s", path);
    if (f) {
        fputs("keep me", f);
        fclose(f);
    }
    c = config(path, NULL, NULL);
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -EEXIST && !s, "a plain file: rc %d", rc);
    struct stat st;
    check(stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 7, "the plain file was touched");
    unlink(path);

    /* a missing directory */
    snprintf(path, sizeof path, "%s/no-such-dir/api.sock", dir);
    c = config(path, NULL, NULL);
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -ENOENT && strstr(err, "does not exist"), "a missing directory: %d %s", rc, err);

    /* a public address without a token */
    char public_addr[64];
    snprintf(public_addr, sizeof public_addr, "0.0.0.0:%d", free_port());
    c = config(NULL, public_addr, NULL);
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -EINVAL && !s && strstr(err, "token"), "public without a token: %d %s", rc, err);
    c = config(NULL, public_addr, "");
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -EINVAL && !s, "public with an empty token: %d", rc);
    c = config(NULL, "[::]:7460", NULL);
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "token"), "[::] without a token: %d %s", rc, err);
    c = config(NULL, public_addr, token);   /* with one it starts */
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == 0, "public with a token: %d %s", rc, err);
    ddt_http_stop(s);
    s = NULL;

    /* malformed addresses */
    const char *bad[] = {"localhost", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:80x", "::1:80",
                         "[::1", "[::1]80", "example.com:80", "300.1.1.1:80", ":80"};
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
        c = config(NULL, bad[j], token);
        err[0] = '\0';
        rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
        check(rc == -EINVAL && !s && err[0], "'%s': rc %d", bad[j], rc);
    }

    /* nothing to listen on */
    c = config(NULL, "", NULL);
    rc = ddt_http_start(&c, test_handler, NULL, &s, err, sizeof err);
    check(rc == -EINVAL && !s, "no listener: rc %d", rc);
}

static void test_loopback_without_token(void)
{
    /* 127.0.0.1 without a token: open to local clients (http.h: a token only off loopback) */
    tcp_port = free_port();
    snprintf(listen_addr, sizeof listen_addr, "localhost:%d", tcp_port);
    ddt_http_server *s = start_server(config(NULL, listen_addr, NULL), listen_addr);
    check_get_ok(1, "/open", "loopback without a token");
    ddt_http_stop(s);
}

static void test_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    socklen_t len = sizeof a;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    int port = ntohs(a.sin6_port);
    if (fd >= 0)
        close(fd);
    if (!ok) {
        printf("skip ipv6_loopback (no IPv6 loopback here)\n");
        return;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "[::1]:%d", port);
    ddt_http_server *s = start_server(config(NULL, addr, token), addr);
    if (s) {
        CURL *curl = curl_easy_init();
        char url[96];
        snprintf(url, sizeof url, "http://[::1]:%d/v6", port);
        reply r;
        memset(&r, 0, sizeof r);
        struct curl_slist *h = curl_slist_append(NULL, "Authorization: Bearer t0ken-for-the-test");
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT, 20L);
        check(curl_easy_perform(curl) == CURLE_OK, "curl on %s failed", url);
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
        check(r.status == 200, "IPv6: status %ld", r.status);
        curl_slist_free_all(h);
        curl_easy_cleanup(curl);
        reply_free(&r);
        ddt_http_stop(s);
    }
    case_done("ipv6_loopback");
}

static void test_helpers(void)
{
    ddt_http_response res;
    memset(&res, 0, sizeof res);
    ddt_http_error(&res, 409, "not_running", NULL, "run %s is \"%s\"\n", "r1", "paused");
    cJSON *j = cJSON_Parse(res.body);
    check(res.status == 409 && j, "error body: %s", res.body ? res.body : "(null)");
    check(res.body_len == (res.body ? strlen(res.body) : 0), "body_len");
    check(same(json_string(j, "error", "code"), "not_running"), "code");
    check(same(json_string(j, "error", "message"), "run r1 is \"paused\"\n"), "message not escaped");
    check(!cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "field"),
          "a field without one given: %s", res.body);
    cJSON_Delete(j);

    /* a second answer replaces the first (no leak under ASan) */
    ddt_http_error(&res, 400, "invalid", "loss.chunk", "chunk must be > 0");
    j = cJSON_Parse(res.body);
    check(res.status == 400 && same(json_string(j, "error", "field"), "loss.chunk"), "field: %s",
          res.body);
    cJSON_Delete(j);
    ddt_http_json(&res, 200, strdup("{\"ok\":true}"));
    check(res.status == 200 && same(res.body, "{\"ok\":true}") && res.body_len == 11, "json");
    ddt_http_json(&res, 200, NULL);   /* cJSON out of memory: not a 200 */
    check(res.status == 500, "json(NULL) gives %d", res.status);
    free(res.body);

    ddt_http_request req;
    memset(&req, 0, sizeof req);
    req.query_count = 2;
    req.query_keys[0] = "after";
    req.query_values[0] = "10";
    req.query_keys[1] = "format";
    req.query_values[1] = "csv";
    check(same(ddt_http_query(&req, "format"), "csv"), "query format");
    check(same(ddt_http_query(&req, "after"), "10"), "query after");
    check(ddt_http_query(&req, "limit") == NULL, "query limit");
}

int main(void)
{
    if (!mkdtemp(dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 2;
    }
    snprintf(socket_path, sizeof socket_path, "%s/api.sock", dir);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const test_case cases[] = {
        {"start", test_start},
        {"routing", test_routing},
        {"body_limit", test_body_limit},
        {"token", test_token},
        {"headers", test_headers},
        {"socket_mode", test_socket_mode},
        {"second_server_refused", test_second_server_refused},
        {"counts", test_counts},
        {"stop_removes_socket", test_stop_removes_socket},
        {"stale_socket_replaced", test_stale_socket_replaced},
        {"refusals", test_refusals},
        {"loopback_without_token", test_loopback_without_token},
        {"helpers", test_helpers},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    case_failed = 0;
    test_ipv6_loopback();
    curl_global_cleanup();
    rmdir(dir);
    return cases_summary();
}
