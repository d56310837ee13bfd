/* 1000 reads of 10 bytes, for the record cap test of tests/collect/test_io_native.py: native_cap DATA. */
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char buf[10];
    int fd = open(argv[1], O_RDONLY);
    for (int i = 0; i < 1000; i++)
        read(fd, buf, sizeof buf);
    close(fd);
    return 0;
}
