/* Wrappers of stdio: fopen, fdopen, fread, fwrite, fseek, fflush, fclose.
 *
 * Records carry the stream's fileno, so they share the descriptor's path. The stream position is tracked
 * in the descriptor's entry (soffset) as Darshan's STDIO module does: fopen sets it to 0 (the end for
 * append modes), fread/fwrite move it by the bytes they return, fseek sets it to ftello's answer. Streams
 * with no descriptor (fmemopen) are not I/O and are not recorded. glibc's stdio reads and writes through
 * its internal __read/__write, so stdio calls never show up twice as POSIX records.
 */
#include "xio.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

extern size_t __fread_chk(void *, size_t, size_t, size_t, FILE *);

/* The open(2) flags an fopen mode string stands for. */
static int mode_flags(const char *mode)
{
    if (!mode)
        return 0;
    int plus = strchr(mode, '+') != NULL;
    switch (mode[0]) {
    case 'r': return plus ? O_RDWR : O_RDONLY;
    case 'w': return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC;
    case 'a': return (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND;
    default: return 0;
    }
}

static void record_fopen(int op, const char *path, FILE *f, int64_t t0, int64_t t1, int err, const char *mode)
{
    int fd = f ? fileno(f) : -1;
    int flags = mode_flags(mode);
    if (op == XIO_OP_FOPEN) {
        xio_rec_open(XIO_OP_FOPEN, AT_FDCWD, path, t0, t1, fd, err, flags);
    } else {
        xio_rec_simple_fd(XIO_OP_FDOPEN, fd, t0, t1, f ? 0 : -1, err, flags, -1);
    }
    struct xio_fd *e = xio_fd_get_known(fd);
    if (e && (flags & O_APPEND)) {
        off_t pos = ftello(f);
        e->soffset = pos < 0 ? 0 : pos;
    } else if (e) {
        e->soffset = op == XIO_OP_FOPEN ? 0 : e->offset;
    }
}

#define DEFINE_FOPEN(name)                                                                                       \
    static FILE *(*real_##name)(const char *, const char *);                                                     \
    static FILE *xio_##name(const char *path, const char *mode)                                                  \
    {                                                                                                            \
        if (!xio_enter())                                                                                        \
            return REAL(name)(path, mode);                                                                       \
        int64_t t0 = xio_ticks();                                                                                  \
        FILE *f = REAL(name)(path, mode);                                                                        \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        record_fopen(XIO_OP_FOPEN, path, f, t0, t1, err, mode);                                                  \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return f;                                                                                                \
    }
DEFINE_FOPEN(fopen)
DEFINE_FOPEN(fopen64)

static FILE *(*real_fdopen)(int, const char *);
static FILE *xio_fdopen(int fd, const char *mode)
{
    if (!xio_enter())
        return REAL(fdopen)(fd, mode);
    int64_t t0 = xio_ticks();
    FILE *f = REAL(fdopen)(fd, mode);
    int err = errno;
    int64_t t1 = xio_ticks();
    if (f)
        record_fopen(XIO_OP_FDOPEN, NULL, f, t0, t1, err, mode);
    else
        xio_rec_simple_fd(XIO_OP_FDOPEN, fd, t0, t1, -1, err, mode_flags(mode), -1);
    xio_leave();
    errno = err;
    return f;
}

/* fread/fwrite: `n` items of `size` bytes asked, `got` items moved. */
static void record_transfer(int op, FILE *f, int64_t t0, int64_t t1, size_t size, size_t n, size_t got, int err)
{
    int fd = fileno(f);
    struct xio_fd *e = xio_fd_get(fd);
    if (fd < 0 || (e && e->kind == XIO_KIND_EXCLUDED))
        return;
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = (int64_t)(size * n);
    r.bytes = (int64_t)(size * got);
    r.err = got < n && ferror(f) ? err : 0;
    if (e) {
        xio_ev_of_entry(&r, e);
        r.offset = xio_kind_seekable(e->kind) ? __atomic_fetch_add(&e->soffset, r.bytes, __ATOMIC_RELAXED) : -1;
    }
    xio_emit(&r);
}

#define RECORD_TRANSFER(op, call, f, size, n)                                                                    \
    if (!f || !xio_enter())                                                                                      \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                      \
    size_t got = call;                                                                                           \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                      \
    record_transfer(op, f, t0, t1, size, n, got, err);                                                           \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return got;

static size_t (*real_fread)(void *, size_t, size_t, FILE *);
static size_t xio_fread(void *p, size_t size, size_t n, FILE *f)
{
    RECORD_TRANSFER(XIO_OP_FREAD, REAL(fread)(p, size, n, f), f, size, n)
}
static size_t (*real___fread_chk)(void *, size_t, size_t, size_t, FILE *);
static size_t xio___fread_chk(void *p, size_t plen, size_t size, size_t n, FILE *f)
{
    RECORD_TRANSFER(XIO_OP_FREAD, REAL(__fread_chk)(p, plen, size, n, f), f, size, n)
}
static size_t (*real_fwrite)(const void *, size_t, size_t, FILE *);
static size_t xio_fwrite(const void *p, size_t size, size_t n, FILE *f)
{
    RECORD_TRANSFER(XIO_OP_FWRITE, REAL(fwrite)(p, size, n, f), f, size, n)
}

/* fseek family: the record's offset is where the stream is afterwards; `requested` is whence. */
static void record_seek(FILE *f, int64_t t0, int64_t t1, int ret, int err, int whence)
{
    int fd = fileno(f);
    if (fd < 0)
        return;
    struct xio_fd *e = xio_fd_get(fd);
    int64_t pos = -1;
    if (ret == 0) {
        pos = ftello(f);
        if (e && pos >= 0)
            e->soffset = pos;
    }
    xio_rec_entry(XIO_OP_FSEEK, fd, e, t0, t1, ret, err, whence, pos);
}

#define DEFINE_FSEEK(name, type)                                                                                 \
    static int (*real_##name)(FILE *, type, int);                                                                \
    static int xio_##name(FILE *f, type off, int whence)                                                         \
    {                                                                                                            \
        if (!f || !xio_enter())                                                                                  \
            return REAL(name)(f, off, whence);                                                                   \
        int64_t t0 = xio_ticks();                                                                                  \
        int ret = REAL(name)(f, off, whence);                                                                    \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                  \
        record_seek(f, t0, t1, ret, err, whence);                                                                \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_FSEEK(fseek, long)
DEFINE_FSEEK(fseeko, off_t)
DEFINE_FSEEK(fseeko64, off64_t)

static int (*real_fflush)(FILE *);
static int xio_fflush(FILE *f)
{
    if (!xio_enter())
        return REAL(fflush)(f);
    int64_t t0 = xio_ticks();
    int ret = REAL(fflush)(f);
    int err = errno;
    int64_t t1 = xio_ticks();
    int fd = f ? fileno(f) : -1; /* fflush(NULL) flushes every stream */
    if (!f || fd >= 0)
        xio_rec_simple_fd(XIO_OP_FFLUSH, fd, t0, t1, ret == 0 ? 0 : -1, err, -1, -1);
    xio_leave();
    errno = err;
    return ret;
}

static int (*real_fclose)(FILE *);
static int xio_fclose(FILE *f)
{
    if (!f || !xio_enter())
        return REAL(fclose)(f);
    int saved = errno;
    int fd = fileno(f);
    struct xio_fd *e = xio_fd_get(fd);
    struct xio_fd before = e ? *e : (struct xio_fd){0};
    errno = saved;
    int64_t t0 = xio_ticks();
    int ret = REAL(fclose)(f);
    int err = errno;
    int64_t t1 = xio_ticks();
    if (fd >= 0) {
        xio_fd_closed(fd); /* the stream closed its descriptor through glibc's internal close */
        xio_rec_entry(XIO_OP_FCLOSE, fd, e ? &before : NULL, t0, t1, ret == 0 ? 0 : -1, err, -1, -1);
    }
    xio_leave();
    errno = err;
    return ret;
}

extern FILE *fopen(const char *restrict, const char *restrict) XIO_ALIAS(xio_fopen);
extern FILE *fopen64(const char *restrict, const char *restrict) XIO_ALIAS(xio_fopen64);
extern FILE *fdopen(int, const char *) XIO_ALIAS(xio_fdopen);
extern size_t fread(void *restrict, size_t, size_t, FILE *restrict) XIO_ALIAS(xio_fread);
extern size_t __fread_chk(void *, size_t, size_t, size_t, FILE *) XIO_ALIAS(xio___fread_chk);
extern size_t fwrite(const void *restrict, size_t, size_t, FILE *restrict) XIO_ALIAS(xio_fwrite);
extern int fseek(FILE *, long, int) XIO_ALIAS(xio_fseek);
extern int fseeko(FILE *, off_t, int) XIO_ALIAS(xio_fseeko);
extern int fseeko64(FILE *, off64_t, int) XIO_ALIAS(xio_fseeko64);
extern int fflush(FILE *) XIO_ALIAS(xio_fflush);
extern int fclose(FILE *) XIO_ALIAS(xio_fclose);

const struct xio_hook xio_hooks_stdio[] = {
    HOOK_PTR(fopen), HOOK_PTR(fopen64), HOOK_PTR(fdopen), HOOK(fread),  HOOK(__fread_chk), HOOK(fwrite),
    HOOK(fseek),     HOOK(fseeko),      HOOK(fseeko64),   HOOK(fflush), HOOK(fclose),
    {0},
};
