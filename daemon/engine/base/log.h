/* log.h: the daemon's one logger (the engine's store, the HTTP server, the daemon): single
 * lines on stderr with a syslog priority prefix ("<3>", "<6>", ...), a "part: " word and
 * key=value fields; journald adds the timestamps. One write per line, so lines from threads
 * never interleave. Tested through the daemon's end-to-end test. */
#ifndef DDT_LOG_H
#define DDT_LOG_H

enum { DDT_LOG_ERR = 3, DDT_LOG_WARNING = 4, DDT_LOG_NOTICE = 5, DDT_LOG_INFO = 6, DDT_LOG_DEBUG = 7 };

/* lines of a priority above level are dropped */
void ddt_log_set_level(int level);
/* "err", "warning", "info", "debug": the level, or -1 */
int ddt_log_level_from_name(const char *name);
void ddt_log(int priority, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
