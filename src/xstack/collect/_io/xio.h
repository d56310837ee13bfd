/* The io level's interposition library: declarations shared by its C files.
 *
 * The library is loaded into a profiled process either by LD_PRELOAD (preload mode: its exported wrappers
 * come first in the global symbol scope) or by dlopen from Python (attach mode: the wrappers are reached by
 * patching the GOT entries of the loaded objects, see attach.c). Every wrapper calls the real function,
 * then records one fixed-size record into a per-process buffer that core.c writes to
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

#define XIO_EXPORT __attribute__((visibility("default")))
#define XIO_ALIAS(impl) __attribute__((alias(#impl), visibility("default")))
#define XIO_LIKELY(x) __builtin_expect(!!(x), 1)
#define XIO_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define XIO_VERSION 1
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
    X(FFLUSH, "fflush") X(INHERIT, "inherit")

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
enum xio_end { XIO_END_RUNNING = 0, XIO_END_EXIT, XIO_END__EXIT, XIO_END_EXEC, XIO_END_DETACH };

/* One operation: 64 bytes, little-endian, read by struct format "<qqqqqiiIiBB6x". */
struct xio_rec {
    int64_t start_ns;
    int64_t dur_ns;
    int64_t offset;    /* start offset (reads, writes, mmap), resulting offset (seeks); -1 n/a */
    int64_t bytes;     /* bytes moved, -1 on failure or n/a */
    int64_t requested; /* bytes asked for; open flags; seek whence; old fd for dup; -1 n/a */
    int32_t tid;
    int32_t fd;
    uint32_t path_id; /* 0: no path */
    int32_t err;
    uint8_t op;
    uint8_t kind;
    uint8_t pad[6];
};
_Static_assert(sizeof(struct xio_rec) == 64, "record layout is part of the file format");

/* What the library knows about one descriptor. */
struct xio_fd {
    uint32_t path_id;
    uint8_t known; /* 0: never seen (or closed): discover with fstat on first use */
    uint8_t kind;
    uint8_t append;
    uint8_t pad;
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

/* ---- core.c: state, recording, files, lifecycle ---- */
struct xio_state {
    volatile int mode;       /* enum xio_mode; OFF: wrappers pass straight through */
    volatile int init_state; /* 0 not started, 1 running, 2 done */
    volatile int ended;      /* the final status was written: record nothing more */
    pid_t pid;
    pid_t ppid;
    int forked;
    int64_t start_ns; /* when this process image (or fork child) started recording */
    uint32_t seq;     /* session number within the image (attach, detach, attach ...) */
    pthread_mutex_t lock;
    int fork_locked;
    char dir[PATH_MAX];
    size_t dir_len;
    uint64_t max_records;
    uint64_t records;
    uint64_t dropped[XIO_OP_COUNT];
    uint64_t dropped_bytes_read;
    uint64_t dropped_bytes_written;
    uint64_t reentrant_skipped;
    uint64_t paths_dropped;
    uint64_t write_errors;
};
extern struct xio_state xio;
/* initial-exec: a preloaded library has static TLS, and this avoids a __tls_get_addr call per access */
extern __thread int xio_guard __attribute__((tls_model("initial-exec")));
extern int xio_vfork_active; /* vforks under way (hooks_proc.c); -1: not tracked on this architecture */

int xio_enter_slow(void);
int xio_init_early(void);
void xio_emit(struct xio_rec *rec);
int64_t xio_now(void);
pid_t xio_sys_getpid(void);
void xio_resolve_reals(int attach);
int xio_session_start(int mode, const char *dir, const char *exclude, uint64_t max_records);
void xio_session_flush(int end, int final);
void xio_warn(const char *what, const char *path, int err);

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
    return xio_enter_slow();
}

static inline void xio_leave(void) { xio_guard = 0; }

static inline void xio_rec_init(struct xio_rec *r, int op, int64_t start_ns, int64_t end_ns)
{
    *r = (struct xio_rec){.start_ns = start_ns, .dur_ns = end_ns - start_ns, .offset = -1, .bytes = -1,
                          .requested = -1, .fd = -1, .op = (uint8_t)op};
}

/* ---- paths.c: descriptor table, path interning, exclusions ---- */
int xio_tables_init(void);
int xio_exclude_init(const char *spec);
struct xio_fd *xio_fd_get(int fd);
struct xio_fd *xio_fd_get_known(int fd);
void xio_fd_opened(int fd, uint32_t path_id, int kind, int flags);
void xio_fd_closed(int fd);
void xio_fd_close_range(unsigned first, unsigned last);
void xio_fd_dup(int oldfd, int newfd);
void xio_fd_forget_all(void);
int xio_fd_max(void);
int xio_kind_of_mode(mode_t mode);
int xio_kind_seekable(int kind);
uint32_t xio_path_at(int dirfd, const char *path, int *excluded);
int xio_path_excluded(const char *path, size_t len);
uint32_t xio_intern_locked(const char *path, size_t len);
const char *xio_path_bytes(uint32_t id, uint32_t *len);
int xio_path_needs_write(uint32_t id);
void xio_paths_new_file(void);
int xio_fd_kind_raw(int fd);
void xio_fd_set_mode(int fd, int ret, mode_t mode);

/* Record helpers used by the wrappers (hooks_*.c). `t0`/`t1`: ns before/after the real call. */
void xio_rec_fd(int op, int fd, int64_t t0, int64_t t1, int64_t ret, int err, int64_t requested, int64_t pos);
void xio_rec_open(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int fd, int err, int flags);
void xio_rec_path(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int ret, int err,
                  const struct stat *st, mode_t stx_mode);
void xio_rec_simple_fd(int op, int fd, int64_t t0, int64_t t1, int ret, int err, int64_t requested,
                       int64_t offset);
void xio_rec_entry(int op, int fd, const struct xio_fd *e, int64_t t0, int64_t t1, int ret, int err,
                   int64_t requested, int64_t offset);

/* ---- output.c: the record file, raw syscalls (the library's own I/O never goes through a wrapper) ---- */
struct iovec;
int64_t xio_output_open(void);
int xio_output_is_open(void);
void xio_output_close(void);
void xio_output_write(struct iovec *iov, int n);
long xio_sys_open(const char *path, int flags, int mode);
long xio_sys_close(int fd);
long xio_sys_write_all(int fd, const void *buf, size_t len);
long xio_sys_fstat(int fd, struct stat *st);
long xio_sys_lseek(int fd, off_t off, int whence);
long xio_sys_readlink(const char *path, char *buf, size_t len);
void *xio_sys_mmap(size_t len);

/* ---- hook tables (one per hooks_*.c) and attach mode ---- */
extern const struct xio_hook xio_hooks_posix[];
extern const struct xio_hook xio_hooks_stat[];
extern const struct xio_hook xio_hooks_stdio[];
extern const struct xio_hook xio_hooks_proc[];
extern const struct xio_hook xio_hooks_attach_only[];
void xio_proc_set_libname(const char *path);
void xio_note_if_not_covered(pid_t pid, const char *path, char *const envp[]);
const char *xio_search_path(const char *file, char *buf, size_t cap);

int xio_attach_patch(char *err, size_t errlen);
void xio_attach_unpatch(void);
void xio_attach_rescan(void);
int xio_attach_supported(void);

#endif
