/* Wrappers of the POSIX descriptor calls: open family, close, reads, writes, in-kernel copies, seeks, syncs,
 * mmap, munmap and mremap, dup; and rename.
 *
 * Each wrapper: pass straight through unless xio_enter() says to record; time the real call; keep errno as
 * the real call left it; record; restore errno. Variants (open64, __open_2, pread64, preadv2, ...) are
 * recorded under their base operation.
 */
#include "xio.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define NEEDS_MODE(flags) (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE)

static int64_t iov_bytes(const struct iovec *iov, int n)
{
    int64_t total = 0;
    for (int i = 0; iov && i < n; i++)
        total += (int64_t)iov[i].iov_len;
    return total;
}

/* ---- open family ---- */

#define DEFINE_OPEN(name, op)                                                                                    \
    static int (*real_##name)(const char *, int, ...);                                                           \
    static int xio_##name(const char *path, int flags, ...)                                                      \
    {                                                                                                            \
        int mode = 0;                                                                                            \
        if (NEEDS_MODE(flags)) {                                                                                 \
            va_list ap;                                                                                          \
            va_start(ap, flags);                                                                                 \
            mode = va_arg(ap, int);                                                                              \
            va_end(ap);                                                                                          \
        }                                                                                                        \
        if (!xio_enter())                                                                                        \
            return REAL(name)(path, flags, mode);                                                                \
        int64_t t0 = xio_ticks();                                                                                  \
        int fd = REAL(name)(path, flags, mode);                                                                  \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_open(op, AT_FDCWD, path, t0, t1, fd, err, flags);                                                \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return fd;                                                                                               \
    }

#define DEFINE_OPENAT(name)                                                                                      \
    static int (*real_##name)(int, const char *, int, ...);                                                      \
    static int xio_##name(int dirfd, const char *path, int flags, ...)                                           \
    {                                                                                                            \
        int mode = 0;                                                                                            \
        if (NEEDS_MODE(flags)) {                                                                                 \
            va_list ap;                                                                                          \
            va_start(ap, flags);                                                                                 \
            mode = va_arg(ap, int);                                                                              \
            va_end(ap);                                                                                          \
        }                                                                                                        \
        if (!xio_enter())                                                                                        \
            return REAL(name)(dirfd, path, flags, mode);                                                         \
        int64_t t0 = xio_ticks();                                                                                  \
        int fd = REAL(name)(dirfd, path, flags, mode);                                                           \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_open(XIO_OP_OPENAT, dirfd, path, t0, t1, fd, err, flags);                                        \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return fd;                                                                                               \
    }

#define DEFINE_CREAT(name)                                                                                       \
    static int (*real_##name)(const char *, mode_t);                                                             \
    static int xio_##name(const char *path, mode_t mode)                                                         \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(path, mode);                                                                       \
        int64_t t0 = xio_ticks();                                                                                  \
        int fd = REAL(name)(path, mode);                                                                         \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_open(XIO_OP_CREAT, AT_FDCWD, path, t0, t1, fd, err, O_CREAT | O_WRONLY | O_TRUNC);               \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return fd;                                                                                               \
    }

/* The fortified forms take no mode (glibc calls them only without O_CREAT). */
#define DEFINE_OPEN_2(name, op)                                                                                  \
    static int (*real_##name)(const char *, int);                                                                \
    static int xio_##name(const char *path, int flags)                                                           \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(path, flags);                                                                      \
        int64_t t0 = xio_ticks();                                                                                  \
        int fd = REAL(name)(path, flags);                                                                        \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_open(op, AT_FDCWD, path, t0, t1, fd, err, flags);                                                \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return fd;                                                                                               \
    }

#define DEFINE_OPENAT_2(name)                                                                                    \
    static int (*real_##name)(int, const char *, int);                                                           \
    static int xio_##name(int dirfd, const char *path, int flags)                                                \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(dirfd, path, flags);                                                               \
        int64_t t0 = xio_ticks();                                                                                  \
        int fd = REAL(name)(dirfd, path, flags);                                                                 \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_open(XIO_OP_OPENAT, dirfd, path, t0, t1, fd, err, flags);                                        \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return fd;                                                                                               \
    }

DEFINE_OPEN(open, XIO_OP_OPEN)
DEFINE_OPEN(open64, XIO_OP_OPEN)
DEFINE_OPENAT(openat)
DEFINE_OPENAT(openat64)
DEFINE_CREAT(creat)
DEFINE_CREAT(creat64)
DEFINE_OPEN_2(__open_2, XIO_OP_OPEN)
DEFINE_OPEN_2(__open64_2, XIO_OP_OPEN)
DEFINE_OPENAT_2(__openat_2)
DEFINE_OPENAT_2(__openat64_2)

extern int open(const char *, int, ...) XIO_ALIAS(xio_open);
extern int open64(const char *, int, ...) XIO_ALIAS(xio_open64);
extern int openat(int, const char *, int, ...) XIO_ALIAS(xio_openat);
extern int openat64(int, const char *, int, ...) XIO_ALIAS(xio_openat64);
extern int creat(const char *, mode_t) XIO_ALIAS(xio_creat);
extern int creat64(const char *, mode_t) XIO_ALIAS(xio_creat64);
extern int __open_2(const char *, int) XIO_ALIAS(xio___open_2);
extern int __open64_2(const char *, int) XIO_ALIAS(xio___open64_2);
extern int __openat_2(int, const char *, int) XIO_ALIAS(xio___openat_2);
extern int __openat64_2(int, const char *, int) XIO_ALIAS(xio___openat64_2);

/* ---- close ---- */

static int (*real_close)(int);
static int xio_close(int fd)
{
    if (!xio_enter())
        return REAL(close)(fd);
    int saved = errno;
    struct xio_fd *e = xio_fd_get(fd);
    struct xio_fd before = e ? *e : (struct xio_fd){0};
    /* forgotten before the call: once the kernel frees the descriptor, another thread's open may get it and
     * set its entry, which forgetting it afterwards would wipe (its next read then found its offset past the
     * call, by discovery) */
    xio_fd_closed(fd);
    errno = saved;
    int64_t t0 = xio_ticks();
    int ret = REAL(close)(fd);
    int err = errno;
    int64_t t1 = xio_ticks();
    xio_rec_entry(XIO_OP_CLOSE, fd, e ? &before : NULL, t0, t1, ret, err, -1, -1);
    xio_leave();
    errno = err;
    return ret;
}
extern int close(int) XIO_ALIAS(xio_close);

static int (*real_close_range)(unsigned, unsigned, int);
static int xio_close_range(unsigned first, unsigned last, int flags)
{
    if (!xio_enter())
        return REAL(close_range)(first, last, flags);
    if (!(flags & CLOSE_RANGE_CLOEXEC))
        xio_fd_close_range(first, last); /* before the call, as close does; one that fails is discovered again */
    int ret = REAL(close_range)(first, last, flags);
    int err = errno;
    xio_leave();
    errno = err;
    return ret;
}
extern int close_range(unsigned, unsigned, int) XIO_ALIAS(xio_close_range);

static void (*real_closefrom)(int);
static void xio_closefrom(int lowfd)
{
    if (!xio_enter()) {
        REAL(closefrom)(lowfd);
        return;
    }
    xio_fd_close_range(lowfd < 0 ? 0 : (unsigned)lowfd, ~0u); /* before the call, as close does */
    REAL(closefrom)(lowfd);
    int err = errno;
    xio_leave();
    errno = err;
}
extern void closefrom(int) XIO_ALIAS(xio_closefrom);

/* ---- reads and writes ---- */

/* `call` is the real call's expression; `pos`: see xio_rec_fd. */
#define RECORD_RW(op, type, call, fd, requested, pos)                                                            \
    if (!xio_enter())                                                                                            \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                      \
    type ret = call;                                                                                             \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                      \
    xio_rec_fd(op, fd, t0, t1, (int64_t)ret, err, requested, pos);                                               \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

static ssize_t (*real_read)(int, void *, size_t);
static ssize_t xio_read(int fd, void *buf, size_t n) { RECORD_RW(XIO_OP_READ, ssize_t, REAL(read)(fd, buf, n), fd, (int64_t)n, -1) }
static ssize_t (*real___read_chk)(int, void *, size_t, size_t);
static ssize_t xio___read_chk(int fd, void *buf, size_t n, size_t buflen)
{
    RECORD_RW(XIO_OP_READ, ssize_t, REAL(__read_chk)(fd, buf, n, buflen), fd, (int64_t)n, -1)
}
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t xio_pread(int fd, void *buf, size_t n, off_t off)
{
    RECORD_RW(XIO_OP_PREAD, ssize_t, REAL(pread)(fd, buf, n, off), fd, (int64_t)n, off)
}
static ssize_t (*real_pread64)(int, void *, size_t, off64_t);
static ssize_t xio_pread64(int fd, void *buf, size_t n, off64_t off)
{
    RECORD_RW(XIO_OP_PREAD, ssize_t, REAL(pread64)(fd, buf, n, off), fd, (int64_t)n, off)
}
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t xio_readv(int fd, const struct iovec *iov, int cnt)
{
    RECORD_RW(XIO_OP_READV, ssize_t, REAL(readv)(fd, iov, cnt), fd, iov_bytes(iov, cnt), -1)
}
static ssize_t (*real_preadv)(int, const struct iovec *, int, off_t);
static ssize_t xio_preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
    RECORD_RW(XIO_OP_PREAD, ssize_t, REAL(preadv)(fd, iov, cnt, off), fd, iov_bytes(iov, cnt), off)
}
static ssize_t (*real_preadv64)(int, const struct iovec *, int, off64_t);
static ssize_t xio_preadv64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    RECORD_RW(XIO_OP_PREAD, ssize_t, REAL(preadv64)(fd, iov, cnt, off), fd, iov_bytes(iov, cnt), off)
}
/* preadv2 with offset -1 reads at (and moves) the current offset, as readv does. */
static ssize_t (*real_preadv2)(int, const struct iovec *, int, off_t, int);
static ssize_t xio_preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    RECORD_RW(off < 0 ? XIO_OP_READV : XIO_OP_PREAD, ssize_t, REAL(preadv2)(fd, iov, cnt, off, flags), fd,
              iov_bytes(iov, cnt), off < 0 ? -1 : off)
}
static ssize_t (*real_preadv64v2)(int, const struct iovec *, int, off64_t, int);
static ssize_t xio_preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
    RECORD_RW(off < 0 ? XIO_OP_READV : XIO_OP_PREAD, ssize_t, REAL(preadv64v2)(fd, iov, cnt, off, flags), fd,
              iov_bytes(iov, cnt), off < 0 ? -1 : off)
}
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t xio_write(int fd, const void *buf, size_t n)
{
    RECORD_RW(XIO_OP_WRITE, ssize_t, REAL(write)(fd, buf, n), fd, (int64_t)n, -1)
}
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t xio_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    RECORD_RW(XIO_OP_PWRITE, ssize_t, REAL(pwrite)(fd, buf, n, off), fd, (int64_t)n, off)
}
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static ssize_t xio_pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    RECORD_RW(XIO_OP_PWRITE, ssize_t, REAL(pwrite64)(fd, buf, n, off), fd, (int64_t)n, off)
}
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t xio_writev(int fd, const struct iovec *iov, int cnt)
{
    RECORD_RW(XIO_OP_WRITEV, ssize_t, REAL(writev)(fd, iov, cnt), fd, iov_bytes(iov, cnt), -1)
}
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t xio_pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
    RECORD_RW(XIO_OP_PWRITE, ssize_t, REAL(pwritev)(fd, iov, cnt, off), fd, iov_bytes(iov, cnt), off)
}
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off64_t);
static ssize_t xio_pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
    RECORD_RW(XIO_OP_PWRITE, ssize_t, REAL(pwritev64)(fd, iov, cnt, off), fd, iov_bytes(iov, cnt), off)
}
static ssize_t (*real_pwritev2)(int, const struct iovec *, int, off_t, int);
static ssize_t xio_pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
    RECORD_RW(off < 0 ? XIO_OP_WRITEV : XIO_OP_PWRITE, ssize_t, REAL(pwritev2)(fd, iov, cnt, off, flags), fd,
              iov_bytes(iov, cnt), off < 0 ? -1 : off)
}
static ssize_t (*real_pwritev64v2)(int, const struct iovec *, int, off64_t, int);
static ssize_t xio_pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
    RECORD_RW(off < 0 ? XIO_OP_WRITEV : XIO_OP_PWRITE, ssize_t, REAL(pwritev64v2)(fd, iov, cnt, off, flags), fd,
              iov_bytes(iov, cnt), off < 0 ? -1 : off)
}

extern ssize_t read(int, void *, size_t) XIO_ALIAS(xio_read);
extern ssize_t __read_chk(int, void *, size_t, size_t) XIO_ALIAS(xio___read_chk);
extern ssize_t pread(int, void *, size_t, off_t) XIO_ALIAS(xio_pread);
extern ssize_t pread64(int, void *, size_t, off64_t) XIO_ALIAS(xio_pread64);
extern ssize_t readv(int, const struct iovec *, int) XIO_ALIAS(xio_readv);
extern ssize_t preadv(int, const struct iovec *, int, off_t) XIO_ALIAS(xio_preadv);
extern ssize_t preadv64(int, const struct iovec *, int, off64_t) XIO_ALIAS(xio_preadv64);
extern ssize_t preadv2(int, const struct iovec *, int, off_t, int) XIO_ALIAS(xio_preadv2);
extern ssize_t preadv64v2(int, const struct iovec *, int, off64_t, int) XIO_ALIAS(xio_preadv64v2);
extern ssize_t write(int, const void *, size_t) XIO_ALIAS(xio_write);
extern ssize_t pwrite(int, const void *, size_t, off_t) XIO_ALIAS(xio_pwrite);
extern ssize_t pwrite64(int, const void *, size_t, off64_t) XIO_ALIAS(xio_pwrite64);
extern ssize_t writev(int, const struct iovec *, int) XIO_ALIAS(xio_writev);
extern ssize_t pwritev(int, const struct iovec *, int, off_t) XIO_ALIAS(xio_pwritev);
extern ssize_t pwritev64(int, const struct iovec *, int, off64_t) XIO_ALIAS(xio_pwritev64);
extern ssize_t pwritev2(int, const struct iovec *, int, off_t, int) XIO_ALIAS(xio_pwritev2);
extern ssize_t pwritev64v2(int, const struct iovec *, int, off64_t, int) XIO_ALIAS(xio_pwritev64v2);

/* ---- in-kernel copies: a read of the source and a write of the destination, one record on each ----
 * sendfile (shutil.copyfile's way on Linux) and copy_file_range move bytes between two descriptors without
 * passing them through the program: each call is recorded as a read on the source and, where it moved
 * anything or failed, a write on the destination, both with the call's times. A NULL offset pointer means the
 * descriptor's own offset, which the call moves; a given one is read before the call (the call updates it). */
static void record_copy(int rop, int in_fd, int64_t in_pos, int out_fd, int64_t out_pos, int64_t t0, int64_t t1,
                        int64_t ret, int err, int64_t count)
{
    xio_rec_fd(rop, in_fd, t0, t1, ret, err, count, in_pos);
    if (ret != 0)
        xio_rec_fd(rop + 1, out_fd, t0, t1, ret, err, count, out_pos);
}

#define RECORD_COPY(rop, call, in_fd, in_off, out_fd, out_off, count)                                            \
    if (!xio_enter())                                                                                            \
        return call;                                                                                             \
    int64_t in_pos = (in_off) ? (int64_t) * (in_off) : -1, out_pos = (out_off) ? (int64_t) * (out_off) : -1;     \
    int64_t t0 = xio_ticks();                                                                                    \
    ssize_t ret = call;                                                                                          \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                    \
    record_copy(rop, in_fd, in_pos, out_fd, out_pos, t0, t1, (int64_t)ret, err, (int64_t)(count));              \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

_Static_assert(XIO_OP_SENDFILE_WRITE == XIO_OP_SENDFILE_READ + 1 && XIO_OP_COPY_WRITE == XIO_OP_COPY_READ + 1,
               "record_copy writes the op after the read's");
static const off_t *const no_offset = NULL;

static ssize_t (*real_sendfile)(int, int, off_t *, size_t);
static ssize_t xio_sendfile(int out_fd, int in_fd, off_t *off, size_t n)
{
    RECORD_COPY(XIO_OP_SENDFILE_READ, REAL(sendfile)(out_fd, in_fd, off, n), in_fd, off, out_fd, no_offset, n)
}
static ssize_t (*real_sendfile64)(int, int, off64_t *, size_t);
static ssize_t xio_sendfile64(int out_fd, int in_fd, off64_t *off, size_t n)
{
    RECORD_COPY(XIO_OP_SENDFILE_READ, REAL(sendfile64)(out_fd, in_fd, off, n), in_fd, off, out_fd, no_offset, n)
}
static ssize_t (*real_copy_file_range)(int, off64_t *, int, off64_t *, size_t, unsigned);
static ssize_t xio_copy_file_range(int in_fd, off64_t *in_off, int out_fd, off64_t *out_off, size_t n, unsigned fl)
{
    RECORD_COPY(XIO_OP_COPY_READ, REAL(copy_file_range)(in_fd, in_off, out_fd, out_off, n, fl), in_fd, in_off,
                out_fd, out_off, n)
}
extern ssize_t sendfile(int, int, off_t *, size_t) XIO_ALIAS(xio_sendfile);
extern ssize_t sendfile64(int, int, off64_t *, size_t) XIO_ALIAS(xio_sendfile64);
extern ssize_t copy_file_range(int, off64_t *, int, off64_t *, size_t, unsigned) XIO_ALIAS(xio_copy_file_range);

/* ---- rename family: recorded on the old path, naming the new one (records.c) ---- */

#define RECORD_RENAME(call, olddirfd, oldpath, newdirfd, newpath)                                                \
    if (!xio_enter())                                                                                            \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                    \
    int ret = call;                                                                                              \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                    \
    xio_rec_rename(olddirfd, oldpath, newdirfd, newpath, t0, t1, ret, err);                                      \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

static int (*real_rename)(const char *, const char *);
static int xio_rename(const char *old, const char *new)
{
    RECORD_RENAME(REAL(rename)(old, new), AT_FDCWD, old, AT_FDCWD, new)
}
static int (*real_renameat)(int, const char *, int, const char *);
static int xio_renameat(int olddir, const char *old, int newdir, const char *new)
{
    RECORD_RENAME(REAL(renameat)(olddir, old, newdir, new), olddir, old, newdir, new)
}
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);
static int xio_renameat2(int olddir, const char *old, int newdir, const char *new, unsigned flags)
{
    RECORD_RENAME(REAL(renameat2)(olddir, old, newdir, new, flags), olddir, old, newdir, new)
}
extern int rename(const char *, const char *) XIO_ALIAS(xio_rename);
extern int renameat(int, const char *, int, const char *) XIO_ALIAS(xio_renameat);
extern int renameat2(int, const char *, int, const char *, unsigned) XIO_ALIAS(xio_renameat2);

/* ---- seeks, syncs ---- */

#define DEFINE_LSEEK(name, type)                                                                                 \
    static type (*real_##name)(int, type, int);                                                                  \
    static type xio_##name(int fd, type off, int whence)                                                         \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(fd, off, whence);                                                                  \
        int64_t t0 = xio_ticks();                                                                                  \
        type ret = REAL(name)(fd, off, whence);                                                                  \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        struct xio_fd *e = xio_fd_get(fd);                                                                       \
        if (e && ret >= 0)                                                                                       \
            e->offset = ret;                                                                                     \
        xio_rec_entry(XIO_OP_LSEEK, fd, e, t0, t1, ret < 0 ? -1 : 0, err, whence, ret < 0 ? -1 : ret);           \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_LSEEK(lseek, off_t)
DEFINE_LSEEK(lseek64, off64_t)
extern off_t lseek(int, off_t, int) XIO_ALIAS(xio_lseek);
extern off64_t lseek64(int, off64_t, int) XIO_ALIAS(xio_lseek64);

#define DEFINE_SYNC(name, op)                                                                                    \
    static int (*real_##name)(int);                                                                              \
    static int xio_##name(int fd)                                                                                \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(fd);                                                                               \
        int64_t t0 = xio_ticks();                                                                                  \
        int ret = REAL(name)(fd);                                                                                \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_simple_fd(op, fd, t0, t1, ret, err, -1, -1);                                                     \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_SYNC(fsync, XIO_OP_FSYNC)
DEFINE_SYNC(fdatasync, XIO_OP_FDATASYNC)
extern int fsync(int) XIO_ALIAS(xio_fsync);
extern int fdatasync(int) XIO_ALIAS(xio_fdatasync);

/* ---- mmap and munmap: file mappings only (anonymous ones are the allocator's, not I/O) ---- */

/* The file mappings recorded and not yet unmapped, by start address, so that munmap can tell a file mapping's end
 * from the allocator's and name its file: an open-addressing table, lock-free (munmap may run in a signal handler
 * or a fork child), in the library's own memory (a fork child inherits its parent's mappings and this table with
 * them). A slot's address is 0 (never used), MAP_GONE (unmapped since) or MAP_BUSY (being filled). Only the unmap
 * of a whole mapping is recorded (Python's mmap, numpy.memmap, LMDB and Arrow unmap whole mappings), and failed
 * ones; beyond MAPS live file mappings, the others' unmaps go unrecorded, as before the table. */
#define MAPS 16384u /* a power of two; 384 KiB of zero pages, touched only where used */
#define MAP_GONE ((uintptr_t)1)
#define MAP_BUSY ((uintptr_t)2)
struct xio_map {
    uintptr_t addr;
    uint64_t len;
    uint32_t path_id;
    uint8_t kind;
};
static struct xio_map maps[MAPS];
static unsigned maps_live; /* recorded mappings not yet unmapped: munmap passes straight through at 0 */

static unsigned map_home(uintptr_t addr) { return (unsigned)((addr >> 12) * 0x9E3779B1u) & (MAPS - 1); }

static void map_put(const struct xio_map *m)
{
    if (m->addr <= MAP_BUSY)
        return;
    for (unsigned i = 0, s = map_home(m->addr); i < MAPS; i++, s = (s + 1) & (MAPS - 1)) {
        uintptr_t seen = __atomic_load_n(&maps[s].addr, __ATOMIC_ACQUIRE);
        if ((seen == 0 || seen == MAP_GONE) &&
            __atomic_compare_exchange_n(&maps[s].addr, &seen, MAP_BUSY, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            maps[s].len = m->len;
            maps[s].path_id = m->path_id;
            maps[s].kind = m->kind;
            __atomic_add_fetch(&maps_live, 1, __ATOMIC_RELAXED);
            __atomic_store_n(&maps[s].addr, m->addr, __ATOMIC_RELEASE);
            return;
        }
    }
}

static void map_add(void *addr, size_t len, int fd)
{
    struct xio_fd *e = xio_fd_get_known(fd);
    if (e && e->kind != XIO_KIND_EXCLUDED)
        map_put(&(struct xio_map){.addr = (uintptr_t)addr, .len = len, .path_id = e->path_id, .kind = e->kind});
}

/* Takes the mapping that starts at `addr` out of the table into `*out`; 0 when there is none. */
static int map_take(uintptr_t addr, struct xio_map *out)
{
    for (unsigned i = 0, s = map_home(addr); i < MAPS; i++, s = (s + 1) & (MAPS - 1)) {
        uintptr_t seen = __atomic_load_n(&maps[s].addr, __ATOMIC_ACQUIRE);
        if (seen == 0)
            return 0; /* the end of the probe: never inserted past an empty slot */
        if (seen != addr)
            continue;
        *out = maps[s];
        if (__atomic_compare_exchange_n(&maps[s].addr, &seen, MAP_GONE, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            __atomic_sub_fetch(&maps_live, 1, __ATOMIC_RELAXED);
            return 1;
        }
        return 0; /* another thread unmapped it first */
    }
    return 0;
}

#define DEFINE_MMAP(name, type)                                                                                  \
    static void *(*real_##name)(void *, size_t, int, int, int, type);                                            \
    static void *xio_##name(void *addr, size_t len, int prot, int flags, int fd, type off)                       \
    {                                                                                                            \
        if (fd < 0 || (flags & MAP_ANONYMOUS) || !xio_enter())                                                   \
            return REAL(name)(addr, len, prot, flags, fd, off);                                                  \
        int64_t t0 = xio_ticks();                                                                                  \
        void *ret = REAL(name)(addr, len, prot, flags, fd, off);                                                 \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        xio_rec_simple_fd(XIO_OP_MMAP, fd, t0, t1, ret == MAP_FAILED ? -1 : 0, err, (int64_t)len, off);          \
        if (ret != MAP_FAILED)                                                                                   \
            map_add(ret, len, fd);                                                                               \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_MMAP(mmap, off_t)
DEFINE_MMAP(mmap64, off64_t)
extern void *mmap(void *, size_t, int, int, int, off_t) XIO_ALIAS(xio_mmap);
extern void *mmap64(void *, size_t, int, int, int, off64_t) XIO_ALIAS(xio_mmap64);

/* An unmap of a whole recorded file mapping (its start and length), or a failed unmap from its start: its file's
 * path and kind, the length (`requested`), no descriptor (the file may have been closed since the mapping was
 * made). The mapping leaves the table at any unmap from its start that succeeds, recorded or not (a call inside
 * another wrapper, an unmap of part of it), so that no later mapping of other memory there is taken for it. */
static int (*real_munmap)(void *, size_t);
static int xio_munmap(void *addr, size_t len)
{
    struct xio_map m;
    if (XIO_LIKELY(__atomic_load_n(&maps_live, __ATOMIC_RELAXED) == 0) || !map_take((uintptr_t)addr, &m))
        return REAL(munmap)(addr, len);
    if (!xio_enter()) {
        int ret = REAL(munmap)(addr, len);
        if (ret != 0) /* still mapped */
            map_put(&m);
        return ret;
    }
    int64_t t0 = xio_ticks();
    int ret = REAL(munmap)(addr, len);
    int err = errno;
    int64_t t1 = xio_ticks();
    if (ret != 0)
        map_put(&m);
    if (ret != 0 || m.len == len) {
        struct xio_ev r;
        xio_ev_init(&r, XIO_OP_MUNMAP, t0, t1);
        r.requested = (int64_t)len;
        r.err = ret != 0 ? err : 0;
        r.path_id = m.path_id;
        r.kind = m.kind;
        xio_emit(&r);
    }
    xio_leave();
    errno = err;
    return ret;
}
extern int munmap(void *, size_t) XIO_ALIAS(xio_munmap);

/* A recorded file mapping that mremap resizes or moves whole (from its start: Python's mmap.resize) stays in the
 * table at its new address and length, so that its unmap there is recorded and no memory mapped later at its old
 * address is taken for it; one remapped in part leaves the table, as one unmapped in part does. Nothing is
 * recorded: mremap reads and writes no file. */
static void *(*real_mremap)(void *, size_t, size_t, int, ...);
static void *xio_mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
    void *want = NULL; /* the new address, with MREMAP_FIXED only */
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        want = va_arg(ap, void *);
        va_end(ap);
    }
    struct xio_map m;
    if (XIO_LIKELY(__atomic_load_n(&maps_live, __ATOMIC_RELAXED) == 0) || !map_take((uintptr_t)old, &m))
        return REAL(mremap)(old, old_len, new_len, flags, want);
    void *ret = REAL(mremap)(old, old_len, new_len, flags, want);
    int err = errno;
    if (ret == MAP_FAILED) {
        map_put(&m); /* still where it was */
    } else if (old_len == m.len) {
#ifdef MREMAP_DONTUNMAP
        if (flags & MREMAP_DONTUNMAP)
            map_put(&m); /* the old range stays mapped too */
#endif
        m.addr = (uintptr_t)ret;
        m.len = new_len;
        map_put(&m);
    }
    errno = err;
    return ret;
}
extern void *mremap(void *, size_t, size_t, int, ...) XIO_ALIAS(xio_mremap);

/* ---- dup family: the new descriptor takes the old one's path and offset ---- */

static void record_dup(int oldfd, int newfd, int64_t t0, int64_t t1, int err)
{
    if (newfd >= 0) {
        xio_fd_dup(oldfd, newfd);
        xio_rec_simple_fd(XIO_OP_DUP, newfd, t0, t1, 0, err, oldfd, -1);
    } else {
        xio_rec_entry(XIO_OP_DUP, -1, xio_fd_get(oldfd), t0, t1, -1, err, oldfd, -1);
    }
}

#define RECORD_DUP(call, oldfd)                                                                                  \
    if (!xio_enter())                                                                                            \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                      \
    int ret = call;                                                                                              \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                      \
    record_dup(oldfd, ret, t0, t1, err);                                                                         \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

static int (*real_dup)(int);
static int xio_dup(int fd) { RECORD_DUP(REAL(dup)(fd), fd) }
static int (*real_dup2)(int, int);
static int xio_dup2(int fd, int fd2) { RECORD_DUP(REAL(dup2)(fd, fd2), fd) }
static int (*real_dup3)(int, int, int);
static int xio_dup3(int fd, int fd2, int flags) { RECORD_DUP(REAL(dup3)(fd, fd2, flags), fd) }
extern int dup(int) XIO_ALIAS(xio_dup);
extern int dup2(int, int) XIO_ALIAS(xio_dup2);
extern int dup3(int, int, int) XIO_ALIAS(xio_dup3);

/* fcntl: only F_DUPFD* is a descriptor birth (Python's os.dup uses it); every other command passes. */
#define DEFINE_FCNTL(name)                                                                                       \
    static int (*real_##name)(int, int, ...);                                                                    \
    static int xio_##name(int fd, int cmd, ...)                                                                  \
    {                                                                                                            \
        va_list ap;                                                                                              \
        va_start(ap, cmd);                                                                                       \
        void *arg = va_arg(ap, void *);                                                                          \
        va_end(ap);                                                                                              \
        if ((cmd != F_DUPFD && cmd != F_DUPFD_CLOEXEC) || !xio_enter())                                          \
            return REAL(name)(fd, cmd, arg);                                                                     \
        int64_t t0 = xio_ticks();                                                                                  \
        int ret = REAL(name)(fd, cmd, arg);                                                                      \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        record_dup(fd, ret, t0, t1, err);                                                                        \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_FCNTL(fcntl)
DEFINE_FCNTL(fcntl64)
extern int fcntl(int, int, ...) XIO_ALIAS(xio_fcntl);
extern int fcntl64(int, int, ...) XIO_ALIAS(xio_fcntl64);

const struct xio_hook xio_hooks_posix[] = {
    HOOK(open), HOOK(open64), HOOK(openat), HOOK(openat64), HOOK(creat), HOOK(creat64), HOOK(__open_2),
    HOOK(__open64_2), HOOK(__openat_2), HOOK(__openat64_2), HOOK(close), HOOK(close_range), HOOK(closefrom),
    HOOK(read), HOOK(__read_chk), HOOK(pread), HOOK(pread64), HOOK(readv), HOOK(preadv), HOOK(preadv64),
    HOOK(preadv2), HOOK(preadv64v2), HOOK(write), HOOK(pwrite), HOOK(pwrite64), HOOK(writev), HOOK(pwritev),
    HOOK(pwritev64), HOOK(pwritev2), HOOK(pwritev64v2), HOOK(lseek), HOOK(lseek64), HOOK(fsync),
    HOOK(fdatasync), HOOK(mmap), HOOK(mmap64), HOOK(munmap), HOOK(mremap), HOOK(dup), HOOK(dup2), HOOK(dup3),
    HOOK(fcntl), HOOK(fcntl64), HOOK(sendfile), HOOK(sendfile64), HOOK(copy_file_range), HOOK(rename),
    HOOK(renameat), HOOK(renameat2), {0},
};
