/* A signal handler that does I/O while the main thread is inside the library's hooks, for
 * tests/collect/test_io_native.py: native_sigio DATA. A 50 us interval timer interrupts a loop of preads;
 * the handler writes to /dev/null. Prints how often the handler ran and the loop's reads. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t fired;
static int devnull;

static void on_alarm(int sig)
{
    (void)sig;
    fired++;
    write(devnull, "x", 1);
}

int main(int argc, char **argv)
{
    char buf[64];
    int fd = open(argv[1], O_RDONLY);
    devnull = open("/dev/null", O_WRONLY);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 50}, {0, 50}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &every, NULL);
    long reads = 0;
    while (fired < 2000) {
        pread(fd, buf, sizeof buf, 0);
        reads++;
    }
    setitimer(ITIMER_REAL, &off, NULL);
    printf("{\"fired\": %d, \"reads\": %ld}\n", (int)fired, reads);
    return 0;
}
