/* ui_login_limit.c: wrong tokens at the web view's login, limited per client address
 * (ui_login_limit.h). One lock; a linear look through a small table, which only logins reach.
 * Tested by tests/daemon/api_e2e.py (case login_limit).
 */
#include "ui_login_limit.h"

#include <stdio.h>
#include <string.h>

void ddt_ui_login_limit_init(ddt_ui_login_limit *l)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->lock, NULL);
}

void ddt_ui_login_limit_destroy(ddt_ui_login_limit *l)
{
    pthread_mutex_destroy(&l->lock);
}

/* client's slot, or NULL when it has none and create is 0; with create, a free slot or the least
 * recently seen one, given to client */
static ddt_ui_login_address *slot_of(ddt_ui_login_limit *l, const char *client, int create)
{
    ddt_ui_login_address *oldest = &l->address[0];
    for (int i = 0; i < DDT_UI_LOGIN_ADDRESSES; i++) {
        ddt_ui_login_address *a = &l->address[i];
        if (a->client[0] && !strcmp(a->client, client))
            return a;
        if (!a->client[0] || (oldest->client[0] && a->seen_ms < oldest->seen_ms))
            oldest = a;
    }
    if (!create)
        return NULL;
    memset(oldest, 0, sizeof *oldest);
    snprintf(oldest->client, sizeof oldest->client, "%s", client);
    return oldest;
}

int64_t ddt_ui_login_wait(ddt_ui_login_limit *l, const char *client, int64_t now_ms)
{
    pthread_mutex_lock(&l->lock);
    const ddt_ui_login_address *a = slot_of(l, client, 0);
    int64_t wait_ms = a && a->next_ms > now_ms ? a->next_ms - now_ms : 0;
    if (wait_ms)
        l->refused_total++;
    pthread_mutex_unlock(&l->lock);
    return (wait_ms + 999) / 1000;
}

int ddt_ui_login_failed(ddt_ui_login_limit *l, const char *client, int64_t now_ms)
{
    pthread_mutex_lock(&l->lock);
    ddt_ui_login_address *a = slot_of(l, client, 1);
    a->failures++;
    a->seen_ms = now_ms;
    int over = a->failures - DDT_UI_LOGIN_FREE + 1;   /* 1: the try after the last free one waits 1 s */
    int64_t wait_s = over <= 0 ? 0 : over > 30 ? DDT_UI_LOGIN_MAX_WAIT_S : (int64_t)1 << (over - 1);
    if (wait_s > DDT_UI_LOGIN_MAX_WAIT_S)
        wait_s = DDT_UI_LOGIN_MAX_WAIT_S;
    a->next_ms = now_ms + 1000 * wait_s;
    l->failures_total++;
    int failures = a->failures;
    pthread_mutex_unlock(&l->lock);
    return failures;
}

void ddt_ui_login_succeeded(ddt_ui_login_limit *l, const char *client)
{
    pthread_mutex_lock(&l->lock);
    ddt_ui_login_address *a = slot_of(l, client, 0);
    if (a)
        memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&l->lock);
}

void ddt_ui_login_counts(ddt_ui_login_limit *l, uint64_t *failures, uint64_t *refused)
{
    pthread_mutex_lock(&l->lock);
    *failures = l->failures_total;
    *refused = l->refused_total;
    pthread_mutex_unlock(&l->lock);
}
