# cases.sh: what the shell tests that print one line per case share (sourced, not run):
#   cases_begin PREFIX   a scratch folder $work (/tmp/PREFIX.XXXXXX), removed at exit
#   ok NAME / fail NAME [DETAIL]   one line per case, DETAIL indented under a failure
#   cases_end            the final "N passed, M failed"; its status is the test's
# Used by tests/daemon/train_cli_test.sh, tests/daemon/speculate_cli_test.sh,
# tests/daemon/dflash2_cli_test.sh and tests/scripts/check_layers_test.sh.
passed=0 failed=0
cases_begin() {
    work=$(mktemp -d "/tmp/$1.XXXXXX")
    trap 'rm -rf "$work"' EXIT
}
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/  # /' <<<"$2"; failed=$((failed + 1)); }
cases_end() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
