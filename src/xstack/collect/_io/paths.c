/* The descriptor table: one entry per fd (sized from RLIMIT_NOFILE, capped at 1M), mmap'd with MAP_NORESERVE
 * so that only the pages touched cost memory; nothing here calls malloc (a wrapper may run inside the
 * allocator's own I/O). An entry keeps the id of the path its descriptor was opened with: the path's bytes
 * went into the record stream with the open (streams.c), so a record on the descriptor names the id only.
 * Entries are updated without a lock (racing updates of one descriptor's offset are as approximate as the
 * program's own use of it).
 *
 * There is no path table: an earlier version interned every path in a hash index, and in a DataLoader
 * worker, where every path is new, hashing, probing and growing that index cost about 185 ns per open, a
 * third of what the level added to a small-file read. The reader interns the paths instead.
 */
#include "xio.h"

#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FDS (1 << 20)

static int fd_top;

static int fd_table_size(void)
{
    struct rlimit rl;
    rlim_t want = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        want = rl.rlim_cur;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max > want)
            want = rl.rlim_max; /* the program may raise its soft limit later */
    }
    if (want > MAX_FDS || want == RLIM_INFINITY)
        want = MAX_FDS;
    return want < 1024 ? 1024 : (int)want;
}

int xio_tables_init(void)
{
    if (xio.fds)
        return 0;
    int cap = fd_table_size();
    xio.fds = xio_sys_mmap((size_t)cap * sizeof *xio.fds);
    if (!xio.fds)
        return -1;
    xio.fd_cap = cap;
    return 0;
}

/* ---- descriptors ---- */

int xio_fd_kind_raw(int fd)
{
    struct stat st;
    return xio_sys_fstat(fd, &st) == 0 ? xio_kind_of_mode(st.st_mode) : XIO_KIND_UNKNOWN;
}

int xio_fd_max(void) { return __atomic_load_n(&fd_top, __ATOMIC_RELAXED); }

static void note_top(int fd)
{
    int top = __atomic_load_n(&fd_top, __ATOMIC_RELAXED);
    while (fd > top && !__atomic_compare_exchange_n(&fd_top, &top, fd, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

/* The entry of `fd`, discovered with one fstat (and readlink, lseek, fcntl for files) the first time it is
 * seen without an open (pipes, sockets, inherited or internally opened descriptors); NULL when not open. */
struct xio_fd *xio_fd_discover(int fd)
{
    if (fd < 0 || fd >= xio.fd_cap)
        return NULL;
    struct xio_fd *e = &xio.fds[fd];
    if (__atomic_load_n(&e->known, __ATOMIC_ACQUIRE))
        return e;
    struct stat st;
    if (xio_sys_fstat(fd, &st) != 0)
        return NULL;
    struct xio_fd d = {.kind = (uint8_t)xio_kind_of_mode(st.st_mode), .known = 1, .offset = -1};
    if (d.kind != XIO_KIND_PIPE && d.kind != XIO_KIND_SOCKET) {
        char buf[PATH_MAX];
        long n = xio_fd_link(fd, buf, sizeof buf);
        if (n > 0 && xio_path_excluded(buf, (size_t)n)) {
            d.kind = XIO_KIND_EXCLUDED;
        } else if (n > 0) {
            d.path_id = xio_emit_path(buf, (size_t)n);
        }
    }
    if (xio_kind_seekable(d.kind)) { /* offsets and O_APPEND mean nothing on pipes and sockets */
        long off = xio_sys_lseek(fd, 0, SEEK_CUR);
        d.offset = off < 0 ? 0 : off;
        d.soffset = d.offset;
        long fl = syscall(SYS_fcntl, fd, F_GETFL);
        d.append = fl > 0 && (fl & O_APPEND);
    }
    d.known = 0;
    *e = d;
    __atomic_store_n(&e->known, 1, __ATOMIC_RELEASE);
    note_top(fd);
    return e;
}

void xio_fd_opened(int fd, uint32_t path_id, int kind, int flags)
{
    if (fd < 0 || fd >= xio.fd_cap)
        return;
    struct xio_fd *e = &xio.fds[fd];
    *e = (struct xio_fd){.path_id = path_id, .kind = (uint8_t)kind, .append = (flags & O_APPEND) != 0};
    __atomic_store_n(&e->known, 1, __ATOMIC_RELEASE);
    note_top(fd);
}

void xio_fd_closed(int fd)
{
    if (fd >= 0 && fd < xio.fd_cap)
        __atomic_store_n(&xio.fds[fd].known, 0, __ATOMIC_RELEASE);
}

void xio_fd_close_range(unsigned first, unsigned last)
{
    int top = xio_fd_max();
    for (unsigned fd = first; fd <= last && fd <= (unsigned)top; fd++)
        xio_fd_closed((int)fd);
}

void xio_fd_forget_all(void)
{
    if (xio.fds)
        xio_fd_close_range(0, (unsigned)xio_fd_max());
}

void xio_fd_dup(int oldfd, int newfd)
{
    struct xio_fd *e = xio_fd_get(oldfd);
    if (newfd < 0 || newfd >= xio.fd_cap || newfd == oldfd)
        return;
    if (!e) {
        xio_fd_closed(newfd);
        return;
    }
    struct xio_fd copy = *e;
    copy.known = 0;
    xio.fds[newfd] = copy;
    __atomic_store_n(&xio.fds[newfd].known, 1, __ATOMIC_RELEASE);
    note_top(newfd);
}
