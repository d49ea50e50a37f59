/* log.c: single-line, prefixed logs on stderr (log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_level = DDT_LOG_INFO;

void ddt_log_set_level(int level)
{
    log_level = level;
}

int ddt_log_level_from_name(const char *name)
{
    static const struct { const char *name; int level; } levels[] = {
        { "err", DDT_LOG_ERR }, { "warning", DDT_LOG_WARNING }, { "info", DDT_LOG_INFO }, { "debug", DDT_LOG_DEBUG },
    };
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcmp(name, levels[i].name))
            return levels[i].level;
    return -1;
}

void ddt_log(int priority, const char *fmt, ...)
{
    if (priority > log_level)
        return;
    char line[2048];
    int n = snprintf(line, sizeof line, "<%d>", priority);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    for (int i = 0; i < n; i++)   /* one event, one line */
        if (line[i] == '\n')
            line[i] = ' ';
    line[n++] = '\n';
    if (write(2, line, (size_t)n) < 0) {
        /* nowhere left to report it */
    }
}
