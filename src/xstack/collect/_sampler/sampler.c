/* The system level's sampler thread, in C: the profiled process tree and the machine, read from getrusage and
 * /proc into rows of int64 that Python turns into counters once the region has ended
 * (xstack/collect/_system_native.py, then write_processes and write_machine in _system_proc.py).
 *
 * Why C: a Python sampler thread must take the interpreter lock for every sample. When the program's thread
 * holds it, the program must hand it over and wait until the sampler's thread has been scheduled and has
 * given it back, and each /proc read lets it go and take it again; on a small, busy machine that coupling
 * cost a pure-Python loop up to a few percent (bench/system_overhead.py). This thread never touches the
 * interpreter: it only shares memory with Python, read after it has stopped.
 *
 * It does what the Python sampler (collect/_system_sampler.py, collect/_system_proc.py) does, row for row, so
 * the two are interchangeable and tested alike:
 *  - schedule: sample k is due at start + k * interval (CLOCK_MONOTONIC); a sample that comes too late to
 *    keep the next due time skips the ticks it missed and counts them late; stop wakes the thread at once
 *    (a condition variable on CLOCK_MONOTONIC);
 *  - every sample: the root's CPU times and context switches (getrusage, less this thread's own switches);
 *  - a full sample every full_period_ns, the first and the last: the root's RSS, threads and I/O (rchar
 *    without the bytes this thread read from /proc), every descendant (found through each thread's
 *    /proc/PID/task/TID/children every rediscover_ns; their context switches summed over their threads'
 *    status files, ended threads kept), and the machine (/proc/stat per core, procs running/blocked,
 *    /proc/meminfo);
 *  - past buffer_cap_bytes of rows, every other sample is dropped and the interval doubles;
 *  - each descendant's parent pid and command line are read when it is first seen, and whether it was forked
 *    from that parent and has not exec'd since (its parent's command line and stack; read once more at the
 *    next listing, in case it was seen between its fork and its exec): Python tells the helpers of
 *    multiprocessing and the subprocesses with their own processes by them, and a helper may end long before
 *    the sampler stops.
 * Where Python gives it journal files (two fds), the thread also appends the rows it took since its last append
 * to one of them, at most every JOURNAL_PERIOD_NS, after a sample (one writev): a process killed outright (the
 * out-of-memory killer) then keeps its samples up to the last append, which xstack/salvage.py reads into the
 * salvaged run. A block is two int64 (JOURNAL_PROC or JOURNAL_MACHINE, the number of values) then the values;
 * past JOURNAL_FILE_CAP bytes the thread goes on in the other file, emptied first, so that the last minutes are
 * kept in bounded space. Only this thread touches its row buffers, so no lock is needed.
 * The /proc files stay open and are re-read with pread from offset 0. Every file operation is a raw system
 * call, so the io level's interposition library, when preloaded, never sees the sampler's reads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define XS_EXPORT __attribute__((visibility("default")))
#define MISSING (-1)
#define PROC_FIELDS 10
#define PROC_STRIDE (3 + PROC_FIELDS)
#define MACHINE_HEAD 6
#define STACK_START 25 /* startstack, field 28 of /proc/PID/stat, among stat_fields' fields */
#define MAX_CPUS 4096
#define JOIN_TIMEOUT_S 5
#define JOURNAL_PERIOD_NS 250000000LL
#define JOURNAL_FILE_CAP (8LL << 20)
#define JOURNAL_PROC 1
#define JOURNAL_MACHINE 2

struct xs_params {
    int64_t interval_ns;
    int64_t full_period_ns;
    int64_t rediscover_ns;
    int64_t buffer_cap_bytes;
    int32_t root;
    int32_t max_errors;
    int32_t journal_fd[2]; /* files to append the rows to (see the top), or -1 */
};

struct xs_stats {
    int64_t samples, late, halvings, errors, busy_ns, thread_cpu_ns, step, max_children;
    int64_t proc_values, machine_values, bytes_read, journal_appends;
    int32_t journal_failed, tid, children_listed, stuck, nseen, ncpus, machine_stride, io_unreadable, io_unreadable_pid;
};

struct tfile { /* a thread's children or status file */
    int tid, fd;
    int64_t vol, invol; /* status: the switches as last read */
};

struct proc {
    int pid, stat_fd, io_fd, nthreads, listed;
    int cmd; /* its entry in xs_sampler.cmds, or -1 */
    struct tfile *kids, *status;
    int nkids, capkids, nstatus, capstatus;
    int64_t dead_vol, dead_invol;
};

struct cmd { /* a descendant's parent and command line, as first read */
    int32_t pid, ppid, inherited, recheck, len; /* ppid: 0 unknown; inherited: forked from it, no exec since */
    char *argv;                                 /* NUL-separated, as /proc/PID/cmdline; NULL when unreadable */
};

struct vec { /* int64 rows */
    int64_t *v;
    size_t n, cap;
};

struct xs_sampler {
    struct xs_params p;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping, started, joined, open_errno;
    char open_error[256];
    /* the tree */
    struct proc *procs; /* procs[0] is the root */
    int nprocs, capprocs;
    int32_t *seen;
    int nseen, capseen;
    struct cmd *cmds;
    int ncmds, capcmds;
    int64_t max_children, bytes_read, next_listing;
    int children_listed, io_unreadable, io_unreadable_pid;
    char io_unreadable_reason[160];
    /* the machine */
    int stat_fd, meminfo_fd, ncpus;
    char cpu_names[MAX_CPUS * 8];
    /* rows and counts */
    struct vec proc_rows, machine_rows;
    int64_t samples, late, halvings, errors, failing, busy_ns, thread_cpu_ns, step, start_ns, last_full;
    int tid, stuck;
    char first_error[256];
    char *buf;
    size_t bufcap;
    /* the journal: values of each buffer appended, the newest row's time, the file in use, its size */
    size_t journal_proc, journal_machine;
    int64_t journal_proc_ts, journal_machine_ts, journal_last, journal_bytes, journal_appends;
    int journal_file, journal_failed;
};

/* ---- raw system calls ---- */

static int sys_open(const char *path) { return (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC); }
static void sys_close(int fd)
{
    if (fd >= 0)
        syscall(SYS_close, fd);
}

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t real_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The whole file behind `fd` from offset 0 into s->buf (NUL-terminated); its length, or -1 (errno set). */
static long read_file(struct xs_sampler *s, int fd)
{
    for (;;) {
        long n = syscall(SYS_pread64, fd, s->buf, s->bufcap - 1, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if ((size_t)n < s->bufcap - 1) {
            s->buf[n] = 0;
            s->bytes_read += n;
            return n;
        }
        char *bigger = realloc(s->buf, s->bufcap * 2);
        if (!bigger) {
            errno = ENOMEM;
            return -1;
        }
        s->buf = bigger;
        s->bufcap *= 2;
    }
}

static int vec_push(struct vec *v, const int64_t *row, size_t n)
{
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4096;
        while (cap < v->n + n)
            cap *= 2;
        int64_t *bigger = realloc(v->v, cap * sizeof *bigger);
        if (!bigger)
            return -1;
        v->v = bigger;
        v->cap = cap;
    }
    memcpy(v->v + v->n, row, n * sizeof *row); /* a row is never left half written */
    v->n += n;
    return 0;
}

static void fail(struct xs_sampler *s, const char *what, int err)
{
    if (!s->first_error[0])
        snprintf(s->first_error, sizeof s->first_error, "%s: %s", what, strerror(err));
}

/* ---- parsing ---- */

/* The integers after the ") " of a /proc/PID/stat text (the name in parentheses may hold spaces), into
 * f[0..n): f[0] is the state letter. Returns the fields found. */
static int stat_fields(const char *text, int64_t *f, int n)
{
    const char *p = strrchr(text, ')');
    if (!p)
        return 0;
    p += 2;
    int i = 0;
    while (i < n && *p) {
        while (*p == ' ')
            p++;
        if (!*p || *p == '\n')
            break;
        if (i == 0) {
            f[i++] = (unsigned char)*p;
            while (*p && *p != ' ')
                p++;
            continue;
        }
        f[i++] = strtoll(p, (char **)&p, 10);
    }
    return i;
}

/* The number after `key` in `text`, or -1. */
static int64_t number_after(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* ---- the tree ---- */

static void add_seen(struct xs_sampler *s, int pid)
{
    for (int i = 0; i < s->nseen; i++)
        if (s->seen[i] == pid)
            return;
    if (s->nseen == s->capseen) {
        int cap = s->capseen ? s->capseen * 2 : 16;
        int32_t *bigger = realloc(s->seen, cap * sizeof *bigger);
        if (!bigger)
            return;
        s->seen = bigger;
        s->capseen = cap;
    }
    s->seen[s->nseen++] = pid;
}

/* A process whose /proc/PID/io cannot be read (`err`: EACCES or EPERM): counted, the first one kept. */
static void io_unreadable(struct xs_sampler *s, int pid, int err)
{
    if (!s->io_unreadable++) {
        s->io_unreadable_pid = pid;
        snprintf(s->io_unreadable_reason, sizeof s->io_unreadable_reason, "[Errno %d] %s: '/proc/%d/io'", err,
                 strerror(err), pid);
    }
}

static int open_io(struct xs_sampler *s, int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/io", pid);
    int fd = sys_open(path);
    if (fd < 0 && (errno == EACCES || errno == EPERM))
        io_unreadable(s, pid, errno);
    return fd;
}

static struct proc *find(struct xs_sampler *s, int pid)
{
    for (int i = 0; i < s->nprocs; i++)
        if (s->procs[i].pid == pid)
            return &s->procs[i];
    return NULL;
}

static struct proc *add_proc(struct xs_sampler *s, int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = sys_open(path);
    if (fd < 0)
        return NULL;
    if (s->nprocs == s->capprocs) {
        int cap = s->capprocs ? s->capprocs * 2 : 8;
        struct proc *bigger = realloc(s->procs, cap * sizeof *bigger);
        if (!bigger) {
            sys_close(fd);
            return NULL;
        }
        s->procs = bigger;
        s->capprocs = cap;
    }
    struct proc *p = &s->procs[s->nprocs++];
    *p = (struct proc){.pid = pid, .stat_fd = fd, .listed = -1, .cmd = -1};
    p->io_fd = open_io(s, pid);
    return p;
}

static void close_proc(struct proc *p)
{
    sys_close(p->stat_fd);
    sys_close(p->io_fd);
    for (int i = 0; i < p->nkids; i++)
        sys_close(p->kids[i].fd);
    for (int i = 0; i < p->nstatus; i++)
        sys_close(p->status[i].fd);
    free(p->kids);
    free(p->status);
}

static void drop(struct xs_sampler *s, int index)
{
    close_proc(&s->procs[index]);
    s->procs[index] = s->procs[--s->nprocs];
}

static int tfile_push(struct tfile **arr, int *n, int *cap, struct tfile t)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 8;
        struct tfile *bigger = realloc(*arr, c * sizeof *bigger);
        if (!bigger)
            return -1;
        *arr = bigger;
        *cap = c;
    }
    (*arr)[(*n)++] = t;
    return 0;
}

static void end_thread(struct proc *p, int i)
{
    sys_close(p->status[i].fd);
    p->dead_vol += p->status[i].vol;
    p->dead_invol += p->status[i].invol;
    p->status[i] = p->status[--p->nstatus];
}

static int has_tid(const int *tids, int n, int tid)
{
    for (int i = 0; i < n; i++)
        if (tids[i] == tid)
            return 1;
    return 0;
}

/* Open the children (and, for a descendant, status) file of each new thread; close those of threads gone. */
static void list_threads(struct xs_sampler *s, struct proc *p)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", p->pid);
    int dir = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return;
    int *tids = NULL, ntids = 0, captids = 0;
    char dents[8192];
    for (;;) {
        long n = syscall(SYS_getdents64, dir, dents, sizeof dents);
        if (n <= 0)
            break;
        for (long at = 0; at < n;) {
            unsigned short reclen = *(unsigned short *)(dents + at + 16);
            const char *name = dents + at + 19;
            at += reclen;
            if (name[0] < '0' || name[0] > '9')
                continue;
            if (ntids == captids) {
                captids = captids ? captids * 2 : 64;
                int *bigger = realloc(tids, captids * sizeof *bigger);
                if (!bigger)
                    goto done;
                tids = bigger;
            }
            tids[ntids++] = atoi(name);
        }
    }
    p->listed = ntids;
    for (int i = 0; i < ntids; i++) {
        int known = 0;
        for (int j = 0; j < p->nkids && !known; j++)
            known = p->kids[j].tid == tids[i];
        if (known)
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", p->pid, tids[i]);
        int fd = sys_open(path);
        if (fd >= 0 && tfile_push(&p->kids, &p->nkids, &p->capkids, (struct tfile){tids[i], fd, 0, 0}) != 0)
            sys_close(fd);
        if (p->pid == s->p.root)
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%d/status", p->pid, tids[i]);
        fd = sys_open(path);
        if (fd >= 0 && tfile_push(&p->status, &p->nstatus, &p->capstatus, (struct tfile){tids[i], fd, 0, 0}) != 0)
            sys_close(fd);
    }
    for (int j = p->nkids - 1; j >= 0; j--)
        if (!has_tid(tids, ntids, p->kids[j].tid)) {
            sys_close(p->kids[j].fd);
            p->kids[j] = p->kids[--p->nkids];
        }
    for (int j = p->nstatus - 1; j >= 0; j--)
        if (!has_tid(tids, ntids, p->status[j].tid))
            end_thread(p, j);
done:
    free(tids);
    sys_close(dir);
}

/* A copy of /proc/PID/cmdline (its length in *len), or NULL. */
static char *read_cmdline(struct xs_sampler *s, int pid, int *len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    int fd = sys_open(path);
    if (fd < 0)
        return NULL;
    long n = read_file(s, fd);
    sys_close(fd);
    char *copy = n > 0 ? malloc(n) : NULL;
    if (copy) {
        memcpy(copy, s->buf, n);
        *len = (int)n;
    }
    return copy;
}

/* Where the stack of process `pid` starts (0 where unreadable). */
static int64_t stack_start(struct xs_sampler *s, int pid)
{
    char path[64];
    int64_t f[STACK_START + 1];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = sys_open(path);
    if (fd < 0)
        return 0;
    long n = read_file(s, fd);
    sys_close(fd);
    return n > 0 && stat_fields(s->buf, f, STACK_START + 1) == STACK_START + 1 ? f[STACK_START] : 0;
}

/* Read the parent pid of descendant `p` (kept from the first sight: a parent that ends hands its children to
 * another) and its command line into its cmds entry (made at first sight), with whether it was forked from that
 * parent and has not exec'd since: the parent's command line, and the parent's stack. exec places the stack
 * anew, at a random address (ASLR), and a fork keeps it where its parent's is, so a copy of its parent started
 * by exec with the very same command line is not taken for a fork; 0, an address /proc does not show (to a
 * reader not allowed to trace the process, or for one that is ending), leaves the command line alone to tell.
 * A forked process is checked again at the next listing, once (as _system_proc.ProcessTree._note_cmdline). */
static void note_cmdline(struct xs_sampler *s, struct proc *p)
{
    if (p->cmd < 0) {
        if (s->ncmds == s->capcmds) {
            int cap = s->capcmds ? s->capcmds * 2 : 16;
            struct cmd *bigger = realloc(s->cmds, cap * sizeof *bigger);
            if (!bigger)
                return;
            s->cmds = bigger;
            s->capcmds = cap;
        }
        p->cmd = s->ncmds++;
        s->cmds[p->cmd] = (struct cmd){.pid = p->pid, .recheck = 1};
    }
    struct cmd *c = &s->cmds[p->cmd];
    int len = 0, plen = 0, nf = 0;
    int64_t f[STACK_START + 1];
    if (read_file(s, p->stat_fd) >= 0)
        nf = stat_fields(s->buf, f, STACK_START + 1);
    if (!c->ppid && nf >= 2)
        c->ppid = (int32_t)f[1];
    char *argv = read_cmdline(s, p->pid, &len), *parent = NULL;
    if (argv && c->ppid)
        parent = read_cmdline(s, c->ppid, &plen);
    int inherited = argv && parent && len == plen && memcmp(argv, parent, len) == 0;
    if (inherited && nf == STACK_START + 1) {
        int64_t own = f[STACK_START], theirs = stack_start(s, c->ppid);
        inherited = own == theirs || !own || !theirs;
    }
    free(c->argv);
    c->argv = argv;
    c->len = argv ? len : 0;
    c->inherited = inherited;
    c->recheck = c->recheck && c->inherited; /* set at first sight only */
    free(parent);
}

/* Find the descendants through each thread's children file, recursively; open the new ones' files and close
 * those of the processes gone. */
static void relist(struct xs_sampler *s)
{
    int *alive = NULL, nalive = 0, capalive = 0, next = 0;
#define ALIVE_PUSH(pid)                                                                                          \
    do {                                                                                                         \
        if (nalive == capalive) {                                                                                \
            capalive = capalive ? capalive * 2 : 16;                                                             \
            int *bigger = realloc(alive, capalive * sizeof *bigger);                                             \
            if (!bigger)                                                                                         \
                goto out;                                                                                        \
            alive = bigger;                                                                                      \
        }                                                                                                        \
        alive[nalive++] = (pid);                                                                                 \
    } while (0)
    ALIVE_PUSH(s->p.root);
    while (next < nalive) {
        int pid = alive[next++];
        struct proc *p = find(s, pid);
        if (p && p->cmd >= 0 && s->cmds[p->cmd].recheck) {
            s->cmds[p->cmd].recheck = 0; /* the second and last reading */
            note_cmdline(s, p);
        } else if (!p) {
            if (!(p = add_proc(s, pid)))
                continue;
            if (pid != s->p.root)
                note_cmdline(s, p);
        }
        if (p->listed != p->nthreads)
            list_threads(s, p);
        for (int i = 0; i < p->nkids; i++) {
            long n = read_file(s, p->kids[i].fd);
            if (n < 0) { /* the thread ended */
                sys_close(p->kids[i].fd);
                p->kids[i--] = p->kids[--p->nkids];
                p->listed = -1;
                continue;
            }
            for (char *c = s->buf; *c;) {
                char *end;
                long child = strtol(c, &end, 10);
                if (end == c)
                    break;
                c = end;
                if (!has_tid(alive, nalive, (int)child))
                    ALIVE_PUSH((int)child);
            }
        }
    }
#undef ALIVE_PUSH
    for (int i = s->nprocs - 1; i >= 1; i--)
        if (!has_tid(alive, nalive, s->procs[i].pid))
            drop(s, i);
    if (s->nprocs - 1 > s->max_children)
        s->max_children = s->nprocs - 1;
out:
    free(alive);
}

/* rchar, wchar, read_bytes, write_bytes of a process into out[6..9] of a row (MISSING when unreadable);
 * `own`: the bytes read from /proc before this read, taken out of rchar. -1 on an error other than
 * permission (the process ended). */
static int read_io(struct xs_sampler *s, struct proc *p, int own_bytes, int64_t *out)
{
    out[0] = out[1] = out[2] = out[3] = MISSING;
    if (p->io_fd < 0)
        return 0;
    int64_t own = own_bytes ? s->bytes_read : 0;
    if (read_file(s, p->io_fd) < 0) {
        if (errno != EACCES && errno != EPERM)
            return -1;
        io_unreadable(s, p->pid, errno);
        sys_close(p->io_fd);
        p->io_fd = -1;
        return 0;
    }
    out[0] = number_after(s->buf, "\nread_bytes:");
    out[1] = number_after(s->buf, "\nwrite_bytes:");
    out[2] = number_after(s->buf, "rchar:") - own;
    out[3] = number_after(s->buf, "\nwchar:");
    return 0;
}

static long page_size, clock_ticks; /* set by xs_start */
static long page_bytes(void) { return page_size; }
static int64_t ns_per_tick(void) { return 1000000000LL / clock_ticks; }

/* The root's row values; -1 (errno set) when a read failed. */
static int read_root(struct xs_sampler *s, int64_t own_vol, int64_t own_invol, int full, int64_t *v)
{
    struct rusage use;
    if (getrusage(RUSAGE_SELF, &use) != 0)
        return -1;
    v[0] = (int64_t)use.ru_utime.tv_sec * 1000000000LL + use.ru_utime.tv_usec * 1000LL;
    v[1] = (int64_t)use.ru_stime.tv_sec * 1000000000LL + use.ru_stime.tv_usec * 1000LL;
    v[2] = v[3] = MISSING;
    v[4] = use.ru_nvcsw - own_vol;
    v[5] = use.ru_nivcsw - own_invol;
    v[6] = v[7] = v[8] = v[9] = MISSING;
    if (!full)
        return 0;
    struct proc *root = &s->procs[0];
    if (read_file(s, root->stat_fd) < 0)
        return -1;
    int64_t f[24];
    if (stat_fields(s->buf, f, 24) < 24) {
        errno = EPROTO;
        return -1;
    }
    root->nthreads = (int)f[17];
    v[2] = f[21] * page_bytes();
    v[3] = f[17];
    return read_io(s, root, 1, v + 6);
}

/* A descendant's row values; -1 when it ended between two reads. */
static int read_child(struct xs_sampler *s, struct proc *p, int64_t *v)
{
    if (read_file(s, p->stat_fd) < 0)
        return -1;
    int64_t f[24];
    if (stat_fields(s->buf, f, 24) < 24)
        return -1;
    p->nthreads = (int)f[17];
    for (int i = 0; i < p->nstatus; i++) {
        if (read_file(s, p->status[i].fd) < 0) {
            end_thread(p, i--); /* what it had done stays in dead_* */
            continue;
        }
        p->status[i].vol = number_after(s->buf, "\nvoluntary_ctxt_switches:");
        p->status[i].invol = number_after(s->buf, "\nnonvoluntary_ctxt_switches:");
    }
    int64_t vol = p->dead_vol, invol = p->dead_invol;
    for (int i = 0; i < p->nstatus; i++) {
        vol += p->status[i].vol;
        invol += p->status[i].invol;
    }
    int exited = f[21] == 0 || f[0] == 'Z'; /* exiting or not yet reaped: final CPU times only */
    v[0] = f[11] * ns_per_tick();
    v[1] = f[12] * ns_per_tick();
    v[2] = exited ? MISSING : f[21] * page_bytes();
    v[3] = exited ? MISSING : f[17];
    v[4] = vol;
    v[5] = invol;
    return read_io(s, p, 0, v + 6);
}

static int sample_tree(struct xs_sampler *s, int64_t k, int64_t ts, int64_t now, int64_t own_vol,
                       int64_t own_invol, int full)
{
    if (full && s->children_listed && now >= s->next_listing) {
        s->next_listing = now + s->p.rediscover_ns;
        relist(s);
    }
    int64_t row[PROC_STRIDE] = {k, ts, s->p.root};
    if (read_root(s, own_vol, own_invol, full, row + 3) != 0) {
        fail(s, "reading the profiled process", errno);
        return -1;
    }
    if (vec_push(&s->proc_rows, row, PROC_STRIDE) != 0)
        return -1;
    add_seen(s, s->p.root);
    if (!full)
        return 0;
    for (int i = 1; i < s->nprocs; i++) {
        row[2] = s->procs[i].pid;
        if (read_child(s, &s->procs[i], row + 3) != 0) {
            drop(s, i--);
            continue;
        }
        if (vec_push(&s->proc_rows, row, PROC_STRIDE) != 0)
            return -1;
        add_seen(s, row[2]);
    }
    return 0;
}

/* ---- the machine ---- */

/* Pointers to the starts of the cpu lines of a /proc/stat text (before "intr"), up to max. */
static int cpu_lines(char *text, char **lines, int max)
{
    int n = 0;
    for (char *line = text; line && *line && n < max; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, "cpu", 3) != 0)
            break;
        lines[n++] = line;
    }
    return n;
}

static int open_machine(struct xs_sampler *s)
{
    s->stat_fd = sys_open("/proc/stat");
    s->meminfo_fd = sys_open("/proc/meminfo");
    if (s->stat_fd < 0 || s->meminfo_fd < 0 || read_file(s, s->stat_fd) < 0)
        return -1;
    char **lines = malloc(MAX_CPUS * sizeof *lines);
    if (!lines)
        return -1;
    int n = cpu_lines(s->buf, lines, MAX_CPUS);
    size_t used = 0;
    s->cpu_names[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strcspn(lines[i], " \n");
        if (used + len + 2 > sizeof s->cpu_names)
            break;
        memcpy(s->cpu_names + used, lines[i], len);
        used += len;
        s->cpu_names[used++] = ' ';
        s->cpu_names[used] = 0;
        s->ncpus++;
    }
    if (used)
        s->cpu_names[used - 1] = 0;
    free(lines);
    return 0;
}

/* The index of cpu line `name` (up to a space) among the names of the first read, or -1. */
static int cpu_index(const struct xs_sampler *s, const char *line)
{
    size_t len = strcspn(line, " \n");
    const char *p = s->cpu_names;
    for (int i = 0; *p; i++) {
        size_t n = strcspn(p, " ");
        if (n == len && memcmp(p, line, len) == 0)
            return i;
        p += n + (p[n] == ' ');
    }
    return -1;
}

static int sample_machine(struct xs_sampler *s, int64_t k, int64_t ts)
{
    int stride = MACHINE_HEAD + 2 * s->ncpus;
    int64_t *row = malloc(stride * sizeof *row);
    if (!row)
        return -1;
    int rc = -1;
    if (read_file(s, s->meminfo_fd) < 0) {
        fail(s, "reading /proc/meminfo", errno);
        goto out;
    }
    int64_t total_kb = number_after(s->buf, "MemTotal:"), available_kb = number_after(s->buf, "MemAvailable:");
    if (read_file(s, s->stat_fd) < 0) {
        fail(s, "reading /proc/stat", errno);
        goto out;
    }
    row[0] = k;
    row[1] = ts;
    row[2] = number_after(s->buf, "\nprocs_running");
    row[3] = number_after(s->buf, "\nprocs_blocked");
    row[4] = (total_kb - available_kb) * 1024;
    row[5] = available_kb * 1024;
    for (int i = 0; i < s->ncpus; i++)
        row[MACHINE_HEAD + 2 * i] = row[MACHINE_HEAD + 2 * i + 1] = MISSING;
    char *lines[MAX_CPUS];
    int n = cpu_lines(s->buf, lines, MAX_CPUS);
    for (int i = 0; i < n; i++) {
        int at = n == s->ncpus ? i : cpu_index(s, lines[i]); /* a core went on or off line: by name */
        if (at < 0 || at >= s->ncpus)
            continue;
        int64_t f[8];
        const char *p = lines[i] + strcspn(lines[i], " ");
        int got = 0;
        while (got < 8) {
            char *end;
            long long x = strtoll(p, &end, 10);
            if (end == p)
                break;
            f[got++] = x;
            p = end;
        }
        if (got < 8)
            continue;
        int64_t idle = f[3] + f[4]; /* idle + iowait: waiting for I/O is not being busy */
        row[MACHINE_HEAD + 2 * at] = idle + f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
        row[MACHINE_HEAD + 2 * at + 1] = idle;
    }
    rc = vec_push(&s->machine_rows, row, stride);
out:
    free(row);
    return rc;
}

/* ---- the schedule ---- */

static void take(struct xs_sampler *s, int64_t k, int full)
{
    int64_t t0 = mono_ns();
    int64_t ts = real_ns();
    full = full || t0 - s->last_full >= s->p.full_period_ns;
    struct rusage own;
    getrusage(RUSAGE_THREAD, &own);
    int rc = sample_tree(s, k, ts, t0, own.ru_nvcsw, own.ru_nivcsw, full);
    if (rc == 0 && full) {
        rc = sample_machine(s, k, ts);
        s->last_full = t0;
    }
    if (rc == 0) {
        s->samples++;
        s->failing = 0;
    } else {
        if (!s->first_error[0])
            fail(s, "sampling", errno ? errno : ENOMEM);
        s->errors++;
        s->failing++;
    }
    s->busy_ns += mono_ns() - t0;
}

static int64_t next_due(struct xs_sampler *s, int64_t k)
{
    int64_t due = (k / s->step + 1) * s->step;
    int64_t now = (mono_ns() - s->start_ns) / s->p.interval_ns;
    if (now >= due) {
        int64_t later = (now / s->step + 1) * s->step;
        s->late += (later - due) / s->step;
        due = later;
    }
    return due;
}

static void keep_every(struct vec *v, size_t stride, int64_t step)
{
    size_t w = 0;
    for (size_t r = 0; r + stride <= v->n; r += stride)
        if (v->v[r] % step == 0) {
            memmove(v->v + w, v->v + r, stride * sizeof *v->v);
            w += stride;
        }
    v->n = w;
}

/* Where the rows of `v` after time `ts` begin (rows carry their time at index 1): the part not yet appended. */
static size_t after_ts(const struct vec *v, size_t stride, int64_t ts)
{
    size_t r = v->n - v->n % stride;
    while (r >= stride && v->v[r - stride + 1] > ts)
        r -= stride;
    return r;
}

static void halve(struct xs_sampler *s)
{
    size_t mstride = MACHINE_HEAD + 2 * s->ncpus;
    s->step *= 2;
    s->halvings++;
    keep_every(&s->proc_rows, PROC_STRIDE, s->step);
    keep_every(&s->machine_rows, mstride, s->step);
    s->journal_proc = after_ts(&s->proc_rows, PROC_STRIDE, s->journal_proc_ts);
    s->journal_machine = after_ts(&s->machine_rows, mstride, s->journal_machine_ts);
}

/* Append the rows taken since the last append to the journal (see the top); a file that cannot be written
 * (a full disk) is cut back to its last whole block and the journal stops there. */
static void journal_append(struct xs_sampler *s, int64_t now)
{
    if (s->p.journal_fd[0] < 0 || s->journal_failed || now - s->journal_last < JOURNAL_PERIOD_NS)
        return;
    size_t mstride = MACHINE_HEAD + 2 * s->ncpus;
    size_t proc_end = s->proc_rows.n - s->proc_rows.n % PROC_STRIDE;
    size_t machine_end = s->machine_rows.n - s->machine_rows.n % mstride;
    int64_t head[4] = {JOURNAL_PROC, (int64_t)(proc_end - s->journal_proc), JOURNAL_MACHINE,
                       (int64_t)(machine_end - s->journal_machine)};
    struct iovec iov[4];
    int n = 0;
    int64_t bytes = 0;
    if (head[1] > 0) {
        iov[n++] = (struct iovec){head, 2 * sizeof *head};
        iov[n++] = (struct iovec){s->proc_rows.v + s->journal_proc, head[1] * sizeof *head};
        bytes += (2 + head[1]) * (int64_t)sizeof *head;
    }
    if (head[3] > 0) {
        iov[n++] = (struct iovec){head + 2, 2 * sizeof *head};
        iov[n++] = (struct iovec){s->machine_rows.v + s->journal_machine, head[3] * sizeof *head};
        bytes += (2 + head[3]) * (int64_t)sizeof *head;
    }
    s->journal_last = now;
    if (!n)
        return;
    if (s->journal_bytes && s->journal_bytes + bytes > JOURNAL_FILE_CAP) {
        s->journal_file ^= 1; /* the other file, emptied: it held what came before the one just filled */
        s->journal_bytes = 0;
        if (syscall(SYS_ftruncate, s->p.journal_fd[s->journal_file], 0) != 0) {
            s->journal_failed = 1;
            return;
        }
    }
    int fd = s->p.journal_fd[s->journal_file];
    long wrote;
    do
        wrote = syscall(SYS_writev, fd, iov, n);
    while (wrote < 0 && errno == EINTR);
    if (wrote != bytes) {
        if (wrote > 0)
            syscall(SYS_ftruncate, fd, s->journal_bytes);
        s->journal_failed = 1;
        return;
    }
    s->journal_bytes += bytes;
    s->journal_appends++;
    s->journal_proc = proc_end;
    s->journal_machine = machine_end;
    if (proc_end)
        s->journal_proc_ts = s->proc_rows.v[proc_end - PROC_STRIDE + 1];
    if (machine_end)
        s->journal_machine_ts = s->machine_rows.v[machine_end - mstride + 1];
}

static int open_all(struct xs_sampler *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", s->p.root, s->p.root);
    s->children_listed = syscall(SYS_faccessat, AT_FDCWD, path, R_OK) == 0;
    if (!add_proc(s, s->p.root)) {
        s->open_errno = errno;
        snprintf(s->open_error, sizeof s->open_error, "/proc/%d/stat", s->p.root);
        return -1;
    }
    if (open_machine(s) != 0) {
        s->open_errno = errno ? errno : ENOENT;
        snprintf(s->open_error, sizeof s->open_error, "/proc/stat");
        return -1;
    }
    return 0;
}

static void *run(void *arg)
{
    struct xs_sampler *s = arg;
    s->tid = (int)syscall(SYS_gettid);
    int ok = open_all(s) == 0;
    int64_t k = 0;
    if (ok) {
        take(s, 0, 1);
        journal_append(s, mono_ns());
    }
    pthread_mutex_lock(&s->mu);
    int abandoned = s->stopping; /* xs_start gave up waiting */
    s->started = ok ? 1 : -1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!ok || abandoned)
        return NULL;
    while (s->failing < s->p.max_errors) {
        k = next_due(s, k);
        int64_t due = s->start_ns + k * s->p.interval_ns;
        struct timespec at = {.tv_sec = due / 1000000000LL, .tv_nsec = due % 1000000000LL};
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && pthread_cond_timedwait(&s->cv, &s->mu, &at) != ETIMEDOUT)
            ;
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        take(s, k, 0);
        if (8 * (int64_t)(s->proc_rows.n + s->machine_rows.n) >= s->p.buffer_cap_bytes)
            halve(s);
        journal_append(s, mono_ns());
    }
    take(s, k + 1, 1); /* the region's end, whatever happened */
    struct rusage use;
    getrusage(RUSAGE_THREAD, &use);
    s->thread_cpu_ns = (int64_t)(use.ru_utime.tv_sec + use.ru_stime.tv_sec) * 1000000000LL +
                       (int64_t)(use.ru_utime.tv_usec + use.ru_stime.tv_usec) * 1000LL;
    return NULL;
}

/* ---- the interface (ctypes) ---- */

static void release(struct xs_sampler *s)
{
    for (int i = 0; i < s->nprocs; i++)
        close_proc(&s->procs[i]);
    sys_close(s->stat_fd);
    sys_close(s->meminfo_fd);
    free(s->procs);
    free(s->seen);
    for (int i = 0; i < s->ncmds; i++)
        free(s->cmds[i].argv);
    free(s->cmds);
    free(s->proc_rows.v);
    free(s->machine_rows.v);
    free(s->buf);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Start the thread and wait until it has opened its files and taken the first sample. NULL when it could not:
 * *err_no and `err` (the file) say why. */
XS_EXPORT struct xs_sampler *xs_start(const struct xs_params *p, int *err_no, char *err, int errlen)
{
    struct xs_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->buf = malloc(s->bufcap = 16384))) {
        free(s);
        *err_no = ENOMEM;
        snprintf(err, errlen, "the system sampler's buffers");
        return NULL;
    }
    page_size = sysconf(_SC_PAGESIZE);
    clock_ticks = sysconf(_SC_CLK_TCK);
    s->p = *p;
    s->step = 1;
    s->stat_fd = s->meminfo_fd = -1;
    s->last_full = INT64_MIN / 2;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &attr);
    pthread_condattr_destroy(&attr);
    s->start_ns = mono_ns();
    /* The thread blocks every signal (it inherits the mask it is created with): a signal sent to the process
     * is then delivered to one of the program's threads, and interrupts its system calls as it would have. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&s->thread, NULL, run, s);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0) {
        *err_no = rc;
        snprintf(err, errlen, "the system sampler's thread");
        release(s);
        return NULL;
    }
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += JOIN_TIMEOUT_S;
    pthread_mutex_lock(&s->mu);
    while (!s->started && pthread_cond_timedwait(&s->cv, &s->mu, &until) != ETIMEDOUT)
        ;
    int started = s->started;
    if (!started)
        s->stopping = 1; /* it ends once past what hung; its memory is left to it */
    pthread_mutex_unlock(&s->mu);
    if (!started) {
        pthread_detach(s->thread);
        *err_no = ETIMEDOUT;
        snprintf(err, errlen, "/proc (the system sampler took no first sample within %d s)", JOIN_TIMEOUT_S);
        return NULL;
    }
    if (started < 0) {
        pthread_join(s->thread, NULL);
        *err_no = s->open_errno;
        snprintf(err, errlen, "%s", s->open_error);
        release(s);
        return NULL;
    }
    return s;
}

/* Wake the thread, which takes the last sample and ends; wait for it (at most JOIN_TIMEOUT_S: then `stuck`). */
XS_EXPORT void xs_stop(struct xs_sampler *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    at.tv_sec += JOIN_TIMEOUT_S;
    if (!s->joined)
        s->joined = pthread_timedjoin_np(s->thread, NULL, &at) == 0;
    s->stuck = !s->joined;
}

XS_EXPORT void xs_stats(const struct xs_sampler *s, struct xs_stats *out)
{
    *out = (struct xs_stats){
        .samples = s->samples, .late = s->late, .halvings = s->halvings, .errors = s->errors,
        .busy_ns = s->busy_ns, .thread_cpu_ns = s->thread_cpu_ns, .step = s->step, .max_children = s->max_children,
        .proc_values = (int64_t)s->proc_rows.n, .machine_values = (int64_t)s->machine_rows.n,
        .bytes_read = s->bytes_read, .journal_appends = s->journal_appends, .journal_failed = s->journal_failed,
        .tid = s->tid, .children_listed = s->children_listed, .stuck = s->stuck,
        .nseen = s->nseen, .ncpus = s->ncpus, .machine_stride = MACHINE_HEAD + 2 * s->ncpus,
        .io_unreadable = s->io_unreadable, .io_unreadable_pid = s->io_unreadable_pid};
}

XS_EXPORT const int64_t *xs_proc_rows(const struct xs_sampler *s) { return s->proc_rows.v; }
XS_EXPORT const int64_t *xs_machine_rows(const struct xs_sampler *s) { return s->machine_rows.v; }
XS_EXPORT const int32_t *xs_seen(const struct xs_sampler *s) { return s->seen; }
XS_EXPORT const char *xs_cpu_names(const struct xs_sampler *s) { return s->cpu_names; }
XS_EXPORT int xs_ncmds(const struct xs_sampler *s) { return s->ncmds; }

/* The command line of the i-th descendant seen (NUL-separated, *len bytes; NULL when unreadable), its pid, its
 * parent's (0: unknown) and whether it was forked from that parent, not exec'd since. */
XS_EXPORT const char *xs_cmd(const struct xs_sampler *s, int i, int32_t *pid, int32_t *ppid, int32_t *inherited,
                             int32_t *len)
{
    *pid = s->cmds[i].pid;
    *ppid = s->cmds[i].ppid;
    *inherited = s->cmds[i].inherited;
    *len = s->cmds[i].len;
    return s->cmds[i].argv;
}
XS_EXPORT const char *xs_first_error(const struct xs_sampler *s) { return s->first_error; }
XS_EXPORT const char *xs_io_unreadable_reason(const struct xs_sampler *s) { return s->io_unreadable_reason; }

/* Free everything; a thread that never ended (stuck) keeps its memory. */
XS_EXPORT void xs_free(struct xs_sampler *s)
{
    if (s && s->joined)
        release(s);
}
