/* Descriptor table, path resolution and interning, exclusions.
 *
 * The descriptor table has one entry per fd (sized from RLIMIT_NOFILE, capped at 1M) and the intern table
 * holds up to 1M paths in a 256 MiB arena; both are mmap'd with MAP_NORESERVE, so only the pages touched
 * cost memory, and nothing here calls malloc (a wrapper may run inside the allocator's own I/O).
 * Interning runs under the recording lock; descriptor entries are updated without a lock (racing updates
 * of one descriptor's offset are as approximate as the program's own use of it).
 */
#include "xio.h"

#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FDS (1 << 20)
#define MAX_PATHS (1u << 20)
#define ARENA_BYTES (256ull << 20)
#define MAX_EXCLUDES 64

struct path_entry {
    uint64_t hash;
    uint64_t off;
    uint32_t len;
    uint32_t gen; /* the file generation this path's record was written in */
};

static struct xio_fd *fds;
static int fd_cap;
static int fd_top;
static struct path_entry *paths; /* index 0 unused: id 0 means "no path" */
static uint32_t npaths, max_paths;
static uint32_t *slots;
static uint32_t slot_mask;
static char *arena;
static size_t arena_used, arena_cap;
static uint32_t file_gen = 1;

static char exclude_buf[PATH_MAX * 8];
static uint32_t exclude_off[MAX_EXCLUDES], exclude_len[MAX_EXCLUDES];
static int nexcludes;

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
    if (fds)
        return 0;
    int cap = fd_table_size();
    /* Smaller tables when the kernel refuses the reservation (strict overcommit). */
    for (uint32_t shrink = 0; shrink < 4 && !arena; shrink++) {
        max_paths = MAX_PATHS >> (2 * shrink);
        arena_cap = ARENA_BYTES >> (2 * shrink);
        paths = xio_sys_mmap((size_t)(max_paths + 1) * sizeof *paths);
        slots = xio_sys_mmap((size_t)max_paths * 2 * sizeof *slots);
        arena = paths && slots ? xio_sys_mmap(arena_cap) : NULL;
    }
    slot_mask = max_paths * 2 - 1;
    fds = xio_sys_mmap((size_t)cap * sizeof *fds);
    if (!fds || !arena)
        return -1;
    fd_cap = cap;
    return 0;
}

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

/* ---- interning ---- */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h | 1;
}

uint32_t xio_intern_locked(const char *path, size_t len)
{
    uint64_t h = hash_bytes(path, len);
    uint32_t i = (uint32_t)h & slot_mask;
    for (; slots[i]; i = (i + 1) & slot_mask) {
        struct path_entry *e = &paths[slots[i]];
        if (e->hash == h && e->len == len && memcmp(arena + e->off, path, len) == 0)
            return slots[i];
    }
    if (npaths >= max_paths || arena_used + len > arena_cap) {
        xio.paths_dropped++;
        return 0;
    }
    uint32_t id = ++npaths;
    memcpy(arena + arena_used, path, len);
    paths[id] = (struct path_entry){.hash = h, .off = arena_used, .len = (uint32_t)len, .gen = 0};
    arena_used += len;
    slots[i] = id;
    return id;
}

const char *xio_path_bytes(uint32_t id, uint32_t *len)
{
    *len = paths[id].len;
    return arena + paths[id].off;
}

/* Called under the recording lock: 1 the first time `id` is used in the current file. */
int xio_path_needs_write(uint32_t id)
{
    if (paths[id].gen == file_gen)
        return 0;
    paths[id].gen = file_gen;
    return 1;
}

void xio_paths_new_file(void) { file_gen++; }

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

static long fd_link(int fd, char *buf, size_t cap)
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
    struct xio_fd *e = xio_fd_get(dirfd);
    if (e && e->path_id) {
        uint32_t len;
        const char *p = xio_path_bytes(e->path_id, &len);
        if (len >= cap)
            return -1;
        memcpy(buf, p, len);
        return len;
    }
    return fd_link(dirfd, buf, cap);
}

/* Resolves `path` (relative to dirfd or the cwd) and interns it; 0 when unknown, and when excluded (then
 * *excluded is set). */
uint32_t xio_path_at(int dirfd, const char *path, int *excluded)
{
    char buf[PATH_MAX];
    size_t n = 0, len;
    *excluded = 0;
    if (!path)
        return 0;
    len = strlen(path);
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
    if (xio_path_excluded(buf, n)) {
        *excluded = 1;
        return 0;
    }
    pthread_mutex_lock(&xio.lock);
    uint32_t id = xio_intern_locked(buf, n);
    pthread_mutex_unlock(&xio.lock);
    return id;
too_long:
    __atomic_add_fetch(&xio.paths_dropped, 1, __ATOMIC_RELAXED);
    return 0;
}

/* ---- descriptors ---- */

int xio_kind_of_mode(mode_t mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return XIO_KIND_FILE;
    case S_IFDIR: return XIO_KIND_DIR;
    case S_IFIFO: return XIO_KIND_PIPE;
    case S_IFSOCK: return XIO_KIND_SOCKET;
    case S_IFCHR: return XIO_KIND_CHR;
    case S_IFBLK: return XIO_KIND_BLK;
    default: return XIO_KIND_UNKNOWN;
    }
}

int xio_kind_seekable(int kind)
{
    return kind == XIO_KIND_FILE || kind == XIO_KIND_BLK || kind == XIO_KIND_DIR;
}

int xio_fd_kind_raw(int fd)
{
    struct stat st;
    return xio_sys_fstat(fd, &st) == 0 ? xio_kind_of_mode(st.st_mode) : XIO_KIND_UNKNOWN;
}

/* A successful fstat of a known descriptor says what it is (opens guess "file" without asking). */
void xio_fd_set_mode(int fd, int ret, mode_t mode)
{
    struct xio_fd *e = xio_fd_get_known(fd);
    if (ret == 0 && e && e->kind != XIO_KIND_EXCLUDED)
        e->kind = (uint8_t)xio_kind_of_mode(mode);
}

int xio_fd_max(void) { return __atomic_load_n(&fd_top, __ATOMIC_RELAXED); }

static void note_top(int fd)
{
    int top = __atomic_load_n(&fd_top, __ATOMIC_RELAXED);
    while (fd > top && !__atomic_compare_exchange_n(&fd_top, &top, fd, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

struct xio_fd *xio_fd_get_known(int fd)
{
    if (fd < 0 || fd >= fd_cap || !__atomic_load_n(&fds[fd].known, __ATOMIC_ACQUIRE))
        return NULL;
    return &fds[fd];
}

/* The entry of `fd`, discovered with one fstat (and readlink for files) the first time it is seen without
 * an open (pipes, sockets, inherited or internally opened descriptors); NULL when fd is not open. */
struct xio_fd *xio_fd_get(int fd)
{
    if (fd < 0 || fd >= fd_cap)
        return NULL;
    struct xio_fd *e = &fds[fd];
    if (__atomic_load_n(&e->known, __ATOMIC_ACQUIRE))
        return e;
    struct stat st;
    if (xio_sys_fstat(fd, &st) != 0)
        return NULL;
    struct xio_fd d = {.kind = (uint8_t)xio_kind_of_mode(st.st_mode), .known = 1, .offset = -1};
    if (d.kind != XIO_KIND_PIPE && d.kind != XIO_KIND_SOCKET) {
        char buf[PATH_MAX];
        long n = fd_link(fd, buf, sizeof buf);
        if (n > 0 && xio_path_excluded(buf, (size_t)n)) {
            d.kind = XIO_KIND_EXCLUDED;
        } else if (n > 0) {
            pthread_mutex_lock(&xio.lock);
            d.path_id = xio_intern_locked(buf, (size_t)n);
            pthread_mutex_unlock(&xio.lock);
        }
    }
    if (xio_kind_seekable(d.kind)) {
        long off = xio_sys_lseek(fd, 0, SEEK_CUR);
        d.offset = off < 0 ? 0 : off;
        d.soffset = d.offset;
    }
    long fl = syscall(SYS_fcntl, fd, F_GETFL);
    d.append = fl > 0 && (fl & O_APPEND);
    d.known = 0;
    *e = d;
    __atomic_store_n(&e->known, 1, __ATOMIC_RELEASE);
    note_top(fd);
    return e;
}

void xio_fd_opened(int fd, uint32_t path_id, int kind, int flags)
{
    if (fd < 0 || fd >= fd_cap)
        return;
    struct xio_fd *e = &fds[fd];
    *e = (struct xio_fd){.path_id = path_id, .kind = (uint8_t)kind, .append = (flags & O_APPEND) != 0};
    __atomic_store_n(&e->known, 1, __ATOMIC_RELEASE);
    note_top(fd);
}

void xio_fd_closed(int fd)
{
    if (fd >= 0 && fd < fd_cap)
        __atomic_store_n(&fds[fd].known, 0, __ATOMIC_RELEASE);
}

void xio_fd_close_range(unsigned first, unsigned last)
{
    int top = xio_fd_max();
    for (unsigned fd = first; fd <= last && fd <= (unsigned)top; fd++)
        xio_fd_closed((int)fd);
}

void xio_fd_forget_all(void)
{
    if (fds)
        xio_fd_close_range(0, (unsigned)xio_fd_max());
}

void xio_fd_dup(int oldfd, int newfd)
{
    struct xio_fd *e = xio_fd_get(oldfd);
    if (newfd < 0 || newfd >= fd_cap || newfd == oldfd)
        return;
    if (!e) {
        xio_fd_closed(newfd);
        return;
    }
    struct xio_fd copy = *e;
    copy.known = 0;
    fds[newfd] = copy;
    __atomic_store_n(&fds[newfd].known, 1, __ATOMIC_RELEASE);
    note_top(newfd);
}
