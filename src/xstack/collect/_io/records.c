/* Records of calls by path: resolving the path (absolute, normalised, not excluded) and writing it into the
 * record stream ahead of the record (streams.c), and what a new descriptor is. The records of calls on a descriptor are built inline in the
 * wrappers (xio.h); both go to xio_emit (streams.c), which takes them against the record cap (below). */
#include "xio.h"

#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_EXCLUDES 64

static char exclude_buf[PATH_MAX * 8];
static uint32_t exclude_off[MAX_EXCLUDES], exclude_len[MAX_EXCLUDES];
static int nexcludes;

/* ---- exclusions ---- */

static void add_exclude(const char *p, size_t n)
{
    static size_t used;
    if (nexcludes == 0)
        used = 0;
    if (n == 0 || nexcludes == MAX_EXCLUDES || used + n > sizeof exclude_buf)
        return;
    memcpy(exclude_buf + used, p, n);
    exclude_off[nexcludes] = (uint32_t)used;
    exclude_len[nexcludes++] = (uint32_t)n;
    used += n;
}

int xio_exclude_init(const char *spec)
{
    nexcludes = 0;
    /* our own record files: the directory with its slash, so that "/tmp/io" does not hide "/tmp/io.bin" */
    char own[PATH_MAX + 1];
    memcpy(own, xio.dir, xio.dir_len);
    own[xio.dir_len] = '/';
    add_exclude(own, xio.dir_len + 1);
    for (const char *s = spec; s && *s;) {
        const char *end = strchr(s, ':');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if (n && s[0] == '/')
            add_exclude(s, n);
        s = end ? end + 1 : s + n;
    }
    return 0;
}

int xio_path_excluded(const char *path, size_t len)
{
    for (int i = 0; i < nexcludes; i++)
        if (len >= exclude_len[i] && memcmp(path, exclude_buf + exclude_off[i], exclude_len[i]) == 0)
            return 1;
    return 0;
}

/* ---- path resolution ---- */

/* Lexical normalisation of an absolute path in place: "//", "/./" and "x/.." go. */
static size_t normalize(char *p, size_t n)
{
    size_t r = 0, w = 0;
    while (r < n) {
        while (r < n && p[r] == '/')
            r++;
        size_t s = r;
        while (r < n && p[r] != '/')
            r++;
        size_t len = r - s;
        if (len == 0 || (len == 1 && p[s] == '.'))
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (w > 0 && p[w - 1] != '/')
                w--;
            if (w > 0)
                w--;
            continue;
        }
        p[w++] = '/';
        memmove(p + w, p + s, len);
        w += len;
    }
    if (w == 0)
        p[w++] = '/';
    p[w] = 0;
    return w;
}

static char *append_int(char *p, int v)
{
    char tmp[12];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    *p = 0;
    return p;
}

/* What /proc/self/fd/<fd> points to, into buf; its length, or -1 when it is not an absolute path. */
long xio_fd_link(int fd, char *buf, size_t cap)
{
    char link[32] = "/proc/self/fd/";
    append_int(link + 14, fd);
    long n = xio_sys_readlink(link, buf, cap - 1);
    if (n <= 0 || buf[0] != '/')
        return -1;
    buf[n] = 0;
    return n;
}

/* The directory `dirfd` names, into buf; its length or -1. */
static long dir_of(int dirfd, char *buf, size_t cap)
{
    if (dirfd == AT_FDCWD) {
        long n = syscall(SYS_getcwd, buf, cap);
        return n > 0 && buf[0] == '/' ? (long)strlen(buf) : -1;
    }
    return xio_fd_link(dirfd, buf, cap); /* the library keeps no path bytes: the kernel's name for it */
}

/* 1 when an absolute, NUL-terminated path is already what normalize() makes of it (no "//", "." or ".."
 * component, no trailing slash): most are, and they are written without a copy. */
static int is_normal(const char *p, size_t n)
{
    if (n < 2)
        return n == 1;
    if (p[n - 1] == '/')
        return 0;
    for (const char *s = p; (s = memchr(s, '/', (size_t)(p + n - s))) != NULL; s++) {
        if (s[1] == '/')
            return 0;
        if (s[1] == '.' && (s[2] == '/' || s[2] == 0 || (s[2] == '.' && (s[3] == '/' || s[3] == 0))))
            return 0;
    }
    return 1;
}

static uint32_t emit_unless_excluded(const char *p, size_t n, int *excluded)
{
    if (xio_path_excluded(p, n)) {
        *excluded = 1;
        return 0;
    }
    return xio_emit_path(p, n);
}

/* Resolves `path` (relative to dirfd or the cwd) and writes it into this thread's record stream; its new
 * id, 0 when unknown, and when excluded (then *excluded is set). */
uint32_t xio_path_at(int dirfd, const char *path, int *excluded)
{
    char buf[PATH_MAX];
    size_t n = 0, len;
    *excluded = 0;
    if (!path)
        return 0;
    len = strlen(path);
    if (path[0] == '/' && len < sizeof buf && is_normal(path, len))
        return emit_unless_excluded(path, len, excluded);
    if (path[0] != '/') {
        long d = dir_of(dirfd, buf, sizeof buf);
        if (d < 0)
            return 0;
        n = (size_t)d;
        if (n + 1 + len >= sizeof buf)
            goto too_long;
        buf[n++] = '/';
    } else if (len >= sizeof buf) {
        goto too_long;
    }
    memcpy(buf + n, path, len);
    n = normalize(buf, n + len);
    return emit_unless_excluded(buf, n, excluded);
too_long:
    __atomic_add_fetch(&xio.paths_dropped, 1, __ATOMIC_RELAXED);
    return 0;
}


/* What a descriptor opened by path is, without a syscall where the flags or the path say: a directory with
 * O_DIRECTORY, else a regular file, except under /dev and /proc (devices, FIFOs) where one fstat asks. A
 * regular-looking path that is a FIFO is corrected by the program's own fstat, which nearly every open is
 * followed by (Python's open does one), see xio_fd_set_mode. An fstat per open cost ~0.3 us, a fifth of the
 * level's overhead on a loop of small-file reads. */
static int open_kind(int fd, const char *path, int flags)
{
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE) /* O_TMPFILE holds O_DIRECTORY's bit: the file made in that folder */
        return XIO_KIND_FILE;
#endif
    if (flags & O_DIRECTORY)
        return XIO_KIND_DIR;
    if (path && (strncmp(path, "/dev/", 5) == 0 || strncmp(path, "/proc/", 6) == 0))
        return xio_fd_kind_raw(fd);
    return XIO_KIND_FILE;
}

/* open, openat, creat, fopen: resolve the path, remember what the new descriptor is. An unnamed temporary file
 * (O_TMPFILE: Python's tempfile.TemporaryFile) is opened by its folder's path: it is recorded under the kernel's
 * name for it ("/tmp/#1234 (deleted)", its inode in that folder, as /proc/PID/fd and lsof show it), so that its
 * bytes are neither the folder's nor those of the folder's other unnamed files. */
void xio_rec_open(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int fd, int err, int flags)
{
    int excluded;
    uint32_t id;
#ifdef O_TMPFILE
    char unnamed[PATH_MAX];
    if (fd >= 0 && (flags & O_TMPFILE) == O_TMPFILE && xio_fd_link(fd, unnamed, sizeof unnamed) > 0)
        id = xio_path_at(AT_FDCWD, unnamed, &excluded);
    else
#endif
        id = xio_path_at(dirfd, path, &excluded);
    int kind = fd >= 0 ? open_kind(fd, path, flags) : XIO_KIND_UNKNOWN;
    if (fd >= 0)
        xio_fd_opened(fd, id, excluded ? XIO_KIND_EXCLUDED : kind, flags);
    if (excluded)
        return;
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.fd = fd;
    r.path_id = id;
    r.kind = (uint8_t)kind;
    r.requested = flags;
    r.err = fd < 0 ? err : 0;
    xio_emit(&r);
}

/* stat family by path: the kind comes from the result's mode. */
void xio_rec_path(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int ret, int err,
                  const struct stat *st, mode_t stx_mode)
{
    int excluded;
    uint32_t id = xio_path_at(dirfd, path, &excluded);
    if (excluded)
        return;
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.path_id = id;
    r.err = ret < 0 ? err : 0;
    if (ret == 0)
        r.kind = (uint8_t)xio_kind_of_mode(st ? st->st_mode : stx_mode);
    xio_emit(&r);
}

/* rename family: one record on the old path, whose `requested` is the new path's id (0: unknown or excluded).
 * As Darshan, nothing is recorded when the old path is excluded. The kind is what the new path is once the
 * call succeeded (one fstatat: a program renames rarely, and it tells a renamed folder from a file). */
void xio_rec_rename(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int64_t t0, int64_t t1,
                    int ret, int err)
{
    int excluded;
    uint32_t from = xio_path_at(olddirfd, oldpath, &excluded);
    if (excluded)
        return;
    uint32_t to = xio_path_at(newdirfd, newpath, &excluded);
    struct xio_ev r;
    xio_ev_init(&r, XIO_OP_RENAME, t0, t1);
    r.path_id = from;
    r.requested = to;
    r.err = ret < 0 ? err : 0;
#ifdef SYS_newfstatat
    struct stat st;
    if (ret == 0 && newpath && syscall(SYS_newfstatat, newdirfd, newpath, &st, AT_SYMLINK_NOFOLLOW) == 0)
        r.kind = (uint8_t)xio_kind_of_mode(st.st_mode);
#endif
    xio_emit(&r);
}

/* ---- runs of calls (xio.h): readdir calls; stdio's character, line and formatted calls, small freads, fwrites ---- */

__thread struct xio_run xio_run __attribute__((tls_model("initial-exec")));

void xio_run_flush(void)
{
    struct xio_run *p = &xio_run;
    if (!p->calls)
        return;
    struct xio_ev r;
    int alone = p->calls == 1 && p->single; /* one fread or fwrite: recorded as itself */
    xio_ev_init(&r, alone ? p->single : p->op, p->first, p->first + p->busy);
    r.fd = p->fd;
    r.path_id = p->path_id;
    r.kind = p->kind;
    r.offset = p->offset;
    r.bytes = (int64_t)p->bytes;
    r.requested = alone ? p->asked : p->calls;
    p->calls = 0; /* before xio_emit_run, which would flush the run again */
    p->single = 0;
    xio_emit_run(&r);
}

/* ---- the record cap: handed to the streams in chunks (streams.c) ---- */

/* Up to XIO_GRANT_CHUNK more records for a stream, within the process's cap; 0 once the cap is reached. */
int xio_take_grant(uint32_t *grant)
{
    uint64_t g = __atomic_load_n(&xio.granted, __ATOMIC_RELAXED);
    for (;;) {
        if (g >= xio.max_records)
            return 0;
        uint64_t n = xio.max_records - g < XIO_GRANT_CHUNK ? xio.max_records - g : XIO_GRANT_CHUNK;
        if (__atomic_compare_exchange_n(&xio.granted, &g, g + n, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            *grant = (uint32_t)n;
            return 1;
        }
    }
}

/* A call the record cap leaves out: counted by operation, with its bytes. */
void xio_count_dropped(const struct xio_ev *ev)
{
    __atomic_add_fetch(&xio.dropped[ev->op], 1, __ATOMIC_RELAXED);
    if (ev->bytes <= 0)
        return;
    switch (ev->op) {
    case XIO_OP_READ: case XIO_OP_PREAD: case XIO_OP_READV: case XIO_OP_FREAD: case XIO_OP_SENDFILE_READ:
    case XIO_OP_COPY_READ:
        __atomic_add_fetch(&xio.dropped_bytes_read, (uint64_t)ev->bytes, __ATOMIC_RELAXED);
        break;
    case XIO_OP_WRITE: case XIO_OP_PWRITE: case XIO_OP_WRITEV: case XIO_OP_FWRITE: case XIO_OP_SENDFILE_WRITE:
    case XIO_OP_COPY_WRITE:
        __atomic_add_fetch(&xio.dropped_bytes_written, (uint64_t)ev->bytes, __ATOMIC_RELAXED);
        break;
    default:
        break;
    }
}
