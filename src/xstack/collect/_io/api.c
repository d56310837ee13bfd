/* Attach mode's exported entry points, and finding the real functions behind the wrappers. */
#include "xio.h"

#include <dlfcn.h>
#include <string.h>

/* ---- attach mode: the entry points Python calls through ctypes ---- */

static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
static char attach_error[512];

static int attach_fail(const char *msg)
{
    size_t n = strlen(msg);
    if (n >= sizeof attach_error)
        n = sizeof attach_error - 1;
    memcpy(attach_error, msg, n);
    attach_error[n] = 0;
    return -1;
}

static int attach_impl(const char *dir, const char *exclude, int64_t max_records)
{
    int rc = 0;
    pthread_mutex_lock(&attach_lock);
    xio_init_early();
    if (xio.mode == XIO_MODE_PRELOAD && !xio.ended)
        rc = attach_fail("the io library is preloaded in this process (LD_PRELOAD): it records already");
    else if (xio.mode == XIO_MODE_ATTACH && !xio.ended)
        rc = attach_fail("already attached");
    else if (!xio_attach_supported())
        rc = attach_fail("attach mode is not supported on this architecture (x86_64 and aarch64 only)");
    if (rc == 0) {
        xio_resolve_reals(1);
        xio_fd_forget_all(); /* closes while detached went unseen */
        xio.seq = xio.start_ns ? xio.seq + 1 : 0;
        if (xio_session_start(XIO_MODE_ATTACH, dir, exclude,
                              max_records > 0 ? (uint64_t)max_records : XIO_DEFAULT_MAX_RECORDS) != 0)
            rc = attach_fail("cannot create the record file in the output directory (see stderr)");
    }
    if (rc == 0 && xio_attach_patch(attach_error, sizeof attach_error) != 0) {
        xio_attach_unpatch();
        xio_session_flush(XIO_END_DETACH, 1);
        xio.mode = XIO_MODE_OFF;
        rc = -1;
    }
    pthread_mutex_unlock(&attach_lock);
    return rc;
}
XIO_EXPORT int xstack_io_attach(const char *dir, const char *exclude, int64_t max_records)
    __attribute__((alias("attach_impl")));

static void detach_impl(void)
{
    pthread_mutex_lock(&attach_lock);
    if (xio.mode == XIO_MODE_ATTACH) {
        xio_attach_unpatch();
        xio_session_flush(XIO_END_DETACH, 1);
        xio.mode = XIO_MODE_OFF;
    }
    pthread_mutex_unlock(&attach_lock);
}
XIO_EXPORT void xstack_io_detach(void) __attribute__((alias("detach_impl")));

static const char *error_impl(void) { return attach_error; }
XIO_EXPORT const char *xstack_io_error(void) __attribute__((alias("error_impl")));

/* ---- real functions ---- */

static long enosys_int(void)
{
    errno = ENOSYS;
    return -1;
}

static void *enosys_ptr(void)
{
    errno = ENOSYS;
    return NULL;
}

static void *find_real(void *handle, const struct xio_hook *h)
{
    static const char *const versions[] = {"GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    void *p = dlsym(handle, h->name);
    for (size_t i = 0; !p && i < sizeof versions / sizeof versions[0]; i++)
        p = dlvsym(handle, h->name, versions[i]); /* symbols that are compat-only in newer glibc */
    return p;
}

/* attach: 1 attach mode (global lookup), 0 preload (RTLD_NEXT), -1 lazy call from a wrapper. */
void xio_resolve_reals(int attach)
{
    static const struct xio_hook *const tables[] = {xio_hooks_posix, xio_hooks_stat, xio_hooks_stdio, xio_hooks_dir,
                                                    xio_hooks_proc, xio_hooks_attach_only, xio_hooks_signal};
    if (attach < 0)
        attach = xio.mode == XIO_MODE_ATTACH;
    int saved_errno = errno;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        for (const struct xio_hook *h = tables[t]; h->name; h++) {
            void *p = find_real(attach ? RTLD_DEFAULT : RTLD_NEXT, h);
            if (p == h->wrapper)
                p = find_real(RTLD_NEXT, h);
            if (!p || p == h->wrapper)
                p = h->returns_pointer ? (void *)enosys_ptr : (void *)enosys_int;
            __atomic_store_n(h->real, p, __ATOMIC_RELEASE);
        }
    }
    errno = saved_errno;
}
