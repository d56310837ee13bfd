/* Wrappers of the stat family: by path (stat, lstat, fstatat, statx), by descriptor (fstat, and fstatat /
 * statx with AT_EMPTY_PATH), and the __xstat forms that binaries built against glibc < 2.33 call. */
#include "xio.h"

#include <fcntl.h>
#include <sys/stat.h>

/* glibc >= 2.33 headers no longer declare these. */
extern int __xstat(int, const char *, struct stat *);
extern int __xstat64(int, const char *, struct stat64 *);
extern int __lxstat(int, const char *, struct stat *);
extern int __lxstat64(int, const char *, struct stat64 *);
extern int __fxstat(int, int, struct stat *);
extern int __fxstat64(int, int, struct stat64 *);
extern int __fxstatat(int, int, const char *, struct stat *, int);
extern int __fxstatat64(int, int, const char *, struct stat64 *, int);

static void record_by_path(int op, int dirfd, const char *path, int flags, int64_t t0, int64_t t1, int ret,
                           int err, const void *st, mode_t stx_mode)
{
    if ((flags & AT_EMPTY_PATH) && path && !path[0])
        xio_rec_simple_fd(op, dirfd, t0, t1, ret, err, -1, -1);
    else
        xio_rec_path(op, dirfd, path, t0, t1, ret, err, (const struct stat *)st, stx_mode);
}

#define RECORD_STAT(call, record)                                                                                \
    if (!xio_enter())                                                                                            \
        return call;                                                                                             \
    int64_t t0 = xio_ticks();                                                                                      \
    int ret = call;                                                                                              \
    int err = errno;                                                                                             \
    int64_t t1 = xio_ticks();                                                                                      \
    record;                                                                                                      \
    xio_leave();                                                                                                 \
    errno = err;                                                                                                 \
    return ret;

#define DEFINE_STAT_PATH(name, op, st_type)                                                                      \
    static int (*real_##name)(const char *, st_type *);                                                          \
    static int xio_##name(const char *path, st_type *st)                                                         \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(path, st),                                                                        \
                    xio_rec_path(op, AT_FDCWD, path, t0, t1, ret, err, (const struct stat *)st, 0))               \
    }

#define DEFINE_STAT_FD(name, st_type)                                                                            \
    static int (*real_##name)(int, st_type *);                                                                   \
    static int xio_##name(int fd, st_type *st)                                                                   \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(fd, st), xio_fd_set_mode(fd, ret, st->st_mode);                                   \
                    xio_rec_simple_fd(XIO_OP_FSTAT, fd, t0, t1, ret, err, -1, -1))                                   \
    }

#define DEFINE_STAT_AT(name, st_type)                                                                            \
    static int (*real_##name)(int, const char *, st_type *, int);                                                \
    static int xio_##name(int dirfd, const char *path, st_type *st, int flags)                                   \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(dirfd, path, st, flags),                                                          \
                    record_by_path(XIO_OP_FSTATAT, dirfd, path, flags, t0, t1, ret, err, st, 0))                 \
    }

#define DEFINE_XSTAT_PATH(name, op, st_type)                                                                     \
    static int (*real_##name)(int, const char *, st_type *);                                                     \
    static int xio_##name(int ver, const char *path, st_type *st)                                                \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(ver, path, st),                                                                   \
                    xio_rec_path(op, AT_FDCWD, path, t0, t1, ret, err, (const struct stat *)st, 0))               \
    }

#define DEFINE_XSTAT_FD(name, st_type)                                                                           \
    static int (*real_##name)(int, int, st_type *);                                                              \
    static int xio_##name(int ver, int fd, st_type *st)                                                          \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(ver, fd, st), xio_fd_set_mode(fd, ret, st->st_mode);                              \
                    xio_rec_simple_fd(XIO_OP_FSTAT, fd, t0, t1, ret, err, -1, -1))                                   \
    }

#define DEFINE_XSTAT_AT(name, st_type)                                                                           \
    static int (*real_##name)(int, int, const char *, st_type *, int);                                           \
    static int xio_##name(int ver, int dirfd, const char *path, st_type *st, int flags)                          \
    {                                                                                                            \
        RECORD_STAT(REAL(name)(ver, dirfd, path, st, flags),                                                     \
                    record_by_path(XIO_OP_FSTATAT, dirfd, path, flags, t0, t1, ret, err, st, 0))                 \
    }

DEFINE_STAT_PATH(stat, XIO_OP_STAT, struct stat)
DEFINE_STAT_PATH(stat64, XIO_OP_STAT, struct stat64)
DEFINE_STAT_PATH(lstat, XIO_OP_LSTAT, struct stat)
DEFINE_STAT_PATH(lstat64, XIO_OP_LSTAT, struct stat64)
DEFINE_STAT_FD(fstat, struct stat)
DEFINE_STAT_FD(fstat64, struct stat64)
DEFINE_STAT_AT(fstatat, struct stat)
DEFINE_STAT_AT(fstatat64, struct stat64)
DEFINE_XSTAT_PATH(__xstat, XIO_OP_STAT, struct stat)
DEFINE_XSTAT_PATH(__xstat64, XIO_OP_STAT, struct stat64)
DEFINE_XSTAT_PATH(__lxstat, XIO_OP_LSTAT, struct stat)
DEFINE_XSTAT_PATH(__lxstat64, XIO_OP_LSTAT, struct stat64)
DEFINE_XSTAT_FD(__fxstat, struct stat)
DEFINE_XSTAT_FD(__fxstat64, struct stat64)
DEFINE_XSTAT_AT(__fxstatat, struct stat)
DEFINE_XSTAT_AT(__fxstatat64, struct stat64)

static int (*real_statx)(int, const char *, int, unsigned, struct statx *);
static int xio_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
    RECORD_STAT(REAL(statx)(dirfd, path, flags, mask, st),
                record_by_path(XIO_OP_STATX, dirfd, path, flags, t0, t1, ret, err, NULL,
                               ret == 0 && st ? st->stx_mode : 0))
}

extern int stat(const char *restrict, struct stat *restrict) XIO_ALIAS(xio_stat);
extern int stat64(const char *restrict, struct stat64 *restrict) XIO_ALIAS(xio_stat64);
extern int lstat(const char *restrict, struct stat *restrict) XIO_ALIAS(xio_lstat);
extern int lstat64(const char *restrict, struct stat64 *restrict) XIO_ALIAS(xio_lstat64);
extern int fstat(int, struct stat *) XIO_ALIAS(xio_fstat);
extern int fstat64(int, struct stat64 *) XIO_ALIAS(xio_fstat64);
extern int fstatat(int, const char *restrict, struct stat *restrict, int) XIO_ALIAS(xio_fstatat);
extern int fstatat64(int, const char *restrict, struct stat64 *restrict, int) XIO_ALIAS(xio_fstatat64);
extern int statx(int, const char *restrict, int, unsigned, struct statx *restrict) XIO_ALIAS(xio_statx);
extern int __xstat(int, const char *, struct stat *) XIO_ALIAS(xio___xstat);
extern int __xstat64(int, const char *, struct stat64 *) XIO_ALIAS(xio___xstat64);
extern int __lxstat(int, const char *, struct stat *) XIO_ALIAS(xio___lxstat);
extern int __lxstat64(int, const char *, struct stat64 *) XIO_ALIAS(xio___lxstat64);
extern int __fxstat(int, int, struct stat *) XIO_ALIAS(xio___fxstat);
extern int __fxstat64(int, int, struct stat64 *) XIO_ALIAS(xio___fxstat64);
extern int __fxstatat(int, int, const char *, struct stat *, int) XIO_ALIAS(xio___fxstatat);
extern int __fxstatat64(int, int, const char *, struct stat64 *, int) XIO_ALIAS(xio___fxstatat64);

const struct xio_hook xio_hooks_stat[] = {
    HOOK(stat),       HOOK(stat64),     HOOK(lstat),      HOOK(lstat64),      HOOK(fstat),    HOOK(fstat64),
    HOOK(fstatat),    HOOK(fstatat64),  HOOK(statx),      HOOK(__xstat),      HOOK(__xstat64), HOOK(__lxstat),
    HOOK(__lxstat64), HOOK(__fxstat),   HOOK(__fxstat64), HOOK(__fxstatat),   HOOK(__fxstatat64),
    {0},
};
