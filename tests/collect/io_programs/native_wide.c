/* Calls whose values do not fit a record's narrow fields, for tests/collect/test_io_native.py:
 * native_wide DATA (a file of at most 64 KiB). Prints what it did as JSON. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static char buf[64 << 10];

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    size_t huge = strtoull("5368709120", NULL, 10); /* 5 GiB, past 32 bits (not a constant: no size warning) */
    int fd = open(argv[1], O_RDONLY);
    long got = read(fd, buf, huge); /* the whole (small) file comes back */
    errno = 0;
    long bad = read(70000, buf, 10); /* a descriptor past 16 bits: fails with EBADF */
    int bad_errno = errno;
    void *map = mmap(NULL, huge, PROT_READ, MAP_PRIVATE, fd, 0); /* a 5 GiB mapping of a small file */
    if (map != MAP_FAILED)
        munmap(map, huge);
    close(fd);
    printf("{\"fd\": %d, \"got\": %ld, \"bad\": %ld, \"bad_errno\": %d, \"mapped\": %d}\n", fd, got, bad, bad_errno,
           map != MAP_FAILED);
    return 0;
}
