/* dir_kind.h: what a directory a user names is, by the files ddtree writes and reads there: a
 * state directory, a run, a checkpoint, a drafter export, a target model. The tools that take
 * one kind say what to give instead when handed another (`ddtreed speculate --drafter RUN_DIR`,
 * `ddtreed export STATE_DIR`), and `ddtreed verify` walks what it is given.
 * Tested by tests/daemon/train_cli_test.sh (the tools' messages) and speculate_cli_test.sh.
 */
#ifndef DDT_DIR_KIND_H
#define DDT_DIR_KIND_H

#include <stddef.h>

typedef enum {
    DDT_DIR_MISSING,      /* no such directory, or not a directory */
    DDT_DIR_CHECKPOINT,   /* state.json or state.safetensors */
    DDT_DIR_EXPORT,       /* ddtree-manifest.json, or a config.json with a dflash_config */
    DDT_DIR_MODEL,        /* a config.json without one: a target's */
    DDT_DIR_RUN,          /* checkpoints/ or export/ */
    DDT_DIR_STATE,        /* runs/ or ddtree.db */
    DDT_DIR_OTHER,        /* none of these */
} ddt_dir_kind;

ddt_dir_kind ddt_dir_kind_of(const char *dir);

/* "a state directory" ..., for messages */
const char *ddt_dir_kind_name(ddt_dir_kind kind);

/* The runs of STATE_DIR (the names under runs/, sorted), into out as "NAME, NAME, ..." (at most
 * out_len; "none" when there are none). */
void ddt_dir_list_runs(const char *state_dir, char *out, size_t out_len);

#endif
