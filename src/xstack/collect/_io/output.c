/* The library's own output: raw system calls (never the wrappers), the record file and its status block,
 * warnings. */
#include "xio.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The file header; the layout is described in core.c. */
struct file_header {
    char magic[8];
    uint32_t version, header_bytes;
    int64_t pid, ppid, start_ns;
    uint32_t mode, flags, seq, record_bytes;
    uint32_t exe_len, argv_len, names_len, pad;
    int64_t session_ns;
};

static int out_fd = -1;
static dev_t out_dev;
static ino_t out_ino;
static char out_path[PATH_MAX + 64];

/* ---- raw syscalls ---- */
long xio_sys_open(const char *path, int flags, int mode) { return syscall(SYS_openat, AT_FDCWD, path, flags, mode); }
long xio_sys_close(int fd) { return syscall(SYS_close, fd); }
long xio_sys_fstat(int fd, struct stat *st) { return syscall(SYS_fstat, fd, st); }
long xio_sys_lseek(int fd, off_t off, int whence) { return syscall(SYS_lseek, fd, off, whence); }
long xio_sys_readlink(const char *path, char *buf, size_t len)
{
    return syscall(SYS_readlinkat, AT_FDCWD, path, buf, len);
}
pid_t xio_sys_getpid(void) { return (pid_t)syscall(SYS_getpid); }

void *xio_sys_mmap(size_t len)
{
    void *p = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

long xio_sys_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        long n = syscall(SYS_write, fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static long writev_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        long w = syscall(SYS_writev, fd, iov, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (long)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

void xio_warn(const char *what, const char *path, int err)
{
    char msg[PATH_MAX + 256];
    size_t n = 0;
    const char *parts[] = {"xstack io: ", what, path ? " " : "", path ? path : "", err ? ": " : "",
                           err ? strerror(err) : "", "\n"};
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        size_t len = strlen(parts[i]);
        if (n + len >= sizeof(msg))
            break;
        memcpy(msg + n, parts[i], len);
        n += len;
    }
    xio_sys_write_all(2, msg, n);
}

/* ---- the output file ---- */

static char *append_num(char *p, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)(-v) : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *p++ = '-';
    while (n)
        *p++ = tmp[--n];
    return p;
}

static size_t read_small_file(const char *path, char *buf, size_t cap)
{
    long fd = xio_sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    size_t n = 0;
    if (fd < 0)
        return 0;
    while (n < cap) {
        long r = syscall(SYS_read, (int)fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    xio_sys_close((int)fd);
    return n;
}

static int write_header(int64_t session_ns)
{
    static char buf[sizeof(struct file_header) + PATH_MAX + 32768 + 1024];
    static const char names[] =
#define XIO_OP_NAME(code, name) name ","
        XIO_OPS(XIO_OP_NAME)
#undef XIO_OP_NAME
            ";" XIO_KIND_NAMES;
    struct file_header h = {.magic = "XSTACKIO", .version = XIO_VERSION, .pid = xio.pid, .ppid = xio.ppid,
                            .start_ns = xio.start_ns, .mode = (uint32_t)xio.mode, .flags = (xio.forked ? 1u : 0u) | (xio.tsc ? 2u : 0u),
                            .seq = xio.seq, .record_bytes = sizeof(struct xio_rec), .session_ns = session_ns};
    char *p = buf + sizeof h;
    long exe = xio_sys_readlink("/proc/self/exe", p, PATH_MAX);
    h.exe_len = exe > 0 ? (uint32_t)exe : 0;
    p += h.exe_len;
    h.argv_len = (uint32_t)read_small_file("/proc/self/cmdline", p, 32768);
    p += h.argv_len;
    h.names_len = sizeof(names) - 1;
    memcpy(p, names, h.names_len);
    p += h.names_len;
    while ((p - buf) % 8)
        *p++ = 0;
    h.header_bytes = (uint32_t)(p - buf);
    memcpy(buf, &h, sizeof h);
    return (int)xio_sys_write_all(out_fd, buf, h.header_bytes);
}

/* Creates this session's file and writes its header; the session's start time, or -1. */
int64_t xio_output_open(void)
{
    int64_t session_ns = xio_now();
    char *p = out_path;
    memcpy(p, xio.dir, xio.dir_len);
    p += xio.dir_len;
    *p++ = '/';
    p = append_num(p, xio.pid);
    *p++ = '-';
    p = append_num(p, xio.start_ns);
    *p++ = '-';
    p = append_num(p, xio.seq);
    memcpy(p, ".xio", 5);
    long fd = xio_sys_open(out_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        xio_warn("cannot create", out_path, errno);
        return -1;
    }
    out_fd = (int)fd;
    struct stat st;
    if (xio_sys_fstat(out_fd, &st) == 0) {
        out_dev = st.st_dev;
        out_ino = st.st_ino;
    }
    if (write_header(session_ns) != 0) {
        xio_warn("cannot write", out_path, errno);
        xio_output_close();
        return -1;
    }
    return session_ns;
}

/* The program may have closed our descriptor (close-all loops) and reused its number: check before
 * writing, so records never land in one of its files, and reopen ours. */
static int output_still_ours(void)
{
    struct stat st;
    if (xio_sys_fstat(out_fd, &st) == 0 && st.st_dev == out_dev && st.st_ino == out_ino)
        return 1;
    long fd = xio_sys_open(out_path, O_WRONLY | O_APPEND | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    out_fd = (int)fd;
    return 1;
}

int xio_output_is_open(void) { return out_fd >= 0; }

void xio_output_close(void)
{
    if (out_fd >= 0)
        xio_sys_close(out_fd);
    out_fd = -1;
}

/* The STATUS block's payload (file layout in core.c). */
struct status_block {
    uint32_t end, nops;
    int64_t end_ns;
    uint64_t records, max_records, dropped_bytes_read, dropped_bytes_written, reentrant_skipped, paths_dropped,
        write_errors;
    uint64_t dropped[XIO_OP_COUNT];
    /* since the image (fork child, session) started recording (struct xio_sched); run_delay_ns and threads
     * only in a final status (0 in the others) */
    int64_t cpu_ns, run_delay_ns, threads, preempted;
    /* what recording cost since then (struct xio_self), in ns, and one clock read's cost */
    int64_t self_ns, self_samples, flush_ns, clock_read_ps;
};

/* The run-queue wait (ns) in a schedstat file's text: "<on-cpu ns> <run-queue ns> <timeslices>\n". */
static int64_t schedstat_wait(const char *text)
{
    const char *p = text;
    while (*p && *p != ' ')
        p++;
    int64_t v = 0;
    for (p += *p == ' '; *p >= '0' && *p <= '9'; p++)
        v = v * 10 + (*p - '0');
    return v;
}

/* The run-queue wait (ns) of thread `tid` of this process, from its schedstat file; -1 where unreadable. */
static int64_t thread_run_delay(const char *tid)
{
    char path[64], text[128];
    size_t len = strlen(tid);
    if (len > 20)
        return -1;
    memcpy(path, "/proc/self/task/", 16);
    memcpy(path + 16, tid, len);
    memcpy(path + 16 + len, "/schedstat", 11);
    long fd = xio_sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return -1; /* the thread ended since the listing */
    long got = syscall(SYS_read, (int)fd, text, sizeof text - 1);
    xio_sys_close((int)fd);
    if (got <= 0)
        return -1;
    text[got] = 0;
    return schedstat_wait(text);
}

/* The run-queue waits of the process's live threads into out (summed, and how many were read). */
static void read_run_delay(struct xio_sched *out)
{
    long dir = xio_sys_open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dir < 0)
        return;
    char buf[4096];
    for (;;) {
        long n = syscall(SYS_getdents64, (int)dir, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long at = 0; at < n;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (void *)(buf + at);
            at += d->reclen;
            if (d->name[0] < '0' || d->name[0] > '9')
                continue;
            int64_t wait = thread_run_delay(d->name);
            if (wait < 0)
                continue;
            out->run_delay_ns += wait;
            out->threads++;
        }
    }
    xio_sys_close((int)dir);
}

void xio_sched_read(struct xio_sched *out, int threads)
{
    struct rusage ru;
    *out = (struct xio_sched){0};
    if (syscall(SYS_getrusage, RUSAGE_SELF, &ru) == 0) {
        out->cpu_ns = ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
                      ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
        out->preempted = ru.ru_nivcsw;
    }
    if (threads) {
        read_run_delay(out);
        out->run_delay_ns += __atomic_load_n(&xio.ended_run_delay_ns, __ATOMIC_RELAXED);
        out->threads += __atomic_load_n(&xio.ended_threads, __ATOMIC_RELAXED);
    }
}

/* Thread `tid` (the caller) is ending: its run-queue wait is read now, as its schedstat file goes with it. */
void xio_sched_thread_ended(pid_t tid)
{
    char name[24];
    int len = 0;
    char digits[24];
    for (unsigned v = (unsigned)tid; len == 0 || v; v /= 10)
        digits[len++] = (char)('0' + v % 10);
    for (int i = 0; i < len; i++)
        name[i] = digits[len - 1 - i];
    name[len] = 0;
    int64_t wait = thread_run_delay(name);
    if (wait < 0)
        return;
    __atomic_add_fetch(&xio.ended_run_delay_ns, wait, __ATOMIC_RELAXED);
    __atomic_add_fetch(&xio.ended_threads, 1, __ATOMIC_RELAXED);
}

/* The STATUS block into iov[0] and iov[1] (static storage, valid until the next call; callers hold
 * xio.lock); returns its end_ns. */
int64_t xio_status_iov(int end, struct iovec *iov)
{
    static struct xio_block_header bs = {XIO_BLOCK_STATUS, 1, sizeof(struct status_block)};
    static struct status_block st;
    st = (struct status_block){.end = (uint32_t)end, .nops = XIO_OP_COUNT, .end_ns = xio_now(),
                               .records = xio.records, .max_records = xio.max_records,
                               .dropped_bytes_read = __atomic_load_n(&xio.dropped_bytes_read, __ATOMIC_RELAXED),
                               .dropped_bytes_written = __atomic_load_n(&xio.dropped_bytes_written, __ATOMIC_RELAXED),
                               .reentrant_skipped = __atomic_load_n(&xio.reentrant_skipped, __ATOMIC_RELAXED),
                               .paths_dropped = __atomic_load_n(&xio.paths_dropped, __ATOMIC_RELAXED),
                               .write_errors = xio.write_errors};
    for (int op = 0; op < XIO_OP_COUNT; op++)
        st.dropped[op] = __atomic_load_n(&xio.dropped[op], __ATOMIC_RELAXED);
    struct xio_sched now, *base = &xio.sched_base;
    xio_sched_read(&now, end != XIO_END_RUNNING); /* the threads' files only once: a flush is on the calls' path */
    st.cpu_ns = now.cpu_ns > base->cpu_ns ? now.cpu_ns - base->cpu_ns : 0;
    st.preempted = now.preempted > base->preempted ? now.preempted - base->preempted : 0;
    st.threads = now.threads;
    st.run_delay_ns = now.threads && now.run_delay_ns > base->run_delay_ns ? now.run_delay_ns - base->run_delay_ns : 0;
    double slope = xio_clock_slope();
    st.self_ns = (int64_t)((double)__atomic_load_n(&xio.self.sampled_ticks, __ATOMIC_RELAXED) * slope);
    st.self_samples = (int64_t)__atomic_load_n(&xio.self.samples, __ATOMIC_RELAXED);
    st.flush_ns = xio.self.flush_ns;
    st.clock_read_ps = xio.clock_read_ps;
    iov[0] = (struct iovec){&bs, sizeof bs};
    iov[1] = (struct iovec){&st, sizeof st};
    return st.end_ns;
}

/* Appends the blocks to the file; counts and reports (once) a failed write. */
void xio_output_write(struct iovec *iov, int n)
{
    if (out_fd < 0 || !output_still_ours() || writev_all(out_fd, iov, n) != 0) {
        if (xio.write_errors++ == 0)
            xio_warn("cannot write", out_path, errno);
    }
}
