/* Wrappers of stdio: fopen, fdopen, freopen, fread, fwrite, fseek (rewind, fsetpos), fflush, fclose; and the
 * character, line and formatted calls Darshan's STDIO module wraps: fgetc, getc, fgets, getw, fscanf, vfscanf
 * (read side) and fputc, putc, fputs, putw, fprintf, vfprintf, printf, vprintf (write side), with their
 * fortified forms. Not wrapped: ungetc, and the _unlocked forms (getc_unlocked is a macro that reads the
 * buffer).
 *
 * A character or line call moves a few bytes from the stream's buffer: a record per call would be a record per
 * character or line. So does an fread or fwrite of fewer than XIO_RUN_BYTES bytes, most times (gcc writes a
 * precompiled header with millions of fwrites, most of one byte). A thread's run of such calls of one side on
 * one stream is kept instead (xio_run, as readdir runs are) and written as one STDIO_READ or STDIO_WRITE record
 * when it ends: when the thread records any other call, at the end of the file, after XIO_RUN_CALLS calls or a
 * flush interval (XIO_FLUSH_INTERVAL_NS) from its first call, and when the thread or the process flushes for
 * good. The record starts at the run's first call and lasts the time spent inside the calls; `bytes` is what
 * they moved, `requested` the calls, `offset` the stream's position at the first. A run of one fread or fwrite
 * is recorded as that call, as a larger one is. A failed call is recorded alone. fscanf's bytes are the stream's
 * position after the call less before it (ftello), as Darshan counts them.
 *
 * Records carry the stream's fileno, so they share the descriptor's path. The stream position is tracked
 * in the descriptor's entry (soffset) as Darshan's STDIO module does: fopen sets it to 0 (the end for
 * append modes), fread/fwrite move it by the bytes they return, fseek sets it to ftello's answer. Streams
 * with no descriptor (fmemopen) are not I/O and are not recorded. glibc's stdio reads and writes through
 * its internal __read/__write, so stdio calls never show up twice as POSIX records.
 */
#include "xio.h"

#include <fcntl.h>
#include <stdarg.h>
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

/* ---- runs of calls on a stream (xio_run) ---- */

/* One call of side `op` (STDIO_READ, STDIO_WRITE) on descriptor `fd` (entry `e`) of a stream that moved `nbytes`
 * (-1: it failed, with `err`; 0 at the end of the file, which ends the run). `single`: the call's own operation
 * (FREAD, FWRITE), which a run of it alone is recorded as, with `asked` bytes asked for; 0: a character, line or
 * formatted call. */
static void join_run(int op, int fd, struct xio_fd *e, int64_t t0, int64_t t1, int64_t nbytes, int err, int single,
                     int64_t asked)
{
    struct xio_run *p = &xio_run;
    if (p->calls && (p->fd != fd || p->op != op))
        xio_run_flush();
    if (nbytes < 0) { /* a failed call is recorded alone, as every failed call is */
        xio_run_flush();
        if (e && e->kind == XIO_KIND_EXCLUDED)
            return;
        struct xio_ev r;
        xio_ev_init(&r, op, t0, t1);
        r.fd = fd;
        r.requested = 1;
        r.err = err ? err : EIO;
        if (e)
            xio_ev_of_entry(&r, e);
        xio_emit(&r);
        return;
    }
    if (!p->calls) {
        if (e && e->kind == XIO_KIND_EXCLUDED)
            return;
        p->fd = fd;
        p->op = (uint8_t)op;
        p->single = (uint8_t)single;
        p->asked = asked;
        p->path_id = e ? e->path_id : 0;
        p->kind = e ? e->kind : XIO_KIND_UNKNOWN;
        p->offset = e && xio_kind_seekable(e->kind) ? e->soffset : -1;
        p->first = t0;
        p->busy = 0;
        p->bytes = 0;
    }
    if (e && nbytes > 0)
        __atomic_fetch_add(&e->soffset, nbytes, __ATOMIC_RELAXED);
    p->calls++;
    p->busy += t1 - t0 > 0 ? t1 - t0 : 0;
    p->bytes += (uint64_t)nbytes;
    /* a run ends at the end of the file, at XIO_RUN_CALLS calls, and once it has lasted a flush interval: a thread
     * that writes a line now and then keeps no run open for long, to be lost if the process exits meanwhile */
    if ((op == XIO_OP_STDIO_READ && nbytes == 0) || p->calls >= XIO_RUN_CALLS || t1 - p->first > xio.flush_interval)
        xio_run_flush();
}

/* fread/fwrite: `n` items of `size` bytes asked, `got` items moved. */
static void record_transfer(int op, FILE *f, int64_t t0, int64_t t1, size_t size, size_t n, size_t got, int err)
{
    int fd = fileno(f);
    struct xio_fd *e = xio_fd_get_known(fd);
    if (XIO_UNLIKELY(e == NULL) && (e = xio_fd_discover(fd)) != NULL && xio_kind_seekable(e->kind)) {
        /* discovered after the call: the stream is where the call left it */
        off_t now = ftello(f);
        e->soffset = (now < 0 ? e->offset : (int64_t)now) - (int64_t)(size * got);
    }
    if (fd < 0 || (e && e->kind == XIO_KIND_EXCLUDED))
        return;
    int failed = got < n && ferror(f);
    if (!failed && size * n < XIO_RUN_BYTES) { /* a copy to or from the buffer, mostly: it joins the run */
        join_run(op == XIO_OP_FREAD ? XIO_OP_STDIO_READ : XIO_OP_STDIO_WRITE, fd, e, t0, t1, (int64_t)(size * got), 0,
                 op, (int64_t)(size * n));
        return;
    }
    struct xio_ev r;
    xio_ev_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = (int64_t)(size * n);
    r.bytes = (int64_t)(size * got);
    r.err = failed ? err : 0;
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

/* rewind is fseek(f, 0, SEEK_SET) that returns nothing; fsetpos sets a position ftello took: both are seeks. */
static void (*real_rewind)(FILE *);
static void xio_rewind(FILE *f)
{
    if (!f || !xio_enter()) {
        REAL(rewind)(f);
        return;
    }
    int64_t t0 = xio_ticks();
    REAL(rewind)(f);
    int err = errno;
    int64_t t1 = xio_ticks();
    record_seek(f, t0, t1, 0, err, SEEK_SET);
    xio_leave();
    errno = err;
}

#define DEFINE_FSETPOS(name, type)                                                                               \
    static int (*real_##name)(FILE *, const type *);                                                            \
    static int xio_##name(FILE *f, const type *pos)                                                              \
    {                                                                                                            \
        if (!f || !xio_enter())                                                                                  \
            return REAL(name)(f, pos);                                                                           \
        int64_t t0 = xio_ticks();                                                                                \
        int ret = REAL(name)(f, pos);                                                                            \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                \
        record_seek(f, t0, t1, ret, err, SEEK_SET);                                                              \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
DEFINE_FSETPOS(fsetpos, fpos_t)
DEFINE_FSETPOS(fsetpos64, fpos64_t)

/* freopen closes the stream's descriptor (through glibc's internal close) and opens the path on the same
 * stream: a close of the old descriptor (an instant at the call's start), then an fopen. With no path it
 * reopens the same file in another mode: passed through. */
#define DEFINE_FREOPEN(name)                                                                                     \
    static FILE *(*real_##name)(const char *, const char *, FILE *);                                             \
    static FILE *xio_##name(const char *path, const char *mode, FILE *f)                                         \
    {                                                                                                            \
        if (!f || !path || !xio_enter()) /* no path: the same file in another mode */                            \
            return REAL(name)(path, mode, f);                                                                    \
        int saved = errno;                                                                                       \
        int old = fileno(f);                                                                                     \
        struct xio_fd *e = xio_fd_get(old);                                                                      \
        struct xio_fd before = e ? *e : (struct xio_fd){0};                                                      \
        xio_fd_closed(old); /* the stream's descriptor is closed whether or not the open succeeds */             \
        errno = saved;                                                                                           \
        int64_t t0 = xio_ticks();                                                                                \
        FILE *got = REAL(name)(path, mode, f);                                                                   \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                \
        if (old >= 0) {                                                                                          \
            xio_rec_entry(XIO_OP_FCLOSE, old, e ? &before : NULL, t0, t0, 0, 0, -1, -1);                         \
        }                                                                                                        \
        record_fopen(XIO_OP_FOPEN, path, got, t0, t1, err, mode);                                                \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return got;                                                                                              \
    }
DEFINE_FREOPEN(freopen)
DEFINE_FREOPEN(freopen64)

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

/* ---- runs of character, line and formatted calls ---- */

/* One call of side `op` (STDIO_READ, STDIO_WRITE) on stream `f` that moved `nbytes` (-1: it failed, with
 * `err`; 0 at the end of the file, which ends the run). */
static void note_stdio(int op, FILE *f, int64_t t0, int64_t t1, int64_t nbytes, int err)
{
    int fd = fileno(f);
    if (fd < 0)
        return; /* a stream with no descriptor (fmemopen) is no I/O */
    join_run(op, fd, xio_fd_get(fd), t0, t1, nbytes, err, 0, 0);
}

/* `call`: the real call, returning `type`; `moved`: the bytes it moved, from `ret` (-1: it failed). */
#define RECORD_STDIO(op, type, call, f, moved)                                                                   \
    if (!f || !xio_enter())                                                                                      \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                    \
    type ret = call;                                                                                             \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                    \
    note_stdio(op, f, t0, t1, moved, err);                                                                       \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

/* A character read: 1 byte, or none at the end of the file, or a failure. */
#define GOT_CHAR(f, ret) ((ret) != EOF ? 1 : ferror(f) ? -1 : 0)
#define PUT_OK(ret, n) ((ret) != EOF ? (int64_t)(n) : -1)

static int (*real_fgetc)(FILE *);
static int xio_fgetc(FILE *f) { RECORD_STDIO(XIO_OP_STDIO_READ, int, REAL(fgetc)(f), f, GOT_CHAR(f, ret)) }
static int (*real_getc)(FILE *);
static int xio_getc(FILE *f) { RECORD_STDIO(XIO_OP_STDIO_READ, int, REAL(getc)(f), f, GOT_CHAR(f, ret)) }
static int (*real__IO_getc)(FILE *);
static int xio__IO_getc(FILE *f) { RECORD_STDIO(XIO_OP_STDIO_READ, int, REAL(_IO_getc)(f), f, GOT_CHAR(f, ret)) }
static int (*real_getw)(FILE *);
static int xio_getw(FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_READ, int, REAL(getw)(f), f,
                 ferror(f) ? -1 : ret == EOF && feof(f) ? 0 : (int64_t)sizeof(int))
}
static char *(*real_fgets)(char *, int, FILE *);
static char *xio_fgets(char *buf, int n, FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_READ, char *, REAL(fgets)(buf, n, f), f,
                 ret ? (int64_t)strlen(ret) : ferror(f) ? -1 : 0)
}

static int (*real_fputc)(int, FILE *);
static int xio_fputc(int c, FILE *f) { RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(fputc)(c, f), f, PUT_OK(ret, 1)) }
static int (*real_putc)(int, FILE *);
static int xio_putc(int c, FILE *f) { RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(putc)(c, f), f, PUT_OK(ret, 1)) }
static int (*real__IO_putc)(int, FILE *);
static int xio__IO_putc(int c, FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(_IO_putc)(c, f), f, PUT_OK(ret, 1))
}
static int (*real_putw)(int, FILE *);
static int xio_putw(int w, FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(putw)(w, f), f, ret == 0 ? (int64_t)sizeof(int) : -1)
}
static int (*real_fputs)(const char *, FILE *);
static int xio_fputs(const char *str, FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(fputs)(str, f), f, ret >= 0 && str ? (int64_t)strlen(str) : -1)
}

/* Formatted calls: the variadic ones call the real va_list form (the C99 scanf forms for __isoc99_*). */
static int (*real_vfprintf)(FILE *, const char *, va_list);
static int vfprintf_recorded(FILE *f, const char *fmt, va_list ap)
{
    RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(vfprintf)(f, fmt, ap), f, ret >= 0 ? (int64_t)ret : -1)
}
static int xio_vfprintf(FILE *f, const char *fmt, va_list ap) { return vfprintf_recorded(f, fmt, ap); }
static int xio_fprintf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfprintf_recorded(f, fmt, ap);
    va_end(ap);
    return ret;
}
static int xio_vprintf(const char *fmt, va_list ap) { return vfprintf_recorded(stdout, fmt, ap); }
static int xio_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfprintf_recorded(stdout, fmt, ap);
    va_end(ap);
    return ret;
}

/* The fortified forms (_FORTIFY_SOURCE), with their flag: the real __vfprintf_chk does the checks. */
static int (*real___vfprintf_chk)(FILE *, int, const char *, va_list);
static int vfprintf_chk_recorded(FILE *f, int flag, const char *fmt, va_list ap)
{
    RECORD_STDIO(XIO_OP_STDIO_WRITE, int, REAL(__vfprintf_chk)(f, flag, fmt, ap), f, ret >= 0 ? (int64_t)ret : -1)
}
static int xio___vfprintf_chk(FILE *f, int flag, const char *fmt, va_list ap)
{
    return vfprintf_chk_recorded(f, flag, fmt, ap);
}
static int xio___fprintf_chk(FILE *f, int flag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfprintf_chk_recorded(f, flag, fmt, ap);
    va_end(ap);
    return ret;
}
static int xio___vprintf_chk(int flag, const char *fmt, va_list ap)
{
    return vfprintf_chk_recorded(stdout, flag, fmt, ap);
}
static int xio___printf_chk(int flag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = vfprintf_chk_recorded(stdout, flag, fmt, ap);
    va_end(ap);
    return ret;
}
static char *(*real___fgets_chk)(char *, size_t, int, FILE *);
static char *xio___fgets_chk(char *buf, size_t size, int n, FILE *f)
{
    RECORD_STDIO(XIO_OP_STDIO_READ, char *, REAL(__fgets_chk)(buf, size, n, f), f,
                 ret ? (int64_t)strlen(ret) : ferror(f) ? -1 : 0)
}
/* Only their wrappers' addresses are used (hook tables): the real calls go through the va_list forms. */
static int (*real_fprintf)(FILE *, const char *, ...);
static int (*real_printf)(const char *, ...);
static int (*real_vprintf)(const char *, va_list);
static int (*real___fprintf_chk)(FILE *, int, const char *, ...);
static int (*real___printf_chk)(int, const char *, ...);
static int (*real___vprintf_chk)(int, const char *, va_list);
static int (*real_fscanf)(FILE *, const char *, ...);
static int (*real___isoc99_fscanf)(FILE *, const char *, ...);

static int64_t scanned(FILE *f, int64_t before, int ret)
{
    if (ret == EOF && ferror(f))
        return -1;
    int64_t after = before >= 0 ? ftello(f) : -1;
    return after >= before && before >= 0 ? after - before : 0;
}

#define DEFINE_VFSCANF(name, real)                                                                               \
    static int xio_##name(FILE *f, const char *fmt, va_list ap)                                                  \
    {                                                                                                            \
        if (!f || !xio_enter())                                                                                  \
            return REAL(real)(f, fmt, ap);                                                                       \
        int saved = errno;                                                                                       \
        int64_t before = ftello(f);                                                                              \
        errno = saved;                                                                                           \
        int64_t t0 = xio_ticks();                                                                                \
        int ret = REAL(real)(f, fmt, ap);                                                                        \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                \
        note_stdio(XIO_OP_STDIO_READ, f, t0, t1, scanned(f, before, ret), err);                                  \
        xio_leave();                                                                                             \
        errno = err;                                                                                             \
        return ret;                                                                                              \
    }
static int (*real_vfscanf)(FILE *, const char *, va_list);
static int (*real___isoc99_vfscanf)(FILE *, const char *, va_list);
DEFINE_VFSCANF(vfscanf, vfscanf)
DEFINE_VFSCANF(__isoc99_vfscanf, __isoc99_vfscanf)
static int xio_fscanf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = xio_vfscanf(f, fmt, ap);
    va_end(ap);
    return ret;
}
static int xio___isoc99_fscanf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ret = xio___isoc99_vfscanf(f, fmt, ap);
    va_end(ap);
    return ret;
}

extern int fgetc(FILE *) XIO_ALIAS(xio_fgetc);
extern int getc(FILE *) XIO_ALIAS(xio_getc);
extern int _IO_getc(FILE *) XIO_ALIAS(xio__IO_getc);
extern int getw(FILE *) XIO_ALIAS(xio_getw);
extern char *fgets(char *, int, FILE *) XIO_ALIAS(xio_fgets);
extern int fputc(int, FILE *) XIO_ALIAS(xio_fputc);
extern int putc(int, FILE *) XIO_ALIAS(xio_putc);
extern int _IO_putc(int, FILE *) XIO_ALIAS(xio__IO_putc);
extern int putw(int, FILE *) XIO_ALIAS(xio_putw);
extern int fputs(const char *, FILE *) XIO_ALIAS(xio_fputs);
extern int vfprintf(FILE *, const char *, va_list) XIO_ALIAS(xio_vfprintf);
extern int fprintf(FILE *, const char *, ...) XIO_ALIAS(xio_fprintf);
extern int vprintf(const char *, va_list) XIO_ALIAS(xio_vprintf);
extern int printf(const char *, ...) XIO_ALIAS(xio_printf);
extern int vfscanf(FILE *, const char *, va_list) XIO_ALIAS(xio_vfscanf);
extern int __isoc99_vfscanf(FILE *, const char *, va_list) XIO_ALIAS(xio___isoc99_vfscanf);
extern int fscanf(FILE *, const char *, ...) XIO_ALIAS(xio_fscanf);
extern int __isoc99_fscanf(FILE *, const char *, ...) XIO_ALIAS(xio___isoc99_fscanf);
extern int __vfprintf_chk(FILE *, int, const char *, va_list) XIO_ALIAS(xio___vfprintf_chk);
extern int __fprintf_chk(FILE *, int, const char *, ...) XIO_ALIAS(xio___fprintf_chk);
extern int __vprintf_chk(int, const char *, va_list) XIO_ALIAS(xio___vprintf_chk);
extern int __printf_chk(int, const char *, ...) XIO_ALIAS(xio___printf_chk);
extern char *__fgets_chk(char *, size_t, int, FILE *) XIO_ALIAS(xio___fgets_chk);

static int (*real_fclose)(FILE *);
static int xio_fclose(FILE *f)
{
    if (!f || !xio_enter())
        return REAL(fclose)(f);
    int saved = errno;
    int fd = fileno(f);
    struct xio_fd *e = xio_fd_get(fd);
    struct xio_fd before = e ? *e : (struct xio_fd){0};
    xio_fd_closed(fd); /* glibc's internal close frees it: forgotten before, as close does */
    errno = saved;
    int64_t t0 = xio_ticks();
    int ret = REAL(fclose)(f);
    int err = errno;
    int64_t t1 = xio_ticks();
    if (fd >= 0) {
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
extern void rewind(FILE *) XIO_ALIAS(xio_rewind);
extern int fsetpos(FILE *, const fpos_t *) XIO_ALIAS(xio_fsetpos);
extern int fsetpos64(FILE *, const fpos64_t *) XIO_ALIAS(xio_fsetpos64);
extern FILE *freopen(const char *, const char *, FILE *) XIO_ALIAS(xio_freopen);
extern FILE *freopen64(const char *, const char *, FILE *) XIO_ALIAS(xio_freopen64);
extern int fflush(FILE *) XIO_ALIAS(xio_fflush);
extern int fclose(FILE *) XIO_ALIAS(xio_fclose);

const struct xio_hook xio_hooks_stdio[] = {
    HOOK_PTR(fopen), HOOK_PTR(fopen64), HOOK_PTR(fdopen), HOOK(fread),  HOOK(__fread_chk), HOOK(fwrite),
    HOOK(fseek),     HOOK(fseeko),      HOOK(fseeko64),   HOOK(fflush), HOOK(fclose),
    HOOK(fgetc), HOOK(getc), HOOK(_IO_getc), HOOK(getw), HOOK_PTR(fgets), HOOK_PTR(__fgets_chk), HOOK(fputc),
    HOOK(putc), HOOK(_IO_putc), HOOK(putw), HOOK(fputs), HOOK(vfprintf), HOOK(fprintf), HOOK(vprintf),
    HOOK(printf), HOOK(__vfprintf_chk), HOOK(__fprintf_chk), HOOK(__vprintf_chk), HOOK(__printf_chk),
    HOOK(vfscanf), HOOK(__isoc99_vfscanf), HOOK(fscanf), HOOK(__isoc99_fscanf), HOOK(rewind), HOOK(fsetpos),
    HOOK(fsetpos64), HOOK_PTR(freopen), HOOK_PTR(freopen64),
    {0},
};
