/* read_file.h: a whole text file read into memory, bounded, for every reader of a JSON file
 * (run configs, config.json, tokenizer.json, state.json).
 * Tested through its users (tests/engine/test_engine.c's config files, tests/engine/record/test_checkpoint.c). */
#ifndef DDT_READ_FILE_H
#define DDT_READ_FILE_H

#include <stddef.h>

/* The whole file, NUL-terminated, at most max_bytes: NULL with err on failure (free() it). */
char *ddt_read_text_file(const char *path, size_t max_bytes, char *err, size_t err_len);

#endif
