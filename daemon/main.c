/* main.c: ddtreed's entry point: dispatches the subcommands of API.md's command line; with
 * no command (or options only) it is the daemon, `serve`. Tested through the tools by the oracle tests (tests/oracle/step_torch_check.py and
 * tests/oracle/features_torch_check.py).
 */
#include "commands.h"
#include "ddk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define USAGE                                                                                    \
    "usage: ddtreed [COMMAND] [options]\n"                                                       \
    "  serve     the daemon (the default; ddtreed serve --help)\n"                              \
    "  step      one drafter forward + loss + backward from files (ddtreed step --help)\n"      \
    "  features  a target's features of token sequences, as a feature shard\n"                 \
    "  tokenize  JSONL conversations to a token file with assistant-only loss masks\n"         \
    "  train     one run in the foreground (or --resume one)\n"                               \
    "  plan      the memory plan of a run config\n"                                           \
    "  export    the serving export of a run's checkpoint\n"                                 \
    "  speculate speculative decoding of a target with a drafter export (tau_spec, lossless)\n" \
    "  verify    the checksums of the checkpoints and exports in a state, run or export directory\n" \
    "  --version\n"

/* Open files up to the hard limit: every mapped shard and chat file keeps its descriptor (a run
 * may list 1024 shards, the usual soft limit); systemd's unit sets its own. */
static void raise_open_files(void)
{
    struct rlimit l;
    if (getrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur < l.rlim_max) {
        l.rlim_cur = l.rlim_max;
        setrlimit(RLIMIT_NOFILE, &l);
    }
}

int main(int argc, char **argv)
{
    raise_open_files();
    if (argc < 2 || argv[1][0] == '-') {   /* options only: the daemon */
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (argc < 2 || strcmp(argv[1], "--version"))
            return ddt_cmd_serve(argc, argv);
    }
    if (!strcmp(argv[1], "serve"))
        return ddt_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "--version")) {
        printf("ddtreed %s\n", DDK_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "step"))
        return ddt_cmd_step(argc - 1, argv + 1);
    if (!strcmp(argv[1], "features"))
        return ddt_cmd_features(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize"))
        return ddt_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "train"))
        return ddt_cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan"))
        return ddt_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export"))
        return ddt_cmd_export(argc - 1, argv + 1);
    if (!strcmp(argv[1], "speculate"))
        return ddt_cmd_speculate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "verify"))
        return ddt_cmd_verify(argc - 1, argv + 1);
    fprintf(stderr, "ddtreed: unknown command '%s'\n" USAGE, argv[1]);
    return 2;
}
