/* Descriptor table and path interning.
 *
 * The descriptor table has one entry per fd (sized from RLIMIT_NOFILE, capped at 1M) and the intern table
 * holds up to 1M paths in a 256 MiB arena; both are mmap'd with MAP_NORESERVE, so only the pages touched
 * cost memory, and nothing here calls malloc (a wrapper may run inside the allocator's own I/O). The hash
 * index over the paths starts at 4096 slots and doubles at half full: a process that opens 10,000 files
 * touches a few dozen of its pages, where a full-size index (8 MiB) had it touch every page once (a page
 * fault each, in every DataLoader worker). Looking a path up takes no lock (an entry is complete before its
 * slot is published, and an index is published once filled; older ones stay mapped for lookups still in
 * them); adding one, and queueing it to be written into the current file, run under xio.lock. Descriptor
 * entries are updated without a lock (racing updates of one descriptor's offset are as approximate as the
 * program's own use of it).
 */
#include "xio.h"

#include <fcntl.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_FDS (1 << 20)
#define MAX_PATHS (1u << 20)
#define FIRST_SLOTS 4096u
#define ARENA_BYTES (256ull << 20) /* offsets / 8 fit a slot's 25 bits */

/* A path in the arena: this header, then its bytes, zero-padded to 8. */
struct path_entry {
    uint64_t hash;
    uint32_t len;
    uint32_t gen; /* the file generation this path was last queued to be written in */
    uint32_t id;
    uint32_t pad;
};

static int fd_top;
/* Open addressing over the arena's entries; `used` and the slots are written under xio.lock. A slot holds
 * the entry's arena offset / 8 in its low 25 bits and 7 more bits of its hash above them, so a probe reads
 * an entry (a cache miss) only when those bits match. */
#define SLOT_TAG_SHIFT 25
#define SLOT_OFFSET_MASK ((1u << SLOT_TAG_SHIFT) - 1)
struct path_index {
    uint32_t mask;
    uint32_t used;
    uint32_t slot[];
};

static uint64_t *paths; /* id -> its entry's arena offset; index 0 unused: id 0 means "no path" */
static uint32_t npaths, max_paths;
static struct path_index *index_now; /* replaced (with release) when it grows */
static char *arena;
static size_t arena_used, arena_cap;
_Static_assert((ARENA_BYTES >> 3) <= (1ull << SLOT_TAG_SHIFT), "arena offsets fit a slot");

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

static struct path_index *new_index(uint32_t nslots)
{
    struct path_index *t = xio_sys_mmap(sizeof *t + (size_t)nslots * sizeof t->slot[0]);
    if (t)
        t->mask = nslots - 1;
    return t;
}

int xio_tables_init(void)
{
    if (xio.fds)
        return 0;
    int cap = fd_table_size();
    /* Smaller tables when the kernel refuses the reservation (strict overcommit). */
    for (uint32_t shrink = 0; shrink < 4 && !arena; shrink++) {
        max_paths = MAX_PATHS >> (2 * shrink);
        arena_cap = ARENA_BYTES >> (2 * shrink);
        paths = xio_sys_mmap((size_t)(max_paths + 1) * sizeof *paths);
        arena = paths ? xio_sys_mmap(arena_cap) : NULL;
    }
    arena_used = 8; /* offset 0 would make an empty slot */
    index_now = new_index(FIRST_SLOTS);
    xio.fds = xio_sys_mmap((size_t)cap * sizeof *xio.fds);
    if (!xio.fds || !arena || !index_now)
        return -1;
    xio.fd_cap = cap;
    return 0;
}

/* ---- interning ---- */

/* Eight bytes at a time: FNV over single bytes cost ~1 ns per byte of every opened path. */
static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h | 1;
}

static struct path_entry *entry(uint64_t off) { return (struct path_entry *)(arena + off); }

static uint32_t slot_of(uint64_t off, uint64_t h) { return (uint32_t)(off >> 3) | (uint32_t)(h >> 57) << SLOT_TAG_SHIFT; }

/* The id of `path` in index `t`, or 0 with the first free slot in `*at`. */
static uint32_t probe(const struct path_index *t, const char *path, size_t len, uint64_t h, uint32_t *at)
{
    uint32_t tag = slot_of(0, h), i = (uint32_t)h & t->mask, s;
    for (; (s = __atomic_load_n(&t->slot[i], __ATOMIC_ACQUIRE)) != 0; i = (i + 1) & t->mask) {
        if ((s & ~SLOT_OFFSET_MASK) != tag)
            continue;
        const struct path_entry *e = entry((uint64_t)(s & SLOT_OFFSET_MASK) << 3);
        if (e->hash == h && e->len == len && memcmp(e + 1, path, len) == 0)
            return e->id;
    }
    *at = i;
    return 0;
}

/* Under xio.lock: a twice larger index once this one is half full (kept when mmap fails). */
static void grow_locked(void)
{
    struct path_index *old = index_now, *t;
    if (2 * (old->used + 1) <= old->mask + 1 || old->mask + 1 >= 2 * max_paths ||
        !(t = new_index(2 * (old->mask + 1))))
        return;
    for (uint32_t id = 1; id <= npaths; id++) {
        uint64_t h = entry(paths[id])->hash;
        uint32_t i = (uint32_t)h & t->mask;
        while (t->slot[i])
            i = (i + 1) & t->mask;
        t->slot[i] = slot_of(paths[id], h);
    }
    t->used = old->used;
    __atomic_store_n(&index_now, t, __ATOMIC_RELEASE);
}

/* Called before an open's (or a stat's) real call: brings the index slot an absolute path will be looked up
 * in into the cache while the system call runs; the lookup after it would otherwise wait for memory (the
 * index of a process that opened many files is larger than the caches, and a new path is a miss). */
void xio_path_prefetch(const char *path)
{
    if (!path || path[0] != '/')
        return;
    const struct path_index *t = __atomic_load_n(&index_now, __ATOMIC_ACQUIRE);
    if (t)
        __builtin_prefetch(&t->slot[(uint32_t)hash_bytes(path, strlen(path)) & t->mask]);
}

/* The id of `path` (0 when the table is full: counted in paths_dropped). */
uint32_t xio_intern(const char *path, size_t len)
{
    uint64_t h = hash_bytes(path, len);
    uint32_t at = 0, id = probe(__atomic_load_n(&index_now, __ATOMIC_ACQUIRE), path, len, h, &at);
    if (id)
        return id;
    size_t need = (sizeof(struct path_entry) + len + 7) & ~(size_t)7;
    pthread_mutex_lock(&xio.lock);
    grow_locked();
    struct path_index *t = index_now;
    if ((id = probe(t, path, len, h, &at)) == 0) { /* not added by another thread meanwhile */
        if (npaths >= max_paths || arena_used + need > arena_cap || t->used + 2 > t->mask) {
            __atomic_add_fetch(&xio.paths_dropped, 1, __ATOMIC_RELAXED);
        } else {
            id = ++npaths;
            struct path_entry *e = entry(arena_used);
            *e = (struct path_entry){.hash = h, .len = (uint32_t)len, .id = id};
            memcpy(e + 1, path, len); /* the padding is still zero: the arena is only ever appended to */
            paths[id] = arena_used;
            arena_used += need;
            t->used++;
            xio_append_path_locked(id); /* queued now: its first record would take the lock again for it */
            e->gen = xio.gen;
            __atomic_store_n(&t->slot[at], slot_of(paths[id], h), __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&xio.lock);
    return id;
}

const char *xio_path_bytes(uint32_t id, uint32_t *len)
{
    const struct path_entry *e = entry(paths[id]);
    *len = e->len;
    return (const char *)(e + 1);
}

/* A record is about to name path `id`: queue the path to be written into the current file, the first time.
 * The path is queued before the record is published, so a flush never writes the record without it. */
void xio_path_note_use(uint32_t id)
{
    struct path_entry *e = entry(paths[id]);
    if (XIO_LIKELY(__atomic_load_n(&e->gen, __ATOMIC_ACQUIRE) == xio.gen))
        return;
    pthread_mutex_lock(&xio.lock);
    if (e->gen != xio.gen) {
        xio_append_path_locked(id);
        __atomic_store_n(&e->gen, xio.gen, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&xio.lock);
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
            d.path_id = xio_intern(buf, (size_t)n);
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
