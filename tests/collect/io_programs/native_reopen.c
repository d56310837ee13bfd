/* stdio's repositioning and reopening, for tests/collect/test_io_native.py: native_reopen PATH OTHER.
 * Writes "abcdef" to PATH, rewinds and reads a character, sets the position saved at 3 and reads one more, then
 * reopens the stream on OTHER (which holds "hello\n") and reads it to its end. */
#include <stdio.h>

int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "w+");
    if (!f)
        return 1;
    fputs("abcdef", f);
    rewind(f);
    int a = fgetc(f);
    fpos_t at3;
    fseek(f, 3, SEEK_SET);
    fgetpos(f, &at3);
    rewind(f);
    fsetpos(f, &at3);
    int d = fgetc(f);
    f = freopen(argv[2], "r", f);
    char line[32] = "";
    fgets(line, sizeof line, f);
    char *end = fgets(line + 16, 16, f);
    fclose(f);
    printf("{\"a\": \"%c\", \"d\": \"%c\", \"line\": \"%.5s\", \"end\": %d}\n", a, d, line, end == NULL);
    return 0;
}
