/* The io level's interposition library: declarations shared by its C files.
 *
 * The library is loaded into a profiled process either by LD_PRELOAD (preload mode: its exported wrappers
 * come first in the global symbol scope) or by dlopen from Python (attach mode: the wrappers are reached by
 * patching the GOT entries of the loaded objects, see attach.c). Every wrapper calls the real function,
 * then appends one 32-byte record to its thread's record stream (streams.c), after the bytes of the path a
 * call names for the first time (an open, a stat, a descriptor seen without its open), which is written to
 * $XSTACK_IO_DIR/<pid>-<start_ns>-<seq>.xio. The file layout is documented in core.c and read by
 * xstack/collect/_io_records.py: keep the two in step (XIO_VERSION).
 *
 * Rules every C file follows:
 *  - never call a wrapped function by name (open, read, write, close, stat, mmap, fcntl, ...): in preload
 *    mode the name resolves to our own wrapper. The library's own I/O uses raw syscalls (xio_sys_*);
 *  - no malloc on the recording path: tables and buffers are mmap'd once;
 *  - errno as the real call left it is what the caller sees.
 */
#ifndef XSTACK_XIO_H
#define XSTACK_XIO_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
/* Fortified headers turn open/read into inline wrappers whose names clash with the definitions here, and
 * large-file redirects would rename open to open64: each wrapper is defined under its own name instead. */
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#undef _TIME_BITS

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define XIO_EXPORT __attribute__((visibility("default")))
#define XIO_ALIAS(impl) __attribute__((alias(#impl), visibility("default")))
#define XIO_LIKELY(x) __builtin_expect(!!(x), 1)
#define XIO_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define XIO_VERSION 3
#define XIO_FLUSH_INTERVAL_NS 100000000LL /* a killed process loses at most this much */
#define XIO_DEFAULT_MAX_RECORDS 8000000ULL

/* Operation codes written in records. The names, in this order, are written in every file header, so the
 * reader maps codes by name. Append only. */
#define XIO_OPS(X)                                                                                               \
    X(OPEN, "open") X(OPENAT, "openat") X(CREAT, "creat") X(CLOSE, "close") X(READ, "read") X(PREAD, "pread")     \
    X(READV, "readv") X(WRITE, "write") X(PWRITE, "pwrite") X(WRITEV, "writev") X(LSEEK, "lseek")                 \
    X(FSYNC, "fsync") X(FDATASYNC, "fdatasync") X(MMAP, "mmap") X(STAT, "stat") X(LSTAT, "lstat")                 \
    X(FSTAT, "fstat") X(FSTATAT, "fstatat") X(STATX, "statx") X(DUP, "dup") X(FOPEN, "fopen")                     \
    X(FDOPEN, "fdopen") X(FREAD, "fread") X(FWRITE, "fwrite") X(FCLOSE, "fclose") X(FSEEK, "fseek")               \
    X(FFLUSH, "fflush") X(INHERIT, "inherit") X(PATH, "path") X(OPENDIR, "opendir") X(READDIR, "readdir")        \
    X(CLOSEDIR, "closedir") X(RENAME, "rename") X(SENDFILE_READ, "sendfile_read")                                 \
    X(SENDFILE_WRITE, "sendfile_write") X(COPY_READ, "copy_file_range_read") X(COPY_WRITE, "copy_file_range_write") \
    X(STDIO_READ, "stdio_read") X(STDIO_WRITE, "stdio_write") X(MUNMAP, "munmap")

enum xio_op {
    XIO_OP_NONE = 0,
#define XIO_OP_ENUM(code, name) XIO_OP_##code,
    XIO_OPS(XIO_OP_ENUM)
#undef XIO_OP_ENUM
        XIO_OP_COUNT
};

/* Descriptor kinds, in the order of the kind names in the file header. */
enum xio_kind {
    XIO_KIND_UNKNOWN = 0,
    XIO_KIND_FILE,
    XIO_KIND_DIR,
    XIO_KIND_PIPE,
    XIO_KIND_SOCKET,
    XIO_KIND_CHR,
    XIO_KIND_BLK,
    XIO_KIND_EXCLUDED,
};
#define XIO_KIND_NAMES "unknown,file,dir,pipe,socket,chr,blk,excluded"

enum xio_mode { XIO_MODE_OFF = 0, XIO_MODE_PRELOAD = 1, XIO_MODE_ATTACH = 2 };

/* How a process image stopped recording (the status block's `end`). */
enum xio_end { XIO_END_RUNNING = 0, XIO_END_EXIT, XIO_END__EXIT, XIO_END_EXEC, XIO_END_DETACH, XIO_END_SIGNAL };
/* XIO_END_SIGNAL: killed by a termination signal, whose number is in bits 8-15 (hooks_signal.c). */

/* The file's blocks (layout in core.c): a header, then the payload. Block kind 1 (paths, before version 3)
 * is no longer written: paths travel in the record streams (XIO_OP_PATH). */
enum { XIO_BLOCK_OPS = 2, XIO_BLOCK_STATUS = 3 };
struct xio_block_header {
    uint32_t kind;
    uint32_t count;
    uint64_t bytes;
};

/* The CPU figures of the process (output.c): its CPU time and involuntary context switches (getrusage:
 * every thread, ended ones too), and the time its threads waited in a run queue for a CPU
 * (/proc/self/task/N/schedstat; `threads` 0: not read): those alive when read, and those that had a stream
 * and ended since the image started recording (read as each ended: xio.ended_run_delay_ns). */
struct xio_sched {
    int64_t cpu_ns, run_delay_ns, threads, preempted;
};

/* What recording costs the process, measured as it runs, since its image (fork child, session) started
 * recording: for 1 recorded call in XIO_SELF_EVERY (per thread), the ticks from the call's second clock read to
 * the end of its record (path resolution, descriptor table, the record written into the stream: streams.c),
 * and the CPU time of every flush (records converted and written to the file: the thread's CPU clock, which a
 * flush descheduled midway does not inflate). With one clock read's cost (clock.c), a reader estimates the
 * library's time on the recorded calls' path; what its memory traffic costs the program's own code besides is
 * not in it, nor the last flush's own time (counted after the status it writes). */
#define XIO_SELF_EVERY 64u
struct xio_self {
    int64_t sampled_ticks;
    uint64_t samples;
    int64_t flush_ns;
};

/* One call as a wrapper saw it, before it is encoded into its thread's record stream (streams.c). */
struct xio_ev {
    int64_t start_ns; /* in ticks (xio_ticks) until the stream's flush converts them */
    int64_t end_ns;
    int64_t offset;    /* start offset (reads, writes, mmap), resulting offset (seeks); -1 n/a */
    int64_t bytes;     /* bytes moved, -1 on failure or n/a */
    int64_t requested; /* bytes asked for; open flags; seek whence; old fd for dup; -1 n/a */
    int32_t fd;
    int32_t err;
    uint32_t path_id; /* 0: no path */
    uint8_t op;
    uint8_t kind;
};

/* One 32-byte slot of a thread's record stream, little-endian, struct format "<IIqIiihBB" (the file layout in
 * core.c). Most calls take one slot; a call whose values do not fit takes a second (struct xio_ext). */
struct xio_rec {
    uint32_t start; /* ns after the stream's time base */
    uint32_t dur;   /* ns */
    int64_t offset; /* in a TIME slot: the time base, CLOCK_REALTIME ns */
    uint32_t path_id;
    int32_t bytes; /* with XIO_SLOT_FAILED: the errno (bytes moved is -1); in a THREAD slot: the tid */
    int32_t requested;
    int16_t fd;
    uint8_t op;
    uint8_t flags; /* bits 0-3: descriptor kind; XIO_SLOT_* */
};
_Static_assert(sizeof(struct xio_rec) == 32, "record layout is part of the file format");

/* The second slot of a WIDE record: the full-width values, struct format "<qqqii". */
struct xio_ext {
    int64_t bytes;
    int64_t requested;
    int64_t dur;
    int32_t fd;
    int32_t err;
};
_Static_assert(sizeof(struct xio_ext) == 32, "record layout is part of the file format");

#define XIO_SLOT_KIND 0x0f
#define XIO_SLOT_FAILED 0x10 /* the call failed: `bytes` holds errno */
#define XIO_SLOT_WIDE 0x20   /* the next slot is a struct xio_ext */
#define XIO_SLOT_TIME 0x40   /* no call: `offset` is the new time base */
#define XIO_SLOT_THREAD 0x80 /* no call: `bytes` is the thread of the slots that follow */
/* A slot with op XIO_OP_PATH and no flags is no call either: `path_id` is a new path id, `bytes` the path's
 * length, and the path's bytes fill the next XIO_PATH_SLOTS(length) slots (zero-padded). */
#define XIO_PATH_SLOTS(len) (((len) + sizeof(struct xio_rec) - 1) / sizeof(struct xio_rec))

/* What the library knows about one descriptor. */
struct xio_fd {
    uint32_t path_id;
    uint8_t known; /* 0: never seen (or closed): discover with fstat on first use */
    uint8_t kind;
    uint8_t append;
    uint8_t pad;
    uint32_t pad2;
    int64_t offset;  /* POSIX file offset, tracked as Darshan does */
    int64_t soffset; /* position of the stdio stream on this descriptor */
};

/* One interposed function: its name, our wrapper and where its real address is kept. When the real function
 * cannot be found, the wrapper calls a stub that fails with ENOSYS, returning NULL if `returns_pointer`
 * and -1 otherwise. */
struct xio_hook {
    const char *name;
    void *wrapper;
    void **real;
    int returns_pointer;
};

/* Hook table entries: HOOK(read) names real_read and xio_read. */
#define HOOK(name) {#name, (void *)xio_##name, (void **)&real_##name, 0}
#define HOOK_PTR(name) {#name, (void *)xio_##name, (void **)&real_##name, 1}

/* ---- core.c: state, files, lifecycle; streams.c: per-thread record streams and their flushing ---- */
struct xio_state {
    /* read on every call: one cache line, apart from the lock */
    volatile int mode;  /* enum xio_mode; OFF: wrappers pass straight through */
    volatile int ended; /* the final status was written: record nothing more */
    uint32_t gen;       /* bumped at every new file (session start, fork child): streams restart */
    int fd_cap;
    struct xio_fd *fds;     /* the descriptor table (paths.c) */
    int64_t last_flush;     /* in ticks (xio_ticks) */
    int64_t flush_interval; /* XIO_FLUSH_INTERVAL_NS in ticks */
    volatile int init_state; /* 0 not started, 1 running, 2 done */
    int tsc;                 /* the wrappers' clock is the TSC (clock.c), else CLOCK_REALTIME ns */
    pid_t pid;
    pid_t ppid;
    int forked;
    int64_t start_ns; /* when this process image (or fork child) started recording */
    uint32_t seq;     /* session number within the image (attach, detach, attach ...) */
    /* Path ids are handed to the streams in blocks from here; never reset within a process image, so that
     * an id means one path across the image's sessions, and a fork child's ids (taken after the fork, see
     * xio_streams_fork_child) never name a path its parent named before it. */
    uint64_t path_ids __attribute__((aligned(64)));
    /* Added to by every thread, 1 call in XIO_SELF_EVERY: a line of its own, off the line read on every call. */
    struct xio_self self __attribute__((aligned(64)));
    int64_t clock_read_ps; /* one xio_ticks() read, in picoseconds (clock.c) */
    /* Taken for everything that is not a thread's own stream: flushing, claiming a stream, the shared stream,
     * session changes; and across fork (prepare handler). */
    pthread_mutex_t lock __attribute__((aligned(64)));
    int fork_locked;
    char dir[PATH_MAX];
    size_t dir_len;
    uint64_t max_records;
    uint64_t granted; /* records handed to the streams (up to max_records), in chunks */
    uint64_t records; /* records written to the file */
    uint64_t dropped[XIO_OP_COUNT];
    uint64_t dropped_bytes_read;
    uint64_t dropped_bytes_written;
    uint64_t reentrant_skipped;
    uint64_t paths_dropped;
    uint64_t write_errors;
    struct xio_sched sched_base; /* the image's (fork child's, session's) CPU figures when it started recording */
    /* The run-queue wait of the threads with a stream that ended since then, read as each ended (its stream's
     * destructor), and how many: a thread's file is gone once it has ended */
    int64_t ended_run_delay_ns, ended_threads;
};
extern struct xio_state xio;
/* initial-exec: a preloaded library has static TLS, and this avoids a __tls_get_addr call per access */
extern __thread int xio_guard __attribute__((tls_model("initial-exec")));
extern int xio_vfork_active; /* vforks under way (hooks_proc.c); -1: not tracked on this architecture */
/* A thread's run of calls of one kind on one descriptor, not yet recorded: readdir calls on a directory
 * (hooks_dir.c), or stdio's character, line and formatted calls and small freads and fwrites on a stream
 * (hooks_stdio.c). Written as one record when it ends: `calls` 0: none. */
struct xio_run {
    int64_t first;  /* ticks: the run's first call */
    int64_t busy;   /* ticks spent inside the calls */
    int64_t offset; /* the stream's position at the first call (stdio runs), else -1 */
    uint64_t bytes; /* bytes moved (stdio runs), entries returned (readdir runs) */
    int64_t asked;  /* the bytes the first call asked for, when `single` is set */
    uint32_t calls, path_id;
    int fd;
    uint8_t kind, op;
    uint8_t single; /* the first call's own operation (FREAD, FWRITE), which a run of that one call is recorded
                     * as, with `asked`; 0: the run's operation */
};
extern __thread struct xio_run xio_run __attribute__((tls_model("initial-exec")));
void xio_run_flush(void); /* records the calling thread's run, if any */
#define XIO_RUN_CALLS 4096u /* a run is recorded once it holds this many calls */
/* An fread or fwrite that asks for fewer bytes joins the thread's stdio run: it copies to or from the stream's
 * buffer (glibc gives a file one of st_blksize, 4 KiB or more) but at most one call in four of such sizes */
#define XIO_RUN_BYTES 1024u

int xio_init_early(void);
pid_t xio_sys_getpid(void);
void xio_resolve_reals(int attach);
int xio_session_start(int mode, const char *dir, const char *exclude, uint64_t max_records);
void xio_session_flush(int end, int final);
void xio_session_flush_signal(int sig); /* from a signal handler: never waits on the lock */
void xio_signals_init(void);            /* hooks_signal.c: stand in for default termination actions */
void xio_warn(const char *what, const char *path, int err);

#define XIO_GRANT_CHUNK 256u /* records a stream takes from the cap at a time */
void xio_emit(const struct xio_ev *ev);
int xio_take_grant(uint32_t *grant);
void xio_count_dropped(const struct xio_ev *ev);
int xio_streams_init(void);
void xio_streams_new_file(void);
void xio_streams_fork_child(void);
void xio_flush_locked(int end);
void xio_emit_run(const struct xio_ev *ev); /* a run's record (records.c): no call of its own to time */
uint32_t xio_emit_path(const char *path, size_t len);

/* CLOCK_REALTIME in ns (the vDSO: no system call), the clock every level of a run uses. */
static inline int64_t xio_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- clock.c: the records' clock ---- */
static inline int64_t xio_tsc(void)
{
#if defined(__x86_64__)
    return (int64_t)__builtin_ia32_rdtsc();
#else
    return 0;
#endif
}

/* What the wrappers time calls with: TSC ticks where clock.c found the TSC safe to use, else CLOCK_REALTIME
 * ns. Records hold ticks until a flush converts them (xio_clock_map); the file holds ns. */
static inline int64_t xio_ticks(void) { return XIO_LIKELY(xio.tsc) ? xio_tsc() : xio_now(); }

/* ns = ns + (t - ticks) * slope: the conversion of one flush's records. */
struct xio_clock_map {
    int64_t ticks, ns;
    double slope;
};
static inline int64_t xio_clock_ns(const struct xio_clock_map *m, int64_t t)
{
    return m->ns + (int64_t)((double)(t - m->ticks) * m->slope);
}
void xio_clock_init(void);    /* at a session's start: chooses the clock, calibrates, anchors */
void xio_clock_restart(void); /* in a fork child: a new anchor, the rate kept */
double xio_clock_slope(void); /* ns per tick: the last known rate (1 where the ticks are ns) */
int xio_clock_map(struct xio_clock_map *m); /* at a flush (under xio.lock): 0 when times are ns already */

/* Call the wrapper's real function, resolving it on first use (a wrapper can run before our constructor). */
#define REAL(fn) (XIO_LIKELY(real_##fn != NULL) ? real_##fn : (xio_resolve_reals(-1), real_##fn))

/* 1 when this call is to be recorded (the thread's guard is then set: call xio_leave), 0 to pass through. */
static inline int xio_enter(void)
{
    if (XIO_UNLIKELY(xio.mode == XIO_MODE_OFF || xio.ended)) {
        if (xio.init_state != 0 || !xio_init_early() || xio.ended)
            return 0;
    }
    if (XIO_UNLIKELY(xio_guard)) {
        __atomic_add_fetch(&xio.reentrant_skipped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    /* A vfork child runs on its parent's memory and thread state: it must change nothing. Asking the kernel
     * for our pid costs a syscall, so only while a vfork is under way (the vfork wrapper counts them). */
    if (XIO_UNLIKELY(__atomic_load_n(&xio_vfork_active, __ATOMIC_ACQUIRE) != 0) && xio_sys_getpid() != xio.pid)
        return 0;
    xio_guard = 1;
    return 1;
}

static inline void xio_leave(void) { xio_guard = 0; }

static inline void xio_ev_init(struct xio_ev *ev, int op, int64_t start_ns, int64_t end_ns)
{
    *ev = (struct xio_ev){.start_ns = start_ns, .end_ns = end_ns, .offset = -1, .bytes = -1, .requested = -1,
                          .fd = -1, .op = (uint8_t)op};
}

/* ---- paths.c: descriptor table; records.c: path resolution, exclusions ---- */
int xio_tables_init(void);
int xio_exclude_init(const char *spec);
struct xio_fd *xio_fd_discover(int fd);

/* The entry of a descriptor seen before (opened, dup'd, inherited), or NULL. */
static inline struct xio_fd *xio_fd_get_known(int fd)
{
    if ((unsigned)fd >= (unsigned)xio.fd_cap || !__atomic_load_n(&xio.fds[fd].known, __ATOMIC_ACQUIRE))
        return NULL;
    return &xio.fds[fd];
}

/* The entry of `fd`, discovered (one fstat) the first time it is seen without an open; NULL when not open. */
static inline struct xio_fd *xio_fd_get(int fd)
{
    struct xio_fd *e = xio_fd_get_known(fd);
    return XIO_LIKELY(e != NULL) ? e : xio_fd_discover(fd);
}

void xio_fd_opened(int fd, uint32_t path_id, int kind, int flags);
void xio_fd_closed(int fd);
void xio_fd_close_range(unsigned first, unsigned last);
void xio_fd_dup(int oldfd, int newfd);
void xio_fd_forget_all(void);
int xio_fd_max(void);
uint32_t xio_path_at(int dirfd, const char *path, int *excluded);
long xio_fd_link(int fd, char *buf, size_t cap);
int xio_path_excluded(const char *path, size_t len);
int xio_fd_kind_raw(int fd);

static inline int xio_kind_of_mode(mode_t mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return XIO_KIND_FILE;
    case S_IFDIR: return XIO_KIND_DIR;
    case S_IFIFO: return XIO_KIND_PIPE;
    case S_IFSOCK: return XIO_KIND_SOCKET;
    case S_IFCHR: return XIO_KIND_CHR;
    case S_IFBLK: return XIO_KIND_BLK;
    default: return XIO_KIND_UNKNOWN;
    }
}

static inline int xio_kind_seekable(int kind)
{
    return kind == XIO_KIND_FILE || kind == XIO_KIND_BLK || kind == XIO_KIND_DIR;
}

/* A successful fstat of a known descriptor says what it is (opens guess "file" without asking). */
static inline void xio_fd_set_mode(int fd, int ret, mode_t mode)
{
    struct xio_fd *e = xio_fd_get_known(fd);
    if (ret == 0 && e && e->kind != XIO_KIND_EXCLUDED)
        e->kind = (uint8_t)xio_kind_of_mode(mode);
}

/* Records of calls by path (records.c), and of calls on a descriptor (below, inlined into the wrappers).
 * `t0`/`t1`: ns before/after the real call. */
void xio_rec_open(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int fd, int err, int flags);
void xio_rec_path(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int ret, int err,
                  const struct stat *st, mode_t stx_mode);
void xio_rec_rename(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int64_t t0, int64_t t1,
                    int ret, int err);
long xio_sys_lseek(int fd, off_t off, int whence);

/* Calls that write at (and move) the descriptor's offset: an O_APPEND descriptor's writes land at the end. */
static inline int xio_is_write(int op)
{
    return op == XIO_OP_WRITE || op == XIO_OP_WRITEV || op == XIO_OP_SENDFILE_WRITE || op == XIO_OP_COPY_WRITE;
}

/* The record is about `e`'s file: its path (the id its open or discovery wrote) and kind. */
static inline void xio_ev_of_entry(struct xio_ev *r, struct xio_fd *e)
{
    r->path_id = e->path_id;
    r->kind = e->kind;
}

/* Reads and writes. `ret`: bytes moved or -1; `pos` >= 0 for positional calls (pread, pwrite: the tracked
 * offset stays), -1 for calls that start at and move the descriptor's offset. */
static inline void xio_rec_fd(int op, int fd, int64_t t0, int64_t t1, int64_t ret, int err, int64_t requested,
                              int64_t pos)
{
    struct xio_fd *e = xio_fd_get_known(fd);
    int found = 0; /* discovered now, after the call: its offset is where the call left the descriptor */
    if (XIO_UNLIKELY(e == NULL)) {
        e = xio_fd_discover(fd);
        found = e != NULL;
    }
    if (e && e->kind == XIO_KIND_EXCLUDED)
        return;
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = requested;
    r.bytes = ret >= 0 ? ret : -1;
    r.err = ret < 0 ? err : 0;
    if (e) {
        xio_ev_of_entry(&r, e);
        if (!xio_kind_seekable(e->kind)) {
            r.offset = -1;
        } else if (pos >= 0) {
            r.offset = pos;
        } else if (e->append && xio_is_write(op) && ret >= 0) {
            /* O_APPEND writes land at the end of the file, wherever the offset was */
            long end = xio_sys_lseek(fd, 0, SEEK_CUR);
            r.offset = end >= 0 ? end - ret : e->offset;
            if (end >= 0)
                e->offset = end;
        } else if (ret > 0 && found) {
            r.offset = e->offset >= ret ? e->offset - ret : 0;
        } else if (ret > 0) {
            r.offset = __atomic_fetch_add(&e->offset, ret, __ATOMIC_RELAXED);
        } else {
            r.offset = e->offset;
        }
    }
    xio_emit(&r);
}

/* Calls on a descriptor that move no data (close, fsync, fstat, lseek, mmap, dup). `e`: the descriptor's
 * entry, or a copy taken before the call (close), or NULL when unknown. */
static inline void xio_rec_entry(int op, int fd, struct xio_fd *e, int64_t t0, int64_t t1, int ret, int err,
                                 int64_t requested, int64_t offset)
{
    if (e && e->kind == XIO_KIND_EXCLUDED)
        return;
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = requested;
    r.offset = offset;
    r.err = ret < 0 ? err : 0;
    if (e)
        xio_ev_of_entry(&r, e);
    xio_emit(&r);
}

static inline void xio_rec_simple_fd(int op, int fd, int64_t t0, int64_t t1, int ret, int err,
                                     int64_t requested, int64_t offset)
{
    xio_rec_entry(op, fd, xio_fd_get(fd), t0, t1, ret, err, requested, offset);
}

/* ---- output.c: the record file, raw syscalls (the library's own I/O never goes through a wrapper) ---- */
struct iovec;
int64_t xio_output_open(void);
int xio_output_is_open(void);
void xio_output_close(void);
void xio_output_write(struct iovec *iov, int n);
int64_t xio_status_iov(int end, struct iovec *iov);
void xio_sched_read(struct xio_sched *out, int threads);
void xio_sched_thread_ended(pid_t tid);
long xio_sys_open(const char *path, int flags, int mode);
long xio_sys_close(int fd);
long xio_sys_write_all(int fd, const void *buf, size_t len);
long xio_sys_fstat(int fd, struct stat *st);
long xio_sys_readlink(const char *path, char *buf, size_t len);
void *xio_sys_mmap(size_t len);

/* ---- hook tables (one per hooks_*.c) and attach mode ---- */
extern const struct xio_hook xio_hooks_posix[];
extern const struct xio_hook xio_hooks_stat[];
extern const struct xio_hook xio_hooks_stdio[];
extern const struct xio_hook xio_hooks_dir[];
extern const struct xio_hook xio_hooks_proc[];
extern const struct xio_hook xio_hooks_signal[]; /* preload only: never patched in attach mode */
extern const struct xio_hook xio_hooks_attach_only[];
void xio_proc_set_libname(const char *path);
void xio_note_if_not_covered(pid_t pid, const char *path, char *const envp[]);
const char *xio_search_path(const char *file, char *buf, size_t cap);

int xio_attach_patch(char *err, size_t errlen);
void xio_attach_unpatch(void);
void xio_attach_rescan(void);
int xio_attach_supported(void);

#endif
