/* State, recording buffer, output file and lifecycle (init, fork, exit) of the io library.
 *
 * File layout (all little-endian; read by xstack/collect/_io_records.py):
 *   header  "XSTACKIO", u32 version, u32 header_bytes, i64 pid, i64 ppid, i64 start_ns, u32 mode,
 *           u32 flags (1: forked), u32 seq, u32 record_bytes, u32 exe_len, u32 argv_len, u32 names_len,
 *           u32 pad, i64 session_ns; then exe, argv (NUL-separated /proc/self/cmdline), names
 *           ("open,openat,...;unknown,file,...": op then kind names by code), zero-padded to 8 bytes.
 *   blocks  u32 kind, u32 count, u64 payload_bytes, then the payload:
 *           1 PATHS:  count x (u32 id, u32 len, bytes, zero pad to 8)
 *           2 OPS:    count x struct xio_rec (64 bytes)
 *           3 STATUS: u32 end, u32 nops, i64 end_ns, u64 records, max_records, dropped_bytes_read,
 *                     dropped_bytes_written, reentrant_skipped, paths_dropped, write_errors, nops x u64
 *                     calls dropped by the record cap, by op code.
 * Every flush writes its PATHS and OPS blocks and a STATUS block; the last STATUS tells how the process
 * ended (RUNNING: killed, or still running).
 *
 * One buffer per process behind one mutex, not one per thread: hooks hold the mutex only to copy 64 bytes
 * (and, every ~100 ms or 16,384 records, to write the buffer), a fork needs exactly one lock to take in the
 * prepare handler and re-initialise in the child, and a thread that exits leaves nothing behind to flush.
 * The reader sorts the records by start time.
 */
#include "xio.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct xio_state xio = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_records = XIO_DEFAULT_MAX_RECORDS};
__thread int xio_guard __attribute__((tls_model("initial-exec")));
static __thread pid_t tls_tid __attribute__((tls_model("initial-exec")));

#define REC_CAP (1u << 14) /* 1 MiB of records */
#define PBUF_CAP (256u << 10)

enum { BLOCK_PATHS = 1, BLOCK_OPS = 2, BLOCK_STATUS = 3 };

struct block_header {
    uint32_t kind;
    uint32_t count;
    uint64_t bytes;
};

struct status_block {
    uint32_t end, nops;
    int64_t end_ns;
    uint64_t records, max_records, dropped_bytes_read, dropped_bytes_written, reentrant_skipped, paths_dropped,
        write_errors;
    uint64_t dropped[XIO_OP_COUNT];
};

static struct xio_rec *recs;
static uint32_t nrec;
static char *pbuf;
static size_t pused;
static uint32_t npaths_buffered;
static int64_t last_flush_ns;

int64_t xio_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static pid_t current_tid(void)
{
    if (XIO_UNLIKELY(tls_tid == 0))
        tls_tid = (pid_t)syscall(SYS_gettid);
    return tls_tid;
}

static void flush_locked(int end)
{
    struct block_header bp = {BLOCK_PATHS, npaths_buffered, pused};
    struct block_header bo = {BLOCK_OPS, nrec, (uint64_t)nrec * sizeof(struct xio_rec)};
    struct block_header bs = {BLOCK_STATUS, 1, sizeof(struct status_block)};
    struct status_block st = {.end = (uint32_t)end, .nops = XIO_OP_COUNT, .end_ns = xio_now(),
                              .records = xio.records, .max_records = xio.max_records,
                              .dropped_bytes_read = xio.dropped_bytes_read,
                              .dropped_bytes_written = xio.dropped_bytes_written,
                              .reentrant_skipped = __atomic_load_n(&xio.reentrant_skipped, __ATOMIC_RELAXED),
                              .paths_dropped = xio.paths_dropped, .write_errors = xio.write_errors};
    memcpy(st.dropped, xio.dropped, sizeof st.dropped);
    struct iovec iov[6];
    int n = 0;
    if (pused) {
        iov[n++] = (struct iovec){&bp, sizeof bp};
        iov[n++] = (struct iovec){pbuf, pused};
    }
    if (nrec) {
        iov[n++] = (struct iovec){&bo, sizeof bo};
        iov[n++] = (struct iovec){recs, bo.bytes};
    }
    iov[n++] = (struct iovec){&bs, sizeof bs};
    iov[n++] = (struct iovec){&st, sizeof st};
    xio_output_write(iov, n);
    nrec = 0;
    pused = 0;
    npaths_buffered = 0;
    last_flush_ns = st.end_ns;
}

static void append_path_locked(uint32_t id)
{
    uint32_t len;
    const char *bytes = xio_path_bytes(id, &len);
    size_t need = (8 + len + 7) & ~(size_t)7;
    if (pused + need > PBUF_CAP)
        flush_locked(XIO_END_RUNNING);
    char *p = pbuf + pused;
    memcpy(p, &id, 4);
    memcpy(p + 4, &len, 4);
    memcpy(p + 8, bytes, len);
    memset(p + 8 + len, 0, need - 8 - len);
    pused += need;
    npaths_buffered++;
}

static void count_dropped_locked(const struct xio_rec *r)
{
    xio.dropped[r->op]++;
    if (r->bytes <= 0)
        return;
    switch (r->op) {
    case XIO_OP_READ: case XIO_OP_PREAD: case XIO_OP_READV: case XIO_OP_FREAD:
        xio.dropped_bytes_read += (uint64_t)r->bytes;
        break;
    case XIO_OP_WRITE: case XIO_OP_PWRITE: case XIO_OP_WRITEV: case XIO_OP_FWRITE:
        xio.dropped_bytes_written += (uint64_t)r->bytes;
        break;
    default:
        break;
    }
}

void xio_emit(struct xio_rec *r)
{
    r->tid = current_tid();
    pthread_mutex_lock(&xio.lock);
    if (!xio_output_is_open() || xio.ended) {
        pthread_mutex_unlock(&xio.lock);
        return;
    }
    if (r->op != XIO_OP_INHERIT) {
        if (xio.records >= xio.max_records) {
            count_dropped_locked(r);
            pthread_mutex_unlock(&xio.lock);
            return;
        }
        xio.records++;
    }
    if (r->path_id && xio_path_needs_write(r->path_id))
        append_path_locked(r->path_id);
    recs[nrec++] = *r;
    if (nrec == REC_CAP || r->start_ns + r->dur_ns - last_flush_ns > XIO_FLUSH_INTERVAL_NS)
        flush_locked(XIO_END_RUNNING);
    pthread_mutex_unlock(&xio.lock);
}

/* ---- lifecycle ---- */

/* Writes what is buffered and a status block. `final`: the process (or session) records nothing more. */
void xio_session_flush(int end, int final)
{
    if (xio.mode == XIO_MODE_OFF || xio.ended || xio_sys_getpid() != xio.pid)
        return; /* not recording, or a vfork child that shares the parent's memory: touch nothing */
    int saved_errno = errno, saved_guard = xio_guard;
    xio_guard = 1;
    pthread_mutex_lock(&xio.lock);
    flush_locked(end);
    if (final) {
        xio.ended = 1;
        xio_output_close();
    }
    pthread_mutex_unlock(&xio.lock);
    xio_guard = saved_guard;
    errno = saved_errno;
}

static void reset_counters(void)
{
    xio.records = 0;
    memset(xio.dropped, 0, sizeof xio.dropped);
    xio.dropped_bytes_read = xio.dropped_bytes_written = 0;
    xio.reentrant_skipped = xio.paths_dropped = xio.write_errors = 0;
    nrec = 0;
    pused = 0;
    npaths_buffered = 0;
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
    if (!recs) {
        recs = xio_sys_mmap(REC_CAP * sizeof(struct xio_rec));
        pbuf = xio_sys_mmap(PBUF_CAP);
    }
    if (!recs || !pbuf || xio_tables_init() != 0 || xio_exclude_init(exclude) != 0) {
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
    reset_counters();
    xio_paths_new_file();
    xio.mode = mode; /* the header records it */
    if ((last_flush_ns = xio_output_open()) < 0) {
        xio.mode = XIO_MODE_OFF;
        return -1;
    }
    xio.ended = 0;
    return 0;
}

int xio_enter_slow(void)
{
    /* A vfork child runs on its parent's memory and thread state: it must change nothing. Asking the kernel
     * for our pid costs a syscall, so only while a vfork is under way (the vfork wrapper counts them). */
    if (XIO_UNLIKELY(__atomic_load_n(&xio_vfork_active, __ATOMIC_ACQUIRE) != 0) && xio_sys_getpid() != xio.pid)
        return 0;
    xio_guard = 1;
    return 1;
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
    tls_tid = 0;
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
    reset_counters();
    xio_paths_new_file();
    if ((last_flush_ns = xio_output_open()) < 0) {
        xio.mode = XIO_MODE_OFF;
        xio_guard = 0;
        return;
    }
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
        struct xio_rec r;
        int64_t now = xio_now();
        xio_rec_init(&r, XIO_OP_INHERIT, now, now);
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
        if (dir && *dir)
            xio_session_start(XIO_MODE_PRELOAD, dir, getenv("XSTACK_IO_EXCLUDE"),
                              parse_max_records(getenv("XSTACK_IO_MAX_RECORDS")));
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

