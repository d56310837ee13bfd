/* vfork children that rearrange descriptors before exec, for tests/collect/test_io_native.py: native_vfork.
 * The children share the parent's memory until they exec: the library must not take their close/dup2 for
 * the parent's (the parent's stdout stays what it was). */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
    for (int i = 0; i < 3; i++) {
        pid_t pid = vfork();
        if (pid == 0) {
            close(1);
            dup2(2, 1);
            char *argv[] = {"true", NULL};
            execv("/bin/true", argv);
            _exit(127);
        }
        int status;
        waitpid(pid, &status, 0);
    }
    write(1, "{\"done\": 1}\n", 12);
    return 0;
}
