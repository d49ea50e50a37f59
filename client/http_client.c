/* http_client.c: ddtreectl's HTTP transport: one libcurl easy handle, reused from request to
 * request (watch polls over one kept-alive connection), to the control socket
 * (CURLOPT_UNIX_SOCKET_PATH with the URL http://localhost/...) or to a TCP base URL with
 * `Authorization: Bearer $DDTREE_TOKEN`. Timeouts: 5 s to connect, 30 s in all. An answer is read
 * whole into a growing buffer (capped); what it means is api_client.c's business, not this file's.
 * It sorts failures into "unreachable" (exit status 3) and local ones, and says why in words.
 * Tested by hand against a scratch server and against ddtreed itself (client/README.md).
 */
#include "ddtreectl.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DDC_CONNECT_TIMEOUT_S = 5, DDC_TOTAL_TIMEOUT_S = 30 };
/* a step history as CSV is the largest answer: ~200 B a step, so this is a million steps */
#define DDC_MAX_REPLY_BYTES ((size_t)256 << 20)

#ifndef DDC_VERSION
#define DDC_VERSION "unknown"
#endif

struct ddc_http {
    CURL *curl;
    const char *socket_path; /* NULL over TCP */
    char *base_url;          /* "http://localhost" on the socket, else the --url without its '/' */
    char *auth_header;       /* "Authorization: Bearer ...", or NULL */
};

/* what the write callback fills, and whether it gave up */
typedef struct ddc_sink {
    ddc_reply *reply;
    int over_cap;
    int out_of_memory;
} ddc_sink;

ddc_http *ddc_http_open(const char *socket_path, const char *base_url, const char *token)
{
    ddc_http *http = calloc(1, sizeof *http);
    if (!http)
        return NULL;
    http->curl = curl_easy_init();
    if (base_url) {
        size_t n = strlen(base_url);
        while (n > 0 && base_url[n - 1] == '/')
            n--;
        http->base_url = strndup(base_url, n);
        if (token && *token) {
            size_t len = strlen(token) + 32;
            http->auth_header = malloc(len);
            if (http->auth_header)
                snprintf(http->auth_header, len, "Authorization: Bearer %s", token);
        }
    } else {
        http->socket_path = socket_path;
        http->base_url = strdup("http://localhost");
    }
    if (!http->curl || !http->base_url || (base_url && token && *token && !http->auth_header)) {
        ddc_http_close(http);
        return NULL;
    }
    return http;
}

void ddc_http_close(ddc_http *http)
{
    if (!http)
        return;
    if (http->curl)
        curl_easy_cleanup(http->curl);
    free(http->base_url);
    free(http->auth_header);
    free(http);
}

void ddc_reply_free(ddc_reply *reply)
{
    free(reply->body);
    memset(reply, 0, sizeof *reply);
}

/* Appends to the reply; keeps it NUL-terminated so that cJSON and printf can read it as is. */
static int ddc_reply_append(ddc_reply *reply, const char *data, size_t n)
{
    if (reply->len + n + 1 > reply->cap) {
        size_t cap = reply->cap ? reply->cap : 4096;
        while (cap < reply->len + n + 1)
            cap *= 2;
        char *grown = realloc(reply->body, cap);
        if (!grown)
            return -1;
        reply->body = grown;
        reply->cap = cap;
    }
    memcpy(reply->body + reply->len, data, n);
    reply->len += n;
    reply->body[reply->len] = '\0';
    return 0;
}

static size_t ddc_write_cb(char *data, size_t size, size_t nmemb, void *userdata)
{
    ddc_sink *sink = userdata;
    size_t n = size * nmemb;
    if (sink->reply->len + n > DDC_MAX_REPLY_BYTES) {
        sink->over_cap = 1;
        return 0; /* curl stops with CURLE_WRITE_ERROR */
    }
    if (ddc_reply_append(sink->reply, data, n)) {
        sink->out_of_memory = 1;
        return 0;
    }
    return n;
}

/* Why the transfer failed, in words: the system's reason when connect() said one (a missing
 * socket is "No such file or directory", a closed port "Connection refused"), else curl's. */
static void ddc_describe_failure(CURL *curl, CURLcode code, const char *curl_err, char *err, size_t err_len)
{
    long os_errno = 0;
    curl_easy_getinfo(curl, CURLINFO_OS_ERRNO, &os_errno);
    if (code == CURLE_COULDNT_CONNECT && os_errno)
        snprintf(err, err_len, "%s", strerror((int)os_errno));
    else if (code == CURLE_OPERATION_TIMEDOUT)
        snprintf(err, err_len, "timed out (%s)", curl_err[0] ? curl_err : curl_easy_strerror(code));
    else
        snprintf(err, err_len, "%s", curl_err[0] ? curl_err : curl_easy_strerror(code));
}

int ddc_http_request(ddc_http *http, const char *method, const char *path, const char *body,
                     size_t body_len, ddc_reply *reply, char *err, size_t err_len)
{
    memset(reply, 0, sizeof *reply);
    size_t url_len = strlen(http->base_url) + strlen(path) + 1;
    char *url = malloc(url_len);
    if (!url) {
        snprintf(err, err_len, "out of memory");
        return DDC_HTTP_FAILED;
    }
    snprintf(url, url_len, "%s%s", http->base_url, path);

    CURL *curl = http->curl;
    char curl_err[CURL_ERROR_SIZE] = "";
    ddc_sink sink = {.reply = reply};
    int is_post = !strcmp(method, "POST");

    struct curl_slist *headers = NULL, *grown;
    const char *header_lines[] = {"Accept: application/json",
                                  is_post ? "Content-Type: application/json" : NULL,
                                  is_post ? "Expect:" : NULL, /* no 100-continue round trip */
                                  http->auth_header};
    for (size_t i = 0; i < sizeof header_lines / sizeof header_lines[0]; i++) {
        if (!header_lines[i])
            continue;
        grown = curl_slist_append(headers, header_lines[i]);
        if (!grown) {
            curl_slist_free_all(headers);
            free(url);
            snprintf(err, err_len, "out of memory");
            return DDC_HTTP_FAILED;
        }
        headers = grown;
    }

    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, http->socket_path); /* NULL: TCP */
#if LIBCURL_VERSION_NUM >= 0x075500 /* 7.85 */
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, (long)DDC_CONNECT_TIMEOUT_S);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, (long)DDC_TOTAL_TIMEOUT_S);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "ddtreectl/" DDC_VERSION);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, ddc_write_cb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
    if (is_post) {
        curl_easy_setopt(curl, CURLOPT_POST, 1L);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    } else {
        curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    }

    CURLcode code = curl_easy_perform(curl);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(headers);
    free(url);

    int rc = DDC_HTTP_ANSWERED;
    if (code == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply->status);
        if (!reply->body && ddc_reply_append(reply, "", 0)) {
            snprintf(err, err_len, "out of memory");
            rc = DDC_HTTP_FAILED;
        }
    } else if (sink.over_cap) {
        snprintf(err, err_len, "the daemon's answer to %s %s is larger than %zu MiB", method, path,
                 DDC_MAX_REPLY_BYTES >> 20);
        rc = DDC_HTTP_FAILED;
    } else if (sink.out_of_memory || code == CURLE_OUT_OF_MEMORY) {
        snprintf(err, err_len, "out of memory reading the answer to %s %s", method, path);
        rc = DDC_HTTP_FAILED;
    } else {
        ddc_describe_failure(curl, code, curl_err, err, err_len);
        rc = DDC_HTTP_UNREACHABLE;
    }
    if (rc != DDC_HTTP_ANSWERED)
        ddc_reply_free(reply);
    return rc;
}
