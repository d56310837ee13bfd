/* Programs the preload cannot reach: a child exec'd from a recorded process is judged before the exec (its
 * ELF has no PT_INTERP: statically linked; set-user-ID; an environment without LD_PRELOAD; any exec in
 * attach mode) and, when it will not be recorded, leaves a note file beside the records.
 *
 * This runs in exec wrappers, possibly in a vfork child that shares its parent's memory: raw system calls
 * and stack buffers only, no lock, no allocation, nothing shared written.
 */
#include "xio.h"

#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

static char libname[256]; /* our file name, looked for in a child's LD_PRELOAD */

void xio_proc_set_libname(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n < sizeof libname)
        memcpy(libname, base, n + 1);
}

/* ---- what exec will run ---- */

static long pread_raw(int fd, void *buf, size_t n, off_t off) { return syscall(SYS_pread64, fd, buf, n, off); }

/* 1 when the ELF file has a PT_INTERP segment (the dynamic loader, hence LD_PRELOAD, will run). */
static int elf_has_interp(int fd, const unsigned char *ident)
{
    char ph[4096];
    uint64_t phoff;
    unsigned phnum, phentsize;
    if (ident[EI_CLASS] == ELFCLASS64) {
        Elf64_Ehdr eh;
        if (pread_raw(fd, &eh, sizeof eh, 0) != (long)sizeof eh)
            return 1;
        phoff = eh.e_phoff, phnum = eh.e_phnum, phentsize = eh.e_phentsize;
    } else {
        Elf32_Ehdr eh;
        if (pread_raw(fd, &eh, sizeof eh, 0) != (long)sizeof eh)
            return 1;
        phoff = eh.e_phoff, phnum = eh.e_phnum, phentsize = eh.e_phentsize;
    }
    if (phentsize < sizeof(Elf32_Phdr) || (size_t)phnum * phentsize > sizeof ph)
        return 1; /* cannot tell: say nothing */
    if (pread_raw(fd, ph, (size_t)phnum * phentsize, (off_t)phoff) != (long)(phnum * phentsize))
        return 1;
    for (unsigned i = 0; i < phnum; i++) {
        uint32_t type;
        memcpy(&type, ph + (size_t)i * phentsize, sizeof type); /* p_type comes first in both classes */
        if (type == PT_INTERP)
            return 1;
    }
    return 0;
}

/* Why LD_PRELOAD will not reach the program at `path` ("static", "setuid"), or NULL. Scripts are judged by
 * their interpreter (one level). */
static const char *exec_reason(const char *path, int depth)
{
    long fd = xio_sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    const char *reason = NULL;
    struct stat st;
    unsigned char head[256];
    long n = pread_raw((int)fd, head, sizeof head - 1, 0);
    if (xio_sys_fstat((int)fd, &st) == 0 && (((st.st_mode & S_ISUID) && st.st_uid != getuid()) ||
                                             ((st.st_mode & S_ISGID) && st.st_gid != getgid())))
        reason = "setuid";
    else if (n >= EI_NIDENT && memcmp(head, ELFMAG, SELFMAG) == 0)
        reason = elf_has_interp((int)fd, head) ? NULL : "static";
    else if (n > 2 && head[0] == '#' && head[1] == '!' && depth == 0) {
        head[n] = 0;
        char *p = (char *)head + 2;
        while (*p == ' ' || *p == '\t')
            p++;
        char *end = p;
        while (*end && *end != ' ' && *end != '\t' && *end != '\n')
            end++;
        *end = 0;
        if (*p == '/')
            reason = exec_reason(p, 1);
    }
    xio_sys_close((int)fd);
    return reason;
}

/* execvp's PATH search, without touching memory: the first executable candidate into buf. */
const char *xio_search_path(const char *file, char *buf, size_t cap)
{
    if (strchr(file, '/'))
        return file;
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";
    size_t flen = strlen(file);
    for (const char *s = path;;) {
        const char *end = strchr(s, ':');
        size_t dlen = end ? (size_t)(end - s) : strlen(s);
        if (dlen + flen + 2 < cap) {
            memcpy(buf, dlen ? s : ".", dlen ? dlen : 1);
            size_t n = dlen ? dlen : 1;
            buf[n] = '/';
            memcpy(buf + n + 1, file, flen + 1);
            if (syscall(SYS_faccessat, AT_FDCWD, buf, X_OK, 0) == 0)
                return buf;
        }
        if (!end)
            return NULL;
        s = end + 1;
    }
}

static int env_covered(char *const envp[])
{
    int preload = 0, dir = 0;
    for (char *const *e = envp; e && *e; e++) {
        if (strncmp(*e, "LD_PRELOAD=", 11) == 0 && libname[0] && strstr(*e + 11, libname))
            preload = 1;
        else if (strncmp(*e, "XSTACK_IO_DIR=", 14) == 0 && (*e)[14])
            dir = 1;
    }
    return preload && dir;
}

static char *put(char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    if (p + n > end)
        n = (size_t)(end - p);
    memcpy(p, s, n);
    return p + n;
}

static char *put_num(char *p, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? 0 : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* A small text file beside the records: pid, time, reason, path (last: it may hold any byte). Numbers are
 * at most 20 characters, and the buffers leave room for them past the longest directory and path. */
static void write_note(pid_t pid, const char *path, const char *reason)
{
    char name[PATH_MAX + 96], body[PATH_MAX + 160];
    int64_t now = xio_now();
    char *end = name + sizeof name - 1;
    char *p = put(put(name, end, xio.dir), end, "/notcovered-");
    p = put(put_num(put(put_num(p, pid), end, "-"), now), end, ".xnc");
    *p = 0;
    end = body + sizeof body;
    char *b = put_num(put(body, end, "XSTACKNC 1\npid "), pid);
    b = put_num(put(b, end, "\nts_ns "), now);
    b = put(put(put(put(b, end, "\nreason "), end, reason), end, "\npath "), end - 1, path);
    b = put(b, end, "\n");
    long fd = xio_sys_open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        xio_sys_write_all((int)fd, body, (size_t)(b - body));
        xio_sys_close((int)fd);
    }
}

/* Notes the program at `path` when LD_PRELOAD will not reach it. Only an executable file is judged: Python's
 * subprocess tries execve on every PATH entry in turn. `envp`: the child's environment (NULL: ours). */
void xio_note_if_not_covered(pid_t pid, const char *path, char *const envp[])
{
    if (!path || syscall(SYS_faccessat, AT_FDCWD, path, X_OK, 0) != 0)
        return;
    const char *reason = exec_reason(path, 0);
    if (!reason && xio.mode == XIO_MODE_ATTACH)
        reason = "attach";
    if (!reason && envp && envp != environ && !env_covered(envp))
        reason = "env";
    if (reason)
        write_note(pid, path, reason);
}

