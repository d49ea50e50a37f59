/* ddt_time.h: the two clocks the daemon and the engine read: wall time in milliseconds (for
 * records) and a monotonic clock in seconds (for durations). Header-only. */
#ifndef DDT_TIME_H
#define DDT_TIME_H

#include <stdint.h>
#include <time.h>

static inline int64_t ddt_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline double ddt_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
