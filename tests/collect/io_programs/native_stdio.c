/* stdio calls on one file, for tests/collect/test_io_native.py: native_stdio PATH.
 * Writes 1000 bytes, flushes, reads them back in 100-byte items, seeks to 500 and reads 10 items of 10. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    char buf[1000];
    FILE *f = fopen(argv[1], "w+");
    if (!f)
        return 1;
    memset(buf, 'q', sizeof buf);
    size_t wrote = fwrite(buf, 1, sizeof buf, f);
    fflush(f);
    fseek(f, 0, SEEK_SET);
    size_t items = fread(buf, 100, 10, f);
    fseeko(f, 500, SEEK_SET);
    size_t small = fread(buf, 10, 10, f);
    fclose(f);
    printf("{\"wrote\": %zu, \"items\": %zu, \"small\": %zu}\n", wrote, items, small);
    return 0;
}
