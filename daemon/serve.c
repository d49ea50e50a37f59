/* serve.c: `ddtreed serve` (the default command): the daemon.
 *
 *   ddtreed serve [--config FILE] [--state-dir DIR] [--socket PATH] [--listen HOST:PORT]
 *
 * Start-up: configuration (file, then flags), the state directory, the database, the run
 * manager (which resumes interrupted runs), the HTTP listeners; only then READY=1 to systemd.
 * The main thread runs a libuv loop that owns the signals (SIGTERM / SIGINT: stop accepting,
 * pause every run at its step boundary with a checkpoint, exit; a second one exits at once,
 * the default action being back; SIGHUP: reload what is reloadable), a one-second timer
 * (systemd's watchdog, pinged only while every training run makes progress, and STATUS=
 * lines) and a wake-up the run manager posts when a run changes state.
 * Tested by tests/daemon/api_e2e.py.
 */
#include "base/ddt_time.h"
#include "api.h"
#include "commands.h"
#include "config.h"
#include "ddk.h"
#include "http.h"
#include "base/log.h"
#include "runs.h"
#include "record/store.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define SERVE_USAGE "usage: ddtreed [serve] [--config FILE] [--state-dir DIR] [--socket PATH] [--listen HOST:PORT]\n"

typedef struct daemon_state {
    const char *config_path;
    ddt_daemon_config config;
    ddt_store *store;
    ddt_runs *runs;
    ddt_http_server *http;
    ddt_api api;
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t tick;
    uv_async_t wake;
    double watchdog_s;      /* systemd's WatchdogSec, 0 when off */
    double last_ping_s;
    int stopping;
    char last_status[256];
} daemon_state;

/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET ("@" = abstract). */
static void sd_notify_text(const char *text)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    memcpy(sa.sun_path, path, strlen(path));
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    if (sendto(fd, text, strlen(text), MSG_NOSIGNAL, (struct sockaddr *)&sa, len) < 0)
        ddt_log(DDT_LOG_WARNING, "sd_notify failed: %s", strerror(errno));
    close(fd);
}

static void update_status(daemon_state *d)
{
    char summary[200], text[256];
    ddt_runs_summary(d->runs, summary, sizeof summary);
    snprintf(text, sizeof text, "STATUS=%s", summary);
    if (strcmp(text, d->last_status)) {
        sd_notify_text(text);
        snprintf(d->last_status, sizeof d->last_status, "%s", text);
    }
}

/* A device error ends the process (libddk, ddk_set_fatal_hook): the queued records are
 * committed first; systemd (Restart=on-failure) restarts the daemon, whose runs then resume from
 * their last checkpoints (DESIGN.md, "Failure policy"). Runs on the failing thread. */
static ddt_store *fatal_store;

static void on_device_error(const char *message)
{
    ddt_log(DDT_LOG_ERR, "device error: %s; ending so that systemd restarts the daemon and the runs "
            "resume from their last checkpoints", message);
    sd_notify_text("STATUS=device error: ending for a restart");
    if (fatal_store)   /* not while the store cannot write: that could wait for ever */
        ddt_store_commit_queued(fatal_store);
}

/* ------------------------------------------------------------------------------------------
 * Loop callbacks
 */

static void on_wake(uv_async_t *h)
{
    update_status(h->data);
}

static void on_tick(uv_timer_t *h)
{
    daemon_state *d = h->data;
    /* with the watchdog setting off the loop still pings (systemd's WatchdogSec then only
     * catches a hung loop, not a stuck trainer) */
    if (d->watchdog_s > 0 && (!d->config.watchdog || ddt_runs_progressing(d->runs, d->watchdog_s)) &&
        ddt_mono_s() - d->last_ping_s >= d->watchdog_s / 2) {
        sd_notify_text("WATCHDOG=1");
        d->last_ping_s = ddt_mono_s();
    }
    update_status(d);
}

static void notify_from_runs(void *ctx)
{
    uv_async_send(ctx);   /* any thread: the loop picks it up */
}

static void stop_daemon(daemon_state *d, int signum)
{
    if (d->stopping)
        return;
    d->stopping = 1;
    ddt_log(DDT_LOG_INFO, "signal=%s stopping: runs pause at their step boundary with a checkpoint",
            strsignal(signum));
    sd_notify_text("STOPPING=1\nSTATUS=stopping: checkpointing runs");
    /* the default actions are back: a second signal ends the process at once */
    uv_signal_stop(&d->sigterm);
    uv_signal_stop(&d->sigint);
    uv_stop(d->loop);
}

static void on_signal(uv_signal_t *h, int signum)
{
    daemon_state *d = h->data;
    if (signum != SIGHUP) {
        stop_daemon(d, signum);
        return;
    }
    if (!d->config_path) {
        ddt_log(DDT_LOG_INFO, "signal=SIGHUP nothing to reload (no --config file)");
        return;
    }
    ddt_daemon_config fresh;
    char err[1024];
    if (ddt_daemon_config_load(d->config_path, &fresh, err, sizeof err)) {
        ddt_log(DDT_LOG_ERR, "signal=SIGHUP reload refused, keeping the running configuration: %s", err);
        return;
    }
    int changed = ddt_daemon_config_reload(&d->config, &fresh);
    ddt_log_set_level(ddt_log_level_from_name(d->config.log_level));
    ddt_runs_set_parallel(d->runs, (int)d->config.max_parallel_runs);
    ddt_log(DDT_LOG_INFO, "signal=SIGHUP reloaded changed=%d (only reloadable settings apply before a restart)", changed);
}

/* ------------------------------------------------------------------------------------------ */

static int parse_flags(int argc, char **argv, daemon_state *d, char *err, size_t err_len)
{
    static const struct { const char *flag, *key; } flags[] = {
        { "--state-dir", "state_dir" }, { "--socket", "socket" }, { "--listen", "listen" },
    };
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            d->config_path = argv[++i];
    int rc = ddt_daemon_config_load(d->config_path, &d->config, err, err_len);
    for (int i = 1; i < argc && rc == 0; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        int known = 0;
        for (size_t f = 0; f < sizeof flags / sizeof flags[0] && !known; f++)
            if (!strcmp(argv[i], flags[f].flag)) {
                known = 1;
                if (i + 1 >= argc) {
                    snprintf(err, err_len, "%s needs a value", argv[i]);
                    return -EINVAL;
                }
                rc = ddt_daemon_config_set(&d->config, flags[f].key, argv[++i], 0, err, err_len);
            }
        if (!known) {
            snprintf(err, err_len, "%s is not an option of ddtreed serve", argv[i]);
            return -EINVAL;
        }
    }
    return rc;
}

int ddt_cmd_serve(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            fputs(SERVE_USAGE, stdout);
            ddt_daemon_config_print_help(stdout);
            return 0;
        }
    static daemon_state d;
    char err[2048] = "";
    if (parse_flags(argc, argv, &d, err, sizeof err)) {
        fprintf(stderr, "ddtreed: %s\n" SERVE_USAGE, err);
        return 2;
    }
    ddt_log_set_level(ddt_log_level_from_name(d.config.log_level));
    ddt_log(DDT_LOG_INFO, "ddtreed %s starting pid=%d cuda=%s nccl=%s gpus=%d", DDK_VERSION, (int)getpid(),
            ddk_has_cuda() ? "on" : "off", ddk_has_nccl() ? "on" : "off", ddk_cuda_device_count());
    ddt_daemon_config_log(&d.config);
    signal(SIGPIPE, SIG_IGN);

    /* start-up: every failure says what to do and exits non-zero */
    if (mkdir(d.config.state_dir, 0750) && errno != EEXIST) {
        ddt_log(DDT_LOG_ERR, "cannot create state_dir %s: %s; create it or set state_dir / --state-dir",
                d.config.state_dir, strerror(errno));
        return 1;
    }
    char db[1100];
    snprintf(db, sizeof db, "%s/ddtree.db", d.config.state_dir);
    if (ddt_store_open(db, &d.store, err, sizeof err)) {
        ddt_log(DDT_LOG_ERR, "database: %s", err);
        return 1;
    }
    fatal_store = d.store;
    ddk_set_fatal_hook(on_device_error);
    d.loop = uv_default_loop();
    uv_async_init(d.loop, &d.wake, on_wake);
    d.wake.data = &d;
    if (ddt_runs_open(d.config.state_dir, db, d.store, (int)d.config.max_parallel_runs, notify_from_runs, &d.wake,
                      &d.runs, err, sizeof err)) {
        ddt_log(DDT_LOG_ERR, "runs: %s", err);
        ddk_set_fatal_hook(NULL);
        ddt_store_close(d.store);
        return 1;
    }
    d.api = (ddt_api){ .runs = d.runs, .store = d.store, .config = &d.config, .started_s = ddt_mono_s() };
    snprintf(d.api.db_path, sizeof d.api.db_path, "%s", db);
    ddt_ui_login_limit_init(&d.api.login_limit);
    if (ddt_ui_access_init(&d.api.access, d.config.token, err, sizeof err)) {
        ddt_log(DDT_LOG_ERR, "web view: %s", err);
        ddt_runs_close(d.runs);
        ddk_set_fatal_hook(NULL);
        ddt_store_close(d.store);
        return 1;
    }
    ddt_http_config hc = { .socket_path = d.config.socket, .listen = d.config.listen,
                           .token = *d.config.token ? d.config.token : NULL,
                           .max_connections = (unsigned)d.config.max_connections,
                           .timeout_s = (unsigned)d.config.connection_timeout_s,
                           .max_per_address = (unsigned)d.config.max_connections_per_address,
                           .request_timeout_s = (unsigned)d.config.request_timeout_s };
    if (ddt_http_start(&hc, ddt_api_handle, &d.api, &d.http, err, sizeof err)) {
        ddt_log(DDT_LOG_ERR, "listeners: %s", err);
        ddt_runs_close(d.runs);
        ddk_set_fatal_hook(NULL);
        ddt_store_close(d.store);
        return 1;
    }
    d.api.http = d.http;

    uv_signal_init(d.loop, &d.sigterm);
    uv_signal_init(d.loop, &d.sigint);
    uv_signal_init(d.loop, &d.sighup);
    d.sigterm.data = d.sigint.data = d.sighup.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    uv_signal_start(&d.sighup, on_signal, SIGHUP);
    const char *wd = getenv("WATCHDOG_USEC");
    d.watchdog_s = wd ? atof(wd) / 1e6 : 0.0;
    uv_timer_init(d.loop, &d.tick);
    d.tick.data = &d;
    uv_timer_start(&d.tick, on_tick, 1000, 1000);

    ddt_log(DDT_LOG_INFO, "ready socket=%s listen=%s state_dir=%s", d.config.socket,
            *d.config.listen ? d.config.listen : "-", d.config.state_dir);
    sd_notify_text("READY=1");
    update_status(&d);
    uv_run(d.loop, UV_RUN_DEFAULT);

    /* stopping: no new requests, every run to its step boundary and a checkpoint */
    ddt_http_stop(d.http);
    ddt_ui_login_limit_destroy(&d.api.login_limit);
    ddt_runs_close(d.runs);
    ddk_set_fatal_hook(NULL);
    ddt_store_close(d.store);
    uv_timer_stop(&d.tick);
    uv_signal_stop(&d.sighup);
    uv_close((uv_handle_t *)&d.wake, NULL);
    uv_close((uv_handle_t *)&d.tick, NULL);
    uv_close((uv_handle_t *)&d.sigterm, NULL);
    uv_close((uv_handle_t *)&d.sigint, NULL);
    uv_close((uv_handle_t *)&d.sighup, NULL);
    uv_run(d.loop, UV_RUN_NOWAIT);
    ddt_log(DDT_LOG_INFO, "stopped");
    return 0;
}
