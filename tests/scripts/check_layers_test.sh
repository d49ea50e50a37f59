#!/usr/bin/env bash
# check_layers_test.sh ROOT: scripts/check_layers passes on the tree as it is, and fails, naming
# the edge, on each fault added to a copy of it: an include that goes up the rooms' order, a
# call that does, a cycle between two files of one room, a room whose May use line names no
# room, and an include that resolves to no file. One line per case, a final "N passed, M failed".
set -uo pipefail
root=$1
source "$(dirname "$0")/../cases.sh"
cases_begin ddtree_layers

# a fresh copy of what the check reads (kernels, daemon, client, the emulator's headers and the script)
fresh() {
    rm -rf "$work/t" && mkdir -p "$work/t/scripts" "$work/t/tests"
    cp -r "$root/kernels" "$root/daemon" "$root/client" "$work/t/"
    cp -r "$root/tests/simt" "$work/t/tests/"   # the emulator's headers, which the kernels include under DDK_SIMT
    cp "$root/scripts/check_layers" "$work/t/scripts/"
}
# refused NAME PATTERN: the check fails on the copy and says PATTERN (grep -E)
refused() {
    local out rc
    out=$("$work/t/scripts/check_layers" 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -qE -e "$2" <<<"$out"; then ok "$1"; else fail "$1" "exit $rc"$'\n'"$out"; fi
}

fresh
if out=$("$work/t/scripts/check_layers" 2>&1); then ok "the tree as it is: one direction, no cycles"; else fail "the tree as it is" "$out"; fi

fresh   # base may not use train
sed -i '0,/^#include/s//#include "train\/trainer.h"\n&/' "$work/t/daemon/engine/base/errors.c"
refused "an upward include (base includes train/trainer.h)" \
    'daemon/engine/base/errors.c includes "train/trainer.h": `daemon/engine/base` may not use `daemon/engine/train`'

fresh   # model calls into the record room, by name only
printf '\nvoid ddt_layers_probe(void);\nvoid ddt_layers_probe(void) { ddt_store_close(NULL); }\n' >>"$work/t/daemon/engine/model/drafter.c"
refused "an upward call (model calls record's ddt_store_close)" \
    'daemon/engine/model/drafter.c calls ddt_store_close: `daemon/engine/model` may not use `daemon/engine/record`'

fresh   # two files of one room that call each other
printf '\nint ddt_layers_probe_a(void);\nint ddt_layers_probe_b(void);\nint ddt_layers_probe_a(void) { return ddt_layers_probe_b(); }\n' >>"$work/t/daemon/engine/eval/acceptance.c"
printf '\nint ddt_layers_probe_a(void);\nint ddt_layers_probe_b(void);\nint ddt_layers_probe_b(void) { return ddt_layers_probe_a(); }\n' >>"$work/t/daemon/engine/eval/speculate.c"
refused "a cycle inside a room (acceptance.c <-> speculate.c)" \
    'a cycle between 2 units \(daemon/engine/eval/acceptance, daemon/engine/eval/speculate\)'

fresh   # a May use line naming a folder that is no room
sed -i 's/^May use: .*/May use: `daemon\/engine\/nowhere`/' "$work/t/daemon/engine/eval/README.md"
refused "a May use line naming no room" 'May use `daemon/engine/nowhere`, which is no room'

fresh
sed -i '0,/^#include/s//#include "model\/no_such_header.h"\n&/' "$work/t/daemon/engine/eval/acceptance.c"
refused "an include of no file" '#include "model/no_such_header.h" is no file'

cases_end
