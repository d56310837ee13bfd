/* Process boundaries: exec family and posix_spawn (flush, and a "not covered" note for programs the preload
 * cannot reach: coverage.c), _exit/_Exit (flush: DataLoader workers and multiprocessing children leave by
 * os._exit, which skips destructors), vfork (hooks must know when they run in a vfork child) and dlopen in
 * attach mode (objects loaded later get patched too).
 *
 * exec wrappers may run in a vfork child (Python's subprocess), which shares its parent's memory: there
 * they use raw syscalls and stack buffers only, take no lock and change no shared state.
 */
#include "xio.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Before an exec: note a program that will not be recorded, and flush (the image is about to be replaced;
 * a vfork child skips the flush, its parent's buffer is not its own). */
static void before_exec(const char *file, int search, char *const envp[])
{
    if (xio.mode == XIO_MODE_OFF || xio.ended || !file)
        return;
    int saved = errno;
    char buf[PATH_MAX];
    xio_note_if_not_covered(xio_sys_getpid(), search ? xio_search_path(file, buf, sizeof buf) : file, envp);
    xio_session_flush(XIO_END_EXEC, 0);
    errno = saved;
}

static int (*real_execve)(const char *, char *const[], char *const[]);
static int xio_execve(const char *path, char *const argv[], char *const envp[])
{
    before_exec(path, 0, envp);
    return REAL(execve)(path, argv, envp);
}
static int (*real_execv)(const char *, char *const[]);
static int xio_execv(const char *path, char *const argv[])
{
    before_exec(path, 0, NULL);
    return REAL(execv)(path, argv);
}
static int (*real_execvp)(const char *, char *const[]);
static int xio_execvp(const char *file, char *const argv[])
{
    before_exec(file, 1, NULL);
    return REAL(execvp)(file, argv);
}
static int (*real_execvpe)(const char *, char *const[], char *const[]);
static int xio_execvpe(const char *file, char *const argv[], char *const envp[])
{
    before_exec(file, 1, envp);
    return REAL(execvpe)(file, argv, envp);
}

/* execl, execlp, execle: glibc calls execve internally, so collect the list and go through execv*. */
#define COLLECT_ARGS(first, argv, extra)                                                                         \
    size_t argc = 1;                                                                                             \
    va_list ap;                                                                                                  \
    va_start(ap, first);                                                                                         \
    while (va_arg(ap, char *))                                                                                   \
        argc++;                                                                                                  \
    va_end(ap);                                                                                                  \
    char *argv[argc + 1];                                                                                        \
    argv[0] = (char *)first;                                                                                     \
    va_start(ap, first);                                                                                         \
    for (size_t i = 1; i <= argc; i++)                                                                           \
        argv[i] = va_arg(ap, char *);                                                                            \
    extra;                                                                                                       \
    va_end(ap);

static int xio_execl(const char *path, const char *arg, ...)
{
    COLLECT_ARGS(arg, argv, (void)0)
    return xio_execv(path, argv);
}
static int xio_execlp(const char *file, const char *arg, ...)
{
    COLLECT_ARGS(arg, argv, (void)0)
    return xio_execvp(file, argv);
}
static int xio_execle(const char *path, const char *arg, ...)
{
    char *const *envp;
    COLLECT_ARGS(arg, argv, envp = va_arg(ap, char *const *))
    return xio_execve(path, argv, envp);
}

static int (*real_posix_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                               const posix_spawnattr_t *, char *const[], char *const[]);
static int xio_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    pid_t child = 0;
    int ret = REAL(posix_spawn)(&child, path, fa, attr, argv, envp);
    if (pid)
        *pid = child;
    if (ret == 0 && xio.mode != XIO_MODE_OFF && !xio.ended && xio_sys_getpid() == xio.pid)
        xio_note_if_not_covered(child, path, envp);
    return ret;
}
static int (*real_posix_spawnp)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                                const posix_spawnattr_t *, char *const[], char *const[]);
static int xio_posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                            const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    pid_t child = 0;
    int ret = REAL(posix_spawnp)(&child, file, fa, attr, argv, envp);
    if (pid)
        *pid = child;
    if (ret == 0 && xio.mode != XIO_MODE_OFF && !xio.ended && xio_sys_getpid() == xio.pid) {
        char buf[PATH_MAX];
        xio_note_if_not_covered(child, xio_search_path(file, buf, sizeof buf), envp);
    }
    return ret;
}

extern int execve(const char *, char *const[], char *const[]) XIO_ALIAS(xio_execve);
extern int execv(const char *, char *const[]) XIO_ALIAS(xio_execv);
extern int execvp(const char *, char *const[]) XIO_ALIAS(xio_execvp);
extern int execvpe(const char *, char *const[], char *const[]) XIO_ALIAS(xio_execvpe);
extern int execl(const char *, const char *, ...) XIO_ALIAS(xio_execl);
extern int execlp(const char *, const char *, ...) XIO_ALIAS(xio_execlp);
extern int execle(const char *, const char *, ...) XIO_ALIAS(xio_execle);
extern int posix_spawn(pid_t *restrict, const char *restrict, const posix_spawn_file_actions_t *,
                       const posix_spawnattr_t *restrict, char *const[restrict], char *const[restrict])
    XIO_ALIAS(xio_posix_spawn);
extern int posix_spawnp(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
                        char *const[], char *const[]) XIO_ALIAS(xio_posix_spawnp);

/* ---- leaving without destructors ---- */

static void (*real__exit)(int);
__attribute__((noreturn)) static void xio__exit(int status)
{
    xio_session_flush(XIO_END__EXIT, 1);
    REAL(_exit)(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}
static void (*real__Exit)(int);
__attribute__((noreturn)) static void xio__Exit(int status)
{
    xio_session_flush(XIO_END__EXIT, 1);
    REAL(_Exit)(status);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}
extern void _exit(int) __attribute__((noreturn)) XIO_ALIAS(xio__exit);
extern void _Exit(int) __attribute__((noreturn)) XIO_ALIAS(xio__Exit);

static int (*real_execl)(const char *, const char *, ...);
static int (*real_execlp)(const char *, const char *, ...);
static int (*real_execle)(const char *, const char *, ...);


/* ---- vfork: count the vforks under way, so that hooks check whether they run in a vfork child ----
 *
 * A vfork child returns from vfork on its parent's stack, so the wrapper cannot be C (its frame would be
 * clobbered): as glibc does, the return address is held in a register across the system call. The count
 * is raised before the call and lowered in the parent when it resumes (the child has exec'd or exited).
 * Architectures without this wrapper check the pid in every hook instead. */
#if defined(__x86_64__)
int xio_vfork_active;

__attribute__((used)) static pid_t vfork_failed(int err)
{
    errno = err;
    return -1;
}

__asm__(".text\n"
        ".globl xio_vfork\n"
        ".hidden xio_vfork\n"
        ".type xio_vfork, @function\n"
        ".globl vfork\n"
        ".type vfork, @function\n"
        "xio_vfork:\n"
        "vfork:\n"
        "    endbr64\n"
        "    lock incl xio_vfork_active(%rip)\n"
        "    popq %rdi\n"
        "    movl $58, %eax\n" /* SYS_vfork */
        "    syscall\n"
        "    pushq %rdi\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    lock decl xio_vfork_active(%rip)\n"
        "    cmpq $-4095, %rax\n"
        "    jae 2f\n"
        "1:  ret\n"
        "2:  negl %eax\n"
        "    movl %eax, %edi\n"
        "    jmp vfork_failed\n"
        ".size xio_vfork, .-xio_vfork\n"
        ".size vfork, .-vfork\n");
extern pid_t xio_vfork(void);
static pid_t (*real_vfork)(void); /* never called: the wrapper makes the system call itself */
#define VFORK_HOOK HOOK(vfork),
#else
int xio_vfork_active = -1;
#define VFORK_HOOK
#endif

/* ---- dlopen (attach mode only: under LD_PRELOAD every object already sees our symbols) ---- */

/* dlopen searches the RPATH/RUNPATH of its caller, which would be us: search the real caller's paths. */
static void *(*real_dlopen)(const char *, int);
static void *dlopen_as(const char *file, int flags, const void *caller)
{
    Dl_info info;
    struct link_map *map = NULL;
    void *loaded = REAL(dlopen)(file, RTLD_LAZY | RTLD_NOLOAD);
    if (loaded) {
        dlclose(loaded);
        return NULL; /* already loaded: the plain call finds it by name */
    }
    if (!dladdr1(caller, &info, (void **)&map, RTLD_DL_LINKMAP) || !map)
        return NULL;
    Dl_serinfo size;
    if (dlinfo(map, RTLD_DI_SERINFOSIZE, &size) != 0)
        return NULL;
    Dl_serinfo *paths = malloc(size.dls_size);
    if (!paths)
        return NULL;
    *paths = size;
    void *handle = NULL;
    if (dlinfo(map, RTLD_DI_SERINFO, paths) == 0) {
        char full[PATH_MAX];
        size_t flen = strlen(file);
        for (unsigned i = 0; i < paths->dls_cnt && !handle; i++) {
            const char *dir = paths->dls_serpath[i].dls_name;
            size_t dlen = dir ? strlen(dir) : 0;
            if (!dlen || dlen + flen + 2 > sizeof full)
                continue;
            memcpy(full, dir, dlen);
            full[dlen] = '/';
            memcpy(full + dlen + 1, file, flen + 1);
            if (syscall(SYS_faccessat, AT_FDCWD, full, R_OK, 0) == 0)
                handle = REAL(dlopen)(full, flags);
        }
    }
    free(paths);
    return handle;
}

static void *xio_dlopen(const char *file, int flags)
{
    void *handle = NULL;
    if (file && !strchr(file, '/') && xio.mode == XIO_MODE_ATTACH)
        handle = dlopen_as(file, flags, __builtin_return_address(0));
    if (!handle)
        handle = REAL(dlopen)(file, flags);
    if (handle && xio.mode == XIO_MODE_ATTACH)
        xio_attach_rescan();
    return handle;
}

const struct xio_hook xio_hooks_proc[] = {
    HOOK(execve), HOOK(execv),       HOOK(execvp),       HOOK(execvpe), HOOK(execl), HOOK(execlp),
    HOOK(execle), HOOK(posix_spawn), HOOK(posix_spawnp), HOOK(_exit),   HOOK(_Exit), VFORK_HOOK{0},
};

const struct xio_hook xio_hooks_attach_only[] = {HOOK_PTR(dlopen), {0}};
