/* State, recording buffer, output file and lifecycle (init, fork, exit) of the io library.
 *
 * File layout (all little-endian; read by xstack/collect/_io_records.py):
 *   header  "XSTACKIO", u32 version, u32 header_bytes, i64 pid, i64 ppid, i64 start_ns, u32 mode,
 *           u32 flags (1: forked; 2: the calls were timed with the TSC, converted to ns at each flush, see
 *           clock.c), u32 seq, u32 record_bytes, u32 exe_len, u32 argv_len, u32 names_len,
 *           u32 pad, i64 session_ns; then exe, argv (NUL-separated /proc/self/cmdline), names
 *           ("open,openat,...;unknown,file,...": op then kind names by code), zero-padded to 8 bytes.
 *   blocks  u32 kind, u32 count, u64 payload_bytes, then the payload:
 *           2 OPS:    i32 tid (0: given by THREAD slots), u32 pad, then count x 32-byte slots of that
 *                     thread's stream, in its order (struct xio_rec in xio.h):
 *                       u32 start (ns after the stream's time base), u32 dur (ns), i64 offset, u32 path_id,
 *                       i32 bytes, i32 requested, i16 fd, u8 op, u8 flags (bits 0-3: kind; 0x10 FAILED: bytes
 *                       is -1 and the field holds errno; 0x20 WIDE: the next slot holds i64 bytes,
 *                       i64 requested, i64 dur, i32 fd, i32 errno instead of the narrow fields; 0x40 TIME:
 *                       not a call, offset is the stream's new time base (CLOCK_REALTIME ns); 0x80 THREAD:
 *                       not a call, bytes is the thread of the slots that follow). A stream's time base
 *                       carries over from one of its blocks to the next within a file. A slot with op
 *                       "path" and no flags is no call either: path_id is a new id, bytes the path's length,
 *                       and the path fills the next ceil(length / 32) slots, zero-padded. An id is defined
 *                       once in a process image (across its sessions' files); a fork child's records also
 *                       name the ids of the descriptors it inherited, defined in its parent's files.
 *           3 STATUS: u32 end, u32 nops, i64 end_ns, u64 records, max_records, dropped_bytes_read,
 *                     dropped_bytes_written, reentrant_skipped, paths_dropped, write_errors, nops x u64
 *                     calls dropped by the record cap, by op code; then (from 2026-11-24, same version: a
 *                     reader finds them by the payload's size) i64 cpu_ns, run_delay_ns, threads, preempted:
 *                     the process's CPU time and involuntary context switches since its image (fork child,
 *                     session) started recording, and its threads' run-queue wait since then, summed (those
 *                     alive as it ends, and from 2026-11-25 those with a stream that ended before, read as
 *                     each ended), with how many threads were read (0 in a status that is not final: not
 *                     read); then
 *                     (from 2026-11-25, found the same way) i64 self_ns, self_samples, flush_ns,
 *                     clock_read_ps: what recording cost the process since then (struct xio_self in xio.h,
 *                     in ns) and one clock read's cost in picoseconds.
 *           (Kind 1, a block of paths, was written up to version 2.)
 * Every flush writes its OPS blocks and a STATUS block; the last STATUS tells how the process ended
 * (RUNNING: killed, or still running). Recording and flushing are in streams.c; the reader sorts the records
 * by start time.
 */
#include "xio.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct xio_state xio = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_records = XIO_DEFAULT_MAX_RECORDS};
__thread int xio_guard __attribute__((tls_model("initial-exec")));

/* ---- lifecycle ---- */

/* Writes what is buffered and a status block. `final`: the process (or session) records nothing more. */
void xio_session_flush(int end, int final)
{
    if (xio.mode == XIO_MODE_OFF || xio.ended || xio_sys_getpid() != xio.pid)
        return; /* not recording, or a vfork child that shares the parent's memory: touch nothing */
    int saved_errno = errno, saved_guard = xio_guard;
    if (!saved_guard)
        xio_run_flush(); /* this thread's run of calls, if one is open (not from inside a wrapper: a signal) */
    xio_guard = 1;
    pthread_mutex_lock(&xio.lock);
    xio_flush_locked(end);
    if (final) {
        xio.ended = 1;
        xio_output_close();
    }
    pthread_mutex_unlock(&xio.lock);
    xio_guard = saved_guard;
    errno = saved_errno;
}

/* From the handler of a termination signal (hooks_signal.c): writes what is buffered and a final status naming
 * the signal. It never waits: a thread that holds the lock (the handler interrupted a flush, or a fork) keeps
 * it, and what it has not written is lost with the process. */
void xio_session_flush_signal(int sig)
{
    if (xio.mode == XIO_MODE_OFF || xio.ended)
        return;
    int saved_errno = errno, saved_guard = xio_guard;
    xio_guard = 1;
    if (pthread_mutex_trylock(&xio.lock) == 0) {
        xio_flush_locked(XIO_END_SIGNAL | sig << 8);
        xio.ended = 1;
        xio_output_close();
        pthread_mutex_unlock(&xio.lock);
    }
    xio_guard = saved_guard;
    errno = saved_errno;
}

/* A new file: counters from zero, every path written again, streams restarted. */
static void new_file(void)
{
    memset(xio.dropped, 0, sizeof xio.dropped);
    xio.dropped_bytes_read = xio.dropped_bytes_written = 0;
    xio.reentrant_skipped = xio.paths_dropped = xio.write_errors = 0;
    xio_streams_new_file(); /* bumps xio.gen: every path is written again */
}

static int set_dir(const char *dir)
{
    size_t n = strlen(dir);
    if (dir[0] != '/') {
        long c = syscall(SYS_getcwd, xio.dir, sizeof xio.dir);
        if (c <= 0)
            return -1;
        size_t cwd = strlen(xio.dir);
        if (cwd + 1 + n >= sizeof xio.dir)
            return -1;
        xio.dir[cwd] = '/';
        memcpy(xio.dir + cwd + 1, dir, n + 1);
        xio.dir_len = cwd + 1 + n;
        return 0;
    }
    if (n >= sizeof xio.dir - 64)
        return -1;
    memcpy(xio.dir, dir, n + 1);
    while (n > 1 && xio.dir[n - 1] == '/')
        xio.dir[--n] = 0;
    xio.dir_len = n;
    return 0;
}

static void flush_impl(void);

/* Starts recording into a new file; called with no lock held (init, attach). */
int xio_session_start(int mode, const char *dir, const char *exclude, uint64_t max_records)
{
    if (set_dir(dir) != 0) {
        xio_warn("output directory path is too long or relative without a cwd:", dir, 0);
        return -1;
    }
    if (xio_streams_init() != 0 || xio_tables_init() != 0 || xio_exclude_init(exclude) != 0) {
        xio_warn("cannot allocate its tables (mmap failed)", NULL, errno);
        return -1;
    }
    Dl_info self;
    if (dladdr((void *)flush_impl, &self) && self.dli_fname)
        xio_proc_set_libname(self.dli_fname);
    xio.max_records = max_records;
    xio.pid = xio_sys_getpid();
    xio.ppid = (pid_t)syscall(SYS_getppid);
    if (xio.start_ns == 0)
        xio.start_ns = xio_now();
    xio.ended_run_delay_ns = xio.ended_threads = 0; /* before the base: it holds the live threads' only */
    xio_sched_read(&xio.sched_base, 1);
    xio.self = (struct xio_self){0};
    pthread_mutex_lock(&xio.lock);
    xio_clock_init();
    new_file();
    pthread_mutex_unlock(&xio.lock);
    xio.mode = mode; /* the header records it */
    if (xio_output_open() < 0) {
        xio.mode = XIO_MODE_OFF;
        return -1;
    }
    xio.last_flush = xio_ticks();
    xio.ended = 0;
    return 0;
}

static void write_inherited(void);

static void atfork_prepare(void)
{
    if (xio.mode == XIO_MODE_OFF)
        return;
    xio_guard = 1; /* other prepare handlers that do I/O pass through instead of taking our lock again */
    pthread_mutex_lock(&xio.lock);
    xio.fork_locked = 1;
}

static void atfork_parent(void)
{
    if (!xio.fork_locked)
        return;
    xio.fork_locked = 0;
    pthread_mutex_unlock(&xio.lock);
    xio_guard = 0;
}

/* The child has one thread (this one): start its own file with the fork time, leave the parent's
 * unflushed records to the parent, and say which descriptors it inherited. */
static void atfork_child(void)
{
    if (!xio.fork_locked)
        return;
    xio.fork_locked = 0;
    pthread_mutex_init(&xio.lock, NULL);
    xio_streams_fork_child();
    if (xio.mode == XIO_MODE_OFF || xio.ended) {
        xio_guard = 0;
        return;
    }
    xio_output_close();
    xio.ppid = xio.pid;
    xio.pid = xio_sys_getpid();
    xio.forked = 1;
    xio.start_ns = xio_now();
    xio.seq = 0;
    xio.ended_run_delay_ns = xio.ended_threads = 0; /* the parent's threads that ended are the parent's */
    xio_sched_read(&xio.sched_base, 1); /* about zero: a child's counters start afresh */
    xio.self = (struct xio_self){0};
    xio_clock_restart();
    new_file();
    if (xio_output_open() < 0) {
        xio.mode = XIO_MODE_OFF;
        xio_guard = 0;
        return;
    }
    xio.last_flush = xio_ticks();
    write_inherited();
    xio_guard = 0;
}

/* Tells the child's file which descriptors it starts with (path, kind, offset), so its reads resolve. */
static void write_inherited(void)
{
    int top = xio_fd_max();
    for (int fd = 0; fd <= top; fd++) {
        struct xio_fd *e = xio_fd_get_known(fd);
        if (!e || e->kind == XIO_KIND_EXCLUDED)
            continue;
        struct xio_ev r;
        int64_t now = xio_ticks();
        xio_ev_init(&r, XIO_OP_INHERIT, now, now);
        r.fd = fd;
        r.path_id = e->path_id;
        r.kind = e->kind;
        r.offset = xio_kind_seekable(e->kind) ? e->offset : -1;
        xio_emit(&r);
    }
}

/* ---- exported API ---- */

static void flush_impl(void) { xio_session_flush(XIO_END_RUNNING, 0); }
XIO_EXPORT void xstack_io_flush(void) __attribute__((alias("flush_impl")));

static int mode_impl(void) { return xio.ended ? XIO_MODE_OFF : xio.mode; }
XIO_EXPORT int xstack_io_mode(void) __attribute__((alias("mode_impl")));

/* Our symbols come first in the global scope only when we were preloaded: dlopen (ctypes) keeps a
 * library's symbols local. */
static int preloaded(void) { return dlsym(RTLD_DEFAULT, "xstack_io_flush") == (void *)flush_impl; }

static uint64_t parse_max_records(const char *s)
{
    if (!s || !*s)
        return XIO_DEFAULT_MAX_RECORDS;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) {
        xio_warn("ignoring XSTACK_IO_MAX_RECORDS (not a number):", s, 0);
        return XIO_DEFAULT_MAX_RECORDS;
    }
    return v;
}

static void init_once(void)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&xio.init_state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    int saved_errno = errno, saved_guard = xio_guard;
    xio_guard = 1;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    if (preloaded()) {
        xio_resolve_reals(0);
        const char *dir = getenv("XSTACK_IO_DIR");
        if (dir && *dir &&
            xio_session_start(XIO_MODE_PRELOAD, dir, getenv("XSTACK_IO_EXCLUDE"),
                              parse_max_records(getenv("XSTACK_IO_MAX_RECORDS"))) == 0)
            xio_signals_init();
    }
    __atomic_store_n(&xio.init_state, 2, __ATOMIC_RELEASE);
    xio_guard = saved_guard;
    errno = saved_errno;
}

__attribute__((constructor)) static void xio_ctor(void) { init_once(); }

/* A wrapper may run before our constructor (another library's constructor does I/O). */
int xio_init_early(void)
{
    if (xio.init_state == 0)
        init_once();
    return xio.mode != XIO_MODE_OFF;
}

__attribute__((destructor)) static void xio_dtor(void) { xio_session_flush(XIO_END_EXIT, 1); }

