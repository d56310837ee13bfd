/* The records' clock: the CPU's time-stamp counter where that is safe, converted to CLOCK_REALTIME ns when the
 * records are flushed, so the file holds the same times the other levels use.
 *
 * Why: a wrapper reads the clock twice per call. CLOCK_REALTIME through the vDSO costs about 21 ns a read on
 * the machines measured (an ordered TSC read, the scaling and the vDSO's sequence lock), rdtsc about 9 ns, and
 * the two reads were the largest single part of what a recorded call costs.
 *
 * When the TSC is used: x86-64, a CPU that says its TSC is invariant (CPUID 0x80000007, EDX bit 8), a kernel
 * whose clocksource is "tsc" (so the kernel itself trusts it to be synchronised across CPUs), a rate of at
 * least 1 GHz (a duration in ticks is then at least as long in ns, so converted values fit where the ticks
 * did), and no XSTACK_IO_CLOCK=realtime in the environment. Otherwise the wrappers read CLOCK_REALTIME and
 * nothing is converted.
 *
 * Conversion: an anchor is a (ticks, CLOCK_REALTIME ns) pair read back to back (the tightest of a few tries).
 * A session takes one when it starts, after a 50 us calibration that gives a first rate, and every flush takes
 * one. The records of a flush were stamped between the previous anchor and this one, and are converted by the
 * line through both: their times are then as exact as the anchors (tens of ns), whatever NTP did to
 * CLOCK_REALTIME's rate in between. A segment shorter than 1 ms, or one whose rate differs from the last
 * known one by more than 1% (CLOCK_REALTIME was stepped), is converted with the last known rate from the new
 * anchor instead. All of it runs under xio.lock (init, fork child and flushes).
 */
#include "xio.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#define CALIBRATION_NS 50000
#define MIN_SEGMENT_NS 1000000
#define MAX_RATE_CHANGE 0.01

static struct {
    int64_t at_ticks, at_ns; /* the last anchor */
    double slope;            /* ns per tick, the last known */
} clk;

#if defined(__x86_64__)
static int clocksource_is_tsc(void)
{
    char buf[32];
    long fd = xio_sys_open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    long n = syscall(SYS_read, (int)fd, buf, sizeof buf);
    xio_sys_close((int)fd);
    return n >= 4 && memcmp(buf, "tsc\n", 4) == 0;
}

static int tsc_invariant(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
        return 0;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1u;
}
#endif

/* A (ticks, ns) pair: the tightest of a few back-to-back reads, ticks taken as the middle of the window. */
static void take_anchor(int64_t *ticks, int64_t *ns)
{
    int64_t best = INT64_MAX;
    for (int i = 0; i < 8 && best > 0; i++) {
        int64_t a = xio_tsc(), r = xio_now(), b = xio_tsc();
        if (b - a < best) {
            best = b - a;
            *ticks = a + (b - a) / 2;
            *ns = r;
        }
    }
}

static void choose_clock(void);
static void measure_read_cost(void);

void xio_clock_init(void)
{
    choose_clock();
    measure_read_cost();
}

static void choose_clock(void)
{
    xio.tsc = 0;
    xio.flush_interval = XIO_FLUSH_INTERVAL_NS;
#if defined(__x86_64__)
    const char *force = getenv("XSTACK_IO_CLOCK");
    if ((force && strcmp(force, "realtime") == 0) || !tsc_invariant() || !clocksource_is_tsc())
        return;
    int64_t t0, n0, t1, n1;
    take_anchor(&t0, &n0);
    do
        take_anchor(&t1, &n1);
    while (n1 - n0 < CALIBRATION_NS && n1 >= n0);
    if (t1 <= t0 || n1 <= n0)
        return;
    double slope = (double)(n1 - n0) / (double)(t1 - t0);
    if (!(slope > 0.0 && slope <= 1.0))
        return; /* a TSC under 1 GHz: durations in ns could outgrow their 32-bit fields */
    clk.slope = slope;
    clk.at_ticks = t1;
    clk.at_ns = n1;
    xio.flush_interval = (int64_t)(XIO_FLUSH_INTERVAL_NS / slope);
    xio.tsc = 1;
#endif
}

/* One xio_ticks() read's cost, in picoseconds: the fastest of a few loops of reads, timed with CLOCK_REALTIME
 * (a few us at every session start: each exec'd program pays it). */
#define READ_COST_READS 64
static void measure_read_cost(void)
{
    int64_t best = INT64_MAX;
    for (int k = 0; k < 4; k++) {
        int64_t a = xio_now();
        for (int i = 0; i < READ_COST_READS; i++)
            (void)xio_ticks();
        int64_t b = xio_now();
        if (b - a < best)
            best = b - a;
    }
    xio.clock_read_ps = best > 0 ? best * 1000 / READ_COST_READS : 0;
}

double xio_clock_slope(void) { return xio.tsc ? clk.slope : 1.0; }

void xio_clock_restart(void)
{
    if (xio.tsc)
        take_anchor(&clk.at_ticks, &clk.at_ns);
}

int xio_clock_map(struct xio_clock_map *m)
{
    if (!xio.tsc)
        return 0;
    int64_t t, ns;
    take_anchor(&t, &ns);
    int64_t dt = t - clk.at_ticks, dn = ns - clk.at_ns;
    double seg = dt > 0 ? (double)dn / (double)dt : 0.0;
    if ((double)dn >= MIN_SEGMENT_NS && seg > clk.slope * (1.0 - MAX_RATE_CHANGE) &&
        seg < clk.slope * (1.0 + MAX_RATE_CHANGE)) {
        *m = (struct xio_clock_map){.ticks = clk.at_ticks, .ns = clk.at_ns, .slope = seg};
        clk.slope = seg;
    } else {
        *m = (struct xio_clock_map){.ticks = t, .ns = ns, .slope = clk.slope};
    }
    clk.at_ticks = t;
    clk.at_ns = ns;
    return 1;
}
