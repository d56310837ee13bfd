/* Small freads and fwrites on one file, for tests/collect/test_io_native.py: native_chunks PATH.
 * Writes 3000 bytes one fwrite each, a character with fputc, 4096 bytes in one fwrite, two fwrites of 2 items of
 * 8 bytes, an fflush, one of 100 bytes and an fflush (7229 bytes); freads 10 bytes from the write-only stream
 * (fails); then reads 5000 bytes one fread each and the rest in freads of 500 bytes to the end of the file. */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    static char big[4096], buf[512];
    memset(big, 'b', sizeof big);
    memset(buf, 's', sizeof buf);
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 1;
    size_t wrote = 0;
    for (int i = 0; i < 3000; i++)
        wrote += fwrite("a", 1, 1, f);
    fputc('c', f);
    wrote += fwrite(big, 1, sizeof big, f);
    wrote += 8 * fwrite(buf, 8, 2, f);
    wrote += 8 * fwrite(buf, 8, 2, f);
    fflush(f);
    wrote += fwrite(buf, 1, 100, f);
    fflush(f);
    size_t failed = fread(buf, 1, 10, f);
    fclose(f);

    f = fopen(argv[1], "r");
    size_t got = 0, n;
    for (int i = 0; i < 5000; i++)
        got += fread(buf, 1, 1, f);
    while ((n = fread(buf, 1, 500, f)) > 0)
        got += n;
    fclose(f);
    printf("{\"wrote\": %zu, \"failed\": %zu, \"read\": %zu}\n", wrote, failed, got);
    return 0;
}
