/* Building a record from a wrapped call: the descriptor's path, kind and tracked offset. */
#include "xio.h"

#include <fcntl.h>
#include <string.h>

static int is_write(int op) { return op == XIO_OP_WRITE || op == XIO_OP_WRITEV; }

/* Reads and writes. `ret`: bytes moved or -1; `pos` >= 0 for positional calls (pread, pwrite: the tracked
 * offset stays), -1 for calls that start at and move the descriptor's offset. */
void xio_rec_fd(int op, int fd, int64_t t0, int64_t t1, int64_t ret, int err, int64_t requested, int64_t pos)
{
    struct xio_fd *e = xio_fd_get(fd);
    if (e && e->kind == XIO_KIND_EXCLUDED)
        return;
    struct xio_rec r;
    xio_rec_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = requested;
    r.bytes = ret >= 0 ? ret : -1;
    r.err = ret < 0 ? err : 0;
    if (e) {
        r.path_id = e->path_id;
        r.kind = e->kind;
        if (!xio_kind_seekable(e->kind)) {
            r.offset = -1;
        } else if (pos >= 0) {
            r.offset = pos;
        } else if (e->append && is_write(op) && ret >= 0) {
            /* O_APPEND writes land at the end of the file, wherever the offset was */
            long end = xio_sys_lseek(fd, 0, SEEK_CUR);
            r.offset = end >= 0 ? end - ret : e->offset;
            if (end >= 0)
                e->offset = end;
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
void xio_rec_entry(int op, int fd, const struct xio_fd *e, int64_t t0, int64_t t1, int ret, int err,
                   int64_t requested, int64_t offset)
{
    if (e && e->kind == XIO_KIND_EXCLUDED)
        return;
    struct xio_rec r;
    xio_rec_init(&r, op, t0, t1);
    r.fd = fd;
    r.requested = requested;
    r.offset = offset;
    r.err = ret < 0 ? err : 0;
    if (e) {
        r.path_id = e->path_id;
        r.kind = e->kind;
    }
    xio_emit(&r);
}

void xio_rec_simple_fd(int op, int fd, int64_t t0, int64_t t1, int ret, int err, int64_t requested,
                       int64_t offset)
{
    xio_rec_entry(op, fd, xio_fd_get(fd), t0, t1, ret, err, requested, offset);
}

/* What a descriptor opened by path is, without a syscall where the flags or the path say: a directory with
 * O_DIRECTORY, else a regular file, except under /dev and /proc (devices, FIFOs) where one fstat asks. A
 * regular-looking path that is a FIFO is corrected by the program's own fstat, which nearly every open is
 * followed by (Python's open does one), see xio_fd_set_mode. An fstat per open cost ~0.3 us, a fifth of the
 * level's overhead on a loop of small-file reads. */
static int open_kind(int fd, const char *path, int flags)
{
    if (flags & O_DIRECTORY)
        return XIO_KIND_DIR;
    if (path && (strncmp(path, "/dev/", 5) == 0 || strncmp(path, "/proc/", 6) == 0))
        return xio_fd_kind_raw(fd);
    return XIO_KIND_FILE;
}

/* open, openat, creat, fopen: resolve the path, remember what the new descriptor is. */
void xio_rec_open(int op, int dirfd, const char *path, int64_t t0, int64_t t1, int fd, int err, int flags)
{
    int excluded;
    uint32_t id = xio_path_at(dirfd, path, &excluded);
    int kind = fd >= 0 ? open_kind(fd, path, flags) : XIO_KIND_UNKNOWN;
    if (fd >= 0)
        xio_fd_opened(fd, id, excluded ? XIO_KIND_EXCLUDED : kind, flags);
    if (excluded)
        return;
    struct xio_rec r;
    xio_rec_init(&r, op, t0, t1);
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
    struct xio_rec r;
    xio_rec_init(&r, op, t0, t1);
    r.path_id = id;
    r.err = ret < 0 ? err : 0;
    if (ret == 0)
        r.kind = (uint8_t)xio_kind_of_mode(st ? st->st_mode : stx_mode);
    xio_emit(&r);
}
