/* commands.h: ddtreed's subcommands (API.md, "ddtreed command line"), each main-like:
 * exit status 0 success, 1 failure (the message on stderr), 2 usage. */
#ifndef DDT_COMMANDS_H
#define DDT_COMMANDS_H

#include "config.h"

#include <stdint.h>

int ddt_cmd_step(int argc, char **argv);
int ddt_cmd_features(int argc, char **argv);
int ddt_cmd_tokenize(int argc, char **argv);
int ddt_cmd_train(int argc, char **argv);
int ddt_cmd_plan(int argc, char **argv);
int ddt_cmd_export(int argc, char **argv);
int ddt_cmd_speculate(int argc, char **argv);
int ddt_cmd_verify(int argc, char **argv);
int ddt_cmd_serve(int argc, char **argv);

#endif
