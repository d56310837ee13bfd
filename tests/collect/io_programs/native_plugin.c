/* Two shared objects for the attach test of tests/collect/test_io_native.py, built from this file:
 *   libxio_inner.so  (-DINNER): plugin_read(PATH) opens and reads PATH through its own PLT;
 *   libxio_outer.so: outer_read(PATH) dlopen()s "libxio_inner.so" by name, found through its RUNPATH
 *   ($ORIGIN), and calls plugin_read. Loaded after attach, they exercise the dlopen wrapper: objects
 *   loaded later are patched, and a dlopen by name still searches its caller's RUNPATH. */
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#ifdef INNER
long plugin_read(const char *path)
{
    char buf[4096];
    long total = 0, n;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        total += n;
    close(fd);
    return total;
}
#else
long outer_read(const char *path)
{
    void *inner = dlopen("libxio_inner.so", RTLD_NOW);
    if (!inner)
        return -2;
    long (*plugin_read)(const char *) = (long (*)(const char *))dlsym(inner, "plugin_read");
    return plugin_read ? plugin_read(path) : -3;
}
#endif
