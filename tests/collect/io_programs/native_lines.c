/* stdio's character, line and formatted calls on one file, for tests/collect/test_io_native.py:
 * native_lines PATH. Writes 100 rows with fprintf, a line with fputs, two characters with fputc and putc and an
 * int with putw (811 bytes); reads 50 rows back with fgets, one with fread, then with fgetc, getc, fscanf and
 * fgets to the last line, the characters and the int with fgetc, getc and getw, and once more to the end.
 * native_lines PATH SLOW: then writes a line to SLOW every 60 ms, five times. */
#include <stdio.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 1;
    for (int i = 0; i < 100; i++)
        fprintf(f, "row %03d\n", i);
    fputs("tail\n", f);
    fputc('x', f);
    putc('y', f);
    putw(42, f);
    fclose(f);

    char line[64];
    f = fopen(argv[1], "r");
    int lines = 0, n = -1;
    while (lines < 50 && fgets(line, sizeof line, f))
        lines++;
    size_t got = fread(line, 1, 8, f);
    int c1 = fgetc(f), c2 = getc(f);
    int scanned = fscanf(f, "w %d\n", &n);
    while (fgets(line, sizeof line, f) && strcmp(line, "tail\n") != 0)
        lines++;
    int x = fgetc(f), y = getc(f), w = getw(f), end = fgetc(f);
    fclose(f);
    if (argc > 2) {
        FILE *slow = fopen(argv[2], "w");
        struct timespec pause = {0, 60 * 1000 * 1000};
        for (int i = 0; i < 5; i++) {
            fprintf(slow, "step %d\n", i);
            nanosleep(&pause, NULL);
        }
        fclose(slow);
    }
    printf("{\"lines\": %d, \"fread\": %zu, \"chars\": \"%c%c%c%c\", \"n\": %d, \"scanned\": %d, \"w\": %d, "
           "\"end\": %d}\n", lines, got, c1, c2, x, y, n, scanned, w, end);
    return 0;
}
