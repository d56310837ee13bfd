/* Wrappers of directory streams: opendir, readdir, readdir64, closedir (os.listdir, os.scandir, os.walk,
 * glob and a dataset's walk over its class folders all come here).
 *
 * opendir is recorded as an open of the directory (its descriptor is remembered as a directory, so a later
 * fstat or fchdir on it names the path) and closedir as its close: glibc closes the descriptor through its
 * internal close, which no wrapper sees, so the descriptor is forgotten here (as fclose does).
 *
 * readdir returns one entry per call from a buffer that glibc refills with getdents64 now and then: a
 * record per entry would be a record per file of the listing. A thread's run of readdir calls on one
 * directory is kept instead (xio_run, in the thread's own memory, records.c) and written as one READDIR record
 * when the run ends: at the end of the directory, at closedir, when the thread records any other call (so the
 * thread's records stay in order and never overlap), after XIO_RUN_CALLS calls, and when the process flushes
 * for good (exit, exec). The record starts at the run's first call and lasts the time spent inside
 * the calls, summed; `bytes` is the entries returned and `requested` the calls made.
 */
#include "xio.h"

#include <dirent.h>
#include <fcntl.h>

/* One readdir call on descriptor `fd`: `got` whether it returned an entry, `err` its errno when it failed. */
static void note_readdir(int fd, int64_t t0, int64_t t1, int got, int err)
{
    struct xio_run *p = &xio_run;
    if (p->calls && (p->fd != fd || p->op != XIO_OP_READDIR))
        xio_run_flush();
    if (err) { /* a failed call is recorded alone, as every failed call is */
        xio_run_flush();
        xio_rec_simple_fd(XIO_OP_READDIR, fd, t0, t1, -1, err, 1, -1);
        return;
    }
    if (!p->calls) {
        struct xio_fd *e = xio_fd_get(fd);
        if (e && e->kind == XIO_KIND_EXCLUDED)
            return;
        p->fd = fd;
        p->path_id = e ? e->path_id : 0;
        /* whatever its open said: a descriptor opened without O_DIRECTORY (os.open, then os.listdir(fd) or
         * os.scandir(fd) through fdopendir, which is not wrapped) was taken for a regular file */
        p->kind = XIO_KIND_DIR;
        p->op = XIO_OP_READDIR;
        p->offset = -1;
        p->first = t0;
        p->busy = 0;
        p->bytes = 0;
    }
    p->calls++;
    p->busy += t1 - t0 > 0 ? t1 - t0 : 0;
    p->bytes += got != 0;
    if (!got || p->calls >= XIO_RUN_CALLS)
        xio_run_flush();
}

static DIR *(*real_opendir)(const char *);
static DIR *xio_opendir(const char *path)
{
    if (!xio_enter())
        return REAL(opendir)(path);
    int64_t t0 = xio_ticks();
    DIR *d = REAL(opendir)(path);
    int err = errno;
    int64_t t1 = xio_ticks();
    xio_rec_open(XIO_OP_OPENDIR, AT_FDCWD, path, t0, t1, d ? dirfd(d) : -1, err, O_RDONLY | O_DIRECTORY);
    xio_leave();
    errno = err;
    return d;
}

/* readdir leaves errno alone at the end of the directory and sets it on an error: the caller's errno is
 * what it sees at the end, the call's on an error. */
#define DEFINE_READDIR(name, ent_type)                                                                           \
    static ent_type *(*real_##name)(DIR *);                                                                      \
    static ent_type *xio_##name(DIR *d)                                                                          \
    {                                                                                                            \
        if (!d || !xio_enter())                                                                                  \
            return REAL(name)(d);                                                                                \
        int saved = errno;                                                                                       \
        errno = 0;                                                                                               \
        int64_t t0 = xio_ticks();                                                                                \
        ent_type *ent = REAL(name)(d);                                                                           \
        int err = errno;                                                                                         \
        int64_t t1 = xio_ticks();                                                                                \
        note_readdir(dirfd(d), t0, t1, ent != NULL, ent ? 0 : err);                                              \
        xio_leave();                                                                                             \
        errno = err ? err : saved;                                                                               \
        return ent;                                                                                              \
    }

DEFINE_READDIR(readdir, struct dirent)
DEFINE_READDIR(readdir64, struct dirent64)

static int (*real_closedir)(DIR *);
static int xio_closedir(DIR *d)
{
    if (!d || !xio_enter())
        return REAL(closedir)(d);
    int saved = errno;
    int fd = dirfd(d);
    if (xio_run.calls && xio_run.fd == fd)
        xio_run_flush();
    struct xio_fd *e = xio_fd_get(fd);
    struct xio_fd before = e ? *e : (struct xio_fd){0};
    xio_fd_closed(fd); /* glibc's internal close frees it: forgotten before, as close does */
    errno = saved;
    int64_t t0 = xio_ticks();
    int ret = REAL(closedir)(d);
    int err = errno;
    int64_t t1 = xio_ticks();
    if (fd >= 0) {
        xio_rec_entry(XIO_OP_CLOSEDIR, fd, e ? &before : NULL, t0, t1, ret == 0 ? 0 : -1, err, -1, -1);
    }
    xio_leave();
    errno = err;
    return ret;
}

extern DIR *opendir(const char *) XIO_ALIAS(xio_opendir);
extern struct dirent *readdir(DIR *) XIO_ALIAS(xio_readdir);
extern struct dirent64 *readdir64(DIR *) XIO_ALIAS(xio_readdir64);
extern int closedir(DIR *) XIO_ALIAS(xio_closedir);

const struct xio_hook xio_hooks_dir[] = {
    HOOK_PTR(opendir),
    HOOK_PTR(readdir),
    HOOK_PTR(readdir64),
    HOOK(closedir),
    {0},
};
