/* Termination signals (SIGHUP, SIGINT, SIGTERM) left at their default action.
 *
 * Why: a process killed by one of them died with the records it had not yet flushed, up to the flush interval
 * of them, or all of them for a process that made no call since its last flush: a multiprocessing pool's
 * workers, waiting for work when the pool is terminated (`with Pool(...)` does that on leaving), lost all
 * their I/O.
 *
 * How: in preload mode, while the program leaves such a signal at its default action, the library's handler
 * stands in for the default. It writes what is buffered with a final status naming the signal, puts the
 * default back and sends the signal to its thread again, so the process still dies by it: the same exit
 * status and the same core dump rule as without the library. The program never sees the handler: sigaction
 * and signal report the default it set or inherited, a handler it installs replaces ours, and setting the
 * default again puts ours back. A signal it ignores or handles is left alone. The handler writes only if no
 * other thread is flushing (it never waits on a lock), and a vfork child, which shares its parent's memory,
 * changes nothing.
 *
 * Not covered: signal numbers changed with sysv_signal, bsd_signal or sigset; programs that call the
 * rt_sigaction system call themselves.
 */
#include "xio.h"

#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int ours[NSIG];              /* 1: our handler stands where the program has the default action */
static struct sigaction view[NSIG]; /* for those: the action as the program set it, shown to it */

static int watched(int sig) { return sig == SIGHUP || sig == SIGINT || sig == SIGTERM; }

static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);
static sighandler_t (*real_signal)(int, sighandler_t);

static void on_signal(int sig)
{
    int saved = errno;
    pid_t pid = xio_sys_getpid();
    if (pid == xio.pid) {
        xio_session_flush_signal(sig);
        ours[sig] = 0;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    REAL(sigaction)(sig, &dfl, NULL);
    /* blocked until the handler returns, then the default action: the process ends as it would have */
    syscall(SYS_tgkill, pid, (pid_t)syscall(SYS_gettid), sig);
    errno = saved;
}

/* Puts our handler in place of the default action; `old`: the action it replaces, if wanted. */
static int take_over(int sig, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return REAL(sigaction)(sig, &sa, old);
}

/* At the start of a preloaded session: the watched signals the program starts with at their default. */
void xio_signals_init(void)
{
    if (xio.mode != XIO_MODE_PRELOAD)
        return;
    static const int signals[] = {SIGHUP, SIGINT, SIGTERM};
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        int sig = signals[i];
        struct sigaction cur;
        if (ours[sig] || REAL(sigaction)(sig, NULL, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) ||
            cur.sa_handler != SIG_DFL)
            continue;
        view[sig] = cur;
        if (take_over(sig, NULL) == 0)
            ours[sig] = 1;
    }
}

/* Calls that must leave the shared state alone: not recording, or a vfork child on its parent's memory. */
static int pass_through(int sig)
{
    if (sig <= 0 || sig >= NSIG || !watched(sig) || xio.mode != XIO_MODE_PRELOAD)
        return 1;
    return __atomic_load_n(&xio_vfork_active, __ATOMIC_ACQUIRE) != 0 && xio_sys_getpid() != xio.pid;
}

static int xio_sigaction(int sig, const struct sigaction *act, struct sigaction *oact)
{
    if (pass_through(sig))
        return REAL(sigaction)(sig, act, oact);
    int was_ours = ours[sig];
    struct sigaction shown = view[sig], old;
    int rc;
    if (act && !(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_DFL) {
        struct sigaction wanted = *act; /* act may be oact */
        rc = take_over(sig, &old);
        if (rc == 0) {
            view[sig] = wanted;
            ours[sig] = 1;
        }
    } else {
        rc = REAL(sigaction)(sig, act, &old);
        if (rc == 0 && act)
            ours[sig] = 0;
    }
    if (rc == 0 && oact)
        *oact = was_ours ? shown : old;
    return rc;
}

/* glibc's signal(): BSD semantics (SA_RESTART, the signal blocked in its handler), through the wrapper above
 * (glibc's own goes to the system call without it). */
static sighandler_t xio_signal(int sig, sighandler_t handler)
{
    if (pass_through(sig))
        return REAL(signal)(sig, handler);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, sig);
    sa.sa_flags = SA_RESTART;
    if (xio_sigaction(sig, &sa, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

extern int sigaction(int, const struct sigaction *, struct sigaction *) XIO_ALIAS(xio_sigaction);
extern sighandler_t signal(int, sighandler_t) XIO_ALIAS(xio_signal);

const struct xio_hook xio_hooks_signal[] = {HOOK(sigaction), HOOK_PTR(signal), {0}};
