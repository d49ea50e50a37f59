/* ui_login_limit.h: wrong tokens at the web view's login, limited per client address. Each
 * address may try DDT_UI_LOGIN_FREE wrong tokens in a row; after that it waits before each next
 * try, 1 s after the last free one and twice as long after each further wrong token, up to
 * DDT_UI_LOGIN_MAX_WAIT_S: a guess a second at first, one every ten minutes soon after. A try
 * made while it should wait is answered 429 with Retry-After, the token not looked at. A right
 * token from an address clears its count; other addresses are never held up by it. The table
 * holds DDT_UI_LOGIN_ADDRESSES addresses (the least recently seen gives way to a new one).
 * Tested by tests/daemon/api_e2e.py (case login_limit: 429 with Retry-After from one address while
 * another logs in, the /metrics counters).
 */
#ifndef DDT_UI_LOGIN_LIMIT_H
#define DDT_UI_LOGIN_LIMIT_H

#include <pthread.h>
#include <stdint.h>

enum { DDT_UI_LOGIN_FREE = 3, DDT_UI_LOGIN_MAX_WAIT_S = 600, DDT_UI_LOGIN_ADDRESSES = 256 };

typedef struct ddt_ui_login_address {
    char client[48];       /* "" when the slot is free */
    int failures;          /* wrong tokens in a row */
    int64_t next_ms;       /* no try before this (monotonic ms) */
    int64_t seen_ms;       /* its last try */
} ddt_ui_login_address;

typedef struct ddt_ui_login_limit {
    pthread_mutex_t lock;
    ddt_ui_login_address address[DDT_UI_LOGIN_ADDRESSES];
    uint64_t failures_total;    /* wrong tokens, for /metrics */
    uint64_t refused_total;     /* tries answered 429 without a look at the token */
} ddt_ui_login_limit;

void ddt_ui_login_limit_init(ddt_ui_login_limit *l);
void ddt_ui_login_limit_destroy(ddt_ui_login_limit *l);
/* Seconds client must wait before its next try (0: it may try now); a wait counts as refused. */
int64_t ddt_ui_login_wait(ddt_ui_login_limit *l, const char *client, int64_t now_ms);
/* A try from client was a wrong token: counted, and its next wait set. Returns the wrong tokens
 * in a row from it (for the log). */
int ddt_ui_login_failed(ddt_ui_login_limit *l, const char *client, int64_t now_ms);
/* A try from client was the token: its count cleared. */
void ddt_ui_login_succeeded(ddt_ui_login_limit *l, const char *client);
/* The counters, for /metrics. */
void ddt_ui_login_counts(ddt_ui_login_limit *l, uint64_t *failures, uint64_t *refused);

#endif
