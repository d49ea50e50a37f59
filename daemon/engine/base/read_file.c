/* read_file.c: a whole text file read into memory, bounded (read_file.h).
 * Tested through its users (tests/engine/test_engine.c's config files, tests/engine/record/test_checkpoint.c). */
#include "read_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ddt_read_text_file(const char *path, size_t max_bytes, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(max_bytes + 1);
    size_t len = text ? fread(text, 1, max_bytes + 1, f) : 0;
    int failed = !text || ferror(f);
    fclose(f);
    if (failed || len > max_bytes) {
        snprintf(err, err_len, failed ? "%s: cannot read it" : "%s: larger than %zu bytes", path, max_bytes);
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}
