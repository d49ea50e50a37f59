/* commands.h: ddtreed's subcommands (API.md, "ddtreed command line"), each main-like:
 * exit status 0 success, 1 failure (the message on stderr), 2 usage. */
#ifndef DDT_COMMANDS_H
#define DDT_COMMANDS_H

#include <stdint.h>

int ddt_cmd_step(int argc, char **argv);
int ddt_cmd_features(int argc, char **argv);
int ddt_cmd_train(int argc, char **argv);
int ddt_cmd_plan(int argc, char **argv);
int ddt_cmd_export(int argc, char **argv);
int ddt_cmd_serve(int argc, char **argv);

/* A non-negative decimal integer: 0, or -1 when text is anything else. */
int ddt_parse_count(const char *text, int64_t *out);

#endif
